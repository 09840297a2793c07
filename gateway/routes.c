/* routes: the OpenAI-compatible API: routing, and generation requests over HTTP (JSON and SSE)
 * and over WebSocket (Realtime-style events). The three share one path — parse, admission
 * (API keys and quotas), a gw_gen — and differ only in their sink: how the output is written.
 * Every sink's end goes through finish(), which settles the quota claim with the generation's
 * final usage and records its metrics. */
#include "gateway/routes.h"

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

struct gw_app {
    gw_app_cfg cfg;
    int active;
};

void gw_app_cfg_default(gw_app_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->fingerprint = "fp_arka";
    cfg->owned_by = "arka";
    cfg->ping_ms = 15000;
    cfg->ws_max_responses = 16;
    cfg->ws_max_message = 8u << 20;
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

/* ---- small helpers ------------------------------------------------------------------------ */

static void send_json(gw_req *r, int status, const char *json, const char *extra) {
    gw_resp_send(r, status, "application/json", json, strlen(json), extra);
}

static void send_err(gw_req *r, const gw_oai_err *e, const char *extra) {
    char *js = gw_oai_error_json(e);
    if (js) send_json(r, e->status, js, extra);
    else gw_resp_send(r, 500, "text/plain", "out of memory\n", 14, NULL);
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
    return 0;
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

typedef struct http_gen {
    tport      t;
    gw_req    *req;         /* NULL once the response ended or the client left */
    gw_gen    *g;           /* NULL once it ended */
    uv_timer_t ping;        /* SSE: ": ping" after ping_ms without a byte */
    int        ping_init;
    uint64_t   last_write;
    size_t    *toff;        /* SSE completions logprobs: text_offset per choice */
    char       hdrs[640];   /* x-request-id and x-ratelimit-* lines for every response ("" without auth) */
} http_gen;

static const char *HDRS(const http_gen *h) { return h->hdrs[0] ? h->hdrs : NULL; }

static void http_free(http_gen *h) {
    if (h) free(h->toff);
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
    sse_json(g->sink_ud, gw_oai_chunk_json(&g->meta, i, 0, NULL, 0, finish, NULL, 0, NULL));
}

static char *build_response(void *ctx, const gw_oai_choice *ch, int n) {
    gw_gen *g = ctx;
    return gw_oai_response_json(&g->meta, ch, n, &g->usage, g->sp.logprobs);
}

/* The end of a JSON or SSE generation: the whole JSON answer, the stream's tail, or the error
 * (a status before anything was sent; an SSE error event, without [DONE], after). */
static void http_end(gw_gen *g, const gw_oai_err *err) {
    http_gen *h = g->sink_ud;
    finish(g, err);
    h->g = NULL;
    if (h->req) {
        gw_req_on_abort(h->req, NULL, NULL); /* h goes below, whatever the last writes do */
        if (err && g->q.stream && g->ran) {
            char *js = gw_oai_error_json(err);
            sse(h, js);
            free(js);
            gw_resp_stream_end(h->req);
        } else if (err) {
            char hd[sizeof h->hdrs + 32];
            int retry = (err->status == 503 || err->status == 429) && !strstr(h->hdrs, "Retry-After:");
            snprintf(hd, sizeof hd, "%s%s", retry ? "Retry-After: 1\r\n" : "", h->hdrs);
            send_err(h->req, err, hd[0] ? hd : NULL);
        } else if (g->q.stream) {
            if (g->q.include_usage) sse_json(h, gw_oai_usage_chunk_json(&g->meta, &g->usage));
            gw_resp_stream_write(h->req, GW_SSE_DONE, sizeof GW_SSE_DONE - 1);
            gw_resp_stream_end(h->req);
        } else {
            char *js = gw_gen_build(g, g->sp.logprobs, build_response, g);
            if (js) send_json(h->req, 200, js, HDRS(h));
            else gw_resp_send(h->req, 500, "text/plain", "out of memory\n", 14, HDRS(h));
            free(js);
        }
        h->req = NULL;
    }
    tport_done(&h->t);
}

static const gw_gen_sink sse_sink = { sse_start, sse_text, sse_finish, http_end };
static const gw_gen_sink json_sink = { NULL, NULL, NULL, http_end }; /* the generation keeps the output */

static void http_abort(gw_req *r, void *ud) {
    http_gen *h = ud;
    (void)r;
    CM_LOG_DEBUG("gw", "client left; cancelling", "id=%s", h->g ? h->g->id : "");
    h->req = NULL;
    gw_gen_cancel(h->g); /* http_end runs inside */
}

/* The key after "Bearer " in Authorization, or NULL. */
static const char *bearer_of(gw_req *r) {
    const char *h = gw_req_header(r, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
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

/* Header lines for an admission result: x-request-id, x-ratelimit-* (limited dimensions only),
 * and for refusals Retry-After and x-should-retry. */
static void auth_headers(char *out, size_t cap, const char *rid, const gw_auth_result *res) {
    size_t n = (size_t)snprintf(out, cap, "x-request-id: %s\r\n", rid);
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

/* The admission's answer as header lines on every response of this request. */
static void http_admitted(gw_gen *g, const gw_auth_result *res) {
    http_gen *h = g->sink_ud;
    char rid[GW_OAI_ID_LEN + 16];
    const char *p = strstr(h->hdrs, "x-request-id: ");
    snprintf(rid, sizeof rid, "%.*s", p ? (int)strcspn(p + 14, "\r") : 0, p ? p + 14 : "");
    auth_headers(h->hdrs, sizeof h->hdrs, rid, res);
}

static void handle_generate(gw_app *a, gw_req *r, int kind) {
    gw_oai_err e;
    char hdrs[256] = "";
    const char *bearer = NULL;
    if (a->cfg.auth) {
        char rid[GW_OAI_ID_LEN];
        gw_oai_make_id(rid, sizeof rid, "req_");
        auth_headers(hdrs, sizeof hdrs, rid, NULL);
        bearer = bearer_of(r);
        if (!bearer || !gw_key_well_formed(bearer, strlen(bearer))) {
            gw_auth_result res = {0};
            gw_oai_err_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "%s",
                           bearer ? "Incorrect API key provided. Keys look like 'ak-' followed by 48 hex digits."
                                  : "You didn't provide an API key. Send 'Authorization: Bearer ak-...'.");
            res.status = 401;
            auth_headers(hdrs, sizeof hdrs, rid, &res);
            send_err(r, &e, hdrs);
            return;
        }
    }
    gw_server *srv = gw_req_server(r);
    if ((srv && gw_server_draining(srv)) || !backend_ready(a)) {
        char h[sizeof hdrs + 32];
        snprintf(h, sizeof h, "Retry-After: 1\r\n%s", hdrs);
        if (srv && gw_server_draining(srv))
            gw_oai_err_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        else gw_oai_err_set(&e, 503, "server_error", NULL, "model_not_ready", "The model is loading; try again shortly.");
        send_err(r, &e, h);
        return;
    }
    gw_oai_req q;
    size_t blen;
    const char *body = gw_req_body(r, &blen);
    if (gw_oai_parse(kind, body, blen, &q, &e)) {
        send_err(r, &e, hdrs[0] ? hdrs : NULL);
        return;
    }
    int stream = q.stream, keep = GW_GEN_KEEP_TEXT | (q.sp.logprobs ? GW_GEN_KEEP_LOGPROBS : 0);
    http_gen *h = calloc(1, sizeof *h);
    if (!h || !(h->toff = calloc((size_t)q.n, sizeof *h->toff))) {
        gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        send_err(r, &e, hdrs[0] ? hdrs : NULL);
        gw_oai_req_free(&q);
        http_free(h);
        return;
    }
    h->t = (tport){ a, 0, http_admitted, NULL, http_release };
    h->req = r;
    memcpy(h->hdrs, hdrs, sizeof hdrs);
    if (gen_new(a, &q, stream ? &sse_sink : &json_sink, &h->t, kind == GW_OAI_CHAT ? "chatcmpl-" : "cmpl-", &h->g, &e)) {
        send_err(r, &e, HDRS(h));
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

struct ws_sock {
    gw_app  *app;
    gw_ws   *ws;            /* NULL once the connection is gone */
    char     bearer[GW_KEY_BUF]; /* the key of the upgrade request (auth on) */
    ws_gen  *list;
    int      n;
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

static void ws_create(ws_sock *s, cJSON *msg, const char *client_ev) {
    gw_app *a = s->app;
    gw_oai_err e;
    cJSON *body = cJSON_GetObjectItemCaseSensitive(msg, "response");
    if (!cJSON_IsObject(body)) {
        gw_oai_err_set(&e, 400, "invalid_request_error", "response", "missing_required_parameter",
                       "Missing required parameter: 'response' (the chat completion request).");
        ws_error(s, &e, client_ev);
        return;
    }
    if (s->n >= a->cfg.ws_max_responses) {
        gw_oai_err_set(&e, 429, "invalid_request_error", NULL, "too_many_responses",
                       "At most %d responses may be in progress on one connection.", a->cfg.ws_max_responses);
        ws_error(s, &e, client_ev);
        return;
    }
    if (s->ws && gw_server_draining(gw_ws_server(s->ws))) {
        gw_oai_err_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        ws_error(s, &e, client_ev);
        return;
    }
    if (!backend_ready(a)) {
        gw_oai_err_set(&e, 503, "server_error", NULL, "model_not_ready", "The model is loading; try again shortly.");
        ws_error(s, &e, client_ev);
        return;
    }
    /* the session's model is the served one when the response does not name it */
    if (!cJSON_GetObjectItemCaseSensitive(body, "model")) cJSON_AddStringToObject(body, "model", a->cfg.model_id);
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream");
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream_options");
    char *text = cJSON_PrintUnformatted(body);
    size_t len = text ? strlen(text) : 0;
    gw_oai_req q;
    ws_gen *w = NULL;
    int err = text ? gw_oai_parse(GW_OAI_CHAT, text, len, &q, &e) : CM_ENOMEM;
    free(text);
    if (!err && !(w = calloc(1, sizeof *w))) {
        gw_oai_req_free(&q);
        err = CM_ENOMEM;
    }
    if (err == CM_ENOMEM) gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    if (!err) {
        w->t = (tport){ a, 0, NULL, ws_accepted, ws_release };
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
    s->n++;
    generate(a, w->g, s->bearer, len);
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

static void ws_on_message(gw_ws *ws, void *ud, const char *text, size_t len) {
    ws_sock *s = ud;
    gw_oai_err e;
    cJSON *msg = cJSON_ParseWithLengthOpts(text, len, NULL, 0);
    cJSON *type = msg ? cJSON_GetObjectItemCaseSensitive(msg, "type") : NULL;
    cJSON *evid = msg ? cJSON_GetObjectItemCaseSensitive(msg, "event_id") : NULL;
    const char *client_ev = cJSON_IsString(evid) ? evid->valuestring : NULL;
    if (!cJSON_IsObject(msg) || !cJSON_IsString(type)) {
        gw_oai_err_set(&e, 400, "invalid_request_error", msg ? "type" : NULL, msg ? "missing_required_parameter" : "invalid_json",
                       msg ? "Events need a string 'type'." : "The event is not valid JSON.");
        ws_error(s, &e, client_ev);
    } else if (strcmp(type->valuestring, "response.create") == 0) {
        ws_create(s, msg, client_ev);
    } else if (strcmp(type->valuestring, "response.cancel") == 0) {
        ws_cancel(s, msg, client_ev);
    } else {
        gw_oai_err_set(&e, 400, "invalid_request_error", "type", "unknown_event_type",
                       "Unknown event type '%.64s'; supported: response.create, response.cancel.", type->valuestring);
        ws_error(s, &e, client_ev);
    }
    cJSON_Delete(msg);
}

static void ws_on_close(gw_ws *ws, void *ud) {
    ws_sock *s = ud;
    s->ws = NULL;
    while (s->list) gw_gen_cancel(s->list->g); /* ws_end sends nothing now and unlinks each */
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
    if (a->cfg.auth) { /* the key is checked here for its shape, and per response.create against the store */
        const char *b = bearer_of(r);
        if (!b || !gw_key_well_formed(b, strlen(b))) {
            gw_oai_err e;
            gw_oai_err_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "%s",
                           b ? "Incorrect API key provided." : "You didn't provide an API key. Send 'Authorization: Bearer ak-...'.");
            send_err(r, &e, "x-should-retry: false\r\n");
            free(s);
            return;
        }
        snprintf(s->bearer, sizeof s->bearer, "%s", b);
    }
    if (gw_ws_upgrade(r, a->cfg.ws_max_message, &ws_ops, s, &s->ws)) free(s); /* answered already */
}

/* ---- routing ------------------------------------------------------------------------------ */

static void handle_health(gw_app *a, gw_req *r, int ready_probe) {
    gw_server *s = gw_req_server(r);
    if (ready_probe && s && gw_server_draining(s)) send_json(r, 503, "{\"status\":\"draining\"}", NULL);
    else if (!backend_ready(a)) send_json(r, 503, "{\"status\":\"loading\"}", NULL);
    else send_json(r, 200, "{\"status\":\"ok\"}", NULL);
}

static cJSON *model_obj(gw_app *a, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", a->cfg.owned_by ? a->cfg.owned_by : "arka");
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
            send_err(r, &e, NULL);
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
    if (js) send_json(r, 200, js, NULL);
    else gw_resp_send(r, 500, "text/plain", "out of memory\n", 14, NULL);
    free(js);
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
                                         "/v1/chat/completions", "/v1/ws" };
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (strcmp(path, exact[i]) == 0) return exact[i];
    if (strncmp(path, "/v1/models/", 11) == 0) return "/v1/models/{id}";
    return "other";
}

void gw_app_on_response(void *ud, const char *path, int status) {
    gw_app *a = ud;
    gw_met_http(a->cfg.met, route_of(path ? path : ""), status);
}

void gw_app_handle(gw_req *r, void *ud) {
    gw_app *a = ud;
    const char *path = gw_req_path(r);
    int m = gw_req_method(r);
    int get = m == HTTP_GET || m == HTTP_HEAD, post = m == HTTP_POST;
    const char *allow = NULL;
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
    } else if (strcmp(path, "/metrics") == 0 && a->cfg.metrics) {
        if (get) {
            size_t len = 0;
            char *txt = a->cfg.metrics(a->cfg.metrics_ud, &len);
            if (txt) gw_resp_send(r, 200, "text/plain; version=0.0.4; charset=utf-8", txt, len, NULL);
            else gw_resp_send(r, 500, "text/plain", "out of memory\n", 14, NULL);
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
        send_err(r, &e, allow);
    } else {
        gw_oai_err_set(&e, 404, "invalid_request_error", NULL, "unknown_url", "Invalid URL (%s %.200s)", gw_req_method_name(r),
                       path);
        send_err(r, &e, NULL);
    }
}
