/* bench_stream: this machine's memory read bandwidth (STREAM-like read/sum over a buffer much
 * larger than the caches), with 1 and 2 threads of the kernel pool; median of several runs.
 *   bench_stream [MiB=1024] [reps=9]
 */
#include "bench_bw.h"

#include <stdio.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    if (mib < 64) mib = 64;
    if (reps < 1) reps = 1;
    for (int nth = 1; nth <= 2; nth++) {
        k_pool *p = NULL;
        if (k_pool_create(nth, &p)) return 1;
        double best = 0.0, gbs = bw_read_gbs(p, mib << 20, reps, &best);
        printf("read bandwidth: %d thread%s, %zu MiB buffer, median of %d: %.1f GB/s (best %.1f)\n", nth,
               nth > 1 ? "s" : "", mib, reps, gbs, best);
        k_pool_destroy(p);
    }
    return 0;
}
