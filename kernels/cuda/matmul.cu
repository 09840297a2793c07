// matmul: weight-stationary GEMV for small token counts (every weight type, dequantized in
// registers) and the cuBLAS path for larger ones; plus weight repacking for upload.
#include "kc_common.cuh"

#include <cublas_v2.h>
#include <type_traits>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

KC_TRACE_TU(matmul)

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
    case DT_Q4_K:
        if (n_in % 256) return CM_EINVAL;
        *data_bytes = n / 2;
        *d_bytes = n / 256 * 16;
        return 0;
    default: return CM_EUNSUPPORTED;
    }
}

extern "C" int kc_weight_type_ok(int type) {
    return type == DT_F32 || type == DT_F16 || type == DT_BF16 || type == DT_Q8_0 || type == DT_Q4_0 || type == DT_Q4_K;
}

// PDL needs the kernels' griddepcontrol instructions, which exist only in code built for
// sm_90 or newer: code JIT-compiled from older PTX would start early and never wait.
__global__ void pdl_probe_kernel() { kc_pdl_wait(); }
static int pdl_capable(void) {
    static int v = -1;
    cudaFuncAttributes a;
    if (v < 0) v = cudaFuncGetAttributes(&a, pdl_probe_kernel) == cudaSuccess && a.ptxVersion >= 90 && a.binaryVersion >= 90;
    return v;
}
extern "C" int kc_code_for_device(int *arch) {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, pdl_probe_kernel);
    *arch = e == cudaSuccess ? a.binaryVersion : 0;
    if (e != cudaSuccess) cudaGetLastError(); /* clear it: the caller reports */
    return e == cudaSuccess;
}
extern "C" int kc_pdl_on(void) { return kc_plan_get()->pdl && pdl_capable(); }

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
    case DT_Q4_K: {
        const blk_q4_K *b = (const blk_q4_K *)src;
        uint8_t *qs = (uint8_t *)qs_out, *head = (uint8_t *)d_out;
        for (size_t i = 0; i < n / 256; i++) {
            memcpy(head + i * 16, &b[i].d, 2);
            memcpy(head + i * 16 + 2, &b[i].dmin, 2);
            memcpy(head + i * 16 + 4, b[i].scales, 12);
            memcpy(qs + i * 128, b[i].qs, 128);
        }
        return 0;
    }
    default: return CM_EUNSUPPORTED;
    }
}

// ---- GEMV (F32, F16, BF16 weights) ---------------------------------------------------------
// Each warp owns R consecutive output rows; each lane walks 16-byte chunks of those rows (EPC
// elements per chunk), loads the matching activations once for all R rows, and accumulates in
// f32. F16 rows multiply in half2 within a chunk and add the chunk's partial to the f32
// accumulator. For every (token, row) the summation order is fixed by the row length alone, so
// results do not depend on how many tokens share a call. (Quantized weights: the integer GEMV
// below.)

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
    // activations already half (the producer's copy, kc_xq.xh, or converted just before)
    template <int NT> __device__ static void dot_h(uint4 w, const __half2 (*x)[4], float *acc) {
        const __half2 *h = (const __half2 *)&w;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            __half2 p = __hmul2(h[0], x[t][0]);
            p = __hfma2(h[1], x[t][1], p);
            p = __hfma2(h[2], x[t][2], p);
            p = __hfma2(h[3], x[t][3], p);
            float2 f = __half22float2(p);
            acc[t] += f.x + f.y;
        }
    }
    template <int NT> __device__ static void dot(uint4 w, const kc_half *, int, const float (*x)[8], float *acc) {
        __half2 xh[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int k = 0; k < 4; k++) xh[t][k] = __floats2half2_rn(x[t][2 * k], x[t][2 * k + 1]);
        dot_h<NT>(w, xh, acc);
    }
};

#define GEMV_WARPS 4

// When accumulating (the residual), lane 0 loads what y holds right after the programmatic
// wait, so the add at the end does not wait for a memory round trip on the kernel's tail.
template <int R, int NT>
__device__ __forceinline__ void gemv_load_residual(float (*res)[NT], const float *y, int row0, int n_out, int lane,
                                                   int accumulate) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            res[r][t] = accumulate && lane == 0 && row0 + r < n_out ? y[(size_t)t * n_out + row0 + r] : 0.0f;
}

// The warp's R x NT sums to y (lane 0), added to the residual loaded before when accumulating.
template <int R, int NT>
__device__ __forceinline__ void gemv_store(float (*acc)[NT], const float (*res)[NT], float *y, int row0, int n_out, int lane,
                                           int accumulate) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = kc_warp_sum(acc[r][t]);
            if (lane == 0 && row0 + r < n_out) {
                float *dst = y + (size_t)t * n_out + row0 + r;
                *dst = accumulate ? res[r][t] + v : v;
            }
        }
}

// SwiGLU fused into the F16 gate|up GEMV (kc_matmul_swiglu): rows interleave gate and up, so
// rows (row0 + r, row0 + r + 1) of a warp (R even, row0 even) are gate j and up j.
struct gemv_swi {
    float *out;  // [NT][n_ff] f32, or NULL
    __half *xh;  // [NT][n_ff] half
    int n_ff;
};
template <int R, int NT>
__device__ __forceinline__ void gemv_store_swiglu(float (*acc)[NT], const gemv_swi &sw, int row0, int lane) {
#pragma unroll
    for (int r = 0; r + 1 < R; r += 2)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float g = kc_warp_sum(acc[r][t]), u = kc_warp_sum(acc[r + 1][t]);
            const int j = (row0 + r) / 2;
            if (lane == 0 && j < sw.n_ff) {
                const float v = kc_silu_mul(g, u);
                const size_t e = (size_t)t * sw.n_ff + j;
                if (sw.out) sw.out[e] = v;
                sw.xh[e] = __float2half_rn(v);
            }
        }
}

// One chunk of R rows: loads the NT tokens' activations for chunk c once and accumulates.
// XH (F16 weights only): x is the producer's half copy of the activations (kc_xq.xh), the
// same values the f32 path rounds to half per chunk, so the sums are bitwise the same and no
// warp converts them again.
template <int TYPE, int NT, int R, bool XH>
__device__ __forceinline__ void gemv_step(const uint4 *w, const void *xv, int n_in, int c,
                                          const kc_half *__restrict__ d, int row0, int n_out, int row_scales,
                                          float (*acc)[NT]) {
    typedef wchunk<TYPE> C;
    constexpr int EPC = C::EPC;
    if constexpr (XH) {
        static_assert(TYPE == DT_F16, "half activations are for F16 weights");
        __half2 xs[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            uint4 v = __ldca((const uint4 *)((const __half *)xv + (size_t)t * n_in + (size_t)c * 8));
            memcpy(xs[t], &v, 16);
        }
#pragma unroll
        for (int r = 0; r < R; r++) C::template dot_h<NT>(w[r], xs, acc[r]);
        return;
    }
    const float *x = (const float *)xv;
    float xs[NT][EPC];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *p = (const float4 *)(x + (size_t)t * n_in + (size_t)c * EPC);
#pragma unroll
        for (int k = 0; k < EPC / 4; k++) {
            float4 v = __ldca(p + k); // written by the previous kernel: not the read-only path
            xs[t][4 * k] = v.x; xs[t][4 * k + 1] = v.y; xs[t][4 * k + 2] = v.z; xs[t][4 * k + 3] = v.w;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const kc_half *dr = d ? d + (size_t)min(row0 + r, n_out - 1) * row_scales : nullptr;
        C::template dot<NT>(w[r], dr, c, xs, acc[r]);
    }
}

template <int TYPE, int NT, int R, int U, bool XH, bool SWI = false>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ d, const void *x, float *y, int n_in, int n_out,
            int accumulate, gemv_swi sw) {
    KC_TRACE_SCOPE(KC_TR_GEMV);
    static_assert(!SWI || (R % 2 == 0 && TYPE == DT_F16), "SwiGLU needs gate and up rows in one warp");
    typedef wchunk<TYPE> C;
    constexpr int EPC = C::EPC;
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) {
        kc_pdl_wait();
        return;
    }
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

    // Two batches of U chunks per row are in flight: both are loaded before waiting for the
    // activations (programmatic launch: they stream while the previous kernel finishes), and
    // each iteration multiplies one batch while the next is arriving, then issues the one
    // after. The order in which chunks are added to a row's accumulator is the same whatever
    // R, U and NT are (c ascending per lane).
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
    float res[R][NT];
    gemv_load_residual<R, NT>(res, y, row0, n_out, lane, accumulate);
    for (; c + 32 * (U - 1) < nchunks; c += 32 * U) {
#pragma unroll
        for (int u = 0; u < U; u++) gemv_step<TYPE, NT, R, XH>(w[u], x, n_in, c + 32 * u, d, row0, n_out, row_scales, acc);
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
        if (c + 32 * u < nchunks) gemv_step<TYPE, NT, R, XH>(w[u], x, n_in, c + 32 * u, d, row0, n_out, row_scales, acc);
    if constexpr (SWI) gemv_store_swiglu<R, NT>(acc, sw, row0, lane);
    else gemv_store<R, NT>(acc, res, y, row0, n_out, lane, accumulate);
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
// sw (F16 gate|up only): SwiGLU fused when R is even; false, nothing launched, when it cannot be.
template <int TYPE, int NT, int R, int U, bool XH>
static bool launch_gemv_r(const kc_weight *W, const void *x, float *y, int acc, cudaStream_t s, const gemv_swi *sw) {
    const int rows_per_block = GEMV_WARPS * R;
    dim3 grid((W->n_out + rows_per_block - 1) / rows_per_block), block(GEMV_WARPS * 32);
    if (sw) {
        if constexpr (TYPE == DT_F16 && R % 2 == 0) {
            kc_launch(gemv_kernel<TYPE, NT, R, U, XH, true>, grid, block, 0, s, (const uint8_t *)W->data, (const kc_half *)W->d,
                      x, y, W->n_in, W->n_out, acc, *sw);
            return true;
        }
        return false;
    }
    kc_launch(gemv_kernel<TYPE, NT, R, U, XH>, grid, block, 0, s, (const uint8_t *)W->data, (const kc_half *)W->d, x, y,
              W->n_in, W->n_out, acc, gemv_swi{});
    return true;
}

// Bytes in flight per SM grow with n_out x U (not with R), so narrow matrices get U = 4.
// sw: see launch_gemv_r (returns whether the kernel was launched).
template <int TYPE, bool XH = false>
static bool launch_gemv(const kc_weight *W, const void *x, int n_tok, float *y, int acc, cudaStream_t s,
                        const gemv_swi *sw = nullptr) {
    switch (n_tok) {
    case 1:
        // 2 rows per warp, 4 batches of chunks in flight for every shape (F16: the wide matrices
        // 2-3 % faster too; whole F16 step 196.2 -> 197.0 tok/s, same run; bench/RESULTS.md
        // "2026-11-24 (gemmq)"); F32 / BF16 (rare: norms, small models) the same way
        return launch_gemv_r<TYPE, 1, 2, 4, XH>(W, x, y, acc, s, sw);
    case 2: return launch_gemv_r<TYPE, 2, 2, 2, XH>(W, x, y, acc, s, sw);
    case 3: return launch_gemv_r<TYPE, 3, 2, 2, XH>(W, x, y, acc, s, sw);
    case 4: return launch_gemv_r<TYPE, 4, 2, 2, XH>(W, x, y, acc, s, sw);
    case 5: return launch_gemv_r<TYPE, 5, 1, 2, XH>(W, x, y, acc, s, sw);
    case 6: return launch_gemv_r<TYPE, 6, 1, 2, XH>(W, x, y, acc, s, sw);
    case 7: return launch_gemv_r<TYPE, 7, 1, 2, XH>(W, x, y, acc, s, sw);
    case 8: return launch_gemv_r<TYPE, 8, 1, 2, XH>(W, x, y, acc, s, sw);
    }
    return false;
}

// ---- integer GEMV: quantized weights against two-level int8 activations (kc_xq) -------------
// A lane's unit of work is a chunk of EPC elements: one Q8_0 / Q4_0 block, or two Q4_K
// sub-blocks (a quarter super-block), NV 16-byte weight loads. Per block of 32 the dot
// product is exact in int32, I = 256 sum(w qh) + sum(w ql) (dp4a), and becomes a float once:
// d_w (d_x / 256) I for Q8_0, with I - 8 S for Q4_0's offset nibbles, d sc I - dmin m S per
// Q4_K sub-block. About a fifth of the instructions of the f32 path per weight, so these
// kernels stay bound by memory. The summation order of a (token, row) is fixed by the row
// length alone, as in the f32 GEMV.

template <int TYPE> struct qchunk;

template <> struct qchunk<DT_Q8_0> {
    static constexpr int EPC = 32, NV = 2;
    typedef uint32_t scale_t; // the block's half d
    __device__ static scale_t load_scale(const uint8_t *sc, size_t row, int nchunks, int c) {
        return __ldg((const uint16_t *)sc + row * nchunks + c);
    }
    __device__ static float dot(const uint4 *w, scale_t sc, const int *xh, const int *xl, const int2 *xm) {
        const int *wi = (const int *)w;
        int ih = 0, il = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            ih = __dp4a(wi[k], xh[k], ih);
            il = __dp4a(wi[k], xl[k], il);
        }
        return kc_h2f((uint16_t)sc) * __int_as_float(xm[0].x) * (float)(ih * 256 + il);
    }
};

template <> struct qchunk<DT_Q4_0> {
    static constexpr int EPC = 32, NV = 1;
    typedef uint32_t scale_t;
    __device__ static scale_t load_scale(const uint8_t *sc, size_t row, int nchunks, int c) {
        return __ldg((const uint16_t *)sc + row * nchunks + c);
    }
    // byte j of the block holds element j (low nibble) and j + 16 (high nibble)
    __device__ static float dot(const uint4 *w, scale_t sc, const int *xh, const int *xl, const int2 *xm) {
        const uint32_t u[4] = { w[0].x, w[0].y, w[0].z, w[0].w };
        int ih = 0, il = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int lo = (int)(u[k] & 0x0F0F0F0Fu), hi = (int)((u[k] >> 4) & 0x0F0F0F0Fu);
            ih = __dp4a(lo, xh[k], ih);
            ih = __dp4a(hi, xh[k + 4], ih);
            il = __dp4a(lo, xl[k], il);
            il = __dp4a(hi, xl[k + 4], il);
        }
        return kc_h2f((uint16_t)sc) * __int_as_float(xm[0].x) * (float)(ih * 256 + il - 8 * xm[0].y);
    }
};

template <> struct qchunk<DT_Q4_K> {
    static constexpr int EPC = 64, NV = 2;
    typedef uint4 scale_t; // the super-block's head: d | dmin << 16, then the 12 scale bytes
    __device__ static scale_t load_scale(const uint8_t *sc, size_t row, int nchunks, int c) {
        return __ldg((const uint4 *)sc + row * (nchunks / 4) + c / 4);
    }
    // chunk c is quarter j = c % 4 of its super-block: 32 bytes whose low nibbles are sub-block
    // 2j (elements in order) and high nibbles sub-block 2j + 1
    __device__ static float dot_c(const uint4 *w, const uint4 &h, int c, const int *xh, const int *xl, const int2 *xm) {
        const uint32_t *u = (const uint32_t *)w;
        int ha = 0, la = 0, hb = 0, lb = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int lo = (int)(u[k] & 0x0F0F0F0Fu), hi = (int)((u[k] >> 4) & 0x0F0F0F0Fu);
            ha = __dp4a(lo, xh[k], ha);
            la = __dp4a(lo, xl[k], la);
            hb = __dp4a(hi, xh[k + 8], hb);
            lb = __dp4a(hi, xl[k + 8], lb);
        }
        const int j = c & 3;
        float sa, ma, sb, mb;
        kc_q4k_scale_min(h, 2 * j, sa, ma);
        kc_q4k_scale_min(h, 2 * j + 1, sb, mb);
        const float d = kc_h2f((uint16_t)(h.x & 0xFFFF)), dmin = kc_h2f((uint16_t)(h.x >> 16));
        const float ra = d * sa * (float)(ha * 256 + la) - dmin * ma * (float)xm[0].y;
        const float rb = d * sb * (float)(hb * 256 + lb) - dmin * mb * (float)xm[1].y;
        return __int_as_float(xm[0].x) * ra + __int_as_float(xm[1].x) * rb;
    }
};

template <int TYPE> __device__ __forceinline__ float qdot(const uint4 *w, const typename qchunk<TYPE>::scale_t &sc, int c,
                                                         const int *xh, const int *xl, const int2 *xm) {
    if constexpr (TYPE == DT_Q4_K) return qchunk<TYPE>::dot_c(w, sc, c, xh, xl, xm);
    else return qchunk<TYPE>::dot(w, sc, xh, xl, xm);
}

template <int TYPE, int NT, int R, int U>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemvq_kernel(const uint8_t *__restrict__ W, const uint8_t *__restrict__ sc, const int8_t *xqh, const int8_t *xql,
             const int2 *xm, float *y, int n_in, int n_out, int accumulate) {
    KC_TRACE_SCOPE(KC_TR_GEMVQ);
    typedef qchunk<TYPE> C;
    constexpr int EPC = C::EPC, NV = C::NV;
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) {
        kc_pdl_wait();
        return;
    }
    const int nchunks = n_in / EPC, nblk = n_in / 32;
    size_t rows[R];
    const uint4 *wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rows[r] = (size_t)min(row0 + r, n_out - 1);
        wrow[r] = (const uint4 *)(W + rows[r] * (size_t)nchunks * NV * 16);
    }
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    uint4 w[U][R][NV], wn[U][R][NV];
    typename C::scale_t s[U][R], sn[U][R];
    // loads the batch of U chunks from c0 (each lane's chunks c0 + 32 u) into bw / bs
    auto load = [&](int c0, uint4 (&bw)[U][R][NV], typename C::scale_t (&bs)[U][R]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = c0 + 32 * u;
            if (cc < nchunks)
#pragma unroll
                for (int r = 0; r < R; r++) {
#pragma unroll
                    for (int v = 0; v < NV; v++) bw[u][r][v] = __ldg(wrow[r] + (size_t)cc * NV + v);
                    bs[u][r] = C::load_scale(sc, rows[r], nchunks, cc);
                }
        }
    };
    // The first batch of U chunks of every row is loaded before waiting for the activations:
    // with programmatic launch it streams while the previous kernel finishes. Then each
    // iteration multiplies one batch while the next is in flight. One batch before the wait is
    // the fastest on an H100 (llama2-7b batch 1, none / two: Q4_0 -5 % / -3 %, Q8_0 -4 % / -6 %,
    // Q4_K -7 % / -13 %; bench/RESULTS.md): more loads then slow the kernels before this one.
    int c = lane;
    load(c, w, s);
    kc_pdl_wait();
    float res[R][NT];
    gemv_load_residual<R, NT>(res, y, row0, n_out, lane, accumulate);
    for (;;) {
        load(c + 32 * U, wn, sn); // the next batch, in flight while this one is multiplied
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = c + 32 * u;
            if (cc >= nchunks) break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int xh[EPC / 4], xl[EPC / 4];
                int2 xb[EPC / 32];
                const int4 *ph = (const int4 *)(xqh + (size_t)t * n_in + (size_t)cc * EPC);
                const int4 *pl = (const int4 *)(xql + (size_t)t * n_in + (size_t)cc * EPC);
#pragma unroll
                for (int k = 0; k < EPC / 16; k++) {
                    int4 a = __ldca(ph + k), b = __ldca(pl + k); // activations: not the read-only path
                    xh[4 * k] = a.x; xh[4 * k + 1] = a.y; xh[4 * k + 2] = a.z; xh[4 * k + 3] = a.w;
                    xl[4 * k] = b.x; xl[4 * k + 1] = b.y; xl[4 * k + 2] = b.z; xl[4 * k + 3] = b.w;
                }
#pragma unroll
                for (int k = 0; k < EPC / 32; k++) xb[k] = __ldca(xm + (size_t)t * nblk + (size_t)cc * (EPC / 32) + k);
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t] += qdot<TYPE>(w[u][r], s[u][r], cc, xh, xl, xb);
            }
        }
        c += 32 * U;
        if (c >= nchunks) break;
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int v = 0; v < NV; v++) w[u][r][v] = wn[u][r][v];
                s[u][r] = sn[u][r];
            }
    }
    gemv_store<R, NT>(acc, res, y, row0, n_out, lane, accumulate);
}

template <int TYPE, int NT, int R, int U>
static void launch_gemvq_r(const kc_weight *W, const kc_xq *xq, float *y, int acc, cudaStream_t s) {
    const int rows_per_block = GEMV_WARPS * R;
    dim3 grid((W->n_out + rows_per_block - 1) / rows_per_block), block(GEMV_WARPS * 32);
    kc_launch(gemvq_kernel<TYPE, NT, R, U>, grid, block, 0, s, (const uint8_t *)W->data, (const uint8_t *)W->d, (const int8_t *)xq->qh,
              (const int8_t *)xq->ql, (const int2 *)xq->m, y, W->n_in, W->n_out, acc);
}

// Rows per warp for 2..8 tokens: every row re-reads the tokens' activations (from L1), so with
// one row per warp their loads, not the weights, bound the kernel as tokens are added. Chosen
// on an H100 from whole decode steps of llama2-7b at batch 2, 4 and 8 (bench/RESULTS.md
// "2026-11-24 (gemmq)"): 4 rows, but 2 for Q8_0 up to 4 tokens. A row's summation order does
// not depend on it (batch invariance).
template <int TYPE, int NT>
static void launch_gemvq_nt(const kc_weight *W, const kc_xq *xq, float *y, int acc, cudaStream_t s) {
    if (TYPE == DT_Q8_0 && NT <= 4) launch_gemvq_r<TYPE, NT, 2, 1>(W, xq, y, acc, s);
    else launch_gemvq_r<TYPE, NT, 4, 1>(W, xq, y, acc, s);
}

// One token: rows per warp x chunks in flight, as 0xRU, per matrix shape: chosen on an H100
// from 1x1, 1x2, 1x4, 2x1, 2x2, 2x4, 4x1, 4x2, 8x1 with gpu_bench_gemv at llama2-7b's shapes
// (bench/RESULTS.md "2026-11-24 (gemmq)"). More rows share each activation load; fewer rows
// give the narrow matrices (4096 rows) enough CTAs; the long rows of down (11008) want two
// batches of chunks in flight. Then retuned on whole steps (bench/RESULTS.md "fourth
// session"), where the microbenchmark's order did not hold: Q4_0 8x1 for every matrix over
// 8192 rows (gate|up and the head too: +0.6 %), 2x1 for wo and 4x2 for down (+0.5 %); Q8_0
// 2x2 for down (+1.2 %).
template <int TYPE>
static void launch_gemvq1(const kc_weight *W, const kc_xq *xq, float *y, int acc, cudaStream_t s) {
    const int n_in = W->n_in, n_out = W->n_out;
    if constexpr (TYPE == DT_Q4_0) {
        if (n_in > 8192) launch_gemvq_r<TYPE, 1, 4, 2>(W, xq, y, acc, s);
        else if (n_out > 8192) launch_gemvq_r<TYPE, 1, 8, 1>(W, xq, y, acc, s);
        else launch_gemvq_r<TYPE, 1, 2, 1>(W, xq, y, acc, s);
    } else if constexpr (TYPE == DT_Q4_K) {
        if (n_in > 8192) launch_gemvq_r<TYPE, 1, 2, 1>(W, xq, y, acc, s);
        else if (n_out <= 4096) launch_gemvq_r<TYPE, 1, 4, 2>(W, xq, y, acc, s);
        else launch_gemvq_r<TYPE, 1, 4, 1>(W, xq, y, acc, s);
    } else { // Q8_0
        if (n_in > 8192) launch_gemvq_r<TYPE, 1, 2, 2>(W, xq, y, acc, s);
        else launch_gemvq_r<TYPE, 1, 4, 1>(W, xq, y, acc, s);
    }
}

template <int TYPE>
static void launch_gemvq(const kc_weight *W, const kc_xq *xq, int n_tok, float *y, int acc, cudaStream_t s) {
    switch (n_tok) {
    case 1: launch_gemvq1<TYPE>(W, xq, y, acc, s); break;
    case 2: launch_gemvq_nt<TYPE, 2>(W, xq, y, acc, s); break;
    case 3: launch_gemvq_nt<TYPE, 3>(W, xq, y, acc, s); break;
    case 4: launch_gemvq_nt<TYPE, 4>(W, xq, y, acc, s); break;
    case 5: launch_gemvq_nt<TYPE, 5>(W, xq, y, acc, s); break;
    case 6: launch_gemvq_nt<TYPE, 6>(W, xq, y, acc, s); break;
    case 7: launch_gemvq_nt<TYPE, 7>(W, xq, y, acc, s); break;
    case 8: launch_gemvq_nt<TYPE, 8>(W, xq, y, acc, s); break;
    }
}

// ---- activation quantization ---------------------------------------------------------------

__global__ void quantize_x_kernel(const float *x, int n, int8_t *qh, int8_t *ql, int32_t *m, __half *xh) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    const int n4 = n / 4;
    const size_t row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x; // float4 index in the row
    const bool ok = i < n4;
    float4 v = ok ? ((const float4 *)(x + row * n))[i] : make_float4(0, 0, 0, 0);
    kc_xq_block4(v, ok, qh, ql, m, xh, row * n + (size_t)i * 4);
}

extern "C" int kc_quantize_x(const float *x, int n_tok, int n, kc_xq *xq, cudaStream_t s) {
    if (!x || !xq || n_tok <= 0 || n <= 0 || n % 32 || n_tok > xq->cap_tok || n > xq->cap_n) return CM_EINVAL;
    const int n4 = n / 4, threads = 256;
    dim3 grid((n4 + threads - 1) / threads, n_tok);
    kc_launch(quantize_x_kernel, grid, dim3(threads), 0, s, x, n, xq->qh, xq->ql, xq->m, (__half *)xq->xh);
    xq->n = n;
    KC_LAUNCH_CHECK();
}

// ---- dequantize to half (for the cuBLAS path) ---------------------------------------------------

// Quantized weights as half for the cuBLAS path, eight consecutive elements per thread (four
// threads a block of 32): every store of a warp is 512 contiguous bytes. One element per
// thread moved the copy at ~1.2 TB/s: a 512-token prefill of llama2-7b Q4_0 took 33.2 ms
// against 24.2 ms now (F16: 18.0; bench/RESULTS.md, third 2026-11-24 entry).
template <int TYPE>
__global__ void dequant_half8_kernel(const uint8_t *qs, const kc_half *d, size_t n8, __half *out) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += stride) {
        const size_t b = i / 4;
        const int part = (int)(i % 4); // elements 8 part .. 8 part + 7 of block b
        float v[8];
        if constexpr (TYPE == DT_Q8_0) {
            const float sc = kc_h2f(d[b]);
            const uint2 q0 = __ldg((const uint2 *)(qs + b * 32 + part * 8));
            const int8_t *q = (const int8_t *)&q0;
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = sc * (float)q[k];
        } else if constexpr (TYPE == DT_Q4_0) {
            const float sc = kc_h2f(d[b]);
            const uint2 q0 = __ldg((const uint2 *)(qs + b * 16 + (part & 1) * 8));
            const uint8_t *q = (const uint8_t *)&q0;
            const int sh = part >= 2 ? 4 : 0;
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = sc * (float)((int)((q[k] >> sh) & 15) - 8);
        } else { // Q4_K: sub-block is = b % 8 of super-block b / 8
            const size_t sb = b / 8;
            const int is = (int)(b % 8), j = is / 2;
            const uint4 h = __ldg((const uint4 *)d + sb);
            float scf, mnf;
            kc_q4k_scale_min(h, is, scf, mnf);
            const float dd = kc_h2f((uint16_t)(h.x & 0xFFFF)), dm = kc_h2f((uint16_t)(h.x >> 16));
            const uint2 q0 = __ldg((const uint2 *)(qs + sb * 128 + j * 32 + part * 8));
            const uint8_t *q = (const uint8_t *)&q0;
            const int sh = (is & 1) ? 4 : 0;
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = dd * scf * (float)((q[k] >> sh) & 15) - dm * mnf;
        }
        uint4 o;
        __half2 *oh = (__half2 *)&o;
#pragma unroll
        for (int k = 0; k < 4; k++) oh[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        ((uint4 *)out)[i] = o;
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

// 0, or CM_ECUDA with the launch error logged (file, the caller's line).
static int launch_ok(int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel launch failed", "err=\"%s\" file=%s line=%d", cudaGetErrorString(e), __FILE__, line);
    return CM_ECUDA;
}

// x [nx] as half into out (the tensor-core paths' activations).
static void to_half(const float *x, size_t nx, kc_half *out, cudaStream_t s) {
    to_half_kernel<<<(unsigned)((nx + 255) / 256 < 4096 ? (nx + 255) / 256 : 4096), 256, 0, s>>>(x, nx, (__half *)out);
}

static bool is_quant(int type) { return type == DT_Q8_0 || type == DT_Q4_0 || type == DT_Q4_K; }
extern "C" int kc_weight_is_quant(int type) { return is_quant(type); }

// Whether kc_matmul sends W x n_tok tokens to kc_gemmq (tensor cores, dequantized in
// registers): quantized weights of a shape it takes, past the GEMV's token counts, up to the
// plan's gemmq_max_tok for the type.
static bool gemmq_use(const kc_weight *W, int n_tok) {
    if (!is_quant(W->type) || !kc_gemmq_ok(W) || n_tok <= KC_GEMV_MAX_TOK) return false;
    const int *mx = kc_plan_get()->gemmq_max_tok;
    return n_tok <= (W->type == DT_Q8_0 ? mx[0] : W->type == DT_Q4_0 ? mx[1] : mx[2]);
}

extern "C" int kc_matmul_reads_x(const kc_weight *W, int n_tok) {
    if (n_tok > KC_GEMV_MAX_TOK) return 1;
    if (gemmq_use(W, n_tok)) return 1;
    if (is_quant(W->type)) return 0;
    return !(W->type == DT_F16 && W->n_in % 32 == 0);
}

extern "C" int kc_matmul(const kc_weight *W, const float *x, int n_tok, float *y, int accumulate,
                         const kc_gemm_ws *ws, cudaStream_t s) {
    return kc_matmul_xq(W, x, NULL, n_tok, y, accumulate, ws, s);
}

extern "C" int kc_matmul_xq(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, int accumulate,
                            const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W || !x || !y || n_tok <= 0) return CM_EINVAL;
    if (gemmq_use(W, n_tok)) { /* tensor cores, dequantized in registers: no w_half */
        size_t nx = (size_t)n_tok * W->n_in;
        if (!ws || nx > ws->x_cap) return CM_EINVAL;
        to_half(x, nx, ws->x_half, s);
        if (int rc = launch_ok(__LINE__)) return rc;
        return kc_gemmq(W, ws->x_half, n_tok, y, accumulate, -1, s);
    }
    if (n_tok <= KC_GEMV_MAX_TOK && is_quant(W->type)) {
        if (!xq || xq->no_ints || xq->n != W->n_in || xq->cap_tok < n_tok) { /* quantize here */
            if (!ws || ws->xq.cap_tok < n_tok || ws->xq.cap_n < W->n_in) return CM_EINVAL;
            kc_xq *wq = (kc_xq *)&ws->xq; /* scratch: the workspace's buffers, not its shape */
            int rc = kc_quantize_x(x, n_tok, W->n_in, wq, s);
            if (rc) return rc;
            xq = wq;
        }
        switch (W->type) {
        case DT_Q8_0: launch_gemvq<DT_Q8_0>(W, xq, n_tok, y, accumulate, s); break;
        case DT_Q4_0: launch_gemvq<DT_Q4_0>(W, xq, n_tok, y, accumulate, s); break;
        default: launch_gemvq<DT_Q4_K>(W, xq, n_tok, y, accumulate, s); break;
        }
        KC_LAUNCH_CHECK();
    }
    if (n_tok <= KC_GEMV_MAX_TOK && W->type == DT_F16 && xq && xq->xh && xq->n == W->n_in && n_tok <= xq->cap_tok &&
        W->n_in % 8 == 0) {
        launch_gemv<DT_F16, true>(W, xq->xh, n_tok, y, accumulate, s);
        KC_LAUNCH_CHECK();
    }
    if (n_tok <= KC_GEMV_MAX_TOK) {
        int vec = W->type == DT_F32 ? 4 : 8;
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
    size_t nx = (size_t)n_tok * W->n_in;
    if (nx > ws->x_cap) return CM_EINVAL;
    to_half(x, nx, ws->x_half, s);
    if (W->type == DT_F16) {
        if (int rc = launch_ok(__LINE__)) return rc;
        return cublas_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, W->n_out, n_tok, W->n_in, &one, W->data, CUDA_R_16F, W->n_in,
                                      ws->x_half, CUDA_R_16F, W->n_in, &beta, y, CUDA_R_32F, W->n_out, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT),
                         __LINE__);
    }
    // BF16 and quantized weights: converted to half in slices of whole rows that fit w_half
    // (sized by the caller, at least one row), each multiplied into its rows of y.
    const size_t per = ws->w_cap / (size_t)W->n_in;
    if (per == 0) return CM_EINVAL;
    for (size_t o0 = 0; o0 < (size_t)W->n_out; o0 += per) {
        const size_t nr = (size_t)W->n_out - o0 < per ? (size_t)W->n_out - o0 : per, ne = nr * W->n_in;
        if (W->type == DT_BF16) {
            bf16_to_half_kernel<<<4096, 256, 0, s>>>((const uint16_t *)W->data + o0 * W->n_in, ne, (__half *)ws->w_half);
        } else {
            size_t qs_off = W->type == DT_Q8_0 ? o0 * W->n_in : o0 * W->n_in / 2;
            size_t d_off = W->type == DT_Q4_K ? o0 * (W->n_in / 256) * 8 : o0 * (W->n_in / 32); // in halves (Q4_K: 16-byte heads)
            const uint8_t *q = (const uint8_t *)W->data + qs_off;
            const size_t n8 = ne / 8;
            const unsigned g8 = (unsigned)((n8 + 255) / 256 < 16384 ? (n8 + 255) / 256 : 16384);
            if (W->type == DT_Q8_0) dequant_half8_kernel<DT_Q8_0><<<g8, 256, 0, s>>>(q, W->d + d_off, n8, (__half *)ws->w_half);
            else if (W->type == DT_Q4_0) dequant_half8_kernel<DT_Q4_0><<<g8, 256, 0, s>>>(q, W->d + d_off, n8, (__half *)ws->w_half);
            else dequant_half8_kernel<DT_Q4_K><<<g8, 256, 0, s>>>(q, W->d + d_off, n8, (__half *)ws->w_half);
        }
        if (int rc = launch_ok(__LINE__)) return rc;
        int rc = cublas_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n_tok, W->n_in, &one, ws->w_half, CUDA_R_16F, W->n_in,
                                        ws->x_half, CUDA_R_16F, W->n_in, &beta, y + o0, CUDA_R_32F, W->n_out, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                           __LINE__);
        if (rc) return rc;
    }
    return 0;
}

extern "C" int kc_matmul_swiglu(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *gu, float *out,
                                kc_xq *xq_act, const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W || !x || n_tok <= 0 || W->n_out % 2) return CM_EINVAL;
    const int n_ff = W->n_out / 2;
    const bool fuse = n_tok <= kc_plan_get()->swiglu_fuse && W->type == DT_F16 && xq && xq->xh && xq->n == W->n_in &&
                      n_tok <= xq->cap_tok && W->n_in % 8 == 0 && xq_act && xq_act->no_ints && xq_act->xh &&
                      n_ff % 32 == 0 && n_tok <= xq_act->cap_tok && n_ff <= xq_act->cap_n;
    if (fuse) {
        const gemv_swi sw = { out, (__half *)xq_act->xh, n_ff };
        if (launch_gemv<DT_F16, true>(W, xq->xh, n_tok, nullptr, 0, s, &sw)) {
            xq_act->n = n_ff;
            KC_LAUNCH_CHECK();
        }
    }
    if (!gu) return CM_EINVAL;
    int rc = kc_matmul_xq(W, x, xq, n_tok, gu, 0, ws, s);
    return rc ? rc : kc_swiglu_xq(gu, out, xq_act, n_tok, n_ff, s);
}
