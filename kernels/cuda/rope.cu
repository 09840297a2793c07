// rope: rotary embedding of q and k, with k and v written into the paged KV cache as half.
#include "attn_common.cuh"
#include "rope_common.cuh"

#include <cuda_fp8.h>

KC_TRACE_TU(rope)

// FP8 KV cache (kcuda.h): the head's hd values (hv, shared) as E4M3 codes with one scale at
// (block blk, row r, head h): the static scale when there is one, else amax / 448; codes
// e4m3_sat(x / s) (0 when s is 0): dt_fp8_scale / dt_fp8_encode's rounding. Every thread of
// the CTA calls it.
__device__ void f8_store_head(const float *hv, uint8_t *cache, const float *st, int blk, int r, int h, int n_kv, int hd,
                              int block_size) {
    __shared__ float red[32];
    __syncthreads();
    float amax = 0.0f;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) amax = fmaxf(amax, fabsf(hv[e]));
    amax = kc_warp_max(amax);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) amax = fmaxf(amax, red[w]);
    amax = fmaxf(amax, red[0]);
    const float s = st ? st[h] : __fdiv_rn(amax, 448.0f);
    uint8_t *b = cache + (size_t)blk * ((size_t)block_size * n_kv * (hd + 4));
    const size_t rh = (size_t)r * n_kv + h;
    for (int e = threadIdx.x; e < hd; e += blockDim.x)
        b[rh * hd + e] = s != 0.0f ? (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(hv[e], s), __NV_SATFINITE, __NV_E4M3) : 0;
    if (threadIdx.x == 0) *(float *)(b + kv_f8_scale(r, h, n_kv, block_size, hd)) = s;
}

// One CTA per (token, head): q heads first, then k heads, then v heads. pos, seq and the block
// tables are staged before the step's first kernel (never written by the kernel before this
// one), so the position, the cache slot and the first pair's angle are worked out before the
// programmatic wait; only the QKV values wait.
// F8: k_cache / v_cache hold E4M3 codes and scales (f8_store_head; k_st / v_st: static
// scales [n_kv] or NULL), else halves.
template <bool F8>
__global__ void rope_store_kernel(const float *qkv, float *q_out, void *k_cache, void *v_cache, const float *k_st,
                                  const float *v_st, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                                  int max_blocks, int n_head, int n_kv, int hd, int block_size, kc_rope r) {
    KC_TRACE_SCOPE(KC_TR_ROPE);
    kc_pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y;
    const int p = pos[t];
    const int blk = h >= n_head ? block_tables[(size_t)seq[t] * max_blocks + p / block_size] : 0;
    const int half_rot = r.rope_dim / 2, i0 = threadIdx.x;
    float s0 = 0.0f, c0 = 0.0f;
    if (h < n_head + n_kv && i0 < half_rot) sincosf((float)p * rope_freq(r, i0), &s0, &c0);
    kc_pdl_wait();
    const float *src = qkv + ((size_t)t * (n_head + 2 * n_kv) + h) * hd;
    __shared__ float hv[F8 ? 256 : 1]; // F8: the K or V head before encoding
    if (F8 && h >= n_head + n_kv) {
        for (int e = threadIdx.x; e < hd; e += blockDim.x) hv[e] = src[e];
        f8_store_head(hv, (uint8_t *)v_cache, v_st, blk, p % block_size, h - n_head - n_kv, n_kv, hd, block_size);
        return;
    }
    if (h >= n_head + n_kv) { // v: copied as half
        __half *dst = (__half *)v_cache + (((size_t)blk * n_kv + (h - n_head - n_kv)) * block_size + p % block_size) * hd;
        for (int e = threadIdx.x; e < hd; e += blockDim.x) dst[e] = __float2half(src[e]);
        return;
    }
    // QK-norm (r.q_norm set) and the rotation
    const float *nw = r.q_norm ? (h < n_head ? r.q_norm : r.k_norm) : nullptr;
    __shared__ float red[2];
    float *qd = h < n_head ? q_out + ((size_t)t * n_head + h) * hd : nullptr;
    __half *kd = h < n_head || F8 ? nullptr
                                  : (__half *)k_cache + (((size_t)blk * n_kv + (h - n_head)) * block_size + p % block_size) * hd;
    rope_head(src, nw, qd, kd, F8 && !qd ? hv : nullptr, hd, p, s0, c0, r, threadIdx.x, blockDim.x, red);
    if (F8 && h >= n_head) f8_store_head(hv, (uint8_t *)k_cache, k_st, blk, p % block_size, h - n_head, n_kv, hd, block_size);
}

// The token kernels' prologue: token t's angles (sine and cosine of pairs 0 .. half_rot - 1,
// mscale applied) into sn / cs, and its row in the cache (block row of KV head 0) returned, both
// before the programmatic wait (pos, seq and the block tables are staged before the step).
__device__ __forceinline__ size_t rope_tok_begin(const kc_rope &r, int t, int half_rot, float *sn, float *cs, const int32_t *pos,
                                                 const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_kv,
                                                 int block_size) {
    const int p = pos[t];
    const float ms = r.mscale > 0.0f ? r.mscale : 1.0f;
    for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
        float s, c;
        sincosf((float)p * rope_freq(r, i), &s, &c);
        sn[i] = __fmul_rn(s, ms);
        cs[i] = __fmul_rn(c, ms);
    }
    const size_t slot = rope_cache_slot(pos, seq, block_tables, t, max_blocks, n_kv, block_size);
    __syncthreads();
    kc_pdl_wait();
    return slot;
}

// Steps of many tokens (the plan's rope_tok; F16 cache, no QK-norm): one CTA per token and a warp
// per head, the angles of the token's pairs computed once into shared memory instead of once a
// head (a prefill of 8,192 tokens ran 3 M sincosf a layer on (token, head) CTAs of 64 threads).
// The same sincosf, mscale product and rope_rot as rope_store_kernel: the same bits.
__global__ void __launch_bounds__(256) rope_tok_kernel(const float *qkv, float *q_out, __half *k_cache, __half *v_cache,
                                                       const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                                                       int max_blocks, int n_head, int n_kv, int hd, int block_size, kc_rope r) {
    KC_TRACE_SCOPE(KC_TR_ROPE);
    kc_pdl_trigger();
    __shared__ float sn[128], cs[128]; // rope_dim <= hd <= 256
    const int t = blockIdx.x, half_rot = r.rope_dim / 2;
    const size_t slot = rope_tok_begin(r, t, half_rot, sn, cs, pos, seq, block_tables, max_blocks, n_kv, block_size);
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5, nh = n_head + 2 * n_kv;
    const float *row = qkv + (size_t)t * nh * hd;
    for (int h = threadIdx.x >> 5; h < nh; h += nw) {
        const float *src = row + (size_t)h * hd;
        if (h >= n_head + n_kv) { // v: copied as half
            __half *dst = v_cache + (slot + (size_t)(h - n_head - n_kv) * block_size) * hd;
            for (int e = lane; e < hd; e += 32) dst[e] = __float2half(src[e]);
            continue;
        }
        float *qd = h < n_head ? q_out + ((size_t)t * n_head + h) * hd : nullptr;
        __half *kd = h < n_head ? nullptr : k_cache + (slot + (size_t)(h - n_head) * block_size) * hd;
        for (int i = lane; i < half_rot; i += 32) {
            int a, b;
            rope_pair(r, i, &a, &b);
            float y0, y1;
            rope_rot(src[a], src[b], sn[i], cs[i], y0, y1);
            if (qd) qd[a] = y0, qd[b] = y1;
            else kd[a] = __float2half(y0), kd[b] = __float2half(y1);
        }
        for (int e = r.rope_dim + lane; e < hd; e += 32) { // dimensions past rope_dim: unrotated
            if (qd) qd[e] = src[e];
            else kd[e] = __float2half(src[e]);
        }
    }
}

// rope_tok_kernel with every head rotated whole (rope_dim == hd, hd % 8 == 0): a
// thread moves units of 8 values, 4 units at a time with their 8 float4 loads issued together:
// adjacent pairs, two float4 side by side; split halves, a float4 and its partner hd / 2 further;
// v, 8 values as one 16-byte store of halves. The scalar kernel's loads and stores of 4 and 2
// bytes, one round trip at a time, left a prefill's rotation at about half the bandwidth (llama3-8b,
// 8,192 tokens: 4.92 -> 3.12 ms a step on an H200). The same angles, rope_rot and roundings: the
// same bits.
// TIn: qkv as f32, or as half (a prefill's Q|K|V on cuBLAS written as half: kc_rope_store_kv_pf;
// each value converted exactly, so the bits of the f32 kernel on those values). QH: q written as
// half(q_rot x qscale) (the wgmma prefill kernel's operand, as it makes it of f32 q: the same bits),
// else as f32.
__device__ __forceinline__ float4 rope_ld4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 rope_ld4(const __half *p) {
    const uint2 u = *(const uint2 *)p;
    const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
template <typename TIn, bool QH>
__global__ void __launch_bounds__(256) rope_tok_vec_kernel(const TIn *qkv, void *q_out, float qscale, __half *k_cache,
                                                           __half *v_cache, const int32_t *pos, const int32_t *seq,
                                                           const int32_t *block_tables, int max_blocks, int n_head, int n_kv,
                                                           int hd, int block_size, kc_rope r) {
    KC_TRACE_SCOPE(KC_TR_ROPE);
    kc_pdl_trigger();
    __shared__ float sn[128], cs[128]; // hd <= 256
    const int t = blockIdx.x, half_rot = hd / 2;
    const size_t slot = rope_tok_begin(r, t, half_rot, sn, cs, pos, seq, block_tables, max_blocks, n_kv, block_size);
    const int nh = n_head + 2 * n_kv, U = hd / 8, nu = nh * U;
    const bool adj = r.layout == MDL_ROPE_ADJACENT;
    const TIn *row = qkv + (size_t)t * nh * hd;
    // unit u: head u / U, j = u % U; its two float4: at 8 j and 8 j + 4 (adjacent pairs, or v),
    // or at 4 j and 4 j + hd / 2 (split halves)
    auto at = [&](int j, int second) { return adj ? 8 * j + 4 * second : 4 * j + second * half_rot; };
    for (int u0 = threadIdx.x; u0 < nu; u0 += 4 * blockDim.x) {
        float4 a[4], b[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int u = u0 + k * blockDim.x;
            if (u >= nu) continue;
            const int h = u / U, j = u % U;
            const TIn *src = row + (size_t)h * hd;
            const bool v = h >= n_head + n_kv;
            a[k] = rope_ld4(src + (v ? 8 * j : at(j, 0)));
            b[k] = rope_ld4(src + (v ? 8 * j + 4 : at(j, 1)));
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int u = u0 + k * blockDim.x;
            if (u >= nu) continue;
            const int h = u / U, j = u % U;
            if (h >= n_head + n_kv) { // v: copied as half
                __half *dst = v_cache + (slot + (size_t)(h - n_head - n_kv) * block_size) * hd + 8 * j;
                *(uint4 *)dst = make_uint4(kc_pack_h2(a[k].x, a[k].y), kc_pack_h2(a[k].z, a[k].w), kc_pack_h2(b[k].x, b[k].y),
                                           kc_pack_h2(b[k].z, b[k].w));
                continue;
            }
            float4 y0, y1;
            if (adj) { // pairs 4 j .. 4 j + 3: (a.x, a.y), (a.z, a.w), (b.x, b.y), (b.z, b.w)
                const int i = 4 * j;
                rope_rot(a[k].x, a[k].y, sn[i], cs[i], y0.x, y0.y);
                rope_rot(a[k].z, a[k].w, sn[i + 1], cs[i + 1], y0.z, y0.w);
                rope_rot(b[k].x, b[k].y, sn[i + 2], cs[i + 2], y1.x, y1.y);
                rope_rot(b[k].z, b[k].w, sn[i + 3], cs[i + 3], y1.z, y1.w);
            } else { // pairs 4 j + c: (a.c, b.c)
                const int i = 4 * j;
                rope_rot(a[k].x, b[k].x, sn[i], cs[i], y0.x, y1.x);
                rope_rot(a[k].y, b[k].y, sn[i + 1], cs[i + 1], y0.y, y1.y);
                rope_rot(a[k].z, b[k].z, sn[i + 2], cs[i + 2], y0.z, y1.z);
                rope_rot(a[k].w, b[k].w, sn[i + 3], cs[i + 3], y0.w, y1.w);
            }
            if (h < n_head && QH) { // q x qscale rounded once, as the wgmma prefill kernel rounds f32 q
                __half *qd = (__half *)q_out + ((size_t)t * n_head + h) * hd;
                *(uint2 *)(qd + at(j, 0)) = make_uint2(kc_pack_h2(__fmul_rn(y0.x, qscale), __fmul_rn(y0.y, qscale)),
                                                       kc_pack_h2(__fmul_rn(y0.z, qscale), __fmul_rn(y0.w, qscale)));
                *(uint2 *)(qd + at(j, 1)) = make_uint2(kc_pack_h2(__fmul_rn(y1.x, qscale), __fmul_rn(y1.y, qscale)),
                                                       kc_pack_h2(__fmul_rn(y1.z, qscale), __fmul_rn(y1.w, qscale)));
            } else if (h < n_head) {
                float *qd = (float *)q_out + ((size_t)t * n_head + h) * hd;
                *(float4 *)(qd + at(j, 0)) = y0;
                *(float4 *)(qd + at(j, 1)) = y1;
            } else {
                __half *kd = k_cache + (slot + (size_t)(h - n_head) * block_size) * hd;
                *(uint2 *)(kd + at(j, 0)) = make_uint2(kc_pack_h2(y0.x, y0.y), kc_pack_h2(y0.z, y0.w));
                *(uint2 *)(kd + at(j, 1)) = make_uint2(kc_pack_h2(y1.x, y1.y), kc_pack_h2(y1.z, y1.w));
            }
        }
    }
}

// FP8 cache, steps of many tokens (the plan's rope_tok; whole rotations, no QK-norm, head dim 32 E):
// one CTA a token, a warp a head (lane l: values E l .. E l + E - 1; split halves pair lane l's
// values with lane l ^ 16's), the token's angles once into shared memory. K and V as f8_store_head
// encodes them: the head's amax (a warp's maximum), the same scale, divisions and rounding; q as
// f32. The same bits as rope_store_kernel<true>, whose (token, head) CTAs of 64 threads, each with
// its own angles and block-wide maximum, took 0.62 ms of a 256-sequence llama3-8b step on an H200.
// sw, sx (kc_rope_store_kv_f8_scaled): qkv holds an FP8 matmul's unit-scale sums, qkv[t][o] x
// sw[o] x sx[t] the values (the bits of its scale pass).
template <int E>
__global__ void __launch_bounds__(256) rope_tok_f8_kernel(const float *qkv, float *q_out, uint8_t *k_cache, uint8_t *v_cache,
                                                          const float *k_st, const float *v_st, const int32_t *pos,
                                                          const int32_t *seq, const int32_t *block_tables, int max_blocks,
                                                          int n_head, int n_kv, int block_size, kc_rope r, const float *sw,
                                                          const float *sx) {
    constexpr int HD = 32 * E;
    KC_TRACE_SCOPE(KC_TR_ROPE);
    kc_pdl_trigger();
    __shared__ float sn[HD / 2], cs[HD / 2];
    const int t = blockIdx.x, p = pos[t];
    const int blk = block_tables[(size_t)seq[t] * max_blocks + p / block_size], row = p % block_size;
    rope_tok_begin(r, t, HD / 2, sn, cs, pos, seq, block_tables, max_blocks, n_kv, block_size);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nh = n_head + 2 * n_kv;
    const bool adj = r.layout == MDL_ROPE_ADJACENT;
    const float st = sw ? sx[t] : 1.0f;
    for (int h = warp; h < nh; h += 8) {
        const float *src = qkv + ((size_t)t * nh + h) * HD + E * lane;
        float v[E];
#pragma unroll
        for (int j = 0; j < E; j += 2) {
            const float2 x = *(const float2 *)(src + j);
            v[j] = x.x;
            v[j + 1] = x.y;
            if (sw) {
                const float2 w = __ldg((const float2 *)(sw + (size_t)h * HD + E * lane + j));
                v[j] = kc_f8_scaled(v[j], w.x, st);
                v[j + 1] = kc_f8_scaled(v[j + 1], w.y, st);
            }
        }
        if (h < n_head + n_kv) { // q or k: rotated
            if (adj) {
#pragma unroll
                for (int j = 0; j < E; j += 2) {
                    const int i = (E * lane + j) / 2;
                    rope_rot(v[j], v[j + 1], sn[i], cs[i], v[j], v[j + 1]);
                }
            } else {
                const bool lo = lane < 16;
#pragma unroll
                for (int j = 0; j < E; j++) {
                    const float o = __shfl_xor_sync(0xffffffffu, v[j], 16);
                    const int i = E * (lane & 15) + j;
                    float y0, y1;
                    rope_rot(lo ? v[j] : o, lo ? o : v[j], sn[i], cs[i], y0, y1);
                    v[j] = lo ? y0 : y1;
                }
            }
        }
        if (h < n_head) {
            float *qd = q_out + ((size_t)t * n_head + h) * HD + E * lane;
#pragma unroll
            for (int j = 0; j < E; j += 2) *(float2 *)(qd + j) = make_float2(v[j], v[j + 1]);
            continue;
        }
        const bool isk = h < n_head + n_kv;
        const int hk = isk ? h - n_head : h - n_head - n_kv;
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < E; j++) amax = fmaxf(amax, fabsf(v[j]));
        amax = kc_warp_max(amax);
        const float *st = isk ? k_st : v_st;
        const float sc = st ? st[hk] : __fdiv_rn(amax, 448.0f);
        uint8_t *b = (isk ? k_cache : v_cache) + (size_t)blk * ((size_t)block_size * n_kv * (HD + 4));
        const size_t rh = (size_t)row * n_kv + hk;
        uint8_t c[E];
#pragma unroll
        for (int j = 0; j < E; j++)
            c[j] = sc != 0.0f ? (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v[j], sc), __NV_SATFINITE, __NV_E4M3) : 0;
#pragma unroll
        for (int j = 0; j < E; j += 2) *(uint16_t *)(b + rh * HD + E * lane + j) = (uint16_t)(c[j] | c[j + 1] << 8);
        if (lane == 0) *(float *)(b + kv_f8_scale(row, hk, n_kv, block_size, HD)) = sc;
    }
}

extern "C" int kc_rope_store_kv(const float *qkv, float *q_out, kc_half *k_cache, kc_half *v_cache, const int32_t *pos,
                                const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_tok, int n_head,
                                int n_kv, int hd, int block_size, const kc_rope *rope, cudaStream_t s) {
    const kc_pdl_scope pdl_cls(KC_PDL_ROPE);
    if (!qkv || !q_out || !k_cache || !v_cache || !pos || !seq || !block_tables || !rope || n_tok <= 0 || n_head <= 0 ||
        n_kv <= 0 || hd <= 0 || block_size <= 0 || rope->rope_dim <= 0 || rope->rope_dim > hd || rope->rope_dim % 2)
        return CM_EINVAL;
    if (rope->q_norm && !rope->k_norm) return CM_EINVAL;
    const int rt = kc_plan_get()->rope_tok;
    if (rt > 0 && n_tok >= rt && !rope->q_norm && hd <= 256) {
        if (rope->rope_dim == hd && hd % 8 == 0) { // whole rotations: float4 at a time
            kc_launch(rope_tok_vec_kernel<float, false>, dim3(n_tok), dim3(256), 0, s, qkv, (void *)q_out, 1.0f,
                      (__half *)k_cache, (__half *)v_cache, pos, seq, block_tables, max_blocks, n_head, n_kv, hd, block_size,
                      *rope);
            KC_LAUNCH_CHECK();
        }
        kc_launch(rope_tok_kernel, dim3(n_tok), dim3(256), 0, s, qkv, q_out, (__half *)k_cache, (__half *)v_cache, pos, seq,
                  block_tables, max_blocks, n_head, n_kv, hd, block_size, *rope);
        KC_LAUNCH_CHECK();
    }
    dim3 grid(n_tok, n_head + 2 * n_kv);
    kc_launch(rope_store_kernel<false>, grid, dim3(hd >= 128 ? 64 : 32), 0, s, qkv, q_out, (void *)k_cache, (void *)v_cache,
              (const float *)nullptr, (const float *)nullptr, pos, seq, block_tables, max_blocks, n_head, n_kv, hd, block_size,
              *rope);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_rope_pf_ok(int n_tok, int hd, const kc_rope *rope) {
    const int rt = kc_plan_get()->rope_tok;
    return rope && rt > 0 && n_tok >= rt && !rope->q_norm && hd <= 256 && hd % 8 == 0 && rope->rope_dim == hd;
}

extern "C" int kc_rope_store_kv_pf(const void *qkv, int qkv_half, void *q_out, int q_half, float q_scale, kc_half *k_cache,
                                   kc_half *v_cache, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                                   int max_blocks, int n_tok, int n_head, int n_kv, int hd, int block_size, const kc_rope *rope,
                                   cudaStream_t s) {
    if (!qkv || !q_out || !k_cache || !v_cache || !pos || !seq || !block_tables || n_head <= 0 || n_kv <= 0 || block_size <= 0 ||
        !kc_rope_pf_ok(n_tok, hd, rope))
        return CM_EINVAL;
    const dim3 g(n_tok), b(256);
    const __half *qh_in = (const __half *)qkv;
    const float *qf_in = (const float *)qkv;
    __half *kh = (__half *)k_cache, *vh = (__half *)v_cache;
    if (qkv_half && q_half)
        kc_launch(rope_tok_vec_kernel<__half, true>, g, b, 0, s, qh_in, q_out, q_scale, kh, vh, pos, seq, block_tables,
                  max_blocks, n_head, n_kv, hd, block_size, *rope);
    else if (qkv_half)
        kc_launch(rope_tok_vec_kernel<__half, false>, g, b, 0, s, qh_in, q_out, q_scale, kh, vh, pos, seq, block_tables,
                  max_blocks, n_head, n_kv, hd, block_size, *rope);
    else if (q_half)
        kc_launch(rope_tok_vec_kernel<float, true>, g, b, 0, s, qf_in, q_out, q_scale, kh, vh, pos, seq, block_tables,
                  max_blocks, n_head, n_kv, hd, block_size, *rope);
    else
        kc_launch(rope_tok_vec_kernel<float, false>, g, b, 0, s, qf_in, q_out, q_scale, kh, vh, pos, seq, block_tables,
                  max_blocks, n_head, n_kv, hd, block_size, *rope);
    KC_LAUNCH_CHECK();
}

// Whether kc_rope_store_kv_f8 takes n_tok tokens a token a CTA (rope_tok_f8_kernel): the plan's
// rope_tok, whole rotations of 64, 128 or 256 dimensions, no QK-norm
static bool rope_tok_f8_ok(int n_tok, int hd, const kc_rope *rope) {
    const int rt = kc_plan_get()->rope_tok;
    return rt > 0 && n_tok >= rt && !rope->q_norm && rope->rope_dim == hd && (hd == 64 || hd == 128 || hd == 256);
}

extern "C" int kc_rope_f8_scaled_ok(int n_tok, int hd, const kc_rope *rope) { return rope && rope_tok_f8_ok(n_tok, hd, rope); }

static int rope_store_f8(const float *qkv, const float *sw, const float *sx, float *q_out, void *k_cache, void *v_cache,
                         const float *k_scale, const float *v_scale, const int32_t *pos, const int32_t *seq,
                         const int32_t *block_tables, int max_blocks, int n_tok, int n_head, int n_kv, int hd, int block_size,
                         const kc_rope *rope, cudaStream_t s) {
    if (!qkv || !q_out || !k_cache || !v_cache || !pos || !seq || !block_tables || !rope || n_tok <= 0 || n_head <= 0 ||
        n_kv <= 0 || hd <= 0 || hd > 256 || hd % 8 || block_size <= 0 || rope->rope_dim <= 0 || rope->rope_dim > hd ||
        rope->rope_dim % 2 || (!k_scale) != (!v_scale) || (rope->q_norm && !rope->k_norm) || (!sw) != (!sx))
        return CM_EINVAL;
    if (rope_tok_f8_ok(n_tok, hd, rope)) {
        auto *kern = hd == 64 ? rope_tok_f8_kernel<2> : hd == 128 ? rope_tok_f8_kernel<4> : rope_tok_f8_kernel<8>;
        kc_launch(kern, dim3(n_tok), dim3(256), 0, s, qkv, q_out, (uint8_t *)k_cache, (uint8_t *)v_cache, k_scale, v_scale, pos,
                  seq, block_tables, max_blocks, n_head, n_kv, block_size, *rope, sw, sx);
        KC_LAUNCH_CHECK();
    }
    if (sw) return CM_EUNSUPPORTED; // unit-scale sums: the token-a-CTA kernel only (kc_rope_f8_scaled_ok)
    dim3 grid(n_tok, n_head + 2 * n_kv);
    kc_launch(rope_store_kernel<true>, grid, dim3(hd >= 128 ? 64 : 32), 0, s, qkv, q_out, k_cache, v_cache, k_scale, v_scale,
              pos, seq, block_tables, max_blocks, n_head, n_kv, hd, block_size, *rope);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_rope_store_kv_f8(const float *qkv, float *q_out, void *k_cache, void *v_cache, const float *k_scale,
                                   const float *v_scale, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                                   int max_blocks, int n_tok, int n_head, int n_kv, int hd, int block_size,
                                   const kc_rope *rope, cudaStream_t s) {
    return rope_store_f8(qkv, nullptr, nullptr, q_out, k_cache, v_cache, k_scale, v_scale, pos, seq, block_tables, max_blocks,
                         n_tok, n_head, n_kv, hd, block_size, rope, s);
}

extern "C" int kc_rope_store_kv_f8_scaled(const float *qkv, const float *sw, const float *sx, float *q_out, void *k_cache,
                                          void *v_cache, const float *k_scale, const float *v_scale, const int32_t *pos,
                                          const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_tok, int n_head,
                                          int n_kv, int hd, int block_size, const kc_rope *rope, cudaStream_t s) {
    if (!sw || !sx) return CM_EINVAL;
    return rope_store_f8(qkv, sw, sx, q_out, k_cache, v_cache, k_scale, v_scale, pos, seq, block_tables, max_blocks, n_tok, n_head,
                         n_kv, hd, block_size, rope, s);
}
