/* matmul_avx512: AVX-512 (F, BW, VL, VNNI) matmul kernels, compiled per function with target
 * attributes and chosen at run time by matmul.c when cpuid reports the features. Types without
 * an entry here (Q4_K, Q6_K) run the AVX2 kernels on such machines.
 *
 * Same structure and invariance rule as matmul_avx2.c: tiles of R rows x T tokens, one
 * accumulator per (t, o) with an operation sequence independent of R and T.
 *   float types: 16 lanes, FMA; F16 through vcvtph2ps, BF16 by a 16-bit shift (exact; rounding
 *     x to bf16 for vdpbf16ps would cost ~3 significant digits);
 *   Q8_0 / Q4_0: per block of 32, vpdpbusd (u8 x s8 -> s32, 256-bit VL form) with the sign
 *     moved onto x, then one FMA with the block's scale.
 */
#include "kcpu_internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>

#define TGT "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define AVX512_FN static __attribute__((target(TGT)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(TGT)))

#define ROW_GROUP 16

AVX512_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX512_INLINE float hsum16(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8(_mm256_add_ps(lo, hi));
}

/* ---- float weights ------------------------------------------------------------------------ */

AVX512_INLINE __m512 load_w16(int type, const uint8_t *w, int64_t i) {
    if (type == DT_F32) return _mm512_loadu_ps((const float *)w + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (type == DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512_INLINE float load_w1(int type, const uint8_t *w, int64_t i) {
    if (type == DT_F32) return ((const float *)w)[i];
    if (type == DT_F16) return _cvtsh_ss(((const uint16_t *)w)[i]);
    return dt_bf16_to_f32(((const uint16_t *)w)[i]);
}

AVX512_INLINE void tile_float(int type, int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const uint8_t *w[4];
    const float *x[6];
    __m512 acc[4][6];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) w[r] = a->w + (size_t)(o + r) * a->w_row;
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) x[t] = (const float *)(a->x + (size_t)(t0 + t) * a->x_row);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t n = a->n_in, n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = load_w16(type, w[r], i);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_loadu_ps(x[t] + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            float s = hsum16(acc[r][t]);
            for (int64_t i = n16; i < n; i++) s = __builtin_fmaf(load_w1(type, w[r], i), x[t][i], s);
            a->y[(t0 + t) * a->ldy + o + r] = s;
        }
}

/* ---- Q8_0 and Q4_0 ------------------------------------------------------------------------- */

AVX512_INLINE __m256i load_q32(int type, const uint8_t *w, int64_t b, float *d) {
    if (type == DT_Q8_0) {
        const blk_q8_0 *q = (const blk_q8_0 *)w + b;
        *d = _cvtsh_ss(q->d);
        return _mm256_loadu_si256((const __m256i *)q->qs);
    }
    const blk_q4_0 *q = (const blk_q4_0 *)w + b;
    *d = _cvtsh_ss(q->d);
    __m128i bits = _mm_loadu_si128((const __m128i *)q->qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(bits, 4), bits);
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

AVX512_INLINE void tile_q32(int type, int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const uint8_t *w[4];
    const int8_t *xq[6];  /* T <= 4 is used; sized like tile_float's so every instantiation is valid */
    const float *xd[6];
    __m256 acc[4][6];
    const int64_t n = a->n_in, nb = n / 32;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) w[r] = a->w + (size_t)(o + r) * a->w_row;
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        const uint8_t *row = a->x + (size_t)(t0 + t) * a->x_row;
        xq[t] = k__act_qs(row);
        xd[t] = k__act_d(row, n);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wq[4], wa[4];
        float dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            wq[r] = load_q32(type, w[r], b, &dw[r]);
            wa[r] = _mm256_abs_epi8(wq[r]);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[t] + b * 32));
            float dx = xd[t][b];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa[r], _mm256_sign_epi8(xv, wq[r]));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * dx), _mm256_cvtepi32_ps(p), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[(t0 + t) * a->ldy + o + r] = hsum8(acc[r][t]);
}

/* ---- drivers ------------------------------------------------------------------------------- */

AVX512_INLINE void tile(int type, int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    if (type == DT_Q8_0 || type == DT_Q4_0) tile_q32(type, R, T, a, o, t0);
    else tile_float(type, R, T, a, o, t0);
}

/* T_MAX tokens per tile: 6 for float types (R = 4: 24 accumulators of 32 registers), 4 for
 * the integer kernels. Decode (one token) uses R = 4, prefill R = 4 then single rows. */
AVX512_INLINE void mm_any(int type, const k__mm_args *a, int64_t o0, int64_t o1) {
    const int tmax = (type == DT_Q8_0 || type == DT_Q4_0) ? 4 : 6;
    for (int64_t g = o0; g < o1; g += ROW_GROUP) {
        int64_t g1 = g + ROW_GROUP < o1 ? g + ROW_GROUP : o1;
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += tmax) {
            int64_t nt = a->n_tok - t0 < tmax ? a->n_tok - t0 : tmax;
            int64_t o = g;
            switch (nt) {
            case 1:
                for (; o + 4 <= g1; o += 4) tile(type, 4, 1, a, o, t0);
                for (; o < g1; o++) tile(type, 1, 1, a, o, t0);
                break;
            case 2:
                for (; o + 4 <= g1; o += 4) tile(type, 4, 2, a, o, t0);
                for (; o < g1; o++) tile(type, 1, 2, a, o, t0);
                break;
            case 3:
                for (; o + 4 <= g1; o += 4) tile(type, 4, 3, a, o, t0);
                for (; o < g1; o++) tile(type, 1, 3, a, o, t0);
                break;
            case 4:
                for (; o + 4 <= g1; o += 4) tile(type, 4, 4, a, o, t0);
                for (; o < g1; o++) tile(type, 1, 4, a, o, t0);
                break;
            case 5:
                for (; o + 4 <= g1; o += 4) tile(type, 4, 5, a, o, t0);
                for (; o < g1; o++) tile(type, 1, 5, a, o, t0);
                break;
            default:
                for (; o + 4 <= g1; o += 4) tile(type, 4, 6, a, o, t0);
                for (; o < g1; o++) tile(type, 1, 6, a, o, t0);
                break;
            }
        }
    }
}

AVX512_FN void mm_f32(const k__mm_args *a, int64_t o0, int64_t o1) { mm_any(DT_F32, a, o0, o1); }
AVX512_FN void mm_f16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_any(DT_F16, a, o0, o1); }
AVX512_FN void mm_bf16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_any(DT_BF16, a, o0, o1); }
AVX512_FN void mm_q8_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_any(DT_Q8_0, a, o0, o1); }
AVX512_FN void mm_q4_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_any(DT_Q4_0, a, o0, o1); }

const k__mm_fn k__mm_avx512[DT_COUNT] = {
    [DT_F32] = mm_f32, [DT_F16] = mm_f16, [DT_BF16] = mm_bf16, [DT_Q8_0] = mm_q8_0, [DT_Q4_0] = mm_q4_0,
};

#else
const k__mm_fn k__mm_avx512[DT_COUNT] = { 0 };
#endif
