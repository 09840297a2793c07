/* gpu_bench_w: random weights of one matrix for the GPU microbenchmarks, uploaded in the
 * kc_weight layout as enough copies that one pass over them overflows the 50 MB L2 (as 32
 * layers do). Header-only, test code only. */
#ifndef ARKA_GPU_BENCH_W_H
#define ARKA_GPU_BENCH_W_H

#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include "gpu_ck.h"

/* Uploads as many copies of one matrix's device bytes (data, db bytes; scales d, sb bytes, may be
 * 0) as overflow the 50 MB L2 in one pass, at most max_copies, into w[]; *bytes: one copy's. */
static inline int bench_w_copies(int type, int n_in, int n_out, const void *data, size_t db, const void *d, size_t sb,
                                 kc_weight *w, int max_copies, size_t *bytes) {
    int nc = (int)(400e6 / (double)(db + sb)) + 1;
    if (nc > max_copies) nc = max_copies;
    for (int k = 0; k < nc; k++) {
        w[k] = (kc_weight){ .type = type, .n_in = n_in, .n_out = n_out };
        CK(cudaMalloc(&w[k].data, db));
        CK(cudaMemcpy(w[k].data, data, db, cudaMemcpyHostToDevice));
        if (sb) {
            CK(cudaMalloc((void **)&w[k].d, sb));
            CK(cudaMemcpy(w[k].d, d, sb, cudaMemcpyHostToDevice));
        }
    }
    *bytes = db + sb;
    return nc;
}

/* Fills w[0 .. returned count) (at most max_copies) with copies of an n_out x n_in matrix of
 * uniform values in [-0.05, 0.05) from rnd (in [-1, 1)), quantized to type; F8_E4M3: random
 * codes (no NaN) with row scales 0.05 / 448. *bytes: one copy's device bytes (elements or blocks
 * plus scales). Free with bench_w_free. */
static inline int bench_w_upload(int type, int n_in, int n_out, float (*rnd)(void), kc_weight *w, int max_copies,
                                 size_t *bytes) {
    size_t n = (size_t)n_in * n_out;
    if (type == DT_F8_E4M3) {
        uint8_t *hq = malloc(n);
        float *hs = malloc((size_t)n_out * 4);
        for (size_t i = 0; i < n; i++) {
            uint8_t c = (uint8_t)((rnd() + 1.0f) * 127.99f);
            hq[i] = (c & 0x7f) == 0x7f ? c - 1 : c;
        }
        for (int r = 0; r < n_out; r++) hs[r] = 0.05f / 448.0f;
        int nc = bench_w_copies(type, n_in, n_out, hq, n, hs, (size_t)n_out * 4, w, max_copies, bytes);
        free(hq);
        free(hs);
        return nc;
    }
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
    int nc = bench_w_copies(type, n_in, n_out, hq, db, hs, sb, w, max_copies, bytes);
    free(hq);
    free(hs);
    return nc;
}

static inline void bench_w_free(kc_weight *w, int n) {
    for (int k = 0; k < n; k++) {
        cudaFree(w[k].data);
        cudaFree(w[k].d);
    }
}

#endif
