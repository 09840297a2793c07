/* tp: how a model is cut for tensor parallelism over N ranks (Megatron-style), the one place the
 * shard boundaries are decided, so the executor group that will run on N GPUs and the CPU
 * simulation that checks the math (tests/unit/test_tp_shard.c) cut the weights the same way.
 *
 * Per layer, rank r of N holds:
 *  - attention: the query heads [head0, head0 + n_head) (whole heads; N divides n_head), the KV
 *    heads those query heads read, [kv0, kv0 + n_kv): split when N divides n_head_kv, else each
 *    KV head replicated on the ranks whose query heads use it (N a multiple of n_head_kv and
 *    n_head / N a divisor of the group size n_head / n_head_kv); Q, K, V are column-parallel
 *    (their output rows for those heads), the output projection row-parallel (its input
 *    columns for the same query heads), so each rank's attention output is a partial sum of the
 *    full projection: one all-reduce after attention;
 *  - MLP: gate and up column-parallel over the intermediate rows [ff0, ff0 + n_ff), down
 *    row-parallel over the same columns: one all-reduce after the MLP. The split need not be
 *    even (rank r: [n_ff r / N, n_ff (r + 1) / N)), for intermediate sizes such as 172;
 *  - the KV cache: the rank's KV heads only;
 *  - embedding and LM head vocab-parallel over [vocab0, vocab0 + n_vocab): a token outside the
 *    rank's rows embeds to zeros (the all-reduce sums the one rank's row), and each rank's head
 *    gives its slice of the logits (an all-gather, or a sampler that reduces over the ranks).
 * Norms and everything between the all-reduces are replicated.
 *
 *   ex_tp_shard sh;
 *   if (ex_tp_plan(&m->cfg, n, rank, &sh, err, sizeof err)) ... // refused: err says why
 */
#ifndef EX_TP_H
#define EX_TP_H

#include <stddef.h>

#include "../model/model.h"

typedef struct ex_tp_shard {
    int rank, n;
    int head0, n_head;   /* query heads */
    int kv0, n_kv;       /* KV heads (replicated across ranks when N > n_head_kv) */
    int ff0, n_ff;       /* MLP intermediate rows */
    int vocab0, n_vocab; /* embedding rows and LM-head rows */
} ex_tp_shard;

/* Rank `rank`'s shard of a model of configuration c over n ranks. Returns 0, or CM_EINVAL
 * (n < 1, rank outside [0, n)) / CM_EUNSUPPORTED (heads that do not divide, a mixture-of-experts
 * model: expert parallelism is not built) with one line in err. */
int ex_tp_plan(const mdl_config *c, int n, int rank, ex_tp_shard *out, char *err, size_t errlen);

#endif
