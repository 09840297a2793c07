/* attn: causal grouped-query attention over a paged KV cache, for a batch of query tokens
 * from several sequences, and the store of new K/V rows into the cache's blocks.
 *
 * One layer's cache is two pools (K and V) of n_pool_blocks blocks of k_kv_block_bytes()
 * bytes each. Sequence s's position p lives in block block_tables[s * bt_stride + p /
 * block_size], row p % block_size. A block of B positions, H = n_head_kv heads of D = head_dim,
 * by kv_type (executor/kv.h states the same layout for every backend):
 *   F32, F16   [B][H][D] elements (round to nearest even on the way in)
 *   F8_E4M3    codes [B][H][D] bytes, then scales [H][B] f32: position p, head h holds
 *              code = dt_f32_to_e4m3_sat(x / s), value = dt_e4m3_to_f32(code) * s (f32 ops),
 *              with s = k_scale[h] / v_scale[h] when the layer has static scales (a
 *              checkpoint's kv_cache_scheme), else s = amax / 448 over the head's D values
 *              of that position (dt_fp8_scale: computed online, per position and head)
 *   Q8_0       [B][H][D / 32] ggml Q8_0 blocks (D a multiple of 32), ggml's rounding
 * Attention decodes each row to f32 exactly as above and computes in f32.
 *
 *   k_attn_args a = { .n_tok = T, .q = q, .out = o, .tok_pos = pos, .tok_seq = seq, ... };
 *   k_kv_write(&a, k_new, v_new);   // the step's K/V into the cache first
 *   k_attn_paged(pool, &a);         // then every query attends to [0, its position]
 *
 * A query token at position p attends to its own sequence's positions [0, p], or with a
 * sliding window of W positions to [max(0, p - W + 1), p]; the work is
 * split over (token, head) pairs across the pool, each computed the same way whatever the
 * split (online softmax over fixed chunks of 64 positions in order, f32 accumulation), so
 * results depend neither on the thread count, the other tokens of the batch, nor the block
 * size or which physical blocks hold the sequence.
 * Called from the pool owner's thread; allocates nothing.
 */
#ifndef K_ATTN_H
#define K_ATTN_H

#include <stdint.h>

#include "kcpu.h"

#define K_ATTN_MAX_HEAD_DIM 512
#define K_ATTN_MAX_BLOCK    1024

typedef struct k_attn_args {
    int64_t n_tok;
    int   n_head, n_head_kv, head_dim, block_size;
    float scale;                  /* usually 1/sqrt(head_dim) */
    float softcap;                /* > 0: scores = softcap * tanh(scores / softcap) before the softmax */
    int   window;                 /* > 0: a query sees the last `window` positions, itself included */
    const float   *q;             /* [n_tok, n_head, head_dim] */
    float         *out;           /* [n_tok, n_head, head_dim] */
    const int32_t *tok_pos;       /* [n_tok] position of each query token */
    const int32_t *tok_seq;       /* [n_tok] its sequence index */
    const int32_t *block_tables;  /* [n_seqs, bt_stride] */
    int            bt_stride;
    const int32_t *n_blocks;      /* [n_seqs] valid entries per row */
    void          *k_pool, *v_pool; /* this layer: [n_pool_blocks] blocks as above */
    int64_t        n_pool_blocks;
    int            kv_type;       /* DT_F32 (0: the default), DT_F16, DT_F8_E4M3 or DT_Q8_0 */
    const float   *k_scale, *v_scale; /* F8_E4M3: [n_head_kv] static scales, or NULL: per position and head */
} k_attn_args;

/* Bytes of one block of one layer's K (or V) pool: block_size positions of n_head_kv heads;
 * 0 for a type or head_dim the layout above does not take. */
size_t k_kv_block_bytes(int kv_type, int block_size, int n_head_kv, int head_dim);

/* Writes k, v [n_tok, n_head_kv, head_dim] at each token's (sequence, position), converted
 * to kv_type. Returns 0, or CM_EINVAL (a position beyond its block table, a block outside
 * the pool, a kv_type without a layout; nothing is written past either). */
int k_kv_write(const k_attn_args *a, const float *k, const float *v);
/* Copies positions [0, n_tok) of block src into block dst in both pools of the layer (scales
 * included). Returns 0 or CM_EINVAL. */
int k_kv_copy(const k_attn_args *a, int64_t src, int64_t dst, int n_tok);

/* out = softmax(capped(q·Kᵀ·scale), causal, windowed) · V per (token, head); query head h
 * reads KV head h / (n_head / n_head_kv). Returns 0 or CM_EINVAL (bad shapes, a table not
 * covering the positions the query sees, a block outside the pool). */
int k_attn_paged(k_pool *pool, const k_attn_args *a);

#endif
