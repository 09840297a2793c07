/* gpu_common: helpers shared by the GPU-host programs in tests/gpu/ (engine setup, greedy
 * decoding of several sequences in one batch, argmax, a logits row's relative error).
 * Header-only, test code only. */
#ifndef ARKA_GPU_COMMON_H
#define ARKA_GPU_COMMON_H

#include "common/cm_err.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Seconds of decode-graph capture the engines g_open creates get (0: every step eager). */
static double g_graph_budget_s = 60;
/* Kernel-plan overrides of the cuda engines g_open creates (NULL: none). */
static const char *g_cuda_plan;

typedef struct g_eng {
    ex_engine *e;
    ex_batch_buf bb;
} g_eng;

static inline int g_open(g_eng *g, const mdl_model *m, const char *backend, int n_ctx, int max_tokens, int max_seqs,
                         int max_out, int64_t kv_mb) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.backend = backend;
    o.n_ctx = n_ctx;
    o.max_tokens = max_tokens;
    o.max_seqs = max_seqs;
    o.max_out = max_out;
    o.kv_cache_mb = kv_mb;
    o.n_threads = 0;
    o.cuda_graph_budget_s = g_graph_budget_s;
    o.cuda.plan = g_cuda_plan;
    char err[512];
    int rc = ex_engine_create(m, &o, &g->e, err, sizeof err);
    if (rc) {
        fprintf(stderr, "engine %s: %s\n", backend, err);
        return rc;
    }
    return ex_batch_buf_init(&g->bb, ex_engine_limits(g->e));
}

static inline void g_close(g_eng *g) {
    ex_batch_buf_free(&g->bb);
    ex_engine_destroy(g->e);
}

static inline int32_t g_argmax(const float *row, int n) {
    int32_t best = 0;
    for (int j = 1; j < n; j++)
        if (row[j] > row[best]) best = j;
    return best;
}

/* Relative error of one logits row x against ref: ||x - ref|| / ||ref|| (NaN where x has one). */
static inline double g_row_rel_err(const float *x, const float *ref, int V) {
    double num = 0, den = 0;
    for (int j = 0; j < V; j++) {
        const double d = (double)x[j] - ref[j];
        num += d * d;
        den += (double)ref[j] * ref[j];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Rows [0, n_rows) of x against ref, V logits each: returns how many agree on the top-1 token,
 * raises *worst to the largest relative error (a NaN counts as worst) and adds the errors to *sum
 * (sum may be NULL). */
static inline int g_rows_cmp(const float *x, const float *ref, int n_rows, int V, double *worst, double *sum) {
    int agree = 0;
    for (int p = 0; p < n_rows; p++) {
        const float *a = x + (size_t)p * V, *b = ref + (size_t)p * V;
        const double e = g_row_rel_err(a, b, V);
        *worst = e > *worst || e != e ? e : *worst;
        if (sum) *sum += e;
        agree += g_argmax(a, V) == g_argmax(b, V);
    }
    return agree;
}

/* Decodes n_seq sequences together: one prefill step over all prompts (apart: one forward a
 * prompt), then n_gen - 1 decode steps of every sequence's next token. out[s][0..n_gen): each
 * step's greedy token; the token fed at step i is out[s][i - 1], or force[s][i - 1] when force is
 * given (teacher forcing). lg (or NULL): each step's logits row of each sequence,
 * lg[s][step * n_vocab ...]. Returns 0 or an error. */
static inline int g_decode(g_eng *g, int n_seq, int32_t *const *prompts, const int *lens, int n_gen, int32_t **out,
                           float **lg, int apart, int32_t *const *force) {
    ex_kv *kv = ex_engine_kv(g->e);
    const ex_limits *L = ex_engine_limits(g->e);
    ex_kv_table *t = calloc((size_t)n_seq, sizeof *t);
    int rc = 0;
    for (int s = 0; s < n_seq && !rc; s++)
        if ((rc = ex_kv_table_init(&t[s], L->max_blocks)) == 0) rc = ex_kv_table_reserve(kv, &t[s], lens[s] + n_gen);
    for (int step = 0; step < n_gen && !rc; step++) {
        /* the step's forwards over sequences s0 .. s1 - 1: one, or one a prompt for a prefill kept apart */
        for (int s0 = 0, s1; s0 < n_seq && !rc; s0 = s1) {
            s1 = step == 0 && apart ? s0 + 1 : n_seq;
            ex_batch_buf_clear(&g->bb);
            for (int s = s0; s < s1 && !rc; s++) {
                const int32_t *fed = step == 0 ? NULL : force ? &force[s][step - 1] : &out[s][step - 1];
                int r = step == 0 ? ex_batch_buf_add(&g->bb, prompts[s], lens[s], 0, t[s].blocks, t[s].n, 0)
                                  : ex_batch_buf_add(&g->bb, fed, 1, lens[s] + step - 1, t[s].blocks, t[s].n, 0);
                if (r < 0) rc = r;
            }
            const float *logits;
            if (!rc) rc = ex_engine_forward(g->e, &g->bb.b, &logits);
            for (int s = s0; s < s1 && !rc; s++) {
                const float *row = logits + (size_t)ex_batch_last_row(&g->bb.b, s - s0) * L->n_vocab;
                out[s][step] = g_argmax(row, L->n_vocab);
                if (lg) memcpy(lg[s] + (size_t)step * L->n_vocab, row, (size_t)L->n_vocab * sizeof(float));
            }
        }
    }
    for (int s = 0; s < n_seq; s++) {
        ex_kv_table_release(kv, &t[s]);
        ex_kv_table_free(&t[s]);
    }
    free(t);
    return rc;
}

/* Greedy-decodes n_seq sequences together: one prefill step over all prompts, then n_gen - 1
 * decode steps. out[s][0..n_gen). Returns 0 or an error. */
static inline int g_greedy(g_eng *g, int n_seq, int32_t *const *prompts, const int *lens, int n_gen, int32_t **out) {
    return g_decode(g, n_seq, prompts, lens, n_gen, out, NULL, 0, NULL);
}

/* Logits of every position of one sequence (prefilled in chunks of `chunk` tokens): [n, n_vocab]. */
static inline int g_all_logits(g_eng *g, const int32_t *ids, int n, int chunk, float *out) {
    ex_kv *kv = ex_engine_kv(g->e);
    const ex_limits *L = ex_engine_limits(g->e);
    ex_kv_table t;
    int rc = ex_kv_table_init(&t, L->max_blocks);
    if (!rc) rc = ex_kv_table_reserve(kv, &t, n);
    for (int p = 0; p < n && !rc; p += chunk) {
        int k = n - p < chunk ? n - p : chunk;
        ex_batch_buf_clear(&g->bb);
        const float *logits;
        rc = ex_batch_buf_add(&g->bb, ids + p, k, p, t.blocks, t.n, 1);
        if (rc >= 0) rc = ex_engine_forward(g->e, &g->bb.b, &logits);
        if (!rc) memcpy(out + (size_t)p * L->n_vocab, logits, (size_t)k * L->n_vocab * sizeof(float));
    }
    ex_kv_table_release(kv, &t);
    ex_kv_table_free(&t);
    return rc;
}

#endif
