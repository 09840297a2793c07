/* quant: reference (scalar, exact) dequantize and quantize for every supported type.
 *
 * The formats and the quantizers follow ggml's reference definitions bit for bit: the same
 * scale choice, the same rounding (nearest_int is round-half-even through the 1.5*2^23 trick,
 * Q8_0 uses roundf, Q4_0/Q4_1/Q5_0/Q5_1 truncate x+0.5), the same search for the K-quants
 * (make_qkx2_quants for Q4_K/Q5_K, make_qx_quants for Q6_K) and the same evaluation order of
 * the float products in the dequantizers, so files we write match what ggml would write and
 * the fast kernels in kernels/ can be checked against these functions exactly.
 */
#include "dtype.h"
#include "../common/cm_err.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

static inline float fp16(dt_f16 h) { return dt_f16_to_f32(h); }

/* Round to nearest, ties to even, for |f| <= 2^22 (adding 1.5*2^23 leaves the integer in the
 * low mantissa bits). Matches ggml's nearest_int. */
static inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* ---- 32-element formats ------------------------------------------------------------------ */

static void deq_q4_0(const blk_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = fp16(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (x[i].qs[j] & 0x0f) - 8, x1 = (x[i].qs[j] >> 4) - 8;
            y[j] = x0 * d;
            y[j + QK4_0 / 2] = x1 * d;
        }
    }
}

static void quant_q4_0(const float *x, blk_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK4_0; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -8, id = d ? 1.0f / d : 0.0f;
        y[i].d = dt_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK4_0 / 2] * id;
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x0 + 8.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x1 + 8.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void deq_q4_1(const blk_q4_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = fp16(x[i].d), m = fp16(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int x0 = x[i].qs[j] & 0x0f, x1 = x[i].qs[j] >> 4;
            y[j] = x0 * d + m;
            y[j + QK4_1 / 2] = x1 * d + m;
        }
    }
}

static void quant_q4_1(const float *x, blk_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15, id = d ? 1.0f / d : 0.0f;
        y[i].d = dt_f32_to_f16(d);
        y[i].m = dt_f32_to_f16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK4_1 / 2] - min) * id;
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x0 + 0.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x1 + 0.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void deq_q5_0(const blk_q5_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = fp16(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            const int x0 = ((x[i].qs[j] & 0x0f) | h0) - 16, x1 = ((x[i].qs[j] >> 4) | h1) - 16;
            y[j] = x0 * d;
            y[j + QK5_0 / 2] = x1 * d;
        }
    }
}

static void quant_q5_0(const float *x, blk_q5_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK5_0; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -16, id = d ? 1.0f / d : 0.0f;
        y[i].d = dt_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[j + QK5_0 / 2] * id;
            const uint8_t q0 = (uint8_t)imin(31, (int8_t)(x0 + 16.5f));
            const uint8_t q1 = (uint8_t)imin(31, (int8_t)(x1 + 16.5f));
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((uint32_t)(q0 & 0x10) >> 4) << j;
            qh |= ((uint32_t)(q1 & 0x10) >> 4) << (j + QK5_0 / 2);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void deq_q5_1(const blk_q5_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = fp16(x[i].d), m = fp16(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            const int x0 = (x[i].qs[j] & 0x0f) | h0, x1 = (x[i].qs[j] >> 4) | h1;
            y[j] = x0 * d + m;
            y[j + QK5_1 / 2] = x1 * d + m;
        }
    }
}

static void quant_q5_1(const float *x, blk_q5_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31, id = d ? 1.0f / d : 0.0f;
        y[i].d = dt_f32_to_f16(d);
        y[i].m = dt_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[j + QK5_1 / 2] - min) * id;
            const uint8_t q0 = (uint8_t)(x0 + 0.5f), q1 = (uint8_t)(x1 + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((uint32_t)(q0 & 0x10) >> 4) << j;
            qh |= ((uint32_t)(q1 & 0x10) >> 4) << (j + QK5_1 / 2);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void deq_q8_0(const blk_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = fp16(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = x[i].qs[j] * d;
    }
}

static void quant_q8_0(const float *x, blk_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        y[i].d = dt_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* ---- K-quants (super-blocks of 256) ------------------------------------------------------ */

#define KG (QK_K / 32) /* 32-element groups in a Q4_K/Q5_K super-block */

/* ggml's make_qkx2_quants (weighted least-squares fit x ~ scale * L + min, L in [0, nmax],
 * min <= 0, trying nstep+1 inverse scales around nmax/(max-min)), for the KG groups of a
 * super-block at once. Every group goes through exactly the scalar sequence of float operations
 * of the original, so the results are bit-identical; running the groups in lockstep turns one
 * long chain of dependent additions into KG independent ones, several times faster.
 * x, w: [KG][32]; L: [KG][32]; scale, the_min (= -min): [KG]. */
static void make_qkx2_quants_kg(int nmax, const float *x_in, const float (*w_in)[32], uint8_t *L_out, float *scale_out,
                                float *the_min, float rmin, float rdelta, int nstep) {
    enum { n = 32 };
    /* transposed, [element][group], so that the inner loops over groups are contiguous */
    float x[n][KG], w[n][KG];
    int32_t L[n][KG], Laux[n][KG];
    float min[KG], max[KG], sum_w[KG], sum_x[KG], iscale[KG], scale[KG], best[KG], dead_min[KG];
    int live[KG];
    for (int i = 0; i < n; i++)
        for (int g = 0; g < KG; g++) {
            x[i][g] = x_in[g * n + i];
            w[i][g] = w_in[g][i];
        }
    for (int g = 0; g < KG; g++) {
        min[g] = max[g] = x[0][g];
        sum_w[g] = w[0][g];
        sum_x[g] = sum_w[g] * x[0][g];
    }
    for (int i = 1; i < n; i++)
        for (int g = 0; g < KG; g++) {
            const float v = x[i][g];
            min[g] = v < min[g] ? v : min[g];
            max[g] = v > max[g] ? v : max[g];
            sum_w[g] += w[i][g];
            sum_x[g] += w[i][g] * v;
        }
    for (int g = 0; g < KG; g++) {
        if (min[g] > 0) min[g] = 0;
        live[g] = max[g] != min[g];
        dead_min[g] = min[g];
        if (!live[g]) max[g] = min[g] + 1; /* a constant group: computed on dummy values, then overridden */
        iscale[g] = nmax / (max[g] - min[g]);
        scale[g] = 1 / iscale[g];
        best[g] = 0;
    }
    for (int i = 0; i < n; i++)
        for (int g = 0; g < KG; g++) {
            const int l = nearest_int(iscale[g] * (x[i][g] - min[g]));
            L[i][g] = imax(0, imin(nmax, l));
            const float diff = scale[g] * L[i][g] + min[g] - x[i][g];
            best[g] += w[i][g] * (diff * diff);
        }
    for (int is = 0; is <= nstep && nstep >= 1; is++) {
        float sum_l[KG], sum_l2[KG], sum_xl[KG], ts[KG], tm[KG], mad[KG];
        int ok[KG];
        for (int g = 0; g < KG; g++) {
            iscale[g] = (rmin + rdelta * is + nmax) / (max[g] - min[g]);
            sum_l[g] = sum_l2[g] = sum_xl[g] = mad[g] = 0;
        }
        for (int i = 0; i < n; i++) {
            const float *xi = x[i], *wi = w[i];
            int32_t *li = Laux[i];
            for (int g = 0; g < KG; g++) {
                int l = nearest_int(iscale[g] * (xi[g] - min[g]));
                l = imax(0, imin(nmax, l));
                li[g] = l;
                const float wv = wi[g];
                sum_l[g] += wv * l;
                sum_l2[g] += wv * l * l;
                sum_xl[g] += wv * l * xi[g];
            }
        }
        for (int g = 0; g < KG; g++) {
            const float D = sum_w[g] * sum_l2[g] - sum_l[g] * sum_l[g];
            ok[g] = D > 0;
            ts[g] = tm[g] = 0;
            if (ok[g]) {
                ts[g] = (sum_w[g] * sum_xl[g] - sum_x[g] * sum_l[g]) / D;
                tm[g] = (sum_l2[g] * sum_x[g] - sum_l[g] * sum_xl[g]) / D;
                if (tm[g] > 0) {
                    tm[g] = 0;
                    ts[g] = sum_xl[g] / sum_l2[g];
                }
            }
        }
        for (int i = 0; i < n; i++) {
            const float *xi = x[i], *wi = w[i];
            const int32_t *li = Laux[i];
            for (int g = 0; g < KG; g++) {
                const float diff = ts[g] * li[g] + tm[g] - xi[g];
                mad[g] += wi[g] * (diff * diff);
            }
        }
        for (int g = 0; g < KG; g++)
            if (ok[g] && mad[g] < best[g]) {
                for (int i = 0; i < n; i++) L[i][g] = Laux[i][g];
                best[g] = mad[g];
                scale[g] = ts[g];
                min[g] = tm[g];
            }
    }
    for (int g = 0; g < KG; g++) {
        for (int i = 0; i < n; i++) L_out[g * n + i] = live[g] ? (uint8_t)L[i][g] : 0;
        the_min[g] = live[g] ? -min[g] : -dead_min[g];
        scale_out[g] = live[g] ? scale[g] : 0.f;
    }
}

static inline float qx_weight(const float *qw, int rmse_type, const float *x, int i) {
    if (qw) return qw[i];
    switch (rmse_type) {
    case 1: return x[i] * x[i];
    case 2: return 1;
    case 3: return fabsf(x[i]);
    default: return sqrtf(fabsf(x[i]));
    }
}

/* Symmetric fit x ~ scale * (L - nmax) with L - nmax in [-nmax, nmax-1]; rmse_type selects the
 * weights (1: x^2). Searches 18 inverse scales around -nmax/max. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; i++) {
            const int l = nearest_int(iscale * x[i]);
            L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
        }
        return 1 / iscale;
    }
    bool return_early = false;
    if (rmse_type < 0) {
        rmse_type = -rmse_type;
        return_early = true;
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = qx_weight(qw, rmse_type, x, i);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            const float w = qx_weight(qw, rmse_type, x, i);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* The 12 scale bytes of Q4_K/Q5_K hold 8 six-bit scales and 8 six-bit mins. */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void pack_scale_min_k4(uint8_t *scales, const float *sc, const float *mn, float inv_scale, float inv_min) {
    memset(scales, 0, K_SCALE_SIZE);
    for (int j = 0; j < QK_K / 32; j++) {
        /* narrowed to 8 bits before the clamp, as ggml does (matters only for a negative fit) */
        uint8_t ls = (uint8_t)nearest_int(inv_scale * sc[j]), lm = (uint8_t)nearest_int(inv_min * mn[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per 32-element group scale/min fit, 6-bit
 * quantization of scales and mins against the super-block's d/dmin, then final levels in L. */
static void kquant_scales_levels(const float *x, int nmax, float rmin, int nstep, uint8_t *L, dt_f16 *yd, dt_f16 *ydmin,
                                 uint8_t *yscales) {
    float weights[KG][32], mins[KG], scales[KG];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < KG; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[j][l] = av_x + fabsf(x[32 * j + l]);
    }
    make_qkx2_quants_kg(nmax, x, (const float (*)[32])weights, L, scales, mins, rmin, 0.1f, nstep);
    for (int j = 0; j < KG; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    pack_scale_min_k4(yscales, scales, mins, inv_scale, inv_min);
    *yd = dt_f32_to_f16(max_scale / 63.f);
    *ydmin = dt_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        get_scale_min_k4(j, yscales, &sc, &m);
        const float d = fp16(*yd) * sc;
        if (!d) continue;
        const float dm = fp16(*ydmin) * m;
        for (int ii = 0; ii < 32; ii++) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

static void deq_q4_K(const blk_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = fp16(x[i].d), min = fp16(x[i].dmin);
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
            uint8_t sc, m;
            get_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void quant_q4_K(const float *x, blk_q4_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        kquant_scales_levels(x, 15, -1.f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void deq_q5_K(const blk_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = fp16(x[i].d), min = fp16(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            get_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

static void quant_q5_K(const float *x, blk_q5_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        kquant_scales_levels(x, 31, -0.5f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

static void deq_q6_K(const blk_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = fp16(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

static void quant_q6_K(const float *x, blk_q6_K *y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, NULL);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            y[i].d = dt_f32_to_f16(0.f);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = dt_f32_to_f16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) y[i].scales[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = fp16(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf;
                const uint8_t q3 = L[j + l + 64] & 0xf, q4 = L[j + l + 96] & 0xf;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

static void deq_q8_K(const blk_q8_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K)
        for (int j = 0; j < QK_K; j++) y[j] = x[i].d * x[i].qs[j];
}

static void quant_q8_K(const float *x, blk_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            memset(y[i].bsums, 0, sizeof y[i].bsums);
            continue;
        }
        /* -127 rather than -128 keeps every code in [-127, 127] (the SIMD dot products rely on it) */
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)imin(127, nearest_int(iscale * x[j]));
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ---- FP8 E4M3 with a scale --------------------------------------------------------------- */

float dt_fp8_scale(const float *x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a; /* NaN compares false: skipped */
    }
    return amax / DT_E4M3_MAX;
}

void dt_fp8_encode(const float *x, int64_t n, float s, uint8_t *q) {
    if (!(s != 0.0f)) {
        memset(q, 0, (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) q[i] = dt_f32_to_e4m3_sat(x[i] / s);
}

void dt_fp8_decode(const uint8_t *q, int64_t n, float s, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = dt_e4m3_to_f32(q[i]) * s;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static int check_args(int type, int64_t n) {
    if (!dt_is_supported(type)) return CM_EUNSUPPORTED;
    if (n < 0 || (n && !dt_row_size(type, n))) return CM_EINVAL;
    return 0;
}

int dt_dequantize(int type, const void *src, float *dst, int64_t n) {
    int rc = check_args(type, n);
    if (rc) return rc;
    const int64_t nb = n / dt_block_size(type);
    switch (type) {
    case DT_F32: if (n) memcpy(dst, src, (size_t)n * 4); return 0;
    case DT_F16: for (int64_t i = 0; i < n; i++) dst[i] = dt_f16_to_f32(((const dt_f16 *)src)[i]); return 0;
    case DT_BF16: for (int64_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(((const dt_bf16 *)src)[i]); return 0;
    case DT_Q4_0: deq_q4_0(src, dst, nb); return 0;
    case DT_Q4_1: deq_q4_1(src, dst, nb); return 0;
    case DT_Q5_0: deq_q5_0(src, dst, nb); return 0;
    case DT_Q5_1: deq_q5_1(src, dst, nb); return 0;
    case DT_Q8_0: deq_q8_0(src, dst, nb); return 0;
    case DT_Q4_K: deq_q4_K(src, dst, nb); return 0;
    case DT_Q5_K: deq_q5_K(src, dst, nb); return 0;
    case DT_Q6_K: deq_q6_K(src, dst, nb); return 0;
    case DT_Q8_K: deq_q8_K(src, dst, nb); return 0;
    default: return CM_EUNSUPPORTED;
    }
}

int dt_quantize(int type, const float *src, void *dst, int64_t n) {
    int rc = check_args(type, n);
    if (rc) return rc;
    const int64_t nb = n / dt_block_size(type);
    switch (type) {
    case DT_F32: if (n) memcpy(dst, src, (size_t)n * 4); return 0;
    case DT_F16: for (int64_t i = 0; i < n; i++) ((dt_f16 *)dst)[i] = dt_f32_to_f16(src[i]); return 0;
    case DT_BF16: for (int64_t i = 0; i < n; i++) ((dt_bf16 *)dst)[i] = dt_f32_to_bf16(src[i]); return 0;
    case DT_Q4_0: quant_q4_0(src, dst, nb); return 0;
    case DT_Q4_1: quant_q4_1(src, dst, nb); return 0;
    case DT_Q5_0: quant_q5_0(src, dst, nb); return 0;
    case DT_Q5_1: quant_q5_1(src, dst, nb); return 0;
    case DT_Q8_0: quant_q8_0(src, dst, nb); return 0;
    case DT_Q4_K: quant_q4_K(src, dst, nb); return 0;
    case DT_Q5_K: quant_q5_K(src, dst, nb); return 0;
    case DT_Q6_K: quant_q6_K(src, dst, nb); return 0;
    case DT_Q8_K: quant_q8_K(src, dst, nb); return 0;
    default: return CM_EUNSUPPORTED;
    }
}
