/* Reference quantization (model/quant.c) and the f16/bf16 conversions (model/dtype.c):
 * (a) hand-built blocks dequantize to known values exactly,
 * (b) quantize -> dequantize of random data stays within a per-type error bound,
 * (c) re-quantizing what the quantizer produced gives the same bytes (where the format allows),
 * (d) f16/bf16 edge cases (subnormals, inf, NaN, ties). */
#include "t.h"
#include "common/cm_err.h"
#include "model/dtype.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(void) { return ((rng_next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float rng_normal(void) { return (float)(sqrt(-2 * log(rng_unif())) * cos(6.283185307179586 * rng_unif())); }

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Compares n floats bitwise-equal (as values; -0 == 0 is not accepted silently). */
static int same_floats(const float *a, const float *b, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (f2u(a[i]) != f2u(b[i])) {
            fprintf(stderr, "  %s: element %d is %.9g, expected %.9g\n", what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

/* ---- (a) known blocks ------------------------------------------------------------------- */

static void poison(float *y, int n) { for (int i = 0; i < n; i++) y[i] = NAN; }

static void test_known_q4_0(void) {
    blk_q4_0 b = { .d = 0x3800 }; /* 0.5 */
    float want[32], got[32];
    for (int j = 0; j < 16; j++) {
        b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        want[j] = (j - 8) * 0.5f;
        want[j + 16] = (7 - j) * 0.5f;
    }
    poison(got, 32);
    T_EQ_INT(dt_dequantize(DT_Q4_0, &b, got, 32), 0);
    T_CHECK(same_floats(got, want, 32, "q4_0"));
}

static void test_known_q4_1(void) {
    blk_q4_1 b = { .d = 0x3400, .m = 0xbc00 }; /* 0.25, -1 */
    float want[32], got[32];
    for (int j = 0; j < 16; j++) {
        int lo = (j * 5) & 15, hi = (j * 3 + 1) & 15;
        b.qs[j] = (uint8_t)(lo | (hi << 4));
        want[j] = lo * 0.25f - 1;
        want[j + 16] = hi * 0.25f - 1;
    }
    poison(got, 32);
    T_EQ_INT(dt_dequantize(DT_Q4_1, &b, got, 32), 0);
    T_CHECK(same_floats(got, want, 32, "q4_1"));
}

/* 5-bit values v[0..31]: low nibbles in qs (first half low, second half high), bit 4 in qh bit j. */
static void pack5(const int *v, uint8_t *qs, uint8_t *qh4) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((v[j] & 15) | ((v[j + 16] & 15) << 4));
    for (int j = 0; j < 32; j++) qh |= (uint32_t)((v[j] >> 4) & 1) << j;
    qh4[0] = qh & 0xff; qh4[1] = (qh >> 8) & 0xff; qh4[2] = (qh >> 16) & 0xff; qh4[3] = qh >> 24;
}

static void test_known_q5(void) {
    int v[32];
    for (int j = 0; j < 32; j++) v[j] = (j * 7 + 3) % 32;
    blk_q5_0 b0 = { .d = 0x4000 }; /* 2 */
    pack5(v, b0.qs, b0.qh);
    float want[32], got[32];
    for (int j = 0; j < 32; j++) want[j] = (v[j] - 16) * 2.0f;
    poison(got, 32);
    T_EQ_INT(dt_dequantize(DT_Q5_0, &b0, got, 32), 0);
    T_CHECK(same_floats(got, want, 32, "q5_0"));

    blk_q5_1 b1 = { .d = 0x3000, .m = 0x4200 }; /* 0.125, 3 */
    pack5(v, b1.qs, b1.qh);
    for (int j = 0; j < 32; j++) want[j] = v[j] * 0.125f + 3;
    poison(got, 32);
    T_EQ_INT(dt_dequantize(DT_Q5_1, &b1, got, 32), 0);
    T_CHECK(same_floats(got, want, 32, "q5_1"));
}

static void test_known_q8_0(void) {
    blk_q8_0 b[2] = { { .d = 0x3000 }, { .d = 0xc400 } }; /* 0.125, -4 */
    float want[64], got[64];
    for (int j = 0; j < 32; j++) {
        b[0].qs[j] = (int8_t)(j * 8 - 128);
        b[1].qs[j] = (int8_t)(127 - j);
        want[j] = (j * 8 - 128) * 0.125f;
        want[32 + j] = (127 - j) * -4.0f;
    }
    poison(got, 64);
    T_EQ_INT(dt_dequantize(DT_Q8_0, b, got, 64), 0);
    T_CHECK(same_floats(got, want, 64, "q8_0"));
}

/* The 12 scale bytes of Q4_K/Q5_K, packed from the format's description: bytes 0-3 hold sc[0..3]
 * in their low 6 bits and the top 2 bits of sc[4..7]; bytes 4-7 the same for the mins; bytes
 * 8-11 the low nibbles of sc[4..7] (low) and m[4..7] (high). */
static void pack_k4_scales(const int *sc, const int *m, uint8_t *out) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void test_known_q4_K_q5_K(void) {
    int sc[8] = { 1, 63, 17, 32, 48, 5, 60, 33 }, m[8] = { 0, 9, 63, 31, 16, 47, 2, 40 };
    int q[256];
    for (int e = 0; e < 256; e++) q[e] = (e * 13 + e / 7) % 32;
    blk_q4_K b4;
    memset(&b4, 0, sizeof b4);
    b4.d = 0x3c00;    /* 1 */
    b4.dmin = 0x3800; /* 0.5 */
    pack_k4_scales(sc, m, b4.scales);
    float want[256], got[256];
    for (int e = 0; e < 256; e++) {
        int g = e / 32, chunk = e / 64, l = e % 32, v = q[e] & 15;
        b4.qs[chunk * 32 + l] |= (uint8_t)(g % 2 ? v << 4 : v);
        want[e] = (float)(sc[g] * v) - 0.5f * m[g];
    }
    poison(got, 256);
    T_EQ_INT(dt_dequantize(DT_Q4_K, &b4, got, 256), 0);
    T_CHECK(same_floats(got, want, 256, "q4_K"));

    blk_q5_K b5;
    memset(&b5, 0, sizeof b5);
    b5.d = 0x3400;    /* 0.25 */
    b5.dmin = 0x4000; /* 2 */
    pack_k4_scales(sc, m, b5.scales);
    for (int e = 0; e < 256; e++) {
        int g = e / 32, chunk = e / 64, l = e % 32, v = q[e];
        b5.qs[chunk * 32 + l] |= (uint8_t)(g % 2 ? (v & 15) << 4 : (v & 15));
        if (v & 16) b5.qh[l] |= (uint8_t)(1 << g);
        want[e] = 0.25f * sc[g] * v - 2.0f * m[g];
    }
    poison(got, 256);
    T_EQ_INT(dt_dequantize(DT_Q5_K, &b5, got, 256), 0);
    T_CHECK(same_floats(got, want, 256, "q5_K"));
}

static void test_known_q6_K(void) {
    blk_q6_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800; /* 0.5 */
    for (int s = 0; s < 16; s++) b.scales[s] = (int8_t)(s % 2 ? -(s * 8) : s * 8 + 1);
    float want[256], got[256];
    for (int e = 0; e < 256; e++) {
        int v = (e * 29 + 5) % 64; /* 6-bit code, value v - 32 */
        int h = e / 128, r = e % 128, qd = r / 32, l = r % 32;
        uint8_t *ql = &b.ql[h * 64 + (qd % 2) * 32 + l];
        *ql |= (uint8_t)(qd < 2 ? (v & 15) : (v & 15) << 4);
        b.qh[h * 32 + l] |= (uint8_t)((v >> 4) << (2 * qd));
        want[e] = 0.5f * b.scales[e / 16] * (v - 32);
    }
    poison(got, 256);
    T_EQ_INT(dt_dequantize(DT_Q6_K, &b, got, 256), 0);
    T_CHECK(same_floats(got, want, 256, "q6_K"));
}

static void test_known_q8_K(void) {
    blk_q8_K b;
    memset(&b, 0, sizeof b);
    b.d = 0.25f;
    float want[256], got[256];
    for (int e = 0; e < 256; e++) {
        b.qs[e] = (int8_t)(e - 128);
        want[e] = 0.25f * (e - 128);
    }
    poison(got, 256);
    T_EQ_INT(dt_dequantize(DT_Q8_K, &b, got, 256), 0);
    T_CHECK(same_floats(got, want, 256, "q8_K"));
}

static void test_known_float(void) {
    dt_f16 h[4] = { 0x3c00, 0xc000, 0x0001, 0x7bff };
    float want_h[4] = { 1, -2, 5.9604644775390625e-08f, 65504 }, got[4];
    T_EQ_INT(dt_dequantize(DT_F16, h, got, 4), 0);
    T_CHECK(same_floats(got, want_h, 4, "f16"));
    dt_bf16 b[3] = { 0x3f80, 0xc040, 0x0001 };
    float want_b[3] = { 1, -3, u2f(0x00010000) };
    T_EQ_INT(dt_dequantize(DT_BF16, b, got, 3), 0);
    T_CHECK(same_floats(got, want_b, 3, "bf16"));
    float f[3] = { 1.5f, -0.0f, INFINITY };
    T_EQ_INT(dt_dequantize(DT_F32, f, got, 3), 0);
    T_CHECK(same_floats(got, f, 3, "f32"));
}

/* ---- (b) round trip, (c) idempotence ---------------------------------------------------- */

typedef struct { int type; double max_rel_rmse; int idempotent; } rt_case;

/* Bounds are about 1.5x the measured relative RMSE on N(0,1) data (see the figures printed). */
static const rt_case rt_cases[] = {
    { DT_F32, 0.0, 1 },      { DT_F16, 3.2e-4, 1 },     { DT_BF16, 3e-3, 1 },    { DT_Q8_0, 0.010, 1 },
    { DT_Q4_0, 0.13, 1 },    { DT_Q4_1, 0.11, 0 },    { DT_Q5_0, 0.065, 1 },   { DT_Q5_1, 0.055, 0 },
    { DT_Q4_K, 0.11, 0 },    { DT_Q5_K, 0.055, 0 },   { DT_Q6_K, 0.028, 0 },   { DT_Q8_K, 0.010, 0 },
};

#define RT_N (256 * 64)

static void test_roundtrip(const rt_case *c) {
    const char *name = dt_name(c->type);
    size_t rs = dt_row_size(c->type, RT_N);
    T_CHECK(rs > 0);
    float *x = malloc(RT_N * sizeof *x), *y = malloc(RT_N * sizeof *y), *y2 = malloc(RT_N * sizeof *y2);
    uint8_t *q = malloc(rs), *q2 = malloc(rs);
    /* Mix of scales across blocks (including one all-zero block and one constant block) so that
     * tiny and large magnitudes both go through the quantizers. */
    for (int i = 0; i < RT_N; i++) {
        int blk = i / 256;
        float s = blk % 4 == 0 ? 1.0f : blk % 4 == 1 ? 0.01f : blk % 4 == 2 ? 30.0f : 1.0f;
        x[i] = blk == 5 ? 0.0f : blk == 6 ? 0.75f : rng_normal() * s + (blk % 8 == 7 ? 0.5f * s : 0);
    }
    memset(q, 0xa5, rs);
    poison(y, RT_N);
    T_EQ_INT(dt_quantize(c->type, x, q, RT_N), 0);
    T_EQ_INT(dt_dequantize(c->type, q, y, RT_N), 0);
    /* error relative to the signal, per 256-block so that the 0.01 blocks count as much as the 30 */
    double worst = 0, sum_rel = 0;
    int nblk = 0;
    for (int b = 0; b < RT_N / 256; b++) {
        double se = 0, ss = 0;
        for (int i = b * 256; i < (b + 1) * 256; i++) {
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
            ss += (double)x[i] * x[i];
        }
        if (ss == 0) {
            T_CHECKF(se == 0, "%s: zero block does not come back as zeros", name);
            continue;
        }
        double rel = sqrt(se / ss);
        if (rel > worst) worst = rel;
        sum_rel += rel;
        nblk++;
    }
    double mean_rel = sum_rel / nblk;
    printf("  %-5s relative rmse: mean %.5f, worst block %.5f (bound %.4f)\n", name, mean_rel, worst, c->max_rel_rmse);
    T_CHECKF(mean_rel <= c->max_rel_rmse, "%s: mean relative rmse %g > %g", name, mean_rel, c->max_rel_rmse);
    T_CHECKF(worst <= 1.6 * c->max_rel_rmse, "%s: worst block relative rmse %g", name, worst);
    /* The constant block must come back close too (a degenerate case for min/max fits). */
    double cerr = 0;
    for (int i = 6 * 256; i < 7 * 256; i++) cerr = fmax(cerr, fabs(y[i] - 0.75));
    T_CHECKF(cerr <= 0.75 * (c->max_rel_rmse * 2 + 1e-3), "%s: constant block error %g", name, cerr);

    /* (c) quantize(dequantize(q)) */
    memset(q2, 0x5a, rs);
    T_EQ_INT(dt_quantize(c->type, y, q2, RT_N), 0);
    if (c->idempotent) {
        T_CHECKF(memcmp(q, q2, rs) == 0, "%s: re-quantizing the dequantized blocks changed the bytes", name);
    } else {
        /* The fitted formats may pick another (scale, min) pair for data already on a grid, and
         * Q8_K flips the sign of d and every code when the block holds both -127 and +127; the
         * values must then still agree far more closely than a fresh quantization error. */
        poison(y2, RT_N);
        T_EQ_INT(dt_dequantize(c->type, q2, y2, RT_N), 0);
        double se = 0, ss = 0;
        size_t same = 0;
        for (size_t i = 0; i < rs; i++) same += q[i] == q2[i];
        for (int i = 0; i < RT_N; i++) {
            se += (double)(y2[i] - y[i]) * (y2[i] - y[i]);
            ss += (double)y[i] * y[i];
        }
        printf("  %-5s re-quantize: %.1f%% bytes equal, relative rmse %.5f\n", name, 100.0 * same / rs, sqrt(se / ss));
        T_CHECKF(sqrt(se / ss) < c->max_rel_rmse / 2, "%s: re-quantized values drift by %g", name, sqrt(se / ss));
    }
    free(x); free(y); free(y2); free(q); free(q2);
}

/* Q8_K's bsums are the sums of each 16 codes; the codes are within [-127, 127]. */
static void test_q8_K_bsums(void) {
    float x[512];
    blk_q8_K b[2];
    for (int i = 0; i < 512; i++) x[i] = rng_normal() * (i < 256 ? 1 : 1e-3f);
    x[17] = -9;   /* the extreme always maps to -127: d = -max/127 */
    x[300] = 0.5f; /* second block: a positive extreme, so d < 0 there */
    T_EQ_INT(dt_quantize(DT_Q8_K, x, b, 512), 0);
    int ok = 1, maxq = 0;
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) {
                s += b[k].qs[16 * j + i];
                if (abs(b[k].qs[16 * j + i]) > maxq) maxq = abs(b[k].qs[16 * j + i]);
            }
            ok &= s == b[k].bsums[j];
        }
    T_CHECK(ok);
    T_EQ_INT(maxq, 127);
    T_EQ_INT(b[0].qs[17], -127);
    T_CHECK(b[0].d > 0);
    T_EQ_INT(b[1].qs[300 - 256], -127);
    T_CHECK(b[1].d < 0);
    T_CHECK(fabsf(b[0].d * -127 - x[17]) < 1e-5f);
}

/* Exact grid data: values that a format represents exactly come back exactly. */
static void test_exact_grid(void) {
    float x[32], y[32];
    blk_q8_0 q8;
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) * 0.25f;
    x[3] = -127 * 0.25f; /* amax -> d = 0.25 exactly */
    T_EQ_INT(dt_quantize(DT_Q8_0, x, &q8, 32), 0);
    T_EQ_INT(q8.d, 0x3400);
    T_EQ_INT(dt_dequantize(DT_Q8_0, &q8, y, 32), 0);
    T_CHECK(same_floats(y, x, 32, "q8_0 grid"));

    blk_q4_0 q4;
    for (int i = 0; i < 32; i++) x[i] = (float)((i % 16) - 8) * 0.5f; /* max |x| = 4 at -4: d = 0.5 */
    T_EQ_INT(dt_quantize(DT_Q4_0, x, &q4, 32), 0);
    T_EQ_INT(q4.d, 0x3800);
    T_EQ_INT(q4.qs[0] & 15, 0);
    T_EQ_INT(dt_dequantize(DT_Q4_0, &q4, y, 32), 0);
    T_CHECK(same_floats(y, x, 32, "q4_0 grid"));
    /* the extreme is positive: d becomes negative and the extreme maps to code 0 */
    for (int i = 0; i < 32; i++) x[i] = -x[i];
    T_EQ_INT(dt_quantize(DT_Q4_0, x, &q4, 32), 0);
    T_EQ_INT(q4.d, 0xb800);
    T_EQ_INT(dt_dequantize(DT_Q4_0, &q4, y, 32), 0);
    T_CHECK(same_floats(y, x, 32, "q4_0 negated grid"));
}

static void test_args(void) {
    float x[64] = { 0 };
    uint8_t q[4096];
    T_EQ_INT(dt_quantize(DT_Q4_0, x, q, 31), CM_EINVAL);
    T_EQ_INT(dt_quantize(DT_Q4_K, x, q, 32), CM_EINVAL);
    T_EQ_INT(dt_dequantize(DT_Q8_0, q, x, -32), CM_EINVAL);
    T_EQ_INT(dt_quantize(DT_Q2_K, x, q, 256), CM_EUNSUPPORTED);
    T_EQ_INT(dt_dequantize(DT_I32, q, x, 4), CM_EUNSUPPORTED);
    T_EQ_INT(dt_dequantize(12345, q, x, 4), CM_EUNSUPPORTED);
    T_EQ_INT(dt_dequantize(-1, q, x, 4), CM_EUNSUPPORTED);
    T_EQ_INT(dt_quantize(DT_Q8_0, x, q, 0), 0);
}

/* ---- (d) f16 / bf16 ------------------------------------------------------------------------ */

static void test_f16(void) {
    /* exact values */
    T_EQ_INT(dt_f32_to_f16(1.0f), 0x3c00);
    T_EQ_INT(dt_f32_to_f16(-2.0f), 0xc000);
    T_EQ_INT(dt_f32_to_f16(65504.0f), 0x7bff);
    T_EQ_INT(dt_f32_to_f16(0.0f), 0x0000);
    T_EQ_INT(dt_f32_to_f16(-0.0f), 0x8000);
    /* overflow: 65519.99 rounds to max, 65520 (the midpoint to 2^16) ties to even = inf */
    T_EQ_INT(dt_f32_to_f16(65519.99f), 0x7bff);
    T_EQ_INT(dt_f32_to_f16(65520.0f), 0x7c00);
    T_EQ_INT(dt_f32_to_f16(-1e10f), 0xfc00);
    T_EQ_INT(dt_f32_to_f16(INFINITY), 0x7c00);
    T_EQ_INT(dt_f32_to_f16(-INFINITY), 0xfc00);
    dt_f16 hn = dt_f32_to_f16(NAN);
    T_CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    T_CHECK(isnan(dt_f16_to_f32(hn)));
    T_CHECK(isnan(dt_f16_to_f32(0x7e00)) && isnan(dt_f16_to_f32(0xfd01)));
    T_CHECK(isinf(dt_f16_to_f32(0x7c00)) && dt_f16_to_f32(0xfc00) < 0);
    /* subnormals: smallest 2^-24, largest 0x3ff * 2^-24, smallest normal 2^-14 */
    T_EQ_INT(dt_f32_to_f16(ldexpf(1, -24)), 0x0001);
    T_EQ_INT(dt_f32_to_f16(-ldexpf(1, -24)), 0x8001);
    T_EQ_INT(dt_f32_to_f16(ldexpf(1023, -24)), 0x03ff);
    T_EQ_INT(dt_f32_to_f16(ldexpf(1, -14)), 0x0400);
    T_CHECK(dt_f16_to_f32(0x0001) == ldexpf(1, -24));
    T_CHECK(dt_f16_to_f32(0x03ff) == ldexpf(1023, -24));
    T_CHECK(dt_f16_to_f32(0x8200) == -ldexpf(512, -24));
    /* below half the smallest subnormal: zero; exactly half: ties to even (0); above: 1 */
    T_EQ_INT(dt_f32_to_f16(ldexpf(1, -26)), 0x0000);
    T_EQ_INT(dt_f32_to_f16(ldexpf(1, -25)), 0x0000);
    T_EQ_INT(dt_f32_to_f16(ldexpf(3, -25)), 0x0002); /* 1.5 ulp ties to even 2 */
    T_EQ_INT(dt_f32_to_f16(ldexpf(1, -25) * 1.0001f), 0x0001);
    T_EQ_INT(dt_f32_to_f16(ldexpf(2047, -25)), 0x0400); /* 1023.5 ulp rounds up into the normals */
    T_EQ_INT(dt_f32_to_f16(1e-30f), 0x0000);
    /* normal ties: 1 + 2^-11 is halfway between 1 and 1+2^-10: even (1); 1 + 3*2^-11: up */
    T_EQ_INT(dt_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);
    T_EQ_INT(dt_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3c02);
    T_EQ_INT(dt_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)), 0x3c01);
    T_EQ_INT(dt_f32_to_f16(2047.0f + 0.5f), 0x6800); /* 2047.5 -> 2048 (mantissa carry into exponent) */
    /* every f16 (but NaNs) survives f16 -> f32 -> f16 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;
        if (dt_f32_to_f16(dt_f16_to_f32((dt_f16)h)) != h) bad++;
    }
    T_EQ_INT(bad, 0);
    /* rounding agrees with the midpoint rule for random floats across the range */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float f = u2f((uint32_t)rng_next());
        if (isnan(f) || fabsf(f) > 65504 || fabsf(f) < ldexpf(1, -24)) continue;
        dt_f16 h = dt_f32_to_f16(f);
        double v = dt_f16_to_f32(h), e = fabs(v - f);
        /* neighbours must not be closer */
        double up = dt_f16_to_f32((dt_f16)(h + 1)), dn = (h & 0x7fff) ? dt_f16_to_f32((dt_f16)(h - 1)) : v;
        if ((h & 0x7fff) != 0x7bff && fabs(up - f) < e) bad++;
        if (fabs(dn - f) < e) bad++;
    }
    T_EQ_INT(bad, 0);
}

static void test_bf16(void) {
    T_EQ_INT(dt_f32_to_bf16(1.0f), 0x3f80);
    T_EQ_INT(dt_f32_to_bf16(-0.0f), 0x8000);
    T_EQ_INT(dt_f32_to_bf16(INFINITY), 0x7f80);
    T_EQ_INT(dt_f32_to_bf16(-INFINITY), 0xff80);
    /* ties to even: 1 + 2^-8 is halfway between 1 and 1+2^-7 */
    T_EQ_INT(dt_f32_to_bf16(u2f(0x3f808000)), 0x3f80);
    T_EQ_INT(dt_f32_to_bf16(u2f(0x3f818000)), 0x3f82);
    T_EQ_INT(dt_f32_to_bf16(u2f(0x3f808001)), 0x3f81);
    T_EQ_INT(dt_f32_to_bf16(u2f(0x3f807fff)), 0x3f80);
    /* overflow of the largest finite float rounds to inf */
    T_EQ_INT(dt_f32_to_bf16(u2f(0x7f7fffff)), 0x7f80);
    T_EQ_INT(dt_f32_to_bf16(u2f(0x7f7f7fff)), 0x7f7f);
    /* subnormals keep their top bits and round the same way */
    T_EQ_INT(dt_f32_to_bf16(u2f(0x00010000)), 0x0001);
    T_EQ_INT(dt_f32_to_bf16(u2f(0x00018000)), 0x0002);
    T_EQ_INT(dt_f32_to_bf16(u2f(0x00008000)), 0x0000);
    T_EQ_INT(dt_f32_to_bf16(u2f(0x80008001)), 0x8001);
    /* NaN stays NaN (even a payload only in the low 16 bits), never becomes inf */
    dt_bf16 n1 = dt_f32_to_bf16(u2f(0x7f800001)), n2 = dt_f32_to_bf16(u2f(0xffc00000));
    T_CHECK(isnan(dt_bf16_to_f32(n1)) && isnan(dt_bf16_to_f32(n2)));
    T_CHECK(n2 & 0x8000);
    T_CHECK(dt_bf16_to_f32(0x4049) == u2f(0x40490000));
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
        if (dt_f32_to_bf16(dt_bf16_to_f32((dt_bf16)h)) != h) bad++;
    }
    T_EQ_INT(bad, 0);
}

int main(void) {
    test_known_q4_0();
    test_known_q4_1();
    test_known_q5();
    test_known_q8_0();
    test_known_q4_K_q5_K();
    test_known_q6_K();
    test_known_q8_K();
    test_known_float();
    for (size_t i = 0; i < sizeof rt_cases / sizeof *rt_cases; i++) test_roundtrip(&rt_cases[i]);
    test_q8_K_bsums();
    test_exact_grid();
    test_args();
    test_f16();
    test_bf16();
    return t_done();
}
