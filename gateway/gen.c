/* gen: one generation request, from the parsed request to the sink's end (see gen.h). */
#include "gateway/gen.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "gateway/metrics.h"
#include "model/model.h"
#include "text/grammar.h"

#define PIECE_MAX 4096 /* bytes of text one token may decode to (tok_detok's output cap) */

/* ---- kept output (text and logprobs) for sinks that write at the end --------------------- */

struct gw_gen_kept {
    char  *text;
    size_t len, cap;
    char  *rs;                                                   /* reasoning */
    size_t rlen, rcap;
    struct { size_t off, len; float lp; int top0, ntop; } *tk; /* one per token, strings in sb */
    int    ntk, tkcap;
    struct { size_t off, len; float lp; } *tp;                  /* the alternatives, strings in sb */
    int    ntp, tpcap;
    char  *sb;
    size_t sblen, sbcap;
};

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

static int kept_add(gw_gen_kept *k, const char *text, size_t len, const gw_oai_tok *toks, int n_toks, int keep_lp) {
    if (buf_add(&k->text, &k->len, &k->cap, text, len)) return CM_ENOMEM;
    if (!keep_lp) return 0;
    for (int i = 0; i < n_toks; i++) {
        if (grow((void **)&k->tk, &k->tkcap, k->ntk + 1, sizeof *k->tk) ||
            grow((void **)&k->tp, &k->tpcap, k->ntp + toks[i].n_top, sizeof *k->tp))
            return CM_ENOMEM;
        k->tk[k->ntk].off = k->sblen;
        k->tk[k->ntk].len = toks[i].len;
        k->tk[k->ntk].lp = toks[i].logprob;
        k->tk[k->ntk].top0 = k->ntp;
        k->tk[k->ntk].ntop = toks[i].n_top;
        if (buf_add(&k->sb, &k->sblen, &k->sbcap, toks[i].text, toks[i].len)) return CM_ENOMEM;
        for (int t = 0; t < toks[i].n_top; t++) {
            k->tp[k->ntp].off = k->sblen;
            k->tp[k->ntp].len = toks[i].top[t].len;
            k->tp[k->ntp].lp = toks[i].top[t].logprob;
            if (buf_add(&k->sb, &k->sblen, &k->sbcap, toks[i].top[t].text, toks[i].top[t].len)) return CM_ENOMEM;
            k->ntp++;
        }
        k->ntk++;
    }
    return 0;
}

static void kept_free(gw_gen_kept *k) {
    if (!k) return;
    free(k->text);
    free(k->rs);
    free(k->tk);
    free(k->tp);
    free(k->sb);
    free(k);
}

char *gw_gen_build(const gw_gen *g, int want_lp, char *(*build)(void *ctx, const gw_oai_choice *ch, int n), void *ctx) {
    int n = g->n;
    gw_oai_choice *ch = calloc((size_t)n, sizeof *ch);
    gw_oai_tok **toks = calloc((size_t)n, sizeof *toks);
    gw_oai_top **tops = calloc((size_t)n, sizeof *tops);
    gw_oai_call **calls = calloc((size_t)n, sizeof *calls);
    char *out = NULL;
    if (!ch || !toks || !tops || !calls) goto done;
    for (int i = 0; i < n; i++) {
        const gw_gen_kept *k = g->ch[i].kept;
        const gw_gen_choice *c = &g->ch[i];
        ch[i].text = k && k->text ? k->text : "";
        ch[i].len = k ? k->len : 0;
        ch[i].finish = c->finish;
        if (k && k->rs) {
            ch[i].reasoning = k->rs;
            ch[i].reasoning_len = k->rlen;
        }
        if (c->n_calls) {
            if (!(calls[i] = calloc((size_t)c->n_calls, sizeof **calls))) goto done;
            for (int j = 0; j < c->n_calls; j++)
                calls[i][j] = (gw_oai_call){ c->calls[j].id, c->calls[j].name ? c->calls[j].name : "",
                                             c->calls[j].args ? c->calls[j].args : "", c->calls[j].len };
            ch[i].calls = calls[i];
            ch[i].n_calls = c->n_calls;
        }
        if (!want_lp) continue;
        int ntk = k ? k->ntk : 0, ntp = k ? k->ntp : 0;
        toks[i] = calloc((size_t)ntk + 1, sizeof **toks);
        tops[i] = calloc((size_t)ntp + 1, sizeof **tops);
        if (!toks[i] || !tops[i]) goto done;
        for (int t = 0; t < ntp; t++) tops[i][t] = (gw_oai_top){ k->sb + k->tp[t].off, k->tp[t].len, k->tp[t].lp };
        for (int t = 0; t < ntk; t++)
            toks[i][t] = (gw_oai_tok){ k->sb + k->tk[t].off, k->tk[t].len, k->tk[t].lp, k->tk[t].ntop, tops[i] + k->tk[t].top0 };
        ch[i].toks = toks[i];
        ch[i].n_toks = ntk;
    }
    out = build(ctx, ch, n);
done:
    for (int i = 0; i < n && toks && tops; i++) {
        free(toks[i]);
        free(tops[i]);
    }
    for (int i = 0; i < n && calls; i++) free(calls[i]);
    free(calls);
    free(toks);
    free(tops);
    free(ch);
    return out;
}

/* ---- life ---------------------------------------------------------------------------------- */

int gw_gen_create(gw_gen_env *env, gw_oai_req *q, const gw_gen_sink *sink, void *sink_ud, gw_gen **out,
                  gw_oai_err *e) {
    *out = NULL;
    int n = q->n > 0 ? q->n : 1;
    gw_gen *g = calloc(1, sizeof *g + (size_t)n * sizeof(gw_gen_choice));
    if (!g) {
        gw_oai_req_free(q);
        gw_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return CM_ENOMEM;
    }
    g->env = env;
    g->q = *q;
    memset(q, 0, sizeof *q);
    g->n = g->n_open = n;
    g->sink = sink;
    g->sink_ud = sink_ud;
    g->sp = g->q.sp;
    for (int i = 0; i < n; i++) {
        g->ch[i].g = g;
        g->ch[i].idx = i;
        g->ch[i].queue_ns = -1;
        int rc = tok_detok_init(&g->ch[i].dt, env->vocab, TOK_DETOK_SKIP_CONTROL);
        if (!rc) rc = tok_stop_init(&g->ch[i].st, (const char *const *)g->q.stop, NULL, g->q.n_stop);
        if (rc) {
            gw_oai_err_set(e, 400, "invalid_request_error", "stop", NULL, "invalid stop sequences: %s", cm_err_str(rc));
            gw_oai_req_free(&g->q);
            free(g);
            return CM_EINVAL;
        }
    }
    *out = g;
    return 0;
}

static void gen_free(gw_gen *g) {
    for (int i = 0; i < g->n; i++) {
        gw_gen_choice *c = &g->ch[i];
        free(c->toks);
        kept_free(c->kept);
        tok_out_free(&c->op);
        for (int k = 0; k < c->n_calls; k++) {
            free(c->calls[k].name);
            free(c->calls[k].args);
        }
        free(c->calls);
        free(c->prompt);
        free(c->embd);
    }
    free(g->gram);
    free(g->prompt);
    free(g->text);
    gw_oai_req_free(&g->q);
    free(g);
}

void gw_gen_hold(gw_gen *g) { g->holds++; }

void gw_gen_release(gw_gen *g) {
    if (--g->holds == 0 && g->state == GW_GEN_ENDED) gen_free(g);
}

/* The one place a generation ends: the backend lets go of it, the final usage is set, the sink
 * has its last call, and the memory goes unless something still holds it. */
static void gen_end(gw_gen *g, const gw_oai_err *err) {
    if (g->state == GW_GEN_ENDED) return;
    int was = g->state;
    g->state = GW_GEN_ENDED;
    if (g->t_start) g->env->inflight--;
    if (was == GW_GEN_RUNNING) g->env->backend.ops->detach(g->env->backend.impl, g);
    uint64_t now = uv_hrtime();
    g->usage.completion_tokens = 0;
    for (int i = 0; i < g->n; i++) {
        g->usage.completion_tokens += g->ch[i].n_toks;
        if (!g->ch[i].t_end) g->ch[i].t_end = now;
    }
    g->usage.cached_tokens = g->cached;
    g->sink->end(g, err);
    if (!g->holds) gen_free(g);
}

void gw_gen_cancel(gw_gen *g) {
    if (g->state == GW_GEN_ENDED) return;
    g->cancelled = 1;
    gen_end(g, NULL);
}

void gw_gen_error(gw_gen *g, const gw_oai_err *err) { gen_end(g, err); }

/* Ends g with an error made of its parts and a printf-style message. */
static void vfail(gw_gen *g, int status, const char *type, const char *param, const char *code, const char *fmt,
                  va_list ap) {
    gw_oai_err e;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    gw_oai_err_set(&e, status, type, param, code, "%s", msg);
    gen_end(g, &e);
}

void gw_gen_fail(gw_gen *g, int status, const char *type, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(g, status, type, NULL, code, fmt, ap);
    va_end(ap);
}

/* ---- output ------------------------------------------------------------------------------ */

/* Content text for the sink (and the kept output). Returns 0 or CM_ENOMEM (the kept output lost it). */
static int out_text(gw_gen *g, int i, const char *text, size_t len, const gw_oai_tok *toks, int n_toks) {
    int rc = 0;
    if (g->keep) {
        gw_gen_choice *c = &g->ch[i];
        if (!c->kept && !(c->kept = calloc(1, sizeof *c->kept))) return CM_ENOMEM;
        rc = kept_add(c->kept, text, len, toks, n_toks, g->keep & GW_GEN_KEEP_LOGPROBS);
    }
    if (g->sink->text) g->sink->text(g, i, text, len, toks, n_toks);
    return rc;
}

/* ---- the output parser's events (chat replies: reasoning and tool calls) ---- */

static void op_content(void *ud, const char *s, size_t n) {
    gw_gen_choice *c = ud;
    if (out_text(c->g, c->idx, s, n, c->ptoks, c->pn)) c->oom = 1;
    c->ptoks = NULL;
    c->pn = 0;
}

static void op_reasoning(void *ud, const char *s, size_t n) {
    gw_gen_choice *c = ud;
    gw_gen *g = c->g;
    if (g->keep) {
        if (!c->kept && !(c->kept = calloc(1, sizeof *c->kept))) { c->oom = 1; return; }
        if (buf_add(&c->kept->rs, &c->kept->rlen, &c->kept->rcap, s, n)) c->oom = 1;
    }
    if (g->sink->reasoning) g->sink->reasoning(g, c->idx, s, n);
}

static void op_begin(void *ud, int k, const char *name, size_t n) {
    gw_gen_choice *c = ud;
    gw_gen *g = c->g;
    if (grow((void **)&c->calls, &c->cap_calls, c->n_calls + 1, sizeof *c->calls)) { c->oom = 1; return; }
    gw_gen_call *call = &c->calls[c->n_calls++];
    memset(call, 0, sizeof *call);
    gw_oai_make_id(call->id, sizeof call->id, "call_");
    if (!(call->name = malloc(n + 1))) { c->oom = 1; return; }
    memcpy(call->name, name, n);
    call->name[n] = 0;
    if (g->sink->call) g->sink->call(g, c->idx, k, call->id, call->name, NULL, 0, 0);
}

static void op_args(void *ud, int k, const char *s, size_t n) {
    gw_gen_choice *c = ud;
    gw_gen *g = c->g;
    if (k < 0 || k >= c->n_calls) return;
    if (buf_add(&c->calls[k].args, &c->calls[k].len, &c->calls[k].cap, s, n)) { c->oom = 1; return; }
    if (g->sink->call) g->sink->call(g, c->idx, k, NULL, NULL, s, n, 0);
}

static void op_end(void *ud, int k) {
    gw_gen_choice *c = ud;
    gw_gen *g = c->g;
    if (k < 0 || k >= c->n_calls) return;
    c->calls[k].ended = 1;
    if (!c->calls[k].args && buf_add(&c->calls[k].args, &c->calls[k].len, &c->calls[k].cap, "", 0)) c->oom = 1;
    if (g->sink->call) g->sink->call(g, c->idx, k, NULL, NULL, NULL, 0, 1);
    if (!g->q.parallel_tool_calls) c->call_stop = 1;
}

static const tok_out_cb op_cb = { op_content, op_reasoning, op_begin, op_args, op_end };

/* Text through choice i's output parser when it has one, else straight to the sink. */
static int emit(gw_gen *g, int i, const char *text, size_t len, const gw_oai_tok *toks, int n_toks) {
    gw_gen_choice *c = &g->ch[i];
    if (!c->op_on || c->op_ended) return out_text(g, i, text, len, toks, n_toks);
    c->ptoks = toks;
    c->pn = n_toks;
    int rc = tok_out_feed(&c->op, text, len);
    if (c->pn) rc |= out_text(g, i, "", 0, c->ptoks, c->pn); /* logprobs of text the parser holds or took */
    c->ptoks = NULL;
    c->pn = 0;
    return rc || c->oom ? CM_ENOMEM : 0;
}

/* Releases text through choice i's stop matcher to the sink. Returns 1 when a stop string
 * matched, 0 when not, CM_ENOMEM when the kept output could not grow. */
static int deliver(gw_gen *g, int i, const char *txt, size_t len, const gw_oai_tok *toks, int n_toks) {
    char out[PIECE_MAX + TOK_STOP_MAX_LEN];
    int hit = -1, rc = 0;
    size_t n = 0;
    while (len || n_toks) { /* feed in slices the buffer can take */
        size_t take = len > PIECE_MAX ? PIECE_MAX : len;
        if (tok_stop_feed(&g->ch[i].st, txt, take, out, sizeof out, &n, &hit)) return 0;
        int last = take == len;
        if (n || (last && n_toks)) rc |= emit(g, i, out, n, last ? toks : NULL, last ? n_toks : 0);
        txt += take;
        len -= take;
        if (last) break;
    }
    return rc ? rc : hit >= 0;
}

/* Choice i is complete: the parser gives up what it held, the sink hears it, and the generation
 * ends with its last choice. */
static void finish_choice(gw_gen *g, int i, int finish) {
    gw_gen_choice *c = &g->ch[i];
    if (c->op_on && !c->op_ended) {
        c->op_ended = 1;
        tok_out_end(&c->op);
    }
    c->finish = finish;
    c->t_end = uv_hrtime();
    if (g->sink->finish) g->sink->finish(g, i, finish);
    if (--g->n_open == 0) gen_end(g, NULL);
}

static int is_stop_id(const gw_gen *g, int32_t id) {
    for (int k = 0; k < g->n_stop_ids; k++)
        if (g->stop_ids[k] == id) return 1;
    return 0;
}

void gw_gen_token(gw_gen *g, int i, const struct shm_tok *t, const struct shm_top *top) {
    if (g->state != GW_GEN_RUNNING || i < 0 || i >= g->n || g->ch[i].finish) return; /* after a stop string: until our CANCEL lands */
    gw_gen_choice *c = &g->ch[i];
    if (t->seq != c->next_seq) {
        gw_gen_fail(g, 500, "server_error", "token_stream_error",
                    "token %u of choice %d arrived where %u was expected (lost or duplicated output)", t->seq, i, c->next_seq);
        return;
    }
    c->next_seq++;
    if (grow((void **)&c->toks, &c->cap_toks, c->n_toks + 1, sizeof *c->toks)) {
        gw_gen_fail(g, 500, "server_error", NULL, "out of memory");
        return;
    }
    c->toks[c->n_toks++] = t->token;
    uint64_t now = uv_hrtime();
    if (!c->t_first) c->t_first = now;
    else if (g->env->met) gw_met_itl(g->env->met, (double)(now - c->t_last) * 1e-9);
    c->t_last = now;
    /* text: none for the stop id that ends the sequence (as arka generate prints none); a
     * control token the output parser reads gives its text */
    char txt[PIECE_MAX];
    size_t n = 0;
    int marker = 0;
    for (int k = 0; c->op_on && k < g->env->n_markers; k++) marker |= g->env->markers[k] == t->token;
    if (marker) {
        const char *mt = tok_text(g->env->vocab, t->token);
        n = mt ? strlen(mt) : 0;
        if (n > sizeof txt) n = 0;
        if (n) memcpy(txt, mt, n);
    } else if (is_stop_id(g, t->token) || tok_detok_push(&c->dt, t->token, txt, sizeof txt, &n)) n = 0;
    gw_oai_tok lt;
    gw_oai_top tops[SHM_MAX_TOP_LOGPROBS];
    int n_toks = 0;
    if (g->sp.logprobs) {
        const tok_vocab *v = g->env->vocab;
        lt.text = tok_piece_ref(v, t->token, &lt.len);
        if (!lt.text) lt.text = "", lt.len = 0;
        lt.logprob = (t->flags & SHM_TOK_LOGPROB) ? t->logprob : 0.0f;
        lt.n_top = t->n_top < g->sp.top_logprobs ? t->n_top : g->sp.top_logprobs;
        for (int k = 0; k < lt.n_top; k++) {
            tops[k].text = tok_piece_ref(v, top[k].token, &tops[k].len);
            if (!tops[k].text) tops[k].text = "", tops[k].len = 0;
            tops[k].logprob = top[k].logprob;
        }
        lt.top = tops;
        n_toks = 1;
    }
    /* stop strings are looked for from the min_tokens-th token's text on */
    int rc = c->n_toks < (int64_t)g->sp.min_tokens ? emit(g, i, txt, n, n_toks ? &lt : NULL, n_toks)
                                                    : deliver(g, i, txt, n, n_toks ? &lt : NULL, n_toks);
    if (rc < 0) {
        gw_gen_fail(g, 500, "server_error", NULL, "out of memory");
    } else if (rc || c->call_stop) { /* a stop string, or one call was asked for: the executor need not go on */
        g->env->backend.ops->stop(g->env->backend.impl, g, i);
        finish_choice(g, i, SHM_FINISH_STOP);
    }
}

void gw_gen_embedding(gw_gen *g, int i, const struct shm_embed *em) {
    if (g->state != GW_GEN_RUNNING || i < 0 || i >= g->n || g->ch[i].finish) return;
    gw_gen_choice *c = &g->ch[i];
    if (c->embd || (int)em->n_embd != g->env->n_embd) {
        gw_gen_fail(g, 500, "server_error", "executor_error", "input %d: an embedding of %u values where %d were expected", i,
                    em->n_embd, c->embd ? 0 : g->env->n_embd);
        return;
    }
    if (!(c->embd = malloc(sizeof(float) * em->n_embd))) {
        gw_gen_fail(g, 500, "server_error", NULL, "out of memory");
        return;
    }
    memcpy(c->embd, em->v, sizeof(float) * em->n_embd);
}

void gw_gen_admitted(gw_gen *g, int i, const struct shm_tok_admit *a) {
    if (g->state != GW_GEN_RUNNING || i < 0 || i >= g->n) return;
    g->ch[i].queue_ns = (int64_t)a->queue_ns;
    if (i == 0) g->cached = (int)a->cached_prompt_tokens;
}

void gw_gen_choice_done(gw_gen *g, int i, const struct shm_done *d) {
    if (g->state != GW_GEN_RUNNING || i < 0 || i >= g->n || g->ch[i].finish) return;
    gw_gen_choice *c = &g->ch[i];
    if (d->finish == SHM_FINISH_ERROR || d->finish == SHM_FINISH_CANCELLED) {
        /* an ERROR record normally came first and failed the generation; a cancel we did not send */
        gw_gen_fail(g, 500, "server_error", "executor_error", "the executor ended choice %d (%s)", i,
                    d->finish == SHM_FINISH_ERROR ? "error" : "cancelled");
        return;
    }
    if (g->q.kind == GW_OAI_EMBEDDINGS) {
        if (!c->embd) gw_gen_fail(g, 500, "server_error", "executor_error", "input %d ended without its embedding", i);
        else finish_choice(g, i, (int)d->finish);
        return;
    }
    if (d->completion_tokens != (uint32_t)c->n_toks) {
        gw_gen_fail(g, 500, "server_error", "token_stream_error", "choice %d: %u tokens announced, %d received", i,
                    d->completion_tokens, c->n_toks);
        return;
    }
    if (i == 0) g->cached = (int)d->cached_prompt_tokens;
    char txt[8], out[TOK_STOP_MAX_LEN + 8];
    size_t n = 0, m = 0;
    int rc = 0;
    if (tok_detok_flush(&c->dt, txt, sizeof txt, &n) == 0 && n) rc = deliver(g, i, txt, n, NULL, 0);
    if (rc > 0) {
        finish_choice(g, i, SHM_FINISH_STOP);
        return;
    }
    if (rc == 0 && tok_stop_flush(&c->st, out, sizeof out, &m) == 0 && m) rc = emit(g, i, out, m, NULL, 0);
    if (rc < 0) gw_gen_fail(g, 500, "server_error", NULL, "out of memory");
    else finish_choice(g, i, (int)d->finish);
}

/* ---- start: checks, the threadpool, submit ------------------------------------------------ */

static int refuse(gw_gen *g, int rc, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Ends g with an error (server_error from 500 up, invalid_request_error below) and returns rc. */
static int refuse(gw_gen *g, int rc, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(g, status, status >= 500 ? "server_error" : "invalid_request_error", param, code, fmt, ap);
    va_end(ap);
    return rc;
}

/* Sets the preparation's error (threadpool side; work_done ends the generation with it). */
static void werror(gw_gen *g, int rc, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void werror(gw_gen *g, int rc, int status, const char *param, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g->wrc = rc;
    gw_oai_err_set(&g->werr, status, status >= 500 ? "server_error" : "invalid_request_error", param, code, "%s", msg);
}

/* A growing key for the grammar cache. */
typedef struct gkey { char *s; size_t n, cap; int oom; } gkey;
static void key_add(gkey *k, const char *s) {
    size_t l = s ? strlen(s) + 1 : 1; /* each part NUL-terminated: parts cannot run together */
    if (k->oom) return;
    if (buf_add(&k->s, &k->n, &k->cap, s ? s : "", l - 1) || buf_add(&k->s, &k->n, &k->cap, "\x1f", 1)) k->oom = 1;
}

/* The grammar program the request's output must follow, compiled (or taken from the cache):
 * a GBNF grammar as given; else a JSON schema or json_object, the calls of tool_choice
 * required / named (calls or JSON when both tools and a format are asked), wrapped in the
 * reasoning a thinking template lets the model write first. Returns 0 (g->gram NULL when the
 * request has no such constraint) or sets the preparation's error. */
static int prepare_grammar(gw_gen *g) {
    const gw_gen_env *env = g->env;
    const gw_oai_req *q = &g->q;
    const char *fparam = q->kind == GW_OAI_RESPONSES ? "text.format" : "response_format";
    int chat = q->kind == GW_OAI_CHAT || q->kind == GW_OAI_RESPONSES;
    int tools_on = chat && q->n_tools && q->tool_choice != GW_TC_NONE;
    int force = tools_on && (q->tool_choice == GW_TC_REQUIRED || q->tool_choice == GW_TC_NAMED);
    int json = q->fmt == GW_FMT_JSON_OBJECT || q->fmt == GW_FMT_JSON_SCHEMA;
    if (tools_on && env->tool_fmt == TOK_TOOLS_NONE) {
        werror(g, CM_EINVAL, 400, "tools", "tool_format_unknown",
               "This model's chat template writes no tool calls that could be parsed; start the server with --tool-parser "
               "hermes|llama3|mistral (the format the model was trained on).");
        return -1;
    }
    if (q->fmt == GW_FMT_GRAMMAR && tools_on) {
        werror(g, CM_EINVAL, 400, "grammar", NULL, "'grammar' cannot be combined with tools (set tool_choice to 'none').");
        return -1;
    }
    if (q->fmt != GW_FMT_GRAMMAR && !force && !json) return 0;
    int think = chat && env->reasoning && tok_chat_thinks(env->chat) && q->fmt != GW_FMT_GRAMMAR;
    int mode = !think ? 0 : g->in_reasoning ? 2 : 1; /* reasoning before the body: none, optional, already open */
    gkey k = { 0 };
    char num[64];
    snprintf(num, sizeof num, "v1 %d %d %d %d %d", q->fmt, force ? q->tool_choice : -1, json, q->parallel_tool_calls, mode);
    key_add(&k, num);
    key_add(&k, q->grammar);
    key_add(&k, q->schema_json);
    snprintf(num, sizeof num, "%d", env->tool_fmt);
    key_add(&k, num);
    if (force || (tools_on && json)) {
        key_add(&k, q->tool_choice_name);
        for (int i = 0; i < q->n_tools; i++) {
            key_add(&k, q->tools[i].name);
            key_add(&k, q->tools[i].params_json);
        }
    }
    if (k.oom) { free(k.s); werror(g, CM_ENOMEM, 500, NULL, NULL, "out of memory"); return -1; }
    if (env->gcache && tok_gram_cache_get(env->gcache, k.s, k.n, &g->gram, &g->gram_len) == 0) {
        free(k.s);
        return 0;
    }
    char err[600] = "";
    const char *param = fparam;
    int rc = 0;
    tok_gbnf d;
    tok_gbnf_init(&d);
    const char *src;
    size_t src_len;
    if (q->fmt == GW_FMT_GRAMMAR) {
        src = q->grammar;
        src_len = strlen(q->grammar);
        param = "grammar";
    } else {
        if (json) {
            rc = q->fmt == GW_FMT_JSON_SCHEMA && q->schema_json
                     ? tok_gbnf_schema(&d, "body-json", q->schema_json, strlen(q->schema_json), err, sizeof err)
                     : tok_gbnf_json(&d, "body-json", 1);
        }
        if (!rc && (force || (tools_on && json))) {
            tok_tool_fn *fns = calloc((size_t)q->n_tools, sizeof *fns);
            int nf = 0;
            for (int i = 0; fns && i < q->n_tools; i++)
                if (q->tool_choice != GW_TC_NAMED || !strcmp(q->tools[i].name, q->tool_choice_name))
                    fns[nf++] = (tok_tool_fn){ q->tools[i].name, q->tools[i].params_json,
                                               q->tools[i].params_json ? strlen(q->tools[i].params_json) : 0 };
            rc = fns ? tok_tools_gbnf(&d, "body-calls", env->tool_fmt, fns, nf, q->parallel_tool_calls, env->vocab, err, sizeof err)
                     : CM_ENOMEM;
            if (rc == CM_EINVAL) param = "tools";
            free(fns);
        }
        if (!rc) {
            tok_gbnf_add(&d, "body ::= %s\n", force ? "body-calls" : tools_on ? "body-calls | body-json" : "body-json");
            if (mode) {
                tok_gbnf_until(&d, "think", "</think>");
                tok_gbnf_add(&d, "think-end ::= [ \\t\\n]{0,4}\n");
                tok_gbnf_add(&d, mode == 2 ? "root ::= think think-end body\n" : "root ::= ( \"<think>\" think think-end )? body\n");
            } else {
                tok_gbnf_add(&d, "root ::= body\n");
            }
            if (d.oom) rc = CM_ENOMEM;
        }
        src = d.s;
        src_len = d.len;
    }
    if (!rc) rc = tok_gram_compile(src, src_len, env->vocab, &g->gram, &g->gram_len, err, sizeof err);
    tok_gbnf_free(&d);
    if (!rc && g->gram_len > SHM_MAX_GRAMMAR) {
        snprintf(err, sizeof err, "the compiled grammar is %zu bytes, more than the %u an executor takes", g->gram_len, SHM_MAX_GRAMMAR);
        rc = CM_ETOOBIG;
    }
    if (rc) {
        free(g->gram);
        g->gram = NULL;
        free(k.s);
        if (rc == CM_ENOMEM) werror(g, rc, 500, NULL, NULL, "out of memory");
        else werror(g, CM_EINVAL, 400, param, "invalid_grammar", "%s", err);
        return -1;
    }
    if (env->gcache) tok_gram_cache_put(env->gcache, k.s, k.n, g->gram, g->gram_len);
    free(k.s);
    return 0;
}

/* Embeddings: each input's tokens, with the model's BOS / EOS as its tokenizer adds them. */
static void prepare_embeddings(gw_gen *g) {
    const gw_gen_env *env = g->env;
    const gw_oai_req *q = &g->q;
    int nv = tok_n_vocab(env->vocab);
    for (int i = 0; i < g->n; i++) {
        gw_gen_choice *c = &g->ch[i];
        char param[32];
        snprintf(param, sizeof param, g->n > 1 ? "input[%d]" : "input", i);
        if (q->input_ids[i]) {
            for (int k = 0; k < q->n_input_ids[i]; k++)
                if (q->input_ids[i][k] < 0 || q->input_ids[i][k] >= nv) {
                    werror(g, CM_EINVAL, 400, param, NULL, "Invalid token id %d (the vocabulary has %d tokens).", q->input_ids[i][k], nv);
                    return;
                }
            if (!(c->prompt = malloc(sizeof(int32_t) * (size_t)q->n_input_ids[i]))) goto oom;
            memcpy(c->prompt, q->input_ids[i], sizeof(int32_t) * (size_t)q->n_input_ids[i]);
            c->n_prompt = q->n_input_ids[i];
            continue;
        }
        size_t len = strlen(q->inputs[i]);
        int cap = (int)(len < (size_t)1 << 28 ? len : (size_t)1 << 28) + 4, n = 0;
        if (!(c->prompt = malloc(sizeof(int32_t) * (size_t)cap))) goto oom;
        int bos = tok_add_bos(env->vocab) && tok_bos(env->vocab) >= 0, eos = tok_add_eos(env->vocab) && tok_eos(env->vocab) >= 0;
        if (bos) c->prompt[0] = tok_bos(env->vocab);
        int rc = tok_encode(env->vocab, q->inputs[i], len, 0, 0, c->prompt + bos, cap - bos - 1, &n);
        if (rc) {
            werror(g, rc, rc == CM_ENOMEM ? 500 : 400, param, NULL, "cannot tokenize the input: %s", cm_err_str(rc));
            return;
        }
        if (eos) c->prompt[bos + n] = tok_eos(env->vocab);
        c->n_prompt = bos + n + eos;
    }
    return;
oom:
    werror(g, CM_ENOMEM, 500, NULL, NULL, "out of memory");
}

/* Threadpool: render the chat template, tokenize, compile the grammar. Touches only g's input
 * (which nothing changes meanwhile), the immutable vocabulary and template, and the grammar
 * cache (thread-safe). */
static void work_prepare(uv_work_t *w) {
    gw_gen *g = w->data;
    const gw_gen_env *env = g->env;
    const gw_oai_req *q = &g->q;
    char err[512] = "";
    if (q->kind == GW_OAI_EMBEDDINGS) {
        prepare_embeddings(g);
        return;
    }
    int chat = q->kind == GW_OAI_CHAT || q->kind == GW_OAI_RESPONSES;
    const char *mparam = q->kind == GW_OAI_RESPONSES ? "input" : "messages";
    if (chat) {
        tok_chat_msg *m = calloc((size_t)(q->n_msgs ? q->n_msgs : 1), sizeof *m);
        size_t len;
        if (!m) {
            werror(g, CM_ENOMEM, 500, NULL, NULL, "out of memory");
            return;
        }
        for (int i = 0; i < q->n_msgs; i++)
            m[i] = (tok_chat_msg){ q->msgs[i].role, q->msgs[i].content, q->msgs[i].name, q->msgs[i].tool_call_id,
                                   q->msgs[i].tool_calls, q->msgs[i].reasoning };
        /* tool_choice none: the model is not told about the tools at all */
        int tools = q->n_tools && q->tool_choice != GW_TC_NONE;
        int rc = tok_chat_render_ex(env->chat, m, q->n_msgs, tools ? q->tools_json : NULL, tools ? q->tool_choice_json : NULL,
                                    q->template_kwargs_json, 1, &g->text, &len, err, sizeof err);
        free(m);
        if (rc) {
            const char *param = rc == CM_EINVAL && strstr(err, "chat_template_kwargs") ? "chat_template_kwargs" : mparam;
            if (rc == CM_ENOMEM || rc == CM_ETOOBIG)
                werror(g, rc, rc == CM_ENOMEM ? 500 : 400, param, NULL, "chat template: %s", err);
            else
                werror(g, rc, 400, param, rc == CM_ESTATE ? "chat_template_missing" : "chat_template_error", "%s", err);
            return;
        }
        /* the reply starts inside <think> when the prompt ends with it */
        while (len && (g->text[len - 1] == '\n' || g->text[len - 1] == ' ')) len--;
        g->in_reasoning = len >= 7 && !memcmp(g->text + len - 7, "<think>", 7);
    }
    if (!g->prompt) { /* completions with token ids came tokenized */
        const char *text = chat ? g->text : q->prompt ? q->prompt : "";
        size_t len = strlen(text);
        /* a template adds BOS as text (parsed as the special token); a completion prompt gets the
         * model's add_bos */
        int add_bos = chat ? 0 : tok_add_bos(env->vocab);
        int cap = (int)(len < (size_t)1 << 28 ? len : (size_t)1 << 28) + 4, n = 0;
        g->prompt = malloc((size_t)cap * sizeof *g->prompt);
        int rc = g->prompt ? tok_encode(env->vocab, text, len, add_bos, 1, g->prompt, cap, &n) : CM_ENOMEM;
        if (rc) {
            werror(g, rc, rc == CM_ENOMEM ? 500 : 400, chat ? mparam : "prompt", NULL, "cannot tokenize the prompt: %s", cm_err_str(rc));
            return;
        }
        g->n_prompt = n;
    }
    prepare_grammar(g);
}

static void work_done(uv_work_t *w, int status) {
    gw_gen *g = w->data;
    gw_gen_env *env = g->env;
    env->preparing--;
    if (g->state == GW_GEN_ENDED) { /* cancelled while on the threadpool */
        gw_gen_release(g);
        return;
    }
    g->holds--;
    free(g->text);
    g->text = NULL;
    if (status) {
        refuse(g, CM_EIO, 500, NULL, NULL, "request preparation was cancelled");
        return;
    }
    if (g->wrc) {
        gen_end(g, &g->werr);
        return;
    }
    int ctx = env->n_ctx, kind = g->q.kind;
    if (kind == GW_OAI_EMBEDDINGS) { /* each input within the context; nothing is sampled */
        int total = 0;
        for (int i = 0; i < g->n; i++) {
            if (g->ch[i].n_prompt >= ctx) {
                refuse(g, CM_ECTX, 400, g->n > 1 ? "input" : "input", "context_length_exceeded",
                       "Input %d is %d tokens; this model's maximum context length is %d tokens.", i, g->ch[i].n_prompt, ctx - 1);
                return;
            }
            total += g->ch[i].n_prompt;
        }
        g->n_prompt = total;
        g->sp.max_tokens = 1;
        g->n_stop_ids = 0;
        goto submit;
    }
    if (g->n_prompt < 1) {
        refuse(g, CM_EINVAL, 400, kind == GW_OAI_COMPLETION ? "prompt" : kind == GW_OAI_RESPONSES ? "input" : "messages", NULL,
               "The prompt is empty.");
        return;
    }
    if (g->gram && g->sp.ignore_eos) {
        refuse(g, CM_EINVAL, 400, "ignore_eos", NULL, "ignore_eos cannot be combined with a structured output (the grammar "
                                                     "ends the reply with the end-of-generation token).");
        return;
    }
    /* OpenAI's completions default to 16 tokens; chat runs to the context end */
    int64_t max = g->q.sp.max_tokens ? (int64_t)g->q.sp.max_tokens : kind == GW_OAI_COMPLETION ? 16 : 0;
    if (g->n_prompt >= ctx || (max > 0 && g->n_prompt + max > ctx)) {
        gw_oai_err e;
        gw_oai_err_context(&e, kind, ctx, g->n_prompt, max > 0 ? (int)max : 1);
        gen_end(g, &e);
        return;
    }
    g->sp.max_tokens = (uint32_t)(max > 0 ? max : ctx - g->n_prompt);
    if (g->sp.min_tokens > g->sp.max_tokens) {
        refuse(g, CM_EINVAL, 400, "min_tokens", NULL, "min_tokens must be less than or equal to max_tokens=%u, got %u.",
               g->sp.max_tokens, g->sp.min_tokens);
        return;
    }
    /* the end of generation is text/'s: its ids are the executors' stop ids, unless ignore_eos */
    _Static_assert(TOK_EOG_MAX <= SHM_MAX_STOP, "every end-of-generation id fits SUBMIT's stop ids");
    g->n_stop_ids = g->sp.ignore_eos ? 0 : tok_eog_ids(env->vocab, g->stop_ids, SHM_MAX_STOP);
    /* chat replies go through the output parser when tools or reasoning can show up in them */
    int chat = kind == GW_OAI_CHAT || kind == GW_OAI_RESPONSES;
    int tools = chat && g->q.n_tools && g->q.tool_choice != GW_TC_NONE;
    if (chat && (tools || env->reasoning))
        for (int i = 0; i < g->n; i++) {
            tok_out_init(&g->ch[i].op, tools ? env->tool_fmt : TOK_TOOLS_NONE, env->reasoning, g->in_reasoning, &op_cb, &g->ch[i]);
            g->ch[i].op_on = 1;
        }
submit:;
    gw_oai_err e;
    if (env->backend.ops->submit(env->backend.impl, g, &e)) {
        gen_end(g, &e);
        return;
    }
    g->state = GW_GEN_RUNNING;
    g->ran = 1;
    g->usage.prompt_tokens = g->n_prompt;
    if (g->sink->start) g->sink->start(g);
}

int gw_gen_start(gw_gen *g) {
    gw_gen_env *env = g->env;
    const gw_oai_req *q = &g->q;
    int nv = tok_n_vocab(env->vocab);
    const gw_backend_ops *ops = env->backend.ops;
    if (!(ops->accepting ? ops->accepting : ops->ready)(env->backend.impl))
        return refuse(g, CM_ESTATE, 503, NULL, "model_not_ready", "No executor is ready; try again shortly.");
    if (env->inflight >= env->max_requests)
        return refuse(g, CM_EFULL, 503, NULL, "overloaded", "The server has %d requests in flight; retry shortly.",
                      env->inflight);
    if ((q->kind == GW_OAI_EMBEDDINGS) != !!env->embed)
        return refuse(g, CM_EINVAL, 400, "model", "model_not_supported",
                      env->embed ? "This model is served for embeddings (--task embed): use /v1/embeddings."
                                 : "This model is served for generation: /v1/embeddings needs a server started with --task embed "
                                   "(or an embedding model, detected from its files).");
    if ((q->kind == GW_OAI_CHAT || q->kind == GW_OAI_RESPONSES) && !tok_chat_ready(env->chat))
        return refuse(g, CM_EINVAL, 400, q->kind == GW_OAI_CHAT ? "messages" : "input", "chat_template_missing",
                      "This model has no chat template, so chat requests cannot format messages; use "
                      "/v1/completions, or start the server with --chat-template NAME.");
    if (q->kind == GW_OAI_EMBEDDINGS && q->dimensions > env->n_embd)
        return refuse(g, CM_EINVAL, 400, "dimensions", NULL, "dimensions %d is more than the model's %d.", q->dimensions, env->n_embd);
    if (q->n_logit_bias > SHM_MAX_LOGIT_BIAS)
        return refuse(g, CM_EINVAL, 400, "logit_bias", NULL, "At most %d logit_bias entries are supported.",
                      SHM_MAX_LOGIT_BIAS);
    for (int i = 0; i < q->n_logit_bias; i++)
        if (q->logit_bias[i].token < 0 || q->logit_bias[i].token >= nv)
            return refuse(g, CM_EINVAL, 400, "logit_bias", NULL,
                          "Invalid token id %d in logit_bias (the vocabulary has %d tokens).", q->logit_bias[i].token, nv);
    for (int i = 0; i < q->n_prompt_tokens; i++)
        if (q->prompt_tokens[i] < 0 || q->prompt_tokens[i] >= nv)
            return refuse(g, CM_EINVAL, 400, "prompt", NULL, "Invalid token id %d in prompt (the vocabulary has %d tokens).",
                          q->prompt_tokens[i], nv);
    if (q->prompt_tokens) { /* the prompt is ids already: take them */
        g->prompt = g->q.prompt_tokens;
        g->n_prompt = g->q.n_prompt_tokens;
        g->q.prompt_tokens = NULL;
        g->q.n_prompt_tokens = 0;
    }
    g->state = GW_GEN_PREPARING;
    g->t_start = uv_hrtime();
    env->inflight++;
    env->preparing++;
    g->holds++; /* the threadpool's */
    g->work.data = g;
    if (uv_queue_work(env->loop, &g->work, work_prepare, work_done)) {
        env->preparing--;
        g->holds--;
        return refuse(g, CM_EIO, 500, NULL, NULL, "cannot queue the request");
    }
    return 0;
}

/* ---- the vocabulary for the executors' grammars -------------------------------------------- */

int gw_gen_vocab_init(gw_gen_env *env) {
    free(env->vb_off);
    free(env->vb_bytes);
    env->vb_off = NULL;
    env->vb_bytes = NULL;
    return tok_gram_vocab(env->vocab, &env->vb_off, &env->vb_bytes, &env->vb_n);
}

#define VOCAB_CHUNK (256u << 10) /* bytes of token text per VOCAB record */

int gw_gen_send_vocab(const gw_gen_env *env, struct shm_ring *r, uint32_t *next) {
    if (!env->vb_off) return CM_ESTATE;
    while (*next < (uint32_t)env->vb_n) {
        uint32_t first = *next, count = 0;
        while (first + count < (uint32_t)env->vb_n && count < 16384 &&
               env->vb_off[first + count + 1] - env->vb_off[first] <= VOCAB_CHUNK)
            count++;
        if (!count) count = 1; /* a token longer than a chunk goes alone */
        uint32_t off[16385], base = env->vb_off[first];
        for (uint32_t i = 0; i <= count; i++) off[i] = env->vb_off[first + i] - base;
        struct shm_vocab v = { (uint32_t)env->vb_n, first, count, off, env->vb_bytes + base, off[count] };
        int rc = shm_send_vocab(r, &v);
        if (rc) return rc;
        *next = first + count;
    }
    return 0;
}
