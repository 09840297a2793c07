/* bench_sched: the scheduler's own costs and its fairness, apart from the compute backend.
 *
 *   bench_sched prefix [SEQS] [STEPS]   the prefix cache's bookkeeping per engine step with SEQS
 *                                        (256) running sequences, each step as the scheduler does
 *                                        it: every sequence's new token (a block hashed, cached
 *                                        and marked computed every block_size tokens), and the
 *                                        admissions that replace finished sequences (a 2,000-token
 *                                        prompt looked up, its cached blocks taken, the rest
 *                                        allocated and cached); then 4 x SEQS requests through the
 *                                        whole scheduler on stories260K, SEQS at once, with the
 *                                        cache on and off (STEPS: steps of the first part, 200)
 *   bench_sched tenants [MODEL]          two tenants through the real scheduler on stories260K,
 *                                        timed by a step-time model instead of the forward pass:
 *                                        A submits 200 requests at once, B one every 500 ms; B's
 *                                        time to first token beside A and alone, and A's makespan.
 *                                        MODEL: cpu (13 ms + 1.1 ms per token: `small` on 2 cores)
 *                                        or gpu (9 ms + 0.02 ms per token: llama3-8b on an H200),
 *                                        each with its backend's default sequences and tokens per step
 *
 * Prints one line per figure. Models: ../shared/models/stories260K.gguf. */
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/sched.h"
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    if (!n) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double r = p / 100 * (n - 1);
    int i = (int)r;
    return i + 1 < n ? v[i] + (r - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* ---- the prefix cache's bookkeeping ----------------------------------------------------------- */

typedef struct {
    ex_kv_table t;
    int32_t *toks;
    uint64_t *h;
    int n_toks, n_cached, n_h, end;
} sim_seq;

static void sim_hash(const ex_kv *kv, sim_seq *q, int bs) {
    for (; (q->n_h + 1) * bs <= q->n_toks; q->n_h++)
        q->h[q->n_h] = ex_kv_block_hash(q->n_h ? q->h[q->n_h - 1] : ex_kv_prefix_root(kv), q->toks + q->n_h * bs, bs);
}

/* A new request in q: a 2,000-token prompt (its first 1,500 tokens shared by every request)
 * looked up, taken, allocated, cached. Returns 0 or CM_ENOKV. */
static int sim_admit(ex_kv *kv, sim_seq *q, int bs, uint32_t *rng, int32_t *ids) {
    enum { PROMPT = 2000, SHARED = 1500 };
    for (int i = 0; i < PROMPT; i++) {
        *rng = *rng * 1664525u + 1013904223u;
        q->toks[i] = i < SHARED ? 3 + i % 500 : 3 + (int32_t)(*rng >> 8) % 30000;
    }
    q->n_toks = PROMPT;
    q->n_h = 0;
    sim_hash(kv, q, bs);
    int k = ex_kv_prefix_match(kv, q->h, q->toks, q->n_h, ids, NULL, NULL);
    if (k > (PROMPT - 1) / bs) k = (PROMPT - 1) / bs;
    memcpy(q->t.blocks, ids, sizeof *ids * (size_t)k);
    ex_kv_table_adopt(kv, &q->t, k);
    if (ex_kv_table_reserve(kv, &q->t, PROMPT)) {
        ex_kv_table_release(kv, &q->t);
        return CM_ENOKV;
    }
    ex_kv_table_register(kv, &q->t, q->h, q->toks, q->n_h);
    q->n_cached = PROMPT; /* its prefill is the backend's business: computed at once here */
    ex_kv_table_computed(kv, &q->t, q->n_cached);
    q->end = PROMPT + 64 + (int)(*rng % 192); /* 64..255 tokens to generate */
    return 0;
}

static int bench_prefix(int n_seqs, int steps) {
    const int bs = 16, ctx = 2400, n_blocks = n_seqs * (ctx / bs) + 4096;
    ex_kv *kv;
    if (ex_kv_create(n_blocks, bs, &kv) || ex_kv_prefix_enable(kv, 42)) return 1;
    sim_seq *q = calloc((size_t)n_seqs, sizeof *q);
    int32_t *ids = malloc(sizeof *ids * (size_t)(ctx / bs));
    uint32_t rng = 1;
    for (int i = 0; i < n_seqs; i++) {
        ex_kv_table_init(&q[i].t, ctx / bs);
        q[i].toks = malloc(sizeof *q[i].toks * (size_t)ctx);
        q[i].h = malloc(sizeof *q[i].h * (size_t)(ctx / bs));
        sim_admit(kv, &q[i], bs, &rng, ids);
        q[i].end -= (int)(rng % 200); /* staggered ends */
        rng = rng * 1664525u + 1013904223u;
    }
    /* the steady state: each step every sequence takes a token; finished ones are replaced */
    double t0 = cm_time_s();
    long admits = 0;
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < n_seqs; i++) {
            sim_seq *x = &q[i];
            if (ex_kv_table_reserve(kv, &x->t, x->n_toks + 1)) return 1;
            x->n_cached++;
            ex_kv_table_computed(kv, &x->t, x->n_cached);
            rng = rng * 1664525u + 1013904223u;
            x->toks[x->n_toks++] = 3 + (int32_t)(rng >> 8) % 30000;
            if (x->n_toks % bs == 0) {
                sim_hash(kv, x, bs);
                ex_kv_table_register(kv, &x->t, x->h, x->toks, x->n_h);
            }
            if (x->n_toks >= x->end) {
                ex_kv_table_release(kv, &x->t);
                if (sim_admit(kv, x, bs, &rng, ids)) return 1;
                admits++;
            }
        }
    }
    double dt = cm_time_s() - t0;
    char err[200];
    int rc = ex_kv_check(kv, err, sizeof err);
    printf("prefix cache bookkeeping: %d running sequences, %d steps, %.2f admissions per step (2,000-token prompts, "
           "1,500 shared), pool %d blocks of %d: %.1f us per step (%.2f us per sequence)%s%s\n",
           n_seqs, steps, (double)admits / steps, n_blocks, bs, dt / steps * 1e6, dt / steps / n_seqs * 1e6,
           rc ? ", pool check failed: " : "", rc ? err : "");
    for (int i = 0; i < n_seqs; i++) {
        ex_kv_table_release(kv, &q[i].t);
        ex_kv_table_free(&q[i].t);
        free(q[i].toks);
        free(q[i].h);
    }
    free(q);
    free(ids);
    ex_kv_destroy(kv);
    return rc != 0;
}

/* ---- whole scheduler steps ------------------------------------------------------------------- */

static mdl_model *m;

static ex_sched *mk_sched(ex_engine **e, int max_seqs, int budget, int n_ctx, int no_prefix, int fixed_tokens) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = n_ctx;
    o.max_seqs = max_seqs;
    o.max_tokens = budget;
    o.kv_cache_mb = 512;
    char err[256];
    if (ex_engine_create(m, &o, e, err, sizeof err)) {
        fprintf(stderr, "bench_sched: %s\n", err);
        exit(1);
    }
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    so.no_prefix_cache = no_prefix;
    so.max_waiting = 4096;
    so.fixed_tokens = fixed_tokens;
    ex_sched *s;
    if (ex_sched_create(*e, &so, &s)) exit(1);
    return s;
}

/* n_seqs sequences at once on stories260K, each replaced when done by a new one whose prompt
 * shares all but its last token with the others', until n_done requests have finished: the
 * wall time (forward passes included) and the steps it took. */
static double run_on_stories(int n_seqs, int n_done, int no_prefix, long *steps) {
    ex_engine *e;
    ex_sched *s = mk_sched(&e, n_seqs, n_seqs + 64, 512, no_prefix, 0);
    static int32_t prompt[200];
    uint64_t id = 1;
    uint32_t rng = 5;
    ex_event *ev = malloc(sizeof *ev * (size_t)n_seqs * 2);
    for (int i = 0; i < 200; i++) prompt[i] = 3 + i % 500;
    int live = 0, done = 0, n_ev;
    *steps = 0;
    double t0 = cm_time_s();
    while (done < n_done) {
        while (live < n_seqs) {
            ex_request r;
            memset(&r, 0, sizeof r);
            rng = rng * 1664525u + 1013904223u;
            prompt[199] = 3 + (int32_t)(rng >> 8) % 500;
            r.id = id++;
            r.prompt = prompt;
            r.n_prompt = 200;
            ex_sample_params_default(&r.sp);
            r.sp.max_tokens = 32 + rng % 200;
            if (ex_sched_submit(s, &r)) exit(1);
            live++;
        }
        if (ex_sched_step(s, ev, n_seqs * 2, &n_ev)) exit(1);
        (*steps)++;
        for (int k = 0; k < n_ev; k++)
            if (ev[k].finish) live--, done++;
    }
    double t = cm_time_s() - t0;
    free(ev);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
    return t;
}

/* ---- two tenants under a step-time model ------------------------------------------------------- */

typedef struct {
    double arrival, first;
    int tenant, done;
} sim_req;

/* Runs B's requests every 0.5 s (and, with flood, A's 200 at 0) through the scheduler, the
 * clock advanced by the model per step; fills B's TTFTs. Returns A's makespan (s). */
static double tenants_run(double a0, double per_tok, int seqs, int budget, int flood, double *ttft_b, int *n_b) {
    enum { NA = 200, PROMPT = 129, GEN = 64 };
    ex_engine *e;
    ex_sched *s = mk_sched(&e, seqs, budget, 512, 0, (int)(a0 / per_tok)); /* the model's fixed part, not stories260K's */
    int cap = NA + 2000;
    sim_req *rq = calloc((size_t)cap, sizeof *rq);
    int32_t prompt[PROMPT];
    static ex_event ev[1024];
    int n = 0, left_a = flood ? NA : 0, nb = 0, n_ev;
    double now = 0, next_b = 0, a_end = 0;
    uint32_t rng = 9;
    if (flood)
        for (; n < NA; n++) rq[n] = (sim_req){ 0, -1, 1, 0 };
    int submitted = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        if (!flood && nb >= 20) break;
        if (flood && !left_a) break;
        while (next_b <= now && n < cap) { /* B's next request */
            rq[n++] = (sim_req){ next_b, -1, 2, 0 };
            next_b += 0.5;
            nb++;
        }
        for (; submitted < n; submitted++) {
            ex_request r;
            memset(&r, 0, sizeof r);
            for (int i = 0; i < PROMPT; i++) {
                rng = rng * 1664525u + 1013904223u;
                prompt[i] = 3 + (int32_t)(rng >> 8) % 500;
            }
            r.id = 1 + (uint64_t)submitted;
            r.prompt = prompt;
            r.n_prompt = PROMPT;
            ex_sample_params_default(&r.sp);
            r.sp.max_tokens = GEN;
            r.tenant = (uint64_t)rq[submitted].tenant;
            r.weight = 1;
            if (ex_sched_submit(s, &r)) exit(1);
        }
        if (!ex_sched_busy(s)) { /* idle until B's next request */
            now = next_b;
            continue;
        }
        ex_sched_stats a, b;
        ex_sched_stats_get(s, &a);
        if (ex_sched_step(s, ev, 1024, &n_ev)) exit(1);
        ex_sched_stats_get(s, &b);
        now += a0 + per_tok * (double)(b.tokens_forwarded - a.tokens_forwarded);
        for (int k = 0; k < n_ev; k++) {
            sim_req *q = &rq[ev[k].id - 1];
            if (ev[k].token >= 0 && q->first < 0) q->first = now;
            if (ev[k].finish && q->tenant == 1 && !--left_a) a_end = now;
        }
    }
    *n_b = 0;
    for (int i = 0; i < n; i++)
        if (rq[i].tenant == 2 && rq[i].first >= 0) ttft_b[(*n_b)++] = rq[i].first - rq[i].arrival;
    free(rq);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
    return a_end;
}

static void bench_tenants(const char *model) {
    /* the cpu backend's defaults (64 sequences, 512 tokens per step), the cuda backend's for
     * llama3-8b on an H200 (512 sequences, 2,048 tokens) */
    double a0 = 0.013, per_tok = 0.0011;
    int seqs = 64, budget = 512;
    if (!strcmp(model, "gpu")) a0 = 0.009, per_tok = 0.00002, seqs = 512, budget = 2048;
    static double alone[4000], beside[4000];
    int n1, n2;
    tenants_run(a0, per_tok, seqs, budget, 0, alone, &n1);
    double makespan = tenants_run(a0, per_tok, seqs, budget, 1, beside, &n2);
    double p50a = pct(alone, n1, 50), p99a = pct(alone, n1, 99), p50b = pct(beside, n2, 50), p99b = pct(beside, n2, 99);
    printf("tenants (%s model: %.0f ms + %.3f ms per token per step): A's 200 requests done at %.1f s; B alone TTFT p50 %.0f "
           "p99 %.0f ms (%d); beside A p50 %.0f p99 %.0f ms (%d): %.2fx, %.2fx\n",
           model, a0 * 1e3, per_tok * 1e3, makespan, p50a * 1e3, p99a * 1e3, n1, p50b * 1e3, p99b * 1e3, n2, p50b / p50a,
           p99b / p99a);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "prefix";
    char err[256];
    if (mdl_load("../shared/models/stories260K.gguf", &m, err, sizeof err)) {
        fprintf(stderr, "bench_sched: %s (run from the project root)\n", err);
        return 1;
    }
    int rc = 0;
    if (!strcmp(what, "prefix")) {
        int n = argc > 2 ? atoi(argv[2]) : 256, steps = argc > 3 ? atoi(argv[3]) : 200;
        rc = bench_prefix(n, steps);
        long s_on, s_off;
        double on = run_on_stories(n, 4 * n, 0, &s_on), off = run_on_stories(n, 4 * n, 1, &s_off);
        printf("whole scheduler steps on stories260K, %d sequences at once, %d requests of 200 prompt tokens (199 shared) "
               "and 32..231 generated: %.2f s in %ld steps (%.2f ms a step) with the prefix cache, %.2f s in %ld steps "
               "(%.2f ms) without\n", n, 4 * n, on, s_on, on / s_on * 1e3, off, s_off, off / s_off * 1e3);
    } else if (!strcmp(what, "tenants")) {
        bench_tenants(argc > 2 ? argv[2] : "cpu");
    } else {
        fprintf(stderr, "usage: bench_sched prefix [SEQS] [STEPS] | tenants [cpu|gpu]\n");
        rc = 2;
    }
    mdl_free(m);
    return rc;
}
