// attn_common: what the attention kernels share: how a finished (token, head) row is written
// (f32 and/or the wo GEMV's int8 blocks), the merge of split-K partials, and the handshake that
// lets the last split's CTA do that merge.
#pragma once

#include "kc_common.cuh"

#include <cuda_fp8.h>

// FP8 KV cache (kcuda.h, the CPU's layout): one layer's block b holds the codes [bs][n_kv][hd]
// (E4M3 bytes), then the scales [n_kv][bs] f32: a head's scales of the block's positions are
// side by side, so a decode warp's 16 positions take two 32-byte sectors (kv_f8_scale). The
// prefill and per-head kernels read 8 values
// of a (block, row, head) at a time as halves: code x scale in f32, rounded to half, so the rest
// of each kernel is the F16 cache's. (The tensor-core decode kernel takes the codes as exact
// halves and applies the scales in f32: attention_tc.cu.)
__device__ __forceinline__ uint4 kv_f8_expand8(uint2 c, float s) {
    const uint32_t u[2] = { c.x, c.y };
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((u[k >> 1] >> (16 * (k & 1))) & 0xffff), __NV_E4M3);
        const float2 f = __half22float2(*(const __half2 *)&hr);
        o[k] = kc_pack_h2(f.x * s, f.y * s);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}
// Values col..col + 7 (col % 8 == 0) of row r, head h of block b as 8 halves. Loads bypass L1
// (the cache was written by an earlier kernel of the step).
// The scale of row r, head h of a block: its byte offset from the block's start.
__host__ __device__ __forceinline__ size_t kv_f8_scale(int r, int h, int n_kv, int bs, int hd) {
    return (size_t)bs * n_kv * hd + ((size_t)h * bs + r) * 4;
}
__device__ __forceinline__ uint4 kv_f8_load8(const uint8_t *cache, size_t b, int r, int h, int n_kv, int bs, int hd, int col) {
    const uint8_t *blk = cache + b * ((size_t)bs * n_kv * (hd + 4));
    const size_t rh = (size_t)r * n_kv + h;
    const uint2 c = __ldcg((const uint2 *)(blk + rh * hd + col));
    const float s = __ldcg((const float *)(blk + kv_f8_scale(r, h, n_kv, bs, hd)));
    return kv_f8_expand8(c, s);
}

// The finished output of one (token, head): element e written to out, and when xq is given
// (hd % 32 == 0) into its two-level int8 blocks for the wo GEMV (or only its half copy:
// kc_xq.no_ints). Threads loop over e in steps
// of blockDim.x (a multiple of 32), so a warp's 32 values are always one block.
struct att_emit {
    float *out;
    int8_t *qh, *ql;
    int32_t *qm;
    __half *xh;
};

template <int HD>
__device__ __forceinline__ void att_finish(const att_emit &em, size_t row, int e, float v) {
    if (em.out) em.out[row + e] = v; // NULL: only the blocks
    if ((em.qh || em.xh) && HD % 32 == 0) kc_xq_block1(v, em.qh, em.ql, em.qm, em.xh, row + e); // qh NULL: xh only
}

// Merge of the splits of (t, h) that hold keys (n_valid of them) from `partial`. The first B
// splits' maxima, sums and outputs are loaded together (one L2 round trip instead of one per
// few splits: the merge sits between attention and the wo GEMV); any further splits are read
// in a loop. Splits are added in order either way. B = 16 costs registers: only the kernels
// with 8 key groups in flight (few tokens, hd >= 128), which hold that many already, take it;
// the others keep 4 (llama2-7b F16, 128 sequences: 16 took the 2-group kernel from 55 to 94
// registers and the step from 12.7 to 13.9 ms).
template <int HD, int B>
__device__ void att_merge(const float *pp, int n_valid, const att_emit &em, size_t row) {
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float mv[B], lv[B], ov[B];
#pragma unroll
        for (int i = 0; i < B; i++) {
            mv[i] = -INFINITY;
            lv[i] = ov[i] = 0.0f;
            if (i < n_valid) {
                const float *pi = pp + i * (HD + 2);
                mv[i] = __ldcg(pi);
                lv[i] = __ldcg(pi + 1);
                ov[i] = __ldcg(pi + 2 + e);
            }
        }
        float M = -INFINITY;
#pragma unroll
        for (int i = 0; i < B; i++) M = fmaxf(M, mv[i]);
        for (int i = B; i < n_valid; i++) M = fmaxf(M, __ldcg(pp + i * (HD + 2)));
        float L = 0.0f, O = 0.0f;
        if (M > -INFINITY) {
#pragma unroll
            for (int i = 0; i < B; i++)
                if (i < n_valid) {
                    float c = __expf(mv[i] - M);
                    L += lv[i] * c;
                    O += ov[i] * c;
                }
            for (int i = B; i < n_valid; i++) {
                const float *pi = pp + i * (HD + 2);
                float c = __expf(__ldcg(pi) - M);
                L += __ldcg(pi + 1) * c;
                O += __ldcg(pi + 2 + e) * c;
            }
        }
        att_finish<HD>(em, row, e, L > 0.0f ? O / L : 0.0f);
    }
}

// att_group and att_last_split, the split merge's threads and handshake: kc_common.cuh


// The first half of a split merge, by the threads of g: the maxima m and sums l of n_rows
// rows' n_valid partials (row r, split sp at pp + (r n_split + sp)(HD + 2)) come to shared
// memory in one pass; then per row (a warp a row) the weights exp(m - M) replace the maxima and
// the row's total sum L is formed. red: c [n_rows][n_valid], l [n_rows][n_valid], L [n_rows].
// Returns c.
template <int HD>
__device__ float *split_weights(const float *pp, int n_split, int n_rows, int n_valid, float *red, const att_group &g) {
    const int t = g.tid(), lane = t & 31, warp = t >> 5, nw = g.nt >> 5;
    float *sm_c = red, *sm_l = red + n_rows * n_valid, *sm_L = red + 2 * n_rows * n_valid;
    for (int i = t; i < n_rows * n_valid; i += g.nt) {
        const int r = i / n_valid, sp = i - r * n_valid;
        const float *pi = pp + ((size_t)r * n_split + sp) * (HD + 2);
        sm_c[i] = __ldcg(pi);
        sm_l[i] = __ldcg(pi + 1);
    }
    g.sync();
    for (int r = warp; r < n_rows; r += nw) {
        float M = -INFINITY;
        for (int sp = lane; sp < n_valid; sp += 32) M = fmaxf(M, sm_c[r * n_valid + sp]);
        M = kc_warp_max(M);
        float L = 0.0f;
        for (int sp = lane; sp < n_valid; sp += 32) {
            const float c = M > -INFINITY ? __expf(sm_c[r * n_valid + sp] - M) : 0.0f;
            sm_c[r * n_valid + sp] = c;
            L = fmaf(sm_l[r * n_valid + sp], c, L);
        }
        L = kc_warp_sum(L);
        if (lane == 0) sm_L[r] = L;
    }
    g.sync();
    return sm_c;
}

// The split merge of a prefill tile's rows (rows 0..n_rows-1: token r / G of the tile, head
// r % G) by the NT threads of g (the last split's CTA): split_weights (red: 2 n_rows n_valid +
// n_rows floats), then each thread adds, split by split, the float pairs of R rows it owns
// (consecutive threads on consecutive pairs of a row), the loads of a split in one basic block.
// out0: the tile's first token's first head of this KV head; row r goes to
// out0 + ((r / G) n_head + r % G) HD.
template <int HD, int R, int NT>
__device__ void pf_merge(const float *pp, int n_split, int n_valid, int n_rows, int G, float *out0, int n_head, float *red,
                         const att_group &g) {
    constexpr int NI = R * (HD / 2) / NT; // float pairs a thread
    const int t = g.tid();
    const float *sm_c = split_weights<HD>(pp, n_split, n_rows, n_valid, red, g), *sm_L = sm_c + 2 * n_rows * n_valid;
    float2 acc[NI];
#pragma unroll
    for (int j = 0; j < NI; j++) acc[j] = make_float2(0.0f, 0.0f);
    for (int sp = 0; sp < n_valid; sp++) {
        float2 v[NI];
#pragma unroll
        for (int j = 0; j < NI; j++) { // rows past n_rows read row n_rows - 1 again with weight 0
            const int f = j * NT + t, r = min(f / (HD / 2), n_rows - 1), e = f % (HD / 2);
            v[j] = __ldcg((const float2 *)(pp + ((size_t)r * n_split + sp) * (HD + 2) + 2 + 2 * e));
        }
#pragma unroll
        for (int j = 0; j < NI; j++) {
            const int f = j * NT + t, r = f / (HD / 2);
            const float c = r < n_rows ? sm_c[r * n_valid + sp] : 0.0f;
            acc[j].x = fmaf(v[j].x, c, acc[j].x);
            acc[j].y = fmaf(v[j].y, c, acc[j].y);
        }
    }
#pragma unroll
    for (int j = 0; j < NI; j++) {
        const int f = j * NT + t, r = f / (HD / 2), e = f % (HD / 2);
        if (r >= n_rows) continue;
        const float L = sm_L[r], il = L > 0.0f ? 1.0f / L : 0.0f;
        *(float2 *)(out0 + ((size_t)(r / G) * n_head + r % G) * HD + 2 * e) = make_float2(acc[j].x * il, acc[j].y * il);
    }
}

