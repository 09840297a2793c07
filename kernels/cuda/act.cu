// act: SwiGLU activation (silu(gate) * up) over the fused gate|up projection, whose rows
// interleave gate and up.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}

KC_TRACE_TU(act)

// gu rows interleave gate and up: gu[t][2j] = gate j, gu[t][2j + 1] = up j (kcuda.h).
__global__ void swiglu_kernel(const float *gu, float *out, int n_ff, size_t n) {
    KC_TRACE_SCOPE(KC_TR_SWIGLU);
    kc_pdl_trigger();
    kc_pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t t = i / n_ff, j = i % n_ff;
    float2 p = *(const float2 *)(gu + t * 2 * n_ff + 2 * j);
    out[i] = kc_silu_mul(p.x, p.y);
}

// Four values per thread (n_ff % 32 == 0), also written as two-level int8 blocks (kc_xq);
// out may be NULL (only the blocks).
__global__ void swiglu_xq_kernel(const float *gu, float *out, int n_ff, int8_t *qh, int8_t *ql,
                                 int32_t *qm, __half *xh) {
    KC_TRACE_SCOPE(KC_TR_SWIGLU);
    kc_pdl_trigger();
    kc_pdl_wait();
    const size_t t = blockIdx.y;
    const int j = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    const bool ok = j < n_ff;
    float4 o = make_float4(0, 0, 0, 0);
    if (ok) {
        const float4 *p = (const float4 *)(gu + t * 2 * n_ff + 2 * j);
        float4 a = p[0], b = p[1]; // gate j, up j, gate j + 1, up j + 1; then j + 2, j + 3
        o = make_float4(kc_silu_mul(a.x, a.y), kc_silu_mul(a.z, a.w), kc_silu_mul(b.x, b.y), kc_silu_mul(b.z, b.w));
        if (out) *(float4 *)(out + t * n_ff + j) = o;
    }
    kc_xq_block4(o, ok, qh, ql, qm, xh, t * n_ff + j);
}

extern "C" int kc_swiglu_xq(const float *gu, float *out, kc_xq *xq, int n_tok, int n_ff, cudaStream_t s) {
    if (!gu || n_tok <= 0 || n_ff <= 0) return CM_EINVAL;
    const bool quant = xq && n_ff % 32 == 0 && n_tok <= xq->cap_tok && n_ff <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (!out && !quant) return CM_EINVAL; /* nothing would be written */
    if (xq) xq->n = quant ? n_ff : 0;
    if (quant) {
        const int threads = 256;
        dim3 grid((n_ff / 4 + threads - 1) / threads, n_tok);
        kc_launch(swiglu_xq_kernel, grid, dim3(threads), 0, s, gu, out, n_ff, xq->no_ints ? nullptr : xq->qh, xq->ql, xq->m, (__half *)xq->xh);
    } else {
        size_t n = (size_t)n_tok * n_ff;
        kc_launch(swiglu_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, s, gu, out, n_ff, n);
    }
    KC_LAUNCH_CHECK();
}

extern "C" int kc_swiglu(const float *gu, float *out, int n_tok, int n_ff, cudaStream_t s) {
    return kc_swiglu_xq(gu, out, NULL, n_tok, n_ff, s);
}

__global__ void add_bias_kernel(float *y, const float *b, int n, size_t total) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % n];
}

extern "C" int kc_add_bias(float *y, const float *bias, int n_tok, int n, cudaStream_t s) {
    if (!y || !bias || n_tok <= 0 || n <= 0) return CM_EINVAL;
    size_t total = (size_t)n_tok * n;
    kc_launch(add_bias_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, s, y, bias, n, total);
    KC_LAUNCH_CHECK();
}

__global__ void fault_kernel() { __trap(); }

extern "C" int kc_fault(cudaStream_t s) {
    fault_kernel<<<1, 1, 0, s>>>();
    KC_LAUNCH_CHECK();
}
