/* Every new architecture end to end on the CPU backend: a small random model is written here
 * twice, as a Hugging Face directory (config.json in transformers 4.x or 5.x style +
 * model.safetensors with HF's tensor names and conventions: unpermuted Q/K, gemma's (1 + w)
 * norms stored as w, per-expert or fused experts) and as a GGUF file with llama.cpp's names
 * and keys (Q/K permuted for llama-arch files, gemma norms stored as 1 + w, 3-D expert
 * tensors, phi3's fused tensors); both are loaded through mdl_load and run through the
 * engine (a 12-token prefill with every position's logits, then 8 decode steps, blocks of 4
 * tokens so sliding windows free blocks), and the 20 positions' logits are compared with a
 * double-precision reference written here from transformers' modeling code: relative L2
 * error below 1e-4 per position (F32 weights; 2e-4 for the BF16 file).
 *
 * The models cover: head_dim apart from hidden/heads, GQA, QK-norm, yarn (qwen3); MoE with
 * top-2 of 4, unnormalised weights, a dense layer among sparse ones, a routing tie between
 * two identical experts, per-expert and transformers-5 fused expert tensors (qwen3moe);
 * mixtral's names as GGUF "llama" with experts; gemma2's soft-caps, alternating 4-token
 * windows, query_pre_attn_scalar, GeGLU and post-norms; gemma3's per-layer-type rope
 * (linear-scaled global layers, local base for the sliding ones), five sliding layers of six;
 * phi3's fused QKV and gate|up, partial rotary, longrope and an all-sliding window.
 * Then the loaders' refusals, each naming the setting. */
#include "common/cm_err.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/sched.h"
#include "model/dtype.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "t.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { NPOS = 20, NPRE = 12, MAXL = 8 };

/* ---- the reference model ----------------------------------------------------------------------- */

typedef struct {
    double *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *qn, *kn, *post_attn, *ffn_norm, *post_ffn;
    double *gate, *up, *down;         /* dense: [F][E], [F][E], [E][F] */
    double *router;                   /* [NE][E] */
    double *eg[8], *eu[8], *ed[8];    /* experts */
    int sparse, swa;
} rlayer;

typedef struct {
    const char *name;
    int arch;                         /* enum mdl_arch */
    int E, L, H, HKV, D, F, V, NE, K, FE, rope_dim;
    int qk_norm, post_norms, gelu, bias, tied, norm_topk;
    double eps, embd_scale, attn_scale, cap_attn, cap_final;
    int window;
    int rope_scaling;                 /* enum mdl_rope_scaling */
    double theta, theta_swa, factor, lowf, highf, beta_fast, beta_slow, attn_factor;
    int orig, swa_own, n_ctx;
    double long_f[8], short_f[8];
    double *embd, *out_norm, *output;
    rlayer ly[MAXL];
} rmodel;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static void *allocs[4096]; /* every reference array, freed at the end */
static int n_allocs;

static double *mk(int n, double sd, double mean) {
    double *p = malloc(sizeof(double) * (size_t)n);
    allocs[n_allocs++] = p;
    for (int i = 0; i < n; i++) p[i] = (double)(float)(mean + sd * urand());
    return p;
}

static void build(rmodel *m) {
    int E = m->E, QD = m->H * m->D, KD = m->HKV * m->D;
    m->embd = mk(m->V * E, 1.0, 0);
    m->out_norm = mk(E, 0.2, 1.0);
    m->output = m->tied ? m->embd : mk(m->V * E, 0.3, 0);
    for (int l = 0; l < m->L; l++) {
        rlayer *y = &m->ly[l];
        double sc = 1.0 / sqrt(E);
        y->attn_norm = mk(E, 0.2, 1.0);
        y->wq = mk(QD * E, 2 * sc, 0);
        y->wk = mk(KD * E, 2 * sc, 0);
        y->wv = mk(KD * E, 2 * sc, 0);
        y->wo = mk(E * QD, 1.0 / sqrt(QD), 0);
        if (m->bias) { y->bq = mk(QD, 0.5, 0); y->bk = mk(KD, 0.5, 0); y->bv = mk(KD, 0.5, 0); }
        if (m->qk_norm) { y->qn = mk(m->D, 0.2, 1.0); y->kn = mk(m->D, 0.2, 1.0); }
        if (m->post_norms) { y->post_attn = mk(E, 0.2, 1.0); y->post_ffn = mk(E, 0.2, 1.0); }
        y->ffn_norm = mk(E, 0.2, 1.0);
        if (y->sparse) {
            y->router = mk(m->NE * E, 1.0, 0);
            for (int e = 0; e < m->NE; e++) {
                y->eg[e] = mk(m->FE * E, 2 * sc, 0);
                y->eu[e] = mk(m->FE * E, 2 * sc, 0);
                y->ed[e] = mk(E * m->FE, 1.0 / sqrt(m->FE), 0);
            }
            /* routing tie: expert 1 is expert 0 (router row and weights), so whichever of the two
             * a tie picks, the layer computes the same */
            memcpy(y->router + E, y->router, sizeof(double) * (size_t)E);
            memcpy(y->eg[1], y->eg[0], sizeof(double) * (size_t)(m->FE * E));
            memcpy(y->eu[1], y->eu[0], sizeof(double) * (size_t)(m->FE * E));
            memcpy(y->ed[1], y->ed[0], sizeof(double) * (size_t)(E * m->FE));
        } else {
            y->gate = mk(m->F * E, 2 * sc, 0);
            y->up = mk(m->F * E, 2 * sc, 0);
            y->down = mk(E * m->F, 1.0 / sqrt(m->F), 0);
        }
    }
}

/* Rounds every weight to bfloat16 (the file stores them so). */
static void round_bf16(double *p, int n) {
    for (int i = 0; i < n; i++) p[i] = dt_bf16_to_f32(dt_f32_to_bf16((float)p[i]));
}

static void to_bf16(rmodel *m) {
    int E = m->E, QD = m->H * m->D, KD = m->HKV * m->D;
    round_bf16(m->embd, m->V * E);
    if (!m->tied) round_bf16(m->output, m->V * E);
    round_bf16(m->out_norm, E);
    for (int l = 0; l < m->L; l++) {
        rlayer *y = &m->ly[l];
        round_bf16(y->attn_norm, E); round_bf16(y->ffn_norm, E);
        round_bf16(y->wq, QD * E); round_bf16(y->wk, KD * E); round_bf16(y->wv, KD * E); round_bf16(y->wo, E * QD);
        if (y->qn) { round_bf16(y->qn, m->D); round_bf16(y->kn, m->D); }
        if (y->gate) { round_bf16(y->gate, m->F * E); round_bf16(y->up, m->F * E); round_bf16(y->down, E * m->F); }
    }
}

static void matvec(const double *W, const double *x, int n_in, int n_out, double *y) {
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++) s += W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

static void rms(const double *x, const double *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* transformers' inverse frequencies for one layer kind */
static void inv_freq(const rmodel *m, int swa, double *f) {
    int d = m->rope_dim;
    double base = swa && m->swa_own ? m->theta_swa : m->theta;
    int scaling = swa && m->swa_own ? MDL_ROPE_SCALING_NONE : m->rope_scaling;
    for (int i = 0; i < d / 2; i++) {
        double b = pow(base, 2.0 * i / d);
        f[i] = 1.0 / b;
        if (scaling == MDL_ROPE_SCALING_LINEAR) f[i] /= m->factor;
        if (scaling == MDL_ROPE_SCALING_LONGROPE) f[i] = 1.0 / ((m->n_ctx > m->orig ? m->long_f[i] : m->short_f[i]) * b);
        if (scaling == MDL_ROPE_SCALING_YARN) {
            double lo = floor(d * log(m->orig / (m->beta_fast * 2 * M_PI)) / (2 * log(base)));
            double hi = ceil(d * log(m->orig / (m->beta_slow * 2 * M_PI)) / (2 * log(base)));
            lo = lo < 0 ? 0 : lo;
            hi = hi > d - 1 ? d - 1 : hi;
            if (lo == hi) hi += 0.001;
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double ef = 1 - ramp;
            f[i] = (1.0 / (m->factor * b)) * (1 - ef) + (1.0 / b) * ef;
        }
    }
}

/* HF's rotate_half on the first rope_dim dimensions, cos/sin scaled by the attention factor */
static void rope(const rmodel *m, int swa, double *v, int pos) {
    double f[64];
    inv_freq(m, swa, f);
    double af = swa && m->swa_own ? 1.0 : m->attn_factor;
    int half = m->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double c = cos(pos * f[i]) * af, s = sin(pos * f[i]) * af, a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

static double act(const rmodel *m, double g) {
    if (m->gelu) return 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
    return g / (1 + exp(-g));
}

/* logits [NPOS][V] of ids; the final-normed hidden states [NPOS][E] too when hidden is not NULL */
static void ref_forward_h(const rmodel *m, const int32_t *ids, double *logits, double *hidden) {
    const int E = m->E, H = m->H, HKV = m->HKV, D = m->D, QD = H * D, KD = HKV * D;
    static double K[MAXL][NPOS][64], Vv[MAXL][NPOS][64];
    double x[64], xn[64], q[64], k[64], v[64], att[64], o[64], g[96], u[96], mo[64], eo[64], h[64];
    for (int p = 0; p < NPOS; p++) {
        for (int i = 0; i < E; i++) x[i] = m->embd[(size_t)ids[p] * E + i] * m->embd_scale;
        for (int l = 0; l < m->L; l++) {
            const rlayer *y = &m->ly[l];
            rms(x, y->attn_norm, E, m->eps, xn);
            matvec(y->wq, xn, E, QD, q);
            matvec(y->wk, xn, E, KD, k);
            matvec(y->wv, xn, E, KD, v);
            if (y->bq) {
                for (int i = 0; i < QD; i++) q[i] += y->bq[i];
                for (int i = 0; i < KD; i++) { k[i] += y->bk[i]; v[i] += y->bv[i]; }
            }
            if (y->qn) {
                for (int hh = 0; hh < H; hh++) rms(q + hh * D, y->qn, D, m->eps, q + hh * D);
                for (int hh = 0; hh < HKV; hh++) rms(k + hh * D, y->kn, D, m->eps, k + hh * D);
            }
            for (int hh = 0; hh < H; hh++) rope(m, y->swa, q + hh * D, p);
            for (int hh = 0; hh < HKV; hh++) rope(m, y->swa, k + hh * D, p);
            memcpy(K[l][p], k, sizeof(double) * KD);
            memcpy(Vv[l][p], v, sizeof(double) * KD);
            int start = y->swa && p - m->window + 1 > 0 ? p - m->window + 1 : 0;
            for (int hh = 0; hh < H; hh++) {
                int kh = hh / (H / HKV);
                double sc[NPOS], mx = -1e300, sum = 0;
                for (int j = start; j <= p; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++) s += q[hh * D + d] * K[l][j][kh * D + d];
                    s *= m->attn_scale;
                    if (m->cap_attn > 0) s = m->cap_attn * tanh(s / m->cap_attn);
                    sc[j] = s;
                    if (s > mx) mx = s;
                }
                for (int j = start; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                for (int d = 0; d < D; d++) {
                    double a = 0;
                    for (int j = start; j <= p; j++) a += sc[j] / sum * Vv[l][j][kh * D + d];
                    att[hh * D + d] = a;
                }
            }
            matvec(y->wo, att, QD, E, o);
            if (y->post_attn) rms(o, y->post_attn, E, m->eps, o);
            for (int i = 0; i < E; i++) x[i] += o[i];
            rms(x, y->ffn_norm, E, m->eps, xn);
            if (y->sparse) {
                double lg[8], pr[8], mx = -1e300, sum = 0;
                matvec(y->router, xn, E, m->NE, lg);
                for (int e = 0; e < m->NE; e++) if (lg[e] > mx) mx = lg[e];
                for (int e = 0; e < m->NE; e++) { pr[e] = exp(lg[e] - mx); sum += pr[e]; }
                for (int e = 0; e < m->NE; e++) pr[e] /= sum;
                int sel[8] = { 0 }, chosen[8];
                double wsum = 0, w[8];
                for (int j = 0; j < m->K; j++) {
                    int best = -1;
                    for (int e = 0; e < m->NE; e++) if (!sel[e] && (best < 0 || pr[e] > pr[best])) best = e;
                    sel[best] = 1;
                    chosen[j] = best;
                    w[j] = pr[best];
                    wsum += pr[best];
                }
                for (int i = 0; i < E; i++) mo[i] = 0;
                for (int e = 0; e < m->NE; e++) { /* ascending expert order, as transformers */
                    int j = -1;
                    for (int jj = 0; jj < m->K; jj++) if (chosen[jj] == e) j = jj;
                    if (j < 0) continue;
                    double wt = m->norm_topk ? w[j] / wsum : w[j];
                    matvec(y->eg[e], xn, E, m->FE, g);
                    matvec(y->eu[e], xn, E, m->FE, u);
                    for (int i = 0; i < m->FE; i++) h[i] = act(m, g[i]) * u[i];
                    matvec(y->ed[e], h, m->FE, E, eo);
                    for (int i = 0; i < E; i++) mo[i] += wt * eo[i];
                }
            } else {
                matvec(y->gate, xn, E, m->F, g);
                matvec(y->up, xn, E, m->F, u);
                double hh2[96];
                for (int i = 0; i < m->F; i++) hh2[i] = act(m, g[i]) * u[i];
                matvec(y->down, hh2, m->F, E, mo);
            }
            if (y->post_ffn) rms(mo, y->post_ffn, E, m->eps, mo);
            for (int i = 0; i < E; i++) x[i] += mo[i];
        }
        rms(x, m->out_norm, E, m->eps, xn);
        if (hidden) memcpy(hidden + (size_t)p * E, xn, sizeof(double) * (size_t)E);
        double *lg = logits + (size_t)p * m->V;
        matvec(m->output, xn, E, m->V, lg);
        if (m->cap_final > 0)
            for (int i = 0; i < m->V; i++) lg[i] = m->cap_final * tanh(lg[i] / m->cap_final);
    }
}

static void ref_forward(const rmodel *m, const int32_t *ids, double *logits) { ref_forward_h(m, ids, logits, NULL); }

/* ---- files ------------------------------------------------------------------------------------ */

typedef struct {
    char name[96];
    const char *dtype;
    int rank;
    int64_t shape[3];
    void *data;
    size_t nbytes;
} st_t;

static st_t sts[1024];
static int n_sts;

/* Adds a tensor of doubles in the given dtype (F32 / BF16), shape row-major. plus: added to
 * every value (gemma's stored w = effective - 1 uses -1). */
static void st_add(const char *name, const char *dtype, int rank, int64_t d0, int64_t d1, int64_t d2, const double *v, double plus) {
    st_t *t = &sts[n_sts++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->rank = rank;
    t->shape[0] = d0; t->shape[1] = d1; t->shape[2] = d2;
    int64_t n = d0 * (rank > 1 ? d1 : 1) * (rank > 2 ? d2 : 1);
    int bf = !strcmp(dtype, "BF16");
    t->nbytes = (size_t)n * (bf ? 2 : 4);
    t->data = malloc(t->nbytes);
    for (int64_t i = 0; i < n; i++) {
        float f = (float)(v[i] + plus);
        if (bf) ((uint16_t *)t->data)[i] = dt_f32_to_bf16(f);
        else ((float *)t->data)[i] = f;
    }
}

static void st_write(const char *path) {
    char *h = malloc(1 << 20);
    size_t at = 0, off = 0;
    at += (size_t)sprintf(h + at, "{");
    for (int i = 0; i < n_sts; i++) {
        st_t *t = &sts[i];
        at += (size_t)sprintf(h + at, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name, t->dtype);
        for (int d = 0; d < t->rank; d++) at += (size_t)sprintf(h + at, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        at += (size_t)sprintf(h + at, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    at += (size_t)sprintf(h + at, "}");
    while (at % 8) h[at++] = ' '; /* as the reference writer pads, so the data stays aligned */
    FILE *f = fopen(path, "wb");
    uint64_t hl = at;
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, at, f);
    for (int i = 0; i < n_sts; i++) fwrite(sts[i].data, 1, sts[i].nbytes, f);
    fclose(f);
    for (int i = 0; i < n_sts; i++) free(sts[i].data);
    n_sts = 0;
    free(h);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Where the language model's tensors are: "model." for a causal LM; a vision + text gemma3
 * checkpoint of transformers 4.x has them under "language_model.model." */
static const char *hf_prefix = "model.";

/* The HF directory: tensors with HF names (per_expert: one tensor per expert, else
 * transformers 5's fused experts). */
static void write_hf(const rmodel *m, const char *dir, const char *config, const char *dtype, int per_expert) {
    char p[512], nm[128];
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, config);
    const int E = m->E, QD = m->H * m->D, KD = m->HKV * m->D;
    const int gemma = m->arch == MDL_ARCH_GEMMA2 || m->arch == MDL_ARCH_GEMMA3, phi3 = m->arch == MDL_ARCH_PHI3;
    const int mix = m->arch == MDL_ARCH_MIXTRAL;
    const double nplus = gemma ? -1.0 : 0.0;
    snprintf(nm, sizeof nm, "%sembed_tokens.weight", hf_prefix);
    st_add(nm, dtype, 2, m->V, E, 0, m->embd, 0);
    snprintf(nm, sizeof nm, "%snorm.weight", hf_prefix);
    st_add(nm, dtype, 1, E, 0, 0, m->out_norm, nplus);
    if (!m->tied) st_add("lm_head.weight", dtype, 2, m->V, E, 0, m->output, 0);
    for (int l = 0; l < m->L; l++) {
        const rlayer *y = &m->ly[l];
#define ADD(suffix, rank, a, b, c, v, plus) (snprintf(nm, sizeof nm, "%slayers.%d.%s", hf_prefix, l, suffix), st_add(nm, dtype, rank, a, b, c, v, plus))
        ADD("input_layernorm.weight", 1, E, 0, 0, y->attn_norm, nplus);
        if (phi3) {
            double *qkv = malloc(sizeof(double) * (size_t)((QD + 2 * KD) * E));
            memcpy(qkv, y->wq, sizeof(double) * (size_t)(QD * E));
            memcpy(qkv + QD * E, y->wk, sizeof(double) * (size_t)(KD * E));
            memcpy(qkv + (QD + KD) * E, y->wv, sizeof(double) * (size_t)(KD * E));
            ADD("self_attn.qkv_proj.weight", 2, QD + 2 * KD, E, 0, qkv, 0);
            free(qkv);
        } else {
            ADD("self_attn.q_proj.weight", 2, QD, E, 0, y->wq, 0);
            ADD("self_attn.k_proj.weight", 2, KD, E, 0, y->wk, 0);
            ADD("self_attn.v_proj.weight", 2, KD, E, 0, y->wv, 0);
        }
        if (y->bq) {
            ADD("self_attn.q_proj.bias", 1, QD, 0, 0, y->bq, 0);
            ADD("self_attn.k_proj.bias", 1, KD, 0, 0, y->bk, 0);
            ADD("self_attn.v_proj.bias", 1, KD, 0, 0, y->bv, 0);
        }
        ADD("self_attn.o_proj.weight", 2, E, QD, 0, y->wo, 0);
        if (y->qn) {
            ADD("self_attn.q_norm.weight", 1, m->D, 0, 0, y->qn, nplus);
            ADD("self_attn.k_norm.weight", 1, m->D, 0, 0, y->kn, nplus);
        }
        if (gemma) {
            ADD("post_attention_layernorm.weight", 1, E, 0, 0, y->post_attn, nplus);
            ADD("pre_feedforward_layernorm.weight", 1, E, 0, 0, y->ffn_norm, nplus);
            ADD("post_feedforward_layernorm.weight", 1, E, 0, 0, y->post_ffn, nplus);
        } else {
            ADD("post_attention_layernorm.weight", 1, E, 0, 0, y->ffn_norm, 0);
        }
        if (y->sparse) {
            ADD(mix && per_expert ? "block_sparse_moe.gate.weight" : "mlp.gate.weight", 2, m->NE, E, 0, y->router, 0);
            if (per_expert) {
                for (int e = 0; e < m->NE; e++) {
                    char s[96];
                    snprintf(s, sizeof s, mix ? "block_sparse_moe.experts.%d.w1.weight" : "mlp.experts.%d.gate_proj.weight", e);
                    ADD(s, 2, m->FE, E, 0, y->eg[e], 0);
                    snprintf(s, sizeof s, mix ? "block_sparse_moe.experts.%d.w3.weight" : "mlp.experts.%d.up_proj.weight", e);
                    ADD(s, 2, m->FE, E, 0, y->eu[e], 0);
                    snprintf(s, sizeof s, mix ? "block_sparse_moe.experts.%d.w2.weight" : "mlp.experts.%d.down_proj.weight", e);
                    ADD(s, 2, E, m->FE, 0, y->ed[e], 0);
                }
            } else {
                double *gu = malloc(sizeof(double) * (size_t)(m->NE * 2 * m->FE * E)), *dn = malloc(sizeof(double) * (size_t)(m->NE * E * m->FE));
                for (int e = 0; e < m->NE; e++) {
                    memcpy(gu + (size_t)e * 2 * m->FE * E, y->eg[e], sizeof(double) * (size_t)(m->FE * E));
                    memcpy(gu + (size_t)e * 2 * m->FE * E + m->FE * E, y->eu[e], sizeof(double) * (size_t)(m->FE * E));
                    memcpy(dn + (size_t)e * E * m->FE, y->ed[e], sizeof(double) * (size_t)(E * m->FE));
                }
                ADD("mlp.experts.gate_up_proj", 3, m->NE, 2 * m->FE, E, gu, 0);
                ADD("mlp.experts.down_proj", 3, m->NE, E, m->FE, dn, 0);
                free(gu);
                free(dn);
            }
        } else if (phi3) {
            double *gu = malloc(sizeof(double) * (size_t)(2 * m->F * E));
            memcpy(gu, y->gate, sizeof(double) * (size_t)(m->F * E));
            memcpy(gu + m->F * E, y->up, sizeof(double) * (size_t)(m->F * E));
            ADD("mlp.gate_up_proj.weight", 2, 2 * m->F, E, 0, gu, 0);
            free(gu);
            ADD("mlp.down_proj.weight", 2, E, m->F, 0, y->down, 0);
        } else {
            ADD("mlp.gate_proj.weight", 2, m->F, E, 0, y->gate, 0);
            ADD("mlp.up_proj.weight", 2, m->F, E, 0, y->up, 0);
            ADD("mlp.down_proj.weight", 2, E, m->F, 0, y->down, 0);
        }
#undef ADD
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_write(p);
}

/* GGUF with llama.cpp's names: tensors go through a list, then the writer. */
typedef struct { char name[64]; int n_dims; int64_t ne[3]; float *data; } gt;
static gt gts[1024];
static int n_gts;

static void g_add(const char *name, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2, const double *v, double plus) {
    gt *t = &gts[n_gts++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0; t->ne[1] = ne1; t->ne[2] = ne2;
    int64_t n = ne0 * ne1 * ne2;
    t->data = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) t->data[i] = (float)(v[i] + plus);
}

/* llama-arch files store Q/K rows permuted for adjacent-pair RoPE */
static void g_add_perm(const char *name, const double *w, int n_head, int hd, int n_in) {
    int rows = n_head * hd;
    float *src = calloc((size_t)(rows * n_in), sizeof(float)), *dst = calloc((size_t)(rows * n_in), sizeof(float));
    for (int i = 0; i < rows * n_in; i++) src[i] = (float)w[i];
    mdl_permute_qk_hf_to_gguf(src, dst, n_head, hd, n_in);
    double *d = malloc(sizeof(double) * (size_t)(rows * n_in));
    for (int i = 0; i < rows * n_in; i++) d[i] = dst[i];
    g_add(name, 2, n_in, rows, 1, d, 0);
    free(src); free(dst); free(d);
}

static int write_gguf(const rmodel *m, const char *path, gguf_writer *w) {
    const int E = m->E, QD = m->H * m->D, KD = m->HKV * m->D;
    const int phi3 = m->arch == MDL_ARCH_PHI3, llama = m->arch == MDL_ARCH_MIXTRAL;
    char nm[96];
    g_add("token_embd.weight", 2, E, m->V, 1, m->embd, 0);
    g_add("output_norm.weight", 1, E, 1, 1, m->out_norm, 0);
    if (!m->tied) g_add("output.weight", 2, E, m->V, 1, m->output, 0);
    if (m->rope_scaling == MDL_ROPE_SCALING_LONGROPE) {
        g_add("rope_factors_long.weight", 1, m->rope_dim / 2, 1, 1, m->long_f, 0);
        g_add("rope_factors_short.weight", 1, m->rope_dim / 2, 1, 1, m->short_f, 0);
    }
    for (int l = 0; l < m->L; l++) {
        const rlayer *y = &m->ly[l];
#define G(suffix, nd, a, b, c, v) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), g_add(nm, nd, a, b, c, v, 0))
        G("attn_norm.weight", 1, E, 1, 1, y->attn_norm);
        if (phi3) {
            double *qkv = malloc(sizeof(double) * (size_t)((QD + 2 * KD) * E));
            memcpy(qkv, y->wq, sizeof(double) * (size_t)(QD * E));
            memcpy(qkv + QD * E, y->wk, sizeof(double) * (size_t)(KD * E));
            memcpy(qkv + (QD + KD) * E, y->wv, sizeof(double) * (size_t)(KD * E));
            G("attn_qkv.weight", 2, E, QD + 2 * KD, 1, qkv);
            free(qkv);
        } else if (llama) {
            snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
            g_add_perm(nm, y->wq, m->H, m->D, E);
            snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", l);
            g_add_perm(nm, y->wk, m->HKV, m->D, E);
            G("attn_v.weight", 2, E, KD, 1, y->wv);
        } else {
            G("attn_q.weight", 2, E, QD, 1, y->wq);
            G("attn_k.weight", 2, E, KD, 1, y->wk);
            G("attn_v.weight", 2, E, KD, 1, y->wv);
        }
        G("attn_output.weight", 2, QD, E, 1, y->wo);
        if (y->qn) { G("attn_q_norm.weight", 1, m->D, 1, 1, y->qn); G("attn_k_norm.weight", 1, m->D, 1, 1, y->kn); }
        if (y->post_attn) { G("post_attention_norm.weight", 1, E, 1, 1, y->post_attn); G("post_ffw_norm.weight", 1, E, 1, 1, y->post_ffn); }
        G("ffn_norm.weight", 1, E, 1, 1, y->ffn_norm);
        if (y->sparse) {
            G("ffn_gate_inp.weight", 2, E, m->NE, 1, y->router);
            double *a = malloc(sizeof(double) * (size_t)(m->NE * m->FE * E)), *b = malloc(sizeof(double) * (size_t)(m->NE * m->FE * E)),
                   *c = malloc(sizeof(double) * (size_t)(m->NE * m->FE * E));
            for (int e = 0; e < m->NE; e++) {
                memcpy(a + (size_t)e * m->FE * E, y->eg[e], sizeof(double) * (size_t)(m->FE * E));
                memcpy(b + (size_t)e * m->FE * E, y->eu[e], sizeof(double) * (size_t)(m->FE * E));
                memcpy(c + (size_t)e * m->FE * E, y->ed[e], sizeof(double) * (size_t)(m->FE * E));
            }
            G("ffn_gate_exps.weight", 3, E, m->FE, m->NE, a);
            G("ffn_up_exps.weight", 3, E, m->FE, m->NE, b);
            G("ffn_down_exps.weight", 3, m->FE, E, m->NE, c);
            free(a); free(b); free(c);
        } else if (phi3) {
            double *gu = malloc(sizeof(double) * (size_t)(2 * m->F * E));
            memcpy(gu, y->gate, sizeof(double) * (size_t)(m->F * E));
            memcpy(gu + m->F * E, y->up, sizeof(double) * (size_t)(m->F * E));
            G("ffn_up.weight", 2, E, 2 * m->F, 1, gu);
            free(gu);
            G("ffn_down.weight", 2, m->F, E, 1, y->down);
        } else {
            G("ffn_gate.weight", 2, E, m->F, 1, y->gate);
            G("ffn_up.weight", 2, E, m->F, 1, y->up);
            G("ffn_down.weight", 2, m->F, E, 1, y->down);
        }
#undef G
    }
    int rc = 0;
    for (int i = 0; i < n_gts && !rc; i++) rc = gguf_w_add_tensor(w, gts[i].name, DT_F32, gts[i].n_dims, gts[i].ne);
    if (!rc) rc = gguf_w_begin(w, path);
    for (int i = 0; i < n_gts && !rc; i++) rc = gguf_w_write(w, gts[i].data, sizeof(float) * (size_t)(gts[i].ne[0] * gts[i].ne[1] * gts[i].ne[2]));
    if (!rc) rc = gguf_w_finish(w);
    if (rc) fprintf(stderr, "gguf: %s\n", gguf_w_errmsg(w));
    gguf_w_destroy(w);
    for (int i = 0; i < n_gts; i++) free(gts[i].data);
    n_gts = 0;
    return rc;
}

/* Keys every GGUF gets; the caller adds the architecture's. */
static gguf_writer *g_writer(const rmodel *m, const char *arch) {
    gguf_writer *w;
    gguf_w_create(&w);
    char k[128];
    gguf_w_set_str(w, "general.architecture", arch);
#define U(s, v) (snprintf(k, sizeof k, "%s.%s", arch, s), gguf_w_set_u32(w, k, (uint32_t)(v)))
#define F(s, v) (snprintf(k, sizeof k, "%s.%s", arch, s), gguf_w_set_f32(w, k, (float)(v)))
    U("embedding_length", m->E); U("block_count", m->L); U("attention.head_count", m->H); U("attention.head_count_kv", m->HKV);
    U("attention.key_length", m->D); U("attention.value_length", m->D); U("context_length", 64); U("vocab_size", m->V);
    U("rope.dimension_count", m->rope_dim);
    if (m->F) U("feed_forward_length", m->F);
    F("attention.layer_norm_rms_epsilon", m->eps);
    F("rope.freq_base", m->theta);
#undef U
#undef F
    return w;
}

/* ---- running ------------------------------------------------------------------------------------ */

/* The engine's logits of ids: prefill NPRE (all rows), then one token per step; sliding blocks
 * are freed as the scheduler would. Returns the worst relative L2 error against ref and the
 * sliding pool's most blocks in use. */
static double run_engine(const mdl_model *m, const int32_t *ids, const double *ref, int *swa_peak) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_ctx = 64;
    o.max_tokens = NPRE;
    o.max_seqs = 1;
    o.max_out = NPRE;
    o.block_size = 4;
    o.kv_blocks = 24;
    o.n_threads = 2;
    ex_engine *e;
    char err[256];
    if (ex_engine_create(m, &o, &e, err, sizeof err)) {
        fprintf(stderr, "engine: %s\n", err);
        return 1e9;
    }
    ex_kv *kv = ex_engine_kv(e);
    ex_kv_table t;
    ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    const int V = m->cfg.n_vocab;
    double worst = 0;
    *swa_peak = 0;
    for (int pos = 0; pos < NPOS;) {
        int n = pos == 0 ? NPRE : 1;
        ex_batch_buf_clear(&bb);
        if (ex_kv_table_reserve(kv, &t, pos + n)) { worst = 1e9; break; }
        int used = ex_kv_n_blocks_swa(kv) - ex_kv_n_free_swa(kv);
        if (used > *swa_peak) *swa_peak = used;
        ex_batch_buf_add_kv(&bb, ids + pos, n, pos, &t, 1);
        const float *lg;
        if (ex_engine_forward(e, &bb.b, &lg)) { worst = 1e9; break; }
        for (int r = 0; r < n; r++) {
            const double *rr = ref + (size_t)(pos + r) * V;
            double num = 0, den = 0;
            for (int i = 0; i < V; i++) {
                double d = lg[(size_t)r * V + i] - rr[i];
                num += d * d;
                den += rr[i] * rr[i];
            }
            double rel = sqrt(num / den);
            if (rel > worst) worst = rel;
        }
        pos += n;
        ex_kv_table_slide(kv, &t, pos);
    }
    ex_batch_buf_free(&bb);
    ex_kv_table_release(kv, &t);
    ex_kv_table_free(&t);
    ex_engine_destroy(e);
    return worst;
}

static char root[256];

static void check(const rmodel *r, const char *path, double tol, const char *what) {
    static int32_t ids[NPOS];
    uint32_t x = 17;
    for (int i = 0; i < NPOS; i++) { x = x * 1664525u + 1013904223u; ids[i] = (int32_t)((x >> 8) % (uint32_t)r->V); }
    static double ref[NPOS * 128];
    ref_forward(r, ids, ref);
    mdl_model *m;
    char err[512];
    int rc = mdl_load(path, &m, err, sizeof err);
    T_CHECKF(rc == 0, "%s: %s", what, err);
    if (rc) return;
    int peak = 0;
    double worst = run_engine(m, ids, ref, &peak);
    printf("%-34s max relative L2 error %.2e over %d positions; sliding blocks in use at most %d; features %s\n", what, worst, NPOS,
           peak, mdl_features_str(mdl_features(&m->cfg), err, sizeof err));
    T_CHECKF(worst < tol, "%s: %g", what, worst);
    if (r->window > 0 && m->cfg.n_layer_swa > 0) {
        /* window positions + the block being written, rounded up to blocks of 4 */
        int bound = (r->window + 3) / 4 + 1 + (NPRE + 3) / 4;
        T_CHECKF(peak <= bound, "%s: %d sliding blocks in use (bound %d)", what, peak, bound);
    }
    mdl_free(m);
}

/* Writes m as a Hugging Face directory (config cfg, weights in dtype) and, when w is given, as a
 * GGUF with w's keys; checks both against the reference. */
static void check_both(const rmodel *m, const char *name, const char *cfg, const char *dtype, int per_expert, gguf_writer *w,
                       double tol) {
    char dir[512], what[128];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    write_hf(m, dir, cfg, dtype, per_expert);
    snprintf(what, sizeof what, "%s safetensors%s", name, strcmp(dtype, "F32") ? " (BF16)" : "");
    check(m, dir, tol, what);
    if (!w) return;
    snprintf(dir, sizeof dir, "%s/%s.gguf", root, name);
    snprintf(what, sizeof what, "%s gguf", name);
    if (write_gguf(m, dir, w) == 0) check(m, dir, 1e-4, what);
}

/* ---- the models ------------------------------------------------------------------------------- */

static rmodel base(const char *name, int arch) {
    rmodel m;
    memset(&m, 0, sizeof m);
    m.name = name;
    m.arch = arch;
    m.E = 32; m.L = 2; m.H = 4; m.HKV = 2; m.D = 8; m.F = 48; m.V = 64;
    m.rope_dim = 8;
    m.eps = 1e-6;
    m.embd_scale = 1;
    m.attn_factor = 1;
    m.theta = 10000;
    m.n_ctx = 64;
    return m;
}

static void finish(rmodel *m) {
    if (!(m->attn_scale > 0)) m->attn_scale = 1.0 / sqrt(m->D);
    build(m);
}

static void test_qwen3(void) {
    char cfg[4096];
    /* head_dim 16 with hidden 32 and 4 heads (64 != 32), GQA, QK-norm; transformers 5 style */
    rmodel m = base("qwen3", MDL_ARCH_QWEN3);
    m.D = 16; m.rope_dim = 16; m.qk_norm = 1; m.theta = 1e6;
    finish(&m);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,\"bos_token_id\":null,"
             "\"dtype\":\"float32\",\"eos_token_id\":null,\"head_dim\":16,\"hidden_act\":\"silu\",\"hidden_size\":32,"
             "\"initializer_range\":0.02,\"intermediate_size\":48,\"layer_types\":[\"full_attention\",\"full_attention\"],"
             "\"max_position_embeddings\":64,\"max_window_layers\":28,\"model_type\":\"qwen3\",\"num_attention_heads\":4,"
             "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"pad_token_id\":null,\"rms_norm_eps\":1e-06,"
             "\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":\"default\"},\"sliding_window\":null,"
             "\"tie_word_embeddings\":false,\"transformers_version\":\"5.17.0\",\"use_cache\":true,\"use_sliding_window\":false,"
             "\"vocab_size\":64}");
    check_both(&m, "qwen3", cfg, "F32", 1, g_writer(&m, "qwen3"), 1e-4);

    /* BF16 weights, yarn scaling (transformers 4.x rope_scaling) */
    rmodel y = base("qwen3-yarn", MDL_ARCH_QWEN3);
    y.D = 16; y.rope_dim = 16; y.qk_norm = 1; y.rope_scaling = MDL_ROPE_SCALING_YARN; y.factor = 4; y.orig = 16;
    y.beta_fast = 32; y.beta_slow = 1; y.attn_factor = 0.1 * log(4.0) + 1;
    finish(&y);
    to_bf16(&y);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\",\"head_dim\":16,\"hidden_size\":32,"
             "\"intermediate_size\":48,\"max_position_embeddings\":64,\"num_attention_heads\":4,\"num_hidden_layers\":2,"
             "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"rope_theta\":10000,\"rope_scaling\":{\"rope_type\":\"yarn\","
             "\"factor\":4.0,\"original_max_position_embeddings\":16},\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
             "\"vocab_size\":64}");
    gguf_writer *w = g_writer(&y, "qwen3");
    gguf_w_set_str(w, "qwen3.rope.scaling.type", "yarn");
    gguf_w_set_f32(w, "qwen3.rope.scaling.factor", 4.0f);
    gguf_w_set_u32(w, "qwen3.rope.scaling.original_context_length", 16);
    check_both(&y, "qwen3-yarn", cfg, "BF16", 1, w, 2e-4);
}

static void test_qwen3moe(void) {
    char cfg[4096];
    /* 4 experts, top-2, unnormalised, layer 1 dense (mlp_only_layers), per-expert tensors */
    rmodel m = base("qwen3moe", MDL_ARCH_QWEN3MOE);
    m.L = 3; m.qk_norm = 1; m.NE = 4; m.K = 2; m.FE = 24; m.norm_topk = 0;
    m.ly[0].sparse = m.ly[2].sparse = 1;
    finish(&m);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"attention_bias\":false,\"decoder_sparse_step\":1,"
             "\"head_dim\":8,\"hidden_act\":\"silu\",\"hidden_size\":32,\"intermediate_size\":48,\"max_position_embeddings\":64,"
             "\"max_window_layers\":3,\"mlp_only_layers\":[1],\"moe_intermediate_size\":24,\"norm_topk_prob\":false,"
             "\"num_attention_heads\":4,\"num_experts\":4,\"num_experts_per_tok\":2,\"num_hidden_layers\":3,\"num_key_value_heads\":2,"
             "\"output_router_logits\":false,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":10000.0,"
             "\"router_aux_loss_coef\":0.001,\"sliding_window\":null,\"tie_word_embeddings\":false,\"use_sliding_window\":false,"
             "\"vocab_size\":64}");
    gguf_writer *w = g_writer(&m, "qwen3moe");
    gguf_w_set_u32(w, "qwen3moe.expert_count", 4);
    gguf_w_set_u32(w, "qwen3moe.expert_used_count", 2);
    gguf_w_set_u32(w, "qwen3moe.expert_feed_forward_length", 24);
    gguf_w_set_bool(w, "qwen3moe.expert_weights_norm", 0);
    check_both(&m, "qwen3moe", cfg, "F32", 1, w, 1e-4);

    /* normalised, every layer sparse, transformers 5's fused experts and num_local_experts */
    rmodel f = base("qwen3moe-fused", MDL_ARCH_QWEN3MOE);
    f.qk_norm = 1; f.NE = 4; f.K = 2; f.FE = 24; f.norm_topk = 1; f.F = 0;
    f.ly[0].sparse = f.ly[1].sparse = 1;
    finish(&f);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"decoder_sparse_step\":1,\"head_dim\":8,"
             "\"hidden_size\":32,\"intermediate_size\":96,\"max_position_embeddings\":64,\"mlp_only_layers\":[],"
             "\"moe_intermediate_size\":24,\"norm_topk_prob\":true,\"num_attention_heads\":4,\"num_local_experts\":4,"
             "\"num_experts_per_tok\":2,\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
             "\"rope_parameters\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"},\"tie_word_embeddings\":false,\"vocab_size\":64}");
    check_both(&f, "qwen3moe-fused", cfg, "F32", 0, NULL, 1e-4);
}

static void test_mixtral(void) {
    char cfg[4096];
    rmodel m = base("mixtral", MDL_ARCH_MIXTRAL);
    m.NE = 4; m.K = 2; m.FE = 48; m.F = 0; m.norm_topk = 1; m.theta = 1e6; m.eps = 1e-5;
    m.ly[0].sparse = m.ly[1].sparse = 1;
    finish(&m);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"hidden_act\":\"silu\",\"hidden_size\":32,"
             "\"intermediate_size\":48,\"max_position_embeddings\":64,\"num_attention_heads\":4,\"num_experts_per_tok\":2,"
             "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"num_local_experts\":4,\"rms_norm_eps\":1e-05,\"rope_theta\":1e6,"
             "\"router_jitter_noise\":0.0,\"sliding_window\":null,\"tie_word_embeddings\":false,\"vocab_size\":64}");
    rmodel g = m;
    g.F = m.FE; /* GGUF llama: the experts are feed_forward_length wide */
    gguf_writer *w = g_writer(&g, "llama");
    gguf_w_set_u32(w, "llama.expert_count", 4);
    gguf_w_set_u32(w, "llama.expert_used_count", 2);
    check_both(&m, "mixtral", cfg, "F32", 1, w, 1e-4);
}

static void test_gemma2(void) {
    char cfg[4096];
    rmodel m = base("gemma2", MDL_ARCH_GEMMA2);
    m.L = 3; m.gelu = 1; m.post_norms = 1; m.tied = 1; m.window = 4; m.cap_attn = 2.0; m.cap_final = 3.0;
    m.embd_scale = sqrt(32.0); m.attn_scale = 1.0 / sqrt(12.0);
    m.ly[0].swa = m.ly[2].swa = 1;
    finish(&m);
    /* transformers 4.x style: no layer_types (alternating from layer 0) */
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Gemma2ForCausalLM\"],\"model_type\":\"gemma2\",\"attn_logit_softcapping\":2.0,"
             "\"cache_implementation\":\"hybrid\",\"final_logit_softcapping\":3.0,\"head_dim\":8,\"hidden_act\":\"gelu_pytorch_tanh\","
             "\"hidden_activation\":\"gelu_pytorch_tanh\",\"hidden_size\":32,\"intermediate_size\":48,\"max_position_embeddings\":64,"
             "\"num_attention_heads\":4,\"num_hidden_layers\":3,\"num_key_value_heads\":2,\"query_pre_attn_scalar\":12,"
             "\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,\"sliding_window\":4,\"vocab_size\":64}");
    gguf_writer *w = g_writer(&m, "gemma2");
    gguf_w_set_u32(w, "gemma2.attention.sliding_window", 4);
    gguf_w_set_f32(w, "gemma2.attn_logit_softcapping", 2.0f);
    gguf_w_set_f32(w, "gemma2.final_logit_softcapping", 3.0f);
    gguf_w_set_f32(w, "gemma2.attention.scale", (float)(1.0 / sqrt(12.0)));
    check_both(&m, "gemma2", cfg, "F32", 1, w, 1e-4);
}

static void test_gemma3(void) {
    char cfg[4096];
    rmodel m = base("gemma3", MDL_ARCH_GEMMA3);
    m.L = 6; m.gelu = 1; m.post_norms = 1; m.qk_norm = 1; m.tied = 1; m.window = 4;
    m.embd_scale = sqrt(32.0); m.attn_scale = 1.0 / sqrt(8.0);
    m.theta = 1e6; m.rope_scaling = MDL_ROPE_SCALING_LINEAR; m.factor = 2; m.swa_own = 1; m.theta_swa = 10000;
    for (int l = 0; l < 6; l++) m.ly[l].swa = l != 5;
    finish(&m);
    /* transformers 5 style: rope_parameters per layer type, layer_types */
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"attn_logit_softcapping\":null,"
             "\"final_logit_softcapping\":null,\"head_dim\":8,\"hidden_activation\":\"gelu_pytorch_tanh\",\"hidden_size\":32,"
             "\"intermediate_size\":48,\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"sliding_attention\","
             "\"sliding_attention\",\"sliding_attention\",\"full_attention\"],\"max_position_embeddings\":64,"
             "\"num_attention_heads\":4,\"num_hidden_layers\":6,\"num_key_value_heads\":2,\"query_pre_attn_scalar\":8,"
             "\"rms_norm_eps\":1e-06,\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\",\"factor\":2.0,"
             "\"rope_theta\":1000000.0},\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0}},"
             "\"sliding_window\":4,\"use_bidirectional_attention\":false,\"vocab_size\":64}");
    gguf_writer *w = g_writer(&m, "gemma3");
    gguf_w_set_u32(w, "gemma3.attention.sliding_window", 4);
    gguf_w_set_str(w, "gemma3.rope.scaling.type", "linear");
    gguf_w_set_f32(w, "gemma3.rope.scaling.factor", 2.0f);
    check_both(&m, "gemma3", cfg, "F32", 1, w, 1e-4);

    /* a vision + text checkpoint (transformers 4.x): the text model from a text_config that
     * leaves out what Gemma3TextConfig defaults (rope bases, the 5:1 pattern, the activation,
     * epsilon), tensors under language_model.model., a vision tower that is not loaded */
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"boi_token_index\":255999,\"eoi_token_index\":256000,"
             "\"image_token_index\":262144,\"initializer_range\":0.02,\"mm_tokens_per_image\":256,\"model_type\":\"gemma3\","
             "\"text_config\":{\"head_dim\":8,\"hidden_size\":32,\"intermediate_size\":48,\"max_position_embeddings\":64,"
             "\"model_type\":\"gemma3_text\",\"num_attention_heads\":4,\"num_hidden_layers\":6,\"num_key_value_heads\":2,"
             "\"query_pre_attn_scalar\":8,\"rope_scaling\":{\"factor\":2.0,\"rope_type\":\"linear\"},\"sliding_window\":4,"
             "\"vocab_size\":64},\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.50.0.dev0\","
             "\"vision_config\":{\"hidden_size\":16,\"image_size\":896,\"model_type\":\"siglip_vision_model\"}}");
    double vt[16] = { 0 };
    st_add("vision_tower.vision_model.post_layernorm.weight", "F32", 1, 16, 0, 0, vt, 1);
    st_add("multi_modal_projector.mm_input_projection_weight", "F32", 2, 16, 1, 0, vt, 0);
    hf_prefix = "language_model.model.";
    check_both(&m, "gemma3-vision", cfg, "F32", 1, NULL, 1e-4);
    hf_prefix = "model.";
}

static void test_phi3(void) {
    char cfg[8192];
    rmodel m = base("phi3", MDL_ARCH_PHI3);
    m.HKV = 4; m.rope_dim = 4; m.window = 6; m.eps = 1e-5;
    m.rope_scaling = MDL_ROPE_SCALING_LONGROPE; m.orig = 16;
    m.long_f[0] = 1.5; m.long_f[1] = 3.0; m.short_f[0] = 1.1; m.short_f[1] = 1.7;
    m.attn_factor = sqrt(1 + log(64.0 / 16) / log(16.0));
    for (int l = 0; l < m.L; l++) m.ly[l].swa = 1;
    finish(&m);
    /* transformers 5 style: rope_parameters with partial_rotary_factor; original context at the top */
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Phi3ForCausalLM\"],\"model_type\":\"phi3\",\"attention_bias\":false,\"embd_pdrop\":0.0,"
             "\"hidden_act\":\"silu\",\"hidden_size\":32,\"intermediate_size\":48,\"max_position_embeddings\":64,"
             "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"num_key_value_heads\":4,\"original_max_position_embeddings\":16,"
             "\"resid_pdrop\":0.0,\"rms_norm_eps\":1e-05,\"rope_parameters\":{\"rope_type\":\"longrope\",\"rope_theta\":10000.0,"
             "\"partial_rotary_factor\":0.5,\"long_factor\":[1.5,3.0],\"short_factor\":[1.1,1.7]},\"sliding_window\":6,"
             "\"tie_word_embeddings\":false,\"vocab_size\":64}");
    gguf_writer *w = g_writer(&m, "phi3");
    gguf_w_set_u32(w, "phi3.attention.sliding_window", 6);
    gguf_w_set_u32(w, "phi3.rope.scaling.original_context_length", 16);
    gguf_w_set_f32(w, "phi3.rope.scaling.attn_factor", (float)m.attn_factor);
    check_both(&m, "phi3", cfg, "F32", 1, w, 1e-4);
}

/* ---- the scheduler frees sliding blocks and computes the same -------------------------------- */

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* Two greedy requests of 36 positions through ex_sched on the gemma2 model (windows of 4 on
 * layers 0 and 2): the same tokens as a plain engine loop that never frees a block, and the
 * sliding pool holds a few blocks per sequence instead of nine. */
static void test_sched_sliding(void) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/gemma2", root);
    mdl_model *m;
    if (mdl_load(dir, &m, err, sizeof err)) { T_CHECKF(0, "%s", err); return; }
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_ctx = 64; o.block_size = 4; o.max_tokens = 16; o.max_seqs = 2; o.max_out = 2; o.kv_blocks = 40; o.n_threads = 1;
    ex_engine *e;
    if (ex_engine_create(m, &o, &e, err, sizeof err)) { T_CHECKF(0, "%s", err); mdl_free(m); return; }
    enum { NP = 6, NG = 30 };
    int32_t prompts[2][NP + NG];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NP; i++) prompts[r][i] = (int32_t)((i * 7 + r * 13 + 3) % m->cfg.n_vocab);
    /* the plain loop */
    int32_t want[2][NG];
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    for (int r = 0; r < 2; r++) {
        ex_kv_table t;
        ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
        int32_t seq[NP + NG];
        memcpy(seq, prompts[r], sizeof(int32_t) * NP);
        for (int pos = 0, n = NP; pos + n <= NP + NG - 1; pos += n, n = 1) {
            ex_batch_buf_clear(&bb);
            ex_kv_table_reserve(ex_engine_kv(e), &t, pos + n);
            ex_batch_buf_add_kv(&bb, seq + pos, n, pos, &t, 0);
            const float *lg;
            if (ex_engine_forward(e, &bb.b, &lg)) { T_CHECK(0); break; }
            seq[pos + n] = argmax(lg, m->cfg.n_vocab);
            want[r][pos + n - NP] = seq[pos + n];
        }
        ex_kv_table_release(ex_engine_kv(e), &t);
        ex_kv_table_free(&t);
    }
    ex_batch_buf_free(&bb);
    /* the scheduler */
    ex_sched *s;
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    T_EQ_INT(ex_sched_create(e, &so, &s), 0);
    for (int r = 0; r < 2; r++) {
        ex_request q = { .id = (uint64_t)r + 1, .prompt = prompts[r], .n_prompt = NP };
        ex_sample_params_default(&q.sp);
        q.sp.max_tokens = NG - 1;
        q.sp.temperature = 0;
        T_EQ_INT(ex_sched_submit(s, &q), 0);
    }
    int got[2] = { 0, 0 }, peak = 0, same = 1;
    ex_kv *kv = ex_engine_kv(e);
    while (ex_sched_busy(s)) {
        ex_event ev[8];
        int n;
        if (ex_sched_step(s, ev, 8, &n)) { T_CHECK(0); break; }
        int used = ex_kv_n_blocks_swa(kv) - ex_kv_n_free_swa(kv);
        if (used > peak) peak = used;
        for (int i = 0; i < n; i++) {
            int r = (int)ev[i].id - 1;
            if (ev[i].token >= 0 && got[r] < NG - 1) same &= ev[i].token == want[r][got[r]++];
        }
    }
    T_CHECKF(same && got[0] == NG - 1 && got[1] == NG - 1, "scheduler tokens differ from the plain loop (%d, %d tokens)", got[0], got[1]);
    T_CHECKF(peak <= 8, "sliding pool: %d blocks in use at once (two sequences of 36 positions, window 4)", peak);
    T_EQ_INT(ex_kv_n_free_swa(kv), ex_kv_n_blocks_swa(kv)); /* everything returned */
    printf("scheduler with sliding windows: same %d + %d greedy tokens, at most %d sliding blocks in use (of %d)\n", got[0], got[1], peak,
           ex_kv_n_blocks_swa(kv));
    ex_sched_destroy(s);
    ex_engine_destroy(e);
    mdl_free(m);
}

/* ---- embeddings ------------------------------------------------------------------------------ */

static double cosine(const float *a, const double *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) { ab += a[i] * b[i]; aa += (double)a[i] * a[i]; bb += b[i] * b[i]; }
    return ab / sqrt(aa * bb);
}

/* Qwen3-Embedding style files (sentence-transformers' 1_Pooling/config.json with last-token
 * pooling, modules.json ending in Normalize) make the model an embedding model; two sequences
 * batched give the reference's pooled, normalised final hidden states (cosine >= 0.99999,
 * norm 1), the same as each alone; mean pooling likewise; a GGUF's pooling_type key is read. */
static void test_embeddings(void) {
    char dir[512], p[600], err[512];
    rmodel m = base("qwen3-embed", MDL_ARCH_QWEN3);
    m.D = 16; m.rope_dim = 16; m.qk_norm = 1;
    finish(&m);
    snprintf(dir, sizeof dir, "%s/embed", root);
    write_hf(&m, dir, "{\"model_type\":\"qwen3\",\"head_dim\":16,\"hidden_size\":32,\"intermediate_size\":48,\"num_attention_heads\":4,"
                      "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"vocab_size\":64,\"tie_word_embeddings\":false}", "F32", 1);
    snprintf(p, sizeof p, "%s/1_Pooling", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/1_Pooling/config.json", dir);
    write_text(p, "{\"word_embedding_dimension\":32,\"pooling_mode_cls_token\":false,\"pooling_mode_mean_tokens\":false,"
                  "\"pooling_mode_max_tokens\":false,\"pooling_mode_mean_sqrt_len_tokens\":false,\"pooling_mode_weightedmean_tokens\":false,"
                  "\"pooling_mode_lasttoken\":true,\"include_prompt\":true}");
    snprintf(p, sizeof p, "%s/modules.json", dir);
    write_text(p, "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
                  "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
                  "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Normalize\",\"type\":\"sentence_transformers.models.Normalize\"}]");
    mdl_model *mm;
    if (mdl_load(dir, &mm, err, sizeof err)) { T_CHECKF(0, "%s", err); return; }
    T_EQ_INT(mm->cfg.pooling, MDL_POOL_LAST);
    T_EQ_INT(mm->cfg.embd_normalize, 1);
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_ctx = 64; o.max_tokens = 32; o.max_seqs = 2; o.max_out = 32; o.kv_blocks = 16; o.n_threads = 2;
    ex_engine *e;
    if (ex_engine_create(mm, &o, &e, err, sizeof err)) { T_CHECKF(0, "%s", err); mdl_free(mm); return; }
    enum { NA = 9, NB = 14 };
    static int32_t ids[NPOS];
    for (int i = 0; i < NPOS; i++) ids[i] = (int32_t)((i * 11 + 5) % 64);
    static double lg[NPOS * 64], hid[NPOS * 32];
    ref_forward_h(&m, ids, lg, hid); /* positions 0..13: both sequences are prefixes of ids */
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    ex_kv_table ta, tb;
    ex_kv_table_init(&ta, ex_engine_limits(e)->max_blocks);
    ex_kv_table_init(&tb, ex_engine_limits(e)->max_blocks);
    ex_kv_table_reserve(ex_engine_kv(e), &ta, NA);
    ex_kv_table_reserve(ex_engine_kv(e), &tb, NB);
    float out[2][32], alone[32];
    for (int pool = MDL_POOL_MEAN; pool <= MDL_POOL_LAST; pool++) {
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add_kv(&bb, ids, NA, 0, &ta, 1);
        ex_batch_buf_add_kv(&bb, ids, NB, 0, &tb, 1);
        T_EQ_INT(ex_engine_embed(e, &bb.b, pool, 1, &out[0][0]), 0);
        for (int s = 0; s < 2; s++) {
            int n = s ? NB : NA;
            double want[32], nn = 0;
            for (int i = 0; i < 32; i++) {
                double acc = 0;
                if (pool == MDL_POOL_LAST) acc = hid[(n - 1) * 32 + i];
                else for (int r = 0; r < n; r++) acc += hid[r * 32 + i] / n;
                want[i] = acc;
            }
            double cs = cosine(out[s], want, 32);
            for (int i = 0; i < 32; i++) nn += (double)out[s][i] * out[s][i];
            T_CHECKF(cs >= 0.99999, "%s pooling, sequence %d: cosine %.7f", pool == MDL_POOL_LAST ? "last" : "mean", s, cs);
            T_NEAR(nn, 1.0, 1e-5);
        }
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add_kv(&bb, ids, NB, 0, &tb, 1);
        T_EQ_INT(ex_engine_embed(e, &bb.b, pool, 1, alone), 0);
        T_CHECK(memcmp(alone, out[1], sizeof alone) == 0); /* batch invariance */
    }
    /* mean pooling over a sequence that does not start at position 0 is refused */
    ex_batch_buf_clear(&bb);
    ex_batch_buf_add_kv(&bb, ids + 4, 4, 4, &ta, 1);
    T_EQ_INT(ex_engine_embed(e, &bb.b, MDL_POOL_MEAN, 1, alone), CM_EINVAL);
    printf("embeddings: last-token and mean pooling match the reference, batched and alone\n");
    ex_kv_table_release(ex_engine_kv(e), &ta);
    ex_kv_table_release(ex_engine_kv(e), &tb);
    ex_kv_table_free(&ta);
    ex_kv_table_free(&tb);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
    mdl_free(mm);
    /* GGUF: llama.cpp's pooling_type (3 = last) */
    snprintf(dir, sizeof dir, "%s/embed.gguf", root);
    gguf_writer *w = g_writer(&m, "qwen3");
    gguf_w_set_u32(w, "qwen3.pooling_type", 3);
    if (write_gguf(&m, dir, w) == 0 && mdl_load(dir, &mm, err, sizeof err) == 0) {
        T_EQ_INT(mm->cfg.pooling, MDL_POOL_LAST);
        T_EQ_INT(mm->cfg.embd_normalize, 1);
        mdl_free(mm);
    } else {
        T_CHECKF(0, "%s", err);
    }
}

/* ---- refusals ----------------------------------------------------------------------------------- */

static void expect_refusal(const char *dir, const char *needle) {
    mdl_model *m;
    char err[512];
    int rc = mdl_load(dir, &m, err, sizeof err);
    T_CHECKF(rc != 0, "loaded, expected a refusal mentioning '%s'", needle);
    if (rc == 0) { mdl_free(m); return; }
    T_CHECKF(strstr(err, needle) != NULL, "'%s' does not mention '%s'", err, needle);
}

static void test_refusals(void) {
    char dir[512], p[600];
    rmodel m = base("refuse", MDL_ARCH_QWEN3);
    m.qk_norm = 1;
    finish(&m);
    static const char pre[] = "{\"model_type\":\"qwen3\",\"head_dim\":8,\"hidden_size\":32,\"intermediate_size\":48,"
                              "\"num_attention_heads\":4,\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"vocab_size\":64";
    static const struct { const char *extra, *needle; } cases[] = {
        { ",\"some_new_switch\":true}", "'some_new_switch'" },
        { ",\"attention_bias\":true}", "attention_bias" },
        { ",\"hidden_act\":\"gelu\"}", "activation 'gelu'" },
        { ",\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":2.0}}", "'dynamic'" },
        { ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":2.0,\"frobnicate\":1}}", "'frobnicate'" },
        { ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":2.0,\"truncate\":false}}", "truncate" },
        { ",\"layer_types\":[\"full_attention\",\"chunked_attention\"]}", "layer_types[1]" },
        { ",\"layer_types\":[\"full_attention\"]}", "layer_types" },
        { ",\"use_sliding_window\":true,\"sliding_window\":8,\"max_window_layers\":0,\"layer_types\":null,"
          "\"rope_parameters\":{\"full_attention\":{\"rope_theta\":10000}}}", "per-layer-type" },
        { ",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}}", "quant_method 'gptq' is not supported" },
        { ",\"quantization_config\":{\"quant_method\":\"fp8\"}}", "no tensor is F8_E4M3" },
    };
    snprintf(dir, sizeof dir, "%s/refuse", root);
    write_hf(&m, dir, "{}", "F32", 1);
    snprintf(p, sizeof p, "%s/config.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg, "%s%s", pre, cases[i].extra);
        write_text(p, cfg);
        expect_refusal(dir, cases[i].needle);
    }
    /* the valid config loads (the refusals above are the settings, not the rest) */
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s}", pre);
    write_text(p, cfg);
    mdl_model *mm;
    char err[512];
    T_CHECKF(mdl_load(dir, &mm, err, sizeof err) == 0, "%s", err);
    if (mm) {
        T_EQ_INT(mm->cfg.n_ctx_train, 32768); /* transformers' Qwen3Config default */
        T_NEAR(mm->cfg.rope_base, 10000, 0);
        mdl_free(mm);
    }
    /* a tensor the architecture does not use */
    rmodel g = base("extra", MDL_ARCH_QWEN3);
    g.qk_norm = 1;
    finish(&g);
    snprintf(dir, sizeof dir, "%s/extra", root);
    st_add("model.layers.0.self_attn.o_proj.bias", "F32", 1, 32, 0, 0, g.out_norm, 0);
    write_hf(&g, dir, "{\"model_type\":\"qwen3\",\"head_dim\":8,\"hidden_size\":32,\"intermediate_size\":48,\"num_attention_heads\":4,"
                      "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"vocab_size\":64}", "F32", 1);
    expect_refusal(dir, "'model.layers.0.self_attn.o_proj.bias' is not part");
    /* GGUF: an unknown ARCH key; a tensor the architecture does not use */
    snprintf(dir, sizeof dir, "%s/unknown-key.gguf", root);
    gguf_writer *w = g_writer(&m, "qwen3");
    gguf_w_set_u32(w, "qwen3.attention.clamp_kqv", 8);
    if (write_gguf(&m, dir, w) == 0) expect_refusal(dir, "'qwen3.attention.clamp_kqv'");
    snprintf(dir, sizeof dir, "%s/extra-tensor.gguf", root);
    w = g_writer(&m, "qwen3");
    g_add("blk.0.attn_output.bias", 1, 32, 1, 1, m.out_norm, 0);
    if (write_gguf(&m, dir, w) == 0) expect_refusal(dir, "'blk.0.attn_output.bias'");
    snprintf(dir, sizeof dir, "%s/yarn-ext.gguf", root);
    w = g_writer(&m, "qwen3");
    gguf_w_set_str(w, "qwen3.rope.scaling.type", "yarn");
    gguf_w_set_f32(w, "qwen3.rope.scaling.factor", 4.0f);
    gguf_w_set_f32(w, "qwen3.rope.scaling.yarn_ext_factor", 0.5f);
    if (write_gguf(&m, dir, w) == 0) expect_refusal(dir, "ext_factor");
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/arka-archs-XXXXXX");
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    test_qwen3();
    test_qwen3moe();
    test_mixtral();
    test_gemma2();
    test_gemma3();
    test_phi3();
    test_sched_sliding();
    test_embeddings();
    test_refusals();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    for (int i = 0; i < n_allocs; i++) free(allocs[i]);
    if (getenv("ARKA_KEEP_TEST_FILES")) printf("files kept in %s\n", root); /* for looking at them by hand */
    else if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return t_done();
}
