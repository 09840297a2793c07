// embed: token-embedding gather (any table type, dequantized to f32) and f32 row gathers.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

__global__ void embed_kernel(const void *data, const kc_half *d, int type, int n_embd, int n_vocab,
                             const int32_t *ids, float *x) {
    kc_pdl_trigger();
    kc_pdl_wait();
    int t = blockIdx.x;
    int id = ids[t];
    float *out = x + (size_t)t * n_embd;
    if (id < 0 || id >= n_vocab) { // never index outside the table: an invalid id embeds as NaN
        for (int i = threadIdx.x; i < n_embd; i += blockDim.x) out[i] = __int_as_float(0x7fc00000);
        return;
    }
    size_t base = (size_t)id * n_embd;
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) {
        size_t k = base + i;
        float v;
        switch (type) {
        case DT_F32: v = ((const float *)data)[k]; break;
        case DT_F16: v = kc_h2f(((const uint16_t *)data)[k]); break;
        case DT_BF16: v = kc_bf2f(((const uint16_t *)data)[k]); break;
        case DT_Q8_0: v = kc_h2f(d[k / 32]) * (float)((const int8_t *)data)[k]; break;
        case DT_Q4_0: {
            uint8_t b = ((const uint8_t *)data)[(k / 32) * 16 + (k % 32 & 15)];
            v = kc_h2f(d[k / 32]) * (float)((int)((k % 32) < 16 ? (b & 15) : (b >> 4)) - 8);
            break;
        }
        default: { // Q4_K (kcuda.h's layout): super-block k / 256, quarter, sub-block and nibble
            size_t sb = k / 256;
            int e = (int)(k % 256), j = e / 64, kk = e % 64, is = 2 * j + (kk >= 32);
            uint4 h = ((const uint4 *)d)[sb];
            const int sh = 8 * (is & 3);
            const uint32_t by = (h.y >> sh) & 0xFF, bz = (h.z >> sh) & 0xFF, bw = (h.w >> sh) & 0xFF;
            uint32_t sc, mn;
            if (is < 4) { sc = by & 63; mn = bz & 63; }
            else { sc = (bw & 0xF) | ((by >> 6) << 4); mn = (bw >> 4) | ((bz >> 6) << 4); }
            uint8_t b = ((const uint8_t *)data)[sb * 128 + j * 32 + (kk & 31)];
            int q = kk < 32 ? (b & 15) : (b >> 4);
            v = kc_h2f((uint16_t)(h.x & 0xFFFF)) * (float)sc * (float)q - kc_h2f((uint16_t)(h.x >> 16)) * (float)mn;
        }
        }
        out[i] = v;
    }
}

extern "C" int kc_embed(const kc_weight *table, const int32_t *ids, int n_tok, float *x, cudaStream_t s) {
    if (!table || !ids || !x || n_tok <= 0) return CM_EINVAL;
    if (table->type != DT_F32 && table->type != DT_F16 && table->type != DT_BF16 && table->type != DT_Q8_0 &&
        table->type != DT_Q4_0 && table->type != DT_Q4_K)
        return CM_EUNSUPPORTED;
    embed_kernel<<<n_tok, 256, 0, s>>>(table->data, table->d, table->type, table->n_in, table->n_out, ids, x);
    KC_LAUNCH_CHECK();
}

__global__ void gather_rows_kernel(const float *src, const int32_t *rows, int n, float *dst) {
    kc_pdl_trigger();
    kc_pdl_wait();
    const float *in = src + (size_t)rows[blockIdx.x] * n;
    float *out = dst + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}

extern "C" int kc_gather_rows_f32(const float *src, const int32_t *rows, int n_rows, int n, float *dst, cudaStream_t s) {
    if (!src || !rows || !dst || n_rows <= 0 || n <= 0) return CM_EINVAL;
    kc_launch(gather_rows_kernel, dim3(n_rows), dim3(256), 0, s, src, rows, n, dst);
    KC_LAUNCH_CHECK();
}
