/* model_gguf: a GGUF file's metadata and tensors into the model description, with llama.cpp's
 * names and keys (src/llama-arch.cpp, src/llama-model.cpp).
 *
 * Every "ARCH.*" key the file holds must be one this reader knows, and every tensor must be
 * one the architecture uses: anything else is refused with its name. Where llama.cpp applies
 * a rule for a key a file leaves out, the same rule applies here; each is written next to
 * the code. Norm and bias vectors stored in another float type are converted to F32 at load.
 */
#include "model_internal.h"
#include "dtype.h"
#include "../common/cm_err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    gguf_ctx   *g;
    mdl_model  *m;
    const char *path, *arch;     /* arch: the key prefix ("llama", "qwen3moe", ...) */
    uint8_t    *kv_used;         /* [n_kv] */
    uint8_t    *t_used;          /* [n_tensors] */
    char       *err;
    size_t      errlen;
} rd;

static int fail(rd *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(rd *r, int code, const char *fmt, ...) {
    int n = snprintf(r->err, r->errlen, "%s: ", r->path);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < r->errlen) vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- metadata ------------------------------------------------------------------------------- */

static void mark_key(rd *r, const char *key) {
    for (int64_t i = 0; i < gguf_n_kv(r->g); i++) {
        const gguf_kv *kv = gguf_kv_at(r->g, i);
        if (kv->key.len == strlen(key) && !memcmp(kv->key.ptr, key, kv->key.len)) r->kv_used[i] = 1;
    }
}

static void key_of(rd *r, const char *suffix, char *key, size_t n) { snprintf(key, n, "%s.%s", r->arch, suffix); }

/* ARCH.suffix as an unsigned integer: 1 found, 0 absent, < 0 error. */
static int get_u32(rd *r, const char *suffix, int *out) {
    char key[160];
    key_of(r, suffix, key, sizeof key);
    uint32_t v;
    int rc = gguf_get_u32(r->g, key, &v);
    if (rc == CM_ENOTFOUND) return 0;
    mark_key(r, key);
    if (rc || v > (1u << 30)) return fail(r, CM_EFORMAT, "metadata '%s' is not a sensible unsigned integer", key);
    *out = (int)v;
    return 1;
}

static int need_u32(rd *r, const char *suffix, int *out) {
    int rc = get_u32(r, suffix, out);
    if (rc == 0) {
        char key[160];
        key_of(r, suffix, key, sizeof key);
        return fail(r, CM_EFORMAT, "missing metadata '%s'", key);
    }
    return rc < 0 ? rc : 0;
}

static int get_f32(rd *r, const char *suffix, float *out) {
    char key[160];
    key_of(r, suffix, key, sizeof key);
    float v;
    int rc = gguf_get_f32(r->g, key, &v);
    if (rc == CM_ENOTFOUND) return 0;
    mark_key(r, key);
    if (rc || !isfinite(v)) return fail(r, CM_EFORMAT, "metadata '%s' is not a finite number", key);
    *out = v;
    return 1;
}

static int get_bool(rd *r, const char *suffix, int *out) {
    char key[160];
    key_of(r, suffix, key, sizeof key);
    int rc = gguf_get_bool(r->g, key, out);
    if (rc == CM_ENOTFOUND) return 0;
    mark_key(r, key);
    return rc ? fail(r, CM_EFORMAT, "metadata '%s' is not a boolean", key) : 1;
}

/* ARCH.suffix as a string into buf: 1 found, 0 absent, < 0 error. */
static int get_str(rd *r, const char *suffix, char *buf, size_t n) {
    char key[160];
    key_of(r, suffix, key, sizeof key);
    char *s = NULL;
    int rc = gguf_get_strdup(r->g, key, &s);
    if (rc == CM_ENOTFOUND) return 0;
    mark_key(r, key);
    if (rc) return fail(r, CM_EFORMAT, "metadata '%s' is not a string", key);
    snprintf(buf, n, "%s", s);
    free(s);
    return 1;
}

/* Every ARCH.* key must have been read (or be one that changes nothing for inference). */
static int check_keys(rd *r) {
    static const char *const harmless[] = {
        "rope.scaling.finetuned", /* informational: whether the scaled model was fine-tuned */
        "tensor_data_layout",     /* a note on the converter's Q/K permutation (cfg.rope_layout decides) */
    };
    size_t al = strlen(r->arch);
    for (int64_t i = 0; i < gguf_n_kv(r->g); i++) {
        const gguf_kv *kv = gguf_kv_at(r->g, i);
        if (r->kv_used[i] || kv->key.len <= al || memcmp(kv->key.ptr, r->arch, al) || kv->key.ptr[al] != '.') continue;
        int ok = 0;
        for (size_t h = 0; h < sizeof harmless / sizeof *harmless; h++)
            if (kv->key.len == al + 1 + strlen(harmless[h]) && !memcmp(kv->key.ptr + al + 1, harmless[h], strlen(harmless[h])))
                ok = 1;
        if (!ok)
            return fail(r, CM_EUNSUPPORTED, "metadata '%.*s' is a setting this engine does not implement for architecture '%s'",
                        (int)(kv->key.len > 120 ? 120 : kv->key.len), kv->key.ptr, r->arch);
    }
    return 0;
}

/* ---- tensors -------------------------------------------------------------------------------- */

static const gguf_tensor *find_t(rd *r, const char *name) {
    const gguf_tensor *gt = gguf_find_tensor(r->g, name);
    if (gt) r->t_used[gt - gguf_tensor_at(r->g, 0)] = 1;
    return gt;
}

/* Fills t from tensor `name`: 1 found, 0 absent (t zeroed, name set), < 0 error. */
static int take(rd *r, const char *name, mdl_tensor *t) {
    memset(t, 0, sizeof *t);
    if (!(t->name = mdl__strdup(r->m, name))) return fail(r, CM_ENOMEM, "out of memory");
    const gguf_tensor *gt = find_t(r, name);
    if (!gt) return 0;
    t->data = gt->data;
    t->type = gt->type;
    t->n_dims = (int)gt->n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = gt->ne[d];
    t->nbytes = gt->nbytes;
    return 1;
}

static int need(rd *r, const char *name, mdl_tensor *t) {
    int rc = take(r, name, t);
    return rc == 0 ? fail(r, CM_EFORMAT, "missing tensor '%s'", name) : rc < 0 ? rc : 0;
}

/* A norm or bias vector, converted to F32 when the file stores another float type. */
static int take_vec(rd *r, const char *name, mdl_tensor *t, int required) {
    int rc = required ? need(r, name, t) : take(r, name, t);
    if (rc < 0 || !t->data || t->type == DT_F32) return rc < 0 ? rc : 0;
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (t->type != DT_F16 && t->type != DT_BF16) return fail(r, CM_EUNSUPPORTED, "vector '%s' has type %s (F32, F16, BF16)", name,
                                                            dt_name(t->type) ? dt_name(t->type) : "?");
    float *f = mdl__alloc(r->m, sizeof *f * (size_t)n);
    if (!f) return fail(r, CM_ENOMEM, "out of memory");
    if (dt_dequantize(t->type, t->data, f, n)) return fail(r, CM_EFORMAT, "vector '%s' cannot be converted", name);
    t->data = f;
    t->type = DT_F32;
    t->nbytes = sizeof *f * (uint64_t)n;
    return 0;
}

static int check_tensors(rd *r) {
    for (int64_t i = 0; i < gguf_n_tensors(r->g); i++)
        if (!r->t_used[i]) {
            const gguf_tensor *t = gguf_tensor_at(r->g, i);
            return fail(r, CM_EUNSUPPORTED, "tensor '%.*s' is not part of architecture '%s' as this engine reads it",
                        (int)(t->name.len > 96 ? 96 : t->name.len), t->name.ptr, r->arch);
        }
    return 0;
}

/* ---- rope ----------------------------------------------------------------------------------- */

/* llama3 frequency divisors for pair i, Meta's rule (ops.c applies the same). */
static double llama3_divisor(const mdl_config *c, int i) {
    double f = pow(c->rope_base, -2.0 * i / c->rope_dim);
    double wl = 2.0 * M_PI / f, lo_wl = c->rope_orig_ctx / c->rope_low_freq_factor, hi_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
    if (wl < hi_wl) return 1.0;
    if (wl > lo_wl) return c->rope_factor;
    double smooth = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
    return 1.0 / ((1.0 - smooth) / c->rope_factor + smooth);
}

/* A per-pair factor tensor [rope_dim/2] (rope_freqs, rope_factors_long/short) as F32. */
static int rope_factors(rd *r, const char *name, const float **out) {
    mdl_tensor t;
    int rc = take(r, name, &t);
    if (rc <= 0) return rc;
    mdl_config *c = &r->m->cfg;
    if (t.ne[0] != c->rope_dim / 2 || t.ne[1] != 1 || t.ne[2] != 1 || t.type != DT_F32)
        return fail(r, CM_EFORMAT, "tensor '%s' must be F32 [%d] (rope_dim / 2)", name, c->rope_dim / 2);
    float *f = mdl__alloc(r->m, sizeof *f * (size_t)t.ne[0]);
    if (!f) return fail(r, CM_ENOMEM, "out of memory");
    memcpy(f, t.data, sizeof *f * (size_t)t.ne[0]);
    for (int64_t i = 0; i < t.ne[0]; i++)
        if (!(f[i] > 0) || !isfinite(f[i])) return fail(r, CM_EFORMAT, "tensor '%s' holds a factor that is not positive", name);
    *out = f;
    return 1;
}

static int read_rope(rd *r) {
    mdl_config *c = &r->m->cfg;
    int rc;
    c->rope_dim = c->head_dim; /* llama.cpp: n_rot defaults to the head size */
    if ((rc = get_u32(r, "rope.dimension_count", &c->rope_dim)) < 0) return rc;
    c->rope_base = 10000.0f; /* llama.cpp's default freq_base */
    if ((rc = get_f32(r, "rope.freq_base", &c->rope_base)) < 0) return rc;
    c->rope_factor = 1.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_attn_factor = 1.0f;
    c->rope_beta_fast = 32.0f; /* llama.cpp's yarn defaults */
    c->rope_beta_slow = 1.0f;
    c->rope_orig_ctx = c->n_ctx_train;
    char type[32] = "";
    if ((rc = get_str(r, "rope.scaling.type", type, sizeof type)) < 0) return rc;
    float f = 1.0f;
    if ((rc = get_f32(r, "rope.scaling.factor", &f)) < 0) return rc;
    if (rc == 0 && (rc = get_f32(r, "rope.scale_linear", &f)) < 0) return rc; /* older files */
    if (rc == 1 && !type[0] && f != 1.0f) snprintf(type, sizeof type, "linear");
    if ((rc = get_u32(r, "rope.scaling.original_context_length", &c->rope_orig_ctx)) < 0 ||
        (rc = get_f32(r, "rope.scaling.attn_factor", &c->rope_attn_factor)) < 0 ||
        (rc = get_f32(r, "rope.scaling.yarn_beta_fast", &c->rope_beta_fast)) < 0 ||
        (rc = get_f32(r, "rope.scaling.yarn_beta_slow", &c->rope_beta_slow)) < 0)
        return rc;
    float ext = 1.0f, logmul = 0.0f;
    if ((rc = get_f32(r, "rope.scaling.yarn_ext_factor", &ext)) < 0 || (rc = get_f32(r, "rope.scaling.yarn_log_multiplier", &logmul)) < 0)
        return rc;
    if (!type[0] || !strcmp(type, "none")) c->rope_scaling = MDL_ROPE_SCALING_NONE;
    else if (!strcmp(type, "linear")) c->rope_scaling = MDL_ROPE_SCALING_LINEAR;
    else if (!strcmp(type, "llama3")) c->rope_scaling = MDL_ROPE_SCALING_LLAMA3;
    else if (!strcmp(type, "yarn")) c->rope_scaling = MDL_ROPE_SCALING_YARN;
    else if (!strcmp(type, "longrope")) c->rope_scaling = MDL_ROPE_SCALING_LONGROPE;
    else return fail(r, CM_EUNSUPPORTED, "unsupported rope scaling '%s' (linear, llama3, yarn, longrope)", type);
    if (c->rope_scaling != MDL_ROPE_SCALING_NONE) {
        if (!(f > 0)) return fail(r, CM_EFORMAT, "rope scaling factor %g is not positive", f);
        c->rope_factor = f;
    }
    if (c->rope_scaling == MDL_ROPE_SCALING_YARN) {
        if (ext != 1.0f || logmul != 0.0f)
            return fail(r, CM_EUNSUPPORTED, "yarn with ext_factor %g / log multiplier %g is not implemented (1 and 0 only)", ext, logmul);
        /* llama.cpp: the attention factor of yarn is 1 + 0.1 ln(factor) times the file's */
        if (c->rope_factor > 1.0f) c->rope_attn_factor *= 1.0f + 0.1f * logf(c->rope_factor);
    } else if (ext != 1.0f || logmul != 0.0f) {
        return fail(r, CM_EUNSUPPORTED, "yarn parameters given for rope scaling '%s'", type[0] ? type : "none");
    }
    /* Per-pair factors: phi3's long/short (longrope), Llama 3.1's rope_freqs (the llama3 rule
     * written out; checked against it with the standard constants, which is what made it). */
    const float *lf = NULL, *sf = NULL, *ff = NULL;
    if ((rc = rope_factors(r, "rope_factors_long.weight", &lf)) < 0 || (rc = rope_factors(r, "rope_factors_short.weight", &sf)) < 0 ||
        (rc = rope_factors(r, "rope_freqs.weight", &ff)) < 0)
        return rc;
    if (lf || sf) {
        if (!lf || !sf) return fail(r, CM_EFORMAT, "rope_factors_long and rope_factors_short come together");
        c->rope_scaling = MDL_ROPE_SCALING_LONGROPE;
        c->rope_long_factor = lf;
        c->rope_short_factor = sf;
    }
    if (ff) {
        if (c->rope_scaling == MDL_ROPE_SCALING_NONE) {
            c->rope_scaling = MDL_ROPE_SCALING_LLAMA3;
            c->rope_factor = 8.0f;
            if (get_u32(r, "rope.scaling.original_context_length", &c->rope_orig_ctx) == 0) c->rope_orig_ctx = 8192;
        }
        if (c->rope_scaling != MDL_ROPE_SCALING_LLAMA3)
            return fail(r, CM_EUNSUPPORTED, "rope_freqs.weight together with rope scaling '%s'", mdl_rope_scaling_name(c->rope_scaling));
        for (int i = 0; i < c->rope_dim / 2; i++) {
            double want = llama3_divisor(c, i);
            if (fabs(ff[i] - want) > 1e-3 * want)
                return fail(r, CM_EUNSUPPORTED, "rope_freqs.weight[%d] = %g is not the llama3 rule's %g (factor %g, context %d)", i,
                            ff[i], want, c->rope_factor, c->rope_orig_ctx);
        }
    }
    return 0;
}

/* ---- the architectures ------------------------------------------------------------------------- */

static int layer_tensors(rd *r, int l) {
    mdl_model *m = r->m;
    mdl_config *c = &m->cfg;
    mdl_layer *ly = &m->layers[l];
    char tn[128];
    int rc;
#define NAME(s) (snprintf(tn, sizeof tn, "blk.%d.%s", l, (s)), tn)
    if ((rc = take_vec(r, NAME("attn_norm.weight"), &ly->attn_norm, 1)) || (rc = need(r, NAME("attn_output.weight"), &ly->wo)) ||
        (rc = take_vec(r, NAME("ffn_norm.weight"), &ly->ffn_norm, 1)))
        return rc;
    /* Q, K, V: three tensors, or phi3's fused attn_qkv split into views of its rows */
    mdl_tensor qkv;
    if ((rc = take(r, NAME("attn_qkv.weight"), &qkv)) < 0) return rc;
    if (rc == 1) {
        int64_t qd = (int64_t)c->n_head * c->head_dim, kvd = (int64_t)c->n_head_kv * c->head_dim;
        size_t rs = dt_row_size(qkv.type, qkv.ne[0]);
        if (qkv.ne[1] != qd + 2 * kvd || qkv.ne[2] != 1 || !rs)
            return fail(r, CM_EFORMAT, "tensor '%s' has %lld rows, expected %lld (Q, K, V)", qkv.name, (long long)qkv.ne[1],
                        (long long)(qd + 2 * kvd));
        mdl_tensor *parts[3] = { &ly->wq, &ly->wk, &ly->wv };
        int64_t rows[3] = { qd, kvd, kvd }, at = 0;
        for (int i = 0; i < 3; i++) {
            *parts[i] = qkv;
            parts[i]->ne[1] = rows[i];
            parts[i]->data = (const uint8_t *)qkv.data + (size_t)at * rs;
            parts[i]->nbytes = (uint64_t)rows[i] * rs;
            at += rows[i];
        }
    } else if ((rc = need(r, NAME("attn_q.weight"), &ly->wq)) || (rc = need(r, NAME("attn_k.weight"), &ly->wk)) ||
               (rc = need(r, NAME("attn_v.weight"), &ly->wv))) {
        return rc;
    }
    struct { const char *s; mdl_tensor *t; } bias[] = { { "attn_q.bias", &ly->bq }, { "attn_k.bias", &ly->bk }, { "attn_v.bias", &ly->bv } };
    for (size_t i = 0; i < 3; i++) {
        if ((rc = take_vec(r, NAME(bias[i].s), bias[i].t, 0))) return rc;
        if (bias[i].t->data) c->has_qkv_bias = 1;
    }
    if (c->has_qk_norm && ((rc = take_vec(r, NAME("attn_q_norm.weight"), &ly->attn_q_norm, 1)) ||
                           (rc = take_vec(r, NAME("attn_k_norm.weight"), &ly->attn_k_norm, 1))))
        return rc;
    if (c->has_post_norms && ((rc = take_vec(r, NAME("post_attention_norm.weight"), &ly->attn_post_norm, 1)) ||
                              (rc = take_vec(r, NAME("post_ffw_norm.weight"), &ly->ffn_post_norm, 1))))
        return rc;
    /* MLP: a router makes the layer a mixture of experts */
    if ((rc = take(r, NAME("ffn_gate_inp.weight"), &ly->ffn_gate_inp)) < 0) return rc;
    if (rc == 1) {
        if (c->n_expert <= 0) return fail(r, CM_EFORMAT, "layer %d has a router but the file gives no expert count", l);
        const char *en[3] = { "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight" };
        mdl_tensor **dst[3] = { &ly->exp_gate, &ly->exp_up, &ly->exp_down };
        for (int i = 0; i < 3; i++) {
            mdl_tensor t3;
            if ((rc = need(r, NAME(en[i]), &t3))) return rc;
            if (!(*dst[i] = mdl__expert_views(m, &t3, c->n_expert, 0, t3.ne[1])))
                return fail(r, CM_EFORMAT, "tensor '%s' has shape [%lld, %lld, %lld], expected %d experts", t3.name,
                            (long long)t3.ne[0], (long long)t3.ne[1], (long long)t3.ne[2], c->n_expert);
        }
        return 0;
    }
    if ((rc = need(r, NAME("ffn_up.weight"), &ly->w_up)) || (rc = need(r, NAME("ffn_down.weight"), &ly->w_down))) return rc;
    if ((rc = take(r, NAME("ffn_gate.weight"), &ly->w_gate)) < 0) return rc;
    if (rc == 0) {
        /* phi3: ffn_up holds gate then up, [n_embd, 2 n_ff] */
        mdl_tensor gu = ly->w_up;
        size_t rs = dt_row_size(gu.type, gu.ne[0]);
        if (c->arch != MDL_ARCH_PHI3 || gu.ne[1] != 2 * (int64_t)c->n_ff || !rs)
            return fail(r, CM_EFORMAT, "missing tensor '%s'", tn);
        ly->w_gate = gu;
        ly->w_gate.ne[1] = c->n_ff;
        ly->w_gate.nbytes = (uint64_t)c->n_ff * rs;
        ly->w_up = ly->w_gate;
        ly->w_up.data = (const uint8_t *)gu.data + (size_t)c->n_ff * rs;
    }
    return 0;
#undef NAME
}

/* llama.cpp's per-architecture hyper-parameters (llama_model::load_hparams). */
static int read_hparams(rd *r) {
    mdl_config *c = &r->m->cfg;
    int rc, a = c->arch;
    if ((rc = need_u32(r, "embedding_length", &c->n_embd)) || (rc = need_u32(r, "block_count", &c->n_layer)) ||
        (rc = need_u32(r, "attention.head_count", &c->n_head)) || (rc = need_u32(r, "context_length", &c->n_ctx_train)))
        return rc;
    if ((rc = get_f32(r, "attention.layer_norm_rms_epsilon", &c->norm_eps)) < 0) return rc;
    if (rc == 0) return fail(r, CM_EFORMAT, "missing metadata '%s.attention.layer_norm_rms_epsilon'", r->arch);
    c->n_head_kv = c->n_head;
    if ((rc = get_u32(r, "attention.head_count_kv", &c->n_head_kv)) < 0) return rc;
    if (c->n_head <= 0 || c->n_layer <= 0 || c->n_layer > 4096)
        return fail(r, CM_EFORMAT, "absurd block_count %d / head_count %d", c->n_layer, c->n_head);
    c->head_dim = c->n_embd / c->n_head;
    int vlen = -1;
    if ((rc = get_u32(r, "attention.key_length", &c->head_dim)) < 0 || (rc = get_u32(r, "attention.value_length", &vlen)) < 0)
        return rc;
    if (vlen >= 0 && vlen != c->head_dim)
        return fail(r, CM_EUNSUPPORTED, "value_length %d differs from key_length %d", vlen, c->head_dim);
    if ((rc = get_u32(r, "vocab_size", &c->n_vocab)) < 0) return rc;
    if ((rc = get_u32(r, "expert_count", &c->n_expert)) < 0 || (rc = get_u32(r, "expert_used_count", &c->n_expert_used)) < 0)
        return rc;
    if ((rc = get_u32(r, "feed_forward_length", &c->n_ff)) < 0) return rc;
    if (rc == 0 && c->n_expert == 0) return fail(r, CM_EFORMAT, "missing metadata '%s.feed_forward_length'", r->arch);
    if (c->n_expert > 0) {
        /* llama-arch mixtral: the experts are feed_forward_length wide; qwen3moe names it */
        c->n_ff_exp = c->n_ff;
        if ((rc = get_u32(r, "expert_feed_forward_length", &c->n_ff_exp)) < 0) return rc;
        c->expert_norm = 1; /* llama.cpp renormalises the top-k weights for llama and qwen3moe */
        if ((rc = get_bool(r, "expert_weights_norm", &c->expert_norm)) < 0) return rc;
        float scale = 1.0f;
        int shared = 0;
        if ((rc = get_f32(r, "expert_weights_scale", &scale)) < 0 || (rc = get_u32(r, "expert_shared_count", &shared)) < 0) return rc;
        if (scale != 1.0f || shared)
            return fail(r, CM_EUNSUPPORTED, "expert weights scale %g / %d shared experts are not implemented", scale, shared);
        if (a != MDL_ARCH_LLAMA && a != MDL_ARCH_QWEN3MOE)
            return fail(r, CM_EUNSUPPORTED, "experts in architecture '%s' are not implemented", r->arch);
    }
    c->ffn_act = MDL_ACT_SILU;
    c->has_qk_norm = a == MDL_ARCH_QWEN3 || a == MDL_ARCH_QWEN3MOE || a == MDL_ARCH_GEMMA3;
    c->has_post_norms = a == MDL_ARCH_GEMMA2 || a == MDL_ARCH_GEMMA3;
    c->rope_layout = a == MDL_ARCH_LLAMA || a == MDL_ARCH_MISTRAL ? MDL_ROPE_ADJACENT : MDL_ROPE_HALF;
    if ((rc = read_rope(r))) return rc;
    if ((rc = get_u32(r, "attention.sliding_window", &c->n_swa)) < 0) return rc;
    float scale = 0;
    if ((rc = get_f32(r, "attention.scale", &scale)) < 0) return rc;
    if (rc == 1) c->attn_scale = scale;
    if (a == MDL_ARCH_GEMMA2 || a == MDL_ARCH_GEMMA3) {
        c->ffn_act = MDL_ACT_GELU_TANH;
        c->embd_scale = sqrtf((float)c->n_embd);
        /* llama.cpp: 27B models (46 / 62 layers) scale by n_embd / n_head, the others by the head size */
        if (!(c->attn_scale > 0))
            c->attn_scale = 1.0f / sqrtf((float)(c->n_layer == (a == MDL_ARCH_GEMMA2 ? 46 : 62) ? c->n_embd / c->n_head : c->head_dim));
        if (a == MDL_ARCH_GEMMA2) {
            c->attn_softcap = 50.0f; /* llama.cpp's defaults for gemma2 */
            c->final_softcap = 30.0f;
            if (!c->n_swa) c->n_swa = 4096;
        } else {
            c->rope_swa_own = 1;
            c->rope_base_swa = 10000.0f; /* llama.cpp: gemma3's sliding layers use base 10000, unscaled */
            if ((rc = get_f32(r, "rope.freq_base_swa", &c->rope_base_swa)) < 0) return rc;
        }
        if ((rc = get_f32(r, "attn_logit_softcapping", &c->attn_softcap)) < 0 ||
            (rc = get_f32(r, "final_logit_softcapping", &c->final_softcap)) < 0)
            return rc;
    }
    int causal = 1;
    if ((rc = get_bool(r, "attention.causal", &causal)) < 0) return rc;
    if (!causal) return fail(r, CM_EUNSUPPORTED, "non-causal (bidirectional) attention is not implemented");
    int pooling = -1;
    if ((rc = get_u32(r, "pooling_type", &pooling)) < 0) return rc;
    if (pooling >= 0) {
        /* llama.cpp: 0 none, 1 mean, 2 cls, 3 last */
        static const int map[] = { MDL_POOL_NONE, MDL_POOL_MEAN, MDL_POOL_CLS, MDL_POOL_LAST };
        if (pooling > 3) return fail(r, CM_EUNSUPPORTED, "pooling_type %d (none, mean, cls, last)", pooling);
        c->pooling = map[pooling];
        c->embd_normalize = c->pooling != MDL_POOL_NONE;
    }
    return 0;
}

/* Which layers slide: gemma2 every other layer from 0, gemma3 five of every six (llama.cpp's
 * swa patterns 2 and 6), the others all layers when the file gives a window. A
 * sliding_window_pattern key (a period, or one bool per layer) overrides the pattern. */
static int sliding_layers(rd *r) {
    mdl_model *m = r->m;
    mdl_config *c = &m->cfg;
    if (c->n_swa <= 0) return 0;
    int period = c->arch == MDL_ARCH_GEMMA2 ? 2 : c->arch == MDL_ARCH_GEMMA3 ? 6 : 1;
    char key[160];
    key_of(r, "attention.sliding_window_pattern", key, sizeof key);
    const gguf_value *v = gguf_find(r->g, key);
    if (v) {
        mark_key(r, key);
        if (v->type == GGUF_ARRAY) {
            if (v->v.arr.n != (uint64_t)c->n_layer || v->v.arr.elem_type != GGUF_BOOL)
                return fail(r, CM_EFORMAT, "metadata '%s' must hold one bool per layer", key);
            for (int l = 0; l < c->n_layer; l++) m->layers[l].swa = gguf_arr_i64(v, (uint64_t)l) != 0;
            return 0;
        }
        int p;
        if (get_u32(r, "attention.sliding_window_pattern", &p) != 1 || p < 0) return fail(r, CM_EFORMAT, "metadata '%s' is not a period", key);
        period = p;
    }
    for (int l = 0; l < c->n_layer; l++) m->layers[l].swa = period <= 1 || l % period < period - 1;
    return 0;
}

int mdl_from_gguf(gguf_ctx *g, mdl_model **out, char *err, size_t errlen) {
    *out = NULL;
    const char *path = gguf_path(g);
    char *arch = NULL;
    if (gguf_get_strdup(g, "general.architecture", &arch)) {
        snprintf(err, errlen, "%s: missing or invalid 'general.architecture'", path);
        return CM_EFORMAT;
    }
    mdl_model *m = calloc(1, sizeof *m);
    rd r = { .g = g, .m = m, .path = path, .arch = arch, .err = err, .errlen = errlen };
    r.kv_used = calloc((size_t)gguf_n_kv(g) + 1, 1);
    r.t_used = calloc((size_t)gguf_n_tensors(g) + 1, 1);
    int rc;
    if (!m || !r.kv_used || !r.t_used) {
        snprintf(err, errlen, "%s: out of memory", path);
        rc = CM_ENOMEM;
        goto done;
    }
    mdl_config *c = &m->cfg;
    m->format = MDL_FORMAT_GGUF;
    snprintf(c->arch_name, sizeof c->arch_name, "%s", arch);
    c->arch = mdl_arch_from_name(arch);
    if (c->arch < 0 || c->arch == MDL_ARCH_MIXTRAL) { /* GGUF mixtral is "llama" with experts */
        rc = fail(&r, CM_EUNSUPPORTED, "unsupported architecture '%s' (supported: llama, mistral, qwen2, qwen3, qwen3moe, gemma2, "
                  "gemma3, phi3)", arch);
        goto done;
    }
    char *name = NULL;
    if (gguf_get_strdup(g, "general.name", &name) == 0) snprintf(c->name, sizeof c->name, "%s", name);
    free(name);
    if ((rc = read_hparams(&r))) goto done;

    const gguf_value *toks = NULL;
    if (!c->n_vocab && gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &toks) == 0) c->n_vocab = (int)toks->v.arr.n;
    if ((rc = need(&r, "token_embd.weight", &m->tok_embd)) || (rc = take_vec(&r, "output_norm.weight", &m->out_norm, 1))) goto done;
    if (!c->n_vocab) c->n_vocab = (int)m->tok_embd.ne[1];
    if ((rc = take(&r, "output.weight", &m->output)) < 0) goto done;
    if (rc == 0) {
        m->output = m->tok_embd;
        c->tied_output = 1;
    }
    if (!(m->layers = calloc((size_t)c->n_layer, sizeof *m->layers))) {
        rc = fail(&r, CM_ENOMEM, "out of memory");
        goto done;
    }
    for (int l = 0; l < c->n_layer; l++)
        if ((rc = layer_tensors(&r, l))) goto done;
    if ((rc = sliding_layers(&r)) || (rc = check_keys(&r)) || (rc = check_tensors(&r))) goto done;
    m->gguf = g;
    if ((rc = mdl__validate(m, path, err, errlen))) m->gguf = NULL; /* the caller still owns g on failure */
done:
    free(r.kv_used);
    free(r.t_used);
    free(arch);
    if (rc) {
        if (m) m->gguf = NULL;
        mdl_free(m);
        return rc;
    }
    *out = m;
    return 0;
}
