/* model: the internal model description every backend consumes, built from GGUF or
 * Hugging Face safetensors + config.json.
 *
 * Tensors are not copied: mdl_tensor.data points into the file mapping, which lives as long as
 * the mdl_model. Shapes use GGUF's order: ne[0] is the contiguous dimension, so a weight
 * matrix W of a Linear(in -> out) has ne = {in, out} and row r (one output) is contiguous.
 *
 * Architectures (cfg.arch): llama, mistral, qwen2, qwen3, qwen3moe, mixtral, gemma2, gemma3,
 * phi3, from either format (README.md lists the names each format uses). One description
 * covers them all; what differs is switched by config fields, never by the architecture's
 * name in a backend:
 *
 *   per layer    pre-norm -> Q,K,V (optional biases, optional per-head RMSNorm of Q and K
 *                "QK-norm") -> RoPE -> attention (full or sliding window, scale, optional
 *                tanh soft-capping of the scores) -> output projection (optional post-norm)
 *                -> residual; pre-norm -> MLP (dense SwiGLU / GeGLU, or a mixture of
 *                experts) (optional post-norm) -> residual
 *   around it    embeddings (optional scale), final norm, output head (optional soft-cap)
 *
 * Every hyper-parameter comes from the file. A setting the engine does not implement is
 * refused at load with a message naming it; a GGUF or safetensors tensor the description
 * does not use is refused too (a file that says more than the engine reads would otherwise be
 * run wrong). Where a format leaves a value out, the rule its reference implementation
 * applies is applied here (transformers' config class defaults; llama.cpp's per-architecture
 * rules for GGUF), and each such rule is written next to the code that applies it.
 *
 * Normalisation weights are F32 vectors holding the multiplier itself: Gemma's HF
 * checkpoints store w for a (1 + w) RMSNorm, and the loader adds the 1 (llama.cpp's GGUF
 * converter already did).
 *
 * Rotary layout (the Q/K permutation question). llama.cpp's converter permutes the rows of
 * HF's q_proj/k_proj for llama-arch files so that RoPE rotates adjacent pairs (x[2i],
 * x[2i+1]); HF's checkpoints rotate the two halves (x[i], x[i + d/2]). The engine does not
 * permute anything: it reads the weights as they are stored and records which rotation
 * matches them in cfg.rope_layout: MDL_ROPE_ADJACENT for GGUF llama/mistral (mixtral is
 * "llama" in GGUF), MDL_ROPE_HALF for every other GGUF architecture (stored unpermuted) and
 * for every safetensors checkpoint.
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

enum mdl_arch {
    MDL_ARCH_LLAMA = 0, MDL_ARCH_MISTRAL, MDL_ARCH_QWEN2, MDL_ARCH_QWEN3, MDL_ARCH_QWEN3MOE, MDL_ARCH_MIXTRAL,
    MDL_ARCH_GEMMA2, MDL_ARCH_GEMMA3, MDL_ARCH_PHI3, MDL_ARCH_COUNT
};
enum mdl_rope_layout { MDL_ROPE_ADJACENT = 0, MDL_ROPE_HALF = 1 };
enum mdl_rope_scaling {
    MDL_ROPE_SCALING_NONE = 0, MDL_ROPE_SCALING_LINEAR, MDL_ROPE_SCALING_LLAMA3, MDL_ROPE_SCALING_YARN,
    MDL_ROPE_SCALING_LONGROPE
};
enum mdl_format { MDL_FORMAT_GGUF = 0, MDL_FORMAT_SAFETENSORS };
/* The MLP's gate activation: SwiGLU (silu) or GeGLU with the tanh approximation of GELU. */
enum mdl_act { MDL_ACT_SILU = 0, MDL_ACT_GELU_TANH };
/* Embedding models: how a sequence's hidden states become one vector. */
enum mdl_pooling { MDL_POOL_NONE = 0, MDL_POOL_MEAN, MDL_POOL_LAST, MDL_POOL_CLS };

#define MDL_MAX_EXPERTS 512

typedef struct mdl_config {
    int   arch;            /* enum mdl_arch */
    char  arch_name[32];   /* as in the file: "llama", "qwen3_moe", ... */
    char  name[128];       /* general.name or "" */
    int   n_vocab;
    int   n_embd;          /* hidden size */
    int   n_layer;
    int   n_head;
    int   n_head_kv;       /* == n_head without GQA */
    int   head_dim;        /* n_embd / n_head unless the file says otherwise */
    int   n_ff;            /* dense MLP intermediate size (0 when every layer is a mixture of experts) */
    int   n_ctx_train;     /* context length the model was trained for */
    float norm_eps;        /* RMSNorm epsilon */
    int   rope_dim;        /* dimensions rotated per head (<= head_dim) */
    float rope_base;       /* theta */
    int   rope_layout;     /* enum mdl_rope_layout */
    int   rope_scaling;    /* enum mdl_rope_scaling */
    float rope_factor;     /* linear: positions divided by it; llama3/yarn: frequency factor */
    float rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int   rope_orig_ctx;   /* llama3/yarn/longrope: original max position embeddings */
    int   has_qkv_bias;    /* qwen2 */
    int   tied_output;     /* output head shares token_embd */

    /* ---- everything below was added with qwen3 / moe / gemma / phi3; zero = absent ---- */
    float rope_beta_fast, rope_beta_slow; /* yarn ramp bounds (rotations) */
    float rope_attn_factor;               /* cos and sin are multiplied by it (yarn, longrope); 1 otherwise */
    const float *rope_long_factor, *rope_short_factor; /* longrope: [rope_dim / 2] each, owned by the model */
    int   rope_swa_own;    /* 1: sliding-window layers rotate with rope_base_swa and no scaling (gemma3) */
    float rope_base_swa;
    int   n_expert;        /* experts per MoE layer (0: dense model) */
    int   n_expert_used;   /* top-k */
    int   n_ff_exp;        /* intermediate size of one expert */
    int   expert_norm;     /* 1: the top-k routing weights are renormalised to sum to 1 */
    int   n_swa;           /* sliding window: positions a query of a sliding layer sees, itself included */
    int   n_layer_swa;     /* layers with sliding-window attention (their mdl_layer.swa is 1) */
    float attn_scale;      /* q.k multiplier; 1/sqrt(head_dim) unless the model says otherwise */
    float attn_softcap;    /* > 0: scores = cap * tanh(scores / cap) before the softmax */
    float final_softcap;   /* > 0: logits = cap * tanh(logits / cap) */
    float embd_scale;      /* token embeddings are multiplied by it (gemma: sqrt(n_embd)); 1 otherwise */
    int   ffn_act;         /* enum mdl_act */
    int   has_qk_norm;     /* per-head RMSNorm of Q and K before RoPE (qwen3, gemma3) */
    int   has_post_norms;  /* RMSNorm of the attention and MLP outputs before the residual add (gemma) */
    int   pooling;         /* enum mdl_pooling: how the model's files say to pool for embeddings */
    int   embd_normalize;  /* 1: pooled embeddings are L2-normalised */

    /* ---- added with FP8 ---- */
    int   fp8_weights;     /* 1: some matrices are F8_E4M3 with scales (a checkpoint's, or mdl_quantize) */
    int   kv_scales;       /* 1: every layer carries static FP8 KV-cache scales (mdl_layer.k_scale) */
    char  quant_method[32]; /* the checkpoint's quantization_config.quant_method ("" when none) */
} mdl_config;

typedef struct mdl_tensor {
    const char *name;      /* NUL-terminated, owned by the model */
    const void *data;      /* NULL when the tensor is absent (optional biases) */
    int         type;      /* enum dt_type */
    int         n_dims;
    int64_t     ne[4];
    uint64_t    nbytes;
    /* F8_E4M3 only (NULL / 0 otherwise). Row r's values are dt_e4m3_to_f32(code) * scale[r]
     * (an f32 product), rows = ne[1] * ne[2] * ne[3]: the scales are per output row whatever
     * the checkpoint gave (a per-tensor scale is repeated, scale_per_tensor then says so).
     * Owned by the model. */
    const float *scale;    /* [rows] */
    int         scale_per_tensor;
    float       in_scale;  /* the checkpoint's static activation scale (activation_scheme static, one per
                            * tensor), 0 when it has none; informational: activations are scaled per token */
} mdl_tensor;

typedef struct mdl_layer {
    mdl_tensor attn_norm;            /* [n_embd] */
    mdl_tensor wq, wk, wv, wo;       /* wq {n_embd, n_head*hd}, wk/wv {n_embd, n_head_kv*hd}, wo {n_head*hd, n_embd} */
    mdl_tensor bq, bk, bv;           /* optional biases (qwen2) */
    mdl_tensor ffn_norm;             /* [n_embd] */
    mdl_tensor w_gate, w_up, w_down; /* dense MLP: gate/up {n_embd, n_ff}, down {n_ff, n_embd}; absent in MoE layers */
    /* added with qwen3 / moe / gemma / phi3 */
    mdl_tensor attn_q_norm, attn_k_norm;     /* [head_dim] when cfg.has_qk_norm */
    mdl_tensor attn_post_norm, ffn_post_norm; /* [n_embd] when cfg.has_post_norms */
    mdl_tensor ffn_gate_inp;         /* MoE router {n_embd, n_expert}; absent (data NULL) in a dense layer */
    mdl_tensor *exp_gate, *exp_up;   /* MoE: [n_expert] matrices {n_embd, n_ff_exp}, views into the file */
    mdl_tensor *exp_down;            /* MoE: [n_expert] matrices {n_ff_exp, n_embd} */
    int        swa;                  /* 1: sliding-window attention (cfg.n_swa positions) */
    /* added with FP8: the checkpoint's static KV-cache scales (kv_cache_scheme; cfg.kv_scales),
     * [n_head_kv] f32 each (a per-tensor scale is repeated), NULL when it has none. With an FP8
     * KV cache, K of head h is stored as e4m3(k / k_scale[h]) (executor/kv.h). */
    const float *k_scale, *v_scale;
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
    uint64_t    weight_bytes; /* bytes of all tensors the forward pass reads (every expert) */
    uint64_t    active_bytes; /* bytes read per token: weight_bytes less the experts a token does not use */
    void       *owned;     /* names, expert arrays and converted vectors the model owns (model.c) */
} mdl_model;

/* Loads a GGUF file, or a directory / .safetensors file with its config.json. Validates that
 * every tensor the architecture needs is present with the expected shape and a supported type.
 * On error returns a negative code and writes one line "PATH: problem" into err. */
int  mdl_load(const char *path, mdl_model **out, char *err, size_t errlen);
/* Builds the description from an already-open GGUF (takes ownership of g on success). */
int  mdl_from_gguf(gguf_ctx *g, mdl_model **out, char *err, size_t errlen);
void mdl_free(mdl_model *m);

/* Parses "llama" | "mistral" | "qwen2" | "qwen3" | "qwen3moe" | "mixtral" | "gemma2" | "gemma3" |
 * "phi3"; -1 when unknown. */
int mdl_arch_from_name(const char *name);
/* "silu", "gelu_tanh", "none", "mean", "last", "cls", "linear", ... for messages; "?" when unknown. */
const char *mdl_act_name(int act);
const char *mdl_pooling_name(int pooling);
const char *mdl_rope_scaling_name(int scaling);

/* What a backend must implement beyond the Llama-2 forward pass to run a model. A backend
 * compares mdl_features(cfg) with what it supports and refuses the rest by name:
 *
 *   unsigned missing = mdl_features(&m->cfg) & ~MY_FEATURES;
 *   if (missing) { char b[256]; mdl_features_str(missing, b, sizeof b); refuse("needs %s", b); }
 */
enum mdl_feature {
    MDL_FEAT_QK_NORM      = 1u << 0,  /* per-head RMSNorm of Q and K */
    MDL_FEAT_POST_NORM    = 1u << 1,  /* post-attention / post-MLP norms */
    MDL_FEAT_MOE          = 1u << 2,  /* mixture-of-experts layers */
    MDL_FEAT_SWA          = 1u << 3,  /* sliding-window layers (and their own KV block tables) */
    MDL_FEAT_ATTN_SOFTCAP = 1u << 4,
    MDL_FEAT_FINAL_SOFTCAP= 1u << 5,
    MDL_FEAT_GELU         = 1u << 6,  /* GeGLU MLP */
    MDL_FEAT_EMBD_SCALE   = 1u << 7,  /* embeddings multiplied by cfg.embd_scale */
    MDL_FEAT_ATTN_SCALE   = 1u << 8,  /* attn_scale other than 1/sqrt(head_dim) */
    MDL_FEAT_ROPE_YARN    = 1u << 9,
    MDL_FEAT_ROPE_LONGROPE= 1u << 10, /* per-pair factors chosen by context length */
    MDL_FEAT_ROPE_SWA_BASE= 1u << 11, /* sliding layers rotate with their own base */
    MDL_FEAT_ROPE_PARTIAL = 1u << 12, /* rope_dim < head_dim */
    MDL_FEAT_HEAD_DIM     = 1u << 13, /* head_dim != n_embd / n_head */
    MDL_FEAT_ROPE_ATTN    = 1u << 14, /* cos/sin multiplied by rope_attn_factor (yarn, longrope) */
    MDL_FEAT_FP8          = 1u << 15, /* F8_E4M3 matrices with per-row scales (cfg.fp8_weights) */
};
unsigned mdl_features(const mdl_config *c);
/* Comma-separated names of the bits in mask ("qk-norm, moe"); returns buf. */
const char *mdl_features_str(unsigned mask, char *buf, size_t n);

/* The parameters of the RoPE one layer uses (sliding-window layers of gemma3 have their own). */
typedef struct mdl_rope {
    int   dim, layout, scaling;
    float base, factor, low_freq_factor, high_freq_factor, beta_fast, beta_slow, attn_factor;
    int   orig_ctx;
    const float *long_factor, *short_factor;
} mdl_rope;
void mdl_layer_rope(const mdl_config *c, int swa, mdl_rope *out);

/* llama.cpp's converter permutation of HF q_proj/k_proj rows (half-split RoPE layout) into
 * GGUF's adjacent-pair layout: src and dst are [n_head * head_dim rows][n_embd] row-major
 * (F32, distinct buffers); per head, dst row 2*i + t = src row t*head_dim/2 + i. Use
 * n_head = n_head_kv for k_proj, n_embd = 1 for a bias. Returns 0 or CM_EINVAL (odd head_dim,
 * non-positive sizes, src == dst). For tests comparing the two layouts; the engine never
 * permutes (see cfg.rope_layout). */
int mdl_permute_qk_hf_to_gguf(const float *src, float *dst, int n_head, int head_dim, int n_embd);

/* ---- FP8 --------------------------------------------------------------------------------------
 *
 * An F8_E4M3 matrix is n_out rows of n_in codes (row-major, as GGUF's layout: ne = {n_in,
 * n_out}) plus mdl_tensor.scale[n_out] f32; its value is code x scale of the row. They come
 * from a safetensors checkpoint with a quantization_config (model_hf.c lists the formats) or
 * from mdl_quantize. GGUF has no FP8 type. */

/* The values of rows [r0, r0 + n) of a matrix (or the elements of a vector: one row) as f32
 * into out ([n][ne[0]]): the F8_E4M3 codes times their row's scale, other types through
 * dt_dequantize. Returns 0, CM_EINVAL (rows outside the tensor, an F8_E4M3 tensor without
 * scales) or CM_EUNSUPPORTED. Any thread. */
int mdl_tensor_rows_f32(const mdl_tensor *t, int64_t r0, int64_t n, float *out);

/* `--quantize fp8`: a copy of src whose layer matrices (Q, K, V, O, gate, up, down and every
 * expert's; not the embeddings, the output head nor a router) stored as F32, F16 or BF16 are
 * converted to type (DT_F8_E4M3 only) with one scale per output row: scale = amax / 448 of
 * the row (dt_fp8_scale), codes dt_fp8_encode. Matrices already F8_E4M3 stay as they are; a
 * matrix of another type (Q8_0, Q4_K, ...) is refused with its name (no double
 * quantization). Q|K|V and gate|up of a layer (and of each expert) are converted into one
 * buffer each, rows back to back, so backends can still fuse them. The copy shares src's
 * other tensors and configuration arrays: src must outlive it; mdl_free frees only what the
 * copy owns. n_threads (>= 1) convert in parallel. Returns 0, CM_EUNSUPPORTED, CM_EINVAL or
 * CM_ENOMEM with one line in err. Loading thread only. */
int mdl_quantize(const mdl_model *src, int type, int n_threads, mdl_model **out, char *err, size_t errlen);

/* Shared by the GGUF and safetensors paths: checks cfg and the tensors' shapes; writes an error. */
int mdl__validate(mdl_model *m, const char *path, char *err, size_t errlen);

#endif
