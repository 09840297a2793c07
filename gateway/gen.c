/* gen: requests to executors through shared-memory rings (see gen.h). */
#include "gateway/gen.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/metrics.h"
#include "text/detok.h"
#include "text/stop.h"
#include "shm/shm.h"

#define BUCKETS     1024
#define RID_SHIFT   5        /* ring request id = request id << 5 | choice (n <= 16) */
#define CANCEL_CAP  1024     /* CANCELs waiting for ring space, per executor */
#define RETRY_MS    2        /* retry period while a ring is full */

enum { R_PREPARING = 0, R_QUEUED, R_RUNNING };

typedef struct choice {
    uint32_t next_seq;     /* the sequence number the next token must carry */
    int      finished;     /* on_finish was called */
    int      completion;   /* tokens received */
    uint64_t t_first, t_last; /* uv_hrtime of the first / latest token (0: none yet) */
    tok_detok dt;
    tok_stop  st;
} choice;

typedef struct gen_ex gen_ex;

typedef struct greq {
    gw_gen      *g;
    struct greq *hnext;             /* hash chain */
    struct greq *prev, *next;       /* the executor's list of requests it holds */
    struct greq *qnext;             /* backlog (SUBMITs waiting for ring space) */
    uint64_t     id;
    const gw_gen_sink *sink;
    void        *ud;
    gen_ex      *ex;                /* NULL until submitted */
    int          state;             /* R_* */
    int          cancelled;         /* the caller cancelled: no more callbacks */
    int          in_cb;             /* inside a sink callback: freeing is deferred */
    int          n, n_open, n_sent;
    int          kind;
    int          want_lp, top_lp;
    int          max_tokens;        /* -1: up to the context end */
    struct shm_sampling sp;
    int32_t      stop_ids[SHM_MAX_STOP];
    int          n_stop_ids;
    struct shm_logit_bias *bias;
    int          n_bias;
    const char  *stops[GW_OAI_STOP_MAX];
    int          n_stops;
    /* input, owned, for the threadpool: completion text or chat messages; ids after the work */
    char        *text;
    tok_chat_msg *msgs;
    int          n_msgs;
    char        *tools;
    int32_t     *ids;
    int          n_ids;
    uv_work_t    work;
    int          wrc;
    gw_oai_err   werr;
    int          cached;
    uint64_t     t_submit;          /* uv_hrtime at submit */
    int          counted;           /* the failure/abort went into the metrics */
    int          settled;           /* the final usage went to the usage hook */
    int          reached;           /* SUBMITs went to an executor (the prompt is billed) */
    choice       ch[];
} greq;

struct gen_ex {
    gw_gen  *g;
    gw_exec *x;
    int      idx;
    greq    *list;                  /* requests submitted to this executor */
    int      n_reqs;
    greq    *bl_head, *bl_tail;     /* backlog */
    uint64_t cancels[CANCEL_CAP];
    int      n_cancels;
    uint64_t restarts;              /* failures seen (executor restarts) */
    int      stopped;
};

struct gw_gen {
    uv_loop_t *loop;
    gw_gen_cfg cfg;
    char      *model_id;
    gen_ex     ex[GW_GEN_MAX_EXEC];
    int        n_ex;
    greq      *buckets[BUCKETS];
    uint64_t   next_id;
    int        inflight;
    uv_timer_t retry;
    int        retry_armed;
    void     (*on_stopped)(gw_gen *g, void *ud);
    void      *stop_ud;
    int        n_stopped;
    gw_met    *met;                 /* /metrics registry */
    void     (*final_fn)(void *ud, uint64_t id, const gw_oai_usage *u); /* usage hook (quotas) */
    void      *final_ud;
    int        n_preparing;         /* in the threadpool */
};

/* ---- request table ------------------------------------------------------------------------- */

static greq *lookup(gw_gen *g, uint64_t id) {
    for (greq *r = g->buckets[id % BUCKETS]; r; r = r->hnext)
        if (r->id == id) return r;
    return NULL;
}

static void table_remove(gw_gen *g, greq *r) {
    greq **pp = &g->buckets[r->id % BUCKETS];
    while (*pp && *pp != r) pp = &(*pp)->hnext;
    if (*pp) *pp = r->hnext;
}

static void ex_unlink(greq *r) {
    gen_ex *e = r->ex;
    if (!e) return;
    if (r->prev) r->prev->next = r->next;
    else e->list = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    e->n_reqs--;
    /* out of the backlog too */
    for (greq **pp = &e->bl_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->qnext)
        if (*pp == r) {
            *pp = r->qnext;
            if (e->bl_tail == r) e->bl_tail = prev;
            break;
        }
    r->ex = NULL;
}

static void req_free(greq *r) {
    for (int i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
        free((char *)r->msgs[i].name);
        free((char *)r->msgs[i].tool_call_id);
        free((char *)r->msgs[i].tool_calls_json);
    }
    free(r->msgs);
    for (int i = 0; i < r->n_stops; i++) free((char *)r->stops[i]);
    free(r->text);
    free(r->tools);
    free(r->ids);
    free(r->bias);
    free(r);
}

/* Ends a request for good: out of every list, freed unless a callback is running for it. */
static void req_end(greq *r) {
    gw_gen *g = r->g;
    table_remove(g, r);
    ex_unlink(r);
    g->inflight--;
    r->cancelled = 1;
    if (!r->in_cb) req_free(r);
}

/* ---- sink calls (skipped once cancelled; a cancel inside a callback defers the free) ---------- */

#define EMIT(r, call)                  \
    do {                               \
        if (!(r)->cancelled) {         \
            (r)->in_cb++;              \
            (r)->sink->call;           \
            (r)->in_cb--;              \
        }                              \
    } while (0)

/* After a callback: 1 when the request is gone (cancelled inside it). */
static int gone(greq *r) {
    if (!r->cancelled) return 0;
    if (!r->in_cb && !lookup(r->g, r->id)) req_free(r);
    return 1;
}

static void send_cancel(gen_ex *e, uint64_t rid);

static double secs(uint64_t a, uint64_t b) { return a && b >= a ? (double)(b - a) * 1e-9 : -1.0; }

/* Metrics for every choice not finished yet (reason "error" or "abort"), once per request. */
static void count_unfinished(greq *r, const char *reason) {
    if (r->counted) return;
    r->counted = 1;
    uint64_t now = uv_hrtime();
    for (int i = 0; i < r->n; i++)
        if (!r->ch[i].finished)
            gw_met_request_done(r->g->met, NULL, reason, (uint64_t)r->n_ids, (uint64_t)r->ch[i].completion,
                                secs(r->t_submit, r->ch[i].t_first), secs(r->t_submit, now), -1.0);
}

/* The request's final usage, once, to the usage hook: the prompt when it reached an executor,
 * and every token received (all of which went to the client, or would have). */
static void settle(greq *r) {
    if (r->settled) return;
    r->settled = 1;
    if (!r->g->final_fn) return;
    gw_oai_usage u = { r->reached ? r->n_ids : 0, 0, r->cached };
    for (int i = 0; i < r->n; i++) u.completion_tokens += r->ch[i].completion;
    r->g->final_fn(r->g->final_ud, r->id, &u);
}

/* Fails the whole request: CANCELs for its open choices, on_error, end. */
static void req_fail(greq *r, int status, const char *type, const char *code, const char *fmt, ...) {
    gw_oai_err e;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gw_oai_err_set(&e, status, type, NULL, code, "%s", msg);
    if (r->ex)
        for (int i = 0; i < r->n_sent; i++)
            if (!r->ch[i].finished) send_cancel(r->ex, r->id << RID_SHIFT | (uint64_t)i);
    count_unfinished(r, "error");
    EMIT(r, on_error(r->ud, &e));
    settle(r);
    if (lookup(r->g, r->id) == r) req_end(r);
    else gone(r);
}

/* ---- rings ----------------------------------------------------------------------------------- */

static void on_retry(uv_timer_t *t);

static void arm_retry(gw_gen *g) {
    if (!g->retry_armed) {
        g->retry_armed = 1;
        uv_timer_start(&g->retry, on_retry, RETRY_MS, 0);
    }
}

static void send_cancel(gen_ex *e, uint64_t rid) {
    struct shm_seg *seg = gw_exec_seg(e->x);
    if (!seg || !gw_exec_ready(e->x)) return; /* a dead executor holds nothing */
    if (e->n_cancels == 0 && shm_send_cancel(&seg->submit, rid) == 0) return;
    if (e->n_cancels < CANCEL_CAP) e->cancels[e->n_cancels++] = rid;
    else CM_LOG_WARN("gen", "cancel queue full", "executor=%d", e->idx);
    arm_retry(e->g);
}

static void encode_sampling(const greq *r, int i, struct shm_submit *s) {
    memset(s, 0, sizeof *s);
    s->req_id = r->id << RID_SHIFT | (uint64_t)i;
    s->sp = r->sp;
    if (s->sp.has_seed) s->sp.seed += (uint64_t)i; /* n choices with one seed: distinct, reproducible */
    s->prompt = r->ids;
    s->n_prompt = (uint32_t)r->n_ids;
    s->n_stop = (uint32_t)r->n_stop_ids;
    memcpy(s->stop, r->stop_ids, sizeof r->stop_ids);
    s->bias = r->bias;
    s->n_bias = (uint32_t)r->n_bias;
}

/* Sends r's remaining SUBMITs. Returns 0 when all went, CM_EFULL when the ring is full. */
static int send_submits(greq *r) {
    struct shm_seg *seg = gw_exec_seg(r->ex->x);
    if (!seg) return CM_EFULL;
    while (r->n_sent < r->n) {
        struct shm_submit s;
        encode_sampling(r, r->n_sent, &s);
        int rc = shm_send_submit(&seg->submit, &s);
        if (rc == CM_EFULL) return rc;
        if (rc) {
            req_fail(r, 400, "invalid_request_error", "prompt_too_long",
                     "The prompt (%d tokens) cannot be sent to the executor: %s", r->n_ids, cm_err_str(rc));
            return rc;
        }
        r->n_sent++;
        r->reached = 1;
    }
    r->state = R_RUNNING;
    return 0;
}

static void flush_backlogs(gw_gen *g) {
    int again = 0;
    for (int k = 0; k < g->n_ex; k++) {
        gen_ex *e = &g->ex[k];
        struct shm_seg *seg = gw_exec_seg(e->x);
        if (!seg || !gw_exec_ready(e->x)) continue;
        int sent = 0;
        while (sent < e->n_cancels && shm_send_cancel(&seg->submit, e->cancels[sent]) == 0) sent++;
        memmove(e->cancels, e->cancels + sent, (size_t)(e->n_cancels - sent) * sizeof *e->cancels);
        e->n_cancels -= sent;
        while (e->bl_head) {
            greq *r = e->bl_head;
            int rc = send_submits(r);
            if (rc == CM_EFULL) break;
            if (lookup(g, r->id) == r && e->bl_head == r) { /* sent (a failure unlinked it already) */
                e->bl_head = r->qnext;
                if (!e->bl_head) e->bl_tail = NULL;
                r->qnext = NULL;
            }
        }
        again |= e->n_cancels > 0 || e->bl_head != NULL;
    }
    if (again) arm_retry(g);
}

static void on_retry(uv_timer_t *t) {
    gw_gen *g = t->data;
    g->retry_armed = 0;
    flush_backlogs(g);
}

/* ---- events from an executor --------------------------------------------------------------- */

/* The choice is complete: usage, on_finish, and on_done + end when it was the last. */
static void finish_choice(greq *r, int i, int finish) {
    choice *c = &r->ch[i];
    if (c->finished) return;
    c->finished = 1;
    r->n_open--;
    gw_met_request_done(r->g->met, NULL, gw_finish_name(finish), (uint64_t)r->n_ids,
                        (uint64_t)c->completion, secs(r->t_submit, c->t_first), secs(r->t_submit, uv_hrtime()), -1.0);
    EMIT(r, on_finish(r->ud, i, finish));
    if (gone(r) || r->n_open) return;
    gw_oai_usage u = { r->n_ids, 0, r->cached };
    for (int k = 0; k < r->n; k++) u.completion_tokens += r->ch[k].completion;
    EMIT(r, on_done(r->ud, &u));
    settle(r);
    if (lookup(r->g, r->id) == r) req_end(r);
    else gone(r);
}

/* Releases text through the stop matcher; returns 1 when a stop string matched. */
static int emit_text(greq *r, int i, const char *txt, size_t len, const gw_oai_tok *toks, int n_toks) {
    char out[4096 + TOK_STOP_MAX_LEN];
    int hit = -1;
    size_t n = 0;
    while (len || n_toks) { /* feed in slices the buffer can take */
        size_t take = len > 4096 ? 4096 : len;
        if (tok_stop_feed(&r->ch[i].st, txt, take, out, sizeof out, &n, &hit)) return 0;
        int last = take == len;
        if (n || (last && n_toks)) {
            EMIT(r, on_text(r->ud, i, out, n, last ? toks : NULL, last ? n_toks : 0));
            if (gone(r)) return 1;
        }
        txt += take;
        len -= take;
        if (last) break;
    }
    return hit >= 0;
}

static void on_token(gw_gen *g, const struct shm_tok *t, const struct shm_top *top) {
    greq *r = lookup(g, t->req_id >> RID_SHIFT);
    int i = (int)(t->req_id & ((1u << RID_SHIFT) - 1));
    if (!r || i >= r->n_sent || r->ch[i].finished) return; /* cancelled, or after a stop string */
    choice *c = &r->ch[i];
    if (t->seq != c->next_seq) {
        req_fail(r, 500, "server_error", "token_stream_error",
                 "token %u of choice %d arrived where %u was expected (lost or duplicated output)", t->seq, i, c->next_seq);
        return;
    }
    c->next_seq++;
    c->completion++;
    uint64_t now = uv_hrtime();
    if (!c->t_first) c->t_first = now;
    else gw_met_itl(g->met, (double)(now - c->t_last) * 1e-9);
    c->t_last = now;
    char txt[4096];
    size_t n = 0;
    if (tok_detok_push(&c->dt, t->token, txt, sizeof txt, &n)) n = 0; /* out of range or oversized piece: no text */
    gw_oai_tok lt;
    gw_oai_top tops[SHM_MAX_TOP_LOGPROBS];
    int n_toks = 0;
    if (r->want_lp) {
        lt.text = tok_piece_ref(g->cfg.vocab, t->token, &lt.len);
        if (!lt.text) lt.text = "", lt.len = 0;
        lt.logprob = (t->flags & SHM_TOK_LOGPROB) ? t->logprob : 0.0f;
        lt.n_top = t->n_top < r->top_lp ? t->n_top : r->top_lp;
        for (int k = 0; k < lt.n_top; k++) {
            tops[k].text = tok_piece_ref(g->cfg.vocab, top[k].token, &tops[k].len);
            if (!tops[k].text) tops[k].text = "", tops[k].len = 0;
            tops[k].logprob = top[k].logprob;
        }
        lt.top = tops;
        n_toks = 1;
    }
    uint64_t id = r->id;
    if (emit_text(r, i, txt, n, n_toks ? &lt : NULL, n_toks)) {
        if (lookup(g, id) != r) return;
        send_cancel(r->ex, t->req_id); /* the executor need not generate past the stop string */
        finish_choice(r, i, SHM_FINISH_STOP);
    }
}

static void on_done_rec(gw_gen *g, const struct shm_done *d) {
    greq *r = lookup(g, d->req_id >> RID_SHIFT);
    int i = (int)(d->req_id & ((1u << RID_SHIFT) - 1));
    if (!r || i >= r->n_sent || r->ch[i].finished) return;
    if (d->finish == SHM_FINISH_ERROR || d->finish == SHM_FINISH_CANCELLED) {
        /* an ERROR record normally came first and failed the request; a cancel we did not send */
        req_fail(r, 500, "server_error", "executor_error", "the executor ended choice %d (%s)", i,
                 d->finish == SHM_FINISH_ERROR ? "error" : "cancelled");
        return;
    }
    if (d->completion_tokens != r->ch[i].completion) {
        req_fail(r, 500, "server_error", "token_stream_error", "choice %d: %u tokens announced, %d received", i,
                 d->completion_tokens, r->ch[i].completion);
        return;
    }
    if (i == 0) r->cached = (int)d->cached_prompt_tokens;
    choice *c = &r->ch[i];
    char txt[8], out[TOK_STOP_MAX_LEN + 8];
    size_t n = 0, m = 0;
    uint64_t id = r->id;
    if (tok_detok_flush(&c->dt, txt, sizeof txt, &n) == 0 && n && emit_text(r, i, txt, n, NULL, 0)) {
        if (lookup(g, id) == r) finish_choice(r, i, SHM_FINISH_STOP);
        return;
    }
    if (lookup(g, id) != r) return;
    if (tok_stop_flush(&c->st, out, sizeof out, &m) == 0 && m) {
        EMIT(r, on_text(r->ud, i, out, m, NULL, 0));
        if (gone(r)) return;
    }
    finish_choice(r, i, (int)d->finish);
}

static void on_error_rec(gw_gen *g, gen_ex *e, const struct shm_error *er) {
    if (er->req_id == 0) {
        CM_LOG_ERROR("gen", "executor error", "executor=%d msg=\"%s\"", e->idx, er->msg);
        return;
    }
    greq *r = lookup(g, er->req_id >> RID_SHIFT);
    if (!r) return;
    if (er->code == CM_EFULL || er->code == CM_ENOKV)
        req_fail(r, 503, "server_error", "overloaded", "The server is overloaded (%s); retry shortly.", er->msg);
    else if (er->code == CM_ECTX)
        req_fail(r, 400, "invalid_request_error", "context_length_exceeded", "%s", er->msg);
    else
        req_fail(r, 500, "server_error", "executor_error", "The executor failed the request: %s", er->msg);
}

static void ex_events(gw_exec *x, void *ud, struct shm_seg *seg) {
    gen_ex *e = ud;
    gw_gen *g = e->g;
    (void)x;
    const void *p;
    size_t n;
    while (shm_ring_peek(&seg->event, &p, &n) == 0) {
        uint32_t type;
        if (shm_msg_type(p, n, &type) == 0) {
            if (type == SHM_MSG_TOKENS) {
                struct shm_tokens_r rd;
                struct shm_tok t;
                const struct shm_top *top;
                if (shm_tokens_open(&rd, p, n) == 0)
                    while (shm_tokens_next(&rd, &t, &top) == 0) on_token(g, &t, top);
            } else if (type == SHM_MSG_DONE) {
                struct shm_done d;
                if (shm_done_decode(p, n, &d) == 0) on_done_rec(g, &d);
            } else if (type == SHM_MSG_ERROR) {
                struct shm_error er;
                if (shm_error_decode(p, n, &er) == 0) on_error_rec(g, e, &er);
            }
        }
        shm_ring_release(&seg->event);
    }
    if (e->bl_head || e->n_cancels) flush_backlogs(g);
}

static void ex_state(gw_exec *x, void *ud, int up, const char *why) {
    gen_ex *e = ud;
    (void)x;
    if (up) {
        CM_LOG_INFO("gen", "executor ready", "executor=%d", e->idx);
        return;
    }
    e->n_cancels = 0;
    if (e->stopped) CM_LOG_INFO("gen", "executor stopped", "executor=%d requests=%d", e->idx, e->n_reqs);
    else {
        e->restarts++;
        gw_met_executor_restart(e->g->met, e->idx);
        CM_LOG_WARN("gen", "executor down", "executor=%d why=\"%s\" requests=%d", e->idx, why ? why : "", e->n_reqs);
    }
    while (e->list)
        req_fail(e->list, 500, "server_error", "executor_failed",
                 "The executor serving this request failed (%s); retry the request.", why ? why : "exited");
}

/* ---- submit ---------------------------------------------------------------------------------- */

static gen_ex *pick_executor(gw_gen *g) {
    gen_ex *best = NULL;
    for (int k = 0; k < g->n_ex; k++) {
        gen_ex *e = &g->ex[k];
        if (!e->stopped && gw_exec_ready(e->x) && (!best || e->n_reqs < best->n_reqs)) best = e;
    }
    return best;
}

/* Threadpool: render the chat template and tokenize. Touches only r's own fields and the
 * immutable vocabulary and template. */
static void work_prepare(uv_work_t *w) {
    greq *r = w->data;
    gw_gen *g = r->g;
    char err[512] = "";
    if (r->kind == GW_OAI_CHAT) {
        size_t len;
        int rc = tok_chat_render(g->cfg.chat, r->msgs, r->n_msgs, r->tools, 1, &r->text, &len, err, sizeof err);
        if (rc) {
            r->wrc = rc;
            if (rc == CM_ENOMEM || rc == CM_ETOOBIG)
                gw_oai_err_set(&r->werr, rc == CM_ENOMEM ? 500 : 400, rc == CM_ENOMEM ? "server_error" : "invalid_request_error",
                               "messages", NULL, "chat template: %s", err);
            else
                gw_oai_err_set(&r->werr, 400, "invalid_request_error", "messages", rc == CM_ESTATE ? "chat_template_missing" : "chat_template_error",
                               "%s", err);
            return;
        }
    }
    if (r->ids) return; /* completions with token ids */
    size_t len = strlen(r->text);
    /* a template adds BOS as text (parsed as the special token); a completion prompt gets the
     * model's add_bos */
    int add_bos = r->kind == GW_OAI_CHAT ? 0 : tok_add_bos(g->cfg.vocab);
    int cap = (int)(len < (size_t)1 << 28 ? len : (size_t)1 << 28) + 4, n = 0;
    r->ids = malloc((size_t)cap * sizeof *r->ids);
    int rc = r->ids ? tok_encode(g->cfg.vocab, r->text, len, add_bos, 1, r->ids, cap, &n) : CM_ENOMEM;
    if (rc) {
        r->wrc = rc;
        gw_oai_err_set(&r->werr, rc == CM_ENOMEM ? 500 : 400, rc == CM_ENOMEM ? "server_error" : "invalid_request_error",
                       r->kind == GW_OAI_CHAT ? "messages" : "prompt", NULL, "cannot tokenize the prompt: %s", cm_err_str(rc));
        return;
    }
    r->n_ids = n;
}

static void work_done(uv_work_t *w, int status) {
    greq *r = w->data;
    gw_gen *g = r->g;
    g->n_preparing--;
    if (r->cancelled) { /* cancelled while in the threadpool: nothing more to say */
        req_free(r);
        return;
    }
    gw_oai_err e;
    if (status) {
        gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "request preparation was cancelled");
        goto fail;
    }
    if (r->wrc) {
        e = r->werr;
        goto fail;
    }
    free(r->text);
    r->text = NULL;
    int ctx = g->cfg.n_ctx;
    if (r->n_ids < 1) {
        gw_oai_err_set(&e, 400, "invalid_request_error", r->kind == GW_OAI_CHAT ? "messages" : "prompt", NULL,
                       "The prompt is empty.");
        goto fail;
    }
    if (r->n_ids >= ctx || (r->max_tokens > 0 && r->n_ids + r->max_tokens > ctx)) {
        gw_oai_err_context(&e, r->kind, ctx, r->n_ids, r->max_tokens > 0 ? r->max_tokens : 1);
        goto fail;
    }
    r->sp.max_tokens = (uint32_t)(r->max_tokens > 0 ? r->max_tokens : ctx - r->n_ids);
    gen_ex *x = pick_executor(g);
    if (!x) {
        gw_oai_err_set(&e, 503, "server_error", NULL, "model_not_ready", "No executor is ready; try again shortly.");
        goto fail;
    }
    r->ex = x;
    r->next = x->list;
    if (x->list) x->list->prev = r;
    x->list = r;
    x->n_reqs++;
    r->state = R_QUEUED;
    uint64_t id = r->id;
    int rc = x->bl_head ? CM_EFULL : send_submits(r); /* keep the order behind a backlog */
    if (lookup(g, id) != r) return;                   /* failed and ended */
    if (rc == CM_EFULL) {
        if (x->bl_tail) x->bl_tail->qnext = r;
        else x->bl_head = r;
        x->bl_tail = r;
        arm_retry(g);
    }
    EMIT(r, on_start(r->ud, r->n_ids, 0));
    gone(r);
    return;
fail:
    count_unfinished(r, "error");
    EMIT(r, on_error(r->ud, &e));
    settle(r);
    if (lookup(g, r->id) == r) req_end(r);
    else gone(r);
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static int be_submit(void *impl, const gw_oai_req *q, const gw_gen_sink *sink, void *ud, uint64_t *id, gw_oai_err *e) {
    gw_gen *g = impl;
    const tok_vocab *v = g->cfg.vocab;
    if (!pick_executor(g)) {
        gw_oai_err_set(e, 503, "server_error", NULL, "model_not_ready", "No executor is ready; try again shortly.");
        return CM_ESTATE;
    }
    if (g->inflight >= g->cfg.max_requests) {
        gw_oai_err_set(e, 503, "server_error", NULL, "overloaded", "The server has %d requests in flight; retry shortly.",
                       g->inflight);
        return CM_EFULL;
    }
    if (q->kind == GW_OAI_CHAT && !tok_chat_ready(g->cfg.chat)) {
        gw_oai_err_set(e, 400, "invalid_request_error", "messages", "chat_template_missing",
                       "This model has no chat template, so /v1/chat/completions cannot format messages; use "
                       "/v1/completions, or start the server with --chat-template NAME.");
        return CM_EINVAL;
    }
    if (q->n_logit_bias > SHM_MAX_LOGIT_BIAS) {
        gw_oai_err_set(e, 400, "invalid_request_error", "logit_bias", NULL, "At most %d logit_bias entries are supported.",
                       SHM_MAX_LOGIT_BIAS);
        return CM_EINVAL;
    }
    for (int i = 0; i < q->n_logit_bias; i++)
        if (q->logit_bias[i].token < 0 || q->logit_bias[i].token >= tok_n_vocab(v)) {
            gw_oai_err_set(e, 400, "invalid_request_error", "logit_bias", NULL,
                           "Invalid token id %d in logit_bias (the vocabulary has %d tokens).", q->logit_bias[i].token,
                           tok_n_vocab(v));
            return CM_EINVAL;
        }
    for (int i = 0; i < q->n_prompt_tokens; i++)
        if (q->prompt_tokens[i] < 0 || q->prompt_tokens[i] >= tok_n_vocab(v)) {
            gw_oai_err_set(e, 400, "invalid_request_error", "prompt", NULL,
                           "Invalid token id %d in prompt (the vocabulary has %d tokens).", q->prompt_tokens[i], tok_n_vocab(v));
            return CM_EINVAL;
        }
    greq *r = calloc(1, sizeof *r + (size_t)q->n * sizeof(choice));
    if (!r) goto oom;
    r->g = g;
    r->id = ++g->next_id;
    r->sink = sink;
    r->ud = ud;
    r->kind = q->kind;
    r->n = r->n_open = q->n;
    /* OpenAI's completions default to 16 tokens; chat runs to the context end */
    /* OpenAI's completions default to 16 tokens; chat runs to the context end */
    r->max_tokens = q->sp.max_tokens ? (int)q->sp.max_tokens : q->kind == GW_OAI_COMPLETION ? 16 : -1;
    r->want_lp = q->sp.logprobs;
    r->top_lp = q->sp.top_logprobs;
    r->sp = q->sp;
    /* the end of generation is text/'s: its ids are the executor's stop ids */
    _Static_assert(TOK_EOG_MAX <= SHM_MAX_STOP, "every end-of-generation id fits SUBMIT's stop ids");
    r->n_stop_ids = tok_eog_ids(v, r->stop_ids, SHM_MAX_STOP);
    if (q->n_logit_bias) {
        if (!(r->bias = malloc((size_t)q->n_logit_bias * sizeof *r->bias))) goto oom;
        memcpy(r->bias, q->logit_bias, (size_t)q->n_logit_bias * sizeof *r->bias);
        r->n_bias = q->n_logit_bias;
    }
    for (int i = 0; i < q->n_stop; i++) {
        if (!(r->stops[i] = strdup(q->stop[i]))) goto oom;
        r->n_stops = i + 1;
    }
    for (int i = 0; i < r->n; i++) {
        int rc = tok_detok_init(&r->ch[i].dt, v, TOK_DETOK_SKIP_CONTROL);
        if (!rc) rc = tok_stop_init(&r->ch[i].st, r->stops, NULL, r->n_stops);
        if (rc) {
            gw_oai_err_set(e, 400, "invalid_request_error", "stop", NULL, "invalid stop sequences: %s", cm_err_str(rc));
            req_free(r);
            return CM_EINVAL;
        }
    }
    if (q->kind == GW_OAI_CHAT) {
        if (!(r->msgs = calloc((size_t)(q->n_msgs ? q->n_msgs : 1), sizeof *r->msgs))) goto oom;
        for (int i = 0; i < q->n_msgs; i++, r->n_msgs++) {
            const gw_oai_msg *m = &q->msgs[i];
            tok_chat_msg *d = &r->msgs[i];
            d->role = dup_or_null(m->role);
            d->content = dup_or_null(m->content);
            d->name = dup_or_null(m->name);
            d->tool_call_id = dup_or_null(m->tool_call_id);
            d->tool_calls_json = dup_or_null(m->tool_calls);
            if ((m->role && !d->role) || (m->content && !d->content) || (m->name && !d->name) ||
                (m->tool_call_id && !d->tool_call_id) || (m->tool_calls && !d->tool_calls_json)) {
                r->n_msgs++;
                goto oom;
            }
        }
        if (q->tools_json && !(r->tools = strdup(q->tools_json))) goto oom;
    } else if (q->prompt_tokens) {
        if (!(r->ids = malloc((size_t)(q->n_prompt_tokens ? q->n_prompt_tokens : 1) * sizeof *r->ids))) goto oom;
        memcpy(r->ids, q->prompt_tokens, (size_t)q->n_prompt_tokens * sizeof *r->ids);
        r->n_ids = q->n_prompt_tokens;
    } else if (!(r->text = strdup(q->prompt ? q->prompt : ""))) {
        goto oom;
    }
    r->work.data = r;
    r->hnext = g->buckets[r->id % BUCKETS];
    g->buckets[r->id % BUCKETS] = r;
    g->inflight++;
    g->n_preparing++;
    r->t_submit = uv_hrtime();
    if (uv_queue_work(g->loop, &r->work, work_prepare, work_done)) {
        table_remove(g, r);
        g->inflight--;
        g->n_preparing--;
        req_free(r);
        gw_oai_err_set(e, 500, "server_error", NULL, NULL, "cannot queue the request");
        return CM_EIO;
    }
    *id = r->id;
    return 0;
oom:
    if (r) req_free(r);
    gw_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return CM_ENOMEM;
}

static void be_cancel(void *impl, uint64_t id) {
    gw_gen *g = impl;
    greq *r = lookup(g, id);
    if (!r || r->cancelled) return;
    if (r->state == R_PREPARING) { /* in the threadpool: work_done frees it */
        table_remove(g, r);
        g->inflight--;
        r->cancelled = 1;
        settle(r);
        return;
    }
    if (r->ex)
        for (int i = 0; i < r->n_sent; i++)
            if (!r->ch[i].finished) send_cancel(r->ex, r->id << RID_SHIFT | (uint64_t)i);
    count_unfinished(r, "abort");
    settle(r); /* what was delivered; the executor stops the sequence on the CANCEL */
    req_end(r);
}

static int be_ready(void *impl) { return pick_executor(impl) != NULL; }
static const char *be_model_id(void *impl) { return ((gw_gen *)impl)->model_id; }

static const gw_backend_ops gen_ops = { be_submit, be_cancel, be_ready, be_model_id };

gw_backend gw_gen_backend(gw_gen *g) { return (gw_backend){ &gen_ops, g }; }

/* ---- life cycle ------------------------------------------------------------------------------ */

void gw_gen_cfg_default(gw_gen_cfg *c) {
    memset(c, 0, sizeof *c);
    c->max_requests = 4096;
    gw_exec_cfg_default(&c->exec);
}

int gw_gen_start(uv_loop_t *loop, const gw_gen_cfg *cfg, gw_gen **out) {
    if (!loop || !cfg || !out || !cfg->model_id || !cfg->vocab || cfg->n_ctx < 2 || cfg->n_exec < 1 ||
        cfg->n_exec > GW_GEN_MAX_EXEC || cfg->max_requests < 1)
        return CM_EINVAL;
    gw_gen *g = calloc(1, sizeof *g);
    if (!g || !(g->model_id = strdup(cfg->model_id))) {
        free(g);
        return CM_ENOMEM;
    }
    g->loop = loop;
    g->cfg = *cfg;
    if (gw_met_create(cfg->model_id, cfg->n_ctx, &g->met)) {
        free(g->model_id);
        free(g);
        return CM_ENOMEM;
    }
    uv_timer_init(loop, &g->retry);
    g->retry.data = g;
    for (int k = 0; k < cfg->n_exec; k++) {
        gen_ex *e = &g->ex[k];
        e->g = g;
        e->idx = k;
        gw_exec_cfg c = cfg->exec;
        c.args = cfg->exec_args[k];
        c.index = k;
        c.on_state = ex_state;
        c.on_events = ex_events;
        c.ud = e;
        int rc = gw_exec_start(loop, &c, &e->x);
        if (rc) {
            g->n_ex = k;
            CM_LOG_ERROR("gen", "cannot start executor", "executor=%d rc=%s", k, cm_err_str(rc));
            for (int j = 0; j < k; j++) gw_exec_stop(g->ex[j].x, NULL, NULL);
            *out = g; /* the caller runs the loop until the stops finish, then destroys */
            return rc;
        }
        g->n_ex = k + 1;
    }
    *out = g;
    return 0;
}

static void ex_stopped(gw_exec *x, void *ud) {
    gen_ex *e = ud;
    gw_gen *g = e->g;
    (void)x;
    if (++g->n_stopped == g->n_ex) {
        uv_close((uv_handle_t *)&g->retry, NULL);
        if (g->on_stopped) g->on_stopped(g, g->stop_ud);
    }
}

void gw_gen_stop(gw_gen *g, void (*on_stopped)(gw_gen *g, void *ud), void *ud) {
    g->on_stopped = on_stopped;
    g->stop_ud = ud;
    for (int k = 0; k < g->n_ex; k++) {
        g->ex[k].stopped = 1;
        gw_exec_stop(g->ex[k].x, ex_stopped, &g->ex[k]);
    }
    if (g->n_ex == 0) {
        uv_close((uv_handle_t *)&g->retry, NULL);
        if (on_stopped) on_stopped(g, ud);
    }
}

void gw_gen_destroy(gw_gen *g) {
    if (!g) return;
    for (int b = 0; b < BUCKETS; b++)
        while (g->buckets[b]) {
            greq *r = g->buckets[b];
            g->buckets[b] = r->hnext;
            if (r->state == R_PREPARING) continue; /* the threadpool still owns it (the loop is gone: leaked with it) */
            req_free(r);
        }
    for (int k = 0; k < g->n_ex; k++) gw_exec_destroy(g->ex[k].x);
    gw_met_destroy(g->met);
    free(g->model_id);
    free(g);
}

int gw_gen_inflight(const gw_gen *g) { return g ? g->inflight : 0; }

/* ---- metrics --------------------------------------------------------------------------------- */

char *gw_gen_metrics(gw_gen *g, size_t *len) {
    uint64_t queued = (uint64_t)g->n_preparing;
    for (int k = 0; k < g->n_ex; k++) {
        gen_ex *e = &g->ex[k];
        for (greq *r = e->bl_head; r; r = r->qnext) queued++;
        struct shm_seg *seg = gw_exec_seg(e->x);
        if (seg && seg->stats) gw_met_executor(g->met, k, seg->stats);
    }
    gw_met_set_queued(g->met, queued);
    gw_met_set_inflight(g->met, (uint64_t)g->inflight);
    return gw_met_render(g->met, len);
}

gw_met *gw_gen_met(gw_gen *g) { return g ? g->met : NULL; }

void gw_gen_set_usage_final(gw_gen *g, void (*fn)(void *ud, uint64_t id, const gw_oai_usage *u), void *ud) {
    g->final_fn = fn;
    g->final_ud = ud;
}
