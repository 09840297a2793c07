/* tp: the tensor-parallel cut of a model (tp.h). */
#include "tp.h"
#include "../common/cm_err.h"

#include <stdio.h>
#include <string.h>

int ex_tp_plan(const mdl_config *c, int n, int rank, ex_tp_shard *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (n < 1 || rank < 0 || rank >= n) {
        snprintf(err, errlen, "tensor parallel: rank %d of %d", rank, n);
        return CM_EINVAL;
    }
    if (c->n_expert > 0) {
        snprintf(err, errlen, "tensor parallel: mixture-of-experts models are not supported (%d experts)", c->n_expert);
        return CM_EUNSUPPORTED;
    }
    if (c->n_head % n) {
        snprintf(err, errlen, "tensor parallel %d: the %d query heads do not divide by it", n, c->n_head);
        return CM_EUNSUPPORTED;
    }
    const int hq = c->n_head / n, group = c->n_head / c->n_head_kv;
    out->rank = rank;
    out->n = n;
    out->head0 = rank * hq;
    out->n_head = hq;
    if (c->n_head_kv % n == 0) {
        out->n_kv = c->n_head_kv / n;
        out->kv0 = rank * out->n_kv;
    } else if (n % c->n_head_kv == 0 && group % hq == 0) {
        out->n_kv = 1; /* the one KV head this rank's query heads read, replicated */
        out->kv0 = out->head0 / group;
    } else {
        snprintf(err, errlen, "tensor parallel %d: %d query heads in groups of %d over %d KV heads cannot be cut evenly", n,
                 c->n_head, group, c->n_head_kv);
        return CM_EUNSUPPORTED;
    }
    out->ff0 = (int)((long long)c->n_ff * rank / n);
    out->n_ff = (int)((long long)c->n_ff * (rank + 1) / n) - out->ff0;
    out->vocab0 = (int)((long long)c->n_vocab * rank / n);
    out->n_vocab = (int)((long long)c->n_vocab * (rank + 1) / n) - out->vocab0;
    if (out->n_ff < 1 || out->n_vocab < 1) {
        snprintf(err, errlen, "tensor parallel %d: more ranks than MLP rows (%d) or vocabulary rows (%d)", n, c->n_ff, c->n_vocab);
        return CM_EUNSUPPORTED;
    }
    return 0;
}
