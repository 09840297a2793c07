/* backend: the interface between the gateway's routes and whatever generates text.
 *
 * The routes (routes.c) turn HTTP and WebSocket requests into gw_oai_req values and hand them to
 * a gw_backend; the backend reports progress through a gw_gen_sink. The production backend sends
 * the requests through shared-memory rings to executor processes (tokenizing, applying the chat
 * template, detokenizing and matching stop strings in the gateway). This header only fixes the
 * contract so the HTTP layer can be built and tested on its own.
 *
 * Contract (every implementation):
 * - everything runs on the loop thread;
 * - submit never calls a sink callback before it returns; afterwards callbacks come from the loop
 *   in this order: on_start once (the prompt fits and generation begins), then any number of
 *   on_text and on_finish (once per choice), then on_done once; or on_error once at any point,
 *   which ends the request (before on_start it becomes an HTTP error status);
 * - after cancel(id) returns, no callback runs for id; cancelling an unknown or finished id is a
 *   no-op;
 * - the request passed to submit is borrowed for the call only.
 */
#ifndef GW_BACKEND_H
#define GW_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/openai.h"

typedef struct gw_gen_sink {
    /* The prompt was accepted: prompt_tokens tokens (cached_tokens of them from a prefix cache). */
    void (*on_start)(void *ud, int prompt_tokens, int cached_tokens);
    /* New text for choice index (complete UTF-8, possibly empty) and, when logprobs were asked,
     * the tokens it came from. Pointers are valid during the call only. */
    void (*on_text)(void *ud, int index, const char *text, size_t len, const gw_oai_tok *toks, int n_toks);
    /* Choice index is complete (finish: enum shm_finish). */
    void (*on_finish)(void *ud, int index, int finish);
    /* Every choice is complete; the last callback. */
    void (*on_done)(void *ud, const gw_oai_usage *usage);
    /* The request failed; the last callback. e->status is the HTTP status to answer with
     * (400 e.g. context length, 429/503 overloaded, 500 executor failure). */
    void (*on_error)(void *ud, const gw_oai_err *e);
} gw_gen_sink;

typedef struct gw_backend_ops {
    /* Starts q. Returns 0 and sets *id, or a negative CM_E* code with *e filled (then nothing will
     * be called back). */
    int (*submit)(void *impl, const gw_oai_req *q, const gw_gen_sink *sink, void *ud, uint64_t *id, gw_oai_err *e);
    void (*cancel)(void *impl, uint64_t id);
    /* 1 when requests can be served (a model is loaded and an executor is up). */
    int (*ready)(void *impl);
    /* Id of the served model (what /v1/models lists and requests must name). */
    const char *(*model_id)(void *impl);
} gw_backend_ops;

typedef struct gw_backend {
    const gw_backend_ops *ops;
    void *impl;
} gw_backend;

#endif
