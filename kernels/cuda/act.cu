// act: SwiGLU activation (silu(gate) * up) over the fused gate|up projection.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}

__global__ void swiglu_kernel(const float *__restrict__ gu, float *__restrict__ out, int n_ff, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t t = i / n_ff, j = i % n_ff;
    float g = gu[t * 2 * n_ff + j], u = gu[t * 2 * n_ff + n_ff + j];
    out[i] = g / (1.0f + __expf(-g)) * u;
}

extern "C" int kc_swiglu(const float *gu, float *out, int n_tok, int n_ff, cudaStream_t s) {
    if (!gu || !out || n_tok <= 0 || n_ff <= 0) return CM_EINVAL;
    size_t n = (size_t)n_tok * n_ff;
    swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(gu, out, n_ff, n);
    KC_LAUNCH_CHECK();
}

__global__ void add_bias_kernel(float *y, const float *b, int n, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % n];
}

extern "C" int kc_add_bias(float *y, const float *bias, int n_tok, int n, cudaStream_t s) {
    if (!y || !bias || n_tok <= 0 || n <= 0) return CM_EINVAL;
    size_t total = (size_t)n_tok * n;
    add_bias_kernel<<<(unsigned)((total + 255) / 256), 256, 0, s>>>(y, bias, n, total);
    KC_LAUNCH_CHECK();
}
