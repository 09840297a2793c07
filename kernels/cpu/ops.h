/* ops: the CPU's elementwise and row-wise kernels of the forward pass: RMSNorm, RoPE
 * (adjacent-pair and half-split layouts; linear, llama3, yarn and longrope frequencies; an
 * attention factor on cos/sin), SwiGLU, GeGLU (tanh GELU), soft-capping, softmax, add, scale,
 * and the top-k of a mixture-of-experts router. Every op works row by row, so a row's result
 * never depends on the other rows of the call (batch invariance). Scalar C; the compiler
 * vectorizes the inner loops.
 *
 *   k_rmsnorm(x, w, n_tok, n_embd, eps, y);            // y[t] = x[t] / rms(x[t]) * w
 *   k_rope_params rp; k_rope_init(&rp, &model->cfg);
 *   k_rope(&rp, q, n_tok, n_head, head_dim, pos);       // in place
 *
 * Any thread may call these; they keep no state and allocate nothing.
 */
#ifndef K_OPS_H
#define K_OPS_H

#include <stdint.h>

#include "../../model/model.h"

#define K_ROPE_MAX_DIM 1024 /* rope_dim limit (pairs: 512) */

/* y[t][i] = x[t][i] / sqrt(mean_i(x[t]^2) + eps) * w[i]; y may equal x. Sum in double. */
void k_rmsnorm(const float *x, const float *w, int64_t n_tok, int64_t n, float eps, float *y);

/* Rotary embedding parameters: per-pair inverse frequencies with the scaling applied. */
typedef struct k_rope_params {
    int    rope_dim;      /* dimensions rotated per head (even, <= head_dim) */
    int    layout;        /* enum mdl_rope_layout */
    double mscale;        /* cos and sin are multiplied by it (yarn / longrope attention factor) */
    double inv_freq[K_ROPE_MAX_DIM / 2]; /* [rope_dim/2] radians per position of pair i */
} k_rope_params;

/* From one layer's rope (mdl_layer_rope): inv_freq[i] = base^(-2i/rope_dim), then
 *   linear    ÷ factor;
 *   llama3    Meta's rule: wavelengths above orig_ctx/low_freq_factor ÷ factor, below
 *             orig_ctx/high_freq_factor unchanged, smooth interpolation between;
 *   yarn      transformers' _compute_yarn_parameters: interpolated (÷ factor) below the
 *             correction range [floor(d(beta_fast)), ceil(d(beta_slow))], extrapolated above,
 *             a linear ramp between, d(r) = dim ln(orig / (2 pi r)) / (2 ln base);
 *   longrope  ÷ long_factor[i] when the context n_ctx exceeds orig_ctx, else ÷ short_factor[i]
 *             (llama.cpp's choice by context size; transformers switches by sequence length);
 * and mscale = attn_factor. Returns 0 or CM_EINVAL (rope_dim odd, <= 0 or > K_ROPE_MAX_DIM). */
int  k_rope_init_layer(k_rope_params *rp, const mdl_rope *r, int n_ctx);
/* The same for the model's full-attention layers at its training context. */
int  k_rope_init(k_rope_params *rp, const mdl_config *c);
/* Rotates x [n_tok, n_head, head_dim] in place; token t is at position pos[t]. Pairs:
 * MDL_ROPE_ADJACENT (2i, 2i+1); MDL_ROPE_HALF (i, i + rope_dim/2); dims >= rope_dim untouched.
 * Angles pos * inv_freq are computed in double, then cos/sin (times mscale) rounded to float. */
void k_rope(const k_rope_params *rp, float *x, int64_t n_tok, int n_head, int head_dim, const int32_t *pos);

/* out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]; out may alias. */
void k_swiglu(const float *gate, const float *up, int64_t n, float *out);
/* out[i] = gelu_tanh(gate[i]) * up[i], gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (PyTorch's approximate='tanh'); out may alias. */
void k_geglu(const float *gate, const float *up, int64_t n, float *out);
/* x[i] = cap * tanh(x[i] / cap) (cap > 0). */
void k_softcap(float *x, int64_t n, float cap);
/* x[i] *= s. */
void k_scale(float *x, int64_t n, float s);
/* Mixture-of-experts routing of one token: softmax over the n router logits, the k largest
 * probabilities (ties: the lower expert index first), renormalised to sum 1 when norm is set.
 * idx[k] and w[k] come in descending probability. n <= MDL_MAX_EXPERTS, 1 <= k <= n. */
void k_topk_route(const float *logits, int n, int k, int norm, int32_t *idx, float *w);
/* In place softmax of n values (max-subtracted, sum in double). n >= 1. */
void k_softmax(float *x, int64_t n);
/* x[i] += y[i]. */
void k_add(float *x, const float *y, int64_t n);
/* x[t][i] += b[i] for every row (bias). */
void k_add_bias(float *x, const float *b, int64_t n_tok, int64_t n);

#endif
