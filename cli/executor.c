/* arka executor: internal; what `arka serve` spawns per device (see executor/proc.h). */
#include "cli.h"
#include "common/cm_config.h"
#include "executor/proc.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int cli_executor(int argc, char **argv) {
    ex_proc_opts o;
    ex_proc_opts_default(&o);
    const char *backend = "cpu", *quantize = NULL, *kv_dtype = NULL;
    int64_t kv_mb = 0;
    /* --log-level comes with every table: cm_config_parse applies it (cm_config.h) */
    cm_opt opts[] = {
        { "shm", 0, CM_OPT_STR, &o.spec, "attach spec of the shared-memory segment (from the gateway)" },
        { "model", 'm', CM_OPT_STR, &o.model, "model file (GGUF) or safetensors directory" },
        { "backend", 0, CM_OPT_STR, &backend, "cpu | cuda" },
        { "quantize", 0, CM_OPT_STR, &quantize, "none | fp8: convert F16/BF16 weights to FP8 E4M3 at load (per-output-channel scales)" },
        { "kv-cache-dtype", 0, CM_OPT_STR, &kv_dtype, "KV cache type: auto (the backend's: cpu f32, cuda f16) | f32 | f16 | fp8 | q8_0" },
        { "device", 0, CM_OPT_INT, &o.engine.device, "cuda device ordinal" },
        { "threads", 't', CM_OPT_INT, &o.engine.n_threads, "cpu threads (0 = all cores)" },
        { "kv-cache-mb", 0, CM_OPT_I64, &kv_mb, "KV cache budget in MiB (0 = automatic: cuda from --gpu-memory-fraction)" },
        { "gpu-memory-fraction", 0, CM_OPT_F64, &o.engine.gpu_mem_fraction,
          "cuda: share of device memory to fill, weights included; the KV pool gets the rest (default 0.90)" },
        { "cuda-graph-budget-s", 0, CM_OPT_F64, &o.engine.cuda_graph_budget_s,
          "cuda: seconds for capturing decode graphs at start-up; 0 = none (default 60)" },
        { "cuda-plan", 0, CM_OPT_STR, &o.engine.cuda.plan, "cuda: kernel-plan overrides key=value,..." },
        { "ctx", 'c', CM_OPT_INT, &o.engine.n_ctx, "positions per sequence (0 = the model's)" },
        { "max-batch", 0, CM_OPT_INT, &o.engine.max_seqs, "sequences per step (0 = cpu 64, cuda from the device)" },
        { "max-batch-tokens", 0, CM_OPT_INT, &o.engine.max_tokens, "token budget per step (0 = cpu 512, cuda from the device and model)" },
        { "max-waiting", 0, CM_OPT_INT, &o.max_waiting, "queued requests before the executor refuses (0 = 1024)" },
        { "no-prefix-cache", 0, CM_OPT_BOOL, &o.no_prefix_cache, "compute every prompt in full (no reuse of cached prefixes' KV)" },
        { 0 },
    };
    char err[512];
    int npos;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err) || npos) {
        if (strcmp(err, "help") && !npos) fprintf(stderr, "arka executor: %s\n", err);
        else if (npos) fprintf(stderr, "arka executor: unexpected argument '%s'\n", pos[0]);
        fprintf(stderr, "usage: arka executor --shm SPEC -m MODEL [options]   (internal: started by arka serve)\n");
        cm_config_usage(opts, stderr);
        return 2;
    }
    if (cli_check_cuda_opts("executor", o.engine.gpu_mem_fraction, o.engine.cuda_graph_budget_s)) return 2;
    if (ex_engine_opts_types(&o.engine, quantize, kv_dtype, err, sizeof err)) {
        fprintf(stderr, "arka executor: %s\n", err);
        return 2;
    }
    o.engine.backend = backend;
    o.engine.kv_cache_mb = kv_mb;
    return ex_proc_run(&o);
}
