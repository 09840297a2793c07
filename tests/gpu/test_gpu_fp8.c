/* FP8 end to end on a GPU host (--quantize fp8 and --kv-cache-dtype fp8 on the cuda backend).
 *   1. Prefix sharing with an FP8 KV cache: sequence B takes A's two full blocks (reference
 *      counted, as the prefix cache shares them) and a kv_copy of A's partial third block, then
 *      feeds only its own suffix; its last logits equal B computed from scratch in the same two
 *      steps (relative error <= 1e-5, top-1 equal), and match B's prompt and suffix computed in
 *      one step (top-1 equal, relative error <= 1e-2; with FP8 weights on cuda, whose GEMMs are
 *      not batch invariant, relative error <= 0.15), with FP8 weights and without, on cuda and
 *      on cpu.
 *   2. The engine reports the KV type it was asked for (the cuda backend keeps FP8).
 *   3. A mixed step over an FP8 KV cache (F16 weights): A's next token (decode, reading the FP8
 *      cache) and B's whole prompt (prefill tiles: on cuda through the F16 copy of B's blocks,
 *      the plan's att_pf_f8_fa3, or on the mma.sync kernel with it at 0) in one forward give
 *      the logits of A's token decoded alone and of B's prompt prefilled alone (relative error
 *      <= 1e-2, top-1 equal: the two batches take other GEMM paths).
 * usage: test_gpu_fp8 MODEL.gguf (a random-weight F16 model: arka mkmodel small) */
#include "executor/backend.h"
#include "gpu_common.h"
#include "model/dtype.h"
#include "tests/unit/t.h"

#include <math.h>

static const char *g_plan; /* kernel-plan overrides (argv[2]) */

static int open_eng(g_eng *g, const mdl_model *m, const char *backend, int quantize) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.backend = backend;
    o.cuda.plan = g_plan;
    o.n_ctx = 512;
    o.max_tokens = 256;
    o.max_seqs = 4;
    o.max_out = 4;
    o.kv_cache_mb = 64;
    o.cuda_graph_budget_s = g_graph_budget_s;
    o.quantize = quantize ? EX_QUANT_FP8 : EX_QUANT_NONE;
    o.kv_type = DT_F8_E4M3;
    char err[512];
    int rc = ex_engine_create(m, &o, &g->e, err, sizeof err);
    if (rc) {
        fprintf(stderr, "engine %s: %s\n", backend, err);
        return rc;
    }
    return ex_batch_buf_init(&g->bb, ex_engine_limits(g->e));
}

/* One forward of n tokens at pos0 of table t; the last row's logits into out. */
static int run(g_eng *g, const int32_t *toks, int n, int pos0, const ex_kv_table *t, float *out) {
    const ex_limits *L = ex_engine_limits(g->e);
    ex_batch_buf_clear(&g->bb);
    int rc = ex_batch_buf_add(&g->bb, toks, n, pos0, t->blocks, t->n, 0);
    const float *logits;
    if (rc >= 0) rc = ex_engine_forward(g->e, &g->bb.b, &logits);
    if (!rc) memcpy(out, logits + (size_t)ex_batch_last_row(&g->bb.b, 0) * L->n_vocab, (size_t)L->n_vocab * sizeof(float));
    return rc < 0 ? rc : 0;
}

static void test_prefix(const mdl_model *m, const char *backend, int quantize) {
    g_eng g;
    if (open_eng(&g, m, backend, quantize)) {
        T_CHECKF(0, "%s engine with FP8 KV%s", backend, quantize ? " and FP8 weights" : "");
        return;
    }
    T_CHECKF(ex_engine_backend(g.e)->kv_type == DT_F8_E4M3, "%s keeps the KV cache as fp8", backend);
    const ex_limits *L = ex_engine_limits(g.e);
    ex_kv *kv = ex_engine_kv(g.e);
    const int bs = L->block_size, np = 2 * bs + 13, ns = 20, V = L->n_vocab;
    int32_t toks[128];
    for (int i = 0; i < np + ns; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    float *scratch = malloc((size_t)V * 4), *shared = malloc((size_t)V * 4), *a_last = malloc((size_t)V * 4);
    float *split = malloc((size_t)V * 4);
    ex_kv_table ta, tb, tc, td;
    int rc = ex_kv_table_init(&ta, L->max_blocks) | ex_kv_table_init(&tb, L->max_blocks) | ex_kv_table_init(&tc, L->max_blocks) |
             ex_kv_table_init(&td, L->max_blocks);
    /* from scratch: the whole prompt and suffix in one sequence */
    if (!rc) rc = ex_kv_table_reserve(kv, &tc, np + ns);
    if (!rc) rc = run(&g, toks, np + ns, 0, &tc, scratch);
    /* from scratch in B's steps: the prompt, then the suffix, in one sequence of its own blocks */
    if (!rc) rc = ex_kv_table_reserve(kv, &td, np + ns);
    if (!rc) rc = run(&g, toks, np, 0, &td, a_last);
    if (!rc) rc = run(&g, toks + np, ns, np, &td, split);
    /* A: the prompt; B: A's full blocks shared, its partial block copied, then the suffix */
    if (!rc) rc = ex_kv_table_reserve(kv, &ta, np);
    if (!rc) rc = run(&g, toks, np, 0, &ta, a_last);
    if (!rc) {
        for (int j = 0; j < 2; j++) {
            ex_kv_block_ref(kv, ta.blocks[j]);
            tb.blocks[j] = ta.blocks[j];
        }
        tb.n = 2;
        int32_t nb;
        rc = ex_kv_block_alloc(kv, &nb);
        if (!rc) {
            tb.blocks[tb.n++] = nb;
            rc = ex_engine_backend(g.e)->kv_copy(ex_engine_backend(g.e), ta.blocks[2], nb, np - 2 * bs);
        }
        while (!rc && tb.n * bs < np + ns && (rc = ex_kv_block_alloc(kv, &nb)) == 0) tb.blocks[tb.n++] = nb;
    }
    if (!rc) rc = run(&g, toks + np, ns, np, &tb, shared);
    T_CHECKF(rc == 0, "%s prefix run rc=%d", backend, rc);
    if (!rc) {
        const double e = g_row_rel_err(shared, scratch, V), e2 = g_row_rel_err(shared, split, V);
        const int t1 = g_argmax(shared, V) == g_argmax(scratch, V), t2 = g_argmax(shared, V) == g_argmax(split, V);
        printf("%s fp8 KV%s: shared-prefix vs from-scratch logits rel err %.3g, top-1 %s; vs from scratch in the same "
               "steps rel err %.3g, top-1 %s\n", backend, quantize ? " + fp8 weights" : "", e, t1 ? "equal" : "differs", e2,
               t2 ? "equal" : "differs");
        T_CHECKF(e2 <= 1e-5 && t2, "%s%s: prefix sharing with an FP8 KV cache = the same steps from scratch: rel err %.3g, top-1 %d",
                 backend, quantize ? " fp8 weights" : "", e2, t2);
        /* Against the prompt in one step: the cuda FP8 GEMMs are not batch invariant (the start-up
         * tune picks a path and algorithm per token count, and the next layer's FP8 activation
         * codes turn their last-bit differences into whole code steps): within the FP8 GEMM's
         * tolerance against the CPU (tests/gpu/fp8.sh). Elsewhere as tight as the same steps. */
        const int loose = quantize && !strcmp(backend, "cuda");
        T_CHECKF(loose ? e <= 0.15 : e <= 1e-2 && t1, "%s%s: prefix sharing with an FP8 KV cache = the prompt in one step: rel err "
                 "%.3g (bound %g), top-1 %d", backend, quantize ? " fp8 weights" : "", e, loose ? 0.15 : 1e-2, t1);
    }
    ex_kv_table_release(kv, &ta);
    ex_kv_table_release(kv, &tb);
    ex_kv_table_release(kv, &tc);
    ex_kv_table_free(&ta);
    ex_kv_table_free(&tb);
    ex_kv_table_release(kv, &td);
    ex_kv_table_free(&tc);
    ex_kv_table_free(&td);
    free(split);
    free(scratch);
    free(shared);
    free(a_last);
    g_close(&g);
}

static void test_mixed(const mdl_model *m, const char *backend) {
    g_eng g;
    if (open_eng(&g, m, backend, 0)) {
        T_CHECKF(0, "%s engine with FP8 KV", backend);
        return;
    }
    const ex_limits *L = ex_engine_limits(g.e);
    ex_kv *kv = ex_engine_kv(g.e);
    const int bs = L->block_size, na = bs + 9, nb = 2 * bs + 21, V = L->n_vocab;
    int32_t ta_tok[128], tb_tok[128];
    for (int i = 0; i < na + 1; i++) ta_tok[i] = (int32_t)((i * 7919 + 13) % V);
    for (int i = 0; i < nb; i++) tb_tok[i] = (int32_t)((i * 104729 + 71) % V);
    float *a_mix = malloc((size_t)V * 4), *b_mix = malloc((size_t)V * 4), *a_ref = malloc((size_t)V * 4),
          *b_ref = malloc((size_t)V * 4), *scratch = malloc((size_t)V * 4);
    ex_kv_table ta, tb, ra, rb;
    int rc = ex_kv_table_init(&ta, L->max_blocks) | ex_kv_table_init(&tb, L->max_blocks) | ex_kv_table_init(&ra, L->max_blocks) |
             ex_kv_table_init(&rb, L->max_blocks);
    if (!rc) rc = ex_kv_table_reserve(kv, &ta, na + 1);
    if (!rc) rc = ex_kv_table_reserve(kv, &tb, nb);
    if (!rc) rc = ex_kv_table_reserve(kv, &ra, na + 1);
    if (!rc) rc = ex_kv_table_reserve(kv, &rb, nb);
    /* references: A's prompt, then its next token alone; B's prompt alone */
    if (!rc) rc = run(&g, ta_tok, na, 0, &ra, scratch);
    if (!rc) rc = run(&g, ta_tok + na, 1, na, &ra, a_ref);
    if (!rc) rc = run(&g, tb_tok, nb, 0, &rb, b_ref);
    /* A's prompt, then A's next token and B's prompt in one step */
    if (!rc) rc = run(&g, ta_tok, na, 0, &ta, scratch);
    if (!rc) {
        ex_batch_buf_clear(&g.bb);
        int sa = ex_batch_buf_add(&g.bb, ta_tok + na, 1, na, ta.blocks, ta.n, 0);
        int sb = sa >= 0 ? ex_batch_buf_add(&g.bb, tb_tok, nb, 0, tb.blocks, tb.n, 0) : sa;
        const float *logits;
        rc = sb < 0 ? sb : ex_engine_forward(g.e, &g.bb.b, &logits);
        if (!rc) {
            memcpy(a_mix, logits + (size_t)ex_batch_last_row(&g.bb.b, sa) * V, (size_t)V * sizeof(float));
            memcpy(b_mix, logits + (size_t)ex_batch_last_row(&g.bb.b, sb) * V, (size_t)V * sizeof(float));
        }
    }
    T_CHECKF(rc == 0, "%s mixed-step runs rc=%d", backend, rc);
    if (!rc) {
        const double ea = g_row_rel_err(a_mix, a_ref, V), eb = g_row_rel_err(b_mix, b_ref, V);
        const int t1a = g_argmax(a_mix, V) == g_argmax(a_ref, V), t1b = g_argmax(b_mix, V) == g_argmax(b_ref, V);
        printf("%s fp8 KV: a mixed step (1 decode token + a %d-token prompt) vs each alone: decode rel err %.3g, top-1 %s; "
               "prompt rel err %.3g, top-1 %s\n", backend, nb, ea, t1a ? "equal" : "differs", eb, t1b ? "equal" : "differs");
        T_CHECKF(ea <= 1e-2 && t1a, "%s: the decode token of a mixed step over an FP8 KV cache = decoded alone: rel err %.3g, top-1 %d",
                 backend, ea, t1a);
        T_CHECKF(eb <= 1e-2 && t1b, "%s: the prompt of a mixed step over an FP8 KV cache = prefilled alone: rel err %.3g, top-1 %d",
                 backend, eb, t1b);
    }
    ex_kv_table_release(kv, &ta);
    ex_kv_table_release(kv, &tb);
    ex_kv_table_release(kv, &ra);
    ex_kv_table_release(kv, &rb);
    ex_kv_table_free(&ta);
    ex_kv_table_free(&tb);
    ex_kv_table_free(&ra);
    ex_kv_table_free(&rb);
    free(a_mix);
    free(b_mix);
    free(a_ref);
    free(b_ref);
    free(scratch);
    g_close(&g);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: test_gpu_fp8 MODEL.gguf [KERNEL-PLAN]\n");
        return 2;
    }
    if (argc == 3) g_plan = argv[2];
    mdl_model *m;
    char err[512];
    if (mdl_load(argv[1], &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int q = 0; q < 2; q++) {
        test_prefix(m, "cuda", q);
        test_prefix(m, "cpu", q);
    }
    test_mixed(m, "cuda");
    test_mixed(m, "cpu");
    mdl_free(m);
    return t_done();
}
