/* exec: the gateway's supervision of one executor process.
 *
 * A gw_exec owns one shared-memory segment (shm/) and the `arka executor` child attached to it.
 * It spawns the child with the segment and its two eventfds as fds 3, 4, 5 ("--shm fd:3:4:5"),
 * watches the event ring's eventfd with uv_poll and hands readable rings to on_events, reports
 * readiness (the executor's state READY in the segment header) through on_state, and notices
 * failures: the child exiting, a heartbeat older than heartbeat_timeout_ms while READY, a load
 * that takes longer than load_timeout_ms, or a corrupt ring. On a failure it kills what is left,
 * reports on_state(up = 0, why) so that the owner fails the requests that executor held, and
 * starts a new child on a fresh segment after a back-off that doubles from backoff_min_ms up to
 * backoff_max_ms (reset once a child reaches READY).
 *
 * Loop thread only. What requests are and how records are encoded is the owner's business
 * (shm_send_submit etc. on gw_exec_seg()); this module only keeps a healthy executor behind it.
 *
 *   gw_exec_cfg c; gw_exec_cfg_default(&c);
 *   c.bin = "/usr/bin/arka"; c.args = (const char *[]){"-m", "model.gguf", NULL};
 *   c.on_state = state_cb; c.on_events = events_cb; c.ud = me;
 *   gw_exec *x; gw_exec_start(loop, &c, &x);
 *   ... on_state(x, me, 1, NULL): submit through gw_exec_seg(x) ...
 *   gw_exec_stop(x, stopped_cb, me);   // SIGTERM, the executor drains, then handles close
 *   ... in stopped_cb or after uv_run: gw_exec_destroy(x);
 */
#ifndef GW_EXEC_H
#define GW_EXEC_H

#include <stdint.h>

#include <uv.h>

#include "shm/shm.h"

typedef struct gw_exec gw_exec;

typedef struct gw_exec_cfg {
    const char  *bin;              /* the arka binary */
    const char *const *args;       /* extra executor arguments, NULL-terminated (model, backend, ...) */
    int          index;            /* executor number, for logs */
    uint32_t     heartbeat_timeout_ms; /* READY executor without a beat this long: killed (5000) */
    uint32_t     load_timeout_ms;  /* STARTING/LOADING this long: killed (600000) */
    uint32_t     backoff_min_ms;   /* first restart delay (100) */
    uint32_t     backoff_max_ms;   /* restart delay cap (10000) */
    uint32_t     stop_timeout_ms;  /* gw_exec_stop: SIGKILL after this long (30000) */
    struct shm_seg_opts seg;       /* ring sizes */
    /* up = 1: the executor is READY (requests may be submitted); up = 0: it is gone (every request
     * it held is lost; why says what happened). */
    void (*on_state)(gw_exec *x, void *ud, int up, const char *why);
    /* The event ring has records: drain them with shm_ring_peek/release on &seg->event. */
    void (*on_events)(gw_exec *x, void *ud, struct shm_seg *seg);
    void *ud;
} gw_exec_cfg;

/* Defaults as noted above; bin, args and callbacks unset. Can't fail. */
void gw_exec_cfg_default(gw_exec_cfg *c);

/* Starts supervising: creates a segment and spawns the first executor. cfg is copied (args
 * pointers are kept: they must outlive x). Returns 0, CM_EINVAL, CM_ENOMEM, or CM_EIO when the
 * first segment cannot be created. A spawn failure is handled like an exit (retried). */
int gw_exec_start(uv_loop_t *loop, const gw_exec_cfg *cfg, gw_exec **out);

/* 1 while the current executor is READY. */
int gw_exec_ready(const gw_exec *x);
/* The current segment while an executor runs (NULL between restarts). */
struct shm_seg *gw_exec_seg(gw_exec *x);
/* pid of the running child, 0 when none. */
int gw_exec_pid(const gw_exec *x);
/* Executors started so far (1 after the first spawn). */
unsigned gw_exec_spawns(const gw_exec *x);
/* Delay before the next restart, ms (for tests and logs). */
uint32_t gw_exec_backoff_ms(const gw_exec *x);

/* Stops for good: SIGTERM (the executor drains its requests), SIGKILL after stop_timeout_ms,
 * then every handle closes and on_stopped runs. No restart happens after this. */
void gw_exec_stop(gw_exec *x, void (*on_stopped)(gw_exec *x, void *ud), void *ud);

/* Frees a stopped executor (after on_stopped). Accepts NULL. */
void gw_exec_destroy(gw_exec *x);

#endif
