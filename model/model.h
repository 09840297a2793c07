/* model: the internal model description every backend consumes, built from GGUF or
 * Hugging Face safetensors + config.json.
 *
 * Tensors are not copied: mdl_tensor.data points into the file mapping, which lives as long as
 * the mdl_model. Shapes use GGUF's order: ne[0] is the contiguous dimension, so a weight
 * matrix W of a Linear(in -> out) has ne = {in, out} and row r (one output) is contiguous.
 *
 * Rotary layout (the Q/K permutation question). llama.cpp's converter permutes the rows of
 * HF's q_proj/k_proj so that RoPE rotates adjacent pairs (x[2i], x[2i+1]); HF's checkpoints
 * rotate the two halves (x[i], x[i + d/2]). The engine does not permute anything: it reads
 * the weights as they are stored and records which rotation matches them in
 * cfg.rope_layout: MDL_ROPE_ADJACENT for GGUF llama/mistral, MDL_ROPE_HALF for GGUF qwen2
 * (stored unpermuted) and for every safetensors checkpoint. Both kernels exist; the
 * result is the same network.
 *
 *   mdl_model *m; char err[256];
 *   if (mdl_load("model.gguf", &m, err, sizeof err)) die(err);
 *   int L = m->cfg.n_layer; const mdl_tensor *wq = &m->layers[0].wq;
 *   mdl_free(m);
 *
 * Load from a main thread; read from any thread.
 */
#ifndef MDL_MODEL_H
#define MDL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

enum mdl_arch { MDL_ARCH_LLAMA = 0, MDL_ARCH_MISTRAL, MDL_ARCH_QWEN2, MDL_ARCH_COUNT };
enum mdl_rope_layout { MDL_ROPE_ADJACENT = 0, MDL_ROPE_HALF = 1 };
enum mdl_rope_scaling { MDL_ROPE_SCALING_NONE = 0, MDL_ROPE_SCALING_LINEAR, MDL_ROPE_SCALING_LLAMA3 };
enum mdl_format { MDL_FORMAT_GGUF = 0, MDL_FORMAT_SAFETENSORS };

typedef struct mdl_config {
    int   arch;            /* enum mdl_arch */
    char  arch_name[32];   /* as in the file: "llama", "qwen2", ... */
    char  name[128];       /* general.name or "" */
    int   n_vocab;
    int   n_embd;          /* hidden size */
    int   n_layer;
    int   n_head;
    int   n_head_kv;       /* == n_head without GQA */
    int   head_dim;        /* usually n_embd / n_head */
    int   n_ff;            /* MLP intermediate size */
    int   n_ctx_train;     /* context length the model was trained for */
    float norm_eps;        /* RMSNorm epsilon */
    int   rope_dim;        /* dimensions rotated per head (<= head_dim) */
    float rope_base;       /* theta */
    int   rope_layout;     /* enum mdl_rope_layout */
    int   rope_scaling;    /* enum mdl_rope_scaling */
    float rope_factor;     /* linear: positions divided by it; llama3: frequency factor */
    float rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int   rope_orig_ctx;   /* llama3: original max position embeddings */
    int   has_qkv_bias;    /* qwen2 */
    int   tied_output;     /* output head shares token_embd */
} mdl_config;

typedef struct mdl_tensor {
    const char *name;      /* NUL-terminated, owned by the model */
    const void *data;      /* NULL when the tensor is absent (optional biases) */
    int         type;      /* enum dt_type */
    int         n_dims;
    int64_t     ne[4];
    uint64_t    nbytes;
} mdl_tensor;

typedef struct mdl_layer {
    mdl_tensor attn_norm;            /* [n_embd] */
    mdl_tensor wq, wk, wv, wo;       /* wq {n_embd, n_head*hd}, wk/wv {n_embd, n_head_kv*hd}, wo {n_head*hd, n_embd} */
    mdl_tensor bq, bk, bv;           /* optional biases (qwen2) */
    mdl_tensor ffn_norm;             /* [n_embd] */
    mdl_tensor w_gate, w_up, w_down; /* gate/up {n_embd, n_ff}, down {n_ff, n_embd} */
} mdl_layer;

typedef struct mdl_model {
    mdl_config  cfg;
    int         format;    /* enum mdl_format */
    mdl_tensor  tok_embd;  /* {n_embd, n_vocab} */
    mdl_tensor  out_norm;  /* [n_embd] */
    mdl_tensor  output;    /* {n_embd, n_vocab}; equals tok_embd when tied */
    mdl_layer  *layers;    /* [n_layer] */
    gguf_ctx   *gguf;      /* the GGUF file (also the tokenizer source) or NULL */
    void       *st;        /* safetensors state (model/safetensors.c) or NULL */
    uint64_t    weight_bytes; /* bytes of all tensors the forward pass reads */
} mdl_model;

/* Loads a GGUF file, or a directory / .safetensors file with its config.json. Validates that
 * every tensor the architecture needs is present with the expected shape and a supported type.
 * On error returns a negative code and writes one line "PATH: problem" into err. */
int  mdl_load(const char *path, mdl_model **out, char *err, size_t errlen);
/* Builds the description from an already-open GGUF (takes ownership of g on success). */
int  mdl_from_gguf(gguf_ctx *g, mdl_model **out, char *err, size_t errlen);
void mdl_free(mdl_model *m);

const char *mdl_arch_name(int arch);
/* Parses "llama" | "mistral" | "qwen2"; -1 when unknown. */
int mdl_arch_from_name(const char *name);

/* llama.cpp's converter permutation of HF q_proj/k_proj rows (half-split RoPE layout) into
 * GGUF's adjacent-pair layout: src and dst are [n_head * head_dim rows][n_embd] row-major
 * (F32, distinct buffers); per head, dst row 2*i + t = src row t*head_dim/2 + i. Use
 * n_head = n_head_kv for k_proj, n_embd = 1 for a bias. Returns 0 or CM_EINVAL (odd head_dim,
 * non-positive sizes, src == dst). For tests comparing the two layouts; the engine never
 * permutes (see cfg.rope_layout). */
int mdl_permute_qk_hf_to_gguf(const float *src, float *dst, int n_head, int head_dim, int n_embd);

/* Shared by the GGUF and safetensors paths: checks cfg and the tensors' shapes; writes an error. */
int mdl__validate(mdl_model *m, const char *path, char *err, size_t errlen);

#endif
