// arch: the steps of the forward pass that the architectures past Llama add (model/model.h's
// features; QK-norm is part of the RoPE kernel, rope.cu): the embedding scale, soft-capping of the
// logits, GeGLU (the post-norm added to the residual is norm.cu's kc_rmsnorm_add), and the
// mixture-of-experts layer (router top-k, tokens grouped by expert, grouped GEMVs over the chosen
// experts only, the weighted sum).
// Every kernel here works row by row (a token's result never depends on the other tokens of the
// launch) and has a fixed grid for a given token count, so it can be captured in a graph.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
#include "model/model.h"
}

KC_TRACE_TU(arch)

namespace {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void scale_kernel(float *x, size_t n, float s) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__global__ void softcap_kernel(float *x, size_t n, float cap) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// out[t][j] = act(gate) * up (times row_w[t] when given): interleaved rows (gu[t][2j],
// gu[t][2j + 1]) or split rows (gu[t][j], gu[t][n_ff + j]); rows of 2 n_ff in, n_ff out.
__global__ void glu_kernel(const float *gu, float *out, int n_ff, size_t n, int gelu, int split, const float *row_w) {
    KC_TRACE_SCOPE(KC_TR_SWIGLU);
    kc_pdl_trigger();
    kc_pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t t = i / n_ff, j = i % n_ff;
    const float *r = gu + t * 2 * n_ff;
    float g = split ? r[j] : r[2 * j], u = split ? r[n_ff + j] : r[2 * j + 1];
    float v = gelu ? kc_gelu_mul(g, u) : kc_silu_mul(g, u);
    out[i] = row_w ? v * row_w[t] : v;
}

// The same for split rows (the experts' gate|up), four values a thread (n_ff % 32 == 0), also
// written as two-level int8 blocks (kc_xq) for the integer GEMV of the down projection and / or
// as half for its tensor-core form; out may be NULL. The values are glu_kernel's bit for bit.
template <bool GELU>
__global__ void glu_split_xq_kernel(const float *gu, float *out, int n_ff, const float *row_w, int8_t *qh, int8_t *ql, int32_t *qm,
                    __half *xh) {
    KC_TRACE_SCOPE(KC_TR_SWIGLU);
    kc_pdl_trigger();
    kc_pdl_wait();
    const size_t t = blockIdx.y;
    const int j = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    const bool ok = j < n_ff;
    float4 o = make_float4(0, 0, 0, 0);
    if (ok) {
        const float4 g = *(const float4 *)(gu + t * 2 * n_ff + j), u = *(const float4 *)(gu + t * 2 * n_ff + n_ff + j);
        const float w = row_w ? row_w[t] : 1.0f;
        o = make_float4(kc_glu_mul<GELU>(g.x, u.x), kc_glu_mul<GELU>(g.y, u.y), kc_glu_mul<GELU>(g.z, u.z), kc_glu_mul<GELU>(g.w, u.w));
        if (row_w) o = make_float4(o.x * w, o.y * w, o.z * w, o.w * w);
        if (out) *(float4 *)(out + t * n_ff + j) = o;
    }
    kc_xq_block4(o, ok, qh, ql, qm, xh, t * n_ff + j);
}

// ---- mixture of experts ---------------------------------------------------------------------

// One thread per token: softmax over the n router logits, the k largest probabilities (ties:
// the lower expert first), renormalized when norm (kernels/cpu/ops.c k_topk_route).
// One warp per token: the maximum and the exponentials in parallel, their sum by lane 0 in
// expert order (the bits of the serial loop), then k passes of a warp argmax (the largest
// probability not chosen in an earlier pass, the lowest expert of equals). A thread per token
// (the first version) took ~0.2 ms a layer at batch 1 on qwen3-30b-a3b (128 experts, k = 8).
constexpr int ROUTE_WARPS = 4;
// Token t's routing by the calling warp; ex: n floats of shared memory of its own.
__device__ __forceinline__ void moe_route_token(const float *logits, int t, int n, int k, int norm, int32_t *idx, float *w,
                                                float *ex) {
    const int lane = threadIdx.x & 31;
    const float *l = logits + (size_t)t * n;
    float mx = -INFINITY;
    for (int e = lane; e < n; e += 32) mx = fmaxf(mx, l[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int e = lane; e < n; e += 32) ex[e] = expf(l[e] - mx);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
        for (int e = 0; e < n; e++) sum += ex[e];
    sum = __shfl_sync(0xffffffffu, sum, 0);
    int32_t *it = idx + (size_t)t * k;
    float *wt = w + (size_t)t * k, tot = 0.0f;
    uint32_t taken = 0; // bit i: expert lane + 32 i
    for (int j = 0; j < k; j++) {
        int best = -1;
        float pb = 0.0f;
        for (int i = 0, e = lane; e < n; i++, e += 32) {
            const float pe = ex[e] / sum;
            if (!((taken >> i) & 1u) && (best < 0 || pe > pb)) best = e, pb = pe;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const int ob = __shfl_xor_sync(0xffffffffu, best, o);
            const float op = __shfl_xor_sync(0xffffffffu, pb, o);
            if (ob >= 0 && (best < 0 || op > pb || (op == pb && ob < best))) best = ob, pb = op;
        }
        if (best >= 0 && (best & 31) == lane) taken |= 1u << (best >> 5);
        if (lane == 0) {
            it[j] = best;
            wt[j] = pb;
            tot += pb;
        }
    }
    if (norm && lane == 0)
        for (int j = 0; j < k; j++) wt[j] /= tot;
    __syncwarp();
}

__global__ void __launch_bounds__(ROUTE_WARPS * 32)
moe_route_kernel(const float *logits, int n_tok, int n, int k, int norm, int32_t *idx, float *w) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    __shared__ float s_ex[ROUTE_WARPS][MDL_MAX_EXPERTS];
    const int t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t >= n_tok) return; // the whole warp
    moe_route_token(logits, t, n, k, norm, idx, w, s_ex[threadIdx.x >> 5]);
}

// The CTA groups the n_ent = n_tok * k routing entries (token t's slot j is entry t k + j) by
// expert: list[off[e] .. off[e] + cnt[e]) are expert e's entries, in no particular order (each
// entry's result is computed on its own, so the order changes no bit of the output). Counts by
// shared-memory atomics, the offsets by a scan of warp 0, then every entry takes its slot.
__device__ __forceinline__ void moe_sort_cta(const int32_t *idx, int n_ent, int n_exp, int32_t *cnt, int32_t *off, int32_t *list) {
    __shared__ int32_t sc[MDL_MAX_EXPERTS], so[MDL_MAX_EXPERTS];
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) sc[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_ent; i += blockDim.x) atomicAdd(&sc[idx[i]], 1);
    __syncthreads();
    if (threadIdx.x < 32) { // exclusive prefix sums, 32 experts a pass
        const int lane = threadIdx.x;
        int base = 0;
        for (int e0 = 0; e0 < n_exp; e0 += 32) {
            const int c = e0 + lane < n_exp ? sc[e0 + lane] : 0;
            int v = c;
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(0xffffffffu, v, o);
                if (lane >= o) v += u;
            }
            if (e0 + lane < n_exp) so[e0 + lane] = base + v - c;
            base += __shfl_sync(0xffffffffu, v, 31);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) {
        cnt[e] = sc[e];
        off[e] = so[e];
    }
    __syncthreads(); // sc becomes the cursors
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) sc[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_ent; i += blockDim.x) {
        const int e = idx[i];
        list[so[e] + atomicAdd(&sc[e], 1)] = i;
    }
}

__global__ void moe_sort_kernel(const int32_t *idx, int n_ent, int n_exp, int32_t *cnt, int32_t *off, int32_t *list) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    moe_sort_cta(idx, n_ent, n_exp, cnt, off, list);
}

// Both in one CTA for small steps (decode): its warps route the tokens, then it groups the
// entries; one launch instead of two. Dynamic shared memory: a row of n floats per warp.
__global__ void __launch_bounds__(1024)
moe_route_sort_kernel(const float *logits, int n_tok, int n, int k, int norm, int32_t *idx, float *w, int32_t *cnt, int32_t *off,
                      int32_t *list) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    extern __shared__ float s_rex[];
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int t = warp; t < n_tok; t += nw) moe_route_token(logits, t, n, k, norm, idx, w, s_rex + (size_t)warp * n);
    __syncthreads(); // the choices in idx (global) are visible to the CTA
    moe_sort_cta(idx, n_tok * k, n, cnt, off, list);
}

// moe_route_token's result by a whole CTA, for the launches that route a few tokens: the maximum
// by a block reduction, the exponentials and probabilities a thread per expert (their sum by one
// thread in expert order: moe_route_token's bits), then each expert's rank among the
// probabilities (larger first, the lower expert of equals: the order of moe_route_token's
// passes) by comparing against all of them; the experts ranked below k take those slots. l: the
// token's n logits; sp: n floats of shared memory.
__device__ __forceinline__ void moe_route_token_cta(const float *l, int t, int n, int k, int norm, int32_t *idx, float *w, float *sp) {
    __shared__ float s_red[32], s_sum;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < n; e += blockDim.x) mx = fmaxf(mx, l[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) s_red[warp] = mx;
    __syncthreads();
    mx = s_red[0];
    for (int i = 1; i < nw; i++) mx = fmaxf(mx, s_red[i]);
    for (int e = threadIdx.x; e < n; e += blockDim.x) sp[e] = expf(l[e] - mx);
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int e = 0; e < n; e++) sum += sp[e];
        s_sum = sum;
    }
    __syncthreads();
    const float sum = s_sum;
    for (int e = threadIdx.x; e < n; e += blockDim.x) sp[e] = sp[e] / sum;
    __syncthreads();
    int32_t *it = idx + (size_t)t * k;
    float *wt = w + (size_t)t * k;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const float p = sp[e];
        int r = 0;
        for (int e2 = 0; e2 < n; e2++) {
            const float q = sp[e2];
            r += q > p || (q == p && e2 < e);
        }
        if (r < k) {
            it[r] = e;
            wt[r] = p;
        }
    }
    __syncthreads(); // the slots (global) visible to the CTA
    if (threadIdx.x == 0) {
        float tot = 0.0f;
        for (int j = 0; j < k; j++) tot += wt[j];
        if (norm)
            for (int j = 0; j < k; j++) wt[j] /= tot;
    }
    __syncthreads();
}

// The FFN pre-norm, the router and the routing of a decode step in one launch: CTA c (4 warps,
// the split norm's 128 threads) normalizes every token's row itself (rmsnorm_split_kernel's
// order and roundings, so its bits) into shared memory, writes the blocks of the float4 chunks
// kk = c, c + grid, ... (the split kernel's CTA kk's share), and its warps form the logits of
// experts 4c .. 4c + 3 (one row each, f32, the lane's n / 128 float4 of the row loaded before the
// programmatic wait). The last CTA to finish (ctr) routes every token (moe_route_token_cta: the
// bits of kc_moe_route) and groups the entries (its code), then puts ctr back to 0. Dynamic
// shared memory: max(n, (n_tok + 1) n_exp) floats.
constexpr int NR_PRE = 16; // float4 of the router row a lane holds from before the wait
__device__ __forceinline__ float4 nr_load4(const float *w, size_t i) { return __ldg((const float4 *)w + i); }
__device__ __forceinline__ float4 nr_load4(const __half *w, size_t i) {
    const uint2 u = __ldg((const uint2 *)w + i);
    const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 nr_load4(const __nv_bfloat16 *w, size_t i) {
    const uint2 u = __ldg((const uint2 *)w + i);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

template <int K, typename WT>
__global__ void __launch_bounds__(128)
moe_norm_route_kernel(const float *x, const float *__restrict__ nw, float *y, int8_t *qh, int8_t *ql, int32_t *qm, __half *xh,
                      int n_tok, float eps, const WT *__restrict__ R, int n_exp, float *logits, int k, int norm, int32_t *idx,
                      float *w, int32_t *cnt, int32_t *off, int32_t *list, int32_t *ctr) {
    KC_TRACE_SCOPE(KC_TR_NORM);
    constexpr int n = 512 * K, NJ = n / 128; // NJ: float4 of a router row per lane
    extern __shared__ float s_nr[];
    __shared__ float red[32];
    __shared__ int s_last;
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, er = blockIdx.x * 4 + warp;
    const bool has_row = er < n_exp;
    float4 wr[NJ < NR_PRE ? NJ : NR_PRE], g[K];
#pragma unroll
    for (int j = 0; j < (NJ < NR_PRE ? NJ : NR_PRE); j++)
        wr[j] = has_row ? nr_load4(R, (size_t)er * (n / 4) + lane + 32 * j) : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int kk = 0; kk < K; kk++) g[kk] = __ldg((const float4 *)nw + kk * 128 + threadIdx.x);
    kc_pdl_wait();
    for (int t = 0; t < n_tok; t++) {
        const float4 *xr = (const float4 *)(x + (size_t)t * n);
        float4 v[K];
#pragma unroll
        for (int kk = 0; kk < K; kk++) v[kk] = xr[kk * 128 + threadIdx.x];
#pragma unroll
        for (int kk = 0; kk < K; kk++) {
            const float p = kc_warp_sum(rms_sumsq4(v[kk]));
            if (lane == 0) red[kk * 4 + warp] = p;
        }
        __syncthreads();
        const float r = rms_scale(kc_warp_sum(lane < 4 * K ? red[lane] : 0.0f), n, eps);
#pragma unroll
        for (int kk = 0; kk < K; kk++) {
            const int i = kk * 128 + threadIdx.x;
            const float4 o = rms_apply4(v[kk], r, g[kk]);
            ((float4 *)s_nr)[i] = o;
            if (kk % gridDim.x == blockIdx.x) { // CTA-uniform
                if (y) ((float4 *)(y + (size_t)t * n))[i] = o;
                if (qh || xh) kc_xq_block4(o, true, qh, ql, qm, xh, (size_t)t * n + (size_t)i * 4);
            }
        }
        __syncthreads(); // the row in s_nr; red free again
        if (has_row) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const float4 a = ((const float4 *)s_nr)[lane + 32 * j];
                const float4 b = j < NR_PRE ? wr[j < NR_PRE ? j : 0] : nr_load4(R, (size_t)er * (n / 4) + lane + 32 * j);
                acc = fmaf(b.x, a.x, acc);
                acc = fmaf(b.y, a.y, acc);
                acc = fmaf(b.z, a.z, acc);
                acc = fmaf(b.w, a.w, acc);
            }
            acc = kc_warp_sum(acc);
            if (lane == 0) logits[(size_t)t * n_exp + er] = acc;
        }
        __syncthreads(); // s_nr read by every warp before the next token's row
    }
    __threadfence(); // the logits before the count
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(ctr, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    float *s_lg = s_nr, *s_ex = s_nr + (size_t)n_tok * n_exp;
    for (int i = threadIdx.x; i < n_tok * n_exp; i += blockDim.x) s_lg[i] = __ldcg(logits + i); // the other CTAs': past L1
    __syncthreads();
    for (int t = 0; t < n_tok; t++) moe_route_token_cta(s_lg + (size_t)t * n_exp, t, n_exp, k, norm, idx, w, s_ex);
    if (list) moe_sort_cta(idx, n_tok * k, n_exp, cnt, off, list);
    if (threadIdx.x == 0) *ctr = 0;
}

constexpr int MOE_WARPS = 8, MOE_RPW = 1, MOE_ROWS = MOE_WARPS * MOE_RPW, MOE_TOK = 8;

// Grouped GEMV over the experts' F16 matrices W [n_exp][n_out][n_in]: CTA (e, row tile) computes
// rows of expert e for each of its entries, MOE_TOK entries at a time (warp: MOE_RPW rows; lanes:
// 8 columns each per pass). An expert no entry chose exits at once, so its weights are never
// read. Entry i's input is row i / x_div of x, its output row i of y ([n_ent][n_out]).
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_gemv_kernel(const __half *W, const float *x, float *y, const int32_t *cnt, const int32_t *off, const int32_t *list,
                int n_in, int n_out, int x_div, int n_exp) {
    KC_TRACE_SCOPE(KC_TR_GEMV);
    kc_pdl_trigger();
    kc_pdl_wait();
    const int e = kc_moe_expert(cnt, n_exp, blockIdx.x), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (e < 0) return;
    const int n = cnt[e], o0 = off[e];
    if (!n) return;
    const int r0 = blockIdx.y * MOE_ROWS + warp * MOE_RPW;
    const __half *We = W + (size_t)e * n_out * n_in;
    for (int b = 0; b < n; b += MOE_TOK) {
        const int nb = min(MOE_TOK, n - b);
        int ent[MOE_TOK];
#pragma unroll
        for (int q = 0; q < MOE_TOK; q++) ent[q] = q < nb ? list[o0 + b + q] : -1;
        // the warp's MOE_RPW rows together (their loads in flight at once), 8 columns per lane and pass
        float acc[MOE_RPW][MOE_TOK];
#pragma unroll
        for (int rr = 0; rr < MOE_RPW; rr++)
#pragma unroll
            for (int q = 0; q < MOE_TOK; q++) acc[rr][q] = 0.0f;
        for (int c = lane * 8; c < n_in; c += 256) {
            float wf[MOE_RPW][8];
#pragma unroll
            for (int rr = 0; rr < MOE_RPW; rr++) {
                uint4 wv = make_uint4(0, 0, 0, 0);
                if (r0 + rr < n_out) wv = __ldg((const uint4 *)(We + (size_t)(r0 + rr) * n_in + c));
                const __half2 *wh = (const __half2 *)&wv;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float2 f = __half22float2(wh[i]);
                    wf[rr][2 * i] = f.x;
                    wf[rr][2 * i + 1] = f.y;
                }
            }
#pragma unroll
            for (int q = 0; q < MOE_TOK; q++) {
                if (ent[q] < 0) continue;
                const float4 *xr = (const float4 *)(x + (size_t)(ent[q] / x_div) * n_in + c);
                const float4 a = xr[0], bb = xr[1];
#pragma unroll
                for (int rr = 0; rr < MOE_RPW; rr++)
                    acc[rr][q] += wf[rr][0] * a.x + wf[rr][1] * a.y + wf[rr][2] * a.z + wf[rr][3] * a.w + wf[rr][4] * bb.x +
                                  wf[rr][5] * bb.y + wf[rr][6] * bb.z + wf[rr][7] * bb.w;
            }
        }
#pragma unroll
        for (int q = 0; q < MOE_TOK; q++) {
            if (ent[q] < 0) continue;
#pragma unroll
            for (int rr = 0; rr < MOE_RPW; rr++) {
                const float v = warp_sum(acc[rr][q]);
                if (lane == 0 && r0 + rr < n_out) y[(size_t)ent[q] * n_out + r0 + rr] = v;
            }
        }
    }
}

// out[t] (+)= sum_j y[t k + j] (the routing weights were applied to the activations), one CTA
// per token, the slots in order.
__global__ void moe_combine_kernel(const float *y, float *out, int k, int n, int accumulate) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    const size_t t = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += y[(t * k + j) * n + i];
        if (accumulate) out[t * n + i] += s;
        else out[t * n + i] = s;
    }
}

unsigned blocks_for(size_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

} // namespace

static thread_local kc_attn_mods g_mods;

extern "C" void kc_attention_mods(const kc_attn_mods *m) {
    if (m) g_mods = *m;
    else g_mods = kc_attn_mods{ 0.0f, 0 };
}

extern "C" kc_attn_mods kc_attention_mods_get(void) { return g_mods; }

extern "C" int kc_scale(float *x, size_t n, float scale, cudaStream_t s) {
    if (!x || !n) return CM_EINVAL;
    kc_launch(scale_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, s, x, n, scale);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_softcap(float *x, size_t n, float cap, cudaStream_t s) {
    if (!x || !n || !(cap > 0)) return CM_EINVAL;
    kc_launch(softcap_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, s, x, n, cap);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_glu(const float *gu, float *out, kc_xq *xq, int n_tok, int n_ff, int act, int split, const float *row_w,
                      cudaStream_t s) {
    if (!gu || n_tok <= 0 || n_ff <= 0 || (act != MDL_ACT_SILU && act != MDL_ACT_GELU_TANH)) return CM_EINVAL;
    const bool quant = xq && split && n_ff % 32 == 0 && n_tok <= xq->cap_tok && n_ff <= xq->cap_n && (xq->qh || xq->xh);
    if (xq) xq->n = quant ? n_ff : 0;
    if (!out && !quant) return CM_EINVAL; /* nothing would be written */
    if (quant) {
        const int threads = 256;
        const dim3 grid((n_ff / 4 + threads - 1) / threads, n_tok);
        if (act == MDL_ACT_GELU_TANH)
            kc_launch(glu_split_xq_kernel<true>, grid, dim3(threads), 0, s, gu, out, n_ff, row_w, xq->qh, xq->ql, xq->m,
                      (__half *)xq->xh);
        else
            kc_launch(glu_split_xq_kernel<false>, grid, dim3(threads), 0, s, gu, out, n_ff, row_w, xq->qh, xq->ql, xq->m,
                      (__half *)xq->xh);
    } else {
        const size_t n = (size_t)n_tok * n_ff;
        kc_launch(glu_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, s, gu, out, n_ff, n, act == MDL_ACT_GELU_TANH ? 1 : 0,
                  split ? 1 : 0, row_w);
    }
    KC_LAUNCH_CHECK();
}

extern "C" int kc_moe_route(const float *logits, int n_tok, int n_exp, int k, int norm, int32_t *idx, float *w,
                            int32_t *cnt, int32_t *off, int32_t *list, cudaStream_t s) {
    if (!logits || !idx || !w || !cnt || !off || !list || n_tok <= 0 || n_exp <= 0 || n_exp > MDL_MAX_EXPERTS || k <= 0 ||
        k > n_exp)
        return CM_EINVAL;
    // one launch while every warp routes at most two tokens (decode steps), else a CTA per four tokens then the grouping
    const int warps = min(32, 10240 / n_exp); // 40 KB of rows (and the grouping's 4 KB)
    if (n_tok <= 2 * warps) {
        kc_launch(moe_route_sort_kernel, dim3(1), dim3(32 * min(warps, n_tok)), (size_t)min(warps, n_tok) * n_exp * 4, s, logits, n_tok,
                  n_exp, k, norm ? 1 : 0, idx, w, cnt, off, list);
    } else {
        kc_launch(moe_route_kernel, dim3((n_tok + ROUTE_WARPS - 1) / ROUTE_WARPS), dim3(ROUTE_WARPS * 32), 0, s, logits, n_tok, n_exp,
                  k, norm ? 1 : 0, idx, w);
        kc_launch(moe_sort_kernel, dim3(1), dim3(1024), 0, s, (const int32_t *)idx, n_tok * k, n_exp, cnt, off, list);
    }
    KC_LAUNCH_CHECK();
}

extern "C" int kc_moe_gemv(const kc_half *W, int n_exp, int n_in, int n_out, const float *x, int x_div, const int32_t *cnt,
                           const int32_t *off, const int32_t *list, int n_ent, float *y, cudaStream_t s) {
    if (!W || !x || !y || !cnt || !off || !list || n_exp <= 0 || n_in <= 0 || n_in % 8 || n_out <= 0 || x_div <= 0 || n_ent <= 0)
        return CM_EINVAL;
    kc_launch(moe_gemv_kernel, dim3(n_ent < n_exp ? n_ent : n_exp, (n_out + MOE_ROWS - 1) / MOE_ROWS), dim3(MOE_WARPS * 32), 0, s,
              (const __half *)W, x, y, cnt, off, list, n_in, n_out, x_div, n_exp);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_moe_combine(const float *y, float *out, int n_tok, int k, int n, int accumulate, cudaStream_t s) {
    if (!y || !out || n_tok <= 0 || k <= 0 || n <= 0) return CM_EINVAL;
    kc_launch(moe_combine_kernel, dim3(n_tok), dim3(256), 0, s, y, out, k, n, accumulate ? 1 : 0);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_moe_norm_route_ok(const kc_weight *router, int n_tok, int n) {
    return router && (router->type == DT_F32 || router->type == DT_F16 || router->type == DT_BF16) && router->n_in == n &&
           router->n_out > 0 && router->n_out <= MDL_MAX_EXPERTS && n_tok > 0 && n_tok <= KC_GEMV_MAX_TOK && n % 512 == 0 &&
           n <= 4096;
}

extern "C" int kc_moe_norm_route(const float *x, const float *norm_w, float *y, kc_xq *xq, int n_tok, int n, float eps,
                                 const kc_weight *router, float *logits, int k, int norm, int32_t *idx, float *w, int32_t *cnt,
                                 int32_t *off, int32_t *list, int32_t *ctr, cudaStream_t s) {
    const bool group = cnt || off || list;
    if (!x || !norm_w || x == y || !router || !router->data || !logits || !idx || !w || (group && !(cnt && off && list)) || !ctr ||
        k <= 0)
        return CM_EINVAL;
    if (!kc_moe_norm_route_ok(router, n_tok, n)) return CM_EUNSUPPORTED;
    const int n_exp = router->n_out;
    if (k > n_exp) return CM_EINVAL;
    const bool quant = xq && n_tok <= xq->cap_tok && n <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (!y && !quant) return CM_EINVAL; /* the norm's output would go nowhere */
    if (xq) xq->n = quant ? n : 0;
    int8_t *qh = quant && !xq->no_ints ? xq->qh : nullptr, *ql = quant ? xq->ql : nullptr;
    int32_t *qm = quant ? xq->m : nullptr;
    __half *xh = quant ? (__half *)xq->xh : nullptr;
    const size_t smem = (size_t)max(n, (n_tok + 1) * n_exp) * sizeof(float);
    const dim3 grid((n_exp + 3) / 4), block(128);
#define NR_LAUNCH(KK, WT)                                                                                                  \
    kc_launch(moe_norm_route_kernel<KK, WT>, grid, block, smem, s, x, norm_w, y, qh, ql, qm, xh, n_tok, eps,                \
              (const WT *)router->data, n_exp, logits, k, norm ? 1 : 0, idx, w, cnt, off, list, ctr)
#define NR_TYPES(KK)                                                                                                       \
    case KK:                                                                                                               \
        if (router->type == DT_F32) NR_LAUNCH(KK, float);                                                                  \
        else if (router->type == DT_F16) NR_LAUNCH(KK, __half);                                                           \
        else NR_LAUNCH(KK, __nv_bfloat16);                                                                                 \
        break;
    switch (n / 512) {
        NR_TYPES(1)
        NR_TYPES(2)
        NR_TYPES(3)
        NR_TYPES(4)
        NR_TYPES(5)
        NR_TYPES(6)
        NR_TYPES(7)
        NR_TYPES(8)
    }
#undef NR_TYPES
#undef NR_LAUNCH
    KC_LAUNCH_CHECK();
}
