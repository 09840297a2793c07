/* shm/ under load: two processes (fork; the child attaches the memfd again, so the two sides map
 * it at different addresses) and two threads stream records of random sizes in both directions at
 * once over small rings (thousands of wraps, many full-ring stalls), every record carrying its
 * sequence number and a checksum of its bytes, its length derived from its sequence number: the
 * receiver proves that nothing is lost, duplicated, reordered or damaged. A ping-pong phase makes
 * every record need a wake-up (a lost one shows as a 5 s timeout), and a bursty phase makes the
 * consumer fall asleep mid-stream.
 *
 * Default: 1M records per direction per variant in the normal build, 1/8 of that under ASan,
 * 1/40 under TSan; ARKA_LONG_TESTS=1 multiplies by 10; ARKA_SHM_STRESS_N sets the count. */
#include "shm/shm.h"
#include "t.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define SAN_DIV 40
#elif defined(__SANITIZE_ADDRESS__)
#define SAN_DIV 8
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SAN_DIV 40
#elif __has_feature(address_sanitizer)
#define SAN_DIV 8
#endif
#endif
#ifndef SAN_DIV
#define SAN_DIV 1
#endif

#define RING_CAP   (32u << 10)   /* small: forces wraps and full rings */
#define WAIT_MS    5000          /* no progress for this long: the test has failed */
#define LOST_MS    2000          /* a wait for a record that is on its way taking this long means
                                    its wake-up was lost (shm_ring_wait only notices records
                                    after the eventfd fires or the time is up) */

static uint64_t mix(uint64_t z) {   /* splitmix64 finalizer */
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One direction of traffic: the sender and the receiver derive the same lengths from (seed, seq). */
struct stream {
    struct shm_ring *r;
    uint64_t seed;
    uint64_t n;       /* records to move */
    uint64_t done;    /* sent or received so far */
    size_t maxp;      /* ring's max payload */
    uint64_t rng;     /* sender's private randomness (zero-copy or push, bursts) */
};

static size_t rec_len(const struct stream *s, uint64_t seq) {
    uint64_t h = mix(s->seed ^ (seq * 0x2545f4914f6cdd1dull));
    size_t v = (size_t)(h >> 16);
    switch (h & 63) {
    case 0: return s->maxp;                          /* exactly the limit */
    case 1: return 16;                               /* header only */
    case 2: case 3: return 16 + v % (s->maxp - 15);  /* anything up to the limit */
    default:
        if ((h & 63) < 20) return 16 + v % 1024;
        return 16 + v % 112;
    }
}

/* The payload: u64 seq, u64 checksum, then bytes from a generator seeded by (seed, seq). */
static uint64_t sum_bytes(const uint8_t *p, size_t n) {
    uint64_t s = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        s = (s ^ w) * 0x100000001b3ull;
    }
    for (; i < n; i++) s = (s ^ p[i]) * 0x100000001b3ull;
    return s;
}

static void make_rec(const struct stream *s, uint64_t seq, uint8_t *p, size_t len) {
    uint64_t g = mix(s->seed + seq);
    for (size_t i = 16; i < len; i += 8) {
        g ^= g << 13; g ^= g >> 7; g ^= g << 17;
        memcpy(p + i, &g, len - i < 8 ? len - i : 8);
    }
    uint64_t sum = sum_bytes(p + 16, len - 16);
    memcpy(p, &seq, 8);
    memcpy(p + 8, &sum, 8);
}

struct side {
    const char *name;
    uint64_t waits, full_stalls, timeouts, bad;
    char why[256];
};

static void fail(struct side *sd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct side *sd, const char *fmt, ...) {
    if (!sd->bad) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sd->why, sizeof sd->why, fmt, ap);
        va_end(ap);
        fprintf(stderr, "%s: %s\n", sd->name, sd->why);
    }
    sd->bad++;
}

typedef unsigned long long ull;

/* Sends the next record; returns 0 or CM_EFULL. */
static int send_one(struct stream *s, uint8_t *scratch) {
    size_t len = rec_len(s, s->done);
    s->rng = mix(s->rng);
    int rc;
    if (s->rng & 1) {                       /* zero-copy: build it in the ring */
        void *w;
        rc = shm_ring_reserve(s->r, len, &w);
        if (rc) return rc;
        make_rec(s, s->done, w, len);
        rc = shm_ring_commit(s->r, len);
    } else {
        make_rec(s, s->done, scratch, len);
        rc = shm_ring_push(s->r, scratch, len);
        if (rc) return rc;
    }
    s->done++;
    return rc;
}

/* Receives and checks one record; returns 0, CM_EEMPTY, or -1 after recording the failure. */
static int recv_one(struct stream *s, struct side *sd) {
    const void *p;
    size_t n;
    int rc = shm_ring_peek(s->r, &p, &n);
    if (rc == CM_EEMPTY) return rc;
    if (rc) { fail(sd, "peek failed %d (%llu received)", rc, (ull)s->done); return -1; }
    uint64_t seq, sum;
    size_t want = rec_len(s, s->done);
    if (n < 16) { fail(sd, "record %llu has %zu bytes, want %zu", (ull)s->done, n, want); return -1; }
    memcpy(&seq, p, 8);
    memcpy(&sum, (const uint8_t *)p + 8, 8);
    if (seq != s->done) { fail(sd, "got seq %llu, want %llu (lost/dup/reordered)", (ull)seq, (ull)s->done); return -1; }
    if (n != want) { fail(sd, "record %llu has %zu bytes, want %zu", (ull)seq, n, want); return -1; }
    if (sum_bytes((const uint8_t *)p + 16, n - 16) != sum) { fail(sd, "record %llu (%zu bytes) checksum mismatch", (ull)seq, n); return -1; }
    shm_ring_release(s->r);
    s->done++;
    return 0;
}

/* Sleeps until rx has a record that the peer is sending right now; a wait that ends only at
 * its time limit (with or without the record) is a lost wake-up. */
static int wait_rx(struct stream *rx, struct side *sd, const char *where) {
    sd->waits++;
    uint64_t t0 = shm_now_ns();
    int rc = shm_ring_wait(rx->r, LOST_MS);
    uint64_t ms = (shm_now_ns() - t0) / 1000000;
    if (rc == CM_ETIMEOUT || ms >= LOST_MS) {
        fail(sd, "%s: lost wake-up (waited %llu ms, rc %d) at record %llu of %llu", where, (ull)ms, rc,
             (ull)rx->done, (ull)rx->n);
        return -1;
    }
    return rc;
}

static void nap_us(long us) {
    struct timespec ts = { 0, us * 1000L };
    nanosleep(&ts, NULL);
}

/* Both directions at once from one side. bursty: the sender pauses now and then so that the
 * other side's consumer goes to sleep in the middle of the stream. Returns 0 or -1. */
static int run_duplex(struct stream *tx, struct stream *rx, int bursty, struct side *sd) {
    uint8_t *scratch = malloc(tx->maxp + 8);
    uint64_t rng = mix(tx->seed ^ 0x5151);
    int idle = 0;
    uint64_t stalled_since = 0;
    while ((tx->done < tx->n || rx->done < rx->n) && !sd->bad) {
        int progress = 0;
        for (int k = 0; k < 32 && tx->done < tx->n; k++) {
            if (send_one(tx, scratch) == CM_EFULL) break;
            progress++;
            if (bursty && ((rng = mix(rng)) & 511) == 0) nap_us((long)(rng >> 40) % 60);
        }
        for (int k = 0; k < 32 && rx->done < rx->n; k++) {
            int rc = recv_one(rx, sd);
            if (rc == CM_EEMPTY) break;
            if (rc) break;
            progress++;
        }
        if (progress || sd->bad) { idle = 0; stalled_since = 0; continue; }
        uint64_t now = shm_now_ns();
        if (!stalled_since) stalled_since = now;
        if (now - stalled_since > WAIT_MS * 1000000ull) {
            fail(sd, "no progress for %d ms (sent %llu of %llu, received %llu of %llu)", WAIT_MS,
                 (ull)tx->done, (ull)tx->n, (ull)rx->done, (ull)rx->n);
            break;
        }
        if (rx->done < rx->n && tx->done >= tx->n) {
            wait_rx(rx, sd, "duplex");                    /* only receiving: sleep until woken */
        } else if (rx->done < rx->n) {
            sd->full_stalls++;                            /* our ring full, nothing to read yet */
            if (++idle < 64) sched_yield();
            else shm_ring_wait(rx->r, 1);
        } else {
            sd->full_stalls++;                            /* only sending, ring full */
            if (shm_ring_wait_space(tx->r, rec_len(tx, tx->done), WAIT_MS) == CM_ETIMEOUT)
                fail(sd, "ring stayed full for %d ms (sent %llu of %llu)", WAIT_MS, (ull)tx->done, (ull)tx->n);
        }
    }
    free(scratch);
    return sd->bad ? -1 : 0;
}

/* Ping-pong: the initiator sends one record and waits for one back; the echoer waits for one
 * and sends one. Every record finds its consumer asleep (or about to be). */
static int run_pingpong(struct stream *tx, struct stream *rx, int initiator, struct side *sd) {
    uint8_t *scratch = malloc(tx->maxp + 8);
    while (tx->done < tx->n && !sd->bad) {
        if (initiator && send_one(tx, scratch)) { fail(sd, "ping %llu: ring full", (ull)tx->done); break; }
        int rc;
        while ((rc = recv_one(rx, sd)) == CM_EEMPTY)
            if (wait_rx(rx, sd, "ping-pong")) break;
        if (rc) break;
        if (!initiator && send_one(tx, scratch)) { fail(sd, "pong %llu: ring full", (ull)tx->done); break; }
    }
    free(scratch);
    return sd->bad ? -1 : 0;
}

static volatile uint64_t spin_sink;
static void spin(uint64_t iters) {
    for (uint64_t i = 0; i < iters; i++) spin_sink += i;
}

/* Racing ping-pong: the echoer busy-polls (then sleeps) and answers at once; the initiator lets a
 * random few hundred nanoseconds pass between its ping and its wait. The pong therefore lands
 * anywhere around the initiator's "ring empty -> announce sleep" window, the one place a wake-up
 * can be lost; and nothing else arrives to make up for a lost one. */
static int run_race(struct stream *tx, struct stream *rx, int initiator, struct side *sd) {
    uint8_t *scratch = malloc(tx->maxp + 8);
    uint64_t rng = mix(tx->seed ^ 0x7777);
    while (tx->done < tx->n && !sd->bad) {
        if (initiator) {
            if (send_one(tx, scratch)) { fail(sd, "race ping %llu: ring full", (ull)tx->done); break; }
            rng = mix(rng);
            spin(rng % 400);
        }
        int rc;
        uint64_t tries = 0;
        while ((rc = recv_one(rx, sd)) == CM_EEMPTY) {
            if (!initiator && ++tries < 20000) continue;          /* echoer: spin first */
            if (wait_rx(rx, sd, "racing ping-pong")) break;
        }
        if (rc) break;
        if (!initiator && send_one(tx, scratch)) { fail(sd, "race pong %llu: ring full", (ull)tx->done); break; }
    }
    free(scratch);
    return sd->bad ? -1 : 0;
}

/* ---- the phases both variants run -------------------------------------------------------- */

struct plan {
    uint64_t n_duplex, n_bursty, n_pingpong, n_race;
};

/* Gateway side: produces on submit, consumes event. Executor side: the reverse. The seeds of a
 * phase are shared so that both ends derive the same lengths. */
static int run_side(struct shm_ring *tx_ring, struct shm_ring *rx_ring, int gateway, const struct plan *pl,
                    struct side *sd) {
    const uint64_t seed_submit = 0x1000, seed_event = 0x2000;
    struct { uint64_t n; int kind; } phases[] = { { pl->n_duplex, 0 }, { pl->n_bursty, 1 }, { pl->n_pingpong, 2 },
                                                  { pl->n_race, 3 } };
    for (int ph = 0; ph < 4; ph++) {
        uint64_t n = phases[ph].n;
        struct stream tx = { tx_ring, (gateway ? seed_submit : seed_event) + (uint64_t)ph, n, 0,
                             shm_ring_max_payload(tx_ring), mix((uint64_t)gateway * 77 + (uint64_t)ph) };
        struct stream rx = { rx_ring, (gateway ? seed_event : seed_submit) + (uint64_t)ph, n, 0,
                             shm_ring_max_payload(rx_ring), 0 };
        int kind = phases[ph].kind;
        int rc = kind == 3 ? run_race(&tx, &rx, gateway, sd)
               : kind == 2 ? run_pingpong(&tx, &rx, gateway, sd)
                           : run_duplex(&tx, &rx, kind == 1, sd);
        if (rc) return rc;
        if (rx.done != n || tx.done != n) {
            fail(sd, "phase moved %llu/%llu of %llu", (ull)tx.done, (ull)rx.done, (ull)n);
            return -1;
        }
    }
    return 0;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end ? dflt : (uint64_t)x;
}

static struct plan make_plan(void) {
    uint64_t n = 1000000 / SAN_DIV;
    const char *lt = getenv("ARKA_LONG_TESTS");
    if (lt && strcmp(lt, "1") == 0) n *= 10;
    n = env_u64("ARKA_SHM_STRESS_N", n);
    struct plan p = { n, n / 20 + 1, n / 50 + 1, n / 20 + 1 };
    return p;
}

/* ---- two processes ------------------------------------------------------------------------ */

static void test_fork(const struct plan *pl) {
    struct shm_seg seg;
    struct shm_seg_opts o = { .submit_cap = RING_CAP, .event_cap = RING_CAP };
    T_EQ_INT(shm_seg_create(&seg, &o), 0);
    int sp[3] = { seg.fd, seg.submit_efd, seg.event_efd };
    uint64_t t0 = shm_now_ns();
    pid_t pid = fork();
    T_CHECK(pid >= 0);
    if (pid == 0) {
        /* executor: attach anew through dup'ed fds, as an exec'ed child would */
        alarm(300);
        struct shm_seg ex;
        char err[256];
        if (shm_seg_attach_fd(&ex, dup(sp[0]), dup(sp[1]), dup(sp[2]), err, sizeof err) != 0) {
            fprintf(stderr, "child attach: %s\n", err);
            _exit(2);
        }
        shm_seg_set_pid(&ex, (int)getpid());
        shm_seg_set_state(&ex, SHM_STATE_READY);
        struct side sd = { .name = "executor process" };
        int rc = run_side(&ex.event, &ex.submit, 0, pl, &sd);
        shm_seg_close(&ex);
        _exit(rc ? 1 : 0);
    }
    struct side sd = { .name = "gateway process" };
    int rc = run_side(&seg.submit, &seg.event, 1, pl, &sd);
    if (rc) kill(pid, SIGKILL);
    int status = 0;
    T_CHECK(waitpid(pid, &status, 0) == pid);
    double s = (double)(shm_now_ns() - t0) * 1e-9;
    T_CHECKF(rc == 0, "gateway side: %s", sd.why);
    T_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "executor process status %d", status);
    T_EQ_INT(shm_seg_state(&seg), SHM_STATE_READY);
    T_EQ_INT(atomic_load(&seg.hdr->exec_pid), pid);
    T_EQ_INT(shm_ring_used(&seg.submit), 0);
    T_EQ_INT(shm_ring_used(&seg.event), 0);
    uint64_t total = 2 * (pl->n_duplex + pl->n_bursty + pl->n_pingpong + pl->n_race);
    printf("fork: %llu records in %.2f s (%.2f M/s), gateway side waited %llu times, stalled on full %llu times\n",
           (unsigned long long)total, s, (double)total / s * 1e-6, (unsigned long long)sd.waits,
           (unsigned long long)sd.full_stalls);
    shm_seg_close(&seg);
}

/* ---- a producer killed mid-record ---------------------------------------------------------- */

/* The executor process sends K records, reserves one more, half-writes it and is killed (as a
 * crash or the OOM killer would): the gateway gets exactly the K records, never the torn one, and
 * the ring stays usable for the next executor incarnation's records (same segment, new process). */
static void test_crash(void) {
    struct shm_seg seg;
    struct shm_seg_opts o = { .submit_cap = RING_CAP, .event_cap = RING_CAP };
    T_EQ_INT(shm_seg_create(&seg, &o), 0);
    enum { K = 1000 };
    for (int round = 0; round < 2; round++) {
        pid_t pid = fork();
        T_CHECK(pid >= 0);
        if (pid == 0) {
            alarm(60);
            struct shm_seg ex;   /* a new incarnation attaches: the ring goes on from the shared indices */
            char err[256];
            if (shm_seg_attach_fd(&ex, dup(seg.fd), dup(seg.submit_efd), dup(seg.event_efd), err, sizeof err))
                _exit(2);
            struct stream tx = { &ex.event, 0x3000 + (uint64_t)round, K, 0, shm_ring_max_payload(&ex.event), 1 };
            uint8_t *scratch = malloc(tx.maxp + 8);
            while (tx.done < K)
                if (send_one(&tx, scratch) == CM_EFULL) shm_ring_wait_space(&ex.event, tx.maxp, 1000);
            void *w;
            while (shm_ring_reserve(&ex.event, 4000, &w) == CM_EFULL) shm_ring_wait_space(&ex.event, 4000, 1000);
            memset(w, 0xee, 2000);
            raise(SIGKILL);
        }
        struct side sd = { .name = "crash receiver" };
        struct stream rx = { &seg.event, 0x3000 + (uint64_t)round, K, 0, shm_ring_max_payload(&seg.event), 0 };
        int status = 0, exited = 0;
        while (rx.done < K && !sd.bad) {
            int rc = recv_one(&rx, &sd);
            if (rc == CM_EEMPTY) {
                if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = 1;
                else if (exited) break;   /* dead and nothing more: records are missing */
                shm_ring_wait(&seg.event, 5);
            }
        }
        if (!exited) {
            if (sd.bad) kill(pid, SIGKILL);
            T_CHECK(waitpid(pid, &status, 0) == pid);
        }
        T_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        T_CHECKF(rx.done == K && !sd.bad, "round %d: received %llu of %d: %s", round, (ull)rx.done, K, sd.why);
        const void *p;
        size_t n;
        T_EQ_INT(shm_ring_peek(&seg.event, &p, &n), CM_EEMPTY);   /* the torn record never shows */
    }
    shm_seg_close(&seg);
}

/* ---- two threads (what ThreadSanitizer can check) ----------------------------------------- */

struct thr {
    struct shm_ring *tx, *rx;
    int gateway;
    const struct plan *pl;
    struct side sd;
    int rc;
};

static void *thr_main(void *arg) {
    struct thr *t = arg;
    t->rc = run_side(t->tx, t->rx, t->gateway, t->pl, &t->sd);
    return NULL;
}

static void test_threads(const struct plan *pl) {
    struct shm_seg seg;
    struct shm_seg_opts o = { .submit_cap = RING_CAP, .event_cap = RING_CAP };
    T_EQ_INT(shm_seg_create(&seg, &o), 0);
    /* The executor thread's own handles on the same mapping (separate per-side state). */
    struct shm_ring ex_submit, ex_event;
    uint8_t *b = seg.base;
    T_EQ_INT(shm_ring_open(&ex_submit, b + seg.hdr->submit_off, seg.hdr->submit_size, seg.submit_efd), 0);
    T_EQ_INT(shm_ring_open(&ex_event, b + seg.hdr->event_off, seg.hdr->event_size, seg.event_efd), 0);
    struct thr gw = { &seg.submit, &seg.event, 1, pl, { .name = "gateway thread" }, 0 };
    struct thr ex = { &ex_event, &ex_submit, 0, pl, { .name = "executor thread" }, 0 };
    uint64_t t0 = shm_now_ns();
    pthread_t th[2];
    T_EQ_INT(pthread_create(&th[0], NULL, thr_main, &gw), 0);
    T_EQ_INT(pthread_create(&th[1], NULL, thr_main, &ex), 0);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    double s = (double)(shm_now_ns() - t0) * 1e-9;
    T_CHECKF(gw.rc == 0, "gateway thread: %s", gw.sd.why);
    T_CHECKF(ex.rc == 0, "executor thread: %s", ex.sd.why);
    T_EQ_INT(shm_ring_used(&seg.submit), 0);
    T_EQ_INT(shm_ring_used(&seg.event), 0);
    uint64_t total = 2 * (pl->n_duplex + pl->n_bursty + pl->n_pingpong + pl->n_race);
    printf("threads: %llu records in %.2f s (%.2f M/s), waits %llu/%llu\n", (unsigned long long)total, s,
           (double)total / s * 1e-6, (unsigned long long)gw.sd.waits, (unsigned long long)ex.sd.waits);
    shm_seg_close(&seg);
}

int main(int argc, char **argv) {
    alarm(300);   /* a hang fails the test instead of stalling ctest */
    struct plan pl = make_plan();
    const char *only = argc > 1 ? argv[1] : "";
    printf("per direction: %llu duplex + %llu bursty + %llu ping-pong + %llu racing ping-pong records "
           "(sanitizer divisor %d)\n", (ull)pl.n_duplex, (ull)pl.n_bursty, (ull)pl.n_pingpong, (ull)pl.n_race, SAN_DIV);
    fflush(stdout);
    if (!*only || strcmp(only, "fork") == 0) test_fork(&pl);
    if (!*only || strcmp(only, "crash") == 0) test_crash();
    if (!*only || strcmp(only, "threads") == 0) test_threads(&pl);
    return t_done();
}
