/* dtype: tensor element types as GGUF numbers them, their block layouts, and conversions.
 *
 * The numbering is GGUF's (it is written into files) below DT_GGUF_COUNT. Types from
 * DT_GGUF_COUNT on are ArkaTensor's own and never appear in a GGUF file: the readers and the
 * writer refuse them (GGUF defines no FP8 type). Quantized types store blocks of
 * `dt_block_size()` elements in `dt_type_size()` bytes; the structs below are the exact
 * on-disk layouts (little-endian). Reference dequantize/quantize functions are scalar and
 * exact (model/quant.c); the fast kernels live in kernels/.
 * Any thread may call these; they keep no state.
 */
#ifndef MDL_DTYPE_H
#define MDL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum dt_type {
    DT_F32 = 0, DT_F16 = 1, DT_Q4_0 = 2, DT_Q4_1 = 3, DT_Q5_0 = 6, DT_Q5_1 = 7, DT_Q8_0 = 8, DT_Q8_1 = 9,
    DT_Q2_K = 10, DT_Q3_K = 11, DT_Q4_K = 12, DT_Q5_K = 13, DT_Q6_K = 14, DT_Q8_K = 15,
    DT_I8 = 24, DT_I16 = 25, DT_I32 = 26, DT_I64 = 27, DT_F64 = 28, DT_BF16 = 30,
    DT_GGUF_COUNT = 40,
    /* FP8 E4M3 ("float8_e4m3fn": 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
     * infinities, 0x7f / 0xff NaN; largest finite 448; smallest subnormal 2^-9). One byte per
     * element; the values need a scale kept beside the data (mdl_tensor.scale), so
     * dt_dequantize / dt_quantize refuse the type and dt_is_supported is 0: the dt_fp8_*
     * functions below convert it. */
    DT_F8_E4M3 = 40,
    DT_COUNT = 41
};

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t dt_f16;  /* IEEE half bits */
typedef uint16_t dt_bf16; /* bfloat16 bits */

typedef struct { dt_f16 d; uint8_t qs[QK4_0 / 2]; } blk_q4_0;
typedef struct { dt_f16 d, m; uint8_t qs[QK4_1 / 2]; } blk_q4_1;
typedef struct { dt_f16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } blk_q5_0;
typedef struct { dt_f16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } blk_q5_1;
typedef struct { dt_f16 d; int8_t qs[QK8_0]; } blk_q8_0;
typedef struct { dt_f16 d, s; int8_t qs[QK8_1]; } blk_q8_1;
/* super-blocks of 256 */
typedef struct { dt_f16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } blk_q4_K;
typedef struct { dt_f16 d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } blk_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; dt_f16 d; } blk_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } blk_q8_K;

/* Name ("Q4_K") or NULL for an unknown/unsupported number. */
const char *dt_name(int type);
/* Parses a lower- or upper-case name ("q8_0", "f16"); returns the type or -1. */
int dt_from_name(const char *name);
/* Elements per block (1 for plain types); 0 for types this build does not know. */
int dt_block_size(int type);
/* Bytes per block; 0 for unknown types. */
size_t dt_type_size(int type);
/* Bytes of a row of n elements; 0 when n is not a multiple of the block size or the type is unknown. */
size_t dt_row_size(int type, int64_t n);
/* 1 when the type is one ArkaTensor can dequantize (the floating and quantized types above). */
int dt_is_supported(int type);

/* Scalar conversions (round to nearest even). */
float   dt_f16_to_f32(dt_f16 h);
dt_f16  dt_f32_to_f16(float f);
float   dt_bf16_to_f32(dt_bf16 h);
dt_bf16 dt_f32_to_bf16(float f);

/* FP8 E4M3, exactly as PyTorch's torch.float8_e4m3fn:
 *   dt_e4m3_to_f32    the code's value (exact; NaN codes give NaN with the code's sign)
 *   dt_f32_to_e4m3    PyTorch's cast x.to(torch.float8_e4m3fn): round to nearest even; a
 *                     magnitude of 464 or more (inf included) becomes NaN (464 itself, the
 *                     tie between 448 and the NaN code, rounds to 448), NaN stays NaN
 *   dt_f32_to_e4m3_sat the quantizers' cast: clamp to [-448, 448] first (inf saturates, NaN
 *                     stays NaN), then round to nearest even: CUDA's
 *                     __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), and
 *                     torch.clamp(x, -448, 448).to(torch.float8_e4m3fn) */
#define DT_E4M3_MAX 448.0f
float   dt_e4m3_to_f32(uint8_t v);
uint8_t dt_f32_to_e4m3(float f);
uint8_t dt_f32_to_e4m3_sat(float f);
/* The scale of n values as every FP8 quantizer here chooses it: amax / 448 (f32 division,
 * round to nearest); 0 when every value is 0 (then every code is 0). NaN values are skipped. */
float   dt_fp8_scale(const float *x, int64_t n);
/* Codes of n values for scale s: q[i] = dt_f32_to_e4m3_sat(x[i] / s) (f32 division, round to
 * nearest); every code 0 when s is 0. Decoding gives dt_e4m3_to_f32(q[i]) * s (f32 product). */
void    dt_fp8_encode(const float *x, int64_t n, float s, uint8_t *q);
void    dt_fp8_decode(const uint8_t *q, int64_t n, float s, float *out);

/* Reference dequantize: n elements (a multiple of the block size) of `type` at src into dst.
 * Returns 0 or CM_EUNSUPPORTED / CM_EINVAL. */
int dt_dequantize(int type, const void *src, float *dst, int64_t n);
/* Reference quantize: n floats (multiple of the block size) into blocks of `type` at dst
 * (dt_row_size(type, n) bytes). Returns 0 or CM_EUNSUPPORTED / CM_EINVAL. */
int dt_quantize(int type, const float *src, void *dst, int64_t n);

#endif
