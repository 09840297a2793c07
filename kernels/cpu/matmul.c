/* matmul: k_matmul's dispatch (ISA choice, activation quantization, splitting output rows over
 * the pool), the generic dequantize-a-row path, the double reference, and k_get_rows.
 * The kernels themselves live in matmul_scalar.c, matmul_avx2.c and matmul_avx512.c.
 */
#include "kcpu_internal.h"
#include "../../common/cm_err.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- ISA choice ------------------------------------------------------------------------ */

static atomic_int g_isa; /* resolved ISA; 0 until first use */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know "f16c" in
 * __builtin_cpu_supports. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static int isa_best(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    int f16c = has_f16c();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("fma") && f16c && k__mm_avx512[DT_F32])
        return K_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c && k__mm_avx2[DT_F32])
        return K_ISA_AVX2;
#endif
    return K_ISA_SCALAR;
}

static int isa_resolve(int want) {
    int best = isa_best();
    if (want == K_ISA_AUTO || want > best) return best;
    return want < K_ISA_SCALAR ? best : want;
}

int k_get_isa(void) {
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa) return isa;
    int want = K_ISA_AUTO;
    const char *env = getenv("ARKA_ISA");
    if (env) {
        if (!strcmp(env, "scalar")) want = K_ISA_SCALAR;
        else if (!strcmp(env, "avx2")) want = K_ISA_AVX2;
        else if (!strcmp(env, "avx512")) want = K_ISA_AVX512;
    }
    isa = isa_resolve(want);
    atomic_store_explicit(&g_isa, isa, memory_order_relaxed);
    return isa;
}

void k_set_isa(int isa) { atomic_store_explicit(&g_isa, isa_resolve(isa), memory_order_relaxed); }

const char *k_isa_name(int isa) {
    switch (isa) {
    case K_ISA_AUTO: return "auto";
    case K_ISA_SCALAR: return "scalar";
    case K_ISA_AVX2: return "avx2";
    case K_ISA_AVX512: return "avx512";
    default: return "unknown";
    }
}

/* The kernel for a weight type on an ISA: that ISA's own, else the next narrower ISA's
 * (AVX-512 machines run the AVX2 K-quant kernels), else scalar; NULL: no direct kernel. */
static k__mm_fn kernel_for(int isa, int wtype) {
    if (isa >= K_ISA_AVX512 && k__mm_avx512[wtype]) return k__mm_avx512[wtype];
    if (isa >= K_ISA_AVX2 && k__mm_avx2[wtype]) return k__mm_avx2[wtype];
    return k__mm_scalar[wtype];
}

int k__mm_chunk_rows(int isa) {
    switch (isa) {
    case K_ISA_AVX512: return 8;
    case K_ISA_AVX2: return 8;
    default: return 4;
    }
}

/* ---- activation quantization ------------------------------------------------------------ */

int k__act_for(int wtype) {
    switch (wtype) {
    case DT_Q8_0: return K_ACT_32_W8;
    case DT_Q4_0: return K_ACT_32_W4;
    case DT_Q4_K: case DT_Q6_K: return K_ACT_256;
    default: return K_ACT_NONE;
    }
}

/* Round to nearest even by the 1.5 * 2^23 trick (|v| <= 2^22): exact, inline, and the same as
 * lrintf in the default rounding mode (this file is compiled without FMA, so no product is
 * contracted into the add). */
static inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* One block of bs values: the two levels (see kcpu_internal.h) and the block's d. */
static float quantize_block(const float *x, int bs, int8_t *qh, int8_t *ql) {
    float amax = 0.0f;
    for (int i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(x[i]));
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < bs; i++) {
        float v = x[i] * id, h = round_even(v);
        float l = round_even((v - h) * 256.0f); /* v - h is exact; |l| <= 128 */
        qh[i] = (int8_t)(int)h;
        ql[i] = (int8_t)(int)fminf(fmaxf(l, -127.0f), 127.0f);
    }
    return amax / 127.0f;
}

void k__act_quantize_row(int act, const float *x, int64_t n_in, uint8_t *row) {
    const int64_t nq = k__act_nq(act, n_in);
    int8_t *qh = (int8_t *)row, *ql = (int8_t *)row + nq;
    float *d = (float *)(row + 2 * nq);
    if (act == K_ACT_256) {
        int16_t *bh = (int16_t *)(row + 2 * nq + (nq / 256) * 4), *bl = bh + nq / 16;
        for (int64_t b = 0; b < n_in / 256; b++) d[b] = quantize_block(x + b * 256, 256, qh + b * 256, ql + b * 256);
        for (int64_t g = 0; g < n_in / 16; g++) {
            int sh = 0, sl = 0;
            for (int i = 0; i < 16; i++) { sh += qh[g * 16 + i]; sl += ql[g * 16 + i]; }
            bh[g] = (int16_t)sh;
            bl[g] = (int16_t)sl;
        }
        return;
    }
    const int c = act == K_ACT_32_W8 ? 128 : 8;
    int32_t *k = (int32_t *)(row + 2 * nq + nq / 2);
    for (int64_t b = 0; b < nq / 32; b++) {
        int8_t h[32] = { 0 }, l[32] = { 0 };
        float db = b < n_in / 32 ? quantize_block(x + b * 32, 32, h, l) / 256.0f : 0.0f;
        for (int e = 0; e < 32; e++) {
            int64_t p = k__act_pos(b, e);
            qh[p] = h[e];
            ql[p] = l[e];
        }
        for (int j = 0; j < 4; j++) {
            int s = 0;
            for (int i = 4 * j; i < 4 * j + 4; i++) s += 256 * (h[i] + h[i + 16]) + l[i] + l[i + 16];
            d[4 * b + j] = db;
            k[4 * b + j] = -c * s;
        }
    }
}

/* ---- the pool job ------------------------------------------------------------------------ */

/* ---- FP8 E4M3 rows ------------------------------------------------------------------------ */

static float e4m3_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_init(void) {
    for (int i = 0; i < 256; i++) e4m3_lut[i] = dt_e4m3_to_f32((uint8_t)i);
}

const float *k__e4m3_lut(void) {
    pthread_once(&e4m3_once, e4m3_init);
    return e4m3_lut;
}

typedef struct {
    k__mm_args a;
    k__mm_fn fn;            /* kernel for a.w's type (or the F32 kernel for the generic path) */
    int wtype;
    int generic;            /* 1: dequantize each row with dt_dequantize, then fn on it */
    float *rowbuf;          /* generic: [nth][rowbuf_stride] floats */
    size_t rowbuf_stride;   /* generic: FP8_TILE rows of n_in floats (F8_E4M3) or one row (others) */
    const float *xf;        /* f32 input, for the quantize job */
    int act;
    k__act_fn quant;        /* the ISA's activation quantizer */
    int64_t chunk;
    int64_t n_chunks;
    atomic_long next;
    atomic_int err;
} mm_job;

static void quantize_job(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    for (int64_t t = ith; t < j->a.n_tok; t += nth)
        j->quant(j->act, j->xf + t * j->a.n_in, j->a.n_in, (uint8_t *)j->a.x + t * j->a.x_row);
}

static void generic_rows(mm_job *j, int ith, int64_t o0, int64_t o1) {
    float *buf = j->rowbuf + (size_t)ith * j->rowbuf_stride;
    k__mm_args sub = j->a;
    sub.w = (const uint8_t *)buf;
    sub.w_row = (size_t)j->a.n_in * 4;
    sub.n_out = 1;
    for (int64_t o = o0; o < o1; o++) {
        int rc = dt_dequantize(j->wtype, j->a.w + (size_t)o * j->a.w_row, buf, j->a.n_in);
        if (rc) { atomic_store(&j->err, rc); return; }
        sub.y = j->a.y + o;
        j->fn(&sub, 0, 1);
    }
}

static void matmul_job(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    for (;;) {
        long c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->n_chunks) break;
        int64_t o0 = c * j->chunk, o1 = o0 + j->chunk;
        if (o1 > j->a.n_out) o1 = j->a.n_out;
        if (j->generic) generic_rows(j, ith, o0, o1);
        else j->fn(&j->a, o0, o1);
    }
}

static size_t scratch_need(int act, int generic, int64_t n_tok, int64_t n_in, int nth) {
    size_t need = 0;
    if (act != K_ACT_NONE) need = (size_t)n_tok * k__act_row_size(act, n_in);
    if (generic) need = (size_t)nth * (((size_t)n_in * 4 + 63) & ~(size_t)63);
    return need;
}

int k_pool_reserve(k_pool *p, int64_t max_n_tok, int64_t max_n_in) {
    if (!p || max_n_tok < 1 || max_n_in < 1) return CM_EINVAL;
    size_t a = scratch_need(K_ACT_32_W8, 0, max_n_tok, max_n_in, 1);
    size_t b = scratch_need(K_ACT_256, 0, max_n_tok, max_n_in, 1);
    size_t c = scratch_need(K_ACT_NONE, 1, max_n_tok, max_n_in, k_pool_size(p));
    size_t need = a > b ? a : b;
    if (c > need) need = c;
    return k__pool_scratch(p, need) ? 0 : CM_ENOMEM;
}

int k_matmul(k_pool *p, const void *W, int wtype, int64_t n_in, int64_t n_out,
             const float *x, int64_t n_tok, float *y) {
    return k_matmul_scaled(p, W, wtype, NULL, n_in, n_out, x, n_tok, y);
}

int k_matmul_scaled(k_pool *p, const void *W, int wtype, const float *scale, int64_t n_in, int64_t n_out,
                    const float *x, int64_t n_tok, float *y) {
    if (!p || !W || !x || !y || n_in <= 0 || n_out <= 0 || n_tok <= 0) return CM_EINVAL;
    if ((wtype == DT_F8_E4M3) != (scale != NULL)) return CM_EINVAL;
    size_t w_row = dt_row_size(wtype, n_in);
    if (!w_row) return dt_block_size(wtype) ? CM_EINVAL : CM_EUNSUPPORTED;
    int isa = k_get_isa();
    int nth = k_pool_size(p);

    mm_job j;
    memset(&j, 0, sizeof j);
    j.a = (k__mm_args){ .w = W, .w_row = w_row, .n_in = n_in, .n_out = n_out, .n_tok = n_tok,
                        .y = y, .ldy = n_out };
    j.wtype = wtype;
    j.act = k__act_for(wtype);
    j.quant = isa >= K_ISA_AVX512 && k__act_quantize_avx512 ? k__act_quantize_avx512 : k__act_quantize_row;
    j.a.scale = scale;
    if (scale) pthread_once(&e4m3_once, e4m3_init); /* the scalar kernel's table */
    j.fn = kernel_for(isa, wtype);
    if (!j.fn) {
        /* generic path: the reference dequantizer must know the type; probe one block */
        if (!dt_is_supported(wtype) || dt_block_size(wtype) > 256) return CM_EUNSUPPORTED;
        float probe[256];
        if (dt_dequantize(wtype, W, probe, dt_block_size(wtype)) != 0) return CM_EUNSUPPORTED;
        j.generic = 1;
        j.act = K_ACT_NONE;
        j.fn = kernel_for(isa, DT_F32);
    }

    size_t need = scratch_need(j.act, j.generic, n_tok, n_in, nth);
    void *scratch = NULL;
    if (need && !(scratch = k__pool_scratch(p, need))) return CM_ENOMEM;
    if (j.act != K_ACT_NONE) {
        j.a.x = scratch;
        j.a.x_row = k__act_row_size(j.act, n_in);
        j.xf = x;
        if (n_tok >= 2 * nth && nth > 1) k_pool_run(p, quantize_job, &j);
        else quantize_job(&j, 0, 1);
    } else {
        j.a.x = (const uint8_t *)x;
        j.a.x_row = (size_t)n_in * 4;
    }
    if (j.generic) {
        j.rowbuf = scratch;
        j.rowbuf_stride = (((size_t)n_in * 4 + 63) & ~(size_t)63) / 4;
    }

    /* Chunks of output rows, handed out dynamically (the machine may be shared); a chunk is a
     * multiple of the kernels' row tile, and small enough that every thread gets several. */
    int64_t tile = k__mm_chunk_rows(isa);
    int64_t chunk = n_out / ((int64_t)nth * 4);
    chunk = (chunk + tile - 1) / tile * tile;
    if (chunk < tile) chunk = tile;
    j.chunk = chunk;
    j.n_chunks = (n_out + chunk - 1) / chunk;
    atomic_init(&j.next, 0);
    atomic_init(&j.err, 0);
    if (nth > 1 && j.n_chunks > 1) k_pool_run(p, matmul_job, &j);
    else matmul_job(&j, 0, 1);
    return atomic_load(&j.err);
}

/* ---- reference ----------------------------------------------------------------------------- */

int k_matmul_ref(const void *W, int wtype, int64_t n_in, int64_t n_out,
                 const float *x, int64_t n_tok, double *y) {
    return k_matmul_ref_scaled(W, wtype, NULL, n_in, n_out, x, n_tok, y);
}

int k_matmul_ref_scaled(const void *W, int wtype, const float *scale, int64_t n_in, int64_t n_out,
                        const float *x, int64_t n_tok, double *y) {
    if (!W || !x || !y || n_in <= 0 || n_out <= 0 || n_tok <= 0) return CM_EINVAL;
    if ((wtype == DT_F8_E4M3) != (scale != NULL)) return CM_EINVAL;
    size_t w_row = dt_row_size(wtype, n_in);
    if (!w_row) return dt_block_size(wtype) ? CM_EINVAL : CM_EUNSUPPORTED;
    float *row = malloc((size_t)n_in * sizeof *row);
    if (!row) return CM_ENOMEM;
    for (int64_t o = 0; o < n_out; o++) {
        int rc = 0;
        if (scale) dt_fp8_decode((const uint8_t *)W + (size_t)o * w_row, n_in, scale[o], row);
        else rc = dt_dequantize(wtype, (const uint8_t *)W + (size_t)o * w_row, row, n_in);
        if (rc) { free(row); return rc; }
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0.0;
            const float *xt = x + t * n_in;
            for (int64_t i = 0; i < n_in; i++) s += (double)row[i] * (double)xt[i];
            y[t * n_out + o] = s;
        }
    }
    free(row);
    return 0;
}

/* ---- gather ------------------------------------------------------------------------------ */

int k_get_rows(const void *table, int type, int64_t n_embd, int64_t n_rows,
               const int32_t *ids, int n, float *out) {
    if (!table || (!ids && n) || (!out && n) || n < 0 || n_embd <= 0 || n_rows < 0) return CM_EINVAL;
    size_t row = dt_row_size(type, n_embd);
    if (!row) return dt_block_size(type) ? CM_EINVAL : CM_EUNSUPPORTED;
    for (int j = 0; j < n; j++)
        if (ids[j] < 0 || ids[j] >= n_rows) return CM_ERANGE;
    for (int j = 0; j < n; j++) {
        int rc = dt_dequantize(type, (const uint8_t *)table + (size_t)ids[j] * row, out + (size_t)j * n_embd, n_embd);
        if (rc) return rc;
    }
    return 0;
}
