/* exec: spawning, watching and restarting one executor process. */
#include "gateway/exec.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "common/cm_log.h"

#define CHECK_MS 50 /* state/heartbeat polling period */

enum { X_DOWN = 0, X_RUNNING, X_STOPPING, X_STOPPED };

struct gw_exec {
    uv_loop_t      *loop;
    gw_exec_cfg     cfg;
    int             phase;       /* X_* */
    /* the current child */
    struct shm_seg  seg;
    int             seg_open;
    uv_process_t    proc;
    int             proc_live;   /* spawned and not yet reaped */
    int             proc_handle; /* the handle needs closing */
    uv_poll_t       poll;
    int             poll_open;
    int             ready;
    uint64_t        spawned_ms;
    char            why[160];    /* reason to report when the child is gone */
    /* supervision */
    uv_timer_t      check;       /* state/heartbeat checks; also the restart and stop timers */
    uv_timer_t      restart;
    uv_timer_t      stop_timer;
    int             timers_open;
    uint32_t        backoff;
    unsigned        spawns;
    void          (*on_stopped)(gw_exec *x, void *ud);
    void           *stopped_ud;
};

static void spawn_child(gw_exec *x);
static void maybe_stopped(gw_exec *x);

void gw_exec_cfg_default(gw_exec_cfg *c) {
    memset(c, 0, sizeof *c);
    c->heartbeat_timeout_ms = 5000;
    c->load_timeout_ms = 600000;
    c->backoff_min_ms = 100;
    c->backoff_max_ms = 10000;
    c->stop_timeout_ms = 30000;
}

int gw_exec_ready(const gw_exec *x) { return x->ready; }
struct shm_seg *gw_exec_seg(gw_exec *x) { return x->seg_open ? &x->seg : NULL; }
int gw_exec_pid(const gw_exec *x) { return x->proc_live ? x->proc.pid : 0; }
unsigned gw_exec_spawns(const gw_exec *x) { return x->spawns; }
uint32_t gw_exec_backoff_ms(const gw_exec *x) { return x->backoff; }

/* ---- tearing a child down ----------------------------------------------------------------- */

/* The poll handle watches an eventfd of the segment: the segment closes after the handle. */
static void on_poll_closed(uv_handle_t *h) {
    gw_exec *x = h->data;
    x->poll_open = 0;
    if (x->seg_open) {
        shm_seg_close(&x->seg);
        x->seg_open = 0;
    }
    maybe_stopped(x);
}

static void on_proc_closed(uv_handle_t *h) {
    gw_exec *x = h->data;
    x->proc_handle = 0;
    maybe_stopped(x);
}

static void kill_child(gw_exec *x, const char *why) {
    if (!x->proc_live) return;
    if (why && !x->why[0]) snprintf(x->why, sizeof x->why, "%s", why);
    CM_LOG_WARN("gw", "killing executor", "index=%d pid=%d why=\"%s\"", x->cfg.index, x->proc.pid, why ? why : "");
    uv_process_kill(&x->proc, SIGKILL);
}

static void on_restart(uv_timer_t *t) { spawn_child(t->data); }

static void schedule_restart(gw_exec *x) {
    if (x->phase != X_DOWN) return;
    uint32_t d = x->backoff;
    CM_LOG_INFO("gw", "restarting executor", "index=%d in_ms=%u", x->cfg.index, d);
    uv_timer_start(&x->restart, on_restart, d, 0);
    x->backoff = x->backoff * 2 > x->cfg.backoff_max_ms ? x->cfg.backoff_max_ms : x->backoff * 2;
}

static void on_exit_cb(uv_process_t *p, int64_t status, int signo) {
    gw_exec *x = p->data;
    x->proc_live = 0;
    char why[200];
    if (x->why[0]) snprintf(why, sizeof why, "%s", x->why);
    else if (signo) snprintf(why, sizeof why, "executor killed by signal %d", signo);
    else snprintf(why, sizeof why, "executor exited with status %lld", (long long)status);
    CM_LOG_WARN("gw", "executor gone", "index=%d pid=%d status=%lld signal=%d why=\"%s\"", x->cfg.index, p->pid,
                (long long)status, signo, why);
    x->ready = 0;
    /* what the child published before it died still counts: its tokens were made, and a load
     * error says why it died (nothing is sent back to it: it is no longer ready) */
    if (x->seg_open && x->cfg.on_events) x->cfg.on_events(x, x->cfg.ud, &x->seg);
    if (x->seg_open) shm_seg_set_state(&x->seg, SHM_STATE_DEAD);
    x->why[0] = 0;
    uv_close((uv_handle_t *)p, on_proc_closed);
    if (x->poll_open) {
        uv_poll_stop(&x->poll);
        uv_close((uv_handle_t *)&x->poll, on_poll_closed);
    } else if (x->seg_open) {
        shm_seg_close(&x->seg);
        x->seg_open = 0;
    }
    /* the owner learns even when the child never got READY (its submits failed as well) */
    if (x->cfg.on_state) x->cfg.on_state(x, x->cfg.ud, 0, why);
    if (x->phase == X_RUNNING) {
        x->phase = X_DOWN;
        schedule_restart(x);
    } else {
        maybe_stopped(x);
    }
}

/* ---- events and checks -------------------------------------------------------------------- */

static void drain_events(gw_exec *x) {
    for (int rounds = 0; x->seg_open && rounds < 1000; rounds++) {
        if (x->cfg.on_events) x->cfg.on_events(x, x->cfg.ud, &x->seg);
        if (!x->seg_open) return;
        int r = shm_ring_prepare_wait(&x->seg.event);
        if (r == 1) return; /* asleep until the eventfd fires */
        if (r < 0) {
            kill_child(x, "corrupt event ring");
            return;
        }
    }
    /* still busy after many rounds: stay awake; the next check tick drains again */
    shm_ring_cancel_wait(&x->seg.event);
}

static void on_poll(uv_poll_t *h, int status, int events) {
    gw_exec *x = h->data;
    if (!x->seg_open) return;
    shm_ring_cancel_wait(&x->seg.event);
    shm_ring_drain_efd(&x->seg.event);
    drain_events(x);
}

static void on_check(uv_timer_t *t) {
    gw_exec *x = t->data;
    if (!x->proc_live || !x->seg_open) return;
    int st = shm_seg_state(&x->seg);
    uint64_t now = uv_now(x->loop);
    if (st == SHM_STATE_READY && !x->ready && x->phase == X_RUNNING) {
        x->ready = 1;
        x->backoff = x->cfg.backoff_min_ms;
        CM_LOG_INFO("gw", "executor ready", "index=%d pid=%d load_ms=%llu", x->cfg.index, x->proc.pid,
                    (unsigned long long)(now - x->spawned_ms));
        if (x->cfg.on_state) x->cfg.on_state(x, x->cfg.ud, 1, NULL);
    }
    if (st == SHM_STATE_READY || st == SHM_STATE_DRAINING) {
        uint64_t age_ms = shm_seg_beat_age_ns(&x->seg, shm_now_ns()) / 1000000u;
        if (age_ms > x->cfg.heartbeat_timeout_ms) {
            char why[96];
            snprintf(why, sizeof why, "executor heartbeat stalled for %llu ms", (unsigned long long)age_ms);
            kill_child(x, why);
        }
    } else if (now - x->spawned_ms > x->cfg.load_timeout_ms) {
        kill_child(x, "executor did not become ready in time");
    }
    /* a wake-up can only be missed if the ring is corrupt; draining here also covers a busy ring */
    if (x->seg_open && shm_ring_used(&x->seg.event) > 0) drain_events(x);
}

/* ---- spawning ----------------------------------------------------------------------------- */

static void spawn_child(gw_exec *x) {
    if (x->phase != X_DOWN) return;
    if (x->proc_handle || x->poll_open) { /* the previous child's handles are still closing */
        uv_timer_start(&x->restart, on_restart, 10, 0);
        return;
    }
    char err[96];
    int e = shm_seg_create(&x->seg, &x->cfg.seg);
    if (e) {
        snprintf(err, sizeof err, "cannot create the shared-memory segment: %s", cm_err_str(e));
        CM_LOG_ERROR("gw", "executor not started", "index=%d why=\"%s\"", x->cfg.index, err);
        if (x->cfg.on_state) x->cfg.on_state(x, x->cfg.ud, 0, err);
        schedule_restart(x);
        return;
    }
    x->seg_open = 1;
    char spec[128];
    const int child_fds[3] = {3, 4, 5};
    shm_seg_spec(&x->seg, child_fds, spec, sizeof spec);

    const char *argv[64];
    int n = 0;
    argv[n++] = x->cfg.bin;
    argv[n++] = "executor";
    argv[n++] = "--shm";
    argv[n++] = spec;
    for (int i = 0; x->cfg.args && x->cfg.args[i] && n < 63; i++) argv[n++] = x->cfg.args[i];
    argv[n] = NULL;

    uv_stdio_container_t stdio[6];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = 1;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = x->seg.fd;
    stdio[4].flags = x->seg.submit_efd >= 0 ? UV_INHERIT_FD : UV_IGNORE;
    stdio[4].data.fd = x->seg.submit_efd;
    stdio[5].flags = x->seg.event_efd >= 0 ? UV_INHERIT_FD : UV_IGNORE;
    stdio[5].data.fd = x->seg.event_efd;
    uv_process_options_t po;
    memset(&po, 0, sizeof po);
    po.file = x->cfg.bin;
    po.args = (char **)argv;
    po.exit_cb = on_exit_cb;
    po.stdio = stdio;
    po.stdio_count = 6;
    x->proc.data = x;
    x->spawns++;
    x->phase = X_RUNNING;
    x->why[0] = 0;
    e = uv_spawn(x->loop, &x->proc, &po);
    x->proc_handle = 1; /* uv_spawn initialises the handle even when it fails */
    if (e) {
        snprintf(err, sizeof err, "cannot start %s: %s", x->cfg.bin, uv_strerror(e));
        CM_LOG_ERROR("gw", "executor not started", "index=%d why=\"%s\"", x->cfg.index, err);
        uv_close((uv_handle_t *)&x->proc, on_proc_closed);
        shm_seg_close(&x->seg);
        x->seg_open = 0;
        x->phase = X_DOWN;
        if (x->cfg.on_state) x->cfg.on_state(x, x->cfg.ud, 0, err);
        schedule_restart(x);
        return;
    }
    x->proc_live = 1;
    x->spawned_ms = uv_now(x->loop);
    CM_LOG_INFO("gw", "executor started", "index=%d pid=%d spawn=%u", x->cfg.index, x->proc.pid, x->spawns);
    if (x->seg.event_efd >= 0 && uv_poll_init(x->loop, &x->poll, x->seg.event_efd) == 0) {
        x->poll.data = x;
        x->poll_open = 1;
        uv_poll_start(&x->poll, UV_READABLE, on_poll);
        shm_ring_prepare_wait(&x->seg.event);
    }
}

/* ---- life cycle --------------------------------------------------------------------------- */

int gw_exec_start(uv_loop_t *loop, const gw_exec_cfg *cfg, gw_exec **out) {
    *out = NULL;
    if (!loop || !cfg || !cfg->bin || !cfg->backoff_min_ms || cfg->backoff_max_ms < cfg->backoff_min_ms) return CM_EINVAL;
    gw_exec *x = calloc(1, sizeof *x);
    if (!x) return CM_ENOMEM;
    x->loop = loop;
    x->cfg = *cfg;
    x->backoff = cfg->backoff_min_ms;
    x->seg.fd = x->seg.submit_efd = x->seg.event_efd = -1;
    uv_timer_init(loop, &x->check);
    uv_timer_init(loop, &x->restart);
    uv_timer_init(loop, &x->stop_timer);
    x->check.data = x->restart.data = x->stop_timer.data = x;
    x->timers_open = 3;
    uv_timer_start(&x->check, on_check, CHECK_MS, CHECK_MS);
    x->phase = X_DOWN;
    spawn_child(x);
    *out = x;
    return 0;
}

static void on_timer_closed(uv_handle_t *h) {
    gw_exec *x = h->data;
    x->timers_open--;
    maybe_stopped(x);
}

static void maybe_stopped(gw_exec *x) {
    if (x->phase != X_STOPPING || x->proc_live || x->proc_handle || x->poll_open) return;
    if (x->timers_open == 3) {
        uv_close((uv_handle_t *)&x->check, on_timer_closed);
        uv_close((uv_handle_t *)&x->restart, on_timer_closed);
        uv_close((uv_handle_t *)&x->stop_timer, on_timer_closed);
        return;
    }
    if (x->timers_open > 0) return;
    if (x->seg_open) {
        shm_seg_close(&x->seg);
        x->seg_open = 0;
    }
    x->phase = X_STOPPED;
    if (x->on_stopped) x->on_stopped(x, x->stopped_ud);
}

static void on_stop_timeout(uv_timer_t *t) { kill_child(t->data, "executor did not drain in time"); }

void gw_exec_stop(gw_exec *x, void (*on_stopped)(gw_exec *x, void *ud), void *ud) {
    if (x->phase == X_STOPPING || x->phase == X_STOPPED) return;
    x->phase = X_STOPPING;
    x->on_stopped = on_stopped;
    x->stopped_ud = ud;
    x->ready = 0;
    uv_timer_stop(&x->restart);
    uv_timer_stop(&x->check);
    if (x->proc_live) {
        snprintf(x->why, sizeof x->why, "executor stopped");
        uv_process_kill(&x->proc, SIGTERM);
        uv_timer_start(&x->stop_timer, on_stop_timeout, x->cfg.stop_timeout_ms, 0);
    }
    maybe_stopped(x);
}

void gw_exec_destroy(gw_exec *x) {
    if (!x) return;
    if (x->seg_open) shm_seg_close(&x->seg);
    free(x);
}
