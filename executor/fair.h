/* fair: the scheduler's policy — the order in which waiting requests are admitted and prompt
 * chunks scheduled, and which running sequence is preempted.
 *
 * Order: priority first (lower value first, vLLM's convention; 0 by default), then fair share
 * between tenants, then arrival. A tenant's usage is its dominant share: the larger of the
 * running slots and the KV blocks its running sequences hold, each as a fraction of the
 * scheduler's total, divided by its weight (dominant resource fairness). Among the tenants
 * with a waiting request at the best priority, the one with the smallest dominant share goes
 * next (ties: the oldest request), so admissions interleave tenants in proportion to their
 * weights, as deficit round robin would, but over what each holds now: an idle tenant banks no
 * credit, and a tenant that floods the queue gets the same share as one that does not.
 *
 * Preemption: a running sequence may be preempted to admit a waiting request when its priority
 * value is higher (less urgent), or, at equal priority, when its tenant's dominant share is
 * larger than the waiting request's tenant would have after admission (ex_fair_may_preempt).
 * Every such preemption lowers the larger of the two tenants' shares, so they cannot undo each
 * other. Victims rank by priority (least urgent first), then their tenant's dominant share
 * (furthest over its share first), then arrival (newest first).
 *
 * Items are the caller's: an ex_fair_item lives inside the caller's request and is linked
 * into this module's per-tenant lists (no allocation after create). A tenant's weight is the
 * one its latest request came with.
 *
 *   ex_fair *f; ex_fair_create(max_items, max_running, kv_blocks, &f);
 *   q->fi.priority = r->priority; ex_fair_wait(f, &q->fi, tenant, weight);  // submit
 *   ex_fair_round(f);
 *   for (ex_fair_item *it; (it = ex_fair_next(f));) { ... admit: ex_fair_run(f, it, blocks);
 *                                                   ... or not now: ex_fair_skip(f, it); }
 *   ex_fair_remove(f, &q->fi);                                              // finish, cancel
 *
 * One thread (the scheduler's).
 */
#ifndef EX_FAIR_H
#define EX_FAIR_H

#include <stdint.h>

typedef struct ex_fair ex_fair;
typedef struct ex_fair_tenant ex_fair_tenant;

enum { EX_FAIR_NONE = 0, EX_FAIR_WAITING = 1, EX_FAIR_RUNNING = 2 };

typedef struct ex_fair_item {
    int32_t  priority;      /* the caller sets it before ex_fair_wait */
    /* the module's */
    int      state;         /* EX_FAIR_* */
    uint64_t arrival;       /* order of first arrival */
    int      blocks;        /* KV blocks held while running */
    uint32_t skip;          /* == the round number: passed over in this round */
    ex_fair_tenant *t;
    struct ex_fair_item *prev, *next; /* the tenant's waiting list, by (priority, arrival) */
} ex_fair_item;

/* A policy for at most max_items items at once (waiting + running), run_slots running
 * sequences and kv_blocks blocks (the totals the dominant share is a fraction of). Returns 0,
 * CM_EINVAL or CM_ENOMEM. */
int  ex_fair_create(int max_items, int run_slots, int kv_blocks, ex_fair **out);
void ex_fair_destroy(ex_fair *f); /* accepts NULL */

/* it (state NONE, or RUNNING: preempted) joins tenant's waiting queue; weight >= 1 becomes the
 * tenant's weight (0 is taken as 1). A new item gets the next arrival number; a preempted one
 * keeps its own, so it goes before the later arrivals of its tenant and priority. Returns 0 or
 * CM_EFULL (max_items items already). */
int  ex_fair_wait(ex_fair *f, ex_fair_item *it, uint64_t tenant, uint32_t weight);
/* A waiting item starts running, holding blocks KV blocks. */
void ex_fair_run(ex_fair *f, ex_fair_item *it, int blocks);
/* A running item now holds blocks KV blocks. */
void ex_fair_set_blocks(ex_fair *f, ex_fair_item *it, int blocks);
/* it leaves the policy (waiting or running). Accepts an item in state NONE. */
void ex_fair_remove(ex_fair *f, ex_fair_item *it);

/* Starts a round of picks: items skipped before are candidates again. */
void ex_fair_round(ex_fair *f);
/* Passes a waiting item over for the rest of the round (it cannot go now). */
void ex_fair_skip(ex_fair *f, ex_fair_item *it);
/* The waiting item to admit next (not skipped this round), or NULL. */
ex_fair_item *ex_fair_next(const ex_fair *f);

/* The dominant share of it's tenant with add_slots running slots and add_blocks KV blocks
 * more than it holds (0, 0: as it is). */
double ex_fair_share(const ex_fair *f, const ex_fair_item *it, int add_slots, int add_blocks);
/* 1 when running item victim may be preempted so that waiting item cand, needing cand_blocks
 * KV blocks, can run (see the top of this file). */
int ex_fair_may_preempt(const ex_fair *f, const ex_fair_item *victim, const ex_fair_item *cand, int cand_blocks);
/* 1 when a is the better victim of the two (less urgent, its tenant further over its share,
 * newer). */
int ex_fair_victim_before(const ex_fair *f, const ex_fair_item *a, const ex_fair_item *b);
/* 1 when a's work goes before b's (more urgent, its tenant further under its share, older). */
int ex_fair_before(const ex_fair *f, const ex_fair_item *a, const ex_fair_item *b);
/* 1 when a's work yields to b's in a step: b is more urgent, or at equal priority b's tenant
 * holds a smaller dominant share than a's; with far (1) set, less than half of it (a tenant
 * far under its share, such as a light one beside a flooding one: two tenants near their
 * shares do not yield that way). */
int ex_fair_yields(const ex_fair *f, const ex_fair_item *a, const ex_fair_item *b, int far);
/* 1 when another tenant with running items holds a smaller dominant share than it's tenant:
 * it's tenant is over its share of a contended executor. */
int ex_fair_over(const ex_fair *f, const ex_fair_item *it);

/* Waiting items, and a walk over them (any order): first, then after(it) until NULL. */
int ex_fair_n_waiting(const ex_fair *f);
ex_fair_item *ex_fair_first(const ex_fair *f);
ex_fair_item *ex_fair_after(const ex_fair *f, const ex_fair_item *it);

#endif
