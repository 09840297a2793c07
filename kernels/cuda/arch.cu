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

// out[t][j] = act(gate) * up: interleaved rows (gu[t][2j], gu[t][2j + 1]) or split rows
// (gu[t][j], gu[t][n_ff + j]); rows of 2 n_ff in, n_ff out.
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

// ---- mixture of experts ---------------------------------------------------------------------

// One thread per token: softmax over the n router logits, the k largest probabilities (ties:
// the lower expert first), renormalized when norm (kernels/cpu/ops.c k_topk_route).
// One warp per token: the maximum and the exponentials in parallel, their sum by lane 0 in
// expert order (the bits of the serial loop), then k passes of a warp argmax (the largest
// probability not chosen in an earlier pass, the lowest expert of equals). A thread per token
// (the first version) took ~0.2 ms a layer at batch 1 on qwen3-30b-a3b (128 experts, k = 8).
constexpr int ROUTE_WARPS = 4;
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
moe_route_kernel(const float *logits, int n_tok, int n, int k, int norm, int32_t *idx, float *w) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    __shared__ float s_ex[ROUTE_WARPS][MDL_MAX_EXPERTS];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int t = blockIdx.x * ROUTE_WARPS + wi;
    if (t >= n_tok) return; // the whole warp
    const float *l = logits + (size_t)t * n;
    float *ex = s_ex[wi];
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
}

// One CTA: the n_ent = n_tok * k routing entries (token t's slot j is entry t k + j) grouped by
// expert: list[off[e] .. off[e] + cnt[e]) are expert e's entries, in no particular order (each
// entry's result is computed on its own, so the order changes no bit of the output). Counts by
// shared-memory atomics, the offsets by one thread, then every entry takes its slot.
__global__ void moe_sort_kernel(const int32_t *idx, int n_ent, int n_exp, int32_t *cnt, int32_t *off, int32_t *list) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    __shared__ int32_t sc[MDL_MAX_EXPERTS], so[MDL_MAX_EXPERTS];
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) sc[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_ent; i += blockDim.x) atomicAdd(&sc[idx[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0, o = 0; e < n_exp; o += sc[e], e++) so[e] = o;
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

constexpr int MOE_WARPS = 8, MOE_RPW = 1, MOE_ROWS = MOE_WARPS * MOE_RPW, MOE_TOK = 8;

// The expert of CTA column i: i itself when the grid has a column per expert, else the i-th
// expert (ascending) that some entry chose (-1: fewer were chosen). A step of T tokens and k
// slots launches min(n_exp, T k) columns, so a decode step does not schedule a CTA per expert
// (128 x the row tiles, nearly all exiting at once: most of an MoE layer's time at batch 1).
__device__ __forceinline__ int moe_expert(const int32_t *cnt, int n_exp, int i) {
    if ((int)gridDim.x == n_exp) return i;
    __shared__ int s_e;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int seen = 0, found = -1;
        for (int base = 0; base < n_exp && found < 0; base += 32) {
            const int j = base + lane;
            const unsigned m = __ballot_sync(0xffffffffu, j < n_exp && cnt[j] > 0);
            const int c = __popc(m);
            if (i < seen + c) {
                unsigned mm = m;
                for (int q = 0; q < i - seen; q++) mm &= mm - 1;
                found = base + __ffs(mm) - 1;
            }
            seen += c;
        }
        if (lane == 0) s_e = found;
    }
    __syncthreads();
    return s_e;
}

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
    const int e = moe_expert(cnt, n_exp, blockIdx.x), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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

// ---- quantized experts: GGUF blocks as they are in the file --------------------------------
// deq32<T>(row, c, w): the 32 values of chunk c (values 32 c .. 32 c + 31) of a row of GGUF
// blocks of type T (ggml's block layouts, dequantized with ggml's formulas).

__device__ __forceinline__ float ldh(const uint8_t *p) { // an unaligned little-endian half
    const unsigned short b = (unsigned short)(__ldg(p) | (__ldg(p + 1) << 8));
    return __half2float(__ushort_as_half(b));
}
__device__ __forceinline__ void k4_scale_min(const uint8_t *q, int j, float *sc, float *mn) { // get_scale_min_k4
    int d, m;
    if (j < 4) {
        d = __ldg(q + j) & 63;
        m = __ldg(q + j + 4) & 63;
    } else {
        d = (__ldg(q + j + 4) & 0xF) | ((__ldg(q + j - 4) >> 6) << 4);
        m = (__ldg(q + j + 4) >> 4) | ((__ldg(q + j) >> 6) << 4);
    }
    *sc = (float)d;
    *mn = (float)m;
}

template <int T> struct qinfo;
template <> struct qinfo<DT_Q4_0> { static constexpr int vals = 32, bytes = 18; };
template <> struct qinfo<DT_Q4_1> { static constexpr int vals = 32, bytes = 20; };
template <> struct qinfo<DT_Q5_0> { static constexpr int vals = 32, bytes = 22; };
template <> struct qinfo<DT_Q5_1> { static constexpr int vals = 32, bytes = 24; };
template <> struct qinfo<DT_Q8_0> { static constexpr int vals = 32, bytes = 34; };
template <> struct qinfo<DT_Q4_K> { static constexpr int vals = 256, bytes = 144; };
template <> struct qinfo<DT_Q5_K> { static constexpr int vals = 256, bytes = 176; };
template <> struct qinfo<DT_Q6_K> { static constexpr int vals = 256, bytes = 210; };

template <int T> __device__ __forceinline__ void deq32(const uint8_t *row, int c, float (&w)[32]) {
    constexpr int V = qinfo<T>::vals, B = qinfo<T>::bytes;
    const uint8_t *b = row + (size_t)(c * 32 / V) * B;
    const int sub = c % (V / 32); // 32-value chunk inside a super-block
    if constexpr (T == DT_Q8_0) {
        const float d = ldh(b);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = d * (float)(int8_t)__ldg(b + 2 + l);
    } else if constexpr (T == DT_Q4_0 || T == DT_Q4_1) {
        const float d = ldh(b), m = T == DT_Q4_1 ? ldh(b + 2) : 0.0f;
        const uint8_t *qs = b + (T == DT_Q4_1 ? 4 : 2);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const int q = __ldg(qs + l);
            if (T == DT_Q4_0) {
                w[l] = ((q & 0xF) - 8) * d;
                w[l + 16] = ((q >> 4) - 8) * d;
            } else {
                w[l] = (q & 0xF) * d + m;
                w[l + 16] = (q >> 4) * d + m;
            }
        }
    } else if constexpr (T == DT_Q5_0 || T == DT_Q5_1) {
        const float d = ldh(b), m = T == DT_Q5_1 ? ldh(b + 2) : 0.0f;
        const uint8_t *h = b + (T == DT_Q5_1 ? 4 : 2), *qs = h + 4;
        const uint32_t qh = __ldg(h) | (__ldg(h + 1) << 8) | (__ldg(h + 2) << 16) | ((uint32_t)__ldg(h + 3) << 24);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            const int q = __ldg(qs + l);
            const int x0 = (q & 0xF) | (((qh >> l) << 4) & 0x10), x1 = (q >> 4) | ((qh >> (l + 12)) & 0x10);
            if (T == DT_Q5_0) {
                w[l] = (x0 - 16) * d;
                w[l + 16] = (x1 - 16) * d;
            } else {
                w[l] = x0 * d + m;
                w[l + 16] = x1 * d + m;
            }
        }
    } else if constexpr (T == DT_Q4_K || T == DT_Q5_K) {
        const float d = ldh(b), dmin = ldh(b + 2);
        float sc, mn;
        k4_scale_min(b + 4, sub, &sc, &mn);
        const float d1 = d * sc, m1 = dmin * mn;
        const uint8_t *qs = b + (T == DT_Q5_K ? 48 : 16) + 32 * (sub / 2), *qh = b + 16;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int q = __ldg(qs + l);
            int v = sub & 1 ? q >> 4 : q & 0xF;
            if (T == DT_Q5_K) v += ((__ldg(qh + l) >> sub) & 1) << 4;
            w[l] = d1 * v - m1;
        }
    } else { // Q6_K: ql[128] qh[64] scales[16] d
        const int n = sub / 4, i = sub % 4;
        const uint8_t *ql = b + 64 * n + (i & 1 ? 32 : 0), *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * n);
        const float d = ldh(b + 208);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int lo = i < 2 ? __ldg(ql + l) & 0xF : __ldg(ql + l) >> 4;
            const int q = lo | (((__ldg(qh + l) >> (2 * i)) & 3) << 4);
            w[l] = d * (float)__ldg(sc + l / 16 + 2 * i) * (float)(q - 32);
        }
    }
}

// The grouped GEMV of moe_gemv_kernel over experts kept in their GGUF type: W [n_exp][n_out]
// rows of row_bytes. Lanes take 32-value chunks of a row (n_in % 32 == 0; K-quants: % 256).
template <int T>
__global__ void __launch_bounds__(MOE_WARPS * 32)
moe_gemvq_kernel(const uint8_t *W, size_t row_bytes, const float *x, float *y, const int32_t *cnt, const int32_t *off,
                 const int32_t *list, int n_in, int n_out, int x_div, int n_exp) {
    KC_TRACE_SCOPE(KC_TR_GEMVQ);
    kc_pdl_trigger();
    kc_pdl_wait();
    const int e = moe_expert(cnt, n_exp, blockIdx.x), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (e < 0) return;
    const int n = cnt[e], o0 = off[e];
    if (!n) return;
    const int r0 = blockIdx.y * MOE_ROWS + warp * MOE_RPW;
    const uint8_t *We = W + (size_t)e * n_out * row_bytes;
    for (int b = 0; b < n; b += MOE_TOK) {
        const int nb = min(MOE_TOK, n - b);
        int ent[MOE_TOK];
#pragma unroll
        for (int q = 0; q < MOE_TOK; q++) ent[q] = q < nb ? list[o0 + b + q] : -1;
        for (int rr = 0; rr < MOE_RPW; rr++) {
            const int r = r0 + rr;
            if (r >= n_out) break;
            float acc[MOE_TOK];
#pragma unroll
            for (int q = 0; q < MOE_TOK; q++) acc[q] = 0.0f;
            for (int c = lane; c < n_in / 32; c += 32) {
                float w[32];
                deq32<T>(We + (size_t)r * row_bytes, c, w);
#pragma unroll
                for (int q = 0; q < MOE_TOK; q++) {
                    if (ent[q] < 0) continue;
                    const float4 *xr = (const float4 *)(x + (size_t)(ent[q] / x_div) * n_in + 32 * c);
                    float a = 0.0f;
#pragma unroll
                    for (int v = 0; v < 8; v++) {
                        const float4 xv = xr[v];
                        a += w[4 * v] * xv.x + w[4 * v + 1] * xv.y + w[4 * v + 2] * xv.z + w[4 * v + 3] * xv.w;
                    }
                    acc[q] += a;
                }
            }
#pragma unroll
            for (int q = 0; q < MOE_TOK; q++) {
                if (ent[q] < 0) continue;
                const float v = warp_sum(acc[q]);
                if (lane == 0) y[(size_t)ent[q] * n_out + r] = v;
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

extern "C" int kc_glu(const float *gu, float *out, int n_tok, int n_ff, int act, int split, const float *row_w, cudaStream_t s) {
    if (!gu || !out || n_tok <= 0 || n_ff <= 0 || (act != MDL_ACT_SILU && act != MDL_ACT_GELU_TANH)) return CM_EINVAL;
    const size_t n = (size_t)n_tok * n_ff;
    kc_launch(glu_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, s, gu, out, n_ff, n, act == MDL_ACT_GELU_TANH ? 1 : 0,
              split ? 1 : 0, row_w);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_moe_route(const float *logits, int n_tok, int n_exp, int k, int norm, int32_t *idx, float *w,
                            int32_t *cnt, int32_t *off, int32_t *list, cudaStream_t s) {
    if (!logits || !idx || !w || !cnt || !off || !list || n_tok <= 0 || n_exp <= 0 || n_exp > MDL_MAX_EXPERTS || k <= 0 ||
        k > n_exp)
        return CM_EINVAL;
    kc_launch(moe_route_kernel, dim3((n_tok + ROUTE_WARPS - 1) / ROUTE_WARPS), dim3(ROUTE_WARPS * 32), 0, s, logits, n_tok, n_exp, k,
              norm ? 1 : 0, idx, w);
    kc_launch(moe_sort_kernel, dim3(1), dim3(1024), 0, s, (const int32_t *)idx, n_tok * k, n_exp, cnt, off, list);
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

extern "C" int kc_moe_type_ok(int type, int n_in) {
    switch (type) {
    case DT_F16: return n_in % 8 == 0;
    case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_Q8_0: return n_in % 32 == 0;
    case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: return n_in % 256 == 0;
    default: return 0;
    }
}

extern "C" int kc_moe_gemv_t(const void *W, int type, int n_exp, int n_in, int n_out, const float *x, int x_div, const int32_t *cnt,
                             const int32_t *off, const int32_t *list, int n_ent, float *y, cudaStream_t s) {
    if (!W || !x || !y || !cnt || !off || !list || n_exp <= 0 || n_in <= 0 || n_out <= 0 || x_div <= 0 || n_ent <= 0 ||
        !kc_moe_type_ok(type, n_in))
        return CM_EINVAL;
    if (type == DT_F16) return kc_moe_gemv((const kc_half *)W, n_exp, n_in, n_out, x, x_div, cnt, off, list, n_ent, y, s);
    const dim3 grid(n_ent < n_exp ? n_ent : n_exp, (n_out + MOE_ROWS - 1) / MOE_ROWS), block(MOE_WARPS * 32);
    const uint8_t *w = (const uint8_t *)W;
    const size_t rb = dt_row_size(type, n_in);
#define MOE_Q(T) \
    case T: kc_launch(moe_gemvq_kernel<T>, grid, block, 0, s, w, rb, x, y, cnt, off, list, n_in, n_out, x_div, n_exp); break;
    switch (type) {
        MOE_Q(DT_Q4_0)
        MOE_Q(DT_Q4_1)
        MOE_Q(DT_Q5_0)
        MOE_Q(DT_Q5_1)
        MOE_Q(DT_Q8_0)
        MOE_Q(DT_Q4_K)
        MOE_Q(DT_Q5_K)
        MOE_Q(DT_Q6_K)
    default: return CM_EUNSUPPORTED;
    }
#undef MOE_Q
    KC_LAUNCH_CHECK();
}

extern "C" int kc_moe_combine(const float *y, float *out, int n_tok, int k, int n, int accumulate, cudaStream_t s) {
    if (!y || !out || n_tok <= 0 || k <= 0 || n <= 0) return CM_EINVAL;
    kc_launch(moe_combine_kernel, dim3(n_tok), dim3(256), 0, s, y, out, k, n, accumulate ? 1 : 0);
    KC_LAUNCH_CHECK();
}
