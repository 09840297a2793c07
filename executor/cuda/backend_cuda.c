/* backend_cuda: the CUDA backend. Weights uploaded once (F32/F16/BF16 as they are; Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K kept quantized, repacked for aligned loads; F8_E4M3 as
 * codes and row scales where the GPU has FP8 tensor cores; other types
 * converted to F16, logged), Q|K|V and gate|up fused into one matrix
 * each, the paged KV cache as one device pool (half, or with --kv-cache-dtype fp8 E4M3 codes
 * and f32 scales per position and head in the CPU's layout, kcuda.h), activations and
 * workspaces allocated at create time for the engine's limits. A forward pass allocates nothing and synchronizes once:
 * to hand the logits to the host (forward), or only the sampled tokens and their logprobs
 * (forward_sample: the sampler runs on the device, kernels/cuda/sample.cu, rows packed by
 * cuda_sample.c). Pure decode steps replay CUDA graphs captured at create time for a ladder
 * of batch sizes (padding with dummy tokens that write to a scratch block), smallest first,
 * for as long as the capture budget lasts; the graphs end at the logits, so both paths replay
 * the same ones.
 *
 * Memory: unless the engine asks for an exact number of blocks, the KV pool is allocated last
 * and takes what mem_fraction x the device's memory leaves after what was in use at start-up
 * and what the weights, activations and workspaces took (ex_kv_fit_blocks), between one
 * sequence of n_ctx positions and max_seqs of them.
 *
 * Numerics: activations f32, weights in their own type, matmul accumulation f32 (GEMV) or
 * cuBLAS with f16 operands and f32 accumulation (steps of more than KC_GEMV_MAX_TOK tokens),
 * K/V stored as half. Attention (kernels/cuda/attention_tc.cu) runs on the tensor cores with
 * half Q, K, V and P and f32 accumulation: decode tokens one CTA per (token, KV head, split),
 * prefill and chunked-prefill sequences in tiles of tokens x the query heads of a KV head, both
 * kinds in one step (mixed steps); on compute capability 9.0 the prefill tiles go to the wgmma
 * kernel (kernels/cuda/attention_fa3.cu, the plan's att_pf_fa3). The decode keys are split so
 * that the step fills the GPU (kc_plan_dec_splits: two waves of the plan's att_dec_ctas); the
 * split size is staged per step (kc_plan_dec_chunk: from the longest context, splits of
 * att_dec_min_chunk positions but at least a wave of them), so one captured graph serves every
 * context. A step whose prefill tiles x KV heads are at most half a wave splits their keys too:
 * on the wgmma kernel where it runs (kc_plan_pf_splits_fa3, one CTA an SM), else on the
 * mma.sync kernel (kc_plan_pf_splits, att_pf_split_warps). Models the
 * tensor-core kernels do not take (head dims other than 64 / 128, more than 16 query heads per
 * KV head) use the per-head kernel with fixed 64-position splits.
 *
 * Every kernel choice comes from the kernel plan (kcuda.h), chosen at create time from the
 * device and the model, changed only by --cuda-plan, and logged in one line.
 */
#include "executor/backend.h"
#include "executor/cuda/cuda_sample.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "common/cm_err.h"
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* decode graph buckets (tokens): a step pads to the smallest bucket that holds it */
static const int k_buckets[] = { 1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256,
                                 320, 384, 448, 512, 640, 768, 896, 1024 };
#define N_GRAPH_BUCKETS ((int)(sizeof k_buckets / sizeof *k_buckets))
#define N_SPLIT_BUCKETS 12  /* per-head kernel: attention splits 2, 4, 8, ... up to n_split (the context's) */
#define GIB 1073741824.0

/* Fatal path: a CUDA error inside a step ends the executor with call, file and line. */
#define CU_FATAL(call)                                                                                   \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "CUDA call failed", "call=\"%s\" err=\"%s\" file=%s line=%d", \
                         #call, cudaGetErrorString(e_), __FILE__, __LINE__);                             \
            abort();                                                                                     \
        }                                                                                                \
    } while (0)
#define KC_FATAL(call)                                                                                   \
    do {                                                                                                 \
        int r_ = (call);                                                                                 \
        if (r_ != 0) {                                                                                   \
            cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel launcher failed", "call=\"%s\" rc=%d file=%s line=%d", \
                         #call, r_, __FILE__, __LINE__);                                                 \
            abort();                                                                                     \
        }                                                                                                \
    } while (0)

typedef struct cu_layer {
    kc_weight qkv, wo, gu, down; /* qkv: [nq + 2 nkv rows], gu: [2 n_ff rows] */
    float *attn_norm, *ffn_norm; /* [n_embd] */
    float *bqkv;                 /* [nq + 2 nkv] or NULL */
    kc_half *k, *v;              /* this layer's slice of the pool: [n_blocks + 1][n_kv][bs][hd]; FP8 KV: blocks of
                                  * codes [bs][n_kv][hd] bytes then scales [n_kv][bs] f32 (kcuda.h), same pointers */
    float *k_scale, *v_scale;    /* FP8 KV: the checkpoint's static scales [n_kv] (cfg.kv_scales), else NULL */
    /* the later architectures' parts (NULL / 0 when the model has none) */
    float *q_norm, *k_norm;      /* [hd] QK-norm */
    float *attn_post, *ffn_post; /* [n_embd] post-norms */
    int swa;                     /* sliding-window layer: K/V in the sliding pool, its block tables, its rope */
    int moe;                     /* mixture-of-experts MLP (router + experts instead of gu / down) */
    kc_weight router;            /* {n_embd, n_expert} */
    /* the experts stacked: n_expert x 2 n_ff_exp rows (each expert's gate rows, then its up rows)
     * of n_embd, n_expert x n_embd rows of n_ff_exp; kc_moe_gemvq's layout (F16: kc_moe_gemv's) */
    kc_weight exp_gu, exp_down;
    int exp_gu_type, exp_down_type; /* their types: the file's when kc_moe_type_ok, else F16 */
} cu_layer;

enum { PC_STAGE, PC_EMBED, PC_NORM, PC_QKV, PC_ROPE, PC_ATTN, PC_WO, PC_GU, PC_ACT, PC_DOWN, PC_HEAD, PC_COPY, PC_SAMPLE,
       PROF_N_CATS };
static const char *const prof_names[PROF_N_CATS] = { "stage-in", "embed", "rmsnorm", "qkv", "rope+kv", "attention", "wo",
                                                     "gate|up", "swiglu", "down", "head", "logits-out", "sample" };
#define PROF_MAX_EVENTS 1024

typedef struct cu_graph {
    int n_tok;                   /* bucket size */
    int n_split;                 /* attention splits launched (per-head kernel: covers positions < n_split *
                                  * att_chunk; tensor-core kernel: the bucket's split count, any context) */
    int tc;                      /* decode attention on the tensor-core kernel */
    cudaGraphExec_t exec;
} cu_graph;

typedef struct cu_state {
    ex_backend base;
    mdl_config cfg;
    ex_limits lim;
    int device, scratch_block;   /* scratch_block = lim.n_kv_blocks: where padding tokens write */
    kc_plan plan;                /* the kernel plan (installed for the launchers too) */
    int att_chunk, n_split;      /* per-head decode kernel: split size and count, ceil(n_ctx / att_chunk) */
    int att_tc;                  /* the tensor-core attention kernels take this model */
    int pf_tile_tok;             /* prefill attention: tokens per tile */
    int pf_fa3;                  /* whole prefill tiles go to the wgmma kernel (the plan's att_pf_fa3; 0: mma.sync) */
    int max_tc_split;            /* tensor-core decode: most splits of any bucket (partials sized for it) */
    int qkv_dim;                 /* (n_head + 2 n_kv) * hd */
    int kv_f8;                   /* the KV cache is FP8 E4M3 with scales (--kv-cache-dtype fp8) */
    size_t kv_blk_bytes;         /* one layer's K (or V) part of a block */
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws;
    kc_weight tok_embd, output;
    float *out_norm;
    cu_layer *layers;
    kc_rope rope, rope_swa;      /* full-attention layers, sliding-window layers (per-pair frequency tables) */
    float *rope_freq, *rope_freq_swa;
    void *kv_pool, *kv_pool_swa; /* the sliding-window layers' pool: lim.n_kv_blocks_swa + 1 blocks */
    int scratch_block_swa;
    /* mixture of experts, T tokens, K = n_expert_used, F = n_ff_exp: router logits [T, n_expert],
     * choices and weights [T, K], entries grouped by expert (kc_moe_route), gate|up [T K, 2F],
     * activations [T K, F], expert outputs [T K, n_embd] */
    float *rlogits, *rw, *egu, *eact, *eout;
    int32_t *ridx, *ecnt, *eoff, *elist;
    int32_t *route_ctr; /* kc_moe_norm_route's count of finished CTAs: 0 between launches */
    /* activations, sized for lim.max_tokens (T) and lim.max_out (R) */
    float *x, *h, *qkv, *q, *att, *gu, *act; /* [T, n_embd] [T, n_embd] [T, qkv_dim] [T, nq] [T, nq] [T, 2 n_ff] [T, n_ff] */
    float *last, *last_n, *logits;           /* [R, n_embd] [R, n_embd] [R, n_vocab] */
    float *partial;                          /* per-head kernel: [T, n_head, n_split, hd + 2];
                                              * tensor-core decode: [tokens x splits <= max_tc_part][n_head][hd + 2] */
    size_t partial_floats;
    kc_xq xq_h, xq_a, xq_o;                  /* h, act and att quantized by their producers for the integer GEMVs */
    kc_xq xq_e, xq_f;                        /* quantized experts: h of every token, the weighted GLU of every entry */
    kc_half *act_img;                        /* down's image of the activation for steps of up to act_img_tok tokens */
    size_t act_img_cap;                      /* (apart from x_half: gate|up's tiles read x there and write it) */
    int act_img_tok;
    int *att_counters;                       /* [T, n_head] zeros: split-K merge by the last CTA */
    int *qkv_ctr;                            /* [n_head + n_kv] zeros: kc_matmul_qkv_rope's heads */
    float *pf_partial;                       /* prefill tiles split over the keys: [2 att_dec_ctas][16 x 8 rows][hd + 2] */
    /* the plan's att_pf_f8_fa3: an F16 copy of the FP8 cache blocks of a step's prefill tiles
     * (f8sh_cap blocks of K and of V) for the Hopper prefill kernel, and its staging: block pairs [2 f8sh_cap]
     * (FP8 block, copy block) then the copies' block tables [(S + 1) x max_blocks] (pinned + device) */
    kc_half *f8sh_k, *f8sh_v;
    int f8sh_cap;
    int32_t *h_f8sh, *d_f8sh;
    int *pf_counters;                        /* [att_dec_ctas] zeros: their merge */
    int64_t fault_at, n_steps;               /* --cuda-fault-at-step (testing): a trapping kernel in that step */
    kc_gemm_ws gws;
    /* batch arrays on the device and their pinned host staging (one block, one copy) */
    int32_t *d_meta, *h_meta;                /* tok[T] pos[T] seq[T] rows[R] bt[(S+1) * max_blocks] tiles[2T]
                                              * dtoks[T] chunk[1] */
    size_t meta_ints;
    float *h_logits;                         /* pinned [R, n_vocab] */
    float *h_hidden;                         /* pinned [R, n_embd]: forward_hidden's rows */
    /* device sampling: the packed rows (pinned staging + device copy, kc_sample_pool_bytes(R)),
     * the results [R], and the stager's scratch */
    void *h_samp, *d_samp;
    kc_sample_out *h_sout, *d_sout;
    uint8_t *samp_mark;                      /* [R] */
    int *samp_slot;                          /* [R] */
    cu_graph graphs[N_GRAPH_BUCKETS * N_SPLIT_BUCKETS];
    int n_graphs;
    /* --cuda-profile: eager steps record an event after every launch and print where the
     * time went (the decode-step breakdown). */
    int prof_on, prof_n, prof_n_created;
    cudaEvent_t prof_ev[PROF_MAX_EVENTS];
    int prof_cat[PROF_MAX_EVENTS];
    double prof_ms[2][PROF_N_CATS]; /* [0]: pure decode steps, [1]: steps with prefill tokens */
    int prof_steps[2];
    double prof_cold[2][PROF_N_CATS]; /* the first step of each kind, apart (lazy module loads) */
    int prof_cold_seen[2];
    size_t weight_bytes;
    /* the layers' norms write only the quantized blocks (and the half copy only when an F16
     * matrix reads it) in steps of up to norm_blocks_max tokens (0: never; at most
     * KC_GEMV_MAX_TOK): the matrices after them read nothing else at those sizes */
    int norm_blocks_max;
    /* the same for the attention output (read only by wo) and SwiGLU's (only by down) */
    int att_blocks_max, act_blocks_max;
    /* --cuda-graph-timing: device time of each graph replay (events around the launch),
     * reported at exit: a decode step's wall time minus this is the host's share. */
    int gt_on, gt_pending, gt_n;
    cudaEvent_t gt_ev[2];
    double gt_ms;
    /* --cuda-trace N (builds with -DARKA_CUDA_TRACE=ON): the N-th decode graph replay is
     * traced, one line per CTA of its kernels written to --cuda-trace-file (CSV;
     * bench/trace_step.py reads it). */
    int tr_at, tr_replays, tr_pending;
    char tr_file[256];
} cu_state;

static int32_t *meta_tok(cu_state *s, int32_t *base) { return base; }
static int32_t *meta_pos(cu_state *s, int32_t *base) { return base + s->lim.max_tokens; }
static int32_t *meta_seq(cu_state *s, int32_t *base) { return base + 2 * s->lim.max_tokens; }
static int32_t *meta_rows(cu_state *s, int32_t *base) { return base + 3 * s->lim.max_tokens; }
static int32_t *meta_bt(cu_state *s, int32_t *base) { return base + 3 * s->lim.max_tokens + s->lim.max_out; }
static int32_t *meta_tiles(cu_state *s, int32_t *base) {
    return meta_bt(s, base) + (size_t)(s->lim.max_seqs + 1) * s->lim.max_blocks;
}
static int32_t *meta_dtoks(cu_state *s, int32_t *base) { return meta_tiles(s, base) + 2 * s->lim.max_tokens; }
static int32_t *meta_chunk(cu_state *s, int32_t *base) { return meta_dtoks(s, base) + s->lim.max_tokens; }
/* the sliding-window pool's block tables, (S + 1) rows as meta_bt */
static int32_t *meta_bt_swa(cu_state *s, int32_t *base) { return meta_chunk(s, base) + 1; }

/* ---- upload ----------------------------------------------------------------------------- */

/* upload_rows / upload_need flags: gate|up rows interleaved (kc_swiglu's layout), the token
 * table (kc_embed reads it), float vectors uploaded as f32 (upload_f32). */
enum { UP_INTERLEAVE = 1, UP_TABLE = 2, UP_F32 = 4, UP_NO_F8 = 8 /* F8_E4M3 to F16: no FP8 tensor cores */ };

/* How parts (same n_in) are uploaded as one matrix: w's type, shape and row ranges
 * (kc_weight_layout) and the bytes of its two regions. In their own types when the GPU kernels
 * read them: all one type, or quantized types in row ranges (Q|K|V of a Q4_K_M file: Q4_K and
 * Q6_K, a KC_WEIGHT_MIXED weight, see kcuda.h for why). Converted to F16 (returns 1, *why says
 * why) otherwise: a type without GPU kernels, parts of different types that are interleaved or
 * not all quantized, a row width that is not whole blocks, a token table kc_embed cannot read. */
static int upload_plan(const mdl_tensor *const *parts, int n_parts, int flags, kc_weight *w, size_t *data_bytes,
                       size_t *d_bytes, const char **why) {
    int types[KC_WEIGHT_MAX_PARTS], rows[KC_WEIGHT_MAX_PARTS], n_in = (int)parts[0]->ne[0], n_out = 0, same = 1;
    *why = NULL;
    for (int i = 0; i < n_parts; i++) {
        n_out += (int)parts[i]->ne[1];
        same &= parts[i]->type == parts[0]->type;
        if (!kc_weight_type_ok(parts[i]->type)) *why = "no GPU kernel for the type";
        if ((flags & UP_NO_F8) && parts[i]->type == DT_F8_E4M3)
            *why = "FP8 weights on a GPU without FP8 tensor cores (before sm_89)";
        if (i < KC_WEIGHT_MAX_PARTS) {
            types[i] = parts[i]->type;
            rows[i] = (int)parts[i]->ne[1];
        }
    }
    if (!*why && n_parts > KC_WEIGHT_MAX_PARTS) *why = "more parts than a fused matrix holds";
    if (!*why && !same && (flags & UP_INTERLEAVE)) *why = "interleaved parts of different types";
    if (!*why && (flags & UP_TABLE) && !kc_embed_type_ok(parts[0]->type)) *why = "no embedding kernel for the type";
    if (!*why) {
        int rc = kc_weight_layout(types, rows, n_parts, n_in, w, data_bytes, d_bytes);
        if (rc == 0) return 0;
        *why = rc == CM_EINVAL ? "rows are not whole blocks of the type" : "parts of different types, not all quantized";
    }
    const int f16 = DT_F16;
    kc_weight_layout(&f16, &n_out, 1, n_in, w, data_bytes, d_bytes);
    return 1;
}

/* Device bytes upload_rows / upload_f32 (flags & UP_F32) will take for parts; *file (may be
 * NULL) grows by the parts' bytes in the file. */
static size_t upload_need(const mdl_tensor *const *parts, int n_parts, int flags, size_t *file) {
    size_t n = 0, data_bytes = 0, d_bytes = 0;
    for (int i = 0; i < n_parts; i++) {
        n += (size_t)parts[i]->ne[0] * parts[i]->ne[1];
        if (file) *file += parts[i]->nbytes;
    }
    if (flags & UP_F32) return n * 4;
    kc_weight w;
    const char *why;
    upload_plan(parts, n_parts, flags, &w, &data_bytes, &d_bytes, &why);
    return data_bytes + d_bytes;
}

/* The type a layer's experts keep on the device: the file's when every expert's matrices (gate
 * and up together: down = 0; down: 1) have it and the grouped GEMV reads it, else F16. */
static int expert_type(const mdl_config *c, const mdl_layer *ly, int down) {
    const int t = down ? ly->exp_down[0].type : ly->exp_gate[0].type;
    for (int e = 0; e < c->n_expert; e++)
        if ((down ? ly->exp_down[e].type : ly->exp_gate[e].type) != t || (!down && ly->exp_up[e].type != t)) return DT_F16;
    return kc_moe_type_ok(t, down ? c->n_ff_exp : c->n_embd) ? t : DT_F16;
}

/* Device bytes of a layer's parts beyond the Llama ones (norms, router, experts). */
static size_t arch_need(const mdl_model *m, const mdl_layer *ly, size_t *fb) {
    const mdl_config *c = &m->cfg;
    size_t n = 0;
    const mdl_tensor *vec[] = { &ly->attn_q_norm, &ly->attn_k_norm, &ly->attn_post_norm, &ly->ffn_post_norm };
    for (int i = 0; i < 4; i++)
        if (vec[i]->data) n += upload_need(&vec[i], 1, UP_F32, fb);
    if (ly->ffn_gate_inp.data) {
        const mdl_tensor *r[] = { &ly->ffn_gate_inp };
        n += upload_need(r, 1, 0, fb) + (size_t)c->n_expert * (2 * c->n_ff_exp * dt_row_size(expert_type(c, ly, 0), c->n_embd) +
                                                              c->n_embd * dt_row_size(expert_type(c, ly, 1), c->n_ff_exp));
        for (int e = 0; e < c->n_expert; e++) *fb += ly->exp_gate[e].nbytes + ly->exp_up[e].nbytes + ly->exp_down[e].nbytes;
    }
    return n;
}

/* Device bytes of every weight as ex_backend_cuda_create uploads them; *file (may be NULL):
 * the same tensors' bytes in the file. */
static size_t weights_need(const mdl_model *m, int f8, size_t *file) {
    const mdl_config *c = &m->cfg;
    const mdl_tensor *emb[] = { &m->tok_embd }, *outp[] = { &m->output }, *on[] = { &m->out_norm };
    size_t fb = 0;
    size_t n = upload_need(emb, 1, UP_TABLE, &fb) + upload_need(on, 1, UP_F32, &fb) +
               (c->tied_output ? 0 : upload_need(outp, 1, f8, &fb));
    for (int l = 0; l < c->n_layer; l++) {
        const mdl_layer *ly = &m->layers[l];
        const mdl_tensor *qkv[] = { &ly->wq, &ly->wk, &ly->wv }, *wo[] = { &ly->wo }, *gu[] = { &ly->w_gate, &ly->w_up },
                         *dn[] = { &ly->w_down }, *an[] = { &ly->attn_norm }, *fn[] = { &ly->ffn_norm },
                         *bias[] = { &ly->bq, &ly->bk, &ly->bv };
        n += upload_need(qkv, 3, f8, &fb) + upload_need(wo, 1, f8, &fb) + upload_need(an, 1, UP_F32, &fb) +
             upload_need(fn, 1, UP_F32, &fb);
        if (!ly->ffn_gate_inp.data) n += upload_need(gu, 2, UP_INTERLEAVE | f8, &fb) + upload_need(dn, 1, f8, &fb);
        if (ly->bq.data && ly->bk.data && ly->bv.data) n += upload_need(bias, 3, UP_F32, &fb);
        n += arch_need(m, ly, &fb);
    }
    if (file) *file = fb;
    return n;
}

/* Uploads the row-concatenation of parts (same n_in) as one kc_weight, laid out as upload_plan
 * says: repacked in their own types (rows of a mixed matrix at their range's offsets), or every
 * part converted to F16 on the way (exact for the 8-bit and smaller formats up to f16 rounding;
 * more memory and bandwidth, logged with the reason). flags & UP_INTERLEAVE (two parts of as
 * many rows: gate and up): row 2j of w is row j of the first part, 2j + 1 row j of the second
 * (kc_swiglu's layout; a warp of the F16 GEMV then holds both). */
static int upload_rows(cu_state *s, const mdl_tensor *const *parts, int n_parts, kc_weight *w, int flags, char *err,
                       size_t errlen) {
    const int interleave = flags & UP_INTERLEAVE;
    int n_in = (int)parts[0]->ne[0];
    if (interleave && (n_parts != 2 || parts[0]->ne[1] != parts[1]->ne[1])) {
        snprintf(err, errlen, "cuda backend: tensors '%s' and '%s' differ in rows and cannot be interleaved", parts[0]->name,
                 parts[n_parts - 1]->name);
        return CM_EUNSUPPORTED;
    }
    for (int i = 0; i < n_parts; i++)
        if (parts[i]->ne[0] != n_in) {
            snprintf(err, errlen, "cuda backend: tensors '%s' and '%s' differ in width and cannot be fused", parts[0]->name,
                     parts[i]->name);
            return CM_EUNSUPPORTED;
        }
    size_t data_bytes, d_bytes;
    const char *why;
    const int convert = upload_plan(parts, n_parts, flags, w, &data_bytes, &d_bytes, &why);
    if (convert) {
        for (int i = 0; i < n_parts; i++)
            if (!dt_is_supported(parts[i]->type) && parts[i]->type != DT_F8_E4M3) {
                snprintf(err, errlen, "cuda backend: tensor '%s' has type %s, which cannot be read", parts[i]->name,
                         dt_name(parts[i]->type) ? dt_name(parts[i]->type) : "?");
                return CM_EUNSUPPORTED;
            }
        CM_LOG_INFO("cuda", "weights converted to F16", "tensor=%s type=%s reason=\"%s\"", parts[0]->name,
                    dt_name(parts[0]->type) ? dt_name(parts[0]->type) : "?", why);
    }
    w->data = NULL;
    w->d = NULL;
    if (cudaMalloc(&w->data, data_bytes) != cudaSuccess || (d_bytes && cudaMalloc((void **)&w->d, d_bytes) != cudaSuccess)) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(err, errlen, "cuda backend: out of GPU memory uploading '%s' (%.1f MiB; %.1f of %.1f GiB free)", parts[0]->name,
                 (data_bytes + d_bytes) / 1048576.0, fr / 1073741824.0, tot / 1073741824.0);
        return CM_ENOMEM;
    }
    for (int i = 0, row = 0; i < n_parts; row += (int)parts[i++]->ne[1]) {
        const mdl_tensor *t = parts[i];
        const int type = convert ? DT_F16 : t->type;
        size_t pd, ps, nel = (size_t)n_in * (size_t)t->ne[1];
        kc_weight_sizes(type, n_in, (int)t->ne[1], &pd, &ps);
        void *hq = malloc(pd ? pd : 1);
        kc_half *hs = ps ? malloc(ps) : NULL;
        float *hf = convert ? malloc(nel * sizeof(float)) : NULL;
        if (!hq || (ps && !hs) || (convert && !hf)) {
            free(hq);
            free(hs);
            free(hf);
            snprintf(err, errlen, "cuda backend: out of host memory staging '%s'", t->name);
            return CM_ENOMEM;
        }
        if (convert) {
            int crc = mdl_tensor_rows_f32(t, 0, t->ne[1], hf); /* F8_E4M3: code x row scale */
            if (!crc) crc = dt_quantize(DT_F16, hf, hq, (int64_t)nel);
            free(hf);
            if (crc) {
                free(hq);
                free(hs);
                snprintf(err, errlen, "cuda backend: converting '%s' (%s) to F16 failed", t->name, dt_name(t->type));
                return CM_EUNSUPPORTED;
            }
        } else {
            kc_weight_repack(type, t->data, n_in, (int)t->ne[1], hq, hs);
            if (type == DT_F8_E4M3) memcpy(hs, t->scale, (size_t)t->ne[1] * sizeof(float)); /* the row scales (kcuda.h) */
        }
        cudaError_t e;
        if (interleave) { /* every other row, from row i */
            const size_t rows = (size_t)t->ne[1], rd = pd / rows, rs = ps / rows;
            e = cudaMemcpy2D((char *)w->data + i * rd, 2 * rd, hq, rd, rd, rows, cudaMemcpyHostToDevice);
            if (e == cudaSuccess && ps) e = cudaMemcpy2D((char *)w->d + i * rs, 2 * rs, hs, rs, rs, rows, cudaMemcpyHostToDevice);
        } else { /* at the offsets of its first row (a mixed matrix: in its range) */
            size_t off_data, off_d;
            kc_weight_row_at(w, row, &off_data, &off_d);
            e = cudaMemcpy((char *)w->data + off_data, hq, pd, cudaMemcpyHostToDevice);
            if (e == cudaSuccess && ps) e = cudaMemcpy((char *)w->d + off_d, hs, ps, cudaMemcpyHostToDevice);
        }
        free(hq);
        free(hs);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "cuda backend: copying '%s' to the GPU failed: %s", t->name, cudaGetErrorString(e));
            return CM_ECUDA;
        }
    }
    s->weight_bytes += data_bytes + d_bytes;
    return 0;
}

/* Adds the file types of parts uploaded as w to *kept (read as they are by the GPU kernels) or
 * *conv (converted to F16): bit t for type t. */
static void note_types(const kc_weight *w, const mdl_tensor *const *parts, int n_parts, uint64_t *kept, uint64_t *conv) {
    for (int i = 0; i < n_parts; i++) {
        const int t = parts[i]->type;
        if (t < 0 || t >= 64) continue;
        if (w->type == KC_WEIGHT_MIXED || w->type == t) *kept |= 1ull << t;
        else *conv |= 1ull << t;
    }
}

static void types_str(uint64_t mask, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int t = 0; t < 64; t++)
        if (mask >> t & 1) {
            int r = snprintf(buf + k, k < n ? n - k : 0, "%s%s", k ? "," : "", dt_name(t) ? dt_name(t) : "?");
            if (r > 0) k += (size_t)r;
        }
    if (!k) snprintf(buf, n, "none");
}

/* The start-up line that says which of the file's matrix types the GPU reads as they are and
 * which were converted to F16, how many fused matrices keep row ranges of different types, and
 * the weights' device bytes against the same tensors' bytes in the file. */
static void log_weight_types(const cu_state *s, const mdl_model *m, size_t file_bytes) {
    uint64_t kept = 0, conv = 0;
    int mixed = 0;
    const mdl_tensor *emb[] = { &m->tok_embd }, *outp[] = { &m->output };
    note_types(&s->tok_embd, emb, 1, &kept, &conv);
    if (!s->cfg.tied_output) note_types(&s->output, outp, 1, &kept, &conv);
    for (int l = 0; l < s->cfg.n_layer; l++) {
        const mdl_layer *ly = &m->layers[l];
        const cu_layer *L = &s->layers[l];
        const mdl_tensor *qkv[] = { &ly->wq, &ly->wk, &ly->wv }, *wo[] = { &ly->wo }, *gu[] = { &ly->w_gate, &ly->w_up },
                         *dn[] = { &ly->w_down };
        note_types(&L->qkv, qkv, 3, &kept, &conv);
        note_types(&L->wo, wo, 1, &kept, &conv);
        if (!L->moe) {
            note_types(&L->gu, gu, 2, &kept, &conv);
            note_types(&L->down, dn, 1, &kept, &conv);
        } else if (ly->exp_gate[0].type < 64 && ly->exp_gate[0].type >= 0) { /* experts: F16 (upload_arch_layer) */
            const int ft[2] = { ly->exp_gate[0].type, ly->exp_down[0].type }, kt[2] = { L->exp_gu_type, L->exp_down_type };
            for (int i = 0; i < 2; i++)
                if (ft[i] >= 0 && ft[i] < 64) {
                    if (ft[i] == kt[i]) kept |= 1ull << ft[i];
                    else conv |= 1ull << ft[i];
                }
        }
        mixed += (L->qkv.type == KC_WEIGHT_MIXED) + (L->wo.type == KC_WEIGHT_MIXED) + (L->gu.type == KC_WEIGHT_MIXED) +
                 (L->down.type == KC_WEIGHT_MIXED);
    }
    char k[128], c[128];
    types_str(kept, k, sizeof k);
    types_str(conv, c, sizeof c);
    CM_LOG_INFO("cuda", "weight types", "kept=%s converted_to_f16=%s mixed_matrices=%d weights_gib=%.3f file_tensors_gib=%.3f "
                "ratio=%.3f", k, c, mixed, s->weight_bytes / GIB, file_bytes / GIB,
                file_bytes ? (double)s->weight_bytes / (double)file_bytes : 0.0);
}

/* Uploads one or more float vectors (norm weights, biases of any float type) concatenated as f32. */
static int upload_f32(cu_state *s, const mdl_tensor *const *parts, int n_parts, float **out, char *err, size_t errlen) {
    size_t n = 0;
    for (int i = 0; i < n_parts; i++) n += (size_t)parts[i]->ne[0] * parts[i]->ne[1];
    float *h = malloc(n * 4);
    if (!h) return CM_ENOMEM;
    size_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        size_t k = (size_t)parts[i]->ne[0] * parts[i]->ne[1];
        if (dt_dequantize(parts[i]->type, parts[i]->data, h + off, (int64_t)k)) {
            snprintf(err, errlen, "cuda backend: tensor '%s' of type %s cannot be read as floats", parts[i]->name,
                     dt_name(parts[i]->type) ? dt_name(parts[i]->type) : "?");
            free(h);
            return CM_EUNSUPPORTED;
        }
        off += k;
    }
    cudaError_t e = cudaMalloc((void **)out, n * 4);
    if (e == cudaSuccess) e = cudaMemcpy(*out, h, n * 4, cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: uploading '%s' failed: %s", parts[0]->name, cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation ? CM_ENOMEM : CM_ECUDA;
    }
    s->weight_bytes += n * 4;
    return 0;
}

/* Uploads every expert's matrices of a layer (gate and up: down = 0; down: 1) as one stacked
 * kc_weight of `type`: repacked (kc_weight_repack) when the file has that type, else converted
 * to F16. Expert e's rows start at e x its row count. */
static int upload_experts(cu_state *s, const mdl_layer *ly, int n_exp, int down, int type, kc_weight *w, char *err,
                          size_t errlen) {
    const mdl_tensor *t0 = down ? &ly->exp_down[0] : &ly->exp_gate[0];
    const int n_in = (int)t0->ne[0], per = down ? (int)t0->ne[1] : 2 * (int)t0->ne[1];
    size_t db, sb;
    memset(w, 0, sizeof *w);
    if (kc_weight_sizes(type, n_in, n_exp * per, &db, &sb)) {
        snprintf(err, errlen, "cuda backend: experts '%s' of type %s cannot be laid out", t0->name, dt_name(type) ? dt_name(type) : "?");
        return CM_EUNSUPPORTED;
    }
    w->type = type;
    w->n_in = n_in;
    w->n_out = n_exp * per;
    if (cudaMalloc(&w->data, db) != cudaSuccess || (sb && cudaMalloc((void **)&w->d, sb) != cudaSuccess)) {
        snprintf(err, errlen, "cuda backend: out of GPU memory uploading experts '%s' (%.1f MiB)", t0->name, (db + sb) / 1048576.0);
        return CM_ENOMEM;
    }
    const size_t dr = db / w->n_out, sr = sb / w->n_out;
    for (int e = 0, row = 0; e < n_exp; e++) {
        const mdl_tensor *mats[2] = { down ? &ly->exp_down[e] : &ly->exp_gate[e], &ly->exp_up[e] };
        for (int i = 0; i < (down ? 1 : 2); row += (int)mats[i]->ne[1], i++) {
            const mdl_tensor *t = mats[i];
            const size_t nel = (size_t)t->ne[0] * t->ne[1], nr = (size_t)t->ne[1];
            uint8_t *hq = malloc(dr * nr > 0 ? dr * nr : 1);
            kc_half *hs = sr ? malloc(sr * nr) : NULL;
            float *hf = t->type != type ? malloc(nel * sizeof(float)) : NULL;
            int rc = !hq || (sr && !hs) || (t->type != type && !hf) ? CM_ENOMEM : 0;
            if (!rc && t->type == type) rc = kc_weight_repack(type, t->data, n_in, (int)nr, hq, hs);
            else if (!rc) { /* F16 (expert_type): every value as half */
                rc = mdl_tensor_rows_f32(t, 0, t->ne[1], hf);
                if (!rc) rc = dt_quantize(DT_F16, hf, hq, (int64_t)nel);
            }
            if (!rc && cudaMemcpy((uint8_t *)w->data + row * dr, hq, dr * nr, cudaMemcpyHostToDevice) != cudaSuccess) rc = CM_ECUDA;
            if (!rc && sr && cudaMemcpy((uint8_t *)w->d + row * sr, hs, sr * nr, cudaMemcpyHostToDevice) != cudaSuccess) rc = CM_ECUDA;
            free(hq);
            free(hs);
            free(hf);
            if (rc) {
                snprintf(err, errlen, "cuda backend: uploading expert tensor '%s' (%s as %s) failed: %s", t->name,
                         dt_name(t->type) ? dt_name(t->type) : "?", dt_name(type) ? dt_name(type) : "?", cm_err_str(rc));
                return rc;
            }
        }
    }
    s->weight_bytes += db + sb;
    return 0;
}

/* Uploads a layer's parts beyond the Llama ones: QK-norm and post-norm weights, and for a
 * mixture-of-experts layer the router (as upload_rows) and every expert in its file type when
 * the grouped GEMV reads it, else converted to F16 (expert_type), gate rows then up rows, then
 * down: upload_experts. */
static int upload_arch_layer(cu_state *s, const mdl_model *m, int l, char *err, size_t errlen) {
    const mdl_config *c = &m->cfg;
    const mdl_layer *ly = &m->layers[l];
    cu_layer *L = &s->layers[l];
    const mdl_tensor *qn[] = { &ly->attn_q_norm }, *kn[] = { &ly->attn_k_norm }, *ap[] = { &ly->attn_post_norm },
                     *fp[] = { &ly->ffn_post_norm };
    int rc;
    L->swa = ly->swa;
    if (ly->attn_q_norm.data && ((rc = upload_f32(s, qn, 1, &L->q_norm, err, errlen)) || (rc = upload_f32(s, kn, 1, &L->k_norm, err, errlen))))
        return rc;
    if (ly->attn_post_norm.data && (rc = upload_f32(s, ap, 1, &L->attn_post, err, errlen))) return rc;
    if (ly->ffn_post_norm.data && (rc = upload_f32(s, fp, 1, &L->ffn_post, err, errlen))) return rc;
    if (!ly->ffn_gate_inp.data) return 0;
    L->moe = 1;
    if (c->n_embd % 8 || c->n_ff_exp % 8) {
        snprintf(err, errlen, "cuda backend: experts of %d x %d are not supported (both multiples of 8)", c->n_embd, c->n_ff_exp);
        return CM_EUNSUPPORTED;
    }
    const mdl_tensor *rt[] = { &ly->ffn_gate_inp };
    if ((rc = upload_rows(s, rt, 1, &L->router, 0, err, errlen))) return rc;
    L->exp_gu_type = expert_type(c, ly, 0);
    L->exp_down_type = expert_type(c, ly, 1);
    if ((rc = upload_experts(s, ly, c->n_expert, 0, L->exp_gu_type, &L->exp_gu, err, errlen)) ||
        (rc = upload_experts(s, ly, c->n_expert, 1, L->exp_down_type, &L->exp_down, err, errlen)))
        return rc;
    return 0;
}

/* ---- the forward pass --------------------------------------------------------------------- */

/* Records the end of a launch of category cat (profiling only; never while capturing). */
static void prof_mark(struct cu_state *s, int cat);

/* What one forward pass launches: filled by stage_step from a batch, or by capture_graphs for
 * a bucket of padding tokens. */
typedef struct cu_step {
    int n_tok, n_out;
    int per_head;   /* every token's attention on the per-head kernel (kc_attention_ex) */
    int kv_ready;   /* per-head kernel: a pure decode step (its early key loads) */
    int n_dec;      /* tensor-core decode tokens: the list dtoks, or tokens 0..n_dec-1 when dec_all */
    int dec_all;
    int n_tiles;    /* tensor-core prefill tiles (tiles) */
    int n_split;    /* decode splits (either kernel) */
    int pf_split, pf_kchunk; /* prefill tiles split over the keys (kc_plan_pf_splits): count, positions each */
    int pf_warps;            /* ... on the mma.sync kernel with CTAs of this many warps (the tiles' size) */
    int pf_split_fa3;        /* ... or on the wgmma kernel (kc_plan_pf_splits_fa3) */
    int f8sh_pairs;          /* FP8 cache: the prefill tiles on the wgmma kernel over this many copied blocks (0: not) */
    size_t f8sh_ints;        /* ... and the staging it copies (pairs, then the step's block-table rows) */
    int no_head;    /* stop at the final norm (s->last_n): forward_hidden */
} cu_step;

/* The F16 cache's attention launchers with the FP8 ones' pointer types, so a step picks either. */
static int att_perhead_f16(const float *q, const void *k, const void *v, float *out, kc_xq *xq, const int32_t *pos,
                             const int32_t *seq, const int32_t *bt, int max_blocks, int n_tok, int n_head, int n_kv, int hd,
                             int bs, float scale, int n_split, int chunk, int splits, float *partial, int *counters,
                             int kv_ready, cudaStream_t s) {
    return kc_attention_ex(q, k, v, out, xq, pos, seq, bt, max_blocks, n_tok, n_head, n_kv, hd, bs, scale, n_split, chunk,
                           splits, partial, counters, kv_ready, s);
}
static int att_decode_f16(const float *q, const void *k, const void *v, float *out, kc_xq *xq, const int32_t *toks,
                                    int n_tok, const int32_t *pos, const int32_t *seq, const int32_t *bt, int max_blocks,
                                    int n_head, int n_kv, int hd, int bs, float scale, int n_split, const int32_t *chunk,
                                    float *partial, int *counters, cudaStream_t s) {
    return kc_attention_decode_tc(q, k, v, out, xq, toks, n_tok, pos, seq, bt, max_blocks, n_head, n_kv, hd, bs, scale, n_split,
                                  chunk, partial, counters, s);
}
/* qh: q as the wgmma kernel's half operand (kc_rope_store_kv_pf), which only that kernel reads */
static int att_prefill_f16(const float *q, const kc_half *qh, const void *k, const void *v, float *out, const int32_t *tiles,
                           int n_tiles, const int32_t *pos, const int32_t *seq, const int32_t *bt, int max_blocks, int n_head,
                           int n_kv, int hd, int bs, float scale, int warps, cudaStream_t s) {
    if (kc_plan_get()->att_pf_fa3 && kc_attention_fa3_ok(hd, n_head, n_kv, bs)) /* tiles of its size: backend_create */
        return kc_attention_prefill_fa3(q, qh, k, v, out, tiles, n_tiles, pos, seq, bt, max_blocks, n_head, n_kv, hd, bs, scale,
                                        s);
    if (qh) return CM_EINVAL;
    return kc_attention_prefill_tc(q, k, v, out, tiles, n_tiles, pos, seq, bt, max_blocks, n_head, n_kv, hd, bs, scale, warps, s);
}

/* Whether the producer of n_tok rows of n into xq (a norm, the gated activation) writes the image
 * that the next matmul, their only reader, takes (kc_matmul_x_order): then it writes no f32 rows. */
static int img_only(const kc_xq *xq, int n_tok, int n) {
    return xq->img_order && kc_xq_img_fits(xq, n_tok, n);
}

/* Layer L's rotation: its pool's (sliding-window layers: their own) frequencies, and its QK-norm. */
static kc_rope layer_rope(const cu_state *s, const cu_layer *L) {
    kc_rope r = L->swa ? s->rope_swa : s->rope;
    r.q_norm = L->q_norm;
    r.k_norm = L->k_norm;
    r.norm_eps = s->cfg.norm_eps;
    return r;
}

/* Whether a step of n_tok tokens rotates layer L's heads on kc_rope_store_kv_pf (a token a CTA,
 * whole rotations, F16 cache), and whether its F16 Q|K|V on cuBLAS may then write half rows for
 * it (no bias to add; the plan's qkv_half_min_tok). */
static int layer_rope_pf(const cu_state *s, const cu_layer *L, int n_tok) {
    const kc_rope r = layer_rope(s, L);
    return !s->kv_f8 && kc_rope_pf_ok(n_tok, s->cfg.head_dim, &r);
}
static int layer_qkv_half(const cu_state *s, const cu_layer *L, int n_tok) {
    return !L->bqkv && kc_qkv_half_use(&L->qkv, n_tok, &s->gws);
}

/* Whether an FP8 matrix W (wo or down: out = n_embd) of an n_tok-token step may write its
 * unit-scale sums into gws.f8_raw for the next norm to add (kc_rmsnorm_f8raw_xq): the scratch
 * holds them and the norm takes the size. kc_matmul_f8_raw then decides from the timings. */
static int f8raw_add_ok(const cu_state *s, const kc_weight *W, int n_tok) {
    return W->type == DT_F8_E4M3 && W->n_out == s->cfg.n_embd && s->gws.f8_raw &&
           (size_t)n_tok * W->n_out <= s->gws.f8_raw_cap && kc_rmsnorm_f8raw_ok(n_tok, s->cfg.n_embd);
}

/* Enqueues one forward pass over st->n_tok tokens whose arrays are already staged in h_meta,
 * producing st->n_out logits rows in s->logits (device). No synchronization, no allocation:
 * capturable. */
static void enqueue_forward(cu_state *s, const cu_step *st) {
    const mdl_config *c = &s->cfg;
    cudaStream_t cs = s->stream;
    const int hd = c->head_dim, n_tok = st->n_tok, n_out = st->n_out;
    const int max_blocks = s->lim.max_blocks, bs = s->lim.block_size;
    int32_t *d_tok = meta_tok(s, s->d_meta), *d_pos = meta_pos(s, s->d_meta), *d_seq = meta_seq(s, s->d_meta);
    int32_t *d_rows = meta_rows(s, s->d_meta), *d_bt = meta_bt(s, s->d_meta);
    /* stage: tokens, positions, sequences and rows for this step, and every block-table row */
    prof_mark(s, -1);
    CU_FATAL(cudaMemcpyAsync(s->d_meta, s->h_meta, s->meta_ints * sizeof(int32_t), cudaMemcpyHostToDevice, cs));
    const int32_t *d_f8sbt = s->d_f8sh ? s->d_f8sh + 2 * (size_t)s->f8sh_cap : NULL;
    if (st->f8sh_pairs)
        CU_FATAL(cudaMemcpyAsync(s->d_f8sh, s->h_f8sh, st->f8sh_ints * sizeof(int32_t), cudaMemcpyHostToDevice, cs));
    prof_mark(s, PC_STAGE);
    KC_FATAL(kc_embed_scaled(&s->tok_embd, d_tok, n_tok, s->x, c->embd_scale > 0 ? c->embd_scale : 1.0f, cs));
    prof_mark(s, PC_EMBED);
    const float scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)hd);
    int32_t *d_bt_swa = meta_bt_swa(s, s->d_meta);
    float *hy = n_tok <= s->norm_blocks_max ? NULL : s->h;   /* the norms' f32 output */
    /* attention's: only the blocks for wo where the step is small and has no prefill tile */
    float *ay = n_tok <= s->att_blocks_max && !st->n_tiles ? NULL : s->att;
    float *gy = n_tok <= s->act_blocks_max ? NULL : s->act;  /* SwiGLU's */
    /* prefill tiles alone on the wgmma kernel (att_prefill_f16's choice, whole or split keys): the
     * rotation may write q as that kernel's half operand (the plan's pf_q_half) */
    const int fa3_step = !st->per_head && !st->n_dec && st->n_tiles && !s->kv_f8 && s->plan.att_pf_fa3 &&
                         (st->pf_split_fa3 || st->pf_split <= 1) && kc_attention_fa3_ok(hd, c->n_head, c->n_head_kv, bs);
    int normed = 0; /* the layer's attention pre-norm came with the previous layer's post-FFN norm */
    int moe_add = 0; /* the previous layer's experts' outputs are still to be added to x: with this norm */
    /* the previous layer's FP8 down as unit-scale sums in gws.f8_raw: added to x by this norm */
    const float *dn_sw = NULL, *dn_sx = NULL;
    for (int l = 0; l < c->n_layer; l++) {
        cu_layer *L = &s->layers[l];
        if (moe_add) {
            KC_FATAL(kc_rmsnorm_moe_xq(s->x, s->eout, c->n_expert_used, L->attn_norm, s->h, &s->xq_h, n_tok, c->n_embd, c->norm_eps, cs));
            prof_mark(s, PC_NORM);
            moe_add = 0;
        } else if (!normed) {
            /* the norm writes x's image for qkv's wgmma tiles where they take it */
            s->xq_h.img_order = kc_matmul_x_order(&L->qkv, n_tok, &s->gws);
            float *ny = img_only(&s->xq_h, n_tok, c->n_embd) ? NULL : hy;
            if (dn_sx)
                KC_FATAL(kc_rmsnorm_f8raw_xq(s->x, s->gws.f8_raw, dn_sw, dn_sx, L->attn_norm, ny, &s->xq_h, n_tok, c->n_embd,
                                             c->norm_eps, cs));
            else KC_FATAL(kc_rmsnorm_xq(s->x, L->attn_norm, ny, &s->xq_h, n_tok, c->n_embd, c->norm_eps, cs));
            dn_sx = NULL;
            prof_mark(s, PC_NORM);
        }
        /* a sliding-window layer: its pool, block tables, rope and window; QK-norm in the rope kernel */
        int32_t *lbt = L->swa ? d_bt_swa : d_bt;
        const kc_rope rope = layer_rope(s, L);
        /* one token on a K-quant GEMV: the rotation and the cache stores in the GEMV's launch */
        int rotated = 0;
        if (n_tok == 1 && !s->kv_f8 && !L->bqkv && s->qkv_ctr) {
            const kc_qkv_rope ep = { .q_out = s->q, .k_cache = L->k, .v_cache = L->v, .pos = d_pos, .seq = d_seq,
                                     .block_tables = lbt, .max_blocks = max_blocks, .n_head = c->n_head,
                                     .n_kv = c->n_head_kv, .hd = hd, .block_size = bs, .rope = rope, .counters = s->qkv_ctr };
            rotated = kc_matmul_qkv_rope(&L->qkv, s->h, &s->xq_h, s->qkv, &ep, &s->gws, cs);
            KC_FATAL(rotated < 0 ? rotated : 0);
        }
        /* prefill-sized steps: the rotation of whole heads a token a CTA, reading Q|K|V as half where
         * its F16 matrix writes half rows (the plan's qkv_half_min_tok), writing q as the wgmma
         * kernel's operand (pf_q_half) */
        const int pf_rope = !rotated && layer_rope_pf(s, L, n_tok);
        const int qkv_h = pf_rope && layer_qkv_half(s, L, n_tok);
        const int q_h = pf_rope && fa3_step && s->plan.pf_q_half;
        /* FP8 Q|K|V into the FP8 cache: the unit-scale sums, scaled by the rotation, where timed faster */
        const float *qkv_sx = NULL;
        if (!rotated && !qkv_h && s->kv_f8 && !L->bqkv && L->qkv.type == DT_F8_E4M3 && kc_rope_f8_scaled_ok(n_tok, hd, &rope)) {
            const int rc = kc_matmul_f8_raw(&L->qkv, s->h, &s->xq_h, n_tok, s->qkv, &qkv_sx, 0, &s->gws, cs);
            KC_FATAL(rc < 0 ? rc : 0);
            if (rc) qkv_sx = NULL;
        }
        if (qkv_h) KC_FATAL(kc_matmul_half_out(&L->qkv, s->h, &s->xq_h, n_tok, (kc_half *)s->qkv, &s->gws, cs));
        else if (!rotated && !qkv_sx) KC_FATAL(kc_matmul_xq(&L->qkv, s->h, &s->xq_h, n_tok, s->qkv, 0, &s->gws, cs));
        s->xq_h.img_tok = 0; /* x_half is every matmul's scratch: the image is spent */
        if (L->bqkv) KC_FATAL(kc_add_bias(s->qkv, L->bqkv, n_tok, s->qkv_dim, cs));
        prof_mark(s, PC_QKV);
        const kc_attn_mods mods = { .softcap = c->attn_softcap, .window = L->swa ? c->n_swa : 0 };
        const kc_half *qh = q_h ? (const kc_half *)s->q : NULL; /* the wgmma kernel's operand */
        kc_attention_mods(&mods);
        if (qkv_h || q_h)
            KC_FATAL(kc_rope_store_kv_pf(s->qkv, qkv_h, s->q, q_h, kc_attention_fa3_qscale(scale), L->k, L->v, d_pos, d_seq, lbt,
                                         max_blocks, n_tok, c->n_head, c->n_head_kv, hd, bs, &rope, cs));
        else if (qkv_sx)
            KC_FATAL(kc_rope_store_kv_f8_scaled(s->qkv, (const float *)L->qkv.d, qkv_sx, s->q, L->k, L->v, L->k_scale, L->v_scale,
                                                d_pos, d_seq, lbt, max_blocks, n_tok, c->n_head, c->n_head_kv, hd, bs, &rope, cs));
        else if (!rotated && s->kv_f8)
            KC_FATAL(kc_rope_store_kv_f8(s->qkv, s->q, L->k, L->v, L->k_scale, L->v_scale, d_pos, d_seq, lbt, max_blocks, n_tok,
                                         c->n_head, c->n_head_kv, hd, bs, &rope, cs));
        else if (!rotated)
            KC_FATAL(kc_rope_store_kv(s->qkv, s->q, L->k, L->v, d_pos, d_seq, lbt, max_blocks, n_tok, c->n_head, c->n_head_kv,
                                      hd, bs, &rope, cs));
        prof_mark(s, PC_ROPE);
        /* prefill tiles alone on the wgmma kernel, wo on cuBLAS: the attention writes wo's input as half */
        s->xq_o.img_order = !st->per_head && st->n_tiles && !st->n_dec && !st->pf_split_fa3 && st->pf_split <= 1 && !s->kv_f8 &&
                                    s->plan.att_pf_fa3 && s->plan.att_pf_half && kc_attention_fa3_ok(hd, c->n_head, c->n_head_kv, bs)
                                ? kc_matmul_x_order(&L->wo, n_tok, &s->gws)
                                : 0;
        const int pf_half = s->xq_o.img_order == KC_X_PLAIN && kc_xq_img_fits(&s->xq_o, n_tok, c->n_head * hd);
        if (st->per_head) {
            KC_FATAL((s->kv_f8 ? kc_attention_ex_f8 : att_perhead_f16)(
                s->q, L->k, L->v, ay, &s->xq_o, d_pos, d_seq, lbt, max_blocks, n_tok, c->n_head, c->n_head_kv, hd, bs, scale,
                st->n_split, s->att_chunk, s->plan.att_ph_splits, s->partial, s->att_counters, st->kv_ready, cs));
        } else {
            if (st->n_dec)
                KC_FATAL((s->kv_f8 ? kc_attention_decode_tc_f8 : att_decode_f16)(
                    s->q, L->k, L->v, ay, st->n_tiles ? NULL : &s->xq_o, st->dec_all ? NULL : meta_dtoks(s, s->d_meta),
                    st->n_dec, d_pos, d_seq, lbt, max_blocks, c->n_head, c->n_head_kv, hd, bs, scale, st->n_split,
                    meta_chunk(s, s->d_meta), s->partial, s->att_counters, cs));
            if (st->n_tiles && st->pf_split_fa3) {
                KC_FATAL(kc_attention_prefill_fa3_split(s->q, qh, L->k, L->v, s->att, meta_tiles(s, s->d_meta), st->n_tiles,
                                                        d_pos, d_seq, lbt, max_blocks, c->n_head, c->n_head_kv, hd, bs, scale,
                                                        st->pf_split, st->pf_kchunk, s->pf_partial, s->pf_counters, cs));
                s->xq_o.n = 0; /* wo reads the f32 rows */
            } else if (st->n_tiles && st->pf_split > 1) {
                KC_FATAL(kc_attention_prefill_tc_split(s->q, L->k, L->v, s->att, meta_tiles(s, s->d_meta), st->n_tiles, d_pos, d_seq,
                                                       lbt, max_blocks, c->n_head, c->n_head_kv, hd, bs, scale,
                                                       st->pf_warps, s->kv_f8, st->pf_split, st->pf_kchunk, s->pf_partial,
                                                       s->pf_counters, cs));
                s->xq_o.n = 0; /* wo reads the f32 rows */
            } else if (pf_half) {
                /* a prefill step for wo on cuBLAS: the output as half, wo's input as it is */
                KC_FATAL(kc_attention_prefill_fa3_half(s->q, qh, L->k, L->v, s->xq_o.img, meta_tiles(s, s->d_meta), st->n_tiles,
                                                       d_pos, d_seq, lbt, max_blocks, c->n_head, c->n_head_kv, hd, bs, scale,
                                                       cs));
                s->xq_o.n = 0;
                s->xq_o.img_tok = n_tok;
                s->xq_o.img_n = c->n_head * hd;
            } else if (st->n_tiles && st->f8sh_pairs) { /* FP8 cache: its blocks as F16 for the wgmma kernel */
                KC_FATAL(kc_kv_f8_to_half(L->k, L->v, s->f8sh_k, s->f8sh_v, s->d_f8sh, st->f8sh_pairs, c->n_head_kv, hd, bs, cs));
                KC_FATAL(kc_attention_prefill_fa3(s->q, NULL, s->f8sh_k, s->f8sh_v, s->att, meta_tiles(s, s->d_meta), st->n_tiles,
                                                  d_pos, d_seq, d_f8sbt, max_blocks, c->n_head, c->n_head_kv, hd, bs, scale, cs));
                s->xq_o.n = 0; /* wo reads the f32 rows */
            } else if (st->n_tiles && s->kv_f8) {
                KC_FATAL(kc_attention_prefill_tc_f8(s->q, L->k, L->v, s->att, meta_tiles(s, s->d_meta), st->n_tiles, d_pos, d_seq,
                                                    lbt, max_blocks, c->n_head, c->n_head_kv, hd, bs, scale, s->plan.att_pf_warps,
                                                    cs));
                s->xq_o.n = 0; /* wo reads the f32 rows */
            } else if (st->n_tiles) {
                KC_FATAL(att_prefill_f16(s->q, qh, L->k, L->v, s->att, meta_tiles(s, s->d_meta), st->n_tiles, d_pos, d_seq, lbt,
                                         max_blocks, c->n_head, c->n_head_kv, hd, bs, scale, s->plan.att_pf_warps, cs));
                s->xq_o.n = 0; /* wo reads the f32 rows */
            }
        }
        kc_attention_mods(NULL);
        prof_mark(s, PC_ATTN);
        /* a decode step of a MoE layer: the FFN norm, router and routing in one launch, the SwiGLU
         * in the gate|up GEMV, the down GEMV quantizing its input (the plan's moe_fuse) */
        const int moe_step = L->moe && !L->attn_post && n_tok <= s->plan.moe_fuse && kc_moe_norm_route_ok(&L->router, n_tok, c->n_embd);
        const int moe_glu = moe_step && c->ffn_act == MDL_ACT_SILU && kc_weight_is_quant(L->exp_gu_type) &&
                            n_tok <= s->xq_h.cap_tok && c->n_embd <= s->xq_h.cap_n && !s->xq_h.no_ints &&
                            kc_moe_gemvq_f_ok(&L->exp_down, c->n_expert, n_tok);
        /* one token whose expert launches read the choices themselves: no grouping */
        const int moe_ungrouped = moe_glu && n_tok == 1;
        if (L->attn_post) { /* x += rmsnorm(att Wo), and the FFN pre-norm, in one launch */
            KC_FATAL(kc_matmul_xq(&L->wo, s->att, &s->xq_o, n_tok, s->h, 0, &s->gws, cs));
            s->xq_o.img_tok = 0;
            prof_mark(s, PC_WO);
            KC_FATAL(kc_rmsnorm_add_xq(s->x, s->h, L->attn_post, L->ffn_norm, hy, &s->xq_h, n_tok, c->n_embd, c->norm_eps, cs));
        } else {
            /* FP8 wo past the GEMV: the unit-scale sums into gws.f8_raw where timed faster, added to x
             * by the FFN norm (kc_rmsnorm_f8raw_xq) instead of a scale pass */
            const float *wo_sx = NULL;
            int wo_raw = 1;
            if (!moe_step && !L->moe && f8raw_add_ok(s, &L->wo, n_tok))
                wo_raw = kc_matmul_f8_raw(&L->wo, s->att, &s->xq_o, n_tok, s->gws.f8_raw, &wo_sx, 1, &s->gws, cs);
            KC_FATAL(wo_raw < 0 ? wo_raw : 0);
            if (wo_raw) KC_FATAL(kc_matmul_xq(&L->wo, s->att, &s->xq_o, n_tok, s->x, 1, &s->gws, cs));
            s->xq_o.img_tok = 0; /* the prefill attention's half output, if it wrote one, is spent */
            prof_mark(s, PC_WO);
            if (moe_step)
                KC_FATAL(kc_moe_norm_route(s->x, L->ffn_norm, hy, &s->xq_h, n_tok, c->n_embd, c->norm_eps, &L->router, s->rlogits,
                                           c->n_expert_used, c->expert_norm, s->ridx, s->rw, moe_ungrouped ? NULL : s->ecnt,
                                           moe_ungrouped ? NULL : s->eoff, moe_ungrouped ? NULL : s->elist, s->route_ctr, cs));
            else {
                s->xq_h.img_order = L->moe ? 0 : kc_matmul_x_order(&L->gu, n_tok, &s->gws); /* for gate|up */
                float *ny = img_only(&s->xq_h, n_tok, c->n_embd) ? NULL : hy;
                if (!wo_raw)
                    KC_FATAL(kc_rmsnorm_f8raw_xq(s->x, s->gws.f8_raw, (const float *)L->wo.d, wo_sx, L->ffn_norm, ny, &s->xq_h, n_tok,
                                                 c->n_embd, c->norm_eps, cs));
                else KC_FATAL(kc_rmsnorm_xq(s->x, L->ffn_norm, ny, &s->xq_h, n_tok, c->n_embd, c->norm_eps, cs));
            }
        }
        prof_mark(s, PC_NORM);
        /* the post-FFN norm: with the next layer's attention pre-norm where there is one */
        const float *next_norm = l + 1 < c->n_layer ? s->layers[l + 1].attn_norm : NULL;
        normed = L->ffn_post && next_norm;
        if (L->moe) { /* router, top-k and grouping on the device; the chosen experts' weights only */
            const int K = c->n_expert_used, F = c->n_ff_exp;
            if (!moe_step) {
                KC_FATAL(kc_matmul_xq(&L->router, s->h, &s->xq_h, n_tok, s->rlogits, 0, &s->gws, cs));
                KC_FATAL(kc_moe_route(s->rlogits, n_tok, c->n_expert, K, c->expert_norm, s->ridx, s->rw, s->ecnt, s->eoff, s->elist, cs));
            }
            prof_mark(s, PC_GU);
            /* the SwiGLU in the gate|up GEMV's epilogue, the down GEMV quantizing its own input */
            if (moe_glu) {
                KC_FATAL(kc_moe_gemvq_glu(&L->exp_gu, c->n_expert, &s->xq_h, K, s->ridx, s->ecnt, s->eoff, s->elist, n_tok, K, s->rw,
                                          s->eact, cs));
                prof_mark(s, PC_ACT);
                KC_FATAL(kc_moe_gemvq_f(&L->exp_down, c->n_expert, s->eact, s->ridx, s->ecnt, s->eoff, s->elist, n_tok, K, s->eout, cs));
            } else {
                /* quantized experts: the integer GEMV up to KC_GEMV_MAX_TOK tokens (activations as two-level
                 * int8), then the tensor cores grouped by expert (activations as half) */
                const int mm = n_tok > KC_GEMV_MAX_TOK;
                if (kc_weight_is_quant(L->exp_gu_type) && mm && kc_gemmq_ok(&L->exp_gu)) {
                    kc_xq xv = s->xq_e;
                    xv.qh = NULL; /* the half copy only */
                    KC_FATAL(kc_quantize_x(s->h, n_tok, c->n_embd, &xv, cs));
                    KC_FATAL(kc_moe_gemmq(&L->exp_gu, c->n_expert, xv.xh, K, s->ecnt, s->eoff, s->elist, n_tok, K, s->egu, cs));
                } else if (kc_weight_is_quant(L->exp_gu_type)) { /* the tokens' h as two-level int8 (the norm's when it wrote them) */
                    const kc_xq *xe = &s->xq_h;
                    if (!(n_tok <= s->xq_h.cap_tok && s->xq_h.n == c->n_embd && !s->xq_h.no_ints)) {
                        KC_FATAL(kc_quantize_x(s->h, n_tok, c->n_embd, &s->xq_e, cs));
                        xe = &s->xq_e;
                    }
                    KC_FATAL(kc_moe_gemvq(&L->exp_gu, c->n_expert, xe, K, s->ecnt, s->eoff, s->elist, n_tok, K, s->egu, cs));
                } else {
                    KC_FATAL(kc_moe_gemv((const kc_half *)L->exp_gu.data, c->n_expert, c->n_embd, 2 * F, s->h, K, s->ecnt, s->eoff,
                                         s->elist, n_tok * K, s->egu, cs));
                }
                const int q_dn = kc_weight_is_quant(L->exp_down_type), mm_dn = q_dn && mm && kc_gemmq_ok(&L->exp_down);
                kc_xq xf = s->xq_f; /* what the down projection's path reads: the half copy or the integer blocks */
                if (mm_dn) xf.qh = NULL;
                else xf.xh = NULL;
                KC_FATAL(kc_glu(s->egu, q_dn ? NULL : s->eact, q_dn ? &xf : NULL, n_tok * K, F, c->ffn_act, 1, s->rw, cs));
                prof_mark(s, PC_ACT);
                if (mm_dn)
                    KC_FATAL(kc_moe_gemmq(&L->exp_down, c->n_expert, xf.xh, 1, s->ecnt, s->eoff, s->elist, n_tok, K, s->eout, cs));
                else if (q_dn)
                    KC_FATAL(kc_moe_gemvq(&L->exp_down, c->n_expert, &xf, 1, s->ecnt, s->eoff, s->elist, n_tok, K, s->eout, cs));
                else
                    KC_FATAL(kc_moe_gemv((const kc_half *)L->exp_down.data, c->n_expert, F, c->n_embd, s->eact, 1, s->ecnt, s->eoff,
                                         s->elist, n_tok * K, s->eout, cs));
            }
            if (!L->ffn_post && l + 1 < c->n_layer && c->n_embd % 4 == 0 && c->n_embd <= 32768)
                moe_add = 1; /* x += the experts' sum in the next layer's pre-norm */
            else
                KC_FATAL(kc_moe_combine(s->eout, L->ffn_post ? s->h : s->x, n_tok, K, c->n_embd, !L->ffn_post, cs));
        } else { /* SwiGLU or GeGLU (c->ffn_act) */
            /* the activation also as x's image for down's wgmma tiles where they take it: apart from
             * x_half where it fits, so that gate|up's tiles write it in their epilogue */
            s->xq_a.img_order = kc_matmul_x_order(&L->down, n_tok, &s->gws);
            s->xq_a.img = s->act_img && n_tok <= s->act_img_tok ? s->act_img : s->gws.x_half;
            s->xq_a.img_cap = s->act_img && n_tok <= s->act_img_tok ? s->act_img_cap : s->gws.x_cap;
            float *ly = img_only(&s->xq_a, n_tok, c->n_ff) ? NULL : gy; /* down reads only the image */
            if (s->prof_on && kc_glu_half_use(&L->gu, n_tok, &s->gws)) { /* kc_matmul_glu's two launches, timed apart */
                KC_FATAL(kc_matmul_half_out(&L->gu, s->h, &s->xq_h, n_tok, (kc_half *)s->gu, &s->gws, cs));
                prof_mark(s, PC_GU);
                KC_FATAL(kc_glu_xq_half((const kc_half *)s->gu, ly, &s->xq_a, n_tok, c->n_ff, c->ffn_act, cs));
                prof_mark(s, PC_ACT);
            } else if (s->prof_on) { /* separate kernels: timed one by one (kc_matmul_glu's FP8 choice too) */
                const float *gu_sx = NULL;
                const int raw = L->gu.type == DT_F8_E4M3
                                    ? kc_matmul_f8_raw(&L->gu, s->h, &s->xq_h, n_tok, s->gu, &gu_sx, 0, &s->gws, cs) : 1;
                KC_FATAL(raw < 0 ? raw : 0);
                if (raw) KC_FATAL(kc_matmul_xq(&L->gu, s->h, &s->xq_h, n_tok, s->gu, 0, &s->gws, cs));
                prof_mark(s, PC_GU);
                KC_FATAL(raw ? kc_glu_xq(s->gu, ly, &s->xq_a, n_tok, c->n_ff, c->ffn_act, cs)
                             : kc_glu_xq_scaled(s->gu, (const float *)L->gu.d, gu_sx, ly, &s->xq_a, n_tok, c->n_ff, c->ffn_act, cs));
                prof_mark(s, PC_ACT);
            } else /* one kernel where the F16 GEMV takes the activation (decode steps of F16 models) */
                KC_FATAL(kc_matmul_glu(&L->gu, s->h, &s->xq_h, n_tok, s->gu, ly, &s->xq_a, c->ffn_act, &s->gws, cs));
            s->xq_h.img_tok = 0;
            /* x += act Wdown, or into h for the post-norm; FP8 down past the GEMV: the unit-scale sums into
             * gws.f8_raw where timed faster, added to x by the next layer's attention norm */
            int dn_raw = 1;
            if (!L->ffn_post && l + 1 < c->n_layer && !s->layers[l + 1].moe && f8raw_add_ok(s, &L->down, n_tok))
                dn_raw = kc_matmul_f8_raw(&L->down, s->act, &s->xq_a, n_tok, s->gws.f8_raw, &dn_sx, 1, &s->gws, cs);
            KC_FATAL(dn_raw < 0 ? dn_raw : 0);
            if (dn_raw) {
                dn_sx = NULL;
                KC_FATAL(kc_matmul_xq(&L->down, s->act, &s->xq_a, n_tok, L->ffn_post ? s->h : s->x, !L->ffn_post, &s->gws, cs));
            } else dn_sw = (const float *)L->down.d;
            s->xq_a.img_tok = 0;
        }
        prof_mark(s, PC_DOWN);
        if (normed) /* x += rmsnorm(FFN out), and the next layer's pre-norm, in one launch */
            KC_FATAL(kc_rmsnorm_add_xq(s->x, s->h, L->ffn_post, next_norm, hy, &s->xq_h, n_tok, c->n_embd, c->norm_eps, cs));
        else if (L->ffn_post)
            KC_FATAL(kc_rmsnorm_add(s->x, s->h, L->ffn_post, n_tok, c->n_embd, c->norm_eps, cs));
        if (L->ffn_post) prof_mark(s, PC_NORM);
    }
    KC_FATAL(kc_gather_rows_f32(s->x, d_rows, n_out, c->n_embd, s->last, cs));
    s->xq_h.img_order = st->no_head ? 0 : kc_matmul_x_order(&s->output, n_out, &s->gws);
    KC_FATAL(kc_rmsnorm_xq(s->last, s->out_norm, s->last_n, &s->xq_h, n_out, c->n_embd, c->norm_eps, cs));
    if (!st->no_head) {
        KC_FATAL(kc_matmul_xq(&s->output, s->last_n, &s->xq_h, n_out, s->logits, 0, &s->gws, cs));
        if (c->final_softcap > 0) KC_FATAL(kc_softcap(s->logits, (size_t)n_out * c->n_vocab, c->final_softcap, cs));
    }
    s->xq_h.img_tok = 0; /* no later norm's matmul reads this image (MoE and post-norm models skip kc_rmsnorm_xq) */
    prof_mark(s, PC_HEAD);
}

static void prof_mark(cu_state *s, int cat) {
    if (!s->prof_on) return;
    if (cat < 0) {
        s->prof_n = 0;
    }
    if (s->prof_n >= PROF_MAX_EVENTS) return;
    s->prof_cat[s->prof_n] = cat;
    CU_FATAL(cudaEventRecord(s->prof_ev[s->prof_n++], s->stream));
}

/* After a profiled step: adds each launch's time to its category, decode steps and steps with
 * prefill tokens apart, and the first step of each kind apart from the rest (it pays for the
 * kernels' lazy loading: cuBLAS's first GEMM of a size, for one). */
static void prof_collect(cu_state *s, int pure_decode) {
    const int k = pure_decode ? 0 : 1;
    double *acc = s->prof_cold_seen[k] ? s->prof_ms[k] : s->prof_cold[k];
    for (int i = 1; i < s->prof_n; i++) {
        float ms = 0;
        CU_FATAL(cudaEventElapsedTime(&ms, s->prof_ev[i - 1], s->prof_ev[i]));
        acc[s->prof_cat[i]] += ms;
    }
    if (s->prof_cold_seen[k]) s->prof_steps[k]++;
    s->prof_cold_seen[k] = 1;
}

static void prof_report(cu_state *s) {
    if (!s->prof_on) return;
    for (int k = 0; k < 2; k++) {
        if (!s->prof_cold_seen[k]) continue;
        /* the warm steps; the cold first step alone where it was the only one */
        const int n = s->prof_steps[k] ? s->prof_steps[k] : 1;
        const double *ms = s->prof_steps[k] ? s->prof_ms[k] : s->prof_cold[k];
        double total = 0;
        for (int c = 0; c < PROF_N_CATS; c++) total += ms[c];
        fprintf(stderr, "cuda step breakdown over %d eager %s steps%s (ms per step):", n, k ? "prefill or mixed" : "decode",
                s->prof_steps[k] ? " after the first" : ", the first only (cold)");
        for (int c = 0; c < PROF_N_CATS; c++)
            fprintf(stderr, " %s=%.3f(%.0f%%)", prof_names[c], ms[c] / n, 100 * ms[c] / (total > 0 ? total : 1));
        fprintf(stderr, " total=%.3f\n", total / n);
    }
}

/* Fills the staging area from a batch; padding tokens (n_pad of them) point at the scratch row. */
static void stage_batch(cu_state *s, const ex_batch *b, int n_pad) {
    int32_t *tok = meta_tok(s, s->h_meta), *pos = meta_pos(s, s->h_meta), *seq = meta_seq(s, s->h_meta);
    int32_t *rows = meta_rows(s, s->h_meta), *bt = meta_bt(s, s->h_meta);
    const int mb = s->lim.max_blocks, S = s->lim.max_seqs;
    memcpy(tok, b->tok, (size_t)b->n_tokens * 4);
    memcpy(pos, b->pos, (size_t)b->n_tokens * 4);
    memcpy(seq, b->seq, (size_t)b->n_tokens * 4);
    for (int i = 0; i < n_pad; i++) {
        tok[b->n_tokens + i] = 0;
        pos[b->n_tokens + i] = 0;
        seq[b->n_tokens + i] = S; /* the scratch row */
    }
    for (int q = 0; q < b->n_seqs; q++) {
        memcpy(bt + (size_t)q * mb, b->block_tables + (size_t)q * b->bt_stride, (size_t)b->n_blocks[q] * 4);
        if (s->kv_pool_swa && b->block_tables_swa)
            memcpy(meta_bt_swa(s, s->h_meta) + (size_t)q * mb, b->block_tables_swa + (size_t)q * b->bt_stride,
                   (size_t)b->n_blocks[q] * 4);
        int r = b->seq_out[q];
        if (b->out_all[q])
            for (int j = 0; j < b->seq_len[q]; j++) rows[r + j] = b->seq_start[q] + j;
        else rows[r] = b->seq_start[q] + b->seq_len[q] - 1;
    }
    for (int i = 0; i < n_pad; i++) rows[b->n_out + i] = b->n_tokens + i;
}

static int bucket_of(int n) {
    for (int i = 0; i < N_GRAPH_BUCKETS; i++)
        if (k_buckets[i] >= n) return k_buckets[i];
    return n;
}

/* Tensor-core decode: the splits a launch of n_dec tokens gets (kc_plan_dec_splits). */
static int tc_splits(const cu_state *s, int n_dec) {
    return kc_plan_dec_splits(&s->plan, s->cfg.n_head_kv, n_dec, s->lim.n_ctx);
}

/* Per-head kernel: the splits a step launches: enough for its longest context (the split-K
 * kernel's work and its merge follow the positions, so a launch of more splits gives the same
 * numbers), at least 2 whenever the model's context needs split-K at all, so the per-token path
 * never changes with the batch. With the plan's att_ph_splits each token's splits follow its
 * own position (kc_att_split_len), so the count covers every position up to the longest. */
static int splits_for(const cu_state *s, int max_pos) {
    if (s->n_split <= 1) return 1;
    int need = kc_att_splits_cover(max_pos, s->att_chunk, s->plan.att_ph_splits);
    if (need < 2) need = 2;
    return need < s->n_split ? need : s->n_split;
}

/* Decides how a staged batch's attention runs (fills st) and stages the decode-token list,
 * the prefill tiles and the split size. Sequences of one new token decode; longer ones are
 * cut into tiles of pf_tile_tok tokens, listed by position. n_bucket: the token count launched
 * (a graph's bucket, or the batch's own). */
static void stage_step(cu_state *s, const ex_batch *b, int pure_decode, int n_bucket, cu_step *st) {
    memset(st, 0, sizeof *st);
    st->n_tok = b->n_tokens;
    st->n_out = b->n_out;
    int max_pos = 0;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->pos[i] > max_pos) max_pos = b->pos[i];
    if (!s->att_tc || (pure_decode && n_bucket < s->plan.att_tc_min_tok && max_pos + 1 < s->plan.att_tc_long_ctx)) {
        st->per_head = 1;
        st->kv_ready = b->n_tokens == b->n_seqs; /* each sequence brings one token */
        st->n_split = splits_for(s, max_pos);
        return;
    }
    int32_t *dt = meta_dtoks(s, s->h_meta), *tiles = meta_tiles(s, s->h_meta);
    for (int q = 0; q < b->n_seqs; q++) {
        if (b->seq_len[q] == 1) {
            dt[st->n_dec++] = b->seq_start[q];
            continue;
        }
        for (int j = 0; j < b->seq_len[q]; j += s->pf_tile_tok) {
            tiles[2 * st->n_tiles] = b->seq_start[q] + j;
            tiles[2 * st->n_tiles + 1] = b->seq_len[q] - j < s->pf_tile_tok ? b->seq_len[q] - j : s->pf_tile_tok;
            st->n_tiles++;
        }
    }
    st->dec_all = pure_decode;
    st->pf_split = 1;
    st->pf_split_fa3 = 0;
    st->pf_warps = s->pf_fa3 ? 8 : s->plan.att_pf_warps; /* the split kernel's CTAs: tiles of pf_tile_tok */
    /* few tiles over a long context (a chunk of a long prompt) split their keys: on the wgmma
     * kernel where whole prompts go to it and the plan says so, else on the mma.sync kernel
     * (the wgmma kernel's tiles are the 8-warp kernel's) */
    if (st->n_tiles && s->pf_fa3 && s->plan.att_pf_fa3_ctas > 0) {
        st->pf_split = kc_plan_pf_splits_fa3(&s->plan, s->cfg.n_head_kv, st->n_tiles, max_pos, &st->pf_kchunk);
        st->pf_split_fa3 = st->pf_split > 1;
    } else if (st->n_tiles)
        st->pf_split = kc_plan_pf_splits(&s->plan, s->cfg.n_head_kv, st->n_tiles, max_pos, &st->pf_kchunk);
    /* chunks that each fit a tile of the plan's att_pf_split_warps (F16 cache): the same tiles on
     * CTAs of that many warps (a 16-token chunk leaves half an 8-warp CTA's warps idle) */
    const int stt = kc_attention_tc_tile_tok(s->plan.att_pf_split_warps, s->cfg.n_head, s->cfg.n_head_kv);
    int fits = st->pf_split > 1 && !st->pf_split_fa3 && !s->kv_f8 && stt > 0;
    for (int q = 0; fits && q < b->n_seqs; q++) fits = b->seq_len[q] <= stt;
    if (fits) st->pf_warps = s->plan.att_pf_split_warps;
    /* FP8 cache, unsplit prefill tiles (alone or beside decode tokens, which keep reading the
     * FP8 cache): the tiles' sequences' blocks copied to F16 for the wgmma kernel (the plan's
     * att_pf_f8_fa3) where the copy holds them */
    if (s->f8sh_cap && st->n_tiles && st->pf_split <= 1) {
        int32_t *pairs = s->h_f8sh, *sbt = s->h_f8sh + 2 * (size_t)s->f8sh_cap;
        const int mb = s->lim.max_blocks, bs = s->lim.block_size;
        int n = 0, fits = 1;
        for (int q = 0; q < b->n_seqs && fits; q++) {
            if (b->seq_len[q] == 1) continue; /* a decode token: no tile reads the copy's row */
            const int nb = b->pos[b->seq_start[q] + b->seq_len[q] - 1] / bs + 1;
            if (n + nb > s->f8sh_cap || nb > b->n_blocks[q]) fits = 0;
            for (int j = 0; fits && j < nb; j++, n++) {
                pairs[2 * n] = b->block_tables[(size_t)q * b->bt_stride + j];
                pairs[2 * n + 1] = n;
                sbt[(size_t)q * mb + j] = n;
            }
        }
        if (fits) {
            st->f8sh_pairs = n;
            st->f8sh_ints = 2 * (size_t)s->f8sh_cap + (size_t)b->n_seqs * mb;
        }
    }
    const int nd = pure_decode ? n_bucket : st->n_dec;
    st->n_split = st->n_dec ? tc_splits(s, nd) : 1;
    *meta_chunk(s, s->h_meta) = kc_plan_dec_chunk(&s->plan, s->cfg.n_head_kv, nd > 0 ? nd : 1, st->n_split, max_pos);
}

/* Enqueues the forward pass of a checked batch (a decode graph when one fits, else eager),
 * leaving its logits rows in s->logits. Returns whether it was a pure decode step. */
static void trace_begin(cu_state *s);

static int launch_forward(cu_state *s, const ex_batch *b, int no_head) {
    int pure_decode = b->n_tokens == b->n_seqs && b->n_out == b->n_seqs;
    if (s->fault_at && ++s->n_steps == s->fault_at) { /* testing the fatal path: the step's sync fails */
        CM_LOG_WARN("cuda", "injecting a device fault (--cuda-fault-at-step)", "step=%lld", (long long)s->n_steps);
        KC_FATAL(kc_fault(s->stream));
    }
    const int bk = pure_decode ? bucket_of(b->n_tokens) : b->n_tokens;
    cu_step st;
    stage_step(s, b, pure_decode, bk, &st);
    st.no_head = no_head;
    cu_graph *g = NULL;
    if (pure_decode && !no_head) /* the bucket's graph; per-head kernel: the one with the fewest splits that cover the step */
        for (int i = 0; i < s->n_graphs; i++) {
            cu_graph *c = &s->graphs[i];
            if (c->n_tok != bk || c->tc == st.per_head) continue;
            if (c->tc ? c->n_split == st.n_split : c->n_split >= st.n_split && (!g || c->n_split < g->n_split)) g = c;
        }
    if (g && !s->prof_on) {
        stage_batch(s, b, g->n_tok - b->n_tokens);
        if (s->tr_at && ++s->tr_replays == s->tr_at) trace_begin(s);
        if (s->gt_on) CU_FATAL(cudaEventRecord(s->gt_ev[0], s->stream));
        CU_FATAL(cudaGraphLaunch(g->exec, s->stream));
        if (s->gt_on) CU_FATAL(cudaEventRecord(s->gt_ev[1], s->stream));
        s->gt_pending = s->gt_on;
    } else {
        stage_batch(s, b, 0);
        enqueue_forward(s, &st);
    }
    return pure_decode;
}

#define TRACE_CAP (1u << 20)

static void trace_begin(cu_state *s) {
    int rc = kc_trace_begin(TRACE_CAP);
    if (rc) CM_LOG_WARN("cuda", "step trace unavailable (a build without -DARKA_CUDA_TRACE=ON?)", "rc=%d", rc);
    s->tr_pending = rc == 0;
}

/* After the traced step: its records as CSV (kind,sm,cta,n_warps,t_entry,t_wait,t_end in ns). */
static void trace_write(cu_state *s) {
    if (!s->tr_pending) return;
    s->tr_pending = 0;
    kc_trace_rec *r = malloc(TRACE_CAP * sizeof *r);
    unsigned n = 0;
    if (!r || kc_trace_end(r, TRACE_CAP, &n)) {
        free(r);
        CM_LOG_WARN("cuda", "step trace: reading the records failed", "records=%u", n);
        return;
    }
    const char *path = s->tr_file;
    FILE *f = fopen(path, "w");
    if (!f) {
        free(r);
        CM_LOG_WARN("cuda", "step trace: cannot write the file", "path=%s", path);
        return;
    }
    fprintf(f, "kind,sm,cta,n_warps,t_entry,t_wait,t_end\n");
    for (unsigned i = 0; i < n && i < TRACE_CAP; i++)
        fprintf(f, "%u,%u,%u,%u,%llu,%llu,%llu\n", r[i].kind, r[i].sm, r[i].cta, r[i].n_warps, r[i].t_entry, r[i].t_wait,
                r[i].t_end);
    fclose(f);
    CM_LOG_INFO("cuda", "step trace written", "path=%s ctas=%u replay=%d", path, n, s->tr_at);
    free(r);
}

static void graph_timing_collect(cu_state *s) {
    if (!s->gt_pending) return;
    float ms = 0;
    CU_FATAL(cudaEventElapsedTime(&ms, s->gt_ev[0], s->gt_ev[1]));
    s->gt_ms += ms;
    s->gt_n++;
    s->gt_pending = 0;
}

static int cuda_forward(ex_backend *base, const ex_batch *b, const float **logits) {
    cu_state *s = base->impl;
    int pure_decode = launch_forward(s, b, 0);
    CU_FATAL(cudaMemcpyAsync(s->h_logits, s->logits, (size_t)b->n_out * s->cfg.n_vocab * sizeof(float), cudaMemcpyDeviceToHost,
                             s->stream));
    prof_mark(s, PC_COPY);
    CU_FATAL(cudaStreamSynchronize(s->stream));
    if (s->prof_on) prof_collect(s, pure_decode);
    graph_timing_collect(s);
    trace_write(s);
    *logits = s->h_logits;
    return 0;
}

/* The hidden states after the final norm of the batch's output rows (embeddings): the forward
 * pass without the head, eager. */
static int cuda_forward_hidden(ex_backend *base, const ex_batch *b, const float **hidden) {
    cu_state *s = base->impl;
    launch_forward(s, b, 1);
    CU_FATAL(cudaMemcpyAsync(s->h_hidden, s->last_n, (size_t)b->n_out * s->cfg.n_embd * sizeof(float), cudaMemcpyDeviceToHost,
                             s->stream));
    CU_FATAL(cudaStreamSynchronize(s->stream));
    *hidden = s->h_hidden;
    return 0;
}

/* Forward, then the sampler on the device: the packed rows go up in one copy, kc_sample
 * rewrites their logits rows in place and only the per-row results come back. Rows beyond
 * the device sampler's limits make the step CM_EUNSUPPORTED before anything runs. */
static int cuda_forward_sample(ex_backend *base, const ex_batch *b, const ex_sample_row *rows, int n_rows, ex_sample_out *out) {
    cu_state *s = base->impl;
    int n_dev;
    size_t bytes;
    int rc = ex__cuda_sample_stage(s->h_samp, s->lim.max_out, s->cfg.n_vocab, b->n_out, rows, n_rows, s->samp_mark,
                                   s->samp_slot, &n_dev, &bytes);
    if (rc) return rc;
    int pure_decode = launch_forward(s, b, 0);
    if (n_dev) {
        CU_FATAL(cudaMemcpyAsync(s->d_samp, s->h_samp, bytes, cudaMemcpyHostToDevice, s->stream));
        KC_FATAL(kc_sample(s->logits, s->cfg.n_vocab, s->cfg.n_vocab, s->d_samp, n_dev, s->d_sout, s->stream));
        CU_FATAL(cudaMemcpyAsync(s->h_sout, s->d_sout, (size_t)n_dev * sizeof *s->h_sout, cudaMemcpyDeviceToHost, s->stream));
    }
    prof_mark(s, PC_SAMPLE);
    CU_FATAL(cudaStreamSynchronize(s->stream));
    if (s->prof_on) prof_collect(s, pure_decode);
    graph_timing_collect(s);
    trace_write(s);
    for (int r = 0; r < n_rows; r++) {
        if (s->samp_slot[r] >= 0) ex__cuda_sample_out(&s->h_sout[s->samp_slot[r]], &out[r]);
        else {
            memset(&out[r], 0, sizeof out[r]);
            out[r].token = -1;
        }
    }
    return 0;
}

static int cuda_kv_copy(ex_backend *base, int32_t src, int32_t dst, int n_tok) {
    cu_state *s = base->impl;
    const mdl_config *c = &s->cfg;
    if (src < 0 || dst < 0 || src >= s->lim.n_kv_blocks || dst >= s->lim.n_kv_blocks || n_tok < 0 || n_tok > s->lim.block_size)
        return CM_EINVAL;
    const size_t blk = s->kv_blk_bytes; /* the whole block (F16: heads outermost; FP8: codes and scales) */
    for (int l = 0; l < c->n_layer; l++) {
        cu_layer *L = &s->layers[l];
        if (L->swa) continue; /* block ids of the main pool: the full-attention layers only */
        CU_FATAL(cudaMemcpyAsync((char *)L->k + dst * blk, (char *)L->k + src * blk, blk, cudaMemcpyDeviceToDevice, s->stream));
        CU_FATAL(cudaMemcpyAsync((char *)L->v + dst * blk, (char *)L->v + src * blk, blk, cudaMemcpyDeviceToDevice, s->stream));
    }
    CU_FATAL(cudaStreamSynchronize(s->stream));
    return 0;
}

static void free_weight(kc_weight *w) {
    cudaFree(w->data);
    cudaFree(w->d);
}

static void cuda_destroy(ex_backend *base) {
    if (!base) return;
    cu_state *s = base->impl;
    if (!s) return;
    prof_report(s);
    if (s->gt_on) {
        if (s->gt_n) fprintf(stderr, "cuda graph replays: %d, device time %.4f ms per replay\n", s->gt_n, s->gt_ms / s->gt_n);
        cudaEventDestroy(s->gt_ev[0]);
        cudaEventDestroy(s->gt_ev[1]);
    }
    for (int i = 0; i < s->prof_n_created; i++) cudaEventDestroy(s->prof_ev[i]);
    for (int i = 0; i < s->n_graphs; i++) cudaGraphExecDestroy(s->graphs[i].exec);
    if (s->layers)
        for (int l = 0; l < s->cfg.n_layer; l++) {
            cu_layer *L = &s->layers[l];
            free_weight(&L->qkv);
            free_weight(&L->wo);
            free_weight(&L->gu);
            free_weight(&L->down);
            cudaFree(L->attn_norm);
            cudaFree(L->ffn_norm);
            cudaFree(L->bqkv);
            cudaFree(L->k_scale);
            cudaFree(L->v_scale);
            float *fs[] = { L->q_norm, L->k_norm, L->attn_post, L->ffn_post };
            for (int i = 0; i < 4; i++) cudaFree(fs[i]);
            free_weight(&L->router);
            free_weight(&L->exp_gu);
            free_weight(&L->exp_down);
        }
    free(s->layers);
    free_weight(&s->tok_embd);
    if (s->output.data != s->tok_embd.data) free_weight(&s->output);
    cudaFree(s->out_norm);
    cudaFree(s->kv_pool);
    cudaFree(s->kv_pool_swa);
    cudaFree(s->rope_freq);
    cudaFree(s->rope_freq_swa);
    void *moe_bufs[] = { s->rlogits, s->rw, s->egu, s->eact, s->eout, s->ridx, s->ecnt, s->eoff, s->elist, s->route_ctr };
    for (size_t i = 0; i < sizeof moe_bufs / sizeof *moe_bufs; i++) cudaFree(moe_bufs[i]);
    void *bufs[] = { s->x, s->h, s->qkv, s->q, s->att, s->gu, s->act, s->last, s->last_n, s->logits, s->partial,
                     s->gws.w_half, s->gws.x_half, s->d_meta, s->cublas_ws, s->xq_h.qh, s->xq_a.qh, s->xq_o.qh, s->gws.xq.qh, s->xq_e.qh, s->xq_f.qh,
                     s->att_counters, s->qkv_ctr, s->pf_partial, s->pf_counters, s->d_samp, s->d_sout, s->act_img };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
    cudaFreeHost(s->h_meta);
    cudaFreeHost(s->h_f8sh);
    cudaFree(s->d_f8sh);
    cudaFree(s->f8sh_k);
    cudaFree(s->f8sh_v);
    cudaFreeHost(s->h_logits);
    cudaFreeHost(s->h_hidden);
    cudaFreeHost(s->h_samp);
    cudaFreeHost(s->h_sout);
    free(s->samp_mark);
    free(s->samp_slot);
    cudaFree(s->gws.x_scale);
    cudaFree(s->gws.f8_raw);
    if (s->gws.cublaslt) cublasLtDestroy((cublasLtHandle_t)s->gws.cublaslt);
    if (s->cublas) cublasDestroy(s->cublas);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
}

/* The scratch sequence's block-table row (padding tokens write there): every entry the
 * scratch block. stage_batch writes only the batch's rows, so it survives every staging. */
static void stage_scratch_row(cu_state *s) {
    int32_t *bt = meta_bt(s, s->h_meta);
    for (int j = 0; j < s->lim.max_blocks; j++) bt[(size_t)s->lim.max_seqs * s->lim.max_blocks + j] = s->scratch_block;
    bt = meta_bt_swa(s, s->h_meta);
    for (int j = 0; j < s->lim.max_blocks; j++) bt[(size_t)s->lim.max_seqs * s->lim.max_blocks + j] = s->scratch_block_swa;
}

/* Captures one graph of a decode step of bk padding tokens (run once eagerly first: cuBLAS
 * picks its kernels). */
static int capture_one(cu_state *s, const cu_step *st, char *err, size_t errlen) {
    enqueue_forward(s, st);
    cudaError_t e = cudaStreamSynchronize(s->stream);
    cudaGraph_t graph;
    if (e == cudaSuccess) e = cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        enqueue_forward(s, st);
        e = cudaStreamEndCapture(s->stream, &graph);
    }
    if (e == cudaSuccess) {
        e = cudaGraphInstantiate(&s->graphs[s->n_graphs].exec, graph, 0);
        cudaGraphDestroy(graph);
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: capturing the decode graph for %d tokens, %d splits failed: %s", st->n_tok,
                 st->n_split, cudaGetErrorString(e));
        return CM_ECUDA;
    }
    cu_graph *g = &s->graphs[s->n_graphs++];
    g->n_tok = st->n_tok;
    g->n_split = st->n_split;
    g->tc = !st->per_head;
    return 0;
}

/* Captures decode graphs, smallest bucket first, up to max_seqs (and max_tokens, max_out, the
 * plan's graph_max_tok): one per bucket on the tensor-core kernel (its split size is staged per
 * step), or, on the per-head kernel, one per split bucket, until budget_s seconds have passed
 * (checked before each capture, so the last one may end a little past it). A step whose
 * bucket was left out runs eagerly: launch_forward looks its graph up and runs without one
 * when there is none. */
static int capture_graphs(cu_state *s, double budget_s, char *err, size_t errlen) {
    double t0 = cm_time_s();
    int n_planned = 0, skip_tok = 0, skip_split = 0, rc;
    /* Stage a harmless batch: every token a padding token on the scratch row. */
    int32_t *seq = meta_seq(s, s->h_meta), *rows = meta_rows(s, s->h_meta);
    *meta_chunk(s, s->h_meta) = 64;
    for (int i = 0; i < N_GRAPH_BUCKETS; i++) {
        const int bk = k_buckets[i];
        if (bk > s->lim.max_seqs || bk > s->lim.max_tokens || bk > s->lim.max_out || bk > s->plan.graph_max_tok) break;
        for (int t = 0; t < bk; t++) {
            seq[t] = s->lim.max_seqs;
            rows[t] = t;
        }
        cu_step st = { .n_tok = bk, .n_out = bk };
        if (s->att_tc) { /* the tensor-core kernel: one graph, any context */
            st.n_dec = bk;
            st.dec_all = 1;
            st.n_split = tc_splits(s, bk);
            n_planned++;
            if (!skip_tok && cm_time_s() - t0 >= budget_s) skip_tok = bk, skip_split = st.n_split;
            if (!skip_tok && (rc = capture_one(s, &st, err, errlen))) return rc;
            if (bk >= s->plan.att_tc_min_tok) continue;
            st = (cu_step){ .n_tok = bk, .n_out = bk };
        }
        /* the per-head kernel (small buckets at short contexts, or every bucket without the
         * tensor-core kernel): split buckets 2, 4, 8, ... and the last count it can see (the
         * context's, or the short-context limit's) */
        const int ph_split = s->att_tc ? kc_att_splits_cover(s->plan.att_tc_long_ctx - 1, s->att_chunk, s->plan.att_ph_splits)
                                       : s->n_split;
        const int last_sp = ph_split < s->n_split ? ph_split : s->n_split;
        st.per_head = st.kv_ready = 1;
        for (int sp = last_sp <= 1 ? 1 : 2, j = 0; j < N_SPLIT_BUCKETS; sp = sp * 2 < last_sp ? sp * 2 : last_sp, j++) {
            st.n_split = sp;
            n_planned++;
            if (!skip_tok && cm_time_s() - t0 >= budget_s) skip_tok = bk, skip_split = sp;
            if (!skip_tok && (rc = capture_one(s, &st, err, errlen))) return rc;
            if (sp >= last_sp) break;
        }
    }
    memset(s->h_meta, 0, s->meta_ints * sizeof(int32_t));
    stage_scratch_row(s);
    const cu_graph *last = s->n_graphs ? &s->graphs[s->n_graphs - 1] : NULL;
    if (!skip_tok)
        CM_LOG_INFO("cuda", "decode graphs captured", "graphs=%d largest=%d splits=%d seconds=%.2f budget_s=%g", s->n_graphs,
                    last ? last->n_tok : 0, last ? last->n_split : 0, cm_time_s() - t0, budget_s);
    else
        CM_LOG_WARN("cuda", "decode graph budget spent: the buckets left run eagerly (raise --cuda-graph-budget-s)",
                    "graphs=%d planned=%d skipped=%d last_tokens=%d last_splits=%d first_skipped_tokens=%d "
                    "first_skipped_splits=%d seconds=%.2f budget_s=%g", s->n_graphs, n_planned, n_planned - s->n_graphs,
                    last ? last->n_tok : 0, last ? last->n_split : 0, skip_tok, skip_split, cm_time_s() - t0, budget_s);
    return 0;
}

/* cudaMalloc of at least one byte; returns nonzero on failure. */
static int dalloc(void *pp, size_t bytes) {
    return cudaMalloc((void **)pp, bytes ? bytes : 1) != cudaSuccess;
}

/* Two-level int8 activations of cap_tok rows of cap_n values (kcuda.h's kc_xq) in one buffer:
 * qh, ql, the block pairs, then (half: 1) the half copy. */
static int xq_alloc(kc_xq *q, size_t cap_tok, int cap_n, int half) {
    const size_t n = cap_tok * (size_t)cap_n, off_m = (2 * n + 15) & ~(size_t)15, off_h = (off_m + n / 32 * 8 + 15) & ~(size_t)15;
    int8_t *buf;
    if (dalloc(&buf, half ? off_h + 2 * n : off_h)) return 1;
    q->qh = buf;
    q->ql = buf + n;
    q->m = (int32_t *)(buf + off_m);
    q->xh = half ? (kc_half *)(buf + off_h) : NULL;
    q->cap_tok = (int)cap_tok;
    q->cap_n = cap_n;
    q->n = 0;
    q->no_ints = 0;
    return 0;
}

/* Sizes and allocates the KV pool, after everything else (see the top of the file). free0 and
 * total: the device's free and total memory when the backend started. Sets s->lim.n_kv_blocks
 * when the engine left it 0. Returns 0, CM_ENOKV (the fraction leaves less than one sequence
 * of n_ctx) or CM_ENOMEM (the pool does not fit), with the numbers and the flag to change in err. */
static int alloc_kv_pool(cu_state *s, const ex_backend_opts *o, const struct cudaDeviceProp *prop, size_t free0, size_t total,
                         char *err, size_t errlen) {
    const mdl_config *c = &s->cfg;
    const ex_limits *L = &s->lim;
    size_t per_block = s->kv_blk_bytes;                                      /* bytes per block, one layer's K or V */
    /* the full-attention layers' pool and the sliding-window layers' (executor/kv.h) */
    const int n_swa_l = c->n_layer_swa, n_full_l = c->n_layer - n_swa_l;
    const size_t fbytes = per_block * 2 * (size_t)n_full_l, sbytes = per_block * 2 * (size_t)n_swa_l;
    size_t bbytes = fbytes + sbytes;                                          /* one block of each: every layer's K and V */
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    int64_t used = (int64_t)free0 - (int64_t)free1;  /* weights, activations, workspaces */
    int64_t budget = 0;
    int64_t fit = ex_kv_fit_blocks((int64_t)total, (int64_t)free0, used, o->mem_fraction, (int64_t)bbytes, 1, &budget);
    int capped = 0, exact = L->n_kv_blocks > 0;
    if (!exact) {
        /* floor: one sequence of n_ctx positions (a smaller pool could never hold a full
         * request); cap: every sequence at full context (no prefix cache keeps freed blocks,
         * so more could never be used) */
        int64_t min = L->max_blocks > 2 ? L->max_blocks : 2, cap = (int64_t)L->max_seqs * L->max_blocks;
        if (fit < min) {
            snprintf(err, errlen, "cuda backend: --gpu-memory-fraction %g of device %d (%s, %.2f GiB) leaves %.3f GiB for the KV pool "
                     "after %.2f GiB in use at start-up and %.2f GiB of weights, activations and workspaces; one sequence "
                     "of %d positions (--ctx) needs %lld blocks = %.3f GiB: raise --gpu-memory-fraction or lower --ctx",
                     o->mem_fraction, o->device, prop->name, total / GIB, budget / GIB, (total - free0) / GIB, used / GIB, L->n_ctx,
                     (long long)min, min * (double)bbytes / GIB);
            return CM_ENOKV;
        }
        capped = fit > cap;
        s->lim.n_kv_blocks = (int)(capped ? cap : fit > (1 << 30) ? (1 << 30) : fit);
        if (n_swa_l) {
            /* the engine's rule (executor/engine.c): the sliding pool holds one whole context and a
             * window and a step's tokens for every other sequence; the full pool gets the rest
             * (every layer sliding: the full pool is bookkeeping only, as large as can be used) */
            int64_t per = (L->swa_window + L->max_tokens + L->block_size - 1) / L->block_size + 1;
            int64_t cap_s = L->max_blocks + (int64_t)L->max_seqs * per, nb = fit, ns;
            if (cap_s > cap) cap_s = cap;
            if (!n_full_l) {
                ns = budget / (int64_t)sbytes - 1;
                if (ns > cap_s) ns = cap_s;
                nb = cap;
            } else if (nb > cap_s) {
                nb = (budget - (cap_s + 1) * (int64_t)sbytes) / (int64_t)fbytes - 1;
                ns = cap_s;
            } else ns = nb;
            if (nb > cap) nb = cap;
            capped = nb >= cap;
            s->lim.n_kv_blocks = (int)(nb > (1 << 30) ? (1 << 30) : nb);
            s->lim.n_kv_blocks_swa = (int)(ns > (1 << 30) ? (1 << 30) : ns);
        }
    }
    if (!n_swa_l) s->lim.n_kv_blocks_swa = 0;
    else if (s->lim.n_kv_blocks_swa < 2) {
        snprintf(err, errlen, "cuda backend: the sliding-window layers' KV pool would get %d blocks (%s)", s->lim.n_kv_blocks_swa,
                 exact ? "the engine gave no size for it" : "raise --gpu-memory-fraction");
        return CM_ENOKV;
    }
    size_t bytes = (size_t)(L->n_kv_blocks + 1) * fbytes, bytes_swa = (size_t)(L->n_kv_blocks_swa + 1) * sbytes;
    if (bytes + bytes_swa > free1 || (bytes && cudaMalloc(&s->kv_pool, bytes) != cudaSuccess) ||
        (bytes_swa && cudaMalloc(&s->kv_pool_swa, bytes_swa) != cudaSuccess)) {
        cudaGetLastError(); /* clear the allocation error */
        snprintf(err, errlen, "cuda backend: the KV pool of %d blocks needs %.2f GiB, %.2f GiB free on device %d (%s) after %.2f GiB "
                 "of weights, activations and workspaces%s", L->n_kv_blocks, bytes / GIB, free1 / GIB, o->device, prop->name, used / GIB,
                 exact ? ": lower --kv-cache-mb (0 sizes it from --gpu-memory-fraction)" : "");
        return CM_ENOMEM;
    }
    if (bytes) cudaMemset(s->kv_pool, 0, bytes);
    if (bytes_swa) cudaMemset(s->kv_pool_swa, 0, bytes_swa);
    for (int l = 0, full = 0, sl = 0; l < c->n_layer; l++) {
        cu_layer *ly = &s->layers[l];
        const size_t nb = (size_t)(ly->swa ? L->n_kv_blocks_swa : L->n_kv_blocks) + 1;
        ly->k = (kc_half *)((char *)(ly->swa ? s->kv_pool_swa : s->kv_pool) + (size_t)2 * (ly->swa ? sl++ : full++) * per_block * nb);
        ly->v = (kc_half *)((char *)ly->k + per_block * nb);
    }
    CM_LOG_INFO("cuda", "KV pool", "device=%d sizing=%s fraction=%.2f total_gib=%.2f in_use_at_start_gib=%.2f weights_gib=%.2f "
                "workspaces_gib=%.2f budget_gib=%.2f kv_gib=%.3f blocks=%d tokens=%lld capped=%d swa_blocks=%d", o->device,
                exact ? "exact" : "fraction", o->mem_fraction, total / GIB, (total - free0) / GIB, s->weight_bytes / GIB,
                (used - (int64_t)s->weight_bytes) / GIB, budget / GIB, (bytes + bytes_swa) / GIB, L->n_kv_blocks,
                (long long)L->n_kv_blocks * L->block_size, capped, L->n_kv_blocks_swa);
    return 0;
}

int ex_backend_cuda_defaults(int device, const mdl_config *c, int *max_seqs, int *max_tokens) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return CM_ECUDA;
    }
    /* sequences: 256 (vLLM's default on an H100), 512 on GPUs of 100 GB and more */
    *max_seqs = prop.totalGlobalMem >= ((size_t)100 << 30) ? 512 : 256;
    /* tokens: a step's prefill chunk about 50 ms of matrix work (2 x parameters FLOPs a token
     * at ~4 TFLOP/s per SM), so decodes sharing the step keep their inter-token time; a power of
     * two in [512, 8192], at least max_seqs (llama3-8b on an H200: 2048) */
    double params = (double)c->n_layer * ((double)c->n_embd * (c->n_head + 2 * c->n_head_kv) * c->head_dim +
                                          (double)c->n_head * c->head_dim * c->n_embd + 3.0 * c->n_embd * c->n_ff);
    double tok = 0.05 * 4e12 * prop.multiProcessorCount / (2 * (params > 1 ? params : 1));
    int t = 512;
    while (t < 8192 && 2 * t <= tok) t *= 2;
    *max_tokens = t < *max_seqs ? *max_seqs : t;
    return 0;
}

int ex_backend_cuda_create(const mdl_model *m, const ex_backend_opts *o, ex_backend **out, char *err, size_t errlen) {
    *out = NULL;
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0) {
        snprintf(err, errlen, "cuda backend: no usable CUDA device (%s)", ce != cudaSuccess ? cudaGetErrorString(ce) : "none found");
        return CM_EUNSUPPORTED;
    }
    if (o->device < 0 || o->device >= n_dev) {
        snprintf(err, errlen, "cuda backend: device %d requested, %d present", o->device, n_dev);
        return CM_EINVAL;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, o->device);
    if (prop.major < 8) {
        snprintf(err, errlen, "cuda backend: device %d (%s) has compute capability %d.%d; 8.0 or newer is needed", o->device,
                 prop.name, prop.major, prop.minor);
        return CM_EUNSUPPORTED;
    }
    const mdl_config *c = &m->cfg;
    if (c->head_dim % 8 || c->head_dim > 256 || ((c->head_dim & (c->head_dim - 1)) && c->head_dim != 96)) {
        snprintf(err, errlen, "cuda backend: head_dim %d is not supported (powers of two from 8 to 256, and 96)", c->head_dim);
        return CM_EUNSUPPORTED;
    }
    cu_state *s = calloc(1, sizeof *s);
    if (!s) return CM_ENOMEM;
    s->cfg = *c;
    s->lim = o->lim;
    s->device = o->device;
    s->fault_at = o->cuda.fault_at_step;
    s->qkv_dim = (c->n_head + 2 * c->n_head_kv) * c->head_dim;
    s->rope = (kc_rope){ .layout = c->rope_layout, .rope_dim = c->rope_dim, .base = c->rope_base, .scaling = c->rope_scaling,
                         .factor = c->rope_factor, .low_freq_factor = c->rope_low_freq_factor,
                         .high_freq_factor = c->rope_high_freq_factor, .orig_ctx = c->rope_orig_ctx };
    s->rope_swa = s->rope;
    s->base.name = "cuda";
    /* FP8 KV: E4M3 codes and f32 scales per (position, head), the CPU's layout; blocks of an
     * even number of head rows keep every row's codes 8-byte aligned */
    s->kv_f8 = o->kv_type == DT_F8_E4M3 && s->lim.block_size % 2 == 0;
    s->kv_blk_bytes = s->kv_f8 ? (size_t)c->n_head_kv * s->lim.block_size * (c->head_dim + 4)
                               : (size_t)c->n_head_kv * s->lim.block_size * c->head_dim * 2;
    s->base.kv_type = s->kv_f8 ? DT_F8_E4M3 : DT_F16;
    /* model.h's features this backend implements: every one (F8_E4M3 matrices: fp8.cu, or F16 at
     * upload before sm_89) */
    s->base.features = MDL_FEAT_QK_NORM | MDL_FEAT_POST_NORM | MDL_FEAT_MOE | MDL_FEAT_SWA | MDL_FEAT_ATTN_SOFTCAP |
                       MDL_FEAT_FINAL_SOFTCAP | MDL_FEAT_GELU | MDL_FEAT_EMBD_SCALE | MDL_FEAT_ATTN_SCALE | MDL_FEAT_ROPE_YARN |
                       MDL_FEAT_ROPE_LONGROPE | MDL_FEAT_ROPE_SWA_BASE | MDL_FEAT_ROPE_PARTIAL | MDL_FEAT_HEAD_DIM |
                       MDL_FEAT_ROPE_ATTN | MDL_FEAT_FP8;
    s->base.forward = cuda_forward;
    s->base.forward_sample = cuda_forward_sample;
    s->base.forward_hidden = cuda_forward_hidden;
    s->base.sample_caps = EX_SAMPLE_CAP_MASK; /* token masks applied in kc_sample */
    s->base.kv_copy = cuda_kv_copy;
    s->base.destroy = cuda_destroy;
    s->base.impl = s;
    int rc = CM_ENOMEM;
    double t0 = cm_time_s();

    if (cudaSetDevice(o->device) != cudaSuccess || cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&s->cublas) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuda backend: cannot initialise device %d", o->device);
        rc = CM_ECUDA;
        goto fail;
    }
    {
        int arch = 0;
        if (!kc_code_for_device(&arch)) {
            snprintf(err, errlen, "cuda backend: this build has no GPU code for device %d (%s, compute capability %d.%d): "
                     "rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d", o->device, prop.name, prop.major, prop.minor, prop.major,
                     prop.minor);
            rc = CM_EUNSUPPORTED;
            goto fail;
        }
    }
    /* the kernel plan: from the device and the model, then the overrides; installed for the
     * launchers before anything is launched */
    if (errlen) err[0] = 0;
    if (kc_plan_choose(o->device, c->head_dim, c->n_head, c->n_head_kv, s->lim.block_size, c->n_expert, &s->plan) ||
        kc_plan_override(&s->plan, o->cuda.plan, err, errlen)) {
        if (!err[0]) snprintf(err, errlen, "cuda backend: cannot read the properties of device %d", o->device);
        rc = CM_EINVAL;
        goto fail;
    }
    if (s->plan.att_tc && !kc_attention_tc_ok(c->head_dim, c->n_head, c->n_head_kv, s->lim.block_size)) {
        snprintf(err, errlen, "--cuda-plan att_tc=1: the tensor-core attention does not take this model (head dim %d, %d query "
                 "heads per KV head, KV block size %d; it needs 64 or 128, at most 16, a multiple of 16)", c->head_dim,
                 c->n_head / c->n_head_kv, s->lim.block_size);
        rc = CM_EINVAL;
        goto fail;
    }
    kc_plan_set(&s->plan);
    {
        char line[512];
        kc_plan_format(&s->plan, line, sizeof line);
        CM_LOG_INFO("cuda", "kernel plan", "device=%d name=\"%s\" sms=%d %s", o->device, prop.name, prop.multiProcessorCount, line);
    }
    s->att_tc = s->plan.att_tc;
    s->att_chunk = s->plan.att_chunk;
    s->n_split = kc_att_splits_cover(s->lim.n_ctx - 1, s->att_chunk, s->plan.att_ph_splits);
    s->pf_tile_tok = s->att_tc ? kc_attention_tc_tile_tok(s->plan.att_pf_warps, c->n_head, c->n_head_kv) : 0;
    /* the wgmma prefill kernel (att_prefill_f16 makes the same choice) takes tiles of 128 rows */
    if (s->att_tc && s->plan.att_pf_fa3 && !s->kv_f8 &&
        kc_attention_fa3_ok(c->head_dim, c->n_head, c->n_head_kv, s->lim.block_size)) {
        s->pf_tile_tok = kc_attention_fa3_tile_tok(c->n_head, c->n_head_kv);
        s->pf_fa3 = s->plan.att_pf_fa3;
    } else if (s->plan.att_pf_fa3)
        CM_LOG_INFO("cuda", "att_pf_fa3: prefill stays on the mma.sync kernel", "reason=\"%s\"",
                    !s->att_tc ? "att_tc=0" : s->kv_f8 ? "FP8 KV cache" : "needs compute capability 9.0, head dim 64 or 128");
    cublasSetStream(s->cublas, s->stream);
    /* what is in use now (other processes, this process's CUDA context) is not ours to budget */
    size_t free0 = 0, total = 0;
    if (cudaMemGetInfo(&free0, &total) != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: cannot read the memory of device %d", o->device);
        rc = CM_ECUDA;
        goto fail;
    }
    /* FP8 weights need FP8 tensor cores (sm_89+) for their GEMMs; before that they are
     * dequantized to F16 at upload (each matrix logged) */
    const int f8 = kc_fp8_tensor_cores() ? 0 : UP_NO_F8;
    if (f8 && c->fp8_weights)
        CM_LOG_WARN("cuda", "FP8 weights on a GPU without FP8 tensor cores: dequantized to F16 at load", "device=%d name=\"%s\" "
                    "compute_capability=%d.%d", o->device, prop.name, prop.major, prop.minor);
    size_t file_bytes = 0, need = weights_need(m, f8, &file_bytes);
    if (need > free0) {
        snprintf(err, errlen, "cuda backend: the weights need %.2f GiB, %.2f GiB free on device %d (%s)", need / GIB,
                 free0 / GIB, o->device, prop.name);
        rc = CM_ENOMEM;
        goto fail;
    }
    const size_t cublas_ws_bytes = 32u << 20;
    if (dalloc(&s->cublas_ws, cublas_ws_bytes)) goto oom;
    cublasSetWorkspace(s->cublas, s->cublas_ws, cublas_ws_bytes);

    /* weights */
    {
        const mdl_tensor *emb[] = { &m->tok_embd };
        if ((rc = upload_rows(s, emb, 1, &s->tok_embd, UP_TABLE, err, errlen))) goto fail;
        if (c->tied_output) s->output = s->tok_embd;
        else {
            const mdl_tensor *outp[] = { &m->output };
            if ((rc = upload_rows(s, outp, 1, &s->output, f8, err, errlen))) goto fail;
        }
        const mdl_tensor *on[] = { &m->out_norm };
        if ((rc = upload_f32(s, on, 1, &s->out_norm, err, errlen))) goto fail;
        s->layers = calloc((size_t)c->n_layer, sizeof *s->layers);
        if (!s->layers) goto oom;
        for (int l = 0; l < c->n_layer; l++)
            if ((rc = upload_arch_layer(s, m, l, err, errlen))) goto fail;
        for (int l = 0; l < c->n_layer; l++) {
            const cu_layer *L = &s->layers[l];
            const mdl_layer *ly = &m->layers[l];
            if (L->moe && (L->exp_gu_type != ly->exp_gate[0].type || L->exp_down_type != ly->exp_down[0].type))
                CM_LOG_INFO("cuda", "expert weights converted to F16", "layer=%d gate_up=%s down=%s", l,
                            dt_name(ly->exp_gate[0].type) ? dt_name(ly->exp_gate[0].type) : "?",
                            dt_name(ly->exp_down[0].type) ? dt_name(ly->exp_down[0].type) : "?");
        }
        for (int l = 0; l < c->n_layer; l++) {
            const mdl_layer *ly = &m->layers[l];
            cu_layer *L = &s->layers[l];
            const mdl_tensor *qkv[] = { &ly->wq, &ly->wk, &ly->wv }, *wo[] = { &ly->wo }, *gu[] = { &ly->w_gate, &ly->w_up },
                             *dn[] = { &ly->w_down }, *an[] = { &ly->attn_norm }, *fn[] = { &ly->ffn_norm },
                             *bias[] = { &ly->bq, &ly->bk, &ly->bv };
            if ((rc = upload_rows(s, qkv, 3, &L->qkv, f8, err, errlen)) || (rc = upload_rows(s, wo, 1, &L->wo, f8, err, errlen)) ||
                (!L->moe && (rc = upload_rows(s, gu, 2, &L->gu, UP_INTERLEAVE | f8, err, errlen))) ||
                (!L->moe && (rc = upload_rows(s, dn, 1, &L->down, f8, err, errlen))) ||
                (rc = upload_f32(s, an, 1, &L->attn_norm, err, errlen)) || (rc = upload_f32(s, fn, 1, &L->ffn_norm, err, errlen)))
                goto fail;
            if (ly->bq.data && ly->bk.data && ly->bv.data && (rc = upload_f32(s, bias, 3, &L->bqkv, err, errlen))) goto fail;
            if (s->kv_f8 && c->kv_scales && ly->k_scale && ly->v_scale) { /* the checkpoint's static KV scales */
                const size_t nb = (size_t)c->n_head_kv * sizeof(float);
                if (dalloc(&L->k_scale, nb) || dalloc(&L->v_scale, nb) ||
                    cudaMemcpy(L->k_scale, ly->k_scale, nb, cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaMemcpy(L->v_scale, ly->v_scale, nb, cudaMemcpyHostToDevice) != cudaSuccess)
                    goto oom;
            }
        }
    }

    /* rotary frequency tables: the CPU's rule for each layer kind (kernels/cpu/ops.h), shared */
    {
        kc_rope *rs[2] = { &s->rope, &s->rope_swa };
        float **fs[2] = { &s->rope_freq, &s->rope_freq_swa };
        for (int k = 0; k < 2; k++) {
            mdl_rope r;
            k_rope_params rp;
            float fr[K_ROPE_MAX_DIM / 2];
            mdl_layer_rope(c, k, &r);
            if (k_rope_init_layer(&rp, &r, s->lim.n_ctx)) {
                snprintf(err, errlen, "cuda backend: rope dimension %d not supported", r.dim);
                rc = CM_EUNSUPPORTED;
                goto fail;
            }
            for (int i = 0; i < r.dim / 2; i++) fr[i] = (float)rp.inv_freq[i];
            if (dalloc(fs[k], sizeof(float) * (size_t)(r.dim / 2)) ||
                cudaMemcpy(*fs[k], fr, sizeof(float) * (size_t)(r.dim / 2), cudaMemcpyHostToDevice) != cudaSuccess)
                goto oom;
            rs[k]->layout = r.layout;
            rs[k]->rope_dim = r.dim;
            rs[k]->freq = *fs[k];
            rs[k]->mscale = (float)rp.mscale;
        }
    }

    /* activations and workspaces */
    {
        size_t T = (size_t)s->lim.max_tokens, R = (size_t)s->lim.max_out, nq = (size_t)c->n_head * c->head_dim;
        if (dalloc(&s->x, T * c->n_embd * 4) || dalloc(&s->h, T * c->n_embd * 4) || dalloc(&s->qkv, T * s->qkv_dim * 4) ||
            dalloc(&s->q, T * nq * 4) || dalloc(&s->att, T * nq * 4) || dalloc(&s->gu, T * 2 * c->n_ff * 4) ||
            dalloc(&s->act, T * c->n_ff * 4) || dalloc(&s->last, R * c->n_embd * 4) || dalloc(&s->last_n, R * c->n_embd * 4) ||
            dalloc(&s->logits, R * c->n_vocab * 4))
            goto oom;
        if (c->n_expert > 0) {
            size_t NE = (size_t)c->n_expert, K = (size_t)c->n_expert_used, F = (size_t)c->n_ff_exp;
            if (dalloc(&s->rlogits, T * NE * 4) || dalloc(&s->rw, T * K * 4) || dalloc(&s->ridx, T * K * 4) ||
                dalloc(&s->ecnt, NE * 4) || dalloc(&s->eoff, NE * 4) || dalloc(&s->elist, T * K * 4) ||
                dalloc(&s->egu, T * K * 2 * F * 4) || dalloc(&s->eact, T * K * F * 4) || dalloc(&s->eout, T * K * c->n_embd * 4) ||
                dalloc(&s->route_ctr, sizeof(int32_t)) || cudaMemset(s->route_ctr, 0, sizeof(int32_t)) != cudaSuccess)
                goto oom;
        }
        /* split-K partials: the per-head kernel's for every token it may take (all of them
         * without the tensor-core kernels, else the decode buckets below att_tc_min_tok), and
         * the tensor-core decode's for tokens x splits of any launch (kc_plan_dec_splits: at
         * most 2 att_dec_ctas / n_kv, or one a token of the largest bucket) */
        size_t ph_tok = !s->att_tc ? T : s->plan.att_tc_min_tok > 1 ? (size_t)bucket_of(s->plan.att_tc_min_tok - 1) : 0;
        if (ph_tok > T) ph_tok = T;
        /* The per-head kernel's partials grow with tokens x splits: every step on it at long
         * contexts (head dims the tensor cores do not take, e.g. 256: gemma) would need
         * T x n_ctx / 64 rows (gemma3-12b, 2048 tokens at 128k: 69 GB). Longer splits (multiples
         * of 64 positions) keep them within 1 GiB; the results do not depend on the split size
         * beyond rounding. */
        {
            const size_t row = (size_t)c->n_head * (c->head_dim + 2) * 4, cap = (size_t)1 << 30;
            if (ph_tok * s->n_split * row > cap) {
                const size_t max_split = cap / (ph_tok * row) > 1 ? cap / (ph_tok * row) : 1;
                int chunk = (int)(((size_t)s->lim.n_ctx + max_split - 1) / max_split);
                chunk = (chunk + 63) / 64 * 64;
                if (chunk > s->att_chunk) {
                    CM_LOG_INFO("cuda", "per-head attention splits lengthened to bound their partials", "chunk=%d was=%d tokens=%zu "
                                "ctx=%d", chunk, s->att_chunk, ph_tok, s->lim.n_ctx);
                    s->att_chunk = chunk;
                    s->n_split = kc_att_splits_cover(s->lim.n_ctx - 1, chunk, s->plan.att_ph_splits);
                }
            }
        }
        size_t ph = ph_tok * s->n_split;
        size_t tc = s->att_tc ? 2 * (size_t)s->plan.att_dec_ctas / c->n_head_kv + 1 + (size_t)bucket_of(s->lim.max_seqs) : 0;
        s->partial_floats = (ph > tc ? ph : tc) * c->n_head * (c->head_dim + 2);
        if (dalloc(&s->partial, s->partial_floats * 4)) goto oom;
        /* cuBLAS path: quantized/BF16 weights converted to half (bounded below), the widest activations as half */
        size_t wmax = 0, xmax = T * (size_t)(c->n_ff > c->n_embd ? c->n_ff : c->n_embd);
        const kc_weight *ws[] = { &s->output, &s->tok_embd };
        for (int i = 0; i < 2; i++) if (ws[i]->type != DT_F16) wmax = (size_t)ws[i]->n_in * ws[i]->n_out > wmax ? (size_t)ws[i]->n_in * ws[i]->n_out : wmax;
        for (int l = 0; l < c->n_layer; l++) {
            const kc_weight *lw[] = { &s->layers[l].qkv, &s->layers[l].wo, &s->layers[l].gu, &s->layers[l].down };
            for (int i = 0; i < 4; i++)
                if (lw[i]->type != DT_F16 && lw[i]->type != DT_F32 && (size_t)lw[i]->n_in * lw[i]->n_out > wmax)
                    wmax = (size_t)lw[i]->n_in * lw[i]->n_out;
            const kc_weight *rt = &s->layers[l].router;
            if (s->layers[l].moe && rt->type != DT_F16 && rt->type != DT_F32 && (size_t)rt->n_in * rt->n_out > wmax)
                wmax = (size_t)rt->n_in * rt->n_out;
        }
        if (R * c->n_embd > xmax) xmax = R * c->n_embd;
        if (T * nq > xmax) xmax = T * nq; /* wo's input (wider than n_ff when every MLP is a mixture of experts) */
        {
            size_t widest = (size_t)(c->n_ff > c->n_embd ? c->n_ff : c->n_embd), cap = (size_t)64 << 20;
            if (nq > widest) widest = nq;
            /* the wgmma tiles' image of x: rows padded to 8, 256 more of 64 halves read past them
             * (kc__gemmq_x_halves; kc_matmul keeps x as it is where that does not fit) */
            xmax += 7 * widest + 256 * 64;
            /* kc_matmul converts in slices of whole rows: 128 MiB of halves bounds it whatever the
             * vocabulary (at least one row of the widest matrix). Slices of 4096 rows (32 MiB) cost
             * 15 % at a 512-token Q4_0 prefill on an H100: a 512 x 4096 x 4096 GEMM is under one
             * wave of cuBLAS tiles. */
            if (cap < widest) cap = widest;
            if (wmax > cap) wmax = cap;
        }
        s->gws.cublas = s->cublas;
        /* FP8 GEMMs, and F16 ones at prefill sizes (the plan's f16_lt_min_tok), on cuBLASLt
         * (sharing cuBLAS's workspace: one stream); FP8: one scale per token */
        if ((!f8 && c->fp8_weights) || s->plan.f16_lt_min_tok) {
            if (cublasLtCreate((cublasLtHandle_t *)&s->gws.cublaslt) != CUBLAS_STATUS_SUCCESS) {
                s->gws.cublaslt = NULL;
                goto oom;
            }
            s->gws.lt_ws = s->cublas_ws;
            s->gws.lt_ws_bytes = cublas_ws_bytes;
        }
        if (!f8 && c->fp8_weights) {
            s->gws.x_scale_cap = s->lim.max_tokens;
            if (dalloc(&s->gws.x_scale, T * sizeof(float))) goto oom;
            /* the unit-scale GEMMs' output before the scale pass, up to 512 tokens (where they can
             * win: kc_matmul_tune_f8) */
            size_t f8_rows = 0;
            for (int l = 0; l < c->n_layer; l++) {
                const cu_layer *L = &s->layers[l];
                const kc_weight *lw[] = { &L->qkv, &L->wo, &L->gu, &L->down };
                for (int i = 0; i < 4; i++)
                    if (lw[i]->type == DT_F8_E4M3 && (size_t)lw[i]->n_out > f8_rows) f8_rows = (size_t)lw[i]->n_out;
            }
            if (f8_rows && s->plan.fp8_lt_tune) {
                s->gws.f8_raw_cap = f8_rows * (size_t)(T < 512 ? T : 512);
                if (dalloc(&s->gws.f8_raw, s->gws.f8_raw_cap * sizeof(float))) goto oom;
            }
        }
        s->gws.w_cap = wmax;
        s->gws.x_cap = xmax;
        if (dalloc(&s->gws.w_half, wmax * 2) || dalloc(&s->gws.x_half, xmax * 2)) goto oom;
        s->xq_h.img = s->gws.x_half; /* the norms write x's image for the wgmma tiles there, */
        s->xq_h.img_cap = xmax;
        s->xq_a.img = s->gws.x_half; /* and the gated activation for down's */
        s->xq_a.img_cap = xmax;
        s->xq_o.img = s->gws.x_half; /* and prefill attention wo's input as half (KC_X_PLAIN) */
        s->xq_o.img_cap = xmax;
        /* FP8 matrices' codes (KC_X_F8) go to x_half's bytes as well, their token scales to x_scale */
        s->xq_h.img_scale = s->xq_a.img_scale = s->gws.x_scale;
        s->xq_h.img_scale_cap = s->xq_a.img_scale_cap = s->gws.x_scale ? s->gws.x_scale_cap : 0;
        /* down's image apart from x_half for steps of up to 1,024 tokens (decode batches, short
         * prefill chunks) where the wgmma tiles run and a layer has a dense MLP */
        {
            int dense = 0;
            for (int l = 0; l < c->n_layer; l++) dense |= !s->layers[l].moe;
            s->act_img_tok = (int)(T < 1024 ? T : 1024);
            s->act_img_cap = (size_t)(s->act_img_tok + 7) * (size_t)c->n_ff + 256 * 64;
            if (dense && kc_gemmq_ncfg() > 11 && c->n_ff > 0) {
                if (dalloc(&s->act_img, s->act_img_cap * 2)) goto oom;
            } else {
                s->act_img_tok = 0;
            }
        }
        /* two-level int8 activations for the integer GEMVs: one block (qh, ql, pairs) each */
        {
            int ct = s->lim.max_tokens < KC_GEMV_MAX_TOK ? s->lim.max_tokens : KC_GEMV_MAX_TOK;
            /* Q8_0 and Q4_K matrices on int8 mma.sync up to the plan's q8_mma_max_tok /
             * q4k_mma_max_tok tokens (kc__gemm_q8i): their producers write the blocks for those
             * steps too */
            int q8 = 0, q4k = 0;
            for (int l = 0; l < c->n_layer; l++) {
                const cu_layer *L = &s->layers[l];
                const kc_weight *ws4[] = { &L->qkv, &L->wo, &L->gu, &L->down };
                for (int k = 0; k < 4 && !L->moe; k++) {
                    q8 |= ws4[k]->type == DT_Q8_0;
                    q4k |= ws4[k]->type == DT_Q4_K;
                }
            }
            int want = q8 ? s->plan.q8_mma_max_tok : 0;
            if (q4k && s->plan.q4k_mma_max_tok > want) want = s->plan.q4k_mma_max_tok;
            if (want > ct) ct = s->lim.max_tokens < want ? s->lim.max_tokens : want;
            int widest = (int)nq > c->n_ff ? (int)nq : c->n_ff;
            if (c->n_embd > widest) widest = c->n_embd;
            kc_xq *qs[] = { &s->xq_h, &s->xq_a, &s->xq_o, &s->gws.xq };
            int ns[] = { c->n_embd, c->n_ff, (int)nq, widest };
            for (int i = 0; i < 4; i++)
                if (xq_alloc(qs[i], (size_t)ct, ns[i], 1)) goto oom;
            int q_gu = 0, q_dn = 0; /* layers whose experts run on the integer GEMV */
            for (int l = 0; l < c->n_layer; l++) {
                q_gu |= s->layers[l].moe && kc_weight_is_quant(s->layers[l].exp_gu_type);
                q_dn |= s->layers[l].moe && kc_weight_is_quant(s->layers[l].exp_down_type);
            }
            if ((q_gu && xq_alloc(&s->xq_e, (size_t)s->lim.max_tokens, c->n_embd, 1)) ||
                (q_dn && xq_alloc(&s->xq_f, (size_t)s->lim.max_tokens * c->n_expert_used, c->n_ff_exp, 1)))
                goto oom;
            if (dalloc(&s->att_counters, T * c->n_head * sizeof(int)) ||
                cudaMemset(s->att_counters, 0, T * c->n_head * sizeof(int)) != cudaSuccess ||
                dalloc(&s->qkv_ctr, (c->n_head + c->n_head_kv) * sizeof(int)) ||
                cudaMemset(s->qkv_ctr, 0, (c->n_head + c->n_head_kv) * sizeof(int)) != cudaSuccess)
                goto oom;
            /* prefill tiles split over the keys: kc_plan_pf_splits at most 2 att_dec_ctas CTAs of 16 x 8
             * rows, att_dec_ctas / 2 (tile, KV head) counters; kc_plan_pf_splits_fa3 at most
             * att_pf_fa3_ctas CTAs of 128 rows, half as many counters */
            const size_t pf_ctas = (size_t)(2 * s->plan.att_dec_ctas > s->plan.att_pf_fa3_ctas ? 2 * s->plan.att_dec_ctas
                                                                                                 : s->plan.att_pf_fa3_ctas);
            if (s->att_tc &&
                (dalloc(&s->pf_partial, pf_ctas * 16 * 8 * (c->head_dim + 2) * sizeof(float)) ||
                 dalloc(&s->pf_counters, pf_ctas * sizeof(int)) || cudaMemset(s->pf_counters, 0, pf_ctas * sizeof(int)) != cudaSuccess))
                goto oom;
        }
        /* tok pos seq [T], rows [R], block tables [(S + 1) x max_blocks], tiles [2T], dtoks [T], chunk [1]:
         * the layout of the meta_* accessors */
        s->meta_ints = 3 * T + R + (size_t)(s->lim.max_seqs + 1) * s->lim.max_blocks + 2 * T + T + 1 +
                       (size_t)(s->lim.max_seqs + 1) * s->lim.max_blocks; /* + bt_swa */
        if (dalloc(&s->d_meta, s->meta_ints * 4)) goto oom;
        if (cudaMallocHost((void **)&s->h_meta, s->meta_ints * 4) != cudaSuccess ||
            cudaMallocHost((void **)&s->h_logits, R * c->n_vocab * 4) != cudaSuccess ||
            cudaMallocHost((void **)&s->h_hidden, R * c->n_embd * 4) != cudaSuccess)
            goto oom;
        size_t pool = kc_sample_pool_bytes(s->lim.max_out, c->n_vocab);
        if (dalloc(&s->d_samp, pool) || dalloc(&s->d_sout, R * sizeof(kc_sample_out)) ||
            cudaMallocHost(&s->h_samp, pool) != cudaSuccess || cudaMallocHost((void **)&s->h_sout, R * sizeof(kc_sample_out)) != cudaSuccess ||
            !(s->samp_mark = malloc(R)) || !(s->samp_slot = malloc(R * sizeof(int))))
            goto oom;
        memset(s->h_meta, 0, s->meta_ints * 4);
        /* the plan's att_pf_f8_fa3: room for two whole contexts of F16 copies, full-attention
         * layers only, the wgmma kernel's tiles the same as the mma.sync kernel's */
        if (s->kv_f8 && s->att_tc && s->plan.att_pf_f8_fa3 && c->n_layer_swa == 0 &&
            kc_attention_fa3_ok(c->head_dim, c->n_head, c->n_head_kv, s->lim.block_size) &&
            kc_attention_fa3_tile_tok(c->n_head, c->n_head_kv) == s->pf_tile_tok) {
            const int bs = s->lim.block_size;
            s->f8sh_cap = (2 * s->lim.n_ctx + bs - 1) / bs;
            const size_t blk = (size_t)c->n_head_kv * bs * c->head_dim * 2, ints = 2 * (size_t)s->f8sh_cap +
                                                                                  (size_t)(s->lim.max_seqs + 1) * s->lim.max_blocks;
            if (dalloc(&s->f8sh_k, blk * s->f8sh_cap) || dalloc(&s->f8sh_v, blk * s->f8sh_cap) || dalloc(&s->d_f8sh, ints * 4) ||
                cudaMallocHost((void **)&s->h_f8sh, ints * 4) != cudaSuccess)
                goto oom;
            CM_LOG_INFO("cuda", "att_pf_f8_fa3: prefill over the FP8 cache on the wgmma kernel through an F16 copy",
                        "blocks=%d gib=%.2f", s->f8sh_cap, 2.0 * blk * s->f8sh_cap / GIB);
        }
    }
    CM_LOG_INFO("cuda", "weights uploaded", "device=%d name=\"%s\" weights_gib=%.2f seconds=%.2f", o->device, prop.name,
                s->weight_bytes / GIB, cm_time_s() - t0);
    log_weight_types(s, m, file_bytes);

    /* F16 matrices at prefill sizes: cublasGemmEx's and cuBLASLt's algorithms timed on the
     * layers' shapes; FP8 matrices past the GEMV: the row and token scales as cuBLASLt's outer
     * vectors (one algorithm) or unit scales and a scale pass (the heuristic's algorithms), timed
     * at 16, 32, ... tokens (both before the KV pool takes the memory for the scratch output) */
    for (int f8t = 0; f8t < 2; f8t++) {
        if (f8t ? !(!f8 && c->fp8_weights && s->plan.fp8_gemm && s->plan.fp8_lt_tune && s->gws.cublaslt)
                : !(s->plan.f16_lt_min_tok && s->gws.cublaslt && s->lim.max_tokens >= s->plan.f16_lt_min_tok))
            continue;
        const double t1 = cm_time_s();
        const kc_weight **ws = calloc((size_t)c->n_layer * 4 + 1, sizeof *ws);
        unsigned char *flag = calloc((size_t)c->n_layer * 4 + 1, 1);
        if (!ws || !flag) {
            free(ws);
            free(flag);
            goto oom;
        }
        int n_w = 0;
        for (int l = 0; l < c->n_layer; l++) {
            const cu_layer *L = &s->layers[l];
            const kc_weight *lw[] = { &L->qkv, &L->wo, &L->gu, &L->down };
            /* F16: gate|up's output as half rows (kc_matmul_glu), Q|K|V's where the rotation takes
             * them (layer_qkv_half at the largest step); FP8: wo and down add into x unless a
             * post-norm takes their output (enqueue_forward) */
            const int mt = s->lim.max_tokens;
            const unsigned char fl[] = { !f8t && layer_rope_pf(s, L, mt) && layer_qkv_half(s, L, mt), f8t && !L->attn_post,
                                         !f8t && !L->moe && s->plan.glu_half_min_tok > 0, f8t && !L->ffn_post };
            for (int i = 0; i < 4; i++)
                if (lw[i]->type == (f8t ? DT_F8_E4M3 : DT_F16)) {
                    flag[n_w] = fl[i];
                    ws[n_w++] = lw[i];
                }
        }
        if (f8t && s->output.type == DT_F8_E4M3) ws[n_w++] = &s->output;
        char rep[2048];
        const int trc = f8t ? kc_matmul_tune_f8(ws, flag, n_w, s->lim.max_tokens, &s->gws, s->stream, rep, sizeof rep)
                            : kc_matmul_tune_f16(ws, flag, n_w, s->lim.max_tokens, &s->gws, s->stream, rep, sizeof rep);
        free(ws);
        free(flag);
        const char *what = f8t ? "FP8 matmuls' scale paths" : "F16 matmuls' algorithms";
        if (trc == CM_ENOMEM)
            CM_LOG_WARN("cuda", f8t ? "no room to time the FP8 matmuls' scale paths: outer-vector scales everywhere"
                                    : "no room to time the F16 matmuls' algorithms: cublasGemmEx's own choice",
                        "max_tokens=%d", s->lim.max_tokens);
        else if (trc) {
            snprintf(err, errlen, "cuda backend: timing the %s failed (%s)", what, cm_err_str(trc));
            rc = trc;
            goto fail;
        } else if (n_w)
            CM_LOG_INFO("cuda", f8t ? "FP8 matmul scale paths timed" : "F16 matmul algorithms timed",
                        "seconds=%.2f from_tokens=%d result=\"%s\"", cm_time_s() - t1, f8t ? 16 : s->plan.f16_lt_min_tok, rep);
    }

    /* KV pool, last: n_kv_blocks + 1 blocks (the scratch block padding tokens write to) per layer */
    if ((rc = alloc_kv_pool(s, o, &prop, free0, total, err, errlen))) goto fail;
    s->scratch_block = s->lim.n_kv_blocks;
    s->scratch_block_swa = s->lim.n_kv_blocks_swa;
    s->base.n_kv_blocks = s->lim.n_kv_blocks;
    s->base.n_kv_blocks_swa = s->lim.n_kv_blocks_swa;
    stage_scratch_row(s);

    if (o->cuda.profile) {
        s->prof_on = 1;
        for (; s->prof_n_created < PROF_MAX_EVENTS; s->prof_n_created++)
            if (cudaEventCreate(&s->prof_ev[s->prof_n_created]) != cudaSuccess) goto oom;
    }
    {
        /* what the layers' norms, attention and SwiGLU must write in GEMV-sized steps, and which
         * half copies are read */
        /* blocks are only written for rows of whole blocks (norm: n_embd, attention: head_dim, SwiGLU: n_ff) */
        /* F16 and FP8 GEMVs read the half copy */
#define HALF_X(t) ((t) == DT_F16 || (t) == DT_F8_E4M3)
        int f16_after_norm = HALF_X(s->output.type), f16_wo = 0, f16_down = 0;
        s->norm_blocks_max = s->att_blocks_max = s->act_blocks_max = 0;
        /* the largest step size up to which no matrix after them reads the f32 output (the
         * matrices' paths may change with the token count) */
        for (int n = 1; n <= KC_GEMV_MAX_TOK; n++) {
            int norm_reads = c->n_embd % 32 != 0, wo_reads = c->head_dim % 32 != 0, down_reads = c->n_ff % 32 != 0;
            for (int l = 0; l < c->n_layer; l++) {
                const cu_layer *L = &s->layers[l];
                norm_reads |= kc_matmul_reads_x(&L->qkv, n) || kc_matmul_reads_x(&L->gu, n);
                wo_reads |= kc_matmul_reads_x(&L->wo, n);
                down_reads |= kc_matmul_reads_x(&L->down, n);
            }
            norm_reads |= c->n_expert > 0; /* the router and the experts read the f32 rows */
            if (!norm_reads && s->norm_blocks_max == n - 1) s->norm_blocks_max = n;
            if (!wo_reads && s->att_blocks_max == n - 1) s->att_blocks_max = n;
            if (!down_reads && s->act_blocks_max == n - 1) s->act_blocks_max = n;
        }
        for (int l = 0; l < c->n_layer; l++) {
            const cu_layer *L = &s->layers[l];
            f16_after_norm |= HALF_X(L->qkv.type) || HALF_X(L->gu.type) || (L->moe && HALF_X(L->router.type));
            f16_wo |= HALF_X(L->wo.type);
            f16_down |= HALF_X(L->down.type);
        }
#undef HALF_X
        /* half copies nothing reads: no F16 matrix after the norms, the attention, SwiGLU */
        if (!f16_after_norm) s->xq_h.xh = NULL;
        if (!f16_wo) s->xq_o.xh = NULL;
        if (!f16_down) s->xq_a.xh = NULL;
        /* integer blocks nothing reads (an F16 model): the producers write only the half copy */
        {
            int q_after_norm = kc_weight_is_quant(s->output.type), q_wo = 0, q_down = 0;
            for (int l = 0; l < c->n_layer; l++) {
                const cu_layer *L = &s->layers[l];
                q_after_norm |= kc_weight_is_quant(L->qkv.type) || kc_weight_is_quant(L->gu.type) ||
                                (L->moe && (kc_weight_is_quant(L->router.type) || kc_weight_is_quant(L->exp_gu_type)));
                q_wo |= kc_weight_is_quant(L->wo.type);
                q_down |= kc_weight_is_quant(L->down.type);
            }
            s->xq_h.no_ints = !q_after_norm && s->xq_h.xh;
            s->xq_o.no_ints = !q_wo && s->xq_o.xh;
            s->xq_a.no_ints = !q_down && s->xq_a.xh;
        }
    }
    s->tr_at = o->cuda.trace_step;
    snprintf(s->tr_file, sizeof s->tr_file, "%s", o->cuda.trace_file && *o->cuda.trace_file ? o->cuda.trace_file : "arka-trace.csv");
    if (o->cuda.graph_timing) {
        if (cudaEventCreate(&s->gt_ev[0]) != cudaSuccess || cudaEventCreate(&s->gt_ev[1]) != cudaSuccess) goto oom;
        s->gt_on = 1;
    }
    const char *no_graphs = s->prof_on ? "--cuda-profile" : !(o->graph_budget_s > 0) ? "--cuda-graph-budget-s 0" : NULL;
    if (no_graphs) CM_LOG_INFO("cuda", "decode graphs off: every step runs eagerly", "reason=\"%s\"", no_graphs);
    else if ((rc = capture_graphs(s, o->graph_budget_s, err, errlen))) goto fail;
    *out = &s->base;
    return 0;
oom:
    {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(err, errlen, "cuda backend: out of memory allocating activations for %d tokens (%.2f of %.2f GiB free on device %d)",
                 s->lim.max_tokens, fr / 1073741824.0, tot / 1073741824.0, o->device);
    }
    rc = CM_ENOMEM;
fail:
    cuda_destroy(&s->base);
    return rc;
}
