/* matmul_avx512: AVX-512 (F, BW, VL, VNNI) matmul kernels, compiled per function with target
 * attributes and chosen at run time by matmul.c when cpuid reports the features. Types without
 * an entry here (Q6_K) run the AVX2 kernels on such machines.
 *
 * Same structure and invariance rule as matmul_avx2.c: tiles of R rows x T tokens, one
 * accumulator per (t, o) with an operation sequence independent of R and T.
 *   float types: 16 lanes, FMA; F16 through vcvtph2ps, BF16 by a 16-bit shift (exact; rounding
 *     x to bf16 for vdpbf16ps would cost ~3 significant digits);
 *   Q8_0 / Q4_0: per group of 4 blocks (128 weights), two permutes gather the blocks' values
 *     into two 512-bit vectors (elements 0..15 and 16..31 of each block) made unsigned (Q8_0:
 *     + 128; Q4_0 nibbles are value + 8), and a third their 4 scales; per token and level of
 *     the activations (kcpu_internal.h) two vpdpbusd (u8 x s8 -> s32) give 16 lanes, 4 per
 *     block, complete sums with the activations' k added; then one int->float conversion, one
 *     multiply by the scales and one FMA serve all 4 blocks;
 *   Q4_K: see tile_q4K.
 */
#include "kcpu_internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define TGT "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
#define AVX512_FN static __attribute__((target(TGT)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(TGT)))

#define ROW_GROUP 16
/* Decode (one token) reads one row at a time, a single sequential stream per thread (four
 * rows interleaved left ~30 % of the read bandwidth unused: bench/RESULTS.md, "Engine (CPU)"),
 * and prefetches this many bytes ahead of it. */
#define PREFETCH_AHEAD 2048

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
    const int esz = type == DT_F32 ? 4 : 2;
    for (int64_t i = 0; i < n16; i += 16) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (T == 1 && !(i & (64 / esz - 1))) _mm_prefetch((const char *)w[r] + i * esz + PREFETCH_AHEAD, _MM_HINT_T0);
            wv[r] = load_w16(type, w[r], i);
        }
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

/* ---- Q8_0 and Q4_0: groups of 4 blocks against two-level activations -------------------- */

/* Word indices that gather a group's values and scales from two 64-byte loads: Q8_0 (blocks
 * of 34 bytes: 136 per group) from bytes 0..127 (elements 0..15 of each block) and 8..135
 * (16..31); Q4_0 (18 bytes: 72 per group) from bytes 0..63 and 8..71. Words of the first
 * load are 0..31, of the second 32..63. The scales land 4 times each (lanes 4 i .. 4 i + 3). */
#define W8_LO(i, k) (17 * (i) + 1 + (k))
#define W8_HI(i, k) (17 * (i) + 5 + (k))
#define W4_Q(i, k) (9 * (i) + 1 + (k) < 32 ? 9 * (i) + 1 + (k) : 9 * (i) + 1 + (k) + 28)
#define IDX8(F, i) F(i, 0), F(i, 1), F(i, 2), F(i, 3), F(i, 4), F(i, 5), F(i, 6), F(i, 7)
#define IDX32(F) IDX8(F, 0), IDX8(F, 1), IDX8(F, 2), IDX8(F, 3)
static const uint16_t idx_w8_lo[32] __attribute__((aligned(64))) = { IDX32(W8_LO) };
static const uint16_t idx_w8_hi[32] __attribute__((aligned(64))) = { IDX32(W8_HI) };
static const uint16_t idx_w4[32] __attribute__((aligned(64))) = { IDX32(W4_Q) };
static const uint16_t idx_d8[32] __attribute__((aligned(64))) = { 0, 0, 0, 0, 17, 17, 17, 17, 34, 34, 34, 34, 51, 51, 51, 51 };
static const uint16_t idx_d4[32] __attribute__((aligned(64))) = { 0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27 };

/* One group's weights, as vpdpbusd's unsigned operand: *w1 elements 0..15 of the 4 blocks
 * (bytes 16 i .. 16 i + 15 for block i), *w2 elements 16..31; Q8_0 values + 128, Q4_0 nibbles
 * (value + 8). *dw: the blocks' scales, lanes 4 i .. 4 i + 3 for block i. */
AVX512_INLINE void load_group(int type, const uint8_t *g, __m512i *w1, __m512i *w2, __m512 *dw) {
    __m512i a = _mm512_loadu_si512(g);
    if (type == DT_Q8_0) {
        __m512i b = _mm512_loadu_si512(g + 64), c = _mm512_loadu_si512(g + 8), e = _mm512_loadu_si512(g + 72);
        const __m512i sign = _mm512_set1_epi8((char)0x80);
        *w1 = _mm512_xor_si512(_mm512_permutex2var_epi16(a, _mm512_load_si512(idx_w8_lo), b), sign);
        *w2 = _mm512_xor_si512(_mm512_permutex2var_epi16(c, _mm512_load_si512(idx_w8_hi), e), sign);
        *dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(a, _mm512_load_si512(idx_d8), b)));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i b = _mm512_loadu_si512(g + 8);
    __m512i v = _mm512_permutex2var_epi16(a, _mm512_load_si512(idx_w4), b);
    *w1 = _mm512_and_si512(v, m4);
    *w2 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    *dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(idx_d4), a)));
}

AVX512_INLINE void tile_q32(int type, int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const uint8_t *w[4];
    const int8_t *xh[4], *xl[4];
    const float *xd[4];
    const int32_t *xk[4];
    __m512 acc[4][4];
    const int64_t n = a->n_in, nb = n / 32, nq = k__act_n32(n), ng = nb / 4;
    const int gsz = type == DT_Q8_0 ? 4 * (int)sizeof(blk_q8_0) : 4 * (int)sizeof(blk_q4_0);
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
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    /* a last group of 1..3 blocks is copied into zeroed storage: the missing blocks have zero
     * scales and zero activations, and add exactly 0 */
    uint8_t tail[4][4 * sizeof(blk_q8_0)];
    for (int64_t g = 0; g < (nb + 3) / 4; g++) {
        __m512i w1[4], w2[4];
        __m512 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *pg = w[r] + g * gsz;
            if (g == ng) {
                memset(tail[r], 0, sizeof tail[r]);
                memcpy(tail[r], pg, (size_t)(nb - 4 * ng) * (size_t)(gsz / 4));
                pg = tail[r];
            } else if (T == 1) {
                _mm_prefetch((const char *)pg + PREFETCH_AHEAD, _MM_HINT_T0);
                _mm_prefetch((const char *)pg + PREFETCH_AHEAD + 64, _MM_HINT_T0);
                if (type == DT_Q8_0) _mm_prefetch((const char *)pg + PREFETCH_AHEAD + 128, _MM_HINT_T0);
            }
            load_group(type, pg, &w1[r], &w2[r], &dw[r]);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const int64_t p = 128 * g;
            __m512i x1h = _mm512_loadu_si512(xh[t] + p), x2h = _mm512_loadu_si512(xh[t] + p + 64);
            __m512i x1l = _mm512_loadu_si512(xl[t] + p), x2l = _mm512_loadu_si512(xl[t] + p + 64);
            __m512i k = _mm512_loadu_si512(xk[t] + 16 * g);
            __m512 dx = _mm512_loadu_ps(xd[t] + 16 * g);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w1[r], x1h), w2[r], x2h);
                __m512i lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(k, w1[r], x1l), w2[r], x2l);
                __m512i s = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[(t0 + t) * a->ldy + o + r] = hsum16(acc[r][t]);
}

/* ---- Q4_K: super-blocks of 256 (8 sub-blocks of 32: 4-bit values, 6-bit scales and mins) --- */

/* Per chunk c (32 bytes of qs: sub-block 2c in the low nibbles, 2c + 1 in the high ones) one
 * 512-bit vector of both sub-blocks' values against 64 activations in natural order; per level
 * one vpdpbusd (|sum| <= 8 * 15 * 127, an int16), the two levels packed as int16 pairs (lo, hi)
 * and one vpdpwssd against (sc, 256 sc) adds sc (256 hi + lo) to the lane (lanes 0..7: scale
 * 2c, 8..15: 2c + 1; at most 4 * 63 * 257 * 15240 < 2^31). vpmulld instead ran at half the
 * speed. The mins go against the activations' 16-sums as in the AVX2 kernel. */
static const int32_t idx_q4k_sc[4][16] __attribute__((aligned(64))) = {
    { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1 }, { 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 },
    { 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5 }, { 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7 },
};

AVX512_INLINE void tile_q4K(int R, int T, const k__mm_args *a, int64_t o, int64_t t0) {
    const blk_q4_K *w[2];
    const int8_t *xh[4], *xl[4];
    const float *xd[4];
    const int16_t *bh[4], *bl[4];
    __m512 acc[2][4];
    const int64_t n = a->n_in, nb = n / 256;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i hi_nibbles = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
#pragma GCC unroll 2
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
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i sc[2], sumi[2][4];
        __m256i mins[2];
        float d[2], dmin[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            if (T == 1) {
                _mm_prefetch((const char *)(w[r] + b) + PREFETCH_AHEAD, _MM_HINT_T0);
                _mm_prefetch((const char *)(w[r] + b) + PREFETCH_AHEAD + 64, _MM_HINT_T0);
                _mm_prefetch((const char *)(w[r] + b) + PREFETCH_AHEAD + 128, _MM_HINT_T0);
            }
            uint8_t u[16];
            k__q4k_scales(w[r][b].scales, u);
            __m128i sm = _mm_loadu_si128((const __m128i *)u);
            sc[r] = _mm512_cvtepu8_epi32(sm);
            sc[r] = _mm512_or_si512(sc[r], _mm512_slli_epi32(sc[r], 24)); /* int16 pairs (sc, 256 sc) */
            mins[r] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
            d[r] = _cvtsh_ss(w[r][b].d);
            dmin[r] = _cvtsh_ss(w[r][b].dmin);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) sumi[r][t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i q[2], s[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w[r][b].qs + 32 * c)));
                q[r] = _mm512_and_si512(_mm512_srlv_epi16(v, hi_nibbles), m4);
                s[r] = _mm512_permutexvar_epi32(_mm512_load_si512(idx_q4k_sc[c]), sc[r]);
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int64_t i = 256 * b + 64 * c;
                __m512i vh = _mm512_loadu_si512(xh[t] + i), vl = _mm512_loadu_si512(xl[t] + i);
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) {
                    __m512i hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], vh);
                    __m512i lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], vl);
                    __m512i p = _mm512_mask_blend_epi16(0x55555555, _mm512_slli_epi32(hi, 16), lo);
                    sumi[r][t] = _mm512_dpwssd_epi32(sumi[r][t], p, s[r]);
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i sbh = _mm256_loadu_si256((const __m256i *)(bh[t] + b * 16));
            __m256i sbl = _mm256_loadu_si256((const __m256i *)(bl[t] + b * 16));
            float dx = xd[t][b] * (1.0f / 256.0f);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m256i m = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(mins[r], sbh), 8),
                                             _mm256_madd_epi16(mins[r], sbl));
                acc[r][t] = _mm512_fmadd_ps(_mm512_set1_ps(d[r] * dx), _mm512_cvtepi32_ps(sumi[r][t]), acc[r][t]);
                acc[r][t] = _mm512_fnmadd_ps(_mm512_set1_ps(dmin[r] * dx),
                                             _mm512_zextps256_ps512(_mm256_cvtepi32_ps(m)), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) a->y[(t0 + t) * a->ldy + o + r] = hsum16(acc[r][t]);
}

/* ---- activation quantization: bitwise the same as k__act_quantize_row (the same IEEE
 * operations in the same order) --------------------------------------------------------------- */

/* Both levels of 16 values as int32. x * id through the explicit-rounding form: the compiler
 * must not contract it into an FMA with the subtraction (the scalar version rounds it). */
AVX512_INLINE __m512i two_levels(__m512 x, __m512 id, __m512i *lo) {
    /* the rounding mode is an immediate: a macro, not a variable (-O0 builds refuse a variable) */
#define RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    __m512 v = _mm512_mul_round_ps(x, id, RN), h = _mm512_roundscale_ps(v, RN);
    __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(v, h), _mm512_set1_ps(256.0f)), RN);
#undef RN
    l = _mm512_min_ps(_mm512_max_ps(l, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    *lo = _mm512_cvtps_epi32(l);
    return _mm512_cvtps_epi32(h);
}

AVX512_INLINE float amax_of(const float *x, int n16) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n16; i++) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * i)));
    return _mm512_reduce_max_ps(m);
}

AVX512_FN void quantize_row(int act, const float *x, int64_t n_in, uint8_t *row) {
    const int64_t nq = k__act_nq(act, n_in);
    int8_t *qh = (int8_t *)row, *ql = (int8_t *)row + nq;
    float *d = (float *)(row + 2 * nq);
    if (act == K_ACT_256) {
        int16_t *bh = (int16_t *)(row + 2 * nq + (nq / 256) * 4), *bl = bh + nq / 16;
        for (int64_t b = 0; b < n_in / 256; b++) {
            float amax = amax_of(x + 256 * b, 16);
            __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            d[b] = amax / 127.0f;
            for (int i = 0; i < 16; i++) {
                __m512i l, h = two_levels(_mm512_loadu_ps(x + 256 * b + 16 * i), id, &l);
                _mm_storeu_si128((__m128i *)(qh + 256 * b + 16 * i), _mm512_cvtepi32_epi8(h));
                _mm_storeu_si128((__m128i *)(ql + 256 * b + 16 * i), _mm512_cvtepi32_epi8(l));
                bh[16 * b + i] = (int16_t)_mm512_reduce_add_epi32(h);
                bl[16 * b + i] = (int16_t)_mm512_reduce_add_epi32(l);
            }
        }
        return;
    }
    const int64_t nb = n_in / 32;
    int32_t *k = (int32_t *)(row + 2 * nq + nq / 2);
    const __m512i ones = _mm512_set1_epi8(1);
    const int shift = act == K_ACT_32_W8 ? 7 : 3; /* c = 128 or 8 */
    for (int64_t g = 0; g < nq / 128; g++) {
        int8_t *gh = qh + 128 * g, *gl = ql + 128 * g;
        for (int i = 0; i < 4; i++) {
            const int64_t b = 4 * g + i;
            __m128i h0 = _mm_setzero_si128(), h1 = h0, l0 = h0, l1 = h0;
            float db = 0.0f;
            if (b < nb) {
                float amax = amax_of(x + 32 * b, 2);
                __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
                db = amax / 127.0f / 256.0f;
                __m512i l, h = two_levels(_mm512_loadu_ps(x + 32 * b), id, &l);
                h0 = _mm512_cvtepi32_epi8(h);
                l0 = _mm512_cvtepi32_epi8(l);
                h = two_levels(_mm512_loadu_ps(x + 32 * b + 16), id, &l);
                h1 = _mm512_cvtepi32_epi8(h);
                l1 = _mm512_cvtepi32_epi8(l);
            }
            _mm_storeu_si128((__m128i *)(gh + 16 * i), h0);
            _mm_storeu_si128((__m128i *)(gh + 64 + 16 * i), h1);
            _mm_storeu_si128((__m128i *)(gl + 16 * i), l0);
            _mm_storeu_si128((__m128i *)(gl + 64 + 16 * i), l1);
            _mm_storeu_ps(d + 16 * g + 4 * i, _mm_set1_ps(db));
        }
        /* lane 4 i + j: the 8 values of lane j of block i, as the kernels' dot products see them */
        __m512i sh = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(gh)),
                                         ones, _mm512_loadu_si512(gh + 64));
        __m512i sl = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(gl)),
                                         ones, _mm512_loadu_si512(gl + 64));
        __m512i s = _mm512_add_epi32(_mm512_slli_epi32(sh, 8), sl);
        _mm512_storeu_si512(k + 16 * g, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, shift)));
    }
}

/* ---- drivers ------------------------------------------------------------------------------- */

/* Float types: up to 6 tokens per tile (R = 4: 24 accumulators of 32 registers). Decode (one
 * token) uses R = 1, prefill R = 4 then single rows. */
AVX512_INLINE void mm_float(int type, const k__mm_args *a, int64_t o0, int64_t o1) {
    for (int64_t g = o0; g < o1; g += ROW_GROUP) {
        int64_t g1 = g + ROW_GROUP < o1 ? g + ROW_GROUP : o1;
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += 6) {
            int64_t nt = a->n_tok - t0 < 6 ? a->n_tok - t0 : 6;
            int64_t o = g;
            switch (nt) {
            case 1:
                for (; o < g1; o++) tile_float(type, 1, 1, a, o, t0);
                break;
            case 2:
                for (; o + 4 <= g1; o += 4) tile_float(type, 4, 2, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 2, a, o, t0);
                break;
            case 3:
                for (; o + 4 <= g1; o += 4) tile_float(type, 4, 3, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 3, a, o, t0);
                break;
            case 4:
                for (; o + 4 <= g1; o += 4) tile_float(type, 4, 4, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 4, a, o, t0);
                break;
            case 5:
                for (; o + 4 <= g1; o += 4) tile_float(type, 4, 5, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 5, a, o, t0);
                break;
            default:
                for (; o + 4 <= g1; o += 4) tile_float(type, 4, 6, a, o, t0);
                for (; o < g1; o++) tile_float(type, 1, 6, a, o, t0);
                break;
            }
        }
    }
}

/* Q8_0 / Q4_0: up to 4 tokens per tile. Decode uses R = 1, prefill R = 4 then single rows. */
AVX512_INLINE void mm_q32(int type, const k__mm_args *a, int64_t o0, int64_t o1) {
    for (int64_t g = o0; g < o1; g += ROW_GROUP) {
        int64_t g1 = g + ROW_GROUP < o1 ? g + ROW_GROUP : o1;
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += 4) {
            int64_t nt = a->n_tok - t0 < 4 ? a->n_tok - t0 : 4;
            int64_t o = g;
            switch (nt) {
            case 1:
                for (; o < g1; o++) tile_q32(type, 1, 1, a, o, t0);
                break;
            case 2:
                for (; o + 4 <= g1; o += 4) tile_q32(type, 4, 2, a, o, t0);
                for (; o < g1; o++) tile_q32(type, 1, 2, a, o, t0);
                break;
            case 3:
                for (; o + 4 <= g1; o += 4) tile_q32(type, 4, 3, a, o, t0);
                for (; o < g1; o++) tile_q32(type, 1, 3, a, o, t0);
                break;
            default:
                for (; o + 4 <= g1; o += 4) tile_q32(type, 4, 4, a, o, t0);
                for (; o < g1; o++) tile_q32(type, 1, 4, a, o, t0);
                break;
            }
        }
    }
}

/* Q4_K: up to 4 tokens per tile. Decode uses R = 1, prefill R = 2 then single rows. */
AVX512_INLINE void mm_q4K(const k__mm_args *a, int64_t o0, int64_t o1) {
    for (int64_t g = o0; g < o1; g += ROW_GROUP) {
        int64_t g1 = g + ROW_GROUP < o1 ? g + ROW_GROUP : o1;
        for (int64_t t0 = 0; t0 < a->n_tok; t0 += 4) {
            int64_t nt = a->n_tok - t0 < 4 ? a->n_tok - t0 : 4;
            int64_t o = g;
            switch (nt) {
            case 1:
                for (; o < g1; o++) tile_q4K(1, 1, a, o, t0);
                break;
            case 2:
                for (; o + 2 <= g1; o += 2) tile_q4K(2, 2, a, o, t0);
                for (; o < g1; o++) tile_q4K(1, 2, a, o, t0);
                break;
            case 3:
                for (; o + 2 <= g1; o += 2) tile_q4K(2, 3, a, o, t0);
                for (; o < g1; o++) tile_q4K(1, 3, a, o, t0);
                break;
            default:
                for (; o + 2 <= g1; o += 2) tile_q4K(2, 4, a, o, t0);
                for (; o < g1; o++) tile_q4K(1, 4, a, o, t0);
                break;
            }
        }
    }
}

AVX512_FN void mm_f32(const k__mm_args *a, int64_t o0, int64_t o1) { mm_float(DT_F32, a, o0, o1); }
AVX512_FN void mm_f16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_float(DT_F16, a, o0, o1); }
AVX512_FN void mm_bf16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_float(DT_BF16, a, o0, o1); }
AVX512_FN void mm_q8_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_q32(DT_Q8_0, a, o0, o1); }
AVX512_FN void mm_q4_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_q32(DT_Q4_0, a, o0, o1); }
AVX512_FN void mm_q4_K(const k__mm_args *a, int64_t o0, int64_t o1) { mm_q4K(a, o0, o1); }

const k__mm_fn k__mm_avx512[DT_COUNT] = {
    [DT_F32] = mm_f32, [DT_F16] = mm_f16, [DT_BF16] = mm_bf16, [DT_Q8_0] = mm_q8_0, [DT_Q4_0] = mm_q4_0,
    [DT_Q4_K] = mm_q4_K,
};
const k__act_fn k__act_quantize_avx512 = quantize_row;

#else
const k__mm_fn k__mm_avx512[DT_COUNT] = { 0 };
const k__act_fn k__act_quantize_avx512 = 0;
#endif
