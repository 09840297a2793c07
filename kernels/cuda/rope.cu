// rope: rotary embedding of q and k, with k and v written into the paged KV cache as half.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
#include "model/model.h"
}

KC_TRACE_TU(rope)

// Inverse frequency of rotary pair i (0 <= i < rope_dim/2), with linear or llama3 scaling.
__device__ __forceinline__ float rope_freq(const kc_rope &r, int i) {
    if (r.freq) return r.freq[i]; // the host's table (kcuda.h)
    float freq = exp2f(-2.0f * (float)i / (float)r.rope_dim * __log2f(r.base));
    if (r.scaling == MDL_ROPE_SCALING_LINEAR) return freq / r.factor;
    if (r.scaling == MDL_ROPE_SCALING_LLAMA3) {
        const float two_pi = 6.283185307179586f;
        float wavelen = two_pi / freq;
        float low_wl = (float)r.orig_ctx / r.low_freq_factor, high_wl = (float)r.orig_ctx / r.high_freq_factor;
        if (wavelen < high_wl) return freq;
        if (wavelen > low_wl) return freq / r.factor;
        float smooth = ((float)r.orig_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        return (1.0f - smooth) * freq / r.factor + smooth * freq;
    }
    return freq;
}

// Index of the two elements of rotary pair i in a head.
__device__ __forceinline__ void rope_pair(const kc_rope &r, int i, int *a, int *b) {
    if (r.layout == MDL_ROPE_ADJACENT) { *a = 2 * i; *b = 2 * i + 1; }
    else { *a = i; *b = i + r.rope_dim / 2; }
}

// One CTA per (token, head): q heads first, then k heads, then v heads. pos, seq and the block
// tables are staged before the step's first kernel (never written by the kernel before this
// one), so the position, the cache slot and the first pair's angle are worked out before the
// programmatic wait; only the QKV values wait.
__global__ void rope_store_kernel(const float *qkv, float *q_out, __half *k_cache,
                                  __half *v_cache, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                                  int max_blocks, int n_head, int n_kv, int hd, int block_size, kc_rope r) {
    KC_TRACE_SCOPE(KC_TR_ROPE);
    kc_pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y;
    const int p = pos[t];
    const int blk = h >= n_head ? block_tables[(size_t)seq[t] * max_blocks + p / block_size] : 0;
    const int half_rot = r.rope_dim / 2, i0 = threadIdx.x;
    float s0 = 0.0f, c0 = 0.0f;
    if (h < n_head + n_kv && i0 < half_rot) sincosf((float)p * rope_freq(r, i0), &s0, &c0);
    const float ms = r.mscale > 0.0f ? r.mscale : 1.0f;
    kc_pdl_wait();
    const float *src = qkv + ((size_t)t * (n_head + 2 * n_kv) + h) * hd;
    if (h >= n_head + n_kv) { // v: copied as half
        __half *dst = v_cache + (((size_t)blk * n_kv + (h - n_head - n_kv)) * block_size + p % block_size) * hd;
        for (int e = threadIdx.x; e < hd; e += blockDim.x) dst[e] = __float2half(src[e]);
        return;
    }
    // QK-norm (r.q_norm set): the head's RMSNorm first, y = x * rsqrt(mean(x^2) + eps) * w
    const float *nw = r.q_norm ? (h < n_head ? r.q_norm : r.k_norm) : nullptr;
    float nr = 1.0f;
    if (nw) {
        __shared__ float red[2];
        float ss = 0.0f;
        for (int e = threadIdx.x; e < hd; e += blockDim.x) ss += src[e] * src[e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
        __syncthreads();
        ss = blockDim.x > 32 ? red[0] + red[1] : red[0];
        nr = rsqrtf(ss / (float)hd + r.norm_eps);
    }
    auto val = [&](int e) { return nw ? src[e] * nr * nw[e] : src[e]; };
    float *qd = nullptr;
    __half *kd = nullptr;
    if (h < n_head) qd = q_out + ((size_t)t * n_head + h) * hd;
    else kd = k_cache + (((size_t)blk * n_kv + (h - n_head)) * block_size + p % block_size) * hd;
    for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
        int a, b;
        rope_pair(r, i, &a, &b);
        float s = s0, c = c0;
        if (i != i0) sincosf((float)p * rope_freq(r, i), &s, &c);
        s *= ms;
        c *= ms;
        float x0 = val(a), x1 = val(b);
        float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
        if (qd) { qd[a] = y0; qd[b] = y1; }
        else { kd[a] = __float2half(y0); kd[b] = __float2half(y1); }
    }
    for (int e = r.rope_dim + threadIdx.x; e < hd; e += blockDim.x) { // dimensions past rope_dim: unrotated
        if (qd) qd[e] = val(e);
        else kd[e] = __float2half(val(e));
    }
}

extern "C" int kc_rope_store_kv(const float *qkv, float *q_out, kc_half *k_cache, kc_half *v_cache, const int32_t *pos,
                                const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_tok, int n_head,
                                int n_kv, int hd, int block_size, const kc_rope *rope, cudaStream_t s) {
    if (!qkv || !q_out || !k_cache || !v_cache || !pos || !seq || !block_tables || !rope || n_tok <= 0 || n_head <= 0 ||
        n_kv <= 0 || hd <= 0 || block_size <= 0 || rope->rope_dim <= 0 || rope->rope_dim > hd || rope->rope_dim % 2)
        return CM_EINVAL;
    dim3 grid(n_tok, n_head + 2 * n_kv);
    if (rope->q_norm && !rope->k_norm) return CM_EINVAL;
    kc_launch(rope_store_kernel, grid, dim3(hd >= 128 ? 64 : 32), 0, s, qkv, q_out, (__half *)k_cache, (__half *)v_cache, pos,
              seq, block_tables, max_blocks, n_head, n_kv, hd, block_size, *rope);
    KC_LAUNCH_CHECK();
}
