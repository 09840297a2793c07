/* gpu_bench_gemm: F16 weights x N tokens through cuBLAS at llama3-8b's shapes: cublasGemmEx
 * (kc_matmul's path past the GEMV) against every algorithm cublasLt's heuristic offers (up to
 * 16, each timed), weight bytes over time against the copy bandwidth. Random weights; each
 * timing rotates over enough copies of the matrix to leave the 60 MB L2.
 * usage: gpu_bench_gemm [N...]   (default 16 32 64 128 256 512 2048)
 *        gpu_bench_gemm fp8 [N...]: E4M3 x E4M3 on cuBLASLt, f32 out, with the row and token scales
 *        as outer vectors (kc_matmul's FP8 path) against scalar scales, plain and fast
 *        accumulation: the heuristic's algorithm count, its first and its best; then the FP8 wgmma
 *        tiles (kc__gemm_f8_wg, scales in the launch) in each configuration. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ck.h"
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

/* n halves uniform in [-1/16, 1/16), from a fixed seed */
static void fill_random(void *dev, size_t n, uint32_t seed) {
    uint16_t *h = malloc(n * 2);
    if (!h) { fprintf(stderr, "out of host memory\n"); exit(1); }
    uint32_t r = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        /* a half of exponent 2^-5..2^-4 scaled: sign, exponent 10 or 11 (2^-5, 2^-4), mantissa random */
        h[i] = (uint16_t)(((r >> 31) << 15) | ((10u + ((r >> 30) & 1)) << 10) | ((r >> 12) & 0x3ff));
    }
    CK(cudaMemcpy(dev, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
}

/* n random E4M3 codes (magnitudes 2^-4 .. 2^4, both signs: no NaN) */
static void fill_codes(void *dev, size_t n, uint32_t seed) {
    uint8_t *h = malloc(n);
    if (!h) { fprintf(stderr, "out of host memory\n"); exit(1); }
    uint32_t r = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        h[i] = (uint8_t)(((r >> 31) << 7) | ((3u + ((r >> 20) & 7u)) << 3) | ((r >> 12) & 7u));
    }
    CK(cudaMemcpy(dev, h, n, cudaMemcpyHostToDevice));
    free(h);
}

/* cuBLASLt's heuristic algorithms (up to 16) for y[N][M] (f32) = W[M][K] x[N][K]^T with W and x of
 * type ab, each timed over iters calls rotating over the copies of W: the count, the first's and
 * the best's time (us; -1: none ran) and the best's id/tile/stages/splitK/cluster. fast < 0: the
 * fast-accumulation flag left unset; sa non-NULL: the row (sa) and token (sb) scales as outer
 * vectors (FP8). */
typedef struct {
    int nres, best_i;
    double first, best;
    int cfg[5];
} lt_timing;

static lt_timing lt_time(cublasLtHandle_t lt, void *ws, size_t ws_bytes, void *const *w, int copies, const void *x, float *y,
                         int M, int N, int K, cudaDataType_t ab, int fast, const float *sa, const float *sb) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    CKB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (fast >= 0) {
        const int8_t f = fast > 0;
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof f));
    }
    if (sa) {
        const int32_t vm = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vm, sizeof vm));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vm, sizeof vm));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    }
    CKB(cublasLtMatrixLayoutCreate(&la, ab, K, M, K));
    CKB(cublasLtMatrixLayoutCreate(&lb, ab, K, N, K));
    CKB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, M, N, M));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[16];
    lt_timing r = { 0, -1, -1, -1, { -1, -1, -1, -1, -1 } };
    if (cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &r.nres) != CUBLAS_STATUS_SUCCESS) r.nres = 0;
    const float one = 1.0f, zero = 0.0f;
    const int iters = 40;
    for (int a = 0; a < r.nres; a++) {
        if (res[a].state != CUBLAS_STATUS_SUCCESS) continue;
        int ok = 1;
        for (int i = 0; i < iters + 4 && ok; i++) {
            if (i == 4) CK(cudaEventRecord(e0, 0));
            ok = cublasLtMatmul(lt, op, &one, w[i % copies], la, x, lb, &zero, y, lc, y, lc, &res[a].algo, ws, ws_bytes, 0) ==
                 CUBLAS_STATUS_SUCCESS;
        }
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        if (!ok) continue;
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1e3 / iters;
        if (a == 0) r.first = us;
        if (r.best < 0 || us < r.best) {
            r.best = us;
            r.best_i = a;
        }
    }
    if (r.best_i >= 0) {
        const cublasLtMatmulAlgoConfigAttributes_t at[5] = { CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                                             CUBLASLT_ALGO_CONFIG_STAGES_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                             CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID };
        size_t wr;
        for (int i = 0; i < 5; i++) cublasLtMatmulAlgoConfigGetAttribute(&res[r.best_i].algo, at[i], &r.cfg[i], sizeof r.cfg[i], &wr);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return r;
}

static int bench_fp8(int argc, char **argv) {
    int ns[16] = { 16, 64, 128, 256, 512, 2048 }, nn = 6;
    if (argc > 2) {
        nn = 0;
        for (int i = 2; i < argc && nn < 16; i++) ns[nn++] = atoi(argv[i]);
    }
    const struct { const char *name; int n_in, n_out; } sh[] = {
        { "qkv", 4096, 6144 }, { "wo", 4096, 4096 }, { "gate|up", 4096, 28672 }, { "down", 14336, 4096 },
    };
    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    size_t ws_bytes = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    int nmax = 16;
    for (int i = 0; i < nn; i++)
        if (ns[i] > nmax) nmax = ns[i];
    void *x;
    float *y, *sa, *sb;
    CK(cudaMalloc(&x, (size_t)nmax * 14336));
    fill_codes(x, (size_t)nmax * 14336, 7);
    CK(cudaMalloc((void **)&y, (size_t)nmax * 28672 * 4));
    CK(cudaMalloc((void **)&sa, 28672 * 4));
    CK(cudaMalloc((void **)&sb, (size_t)nmax * 4));
    {
        float *h = malloc(28672 * 4);
        for (int i = 0; i < 28672; i++) h[i] = 1.0f / 64;
        CK(cudaMemcpy(sa, h, 28672 * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sb, h, (size_t)(nmax < 28672 ? nmax : 28672) * 4, cudaMemcpyHostToDevice));
        free(h);
    }
    printf("%-8s %6s | %-30s | %-30s | %-30s\n", "matrix", "N", "outer-vector scales: n first best", "scalar: n first best",
           "scalar, fast: n first best");
    for (int si = 0; si < 4; si++) {
        const int K = sh[si].n_in, M = sh[si].n_out;
        const size_t wb = (size_t)K * M;
        const int copies = (int)(256e6 / wb) + 1 > 8 ? 8 : (int)(256e6 / wb) + 1;
        void *w[8];
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&w[c], wb));
            fill_codes(w[c], wb, 11 + c);
        }
        for (int ni = 0; ni < nn; ni++) {
            const int N = ns[ni];
            printf("%-8s %6d", sh[si].name, N);
            for (int mode = 0; mode < 3; mode++) { /* outer-vector scales; unit scales; unit, fast accumulation */
                const lt_timing r = lt_time(lt, ws, ws_bytes, w, copies, x, y, M, N, K, CUDA_R_8F_E4M3, mode == 2, mode ? NULL : sa,
                                            sb);
                printf(" | %2d %7.1f %7.1f (%4.0f TF) %d/%d/%d/%d/%d", r.nres, r.first, r.best,
                       r.best > 0 ? 2.0 * M * N * K / r.best / 1e6 : 0.0, r.cfg[0], r.cfg[1], r.cfg[2], r.cfg[3], r.cfg[4]);
            }
            /* the FP8 wgmma tiles (kc_matmul's other FP8 path, scales in the launch): each configuration */
            printf(" | wgmma:");
            for (int cfg = 0; cfg < kc__gemm_f8_wg_ncfg(); cfg++) {
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                kc_weight kw = { .type = DT_F8_E4M3, .n_in = K, .n_out = M, .d = (kc_half *)sa };
                const int iters = 20;
                int rc = 0;
                for (int it = -2; it < iters && !rc; it++) {
                    if (it == 0) CK(cudaEventRecord(e0, 0));
                    kw.data = w[(it + 2) % copies];
                    rc = kc__gemm_f8_wg(&kw, (const uint8_t *)x, sb, N, y, M, 0, cfg, 0);
                }
                CK(cudaEventRecord(e1, 0));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                char nm[32];
                printf(" %s %.1f", kc__gemm_f8_wg_name(cfg, nm, sizeof nm), rc ? -1.0 : ms * 1e3 / iters);
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
            }
            printf("\n");
            fflush(stdout);
        }
        for (int c = 0; c < copies; c++) cudaFree(w[c]);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "fp8")) return bench_fp8(argc, argv);
    int ns[16] = { 16, 32, 64, 128, 256, 512, 2048 }, nn = 7;
    if (argc > 1) {
        nn = 0;
        for (int i = 1; i < argc && nn < 16; i++) ns[nn++] = atoi(argv[i]);
    }
    const struct { const char *name; int n_in, n_out; } sh[] = {
        { "qkv", 4096, 6144 }, { "wo", 4096, 4096 }, { "gate|up", 4096, 28672 }, { "down", 14336, 4096 }, { "head", 4096, 128256 },
    };
    cublasHandle_t cb;
    cublasLtHandle_t lt;
    CKB(cublasCreate(&cb));
    CKB(cublasLtCreate(&lt));
    size_t ws_bytes = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    CKB(cublasSetWorkspace(cb, ws, ws_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int nmax = 16;
    for (int i = 0; i < nn; i++)
        if (ns[i] > nmax) nmax = ns[i];
    void *x, *y;
    CK(cudaMalloc(&x, (size_t)nmax * 14336 * 2));
    fill_random(x, (size_t)nmax * 14336, 7);
    CK(cudaMalloc(&y, (size_t)nmax * 128256 * 4));
    printf("%-8s %6s %10s %7s %8s | %10s %10s %8s %6s  %s\n", "matrix", "N", "GemmEx us", "TB/s", "TFLOP/s", "Lt[0] us",
           "best Lt us", "TFLOP/s", "algo", "best's id/tile/stages/splitK/cluster");
    for (int si = 0; si < 5; si++) {
        const int K = sh[si].n_in, M = sh[si].n_out;
        const size_t wb = (size_t)K * M * 2;
        const int copies = (int)(256e6 / wb) + 1 > 8 ? 8 : (int)(256e6 / wb) + 1;
        void *w[8];
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&w[c], wb));
            fill_random(w[c], wb / 2, 11 + c);
        }
        for (int ni = 0; ni < nn; ni++) {
            const int N = ns[ni];
            const float one = 1.0f, zero = 0.0f;
            const int iters = 40;
            /* cublasGemmEx, as kc_matmul calls it: y[N][M] = W[M][K] x[N][K]^T */
            for (int i = 0; i < iters + 4; i++) {
                if (i == 4) CK(cudaEventRecord(e0, 0));
                CKB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, w[i % copies], CUDA_R_16F, K, x, CUDA_R_16F, K, &zero, y,
                                CUDA_R_32F, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            }
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double us_ex = ms * 1e3 / iters;
            /* cublasLt: the heuristic's algorithms, each timed */
            const lt_timing r = lt_time(lt, ws, ws_bytes, w, copies, x, y, M, N, K, CUDA_R_16F, -1, NULL, NULL);
            const double fl = 2.0 * M * N * K;
            printf("%-8s %6d %10.1f %7.2f %8.1f | %10.1f %10.1f %8.1f %3d/%-2d  %d/%d/%d/%d/%d\n", sh[si].name, N, us_ex,
                   wb / us_ex / 1e6, fl / us_ex / 1e6, r.first, r.best, r.best > 0 ? fl / r.best / 1e6 : 0.0, r.best_i, r.nres, r.cfg[0],
                   r.cfg[1], r.cfg[2], r.cfg[3], r.cfg[4]);
        }
        for (int c = 0; c < copies; c++) cudaFree(w[c]);
    }
    return 0;
}
