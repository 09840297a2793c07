// fp8: FP8 E4M3 weights (kcuda.h: codes [n_out][n_in] bytes, one f32 scale per row in d).
//   - up to KC_GEMV_MAX_TOK tokens: a GEMV that streams the codes with 16-byte loads, expands
//     pairs of codes to half (exact: every E4M3 value is a half) and sums code x activation in
//     f32, times the row's scale at the end (the CPU's k_matmul_scaled order of operations);
//   - more tokens, on devices with FP8 tensor cores (sm_89 and newer): the activations are
//     quantized per token (scale amax / 448, codes saturated, as dt_fp8_scale / dt_fp8_encode)
//     and cuBLASLt multiplies E4M3 x E4M3 with f32 accumulation, applying the weight row scales
//     and the token scales as outer-vector scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), or,
//     where kc_matmul_tune_f8 timed it faster, with unit scales and a pass that applies them;
//   - otherwise (older devices, a cuBLASLt without that mode, shapes it refuses, no workspace,
//     the kernel plan's fp8_gemm=0): the codes times their scales dequantized to half in slices
//     of rows, then cuBLAS (f16 operands, f32 accumulation), the path of the other quantized
//     types. The plan's fp8_fast_accum turns on cuBLASLt's fast FP8 accumulation.
#include "kc_common.cuh"
#include "lt_desc.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp8.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

KC_TRACE_TU(fp8)

#define F8_WARPS 4

// 16 codes -> 16 floats (exact).
__device__ __forceinline__ void f8_expand16(const uint4 &w, float (&f)[16]) {
    const uint32_t u[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[k] & 0xffff), __NV_E4M3);
        const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[k] >> 16), __NV_E4M3);
        const float2 a = __half22float2(*(const __half2 *)&lo), b = __half22float2(*(const __half2 *)&hi);
        f[4 * k] = a.x;
        f[4 * k + 1] = a.y;
        f[4 * k + 2] = b.x;
        f[4 * k + 3] = b.y;
    }
}

// 16 codes -> 8 half2 times 2^-8 (exact: the codes are halves, and the smallest E4M3 value
// 2^-9 becomes 2^-17, a half subnormal on the 2^-24 grid). The factor keeps sums of products
// with half activations far from the half range's end (448 x 2^-8 = 1.75 a product at most).
__device__ __forceinline__ void f8_expand16_h(const uint4 &w, __half2 (&h)[8]) {
    const uint32_t u[4] = { w.x, w.y, w.z, w.w };
    const __half2 k = __float2half2_rn(0.00390625f);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[j] & 0xffff), __NV_E4M3);
        const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[j] >> 16), __NV_E4M3);
        h[2 * j] = __hmul2(*(const __half2 *)&lo, k);
        h[2 * j + 1] = __hmul2(*(const __half2 *)&hi, k);
    }
}

// SwiGLU or GeGLU in the gate|up GEMV's epilogue (kc__matmul_f8_glu): rows interleave gate and up
// (row 2j gate j, 2j + 1 up j), so a warp of R even rows holds pairs.
struct f8_swi {
    float *out; // [NT][n_ff] f32, or NULL
    __half *xh; // [NT][n_ff] half
    int n_ff;
    int gelu;   // GeGLU (tanh GELU) instead of SwiGLU
};

// One warp per R rows, NT tokens; a lane takes chunks of 16 codes c = lane, lane + 32, ...
// in ascending order (the sum's order depends on n_in only). U batches of chunks per row are
// in flight: the first two are loaded before the programmatic wait.
// XH = false: x is f32 and every product is exact, summed in f32 (the CPU's order of
// operations: the row's scale at the end). XH = true: x is the producer's half copy
// (kc_xq.xh, 2 bytes an activation instead of 4): the 16 products of a chunk are summed in
// half pairs (codes x 2^-8, as the F16 GEMV sums 8 products in half), then in f32. The
// f32 path's conversions (16 per 16 codes) bounded it at ~2.4 TB/s on an H200.
// SWI (XH only): the SwiGLU (or GeGLU) of each gate/up row pair is written as f32 (sw.out) and half.
template <int NT, int R, int U, bool XH, bool SWI>
__global__ void __launch_bounds__(F8_WARPS * 32)
gemv_f8_kernel(const uint8_t *__restrict__ W, const float *__restrict__ scale, const void *xv, float *y, int n_in,
               int n_out, int ldy, int accumulate, f8_swi sw) {
    KC_TRACE_SCOPE(KC_TR_GEMV);
    static_assert(!SWI || (XH && R % 2 == 0), "SwiGLU: half activations, gate and up rows in one warp");
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * F8_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) {
        kc_pdl_wait();
        return;
    }
    const int nchunks = n_in / 16;
    const uint4 *wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) wrow[r] = (const uint4 *)(W + (size_t)min(row0 + r, n_out - 1) * n_in);
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    int c = lane;
    uint4 w[U][R], wn[U][R];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (c + 32 * u < nchunks) w[u][r] = __ldg(wrow[r] + c + 32 * u);
            if (c + 32 * (U + u) < nchunks) wn[u][r] = __ldg(wrow[r] + c + 32 * (U + u));
        }
    kc_pdl_wait();
    auto step = [&](const uint4 (&wc)[R], int cc) {
        if constexpr (XH) {
            __half2 xs[NT][8];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const uint4 *p = (const uint4 *)((const __half *)xv + (size_t)t * n_in + (size_t)cc * 16);
                const uint4 a = __ldca(p), b = __ldca(p + 1); // written by the kernel before
                memcpy(&xs[t][0], &a, 16);
                memcpy(&xs[t][4], &b, 16);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                __half2 f[8];
                f8_expand16_h(wc[r], f);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    __half2 p0 = __hmul2(f[0], xs[t][0]), p1 = __hmul2(f[4], xs[t][4]);
#pragma unroll
                    for (int k = 1; k < 4; k++) {
                        p0 = __hfma2(f[k], xs[t][k], p0);
                        p1 = __hfma2(f[4 + k], xs[t][4 + k], p1);
                    }
                    const float2 a = __half22float2(p0), b = __half22float2(p1);
                    acc[r][t] += (a.x + a.y) + (b.x + b.y);
                }
            }
        } else {
            const float *x = (const float *)xv;
            float xs[NT][16];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 *p = (const float4 *)(x + (size_t)t * n_in + (size_t)cc * 16);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float4 v = __ldca(p + k); // written by the kernel before: not the read-only path
                    xs[t][4 * k] = v.x; xs[t][4 * k + 1] = v.y; xs[t][4 * k + 2] = v.z; xs[t][4 * k + 3] = v.w;
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float f[16];
                f8_expand16(wc[r], f);
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int k = 0; k < 16; k++) acc[r][t] = fmaf(f[k], xs[t][k], acc[r][t]);
            }
        }
    };
    for (; c + 32 * (U - 1) < nchunks; c += 32 * U) {
#pragma unroll
        for (int u = 0; u < U; u++) step(w[u], c + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                w[u][r] = wn[u][r];
                if (c + 32 * (2 * U + u) < nchunks) wn[u][r] = __ldg(wrow[r] + c + 32 * (2 * U + u));
            }
    }
#pragma unroll
    for (int u = 0; u < U; u++)
        if (c + 32 * u < nchunks) step(w[u], c + 32 * u);
    const float k = XH ? 256.0f : 1.0f; // undoes f8_expand16_h's 2^-8 (exact)
    if constexpr (SWI) {
#pragma unroll
        for (int r = 0; r + 1 < R; r += 2)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float g = kc_warp_sum(acc[r][t]), u = kc_warp_sum(acc[r + 1][t]);
                const int j = (row0 + r) / 2;
                if (lane == 0 && j < sw.n_ff) {
                    const float gs = __ldg(scale + row0 + r) * (g * k), us = __ldg(scale + row0 + r + 1) * (u * k);
                    const float v = sw.gelu ? kc_gelu_mul(gs, us) : kc_silu_mul(gs, us);
                    const size_t e = (size_t)t * sw.n_ff + j;
                    if (sw.out) sw.out[e] = v;
                    sw.xh[e] = __float2half_rn(v);
                }
            }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float v = kc_warp_sum(acc[r][t]);
                if (lane == 0 && row0 + r < n_out) {
                    float *dst = y + (size_t)t * ldy + row0 + r;
                    const float o = __ldg(scale + row0 + r) * (v * k);
                    *dst = accumulate ? *dst + o : o;
                }
            }
    }
}

template <int NT, int R, int U, bool XH, bool SWI = false>
static void launch_gemv_f8_r(const kc_weight *W, const void *x, float *y, int ldy, int acc, cudaStream_t s,
                             const f8_swi &sw) {
    const int rows_per_block = F8_WARPS * R;
    kc_launch(gemv_f8_kernel<NT, R, U, XH, SWI>, dim3((W->n_out + rows_per_block - 1) / rows_per_block), dim3(F8_WARPS * 32), 0,
              s, (const uint8_t *)W->data, (const float *)W->d, x, y, W->n_in, W->n_out, ldy, acc, sw);
}

// Rows a warp per token count: more rows share each activation load, fewer keep more warps in
// flight. One token: 2 rows a warp and 4 batches of chunks in flight, as the F16 GEMV (half
// activations; on an H200 llama3-8b's gate|up 34.7 -> 31.6 us and down 21.2 -> 18.4 us against 4
// rows and 2 batches, batch-1 decode 333 -> 366 tok/s: bench/RESULTS.md, thirtieth session). The
// f32 activations keep 4 rows (with 2, their L1 traffic, 64 bytes per 16 bytes of codes a row,
// bounded that kernel at ~2.4 TB/s).
template <bool XH, bool SWI>
static void launch_gemv_f8(const kc_weight *W, const void *x, int n_tok, float *y, int ldy, int acc, cudaStream_t s,
                           const f8_swi &sw = f8_swi{}) {
    switch (n_tok) {
    case 1: launch_gemv_f8_r<1, XH ? 2 : 4, XH ? 4 : 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    case 2: launch_gemv_f8_r<2, 2, 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    case 3: launch_gemv_f8_r<3, 2, 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    case 4: launch_gemv_f8_r<4, 2, 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    case 5: launch_gemv_f8_r<5, XH ? 2 : 1, 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    case 6: launch_gemv_f8_r<6, XH ? 2 : 1, 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    case 7: launch_gemv_f8_r<7, XH ? 2 : 1, 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    default: launch_gemv_f8_r<8, XH ? 2 : 1, 2, XH, SWI>(W, x, y, ldy, acc, s, sw); break;
    }
}

// Whether the GEMV can read xq's half copy for W and n_tok tokens.
static bool f8_half_x(const kc_weight *W, const kc_xq *xq, int n_tok) {
    return n_tok <= KC_GEMV_MAX_TOK && xq && xq->xh && xq->n == W->n_in && n_tok <= xq->cap_tok && W->n_in % 16 == 0;
}

// Rows not a multiple of 16 codes: one code at a time (tiny models).
__global__ void gemv_f8_scalar_kernel(const uint8_t *W, const float *scale, const float *x, float *y, int n_in, int n_out,
                                      int ldy, int n_tok, int accumulate) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * F8_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;
    for (int t = 0; t < n_tok; t++) {
        float acc = 0.0f;
        for (int i = lane; i < n_in; i += 32) {
            const __half_raw h = __nv_cvt_fp8_to_halfraw(W[(size_t)row * n_in + i], __NV_E4M3);
            acc = fmaf(__half2float(*(const __half *)&h), x[(size_t)t * n_in + i], acc);
        }
        acc = kc_warp_sum(acc);
        if (lane == 0) {
            float *dst = y + (size_t)t * ldy + row;
            const float o = scale[row] * acc;
            *dst = accumulate ? *dst + o : o;
        }
    }
}

// ---- activations per token: E4M3 codes and one scale (amax / 448) --------------------------------

// One CTA per token: codes [n_tok][n] into q, scales into xs. The same rounding as
// dt_fp8_scale / dt_fp8_encode: s = amax / 448, code = e4m3_sat(x / s), all zero when s is 0.
__global__ void quantize_f8_kernel(const float *x, int n, uint8_t *q, float *xs) {
    __shared__ float red[32];
    const int t = blockIdx.x;
    const float *xr = x + (size_t)t * n;
    float amax = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) amax = fmaxf(amax, fabsf(xr[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const float s = __fdiv_rn(red[0], 448.0f);
    if (threadIdx.x == 0) xs[t] = s;
    uint8_t *qr = q + (size_t)t * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        qr[i] = s != 0.0f ? (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(xr[i], s), __NV_SATFINITE, __NV_E4M3) : 0;
}

// The same with a row's values in registers (n % 4 == 0, n <= 4 V F8Q_THREADS): V float4 a
// thread, all loaded at once, so that a row is one round trip to memory, and 4 codes a store.
// quantize_f8_kernel reads each row twice, 4 bytes a load, one CTA of 256 threads a token: few
// loads in flight where the step has few tokens. The same amax, scale and codes.
constexpr int F8Q_THREADS = 512;
template <int V> __global__ void __launch_bounds__(F8Q_THREADS) quantize_f8_vec_kernel(const float *x, int n, uint8_t *q, float *xs) {
    __shared__ float red[32];
    const int t = blockIdx.x, n4 = n / 4;
    const float4 *xr = (const float4 *)(x + (size_t)t * n);
    float4 v[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = threadIdx.x + j * F8Q_THREADS;
        v[j] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    kc_f8_row(v, n, q + (size_t)t * n, xs + t, red);
}

extern "C" int kc_quantize_f8(const float *x, int n_tok, int n, uint8_t *q, float *scale, cudaStream_t s) {
    if (!x || !q || !scale || n_tok <= 0 || n <= 0) return CM_EINVAL;
    const int v = (n + 4 * F8Q_THREADS - 1) / (4 * F8Q_THREADS);
    if (n % 4 == 0 && v <= 16 && (uintptr_t)x % 16 == 0 && (uintptr_t)q % 4 == 0) {
        auto *k = v <= 1 ? quantize_f8_vec_kernel<1> : v <= 2 ? quantize_f8_vec_kernel<2> : v <= 4 ? quantize_f8_vec_kernel<4>
                : v <= 8 ? quantize_f8_vec_kernel<8> : quantize_f8_vec_kernel<16>;
        k<<<n_tok, F8Q_THREADS, 0, s>>>(x, n, q, scale);
    } else
        quantize_f8_kernel<<<n_tok, 256, 0, s>>>(x, n, q, scale);
    KC_LAUNCH_CHECK();
}

// ---- the fallback: dequantized to half, then cuBLAS ------------------------------------------------

__global__ void dequant_f8_half_kernel(const uint8_t *q, const float *scale, int n_in, size_t n, __half *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
        out[i] = __float2half_rn(__half2float(*(const __half *)&h) * scale[i / (size_t)n_in]);
    }
}

__global__ void f8_to_half_kernel(const float *x, size_t n, __half *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = __float2half(x[i]);
}

static int f8_cublas_ok(cublasStatus_t st, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "cublas call failed", "status=%d file=%s line=%d", (int)st, __FILE__, line);
    return CM_ECUDA;
}

static int f8_launch_ok(int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel launch failed", "err=\"%s\" file=%s line=%d", cudaGetErrorString(e),
                 __FILE__, line);
    return CM_ECUDA;
}

static int gemm_dequant(const kc_weight *W, const float *x, int n_tok, float *y, int ldy, int accumulate,
                        const kc_gemm_ws *ws, cudaStream_t s) {
    if (!ws || !ws->cublas || !ws->w_half || !ws->x_half) return CM_EINVAL;
    const size_t nx = (size_t)n_tok * W->n_in, per = ws->w_cap / (size_t)W->n_in;
    if (nx > ws->x_cap || per == 0) return CM_EINVAL;
    f8_to_half_kernel<<<(unsigned)((nx + 255) / 256 < 4096 ? (nx + 255) / 256 : 4096), 256, 0, s>>>(x, nx, (__half *)ws->x_half);
    if (int rc = f8_launch_ok(__LINE__)) return rc;
    cublasHandle_t h = (cublasHandle_t)ws->cublas;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    for (size_t o0 = 0; o0 < (size_t)W->n_out; o0 += per) {
        const size_t nr = (size_t)W->n_out - o0 < per ? (size_t)W->n_out - o0 : per, ne = nr * W->n_in;
        const unsigned g = (unsigned)((ne + 255) / 256 < 16384 ? (ne + 255) / 256 : 16384);
        dequant_f8_half_kernel<<<g, 256, 0, s>>>((const uint8_t *)W->data + o0 * W->n_in, (const float *)W->d + o0, W->n_in, ne,
                                                 (__half *)ws->w_half);
        if (int rc = f8_launch_ok(__LINE__)) return rc;
        int rc = f8_cublas_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n_tok, W->n_in, &one, ws->w_half, CUDA_R_16F,
                                           W->n_in, ws->x_half, CUDA_R_16F, W->n_in, &beta, y + o0, CUDA_R_32F, ldy,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                              __LINE__);
        if (rc) return rc;
    }
    return 0;
}

// ---- cuBLASLt FP8 GEMM ---------------------------------------------------------------------------
// Two ways to apply the weight rows' and the tokens' scales:
//   - outer: cuBLASLt applies them as outer-vector scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F).
//     cuBLASLt 13 offers one algorithm for that on Hopper: as fast as any from 2,048 tokens, up
//     to twice as slow at 16-128;
//   - scalar: cuBLASLt multiplies the codes alone (unit scales: 1-8 algorithms per shape) into
//     ws->f8_raw, and f8_scale_kernel writes (or adds) raw x row scale x token scale into y.
//     llama3-8b's wo and down at 64 tokens: 15.1 / 38.4 us outer against 8.2 / 19.4 scalar
//     (H200, bench/RESULTS.md, twenty-fifth session).
// kc_matmul_tune_f8 times both per shape and count at start-up; without a timed entry: outer.

namespace {
// The path timed fastest at start-up per shape, accumulation and count (kc_matmul_tune_f8; host
// memory, the step thread only)
struct f8_timed {
    int m, k, n, acc, fast;
    bool scalar; // unit scales and f8_scale_kernel (algo), else outer-vector scales
    int wg;      // >= 0: the FP8 wgmma tiles in this configuration (gemm_f8_wg.cu) instead of cuBLASLt
    cublasLtMatmulAlgo_t algo;
    // unit scales without the pass (kc_matmul_f8_raw: the reader applies the scales, and adds
    // where acc) on raw_algo, where timed faster than the pick above
    bool raw;
    cublasLtMatmulAlgo_t raw_algo;
};
f8_timed g_f8t[256];
int g_f8t_n;
// tests: 1, the scalar path on the heuristic's last algorithm that ran; 2, the wgmma tiles'
// fastest configuration; 3, the unit-scale sums for a reader that scales (kc_matmul_f8_raw)
// wherever a unit-scale algorithm ran; whatever the times
int g_f8t_force;
} // namespace

// The algorithm per shape and exact count (host memory; the step thread only). ok: 1 found, -1
// refused (the shape goes to the fallback from then on).
struct lt_entry {
    int m, n, k, ldy, acc, fast, ok;
    bool scalar;
    int wg; // >= 0: kc__gemm_f8_wg's configuration (the timed entry's), not cuBLASLt
    cublasLtMatmulAlgo_t algo;
};
static lt_entry g_lt[128];
enum { F8_WG_MAX = 32 }; // wgmma configurations timed at most (gemm_f8_wg.cu has 31: 15 with f32 partials, 16 fast)
static int g_lt_n, g_lt_next;
static int g_lt_warned;

extern "C" void kc__matmul_tune_f8_reset(void) { g_f8t_n = g_lt_n = g_lt_next = 0; }
extern "C" void kc__matmul_tune_f8_force(int on) { g_f8t_force = on; }

// y[t][o] (+)= raw[t][o] x sw[o] x sx[t], 4 outputs a thread (m % 4 == 0)
__global__ void f8_scale_kernel(const float *__restrict__ raw, const float *__restrict__ sw, const float *__restrict__ sx, float *y,
                                int ldy, int m, int n_tok, int acc) {
    const int m4 = m / 4;
    const size_t n = (size_t)n_tok * m4, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int t = (int)(i / m4), o = (int)(i % m4) * 4;
        const float4 r = *(const float4 *)(raw + (size_t)t * m + o), w = *(const float4 *)(sw + o);
        const float st = sx[t];
        float *p = y + (size_t)t * ldy + o;
        const float4 v = acc ? kc_f8_scaled_add(r, w, st, make_float4(p[0], p[1], p[2], p[3])) : kc_f8_scaled4(r, w, st);
        p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
    }
}

static void f8_scale(const float *raw, const float *sw, const float *sx, float *y, int ldy, int m, int n_tok, int acc, cudaStream_t s) {
    const size_t n = (size_t)n_tok * (m / 4);
    const unsigned g = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    f8_scale_kernel<<<g, 256, 0, s>>>(raw, sw, sx, y, ldy, m, n_tok, acc);
}

// Whether the scalar path has room for m x n outputs (and their alignment)
static bool f8_scalar_fits(const kc_gemm_ws *ws, int m, int n, int ldy, const float *y) {
    return ws->f8_raw && (size_t)m * n <= ws->f8_raw_cap && m % 4 == 0 && ldy % 4 == 0 && ((uintptr_t)y & 15) == 0;
}

// The timed entry of the largest count <= n for this shape, accumulation and accumulation mode
static const f8_timed *f8_timed_pick(int m, int k, int n, int acc, int fast) {
    const f8_timed *best = nullptr;
    for (int i = 0; i < g_f8t_n; i++) {
        const f8_timed &e = g_f8t[i];
        if (e.m == m && e.k == k && e.acc == acc && e.fast == fast && e.n <= n && (!best || e.n > best->n)) best = &e;
    }
    return best;
}

static int lt_gemm(const kc_weight *W, const uint8_t *xq, const float *xs, int n_tok, float *y, int ldy, int accumulate,
                   const kc_gemm_ws *ws, cudaStream_t s, bool *refused) {
    *refused = false;
    const int m = W->n_out, n = n_tok, k = W->n_in;
    const int8_t fast = kc_plan_get()->fp8_fast_accum ? 1 : 0;
    lt_entry *e = nullptr;
    for (int i = 0; i < g_lt_n; i++)
        if (g_lt[i].m == m && g_lt[i].n == n && g_lt[i].k == k && g_lt[i].ldy == ldy && g_lt[i].acc == accumulate &&
            g_lt[i].fast == fast)
            e = &g_lt[i];
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (!e) {
        lt_entry fresh = { m, n, k, ldy, accumulate, fast, -1, false, -1, {} };
        // the wgmma tiles or the scalar path where they were timed faster for this shape and take
        // n tokens (the tiles up to twice the count timed), else outer
        const f8_timed *t = kc_plan_get()->fp8_lt_tune ? f8_timed_pick(m, k, n, accumulate, fast) : nullptr;
        if (t && t->wg >= 0 && kc_plan_get()->fp8_wg && n < 2 * t->n) {
            fresh.ok = 1;
            fresh.wg = t->wg;
        } else if (t && t->scalar && f8_scalar_fits(ws, m, n, ldy, y)) {
            kc_lt_desc d;
            if (!d.make(m, n, k, m, CUDA_R_8F_E4M3, CUDA_R_32F, fast) && d.takes(ws, &t->algo)) {
                fresh.ok = 1;
                fresh.scalar = true;
                fresh.algo = t->algo;
            }
        }
        if (fresh.ok < 0) {
            kc_lt_desc d;
            cublasLtMatmulHeuristicResult_t hr[1];
            st = d.make(m, n, k, ldy, CUDA_R_8F_E4M3, CUDA_R_32F, fast, W->d, xs);
            if (!st && d.heuristic(ws, hr, 1)) {
                fresh.ok = 1;
                fresh.algo = hr[0].algo;
            }
        }
        const int cap = (int)(sizeof g_lt / sizeof *g_lt);
        e = g_lt_n < cap ? &g_lt[g_lt_n++] : &g_lt[g_lt_next++ % cap]; // full: the oldest entries go first
        *e = fresh;
    }
    if (st) return f8_cublas_ok(st, __LINE__);
    if (e->ok < 0) {
        *refused = true;
        return 0;
    }
    if (e->wg >= 0) {
        const int rc = kc__gemm_f8_wg(W, xq, xs, n, y, ldy, accumulate, e->wg, s);
        // else (these pointers' alignment, a tensor map the driver refused): outer-vector scales
        if (rc != CM_EINVAL && rc != CM_EUNSUPPORTED) return rc;
    }
    kc_lt_desc d;
    // an entry made for an output the scalar path cannot take now: outer-vector scales
    const bool scalar = e->scalar && f8_scalar_fits(ws, m, n, ldy, y);
    cublasLtMatmulAlgo_t algo = e->algo;
    st = scalar ? d.make(m, n, k, m, CUDA_R_8F_E4M3, CUDA_R_32F, fast) : d.make(m, n, k, ldy, CUDA_R_8F_E4M3, CUDA_R_32F, fast, W->d, xs);
    if (!st && (e->scalar || e->wg >= 0) && !scalar) {
        cublasLtMatmulHeuristicResult_t hr[1];
        if (!d.heuristic(ws, hr, 1)) {
            *refused = true;
            return 0;
        }
        algo = hr[0].algo;
    }
    if (!st) st = d.run(ws, &algo, W->data, xq, scalar ? ws->f8_raw : y, scalar || !accumulate ? 0.0f : 1.0f, s);
    if (int rc = f8_cublas_ok(st, __LINE__)) return rc;
    if (scalar) {
        f8_scale(ws->f8_raw, (const float *)W->d, xs, y, ldy, m, n, accumulate, s);
        return f8_launch_ok(__LINE__);
    }
    return 0;
}

// n random E4M3 codes (magnitudes 2^-4 .. 2^4, both signs: no NaN) and nt token scales: the
// tune's activations (varied bits: tensor cores draw more power, and clock lower, on varied
// operands than on zeros)
__global__ void f8_tune_fill_kernel(uint8_t *x, size_t n, float *xs, int nt) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = (uint8_t)(((h >> 31) << 7) | ((3u + ((h >> 12) & 7u)) << 3) | ((h >> 20) & 7u));
    }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)nt; i += stride) xs[i] = 1.0f / 64.0f;
}

static bool f8_tensor_cores(void);

extern "C" int kc_matmul_tune_f8(const kc_weight *const *W, const unsigned char *acc, int n_w, int max_tok, const kc_gemm_ws *ws,
                                 cudaStream_t s, char *report, size_t report_len) {
    if (report && report_len) report[0] = 0;
    int hi = max_tok < KC_TUNE_MAX_TOK ? max_tok : KC_TUNE_MAX_TOK;
    if (ws && hi > ws->x_scale_cap) hi = ws->x_scale_cap;
    const int lo = 16;
    if (!kc_plan_get()->fp8_gemm || !kc_plan_get()->fp8_lt_tune || lo > hi || !ws || !ws->cublaslt || !ws->x_half || !ws->x_scale ||
        !ws->lt_ws || !ws->f8_raw || !f8_tensor_cores())
        return 0;
    enum { MAX_SHAPES = 32, MAX_ALGOS = 8, MAX_CANDS = 1 + MAX_ALGOS };
    int shp[MAX_SHAPES][3], wi[MAX_SHAPES], n_shp = 0; // n_out, n_in, accumulate; the first weight of the shape
    size_t y_max = 0;
    for (int i = 0; i < n_w; i++) {
        const kc_weight *w = W[i];
        if (!w || w->type != DT_F8_E4M3 || !w->data || !w->d || w->n_in % 16 || w->n_out % 4) continue;
        const int a = acc && acc[i] ? 1 : 0;
        bool seen = false;
        for (int j = 0; j < n_shp && !seen; j++) seen = shp[j][0] == w->n_out && shp[j][1] == w->n_in && shp[j][2] == a;
        if (seen || n_shp == MAX_SHAPES) continue;
        shp[n_shp][0] = w->n_out, shp[n_shp][1] = w->n_in, shp[n_shp][2] = a;
        wi[n_shp++] = i;
        if ((size_t)w->n_out > y_max) y_max = (size_t)w->n_out;
    }
    if (!n_shp) return 0;
    float *y = nullptr;
    if (cudaMalloc(&y, y_max * (size_t)hi * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        return CM_ENOMEM;
    }
    int rc = cudaMemsetAsync(y, 0, y_max * (size_t)hi * sizeof(float), s) == cudaSuccess ? 0 : CM_ECUDA;
    f8_tune_fill_kernel<<<1024, 256, 0, s>>>((uint8_t *)ws->x_half, 2 * ws->x_cap, ws->x_scale, ws->x_scale_cap);
    if (!rc) rc = f8_launch_ok(__LINE__);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    if (!rc && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)) rc = CM_ECUDA;
    const int8_t fast = kc_plan_get()->fp8_fast_accum ? 1 : 0;
    const int n_wgc = kc_plan_get()->fp8_wg ? kc__gemm_f8_wg_ncfg() : 0;
    int n_timed = 0, n_won = 0, n_wg = 0, n_raw = 0;
    size_t at = 0;
    for (int si = 0; si < n_shp && !rc; si++) {
        const int m = shp[si][0], k = shp[si][1], a = shp[si][2];
        const kc_weight *w = W[wi[si]];
        for (int n = lo; n <= hi && !rc; n *= 2) {
            if ((size_t)n * k > 2 * ws->x_cap) break; // the codes live in x_half's bytes
            if (!f8_scalar_fits(ws, m, n, m, y)) break;
            bool done = false;
            for (int i = 0; i < g_f8t_n && !done; i++)
                done = g_f8t[i].m == m && g_f8t[i].k == k && g_f8t[i].acc == a && g_f8t[i].fast == fast && g_f8t[i].n == n;
            if (done || g_f8t_n == (int)(sizeof g_f8t / sizeof *g_f8t)) continue;
            // candidate 0: outer-vector scales on the heuristic's first (what runs untimed); then
            // unit scales on each of the heuristic's algorithms, followed by the scale pass
            kc_lt_desc dv, du;
            cublasLtMatmulHeuristicResult_t hv[1], hu[MAX_ALGOS];
            const int n_v = dv.make(m, n, k, m, CUDA_R_8F_E4M3, CUDA_R_32F, fast, w->d, ws->x_scale) ? 0 : dv.heuristic(ws, hv, 1);
            const int n_u = du.make(m, n, k, m, CUDA_R_8F_E4M3, CUDA_R_32F, fast) ? 0 : du.heuristic(ws, hu, MAX_ALGOS);
            if (!n_v) continue; // lt_gemm refuses it too
            cublasLtMatmulAlgo_t ca[MAX_CANDS];
            bool outer[MAX_CANDS];
            int nc = 0;
            ca[nc] = hv[0].algo, outer[nc++] = true;
            for (int i = 0; i < n_u; i++)
                if (hu[i].state == CUBLAS_STATUS_SUCCESS) ca[nc] = hu[i].algo, outer[nc++] = false;
            float best[MAX_CANDS];
            for (int c = 0; c < nc; c++) best[c] = 1e30f;
            int last = 0;
            rc = lt_time(nc, best, &last, s, e0, e1, [&](int c) {
                if (outer[c]) return dv.run(ws, &ca[c], w->data, ws->x_half, y, a ? 1.0f : 0.0f, s);
                const cublasStatus_t st = du.run(ws, &ca[c], w->data, ws->x_half, ws->f8_raw, 0.0f, s);
                if (!st) f8_scale(ws->f8_raw, (const float *)w->d, ws->x_scale, y, m, m, n, a, s);
                return st;
            });
            if (rc) break;
            if (best[0] < 0) { // the call that runs untimed fails
                rc = f8_cublas_ok(CUBLAS_STATUS_NOT_SUPPORTED, __LINE__);
                break;
            }
            // the wgmma tiles' configurations, timed the same way (k whole 128-code steps)
            float bwg[F8_WG_MAX];
            const int nw = k % 128 == 0 ? (n_wgc < F8_WG_MAX ? n_wgc : F8_WG_MAX) : 0;
            for (int c = 0; c < nw; c++) bwg[c] = kc__gemm_f8_wg_fast(c) == fast ? 1e30f : -1.0f; // the plan's accumulation only
            if (nw)
                rc = lt_time(nw, bwg, nullptr, s, e0, e1, [&](int c) {
                    return kc__gemm_f8_wg(w, (const uint8_t *)ws->x_half, ws->x_scale, n, y, m, a, c, s) ? CUBLAS_STATUS_NOT_SUPPORTED
                                                                                                          : CUBLAS_STATUS_SUCCESS;
                });
            if (rc) break;
            int win = 0, wwin = -1;
            for (int c = 1; c < nc; c++)
                if (best[c] >= 0 && best[c] < best[win]) win = c;
            for (int c = 0; c < nw; c++)
                if (bwg[c] >= 0 && (wwin < 0 || bwg[c] < bwg[wwin])) wwin = c;
            f8_timed &e = g_f8t[g_f8t_n++];
            e.m = m, e.k = k, e.n = n, e.acc = a, e.fast = fast;
            const int pick = g_f8t_force == 1 ? last : win > 0 && best[win] < 0.97f * best[0] ? win : 0; // past the noise
            e.scalar = !outer[pick];
            if (e.scalar) e.algo = ca[pick];
            // the tiles where they beat cuBLASLt's pick past the noise (or forced)
            e.wg = wwin >= 0 && (g_f8t_force == 2 || (g_f8t_force == 0 && bwg[wwin] < 0.97f * best[pick])) ? wwin : -1;
            // the unit scales' fastest algorithm without its pass (timed alone), where that beats
            // the pick past the noise: a reader that applies the scales itself takes it
            e.raw = false;
            int ub = 0; // the fastest unit-scale candidate (the pass costs each the same)
            for (int c = 1; c < nc; c++)
                if (!outer[c] && best[c] >= 0 && (!ub || best[c] < best[ub])) ub = c;
            if (ub && (g_f8t_force == 0 || g_f8t_force == 3)) {
                float pass = 1e30f;
                rc = lt_time(1, &pass, nullptr, s, e0, e1, [&](int) {
                    f8_scale(ws->f8_raw, (const float *)w->d, ws->x_scale, y, m, m, n, a, s);
                    return cudaPeekAtLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
                });
                if (rc) break;
                const float t_pick = e.wg >= 0 ? bwg[e.wg] : best[pick];
                if (g_f8t_force == 3 || (pass >= 0 && best[ub] - pass < 0.97f * t_pick)) {
                    e.raw = true;
                    e.raw_algo = ca[ub];
                    n_raw++;
                }
            }
            n_timed++;
            if (e.wg >= 0) {
                n_wg++;
                char nm[32];
                if (report && at + 48 < report_len)
                    at += (size_t)snprintf(report + at, report_len - at, "%s%dx%d@%d %s %.1f%%", n_won + n_wg > 1 ? " " : "", m, k, n,
                                           kc__gemm_f8_wg_name(e.wg, nm, sizeof nm), 100.0 * (bwg[e.wg] - best[pick]) / best[pick]);
                e.scalar = false;
            } else if (e.scalar) {
                n_won++;
                if (report && at + 40 < report_len)
                    at += (size_t)snprintf(report + at, report_len - at, "%s%dx%d@%d %.1f%%", n_won + n_wg > 1 ? " " : "", m, k, n,
                                           100.0 * (best[pick] - best[0]) / best[0]);
            }
        }
    }
    if (!rc) rc = f8_launch_ok(__LINE__);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamSynchronize(s);
    cudaFree(y);
    if (report && report_len && !rc) {
        char head[192];
        snprintf(head, sizeof head,
                 "%d of %d shape x count faster with unit scales and a scale pass, %d on the FP8 wgmma tiles, %d unit scales "
                 "for a reader that scales%s",
                 n_won, n_timed, n_wg, n_raw, n_won + n_wg ? ": " : "");
        const size_t hl = strlen(head), bl = strlen(report);
        if (hl + bl < report_len) {
            memmove(report + hl, report, bl + 1);
            memcpy(report, head, hl);
        }
    }
    return rc;
}

// Whether this device has FP8 tensor cores (sm_89 and newer); cached per device.
static bool f8_tensor_cores(void) {
    static signed char cap[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return false;
    }
    if (!cap[dev]) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        cap[dev] = major * 10 + minor >= 89 ? 1 : -1;
    }
    return cap[dev] > 0;
}

extern "C" int kc_fp8_tensor_cores(void) { return f8_tensor_cores(); }

// Whether kc__matmul_f8 multiplies n_tok tokens on cuBLASLt's FP8 GEMM (unless it refuses the
// shape): past the GEMV, k whole 16-byte rows, the codes within x_half's bytes
static bool f8_lt_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return n_tok > KC_GEMV_MAX_TOK && kc_plan_get()->fp8_gemm && ws && ws->cublaslt && ws->x_scale && ws->x_half &&
           n_tok <= ws->x_scale_cap && f8_tensor_cores() && W->n_in % 16 == 0 && (size_t)n_tok * W->n_in <= 2 * ws->x_cap;
}

// x[t][i] = code x scale[t] (exact in f32): a KC_X_F8 image back to rows, for the fallback
__global__ void f8_codes_to_f32_kernel(const uint8_t *q, const float *xs, int n_in, size_t n, float *x) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
        x[i] = __half2float(*(const __half *)&h) * xs[i / (size_t)n_in];
    }
}

extern "C" int kc__matmul_f8(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, int ldy,
                             int accumulate, const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W->data || !W->d || ldy < W->n_out) return CM_EINVAL;
    if (f8_half_x(W, xq, n_tok)) {
        launch_gemv_f8<true, false>(W, xq->xh, n_tok, y, ldy, accumulate, s);
        KC_LAUNCH_CHECK();
    }
    if (n_tok <= KC_GEMV_MAX_TOK) {
        if (!x) return CM_EINVAL;
        if (W->n_in % 16 == 0) launch_gemv_f8<false, false>(W, x, n_tok, y, ldy, accumulate, s);
        else
            gemv_f8_scalar_kernel<<<(W->n_out + F8_WARPS - 1) / F8_WARPS, F8_WARPS * 32, 0, s>>>(
                (const uint8_t *)W->data, (const float *)W->d, x, y, W->n_in, W->n_out, ldy, n_tok, accumulate);
        KC_LAUNCH_CHECK();
    }
    // cuBLASLt FP8: k and the leading dimensions whole 16-byte rows, the codes of x in x_half's
    // bytes (quantized here, or written by x's producer: xq's KC_X_F8 image)
    const bool img = xq && xq->img && xq->img_order == KC_X_F8 && xq->img_tok == n_tok && xq->img_n == W->n_in && xq->img_scale &&
                     n_tok <= xq->img_scale_cap;
    const uint8_t *codes = img ? (const uint8_t *)xq->img : ws ? (const uint8_t *)ws->x_half : nullptr;
    const float *xs = img ? xq->img_scale : ws ? ws->x_scale : nullptr;
    if (f8_lt_use(W, n_tok, ws) && ldy % 4 == 0) {
        if (!img)
            if (int rc = kc_quantize_f8(x, n_tok, W->n_in, (uint8_t *)ws->x_half, ws->x_scale, s)) return rc;
        bool refused = false;
        int rc = lt_gemm(W, codes, xs, n_tok, y, ldy, accumulate, ws, s, &refused);
        if (!refused) return rc;
        if (!g_lt_warned) {
            g_lt_warned = 1;
            CM_LOG_WARN("cuda", "cuBLASLt has no FP8 GEMM with per-row and per-token scales for this shape: FP8 matrices "
                        "are dequantized to F16 for cuBLAS there", "m=%d n=%d k=%d", W->n_out, n_tok, W->n_in);
        }
    }
    if (img) { // x exists only as the image: its codes times their scales, as f32 rows in the scalar path's scratch
        const size_t nx = (size_t)n_tok * W->n_in;
        if (!ws || !ws->f8_raw || nx > ws->f8_raw_cap) {
            cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "an FP8 matmul's activations exist only as codes and cuBLASLt's FP8 GEMM "
                         "cannot take them", "m=%d n=%d k=%d ldy=%d", W->n_out, n_tok, W->n_in, ldy);
            return CM_EUNSUPPORTED;
        }
        f8_codes_to_f32_kernel<<<(unsigned)((nx + 255) / 256 < 4096 ? (nx + 255) / 256 : 4096), 256, 0, s>>>(codes, xs, W->n_in, nx,
                                                                                                            ws->f8_raw);
        if (int rc = f8_launch_ok(__LINE__)) return rc;
        x = ws->f8_raw;
    }
    return gemm_dequant(W, x, n_tok, y, ldy, accumulate, ws, s);
}

extern "C" int kc_matmul_f8_raw(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, const float **xs, int acc,
                                const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W || W->type != DT_F8_E4M3 || !W->data || !W->d || !y || !xs || n_tok <= 0 || W->n_out % 4 || ((uintptr_t)y & 15) ||
        !kc_plan_get()->fp8_lt_tune || !kc_plan_get()->fp8_raw || !f8_lt_use(W, n_tok, ws))
        return 1;
    const int m = W->n_out, k = W->n_in, fast = kc_plan_get()->fp8_fast_accum ? 1 : 0;
    const f8_timed *t = f8_timed_pick(m, k, n_tok, acc ? 1 : 0, fast);
    if (!t || !t->raw) return 1;
    kc_lt_desc d;
    if (d.make(m, n_tok, k, m, CUDA_R_8F_E4M3, CUDA_R_32F, fast) || !d.takes(ws, &t->raw_algo)) return 1;
    // the codes: x's producer's KC_X_F8 image, or quantized here (kc__matmul_f8's choice)
    const bool img = xq && xq->img && xq->img_order == KC_X_F8 && xq->img_tok == n_tok && xq->img_n == k && xq->img_scale &&
                     n_tok <= xq->img_scale_cap;
    const uint8_t *codes = img ? (const uint8_t *)xq->img : (const uint8_t *)ws->x_half;
    *xs = img ? xq->img_scale : ws->x_scale;
    if (!img) {
        if (!x) return CM_EINVAL;
        if (int rc = kc_quantize_f8(x, n_tok, k, (uint8_t *)ws->x_half, ws->x_scale, s)) return rc;
    }
    return f8_cublas_ok(d.run(ws, &t->raw_algo, W->data, codes, y, 0.0f, s), __LINE__);
}

extern "C" int kc__f8_x_order(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return W && W->type == DT_F8_E4M3 && n_tok > KC_GEMV_MAX_TOK && W->n_out % 4 == 0 && f8_lt_use(W, n_tok, ws) ? KC_X_F8 : 0;
}

extern "C" int kc__matmul_f8_glu(const kc_weight *W, const kc_xq *xq, int n_tok, float *out, kc_xq *xq_act, int gelu,
                                 cudaStream_t s) {
    const int n_ff = W->n_out / 2;
    if (W->type != DT_F8_E4M3 || W->n_out % 2 || !f8_half_x(W, xq, n_tok) || !xq_act || !xq_act->no_ints || !xq_act->xh ||
        n_ff % 32 || n_tok > xq_act->cap_tok || n_ff > xq_act->cap_n)
        return 1;
    const f8_swi sw = { out, (__half *)xq_act->xh, n_ff, gelu };
    launch_gemv_f8<true, true>(W, xq->xh, n_tok, nullptr, 0, 0, s, sw);
    xq_act->n = n_ff;
    KC_LAUNCH_CHECK();
}
