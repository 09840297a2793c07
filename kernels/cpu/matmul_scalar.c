/* matmul_scalar: portable matmul kernels (the fallback on every CPU, and what the SIMD paths
 * are tested against through k_matmul_ref). Float types accumulate in 8 interleaved float
 * lanes (as the SIMD paths do); quantized types take integer dot products per block against
 * both levels of the activations quantized by matmul.c (kcpu_internal.h), then accumulate
 * block results in float.
 * Every (t, o) is one call of a dot function: invariant to n_tok, row range and thread.
 */
#include "kcpu_internal.h"

#include <string.h>

static float sum8(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static float dot_f32(const void *wv, const uint8_t *xv, int64_t n) {
    const float *w = wv, *x = (const float *)xv;
    float l[8] = { 0 };
    for (int64_t i = 0; i < n; i += 8)
        for (int k = 0; k < 8 && i + k < n; k++) l[k] += w[i + k] * x[i + k];
    return sum8(l);
}

static float dot_f16(const void *wv, const uint8_t *xv, int64_t n) {
    const dt_f16 *w = wv;
    const float *x = (const float *)xv;
    float l[8] = { 0 };
    for (int64_t i = 0; i < n; i += 8)
        for (int k = 0; k < 8 && i + k < n; k++) l[k] += dt_f16_to_f32(w[i + k]) * x[i + k];
    return sum8(l);
}

static float dot_bf16(const void *wv, const uint8_t *xv, int64_t n) {
    const dt_bf16 *w = wv;
    const float *x = (const float *)xv;
    float l[8] = { 0 };
    for (int64_t i = 0; i < n; i += 8)
        for (int k = 0; k < 8 && i + k < n; k++) l[k] += dt_bf16_to_f32(w[i + k]) * x[i + k];
    return sum8(l);
}

/* Q8_0 / Q4_0 against two-level activations in group order: per block the exact integer
 * S = 256 sum(w qh) + sum(w ql), then one float product with both scales. */
static float dot_q8_0(const void *wv, const uint8_t *xr, int64_t n) {
    const blk_q8_0 *w = wv;
    const int64_t nq = k__act_n32(n);
    const int8_t *qh = k__act_qh(xr), *ql = k__act_ql(xr, nq);
    const float *xd = k__act_d(xr, nq);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        int sh = 0, sl = 0;
        for (int e = 0; e < 32; e++) {
            int64_t p = k__act_pos(b, e);
            sh += w[b].qs[e] * qh[p];
            sl += w[b].qs[e] * ql[p];
        }
        acc += dt_f16_to_f32(w[b].d) * xd[4 * b] * (float)(256 * sh + sl);
    }
    return acc;
}

static float dot_q4_0(const void *wv, const uint8_t *xr, int64_t n) {
    const blk_q4_0 *w = wv;
    const int64_t nq = k__act_n32(n);
    const int8_t *qh = k__act_qh(xr), *ql = k__act_ql(xr, nq);
    const float *xd = k__act_d(xr, nq);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        int sh = 0, sl = 0;
        for (int e = 0; e < 32; e++) {
            int v = (e < 16 ? w[b].qs[e] & 0xf : w[b].qs[e - 16] >> 4) - 8;
            int64_t p = k__act_pos(b, e);
            sh += v * qh[p];
            sl += v * ql[p];
        }
        acc += dt_f16_to_f32(w[b].d) * xd[4 * b] * (float)(256 * sh + sl);
    }
    return acc;
}

/* K-quants: the two levels' integer sums stay apart (256 x the high one could overflow int32
 * with 6-bit sub-block scales) and meet in float: s = hi + lo / 256. */
static float two_level(int hi, int lo) { return (float)hi + (float)lo * (1.0f / 256.0f); }

/* 6-bit scale and min j (0..7) of a Q4_K/Q5_K super-block */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static float dot_q4_K(const void *wv, const uint8_t *xr, int64_t n) {
    const blk_q4_K *w = wv;
    const float *xd = k__act_d(xr, n);
    const int16_t *bh = k__act_bsums(xr, n), *bl = bh + n / 16;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; b++) {
        const int8_t *xh = k__act_qh(xr) + b * 256, *xl = k__act_ql(xr, n) + b * 256;
        int sih = 0, sil = 0, smh = 0, sml = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, w[b].scales, &sc, &m);
            const uint8_t *q = w[b].qs + (j / 2) * 32;
            int shift = (j & 1) * 4, sh = 0, sl = 0;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0xf;
                sh += v * xh[j * 32 + l];
                sl += v * xl[j * 32 + l];
            }
            sih += sc * sh;
            sil += sc * sl;
            smh += m * (bh[b * 16 + 2 * j] + bh[b * 16 + 2 * j + 1]);
            sml += m * (bl[b * 16 + 2 * j] + bl[b * 16 + 2 * j + 1]);
        }
        float d = dt_f16_to_f32(w[b].d) * xd[b], dmin = dt_f16_to_f32(w[b].dmin) * xd[b];
        acc += d * two_level(sih, sil) - dmin * two_level(smh, sml);
    }
    return acc;
}

static float dot_q6_K(const void *wv, const uint8_t *xr, int64_t n) {
    const blk_q6_K *w = wv;
    const float *xd = k__act_d(xr, n);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; b++) {
        const int8_t *xh = k__act_qh(xr) + b * 256, *xl = k__act_ql(xr, n) + b * 256;
        int8_t q[256];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[b].ql + 64 * h, *qh = w[b].qh + 32 * h;
            int8_t *o = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (int8_t)(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
                o[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
                o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        int sih = 0, sil = 0;
        for (int g = 0; g < 16; g++) {
            int sh = 0, sl = 0;
            for (int l = 0; l < 16; l++) {
                sh += q[g * 16 + l] * xh[g * 16 + l];
                sl += q[g * 16 + l] * xl[g * 16 + l];
            }
            sih += w[b].scales[g] * sh;
            sil += w[b].scales[g] * sl;
        }
        acc += dt_f16_to_f32(w[b].d) * xd[b] * two_level(sih, sil);
    }
    return acc;
}

typedef float (*dot_fn)(const void *w, const uint8_t *x, int64_t n);

static inline void mm_rows(const k__mm_args *a, int64_t o0, int64_t o1, dot_fn dot) {
    for (int64_t o = o0; o < o1; o++)
        for (int64_t t = 0; t < a->n_tok; t++)
            a->y[t * a->ldy + o] = dot(a->w + (size_t)o * a->w_row, a->x + (size_t)t * a->x_row, a->n_in);
}

/* F8_E4M3: the codes' values summed as the float types are, then the row's scale. */
static void mm_f8(const k__mm_args *a, int64_t o0, int64_t o1) {
    const float *lut = k__e4m3_lut();
    for (int64_t o = o0; o < o1; o++)
        for (int64_t t = 0; t < a->n_tok; t++) {
            const uint8_t *w = a->w + (size_t)o * a->w_row;
            const float *x = (const float *)(a->x + (size_t)t * a->x_row);
            float l[8] = { 0 };
            for (int64_t i = 0; i < a->n_in; i += 8)
                for (int k = 0; k < 8 && i + k < a->n_in; k++) l[k] += lut[w[i + k]] * x[i + k];
            a->y[t * a->ldy + o] = sum8(l) * a->scale[o];
        }
}

static void mm_f32(const k__mm_args *a, int64_t o0, int64_t o1) { mm_rows(a, o0, o1, dot_f32); }
static void mm_f16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_rows(a, o0, o1, dot_f16); }
static void mm_bf16(const k__mm_args *a, int64_t o0, int64_t o1) { mm_rows(a, o0, o1, dot_bf16); }
static void mm_q8_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_rows(a, o0, o1, dot_q8_0); }
static void mm_q4_0(const k__mm_args *a, int64_t o0, int64_t o1) { mm_rows(a, o0, o1, dot_q4_0); }
static void mm_q4_K(const k__mm_args *a, int64_t o0, int64_t o1) { mm_rows(a, o0, o1, dot_q4_K); }
static void mm_q6_K(const k__mm_args *a, int64_t o0, int64_t o1) { mm_rows(a, o0, o1, dot_q6_K); }

const k__mm_fn k__mm_scalar[DT_COUNT] = {
    [DT_F32] = mm_f32, [DT_F16] = mm_f16, [DT_BF16] = mm_bf16,
    [DT_Q8_0] = mm_q8_0, [DT_Q4_0] = mm_q4_0, [DT_Q4_K] = mm_q4_K, [DT_Q6_K] = mm_q6_K, [DT_F8_E4M3] = mm_f8,
};
