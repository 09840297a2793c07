/* routes: the gateway's HTTP API on top of http.h, ws.h, openai.h and gen.h.
 *
 *   GET  /health, /ready       200 {"status":"ok"}; 503 {"status":"loading"} while no executor is ready,
 *                              {"status":"draining"} during shutdown
 *   GET  /v1/models            {"object":"list","data":[{id,object:"model",created,owned_by}]}
 *   GET  /v1/models/{id}       the model, or 404
 *   POST /v1/completions       OpenAI completions, JSON or SSE (stream: true)
 *   POST /v1/chat/completions  OpenAI chat completions, JSON or SSE
 *   POST /v1/responses         OpenAI Responses API, JSON or its SSE event stream (responses are not
 *                              stored: GET /v1/responses/{id} is a 404 saying so)
 *   POST /v1/embeddings        embeddings (a model served with --task embed)
 *   POST /tokenize, /detokenize  vLLM's: a prompt or messages to ids (and token strings), ids to text
 *   GET  /v1/ws                WebSocket with Realtime-style events (response.create / response.cancel)
 *   GET  /metrics              Prometheus text from cfg.metrics (when set)
 *   OPTIONS *                  CORS preflight (with cfg.cors_origin)
 *
 * Every response carries the client's x-request-id back (and, with auth, a generated one when
 * the client sent none); with cfg.cors_origin, the CORS headers. An API key comes in
 * "Authorization: Bearer KEY" or "x-api-key: KEY".
 *   anything else              404 (unknown path) or 405 (known path, wrong method), OpenAI-style body
 *
 * Every generation, whatever its transport, is one gw_gen (gateway/gen.h) made from the parsed
 * request, admitted (cfg.auth), started, and written out by the transport's sink, whose end
 * settles the quota claim with the generation's final usage and records its metrics.
 *
 * Loop thread only. The app borrows env, auth and met; destroy the app after the server has
 * closed.
 *
 *   gw_app_cfg ac; gw_app_cfg_default(&ac); ac.env = &env; ac.model_id = "m";
 *   gw_app *app; gw_app_create(&ac, &app);
 *   gw_http_cfg hc; gw_http_cfg_default(&hc); hc.handler = gw_app_handle; hc.ud = app;
 *   ... gw_server_create(loop, &hc, &srv); uv_run(...);
 *   gw_server_destroy(srv); gw_app_destroy(app);
 */
#ifndef GW_ROUTES_H
#define GW_ROUTES_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/auth.h"
#include "gateway/gen.h"
#include "gateway/http.h"

typedef struct gw_app_cfg {
    gw_gen_env *env;            /* what generations run on (vocabulary, template, context, backend) */
    const char *model_id;       /* the served model's id (/v1/models; requests must name it) */
    const char *fingerprint;    /* system_fingerprint in responses (NULL: null) */
    const char *owned_by;       /* /v1/models owned_by */
    uint32_t    ping_ms;        /* SSE ": ping" after this long without a byte (0: never) */
    int         ws_max_responses; /* concurrent responses per WebSocket */
    size_t      ws_max_message; /* bytes of one WebSocket message (close 1009 beyond) */
    uint32_t    ws_ping_ms;     /* WebSocket liveness (gw_ws_set_liveness): ping after this long silent */
    uint32_t    ws_idle_ms;     /* closed after this long without a message or a response running */
    uint32_t    ws_message_ms;  /* a message must arrive within this */
    /* GET /metrics: Prometheus text as a malloc'ed string (NULL: out of memory); unset: 404 */
    char     *(*metrics)(void *ud, size_t *len);
    void       *metrics_ud;
    /* Admission (API keys and quotas) in front of POST /v1/completions, /v1/chat/completions and
     * WebSocket response.create; borrowed, outlives the app. NULL: no auth, no rate-limit headers.
     * A claim is settled once, when its generation ends, with the prompt (when it reached an
     * executor) and every completion token received: also for cancelled and failed ones. */
    gw_auth    *auth;
    /* Metrics registry (serve.c's) for requests, per-tenant usage and HTTP counters; NULL: none. */
    struct gw_met *met;
    /* CORS (--cors-origin): "*" or a comma-separated list of origins allowed to call the API from a
     * browser. NULL: no CORS headers, and OPTIONS is answered 405 like any other method. */
    const char *cors_origin;
} gw_app_cfg;

typedef struct gw_app gw_app;

/* Defaults: fingerprint "fp_arka", owned_by "arka", ping every 15 s, 16 responses per socket,
 * 8 MiB messages, WebSocket ping 30 s, idle 300 s, message 60 s. Can't fail. */
void gw_app_cfg_default(gw_app_cfg *cfg);
/* Returns 0, CM_EINVAL (no env, backend or model id), CM_ENOMEM. */
int  gw_app_create(const gw_app_cfg *cfg, gw_app **out);
void gw_app_destroy(gw_app *app); /* accepts NULL */
/* The gw_handler_fn to install in gw_http_cfg (ud = the app). */
void gw_app_handle(gw_req *req, void *app);

/* gw_http_cfg.on_headers for this app: on the routes that generate (every POST under /v1/ and
 * the WebSocket upgrade) the API key is checked as soon as the headers are in, before a byte of
 * the body is read: 401 at once for a missing, malformed, unknown or revoked key (with Redis, the
 * request waits for the key store's answer); then 503 for a POST while the server drains or no
 * executor is ready. The full admission (limits) still runs once the body is parsed. */
int  gw_app_on_headers(gw_req *req, void *app);

/* gw_http_cfg.on_drain_deadline for this app: every generation still running ends now with 503
 * server_shutting_down (an SSE error event, a JSON 503, a WebSocket error + response.done). */
void gw_app_drain_deadline(void *app);

/* gw_http_cfg.on_response for this app (ud = the app): http_requests_total{route,status}, with
 * the route pattern ("/v1/models/{id}", "other"), never the raw path. */
void gw_app_on_response(void *app, const char *path, int status);

/* Generations not yet ended (HTTP and WebSocket); for tests. */
int  gw_app_active(const gw_app *app);

#endif
