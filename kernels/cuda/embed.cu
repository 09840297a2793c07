// embed: token-embedding gather (any table type, dequantized to f32) and f32 row gathers.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

KC_TRACE_TU(embed)

// Element k of the table as f32 (TYPE as in kc_weight; Q4_K: kcuda.h's layout).
template <int TYPE> __device__ __forceinline__ float embed_elem(const void *data, const kc_half *d, size_t k) {
    if constexpr (TYPE == DT_F32) return ((const float *)data)[k];
    else if constexpr (TYPE == DT_F16) return kc_h2f(((const uint16_t *)data)[k]);
    else if constexpr (TYPE == DT_BF16) return kc_bf2f(((const uint16_t *)data)[k]);
    else if constexpr (TYPE == DT_Q8_0) return kc_h2f(d[k / 32]) * (float)((const int8_t *)data)[k];
    else if constexpr (TYPE == DT_Q4_0) {
        uint8_t b = ((const uint8_t *)data)[(k / 32) * 16 + (k % 32 & 15)];
        return kc_h2f(d[k / 32]) * (float)((int)((k % 32) < 16 ? (b & 15) : (b >> 4)) - 8);
    } else { // super-block k / 256, quarter, sub-block and nibble
        size_t sb = k / 256;
        int e = (int)(k % 256), j = e / 64, kk = e % 64, is = 2 * j + (kk >= 32);
        uint4 h = ((const uint4 *)d)[sb];
        float sc, mn;
        kc_q4k_scale_min(h, is, sc, mn);
        uint8_t b = ((const uint8_t *)data)[sb * 128 + j * 32 + (kk & 31)];
        int q = kk < 32 ? (b & 15) : (b >> 4);
        return kc_h2f((uint16_t)(h.x & 0xFFFF)) * sc * (float)q - kc_h2f((uint16_t)(h.x >> 16)) * mn;
    }
}

// One CTA per token, every value times scale (the embedding scale; times 1 is exact). The loop
// is unrolled so that a thread's loads are in flight together: a step's first kernel, reading
// its row from DRAM, was one round trip per element a thread handled (10.7 us for one Q4_0 row
// of 4,096 under ncu).
template <int TYPE>
__global__ void embed_kernel(const void *data, const kc_half *d, int n_embd, int n_vocab, const int32_t *ids, float *x,
                             float scale) {
    KC_TRACE_SCOPE(KC_TR_EMBED);
    kc_pdl_trigger();
    kc_pdl_wait();
    int t = blockIdx.x;
    int id = ids[t];
    float *out = x + (size_t)t * n_embd;
    if (id < 0 || id >= n_vocab) { // never index outside the table: an invalid id embeds as NaN
        for (int i = threadIdx.x; i < n_embd; i += blockDim.x) out[i] = __int_as_float(0x7fc00000);
        return;
    }
    const size_t base = (size_t)id * n_embd;
#pragma unroll 8
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) out[i] = __fmul_rn(embed_elem<TYPE>(data, d, base + i), scale);
}

extern "C" int kc_embed_scaled(const kc_weight *table, const int32_t *ids, int n_tok, float *x, float scale, cudaStream_t s) {
    if (!table || !ids || !x || n_tok <= 0) return CM_EINVAL;
    if (table->type != DT_F32 && table->type != DT_F16 && table->type != DT_BF16 && table->type != DT_Q8_0 &&
        table->type != DT_Q4_0 && table->type != DT_Q4_K)
        return CM_EUNSUPPORTED;
    const int n = table->n_in, threads = n >= 1024 ? 1024 : (n + 31) / 32 * 32;
    switch (table->type) {
    case DT_F32: embed_kernel<DT_F32><<<n_tok, threads, 0, s>>>(table->data, table->d, n, table->n_out, ids, x, scale); break;
    case DT_F16: embed_kernel<DT_F16><<<n_tok, threads, 0, s>>>(table->data, table->d, n, table->n_out, ids, x, scale); break;
    case DT_BF16: embed_kernel<DT_BF16><<<n_tok, threads, 0, s>>>(table->data, table->d, n, table->n_out, ids, x, scale); break;
    case DT_Q8_0: embed_kernel<DT_Q8_0><<<n_tok, threads, 0, s>>>(table->data, table->d, n, table->n_out, ids, x, scale); break;
    case DT_Q4_0: embed_kernel<DT_Q4_0><<<n_tok, threads, 0, s>>>(table->data, table->d, n, table->n_out, ids, x, scale); break;
    default: embed_kernel<DT_Q4_K><<<n_tok, threads, 0, s>>>(table->data, table->d, n, table->n_out, ids, x, scale); break;
    }
    KC_LAUNCH_CHECK();
}

extern "C" int kc_embed(const kc_weight *table, const int32_t *ids, int n_tok, float *x, cudaStream_t s) {
    return kc_embed_scaled(table, ids, n_tok, x, 1.0f, s);
}

// One CTA per row; float4 copies when n allows, unrolled so that a thread's loads are in flight
// together (5.9 us for one row of 4,096 floats under ncu, one element per round trip).
__global__ void gather_rows_kernel(const float *src, const int32_t *rows, int n, float *dst) {
    KC_TRACE_SCOPE(KC_TR_GATHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    const float *in = src + (size_t)rows[blockIdx.x] * n;
    float *out = dst + (size_t)blockIdx.x * n;
    if (n % 4 == 0) {
        const float4 *in4 = (const float4 *)in;
        float4 *out4 = (float4 *)out;
#pragma unroll 4
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) out4[i] = in4[i];
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
    }
}

extern "C" int kc_gather_rows_f32(const float *src, const int32_t *rows, int n_rows, int n, float *dst, cudaStream_t s) {
    if (!src || !rows || !dst || n_rows <= 0 || n <= 0) return CM_EINVAL;
    const int per = n % 4 == 0 ? n / 4 : n, threads = per >= 1024 ? 1024 : (per + 31) / 32 * 32;
    kc_launch(gather_rows_kernel, dim3(n_rows), dim3(threads), 0, s, src, rows, n, dst);
    KC_LAUNCH_CHECK();
}
