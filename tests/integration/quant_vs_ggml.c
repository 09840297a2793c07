/* quant_vs_ggml: checks model/quant.c against ggml itself, byte for byte.
 *
 * Built and run by test_quant_ggml.sh: it loads a libggml-base.so (shipped prebuilt in an npm
 * package) with dlopen, quantizes the same random rows with ggml's quantize_row_*_ref and with
 * dt_quantize, and requires identical bytes; then dequantizes the same blocks with both and
 * requires identical floats. Also f32 <-> f16/bf16 over many values.
 *
 * usage: quant_vs_ggml /path/to/libggml-base.so
 */
#include "model/dtype.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*deq_fn)(const void *, float *, int64_t);

static uint64_t rng_state = 12345;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(void) { return ((rng_next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float rng_normal(void) { return (float)(sqrt(-2 * log(rng_unif())) * cos(6.283185307179586 * rng_unif())); }

/* Test rows: normal data at several scales, offsets (for the min-based formats), heavy tails,
 * zero and constant blocks, a block with one outlier, and tiny values near the f16 subnormals. */
static void fill(float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        int64_t blk = i / 256;
        float v = rng_normal();
        switch ((blk + kind) % 9) {
        case 0: x[i] = v; break;
        case 1: x[i] = v * 1e-3f + 2e-3f; break;
        case 2: x[i] = v * 50; break;
        case 3: x[i] = v * v * v; break;
        case 4: x[i] = 0; break;
        case 5: x[i] = -0.3f; break;
        case 6: x[i] = (i % 256 == 77) ? 40.f : v * 0.1f; break;
        case 7: x[i] = v * 1e-6f; break;
        default: x[i] = fabsf(v) + 1; break;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s libggml-base.so\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    static const struct { int type; const char *name; } types[] = {
        { DT_Q4_0, "q4_0" }, { DT_Q4_1, "q4_1" }, { DT_Q5_0, "q5_0" }, { DT_Q5_1, "q5_1" }, { DT_Q8_0, "q8_0" },
        { DT_Q4_K, "q4_K" }, { DT_Q5_K, "q5_K" }, { DT_Q6_K, "q6_K" }, { DT_Q8_K, "q8_K" },
    };
    const int64_t n = 256 * 4 * 9 * 8;
    float *x = malloc(n * sizeof *x), *ya = malloc(n * sizeof *ya), *yb = malloc(n * sizeof *yb);
    uint8_t *qa = malloc(dt_row_size(DT_F32, n)), *qb = malloc(dt_row_size(DT_F32, n));
    int failed = 0, passed = 0;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        char qname[64], dname[64];
        snprintf(qname, sizeof qname, "quantize_row_%s_ref", types[t].name);
        snprintf(dname, sizeof dname, "dequantize_row_%s", types[t].name);
        quant_fn gq = (quant_fn)dlsym(h, qname);
        deq_fn gd = (deq_fn)dlsym(h, dname);
        if (!gq || !gd) {
            printf("FAIL %s: symbol missing in ggml\n", types[t].name);
            failed++;
            continue;
        }
        size_t rs = dt_row_size(types[t].type, n);
        for (int kind = 0; kind < 9; kind++) {
            fill(x, n, kind);
            memset(qa, 0x11, rs);
            memset(qb, 0x22, rs);
            gq(x, qa, n);
            dt_quantize(types[t].type, x, qb, n);
            size_t bs = dt_type_size(types[t].type), diff = 0, first = (size_t)-1;
            for (size_t b = 0; b < rs / bs; b++) {
                /* ggml leaves the bsums of an all-zero Q8_K block unwritten; ours are 0 */
                blk_q8_K *ka = (blk_q8_K *)qa + b;
                if (types[t].type == DT_Q8_K && ka->d == 0) memset(ka->bsums, 0, sizeof ka->bsums);
                if (memcmp(qa + b * bs, qb + b * bs, bs)) {
                    if (first == (size_t)-1) first = b;
                    diff++;
                }
            }
            if (diff) {
                printf("FAIL %s quantize (data kind %d): %zu of %zu blocks differ, first %zu\n", types[t].name, kind, diff,
                       rs / bs, first);
                failed++;
            } else passed++;
            for (int64_t i = 0; i < n; i++) ya[i] = yb[i] = NAN;
            gd(qa, ya, n);
            dt_dequantize(types[t].type, qa, yb, n);
            if (memcmp(ya, yb, n * sizeof *ya)) {
                printf("FAIL %s dequantize (data kind %d)\n", types[t].name, kind);
                failed++;
            } else passed++;
        }
        printf("%-5s: %zu-byte blocks, quantize and dequantize identical to ggml\n", types[t].name, dt_type_size(types[t].type));
    }

    /* f16 / bf16: all 2^16 codes back to f32, and random floats (no NaN) to f16/bf16 */
    void (*h2f)(const uint16_t *, float *, int64_t) = (void (*)(const uint16_t *, float *, int64_t))dlsym(h, "ggml_fp16_to_fp32_row");
    void (*f2h)(const float *, uint16_t *, int64_t) = (void (*)(const float *, uint16_t *, int64_t))dlsym(h, "ggml_fp32_to_fp16_row");
    void (*b2f)(const uint16_t *, float *, int64_t) = (void (*)(const uint16_t *, float *, int64_t))dlsym(h, "ggml_bf16_to_fp32_row");
    void (*f2b)(const float *, uint16_t *, int64_t) = (void (*)(const float *, uint16_t *, int64_t))dlsym(h, "ggml_fp32_to_bf16_row_ref");
    if (!h2f || !f2h || !b2f || !f2b) {
        printf("FAIL f16/bf16 row symbols missing\n");
        failed++;
    } else {
        static uint16_t codes[65536], ca[65536], cb[65536];
        static float fa[65536], fb[65536], src[65536];
        int bad = 0;
        for (int i = 0; i < 65536; i++) codes[i] = (uint16_t)i;
        h2f(codes, fa, 65536);
        for (int i = 0; i < 65536; i++) {
            fb[i] = dt_f16_to_f32(codes[i]);
            if (memcmp(&fa[i], &fb[i], 4) && !(isnan(fa[i]) && isnan(fb[i]))) bad++;
        }
        b2f(codes, fa, 65536);
        for (int i = 0; i < 65536; i++) {
            fb[i] = dt_bf16_to_f32(codes[i]);
            if (memcmp(&fa[i], &fb[i], 4)) bad++;
        }
        for (int round = 0; round < 20; round++) {
            for (int i = 0; i < 65536; i++) {
                uint32_t u = (uint32_t)rng_next();
                if (round % 2) u = (u & 0x80000000u) | ((u % 0x0f000000u) + 0x32000000u); /* the f16 range */
                memcpy(&src[i], &u, 4);
                if (isnan(src[i])) src[i] = 1;
            }
            f2h(src, ca, 65536);
            for (int i = 0; i < 65536; i++) bad += ca[i] != dt_f32_to_f16(src[i]);
            f2b(src, ca, 65536);
            for (int i = 0; i < 65536; i++) cb[i] = dt_f32_to_bf16(src[i]);
            bad += memcmp(ca, cb, sizeof ca) != 0;
        }
        if (bad) {
            printf("FAIL f16/bf16 conversions: %d mismatches\n", bad);
            failed++;
        } else {
            printf("f16/bf16: conversions identical to ggml\n");
            passed++;
        }
    }
    free(x); free(ya); free(yb); free(qa); free(qb);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
