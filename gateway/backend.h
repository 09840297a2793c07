/* backend: what runs a generation's choices — the executors behind their rings
 * (gateway/pool.c), or a test's stand-in.
 *
 * A generation (gateway/gen.h) is handed over once it is prepared: prompt ids, sampling
 * parameters (the ring's struct shm_sampling), stop ids, logit bias, n choices. The backend
 * answers only through gw_gen_token, gw_gen_choice_done and gw_gen_fail, one record at a time,
 * and never holds a generation across one of those calls: any of them may end it.
 *
 * Contract (every implementation), loop thread only:
 * - submit never calls the generation back before it returns;
 * - after detach(g) returns nothing is called for g (g is about to be freed).
 */
#ifndef GW_BACKEND_H
#define GW_BACKEND_H

#include "gateway/openai.h"

typedef struct gw_gen gw_gen;

typedef struct gw_backend_ops {
    /* Sends g's choices to an executor (g->prompt, g->sp, g->stop_ids, g->q.logit_bias, g->n).
     * Returns 0, or a CM_E* code with e filled (503 no executor ready, 400 a prompt the ring
     * cannot carry): then nothing will be called back. */
    int  (*submit)(void *impl, gw_gen *g, gw_oai_err *e);
    /* Choice i of g needs no more tokens (a stop string matched in the gateway). */
    void (*stop)(void *impl, gw_gen *g, int i);
    /* g has ended (every choice finished, a failure or a cancel): stop its choices still
     * running and forget g. */
    void (*detach)(void *impl, gw_gen *g);
    /* 1 when an executor is up (what /health and /ready report). */
    int  (*ready)(void *impl);
    /* 1 when a generation submitted now will run: an executor is up, or one that was up is
     * restarting (the generation waits for it, as a resumed one does). NULL: as ready. */
    int  (*accepting)(void *impl);
} gw_backend_ops;

typedef struct gw_backend {
    const gw_backend_ops *ops;
    void *impl;
} gw_backend;

#endif
