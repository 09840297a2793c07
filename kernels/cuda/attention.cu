// attention: causal GQA attention over the paged KV cache (flash-decoding: split-K partials,
// merged by the last split's CTA of each (token, head), or by a second kernel when no counters
// are given). One CTA per (query token, head, split).
#include "attn_common.cuh"

extern "C" {
#include "kcuda.h"
}

KC_TRACE_TU(attention)

#define ATT_WARPS 4

// F8: the cache holds E4M3 codes and scales (attn_common.cuh), else halves.
template <int HD, int G, bool F8>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attn_kernel(const float *q, const void *k_cache, const void *v_cache, att_emit em, float *partial, int *counters,
            const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_head, int n_kv,
            int block_size, float scale, int n_split, int chunk, int splits, int kv_ready, float softcap, int window) {
    KC_TRACE_SCOPE(KC_TR_ATTN);
    // lanes per key: each lane owns 8 consecutive dims; a head dim of 96 takes 16 lanes, the last
    // 4 idle (their dims zero: they add nothing to the score and are not stored)
    constexpr int LPK = HD == 96 ? 16 : HD / 8;
    constexpr int KPW = 32 / LPK; // keys a warp handles at once
    __shared__ float sm_m[ATT_WARPS * KPW], sm_l[ATT_WARPS * KPW];
    __shared__ float sm_acc[ATT_WARPS * KPW][HD];

    kc_pdl_trigger();
    // pos, seq and the block tables were staged before the step's first kernel, so they can be
    // read before the wait. With kv_ready (a pure decode step: each token is its sequence's only
    // new one) every key below a token's own position was written by earlier steps, so the
    // first key groups are loaded before the wait too, overlapping the kernels before this one;
    // only q and the token's own key (written by the RoPE kernel just before) wait.
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane % LPK, kslot = lane / LPK;
    const bool dims = sub * 8 < HD; // the lane owns dims of the head
    const int kvh = h / (n_head / n_kv);
    const int p = pos[t];
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    const int len = kc_att_split_len(p, chunk, splits); // this token's key ranges
    const int start = split * len, end = min(start + len, p + 1);
    const int lo = window > 0 ? max(0, p - window + 1) : 0; // sliding window: keys below lo are masked (never loaded)
    const size_t row = ((size_t)t * n_head + h) * HD;
    // A split past this token's position holds no key: the merge reads only the splits below
    // pos / len + 1, so nothing is written (launching more splits than a sequence needs costs
    // one CTA start each, and the result does not depend on how many were launched).
    if (n_split > 1 && start > p) {
        kc_pdl_wait();
        return;
    }

    // G key groups per iteration: their K and V loads are in flight together. Keys are taken
    // in the same order (ascending per slot) whatever G is.
    constexpr int STRIDE = ATT_WARPS * KPW;
    uint4 kv[G], vv[G];
    bool valid[G];
    // key j's 8 values of this lane, K and V
    auto fetch = [&](int j, uint4 &k8, uint4 &v8) {
        if constexpr (F8) {
            k8 = kv_f8_load8((const uint8_t *)k_cache, bt[j / block_size], j % block_size, kvh, n_kv, block_size, HD, sub * 8);
            v8 = kv_f8_load8((const uint8_t *)v_cache, bt[j / block_size], j % block_size, kvh, n_kv, block_size, HD, sub * 8);
        } else {
            size_t base = (((size_t)bt[j / block_size] * n_kv + kvh) * block_size + j % block_size) * HD + sub * 8;
            k8 = __ldcg((const uint4 *)((const __half *)k_cache + base));
            v8 = __ldcg((const uint4 *)((const __half *)v_cache + base));
        }
    };
    // loads the G groups from j0 (all of them, or only the keys below p: `old_only`)
    auto load = [&](int j0, bool old_only) {
#pragma unroll
        for (int u = 0; u < G; u++) {
            int j = j0 + u * STRIDE + kslot;
            valid[u] = j < end && j >= lo;
            kv[u] = make_uint4(0, 0, 0, 0);
            vv[u] = make_uint4(0, 0, 0, 0);
            if (!old_only || j < p) {
                if (valid[u] && dims) fetch(j, kv[u], vv[u]);
            }
        }
    };
    const int j_first = start + warp * KPW;
    if (kv_ready && j_first < end) load(j_first, true);
    kc_pdl_wait();
    if (kv_ready && j_first < end) { // the token's own key, written by the kernel before
#pragma unroll
        for (int u = 0; u < G; u++) {
            int j = j_first + u * STRIDE + kslot;
            if (j == p && dims) fetch(j, kv[u], vv[u]);
        }
    }

    float qv[8];
    const float *qh = q + row + sub * 8;
#pragma unroll
    for (int e = 0; e < 8; e++) qv[e] = dims ? qh[e] * scale : 0.0f;

    float m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] = 0.0f;

    for (int j0 = j_first; j0 < end && end > lo; j0 += G * STRIDE) {
        if (!kv_ready || j0 != j_first) load(j0, false);
#pragma unroll
        for (int u = 0; u < G; u++) {
            float s = 0.0f;
            const __half2 *kh = (const __half2 *)&kv[u];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 f = __half22float2(kh[e]);
                s = fmaf(qv[2 * e], f.x, s);
                s = fmaf(qv[2 * e + 1], f.y, s);
            }
#pragma unroll
            for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            if (valid[u]) {
                float m_new = fmaxf(m, s);
                float corr = __expf(m - m_new), w = __expf(s - m_new);
                const __half2 *vh = (const __half2 *)&vv[u];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 f = __half22float2(vh[e]);
                    acc[2 * e] = acc[2 * e] * corr + w * f.x;
                    acc[2 * e + 1] = acc[2 * e + 1] * corr + w * f.y;
                }
                l = l * corr + w;
                m = m_new;
            }
        }
    }
    const int g = warp * KPW + kslot;
    if (sub == 0) { sm_m[g] = m; sm_l[g] = l; }
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (dims) sm_acc[g][sub * 8 + e] = acc[e];
    __syncthreads();

    float *pp = partial + ((size_t)t * n_head + h) * n_split * (HD + 2);
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float M = -INFINITY;
        for (int i = 0; i < ATT_WARPS * KPW; i++) M = fmaxf(M, sm_m[i]);
        float L = 0.0f, O = 0.0f;
        if (M > -INFINITY)
            for (int i = 0; i < ATT_WARPS * KPW; i++) {
                float c = __expf(sm_m[i] - M);
                L += sm_l[i] * c;
                O += sm_acc[i][e] * c;
            }
        if (n_split == 1) {
            att_finish<HD>(em, row, e, L > 0.0f ? O / L : 0.0f);
        } else {
            float *ps = pp + split * (HD + 2);
            if (e == 0) { ps[0] = M; ps[1] = L; }
            ps[2 + e] = O;
        }
    }
    if (n_split == 1 || !counters) return;
    // The last split of (t, h) to finish merges them all, in split order: the result does not
    // depend on which CTA was last.
    const int n_valid = min(n_split, p / len + 1);
    if (!att_last_split(counters + (size_t)t * n_head + h, n_valid)) return;
    att_merge<HD, G == 8 ? 16 : 4>(pp, n_valid, em, row);
}

template <int HD>
__global__ void attn_merge_kernel(const float *partial, att_emit em, const int32_t *pos, int n_head, int n_split, int chunk,
                                  int splits) {
    KC_TRACE_SCOPE(KC_TR_ATTN_MERGE);
    kc_pdl_trigger();
    kc_pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y;
    const float *pp = partial + ((size_t)t * n_head + h) * n_split * (HD + 2);
    const int n_valid = min(n_split, pos[t] / kc_att_split_len(pos[t], chunk, splits) + 1); // the splits with its keys
    att_merge<HD, 16>(pp, n_valid, em, ((size_t)t * n_head + h) * HD);
}

template <int HD, bool F8>
static void launch(const float *q, const void *k, const void *v, const att_emit &em, float *partial, int *counters,
                   const int32_t *pos, const int32_t *seq, const int32_t *bt, int max_blocks, int n_tok, int n_head, int n_kv,
                   int bs, float scale, int n_split, int chunk, int splits, int kv_ready, cudaStream_t s) {
    dim3 grid(n_tok, n_head, n_split);
    const kc_attn_mods mods = kc_attention_mods_get();
    // Key groups whose loads are in flight together: many for a few tokens (the step is one
    // round trip per split), 2 for large batches, where the grid alone keeps memory busy and
    // fewer registers keep more CTAs resident (llama2-7b, 128 sequences: 12.8 ms per step with
    // 2, 14.7 with 8; bench/RESULTS.md). The order keys are taken in is the same for every G.
    const int G = n_tok > 8 ? 2 : HD >= 128 ? 8 : 4;
    auto kern = G == 2 ? attn_kernel<HD, 2, F8> : G == 4 ? attn_kernel<HD, 4, F8> : attn_kernel<HD, 8, F8>;
    kc_launch(kern, grid, dim3(ATT_WARPS * 32), 0, s, q, k, v, em, partial, counters,
              pos, seq, bt, max_blocks, n_head, n_kv, bs, scale, n_split, chunk, splits, kv_ready, mods.softcap, mods.window);
    if (n_split > 1 && !counters)
        kc_launch(attn_merge_kernel<HD>, dim3(n_tok, n_head), dim3(HD < 32 ? 32 : HD), 0, s, (const float *)partial, em, pos,
                  n_head, n_split, chunk, splits);
}

extern "C" int kc_attention(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out,
                            const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                            int n_tok, int n_head, int n_kv, int hd, int block_size, float scale, int n_split, int chunk,
                            float *partial, cudaStream_t s) {
    return kc_attention_ex(q, k_cache, v_cache, out, NULL, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, hd,
                           block_size, scale, n_split, chunk, 0, partial, NULL, 0, s);
}

template <bool F8>
static int attention_ex(const float *q, const void *k_cache, const void *v_cache, float *out, kc_xq *xq,
                        const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                        int n_tok, int n_head, int n_kv, int hd, int block_size, float scale, int n_split, int chunk,
                        int splits, float *partial, int *counters, int kv_ready, cudaStream_t s) {
    if (!q || !k_cache || !v_cache || !pos || !seq || !block_tables || n_tok <= 0 || n_head <= 0 || n_kv <= 0 ||
        n_head % n_kv || n_split <= 0 || chunk <= 0 || splits < 0 || (n_split > 1 && !partial))
        return CM_EINVAL;
    const int nq = n_head * hd;
    const bool quant = xq && hd % 32 == 0 && n_tok <= xq->cap_tok && nq <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (!out && !quant) return CM_EINVAL; /* nothing would be written */
    if (xq) xq->n = quant ? nq : 0;
    att_emit em = { out, quant && !xq->no_ints ? xq->qh : nullptr, quant ? xq->ql : nullptr, quant ? xq->m : nullptr,
                    quant ? (__half *)xq->xh : nullptr };
#define ATT_CASE(H)                                                                                                        \
    case H:                                                                                                                \
        launch<H, F8>(q, k_cache, v_cache, em, partial, counters, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv,   \
                  block_size, scale, n_split, chunk, splits, kv_ready, s);                                                 \
        break;
    switch (hd) {
        ATT_CASE(8)
        ATT_CASE(16)
        ATT_CASE(32)
        ATT_CASE(64)
        ATT_CASE(96)
        ATT_CASE(128)
        ATT_CASE(256)
    default: return CM_EUNSUPPORTED;
    }
#undef ATT_CASE
    KC_LAUNCH_CHECK();
}

extern "C" int kc_attention_ex(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out, kc_xq *xq,
                               const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                               int n_tok, int n_head, int n_kv, int hd, int block_size, float scale, int n_split, int chunk,
                               int splits, float *partial, int *counters, int kv_ready, cudaStream_t s) {
    return attention_ex<false>(q, k_cache, v_cache, out, xq, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, hd,
                               block_size, scale, n_split, chunk, splits, partial, counters, kv_ready, s);
}

extern "C" int kc_attention_ex_f8(const float *q, const void *k_cache, const void *v_cache, float *out, kc_xq *xq,
                                  const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                                  int n_tok, int n_head, int n_kv, int hd, int block_size, float scale, int n_split, int chunk,
                                  int splits, float *partial, int *counters, int kv_ready, cudaStream_t s) {
    return attention_ex<true>(q, k_cache, v_cache, out, xq, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, hd,
                              block_size, scale, n_split, chunk, splits, partial, counters, kv_ready, s);
}

// A (pair, K or V) a CTA: the block's rows r, heads h, 8 values at a time, from the FP8 layout
// ([bs][n_kv][hd] codes, then [n_kv][bs] scales) to the F16 one ([n_kv][bs][hd] halves).
__global__ void kv_f8_to_half_kernel(const uint8_t *k8, const uint8_t *v8, __half *kh, __half *vh, const int32_t *pairs, int n_kv,
                                     int hd, int bs) {
    kc_pdl_trigger();
    kc_pdl_wait();
    const int src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
    const uint8_t *cache = blockIdx.y ? v8 : k8;
    __half *out = (blockIdx.y ? vh : kh) + (size_t)dst * n_kv * bs * hd;
    const int per_row = hd / 8, n = bs * n_kv * per_row;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int c = i % per_row, rh = i / per_row, r = rh / n_kv, h = rh % n_kv; // rh = r n_kv + h: the FP8 order
        *(uint4 *)(out + ((size_t)h * bs + r) * hd + 8 * c) = kv_f8_load8(cache, (size_t)src, r, h, n_kv, bs, hd, 8 * c);
    }
}

extern "C" int kc_kv_f8_to_half(const void *k8, const void *v8, kc_half *kh, kc_half *vh, const int32_t *pairs, int n_pairs, int n_kv,
                                int hd, int block_size, cudaStream_t s) {
    if (!k8 || !v8 || !kh || !vh || !pairs || n_pairs < 0 || n_kv <= 0 || hd <= 0 || hd % 8 || block_size <= 0) return CM_EINVAL;
    if (!n_pairs) return 0;
    kc_launch(kv_f8_to_half_kernel, dim3(n_pairs, 2), dim3(256), 0, s, (const uint8_t *)k8, (const uint8_t *)v8, (__half *)kh,
              (__half *)vh, pairs, n_kv, hd, block_size);
    KC_LAUNCH_CHECK();
}
