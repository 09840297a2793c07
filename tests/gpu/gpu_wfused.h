/* gpu_wfused: a fused weight matrix whose parts may differ in type (Q|K|V of a Q4_K_M file),
 * laid out in host memory the way the cuda backend uploads it (kc_weight_layout; each part
 * repacked at the offsets of its first row), for the GPU tests and benchmarks. Header-only,
 * test code only. */
#ifndef ARKA_GPU_WFUSED_H
#define ARKA_GPU_WFUSED_H

#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parts: rows[i] rows of types[i], GGUF blocks at blocks[i]. Fills *w (data and d left NULL)
 * and returns its regions in *hq (*db bytes) and *hd (*sb bytes), malloc'd (the caller frees).
 * Exits on a layout the kernels do not take (a test's setup error). */
static inline void wfused_host(const int *types, const int *rows, int n_parts, int n_in, void *const *blocks, kc_weight *w,
                               void **hq, void **hd, size_t *db, size_t *sb) {
    if (kc_weight_layout(types, rows, n_parts, n_in, w, db, sb)) {
        fprintf(stderr, "wfused_host: kc_weight_layout refused the parts\n");
        exit(1);
    }
    uint8_t *q = calloc(*db ? *db : 1, 1), *d = calloc(*sb ? *sb : 1, 1);
    for (int i = 0, row = 0; i < n_parts; row += rows[i++]) {
        size_t pd, ps, od, os;
        kc_weight_sizes(types[i], n_in, rows[i], &pd, &ps);
        void *pq = malloc(pd ? pd : 1);
        kc_half *pdd = malloc(ps ? ps : 1);
        kc_weight_repack(types[i], blocks[i], n_in, rows[i], pq, pdd);
        kc_weight_row_at(w, row, &od, &os);
        memcpy(q + od, pq, pd);
        memcpy(d + os, pdd, ps);
        free(pq);
        free(pdd);
    }
    w->data = NULL;
    w->d = NULL;
    *hq = q;
    *hd = d;
}

/* Benchmarks: the parts of llama2-7b matrix `name` (qkv, wo, gate|up, down, head: n_out rows)
 * in the layers of a Q4_K_M file that take more bits (llama.cpp's recipe: wv and ffn_down
 * Q6_K, the other matrices Q4_K, output Q6_K): *n_parts parts into types / rows (room for 2). */
static inline void q4km_parts(const char *name, int n_out, int *types, int *rows, int *n_parts) {
    if (!strcmp(name, "qkv")) { /* wq, wk: Q4_K (one range), wv: Q6_K */
        types[0] = DT_Q4_K, rows[0] = n_out / 3 * 2, types[1] = DT_Q6_K, rows[1] = n_out - rows[0], *n_parts = 2;
        return;
    }
    types[0] = !strcmp(name, "down") || !strcmp(name, "head") ? DT_Q6_K : DT_Q4_K, rows[0] = n_out, *n_parts = 1;
}

/* Random weights (uniform in [-0.05, 0.05) from rnd, in [-1, 1)) of a fused matrix of parts,
 * uploaded as enough copies (at most max_copies) that one pass over them overflows the 50 MB
 * L2, like gpu_bench_w.h's bench_w_upload; *bytes: one copy's device bytes. Free the copies'
 * data and d with cudaFree. */
static inline int bench_wfused_upload(const int *types, const int *rows, int n_parts, int n_in, float (*rnd)(void), kc_weight *w,
                                      int max_copies, size_t *bytes) {
    void *blocks[KC_WEIGHT_MAX_PARTS];
    for (int i = 0; i < n_parts; i++) {
        const size_t n = (size_t)n_in * rows[i];
        float *wf = malloc(n * 4);
        for (size_t k = 0; k < n; k++) wf[k] = rnd() * 0.05f;
        blocks[i] = malloc(dt_row_size(types[i], n_in) * rows[i]);
        dt_quantize(types[i], wf, blocks[i], (int64_t)n);
        free(wf);
    }
    kc_weight w0;
    void *hq, *hd;
    size_t db, sb;
    wfused_host(types, rows, n_parts, n_in, blocks, &w0, &hq, &hd, &db, &sb);
    for (int i = 0; i < n_parts; i++) free(blocks[i]);
    int nc = (int)(400e6 / (double)(db + sb)) + 1;
    if (nc > max_copies) nc = max_copies;
    for (int k = 0; k < nc; k++) {
        w[k] = w0;
        if (cudaMalloc(&w[k].data, db) != cudaSuccess || cudaMemcpy(w[k].data, hq, db, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMalloc((void **)&w[k].d, sb) != cudaSuccess || cudaMemcpy(w[k].d, hd, sb, cudaMemcpyHostToDevice) != cudaSuccess) {
            fprintf(stderr, "bench_wfused_upload: device allocation or copy failed\n");
            exit(1);
        }
    }
    free(hq);
    free(hd);
    *bytes = db + sb;
    return nc;
}

#endif
