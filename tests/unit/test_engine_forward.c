/* Forward pass of the CPU backend on a real model (stories260K): the greedy continuation of
 * the README's reference (ids and text through tok.h), batch invariance (alone vs. batched
 * with other sequences, one prefill vs. chunks vs. token by token: bitwise equal logits),
 * thread-count invariance, and refusals of bad batches. Batch invariance and prefix forks
 * (shared blocks, a copied partial block) again with FP8 weights (--quantize fp8) and an FP8
 * or f16 KV cache: the KV types compose with the block manager. */
#include "executor/backend.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "common/cm_err.h"
#include "model/dtype.h"
#include "model/model.h"
#include "text/tok.h"
#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MODEL T_MODELS "stories260K.gguf"

/* Greedy continuation of BOS "Once upon a time", 200 tokens; decodes to the README's text. */
static const int32_t ref_ids[200] = {
    432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292,
    411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
    338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310,
    439, 419, 357, 336, 432, 313, 438, 310, 432, 278, 316, 439, 419, 298, 414, 267, 265, 282, 295, 433,
    426, 436, 317, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400,
    426, 338, 336, 432, 313, 442, 391, 267, 337, 335, 364, 420, 268, 388, 432, 398, 359, 280, 303, 439,
    413, 272, 417, 264, 312, 426, 436, 13, 438, 310, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409,
    416, 327, 263, 415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 439, 423, 262, 304, 420, 422, 432,
    317, 426, 359, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 436, 13, 438,
    310, 279, 292, 416, 439, 413, 391, 267, 281, 421, 427, 311, 357, 432, 384, 358, 336, 432, 313, 442,
};
static const char *ref_text =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red "
    "ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I "
    "want to play with your ball, but I can't find it.\"\n"
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\n"
    "Lily didn't want to help her mom, so she said, \"I";

static mdl_model *m;
static int V;
static int g_kv_type = -1, g_quant = EX_QUANT_NONE; /* what mk_engine asks for */

static ex_engine *mk_engine(int threads, int max_tokens, int max_out) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = threads;
    o.kv_cache_mb = 8;
    o.n_ctx = 512;
    o.max_tokens = max_tokens;
    o.max_seqs = 8;
    o.max_out = max_out;
    o.kv_type = g_kv_type;
    o.quantize = g_quant;
    ex_engine *e = NULL;
    char err[256];
    int rc = ex_engine_create(m, &o, &e, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    return e;
}

static int argmax(const float *x) {
    int b = 0;
    for (int i = 1; i < V; i++) if (x[i] > x[b]) b = i;
    return b;
}

static void test_reference(void) {
    ex_engine *e = mk_engine(2, 64, 8);
    if (!e) return;
    char err[256];
    tok_vocab *tv = NULL;
    T_EQ_INT(tok_load_gguf(m->gguf, &tv, err, sizeof err), 0);
    int32_t toks[256];
    int n = 0;
    const char *prompt = "Once upon a time";
    T_EQ_INT(tok_encode(tv, prompt, strlen(prompt), 1, 0, toks, 256, &n), 0);
    T_EQ_INT(n, 5);
    T_EQ_INT(toks[0], 1);
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    ex_kv_table t;
    ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
    int pos = 0, n_prompt = n, same = 1;
    char text[4096];
    size_t tl = 0;
    for (int step = 0; step < 200; step++) {
        int nn = step == 0 ? n_prompt : 1;
        T_EQ_INT(ex_kv_table_reserve(ex_engine_kv(e), &t, pos + nn), 0);
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add(&bb, toks + pos, nn, pos, t.blocks, t.n, 0);
        const float *lg;
        if (ex_engine_forward(e, &bb.b, &lg)) { T_CHECK(0); break; }
        pos += nn;
        toks[pos] = argmax(lg);
        same &= toks[pos] == ref_ids[step];
        size_t len = 0;
        if (tl < sizeof text - 64 && tok_piece(tv, toks[pos], text + tl, sizeof text - 1 - tl, &len) == 0) tl += len;
    }
    text[tl] = 0;
    T_CHECK(same);
    T_EQ_STR(text, ref_text);
    ex_kv_table_release(ex_engine_kv(e), &t);
    ex_kv_table_free(&t);
    ex_batch_buf_free(&bb);
    tok_free(tv);
    ex_engine_destroy(e);
}

/* Logits of every position of a token sequence, computed under different batchings. */
#define NTOK 60
static int32_t seqA[NTOK], seqB[NTOK], seqC[NTOK];

/* Token by token, one sequence per step. out: [NTOK, V] */
static void run_single(ex_engine *e, const int32_t *ids, float *out) {
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    ex_kv_table t;
    ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
    for (int p = 0; p < NTOK; p++) {
        ex_kv_table_reserve(ex_engine_kv(e), &t, p + 1);
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add(&bb, ids + p, 1, p, t.blocks, t.n, 0);
        const float *lg;
        T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
        memcpy(out + (size_t)p * V, lg, sizeof(float) * V);
    }
    ex_kv_table_release(ex_engine_kv(e), &t);
    ex_kv_table_free(&t);
    ex_batch_buf_free(&bb);
}

/* Three sequences at once with out_all; A in one prefill of 60 then nothing, B in chunks of
 * 7, C token by token; they start at different steps so prefill and decode mix. */
static void run_mixed(ex_engine *e, float *oa, float *ob, float *oc) {
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    ex_kv_table ta, tb, tc;
    int mb = ex_engine_limits(e)->max_blocks;
    ex_kv_table_init(&ta, mb); ex_kv_table_init(&tb, mb); ex_kv_table_init(&tc, mb);
    ex_kv *kv = ex_engine_kv(e);
    int pa = 0, pb = 0, pc = 0;
    for (int step = 0; pa < NTOK || pb < NTOK || pc < NTOK; step++) {
        ex_batch_buf_clear(&bb);
        int sa = -1, sb = -1, sc = -1, na = 0, nb = 0;
        if (pc < NTOK) { /* C decodes every step */
            ex_kv_table_reserve(kv, &tc, pc + 1);
            sc = ex_batch_buf_add(&bb, seqC + pc, 1, pc, tc.blocks, tc.n, 1);
        }
        if (step >= 2 && pb < NTOK) {
            nb = NTOK - pb < 7 ? NTOK - pb : 7;
            ex_kv_table_reserve(kv, &tb, pb + nb);
            sb = ex_batch_buf_add(&bb, seqB + pb, nb, pb, tb.blocks, tb.n, 1);
        }
        if (step == 5) {
            na = NTOK;
            ex_kv_table_reserve(kv, &ta, NTOK);
            sa = ex_batch_buf_add(&bb, seqA, na, 0, ta.blocks, ta.n, 1);
        }
        const float *lg;
        T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
        if (sc >= 0) { memcpy(oc + (size_t)pc * V, lg + (size_t)bb.b.seq_out[sc] * V, sizeof(float) * V); pc++; }
        if (sb >= 0) { memcpy(ob + (size_t)pb * V, lg + (size_t)bb.b.seq_out[sb] * V, sizeof(float) * V * nb); pb += nb; }
        if (sa >= 0) { memcpy(oa, lg + (size_t)bb.b.seq_out[sa] * V, sizeof(float) * V * na); pa += na; }
    }
    ex_kv_table_release(kv, &ta); ex_kv_table_release(kv, &tb); ex_kv_table_release(kv, &tc);
    ex_kv_table_free(&ta); ex_kv_table_free(&tb); ex_kv_table_free(&tc);
    ex_batch_buf_free(&bb);
}

static void test_batch_invariance(void) {
    uint32_t r = 7;
    for (int i = 0; i < NTOK; i++) {
        r = r * 1103515245u + 12345u; seqA[i] = 3 + (r >> 8) % (V - 3);
        r = r * 1103515245u + 12345u; seqB[i] = 3 + (r >> 8) % (V - 3);
        r = r * 1103515245u + 12345u; seqC[i] = 3 + (r >> 8) % (V - 3);
    }
    seqA[0] = seqB[0] = seqC[0] = 1;
    size_t sz = sizeof(float) * NTOK * V;
    float *sa = malloc(sz), *sb = malloc(sz), *sc = malloc(sz), *ma = malloc(sz), *mb = malloc(sz), *mc = malloc(sz),
          *s1 = malloc(sz);
    for (size_t i = 0; i < NTOK * (size_t)V; i++) ma[i] = mb[i] = mc[i] = -12345.0f; /* poison */
    ex_engine *e2 = mk_engine(2, 128, 128), *e1 = mk_engine(1, 128, 128);
    if (!e1 || !e2) return;
    run_single(e2, seqA, sa);
    run_single(e2, seqB, sb);
    run_single(e2, seqC, sc);
    run_mixed(e2, ma, mb, mc);
    T_CHECK(memcmp(sa, ma, sz) == 0);
    T_CHECK(memcmp(sb, mb, sz) == 0);
    T_CHECK(memcmp(sc, mc, sz) == 0);
    run_single(e1, seqA, s1); /* one thread instead of two */
    T_CHECK(memcmp(sa, s1, sz) == 0);
    int differ = memcmp(sa, sb, sz) != 0; /* the sequences are different, so are their logits */
    T_CHECK(differ);
    free(sa); free(sb); free(sc); free(ma); free(mb); free(mc); free(s1);
    ex_engine_destroy(e1);
    ex_engine_destroy(e2);
}

/* Prefix sharing: B forks A after 37 positions (two full blocks shared by reference, the
 * partly filled third block copied with the backend's kv_copy), then both decode different
 * tokens in one batch; each matches the same tokens run alone, bitwise. */
static void test_prefix_fork(void) {
    ex_engine *e = mk_engine(1, 64, 8);
    if (!e) return;
    ex_kv *kv = ex_engine_kv(e);
    ex_backend *be = ex_engine_backend(e);
    const ex_limits *L = ex_engine_limits(e);
    enum { P = 37, G = 10 };
    int32_t a_ids[P + G], b_ids[P + G];
    for (int i = 0; i < P; i++) a_ids[i] = b_ids[i] = seqA[i];
    for (int i = 0; i < G; i++) { a_ids[P + i] = seqB[i]; b_ids[P + i] = seqC[i]; }
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, L);
    ex_kv_table ta, tb;
    ex_kv_table_init(&ta, L->max_blocks);
    ex_kv_table_init(&tb, L->max_blocks);
    const float *lg;
    ex_kv_table_reserve(kv, &ta, P);
    ex_batch_buf_add(&bb, a_ids, P, 0, ta.blocks, ta.n, 0);
    T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
    int full = P / L->block_size;
    T_EQ_INT(ex_kv_table_share(kv, &ta, full, &tb), 0);
    T_EQ_INT(ex_kv_block_refcount(kv, ta.blocks[0]), 2);
    T_EQ_INT(ex_kv_table_reserve(kv, &tb, P), 0);
    T_CHECK(tb.blocks[full] != ta.blocks[full]);
    T_EQ_INT(be->kv_copy(be, ta.blocks[full], tb.blocks[full], P % L->block_size), 0);
    T_EQ_INT(be->kv_copy(be, ta.blocks[full], L->n_kv_blocks, 1), CM_EINVAL);
    float *fa = malloc(sizeof(float) * G * V), *fb = malloc(sizeof(float) * G * V);
    for (int g = 0; g < G; g++) {
        ex_kv_table_reserve(kv, &ta, P + g + 1);
        ex_kv_table_reserve(kv, &tb, P + g + 1);
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add(&bb, a_ids + P + g, 1, P + g, ta.blocks, ta.n, 0);
        ex_batch_buf_add(&bb, b_ids + P + g, 1, P + g, tb.blocks, tb.n, 0);
        T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
        memcpy(fa + (size_t)g * V, lg, sizeof(float) * V);
        memcpy(fb + (size_t)g * V, lg + V, sizeof(float) * V);
    }
    ex_kv_table_release(kv, &ta);
    T_EQ_INT(ex_kv_block_refcount(kv, tb.blocks[0]), 1); /* B still holds the shared prefix */
    ex_kv_table_release(kv, &tb);
    T_EQ_INT(ex_kv_n_free(kv), L->n_kv_blocks);
    /* alone: A's and B's whole token lists, one prefill each, all logits */
    for (int w = 0; w < 2; w++) {
        const int32_t *ids = w ? b_ids : a_ids;
        ex_kv_table_reserve(kv, &ta, P + G);
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add(&bb, ids, P, 0, ta.blocks, ta.n, 0);
        T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
        int same = 1;
        for (int g = 0; g < G; g++) {
            ex_batch_buf_clear(&bb);
            ex_batch_buf_add(&bb, ids + P + g, 1, P + g, ta.blocks, ta.n, 0);
            T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
            same &= memcmp(lg, (w ? fb : fa) + (size_t)g * V, sizeof(float) * V) == 0;
        }
        T_CHECKF(same, "forked sequence %c differs from its solo run", w ? 'B' : 'A');
        ex_kv_table_release(kv, &ta);
    }
    free(fa); free(fb);
    ex_kv_table_free(&ta);
    ex_kv_table_free(&tb);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
}

static void test_refusals(void) {
    ex_engine *e = mk_engine(1, 16, 4);
    if (!e) return;
    const ex_limits *L = ex_engine_limits(e);
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, L);
    int32_t ids[4] = { 1, 2, 3, 4 }, bt[2] = { 0, 1 };
    const float *lg = (const float *)1;
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 4, 0, bt, 1, 0), 0);
    bb.tok[2] = V;                        /* token outside the vocabulary */
    T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), CM_EINVAL);
    T_CHECK(lg == NULL);
    bb.tok[2] = 3;
    bb.block_tables[0] = L->n_kv_blocks;  /* block outside the pool */
    T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), CM_EINVAL);
    bb.block_tables[0] = 0;
    T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);

    /* engine creation: KV budget below two blocks, unknown backend */
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.kv_cache_mb = 1;
    o.block_size = 1024;                  /* 1024 * 5 layers * 2 * 32 floats = 1.25 MiB per block */
    char err[256];
    ex_engine *x = NULL;
    T_EQ_INT(ex_engine_create(m, &o, &x, err, sizeof err), CM_ENOKV);
    T_CHECK(strstr(err, "KV cache budget") != NULL);
    ex_engine_opts_default(&o);
    o.backend = "tpu";
    T_EQ_INT(ex_engine_create(m, &o, &x, err, sizeof err), CM_EUNSUPPORTED);
    T_CHECK(x == NULL);
    /* the cuda options are checked on every backend and name their flag */
    ex_engine_opts_default(&o);
    T_CHECK(o.gpu_mem_fraction == 0.90 && o.cuda_graph_budget_s == 60);
    const double bad_frac[] = { 0, -0.5, 1.01, NAN };
    for (int i = 0; i < 4; i++) {
        o.gpu_mem_fraction = bad_frac[i];
        T_EQ_INT(ex_engine_create(m, &o, &x, err, sizeof err), CM_EINVAL);
        T_CHECKF(strstr(err, "--gpu-memory-fraction") != NULL, "%s", err);
    }
    o.gpu_mem_fraction = 1;
    o.cuda_graph_budget_s = -1;
    T_EQ_INT(ex_engine_create(m, &o, &x, err, sizeof err), CM_EINVAL);
    T_CHECKF(strstr(err, "--cuda-graph-budget-s") != NULL, "%s", err);
    /* the cpu pool is sized before the backend, as it always was; the allocator holds the same */
    o.cuda_graph_budget_s = 0;
    o.kv_blocks = 7;
    T_EQ_INT(ex_engine_create(m, &o, &x, err, sizeof err), 0);
    T_EQ_INT(ex_engine_limits(x)->n_kv_blocks, 7);
    T_EQ_INT(ex_kv_n_blocks(ex_engine_kv(x)), 7);
    T_EQ_INT(ex_engine_backend(x)->n_kv_blocks, 7);
    ex_engine_destroy(x);
    /* a backend asked to size its own pool must be able to: the cpu one cannot */
    ex_backend_opts bo = { .lim = { .max_tokens = 4, .max_seqs = 1, .max_out = 1, .max_blocks = 4, .n_ctx = 64,
                                    .block_size = 16, .n_kv_blocks = 0, .n_vocab = V },
                           .kv_type = DT_F32, .mem_fraction = 0.9 };
    ex_backend *be = NULL;
    T_EQ_INT(ex_backend_create("cpu", m, &bo, &be, err, sizeof err), CM_EINVAL);
    T_CHECK(be == NULL);
    /* KV types: q8_0 needs heads of whole 32-blocks (stories260K's are 8 wide); bad option words */
    ex_engine_opts_default(&o);
    o.kv_blocks = 4;
    o.kv_type = DT_Q8_0;
    T_EQ_INT(ex_engine_create(m, &o, &x, err, sizeof err), CM_EUNSUPPORTED);
    T_CHECKF(strstr(err, "q8_0 cannot hold this model's heads (head_dim 8)") != NULL, "%s", err);
    T_EQ_INT(ex_engine_opts_types(&o, "fp8", "q8_0", err, sizeof err), 0);
    T_CHECK(o.quantize == EX_QUANT_FP8 && o.kv_type == DT_Q8_0);
    T_EQ_INT(ex_engine_opts_types(&o, NULL, "auto", err, sizeof err), 0);
    T_CHECK(o.quantize == EX_QUANT_NONE && o.kv_type == -1);
    T_EQ_INT(ex_engine_opts_types(&o, "int4", NULL, err, sizeof err), CM_EINVAL);
    T_CHECKF(strstr(err, "--quantize 'int4': expected none or fp8") != NULL, "%s", err);
    T_EQ_INT(ex_engine_opts_types(&o, NULL, "fp4", err, sizeof err), CM_EINVAL);
    T_CHECKF(strstr(err, "--kv-cache-dtype 'fp4': expected auto, f32, f16, fp8 or q8_0") != NULL, "%s", err);
}

int main(void) {
    char err[256];
    if (mdl_load(MODEL, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    V = m->cfg.n_vocab;
    test_reference();
    test_batch_invariance();
    test_prefix_fork();
    test_refusals();
    static const struct { int kv, quant; const char *what; } variants[] = {
        { DT_F8_E4M3, EX_QUANT_NONE, "kv fp8" }, { DT_F16, EX_QUANT_FP8, "kv f16, weights fp8" },
        { DT_F8_E4M3, EX_QUANT_FP8, "kv fp8, weights fp8" },
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        int before = t_failed;
        g_kv_type = variants[i].kv;
        g_quant = variants[i].quant;
        test_batch_invariance();
        test_prefix_fork();
        printf("%s: batch invariance and prefix forks %s\n", variants[i].what, t_failed == before ? "hold" : "FAIL");
    }
    mdl_free(m);
    return t_done();
}
