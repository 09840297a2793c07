/* quant: reference (scalar, exact) dequantize and quantize for every supported type. */
#include "dtype.h"
#include "../common/cm_err.h"

#include <string.h>

int dt_dequantize(int type, const void *src, float *dst, int64_t n) {
    if (!dt_row_size(type, n) && n) return CM_EINVAL;
    switch (type) {
    case DT_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case DT_F16: for (int64_t i = 0; i < n; i++) dst[i] = dt_f16_to_f32(((const dt_f16 *)src)[i]); return 0;
    case DT_BF16: for (int64_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(((const dt_bf16 *)src)[i]); return 0;
    default: return CM_EUNSUPPORTED;
    }
}

int dt_quantize(int type, const float *src, void *dst, int64_t n) {
    if (!dt_row_size(type, n) && n) return CM_EINVAL;
    switch (type) {
    case DT_F32: memcpy(dst, src, (size_t)n * 4); return 0;
    case DT_F16: for (int64_t i = 0; i < n; i++) ((dt_f16 *)dst)[i] = dt_f32_to_f16(src[i]); return 0;
    case DT_BF16: for (int64_t i = 0; i < n; i++) ((dt_bf16 *)dst)[i] = dt_f32_to_bf16(src[i]); return 0;
    default: return CM_EUNSUPPORTED;
    }
}
