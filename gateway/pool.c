/* pool: generations to executors through shared-memory rings (see pool.h). */
#include "gateway/pool.h"

#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/gen.h"
#include "gateway/metrics.h"
#include "shm/shm.h"

#define BUCKETS     1024
#define CANCEL_CAP  1024     /* CANCELs waiting for ring space, per executor */
#define RETRY_MS    2        /* retry period while a ring is full */

typedef struct pool_ex {
    gw_pool *p;
    gw_exec *x;
    int      idx;
    gw_gen  *list;                  /* generations submitted to this executor (be.prev / be.next) */
    int      n_gens;
    gw_gen  *bl_head, *bl_tail;     /* backlog: SUBMITs waiting for ring space, in order (be.qnext) */
    uint64_t cancels[CANCEL_CAP];   /* CANCELs waiting for ring space */
    int      n_cancels;
    int      stopped;
} pool_ex;

struct gw_pool {
    uv_loop_t *loop;
    gw_pool_cfg cfg;
    pool_ex    ex[GW_POOL_MAX_EXEC];
    int        n_ex;
    gw_gen    *buckets[BUCKETS];    /* by be.id (be.hnext) */
    uint64_t   next_id;
    uv_timer_t retry;
    int        retry_armed;
    void     (*on_stopped)(gw_pool *p, void *ud);
    void      *stop_ud;
    int        n_stopped;
};

static uint64_t rid_of(const gw_gen *g, int i) { return g->be.id << GW_GEN_RID_SHIFT | (uint64_t)i; }

/* ---- tables --------------------------------------------------------------------------------- */

static gw_gen *lookup(gw_pool *p, uint64_t rid) {
    uint64_t id = rid >> GW_GEN_RID_SHIFT;
    for (gw_gen *g = p->buckets[id % BUCKETS]; g; g = g->be.hnext)
        if (g->be.id == id) return g;
    return NULL;
}

static void backlog_remove(pool_ex *e, gw_gen *g) {
    for (gw_gen **pp = &e->bl_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->be.qnext)
        if (*pp == g) {
            *pp = g->be.qnext;
            if (e->bl_tail == g) e->bl_tail = prev;
            g->be.qnext = NULL;
            return;
        }
}

/* Forgets g: out of the table, its executor's list and the backlog. */
static void unlink_gen(gw_pool *p, gw_gen *g) {
    gw_gen **pp = &p->buckets[g->be.id % BUCKETS];
    while (*pp && *pp != g) pp = &(*pp)->be.hnext;
    if (*pp) *pp = g->be.hnext;
    pool_ex *e = g->be.ex;
    if (!e) return;
    if (g->be.prev) g->be.prev->be.next = g->be.next;
    else e->list = g->be.next;
    if (g->be.next) g->be.next->be.prev = g->be.prev;
    e->n_gens--;
    backlog_remove(e, g);
    g->be.ex = NULL;
    g->be.prev = g->be.next = NULL;
}

/* ---- rings ----------------------------------------------------------------------------------- */

static void on_retry(uv_timer_t *t);

static void arm_retry(gw_pool *p) {
    if (!p->retry_armed) {
        p->retry_armed = 1;
        uv_timer_start(&p->retry, on_retry, RETRY_MS, 0);
    }
}

static void send_cancel(pool_ex *e, uint64_t rid) {
    struct shm_seg *seg = gw_exec_seg(e->x);
    if (!seg || !gw_exec_ready(e->x)) return; /* a dead executor holds nothing */
    if (e->n_cancels == 0 && shm_send_cancel(&seg->submit, rid) == 0) return;
    if (e->n_cancels < CANCEL_CAP) e->cancels[e->n_cancels++] = rid;
    else CM_LOG_WARN("pool", "cancel queue full", "executor=%d", e->idx);
    arm_retry(e->p);
}

/* Sends g's remaining SUBMITs. Returns 0 when all went, CM_EFULL when the ring is full, or the
 * encoder's error (a prompt the ring cannot carry). */
static int send_submits(gw_gen *g) {
    pool_ex *e = g->be.ex;
    struct shm_seg *seg = gw_exec_seg(e->x);
    if (!seg) return CM_EFULL;
    while (g->be.n_sent < g->n) {
        int i = g->be.n_sent;
        struct shm_submit s = { .req_id = rid_of(g, i), .sp = g->sp, .prompt = g->prompt, .n_prompt = (uint32_t)g->n_prompt,
                                .n_stop = (uint32_t)g->n_stop_ids, .bias = g->q.logit_bias,
                                .n_bias = (uint32_t)g->q.n_logit_bias, .priority = g->q.priority,
                                .tenant = gw_tenant_id(g->ticket.tenant), .weight = g->ticket.weight };
        if (s.sp.has_seed) s.sp.seed += (uint64_t)i; /* n choices with one seed: distinct, reproducible */
        memcpy(s.stop, g->stop_ids, sizeof g->stop_ids);
        int rc = shm_send_submit(&seg->submit, &s);
        if (rc) return rc;
        g->be.n_sent++;
        g->reached = 1;
    }
    return 0;
}

/* A SUBMIT the ring refused for good: the choices already sent are cancelled and g forgotten;
 * fills e. */
static void submit_failed(gw_pool *p, gw_gen *g, int rc, gw_oai_err *e) {
    for (int i = 0; i < g->be.n_sent; i++) send_cancel(g->be.ex, rid_of(g, i));
    unlink_gen(p, g);
    gw_oai_err_set(e, 400, "invalid_request_error", NULL, "prompt_too_long",
                   "The prompt (%d tokens) cannot be sent to the executor: %s", g->n_prompt, cm_err_str(rc));
}

static void flush_backlogs(gw_pool *p) {
    int again = 0;
    for (int k = 0; k < p->n_ex; k++) {
        pool_ex *e = &p->ex[k];
        struct shm_seg *seg = gw_exec_seg(e->x);
        if (!seg || !gw_exec_ready(e->x)) continue;
        int sent = 0;
        while (sent < e->n_cancels && shm_send_cancel(&seg->submit, e->cancels[sent]) == 0) sent++;
        memmove(e->cancels, e->cancels + sent, (size_t)(e->n_cancels - sent) * sizeof *e->cancels);
        e->n_cancels -= sent;
        while (e->bl_head) {
            gw_gen *g = e->bl_head;
            int rc = send_submits(g);
            if (rc == CM_EFULL) break;
            backlog_remove(e, g);
            if (rc) {
                gw_oai_err err;
                submit_failed(p, g, rc, &err);
                gw_gen_error(g, &err);
            }
        }
        again |= e->n_cancels > 0 || e->bl_head != NULL;
    }
    if (again) arm_retry(p);
}

static void on_retry(uv_timer_t *t) {
    gw_pool *p = t->data;
    p->retry_armed = 0;
    flush_backlogs(p);
}

/* ---- the backend ------------------------------------------------------------------------------ */

static pool_ex *pick_executor(gw_pool *p) {
    pool_ex *best = NULL;
    for (int k = 0; k < p->n_ex; k++) {
        pool_ex *e = &p->ex[k];
        if (!e->stopped && gw_exec_ready(e->x) && (!best || e->n_gens < best->n_gens)) best = e;
    }
    return best;
}

static int be_submit(void *impl, gw_gen *g, gw_oai_err *err) {
    gw_pool *p = impl;
    pool_ex *e = pick_executor(p);
    if (!e) {
        gw_oai_err_set(err, 503, "server_error", NULL, "model_not_ready", "No executor is ready; try again shortly.");
        return CM_ESTATE;
    }
    g->be.id = ++p->next_id;
    g->be.hnext = p->buckets[g->be.id % BUCKETS];
    p->buckets[g->be.id % BUCKETS] = g;
    g->be.ex = e;
    g->be.prev = NULL;
    g->be.next = e->list;
    if (e->list) e->list->be.prev = g;
    e->list = g;
    e->n_gens++;
    int rc = e->bl_head ? CM_EFULL : send_submits(g); /* keep the order behind a backlog */
    if (rc == CM_EFULL) {
        if (e->bl_tail) e->bl_tail->be.qnext = g;
        else e->bl_head = g;
        e->bl_tail = g;
        arm_retry(p);
    } else if (rc) {
        submit_failed(p, g, rc, err);
        return rc;
    }
    return 0;
}

static void be_stop(void *impl, gw_gen *g, int i) {
    if (g->be.ex && i < g->be.n_sent) send_cancel(g->be.ex, rid_of(g, i));
}

static void be_detach(void *impl, gw_gen *g) {
    for (int i = 0; g->be.ex && i < g->be.n_sent; i++)
        if (g->ch[i].finish == SHM_FINISH_NONE) send_cancel(g->be.ex, rid_of(g, i));
    unlink_gen(impl, g);
}

static int be_ready(void *impl) { return pick_executor(impl) != NULL; }

static const gw_backend_ops pool_ops = { be_submit, be_stop, be_detach, be_ready };

gw_backend gw_pool_backend(gw_pool *p) { return (gw_backend){ &pool_ops, p }; }

/* ---- events from an executor: each record to its generation --------------------------------- */

static void on_error_rec(gw_pool *p, pool_ex *e, const struct shm_error *er) {
    if (er->req_id == 0) {
        CM_LOG_ERROR("pool", "executor error", "executor=%d msg=\"%s\"", e->idx, er->msg);
        return;
    }
    gw_gen *g = lookup(p, er->req_id);
    if (!g) return;
    if (er->code == CM_EFULL)
        gw_gen_fail(g, 503, "server_error", "overloaded", "The server is overloaded (%s); retry shortly.", er->msg);
    else if (er->code == CM_ENOKV) /* the request can never fit the KV pool: retrying cannot help */
        gw_gen_fail(g, 400, "invalid_request_error", "context_length_exceeded", "%s", er->msg);
    else if (er->code == CM_ECTX)
        gw_gen_fail(g, 400, "invalid_request_error", "context_length_exceeded", "%s", er->msg);
    else
        gw_gen_fail(g, 500, "server_error", "executor_error", "The executor failed the request: %s", er->msg);
}

static int choice_of(const gw_gen *g, uint64_t rid) {
    int i = (int)(rid & ((1u << GW_GEN_RID_SHIFT) - 1));
    return i < g->be.n_sent ? i : -1;
}

static void ex_events(gw_exec *x, void *ud, struct shm_seg *seg) {
    pool_ex *e = ud;
    gw_pool *p = e->p;
    (void)x;
    const void *buf;
    size_t n;
    while (shm_ring_peek(&seg->event, &buf, &n) == 0) {
        uint32_t type;
        gw_gen *g;
        int i;
        if (shm_msg_type(buf, n, &type) == 0) {
            if (type == SHM_MSG_TOKENS) {
                struct shm_tokens_r rd;
                struct shm_tok t;
                const struct shm_top *top;
                struct shm_tok_admit adm;
                if (shm_tokens_open(&rd, buf, n) == 0)
                    while (shm_tokens_next(&rd, &t, &top) == 0)
                        if ((g = lookup(p, t.req_id)) && (i = choice_of(g, t.req_id)) >= 0) {
                            if (shm_tokens_admit(&rd, &adm) == 0) gw_gen_admitted(g, i, &adm);
                            gw_gen_token(g, i, &t, top);
                        }
            } else if (type == SHM_MSG_DONE) {
                struct shm_done d;
                if (shm_done_decode(buf, n, &d) == 0 && (g = lookup(p, d.req_id)) && (i = choice_of(g, d.req_id)) >= 0)
                    gw_gen_choice_done(g, i, &d);
            } else if (type == SHM_MSG_ERROR) {
                struct shm_error er;
                if (shm_error_decode(buf, n, &er) == 0) on_error_rec(p, e, &er);
            }
        }
        shm_ring_release(&seg->event);
    }
    if (e->bl_head || e->n_cancels) flush_backlogs(p);
}

static void ex_state(gw_exec *x, void *ud, int up, const char *why) {
    pool_ex *e = ud;
    (void)x;
    if (up) {
        CM_LOG_INFO("pool", "executor ready", "executor=%d", e->idx);
        return;
    }
    e->n_cancels = 0;
    if (e->stopped) CM_LOG_INFO("pool", "executor stopped", "executor=%d generations=%d", e->idx, e->n_gens);
    else {
        if (e->p->cfg.met) gw_met_executor_restart(e->p->cfg.met, e->idx);
        CM_LOG_WARN("pool", "executor down", "executor=%d why=\"%s\" generations=%d", e->idx, why ? why : "", e->n_gens);
    }
    while (e->list) /* each failure detaches its generation from the list */
        gw_gen_fail(e->list, 500, "server_error", "executor_failed",
                    "The executor serving this request failed (%s); retry the request.", why ? why : "exited");
}

/* ---- life cycle ------------------------------------------------------------------------------ */

void gw_pool_cfg_default(gw_pool_cfg *c) {
    memset(c, 0, sizeof *c);
    gw_exec_cfg_default(&c->exec);
}

int gw_pool_start(uv_loop_t *loop, const gw_pool_cfg *cfg, gw_pool **out) {
    *out = NULL;
    if (!loop || !cfg || cfg->n_exec < 1 || cfg->n_exec > GW_POOL_MAX_EXEC) return CM_EINVAL;
    gw_pool *p = calloc(1, sizeof *p);
    if (!p) return CM_ENOMEM;
    p->loop = loop;
    p->cfg = *cfg;
    uv_timer_init(loop, &p->retry);
    p->retry.data = p;
    for (int k = 0; k < cfg->n_exec; k++) {
        pool_ex *e = &p->ex[k];
        e->p = p;
        e->idx = k;
        gw_exec_cfg c = cfg->exec;
        c.args = cfg->exec_args[k];
        c.index = k;
        c.on_state = ex_state;
        c.on_events = ex_events;
        c.ud = e;
        int rc = gw_exec_start(loop, &c, &e->x);
        if (rc) {
            p->n_ex = k;
            CM_LOG_ERROR("pool", "cannot start executor", "executor=%d rc=%s", k, cm_err_str(rc));
            for (int j = 0; j < k; j++) gw_exec_stop(p->ex[j].x, NULL, NULL);
            *out = p; /* the caller runs the loop until the stops finish, then destroys */
            return rc;
        }
        p->n_ex = k + 1;
    }
    *out = p;
    return 0;
}

static void ex_stopped(gw_exec *x, void *ud) {
    pool_ex *e = ud;
    gw_pool *p = e->p;
    (void)x;
    if (++p->n_stopped == p->n_ex) {
        uv_close((uv_handle_t *)&p->retry, NULL);
        if (p->on_stopped) p->on_stopped(p, p->stop_ud);
    }
}

void gw_pool_stop(gw_pool *p, void (*on_stopped)(gw_pool *p, void *ud), void *ud) {
    p->on_stopped = on_stopped;
    p->stop_ud = ud;
    for (int k = 0; k < p->n_ex; k++) {
        p->ex[k].stopped = 1;
        gw_exec_stop(p->ex[k].x, ex_stopped, &p->ex[k]);
    }
    if (p->n_ex == 0) {
        uv_close((uv_handle_t *)&p->retry, NULL);
        if (on_stopped) on_stopped(p, ud);
    }
}

void gw_pool_destroy(gw_pool *p) {
    if (!p) return;
    for (int k = 0; k < p->n_ex; k++) gw_exec_destroy(p->ex[k].x);
    free(p);
}

int gw_pool_metrics(gw_pool *p) {
    int queued = 0;
    for (int k = 0; k < p->n_ex; k++) {
        pool_ex *e = &p->ex[k];
        for (gw_gen *g = e->bl_head; g; g = g->be.qnext) queued++;
        struct shm_seg *seg = gw_exec_seg(e->x);
        if (seg && seg->stats && p->cfg.met) gw_met_executor(p->cfg.met, k, seg->stats);
    }
    return queued;
}
