/* shm/: rings (wrap-around, full, too big, reserve/commit, random sizes against a model FIFO,
 * corruption), the sleep/wake protocol, every record type's encode/decode round trip, corrupt and
 * truncated records rejected, segments (create, attach by fd/name/spec, wrong magic, version, size
 * and layout refused), state, heartbeat and stats. Single process. */
#include "shm/shm.h"
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {   /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A ring over private memory (the same code path as a segment). */
struct lring {
    void *mem;
    struct shm_ring prod, cons;
};

static int lring_make(struct lring *l, uint32_t cap, int efd) {
    size_t sz = shm_ring_region_size(cap);
    l->mem = aligned_alloc(64, (sz + 63) & ~(size_t)63);
    if (!l->mem) return CM_ENOMEM;
    memset(l->mem, 0xA5, sz);   /* poison: init must not rely on zeroed memory */
    int rc = shm_ring_init(l->mem, cap);
    if (rc == 0) rc = shm_ring_open(&l->prod, l->mem, sz, efd);
    if (rc == 0) rc = shm_ring_open(&l->cons, l->mem, sz, efd);
    return rc;
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((seed * 31 + i * 7) ^ (seed >> 8));
}
static int check_fill(const uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)((seed * 31 + i * 7) ^ (seed >> 8))) return 0;
    return 1;
}

static void test_ring_basic(void) {
    struct lring l;
    T_EQ_INT(lring_make(&l, 4096, -1), 0);
    const void *p;
    size_t n;
    uint8_t buf[2048];
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EEMPTY);
    T_EQ_INT(shm_ring_max_payload(&l.prod), 1024 - 8);

    /* zero-length and odd lengths */
    T_EQ_INT(shm_ring_push(&l.prod, "", 0), 0);
    T_EQ_INT(shm_ring_push(&l.prod, "abc", 3), 0);
    T_EQ_INT(shm_ring_used(&l.cons), 8 + 8 + 8);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_EQ_INT(n, 0);
    T_CHECK(((uintptr_t)p & 7) == 0);
    shm_ring_release(&l.cons);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_EQ_INT(n, 3);
    T_CHECK(memcmp(p, "abc", 3) == 0);
    const void *p2;
    T_EQ_INT(shm_ring_peek(&l.cons, &p2, &n), 0);   /* peeking again: the same record */
    T_CHECK(p2 == p && n == 3);
    shm_ring_release(&l.cons);
    shm_ring_release(&l.cons);                        /* second release is a no-op */
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EEMPTY);
    T_EQ_INT(shm_ring_used(&l.cons), 0);

    /* too big: a record may take a quarter of the ring, header included */
    uint8_t big[1100];
    memset(big, 7, sizeof big);
    T_EQ_INT(shm_ring_push(&l.prod, big, 1024 - 8 + 1), CM_ETOOBIG);
    T_EQ_INT(shm_ring_push(&l.prod, big, 1024 - 8), 0);
    T_EQ_INT(shm_ring_pop(&l.cons, buf, sizeof buf, &n), 0);
    T_EQ_INT(n, 1024 - 8);
    T_CHECK(buf[0] == 7 && buf[n - 1] == 7);

    /* full (fresh ring): exactly cap / record-size records fit, then CM_EFULL; a pop makes room
     * for exactly one more */
    struct lring f;
    T_EQ_INT(lring_make(&f, 4096, -1), 0);
    int k = 0;
    while (shm_ring_push(&f.prod, big, 120) == 0) k++;   /* 128-byte records */
    T_EQ_INT(k, 4096 / 128);
    T_EQ_INT(shm_ring_push(&f.prod, big, 0), CM_EFULL);
    T_EQ_INT(shm_ring_used(&f.prod), 4096);
    T_EQ_INT(shm_ring_pop(&f.cons, buf, sizeof buf, &n), 0);
    T_EQ_INT(shm_ring_push(&f.prod, big, 121), CM_EFULL);   /* 136 bytes do not fit in 128 */
    T_EQ_INT(shm_ring_push(&f.prod, big, 120), 0);
    T_EQ_INT(shm_ring_push(&f.prod, big, 0), CM_EFULL);
    /* pop into a small buffer: CM_ERANGE, the record stays */
    T_EQ_INT(shm_ring_pop(&f.cons, buf, 100, &n), CM_ERANGE);
    T_EQ_INT(n, 120);
    T_EQ_INT(shm_ring_pop(&f.cons, buf, sizeof buf, &n), 0);
    T_EQ_INT(n, 120);
    k = 0;
    while (shm_ring_pop(&f.cons, buf, sizeof buf, &n) == 0) k++;
    T_EQ_INT(k, 4096 / 128 - 1);
    T_EQ_INT(shm_ring_used(&f.cons), 0);
    free(f.mem);

    /* reserve/commit: commit less than reserved; an uncommitted reservation is invisible */
    void *w;
    T_EQ_INT(shm_ring_commit(&l.prod, 0), CM_EINVAL);            /* nothing reserved */
    T_EQ_INT(shm_ring_reserve(&l.prod, 200, &w), 0);
    T_CHECK(((uintptr_t)w & 7) == 0);
    memset(w, 0x5a, 200);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EEMPTY);
    T_EQ_INT(shm_ring_commit(&l.prod, 201), CM_EINVAL);
    T_EQ_INT(shm_ring_commit(&l.prod, 40), 0);
    T_EQ_INT(shm_ring_commit(&l.prod, 40), CM_EINVAL);           /* reservation is spent */
    T_EQ_INT(shm_ring_pop(&l.cons, buf, sizeof buf, &n), 0);
    T_EQ_INT(n, 40);
    T_CHECK(buf[0] == 0x5a && buf[39] == 0x5a);
    T_EQ_INT(shm_ring_reserve(&l.prod, 5000, &w), CM_ETOOBIG);

    /* wrap: a record that does not fit before the end goes to offset 0 behind a PAD record */
    uint64_t pos = atomic_load(&l.prod.ctl->head) & 4095;
    size_t first = 4096 - pos - 8 - 64;   /* leave 64 bytes before the end */
    while (first > 1000) {
        T_EQ_INT(shm_ring_push(&l.prod, big, 1000), 0);
        T_EQ_INT(shm_ring_pop(&l.cons, buf, sizeof buf, &n), 0);
        pos = atomic_load(&l.prod.ctl->head) & 4095;
        first = 4096 - pos - 8 - 64;
    }
    T_EQ_INT(shm_ring_push(&l.prod, big, first), 0);
    T_EQ_INT(shm_ring_pop(&l.cons, buf, sizeof buf, &n), 0);
    T_EQ_INT(atomic_load(&l.prod.ctl->head) & 4095, 4096 - 64);
    fill(buf, 100, 42);
    T_EQ_INT(shm_ring_push(&l.prod, buf, 100), 0);                /* 112 bytes > 64 left */
    T_EQ_INT(atomic_load(&l.prod.ctl->head) & 4095, 112);
    T_EQ_INT(shm_ring_used(&l.cons), 64 + 112);
    memset(buf, 0, 100);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_CHECK(p == l.cons.data + 8);
    T_EQ_INT(n, 100);
    T_CHECK(check_fill(p, 100, 42));
    shm_ring_release(&l.cons);
    T_EQ_INT(shm_ring_used(&l.cons), 0);
    free(l.mem);

    /* bad capacities */
    uint8_t region[8192] __attribute__((aligned(64)));
    T_EQ_INT(shm_ring_init(region, 3000), CM_EINVAL);
    T_EQ_INT(shm_ring_init(region, 2048), CM_EINVAL);
    T_EQ_INT(shm_ring_init(region, 4096), 0);
    struct shm_ring r;
    T_EQ_INT(shm_ring_open(&r, region, shm_ring_region_size(4096) + 8, -1), CM_EFORMAT);
    T_EQ_INT(shm_ring_open(&r, region, shm_ring_region_size(4096), -1), 0);
}

/* Random sizes and random interleaving against a model FIFO, on a small ring so that it wraps
 * thousands of times; every CM_EFULL is checked to be a real lack of room. */
static void test_ring_random(void) {
    enum { CAP = 4096, OPS = 200000, QMAX = 4096 };
    struct lring l;
    T_EQ_INT(lring_make(&l, CAP, -1), 0);
    static uint32_t qlen[QMAX];
    static uint64_t qseed[QMAX];
    size_t qh = 0, qt = 0;   /* model queue indices */
    uint8_t buf[CAP];
    uint64_t seed = 1;
    int bad_full = 0, bad_pop = 0, fulls = 0, wraps = 0;
    uint64_t last_pos = 0;
    size_t maxp = shm_ring_max_payload(&l.prod);
    for (int op = 0; op < OPS; op++) {
        if (rnd() % 100 < 55) {
            size_t len = rnd() % 8 == 0 ? rnd() % (maxp + 1) : rnd() % 200;
            uint64_t head = atomic_load(&l.prod.ctl->head), tail = atomic_load(&l.prod.ctl->tail);
            uint64_t need = 8 + ((len + 7) & ~(size_t)7), cpos = head & (CAP - 1);
            uint64_t total = need + (CAP - cpos < need ? CAP - cpos : 0);
            int rc;
            if (rnd() & 1) {
                fill(buf, len, seed);
                rc = shm_ring_push(&l.prod, buf, len);
            } else {
                void *w;
                rc = shm_ring_reserve(&l.prod, len + (rnd() % 3 ? 0 : 8 > maxp - len ? 0 : 8), &w);
                if (rc == CM_EFULL && len + 8 <= maxp) rc = shm_ring_reserve(&l.prod, len, &w);
                if (rc == 0) {
                    fill(w, len, seed);
                    rc = shm_ring_commit(&l.prod, len);
                }
            }
            if (rc == 0) {
                T_CHECK(qh - qt < QMAX);
                qlen[qh % QMAX] = (uint32_t)len;
                qseed[qh % QMAX] = seed++;
                qh++;
                uint64_t np = atomic_load(&l.prod.ctl->head) & (CAP - 1);
                if (np < last_pos) wraps++;
                last_pos = np;
                if (tail + CAP < head + total) bad_full++;   /* it accepted more than fits */
            } else {
                T_EQ_INT(rc, CM_EFULL);
                fulls++;
                if (head + total - tail <= CAP) bad_full++;  /* refused although it fits */
            }
        } else {
            size_t n;
            int rc = shm_ring_pop(&l.cons, buf, sizeof buf, &n);
            if (qh == qt) {
                if (rc != CM_EEMPTY) bad_pop++;
            } else if (rc != 0 || n != qlen[qt % QMAX] || !check_fill(buf, n, qseed[qt % QMAX])) {
                bad_pop++;
            } else {
                qt++;
            }
        }
    }
    T_EQ_INT(bad_full, 0);
    T_EQ_INT(bad_pop, 0);
    T_CHECK(fulls > 100);
    T_CHECK(wraps > 1000);
    free(l.mem);
}

/* A consumer must never read outside the ring, whatever the shared indices and headers say. */
static void test_ring_corrupt(void) {
    struct lring l;
    T_EQ_INT(lring_make(&l, 4096, -1), 0);
    const void *p;
    size_t n;
    uint32_t *h32 = (uint32_t *)l.cons.data;
    T_EQ_INT(shm_ring_push(&l.prod, "12345678", 8), 0);
    h32[1] = 0xdeadbeef;                                      /* unknown tag */
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EFORMAT);
    h32[1] = 0x31434552u;                                     /* REC1 again */
    h32[0] = 100;                                             /* longer than what was published */
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EFORMAT);
    h32[0] = 0xffffffffu;
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EFORMAT);
    h32[0] = 8;
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    shm_ring_release(&l.cons);
    /* head beyond tail + cap, misaligned head */
    atomic_store(&l.prod.ctl->head, l.cons.tail + 4096 + 8);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EFORMAT);
    T_EQ_INT(shm_ring_prepare_wait(&l.cons), CM_EFORMAT);
    atomic_store(&l.prod.ctl->head, l.cons.tail + 12);
    l.cons.head_seen = l.cons.tail;
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EFORMAT);
    /* a PAD that does not reach the end of the data area */
    atomic_store(&l.prod.ctl->head, l.cons.tail + 64);
    l.cons.head_seen = l.cons.tail;
    uint32_t *at = (uint32_t *)(l.cons.data + (l.cons.tail & 4095));
    at[0] = 16;
    at[1] = 0x31444150u;                                      /* PAD1 */
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EFORMAT);
    /* open refuses inconsistent control blocks */
    struct shm_ring r;
    atomic_store(&l.prod.ctl->head, 8 * 1000000);
    T_EQ_INT(shm_ring_open(&r, l.mem, shm_ring_region_size(4096), -1), CM_EFORMAT);
    atomic_store(&l.prod.ctl->head, l.cons.tail);
    l.prod.ctl->cap = 4097;
    T_EQ_INT(shm_ring_open(&r, l.mem, shm_ring_region_size(4096), -1), CM_EFORMAT);
    free(l.mem);
}

/* A ring full of garbage (random bytes, random indices): the consumer returns records only
 * inside the data area and otherwise CM_EFORMAT; open refuses impossible indices. */
static void test_ring_garbage(void) {
    enum { CAP = 4096 };
    size_t sz = shm_ring_region_size(CAP);
    uint8_t *mem = aligned_alloc(64, sz);
    int opened = 0, records = 0, outside = 0, other = 0;
    for (int it = 0; it < 3000; it++) {
        T_EQ_INT(shm_ring_init(mem, CAP), 0);
        struct shm_ring_ctl *c = (struct shm_ring_ctl *)mem;
        uint8_t *data = mem + sizeof *c;
        for (size_t i = 0; i < CAP; i += 8) {
            uint64_t v = rnd();
            if (rnd() % 4 == 0) {   /* plausible headers: small lengths, real tags */
                uint32_t h[2] = { (uint32_t)(rnd() % 1100), rnd() % 2 ? 0x31434552u : 0x31444150u };
                memcpy(&v, h, 8);
            }
            memcpy(data + i, &v, 8);
        }
        uint64_t tail = (rnd() % 100000) * 8;
        uint64_t head = tail + (rnd() % 8 == 0 ? rnd() % (3 * CAP) : (rnd() % (CAP / 8 + 1)) * 8);
        atomic_store(&c->head, head);
        atomic_store(&c->tail, tail);
        struct shm_ring r;
        if (shm_ring_open(&r, mem, sz, -1) != 0) continue;
        opened++;
        for (int k = 0; k < 64; k++) {
            const void *p;
            size_t n;
            int rc = shm_ring_peek(&r, &p, &n);
            if (rc == 0) {
                records++;
                if ((const uint8_t *)p < data || (const uint8_t *)p + n > data + CAP) outside++;
                shm_ring_release(&r);
            } else {
                if (rc != CM_EFORMAT && rc != CM_EEMPTY) other++;
                break;
            }
            if (rnd() % 3 == 0) atomic_store(&c->head, head + (rnd() % 64) * 8);   /* a moving head */
        }
    }
    T_EQ_INT(outside, 0);
    T_EQ_INT(other, 0);
    T_CHECK(opened > 1000 && records > 100);
    free(mem);
}

/* The waiting flag: a producer writes the eventfd once per sleep, never per record. */
static void test_ring_wake(void) {
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    T_CHECK(efd >= 0);
    struct lring l;
    T_EQ_INT(lring_make(&l, 4096, efd), 0);
    uint64_t v;
    T_EQ_INT(shm_ring_push(&l.prod, "x", 1), 0);
    T_CHECK(read(efd, &v, 8) < 0 && errno == EAGAIN);          /* nobody waits: no syscall */
    T_EQ_INT(shm_ring_prepare_wait(&l.cons), 0);                /* records there: do not sleep */
    T_EQ_INT(atomic_load(&l.cons.ctl->waiting), 0);
    size_t n;
    char c;
    T_EQ_INT(shm_ring_pop(&l.cons, &c, 1, &n), 0);
    T_EQ_INT(shm_ring_prepare_wait(&l.cons), 1);                /* empty: may sleep */
    T_EQ_INT(atomic_load(&l.cons.ctl->waiting), 1);
    T_EQ_INT(shm_ring_push(&l.prod, "y", 1), 0);                /* wakes: one write, flag cleared */
    T_EQ_INT(atomic_load(&l.cons.ctl->waiting), 0);
    T_CHECK(read(efd, &v, 8) == 8 && v == 1);
    T_EQ_INT(shm_ring_push(&l.prod, "z", 1), 0);                /* no second write */
    T_CHECK(read(efd, &v, 8) < 0 && errno == EAGAIN);
    /* batch: quiet commits, one notify */
    T_EQ_INT(shm_ring_prepare_wait(&l.cons), 0);
    while (shm_ring_pop(&l.cons, &c, 1, &n) == 0) {}
    T_EQ_INT(shm_ring_prepare_wait(&l.cons), 1);
    void *w;
    for (int i = 0; i < 5; i++) {
        T_EQ_INT(shm_ring_reserve(&l.prod, 8, &w), 0);
        T_EQ_INT(shm_ring_commit_quiet(&l.prod, 8), 0);
    }
    T_CHECK(read(efd, &v, 8) < 0 && errno == EAGAIN);
    shm_ring_notify(&l.prod);
    T_CHECK(read(efd, &v, 8) == 8 && v == 1);
    T_EQ_INT(shm_ring_wait(&l.cons, 1000), 0);                  /* records: returns at once */
    char cb[8];
    int k = 0;
    while (shm_ring_pop(&l.cons, cb, sizeof cb, &n) == 0) k++;
    T_EQ_INT(k, 5);
    /* timeout on an empty ring, with and without an eventfd */
    uint64_t t0 = shm_now_ns();
    T_EQ_INT(shm_ring_wait(&l.cons, 20), CM_ETIMEOUT);
    T_CHECK(shm_now_ns() - t0 >= 19000000ull);
    T_EQ_INT(atomic_load(&l.cons.ctl->waiting), 0);
    /* a stale eventfd count (left by an earlier race) does not end a wait early */
    v = 1;
    T_CHECK(write(efd, &v, 8) == 8);
    t0 = shm_now_ns();
    T_EQ_INT(shm_ring_wait(&l.cons, 30), CM_ETIMEOUT);
    T_CHECK(shm_now_ns() - t0 >= 29000000ull);
    T_CHECK(read(efd, &v, 8) < 0 && errno == EAGAIN);           /* it was drained */
    l.cons.efd = -1;
    t0 = shm_now_ns();
    T_EQ_INT(shm_ring_wait(&l.cons, 10), CM_ETIMEOUT);
    T_CHECK(shm_now_ns() - t0 >= 9000000ull);
    /* wait_space: room now, none later */
    T_EQ_INT(shm_ring_wait_space(&l.prod, 100, 0), 0);
    while (shm_ring_push(&l.prod, "0123456789", 10) == 0) {}
    T_EQ_INT(shm_ring_wait_space(&l.prod, 100, 5), CM_ETIMEOUT);
    T_EQ_INT(shm_ring_wait_space(&l.prod, 5000, 5), CM_ETOOBIG);
    close(efd);
    free(l.mem);
}

/* ---- protocol ---------------------------------------------------------------------------- */

static struct shm_submit sample_submit(int32_t *prompt, uint32_t n_prompt, struct shm_logit_bias *bias,
                                       uint32_t n_bias) {
    struct shm_submit s;
    memset(&s, 0, sizeof s);
    s.req_id = 0x1122334455667788ull;
    s.priority = -3;
    s.sp.temperature = 0.7f;
    s.sp.top_p = 0.9f;
    s.sp.min_p = 0.05f;
    s.sp.repeat_penalty = 1.1f;
    s.sp.penalty_last_n = -1;
    s.sp.presence_penalty = -0.5f;
    s.sp.frequency_penalty = 0.25f;
    s.sp.top_k = 40;
    s.sp.max_tokens = 123;
    s.sp.min_tokens = 7;
    s.sp.ignore_eos = 1;
    s.sp.seed = 0xfeedfacecafebeefull;
    s.sp.has_seed = 1;
    s.sp.logprobs = 1;
    s.sp.top_logprobs = 5;
    for (uint32_t i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(i * 7 + 1);
    s.prompt = prompt;
    s.n_prompt = n_prompt;
    s.n_stop = 3;
    s.stop[0] = 2; s.stop[1] = 13; s.stop[2] = 32000;
    for (uint32_t i = 0; i < n_bias; i++) bias[i] = (struct shm_logit_bias){ (int32_t)i * 3, (float)i - 100.0f };
    s.bias = bias;
    s.n_bias = n_bias;
    s.tenant = 0xa5a5000012345678ull;
    s.weight = 7;
    return s;
}

static int submit_equal(const struct shm_submit *a, const struct shm_submit *b) {
    return a->req_id == b->req_id && a->priority == b->priority && a->n_generated == b->n_generated &&
           memcmp(&a->sp, &b->sp, sizeof a->sp) == 0 && a->n_prompt == b->n_prompt &&
           memcmp(a->prompt, b->prompt, 4 * (size_t)a->n_prompt) == 0 && a->n_stop == b->n_stop &&
           memcmp(a->stop, b->stop, 4 * (size_t)a->n_stop) == 0 && a->n_bias == b->n_bias &&
           (a->n_bias == 0 || memcmp(a->bias, b->bias, 8 * (size_t)a->n_bias) == 0) && a->flags == b->flags &&
           a->pooling == b->pooling && a->normalize == b->normalize && a->grammar_len == b->grammar_len &&
           (a->grammar_len == 0 || memcmp(a->grammar, b->grammar, a->grammar_len) == 0) && a->tenant == b->tenant &&
           a->weight == b->weight;
}

static int decode_any(const void *buf, size_t len);

/* Random buffers of random lengths through every decoder. */
static void test_proto_garbage(void) {
    static uint8_t b[4096] __attribute__((aligned(8)));
    int decoded = 0;
    for (int it = 0; it < 20000; it++) {
        size_t len = rnd() % 2 ? rnd() % 64 : rnd() % sizeof b;
        for (size_t i = 0; i < len; i++) b[i] = (uint8_t)rnd();
        if (len >= 8) {   /* a valid type half of the time so the decoders get past the header */
            uint32_t h[2] = { (uint32_t)(1 + rnd() % 7), 0 };
            if (rnd() % 2) memcpy(b, h, 8);
        }
        if (decode_any(b, len) & ~1) decoded++;
    }
    T_CHECK(decoded < 200);   /* random bytes are (almost) never a valid record */
}

/* Decodes buf[0..len) copied into an exact-size heap block (ASan sees any over-read). */
static int decode_any(const void *buf, size_t len) {
    void *c = malloc(len ? len : 1);
    memcpy(c, buf, len);
    struct shm_submit s;
    struct shm_done d;
    struct shm_error e;
    struct shm_vocab vo;
    struct shm_embed em;
    struct shm_tokens_r rd;
    struct shm_tok t;
    const struct shm_top *top;
    uint64_t id;
    uint32_t type;
    int ok = 0;
    if (shm_msg_type(c, len, &type) == 0) ok |= 1;
    if (shm_submit_decode(c, len, &s) == 0) {
        ok |= 2;
        volatile int64_t sum = 0;   /* touch everything the decoder pointed at */
        for (uint32_t i = 0; i < s.n_prompt; i++) sum += s.prompt[i];
        for (uint32_t i = 0; i < s.n_bias; i++) sum += s.bias[i].token;
        for (uint32_t i = 0; i < s.grammar_len; i++) sum += ((const uint8_t *)s.grammar)[i];
    }
    if (shm_vocab_decode(c, len, &vo) == 0) {
        ok |= 128;
        volatile int64_t sum = 0;
        for (uint32_t i = 0; i < vo.bytes_len; i++) sum += vo.bytes[i];
        for (uint32_t i = 0; i <= vo.count; i++) sum += vo.off[i];
    }
    if (shm_embed_decode(c, len, &em) == 0) {
        ok |= 256;
        volatile float sum = 0;
        for (uint32_t i = 0; i < em.n_embd; i++) sum += em.v[i];
    }
    if (shm_cancel_decode(c, len, &id) == 0) ok |= 4;
    if (shm_done_decode(c, len, &d) == 0) ok |= 8;
    if (shm_error_decode(c, len, &e) == 0) ok |= 16;
    if (shm_tokens_open(&rd, c, len) == 0) {
        ok |= 32;
        int rc;
        volatile int64_t sum = 0;
        while ((rc = shm_tokens_next(&rd, &t, &top)) == 0)
            for (int i = 0; i < t.n_top; i++) sum += top[i].token;
        if (rc != CM_EEMPTY) ok |= 64;
    }
    free(c);
    return ok;
}

/* Every truncation is refused; random mutations never read out of bounds (ASan) and never decode
 * as a different type. */
static void check_corruptions(const uint8_t *rec, size_t len, int want_bit, const char *what) {
    int bad_trunc = 0, cross = 0;
    for (size_t cut = 0; cut < len; cut++)
        if (decode_any(rec, cut) & ~1) bad_trunc++;
    T_CHECKF(bad_trunc == 0, "%s: %d truncations decoded", what, bad_trunc);
    T_EQ_INT(decode_any(rec, len), 1 | want_bit);
    uint8_t *m = malloc(len + 64);
    for (int it = 0; it < 3000; it++) {
        memcpy(m, rec, len);
        int flips = 1 + (int)(rnd() % 4);
        size_t span = len < 96 ? len : 96;   /* mostly the fixed parts, sometimes anywhere */
        for (int f = 0; f < flips; f++) {
            size_t at = rnd() % 4 == 0 ? rnd() % len : rnd() % span;
            m[at] = rnd() % 3 == 0 ? 0xff : (uint8_t)rnd();
        }
        size_t ml = len;
        if (rnd() % 8 == 0) ml = len + 8 * (1 + rnd() % 7);   /* grown record */
        for (size_t i = len; i < ml; i++) m[i] = (uint8_t)rnd();
        int got = decode_any(m, ml) & ~1 & ~64;
        if (got & ~want_bit) cross++;
    }
    T_CHECKF(cross == 0, "%s: %d mutations decoded as another type", what, cross);
    free(m);
}

static void test_proto_submit(void) {
    static int32_t prompt[1000];
    static struct shm_logit_bias bias[SHM_MAX_LOGIT_BIAS + 1];
    static uint8_t buf[16384] __attribute__((aligned(8)));
    struct shm_submit s = sample_submit(prompt, 1000, bias, 300), d;
    size_t len;
    T_EQ_INT(shm_submit_size(&s), 96 + 4000 + 16 + 2400 + 16 + 16);
    T_EQ_INT(shm_submit_encode(&s, buf, sizeof buf, &len), 0);
    T_EQ_INT(len, shm_submit_size(&s));
    T_EQ_INT(shm_submit_decode(buf, len, &d), 0);
    T_CHECK(submit_equal(&s, &d));
    T_CHECK((const uint8_t *)d.prompt == buf + 96);
    uint32_t type;
    T_EQ_INT(shm_msg_type(buf, len, &type), 0);
    T_EQ_INT(type, SHM_MSG_SUBMIT);

    /* odd counts (padding), no bias, no stop */
    struct shm_submit s2 = sample_submit(prompt, 3, bias, 0);
    s2.n_stop = 1;
    s2.sp.has_seed = 0;
    s2.sp.seed = 0;
    s2.weight = 0; /* sent as 1 */
    T_EQ_INT(shm_submit_encode(&s2, buf, sizeof buf, &len), 0);
    T_EQ_INT(len, 96 + 16 + 8 + 16 + 16);
    T_EQ_INT(shm_submit_decode(buf, len, &d), 0);
    T_EQ_INT(d.weight, 1);
    s2.weight = 1;
    T_CHECK(submit_equal(&s2, &d));
    T_CHECK(d.bias == NULL);
    check_corruptions(buf, len, 2, "SUBMIT small");
    s2 = sample_submit(prompt, 5, bias, 4);
    T_EQ_INT(shm_submit_encode(&s2, buf, sizeof buf, &len), 0);
    check_corruptions(buf, len, 2, "SUBMIT");

    /* encoder refusals */
    struct shm_submit e = s;
    e.n_stop = SHM_MAX_STOP + 1;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_ETOOBIG);
    T_EQ_INT(shm_submit_size(&e), 0);
    e = s; e.n_bias = SHM_MAX_LOGIT_BIAS + 1;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_ETOOBIG);
    e = s; e.sp.temperature = NAN;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.sp.top_p = 0;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.sp.max_tokens = 0;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.sp.top_logprobs = SHM_MAX_TOP_LOGPROBS + 1;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.sp.min_tokens = e.sp.max_tokens + 1;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.sp.min_tokens = e.sp.max_tokens; /* the bound itself is fine */
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), 0);
    e = s; e.req_id = 0;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.n_prompt = 0;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.stop[1] = -5;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; prompt[500] = -1;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    prompt[500] = 1;
    e = s; e.weight = SHM_MAX_WEIGHT + 1;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; bias[7].bias = INFINITY;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    bias[7].bias = 0;
    T_EQ_INT(shm_submit_encode(&s, buf, 100, &len), CM_ERANGE);
    /* a resumed generation: its delivered tokens end the prompt, short of max_tokens */
    e = s; e.n_generated = 122;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), 0);
    T_EQ_INT(shm_submit_decode(buf, len, &d), 0);
    T_CHECK(submit_equal(&e, &d) && d.n_generated == 122);
    e = s; e.n_generated = 123; /* = max_tokens: nothing left to generate */
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = sample_submit(prompt, 3, bias, 0); e.n_generated = 3; /* no real prompt id left */
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);

    /* targeted corruptions of a valid record: each one is refused */
    T_EQ_INT(shm_submit_encode(&s, buf, sizeof buf, &len), 0);
    static uint8_t m[16384] __attribute__((aligned(8)));
    struct { size_t off; uint32_t val; int width; const char *what; } cases[] = {
        { 0, SHM_MSG_CANCEL, 4, "type" },         { 4, 1, 4, "flags" },
        { 8, 0, 4, "req_id low" },                /* needs the high half too, below */
        { 20, 1, 4, "reserved after priority" },
        { 24, 0x7fc00000u, 4, "temperature NaN" }, { 28, 0, 4, "top_p 0" },
        { 32, 0x3fc00000u, 4, "min_p 1.5" },       { 36, 0, 4, "repetition 0" },
        { 48, 0xffffffffu, 4, "top_k -1" },        { 52, 0xfffffffeu, 4, "penalty_last_n -2" },
        { 56, 0, 4, "max_tokens 0" },              { 60, 124, 4, "min_tokens over max_tokens" },
        { 56, 6, 4, "max_tokens under min_tokens" },
        { 72, 2, 1, "has_seed 2" },                { 73, 2, 1, "logprobs 2" },
        { 74, 21, 1, "top_logprobs 21" },          { 75, 2, 1, "ignore_eos 2" },
        { 76, 1, 1, "reserved" },
        { 80, 1001, 4, "n_prompt +1" },            { 80, 998, 4, "n_prompt -2" },
        { 80, 0, 4, "n_prompt 0" },                { 84, 17, 2, "n_stop 17" },
        { 84, 5, 2, "n_stop 5" },                  { 86, 301, 2, "n_bias 301" },
        { 88, 123, 4, "n_generated at max_tokens" },   { 88, 1000, 4, "n_generated = n_prompt" },
        { 92, 1, 4, "reserved after n_generated" },
        { 96 + 4 * 10, 0x80000000u, 4, "negative prompt id" },
        { 96 + 4000 + 4, 0xffffffffu, 4, "negative stop id" },
        { 96 + 4000 + 16 + 8 * 3, 0xfffffff0u, 4, "negative bias token" },
        { 96 + 4000 + 16 + 8 * 3 + 4, 0x7f800000u, 4, "infinite bias" },
        { 96 + 4000 + 16 + 2400 + 8, 0, 4, "weight 0" },
        { 96 + 4000 + 16 + 2400 + 8, SHM_MAX_WEIGHT + 1, 4, "weight over the cap" },
        { 96 + 4000 + 16 + 2400 + 12, 1, 4, "reserved after weight" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(m, buf, len);
        memcpy(m + cases[i].off, &cases[i].val, (size_t)cases[i].width);
        if (cases[i].off == 8) memset(m + 8, 0, 8);
        T_CHECKF(shm_submit_decode(m, len, &d) == CM_EFORMAT, "SUBMIT corruption '%s' accepted", cases[i].what);
    }
    T_EQ_INT(shm_submit_decode(buf, len + 8, &d), CM_EFORMAT);
    T_EQ_INT(shm_submit_decode(NULL, 0, &d), CM_EFORMAT);

    /* ring capacity for long prompts: 128k tokens fit the default 8 MiB ring */
    uint32_t cap = shm_submit_ring_cap_for(131072);
    T_CHECK(cap >= SHM_RING_CAP_MIN && cap <= SHM_SUBMIT_CAP_DEFAULT && (cap & (cap - 1)) == 0);
    T_CHECK((uint64_t)cap / 4 >= 8 + 96 + 4 * 131072ull + 64 + 2400 + 16 + 16);
    T_EQ_INT(shm_submit_ring_cap_for(0x7fffffff), 0);
}

/* Version 3: SUBMIT with a grammar or as an embedding, VOCAB and EMBED records. */
static void test_proto_v3(void) {
    static int32_t prompt[16];
    static struct shm_logit_bias bias[4];
    static uint8_t buf[16384] __attribute__((aligned(8)));
    static uint32_t prog[37];
    for (int i = 0; i < 37; i++) prog[i] = 0xabcd0000u + (uint32_t)i;
    struct shm_submit s = sample_submit(prompt, 5, bias, 2), d;
    s.flags = SHM_SUBMIT_GRAMMAR;
    s.grammar = prog;
    s.grammar_len = sizeof prog;
    size_t len;
    T_EQ_INT(shm_submit_size(&s), 96 + 24 + 16 + 16 + 16 + 16 + 152);
    T_EQ_INT(shm_submit_encode(&s, buf, sizeof buf, &len), 0);
    T_EQ_INT(shm_submit_decode(buf, len, &d), 0);
    T_CHECK(submit_equal(&s, &d));
    T_CHECK(((uintptr_t)d.grammar & 3) == 0);
    check_corruptions(buf, len, 2, "SUBMIT grammar");
    struct shm_submit e = s;
    e.grammar_len = 6; /* not whole words */
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.flags = 0; /* a grammar without its flag */
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.flags = SHM_SUBMIT_GRAMMAR | SHM_SUBMIT_EMBED;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = s; e.grammar_len = SHM_MAX_GRAMMAR + 4;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_ETOOBIG);
    e = s; e.flags = 8;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    /* an embedding */
    e = sample_submit(prompt, 7, bias, 0);
    e.flags = SHM_SUBMIT_EMBED;
    e.pooling = 2;
    e.normalize = 1;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), 0);
    T_EQ_INT(shm_submit_decode(buf, len, &d), 0);
    T_CHECK(submit_equal(&e, &d) && d.grammar == NULL);
    check_corruptions(buf, len, 2, "SUBMIT embed");
    e.pooling = 4;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e.pooling = 0;
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);
    e = sample_submit(prompt, 7, bias, 0);
    e.pooling = 1; /* pooling without the flag */
    T_EQ_INT(shm_submit_encode(&e, buf, sizeof buf, &len), CM_EINVAL);

    /* VOCAB */
    uint32_t off[4] = { 0, 2, 2, 7 };
    const uint8_t bytes[7] = { 'a', 'b', 'x', 'y', 'z', 0, 0xff };
    struct shm_vocab v = { 10, 4, 3, off, bytes, 7 }, vd;
    T_EQ_INT(shm_vocab_size(3, 7), 24 + 16 + 8);
    T_EQ_INT(shm_vocab_encode(&v, buf, sizeof buf, &len), 0);
    T_EQ_INT(shm_vocab_decode(buf, len, &vd), 0);
    T_CHECK(vd.n_total == 10 && vd.first == 4 && vd.count == 3 && vd.bytes_len == 7 && !memcmp(vd.off, off, 16) &&
            !memcmp(vd.bytes, bytes, 7));
    uint32_t type;
    T_CHECK(shm_msg_type(buf, len, &type) == 0 && type == SHM_MSG_VOCAB);
    check_corruptions(buf, len, 128, "VOCAB");
    struct shm_vocab bad = v;
    bad.first = 8; /* past n_total */
    T_EQ_INT(shm_vocab_encode(&bad, buf, sizeof buf, &len), CM_EINVAL);
    uint32_t off2[4] = { 0, 3, 2, 7 };
    bad = v;
    bad.off = off2;
    T_EQ_INT(shm_vocab_encode(&bad, buf, sizeof buf, &len), CM_EINVAL);

    /* EMBED */
    float vec[5] = { 0.5f, -1, 2, 0, 1e-3f };
    struct shm_embed em = { 77, 5, 9, vec }, ed;
    T_EQ_INT(shm_embed_encode(&em, buf, sizeof buf, &len), 0);
    T_EQ_INT(len, 24 + 24);
    T_EQ_INT(shm_embed_decode(buf, len, &ed), 0);
    T_CHECK(ed.req_id == 77 && ed.n_embd == 5 && ed.prompt_tokens == 9 && !memcmp(ed.v, vec, 20));
    check_corruptions(buf, len, 256, "EMBED");
    vec[2] = NAN;
    T_EQ_INT(shm_embed_encode(&em, buf, sizeof buf, &len), CM_EINVAL);
}

static void test_proto_others(void) {
    static uint8_t buf[65536] __attribute__((aligned(8)));
    size_t len;
    uint64_t id;
    /* CANCEL */
    T_EQ_INT(shm_cancel_encode(99, buf, sizeof buf, &len), 0);
    T_EQ_INT(len, SHM_CANCEL_SIZE);
    T_EQ_INT(shm_cancel_decode(buf, len, &id), 0);
    T_EQ_INT(id, 99);
    check_corruptions(buf, len, 4, "CANCEL");
    T_EQ_INT(shm_cancel_encode(0, buf, sizeof buf, &len), CM_EINVAL);
    T_EQ_INT(shm_cancel_encode(1, buf, 15, &len), CM_ERANGE);

    /* DONE */
    struct shm_done d = { 5, SHM_FINISH_STOP, 100, 17, 64, 1000, 2000000, 3000000000ull }, d2;
    T_EQ_INT(shm_done_encode(&d, buf, sizeof buf, &len), 0);
    T_EQ_INT(len, SHM_DONE_SIZE);
    T_EQ_INT(shm_done_decode(buf, len, &d2), 0);
    T_CHECK(memcmp(&d, &d2, sizeof d) == 0);
    check_corruptions(buf, len, 8, "DONE");
    uint8_t m[256] __attribute__((aligned(8)));
    memcpy(m, buf, len);
    uint32_t bad_finish = SHM_FINISH_COUNT;
    memcpy(m + 16, &bad_finish, 4);
    T_EQ_INT(shm_done_decode(m, len, &d2), CM_EFORMAT);
    struct shm_done dc = d;
    dc.cached_prompt_tokens = 101;
    T_EQ_INT(shm_done_encode(&dc, buf, sizeof buf, &len), CM_EINVAL);
    uint32_t none = SHM_FINISH_NONE; /* a DONE always says how the sequence ended */
    memcpy(m + 16, &none, 4);
    T_EQ_INT(shm_done_decode(m, len, &d2), CM_EFORMAT);
    for (int f = SHM_FINISH_NONE + 1; f < SHM_FINISH_COUNT; f++) {
        d.finish = (uint32_t)f;
        T_EQ_INT(shm_done_encode(&d, buf, sizeof buf, &len), 0);
        T_EQ_INT(shm_done_decode(buf, len, &d2), 0);
        T_EQ_INT(d2.finish, f);
    }

    /* ERROR: empty, short, truncated at 256 bytes without cutting a UTF-8 sequence */
    struct shm_error e;
    T_EQ_INT(shm_error_encode(0, CM_ENOKV, "out of blocks", buf, sizeof buf, &len), 0);
    T_EQ_INT(len, 24 + 16);
    T_EQ_INT(shm_error_decode(buf, len, &e), 0);
    T_CHECK(e.req_id == 0 && e.code == CM_ENOKV && e.msg_len == 13);
    T_EQ_STR(e.msg, "out of blocks");
    check_corruptions(buf, len, 16, "ERROR");
    T_EQ_INT(shm_error_encode(7, CM_ECUDA, NULL, buf, sizeof buf, &len), 0);
    T_EQ_INT(shm_error_decode(buf, len, &e), 0);
    T_CHECK(e.req_id == 7 && e.msg_len == 0 && e.msg[0] == 0);
    char longmsg[400];
    memset(longmsg, 'a', sizeof longmsg);
    longmsg[399] = 0;
    memcpy(longmsg + 254, "\xc3\xa9", 2);   /* U+00E9 across bytes 254..255: fits */
    T_EQ_INT(shm_error_encode(7, CM_EIO, longmsg, buf, sizeof buf, &len), 0);
    T_EQ_INT(shm_error_decode(buf, len, &e), 0);
    T_EQ_INT(e.msg_len, 256);
    memcpy(longmsg + 254, "a\xc3\xa9", 3);  /* now across 255..256: clipped to 255 */
    T_EQ_INT(shm_error_encode(7, CM_EIO, longmsg, buf, sizeof buf, &len), 0);
    T_EQ_INT(shm_error_decode(buf, len, &e), 0);
    T_EQ_INT(e.msg_len, 255);
    T_EQ_INT(strlen(e.msg), 255);
    T_EQ_INT(shm_error_encode(7, 0, "x", buf, sizeof buf, &len), CM_EINVAL);
    T_EQ_INT(shm_error_encode(7, -1, "0123456789", buf, 30, &len), CM_ERANGE);
    T_EQ_INT(shm_error_encode(7, -1, "0123456789", buf, sizeof buf, &len), 0);
    memcpy(m, buf, len);
    m[24 + 3] = 0;                                     /* NUL inside the message */
    T_EQ_INT(shm_error_decode(m, len, &e), CM_EFORMAT);
    memcpy(m, buf, len);
    uint32_t ml = 257;
    memcpy(m + 20, &ml, 4);
    T_EQ_INT(shm_error_decode(m, len, &e), CM_EFORMAT);

    /* TOKENS: empty step, several sequences, logprobs with and without alternatives */
    struct shm_tokens_w w;
    struct shm_tokens_r rd;
    struct shm_tok t;
    const struct shm_top *top;
    T_EQ_INT(shm_tokens_begin(&w, buf, 10, 1), CM_ERANGE);
    T_EQ_INT(shm_tokens_begin(&w, buf, sizeof buf, 42), 0);
    len = shm_tokens_end(&w);
    T_EQ_INT(len, 24);
    T_EQ_INT(shm_tokens_open(&rd, buf, len), 0);
    T_EQ_INT(rd.step, 42);
    T_EQ_INT(shm_tokens_next(&rd, &t, &top), CM_EEMPTY);

    struct shm_top tops[SHM_MAX_TOP_LOGPROBS + 1];
    for (int i = 0; i <= SHM_MAX_TOP_LOGPROBS; i++) tops[i] = (struct shm_top){ 100 + i, -0.1f * (float)i };
    size_t cap = shm_tokens_size(64, 64 * 3);
    T_EQ_INT(shm_tokens_begin(&w, buf, cap, 7), 0);
    for (uint32_t i = 0; i < 64; i++) {
        struct shm_tok a = { 1000 + i % 8, i / 8, (int32_t)(i * 11), -0.5f * (float)i, (uint8_t)(i % 4),
                             (uint8_t)(i % 3 ? SHM_TOK_LOGPROB : 0), 0 };
        T_EQ_INT(shm_tokens_add(&w, &a, tops), 0);
    }
    len = shm_tokens_end(&w);
    T_EQ_INT(len, 24 + 64 * 24 + 8 * (16 * (0 + 1 + 2 + 3)));
    T_EQ_INT(shm_tokens_open(&rd, buf, len), 0);
    T_EQ_INT(rd.n, 64);
    int bad = 0;
    for (uint32_t i = 0; i < 64; i++) {
        if (shm_tokens_next(&rd, &t, &top) != 0) { bad++; break; }
        int lp = i % 3 != 0;
        if (t.req_id != 1000 + i % 8 || t.seq != i / 8 || t.token != (int32_t)(i * 11) || t.n_top != i % 4 ||
            t.flags != (lp ? SHM_TOK_LOGPROB : 0) || (lp && t.logprob != -0.5f * (float)i) || (!lp && t.logprob != 0))
            bad++;
        for (uint32_t k = 0; k < t.n_top; k++)
            if (top[k].token != (int32_t)(100 + k) || top[k].logprob != -0.1f * (float)k) bad++;
        if (t.n_top == 0 && top != NULL) bad++;
    }
    T_EQ_INT(bad, 0);
    T_EQ_INT(shm_tokens_next(&rd, &t, &top), CM_EEMPTY);
    {
        size_t small;
        T_EQ_INT(shm_tokens_begin(&w, m, sizeof m, 3), 0);
        struct shm_tok a = { 9, 0, 5, -1.0f, 2, SHM_TOK_LOGPROB, 0 };
        T_EQ_INT(shm_tokens_add(&w, &a, tops), 0);
        a.seq = 1; a.n_top = 0; a.flags = 0;
        T_EQ_INT(shm_tokens_add(&w, &a, NULL), 0);
        small = shm_tokens_end(&w);
        check_corruptions(m, small, 32, "TOKENS");
    }
    {   /* admission data after a first token's alternatives; only with the flag, reserved 0 */
        struct shm_tok_admit ad = { 4096, 0, 123456789ull }, got;
        T_EQ_INT(shm_tokens_begin(&w, m, sizeof m, 4), 0);
        struct shm_tok a = { 11, 0, 5, -1.0f, 2, SHM_TOK_LOGPROB | SHM_TOK_ADMIT, 0 };
        T_EQ_INT(shm_tokens_add(&w, &a, tops), CM_EINVAL);        /* the flag needs the data */
        T_EQ_INT(shm_tokens_add_admit(&w, &a, tops, &ad), 0);
        struct shm_tok b = { 12, 3, 6, 0, 0, 0, 0 };
        T_EQ_INT(shm_tokens_add_admit(&w, &b, NULL, &ad), CM_EINVAL); /* data needs the flag */
        T_EQ_INT(shm_tokens_add(&w, &b, NULL), 0);
        ad.reserved = 1;
        T_EQ_INT(shm_tokens_add_admit(&w, &a, tops, &ad), CM_EINVAL);
        size_t al = shm_tokens_end(&w);
        T_EQ_INT(al, shm_tokens_size(2, 2) + sizeof(struct shm_tok_admit));
        T_EQ_INT(shm_tokens_open(&rd, m, al), 0);
        T_EQ_INT(shm_tokens_next(&rd, &t, &top), 0);
        T_EQ_INT(shm_tokens_admit(&rd, &got), 0);
        T_CHECK(got.cached_prompt_tokens == 4096 && got.queue_ns == 123456789ull && top[1].token == 101);
        T_EQ_INT(shm_tokens_next(&rd, &t, &top), 0);
        T_EQ_INT(t.req_id, 12);
        T_EQ_INT(shm_tokens_admit(&rd, &got), CM_ENOENT);
        check_corruptions(m, al, 32, "TOKENS with admission");
        uint32_t one = 1; /* reserved of the admission data */
        memcpy(m + 24 + 24 + 16 + 4, &one, 4);
        T_EQ_INT(shm_tokens_open(&rd, m, al), CM_EFORMAT);
    }
    /* writer refusals; a full writer keeps what it has */
    T_EQ_INT(shm_tokens_begin(&w, buf, shm_tokens_size(2, 0), 1), 0);
    struct shm_tok a = { 1, 0, 5, 0, 0, 0, 0 };
    T_EQ_INT(shm_tokens_add(&w, &a, NULL), 0);
    a.token = -1;
    T_EQ_INT(shm_tokens_add(&w, &a, NULL), CM_EINVAL);
    a.token = 1; a.n_top = SHM_MAX_TOP_LOGPROBS + 1;
    T_EQ_INT(shm_tokens_add(&w, &a, tops), CM_EINVAL);
    a.n_top = 1;
    T_EQ_INT(shm_tokens_add(&w, &a, tops), CM_EFULL);
    a.n_top = 0; a.flags = SHM_TOK_LOGPROB; a.logprob = NAN;
    T_EQ_INT(shm_tokens_add(&w, &a, NULL), CM_EINVAL);
    a.flags = 0x80;
    T_EQ_INT(shm_tokens_add(&w, &a, NULL), CM_EINVAL);
    a.flags = 0; a.seq = 1;
    T_EQ_INT(shm_tokens_add(&w, &a, NULL), 0);
    a.seq = 2;
    T_EQ_INT(shm_tokens_add(&w, &a, NULL), CM_EFULL);
    len = shm_tokens_end(&w);
    T_EQ_INT(shm_tokens_open(&rd, buf, len), 0);
    T_EQ_INT(rd.n, 2);
    /* count and length must agree */
    memcpy(m, buf, len);
    uint32_t n3 = 3;
    memcpy(m + 8, &n3, 4);
    T_EQ_INT(shm_tokens_open(&rd, m, len), CM_EFORMAT);
    uint32_t n1 = 1;
    memcpy(m + 8, &n1, 4);
    T_EQ_INT(shm_tokens_open(&rd, m, len), CM_EFORMAT);
    memcpy(m, buf, len);
    m[24 + 20] = 1;                                     /* n_top says one pair that is not there */
    T_EQ_INT(shm_tokens_open(&rd, m, len), CM_EFORMAT);
    T_EQ_INT(shm_tokens_open(&rd, buf, len - 8), CM_EFORMAT);
}

/* The senders go through the ring and come out decodable; too-long prompts are refused. */
static void test_proto_ring(void) {
    struct lring l;
    T_EQ_INT(lring_make(&l, 65536, -1), 0);
    static int32_t prompt[5000];
    static struct shm_logit_bias bias[10];
    struct shm_submit s = sample_submit(prompt, 3000, bias, 10), d;
    T_EQ_INT(shm_send_submit(&l.prod, &s), 0);
    T_EQ_INT(shm_send_cancel(&l.prod, s.req_id), 0);
    struct shm_done done = { 8, SHM_FINISH_LENGTH, 3000, 123, 0, 1, 2, 3 }, dd;
    T_EQ_INT(shm_send_done(&l.prod, &done), 0);
    T_EQ_INT(shm_send_error(&l.prod, 8, CM_ENOKV, "no room"), 0);
    T_EQ_INT(shm_send_cancel(&l.prod, 0), CM_EINVAL);
    T_EQ_INT(shm_send_error(&l.prod, 8, 3, "x"), CM_EINVAL);
    struct shm_submit big = sample_submit(prompt, 5000, bias, 10);   /* 20 KB > 16 KB limit */
    T_EQ_INT(shm_send_submit(&l.prod, &big), CM_ETOOBIG);
    const void *p;
    size_t n;
    uint32_t type;
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_EQ_INT(shm_msg_type(p, n, &type), 0);
    T_EQ_INT(type, SHM_MSG_SUBMIT);
    T_EQ_INT(shm_submit_decode(p, n, &d), 0);
    T_CHECK(submit_equal(&s, &d));
    shm_ring_release(&l.cons);
    uint64_t id;
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_EQ_INT(shm_cancel_decode(p, n, &id), 0);
    T_EQ_INT(id, s.req_id);
    shm_ring_release(&l.cons);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_EQ_INT(shm_done_decode(p, n, &dd), 0);
    T_CHECK(memcmp(&dd, &done, sizeof dd) == 0);
    shm_ring_release(&l.cons);
    struct shm_error e;
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_EQ_INT(shm_error_decode(p, n, &e), 0);
    T_EQ_STR(e.msg, "no room");
    shm_ring_release(&l.cons);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), CM_EEMPTY);

    /* TOKENS zero-copy: reserve the worst case, commit what was written */
    void *w;
    struct shm_tokens_w tw;
    T_EQ_INT(shm_ring_reserve(&l.prod, shm_tokens_size(256, 256 * 4), &w), 0);
    T_EQ_INT(shm_tokens_begin(&tw, w, shm_tokens_size(256, 256 * 4), 99), 0);
    struct shm_tok t = { 4, 0, 17, -0.25f, 0, SHM_TOK_LOGPROB, 0 };
    T_EQ_INT(shm_tokens_add(&tw, &t, NULL), 0);
    T_EQ_INT(shm_ring_commit(&l.prod, shm_tokens_end(&tw)), 0);
    T_EQ_INT(shm_ring_peek(&l.cons, &p, &n), 0);
    T_EQ_INT(n, 48);
    struct shm_tokens_r rd;
    const struct shm_top *top;
    T_EQ_INT(shm_tokens_open(&rd, p, n), 0);
    T_EQ_INT(shm_tokens_next(&rd, &t, &top), 0);
    T_CHECK(t.req_id == 4 && t.token == 17 && t.logprob == -0.25f && rd.step == 99);
    shm_ring_release(&l.cons);
    free(l.mem);
}

/* ---- segments ---------------------------------------------------------------------------- */

static void test_seg(void) {
    struct shm_seg a, b;
    char err[256];
    struct shm_seg_opts o = { .submit_cap = 100000, .event_cap = 5000 };
    T_EQ_INT(shm_seg_create(&a, &o), 0);
    T_EQ_INT(a.hdr->submit_cap, 131072);
    T_EQ_INT(a.hdr->event_cap, 8192);
    T_CHECK(a.fd >= 0 && a.submit_efd >= 0 && a.event_efd >= 0);
    T_CHECK((fcntl(a.fd, F_GETFD) & FD_CLOEXEC) != 0);
    T_EQ_INT(shm_seg_state(&a), SHM_STATE_STARTING);
    T_EQ_INT(a.hdr->total_size, a.size);
    T_CHECK(a.hdr->submit_off % SHM_ALIGN == 0 && a.hdr->stats_off % SHM_ALIGN == 0);
    T_CHECK(ftruncate(a.fd, 4096) != 0);                  /* sealed: nobody can shrink it */
    T_EQ_INT(shm_seg_set_inherit(&a, 1), 0);
    T_CHECK((fcntl(a.event_efd, F_GETFD) & FD_CLOEXEC) == 0);
    T_EQ_INT(shm_seg_set_inherit(&a, 0), 0);
    T_CHECK((fcntl(a.event_efd, F_GETFD) & FD_CLOEXEC) != 0);

    /* attach through a spec naming dup'ed fds: a second mapping at another address */
    int fds[3] = { dup(a.fd), dup(a.submit_efd), dup(a.event_efd) };
    char spec[128];
    T_EQ_INT(shm_seg_spec(&a, fds, spec, sizeof spec), 0);
    char want[128];
    snprintf(want, sizeof want, "fd:%d:%d:%d", fds[0], fds[1], fds[2]);
    T_EQ_STR(spec, want);
    T_EQ_INT(shm_seg_spec(&a, fds, spec, 6), CM_ERANGE);
    T_EQ_INT(shm_seg_spec(&a, fds, spec, sizeof spec), 0);
    T_EQ_INT(shm_seg_attach_spec(&b, spec, err, sizeof err), 0);
    T_CHECK(b.base != a.base);
    T_EQ_INT(b.submit.cap, 131072);
    /* offsets, not pointers: gateway side a produces, executor side b consumes, and back */
    T_EQ_INT(shm_ring_push(&a.submit, "hello", 5), 0);
    char buf[64];
    size_t n;
    T_EQ_INT(shm_ring_wait(&b.submit, 1000), 0);
    T_EQ_INT(shm_ring_pop(&b.submit, buf, sizeof buf, &n), 0);
    T_CHECK(n == 5 && memcmp(buf, "hello", 5) == 0);
    T_EQ_INT(shm_ring_prepare_wait(&a.event), 1);
    T_EQ_INT(shm_send_error(&b.event, 0, CM_EIO, "disk"), 0);
    uint64_t v;
    T_CHECK(read(a.event_efd, &v, 8) == 8 && v == 1);     /* b woke a through the inherited eventfd */
    shm_ring_cancel_wait(&a.event);
    T_EQ_INT(shm_ring_pop(&a.event, buf, sizeof buf, &n), 0);

    /* state, pid, heartbeat */
    shm_seg_set_pid(&b, 4242);
    shm_seg_set_state(&b, SHM_STATE_READY);
    T_EQ_INT(shm_seg_state(&a), SHM_STATE_READY);
    T_EQ_INT(atomic_load(&a.hdr->exec_pid), 4242);
    T_EQ_STR(shm_state_name(SHM_STATE_DRAINING), "draining");
    T_EQ_STR(shm_state_name(99), "unknown");
    uint64_t before = atomic_load(&a.hdr->heartbeat);
    shm_seg_beat(&b);
    T_EQ_INT(atomic_load(&a.hdr->heartbeat), before + 1);
    uint64_t now = shm_now_ns();
    T_CHECK(shm_seg_beat_age_ns(&a, now) < 1000000000ull);
    T_CHECK(shm_seg_beat_age_ns(&a, now + 5000000000ull) >= 5000000000ull);

    /* stats: the executor's side writes, the gateway's side reads */
    shm_stat_set(&b.stats->kv_blocks_total, 1000);
    shm_stat_add(&b.stats->generation_tokens_total, 7);
    shm_stat_add(&b.stats->generation_tokens_total, 5);
    T_EQ_INT(shm_stat_get(&a.stats->kv_blocks_total), 1000);
    T_EQ_INT(shm_stat_get(&a.stats->generation_tokens_total), 12);
    shm_hist_observe(&b.stats->step_time_us, 100);      /* <= 250 */
    shm_hist_observe(&b.stats->step_time_us, 250);      /* <= 250 (bounds inclusive) */
    shm_hist_observe(&b.stats->step_time_us, 251);      /* <= 500 */
    shm_hist_observe(&b.stats->step_time_us, UINT64_MAX - 1);   /* +Inf */
    struct shm_hist_snap hs;
    shm_hist_read(&a.stats->step_time_us, &hs);
    T_EQ_INT(hs.le[0], 250);
    T_EQ_INT(hs.cum[0], 2);
    T_EQ_INT(hs.cum[1], 3);
    T_EQ_INT(hs.cum[hs.n - 2], 3);
    T_EQ_INT(hs.cum[hs.n - 1], 4);
    T_EQ_INT(hs.count, 4);
    T_CHECK(hs.le[hs.n - 1] == UINT64_MAX);
    shm_hist_observe(&b.stats->batch_size, 3);
    shm_hist_read(&a.stats->batch_size, &hs);
    T_CHECK(hs.cum[1] == 0 && hs.cum[2] == 1 && hs.sum == 3);

    /* wrong magic, version, sizes, layout: refused with a reason */
    struct shm_hdr saved = *a.hdr;
    struct shm_seg c;
    int fd2 = dup(a.fd);
    a.hdr->magic ^= 1;
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    T_CHECKF(strstr(err, "magic") != NULL, "%s", err);
    T_CHECK(c.base == NULL);
    *a.hdr = saved;
    a.hdr->version = SHM_VERSION + 1;
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EUNSUPPORTED);
    T_CHECKF(strstr(err, "version") != NULL, "%s", err);
    *a.hdr = saved;
    a.hdr->total_size += 4096;
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    T_CHECKF(strstr(err, "size") != NULL, "%s", err);
    *a.hdr = saved;
    a.hdr->hdr_size -= 8;
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    *a.hdr = saved;
    a.hdr->stats_size += 8;
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    *a.hdr = saved;
    a.hdr->event_off = a.hdr->submit_off;                 /* overlapping parts */
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    T_CHECKF(strstr(err, "layout") != NULL, "%s", err);
    *a.hdr = saved;
    a.hdr->stats_off = UINT64_MAX - 4095;                 /* would overflow an unchecked sum */
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    *a.hdr = saved;
    a.hdr->submit_cap = 100000;                           /* not a power of two */
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    *a.hdr = saved;
    a.stats->batch_size.n = SHM_HIST_MAX + 1;
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    a.stats->batch_size.n = 12;
    a.submit.ctl->cap = 65536;                            /* ring control block disagrees */
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), CM_EFORMAT);
    a.submit.ctl->cap = 131072;
    T_EQ_INT(shm_seg_attach_fd(&c, fd2, -1, -1, err, sizeof err), 0);   /* all restored */
    shm_seg_close(&c);                                                    /* closes fd2 */
    int mfd = memfd_create("not-a-segment", MFD_CLOEXEC);
    T_EQ_INT(shm_seg_attach_fd(&c, mfd, -1, -1, err, sizeof err), CM_EFORMAT);   /* empty file */
    T_CHECK(ftruncate(mfd, 65536) == 0);
    T_EQ_INT(shm_seg_attach_fd(&c, mfd, -1, -1, err, sizeof err), CM_EFORMAT);   /* zeros */
    close(mfd);
    T_EQ_INT(shm_seg_attach_fd(&c, -1, -1, -1, err, sizeof err), CM_EIO);

    /* malformed specs */
    const char *bad_specs[] = { "", "fd:", "fd:3", "fd:3:4", "fd:x:4:5", "fd:3:4:5x", "pipe:3:4:5",
                                "fd::4:5", "name::-:-", "fd:-:4:5", "fd:3:4:99999999999" };
    for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++)
        T_CHECKF(shm_seg_attach_spec(&c, bad_specs[i], err, sizeof err) == CM_EINVAL, "spec '%s'", bad_specs[i]);
    T_EQ_INT(shm_seg_attach_spec(&c, NULL, err, sizeof err), CM_EINVAL);

    shm_seg_close(&b);
    shm_seg_close(&a);
    shm_seg_close(&a);   /* idempotent */
    shm_seg_close(NULL);

    /* named segments (debugging): create, attach by spec, size mismatch refused, unlinked on close */
    char name[64];
    snprintf(name, sizeof name, "/arka-test-shm-%d", (int)getpid());
    struct shm_seg_opts no = { .submit_cap = 4096, .event_cap = 4096, .name = name, .no_eventfd = 1 };
    T_EQ_INT(shm_seg_create(&a, &no), 0);
    T_EQ_INT(shm_seg_create(&b, &no), CM_EIO);            /* exists */
    T_EQ_INT(shm_seg_spec(&a, NULL, spec, sizeof spec), 0);
    snprintf(want, sizeof want, "name:%s:-:-", name);
    T_EQ_STR(spec, want);
    T_EQ_INT(shm_seg_attach_spec(&b, spec, err, sizeof err), 0);
    T_EQ_INT(shm_ring_push(&b.event, "ev", 2), 0);
    T_EQ_INT(shm_ring_wait(&a.event, 100), 0);            /* sleep-poll path, no eventfd */
    T_EQ_INT(shm_ring_pop(&a.event, buf, sizeof buf, &n), 0);
    shm_seg_close(&b);
    T_CHECK(ftruncate(a.fd, (off_t)a.size + 4096) == 0);  /* named segments are not sealed */
    T_EQ_INT(shm_seg_attach_name(&b, name, -1, -1, err, sizeof err), CM_EFORMAT);
    T_CHECKF(strstr(err, "size") != NULL, "%s", err);
    shm_seg_close(&a);
    T_EQ_INT(shm_seg_attach_name(&b, name, -1, -1, err, sizeof err), CM_ENOENT);
    struct shm_seg_opts bo = { .name = "no-slash" };
    T_EQ_INT(shm_seg_create(&a, &bo), CM_EINVAL);
    bo.name = "/with:colon";
    T_EQ_INT(shm_seg_create(&a, &bo), CM_EINVAL);
    struct shm_seg_opts co = { .submit_cap = 2u << 30 };
    T_EQ_INT(shm_seg_create(&a, &co), CM_EINVAL);
    T_CHECK(a.base == NULL && a.fd == -1);

    /* defaults */
    T_EQ_INT(shm_seg_create(&a, NULL), 0);
    T_EQ_INT(a.hdr->submit_cap, SHM_SUBMIT_CAP_DEFAULT);
    T_EQ_INT(a.hdr->event_cap, SHM_EVENT_CAP_DEFAULT);
    shm_seg_close(&a);
}

int main(void) {
    test_ring_basic();
    test_ring_random();
    test_ring_corrupt();
    test_ring_garbage();
    test_ring_wake();
    test_proto_submit();
    test_proto_v3();
    test_proto_others();
    test_proto_ring();
    test_proto_garbage();
    test_seg();
    return t_done();
}
