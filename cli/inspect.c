/* arka inspect FILE: architecture, hyper-parameters, tensors, tokenizer. */
#include "cli.h"
#include "common/cm_config.h"
#include "model/dtype.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_tokenizer(const gguf_ctx *g) {
    char *kind = NULL, *pre = NULL;
    gguf_get_strdup(g, "tokenizer.ggml.model", &kind);
    gguf_get_strdup(g, "tokenizer.ggml.pre", &pre);
    const gguf_value *toks = NULL;
    gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &toks);
    printf("tokenizer: %s%s%s, %llu tokens\n", kind ? kind : "none", pre ? " pre=" : "", pre ? pre : "",
           toks ? (unsigned long long)toks->v.arr.n : 0ull);
    static const char *const specials[][2] = { { "bos", "tokenizer.ggml.bos_token_id" }, { "eos", "tokenizer.ggml.eos_token_id" },
                                               { "unk", "tokenizer.ggml.unknown_token_id" }, { "pad", "tokenizer.ggml.padding_token_id" },
                                               { "eot", "tokenizer.ggml.eot_token_id" } };
    printf("special tokens:");
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        uint32_t id;
        if (gguf_get_u32(g, specials[i][1], &id) == 0 && (!toks || id < toks->v.arr.n)) {
            printf(" %s=%u", specials[i][0], id);
            if (toks && id < toks->v.arr.n)
                printf(" '%.*s'", (int)(toks->v.arr.strs[id].len > 32 ? 32 : toks->v.arr.strs[id].len), toks->v.arr.strs[id].ptr);
        }
    }
    int add_bos;
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) == 0) printf(" add_bos=%d", add_bos);
    printf("\n");
    const gguf_value *tmpl = gguf_find(g, "tokenizer.chat_template");
    printf("chat template: %s\n", tmpl && tmpl->type == GGUF_STRING ? "present" : "none");
    free(kind);
    free(pre);
}

int cli_inspect(int argc, char **argv) {
    int verbose = 0;
    cm_opt opts[] = {
        { "verbose", 'v', CM_OPT_BOOL, &verbose, "list every tensor and metadata key" },
        { 0 },
    };
    char err[512];
    int npos;
    char **pos;
    int prc = cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err);
    if (prc || npos != 1) {
        int help = prc && !strcmp(err, "help");
        if (prc && !help) fprintf(stderr, "arka inspect: %s\n", err);
        else if (!prc) fprintf(stderr, "arka inspect: expected exactly one FILE\n");
        fprintf(help ? stdout : stderr, "usage: arka inspect [--verbose] FILE\n");
        cm_config_usage(opts, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    mdl_model *m;
    if (mdl_load(pos[0], &m, err, sizeof err)) {
        fprintf(stderr, "arka inspect: %s\n", err);
        return 1;
    }
    const mdl_config *c = &m->cfg;
    printf("file: %s (%s)\n", pos[0], m->format == MDL_FORMAT_GGUF ? "GGUF" : "safetensors");
    if (m->gguf) printf("gguf version: %u, alignment %llu\n", gguf_version(m->gguf), (unsigned long long)gguf_alignment(m->gguf));
    printf("name: %s\n", c->name[0] ? c->name : "-");
    printf("architecture: %s\n", c->arch_name);
    printf("dim (n_embd): %d\n", c->n_embd);
    printf("layers: %d\n", c->n_layer);
    printf("heads: %d\n", c->n_head);
    printf("kv heads: %d\n", c->n_head_kv);
    printf("head dim: %d\n", c->head_dim);
    printf("ffn dim: %d\n", c->n_ff);
    printf("vocab: %d\n", c->n_vocab);
    printf("context (trained): %d\n", c->n_ctx_train);
    printf("rms eps: %g\n", c->norm_eps);
    printf("rope: dim %d, base %g, layout %s, scaling %s", c->rope_dim, c->rope_base,
           c->rope_layout == MDL_ROPE_ADJACENT ? "adjacent-pairs" : "half-split", mdl_rope_scaling_name(c->rope_scaling));
    if (c->rope_scaling) printf(" factor %g", c->rope_factor);
    if (c->rope_scaling == MDL_ROPE_SCALING_LLAMA3)
        printf(" low %g high %g original context %d", c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_orig_ctx);
    if (c->rope_scaling == MDL_ROPE_SCALING_YARN)
        printf(" beta fast %g slow %g original context %d", c->rope_beta_fast, c->rope_beta_slow, c->rope_orig_ctx);
    if (c->rope_scaling == MDL_ROPE_SCALING_LONGROPE) printf(" original context %d (long/short factors per pair)", c->rope_orig_ctx);
    if (c->rope_attn_factor != 1.0f) printf(", attention factor %g", c->rope_attn_factor);
    if (c->rope_swa_own) printf("; sliding layers: base %g, unscaled", c->rope_base_swa);
    printf("\n");
    printf("qkv bias: %s\n", c->has_qkv_bias ? "yes" : "no");
    printf("qk norm: %s\n", c->has_qk_norm ? "yes" : "no");
    printf("post norms: %s\n", c->has_post_norms ? "yes" : "no");
    printf("mlp: %s%s\n", c->ffn_act == MDL_ACT_GELU_TANH ? "geglu (tanh gelu)" : "swiglu", c->n_expert ? ", mixture of experts" : "");
    if (c->n_expert) {
        int sparse = 0;
        for (int l = 0; l < c->n_layer; l++) sparse += m->layers[l].ffn_gate_inp.data != NULL;
        printf("experts: %d, %d per token, expert ffn %d, weights %s, %d of %d layers sparse\n", c->n_expert, c->n_expert_used, c->n_ff_exp,
               c->expert_norm ? "renormalised" : "as routed", sparse, c->n_layer);
    }
    if (c->n_layer_swa) {
        printf("sliding window: %d positions on %d of %d layers (", c->n_swa, c->n_layer_swa, c->n_layer);
        for (int l = 0; l < c->n_layer; l++) putchar(m->layers[l].swa ? 'S' : 'F');
        printf(")\n");
    } else {
        printf("sliding window: none\n");
    }
    printf("attention scale: %g%s\n", c->attn_scale, fabsf(c->attn_scale * sqrtf((float)c->head_dim) - 1.0f) > 1e-6f ? "" : " (1/sqrt(head dim))");
    if (c->attn_softcap > 0 || c->final_softcap > 0) printf("soft-cap: attention %g, logits %g\n", c->attn_softcap, c->final_softcap);
    if (c->embd_scale != 1.0f) printf("embedding scale: %g\n", c->embd_scale);
    if (c->pooling) printf("embeddings: %s pooling%s\n", mdl_pooling_name(c->pooling), c->embd_normalize ? ", L2-normalised" : "");
    printf("output: %s\n", c->tied_output ? "tied to token_embd" : "separate");
    char feats[256];
    unsigned f = mdl_features(c);
    printf("features beyond llama: %s\n", f ? mdl_features_str(f, feats, sizeof feats) : "none");

    /* Tensor summary by type: from the GGUF tensor table, or from the model description. */
    uint64_t count[DT_COUNT] = { 0 }, bytes[DT_COUNT] = { 0 }, total = 0, n = 0;
    if (m->gguf) {
        for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
            const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
            count[t->type]++;
            bytes[t->type] += t->nbytes;
            total += t->nbytes;
            n++;
            if (verbose)
                printf("  tensor %-32.*s %-5s [%lld, %lld, %lld, %lld] %llu bytes\n", (int)t->name.len, t->name.ptr, dt_name(t->type),
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                       (unsigned long long)t->nbytes);
        }
    } else {
        const mdl_tensor *top[] = { &m->tok_embd, &m->out_norm, c->tied_output ? NULL : &m->output };
        for (int l = -1; l < c->n_layer; l++) {
            const mdl_layer *ly = l >= 0 ? &m->layers[l] : NULL;
            const mdl_tensor *lt[] = { ly ? &ly->attn_norm : NULL, ly ? &ly->wq : NULL, ly ? &ly->wk : NULL, ly ? &ly->wv : NULL,
                                       ly ? &ly->wo : NULL, ly ? &ly->bq : NULL, ly ? &ly->bk : NULL, ly ? &ly->bv : NULL,
                                       ly ? &ly->ffn_norm : NULL, ly ? &ly->w_gate : NULL, ly ? &ly->w_up : NULL, ly ? &ly->w_down : NULL,
                                       ly ? &ly->attn_q_norm : NULL, ly ? &ly->attn_k_norm : NULL, ly ? &ly->attn_post_norm : NULL,
                                       ly ? &ly->ffn_post_norm : NULL, ly ? &ly->ffn_gate_inp : NULL };
            const mdl_tensor *const *set = l < 0 ? top : lt;
            size_t cnt = l < 0 ? sizeof top / sizeof *top : sizeof lt / sizeof *lt;
            int n_exp = ly && ly->ffn_gate_inp.data ? c->n_expert : 0;
            for (size_t i = 0; i < cnt + 3 * (size_t)n_exp; i++) {
                const mdl_tensor *t = i < cnt ? set[i] : (i - cnt) % 3 == 0 ? &ly->exp_gate[(i - cnt) / 3]
                                                      : (i - cnt) % 3 == 1 ? &ly->exp_up[(i - cnt) / 3] : &ly->exp_down[(i - cnt) / 3];
                if (!t || !t->data || t->type < 0 || t->type >= DT_COUNT) continue;
                count[t->type]++;
                bytes[t->type] += t->nbytes;
                total += t->nbytes;
                n++;
                if (verbose)
                    printf("  tensor %-32s %-5s [%lld, %lld] %llu bytes\n", t->name, dt_name(t->type), (long long)t->ne[0],
                           (long long)t->ne[1], (unsigned long long)t->nbytes);
            }
        }
    }
    printf("tensors: %llu, %.2f MiB\n", (unsigned long long)n, total / 1048576.0);
    for (int t = 0; t < DT_COUNT; t++)
        if (count[t]) printf("  %-5s %5llu tensors %10.2f MiB\n", dt_name(t), (unsigned long long)count[t], bytes[t] / 1048576.0);
    printf("weights read per token: %.2f MiB", m->active_bytes / 1048576.0);
    if (m->active_bytes != m->weight_bytes) printf(" (of %.2f MiB: the experts a token does not use are skipped)", m->weight_bytes / 1048576.0);
    printf("\n");
    if (m->gguf) {
        print_tokenizer(m->gguf);
        if (verbose)
            for (int64_t i = 0; i < gguf_n_kv(m->gguf); i++) {
                const gguf_kv *kv = gguf_kv_at(m->gguf, i);
                printf("  kv %.*s: %s", (int)kv->key.len, kv->key.ptr, gguf_vtype_name(kv->val.type));
                if (kv->val.type == GGUF_ARRAY) printf("[%s x %llu]", gguf_vtype_name(kv->val.v.arr.elem_type), (unsigned long long)kv->val.v.arr.n);
                else if (kv->val.type == GGUF_STRING) printf(" \"%.*s\"", (int)(kv->val.v.s.len > 60 ? 60 : kv->val.v.s.len), kv->val.v.s.ptr);
                printf("\n");
            }
    }
    mdl_free(m);
    return 0;
}
