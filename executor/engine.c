/* engine: batch building and checking, backend dispatch, and the engine object (backend + KV
 * allocator). */
#include "engine.h"
#include "backend.h"
#include "kv.h"
#include "../common/cm_err.h"
#include "../common/cm_log.h"
#include "../model/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ex_engine {
    const mdl_model *m;  /* what the backend runs: the caller's model or qm */
    mdl_model  *qm;      /* the --quantize copy, owned; NULL without one */
    ex_limits   lim;
    ex_kv      *kv;
    ex_backend *be;
    ex_sampler *smp;  /* host sampling (backends without forward_sample, and their refusals) */
};

/* ---- batches ------------------------------------------------------------------------- */

int ex_batch_buf_init(ex_batch_buf *bb, const ex_limits *lim) {
    memset(bb, 0, sizeof *bb);
    if (lim->max_tokens <= 0 || lim->max_seqs <= 0 || lim->max_blocks <= 0) return CM_EINVAL;
    bb->lim = *lim;
    size_t T = (size_t)lim->max_tokens, S = (size_t)lim->max_seqs;
    bb->tok = malloc(T * sizeof(int32_t));
    bb->pos = malloc(T * sizeof(int32_t));
    bb->seq = malloc(T * sizeof(int32_t));
    bb->seq_start = malloc(S * sizeof(int32_t));
    bb->seq_len = malloc(S * sizeof(int32_t));
    bb->n_blocks = malloc(S * sizeof(int32_t));
    bb->seq_out = malloc(S * sizeof(int32_t));
    bb->out_all = malloc(S);
    bb->block_tables = malloc(S * (size_t)lim->max_blocks * sizeof(int32_t));
    if (lim->n_kv_blocks_swa > 0) bb->block_tables_swa = malloc(S * (size_t)lim->max_blocks * sizeof(int32_t));
    if (!bb->tok || !bb->pos || !bb->seq || !bb->seq_start || !bb->seq_len || !bb->n_blocks ||
        !bb->seq_out || !bb->out_all || !bb->block_tables || (lim->n_kv_blocks_swa > 0 && !bb->block_tables_swa)) {
        ex_batch_buf_free(bb);
        return CM_ENOMEM;
    }
    ex_batch_buf_clear(bb);
    return 0;
}

void ex_batch_buf_free(ex_batch_buf *bb) {
    free(bb->tok); free(bb->pos); free(bb->seq);
    free(bb->seq_start); free(bb->seq_len); free(bb->n_blocks); free(bb->seq_out);
    free(bb->out_all); free(bb->block_tables); free(bb->block_tables_swa);
    memset(bb, 0, sizeof *bb);
}

void ex_batch_buf_clear(ex_batch_buf *bb) {
    ex_batch *b = &bb->b;
    memset(b, 0, sizeof *b);
    b->tok = bb->tok; b->pos = bb->pos; b->seq = bb->seq;
    b->seq_start = bb->seq_start; b->seq_len = bb->seq_len; b->n_blocks = bb->n_blocks;
    b->out_all = bb->out_all; b->seq_out = bb->seq_out; b->block_tables = bb->block_tables;
    b->block_tables_swa = bb->block_tables_swa;
    b->bt_stride = bb->lim.max_blocks;
}

int ex_batch_buf_add(ex_batch_buf *bb, const int32_t *ids, int n, int pos0,
                     const int32_t *block_table, int n_blocks, int out_all) {
    ex_batch *b = &bb->b;
    const ex_limits *L = &bb->lim;
    if (n <= 0 || pos0 < 0 || !ids || n_blocks < 0 || (n_blocks && !block_table)) return CM_EINVAL;
    if ((int64_t)pos0 + n > L->n_ctx) return CM_ECTX;
    if (n_blocks > L->max_blocks || (int64_t)n_blocks * L->block_size < (int64_t)pos0 + n) return CM_EINVAL;
    int n_out = out_all ? n : 1;
    if (b->n_seqs >= L->max_seqs || b->n_tokens + n > L->max_tokens || b->n_out + n_out > L->max_out)
        return CM_EFULL;
    int s = b->n_seqs, t0 = b->n_tokens;
    for (int i = 0; i < n; i++) {
        bb->tok[t0 + i] = ids[i];
        bb->pos[t0 + i] = pos0 + i;
        bb->seq[t0 + i] = s;
    }
    bb->seq_start[s] = t0;
    bb->seq_len[s] = n;
    bb->n_blocks[s] = n_blocks;
    bb->out_all[s] = out_all ? 1 : 0;
    bb->seq_out[s] = b->n_out;
    if (n_blocks) memcpy(bb->block_tables + (size_t)s * L->max_blocks, block_table, sizeof(int32_t) * (size_t)n_blocks);
    if (bb->block_tables_swa)
        for (int j = 0; j < n_blocks; j++) bb->block_tables_swa[(size_t)s * L->max_blocks + j] = -1;
    b->n_seqs++;
    b->n_tokens += n;
    b->n_out += n_out;
    return s;
}

int ex_batch_buf_add_kv(ex_batch_buf *bb, const int32_t *ids, int n, int pos0, const ex_kv_table *t, int out_all) {
    int s = ex_batch_buf_add(bb, ids, n, pos0, t->blocks, t->n, out_all);
    if (s >= 0 && bb->block_tables_swa && t->n)
        memcpy(bb->block_tables_swa + (size_t)s * bb->lim.max_blocks, t->blocks_swa, sizeof(int32_t) * (size_t)t->n);
    return s;
}

int ex_batch_check(const ex_batch *b, const ex_limits *L, char *err, size_t errlen) {
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return CM_EINVAL; } while (0)
    if (b->n_tokens <= 0 || b->n_tokens > L->max_tokens) BAD("batch: %d tokens (limit %d)", b->n_tokens, L->max_tokens);
    if (b->n_seqs <= 0 || b->n_seqs > L->max_seqs) BAD("batch: %d sequences (limit %d)", b->n_seqs, L->max_seqs);
    if (b->n_out <= 0 || b->n_out > L->max_out) BAD("batch: %d logits rows (limit %d)", b->n_out, L->max_out);
    if (b->bt_stride <= 0) BAD("batch: block-table stride %d", b->bt_stride);
    int next_tok = 0, next_out = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int t0 = b->seq_start[s], n = b->seq_len[s], nb = b->n_blocks[s];
        if (t0 != next_tok || n <= 0 || t0 + n > b->n_tokens) BAD("batch: sequence %d slice [%d,+%d) out of order", s, t0, n);
        if (b->seq_out[s] != next_out) BAD("batch: sequence %d logits row %d, expected %d", s, b->seq_out[s], next_out);
        next_tok += n;
        next_out += b->out_all[s] ? n : 1;
        if (nb < 0 || nb > b->bt_stride || nb > L->max_blocks) BAD("batch: sequence %d has %d blocks", s, nb);
        int p0 = b->pos[t0];
        if (p0 < 0 || (int64_t)p0 + n > L->n_ctx) BAD("batch: sequence %d positions [%d,%d) past context %d", s, p0, p0 + n, L->n_ctx);
        if ((int64_t)nb * L->block_size < (int64_t)p0 + n) BAD("batch: sequence %d block table (%d blocks) does not cover %d positions", s, nb, p0 + n);
        for (int i = 0; i < n; i++) {
            int t = t0 + i;
            if (b->seq[t] != s) BAD("batch: token %d belongs to sequence %d, expected %d", t, b->seq[t], s);
            if (b->pos[t] != p0 + i) BAD("batch: token %d at position %d, expected %d", t, b->pos[t], p0 + i);
            if (b->tok[t] < 0 || b->tok[t] >= L->n_vocab) BAD("batch: token id %d outside the vocabulary (%d)", b->tok[t], L->n_vocab);
        }
        const int32_t *bt = b->block_tables + (size_t)s * b->bt_stride;
        for (int j = 0; j < nb; j++)
            if (bt[j] < 0 || bt[j] >= L->n_kv_blocks) BAD("batch: sequence %d block %d = %d outside the pool (%d)", s, j, bt[j], L->n_kv_blocks);
        if (L->n_kv_blocks_swa > 0) {
            /* the sliding layers read [first query - window + 1, last query] */
            if (!b->block_tables_swa) BAD("batch: the model has sliding-window layers but the batch no table for them");
            const int32_t *bs = b->block_tables_swa + (size_t)s * b->bt_stride;
            int lo = p0 - L->swa_window + 1;
            for (int j = lo > 0 ? lo / L->block_size : 0; j < nb; j++)
                if (bs[j] < 0 || bs[j] >= L->n_kv_blocks_swa)
                    BAD("batch: sequence %d sliding-window block %d = %d outside the pool (%d)", s, j, bs[j], L->n_kv_blocks_swa);
        }
    }
    if (next_tok != b->n_tokens) BAD("batch: sequences cover %d of %d tokens", next_tok, b->n_tokens);
    if (next_out != b->n_out) BAD("batch: %d logits rows, sequences ask for %d", b->n_out, next_out);
    return 0;
#undef BAD
}

/* ---- backends ------------------------------------------------------------------------ */

int ex_backend_default_kv_type(const char *name) {
    if (!strcmp(name, "cpu")) return DT_F32;
    if (!strcmp(name, "cuda")) return DT_F16;
    return -1;
}

int ex_backend_create(const char *name, const mdl_model *m, const ex_backend_opts *o, ex_backend **out,
                      char *err, size_t errlen) {
    *out = NULL;
    if (!strcmp(name, "cpu")) return ex_backend_cpu_create(m, o, out, err, errlen);
    if (!strcmp(name, "cuda")) {
        if (ex_backend_cuda_create) return ex_backend_cuda_create(m, o, out, err, errlen);
        snprintf(err, errlen, "backend 'cuda' is not built into this binary");
        return CM_EUNSUPPORTED;
    }
    snprintf(err, errlen, "unknown backend '%s' (cpu | cuda)", name);
    return CM_EUNSUPPORTED;
}

/* ---- engine -------------------------------------------------------------------------- */

int ex_quant_from_name(const char *name) {
    if (name && !strcmp(name, "none")) return EX_QUANT_NONE;
    if (name && !strcmp(name, "fp8")) return EX_QUANT_FP8;
    return -1;
}

int ex_engine_opts_types(ex_engine_opts *o, const char *quantize, const char *kv_cache_dtype, char *err, size_t errlen) {
    int q = quantize ? ex_quant_from_name(quantize) : EX_QUANT_NONE;
    int kv = kv_cache_dtype ? ex_kv_type_from_name(kv_cache_dtype) : -1;
    if (q < 0) {
        snprintf(err, errlen, "--quantize '%s': expected none or fp8 (F16/BF16 weights to FP8 E4M3 with per-output-channel "
                 "scales at load)", quantize);
        return CM_EINVAL;
    }
    if (kv == -2) {
        snprintf(err, errlen, "--kv-cache-dtype '%s': expected auto, f32, f16, fp8 or q8_0", kv_cache_dtype);
        return CM_EINVAL;
    }
    o->quantize = q;
    o->kv_type = kv;
    return 0;
}

/* One log line for what the weights and the KV cache are stored as. */
static void log_types(const mdl_model *m, int quantize, int kv_type) {
    const mdl_config *c = &m->cfg;
    const char *w = quantize == EX_QUANT_FP8 ? "fp8 (--quantize fp8: per-output-channel scales)"
                    : c->fp8_weights       ? "fp8 (the checkpoint's scales)"
                                           : "as stored";
    const char *kv = kv_type != DT_F8_E4M3 ? "" : c->kv_scales ? " (static scales per head from the checkpoint)"
                                                              : " (scales per position and head, amax/448 when written)";
    if (quantize || c->fp8_weights || kv_type == DT_F8_E4M3 || kv_type == DT_Q8_0)
        CM_LOG_INFO("engine", "weight and KV cache types", "weights=\"%s\" quant_method=%s kv=%s%s", w,
                    c->quant_method[0] ? c->quant_method : "none", ex_kv_type_name(kv_type), kv);
    if (c->kv_scales && kv_type != DT_F8_E4M3)
        CM_LOG_INFO("engine", "the checkpoint's static KV-cache scales are not used (--kv-cache-dtype fp8 uses them)", "kv=%s",
                    ex_kv_type_name(kv_type));
}

void ex_engine_opts_default(ex_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->kv_type = -1;
    o->gpu_mem_fraction = 0.90;
    o->cuda_graph_budget_s = 60;
}

int ex_engine_create(const mdl_model *m, const ex_engine_opts *o, ex_engine **out, char *err, size_t errlen) {
    *out = NULL;
    const mdl_config *c = &m->cfg; /* the quantized copy's once there is one */
    const char *bname = o->backend ? o->backend : "cpu";
    ex_limits L;
    memset(&L, 0, sizeof L);
    L.n_vocab = c->n_vocab;
    L.block_size = o->block_size > 0 ? o->block_size : 16;
    L.n_ctx = o->n_ctx > 0 ? o->n_ctx : c->n_ctx_train;
    /* per step: the cpu backend's 64 sequences and 512 tokens, or what the cuda backend makes of
     * the device and the model */
    int d_seqs = 64, d_tok = 512;
    if (!strcmp(bname, "cuda") && ex_backend_cuda_defaults && (o->max_tokens <= 0 || o->max_seqs <= 0) &&
        ex_backend_cuda_defaults(o->device, c, &d_seqs, &d_tok) == 0) {
        if (o->max_seqs > 0 && d_tok < o->max_seqs) d_tok = o->max_seqs;
        if (o->max_tokens > 0 && d_seqs > o->max_tokens) d_seqs = o->max_tokens;
    }
    L.max_tokens = o->max_tokens > 0 ? o->max_tokens : d_tok;
    L.max_seqs = o->max_seqs > 0 ? o->max_seqs : d_seqs;
    L.max_out = o->max_out > 0 ? o->max_out : L.max_seqs;
    if (L.block_size > 1024 || L.n_ctx <= 0 || L.n_ctx > (1 << 24) || L.max_seqs > L.max_tokens) {
        snprintf(err, errlen, "engine: invalid limits (block size %d, context %d, %d tokens, %d sequences per step)",
                 L.block_size, L.n_ctx, L.max_tokens, L.max_seqs);
        return CM_EINVAL;
    }
    if (!(o->gpu_mem_fraction > 0 && o->gpu_mem_fraction <= 1)) {
        snprintf(err, errlen, "--gpu-memory-fraction %g is outside (0, 1]", o->gpu_mem_fraction);
        return CM_EINVAL;
    }
    if (!(o->cuda_graph_budget_s >= 0)) {
        snprintf(err, errlen, "--cuda-graph-budget-s %g must be >= 0 (0 = no graphs)", o->cuda_graph_budget_s);
        return CM_EINVAL;
    }
    if (L.max_out > L.max_tokens) L.max_out = L.max_tokens;
    L.max_blocks = (L.n_ctx + L.block_size - 1) / L.block_size;

    int kv_type = o->kv_type >= 0 ? o->kv_type : ex_backend_default_kv_type(bname);
    size_t bbytes = kv_type >= 0 ? ex_kv_block_bytes(c, L.block_size, kv_type) : 0;
    if (!bbytes) {
        snprintf(err, errlen, "engine: KV cache type %s cannot hold this model's heads (head_dim %d) or is unknown to backend '%s'",
                 ex_kv_type_name(kv_type), c->head_dim, bname);
        return CM_EUNSUPPORTED;
    }
    if (o->quantize != EX_QUANT_NONE && o->quantize != EX_QUANT_FP8) {
        snprintf(err, errlen, "engine: unknown weight quantization %d (none, fp8)", o->quantize);
        return CM_EINVAL;
    }
    const int swa = c->n_layer_swa > 0;
    if (swa) L.swa_window = c->n_swa;
    /* The pool's size: explicit (kv_blocks, kv_cache_mb), or automatic: the cuda backend sizes
     * it from free device memory (n_kv_blocks 0 here), the cpu one gets a share of host memory. */
    int from_device = !strcmp(bname, "cuda") && o->kv_blocks <= 0 && o->kv_cache_mb <= 0;
    if (!from_device) {
        int64_t budget = o->kv_cache_mb > 0 ? o->kv_cache_mb * (1LL << 20)
                                            : ex_kv_default_bytes((int64_t)bbytes * L.max_blocks * L.max_seqs);
        int64_t nb, ns = 0;
        if (!swa) {
            nb = o->kv_blocks > 0 ? o->kv_blocks : budget / (int64_t)bbytes;
            /* sized automatically: at least one sequence of the whole context, so a request
             * that fits the context fits the pool (an explicit budget below that is the user's
             * choice: requests that could never fit it are refused, naming the limit) */
            if (o->kv_blocks <= 0 && o->kv_cache_mb <= 0 && nb < L.max_blocks) nb = L.max_blocks;
        } else {
            /* Sliding layers keep about a window of blocks per sequence: their pool holds one
             * whole context (a prompt is admitted in one piece) plus a window and a step's
             * tokens for every other sequence; the full-attention pool gets the rest. */
            int64_t fb = (int64_t)ex_kv_group_bytes(c, 0, L.block_size, kv_type), sb = (int64_t)ex_kv_group_bytes(c, 1, L.block_size, kv_type);
            int64_t per = (L.swa_window + L.max_tokens + L.block_size - 1) / L.block_size + 1;
            int64_t cap = L.max_blocks + (int64_t)L.max_seqs * per, all = (int64_t)L.max_seqs * L.max_blocks;
            if (o->kv_blocks > 0) {
                nb = o->kv_blocks;
                ns = nb < cap ? nb : cap;
            } else if (fb == 0) { /* every layer slides: the full pool is bookkeeping only */
                ns = budget / sb;
                nb = all > ns ? all : ns;
            } else {
                nb = budget / (fb + sb);
                if (nb > cap) nb = (budget - cap * sb) / fb;
                ns = nb < cap ? nb : cap;
            }
            if (ns > (1 << 30)) ns = 1 << 30;
            if (ns < 2) nb = ns; /* reported below */
        }
        if (nb > (1 << 30)) nb = 1 << 30;
        if (nb < 2) {
            snprintf(err, errlen, "KV cache budget of %.1f MiB is too small: one block of %d tokens needs %.2f MiB",
                     budget / 1048576.0, L.block_size, bbytes / 1048576.0);
            return CM_ENOKV;
        }
        L.n_kv_blocks = (int)nb;
        L.n_kv_blocks_swa = (int)ns;
    }

    ex_engine *e = calloc(1, sizeof *e);
    if (!e) return CM_ENOMEM;
    e->m = m;
    int rc;
    if (o->quantize == EX_QUANT_FP8) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int nt = o->n_threads > 0 ? o->n_threads : cores > 0 ? (int)cores : 1;
        if ((rc = mdl_quantize(m, DT_F8_E4M3, nt, &e->qm, err, errlen))) goto fail;
        e->m = m = e->qm;
        c = &m->cfg;
    }
    ex_backend_opts bo = { .lim = L, .n_threads = o->n_threads, .device = o->device, .kv_type = kv_type,
                           .mem_fraction = o->gpu_mem_fraction, .graph_budget_s = o->cuda_graph_budget_s,
                           .cuda = o->cuda };
    rc = ex_backend_create(bname, m, &bo, &e->be, err, errlen);
    if (rc) goto fail;
    if (e->be->kv_type != kv_type) {
        snprintf(err, errlen, "backend '%s' keeps the KV cache as %s; --kv-cache-dtype %s is not implemented there", bname,
                 ex_kv_type_name(e->be->kv_type), ex_kv_type_name(kv_type));
        rc = CM_EUNSUPPORTED;
        goto fail;
    }
    unsigned missing = mdl_features(c) & ~e->be->features;
    if (missing) {
        char names[256];
        snprintf(err, errlen, "backend '%s' does not implement what model '%s' (%s) needs: %s", bname, c->name[0] ? c->name : "?",
                 c->arch_name, mdl_features_str(missing, names, sizeof names));
        rc = CM_EUNSUPPORTED;
        goto fail;
    }
    /* the allocator after the backend: on cuda only the backend knows how many blocks fit */
    L.n_kv_blocks = e->be->n_kv_blocks;
    L.n_kv_blocks_swa = e->be->n_kv_blocks_swa;
    if (swa && L.n_kv_blocks_swa <= 0) {
        snprintf(err, errlen, "backend '%s' allocated no KV pool for the model's %d sliding-window layers", bname, c->n_layer_swa);
        rc = CM_EUNSUPPORTED;
        goto fail;
    }
    e->lim = L;
    rc = ex_kv_create_swa(L.n_kv_blocks, L.n_kv_blocks_swa, L.block_size, L.swa_window, &e->kv);
    if (rc) { snprintf(err, errlen, "engine: KV block allocator for %d blocks: %s", L.n_kv_blocks, cm_err_str(rc)); goto fail; }
    rc = ex_sampler_create(L.n_vocab, &e->smp);
    if (rc) { snprintf(err, errlen, "engine: sampler: %s", cm_err_str(rc)); goto fail; }
    log_types(m, o->quantize, kv_type);
    *out = e;
    return 0;
fail:
    ex_engine_destroy(e);
    return rc;
}

void ex_engine_destroy(ex_engine *e) {
    if (!e) return;
    if (e->be) e->be->destroy(e->be);
    ex_sampler_destroy(e->smp);
    ex_kv_destroy(e->kv);
    mdl_free(e->qm);
    free(e);
}

const ex_limits *ex_engine_limits(const ex_engine *e) { return &e->lim; }
ex_kv *ex_engine_kv(ex_engine *e) { return e->kv; }
ex_backend *ex_engine_backend(ex_engine *e) { return e->be; }
const mdl_model *ex_engine_model(const ex_engine *e) { return e->m; }

int ex_engine_forward(ex_engine *e, const ex_batch *b, const float **logits) {
    char err[256];
    *logits = NULL;
    int rc = ex_batch_check(b, &e->lim, err, sizeof err);
    if (rc) {
        CM_LOG_WARN("engine", "batch refused", "reason=\"%s\"", err);
        return rc;
    }
    return e->be->forward(e->be, b, logits);
}

int ex_engine_forward_sample(ex_engine *e, const ex_batch *b, const ex_sample_row *rows, int n_rows, ex_sample_out *out) {
    char err[256];
    int rc = ex_batch_check(b, &e->lim, err, sizeof err);
    if (!rc && (n_rows < 0 || (n_rows && (!rows || !out)))) {
        snprintf(err, sizeof err, "%d rows to sample", n_rows);
        rc = CM_EINVAL;
    }
    for (int r = 0; r < n_rows && !rc; r++)
        if (rows[r].row < 0 || rows[r].row >= b->n_out || !rows[r].sp) {
            snprintf(err, sizeof err, "sample row %d: logits row %d of %d%s", r, rows[r].row, b->n_out,
                     rows[r].sp ? "" : ", no parameters");
            rc = CM_EINVAL;
        }
    if (rc) {
        CM_LOG_WARN("engine", "batch refused", "reason=\"%s\"", err);
        return rc;
    }
    /* a row with a token mask goes to a device sampler only when it applies masks; else the
     * whole step samples on the host (the logits cross once) */
    int masked = 0;
    for (int r = 0; r < n_rows; r++) masked |= rows[r].mask != NULL;
    if (e->be->forward_sample && (!masked || (e->be->sample_caps & EX_SAMPLE_CAP_MASK))) {
        rc = e->be->forward_sample(e->be, b, rows, n_rows, out);
        if (rc != CM_EUNSUPPORTED) return rc;
    }
    const float *logits;
    if ((rc = e->be->forward(e->be, b, &logits))) return rc;
    for (int r = 0; r < n_rows; r++) /* a refusal leaves out[r].token = -1 */
        ex_sampler_sample(e->smp, &rows[r], logits + (size_t)rows[r].row * e->lim.n_vocab, &out[r]);
    return 0;
}

int ex_engine_forward_hidden(ex_engine *e, const ex_batch *b, const float **hidden) {
    char err[256];
    *hidden = NULL;
    int rc = ex_batch_check(b, &e->lim, err, sizeof err);
    if (rc) {
        CM_LOG_WARN("engine", "batch refused", "reason=\"%s\"", err);
        return rc;
    }
    if (!e->be->forward_hidden) return CM_EUNSUPPORTED;
    return e->be->forward_hidden(e->be, b, hidden);
}

int ex_engine_has_hidden(const ex_engine *e) { return e->be->forward_hidden != NULL; }

int ex_engine_kv_copy(ex_engine *e, int32_t src, int32_t dst, int n_tok) {
    if (!e->be->kv_copy) return CM_EUNSUPPORTED;
    return e->be->kv_copy(e->be, src, dst, n_tok);
}

int ex_engine_embed(ex_engine *e, const ex_batch *b, int pooling, int normalize, float *out) {
    char err[256];
    int rc = ex_batch_check(b, &e->lim, err, sizeof err);
    if (rc) {
        CM_LOG_WARN("engine", "batch refused", "reason=\"%s\"", err);
        return rc;
    }
    if (!e->be->forward_hidden) return CM_EUNSUPPORTED;
    if (pooling != MDL_POOL_LAST && pooling != MDL_POOL_MEAN && pooling != MDL_POOL_CLS) return CM_EINVAL;
    for (int s = 0; s < b->n_seqs; s++)
        if (pooling != MDL_POOL_LAST && (!b->out_all[s] || b->pos[b->seq_start[s]] != 0)) return CM_EINVAL;
    const float *h;
    if ((rc = e->be->forward_hidden(e->be, b, &h))) return rc;
    const int E = e->m->cfg.n_embd;
    for (int s = 0; s < b->n_seqs; s++) {
        float *o = out + (size_t)s * E;
        int first = b->seq_out[s], n = b->out_all[s] ? b->seq_len[s] : 1;
        if (pooling == MDL_POOL_LAST) memcpy(o, h + (size_t)(first + n - 1) * E, sizeof(float) * (size_t)E);
        else if (pooling == MDL_POOL_CLS) memcpy(o, h + (size_t)first * E, sizeof(float) * (size_t)E);
        else
            for (int i = 0; i < E; i++) {
                double acc = 0;
                for (int r = 0; r < n; r++) acc += h[(size_t)(first + r) * E + i];
                o[i] = (float)(acc / n);
            }
        if (normalize) {
            double ss = 0;
            for (int i = 0; i < E; i++) ss += (double)o[i] * o[i];
            float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
            for (int i = 0; i < E; i++) o[i] *= inv;
        }
    }
    return 0;
}
