/* shm ring: single-producer single-consumer queue of variable-length records in shared memory.
 *
 * Layout of the data area: records back to back at 8-byte aligned positions. Each record is an
 * 8-byte header {u32 len, u32 tag} followed by len payload bytes padded to 8. tag is REC_DATA or
 * REC_PAD; a PAD record fills the space from its position to the end of the data area when the next
 * record does not fit there, and the record then starts at offset 0. head and tail count bytes ever
 * written/consumed (u64, never wrap in practice), so used = head - tail and the position is
 * index & mask.
 *
 * Ordering: the producer writes record bytes, then store-release head; the consumer load-acquires
 * head before reading them. The consumer reads a record, then store-release tail; the producer
 * load-acquires tail before reusing that space. Wake-ups (Dekker): the consumer stores waiting = 1
 * and then loads head, the producer stores head and then loads waiting, all four seq_cst (no
 * separate fences: ThreadSanitizer models these). In the single total order one of the two loads
 * comes after the other side's store, so either the consumer sees the new record and does not
 * sleep, or the producer sees the flag and writes the eventfd: a wake-up is never lost. A spurious
 * wake-up (an eventfd count left from a race) costs one extra check and is harmless.
 */
#include "shm/shm.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REC_DATA 0x31434552u   /* "REC1" */
#define REC_PAD  0x31444150u   /* "PAD1" */
#define REC_HDR  8u

_Static_assert(sizeof(struct shm_ring_ctl) == 256, "ring control block is 4 cache lines");

static inline uint64_t align8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

static inline void put_hdr(uint8_t *at, uint32_t len, uint32_t tag) {
    uint32_t h[2] = { len, tag };
    memcpy(at, h, sizeof h);
}

static int is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

static void sleep_us(long us) {
    struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L };
    nanosleep(&ts, NULL);   /* an early return on a signal is fine: callers loop */
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int shm_ring_init(void *region, uint32_t cap) {
    if (!region || !is_pow2(cap) || cap < SHM_RING_CAP_MIN || cap > SHM_RING_CAP_MAX) return CM_EINVAL;
    struct shm_ring_ctl *c = region;
    memset(c, 0, sizeof *c);
    atomic_init(&c->head, 0);
    atomic_init(&c->tail, 0);
    atomic_init(&c->waiting, 0);
    c->cap = cap;
    return 0;
}

int shm_ring_open(struct shm_ring *r, void *region, size_t region_size, int efd) {
    memset(r, 0, sizeof *r);
    r->efd = -1;
    r->res_pos = UINT64_MAX;
    if (!region || region_size < sizeof(struct shm_ring_ctl)) return CM_EFORMAT;
    struct shm_ring_ctl *c = region;
    uint64_t cap = c->cap;
    if (!is_pow2(cap) || cap < SHM_RING_CAP_MIN || cap > SHM_RING_CAP_MAX ||
        shm_ring_region_size((uint32_t)cap) != region_size)
        return CM_EFORMAT;
    uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
    if (head - tail > cap || (head & 7) || (tail & 7)) return CM_EFORMAT;
    r->ctl = c;
    r->data = (uint8_t *)region + sizeof(struct shm_ring_ctl);
    r->cap = cap;
    r->mask = cap - 1;
    r->efd = efd;
    r->head = r->head_seen = head;
    r->tail = r->tail_seen = tail;
    return 0;
}

/* ---- producer ---------------------------------------------------------------------------- */

int shm_ring_reserve(struct shm_ring *r, size_t len, void **ptr) {
    if (len > shm_ring_max_payload(r)) return CM_ETOOBIG;
    uint64_t need = REC_HDR + align8(len);
    uint64_t pos = r->head & r->mask;
    uint64_t contig = r->cap - pos;
    uint64_t pad = contig < need ? contig : 0;   /* contig is a multiple of 8, >= 8 */
    uint64_t total = pad + need;
    if (r->head + total - r->tail_seen > r->cap) {
        r->tail_seen = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
        if (r->head + total - r->tail_seen > r->cap) return CM_EFULL;
    }
    if (pad) {
        put_hdr(r->data + pos, (uint32_t)(pad - REC_HDR), REC_PAD);
        pos = 0;
    }
    r->res_pos = pos;
    r->res_head = r->head + pad;
    r->res_len = (uint32_t)len;
    *ptr = r->data + pos + REC_HDR;
    return 0;
}

static int publish(struct shm_ring *r, size_t len, memory_order mo) {
    if (r->res_pos == UINT64_MAX || len > r->res_len) return CM_EINVAL;
    put_hdr(r->data + r->res_pos, (uint32_t)len, REC_DATA);
    r->head = r->res_head + REC_HDR + align8(len);
    r->res_pos = UINT64_MAX;
    r->res_len = 0;
    atomic_store_explicit(&r->ctl->head, r->head, mo);
    return 0;
}

/* After a seq_cst store of head: wake the consumer if it announced sleeping. */
static void wake_if_waiting(struct shm_ring *r) {
    if (!atomic_load_explicit(&r->ctl->waiting, memory_order_seq_cst)) return;
    /* Clear it ourselves so that a stream of commits makes one syscall per sleep, not per record. */
    if (atomic_exchange_explicit(&r->ctl->waiting, 0, memory_order_seq_cst) && r->efd >= 0) {
        uint64_t one = 1;
        ssize_t n;
        do n = write(r->efd, &one, sizeof one); while (n < 0 && errno == EINTR);
        /* EAGAIN means the counter is already huge: the consumer will wake anyway. */
    }
}

int shm_ring_commit_quiet(struct shm_ring *r, size_t len) {
    return publish(r, len, memory_order_release);
}

void shm_ring_notify(struct shm_ring *r) {
    /* Re-store our own head seq_cst (we are its only writer) to order it before the flag load. */
    atomic_store_explicit(&r->ctl->head, r->head, memory_order_seq_cst);
    wake_if_waiting(r);
}

int shm_ring_commit(struct shm_ring *r, size_t len) {
    int rc = publish(r, len, memory_order_seq_cst);
    if (rc == 0) wake_if_waiting(r);
    return rc;
}

int shm_ring_push(struct shm_ring *r, const void *data, size_t len) {
    void *p;
    int rc = shm_ring_reserve(r, len, &p);
    if (rc) return rc;
    if (len) memcpy(p, data, len);
    return shm_ring_commit(r, len);
}

int shm_ring_wait_space(struct shm_ring *r, size_t len, int timeout_ms) {
    if (len > shm_ring_max_payload(r)) return CM_ETOOBIG;
    uint64_t need = REC_HDR + align8(len);
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout_ms * 1000000ull;
    long nap = 0;
    for (;;) {
        uint64_t pos = r->head & r->mask;
        uint64_t contig = r->cap - pos;
        uint64_t total = (contig < need ? contig : 0) + need;
        r->tail_seen = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
        if (r->head + total - r->tail_seen <= r->cap) return 0;
        if (now_ns() >= deadline) return CM_ETIMEOUT;
        /* The consumer does not signal freed space: back off from a yield to 1 ms naps. */
        if (nap == 0) {
            nap = 1;
            sched_yield();
        } else {
            sleep_us(nap);
            nap = nap < 1000 ? nap * 2 : 1000;
        }
    }
}

/* ---- consumer ---------------------------------------------------------------------------- */

int shm_ring_peek(struct shm_ring *r, const void **ptr, size_t *len) {
    for (;;) {
        if (r->tail == r->head_seen) {
            r->head_seen = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
            if (r->tail == r->head_seen) return CM_EEMPTY;
        }
        uint64_t avail = r->head_seen - r->tail;
        if (avail > r->cap || (avail & 7) || avail < REC_HDR) return CM_EFORMAT;
        uint64_t pos = r->tail & r->mask;
        uint64_t contig = r->cap - pos;
        uint32_t h[2];
        memcpy(h, r->data + pos, sizeof h);
        uint64_t rec = REC_HDR + align8(h[0]);
        if (h[1] == REC_PAD) {
            /* A pad always reaches exactly to the end of the data area. */
            if (rec != contig || rec > avail) return CM_EFORMAT;
            r->tail += rec;
            atomic_store_explicit(&r->ctl->tail, r->tail, memory_order_release);
            continue;
        }
        if (h[1] != REC_DATA || h[0] > shm_ring_max_payload(r) || rec > contig || rec > avail)
            return CM_EFORMAT;
        r->peek_rec = (uint32_t)rec;
        *ptr = r->data + pos + REC_HDR;
        *len = h[0];
        return 0;
    }
}

void shm_ring_release(struct shm_ring *r) {
    if (!r->peek_rec) return;
    r->tail += r->peek_rec;
    r->peek_rec = 0;
    atomic_store_explicit(&r->ctl->tail, r->tail, memory_order_release);
}

int shm_ring_pop(struct shm_ring *r, void *buf, size_t cap, size_t *len) {
    const void *p;
    size_t n;
    int rc = shm_ring_peek(r, &p, &n);
    if (rc) return rc;
    *len = n;
    if (n > cap) return CM_ERANGE;
    if (n) memcpy(buf, p, n);
    shm_ring_release(r);
    return 0;
}

/* Records visible past our tail? (seq_cst: the load half of the sleep protocol.) */
static int has_records(struct shm_ring *r, int *corrupt) {
    r->head_seen = atomic_load_explicit(&r->ctl->head, memory_order_seq_cst);
    uint64_t avail = r->head_seen - r->tail;
    *corrupt = avail > r->cap;
    return avail != 0;
}

int shm_ring_prepare_wait(struct shm_ring *r) {
    atomic_store_explicit(&r->ctl->waiting, 1, memory_order_seq_cst);
    int corrupt;
    if (has_records(r, &corrupt) || corrupt) {
        atomic_store_explicit(&r->ctl->waiting, 0, memory_order_relaxed);
        return corrupt ? CM_EFORMAT : 0;
    }
    return 1;
}

void shm_ring_cancel_wait(struct shm_ring *r) {
    atomic_store_explicit(&r->ctl->waiting, 0, memory_order_relaxed);
}

void shm_ring_drain_efd(struct shm_ring *r) {
    if (r->efd < 0) return;
    uint64_t v;
    ssize_t n;
    do n = read(r->efd, &v, sizeof v); while (n < 0 && errno == EINTR);
}

int shm_ring_wait(struct shm_ring *r, int timeout_ms) {
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int rc = shm_ring_prepare_wait(r);
        if (rc <= 0) return rc;                  /* records already there, or corrupt */
        uint64_t now = now_ns();
        if (now >= deadline) {
            shm_ring_cancel_wait(r);
            return CM_ETIMEOUT;
        }
        uint64_t left_ms = deadline == UINT64_MAX ? UINT64_MAX : (deadline - now + 999999) / 1000000;
        if (r->efd >= 0) {
            /* A readable eventfd may be a count left over from an earlier race (the producer saw
             * our flag just as a timed-out wait of ours gave up): then we find no record and sleep
             * again. EINTR also just goes round the loop. */
            struct pollfd pfd = { .fd = r->efd, .events = POLLIN };
            int ms = left_ms > 1000000000 ? -1 : (int)left_ms;
            if (poll(&pfd, 1, ms) > 0) shm_ring_drain_efd(r);
        } else {
            /* No eventfd (debug segments): sleep-poll in 1 ms steps. */
            sleep_us(1000);
        }
        shm_ring_cancel_wait(r);
        int corrupt;
        int any = has_records(r, &corrupt);
        if (corrupt) return CM_EFORMAT;
        if (any) return 0;
    }
}

uint64_t shm_ring_used(const struct shm_ring *r) {
    uint64_t t = atomic_load_explicit(&r->ctl->tail, memory_order_relaxed);
    uint64_t h = atomic_load_explicit(&r->ctl->head, memory_order_relaxed);
    return h - t > r->cap ? r->cap : h - t;
}
