/* Scheduler over the stories260K model: continuous batching gives every request the same
 * tokens and logprobs as running it alone (chunked prefill, staggered arrivals, seeded
 * sampling), preemption under a small KV pool recomputes to the same result, a resumed
 * generation (prompt + delivered tokens, n_generated) continues exactly, finish reasons
 * (length, stop id, end-of-generation, context, cancel, out of KV), submit refusals. */
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/sched.h"
#include "common/cm_err.h"
#include "model/model.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>

#define NREQ 5
#define MAXGEN 40

static mdl_model *m;

typedef struct {
    int32_t tok[MAXGEN + 1];
    float   lp[MAXGEN + 1];
    int     n, finish;
} result;

static ex_engine *mk(int n_ctx, int kv_blocks, int block_size, int max_tokens) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = n_ctx;
    o.kv_blocks = kv_blocks;
    o.kv_cache_mb = 4;
    o.block_size = block_size;
    o.max_tokens = max_tokens;
    o.max_seqs = 4;
    char err[256];
    ex_engine *e = NULL;
    int rc = ex_engine_create(m, &o, &e, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    return e;
}

static int32_t prompts[NREQ][40];
static int plen[NREQ] = { 5, 33, 1, 17, 26 };

static void mk_req(ex_request *r, int i) {
    memset(r, 0, sizeof *r);
    r->id = 100 + i;
    r->prompt = prompts[i];
    r->n_prompt = plen[i];
    ex_sample_params_default(&r->sp);
    r->sp.max_tokens = MAXGEN - 3 * i;
    r->sp.temperature = i == 0 ? 0.0f : 0.9f;
    r->sp.top_k = i == 3 ? 0 : 40;
    r->sp.top_p = 0.95f;
    r->sp.seed = 1000 + i;
    r->sp.repeat_penalty = i == 4 ? 1.3f : 1.0f;
    r->sp.logprobs = 1;
}

/* Drives s until idle; arrival[i] = step at which request i is submitted (-1: never). */
static void drive(ex_sched *s, const int *arrival, result *res, int *n_steps) {
    ex_event ev[64];
    int n_ev, step = 0, left = 0;
    for (int i = 0; i < NREQ; i++) left += arrival[i] >= 0;
    while (left > 0 && step < 2000) {
        for (int i = 0; i < NREQ; i++)
            if (arrival[i] == step) {
                ex_request r;
                mk_req(&r, i);
                T_EQ_INT(ex_sched_submit(s, &r), 0);
            }
        T_EQ_INT(ex_sched_step(s, ev, 64, &n_ev), 0);
        for (int k = 0; k < n_ev; k++) {
            int i = (int)(ev[k].id - 100);
            if (i < 0 || i >= NREQ) { T_CHECK(0); continue; }
            result *r = &res[i];
            if (ev[k].token >= 0 && r->n <= MAXGEN) {
                r->tok[r->n] = ev[k].token;
                r->lp[r->n] = ev[k].so.logprob;
                r->n++;
                T_EQ_INT(ev[k].n_gen, r->n);
            }
            if (ev[k].finish) { r->finish = ev[k].finish; left--; }
        }
        step++;
    }
    *n_steps = step;
}

static result alone[NREQ]; /* each request run alone (test_batched_equals_alone) */

static void test_batched_equals_alone(void) {
    uint32_t x = 99;
    for (int i = 0; i < NREQ; i++) {
        prompts[i][0] = 1;
        for (int j = 1; j < 40; j++) { x = x * 1664525u + 1013904223u; prompts[i][j] = 3 + (x >> 9) % 500; }
    }
    /* "Once upon a time" as request 0: greedy must follow the reference */
    int32_t once[5] = { 1, 403, 407, 261, 378 };
    memcpy(prompts[0], once, sizeof once);
    static const int32_t ref_head[8] = { 432, 383, 286, 261, 376, 298, 315, 421 };

    result together[NREQ], tight[NREQ];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    memset(tight, 0, sizeof tight);
    int steps;
    for (int i = 0; i < NREQ; i++) {
        ex_engine *e = mk(256, 0, 16, 64);
        ex_sched *s;
        ex_sched_opts so;
        ex_sched_opts_default(&so);
        T_EQ_INT(ex_sched_create(e, &so, &s), 0);
        int arr[NREQ] = { -1, -1, -1, -1, -1 };
        arr[i] = 0;
        drive(s, arr, alone, &steps);
        T_CHECK(!ex_sched_busy(s));
        ex_sched_destroy(s);
        ex_engine_destroy(e);
    }
    for (int j = 0; j < 8; j++) T_EQ_INT(alone[0].tok[j], ref_head[j]);
    for (int i = 0; i < NREQ; i++) {
        T_EQ_INT(alone[i].n, MAXGEN - 3 * i);
        T_EQ_INT(alone[i].finish, SHM_FINISH_LENGTH);
    }
    /* together: token budget 10 (chunked prefill), 4 running at most, staggered arrivals */
    {
        ex_engine *e = mk(256, 0, 16, 64);
        ex_sched *s;
        ex_sched_opts so;
        ex_sched_opts_default(&so);
        so.max_tokens = 10;
        so.max_running = 4;
        T_EQ_INT(ex_sched_create(e, &so, &s), 0);
        int arr[NREQ] = { 0, 0, 3, 4, 9 };
        drive(s, arr, together, &steps);
        ex_sched_stats st;
        ex_sched_stats_get(s, &st);
        T_EQ_INT(st.n_running + st.n_waiting, 0);
        T_EQ_INT(st.kv_free, st.kv_total); /* every block back */
        ex_sched_destroy(s);
        ex_engine_destroy(e);
    }
    /* tight KV: 14 blocks of 8 positions; sequences need up to 9 blocks each: preemption */
    uint64_t preempt = 0;
    {
        ex_engine *e = mk(256, 14, 8, 64);
        ex_sched *s;
        ex_sched_opts so;
        ex_sched_opts_default(&so);
        so.max_tokens = 24;
        T_EQ_INT(ex_sched_create(e, &so, &s), 0);
        int arr[NREQ] = { 0, 1, 2, 3, 4 };
        drive(s, arr, tight, &steps);
        ex_sched_stats st;
        ex_sched_stats_get(s, &st);
        preempt = st.preemptions;
        T_EQ_INT(st.kv_free, 14);
        ex_sched_destroy(s);
        ex_engine_destroy(e);
    }
    T_CHECKF(preempt > 0, "no preemption happened");
    for (int i = 0; i < NREQ; i++) {
        T_EQ_INT(together[i].n, alone[i].n);
        T_EQ_INT(tight[i].n, alone[i].n);
        T_CHECKF(memcmp(together[i].tok, alone[i].tok, sizeof(int32_t) * alone[i].n) == 0, "request %d tokens differ batched", i);
        T_CHECKF(memcmp(together[i].lp, alone[i].lp, sizeof(float) * alone[i].n) == 0, "request %d logprobs differ batched", i);
        T_CHECKF(memcmp(tight[i].tok, alone[i].tok, sizeof(int32_t) * alone[i].n) == 0, "request %d tokens differ preempted", i);
        T_CHECKF(memcmp(tight[i].lp, alone[i].lp, sizeof(float) * alone[i].n) == 0, "request %d logprobs differ preempted", i);
    }
}

/* Runs r (a resumed request: r->n_generated tokens of want already delivered) alone to its end
 * and checks that it goes on with want's tokens and logprobs, numbered from n_generated + 1,
 * with want's finish. */
static void check_resumed(ex_sched *s, const ex_request *r, const result *want, const char *what) {
    ex_event ev[16];
    int n_ev, got = r->n_generated, fin = 0, orig = r->n_prompt - r->n_generated;
    T_EQ_INT(ex_sched_submit(s, r), 0);
    for (int step = 0; step < 1000 && ex_sched_busy(s); step++) {
        T_EQ_INT(ex_sched_step(s, ev, 16, &n_ev), 0);
        for (int k = 0; k < n_ev; k++) {
            T_EQ_INT(ev[k].n_prompt, orig);
            if (ev[k].token >= 0) {
                T_CHECKF(got < want->n && ev[k].token == want->tok[got] &&
                             (!r->sp.logprobs || ev[k].so.logprob == want->lp[got]),
                         "%s: token %d is %d, uninterrupted %d", what, got, ev[k].token, got < want->n ? want->tok[got] : -1);
                got++;
                T_EQ_INT(ev[k].n_gen, got);
            }
            if (ev[k].finish) fin = ev[k].finish;
        }
    }
    T_CHECKF(got == want->n && fin == want->finish, "%s: %d tokens (finish %d), uninterrupted %d (finish %d)", what, got, fin,
             want->n, want->finish);
}

/* An executor died after k tokens reached the gateway: the request comes back as its prompt +
 * those k tokens with n_generated = k, and the rest is what the uninterrupted run produced
 * (greedy, seeded top-k/top-p, repetition penalty over the window that spans the resumed
 * tokens), whatever k. */
static void test_resume_continues(void) {
    ex_engine *e = mk(256, 0, 16, 64);
    ex_sched *s;
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    T_EQ_INT(ex_sched_create(e, &so, &s), 0);
    for (int i = 0; i < NREQ; i++) {
        int ks[3] = { 1, alone[i].n / 2, alone[i].n - 1 };
        for (int j = 0; j < 3; j++) {
            int32_t p[40 + MAXGEN];
            memcpy(p, prompts[i], sizeof(int32_t) * (size_t)plen[i]);
            memcpy(p + plen[i], alone[i].tok, sizeof(int32_t) * (size_t)ks[j]);
            ex_request r;
            mk_req(&r, i);
            r.id = 1000 + 10 * i + j;
            r.prompt = p;
            r.n_prompt = plen[i] + ks[j];
            r.n_generated = ks[j];
            char what[64];
            snprintf(what, sizeof what, "request %d resumed after %d", i, ks[j]);
            check_resumed(s, &r, &alone[i], what);
        }
    }
    /* refusals: nothing left to generate, no prompt of its own, negative */
    int32_t p[8] = { 1, 403, 407, 261, 378, 432, 383, 286 };
    ex_request r;
    mk_req(&r, 0);
    r.prompt = p;
    r.n_prompt = 8;
    r.sp.max_tokens = 3;
    r.n_generated = 3;
    T_EQ_INT(ex_sched_submit(s, &r), CM_EINVAL);
    r.sp.max_tokens = 20;
    r.n_generated = 8;
    T_EQ_INT(ex_sched_submit(s, &r), CM_EINVAL);
    r.n_generated = -1;
    T_EQ_INT(ex_sched_submit(s, &r), CM_EINVAL);
    T_CHECK(!ex_sched_busy(s));
    ex_sched_destroy(s);
    ex_engine_destroy(e);
}

static int run1_err; /* the err of run1's last finish */

/* Runs one request alone; returns the event list's last finish (its err in run1_err) and fills toks. */
static int run1(ex_sched *s, ex_request *r, int32_t *toks, int *n, int cancel_at) {
    ex_event ev[16];
    int n_ev, fin = 0;
    *n = 0;
    T_EQ_INT(ex_sched_submit(s, r), 0);
    for (int step = 0; step < 1000 && ex_sched_busy(s); step++) {
        if (step == cancel_at) T_EQ_INT(ex_sched_cancel(s, r->id), 0);
        T_EQ_INT(ex_sched_step(s, ev, 16, &n_ev), 0);
        for (int k = 0; k < n_ev; k++) {
            if (ev[k].token >= 0) toks[(*n)++] = ev[k].token;
            if (ev[k].finish) fin = ev[k].finish, run1_err = ev[k].err;
        }
    }
    return fin;
}

static void test_finishes(void) {
    int32_t once[5] = { 1, 403, 407, 261, 378 };
    int32_t toks[300];
    int n;
    ex_request r;
    memset(&r, 0, sizeof r);
    r.id = 1; r.prompt = once; r.n_prompt = 5;
    ex_sample_params_default(&r.sp);
    r.sp.max_tokens = 100;
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    ex_sched *s;

    ex_engine *e = mk(32, 0, 16, 64);
    ex_sched_create(e, &so, &s);
    T_EQ_INT(run1(s, &r, toks, &n, -1), SHM_FINISH_CONTEXT); /* 5 + 27 = 32 = n_ctx first */
    T_EQ_INT(n, 27);
    T_EQ_INT(toks[0], 432);
    /* a stop id: 426 is the 11th token */
    int32_t stop = 426;
    r.stop_ids = &stop; r.n_stop = 1;
    T_EQ_INT(run1(s, &r, toks, &n, -1), SHM_FINISH_STOP);
    T_EQ_INT(n, 11);
    T_EQ_INT(toks[10], 426);
    /* min_tokens: the stop id can be drawn from the (min_tokens + 1)-th token on */
    r.sp.min_tokens = 10;
    T_EQ_INT(run1(s, &r, toks, &n, -1), SHM_FINISH_STOP);
    T_EQ_INT(n, 11);
    r.sp.min_tokens = 11; /* masked where greedy would pick it: generation goes on */
    int fin = run1(s, &r, toks, &n, -1);
    T_CHECK(n > 11 && toks[10] != 426);
    int early = 0;
    for (int k = 0; k < 11; k++) early |= toks[k] == 426;
    T_CHECK(!early);
    T_CHECK(fin == SHM_FINISH_CONTEXT || (fin == SHM_FINISH_STOP && toks[n - 1] == 426));
    {   /* resumed after 5 tokens: min_tokens still counts the 5, the mask holds to the 11th */
        result want = { .n = n, .finish = fin };
        memcpy(want.tok, toks, sizeof(int32_t) * (size_t)n);
        int32_t p[32];
        memcpy(p, once, sizeof once);
        memcpy(p + 5, toks, 5 * sizeof(int32_t));
        ex_request rr = r;
        rr.id = 77;
        rr.prompt = p;
        rr.n_prompt = 10;
        rr.n_generated = 5;
        check_resumed(s, &rr, &want, "min_tokens resumed after 5");
    }
    r.sp.min_tokens = 0;
    int32_t far = 512; /* outside the vocabulary */
    r.stop_ids = &far;
    T_EQ_INT(ex_sched_submit(s, &r), CM_EINVAL);
    r.n_stop = 0; r.stop_ids = NULL;
    /* cancel while running */
    T_EQ_INT(run1(s, &r, toks, &n, 3), SHM_FINISH_CANCELLED);
    T_EQ_INT(n, 3);
    T_EQ_INT(ex_sched_cancel(s, 12345), CM_ENOTFOUND);
    /* cancel while waiting: submit two to a 1-slot... cancel the queued one before any step */
    T_EQ_INT(ex_sched_submit(s, &r), 0);
    T_EQ_INT(ex_sched_cancel(s, 1), 0);
    ex_event ev[8];
    int n_ev;
    T_EQ_INT(ex_sched_step(s, ev, 8, &n_ev), 0);
    T_EQ_INT(n_ev, 1);
    T_EQ_INT(ev[0].finish, SHM_FINISH_CANCELLED);
    T_EQ_INT(ev[0].token, -1);
    T_CHECK(!ex_sched_busy(s));
    /* submit refusals */
    int32_t big[40];
    for (int i = 0; i < 40; i++) big[i] = 5;
    ex_request b = r;
    b.prompt = big; b.n_prompt = 32;
    T_EQ_INT(ex_sched_submit(s, &b), CM_ECTX);
    b.n_prompt = 4; b.sp.max_tokens = 0;
    T_EQ_INT(ex_sched_submit(s, &b), CM_EINVAL);
    b.sp.max_tokens = 5; big[0] = 512;
    T_EQ_INT(ex_sched_submit(s, &b), CM_EINVAL); /* id outside the vocabulary */
    big[0] = 1; b.sp.top_p = 2.0f;
    T_EQ_INT(ex_sched_submit(s, &b), CM_EINVAL);
    b.sp.top_p = 1.0f;
    T_EQ_INT(ex_sched_submit(s, &b), 0);
    T_EQ_INT(ex_sched_submit(s, &b), CM_EINVAL); /* same id twice */
    ex_sched_destroy(s);
    ex_engine_destroy(e);

    /* queue cap: 2 waiting at most; ids 10.. */
    {
        ex_engine *e2 = mk(64, 0, 16, 64);
        ex_sched_opts q2;
        ex_sched_opts_default(&q2);
        q2.max_waiting = 2;
        q2.max_running = 1;
        ex_sched *s2;
        T_EQ_INT(ex_sched_create(e2, &q2, &s2), 0);
        ex_request c = r;
        c.sp.max_tokens = 3;
        c.id = 10; T_EQ_INT(ex_sched_submit(s2, &c), 0);
        c.id = 11; T_EQ_INT(ex_sched_submit(s2, &c), 0);
        c.id = 12; T_EQ_INT(ex_sched_submit(s2, &c), CM_EFULL);
        ex_event e3[4];
        int ne, done = 0;
        T_EQ_INT(ex_sched_step(s2, e3, 4, &ne), 0);       /* 10 runs, 11 waits */
        c.id = 12; T_EQ_INT(ex_sched_submit(s2, &c), 0);
        T_EQ_INT(ex_sched_cancel(s2, 11), 0);              /* cancel a waiting one */
        T_EQ_INT(ex_sched_step(s2, e3, 0, &ne), CM_EINVAL); /* cap below max_running */
        for (int k = 0; k < 50 && ex_sched_busy(s2); k++) {
            T_EQ_INT(ex_sched_step(s2, e3, 4, &ne), 0);
            for (int j = 0; j < ne; j++)
                if (e3[j].finish) {
                    done++;
                    T_EQ_INT(e3[j].finish, e3[j].id == 11 ? SHM_FINISH_CANCELLED : SHM_FINISH_LENGTH);
                }
        }
        T_EQ_INT(done, 3);
        ex_sched_stats st2;
        ex_sched_stats_get(s2, &st2);
        T_EQ_INT(st2.kv_free, st2.kv_total);
        ex_sched_destroy(s2);
        ex_engine_destroy(e2);
    }

    /* a pool of 3 blocks of 4 (12 positions): a request whose prompt + max_tokens could never
     * fit it alone is refused at submit (the gateway answers 400 naming the limit) instead of
     * failing mid-generation; one that fits runs to its end */
    e = mk(64, 3, 4, 64);
    ex_sched_create(e, &so, &s);
    T_EQ_INT(ex_sched_submit(s, &r), CM_ENOKV);          /* 5 + 100 > 12 */
    ex_request fits = r;
    fits.sp.max_tokens = 7;                               /* 5 + 7 = 12 */
    T_EQ_INT(run1(s, &fits, toks, &n, -1), SHM_FINISH_LENGTH);
    T_EQ_INT(n, 7);
    fits.id = 2;
    fits.sp.max_tokens = 8;                               /* 13 > 12 */
    T_EQ_INT(ex_sched_submit(s, &fits), CM_ENOKV);
    b.n_prompt = 13;
    T_EQ_INT(ex_sched_submit(s, &b), CM_ENOKV); /* 14 positions > 12 */
    ex_sched_stats st;
    ex_sched_stats_get(s, &st);
    T_EQ_INT(st.kv_free, 3);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
}

int main(void) {
    char err[256];
    if (mdl_load(T_MODELS "stories260K.gguf", &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    test_batched_equals_alone();
    test_resume_continues();
    test_finishes();
    mdl_free(m);
    return t_done();
}
