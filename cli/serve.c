/* arka serve: the OpenAI-compatible HTTP server (gateway/serve.h). Built only with the gateway
 * (libuv and friends); elsewhere the command is absent from `arka --help`. */
#ifdef ARKA_WITH_GATEWAY
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_log.h"
#include "executor/engine.h"
#include "gateway/serve.h"

#include <stdio.h>
#include <string.h>

int cli_serve(int argc, char **argv) {
    gw_serve_opts o;
    gw_serve_opts_default(&o);
    const char *log_level = "info";
    cm_opt opts[] = {
        { "model", 'm', CM_OPT_STR, &o.model, "model file (GGUF) or Hugging Face safetensors directory" },
        { "served-model-name", 0, CM_OPT_STR, &o.model_id, "model id clients use (default: the file name without .gguf)" },
        { "host", 0, CM_OPT_STR, &o.host, "listen address (default 127.0.0.1)" },
        { "port", 0, CM_OPT_INT, &o.port, "listen port (default 8080; 0 = any free port)" },
        { "backend", 0, CM_OPT_STR, &o.backend, "cpu | cuda (default cpu)" },
        { "quantize", 0, CM_OPT_STR, &o.quantize, "none | fp8: executors convert F16/BF16 weights to FP8 E4M3 at load (per-output-channel scales)" },
        { "kv-cache-dtype", 0, CM_OPT_STR, &o.kv_cache_dtype, "KV cache type: auto (the backend's: cpu f32, cuda f16) | f32 | f16 | fp8 | q8_0" },
        { "devices", 0, CM_OPT_STR, &o.devices, "cuda: GPU ordinals, one executor each (default 0)" },
        { "threads", 't', CM_OPT_INT, &o.threads, "cpu threads per executor (0 = all cores)" },
        { "kv-cache-mb", 0, CM_OPT_I64, &o.kv_cache_mb, "KV cache budget per executor in MiB (0 = automatic: cuda from --gpu-memory-fraction)" },
        { "gpu-memory-fraction", 0, CM_OPT_F64, &o.gpu_mem_fraction,
          "cuda: share of each GPU's memory an executor fills, weights included; the KV pool gets the rest (default 0.90)" },
        { "cuda-graph-budget-s", 0, CM_OPT_F64, &o.cuda_graph_budget_s,
          "cuda: seconds each executor spends capturing decode graphs at start-up; 0 = none (default 60)" },
        { "cuda-plan", 0, CM_OPT_STR, &o.cuda_plan, "cuda: kernel-plan overrides key=value,... (the executors log the plan)" },
        { "ctx", 'c', CM_OPT_INT, &o.n_ctx, "positions per sequence (0 = the model's)" },
        { "max-batch", 0, CM_OPT_INT, &o.max_batch, "sequences per engine step (0 = executor default)" },
        { "max-batch-tokens", 0, CM_OPT_INT, &o.max_batch_tokens, "tokens per engine step (0 = executor default)" },
        { "no-prefix-cache", 0, CM_OPT_BOOL, &o.no_prefix_cache, "compute every prompt in full (no reuse of cached prefixes' KV)" },
        { "max-decode-stall", 0, CM_OPT_F64, &o.max_decode_stall, "with decodes running, a step may cost at most F times their cost alone: the chunks of prompts longer than a step's token budget shrink (their TTFT for the others' ITL); 0 = off (default: 1.8 on cuda, off on cpu)" },
        { "chat-template", 0, CM_OPT_STR, &o.chat_template, "built-in chat template replacing the model's: chatml, llama3, llama2, mistral, gemma, phi3" },
        { "max-conns", 0, CM_OPT_INT, &o.max_conns,
          "open HTTP connections (0 = 1024); at the cap idle ones make room, /health /ready /metrics are always answered" },
        { "max-conns-per-ip", 0, CM_OPT_INT, &o.max_conns_per_ip,
          "connections per client address, IPv6 per /64 (default 256; 0 = no cap; loopback is never capped)" },
        { "max-buffered-mb", 0, CM_OPT_I64, &o.max_buffered_mb,
          "MiB of request bodies all connections may buffer together; beyond, 503 + Retry-After (0 = 256)" },
        { "drain-timeout", 0, CM_OPT_F64, &o.drain_timeout_s,
          "seconds SIGTERM lets running responses finish; then they end with a server_shutting_down error (default 30)" },
        { "max-requests", 0, CM_OPT_INT, &o.max_requests, "requests in flight before new ones get 503 (0 = 4096)" },
        { "keys-file", 0, CM_OPT_STR, &o.keys_file, "API keys file (in-process key store; see config/keys.conf, arka keys); turns auth on" },
        { "redis", 0, CM_OPT_STR, &o.redis, "redis://HOST:PORT[/DB]: key store and quotas shared by gateways; turns auth on" },
        { "auth-secret", 0, CM_OPT_STR, &o.auth_secret, "HMAC secret for API keys (default: the file KEYS_FILE.secret)" },
        { "no-auth", 0, CM_OPT_BOOL, &o.no_auth, "serve without API keys, also beyond loopback" },
        { "redis-fail-closed", 0, CM_OPT_BOOL, &o.redis_fail_closed, "Redis unavailable: answer 503 instead of limiting locally" },
        { "tool-parser", 0, CM_OPT_STR, &o.tool_parser, "tool-call format of the model: hermes, llama3, mistral or none (default: from the chat template)" },
        { "reasoning-parser", 0, CM_OPT_STR, &o.reasoning_parser, "split <think>...</think> off chat replies as reasoning_content: auto (when the template thinks), think, none" },
        { "task", 0, CM_OPT_STR, &o.task, "generate | embed (/v1/embeddings) | auto (embed when the model's files say how to pool; default)" },
        { "cors-origin", 0, CM_OPT_STR, &o.cors_origin, "allow browsers from these origins: * or a comma-separated list (CORS preflight and headers)" },
        { "max-resumes", 0, CM_OPT_INT, &o.max_resumes,
          "executor failures a generation survives by resuming on the restarted executor (default 3; 0 = it fails)" },
        { "resume-timeout", 0, CM_OPT_F64, &o.resume_timeout_s,
          "seconds a generation waits for a ready executor to resume on before it fails (default 120)" },
        { "log-level", 0, CM_OPT_STR, &log_level, "debug | info | warn | error" },
        { 0 },
    };
    char err[512];
    int npos, lvl;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err) || npos) {
        int help = !npos && strcmp(err, "help") == 0;
        if (npos) fprintf(stderr, "arka serve: unexpected argument '%s'\n", pos[0]);
        else if (!help) fprintf(stderr, "arka serve: %s\n", err);
        fprintf(help ? stdout : stderr, "usage: arka serve -m MODEL [--port 8080] [--backend cpu|cuda] [--devices 0,1] [options]\n"
                "API keys: on with --keys-file or --redis, and always beyond loopback (--no-auth turns them off)\n");
        cm_config_usage(opts, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    if (cm_log_parse_level(log_level, &lvl)) {
        fprintf(stderr, "arka serve: --log-level '%s': expected debug, info, warn or error\n", log_level);
        return 2;
    }
    cm_log_set_level(lvl);
    o.log_level = log_level;
    if (o.port < 0 || o.port > 65535) {
        fprintf(stderr, "arka serve: --port %d: expected 0..65535\n", o.port);
        return 2;
    }
    if (o.threads < 0 || o.n_ctx < 0 || o.max_batch < 0 || o.max_batch_tokens < 0 || o.kv_cache_mb < 0) {
        fprintf(stderr, "arka serve: --threads, --ctx, --max-batch, --max-batch-tokens and --kv-cache-mb must not be negative\n");
        return 2;
    }
    if (o.max_conns < 0 || o.max_conns_per_ip < -1 || o.max_buffered_mb < 0 || !(o.drain_timeout_s > 0 && o.drain_timeout_s <= 86400)) {
        fprintf(stderr, "arka serve: --max-conns, --max-conns-per-ip and --max-buffered-mb must not be negative and "
                        "--drain-timeout must be in (0, 86400] seconds\n");
        return 2;
    }
    if (o.max_resumes < 0 || !(o.resume_timeout_s > 0 && o.resume_timeout_s <= 86400)) {
        fprintf(stderr, "arka serve: --max-resumes must not be negative and --resume-timeout must be in (0, 86400] seconds\n");
        return 2;
    }
    if (cli_check_cuda_opts("serve", o.gpu_mem_fraction, o.cuda_graph_budget_s)) return 2;
    /* the decode guard's default: on for the GPU, where a long prompt's chunks would stall a
     * large batch's decodes most (bench/RESULTS.md, 2026-11-29) */
    for (const cm_opt *op = opts; op->name; op++)
        if (!strcmp(op->name, "max-decode-stall") && !op->seen)
            o.max_decode_stall = o.backend && !strcmp(o.backend, "cuda") ? 1.8 : 0;
    if (o.max_decode_stall != 0 && !(o.max_decode_stall >= 1 && o.max_decode_stall <= 100)) {
        fprintf(stderr, "arka serve: --max-decode-stall: expected 0 (off) or a factor from 1 to 100, got %g\n", o.max_decode_stall);
        return 2;
    }
    ex_engine_opts eo; /* the executors apply them: checked here so a bad value stops serve at once */
    ex_engine_opts_default(&eo);
    if (ex_engine_opts_types(&eo, o.quantize, o.kv_cache_dtype, err, sizeof err)) {
        fprintf(stderr, "arka serve: %s\n", err);
        return 2;
    }
    return gw_serve_run(&o);
}
#endif
