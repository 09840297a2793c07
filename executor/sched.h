/* sched: continuous batching over an engine. Each step, waiting requests are admitted first
 * (in executor/fair.h's order: priority, then fair share between tenants, then arrival) while
 * running slots, KV blocks and the step's token budget allow; then the running sequences get
 * their next tokens within the budget — every decoding sequence one token (oldest first), then
 * the next prompt chunk of each prefilling one, in fair.h's order — one forward pass runs over
 * the whole batch, and every sequence whose context is fully in the cache samples its next
 * token.
 *
 * Between tenants, so that one flooding the executor cannot delay another's first token by more
 * than about a step: a step that carries a prompt chunk of one class (the more urgent priority,
 * then the tenant further under its share) carries no prompt chunk of a later class; and while
 * a tenant further under its share has requests running, the prompt chunks of the tenants over
 * their share may make a step cost at most twice what it would without them: they get as many
 * tokens as the step's other tokens plus those that cost as much as a step's fixed part
 * (fitted, a + b * tokens, to the forward passes' times; opts.fixed_tokens sets it), and at
 * least a sixteenth of the budget.
 *
 * The decode guard (opts.stall_max > 0, `--max-decode-stall`; off unless set: `arka serve
 * --backend cuda` sets 1.8): a step that carries decoding sequences may cost at most stall_max
 * times what its decodes alone would, by a cost model of the forward pass, k . (1, tokens,
 * positions read, attention work) (positions read: each sequence's context, its K/V pass over
 * memory; attention work: each token times the positions it attends to), fitted to the forward
 * passes' times. It cuts the prompts longer than a step's token budget (a shorter prompt costs
 * the decodes one step at most). Each such prompt's chunk gets the tokens that fit what is left
 * of that bound (fewer as its context grows), at least a block, one block until the model is
 * fitted, and at most twice its previous chunk plus a block (the fit learns a chunk's cost from
 * the sizes it has seen). The decodes' cost the bound multiplies is their measured time alone
 * where that is recent and below the fit's: every 16th step of a run of such steps leaves the
 * cut prompts' chunks out to measure it (the fit shares one positions term between decodes and
 * chunks, and overstated the decodes by up to a third beside a 120k-token prompt), less the
 * average amount by which recent guarded steps ran past their predicted cost. A step without
 * decodes takes whole chunks up to the budget. It trades the long prompt's time to first token
 * for the others' inter-token latency (bench/RESULTS.md: a 120k-token prompt beside 64 streams
 * on an H200).
 *
 * KV: a sequence is admitted only when the pool holds blocks for its whole current context
 * (beyond what the prefix cache gives it) and for this step's growth of the decoding
 * sequences; each step it grows by a block when it needs one. When a running sequence cannot
 * grow, the best victim by fair.h (least urgent priority, tenant furthest over its share,
 * newest) among the running sequences not already in this step's batch, itself included, is
 * preempted: its blocks are released and it goes back to the queue, ahead of the later
 * arrivals of its tenant, to be recomputed from its tokens (prompt + generated); the
 * sampler's (seed, position) draws make it produce the same tokens again. With no other
 * candidate the sequence sits the step out; alone, it finishes with SHM_FINISH_ERROR and err
 * CM_ENOKV. A waiting request that does not fit may also preempt running sequences that
 * fair.h lets it (a less urgent priority, or a tenant over its share).
 *
 * Prefix cache (on unless opts.no_prefix_cache, or the model has sliding-window layers;
 * executor/kv.h): a request takes over the longest cached prefix of its tokens in whole blocks
 * and prefills only the rest; its last token is always computed, so there are logits to
 * sample. When another running sequence has the next, partly filled block's positions
 * computed (the n choices of one request, or an identical prompt), those positions are copied
 * into a block of its own (the backend's kv_copy) instead of recomputed. A request whose
 * prefix another sequence is computing right now waits for it rather than computing it
 * twice. The events report the prompt tokens that were not computed (n_cached: at the first
 * admission) and the time queued.
 *
 * Sequences finish (enum shm_finish, the ring's) on max_tokens (LENGTH), one of the request's
 * stop ids (STOP; the token is reported with the finish; the scheduler knows no end-of-generation
 * ids of its own: the caller puts text/'s among the stop ids), the context length (CONTEXT:
 * prompt + generated reached n_ctx), cancel (CANCELLED), or ERROR (err CM_ENOKV as above, or
 * CM_EINVAL when the sampler refused the sequence).
 *
 *   ex_sched *s; ex_sched_opts so; ex_sched_opts_default(&so);
 *   ex_sched_create(engine, &so, &s);
 *   ex_request r = { .id = 7, .prompt = ids, .n_prompt = n };
 *   ex_sample_params_default(&r.sp); r.sp.max_tokens = 100;
 *   ex_sched_submit(s, &r);
 *   ex_event ev[256]; int n_ev;
 *   while (ex_sched_busy(s)) ex_sched_step(s, ev, 256, &n_ev);   // tokens + finishes
 *   ex_sched_destroy(s);
 *
 * Constrained decoding: a request may carry a grammar program (executor/grammar.h). The
 * scheduler keeps the compiled grammars, bound to the vocabulary's token bytes
 * (ex_sched_set_vocab), in a cache keyed by the program's hash and the request's stop ids, and
 * one parse state per sequence: each step the sequence's row gets the state's token mask, and
 * the token drawn advances the state. The stop ids are allowed only where the grammar may end;
 * a grammar that allows nothing more (complete, with no stop id to end on) finishes the sequence
 * (STOP). A mask the grammar cannot compute finishes it with ERROR (err CM_ENOMEM).
 *
 * Embeddings: a request with embed set is not sampled. Its prompt runs through the hidden-state
 * forward (ex_engine_forward_hidden) in steps of its own, chunked by the token budget, its KV
 * blocks held only meanwhile; the rows are pooled as the request says (enum mdl_pooling, the
 * mean in double precision), L2-normalised when asked, and the vector comes back in the
 * finishing event (STOP, token -1, embd valid until the next step).
 *
 * One thread drives a scheduler (submit, cancel, step). A step allocates nothing except the
 * first time a grammar state is seen (its mask, bounded by the grammar's soft sizes); submit
 * allocates the request's own storage.
 */
#ifndef EX_SCHED_H
#define EX_SCHED_H

#include <stdint.h>

#include "../shm/shm.h"
#include "engine.h"
#include "grammar.h"
#include "sampler.h"

typedef struct ex_request {
    uint64_t         id;          /* unique among the scheduler's live requests */
    const int32_t   *prompt;      /* [n_prompt] (copied) */
    int              n_prompt;    /* >= 1 and < n_ctx */
    ex_sample_params sp;          /* sampling, and sp.max_tokens (>= 1) tokens at most */
    const struct shm_logit_bias *bias; /* [n_bias] (copied) */
    int              n_bias;
    const int32_t   *stop_ids;    /* [n_stop] the ids that end the sequence (copied) */
    int              n_stop;
    const void      *grammar;     /* a grammar program the output must follow, or NULL (read during
                                   * submit only; 4-byte aligned) */
    size_t           grammar_len; /* bytes */
    int              embed;       /* 1: an embedding request (no sampling; sp.max_tokens unused) */
    int              pooling;     /* embed: enum mdl_pooling (MEAN, LAST or CLS) */
    int              normalize;   /* embed: L2-normalise the pooled vector */
    int              n_generated; /* a resumed generation: the last n_generated prompt ids are its
                                   * own earlier output (shm_submit's n_generated); they count
                                   * toward max_tokens and min_tokens and events' n_gen, not
                                   * n_prompt. 0 <= n_generated < min(n_prompt, max_tokens) */
    int32_t          priority;    /* lower values are admitted and kept first (vLLM's convention); 0 default */
    uint64_t         tenant;      /* the tenant's id (0: none) for fair share; see executor/fair.h */
    uint32_t         weight;      /* the tenant's weight, >= 1 (0 is taken as 1) */
} ex_request;

/* One sequence's news from a step: a new token, a finish, or both. */
typedef struct ex_event {
    uint64_t      id;
    int32_t       token;      /* the new token, -1 when the event only finishes (cancel, no KV) */
    int           finish;     /* enum shm_finish; SHM_FINISH_NONE while the sequence goes on */
    int           err;        /* finish ERROR: CM_ENOKV (the pool cannot hold it alone) or CM_EINVAL */
    int           n_prompt;   /* usage (a resumed generation's earlier output not included) */
    int           n_gen;      /* tokens generated so far, this one included (a resumed
                               * generation's earlier output included) */
    ex_sample_out so;         /* so.token == token; logprobs when the request asked */
    const float  *embd;       /* an embedding request's vector [n_embd] (finish STOP), valid until the
                               * next step; NULL otherwise */
    int           n_embd;
    int           n_cached;   /* prompt tokens its first admission took from the prefix cache */
    uint64_t      queue_ns;   /* submit -> first admission (0: never admitted) */
} ex_event;

typedef struct ex_sched_opts {
    int max_running;      /* sequences in the running set; 0 = the engine's max_seqs */
    int max_tokens;       /* token budget per step; 0 = the engine's max_tokens */
    int max_waiting;      /* queue cap; submit beyond it returns CM_EFULL; 0 = 1024 */
    int no_prefix_cache;  /* 1: every request computes its whole prompt (--no-prefix-cache) */
    int fixed_tokens;     /* tokens that cost as much as a step's fixed part (the contended-step
                           * rule above); 0 = fitted from the forward passes' times */
    double stall_max;     /* the decode guard above: a step carrying decodes costs at most this
                           * many times its decodes alone; <= 0: off (the default) */
    double step_cost[3];  /* the guard's cost model a + b * tokens + c * attention work; all 0 =
                           * fitted from the forward passes' times (tests set it) */
} ex_sched_opts;

typedef struct ex_sched_stats {
    int      n_waiting, n_running;
    int      kv_free, kv_total;       /* blocks (free counts cached blocks nobody holds) */
    uint64_t steps, tokens_forwarded, tokens_generated, preemptions;
    int      kv_cached;               /* cached blocks nobody holds (reusable, evictable) */
    int      prefix_cache;            /* 1: the prefix cache is on */
    /* as vLLM counts them: every admission (re-admissions after preemption too) queries its
     * tokens and hits those it takes from the cache */
    uint64_t prefix_queries, prefix_hits;
    uint64_t kv_copies;               /* partly filled blocks copied instead of recomputed */
} ex_sched_stats;

typedef struct ex_sched ex_sched;

void ex_sched_opts_default(ex_sched_opts *o);
/* e must outlive the scheduler, which owns its KV allocator's use from now on (and turns its
 * prefix cache on unless o->no_prefix_cache: logged when the model's sliding-window layers
 * keep it off). Returns 0, CM_EINVAL or CM_ENOMEM. */
int  ex_sched_create(ex_engine *e, const ex_sched_opts *o, ex_sched **out);
void ex_sched_destroy(ex_sched *s); /* accepts NULL; drops every request without events */

/* Queues a request. Returns 0, CM_EINVAL (bad fields or sampling parameters, an id already
 * live, a malformed grammar program, n_generated out of its range), CM_ECTX (prompt of n_ctx
 * tokens or more), CM_ENOKV (prompt + max_tokens, at most n_ctx, needs more KV blocks than the
 * whole pool has: it could never run to its end, whatever else is running), CM_ESTATE (a
 * grammar but no vocabulary yet), CM_EUNSUPPORTED (an embedding on a backend without a
 * hidden-state forward), CM_EFULL (queue full), CM_ENOMEM. ex_sched_error() then says why in
 * a line. */
int ex_sched_submit(ex_sched *s, const ex_request *r);
/* The reason of the last refused submit ("" when none). */
const char *ex_sched_error(const ex_sched *s);
/* Gives the scheduler the vocabulary's token bytes for grammars (takes ownership of v). Returns
 * 0, or CM_ESTATE while grammars made with an earlier vocabulary are in use (v is then freed). */
int ex_sched_set_vocab(ex_sched *s, ex_gram_vocab *v);
/* Ends a request wherever it is; its CANCEL event comes with the next step. Returns 0 or
 * CM_ENOTFOUND. */
int ex_sched_cancel(ex_sched *s, uint64_t id);
/* Runs one step (a forward pass when any sequence has work). Writes up to cap events
 * (cap >= max_running; finishes of cancelled requests beyond cap wait for the next step).
 * Returns 0 or the forward pass's error (the engine is then unusable: executor fatal path). */
int ex_sched_step(ex_sched *s, ex_event *ev, int cap, int *n_ev);
/* 1 while any request is queued, running or has an event pending. */
int ex_sched_busy(const ex_sched *s);
void ex_sched_stats_get(const ex_sched *s, ex_sched_stats *st);

#endif
