/* routes: the OpenAI-compatible API: routing, and generation requests over HTTP (JSON and SSE)
 * and over WebSocket (Realtime-style events). The three share one path — parse, admission
 * (API keys and quotas), a gw_gen — and differ only in their sink: how the output is written.
 * Every sink's end goes through finish(), which settles the quota claim with the generation's
 * final usage and records its metrics. */
#include "gateway/routes.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <llhttp.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/gen.h"
#include "gateway/metrics.h"
#include "gateway/openai.h"
#include "gateway/ws.h"
#include "text/chat.h"
#include "text/detok.h"

#define PARSE_INLINE_MAX (32u << 10) /* request bodies larger than this are parsed on the threadpool */

struct tport;
struct parse_job;

struct gw_app {
    gw_app_cfg cfg;
    int active;
    struct tport *live; /* every generation not yet ended (tport.lnext) */
    /* large bodies are parsed one at a time, so that they never take every core from the loop */
    struct parse_job *parse_head, *parse_tail;
    int parsing;
};

void gw_app_cfg_default(gw_app_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->fingerprint = "fp_arka";
    cfg->owned_by = "arka";
    cfg->ping_ms = 15000;
    cfg->ws_max_responses = 16;
    cfg->ws_max_message = 8u << 20;
    cfg->ws_ping_ms = 30000;
    cfg->ws_idle_ms = 300000;
    cfg->ws_message_ms = 60000;
}

int gw_app_create(const gw_app_cfg *cfg, gw_app **out) {
    *out = NULL;
    if (!cfg || !cfg->env || !cfg->env->backend.ops || !cfg->model_id || cfg->ws_max_responses < 1) return CM_EINVAL;
    gw_app *a = calloc(1, sizeof *a);
    if (!a) return CM_ENOMEM;
    a->cfg = *cfg;
    *out = a;
    return 0;
}

void gw_app_destroy(gw_app *app) { free(app); }

int gw_app_active(const gw_app *app) { return app->active; }

static int backend_ready(gw_app *a) { return a->cfg.env->backend.ops->ready(a->cfg.env->backend.impl); }

/* A generation taken now will run: an executor is up, or one that was up restarts (it waits). */
static int backend_accepting(gw_app *a) {
    const gw_backend *b = &a->cfg.env->backend;
    return (b->ops->accepting ? b->ops->accepting : b->ops->ready)(b->impl);
}

/* ---- small helpers ------------------------------------------------------------------------ */

/* The client's x-request-id when it is printable ASCII of at most 128 bytes, else NULL. */
static const char *client_rid(gw_req *r) {
    const char *v = gw_req_header(r, "x-request-id");
    if (!v || !*v || strlen(v) > 128) return NULL;
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) return NULL;
    return v;
}

/* The CORS origin to allow for r's Origin ("*" or the origin when it is listed), or NULL. */
static const char *cors_allow(const gw_app *a, gw_req *r, char *buf, size_t cap) {
    const char *list = a->cfg.cors_origin;
    if (!list || !*list) return NULL;
    if (!strcmp(list, "*")) return "*";
    const char *o = gw_req_header(r, "Origin");
    if (!o) return NULL;
    size_t ol = strlen(o);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && *p == ' ') { p++; n--; }
        while (n && p[n - 1] == ' ') n--;
        if (n == ol && !strncmp(p, o, n) && ol < cap) {
            memcpy(buf, o, ol + 1);
            return buf;
        }
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

/* The header lines every response to r carries: the client's x-request-id echoed, and the
 * CORS headers. Returns the length written. */
static size_t common_headers(const gw_app *a, gw_req *r, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    const char *rid = client_rid(r);
    if (rid) n += (size_t)snprintf(out, cap, "x-request-id: %s\r\n", rid);
    char ob[256];
    const char *allow = cors_allow(a, r, ob, sizeof ob);
    if (allow && n < cap)
        n += (size_t)snprintf(out + n, cap - n,
                              "Access-Control-Allow-Origin: %s\r\n%sAccess-Control-Expose-Headers: x-request-id, "
                              "x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests, "
                              "x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens, retry-after, "
                              "x-should-retry\r\n",
                              allow, strcmp(allow, "*") ? "Vary: Origin\r\n" : "");
    return n < cap ? n : cap - 1;
}

static void send_raw(gw_req *r, int status, const char *json, const char *extra) {
    gw_resp_send(r, status, "application/json", json, strlen(json), extra);
}

static void send_err_raw(gw_req *r, const gw_oai_err *e, const char *extra) {
    char *js = gw_oai_error_json(e);
    if (js) send_raw(r, e->status, js, extra);
    else gw_resp_send(r, 500, "text/plain", "out of memory\n", 14, extra);
    free(js);
}

/* A whole response with the common header lines and extra. */
static void reply(gw_app *a, gw_req *r, int status, const char *ctype, const char *body, size_t len, const char *extra) {
    char hd[2048];
    size_t n = common_headers(a, r, hd, sizeof hd);
    snprintf(hd + n, sizeof hd - n, "%s", extra ? extra : "");
    gw_resp_send(r, status, ctype, body, len, hd[0] ? hd : NULL);
}

static void send_json(gw_app *a, gw_req *r, int status, const char *json, const char *extra) {
    reply(a, r, status, "application/json", json, strlen(json), extra);
}

static void send_err(gw_app *a, gw_req *r, const gw_oai_err *e, const char *extra) {
    char *js = gw_oai_error_json(e);
    if (js) send_json(a, r, e->status, js, extra);
    else reply(a, r, 500, "text/plain", "out of memory\n", 14, extra);
    free(js);
}

static int check_model(gw_app *a, const char *model, gw_oai_err *e) {
    if (strcmp(model, a->cfg.model_id) == 0) return 0;
    gw_oai_err_set(e, 404, "invalid_request_error", "model", "model_not_found",
                   "The model `%.200s` does not exist or you do not have access to it.", model);
    return CM_ENOTFOUND;
}

/* ---- generations: one path for every transport --------------------------------------------- */

/* What every transport's per-generation state starts with. The state lives from the
 * generation's creation to its sink's end, or past it until a pending admission answers. */
typedef struct tport {
    gw_app *app;
    gw_gen *gen;             /* while it runs (the app's live list) */
    struct tport *lprev, *lnext;
    int     admitting;       /* an admission answer is pending: the state waits for it */
    /* the admission answered and the generation goes on (NULL: nothing to do) */
    void  (*admitted)(gw_gen *g, const gw_auth_result *res);
    /* the generation started (NULL: nothing to do) */
    void  (*accepted)(gw_gen *g);
    void  (*release)(struct tport *t); /* frees the state */
} tport;

/* A generation of parsed request q (taken) writing to sink, for a transport whose state t is
 * already set up. Returns 0, or fills e (404 another model, 400 bad stop strings, 500; nothing
 * else to undo: q is gone either way). */
static int gen_new(gw_app *a, gw_oai_req *q, const gw_gen_sink *sink, tport *t, const char *id_prefix, gw_gen **out,
                   gw_oai_err *e) {
    int kind = q->kind, include_usage = q->include_usage;
    int rc = check_model(a, q->model, e);
    if (rc) {
        gw_oai_req_free(q);
        return rc;
    }
    rc = gw_gen_create(a->cfg.env, q, sink, t, out, e);
    if (rc) return rc;
    gw_gen *g = *out;
    gw_oai_make_id(g->id, sizeof g->id, id_prefix);
    g->meta = (gw_oai_meta){ kind, g->id, (int64_t)time(NULL), g->q.model, a->cfg.fingerprint, include_usage };
    a->active++;
    t->gen = g;
    t->lprev = NULL;
    t->lnext = a->live;
    if (a->live) a->live->lprev = t;
    a->live = t;
    return 0;
}

static void live_unlink(gw_app *a, tport *t) {
    if (!t->gen) return;
    if (t->lprev) t->lprev->lnext = t->lnext;
    else a->live = t->lnext;
    if (t->lnext) t->lnext->lprev = t->lprev;
    t->lprev = t->lnext = NULL;
    t->gen = NULL;
}

static void start(gw_gen *g) {
    tport *t = g->sink_ud;
    if (gw_gen_start(g) == 0 && t->accepted) t->accepted(g);
}

/* The quota claim, settled once with what was used: the prompt when it reached an executor and
 * every completion token received. */
static void settle_quota(gw_app *a, gw_gen *g) {
    if (!g->ticket.live) return;
    int64_t prompt = g->reached ? g->n_prompt : 0, gen = g->usage.completion_tokens;
    gw_auth_settle(a->cfg.auth, &g->ticket, prompt + gen);
    gw_met_tenant_usage(a->cfg.met, g->ticket.tenant, (uint64_t)prompt, (uint64_t)gen);
}

/* Every sink's end starts here: the quota claim and the request's metrics (one line per choice:
 * its finish reason, or "abort" for a cancel and "error" for a failure, when it ran; failures
 * during preparation count as errors; a cancel before it ran counts nothing). */
static void finish(gw_gen *g, const gw_oai_err *err) {
    tport *t = g->sink_ud;
    gw_app *a = t->app;
    a->active--;
    live_unlink(a, t);
    settle_quota(a, g);
    if (!a->cfg.met || (!g->ran && !(err && g->t_start))) return;
    for (int i = 0; i < g->n; i++) {
        const gw_gen_choice *c = &g->ch[i];
        const char *reason = c->finish ? gw_finish_name(c->finish) : err ? "error" : "abort";
        double ttft = c->t_first ? (double)(c->t_first - g->t_start) * 1e-9 : -1.0;
        gw_met_request_done(a->cfg.met, NULL, reason, (uint64_t)g->n_prompt, (uint64_t)c->n_toks, ttft,
                            (double)(c->t_end - g->t_start) * 1e-9, c->queue_ns >= 0 ? (double)c->queue_ns * 1e-9 : -1.0);
    }
}

/* The end of a sink's end: the state goes, unless an admission answer still has to come. */
static void tport_done(tport *t) {
    if (!t->admitting) t->release(t);
}

static void on_admit(void *ud, const gw_auth_result *res) {
    gw_gen *g = ud;
    tport *t = g->sink_ud;
    t->admitting = 0;
    if (res->status == 0) g->ticket = res->ticket;
    if (g->state == GW_GEN_ENDED) { /* the client left meanwhile */
        settle_quota(t->app, g);
        t->release(t);
        gw_gen_release(g);
        return;
    }
    gw_gen_release(g);
    if (t->admitted) t->admitted(g, res);
    if (res->status) {
        gw_oai_err e;
        gw_oai_err_set(&e, res->status, res->type, NULL, res->code, "%s", res->msg);
        gw_gen_error(g, &e);
        return;
    }
    start(g);
}

/* Admission (when keys are on: bearer's key and quota for body_len bytes), then the start. */
static void generate(gw_app *a, gw_gen *g, const char *bearer, size_t body_len) {
    if (!a->cfg.auth) {
        start(g);
        return;
    }
    tport *t = g->sink_ud;
    t->admitting = 1;
    gw_gen_hold(g);
    int max_tokens = g->q.sp.max_tokens ? (int)g->q.sp.max_tokens : -1;
    gw_auth_admit(a->cfg.auth, bearer, g->q.model, gw_auth_reserve(a->cfg.auth, body_len, max_tokens, g->n), on_admit, g);
}

/* ---- HTTP: JSON and SSE ------------------------------------------------------------------- */

/* A /v1/responses output item being streamed, with its text (message, reasoning) or arguments. */
typedef struct rsp_item {
    gw_rsp_item it;
    char  *buf;
    size_t len, cap;
    char   call_id[GW_OAI_ID_LEN];
    char  *name;
} rsp_item;

typedef struct http_gen {
    tport      t;
    gw_req    *req;         /* NULL once the response ended or the client left */
    gw_gen    *g;           /* NULL once it ended */
    uv_timer_t ping;        /* SSE: ": ping" after ping_ms without a byte */
    int        ping_init;
    uint64_t   last_write;
    size_t    *toff;        /* SSE completions logprobs: text_offset per choice */
    char       hdrs[1536];  /* the common lines (x-request-id, CORS), then x-ratelimit-* (auth) for every response */
    size_t     common_len;  /* bytes of hdrs that are the common lines */
    /* /v1/responses streams: the output items so far */
    rsp_item  *items;
    int        n_items, cap_items;
    int        open;        /* the item being written (-1: none) */
    int        seq;         /* next sequence_number */
} http_gen;

static const char *HDRS(const http_gen *h) { return h->hdrs[0] ? h->hdrs : NULL; }

static void http_free(http_gen *h) {
    if (!h) return;
    free(h->toff);
    for (int i = 0; i < h->n_items; i++) {
        free(h->items[i].buf);
        free(h->items[i].name);
    }
    free(h->items);
    free(h);
}

static void http_closed(uv_handle_t *hd) { http_free(hd->data); }

static void http_release(tport *t) {
    http_gen *h = (http_gen *)t;
    if (h->ping_init) {
        uv_timer_stop(&h->ping);
        uv_close((uv_handle_t *)&h->ping, http_closed);
    } else {
        http_free(h);
    }
}

static void sse(http_gen *h, const char *json) {
    if (!h->req || !json) return;
    size_t n;
    char *s = gw_sse_data(json, &n);
    if (s) gw_resp_stream_write(h->req, s, n);
    free(s);
    h->last_write = uv_now(gw_req_loop(h->req));
}

static void sse_json(http_gen *h, char *json) {
    sse(h, json);
    free(json);
}

static void ping_tick(uv_timer_t *tm) {
    http_gen *h = tm->data;
    if (!h->req) return;
    uint64_t now = uv_now(tm->loop);
    if (now - h->last_write + 5 < h->t.app->cfg.ping_ms) return;
    gw_resp_stream_write(h->req, GW_SSE_PING, sizeof GW_SSE_PING - 1);
    h->last_write = now;
}

static void sse_start(gw_gen *g) {
    http_gen *h = g->sink_ud;
    if (!h->req) return;
    char hd[sizeof h->hdrs + 64];
    snprintf(hd, sizeof hd, "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n%s", h->hdrs);
    gw_resp_stream_start(h->req, 200, "text/event-stream", hd);
    h->last_write = uv_now(gw_req_loop(h->req));
    if (g->q.kind == GW_OAI_CHAT)
        for (int i = 0; i < g->n; i++) sse_json(h, gw_oai_chunk_json(&g->meta, i, 1, NULL, 0, SHM_FINISH_NONE, NULL, 0, NULL));
    uint32_t ms = h->t.app->cfg.ping_ms;
    if (ms && uv_timer_init(gw_req_loop(h->req), &h->ping) == 0) {
        h->ping.data = h;
        h->ping_init = 1;
        uv_timer_start(&h->ping, ping_tick, ms, ms);
    }
}

static void sse_text(gw_gen *g, int i, const char *text, size_t len, const gw_oai_tok *toks, int n_toks) {
    http_gen *h = g->sink_ud;
    if (len == 0 && !toks) return;
    sse_json(h, gw_oai_chunk_json(&g->meta, i, 0, text, len, SHM_FINISH_NONE, toks, n_toks, &h->toff[i]));
}

static void sse_finish(gw_gen *g, int i, int finish) {
    int f = finish == SHM_FINISH_STOP && g->ch[i].n_calls ? GW_FINISH_TOOL_CALLS : finish;
    sse_json(g->sink_ud, gw_oai_chunk_json(&g->meta, i, 0, NULL, 0, f, NULL, 0, NULL));
}

static void sse_reasoning(gw_gen *g, int i, const char *text, size_t len) {
    if (len) sse_json(g->sink_ud, gw_oai_chunk_reasoning_json(&g->meta, i, text, len));
}

static void sse_call(gw_gen *g, int i, int k, const char *id, const char *name, const char *args, size_t len, int end) {
    if (end || (!id && !len)) return; /* the finish chunk says when calls are over */
    sse_json(g->sink_ud, gw_oai_chunk_call_json(&g->meta, i, k, id, name, args, len));
}

static char *build_response(void *ctx, const gw_oai_choice *ch, int n) {
    gw_gen *g = ctx;
    return gw_oai_response_json(&g->meta, ch, n, &g->usage, g->sp.logprobs);
}

/* ---- /v1/responses: the items of the reply, and their streamed events ---------------------- */

static gw_rsp_info rsp_info(const gw_gen *g) {
    return (gw_rsp_info){ &g->q, g->id, g->meta.created, g->q.model, g->q.sp.max_tokens };
}

/* "completed", or "incomplete" when the reply was cut by max_output_tokens or the context. */
static const char *rsp_status(const gw_gen *g) {
    int f = g->ch[0].finish;
    return f == SHM_FINISH_LENGTH || f == SHM_FINISH_CONTEXT ? "incomplete" : "completed";
}

static void rsp_send(http_gen *h, char *json) {
    if (h->req && json) {
        size_t n;
        char *f = gw_sse_event(json, &n);
        if (f) gw_resp_stream_write(h->req, f, n);
        free(f);
        h->last_write = uv_now(gw_req_loop(h->req));
    }
    free(json);
}

static gw_rsp_item *rsp_items(http_gen *h) {
    gw_rsp_item *it = calloc((size_t)h->n_items + 1, sizeof *it);
    for (int i = 0; it && i < h->n_items; i++) {
        it[i] = h->items[i].it;
        it[i].text = h->items[i].buf;
        it[i].len = h->items[i].len;
        it[i].name = h->items[i].name;
        it[i].call_id = h->items[i].call_id;
    }
    return it;
}

/* Closes the open item: its done events. */
static void rsp_close(http_gen *h) {
    if (h->open < 0) return;
    rsp_item *x = &h->items[h->open];
    int oi = h->open;
    x->it.done = 1;
    const char *t = x->buf ? x->buf : "";
    if (x->it.type == 0) {
        rsp_send(h, gw_rsp_event_text("response.output_text.done", h->seq++, oi, x->it.id, t, x->len));
        rsp_send(h, gw_rsp_event_text("response.content_part.done", h->seq++, oi, x->it.id, t, x->len));
    } else if (x->it.type == 2) {
        rsp_send(h, gw_rsp_event_text("response.reasoning_text.done", h->seq++, oi, x->it.id, t, x->len));
    } else {
        rsp_send(h, gw_rsp_event_text("response.function_call_arguments.done", h->seq++, oi, x->it.id, t, x->len));
    }
    gw_rsp_item it = x->it;
    it.text = t;
    it.len = x->len;
    it.name = x->name;
    it.call_id = x->call_id;
    rsp_send(h, gw_rsp_event_item("response.output_item.done", h->seq++, oi, &it));
    h->open = -1;
}

/* Opens a new item of type (0 message, 1 function_call, 2 reasoning) unless one is open. */
static rsp_item *rsp_open(http_gen *h, int type, const char *call_id, const char *name) {
    if (h->open >= 0 && h->items[h->open].it.type == type && type != 1) return &h->items[h->open];
    rsp_close(h);
    if (h->n_items == h->cap_items) {
        int cap = h->cap_items ? h->cap_items * 2 : 4;
        rsp_item *n = realloc(h->items, sizeof *n * (size_t)cap);
        if (!n) return NULL;
        h->items = n;
        h->cap_items = cap;
    }
    rsp_item *x = &h->items[h->n_items];
    memset(x, 0, sizeof *x);
    x->it.type = type;
    gw_oai_make_id(x->it.id, sizeof x->it.id, type == 0 ? "msg_" : type == 1 ? "fc_" : "rs_");
    if (call_id) snprintf(x->call_id, sizeof x->call_id, "%s", call_id);
    if (name && !(x->name = strdup(name))) return NULL;
    h->open = h->n_items++;
    gw_rsp_item it = x->it;
    it.name = x->name;
    it.call_id = x->call_id;
    rsp_send(h, gw_rsp_event_item("response.output_item.added", h->seq++, h->open, &it));
    if (type == 0) rsp_send(h, gw_rsp_event_text("response.content_part.added", h->seq++, h->open, x->it.id, "", 0));
    return x;
}

static void rsp_append(rsp_item *x, const char *s, size_t n) {
    if (x->len + n + 1 > x->cap) {
        size_t c = x->cap ? x->cap * 2 : 256;
        while (c < x->len + n + 1) c *= 2;
        char *nb = realloc(x->buf, c);
        if (!nb) return;
        x->buf = nb;
        x->cap = c;
    }
    memcpy(x->buf + x->len, s, n);
    x->len += n;
    x->buf[x->len] = 0;
}

static void rsp_start(gw_gen *g) {
    http_gen *h = g->sink_ud;
    if (!h->req) return;
    char hd[sizeof h->hdrs + 64];
    snprintf(hd, sizeof hd, "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n%s", h->hdrs);
    gw_resp_stream_start(h->req, 200, "text/event-stream", hd);
    h->last_write = uv_now(gw_req_loop(h->req));
    h->open = -1;
    gw_rsp_info ri = rsp_info(g);
    rsp_send(h, gw_rsp_event_response("response.created", h->seq++, &ri, "in_progress", NULL, 0, NULL, NULL));
    rsp_send(h, gw_rsp_event_response("response.in_progress", h->seq++, &ri, "in_progress", NULL, 0, NULL, NULL));
    uint32_t ms = h->t.app->cfg.ping_ms;
    if (ms && uv_timer_init(gw_req_loop(h->req), &h->ping) == 0) {
        h->ping.data = h;
        h->ping_init = 1;
        uv_timer_start(&h->ping, ping_tick, ms, ms);
    }
}

static void rsp_text(gw_gen *g, int i, const char *text, size_t len, const gw_oai_tok *toks, int n_toks) {
    http_gen *h = g->sink_ud;
    if (!len) return;
    rsp_item *x = rsp_open(h, 0, NULL, NULL);
    if (!x) return;
    rsp_append(x, text, len);
    rsp_send(h, gw_rsp_event_text("response.output_text.delta", h->seq++, h->open, x->it.id, text, len));
}

static void rsp_reasoning(gw_gen *g, int i, const char *text, size_t len) {
    http_gen *h = g->sink_ud;
    if (!len) return;
    rsp_item *x = rsp_open(h, 2, NULL, NULL);
    if (!x) return;
    rsp_append(x, text, len);
    rsp_send(h, gw_rsp_event_text("response.reasoning_text.delta", h->seq++, h->open, x->it.id, text, len));
}

static void rsp_call(gw_gen *g, int i, int k, const char *id, const char *name, const char *args, size_t len, int end) {
    http_gen *h = g->sink_ud;
    if (id) { rsp_open(h, 1, id, name); return; }
    if (h->open < 0 || h->items[h->open].it.type != 1) return;
    rsp_item *x = &h->items[h->open];
    if (end) { rsp_close(h); return; }
    if (!len) return;
    rsp_append(x, args, len);
    rsp_send(h, gw_rsp_event_text("response.function_call_arguments.delta", h->seq++, h->open, x->it.id, args, len));
}

/* The whole reply as items (non-streaming): reasoning, the message, then the calls. */
typedef struct rsp_ctx { const gw_gen *g; } rsp_ctx;
static char *build_rsp(void *ctx, const gw_oai_choice *ch, int n) {
    const gw_gen *g = ((rsp_ctx *)ctx)->g;
    gw_rsp_item it[2 + 64];
    int k = 0;
    if (n < 1) return NULL;
    if (ch[0].reasoning && ch[0].reasoning_len) {
        it[k] = (gw_rsp_item){ .type = 2, .text = ch[0].reasoning, .len = ch[0].reasoning_len, .done = 1 };
        gw_oai_make_id(it[k].id, sizeof it[k].id, "rs_");
        k++;
    }
    if (ch[0].len || !ch[0].n_calls) {
        it[k] = (gw_rsp_item){ .type = 0, .text = ch[0].text, .len = ch[0].len, .done = 1 };
        gw_oai_make_id(it[k].id, sizeof it[k].id, "msg_");
        k++;
    }
    for (int c = 0; c < ch[0].n_calls && k < 66; c++) {
        it[k] = (gw_rsp_item){ .type = 1, .text = ch[0].calls[c].args, .len = ch[0].calls[c].args_len, .name = ch[0].calls[c].name,
                               .call_id = ch[0].calls[c].id, .done = 1 };
        gw_oai_make_id(it[k].id, sizeof it[k].id, "fc_");
        k++;
    }
    gw_rsp_info ri = rsp_info(g);
    return gw_rsp_json(&ri, rsp_status(g), it, k, &g->usage);
}

/* The embeddings answer: each input's vector, cut to `dimensions` (then normalised again when
 * the model normalises). */
static char *build_embeddings(const gw_gen *g) {
    int dim = g->q.dimensions ? g->q.dimensions : g->env->n_embd;
    const float **v = calloc((size_t)g->n, sizeof *v);
    float *cut = dim < g->env->n_embd ? malloc(sizeof(float) * (size_t)dim * (size_t)g->n) : NULL;
    char *js = NULL;
    if (!v || (dim < g->env->n_embd && !cut)) goto out;
    for (int i = 0; i < g->n; i++) {
        v[i] = g->ch[i].embd;
        if (!cut) continue;
        float *o = cut + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) {
            o[j] = g->ch[i].embd[j];
            ss += (double)o[j] * o[j];
        }
        if (g->env->normalize && ss > 0)
            for (int j = 0; j < dim; j++) o[j] = (float)(o[j] / sqrt(ss));
        v[i] = o;
    }
    js = gw_oai_embeddings_json(g->q.model, v, g->n, dim, g->q.encoding_base64, g->usage.prompt_tokens);
out:
    free(v);
    free(cut);
    return js;
}

/* The end of a JSON or SSE generation: the whole JSON answer, the stream's tail, or the error
 * (a status before anything was sent; an SSE error event, without [DONE], after). */
static void http_end(gw_gen *g, const gw_oai_err *err) {
    http_gen *h = g->sink_ud;
    finish(g, err);
    h->g = NULL;
    int rsp = g->q.kind == GW_OAI_RESPONSES;
    if (h->req) {
        gw_req_on_abort(h->req, NULL, NULL); /* h goes below, whatever the last writes do */
        if (err && g->q.stream && g->ran) {
            if (rsp) { /* the Responses stream ends with response.failed */
                rsp_close(h);
                gw_rsp_item *it = rsp_items(h);
                gw_rsp_info ri = rsp_info(g);
                rsp_send(h, gw_rsp_event_response("response.failed", h->seq++, &ri, "failed", it, it ? h->n_items : 0, &g->usage, err));
                free(it);
            } else {
                char *js = gw_oai_error_json(err);
                sse(h, js);
                free(js);
            }
            gw_resp_stream_end(h->req);
        } else if (err) {
            char hd[sizeof h->hdrs + 32];
            int retry = (err->status == 503 || err->status == 429) && !strstr(h->hdrs, "Retry-After:");
            snprintf(hd, sizeof hd, "%s%s", retry ? "Retry-After: 1\r\n" : "", h->hdrs);
            send_err_raw(h->req, err, hd[0] ? hd : NULL);
        } else if (g->q.stream && rsp) {
            rsp_close(h);
            gw_rsp_item *it = rsp_items(h);
            gw_rsp_info ri = rsp_info(g);
            const char *st = rsp_status(g);
            rsp_send(h, gw_rsp_event_response(!strcmp(st, "completed") ? "response.completed" : "response.incomplete", h->seq++, &ri,
                                              st, it, it ? h->n_items : 0, &g->usage, NULL));
            free(it);
            gw_resp_stream_end(h->req);
        } else if (g->q.stream) {
            if (g->q.include_usage) sse_json(h, gw_oai_usage_chunk_json(&g->meta, &g->usage));
            gw_resp_stream_write(h->req, GW_SSE_DONE, sizeof GW_SSE_DONE - 1);
            gw_resp_stream_end(h->req);
        } else {
            rsp_ctx rc = { g };
            char *js = g->q.kind == GW_OAI_EMBEDDINGS ? build_embeddings(g)
                       : rsp                          ? gw_gen_build(g, 0, build_rsp, &rc)
                                                      : gw_gen_build(g, g->sp.logprobs, build_response, g);
            if (js) send_raw(h->req, 200, js, HDRS(h));
            else gw_resp_send(h->req, 500, "text/plain", "out of memory\n", 14, HDRS(h));
            free(js);
        }
        h->req = NULL;
    }
    tport_done(&h->t);
}

static const gw_gen_sink sse_sink = { sse_start, sse_text, sse_finish, http_end, sse_reasoning, sse_call };
static const gw_gen_sink rsp_sink = { rsp_start, rsp_text, NULL, http_end, rsp_reasoning, rsp_call };
static const gw_gen_sink json_sink = { NULL, NULL, NULL, http_end, NULL, NULL }; /* the generation keeps the output */

static void http_abort(gw_req *r, void *ud) {
    http_gen *h = ud;
    (void)r;
    CM_LOG_DEBUG("gw", "client left; cancelling", "id=%s", h->g ? h->g->id : "");
    h->req = NULL;
    gw_gen_cancel(h->g); /* http_end runs inside */
}

/* The API key: after "Bearer " in Authorization, else x-api-key (as llama-server and
 * Anthropic-style clients send it), or NULL. */
static const char *bearer_of(gw_req *r) {
    const char *h = gw_req_header(r, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
        const char *k = gw_req_header(r, "x-api-key");
        return k && *k ? k : NULL;
    }
    h += 7;
    while (*h == ' ') h++;
    return h;
}

/* "12.345s": the x-ratelimit-reset-* format. */
static void fmt_reset(char *out, size_t cap, int64_t ms) {
    if (ms < 0) ms = 0;
    if (ms % 1000) snprintf(out, cap, "%lld.%03llds", (long long)(ms / 1000), (long long)(ms % 1000));
    else snprintf(out, cap, "%llds", (long long)(ms / 1000));
}

/* Header lines for an admission result: x-request-id (rid NULL: the client's is among the
 * common lines already), x-ratelimit-* (limited dimensions only), and for refusals Retry-After
 * and x-should-retry. */
static void auth_headers(char *out, size_t cap, const char *rid, const gw_auth_result *res) {
    size_t n = rid ? (size_t)snprintf(out, cap, "x-request-id: %s\r\n", rid) : 0;
    out[n < cap ? n : 0] = 0;
    char reset[32];
    if (res && res->lim_req && n < cap) {
        fmt_reset(reset, sizeof reset, res->reset_req_ms);
        n += (size_t)snprintf(out + n, cap - n,
                              "x-ratelimit-limit-requests: %lld\r\nx-ratelimit-remaining-requests: %lld\r\n"
                              "x-ratelimit-reset-requests: %s\r\n",
                              (long long)res->lim_req, (long long)res->rem_req, reset);
    }
    if (res && res->lim_tok && n < cap) {
        fmt_reset(reset, sizeof reset, res->reset_tok_ms);
        n += (size_t)snprintf(out + n, cap - n,
                              "x-ratelimit-limit-tokens: %lld\r\nx-ratelimit-remaining-tokens: %lld\r\n"
                              "x-ratelimit-reset-tokens: %s\r\n",
                              (long long)res->lim_tok, (long long)res->rem_tok, reset);
    }
    if (res && res->status && n < cap) {
        n += (size_t)snprintf(out + n, cap - n, "x-should-retry: %s\r\n", res->should_retry ? "true" : "false");
        if (res->retry_after_s > 0 && n < cap)
            snprintf(out + n, cap - n, "Retry-After: %lld\r\n", (long long)res->retry_after_s);
    }
}

/* The admission's answer as header lines on every response of this request (after the common
 * lines, which carry the client's x-request-id when it sent one). */
static void http_admitted(gw_gen *g, const gw_auth_result *res) {
    http_gen *h = g->sink_ud;
    char rid[160] = "";
    const char *p = strstr(h->hdrs + h->common_len, "x-request-id: ");
    if (p) snprintf(rid, sizeof rid, "%.*s", (int)strcspn(p + 14, "\r"), p + 14);
    auth_headers(h->hdrs + h->common_len, sizeof h->hdrs - h->common_len, rid[0] ? rid : NULL, res);
}

static void start_parsed(gw_app *a, gw_req *r, int kind, gw_oai_req *q, const char *hdrs, size_t common,
                         const char *bearer, size_t blen);

/* A large body's JSON is parsed on the threadpool, so the loop keeps serving everyone else
 * meanwhile (the body moves to the job; its bytes still count toward the server's buffer cap). */
typedef struct parse_job {
    uv_work_t   w;
    struct parse_job *next; /* waiting for its turn */
    gw_app     *a;
    gw_req     *r;            /* NULL once the client left */
    gw_server  *srv;
    int         kind, rc;
    char       *body;
    size_t      len, charge;
    gw_oai_req  q;
    gw_oai_err  e;
    char        hdrs[1536];     /* the response's header lines (common, then auth) */
    size_t      common;         /* bytes of hdrs that are the common lines */
    char        bearer[GW_KEY_BUF + 8];
} parse_job;

static void parse_job_abort(gw_req *r, void *ud) {
    parse_job *j = ud;
    (void)r;
    j->r = NULL;
}

static void parse_job_work(uv_work_t *w) {
    parse_job *j = w->data;
    j->rc = gw_oai_parse(j->kind, j->body ? j->body : "", j->len, &j->q, &j->e);
    /* The parse freed its tree (up to millions of small nodes) into this thread's malloc arena,
     * where glibc keeps them unmerged until a large request merges them all at once. Have that
     * happen here: otherwise it happens on the loop, in the free() of the request's prompt ids
     * (allocated in this arena), and stalls every connection for tens of milliseconds. */
    void *volatile large = malloc(4096); /* volatile: a malloc/free pair is otherwise optimized away */
    free(large);
}

static void parse_job_done(uv_work_t *w, int status);

/* Starts the next waiting parse when none runs. */
static void parse_next(gw_app *a) {
    while (!a->parsing && a->parse_head) {
        parse_job *j = a->parse_head;
        a->parse_head = j->next;
        if (!a->parse_head) a->parse_tail = NULL;
        if (uv_queue_work(a->cfg.env->loop, &j->w, parse_job_work, parse_job_done) == 0) {
            a->parsing = 1;
            return;
        }
        j->rc = CM_EIO; /* cannot queue: answered as a cancelled parse */
        parse_job_done(&j->w, UV_ECANCELED);
    }
}

static void parse_job_done(uv_work_t *w, int status) {
    parse_job *j = w->data;
    gw_app *a = j->a;
    if (status != UV_ECANCELED || j->rc != CM_EIO) a->parsing = 0;
    parse_next(a);
    free(j->body);
    gw_server_uncharge(j->srv, j->charge);
    gw_req *r = j->r;
    if (r) gw_req_on_abort(r, NULL, NULL);
    if (!r || status || j->rc) {
        if (r && j->rc && !status) send_err_raw(r, &j->e, j->hdrs[0] ? j->hdrs : NULL);
        else if (r) gw_resp_send(r, 500, "text/plain", "request parsing was cancelled\n", 30, NULL);
        if (!j->rc && !status) gw_oai_req_free(&j->q);
        free(j);
        return;
    }
    if (gw_server_draining(j->srv)) {
        gw_oai_err e;
        char h[sizeof j->hdrs + 32];
        snprintf(h, sizeof h, "Retry-After: 1\r\n%s", j->hdrs);
        gw_oai_err_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        send_err_raw(r, &e, h);
        gw_oai_req_free(&j->q);
        free(j);
        return;
    }
    start_parsed(j->a, r, j->kind, &j->q, j->hdrs, j->common, j->bearer[0] ? j->bearer : NULL, j->len);
    free(j);
}

static void parse_later(gw_app *a, gw_req *r, int kind, const char *hdrs, size_t common, const char *bearer) {
    parse_job *j = calloc(1, sizeof *j);
    if (!j) {
        gw_resp_send(r, 500, "text/plain", "out of memory\n", 14, NULL);
        return;
    }
    j->a = a;
    j->r = r;
    j->srv = gw_req_server(r);
    j->kind = kind;
    j->w.data = j;
    snprintf(j->hdrs, sizeof j->hdrs, "%s", hdrs);
    j->common = common;
    snprintf(j->bearer, sizeof j->bearer, "%s", bearer ? bearer : "");
    j->body = gw_req_take_body(r, &j->len, &j->charge);
    gw_req_on_abort(r, parse_job_abort, j);
    if (a->parse_tail) a->parse_tail->next = j;
    else a->parse_head = j;
    a->parse_tail = j;
    parse_next(a);
}

static void handle_generate(gw_app *a, gw_req *r, int kind) {
    gw_oai_err e;
    char hdrs[1536] = "";
    size_t common = common_headers(a, r, hdrs, sizeof hdrs);
    const char *bearer = NULL;
    if (a->cfg.auth) {
        char rid[GW_OAI_ID_LEN];
        gw_oai_make_id(rid, sizeof rid, "req_");
        const char *crid = client_rid(r);
        auth_headers(hdrs + common, sizeof hdrs - common, crid ? NULL : rid, NULL);
        bearer = bearer_of(r);
        if (!bearer || !gw_key_well_formed(bearer, strlen(bearer))) {
            gw_auth_result res = {0};
            gw_oai_err_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "%s",
                           bearer ? "Incorrect API key provided. Keys look like 'ak-' followed by 48 hex digits."
                                  : "You didn't provide an API key. Send 'Authorization: Bearer ak-...' or 'x-api-key: ak-...'.");
            res.status = 401;
            auth_headers(hdrs + common, sizeof hdrs - common, crid ? NULL : rid, &res);
            send_err_raw(r, &e, hdrs);
            return;
        }
    }
    gw_server *srv = gw_req_server(r);
    if ((srv && gw_server_draining(srv)) || !backend_accepting(a)) {
        char h[sizeof hdrs + 32];
        snprintf(h, sizeof h, "Retry-After: 1\r\n%s", hdrs);
        if (srv && gw_server_draining(srv))
            gw_oai_err_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        else gw_oai_err_set(&e, 503, "server_error", NULL, "model_not_ready", "The model is loading; try again shortly.");
        send_err_raw(r, &e, h);
        return;
    }
    size_t blen;
    const char *body = gw_req_body(r, &blen);
    if (blen > PARSE_INLINE_MAX) { /* a large body is parsed off the loop */
        parse_later(a, r, kind, hdrs, common, bearer);
        return;
    }
    gw_oai_req q;
    if (gw_oai_parse(kind, body, blen, &q, &e)) {
        send_err_raw(r, &e, hdrs[0] ? hdrs : NULL);
        return;
    }
    start_parsed(a, r, kind, &q, hdrs, common, bearer, blen);
}

/* A parsed request (q taken) becomes a generation writing to r. */
static void start_parsed(gw_app *a, gw_req *r, int kind, gw_oai_req *q_in, const char *hdrs, size_t common,
                         const char *bearer, size_t blen) {
    gw_oai_err e;
    gw_oai_req q = *q_in;
    int stream = q.stream, keep = GW_GEN_KEEP_TEXT | (q.sp.logprobs ? GW_GEN_KEEP_LOGPROBS : 0);
    http_gen *h = calloc(1, sizeof *h);
    if (!h || !(h->toff = calloc((size_t)q.n, sizeof *h->toff))) {
        gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        send_err_raw(r, &e, hdrs[0] ? hdrs : NULL);
        gw_oai_req_free(&q);
        http_free(h);
        return;
    }
    h->t = (tport){ .app = a, .admitted = http_admitted, .release = http_release };
    h->req = r;
    h->open = -1;
    h->common_len = common;
    snprintf(h->hdrs, sizeof h->hdrs, "%s", hdrs);
    const gw_gen_sink *sink = !stream ? &json_sink : kind == GW_OAI_RESPONSES ? &rsp_sink : &sse_sink;
    const char *prefix = kind == GW_OAI_CHAT ? "chatcmpl-" : kind == GW_OAI_RESPONSES ? "resp_" : kind == GW_OAI_EMBEDDINGS ? "embd-" : "cmpl-";
    if (gen_new(a, &q, sink, &h->t, prefix, &h->g, &e)) {
        send_err_raw(r, &e, HDRS(h));
        http_free(h);
        return;
    }
    if (!stream) h->g->keep = keep;
    gw_req_on_abort(r, http_abort, h);
    generate(a, h->g, bearer, blen);
}

/* ---- WebSocket responses (Realtime-style events) ------------------------------------------ */

typedef struct ws_sock ws_sock;

typedef struct ws_gen {
    tport    t;
    ws_sock *s;             /* NULL once unlinked from its socket */
    gw_gen  *g;             /* NULL once it ended */
    struct ws_gen *prev, *next; /* the socket's responses */
    char     client_ev[64]; /* the response.create's event_id ("" when none) */
    int      created;       /* response.created was sent */
} ws_gen;

typedef struct ws_msg ws_msg;

struct ws_sock {
    gw_app  *app;
    gw_ws   *ws;            /* NULL once the connection is gone */
    char     bearer[GW_KEY_BUF]; /* the key of the upgrade request (auth on) */
    ws_gen  *list;
    int      n;
    ws_msg  *q_head, *q_tail; /* messages waiting behind one parsed on the threadpool, in order */
    int      parsing;       /* the head is on the threadpool (s outlives the connection until it is back) */
};

static void ws_send(ws_sock *s, char *json) {
    if (json && s && s->ws && !gw_ws_closing(s->ws)) gw_ws_send_text(s->ws, json, strlen(json));
    free(json);
}

static void ws_error(ws_sock *s, const gw_oai_err *e, const char *client_event_id) {
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    ws_send(s, gw_rt_error_json(ev, e, client_event_id));
}

static void ws_unlink(ws_gen *w) {
    ws_sock *s = w->s;
    if (!s) return;
    if (w->prev) w->prev->next = w->next;
    else s->list = w->next;
    if (w->next) w->next->prev = w->prev;
    w->prev = w->next = NULL;
    s->n--;
    w->s = NULL;
    if (s->n == 0 && s->ws) gw_ws_set_busy(s->ws, 0);
}

static void ws_release(tport *t) { free(t); }

static void ws_accepted(gw_gen *g) {
    ws_gen *w = g->sink_ud;
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    w->created = 1;
    ws_send(w->s, gw_rt_created_json(ev, &g->meta));
}

static void ws_text(gw_gen *g, int i, const char *text, size_t len, const gw_oai_tok *toks, int n_toks) {
    ws_gen *w = g->sink_ud;
    if (!len) return;
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    ws_send(w->s, gw_rt_delta_json(ev, g->id, i, text, len));
}

typedef struct done_ctx {
    const gw_gen *g;
    const char *status, *reason;
} done_ctx;

static char *build_done(void *ctx, const gw_oai_choice *ch, int n) {
    done_ctx *d = ctx;
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    return gw_rt_done_json(ev, &d->g->meta, d->status, d->reason, ch, n, &d->g->usage);
}

/* The end of a response: response.done (completed, incomplete at max_tokens, cancelled, or
 * failed after an error event); a response that never started gets the error event only. */
static void ws_end(gw_gen *g, const gw_oai_err *err) {
    ws_gen *w = g->sink_ud;
    finish(g, err);
    w->g = NULL;
    if (err && !w->created) {
        ws_error(w->s, err, w->client_ev[0] ? w->client_ev : NULL);
    } else {
        done_ctx d = { g, "completed", NULL };
        if (err) {
            ws_error(w->s, err, NULL);
            d.status = "failed";
            d.reason = err->code[0] ? err->code : "error";
        } else if (g->cancelled) {
            d.status = "cancelled";
            d.reason = "client_cancelled";
        } else {
            for (int i = 0; i < g->n; i++)
                if (g->ch[i].finish == SHM_FINISH_LENGTH || g->ch[i].finish == SHM_FINISH_CONTEXT)
                    d.status = "incomplete", d.reason = "max_output_tokens";
        }
        ws_send(w->s, gw_gen_build(g, 0, build_done, &d));
    }
    ws_unlink(w);
    tport_done(&w->t);
}

static const gw_gen_sink ws_sink = { NULL, ws_text, NULL, ws_end };

/* response.create's request out of the event: the served model when it names none, no stream
 * fields, parsed. Returns 0 (q filled, *len its JSON's bytes), CM_ENOTFOUND (no 'response'
 * object) or the parser's error, with e filled. Reads only msg and the app's fixed config: safe on
 * the threadpool. */
static int ws_create_parse(const gw_app *a, cJSON *msg, gw_oai_req *q, gw_oai_err *e, size_t *len) {
    cJSON *body = cJSON_GetObjectItemCaseSensitive(msg, "response");
    *len = 0;
    if (!cJSON_IsObject(body)) {
        gw_oai_err_set(e, 400, "invalid_request_error", "response", "missing_required_parameter",
                       "Missing required parameter: 'response' (the chat completion request).");
        return CM_ENOTFOUND;
    }
    /* the session's model is the served one when the response does not name it */
    if (!cJSON_GetObjectItemCaseSensitive(body, "model")) cJSON_AddStringToObject(body, "model", a->cfg.model_id);
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream");
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream_options");
    char *text = cJSON_PrintUnformatted(body);
    *len = text ? strlen(text) : 0;
    int err = text ? gw_oai_parse(GW_OAI_CHAT, text, *len, q, e) : CM_ENOMEM;
    free(text);
    if (err == CM_ENOMEM) gw_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return err;
}

/* response.create with its request parsed (rc, q, e from ws_create_parse; q is taken). */
static void ws_create_parsed(ws_sock *s, int rc, gw_oai_req *q_in, gw_oai_err *e_in, size_t len, const char *client_ev) {
    gw_app *a = s->app;
    gw_oai_err e = *e_in;
    gw_oai_req q = *q_in;
    if (rc == CM_ENOTFOUND) {
        ws_error(s, &e, client_ev);
        return;
    }
    int refused = 1;
    if (s->n >= a->cfg.ws_max_responses) {
        gw_oai_err_set(&e, 429, "invalid_request_error", NULL, "too_many_responses",
                       "At most %d responses may be in progress on one connection.", a->cfg.ws_max_responses);
    } else if (s->ws && gw_server_draining(gw_ws_server(s->ws))) {
        gw_oai_err_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
    } else if (!backend_accepting(a)) {
        gw_oai_err_set(&e, 503, "server_error", NULL, "model_not_ready", "The model is loading; try again shortly.");
    } else {
        refused = 0;
    }
    if (refused) {
        if (rc == 0) gw_oai_req_free(&q);
        ws_error(s, &e, client_ev);
        return;
    }
    ws_gen *w = NULL;
    int err = rc;
    if (!err && !(w = calloc(1, sizeof *w))) {
        gw_oai_req_free(&q);
        err = CM_ENOMEM;
    }
    if (err == CM_ENOMEM) gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    if (!err) {
        w->t = (tport){ .app = a, .accepted = ws_accepted, .release = ws_release };
        snprintf(w->client_ev, sizeof w->client_ev, "%s", client_ev ? client_ev : "");
        err = gen_new(a, &q, &ws_sink, &w->t, "resp_", &w->g, &e);
    }
    if (err) {
        size_t pl = strlen(e.param);
        if (pl && pl + 10 <= sizeof e.param) { /* name the field inside the event */
            memmove(e.param + 9, e.param, pl + 1);
            memcpy(e.param, "response.", 9);
        }
        ws_error(s, &e, client_ev);
        free(w);
        return;
    }
    w->g->keep = GW_GEN_KEEP_TEXT;
    w->s = s;
    w->next = s->list;
    if (s->list) s->list->prev = w;
    s->list = w;
    if (s->n++ == 0 && s->ws) gw_ws_set_busy(s->ws, 1);
    generate(a, w->g, s->bearer, len);
}

static void ws_create(ws_sock *s, cJSON *msg, const char *client_ev) {
    gw_oai_req q;
    gw_oai_err e;
    size_t len;
    int rc = ws_create_parse(s->app, msg, &q, &e, &len);
    ws_create_parsed(s, rc, &q, &e, len, client_ev);
}

static void ws_cancel(ws_sock *s, cJSON *msg, const char *client_ev) {
    cJSON *rid = cJSON_GetObjectItemCaseSensitive(msg, "response_id");
    gw_oai_err e;
    if (rid && !cJSON_IsNull(rid) && !cJSON_IsString(rid)) {
        gw_oai_err_set(&e, 400, "invalid_request_error", "response_id", "invalid_type", "'response_id' must be a string.");
        ws_error(s, &e, client_ev);
        return;
    }
    int found = 0;
    ws_gen *next;
    for (ws_gen *w = s->list; w; w = next) {
        next = w->next;
        if (cJSON_IsString(rid) && strcmp(w->g->id, rid->valuestring) != 0) continue;
        gw_gen_cancel(w->g); /* ws_end runs inside: response.done (cancelled), and w leaves the list */
        found++;
    }
    if (!found) {
        gw_oai_err_set(&e, 400, "invalid_request_error", "response_id", "response_not_found",
                       cJSON_IsString(rid) ? "No response in progress with id '%.64s'." : "No response in progress.%.0s",
                       cJSON_IsString(rid) ? rid->valuestring : "");
        ws_error(s, &e, client_ev);
    }
}

/* A message parsed on the threadpool (with its response.create request when it is one). */
struct ws_msg {
    uv_work_t   w;
    ws_msg     *next;
    ws_sock    *s;
    char       *text;       /* the message (a copy), until parsed */
    size_t      len;
    cJSON      *msg;        /* the event */
    int         created;    /* a response.create whose request was parsed too: */
    int         rc;
    gw_oai_req  q;
    gw_oai_err  e;
    size_t      body_len;
};

/* One event, in order; pre: what the threadpool made of it (NULL for a small one). msg is freed. */
static void ws_handle(ws_sock *s, cJSON *msg, ws_msg *pre) {
    gw_oai_err e;
    cJSON *type = msg ? cJSON_GetObjectItemCaseSensitive(msg, "type") : NULL;
    cJSON *evid = msg ? cJSON_GetObjectItemCaseSensitive(msg, "event_id") : NULL;
    const char *client_ev = cJSON_IsString(evid) ? evid->valuestring : NULL;
    if (!cJSON_IsObject(msg) || !cJSON_IsString(type)) {
        gw_oai_err_set(&e, 400, "invalid_request_error", msg ? "type" : NULL, msg ? "missing_required_parameter" : "invalid_json",
                       msg ? "Events need a string 'type'." : "The event is not valid JSON.");
        ws_error(s, &e, client_ev);
    } else if (strcmp(type->valuestring, "response.create") == 0) {
        if (pre && pre->created) ws_create_parsed(s, pre->rc, &pre->q, &pre->e, pre->body_len, client_ev);
        else ws_create(s, msg, client_ev);
    } else if (strcmp(type->valuestring, "response.cancel") == 0) {
        ws_cancel(s, msg, client_ev);
    } else {
        gw_oai_err_set(&e, 400, "invalid_request_error", "type", "unknown_event_type",
                       "Unknown event type '%.64s'; supported: response.create, response.cancel.", type->valuestring);
        ws_error(s, &e, client_ev);
    }
    cJSON_Delete(msg);
}

static void ws_msg_free(ws_msg *m) {
    if (m->created && m->rc == 0) gw_oai_req_free(&m->q);
    cJSON_Delete(m->msg);
    free(m->text);
    free(m);
}

static void ws_msg_work(uv_work_t *w) {
    ws_msg *m = w->data;
    m->msg = cJSON_ParseWithLengthOpts(m->text, m->len, NULL, 0);
    free(m->text);
    m->text = NULL;
    cJSON *type = m->msg ? cJSON_GetObjectItemCaseSensitive(m->msg, "type") : NULL;
    if (cJSON_IsObject(m->msg) && cJSON_IsString(type) && strcmp(type->valuestring, "response.create") == 0) {
        m->created = 1;
        m->rc = ws_create_parse(m->s->app, m->msg, &m->q, &m->e, &m->body_len);
        /* the request is in q: the event's own tree can go here, with its nodes merged in this
         * thread's arena (see parse_job_work) */
        cJSON *keep = cJSON_CreateObject();
        cJSON *evid = cJSON_DetachItemFromObjectCaseSensitive(m->msg, "event_id");
        cJSON_AddItemToObject(keep, "type", cJSON_CreateString("response.create"));
        if (evid) cJSON_AddItemToObject(keep, "event_id", evid);
        cJSON_Delete(m->msg);
        m->msg = keep;
    }
    void *volatile large = malloc(4096); /* as in parse_job_work */
    free(large);
}

static void ws_pump(ws_sock *s);

static void ws_msg_done(uv_work_t *w, int status) {
    ws_msg *m = w->data;
    ws_sock *s = m->s;
    s->parsing = 0;
    s->q_head = m->next;
    if (!s->q_head) s->q_tail = NULL;
    if (s->ws && !status) {
        cJSON *msg = m->msg;
        m->msg = NULL;
        ws_handle(s, msg, m);
        m->created = 0; /* q went to the generation (or was freed) */
    }
    ws_msg_free(m);
    if (!s->ws) { /* the connection went meanwhile: the rest waits for nothing */
        while (s->q_head) {
            ws_msg *n = s->q_head;
            s->q_head = n->next;
            ws_msg_free(n);
        }
        free(s);
        return;
    }
    ws_pump(s);
}

/* Handles the queued messages in order: small ones at once, a large one on the threadpool
 * (the rest wait for it). */
static void ws_pump(ws_sock *s) {
    while (s->q_head && !s->parsing) {
        ws_msg *m = s->q_head;
        if (m->len > PARSE_INLINE_MAX &&
            uv_queue_work(s->app->cfg.env->loop, &m->w, ws_msg_work, ws_msg_done) == 0) {
            s->parsing = 1;
            return;
        }
        s->q_head = m->next;
        if (!s->q_head) s->q_tail = NULL;
        cJSON *msg = cJSON_ParseWithLengthOpts(m->text, m->len, NULL, 0);
        ws_msg_free(m);
        ws_handle(s, msg, NULL);
    }
}

static void ws_on_message(gw_ws *ws, void *ud, const char *text, size_t len) {
    ws_sock *s = ud;
    if (!s->q_head && len <= PARSE_INLINE_MAX) {
        ws_handle(s, cJSON_ParseWithLengthOpts(text, len, NULL, 0), NULL);
        return;
    }
    /* a large message, or any behind one: in order, through the queue */
    ws_msg *m = calloc(1, sizeof *m);
    char *copy = malloc(len ? len : 1);
    if (!m || !copy) {
        free(m);
        free(copy);
        gw_oai_err e;
        gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        ws_error(s, &e, NULL);
        return;
    }
    memcpy(copy, text, len);
    m->s = s;
    m->text = copy;
    m->len = len;
    m->w.data = m;
    if (s->q_tail) s->q_tail->next = m;
    else s->q_head = m;
    s->q_tail = m;
    ws_pump(s);
}

static void ws_on_close(gw_ws *ws, void *ud) {
    ws_sock *s = ud;
    s->ws = NULL;
    while (s->list) gw_gen_cancel(s->list->g); /* ws_end sends nothing now and unlinks each */
    if (s->parsing) return; /* ws_msg_done frees s */
    while (s->q_head) {
        ws_msg *m = s->q_head;
        s->q_head = m->next;
        ws_msg_free(m);
    }
    free(s);
}

static const gw_ws_ops ws_ops = { ws_on_message, ws_on_close };

static void handle_ws(gw_app *a, gw_req *r) {
    ws_sock *s = calloc(1, sizeof *s);
    if (!s) {
        gw_resp_send(r, 500, "text/plain", "out of memory\n", 14, NULL);
        return;
    }
    s->app = a;
    if (a->cfg.auth) { /* checked against the store from the headers (gw_app_on_headers), and per response.create */
        const char *b = bearer_of(r);
        if (!b || !gw_key_well_formed(b, strlen(b))) {
            gw_oai_err e;
            gw_oai_err_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "%s",
                           b ? "Incorrect API key provided." : "You didn't provide an API key. Send 'Authorization: Bearer ak-...'.");
            send_err(a, r, &e, "x-should-retry: false\r\n");
            free(s);
            return;
        }
        snprintf(s->bearer, sizeof s->bearer, "%s", b);
    }
    if (gw_ws_upgrade(r, a->cfg.ws_max_message, &ws_ops, s, &s->ws)) free(s); /* answered already */
    else gw_ws_set_liveness(s->ws, a->cfg.ws_ping_ms, a->cfg.ws_idle_ms, a->cfg.ws_message_ms);
}

/* ---- before the body: the key, and whether the server can take the request ------------------ */

/* A refused key, as handle_generate answers it (401 + x-request-id, the client's own when it
 * sent one, x-should-retry; the common lines come with send_err). */
static void send_key_refusal(gw_app *a, gw_req *r, const gw_auth_result *res) {
    gw_oai_err e;
    char rid[GW_OAI_ID_LEN], hdrs[256];
    gw_oai_make_id(rid, sizeof rid, "req_");
    auth_headers(hdrs, sizeof hdrs, client_rid(r) ? NULL : rid, res);
    gw_oai_err_set(&e, res->status, res->type[0] ? res->type : "invalid_request_error", NULL,
                   res->code[0] ? res->code : "invalid_api_key", "%s", res->msg);
    send_err(a, r, &e, hdrs);
}

/* 1 when the route generates (and so needs the key): every POST under /v1/ and the WebSocket. */
static int generate_route(gw_req *r) {
    const char *p = gw_req_path(r);
    int m = gw_req_method(r);
    return (m == HTTP_POST && strncmp(p, "/v1/", 4) == 0) || (m == HTTP_GET && strcmp(p, "/v1/ws") == 0);
}

/* After the key: a POST the server cannot take now is refused before its body comes. Returns
 * GW_HDR_ANSWERED or GW_HDR_GO. */
static int take_now(gw_app *a, gw_req *r) {
    gw_server *srv = gw_req_server(r);
    if (gw_req_method(r) != HTTP_POST || !srv || (!gw_server_draining(srv) && backend_accepting(a))) return GW_HDR_GO;
    gw_oai_err e;
    if (gw_server_draining(srv))
        gw_oai_err_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
    else gw_oai_err_set(&e, 503, "server_error", NULL, "model_not_ready", "The model is loading; try again shortly.");
    send_err(a, r, &e, "Retry-After: 1\r\n");
    return GW_HDR_ANSWERED;
}

typedef struct key_check {
    gw_app *a;
    gw_req *r;          /* NULL once the client left */
    int     in_call;    /* gw_auth_identify has not returned yet */
    int     answered;   /* it answered inside the call */
    gw_auth_result res;
} key_check;

static void key_check_abort(gw_req *r, void *ud) {
    key_check *k = ud;
    (void)r;
    k->r = NULL;
}

static void key_checked(void *ud, const gw_auth_result *res) {
    key_check *k = ud;
    if (k->in_call) { /* the store knew at once: gw_app_on_headers goes on */
        k->answered = 1;
        k->res = *res;
        return;
    }
    gw_req *r = k->r;
    if (r) {
        gw_req_on_abort(r, NULL, NULL);
        if (res->status) send_key_refusal(k->a, r, res);
        else if (take_now(k->a, r) == GW_HDR_GO) gw_req_resume(r);
    }
    free(k);
}

int gw_app_on_headers(gw_req *r, void *ud) {
    gw_app *a = ud;
    if (!generate_route(r)) return GW_HDR_GO;
    if (a->cfg.auth) {
        const char *b = bearer_of(r);
        if (!b || !gw_key_well_formed(b, strlen(b))) {
            gw_auth_result res = { .status = 401 };
            snprintf(res.msg, sizeof res.msg, "%s",
                     b ? "Incorrect API key provided. Keys look like 'ak-' followed by 48 hex digits."
                       : "You didn't provide an API key. Send 'Authorization: Bearer ak-...' or 'x-api-key: ak-...'.");
            send_key_refusal(a, r, &res);
            return GW_HDR_ANSWERED;
        }
        key_check *k = calloc(1, sizeof *k);
        if (!k) {
            gw_resp_send(r, 500, "text/plain", "out of memory\n", 14, NULL);
            return GW_HDR_ANSWERED;
        }
        k->a = a;
        k->r = r;
        k->in_call = 1;
        gw_auth_identify(a->cfg.auth, b, key_checked, k);
        k->in_call = 0;
        if (!k->answered) { /* Redis is asked: the body waits */
            gw_req_on_abort(r, key_check_abort, k);
            return GW_HDR_HOLD;
        }
        gw_auth_result res = k->res;
        free(k);
        if (res.status) {
            send_key_refusal(a, r, &res);
            return GW_HDR_ANSWERED;
        }
    }
    return take_now(a, r);
}

void gw_app_drain_deadline(void *ud) {
    gw_app *a = ud;
    gw_oai_err e;
    gw_oai_err_set(&e, 503, "server_error", NULL, "server_shutting_down",
                   "The server is shutting down and could not finish this response in time; retry the request.");
    int n = 0;
    while (a->live) {
        tport *t = a->live;
        if (t->gen->state == GW_GEN_ENDED) { /* cannot be: ended generations leave the list */
            live_unlink(a, t);
            continue;
        }
        gw_gen_error(t->gen, &e); /* the sink's end writes the error and unlinks t */
        n++;
    }
    if (n) CM_LOG_WARN("gw", "drain deadline: responses ended with server_shutting_down", "count=%d", n);
}

/* ---- routing ------------------------------------------------------------------------------ */

static void handle_health(gw_app *a, gw_req *r, int ready_probe) {
    gw_server *s = gw_req_server(r);
    (void)ready_probe; /* /health and /ready alike: 503 while draining, so balancers take the server out */
    if (s && gw_server_draining(s)) send_json(a, r, 503, "{\"status\":\"draining\"}", NULL);
    else if (!backend_ready(a)) send_json(a, r, 503, "{\"status\":\"loading\"}", NULL);
    else send_json(a, r, 200, "{\"status\":\"ok\"}", NULL);
}

static cJSON *model_obj(gw_app *a, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", a->cfg.owned_by ? a->cfg.owned_by : "arka");
    cJSON_AddNumberToObject(m, "max_model_len", a->cfg.env->n_ctx);
    return m;
}

static void handle_models(gw_app *a, gw_req *r, const char *one) {
    const char *id = a->cfg.model_id;
    cJSON *root;
    if (one) {
        if (!id || strcmp(one, id) != 0) {
            gw_oai_err e;
            gw_oai_err_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                           "The model `%.200s` does not exist or you do not have access to it.", one);
            send_err(a, r, &e, NULL);
            return;
        }
        root = model_obj(a, id);
    } else {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(root, "data");
        if (id && data) cJSON_AddItemToArray(data, model_obj(a, id));
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (js) send_json(a, r, 200, js, NULL);
    else reply(a, r, 500, "text/plain", "out of memory\n", 14, NULL);
    free(js);
}

/* ---- /tokenize and /detokenize (vLLM's) ------------------------------------------------------ */

typedef struct tok_job {
    uv_work_t work;
    gw_app   *app;
    gw_req   *req;          /* NULL once the client left */
    int       detok;
    cJSON    *body;
    int       status;       /* the answer */
    char     *json;
    gw_oai_err err;
    char      hdrs[1536];
} tok_job;

static void tok_abort(gw_req *r, void *ud) {
    (void)r;
    ((tok_job *)ud)->req = NULL;
}

static int tok_bad(tok_job *j, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int tok_bad(tok_job *j, const char *param, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gw_oai_err_set(&j->err, 400, "invalid_request_error", param, NULL, "%s", msg);
    j->status = 400;
    return -1;
}

/* Threadpool: {prompt | messages (+ add_generation_prompt, tools, chat_template_kwargs),
 * add_special_tokens, return_token_strs} -> {count, max_model_len, tokens, token_strs}; or
 * {tokens} -> {prompt}. */
static void tok_work(uv_work_t *w) {
    tok_job *j = w->data;
    const gw_gen_env *env = j->app->cfg.env;
    const cJSON *o = j->body, *k;
    static const char *const tk[] = { "model", "prompt", "messages", "add_generation_prompt", "add_special_tokens",
                                      "return_token_strs", "tools", "chat_template_kwargs", "continue_final_message", NULL };
    static const char *const dk[] = { "model", "tokens", NULL };
    cJSON_ArrayForEach(k, o) {
        int ok = 0;
        for (const char *const *l = j->detok ? dk : tk; *l && !ok; l++) ok = !strcmp(*l, k->string);
        if (!ok) { tok_bad(j, k->string, "Unrecognized request argument supplied: %.100s", k->string); return; }
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, j->app->cfg.model_id))) {
        gw_oai_err_set(&j->err, 404, "invalid_request_error", "model", "model_not_found", "The model does not exist.");
        j->status = 404;
        return;
    }
    cJSON *out = cJSON_CreateObject();
    if (j->detok) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens"), *x;
        if (!cJSON_IsArray(t)) { cJSON_Delete(out); tok_bad(j, "tokens", "'tokens' must be an array of token ids"); return; }
        tok_detok d;
        tok_detok_init(&d, env->vocab, 0);
        size_t cap = tok_detok_out_cap(&d), len = 0, tc = 1024;
        char *piece = malloc(cap), *txt = malloc(tc);
        int nv = tok_n_vocab(env->vocab), bad = -1, i = 0;
        cJSON_ArrayForEach(x, t) {
            size_t n = 0;
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= nv || x->valuedouble != (int)x->valuedouble) { bad = i; break; }
            tok_detok_push(&d, (int32_t)x->valuedouble, piece, cap, &n);
            if (len + n + 8 > tc) txt = realloc(txt, tc = (len + n + 8) * 2);
            memcpy(txt + len, piece, n);
            len += n;
            i++;
        }
        size_t n = 0;
        tok_detok_flush(&d, piece, cap, &n);
        if (len + n + 1 > tc) txt = realloc(txt, tc = len + n + 1);
        memcpy(txt + len, piece, n);
        len += n;
        txt[len] = 0;
        if (bad >= 0) tok_bad(j, "tokens", "tokens[%d] is not a token id of this model (0..%d)", bad, nv - 1);
        else cJSON_AddStringToObject(out, "prompt", txt);
        free(piece);
        free(txt);
    } else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
        const cJSON *ast = cJSON_GetObjectItemCaseSensitive(o, "add_special_tokens"), *strs = cJSON_GetObjectItemCaseSensitive(o, "return_token_strs");
        char *text = NULL;
        int chat = msgs != NULL;
        if (!!prompt == !!msgs) { cJSON_Delete(out); tok_bad(j, "prompt", "give either 'prompt' or 'messages'"); return; }
        if (prompt && !cJSON_IsString(prompt)) { cJSON_Delete(out); tok_bad(j, "prompt", "'prompt' must be a string"); return; }
        if (ast && !cJSON_IsBool(ast)) { cJSON_Delete(out); tok_bad(j, "add_special_tokens", "expected a boolean"); return; }
        if (strs && !cJSON_IsBool(strs)) { cJSON_Delete(out); tok_bad(j, "return_token_strs", "expected a boolean"); return; }
        if (chat) { /* the chat request's own parser checks the messages (and tools, kwargs) */
            cJSON *req = cJSON_Duplicate(o, 1);
            cJSON_DeleteItemFromObject(req, "add_generation_prompt");
            cJSON_DeleteItemFromObject(req, "add_special_tokens");
            cJSON_DeleteItemFromObject(req, "return_token_strs");
            cJSON_DeleteItemFromObject(req, "continue_final_message");
            if (!cJSON_GetObjectItem(req, "model")) cJSON_AddStringToObject(req, "model", j->app->cfg.model_id);
            char *rt = cJSON_PrintUnformatted(req);
            cJSON_Delete(req);
            gw_oai_req q;
            if (!rt || gw_oai_parse(GW_OAI_CHAT, rt, strlen(rt), &q, &j->err)) {
                free(rt);
                cJSON_Delete(out);
                if (!rt) gw_oai_err_set(&j->err, 500, "server_error", NULL, NULL, "out of memory");
                j->status = j->err.status;
                return;
            }
            free(rt);
            const cJSON *agp = cJSON_GetObjectItemCaseSensitive(o, "add_generation_prompt");
            tok_chat_msg *m = calloc((size_t)q.n_msgs, sizeof *m);
            for (int i = 0; m && i < q.n_msgs; i++)
                m[i] = (tok_chat_msg){ q.msgs[i].role, q.msgs[i].content, q.msgs[i].name, q.msgs[i].tool_call_id, q.msgs[i].tool_calls,
                                       q.msgs[i].reasoning };
            size_t len;
            char err[400] = "";
            int rc = m ? tok_chat_render_ex(env->chat, m, q.n_msgs, q.tools_json, NULL, q.template_kwargs_json,
                                            !agp || cJSON_IsTrue(agp), &text, &len, err, sizeof err)
                       : CM_ENOMEM;
            free(m);
            gw_oai_req_free(&q);
            if (rc) {
                cJSON_Delete(out);
                tok_bad(j, "messages", "chat template: %s", err[0] ? err : cm_err_str(rc));
                return;
            }
        }
        const char *t = chat ? text : prompt->valuestring;
        size_t len = strlen(t);
        int add = ast ? cJSON_IsTrue(ast) : !chat, cap = (int)(len < (size_t)1 << 28 ? len : (size_t)1 << 28) + 4, n = 0;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
        int rc = ids ? tok_encode(env->vocab, t, len, add, chat, ids, cap, &n) : CM_ENOMEM;
        free(text);
        if (rc) {
            free(ids);
            cJSON_Delete(out);
            tok_bad(j, chat ? "messages" : "prompt", "cannot tokenize: %s", cm_err_str(rc));
            return;
        }
        cJSON_AddNumberToObject(out, "count", n);
        cJSON_AddNumberToObject(out, "max_model_len", env->n_ctx);
        cJSON *a = cJSON_AddArrayToObject(out, "tokens");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        if (strs && cJSON_IsTrue(strs)) {
            cJSON *ts = cJSON_AddArrayToObject(out, "token_strs");
            for (int i = 0; i < n; i++) {
                const char *tt = tok_text(env->vocab, ids[i]);
                cJSON_AddItemToArray(ts, cJSON_CreateString(tt ? tt : ""));
            }
        } else cJSON_AddNullToObject(out, "token_strs");
        free(ids);
    }
    if (!j->status) {
        j->json = cJSON_PrintUnformatted(out);
        j->status = 200;
    }
    cJSON_Delete(out);
}

static void tok_done(uv_work_t *w, int status) {
    tok_job *j = w->data;
    if (j->req) {
        gw_req_on_abort(j->req, NULL, NULL);
        if (status || (j->status == 200 && !j->json)) gw_resp_send(j->req, 500, "text/plain", "out of memory\n", 14, j->hdrs[0] ? j->hdrs : NULL);
        else if (j->status == 200) send_raw(j->req, 200, j->json, j->hdrs[0] ? j->hdrs : NULL);
        else send_err_raw(j->req, &j->err, j->hdrs[0] ? j->hdrs : NULL);
    }
    cJSON_Delete(j->body);
    free(j->json);
    free(j);
}

static void handle_tokenize(gw_app *a, gw_req *r, int detok) {
    gw_oai_err e;
    size_t blen;
    const char *body = gw_req_body(r, &blen);
    cJSON *o = cJSON_ParseWithLengthOpts(body, blen, NULL, 0);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        gw_oai_err_set(&e, 400, "invalid_request_error", NULL, NULL, "The body must be a JSON object.");
        send_err(a, r, &e, NULL);
        return;
    }
    tok_job *j = calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(o);
        reply(a, r, 500, "text/plain", "out of memory\n", 14, NULL);
        return;
    }
    j->app = a;
    j->req = r;
    j->detok = detok;
    j->body = o;
    common_headers(a, r, j->hdrs, sizeof j->hdrs);
    j->work.data = j;
    gw_req_on_abort(r, tok_abort, j);
    if (uv_queue_work(gw_req_loop(r), &j->work, tok_work, tok_done)) {
        gw_req_on_abort(r, NULL, NULL);
        cJSON_Delete(o);
        free(j);
        reply(a, r, 500, "text/plain", "cannot queue the request\n", 25, NULL);
    }
}

/* Percent-decodes src into dst (cap bytes); returns -1 on a bad escape or overflow. */
static int pct_decode(const char *src, char *dst, size_t cap) {
    size_t o = 0;
    for (const char *p = src; *p; p++) {
        int c = (unsigned char)*p;
        if (c == '%') {
            int hi, lo;
            if (!p[1] || !p[2]) return -1;
            hi = p[1] <= '9' ? p[1] - '0' : (p[1] | 0x20) - 'a' + 10;
            lo = p[2] <= '9' ? p[2] - '0' : (p[2] | 0x20) - 'a' + 10;
            if (hi < 0 || hi > 15 || lo < 0 || lo > 15) return -1;
            c = hi * 16 + lo;
            p += 2;
        }
        if (c == 0 || o + 1 >= cap) return -1;
        dst[o++] = (char)c;
    }
    dst[o] = 0;
    return 0;
}

/* The route pattern of a path, for metrics labels (never the raw path: ids stay out). */
static const char *route_of(const char *path) {
    static const char *const exact[] = { "/health", "/ready", "/metrics", "/v1/models", "/v1/completions",
                                         "/v1/chat/completions", "/v1/ws", "/v1/responses", "/v1/embeddings", "/tokenize",
                                         "/detokenize" };
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (strcmp(path, exact[i]) == 0) return exact[i];
    if (strncmp(path, "/v1/models/", 11) == 0) return "/v1/models/{id}";
    if (strncmp(path, "/v1/responses/", 14) == 0) return "/v1/responses/{id}";
    return "other";
}

void gw_app_on_response(void *ud, const char *path, int status) {
    gw_app *a = ud;
    gw_met_http(a->cfg.met, route_of(path ? path : ""), status);
}

/* CORS preflight: the origin, the methods and the headers a browser may send. */
static void handle_preflight(gw_app *a, gw_req *r) {
    const char *rh = gw_req_header(r, "Access-Control-Request-Headers");
    char hd[1024];
    int ok = 1;
    for (const char *p = rh; p && *p && ok; p++) ok = *p >= 0x20 && *p < 0x7f;
    snprintf(hd, sizeof hd,
             "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nAccess-Control-Allow-Headers: %s\r\n"
             "Access-Control-Max-Age: 86400\r\n",
             rh && ok && strlen(rh) < 512 ? rh : "Authorization, Content-Type, x-api-key, x-request-id");
    reply(a, r, 204, NULL, "", 0, hd);
}

void gw_app_handle(gw_req *r, void *ud) {
    gw_app *a = ud;
    const char *path = gw_req_path(r);
    int m = gw_req_method(r);
    int get = m == HTTP_GET || m == HTTP_HEAD, post = m == HTTP_POST;
    const char *allow = NULL;
    if (m == HTTP_OPTIONS && a->cfg.cors_origin && *a->cfg.cors_origin) {
        handle_preflight(a, r);
        return;
    }
    if (strcmp(path, "/health") == 0 || strcmp(path, "/ready") == 0) {
        if (get) {
            handle_health(a, r, path[1] == 'r');
            return;
        }
        allow = "Allow: GET, HEAD\r\n";
    } else if (strcmp(path, "/v1/models") == 0) {
        if (get) {
            handle_models(a, r, NULL);
            return;
        }
        allow = "Allow: GET, HEAD\r\n";
    } else if (strncmp(path, "/v1/models/", 11) == 0 && path[11]) {
        char id[512];
        if (get && pct_decode(path + 11, id, sizeof id) == 0) {
            handle_models(a, r, id);
            return;
        }
        if (get) {
            handle_models(a, r, path + 11);
            return;
        }
        allow = "Allow: GET, HEAD\r\n";
    } else if (strcmp(path, "/v1/completions") == 0) {
        if (post) {
            handle_generate(a, r, GW_OAI_COMPLETION);
            return;
        }
        allow = "Allow: POST\r\n";
    } else if (strcmp(path, "/v1/chat/completions") == 0) {
        if (post) {
            handle_generate(a, r, GW_OAI_CHAT);
            return;
        }
        allow = "Allow: POST\r\n";
    } else if (strcmp(path, "/v1/responses") == 0) {
        if (post) {
            handle_generate(a, r, GW_OAI_RESPONSES);
            return;
        }
        allow = "Allow: POST\r\n";
    } else if (strncmp(path, "/v1/responses/", 14) == 0 && path[14]) {
        gw_oai_err e;
        gw_oai_err_set(&e, 404, "invalid_request_error", NULL, "response_not_found",
                       "Responses are not stored by this server (every response is as with store: false), so '%.100s' "
                       "cannot be retrieved, cancelled or deleted.", path + 14);
        send_err(a, r, &e, NULL);
        return;
    } else if (strcmp(path, "/v1/embeddings") == 0) {
        if (post) {
            handle_generate(a, r, GW_OAI_EMBEDDINGS);
            return;
        }
        allow = "Allow: POST\r\n";
    } else if (strcmp(path, "/tokenize") == 0 || strcmp(path, "/detokenize") == 0) {
        if (post) {
            handle_tokenize(a, r, path[1] == 'd');
            return;
        }
        allow = "Allow: POST\r\n";
    } else if (strcmp(path, "/metrics") == 0 && a->cfg.metrics) {
        if (get) {
            size_t len = 0;
            char *txt = a->cfg.metrics(a->cfg.metrics_ud, &len);
            if (txt) reply(a, r, 200, "text/plain; version=0.0.4; charset=utf-8", txt, len, NULL);
            else reply(a, r, 500, "text/plain", "out of memory\n", 14, NULL);
            free(txt);
            return;
        }
        allow = "Allow: GET, HEAD\r\n";
    } else if (strcmp(path, "/v1/ws") == 0) {
        if (m == HTTP_GET) {
            handle_ws(a, r);
            return;
        }
        allow = "Allow: GET\r\n";
    }
    gw_oai_err e;
    if (allow) {
        gw_oai_err_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "Method %s is not allowed on %.200s.",
                       gw_req_method_name(r), path);
        send_err(a, r, &e, allow);
    } else {
        gw_oai_err_set(&e, 404, "invalid_request_error", NULL, "unknown_url", "Invalid URL (%s %.200s)", gw_req_method_name(r),
                       path);
        send_err(a, r, &e, NULL);
    }
}
