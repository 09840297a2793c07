/* model_internal: what model.c (shared checks, ownership), model_gguf.c (GGUF -> model),
 * model_hf.c (config.json -> model) and safetensors.c (the container) share. Loading thread
 * only. */
#ifndef MDL_MODEL_INTERNAL_H
#define MDL_MODEL_INTERNAL_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

/* Memory the model owns until mdl_free: zeroed blocks and string copies. NULL when out of
 * memory. */
void *mdl__alloc(mdl_model *m, size_t bytes);
char *mdl__strdup(mdl_model *m, const char *s);

/* Fills the derived fields a loader left at zero: attn_scale (1/sqrt(head_dim)), embd_scale
 * and rope_attn_factor (1), n_layer_swa (from the layers' flags). Call after the layers. */
void mdl__finish_config(mdl_model *m);

/* n_expert views, one per expert, of a 3-D expert tensor {ne0, rows, n_expert} (GGUF's
 * ffn_*_exps, HF v5's fused experts): view e is rows [e*rows, (e+1)*rows) of the data.
 * first_row/n_rows select a slice of each expert's rows (HF's gate_up_proj holds gate then
 * up). Returns the array or NULL (out of memory; bad shape). */
mdl_tensor *mdl__expert_views(mdl_model *m, const mdl_tensor *t3, int n_expert, int64_t first_row, int64_t n_rows);

/* ---- safetensors.c: the checkpoint (m->st) ---------------------------------------------- */
int  mdl__load_safetensors(const char *path, mdl_model **out, char *err, size_t errlen);
void mdl__st_free(void *st);
/* Reads a JSON file of at most 64 MiB whose top level is an object. */
struct cm_json_doc;
int  mdl__read_json(const char *path, struct cm_json_doc **doc, char *err, size_t errlen);

enum { MDL__ST_AS_STORED = 0, MDL__ST_TO_F32, MDL__ST_TO_F32_PLUS1 };
/* Fills t from the checkpoint's tensor `name` and marks it used. Absent: CM_ENOTFOUND with
 * "PATH: missing tensor 'name'" when required, else 0 with t->data NULL. TO_F32 converts
 * F16/BF16 to an owned F32 copy (norms, biases); TO_F32_PLUS1 also adds 1 to every element
 * (gemma's (1 + w) norms). */
int  mdl__st_take(mdl_model *m, const char *path, const char *name, mdl_tensor *t, int required, int conv, char *err,
                  size_t errlen);
int  mdl__st_has(const mdl_model *m, const char *name);
/* Marks a tensor used without reading it (an lm_head transformers ties away), or every tensor
 * whose name starts with prefix (a vision tower the engine does not load). */
void mdl__st_skip(mdl_model *m, const char *name);
void mdl__st_skip_prefix(mdl_model *m, const char *prefix);

/* ---- model_hf.c: config.json and the HF tensor names --------------------------------------- */
typedef struct mdl__hf {
    int      norm_plus_one;   /* gemma: norm weights are w of (1 + w) */
    int      tied;            /* tie_word_embeddings: 1 / 0, -1 when absent */
    int      tied_default;    /* transformers' default for the model type */
    uint8_t *sparse;          /* [n_layer] 1: a mixture-of-experts layer (owned by the model) */
    int      vision;          /* a vision + text checkpoint: the text model is loaded */
    char     prefix[32];      /* the language model's tensor names start with it ("model.") */
} mdl__hf;
/* Parses cfg_path into m->cfg, allocates m->layers (with their sliding flags); dir is the
 * model's directory (sentence-transformers pooling files). */
int mdl__hf_config(const char *cfg_path, const char *dir, mdl_model *m, mdl__hf *hf, char *err, size_t errlen);
/* Maps the checkpoint's tensors into m's tensors. */
int mdl__hf_tensors(mdl_model *m, const char *path, mdl__hf *hf, char *err, size_t errlen);

#endif
