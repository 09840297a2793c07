/* serve: `arka serve` put together (see serve.h). */
#include "gateway/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/auth.h"
#include "gateway/gen.h"
#include "gateway/pool.h"
#include "gateway/http.h"
#include "gateway/metrics.h"
#include "gateway/routes.h"
#include "text/chat.h"
#include "model/model.h"
#include "text/grammar.h"
#include "text/tok.h"
#include "text/tools.h"

void gw_serve_opts_default(gw_serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->backend = "cpu";
    o->devices = "0";
    o->log_level = "info";
    o->gpu_mem_fraction = 0.90;
    o->cuda_graph_budget_s = 60;
    o->max_resumes = 3;
    o->resume_timeout_s = 120;
    o->max_conns_per_ip = -1;
    o->drain_timeout_s = 30;
}

/* The server's parts. It owns the metrics registry: the app (HTTP counters, requests,
 * tenants), the generations (inter-token latency) and the pool (executor restarts) write
 * into it, and GET /metrics renders it after copying the executors' stats blocks. */
typedef struct srv {
    gw_pool   *pool;
    gw_server *http;
    gw_auth   *auth; /* NULL: auth off */
    gw_met    *met;
    gw_gen_env env;  /* the app keeps a pointer to it: lives as long as the loop */
    int        fatal; /* an executor could not start: shut down, exit 1 */
} srv;

static char *metrics_cb(void *ud, size_t *len) {
    srv *v = ud;
    if (v->auth) {
        gw_auth_stats st;
        gw_auth_stats_get(v->auth, &st);
        gw_met_auth_totals(v->met, st.redis_errors, st.fallback_admits);
    }
    if (v->http) {
        gw_server_stats hs;
        gw_server_stats_get(v->http, &hs);
        gw_met_http_server(v->met, hs.conns_open, hs.evicted, hs.conns_rejected, hs.buffered, hs.over_buffered);
    }
    int backlog = gw_pool_metrics(v->pool);
    gw_met_set_queued(v->met, (uint64_t)(v->env.preparing + backlog));
    gw_met_set_inflight(v->met, (uint64_t)v->env.inflight);
    return gw_met_render(v->met, len);
}

static void on_http_closed(gw_server *s, void *ud) {
    srv *v = ud;
    (void)s;
    CM_LOG_INFO("serve", "http closed; stopping executors", "in_flight=%d", v->env.inflight);
    gw_auth_shutdown(v->auth); /* Redis connection and timer: uv_run can then return */
    gw_pool_stop(v->pool, NULL, NULL);
}

/* An executor failed before it was ever ready (gw_pool_cfg.on_fatal): a restart would fail the
 * same way, so the server says why and stops. */
static void on_exec_fatal(gw_pool *p, void *ud, int idx, const char *why) {
    srv *v = ud;
    (void)p;
    fprintf(stderr, "arka serve: executor %d failed to start: %s\n", idx, why);
    v->fatal = 1;
    if (v->http) gw_server_shutdown(v->http);
    else gw_pool_stop(v->pool, NULL, NULL);
}

/* The served model id: the file or directory name without ".gguf", with characters that
 * would need escaping in JSON or Prometheus labels replaced. */
static void default_id(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path;
    for (size_t i = 0; i < n; i++)
        if (path[i] == '/') b = path + i + 1;
    size_t len = (size_t)(path + n - b);
    if (len > 5 && strncmp(b + len - 5, ".gguf", 5) == 0) len -= 5;
    if (len >= cap) len = cap - 1;
    for (size_t i = 0; i < len; i++) out[i] = (b[i] == '"' || b[i] == '\\' || (unsigned char)b[i] < 0x20) ? '_' : b[i];
    out[len] = 0;
}

/* 1 when host is a loopback address (127.0.0.0/8, ::1, localhost). */
static int is_loopback(const char *host) {
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 || strcmp(host, "localhost") == 0 ||
           strcmp(host, "[::1]") == 0;
}

/* The auth on/off rules (serve.h). Returns 0 with *on set, or 1 after printing why not. */
static int auth_decide(const gw_serve_opts *o, int *on) {
    int store = (o->keys_file && *o->keys_file) || (o->redis && *o->redis);
    *on = 0;
    if (o->no_auth) {
        if (store) CM_LOG_WARN("serve", "auth off (--no-auth): the key store is not used", "host=%s", o->host);
        if (!is_loopback(o->host))
            CM_LOG_WARN("serve", "auth off (--no-auth) on an address beyond loopback: anyone who can connect may generate",
                        "host=%s", o->host);
        else CM_LOG_INFO("serve", "auth off (--no-auth)", "host=%s", o->host);
        return 0;
    }
    if (store) {
        *on = 1;
        return 0;
    }
    if (!is_loopback(o->host)) {
        fprintf(stderr, "arka serve: --host %s listens beyond loopback, so API keys are required: give --keys-file FILE "
                        "(see `arka keys create`) or --redis redis://HOST:PORT, or --no-auth to serve without keys\n",
                o->host);
        return 1;
    }
    CM_LOG_INFO("serve", "auth off: loopback address and no key store (--keys-file or --redis turns it on)", "host=%s",
                o->host);
    return 0;
}

/* "0,1,3" -> device ordinals. Returns the count or -1. */
static int parse_devices(const char *s, int *dev, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        long d = strtol(s, &end, 10);
        if (end == s || d < 0 || d > 1023 || n == cap) return -1;
        dev[n++] = (int)d;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

int gw_serve_run(const gw_serve_opts *o) {
    char err[1024];
    if (!o->model || !*o->model) {
        fprintf(stderr, "arka serve: no model: give -m MODEL (a GGUF file or a Hugging Face directory)\n");
        return 1;
    }
    int devs[GW_POOL_MAX_EXEC], n_dev = 1;
    devs[0] = 0;
    int cuda = strcmp(o->backend, "cuda") == 0;
    if (!cuda && strcmp(o->backend, "cpu") != 0) {
        fprintf(stderr, "arka serve: unknown backend '%s' (cpu or cuda)\n", o->backend);
        return 1;
    }
    if (cuda && (n_dev = parse_devices(o->devices, devs, GW_POOL_MAX_EXEC)) < 1) {
        fprintf(stderr, "arka serve: --devices '%s': expected a comma-separated list of up to %d GPU ordinals\n", o->devices,
                GW_POOL_MAX_EXEC);
        return 1;
    }
    int auth_on;
    if (auth_decide(o, &auth_on)) return 1;
    uint8_t secret[256];
    size_t secret_len = 0;
    if (auth_on && gw_auth_secret_load(o->auth_secret, o->keys_file, o->keys_file && *o->keys_file, secret, sizeof secret,
                                       &secret_len, err, sizeof err)) {
        fprintf(stderr, "arka serve: %s\n", err);
        return 1;
    }
    /* what the gateway needs of the model: context length, vocabulary, chat template */
    mdl_model *m;
    if (mdl_load(o->model, &m, err, sizeof err)) {
        fprintf(stderr, "arka serve: %s\n", err);
        return 1;
    }
    int n_ctx = o->n_ctx > 0 ? o->n_ctx : m->cfg.n_ctx_train;
    /* embeddings: asked for, or detected from the files (they say how to pool) */
    const char *task = o->task && *o->task ? o->task : "auto";
    int embed = !strcmp(task, "embed") || (!strcmp(task, "auto") && m->cfg.pooling != MDL_POOL_NONE);
    int pooling = m->cfg.pooling != MDL_POOL_NONE ? m->cfg.pooling : MDL_POOL_LAST, normalize = m->cfg.pooling != MDL_POOL_NONE ? m->cfg.embd_normalize : 1;
    int n_embd = m->cfg.n_embd;
    mdl_free(m);
    if (strcmp(task, "auto") && strcmp(task, "embed") && strcmp(task, "generate")) {
        fprintf(stderr, "arka serve: --task '%s': expected auto, generate or embed\n", task);
        return 1;
    }
    if (n_ctx < 2) {
        fprintf(stderr, "arka serve: context length %d is too small\n", n_ctx);
        return 1;
    }
    tok_vocab *v;
    if (tok_load_file(o->model, &v, err, sizeof err)) {
        fprintf(stderr, "arka serve: tokenizer: %s\n", err);
        return 1;
    }
    tok_chat *chat;
    if (tok_chat_load(o->model, o->chat_template, v, &chat, err, sizeof err)) {
        fprintf(stderr, "arka serve: %s\n", err);
        tok_free(v);
        return 1;
    }
    char id[256];
    if (o->model_id && *o->model_id) snprintf(id, sizeof id, "%s", o->model_id);
    else default_id(o->model, id, sizeof id);
    if (!tok_chat_ready(chat))
        CM_LOG_WARN("serve", "no chat template: /v1/chat/completions answers 400 (use --chat-template NAME)", "model=%s", id);
    else CM_LOG_INFO("serve", "chat template", "source=%s", tok_chat_source(chat));
    int tool_fmt = o->tool_parser && *o->tool_parser ? tok_tools_parse(o->tool_parser) : tok_chat_tool_format(chat);
    const char *rp = o->reasoning_parser && *o->reasoning_parser ? o->reasoning_parser : "auto";
    int reasoning = !strcmp(rp, "auto") ? tok_chat_thinks(chat) : !strcmp(rp, "think") || !strcmp(rp, "qwen3") || !strcmp(rp, "deepseek_r1");
    if (tool_fmt < 0 || (!reasoning && strcmp(rp, "none") && strcmp(rp, "auto"))) {
        fprintf(stderr, "arka serve: %s\n", tool_fmt < 0 ? "--tool-parser: expected hermes, llama3, mistral or none"
                                                         : "--reasoning-parser: expected auto, think or none");
        tok_chat_free(chat);
        tok_free(v);
        return 1;
    }
    CM_LOG_INFO("serve", "output parsing", "tool_calls=%s reasoning=%s task=%s", tok_tools_name(tool_fmt), reasoning ? "think" : "none",
                embed ? "embed" : "generate");

    /* executors: the binary is this one */
    static char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "arka serve: cannot find the arka binary (/proc/self/exe)\n");
        tok_chat_free(chat);
        tok_free(v);
        return 1;
    }
    self[sl] = 0;
    enum { NARG = 32 };
    static char nums[GW_POOL_MAX_EXEC][8][24];
    static const char *args[GW_POOL_MAX_EXEC][NARG];
    gw_pool_cfg pc;
    gw_pool_cfg_default(&pc);
    pc.exec.bin = self;
    pc.n_exec = n_dev;
    pc.resume_max = o->max_resumes;
    pc.resume_wait_ms = (uint32_t)(o->resume_timeout_s * 1000);
    for (int k = 0; k < n_dev; k++) {
        const char **a = args[k];
        int i = 0;
        snprintf(nums[k][0], 24, "%d", devs[k]);
        snprintf(nums[k][1], 24, "%d", o->threads);
        snprintf(nums[k][2], 24, "%lld", (long long)o->kv_cache_mb);
        snprintf(nums[k][3], 24, "%d", n_ctx);
        snprintf(nums[k][4], 24, "%d", o->max_batch);
        snprintf(nums[k][5], 24, "%d", o->max_batch_tokens);
        snprintf(nums[k][6], 24, "%.9g", o->gpu_mem_fraction);
        snprintf(nums[k][7], 24, "%.9g", o->cuda_graph_budget_s);
        a[i++] = "-m", a[i++] = o->model, a[i++] = "--backend", a[i++] = o->backend;
        if (cuda) a[i++] = "--device", a[i++] = nums[k][0];
        a[i++] = "--threads", a[i++] = nums[k][1], a[i++] = "--kv-cache-mb", a[i++] = nums[k][2];
        a[i++] = "--ctx", a[i++] = nums[k][3], a[i++] = "--max-batch", a[i++] = nums[k][4];
        a[i++] = "--max-batch-tokens", a[i++] = nums[k][5], a[i++] = "--log-level", a[i++] = o->log_level;
        a[i++] = "--gpu-memory-fraction", a[i++] = nums[k][6], a[i++] = "--cuda-graph-budget-s", a[i++] = nums[k][7];
        if (o->cuda_plan) a[i++] = "--cuda-plan", a[i++] = o->cuda_plan;
        if (o->quantize) a[i++] = "--quantize", a[i++] = o->quantize;
        if (o->kv_cache_dtype) a[i++] = "--kv-cache-dtype", a[i++] = o->kv_cache_dtype;
        if (o->no_prefix_cache) a[i++] = "--no-prefix-cache";
        a[i] = NULL;
        pc.exec_args[k] = a;
    }

    uv_loop_t loop;
    uv_loop_init(&loop);
    srv s = { 0 };
    int rc = gw_met_create(id, n_ctx, &s.met);
    if (rc) {
        fprintf(stderr, "arka serve: cannot create the metrics registry: %s\n", cm_err_str(rc));
        uv_loop_close(&loop);
        tok_chat_free(chat);
        tok_free(v);
        return 1;
    }
    pc.met = s.met;
    pc.on_fatal = on_exec_fatal;
    pc.ud = &s;
    if (auth_on) {
        gw_auth_cfg auc;
        gw_auth_cfg_default(&auc);
        auc.keys_file = o->keys_file && *o->keys_file ? o->keys_file : NULL;
        auc.redis_url = o->redis && *o->redis ? o->redis : NULL;
        auc.secret = secret;
        auc.secret_len = secret_len;
        auc.fail_closed = o->redis_fail_closed;
        if ((rc = gw_auth_create(&loop, &auc, &s.auth))) {
            fprintf(stderr, "arka serve: cannot open the key store (%s%s): %s\n", auc.redis_url ? auc.redis_url : auc.keys_file,
                    rc == CM_EUNSUPPORTED ? ", this build has no hiredis" : "", cm_err_str(rc));
            uv_loop_close(&loop);
            gw_met_destroy(s.met);
            tok_chat_free(chat);
            tok_free(v);
            return 1;
        }
        CM_LOG_INFO("serve", "auth on", "store=%s", auc.redis_url ? auc.redis_url : auc.keys_file);
    }
    rc = gw_pool_start(&loop, &pc, &s.pool);
    gw_app *app = NULL;
    tok_gram_cache *gcache = NULL;
    if (rc == 0) {
        s.env = (gw_gen_env){ .loop = &loop, .vocab = v, .chat = chat, .n_ctx = n_ctx,
                              .max_requests = o->max_requests > 0 ? o->max_requests : 4096,
                              .backend = gw_pool_backend(s.pool), .met = s.met, .tool_fmt = tool_fmt,
                              .reasoning = reasoning, .embed = embed, .pooling = pooling, .normalize = normalize, .n_embd = n_embd };
        /* control tokens whose text the output parser needs (the detokenizer drops them) */
        const char *const *mk = tok_tools_markers(tool_fmt);
        for (int i = 0; mk[i] && s.env.n_markers < 8; i++) {
            int32_t t = tok_find(v, mk[i], strlen(mk[i]));
            if (t >= 0 && tok_type(v, t) == TOK_TYPE_CONTROL) s.env.markers[s.env.n_markers++] = t;
        }
        const char *think[] = { "<think>", "</think>" };
        for (int i = 0; i < 2 && reasoning; i++) {
            int32_t t = tok_find(v, think[i], strlen(think[i]));
            if (t >= 0 && tok_type(v, t) == TOK_TYPE_CONTROL && s.env.n_markers < 8) s.env.markers[s.env.n_markers++] = t;
        }
        if ((rc = tok_gram_cache_create(64, &gcache)) || (rc = gw_gen_vocab_init(&s.env)))
            snprintf(err, sizeof err, "cannot build the grammar cache or vocabulary table: %s", cm_err_str(rc));
        s.env.gcache = gcache;
        gw_app_cfg ac;
        gw_app_cfg_default(&ac);
        ac.env = &s.env;
        ac.model_id = id;
        ac.metrics = metrics_cb;
        ac.metrics_ud = &s;
        ac.auth = s.auth;
        ac.met = s.met;
        ac.cors_origin = o->cors_origin;
        if (!rc && (rc = gw_app_create(&ac, &app))) snprintf(err, sizeof err, "cannot create the app: %s", cm_err_str(rc));
        gw_http_cfg hc;
        gw_http_cfg_default(&hc);
        hc.host = o->host;
        hc.port = o->port;
        if (o->max_conns > 0) hc.max_conns = o->max_conns;
        if (o->max_conns_per_ip >= 0) hc.max_conns_per_ip = o->max_conns_per_ip;
        if (o->max_buffered_mb > 0) hc.max_buffered = (size_t)o->max_buffered_mb << 20;
        hc.drain_timeout_ms = (uint32_t)(o->drain_timeout_s * 1000);
        hc.handler = gw_app_handle;
        hc.on_headers = gw_app_on_headers;
        hc.on_drain_deadline = gw_app_drain_deadline;
        hc.on_response = gw_app_on_response;
        hc.ud = app;
        if (!rc && (rc = gw_server_create(&loop, &hc, &s.http)))
            snprintf(err, sizeof err, "cannot listen on %s:%d (%s)", o->host, o->port, cm_err_str(rc));
        if (!rc) {
            gw_server_on_closed(s.http, on_http_closed, &s);
            gw_server_handle_signals(s.http);
            CM_LOG_INFO("serve", "listening", "url=http://%s:%d model=%s backend=%s executors=%d ctx=%d", o->host,
                        gw_server_port(s.http), id, o->backend, n_dev, n_ctx);
            fprintf(stderr, "arka serve: listening on http://%s:%d (model %s, %s backend, %d executor%s); Ctrl-C stops\n",
                    o->host, gw_server_port(s.http), id, o->backend, n_dev, n_dev > 1 ? "s" : "");
        }
    } else {
        snprintf(err, sizeof err, "cannot start the executors: %s", cm_err_str(rc));
    }
    if (rc) {
        fprintf(stderr, "arka serve: %s\n", err);
        gw_auth_shutdown(s.auth);
        if (s.pool) gw_pool_stop(s.pool, NULL, NULL);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    gw_server_destroy(s.http);
    gw_app_destroy(app);
    gw_auth_destroy(s.auth);
    uv_run(&loop, UV_RUN_NOWAIT); /* handles closed by the last destroys */
    gw_pool_destroy(s.pool);
    gw_met_destroy(s.met);
    uv_loop_close(&loop);
    tok_gram_cache_destroy(gcache);
    free(s.env.vb_off);
    free(s.env.vb_bytes);
    tok_chat_free(chat);
    tok_free(v);
    return rc || s.fatal ? 1 : 0;
}
