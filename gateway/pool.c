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
#define WAIT_TICK_MS 250     /* deadline checks of the generations waiting to resume */
#define START_TRIES 3        /* failed starts in a row (never ready) before an executor is given up */

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
    uint32_t vocab_next;            /* VOCAB records sent to this executor instance (tokens) */
    int      vocab_done;
    int      ever_ready;            /* reached READY once: later failures are restarted */
    int      failed_starts;         /* exits before READY, in a row */
    char     load_err[SHM_ERR_MSG_MAX + 1]; /* the executor-level ERROR of a start that failed */
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
    gw_gen    *wait_head, *wait_tail; /* generations waiting for an executor to resume on (be.qnext) */
    uv_timer_t wait_timer;          /* their deadlines (runs while the list is not empty) */
    int32_t   *scratch;             /* a resumed choice's prompt: prompt ids + delivered tokens */
    size_t     scratch_cap;
    uint64_t   seed_ctr;
    void     (*on_stopped)(gw_pool *p, void *ud);
    void      *stop_ud;
    int        n_stopped;
    int        stopping;
};

static uint64_t rid_of(const gw_gen *g, int i) { return g->be.id << GW_GEN_RID_SHIFT | (uint64_t)i; }

/* splitmix64's finalizer: seeds for requests that name none. */
static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

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

/* Takes g off its executor (list and backlog); it stays in the table. */
static void leave_executor(gw_gen *g) {
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

static void join_executor(pool_ex *e, gw_gen *g) {
    g->be.ex = e;
    g->be.prev = NULL;
    g->be.next = e->list;
    if (e->list) e->list->be.prev = g;
    e->list = g;
    e->n_gens++;
}

static void wait_remove(gw_pool *p, gw_gen *g) {
    if (!g->be.waiting) return;
    for (gw_gen **pp = &p->wait_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->be.qnext)
        if (*pp == g) {
            *pp = g->be.qnext;
            if (p->wait_tail == g) p->wait_tail = prev;
            break;
        }
    g->be.qnext = NULL;
    g->be.waiting = 0;
}

/* Forgets g: out of the table, its executor's list and backlog, or the resume queue. */
static void unlink_gen(gw_pool *p, gw_gen *g) {
    gw_gen **pp = &p->buckets[g->be.id % BUCKETS];
    while (*pp && *pp != g) pp = &(*pp)->be.hnext;
    if (*pp) *pp = g->be.hnext;
    wait_remove(p, g);
    leave_executor(g);
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

/* Choice i's prompt for a SUBMIT: the prompt ids, then (resuming) the tokens it delivered.
 * NULL when out of memory. */
static const int32_t *choice_prompt(gw_pool *p, const gw_gen *g, int i, uint32_t *n) {
    const gw_gen_choice *c = &g->ch[i];
    *n = (uint32_t)(g->n_prompt + c->n_toks);
    if (c->n_toks == 0) return g->prompt;
    if (*n > p->scratch_cap) {
        int32_t *b = realloc(p->scratch, sizeof *b * *n);
        if (!b) return NULL;
        p->scratch = b;
        p->scratch_cap = *n;
    }
    memcpy(p->scratch, g->prompt, sizeof *g->prompt * (size_t)g->n_prompt);
    memcpy(p->scratch + g->n_prompt, c->toks, sizeof *c->toks * (size_t)c->n_toks);
    return p->scratch;
}

/* Sends g's remaining SUBMITs (choices that finished before a resume need none). Every choice
 * draws with a seed the pool knows (the request's, or one picked here), so that a resumed
 * choice draws as it would have. Returns 0 when all went, CM_EFULL when the ring is full, or
 * the encoder's error (a prompt the ring cannot carry), CM_ENOMEM. */
static int send_submits(gw_pool *p, gw_gen *g) {
    pool_ex *e = g->be.ex;
    struct shm_seg *seg = gw_exec_seg(e->x);
    if (!seg) return CM_EFULL;
    if (g->gram && !e->vocab_done) { /* grammars need the token bytes, once per executor start */
        int rc = gw_gen_send_vocab(g->env, &seg->submit, &e->vocab_next);
        if (rc) return rc;
        e->vocab_done = 1;
    }
    while (g->be.n_sent < g->n) {
        int i = g->be.n_sent;
        if (g->ch[i].finish != SHM_FINISH_NONE) {
            g->be.n_sent++;
            continue;
        }
        const gw_gen_choice *c = &g->ch[i];
        int embed = g->q.kind == GW_OAI_EMBEDDINGS;
        uint32_t n_prompt;
        const int32_t *prompt;
        if (c->prompt) { /* an embedding's input */
            prompt = c->prompt;
            n_prompt = (uint32_t)c->n_prompt;
        } else if (!(prompt = choice_prompt(p, g, i, &n_prompt))) return CM_ENOMEM;
        struct shm_submit s = { .req_id = rid_of(g, i), .sp = g->sp, .prompt = prompt, .n_prompt = n_prompt,
                                .n_stop = (uint32_t)g->n_stop_ids, .bias = g->q.logit_bias,
                                .n_bias = (uint32_t)g->q.n_logit_bias, .n_generated = c->prompt ? 0 : (uint32_t)c->n_toks,
                                .flags = embed ? SHM_SUBMIT_EMBED : g->gram ? SHM_SUBMIT_GRAMMAR : 0,
                                .pooling = (uint8_t)(embed ? g->env->pooling : 0), .normalize = (uint8_t)(embed && g->env->normalize),
                                .grammar = g->gram, .grammar_len = (uint32_t)g->gram_len, .priority = g->q.priority,
                                .tenant = gw_tenant_id(g->ticket.tenant), .weight = g->ticket.weight };
        s.sp.has_seed = 1;
        s.sp.seed = g->be.seed + (uint64_t)i; /* n choices with one seed: distinct, reproducible */
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
    for (int i = 0; i < g->be.n_sent; i++)
        if (g->ch[i].finish == SHM_FINISH_NONE) send_cancel(g->be.ex, rid_of(g, i));
    unlink_gen(p, g);
    if (rc == CM_ENOMEM) gw_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    else
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
            int rc = send_submits(p, g);
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

/* g (in the table, on no executor) goes to executor e: its SUBMITs now or behind the backlog.
 * Returns 0, or the encoder's error with err filled (g is then forgotten). */
static int dispatch(gw_pool *p, pool_ex *e, gw_gen *g, gw_oai_err *err) {
    join_executor(e, g);
    g->be.n_sent = 0;
    int rc = e->bl_head ? CM_EFULL : send_submits(p, g); /* keep the order behind a backlog */
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

static void on_wait_tick(uv_timer_t *t);

/* An executor that was ready restarts (its generations wait to resume on it): new ones may
 * wait with them. */
static int restarting(const gw_pool *p) {
    if (p->stopping || p->cfg.resume_max <= 0) return 0;
    for (int k = 0; k < p->n_ex; k++)
        if (!p->ex[k].stopped && p->ex[k].ever_ready) return 1;
    return 0;
}

/* g waits for an executor (after its executor died, or submitted while the executors restart),
 * behind the others; failed when none is ready within resume_wait_ms. */
static void wait_append(gw_pool *p, gw_gen *g) {
    g->be.waiting = 1;
    g->be.wait_since = uv_now(p->loop);
    g->be.qnext = NULL;
    if (p->wait_tail) p->wait_tail->be.qnext = g;
    else p->wait_head = g;
    p->wait_tail = g;
    if (!uv_is_active((uv_handle_t *)&p->wait_timer)) uv_timer_start(&p->wait_timer, on_wait_tick, WAIT_TICK_MS, WAIT_TICK_MS);
}

static int be_submit(void *impl, gw_gen *g, gw_oai_err *err) {
    gw_pool *p = impl;
    pool_ex *e = pick_executor(p);
    if (!e && !restarting(p)) {
        gw_oai_err_set(err, 503, "server_error", NULL, "model_not_ready", "No executor is ready; try again shortly.");
        return CM_ESTATE;
    }
    g->be.id = ++p->next_id;
    g->be.hnext = p->buckets[g->be.id % BUCKETS];
    p->buckets[g->be.id % BUCKETS] = g;
    /* without a seed the draws still need one the pool knows, or a resumed choice could not
     * draw as it would have */
    g->be.seed = g->sp.has_seed ? g->sp.seed : mix64(uv_hrtime() ^ mix64(++p->seed_ctr ^ (uintptr_t)g));
    if (!e) { /* the executors restart: g waits for the first one ready */
        wait_append(p, g);
        return 0;
    }
    return dispatch(p, e, g, err);
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

static int be_accepting(void *impl) { return be_ready(impl) || restarting(impl); }

static const gw_backend_ops pool_ops = { be_submit, be_stop, be_detach, be_ready, be_accepting };

gw_backend gw_pool_backend(gw_pool *p) { return (gw_backend){ &pool_ops, p }; }

/* ---- events from an executor: each record to its generation --------------------------------- */

static void on_error_rec(gw_pool *p, pool_ex *e, const struct shm_error *er) {
    if (er->req_id == 0) {
        CM_LOG_ERROR("pool", "executor error", "executor=%d msg=\"%s\"", e->idx, er->msg);
        if (!e->ever_ready) snprintf(e->load_err, sizeof e->load_err, "%s", er->msg);
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
            } else if (type == SHM_MSG_EMBED) {
                struct shm_embed em;
                if (shm_embed_decode(buf, n, &em) == 0 && (g = lookup(p, em.req_id)) && (i = choice_of(g, em.req_id)) >= 0)
                    gw_gen_embedding(g, i, &em);
            } else if (type == SHM_MSG_ERROR) {
                struct shm_error er;
                if (shm_error_decode(buf, n, &er) == 0) on_error_rec(p, e, &er);
            }
        }
        shm_ring_release(&seg->event);
    }
    if (e->bl_head || e->n_cancels) flush_backlogs(p);
}

/* ---- resuming after an executor died ------------------------------------------------------- */

static void fail_executor_gone(gw_gen *g, const char *why) {
    gw_gen_fail(g, 500, "server_error", "executor_failed", "The executor serving this request failed (%s); retry the request.",
                why ? why : "exited");
}


/* Choice i ended with the last token it delivered (max_tokens, a stop id, or the context is
 * full) but its DONE was lost with the executor: the finish, or SHM_FINISH_NONE. */
static int finished_by_last_token(const gw_gen *g, int i) {
    const gw_gen_choice *c = &g->ch[i];
    if (c->n_toks > 0)
        for (int k = 0; k < g->n_stop_ids; k++)
            if (g->stop_ids[k] == c->toks[c->n_toks - 1]) return SHM_FINISH_STOP;
    if (c->n_toks >= (int64_t)g->sp.max_tokens) return SHM_FINISH_LENGTH;
    if (g->n_prompt + c->n_toks >= g->env->n_ctx) return SHM_FINISH_CONTEXT;
    return SHM_FINISH_NONE;
}

/* Finishes the choices of a waiting g that need no executor. Returns 1 when g ended (it may be
 * freed: do not touch it). */
static int finish_without_executor(gw_gen *g) {
    for (int i = 0; i < g->n; i++) {
        int fin = g->ch[i].finish == SHM_FINISH_NONE ? finished_by_last_token(g, i) : SHM_FINISH_NONE;
        if (!fin) continue;
        struct shm_done d = { .finish = (uint32_t)fin, .completion_tokens = (uint32_t)g->ch[i].n_toks,
                              .cached_prompt_tokens = (uint32_t)g->cached };
        gw_gen_hold(g);
        gw_gen_choice_done(g, i, &d);
        int ended = g->state == GW_GEN_ENDED;
        gw_gen_release(g);
        if (ended) return 1;
    }
    return 0;
}

/* Sends the waiting generations to ready executors, oldest first. */
static void resume_waiting(gw_pool *p) {
    while (p->wait_head) {
        pool_ex *e = pick_executor(p);
        if (!e) return;
        gw_gen *g = p->wait_head;
        wait_remove(p, g);
        if (finish_without_executor(g)) continue;
        int open = 0;
        for (int i = 0; i < g->n; i++) open += g->ch[i].finish == SHM_FINISH_NONE;
        if (g->be.resumes) { /* else it came while the executors restarted: a first dispatch */
            CM_LOG_INFO("pool", "generation resumed", "executor=%d id=%s choices=%d resumes=%d waited_ms=%llu", e->idx, g->id, open,
                        g->be.resumes, (unsigned long long)(uv_now(p->loop) - g->be.wait_since));
            gw_met_request_resumed(p->cfg.met);
        }
        gw_oai_err err;
        if (dispatch(p, e, g, &err)) gw_gen_error(g, &err);
    }
}

/* Executor e died: each generation it held waits to resume, or fails as it did before resuming
 * existed (resume_max deaths, or the pool stops). */
static void executor_lost(pool_ex *e, const char *why) {
    gw_pool *p = e->p;
    while (e->list) {
        gw_gen *g = e->list;
        if (e->stopped || p->stopping || g->be.resumes >= p->cfg.resume_max) {
            if (!e->stopped && !p->stopping && p->cfg.resume_max > 0)
                CM_LOG_WARN("pool", "generation not resumed: its executor died too often", "id=%s resumes=%d", g->id,
                            g->be.resumes);
            fail_executor_gone(g, why); /* detaches g from the list */
            continue;
        }
        leave_executor(g);
        g->be.n_sent = 0;
        g->be.resumes++;
        wait_append(p, g);
    }
    resume_waiting(p); /* another executor may be ready now */
}

static void on_wait_tick(uv_timer_t *t) {
    gw_pool *p = t->data;
    uint64_t now = uv_now(p->loop);
    while (p->wait_head && now - p->wait_head->be.wait_since > p->cfg.resume_wait_ms) {
        gw_gen *g = p->wait_head;
        CM_LOG_WARN("pool", "generation not resumed: no executor ready in time", "id=%s waited_ms=%llu", g->id,
                    (unsigned long long)(now - g->be.wait_since));
        if (g->be.resumes) fail_executor_gone(g, "no executor was ready to resume it in time"); /* unlinks g */
        else /* it came while the executors restarted and none came back */
            gw_gen_fail(g, 503, "server_error", "model_not_ready", "No executor became ready in time; try again shortly.");
    }
    if (!p->wait_head) uv_timer_stop(&p->wait_timer);
}

static void ex_stopped(gw_exec *x, void *ud);

static void ex_state(gw_exec *x, void *ud, int up, const char *why) {
    pool_ex *e = ud;
    gw_pool *p = e->p;
    (void)x;
    e->vocab_next = 0; /* a new executor instance has no vocabulary yet */
    e->vocab_done = 0;
    if (up) {
        CM_LOG_INFO("pool", "executor ready", "executor=%d", e->idx);
        e->ever_ready = 1;
        e->failed_starts = 0;
        e->load_err[0] = 0;
        resume_waiting(p);
        return;
    }
    e->n_cancels = 0;
    /* never ready: a load error will not go away by itself (no GPU, no memory for the pool) */
    int fatal = !e->stopped && !e->ever_ready && (e->load_err[0] || ++e->failed_starts >= START_TRIES);
    if (e->stopped) CM_LOG_INFO("pool", "executor stopped", "executor=%d generations=%d", e->idx, e->n_gens);
    else if (!fatal) {
        if (p->cfg.met) gw_met_executor_restart(p->cfg.met, e->idx);
        CM_LOG_WARN("pool", "executor down", "executor=%d why=\"%s\" generations=%d", e->idx, why ? why : "", e->n_gens);
    }
    executor_lost(e, why);
    if (fatal) {
        char msg[SHM_ERR_MSG_MAX + 200];
        if (e->load_err[0]) snprintf(msg, sizeof msg, "%s", e->load_err);
        else snprintf(msg, sizeof msg, "%s (%d starts in a row)", why ? why : "exited", e->failed_starts);
        CM_LOG_ERROR("pool", "executor failed to start; not restarting it", "executor=%d why=\"%s\"", e->idx, msg);
        e->stopped = 1;
        gw_exec_stop(x, ex_stopped, e);
        if (p->cfg.on_fatal) p->cfg.on_fatal(p, p->cfg.ud, e->idx, msg);
    }
}

/* ---- life cycle ------------------------------------------------------------------------------ */

void gw_pool_cfg_default(gw_pool_cfg *c) {
    memset(c, 0, sizeof *c);
    gw_exec_cfg_default(&c->exec);
    c->resume_max = 3;
    c->resume_wait_ms = 120000;
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
    uv_timer_init(loop, &p->wait_timer);
    p->wait_timer.data = p;
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
            for (int j = 0; j < k; j++) {
                p->ex[j].stopped = 1;
                gw_exec_stop(p->ex[j].x, ex_stopped, &p->ex[j]);
            }
            *out = p; /* the caller runs the loop until the stops finish, then destroys */
            return rc;
        }
        p->n_ex = k + 1;
    }
    *out = p;
    return 0;
}

static void close_timers(gw_pool *p) {
    uv_close((uv_handle_t *)&p->retry, NULL);
    uv_close((uv_handle_t *)&p->wait_timer, NULL);
}

static void ex_stopped(gw_exec *x, void *ud) {
    pool_ex *e = ud;
    gw_pool *p = e->p;
    (void)x;
    if (++p->n_stopped == p->n_ex) {
        close_timers(p);
        if (p->on_stopped) p->on_stopped(p, p->stop_ud);
    }
}

void gw_pool_stop(gw_pool *p, void (*on_stopped)(gw_pool *p, void *ud), void *ud) {
    if (p->stopping) return;
    p->stopping = 1;
    p->on_stopped = on_stopped;
    p->stop_ud = ud;
    while (p->wait_head) fail_executor_gone(p->wait_head, "the server is shutting down");
    for (int k = 0; k < p->n_ex; k++) {
        if (p->ex[k].stopped) continue; /* given up at start (its stop is under way or done) */
        p->ex[k].stopped = 1;
        gw_exec_stop(p->ex[k].x, ex_stopped, &p->ex[k]);
    }
    if (p->n_ex == 0) close_timers(p);
    if (p->n_stopped == p->n_ex && on_stopped) on_stopped(p, ud);
}

void gw_pool_destroy(gw_pool *p) {
    if (!p) return;
    for (int k = 0; k < p->n_ex; k++) gw_exec_destroy(p->ex[k].x);
    free(p->scratch);
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
