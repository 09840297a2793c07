// norm: RMSNorm over rows of f32 activations.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}

// Each thread holds up to NV float4 of the row in registers: one read of x, loads issued together.
template <int NV>
__global__ void rmsnorm_vec_kernel(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y, int n,
                                   float eps) {
    __shared__ float red[32];
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * n);
    float4 *yr = (float4 *)(y + (size_t)blockIdx.x * n);
    const float4 *wv = (const float4 *)w;
    const int n4 = n / 4;
    float4 v[NV];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < n4 ? xr[i] : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < NV; k++) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    ss = kc_block_sum(ss, red);
    const float r = rsqrtf(ss / (float)n + eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            float4 g = wv[i];
            yr[i] = make_float4(v[k].x * r * g.x, v[k].y * r * g.y, v[k].z * r * g.z, v[k].w * r * g.w);
        }
    }
}

// Any n (tiny models): strided scalar loop.
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
    if (n % 4 == 0 && n <= 4 * 1024 * 8) {
        int n4 = n / 4, threads = n4 >= 1024 ? 1024 : ((n4 + 31) / 32) * 32;
        int nv = (n4 + threads - 1) / threads;
        if (nv <= 1) rmsnorm_vec_kernel<1><<<n_tok, threads, 0, s>>>(x, w, y, n, eps);
        else if (nv <= 2) rmsnorm_vec_kernel<2><<<n_tok, threads, 0, s>>>(x, w, y, n, eps);
        else if (nv <= 4) rmsnorm_vec_kernel<4><<<n_tok, threads, 0, s>>>(x, w, y, n, eps);
        else rmsnorm_vec_kernel<8><<<n_tok, threads, 0, s>>>(x, w, y, n, eps);
    } else {
        int threads = n >= 256 ? 256 : ((n + 31) / 32) * 32;
        rmsnorm_kernel<<<n_tok, threads, 0, s>>>(x, w, y, n, eps);
    }
    KC_LAUNCH_CHECK();
}
