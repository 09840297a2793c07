/* model: names, ownership, the checks every loader shares, and the dispatch by file type. The
 * GGUF reading lives in model_gguf.c, config.json's in model_hf.c. */
#include "model_internal.h"
#include "dtype.h"
#include "../common/cm_err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const arch_names[MDL_ARCH_COUNT] = { "llama", "mistral", "qwen2", "qwen3", "qwen3moe",
                                                        "mixtral", "gemma2", "gemma3", "phi3" };


int mdl_arch_from_name(const char *name) {
    for (int i = 0; i < MDL_ARCH_COUNT; i++)
        if (!strcmp(name, arch_names[i])) return i;
    return -1;
}

const char *mdl_act_name(int act) { return act == MDL_ACT_SILU ? "silu" : act == MDL_ACT_GELU_TANH ? "gelu_tanh" : "?"; }

const char *mdl_pooling_name(int p) {
    static const char *const n[] = { "none", "mean", "last", "cls" };
    return p >= 0 && p <= MDL_POOL_CLS ? n[p] : "?";
}

const char *mdl_rope_scaling_name(int s) {
    static const char *const n[] = { "none", "linear", "llama3", "yarn", "longrope" };
    return s >= 0 && s <= MDL_ROPE_SCALING_LONGROPE ? n[s] : "?";
}

/* ---- ownership ------------------------------------------------------------------------------ */

typedef struct owned {
    void  **p;
    size_t  n, cap;
} owned;

void *mdl__alloc(mdl_model *m, size_t bytes) {
    owned *o = m->owned;
    if (!o && !(o = m->owned = calloc(1, sizeof *o))) return NULL;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        void **np = realloc(o->p, cap * sizeof *np);
        if (!np) return NULL;
        o->p = np;
        o->cap = cap;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (p) o->p[o->n++] = p;
    return p;
}

char *mdl__strdup(mdl_model *m, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = mdl__alloc(m, n);
    if (d) memcpy(d, s, n);
    return d;
}

void mdl_free(mdl_model *m) {
    if (!m) return;
    owned *o = m->owned;
    if (o) {
        for (size_t i = 0; i < o->n; i++) free(o->p[i]);
        free(o->p);
        free(o);
    }
    free(m->layers);
    gguf_close(m->gguf);
    mdl__st_free(m->st);
    free(m);
}

mdl_tensor *mdl__expert_views(mdl_model *m, const mdl_tensor *t3, int n_expert, int64_t first_row, int64_t n_rows) {
    if (!t3->data || n_expert <= 0 || t3->ne[2] != n_expert || t3->ne[3] != 1 || first_row < 0 ||
        first_row + n_rows > t3->ne[1])
        return NULL;
    size_t rs = dt_row_size(t3->type, t3->ne[0]);
    if (!rs) return NULL;
    mdl_tensor *v = mdl__alloc(m, sizeof *v * (size_t)n_expert);
    if (!v) return NULL;
    for (int e = 0; e < n_expert; e++) {
        v[e] = *t3;
        v[e].n_dims = 2;
        v[e].ne[1] = n_rows;
        v[e].ne[2] = 1;
        v[e].data = (const uint8_t *)t3->data + ((size_t)e * (size_t)t3->ne[1] + (size_t)first_row) * rs;
        v[e].nbytes = (uint64_t)n_rows * rs;
        if (t3->scale) v[e].scale = t3->scale + (size_t)e * (size_t)t3->ne[1] + (size_t)first_row;
    }
    return v;
}

void mdl__finish_config(mdl_model *m) {
    mdl_config *c = &m->cfg;
    if (!(c->attn_scale > 0) && c->head_dim > 0) c->attn_scale = (float)(1.0 / sqrt((double)c->head_dim));
    if (!(c->embd_scale > 0)) c->embd_scale = 1.0f;
    if (!(c->rope_attn_factor > 0)) c->rope_attn_factor = 1.0f;
    if (!(c->rope_factor > 0)) c->rope_factor = 1.0f;
    c->n_layer_swa = 0;
    int dense = 0;
    for (int l = 0; m->layers && l < c->n_layer; l++) {
        c->n_layer_swa += m->layers[l].swa != 0;
        dense += m->layers[l].ffn_gate_inp.data == NULL;
    }
    if (m->layers && !dense) c->n_ff = 0; /* every layer is a mixture of experts */
}

/* ---- features -------------------------------------------------------------------------------- */

unsigned mdl_features(const mdl_config *c) {
    unsigned f = 0;
    if (c->has_qk_norm) f |= MDL_FEAT_QK_NORM;
    if (c->has_post_norms) f |= MDL_FEAT_POST_NORM;
    if (c->n_expert > 0) f |= MDL_FEAT_MOE;
    if (c->n_layer_swa > 0) f |= MDL_FEAT_SWA;
    if (c->attn_softcap > 0) f |= MDL_FEAT_ATTN_SOFTCAP;
    if (c->final_softcap > 0) f |= MDL_FEAT_FINAL_SOFTCAP;
    if (c->ffn_act != MDL_ACT_SILU) f |= MDL_FEAT_GELU;
    if (c->embd_scale != 1.0f) f |= MDL_FEAT_EMBD_SCALE;
    if (c->head_dim > 0 && fabsf(c->attn_scale * sqrtf((float)c->head_dim) - 1.0f) > 1e-6f) f |= MDL_FEAT_ATTN_SCALE;
    if (c->rope_scaling == MDL_ROPE_SCALING_YARN) f |= MDL_FEAT_ROPE_YARN;
    if (c->rope_scaling == MDL_ROPE_SCALING_LONGROPE) f |= MDL_FEAT_ROPE_LONGROPE;
    if (c->rope_attn_factor > 0 && c->rope_attn_factor != 1.0f) f |= MDL_FEAT_ROPE_ATTN;
    if (c->rope_swa_own) f |= MDL_FEAT_ROPE_SWA_BASE;
    if (c->rope_dim < c->head_dim) f |= MDL_FEAT_ROPE_PARTIAL;
    if (c->n_head > 0 && c->head_dim * c->n_head != c->n_embd) f |= MDL_FEAT_HEAD_DIM;
    if (c->fp8_weights) f |= MDL_FEAT_FP8;
    return f;
}

const char *mdl_features_str(unsigned mask, char *buf, size_t n) {
    static const char *const names[] = { "qk-norm", "post-norms", "moe", "sliding-window", "attention soft-cap",
                                         "final soft-cap", "gelu", "embedding scale", "attention scale", "yarn rope",
                                         "longrope", "sliding-layer rope base", "partial rope",
                                         "head_dim apart from n_embd/n_head", "rope attention factor", "fp8 weights" };
    size_t at = 0;
    if (n) buf[0] = 0;
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++)
        if (mask & (1u << i)) {
            int w = snprintf(buf + at, at < n ? n - at : 0, "%s%s", at ? ", " : "", names[i]);
            if (w > 0) at += (size_t)w;
        }
    return buf;
}

void mdl_layer_rope(const mdl_config *c, int swa, mdl_rope *r) {
    memset(r, 0, sizeof *r);
    r->dim = c->rope_dim;
    r->layout = c->rope_layout;
    r->attn_factor = c->rope_attn_factor > 0 ? c->rope_attn_factor : 1.0f;
    if (swa && c->rope_swa_own) {
        r->base = c->rope_base_swa;
        r->scaling = MDL_ROPE_SCALING_NONE;
        r->factor = 1.0f;
        r->attn_factor = 1.0f;
        return;
    }
    r->base = c->rope_base;
    r->scaling = c->rope_scaling;
    r->factor = c->rope_factor > 0 ? c->rope_factor : 1.0f;
    r->low_freq_factor = c->rope_low_freq_factor;
    r->high_freq_factor = c->rope_high_freq_factor;
    r->orig_ctx = c->rope_orig_ctx;
    r->beta_fast = c->rope_beta_fast;
    r->beta_slow = c->rope_beta_slow;
    r->long_factor = c->rope_long_factor;
    r->short_factor = c->rope_short_factor;
}

/* ---- validation ------------------------------------------------------------------------------ */

static int check_shape(const mdl_tensor *t, int64_t ne0, int64_t ne1, const char *path, char *err, size_t errlen) {
    if (!t->data) return 0;
    int64_t want1 = ne1 > 0 ? ne1 : 1;
    if (t->ne[0] != ne0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1) {
        snprintf(err, errlen, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld]", path, t->name,
                 (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)ne0, (long long)want1);
        return CM_EFORMAT;
    }
    if (t->type == DT_F8_E4M3) {
        if (!t->scale) {
            snprintf(err, errlen, "%s: tensor '%s' is F8_E4M3 without scales", path, t->name);
            return CM_EFORMAT;
        }
        return 0;
    }
    if (!dt_is_supported(t->type)) {
        snprintf(err, errlen, "%s: tensor '%s' has unsupported type %s", path, t->name,
                 dt_name(t->type) ? dt_name(t->type) : "?");
        return CM_EUNSUPPORTED;
    }
    return 0;
}

/* A norm or bias vector: present when wanted, F32 (loaders convert), of length n. */
static int check_vec(const mdl_tensor *t, int want, int64_t n, const char *what, int l, const char *path, char *err,
                     size_t errlen) {
    if (!want) {
        if (t->data) {
            snprintf(err, errlen, "%s: layer %d has a %s tensor '%s' the configuration does not use", path, l, what, t->name);
            return CM_EFORMAT;
        }
        return 0;
    }
    if (!t->data) {
        snprintf(err, errlen, "%s: layer %d lacks its %s tensor", path, l, what);
        return CM_EFORMAT;
    }
    int rc = check_shape(t, n, 1, path, err, errlen);
    if (!rc && t->type != DT_F32) {
        snprintf(err, errlen, "%s: tensor '%s' is %s; norm and bias vectors must be F32", path, t->name, dt_name(t->type));
        rc = CM_EUNSUPPORTED;
    }
    return rc;
}

int mdl__validate(mdl_model *m, const char *path, char *err, size_t errlen) {
    mdl_config *c = &m->cfg;
    mdl__finish_config(m);
    if (c->n_embd <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 || c->n_ff < 0 || c->n_vocab <= 0 || c->head_dim <= 0 ||
        c->n_embd > (1 << 20) || c->n_ff > (1 << 22) || c->n_vocab > (1 << 24) || c->head_dim > 1024 || c->n_head > 1024 ||
        (c->n_ff == 0 && c->n_expert == 0)) {
        snprintf(err, errlen, "%s: absurd hyper-parameters (n_embd %d, n_head %d, n_head_kv %d, head_dim %d, n_ff %d, n_vocab %d)",
                 path, c->n_embd, c->n_head, c->n_head_kv, c->head_dim, c->n_ff, c->n_vocab);
        return CM_EFORMAT;
    }
    if (c->n_head % c->n_head_kv) {
        snprintf(err, errlen, "%s: head_count %d is not a multiple of head_count_kv %d", path, c->n_head, c->n_head_kv);
        return CM_EFORMAT;
    }
    if (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2) {
        snprintf(err, errlen, "%s: rope dimension %d invalid for head_dim %d", path, c->rope_dim, c->head_dim);
        return CM_EFORMAT;
    }
    if (c->n_expert < 0 || c->n_expert > MDL_MAX_EXPERTS ||
        (c->n_expert > 0 && (c->n_expert_used < 1 || c->n_expert_used > c->n_expert || c->n_ff_exp <= 0 || c->n_ff_exp > (1 << 22)))) {
        snprintf(err, errlen, "%s: absurd expert configuration (%d experts, %d used, expert ff %d; at most %d experts)", path,
                 c->n_expert, c->n_expert_used, c->n_ff_exp, MDL_MAX_EXPERTS);
        return CM_EFORMAT;
    }
    if ((c->n_layer_swa > 0 && c->n_swa <= 0) || c->n_swa < 0 || !(c->attn_softcap >= 0) || !(c->final_softcap >= 0) ||
        !(c->attn_scale > 0) || !isfinite(c->attn_scale) || !(c->embd_scale > 0) || !isfinite(c->embd_scale)) {
        snprintf(err, errlen, "%s: invalid attention settings (sliding window %d over %d layers, soft-caps %g / %g, scale %g, "
                 "embedding scale %g)", path, c->n_swa, c->n_layer_swa, c->attn_softcap, c->final_softcap, c->attn_scale,
                 c->embd_scale);
        return CM_EFORMAT;
    }
    if (c->rope_scaling == MDL_ROPE_SCALING_LONGROPE && (!c->rope_long_factor || !c->rope_short_factor || c->rope_orig_ctx <= 0)) {
        snprintf(err, errlen, "%s: longrope scaling needs long and short factors and an original context length", path);
        return CM_EFORMAT;
    }
    if ((c->rope_scaling == MDL_ROPE_SCALING_YARN || c->rope_scaling == MDL_ROPE_SCALING_LLAMA3) && c->rope_orig_ctx <= 0) {
        snprintf(err, errlen, "%s: %s rope scaling needs the original context length", path, mdl_rope_scaling_name(c->rope_scaling));
        return CM_EFORMAT;
    }
    if (c->n_ctx_train <= 0) {
        snprintf(err, errlen, "%s: the training context length is missing", path);
        return CM_EFORMAT;
    }
    int64_t qd = (int64_t)c->n_head * c->head_dim, kvd = (int64_t)c->n_head_kv * c->head_dim;
    int rc;
    if (m->tok_embd.type == DT_F8_E4M3) {
        snprintf(err, errlen, "%s: tensor '%s' is F8_E4M3: FP8 is read for linear layers, not for the token embeddings%s", path,
                 m->tok_embd.name, c->tied_output ? " (tied to the output head)" : "");
        return CM_EUNSUPPORTED;
    }
    if ((rc = check_shape(&m->tok_embd, c->n_embd, c->n_vocab, path, err, errlen)) ||
        (rc = check_shape(&m->output, c->n_embd, c->n_vocab, path, err, errlen)) ||
        (rc = check_vec(&m->out_norm, 1, c->n_embd, "output norm", -1, path, err, errlen)))
        return rc;
    uint64_t bytes = m->out_norm.nbytes + m->output.nbytes, active = bytes;
    for (int l = 0; l < c->n_layer; l++) {
        mdl_layer *ly = &m->layers[l];
        int moe = ly->ffn_gate_inp.data != NULL;
        if ((rc = check_vec(&ly->attn_norm, 1, c->n_embd, "attention norm", l, path, err, errlen)) ||
            (rc = check_shape(&ly->wq, c->n_embd, qd, path, err, errlen)) ||
            (rc = check_shape(&ly->wk, c->n_embd, kvd, path, err, errlen)) ||
            (rc = check_shape(&ly->wv, c->n_embd, kvd, path, err, errlen)) ||
            (rc = check_shape(&ly->wo, qd, c->n_embd, path, err, errlen)) ||
            (rc = check_vec(&ly->bq, c->has_qkv_bias, qd, "Q bias", l, path, err, errlen)) ||
            (rc = check_vec(&ly->bk, c->has_qkv_bias, kvd, "K bias", l, path, err, errlen)) ||
            (rc = check_vec(&ly->bv, c->has_qkv_bias, kvd, "V bias", l, path, err, errlen)) ||
            (rc = check_vec(&ly->attn_q_norm, c->has_qk_norm, c->head_dim, "Q norm", l, path, err, errlen)) ||
            (rc = check_vec(&ly->attn_k_norm, c->has_qk_norm, c->head_dim, "K norm", l, path, err, errlen)) ||
            (rc = check_vec(&ly->attn_post_norm, c->has_post_norms, c->n_embd, "post-attention norm", l, path, err, errlen)) ||
            (rc = check_vec(&ly->ffn_post_norm, c->has_post_norms, c->n_embd, "post-MLP norm", l, path, err, errlen)) ||
            (rc = check_vec(&ly->ffn_norm, 1, c->n_embd, "MLP norm", l, path, err, errlen)))
            return rc;
        if (!ly->wq.data || !ly->wk.data || !ly->wv.data || !ly->wo.data) {
            snprintf(err, errlen, "%s: layer %d lacks an attention projection", path, l);
            return CM_EFORMAT;
        }
        uint64_t lb = ly->attn_norm.nbytes + ly->wq.nbytes + ly->wk.nbytes + ly->wv.nbytes + ly->wo.nbytes + ly->bq.nbytes +
                      ly->bk.nbytes + ly->bv.nbytes + ly->ffn_norm.nbytes + ly->attn_q_norm.nbytes + ly->attn_k_norm.nbytes +
                      ly->attn_post_norm.nbytes + ly->ffn_post_norm.nbytes;
        bytes += lb;
        active += lb;
        if (moe) {
            if (c->n_expert <= 0 || !ly->exp_gate || !ly->exp_up || !ly->exp_down || ly->w_gate.data || ly->w_up.data ||
                ly->w_down.data) {
                snprintf(err, errlen, "%s: layer %d mixes a router with %s", path, l,
                         c->n_expert <= 0 ? "no expert count" : ly->w_gate.data ? "dense MLP tensors" : "missing experts");
                return CM_EFORMAT;
            }
            if ((rc = check_shape(&ly->ffn_gate_inp, c->n_embd, c->n_expert, path, err, errlen))) return rc;
            uint64_t eb = 0;
            for (int e = 0; e < c->n_expert; e++) {
                if ((rc = check_shape(&ly->exp_gate[e], c->n_embd, c->n_ff_exp, path, err, errlen)) ||
                    (rc = check_shape(&ly->exp_up[e], c->n_embd, c->n_ff_exp, path, err, errlen)) ||
                    (rc = check_shape(&ly->exp_down[e], c->n_ff_exp, c->n_embd, path, err, errlen)))
                    return rc;
                eb += ly->exp_gate[e].nbytes + ly->exp_up[e].nbytes + ly->exp_down[e].nbytes;
            }
            bytes += ly->ffn_gate_inp.nbytes + eb;
            active += ly->ffn_gate_inp.nbytes + eb / (uint64_t)c->n_expert * (uint64_t)c->n_expert_used;
        } else {
            if (!ly->w_gate.data || !ly->w_up.data || !ly->w_down.data || c->n_ff <= 0) {
                snprintf(err, errlen, "%s: layer %d has neither a dense MLP nor a router", path, l);
                return CM_EFORMAT;
            }
            if ((rc = check_shape(&ly->w_gate, c->n_embd, c->n_ff, path, err, errlen)) ||
                (rc = check_shape(&ly->w_up, c->n_embd, c->n_ff, path, err, errlen)) ||
                (rc = check_shape(&ly->w_down, c->n_ff, c->n_embd, path, err, errlen)))
                return rc;
            uint64_t db = ly->w_gate.nbytes + ly->w_up.nbytes + ly->w_down.nbytes;
            bytes += db;
            active += db;
        }
    }
    m->weight_bytes = bytes;
    m->active_bytes = active;
    c->fp8_weights = 0;
    for (int l = 0; l < c->n_layer && !c->fp8_weights; l++) {
        const mdl_layer *ly = &m->layers[l];
        const mdl_tensor *ts[] = { &ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down, &ly->ffn_gate_inp };
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) c->fp8_weights |= ts[i]->type == DT_F8_E4M3;
        for (int e = 0; ly->exp_gate && e < c->n_expert; e++)
            c->fp8_weights |= ly->exp_gate[e].type == DT_F8_E4M3 || ly->exp_up[e].type == DT_F8_E4M3 ||
                              ly->exp_down[e].type == DT_F8_E4M3;
    }
    c->fp8_weights |= m->output.type == DT_F8_E4M3;
    return 0;
}

int mdl_load(const char *path, mdl_model **out, char *err, size_t errlen) {
    struct stat st;
    *out = NULL;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: no such file or directory", path);
        return CM_ENOENT;
    }
    size_t n = strlen(path);
    if (S_ISDIR(st.st_mode) || (n > 12 && !strcmp(path + n - 12, ".safetensors")))
        return mdl__load_safetensors(path, out, err, errlen);
    gguf_ctx *g;
    int rc = gguf_open(path, &g, err, errlen);
    if (rc) return rc;
    rc = mdl_from_gguf(g, out, err, errlen);
    if (rc) gguf_close(g);
    return rc;
}
