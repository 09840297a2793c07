/* test_kernels_pool: the persistent thread pool runs every share exactly once per run, loses
 * no work across many back-to-back runs, survives sleeping workers (futex path), and rejects
 * bad sizes. */
#include "t.h"
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "kernels/cpu/kcpu.h"

#include <stdatomic.h>
#include <stdlib.h>

typedef struct {
    atomic_long sum_ith;
    atomic_long calls;
    atomic_int seen[64];  /* per run: how many times each ith ran */
    int bad_nth;
    int nth_expected;
} ctr;

static void count_fn(void *ctx, int ith, int nth) {
    ctr *c = ctx;
    if (nth != c->nth_expected || ith < 0 || ith >= nth) c->bad_nth = 1;
    atomic_fetch_add(&c->sum_ith, ith);
    atomic_fetch_add(&c->calls, 1);
    atomic_fetch_add(&c->seen[ith & 63], 1);
}

/* Each share writes its own slot; the caller checks all slots after the run returns. */
typedef struct { long *slots; long run; } slot_ctx;
static void slot_fn(void *ctx, int ith, int nth) {
    slot_ctx *s = ctx;
    s->slots[ith] = s->run * 1000 + ith;
}

static void test_counts(int n) {
    k_pool *p = NULL;
    T_EQ_INT(k_pool_create(n, &p), 0);
    if (!p) return;
    T_EQ_INT(k_pool_size(p), n);
    ctr *c = calloc(1, sizeof *c);
    c->nth_expected = n;
    const long runs = n <= 2 ? 5000 : 1000; /* more threads than this 2-core machine has: slow */
    int once_each = 1;
    for (long r = 0; r < runs; r++) {
        for (int i = 0; i < n; i++) atomic_store(&c->seen[i], 0);
        k_pool_run(p, count_fn, c);
        for (int i = 0; i < n; i++) once_each &= atomic_load(&c->seen[i]) == 1;
    }
    T_CHECKF(once_each, "n=%d: some share did not run exactly once in a run", n);
    T_EQ_INT(atomic_load(&c->calls), runs * n);
    T_EQ_INT(atomic_load(&c->sum_ith), runs * (long)n * (n - 1) / 2);
    T_CHECK(!c->bad_nth);

    /* results visible to the caller when k_pool_run returns */
    long slots[64];
    slot_ctx s = { slots, 0 };
    int visible = 1;
    for (long r = 1; r <= runs / 4; r++) {
        s.run = r;
        k_pool_run(p, slot_fn, &s);
        for (int i = 0; i < n; i++) visible &= slots[i] == r * 1000 + i;
    }
    T_CHECKF(visible, "n=%d: a share's write was not visible after k_pool_run", n);

    /* let the workers fall asleep (past the spin), then run again: futex wake-up path */
    for (int k = 0; k < 3; k++) {
        cm_time_sleep_ms(30);
        long before = atomic_load(&c->calls);
        k_pool_run(p, count_fn, c);
        T_EQ_INT(atomic_load(&c->calls) - before, n);
    }
    free(c);
    k_pool_destroy(p);
}

static void test_latency(void) {
    k_pool *p = NULL;
    if (k_pool_create(2, &p)) return;
    ctr *c = calloc(1, sizeof *c);
    c->nth_expected = 2;
    const int runs = 5000;
    uint64_t t0 = cm_time_ns();
    for (int r = 0; r < runs; r++) k_pool_run(p, count_fn, c);
    double ns = (double)(cm_time_ns() - t0) / runs;
    printf("k_pool_run with 2 threads: %.0f ns per run (informational)\n", ns);
    T_EQ_INT(atomic_load(&c->calls), 2L * runs);
    free(c);
    k_pool_destroy(p);
}

int main(void) {
    k_pool *p = (k_pool *)1;
    T_EQ_INT(k_pool_create(0, &p), CM_EINVAL);
    T_CHECK(p == NULL);
    T_EQ_INT(k_pool_create(-3, &p), CM_EINVAL);
    T_EQ_INT(k_pool_create(2, NULL), CM_EINVAL);
    k_pool_destroy(NULL);
    T_EQ_INT(k_pool_size(NULL), 1);

    for (int n = 1; n <= 4; n++) test_counts(n);
    test_latency();

    /* create/destroy churn, including destroy right after create and after a run */
    for (int i = 0; i < 50; i++) {
        k_pool *q = NULL;
        T_EQ_INT(k_pool_create(1 + i % 4, &q), 0);
        if (i & 1) {
            ctr c = { 0 };
            c.nth_expected = 1 + i % 4;
            k_pool_run(q, count_fn, &c);
            T_EQ_INT(atomic_load(&c.calls), 1 + i % 4);
        }
        k_pool_destroy(q);
    }
    return t_done();
}
