/* gpu_bench_gemmq: quantized weights times many tokens (prefill chunks, batched decode) at
 * llama2-7b layer shapes (F16: llama3-8b's, against cuBLAS): kc_gemmq (dequantized in registers, each tile configuration and the
 * automatic choice) against kc_matmul's other path (the integer GEMV up to KC_GEMV_MAX_TOK
 * tokens, dequantize-to-half + cuBLAS above), with the relative difference of their outputs.
 * wo and down add onto y (the residual), as in a step. Each matrix is timed over >= 20 launches
 * rotating over enough copies that they do not stay in the 50 MB L2. Random weights. q4_k_m: the layers of a Q4_K_M file that take more bits (Q|K|V
 * with wv Q6_K as two row ranges, down Q6_K, the rest Q4_K). Columns: gemv|deq (the other path),
 * gemmq (kc_matmul as the plan has it), cfgN (kc_gemmq in configuration N on x as it is; 11.. the
 * wgmma tiles, on x's image as kc_matmul writes it for them, the conversion not included; a
 * Q4_K_M layer's on x as it is), gemmq* (kc_matmul with kc_gemmq at every token count: x's image
 * where the wgmma tiles are chosen, the conversion included); then per matrix, gemmq*, the
 * fastest configuration and the other path.
 * usage: gpu_bench_gemmq [TYPE...] [key=value,...]   (q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m f16;
 *        default all; key=value: kernel-plan fields, e.g. q8_mma_max_tok=32 for Q8_0 on int8 mma) */
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_bench_w.h"
#include "gpu_ck.h"
#include "gpu_plan.h"
#include "gpu_wfused.h"

/* gemmq.cu's internals: x as the wgmma tiles' image, and kc_gemmq reading it */
int kc__to_half_gemmq(const float *x, int n_tok, int n, int order, kc_half *out, cudaStream_t s);
size_t kc__gemmq_x_halves(int n_tok, int n);
int kc__gemmq_rows(const kc_weight *W, const kc_half *x, int n_tok, float *y, int ldy, int accumulate, int cfg, int xperm,
                   cudaStream_t s);

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

enum { MAXC = 16, MAXCFG = 32, MAXT = 1024, MAXIN = 14336, MAXOUT = 28672 };

/* F16 weights on the wgmma tiles up to lim tokens (0: cuBLAS) */
static void plan_f16(int lim) {
    kc_plan p = *kc_plan_get();
    p.f16_wg_max_tok = lim;
    kc_plan_set(&p);
}

int main(int argc, char **argv) {
    const char *names[] = { "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "f16" };
    const int types[] = { DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K, KC_WEIGHT_MIXED, DT_F16 };
    const int n_types = (int)(sizeof types / sizeof *types);
    const struct { const char *name; int n_in, n_out; } shapes2[] = {
        { "qkv", 4096, 12288 }, { "wo", 4096, 4096 }, { "gate|up", 4096, 22016 }, { "down", 11008, 4096 },
    }, shapes3[] = { /* llama3-8b: grouped K and V */
        { "qkv", 4096, 6144 }, { "wo", 4096, 4096 }, { "gate|up", 4096, 28672 }, { "down", 14336, 4096 },
    };
    const int ntoks[] = { 2, 4, 8, 9, 16, 32, 64, 128, 192, 256, 512, 1024 };
    const int NNT = (int)(sizeof ntoks / sizeof *ntoks), NSH = (int)(sizeof shapes2 / sizeof *shapes2);
    kc_plan chosen; /* the plan's F16 limit on this device */
    if (kc_plan_choose(0, 128, 32, 8, 16, 0, &chosen)) { fprintf(stderr, "kc_plan_choose failed\n"); return 1; }
    int n_names = 0;
    kc_plan over = *kc_plan_get(); /* the fields given, on the plan the bench runs under */
    for (int a = 1; a < argc; a++) {
        if (!strchr(argv[a], '=')) { n_names++; continue; }
        if (gpu_plan_args(&over, argv[a], "gpu_bench_gemmq")) return 2;
    }
    kc_plan_set(&over);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 1; }
    cublasSetStream(cb, s);
    kc_gemm_ws ws = { .cublas = cb };
    ws.w_cap = (size_t)4096 * 22016;
    ws.x_cap = kc__gemmq_x_halves(MAXT, MAXIN);
    CK(cudaMalloc((void **)&ws.w_half, ws.w_cap * 2));
    CK(cudaMalloc((void **)&ws.x_half, ws.x_cap * 2));
    float *dx, *dy, *dy2;
    kc_half *xt; /* x's image for the wgmma configurations */
    CK(cudaMalloc((void **)&xt, kc__gemmq_x_halves(MAXT, MAXIN) * 2));
    CK(cudaMalloc((void **)&dx, (size_t)MAXT * MAXIN * 4));
    CK(cudaMalloc((void **)&dy, (size_t)MAXT * MAXOUT * 4));
    CK(cudaMalloc((void **)&dy2, (size_t)MAXT * MAXOUT * 4));
    {   /* x, and x as half in x_half (kc_gemmq's input; the GEMV path does not write it) */
        size_t n = (size_t)MAXT * MAXIN;
        float *hx = malloc(n * 4);
        uint16_t *hh = malloc(n * 2);
        for (size_t i = 0; i < n; i++) { hx[i] = frand(); hh[i] = dt_f32_to_f16(hx[i]); }
        CK(cudaMemcpy(dx, hx, n * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(ws.x_half, hh, n * 2, cudaMemcpyHostToDevice));
        free(hx);
        free(hh);
    }
    ws.xq.cap_tok = 32; /* the GEMVs' and kc__gemm_q8i's token counts */
    ws.xq.cap_n = MAXIN;
    CK(cudaMalloc((void **)&ws.xq.qh, (size_t)32 * MAXIN));
    CK(cudaMalloc((void **)&ws.xq.ql, (size_t)32 * MAXIN));
    CK(cudaMalloc((void **)&ws.xq.m, (size_t)32 * MAXIN / 32 * 8));
    float *ha = malloc((size_t)MAXT * MAXOUT * 4), *hb = malloc((size_t)MAXT * MAXOUT * 4);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int NCFG = kc_gemmq_ncfg() < MAXCFG ? kc_gemmq_ncfg() : MAXCFG; /* cfg 11.. : the wgmma tiles (sm_90a) */
    for (int ti = 0; ti < n_types; ti++) {
        int want = n_names == 0;
        for (int a = 1; a < argc; a++) want |= strcmp(argv[a], names[ti]) == 0;
        if (!want) continue;
        /* per n_tok: microseconds of one layer (the four matrices) for each path */
        double sh_all[4][16] = { { 0 } }, sh_deq[4][16] = { { 0 } }, sh_cfg[4][16][MAXCFG] = { { { 0 } } }; /* per matrix */
        double t_deq[16] = { 0 }, t_auto[16] = { 0 }, t_all[16] = { 0 }, t_cfg[16][MAXCFG] = { { 0 } }, maxerr[16] = { 0 }; /* up to 16 token counts */
        double layer_mb = 0;
        const int f16 = types[ti] == DT_F16;
        const __typeof__(shapes2[0]) *shapes = f16 ? shapes3 : shapes2;
        for (int si = 0; si < NSH; si++) {
            int n_in = shapes[si].n_in, n_out = shapes[si].n_out, type = types[ti];
            size_t wbytes;
            kc_weight w[MAXC];
            int nc;
            if (type == KC_WEIGHT_MIXED) {
                int pt[2], pr[2], np;
                q4km_parts(shapes[si].name, n_out, pt, pr, &np);
                nc = bench_wfused_upload(pt, pr, np, n_in, frand, w, MAXC, &wbytes);
            } else {
                nc = bench_w_upload(type, n_in, n_out, frand, w, MAXC, &wbytes);
            }
            layer_mb += wbytes / 1e6;
            const int acc = si == 1 || si == 3; /* wo and down add onto the residual, as in a step */
            for (int ni = 0; ni < NNT; ni++) {
                int nt = ntoks[ni];
                size_t ny = (size_t)nt * n_out;
                /* outputs: the cuBLAS path against the in-register path */
                gpu_plan_gemmq(0);
                plan_f16(0);
                CK(cudaMemsetAsync(dy, 0, ny * 4, s));
                if (kc_matmul(&w[0], dx, nt, dy, acc, &ws, s)) { fprintf(stderr, "dequant path failed\n"); return 1; }
                gpu_plan_gemmq(1);
                plan_f16(1 << 20);
                CK(cudaMemsetAsync(dy2, 0, ny * 4, s));
                if (nt <= KC_GEMV_MAX_TOK ? (f16 ? kc_matmul(&w[0], dx, nt, dy2, acc, &ws, s) : kc_gemmq(&w[0], ws.x_half, nt, dy2, acc, -1, s))
                                          : kc_matmul(&w[0], dx, nt, dy2, acc, &ws, s)) {
                    fprintf(stderr, "gemmq path failed\n");
                    return 1;
                }
                CK(cudaStreamSynchronize(s));
                CK(cudaMemcpy(ha, dy, ny * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(hb, dy2, ny * 4, cudaMemcpyDeviceToHost));
                double num = 0, den = 0;
                for (size_t i = 0; i < ny; i++) { num += (double)(ha[i] - hb[i]) * (ha[i] - hb[i]); den += (double)ha[i] * ha[i]; }
                double e = sqrt(num / (den > 0 ? den : 1));
                if (e > maxerr[ni] || e != e) maxerr[ni] = e;
                const int iters = 2 * nc > 20 ? 2 * nc : 20;
                const int order = type == KC_WEIGHT_MIXED ? 0 : f16 ? 3 : dt_block_size(type) == 256 ? 2 : 1;
                if (order && kc__to_half_gemmq(dx, nt, n_in, order, xt, s)) { fprintf(stderr, "x's image failed\n"); return 1; }
                /* paths: 0 the other path, 1 kc_matmul as planned, 2.. each configuration (kc_gemmq
                 * on x as it is), last: kc_matmul with kc_gemmq at every token count (its choice,
                 * x in the wgmma tiles' order where they are chosen) */
                for (int path = 0; path < 3 + NCFG; path++) {
                    const int all = path == 2 + NCFG;
                    if (all && nt <= KC_GEMV_MAX_TOK) continue;
                    if (f16 && path >= 2 && !all && (path - 2 < 11 || path - 2 > 13 || nt <= KC_GEMV_MAX_TOK)) continue; /* its 3 tiles */
                    gpu_plan_gemmq(path != 0);
                    plan_f16(path == 0 ? 0 : all ? 1 << 20 : chosen.f16_wg_max_tok);
                    if (all) {
                        kc_plan p = *kc_plan_get();
                        for (int k = 0; k < KC_N_QTYPES; k++) p.gemmq_max_tok[k] = 1 << 20;
                        kc_plan_set(&p);
                    }
                    const int mm = path == 0 || ((path == 1 || all) && (nt > KC_GEMV_MAX_TOK || f16));
                    const int img = !mm && order && path - 2 >= 11; /* a wgmma configuration on x's image */
                    for (int i = 0; i < 3 + iters; i++) {
                        if (i == 3) CK(cudaEventRecord(e0, s));
                        if (mm) kc_matmul(&w[i % nc], dx, nt, dy, acc, &ws, s);
                        else if (img) kc__gemmq_rows(&w[i % nc], xt, nt, dy, n_out, acc, path - 2, order, s);
                        else kc_gemmq(&w[i % nc], ws.x_half, nt, dy, acc, path - 2, s);
                    }
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaGetLastError());
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    double us = ms * 1000.0 / iters;
                    if (path == 0) t_deq[ni] += us, sh_deq[si][ni] = us;
                    else if (path == 1) t_auto[ni] += us;
                    else if (all) t_all[ni] += us;
                    else t_cfg[ni][path - 2] += us;
                    if (all) sh_all[si][ni] = us;
                    else if (path >= 2) sh_cfg[si][ni][path - 2] = us;
                }
            }
            bench_w_free(w, nc);
        }
        gpu_plan_gemmq(1);
        printf("%s: one %s layer (qkv, wo, gate|up, down; %.1f MB of weights), microseconds%s\n", names[ti],
               f16 ? "llama3-8b" : "llama2-7b", layer_mb, f16 ? " (gemv|deq: the GEMV, then cuBLAS)" : "");
        printf("%5s %10s %10s", "n_tok", "gemv|deq", "gemmq");
        for (int c = 0; c < NCFG; c++) printf(c < 10 ? "   cfg%d" : "  cfg%d", c);
        printf(" %8s %7s %8s %9s %9s\n", "gemmq*", "speedup", "GB/s", "TFLOP/s", "rel_diff");
        for (int ni = 0; ni < NNT; ni++) {
            double flop = 0;
            for (int si = 0; si < NSH; si++) flop += 2.0 * ntoks[ni] * shapes[si].n_in * shapes[si].n_out;
            printf("%5d %10.1f %10.1f", ntoks[ni], t_deq[ni], t_auto[ni]);
            for (int c = 0; c < NCFG; c++) printf(" %7.1f", t_cfg[ni][c]);
            printf(" %8.1f %6.2fx", t_all[ni], t_deq[ni] / t_auto[ni]);
            printf(" %8.0f %9.1f %9.2g\n", layer_mb / t_auto[ni] * 1e3, flop / t_auto[ni] / 1e6, maxerr[ni]);
        }
        /* per matrix past the GEMV: gemmq* and the fastest configuration (the wgmma ones on x's image) */
        for (int si = 0; si < NSH; si++) {
            printf("  %-8s", shapes[si].name);
            for (int ni = 0; ni < NNT; ni++) {
                if (ntoks[ni] <= KC_GEMV_MAX_TOK) continue;
                int b = f16 ? 11 : 0;
                for (int c = b + 1; c < (f16 && NCFG > 14 ? 14 : NCFG); c++)
                    if (sh_cfg[si][ni][c] < sh_cfg[si][ni][b]) b = c;
                printf(" %d: %.1f (cfg%d %.1f; other %.1f)", ntoks[ni], sh_all[si][ni], b, sh_cfg[si][ni][b], sh_deq[si][ni]);
            }
            printf("\n");
        }
        /* per matrix, each wgmma configuration (on x's image) */
        for (int si = 0; si < NSH && NCFG > 11; si++)
            for (int ni = 0; ni < NNT; ni++) {
                if (ntoks[ni] <= KC_GEMV_MAX_TOK) continue;
                printf("  %-8s %4d:", shapes[si].name, ntoks[ni]);
                for (int c = 11; c < NCFG; c++) printf(" cfg%d %.1f", c, sh_cfg[si][ni][c]);
                printf("\n");
            }
    }
    free(ha);
    free(hb);
    cudaFree(xt);
    return 0;
}
