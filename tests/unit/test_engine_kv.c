/* KV block allocator: refcounts, exhaustion -> CM_ENOKV, all-or-nothing table growth,
 * prefix sharing, budget arithmetic; batch building and checking. */
#include "executor/engine.h"
#include "executor/kv.h"
#include "kernels/cpu/attn.h"
#include "common/cm_err.h"
#include "model/dtype.h"
#include "t.h"

#include <stdlib.h>

static void test_alloc(void) {
    ex_kv *kv;
    T_EQ_INT(ex_kv_create(0, 16, &kv), CM_EINVAL);
    T_EQ_INT(ex_kv_create(8, 16, &kv), 0);
    T_EQ_INT(ex_kv_n_blocks(kv), 8);
    T_EQ_INT(ex_kv_n_free(kv), 8);
    int32_t b[9];
    for (int i = 0; i < 8; i++) T_EQ_INT(ex_kv_block_alloc(kv, &b[i]), 0);
    T_EQ_INT(ex_kv_block_alloc(kv, &b[8]), CM_ENOKV);
    int distinct = 1;
    for (int i = 0; i < 8; i++) {
        distinct &= b[i] >= 0 && b[i] < 8 && ex_kv_block_refcount(kv, b[i]) == 1;
        for (int j = 0; j < i; j++) distinct &= b[i] != b[j];
    }
    T_CHECK(distinct);
    ex_kv_block_ref(kv, b[3]);
    T_EQ_INT(ex_kv_block_refcount(kv, b[3]), 2);
    ex_kv_block_unref(kv, b[3]);
    T_EQ_INT(ex_kv_n_free(kv), 0);           /* still held once */
    ex_kv_block_unref(kv, b[3]);
    T_EQ_INT(ex_kv_n_free(kv), 1);
    T_EQ_INT(ex_kv_block_refcount(kv, b[3]), 0);
    T_EQ_INT(ex_kv_block_refcount(kv, 8), -1);
    T_EQ_INT(ex_kv_block_refcount(kv, -1), -1);
    int32_t again;
    T_EQ_INT(ex_kv_block_alloc(kv, &again), 0);
    T_EQ_INT(again, b[3]);
    for (int i = 0; i < 8; i++) ex_kv_block_unref(kv, b[i]);
    T_EQ_INT(ex_kv_n_free(kv), 8);
    ex_kv_destroy(kv);
    ex_kv_destroy(NULL);
}

static void test_tables(void) {
    ex_kv *kv;
    ex_kv_create(6, 4, &kv);
    ex_kv_table a, c;
    T_EQ_INT(ex_kv_table_init(&a, 4), 0);     /* at most 16 positions */
    T_EQ_INT(ex_kv_table_init(&c, 4), 0);
    T_EQ_INT(ex_kv_table_reserve(kv, &a, 0), 0);
    T_EQ_INT(a.n, 0);
    T_EQ_INT(ex_kv_table_reserve(kv, &a, 5), 0);
    T_EQ_INT(a.n, 2);
    T_EQ_INT(ex_kv_table_need(kv, &a, 9), 1);
    T_EQ_INT(ex_kv_table_reserve(kv, &a, 8), 0);
    T_EQ_INT(a.n, 2);
    T_EQ_INT(ex_kv_table_reserve(kv, &a, 17), CM_ECTX);
    T_EQ_INT(a.n, 2);
    /* share the first 2 blocks, then grow both until the pool runs dry */
    T_EQ_INT(ex_kv_table_share(kv, &a, 2, &c), 0);
    T_EQ_INT(ex_kv_block_refcount(kv, a.blocks[0]), 2);
    T_EQ_INT(c.blocks[1], a.blocks[1]);
    T_EQ_INT(ex_kv_table_share(kv, &a, 1, &c), CM_EINVAL); /* dst not empty */
    T_EQ_INT(ex_kv_table_reserve(kv, &a, 16), 0);          /* 2 more: 4 free -> 2 */
    T_EQ_INT(ex_kv_n_free(kv), 2);
    T_EQ_INT(ex_kv_table_reserve(kv, &c, 16), 0);          /* 2 more: 0 free */
    T_EQ_INT(ex_kv_n_free(kv), 0);
    ex_kv_table_release(kv, &c);
    T_EQ_INT(c.n, 0);
    T_EQ_INT(ex_kv_n_free(kv), 2);                          /* shared ones still held by a */
    T_EQ_INT(ex_kv_block_refcount(kv, a.blocks[0]), 1);
    /* all or nothing: a third table wanting 3 blocks with 2 free gets none */
    ex_kv_table d;
    ex_kv_table_init(&d, 4);
    T_EQ_INT(ex_kv_table_reserve(kv, &d, 12), CM_ENOKV);
    T_EQ_INT(d.n, 0);
    T_EQ_INT(ex_kv_n_free(kv), 2);
    ex_kv_table_release(kv, &a);
    T_EQ_INT(ex_kv_n_free(kv), 6);
    ex_kv_table_free(&a); ex_kv_table_free(&c); ex_kv_table_free(&d);
    ex_kv_destroy(kv);
}

static void test_budget(void) {
    mdl_config c = { 0 };
    c.n_layer = 5; c.n_head_kv = 4; c.head_dim = 8;
    T_EQ_INT(ex_kv_block_bytes(&c, 16, DT_F32), 2 * 5 * 16 * 4 * 8 * 4);
    T_EQ_INT(ex_kv_block_bytes(&c, 16, DT_F16), 2 * 5 * 16 * 4 * 8 * 2);
    T_EQ_INT(ex_kv_block_bytes(&c, 16, DT_Q4_0), 0);
    /* fp8: a byte per value and an f32 scale per position and head; q8_0: ggml blocks of 32 */
    T_EQ_INT(ex_kv_block_bytes(&c, 16, DT_F8_E4M3), 2 * 5 * 16 * 4 * (8 + 4));
    T_EQ_INT(ex_kv_block_bytes(&c, 16, DT_Q8_0), 0); /* head_dim 8: not whole blocks */
    c.head_dim = 128;
    T_EQ_INT(ex_kv_block_bytes(&c, 16, DT_Q8_0), 2 * 5 * 16 * 4 * (4 * 34));
    T_EQ_INT(ex_kv_block_bytes(&c, 16, DT_F8_E4M3), 2 * 5 * 16 * 4 * 132);
    /* the cpu kernels' layout takes the bytes kv.h states, per layer and K or V */
    static const int kts[] = { DT_F32, DT_F16, DT_F8_E4M3, DT_Q8_0 };
    for (int i = 0; i < 4; i++)
        T_EQ_INT(ex_kv_block_bytes(&c, 16, kts[i]), 2 * 5 * k_kv_block_bytes(kts[i], 16, 4, 128));
    T_EQ_INT(ex_kv_type_from_name("fp8"), DT_F8_E4M3);
    T_EQ_INT(ex_kv_type_from_name("auto"), -1);
    T_EQ_INT(ex_kv_type_from_name("bf8"), -2);
    T_EQ_STR(ex_kv_type_name(DT_Q8_0), "q8_0");
    c.head_dim = 8;
    T_EQ_INT(ex_kv_default_bytes(12345), 12345);      /* capped by what is wanted */
    T_CHECK(ex_kv_default_bytes(1LL << 50) <= (16LL << 30));
    T_CHECK(ex_kv_default_bytes(1LL << 50) > 0);
}

/* The cuda backend's pool sizing from --gpu-memory-fraction (arithmetic only; the GPU host
 * checks the backend that calls it, tests/gpu/run.sh). */
static void test_fit(void) {
    const int64_t G = 1LL << 30, M = 1LL << 20;
    int64_t budget = 0;
    /* 80 GiB device, 2 GiB in use before us, 14 GiB of weights and workspaces, F = 0.9:
     * 72 - 2 - 14 = 56 GiB; 2 MiB blocks less the scratch block */
    T_EQ_INT(ex_kv_fit_blocks(80 * G, 78 * G, 14 * G, 0.9, 2 * M, 1, &budget), 56 * 512 - 1);
    T_EQ_INT(budget, 56 * G);
    /* rounded down to whole blocks */
    T_EQ_INT(ex_kv_fit_blocks(80 * G, 80 * G, 0, 0.5, 3 * M, 0, NULL), (40 * G) / (3 * M));
    /* a fraction spent before the pool: negative budget, no blocks */
    T_EQ_INT(ex_kv_fit_blocks(80 * G, 79 * G, 1 * G, 0.0001, 2 * M, 1, &budget), 0);
    T_CHECK(budget < 0);
    /* room for the scratch block only */
    T_EQ_INT(ex_kv_fit_blocks(10 * M, 10 * M, 8 * M, 1.0, 2 * M, 1, NULL), 0);
    T_EQ_INT(ex_kv_fit_blocks(10 * M, 10 * M, 0, 1.0, 0, 1, NULL), 0);
}

static void test_batch(void) {
    ex_limits L = { .max_tokens = 8, .max_seqs = 2, .max_out = 6, .max_blocks = 4, .n_ctx = 16,
                    .block_size = 4, .n_kv_blocks = 10, .n_vocab = 100 };
    ex_batch_buf bb;
    char err[256];
    T_EQ_INT(ex_batch_buf_init(&bb, &L), 0);
    int32_t ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, bt[4] = { 3, 7, 1, 0 };
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 5, 0, bt, 2, 1), 0);  /* prefill, all logits */
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 1, 7, bt, 2, 0), 1);  /* decode at position 7 */
    T_EQ_INT(bb.b.n_tokens, 6);
    T_EQ_INT(bb.b.n_out, 6);
    T_EQ_INT(ex_batch_last_row(&bb.b, 0), 4);
    T_EQ_INT(ex_batch_last_row(&bb.b, 1), 5);
    T_EQ_INT(bb.b.pos[5], 7);
    T_EQ_INT(ex_batch_check(&bb.b, &L, err, sizeof err), 0);
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 1, 0, bt, 1, 0), CM_EFULL);   /* 2 sequences max */
    ex_batch_buf_clear(&bb);
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 2, 15, bt, 4, 0), CM_ECTX);  /* past n_ctx */
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 5, 0, bt, 1, 0), CM_EINVAL); /* table too short */
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 5, 0, bt, 2, 1), 0);
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 4, 0, bt, 1, 0), CM_EFULL);  /* 8 tokens max */
    T_EQ_INT(ex_batch_buf_add(&bb, ids, 1, 0, bt, 1, 1), 1);
    /* corruptions ex_batch_check must catch */
    bb.block_tables[1] = 10;                                       /* outside the pool */
    T_EQ_INT(ex_batch_check(&bb.b, &L, err, sizeof err), CM_EINVAL);
    bb.block_tables[1] = 7;
    bb.tok[2] = 100;                                               /* outside the vocabulary */
    T_EQ_INT(ex_batch_check(&bb.b, &L, err, sizeof err), CM_EINVAL);
    bb.tok[2] = 3;
    bb.pos[3] = 9;                                                 /* not consecutive */
    T_EQ_INT(ex_batch_check(&bb.b, &L, err, sizeof err), CM_EINVAL);
    bb.pos[3] = 3;
    bb.n_blocks[0] = 1;                                            /* does not cover */
    T_EQ_INT(ex_batch_check(&bb.b, &L, err, sizeof err), CM_EINVAL);
    bb.n_blocks[0] = 2;
    T_EQ_INT(ex_batch_check(&bb.b, &L, err, sizeof err), 0);
    ex_batch_buf_free(&bb);
    ex_batch_buf_free(&bb); /* twice is fine */
}

int main(void) {
    test_alloc();
    test_tables();
    test_budget();
    test_fit();
    test_batch();
    return t_done();
}
