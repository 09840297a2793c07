/* test_kernels_matmul: k_matmul for every weight type on every ISA this CPU runs, against the
 * double reference k_matmul_ref, on odd shapes with poisoned outputs; bitwise batch invariance
 * (row t of an n_tok=17 call == the n_tok=1 call on that row) and thread-count invariance
 * (1 vs 2 vs 3 threads); k_get_rows for every type; error codes.
 *
 * Error bounds, per token row t: e = ||y_t - ref_t||_2 / ||s_t||_2 where s_t[o] =
 * sqrt(sum_i (W[o][i] x[t][i])^2), the typical size of y[t][o] for random data (a plain
 * ||ref_t|| is ill-conditioned when a row has one output that cancels to near zero):
 *   F32, F16, BF16 and the generic dequantize-a-row types (Q4_1, Q5_0, Q5_1, Q5_K): 1e-5
 *     (weights are exact; the only error is f32 accumulation);
 *   Q8_0, Q4_0 (activations quantized to two int8 levels per 32), Q4_K, Q6_K (per 256): 3e-4
 *     (the rounding of x alone; worst seen ~5e-5; one 8-bit level gave ~0.4 %, worst ~1.5 %);
 *   every SIMD path against the scalar path (same quantized activations): 1e-5.
 * Activation read-back: one-hot weight rows (Q8_0, Q4_0, Q4_K) return each x[i] as the integer
 * kernels see it: within d / 256 of x[i] (d = the block's amax / 127: half a step of the low
 * level, a full one where it clamps at 127; 1 % slack for float rounding), and bitwise the
 * same on every ISA (the AVX-512 activation quantizer must give the scalar one's bytes).
 * Random data: x ~ U(-1, 1); weights are random blocks (every quant bit pattern) with
 * random small positive scales, so the reference is exact on what the kernel reads. F8_E4M3
 * (k_matmul_scaled): every finite code, a different random scale per row; bound 1e-5 (its
 * values are exact; f32 accumulation only).
 */
#include "t.h"
#include "common/cm_err.h"
#include "kernels/cpu/kcpu.h"
#include "model/dtype.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rndf(void) { return (float)(rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* F8_E4M3's row scales of the weights make_weights made last ([n_out]). */
static float *g_scale;

/* k_matmul / k_matmul_ref with g_scale for F8_E4M3 */
static int mm(k_pool *p, const void *w, int type, int64_t n_in, int64_t n_out, const float *x, int64_t n_tok, float *y) {
    return k_matmul_scaled(p, w, type, type == DT_F8_E4M3 ? g_scale : NULL, n_in, n_out, x, n_tok, y);
}

/* Row o of the weights as values. */
static int row_values(int type, const void *w, int64_t n_in, int64_t o, float *out) {
    const uint8_t *r = (const uint8_t *)w + (size_t)o * dt_row_size(type, n_in);
    if (type != DT_F8_E4M3) return dt_dequantize(type, r, out, n_in);
    dt_fp8_decode(r, n_in, g_scale[o], out);
    return 0;
}

/* Fills n_out rows of random weights of `type`. */
static void *make_weights(int type, int64_t n_in, int64_t n_out) {
    if (type == DT_F8_E4M3) {
        free(g_scale);
        g_scale = malloc(sizeof(float) * (size_t)n_out);
        for (int64_t o = 0; o < n_out; o++) g_scale[o] = 0.0005f + 0.01f * (float)(rnd() % 1000) / 1000.0f;
    }
    size_t row = dt_row_size(type, n_in), bytes = row * (size_t)n_out;
    uint8_t *w = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    int64_t nb = (int64_t)(bytes / dt_type_size(type));
    for (int64_t b = 0; b < nb; b++) {
        void *blk = w + (size_t)b * dt_type_size(type);
        dt_f16 d = dt_f32_to_f16(0.002f + 0.01f * (float)(rnd() % 1000) / 1000.0f);
        dt_f16 m = dt_f32_to_f16(0.001f + 0.005f * (float)(rnd() % 1000) / 1000.0f);
        switch (type) {
        case DT_F32: ((float *)w)[b] = rndf(); break;
        case DT_F16: ((dt_f16 *)w)[b] = dt_f32_to_f16(rndf()); break;
        case DT_BF16: ((dt_bf16 *)w)[b] = dt_f32_to_bf16(rndf()); break;
        case DT_F8_E4M3: if ((w[b] & 0x7f) == 0x7f) w[b] ^= 1; break; /* no NaN codes */
        case DT_Q8_0: {
            blk_q8_0 *q = blk;
            q->d = d;
            for (int i = 0; i < 32; i++) if (q->qs[i] == -128) q->qs[i] = -127; /* as quantizers emit */
            break;
        }
        case DT_Q4_0: ((blk_q4_0 *)blk)->d = d; break;
        case DT_Q4_1: ((blk_q4_1 *)blk)->d = d; ((blk_q4_1 *)blk)->m = m; break;
        case DT_Q5_0: ((blk_q5_0 *)blk)->d = d; break;
        case DT_Q5_1: ((blk_q5_1 *)blk)->d = d; ((blk_q5_1 *)blk)->m = m; break;
        case DT_Q4_K: ((blk_q4_K *)blk)->d = d; ((blk_q4_K *)blk)->dmin = m; break;
        case DT_Q5_K: ((blk_q5_K *)blk)->d = d; ((blk_q5_K *)blk)->dmin = m; break;
        case DT_Q6_K: ((blk_q6_K *)blk)->d = d; break;
        default: break;
        }
    }
    return w;
}

static double bound_for(int type) {
    switch (type) {
    case DT_Q8_0: case DT_Q4_0: case DT_Q4_K: case DT_Q6_K: return 3e-4;
    default: return 1e-5;
    }
}

static float *poisoned(size_t n) {
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = NAN;
    return y;
}

static k_pool *pool1, *pool2, *pool3;
static double worst[DT_COUNT];

/* One shape on the current ISA: accuracy, batch and thread invariance. */
static void check_shape(int type, int64_t n_in, int64_t n_out, int64_t n_tok) {
    void *w = make_weights(type, n_in, n_out);
    float *x = malloc((size_t)(n_tok * n_in) * sizeof *x);
    for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = rndf();
    size_t ny = (size_t)(n_tok * n_out);
    double *ref = malloc(ny * sizeof *ref);
    float *y2 = poisoned(ny), *y1 = poisoned(ny), *y3 = poisoned(ny), *yt = poisoned((size_t)n_out);
    const char *isa = k_isa_name(k_get_isa());

    T_EQ_INT(k_matmul_ref_scaled(w, type, type == DT_F8_E4M3 ? g_scale : NULL, n_in, n_out, x, n_tok, ref), 0);
    double *scale2 = calloc((size_t)n_tok, sizeof *scale2); /* ||s_t||^2 */
    float *wrow = malloc((size_t)n_in * sizeof *wrow);
    for (int64_t o = 0; o < n_out; o++) {
        T_EQ_INT(row_values(type, w, n_in, o, wrow), 0);
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t i = 0; i < n_in; i++) {
                double p = (double)wrow[i] * x[t * n_in + i];
                scale2[t] += p * p;
            }
    }
    free(wrow);
    int rc = mm(pool2, w, type, n_in, n_out, x, n_tok, y2);
    T_CHECKF(rc == 0, "%s %s k_matmul: %s", dt_name(type), isa, cm_err_str(rc));

    int finite = 1;
    double we = 0.0;
    for (int64_t t = 0; t < n_tok; t++) {
        double e2 = 0.0;
        for (int64_t o = 0; o < n_out; o++) {
            double y = y2[t * n_out + o], r = ref[t * n_out + o];
            finite &= isfinite(y);
            e2 += (y - r) * (y - r);
        }
        double e = sqrt(e2) / (sqrt(scale2[t]) + 1e-30);
        if (!(e <= we)) we = e;
    }
    if (we > worst[type]) worst[type] = we;
    T_CHECKF(finite, "%s %s %lldx%lld n_tok=%lld: non-finite output (unwritten?)", dt_name(type), isa,
             (long long)n_in, (long long)n_out, (long long)n_tok);
    T_CHECKF(we <= bound_for(type), "%s %s %lldx%lld n_tok=%lld: rel err %g > %g", dt_name(type), isa,
             (long long)n_in, (long long)n_out, (long long)n_tok, we, bound_for(type));

    /* SIMD vs scalar: both read the same quantized activations, so they differ only by the
     * float summation order: a much tighter check of the integer kernels than the bound above */
    int cur = k_get_isa();
    if (cur != K_ISA_SCALAR) {
        k_set_isa(K_ISA_SCALAR);
        T_EQ_INT(mm(pool1, w, type, n_in, n_out, x, n_tok, y1), 0);
        k_set_isa(cur);
        double ws = 0.0;
        for (int64_t t = 0; t < n_tok; t++) {
            double e2 = 0.0;
            for (int64_t o = 0; o < n_out; o++) {
                double d = (double)y1[t * n_out + o] - y2[t * n_out + o];
                e2 += d * d;
            }
            double e = sqrt(e2) / (sqrt(scale2[t]) + 1e-30);
            if (!(e <= ws)) ws = e;
        }
        T_CHECKF(ws <= 1e-5, "%s %s %lldx%lld n_tok=%lld: differs from scalar by %g", dt_name(type), isa,
                 (long long)n_in, (long long)n_out, (long long)n_tok, ws);
    }

    /* thread-count invariance: 1 and 3 threads give the same bits as 2 */
    T_EQ_INT(mm(pool1, w, type, n_in, n_out, x, n_tok, y1), 0);
    T_EQ_INT(mm(pool3, w, type, n_in, n_out, x, n_tok, y3), 0);
    T_CHECKF(!memcmp(y1, y2, ny * sizeof *y1) && !memcmp(y3, y2, ny * sizeof *y3),
             "%s %s %lldx%lld n_tok=%lld: result depends on thread count", dt_name(type), isa,
             (long long)n_in, (long long)n_out, (long long)n_tok);

    /* batch invariance: each row alone (at a different address) gives the same bits */
    if (n_tok > 1) {
        int same = 1;
        float *xt = malloc((size_t)n_in * sizeof *xt);
        for (int64_t t = 0; t < n_tok; t++) {
            memcpy(xt, x + t * n_in, (size_t)n_in * sizeof *xt);
            for (int64_t o = 0; o < n_out; o++) yt[o] = NAN;
            T_EQ_INT(mm(pool2, w, type, n_in, n_out, xt, 1, yt), 0);
            same &= !memcmp(yt, y2 + t * n_out, (size_t)n_out * sizeof *yt);
        }
        T_CHECKF(same, "%s %s %lldx%lld n_tok=%lld: row differs from the n_tok=1 call", dt_name(type), isa,
                 (long long)n_in, (long long)n_out, (long long)n_tok);
        free(xt);
    }
    free(w); free(x); free(ref); free(scale2); free(y1); free(y2); free(y3); free(yt);
}

static const int types[] = { DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K, DT_Q6_K,
                             DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q5_K, DT_F8_E4M3 };
#define N_TYPES ((int)(sizeof types / sizeof types[0]))

static void check_isa(int isa) {
    k_set_isa(isa);
    if (k_get_isa() != isa) {
        printf("isa %s: not available on this CPU, skipped\n", k_isa_name(isa));
        return;
    }
    static const int64_t toks[] = { 1, 3, 17, 64 };
    static const int64_t outs[] = { 1, 7, 37 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = types[ti];
        int bs = dt_block_size(type) < 32 ? 32 : dt_block_size(type);
        /* odd multiples of the block size (float types: of 32) */
        int64_t ins[3] = { bs * 1, bs * 3, bs * (bs == 256 ? 5 : 17) };
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 4; c++)
                    if (a < 2 || b == 2) check_shape(type, ins[a], outs[b], toks[c]);
        check_shape(type, bs * 3, 67, 64); /* more rows than one chunk per thread */
        if (dt_block_size(type) == 1) { /* float types take any n_in */
            check_shape(type, 13, 5, 3);
            check_shape(type, 40, 9, 17);
        }
    }
    printf("isa %s: worst relative errors:", k_isa_name(isa));
    for (int ti = 0; ti < N_TYPES; ti++) printf(" %s=%.2g", dt_name(types[ti]), worst[types[ti]]);
    printf("\n");
    memset(worst, 0, sizeof worst);
}

/* n_in one-hot rows of `type`: row o has weight 1 at element o (scale 1), 0 elsewhere. */
static void *onehot_weights(int type, int64_t n_in) {
    size_t row = dt_row_size(type, n_in);
    uint8_t *w = calloc((size_t)n_in, row);
    for (int64_t o = 0; o < n_in; o++) {
        uint8_t *r = w + (size_t)o * row;
        int64_t b = o / dt_block_size(type), e = o % dt_block_size(type);
        if (type == DT_Q8_0) {
            blk_q8_0 *q = (blk_q8_0 *)r;
            for (int64_t i = 0; i < n_in / 32; i++) q[i].d = dt_f32_to_f16(1.0f);
            q[b].qs[e] = 1;
        } else if (type == DT_Q4_0) {
            blk_q4_0 *q = (blk_q4_0 *)r;
            for (int64_t i = 0; i < n_in / 32; i++) {
                q[i].d = dt_f32_to_f16(1.0f);
                memset(q[i].qs, 0x88, sizeof q[i].qs);
            }
            q[b].qs[e % 16] = e < 16 ? 0x89 : 0x98;
        } else { /* Q4_K: d 1, dmin 0, every sub-block scale 1 and min 0 */
            blk_q4_K *q = (blk_q4_K *)r;
            static const uint8_t sc[12] = { 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1 };
            for (int64_t i = 0; i < n_in / 256; i++) {
                q[i].d = dt_f32_to_f16(1.0f);
                memcpy(q[i].scales, sc, sizeof sc);
            }
            int j = (int)(e / 32), l = (int)(e % 32);
            q[b].qs[(j / 2) * 32 + l] = (uint8_t)(j & 1 ? 0x10 : 0x01);
        }
    }
    return w;
}

static void check_readback(void) {
    static const int rtypes[] = { DT_Q8_0, DT_Q4_0, DT_Q4_K };
    for (int ti = 0; ti < 3; ti++) {
        int type = rtypes[ti];
        /* a tail group (Q8_0 / Q4_0: 19 blocks), rows of very different magnitude */
        int64_t n_in = type == DT_Q4_K ? 768 : 608, n_tok = 3;
        void *w = onehot_weights(type, n_in);
        float *x = malloc((size_t)(n_tok * n_in) * sizeof *x);
        for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = rndf() * (i < n_in ? 1.0f : i < 2 * n_in ? 3e-3f : 250.0f);
        x[n_in + 5] = 0.0f;
        float *first = NULL;
        for (int isa = K_ISA_SCALAR; isa <= K_ISA_AVX512; isa++) {
            k_set_isa(isa);
            if (k_get_isa() != isa) continue;
            float *y = poisoned((size_t)(n_tok * n_in));
            T_EQ_INT(k_matmul(pool2, w, type, n_in, n_in, x, n_tok, y), 0);
            double worst = 0.0; /* in units of d / 256 */
            int bs = dt_block_size(type);
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t b = 0; b < n_in / bs; b++) {
                    float amax = 0.0f;
                    for (int i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(x[t * n_in + b * bs + i]));
                    double unit = amax / 127.0 / 256.0;
                    for (int i = 0; i < bs; i++) {
                        int64_t k = t * n_in + b * bs + i;
                        double e = fabs((double)y[k] - x[k]) / (unit > 0 ? unit : 1.0);
                        if (!(e <= worst)) worst = e;
                    }
                }
            T_CHECKF(worst <= 1.01, "read-back %s %s: error %g x d/256", dt_name(type), k_isa_name(isa), worst);
            if (!first) first = y;
            else {
                T_CHECKF(!memcmp(first, y, (size_t)(n_tok * n_in) * sizeof *y), "read-back %s: %s differs from scalar",
                         dt_name(type), k_isa_name(isa));
                free(y);
            }
            printf("read-back %s %s: worst %.3f x d/256\n", dt_name(type), k_isa_name(isa), worst);
        }
        k_set_isa(K_ISA_AUTO);
        free(first); free(w); free(x);
    }
}

static void check_get_rows(void) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        int type = types[ti];
        if (type == DT_F8_E4M3) continue; /* FP8 is for linear layers (the loader refuses FP8 embeddings) */
        int64_t n_embd = dt_block_size(type) == 256 ? 512 : 96, n_rows = 9;
        void *tab = make_weights(type, n_embd, n_rows);
        int32_t ids[5] = { 8, 0, 3, 3, 7 };
        float *out = poisoned((size_t)(5 * n_embd)), *want = malloc((size_t)n_embd * sizeof *want);
        T_EQ_INT(k_get_rows(tab, type, n_embd, n_rows, ids, 5, out), 0);
        int same = 1;
        for (int j = 0; j < 5; j++) {
            T_EQ_INT(dt_dequantize(type, (uint8_t *)tab + (size_t)ids[j] * dt_row_size(type, n_embd), want, n_embd), 0);
            same &= !memcmp(want, out + j * n_embd, (size_t)n_embd * sizeof *want);
        }
        T_CHECKF(same, "k_get_rows %s differs from dt_dequantize", dt_name(type));
        int32_t bad[2] = { 1, 9 };
        T_EQ_INT(k_get_rows(tab, type, n_embd, n_rows, bad, 2, out), CM_ERANGE);
        bad[1] = -1;
        T_EQ_INT(k_get_rows(tab, type, n_embd, n_rows, bad, 2, out), CM_ERANGE);
        free(tab); free(out); free(want);
    }
}

static void check_errors(void) {
    float x[512] = { 0 }, y[4];
    uint8_t w[4096] = { 0 };
    T_EQ_INT(k_matmul(pool2, w, DT_Q4_0, 48, 1, x, 1, y), CM_EINVAL);   /* not a multiple of 32 */
    T_EQ_INT(k_matmul(pool2, w, DT_Q4_K, 32, 1, x, 1, y), CM_EINVAL);   /* not a multiple of 256 */
    T_EQ_INT(k_matmul(pool2, w, DT_F32, 0, 1, x, 1, y), CM_EINVAL);
    T_EQ_INT(k_matmul(pool2, w, DT_F32, 8, 1, x, 0, y), CM_EINVAL);
    T_EQ_INT(k_matmul(NULL, w, DT_F32, 8, 1, x, 1, y), CM_EINVAL);
    T_EQ_INT(k_matmul(pool2, w, DT_Q2_K, 256, 1, x, 1, y), CM_EUNSUPPORTED);
    T_EQ_INT(k_matmul(pool2, w, DT_I32, 8, 1, x, 1, y), CM_EUNSUPPORTED);
    T_EQ_INT(k_matmul(pool2, w, 99, 8, 1, x, 1, y), CM_EUNSUPPORTED);
    T_EQ_INT(k_get_rows(w, 99, 8, 1, (int32_t[]){ 0 }, 1, y), CM_EUNSUPPORTED);
    float sc[4] = { 1, 1, 1, 1 };
    T_EQ_INT(k_matmul(pool2, w, DT_F8_E4M3, 8, 1, x, 1, y), CM_EINVAL);               /* FP8 needs its scales */
    T_EQ_INT(k_matmul_scaled(pool2, w, DT_F32, sc, 8, 1, x, 1, y), CM_EINVAL);      /* scales are FP8's only */
    T_EQ_INT(k_matmul_ref_scaled(w, DT_F8_E4M3, NULL, 8, 1, x, 1, (double[1]){ 0 }), CM_EINVAL);
    w[0] = 0x38; w[1] = 0xc0; /* 1, -2 */
    x[0] = 3.0f; x[1] = 0.25f;
    sc[0] = 0.5f;
    T_EQ_INT(k_matmul_scaled(pool2, w, DT_F8_E4M3, sc, 2, 1, x, 1, y), 0);
    T_NEAR(y[0], 0.5 * (3.0 - 0.5), 0.0);
    memset(w, 0, 8);
    memset(x, 0, sizeof x);
    T_EQ_INT(k_pool_reserve(pool2, 0, 16), CM_EINVAL);
    T_EQ_INT(k_pool_reserve(pool2, 64, 4096), 0);
    /* n_in a multiple of 8 but not of 32 works for float types */
    for (int i = 0; i < 40; i++) x[i] = (float)i;
    for (int i = 0; i < 40; i++) ((float *)w)[i] = 1.0f;
    T_EQ_INT(k_matmul(pool2, w, DT_F32, 40, 1, x, 1, y), 0);
    T_NEAR(y[0], 780.0, 0.0);
    T_EQ_INT(k_matmul(pool2, w, DT_F32, 13, 1, x, 1, y), 0); /* odd n_in */
    T_NEAR(y[0], 78.0, 0.0);
}

int main(void) {
    T_EQ_INT(k_pool_create(1, &pool1), 0);
    T_EQ_INT(k_pool_create(2, &pool2), 0);
    T_EQ_INT(k_pool_create(3, &pool3), 0);
    int auto_isa = k_get_isa();
    printf("auto isa: %s\n", k_isa_name(auto_isa));
    T_CHECK(auto_isa >= K_ISA_SCALAR && auto_isa <= K_ISA_AVX512);
    for (int isa = K_ISA_SCALAR; isa <= K_ISA_AVX512; isa++) check_isa(isa);
    k_set_isa(K_ISA_AUTO);
    T_CHECK(k_get_isa() >= auto_isa);
    check_readback();
    check_get_rows();
    check_errors();
    k_pool_destroy(pool1);
    k_pool_destroy(pool2);
    k_pool_destroy(pool3);
    free(g_scale);
    return t_done();
}
