/* kcpu: CPU compute kernels: a persistent thread pool, matrix multiplication over every weight
 * type (F32/F16/BF16 and quantized blocks), and row gathers. Elementwise ops (RMSNorm, RoPE,
 * SwiGLU, softmax) and attention over the paged KV cache live beside these in kernels/cpu/
 * with their own headers.
 *
 * ISA: AVX-512 (F+BW+VL+VNNI; float types, Q8_0, Q4_0, Q4_K; other types use the AVX2
 * kernels there), AVX2+FMA+F16C and portable scalar paths, chosen at run time from cpuid
 * (override with k_set_isa / env ARKA_ISA=scalar|avx2|avx512 for tests). Results are bitwise
 * reproducible for a given ISA; different ISAs differ in the last bits (float summation order).
 * Quantized types take the activations as two int8 levels per value (~16 significant bits;
 * kcpu_internal.h). F8_E4M3 weights are expanded exactly (to f16 bits on AVX2) against f32
 * activations, the row's scale applied after the sum (k_matmul_scaled).
 *
 *   k_pool *pool; k_pool_create(2, &pool);
 *   k_matmul(pool, w->data, w->type, n_in, n_out, x, n_tok, y);   // y = x · Wᵀ
 *   k_pool_destroy(pool);
 *
 * Threads: one pool per engine; k_pool_run / k_matmul are called from one thread at a time
 * (the engine's step thread), which takes part in the work.
 */
#ifndef K_CPU_H
#define K_CPU_H

#include <stddef.h>
#include <stdint.h>

enum k_isa { K_ISA_AUTO = 0, K_ISA_SCALAR, K_ISA_AVX2, K_ISA_AVX512 };

typedef struct k_pool k_pool;

/* Creates n_threads-1 workers (the caller is the n-th). Returns 0 or CM_ENOMEM/CM_EINVAL. */
int  k_pool_create(int n_threads, k_pool **out);
void k_pool_destroy(k_pool *p); /* accepts NULL */
int  k_pool_size(const k_pool *p);
/* Runs fn(ctx, ith, nth) for ith in [0, nth) across the pool and returns when all finished
 * (the caller runs ith = 0; what the workers wrote is visible on return). Allocates nothing.
 * Not reentrant: fn must not call k_pool_run / k_matmul on the same pool. Idle workers spin
 * ~50 us after a run, then sleep on a futex. */
void k_pool_run(k_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx);
/* Preallocates the pool's matmul scratch (quantized activations, dequantized rows) for calls
 * with n_tok <= max_n_tok and n_in <= max_n_in, so later k_matmul calls allocate nothing.
 * Without it the scratch is allocated at the first call and grown only when a larger shape
 * arrives. Returns 0 or CM_ENOMEM / CM_EINVAL. Same thread rules as k_matmul. */
int  k_pool_reserve(k_pool *p, int64_t max_n_tok, int64_t max_n_in);

/* The ISA in use (resolved, never AUTO), and an override (AUTO = detect). Setting an ISA the
 * CPU lacks falls back to the best available one. */
int  k_get_isa(void);
void k_set_isa(int isa);
const char *k_isa_name(int isa);

/* y[t][o] = sum_i W[o][i] * x[t][i]   for t < n_tok, o < n_out.
 * W: n_out rows, each dt_row_size(wtype, n_in) bytes (GGUF layout: ne = {n_in, n_out}).
 * x: [n_tok, n_in] f32; y: [n_tok, n_out] f32. n_in must be a multiple of the type's block
 * size. Allocates nothing per call (scratch for quantized activations lives in the pool).
 * Returns 0, CM_EUNSUPPORTED (type without a kernel), CM_EINVAL or CM_ENOMEM (the scratch
 * could not grow; see k_pool_reserve).
 * Batch invariance: y[t][o] is bitwise the same whatever n_tok, the other rows of x and the
 * pool's size (for a given ISA); work is split over output rows only. */
int k_matmul(k_pool *p, const void *W, int wtype, int64_t n_in, int64_t n_out,
             const float *x, int64_t n_tok, float *y);

/* The same with per-row scales, for F8_E4M3 weights (model.h): row o's values are
 * dt_e4m3_to_f32(code) * scale[o], and y[t][o] = scale[o] * (sum_i code_value[o][i] * x[t][i])
 * with the sum in f32 as the ISA's float kernels sum (the scale applied once, after the sum,
 * as a GEMM epilogue applies it). Codes must not be NaN (0x7f, 0xff; the loader refuses them).
 * scale: [n_out], required for F8_E4M3; must be NULL for every other type (then this is
 * k_matmul). Returns what k_matmul returns; CM_EINVAL for a scale missing or given where it
 * does not belong. */
int k_matmul_scaled(k_pool *p, const void *W, int wtype, const float *scale, int64_t n_in, int64_t n_out,
                    const float *x, int64_t n_tok, float *y);

/* Scalar double-accumulating reference of k_matmul (tests only; single-threaded, slow). */
int k_matmul_ref(const void *W, int wtype, int64_t n_in, int64_t n_out,
                 const float *x, int64_t n_tok, double *y);
/* ... and of k_matmul_scaled: the weights' values (code x scale, an f32 product) times x. */
int k_matmul_ref_scaled(const void *W, int wtype, const float *scale, int64_t n_in, int64_t n_out,
                        const float *x, int64_t n_tok, double *y);

/* out[j][:] = row ids[j] of table (n_rows rows of n_embd elements of `type`) as f32.
 * Returns 0, CM_EINVAL (bad sizes), CM_ERANGE (an id outside [0, n_rows)) or CM_EUNSUPPORTED. */
int k_get_rows(const void *table, int type, int64_t n_embd, int64_t n_rows,
               const int32_t *ids, int n, float *out);

#endif
