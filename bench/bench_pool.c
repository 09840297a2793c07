/* bench_pool: dispatch overhead of k_pool_run (a decode step calls it ~200 times per token).
 * Times back-to-back runs of an empty job, and runs separated by ~5 us of caller-only work (as
 * between two matmuls of a decode step); median ns per run over batches.
 *   bench_pool [threads=2] [batches=21]
 */
#include "common/cm_time.h"
#include "kernels/cpu/kcpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static void empty_fn(void *ctx, int ith, int nth) {
    atomic_fetch_add_explicit((atomic_long *)ctx, ith + 1, memory_order_relaxed);
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static volatile double sink;
static void busy_ns(uint64_t ns) {
    uint64_t t0 = cm_time_ns();
    double s = 0.0;
    while (cm_time_ns() - t0 < ns) s += 1.0;
    sink = s;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    int batches = argc > 2 ? atoi(argv[2]) : 21;
    if (nth < 1 || batches < 1 || batches > 101) return 1;
    k_pool *p = NULL;
    if (k_pool_create(nth, &p)) return 1;
    atomic_long ctr = 0;
    double back[101], gap[101];
    const int runs = 2000;
    for (int b = 0; b < batches; b++) {
        uint64_t t0 = cm_time_ns();
        for (int r = 0; r < runs; r++) k_pool_run(p, empty_fn, &ctr);
        back[b] = (double)(cm_time_ns() - t0) / runs;
        double sum = 0.0;
        for (int r = 0; r < runs / 10; r++) {
            busy_ns(5000);
            uint64_t t1 = cm_time_ns();
            k_pool_run(p, empty_fn, &ctr);
            sum += (double)(cm_time_ns() - t1);
        }
        gap[b] = sum / (runs / 10);
    }
    qsort(back, (size_t)batches, sizeof back[0], cmp_d);
    qsort(gap, (size_t)batches, sizeof gap[0], cmp_d);
    long want = (long)batches * (runs + runs / 10) * ((long)nth * (nth + 1) / 2);
    printf("k_pool_run, %d thread%s: back-to-back %.0f ns per run, after 5 us of caller work %.0f ns per run "
           "(median of %d batches; min %.0f / %.0f)%s\n", nth, nth > 1 ? "s" : "", back[batches / 2], gap[batches / 2],
           batches, back[0], gap[0], atomic_load(&ctr) == want ? "" : " LOST WORK");
    k_pool_destroy(p);
    return atomic_load(&ctr) == want ? 0 : 1;
}
