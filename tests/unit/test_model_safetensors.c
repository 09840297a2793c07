/* safetensors loading through mdl_load: synthetic Hugging Face checkpoints written by this
 * test (one shard, an index with two shards, a bare .safetensors file; F32/F16/BF16; llama,
 * mistral, qwen2 with biases; tied and separate heads), the hostile inputs the loader must
 * refuse with a one-line "PATH: problem", every truncation of a shard, and the Q/K permutation
 * helper against its index formula and against RoPE itself. */
#include "common/cm_err.h"
#include "model/dtype.h"
#include "model/model.h"
#include "t.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[64];

/* ---- a tiny checkpoint writer ---------------------------------------------------------- */

typedef struct tt {
    char     name[96];
    char     dtype[8];
    int      n_dims;
    int64_t  shape[4];
    uint8_t *bytes;
    size_t   nbytes;
    int      shard;
} tt;

typedef struct spec {
    const char *arch;
    int n_layer, n_embd, n_head, n_kv, head_dim, n_ff, n_vocab;
    const char *wdtype, *ndtype; /* matrices; norms and biases */
    int tie;                     /* -1: key absent, 0/1: tie_word_embeddings */
    int lm_head;                 /* write lm_head.weight */
    int bias;                    /* q/k/v biases */
    int shards;                  /* 1 or 2 */
    const char *extra_cfg;       /* appended members, starting with ',' */
    const char *skip;            /* a tensor left out */
    int omit_head_dim;           /* leave head_dim out of config.json */
    int odd_prefix;              /* an unused 2-byte tensor first: everything after is misaligned */
} spec;

static tt    tensors[256];
static int   n_tensors;

static float val(int tid, int64_t i) { return (float)((tid * 31 + i * 7) % 33 - 16) / 16.0f; }

static size_t esize(const char *dt) { return !strcmp(dt, "F32") ? 4 : !strcmp(dt, "I8") ? 1 : 2; }

static void add_tensor(const char *name, const char *dt, int n_dims, int64_t d0, int64_t d1) {
    tt *t = &tensors[n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dt);
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = d1;
    int64_t n = n_dims == 1 ? d0 : d0 * d1;
    size_t es = esize(dt);
    t->nbytes = (size_t)n * es;
    t->bytes = malloc(t->nbytes ? t->nbytes : 1);
    for (int64_t i = 0; i < n; i++) {
        float v = val(n_tensors, i);
        if (es == 4) memcpy(t->bytes + 4 * i, &v, 4);
        else if (es == 1) t->bytes[i] = (uint8_t)(int8_t)(v * 16);
        else {
            uint16_t h = !strcmp(dt, "F16") ? dt_f32_to_f16(v) : dt_f32_to_bf16(v);
            memcpy(t->bytes + 2 * i, &h, 2);
        }
    }
    n_tensors++;
}

/* A tensor with given bytes (F32), HF shape [d0, d1] (d1 = 0: 1-D). */
static void add_raw(const char *name, const void *bytes, int64_t d0, int64_t d1) {
    tt *t = &tensors[n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "F32");
    t->n_dims = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->nbytes = (size_t)(d0 * (d1 ? d1 : 1)) * 4;
    t->bytes = malloc(t->nbytes);
    memcpy(t->bytes, bytes, t->nbytes);
}

static void free_tensors(void) {
    for (int i = 0; i < n_tensors; i++) free(tensors[i].bytes);
    n_tensors = 0;
}

static const tt *find_tt(const char *name) {
    for (int i = 0; i < n_tensors; i++)
        if (!strcmp(tensors[i].name, name)) return &tensors[i];
    return NULL;
}

typedef struct sbuf { char *p; size_t n, cap; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)need + 1 > b->cap) {
        b->cap = (b->n + (size_t)need + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)need + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)need;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* Writes a raw safetensors file: header text (padded with spaces to 8) then data bytes. */
static void write_raw(const char *path, const char *header, const void *data, size_t n) {
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    uint8_t *buf = malloc(8 + padded + n + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    if (n) memcpy(buf + 8 + padded, data, n);
    write_file(path, buf, 8 + padded + n);
    free(buf);
}

static void write_shard(const char *path, int shard) {
    sbuf h = { 0 }, d = { 0 };
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t off = 0;
    for (int i = 0; i < n_tensors; i++) {
        tt *t = &tensors[i];
        if (t->shard != shard) continue;
        if (t->n_dims == 1)
            sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}", t->name, t->dtype,
                      (long long)t->shape[0], off, off + t->nbytes);
        else
            sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}", t->name, t->dtype,
                      (long long)t->shape[0], (long long)t->shape[1], off, off + t->nbytes);
        off += t->nbytes;
    }
    sb_printf(&h, "}");
    d.p = malloc(off + 1);
    for (int i = 0; i < n_tensors; i++)
        if (tensors[i].shard == shard) {
            memcpy(d.p + d.n, tensors[i].bytes, tensors[i].nbytes);
            d.n += tensors[i].nbytes;
        }
    write_raw(path, h.p, d.p, d.n);
    free(h.p);
    free(d.p);
}

static void write_config(const char *dir, const spec *s) {
    char p[256], cfg[2048], extra[256] = "";
    if (s->tie >= 0) snprintf(extra, sizeof extra, ",\"tie_word_embeddings\":%s", s->tie ? "true" : "false");
    char hd[64] = "";
    if (!s->omit_head_dim) snprintf(hd, sizeof hd, ",\"head_dim\":%d", s->head_dim);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"X\"],\"model_type\":\"%s\",\"hidden_size\":%d,\"num_hidden_layers\":%d,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":%d%s,\"intermediate_size\":%d,\"vocab_size\":%d,"
             "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"torch_dtype\":\"bfloat16\"%s%s}\n",
             s->arch, s->n_embd, s->n_layer, s->n_head, s->n_kv, hd, s->n_ff, s->n_vocab, extra, s->extra_cfg ? s->extra_cfg : "");
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_file(p, cfg, strlen(cfg));
}

/* Builds the tensor table for s and writes dir/{config.json, shards[, index]}. */
static void make_model(const char *dir, const spec *s) {
    free_tensors();
    mkdir(dir, 0700);
    int hd = s->head_dim, qd = s->n_head * hd, kvd = s->n_kv * hd;
    char nm[96];
    /* a persisted rotary cache (derived data the loader passes over) of odd size first */
    if (s->odd_prefix) add_tensor("model.rotary_emb.inv_freq", "F16", 1, 1, 0);
    add_tensor("model.embed_tokens.weight", s->wdtype, 2, s->n_vocab, s->n_embd);
    for (int l = 0; l < s->n_layer; l++) {
#define T2(suffix, d0, d1) snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), add_tensor(nm, s->wdtype, 2, d0, d1)
#define T1(suffix, d0) snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), add_tensor(nm, s->ndtype, 1, d0, 0)
        T1("input_layernorm.weight", s->n_embd);
        T2("self_attn.q_proj.weight", qd, s->n_embd);
        T2("self_attn.k_proj.weight", kvd, s->n_embd);
        T2("self_attn.v_proj.weight", kvd, s->n_embd);
        if (s->bias) {
            T1("self_attn.q_proj.bias", qd);
            T1("self_attn.k_proj.bias", kvd);
            T1("self_attn.v_proj.bias", kvd);
        }
        T2("self_attn.o_proj.weight", s->n_embd, qd);
        T1("post_attention_layernorm.weight", s->n_embd);
        T2("mlp.gate_proj.weight", s->n_ff, s->n_embd);
        T2("mlp.up_proj.weight", s->n_ff, s->n_embd);
        T2("mlp.down_proj.weight", s->n_embd, s->n_ff);
        /* Older llama checkpoints carry this buffer; the loader must ignore it. */
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.rotary_emb.inv_freq", l);
        add_tensor(nm, "F32", 1, hd / 2, 0);
#undef T1
#undef T2
    }
    add_tensor("model.norm.weight", s->ndtype, 1, s->n_embd, 0);
    if (s->lm_head) add_tensor("lm_head.weight", s->wdtype, 2, s->n_vocab, s->n_embd);
    if (s->skip)
        for (int i = 0; i < n_tensors; i++)
            if (!strcmp(tensors[i].name, s->skip)) tensors[i].shard = -1;
    write_config(dir, s);
    char p[256];
    if (s->shards <= 1) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        write_shard(p, 0);
        return;
    }
    /* Two shards: the first half of the table, then the rest; an index maps each name. */
    for (int i = 0; i < n_tensors; i++)
        if (tensors[i].shard >= 0) tensors[i].shard = i < n_tensors / 2 ? 0 : 1;
    static const char *const files[] = { "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors" };
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[k]);
        write_shard(p, k);
    }
    sbuf ix = { 0 };
    sb_printf(&ix, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    int first = 1;
    for (int i = 0; i < n_tensors; i++) {
        if (tensors[i].shard < 0) continue;
        sb_printf(&ix, "%s\"%s\":\"%s\"", first ? "" : ",", tensors[i].name, files[tensors[i].shard]);
        first = 0;
    }
    sb_printf(&ix, "}}");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_file(p, ix.p, ix.n);
    free(ix.p);
}

static spec base_spec(void) {
    spec s = { "llama", 2, 16, 4, 2, 4, 24, 32, "F32", "F32", -1, 1, 0, 1, NULL, NULL, 0, 0 };
    return s;
}

/* ---- checks ------------------------------------------------------------------------------ */

/* The mdl_tensor must be the written tensor, in GGUF order, with the bytes as written (matrices)
 * or converted to F32 (norms/biases when to_f32). */
static void check_tensor(const mdl_tensor *t, const char *name, int to_f32) {
    const tt *w = find_tt(name);
    T_CHECKF(w && t->data, "%s", name);
    if (!w || !t->data) return;
    T_EQ_STR(t->name, name);
    T_EQ_INT(t->n_dims, w->n_dims);
    if (w->n_dims == 2) {
        T_EQ_INT(t->ne[0], w->shape[1]);
        T_EQ_INT(t->ne[1], w->shape[0]);
    } else {
        T_EQ_INT(t->ne[0], w->shape[0]);
        T_EQ_INT(t->ne[1], 1);
    }
    T_CHECK(t->ne[2] == 1 && t->ne[3] == 1);
    int wt = !strcmp(w->dtype, "F32") ? DT_F32 : !strcmp(w->dtype, "F16") ? DT_F16 : DT_BF16;
    if (to_f32 && wt != DT_F32) {
        T_EQ_INT(t->type, DT_F32);
        size_t n = w->nbytes / 2;
        T_EQ_INT(t->nbytes, n * 4);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, w->bytes + 2 * i, 2);
            float want = wt == DT_F16 ? dt_f16_to_f32(h) : dt_bf16_to_f32(h);
            bad += ((const float *)t->data)[i] != want;
        }
        T_CHECKF(bad == 0, "%s: %d converted values differ", name, bad);
    } else {
        T_EQ_INT(t->type, wt);
        T_EQ_INT(t->nbytes, w->nbytes);
        T_CHECKF(memcmp(t->data, w->bytes, w->nbytes) == 0, "%s: bytes differ", name);
    }
}

static void check_model(const mdl_model *m, const spec *s) {
    const mdl_config *c = &m->cfg;
    T_EQ_INT(m->format, MDL_FORMAT_SAFETENSORS);
    T_CHECK(m->gguf == NULL && m->st != NULL);
    T_EQ_STR(c->arch_name, s->arch);
    T_EQ_INT(c->arch, mdl_arch_from_name(s->arch));
    T_EQ_INT(c->n_embd, s->n_embd);
    T_EQ_INT(c->n_layer, s->n_layer);
    T_EQ_INT(c->n_head, s->n_head);
    T_EQ_INT(c->n_head_kv, s->n_kv);
    T_EQ_INT(c->head_dim, s->head_dim);
    T_EQ_INT(c->rope_dim, s->head_dim);
    T_EQ_INT(c->n_ff, s->n_ff);
    T_EQ_INT(c->n_vocab, s->n_vocab);
    T_EQ_INT(c->n_ctx_train, 4096);
    T_NEAR(c->norm_eps, 1e-5, 1e-12);
    T_NEAR(c->rope_base, 500000.0, 1e-3);
    T_EQ_INT(c->rope_layout, MDL_ROPE_HALF);
    T_EQ_INT(c->has_qkv_bias, s->bias);
    int tied = s->tie == 1 || (s->tie == -1 && !s->lm_head);
    T_EQ_INT(c->tied_output, tied);
    check_tensor(&m->tok_embd, "model.embed_tokens.weight", 0);
    check_tensor(&m->out_norm, "model.norm.weight", 1);
    if (tied) T_CHECK(m->output.data == m->tok_embd.data && m->output.name == m->tok_embd.name);
    else check_tensor(&m->output, "lm_head.weight", 0);
    char nm[96];
    for (int l = 0; l < s->n_layer; l++) {
        const mdl_layer *ly = &m->layers[l];
#define CT(field, suffix, conv) snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), check_tensor(&ly->field, nm, conv)
        CT(attn_norm, "input_layernorm.weight", 1);
        CT(wq, "self_attn.q_proj.weight", 0);
        CT(wk, "self_attn.k_proj.weight", 0);
        CT(wv, "self_attn.v_proj.weight", 0);
        CT(wo, "self_attn.o_proj.weight", 0);
        CT(ffn_norm, "post_attention_layernorm.weight", 1);
        CT(w_gate, "mlp.gate_proj.weight", 0);
        CT(w_up, "mlp.up_proj.weight", 0);
        CT(w_down, "mlp.down_proj.weight", 0);
        if (s->bias) {
            CT(bq, "self_attn.q_proj.bias", 1);
            CT(bk, "self_attn.k_proj.bias", 1);
            CT(bv, "self_attn.v_proj.bias", 1);
        } else
            T_CHECK(!ly->bq.data && !ly->bk.data && !ly->bv.data);
#undef CT
    }
    /* Every norm vector is F32 whatever the checkpoint's dtype. */
    T_EQ_INT(m->out_norm.type, DT_F32);
    T_EQ_INT(m->layers[0].attn_norm.type, DT_F32);
    T_CHECK(m->weight_bytes > 0);
}

static int load(const char *path, mdl_model **m, char *err, size_t errlen) {
    err[0] = 0;
    return mdl_load(path, m, err, errlen);
}

/* A load that must fail: non-zero code, one line that starts with prefix and mentions `want`. */
static void expect_fail(const char *path, const char *prefix, const char *want, int line) {
    mdl_model *m = (mdl_model *)1;
    char err[512];
    int rc = load(path, &m, err, sizeof err);
    T_CHECKF(rc < 0 && m == NULL, "line %d: %s loaded (rc %d)", line, path, rc);
    if (!rc) mdl_free(m);
    T_CHECKF(!strncmp(err, prefix, strlen(prefix)) && !strchr(err, '\n'), "line %d: error '%s' does not start with '%s'",
             line, err, prefix);
    T_CHECKF(strstr(err, want) != NULL, "line %d: error '%s' does not mention '%s'", line, err, want);
}
#define EXPECT_FAIL(path, prefix, want) expect_fail(path, prefix, want, __LINE__)

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

/* ---- the permutation ---------------------------------------------------------------------- */

static void rope_half(float *x, int hd, int pos, float theta) {
    for (int i = 0; i < hd / 2; i++) {
        double f = pos * pow(theta, -2.0 * i / hd), c = cos(f), s = sin(f);
        float a = x[i], b = x[i + hd / 2];
        x[i] = (float)(a * c - b * s);
        x[i + hd / 2] = (float)(a * s + b * c);
    }
}

static void rope_adjacent(float *x, int hd, int pos, float theta) {
    for (int i = 0; i < hd / 2; i++) {
        double f = pos * pow(theta, -2.0 * i / hd), c = cos(f), s = sin(f);
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = (float)(a * c - b * s);
        x[2 * i + 1] = (float)(a * s + b * c);
    }
}

static void test_permute(void) {
    enum { NH = 3, HD = 6, NE = 5 };
    float src[NH * HD * NE], dst[NH * HD * NE];
    for (int i = 0; i < NH * HD * NE; i++) src[i] = (float)i, dst[i] = -1;
    T_EQ_INT(mdl_permute_qk_hf_to_gguf(src, dst, NH, HD, NE), 0);
    int bad = 0;
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < HD / 2; i++)
            for (int t = 0; t < 2; t++)
                for (int c = 0; c < NE; c++)
                    bad += dst[(h * HD + 2 * i + t) * NE + c] != src[(h * HD + t * HD / 2 + i) * NE + c];
    T_EQ_INT(bad, 0);
    /* A permutation: every source row appears once. */
    float sum_s = 0, sum_d = 0;
    for (int i = 0; i < NH * HD * NE; i++) sum_s += src[i], sum_d += dst[i];
    T_EQ_INT(sum_s, sum_d);
    T_EQ_INT(mdl_permute_qk_hf_to_gguf(src, dst, NH, 5, NE), CM_EINVAL);
    T_EQ_INT(mdl_permute_qk_hf_to_gguf(src, src, NH, HD, NE), CM_EINVAL);
    T_EQ_INT(mdl_permute_qk_hf_to_gguf(src, dst, 0, HD, NE), CM_EINVAL);

    /* The point of it: half-split RoPE on W x equals, row-permuted, adjacent-pair RoPE on
     * permute(W) x. */
    enum { H2 = 2, D2 = 8, E2 = 16 };
    float w[H2 * D2 * E2], wp[H2 * D2 * E2], x[E2], q[H2 * D2], qp[H2 * D2];
    for (int i = 0; i < H2 * D2 * E2; i++) w[i] = (float)sin(i * 0.37);
    for (int i = 0; i < E2; i++) x[i] = (float)cos(i * 0.91);
    T_EQ_INT(mdl_permute_qk_hf_to_gguf(w, wp, H2, D2, E2), 0);
    double maxdiff = 0;
    for (int pos = 0; pos < 50; pos += 7) {
        for (int r = 0; r < H2 * D2; r++) {
            double a = 0, b = 0;
            for (int c = 0; c < E2; c++) a += (double)w[r * E2 + c] * x[c], b += (double)wp[r * E2 + c] * x[c];
            q[r] = (float)a;
            qp[r] = (float)b;
        }
        for (int h = 0; h < H2; h++) {
            rope_half(q + h * D2, D2, pos, 10000.0f);
            rope_adjacent(qp + h * D2, D2, pos, 10000.0f);
            for (int i = 0; i < D2 / 2; i++)
                for (int t = 0; t < 2; t++) {
                    double d = fabs(qp[h * D2 + 2 * i + t] - q[h * D2 + t * D2 / 2 + i]);
                    if (d > maxdiff) maxdiff = d;
                }
        }
    }
    T_CHECKF(maxdiff < 1e-5, "rope layouts differ by %g", maxdiff);
}

/* stories260K.gguf written back as an HF checkpoint (q/k rows un-permuted to the half-split
 * layout) must describe the same network: same hyper-parameters and shapes, identical bytes,
 * and mdl_permute_qk_hf_to_gguf() of the loaded q/k equal to the GGUF's rows. */
static void test_gguf_roundtrip(void) {
    mdl_model *g, *m;
    char err[512], dir[256], nm[96];
    if (mdl_load(T_MODELS "stories260K.gguf", &g, err, sizeof err)) {
        T_CHECKF(0, "%s", err);
        return;
    }
    const mdl_config *gc = &g->cfg;
    T_EQ_INT(gc->rope_layout, MDL_ROPE_ADJACENT);
    T_EQ_INT(g->tok_embd.type, DT_F32);
    free_tensors();
    snprintf(dir, sizeof dir, "%s/stories260K-hf", root);
    mkdir(dir, 0700);
    char cfg[1024], p[320];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\":\"llama\",\"hidden_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
             "\"num_key_value_heads\":%d,\"intermediate_size\":%d,\"vocab_size\":%d,\"max_position_embeddings\":%d,"
             "\"rms_norm_eps\":%.9g,\"rope_theta\":%.9g,\"tie_word_embeddings\":%s}",
             gc->n_embd, gc->n_layer, gc->n_head, gc->n_head_kv, gc->n_ff, gc->n_vocab, gc->n_ctx_train, gc->norm_eps,
             gc->rope_base, gc->tied_output ? "true" : "false");
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_file(p, cfg, strlen(cfg));
#define RAW(name, t) add_raw(name, (t).data, (t).ne[1] > 1 ? (t).ne[1] : (t).ne[0], (t).ne[1] > 1 ? (t).ne[0] : 0)
    RAW("model.embed_tokens.weight", g->tok_embd);
    RAW("model.norm.weight", g->out_norm);
    if (!gc->tied_output) RAW("lm_head.weight", g->output);
    int hd = gc->head_dim, E = gc->n_embd;
    for (int l = 0; l < gc->n_layer; l++) {
        const mdl_layer *ly = &g->layers[l];
        const struct { const char *suffix; const mdl_tensor *t; int heads; } map[] = {
            { "input_layernorm.weight", &ly->attn_norm, 0 }, { "self_attn.q_proj.weight", &ly->wq, gc->n_head },
            { "self_attn.k_proj.weight", &ly->wk, gc->n_head_kv }, { "self_attn.v_proj.weight", &ly->wv, 0 },
            { "self_attn.o_proj.weight", &ly->wo, 0 }, { "post_attention_layernorm.weight", &ly->ffn_norm, 0 },
            { "mlp.gate_proj.weight", &ly->w_gate, 0 }, { "mlp.up_proj.weight", &ly->w_up, 0 },
            { "mlp.down_proj.weight", &ly->w_down, 0 },
        };
        for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, map[i].suffix);
            RAW(nm, *map[i].t);
            if (!map[i].heads) continue;
            /* Undo the converter's permutation: HF row h*hd + t*hd/2 + i = GGUF row h*hd + 2i + t. */
            const float *src = map[i].t->data;
            float *dst = (float *)tensors[n_tensors - 1].bytes;
            for (int h = 0; h < map[i].heads; h++)
                for (int k = 0; k < hd / 2; k++)
                    for (int t = 0; t < 2; t++)
                        memcpy(dst + ((size_t)h * hd + t * hd / 2 + k) * E, src + ((size_t)h * hd + 2 * k + t) * E,
                               (size_t)E * 4);
        }
    }
#undef RAW
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_shard(p, 0);
    int rc = mdl_load(dir, &m, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    if (!rc) {
        const mdl_config *c = &m->cfg;
        T_EQ_INT(c->n_embd, gc->n_embd);
        T_EQ_INT(c->n_layer, gc->n_layer);
        T_EQ_INT(c->n_head, gc->n_head);
        T_EQ_INT(c->n_head_kv, gc->n_head_kv);
        T_EQ_INT(c->head_dim, gc->head_dim);
        T_EQ_INT(c->rope_dim, gc->rope_dim);
        T_EQ_INT(c->n_ff, gc->n_ff);
        T_EQ_INT(c->n_vocab, gc->n_vocab);
        T_EQ_INT(c->n_ctx_train, gc->n_ctx_train);
        T_CHECK(c->norm_eps == gc->norm_eps && c->rope_base == gc->rope_base);
        T_EQ_INT(c->tied_output, gc->tied_output);
        T_EQ_INT(c->rope_layout, MDL_ROPE_HALF);
        T_EQ_INT(m->weight_bytes, g->weight_bytes);
        int diff = 0;
        const mdl_tensor *pairs[][2] = { { &m->tok_embd, &g->tok_embd }, { &m->out_norm, &g->out_norm }, { &m->output, &g->output } };
        for (size_t i = 0; i < 3; i++)
            diff += memcmp(pairs[i][0]->ne, pairs[i][1]->ne, sizeof pairs[i][0]->ne) ||
                    memcmp(pairs[i][0]->data, pairs[i][1]->data, pairs[i][1]->nbytes);
        float *perm = malloc(g->layers[0].wq.nbytes);
        for (int l = 0; l < c->n_layer; l++) {
            const mdl_layer *a = &m->layers[l], *b = &g->layers[l];
            const mdl_tensor *same[][2] = { { &a->attn_norm, &b->attn_norm }, { &a->wv, &b->wv }, { &a->wo, &b->wo },
                                            { &a->ffn_norm, &b->ffn_norm }, { &a->w_gate, &b->w_gate },
                                            { &a->w_up, &b->w_up }, { &a->w_down, &b->w_down } };
            for (size_t i = 0; i < sizeof same / sizeof *same; i++)
                diff += memcmp(same[i][0]->ne, same[i][1]->ne, sizeof same[i][0]->ne) ||
                        memcmp(same[i][0]->data, same[i][1]->data, same[i][1]->nbytes);
            T_EQ_INT(mdl_permute_qk_hf_to_gguf(a->wq.data, perm, c->n_head, hd, E), 0);
            diff += memcmp(a->wq.ne, b->wq.ne, sizeof a->wq.ne) || memcmp(perm, b->wq.data, b->wq.nbytes);
            diff += memcmp(a->wq.data, b->wq.data, b->wq.nbytes) == 0; /* the stored rows do differ */
            T_EQ_INT(mdl_permute_qk_hf_to_gguf(a->wk.data, perm, c->n_head_kv, hd, E), 0);
            diff += memcmp(a->wk.ne, b->wk.ne, sizeof a->wk.ne) || memcmp(perm, b->wk.data, b->wk.nbytes);
        }
        free(perm);
        T_EQ_INT(diff, 0);
        mdl_free(m);
    }
    free_tensors();
    mdl_free(g);
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(void) {
    snprintf(root, sizeof root, "/tmp/arka-st-test-XXXXXX");
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    char dir[256], p[320], err[512];
    mdl_model *m;

    /* 1. llama, F32, one shard, separate lm_head (tie key absent). */
    spec s = base_spec();
    snprintf(dir, sizeof dir, "%s/llama-f32", root);
    make_model(dir, &s);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    if (m) { check_model(m, &s); mdl_free(m); }
    else fprintf(stderr, "%s\n", err);
    /* The same through the file path (config.json beside it). */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    T_EQ_INT(load(p, &m, err, sizeof err), 0);
    if (m) { check_model(m, &s); mdl_free(m); }

    /* 2. llama, BF16 matrices and BF16 norms, tied explicitly, lm_head present but ignored. */
    s = base_spec();
    s.wdtype = "BF16"; s.ndtype = "BF16"; s.tie = 1;
    snprintf(dir, sizeof dir, "%s/llama-bf16-tied", root);
    make_model(dir, &s);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    if (m) { check_model(m, &s); mdl_free(m); }

    /* 3. qwen2 with biases, F16 everything, tied by omission (no lm_head, no key), two shards. */
    s = base_spec();
    s.arch = "qwen2"; s.wdtype = "F16"; s.ndtype = "F16"; s.bias = 1; s.lm_head = 0; s.shards = 2; s.n_layer = 3;
    snprintf(dir, sizeof dir, "%s/qwen2-f16-sharded", root);
    make_model(dir, &s);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    if (m) { check_model(m, &s); mdl_free(m); }
    else fprintf(stderr, "%s\n", err);

    /* 4. mistral, no head_dim in config (derived), MHA, llama3 scaling, F32 norms + F16 weights. */
    s = base_spec();
    s.arch = "mistral"; s.wdtype = "F16"; s.n_kv = 4; s.omit_head_dim = 1; s.tie = 0;
    s.extra_cfg = ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                  "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}";
    snprintf(dir, sizeof dir, "%s/mistral", root);
    make_model(dir, &s);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    if (m) {
        check_model(m, &s);
        T_EQ_INT(m->cfg.rope_scaling, MDL_ROPE_SCALING_LLAMA3);
        T_NEAR(m->cfg.rope_factor, 8.0, 0);
        T_NEAR(m->cfg.rope_low_freq_factor, 1.0, 0);
        T_NEAR(m->cfg.rope_high_freq_factor, 4.0, 0);
        T_EQ_INT(m->cfg.rope_orig_ctx, 8192);
        mdl_free(m);
    }
    /* Linear scaling through the older "type" key; head_dim different from hidden/heads. */
    s = base_spec();
    s.head_dim = 8; /* 4 heads x 8 = 32 != hidden 16, as Gemma-style configs allow */
    s.extra_cfg = ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.5}";
    snprintf(dir, sizeof dir, "%s/linear", root);
    make_model(dir, &s);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    if (m) {
        check_model(m, &s);
        T_EQ_INT(m->cfg.rope_scaling, MDL_ROPE_SCALING_LINEAR);
        T_NEAR(m->cfg.rope_factor, 2.5, 0);
        mdl_free(m);
    }

    /* Misaligned data inside the file (an odd-sized tensor first): matrices are copied to
     * aligned memory, values unchanged. */
    s = base_spec();
    s.odd_prefix = 1;
    snprintf(dir, sizeof dir, "%s/odd", root);
    make_model(dir, &s);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    if (m) {
        check_model(m, &s);
        T_EQ_INT((uintptr_t)m->tok_embd.data % 4, 0);
        T_EQ_INT((uintptr_t)m->layers[1].w_down.data % 4, 0);
        mdl_free(m);
    }

    /* 5. Bad config.json. */
    s = base_spec();
    snprintf(dir, sizeof dir, "%s/cfg", root);
    make_model(dir, &s);
    char cfgp[320];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    static const struct { const char *text, *want; } cfgs[] = {
        { "{\"model_type\":\"llama\",", "malformed JSON" },
        { "[1,2]", "not an object" },
        { "{\"hidden_size\":16}", "model_type" },
        { "{\"model_type\":\"gpt2\",\"hidden_size\":16}", "unsupported model_type 'gpt2'" },
        { "{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":24,\"vocab_size\":32}",
          "missing key 'hidden_size'" },
        { "{\"model_type\":\"llama\",\"hidden_size\":\"16\",\"num_hidden_layers\":2}", "'hidden_size' is not an integer" },
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":100000}", "num_hidden_layers" },
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":-2}", "num_hidden_layers" },
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":24,"
          "\"vocab_size\":32,\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4}}", "unsupported rope_scaling type 'dynamic'" },
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":24,"
          "\"vocab_size\":32,\"rope_scaling\":{\"type\":\"linear\"}}", "factor" },
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":24,"
          "\"vocab_size\":32,\"rms_norm_eps\":-1}", "rms_norm_eps" },
        { "{\"model_type\":\"llama\",\"hidden_size\":17,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":24,"
          "\"vocab_size\":32}", "not a multiple" },
        { "{\"model_type\":\"llama\",\"hidden_size\":32,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":24,"
          "\"vocab_size\":32}", "shape" }, /* config disagrees with the tensors */
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
          "\"intermediate_size\":24,\"vocab_size\":32}", "beyond num_hidden_layers" },
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":3,"
          "\"intermediate_size\":24,\"vocab_size\":32}", "multiple" },
        { "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
          "\"intermediate_size\":24,\"vocab_size\":32,\"tie_word_embeddings\":\"yes\"}", "tie_word_embeddings" },
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        write_file(cfgp, cfgs[i].text, strlen(cfgs[i].text));
        /* Config problems are reported against config.json or the model path. */
        EXPECT_FAIL(dir, root, cfgs[i].want);
    }
    unlink(cfgp);
    EXPECT_FAIL(dir, dir, "no config.json");
    /* Not a model directory at all. */
    snprintf(dir, sizeof dir, "%s/empty", root);
    mkdir(dir, 0700);
    EXPECT_FAIL(dir, dir, "no config.json");
    s = base_spec();
    write_config(dir, &s);
    EXPECT_FAIL(dir, dir, "neither model.safetensors nor");

    /* 6. Missing tensors; tie false without lm_head; a bias in a non-bias model; unsupported dtype. */
    s = base_spec();
    s.skip = "model.layers.1.mlp.up_proj.weight";
    snprintf(dir, sizeof dir, "%s/missing", root);
    make_model(dir, &s);
    EXPECT_FAIL(dir, dir, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
    s = base_spec();
    s.tie = 0; s.lm_head = 0;
    snprintf(dir, sizeof dir, "%s/notie", root);
    make_model(dir, &s);
    EXPECT_FAIL(dir, dir, "missing tensor 'lm_head.weight'");
    s = base_spec();
    s.bias = 1; s.arch = "qwen2"; s.skip = "model.layers.1.self_attn.k_proj.bias";
    snprintf(dir, sizeof dir, "%s/partialbias", root);
    make_model(dir, &s);
    EXPECT_FAIL(dir, dir, "missing tensor 'model.layers.1.self_attn.k_proj.bias'");
    s = base_spec();
    s.wdtype = "I8";
    snprintf(dir, sizeof dir, "%s/int8", root);
    make_model(dir, &s);
    EXPECT_FAIL(dir, dir, "tensor 'model.embed_tokens.weight' has dtype I8");

    /* 7. Hostile shard headers, each against a valid config (the shard is checked first). */
    s = base_spec();
    snprintf(dir, sizeof dir, "%s/hostile", root);
    make_model(dir, &s);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    float data[16];
    for (int i = 0; i < 16; i++) data[i] = (float)i;
    static const struct { const char *hdr; size_t n; const char *want; } hs[] = {
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "run past the end" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
          12, "overlap" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
          8, "overlap" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "reversed" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
          20, "unaccounted" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "after the last tensor" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12 bytes" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2,2,2,2],\"data_offsets\":[0,128]}}", 64, "rank 5" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 8, "dimension" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, "dimension" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807],\"data_offsets\":[0,8]}}", 8, "dimension" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1048576,1048576,1048576],\"data_offsets\":[0,8]}}", 8, "absurd" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551615]}}", 8, "data_offsets" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets" },
        { "{\"a\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'Q9'" },
        { "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype" },
        { "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "shape" },
        { "{\"a\":7}", 8, "not an object" },
        { "{\"__metadata__\":5}", 0, "__metadata__" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "malformed header JSON" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8, "malformed header JSON" },
        { "[1]", 0, "not a JSON object" },
        { "", 0, "not a JSON object" },
        { "{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "empty tensor name" },
        { "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "NUL" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
          16, "appears twice" },
    };
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) {
        write_raw(p, hs[i].hdr, data, hs[i].n);
        EXPECT_FAIL(dir, p, hs[i].want);
    }
    /* Header length past EOF, over the cap, and files too short to hold the length. */
    uint8_t raw[64] = { 0 };
    uint64_t lens[] = { 57, 1000, (uint64_t)100 << 20 | 1, UINT64_MAX, (uint64_t)1 << 63 };
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        for (int k = 0; k < 8; k++) raw[k] = (uint8_t)(lens[i] >> (8 * k));
        memcpy(raw + 8, "{}", 2);
        write_file(p, raw, sizeof raw);
        EXPECT_FAIL(dir, p, lens[i] > (100u << 20) ? "cap" : "past the end");
    }
    for (size_t n = 0; n < 8; n++) {
        write_file(p, raw, n);
        EXPECT_FAIL(dir, p, "too short");
    }

    /* 8. Every truncation of a valid shard fails cleanly; every byte of the header region
     * corrupted one at a time never crashes (it loads or gives a one-line error). */
    s = base_spec();
    s.bias = 1; s.arch = "qwen2"; s.n_layer = 1; s.wdtype = "BF16";
    snprintf(dir, sizeof dir, "%s/trunc", root);
    make_model(dir, &s);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    long full = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *orig = malloc((size_t)full);
    T_EQ_INT(fread(orig, 1, (size_t)full, f), full);
    fclose(f);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    mdl_free(m);
    uint64_t hlen = 0;
    for (int k = 0; k < 8; k++) hlen |= (uint64_t)orig[k] << (8 * k);
    int trunc_bad = 0, n_trunc = 0;
    for (long k = 0; k < full; k += (k < (long)hlen + 64 ? 1 : 37)) {
        write_file(p, orig, (size_t)k);
        m = (mdl_model *)1;
        int rc = load(dir, &m, err, sizeof err);
        n_trunc++;
        if (rc == 0 || m || strncmp(err, p, strlen(p)) || strchr(err, '\n')) {
            if (trunc_bad++ < 3) fprintf(stderr, "truncation at %ld: rc %d err '%s'\n", k, rc, err);
            if (!rc) mdl_free(m);
        }
    }
    T_EQ_INT(trunc_bad, 0);
    T_CHECK(n_trunc > (long)hlen);
    int corrupt_bad = 0;
    uint8_t *mut = malloc((size_t)full);
    for (uint64_t k = 0; k < 8 + hlen; k++) {
        memcpy(mut, orig, (size_t)full);
        mut[k] ^= (uint8_t)(k % 2 ? 0x01 : 0x5a);
        write_file(p, mut, (size_t)full);
        m = NULL;
        int rc = load(dir, &m, err, sizeof err);
        if (rc == 0) mdl_free(m);
        else if (!err[0] || strchr(err, '\n')) corrupt_bad++;
    }
    T_EQ_INT(corrupt_bad, 0);
    free(mut);
    free(orig);

    /* 9. Sharded checkpoints with a broken index. */
    s = base_spec();
    s.shards = 2;
    snprintf(dir, sizeof dir, "%s/badindex", root);
    make_model(dir, &s);
    T_EQ_INT(load(dir, &m, err, sizeof err), 0);
    mdl_free(m);
    char ixp[320];
    snprintf(ixp, sizeof ixp, "%s/model.safetensors.index.json", dir);
    static const struct { const char *text, *want; } ixs[] = {
        { "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00003-of-00002.safetensors\"}}", "is missing" },
        { "{\"weight_map\":{\"model.embed_tokens.weight\":\"../x.safetensors\"}}", "does not name a file" },
        { "{\"weight_map\":{\"model.embed_tokens.weight\":\"..\"}}", "does not name a file" },
        { "{\"weight_map\":{\"model.embed_tokens.weight\":7}}", "does not name a file" },
        { "{\"weight_map\":{}}", "weight_map" },
        { "{\"metadata\":{}}", "weight_map" },
        { "{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}", "does not hold it" },
        { "{\"weight_map\":{\"model.nothing\":\"model-00001-of-00002.safetensors\"}}", "does not hold it" },
        { "{\"weight_map\":", "malformed JSON" },
    };
    for (size_t i = 0; i < sizeof ixs / sizeof *ixs; i++) {
        write_file(ixp, ixs[i].text, strlen(ixs[i].text));
        EXPECT_FAIL(dir, ixp, ixs[i].want);
    }
    /* An index naming only the first shard: tensors of the second are then missing. */
    {
        sbuf ix = { 0 };
        sb_printf(&ix, "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\"}}");
        write_file(ixp, ix.p, ix.n);
        free(ix.p);
        EXPECT_FAIL(dir, dir, "missing tensor");
    }
    /* The same tensor in both shards. */
    s = base_spec();
    s.shards = 2;
    snprintf(dir, sizeof dir, "%s/dup", root);
    make_model(dir, &s);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    for (int i = 0; i < n_tensors; i++)
        if (!strcmp(tensors[i].name, "model.embed_tokens.weight")) tensors[i].shard = 1;
    write_shard(p, 1);
    EXPECT_FAIL(dir, dir, "appears twice");
    free_tensors();

    /* Every truncation of config.json and of the index fails cleanly. */
    s = base_spec();
    s.shards = 2;
    snprintf(dir, sizeof dir, "%s/jsontrunc", root);
    make_model(dir, &s);
    free_tensors();
    static const char *const jsons[] = { "config.json", "model.safetensors.index.json" };
    for (int j = 0; j < 2; j++) {
        snprintf(p, sizeof p, "%s/%s", dir, jsons[j]);
        FILE *jf = fopen(p, "rb");
        char jbuf[8192];
        size_t jn = fread(jbuf, 1, sizeof jbuf, jf);
        fclose(jf);
        int jbad = 0;
        for (size_t k = 0; k + 1 < jn; k++) { /* the last byte is a newline or '}' */
            write_file(p, jbuf, k);
            m = (mdl_model *)1;
            int rc = load(dir, &m, err, sizeof err);
            if (rc == 0 || m || strncmp(err, p, strlen(p)) || strchr(err, '\n')) {
                if (jbad++ < 3) fprintf(stderr, "%s cut at %zu: rc %d '%s'\n", jsons[j], k, rc, err);
                if (!rc) mdl_free(m);
            }
        }
        T_EQ_INT(jbad, 0);
        write_file(p, jbuf, jn);
        T_EQ_INT(load(dir, &m, err, sizeof err), 0);
        mdl_free(m);
    }

    /* 10. A path that does not exist. */
    snprintf(p, sizeof p, "%s/nope", root);
    EXPECT_FAIL(p, p, "no such file");
    snprintf(p, sizeof p, "%s/nope/model.safetensors", root);
    EXPECT_FAIL(p, p, "no such file");

    test_permute();
    test_gguf_roundtrip();

    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return t_done();
}
