// matmul: weight-stationary GEMV for small token counts (every weight type, dequantized in
// registers) and the cuBLAS path for larger ones; plus weight repacking for upload.
#include "kc_common.cuh"

#include <cublas_v2.h>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

// ---- weight layout ---------------------------------------------------------------------------

extern "C" int kc_weight_sizes(int type, int n_in, int n_out, size_t *data_bytes, size_t *d_bytes) {
    size_t n = (size_t)n_in * (size_t)n_out;
    *d_bytes = 0;
    switch (type) {
    case DT_F32: *data_bytes = n * 4; return 0;
    case DT_F16: case DT_BF16: *data_bytes = n * 2; return 0;
    case DT_Q8_0:
        if (n_in % 32) return CM_EINVAL;
        *data_bytes = n;
        *d_bytes = n / 32 * 2;
        return 0;
    case DT_Q4_0:
        if (n_in % 32) return CM_EINVAL;
        *data_bytes = n / 2;
        *d_bytes = n / 32 * 2;
        return 0;
    default: return CM_EUNSUPPORTED;
    }
}

extern "C" int kc_weight_repack(int type, const void *src, int n_in, int n_rows, void *qs_out, kc_half *d_out) {
    size_t n = (size_t)n_in * (size_t)n_rows;
    switch (type) {
    case DT_F32: memcpy(qs_out, src, n * 4); return 0;
    case DT_F16: case DT_BF16: memcpy(qs_out, src, n * 2); return 0;
    case DT_Q8_0: {
        const blk_q8_0 *b = (const blk_q8_0 *)src;
        int8_t *qs = (int8_t *)qs_out;
        for (size_t i = 0; i < n / 32; i++) {
            d_out[i] = b[i].d;
            memcpy(qs + i * 32, b[i].qs, 32);
        }
        return 0;
    }
    case DT_Q4_0: {
        const blk_q4_0 *b = (const blk_q4_0 *)src;
        uint8_t *qs = (uint8_t *)qs_out;
        for (size_t i = 0; i < n / 32; i++) {
            d_out[i] = b[i].d;
            memcpy(qs + i * 16, b[i].qs, 16);
        }
        return 0;
    }
    default: return CM_EUNSUPPORTED;
    }
}

// ---- GEMV --------------------------------------------------------------------------------------
// One warp per output row; each lane reads 16-byte chunks of the row (EPC elements per chunk),
// dequantizes them in registers and multiplies with NT token rows of x. Two chunks are loaded
// before use so that each lane keeps two 16-byte loads in flight.

template <int TYPE> struct wchunk;

template <> struct wchunk<DT_F32> {
    static constexpr int EPC = 4;
    __device__ static void deq(uint4 w, const kc_half *, int, int, float *f) {
        f[0] = __uint_as_float(w.x); f[1] = __uint_as_float(w.y); f[2] = __uint_as_float(w.z); f[3] = __uint_as_float(w.w);
    }
};

template <> struct wchunk<DT_F16> {
    static constexpr int EPC = 8;
    __device__ static void deq(uint4 w, const kc_half *, int, int, float *f) {
        const __half2 *h = (const __half2 *)&w;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 v = __half22float2(h[k]);
            f[2 * k] = v.x;
            f[2 * k + 1] = v.y;
        }
    }
};

template <> struct wchunk<DT_BF16> {
    static constexpr int EPC = 8;
    __device__ static void deq(uint4 w, const kc_half *, int, int, float *f) {
        const uint32_t u[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
        for (int k = 0; k < 4; k++) {
            f[2 * k] = __uint_as_float(u[k] << 16);
            f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        }
    }
};

template <> struct wchunk<DT_Q8_0> {
    static constexpr int EPC = 16;
    // chunk c of the row covers elements [16c, 16c+16) of block c/2
    __device__ static void deq(uint4 w, const kc_half *d, int row_blocks, int c, float *f) {
        float s = kc_h2f(d[c >> 1]);
        const int8_t *q = (const int8_t *)&w;
#pragma unroll
        for (int k = 0; k < 16; k++) f[k] = s * (float)q[k];
    }
};

template <> struct wchunk<DT_Q4_0> {
    static constexpr int EPC = 32;
    // chunk c is block c: byte j holds element j (low nibble) and j + 16 (high nibble)
    __device__ static void deq(uint4 w, const kc_half *d, int row_blocks, int c, float *f) {
        float s = kc_h2f(d[c]);
        const uint8_t *q = (const uint8_t *)&w;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            f[k] = s * (float)((int)(q[k] & 15) - 8);
            f[k + 16] = s * (float)((int)(q[k] >> 4) - 8);
        }
    }
};

template <int EPC>
__device__ __forceinline__ void load_x(const float *x, float *xf) {
    const float4 *p = (const float4 *)x;
#pragma unroll
    for (int k = 0; k < EPC / 4; k++) {
        float4 v = __ldg(p + k);
        xf[4 * k] = v.x; xf[4 * k + 1] = v.y; xf[4 * k + 2] = v.z; xf[4 * k + 3] = v.w;
    }
}

#define GEMV_WARPS 4

template <int TYPE, int NT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ d, const float *__restrict__ x,
            float *__restrict__ y, int n_in, int n_out, int accumulate) {
    typedef wchunk<TYPE> C;
    constexpr int EPC = C::EPC;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;
    const int nchunks = n_in / EPC;
    const size_t row_bytes = (size_t)nchunks * 16;
    const uint4 *wrow = (const uint4 *)(W + (size_t)row * row_bytes);
    const int row_scales = n_in / 32;
    const kc_half *drow = d ? d + (size_t)row * row_scales : nullptr;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;

    int c = lane;
    for (; c + 32 < nchunks; c += 64) {
        uint4 w0 = __ldg(wrow + c), w1 = __ldg(wrow + c + 32);
        float f[EPC];
        C::deq(w0, drow, row_scales, c, f);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float xf[EPC];
            load_x<EPC>(x + (size_t)t * n_in + (size_t)c * EPC, xf);
#pragma unroll
            for (int k = 0; k < EPC; k++) acc[t] = fmaf(f[k], xf[k], acc[t]);
        }
        C::deq(w1, drow, row_scales, c + 32, f);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float xf[EPC];
            load_x<EPC>(x + (size_t)t * n_in + (size_t)(c + 32) * EPC, xf);
#pragma unroll
            for (int k = 0; k < EPC; k++) acc[t] = fmaf(f[k], xf[k], acc[t]);
        }
    }
    if (c < nchunks) {
        uint4 w0 = __ldg(wrow + c);
        float f[EPC];
        C::deq(w0, drow, row_scales, c, f);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float xf[EPC];
            load_x<EPC>(x + (size_t)t * n_in + (size_t)c * EPC, xf);
#pragma unroll
            for (int k = 0; k < EPC; k++) acc[t] = fmaf(f[k], xf[k], acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = kc_warp_sum(acc[t]);
        if (lane == 0) {
            float *dst = y + (size_t)t * n_out + row;
            *dst = accumulate ? *dst + v : v;
        }
    }
}

// Rows whose length is not a multiple of the vector width (tiny models): one element at a time.
__global__ void gemv_scalar_kernel(const void *W, int type, const float *x, float *y, int n_in, int n_out,
                                   int n_tok, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;
    for (int t = 0; t < n_tok; t++) {
        float acc = 0.0f;
        for (int i = lane; i < n_in; i += 32) {
            size_t k = (size_t)row * n_in + i;
            float w = type == DT_F32 ? ((const float *)W)[k]
                    : type == DT_F16 ? kc_h2f(((const uint16_t *)W)[k]) : kc_bf2f(((const uint16_t *)W)[k]);
            acc = fmaf(w, x[(size_t)t * n_in + i], acc);
        }
        acc = kc_warp_sum(acc);
        if (lane == 0) {
            float *dst = y + (size_t)t * n_out + row;
            *dst = accumulate ? *dst + acc : acc;
        }
    }
}

template <int TYPE>
static void launch_gemv(const kc_weight *W, const float *x, int n_tok, float *y, int acc, cudaStream_t s) {
    dim3 grid((W->n_out + GEMV_WARPS - 1) / GEMV_WARPS), block(GEMV_WARPS * 32);
    const uint8_t *w = (const uint8_t *)W->data;
    switch (n_tok) {
#define CASE(N) case N: gemv_kernel<TYPE, N><<<grid, block, 0, s>>>(w, W->d, x, y, W->n_in, W->n_out, acc); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

// ---- dequantize to half (for the cuBLAS path) ---------------------------------------------------

__global__ void dequant_half_kernel(const uint8_t *qs, const kc_half *d, int type, size_t n, __half *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float s = kc_h2f(d[i / 32]), v;
        if (type == DT_Q8_0) v = s * (float)((const int8_t *)qs)[i];
        else {
            size_t blk = i / 32, j = i % 32;
            uint8_t b = qs[blk * 16 + (j & 15)];
            v = s * (float)((int)(j < 16 ? (b & 15) : (b >> 4)) - 8);
        }
        out[i] = __float2half(v);
    }
}

__global__ void to_half_kernel(const float *x, size_t n, __half *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = __float2half(x[i]);
}

__global__ void bf16_to_half_kernel(const uint16_t *x, size_t n, __half *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = __float2half(kc_bf2f(x[i]));
}

static int cublas_ok(cublasStatus_t st, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "cublas call failed", "status=%d file=%s line=%d", (int)st, __FILE__, line);
    return CM_ECUDA;
}

extern "C" int kc_matmul(const kc_weight *W, const float *x, int n_tok, float *y, int accumulate,
                         const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W || !x || !y || n_tok <= 0) return CM_EINVAL;
    if (n_tok <= KC_GEMV_MAX_TOK) {
        int vec = W->type == DT_F32 ? 4 : W->type == DT_Q8_0 || W->type == DT_Q4_0 ? 32 : 8;
        if (W->n_in % vec) {
            if (W->type != DT_F32 && W->type != DT_F16 && W->type != DT_BF16) return CM_EINVAL;
            dim3 grid((W->n_out + GEMV_WARPS - 1) / GEMV_WARPS), block(GEMV_WARPS * 32);
            gemv_scalar_kernel<<<grid, block, 0, s>>>(W->data, W->type, x, y, W->n_in, W->n_out, n_tok, accumulate);
            KC_LAUNCH_CHECK();
        }
        switch (W->type) {
        case DT_F32: launch_gemv<DT_F32>(W, x, n_tok, y, accumulate, s); break;
        case DT_F16: launch_gemv<DT_F16>(W, x, n_tok, y, accumulate, s); break;
        case DT_BF16: launch_gemv<DT_BF16>(W, x, n_tok, y, accumulate, s); break;
        case DT_Q8_0: launch_gemv<DT_Q8_0>(W, x, n_tok, y, accumulate, s); break;
        case DT_Q4_0: launch_gemv<DT_Q4_0>(W, x, n_tok, y, accumulate, s); break;
        default: return CM_EUNSUPPORTED;
        }
        KC_LAUNCH_CHECK();
    }
    if (!ws || !ws->cublas) return CM_EINVAL;
    cublasHandle_t h = (cublasHandle_t)ws->cublas;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (W->type == DT_F32)
        return cublas_ok(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, W->n_out, n_tok, W->n_in, &one, (const float *)W->data,
                                     W->n_in, x, W->n_in, &beta, y, W->n_out), __LINE__);
    size_t nx = (size_t)n_tok * W->n_in, nw = (size_t)W->n_in * W->n_out;
    if (nx > ws->x_cap) return CM_EINVAL;
    to_half_kernel<<<(unsigned)((nx + 255) / 256 < 4096 ? (nx + 255) / 256 : 4096), 256, 0, s>>>(x, nx, (__half *)ws->x_half);
    const void *wp = W->data;
    if (W->type != DT_F16) {
        if (nw > ws->w_cap) return CM_EINVAL;
        if (W->type == DT_BF16)
            bf16_to_half_kernel<<<4096, 256, 0, s>>>((const uint16_t *)W->data, nw, (__half *)ws->w_half);
        else
            dequant_half_kernel<<<4096, 256, 0, s>>>((const uint8_t *)W->data, W->d, W->type, nw, (__half *)ws->w_half);
        wp = ws->w_half;
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel launch failed", "err=\"%s\" file=%s line=%d", cudaGetErrorString(e), __FILE__, __LINE__);
        return CM_ECUDA;
    }
    return cublas_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, W->n_out, n_tok, W->n_in, &one, wp, CUDA_R_16F, W->n_in,
                                  ws->x_half, CUDA_R_16F, W->n_in, &beta, y, CUDA_R_32F, W->n_out, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     __LINE__);
}
