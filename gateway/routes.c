/* routes: the OpenAI-compatible API: routing, generation requests over HTTP (JSON and SSE) and
 * over WebSocket (Realtime-style events), all through a gw_backend. */
#include "gateway/routes.h"
#include "gateway/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <llhttp.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/openai.h"
#include "gateway/ws.h"

/* A quota claim waiting for the backend's final usage (cfg.backend_final_usage). */
typedef struct pend {
    uint64_t bid;
    uint64_t since;           /* loop ms when the request was submitted */
    gw_auth_ticket t;
    struct pend *prev, *next;
} pend;

/* Claims whose backend never reported are settled with their reservation after this long. */
#define PEND_STALE_MS (30u * 60u * 1000u)

struct gw_app {
    gw_app_cfg cfg;
    int active;
    pend *pend_head, *pend_tail;  /* oldest first */
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
    if (!cfg || !cfg->backend || !cfg->backend->ops || cfg->ws_max_responses < 1) return CM_EINVAL;
    gw_app *a = calloc(1, sizeof *a);
    if (!a) return CM_ENOMEM;
    a->cfg = *cfg;
    *out = a;
    return 0;
}

static void pend_unlink(gw_app *a, pend *p) {
    if (p->prev) p->prev->next = p->next;
    else a->pend_head = p->next;
    if (p->next) p->next->prev = p->prev;
    else a->pend_tail = p->prev;
}

void gw_app_destroy(gw_app *app) {
    if (!app) return;
    while (app->pend_head) { /* the backend is gone: charge what was reserved */
        pend *p = app->pend_head;
        pend_unlink(app, p);
        gw_auth_settle(app->cfg.auth, &p->t, p->t.reserved);
        free(p);
    }
    free(app);
}

void gw_app_usage_final(gw_app *a, uint64_t bid, const gw_oai_usage *u) {
    for (pend *p = a->pend_head; p; p = p->next)
        if (p->bid == bid) {
            pend_unlink(a, p);
            gw_auth_settle(a->cfg.auth, &p->t, (int64_t)u->prompt_tokens + u->completion_tokens);
            gw_met_tenant_usage(a->cfg.met, p->t.tenant, (uint64_t)u->prompt_tokens, (uint64_t)u->completion_tokens);
            free(p);
            return;
        }
}

/* Hands a live claim over to the pending list (settled by gw_app_usage_final). Returns 0, or
 * CM_ENOMEM (the caller keeps the claim). */
static int pend_add(gw_app *a, uint64_t bid, uint64_t now, gw_auth_ticket *t) {
    while (a->pend_head && now - a->pend_head->since > PEND_STALE_MS) {
        pend *o = a->pend_head;
        CM_LOG_WARN("gw", "no final usage from the backend; settling the reservation", "backend_id=%llu",
                    (unsigned long long)o->bid);
        pend_unlink(a, o);
        gw_auth_settle(a->cfg.auth, &o->t, o->t.reserved);
        free(o);
    }
    pend *p = calloc(1, sizeof *p);
    if (!p) return CM_ENOMEM;
    p->bid = bid;
    p->since = now;
    p->t = *t;
    t->live = 0;
    p->prev = a->pend_tail;
    if (a->pend_tail) a->pend_tail->next = p;
    else a->pend_head = p;
    a->pend_tail = p;
    return 0;
}
int gw_app_active(const gw_app *app) { return app->active; }

static const gw_backend_ops *OPS(gw_app *a) { return a->cfg.backend->ops; }
static void *IMPL(gw_app *a) { return a->cfg.backend->impl; }

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

static int buf_add(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *nb = realloc(*b, c);
        if (!nb) return CM_ENOMEM;
        *b = nb;
        *cap = c;
    }
    if (n) memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

/* Per-choice accumulation for non-streaming answers (text, finish, logprobs). */
typedef struct acc {
    char  *text;
    size_t len, cap;
    int    finish;
    struct { size_t off, len; float lp; int top0, ntop; } *tk;
    int    ntk, tkcap;
    struct { size_t off, len; float lp; } *tp;
    int    ntp, tpcap;
    char  *sb;           /* token strings */
    size_t sblen, sbcap;
} acc;

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *np = realloc(*p, (size_t)c * elem);
    if (!np) return CM_ENOMEM;
    *p = np;
    *cap = c;
    return 0;
}

static int acc_add(acc *a, const char *text, size_t len, const gw_oai_tok *toks, int n_toks, int keep_toks) {
    if (buf_add(&a->text, &a->len, &a->cap, text, len)) return CM_ENOMEM;
    if (!keep_toks) return 0;
    for (int i = 0; i < n_toks; i++) {
        if (grow((void **)&a->tk, &a->tkcap, a->ntk + 1, sizeof *a->tk) ||
            grow((void **)&a->tp, &a->tpcap, a->ntp + toks[i].n_top, sizeof *a->tp))
            return CM_ENOMEM;
        a->tk[a->ntk].off = a->sblen;
        a->tk[a->ntk].len = toks[i].len;
        a->tk[a->ntk].lp = toks[i].logprob;
        a->tk[a->ntk].top0 = a->ntp;
        a->tk[a->ntk].ntop = toks[i].n_top;
        if (buf_add(&a->sb, &a->sblen, &a->sbcap, toks[i].text, toks[i].len)) return CM_ENOMEM;
        for (int k = 0; k < toks[i].n_top; k++) {
            a->tp[a->ntp].off = a->sblen;
            a->tp[a->ntp].len = toks[i].top[k].len;
            a->tp[a->ntp].lp = toks[i].top[k].logprob;
            if (buf_add(&a->sb, &a->sblen, &a->sbcap, toks[i].top[k].text, toks[i].top[k].len)) return CM_ENOMEM;
            a->ntp++;
        }
        a->ntk++;
    }
    return 0;
}

static void acc_free(acc *a, int n) {
    for (int i = 0; a && i < n; i++) {
        free(a[i].text);
        free(a[i].tk);
        free(a[i].tp);
        free(a[i].sb);
    }
    free(a);
}

/* Builds choices (with logprobs pointing into the accumulators) and calls build(). */
static char *acc_build(acc *a, int n, int want_lp, char *(*build)(void *ctx, const gw_oai_choice *ch, int n), void *ctx) {
    gw_oai_choice *ch = calloc((size_t)n, sizeof *ch);
    gw_oai_tok **toks = calloc((size_t)n, sizeof *toks);
    gw_oai_top **tops = calloc((size_t)n, sizeof *tops);
    char *out = NULL;
    if (!ch || !toks || !tops) goto done;
    for (int i = 0; i < n; i++) {
        ch[i].text = a[i].text ? a[i].text : "";
        ch[i].len = a[i].len;
        ch[i].finish = a[i].finish;
        if (!want_lp) continue;
        toks[i] = calloc((size_t)a[i].ntk + 1, sizeof **toks);
        tops[i] = calloc((size_t)a[i].ntp + 1, sizeof **tops);
        if (!toks[i] || !tops[i]) goto done;
        for (int k = 0; k < a[i].ntp; k++)
            tops[i][k] = (gw_oai_top){a[i].sb + a[i].tp[k].off, a[i].tp[k].len, a[i].tp[k].lp};
        for (int k = 0; k < a[i].ntk; k++)
            toks[i][k] = (gw_oai_tok){a[i].sb + a[i].tk[k].off, a[i].tk[k].len, a[i].tk[k].lp, a[i].tk[k].ntop,
                                      tops[i] + a[i].tk[k].top0};
        ch[i].toks = toks[i];
        ch[i].n_toks = a[i].ntk;
    }
    out = build(ctx, ch, n);
done:
    for (int i = 0; i < n && toks && tops; i++) {
        free(toks[i]);
        free(tops[i]);
    }
    free(toks);
    free(tops);
    free(ch);
    return out;
}

/* ---- HTTP generations --------------------------------------------------------------------- */

typedef struct gen {
    gw_app     *app;
    gw_req     *req;        /* NULL once the response ended or the client left */
    gw_oai_req  q;
    gw_oai_meta meta;
    char        id[GW_OAI_ID_LEN];
    char       *model;
    uint64_t    bid;
    int         live;       /* the backend still owns a request for us */
    int         started;
    acc        *ch;
    size_t     *toff;       /* completions logprobs text_offset per choice */
    gw_oai_usage usage;
    uv_timer_t  ping;
    int         ping_init;
    uint64_t    last_write;
    /* auth (cfg.auth set) */
    int         admitting;  /* waiting for the admission callback */
    int         gone;       /* the client left while admitting */
    gw_auth_ticket ticket;  /* live while this request holds a quota claim */
    int64_t     seen_tokens; /* completion tokens seen (estimate for failures and cancels) */
    char        hdrs[640];  /* x-request-id and x-ratelimit-* lines for every response ("" without auth) */
} gen;

static const char *HDRS(const gen *g) { return g->hdrs[0] ? g->hdrs : NULL; }

static void gen_closed(uv_handle_t *h) {
    gen *g = h->data;
    free(g);
}

static void gen_free(gen *g) {
    g->app->active--;
    if (g->ticket.live) { /* done: on_done's usage; failed or cancelled: what was seen */
        gw_auth_settle(g->app->cfg.auth, &g->ticket, (int64_t)g->usage.prompt_tokens + g->seen_tokens);
        gw_met_tenant_usage(g->app->cfg.met, g->ticket.tenant, (uint64_t)g->usage.prompt_tokens, (uint64_t)g->seen_tokens);
    }
    acc_free(g->ch, g->q.n); /* before the request is freed: it knows n */
    gw_oai_req_free(&g->q);
    free(g->toff);
    free(g->model);
    if (g->ping_init) {
        uv_timer_stop(&g->ping);
        uv_close((uv_handle_t *)&g->ping, gen_closed);
    } else {
        free(g);
    }
}

static void sse(gen *g, const char *json) {
    if (!g->req || !json) return;
    size_t n;
    char *s = gw_sse_data(json, &n);
    if (s) gw_resp_stream_write(g->req, s, n);
    free(s);
    g->last_write = uv_now(gw_req_loop(g->req));
}

static void sse_json(gen *g, char *json) {
    sse(g, json);
    free(json);
}

static void ping_tick(uv_timer_t *t) {
    gen *g = t->data;
    if (!g->req) return;
    uint64_t now = uv_now(t->loop);
    if (now - g->last_write + 5 < g->app->cfg.ping_ms) return;
    gw_resp_stream_write(g->req, GW_SSE_PING, sizeof GW_SSE_PING - 1);
    g->last_write = now;
}

static void g_start(void *ud, int prompt_tokens, int cached_tokens) {
    gen *g = ud;
    g->started = 1;
    g->usage.prompt_tokens = prompt_tokens;
    g->usage.cached_tokens = cached_tokens;
    if (!g->q.stream || !g->req) return;
    char h[sizeof g->hdrs + 64];
    snprintf(h, sizeof h, "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n%s", g->hdrs);
    gw_resp_stream_start(g->req, 200, "text/event-stream", h);
    g->last_write = uv_now(gw_req_loop(g->req));
    if (g->q.kind == GW_OAI_CHAT)
        for (int i = 0; i < g->q.n; i++) sse_json(g, gw_oai_chunk_json(&g->meta, i, 1, NULL, 0, SHM_FINISH_NONE, NULL, 0, NULL));
    if (g->app->cfg.ping_ms && uv_timer_init(gw_req_loop(g->req), &g->ping) == 0) {
        g->ping.data = g;
        g->ping_init = 1;
        uv_timer_start(&g->ping, ping_tick, g->app->cfg.ping_ms, g->app->cfg.ping_ms);
    }
}

static void g_text(void *ud, int index, const char *text, size_t len, const gw_oai_tok *toks, int n_toks) {
    gen *g = ud;
    if (index < 0 || index >= g->q.n) return;
    g->seen_tokens += toks && n_toks > 0 ? n_toks : len > 0;
    int want_lp = g->q.sp.logprobs;
    if (!want_lp) toks = NULL;
    if (!g->q.stream) {
        acc_add(&g->ch[index], text, len, toks, n_toks, want_lp);
        return;
    }
    if (len == 0 && !toks) return;
    sse_json(g, gw_oai_chunk_json(&g->meta, index, 0, text, len, SHM_FINISH_NONE, toks, toks ? n_toks : 0, &g->toff[index]));
}

static void g_finish(void *ud, int index, int finish) {
    gen *g = ud;
    if (index < 0 || index >= g->q.n) return;
    g->ch[index].finish = finish;
    if (g->q.stream) sse_json(g, gw_oai_chunk_json(&g->meta, index, 0, NULL, 0, finish, NULL, 0, NULL));
}

static char *build_response(void *ctx, const gw_oai_choice *ch, int n) {
    gen *g = ctx;
    int want_lp = g->q.sp.logprobs;
    return gw_oai_response_json(&g->meta, ch, n, &g->usage, want_lp);
}

static void g_done(void *ud, const gw_oai_usage *u) {
    gen *g = ud;
    g->live = 0;
    g->usage.completion_tokens = u->completion_tokens;
    if (u->prompt_tokens) g->usage.prompt_tokens = u->prompt_tokens;
    if (u->cached_tokens) g->usage.cached_tokens = u->cached_tokens;
    g->seen_tokens = u->completion_tokens;
    if (g->req) {
        /* detach first: g is freed below whether or not the last write reaches the client */
        gw_req_on_abort(g->req, NULL, NULL);
        if (g->q.stream) {
            if (g->q.include_usage) sse_json(g, gw_oai_usage_chunk_json(&g->meta, &g->usage));
            gw_resp_stream_write(g->req, GW_SSE_DONE, sizeof GW_SSE_DONE - 1);
            gw_resp_stream_end(g->req);
        } else {
            int want_lp = g->q.sp.logprobs;
            char *js = acc_build(g->ch, g->q.n, want_lp, build_response, g);
            if (js) send_json(g->req, 200, js, HDRS(g));
            else gw_resp_send(g->req, 500, "text/plain", "out of memory\n", 14, HDRS(g));
            free(js);
        }
    }
    g->req = NULL;
    gen_free(g);
}

static void g_error(void *ud, const gw_oai_err *e) {
    gen *g = ud;
    g->live = 0;
    if (g->req) {
        gw_req_on_abort(g->req, NULL, NULL); /* g is freed below, whatever the writes do */
        if (g->q.stream && g->started) {
            /* headers are out: the failure travels as an SSE event, and the stream ends without [DONE] */
            char *js = gw_oai_error_json(e);
            sse(g, js);
            free(js);
            gw_resp_stream_end(g->req);
        } else {
            send_err(g->req, e, HDRS(g));
        }
    }
    g->req = NULL;
    gen_free(g);
}

static const gw_gen_sink http_sink = {g_start, g_text, g_finish, g_done, g_error};

static void g_abort(gw_req *r, void *ud) {
    gen *g = ud;
    CM_LOG_DEBUG("gw", "client left; cancelling", "id=%s", g->id);
    g->req = NULL;
    if (g->admitting) { /* the admission callback frees g */
        g->gone = 1;
        return;
    }
    if (g->live) OPS(g->app)->cancel(IMPL(g->app), g->bid);
    g->live = 0;
    gen_free(g);
}

static int check_model(gw_app *a, const char *model, gw_oai_err *e) {
    const char *id = OPS(a)->model_id(IMPL(a));
    if (id && strcmp(model, id) == 0) return 0;
    gw_oai_err_set(e, 404, "invalid_request_error", "model", "model_not_found",
                   "The model `%.200s` does not exist or you do not have access to it.", model);
    return CM_ENOTFOUND;
}

static int check_ready(gw_app *a, gw_req *r, gw_oai_err *e) {
    gw_server *s = gw_req_server(r);
    if (s && gw_server_draining(s)) {
        gw_oai_err_set(e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        return CM_ESTATE;
    }
    if (!OPS(a)->ready(IMPL(a))) {
        gw_oai_err_set(e, 503, "server_error", NULL, "model_not_ready", "The model is loading; try again shortly.");
        return CM_ESTATE;
    }
    return 0;
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

/* Appends a header line to g->hdrs when it fits. */
static void hdr_add(gen *g, const char *line) {
    size_t n = strlen(g->hdrs);
    if (n + strlen(line) < sizeof g->hdrs) strcpy(g->hdrs + n, line);
}

static void gen_submit(gen *g) {
    gw_app *a = g->app;
    gw_oai_err e;
    if (OPS(a)->submit(IMPL(a), &g->q, &http_sink, g, &g->bid, &e)) {
        gw_req_on_abort(g->req, NULL, NULL);
        if (e.status == 503 || e.status == 429) hdr_add(g, "Retry-After: 1\r\n");
        send_err(g->req, &e, g->hdrs[0] || e.status == 503 || e.status == 429 ? g->hdrs : NULL);
        gen_free(g); /* settles the claim with 0 tokens */
        return;
    }
    g->live = 1;
    if (g->ticket.live && a->cfg.backend_final_usage && pend_add(a, g->bid, uv_now(gw_req_loop(g->req)), &g->ticket))
        CM_LOG_WARN("gw", "out of memory: this request's quota is settled by the gateway's estimate", "id=%s", g->id);
    gw_req_on_abort(g->req, g_abort, g);
}

static void on_admit(void *ud, const gw_auth_result *res) {
    gen *g = ud;
    g->admitting = 0;
    if (res->status == 0) g->ticket = res->ticket;
    if (g->gone) { /* the client left while Redis answered */
        gen_free(g);
        return;
    }
    char rid[GW_OAI_ID_LEN + 16];
    const char *p = strstr(g->hdrs, "x-request-id: ");
    snprintf(rid, sizeof rid, "%.*s", p ? (int)strcspn(p + 14, "\r") : 0, p ? p + 14 : "");
    auth_headers(g->hdrs, sizeof g->hdrs, rid, res);
    if (res->status) {
        gw_req_on_abort(g->req, NULL, NULL);
        gw_oai_err e;
        gw_oai_err_set(&e, res->status, res->type, NULL, res->code, "%s", res->msg);
        send_err(g->req, &e, g->hdrs);
        g->req = NULL;
        gen_free(g);
        return;
    }
    gen_submit(g);
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
    if (check_ready(a, r, &e)) {
        char h[sizeof hdrs + 32];
        snprintf(h, sizeof h, "Retry-After: 1\r\n%s", hdrs);
        send_err(r, &e, h);
        return;
    }
    gen *g = calloc(1, sizeof *g);
    if (!g) {
        gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        send_err(r, &e, hdrs[0] ? hdrs : NULL);
        return;
    }
    size_t blen;
    const char *body = gw_req_body(r, &blen);
    if (gw_oai_parse(kind, body, blen, &g->q, &e) || check_model(a, g->q.model, &e)) {
        send_err(r, &e, hdrs[0] ? hdrs : NULL);
        gw_oai_req_free(&g->q);
        free(g);
        return;
    }
    g->app = a;
    g->req = r;
    memcpy(g->hdrs, hdrs, sizeof hdrs);
    a->active++;
    g->ch = calloc((size_t)g->q.n, sizeof *g->ch);
    g->toff = calloc((size_t)g->q.n, sizeof *g->toff);
    g->model = strdup(g->q.model);
    if (!g->ch || !g->toff || !g->model) {
        gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        send_err(r, &e, HDRS(g));
        gen_free(g);
        return;
    }
    gw_oai_make_id(g->id, sizeof g->id, kind == GW_OAI_CHAT ? "chatcmpl-" : "cmpl-");
    g->meta = (gw_oai_meta){kind, g->id, (int64_t)time(NULL), g->model, a->cfg.fingerprint, g->q.include_usage};
    if (!a->cfg.auth) {
        gen_submit(g);
        return;
    }
    g->admitting = 1;
    gw_req_on_abort(r, g_abort, g);
    gw_auth_admit(a->cfg.auth, bearer, g->q.model, gw_auth_reserve(a->cfg.auth, blen, g->q.sp.max_tokens ? (int)g->q.sp.max_tokens : -1, g->q.n), on_admit, g);
}

/* ---- WebSocket responses (Realtime-style events) ------------------------------------------ */

typedef struct rt_sock rt_sock;

typedef struct rt_resp {
    rt_sock    *s;          /* NULL once the socket closed while admission was pending */
    gw_app     *app;
    int         admitting;
    gw_auth_ticket ticket;
    int64_t     seen_tokens;
    char        client_ev[64];
    struct rt_resp *prev, *next;
    gw_oai_req  q;
    gw_oai_meta meta;
    char        id[GW_OAI_ID_LEN];
    char       *model;
    uint64_t    bid;
    acc        *ch;
    gw_oai_usage usage;
} rt_resp;

struct rt_sock {
    gw_app  *app;
    gw_ws   *ws;
    char     bearer[GW_KEY_BUF]; /* the key of the upgrade request (auth on) */
    rt_resp *list;
    int      n;
};

static void rt_send(rt_sock *s, char *json) {
    if (json && s->ws && !gw_ws_closing(s->ws)) gw_ws_send_text(s->ws, json, strlen(json));
    free(json);
}

static void rt_error(rt_sock *s, const gw_oai_err *e, const char *client_event_id) {
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    rt_send(s, gw_rt_error_json(ev, e, client_event_id));
}

static void rt_unlink(rt_resp *r) {
    rt_sock *s = r->s;
    if (r->prev) r->prev->next = r->next;
    else s->list = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    s->n--;
    r->s = NULL;
}

static void rt_free(rt_resp *r) {
    if (r->s) rt_unlink(r);
    r->app->active--;
    if (r->ticket.live) {
        gw_auth_settle(r->app->cfg.auth, &r->ticket, (int64_t)r->usage.prompt_tokens + r->seen_tokens);
        gw_met_tenant_usage(r->app->cfg.met, r->ticket.tenant, (uint64_t)r->usage.prompt_tokens, (uint64_t)r->seen_tokens);
    }
    acc_free(r->ch, r->q.n);
    gw_oai_req_free(&r->q);
    free(r->model);
    free(r);
}

typedef struct done_ctx {
    rt_resp *r;
    const char *status, *reason;
} done_ctx;

static char *build_done(void *ctx, const gw_oai_choice *ch, int n) {
    done_ctx *d = ctx;
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    return gw_rt_done_json(ev, &d->r->meta, d->status, d->reason, ch, n, &d->r->usage);
}

static void rt_done(rt_resp *r, const char *status, const char *reason) {
    done_ctx d = {r, status, reason};
    rt_send(r->s, acc_build(r->ch, r->q.n, 0, build_done, &d));
    if (r->admitting) rt_unlink(r); /* the admission callback frees it */
    else rt_free(r);
}

static void rt_start(void *ud, int prompt_tokens, int cached_tokens) {
    rt_resp *r = ud;
    r->usage.prompt_tokens = prompt_tokens;
    r->usage.cached_tokens = cached_tokens;
}

static void rt_text(void *ud, int index, const char *text, size_t len, const gw_oai_tok *toks, int n_toks) {
    rt_resp *r = ud;
    if (index < 0 || index >= r->q.n) return;
    r->seen_tokens += toks && n_toks > 0 ? n_toks : len > 0;
    acc_add(&r->ch[index], text, len, NULL, 0, 0);
    if (!len) return;
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    rt_send(r->s, gw_rt_delta_json(ev, r->id, index, text, len));
}

static void rt_finish(void *ud, int index, int finish) {
    rt_resp *r = ud;
    if (index >= 0 && index < r->q.n) r->ch[index].finish = finish;
}

static void rt_done_cb(void *ud, const gw_oai_usage *u) {
    rt_resp *r = ud;
    r->usage.completion_tokens = u->completion_tokens;
    if (u->prompt_tokens) r->usage.prompt_tokens = u->prompt_tokens;
    r->seen_tokens = u->completion_tokens;
    int cut = 0;
    for (int i = 0; i < r->q.n; i++) cut |= r->ch[i].finish == SHM_FINISH_LENGTH || r->ch[i].finish == SHM_FINISH_CONTEXT;
    if (cut) rt_done(r, "incomplete", "max_output_tokens");
    else rt_done(r, "completed", NULL);
}

static void rt_error_cb(void *ud, const gw_oai_err *e) {
    rt_resp *r = ud;
    rt_error(r->s, e, NULL);
    rt_done(r, "failed", e->code[0] ? e->code : "error");
}

static const gw_gen_sink rt_sink = {rt_start, rt_text, rt_finish, rt_done_cb, rt_error_cb};

static void rt_submit(rt_resp *r) {
    rt_sock *s = r->s;
    gw_app *a = r->app;
    gw_oai_err e;
    const char *client_ev = r->client_ev[0] ? r->client_ev : NULL;
    if (OPS(a)->submit(IMPL(a), &r->q, &rt_sink, r, &r->bid, &e)) {
        rt_error(s, &e, client_ev);
        rt_free(r);
        return;
    }
    if (r->ticket.live && a->cfg.backend_final_usage && s->ws && pend_add(a, r->bid, uv_now(gw_ws_loop(s->ws)), &r->ticket))
        CM_LOG_WARN("gw", "out of memory: this response's quota is settled by the gateway's estimate", "id=%s", r->id);
    char ev[GW_OAI_ID_LEN];
    gw_oai_make_id(ev, sizeof ev, "event_");
    rt_send(s, gw_rt_created_json(ev, &r->meta));
}

static void rt_on_admit(void *ud, const gw_auth_result *res) {
    rt_resp *r = ud;
    r->admitting = 0;
    if (res->status == 0) r->ticket = res->ticket;
    if (!r->s) { /* the socket closed meanwhile */
        rt_free(r);
        return;
    }
    if (res->status) {
        gw_oai_err e;
        gw_oai_err_set(&e, res->status, res->type, NULL, res->code, "%s", res->msg);
        rt_error(r->s, &e, r->client_ev[0] ? r->client_ev : NULL);
        rt_free(r);
        return;
    }
    rt_submit(r);
}

static void rt_create(rt_sock *s, cJSON *msg, const char *client_ev) {
    gw_app *a = s->app;
    gw_oai_err e;
    cJSON *body = cJSON_GetObjectItemCaseSensitive(msg, "response");
    if (!cJSON_IsObject(body)) {
        gw_oai_err_set(&e, 400, "invalid_request_error", "response", "missing_required_parameter",
                       "Missing required parameter: 'response' (the chat completion request).");
        rt_error(s, &e, client_ev);
        return;
    }
    if (s->n >= a->cfg.ws_max_responses) {
        gw_oai_err_set(&e, 429, "invalid_request_error", NULL, "too_many_responses",
                       "At most %d responses may be in progress on one connection.", a->cfg.ws_max_responses);
        rt_error(s, &e, client_ev);
        return;
    }
    if (s->ws && gw_server_draining(gw_ws_server(s->ws))) {
        gw_oai_err_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        rt_error(s, &e, client_ev);
        return;
    }
    if (!OPS(a)->ready(IMPL(a))) {
        gw_oai_err_set(&e, 503, "server_error", NULL, "model_not_ready", "The model is loading; try again shortly.");
        rt_error(s, &e, client_ev);
        return;
    }
    /* the session's model is the served one when the response does not name it */
    const char *mid = OPS(a)->model_id(IMPL(a));
    if (!cJSON_GetObjectItemCaseSensitive(body, "model") && mid) cJSON_AddStringToObject(body, "model", mid);
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream");
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream_options");
    char *text = cJSON_PrintUnformatted(body);
    size_t len = text ? strlen(text) : 0;
    rt_resp *r = calloc(1, sizeof *r);
    if (!text || !r) {
        free(text);
        free(r);
        gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        rt_error(s, &e, client_ev);
        return;
    }
    int err = gw_oai_parse(GW_OAI_CHAT, text, strlen(text), &r->q, &e);
    free(text);
    if (!err) err = check_model(a, r->q.model, &e);
    if (!err) {
        r->ch = calloc((size_t)r->q.n, sizeof *r->ch);
        r->model = strdup(r->q.model);
        if (!r->ch || !r->model) {
            err = CM_ENOMEM;
            gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    if (err) {
        size_t pl = strlen(e.param);
        if (pl && pl + 10 <= sizeof e.param) { /* name the field inside the event */
            memmove(e.param + 9, e.param, pl + 1);
            memcpy(e.param, "response.", 9);
        }
        rt_error(s, &e, client_ev);
        acc_free(r->ch, r->q.n);
        free(r->model);
        gw_oai_req_free(&r->q);
        free(r);
        return;
    }
    r->s = s;
    r->app = a;
    snprintf(r->client_ev, sizeof r->client_ev, "%s", client_ev ? client_ev : "");
    gw_oai_make_id(r->id, sizeof r->id, "resp_");
    r->meta = (gw_oai_meta){GW_OAI_CHAT, r->id, (int64_t)time(NULL), r->model, a->cfg.fingerprint, 0};
    r->next = s->list;
    if (s->list) s->list->prev = r;
    s->list = r;
    s->n++;
    a->active++;
    if (!a->cfg.auth) {
        rt_submit(r);
        return;
    }
    r->admitting = 1;
    gw_auth_admit(a->cfg.auth, s->bearer, r->q.model, gw_auth_reserve(a->cfg.auth, len, r->q.sp.max_tokens ? (int)r->q.sp.max_tokens : -1, r->q.n),
                  rt_on_admit, r);
}

static void rt_cancel(rt_sock *s, cJSON *msg, const char *client_ev) {
    cJSON *rid = cJSON_GetObjectItemCaseSensitive(msg, "response_id");
    gw_oai_err e;
    if (rid && !cJSON_IsNull(rid) && !cJSON_IsString(rid)) {
        gw_oai_err_set(&e, 400, "invalid_request_error", "response_id", "invalid_type", "'response_id' must be a string.");
        rt_error(s, &e, client_ev);
        return;
    }
    int found = 0;
    rt_resp *next;
    for (rt_resp *r = s->list; r; r = next) {
        next = r->next;
        if (cJSON_IsString(rid) && strcmp(r->id, rid->valuestring) != 0) continue;
        OPS(s->app)->cancel(IMPL(s->app), r->bid);
        rt_done(r, "cancelled", "client_cancelled");
        found++;
    }
    if (!found) {
        gw_oai_err_set(&e, 400, "invalid_request_error", "response_id", "response_not_found",
                       cJSON_IsString(rid) ? "No response in progress with id '%.64s'." : "No response in progress.%.0s",
                       cJSON_IsString(rid) ? rid->valuestring : "");
        rt_error(s, &e, client_ev);
    }
}

static void rt_on_message(gw_ws *ws, void *ud, const char *text, size_t len) {
    rt_sock *s = ud;
    gw_oai_err e;
    cJSON *msg = cJSON_ParseWithLengthOpts(text, len, NULL, 0);
    cJSON *type = msg ? cJSON_GetObjectItemCaseSensitive(msg, "type") : NULL;
    cJSON *evid = msg ? cJSON_GetObjectItemCaseSensitive(msg, "event_id") : NULL;
    const char *client_ev = cJSON_IsString(evid) ? evid->valuestring : NULL;
    if (!cJSON_IsObject(msg) || !cJSON_IsString(type)) {
        gw_oai_err_set(&e, 400, "invalid_request_error", msg ? "type" : NULL, msg ? "missing_required_parameter" : "invalid_json",
                       msg ? "Events need a string 'type'." : "The event is not valid JSON.");
        rt_error(s, &e, client_ev);
    } else if (strcmp(type->valuestring, "response.create") == 0) {
        rt_create(s, msg, client_ev);
    } else if (strcmp(type->valuestring, "response.cancel") == 0) {
        rt_cancel(s, msg, client_ev);
    } else {
        gw_oai_err_set(&e, 400, "invalid_request_error", "type", "unknown_event_type",
                       "Unknown event type '%.64s'; supported: response.create, response.cancel.", type->valuestring);
        rt_error(s, &e, client_ev);
    }
    cJSON_Delete(msg);
}

static void rt_on_close(gw_ws *ws, void *ud) {
    rt_sock *s = ud;
    s->ws = NULL;
    while (s->list) {
        rt_resp *r = s->list;
        if (r->admitting) { /* its admission callback frees it */
            rt_unlink(r);
            continue;
        }
        OPS(s->app)->cancel(IMPL(s->app), r->bid);
        rt_free(r);
    }
    free(s);
}

static const gw_ws_ops rt_ops = {rt_on_message, rt_on_close};

static void handle_ws(gw_app *a, gw_req *r) {
    rt_sock *s = calloc(1, sizeof *s);
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
    if (gw_ws_upgrade(r, a->cfg.ws_max_message, &rt_ops, s, &s->ws)) free(s); /* answered already */
}

/* ---- routing ------------------------------------------------------------------------------ */

static void handle_health(gw_app *a, gw_req *r, int ready_probe) {
    gw_server *s = gw_req_server(r);
    if (ready_probe && s && gw_server_draining(s)) send_json(r, 503, "{\"status\":\"draining\"}", NULL);
    else if (!OPS(a)->ready(IMPL(a))) send_json(r, 503, "{\"status\":\"loading\"}", NULL);
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
    const char *id = OPS(a)->model_id(IMPL(a));
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
