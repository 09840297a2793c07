/* arka generate: one prompt, one sequence, streamed to stdout, through the same engine,
 * scheduler and sampler the executor uses. stdout carries only the continuation (text, or
 * ids with --ids) and a final newline; everything else goes to stderr. */
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "common/cm_file.h"
#include "common/cm_time.h"
#include "executor/backend.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "executor/sched.h"
#include "text/detok.h"
#include "model/dtype.h"
#include "model/model.h"
#include "text/tok.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOUCH_MIN_BYTES (64ull << 20) /* files below this load without a progress bar */
#define MAX_THREADS     1024          /* what the CPU thread pool accepts (k_pool_create) */

typedef struct {
    const char *model, *prompt, *prompt_ids, *prompt_file, *backend, *quantize, *kv_dtype;
    int     n_predict, top_k, threads, ctx, ids, block_size, batch, no_bos;
    float   temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    int     repeat_last_n;
    int64_t seed, kv_cache_mb;
    double  gpu_mem_fraction, cuda_graph_budget_s;
    ex_cuda_opts cuda;
} gen_opts;

static void usage(const cm_opt *opts) {
    fprintf(stderr, "usage: arka generate -m MODEL (-p PROMPT | --prompt-ids \"1 2 3\") [options]\n\noptions:\n");
    cm_config_usage(opts, stderr);
}

/* Reads every page of the weights once so the first step does not fault them in, with a
 * progress bar for big files. The CPU backend uses the mapping in place. */
static void touch_weights(const mdl_model *m) {
    const mdl_tensor *ts[8];
    uint64_t total = m->weight_bytes ? m->weight_bytes : 1, done = 0;
    if (total < TOUCH_MIN_BYTES) return;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    volatile uint8_t sink = 0;
    int last = -1;
    for (int l = -1; l < m->cfg.n_layer; l++) {
        int n = 0;
        if (l < 0) {
            ts[n++] = &m->tok_embd;
            if (m->output.data != m->tok_embd.data) ts[n++] = &m->output;
        } else {
            const mdl_layer *y = &m->layers[l];
            ts[n++] = &y->wq; ts[n++] = &y->wk; ts[n++] = &y->wv; ts[n++] = &y->wo;
            ts[n++] = &y->w_gate; ts[n++] = &y->w_up; ts[n++] = &y->w_down;
        }
        for (int i = 0; i < n; i++) {
            const uint8_t *p = ts[i]->data;
            for (uint64_t off = 0; p && off < ts[i]->nbytes; off += (uint64_t)page) sink ^= p[off];
            done += ts[i]->nbytes;
            int pct = (int)(done * 100 / total);
            if (pct > 100) pct = 100;
            if (pct / 2 != last / 2) {
                last = pct;
                char bar[51];
                memset(bar, '#', (size_t)pct / 2);
                memset(bar + pct / 2, '.', 50 - (size_t)pct / 2);
                bar[50] = 0;
                fprintf(stderr, "\rloading [%s] %3d%% %.0f MiB", bar, pct, done / 1048576.0);
            }
        }
    }
    (void)sink;
    fputc('\n', stderr);
}

static int parse_ids(const char *s, int n_vocab, int32_t **out, int *n_out, char *err, size_t errlen) {
    size_t cap = strlen(s) / 2 + 2;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    int n = 0;
    if (!ids) return CM_ENOMEM;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_vocab) {
            snprintf(err, errlen, "--prompt-ids: '%.*s' is not a token id in [0, %d)", (int)strcspn(p, " ,\t\n"), p, n_vocab);
            free(ids);
            return CM_EINVAL;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) {
        snprintf(err, errlen, "--prompt-ids: no ids given");
        free(ids);
        return CM_EINVAL;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

int cli_generate(int argc, char **argv) {
    gen_opts g = { .n_predict = 128, .top_k = 40, .temp = 0.8f, .top_p = 0.95f, .min_p = 0.05f,
                   .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = -1, .backend = "cpu", .batch = 512,
                   .gpu_mem_fraction = 0.90, .cuda_graph_budget_s = 60 };
    cm_opt opts[] = {
        { "model", 'm', CM_OPT_STR, &g.model, "model file (GGUF) or safetensors directory" },
        { "prompt", 'p', CM_OPT_STR, &g.prompt, "prompt text" },
        { "prompt-ids", 0, CM_OPT_STR, &g.prompt_ids, "prompt as token ids (\"1 2 3\") instead of text; @FILE reads them from FILE" },
        { "file", 'f', CM_OPT_STR, &g.prompt_file, "prompt text from FILE (long prompts)" },
        { "n-predict", 'n', CM_OPT_INT, &g.n_predict, "tokens to generate (>= 1; default 128)" },
        { "temp", 0, CM_OPT_F32, &g.temp, "temperature; 0 = greedy (default 0.8)" },
        { "top-k", 0, CM_OPT_INT, &g.top_k, "keep the k most likely tokens; 0 = off (default 40)" },
        { "top-p", 0, CM_OPT_F32, &g.top_p, "nucleus sampling mass; 1 = off (default 0.95)" },
        { "min-p", 0, CM_OPT_F32, &g.min_p, "drop tokens below min-p x the top probability (default 0.05)" },
        { "repeat-penalty", 0, CM_OPT_F32, &g.repeat_penalty, "repetition penalty; 1 = off (default 1)" },
        { "repeat-last-n", 0, CM_OPT_INT, &g.repeat_last_n, "previous tokens the penalties see; -1 = all (default 64)" },
        { "presence-penalty", 0, CM_OPT_F32, &g.presence_penalty, "presence penalty (default 0)" },
        { "frequency-penalty", 0, CM_OPT_F32, &g.frequency_penalty, "frequency penalty (default 0)" },
        { "seed", 0, CM_OPT_I64, &g.seed, "sampling seed; -1 = random (printed)" },
        { "threads", 't', CM_OPT_INT, &g.threads, "CPU threads; 0 = all cores" },
        { "kv-cache-mb", 0, CM_OPT_I64, &g.kv_cache_mb,
          "KV cache budget in MiB; 0 = cpu: what the sequence needs, cuda: from --gpu-memory-fraction (one --ctx sequence)" },
        { "gpu-memory-fraction", 0, CM_OPT_F64, &g.gpu_mem_fraction,
          "cuda: share of device memory to fill, weights included; the KV pool gets the rest (default 0.90)" },
        { "cuda-graph-budget-s", 0, CM_OPT_F64, &g.cuda_graph_budget_s,
          "cuda: seconds for capturing decode graphs at start-up; 0 = none (default 60)" },
        { "cuda-plan", 0, CM_OPT_STR, &g.cuda.plan, "cuda: kernel-plan overrides key=value,..." },
        { "cuda-profile", 0, CM_OPT_BOOL, &g.cuda.profile, "cuda: time every launch of eager steps; breakdown at exit" },
        { "cuda-graph-timing", 0, CM_OPT_BOOL, &g.cuda.graph_timing, "cuda: device time per decode graph replay, at exit" },
        { "cuda-fault-at-step", 0, CM_OPT_I64, &g.cuda.fault_at_step, "testing: a trapping kernel in that engine step" },
        { "kv-block-size", 0, CM_OPT_INT, &g.block_size, "tokens per KV block (default 16)" },
        { "ctx", 'c', CM_OPT_INT, &g.ctx, "context length; 0 = the model's training context" },
        { "batch", 'b', CM_OPT_INT, &g.batch, "tokens per forward pass (prefill chunk; default 512)" },
        { "backend", 0, CM_OPT_STR, &g.backend, "cpu | cuda" },
        { "quantize", 0, CM_OPT_STR, &g.quantize, "none | fp8: convert F16/BF16 weights to FP8 E4M3 at load (per-output-channel scales)" },
        { "kv-cache-dtype", 0, CM_OPT_STR, &g.kv_dtype, "KV cache type: auto (the backend's: cpu f32, cuda f16) | f32 | f16 | fp8 | q8_0" },
        { "ids", 0, CM_OPT_BOOL, &g.ids, "print token ids instead of text" },
        { "no-bos", 0, CM_OPT_BOOL, &g.no_bos, "do not prepend BOS to a text prompt" },
        { 0 } };
    char err[512];
    int npos;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err)) {
        if (strcmp(err, "help")) { fprintf(stderr, "arka generate: %s\n", err); return 2; }
        usage(opts);
        return 0;
    }
#define USAGE_ERR(...) do { fprintf(stderr, "arka generate: "); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 2; } while (0)
    if (npos) USAGE_ERR("unexpected argument '%s'", pos[0]);
    if (!g.model) USAGE_ERR("no model given (-m MODEL)");
    if (!g.prompt && !g.prompt_ids && !g.prompt_file) USAGE_ERR("no prompt given (-p PROMPT, -f FILE or --prompt-ids \"1 2 3\")");
    if (!!g.prompt + !!g.prompt_ids + !!g.prompt_file > 1) USAGE_ERR("give one of -p, -f and --prompt-ids");

    if (g.n_predict < 1) USAGE_ERR("-n must be >= 1 (got %d)", g.n_predict);
    if (g.ctx < 0) USAGE_ERR("--ctx must be >= 0 (got %d)", g.ctx);
    if (g.threads < 0 || g.threads > MAX_THREADS) USAGE_ERR("--threads must be in [0, %d] (got %d)", MAX_THREADS, g.threads);
    if (g.kv_cache_mb < 0) USAGE_ERR("--kv-cache-mb must be >= 0");
    if (cli_check_cuda_opts("generate", g.gpu_mem_fraction, g.cuda_graph_budget_s)) return 2;
    if (g.block_size < 0 || g.block_size > 1024) USAGE_ERR("--kv-block-size must be in [1, 1024]");
    if (g.batch < 1) USAGE_ERR("--batch must be >= 1");
    /* sampling: each flag named (shm_sampling_check below is the backstop) */
    if (!(g.temp >= 0) || !isfinite(g.temp)) USAGE_ERR("--temp must be >= 0 (0 = greedy; got %g)", g.temp);
    if (g.top_k < 0) USAGE_ERR("--top-k must be >= 0 (0 = off; got %d)", g.top_k);
    if (!(g.top_p > 0 && g.top_p <= 1)) USAGE_ERR("--top-p must be in (0, 1] (got %g)", g.top_p);
    if (!(g.min_p >= 0 && g.min_p <= 1)) USAGE_ERR("--min-p must be in [0, 1] (got %g)", g.min_p);
    if (!(g.repeat_penalty > 0) || !isfinite(g.repeat_penalty)) USAGE_ERR("--repeat-penalty must be > 0 (got %g)", g.repeat_penalty);
    if (g.repeat_last_n < -1) USAGE_ERR("--repeat-last-n must be >= -1 (got %d)", g.repeat_last_n);
    if (!isfinite(g.presence_penalty)) USAGE_ERR("--presence-penalty must be finite");
    if (!isfinite(g.frequency_penalty)) USAGE_ERR("--frequency-penalty must be finite");

    ex_sample_params sp;
    ex_sample_params_default(&sp);
    sp.temperature = g.temp;
    sp.top_k = g.top_k;
    sp.top_p = g.top_p;
    sp.min_p = g.min_p;
    sp.repeat_penalty = g.repeat_penalty;
    sp.penalty_last_n = g.repeat_last_n;
    sp.presence_penalty = g.presence_penalty;
    sp.frequency_penalty = g.frequency_penalty;
    sp.seed = g.seed >= 0 ? (uint64_t)g.seed : (cm_time_ns() ^ ((uint64_t)getpid() << 32));
    sp.has_seed = 1;
    sp.max_tokens = (uint32_t)g.n_predict;
    if (shm_sampling_check(&sp))
        USAGE_ERR("invalid sampling parameters (temp finite, top-p in (0,1], min-p in [0,1], repeat-penalty > 0, repeat-last-n >= -1)");

    int rc = 1;
    char *file_text = NULL; /* -f or --prompt-ids @FILE */
    mdl_model *m = NULL;
    tok_vocab *tv = NULL;
    ex_engine *e = NULL;
    ex_sched *s = NULL;
    int32_t *prompt = NULL;
    char *out = NULL;

    double t0 = cm_time_s();
    if (mdl_load(g.model, &m, err, sizeof err)) { fprintf(stderr, "arka generate: %s\n", err); goto done; }
    touch_weights(m);
    double t_load = cm_time_s() - t0;
    const mdl_config *c = &m->cfg;

    /* tokenizer: needed unless both sides are ids */
    char terr[256] = "";
    int trc;
    if (m->gguf) trc = tok_load_gguf(m->gguf, &tv, terr, sizeof terr);
    else {
        char tj[4096], tc[4096];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", g.model);
        snprintf(tc, sizeof tc, "%s/tokenizer_config.json", g.model);
        struct stat st;
        trc = tok_load_hf(tj, stat(tc, &st) == 0 ? tc : NULL, &tv, terr, sizeof terr);
    }
    if (trc && !(g.prompt_ids && g.ids)) {
        fprintf(stderr, "arka generate: %s: no usable tokenizer (%s); use --prompt-ids with --ids\n", g.model, terr);
        goto done;
    }

    int n_prompt = 0;
    /* -f FILE and --prompt-ids @FILE: the text or the ids from a file (past the argument length limit) */
    const char *fpath = g.prompt_file ? g.prompt_file : g.prompt_ids && g.prompt_ids[0] == '@' ? g.prompt_ids + 1 : NULL;
    if (fpath) {
        size_t flen = 0;
        if (cm_file_read(fpath, (size_t)1 << 30, &file_text, &flen, err, sizeof err)) {
            fprintf(stderr, "arka generate: %s\n", err);
            rc = 2;
            goto done;
        }
        if (g.prompt_file) g.prompt = file_text;
        else g.prompt_ids = file_text;
    }
    if (g.prompt_ids) {
        if (parse_ids(g.prompt_ids, c->n_vocab, &prompt, &n_prompt, err, sizeof err)) {
            fprintf(stderr, "arka generate: %s\n", err);
            rc = 2;
            goto done;
        }
    } else {
        size_t len = strlen(g.prompt);
        int cap = (int)(len + 8 < (1u << 28) ? len + 8 : (1u << 28));
        if (!(prompt = malloc(sizeof(int32_t) * (size_t)cap))) goto nomem;
        int add_bos = !g.no_bos && tok_add_bos(tv) && tok_bos(tv) >= 0;
        int r = tok_encode(tv, g.prompt, len, add_bos, 0, prompt, cap, &n_prompt);
        if (r) { fprintf(stderr, "arka generate: cannot tokenize the prompt: %s\n", cm_err_str(r)); goto done; }
        if (n_prompt == 0) { fprintf(stderr, "arka generate: the prompt tokenizes to nothing\n"); rc = 2; goto done; }
    }
    int n_ctx = g.ctx > 0 ? g.ctx : c->n_ctx_train;
    if (n_prompt >= n_ctx) {
        fprintf(stderr, "arka generate: the prompt is %d tokens, the context is %d (raise --ctx)\n", n_prompt, n_ctx);
        rc = 2;
        goto done;
    }
    int64_t want_pos = (int64_t)n_prompt + g.n_predict;
    if (want_pos > n_ctx) {
        fprintf(stderr, "note: the context (%d) ends generation after %d tokens\n", n_ctx, (int)(n_ctx - n_prompt));
        want_pos = n_ctx;
    }

    ex_engine_opts eo;
    ex_engine_opts_default(&eo);
    if (ex_engine_opts_types(&eo, g.quantize, g.kv_dtype, err, sizeof err)) {
        fprintf(stderr, "arka generate: %s\n", err);
        rc = 2;
        goto done;
    }
    eo.backend = g.backend;
    eo.n_threads = g.threads;
    eo.kv_cache_mb = g.kv_cache_mb;
    eo.gpu_mem_fraction = g.gpu_mem_fraction;
    eo.cuda_graph_budget_s = g.cuda_graph_budget_s;
    eo.cuda = g.cuda;
    eo.block_size = g.block_size;
    eo.n_ctx = n_ctx;
    eo.max_tokens = g.batch;
    eo.max_seqs = 1;
    eo.max_out = 1;
    int bs = g.block_size > 0 ? g.block_size : 16;
    int64_t need_blocks = (want_pos + bs - 1) / bs;
    if (g.kv_cache_mb == 0 && strcmp(g.backend, "cuda")) {
        /* exactly what this sequence needs, within the default budget (cuda sizes its pool from
         * --gpu-memory-fraction: one sequence of --ctx, max_seqs being 1) */
        int kvt = eo.kv_type >= 0 ? eo.kv_type : ex_backend_default_kv_type(g.backend);
        size_t bb = kvt >= 0 ? ex_kv_block_bytes(c, bs, kvt) : 0;
        if (bb) {
            int64_t fit = ex_kv_default_bytes(need_blocks * (int64_t)bb) / (int64_t)bb;
            eo.kv_blocks = (int)(fit < need_blocks ? fit : need_blocks);
            if (eo.kv_blocks < 2) eo.kv_blocks = 2;
        }
    }
    if (ex_engine_create(m, &eo, &e, err, sizeof err)) { fprintf(stderr, "arka generate: %s\n", err); goto done; }
    int64_t have_pos = (int64_t)ex_kv_n_blocks(ex_engine_kv(e)) * bs;
    if (have_pos < n_prompt + 1) {
        fprintf(stderr, "arka generate: the KV cache holds %lld positions, the prompt needs %d (raise --kv-cache-mb)\n",
                (long long)have_pos, n_prompt + 1);
        goto done;
    }
    if (have_pos < want_pos)
        fprintf(stderr, "note: the KV cache holds %lld positions; generation stops there (raise --kv-cache-mb)\n",
                (long long)have_pos);

    /* the end-of-generation ids (text/tok.h: the same ones the gateway sends) stop the sequence */
    int32_t eog[TOK_EOG_MAX];
    int n_eog = tv ? tok_eog_ids(tv, eog, TOK_EOG_MAX) : 0;
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    if (ex_sched_create(e, &so, &s)) goto nomem;
    ex_request req = { .id = 1, .prompt = prompt, .n_prompt = n_prompt, .sp = sp, .stop_ids = eog, .n_stop = n_eog };
    int r = ex_sched_submit(s, &req);
    if (r) { fprintf(stderr, "arka generate: request refused: %s\n", cm_err_str(r)); goto done; }
    if (g.seed < 0 && sp.temperature > 0) fprintf(stderr, "seed: %llu\n", (unsigned long long)sp.seed);

    tok_detok dt;
    size_t out_cap = 64;
    if (tv) {
        tok_detok_init(&dt, tv, TOK_DETOK_SKIP_CONTROL);
        out_cap = tok_detok_out_cap(&dt);
    }
    if (!(out = malloc(out_cap))) goto nomem;

    ex_event ev[4];
    int n_ev, n_gen = 0, finish = 0, finish_err = 0;
    double t_start = cm_time_s(), t_first = 0;
    while (ex_sched_busy(s)) {
        r = ex_sched_step(s, ev, 4, &n_ev);
        if (r) { fprintf(stderr, "\narka generate: forward pass failed: %s\n", cm_err_str(r)); goto done; }
        for (int k = 0; k < n_ev; k++) {
            if (ev[k].token >= 0) {
                if (n_gen++ == 0) t_first = cm_time_s();
                int stop_tok = ev[k].finish == SHM_FINISH_STOP;
                if (g.ids) printf("%s%d", n_gen > 1 ? " " : "", ev[k].token);
                else if (!stop_tok) {
                    size_t n = 0;
                    if (tok_detok_push(&dt, ev[k].token, out, out_cap, &n) == 0) fwrite(out, 1, n, stdout);
                }
                fflush(stdout);
            }
            if (ev[k].finish) finish = ev[k].finish, finish_err = ev[k].err;
        }
    }
    if (!g.ids && tv) {
        size_t n = 0;
        if (tok_detok_flush(&dt, out, out_cap, &n) == 0) fwrite(out, 1, n, stdout);
    }
    fputc('\n', stdout);
    fflush(stdout);
    double t_end = cm_time_s();
    double tp = t_first - t_start, td = t_end - t_first;
    fprintf(stderr, "load: %.2f s | prefill: %d tokens, %.3f s, %.1f tok/s | decode: %d tokens, %.3f s, %.1f tok/s | finish: %s\n",
            t_load, n_prompt, tp, tp > 0 ? n_prompt / tp : 0.0, n_gen > 0 ? n_gen - 1 : 0, td,
            td > 0 && n_gen > 1 ? (n_gen - 1) / td : 0.0, shm_finish_name(finish));
    if (finish_err == CM_ENOKV) fprintf(stderr, "note: the KV cache ran out (raise --kv-cache-mb)\n");
    rc = 0;
    goto done;
nomem:
    fprintf(stderr, "arka generate: out of memory\n");
done:
    ex_sched_destroy(s);
    ex_engine_destroy(e);
    tok_free(tv);
    mdl_free(m);
    free(prompt);
    free(out);
    free(file_text);
    return rc;
}
