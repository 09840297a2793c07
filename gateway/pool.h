/* pool: the gateway's executors — the production gw_backend (gateway/backend.h).
 *
 * It owns the executor processes (one gw_exec each: spawned, supervised, restarted), sends
 * each generation's choices to the least-loaded ready executor as SUBMIT records (a backlog
 * keeps them in order while a ring is full), CANCELs what a generation no longer needs, and
 * reads the event rings: every TOKENS entry, DONE and ERROR goes to its generation
 * (gateway/gen.h) by ring id, looked up afresh for each record.
 *
 * When an executor dies (exit, crash, or a stalled heartbeat), the supervisor restarts it and
 * the generations it held resume: each waits for a ready executor (the restarted one or
 * another), which gets every open choice again as its prompt ids + the tokens already
 * delivered (SUBMIT's n_generated) with the same seed, so the draws, penalties and min_tokens
 * go on where they stopped and the client sees a pause, not an error (counted in
 * arka:requests_resumed_total). A choice whose last token had already ended it (max_tokens, a
 * stop id, the context) finishes without an executor. A generation fails with the 500 it got
 * before resuming existed when its executor died under it more than resume_max times, when no
 * executor was ready within resume_wait_ms, or while the pool stops.
 *
 * An executor that fails before it was ever ready (a load error such as `--backend cuda`
 * without a usable device, or three failed starts in a row) is not restarted: on_fatal reports
 * why, and the server exits.
 *
 * Loop thread only.
 *
 *   gw_pool_cfg c; gw_pool_cfg_default(&c);
 *   c.exec.bin = "/usr/bin/arka"; c.exec_args[0] = args0; c.n_exec = 1; c.met = met;
 *   gw_pool *p; gw_pool_start(loop, &c, &p);
 *   env.backend = gw_pool_backend(p);     ... generations run on it ...
 *   gw_pool_stop(p, on_stopped, ud);      // executors drain; then on_stopped
 *   gw_pool_destroy(p);                   // after on_stopped
 */
#ifndef GW_POOL_H
#define GW_POOL_H

#include <uv.h>

#include "gateway/backend.h"
#include "gateway/exec.h"

#define GW_POOL_MAX_EXEC 16

struct gw_met;
typedef struct gw_pool gw_pool;

typedef struct gw_pool_cfg {
    gw_exec_cfg exec;            /* template for every executor: bin, timeouts, ring sizes (callbacks and args are set here) */
    const char *const *exec_args[GW_POOL_MAX_EXEC]; /* per executor: NULL-terminated argument list (kept, must outlive) */
    int         n_exec;          /* 1..GW_POOL_MAX_EXEC */
    struct gw_met *met;          /* executor restarts and resumed requests go here (borrowed; NULL: none) */
    int         resume_max;      /* executor deaths a generation survives (0: it fails at the first) */
    uint32_t    resume_wait_ms;  /* longest wait for a ready executor to resume on */
    /* An executor failed before it was ever ready (why: its load error, or "exited ..."): it is
     * not restarted. Optional; loop thread. */
    void      (*on_fatal)(gw_pool *p, void *ud, int idx, const char *why);
    void       *ud;
} gw_pool_cfg;

/* Defaults: exec from gw_exec_cfg_default(), resume_max 3, resume_wait_ms 120000. Can't fail. */
void gw_pool_cfg_default(gw_pool_cfg *c);

/* Spawns the executors. Returns 0, CM_EINVAL, CM_ENOMEM or CM_EIO (gw_exec_start failed; *out is
 * then set: run the loop until gw_pool_stop's callback, then destroy). */
int gw_pool_start(uv_loop_t *loop, const gw_pool_cfg *cfg, gw_pool **out);

gw_backend gw_pool_backend(gw_pool *p);

/* Stops every executor (they drain) and calls on_stopped once all are down; generations still
 * running then fail. */
void gw_pool_stop(gw_pool *p, void (*on_stopped)(gw_pool *p, void *ud), void *ud);
void gw_pool_destroy(gw_pool *p); /* after on_stopped; accepts NULL */

/* For /metrics, just before rendering: copies every executor's stats block into cfg.met and
 * returns how many generations wait for ring space (queued in the gateway). */
int gw_pool_metrics(gw_pool *p);

#endif
