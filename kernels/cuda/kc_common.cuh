// kc_common: device helpers shared by every kernel (warp reductions, conversions, error checks).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/cm_err.h"
#include "common/cm_log.h"
}

// Logs the failed launch with file and line and returns CM_ECUDA from the launcher.
#define KC_LAUNCH_CHECK()                                                                         \
    do {                                                                                          \
        cudaError_t kc_e_ = cudaGetLastError();                                                   \
        if (kc_e_ != cudaSuccess) {                                                               \
            cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel launch failed", "err=\"%s\" file=%s line=%d", \
                         cudaGetErrorString(kc_e_), __FILE__, __LINE__);                          \
            return CM_ECUDA;                                                                      \
        }                                                                                         \
        return 0;                                                                                 \
    } while (0)

__device__ __forceinline__ float kc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (multiple of 32, <= 1024). `red` holds 32 floats.
__device__ __forceinline__ float kc_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = kc_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = lane < nw ? red[lane] : 0.0f;
    return kc_warp_sum(v);
}

__device__ __forceinline__ float kc_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float kc_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
