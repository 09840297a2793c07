// norm: RMSNorm over rows of f32 activations.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}

KC_TRACE_TU(norm)

// Each thread holds up to NV float4 of the row in registers: one read of x, loads issued together.
// With qh (QUANT), the normalised row is also written as two-level int8 blocks (kc_xq). The
// weights are loaded before the programmatic wait: read after the reduction they added a memory
// round trip to every norm between two GEMVs.
template <int NV, bool QUANT>
__global__ void rmsnorm_vec_kernel(const float *x, const float *__restrict__ w, float *y, int n,
                                   float eps, int8_t *qh, int8_t *ql, int32_t *qm, __half *xh) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    __shared__ float red[32];
    kc_pdl_trigger();
    const float4 *wv = (const float4 *)w;
    const int n4 = n / 4;
    float4 g[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        g[k] = i < n4 ? __ldg(wv + i) : make_float4(0, 0, 0, 0);
    }
    kc_pdl_wait();
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * n);
    float4 *yr = y ? (float4 *)(y + (size_t)blockIdx.x * n) : nullptr; // NULL: only the blocks
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
        float4 o = make_float4(0, 0, 0, 0);
        if (i < n4) {
            o = make_float4(v[k].x * r * g[k].x, v[k].y * r * g[k].y, v[k].z * r * g[k].z, v[k].w * r * g[k].w);
            if (yr) yr[i] = o;
        }
        if (QUANT) kc_xq_block4(o, i < n4, qh, ql, qm, xh, (size_t)blockIdx.x * n + (size_t)i * 4);
    }
}

// Any n (tiny models): strided scalar loop.
__global__ void rmsnorm_kernel(const float *x, const float *__restrict__ w, float *y, int n,
                               float eps) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    __shared__ float red[32];
    kc_pdl_trigger();
    kc_pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = kc_block_sum(ss, red);
    float r = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

template <bool QUANT>
static void launch_vec(const float *x, const float *w, float *y, kc_xq *xq, int n_tok, int n, float eps, cudaStream_t s) {
    /* one float4 per thread where the row allows: the norm sits between two GEMVs, and fewer
     * threads holding more each made the step slower (256: +0.12 ms, 128: +0.3 ms per llama2-7b
     * step; bench/RESULTS.md) */
    int n4 = n / 4, threads = n4 >= 1024 ? 1024 : ((n4 + 31) / 32) * 32;
    int nv = (n4 + threads - 1) / threads;
    int8_t *qh = QUANT && !xq->no_ints ? xq->qh : nullptr, *ql = QUANT ? xq->ql : nullptr;
    int32_t *qm = QUANT ? xq->m : nullptr;
    __half *xh = QUANT ? (__half *)xq->xh : nullptr;
    if (nv <= 1) kc_launch(rmsnorm_vec_kernel<1, QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh);
    else if (nv <= 2) kc_launch(rmsnorm_vec_kernel<2, QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh);
    else if (nv <= 4) kc_launch(rmsnorm_vec_kernel<4, QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh);
    else kc_launch(rmsnorm_vec_kernel<8, QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh);
}

extern "C" int kc_rmsnorm_xq(const float *x, const float *w, float *y, kc_xq *xq, int n_tok, int n, float eps, cudaStream_t s) {
    if (!x || !w || x == y || n_tok <= 0 || n <= 0) return CM_EINVAL;
    const bool quant = xq && n % 32 == 0 && n_tok <= xq->cap_tok && n <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (!y && !(quant && n % 4 == 0 && n <= 4 * 1024 * 8)) return CM_EINVAL; /* nothing would be written */
    if (xq) xq->n = quant ? n : 0;
    if (n % 4 == 0 && n <= 4 * 1024 * 8) {
        if (quant) launch_vec<true>(x, w, y, xq, n_tok, n, eps, s);
        else launch_vec<false>(x, w, y, xq, n_tok, n, eps, s);
    } else {
        if (quant) xq->n = 0; /* only the vector kernel quantizes */
        int threads = n >= 256 ? 256 : ((n + 31) / 32) * 32;
        kc_launch(rmsnorm_kernel, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps);
    }
    KC_LAUNCH_CHECK();
}

extern "C" int kc_rmsnorm(const float *x, const float *w, float *y, int n_tok, int n, float eps, cudaStream_t s) {
    return kc_rmsnorm_xq(x, w, y, NULL, n_tok, n, eps, s);
}
