/* model_quant: FP8 matrices as values (mdl_tensor_rows_f32) and `--quantize fp8`
 * (mdl_quantize): a copy of a model whose float layer matrices become F8_E4M3 with one scale
 * per output row. model.h states the contract. */
#include "model_internal.h"
#include "dtype.h"
#include "../common/cm_err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t rows_of(const mdl_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

int mdl_tensor_rows_f32(const mdl_tensor *t, int64_t r0, int64_t n, float *out) {
    if (!t->data || r0 < 0 || n < 0 || r0 + n > rows_of(t)) return CM_EINVAL;
    size_t rs = dt_row_size(t->type, t->ne[0]);
    if (!rs) return dt_block_size(t->type) ? CM_EINVAL : CM_EUNSUPPORTED;
    const uint8_t *p = (const uint8_t *)t->data + (size_t)r0 * rs;
    if (t->type != DT_F8_E4M3) return dt_dequantize(t->type, p, out, n * t->ne[0]);
    if (!t->scale) return CM_EINVAL;
    for (int64_t i = 0; i < n; i++) dt_fp8_decode(p + (size_t)i * rs, t->ne[0], t->scale[r0 + i], out + i * t->ne[0]);
    return 0;
}

/* ---- mdl_quantize ------------------------------------------------------------------------- */

/* One matrix to convert: src's rows into codes [rows][n_in] and scales [rows]. */
typedef struct {
    mdl_tensor  src;
    mdl_tensor *dst;
    uint8_t    *codes;
    float      *scales;
} qitem;

#define QCHUNK 64 /* rows per unit of work */

typedef struct {
    qitem      *items;
    int         n_items;
    int64_t    *first_chunk; /* [n_items + 1] prefix sums of each item's chunks */
    int64_t     max_in;
    atomic_long next;
    atomic_int  err;
} qjob;

static void *qworker(void *arg) {
    qjob *j = arg;
    float *row = malloc(sizeof(float) * (size_t)j->max_in);
    if (!row) {
        atomic_store(&j->err, CM_ENOMEM);
        return NULL;
    }
    for (;;) {
        long c = atomic_fetch_add(&j->next, 1);
        if (c >= j->first_chunk[j->n_items] || atomic_load(&j->err)) break;
        int i = 0;
        while (j->first_chunk[i + 1] <= c) i++;
        const qitem *it = &j->items[i];
        int64_t n_in = it->src.ne[0], r0 = (c - j->first_chunk[i]) * QCHUNK, r1 = r0 + QCHUNK;
        if (r1 > rows_of(&it->src)) r1 = rows_of(&it->src);
        for (int64_t r = r0; r < r1; r++) {
            int rc = mdl_tensor_rows_f32(&it->src, r, 1, row);
            if (rc) {
                atomic_store(&j->err, rc);
                break;
            }
            float s = dt_fp8_scale(row, n_in);
            dt_fp8_encode(row, n_in, s, it->codes + (size_t)r * (size_t)n_in);
            it->scales[r] = s;
        }
    }
    free(row);
    return NULL;
}

typedef struct {
    qitem *items;
    int    n, cap;
} qlist;

static int is_float(int type) { return type == DT_F32 || type == DT_F16 || type == DT_BF16; }

/* Queues the tensors of one group (rows back to back in one buffer when every one converts),
 * after checking their types. */
static int queue_group(mdl_model *q, qlist *ql, mdl_tensor *const *ts, int n, char *err, size_t errlen) {
    int64_t rows = 0;
    int all = 1;
    for (int i = 0; i < n; i++) {
        const mdl_tensor *t = ts[i];
        if (!t->data || t->type == DT_F8_E4M3) {
            all = 0;
            continue;
        }
        if (!is_float(t->type)) {
            snprintf(err, errlen, "%s: --quantize fp8 converts F32, F16 and BF16 weights; tensor '%s' is %s", q->cfg.name, t->name,
                     dt_name(t->type) ? dt_name(t->type) : "?");
            return CM_EUNSUPPORTED;
        }
        if (t->ne[0] != ts[0]->ne[0]) all = 0;
        rows += rows_of(t);
    }
    uint8_t *codes = NULL;
    float *scales = NULL;
    for (int i = 0; i < n; i++) {
        mdl_tensor *t = ts[i];
        if (!t->data || !is_float(t->type)) continue;
        int64_t r = rows_of(t);
        if (!codes || !all) {
            int64_t want = all ? rows : r;
            codes = mdl__alloc(q, (size_t)want * (size_t)t->ne[0]);
            scales = mdl__alloc(q, sizeof(float) * (size_t)want);
            if (!codes || !scales) {
                snprintf(err, errlen, "%s: out of memory converting '%s' to FP8", q->cfg.name, t->name);
                return CM_ENOMEM;
            }
        }
        if (ql->n == ql->cap) {
            int cap = ql->cap ? 2 * ql->cap : 64;
            qitem *ni = realloc(ql->items, sizeof *ni * (size_t)cap);
            if (!ni) {
                snprintf(err, errlen, "%s: out of memory", q->cfg.name);
                return CM_ENOMEM;
            }
            ql->items = ni;
            ql->cap = cap;
        }
        ql->items[ql->n++] = (qitem){ .src = *t, .dst = t, .codes = codes, .scales = scales };
        t->type = DT_F8_E4M3;
        t->data = codes;
        t->nbytes = (uint64_t)r * (uint64_t)t->ne[0];
        t->scale = scales;
        t->scale_per_tensor = 0;
        t->in_scale = 0;
        codes += (size_t)r * (size_t)t->ne[0];
        scales += r;
    }
    return 0;
}

static int run_items(qlist *ql, int n_threads) {
    if (!ql->n) return 0;
    qjob j = { .items = ql->items, .n_items = ql->n };
    if (!(j.first_chunk = malloc(sizeof(int64_t) * (size_t)(ql->n + 1)))) return CM_ENOMEM;
    j.first_chunk[0] = 0;
    for (int i = 0; i < ql->n; i++) {
        j.first_chunk[i + 1] = j.first_chunk[i] + (rows_of(&ql->items[i].src) + QCHUNK - 1) / QCHUNK;
        if (ql->items[i].src.ne[0] > j.max_in) j.max_in = ql->items[i].src.ne[0];
    }
    atomic_init(&j.next, 0);
    atomic_init(&j.err, 0);
    if (n_threads > 256) n_threads = 256;
    pthread_t th[256];
    int started = 0;
    for (int t = 1; t < n_threads; t++, started++)
        if (pthread_create(&th[started], NULL, qworker, &j)) break;
    qworker(&j);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    free(j.first_chunk);
    return atomic_load(&j.err);
}

int mdl_quantize(const mdl_model *src, int type, int n_threads, mdl_model **out, char *err, size_t errlen) {
    *out = NULL;
    if (type != DT_F8_E4M3) {
        snprintf(err, errlen, "%s: quantizing to %s is not implemented (F8_E4M3 only)", src->cfg.name,
                 dt_name(type) ? dt_name(type) : "?");
        return CM_EUNSUPPORTED;
    }
    if (n_threads < 1) return CM_EINVAL;
    const mdl_config *c = &src->cfg;
    mdl_model *q = calloc(1, sizeof *q);
    if (!q) goto oom;
    *q = *src;
    q->gguf = NULL;
    q->st = NULL;
    q->owned = NULL;
    q->layers = NULL;
    if (!(q->layers = malloc(sizeof *q->layers * (size_t)(c->n_layer ? c->n_layer : 1)))) goto oom;
    memcpy(q->layers, src->layers, sizeof *q->layers * (size_t)c->n_layer);
    qlist ql = { 0 };
    int rc = 0;
    for (int l = 0; l < c->n_layer && !rc; l++) {
        mdl_layer *ly = &q->layers[l];
        mdl_tensor *qkv[3] = { &ly->wq, &ly->wk, &ly->wv }, *wo[1] = { &ly->wo };
        mdl_tensor *gu[2] = { &ly->w_gate, &ly->w_up }, *dn[1] = { &ly->w_down };
        if ((rc = queue_group(q, &ql, qkv, 3, err, errlen)) || (rc = queue_group(q, &ql, wo, 1, err, errlen)) ||
            (rc = queue_group(q, &ql, gu, 2, err, errlen)) || (rc = queue_group(q, &ql, dn, 1, err, errlen)))
            break;
        if (!ly->exp_gate) continue;
        /* the expert arrays are views into src: the copy gets its own */
        mdl_tensor *eg = mdl__alloc(q, sizeof *eg * (size_t)c->n_expert), *eu = mdl__alloc(q, sizeof *eu * (size_t)c->n_expert),
                   *ed = mdl__alloc(q, sizeof *ed * (size_t)c->n_expert);
        if (!eg || !eu || !ed) {
            rc = CM_ENOMEM;
            snprintf(err, errlen, "%s: out of memory", c->name);
            break;
        }
        memcpy(eg, ly->exp_gate, sizeof *eg * (size_t)c->n_expert);
        memcpy(eu, ly->exp_up, sizeof *eu * (size_t)c->n_expert);
        memcpy(ed, ly->exp_down, sizeof *ed * (size_t)c->n_expert);
        ly->exp_gate = eg;
        ly->exp_up = eu;
        ly->exp_down = ed;
        for (int e = 0; e < c->n_expert && !rc; e++) {
            mdl_tensor *egu[2] = { &eg[e], &eu[e] }, *edn[1] = { &ed[e] };
            if (!(rc = queue_group(q, &ql, egu, 2, err, errlen))) rc = queue_group(q, &ql, edn, 1, err, errlen);
        }
    }
    if (!rc && (rc = run_items(&ql, n_threads)))
        snprintf(err, errlen, "%s: converting the weights to FP8 failed: %s", c->name, cm_err_str(rc));
    free(ql.items);
    if (!rc) rc = mdl__validate(q, c->name, err, errlen);
    if (rc) {
        mdl_free(q);
        return rc;
    }
    *out = q;
    return 0;
oom:
    mdl_free(q);
    snprintf(err, errlen, "%s: out of memory", c->name);
    return CM_ENOMEM;
}
