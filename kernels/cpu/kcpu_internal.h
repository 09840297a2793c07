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

/* Scratch owned by the pool, 64-byte aligned, at least `bytes` long. Grows (reallocates,
 * contents lost) only when a larger size is asked for; NULL when that allocation fails.
 * Called by the pool's owner thread outside k_pool_run only. */
void *k__pool_scratch(k_pool *p, size_t bytes);

/* Quantized activations: one row per token, each row k__act_row_size() bytes (a multiple of
 * 64; rows start 64-byte aligned):
 *   int8_t  qs[n_in]            values, symmetric: |q| <= 127, x ≈ d * q
 *   float   d[n_in / bs]        one scale per block of bs (32 for Q8_0-style, 256 for Q8_K-style)
 *   int16_t bsums[n_in / 16]    (Q8_256 only) sums of each 16 consecutive qs
 *   int32_t s8[n_in / 32][8]    (Q8_32S only) 8 * (sum of qs[4k .. 4k+3]) for lane k of each
 *                               block: what unsigned Q4_0 nibbles over-count (they are q + 8)
 * The quantization of a row depends on that row only (batch invariance). */
enum { K_ACT_NONE = 0, K_ACT_Q8_32, K_ACT_Q8_256, K_ACT_Q8_32S };

static inline size_t k__act_row_size(int act, int64_t n_in) {
    size_t b = 0;
    if (act == K_ACT_Q8_32) b = (size_t)n_in + (size_t)(n_in / 32) * 4;
    else if (act == K_ACT_Q8_32S) b = (size_t)n_in + (size_t)(n_in / 32) * (4 + 32);
    else if (act == K_ACT_Q8_256) b = (size_t)n_in + (size_t)(n_in / 256) * 4 + (size_t)(n_in / 16) * 2;
    return (b + 63) & ~(size_t)63;
}
static inline const int8_t *k__act_qs(const uint8_t *row) { return (const int8_t *)row; }
static inline const float *k__act_d(const uint8_t *row, int64_t n_in) { return (const float *)(row + n_in); }
static inline const int16_t *k__act_bsums(const uint8_t *row, int64_t n_in) {
    return (const int16_t *)(row + n_in + (n_in / 256) * 4);
}
static inline const int32_t *k__act_s8(const uint8_t *row, int64_t n_in) {
    return (const int32_t *)(row + n_in + (n_in / 32) * 4);
}

/* Which activation format a weight type's integer kernel wants (K_ACT_NONE: f32 rows). */
int k__act_for(int wtype);
/* Quantizes one f32 row of n_in into the format above (scalar; the same on every ISA). */
void k__act_quantize_row(int act, const float *x, int64_t n_in, uint8_t *row);

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
