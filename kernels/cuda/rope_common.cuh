// The rotation's device helpers, shared by the RoPE kernels (rope.cu) and the one-token Q|K|V
// GEMV that rotates its own heads (matmul.cu, the plan's qkv_rope): one code, the same bits.
#pragma once
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
#include "model/model.h"
}

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

// The rotation of pair (x0, x1) by an angle whose sine and cosine (mscale applied) are s and c;
// explicit roundings, so that every kernel gives the same bits.
__device__ __forceinline__ void rope_rot(float x0, float x1, float s, float c, float &y0, float &y1) {
    y0 = __fmaf_rn(x0, c, __fmul_rn(-x1, s));
    y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

// Token t's row in a layer's paged cache: the block row of KV head 0 (element (slot + h
// block_size) hd holds head h's values), from its position and sequence.
__device__ __forceinline__ size_t rope_cache_slot(const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int t,
                                                  int max_blocks, int n_kv, int block_size) {
    const int p = pos[t];
    return (size_t)block_tables[(size_t)seq[t] * max_blocks + p / block_size] * n_kv * block_size + p % block_size;
}

// Threads of a CTA that rotate one head (rope_head): 64 from head dim 128 on, else 32.
__device__ __forceinline__ int rope_head_threads(int hd) { return hd >= 128 ? 64 : 32; }

// One q or k head of a token at position p: QK-norm first where nw is set (y = x * rsqrt(mean(x^2)
// + eps) * nw), then the rotation, by the threads tid < nt of the CTA (rope_head_threads; every
// thread of the CTA calls it: it holds a __syncthreads where nw is set). src: the head's hd values;
// s0, c0: the sine and cosine of pair tid's angle where tid < rope_dim / 2 (mscale not applied).
// The result as f32 into qd, or as half into kd, or as f32 into hv (exactly one is set). red: two
// floats of shared memory.
__device__ __forceinline__ void rope_head(const float *src, const float *nw, float *qd, __half *kd, float *hv, int hd, int p,
                                          float s0, float c0, const kc_rope &r, int tid, int nt, float *red) {
    const int half_rot = tid < nt ? r.rope_dim / 2 : 0, n = tid < nt ? hd : 0; // threads past nt: no element
    const float ms = r.mscale > 0.0f ? r.mscale : 1.0f;
    float nr = 1.0f;
    if (nw) {
        float ss = 0.0f;
        for (int e = tid; e < n; e += nt) ss += src[e] * src[e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (tid < nt && (tid & 31) == 0) red[tid >> 5] = ss;
        __syncthreads();
        ss = nt > 32 ? red[0] + red[1] : red[0];
        nr = rsqrtf(ss / (float)hd + r.norm_eps);
    }
    auto val = [&](int e) { return nw ? src[e] * nr * nw[e] : src[e]; };
    for (int i = tid; i < half_rot; i += nt) {
        int a, b;
        rope_pair(r, i, &a, &b);
        float s = s0, c = c0;
        if (i != tid) sincosf((float)p * rope_freq(r, i), &s, &c);
        s = __fmul_rn(s, ms);
        c = __fmul_rn(c, ms);
        float y0, y1;
        rope_rot(val(a), val(b), s, c, y0, y1);
        if (qd) { qd[a] = y0; qd[b] = y1; }
        else if (hv) { hv[a] = y0; hv[b] = y1; }
        else { kd[a] = __float2half(y0); kd[b] = __float2half(y1); }
    }
    for (int e = r.rope_dim + tid; e < n; e += nt) { // dimensions past rope_dim: unrotated
        if (qd) qd[e] = val(e);
        else if (hv) hv[e] = val(e);
        else kd[e] = __float2half(val(e));
    }
}
