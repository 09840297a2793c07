/* The CPU backend's whole forward pass against an independent double-precision reference
 * written here from the model description, on synthetic models that cover what the real
 * test model (stories260K: adjacent-pair RoPE, no bias, separate output) does not: the
 * half-split RoPE layout with partial rotation, QKV biases, a tied output head, llama3 and
 * linear frequency scaling, F16 weights, GQA. Logits of 20 positions (a prefill of 12 with
 * all logits, then 8 decode steps) must match to a relative L2 error below 1e-5 (F32
 * weights) or 2e-5 (F16 weights, reference on the same half values). */
#include "executor/engine.h"
#include "executor/kv.h"
#include "common/cm_err.h"
#include "model/dtype.h"
#include "model/model.h"
#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { E = 64, H = 4, HKV = 2, HD = 16, F = 96, NV = 50, NL = 2, NPOS = 20 };

static uint64_t rs = 88172645463325252ull;
static double urand(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (double)(rs >> 11) / 9007199254740992.0; }

typedef struct {
    mdl_model m;
    mdl_layer layers[NL];
    void *bufs[64];
    int nb;
} synth;

/* A tensor of ne0 x ne1 random values (scale sd) stored as `type`; its exact values as double
 * go to *ref. */
static void mk_tensor(synth *s, mdl_tensor *t, int type, int64_t ne0, int64_t ne1, double sd, double mean, double **ref) {
    int64_t n = ne0 * ne1;
    float *f = malloc(sizeof(float) * (size_t)n);
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) f[i] = (float)(mean + sd * (urand() * 2 - 1));
    void *data = f;
    if (type == DT_F16) {
        dt_f16 *h = malloc(sizeof(dt_f16) * (size_t)n);
        for (int64_t i = 0; i < n; i++) { h[i] = dt_f32_to_f16(f[i]); f[i] = dt_f16_to_f32(h[i]); }
        data = h;
        s->bufs[s->nb++] = f;
    }
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    s->bufs[s->nb++] = data;
    s->bufs[s->nb++] = d;
    memset(t, 0, sizeof *t);
    t->name = "synthetic";
    t->data = data;
    t->type = type;
    t->n_dims = ne1 > 1 ? 2 : 1;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = t->ne[3] = 1;
    t->nbytes = dt_row_size(type, ne0) * (uint64_t)ne1;
    *ref = d;
}

typedef struct {
    double *embd, *out_norm, *output;
    double *attn_norm[NL], *wq[NL], *wk[NL], *wv[NL], *wo[NL], *bq[NL], *bk[NL], *bv[NL], *ffn_norm[NL], *wg[NL], *wu[NL], *wd[NL];
} refw;

static void build(synth *s, refw *r, const mdl_config *c, int wtype) {
    memset(s, 0, sizeof *s);
    s->m.cfg = *c;
    s->m.layers = s->layers;
    mk_tensor(s, &s->m.tok_embd, wtype, E, NV, 1.0, 0, &r->embd);
    mk_tensor(s, &s->m.out_norm, DT_F32, E, 1, 0.2, 1.0, &r->out_norm);
    if (c->tied_output) { s->m.output = s->m.tok_embd; r->output = r->embd; }
    else mk_tensor(s, &s->m.output, wtype, E, NV, 0.3, 0, &r->output);
    for (int l = 0; l < NL; l++) {
        mdl_layer *y = &s->layers[l];
        double sc = 1.0 / sqrt(E);
        mk_tensor(s, &y->attn_norm, DT_F32, E, 1, 0.2, 1.0, &r->attn_norm[l]);
        mk_tensor(s, &y->wq, wtype, E, H * HD, 2 * sc, 0, &r->wq[l]);
        mk_tensor(s, &y->wk, wtype, E, HKV * HD, 2 * sc, 0, &r->wk[l]);
        mk_tensor(s, &y->wv, wtype, E, HKV * HD, 2 * sc, 0, &r->wv[l]);
        mk_tensor(s, &y->wo, wtype, H * HD, E, sc, 0, &r->wo[l]);
        if (c->has_qkv_bias) {
            mk_tensor(s, &y->bq, DT_F32, H * HD, 1, 0.5, 0, &r->bq[l]);
            mk_tensor(s, &y->bk, DT_F32, HKV * HD, 1, 0.5, 0, &r->bk[l]);
            mk_tensor(s, &y->bv, DT_F32, HKV * HD, 1, 0.5, 0, &r->bv[l]);
        } else r->bq[l] = r->bk[l] = r->bv[l] = NULL;
        mk_tensor(s, &y->ffn_norm, DT_F32, E, 1, 0.2, 1.0, &r->ffn_norm[l]);
        mk_tensor(s, &y->w_gate, wtype, E, F, 2 * sc, 0, &r->wg[l]);
        mk_tensor(s, &y->w_up, wtype, E, F, 2 * sc, 0, &r->wu[l]);
        mk_tensor(s, &y->w_down, wtype, F, E, 1.0 / sqrt(F), 0, &r->wd[l]);
    }
}

static void matvec(const double *W, const double *x, int n_in, int n_out, double *y) {
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++) s += W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

static void rmsnorm(const double *x, const double *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* Rotation of one head vector, written from the conventions: HF (half) pairs (i, i+d/2),
 * GGUF llama (adjacent) pairs (2i, 2i+1); frequencies theta^(-2i/d) with the scaling rules. */
static void rope(const mdl_config *c, double *v, int pos) {
    int d = c->rope_dim;
    for (int i = 0; i < d / 2; i++) {
        double f = pow(c->rope_base, -2.0 * i / d);
        if (c->rope_scaling == MDL_ROPE_SCALING_LINEAR) f /= c->rope_factor;
        else if (c->rope_scaling == MDL_ROPE_SCALING_LLAMA3) {
            double wl = 2 * M_PI / f;
            double lo_wl = c->rope_orig_ctx / c->rope_low_freq_factor, hi_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
            if (wl > lo_wl) f /= c->rope_factor;
            else if (wl >= hi_wl) {
                double smooth = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        int a = c->rope_layout == MDL_ROPE_HALF ? i : 2 * i, b = c->rope_layout == MDL_ROPE_HALF ? i + d / 2 : 2 * i + 1;
        double cs = cos(pos * f), sn = sin(pos * f), x0 = v[a], x1 = v[b];
        v[a] = x0 * cs - x1 * sn;
        v[b] = x0 * sn + x1 * cs;
    }
}

/* logits [NPOS, NV] of ids, one position at a time */
static void ref_forward(const mdl_config *c, const refw *r, const int32_t *ids, double *logits) {
    static double K[NL][NPOS][HKV * HD], Vv[NL][NPOS][HKV * HD];
    double x[E], xn[E], q[H * HD], k[HKV * HD], v[HKV * HD], att[H * HD], o[E], g[F], u[F];
    for (int p = 0; p < NPOS; p++) {
        for (int i = 0; i < E; i++) x[i] = r->embd[(size_t)ids[p] * E + i];
        for (int l = 0; l < NL; l++) {
            rmsnorm(x, r->attn_norm[l], E, c->norm_eps, xn);
            matvec(r->wq[l], xn, E, H * HD, q);
            matvec(r->wk[l], xn, E, HKV * HD, k);
            matvec(r->wv[l], xn, E, HKV * HD, v);
            if (r->bq[l]) {
                for (int i = 0; i < H * HD; i++) q[i] += r->bq[l][i];
                for (int i = 0; i < HKV * HD; i++) { k[i] += r->bk[l][i]; v[i] += r->bv[l][i]; }
            }
            for (int h = 0; h < H; h++) rope(c, q + h * HD, p);
            for (int h = 0; h < HKV; h++) rope(c, k + h * HD, p);
            memcpy(K[l][p], k, sizeof k);
            memcpy(Vv[l][p], v, sizeof v);
            for (int h = 0; h < H; h++) {
                int kh = h / (H / HKV);
                double sc[NPOS], mx = -1e300, sum = 0;
                for (int j = 0; j <= p; j++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += q[h * HD + i] * K[l][j][kh * HD + i];
                    sc[j] = d / sqrt((double)HD);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int j = 0; j <= p; j++) a += sc[j] * Vv[l][j][kh * HD + i];
                    att[h * HD + i] = a / sum;
                }
            }
            matvec(r->wo[l], att, H * HD, E, o);
            for (int i = 0; i < E; i++) x[i] += o[i];
            rmsnorm(x, r->ffn_norm[l], E, c->norm_eps, xn);
            matvec(r->wg[l], xn, E, F, g);
            matvec(r->wu[l], xn, E, F, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            matvec(r->wd[l], g, F, E, o);
            for (int i = 0; i < E; i++) x[i] += o[i];
        }
        rmsnorm(x, r->out_norm, E, c->norm_eps, xn);
        matvec(r->output, xn, E, NV, logits + (size_t)p * NV);
    }
}

static void run_case(const char *name, const mdl_config *c, int wtype, double tol) {
    synth s;
    refw r;
    build(&s, &r, c, wtype);
    int32_t ids[NPOS];
    for (int i = 0; i < NPOS; i++) ids[i] = (int32_t)(urand() * NV);
    double *ref = malloc(sizeof(double) * NPOS * NV);
    ref_forward(c, &r, ids, ref);

    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 2;
    o.n_ctx = 64;
    o.block_size = 4; /* several blocks per sequence */
    o.kv_blocks = 32;
    o.max_tokens = 16;
    o.max_seqs = 2;
    o.max_out = 16;
    ex_engine *e;
    char err[256];
    int rc = ex_engine_create(&s.m, &o, &e, err, sizeof err);
    T_CHECKF(rc == 0, "%s: %s", name, err);
    float *got = malloc(sizeof(float) * NPOS * NV);
    for (int i = 0; i < NPOS * NV; i++) got[i] = NAN;
    if (!rc) {
        ex_kv_table t;
        ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
        ex_batch_buf bb;
        ex_batch_buf_init(&bb, ex_engine_limits(e));
        const float *lg;
        ex_kv_table_reserve(ex_engine_kv(e), &t, 12);
        ex_batch_buf_add(&bb, ids, 12, 0, t.blocks, t.n, 1);
        T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
        memcpy(got, lg, sizeof(float) * 12 * NV);
        for (int p = 12; p < NPOS; p++) {
            ex_kv_table_reserve(ex_engine_kv(e), &t, p + 1);
            ex_batch_buf_clear(&bb);
            ex_batch_buf_add(&bb, ids + p, 1, p, t.blocks, t.n, 0);
            T_EQ_INT(ex_engine_forward(e, &bb.b, &lg), 0);
            memcpy(got + (size_t)p * NV, lg, sizeof(float) * NV);
        }
        ex_kv_table_release(ex_engine_kv(e), &t);
        ex_kv_table_free(&t);
        ex_batch_buf_free(&bb);
        ex_engine_destroy(e);
    }
    double worst = 0;
    for (int p = 0; p < NPOS; p++) {
        double num = 0, den = 0;
        for (int i = 0; i < NV; i++) {
            double d = got[(size_t)p * NV + i] - ref[(size_t)p * NV + i];
            num += d * d;
            den += ref[(size_t)p * NV + i] * ref[(size_t)p * NV + i];
        }
        double rel = sqrt(num / den);
        if (!(rel <= worst)) worst = isnan(rel) ? INFINITY : rel;
    }
    printf("%s: max relative L2 error of logits over %d positions %.2e (bound %.0e)\n", name, NPOS, worst, tol);
    T_CHECKF(worst < tol, "%s: %g", name, worst);
    free(ref);
    free(got);
    for (int i = 0; i < s.nb; i++) free(s.bufs[i]);
}

int main(void) {
    mdl_config c;
    memset(&c, 0, sizeof c);
    c.n_vocab = NV; c.n_embd = E; c.n_layer = NL; c.n_head = H; c.n_head_kv = HKV; c.head_dim = HD; c.n_ff = F;
    c.n_ctx_train = 64; c.norm_eps = 1e-6f; c.rope_base = 10000.0f; c.rope_factor = 1.0f;
    c.rope_low_freq_factor = 1.0f; c.rope_high_freq_factor = 4.0f; c.rope_orig_ctx = 16;

    /* qwen2-like: half-split rope over 8 of 16 dims, biases, tied output, llama3 scaling
     * (orig ctx 16 so that all three frequency bands occur) */
    mdl_config a = c;
    a.arch = MDL_ARCH_QWEN2; a.rope_layout = MDL_ROPE_HALF; a.rope_dim = 8; a.has_qkv_bias = 1; a.tied_output = 1;
    a.rope_scaling = MDL_ROPE_SCALING_LLAMA3; a.rope_factor = 8.0f; a.rope_base = 1000.0f;
    run_case("half rope, partial, qkv bias, tied, llama3 scaling, F32", &a, DT_F32, 1e-5);
    /* llama-like: adjacent pairs over the whole head, linear scaling, F16 weights */
    mdl_config b = c;
    b.arch = MDL_ARCH_LLAMA; b.rope_layout = MDL_ROPE_ADJACENT; b.rope_dim = HD;
    b.rope_scaling = MDL_ROPE_SCALING_LINEAR; b.rope_factor = 2.0f;
    run_case("adjacent rope, linear scaling, separate output, F16", &b, DT_F16, 2e-5);
    b.rope_scaling = MDL_ROPE_SCALING_NONE;
    run_case("adjacent rope, no scaling, F32", &b, DT_F32, 1e-5);
    return t_done();
}
