/* gen: the production gw_backend — requests to executor processes through shared-memory rings.
 *
 * It owns the executors (one gw_exec each: spawned, supervised, restarted) and, for each request:
 * renders the chat template and tokenizes on the libuv threadpool (a long prompt never stalls
 * the loop), checks the context length, sends one SUBMIT per choice to the least-loaded ready
 * executor, and turns the TOKENS records that come back into text: an incremental detokenizer
 * (complete UTF-8 only) and a stop-string matcher per choice, logprobs when asked, a CANCEL to
 * the executor as soon as a stop string matched or the client went away. Per-request token
 * sequence numbers are checked: a lost or duplicated token fails the request instead of
 * silently corrupting it. When an executor dies, every request it held fails with a 500 and
 * the supervisor restarts it.
 *
 * Loop thread only (the threadpool work touches only the immutable vocabulary and template).
 *
 *   gw_gen_cfg c; gw_gen_cfg_default(&c);
 *   c.model_id = "stories260K"; c.vocab = v; c.chat = chat; c.n_ctx = 2048;
 *   c.exec = exec_cfg_template; c.exec_args = (const char *const *[]){args0, NULL}; c.n_exec = 1;
 *   gw_gen *g; gw_gen_start(loop, &c, &g);
 *   gw_backend be = gw_gen_backend(g);      ... routes serve through be ...
 *   gw_gen_stop(g, on_stopped, ud);         // executors drain; then on_stopped
 *   gw_gen_destroy(g);                      // after on_stopped
 */
#ifndef GW_GEN_H
#define GW_GEN_H

#include <stddef.h>

#include <uv.h>

#include "gateway/backend.h"
#include "gateway/exec.h"
#include "text/chat.h"
#include "text/tok.h"

#define GW_GEN_MAX_EXEC 16

typedef struct gw_gen gw_gen;

typedef struct gw_gen_cfg {
    const char      *model_id;   /* the served model's id (/v1/models, request "model") */
    const tok_vocab *vocab;      /* borrowed; outlives the gw_gen */
    const tok_chat  *chat;       /* borrowed; may have no template (chat requests then get a 400) */
    int              n_ctx;      /* positions per sequence, as the executors run them */
    gw_exec_cfg      exec;       /* template for every executor: bin, timeouts, ring sizes (callbacks and args are set here) */
    const char *const *exec_args[GW_GEN_MAX_EXEC]; /* per executor: NULL-terminated argument list (kept, must outlive) */
    int              n_exec;     /* 1..GW_GEN_MAX_EXEC */
    int              max_requests; /* requests in flight before new ones get 503 (default 4096) */
} gw_gen_cfg;

/* Defaults: max_requests 4096, exec from gw_exec_cfg_default(). Can't fail. */
void gw_gen_cfg_default(gw_gen_cfg *c);

/* Spawns the executors. Returns 0, CM_EINVAL, CM_ENOMEM or CM_EIO (gw_exec_start failed). */
int gw_gen_start(uv_loop_t *loop, const gw_gen_cfg *cfg, gw_gen **out);

/* The backend view for gw_app_cfg.backend. */
gw_backend gw_gen_backend(gw_gen *g);

/* Stops every executor (they drain) and calls on_stopped once all are down; requests still in
 * flight then fail. */
void gw_gen_stop(gw_gen *g, void (*on_stopped)(gw_gen *g, void *ud), void *ud);
void gw_gen_destroy(gw_gen *g); /* after on_stopped; accepts NULL */

/* Prometheus text (gateway/metrics.h: vLLM's names with the prefix arka: and a model_name label)
 * of the gateway's request metrics and every executor's stats block. Returns a malloc'ed
 * string or NULL. */
char *gw_gen_metrics(gw_gen *g, size_t *len);
/* Final usage hook (routes' gw_app_usage_final, for quota settlement): called exactly once for
 * every id submit accepted, after that request's last sink callback, or inside cancel(id) with
 * the tokens delivered so far. The prompt counts only when the request reached an executor. */
void gw_gen_set_usage_final(gw_gen *g, void (*fn)(void *ud, uint64_t id, const gw_oai_usage *u), void *ud);
/* The registry, for the HTTP and auth layers' own counters (gw_met_http, ...). */
struct gw_met *gw_gen_met(gw_gen *g);

/* Requests in flight (tokenizing, queued or running); for tests and logs. */
int gw_gen_inflight(const gw_gen *g);

#endif
