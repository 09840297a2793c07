/* bench_engine: prefill and decode speed of a backend through the engine's step API.
 *
 *   bench_engine -m MODEL [--backend cpu|cuda] [--prompt 512] [--gen 128] [--batch 1]
 *                [--bw-gbs 3000] [--threads N] [--reps 3] [--sample]
 *                [--gpu-memory-fraction F] [--cuda-graph-budget-s 60] [--cuda-plan K=V,...]
 *                [--cuda-graph-timing] [--cuda-profile] [--cuda-trace N [--cuda-trace-file F]]
 *
 * On cuda the copy bandwidth is measured first (a 4 GiB device-to-device copy, bytes read and
 * written, best of 5) and is the roofline's bandwidth unless --bw-gbs is given.
 *
 * The KV pool holds exactly what the --batch sequences need, unless --gpu-memory-fraction is
 * given: then the cuda backend sizes it from free device memory as the server does.
 * Prefill: one sequence of --prompt tokens in one step (median of --reps).
 * Decode: --batch sequences, each prefilled with --prompt tokens, then --gen decode steps of
 * one token per sequence; reports the median step time, generated tok/s, and for batch 1 the
 * fraction of the bandwidth bound (weight bytes + KV bytes read per step over --bw-gbs).
 * --sample: decode steps also sample every sequence (T=0.8, top_p=0.95, seeded) through
 * ex_engine_forward_sample, on the device for cuda; the step time then includes sampling.
 * Prints one line per figure and a JSON line last. */
#include "common/cm_config.h"
#include "common/cm_time.h"
#include "executor/backend.h"
#include "executor/engine.h"
#include "executor/kv.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef ARKA_WITH_CUDA
#include <cuda_runtime_api.h>

/* Device copy bandwidth in GB/s (read + written), best of 5 copies of 2 GiB; 0 on failure. */
static double cuda_copy_gbs(int device) {
    size_t n = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    float best = 0;
    if (cudaSetDevice(device) || cudaMalloc(&a, n) || cudaMalloc(&b, n) || cudaMemset(a, 1, n) || cudaEventCreate(&e0) ||
        cudaEventCreate(&e1))
        goto out;
    for (int i = 0; i < 6; i++) {
        float ms = 0;
        cudaEventRecord(e0, 0);
        cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0);
        cudaEventRecord(e1, 0);
        if (cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1)) goto out;
        if (i && (best == 0 || ms < best)) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
out:
    cudaFree(a);
    cudaFree(b);
    cudaGetLastError();
    return best > 0 ? 2.0 * n / (best * 1e-3) / 1e9 : 0;
}
#endif

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

int main(int argc, char **argv) {
    const char *model = NULL, *backend = "cpu", *quantize = NULL, *kv_dtype = NULL;
    int prompt = 512, gen = 128, batch = 1, threads = 0, reps = 3, sample = 0;
    float temp = 0.8f;
    double bw = 0, mem_fraction = 0, graph_budget_s = 60;
    ex_cuda_opts cuda = { 0 };
    cm_opt opts[] = {
        { "model", 'm', CM_OPT_STR, &model, "model file" },
        { "backend", 0, CM_OPT_STR, &backend, "cpu | cuda" },
        { "quantize", 0, CM_OPT_STR, &quantize, "none | fp8: F16/BF16 weights to FP8 E4M3 at load (per-output-channel scales)" },
        { "kv-cache-dtype", 0, CM_OPT_STR, &kv_dtype, "auto | f32 | f16 | fp8 | q8_0 (auto: the backend's default)" },
        { "prompt", 0, CM_OPT_INT, &prompt, "prompt tokens" },
        { "gen", 0, CM_OPT_INT, &gen, "generated tokens per sequence" },
        { "batch", 0, CM_OPT_INT, &batch, "sequences decoded together" },
        { "threads", 0, CM_OPT_INT, &threads, "cpu threads (0 = all)" },
        { "reps", 0, CM_OPT_INT, &reps, "prefill repetitions" },
        { "bw-gbs", 0, CM_OPT_F64, &bw, "memory bandwidth in GB/s for the roofline" },
        { "gpu-memory-fraction", 0, CM_OPT_F64, &mem_fraction, "cuda: size the KV pool from this share of device memory (0 = what the batch needs)" },
        { "cuda-graph-budget-s", 0, CM_OPT_F64, &graph_budget_s, "cuda: seconds for capturing decode graphs; 0 = none" },
        { "sample", 0, CM_OPT_BOOL, &sample, "decode steps sample (T=--temp, top_p=0.95) through ex_engine_forward_sample" },
        { "temp", 0, CM_OPT_F32, &temp, "--sample: temperature (default 0.8; 0 = greedy)" },
        { "cuda-plan", 0, CM_OPT_STR, &cuda.plan, "cuda: kernel-plan overrides key=value,..." },
        { "cuda-graph-timing", 0, CM_OPT_BOOL, &cuda.graph_timing, "cuda: device time per decode graph replay, at exit" },
        { "cuda-profile", 0, CM_OPT_BOOL, &cuda.profile, "cuda: time every launch of eager steps; breakdown at exit" },
        { "cuda-trace", 0, CM_OPT_INT, &cuda.trace_step, "cuda: record the N-th decode graph replay (ARKA_CUDA_TRACE builds)" },
        { "cuda-trace-file", 0, CM_OPT_STR, &cuda.trace_file, "cuda: where --cuda-trace writes (default arka-trace.csv)" },
        { 0 },
    };
    char err[512];
    int npos;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err) || !model || prompt < 1 || gen < 1 || batch < 1) {
        fprintf(stderr, "%s\nusage: bench_engine -m MODEL [--backend cpu|cuda] [--prompt N] [--gen N] [--batch N]\n", err);
        cm_config_usage(opts, stderr);
        return 2;
    }
    const char *bw_from = "--bw-gbs";
#ifdef ARKA_WITH_CUDA
    if (bw <= 0 && !strcmp(backend, "cuda")) {
        bw = cuda_copy_gbs(0);
        bw_from = "measured copy";
    }
#endif
    if (bw <= 0) {
        bw = 3000;
        bw_from = "default";
    }
    double t0 = cm_time_s();
    mdl_model *m;
    if (mdl_load(model, &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    const mdl_config *c = &m->cfg;
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    if (ex_engine_opts_types(&o, quantize, kv_dtype, err, sizeof err)) { fprintf(stderr, "bench_engine: %s\n", err); return 2; }
    int kv_type = o.kv_type >= 0 ? o.kv_type : ex_backend_default_kv_type(backend);
    o.backend = backend;
    o.n_threads = threads;
    o.n_ctx = prompt + gen + 16;
    o.max_tokens = prompt > batch ? prompt : batch;
    o.max_seqs = batch;
    o.max_out = batch;
    int64_t kv_need = (int64_t)ex_kv_block_bytes(c, 16, kv_type) * batch *
                      ((o.n_ctx + 15) / 16 + 1);
    o.kv_cache_mb = kv_need / 1048576 + 16;
    o.cuda_graph_budget_s = graph_budget_s;
    o.cuda = cuda;
    if (mem_fraction != 0) {
        o.gpu_mem_fraction = mem_fraction;   /* the engine refuses values outside (0, 1] */
        if (!strcmp(backend, "cuda")) o.kv_cache_mb = 0;
    }
    ex_engine *e;
    if (ex_engine_create(m, &o, &e, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    double t_load = cm_time_s() - t0;
    const ex_limits *L = ex_engine_limits(e);
    ex_kv *kv = ex_engine_kv(e);
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, L);
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    uint64_t r = 1;
    for (int i = 0; i < prompt; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % (uint64_t)c->n_vocab);
    }
    ex_kv_table *t = calloc((size_t)batch, sizeof *t);
    for (int s = 0; s < batch; s++) {
        ex_kv_table_init(&t[s], L->max_blocks);
        if (ex_kv_table_reserve(kv, &t[s], prompt + gen)) { fprintf(stderr, "KV pool too small\n"); return 1; }
    }
    const float *logits;
    /* prefill: one sequence, --reps times (the first one is a warm-up) */
    double *pt = malloc(sizeof(double) * (size_t)(reps + 1));
    for (int i = 0; i <= reps; i++) {
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add_kv(&bb, ids, prompt, 0, &t[0], 0); /* both pools' rows (sliding-window layers) */
        double a = cm_time_s();
        if (ex_engine_forward(e, &bb.b, &logits)) { fprintf(stderr, "forward failed\n"); return 1; }
        pt[i] = cm_time_s() - a;
    }
    double prefill_s = median(pt + 1, reps);
    /* prefill every other sequence (not timed) */
    for (int s = 1; s < batch; s++) {
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add_kv(&bb, ids, prompt, 0, &t[s], 0);
        ex_engine_forward(e, &bb.b, &logits);
    }
    double *st = malloc(sizeof(double) * (size_t)gen);
    ex_sample_params sp;
    ex_sample_params_default(&sp);
    sp.temperature = temp;
    sp.top_p = 0.95f;
    sp.seed = 1;
    ex_sample_row *rows = calloc((size_t)batch, sizeof *rows);
    ex_sample_out *so = calloc((size_t)batch, sizeof *so);
    double dec0 = cm_time_s();
    for (int g = 0; g < gen; g++) {
        ex_batch_buf_clear(&bb);
        for (int s = 0; s < batch; s++) {
            int32_t tok = (int32_t)((g * 31 + s * 7) % c->n_vocab);
            ex_batch_buf_add_kv(&bb, &tok, 1, prompt + g, &t[s], 0);
        }
        for (int s = 0; s < batch; s++) /* the prompt stands in for each sequence's tokens */
            rows[s] = (ex_sample_row){ .row = s, .sp = &sp, .prev = ids, .n_prev = prompt, .pos = prompt + g };
        double a = cm_time_s();
        int rc = sample ? ex_engine_forward_sample(e, &bb.b, rows, batch, so) : ex_engine_forward(e, &bb.b, &logits);
        if (rc) { fprintf(stderr, "forward failed\n"); return 1; }
        st[g] = cm_time_s() - a;
    }
    double dec_total = cm_time_s() - dec0;
    double step = median(st, gen);
    size_t kv_el = (size_t)ex_kv_block_bytes(c, 1, kv_type); /* bytes per position */
    const mdl_model *run = ex_engine_model(e); /* the --quantize copy when there is one */
    double bytes = (double)run->weight_bytes + (double)kv_el * (prompt + gen / 2) * batch;
    double bound = bw * 1e9 / bytes; /* steps per second the bandwidth allows */
    printf("model %s backend %s: load %.2f s, weights %.2f GiB, KV %s\n", model, backend, t_load, run->weight_bytes / 1073741824.0,
           ex_kv_type_name(kv_type));
    printf("prefill %d tokens: %.1f ms, %.0f tok/s\n", prompt, prefill_s * 1e3, prompt / prefill_s);
    char how[64];
    snprintf(how, sizeof how, " with sampling (T=%g, top_p=0.95)", temp);
    printf("decode batch %d%s: median step %.3f ms, %.1f tok/s per sequence, %.0f generated tok/s (wall %.0f)\n", batch,
           sample ? how : "", step * 1e3, 1 / step, batch / step, batch * gen / dec_total);
    printf("roofline (%.0f GB/s %s bandwidth, %.2f GB read per step): %.1f steps/s; achieved %.1f%%\n", bw, bw_from,
           bytes / 1e9, bound, 100.0 / step / bound);
    printf("{\"model\":\"%s\",\"backend\":\"%s\",\"prompt\":%d,\"gen\":%d,\"batch\":%d,\"sample\":%d,\"prefill_tok_s\":%.1f,"
           "\"decode_step_ms\":%.4f,\"decode_tok_s\":%.1f,\"roofline_frac\":%.4f,\"bw_gbs\":%.0f}\n",
           model, backend, prompt, gen, batch, sample, prompt / prefill_s, step * 1e3, batch / step, 1 / step / bound, bw);
    for (int s = 0; s < batch; s++) {
        ex_kv_table_release(kv, &t[s]);
        ex_kv_table_free(&t[s]);
    }
    free(t);
    free(st);
    free(rows);
    free(so);
    free(pt);
    free(ids);
    ex_batch_buf_free(&bb);
    ex_engine_destroy(e);
    mdl_free(m);
    return 0;
}
