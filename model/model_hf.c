/* model_hf: a Hugging Face config.json (transformers 4.x and 5.x conventions) and the
 * checkpoint's tensor names into the model description.
 *
 * config.json: every key must be one this reader interprets or one known to change nothing
 * at inference (training switches, token ids, bookkeeping); any other key is refused with
 * its name, so a setting the engine does not implement is never silently ignored. A value
 * that changes the network and is not implemented (attention_bias true, a rope type we do
 * not have, bidirectional attention) is refused too. Keys a file leaves out take
 * transformers' defaults for that model class (the tables below), as transformers would.
 *
 * RoPE: transformers 5 writes "rope_parameters" ({"rope_type", "rope_theta", "factor", ...},
 * or one such object per layer type for gemma3: {"full_attention": {...},
 * "sliding_attention": {...}}); 4.x wrote "rope_theta" + "rope_scaling" (+ gemma3's
 * "rope_local_base_freq"). Both are read; rope_parameters wins where both give a value.
 *
 * A vision + text gemma3 config.json (model_type "gemma3") gives its text model: text_config
 * read with transformers' Gemma3TextConfig defaults for the keys it leaves out, the tensors
 * under language_model.model. (4.x) or model.language_model. (5.x); the vision tower and the
 * projector are not loaded.
 *
 * Tensors (prefix "model."): layers.N.{input_layernorm, post_attention_layernorm,
 * self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj}; gemma's
 * pre_feedforward_layernorm / post_feedforward_layernorm (post_attention_layernorm is then
 * the post-attention norm); phi3's fused self_attn.qkv_proj and mlp.gate_up_proj (split into
 * views of their rows); qwen3_moe's mlp.gate (router) + mlp.experts.E.{gate,up,down}_proj;
 * mixtral's block_sparse_moe.gate + block_sparse_moe.experts.E.{w1,w3,w2}; and transformers
 * 5's fused experts mlp.experts.gate_up_proj [E, 2I, H] + mlp.experts.down_proj [E, H, I]
 * with mlp.gate as the router. Gemma's norm weights are stored as w for (1 + w): the 1 is
 * added at load.
 */
#include "model_internal.h"
#include "dtype.h"
#include "../common/cm_err.h"
#include "../common/cm_json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- per-model-type tables ------------------------------------------------------------------ */

/* Keys that change nothing at inference, accepted for every model type. */
static const char *const k_ignored[] = {
    "_name_or_path", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "model_type",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "use_cache",
    "initializer_range", "attention_dropout", "resid_pdrop", "embd_pdrop", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "cache_implementation", "output_hidden_states",
    "output_attentions", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
    "problem_type", "tokenizer_class", "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads",
    "finetuning_task", "prefix", "task_specific_params", "num_labels", "is_decoder", "add_cross_attention",
    "tie_encoder_decoder", "cross_attention_hidden_size", "_attn_implementation_autoset", "use_return_dict",
    /* generation defaults older configs carry (generation_config.json governs sampling) */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
};

/* Keys read for every model type. */
static const char *const k_common[] = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings",
    "attention_bias", "intermediate_size", "quantization_config",
};

typedef struct {
    const char *model_type;
    int         arch;
    const char *keys[16];      /* read for this type beyond k_common */
    int         max_pos;       /* transformers' default max_position_embeddings */
    double      eps, theta;    /* default rms_norm_eps, rope_theta */
    int         tied;          /* default tie_word_embeddings */
} hf_type;

static const hf_type types[] = {
    { "llama", MDL_ARCH_LLAMA, { "hidden_act", "mlp_bias", "pretraining_tp", "layer_types" }, 2048, 1e-6, 10000, 0 },
    { "mistral", MDL_ARCH_MISTRAL, { "hidden_act", "sliding_window", "layer_types" }, 4096 * 32, 1e-6, 10000, 0 },
    { "qwen2", MDL_ARCH_QWEN2, { "hidden_act", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types" },
      32768, 1e-6, 10000, 0 },
    { "qwen3", MDL_ARCH_QWEN3, { "hidden_act", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types" },
      32768, 1e-6, 10000, 0 },
    { "qwen3_moe", MDL_ARCH_QWEN3MOE,
      { "hidden_act", "use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "decoder_sparse_step",
        "moe_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob",
        "mlp_only_layers" },
      32768, 1e-6, 10000, 0 },
    { "mixtral", MDL_ARCH_MIXTRAL,
      { "hidden_act", "sliding_window", "num_local_experts", "num_experts", "num_experts_per_tok", "layer_types" },
      4096 * 32, 1e-5, 1e6, 0 },
    { "gemma2", MDL_ARCH_GEMMA2,
      { "hidden_act", "hidden_activation", "query_pre_attn_scalar", "sliding_window", "sliding_window_size", "layer_types",
        "final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention" },
      8192, 1e-6, 10000, 1 },
    { "gemma3_text", MDL_ARCH_GEMMA3,
      { "hidden_act", "hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types",
        "final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention", "rope_local_base_freq",
        "sliding_window_pattern", "_sliding_window_pattern" },
      131072, 1e-6, 1e6, 1 },
    { "phi3", MDL_ARCH_PHI3,
      { "hidden_act", "sliding_window", "original_max_position_embeddings", "partial_rotary_factor", "layer_types" }, 4096, 1e-5, 10000, 0 },
};

/* ---- helpers ------------------------------------------------------------------------------- */

typedef struct {
    const char *cfg;   /* config.json's path, for messages */
    char       *err;
    size_t      errlen;
    const cm_json *root;     /* the model's settings (config.json, or a vision model's text_config) */
    const cm_json *fallback; /* class defaults for keys root leaves out (a diff-serialized text_config), or NULL */
} ctx;

static int bad(ctx *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(ctx *x, int code, const char *fmt, ...) {
    int n = snprintf(x->err, x->errlen, "%s: ", x->cfg);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < x->errlen) vsnprintf(x->err + n, x->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

static int is_null(const cm_json *v) { return !v || v->type == CM_JSON_NULL; }

/* The object a key of o is read from: o itself, or the class defaults when o is the root and
 * leaves the key out. */
static const cm_json *src_of(const ctx *x, const cm_json *o, const char *key) {
    return o == x->root && x->fallback && !cm_json_get(o, key) ? x->fallback : o;
}

static const cm_json *member(const ctx *x, const cm_json *o, const char *key) { return cm_json_get(src_of(x, o, key), key); }

static int str_of(const ctx *x, const cm_json *o, const char *key, const char **out) {
    return cm_json_get_str(src_of(x, o, key), key, out);
}

/* Integer key: 1 found, 0 absent or null (required: error), < 0 error. */
static int get_int(ctx *x, const cm_json *o, const char *key, int required, int64_t lo, int64_t hi, int *out) {
    int64_t v;
    int rc = cm_json_get_int(src_of(x, o, key), key, &v);
    if (rc == CM_ENOTFOUND) return required ? bad(x, CM_EFORMAT, "missing key '%s'", key) : 0;
    if (rc) return bad(x, CM_EFORMAT, "'%s' is not an integer", key);
    if (v < lo || v > hi) return bad(x, CM_EFORMAT, "'%s' = %lld is out of range [%lld, %lld]", key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 1;
}

/* Number key in (lo, hi]: 1 found, 0 absent or null, < 0 error. */
static int get_num(ctx *x, const cm_json *o, const char *key, double lo, double hi, double *out) {
    double v;
    int rc = cm_json_get_num(src_of(x, o, key), key, &v);
    if (rc == CM_ENOTFOUND) return 0;
    if (rc || !(v > lo && v <= hi)) return bad(x, CM_EFORMAT, "'%s' is not a number in (%g, %g]", key, lo, hi);
    *out = v;
    return 1;
}

static int get_bool(ctx *x, const cm_json *o, const char *key, int *out) {
    int rc = cm_json_get_bool(src_of(x, o, key), key, out);
    if (rc == CM_ENOTFOUND) return 0;
    return rc ? bad(x, CM_EFORMAT, "'%s' is not a boolean", key) : 1;
}

static int in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n && list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

/* ---- rope ---------------------------------------------------------------------------------- */

/* One rope parameter set as transformers describes it. */
typedef struct {
    const char *type;       /* "default", "linear", "llama3", "yarn", "longrope" */
    double theta;           /* 0: not given */
    double factor, low, high, attn_factor, beta_fast, beta_slow, mscale, mscale_all_dim, partial;
    int    orig;            /* 0: not given */
    int    truncate;        /* yarn: floor/ceil the correction range (default true) */
    const cm_json *long_f, *short_f;
} rope_in;

static int rope_read(ctx *x, const cm_json *o, const char *what, rope_in *r) {
    static const char *const keys[] = { "rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                                        "mscale", "mscale_all_dim", "truncate", "short_factor", "long_factor",
                                        "partial_rotary_factor" };
    if (o->type != CM_JSON_OBJECT) return bad(x, CM_EFORMAT, "'%s' must be null or an object", what);
    for (const cm_json *v = o->child; v; v = v->next)
        if (!in_list(v->key, keys, sizeof keys / sizeof *keys))
            return bad(x, CM_EUNSUPPORTED, "'%s' has key '%.40s', a rope setting this engine does not implement", what, v->key);
    if (cm_json_get_str(o, "rope_type", &r->type) && cm_json_get_str(o, "type", &r->type)) r->type = "default";
    int rc;
    if ((rc = get_num(x, o, "rope_theta", 0, 1e12, &r->theta)) < 0 || (rc = get_num(x, o, "factor", 0, 1e6, &r->factor)) < 0 ||
        (rc = get_num(x, o, "low_freq_factor", 0, 1e6, &r->low)) < 0 || (rc = get_num(x, o, "high_freq_factor", 0, 1e6, &r->high)) < 0 ||
        (rc = get_num(x, o, "attention_factor", 0, 1e6, &r->attn_factor)) < 0 ||
        (rc = get_num(x, o, "beta_fast", 0, 1e6, &r->beta_fast)) < 0 || (rc = get_num(x, o, "beta_slow", 0, 1e6, &r->beta_slow)) < 0 ||
        (rc = get_num(x, o, "mscale", 0, 1e6, &r->mscale)) < 0 || (rc = get_num(x, o, "mscale_all_dim", 0, 1e6, &r->mscale_all_dim)) < 0 ||
        (rc = get_num(x, o, "partial_rotary_factor", 0, 1, &r->partial)) < 0 ||
        (rc = get_int(x, o, "original_max_position_embeddings", 0, 1, 1 << 30, &r->orig)) < 0 ||
        (rc = get_bool(x, o, "truncate", &r->truncate)) < 0)
        return rc;
    const cm_json *lf = cm_json_get(o, "long_factor"), *sf = cm_json_get(o, "short_factor");
    r->long_f = is_null(lf) ? NULL : lf;
    r->short_f = is_null(sf) ? NULL : sf;
    return 0;
}

static float *factor_array(ctx *x, mdl_model *m, const cm_json *a, const char *key, int n) {
    if (a->type != CM_JSON_ARRAY || a->n != (size_t)n) {
        bad(x, CM_EFORMAT, "rope '%s' must be a list of %d numbers (rope dimensions / 2)", key, n);
        return NULL;
    }
    float *f = mdl__alloc(m, sizeof *f * (size_t)n);
    if (!f) { bad(x, CM_ENOMEM, "out of memory"); return NULL; }
    int i = 0;
    for (const cm_json *v = a->child; v; v = v->next, i++) {
        if (v->type != CM_JSON_NUMBER || !(v->num > 0) || !isfinite(v->num)) {
            bad(x, CM_EFORMAT, "rope '%s'[%d] is not a positive number", key, i);
            return NULL;
        }
        f[i] = (float)v->num;
    }
    return f;
}

/* The global (full-attention) rope of cfg from r. max_pos / top_orig: the config's
 * max_position_embeddings and top-level original_max_position_embeddings (phi3), 0 if none. */
static int rope_apply(ctx *x, mdl_model *m, const rope_in *r, int max_pos, int top_orig) {
    mdl_config *c = &m->cfg;
    c->rope_base = (float)r->theta;
    c->rope_factor = 1.0f;
    c->rope_attn_factor = 1.0f;
    const char *t = r->type;
    if (c->arch == MDL_ARCH_PHI3 && (!strcmp(t, "su") || !strcmp(t, "yarn"))) t = "longrope"; /* transformers' phi3 legacy names */
    if (!strcmp(t, "default")) {
        c->rope_scaling = MDL_ROPE_SCALING_NONE;
        return 0;
    }
    int orig = c->arch == MDL_ARCH_PHI3 && top_orig ? top_orig : r->orig ? r->orig : max_pos;
    if (!strcmp(t, "linear") || !strcmp(t, "llama3") || !strcmp(t, "yarn")) {
        if (!(r->factor > 0) && strcmp(t, "yarn")) return bad(x, CM_EFORMAT, "rope scaling '%s' needs a numeric 'factor'", t);
    }
    if (!strcmp(t, "linear")) {
        c->rope_scaling = MDL_ROPE_SCALING_LINEAR;
        c->rope_factor = (float)r->factor;
    } else if (!strcmp(t, "llama3")) {
        if (!(r->low > 0) || !(r->high > 0) || !r->orig)
            return bad(x, CM_EFORMAT, "rope scaling 'llama3' needs low_freq_factor, high_freq_factor and original_max_position_embeddings");
        if (r->high <= r->low) return bad(x, CM_EFORMAT, "rope scaling high_freq_factor must exceed low_freq_factor");
        c->rope_scaling = MDL_ROPE_SCALING_LLAMA3;
        c->rope_factor = (float)r->factor;
        c->rope_low_freq_factor = (float)r->low;
        c->rope_high_freq_factor = (float)r->high;
        c->rope_orig_ctx = r->orig;
    } else if (!strcmp(t, "yarn")) {
        c->rope_scaling = MDL_ROPE_SCALING_YARN;
        c->rope_orig_ctx = orig;
        double f = r->factor > 0 ? r->factor : (double)max_pos / orig;
        c->rope_factor = (float)f;
        c->rope_beta_fast = r->beta_fast > 0 ? (float)r->beta_fast : 32.0f;
        c->rope_beta_slow = r->beta_slow > 0 ? (float)r->beta_slow : 1.0f;
        /* transformers: attention_factor, else get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)
         * when both are given, else get_mscale(f) = 0.1 ln(f) + 1 (1 for f <= 1) */
        double a = r->attn_factor;
        if (!(a > 0)) {
#define MSCALE(s, ms) ((s) <= 1 ? 1.0 : 0.1 * (ms) * log(s) + 1.0)
            a = r->mscale > 0 && r->mscale_all_dim > 0 ? MSCALE(f, r->mscale) / MSCALE(f, r->mscale_all_dim) : MSCALE(f, 1.0);
#undef MSCALE
        }
        c->rope_attn_factor = (float)a;
    } else if (!strcmp(t, "longrope")) {
        if (!r->long_f || !r->short_f) return bad(x, CM_EFORMAT, "rope scaling 'longrope' needs long_factor and short_factor");
        c->rope_scaling = MDL_ROPE_SCALING_LONGROPE;
        c->rope_orig_ctx = orig;
        double f = r->factor > 0 ? r->factor : (double)max_pos / orig;
        c->rope_factor = (float)f;
        double a = r->attn_factor > 0 ? r->attn_factor : f <= 1 ? 1.0 : sqrt(1 + log(f) / log((double)orig));
        c->rope_attn_factor = (float)a;
        if (!(c->rope_long_factor = factor_array(x, m, r->long_f, "long_factor", c->rope_dim / 2)) ||
            !(c->rope_short_factor = factor_array(x, m, r->short_f, "short_factor", c->rope_dim / 2)))
            return CM_EFORMAT;
    } else {
        return bad(x, CM_EUNSUPPORTED, "unsupported rope_scaling type '%.32s' (supported: linear, llama3, yarn, longrope)", t);
    }
    if (c->rope_scaling == MDL_ROPE_SCALING_YARN && !r->truncate) {
        /* truncate false: the correction range is used unrounded; the kernels round it */
        return bad(x, CM_EUNSUPPORTED, "yarn with 'truncate': false is not implemented");
    }
    return 0;
}

/* Reads rope_parameters / rope_theta / rope_scaling (+ gemma3's per-layer-type rope). */
static int read_rope(ctx *x, mdl_model *m, const cm_json *o, const hf_type *ht, int max_pos) {
    mdl_config *c = &m->cfg;
    int rc;
    double partial = 0;
    if ((rc = get_num(x, o, "partial_rotary_factor", 0, 1, &partial)) < 0) return rc;
    double top_theta = 0;
    if ((rc = get_num(x, o, "rope_theta", 0, 1e12, &top_theta)) < 0) return rc;
    int top_orig = 0;
    if ((rc = get_int(x, o, "original_max_position_embeddings", 0, 1, 1 << 30, &top_orig)) < 0) return rc;

    rope_in full = { .type = "default", .truncate = 1 }, slide = { .type = "default", .truncate = 1 };
    int per_type = 0;
    const cm_json *rp = member(x, o, "rope_parameters"), *rs = member(x, o, "rope_scaling");
    if (!is_null(rp)) {
        if (rp->type != CM_JSON_OBJECT) return bad(x, CM_EFORMAT, "'rope_parameters' must be an object");
        const cm_json *fa = cm_json_get(rp, "full_attention"), *sa = cm_json_get(rp, "sliding_attention");
        if (fa || sa) {
            for (const cm_json *v = rp->child; v; v = v->next)
                if (strcmp(v->key, "full_attention") && strcmp(v->key, "sliding_attention"))
                    return bad(x, CM_EFORMAT, "'rope_parameters' mixes layer types with key '%.40s'", v->key);
            per_type = 1;
            if (fa && (rc = rope_read(x, fa, "rope_parameters.full_attention", &full))) return rc;
            if (sa && (rc = rope_read(x, sa, "rope_parameters.sliding_attention", &slide))) return rc;
        } else if ((rc = rope_read(x, rp, "rope_parameters", &full))) {
            return rc;
        }
    }
    if (!is_null(rs)) {
        /* 4.x: rope_scaling carries the scaling (gemma3: of the full-attention layers); the
         * values of rope_parameters win where both give one */
        rope_in legacy = { .type = "default", .truncate = 1 };
        if ((rc = rope_read(x, rs, "rope_scaling", &legacy))) return rc;
        if (cm_json_get_str(rs, "rope_type", &legacy.type) && cm_json_get_str(rs, "type", &legacy.type))
            return bad(x, CM_EFORMAT, "'rope_scaling' must be null or an object with a string 'rope_type' or 'type'");
        if (is_null(rp)) full = legacy;
        else if (strcmp(full.type, legacy.type) && strcmp(legacy.type, "default"))
            return bad(x, CM_EFORMAT, "'rope_scaling' type '%.20s' disagrees with rope_parameters' '%.20s'", legacy.type, full.type);
    }
    if (!(full.theta > 0)) full.theta = top_theta > 0 ? top_theta : ht->theta;
    if (!(full.partial > 0)) full.partial = partial > 0 ? partial : 1.0;
    c->rope_dim = (int)(c->head_dim * full.partial);
    if (c->rope_dim % 2 || c->rope_dim <= 0)
        return bad(x, CM_EFORMAT, "partial_rotary_factor %g gives an odd rope dimension %d", full.partial, c->rope_dim);
    if ((rc = rope_apply(x, m, &full, max_pos, top_orig))) return rc;

    if (c->arch == MDL_ARCH_GEMMA3) {
        /* sliding layers: their own base (rope_local_base_freq; 10000 by default), unscaled */
        double local = 10000.0;
        if ((rc = get_num(x, o, "rope_local_base_freq", 0, 1e12, &local)) < 0) return rc;
        if (per_type && slide.theta > 0) local = slide.theta;
        if (per_type && strcmp(slide.type, "default"))
            return bad(x, CM_EUNSUPPORTED, "rope scaling '%.20s' of the sliding-window layers is not implemented", slide.type);
        c->rope_swa_own = 1;
        c->rope_base_swa = (float)local;
    } else if (per_type) {
        return bad(x, CM_EUNSUPPORTED, "per-layer-type rope_parameters are only implemented for gemma3");
    }
    return 0;
}

/* ---- layers --------------------------------------------------------------------------------- */

/* layer_types: "full_attention" / "sliding_attention" per layer; 1 when given. */
static int read_layer_types(ctx *x, mdl_model *m, const cm_json *o) {
    const cm_json *lt = member(x, o, "layer_types");
    if (is_null(lt)) return 0;
    if (lt->type != CM_JSON_ARRAY || lt->n != (size_t)m->cfg.n_layer)
        return bad(x, CM_EFORMAT, "'layer_types' must list one type for each of the %d layers", m->cfg.n_layer);
    int l = 0;
    for (const cm_json *v = lt->child; v; v = v->next, l++) {
        if (v->type == CM_JSON_STRING && !strcmp(v->str, "full_attention")) m->layers[l].swa = 0;
        else if (v->type == CM_JSON_STRING && !strcmp(v->str, "sliding_attention")) m->layers[l].swa = 1;
        else return bad(x, CM_EUNSUPPORTED, "layer_types[%d] is not 'full_attention' or 'sliding_attention'", l);
    }
    return 1;
}

static int read_sliding(ctx *x, mdl_model *m, const cm_json *o, const hf_type *ht) {
    mdl_config *c = &m->cfg;
    int rc, a = c->arch, window = 0;
    if ((rc = get_int(x, o, "sliding_window", 0, 1, 1 << 30, &window)) < 0) return rc;
    int gemma = a == MDL_ARCH_GEMMA2 || a == MDL_ARCH_GEMMA3, older = 0;
    if (a == MDL_ARCH_GEMMA2 && (rc = get_int(x, o, "sliding_window_size", 0, 1, 1 << 30, &older)) < 0) return rc;
    if (older && window && older != window)
        return bad(x, CM_EFORMAT, "'sliding_window' %d and 'sliding_window_size' %d disagree", window, older);
    if (older) window = older;
    if (gemma && !member(x, o, "sliding_window") && !older) window = 4096; /* transformers' gemma default; null: none */
    if (a == MDL_ARCH_QWEN2 || a == MDL_ARCH_QWEN3 || a == MDL_ARCH_QWEN3MOE) {
        int use = 0, maxwl = 28; /* transformers' defaults */
        if ((rc = get_bool(x, o, "use_sliding_window", &use)) < 0 ||
            (rc = get_int(x, o, "max_window_layers", 0, 0, 1 << 20, &maxwl)) < 0)
            return rc;
        if (!use) window = 0;
        if ((rc = read_layer_types(x, m, o)) < 0) return rc;
        if (rc == 0)
            for (int l = 0; l < c->n_layer; l++) m->layers[l].swa = window > 0 && l >= maxwl;
    } else if (gemma) {
        if ((rc = read_layer_types(x, m, o)) < 0) return rc;
        if (rc == 0) {
            int period = 2;
            if (a == MDL_ARCH_GEMMA3) {
                period = 6; /* transformers 5 keeps the old key as "_sliding_window_pattern" */
                if ((rc = get_int(x, o, "sliding_window_pattern", 0, 1, 1 << 20, &period)) < 0 ||
                    (rc == 0 && (rc = get_int(x, o, "_sliding_window_pattern", 0, 1, 1 << 20, &period)) < 0))
                    return rc;
            }
            for (int l = 0; l < c->n_layer; l++) m->layers[l].swa = (l + 1) % period != 0;
        }
    } else {
        if ((rc = read_layer_types(x, m, o)) < 0) return rc;
        if (rc == 0)
            for (int l = 0; l < c->n_layer; l++) m->layers[l].swa = window > 0;
    }
    (void)ht;
    /* transformers: a sliding layer without a window (sliding_window null) attends to everything */
    int any = 0;
    for (int l = 0; l < c->n_layer; l++) {
        if (window <= 0) m->layers[l].swa = 0;
        any |= m->layers[l].swa;
    }
    c->n_swa = any ? window : 0;
    return 0;
}

/* qwen3_moe: layer l is sparse unless listed in mlp_only_layers, every decoder_sparse_step-th. */
static int read_moe(ctx *x, mdl_model *m, const cm_json *o, uint8_t *sparse) {
    mdl_config *c = &m->cfg;
    int rc, ne = 0, ne2 = 0, has1, has2;
    if ((has1 = get_int(x, o, "num_experts", 0, 0, MDL_MAX_EXPERTS, &ne)) < 0 ||
        (has2 = get_int(x, o, "num_local_experts", 0, 0, MDL_MAX_EXPERTS, &ne2)) < 0)
        return has1 < 0 ? has1 : has2;
    if (has1 && has2 && ne != ne2) return bad(x, CM_EFORMAT, "'num_experts' %d and 'num_local_experts' %d disagree", ne, ne2);
    c->n_expert = has1 ? ne : ne2;
    if (!has1 && !has2) c->n_expert = c->arch == MDL_ARCH_MIXTRAL ? 8 : 128; /* transformers' defaults */
    c->n_expert_used = c->arch == MDL_ARCH_MIXTRAL ? 2 : 8;
    if ((rc = get_int(x, o, "num_experts_per_tok", 0, 1, MDL_MAX_EXPERTS, &c->n_expert_used)) < 0) return rc;
    if (c->arch == MDL_ARCH_MIXTRAL) {
        c->expert_norm = 1; /* mixtral always renormalises its top-k */
        c->n_ff_exp = c->n_ff;
        c->n_ff = 0;
        for (int l = 0; l < c->n_layer; l++) sparse[l] = c->n_expert > 0;
        return 0;
    }
    c->n_ff_exp = 768;
    int step = 1;
    if ((rc = get_int(x, o, "moe_intermediate_size", 0, 1, 1 << 22, &c->n_ff_exp)) < 0 ||
        (rc = get_int(x, o, "decoder_sparse_step", 0, 1, 1 << 20, &step)) < 0 ||
        (rc = get_bool(x, o, "norm_topk_prob", &c->expert_norm)) < 0)
        return rc;
    for (int l = 0; l < c->n_layer; l++) sparse[l] = c->n_expert > 0 && (l + 1) % step == 0;
    const cm_json *only = member(x, o, "mlp_only_layers");
    if (!is_null(only)) {
        if (only->type != CM_JSON_ARRAY) return bad(x, CM_EFORMAT, "'mlp_only_layers' must be a list of layer indices");
        for (const cm_json *v = only->child; v; v = v->next) {
            if (v->type != CM_JSON_NUMBER || !v->is_int || v->i < 0 || v->i >= c->n_layer)
                return bad(x, CM_EFORMAT, "'mlp_only_layers' holds %g, not a layer index below %d", v->num, c->n_layer);
            sparse[v->i] = 0;
        }
    }
    int any = 0;
    for (int l = 0; l < c->n_layer; l++) any |= sparse[l];
    if (!any) c->n_expert = c->n_expert_used = c->n_ff_exp = 0;
    return 0;
}

/* Sentence-transformers files beside the model (Qwen3-Embedding style): the pooling mode in
 * 1_Pooling/config.json and whether modules.json ends with a Normalize module. */
static int read_pooling(ctx *x, mdl_model *m, const char *dir) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/1_Pooling/config.json", dir);
    if (stat(p, &sb) != 0) return 0;
    FILE *f = fopen(p, "rb");
    if (!f || sb.st_size > (1 << 20)) {
        if (f) fclose(f);
        return bad(x, CM_EIO, "%s: cannot read", p);
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    size_t n = buf ? fread(buf, 1, (size_t)sb.st_size, f) : 0;
    fclose(f);
    cm_json_doc *doc = NULL;
    char jerr[128];
    int rc = buf && n == (size_t)sb.st_size ? cm_json_parse(buf, n, &doc, jerr, sizeof jerr) : CM_EIO;
    free(buf);
    if (rc) return bad(x, CM_EFORMAT, "%s: unreadable JSON", p);
    const cm_json *o = cm_json_root(doc);
    static const struct { const char *key; int pool; } modes[] = {
        { "pooling_mode_lasttoken", MDL_POOL_LAST }, { "pooling_mode_mean_tokens", MDL_POOL_MEAN },
        { "pooling_mode_cls_token", MDL_POOL_CLS },  { "pooling_mode_max_tokens", -1 },
        { "pooling_mode_mean_sqrt_len_tokens", -1 },  { "pooling_mode_weightedmean_tokens", -1 },
    };
    int chosen = 0;
    rc = 0;
    for (size_t i = 0; i < sizeof modes / sizeof *modes && !rc; i++) {
        int on = 0;
        if (cm_json_get_bool(o, modes[i].key, &on) == 0 && on) {
            if (modes[i].pool < 0 || chosen) rc = bad(x, CM_EUNSUPPORTED, "%s: pooling '%s' is not implemented", p, modes[i].key);
            else chosen = modes[i].pool;
        }
    }
    cm_json_free(doc);
    if (rc) return rc;
    m->cfg.pooling = chosen;
    snprintf(p, sizeof p, "%s/modules.json", dir);
    f = fopen(p, "rb");
    if (f) {
        char tmp[8192];
        size_t k = fread(tmp, 1, sizeof tmp - 1, f);
        tmp[k] = 0;
        fclose(f);
        m->cfg.embd_normalize = strstr(tmp, "sentence_transformers.models.Normalize") != NULL;
    }
    return 0;
}

/* ---- quantization_config (FP8 checkpoints) -------------------------------------------------- */

/* Checks that every key of o is in keys; names the first that is not. */
static int known_keys(ctx *x, const cm_json *o, const char *what, const char *const *keys, size_t n) {
    for (const cm_json *v = o->child; v; v = v->next)
        if (!in_list(v->key, keys, n))
            return bad(x, CM_EUNSUPPORTED, "%s has key '%.40s', a quantization setting this engine does not implement", what, v->key);
    return 0;
}

static int str_is(const cm_json *o, const char *key, const char *want) {
    const char *s;
    return cm_json_get_str(o, key, &s) == 0 && !strcmp(s, want);
}

/* A null or empty object (sparsity_config, transform_config: nothing to apply). */
static int empty_or_null(const cm_json *v) { return is_null(v) || (v->type == CM_JSON_OBJECT && v->n == 0); }

/* compressed-tensors QuantizationArgs of FP8 (8-bit float, symmetric). strategies: the ones
 * accepted, "|"-separated; dyn: -1 any, 0 static only, 1 dynamic only. */
static int ct_args(ctx *x, const cm_json *a, const char *what, const char *strategies, int dyn) {
    static const char *const keys[] = { "num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
                                        "actorder", "observer", "observer_kwargs", "scale_dtype", "zp_dtype" };
    if (a->type != CM_JSON_OBJECT) return bad(x, CM_EFORMAT, "%s must be an object", what);
    int rc;
    if ((rc = known_keys(x, a, what, keys, sizeof keys / sizeof *keys))) return rc;
    int64_t bits = 8;
    const char *type = "int", *strategy = "tensor";
    int sym = 1, dynamic = 0;
    if (cm_json_get_int(a, "num_bits", &bits) == CM_EFORMAT) return bad(x, CM_EFORMAT, "%s.num_bits is not an integer", what);
    cm_json_get_str(a, "type", &type);
    cm_json_get_str(a, "strategy", &strategy);
    cm_json_get_bool(a, "symmetric", &sym);
    const cm_json *d = cm_json_get(a, "dynamic");
    if (d && d->type == CM_JSON_STRING) return bad(x, CM_EUNSUPPORTED, "%s.dynamic '%.20s' is not supported", what, d->str);
    cm_json_get_bool(a, "dynamic", &dynamic);
    if (bits != 8 || strcmp(type, "float"))
        return bad(x, CM_EUNSUPPORTED, "%s: %lld-bit %.16s quantization is not supported (FP8: 8-bit float)", what, (long long)bits, type);
    if (!sym) return bad(x, CM_EUNSUPPORTED, "%s: asymmetric quantization is not supported", what);
    char list[64];
    snprintf(list, sizeof list, "|%s|", strategies);
    char key[32];
    snprintf(key, sizeof key, "|%.24s|", strategy);
    if (!strstr(list, key))
        return bad(x, CM_EUNSUPPORTED, "%s: strategy '%.24s' is not implemented (%s: %s)", what, strategy,
                   !strcmp(strategy, "block") || !strcmp(strategy, "group") ? "block-wise scales are not" : "supported", strategies);
    if (dyn >= 0 && dynamic != dyn)
        return bad(x, CM_EUNSUPPORTED, "%s: %s scales with strategy '%s' are not supported", what, dynamic ? "dynamic" : "static", strategy);
    const cm_json *g = cm_json_get(a, "group_size"), *b = cm_json_get(a, "block_structure"), *ao = cm_json_get(a, "actorder");
    if (!is_null(g) || !is_null(b)) return bad(x, CM_EUNSUPPORTED, "%s: group or block scales are not implemented", what);
    if (!is_null(ao) && !(ao->type == CM_JSON_BOOL && !ao->boolean))
        return bad(x, CM_EUNSUPPORTED, "%s: activation ordering (actorder) is not supported", what);
    return 0;
}

/* One config group: {targets, weights, input_activations, output_activations, format}, or a
 * preset name ("FP8", "FP8_DYNAMIC") mapped to its targets. */
static int ct_group(ctx *x, const cm_json *g) {
    char what[96];
    snprintf(what, sizeof what, "quantization_config.config_groups.%.40s", g->key);
    if (g->type == CM_JSON_ARRAY) {
        if (!strcmp(g->key, "FP8") || !strcmp(g->key, "FP8_DYNAMIC")) return 0;
        return bad(x, CM_EUNSUPPORTED, "%s: preset scheme '%.40s' is not supported (FP8, FP8_DYNAMIC)", what, g->key);
    }
    static const char *const keys[] = { "targets", "weights", "input_activations", "output_activations", "format" };
    int rc;
    if (g->type != CM_JSON_OBJECT) return bad(x, CM_EFORMAT, "%s must be an object", what);
    if ((rc = known_keys(x, g, what, keys, sizeof keys / sizeof *keys))) return rc;
    const cm_json *w = cm_json_get(g, "weights"), *in = cm_json_get(g, "input_activations"), *out = cm_json_get(g, "output_activations");
    const cm_json *f = cm_json_get(g, "format");
    char sub[128];
    if (is_null(w)) return bad(x, CM_EUNSUPPORTED, "%s quantizes no weights (only FP8 weight quantization is implemented)", what);
    snprintf(sub, sizeof sub, "%s.weights", what);
    if ((rc = ct_args(x, w, sub, "tensor|channel", 0))) return rc;
    snprintf(sub, sizeof sub, "%s.input_activations", what);
    if (!is_null(in)) {
        if ((rc = ct_args(x, in, sub, "token|tensor", -1))) return rc;
        int dyn = 0;
        cm_json_get_bool(in, "dynamic", &dyn);
        if (str_is(in, "strategy", "token") && !dyn) return bad(x, CM_EUNSUPPORTED, "%s: static per-token scales are not supported", sub);
    }
    if (!is_null(out)) return bad(x, CM_EUNSUPPORTED, "%s: output activation quantization is not supported", what);
    if (!is_null(f) && !str_is(g, "format", "float-quantized"))
        return bad(x, CM_EUNSUPPORTED, "%s: format '%.32s' is not supported (float-quantized)", what, f->type == CM_JSON_STRING ? f->str : "?");
    return 0;
}

/* Reads quantization_config into hf->fp8: FP8 E4M3 weights with per-tensor or per-channel
 * scales as llm-compressor (compressed-tensors, format float-quantized), FBGEMM (fbgemm_fp8)
 * and transformers / AutoFP8 ("fp8", weight_scale or weight_scale_inv) write them, and a
 * static FP8 kv_cache_scheme. Anything else (another method or format, int or 4-bit
 * quantization, block-wise scales, asymmetric scales, output activations) is refused by name. */
static int read_quant(ctx *x, mdl_model *m, const cm_json *q, mdl__hf *hf) {
    mdl__fp8 *f = &hf->fp8;
    if (is_null(q)) return 0;
    if (q->type != CM_JSON_OBJECT) return bad(x, CM_EFORMAT, "'quantization_config' must be an object");
    const char *method;
    if (cm_json_get_str(q, "quant_method", &method)) return bad(x, CM_EFORMAT, "quantization_config has no string 'quant_method'");
    snprintf(m->cfg.quant_method, sizeof m->cfg.quant_method, "%.31s", method);
    snprintf(f->what, sizeof f->what, "%.40s", method);
    int rc;
    if (!strcmp(method, "compressed-tensors")) {
        static const char *const keys[] = { "quant_method", "config_groups", "format", "quantization_status", "global_compression_ratio",
                                            "ignore", "kv_cache_scheme", "sparsity_config", "transform_config", "version" };
        if ((rc = known_keys(x, q, "quantization_config", keys, sizeof keys / sizeof *keys))) return rc;
        const char *fmt = "?", *status = "compressed";
        cm_json_get_str(q, "format", &fmt);
        if (strcmp(fmt, "float-quantized"))
            return bad(x, CM_EUNSUPPORTED, "compressed-tensors format '%.32s' is not supported (float-quantized: FP8 weights)", fmt);
        cm_json_get_str(q, "quantization_status", &status);
        if (strcmp(status, "compressed"))
            return bad(x, CM_EUNSUPPORTED, "compressed-tensors quantization_status '%.20s' is not supported (compressed)", status);
        if (!empty_or_null(cm_json_get(q, "sparsity_config")) || !empty_or_null(cm_json_get(q, "transform_config")))
            return bad(x, CM_EUNSUPPORTED, "compressed-tensors sparsity or transforms are not implemented");
        const cm_json *groups = cm_json_get(q, "config_groups");
        if (!groups || groups->type != CM_JSON_OBJECT || groups->n == 0)
            return bad(x, CM_EFORMAT, "quantization_config.config_groups must be a non-empty object");
        for (const cm_json *g = groups->child; g; g = g->next)
            if ((rc = ct_group(x, g))) return rc;
        const cm_json *kv = cm_json_get(q, "kv_cache_scheme");
        if (!is_null(kv)) {
            if ((rc = ct_args(x, kv, "quantization_config.kv_cache_scheme", "tensor|attn_head", 0))) return rc;
            f->kv_static = 1;
        }
    } else if (!strcmp(method, "fbgemm_fp8")) {
        static const char *const keys[] = { "quant_method", "activation_scale_ub", "modules_to_not_convert" };
        if ((rc = known_keys(x, q, "quantization_config", keys, sizeof keys / sizeof *keys))) return rc;
    } else if (!strcmp(method, "fp8")) {
        static const char *const keys[] = { "quant_method", "activation_scheme", "fmt", "weight_block_size", "ignored_layers",
                                            "modules_to_not_convert", "dequantize" };
        if ((rc = known_keys(x, q, "quantization_config", keys, sizeof keys / sizeof *keys))) return rc;
        const char *as = "dynamic", *fmt = "e4m3";
        cm_json_get_str(q, "activation_scheme", &as);
        cm_json_get_str(q, "fmt", &fmt);
        if (strcmp(as, "dynamic") && strcmp(as, "static"))
            return bad(x, CM_EUNSUPPORTED, "quantization_config.activation_scheme '%.20s' is not supported (dynamic, static)", as);
        if (strcmp(fmt, "e4m3") && strcmp(fmt, "float8_e4m3fn"))
            return bad(x, CM_EUNSUPPORTED, "quantization_config.fmt '%.20s' is not supported (e4m3)", fmt);
        if (!is_null(cm_json_get(q, "weight_block_size")))
            return bad(x, CM_EUNSUPPORTED, "quantization_config.weight_block_size: block-wise FP8 scales are not implemented "
                       "(per-tensor and per-channel scales are)");
    } else {
        return bad(x, CM_EUNSUPPORTED, "quantization_config.quant_method '%.40s' is not supported (FP8 E4M3 checkpoints: "
                   "compressed-tensors float-quantized, fbgemm_fp8, fp8)", method);
    }
    f->on = 1;
    return 0;
}

/* ---- config.json ---------------------------------------------------------------------------- */

/* transformers' Gemma3TextConfig defaults: a vision + text gemma3 config.json writes only the
 * text_config keys that differ from them */
static const char gemma3_text_defaults[] =
    "{\"vocab_size\":262208,\"hidden_size\":2304,\"intermediate_size\":9216,\"num_hidden_layers\":26,\"num_attention_heads\":8,"
    "\"num_key_value_heads\":4,\"head_dim\":256,\"hidden_activation\":\"gelu_pytorch_tanh\",\"max_position_embeddings\":131072,"
    "\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,\"query_pre_attn_scalar\":256,"
    "\"sliding_window\":4096,\"sliding_window_pattern\":6,\"final_logit_softcapping\":null,\"attn_logit_softcapping\":null,"
    "\"tie_word_embeddings\":true}";

/* Top-level keys of a vision + text gemma3 config.json besides text_config: the vision tower
 * is not loaded, so its settings change nothing here. */
static const char *const k_gemma3_vision[] = {
    "text_config", "vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index",
    "tie_word_embeddings", "quantization_config",
};

int mdl__hf_config(const char *cfg_path, const char *dir, mdl_model *m, mdl__hf *hf, char *err, size_t errlen) {
    ctx x = { cfg_path, err, errlen, NULL, NULL };
    mdl_config *c = &m->cfg;
    cm_json_doc *doc = NULL, *defaults = NULL;
    int rc = mdl__read_json(cfg_path, &doc, err, errlen);
    if (rc) return rc;
    const cm_json *o = cm_json_root(doc), *top = o;
    const char *mt, *s;
    const hf_type *ht = NULL;
    if (cm_json_get_str(o, "model_type", &mt)) {
        rc = bad(&x, CM_EFORMAT, "missing string 'model_type'");
        goto out;
    }
    if (!strcmp(mt, "gemma3")) {
        /* vision + text: the text model from text_config (transformers' defaults for what it
         * leaves out); the tensors under language_model. */
        for (const cm_json *v = o->child; v; v = v->next)
            if (!in_list(v->key, k_ignored, sizeof k_ignored / sizeof *k_ignored) &&
                !in_list(v->key, k_gemma3_vision, sizeof k_gemma3_vision / sizeof *k_gemma3_vision)) {
                rc = bad(&x, CM_EUNSUPPORTED, "key '%.60s' is a setting this engine does not implement for model_type 'gemma3'", v->key);
                goto out;
            }
        const cm_json *tc = cm_json_get(o, "text_config");
        char jerr[64];
        if ((tc && tc->type != CM_JSON_OBJECT) ||
            cm_json_parse(gemma3_text_defaults, sizeof gemma3_text_defaults - 1, &defaults, jerr, sizeof jerr)) {
            rc = bad(&x, CM_EFORMAT, "'text_config' must be an object");
            goto out;
        }
        x.fallback = cm_json_root(defaults);
        o = tc ? tc : x.fallback;
        hf->vision = 1;
        mt = "gemma3_text";
    }
    x.root = o;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (!strcmp(mt, types[i].model_type)) ht = &types[i];
    if (!ht) {
        rc = bad(&x, CM_EUNSUPPORTED, "unsupported model_type '%.64s' (supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, "
                 "gemma2, gemma3_text, gemma3 (its text model), phi3)", mt);
        goto out;
    }
    snprintf(c->arch_name, sizeof c->arch_name, "%s", hf->vision ? "gemma3" : mt);
    c->arch = ht->arch;
    for (const cm_json *v = o->child; v; v = v->next)
        if (!in_list(v->key, k_ignored, sizeof k_ignored / sizeof *k_ignored) && !in_list(v->key, k_common, sizeof k_common / sizeof *k_common) &&
            !in_list(v->key, ht->keys, sizeof ht->keys / sizeof *ht->keys)) {
            rc = bad(&x, CM_EUNSUPPORTED, "key '%.60s' is a setting this engine does not implement for model_type '%s'", v->key, mt);
            goto out;
        }
    if (cm_json_get_str(top, "_name_or_path", &s) == 0) snprintf(c->name, sizeof c->name, "%.127s", s);

    const int64_t big = 1 << 30;
    c->n_ctx_train = ht->max_pos;
    c->n_ff = 0;
    if ((rc = get_int(&x, o, "hidden_size", 1, 1, big, &c->n_embd)) < 0 ||
        (rc = get_int(&x, o, "num_hidden_layers", 1, 1, 4096, &c->n_layer)) < 0 ||
        (rc = get_int(&x, o, "num_attention_heads", 1, 1, 4096, &c->n_head)) < 0 ||
        (rc = get_int(&x, o, "num_key_value_heads", 0, 1, 4096, &c->n_head_kv)) < 0 ||
        (rc = get_int(&x, o, "head_dim", 0, 1, 4096, &c->head_dim)) < 0 ||
        (rc = get_int(&x, o, "intermediate_size", c->arch != MDL_ARCH_QWEN3MOE, 1, big, &c->n_ff)) < 0 ||
        (rc = get_int(&x, o, "vocab_size", 1, 1, big, &c->n_vocab)) < 0 ||
        (rc = get_int(&x, o, "max_position_embeddings", 0, 1, big, &c->n_ctx_train)) < 0)
        goto out;
    if (!c->n_head_kv) c->n_head_kv = c->n_head;
    if (!c->head_dim) {
        if (c->n_embd % c->n_head) {
            rc = bad(&x, CM_EFORMAT, "hidden_size %d is not a multiple of num_attention_heads %d (and no head_dim)", c->n_embd, c->n_head);
            goto out;
        }
        c->head_dim = c->n_embd / c->n_head;
    }
    double eps = ht->eps;
    if ((rc = get_num(&x, o, "rms_norm_eps", 0.0, 1.0, &eps)) < 0) goto out;
    c->norm_eps = (float)eps;
    c->rope_layout = MDL_ROPE_HALF;

    /* settings that change the network and are not implemented */
    int flag = 0;
    if ((rc = get_bool(&x, o, "attention_bias", &flag)) < 0) goto out;
    if (flag) { rc = bad(&x, CM_EUNSUPPORTED, "'attention_bias': true (biases on every attention projection) is not implemented"); goto out; }
    if ((rc = get_bool(&x, o, "mlp_bias", &flag)) < 0) goto out;
    if (flag) { rc = bad(&x, CM_EUNSUPPORTED, "'mlp_bias': true is not implemented"); goto out; }
    if ((rc = get_bool(&x, o, "use_bidirectional_attention", &flag)) < 0) goto out;
    if (flag) { rc = bad(&x, CM_EUNSUPPORTED, "'use_bidirectional_attention': true is not implemented"); goto out; }
    int tp = 1; /* llama's pretraining_tp only splits the same matmuls */
    if ((rc = get_int(&x, o, "pretraining_tp", 0, 1, 1 << 20, &tp)) < 0) goto out;
    int gemma = c->arch == MDL_ARCH_GEMMA2 || c->arch == MDL_ARCH_GEMMA3;
    const char *act = gemma ? "gelu_pytorch_tanh" : "silu";
    if (gemma && !str_of(&x, o, "hidden_activation", &s)) act = s;
    else if (!str_of(&x, o, "hidden_act", &s)) act = s;
    if (gemma && !strcmp(act, "gelu_pytorch_tanh")) c->ffn_act = MDL_ACT_GELU_TANH;
    else if (!gemma && !strcmp(act, "silu")) c->ffn_act = MDL_ACT_SILU;
    else {
        rc = bad(&x, CM_EUNSUPPORTED, "activation '%.32s' is not implemented for model_type '%s' (%s)", act, mt, gemma ? "gelu_pytorch_tanh" : "silu");
        goto out;
    }
    c->has_qk_norm = c->arch == MDL_ARCH_QWEN3 || c->arch == MDL_ARCH_QWEN3MOE || c->arch == MDL_ARCH_GEMMA3;
    c->has_post_norms = gemma;
    hf->norm_plus_one = gemma;
    if (gemma) {
        c->embd_scale = sqrtf((float)c->n_embd);
        double qpas = 256, sc = 0;
        if ((rc = get_num(&x, o, "query_pre_attn_scalar", 0, 1e9, &qpas)) < 0) goto out;
        c->attn_scale = (float)(1.0 / sqrt(qpas));
        if (c->arch == MDL_ARCH_GEMMA2) { c->attn_softcap = 50.0f; c->final_softcap = 30.0f; } /* transformers' gemma2 defaults */
        const cm_json *v = member(&x, o, "attn_logit_softcapping");
        if (v) {
            if (is_null(v)) c->attn_softcap = 0;
            else if ((rc = get_num(&x, o, "attn_logit_softcapping", 0, 1e9, &sc)) < 0) goto out;
            else c->attn_softcap = (float)sc;
        }
        v = member(&x, o, "final_logit_softcapping");
        if (v) {
            if (is_null(v)) c->final_softcap = 0;
            else if ((rc = get_num(&x, o, "final_logit_softcapping", 0, 1e9, &sc)) < 0) goto out;
            else c->final_softcap = (float)sc;
        }
    }

    if (!(m->layers = calloc((size_t)c->n_layer, sizeof *m->layers)) || !(hf->sparse = mdl__alloc(m, (size_t)c->n_layer))) {
        rc = bad(&x, CM_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = read_sliding(&x, m, o, ht)) || (rc = read_rope(&x, m, o, ht, c->n_ctx_train))) goto out;
    if ((c->arch == MDL_ARCH_QWEN3MOE || c->arch == MDL_ARCH_MIXTRAL) && (rc = read_moe(&x, m, o, hf->sparse))) goto out;

    hf->tied_default = ht->tied;
    rc = cm_json_get_bool(hf->vision && cm_json_get(top, "tie_word_embeddings") ? top : o, "tie_word_embeddings", &hf->tied);
    if (rc == CM_ENOTFOUND) hf->tied = -1;
    else if (rc) { rc = bad(&x, CM_EFORMAT, "'tie_word_embeddings' is not a boolean"); goto out; }
    if ((rc = read_pooling(&x, m, dir))) goto out;
    x.root = top; /* a vision model's quantization_config is at the top level */
    x.fallback = NULL;
    if ((rc = read_quant(&x, m, cm_json_get(top, "quantization_config"), hf))) goto out;
    rc = 0;
out:
    cm_json_free(doc);
    cm_json_free(defaults);
    return rc < 0 ? rc : 0;
}

/* ---- tensors -------------------------------------------------------------------------------- */

/* A [rows_total, in] tensor split into consecutive row ranges (phi3's fused projections). */
static void split_rows(const mdl_tensor *t, mdl_tensor *const *parts, const int64_t *rows, int n) {
    size_t rs = dt_row_size(t->type, t->ne[0]);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        *parts[i] = *t;
        parts[i]->ne[1] = rows[i];
        parts[i]->data = (const uint8_t *)t->data + (size_t)at * rs;
        parts[i]->nbytes = (uint64_t)rows[i] * rs;
        if (t->scale) parts[i]->scale = t->scale + at;
        at += rows[i];
    }
}

static int experts(mdl_model *m, const char *path, const mdl__hf *hf, int l, char *err, size_t errlen) {
    mdl_config *c = &m->cfg;
    mdl_layer *ly = &m->layers[l];
    const int mix = c->arch == MDL_ARCH_MIXTRAL;
    char tn[160];
    int rc;
    /* router: mlp.gate (qwen3_moe, transformers 5) or block_sparse_moe.gate (mixtral files) */
    snprintf(tn, sizeof tn, "%slayers.%d.%s.gate.weight", hf->prefix, l, mix && mdl__st_has(m, "model.layers.0.block_sparse_moe.gate.weight") ? "block_sparse_moe" : "mlp");
    if ((rc = mdl__st_take(m, path, tn, &ly->ffn_gate_inp, 1, MDL__ST_WEIGHT, err, errlen))) return rc;
    snprintf(tn, sizeof tn, "%slayers.%d.mlp.experts.gate_up_proj", hf->prefix, l);
    if (mdl__st_has(m, tn)) {
        /* transformers 5: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I] */
        mdl_tensor gu, dn;
        if ((rc = mdl__st_take(m, path, tn, &gu, 1, MDL__ST_AS_STORED, err, errlen))) return rc;
        snprintf(tn, sizeof tn, "%slayers.%d.mlp.experts.down_proj", hf->prefix, l);
        if ((rc = mdl__st_take(m, path, tn, &dn, 1, MDL__ST_AS_STORED, err, errlen))) return rc;
        if (gu.ne[0] != c->n_embd || gu.ne[1] != 2 * (int64_t)c->n_ff_exp || gu.ne[2] != c->n_expert || dn.ne[0] != c->n_ff_exp ||
            dn.ne[1] != c->n_embd || dn.ne[2] != c->n_expert) {
            snprintf(err, errlen, "%s: layer %d's fused experts are not [%d, %d, %d] and [%d, %d, %d]", path, l, c->n_expert,
                     2 * c->n_ff_exp, c->n_embd, c->n_expert, c->n_embd, c->n_ff_exp);
            return CM_EFORMAT;
        }
        if (!(ly->exp_gate = mdl__expert_views(m, &gu, c->n_expert, 0, c->n_ff_exp)) ||
            !(ly->exp_up = mdl__expert_views(m, &gu, c->n_expert, c->n_ff_exp, c->n_ff_exp)) ||
            !(ly->exp_down = mdl__expert_views(m, &dn, c->n_expert, 0, c->n_embd))) {
            snprintf(err, errlen, "%s: out of memory", path);
            return CM_ENOMEM;
        }
        return 0;
    }
    ly->exp_gate = mdl__alloc(m, sizeof(mdl_tensor) * (size_t)c->n_expert);
    ly->exp_up = mdl__alloc(m, sizeof(mdl_tensor) * (size_t)c->n_expert);
    ly->exp_down = mdl__alloc(m, sizeof(mdl_tensor) * (size_t)c->n_expert);
    if (!ly->exp_gate || !ly->exp_up || !ly->exp_down) {
        snprintf(err, errlen, "%s: out of memory", path);
        return CM_ENOMEM;
    }
    static const char *const qn[3] = { "mlp.experts.%d.gate_proj.weight", "mlp.experts.%d.up_proj.weight", "mlp.experts.%d.down_proj.weight" };
    static const char *const mn[3] = { "block_sparse_moe.experts.%d.w1.weight", "block_sparse_moe.experts.%d.w3.weight",
                                       "block_sparse_moe.experts.%d.w2.weight" };
    for (int e = 0; e < c->n_expert; e++) {
        mdl_tensor *dst[3] = { &ly->exp_gate[e], &ly->exp_up[e], &ly->exp_down[e] };
        for (int i = 0; i < 3; i++) {
            char part[96];
            snprintf(part, sizeof part, mix ? mn[i] : qn[i], e);
            snprintf(tn, sizeof tn, "%slayers.%d.%s", hf->prefix, l, part);
            if ((rc = mdl__st_take(m, path, tn, dst[i], 1, MDL__ST_WEIGHT, err, errlen))) return rc;
        }
    }
    return 0;
}

/* Static FP8 KV-cache scales of layer l: self_attn.k_scale / v_scale (compressed-tensors'
 * kv_cache_scheme: one value or one per KV head) or self_attn.k_proj.output_scale /
 * v_proj.output_scale (AutoFP8's names); every layer has them or none does (layer 0 decides);
 * a kv_cache_scheme requires them. */
static int kv_scales(mdl_model *m, const char *path, const mdl__hf *hf, int l, char *err, size_t errlen) {
    mdl_config *c = &m->cfg;
    mdl_layer *ly = &m->layers[l];
    static const char *const names[2][2] = { { "self_attn.k_scale", "self_attn.v_scale" },
                                             { "self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale" } };
    const float **dst[2] = { &ly->k_scale, &ly->v_scale };
    char tn[160];
    int found = 0;
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 2; i++) {
            snprintf(tn, sizeof tn, "%slayers.%d.%s", hf->prefix, l, names[v][i]);
            int rc = mdl__st_scales(m, path, tn, c->n_head_kv, dst[i], NULL, err, errlen);
            if (rc == CM_ENOTFOUND) continue;
            if (rc) return rc;
            if (found & (1 << i)) {
                snprintf(err, errlen, "%s: layer %d has its %s scale under two names", path, l, i ? "V" : "K");
                return CM_EFORMAT;
            }
            found |= 1 << i;
        }
    if (l == 0) c->kv_scales = found != 0;
    if (found != (c->kv_scales ? 3 : 0) || (hf->fp8.kv_static && found != 3)) {
        snprintf(err, errlen, "%s: layer %d %s (%s)", path, l,
                 found ? "has only one of the K and V cache scales" : "lacks the K and V cache scales (self_attn.k_scale, v_scale)",
                 hf->fp8.kv_static ? "quantization_config.kv_cache_scheme asks for them" : "layer 0 has them");
        return CM_EFORMAT;
    }
    return 0;
}

int mdl__hf_tensors(mdl_model *m, const char *path, mdl__hf *hf, char *err, size_t errlen) {
    mdl_config *c = &m->cfg;
    int rc;
    const int norm = hf->norm_plus_one ? MDL__ST_TO_F32_PLUS1 : MDL__ST_TO_F32;
    /* where the language model's tensors are: "model." (a causal LM), or inside a vision
     * model: "language_model.model." (transformers 4.x files) or "model.language_model."
     * (transformers 5), whose vision tower and projector are not loaded */
    const char *head = "lm_head.weight";
    snprintf(hf->prefix, sizeof hf->prefix, "model.");
    if (hf->vision) {
        if (mdl__st_has(m, "language_model.model.embed_tokens.weight")) {
            snprintf(hf->prefix, sizeof hf->prefix, "language_model.model.");
            head = "language_model.lm_head.weight";
        } else {
            snprintf(hf->prefix, sizeof hf->prefix, "model.language_model.");
        }
        static const char *const vision[] = { "vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector." };
        for (size_t i = 0; i < sizeof vision / sizeof *vision; i++) mdl__st_skip_prefix(m, vision[i]);
    }
    char tn[160];
    snprintf(tn, sizeof tn, "%sembed_tokens.weight", hf->prefix);
    if ((rc = mdl__st_take(m, path, tn, &m->tok_embd, 1, MDL__ST_AS_STORED, err, errlen))) return rc;
    snprintf(tn, sizeof tn, "%snorm.weight", hf->prefix);
    if ((rc = mdl__st_take(m, path, tn, &m->out_norm, 1, norm, err, errlen))) return rc;
    int has_head = mdl__st_has(m, head);
    int tied = hf->tied >= 0 ? hf->tied : has_head ? hf->tied_default : 1;
    if (tied) {
        m->output = m->tok_embd;
        c->tied_output = 1;
        if (has_head) mdl__st_skip(m, head); /* transformers ties it to the embeddings */
    } else if ((rc = mdl__st_take(m, path, head, &m->output, 1, MDL__ST_WEIGHT, err, errlen))) {
        if (rc == CM_ENOTFOUND) {
            size_t l = strlen(err);
            snprintf(err + l, errlen - l, " (config.json sets tie_word_embeddings false)");
        }
        return rc;
    }
    const int gemma = c->arch == MDL_ARCH_GEMMA2 || c->arch == MDL_ARCH_GEMMA3, phi3 = c->arch == MDL_ARCH_PHI3;
    for (int l = 0; l < c->n_layer; l++) {
        mdl_layer *ly = &m->layers[l];
#define TAKE(suffix, t, req, conv)                                                                       \
        (snprintf(tn, sizeof tn, "%slayers.%d.%s", hf->prefix, l, (suffix)), mdl__st_take(m, path, tn, (t), (req), (conv), err, errlen))
        if ((rc = TAKE("input_layernorm.weight", &ly->attn_norm, 1, norm)) ||
            (rc = TAKE("self_attn.o_proj.weight", &ly->wo, 1, MDL__ST_WEIGHT)))
            return rc;
        if (gemma) {
            if ((rc = TAKE("post_attention_layernorm.weight", &ly->attn_post_norm, 1, norm)) ||
                (rc = TAKE("pre_feedforward_layernorm.weight", &ly->ffn_norm, 1, norm)) ||
                (rc = TAKE("post_feedforward_layernorm.weight", &ly->ffn_post_norm, 1, norm)))
                return rc;
        } else if ((rc = TAKE("post_attention_layernorm.weight", &ly->ffn_norm, 1, norm))) {
            return rc;
        }
        if (phi3) {
            mdl_tensor qkv;
            if ((rc = TAKE("self_attn.qkv_proj.weight", &qkv, 1, MDL__ST_WEIGHT))) return rc;
            int64_t qd = (int64_t)c->n_head * c->head_dim, kvd = (int64_t)c->n_head_kv * c->head_dim;
            if (qkv.ne[1] != qd + 2 * kvd || qkv.n_dims != 2) {
                snprintf(err, errlen, "%s: tensor '%s' has %lld rows, expected %lld (Q, K, V)", path, tn, (long long)qkv.ne[1], (long long)(qd + 2 * kvd));
                return CM_EFORMAT;
            }
            mdl_tensor *parts[3] = { &ly->wq, &ly->wk, &ly->wv };
            int64_t rows[3] = { qd, kvd, kvd };
            split_rows(&qkv, parts, rows, 3);
        } else if ((rc = TAKE("self_attn.q_proj.weight", &ly->wq, 1, MDL__ST_WEIGHT)) ||
                   (rc = TAKE("self_attn.k_proj.weight", &ly->wk, 1, MDL__ST_WEIGHT)) ||
                   (rc = TAKE("self_attn.v_proj.weight", &ly->wv, 1, MDL__ST_WEIGHT))) {
            return rc;
        }
        /* Q/K/V biases (qwen2): all three in every layer, or none anywhere (layer 0 decides) */
        static const char *const bias[3] = { "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias" };
        mdl_tensor *bt[3] = { &ly->bq, &ly->bk, &ly->bv };
        for (int i = 0; i < 3; i++) {
            snprintf(tn, sizeof tn, "%slayers.%d.%s", hf->prefix, l, bias[i]);
            if (l == 0 && i == 0) c->has_qkv_bias = c->arch == MDL_ARCH_QWEN2 && mdl__st_has(m, tn);
            if (c->has_qkv_bias && (rc = mdl__st_take(m, path, tn, bt[i], 1, MDL__ST_TO_F32, err, errlen))) return rc;
        }
        if (c->has_qk_norm && ((rc = TAKE("self_attn.q_norm.weight", &ly->attn_q_norm, 1, norm)) ||
                               (rc = TAKE("self_attn.k_norm.weight", &ly->attn_k_norm, 1, norm))))
            return rc;
        if ((rc = kv_scales(m, path, hf, l, err, errlen))) return rc;
        if (hf->sparse[l]) {
            if ((rc = experts(m, path, hf, l, err, errlen))) return rc;
        } else if (phi3) {
            mdl_tensor gu;
            if ((rc = TAKE("mlp.gate_up_proj.weight", &gu, 1, MDL__ST_WEIGHT))) return rc;
            if (gu.ne[1] != 2 * (int64_t)c->n_ff || gu.n_dims != 2) {
                snprintf(err, errlen, "%s: tensor '%s' has %lld rows, expected %d (gate, up)", path, tn, (long long)gu.ne[1], 2 * c->n_ff);
                return CM_EFORMAT;
            }
            mdl_tensor *parts[2] = { &ly->w_gate, &ly->w_up };
            int64_t rows[2] = { c->n_ff, c->n_ff };
            split_rows(&gu, parts, rows, 2);
            if ((rc = TAKE("mlp.down_proj.weight", &ly->w_down, 1, MDL__ST_WEIGHT))) return rc;
        } else if ((rc = TAKE("mlp.gate_proj.weight", &ly->w_gate, 1, MDL__ST_WEIGHT)) ||
                   (rc = TAKE("mlp.up_proj.weight", &ly->w_up, 1, MDL__ST_WEIGHT)) ||
                   (rc = TAKE("mlp.down_proj.weight", &ly->w_down, 1, MDL__ST_WEIGHT))) {
            return rc;
        }
#undef TAKE
    }
    return 0;
}
