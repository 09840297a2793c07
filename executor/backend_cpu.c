/* backend_cpu: the reference backend. Weights are read in place from the model's mapping
 * through k_matmul (every GGUF weight type kcpu has a kernel for); the KV pool is host f32;
 * all scratch is sized at create time for the engine's limits. */
#include "backend.h"
#include "../common/cm_err.h"
#include "../kernels/cpu/attn.h"
#include "../kernels/cpu/kcpu.h"
#include "../kernels/cpu/ops.h"
#include "../model/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    float *attn_norm, *ffn_norm; /* [n_embd] f32 copies */
    float *bq, *bk, *bv;         /* f32 copies or NULL */
    /* The file stores wq|wk|wv (and w_gate|w_up) back to back with one type: one k_matmul
     * over the concatenated rows replaces three (two), with the same per-row results. */
    int qkv_fused, gu_fused;
} cpu_layer;

typedef struct {
    ex_backend base;
    const mdl_model *m;
    ex_limits lim;
    k_pool *pool;
    k_rope_params rope;
    cpu_layer *ly;       /* [n_layer] */
    float *out_norm;     /* [n_embd] */
    float *kv;           /* [n_layer][2][n_kv_blocks][block_size][n_head_kv][head_dim] */
    size_t kv_half;      /* elements of one layer's K (or V) pool */
    /* scratch, T = lim.max_tokens, R = lim.max_out */
    float *x;            /* [T, n_embd] residual stream */
    float *xn;           /* [T, n_embd] normed input / projection output */
    float *q;            /* [T, n_head * head_dim] */
    float *k, *v;        /* [T, n_head_kv * head_dim] */
    float *qkv;          /* [T, (n_head + 2 n_head_kv) * head_dim] fused projection output */
    float *att;          /* [T, n_head * head_dim] */
    float *gu;           /* [T, 2 n_ff]: fused [gate | up] rows, or gate [T, n_ff] then up [T, n_ff] */
    float *h;            /* [T, n_ff] silu(gate) * up */
    float *xo;           /* [R, n_embd] rows whose logits are asked for */
    float *logits;       /* [R, n_vocab] */
} cpu_be;

static float *f32_copy(const mdl_tensor *t, int64_t n, int *rc) {
    if (!t->data) return NULL;
    float *p = malloc(sizeof(float) * (size_t)n);
    if (!p) { *rc = CM_ENOMEM; return NULL; }
    int r = dt_dequantize(t->type, t->data, p, n);
    if (r) { *rc = r; free(p); return NULL; }
    return p;
}

static void cpu_destroy(ex_backend *base) {
    if (!base) return;
    cpu_be *b = base->impl;
    if (b->ly) {
        for (int l = 0; l < b->m->cfg.n_layer; l++) {
            free(b->ly[l].attn_norm); free(b->ly[l].ffn_norm);
            free(b->ly[l].bq); free(b->ly[l].bk); free(b->ly[l].bv);
        }
        free(b->ly);
    }
    free(b->out_norm);
    free(b->kv);
    free(b->x); free(b->xn); free(b->q); free(b->k); free(b->v); free(b->qkv); free(b->att);
    free(b->gu); free(b->h); free(b->xo); free(b->logits);
    k_pool_destroy(b->pool);
    free(b);
}

static int mm(cpu_be *b, const mdl_tensor *w, const float *x, int64_t n_tok, float *y) {
    return k_matmul(b->pool, w->data, w->type, w->ne[0], w->ne[1], x, n_tok, y);
}

/* 1 when the tensors lie back to back in memory with the same type and row length. */
static int adjacent(const mdl_tensor *const *t, int n) {
    for (int i = 1; i < n; i++)
        if (!t[i]->data || t[i]->type != t[0]->type || t[i]->ne[0] != t[0]->ne[0] ||
            (const uint8_t *)t[i - 1]->data + t[i - 1]->nbytes != (const uint8_t *)t[i]->data)
            return 0;
    return 1;
}

static int cpu_forward(ex_backend *base, const ex_batch *bt, const float **logits) {
    cpu_be *b = base->impl;
    const mdl_model *m = b->m;
    const mdl_config *c = &m->cfg;
    const int64_t T = bt->n_tokens, E = c->n_embd, D = c->head_dim, H = c->n_head, HKV = c->n_head_kv, F = c->n_ff;
    int rc;
    *logits = NULL;

    rc = k_get_rows(m->tok_embd.data, m->tok_embd.type, E, m->tok_embd.ne[1], bt->tok, (int)T, b->x);
    if (rc) return rc;

    k_attn_args a = {
        .n_tok = T, .n_head = (int)H, .n_head_kv = (int)HKV, .head_dim = (int)D,
        .block_size = b->lim.block_size, .scale = (float)(1.0 / sqrt((double)D)),
        .q = b->q, .out = b->att, .tok_pos = bt->pos, .tok_seq = bt->seq,
        .block_tables = bt->block_tables, .bt_stride = bt->bt_stride, .n_blocks = bt->n_blocks,
        .n_pool_blocks = b->lim.n_kv_blocks,
    };
    for (int l = 0; l < c->n_layer; l++) {
        const mdl_layer *L = &m->layers[l];
        const cpu_layer *cl = &b->ly[l];
        /* attention block */
        k_rmsnorm(b->x, cl->attn_norm, T, E, c->norm_eps, b->xn);
        if (cl->qkv_fused) {
            const int64_t R = (H + 2 * HKV) * D;
            rc = k_matmul(b->pool, L->wq.data, L->wq.type, E, R, b->xn, T, b->qkv);
            if (rc) return rc;
            for (int64_t t = 0; t < T; t++) {
                const float *r = b->qkv + t * R;
                memcpy(b->q + t * H * D, r, sizeof(float) * (size_t)(H * D));
                memcpy(b->k + t * HKV * D, r + H * D, sizeof(float) * (size_t)(HKV * D));
                memcpy(b->v + t * HKV * D, r + (H + HKV) * D, sizeof(float) * (size_t)(HKV * D));
            }
        } else if ((rc = mm(b, &L->wq, b->xn, T, b->q)) || (rc = mm(b, &L->wk, b->xn, T, b->k)) ||
                   (rc = mm(b, &L->wv, b->xn, T, b->v))) {
            return rc;
        }
        if (cl->bq) k_add_bias(b->q, cl->bq, T, H * D);
        if (cl->bk) k_add_bias(b->k, cl->bk, T, HKV * D);
        if (cl->bv) k_add_bias(b->v, cl->bv, T, HKV * D);
        k_rope(&b->rope, b->q, T, (int)H, (int)D, bt->pos);
        k_rope(&b->rope, b->k, T, (int)HKV, (int)D, bt->pos);
        a.k_pool = b->kv + (size_t)l * 2 * b->kv_half;
        a.v_pool = a.k_pool + b->kv_half;
        if ((rc = k_kv_write(&a, b->k, b->v))) return rc;
        if ((rc = k_attn_paged(b->pool, &a))) return rc;
        if ((rc = mm(b, &L->wo, b->att, T, b->xn))) return rc;
        k_add(b->x, b->xn, T * E);
        /* MLP block */
        k_rmsnorm(b->x, cl->ffn_norm, T, E, c->norm_eps, b->xn);
        if (cl->gu_fused) {
            if ((rc = k_matmul(b->pool, L->w_gate.data, L->w_gate.type, E, 2 * F, b->xn, T, b->gu))) return rc;
            for (int64_t t = 0; t < T; t++) k_swiglu(b->gu + t * 2 * F, b->gu + t * 2 * F + F, F, b->h + t * F);
        } else {
            if ((rc = mm(b, &L->w_gate, b->xn, T, b->gu)) || (rc = mm(b, &L->w_up, b->xn, T, b->gu + T * F))) return rc;
            k_swiglu(b->gu, b->gu + T * F, T * F, b->h);
        }
        if ((rc = mm(b, &L->w_down, b->h, T, b->xn))) return rc;
        k_add(b->x, b->xn, T * E);
    }
    /* Only the rows asked for go through the output head. */
    int r = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        int t0 = bt->seq_start[s], n = bt->seq_len[s];
        int first = bt->out_all[s] ? t0 : t0 + n - 1;
        for (int t = first; t < t0 + n; t++, r++)
            k_rmsnorm(b->x + (int64_t)t * E, b->out_norm, 1, E, c->norm_eps, b->xo + (int64_t)r * E);
    }
    if ((rc = mm(b, &m->output, b->xo, r, b->logits))) return rc;
    *logits = b->logits;
    return 0;
}

static int cpu_kv_copy(ex_backend *base, int32_t src, int32_t dst, int n_tok) {
    cpu_be *b = base->impl;
    const mdl_config *c = &b->m->cfg;
    if (src < 0 || dst < 0 || src >= b->lim.n_kv_blocks || dst >= b->lim.n_kv_blocks || n_tok < 0 ||
        n_tok > b->lim.block_size)
        return CM_EINVAL;
    size_t row = (size_t)c->n_head_kv * c->head_dim, blk = row * b->lim.block_size;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < 2; h++) {
            float *pool = b->kv + ((size_t)l * 2 + h) * b->kv_half;
            memmove(pool + dst * blk, pool + src * blk, sizeof(float) * row * (size_t)n_tok);
        }
    return 0;
}

/* Probes k_matmul / k_get_rows with one output row of the real tensor: the kernels decide
 * which types they support, and this reports the first one they don't. */
static int check_weight(cpu_be *b, const mdl_tensor *w, float *tmp, char *err, size_t errlen) {
    int rc = k_matmul(b->pool, w->data, w->type, w->ne[0], 1, tmp, 1, tmp + w->ne[0]);
    if (rc == CM_EUNSUPPORTED)
        snprintf(err, errlen, "tensor %s: type %s is not supported by the cpu backend", w->name,
                 dt_name(w->type) ? dt_name(w->type) : "?");
    else if (rc)
        snprintf(err, errlen, "tensor %s: %s", w->name, cm_err_str(rc));
    return rc;
}

int ex_backend_cpu_create(const mdl_model *m, const ex_backend_opts *o, ex_backend **out, char *err, size_t errlen) {
    *out = NULL;
    const mdl_config *c = &m->cfg;
    const ex_limits *L = &o->lim;
    if (o->kv_type != DT_F32) {
        snprintf(err, errlen, "cpu backend: KV cache type %s not supported (F32 only)", dt_name(o->kv_type) ? dt_name(o->kv_type) : "?");
        return CM_EUNSUPPORTED;
    }
    if (L->n_kv_blocks <= 0) {
        snprintf(err, errlen, "cpu backend: the KV pool needs an explicit size (%d blocks)", L->n_kv_blocks);
        return CM_EINVAL;
    }
    if (c->arch != MDL_ARCH_LLAMA && c->arch != MDL_ARCH_MISTRAL && c->arch != MDL_ARCH_QWEN2) {
        snprintf(err, errlen, "cpu backend: architecture '%s' is not supported", c->arch_name);
        return CM_EUNSUPPORTED;
    }
    if (c->head_dim > K_ATTN_MAX_HEAD_DIM || L->block_size > K_ATTN_MAX_BLOCK || c->n_head % c->n_head_kv) {
        snprintf(err, errlen, "cpu backend: head_dim %d / block size %d / heads %d:%d not supported",
                 c->head_dim, L->block_size, c->n_head, c->n_head_kv);
        return CM_EUNSUPPORTED;
    }
    cpu_be *b = calloc(1, sizeof *b);
    if (!b) return CM_ENOMEM;
    b->m = m;
    b->lim = *L;
    b->base.name = "cpu";
    b->base.kv_type = DT_F32;
    b->base.n_kv_blocks = L->n_kv_blocks;
    b->base.forward = cpu_forward;
    b->base.forward_sample = NULL; /* the engine samples on the host */
    b->base.kv_copy = cpu_kv_copy;
    b->base.destroy = cpu_destroy;
    b->base.impl = b;
    int rc, nt = o->n_threads;
    if (nt <= 0) {
        /* automatic: every core, but one per 16 MiB of weights at most: waking workers for
         * matrices of a few KiB costs more than it saves */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int64_t by_size = (int64_t)(m->weight_bytes >> 24) + 1;
        nt = (int)(cores < by_size ? cores : by_size);
        if (nt <= 0) nt = 1;
    }
    if ((rc = k_pool_create(nt, &b->pool))) { snprintf(err, errlen, "cpu backend: thread pool: %s", cm_err_str(rc)); goto fail; }
    if ((rc = k_rope_init(&b->rope, c))) { snprintf(err, errlen, "cpu backend: rope dimension %d not supported", c->rope_dim); goto fail; }

    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim;
    int64_t max_in = E > c->n_ff ? E : c->n_ff;
    if (QD > max_in) max_in = QD;
    {   /* every weight's type must have a kernel */
        float *tmp = calloc((size_t)max_in + 16, sizeof(float));
        if (!tmp) { rc = CM_ENOMEM; goto fail; }
        rc = check_weight(b, &m->output, tmp, err, errlen);
        for (int l = 0; !rc && l < c->n_layer; l++) {
            const mdl_layer *ly = &m->layers[l];
            const mdl_tensor *ws[] = { &ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down };
            for (size_t i = 0; !rc && i < sizeof ws / sizeof *ws; i++) rc = check_weight(b, ws[i], tmp, err, errlen);
        }
        int32_t id0 = 0;
        if (!rc && (rc = k_get_rows(m->tok_embd.data, m->tok_embd.type, E, m->tok_embd.ne[1], &id0, 1, tmp)))
            snprintf(err, errlen, "tensor %s: type %s is not supported by the cpu backend", m->tok_embd.name,
                     dt_name(m->tok_embd.type) ? dt_name(m->tok_embd.type) : "?");
        free(tmp);
        if (rc) goto fail;
    }
    b->ly = calloc((size_t)c->n_layer, sizeof *b->ly);
    if (!b->ly) { rc = CM_ENOMEM; goto nomem; }
    rc = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const mdl_layer *ly = &m->layers[l];
        cpu_layer *cl = &b->ly[l];
        cl->attn_norm = f32_copy(&ly->attn_norm, E, &rc);
        cl->ffn_norm = f32_copy(&ly->ffn_norm, E, &rc);
        cl->bq = f32_copy(&ly->bq, QD, &rc);
        cl->bk = f32_copy(&ly->bk, KD, &rc);
        cl->bv = f32_copy(&ly->bv, KD, &rc);
        const mdl_tensor *qkv[3] = { &ly->wq, &ly->wk, &ly->wv }, *gu[2] = { &ly->w_gate, &ly->w_up };
        cl->qkv_fused = adjacent(qkv, 3);
        cl->gu_fused = adjacent(gu, 2);
        if (rc || !cl->attn_norm || !cl->ffn_norm) {
            snprintf(err, errlen, "cpu backend: layer %d norm/bias weights: %s", l, cm_err_str(rc ? rc : CM_EFORMAT));
            if (!rc) rc = CM_EFORMAT;
            goto fail;
        }
    }
    b->out_norm = f32_copy(&m->out_norm, E, &rc);
    if (rc || !b->out_norm) goto nomem;

    b->kv_half = (size_t)L->n_kv_blocks * L->block_size * (size_t)KD;
    b->kv = malloc(sizeof(float) * b->kv_half * 2 * (size_t)c->n_layer);
    if (!b->kv) {
        snprintf(err, errlen, "cpu backend: cannot allocate the KV cache (%.1f MiB)",
                 sizeof(float) * b->kv_half * 2.0 * c->n_layer / 1048576.0);
        rc = CM_ENOMEM;
        goto fail;
    }
    size_t T = (size_t)L->max_tokens, R = (size_t)L->max_out;
    b->x = malloc(sizeof(float) * T * E);
    b->xn = malloc(sizeof(float) * T * E);
    b->q = malloc(sizeof(float) * T * QD);
    b->k = malloc(sizeof(float) * T * KD);
    b->v = malloc(sizeof(float) * T * KD);
    b->qkv = malloc(sizeof(float) * T * (QD + 2 * KD));
    b->att = malloc(sizeof(float) * T * QD);
    b->gu = malloc(sizeof(float) * T * 2 * c->n_ff);
    b->h = malloc(sizeof(float) * T * c->n_ff);
    b->xo = malloc(sizeof(float) * R * E);
    b->logits = malloc(sizeof(float) * R * c->n_vocab);
    if (!b->x || !b->xn || !b->q || !b->k || !b->v || !b->qkv || !b->att || !b->gu || !b->h || !b->xo || !b->logits) goto nomem;
    if ((rc = k_pool_reserve(b->pool, L->max_tokens, max_in))) goto nomem;
    *out = &b->base;
    return 0;
nomem:
    rc = CM_ENOMEM;
    snprintf(err, errlen, "cpu backend: out of memory sizing buffers for %d tokens per step", L->max_tokens);
fail:
    cpu_destroy(&b->base);
    return rc;
}
