/* bench_shm: shm ring throughput (records/s, GB/s) and one-way latency (p50/p99) between two
 * processes over a memfd segment, with a busy-polling consumer and with one that sleeps on the
 * eventfd when the ring is empty.
 *
 *   bench_shm [-n RECORDS] [-l SAMPLES]
 *
 * Throughput: the parent (gateway side) pushes RECORDS records of each size into the submit ring
 * (default 8 MiB); the child (executor side, attached again through dup'ed fds like an exec'ed
 * executor) peeks, checks the sequence number and releases. Time runs from the first push to the
 * child's acknowledgement on the event ring.
 * Latency: the parent stamps CLOCK_MONOTONIC into a 64-byte record, the child takes the difference
 * on arrival; the parent waits for the child's ack and then pauses 0-50 us so that a sleeping
 * consumer is really asleep when the next record comes. Round trip = stamp to ack.
 * Peer: the same traffic through a pair of pipes, in the same run (a quarter of the records).
 */
#include "shm/shm.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MODE_SPIN = 0, MODE_SLEEP = 1 };

struct cmd {                 /* parent -> child, first record of a run */
    uint64_t kind;           /* 1 throughput, 2 latency, 3 quit */
    uint64_t mode;
    uint64_t n;
    uint64_t size;
};

struct result {              /* child -> parent, after a run */
    uint64_t n, bad, sleeps;
    uint64_t p50_ns, p99_ns, max_ns;
};

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Next record from r, spinning or sleeping; counts sleeps. */
static const void *next_rec(struct shm_ring *r, int mode, size_t *len, uint64_t *sleeps) {
    const void *p;
    for (;;) {
        int rc = shm_ring_peek(r, &p, len);
        if (rc == 0) return p;
        if (rc != CM_EEMPTY) {
            fprintf(stderr, "peek: %s\n", cm_err_name(rc));
            exit(1);
        }
        if (mode == MODE_SLEEP) {
            (*sleeps)++;
            shm_ring_wait(r, 1000);
        }
    }
}

static void push_wait(struct shm_ring *r, const void *d, size_t n) {
    while (shm_ring_push(r, d, n) == CM_EFULL) shm_ring_wait_space(r, n, 1000);
}

static void child(int fds[3]) {
    struct shm_seg s;
    char err[256];
    if (shm_seg_attach_fd(&s, fds[0], fds[1], fds[2], err, sizeof err)) {
        fprintf(stderr, "attach: %s\n", err);
        _exit(1);
    }
    static uint64_t lat[1 << 22];
    for (;;) {
        size_t len;
        uint64_t sleeps = 0;
        const struct cmd *cp = next_rec(&s.submit, MODE_SLEEP, &len, &sleeps);
        struct cmd c = *cp;
        shm_ring_release(&s.submit);
        if (c.kind == 3) break;
        struct result res = { c.n, 0, 0, 0, 0, 0 };
        if (c.kind == 1) {
            for (uint64_t i = 0; i < c.n; i++) {
                const void *p = next_rec(&s.submit, (int)c.mode, &len, &res.sleeps);
                uint64_t seq;
                memcpy(&seq, p, 8);
                if (seq != i || len != c.size) res.bad++;
                shm_ring_release(&s.submit);
            }
        } else {
            if (c.n > sizeof lat / sizeof lat[0]) c.n = sizeof lat / sizeof lat[0];
            for (uint64_t i = 0; i < c.n; i++) {
                const void *p = next_rec(&s.submit, (int)c.mode, &len, &res.sleeps);
                uint64_t now = shm_now_ns(), stamp;
                memcpy(&stamp, p, 8);
                shm_ring_release(&s.submit);
                lat[i] = now - stamp;
                push_wait(&s.event, &now, 8);   /* ack */
            }
            qsort(lat, c.n, 8, cmp_u64);
            res.p50_ns = lat[c.n / 2];
            res.p99_ns = lat[c.n * 99 / 100];
            res.max_ns = lat[c.n - 1];
        }
        push_wait(&s.event, &res, sizeof res);
    }
    shm_seg_close(&s);
    _exit(0);
}

static void get_result(struct shm_seg *s, struct result *res) {
    size_t len;
    uint64_t sleeps = 0;
    const void *p = next_rec(&s->event, MODE_SLEEP, &len, &sleeps);
    memcpy(res, p, sizeof *res);
    shm_ring_release(&s->event);
}

/* ---- peer: the same traffic through a pair of pipes (what a socket/pipe design would cost) ---- */

static int read_full(int fd, void *buf, size_t n) {
    uint8_t *p = buf;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Child end of the pipe peer: commands as in the shm child, records framed by their fixed size. */
static void pipe_child(int in, int out) {
    static uint8_t buf[65536];
    static uint64_t lat[1 << 22];
    struct cmd c;
    while (read_full(in, &c, sizeof c) == 0 && c.kind != 3) {
        struct result res = { c.n, 0, 0, 0, 0, 0 };
        if (c.n > sizeof lat / sizeof lat[0]) c.n = sizeof lat / sizeof lat[0];
        for (uint64_t i = 0; i < c.n; i++) {
            if (read_full(in, buf, c.size)) _exit(1);
            uint64_t now = shm_now_ns(), v;
            memcpy(&v, buf, 8);
            if (c.kind == 1) {
                if (v != i) res.bad++;
            } else {
                lat[i] = now - v;
                write_full(out, &now, 8);
            }
        }
        if (c.kind == 2) {
            qsort(lat, c.n, 8, cmp_u64);
            res.p50_ns = lat[c.n / 2];
            res.p99_ns = lat[c.n * 99 / 100];
            res.max_ns = lat[c.n - 1];
        }
        write_full(out, &res, sizeof res);
    }
    _exit(0);
}

static void nap_us(long us);

static void pipe_peer(uint64_t n, uint64_t samples) {
    int down[2], up[2];
    if (pipe(down) || pipe(up)) return;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        pipe_child(down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    static uint8_t buf[65536];
    const size_t sizes[] = { 16, 64, 256, 1024, 4096 };
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t sz = sizes[si];
        uint64_t cnt = (sz >= 1024 ? n / 4 : n) / 4;   /* pipes are slower: fewer records */
        struct cmd c = { 1, 0, cnt, sz };
        write_full(down[1], &c, sizeof c);
        memset(buf, 0xab, sz);
        uint64_t t0 = shm_now_ns();
        for (uint64_t i = 0; i < cnt; i++) {
            memcpy(buf, &i, 8);
            write_full(down[1], buf, sz);
        }
        struct result res;
        read_full(up[0], &res, sizeof res);
        double s = (double)(shm_now_ns() - t0) * 1e-9;
        char name[32];
        snprintf(name, sizeof name, "tput %zuB", sz);
        printf("%-10s %-6s %12llu %10.2f %10.2f %10s%s\n", name, "pipe", (unsigned long long)cnt,
               (double)cnt / s * 1e-6, (double)cnt * (double)sz / s * 1e-9, "-", res.bad ? "  BAD SEQUENCE" : "");
        fflush(stdout);
    }
    static uint64_t rtt[1 << 22];
    if (samples > sizeof rtt / sizeof rtt[0]) samples = sizeof rtt / sizeof rtt[0];
    struct cmd c = { 2, 0, samples, 64 };
    write_full(down[1], &c, sizeof c);
    uint64_t rng = 0x12345;
    for (uint64_t i = 0; i < samples; i++) {
        uint64_t stamp = shm_now_ns(), ack;
        memcpy(buf, &stamp, 8);
        write_full(down[1], buf, 64);
        read_full(up[0], &ack, 8);
        rtt[i] = shm_now_ns() - stamp;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        nap_us((long)((rng >> 33) % 50));
    }
    struct result res;
    read_full(up[0], &res, sizeof res);
    qsort(rtt, samples, 8, cmp_u64);
    printf("%-10s %-6s %12llu %10.2f %10.2f %10.2f %10.2f %10.2f\n", "latency", "pipe", (unsigned long long)samples,
           res.p50_ns * 1e-3, res.p99_ns * 1e-3, res.max_ns * 1e-3, rtt[samples / 2] * 1e-3,
           rtt[samples * 99 / 100] * 1e-3);
    struct cmd q = { 3, 0, 0, 0 };
    write_full(down[1], &q, sizeof q);
    int status;
    waitpid(pid, &status, 0);
    close(down[1]);
    close(up[0]);
}

static void nap_us(long us) {
    struct timespec ts = { 0, us * 1000L };
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    uint64_t n = 2000000, samples = 20000;
    int opt;
    while ((opt = getopt(argc, argv, "n:l:")) != -1) {
        if (opt == 'n') n = strtoull(optarg, NULL, 10);
        else if (opt == 'l') samples = strtoull(optarg, NULL, 10);
        else {
            fprintf(stderr, "usage: bench_shm [-n RECORDS] [-l LATENCY_SAMPLES]\n");
            return 2;
        }
    }
    struct shm_seg seg;
    if (shm_seg_create(&seg, NULL)) {
        fprintf(stderr, "shm_seg_create failed\n");
        return 1;
    }
    int fds[3] = { dup(seg.fd), dup(seg.submit_efd), dup(seg.event_efd) };
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) child(fds);
    printf("shm rings, two processes, submit ring %u KiB; %ld CPUs online\n", seg.hdr->submit_cap >> 10,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("%-10s %-6s %12s %10s %10s %10s\n", "test", "mode", "records", "Mrec/s", "GB/s", "sleeps");
    static uint8_t buf[65536];
    const size_t sizes[] = { 16, 64, 256, 1024, 4096 };
    int failed = 0;
    for (int mode = 0; mode < 2; mode++) {
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t sz = sizes[si];
            uint64_t cnt = sz >= 1024 ? n / 4 : n;
            struct cmd c = { 1, (uint64_t)mode, cnt, sz };
            push_wait(&seg.submit, &c, sizeof c);
            memset(buf, 0xab, sz);
            uint64_t t0 = shm_now_ns();
            for (uint64_t i = 0; i < cnt; i++) {
                void *w;
                while (shm_ring_reserve(&seg.submit, sz, &w) == CM_EFULL) {
                    if (mode == MODE_SLEEP) shm_ring_wait_space(&seg.submit, sz, 1000);
                }
                memcpy(w, buf, sz);
                memcpy(w, &i, 8);
                shm_ring_commit(&seg.submit, sz);
            }
            struct result res;
            get_result(&seg, &res);
            double s = (double)(shm_now_ns() - t0) * 1e-9;
            failed |= res.bad != 0;
            char name[32];
            snprintf(name, sizeof name, "tput %zuB", sz);
            printf("%-10s %-6s %12llu %10.2f %10.2f %10llu%s\n", name, mode ? "sleep" : "spin",
                   (unsigned long long)cnt, (double)cnt / s * 1e-6, (double)cnt * (double)sz / s * 1e-9,
                   (unsigned long long)res.sleeps, res.bad ? "  BAD SEQUENCE" : "");
            fflush(stdout);
        }
    }
    printf("%-10s %-6s %12s %10s %10s %10s %10s %10s\n", "test", "mode", "samples", "p50 us", "p99 us",
           "max us", "rtt p50", "rtt p99");
    static uint64_t rtt[1 << 22];
    if (samples > sizeof rtt / sizeof rtt[0]) samples = sizeof rtt / sizeof rtt[0];
    for (int mode = 0; mode < 2; mode++) {
        struct cmd c = { 2, (uint64_t)mode, samples, 64 };
        push_wait(&seg.submit, &c, sizeof c);
        uint64_t rng = 0x12345;
        for (uint64_t i = 0; i < samples; i++) {
            uint64_t stamp = shm_now_ns();
            memcpy(buf, &stamp, 8);
            push_wait(&seg.submit, buf, 64);
            size_t len;
            uint64_t sl = 0;
            next_rec(&seg.event, mode, &len, &sl);
            rtt[i] = shm_now_ns() - stamp;
            shm_ring_release(&seg.event);
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            nap_us((long)((rng >> 33) % 50));
        }
        struct result res;
        get_result(&seg, &res);
        qsort(rtt, samples, 8, cmp_u64);
        printf("%-10s %-6s %12llu %10.2f %10.2f %10.2f %10.2f %10.2f  (consumer slept %llu times)\n", "latency",
               mode ? "sleep" : "spin", (unsigned long long)samples, res.p50_ns * 1e-3, res.p99_ns * 1e-3,
               res.max_ns * 1e-3, rtt[samples / 2] * 1e-3, rtt[samples * 99 / 100] * 1e-3,
               (unsigned long long)res.sleeps);
        fflush(stdout);
    }
    struct cmd q = { 3, 0, 0, 0 };
    push_wait(&seg.submit, &q, sizeof q);
    int status;
    waitpid(pid, &status, 0);
    shm_seg_close(&seg);
    printf("peer in the same run: the same records through two pipes (read/write syscalls)\n");
    pipe_peer(n, samples);
    return failed || !WIFEXITED(status) || WEXITSTATUS(status) ? 1 : 0;
}
