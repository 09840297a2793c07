/* dtype: type traits and scalar float conversions. Quantized formats live in quant.c. */
#include "dtype.h"

#include <ctype.h>
#include <math.h>
#include <string.h>
#include <strings.h>

typedef struct { const char *name; int block; size_t size; int supported; } traits;

static const traits type_traits[DT_COUNT] = {
    [DT_F32]  = { "F32",  1, 4, 1 },
    [DT_F16]  = { "F16",  1, 2, 1 },
    [DT_Q4_0] = { "Q4_0", QK4_0, sizeof(blk_q4_0), 1 },
    [DT_Q4_1] = { "Q4_1", QK4_1, sizeof(blk_q4_1), 1 },
    [DT_Q5_0] = { "Q5_0", QK5_0, sizeof(blk_q5_0), 1 },
    [DT_Q5_1] = { "Q5_1", QK5_1, sizeof(blk_q5_1), 1 },
    [DT_Q8_0] = { "Q8_0", QK8_0, sizeof(blk_q8_0), 1 },
    [DT_Q8_1] = { "Q8_1", QK8_1, sizeof(blk_q8_1), 0 },
    [DT_Q2_K] = { "Q2_K", QK_K, 84, 0 },
    [DT_Q3_K] = { "Q3_K", QK_K, 110, 0 },
    [DT_Q4_K] = { "Q4_K", QK_K, sizeof(blk_q4_K), 1 },
    [DT_Q5_K] = { "Q5_K", QK_K, sizeof(blk_q5_K), 1 },
    [DT_Q6_K] = { "Q6_K", QK_K, sizeof(blk_q6_K), 1 },
    [DT_Q8_K] = { "Q8_K", QK_K, sizeof(blk_q8_K), 1 },
    [DT_I8]   = { "I8",   1, 1, 0 },
    [DT_I16]  = { "I16",  1, 2, 0 },
    [DT_I32]  = { "I32",  1, 4, 0 },
    [DT_I64]  = { "I64",  1, 8, 0 },
    [DT_F64]  = { "F64",  1, 8, 0 },
    [DT_BF16] = { "BF16", 1, 2, 1 },
    /* a plain byte per element; "supported" 0: its values need the tensor's scale (dtype.h) */
    [DT_F8_E4M3] = { "F8_E4M3", 1, 1, 0 },
};

_Static_assert(sizeof(blk_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(blk_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(blk_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(blk_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(blk_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(blk_q8_K) == 292, "q8_K layout");

const char *dt_name(int type) { return type >= 0 && type < DT_COUNT ? type_traits[type].name : NULL; }

int dt_from_name(const char *name) {
    for (int t = 0; t < DT_COUNT; t++)
        if (type_traits[t].name && strcasecmp(type_traits[t].name, name) == 0) return t;
    return -1;
}

int dt_block_size(int type) { return type >= 0 && type < DT_COUNT ? type_traits[type].block : 0; }
size_t dt_type_size(int type) { return type >= 0 && type < DT_COUNT ? type_traits[type].size : 0; }
int dt_is_supported(int type) { return type >= 0 && type < DT_COUNT && type_traits[type].supported; }

size_t dt_row_size(int type, int64_t n) {
    int b = dt_block_size(type);
    if (!b || n < 0 || n % b) return 0;
    return (size_t)(n / b) * dt_type_size(type);
}

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float dt_f16_to_f32(dt_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        if (mant == 0) return u2f(sign);
        /* subnormal: value = mant * 2^-24 */
        float f = (float)mant * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));
    return u2f(sign | ((exp + 112) << 23) | (mant << 13));
}

dt_f16 dt_f32_to_f16(float f) {
    uint32_t u = f2u(f), sign = (u >> 16) & 0x8000;
    uint32_t au = u & 0x7fffffffu;
    if (au >= 0x7f800000u) return (dt_f16)(sign | 0x7c00 | (au > 0x7f800000u ? 0x200 : 0));
    if (au >= 0x477ff000u) return (dt_f16)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (au < 0x38800000u) {
        /* subnormal or zero in half: round x * 2^24 to nearest even integer */
        float a = u2f(au) * 16777216.0f;
        float r = nearbyintf(a); /* default rounding mode: nearest even */
        return (dt_f16)(sign | (uint32_t)r);
    }
    uint32_t mant = au & 0x7fffff, exp = (au >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (dt_f16)(sign | h);
}

float dt_bf16_to_f32(dt_bf16 h) { return u2f((uint32_t)h << 16); }

dt_bf16 dt_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (dt_bf16)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (dt_bf16)(u >> 16);
}

/* ---- FP8 E4M3 ------------------------------------------------------------------------------ */

float dt_e4m3_to_f32(uint8_t v) {
    uint32_t sign = (uint32_t)(v & 0x80) << 24, e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return u2f(sign | 0x7fc00000u);
    if (e == 0) {
        float f = (float)m * 0.001953125f; /* m * 2^-9 */
        return sign ? -f : f;
    }
    return u2f(sign | ((e + 120) << 23) | (m << 20));
}

uint8_t dt_f32_to_e4m3(float f) {
    uint32_t u = f2u(f), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    if (a >= 0x43f00000u) return sign | 0x7f; /* |f| >= 480, inf or NaN: NaN */
    if (a < 0x3c800000u) {
        /* below 2^-6, the smallest normal: multiples of 2^-9, nearest even (0..8; 8 is 2^-6) */
        float r = nearbyintf(u2f(a) * 512.0f);
        return sign | (uint8_t)r;
    }
    uint32_t e = (a >> 23) - 120, m3 = (a >> 20) & 7, rest = a & 0xfffff;
    if (rest > 0x80000 || (rest == 0x80000 && (m3 & 1))) m3++;
    if (m3 == 8) { m3 = 0; e++; }
    return sign | (uint8_t)((e << 3) | m3); /* [464, 480) ends as e 15, m 7: NaN, as in PyTorch */
}

uint8_t dt_f32_to_e4m3_sat(float f) {
    if (f != f) return dt_f32_to_e4m3(f);
    if (f > DT_E4M3_MAX) f = DT_E4M3_MAX;
    if (f < -DT_E4M3_MAX) f = -DT_E4M3_MAX;
    return dt_f32_to_e4m3(f);
}
