/* The device sampler against the CPU sampler. On random logits rows (vocabularies 17, 257,
 * 1000, 32000, 128256; flat, peaked, llm-like and coarsely quantised rows full of exact ties)
 * every row is sampled by kc_sample (packed by the cuda backend's stager), by kc_sample_host
 * (the same algorithm on one host thread) and by ex_sampler_sample on the same logits, over
 * greedy, T in {0.5, 1, 1.5} x top_k {0, 1, 5, 50, V} x top_p {1, 0.9, 0.5, 1e-6} x min_p
 * {0, 0.05, 0.5}, with penalty windows (duplicates, last_n -1/64/10), bias lists (duplicates,
 * -1e30, -inf, 300 entries), token masks (sparse, dense, the best tokens left out, every
 * allowed token biased to -inf), logprobs and top_logprobs = 20, two seeds/positions each. Tokens
 * must be identical (any mismatch fails, boundary cases included: these inputs have none),
 * logprobs within 1e-5. Then the stager's limits and refusals, the backend path through
 * ex_engine_forward_sample (prefill, graph decode, host fallback) when a model is given, and
 * the kernel's time for 128 rows x 32000 (greedy; T=1, top_p=0.9).
 *
 * usage: test_gpu_sample [--host] [--quick] [MODEL.gguf]
 *   --host:  only what needs no GPU (the host emulation and the stager), e.g. on a CPU machine
 *   --quick: V = 257, peaked and tied rows, one seed set, no timing (for compute-sanitizer) */
#include "executor/cuda/cuda_sample.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/sampler.h"
#include "kernels/cuda/kcuda.h"
#include "common/cm_err.h"
#include "model/model.h"
#include "tests/unit/t.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ck.h"

#define MAXR 128    /* rows per launch */
#define NPREV 200   /* previous tokens of every row */
#define LP_TOL 1e-5

static int host_only, quick;
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static double urand(void) { return (rnd() >> 11) * (1.0 / 9007199254740992.0); }
static double gauss(void) {
    double u = urand() + 1e-300, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

enum { D_FLAT, D_PEAKED, D_LLM, D_TIES, N_DIST };
static const char *const dist_name[N_DIST] = { "flat", "peaked", "llm", "ties" };

static void make_row(float *z, int V, int dist) {
    for (int i = 0; i < V; i++) {
        switch (dist) {
        case D_FLAT: z[i] = (float)(urand() * 2 - 1); break;
        case D_PEAKED: z[i] = (float)(gauss() * 3); break;
        case D_LLM: z[i] = (float)(gauss() * 2 - 4); break;
        default: z[i] = (float)(floor(gauss() * 8) / 4); break; /* steps of 0.25: ties everywhere */
        }
    }
    if (dist == D_PEAKED)
        for (int j = 0; j < 4; j++) z[rnd() % V] = (float)(10 + 2 * urand());
    if (dist == D_LLM) z[rnd() % V] = 12.0f;
    if (dist == D_TIES) { /* the maximum three times over */
        float mx = z[0];
        for (int i = 1; i < V; i++) mx = z[i] > mx ? z[i] : mx;
        for (int j = 0; j < 3; j++) z[rnd() % V] = mx;
    }
}

/* The highest ids of a row (the penalty windows draw from them so penalties change ranks). */
static void top_ids(const float *z, int V, int32_t *out, int n) {
    for (int j = 0; j < n; j++) out[j] = -1;
    for (int i = 0; i < V; i++) {
        int j = n;
        while (j > 0 && (out[j - 1] < 0 || z[i] > z[out[j - 1]])) j--;
        if (j < n) {
            memmove(out + j + 1, out + j, sizeof *out * (size_t)(n - j - 1));
            out[j] = i;
        }
    }
}

#define MAXW ((128256 + 31) / 32)

typedef struct tcase {
    ex_sample_params sp;
    struct shm_logit_bias bias[300];
    int n_bias;
    int32_t prev[NPREV];
    uint32_t mask[MAXW];
    int masked;
} tcase;

static void allow(uint32_t *mk, int t) { mk[t >> 5] |= 1u << (t & 31); }

/* A grammar's token mask for case m (every fourth case has one): sparse (8 tokens, one of the
 * best among them), dense (each token with probability 0.9, the best left out), the best four
 * left out of an all-allowed mask, or two tokens both biased to -inf (the lowest allowed id). */
static void make_mask(tcase *t, int m, int V, const int32_t *tops) {
    const int W = (V + 31) / 32;
    t->masked = m % 4 == 3;
    if (!t->masked) return;
    memset(t->mask, 0, sizeof(uint32_t) * (size_t)W);
    switch ((m / 4) % 4) {
    case 0:
        for (int i = 0; i < 8; i++) allow(t->mask, (int)(rnd() % V));
        allow(t->mask, tops[3]);
        break;
    case 1:
        for (int i = 0; i < V; i++) if (urand() < 0.9) allow(t->mask, i);
        t->mask[tops[0] >> 5] &= ~(1u << (tops[0] & 31));
        break;
    case 2:
        for (int i = 0; i < V; i++) allow(t->mask, i);
        for (int j = 0; j < 4; j++) t->mask[tops[j] >> 5] &= ~(1u << (tops[j] & 31));
        if (V < 8) allow(t->mask, V - 1);
        break;
    default: { /* both allowed tokens impossible: the sampler answers the lower id */
        int a = (int)(rnd() % V), b = (int)(rnd() % V);
        allow(t->mask, a);
        allow(t->mask, b);
        t->n_bias = 2;
        t->bias[0] = (struct shm_logit_bias){ a, -INFINITY };
        t->bias[1] = (struct shm_logit_bias){ b, -INFINITY };
        t->sp.logprobs = t->sp.top_logprobs = 0; /* every logprob is NaN then, on both sides */
        break;
    }
    }
    if (V % 32) t->mask[W - 1] |= ~((1u << (V % 32)) - 1); /* bits past the vocabulary are ignored */
}

/* Parameters of case c (0 = greedy, then T x top_k x top_p x min_p), penalties, bias and
 * logprobs cycling with c and the seed set. */
static void make_case(tcase *t, int c, int set, int V, const int32_t *tops) {
    static const float temps[3] = { 0.5f, 1.0f, 1.5f }, top_ps[4] = { 1.0f, 0.9f, 0.5f, 1e-6f }, min_ps[3] = { 0, 0.05f, 0.5f };
    const int top_ks[5] = { 0, 1, 5, 50, V };
    ex_sample_params *p = &t->sp;
    ex_sample_params_default(p);
    t->n_bias = 0;
    if (c > 0) {
        int k = c - 1;
        p->temperature = temps[k % 3];
        p->top_k = top_ks[(k / 3) % 5];
        p->top_p = top_ps[(k / 15) % 4];
        p->min_p = min_ps[(k / 60) % 3];
    }
    p->seed = rnd();
    int m = c + 7 * set;
    switch (m % 5) {
    case 1: p->repeat_penalty = 1.3f; p->penalty_last_n = 64; break;
    case 2: p->presence_penalty = 0.5f; p->frequency_penalty = 0.2f; p->penalty_last_n = -1; break;
    case 3: p->repeat_penalty = 1.1f; p->presence_penalty = 0.3f; p->frequency_penalty = 0.7f; p->penalty_last_n = 10; break;
    case 4: p->repeat_penalty = 0.8f; p->penalty_last_n = 64; break;
    }
    for (int i = 0; i < NPREV; i++) t->prev[i] = rnd() % 3 ? tops[rnd() % 12] : (int32_t)(rnd() % V);
    switch ((m / 5) % 4) {
    case 1:
        t->n_bias = 10;
        for (int i = 0; i < 10; i++) t->bias[i] = (struct shm_logit_bias){ (int32_t)(rnd() % V), (float)(gauss() * 3) };
        t->bias[3] = (struct shm_logit_bias){ tops[0], -1e30f };
        t->bias[6] = t->bias[1]; /* a duplicate: added twice */
        t->bias[7] = (struct shm_logit_bias){ tops[2], 5.0f };
        break;
    case 2:
        t->n_bias = 3;
        t->bias[0] = (struct shm_logit_bias){ tops[0], -INFINITY };
        t->bias[1] = (struct shm_logit_bias){ tops[1], -100.0f };
        t->bias[2] = (struct shm_logit_bias){ tops[5], 3.0f };
        break;
    case 3:
        t->n_bias = 300;
        for (int i = 0; i < 300; i++) t->bias[i] = (struct shm_logit_bias){ (int32_t)(rnd() % V), (float)(urand() * 4 - 2) };
        break;
    }
    p->logprobs = m % 3 == 1;
    p->top_logprobs = m % 3 == 2 ? EX_MAX_LOGPROBS : 0;
    make_mask(t, m, V, tops);
}

typedef struct tally {
    long rows, tok_bad, lp_bad, top_bad;
} tally;

static int lp_close(float a, float b) { return (isinf(a) && a == b) || fabs((double)a - (double)b) <= LP_TOL; }

/* Compares one result with the CPU's; prints the first few differences. */
static void compare(const char *who, const ex_sample_out *got, const ex_sample_out *want, const ex_sample_row *row, int V,
                    int dist, const float *z, tally *t) {
    const ex_sample_params *p = row->sp;
    t->rows++;
    int bad = 0;
    if (got->token != want->token) { t->tok_bad++; bad = 1; }
    if ((p->logprobs || p->top_logprobs) && !lp_close(got->logprob, want->logprob)) { t->lp_bad++; bad = 1; }
    int top_ok = got->n_top == want->n_top;
    for (int j = 0; j < want->n_top && top_ok; j++)
        top_ok = got->top_id[j] == want->top_id[j] && lp_close(got->top_logprob[j], want->top_logprob[j]);
    if (!top_ok) { t->top_bad++; bad = 1; }
    if (bad && t->tok_bad + t->lp_bad + t->top_bad <= 8)
        fprintf(stderr,
                "%s differs: V=%d %s T=%g top_k=%d top_p=%g min_p=%g pen=(%g,%g,%g,last %d) bias=%d lp=%d/%d seed=%llu: "
                "token %d (z %g) vs cpu %d (z %g), logprob %.8g vs %.8g, n_top %d vs %d\n",
                who, V, dist_name[dist], p->temperature, p->top_k, p->top_p, p->min_p, p->repeat_penalty, p->presence_penalty,
                p->frequency_penalty, p->penalty_last_n, row->n_bias, p->logprobs, p->top_logprobs, (unsigned long long)p->seed,
                got->token, got->token >= 0 && got->token < V ? z[got->token] : NAN, want->token, z[want->token], got->logprob,
                want->logprob, got->n_top, want->n_top);
}

static void test_against_cpu(tally *dev, tally *emu) {
    const int vocabs[] = { 257, 17, 1000, 32000, 128256 };
    const int n_vocabs = quick ? 1 : 5, n_sets = quick ? 1 : 2, n_case = 1 + 3 * 5 * 4 * 3;
    size_t pool_bytes = kc_sample_pool_bytes(MAXR, 128256);
    void *pool = malloc(pool_bytes);
    tcase *tc = malloc(sizeof *tc * MAXR);
    ex_sample_row *rows = malloc(sizeof *rows * MAXR);
    ex_sample_out *want = malloc(sizeof *want * MAXR), *got = malloc(sizeof *got * MAXR);
    kc_sample_out *kout = malloc(sizeof *kout * MAXR);
    int slot[MAXR];
    uint8_t mark[MAXR];
    float *d_logits = NULL;
    void *d_pool = NULL;
    kc_sample_out *d_out = NULL;
    if (!host_only) {
        CK(cudaMalloc((void **)&d_logits, (size_t)MAXR * 128256 * sizeof(float)));
        CK(cudaMalloc(&d_pool, pool_bytes));
        CK(cudaMalloc((void **)&d_out, sizeof *d_out * MAXR));
    }
    for (int vi = 0; vi < n_vocabs; vi++) {
        const int V = vocabs[vi];
        float *base = malloc(sizeof(float) * V), *work = malloc(sizeof(float) * V * (size_t)MAXR);
        ex_sampler *smp;
        ex_sampler_create(V, &smp);
        for (int dist = 0; dist < N_DIST; dist++) {
            if (quick && dist != D_PEAKED && dist != D_TIES) continue;
            make_row(base, V, dist);
            int32_t tops[12];
            top_ids(base, V, tops, V < 12 ? V : 12);
            for (int j = V; j < 12; j++) tops[j] = tops[j % V];
            long dev_bad0 = dev->tok_bad + dev->lp_bad + dev->top_bad, emu_bad0 = emu->tok_bad + emu->lp_bad + emu->top_bad;
            for (int set = 0; set < n_sets; set++)
                for (int c0 = 0; c0 < n_case; c0 += MAXR) {
                    int n = n_case - c0 < MAXR ? n_case - c0 : MAXR;
                    for (int r = 0; r < n; r++) {
                        make_case(&tc[r], c0 + r, set, V, tops);
                        int64_t pos = (int64_t)(rnd() % 100000);
                        rows[r] = (ex_sample_row){ .row = r, .sp = &tc[r].sp, .prev = tc[r].prev, .n_prev = NPREV, .pos = pos,
                                                   .bias = tc[r].bias, .n_bias = tc[r].n_bias,
                                                   .mask = tc[r].masked ? tc[r].mask : NULL };
                        T_EQ_INT(ex_sampler_sample(smp, &rows[r], base, &want[r]), 0);
                        memcpy(work + (size_t)r * V, base, sizeof(float) * V);
                    }
                    int n_dev;
                    size_t bytes;
                    T_EQ_INT(ex__cuda_sample_stage(pool, MAXR, V, n, rows, n, mark, slot, &n_dev, &bytes), 0);
                    T_EQ_INT(n_dev, n);
                    if (!host_only) {
                        CK(cudaMemcpy(d_logits, work, sizeof(float) * V * (size_t)n, cudaMemcpyHostToDevice));
                        CK(cudaMemcpy(d_pool, pool, bytes, cudaMemcpyHostToDevice));
                        CK(cudaMemset(d_out, 0xff, sizeof *d_out * MAXR)); /* poison */
                        T_EQ_INT(kc_sample(d_logits, V, V, d_pool, n_dev, d_out, 0), 0);
                        CK(cudaDeviceSynchronize());
                        CK(cudaMemcpy(kout, d_out, sizeof *kout * n, cudaMemcpyDeviceToHost));
                        for (int r = 0; r < n; r++) {
                            ex__cuda_sample_out(&kout[slot[r]], &got[r]);
                            compare("device", &got[r], &want[r], &rows[r], V, dist, base, dev);
                        }
                    }
                    memset(kout, 0xff, sizeof *kout * MAXR);
                    T_EQ_INT(kc_sample_host(work, V, V, pool, n_dev, kout), 0);
                    for (int r = 0; r < n; r++) {
                        ex__cuda_sample_out(&kout[slot[r]], &got[r]);
                        compare("host emulation", &got[r], &want[r], &rows[r], V, dist, base, emu);
                    }
                }
            printf("V=%-6d %-6s: %d cases x %d: device %ld, host emulation %ld differences\n", V, dist_name[dist], n_case,
                   n_sets, dev->tok_bad + dev->lp_bad + dev->top_bad - dev_bad0, emu->tok_bad + emu->lp_bad + emu->top_bad - emu_bad0);
            fflush(stdout);
        }
        ex_sampler_destroy(smp);
        free(base);
        free(work);
    }
    if (!host_only) {
        CK(cudaFree(d_logits));
        CK(cudaFree(d_pool));
        CK(cudaFree(d_out));
    }
    free(pool); free(tc); free(rows); free(want); free(got); free(kout);
}

/* The stager: refusals per row, the limits that send a step to the host. */
static void test_stager(void) {
    const int V = 1000, R = 4;
    void *pool = malloc(kc_sample_pool_bytes(R, V));
    int32_t *prev = malloc(sizeof(int32_t) * 5000);
    for (int i = 0; i < 5000; i++) prev[i] = i % V;
    ex_sample_params ok, bad, pen;
    ex_sample_params_default(&ok);
    bad = ok;
    bad.top_p = 0; /* refused by ex_sample_params_check */
    pen = ok;
    pen.repeat_penalty = 1.2f;
    pen.penalty_last_n = -1;
    ex_sample_row rows[4] = { { 0, &ok, prev, 10, 10 }, { 1, &bad, prev, 10, 10 }, { 2, &pen, prev, 4096, 4096 }, { 3, &ok, prev, 10, 10 } };
    int slot[4], n_dev;
    size_t bytes;
    uint8_t mark[4];
    prev[9] = V; /* out of range inside every row's window: refused like the CPU sampler does */
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), 0);
    T_EQ_INT(n_dev, 0);
    T_CHECK(slot[0] == -1 && slot[1] == -1 && slot[2] == -1 && slot[3] == -1);
    prev[9] = 9;
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), 0);
    T_CHECK(n_dev == 3 && slot[0] == 0 && slot[1] == -1 && slot[2] == 1 && slot[3] == 2);
    T_CHECK(bytes == 4 * (kc_sample_pool_words_start(R) + 4096));
    rows[2].n_prev = rows[2].pos = 4097; /* window past the device's cap: the step goes to the host */
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), CM_EUNSUPPORTED);
    pen.repeat_penalty = 1.0f; /* penalties off: the window is only checked, never sent */
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), 0);
    rows[3].row = 0; /* the same logits row twice */
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), CM_EUNSUPPORTED);
    rows[3].row = 3;
    struct shm_logit_bias *many = calloc(KC_SAMPLE_MAX_BIAS + 1, sizeof *many);
    rows[0].bias = rows[3].bias = many;
    rows[0].n_bias = rows[3].n_bias = KC_SAMPLE_MAX_BIAS + 1;
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), CM_EUNSUPPORTED);
    rows[0].n_bias = rows[3].n_bias = KC_SAMPLE_MAX_BIAS;
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), 0);
    free(many);
    /* token masks: one that allows nothing refuses its row (token -1, as the CPU sampler); the
     * others travel with their lowest allowed id, bits past the vocabulary cleared */
    rows[0].n_bias = rows[3].n_bias = 0;
    uint32_t none[(V + 31) / 32], some[(V + 31) / 32];
    memset(none, 0, sizeof none);
    none[(V - 1) / 32] = ~0u << (V % 32); /* only bits past the vocabulary */
    memset(some, 0, sizeof some);
    some[700 / 32] = 1u << (700 % 32) | 1u << (703 % 32);
    some[(V - 1) / 32] |= ~0u << (V % 32);
    rows[0].mask = none;
    rows[3].mask = some;
    T_EQ_INT(ex__cuda_sample_stage(pool, R, V, 4, rows, 4, mark, slot, &n_dev, &bytes), 0);
    T_CHECK(n_dev == 2 && slot[0] == -1 && slot[3] == 1);
    const kc_sample_row *kr = pool;
    T_CHECK(kr[1].mask_words == (V + 31) / 32 && kr[1].mask_first == 700);
    const uint32_t *pw = (const uint32_t *)pool + kr[1].mask_off;
    T_CHECK(pw[700 / 32] == (1u << (700 % 32) | 1u << (703 % 32)) && pw[(V - 1) / 32] == 0);
    rows[0].mask = rows[3].mask = NULL;
    free(prev);
    free(pool);
}

/* ex_engine_forward_sample on the cuda backend vs forward + ex_sampler_sample on the same
 * batch: a prefill step (eager), a decode step (graph), and a row whose penalty window is past
 * the device cap (host fallback). */
static void test_backend(const char *path) {
    mdl_model *m;
    char err[512];
    if (mdl_load(path, &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); T_CHECK(0); return; }
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.backend = "cuda";
    o.n_ctx = 256;
    o.max_tokens = 256;
    o.max_seqs = 8;
    o.max_out = 8;
    o.kv_cache_mb = 64;
    ex_engine *e;
    if (ex_engine_create(m, &o, &e, err, sizeof err)) { fprintf(stderr, "%s\n", err); T_CHECK(0); mdl_free(m); return; }
    const ex_limits *L = ex_engine_limits(e);
    const int V = L->n_vocab, S = 6;
    ex_kv *kv = ex_engine_kv(e);
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, L);
    ex_sampler *smp;
    ex_sampler_create(V, &smp);
    static int32_t toks[6][6000];
    int len[6];
    ex_kv_table t[6];
    ex_sample_params sp[6];
    for (int s = 0; s < S; s++) {
        len[s] = 5 + 7 * s;
        for (int i = 0; i < len[s]; i++) toks[s][i] = 1 + (int32_t)(rnd() % (V - 1));
        ex_kv_table_init(&t[s], L->max_blocks);
        T_EQ_INT(ex_kv_table_reserve(kv, &t[s], 64), 0);
        ex_sample_params_default(&sp[s]);
        sp[s].temperature = s == 0 ? 0 : 0.7f + 0.2f * s;
        sp[s].top_k = s == 2 ? 40 : 0;
        sp[s].top_p = s == 3 ? 0.9f : 1.0f;
        sp[s].min_p = s == 4 ? 0.05f : 0;
        sp[s].repeat_penalty = s == 5 ? 1.3f : 1.0f;
        sp[s].seed = 77 + s;
        sp[s].top_logprobs = s == 1 ? 5 : 0;
    }
    ex_sample_row rows[6];
    ex_sample_out got[6], want[6];
    int same = 0, total = 0;
    for (int step = 0; step < 3; step++) {
        ex_batch_buf_clear(&bb);
        for (int s = 0; s < S; s++) {
            int p0 = step == 0 ? 0 : len[s] - 1;
            ex_batch_buf_add(&bb, toks[s] + p0, len[s] - p0, p0, t[s].blocks, t[s].n, 0);
            rows[s] = (ex_sample_row){ .row = ex_batch_last_row(&bb.b, s), .sp = &sp[s], .prev = toks[s], .n_prev = len[s], .pos = len[s] };
        }
        if (step == 2) { /* sequence 5 brings a window of 5000 tokens: sampled on the host */
            for (int i = len[5]; i < 5000; i++) toks[5][i] = (int32_t)(rnd() % V);
            rows[5].n_prev = 5000;
            sp[5].penalty_last_n = -1;
        }
        memset(got, 0x5a, sizeof got);
        T_EQ_INT(ex_engine_forward_sample(e, &bb.b, rows, S, got), 0);
        const float *logits;
        T_EQ_INT(ex_engine_forward(e, &bb.b, &logits), 0);
        for (int s = 0; s < S; s++) {
            ex_sampler_sample(smp, &rows[s], logits + (size_t)rows[s].row * V, &want[s]);
            total++;
            int ok = got[s].token == want[s].token && got[s].n_top == want[s].n_top;
            for (int j = 0; j < want[s].n_top && ok; j++) ok = got[s].top_id[j] == want[s].top_id[j];
            same += ok;
            if (!ok) fprintf(stderr, "backend step %d seq %d: token %d vs cpu %d\n", step, s, got[s].token, want[s].token);
        }
        for (int s = 0; s < S; s++) toks[s][len[s]++] = want[s].token;
    }
    T_CHECKF(same == total, "backend path: %d of %d rows as forward + CPU sampler", same, total);
    printf("backend path (%s): %d of %d rows as forward + CPU sampler (prefill, graph decode, host fallback)\n", path, same, total);
    for (int s = 0; s < S; s++) {
        ex_kv_table_release(kv, &t[s]);
        ex_kv_table_free(&t[s]);
    }
    ex_sampler_destroy(smp);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
    mdl_free(m);
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median time of kc_sample over 128 rows of 32000 (and 128256) logits: greedy and T = 1,
 * top_p = 0.9 on "llm" rows (one token far ahead), and T = 0.8, top_p = 0.95 on N(0, 1) rows, as
 * bench_engine --sample draws from a random-weight model (most of the vocabulary in top-p). */
static void bench(void) {
    const int R = 128, vocabs[2] = { 32000, 128256 };
    for (int vi = 0; vi < 2; vi++) {
        const int V = vocabs[vi];
        float *h = malloc(sizeof(float) * V * (size_t)R), *hf = malloc(sizeof(float) * V * (size_t)R);
        for (int r = 0; r < R; r++) make_row(h + (size_t)r * V, V, D_LLM);
        for (size_t i = 0; i < (size_t)V * R; i++) hf[i] = (float)gauss();
        float *d_logits;
        void *d_pool, *pool = malloc(kc_sample_pool_bytes(R, V));
        kc_sample_out *d_out;
        CK(cudaMalloc((void **)&d_logits, sizeof(float) * V * (size_t)R));
        CK(cudaMalloc(&d_pool, kc_sample_pool_bytes(R, V)));
        CK(cudaMalloc((void **)&d_out, sizeof *d_out * R));
        CK(cudaMemcpy(d_logits, h, sizeof(float) * V * (size_t)R, cudaMemcpyHostToDevice));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        for (int mode = 0; mode < 3; mode++) {
            ex_sample_params p;
            ex_sample_params_default(&p);
            if (mode == 1) { p.temperature = 1.0f; p.top_p = 0.9f; }
            if (mode == 2) {
                p.temperature = 0.8f;
                p.top_p = 0.95f;
                CK(cudaMemcpy(d_logits, hf, sizeof(float) * V * (size_t)R, cudaMemcpyHostToDevice));
            }
            ex_sample_row rows[128];
            int slot[128], n_dev;
            uint8_t mark[128];
            size_t bytes;
            for (int r = 0; r < R; r++) rows[r] = (ex_sample_row){ .row = r, .sp = &p, .prev = NULL, .n_prev = 0, .pos = r };
            ex__cuda_sample_stage(pool, R, V, R, rows, R, mark, slot, &n_dev, &bytes);
            CK(cudaMemcpy(d_pool, pool, bytes, cudaMemcpyHostToDevice));
            float ms[20];
            for (int it = -3; it < 20; it++) {
                CK(cudaEventRecord(a, 0));
                T_EQ_INT(kc_sample(d_logits, V, V, d_pool, n_dev, d_out, 0), 0);
                CK(cudaEventRecord(b, 0));
                CK(cudaEventSynchronize(b));
                if (it >= 0) CK(cudaEventElapsedTime(&ms[it], a, b));
            }
            qsort(ms, 20, sizeof *ms, cmp_f);
            printf("kc_sample %d rows x %d, %s: median %.3f ms (min %.3f, max %.3f)\n", R, V,
                   mode == 2 ? "N(0,1) rows, T=0.8 top_p=0.95" : mode ? "T=1 top_p=0.9" : "greedy", ms[10], ms[0], ms[19]);
        }
        CK(cudaEventDestroy(a));
        CK(cudaEventDestroy(b));
        CK(cudaFree(d_logits));
        CK(cudaFree(d_pool));
        CK(cudaFree(d_out));
        free(pool);
        free(h);
        free(hf);
    }
}

int main(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--host")) host_only = 1;
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else model = argv[i];
    }
    tally dev = { 0 }, emu = { 0 };
    test_stager();
    test_against_cpu(&dev, &emu);
    T_CHECKF(dev.tok_bad == 0 && dev.lp_bad == 0 && dev.top_bad == 0,
             "device vs CPU: %ld token, %ld logprob, %ld top-logprob differences in %ld rows", dev.tok_bad, dev.lp_bad,
             dev.top_bad, dev.rows);
    T_CHECK(host_only || dev.rows == emu.rows); /* the device compared every row */
    T_CHECKF(emu.tok_bad == 0 && emu.lp_bad == 0 && emu.top_bad == 0,
             "host emulation vs CPU: %ld token, %ld logprob, %ld top-logprob differences in %ld rows", emu.tok_bad, emu.lp_bad,
             emu.top_bad, emu.rows);
    printf("device vs CPU sampler: %ld rows, %ld token mismatches (boundary cases included), %ld logprob, %ld top-logprob\n",
           dev.rows, dev.tok_bad, dev.lp_bad, dev.top_bad);
    printf("host emulation vs CPU sampler: %ld rows, %ld token mismatches, %ld logprob, %ld top-logprob\n", emu.rows,
           emu.tok_bad, emu.lp_bad, emu.top_bad);
    if (!host_only && !quick) {
        if (model) test_backend(model);
        bench();
    }
    printf("test_gpu_sample: %s\n", t_failed ? "FAIL" : "PASS");
    return t_done();
}
