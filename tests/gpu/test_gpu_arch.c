/* GPU kernels of the later architectures (kernels/cuda/arch.cu, the rope kernel's table and
 * QK-norm, the attention modifiers) against the CPU backend's own code (kernels/cpu/ops.h) or
 * double-precision references on random inputs: embedding scale, soft-capping, post-norm +
 * residual, SwiGLU / GeGLU (interleaved and split rows, row weights), mixture-of-experts
 * routing (normalized or not, ties), the grouped expert GEMV (unused experts, several entries
 * per expert; F16 and every GGUF type it keeps: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K),
 * the weighted sum, RoPE from a per-pair frequency table with an attention factor (yarn,
 * longrope, partial rotation) with and without QK-norm, and attention with soft-capping and a
 * sliding window on every kernel (per-head at head dims 16..256, tensor-core decode and
 * prefill at 64 / 128), where the blocks wholly before the window are a block of NaNs that
 * must never be read. The fused launches of the Gemma layers: the gate|up GEMV with SwiGLU or
 * GeGLU in its epilogue (kc_matmul_glu; F16, Q8_0, Q4_K), the post-norm with the next pre-norm
 * (kc_rmsnorm_add_xq) and the scaled embedding, each against the unfused sequence (the same
 * bits) and the CPU; the MoE decode-step launches (norm + router + routing, the gate|up GEMV
 * with the SwiGLU, the down GEMV quantizing its input) against the kernels they replace. Outputs are poisoned (NaN) before each launch. Runs on a GPU host only
 * (tests/gpu/models.sh). */
#include "common/cm_err.h"
#include "kernels/cpu/kcpu.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"
#include "model/model.h"
#include "tests/unit/t.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ck.h"
#include "gpu_plan.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void *up(const void *h, size_t n) {
    void *d;
    CK(cudaMalloc(&d, n ? n : 1));
    if (n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}
static void *dnew(size_t n) {
    void *d;
    CK(cudaMalloc(&d, n ? n : 1));
    CK(cudaMemset(d, 0xff, n ? n : 1)); /* NaN */
    return d;
}
static void down(void *h, const void *d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

static double rel_err_f(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static kc_xq xq_new(int cap_tok, int cap_n, int no_ints) {
    kc_xq q = { .cap_tok = cap_tok, .cap_n = cap_n, .no_ints = no_ints };
    const size_t n = (size_t)cap_tok * cap_n;
    CK(cudaMalloc((void **)&q.qh, n));
    CK(cudaMalloc((void **)&q.ql, n));
    CK(cudaMalloc((void **)&q.m, n / 32 * 8 + 8));
    CK(cudaMalloc((void **)&q.xh, n * 2));
    return q;
}
static void xq_poison(kc_xq *q) { /* 0x55: a producer that writes only the half copy leaves it */
    const size_t n = (size_t)q->cap_tok * q->cap_n;
    CK(cudaMemset(q->qh, 0x55, n));
    CK(cudaMemset(q->ql, 0x55, n));
    CK(cudaMemset(q->m, 0x55, n / 32 * 8));
    CK(cudaMemset(q->xh, 0xff, n * 2));
    q->n = -1;
}
static void xq_del(kc_xq *q) { cudaFree(q->qh); cudaFree(q->ql); cudaFree(q->m); cudaFree(q->xh); }
static int dev_same(const void *a, const void *b, size_t n) {
    char *x = malloc(n ? n : 1), *y = malloc(n ? n : 1);
    down(x, a, n);
    down(y, b, n);
    int ok = memcmp(x, y, n) == 0;
    free(x); free(y);
    return ok;
}
/* a's rows of n as b's: the half copy, and the integer blocks unless a wrote only the half copy
 * (then they must still hold the 0x55 poison) */
static int xq_ints_same(const kc_xq *a, const kc_xq *b, int nt, int n) {
    const size_t e = (size_t)nt * n;
    return a->n == n && dev_same(a->qh, b->qh, e) && dev_same(a->ql, b->ql, e) && dev_same(a->m, b->m, e / 32 * 8);
}
static int xq_same(const kc_xq *a, const kc_xq *b, int nt, int n) {
    const size_t e = (size_t)nt * n;
    int ok = a->n == n && dev_same(a->xh, b->xh, e * 2);
    if (!a->no_ints) return ok && xq_ints_same(a, b, nt, n);
    int8_t *h = malloc(e);
    down(h, a->qh, e);
    for (size_t i = 0; i < e; i++) ok &= h[i] == 0x55;
    free(h);
    return ok;
}
static kc_weight weight_up(int type, const void *blocks, int n_in, int n_out) {
    size_t db, sb;
    kc_weight w = { .type = type, .n_in = n_in, .n_out = n_out };
    if (kc_weight_sizes(type, n_in, n_out, &db, &sb)) {
        fprintf(stderr, "kc_weight_sizes %s %dx%d\n", dt_name(type), n_in, n_out);
        exit(1);
    }
    void *hq = malloc(db);
    kc_half *hd = sb ? malloc(sb) : NULL;
    kc_weight_repack(type, blocks, n_in, n_out, hq, hd);
    w.data = up(hq, db);
    w.d = sb ? up(hd, sb) : NULL;
    free(hq); free(hd);
    return w;
}

static float *rnd(size_t n, float scale) {
    float *p = malloc(n * 4);
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

/* Scale, soft-cap, post-norm + residual, SwiGLU / GeGLU. */
static void test_elementwise(cudaStream_t s) {
    /* scale and soft-cap */
    {
        const size_t n = 10007;
        float *x = rnd(n, 40.0f), *r1 = malloc(n * 4), *r2 = malloc(n * 4), *g = malloc(n * 4);
        memcpy(r1, x, n * 4);
        k_scale(r1, (int64_t)n, 8.0f);
        memcpy(r2, x, n * 4);
        k_softcap(r2, (int64_t)n, 30.0f);
        float *d = up(x, n * 4);
        int rc = kc_scale(d, n, 8.0f, s);
        CK(cudaStreamSynchronize(s));
        down(g, d, n * 4);
        T_CHECKF(rc == 0 && memcmp(g, r1, n * 4) == 0, "kc_scale = k_scale");
        CK(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice));
        rc = kc_softcap(d, n, 30.0f, s);
        CK(cudaStreamSynchronize(s));
        down(g, d, n * 4);
        double e = rel_err_f(g, r2, n);
        T_CHECKF(rc == 0 && e < 1e-5, "kc_softcap: rel_err %.3g", e);
        T_CHECK(kc_softcap(d, n, 0.0f, s) == CM_EINVAL);
        free(x); free(r1); free(r2); free(g);
        cudaFree(d);
    }
    /* post-norm + residual */
    {
        const int nt = 7, n = 2304;
        float *x = rnd((size_t)nt * n, 2.0f), *y = rnd((size_t)nt * n, 5.0f), *w = rnd(n, 1.5f), *ref = malloc((size_t)nt * n * 4),
              *tmp = malloc((size_t)nt * n * 4), *g = malloc((size_t)nt * n * 4);
        k_rmsnorm(y, w, nt, n, 1e-6f, tmp);
        memcpy(ref, x, (size_t)nt * n * 4);
        k_add(ref, tmp, (int64_t)nt * n);
        float *dx = up(x, (size_t)nt * n * 4), *dy = up(y, (size_t)nt * n * 4), *dw = up(w, n * 4);
        int rc = kc_rmsnorm_add(dx, dy, dw, nt, n, 1e-6f, s);
        CK(cudaStreamSynchronize(s));
        down(g, dx, (size_t)nt * n * 4);
        double e = rel_err_f(g, ref, (size_t)nt * n);
        T_CHECKF(rc == 0 && e < 1e-5, "kc_rmsnorm_add: rel_err %.3g", e);
        free(x); free(y); free(w); free(ref); free(tmp); free(g);
        cudaFree(dx); cudaFree(dy); cudaFree(dw);
    }
    /* GLU: silu / gelu, interleaved / split, with and without row weights */
    for (int act = 0; act < 2; act++)
        for (int split = 0; split < 2; split++)
            for (int weighted = 0; weighted < 2; weighted++) {
                const int nt = 6, F = 96;
                float *gu = rnd((size_t)nt * 2 * F, 4.0f), *rw = rnd(nt, 1.0f), *ref = malloc((size_t)nt * F * 4), *g = malloc((size_t)nt * F * 4);
                float gate[96], upv[96];
                for (int t = 0; t < nt; t++) {
                    for (int j = 0; j < F; j++) {
                        gate[j] = split ? gu[(size_t)t * 2 * F + j] : gu[(size_t)t * 2 * F + 2 * j];
                        upv[j] = split ? gu[(size_t)t * 2 * F + F + j] : gu[(size_t)t * 2 * F + 2 * j + 1];
                    }
                    (act ? k_geglu : k_swiglu)(gate, upv, F, ref + (size_t)t * F);
                    if (weighted) k_scale(ref + (size_t)t * F, F, rw[t]);
                }
                float *dg = up(gu, (size_t)nt * 2 * F * 4), *dw = up(rw, nt * 4), *dout = dnew((size_t)nt * F * 4);
                int rc = kc_glu(dg, dout, NULL, nt, F, act ? MDL_ACT_GELU_TANH : MDL_ACT_SILU, split, weighted ? dw : NULL, s);
                CK(cudaStreamSynchronize(s));
                down(g, dout, (size_t)nt * F * 4);
                double e = rel_err_f(g, ref, (size_t)nt * F);
                T_CHECKF(rc == 0 && e < 1e-5, "kc_glu act=%s split=%d weighted=%d: rel_err %.3g", act ? "gelu" : "silu", split, weighted, e);
                if (split) { /* also quantized (the experts' down input): the same f32 values, the blocks of kc_quantize_x */
                    kc_xq qa = xq_new(nt, F, 0), qb = xq_new(nt, F, 0);
                    float *dout2 = dnew((size_t)nt * F * 4), *g2 = malloc((size_t)nt * F * 4);
                    int rc2 = kc_glu(dg, dout2, &qa, nt, F, act ? MDL_ACT_GELU_TANH : MDL_ACT_SILU, 1, weighted ? dw : NULL, s);
                    rc2 |= kc_quantize_x(dout, nt, F, &qb, s);
                    kc_xq qc = xq_new(nt, F, 0); /* no f32 output: the blocks only */
                    rc2 |= kc_glu(dg, NULL, &qc, nt, F, act ? MDL_ACT_GELU_TANH : MDL_ACT_SILU, 1, weighted ? dw : NULL, s);
                    CK(cudaStreamSynchronize(s));
                    down(g2, dout2, (size_t)nt * F * 4);
                    T_CHECKF(rc2 == 0 && qa.n == F && qc.n == F && memcmp(g2, g, (size_t)nt * F * 4) == 0 && xq_ints_same(&qa, &qb, nt, F) &&
                                 xq_ints_same(&qc, &qb, nt, F),
                             "kc_glu act=%s weighted=%d with blocks: the f32 values and kc_quantize_x's blocks", act ? "gelu" : "silu",
                             weighted);
                    xq_del(&qa); xq_del(&qb); xq_del(&qc);
                    cudaFree(dout2);
                    free(g2);
                }
                free(gu); free(rw); free(ref); free(g);
                cudaFree(dg); cudaFree(dw); cudaFree(dout);
            }
}

/* Routing, grouping, grouped GEMV and the weighted sum against the CPU's k_topk_route and a
 * double reference of the whole MoE MLP. */
/* kc_moe_route's grouping (host copies): every one of the n_ent entries exactly once, under the
 * expert idx gives it, experts in order (off a running sum of cnt). */
static int grouping_ok(const int32_t *idx, const int32_t *cnt, const int32_t *off, const int32_t *list, int n_exp, int n_ent) {
    uint8_t *seen = calloc((size_t)n_ent, 1);
    int ok = 1, total = 0;
    for (int e = 0; e < n_exp; e++) {
        ok &= off[e] == total;
        for (int i = 0; i < cnt[e]; i++) {
            const int en = list[off[e] + i];
            ok &= en >= 0 && en < n_ent && idx[en] == e && !seen[en];
            if (en >= 0 && en < n_ent) seen[en] = 1;
        }
        total += cnt[e];
    }
    free(seen);
    return ok && total == n_ent;
}

static void test_moe(cudaStream_t s) {
    const int cfgs[][4] = { /* n_exp, k, norm, n_tok */
                            { 8, 2, 1, 1 }, { 8, 2, 1, 24 }, { 4, 2, 0, 13 }, { 128, 8, 1, 3 }, { 128, 8, 1, 300 }, { 60, 4, 0, 33 } };
    for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
        const int NE = cfgs[ci][0], K = cfgs[ci][1], norm = cfgs[ci][2], T = cfgs[ci][3], E = 64, F = 40;
        float *lg = rnd((size_t)T * NE, 3.0f);
        lg[1] = lg[0]; /* a tie: the lower expert first */
        int32_t *ridx = malloc((size_t)T * K * 4), *gidx = malloc((size_t)T * K * 4);
        float *rw = malloc((size_t)T * K * 4), *gw = malloc((size_t)T * K * 4);
        for (int t = 0; t < T; t++) k_topk_route(lg + (size_t)t * NE, NE, K, norm, ridx + (size_t)t * K, rw + (size_t)t * K);
        float *dlg = up(lg, (size_t)T * NE * 4), *dw = dnew((size_t)T * K * 4);
        int32_t *didx = dnew((size_t)T * K * 4), *dcnt = dnew(NE * 4), *doff = dnew(NE * 4), *dlist = dnew((size_t)T * K * 4);
        int rc = kc_moe_route(dlg, T, NE, K, norm, didx, dw, dcnt, doff, dlist, s);
        CK(cudaStreamSynchronize(s));
        down(gidx, didx, (size_t)T * K * 4);
        down(gw, dw, (size_t)T * K * 4);
        int same = memcmp(gidx, ridx, (size_t)T * K * 4) == 0;
        double we = 0;
        for (int i = 0; i < T * K; i++) we = fmax(we, fabs(gw[i] - rw[i]));
        T_CHECKF(rc == 0 && same && we < 1e-6, "kc_moe_route NE=%d k=%d norm=%d T=%d: same experts %d, weights max diff %.3g", NE, K, norm,
                 T, same, we);
        int32_t *cnt = malloc(NE * 4), *off = malloc(NE * 4), *list = malloc((size_t)T * K * 4);
        down(cnt, dcnt, NE * 4);
        down(off, doff, NE * 4);
        down(list, dlist, (size_t)T * K * 4);
        T_CHECKF(grouping_ok(gidx, cnt, off, list, NE, T * K), "kc_moe_route grouping NE=%d T=%d", NE, T);
        /* the MLP: experts as F16 (gate rows, then up rows; down), inputs x [T, E] */
        const size_t ngu = (size_t)NE * 2 * F * E, ndn = (size_t)NE * E * F;
        float *wgu = rnd(ngu, 0.2f), *wdn = rnd(ndn, 0.2f), *x = rnd((size_t)T * E, 1.0f);
        uint16_t *hgu = malloc(ngu * 2), *hdn = malloc(ndn * 2);
        dt_quantize(DT_F16, wgu, hgu, (int64_t)ngu);
        dt_quantize(DT_F16, wdn, hdn, (int64_t)ndn);
        dt_dequantize(DT_F16, hgu, wgu, (int64_t)ngu); /* the reference reads what the GPU reads */
        dt_dequantize(DT_F16, hdn, wdn, (int64_t)ndn);
        float *ref = calloc((size_t)T * E, 4), *res = rnd((size_t)T * E, 1.0f), *refacc = malloc((size_t)T * E * 4);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++) {
                const int e = ridx[t * K + j];
                double h[64];
                for (int f = 0; f < F; f++) {
                    double g = 0, u = 0;
                    for (int i = 0; i < E; i++) {
                        g += (double)wgu[((size_t)e * 2 * F + f) * E + i] * x[(size_t)t * E + i];
                        u += (double)wgu[((size_t)e * 2 * F + F + f) * E + i] * x[(size_t)t * E + i];
                    }
                    h[f] = g / (1 + exp(-g)) * u * rw[t * K + j];
                }
                for (int o = 0; o < E; o++) {
                    double y = 0;
                    for (int f = 0; f < F; f++) y += (double)wdn[((size_t)e * E + o) * F + f] * h[f];
                    ref[(size_t)t * E + o] += (float)y;
                }
            }
        for (size_t i = 0; i < (size_t)T * E; i++) refacc[i] = res[i] + ref[i];
        kc_half *dgu = up(hgu, ngu * 2), *ddn = up(hdn, ndn * 2);
        float *dx = up(x, (size_t)T * E * 4), *degu = dnew((size_t)T * K * 2 * F * 4), *deact = dnew((size_t)T * K * F * 4),
              *deout = dnew((size_t)T * K * E * 4), *dout = dnew((size_t)T * E * 4), *dres = up(res, (size_t)T * E * 4);
        rc = kc_moe_gemv(dgu, NE, E, 2 * F, dx, K, dcnt, doff, dlist, T * K, degu, s);
        rc |= kc_glu(degu, deact, NULL, T * K, F, MDL_ACT_SILU, 1, dw, s);
        rc |= kc_moe_gemv(ddn, NE, F, E, deact, 1, dcnt, doff, dlist, T * K, deout, s);
        rc |= kc_moe_combine(deout, dout, T, K, E, 0, s);
        rc |= kc_moe_combine(deout, dres, T, K, E, 1, s);
        CK(cudaStreamSynchronize(s));
        float *g = malloc((size_t)T * E * 4), *g2 = malloc((size_t)T * E * 4);
        down(g, dout, (size_t)T * E * 4);
        down(g2, dres, (size_t)T * E * 4);
        double e1 = rel_err_f(g, ref, (size_t)T * E), e2 = rel_err_f(g2, refacc, (size_t)T * E);
        T_CHECKF(rc == 0 && e1 < 1e-4 && e2 < 1e-4, "moe MLP NE=%d k=%d T=%d: rel_err %.3g, accumulated %.3g", NE, K, T, e1, e2);
        free(lg); free(ridx); free(gidx); free(rw); free(gw); free(cnt); free(off); free(list);
        free(wgu); free(wdn); free(x); free(hgu); free(hdn); free(ref); free(res); free(refacc); free(g); free(g2);
        void *ds[] = { dlg, dw, didx, dcnt, doff, dlist, dgu, ddn, dx, degu, deact, deout, dout, dres };
        for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) cudaFree(ds[i]);
    }
}

/* The experts' sum added in the next pre-norm (kc_rmsnorm_moe_xq): the same bits as
 * kc_moe_combine (accumulating) then kc_rmsnorm_xq, in x, y and the blocks; rows of one float4
 * a thread, of 512 threads (which kc_rmsnorm_xq may give to its split kernel), of 1,024 threads
 * (every register of an SM: the launch must still fit) and of two float4. */
static void test_moe_norm(cudaStream_t s) {
    const int ns[] = { 64, 2048, 4096, 6144 }, toks[] = { 1, 5 }, K = 8;
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t ti = 0; ti < 2; ti++) {
            const int n = ns[ni], T = toks[ti];
            float *x = rnd((size_t)T * n, 2.0f), *ey = rnd((size_t)T * K * n, 1.0f), *w = rnd(n, 1.0f);
            float *dxa = up(x, (size_t)T * n * 4), *dxb = up(x, (size_t)T * n * 4), *dey = up(ey, (size_t)T * K * n * 4),
                  *dw = up(w, (size_t)n * 4), *dya = dnew((size_t)T * n * 4), *dyb = dnew((size_t)T * n * 4);
            kc_xq qa = xq_new(T, n, 0), qb = xq_new(T, n, 0);
            int rc = kc_rmsnorm_moe_xq(dxa, dey, K, dw, dya, &qa, T, n, 1e-6f, s);
            rc |= kc_moe_combine(dey, dxb, T, K, n, 1, s);
            rc |= kc_rmsnorm_xq(dxb, dw, dyb, &qb, T, n, 1e-6f, s);
            CK(cudaStreamSynchronize(s));
            const int same = dev_same(dxa, dxb, (size_t)T * n * 4) && dev_same(dya, dyb, (size_t)T * n * 4) && xq_same(&qa, &qb, T, n);
            T_CHECKF(rc == 0 && same, "kc_rmsnorm_moe_xq n=%d T=%d: the bits of combine + rmsnorm (rc %d)", n, T, rc);
            free(x); free(ey); free(w);
            xq_del(&qa); xq_del(&qb);
            void *ds[] = { dxa, dxb, dey, dw, dya, dyb };
            for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) cudaFree(ds[i]);
        }
}

/* The grouped integer GEMV over quantized experts (kc_moe_gemvq): GGUF blocks as dt_quantize
 * writes them, repacked per expert into one stacked kc_weight, against the CPU's dequantization
 * of the same blocks times x (double dot products; the GPU multiplies two-level int8 activations,
 * ~2e-5); entries from the device router, their rows a token's (x_div = k, gate|up) or their own
 * (x_div = 1, down); rows of 512 (lanes in halves: at most 16 chunks) and 1536 values; experts
 * nobody chose are never read (their blocks are NaN). An entry's result has the same bits at
 * every token count (token 0 alone against all T). The tensor-core form (kc_moe_gemmq) on the
 * same entries from half activations. F16 experts: kc_moe_gemv (test_moe). */
static void test_moe_quant(cudaStream_t s) {
    const int types[] = { DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K };
    const int NE = 6, K = 2, n_out = 72, n_ins[] = { 512, 1536 };
    const int toks[] = { 1, 3, 40, 90, 300 }; /* kc_moe_gemmq's tiles of 8, 16, 32 and 64 entries */
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t ii = 0; ii < 2; ii++)
            for (int per_ent = 0; per_ent < 2; per_ent++)
                for (size_t ni = 0; ni < sizeof toks / sizeof *toks; ni++) {
                    const int type = types[ti], T = toks[ni], n_in = n_ins[ii], x_div = per_ent ? 1 : K, nx = per_ent ? T * K : T;
                    T_CHECKF(kc_moe_type_ok(type, n_in), "kc_moe_type_ok(%s)", dt_name(type));
                    const size_t rb = dt_row_size(type, n_in), mb = rb * n_out, nw = (size_t)n_in * n_out;
                    size_t db, sb;
                    kc_weight_sizes(type, n_in, NE * n_out, &db, &sb);
                    uint8_t *blocks = malloc(mb * NE);
                    float *wf = malloc(nw * NE * 4), *x = rnd((size_t)nx * n_in, 1.0f), *lg = rnd((size_t)T * NE, 2.0f);
                    for (int t = 0; t < T; t++) lg[(size_t)t * NE + 5] = -1e30f; /* expert 5: never chosen */
                    for (int e = 0; e < NE; e++) {
                        float *w = rnd(nw, 0.3f);
                        dt_quantize(type, w, blocks + e * mb, (int64_t)nw);
                        dt_dequantize(type, blocks + e * mb, wf + e * nw, (int64_t)nw);
                        free(w);
                    }
                    kc_weight W = weight_up(type, blocks, n_in, NE * n_out); /* the experts' rows stacked */
                    CK(cudaMemset((uint8_t *)W.data + 5 * (db / NE), 0xff, db / NE)); /* NaN / garbage: must not be read */
                    CK(cudaMemset((uint8_t *)W.d + 5 * (sb / NE), 0xff, sb / NE));
                    int32_t *ridx = malloc((size_t)T * K * 4);
                    float *rw = malloc((size_t)T * K * 4), *ref = malloc((size_t)T * K * n_out * 4), *got = malloc((size_t)T * K * n_out * 4),
                          *one = malloc((size_t)K * n_out * 4);
                    for (int t = 0; t < T; t++) k_topk_route(lg + (size_t)t * NE, NE, K, 1, ridx + (size_t)t * K, rw + (size_t)t * K);
                    for (int i = 0; i < T * K; i++)
                        for (int o = 0; o < n_out; o++) {
                            double a = 0;
                            for (int c = 0; c < n_in; c++)
                                a += (double)wf[(size_t)ridx[i] * nw + (size_t)o * n_in + c] * x[(size_t)(i / x_div) * n_in + c];
                            ref[(size_t)i * n_out + o] = (float)a;
                        }
                    kc_xq xq = xq_new(nx, n_in, 0);
                    float *dx = up(x, (size_t)nx * n_in * 4), *dlg = up(lg, (size_t)T * NE * 4), *drw = dnew((size_t)T * K * 4),
                          *dy = dnew((size_t)T * K * n_out * 4);
                    int32_t *didx = dnew((size_t)T * K * 4), *dcnt = dnew(NE * 4), *doff = dnew(NE * 4), *dlist = dnew((size_t)T * K * 4);
                    int rc = kc_quantize_x(dx, nx, n_in, &xq, s);
                    rc |= kc_moe_route(dlg, T, NE, K, 1, didx, drw, dcnt, doff, dlist, s);
                    rc |= kc_moe_gemvq(&W, NE, &xq, x_div, dcnt, doff, dlist, T, K, dy, s);
                    CK(cudaStreamSynchronize(s));
                    down(got, dy, (size_t)T * K * n_out * 4);
                    /* token 0 alone (its rows of x, its logits) */
                    rc |= kc_moe_route(dlg, 1, NE, K, 1, didx, drw, dcnt, doff, dlist, s);
                    rc |= kc_moe_gemvq(&W, NE, &xq, x_div, dcnt, doff, dlist, 1, K, dy, s);
                    CK(cudaStreamSynchronize(s));
                    down(one, dy, (size_t)K * n_out * 4);
                    double e = rel_err_f(got, ref, (size_t)T * K * n_out);
                    T_CHECKF(rc == 0 && e < 1e-4 && memcmp(one, got, (size_t)K * n_out * 4) == 0,
                             "kc_moe_gemvq %s n_in=%d x_div=%d T=%d: rel_err %.3g, token 0 alone the same bits %d", dt_name(type), n_in,
                             x_div, T, e, memcmp(one, got, (size_t)K * n_out * 4) == 0);
                    if (T > 1) { /* the tensor-core form on half activations (f16 operands, f32 sums: ~1e-3) */
                        uint16_t *xh = malloc((size_t)nx * n_in * 2);
                        dt_quantize(DT_F16, x, xh, (int64_t)nx * n_in);
                        kc_half *dxh = up(xh, (size_t)nx * n_in * 2);
                        rc = kc_moe_route(dlg, T, NE, K, 1, didx, drw, dcnt, doff, dlist, s);
                        CK(cudaMemset(dy, 0xff, (size_t)T * K * n_out * 4)); /* every entry's row must be written */
                        rc |= kc_moe_gemmq(&W, NE, dxh, x_div, dcnt, doff, dlist, T, K, dy, s);
                        CK(cudaStreamSynchronize(s));
                        down(got, dy, (size_t)T * K * n_out * 4);
                        double e2 = rel_err_f(got, ref, (size_t)T * K * n_out);
                        T_CHECKF(rc == 0 && e2 < 5e-3, "kc_moe_gemmq %s n_in=%d x_div=%d T=%d: rel_err %.3g", dt_name(type), n_in, x_div,
                                 T, e2);
                        free(xh);
                        cudaFree(dxh);
                    }
                    free(blocks); free(wf); free(x); free(lg); free(ridx); free(rw); free(ref); free(got); free(one);
                    xq_del(&xq);
                    void *ds[] = { W.data, W.d, dx, dlg, drw, dy, didx, dcnt, doff, dlist };
                    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) cudaFree(ds[i]);
                }
    T_CHECK(!kc_moe_type_ok(DT_Q4_K, 512 + 32) && !kc_moe_type_ok(DT_F32, 512) && kc_moe_type_ok(DT_Q8_0, 96) &&
            kc_moe_type_ok(DT_F16, 40));
}

/* The MoE decode-step launches (the plan's moe_fuse) against the separate kernels they replace.
 * kc_moe_norm_route: y and the blocks with the bits of kc_rmsnorm_xq; the logits against a
 * double-precision product of the router (F32, F16, BF16 as stored) with that y; idx, w, cnt and
 * off the bits of kc_moe_route on the same logits, every entry once under its expert; launched
 * twice (the count of finished CTAs left at 0). Rows of 512 to 4096 (the router row past what a
 * lane holds from before the wait), 8 to 128 experts, 1 to 8 tokens.
 * kc_moe_gemvq_glu then kc_moe_gemvq_f against kc_moe_gemvq, kc_glu (split rows, row weights,
 * blocks) and kc_moe_gemvq: the same bits in the activations and the outputs, every type, rows
 * of 512 and 1536 (half and whole warps a row), 1, 3 and 8 tokens. */
static void test_moe_fused(cudaStream_t s) {
    const int nr_cfgs[][5] = { /* n, n_exp, k, n_tok, router type */
                               { 2048, 128, 8, 1, DT_F32 }, { 2048, 128, 8, 8, DT_F32 }, { 512, 8, 2, 5, DT_F16 },
                               { 1536, 60, 4, 3, DT_BF16 }, { 4096, 8, 2, 2, DT_F32 }, { 512, 6, 6, 1, DT_F16 } };
    for (size_t ci = 0; ci < sizeof nr_cfgs / sizeof *nr_cfgs; ci++) {
        const int n = nr_cfgs[ci][0], NE = nr_cfgs[ci][1], K = nr_cfgs[ci][2], T = nr_cfgs[ci][3], rt = nr_cfgs[ci][4];
        const size_t nw = (size_t)NE * n, es = dt_row_size(rt, 1);
        float *x = rnd((size_t)T * n, 2.0f), *g = rnd(n, 1.0f), *wr = rnd(nw, 0.05f);
        void *wb = malloc(nw * es);
        dt_quantize(rt, wr, wb, (int64_t)nw);
        dt_dequantize(rt, wb, wr, (int64_t)nw);
        kc_weight R = { .type = rt, .n_in = n, .n_out = NE };
        R.data = up(wb, nw * es);
        float *dx = up(x, (size_t)T * n * 4), *dg = up(g, (size_t)n * 4), *dya = dnew((size_t)T * n * 4), *dyb = dnew((size_t)T * n * 4),
              *dlg = dnew((size_t)T * NE * 4), *dw = dnew((size_t)T * K * 4), *dw2 = dnew((size_t)T * K * 4);
        int32_t *didx = dnew((size_t)T * K * 4), *dcnt = dnew(NE * 4), *doff = dnew(NE * 4), *dlist = dnew((size_t)T * K * 4),
                *didx2 = dnew((size_t)T * K * 4), *dcnt2 = dnew(NE * 4), *doff2 = dnew(NE * 4), *dlist2 = dnew((size_t)T * K * 4),
                *dctr = up(&(int32_t){ 0 }, 4);
        kc_xq qa = xq_new(T, n, 0), qb = xq_new(T, n, 0);
        T_CHECKF(kc_moe_norm_route_ok(&R, T, n), "kc_moe_norm_route_ok n=%d NE=%d T=%d", n, NE, T);
        int rc = 0;
        for (int rep = 0; rep < 2; rep++) {
            xq_poison(&qa);
            rc |= kc_moe_norm_route(dx, dg, dya, &qa, T, n, 1e-6f, &R, dlg, K, 1, didx, dw, dcnt, doff, dlist, dctr, s);
        }
        rc |= kc_rmsnorm_xq(dx, dg, dyb, &qb, T, n, 1e-6f, s);
        rc |= kc_moe_route(dlg, T, NE, K, 1, didx2, dw2, dcnt2, doff2, dlist2, s);
        CK(cudaStreamSynchronize(s));
        {   /* without the grouping: the same choices and weights */
            int32_t *di3 = dnew((size_t)T * K * 4);
            float *dw3 = dnew((size_t)T * K * 4);
            int r3 = kc_moe_norm_route(dx, dg, NULL, &qa, T, n, 1e-6f, &R, dlg, K, 1, di3, dw3, NULL, NULL, NULL, dctr, s);
            CK(cudaStreamSynchronize(s));
            T_CHECKF(r3 == 0 && dev_same(di3, didx2, (size_t)T * K * 4) && dev_same(dw3, dw2, (size_t)T * K * 4),
                     "kc_moe_norm_route without grouping n=%d NE=%d T=%d: the same choices (rc %d)", n, NE, T, r3);
            cudaFree(di3);
            cudaFree(dw3);
        }
        int32_t ctr = -1;
        down(&ctr, dctr, 4);
        const int norm_same = dev_same(dya, dyb, (size_t)T * n * 4) && xq_same(&qa, &qb, T, n);
        const int route_same = dev_same(didx, didx2, (size_t)T * K * 4) && dev_same(dw, dw2, (size_t)T * K * 4) &&
                               dev_same(dcnt, dcnt2, NE * 4) && dev_same(doff, doff2, NE * 4);
        float *y = malloc((size_t)T * n * 4), *lg = malloc((size_t)T * NE * 4), *ref = malloc((size_t)T * NE * 4);
        int32_t *idx = malloc((size_t)T * K * 4), *cnt = malloc(NE * 4), *off = malloc(NE * 4), *list = malloc((size_t)T * K * 4);
        down(y, dyb, (size_t)T * n * 4);
        down(lg, dlg, (size_t)T * NE * 4);
        down(idx, didx, (size_t)T * K * 4);
        down(cnt, dcnt, NE * 4);
        down(off, doff, NE * 4);
        down(list, dlist, (size_t)T * K * 4);
        for (int t = 0; t < T; t++)
            for (int e = 0; e < NE; e++) {
                double a = 0;
                for (int i = 0; i < n; i++) a += (double)wr[(size_t)e * n + i] * y[(size_t)t * n + i];
                ref[(size_t)t * NE + e] = (float)a;
            }
        const double le = rel_err_f(lg, ref, (size_t)T * NE);
        const int grouped = grouping_ok(idx, cnt, off, list, NE, T * K);
        T_CHECKF(rc == 0 && norm_same && le < 1e-5 && route_same && grouped && ctr == 0,
                 "kc_moe_norm_route n=%d NE=%d k=%d T=%d %s: norm bits %d, logits rel_err %.3g, routing bits %d, grouped %d, "
                 "count %d (rc %d)",
                 n, NE, K, T, dt_name(rt), norm_same, le, route_same, grouped, ctr, rc);
        free(x); free(g); free(wr); free(wb); free(y); free(lg); free(ref); free(idx); free(cnt); free(off); free(list);
        xq_del(&qa); xq_del(&qb);
        void *ds[] = { R.data, dx, dg, dya, dyb, dlg, dw, dw2, didx, dcnt, doff, dlist, didx2, dcnt2, doff2, dlist2, dctr };
        for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) cudaFree(ds[i]);
    }
    {   /* what it refuses: rows not of 512, a quantized router, more than KC_GEMV_MAX_TOK tokens */
        kc_weight r1 = { .type = DT_F32, .n_in = 640, .n_out = 8 }, r2 = { .type = DT_Q8_0, .n_in = 512, .n_out = 8 },
                  r3 = { .type = DT_F32, .n_in = 512, .n_out = 8 };
        T_CHECK(!kc_moe_norm_route_ok(&r1, 1, 640) && !kc_moe_norm_route_ok(&r2, 1, 512) &&
                !kc_moe_norm_route_ok(&r3, KC_GEMV_MAX_TOK + 1, 512) && kc_moe_norm_route_ok(&r3, KC_GEMV_MAX_TOK, 512));
    }

    const int types[] = { DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K };
    const int shapes[][2] = { { 512, 256 }, { 1536, 768 } }, toks[] = { 1, 3, 8 }, NE = 6, K = 2;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < 2; si++)
            for (size_t ni = 0; ni < 3; ni++) {
                const int type = types[ti], E = shapes[si][0], F = shapes[si][1], T = toks[ni];
                const size_t ngu = (size_t)NE * 2 * F * E, ndn = (size_t)NE * E * F;
                uint8_t *bgu = malloc(dt_row_size(type, E) * 2 * F * NE), *bdn = malloc(dt_row_size(type, F) * E * NE);
                float *wgu = rnd(ngu, 0.3f), *wdn = rnd(ndn, 0.3f), *x = rnd((size_t)T * E, 1.0f), *lg = rnd((size_t)T * NE, 2.0f);
                dt_quantize(type, wgu, bgu, (int64_t)ngu);
                dt_quantize(type, wdn, bdn, (int64_t)ndn);
                kc_weight Wgu = weight_up(type, bgu, E, NE * 2 * F), Wdn = weight_up(type, bdn, F, NE * E);
                kc_xq xq = xq_new(T, E, 0), xf = xq_new(T * K, F, 0);
                kc_half *xfh = xf.xh;
                xf.xh = NULL; /* the blocks only, as the backend asks kc_glu for them */
                float *dx = up(x, (size_t)T * E * 4), *dlg = up(lg, (size_t)T * NE * 4), *drw = dnew((size_t)T * K * 4),
                      *degu = dnew((size_t)T * K * 2 * F * 4), *dact_a = dnew((size_t)T * K * F * 4), *dact_b = dnew((size_t)T * K * F * 4),
                      *dout_a = dnew((size_t)T * K * E * 4), *dout_b = dnew((size_t)T * K * E * 4);
                int32_t *didx = dnew((size_t)T * K * 4), *dcnt = dnew(NE * 4), *doff = dnew(NE * 4), *dlist = dnew((size_t)T * K * 4);
                int rc = kc_quantize_x(dx, T, E, &xq, s);
                rc |= kc_moe_route(dlg, T, NE, K, 1, didx, drw, dcnt, doff, dlist, s);
                rc |= kc_moe_gemvq(&Wgu, NE, &xq, K, dcnt, doff, dlist, T, K, degu, s);
                rc |= kc_glu(degu, dact_a, &xf, T * K, F, MDL_ACT_SILU, 1, drw, s);
                rc |= kc_moe_gemvq(&Wdn, NE, &xf, 1, dcnt, doff, dlist, T, K, dout_a, s);
                const int ok_f = kc_moe_gemvq_f_ok(&Wdn, NE, T);
                /* one token: the CTAs read the choices (no grouping given) */
                const int32_t *gc = T == 1 ? NULL : dcnt, *go = T == 1 ? NULL : doff, *gl = T == 1 ? NULL : dlist;
                rc |= kc_moe_gemvq_glu(&Wgu, NE, &xq, K, didx, gc, go, gl, T, K, drw, dact_b, s);
                rc |= kc_moe_gemvq_f(&Wdn, NE, dact_b, didx, gc, go, gl, T, K, dout_b, s);
                CK(cudaStreamSynchronize(s));
                float *oa = malloc((size_t)T * K * E * 4);
                down(oa, dout_a, (size_t)T * K * E * 4);
                int fin = 1;
                for (size_t i = 0; i < (size_t)T * K * E; i++) fin &= isfinite(oa[i]) != 0;
                const int act_same = dev_same(dact_a, dact_b, (size_t)T * K * F * 4),
                          out_same = dev_same(dout_a, dout_b, (size_t)T * K * E * 4);
                T_CHECKF(rc == 0 && ok_f && fin && act_same && out_same,
                         "kc_moe_gemvq_glu + kc_moe_gemvq_f %s E=%d F=%d T=%d: the bits of gemvq + glu + gemvq: act %d, out %d (rc %d)",
                         dt_name(type), E, F, T, act_same, out_same, rc);
                if (T == 1) { /* the plan's moe_pre: the same bits, whatever the early read of the choices found */
                    kc_plan keep = *kc_plan_get(), pl = keep;
                    for (int pre = 1; pre <= 7; pre++) {
                        pl.moe_pre = pre;
                        kc_plan_set(&pl);
                        CK(cudaMemset(dact_b, 0xff, (size_t)K * F * 4));
                        CK(cudaMemset(dout_b, 0xff, (size_t)K * E * 4));
                        int r2 = kc_moe_gemvq_glu(&Wgu, NE, &xq, K, didx, NULL, NULL, NULL, 1, K, drw, dact_b, s);
                        r2 |= kc_moe_gemvq_f(&Wdn, NE, dact_b, didx, NULL, NULL, NULL, 1, K, dout_b, s);
                        /* the choices zeroed, then written again by the launch just before: the down
                         * launch may read the zeros first (expert 0's rows, loaded again) */
                        r2 |= kc_moe_gemvq_glu(&Wgu, NE, &xq, K, didx, NULL, NULL, NULL, 1, K, drw, dact_b, s);
                        CK(cudaMemsetAsync(didx, 0, (size_t)K * 4, s));
                        r2 |= kc_moe_route(dlg, 1, NE, K, 1, didx, drw, dcnt, doff, dlist, s);
                        r2 |= kc_moe_gemvq_f(&Wdn, NE, dact_b, didx, NULL, NULL, NULL, 1, K, dout_b, s);
                        CK(cudaStreamSynchronize(s));
                        const int same = dev_same(dact_a, dact_b, (size_t)K * F * 4) && dev_same(dout_a, dout_b, (size_t)K * E * 4);
                        T_CHECKF(r2 == 0 && same, "kc_moe_gemvq_glu + kc_moe_gemvq_f %s E=%d F=%d, moe_pre=%d: the same bits %d (rc %d)",
                                 dt_name(type), E, F, pre, same, r2);
                    }
                    kc_plan_set(&keep);
                }
                free(bgu); free(bdn); free(wgu); free(wdn); free(x); free(lg); free(oa);
                xq_del(&xq);
                cudaFree(xf.qh); cudaFree(xf.ql); cudaFree(xf.m); cudaFree(xfh);
                void *ds[] = { Wgu.data, Wgu.d, Wdn.data, Wdn.d, dx, dlg, drw, degu, dact_a, dact_b, dout_a, dout_b, didx, dcnt, doff, dlist };
                for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) cudaFree(ds[i]);
            }
    {   /* what they refuse: more than KC_GEMV_MAX_TOK tokens, an F16 expert */
        kc_weight q = { .type = DT_Q4_K, .n_in = 768, .n_out = 6 * 512 }, h = { .type = DT_F16, .n_in = 768, .n_out = 6 * 512 };
        T_CHECK(kc_moe_gemvq_f_ok(&q, 6, KC_GEMV_MAX_TOK) && !kc_moe_gemvq_f_ok(&q, 6, KC_GEMV_MAX_TOK + 1) && !kc_moe_gemvq_f_ok(&h, 6, 1));
    }
}

/* RoPE from the CPU's per-pair table (yarn with an attention factor, longrope, partial
 * rotation), with and without QK-norm in the same kernel: q against k_rmsnorm + k_rope, k in
 * the cache as half of theirs, v copied. */
static void test_rope_table(cudaStream_t s) {
    const float longf[8] = { 1, 1.5f, 2, 3, 4, 6, 8, 12 }, shortf[8] = { 1, 1, 1.1f, 1.2f, 1.5f, 2, 2, 3 };
    const int hds[3] = { 32, 128, 256 };
    for (int hi = 0; hi < 3; hi++)
        for (int v = 0; v < 3; v++)
            for (int qn = 0; qn < 2; qn++) {
                const int hd = hds[hi], n_head = 4, n_kv = 2, n_tok = 6, bs = 16, max_blocks = 4;
                const int rd = v == 2 ? 16 : hd; /* longrope: partial rotation (16 of hd) */
                float longv[128], shortv[128];
                for (int i = 0; i < 128; i++) longv[i] = longf[i % 8], shortv[i] = shortf[i % 8];
                mdl_rope r = { .dim = rd, .layout = v == 1 ? MDL_ROPE_ADJACENT : MDL_ROPE_HALF, .base = 10000.0f, .factor = 4.0f,
                               .beta_fast = 32.0f, .beta_slow = 1.0f, .attn_factor = v == 0 ? 1.2f : 1.0f, .orig_ctx = 64 };
                r.scaling = v == 2 ? MDL_ROPE_SCALING_LONGROPE : MDL_ROPE_SCALING_YARN;
                r.long_factor = longv;
                r.short_factor = shortv;
                k_rope_params rp;
                T_CHECK(k_rope_init_layer(&rp, &r, v == 2 ? 32 : 256) == 0);
                float fr[128];
                for (int i = 0; i < rd / 2; i++) fr[i] = (float)rp.inv_freq[i];
                const int row = (n_head + 2 * n_kv) * hd;
                float *qkv = rnd((size_t)n_tok * row, 2.0f), *q = malloc((size_t)n_tok * n_head * hd * 4),
                      *k = malloc((size_t)n_tok * n_kv * hd * 4), *qw = rnd(hd, 1.5f), *kw = rnd(hd, 1.5f);
                int32_t pos[6] = { 0, 1, 7, 30, 31, 63 }, seq[6] = { 0 }, bt[4] = { 3, 1, 0, 2 };
                for (int t = 0; t < n_tok; t++) {
                    memcpy(q + (size_t)t * n_head * hd, qkv + (size_t)t * row, (size_t)n_head * hd * 4);
                    memcpy(k + (size_t)t * n_kv * hd, qkv + (size_t)t * row + n_head * hd, (size_t)n_kv * hd * 4);
                }
                if (qn) {
                    k_rmsnorm(q, qw, (int64_t)n_tok * n_head, hd, 1e-6f, q);
                    k_rmsnorm(k, kw, (int64_t)n_tok * n_kv, hd, 1e-6f, k);
                }
                k_rope(&rp, q, n_tok, n_head, hd, pos);
                k_rope(&rp, k, n_tok, n_kv, hd, pos);
                float *dqw = up(qw, hd * 4), *dkw = up(kw, hd * 4);
                kc_rope kr = { .layout = r.layout, .rope_dim = rd, .base = r.base, .freq = up(fr, sizeof fr), .mscale = (float)rp.mscale,
                               .q_norm = qn ? dqw : NULL, .k_norm = qn ? dkw : NULL, .norm_eps = 1e-6f };
                const size_t ce = (size_t)max_blocks * n_kv * bs * hd;
                float *dqkv = up(qkv, (size_t)n_tok * row * 4), *dq = dnew((size_t)n_tok * n_head * hd * 4);
                kc_half *dk = dnew(ce * 2), *dv = dnew(ce * 2);
                int32_t *dpos = up(pos, sizeof pos), *dseq = up(seq, sizeof seq), *dbt = up(bt, sizeof bt);
                int rc = kc_rope_store_kv(dqkv, dq, dk, dv, dpos, dseq, dbt, max_blocks, n_tok, n_head, n_kv, hd, bs, &kr, s);
                CK(cudaStreamSynchronize(s));
                float *gq = malloc((size_t)n_tok * n_head * hd * 4), *gk = malloc((size_t)n_tok * n_kv * hd * 4),
                      *gv = malloc((size_t)n_tok * n_kv * hd * 4), *rv = malloc((size_t)n_tok * n_kv * hd * 4);
                uint16_t *kc = malloc(ce * 2), *vc = malloc(ce * 2);
                down(gq, dq, (size_t)n_tok * n_head * hd * 4);
                down(kc, dk, ce * 2);
                down(vc, dv, ce * 2);
                for (int t = 0; t < n_tok; t++)
                    for (int h = 0; h < n_kv; h++)
                        for (int e = 0; e < hd; e++) {
                            const size_t ci = (((size_t)bt[pos[t] / bs] * n_kv + h) * bs + pos[t] % bs) * hd + e, gi = ((size_t)t * n_kv + h) * hd + e;
                            gk[gi] = dt_f16_to_f32(kc[ci]);
                            gv[gi] = dt_f16_to_f32(vc[ci]);
                            rv[gi] = qkv[(size_t)t * row + (n_head + n_kv + h) * hd + e];
                        }
                double eq = rel_err_f(gq, q, (size_t)n_tok * n_head * hd), ek = rel_err_f(gk, k, (size_t)n_tok * n_kv * hd),
                       ev = rel_err_f(gv, rv, (size_t)n_tok * n_kv * hd);
                T_CHECKF(rc == 0 && eq < 1e-4 && ek < 1e-3 && ev < 1e-3, "rope table %s hd %d dim %d qk-norm %d: q rel_err %.3g, k (half) %.3g, v %.3g",
                         v == 2 ? "longrope" : v == 1 ? "yarn adjacent" : "yarn", hd, rd, qn, eq, ek, ev);
                free(qkv); free(q); free(k); free(qw); free(kw); free(gq); free(gk); free(gv); free(rv); free(kc); free(vc);
                cudaFree((void *)kr.freq); cudaFree(dqw); cudaFree(dkw); cudaFree(dqkv); cudaFree(dq); cudaFree(dk); cudaFree(dv);
                cudaFree(dpos); cudaFree(dseq); cudaFree(dbt);
            }
}

/* Reference attention of one (query, head): scale, soft-cap, window, over the paged cache. */
static void attn_ref(const float *q, const uint16_t *kc, const uint16_t *vc, const int32_t *bt, int n_kv, int bs, int hd, int kvh, int p,
                     float scale, float cap, int window, float *out) {
    const int lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    double m = -INFINITY, l = 0, *sc = malloc((size_t)(p + 1) * 8), acc[256] = { 0 };
    for (int j = lo; j <= p; j++) {
        const size_t base = (((size_t)bt[j / bs] * n_kv + kvh) * bs + j % bs) * hd;
        double d = 0;
        for (int e = 0; e < hd; e++) d += (double)q[e] * dt_f16_to_f32(kc[base + e]);
        d *= scale;
        if (cap > 0) d = cap * tanh(d / cap);
        sc[j] = d;
        if (d > m) m = d;
    }
    for (int j = lo; j <= p; j++) {
        const size_t base = (((size_t)bt[j / bs] * n_kv + kvh) * bs + j % bs) * hd;
        double w = exp(sc[j] - m);
        l += w;
        for (int e = 0; e < hd; e++) acc[e] += w * dt_f16_to_f32(vc[base + e]);
    }
    for (int e = 0; e < hd; e++) out[e] = (float)(acc[e] / l);
    free(sc);
}

/* Sequences of lens[] positions whose last nq[] tokens are queries; with a window, the blocks
 * wholly before the first query's window point at a block of NaNs. Per-head kernel (1 and
 * several splits, merge kernel and counters), tensor-core decode (last tokens) and prefill
 * (tiles of the queries) when they take the head dim. */
static void test_attention_mods(cudaStream_t s, int hd, int G, float cap, int window) {
    const int n_kv = 2, n_head = n_kv * G, bs = 16, n_seq = 4, nqd = n_head * hd;
    const int lens[4] = { 1, 20, 100, 300 }, nq[4] = { 1, 20, 37, 40 };
    const int max_blocks = (300 + bs - 1) / bs;
    int n_used = 0, n_tok = 0;
    for (int q = 0; q < n_seq; q++) n_used += (lens[q] + bs - 1) / bs, n_tok += nq[q];
    const int nan_blk = n_used, n_phys = n_used + 1;
    int32_t *bt = malloc((size_t)n_seq * max_blocks * 4);
    for (int q = 0, k = n_used - 1; q < n_seq; q++) /* reversed physical order */
        for (int j = 0; j < max_blocks; j++) {
            const int first_q = lens[q] - nq[q], lo = window > 0 && first_q - window + 1 > 0 ? first_q - window + 1 : 0;
            if (j >= (lens[q] + bs - 1) / bs) bt[q * max_blocks + j] = nan_blk;
            else {
                int id = k--;
                bt[q * max_blocks + j] = (j + 1) * bs <= lo ? nan_blk : id; /* freed: wholly before the window */
            }
        }
    const size_t ce = (size_t)n_phys * n_kv * bs * hd;
    uint16_t *kc = malloc(ce * 2), *vc = malloc(ce * 2);
    for (size_t i = 0; i < ce; i++) kc[i] = vc[i] = 0x7e00; /* NaN */
    for (int q = 0; q < n_seq; q++)
        for (int j = 0; j < lens[q]; j++) {
            const int b = bt[q * max_blocks + j / bs];
            if (b == nan_blk) continue;
            for (int h = 0; h < n_kv; h++)
                for (int e = 0; e < hd; e++) {
                    const size_t i = (((size_t)b * n_kv + h) * bs + j % bs) * hd + e;
                    kc[i] = dt_f32_to_f16(frand());
                    vc[i] = dt_f32_to_f16(frand());
                }
        }
    float *qh = rnd((size_t)n_tok * nqd, 3.0f), *ref = malloc((size_t)n_tok * nqd * 4), *got = malloc((size_t)n_tok * nqd * 4);
    int32_t *pos = malloc((size_t)n_tok * 4), *seq = malloc((size_t)n_tok * 4);
    const float scale = 0.7f / sqrtf((float)hd);
    for (int q = 0, t = 0; q < n_seq; q++)
        for (int j = lens[q] - nq[q]; j < lens[q]; j++, t++) {
            pos[t] = j;
            seq[t] = q;
            for (int h = 0; h < n_head; h++)
                attn_ref(qh + ((size_t)t * n_head + h) * hd, kc, vc, bt + q * max_blocks, n_kv, bs, hd, h / G, j, scale, cap, window,
                         ref + ((size_t)t * n_head + h) * hd);
        }
    kc_half *dk = up(kc, ce * 2), *dv = up(vc, ce * 2);
    float *dq = up(qh, (size_t)n_tok * nqd * 4), *dout = dnew((size_t)n_tok * nqd * 4);
    int32_t *dpos = up(pos, (size_t)n_tok * 4), *dseq = up(seq, (size_t)n_tok * 4), *dbt = up(bt, (size_t)n_seq * max_blocks * 4);
    const int chunk = 64, ns_all = (300 + chunk - 1) / chunk;
    float *part = dnew((size_t)n_tok * n_head * ns_all * (hd + 2) * 4);
    int *cnt;
    CK(cudaMalloc((void **)&cnt, (size_t)n_tok * n_head * 4));
    CK(cudaMemset(cnt, 0, (size_t)n_tok * n_head * 4));
    const kc_attn_mods mods = { .softcap = cap, .window = window };
    /* per-head kernel: one split (chunk covering everything), several with the merge kernel, several with counters */
    for (int mode = 0; mode < 3; mode++) {
        CK(cudaMemset(dout, 0xff, (size_t)n_tok * nqd * 4));
        kc_attention_mods(&mods);
        int rc = mode == 0 ? kc_attention_ex(dq, dk, dv, dout, NULL, dpos, dseq, dbt, max_blocks, n_tok, n_head, n_kv, hd, bs, scale, 1,
                                             ns_all * chunk, 0, part, NULL, 0, s)
                           : kc_attention_ex(dq, dk, dv, dout, NULL, dpos, dseq, dbt, max_blocks, n_tok, n_head, n_kv, hd, bs, scale,
                                             ns_all, chunk, 0, part, mode == 2 ? cnt : NULL, 0, s);
        kc_attention_mods(NULL);
        CK(cudaStreamSynchronize(s));
        down(got, dout, (size_t)n_tok * nqd * 4);
        double e = rel_err_f(got, ref, (size_t)n_tok * nqd);
        T_CHECKF(rc == 0 && e < 2e-3, "per-head attention hd=%d G=%d cap=%g window=%d %s: rel_err %.3g", hd, G, cap, window,
                 mode == 0 ? "1 split" : mode == 1 ? "splits + merge kernel" : "splits + counters", e);
    }
    if (kc_attention_tc_ok(hd, n_head, n_kv, bs)) {
        /* decode: each sequence's last token */
        int32_t lst[4], *dl, *dchunk;
        float *rd = malloc((size_t)n_seq * nqd * 4), *gd = malloc((size_t)n_seq * nqd * 4);
        for (int q = 0, t0 = 0; q < n_seq; t0 += nq[q], q++) {
            lst[q] = t0 + nq[q] - 1;
            memcpy(rd + (size_t)q * nqd, ref + (size_t)lst[q] * nqd, (size_t)nqd * 4);
        }
        dl = up(lst, sizeof lst);
        CK(cudaMalloc((void **)&dchunk, 4));
        const int splits[3] = { 1, 1, ns_all }; /* arm 1: a warp a KV head (the plan's att_dec_hpw) */
        const kc_plan plan0 = *kc_plan_get();
        for (int si = 0; si < 3; si++) {
            const int ns = splits[si], ch = (ns_all + ns - 1) / ns * 64;
            kc_plan ph = plan0;
            ph.att_dec_hpw = si == 1 ? 1 : 0;
            kc_plan_set(&ph);
            CK(cudaMemcpy(dchunk, &ch, 4, cudaMemcpyHostToDevice));
            CK(cudaMemset(dout, 0xff, (size_t)n_tok * nqd * 4));
            kc_attention_mods(&mods);
            int rc = kc_attention_decode_tc(dq, dk, dv, dout, NULL, dl, n_seq, dpos, dseq, dbt, max_blocks, n_head, n_kv, hd, bs, scale,
                                            ns, dchunk, part, cnt, s);
            kc_attention_mods(NULL);
            kc_plan_set(&plan0);
            CK(cudaStreamSynchronize(s));
            down(got, dout, (size_t)n_tok * nqd * 4);
            for (int q = 0; q < n_seq; q++) memcpy(gd + (size_t)q * nqd, got + (size_t)lst[q] * nqd, (size_t)nqd * 4);
            double e = rel_err_f(gd, rd, (size_t)n_seq * nqd);
            T_CHECKF(rc == 0 && e < 5e-3, "tc decode hd=%d G=%d cap=%g window=%d splits=%d%s: rel_err %.3g", hd, G, cap, window, ns,
                     si == 1 ? " (a warp a KV head)" : "", e);
        }
        /* prefill: the queries in tiles (4 and 8 warps, then the wgmma kernel where it runs) */
        for (int kind = 0; kind < 3; kind++) { /* kind 2: the wgmma kernel */
            const int warps = kind ? 8 : 4, fa3 = kind == 2;
            if (fa3 && !kc_attention_fa3_ok(hd, n_head, n_kv, bs)) continue;
            const int tt = fa3 ? kc_attention_fa3_tile_tok(n_head, n_kv) : kc_attention_tc_tile_tok(warps, n_head, n_kv);
            int32_t tiles[2 * 64];
            int nt = 0;
            for (int q = 0, t0 = 0; q < n_seq; t0 += nq[q], q++)
                for (int j = 0; j < nq[q]; j += tt) {
                    tiles[2 * nt] = t0 + j;
                    tiles[2 * nt + 1] = nq[q] - j < tt ? nq[q] - j : tt;
                    nt++;
                }
            int32_t *dt = up(tiles, (size_t)nt * 8);
            CK(cudaMemset(dout, 0xff, (size_t)n_tok * nqd * 4));
            kc_attention_mods(&mods);
            int rc = fa3 ? kc_attention_prefill_fa3(dq, NULL, dk, dv, dout, dt, nt, dpos, dseq, dbt, max_blocks, n_head, n_kv, hd,
                                                    bs, scale, s)
                         : kc_attention_prefill_tc(dq, dk, dv, dout, dt, nt, dpos, dseq, dbt, max_blocks, n_head, n_kv, hd, bs,
                                                   scale, warps, s);
            kc_attention_mods(NULL);
            CK(cudaStreamSynchronize(s));
            down(got, dout, (size_t)n_tok * nqd * 4);
            double e = rel_err_f(got, ref, (size_t)n_tok * nqd);
            T_CHECKF(rc == 0 && e < 5e-3, "%s prefill hd=%d G=%d cap=%g window=%d warps=%d: rel_err %.3g", fa3 ? "fa3" : "tc",
                     hd, G, cap, window, fa3 ? 12 : warps, e);
            cudaFree(dt);
        }
        free(rd); free(gd);
        cudaFree(dl); cudaFree(dchunk);
    }
    free(bt); free(kc); free(vc); free(qh); free(ref); free(got); free(pos); free(seq);
    cudaFree(dk); cudaFree(dv); cudaFree(dq); cudaFree(dout); cudaFree(dpos); cudaFree(dseq); cudaFree(dbt); cudaFree(part); cudaFree(cnt);
}

/* ---- the fused launches of the Gemma layers --------------------------------------------------- */

static void plan_glu_fuse(int n) {
    kc_plan p = *kc_plan_get();
    p.swiglu_fuse = n;
    kc_plan_set(&p);
}

/* kc_matmul_glu (gate|up rows interleaved) for SwiGLU and GeGLU, F16 / Q8_0 / Q4_K, 1..8 tokens
 * (the GEMV; fused into its epilogue for F16 wherever a warp holds gate and up rows, with the
 * plan's limit raised to 8) and 12, 40 (the matmul paths): output, half copy and blocks the same
 * bits as kc_matmul_xq + kc_glu + kc_quantize_x, gu left alone where fused (one token at the
 * default plan too), and the output against the CPU (double GEMV of the same weights, k_swiglu /
 * k_geglu). */
static void test_matmul_glu(cublasHandle_t cb, cudaStream_t s) {
    const int types[] = { DT_F16, DT_Q8_0, DT_Q4_K }, ntoks[] = { 1, 2, 3, 4, 5, 6, 7, 8, 12, 40 };
    const int n_in = 512, n_ff = 96, ntmax = 40, cap = KC_GEMV_MAX_TOK;
    const int dflt = kc_plan_get()->swiglu_fuse;
    float *x = rnd((size_t)ntmax * n_in, 1.0f), *wf = rnd((size_t)2 * n_ff * n_in, 0.1f);
    double *gref = malloc((size_t)ntmax * 2 * n_ff * sizeof(double));
    float *ref = malloc((size_t)ntmax * n_ff * 4), *got = malloc((size_t)ntmax * n_ff * 4), gate[96], upv[96];
    float *dx = up(x, (size_t)ntmax * n_in * 4), *dgu = dnew((size_t)ntmax * 2 * n_ff * 4), *dgu2 = dnew((size_t)ntmax * 2 * n_ff * 4);
    float *dout = dnew((size_t)ntmax * n_ff * 4), *dout2 = dnew((size_t)ntmax * n_ff * 4);
    kc_gemm_ws ws = { .cublas = cb, .xq = xq_new(cap, n_in, 0) };
    ws.w_cap = (size_t)2 * n_ff * n_in;
    ws.x_cap = (size_t)ntmax * n_in;
    CK(cudaMalloc((void **)&ws.w_half, ws.w_cap * 2));
    CK(cudaMalloc((void **)&ws.x_half, ws.x_cap * 2));
    kc_xq xin = xq_new(cap, n_in, 0), xb = xq_new(cap, n_ff, 0);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        const int type = types[ti];
        void *blocks = malloc(dt_row_size(type, n_in) * 2 * n_ff);
        dt_quantize(type, wf, blocks, (int64_t)2 * n_ff * n_in);
        kc_weight W = weight_up(type, blocks, n_in, 2 * n_ff);
        k_matmul_ref(blocks, type, n_in, 2 * n_ff, x, ntmax, gref);
        /* F16: the backend's down reads only the half copy (no_ints) */
        kc_xq xa = xq_new(cap, n_ff, type == DT_F16);
        for (int act = 0; act < 2; act++)
            for (int fuse = 1; fuse <= cap; fuse += cap - 1)
                for (size_t ni = 0; ni < sizeof ntoks / sizeof *ntoks; ni++)
                    for (int with_out = 0; with_out < 2; with_out++) {
                        const int nt = ntoks[ni], a = act ? MDL_ACT_GELU_TANH : MDL_ACT_SILU, small = nt <= cap;
                        if (!small && (!with_out || fuse != 1)) continue; /* past the GEMV: f32 output only */
                        const size_t no = (size_t)nt * n_ff;
                        plan_glu_fuse(fuse);
                        int rc = 0;
                        if (small) rc |= kc_quantize_x(dx, nt, n_in, &xin, s); /* the pre-norm's blocks */
                        CK(cudaMemset(dgu, 0x55, (size_t)nt * 2 * n_ff * 4));
                        CK(cudaMemset(dout, 0xff, no * 4));
                        xq_poison(&xa);
                        rc |= kc_matmul_glu(&W, dx, small ? &xin : NULL, nt, dgu, with_out ? dout : NULL, small ? &xa : NULL, a, &ws, s);
                        CK(cudaStreamSynchronize(s));
                        uint32_t g0;
                        down(&g0, dgu, 4);
                        /* the unfused sequence */
                        CK(cudaMemset(dout2, 0xff, no * 4));
                        xq_poison(&xb);
                        rc |= kc_matmul_xq(&W, dx, small ? &xin : NULL, nt, dgu2, 0, &ws, s);
                        rc |= kc_glu(dgu2, dout2, NULL, nt, n_ff, a, 0, NULL, s);
                        if (small) rc |= kc_quantize_x(dout2, nt, n_ff, &xb, s);
                        CK(cudaStreamSynchronize(s));
                        const int same_out = !with_out || dev_same(dout, dout2, no * 4), same_q = !small || xq_same(&xa, &xb, nt, n_ff);
                        /* fused: F16 with a half copy and a warp holding gate and up (2 rows per warp: up to 4
                         * tokens on the FMA GEMV, every count on the tensor-core one, the plan's f16_tc) */
                        const int fused = type == DT_F16 && small && nt <= fuse && (nt <= 4 || kc_plan_get()->f16_tc),
                                  untouched = g0 == 0x55555555u;
                        double e = 0;
                        if (with_out) {
                            for (int t = 0; t < nt; t++) {
                                for (int j = 0; j < n_ff; j++) {
                                    gate[j] = (float)gref[(size_t)t * 2 * n_ff + 2 * j];
                                    upv[j] = (float)gref[(size_t)t * 2 * n_ff + 2 * j + 1];
                                }
                                (act ? k_geglu : k_swiglu)(gate, upv, n_ff, ref + (size_t)t * n_ff);
                            }
                            down(got, dout, no * 4);
                            e = rel_err_f(got, ref, no);
                        }
                        T_CHECKF(rc == 0 && same_out && same_q && untouched == fused && e < 5e-3,
                                 "matmul_glu %s %s nt=%d fuse<=%d out=%d: rc=%d same out %d, same blocks %d, fused %d/%d, rel_err %.3g",
                                 dt_name(type), act ? "gelu" : "silu", nt, fuse, with_out, rc, same_out, same_q, untouched, fused, e);
                    }
        xq_del(&xa);
        cudaFree(W.data); cudaFree(W.d); free(blocks);
    }
    plan_glu_fuse(dflt);
    T_CHECK(kc_matmul_glu(NULL, dx, NULL, 1, dgu, dout, NULL, MDL_ACT_SILU, &ws, s) == CM_EINVAL);
    T_CHECK(kc_glu_xq(dgu, NULL, NULL, 1, n_ff, MDL_ACT_GELU_TANH, s) == CM_EINVAL); /* nothing would be written */
    T_CHECK(kc_glu_xq(dgu, dout, NULL, 1, n_ff, 7, s) == CM_EINVAL);
    xq_del(&xin); xq_del(&xb); xq_del(&ws.xq);
    cudaFree(ws.w_half); cudaFree(ws.x_half);
    cudaFree(dx); cudaFree(dgu); cudaFree(dgu2); cudaFree(dout); cudaFree(dout2);
    free(x); free(wf); free(gref); free(ref); free(got);
}

/* kc_rmsnorm_add_xq against kc_rmsnorm_add + kc_rmsnorm_xq (x, y and the blocks the same bits:
 * full blocks, half copy only, y NULL, y = h) with the RMSNorm split on and off, for 1..8 and
 * 13 tokens and row lengths of the one-CTA kernel (1..8 float4 per thread), the split kernel
 * (2560), rows without blocks (100, 1000: n % 32 != 0) and any n (90: the two launches); and
 * x, y against the CPU (k_rmsnorm, k_add, k_rmsnorm). */
static void test_rmsnorm_add_xq(cudaStream_t s) {
    const int ns[] = { 64, 90, 100, 1000, 2304, 2560, 3840, 5120, 12288 }, ntoks[] = { 1, 2, 3, 5, 8, 13 }, cap = 8;
    for (size_t si = 0; si < sizeof ns / sizeof *ns; si++)
        for (size_t ni = 0; ni < sizeof ntoks / sizeof *ntoks; ni++)
            for (int split = 0; split < 2; split++) {
                const int n = ns[si], nt = ntoks[ni], quant = n % 32 == 0 && nt <= cap;
                const size_t N = (size_t)nt * n;
                float *x = rnd(N, 2.0f), *h = rnd(N, 5.0f), *wp = rnd(n, 1.5f), *w = rnd(n, 1.5f);
                for (size_t i = 0; i < N; i += 97) h[i] *= 20.0f; /* a few large values: blocks of different scales */
                float *rx = malloc(N * 4), *ry = malloc(N * 4), *tmp = malloc(N * 4), *got = malloc(N * 4);
                k_rmsnorm(h, wp, nt, n, 1e-6f, tmp);
                memcpy(rx, x, N * 4);
                k_add(rx, tmp, (int64_t)N);
                k_rmsnorm(rx, w, nt, n, 1e-6f, ry);
                float *dh = up(h, N * 4), *dwp = up(wp, (size_t)n * 4), *dw = up(w, (size_t)n * 4);
                float *dx1 = up(x, N * 4), *dx2 = up(x, N * 4), *dy1 = dnew(N * 4), *dy2 = dnew(N * 4);
                kc_xq q1 = xq_new(cap, n, 0), q2 = xq_new(cap, n, 0);
                xq_poison(&q1);
                xq_poison(&q2);
                gpu_plan_norm_split(split);
                int rc = kc_rmsnorm_add(dx1, dh, dwp, nt, n, 1e-6f, s);
                rc |= kc_rmsnorm_xq(dx1, dw, dy1, &q1, nt, n, 1e-6f, s);
                rc |= kc_rmsnorm_add_xq(dx2, dh, dwp, dw, dy2, &q2, nt, n, 1e-6f, s);
                CK(cudaStreamSynchronize(s));
                int same_x = dev_same(dx1, dx2, N * 4), same_y = dev_same(dy1, dy2, N * 4);
                int same_q = q1.n == q2.n && (q2.n != n || xq_same(&q2, &q1, nt, n)) && (q2.n == n) == quant;
                down(got, dx2, N * 4);
                double ex = rel_err_f(got, rx, N);
                down(got, dy2, N * 4);
                double ey = rel_err_f(got, ry, N);
                T_CHECKF(rc == 0 && same_x && same_y && same_q && ex < 1e-5 && ey < 1e-5,
                         "rmsnorm_add_xq n=%d nt=%d split=%d: rc=%d same x %d y %d blocks %d, rel_err x %.3g y %.3g", n, nt, split,
                         rc, same_x, same_y, same_q, ex, ey);
                if (quant && n <= 4 * 1024 * 8) {
                    /* the blocks only; the half copy only (F16 models); y = h */
                    kc_xq q3 = xq_new(cap, n, 1);
                    xq_poison(&q2);
                    xq_poison(&q3);
                    CK(cudaMemcpy(dx2, x, N * 4, cudaMemcpyHostToDevice));
                    rc = kc_rmsnorm_add_xq(dx2, dh, dwp, dw, NULL, &q2, nt, n, 1e-6f, s);
                    CK(cudaStreamSynchronize(s));
                    int ok_blocks = rc == 0 && dev_same(dx1, dx2, N * 4) && xq_same(&q2, &q1, nt, n);
                    CK(cudaMemcpy(dx2, x, N * 4, cudaMemcpyHostToDevice));
                    rc = kc_rmsnorm_add_xq(dx2, dh, dwp, dw, NULL, &q3, nt, n, 1e-6f, s);
                    CK(cudaStreamSynchronize(s));
                    int ok_half = rc == 0 && dev_same(dx1, dx2, N * 4) && xq_same(&q3, &q1, nt, n);
                    float *dh2 = up(h, N * 4);
                    CK(cudaMemcpy(dx2, x, N * 4, cudaMemcpyHostToDevice));
                    rc = kc_rmsnorm_add_xq(dx2, dh2, dwp, dw, dh2, &q2, nt, n, 1e-6f, s);
                    CK(cudaStreamSynchronize(s));
                    int ok_alias = rc == 0 && dev_same(dx1, dx2, N * 4) && dev_same(dy1, dh2, N * 4);
                    T_CHECKF(ok_blocks && ok_half && ok_alias, "rmsnorm_add_xq n=%d nt=%d split=%d: blocks only %d, half only %d, y = h %d",
                             n, nt, split, ok_blocks, ok_half, ok_alias);
                    cudaFree(dh2);
                    xq_del(&q3);
                }
                if (!quant) /* nothing but y to write: y NULL refused, x untouched */
                    T_CHECK(kc_rmsnorm_add_xq(dx2, dh, dwp, dw, NULL, &q2, nt, n, 1e-6f, s) == CM_EINVAL && dev_same(dx1, dx2, N * 4));
                gpu_plan_norm_split(1);
                xq_del(&q1); xq_del(&q2);
                cudaFree(dh); cudaFree(dwp); cudaFree(dw); cudaFree(dx1); cudaFree(dx2); cudaFree(dy1); cudaFree(dy2);
                free(x); free(h); free(wp); free(w); free(rx); free(ry); free(tmp); free(got);
            }
    float *d = dnew(64 * 4);
    T_CHECK(kc_rmsnorm_add_xq(d, d, d, d, NULL, NULL, 1, 64, 1e-6f, s) == CM_EINVAL); /* x == h */
    cudaFree(d);
}

/* kc_embed_scaled = kc_embed then kc_scale (bits), every table type, an out-of-range id a NaN row. */
static void test_embed_scaled(cudaStream_t s) {
    const int types[] = { DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_K };
    const int n_embd = 512, n_vocab = 40, nt = 5;
    const int32_t ids[5] = { 3, 39, 0, 40, 17 };
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        float *tf = rnd((size_t)n_embd * n_vocab, 1.0f);
        void *blocks = malloc(dt_row_size(types[ti], n_embd) * n_vocab);
        dt_quantize(types[ti], tf, blocks, (int64_t)n_embd * n_vocab);
        kc_weight w = weight_up(types[ti], blocks, n_embd, n_vocab);
        int32_t *dids = up(ids, sizeof ids);
        float *da = dnew((size_t)nt * n_embd * 4), *db = dnew((size_t)nt * n_embd * 4), *g = malloc((size_t)nt * n_embd * 4);
        const float sc = sqrtf(3840.0f); /* gemma3-12b's sqrt(n_embd) */
        int rc = kc_embed_scaled(&w, dids, nt, da, sc, s);
        rc |= kc_embed(&w, dids, nt, db, s);
        rc |= kc_scale(db, (size_t)nt * n_embd, sc, s);
        CK(cudaStreamSynchronize(s));
        down(g, da, (size_t)nt * n_embd * 4);
        float *g2 = malloc((size_t)nt * n_embd * 4);
        down(g2, db, (size_t)nt * n_embd * 4);
        int nan_row = 1, finite = 1, same = 1;
        for (int i = 0; i < n_embd; i++) nan_row &= isnan(g[3 * n_embd + i]);
        /* the same bits outside the NaN row (kc_scale turns a NaN into the canonical one) */
        for (int i = 0; i < nt * n_embd; i++) {
            finite &= i / n_embd == 3 || isfinite(g[i]);
            same &= i / n_embd == 3 || !memcmp(&g[i], &g2[i], 4);
        }
        T_CHECKF(rc == 0 && same && nan_row && finite, "kc_embed_scaled %s: rc=%d same bits %d NaN row %d finite %d",
                 dt_name(types[ti]), rc, same, nan_row, finite);
        free(g2);
        cudaFree(da); cudaFree(db); cudaFree(dids); cudaFree(w.data); cudaFree(w.d);
        free(g); free(blocks); free(tf);
    }
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device\n0 passed, 1 failed\n");
        return 1;
    }
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    test_elementwise(s);
    {
        cublasHandle_t cb;
        if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) return 1;
        cublasSetStream(cb, s);
        test_matmul_glu(cb, s);
        cublasDestroy(cb);
    }
    test_rmsnorm_add_xq(s);
    test_embed_scaled(s);
    test_moe(s);
    test_moe_quant(s);
    test_moe_norm(s);
    test_moe_fused(s);
    test_rope_table(s);
    const int hds[] = { 16, 32, 64, 128, 256 };
    for (size_t i = 0; i < sizeof hds / sizeof *hds; i++) {
        test_attention_mods(s, hds[i], 4, 0.0f, 0);     /* the plain kernels still right */
        test_attention_mods(s, hds[i], 4, 1.5f, 0);     /* soft-cap */
        test_attention_mods(s, hds[i], 2, 0.0f, 24);    /* window shorter than a block table row */
        test_attention_mods(s, hds[i], 8, 2.0f, 70);    /* both, a window across tiles */
    }
    return t_done();
}
