/* matmul_scalar: portable matmul kernels (the fallback on every CPU, and what the SIMD paths
 * are tested against through k_matmul_ref). Float types accumulate in 8 interleaved float
 * lanes (as the SIMD paths do); quantized types take integer dot products per block against
 * the activations quantized by matmul.c, then accumulate block results in float.
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

static float dot_q8_0(const void *wv, const uint8_t *xr, int64_t n) {
    const blk_q8_0 *w = wv;
    const int8_t *xq = k__act_qs(xr);
    const float *xd = k__act_d(xr, n);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += w[b].qs[i] * xq[b * 32 + i];
        acc += dt_f16_to_f32(w[b].d) * xd[b] * (float)s;
    }
    return acc;
}

static float dot_q4_0(const void *wv, const uint8_t *xr, int64_t n) {
    const blk_q4_0 *w = wv;
    const int8_t *xq = k__act_qs(xr);
    const float *xd = k__act_d(xr, n);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const int8_t *x = xq + b * 32;
        int s = 0;
        for (int i = 0; i < 16; i++)
            s += ((w[b].qs[i] & 0xf) - 8) * x[i] + ((w[b].qs[i] >> 4) - 8) * x[i + 16];
        acc += dt_f16_to_f32(w[b].d) * xd[b] * (float)s;
    }
    return acc;
}

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
    const int8_t *xq = k__act_qs(xr);
    const float *xd = k__act_d(xr, n);
    const int16_t *bs = k__act_bsums(xr, n);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; b++) {
        const int8_t *x = xq + b * 256;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, w[b].scales, &sc, &m);
            const uint8_t *q = w[b].qs + (j / 2) * 32;
            int shift = (j & 1) * 4, s = 0;
            for (int l = 0; l < 32; l++) s += ((q[l] >> shift) & 0xf) * x[j * 32 + l];
            sumi += sc * s;
            summ += m * (bs[b * 16 + 2 * j] + bs[b * 16 + 2 * j + 1]);
        }
        float d = dt_f16_to_f32(w[b].d) * xd[b], dmin = dt_f16_to_f32(w[b].dmin) * xd[b];
        acc += d * (float)sumi - dmin * (float)summ;
    }
    return acc;
}

static float dot_q6_K(const void *wv, const uint8_t *xr, int64_t n) {
    const blk_q6_K *w = wv;
    const int8_t *xq = k__act_qs(xr);
    const float *xd = k__act_d(xr, n);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; b++) {
        const int8_t *x = xq + b * 256;
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
        int sumi = 0;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q[g * 16 + l] * x[g * 16 + l];
            sumi += w[b].scales[g] * s;
        }
        acc += dt_f16_to_f32(w[b].d) * xd[b] * (float)sumi;
    }
    return acc;
}

typedef float (*dot_fn)(const void *w, const uint8_t *x, int64_t n);

static inline void mm_rows(const k__mm_args *a, int64_t o0, int64_t o1, dot_fn dot) {
    for (int64_t o = o0; o < o1; o++)
        for (int64_t t = 0; t < a->n_tok; t++)
            a->y[t * a->ldy + o] = dot(a->w + (size_t)o * a->w_row, a->x + (size_t)t * a->x_row, a->n_in);
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
    [DT_Q8_0] = mm_q8_0, [DT_Q4_0] = mm_q4_0, [DT_Q4_K] = mm_q4_K, [DT_Q6_K] = mm_q6_K,
};
