// embed: token-embedding gather (any table type, dequantized to f32) and f32 row gathers.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

__global__ void embed_kernel(const void *data, const kc_half *d, int type, int n_embd, int n_vocab,
                             const int32_t *ids, float *x) {
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
        default: { // Q4_0
            uint8_t b = ((const uint8_t *)data)[(k / 32) * 16 + (k % 32 & 15)];
            v = kc_h2f(d[k / 32]) * (float)((int)((k % 32) < 16 ? (b & 15) : (b >> 4)) - 8);
        }
        }
        out[i] = v;
    }
}

extern "C" int kc_embed(const kc_weight *table, const int32_t *ids, int n_tok, float *x, cudaStream_t s) {
    if (!table || !ids || !x || n_tok <= 0) return CM_EINVAL;
    if (table->type != DT_F32 && table->type != DT_F16 && table->type != DT_BF16 && table->type != DT_Q8_0 &&
        table->type != DT_Q4_0)
        return CM_EUNSUPPORTED;
    embed_kernel<<<n_tok, 256, 0, s>>>(table->data, table->d, table->type, table->n_in, table->n_out, ids, x);
    KC_LAUNCH_CHECK();
}

__global__ void gather_rows_kernel(const float *src, const int32_t *rows, int n, float *dst) {
    const float *in = src + (size_t)rows[blockIdx.x] * n;
    float *out = dst + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}

extern "C" int kc_gather_rows_f32(const float *src, const int32_t *rows, int n_rows, int n, float *dst, cudaStream_t s) {
    if (!src || !rows || !dst || n_rows <= 0 || n <= 0) return CM_EINVAL;
    gather_rows_kernel<<<n_rows, 256, 0, s>>>(src, rows, n, dst);
    KC_LAUNCH_CHECK();
}
