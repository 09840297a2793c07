/* Tensor parallelism's math on the CPU (executor/tp.h): stories260K's weights cut for N = 1, 2, 4
 * ranks by ex_tp_plan, each rank computing only with its shard (vocab-parallel embedding, Q/K/V
 * and gate/up column-parallel, output projection and down row-parallel, its KV heads), the
 * partial results summed where the all-reduces go, the logits gathered from the ranks' head
 * slices. The N-rank logits equal the one-rank logits (to float summation order), and the
 * one-rank reference equals the engine's CPU backend, so the cut is the model's own math. Then
 * the plan's refusals and its replicated KV heads. */
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/tp.h"
#include "common/cm_err.h"
#include "model/model.h"
#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define T_TOK 12

static const mdl_model *m;

/* rows [r0, r0 + n) of t as f32, columns [c0, c0 + nc) of each */
static float *rows_cols(const mdl_tensor *t, int r0, int n, int c0, int nc) {
    const int ne0 = (int)t->ne[0];
    float *full = malloc(sizeof(float) * (size_t)n * ne0), *out = malloc(sizeof(float) * (size_t)n * nc);
    T_EQ_INT(mdl_tensor_rows_f32(t, r0, n, full), 0);
    for (int r = 0; r < n; r++) memcpy(out + (size_t)r * nc, full + (size_t)r * ne0 + c0, sizeof(float) * (size_t)nc);
    free(full);
    return out;
}

/* y[t][o] = sum_i x[t][i] w[o][i] */
static void mm(const float *x, const float *w, int T, int n_in, int n_out, float *y) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < n_out; o++) {
            double s = 0;
            for (int i = 0; i < n_in; i++) s += (double)x[(size_t)t * n_in + i] * w[(size_t)o * n_in + i];
            y[(size_t)t * n_out + o] = (float)s;
        }
}

static void rmsnorm(const float *x, const mdl_tensor *wt, int T, int E, float eps, float *y) {
    float *w = rows_cols(wt, 0, 1, 0, E);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < E; i++) ss += (double)x[t * E + i] * x[t * E + i];
        float r = (float)(1.0 / sqrt(ss / E + eps));
        for (int i = 0; i < E; i++) y[t * E + i] = x[t * E + i] * r * w[i];
    }
    free(w);
}

static void rope(float *v, int T, int n_heads, int hd, const mdl_config *c) {
    const int rd = c->rope_dim;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *x = v + ((size_t)t * n_heads + h) * hd;
            for (int i = 0; i < rd / 2; i++) {
                double th = t * pow(c->rope_base, -2.0 * i / rd), cs = cos(th), sn = sin(th);
                int a = c->rope_layout == MDL_ROPE_HALF ? i : 2 * i, b = c->rope_layout == MDL_ROPE_HALF ? i + rd / 2 : 2 * i + 1;
                float x0 = x[a], x1 = x[b];
                x[a] = (float)(x0 * cs - x1 * sn);
                x[b] = (float)(x0 * sn + x1 * cs);
            }
        }
}

/* The logits [T][V] of ids computed by n ranks. */
static void forward_tp(const int32_t *ids, int n, float *logits) {
    const mdl_config *c = &m->cfg;
    const int T = T_TOK, E = c->n_embd, hd = c->head_dim, V = c->n_vocab, group = c->n_head / c->n_head_kv;
    ex_tp_shard sh[8];
    char err[256];
    for (int r = 0; r < n; r++) T_CHECKF(ex_tp_plan(c, n, r, &sh[r], err, sizeof err) == 0, "%s", err);
    float *x = calloc((size_t)T * E, sizeof *x), *h = malloc(sizeof(float) * (size_t)T * E);
    float *part = malloc(sizeof(float) * (size_t)T * E);
    /* vocab-parallel embedding: a rank's rows or zeros, summed */
    for (int r = 0; r < n; r++) {
        float *emb = rows_cols(&m->tok_embd, sh[r].vocab0, sh[r].n_vocab, 0, E);
        for (int t = 0; t < T; t++)
            if (ids[t] >= sh[r].vocab0 && ids[t] < sh[r].vocab0 + sh[r].n_vocab)
                for (int i = 0; i < E; i++) x[t * E + i] += emb[(size_t)(ids[t] - sh[r].vocab0) * E + i];
        free(emb);
    }
    for (int l = 0; l < c->n_layer; l++) {
        const mdl_layer *L = &m->layers[l];
        rmsnorm(x, &L->attn_norm, T, E, c->norm_eps, h);
        float *sum = calloc((size_t)T * E, sizeof *sum);
        for (int r = 0; r < n; r++) { /* attention on rank r: its heads, then its columns of wo */
            const int hq = sh[r].n_head, nkv = sh[r].n_kv;
            float *wq = rows_cols(&L->wq, sh[r].head0 * hd, hq * hd, 0, E), *wk = rows_cols(&L->wk, sh[r].kv0 * hd, nkv * hd, 0, E);
            float *wv = rows_cols(&L->wv, sh[r].kv0 * hd, nkv * hd, 0, E);
            float *wo = rows_cols(&L->wo, 0, E, sh[r].head0 * hd, hq * hd);
            float *q = malloc(sizeof(float) * (size_t)T * hq * hd), *k = malloc(sizeof(float) * (size_t)T * nkv * hd);
            float *v = malloc(sizeof(float) * (size_t)T * nkv * hd), *o = calloc((size_t)T * hq * hd, sizeof(float));
            mm(h, wq, T, E, hq * hd, q);
            mm(h, wk, T, E, nkv * hd, k);
            mm(h, wv, T, E, nkv * hd, v);
            rope(q, T, hq, hd, c);
            rope(k, T, nkv, hd, c);
            for (int j = 0; j < hq; j++) {
                int kh = (sh[r].head0 + j) / group - sh[r].kv0; /* the KV head it reads, local */
                T_CHECK(kh >= 0 && kh < nkv);
                for (int t = 0; t < T; t++) {
                    double sc[T_TOK], mx = -1e300, den = 0;
                    for (int u = 0; u <= t; u++) {
                        double d = 0;
                        for (int i = 0; i < hd; i++) d += (double)q[((size_t)t * hq + j) * hd + i] * k[((size_t)u * nkv + kh) * hd + i];
                        sc[u] = d * c->attn_scale;
                        mx = sc[u] > mx ? sc[u] : mx;
                    }
                    for (int u = 0; u <= t; u++) den += (sc[u] = exp(sc[u] - mx));
                    for (int i = 0; i < hd; i++) {
                        double a = 0;
                        for (int u = 0; u <= t; u++) a += sc[u] / den * v[((size_t)u * nkv + kh) * hd + i];
                        o[((size_t)t * hq + j) * hd + i] = (float)a;
                    }
                }
            }
            mm(o, wo, T, hq * hd, E, part);
            for (int i = 0; i < T * E; i++) sum[i] += part[i]; /* the all-reduce */
            free(wq); free(wk); free(wv); free(wo); free(q); free(k); free(v); free(o);
        }
        for (int i = 0; i < T * E; i++) x[i] += sum[i];
        rmsnorm(x, &L->ffn_norm, T, E, c->norm_eps, h);
        memset(sum, 0, sizeof(float) * (size_t)T * E);
        for (int r = 0; r < n; r++) { /* the MLP on rank r: its intermediate rows */
            const int f = sh[r].n_ff;
            float *wg = rows_cols(&L->w_gate, sh[r].ff0, f, 0, E), *wu = rows_cols(&L->w_up, sh[r].ff0, f, 0, E);
            float *wd = rows_cols(&L->w_down, 0, E, sh[r].ff0, f);
            float *g = malloc(sizeof(float) * (size_t)T * f), *u = malloc(sizeof(float) * (size_t)T * f);
            mm(h, wg, T, E, f, g);
            mm(h, wu, T, E, f, u);
            for (int i = 0; i < T * f; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            mm(g, wd, T, f, E, part);
            for (int i = 0; i < T * E; i++) sum[i] += part[i]; /* the all-reduce */
            free(wg); free(wu); free(wd); free(g); free(u);
        }
        for (int i = 0; i < T * E; i++) x[i] += sum[i];
        free(sum);
    }
    rmsnorm(x, &m->out_norm, T, E, c->norm_eps, h);
    for (int r = 0; r < n; r++) { /* vocab-parallel head: each rank's slice, gathered */
        float *wout = rows_cols(&m->output, sh[r].vocab0, sh[r].n_vocab, 0, E), *y = malloc(sizeof(float) * (size_t)T * sh[r].n_vocab);
        mm(h, wout, T, E, sh[r].n_vocab, y);
        for (int t = 0; t < T; t++) memcpy(logits + (size_t)t * V + sh[r].vocab0, y + (size_t)t * sh[r].n_vocab, sizeof(float) * sh[r].n_vocab);
        free(wout);
        free(y);
    }
    free(x); free(h); free(part);
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

/* The engine's CPU logits of every position. */
static int engine_logits(const int32_t *ids, float *out) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 1;
    o.n_ctx = 64;
    o.kv_cache_mb = 4;
    char err[256];
    ex_engine *e;
    if (ex_engine_create(m, &o, &e, err, sizeof err)) { T_CHECKF(0, "%s", err); return -1; }
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    ex_kv_table t;
    ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
    int rc = ex_kv_table_reserve(ex_engine_kv(e), &t, T_TOK);
    const float *lg = NULL;
    if (!rc && ex_batch_buf_add_kv(&bb, ids, T_TOK, 0, &t, 1) < 0) rc = CM_EINVAL;
    if (!rc) rc = ex_engine_forward(e, &bb.b, &lg);
    if (!rc) memcpy(out, lg, sizeof(float) * (size_t)T_TOK * m->cfg.n_vocab);
    ex_kv_table_release(ex_engine_kv(e), &t);
    ex_kv_table_free(&t);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
    return rc;
}

static void test_plan(void) {
    mdl_config c = m->cfg;
    ex_tp_shard sh;
    char err[256];
    T_EQ_INT(ex_tp_plan(&c, 3, 0, &sh, err, sizeof err), CM_EUNSUPPORTED); /* 8 heads over 3 */
    T_CHECK(strstr(err, "query heads") != NULL);
    T_EQ_INT(ex_tp_plan(&c, 2, 2, &sh, err, sizeof err), CM_EINVAL);
    /* 8 query heads over 2 KV heads on 4 ranks: each KV head on the two ranks that read it */
    c.n_head = 8, c.n_head_kv = 2;
    for (int r = 0; r < 4; r++) {
        T_EQ_INT(ex_tp_plan(&c, 4, r, &sh, err, sizeof err), 0);
        T_CHECK(sh.n_head == 2 && sh.head0 == 2 * r && sh.n_kv == 1 && sh.kv0 == r / 2);
    }
    T_EQ_INT(ex_tp_plan(&c, 16, 0, &sh, err, sizeof err), CM_EUNSUPPORTED); /* half a head each */
    c = m->cfg;
    c.n_expert = 8;
    T_EQ_INT(ex_tp_plan(&c, 2, 0, &sh, err, sizeof err), CM_EUNSUPPORTED);
    /* uneven MLP rows: 172 over 8 covers every row once */
    c = m->cfg;
    c.n_head = 8, c.n_head_kv = 8, c.n_ff = 172;
    int next = 0;
    for (int r = 0; r < 8; r++) {
        T_EQ_INT(ex_tp_plan(&c, 8, r, &sh, err, sizeof err), 0);
        T_EQ_INT(sh.ff0, next);
        next += sh.n_ff;
    }
    T_EQ_INT(next, 172);
}

int main(void) {
    char err[256];
    mdl_model *mm_;
    if (mdl_load(T_MODELS "stories260K.gguf", &mm_, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    m = mm_;
    test_plan();
    const int V = m->cfg.n_vocab;
    int32_t ids[T_TOK] = { 1, 403, 407, 261, 378, 435, 300, 66, 322, 299, 401, 8 };
    float *ref = malloc(sizeof(float) * T_TOK * V), *eng = malloc(sizeof(float) * T_TOK * V), *got = malloc(sizeof(float) * T_TOK * V);
    forward_tp(ids, 1, ref);
    T_EQ_INT(engine_logits(ids, eng), 0);
    double e1 = rel_err(ref, eng, (size_t)T_TOK * V);
    int agree = 0;
    for (int t = 0; t < T_TOK; t++) agree += argmax(ref + t * V, V) == argmax(eng + t * V, V);
    printf("one rank vs the engine's cpu backend: rel err %.2e, top-1 %d/%d\n", e1, agree, T_TOK);
    T_CHECKF(e1 < 1e-3 && agree == T_TOK, "the reference forward is not the model's: %.3g, %d/%d", e1, agree, T_TOK);
    for (int n = 2; n <= 4; n *= 2) {
        forward_tp(ids, n, got);
        double e = rel_err(got, ref, (size_t)T_TOK * V);
        agree = 0;
        for (int t = 0; t < T_TOK; t++) agree += argmax(got + t * V, V) == argmax(ref + t * V, V);
        printf("%d ranks vs one: rel err %.2e, top-1 %d/%d\n", n, e, agree, T_TOK);
        T_CHECKF(e < 1e-5 && agree == T_TOK, "%d ranks: rel err %.3g, top-1 %d/%d", n, e, agree, T_TOK);
    }
    free(ref); free(eng); free(got);
    mdl_free(mm_);
    return t_done();
}
