// rope: rotary embedding of q and k, with k and v written into the paged KV cache as half.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
#include "model/model.h"
}

// Inverse frequency of rotary pair i (0 <= i < rope_dim/2), with linear or llama3 scaling.
__device__ __forceinline__ float rope_freq(const kc_rope &r, int i) {
    float freq = powf(r.base, -2.0f * (float)i / (float)r.rope_dim);
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

__global__ void rope_store_kernel(const float *__restrict__ qkv, float *__restrict__ q_out, __half *k_cache,
                                  __half *v_cache, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                                  int max_blocks, int n_head, int n_kv, int hd, int block_size, kc_rope r) {
    const int t = blockIdx.x;
    const int p = pos[t];
    const float *row = qkv + (size_t)t * (n_head + 2 * n_kv) * hd;
    const int half_rot = r.rope_dim / 2;
    const int blk = block_tables[(size_t)seq[t] * max_blocks + p / block_size];
    const int off = p % block_size;
    // rotated pairs of q and k heads
    for (int w = threadIdx.x; w < (n_head + n_kv) * half_rot; w += blockDim.x) {
        int h = w / half_rot, i = w % half_rot, a, b;
        rope_pair(r, i, &a, &b);
        float s, c;
        sincosf((float)p * rope_freq(r, i), &s, &c);
        const float *src = row + (size_t)h * hd;
        float x0 = src[a], x1 = src[b];
        float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
        if (h < n_head) {
            float *dst = q_out + ((size_t)t * n_head + h) * hd;
            dst[a] = y0;
            dst[b] = y1;
        } else {
            __half *dst = k_cache + (((size_t)blk * n_kv + (h - n_head)) * block_size + off) * hd;
            dst[a] = __float2half(y0);
            dst[b] = __float2half(y1);
        }
    }
    // dimensions past rope_dim are copied unrotated; v is copied whole
    for (int w = threadIdx.x; w < (n_head + 2 * n_kv) * hd; w += blockDim.x) {
        int h = w / hd, e = w % hd;
        float v = row[(size_t)h * hd + e];
        if (h < n_head) {
            if (e >= r.rope_dim) q_out[((size_t)t * n_head + h) * hd + e] = v;
        } else if (h < n_head + n_kv) {
            if (e >= r.rope_dim) k_cache[(((size_t)blk * n_kv + (h - n_head)) * block_size + off) * hd + e] = __float2half(v);
        } else {
            v_cache[(((size_t)blk * n_kv + (h - n_head - n_kv)) * block_size + off) * hd + e] = __float2half(v);
        }
    }
}

extern "C" int kc_rope_store_kv(const float *qkv, float *q_out, kc_half *k_cache, kc_half *v_cache, const int32_t *pos,
                                const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_tok, int n_head,
                                int n_kv, int hd, int block_size, const kc_rope *rope, cudaStream_t s) {
    if (!qkv || !q_out || !k_cache || !v_cache || !pos || !seq || !block_tables || !rope || n_tok <= 0 || n_head <= 0 ||
        n_kv <= 0 || hd <= 0 || block_size <= 0 || rope->rope_dim <= 0 || rope->rope_dim > hd || rope->rope_dim % 2)
        return CM_EINVAL;
    rope_store_kernel<<<n_tok, 256, 0, s>>>(qkv, q_out, (__half *)k_cache, (__half *)v_cache, pos, seq, block_tables,
                                            max_blocks, n_head, n_kv, hd, block_size, *rope);
    KC_LAUNCH_CHECK();
}
