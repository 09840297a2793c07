/* matmul_avx2: AVX2 + FMA + F16C matmul kernels, compiled per function with target attributes
 * (no global -m flags) and chosen at run time by matmul.c when cpuid reports the features.
 *
 * Every kernel computes tiles of R output rows x T tokens. Each (t, o) owns one accumulator
 * whose sequence of operations (8 float lanes, blocks in order, one fixed horizontal sum) is
 * the same for every R and T, so a row's result does not depend on n_tok or on which rows
 * share its tile (batch invariance). Decode (n_tok == 1) uses R = 4 for float types and R = 1
 * for quantized ones; prefill R = 2, T <= 4..6 so each weight block is loaded and unpacked
 * once per tile of tokens.
 *
 * Quantized weights: x was quantized by matmul.c to two int8 levels (per 32 in group order
 * for Q8_0/Q4_0, per 256 with 16-sums for Q4_K/Q6_K; kcpu_internal.h). Integer dot products
 * use maddubs (u8 x s8 -> s16 pairs) then madd (-> s32), once per level; for signed weights
 * the sign is moved onto x (sign trick).
 */
#include "kcpu_internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define AVX2_FN static __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* rows per group kept hot in cache while all token tiles pass over them */
#define ROW_GROUP 16

AVX2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE float f16_to_f32(dt_f16 h) { return _cvtsh_ss(h); }

/* ---- float weights: F32, F16, BF16, F8_E4M3 --------------------------------------------- */

/* F8_E4M3 codes become f16 bits (sign to bit 15, exponent and mantissa to bits 13..7): the
 * same value x 2^-8 exactly, subnormals included (the loader refuses NaN codes). The kernel
 * multiplies the sum back by 2^8 (exact) before the row's scale. */
AVX2_INLINE __m128i e4m3_to_f16x8(__m128i b8) {
    __m128i h = _mm_cvtepu8_epi16(b8);
    __m128i mag = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7f)), 7);
    return _mm_or_si128(mag, _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8));
}

AVX2_INLINE __m256 load_w8(int type, const uint8_t *w, int64_t i) {
    if (type == DT_F32) return _mm256_loadu_ps((const float *)w + i);
    if (type == DT_F8_E4M3) return _mm256_cvtph_ps(e4m3_to_f16x8(_mm_loadl_epi64((const __m128i *)(w + i))));
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (type == DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2_INLINE float load_w1(int type, const uint8_t *w, int64_t i) {
    if (type == DT_F32) return ((const float *)w)[i];
    if (type == DT_F16) return f16_to_f32(((const uint16_t *)w)[i]);
    if (type == DT_F8_E4M3) return f16_to_f32((dt_f16)(((w[i] & 0x7f) << 7) | ((w[i] & 0x80) << 8)));
    return dt_bf16_to_f32(((const uint16_t *)w)[i]);
}

AVX2_INLINE void tile_float(int type, int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const uint8_t *w[8];
    const float *x[6];
    __m256 acc[8][6];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) w[r] = a->w + (size_t)(o + r) * a->w_row;
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) x[t] = (const float *)(a->x + (size_t)(t0 + t) * a->x_row);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    const int64_t n = a->n_in, n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 wv[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = load_w8(type, w[r], i);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_loadu_ps(x[t] + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            float s = hsum8(acc[r][t]);
            for (int64_t i = n8; i < n; i++) s = __builtin_fmaf(load_w1(type, w[r], i), x[t][i], s);
            if (type == DT_F8_E4M3) s = (s * 256.0f) * a->scale[o + r];
            a->y[(t0 + t) * a->ldy + o + r] = s;
        }
}

AVX2_INLINE void mm_float(int type, const k__mm_args *a, int64_t o0, int64_t o1) {
    for (int64_t g = o0; g < o1; g += ROW_GROUP) {
        int64_t g1 = g + ROW_GROUP < o1 ? g + ROW_GROUP : o1;
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += 6) {
            int64_t nt = a->n_tok - t0 < 6 ? a->n_tok - t0 : 6;
            int64_t o = g;
            switch (nt) {
            case 1:
                for (; o + 4 <= g1; o += 4) tile_float(type, 4, 1, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 1, a, o, t0);
                break;
            case 2:
                for (; o + 2 <= g1; o += 2) tile_float(type, 2, 2, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 2, a, o, t0);
                break;
            case 3:
                for (; o + 2 <= g1; o += 2) tile_float(type, 2, 3, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 3, a, o, t0);
                break;
            case 4:
                for (; o + 2 <= g1; o += 2) tile_float(type, 2, 4, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 4, a, o, t0);
                break;
            case 5:
                for (; o + 2 <= g1; o += 2) tile_float(type, 2, 5, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 5, a, o, t0);
                break;
            default:
                for (; o + 2 <= g1; o += 2) tile_float(type, 2, 6, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 6, a, o, t0);
                break;
            }
        }
    }
}

AVX2_FN void mm_f32(const k__mm_args *a, int64_t o0, int64_t o1) { mm_float(DT_F32, a, o0, o1); }
AVX2_FN void mm_f16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_float(DT_F16, a, o0, o1); }
AVX2_FN void mm_bf16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_float(DT_BF16, a, o0, o1); }
AVX2_FN void mm_f8(const k__mm_args *a, int64_t o0, int64_t o1) { mm_float(DT_F8_E4M3, a, o0, o1); }

/* ---- Q8_0 and Q4_0: blocks of 32 against two-level activations in group order ---------- */

/* Elements 0..15 (*w1) and 16..31 (*w2) of block b in the low half and of block b + 1 in the
 * high half (both == b for one block in the low half: xmm use): signed for Q8_0, the unsigned
 * nibbles (value + 8) for Q4_0, whose over-count the activations' k takes off. */
AVX2_INLINE void load_q32x2(int type, const uint8_t *w, int64_t b, int64_t b1, __m256i *w1, __m256i *w2) {
    if (type == DT_Q8_0) {
        const blk_q8_0 *q = (const blk_q8_0 *)w;
        *w1 = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)q[b1].qs), _mm_loadu_si128((const __m128i *)q[b].qs));
        *w2 = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(q[b1].qs + 16)),
                               _mm_loadu_si128((const __m128i *)(q[b].qs + 16)));
        return;
    }
    const blk_q4_0 *q = (const blk_q4_0 *)w;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i bits = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)q[b1].qs), _mm_loadu_si128((const __m128i *)q[b].qs));
    *w1 = _mm256_and_si256(bits, m4);
    *w2 = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
}

/* Integer sums of one level: lane 4 i + j gets lane j of block i (8 values). */
AVX2_INLINE __m256i dot_q32(int type, __m256i w1, __m256i w2, __m256i a1, __m256i a2, __m256i x1, __m256i x2) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (type == DT_Q8_0) /* sign moved onto x: |w| * ±x fits maddubs' int16 pairs */
        return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x1, w1)), ones),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(a2, _mm256_sign_epi8(x2, w2)), ones));
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w1, x1), _mm256_maddubs_epi16(w2, x2)), ones);
}

AVX2_INLINE void tile_q32(int type, int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const uint8_t *w[4];
    const int8_t *xh[4], *xl[4];
    const float *xd[4];
    const int32_t *xk[4];
    __m256 acc[4][4];
    const int64_t n = a->n_in, nb = n / 32, nq = k__act_n32(n);
    const int bsz = type == DT_Q8_0 ? (int)sizeof(blk_q8_0) : (int)sizeof(blk_q4_0);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) w[r] = a->w + (size_t)(o + r) * a->w_row;
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *row = a->x + (size_t)(t0 + t) * a->x_row;
        xh[t] = k__act_qh(row);
        xl[t] = k__act_ql(row, nq);
        xd[t] = k__act_d(row, nq);
        xk[t] = k__act_k(row, nq);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    /* two blocks per step: halves at p (elements 0..15) and p + 64 (16..31) of their group.
     * A last odd block pairs with itself: the activations past n_in / 32 are zeros. */
    for (int64_t b = 0; b < nb; b += 2) {
        const int64_t b1 = b + 1 < nb ? b + 1 : b, p = 128 * (b / 4) + 32 * ((b % 4) / 2);
        __m256i w1[4], w2[4], a1[4], a2[4];
        __m256 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(w[r] + (b + 8) * bsz), _MM_HINT_T0);
            load_q32x2(type, w[r], b, b1, &w1[r], &w2[r]);
            if (type == DT_Q8_0) {
                a1[r] = _mm256_sign_epi8(w1[r], w1[r]);
                a2[r] = _mm256_sign_epi8(w2[r], w2[r]);
            }
            const dt_f16 *d0 = (const dt_f16 *)(w[r] + b * bsz), *d1 = (const dt_f16 *)(w[r] + b1 * bsz);
            dw[r] = _mm256_set_m128(_mm_set1_ps(f16_to_f32(*d1)), _mm_set1_ps(f16_to_f32(*d0)));
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i x1h = _mm256_loadu_si256((const __m256i *)(xh[t] + p));
            __m256i x2h = _mm256_loadu_si256((const __m256i *)(xh[t] + p + 64));
            __m256i x1l = _mm256_loadu_si256((const __m256i *)(xl[t] + p));
            __m256i x2l = _mm256_loadu_si256((const __m256i *)(xl[t] + p + 64));
            __m256 dx = _mm256_loadu_ps(xd[t] + 4 * b);
            __m256i k = _mm256_loadu_si256((const __m256i *)(xk[t] + 4 * b));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i hi = dot_q32(type, w1[r], w2[r], a1[r], a2[r], x1h, x2h);
                __m256i lo = dot_q32(type, w1[r], w2[r], a1[r], a2[r], x1l, x2l);
                __m256i s = _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo);
                if (type == DT_Q4_0) s = _mm256_add_epi32(s, k);
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), _mm256_cvtepi32_ps(s), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[(t0 + t) * a->ldy + o + r] = hsum8(acc[r][t]);
}

/* ---- Q4_K: super-blocks of 256 (8 x 32, 6-bit scales and mins) ---------------------------- */

typedef struct {
    float d, dmin;
    int16_t sc[8];     /* scales of the 8 sub-blocks */
    __m256i mins;      /* mins duplicated: m0 m0 m1 m1 ... m7 m7 (int16), against 16-sums */
} q4k_hdr;

AVX2_INLINE void q4k_header(const blk_q4_K *q, q4k_hdr *h) {
    uint8_t u[16];
    k__q4k_scales(q->scales, u);
    /* bytes 0..7: scales, 8..15: mins */
    __m128i sm = _mm_loadu_si128((const __m128i *)u);
    __m128i sc = _mm_cvtepu8_epi16(sm);
    _mm_storeu_si128((__m128i *)h->sc, sc);
    __m128i mn = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    h->mins = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
    h->d = f16_to_f32(q->d);
    h->dmin = f16_to_f32(q->dmin);
}

AVX2_INLINE void tile_q4K(int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const blk_q4_K *w[4];
    const int8_t *xh[4], *xl[4];
    const float *xd[4];
    const int16_t *bh[4], *bl[4];
    __m256 acc[4][4];
    const int64_t n = a->n_in, nb = n / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) w[r] = (const blk_q4_K *)(a->w + (size_t)(o + r) * a->w_row);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *row = a->x + (size_t)(t0 + t) * a->x_row;
        xh[t] = k__act_qh(row);
        xl[t] = k__act_ql(row, n);
        xd[t] = k__act_d(row, n);
        bh[t] = k__act_bsums(row, n);
        bl[t] = bh[t] + n / 16;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        q4k_hdr h[4];
        /* 256 sum(w qh) + sum(w ql) per lane: at most 256 * 3.9e6 + 3.9e6 < 2^31 */
        __m256i sumi[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(w[r] + b + 2), _MM_HINT_T0);
            q4k_header(&w[r][b], &h[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i lo[4], hi[4], sl[4], sh[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i bits = _mm256_loadu_si256((const __m256i *)(w[r][b].qs + 32 * j));
                lo[r] = _mm256_and_si256(bits, m4);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                sl[r] = _mm256_set1_epi16(h[r].sc[2 * j]);
                sh[r] = _mm256_set1_epi16(h[r].sc[2 * j + 1]);
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int64_t i = b * 256 + 64 * j;
                __m256i x0h = _mm256_loadu_si256((const __m256i *)(xh[t] + i));
                __m256i x1h = _mm256_loadu_si256((const __m256i *)(xh[t] + i + 32));
                __m256i x0l = _mm256_loadu_si256((const __m256i *)(xl[t] + i));
                __m256i x1l = _mm256_loadu_si256((const __m256i *)(xl[t] + i + 32));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m256i ph = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], x0h), sl[r]),
                                                  _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], x1h), sh[r]));
                    __m256i pl = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], x0l), sl[r]),
                                                  _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], x1l), sh[r]));
                    sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_add_epi32(_mm256_slli_epi32(ph, 8), pl));
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i sbh = _mm256_loadu_si256((const __m256i *)(bh[t] + b * 16));
            __m256i sbl = _mm256_loadu_si256((const __m256i *)(bl[t] + b * 16));
            float dx = xd[t][b] * (1.0f / 256.0f);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i m = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(h[r].mins, sbh), 8),
                                             _mm256_madd_epi16(h[r].mins, sbl));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(h[r].d * dx), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
                acc[r][t] = _mm256_fnmadd_ps(_mm256_set1_ps(h[r].dmin * dx), _mm256_cvtepi32_ps(m), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[(t0 + t) * a->ldy + o + r] = hsum8(acc[r][t]);
}

/* ---- Q6_K: super-blocks of 256 (16 x 16, 6-bit values, int8 scales) ------------------------ */

AVX2_INLINE void tile_q6K(int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const blk_q6_K *w[4];
    const int8_t *xh[4], *xl[4];
    const float *xd[4];
    const int16_t *bh[4], *bl[4];
    __m256 acc[4][4];
    const int64_t n = a->n_in, nb = n / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) w[r] = (const blk_q6_K *)(a->w + (size_t)(o + r) * a->w_row);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const uint8_t *row = a->x + (size_t)(t0 + t) * a->x_row;
        xh[t] = k__act_qh(row);
        xl[t] = k__act_ql(row, n);
        xd[t] = k__act_d(row, n);
        bh[t] = k__act_bsums(row, n);
        bl[t] = bh[t] + n / 16;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        /* the levels apart: 8-bit scales let 256 x the high sum overflow int32 */
        __m256i sumh[4][4], suml[4][4], sc16[4];
        float d[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch((const char *)(w[r] + b + 1), _MM_HINT_T0);
            _mm_prefetch((const char *)(w[r] + b + 1) + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)(w[r] + b + 1) + 128, _MM_HINT_T0);
            sc16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[r][b].scales));
            d[r] = f16_to_f32(w[r][b].d);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) sumh[r][t] = suml[r][t] = _mm256_setzero_si256();
        for (int hf = 0; hf < 2; hf++) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i q[4], s[4];
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const uint8_t *ql = w[r][b].ql + 64 * hf + 32 * (k & 1);
                    __m256i l = _mm256_loadu_si256((const __m256i *)ql);
                    __m256i hb = _mm256_loadu_si256((const __m256i *)(w[r][b].qh + 32 * hf));
                    l = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                    /* bits 2k, 2k+1 of qh to bits 4, 5 */
                    if (k == 0) hb = _mm256_slli_epi16(hb, 4);
                    else if (k == 1) hb = _mm256_slli_epi16(hb, 2);
                    else if (k == 3) hb = _mm256_srli_epi16(hb, 2);
                    q[r] = _mm256_or_si256(l, _mm256_and_si256(hb, m30));
                    const int g = 8 * hf + 2 * k; /* groups g (low 16 bytes), g + 1 (high) */
                    s[r] = _mm256_set_m128i(_mm_set1_epi16(w[r][b].scales[g + 1]), _mm_set1_epi16(w[r][b].scales[g]));
                }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const int64_t i = b * 256 + 128 * hf + 32 * k;
                    __m256i vh = _mm256_loadu_si256((const __m256i *)(xh[t] + i));
                    __m256i vl = _mm256_loadu_si256((const __m256i *)(xl[t] + i));
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) {
                        sumh[r][t] = _mm256_add_epi32(sumh[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], vh), s[r]));
                        suml[r][t] = _mm256_add_epi32(suml[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], vl), s[r]));
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i sbh = _mm256_loadu_si256((const __m256i *)(bh[t] + b * 16));
            __m256i sbl = _mm256_loadu_si256((const __m256i *)(bl[t] + b * 16));
            float dx = xd[t][b];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                /* values are stored +32: subtract 32 * sum_g sc_g * bsum_g */
                __m256i ch = _mm256_slli_epi32(_mm256_madd_epi16(sc16[r], sbh), 5);
                __m256i cl = _mm256_slli_epi32(_mm256_madd_epi16(sc16[r], sbl), 5);
                __m256 sh = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumh[r][t], ch));
                __m256 sl = _mm256_cvtepi32_ps(_mm256_sub_epi32(suml[r][t], cl));
                __m256 s = _mm256_fmadd_ps(sl, _mm256_set1_ps(1.0f / 256.0f), sh);
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * dx), s, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[(t0 + t) * a->ldy + o + r] = hsum8(acc[r][t]);
}

/* ---- drivers: tiles over a chunk of rows -------------------------------------------------- */

AVX2_INLINE void tile_q(int type, int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    if (type == DT_Q4_K) tile_q4K(R, T, a, o, t0);
    else if (type == DT_Q6_K) tile_q6K(R, T, a, o, t0);
    else tile_q32(type, R, T, a, o, t0);
}

AVX2_INLINE void mm_quant(int type, const k__mm_args *a, int64_t o0, int64_t o1) {
    for (int64_t g = o0; g < o1; g += ROW_GROUP) {
        int64_t g1 = g + ROW_GROUP < o1 ? g + ROW_GROUP : o1;
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += 4) {
            int64_t nt = a->n_tok - t0 < 4 ? a->n_tok - t0 : 4;
            int64_t o = g;
            switch (nt) {
            case 1: /* one row at a time: one sequential stream per thread (see matmul_avx512.c) */
                for (; o < g1; o++) tile_q(type, 1, 1, a, o, t0);
                break;
            case 2:
                for (; o + 2 <= g1; o += 2) tile_q(type, 2, 2, a, o, t0);
                for (; o < g1; o++) tile_q(type, 1, 2, a, o, t0);
                break;
            case 3:
                for (; o + 2 <= g1; o += 2) tile_q(type, 2, 3, a, o, t0);
                for (; o < g1; o++) tile_q(type, 1, 3, a, o, t0);
                break;
            default:
                for (; o + 2 <= g1; o += 2) tile_q(type, 2, 4, a, o, t0);
                for (; o < g1; o++) tile_q(type, 1, 4, a, o, t0);
                break;
            }
        }
    }
}

AVX2_FN void mm_q8_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_quant(DT_Q8_0, a, o0, o1); }
AVX2_FN void mm_q4_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_quant(DT_Q4_0, a, o0, o1); }
AVX2_FN void mm_q4_K(const k__mm_args *a, int64_t o0, int64_t o1) { mm_quant(DT_Q4_K, a, o0, o1); }
AVX2_FN void mm_q6_K(const k__mm_args *a, int64_t o0, int64_t o1) { mm_quant(DT_Q6_K, a, o0, o1); }

const k__mm_fn k__mm_avx2[DT_COUNT] = {
    [DT_F32] = mm_f32, [DT_F16] = mm_f16, [DT_BF16] = mm_bf16,
    [DT_Q8_0] = mm_q8_0, [DT_Q4_0] = mm_q4_0, [DT_Q4_K] = mm_q4_K, [DT_Q6_K] = mm_q6_K, [DT_F8_E4M3] = mm_f8,
};

#else
const k__mm_fn k__mm_avx2[DT_COUNT] = { 0 };
#endif
