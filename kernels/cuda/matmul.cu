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

// ---- GEMV ----------------------------------------------------------------------------------
// Each warp owns R consecutive output rows; each lane walks 16-byte chunks of those rows (EPC
// elements per chunk), loads the matching activations once for all R rows, and accumulates in
// f32. Integer weights become floats with the exponent trick (PRMT + FADD) rather than I2F,
// which runs at 1/8 of the FMA rate on Hopper. F16 rows multiply in half2 within a chunk and
// add the chunk's partial to the f32 accumulator. For every (token, row) the summation order
// is fixed by the row length alone, so results do not depend on how many tokens share a call.

// float(b) for a byte b of u placed in the low mantissa of 2^23: (2^23 + b) - 2^23 - bias
__device__ __forceinline__ float byte_f(uint32_t u, int k, float bias) {
    return __int_as_float(__byte_perm(u, 0x4B000000u, 0x7540u + k)) - (8388608.0f + bias);
}

template <int TYPE> struct wchunk;

template <> struct wchunk<DT_F32> {
    static constexpr int EPC = 4;
    template <int NT> __device__ static void dot(uint4 w, const kc_half *, int, const float (*x)[4], float *acc) {
        const float f[4] = { __uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z), __uint_as_float(w.w) };
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[t] = fmaf(f[k], x[t][k], acc[t]);
    }
};

template <> struct wchunk<DT_BF16> {
    static constexpr int EPC = 8;
    template <int NT> __device__ static void dot(uint4 w, const kc_half *, int, const float (*x)[8], float *acc) {
        const uint32_t u[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                acc[t] = fmaf(__uint_as_float(u[k] << 16), x[t][2 * k], acc[t]);
                acc[t] = fmaf(__uint_as_float(u[k] & 0xffff0000u), x[t][2 * k + 1], acc[t]);
            }
    }
};

template <> struct wchunk<DT_F16> {
    static constexpr int EPC = 8;
    template <int NT> __device__ static void dot(uint4 w, const kc_half *, int, const float (*x)[8], float *acc) {
        const __half2 *h = (const __half2 *)&w;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            __half2 p = __hmul2(h[0], __floats2half2_rn(x[t][0], x[t][1]));
            p = __hfma2(h[1], __floats2half2_rn(x[t][2], x[t][3]), p);
            p = __hfma2(h[2], __floats2half2_rn(x[t][4], x[t][5]), p);
            p = __hfma2(h[3], __floats2half2_rn(x[t][6], x[t][7]), p);
            float2 f = __half22float2(p);
            acc[t] += f.x + f.y;
        }
    }
};

template <> struct wchunk<DT_Q8_0> {
    static constexpr int EPC = 16;
    // chunk c covers elements [16c, 16c+16) of block c/2
    template <int NT> __device__ static void dot(uint4 w, const kc_half *d, int c, const float (*x)[16], float *acc) {
        const uint32_t u[4] = { w.x ^ 0x80808080u, w.y ^ 0x80808080u, w.z ^ 0x80808080u, w.w ^ 0x80808080u };
        float f[16];
#pragma unroll
        for (int k = 0; k < 16; k++) f[k] = byte_f(u[k >> 2], k & 3, 128.0f);
        const float s = kc_h2f(d[c >> 1]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float p = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; k++) p = fmaf(f[k], x[t][k], p);
            acc[t] = fmaf(s, p, acc[t]);
        }
    }
};

template <> struct wchunk<DT_Q4_0> {
    static constexpr int EPC = 32;
    // chunk c is block c: byte j holds element j (low nibble) and j + 16 (high nibble)
    template <int NT> __device__ static void dot(uint4 w, const kc_half *d, int c, const float (*x)[32], float *acc) {
        const uint32_t u[4] = { w.x, w.y, w.z, w.w };
        float f[32];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            uint32_t lo = u[k >> 2] & 0x0F0F0F0Fu, hi = (u[k >> 2] >> 4) & 0x0F0F0F0Fu;
            f[k] = byte_f(lo, k & 3, 8.0f);
            f[k + 16] = byte_f(hi, k & 3, 8.0f);
        }
        const float s = kc_h2f(d[c]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float p = 0.0f;
#pragma unroll
            for (int k = 0; k < 32; k++) p = fmaf(f[k], x[t][k], p);
            acc[t] = fmaf(s, p, acc[t]);
        }
    }
};

#define GEMV_WARPS 4

// One chunk of R rows: loads the NT tokens' activations for chunk c once and accumulates.
template <int TYPE, int NT, int R>
__device__ __forceinline__ void gemv_step(const uint4 *w, const float *__restrict__ x, int n_in, int c,
                                          const kc_half *__restrict__ d, int row0, int n_out, int row_scales,
                                          float (*acc)[NT]) {
    typedef wchunk<TYPE> C;
    constexpr int EPC = C::EPC;
    float xs[NT][EPC];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *p = (const float4 *)(x + (size_t)t * n_in + (size_t)c * EPC);
#pragma unroll
        for (int k = 0; k < EPC / 4; k++) {
            float4 v = __ldg(p + k);
            xs[t][4 * k] = v.x; xs[t][4 * k + 1] = v.y; xs[t][4 * k + 2] = v.z; xs[t][4 * k + 3] = v.w;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const kc_half *dr = d ? d + (size_t)min(row0 + r, n_out - 1) * row_scales : nullptr;
        C::template dot<NT>(w[r], dr, c, xs, acc[r]);
    }
}

template <int TYPE, int NT, int R, int U>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ d, const float *__restrict__ x,
            float *__restrict__ y, int n_in, int n_out, int accumulate) {
    typedef wchunk<TYPE> C;
    constexpr int EPC = C::EPC;
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) return;
    const int nchunks = n_in / EPC;
    const size_t row_bytes = (size_t)nchunks * 16;
    const int row_scales = n_in / 32;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    const uint4 *wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) wrow[r] = (const uint4 *)(W + (size_t)min(row0 + r, n_out - 1) * row_bytes);

    // U chunks per row in flight before any arithmetic; the order in which chunks are added to
    // a row's accumulator is the same whatever R, U and NT are (c ascending per lane).
    int c = lane;
    for (; c + 32 * (U - 1) < nchunks; c += 32 * U) {
        uint4 w[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) w[u][r] = __ldg(wrow[r] + c + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) gemv_step<TYPE, NT, R>(w[u], x, n_in, c + 32 * u, d, row0, n_out, row_scales, acc);
    }
    for (; c < nchunks; c += 32) {
        uint4 w0[R];
#pragma unroll
        for (int r = 0; r < R; r++) w0[r] = __ldg(wrow[r] + c);
        gemv_step<TYPE, NT, R>(w0, x, n_in, c, d, row0, n_out, row_scales, acc);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = kc_warp_sum(acc[r][t]);
            if (lane == 0 && row0 + r < n_out) {
                float *dst = y + (size_t)t * n_out + row0 + r;
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

// Rows per warp: more rows share each activation load; fewer keep more warps in flight.
template <int TYPE, int NT, int R, int U>
static void launch_gemv_r(const kc_weight *W, const float *x, float *y, int acc, cudaStream_t s) {
    const int rows_per_block = GEMV_WARPS * R;
    dim3 grid((W->n_out + rows_per_block - 1) / rows_per_block), block(GEMV_WARPS * 32);
    gemv_kernel<TYPE, NT, R, U><<<grid, block, 0, s>>>((const uint8_t *)W->data, W->d, x, y, W->n_in, W->n_out, acc);
}

// Bytes in flight per SM grow with n_out x U (not with R), so narrow matrices get U = 4.
template <int TYPE>
static void launch_gemv(const kc_weight *W, const float *x, int n_tok, float *y, int acc, cudaStream_t s) {
    constexpr int R1 = TYPE == DT_Q4_0 ? 4 : 2;
    const bool narrow = W->n_out <= 8192;
    switch (n_tok) {
    case 1:
        if (narrow) launch_gemv_r<TYPE, 1, R1, 4>(W, x, y, acc, s);
        else launch_gemv_r<TYPE, 1, R1, 2>(W, x, y, acc, s);
        break;
    case 2: launch_gemv_r<TYPE, 2, 2, 2>(W, x, y, acc, s); break;
    case 3: launch_gemv_r<TYPE, 3, 2, 2>(W, x, y, acc, s); break;
    case 4: launch_gemv_r<TYPE, 4, 2, 2>(W, x, y, acc, s); break;
    case 5: launch_gemv_r<TYPE, 5, 1, 2>(W, x, y, acc, s); break;
    case 6: launch_gemv_r<TYPE, 6, 1, 2>(W, x, y, acc, s); break;
    case 7: launch_gemv_r<TYPE, 7, 1, 2>(W, x, y, acc, s); break;
    case 8: launch_gemv_r<TYPE, 8, 1, 2>(W, x, y, acc, s); break;
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
