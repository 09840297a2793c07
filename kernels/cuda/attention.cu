// attention: causal GQA attention over the paged KV cache (flash-decoding: split-K partials
// merged by a second kernel). One CTA per (query token, head, split).
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}

#define ATT_WARPS 4

template <int HD>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attn_kernel(const float *__restrict__ q, const __half *__restrict__ k_cache, const __half *__restrict__ v_cache,
            float *__restrict__ out, float *__restrict__ partial, const int32_t *__restrict__ pos,
            const int32_t *__restrict__ seq, const int32_t *__restrict__ block_tables, int max_blocks, int n_head,
            int n_kv, int block_size, float scale, int n_split, int chunk) {
    constexpr int LPK = HD / 8;  // lanes per key: each lane owns 8 consecutive dims
    constexpr int KPW = 32 / LPK; // keys a warp handles at once
    __shared__ float sm_m[ATT_WARPS * KPW], sm_l[ATT_WARPS * KPW];
    __shared__ float sm_acc[ATT_WARPS * KPW][HD];

    kc_pdl_trigger();
    kc_pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane % LPK, kslot = lane / LPK;
    const int kvh = h / (n_head / n_kv);
    const int p = pos[t];
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    const int start = split * chunk, end = min(start + chunk, p + 1);
    // A split past this token's position holds no key: the merge reads only the splits below
    // pos / chunk + 1, so nothing is written (launching more splits than a sequence needs costs
    // one CTA start each, and the result does not depend on how many were launched).
    if (n_split > 1 && start > p) return;

    float qv[8];
    const float *qh = q + ((size_t)t * n_head + h) * HD + sub * 8;
#pragma unroll
    for (int e = 0; e < 8; e++) qv[e] = qh[e] * scale;

    float m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] = 0.0f;

    // Two key groups per iteration: their K and V loads are in flight together.
    constexpr int STRIDE = ATT_WARPS * KPW;
    for (int j0 = start + warp * KPW; j0 < end; j0 += 2 * STRIDE) {
        uint4 kv[2], vv[2];
        bool valid[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int j = j0 + u * STRIDE + kslot;
            valid[u] = j < end;
            kv[u] = make_uint4(0, 0, 0, 0);
            vv[u] = make_uint4(0, 0, 0, 0);
            if (valid[u]) {
                size_t base = (((size_t)bt[j / block_size] * n_kv + kvh) * block_size + j % block_size) * HD + sub * 8;
                kv[u] = *(const uint4 *)(k_cache + base);
                vv[u] = *(const uint4 *)(v_cache + base);
            }
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
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
    for (int e = 0; e < 8; e++) sm_acc[g][sub * 8 + e] = acc[e];
    __syncthreads();

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
            out[((size_t)t * n_head + h) * HD + e] = L > 0.0f ? O / L : 0.0f;
        } else {
            float *pp = partial + (((size_t)t * n_head + h) * n_split + split) * (HD + 2);
            if (e == 0) { pp[0] = M; pp[1] = L; }
            pp[2 + e] = O;
        }
    }
}

__global__ void attn_merge_kernel(const float *__restrict__ partial, float *__restrict__ out, const int32_t *__restrict__ pos,
                                  int n_head, int hd, int n_split, int chunk) {
    kc_pdl_trigger();
    kc_pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y;
    const float *pp = partial + ((size_t)t * n_head + h) * n_split * (hd + 2);
    const int n_valid = min(n_split, pos[t] / chunk + 1); // the splits that hold keys of this token
    float M = -INFINITY;
    for (int i = 0; i < n_valid; i++) M = fmaxf(M, pp[i * (hd + 2)]);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float L = 0.0f, O = 0.0f;
        if (M > -INFINITY)
            for (int i = 0; i < n_valid; i++) {
                const float *pi = pp + i * (hd + 2);
                float c = __expf(pi[0] - M);
                L += pi[1] * c;
                O += pi[2 + e] * c;
            }
        out[((size_t)t * n_head + h) * hd + e] = L > 0.0f ? O / L : 0.0f;
    }
}

template <int HD>
static void launch(const float *q, const kc_half *k, const kc_half *v, float *out, float *partial, const int32_t *pos,
                   const int32_t *seq, const int32_t *bt, int max_blocks, int n_tok, int n_head, int n_kv, int bs,
                   float scale, int n_split, int chunk, cudaStream_t s) {
    dim3 grid(n_tok, n_head, n_split);
    kc_launch(attn_kernel<HD>, grid, dim3(ATT_WARPS * 32), 0, s, q, (const __half *)k, (const __half *)v, out, partial, pos, seq,
              bt, max_blocks, n_head, n_kv, bs, scale, n_split, chunk);
}

extern "C" int kc_attention(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out,
                            const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                            int n_tok, int n_head, int n_kv, int hd, int block_size, float scale, int n_split, int chunk,
                            float *partial, cudaStream_t s) {
    if (!q || !k_cache || !v_cache || !out || !pos || !seq || !block_tables || n_tok <= 0 || n_head <= 0 || n_kv <= 0 ||
        n_head % n_kv || n_split <= 0 || chunk <= 0 || (n_split > 1 && !partial))
        return CM_EINVAL;
    switch (hd) {
    case 8: launch<8>(q, k_cache, v_cache, out, partial, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, block_size, scale, n_split, chunk, s); break;
    case 16: launch<16>(q, k_cache, v_cache, out, partial, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, block_size, scale, n_split, chunk, s); break;
    case 32: launch<32>(q, k_cache, v_cache, out, partial, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, block_size, scale, n_split, chunk, s); break;
    case 64: launch<64>(q, k_cache, v_cache, out, partial, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, block_size, scale, n_split, chunk, s); break;
    case 128: launch<128>(q, k_cache, v_cache, out, partial, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, block_size, scale, n_split, chunk, s); break;
    case 256: launch<256>(q, k_cache, v_cache, out, partial, pos, seq, block_tables, max_blocks, n_tok, n_head, n_kv, block_size, scale, n_split, chunk, s); break;
    default: return CM_EUNSUPPORTED;
    }
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && n_split > 1) {
        dim3 grid(n_tok, n_head);
        kc_launch(attn_merge_kernel, grid, dim3(hd < 32 ? 32 : hd), 0, s, (const float *)partial, out, pos, n_head, hd, n_split,
                  chunk);
    }
    KC_LAUNCH_CHECK();
}
