/* proc: the executor process (`arka executor`, spawned by `arka serve`, one per device).
 *
 * It attaches the shared-memory segment the gateway created (shm/), loads the model, and runs
 * the engine loop: drain SUBMIT/CANCEL records from the submit ring into the scheduler, run a
 * step, publish one TOKENS record per step (every sequence's new token, with a per-request
 * sequence number starting at 0, or at n_generated for a resumed generation) and a DONE per
 * finished request (an ERROR first when it failed), keep the heartbeat and the stats block current, and sleep on the submit ring's
 * eventfd when idle. It keeps no text and no sockets and uses neither libuv nor hiredis.
 *
 * Lifecycle: state LOADING while the model loads, READY once requests are taken, DRAINING
 * after SIGTERM/SIGINT (running requests finish; new ones get ERROR + DONE(error)), DEAD on
 * exit. A model that fails to load is reported as an executor-level ERROR record (req_id 0)
 * and exit code 1. The process dies with its parent (PR_SET_PDEATHSIG).
 *
 *   ex_proc_opts o; ex_proc_opts_default(&o);
 *   o.spec = "fd:3:4:5"; o.model = "m.gguf";
 *   return ex_proc_run(&o);   // from main only
 */
#ifndef EX_PROC_H
#define EX_PROC_H

#include "engine.h"

typedef struct ex_proc_opts {
    const char    *spec;      /* shm_seg_spec() attach spec */
    const char    *model;     /* GGUF file or safetensors directory */
    ex_engine_opts engine;    /* backend, threads, KV budget, limits */
    int            max_waiting; /* scheduler queue cap; 0 = 1024 */
    int            idle_ms;   /* heartbeat period while idle; 0 = 100 */
    int            no_prefix_cache; /* 1: no prefix cache (--no-prefix-cache) */
} ex_proc_opts;

void ex_proc_opts_default(ex_proc_opts *o);
/* Runs until drained after a termination signal or until the gateway goes away. Returns the
 * process exit code: 0 clean, 1 load or runtime failure, 2 bad options. */
int  ex_proc_run(const ex_proc_opts *o);

#endif
