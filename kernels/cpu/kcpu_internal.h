/* kcpu_internal: what the files of kernels/cpu share and the public header does not show:
 * the pool's scratch buffer, the layout of quantized activations, and the per-ISA matmul
 * kernel tables (matmul_scalar.c, matmul_avx2.c, matmul_avx512.c) that matmul.c dispatches.
 */
#ifndef K_CPU_INTERNAL_H
#define K_CPU_INTERNAL_H

#include "kcpu.h"
#include "../../model/dtype.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Scratch owned by the pool, 64-byte aligned, at least `bytes` long. Grows (reallocates,
 * contents lost) only when a larger size is asked for; NULL when that allocation fails.
 * Called by the pool's owner thread outside k_pool_run only. */
void *k__pool_scratch(k_pool *p, size_t bytes);

/* Quantized activations, two int8 levels per value: x ≈ d * (qh + ql / 256), qh = round(x / d),
 * ql = round(256 * (x / d - qh)) clamped to ±127, d = amax / 127 of the block. That is ~16
 * significant bits: one 8-bit level alone (the usual Q8_0-style activations) costs ~0.5 %
 * per matmul and ~3 % on the logits of a 12-layer model, enough to flip the top-1 token at
 * ~9 % of positions (bench/RESULTS.md, "Engine (CPU)"); the integer kernels take two dot
 * products per block instead of one.
 *
 * One row per token, each k__act_row_size() bytes (a multiple of 64; rows start 64-byte
 * aligned). Blocks of 32 (K_ACT_32_W8 for Q8_0 weights, K_ACT_32_W4 for Q4_0), with n_in
 * rounded up to a whole group of 4 blocks, N = k__act_n32(n_in):
 *   int8_t  qh[N], ql[N]   in group order: group g (blocks 4g..4g+3) at offset 128 g holds
 *                          elements 0..15 of each of its blocks, then elements 16..31 of each;
 *                          the blocks past n_in / 32 are zeros
 *   float   d[N / 32][4]   the block's d / 256, once per dot-product lane (4 per block)
 *   int32_t k[N / 32][4]   -c * sum(256 qh + ql) over the 8 values lane j of the block covers
 *                          (elements 4j..4j+3 and 16+4j..16+4j+3): takes off what weights
 *                          made unsigned by +c over-count (c = 128 for W8, 8 for W4)
 * so lane 4 i + j of a 512-bit vpdpbusd over a group's two halves is lane j of block i, and
 * sum(w x) over block b = d[b] * (256 sum(w qh) + sum(w ql)).
 * Blocks of 256 (K_ACT_256, for Q4_K and Q6_K), natural order:
 *   int8_t  qh[n_in], ql[n_in]
 *   float   d[n_in / 256]      the block's d (not divided by 256)
 *   int16_t bh[n_in / 16], bl[n_in / 16]   sums of each 16 consecutive qh (and ql)
 * The quantization of a row depends on that row only (batch invariance). */
enum { K_ACT_NONE = 0, K_ACT_32_W8, K_ACT_32_W4, K_ACT_256 };

static inline int64_t k__act_n32(int64_t n_in) { return (n_in + 127) & ~(int64_t)127; }
static inline int64_t k__act_nq(int act, int64_t n_in) { return act == K_ACT_256 ? n_in : k__act_n32(n_in); }

static inline size_t k__act_row_size(int act, int64_t n_in) {
    size_t n = (size_t)k__act_nq(act, n_in), b = 0;
    if (act == K_ACT_32_W8 || act == K_ACT_32_W4) b = 3 * n;
    else if (act == K_ACT_256) b = 2 * n + (n / 256) * 4 + (n / 16) * 4;
    return (b + 63) & ~(size_t)63;
}
/* nq = k__act_nq(act, n_in) */
static inline const int8_t *k__act_qh(const uint8_t *row) { return (const int8_t *)row; }
static inline const int8_t *k__act_ql(const uint8_t *row, int64_t nq) { return (const int8_t *)(row + nq); }
static inline const float *k__act_d(const uint8_t *row, int64_t nq) { return (const float *)(row + 2 * nq); }
/* 32-blocks only */
static inline const int32_t *k__act_k(const uint8_t *row, int64_t nq) { return (const int32_t *)(row + 2 * nq + nq / 2); }
/* 256-blocks only: bh; bl follows at + nq / 16 */
static inline const int16_t *k__act_bsums(const uint8_t *row, int64_t nq) {
    return (const int16_t *)(row + 2 * nq + (nq / 256) * 4);
}
/* Offset of element e (0..31) of block b in a 32-block row's group order. */
static inline int64_t k__act_pos(int64_t b, int e) {
    return 128 * (b / 4) + 16 * (b % 4) + (e < 16 ? e : 48 + e);
}

/* The 8 six-bit scales (out[0..7]) and mins (out[8..15]) of a Q4_K super-block from its 12
 * packed bytes. */
static inline void k__q4k_scales(const uint8_t *q, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, q, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t t = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = t;
    u[0] &= m1;
    memcpy(out, u, 16);
}

/* The value of each F8_E4M3 code (dt_e4m3_to_f32), a table built once. Any thread. */
const float *k__e4m3_lut(void);

/* Which activation format a weight type's integer kernel wants (K_ACT_NONE: f32 rows). */
int k__act_for(int wtype);
/* Quantizes one f32 row of n_in into the format above (scalar). The AVX-512 version (NULL
 * where not compiled) gives the same bytes: every ISA's kernels see the same activations. */
void k__act_quantize_row(int act, const float *x, int64_t n_in, uint8_t *row);
typedef void (*k__act_fn)(int act, const float *x, int64_t n_in, uint8_t *row);
extern const k__act_fn k__act_quantize_avx512;

/* One matmul job: y[t][o] for t < n_tok and o in [o0, o1).
 * x points to f32 rows (stride x_row bytes) or quantized rows as above. */
typedef struct {
    const uint8_t *w;   /* [n_out] rows of w_row bytes */
    size_t w_row;
    const uint8_t *x;   /* [n_tok] rows of x_row bytes */
    size_t x_row;
    int64_t n_in, n_out, n_tok;
    float *y;           /* y[t * ldy + o] */
    int64_t ldy;
    const float *scale; /* F8_E4M3: [n_out] row scales; the kernel writes scale[o] * sum (kcpu.h) */
} k__mm_args;

typedef void (*k__mm_fn)(const k__mm_args *a, int64_t o0, int64_t o1);

/* Kernel tables indexed by weight type; NULL where that ISA has no kernel. The AVX2 and
 * AVX-512 tables are filled only when those files were compiled with the target attributes
 * (x86-64 with GCC/Clang). Each entry computes every (t, o) with a summation order that
 * depends on neither n_tok, the row range, nor the thread (batch invariance). */
extern const k__mm_fn k__mm_scalar[DT_COUNT];
extern const k__mm_fn k__mm_avx2[DT_COUNT];
extern const k__mm_fn k__mm_avx512[DT_COUNT];

/* Rows per scheduling chunk the ISA's kernels prefer (a multiple of their row tile). */
int k__mm_chunk_rows(int isa);

#endif
