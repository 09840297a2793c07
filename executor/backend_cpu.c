/* backend_cpu: the reference backend. Weights are read in place from the model's mapping
 * through k_matmul (every GGUF weight type kcpu has a kernel for; quantized experts stay
 * quantized; F8_E4M3 matrices as code x row scale, k_matmul_scaled); the KV pools are host
 * memory of the engine's KV type (f32 by default; f16, fp8 and q8_0 in executor/kv.h's layout,
 * rounded exactly as that layout says), one for the full-attention layers, one for the
 * sliding-window layers; all scratch is sized at create time for the engine's limits.
 *
 * One layer, top to bottom (model.h lists which model uses which step):
 *   xn = rmsnorm(x, attn_norm); q, k, v = xn Wq, Wk, Wv (+ biases); q, k = rmsnorm per head
 *   (QK-norm); rope(q, k) with the layer's rope; store k, v; att = attention (scale, soft-cap,
 *   window); o = att Wo (rmsnorm: post-norm); x += o
 *   xn = rmsnorm(x, ffn_norm); m = MLP(xn) (SwiGLU / GeGLU, or the router's top-k experts'
 *   weighted sum); (rmsnorm: post-norm); x += m */
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
    float *q_norm, *k_norm;      /* [head_dim] or NULL */
    float *attn_post, *ffn_post; /* [n_embd] or NULL */
    float *bq, *bk, *bv;         /* f32 copies or NULL */
    /* The file stores wq|wk|wv (and w_gate|w_up) back to back with one type: one k_matmul
     * over the concatenated rows replaces three (two), with the same per-row results. */
    int qkv_fused, gu_fused;
    uint8_t *exp_gu_fused;       /* [n_expert] the same for each expert, or NULL (dense layer) */
    int swa;                     /* sliding-window layer */
    int slot;                    /* its index among the layers of its KV pool */
} cpu_layer;

typedef struct {
    ex_backend base;
    const mdl_model *m;
    ex_limits lim;
    k_pool *pool;
    k_rope_params rope, rope_swa; /* full-attention layers, sliding-window layers */
    cpu_layer *ly;       /* [n_layer] */
    float *out_norm;     /* [n_embd] */
    int kv_type;         /* executor/kv.h: the element type and block layout of K and V */
    uint8_t *kv;         /* [n_full layers][2][n_kv_blocks] blocks of k_kv_block_bytes() */
    uint8_t *kv_swa;     /* [n_swa layers][2][n_kv_blocks_swa] blocks */
    size_t kv_half, kv_half_swa; /* bytes of one layer's K (or V) pool */
    /* scratch, T = lim.max_tokens, R = lim.max_out, F = max(n_ff, n_ff_exp) */
    float *x;            /* [T, n_embd] residual stream */
    float *xn;           /* [T, n_embd] normed input / projection output */
    float *q;            /* [T, n_head * head_dim] */
    float *k, *v;        /* [T, n_head_kv * head_dim] */
    float *qkv;          /* [T, (n_head + 2 n_head_kv) * head_dim] fused projection output */
    float *att;          /* [T, n_head * head_dim] */
    float *gu;           /* [T, 2 F]: fused [gate | up] rows, or gate [T, F] then up [T, F] */
    float *h;            /* [T, F] act(gate) * up */
    float *xo;           /* [R, n_embd] rows whose logits are asked for (final-normed) */
    float *logits;       /* [R, n_vocab] */
    /* mixture of experts, NE = n_expert, K = n_expert_used */
    float *rlogits;      /* [T, NE] router logits */
    int32_t *ridx;       /* [T, K] chosen experts */
    float *rw;           /* [T, K] their weights */
    int32_t *ecount, *estart; /* [NE] tokens per expert, first entry in elist */
    int32_t *elist;      /* [T * K] tokens grouped by expert, in token order */
    float *ewt;          /* [T * K] their weights */
    float *xg;           /* [T, n_embd] one expert's gathered inputs */
    float *eo;           /* [T, n_embd] one expert's outputs */
    float *acc;          /* [T, n_embd] the weighted sum over experts */
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
            cpu_layer *cl = &b->ly[l];
            free(cl->attn_norm); free(cl->ffn_norm); free(cl->q_norm); free(cl->k_norm);
            free(cl->attn_post); free(cl->ffn_post);
            free(cl->bq); free(cl->bk); free(cl->bv);
            free(cl->exp_gu_fused);
        }
        free(b->ly);
    }
    free(b->out_norm);
    free(b->kv); free(b->kv_swa);
    free(b->x); free(b->xn); free(b->q); free(b->k); free(b->v); free(b->qkv); free(b->att);
    free(b->gu); free(b->h); free(b->xo); free(b->logits);
    free(b->rlogits); free(b->ridx); free(b->rw); free(b->ecount); free(b->estart); free(b->elist); free(b->ewt);
    free(b->xg); free(b->eo); free(b->acc);
    k_pool_destroy(b->pool);
    free(b);
}

static int mm(cpu_be *b, const mdl_tensor *w, const float *x, int64_t n_tok, float *y) {
    return k_matmul_scaled(b->pool, w->data, w->type, w->scale, w->ne[0], w->ne[1], x, n_tok, y);
}

/* 1 when the tensors lie back to back in memory with the same type and row length (and their
 * FP8 row scales too). */
static int adjacent(const mdl_tensor *const *t, int n) {
    for (int i = 1; i < n; i++)
        if (!t[i]->data || t[i]->type != t[0]->type || t[i]->ne[0] != t[0]->ne[0] ||
            (const uint8_t *)t[i - 1]->data + t[i - 1]->nbytes != (const uint8_t *)t[i]->data ||
            (t[0]->scale && t[i - 1]->scale + t[i - 1]->ne[1] != t[i]->scale))
            return 0;
    return 1;
}

/* h = act(gate) * up over n_tok rows of F, from gate/up weights (fused: one matmul). */
static int gated_mlp(cpu_be *b, const mdl_tensor *wg, const mdl_tensor *wu, int fused, const float *x, int64_t T, int64_t E,
                     int64_t F) {
    int rc;
    void (*act)(const float *, const float *, int64_t, float *) = b->m->cfg.ffn_act == MDL_ACT_GELU_TANH ? k_geglu : k_swiglu;
    if (fused) {
        if ((rc = k_matmul_scaled(b->pool, wg->data, wg->type, wg->scale, E, 2 * F, x, T, b->gu))) return rc;
        for (int64_t t = 0; t < T; t++) act(b->gu + t * 2 * F, b->gu + t * 2 * F + F, F, b->h + t * F);
    } else {
        if ((rc = mm(b, wg, x, T, b->gu)) || (rc = mm(b, wu, x, T, b->gu + T * F))) return rc;
        act(b->gu, b->gu + T * F, T * F, b->h);
    }
    return 0;
}

/* out[t] = sum over token t's top-k experts e (ascending e) of w * down_e(act(gate_e x) * up_e x).
 * Tokens are grouped by expert, so each expert's weights are read once per step. */
static int moe(cpu_be *b, const mdl_layer *L, const cpu_layer *cl, const float *x, int64_t T, float *out) {
    const mdl_config *c = &b->m->cfg;
    const int NE = c->n_expert, K = c->n_expert_used;
    const int64_t E = c->n_embd, F = c->n_ff_exp;
    int rc;
    if ((rc = mm(b, &L->ffn_gate_inp, x, T, b->rlogits))) return rc;
    memset(b->ecount, 0, sizeof(int32_t) * (size_t)NE);
    for (int64_t t = 0; t < T; t++) {
        k_topk_route(b->rlogits + t * NE, NE, K, c->expert_norm, b->ridx + t * K, b->rw + t * K);
        for (int j = 0; j < K; j++) b->ecount[b->ridx[t * K + j]]++;
    }
    for (int e = 0, at = 0; e < NE; e++) {
        b->estart[e] = at;
        at += b->ecount[e];
        b->ecount[e] = 0;
    }
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e = b->ridx[t * K + j], at = b->estart[e] + b->ecount[e]++;
            b->elist[at] = (int32_t)t;
            b->ewt[at] = b->rw[t * K + j];
        }
    memset(out, 0, sizeof(float) * (size_t)(T * E));
    for (int e = 0; e < NE; e++) {
        int n = b->ecount[e];
        if (!n) continue;
        const int32_t *tok = b->elist + b->estart[e];
        const float *wt = b->ewt + b->estart[e];
        for (int r = 0; r < n; r++) memcpy(b->xg + (int64_t)r * E, x + (int64_t)tok[r] * E, sizeof(float) * (size_t)E);
        if ((rc = gated_mlp(b, &L->exp_gate[e], &L->exp_up[e], cl->exp_gu_fused[e], b->xg, n, E, F)) ||
            (rc = mm(b, &L->exp_down[e], b->h, n, b->eo)))
            return rc;
        for (int r = 0; r < n; r++) {
            float *o = out + (int64_t)tok[r] * E;
            const float *y = b->eo + (int64_t)r * E;
            for (int64_t i = 0; i < E; i++) o[i] += wt[r] * y[i];
        }
    }
    return 0;
}

/* The whole stack over the batch; leaves the final-normed rows the batch asks for in b->xo
 * and returns their count in *n_rows. */
static int run_layers(cpu_be *b, const ex_batch *bt, int *n_rows) {
    const mdl_model *m = b->m;
    const mdl_config *c = &m->cfg;
    const int64_t T = bt->n_tokens, E = c->n_embd, D = c->head_dim, H = c->n_head, HKV = c->n_head_kv, F = c->n_ff;
    int rc;

    if ((rc = k_get_rows(m->tok_embd.data, m->tok_embd.type, E, m->tok_embd.ne[1], bt->tok, (int)T, b->x))) return rc;
    if (c->embd_scale > 0 && c->embd_scale != 1.0f) k_scale(b->x, T * E, c->embd_scale);

    k_attn_args a = {
        .n_tok = T, .n_head = (int)H, .n_head_kv = (int)HKV, .head_dim = (int)D,
        .block_size = b->lim.block_size, .scale = c->attn_scale > 0 ? c->attn_scale : (float)(1.0 / sqrt((double)D)),
        .softcap = c->attn_softcap,
        .q = b->q, .out = b->att, .tok_pos = bt->pos, .tok_seq = bt->seq,
        .bt_stride = bt->bt_stride, .n_blocks = bt->n_blocks, .kv_type = b->kv_type,
    };
    for (int l = 0; l < c->n_layer; l++) {
        const mdl_layer *L = &m->layers[l];
        const cpu_layer *cl = &b->ly[l];
        /* attention block */
        k_rmsnorm(b->x, cl->attn_norm, T, E, c->norm_eps, b->xn);
        if (cl->qkv_fused) {
            const int64_t R = (H + 2 * HKV) * D;
            if ((rc = k_matmul_scaled(b->pool, L->wq.data, L->wq.type, L->wq.scale, E, R, b->xn, T, b->qkv))) return rc;
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
        if (cl->q_norm) {
            k_rmsnorm(b->q, cl->q_norm, T * H, D, c->norm_eps, b->q);
            k_rmsnorm(b->k, cl->k_norm, T * HKV, D, c->norm_eps, b->k);
        }
        const k_rope_params *rp = cl->swa ? &b->rope_swa : &b->rope;
        k_rope(rp, b->q, T, (int)H, (int)D, bt->pos);
        k_rope(rp, b->k, T, (int)HKV, (int)D, bt->pos);
        a.k_scale = L->k_scale;
        a.v_scale = L->v_scale;
        if (cl->swa) {
            a.k_pool = b->kv_swa + (size_t)cl->slot * 2 * b->kv_half_swa;
            a.v_pool = (uint8_t *)a.k_pool + b->kv_half_swa;
            a.block_tables = bt->block_tables_swa;
            a.n_pool_blocks = b->lim.n_kv_blocks_swa;
            a.window = c->n_swa;
        } else {
            a.k_pool = b->kv + (size_t)cl->slot * 2 * b->kv_half;
            a.v_pool = (uint8_t *)a.k_pool + b->kv_half;
            a.block_tables = bt->block_tables;
            a.n_pool_blocks = b->lim.n_kv_blocks;
            a.window = 0;
        }
        if ((rc = k_kv_write(&a, b->k, b->v))) return rc;
        if ((rc = k_attn_paged(b->pool, &a))) return rc;
        if ((rc = mm(b, &L->wo, b->att, T, b->xn))) return rc;
        if (cl->attn_post) k_rmsnorm(b->xn, cl->attn_post, T, E, c->norm_eps, b->xn);
        k_add(b->x, b->xn, T * E);
        /* MLP block */
        k_rmsnorm(b->x, cl->ffn_norm, T, E, c->norm_eps, b->xn);
        float *mo = b->xn;
        if (L->ffn_gate_inp.data) {
            if ((rc = moe(b, L, cl, b->xn, T, b->acc))) return rc;
            mo = b->acc;
        } else if ((rc = gated_mlp(b, &L->w_gate, &L->w_up, cl->gu_fused, b->xn, T, E, F)) ||
                   (rc = mm(b, &L->w_down, b->h, T, b->xn))) {
            return rc;
        }
        if (cl->ffn_post) k_rmsnorm(mo, cl->ffn_post, T, E, c->norm_eps, mo);
        k_add(b->x, mo, T * E);
    }
    /* Only the rows asked for go on. */
    int r = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        int t0 = bt->seq_start[s], n = bt->seq_len[s];
        int first = bt->out_all[s] ? t0 : t0 + n - 1;
        for (int t = first; t < t0 + n; t++, r++)
            k_rmsnorm(b->x + (int64_t)t * E, b->out_norm, 1, E, c->norm_eps, b->xo + (int64_t)r * E);
    }
    *n_rows = r;
    return 0;
}

static int cpu_forward(ex_backend *base, const ex_batch *bt, const float **logits) {
    cpu_be *b = base->impl;
    const mdl_config *c = &b->m->cfg;
    int r, rc;
    *logits = NULL;
    if ((rc = run_layers(b, bt, &r)) || (rc = mm(b, &b->m->output, b->xo, r, b->logits))) return rc;
    if (c->final_softcap > 0) k_softcap(b->logits, (int64_t)r * c->n_vocab, c->final_softcap);
    *logits = b->logits;
    return 0;
}

static int cpu_forward_hidden(ex_backend *base, const ex_batch *bt, const float **hidden) {
    cpu_be *b = base->impl;
    int r, rc;
    *hidden = NULL;
    if ((rc = run_layers(b, bt, &r))) return rc;
    *hidden = b->xo;
    return 0;
}

static int cpu_kv_copy(ex_backend *base, int32_t src, int32_t dst, int n_tok) {
    cpu_be *b = base->impl;
    const mdl_config *c = &b->m->cfg;
    k_attn_args a = { .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim, .block_size = b->lim.block_size,
                      .n_pool_blocks = b->lim.n_kv_blocks, .kv_type = b->kv_type };
    for (int l = 0; l < c->n_layer - c->n_layer_swa; l++) {
        a.k_pool = b->kv + (size_t)l * 2 * b->kv_half;
        a.v_pool = (uint8_t *)a.k_pool + b->kv_half;
        int rc = k_kv_copy(&a, src, dst, n_tok);
        if (rc) return rc;
    }
    return 0;
}

/* Probes k_matmul / k_get_rows with one output row of the real tensor: the kernels decide
 * which types they support, and this reports the first one they don't. */
static int check_weight(cpu_be *b, const mdl_tensor *w, float *tmp, char *err, size_t errlen) {
    if (!w->data) return 0;
    int rc = k_matmul_scaled(b->pool, w->data, w->type, w->scale, w->ne[0], 1, tmp, 1, tmp + w->ne[0]);
    if (rc == CM_EUNSUPPORTED)
        snprintf(err, errlen, "tensor %s: type %s is not supported by the cpu backend", w->name,
                 dt_name(w->type) ? dt_name(w->type) : "?");
    else if (rc)
        snprintf(err, errlen, "tensor %s: %s", w->name, cm_err_str(rc));
    return rc;
}

static int check_weights(cpu_be *b, int64_t max_in, char *err, size_t errlen) {
    const mdl_model *m = b->m;
    const mdl_config *c = &m->cfg;
    float *tmp = calloc((size_t)max_in + 16, sizeof(float));
    if (!tmp) return CM_ENOMEM;
    int rc = check_weight(b, &m->output, tmp, err, errlen);
    for (int l = 0; !rc && l < c->n_layer; l++) {
        const mdl_layer *ly = &m->layers[l];
        const mdl_tensor *ws[] = { &ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down, &ly->ffn_gate_inp };
        for (size_t i = 0; !rc && i < sizeof ws / sizeof *ws; i++) rc = check_weight(b, ws[i], tmp, err, errlen);
        for (int e = 0; !rc && ly->ffn_gate_inp.data && e < c->n_expert; e++)
            if (!(rc = check_weight(b, &ly->exp_gate[e], tmp, err, errlen)) && !(rc = check_weight(b, &ly->exp_up[e], tmp, err, errlen)))
                rc = check_weight(b, &ly->exp_down[e], tmp, err, errlen);
    }
    int32_t id0 = 0;
    if (!rc && (rc = k_get_rows(m->tok_embd.data, m->tok_embd.type, c->n_embd, m->tok_embd.ne[1], &id0, 1, tmp)))
        snprintf(err, errlen, "tensor %s: type %s is not supported by the cpu backend", m->tok_embd.name,
                 dt_name(m->tok_embd.type) ? dt_name(m->tok_embd.type) : "?");
    free(tmp);
    return rc;
}

int ex_backend_cpu_create(const mdl_model *m, const ex_backend_opts *o, ex_backend **out, char *err, size_t errlen) {
    *out = NULL;
    const mdl_config *c = &m->cfg;
    const ex_limits *L = &o->lim;
    size_t kv_blk = k_kv_block_bytes(o->kv_type, L->block_size, c->n_head_kv, c->head_dim);
    if (!kv_blk || o->kv_type == DT_BF16) {
        snprintf(err, errlen, "cpu backend: KV cache type %s not supported%s (f32, f16, fp8, q8_0)",
                 dt_name(o->kv_type) ? dt_name(o->kv_type) : "?",
                 o->kv_type == DT_Q8_0 && c->head_dim % 32 ? " for a head_dim that is not a multiple of 32" : "");
        return CM_EUNSUPPORTED;
    }
    if (L->n_kv_blocks <= 0 || (c->n_layer_swa > 0 && L->n_kv_blocks_swa <= 0)) {
        snprintf(err, errlen, "cpu backend: the KV pool needs an explicit size (%d blocks, %d sliding-window blocks)", L->n_kv_blocks,
                 L->n_kv_blocks_swa);
        return CM_EINVAL;
    }
    if (c->arch < 0 || c->arch >= MDL_ARCH_COUNT) {
        snprintf(err, errlen, "cpu backend: architecture '%s' is not supported", c->arch_name);
        return CM_EUNSUPPORTED;
    }
    if (c->head_dim > K_ATTN_MAX_HEAD_DIM || L->block_size > K_ATTN_MAX_BLOCK || c->n_head % c->n_head_kv ||
        c->n_expert > MDL_MAX_EXPERTS) {
        snprintf(err, errlen, "cpu backend: head_dim %d / block size %d / heads %d:%d / %d experts not supported",
                 c->head_dim, L->block_size, c->n_head, c->n_head_kv, c->n_expert);
        return CM_EUNSUPPORTED;
    }
    cpu_be *b = calloc(1, sizeof *b);
    if (!b) return CM_ENOMEM;
    b->m = m;
    b->lim = *L;
    b->base.name = "cpu";
    b->base.kv_type = o->kv_type;
    b->kv_type = o->kv_type;
    b->base.n_kv_blocks = L->n_kv_blocks;
    b->base.n_kv_blocks_swa = c->n_layer_swa > 0 ? L->n_kv_blocks_swa : 0;
    b->lim.n_kv_blocks_swa = b->base.n_kv_blocks_swa;
    b->base.forward = cpu_forward;
    b->base.forward_sample = NULL; /* the engine samples on the host */
    b->base.forward_hidden = cpu_forward_hidden;
    b->base.features = ~0u; /* every feature of model.h */
    b->base.kv_copy = cpu_kv_copy;
    b->base.destroy = cpu_destroy;
    b->base.impl = b;
    int rc, nt = o->n_threads;
    if (nt <= 0) {
        /* automatic: every core, but one per 16 MiB of weights read per token at most: waking
         * workers for matrices of a few KiB costs more than it saves */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int64_t by_size = (int64_t)((m->active_bytes ? m->active_bytes : m->weight_bytes) >> 24) + 1;
        nt = (int)(cores < by_size ? cores : by_size);
        if (nt <= 0) nt = 1;
    }
    if ((rc = k_pool_create(nt, &b->pool))) { snprintf(err, errlen, "cpu backend: thread pool: %s", cm_err_str(rc)); goto fail; }
    mdl_rope r;
    mdl_layer_rope(c, 0, &r);
    if ((rc = k_rope_init_layer(&b->rope, &r, L->n_ctx))) { snprintf(err, errlen, "cpu backend: rope dimension %d not supported", c->rope_dim); goto fail; }
    mdl_layer_rope(c, 1, &r);
    if ((rc = k_rope_init_layer(&b->rope_swa, &r, L->n_ctx))) { snprintf(err, errlen, "cpu backend: rope dimension %d not supported", c->rope_dim); goto fail; }

    const int64_t E = c->n_embd, QD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t F = c->n_ff > c->n_ff_exp ? c->n_ff : c->n_ff_exp;
    int64_t max_in = E > F ? E : F;
    if (QD > max_in) max_in = QD;
    if ((rc = check_weights(b, max_in, err, errlen))) goto fail;
    if (!(b->ly = calloc((size_t)c->n_layer, sizeof *b->ly))) goto nomem;
    rc = 0;
    int n_full = 0, n_swa = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const mdl_layer *ly = &m->layers[l];
        cpu_layer *cl = &b->ly[l];
        cl->attn_norm = f32_copy(&ly->attn_norm, E, &rc);
        cl->ffn_norm = f32_copy(&ly->ffn_norm, E, &rc);
        cl->q_norm = f32_copy(&ly->attn_q_norm, c->head_dim, &rc);
        cl->k_norm = f32_copy(&ly->attn_k_norm, c->head_dim, &rc);
        cl->attn_post = f32_copy(&ly->attn_post_norm, E, &rc);
        cl->ffn_post = f32_copy(&ly->ffn_post_norm, E, &rc);
        cl->bq = f32_copy(&ly->bq, QD, &rc);
        cl->bk = f32_copy(&ly->bk, KD, &rc);
        cl->bv = f32_copy(&ly->bv, KD, &rc);
        const mdl_tensor *qkv[3] = { &ly->wq, &ly->wk, &ly->wv }, *gu[2] = { &ly->w_gate, &ly->w_up };
        cl->qkv_fused = adjacent(qkv, 3);
        cl->gu_fused = ly->w_gate.data && adjacent(gu, 2);
        cl->swa = ly->swa;
        cl->slot = ly->swa ? n_swa++ : n_full++;
        if (ly->ffn_gate_inp.data) {
            if (!(cl->exp_gu_fused = malloc((size_t)c->n_expert))) goto nomem;
            for (int e = 0; e < c->n_expert; e++) {
                const mdl_tensor *egu[2] = { &ly->exp_gate[e], &ly->exp_up[e] };
                cl->exp_gu_fused[e] = (uint8_t)adjacent(egu, 2);
            }
        }
        if (rc || !cl->attn_norm || !cl->ffn_norm || (c->has_qk_norm && (!cl->q_norm || !cl->k_norm)) ||
            (c->has_post_norms && (!cl->attn_post || !cl->ffn_post))) {
            snprintf(err, errlen, "cpu backend: layer %d norm/bias weights: %s", l, cm_err_str(rc ? rc : CM_EFORMAT));
            if (!rc) rc = CM_EFORMAT;
            goto fail;
        }
    }
    b->out_norm = f32_copy(&m->out_norm, E, &rc);
    if (rc || !b->out_norm) goto nomem;

    b->kv_half = (size_t)L->n_kv_blocks * kv_blk;
    b->kv_half_swa = (size_t)b->lim.n_kv_blocks_swa * kv_blk;
    double kv_mib = 2.0 * ((double)b->kv_half * n_full + (double)b->kv_half_swa * n_swa) / 1048576.0;
    if ((n_full && !(b->kv = malloc(b->kv_half * 2 * (size_t)n_full))) ||
        (n_swa && !(b->kv_swa = malloc(b->kv_half_swa * 2 * (size_t)n_swa)))) {
        snprintf(err, errlen, "cpu backend: cannot allocate the KV cache (%.1f MiB)", kv_mib);
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
    b->gu = malloc(sizeof(float) * T * 2 * F);
    b->h = malloc(sizeof(float) * T * F);
    b->xo = malloc(sizeof(float) * R * E);
    b->logits = malloc(sizeof(float) * R * c->n_vocab);
    if (!b->x || !b->xn || !b->q || !b->k || !b->v || !b->qkv || !b->att || !b->gu || !b->h || !b->xo || !b->logits) goto nomem;
    if (c->n_expert > 0) {
        size_t NE = (size_t)c->n_expert, K = (size_t)c->n_expert_used;
        b->rlogits = malloc(sizeof(float) * T * NE);
        b->ridx = malloc(sizeof(int32_t) * T * K);
        b->rw = malloc(sizeof(float) * T * K);
        b->ecount = malloc(sizeof(int32_t) * NE);
        b->estart = malloc(sizeof(int32_t) * NE);
        b->elist = malloc(sizeof(int32_t) * T * K);
        b->ewt = malloc(sizeof(float) * T * K);
        b->xg = malloc(sizeof(float) * T * E);
        b->eo = malloc(sizeof(float) * T * E);
        b->acc = malloc(sizeof(float) * T * E);
        if (!b->rlogits || !b->ridx || !b->rw || !b->ecount || !b->estart || !b->elist || !b->ewt || !b->xg || !b->eo || !b->acc)
            goto nomem;
    }
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
