// norm: RMSNorm over rows of f32 activations; a post-norm added to the residual, alone or with
// the next pre-norm in the same launch.
#include "kc_common.cuh"
#include "gemmq_types.cuh"

#include <stdlib.h>

extern "C" {
#include "kcuda.h"
}

KC_TRACE_TU(norm)

// Each thread holds up to NV float4 of the row in registers: one read of x, loads issued together.
// With qh (QUANT), the normalised row is also written as two-level int8 blocks (kc_xq). The
// weights are loaded before the programmatic wait: read after the reduction they added a memory
// round trip to every norm between two GEMVs.
// With ADD (kc_rmsnorm_moe_xq), x[t] += sum_j ad[t ak + j] first (the slots in order, from 0: the
// bits of kc_moe_combine) and the new x is written back before it is normalized.
// (The body; rmsnorm_vec_kernel and, with ADD, rmsnorm_moe_kernel launch it.)
// F8: the row's image is KC_X_F8 (im.p non-NULL), written once the row's maximum is known.
// RAW (kc_rmsnorm_f8raw_xq): x[t] += ra.raw[t] x ra.sw x ra.sx[t] first (an FP8 matmul's unit-scale
// sums: kc_f8_scaled_add, the bits of its scale pass), written back before it is normalized.
template <int NV, bool QUANT, bool ADD, bool F8 = false, bool RAW = false>
__device__ __forceinline__ void rmsnorm_vec_body(const float *x, const float *__restrict__ w, float *y, int n, float eps,
                                                 int8_t *qh, int8_t *ql, int32_t *qm, __half *xh, const float *ad, int ak,
                                                 img_out im, kc_f8_raw_add ra = {}) {
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
    float4 sw[RAW ? NV : 1];
    if constexpr (RAW)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int i = threadIdx.x + k * blockDim.x;
            sw[k] = i < n4 ? __ldg((const float4 *)ra.sw + i) : make_float4(0, 0, 0, 0);
        }
    kc_pdl_wait();
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * n);
    float4 *yr = y ? (float4 *)(y + (size_t)blockIdx.x * n) : nullptr; // NULL: only the blocks
    float4 v[NV];
    const float st = RAW ? ra.sx[blockIdx.x] : 1.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < n4 ? xr[i] : make_float4(0, 0, 0, 0);
        if (RAW && i < n4) {
            v[k] = kc_f8_scaled_add(((const float4 *)(ra.raw + (size_t)blockIdx.x * n))[i], sw[k], st, v[k]);
            ((float4 *)(x + (size_t)blockIdx.x * n))[i] = v[k];
        }
        if (ADD && i < n4) {
            // the slots' loads in flight together, SB at a time (a loop of one load and one add
            // each kept them in a chain of round trips), then added in slot order as before; SB
            // shrinks as NV grows, so that 1,024 threads keep fitting the registers of an SM
            constexpr int SB = NV >= 8 ? 1 : 8 / NV;
            const float4 *ap = (const float4 *)(ad + (size_t)blockIdx.x * ak * n) + i;
            float4 a = make_float4(0, 0, 0, 0);
            for (int j0 = 0; j0 < ak; j0 += SB) {
                float4 e[SB];
#pragma unroll
                for (int u = 0; u < SB; u++)
                    if (j0 + u < ak) e[u] = ap[(size_t)(j0 + u) * n4];
#pragma unroll
                for (int u = 0; u < SB; u++)
                    if (j0 + u < ak) a = add4(a, e[u]);
            }
            v[k] = add4(v[k], a);
            ((float4 *)(x + (size_t)blockIdx.x * n))[i] = v[k];
        }
    }
    float ss = rms_sumsq4(v[0]);
#pragma unroll
    for (int k = 1; k < NV; k++) ss = __fadd_rn(ss, rms_sumsq4(v[k]));
    ss = kc_block_sum(ss, red);
    const float r = rms_scale(ss, n, eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        float4 o = make_float4(0, 0, 0, 0);
        if (i < n4) {
            o = rms_apply4(v[k], r, g[k]);
            if (yr) yr[i] = o;
            if (!F8 && im.p) img_store4(im, o, blockIdx.x, 4 * i);
        }
        if (QUANT) kc_xq_block4(o, i < n4, qh, ql, qm, xh, (size_t)blockIdx.x * n + (size_t)i * 4);
        if (F8) v[k] = o;
    }
    if constexpr (F8) kc_f8_store_row(im, v, blockIdx.x, red);
}

template <int NV, bool QUANT, bool F8 = false>
__global__ void rmsnorm_vec_kernel(const float *x, const float *__restrict__ w, float *y, int n, float eps, int8_t *qh, int8_t *ql,
                                   int32_t *qm, __half *xh, img_out im) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    rmsnorm_vec_body<NV, QUANT, false, F8>(x, w, y, n, eps, qh, ql, qm, xh, nullptr, 0, im);
}
// The residual add of an FP8 matmul's unit-scale sums, then the norm (kc_rmsnorm_f8raw_xq)
template <int NV, bool F8>
__global__ void __launch_bounds__(1024) rmsnorm_raw_kernel(const float *x, const float *__restrict__ w, float *y, int n, float eps,
                                                           img_out im, kc_f8_raw_add ra) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    rmsnorm_vec_body<NV, false, false, F8, true>(x, w, y, n, eps, nullptr, nullptr, nullptr, nullptr, nullptr, 0, im, ra);
}
// Rows past 16,384 (NV 8 at 1,024 threads): bounded so that the launch fits an SM (unbounded,
// the body takes 95-102 registers a thread and a launch of 1,024 threads fails).
template <bool QUANT, bool F8 = false>
__global__ void __launch_bounds__(1024) rmsnorm_vec8_kernel(const float *x, const float *__restrict__ w, float *y, int n, float eps,
                                                            int8_t *qh, int8_t *ql, int32_t *qm, __half *xh, img_out im) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    rmsnorm_vec_body<8, QUANT, false, F8>(x, w, y, n, eps, qh, ql, qm, xh, nullptr, 0, im);
}
// The experts' sum with the norm (kc_rmsnorm_moe_xq): its slot loads in flight take registers,
// bounded so that 1,024 threads (n up to 4,096 at NV 1) fit an SM.
template <int NV, bool QUANT>
__global__ void __launch_bounds__(1024) rmsnorm_moe_kernel(const float *x, const float *__restrict__ w, float *y, int n, float eps,
                                                           int8_t *qh, int8_t *ql, int32_t *qm, __half *xh, const float *ad, int ak) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    rmsnorm_vec_body<NV, QUANT, true>(x, w, y, n, eps, qh, ql, qm, xh, ad, ak, img_out{});
}

// Rows of n = 512 K (K <= 8: n <= 4096) over K CTAs of 128 threads per token: every CTA reads
// the whole row and forms its sum of squares, then normalizes and writes the quarter-warp
// blocks of its own 128 float4. Between two GEMVs this is faster than one CTA of 1024 threads
// (bench/RESULTS.md): the work after the reduction is spread over K SMs, and small CTAs find
// room beside the GEMV's. The sum is formed in the order rmsnorm_vec_kernel<1> forms it with
// n / 4 threads (float4 i's square sum, warp sums over 32 consecutive float4, then the sum of
// the warp sums), so both kernels give the same bits.
// ALL (steps of many tokens, kc_plan.norm_rows_min_tok): one CTA a row writes all K parts, so
// each thread has K loads in flight (the 1,024-thread kernel's one float4 a thread left a
// prefill's norms at 60 % of the bandwidth). F8 (with ALL): the image is KC_X_F8.
template <int K, bool QUANT, bool ALL, bool F8 = false>
__global__ void __launch_bounds__(128) rmsnorm_split_kernel(const float *x, const float *__restrict__ w, float *y, int n,
                                                            float eps, int8_t *qh, int8_t *ql, int32_t *qm, __half *xh, img_out im) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    __shared__ float red[32];
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int NW = ALL ? K : 1; // the parts this CTA writes: all K, or part blockIdx.x
    float4 g[NW];
#pragma unroll
    for (int k = 0; k < NW; k++) g[k] = __ldg((const float4 *)w + (ALL ? k : (int)blockIdx.x) * 128 + threadIdx.x);
    kc_pdl_wait();
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.y * n);
    float4 v[K];
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = xr[k * 128 + threadIdx.x];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const float p = kc_warp_sum(rms_sumsq4(v[k])); // float4 k * 128 + threadIdx.x: warp 4 k + warp
        if (lane == 0) red[k * 4 + warp] = p;
    }
    __syncthreads();
    const float r = rms_scale(kc_warp_sum(lane < 4 * K ? red[lane] : 0.0f), n, eps);
#pragma unroll
    for (int j = 0; j < NW; j++) {
        const int part = ALL ? j : (int)blockIdx.x, i0 = part * 128 + threadIdx.x;
        float4 mine = v[0];
#pragma unroll
        for (int k = 1; k < K; k++)
            if (k == part) mine = v[k];
        const float4 o = rms_apply4(mine, r, g[j]);
        if (y) ((float4 *)(y + (size_t)blockIdx.y * n))[i0] = o;
        if (!F8 && im.p) img_store4(im, o, blockIdx.y, 4 * i0);
        if (QUANT) kc_xq_block4(o, true, qh, ql, qm, xh, (size_t)blockIdx.y * n + (size_t)i0 * 4);
        if (F8) v[j] = o; // part j is float4 j * 128 + threadIdx.x, as kc_f8_store_row counts them
    }
    if constexpr (F8) {
        static_assert(ALL, "a KC_X_F8 image needs the whole row in the CTA");
        kc_f8_store_row(im, v, blockIdx.y, red);
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
static void launch_vec(const float *x, const float *w, float *y, kc_xq *xq, int n_tok, int n, float eps, img_out im, cudaStream_t s) {
    /* one float4 per thread where the row allows: the norm sits between two GEMVs, and fewer
     * threads holding more each made the step slower (256: +0.12 ms, 128: +0.3 ms per llama2-7b
     * step; bench/RESULTS.md) */
    int n4 = n / 4, threads = n4 >= 1024 ? 1024 : ((n4 + 31) / 32) * 32;
    int nv = (n4 + threads - 1) / threads;
    int8_t *qh = QUANT && !xq->no_ints ? xq->qh : nullptr, *ql = QUANT ? xq->ql : nullptr;
    int32_t *qm = QUANT ? xq->m : nullptr;
    __half *xh = QUANT ? (__half *)xq->xh : nullptr;
    const kc_plan *pl = kc_plan_get();
    const bool rows = pl->norm_rows_min_tok > 0 && n_tok >= pl->norm_rows_min_tok;
    if (!QUANT && im.order == KC_X_F8) { // whole rows in a CTA (the same bits as the split CTAs)
        // from norm_rows_min_tok tokens one CTA of 128 threads a row, all loads in flight; fewer
        // tokens, a thread a float4 (more warps for the division of every code)
        typedef void (*f8_fn)(const float *, const float *, float *, int, float, int8_t *, int8_t *, int32_t *, __half *, img_out);
        if (rows && n % 512 == 0 && n <= 4096 && n_tok <= 65535) {
            static const f8_fn ks[8] = { rmsnorm_split_kernel<1, false, true, true>, rmsnorm_split_kernel<2, false, true, true>,
                                         rmsnorm_split_kernel<3, false, true, true>, rmsnorm_split_kernel<4, false, true, true>,
                                         rmsnorm_split_kernel<5, false, true, true>, rmsnorm_split_kernel<6, false, true, true>,
                                         rmsnorm_split_kernel<7, false, true, true>, rmsnorm_split_kernel<8, false, true, true> };
            kc_launch(ks[n / 512 - 1], dim3(1, n_tok), dim3(128), 0, s, x, w, y, n, eps, nullptr, nullptr, nullptr, nullptr, im);
        } else {
            const f8_fn k = nv <= 1 ? rmsnorm_vec_kernel<1, false, true> : nv <= 2 ? rmsnorm_vec_kernel<2, false, true>
                          : nv <= 4 ? rmsnorm_vec_kernel<4, false, true> : rmsnorm_vec8_kernel<false, true>;
            kc_launch(k, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, nullptr, nullptr, nullptr, nullptr, im);
        }
        return;
    }
    if (n % 512 == 0 && n <= 4096 && n_tok <= 65535 && (n_tok <= pl->norm_split || rows)) { // tokens are grid.y here
        typedef void (*split_fn)(const float *, const float *, float *, int, float, int8_t *, int8_t *, int32_t *, __half *, img_out);
#define NORM_KS(ALL)                                                                                                    \
    { rmsnorm_split_kernel<1, QUANT, ALL>, rmsnorm_split_kernel<2, QUANT, ALL>, rmsnorm_split_kernel<3, QUANT, ALL>,     \
      rmsnorm_split_kernel<4, QUANT, ALL>, rmsnorm_split_kernel<5, QUANT, ALL>, rmsnorm_split_kernel<6, QUANT, ALL>,     \
      rmsnorm_split_kernel<7, QUANT, ALL>, rmsnorm_split_kernel<8, QUANT, ALL> }
        static const split_fn ks[2][8] = { NORM_KS(false), NORM_KS(true) };
#undef NORM_KS
        const bool all = n_tok > pl->norm_split; // past the split's range: one CTA a row
        kc_launch(ks[all][n / 512 - 1], dim3(all ? 1 : n / 512, n_tok), dim3(128), 0, s, x, w, y, n, eps, qh, ql, qm, xh, im);
        return;
    }
    if (nv <= 1) kc_launch(rmsnorm_vec_kernel<1, QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh, im);
    else if (nv <= 2) kc_launch(rmsnorm_vec_kernel<2, QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh, im);
    else if (nv <= 4) kc_launch(rmsnorm_vec_kernel<4, QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh, im);
    else kc_launch(rmsnorm_vec8_kernel<QUANT>, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps, qh, ql, qm, xh, im);
}

extern "C" int kc_rmsnorm_xq(const float *x, const float *w, float *y, kc_xq *xq, int n_tok, int n, float eps, cudaStream_t s) {
    const kc_pdl_scope pdl_cls(KC_PDL_NORM);
    if (!x || !w || x == y || n_tok <= 0 || n <= 0) return CM_EINVAL;
    const bool quant = xq && n % 32 == 0 && n_tok <= xq->cap_tok && n <= xq->cap_n && (!xq->no_ints || xq->xh);
    // x's image for the next matmul where the caller asked for one that fits
    // (a KC_X_F8 image where the launch writes no int8 blocks: more tokens than the GEMVs take)
    const img_out im = n <= 4 * 1024 * 8 ? img_asked(xq, n_tok, n, !quant) : img_out{};
    if (!y && !((quant || im.p) && n % 4 == 0 && n <= 4 * 1024 * 8)) return CM_EINVAL; /* nothing would be written */
    if (xq) xq->n = quant ? n : 0;
    if (n % 4 == 0 && n <= 4 * 1024 * 8) {
        if (quant) launch_vec<true>(x, w, y, xq, n_tok, n, eps, im, s);
        else launch_vec<false>(x, w, y, xq, n_tok, n, eps, im, s);
        if (im.p) xq->img_tok = n_tok, xq->img_n = n;
    } else {
        if (quant) xq->n = 0; /* only the vector kernel quantizes */
        int threads = n >= 256 ? 256 : ((n + 31) / 32) * 32;
        kc_launch(rmsnorm_kernel, dim3(n_tok), dim3(threads), 0, s, x, w, y, n, eps);
    }
    KC_LAUNCH_CHECK();
}

// launch_vec's one-CTA-a-row kernels (the same bits as its choice), below the plan's
// norm_rows_min_tok (where launch_vec takes a CTA of 128 threads a row for the F8 image)
extern "C" int kc_rmsnorm_f8raw_ok(int n_tok, int n) {
    const int rows = kc_plan_get()->norm_rows_min_tok;
    return n_tok > 0 && n > 0 && n % 4 == 0 && n <= 4 * 4 * 1024 && n_tok <= 65535 && !(rows > 0 && n_tok >= rows);
}

extern "C" int kc_rmsnorm_f8raw_xq(float *x, const float *raw, const float *sw, const float *sx, const float *w, float *y, kc_xq *xq,
                                   int n_tok, int n, float eps, cudaStream_t s) {
    const kc_pdl_scope pdl_cls(KC_PDL_NORM);
    if (!x || !raw || !sw || !sx || !w || x == y || raw == x || !kc_rmsnorm_f8raw_ok(n_tok, n) || ((uintptr_t)sw & 15) ||
        ((uintptr_t)raw & 15))
        return CM_EINVAL;
    const bool quant = xq && n % 32 == 0 && n_tok <= xq->cap_tok && n <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (quant) return CM_EINVAL; // the int8 blocks: the GEMVs' steps, never these
    const img_out im = img_asked(xq, n_tok, n, true);
    if (!y && !im.p) return CM_EINVAL; /* nothing would be written */
    if (xq) xq->n = 0;
    const int n4 = n / 4, threads = n4 >= 1024 ? 1024 : ((n4 + 31) / 32) * 32, nv = (n4 + threads - 1) / threads;
    const kc_f8_raw_add ra = { raw, sw, sx };
    typedef void (*fn)(const float *, const float *, float *, int, float, img_out, kc_f8_raw_add);
    const bool f8 = im.order == KC_X_F8;
    const fn k = nv <= 1 ? (f8 ? rmsnorm_raw_kernel<1, true> : rmsnorm_raw_kernel<1, false>)
               : nv <= 2 ? (f8 ? rmsnorm_raw_kernel<2, true> : rmsnorm_raw_kernel<2, false>)
                         : (f8 ? rmsnorm_raw_kernel<4, true> : rmsnorm_raw_kernel<4, false>);
    kc_launch(k, dim3(n_tok), dim3(threads), 0, s, (const float *)x, w, y, n, eps, im, ra);
    if (im.p) xq->img_tok = n_tok, xq->img_n = n;
    KC_LAUNCH_CHECK();
}

extern "C" int kc_rmsnorm(const float *x, const float *w, float *y, int n_tok, int n, float eps, cudaStream_t s) {
    return kc_rmsnorm_xq(x, w, y, NULL, n_tok, n, eps, s);
}

extern "C" int kc_rmsnorm_moe_xq(float *x, const float *ey, int k, const float *w, float *y, kc_xq *xq, int n_tok, int n, float eps,
                                 cudaStream_t s) {
    if (!x || !ey || k <= 0 || !w || !y || x == y || n_tok <= 0 || n <= 0 || n % 4 || n > 4 * 1024 * 8) return CM_EINVAL;
    const bool quant = xq && n % 32 == 0 && n_tok <= xq->cap_tok && n <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (xq) xq->n = quant ? n : 0;
    /* launch_vec's thread count and float4 per thread (so the norm's bits), never the split kernel:
     * its CTAs would read a row that another CTA of the token is writing */
    const int n4 = n / 4, threads = n4 >= 1024 ? 1024 : ((n4 + 31) / 32) * 32, nv = (n4 + threads - 1) / threads;
    int8_t *qh = quant && !xq->no_ints ? xq->qh : nullptr, *ql = quant ? xq->ql : nullptr;
    int32_t *qm = quant ? xq->m : nullptr;
    __half *xh = quant ? (__half *)xq->xh : nullptr;
#define MOE_NORM(NV)                                                                                                     \
    (quant ? kc_launch(rmsnorm_moe_kernel<NV, true>, dim3(n_tok), dim3(threads), 0, s, (const float *)x, w, y, n, eps, qh, ql, qm, xh, \
                       ey, k)                                                                                            \
           : kc_launch(rmsnorm_moe_kernel<NV, false>, dim3(n_tok), dim3(threads), 0, s, (const float *)x, w, y, n, eps, qh, ql, qm, xh, \
                       ey, k))
    if (nv <= 1) MOE_NORM(1);
    else if (nv <= 2) MOE_NORM(2);
    else if (nv <= 4) MOE_NORM(4);
    else MOE_NORM(8);
#undef MOE_NORM
    KC_LAUNCH_CHECK();
}

// ---- post-norm added to the residual, and the next pre-norm ------------------------------------


// x[t] += rmsnorm(h[t]) * wp; with NEXT, then y[t] = rmsnorm(x[t]) * w (and the blocks with
// QUANT) from the new x held in registers: one CTA per token, each thread up to NV float4 of
// both rows. The second norm has the thread count, sum order and roundings of
// rmsnorm_vec_kernel as launch_vec picks it (and so the split kernel's bits), so the launch
// gives the same bits as kc_rmsnorm_add then kc_rmsnorm_xq. y may be h: a CTA reads its row of h
// before the first reduction and writes y after the second.
template <int NV, bool NEXT, bool QUANT>
__global__ void __launch_bounds__(1024) rmsnorm_add_vec_kernel(float *x, const float *h, const float *__restrict__ wp, const float *__restrict__ w,
                                       float *y, int n, float eps, int8_t *qh, int8_t *ql, int32_t *qm, __half *xh) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    __shared__ float red[32];
    kc_pdl_trigger();
    const int n4 = n / 4;
    float4 gp[NV], g[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        gp[k] = i < n4 ? __ldg((const float4 *)wp + i) : make_float4(0, 0, 0, 0);
        if (NEXT) g[k] = i < n4 ? __ldg((const float4 *)w + i) : make_float4(0, 0, 0, 0);
    }
    kc_pdl_wait();
    const float4 *hr = (const float4 *)(h + (size_t)blockIdx.x * n);
    float4 *xr = (float4 *)(x + (size_t)blockIdx.x * n);
    float4 v[NV], a[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < n4 ? hr[i] : make_float4(0, 0, 0, 0);
        a[k] = i < n4 ? xr[i] : make_float4(0, 0, 0, 0);
    }
    float ss = rms_sumsq4(v[0]);
#pragma unroll
    for (int k = 1; k < NV; k++) ss = __fadd_rn(ss, rms_sumsq4(v[k]));
    ss = kc_block_sum(ss, red);
    const float r = rms_scale(ss, n, eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            a[k] = add4(a[k], rms_apply4(v[k], r, gp[k]));
            xr[i] = a[k];
        }
    }
    if constexpr (NEXT) {
        float *yrow = y ? y + (size_t)blockIdx.x * n : nullptr; // NULL: only the blocks
        float s2 = rms_sumsq4(a[0]);
#pragma unroll
        for (int k = 1; k < NV; k++) s2 = __fadd_rn(s2, rms_sumsq4(a[k]));
        s2 = kc_block_sum(s2, red);
        const float r2 = rms_scale(s2, n, eps);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int i = threadIdx.x + k * blockDim.x;
            float4 o = make_float4(0, 0, 0, 0);
            if (i < n4) {
                o = rms_apply4(a[k], r2, g[k]);
                if (yrow) ((float4 *)yrow)[i] = o;
            }
            if (QUANT) kc_xq_block4(o, i < n4, qh, ql, qm, xh, (size_t)blockIdx.x * n + (size_t)i * 4);
        }
    }
}

// Any n (tiny models): x[t] += rmsnorm(h[t]) * w, strided scalar loop.
__global__ void rmsnorm_add_kernel(float *x, const float *h, const float *__restrict__ w, int n, float eps) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    __shared__ float red[32];
    kc_pdl_trigger();
    kc_pdl_wait();
    const float *hr = h + (size_t)blockIdx.x * n;
    float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(hr[i], hr[i], ss);
    ss = kc_block_sum(ss, red);
    const float r = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] += hr[i] * r * w[i];
}

static bool norm_vec_ok(int n) { return n % 4 == 0 && n <= 4 * 1024 * 8; }

template <bool NEXT, bool QUANT>
static void launch_add_vec(float *x, const float *h, const float *wp, const float *w, float *y, kc_xq *xq, int n_tok, int n,
                           float eps, cudaStream_t s) {
    /* launch_vec's thread count (the second norm's bits depend on it) */
    const int n4 = n / 4, threads = n4 >= 1024 ? 1024 : ((n4 + 31) / 32) * 32, nv = (n4 + threads - 1) / threads;
    int8_t *qh = QUANT && !xq->no_ints ? xq->qh : nullptr, *ql = QUANT ? xq->ql : nullptr;
    int32_t *qm = QUANT ? xq->m : nullptr;
    __half *xh = QUANT ? (__half *)xq->xh : nullptr;
    typedef void (*fn)(float *, const float *, const float *, const float *, float *, int, float, int8_t *, int8_t *, int32_t *,
                       __half *);
    const fn k = nv <= 1 ? rmsnorm_add_vec_kernel<1, NEXT, QUANT>
               : nv <= 2 ? rmsnorm_add_vec_kernel<2, NEXT, QUANT>
               : nv <= 4 ? rmsnorm_add_vec_kernel<4, NEXT, QUANT> : rmsnorm_add_vec_kernel<8, NEXT, QUANT>;
    kc_launch(k, dim3(n_tok), dim3(threads), 0, s, x, h, wp, w, y, n, eps, qh, ql, qm, xh);
}

extern "C" int kc_rmsnorm_add(float *x, const float *y, const float *w, int n_tok, int n, float eps, cudaStream_t s) {
    if (!x || !y || !w || x == y || n_tok <= 0 || n <= 0) return CM_EINVAL;
    if (norm_vec_ok(n)) launch_add_vec<false, false>(x, y, w, nullptr, nullptr, nullptr, n_tok, n, eps, s);
    else kc_launch(rmsnorm_add_kernel, dim3(n_tok), dim3(n >= 256 ? 256 : ((n + 31) / 32) * 32), 0, s, x, y, w, n, eps);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_rmsnorm_add_xq(float *x, const float *h, const float *w_post, const float *w, float *y, kc_xq *xq, int n_tok,
                                 int n, float eps, cudaStream_t s) {
    if (!x || !h || !w_post || !w || x == h || x == y || n_tok <= 0 || n <= 0) return CM_EINVAL;
    if (!norm_vec_ok(n)) { /* the two launches (the plain norm writes only y) */
        if (!y) return CM_EINVAL;
        int rc = kc_rmsnorm_add(x, h, w_post, n_tok, n, eps, s);
        return rc ? rc : kc_rmsnorm_xq(x, w, y, xq, n_tok, n, eps, s);
    }
    const bool quant = xq && n % 32 == 0 && n_tok <= xq->cap_tok && n <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (!y && !quant) return CM_EINVAL; /* nothing would be written */
    if (xq) xq->n = quant ? n : 0;
    if (quant) launch_add_vec<true, true>(x, h, w_post, w, y, xq, n_tok, n, eps, s);
    else launch_add_vec<true, false>(x, h, w_post, w, y, xq, n_tok, n, eps, s);
    KC_LAUNCH_CHECK();
}
