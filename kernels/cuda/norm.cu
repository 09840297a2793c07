// norm: RMSNorm over rows of f32 activations.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}

__global__ void rmsnorm_kernel(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y, int n,
                               float eps) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = kc_block_sum(ss, red);
    float r = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

extern "C" int kc_rmsnorm(const float *x, const float *w, float *y, int n_tok, int n, float eps, cudaStream_t s) {
    if (!x || !w || !y || x == y || n_tok <= 0 || n <= 0) return CM_EINVAL;
    int threads = n >= 1024 ? 1024 : ((n + 31) / 32) * 32;
    rmsnorm_kernel<<<n_tok, threads, 0, s>>>(x, w, y, n, eps);
    KC_LAUNCH_CHECK();
}
