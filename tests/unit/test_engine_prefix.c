/* Prefix cache: the KV manager's keys, pending and computed blocks, the LRU and eviction, and
 * through the scheduler on the stories260K model: greedy and seeded outputs identical with the
 * cache on and off — across full hits, partial hits, hits of whole prompts (the last token
 * recomputed), evictions, copied partial blocks (the n choices of a request), an FP8 KV cache —
 * cached_tokens exact, and a random stress (admit, finish, cancel, preempt, evict, fork) that
 * checks the pool's invariants every step and finds every block back when idle. */
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/sched.h"
#include "common/cm_err.h"
#include "model/dtype.h"
#include "model/model.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>

static mdl_model *m;

/* ---- the KV manager alone ------------------------------------------------------------------ */

static void check_kv(const ex_kv *kv) {
    char err[256] = "";
    int rc = ex_kv_check(kv, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
}

/* Hashes of the n full blocks of toks (block size bs). */
static void hashes(const ex_kv *kv, const int32_t *toks, int n, int bs, uint64_t *h) {
    for (int j = 0; j < n; j++) h[j] = ex_kv_block_hash(j ? h[j - 1] : ex_kv_prefix_root(kv), toks + j * bs, bs);
}

static void test_kv(void) {
    enum { BS = 4, NB = 8 };
    ex_kv *kv;
    T_EQ_INT(ex_kv_create(NB, BS, &kv), 0);
    T_EQ_INT(ex_kv_prefix_enable(kv, 77), 0);
    T_CHECK(ex_kv_prefix_enabled(kv));
    int32_t toks[16], other[16], ids[8], pend;
    uint32_t pgen;
    for (int i = 0; i < 16; i++) toks[i] = 100 + i, other[i] = 100 + i;
    other[13] = 7; /* differs in block 3 */
    uint64_t h[4], ho[4];
    hashes(kv, toks, 4, BS, h);
    hashes(kv, other, 4, BS, ho);
    T_CHECK(h[2] == ho[2] && h[3] != ho[3]);

    ex_kv_table a, b, c;
    ex_kv_table_init(&a, 4);
    ex_kv_table_init(&b, 4);
    ex_kv_table_init(&c, 4);
    T_EQ_INT(ex_kv_prefix_match(kv, h, toks, 4, ids, &pend, &pgen), 0);
    T_EQ_INT(pend, -1);
    /* a computes 12 positions: registered pending, then computed in two steps */
    T_EQ_INT(ex_kv_table_reserve(kv, &a, 12), 0);
    ex_kv_table_register(kv, &a, h, toks, 3);
    T_EQ_INT(a.n_reg, 3);
    T_EQ_INT(ex_kv_prefix_match(kv, h, toks, 4, ids, &pend, &pgen), 0);
    T_EQ_INT(pend, a.blocks[0]);
    T_CHECK(ex_kv_prefix_pending(kv, pend, pgen));
    ex_kv_table_computed(kv, &a, 9); /* blocks 0 and 1 */
    T_EQ_INT(ex_kv_prefix_match(kv, h, toks, 4, ids, &pend, &pgen), 2);
    T_EQ_INT(pend, a.blocks[2]);
    ex_kv_table_computed(kv, &a, 12);
    T_CHECK(!ex_kv_prefix_pending(kv, pend, pgen));
    T_EQ_INT(ex_kv_prefix_match(kv, h, toks, 4, ids, &pend, &pgen), 3);
    T_EQ_INT(pend, -1);
    T_CHECK(ids[0] == a.blocks[0] && ids[2] == a.blocks[2]);
    /* same tokens under another root (another model) do not match */
    uint64_t hr[4];
    for (int j = 0; j < 4; j++) hr[j] = ex_kv_block_hash(j ? hr[j - 1] : 78, toks + j * BS, BS);
    T_EQ_INT(ex_kv_prefix_match(kv, hr, toks, 4, ids, NULL, NULL), 0);
    check_kv(kv);

    /* b shares a's cached blocks while a holds them; a goes, b keeps them */
    T_EQ_INT(ex_kv_prefix_match(kv, ho, other, 4, b.blocks, NULL, NULL), 3);
    T_EQ_INT(ex_kv_table_adopt(kv, &b, 3), 0);
    T_EQ_INT(ex_kv_block_refcount(kv, a.blocks[0]), 2);
    ex_kv_table_release(kv, &a);
    T_EQ_INT(ex_kv_n_cached(kv), 0);
    T_EQ_INT(ex_kv_n_free(kv), NB - 3);
    T_EQ_INT(ex_kv_block_refcount(kv, b.blocks[2]), 1);
    T_EQ_INT(ex_kv_table_reserve(kv, &b, 16), 0);
    ex_kv_table_register(kv, &b, ho, other, 4);
    T_EQ_INT(b.n_reg, 4);
    T_EQ_INT(ex_kv_prefix_match(kv, ho, other, 4, ids, &pend, NULL), 3); /* block 3 pending */
    T_EQ_INT(pend, b.blocks[3]);
    ex_kv_table_computed(kv, &b, 16);
    T_EQ_INT(ex_kv_prefix_match(kv, ho, other, 4, ids, NULL, NULL), 4);
    T_EQ_INT(ex_kv_prefix_match(kv, h, toks, 4, ids, NULL, NULL), 3);
    check_kv(kv);
    /* c takes the last free blocks */
    T_EQ_INT(ex_kv_table_reserve(kv, &c, 16), 0);
    T_EQ_INT(ex_kv_n_free(kv), 0);
    int32_t blk;
    T_EQ_INT(ex_kv_block_alloc(kv, &blk), CM_ENOKV);
    T_EQ_INT(ex_kv_table_reserve(kv, &a, 1), CM_ENOKV);
    check_kv(kv);
    /* c computes other's blocks again: a duplicate of b's cached ones, not registered */
    ex_kv_table_register(kv, &c, ho, other, 3);
    T_EQ_INT(c.n_reg, 0);
    T_EQ_INT(c.reg_off, 1);
    ex_kv_table_release(kv, &c);
    T_EQ_INT(ex_kv_n_cached(kv), 0);
    T_EQ_INT(ex_kv_n_free(kv), 4);
    /* release b: its 4 blocks wait; a pending block whose holder goes leaves the cache */
    ex_kv_table_release(kv, &b);
    T_EQ_INT(ex_kv_n_cached(kv), 4);
    T_EQ_INT(ex_kv_prefix_match(kv, ho, other, 4, ids, NULL, NULL), 4);
    T_EQ_INT(ex_kv_table_reserve(kv, &c, 4), 0); /* a free block, no eviction */
    T_EQ_INT(ex_kv_n_cached(kv), 4);
    int32_t alien[4] = { 1, 2, 3, 4 };
    uint64_t ha;
    hashes(kv, alien, 1, BS, &ha);
    ex_kv_table_register(kv, &c, &ha, alien, 1);
    T_EQ_INT(ex_kv_prefix_match(kv, &ha, alien, 1, ids, &pend, NULL), 0);
    T_EQ_INT(pend, c.blocks[0]);
    ex_kv_table_release(kv, &c);
    T_EQ_INT(ex_kv_prefix_match(kv, &ha, alien, 1, ids, &pend, NULL), 0);
    T_EQ_INT(pend, -1);
    T_EQ_INT(ex_kv_n_free(kv), NB);
    check_kv(kv);

    /* eviction takes the least recently released first, a sequence's deepest block first (a
     * child never outlives its parent in the cache) */
    T_EQ_INT(ex_kv_prefix_match(kv, ho, other, 4, b.blocks, NULL, NULL), 4);
    int32_t held[NB];
    for (int i = 0; i < 4; i++) T_EQ_INT(ex_kv_block_alloc(kv, &held[i]), 0); /* the 4 free ones */
    for (int i = 4; i < NB; i++) {
        T_EQ_INT(ex_kv_block_alloc(kv, &held[i]), 0);
        T_EQ_INT(held[i], b.blocks[NB - 1 - i]);
        T_EQ_INT(ex_kv_prefix_match(kv, ho, other, 4, ids, NULL, NULL), NB - 1 - i);
        check_kv(kv);
    }
    T_EQ_INT(ex_kv_n_cached(kv), 0);
    for (int i = 0; i < NB; i++) ex_kv_block_unref(kv, held[i]);
    T_EQ_INT(ex_kv_n_free(kv), NB);
    /* a block cached again under the same key after it left: found again */
    T_EQ_INT(ex_kv_table_reserve(kv, &c, 4), 0);
    ex_kv_table_register(kv, &c, ho, other, 1);
    ex_kv_table_computed(kv, &c, 4);
    T_EQ_INT(ex_kv_prefix_match(kv, ho, other, 4, ids, NULL, NULL), 1);
    ex_kv_table_release(kv, &c);
    check_kv(kv);
    ex_kv_table_free(&a);
    ex_kv_table_free(&b);
    ex_kv_table_free(&c);
    ex_kv_destroy(kv);

    /* a sliding-window pool is not cached; a pool in use cannot start caching */
    T_EQ_INT(ex_kv_create_swa(8, 8, 4, 8, &kv), 0);
    T_EQ_INT(ex_kv_prefix_enable(kv, 1), CM_EUNSUPPORTED);
    ex_kv_destroy(kv);
    T_EQ_INT(ex_kv_create(8, 4, &kv), 0);
    T_EQ_INT(ex_kv_block_alloc(kv, &blk), 0);
    T_EQ_INT(ex_kv_prefix_enable(kv, 1), CM_ESTATE);
    ex_kv_block_unref(kv, blk);
    ex_kv_destroy(kv);
}

/* ---- through the scheduler -------------------------------------------------------------- */

#define MAXG 48
#define MAXJ 160

typedef struct {
    const int32_t *prompt;
    int      n_prompt, max_tokens;
    float    temp;
    int      arrival;     /* step it is submitted at; -1: when the job before it has finished */
    int      cancel_after;/* steps after its submission it is cancelled at (0: never) */
    int32_t  priority;
    uint64_t tenant;
    /* results */
    int32_t  tok[MAXG];
    float    lp[MAXG];
    int      n, finish, cached, submitted;
} job;

typedef struct {
    int kv_blocks, block_size, max_tokens, max_seqs, kv_type, no_prefix;
} setup;

static ex_engine *mk(const setup *u) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 256;
    o.kv_blocks = u->kv_blocks;
    o.kv_cache_mb = 4;
    o.block_size = u->block_size;
    o.max_tokens = u->max_tokens;
    o.max_seqs = u->max_seqs;
    o.kv_type = u->kv_type;
    char err[256];
    ex_engine *e = NULL;
    int rc = ex_engine_create(m, &o, &e, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    return e;
}

/* Runs the jobs to the end on a fresh engine; checks the pool's invariants every step when
 * check is set. Returns the scheduler's final stats. */
static ex_sched_stats run_jobs(const setup *u, job *J, int n, int check) {
    ex_engine *e = mk(u);
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    so.no_prefix_cache = u->no_prefix;
    ex_sched *s;
    T_EQ_INT(ex_sched_create(e, &so, &s), 0);
    for (int i = 0; i < n; i++) {
        J[i].n = J[i].finish = 0;
        J[i].cached = -1;
        J[i].submitted = -1;
    }
    ex_event ev[128];
    int left = n, n_ev;
    for (int step = 0; left > 0 && step < 20000; step++) {
        for (int i = 0; i < n; i++) {
            job *j = &J[i];
            int due = j->arrival >= 0 ? j->arrival == step : (j->submitted < 0 && (i == 0 || J[i - 1].finish));
            if (due && j->submitted < 0) {
                ex_request r;
                memset(&r, 0, sizeof r);
                r.id = 1000 + (uint64_t)i;
                r.prompt = j->prompt;
                r.n_prompt = j->n_prompt;
                ex_sample_params_default(&r.sp);
                r.sp.max_tokens = (uint32_t)j->max_tokens;
                r.sp.temperature = j->temp;
                r.sp.top_k = 40;
                r.sp.seed = 5000 + (uint64_t)i;
                r.sp.logprobs = 1;
                r.priority = j->priority;
                r.tenant = j->tenant;
                r.weight = 1;
                T_EQ_INT(ex_sched_submit(s, &r), 0);
                j->submitted = step;
            }
            if (j->submitted >= 0 && j->cancel_after && step == j->submitted + j->cancel_after && !j->finish)
                T_EQ_INT(ex_sched_cancel(s, 1000 + (uint64_t)i), 0);
        }
        T_EQ_INT(ex_sched_step(s, ev, 128, &n_ev), 0);
        for (int k = 0; k < n_ev; k++) {
            int i = (int)(ev[k].id - 1000);
            if (i < 0 || i >= n) { T_CHECK(0); continue; }
            job *j = &J[i];
            if (ev[k].token >= 0 && j->n < MAXG) {
                j->tok[j->n] = ev[k].token;
                j->lp[j->n] = ev[k].so.logprob;
                j->n++;
            }
            if (ev[k].token >= 0) j->cached = ev[k].n_cached;
            if (ev[k].finish) {
                j->finish = ev[k].finish;
                if (j->cached < 0) j->cached = ev[k].n_cached;
                left--;
            }
        }
        if (check) check_kv(ex_engine_kv(e));
    }
    T_EQ_INT(left, 0);
    ex_sched_stats st;
    ex_sched_stats_get(s, &st);
    T_EQ_INT(st.kv_free, st.kv_total); /* every block back (free, or cached and reusable) */
    ex_kv *kv = ex_engine_kv(e);
    int held = 0;
    for (int b = 0; b < ex_kv_n_blocks(kv); b++) held += ex_kv_block_refcount(kv, b) != 0;
    T_EQ_INT(held, 0);
    check_kv(kv);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
    return st;
}

/* The same tokens and logprobs (bit for bit) in both runs, for every job not cancelled. */
static void same_outputs(const job *a, const job *b, int n, const char *what) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (a[i].cancel_after || b[i].cancel_after) continue;
        if (a[i].n != b[i].n || memcmp(a[i].tok, b[i].tok, sizeof(int32_t) * (size_t)a[i].n) ||
            memcmp(a[i].lp, b[i].lp, sizeof(float) * (size_t)a[i].n) || a[i].finish != b[i].finish) {
            if (!bad) fprintf(stderr, "%s: job %d differs (%d vs %d tokens)\n", what, i, a[i].n, b[i].n);
            bad++;
        }
    }
    T_CHECKF(bad == 0, "%s: %d jobs differ", what, bad);
}

static int32_t P[8][128];

static void mk_prompts(void) {
    uint32_t x = 7;
    for (int p = 0; p < 8; p++) {
        P[p][0] = 1;
        for (int i = 1; i < 128; i++) { x = x * 1664525u + 1013904223u; P[p][i] = 3 + (int32_t)((x >> 9) % 500); }
    }
    /* P[1] shares P[0]'s first 40 tokens (2 blocks of 16 and half a block), P[2] its first 48 */
    memcpy(P[1], P[0], 40 * sizeof(int32_t));
    memcpy(P[2], P[0], 48 * sizeof(int32_t));
}

static void test_hits(int kv_type) {
    setup on = { .kv_blocks = 64, .block_size = 16, .max_tokens = 64, .max_seqs = 8, .kv_type = kv_type };
    setup off = on;
    off.no_prefix = 1;
    /* one after the other: the second finds the first's blocks */
    job J[] = {
        { .prompt = P[0], .n_prompt = 70, .max_tokens = 20, .arrival = 0 },
        { .prompt = P[0], .n_prompt = 70, .max_tokens = 20, .arrival = -1 },          /* 4 blocks hit */
        { .prompt = P[1], .n_prompt = 60, .max_tokens = 12, .arrival = -1, .temp = 0.8f }, /* 2 blocks hit */
        { .prompt = P[0], .n_prompt = 48, .max_tokens = 10, .arrival = -1 },          /* 3 whole blocks: 47 */
        { .prompt = P[0], .n_prompt = 90, .max_tokens = 10, .arrival = -1 },          /* job 0's output is not P[0][70..] */
        { .prompt = P[2], .n_prompt = 100, .max_tokens = 8, .arrival = -1, .temp = 1.0f },
        { .prompt = P[0], .n_prompt = 15, .max_tokens = 8, .arrival = -1 },           /* under a block: nothing */
    };
    enum { N = sizeof J / sizeof J[0] };
    job K[N];
    memcpy(K, J, sizeof J);
    ex_sched_stats st = run_jobs(&on, J, N, 1), st_off = run_jobs(&off, K, N, 1);
    same_outputs(J, K, N, kv_type == DT_F8_E4M3 ? "fp8 cache on/off, one after the other" : "cache on/off, one after the other");
    T_EQ_INT(J[0].cached, 0);
    T_EQ_INT(J[1].cached, 64);
    T_EQ_INT(J[2].cached, 32);
    T_EQ_INT(J[3].cached, 47); /* the last whole block's first 15 positions copied, its last token computed */
    T_EQ_INT(J[4].cached, 64);
    T_EQ_INT(J[5].cached, 48);
    T_EQ_INT(J[6].cached, 0);
    for (int i = 0; i < N; i++) T_EQ_INT(K[i].cached, 0);
    T_CHECK(st.prefix_cache && !st_off.prefix_cache);
    T_EQ_INT(st.prefix_hits, 64 + 32 + 47 + 64 + 48);
    T_EQ_INT(st.prefix_queries, 70 + 70 + 60 + 48 + 90 + 100 + 15);
    T_EQ_INT(st.kv_copies, 1);
    T_EQ_INT(st_off.prefix_queries, 0);
    T_CHECK(st.tokens_forwarded + 64 + 32 + 47 + 64 + 48 == st_off.tokens_forwarded);

    /* the n choices of one request: submitted together, the first computes the prompt, the
     * others wait for it, take its blocks and copy the partly filled last one */
    job C[] = {
        { .prompt = P[3], .n_prompt = 45, .max_tokens = 16, .arrival = 0, .temp = 0.9f },
        { .prompt = P[3], .n_prompt = 45, .max_tokens = 16, .arrival = 0, .temp = 0.9f },
        { .prompt = P[3], .n_prompt = 45, .max_tokens = 16, .arrival = 0, .temp = 0.9f },
        { .prompt = P[3], .n_prompt = 45, .max_tokens = 16, .arrival = 0 },
        { .prompt = P[4], .n_prompt = 10, .max_tokens = 16, .arrival = 0 },          /* under a block */
        { .prompt = P[4], .n_prompt = 10, .max_tokens = 16, .arrival = 0 },
    };
    enum { NC = sizeof C / sizeof C[0] };
    job D[NC];
    memcpy(D, C, sizeof C);
    st = run_jobs(&on, C, NC, 1);
    run_jobs(&off, D, NC, 1);
    same_outputs(C, D, NC, "n choices, cache on/off");
    T_EQ_INT(C[0].cached, 0);
    for (int i = 1; i < 4; i++) T_EQ_INT(C[i].cached, 44);
    T_EQ_INT(C[4].cached, 0);
    T_EQ_INT(C[5].cached, 0); /* nothing to wait for: both compute their 10 tokens */
    T_EQ_INT(st.kv_copies, 3);
    /* greedy choice 3 and seeded choices differ from each other but each equals its cache-off run */
    T_CHECK(memcmp(C[0].tok, C[1].tok, sizeof(int32_t) * 16) != 0);
}

/* A pool too small to keep everything: hits, partial hits and evictions interleave. */
static void test_evictions(void) {
    setup on = { .kv_blocks = 24, .block_size = 16, .max_tokens = 48, .max_seqs = 3 };
    setup off = on;
    off.no_prefix = 1;
    job J[40];
    memset(J, 0, sizeof J);
    uint32_t x = 3;
    for (int i = 0; i < 40; i++) {
        x = x * 1664525u + 1013904223u;
        J[i].prompt = P[(x >> 8) % 5];
        J[i].n_prompt = 20 + (int)((x >> 12) % 100);
        J[i].max_tokens = 4 + (int)((x >> 20) % 24);
        J[i].temp = (x >> 28) % 2 ? 0.7f : 0.0f;
        J[i].arrival = i < 6 ? 0 : -1;
    }
    job K[40];
    memcpy(K, J, sizeof J);
    ex_sched_stats st = run_jobs(&on, J, 40, 1);
    run_jobs(&off, K, 40, 0);
    same_outputs(J, K, 40, "small pool, cache on/off");
    T_CHECKF(st.prefix_hits > 0 && st.prefix_hits < st.prefix_queries, "hits %llu of %llu",
             (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries);
    int partial = 0;
    for (int i = 0; i < 40; i++) partial += J[i].cached > 0 && J[i].cached < J[i].n_prompt - 1;
    T_CHECK(partial > 0);
}

/* Random stress: arrivals, cancels, preemption (a small pool), eviction, forks (identical
 * prompts at once), priorities and tenants; the pool's invariants hold every step and every
 * block comes back; what was not cancelled equals the cache-off run. */
static void test_stress(void) {
    int n = getenv("ARKA_LONG_TESTS") ? MAXJ : 60;
    setup on = { .kv_blocks = 20, .block_size = 8, .max_tokens = 24, .max_seqs = 6 };
    setup off = on;
    off.no_prefix = 1;
    job *J = calloc(MAXJ, sizeof *J), *K = calloc(MAXJ, sizeof *K);
    uint32_t x = 11;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        job *j = &J[i];
        j->prompt = P[(x >> 8) % 4];
        j->n_prompt = 4 + (int)((x >> 11) % 60);
        j->max_tokens = 1 + (int)((x >> 18) % 30);
        j->temp = (x >> 24) % 3 ? 0.8f : 0.0f;
        j->arrival = (int)((x >> 5) % (unsigned)(2 * n));
        if (i && (x >> 27) % 4 == 0) { /* a fork: the previous job's request again, at once */
            j->prompt = J[i - 1].prompt;
            j->n_prompt = J[i - 1].n_prompt;
            j->arrival = J[i - 1].arrival;
        }
        j->cancel_after = (x >> 29) == 0 ? 1 + (int)(x % 5) : 0;
        j->priority = (int32_t)((x >> 3) % 3) - 1;
        j->tenant = (x >> 6) % 3;
    }
    memcpy(K, J, sizeof *J * (size_t)n);
    ex_sched_stats st = run_jobs(&on, J, n, 1);
    run_jobs(&off, K, n, 0);
    same_outputs(J, K, n, "stress, cache on/off");
    T_CHECK(st.preemptions > 0);
    T_CHECK(st.prefix_hits > 0);
    free(J);
    free(K);
}

int main(void) {
    char err[256];
    test_kv();
    if (mdl_load(T_MODELS "stories260K.gguf", &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    mk_prompts();
    test_hits(-1);
    test_hits(DT_F8_E4M3);
    test_evictions();
    test_stress();
    mdl_free(m);
    return t_done();
}
