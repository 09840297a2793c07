/* Scheduling policy: executor/fair.h's order (priority, dominant share with weights, arrival),
 * its preemption rule and victim ranking; then the scheduler on stories260K: a tenant flooding
 * the queue does not delay another tenant's request (admitted at once, by preempting the
 * flood), a more urgent priority goes first and preempts, weights share the running slots, a
 * step led by the light tenant's prompt carries none of the flooding tenant's work and the
 * latter's prompt chunks stay small while the light one runs, queue time is reported, and
 * every output equals the request's run alone; the decode guard cuts a long prompt's chunks
 * beside decodes by the cost model. */
#include "executor/engine.h"
#include "executor/fair.h"
#include "executor/kv.h"
#include "executor/sched.h"
#include "common/cm_err.h"
#include "model/model.h"
#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_fair(void) {
    ex_fair *f;
    T_EQ_INT(ex_fair_create(0, 4, 100, &f), CM_EINVAL);
    T_EQ_INT(ex_fair_create(9, 4, 100, &f), 0);
    ex_fair_item a[5], b[2], u, v;
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    memset(&u, 0, sizeof u);
    memset(&v, 0, sizeof v);
    for (int i = 0; i < 5; i++) T_EQ_INT(ex_fair_wait(f, &a[i], 'A', 1), 0);
    T_EQ_INT(ex_fair_wait(f, &b[0], 'B', 1), 0);
    T_EQ_INT(ex_fair_n_waiting(f), 6);
    ex_fair_round(f);
    T_CHECK(ex_fair_next(f) == &a[0]);                 /* equal shares: the oldest */
    ex_fair_run(f, &a[0], 10);
    T_NEAR(ex_fair_share(f, &a[0], 0, 0), 0.25, 1e-12); /* 1 of 4 slots > 10 of 100 blocks */
    T_CHECK(ex_fair_next(f) == &b[0]);                 /* B holds nothing */
    ex_fair_run(f, &b[0], 30);
    T_NEAR(ex_fair_share(f, &b[0], 0, 0), 0.30, 1e-12); /* blocks dominate */
    T_CHECK(ex_fair_next(f) == &a[1]);
    ex_fair_run(f, &a[1], 10);
    ex_fair_run(f, &a[2], 10);                         /* A: 3 slots, 0.75 */
    T_EQ_INT(ex_fair_wait(f, &b[1], 'B', 1), 0);
    T_CHECK(ex_fair_next(f) == &b[1]);                 /* 0.30 < 0.75 */
    /* A over its share may be preempted for B: B after admission (2 slots, 0.5) < A's 0.75 */
    T_CHECK(ex_fair_may_preempt(f, &a[2], &b[1], 5));
    T_CHECK(!ex_fair_may_preempt(f, &b[0], &a[3], 5)); /* the other way round: no */
    T_CHECK(!ex_fair_may_preempt(f, &a[1], &a[3], 5)); /* never within a tenant at one priority */
    T_CHECK(!ex_fair_may_preempt(f, &a[2], &b[1], 60)); /* B would hold 0.9 of the blocks */
    /* victims: the tenant furthest over first, its newest */
    T_CHECK(ex_fair_victim_before(f, &a[2], &b[0]));
    T_CHECK(ex_fair_victim_before(f, &a[2], &a[1]));
    T_CHECK(!ex_fair_victim_before(f, &a[0], &a[1]));
    T_CHECK(ex_fair_before(f, &b[0], &a[0]));          /* B's work first: further under its share */
    /* preempted: back in the queue ahead of its tenant's later arrivals */
    ex_fair_wait(f, &a[2], 0, 0);
    T_EQ_INT(a[2].state, EX_FAIR_WAITING);
    ex_fair_skip(f, &b[1]);
    T_CHECK(ex_fair_next(f) == &a[2]);
    ex_fair_skip(f, &a[2]);
    T_CHECK(ex_fair_next(f) == &a[3]);
    ex_fair_round(f);                                   /* skips last one round */
    T_CHECK(ex_fair_next(f) == &b[1]);
    /* priority first: a later, more urgent request goes before everything and may preempt */
    u.priority = -5;
    T_EQ_INT(ex_fair_wait(f, &u, 'A', 1), 0);
    T_CHECK(ex_fair_next(f) == &u);
    T_CHECK(ex_fair_may_preempt(f, &b[0], &u, 1));
    v.priority = 3;
    T_EQ_INT(ex_fair_wait(f, &v, 'C', 1), 0);
    T_CHECK(!ex_fair_may_preempt(f, &b[0], &v, 1));    /* less urgent: never */
    T_EQ_INT(ex_fair_wait(f, &(ex_fair_item){ 0 }, 'D', 1), CM_EFULL); /* 9 items */
    int n = 0;
    for (ex_fair_item *it = ex_fair_first(f); it; it = ex_fair_after(f, it)) n++;
    T_EQ_INT(n, ex_fair_n_waiting(f));
    T_EQ_INT(n, 6); /* a2 a3 a4 b1 u v */
    /* weights: C of weight 3 holds 3 slots at the share of 1 */
    ex_fair_remove(f, &v);
    ex_fair_run(f, &u, 1);
    T_NEAR(ex_fair_share(f, &u, 0, 0), 0.75, 1e-12);  /* A runs a0, a1 and u: 3 of 4 slots */
    ex_fair_item c[3];
    memset(c, 0, sizeof c);
    ex_fair_remove(f, &a[3]);
    ex_fair_remove(f, &a[4]);
    for (int i = 0; i < 2; i++) {
        T_EQ_INT(ex_fair_wait(f, &c[i], 'C', 3), 0);
        ex_fair_run(f, &c[i], 1);
    }
    T_NEAR(ex_fair_share(f, &c[0], 0, 0), 2.0 / 4 / 3, 1e-12);
    /* everything leaves; tenants are recycled */
    ex_fair_item *all[] = { &a[0], &a[1], &a[2], &b[0], &b[1], &u, &c[0], &c[1] };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ex_fair_remove(f, all[i]);
    T_EQ_INT(ex_fair_n_waiting(f), 0);
    T_CHECK(ex_fair_first(f) == NULL);
    for (int i = 0; i < 8; i++) {
        ex_fair_item x;
        memset(&x, 0, sizeof x);
        T_EQ_INT(ex_fair_wait(f, &x, 100 + (uint64_t)i, 1), 0);
        ex_fair_remove(f, &x);
    }
    ex_fair_destroy(f);
    ex_fair_destroy(NULL);
}

/* ---- the scheduler --------------------------------------------------------------------------- */

static mdl_model *m;

#define MAXR 40
#define MAXG 40

typedef struct {
    int      arrival, n_prompt, max_tokens;
    int32_t  priority;
    uint64_t tenant;
    uint32_t weight;
    int32_t  tok[MAXG];
    int      n, first_step, finish_step;
    uint64_t queue_ns;
} req;

static int32_t prompts[MAXR][64];

/* A scheduler on stories260K: slots sequences, budget tokens per step, fixed_tokens (opts). */
/* An engine of slots sequences, budget tokens a step and n_ctx positions a sequence, and its
 * scheduler with options so. */
static ex_sched *mk_ctx(ex_engine **e, int slots, int budget, int n_ctx, const ex_sched_opts *so) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = n_ctx;
    o.kv_cache_mb = 8;
    o.max_tokens = budget;
    o.max_seqs = slots;
    char err[256];
    *e = NULL;
    int rc = ex_engine_create(m, &o, e, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    ex_sched *s = NULL;
    if (!rc) T_EQ_INT(ex_sched_create(*e, so, &s), 0);
    return s;
}

static ex_sched *mk_opts(ex_engine **e, int slots, int budget, const ex_sched_opts *so) { return mk_ctx(e, slots, budget, 256, so); }

static ex_sched *mk(ex_engine **e, int slots, int budget, int fixed_tokens) {
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    so.fixed_tokens = fixed_tokens;
    return mk_opts(e, slots, budget, &so);
}

/* Runs rs on a fresh scheduler (max_running slots, budget tokens per step); per_step (may be
 * NULL): the tenant of every token event of step count_at, counted into by_tenant[tenant]. */
static ex_sched_stats run(req *rs, int n, int slots, int budget, int count_at, int *by_tenant) {
    ex_engine *e;
    ex_sched *s = mk(&e, slots, budget, 0);
    ex_event ev[64];
    int left = n, n_ev;
    for (int i = 0; i < n; i++) rs[i].n = 0, rs[i].first_step = rs[i].finish_step = -1;
    for (int step = 0; left && step < 5000; step++) {
        for (int i = 0; i < n; i++)
            if (rs[i].arrival == step) {
                ex_request r;
                memset(&r, 0, sizeof r);
                r.id = 1 + (uint64_t)i;
                r.prompt = prompts[i];
                r.n_prompt = rs[i].n_prompt;
                ex_sample_params_default(&r.sp);
                r.sp.max_tokens = (uint32_t)rs[i].max_tokens;
                r.priority = rs[i].priority;
                r.tenant = rs[i].tenant;
                r.weight = rs[i].weight;
                T_EQ_INT(ex_sched_submit(s, &r), 0);
            }
        T_EQ_INT(ex_sched_step(s, ev, 64, &n_ev), 0);
        for (int k = 0; k < n_ev; k++) {
            req *q = &rs[ev[k].id - 1];
            if (ev[k].token >= 0) {
                if (q->first_step < 0) q->first_step = step, q->queue_ns = ev[k].queue_ns;
                if (q->n < MAXG) q->tok[q->n++] = ev[k].token;
                if (by_tenant && step == count_at) by_tenant[q->tenant]++;
            }
            if (ev[k].finish) {
                q->finish_step = step;
                T_EQ_INT(ev[k].queue_ns, q->queue_ns);
                left--;
            }
        }
    }
    T_EQ_INT(left, 0);
    ex_sched_stats st;
    ex_sched_stats_get(s, &st);
    T_EQ_INT(st.kv_free, st.kv_total);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
    return st;
}

/* Every request's tokens equal its run alone. */
static void same_as_alone(req *rs, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        req one = rs[i];
        one.arrival = 0;
        /* run alone: its prompt goes into slot 0 for the run */
        int32_t save[64];
        memcpy(save, prompts[0], sizeof save);
        memcpy(prompts[0], prompts[i], sizeof save);
        run(&one, 1, 4, 64, -1, NULL);
        memcpy(prompts[0], save, sizeof save);
        if (one.n != rs[i].n || memcmp(one.tok, rs[i].tok, sizeof(int32_t) * (size_t)one.n)) bad++;
    }
    T_CHECKF(bad == 0, "%d requests differ from their runs alone", bad);
}

static void test_sched_policy(void) {
    uint32_t x = 5;
    for (int i = 0; i < MAXR; i++) {
        prompts[i][0] = 1;
        for (int j = 1; j < 64; j++) { x = x * 1664525u + 1013904223u; prompts[i][j] = 3 + (int32_t)((x >> 9) % 500); }
    }
    /* A floods 12 requests of 30 tokens into 4 slots; B's one request arrives at step 5 */
    req rs[13];
    memset(rs, 0, sizeof rs);
    for (int i = 0; i < 12; i++) rs[i] = (req){ .arrival = 0, .n_prompt = 20, .max_tokens = 30, .tenant = 1, .weight = 1 };
    rs[12] = (req){ .arrival = 5, .n_prompt = 20, .max_tokens = 10, .tenant = 2, .weight = 1 };
    ex_sched_stats st = run(rs, 13, 4, 64, -1, NULL);
    T_EQ_INT(rs[12].first_step, 5); /* admitted and prefilled in the step it arrived */
    T_CHECK(st.preemptions >= 1);
    T_CHECK(rs[11].first_step > 30);  /* A's last waited for A's first ones */
    T_CHECK(rs[12].queue_ns > 0 && rs[12].queue_ns < rs[11].queue_ns);
    same_as_alone(rs, 13);
    /* the same with one tenant: B's request waits its turn (the test above can fail) */
    rs[12].tenant = 1;
    st = run(rs, 13, 4, 64, -1, NULL);
    T_CHECK(rs[12].first_step > 30);
    T_EQ_INT(st.preemptions, 0);

    /* priority: 4 requests in 2 slots; a more urgent one preempts, a less urgent one waits for all */
    req pr[6];
    memset(pr, 0, sizeof pr);
    for (int i = 0; i < 4; i++) pr[i] = (req){ .arrival = 0, .n_prompt = 12, .max_tokens = 20 };
    pr[4] = (req){ .arrival = 3, .n_prompt = 12, .max_tokens = 5, .priority = -5 };
    pr[5] = (req){ .arrival = 4, .n_prompt = 12, .max_tokens = 5, .priority = 5 };
    st = run(pr, 6, 2, 64, -1, NULL);
    T_EQ_INT(pr[4].first_step, 3);
    int done_before = 0;
    for (int i = 0; i < 4; i++) {
        T_CHECK(pr[5].first_step > pr[i].first_step);
        done_before += pr[i].finish_step < pr[5].first_step;
    }
    T_CHECK(done_before >= 3); /* it took the slot of the third priority-0 request to finish */
    T_CHECK(st.preemptions >= 1);
    same_as_alone(pr, 6);

    /* weights: tenants 1 (weight 1) and 3 (weight 3) flood 8 slots: 2 and 6 of them run */
    req w[32];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 32; i++)
        w[i] = (req){ .arrival = 0, .n_prompt = 8, .max_tokens = 30, .tenant = i % 2 ? 3 : 1, .weight = i % 2 ? 3 : 1 };
    int by[4] = { 0 };
    run(w, 32, 8, 128, 10, by);
    T_EQ_INT(by[1], 2);
    T_EQ_INT(by[3], 6);
}

/* Tokens per step (budget 16): A's three short requests decode and A's fourth prefills a long
 * prompt when B's request arrives. */
static void test_step_shares(void) {
    ex_engine *e;
    ex_sched *s = mk(&e, 8, 16, 3);
    /* arrival step, prompt tokens, tokens to generate, tenant */
    static const int rq[5][4] = { { 0, 4, 40, 1 }, { 0, 4, 40, 1 }, { 0, 4, 40, 1 }, { 1, 60, 5, 1 }, { 2, 20, 30, 2 } };
    ex_event ev[16];
    int n_ev, tok[6];
    uint64_t last = 0;
    for (int step = 0; step < 6; step++) {
        for (int i = 0; i < 5; i++) {
            if (rq[i][0] != step) continue;
            ex_request r;
            memset(&r, 0, sizeof r);
            r.id = 1 + (uint64_t)i;
            r.prompt = prompts[i];
            r.n_prompt = rq[i][1];
            ex_sample_params_default(&r.sp);
            r.sp.max_tokens = (uint32_t)rq[i][2];
            r.tenant = (uint64_t)rq[i][3];
            T_EQ_INT(ex_sched_submit(s, &r), 0);
        }
        T_EQ_INT(ex_sched_step(s, ev, 16, &n_ev), 0);
        ex_sched_stats st;
        ex_sched_stats_get(s, &st);
        tok[step] = (int)(st.tokens_forwarded - last);
        last = st.tokens_forwarded;
    }
    T_EQ_INT(tok[0], 12);          /* A's three prompts */
    T_EQ_INT(tok[1], 3 + 13);      /* their decodes, A's long prompt fills the step */
    T_EQ_INT(tok[2], 16);          /* B's prompt leads, alone: A's decodes and chunk wait */
    T_EQ_INT(tok[3], 4);
    T_EQ_INT(tok[4], 4 + 7);       /* B decodes: A's chunk gets B's and A's 4 decode tokens + 3 */
    T_EQ_INT(tok[5], 4 + 7);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
}

/* The decode guard (sched.h): four sequences decode while a 200-token prompt arrives. With a
 * given cost model (a + b tokens + c attention work) the prompt's chunks keep each step within
 * 1.75 times its decodes' cost (at least a block), the prompt still completes; without the
 * guard it takes the whole budget in one step; a prompt no longer than the budget (100 of
 * 128) is not cut, nor is a prompt alone. */
/* The decode guard tests' long prompt (its first n_long <= 600 tokens). */
static const int32_t *guard_prompt(void) {
    static int32_t p[600];
    p[0] = 1;
    for (int j = 1; j < 600; j++) p[j] = 3 + (int32_t)((j * 7919u) % 500);
    return p;
}

/* One step of the decode guard's tests: four 4-token requests (ids 1-4, dec_tokens each, EOS
 * ignored) arrive at step 0, the long prompt (id 5) at step 2. Returns the prompt chunk the step
 * forwarded beside the four decodes (tokens forwarded - 4; *last: the forwarded count so far)
 * and sets *first to the step that gave the long prompt its first token. */
static int guard_step(ex_sched *s, int step, const int32_t *longp, int n_long, int dec_tokens, uint64_t *last, int *first) {
    for (int i = 0; i < 5; i++) {
        if ((i < 4 && step != 0) || (i == 4 && step != 2)) continue;
        ex_request r;
        memset(&r, 0, sizeof r);
        r.id = 1 + (uint64_t)i;
        r.prompt = i < 4 ? prompts[i] : longp;
        r.n_prompt = i < 4 ? 4 : n_long;
        ex_sample_params_default(&r.sp);
        r.sp.max_tokens = i < 4 ? (uint32_t)dec_tokens : 5;
        r.sp.ignore_eos = 1;
        T_EQ_INT(ex_sched_submit(s, &r), 0);
    }
    ex_event ev[16];
    int n_ev;
    T_EQ_INT(ex_sched_step(s, ev, 16, &n_ev), 0);
    for (int k = 0; k < n_ev; k++)
        if (ev[k].id == 5 && ev[k].token >= 0) *first = step;
    ex_sched_stats st;
    ex_sched_stats_get(s, &st);
    const int chunk = (int)(st.tokens_forwarded - *last) - 4;
    *last = st.tokens_forwarded;
    return chunk;
}

static int guard_chunk(double b, double c, int n0, double e) {
    if (e <= 0) return 0;
    double B = b + c * n0;
    return (int)((-B + sqrt(B * B + 4 * c * e)) / (2 * c));
}

static void test_decode_guard(void) {
    const double a = 1, b = 0.01, c = 0.001;
    const int32_t *longp = guard_prompt();
    for (int on = 1; on >= 0; on--) {
        ex_sched_opts so;
        ex_sched_opts_default(&so);
        so.stall_max = on ? 1.75 : -1;
        so.step_cost[0] = a, so.step_cost[1] = b, so.step_cost[2] = c;
        ex_engine *e;
        ex_sched *s = mk_opts(&e, 8, 128, &so);
        if (!s) return;
        const int bs = ex_engine_limits(e)->block_size;
        int n0 = 0, first = -1;
        uint64_t last = 0;
        for (int step = 0; step < 40 && first < 0; step++) {
            const int chunk = guard_step(s, step, longp, 200, 100, &last, &first);
            if (step < 2) continue;
            int rest = 200 - n0;
            /* the four decodes: position 4 + step - 1 each, attending to 4 + step positions */
            double dec = a + 4 * (b + c * (4 + step));
            int want = on ? guard_chunk(b, c, n0, 1.75 * dec - dec) : 124;
            if (want < bs) want = bs; /* at least a block */
            if (want > rest) want = rest;
            if (want > 124) want = 124;
            T_CHECKF(chunk >= want - 1 && chunk <= want + 1, "guard %d, step %d: a chunk of %d at %d, want %d", on, step, chunk,
                     n0, want);
            n0 += chunk;
        }
        T_CHECKF(first >= 0, "guard %d: the long prompt never got its first token", on);
        if (on) T_CHECKF(first > 4, "guard on: the prompt completed at step %d, in big chunks", first);
        else T_EQ_INT(first, 3); /* 124 + 76 */
        ex_sched_destroy(s);
        ex_engine_destroy(e);
    }
    /* a prompt within the step's budget beside the same decodes: one chunk, guard on (the guard
     * would allow ~23 tokens) */
    {
        ex_sched_opts so;
        ex_sched_opts_default(&so);
        so.stall_max = 1.75;
        so.step_cost[0] = a, so.step_cost[1] = b, so.step_cost[2] = c;
        ex_engine *e;
        ex_sched *s = mk_opts(&e, 8, 128, &so);
        if (!s) return;
        int first = -1;
        uint64_t last = 0;
        for (int step = 0; step < 3; step++) {
            const int chunk = guard_step(s, step, longp, 100, 100, &last, &first);
            if (step == 2)
                T_CHECKF(chunk == 100 && first == 2, "a 100-token prompt beside decodes: a chunk of %d, first token at step %d",
                         chunk, first);
        }
        ex_sched_destroy(s);
        ex_engine_destroy(e);
    }
    /* a prompt alone: one chunk of the whole budget, guard or not */
    ex_engine *e;
    ex_sched *s = mk(&e, 8, 64, 0);
    ex_request r;
    memset(&r, 0, sizeof r);
    r.id = 9;
    r.prompt = prompts[5];
    r.n_prompt = 60;
    ex_sample_params_default(&r.sp);
    r.sp.max_tokens = 2;
    T_EQ_INT(ex_sched_submit(s, &r), 0);
    ex_event ev[16];
    int n_ev;
    T_EQ_INT(ex_sched_step(s, ev, 16, &n_ev), 0);
    T_EQ_INT(n_ev, 1);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
}

/* The decode guard's probes and its start (sched.h): four sequences decode while a 600-token
 * prompt arrives. With a given cost model that allows less than a block, every chunk is one
 * block, and after 16 steps with chunks one step runs the decodes alone (their measured time
 * is the bound's base); without a model (not fitted yet) the first chunks are one block. */
static void test_decode_guard_probe(void) {
    const int32_t *longp = guard_prompt();
    for (int given = 1; given >= 0; given--) {
        ex_sched_opts so;
        ex_sched_opts_default(&so);
        so.stall_max = given ? 1.5 : 2;
        if (given) so.step_cost[0] = 1, so.step_cost[1] = 0.01, so.step_cost[2] = 0.01;
        ex_engine *e;
        ex_sched *s = mk_ctx(&e, 8, 128, 1024, &so);
        if (!s) return;
        const int bs = ex_engine_limits(e)->block_size;
        int n0 = 0, run_len = 0, longest_run = 0, probes = 0, first = -1;
        uint64_t last = 0;
        for (int step = 0; step < 200 && first < 0; step++) {
            const int chunk = guard_step(s, step, longp, 600, 400, &last, &first);
            if (step < 2) continue;
            if (given) T_CHECKF(chunk == 0 || chunk == bs || chunk == 600 - n0, "step %d: a chunk of %d (one block: %d)", step, chunk, bs);
            else if (step < 6) T_CHECKF(chunk == bs, "no model yet, step %d: a chunk of %d, not one block (%d)", step, chunk, bs);
            if (chunk > 0) {
                run_len++;
                longest_run = run_len > longest_run ? run_len : longest_run;
            } else if (n0 < 600) {
                probes++;
                run_len = 0;
            }
            n0 += chunk;
        }
        T_CHECKF(first >= 0, "guard (model %d): the long prompt never got its first token", given);
        if (given) {
            T_CHECKF(longest_run <= 16, "a run of %d steps with chunks, no probe after 16", longest_run);
            T_CHECKF(probes >= 2, "%d probe steps over a 600-token prompt in blocks of %d", probes, bs);
        }
        ex_sched_destroy(s);
        ex_engine_destroy(e);
    }
}

int main(void) {
    test_fair();
    char err[256];
    if (mdl_load(T_MODELS "stories260K.gguf", &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    test_sched_policy();
    test_step_shares();
    test_decode_guard();
    test_decode_guard_probe();
    mdl_free(m);
    return t_done();
}
