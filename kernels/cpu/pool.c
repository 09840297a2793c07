/* pool: the persistent thread pool of the CPU backend.
 *
 * Workers are created once. A run publishes (fn, ctx) and bumps a generation counter; workers
 * spin on it for a short while (decode runs come every few microseconds) and then sleep on a
 * futex. The caller runs share 0 itself, then waits for the `pending` counter to reach zero
 * (spinning briefly, then on a futex). Nothing is allocated per run.
 */
#include "kcpu_internal.h"
#include "../../common/cm_err.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long to spin before sleeping on the futex: long enough to cover the gap between two
 * kernels of a decode step (a few microseconds), short enough not to steal a core from other
 * work when idle. The clock is read once per SPIN_CHECK pauses. */
#define SPIN_NS 50000
#define SPIN_CHECK 64

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins until *w != val or the spin budget (started at *t0, 0 = not started) is spent.
 * Returns the value seen; equal to val means: time to sleep. */
static unsigned spin_while(atomic_uint *w, unsigned val, int *spins, uint64_t *t0) {
    unsigned v;
    while ((v = atomic_load_explicit(w, memory_order_acquire)) == val) {
        cpu_relax();
        if (++*spins % SPIN_CHECK) continue;
        uint64_t t = now_ns();
        if (!*t0) *t0 = t;
        else if (t - *t0 > SPIN_NS) break;
    }
    return v;
}

typedef struct {
    k_pool *p;
    int ith;
} worker_arg;

struct k_pool {
    int n;                                  /* threads including the caller */
    pthread_t *threads;                     /* [n - 1] */
    worker_arg *args;                       /* [n - 1] */
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    _Alignas(64) atomic_uint gen;           /* bumped once per run (futex word) */
    atomic_int sleepers;                    /* workers in (or entering) futex wait on gen */
    _Alignas(64) atomic_uint pending;       /* workers still running the current run (futex word) */
    atomic_int caller_sleeping;
    atomic_int stop;
    void *scratch;                          /* see k__pool_scratch */
    size_t scratch_size;
};

static void futex_wait(atomic_uint *addr, unsigned val) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    k_pool *p = wa->p;
    unsigned seen = 0; /* gen at creation: a run may be published before this thread starts */
    for (;;) {
        unsigned g;
        int spins = 0;
        uint64_t t0 = 0;
        while ((g = spin_while(&p->gen, seen, &spins, &t0)) == seen) {
            /* Dekker with the caller: either it sees sleepers > 0 and wakes us, or we see the
             * new generation here (or futex_wait returns at once because gen changed). */
            atomic_fetch_add(&p->sleepers, 1);
            if (atomic_load(&p->gen) == seen) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->ctx, wa->ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && /* seq_cst: Dekker with caller_sleeping */
            atomic_load(&p->caller_sleeping))
            futex_wake(&p->pending);
    }
    return NULL;
}

int k_pool_create(int n_threads, k_pool **out) {
    if (!out) return CM_EINVAL;
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return CM_EINVAL;
    k_pool *p = calloc(1, sizeof *p);
    if (!p) return CM_ENOMEM;
    p->n = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->args = calloc((size_t)n_threads - 1, sizeof *p->args);
        if (!p->threads || !p->args) goto fail_alloc;
    }
    int started = 0;
    for (; started < n_threads - 1; started++) {
        p->args[started] = (worker_arg){ p, started + 1 };
        if (pthread_create(&p->threads[started], NULL, worker_main, &p->args[started]) != 0)
            goto fail_thread;
    }
    *out = p;
    return 0;

fail_thread:
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen);
    for (int i = 0; i < started; i++) pthread_join(p->threads[i], NULL);
fail_alloc:
    free(p->threads);
    free(p->args);
    free(p);
    return CM_ENOMEM;
}

void k_pool_destroy(k_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->args);
    free(p->scratch);
    free(p);
}

int k_pool_size(const k_pool *p) { return p ? p->n : 1; }

void k_pool_run(k_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (p->n == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, (unsigned)(p->n - 1), memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/ctx/pending, orders the load below */
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen);
    fn(ctx, 0, p->n);
    int spins = 0;
    uint64_t t0 = 0;
    unsigned left;
    while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0) {
        if (spin_while(&p->pending, left, &spins, &t0) != left) continue;
        atomic_store(&p->caller_sleeping, 1);
        left = atomic_load(&p->pending);
        if (left) futex_wait(&p->pending, left);
        atomic_store(&p->caller_sleeping, 0);
    }
}

void *k__pool_scratch(k_pool *p, size_t bytes) {
    if (bytes <= p->scratch_size) return p->scratch;
    size_t sz = (bytes + 4095) & ~(size_t)4095;
    void *m = NULL;
    if (posix_memalign(&m, 64, sz) != 0) return NULL;
    free(p->scratch);
    p->scratch = m;
    p->scratch_size = sz;
    return m;
}
