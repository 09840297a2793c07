// sample: on-device greedy selection (argmax) over logits rows.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}

__global__ void argmax_kernel(const float *logits, int n_vocab, int32_t *out) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        float v = row[i];
        if (v > best) { best = v; idx = i; } // strided scan keeps the lowest index per thread on ties
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { bv[warp] = best; bi[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        best = lane < nw ? bv[lane] : -INFINITY;
        idx = lane < nw ? bi[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}

extern "C" int kc_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, cudaStream_t s) {
    if (!logits || !out || n_rows <= 0 || n_vocab <= 0) return CM_EINVAL;
    argmax_kernel<<<n_rows, 1024, 0, s>>>(logits, n_vocab, out);
    KC_LAUNCH_CHECK();
}
