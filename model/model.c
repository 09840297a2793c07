/* model: architecture config and tensor table from GGUF metadata; shared validation. */
#include "model.h"
#include "dtype.h"
#include "../common/cm_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const arch_names[MDL_ARCH_COUNT] = { "llama", "mistral", "qwen2" };

const char *mdl_arch_name(int arch) { return arch >= 0 && arch < MDL_ARCH_COUNT ? arch_names[arch] : "?"; }

int mdl_arch_from_name(const char *name) {
    for (int i = 0; i < MDL_ARCH_COUNT; i++)
        if (!strcmp(name, arch_names[i])) return i;
    return -1;
}

/* Provided by model/safetensors.c. */
int mdl__load_safetensors(const char *path, mdl_model **out, char *err, size_t errlen);

void mdl_free(mdl_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layer; l++) {
            mdl_layer *ly = &m->layers[l];
            mdl_tensor *ts[] = { &ly->attn_norm, &ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->bq, &ly->bk, &ly->bv,
                                 &ly->ffn_norm, &ly->w_gate, &ly->w_up, &ly->w_down };
            for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) free((char *)ts[i]->name);
        }
    }
    free((char *)m->tok_embd.name);
    free((char *)m->out_norm.name);
    if (m->output.name != m->tok_embd.name) free((char *)m->output.name);
    free(m->layers);
    gguf_close(m->gguf);
    if (m->st) {
        void mdl__st_free(void *st);
        mdl__st_free(m->st);
    }
    free(m);
}

static int take_tensor(gguf_ctx *g, const char *name, mdl_tensor *t) {
    const gguf_tensor *gt = gguf_find_tensor(g, name);
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return CM_ENOMEM;
    if (!gt) return CM_ENOTFOUND;
    t->data = gt->data;
    t->type = gt->type;
    t->n_dims = (int)gt->n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = gt->ne[d];
    t->nbytes = gt->nbytes;
    return 0;
}

static int need_tensor(gguf_ctx *g, const char *name, mdl_tensor *t, char *err, size_t errlen) {
    int rc = take_tensor(g, name, t);
    if (rc == CM_ENOTFOUND) snprintf(err, errlen, "%s: missing tensor '%s'", gguf_path(g), name);
    else if (rc) snprintf(err, errlen, "%s: out of memory", gguf_path(g));
    return rc;
}

static int get_u32_req(gguf_ctx *g, const char *arch, const char *suffix, int *out, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == CM_ENOTFOUND) snprintf(err, errlen, "%s: missing metadata '%s'", gguf_path(g), key);
    else if (rc || v > (1u << 30)) {
        snprintf(err, errlen, "%s: metadata '%s' is not a sensible unsigned integer", gguf_path(g), key);
        rc = CM_EFORMAT;
    }
    if (!rc) *out = (int)v;
    return rc;
}

static int get_u32_opt(gguf_ctx *g, const char *arch, const char *suffix, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    if (gguf_get_u32(g, key, &v) == 0 && v <= (1u << 30)) {
        *out = (int)v;
        return 1;
    }
    return 0;
}

static int get_f32_opt(gguf_ctx *g, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32(g, key, out) == 0;
}

int mdl_from_gguf(gguf_ctx *g, mdl_model **out, char *err, size_t errlen) {
    *out = NULL;
    const char *path = gguf_path(g);
    char *arch = NULL;
    int rc = gguf_get_strdup(g, "general.architecture", &arch);
    if (rc) {
        snprintf(err, errlen, "%s: missing or invalid 'general.architecture'", path);
        return CM_EFORMAT;
    }
    mdl_model *m = calloc(1, sizeof *m);
    if (!m) { free(arch); return CM_ENOMEM; }
    mdl_config *c = &m->cfg;
    m->format = MDL_FORMAT_GGUF;
    snprintf(c->arch_name, sizeof c->arch_name, "%s", arch);
    c->arch = mdl_arch_from_name(arch);
    if (c->arch < 0) {
        snprintf(err, errlen, "%s: unsupported architecture '%s' (supported: llama, mistral, qwen2)", path, arch);
        free(arch);
        free(m);
        return CM_EUNSUPPORTED;
    }
    char *name = NULL;
    if (gguf_get_strdup(g, "general.name", &name) == 0) snprintf(c->name, sizeof c->name, "%s", name);
    free(name);

    if ((rc = get_u32_req(g, arch, "embedding_length", &c->n_embd, err, errlen)) ||
        (rc = get_u32_req(g, arch, "block_count", &c->n_layer, err, errlen)) ||
        (rc = get_u32_req(g, arch, "feed_forward_length", &c->n_ff, err, errlen)) ||
        (rc = get_u32_req(g, arch, "attention.head_count", &c->n_head, err, errlen)))
        goto fail;
    if (!get_u32_opt(g, arch, "attention.head_count_kv", &c->n_head_kv)) c->n_head_kv = c->n_head;
    if (!get_u32_opt(g, arch, "context_length", &c->n_ctx_train)) c->n_ctx_train = 2048;
    c->head_dim = c->n_head ? c->n_embd / c->n_head : 0;
    get_u32_opt(g, arch, "attention.key_length", &c->head_dim);
    c->rope_dim = c->head_dim;
    get_u32_opt(g, arch, "rope.dimension_count", &c->rope_dim);
    c->rope_base = 10000.0f;
    get_f32_opt(g, arch, "rope.freq_base", &c->rope_base);
    c->norm_eps = 1e-5f;
    if (!get_f32_opt(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps)) c->norm_eps = 1e-5f;
    c->rope_layout = c->arch == MDL_ARCH_QWEN2 ? MDL_ROPE_HALF : MDL_ROPE_ADJACENT;

    char key[128];
    char *st = NULL;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    c->rope_factor = 1.0f;
    if (gguf_get_strdup(g, key, &st) == 0) {
        if (!strcmp(st, "linear")) c->rope_scaling = MDL_ROPE_SCALING_LINEAR;
        else if (!strcmp(st, "llama3")) c->rope_scaling = MDL_ROPE_SCALING_LLAMA3;
        else if (strcmp(st, "none")) {
            snprintf(err, errlen, "%s: unsupported rope scaling '%s'", path, st);
            free(st);
            rc = CM_EUNSUPPORTED;
            goto fail;
        }
        free(st);
        get_f32_opt(g, arch, "rope.scaling.factor", &c->rope_factor);
    } else {
        float f;
        if (get_f32_opt(g, arch, "rope.scale_linear", &f) && f != 1.0f) {
            c->rope_scaling = MDL_ROPE_SCALING_LINEAR;
            c->rope_factor = f;
        }
    }
    /* Llama 3.1 GGUFs carry the scaling as a rope_freqs tensor instead; it is handled by the
     * llama3 formula with the standard constants when present. */
    if (gguf_find_tensor(g, "rope_freqs.weight") && c->rope_scaling == MDL_ROPE_SCALING_NONE) {
        c->rope_scaling = MDL_ROPE_SCALING_LLAMA3;
        c->rope_factor = 8.0f;
    }
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_orig_ctx = 8192;
    get_u32_opt(g, arch, "rope.scaling.original_context_length", &c->rope_orig_ctx);

    const gguf_value *toks = NULL;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &toks) == 0) c->n_vocab = (int)toks->v.arr.n;
    get_u32_opt(g, arch, "vocab_size", &c->n_vocab);

    if ((rc = need_tensor(g, "token_embd.weight", &m->tok_embd, err, errlen)) ||
        (rc = need_tensor(g, "output_norm.weight", &m->out_norm, err, errlen)))
        goto fail;
    if (!c->n_vocab) c->n_vocab = (int)m->tok_embd.ne[1];
    rc = take_tensor(g, "output.weight", &m->output);
    if (rc == CM_ENOTFOUND) {
        free((char *)m->output.name);
        m->output = m->tok_embd;
        c->tied_output = 1;
    } else if (rc) goto oom;

    if (c->n_layer <= 0 || c->n_layer > 4096) {
        snprintf(err, errlen, "%s: absurd block_count %d", path, c->n_layer);
        rc = CM_EFORMAT;
        goto fail;
    }
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) goto oom;
    for (int l = 0; l < c->n_layer; l++) {
        mdl_layer *ly = &m->layers[l];
        struct { const char *suffix; mdl_tensor *t; int optional; } map[] = {
            { "attn_norm", &ly->attn_norm, 0 }, { "attn_q", &ly->wq, 0 }, { "attn_k", &ly->wk, 0 },
            { "attn_v", &ly->wv, 0 }, { "attn_output", &ly->wo, 0 }, { "ffn_norm", &ly->ffn_norm, 0 },
            { "ffn_gate", &ly->w_gate, 0 }, { "ffn_up", &ly->w_up, 0 }, { "ffn_down", &ly->w_down, 0 },
        };
        for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
            char tn[96];
            snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, map[i].suffix);
            if ((rc = need_tensor(g, tn, map[i].t, err, errlen))) goto fail;
        }
        struct { const char *suffix; mdl_tensor *t; } bias[] = { { "attn_q", &ly->bq }, { "attn_k", &ly->bk }, { "attn_v", &ly->bv } };
        for (size_t i = 0; i < 3; i++) {
            char tn[96];
            snprintf(tn, sizeof tn, "blk.%d.%s.bias", l, bias[i].suffix);
            rc = take_tensor(g, tn, bias[i].t);
            if (rc == 0) c->has_qkv_bias = 1;
            else if (rc != CM_ENOTFOUND) goto oom;
        }
    }
    m->gguf = g;
    free(arch);
    if ((rc = mdl__validate(m, path, err, errlen))) {
        m->gguf = NULL; /* the caller still owns g on failure */
        mdl_free(m);
        return rc;
    }
    *out = m;
    return 0;
oom:
    snprintf(err, errlen, "%s: out of memory", path);
    rc = CM_ENOMEM;
fail:
    free(arch);
    m->gguf = NULL;
    mdl_free(m);
    return rc;
}

static int check_shape(const mdl_tensor *t, int64_t ne0, int64_t ne1, const char *path, char *err, size_t errlen) {
    if (!t->data) return 0;
    int64_t want1 = ne1 > 0 ? ne1 : 1;
    if (t->ne[0] != ne0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1) {
        snprintf(err, errlen, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", path, t->name,
                 (long long)t->ne[0], (long long)t->ne[1], (long long)ne0, (long long)want1);
        return CM_EFORMAT;
    }
    if (!dt_is_supported(t->type)) {
        snprintf(err, errlen, "%s: tensor '%s' has unsupported type %s", path, t->name,
                 dt_name(t->type) ? dt_name(t->type) : "?");
        return CM_EUNSUPPORTED;
    }
    return 0;
}

int mdl__validate(mdl_model *m, const char *path, char *err, size_t errlen) {
    mdl_config *c = &m->cfg;
    if (c->n_embd <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 || c->n_ff <= 0 || c->n_vocab <= 0 || c->head_dim <= 0 ||
        c->n_embd > (1 << 20) || c->n_ff > (1 << 22) || c->n_vocab > (1 << 24) || c->head_dim > 1024 || c->n_head > 1024) {
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
    if (c->n_ctx_train <= 0) c->n_ctx_train = 2048;
    int64_t qd = (int64_t)c->n_head * c->head_dim, kvd = (int64_t)c->n_head_kv * c->head_dim;
    int rc;
    if ((rc = check_shape(&m->tok_embd, c->n_embd, c->n_vocab, path, err, errlen)) ||
        (rc = check_shape(&m->out_norm, c->n_embd, 1, path, err, errlen)) ||
        (rc = check_shape(&m->output, c->n_embd, c->n_vocab, path, err, errlen)))
        return rc;
    uint64_t bytes = m->out_norm.nbytes + m->output.nbytes;
    for (int l = 0; l < c->n_layer; l++) {
        mdl_layer *ly = &m->layers[l];
        if ((rc = check_shape(&ly->attn_norm, c->n_embd, 1, path, err, errlen)) ||
            (rc = check_shape(&ly->wq, c->n_embd, qd, path, err, errlen)) ||
            (rc = check_shape(&ly->wk, c->n_embd, kvd, path, err, errlen)) ||
            (rc = check_shape(&ly->wv, c->n_embd, kvd, path, err, errlen)) ||
            (rc = check_shape(&ly->wo, qd, c->n_embd, path, err, errlen)) ||
            (rc = check_shape(&ly->bq, qd, 1, path, err, errlen)) ||
            (rc = check_shape(&ly->bk, kvd, 1, path, err, errlen)) ||
            (rc = check_shape(&ly->bv, kvd, 1, path, err, errlen)) ||
            (rc = check_shape(&ly->ffn_norm, c->n_embd, 1, path, err, errlen)) ||
            (rc = check_shape(&ly->w_gate, c->n_embd, c->n_ff, path, err, errlen)) ||
            (rc = check_shape(&ly->w_up, c->n_embd, c->n_ff, path, err, errlen)) ||
            (rc = check_shape(&ly->w_down, c->n_ff, c->n_embd, path, err, errlen)))
            return rc;
        bytes += ly->attn_norm.nbytes + ly->wq.nbytes + ly->wk.nbytes + ly->wv.nbytes + ly->wo.nbytes + ly->bq.nbytes +
                 ly->bk.nbytes + ly->bv.nbytes + ly->ffn_norm.nbytes + ly->w_gate.nbytes + ly->w_up.nbytes + ly->w_down.nbytes;
    }
    /* Norm weights must be float: the kernels read them as F32. */
    m->weight_bytes = bytes;
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
