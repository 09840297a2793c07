/* shm segment: creation (gateway), attachment with validation (executor), state, heartbeat, stats.
 *
 * Layout (every part page-aligned): [shm_hdr][submit ring region][event ring region][shm_stats].
 * A memfd segment is sealed against growing and shrinking so that neither side can make the other's
 * mapping fault (SIGBUS) by truncating the file.
 */
#include "shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SEG_SIZE_MAX (UINT64_C(4) << 30)   /* refuse to map anything larger on attach */

_Static_assert(sizeof(struct shm_hdr) <= SHM_ALIGN, "header fits its page");

static uint64_t page_up(uint64_t n) { return (n + SHM_ALIGN - 1) & ~(uint64_t)(SHM_ALIGN - 1); }

static uint32_t pow2_up(uint32_t v) {
    uint32_t p = 1;
    while (p < v && p < (1u << 31)) p <<= 1;
    return p;
}

uint64_t shm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void seg_reset(struct shm_seg *seg) {
    memset(seg, 0, sizeof *seg);
    seg->fd = seg->submit_efd = seg->event_efd = -1;
}

static void errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- layout ------------------------------------------------------------------------------ */

struct layout {
    uint64_t submit_off, submit_size, event_off, event_size, stats_off, stats_size, total;
};

static void layout_compute(uint32_t submit_cap, uint32_t event_cap, struct layout *l) {
    l->submit_off = page_up(sizeof(struct shm_hdr));
    l->submit_size = shm_ring_region_size(submit_cap);
    l->event_off = page_up(l->submit_off + l->submit_size);
    l->event_size = shm_ring_region_size(event_cap);
    l->stats_off = page_up(l->event_off + l->event_size);
    l->stats_size = sizeof(struct shm_stats);
    l->total = page_up(l->stats_off + l->stats_size);
}

static void hist_init(struct shm_hist *h, const uint64_t *le, uint32_t n) {
    memset(h, 0, sizeof *h);
    h->n = n;
    for (uint32_t i = 0; i < n; i++) h->le[i] = le[i];
    for (uint32_t i = 0; i < SHM_HIST_MAX; i++) atomic_init(&h->count[i], 0);
    atomic_init(&h->sum, 0);
}

static void stats_init(struct shm_stats *s) {
    static const uint64_t step_us[] = { 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
                                        250000, 500000, 1000000, 2500000, 5000000, 10000000, UINT64_MAX };
    static const uint64_t batch[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, UINT64_MAX };
    static const uint64_t toks[] = { 1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                     16384, UINT64_MAX };
    memset(s, 0, sizeof *s);
    hist_init(&s->step_time_us, step_us, sizeof step_us / sizeof step_us[0]);
    hist_init(&s->batch_size, batch, sizeof batch / sizeof batch[0]);
    hist_init(&s->batch_tokens, toks, sizeof toks / sizeof toks[0]);
}

static int hist_valid(const struct shm_hist *h) {
    uint32_t n = h->n;
    if (n < 1 || n > SHM_HIST_MAX || h->le[n - 1] != UINT64_MAX) return 0;
    for (uint32_t i = 1; i < n; i++)
        if (h->le[i] <= h->le[i - 1]) return 0;
    return 1;
}

static int cap_ok(uint64_t cap) {
    return cap >= SHM_RING_CAP_MIN && cap <= SHM_RING_CAP_MAX && !(cap & (cap - 1));
}

/* Binds both ring handles and the stats pointer of a mapped, validated segment. */
static int seg_bind(struct shm_seg *seg) {
    struct shm_hdr *h = seg->hdr;
    uint8_t *b = seg->base;
    int rc = shm_ring_open(&seg->submit, b + h->submit_off, h->submit_size, seg->submit_efd);
    if (rc == 0) rc = shm_ring_open(&seg->event, b + h->event_off, h->event_size, seg->event_efd);
    if (rc == 0 && (seg->submit.cap != h->submit_cap || seg->event.cap != h->event_cap)) rc = CM_EFORMAT;
    seg->stats = (struct shm_stats *)(b + h->stats_off);
    return rc;
}

/* ---- create ------------------------------------------------------------------------------ */

int shm_seg_create(struct shm_seg *seg, const struct shm_seg_opts *opts) {
    struct shm_seg_opts o = { 0 };
    if (opts) o = *opts;
    seg_reset(seg);
    uint32_t scap = pow2_up(o.submit_cap ? o.submit_cap : SHM_SUBMIT_CAP_DEFAULT);
    uint32_t ecap = pow2_up(o.event_cap ? o.event_cap : SHM_EVENT_CAP_DEFAULT);
    if (!cap_ok(scap) || !cap_ok(ecap)) return CM_EINVAL;
    if (o.name && (o.name[0] != '/' || strlen(o.name) >= sizeof seg->name || strchr(o.name, ':') ||
                   strchr(o.name + 1, '/')))
        return CM_EINVAL;
    struct layout l;
    layout_compute(scap, ecap, &l);

    int rc = CM_EIO;
    if (o.name) {
        seg->fd = shm_open(o.name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (seg->fd < 0) goto fail_open;
        snprintf(seg->name, sizeof seg->name, "%s", o.name);
        seg->owner = 1;
    } else {
        seg->fd = memfd_create("arka-exec-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (seg->fd < 0) goto fail_open;
    }
    if (ftruncate(seg->fd, (off_t)l.total) != 0) goto fail_size;
    if (!o.name) (void)fcntl(seg->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    seg->base = mmap(NULL, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
    if (seg->base == MAP_FAILED) {
        seg->base = NULL;
        goto fail_size;
    }
    seg->size = l.total;
    if (!o.no_eventfd) {
        seg->submit_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (seg->submit_efd < 0) goto fail_efd;
        seg->event_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (seg->event_efd < 0) goto fail_efd;
    }

    uint8_t *b = seg->base;
    struct shm_hdr *h = seg->hdr = (struct shm_hdr *)b;   /* the mapping is zero-filled */
    h->version = SHM_VERSION;
    h->hdr_size = sizeof *h;
    h->total_size = l.total;
    h->submit_off = l.submit_off;
    h->submit_size = l.submit_size;
    h->event_off = l.event_off;
    h->event_size = l.event_size;
    h->stats_off = l.stats_off;
    h->stats_size = l.stats_size;
    h->submit_cap = scap;
    h->event_cap = ecap;
    h->created_ns = shm_now_ns();
    h->gateway_pid = (int32_t)getpid();
    atomic_init(&h->state, SHM_STATE_STARTING);
    atomic_init(&h->exec_pid, 0);
    atomic_init(&h->heartbeat, 0);
    atomic_init(&h->last_beat_ns, 0);
    shm_ring_init(b + l.submit_off, scap);
    shm_ring_init(b + l.event_off, ecap);
    stats_init((struct shm_stats *)(b + l.stats_off));
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_MAGIC;
    rc = seg_bind(seg);
    if (rc) goto fail_efd;   /* can't happen: we just formatted it */
    return 0;

fail_efd:
    if (seg->event_efd >= 0) close(seg->event_efd);
    if (seg->submit_efd >= 0) close(seg->submit_efd);
    munmap(seg->base, l.total);
fail_size:
    if (rc == CM_EIO && errno == ENOMEM) rc = CM_ENOMEM;
    {
        int e = errno;
        close(seg->fd);
        if (seg->owner) shm_unlink(seg->name);
        errno = e;
    }
fail_open:
    seg_reset(seg);
    return rc;
}

/* ---- attach ------------------------------------------------------------------------------ */

static int validate(const struct shm_hdr *h, uint64_t file_size, char *err, size_t errlen) {
    if (h->magic != SHM_MAGIC) {
        errf(err, errlen, "not an arka shm segment (magic %016llx, want %016llx)",
             (unsigned long long)h->magic, (unsigned long long)SHM_MAGIC);
        return CM_EFORMAT;
    }
    if (h->version != SHM_VERSION) {
        errf(err, errlen, "shm segment version %u, this build speaks %u (gateway and executor from different builds?)",
             h->version, SHM_VERSION);
        return CM_EUNSUPPORTED;
    }
    if (h->hdr_size != sizeof(struct shm_hdr) || h->stats_size != sizeof(struct shm_stats)) {
        errf(err, errlen, "shm segment header/stats size %u/%llu, want %zu/%zu (different builds?)",
             h->hdr_size, (unsigned long long)h->stats_size, sizeof(struct shm_hdr), sizeof(struct shm_stats));
        return CM_EFORMAT;
    }
    if (h->total_size != file_size) {
        errf(err, errlen, "shm segment size %llu in header, file has %llu bytes",
             (unsigned long long)h->total_size, (unsigned long long)file_size);
        return CM_EFORMAT;
    }
    if (!cap_ok(h->submit_cap) || !cap_ok(h->event_cap)) {
        errf(err, errlen, "shm ring capacities %u/%u are not powers of two in [%u, %u]",
             h->submit_cap, h->event_cap, SHM_RING_CAP_MIN, SHM_RING_CAP_MAX);
        return CM_EFORMAT;
    }
    /* Parts in order, page-aligned, sized as the capacities say, inside the file. Every value is
     * bounded by file_size (<= SEG_SIZE_MAX) before it is added, so nothing overflows. */
    uint64_t t = h->total_size;
    int ok = h->submit_size == shm_ring_region_size(h->submit_cap) &&
             h->event_size == shm_ring_region_size(h->event_cap) &&
             !(h->submit_off % SHM_ALIGN) && !(h->event_off % SHM_ALIGN) && !(h->stats_off % SHM_ALIGN) &&
             h->submit_off >= sizeof(struct shm_hdr) && h->submit_off <= t && h->submit_size <= t - h->submit_off &&
             h->event_off >= h->submit_off + h->submit_size && h->event_off <= t &&
             h->event_size <= t - h->event_off &&
             h->stats_off >= h->event_off + h->event_size && h->stats_off <= t &&
             h->stats_size <= t - h->stats_off;
    if (!ok) {
        errf(err, errlen, "shm segment layout is inconsistent (offsets/sizes outside %llu bytes)",
             (unsigned long long)t);
        return CM_EFORMAT;
    }
    const struct shm_stats *s = (const struct shm_stats *)((const uint8_t *)h + h->stats_off);
    if (!hist_valid(&s->step_time_us) || !hist_valid(&s->batch_size) || !hist_valid(&s->batch_tokens)) {
        errf(err, errlen, "shm stats histograms are malformed");
        return CM_EFORMAT;
    }
    return 0;
}

int shm_seg_attach_fd(struct shm_seg *seg, int fd, int submit_efd, int event_efd, char *err, size_t errlen) {
    seg_reset(seg);
    errf(err, errlen, "ok");
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        errf(err, errlen, "shm segment fd %d: %s", fd, strerror(fd < 0 ? EBADF : errno));
        return CM_EIO;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < sizeof(struct shm_hdr) || size > SEG_SIZE_MAX) {
        errf(err, errlen, "shm segment has %llu bytes (not a segment)", (unsigned long long)size);
        return CM_EFORMAT;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        errf(err, errlen, "mmap of shm segment (%llu bytes): %s", (unsigned long long)size, strerror(errno));
        return CM_EIO;
    }
    int rc = validate(base, size, err, errlen);
    if (rc) {
        munmap(base, size);
        return rc;
    }
    seg->base = base;
    seg->size = size;
    seg->hdr = base;
    seg->fd = fd;
    seg->submit_efd = submit_efd;
    seg->event_efd = event_efd;
    rc = seg_bind(seg);
    if (rc) {
        errf(err, errlen, "shm ring control blocks are inconsistent with the header");
        munmap(base, size);
        seg_reset(seg);
        return rc;
    }
    return 0;
}

int shm_seg_attach_name(struct shm_seg *seg, const char *name, int submit_efd, int event_efd,
                        char *err, size_t errlen) {
    seg_reset(seg);
    if (!name || name[0] != '/' || strlen(name) >= sizeof seg->name) {
        errf(err, errlen, "bad shm name");
        return CM_EINVAL;
    }
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        errf(err, errlen, "shm_open %s: %s", name, strerror(e));
        return e == ENOENT ? CM_ENOENT : CM_EIO;
    }
    int rc = shm_seg_attach_fd(seg, fd, submit_efd, event_efd, err, errlen);
    if (rc) {
        close(fd);
        return rc;
    }
    snprintf(seg->name, sizeof seg->name, "%s", name);
    return 0;
}

/* ---- spec -------------------------------------------------------------------------------- */

static int fmt_fd(char *b, size_t n, int fd) {
    return fd < 0 ? snprintf(b, n, "-") : snprintf(b, n, "%d", fd);
}

int shm_seg_spec(const struct shm_seg *seg, const int child_fds[3], char *buf, size_t len) {
    int f[3] = { seg->fd, seg->submit_efd, seg->event_efd };
    if (child_fds) {
        f[1] = seg->submit_efd < 0 ? -1 : child_fds[1];
        f[2] = seg->event_efd < 0 ? -1 : child_fds[2];
        f[0] = child_fds[0];
    }
    char a[16], b[16];
    fmt_fd(a, sizeof a, f[1]);
    fmt_fd(b, sizeof b, f[2]);
    int n = seg->name[0] && !child_fds ? snprintf(buf, len, "name:%s:%s:%s", seg->name, a, b)
                                       : snprintf(buf, len, "fd:%d:%s:%s", f[0], a, b);
    return n < 0 || (size_t)n >= len ? CM_ERANGE : 0;
}

/* Parses "-" or a non-negative decimal fd that ends at `end`. */
static int parse_fd(const char *s, const char *end, int *fd) {
    if (end - s == 1 && *s == '-') { *fd = -1; return 0; }
    if (s == end || end - s > 9) return CM_EINVAL;
    int v = 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9') return CM_EINVAL;
        v = v * 10 + (*s - '0');
    }
    *fd = v;
    return 0;
}

int shm_seg_attach_spec(struct shm_seg *seg, const char *spec, char *err, size_t errlen) {
    seg_reset(seg);
    const char *c2 = spec ? strrchr(spec, ':') : NULL;
    const char *c1 = NULL;
    if (c2) for (const char *p = c2 - 1; p >= spec; p--) if (*p == ':') { c1 = p; break; }
    int sfd, efd, fd = -1;
    int bad = !c1 || parse_fd(c1 + 1, c2, &sfd) || parse_fd(c2 + 1, spec + strlen(spec), &efd);
    int is_fd = !bad && strncmp(spec, "fd:", 3) == 0;
    int is_name = !bad && strncmp(spec, "name:", 5) == 0;
    if (is_fd) bad = c1 < spec + 3 || parse_fd(spec + 3, c1, &fd) || fd < 0;
    if (bad || (!is_fd && !is_name)) {
        errf(err, errlen, "bad shm spec \"%s\" (want fd:SEG:SUBMIT_EFD:EVENT_EFD or name:/NAME:S:E)",
             spec ? spec : "(null)");
        return CM_EINVAL;
    }
    if (is_fd) return shm_seg_attach_fd(seg, fd, sfd, efd, err, errlen);
    char name[sizeof seg->name];
    size_t n = (size_t)(c1 - (spec + 5));
    if (n == 0 || n >= sizeof name) {
        errf(err, errlen, "bad shm name in spec \"%s\"", spec);
        return CM_EINVAL;
    }
    memcpy(name, spec + 5, n);
    name[n] = 0;
    return shm_seg_attach_name(seg, name, sfd, efd, err, errlen);
}

int shm_seg_set_inherit(struct shm_seg *seg, int on) {
    int fds[3] = { seg->fd, seg->submit_efd, seg->event_efd };
    for (int i = 0; i < 3; i++) {
        if (fds[i] < 0) continue;
        int fl = fcntl(fds[i], F_GETFD);
        if (fl < 0) return CM_EIO;
        fl = on ? fl & ~FD_CLOEXEC : fl | FD_CLOEXEC;
        if (fcntl(fds[i], F_SETFD, fl) != 0) return CM_EIO;
    }
    return 0;
}

void shm_seg_close(struct shm_seg *seg) {
    if (!seg || !seg->base) return;
    munmap(seg->base, seg->size);
    if (seg->fd >= 0) close(seg->fd);
    if (seg->submit_efd >= 0) close(seg->submit_efd);
    if (seg->event_efd >= 0) close(seg->event_efd);
    if (seg->owner && seg->name[0]) shm_unlink(seg->name);
    seg_reset(seg);
}

/* ---- state, heartbeat, stats ------------------------------------------------------------- */

void shm_seg_set_state(struct shm_seg *seg, enum shm_exec_state st) {
    atomic_store_explicit(&seg->hdr->state, (uint32_t)st, memory_order_release);
}

enum shm_exec_state shm_seg_state(const struct shm_seg *seg) {
    uint32_t s = atomic_load_explicit(&seg->hdr->state, memory_order_acquire);
    return s < SHM_STATE_COUNT ? (enum shm_exec_state)s : SHM_STATE_DEAD;
}

const char *shm_state_name(int st) {
    static const char *names[] = { "starting", "loading", "ready", "draining", "dead" };
    return st >= 0 && st < SHM_STATE_COUNT ? names[st] : "unknown";
}

void shm_seg_set_pid(struct shm_seg *seg, int pid) {
    atomic_store_explicit(&seg->hdr->exec_pid, pid, memory_order_relaxed);
}

void shm_seg_beat(struct shm_seg *seg) {
    atomic_store_explicit(&seg->hdr->last_beat_ns, shm_now_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&seg->hdr->heartbeat, 1, memory_order_release);
}

uint64_t shm_seg_beat_age_ns(const struct shm_seg *seg, uint64_t now_ns) {
    uint64_t last = atomic_load_explicit(&seg->hdr->last_beat_ns, memory_order_relaxed);
    if (!last) last = seg->hdr->created_ns;
    return now_ns > last ? now_ns - last : 0;
}

void shm_hist_observe(struct shm_hist *h, uint64_t v) {
    uint32_t n = h->n;
    uint32_t i = 0;
    while (i + 1 < n && v > h->le[i]) i++;
    shm_stat_add(&h->count[i], 1);
    shm_stat_add(&h->sum, v);
}

void shm_hist_read(const struct shm_hist *h, struct shm_hist_snap *out) {
    memset(out, 0, sizeof *out);
    uint32_t n = h->n;
    if (n > SHM_HIST_MAX) n = SHM_HIST_MAX;
    out->n = n;
    uint64_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        out->le[i] = h->le[i];
        c += shm_stat_get(&h->count[i]);
        out->cum[i] = c;
    }
    out->count = c;
    out->sum = shm_stat_get(&h->sum);
}
