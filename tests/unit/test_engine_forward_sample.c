/* ex_engine_forward_sample on the cpu backend (stories260K): the tokens and logprobs of
 * ex_engine_forward + ex_sampler_sample on the same batch, for greedy and seeded rows with
 * every filter, penalties and bias, rows of prefill and out_all sequences, the same logits
 * row sampled twice; a refused row gets token -1 beside valid ones; bad row indices and a
 * failing batch are refused; a step with no rows only runs the forward. */
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/sampler.h"
#include "common/cm_err.h"
#include "model/model.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>

#define NROWS 12

static mdl_model *m;

static int same_out(const ex_sample_out *a, const ex_sample_out *b) {
    if (a->token != b->token || a->n_top != b->n_top || memcmp(&a->logprob, &b->logprob, sizeof a->logprob)) return 0;
    for (int j = 0; j < a->n_top; j++)
        if (a->top_id[j] != b->top_id[j] || a->top_logprob[j] != b->top_logprob[j]) return 0;
    return 1;
}

static void test_matches_forward_then_sample(void) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 1;
    o.kv_cache_mb = 8;
    o.n_ctx = 256;
    o.max_tokens = 64;
    o.max_seqs = 4;
    o.max_out = 16;
    ex_engine *e = NULL;
    char err[256];
    T_EQ_INT(ex_engine_create(m, &o, &e, err, sizeof err), 0);
    if (!e) return;
    const ex_limits *L = ex_engine_limits(e);
    const int V = L->n_vocab;
    ex_kv *kv = ex_engine_kv(e);
    ex_batch_buf bb;
    T_EQ_INT(ex_batch_buf_init(&bb, L), 0);
    int32_t a[20], b[9], c[5];
    for (int i = 0; i < 20; i++) a[i] = 1 + (i * 37) % (V - 1);
    for (int i = 0; i < 9; i++) b[i] = 1 + (i * 101 + 7) % (V - 1);
    for (int i = 0; i < 5; i++) c[i] = 1 + (i * 13 + 5) % (V - 1);
    ex_kv_table t[3];
    for (int s = 0; s < 3; s++) {
        T_EQ_INT(ex_kv_table_init(&t[s], L->max_blocks), 0);
        T_EQ_INT(ex_kv_table_reserve(kv, &t[s], 32), 0);
    }
    /* a: whole prompt; b: every position (out_all); c: whole prompt */
    T_EQ_INT(ex_batch_buf_add(&bb, a, 20, 0, t[0].blocks, t[0].n, 0), 0);
    T_EQ_INT(ex_batch_buf_add(&bb, b, 9, 0, t[1].blocks, t[1].n, 1), 1);
    T_EQ_INT(ex_batch_buf_add(&bb, c, 5, 0, t[2].blocks, t[2].n, 0), 2);

    ex_sample_params sp[NROWS];
    struct shm_logit_bias bias[4] = { { 5, 3.0f }, { 9, -1e30f }, { 5, 1.5f }, { 17, -INFINITY } };
    for (int r = 0; r < NROWS; r++) {
        ex_sample_params_default(&sp[r]);
        sp[r].seed = 1000 + r;
        sp[r].temperature = r == 0 ? 0.0f : 0.5f + 0.25f * (r % 4);
        sp[r].top_k = (int[]){ 0, 1, 5, 40 }[r % 4];
        sp[r].top_p = (float[]){ 1.0f, 0.9f, 0.5f }[r % 3];
        sp[r].min_p = r % 5 == 1 ? 0.05f : 0.0f;
        sp[r].logprobs = r % 2;
        sp[r].top_logprobs = r % 3 == 0 ? 5 : 0;
    }
    sp[3].repeat_penalty = 1.3f;
    sp[3].presence_penalty = 0.4f;
    sp[3].frequency_penalty = 0.2f;
    sp[3].penalty_last_n = -1;
    sp[6].top_logprobs = EX_MAX_LOGPROBS;
    sp[7].top_p = 0.0f;                  /* refused by the sampler: token -1 */
    int last_a = ex_batch_last_row(&bb.b, 0), first_b = bb.b.seq_out[1], last_c = ex_batch_last_row(&bb.b, 2);
    int row_of[NROWS] = { last_a, first_b, first_b + 3, ex_batch_last_row(&bb.b, 1), last_c, last_a, first_b + 1,
                          last_c, first_b + 5, last_a, first_b + 2, last_c };
    ex_sample_row rows[NROWS];
    for (int r = 0; r < NROWS; r++) {
        const int32_t *prev = row_of[r] == last_a ? a : row_of[r] == last_c ? c : b;
        int n_prev = row_of[r] == last_a ? 20 : row_of[r] == last_c ? 5 : row_of[r] - first_b + 1;
        rows[r] = (ex_sample_row){ .row = row_of[r], .sp = &sp[r], .prev = prev, .n_prev = n_prev, .pos = n_prev };
    }
    rows[4].bias = bias;
    rows[4].n_bias = 4;

    ex_sample_out got[NROWS], want[NROWS];
    memset(got, 0x5a, sizeof got); /* poison */
    T_EQ_INT(ex_engine_forward_sample(e, &bb.b, rows, NROWS, got), 0);
    const float *logits;
    T_EQ_INT(ex_engine_forward(e, &bb.b, &logits), 0);
    ex_sampler *smp;
    T_EQ_INT(ex_sampler_create(V, &smp), 0);
    int same = 0;
    for (int r = 0; r < NROWS; r++) {
        int rc = ex_sampler_sample(smp, &rows[r], logits + (size_t)row_of[r] * V, &want[r]);
        T_EQ_INT(rc, r == 7 ? CM_EINVAL : 0);
        same += same_out(&got[r], &want[r]);
    }
    T_CHECKF(same == NROWS, "forward_sample == forward + sampler for %d of %d rows", same, NROWS);
    T_EQ_INT(got[7].token, -1);
    T_CHECK(got[6].n_top == EX_MAX_LOGPROBS);
    T_CHECK(got[0].token >= 0 && got[0].token < V);

    /* no rows: a forward only; bad rows: refused before any work */
    T_EQ_INT(ex_engine_forward_sample(e, &bb.b, NULL, 0, NULL), 0);
    ex_sample_row bad = rows[0];
    bad.row = bb.b.n_out;
    T_EQ_INT(ex_engine_forward_sample(e, &bb.b, &bad, 1, got), CM_EINVAL);
    bad.row = -1;
    T_EQ_INT(ex_engine_forward_sample(e, &bb.b, &bad, 1, got), CM_EINVAL);
    bad = rows[0];
    bad.sp = NULL;
    T_EQ_INT(ex_engine_forward_sample(e, &bb.b, &bad, 1, got), CM_EINVAL);
    T_EQ_INT(ex_engine_forward_sample(e, &bb.b, rows, -1, got), CM_EINVAL);
    bb.tok[0] = V; /* a batch ex_batch_check refuses */
    T_EQ_INT(ex_engine_forward_sample(e, &bb.b, rows, 1, got), CM_EINVAL);

    ex_sampler_destroy(smp);
    for (int s = 0; s < 3; s++) {
        ex_kv_table_release(kv, &t[s]);
        ex_kv_table_free(&t[s]);
    }
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
}

int main(void) {
    char err[256];
    if (mdl_load(T_MODELS "stories260K.gguf", &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    test_matches_forward_then_sample();
    mdl_free(m);
    return t_done();
}
