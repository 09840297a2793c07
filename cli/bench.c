/* arka bench decode: prefill and batch-1 decode speed of the engine on one model, with the
 * bound that memory bandwidth sets on decode (weight bytes per token ÷ bandwidth).
 *
 *   arka bench decode -m MODEL [--threads 2] [--prompt 128] [--gen 32] [--reps 3] [--bw-gbs GB/s]
 *
 * Reports wall-clock figures and, because the machines this runs on are shared, the
 * process's CPU time per step too (all threads, spinning included): CPU ms per token, and
 * for decode the weight bytes streamed per CPU-second. On a busy machine the wall figures
 * measure the machine's load as much as the code; the CPU figures measure the code.
 * Medians throughout. The bandwidth comes from bench/bench_stream (pass it with --bw-gbs). */
#include "cli.h"
#include "bench/loadgen.h"
#include "common/cm_config.h"
#include "common/cm_time.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

static int bench_decode(int argc, char **argv) {
    const char *model = NULL;
    int threads = 2, prompt = 128, gen = 32, reps = 3;
    double bw = 0;
    cm_opt opts[] = {
        { "model", 'm', CM_OPT_STR, &model, "model file" },
        { "threads", 't', CM_OPT_INT, &threads, "CPU threads (default 2; 0 = automatic)" },
        { "prompt", 0, CM_OPT_INT, &prompt, "prefill tokens (default 128)" },
        { "gen", 0, CM_OPT_INT, &gen, "decode steps (default 32)" },
        { "reps", 0, CM_OPT_INT, &reps, "prefill repetitions after a warm-up (default 3)" },
        { "bw-gbs", 0, CM_OPT_F64, &bw, "memory read bandwidth in GB/s (bench_stream) for the bound" },
        { 0 } };
    char err[512];
    int npos;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err)) {
        if (strcmp(err, "help")) { fprintf(stderr, "arka bench decode: %s\n", err); return 2; }
        fprintf(stderr, "usage: arka bench decode -m MODEL [options]\n");
        cm_config_usage(opts, stderr);
        return 0;
    }
    if (!model || prompt < 1 || gen < 1 || reps < 1 || threads < 0 || npos) {
        fprintf(stderr, "arka bench decode: need -m MODEL, --prompt/--gen/--reps >= 1, no extra arguments\n");
        return 2;
    }
    mdl_model *m;
    double t0 = cm_time_s();
    if (mdl_load(model, &m, err, sizeof err)) { fprintf(stderr, "arka bench decode: %s\n", err); return 1; }
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = threads;
    o.n_ctx = prompt + gen + 1;
    o.max_tokens = prompt;
    o.max_seqs = 1;
    o.max_out = 1;
    o.kv_blocks = (o.n_ctx + 15) / 16 + 1;
    ex_engine *e;
    if (ex_engine_create(m, &o, &e, err, sizeof err)) { fprintf(stderr, "arka bench decode: %s\n", err); mdl_free(m); return 1; }
    double t_load = cm_time_s() - t0;
    const ex_limits *L = ex_engine_limits(e);
    ex_batch_buf bb;
    ex_kv_table t;
    ex_batch_buf_init(&bb, L);
    ex_kv_table_init(&t, L->max_blocks);
    ex_kv_table_reserve(ex_engine_kv(e), &t, prompt + gen);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(prompt + gen));
    uint64_t r = 42;
    for (int i = 0; i < prompt + gen; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % (uint64_t)m->cfg.n_vocab);
    }
    double *w = malloc(sizeof(double) * (size_t)(reps + gen)), *c = malloc(sizeof(double) * (size_t)(reps + gen));
    const float *lg;
    int rc = 0;
    for (int i = 0; i <= reps && !rc; i++) { /* prefill; i == 0 warms up (page faults, caches) */
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add(&bb, ids, prompt, 0, t.blocks, t.n, 0);
        double a = cm_time_s(), ac = cpu_s();
        rc = ex_engine_forward(e, &bb.b, &lg);
        if (i) { w[i - 1] = cm_time_s() - a; c[i - 1] = cpu_s() - ac; }
    }
    double pw = median(w, reps), pc = median(c, reps);
    for (int g = 0; g < gen && !rc; g++) {
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add(&bb, ids + prompt + g, 1, prompt + g, t.blocks, t.n, 0);
        double a = cm_time_s(), ac = cpu_s();
        rc = ex_engine_forward(e, &bb.b, &lg);
        w[g] = cm_time_s() - a;
        c[g] = cpu_s() - ac;
    }
    if (rc) { fprintf(stderr, "arka bench decode: forward failed (%d)\n", rc); goto out; }
    double dw = median(w, gen), dc = median(c, gen);
    int nth = threads > 0 ? threads : 1;
    double wb = (double)m->weight_bytes, la = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) { if (fscanf(f, "%lf", &la) != 1) la = -1; fclose(f); }
    printf("model %s: %.2f GiB of weights read per token, load %.2f s, %d thread%s, load average %.2f\n", model,
           wb / 1073741824.0, t_load, nth, nth > 1 ? "s" : "", la);
    printf("prefill %d tokens: wall %.1f ms = %.1f tok/s; CPU %.1f ms = %.1f tok per CPU-second\n", prompt,
           pw * 1e3, prompt / pw, pc * 1e3, prompt / pc);
    printf("decode batch 1 at %d..%d: wall %.1f ms/token = %.2f tok/s; CPU %.1f ms/token, %.1f GB of weights per CPU-second\n",
           prompt, prompt + gen, dw * 1e3, 1 / dw, dc * 1e3, wb / dc / 1e9);
    if (bw > 0) {
        double bound = bw * 1e9 / wb;
        printf("bandwidth bound %.1f GB/s / %.2f GB = %.2f tok/s; decode wall at %.1f %% of it\n", bw, wb / 1e9, bound,
               100 / dw / bound);
    }
out:
    free(w); free(c); free(ids);
    ex_kv_table_release(ex_engine_kv(e), &t);
    ex_kv_table_free(&t);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
    mdl_free(m);
    return rc ? 1 : 0;
}

int cli_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "decode")) return bench_decode(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "serve")) return bench_serve(argc - 1, argv + 1);
    fprintf(stderr, "usage: arka bench decode -m MODEL [--threads N] [--prompt N] [--gen N] [--reps N] [--bw-gbs GB/s]\n"
                    "       arka bench serve --url URL --requests N [--rate R] [--prompt-len L] [--max-tokens M] [options]\n");
    return 2;
}
