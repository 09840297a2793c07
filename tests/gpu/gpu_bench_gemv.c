/* gpu_bench_gemv: one-token GEMV time per weight type at llama2-7b shapes, against the bytes it
 * must read (weights + scales) over the copy bandwidth. Each matrix is timed over >= 200
 * launches between two events (back to back, as in a decode step), rotating over enough
 * copies of it that they do not stay in the 50 MB L2. Random weights. q4_k_m: the matrices of a
 * Q4_K_M file's layers that take more bits (Q|K|V with wv Q6_K as two row ranges, down and the
 * head Q6_K, the rest Q4_K).
 * f8: E4M3 codes with f32 row scales at llama3-8b shapes (the activations' half copy, as
 * kc_quantize_x writes it).
 * usage: gpu_bench_gemv [--no-pdl] [KEY=VALUE,...] [TYPE...]   (f16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k
 *        q4_k_m f8; default all but f8; KEY=VALUE: kernel plan fields) */
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_bench_w.h"
#include "gpu_ck.h"
#include "gpu_plan.h"
#include "gpu_wfused.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

int main(int argc, char **argv) {
    const char *names[] = { "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "f8" };
    const int types[] = { DT_F16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K, KC_WEIGHT_MIXED, DT_F8_E4M3 };
    const int n_types = (int)(sizeof types / sizeof *types);
    typedef struct { const char *name; int n_in, n_out; } shape;
    const shape shapes7[] = {
        { "qkv", 4096, 12288 }, { "wo", 4096, 4096 }, { "gate|up", 4096, 22016 }, { "down", 11008, 4096 }, { "head", 4096, 32000 },
    };
    const shape shapes8[] = { /* llama3-8b */
        { "qkv", 4096, 6144 }, { "wo", 4096, 4096 }, { "gate|up", 4096, 28672 }, { "down", 14336, 4096 }, { "head", 4096, 128256 },
    };
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int no_pdl = argc > 1 && !strcmp(argv[1], "--no-pdl");
    if (no_pdl) {
        argv++;
        argc--;
    }
    gpu_plan_pdl(!no_pdl);
    if (argc > 1 && strchr(argv[1], '=')) {
        kc_plan p = *kc_plan_get();
        if (gpu_plan_args(&p, argv[1], "gpu_bench_gemv")) return 2;
        kc_plan_set(&p);
        argv++;
        argc--;
    }
    enum { NX = 14336, NY = 128256 };
    kc_gemm_ws ws = { 0 };
    ws.xq.cap_tok = 1;
    ws.xq.cap_n = NX;
    CK(cudaMalloc((void **)&ws.xq.qh, NX));
    CK(cudaMalloc((void **)&ws.xq.ql, NX));
    CK(cudaMalloc((void **)&ws.xq.m, NX / 32 * 8));
    CK(cudaMalloc((void **)&ws.xq.xh, NX * 2));
    float *dx, *dy;
    CK(cudaMalloc((void **)&dx, NX * 4));
    CK(cudaMalloc((void **)&dy, NY * 4));
    static float hx[NX];
    for (int i = 0; i < NX; i++) hx[i] = frand();
    CK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%-6s %-8s %12s %10s %10s %8s\n", "type", "matrix", "MB", "us", "GB/s", "of 3.0TB/s");
    for (int ti = 0; ti < n_types; ti++) {
        int want = argc < 2 && types[ti] != DT_F8_E4M3;
        for (int a = 1; a < argc; a++) want |= strcmp(argv[a], names[ti]) == 0;
        if (!want) continue;
        double tot_us = 0, tot_mb = 0;
        const shape *shapes = types[ti] == DT_F8_E4M3 ? shapes8 : shapes7;
        for (size_t si = 0; si < 5; si++) {
            int n_in = shapes[si].n_in, n_out = shapes[si].n_out, type = types[ti];
            size_t wbytes;
            kc_weight w[32];
            int nc;
            if (type == KC_WEIGHT_MIXED) {
                int pt[2], pr[2], np;
                q4km_parts(shapes[si].name, n_out, pt, pr, &np);
                nc = bench_wfused_upload(pt, pr, np, n_in, frand, w, 32, &wbytes);
            } else {
                if (n_in % dt_block_size(type)) continue;
                nc = bench_w_upload(type, n_in, n_out, frand, w, 32, &wbytes);
            }
            /* producer-quantized activations, as in the forward pass */
            if (type != DT_F16) kc_quantize_x(dx, 1, n_in, &ws.xq, s);
            for (int i = 0; i < 20; i++) kc_matmul_xq(&w[i % nc], dx, &ws.xq, 1, dy, 0, &ws, s);
            const int iters = 8 * nc > 200 ? 8 * nc : 200;
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < iters; i++) kc_matmul_xq(&w[i % nc], dx, &ws.xq, 1, dy, 0, &ws, s);
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double us = ms * 1000.0 / iters, mb = wbytes / 1e6;
            printf("%-6s %-8s %12.1f %10.2f %10.0f %7.0f%%\n", names[ti], shapes[si].name, mb, us, mb / us * 1e3,
                   mb / us * 1e3 / 3000.0 * 100);
            if (si < 4) { tot_us += us * 32; tot_mb += mb * 32; }
            else { tot_us += us; tot_mb += mb; }
            bench_w_free(w, nc);
        }
        printf("%-6s %-8s %12.1f %10.2f %10.0f %7.0f%%   (32 layers + head: one decode step's GEMVs)\n", names[ti], "total",
               tot_mb, tot_us, tot_mb / tot_us * 1e3, tot_mb / tot_us * 1e3 / 3000.0 * 100);
    }
    return 0;
}
