/* arka perplexity: llama.cpp's llama-perplexity on any backend, through the engine's generic
 * interface.
 *
 *   arka perplexity -m MODEL (-f TEXT | --ids IDS) [--ctx 512] [--first N] [--chunks N]
 *                   [--save-logits FILE] [--kl-divergence-base FILE] [--backend cpu|cuda]
 *                   [--quantize fp8] [--kv-cache-dtype auto|f32|f16|fp8|q8_0] [--cuda-plan K=V,...]
 *
 * The tokens (the text tokenized without BOS, or the ids file's whitespace- or comma-separated
 * ids) are cut into chunks of --ctx; each chunk is one sequence from position 0 (a text
 * chunk's first token is replaced by BOS when the tokenizer adds one, as llama.cpp does).
 * Positions [first, ctx - 1) of a chunk are scored (first defaults to ctx/2: each scored
 * token has at least half a chunk of context): -log p(token[j+1] | logits[j]). The output
 * is llama.cpp's "[1]x,[2]y,..." running estimate, then the perplexity with its uncertainty.
 *
 * --save-logits FILE writes every chunk's logits of positions [first, ctx) as float32, one
 * row of n_vocab per position, after a header:
 *
 *   char  magic[8]  "ARKALGT1"
 *   u32   version (1), n_vocab, n_ctx, first, n_chunks, 0
 *   i32   tokens[n_chunks * n_ctx]           the tokens each chunk ran on
 *   f32   logits[n_chunks * (n_ctx - first)][n_vocab]
 *
 * (little-endian; numpy: np.fromfile(f, np.float32, offset=32 + 4 * n_chunks * n_ctx)).
 * --kl-divergence-base FILE reads such a file (same vocabulary, context, first position and
 * tokens; as many chunks as it holds), and reports per position against it: the KL
 * divergence KL(base || this), whether the top-1 token agrees, and the relative error
 * |this - base| / |base| of the logit row. Rows stream through: memory stays one row of each.
 */
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "model/model.h"
#include "text/tok.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LOGITS_MAGIC "ARKALGT1"
#define MAX_INPUT_BYTES (1u << 30)

typedef struct {
    uint32_t n_vocab, n_ctx, first, n_chunks;
} lhdr;

static int read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return CM_ENOENT;
    struct stat sb;
    if (fstat(fileno(f), &sb) || sb.st_size > MAX_INPUT_BYTES) { fclose(f); return CM_ETOOBIG; }
    char *b = malloc((size_t)sb.st_size + 1);
    size_t n = b ? fread(b, 1, (size_t)sb.st_size, f) : 0;
    fclose(f);
    if (!b || n != (size_t)sb.st_size) { free(b); return CM_EIO; }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* Whitespace- or comma-separated ids in [0, n_vocab). */
static int parse_ids(const char *path, const char *s, int n_vocab, int32_t **out, int *n_out) {
    size_t cap = strlen(s) / 2 + 2;
    int32_t *ids = malloc(sizeof *ids * cap);
    int n = 0;
    if (!ids) return CM_ENOMEM;
    for (const char *p = s; *p;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_vocab) {
            fprintf(stderr, "arka perplexity: %s: '%.*s' is not a token id in [0, %d)\n", path, (int)strcspn(p, " ,\t\r\n"), p, n_vocab);
            free(ids);
            return CM_EINVAL;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static int write_u32s(FILE *f, const uint32_t *v, int n) { return fwrite(v, 4, (size_t)n, f) == (size_t)n ? 0 : CM_EIO; }

/* log-softmax pieces of one row: max and log(sum exp(x - max)) */
static void lse(const float *x, int n, double *mx, double *ls) {
    float m = x[0];
    for (int i = 1; i < n; i++) if (x[i] > m) m = x[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - m);
    *mx = m;
    *ls = log(s);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

typedef struct {
    double kl_sum, kl_max, rel_sum, rel_max;
    int64_t n, top1;
} kl_acc;

/* KL(base || cur), top-1 agreement and the relative error of one row */
static void compare_row(const float *cur, const float *base, int V, kl_acc *a) {
    double mc, lc, mb, lb, kl = 0, num = 0, den = 0;
    lse(cur, V, &mc, &lc);
    lse(base, V, &mb, &lb);
    for (int i = 0; i < V; i++) {
        double lpb = base[i] - mb - lb, lpc = cur[i] - mc - lc;
        kl += exp(lpb) * (lpb - lpc);
        double d = (double)cur[i] - base[i];
        num += d * d;
        den += (double)base[i] * base[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    a->kl_sum += kl;
    if (kl > a->kl_max) a->kl_max = kl;
    a->rel_sum += rel;
    if (rel > a->rel_max) a->rel_max = rel;
    a->top1 += argmax(cur, V) == argmax(base, V);
    a->n++;
}

static void usage(const cm_opt *opts, FILE *f) {
    fprintf(f, "usage: arka perplexity -m MODEL (-f TEXT | --ids IDS) [options]\n\n"
               "Perplexity over chunks of --ctx tokens (llama.cpp's llama-perplexity). --save-logits writes float32\n"
               "logits (header 'ARKALGT1', see cli/perplexity.c); --kl-divergence-base compares with such a file.\n\noptions:\n");
    cm_config_usage(opts, f);
}

int cli_perplexity(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *ids_path = NULL, *save = NULL, *base = NULL, *backend = "cpu", *quantize = NULL,
               *kv_dtype = NULL, *cuda_plan = NULL;
    int ctx = 512, first = -1, chunks = 0, batch = 512, threads = 0, no_bos = 0;
    cm_opt opts[] = {
        { "model", 'm', CM_OPT_STR, &model, "model file (GGUF) or safetensors directory" },
        { "file", 'f', CM_OPT_STR, &text, "text file to score (tokenized with the model's tokenizer)" },
        { "ids", 0, CM_OPT_STR, &ids_path, "file of token ids (whitespace or comma separated) instead of text" },
        { "ctx", 'c', CM_OPT_INT, &ctx, "tokens per chunk (default 512)" },
        { "first", 0, CM_OPT_INT, &first, "positions of each chunk not scored (context only); default ctx/2" },
        { "chunks", 0, CM_OPT_INT, &chunks, "score at most this many chunks; 0 = all (default)" },
        { "batch", 'b', CM_OPT_INT, &batch, "tokens per forward pass (default 512)" },
        { "backend", 0, CM_OPT_STR, &backend, "cpu | cuda" },
        { "quantize", 0, CM_OPT_STR, &quantize, "none | fp8: convert F16/BF16 weights to FP8 E4M3 at load (per-output-channel scales)" },
        { "kv-cache-dtype", 0, CM_OPT_STR, &kv_dtype, "KV cache type: auto (the backend's: cpu f32, cuda f16) | f32 | f16 | fp8 | q8_0" },
        { "threads", 't', CM_OPT_INT, &threads, "CPU threads; 0 = automatic" },
        { "cuda-plan", 0, CM_OPT_STR, &cuda_plan, "cuda: kernel-plan overrides key=value,..." },
        { "no-bos", 0, CM_OPT_BOOL, &no_bos, "text: do not put BOS at the start of each chunk" },
        { "save-logits", 0, CM_OPT_STR, &save, "write the scored positions' float32 logits to FILE" },
        { "kl-divergence-base", 0, CM_OPT_STR, &base, "compare with logits saved by --save-logits (KL, top-1, relative error)" },
        { 0 } };
    char err[512];
    int npos;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err)) {
        int help = !strcmp(err, "help");
        if (!help) fprintf(stderr, "arka perplexity: %s\n", err);
        usage(opts, help ? stdout : stderr);
        return help ? 0 : 2;
    }
#define USAGE_ERR(...) do { fprintf(stderr, "arka perplexity: "); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 2; } while (0)
    if (npos) USAGE_ERR("unexpected argument '%s'", pos[0]);
    if (!model) USAGE_ERR("no model given (-m MODEL)");
    if (!text == !ids_path) USAGE_ERR("give exactly one of -f TEXT and --ids IDS");
    if (ctx < 2 || ctx > (1 << 24)) USAGE_ERR("--ctx must be in [2, %d] (got %d)", 1 << 24, ctx);
    if (first < 0) first = ctx / 2;
    if (first >= ctx) USAGE_ERR("--first %d must be below --ctx %d", first, ctx);
    if (chunks < 0 || batch < 1 || threads < 0) USAGE_ERR("--chunks >= 0, --batch >= 1, --threads >= 0");
    ex_engine_opts eo;
    ex_engine_opts_default(&eo);
    if (ex_engine_opts_types(&eo, quantize, kv_dtype, err, sizeof err)) USAGE_ERR("%s", err);

    int rc = 1;
    mdl_model *m = NULL;
    tok_vocab *tv = NULL;
    ex_engine *e = NULL;
    int32_t *toks = NULL;
    char *buf = NULL;
    float *brow = NULL;
    FILE *fs = NULL, *fb = NULL;
    ex_batch_buf bb;
    ex_kv_table t;
    memset(&bb, 0, sizeof bb);
    memset(&t, 0, sizeof t);
    double t0 = cm_time_s();
    if (mdl_load(model, &m, err, sizeof err)) { fprintf(stderr, "arka perplexity: %s\n", err); goto done; }
    const int V = m->cfg.n_vocab;
    size_t len = 0;
    const char *in = text ? text : ids_path;
    if ((rc = read_file(in, &buf, &len))) {
        fprintf(stderr, "arka perplexity: %s: %s\n", in, cm_err_str(rc));
        rc = 1;
        goto done;
    }
    rc = 1;
    int n_tok = 0, bos = -1;
    if (ids_path) {
        if (parse_ids(ids_path, buf, V, &toks, &n_tok)) { rc = 2; goto done; }
    } else {
        char terr[256] = "";
        int trc;
        if (m->gguf) trc = tok_load_gguf(m->gguf, &tv, terr, sizeof terr);
        else {
            char tj[4096], tc[4096];
            struct stat sb;
            snprintf(tj, sizeof tj, "%s/tokenizer.json", model);
            snprintf(tc, sizeof tc, "%s/tokenizer_config.json", model);
            trc = tok_load_hf(tj, stat(tc, &sb) == 0 ? tc : NULL, &tv, terr, sizeof terr);
        }
        if (trc) { fprintf(stderr, "arka perplexity: %s: no usable tokenizer (%s); use --ids\n", model, terr); goto done; }
        size_t cap = len + 16;
        if (!(toks = malloc(sizeof *toks * cap))) goto nomem;
        if ((trc = tok_encode(tv, buf, len, 0, 0, toks, (int)(cap > (1u << 30) ? 1u << 30 : cap), &n_tok))) {
            fprintf(stderr, "arka perplexity: %s: cannot tokenize: %s\n", text, cm_err_str(trc));
            goto done;
        }
        if (!no_bos && tok_add_bos(tv)) bos = tok_bos(tv);
    }
    int n_chunks = n_tok / ctx;
    if (chunks > 0 && chunks < n_chunks) n_chunks = chunks;
    if (n_chunks == 0) {
        fprintf(stderr, "arka perplexity: %s has %d tokens, fewer than one chunk of --ctx %d\n", in, n_tok, ctx);
        rc = 2;
        goto done;
    }
    for (int c = 0; bos >= 0 && c < n_chunks; c++) toks[(size_t)c * ctx] = bos;

    lhdr bh = { 0, 0, 0, 0 };
    if (base) {
        if (!(fb = fopen(base, "rb"))) { fprintf(stderr, "arka perplexity: %s: %s\n", base, strerror(errno)); goto done; }
        char magic[8];
        uint32_t h[6];
        if (fread(magic, 1, 8, fb) != 8 || memcmp(magic, LOGITS_MAGIC, 8) || fread(h, 4, 6, fb) != 6 || h[0] != 1) {
            fprintf(stderr, "arka perplexity: %s: not a logits file of version 1 (magic %s)\n", base, LOGITS_MAGIC);
            goto done;
        }
        bh = (lhdr){ h[1], h[2], h[3], h[4] };
        if (bh.n_vocab != (uint32_t)V || bh.n_ctx != (uint32_t)ctx || bh.first != (uint32_t)first) {
            fprintf(stderr, "arka perplexity: %s: vocabulary %u, context %u, first %u; this run has %d, %d, %d\n", base, bh.n_vocab, bh.n_ctx,
                    bh.first, V, ctx, first);
            goto done;
        }
        if (bh.n_chunks < (uint32_t)n_chunks) n_chunks = (int)bh.n_chunks;
        for (uint32_t i = 0; i < bh.n_chunks * (uint64_t)ctx; i++) {
            int32_t tk;
            if (fread(&tk, 4, 1, fb) != 1) { fprintf(stderr, "arka perplexity: %s: truncated token list\n", base); goto done; }
            if (i < (uint64_t)n_chunks * ctx && tk != toks[i]) {
                fprintf(stderr, "arka perplexity: %s: token %u is %d, this run's is %d (another text or tokenizer)\n", base, i, tk, toks[i]);
                goto done;
            }
        }
        if (!(brow = malloc(sizeof *brow * (size_t)V))) goto nomem;
    }
    if (save) {
        if (!(fs = fopen(save, "wb"))) { fprintf(stderr, "arka perplexity: %s: %s\n", save, strerror(errno)); goto done; }
        uint32_t h[6] = { 1, (uint32_t)V, (uint32_t)ctx, (uint32_t)first, (uint32_t)n_chunks, 0 };
        if (fwrite(LOGITS_MAGIC, 1, 8, fs) != 8 || write_u32s(fs, h, 6) ||
            fwrite(toks, 4, (size_t)n_chunks * ctx, fs) != (size_t)n_chunks * ctx) {
            fprintf(stderr, "arka perplexity: %s: write failed\n", save);
            goto done;
        }
    }

    eo.backend = backend;
    eo.cuda.plan = cuda_plan;
    eo.n_threads = threads;
    eo.n_ctx = ctx;
    eo.max_tokens = batch < ctx ? batch : ctx;
    eo.max_seqs = 1;
    eo.max_out = eo.max_tokens;
    if (strcmp(backend, "cuda")) eo.kv_blocks = (ctx + 15) / 16 + 1;
    if (ex_engine_create(m, &eo, &e, err, sizeof err)) { fprintf(stderr, "arka perplexity: %s\n", err); goto done; }
    const ex_limits *L = ex_engine_limits(e);
    ex_kv *kv = ex_engine_kv(e);
    if (ex_batch_buf_init(&bb, L) || ex_kv_table_init(&t, L->max_blocks)) goto nomem;
    fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, scoring positions %d..%d of each; backend %s; loaded in %.2f s\n", n_tok,
            n_chunks, ctx, first, ctx - 2, backend, cm_time_s() - t0);

    double nll = 0, nll2 = 0, t_start = cm_time_s();
    int64_t n_scored = 0;
    kl_acc ka = { 0 };
    for (int c = 0; c < n_chunks; c++) {
        const int32_t *ct = toks + (size_t)c * ctx;
        for (int p0 = 0; p0 < ctx;) {
            int n = ctx - p0 < L->max_tokens ? ctx - p0 : L->max_tokens;
            ex_batch_buf_clear(&bb);
            if (ex_kv_table_reserve(kv, &t, p0 + n)) { fprintf(stderr, "arka perplexity: the KV cache cannot hold %d positions\n", ctx); goto done; }
            ex_batch_buf_add_kv(&bb, ct + p0, n, p0, &t, 1);
            const float *lg;
            if ((rc = ex_engine_forward(e, &bb.b, &lg))) {
                fprintf(stderr, "arka perplexity: forward pass failed: %s\n", cm_err_str(rc));
                rc = 1;
                goto done;
            }
            rc = 1;
            for (int r = 0; r < n; r++) {
                int j = p0 + r;
                const float *row = lg + (size_t)r * V;
                if (j < first) continue;
                if (j + 1 < ctx) {
                    double mx, ls;
                    lse(row, V, &mx, &ls);
                    double v = -(row[ct[j + 1]] - mx - ls);
                    nll += v;
                    nll2 += v * v;
                    n_scored++;
                }
                if (fs && fwrite(row, sizeof *row, (size_t)V, fs) != (size_t)V) { fprintf(stderr, "arka perplexity: %s: write failed\n", save); goto done; }
                if (fb) {
                    if (fread(brow, sizeof *brow, (size_t)V, fb) != (size_t)V) { fprintf(stderr, "arka perplexity: %s: truncated logits\n", base); goto done; }
                    compare_row(row, brow, V, &ka);
                }
            }
            p0 += n;
            ex_kv_table_slide(kv, &t, p0);
        }
        ex_kv_table_release(kv, &t);
        printf("[%d]%.4f,", c + 1, exp(nll / (double)n_scored));
        fflush(stdout);
    }
    double mean = nll / (double)n_scored, var = nll2 / (double)n_scored - mean * mean, ppl = exp(mean);
    double unc = n_scored > 1 && var > 0 ? ppl * sqrt(var / (double)(n_scored - 1)) : 0;
    double el = cm_time_s() - t_start;
    printf("\nperplexity: %.4f +/- %.4f over %lld scored tokens (%d chunks of %d)\n", ppl, unc, (long long)n_scored, n_chunks, ctx);
    if (fb)
        printf("kl-divergence: mean %.6g, max %.6g; top-1 agreement: %.3f %% (%lld of %lld); relative error of logits: mean %.3g, max %.3g\n",
               ka.kl_sum / (double)ka.n, ka.kl_max, 100.0 * (double)ka.top1 / (double)ka.n, (long long)ka.top1, (long long)ka.n,
               ka.rel_sum / (double)ka.n, ka.rel_max);
    fprintf(stderr, "%.2f s, %.1f tokens/s\n", el, el > 0 ? (double)n_chunks * ctx / el : 0.0);
    if (fs && fclose(fs)) { fs = NULL; fprintf(stderr, "arka perplexity: %s: write failed\n", save); goto done; }
    fs = NULL;
    rc = 0;
    goto done;
nomem:
    fprintf(stderr, "arka perplexity: out of memory\n");
done:
    if (fs) fclose(fs);
    if (fb) fclose(fb);
    if (e && t.n) ex_kv_table_release(ex_engine_kv(e), &t);
    ex_kv_table_free(&t);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
    tok_free(tv);
    mdl_free(m);
    free(toks);
    free(buf);
    free(brow);
    return rc;
}
