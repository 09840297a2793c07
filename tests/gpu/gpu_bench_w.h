/* gpu_bench_w: random weights of one matrix for the GPU microbenchmarks, uploaded in the
 * kc_weight layout as enough copies that one pass over them overflows the 50 MB L2 (as 32
 * layers do). Header-only, test code only. */
#ifndef ARKA_GPU_BENCH_W_H
#define ARKA_GPU_BENCH_W_H

#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include "gpu_ck.h"

/* Fills w[0 .. returned count) (at most max_copies) with copies of an n_out x n_in matrix of
 * uniform values in [-0.05, 0.05) from rnd (in [-1, 1)), quantized to type; *bytes: one copy's
 * device bytes (elements or blocks plus scales). Free with bench_w_free. */
static inline int bench_w_upload(int type, int n_in, int n_out, float (*rnd)(void), kc_weight *w, int max_copies,
                                 size_t *bytes) {
    size_t n = (size_t)n_in * n_out;
    float *wf = malloc(n * 4);
    for (size_t i = 0; i < n; i++) wf[i] = rnd() * 0.05f;
    void *blocks = malloc(dt_row_size(type, n_in) * n_out);
    dt_quantize(type, wf, blocks, (int64_t)n);
    free(wf);
    size_t db, sb;
    kc_weight_sizes(type, n_in, n_out, &db, &sb);
    void *hq = malloc(db);
    kc_half *hs = sb ? malloc(sb) : NULL;
    kc_weight_repack(type, blocks, n_in, n_out, hq, hs);
    free(blocks);
    int nc = (int)(400e6 / (double)(db + sb)) + 1;
    if (nc > max_copies) nc = max_copies;
    for (int k = 0; k < nc; k++) {
        w[k] = (kc_weight){ .type = type, .n_in = n_in, .n_out = n_out };
        CK(cudaMalloc(&w[k].data, db));
        CK(cudaMemcpy(w[k].data, hq, db, cudaMemcpyHostToDevice));
        if (sb) {
            CK(cudaMalloc((void **)&w[k].d, sb));
            CK(cudaMemcpy(w[k].d, hs, sb, cudaMemcpyHostToDevice));
        }
    }
    free(hq);
    free(hs);
    *bytes = db + sb;
    return nc;
}

static inline void bench_w_free(kc_weight *w, int n) {
    for (int k = 0; k < n; k++) {
        cudaFree(w[k].data);
        cudaFree(w[k].d);
    }
}

#endif
