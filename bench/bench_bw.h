/* bench_bw: memory read bandwidth (a STREAM-like read-and-sum kernel) for the benchmarks that
 * compare against the bandwidth bound (bench_stream, bench_matmul). Header-only, bench/ only. */
#ifndef ARKA_BENCH_BW_H
#define ARKA_BENCH_BW_H

#include "common/cm_time.h"
#include "kernels/cpu/kcpu.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2"))) static double bw_sum_avx2(const float *a, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(a + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return (double)t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

static double bw_sum(const float *a, size_t n) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2")) return bw_sum_avx2(a, n);
#endif
    float s[8] = { 0 };
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k];
    return (double)s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

typedef struct { const float *a; size_t n; double sums[64]; } bw_job;

static void bw_fn(void *ctx, int ith, int nth) {
    bw_job *j = ctx;
    size_t per = (j->n / (size_t)nth) & ~(size_t)31, i0 = per * (size_t)ith;
    j->sums[ith & 63] = bw_sum(j->a + i0, per);
}

static int bw_cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Median read bandwidth in GB/s over `reps` passes of a bytes-sized buffer, read by all the
 * pool's threads (each a contiguous share); *best (may be NULL) gets the fastest pass.
 * Returns 0 if the buffer cannot be allocated. */
static double bw_read_gbs(k_pool *p, size_t bytes, int reps, double *best) {
    float *a = NULL;
    if (posix_memalign((void **)&a, 64, bytes)) return 0.0;
    size_t n = bytes / sizeof(float);
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023);
    bw_job j = { a, n, { 0 } };
    double r[64];
    if (reps > 64) reps = 64;
    k_pool_run(p, bw_fn, &j); /* warm (page faults, TLB) */
    size_t read = ((n / (size_t)k_pool_size(p)) & ~(size_t)31) * (size_t)k_pool_size(p) * sizeof(float);
    for (int k = 0; k < reps; k++) {
        uint64_t t0 = cm_time_ns();
        k_pool_run(p, bw_fn, &j);
        r[k] = (double)read / (double)(cm_time_ns() - t0);
    }
    qsort(r, (size_t)reps, sizeof r[0], bw_cmp);
    free(a);
    if (best) *best = r[reps - 1];
    return r[reps / 2];
}

#endif
