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

/* How a checkpoint holds FP8 matrices (model_hf.c reads it from quantization_config). */
typedef struct mdl__fp8 {
    int  on;           /* F8_E4M3 matrices may appear: a supported quantization_config was read */
    int  kv_static;    /* kv_cache_scheme: every layer has static K and V scales */
    char what[64];     /* the scheme, for messages ("compressed-tensors", "fbgemm_fp8", "fp8") */
} mdl__fp8;

enum { MDL__ST_AS_STORED = 0, MDL__ST_TO_F32, MDL__ST_TO_F32_PLUS1, MDL__ST_WEIGHT };
/* Fills t from the checkpoint's tensor `name` and marks it used. Absent: CM_ENOTFOUND with
 * "PATH: missing tensor 'name'" when required, else 0 with t->data NULL. TO_F32 converts
 * F16/BF16 to an owned F32 copy (norms, biases); TO_F32_PLUS1 also adds 1 to every element
 * (gemma's (1 + w) norms). WEIGHT: a linear layer's matrix "X.weight" as stored; when it is
 * F8_E4M3 (the checkpoint's quantization_config allowing it) its scales come from the sibling
 * "X.weight_scale" or "X.weight_scale_inv" (one value, or one per output row; F32/F16/BF16)
 * into t->scale, "X.input_scale" into t->in_scale, and "X.weight_zero_point" /
 * "X.input_zero_point" must be zeros. Any other F8_E4M3 tensor is refused. */
int  mdl__st_take(mdl_model *m, const char *path, const char *name, mdl_tensor *t, int required, int conv, char *err,
                  size_t errlen);
int  mdl__st_has(const mdl_model *m, const char *name);
/* A small float tensor (F32/F16/BF16) of one value or of n values, finite and >= 0, as n
 * owned floats (one value repeated) in *out; marks it used. *per_tensor (may be NULL): 1 when
 * the file held one value. Absent: CM_ENOTFOUND (err untouched). */
int  mdl__st_scales(mdl_model *m, const char *path, const char *name, int64_t n, const float **out, int *per_tensor, char *err,
                    size_t errlen);
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
    mdl__fp8 fp8;             /* quantization_config */
} mdl__hf;
/* Parses cfg_path into m->cfg, allocates m->layers (with their sliding flags); dir is the
 * model's directory (sentence-transformers pooling files). */
int mdl__hf_config(const char *cfg_path, const char *dir, mdl_model *m, mdl__hf *hf, char *err, size_t errlen);
/* Maps the checkpoint's tensors into m's tensors. */
int mdl__hf_tensors(mdl_model *m, const char *path, mdl__hf *hf, char *err, size_t errlen);

#endif
