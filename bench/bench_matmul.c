/* bench_matmul: k_matmul at the tinyllama-1.1b shapes (n_in x n_out: 2048x2048, 2048x256,
 * 2048x5632, 5632x2048, 2048x32000) for n_tok = 1 and 128, weight types F16, Q8_0, Q4_0, Q4_K.
 * Prints ms per call (median and fastest), GB/s of weights read and GFLOP/s (from the median),
 * and for n_tok = 1 the ratio of the bandwidth bound (weight bytes / measured read bandwidth)
 * to the measured time. Then a whole-decode estimate for tinyllama (22 layers: q, k, v, o,
 * gate, up, down; output layer) from the n_tok = 1 times, as tok/s next to its bandwidth
 * bound, once from medians and once from the fastest runs against the fastest bandwidth pass
 * (on a shared machine the fastest runs are the better estimate of what the code can do).
 *
 * Weights for n_tok = 1 rotate over enough copies (>= 256 MiB and >= 3x the L3) that they
 * come from DRAM as in a real decode, not from the last-level cache.
 *
 *   bench_matmul [threads=2] [types=f16,q8_0,q4_0,q4_k] [n_toks=1,128]
 *   ARKA_ISA=scalar|avx2|avx512 selects the path.
 */
#include "bench_bw.h"
#include "common/cm_err.h"
#include "model/dtype.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* random blocks with sane scales (every quant bit pattern; no NaN/Inf in float fields) */
static void fill_weights(int type, uint8_t *w, size_t bytes) {
    uint32_t *u = (uint32_t *)w;
    for (size_t i = 0; i < bytes / 4; i++) u[i] = rnd();
    size_t bsz = dt_type_size(type), nb = bytes / bsz;
    dt_f16 d = dt_f32_to_f16(0.01f), m = dt_f32_to_f16(0.002f);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * bsz;
        switch (type) {
        case DT_F16: *(dt_f16 *)p = dt_f32_to_f16((float)((int)(rnd() % 2001) - 1000) / 1000.0f); break;
        case DT_BF16: *(dt_bf16 *)p = dt_f32_to_bf16((float)((int)(rnd() % 2001) - 1000) / 1000.0f); break;
        case DT_F32: *(float *)p = (float)((int)(rnd() % 2001) - 1000) / 1000.0f; break;
        case DT_Q8_0: ((blk_q8_0 *)p)->d = d; break;
        case DT_Q4_0: ((blk_q4_0 *)p)->d = d; break;
        case DT_Q4_K: ((blk_q4_K *)p)->d = d; ((blk_q4_K *)p)->dmin = m; break;
        case DT_Q6_K: ((blk_q6_K *)p)->d = d; break;
        default: break;
        }
    }
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

typedef struct { int64_t n_in, n_out; int per_token; } shape; /* per_token: uses per decode token */

static const shape shapes[] = {
    { 2048, 2048, 22 * 2 },   /* q, o */
    { 2048, 256, 22 * 2 },    /* k, v */
    { 2048, 5632, 22 * 2 },   /* gate, up */
    { 5632, 2048, 22 },       /* down */
    { 2048, 32000, 1 },       /* output */
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Median seconds per k_matmul call; *min_out gets the fastest, *cpu_out the median process
 * CPU time per call (all threads; with one thread it is the compute cost, unaffected by
 * other processes taking the core). */
static double time_matmul(k_pool *p, int type, const shape *s, int64_t n_tok, double *gbs_out, double *min_out,
                          double *cpu_out) {
    size_t row = dt_row_size(type, s->n_in), bytes = row * (size_t)s->n_out;
    /* rotate over >= max(256 MiB, 3 x L3) of copies so a decode reads from DRAM */
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t rot = (size_t)256 << 20;
    if (l3 > 0 && (size_t)l3 * 3 > rot) rot = (size_t)l3 * 3;
    size_t copies = n_tok == 1 ? rot / bytes + 1 : 1;
    if (copies > 4096) copies = 4096;
    uint8_t *w = NULL;
    if (posix_memalign((void **)&w, 64, bytes * copies)) return -1.0;
    fill_weights(type, w, bytes * copies);
    float *x = malloc((size_t)(n_tok * s->n_in) * sizeof *x), *y = malloc((size_t)(n_tok * s->n_out) * sizeof *y);
    for (int64_t i = 0; i < n_tok * s->n_in; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;

    double t[201], tc[201];
    int reps = 0;
    int rc = k_matmul(p, w, type, s->n_in, s->n_out, x, n_tok, y); /* warm-up */
    double total = 0.0;
    size_t c = 1 % copies;
    while (rc == 0 && reps < 201 && (reps < 5 || total < 0.4)) {
        uint64_t t0 = cm_time_ns();
        double c0 = cpu_s();
        rc = k_matmul(p, w + c * bytes, type, s->n_in, s->n_out, x, n_tok, y);
        tc[reps] = cpu_s() - c0;
        t[reps] = (double)(cm_time_ns() - t0) * 1e-9;
        total += t[reps++];
        c = (c + 1) % copies;
    }
    free(w); free(x); free(y);
    if (rc) { fprintf(stderr, "k_matmul %s: %s\n", dt_name(type), cm_err_str(rc)); return -1.0; }
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    qsort(tc, (size_t)reps, sizeof tc[0], cmp_d);
    *cpu_out = tc[reps / 2];
    *gbs_out = (double)bytes / t[reps / 2] * 1e-9;
    *min_out = t[0];
    return t[reps / 2];
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    const char *types_s = argc > 2 ? argv[2] : "f16,q8_0,q4_0,q4_k";
    const char *toks_s = argc > 3 ? argv[3] : "1,128";
    k_pool *p = NULL;
    if (nth < 1 || k_pool_create(nth, &p)) return 1;
    if (k_pool_reserve(p, 128, 5632)) return 1;

    double bw_best = 0.0, bw = bw_read_gbs(p, (size_t)1 << 30, 7, &bw_best);
    printf("isa %s, %d thread%s, read bandwidth (1 GiB, median of 7): %.1f GB/s (best %.1f)\n",
           k_isa_name(k_get_isa()), nth, nth > 1 ? "s" : "", bw, bw_best);
    printf("%-5s %5s %12s %9s %9s %9s %8s %9s %9s\n", "type", "n_tok", "n_in x n_out", "ms", "min ms", "cpu ms", "GB/s",
           "GFLOP/s", "bound/t");

    char tbuf[128];
    snprintf(tbuf, sizeof tbuf, "%s", types_s);
    for (char *tn = strtok(tbuf, ","); tn; tn = strtok(NULL, ",")) {
        int type = dt_from_name(tn);
        if (type < 0) { fprintf(stderr, "unknown type %s\n", tn); continue; }
        double decode_s = 0.0, decode_min = 0.0, decode_bytes = 0.0;
        int decode_ok = 1;
        char kbuf[64];
        snprintf(kbuf, sizeof kbuf, "%s", toks_s);
        char *save = NULL;
        for (char *ks = strtok_r(kbuf, ",", &save); ks; ks = strtok_r(NULL, ",", &save)) {
            int64_t n_tok = atol(ks);
            for (int si = 0; si < N_SHAPES; si++) {
                const shape *s = &shapes[si];
                double gbs = 0.0, mn = 0.0, cpu = 0.0, sec = time_matmul(p, type, s, n_tok, &gbs, &mn, &cpu);
                if (sec < 0) { decode_ok = 0; continue; }
                double bytes = (double)dt_row_size(type, s->n_in) * (double)s->n_out;
                double gflops = 2.0 * (double)n_tok * (double)s->n_in * (double)s->n_out / sec * 1e-9;
                char dims[32];
                snprintf(dims, sizeof dims, "%lldx%lld", (long long)s->n_in, (long long)s->n_out);
                printf("%-5s %5lld %12s %9.3f %9.3f %9.3f %8.1f %9.1f", dt_name(type), (long long)n_tok, dims, sec * 1e3,
                       mn * 1e3, cpu * 1e3, gbs, gflops);
                if (n_tok == 1) {
                    printf(" %8.0f%%", bytes / (bw * 1e9) / sec * 100.0);
                    decode_s += sec * s->per_token;
                    decode_min += mn * s->per_token;
                    decode_bytes += bytes * s->per_token;
                }
                printf("\n");
            }
        }
        if (decode_ok && decode_s > 0.0)
            printf("%-5s tinyllama decode (matmuls only, n_tok=1): %.1f ms/token = %.1f tok/s; bandwidth bound %.1f tok/s (%.0f%%)\n",
                   dt_name(type), decode_s * 1e3, 1.0 / decode_s, bw * 1e9 / decode_bytes,
                   decode_bytes / (bw * 1e9) / decode_s * 100.0);
        if (decode_ok && decode_min > 0.0)
            printf("%-5s   from fastest runs: %.1f ms/token = %.1f tok/s; bound at best bandwidth %.1f tok/s (%.0f%%)\n",
                   dt_name(type), decode_min * 1e3, 1.0 / decode_min, bw_best * 1e9 / decode_bytes,
                   decode_bytes / (bw_best * 1e9) / decode_min * 100.0);
    }
    k_pool_destroy(p);
    return 0;
}
