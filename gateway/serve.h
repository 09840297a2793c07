/* serve: `arka serve` — the gateway process put together.
 *
 * Loads what the gateway needs of the model (vocabulary, chat template, context length; the
 * weights stay with the executors), spawns one executor per device through gw_pool, serves the
 * HTTP API (routes.h) with /metrics, and shuts down gracefully on SIGINT/SIGTERM: no new
 * connections, running responses finish, then the executors drain and exit.
 *
 * Main thread only; runs its own libuv loop until shutdown.
 */
#ifndef GW_SERVE_H
#define GW_SERVE_H

#include <stdint.h>

typedef struct gw_serve_opts {
    const char *model;          /* GGUF file or Hugging Face directory */
    const char *model_id;       /* served name (NULL: the file name without .gguf) */
    const char *host;           /* listen address (default 127.0.0.1) */
    int         port;           /* default 8080; 0: ephemeral (printed) */
    const char *backend;        /* cpu | cuda */
    const char *devices;        /* cuda: "0,1" (one executor each); cpu: ignored (one executor) */
    int         threads;        /* cpu threads per executor (0: all cores) */
    int64_t     kv_cache_mb;    /* per executor (0: automatic) */
    double      gpu_mem_fraction;    /* cuda: share of each GPU an executor fills (default 0.90) */
    double      cuda_graph_budget_s; /* cuda: decode-graph capture seconds per executor (default 60; 0: none) */
    const char *cuda_plan;      /* cuda: kernel-plan overrides "key=value,..." passed to the executors (NULL: none) */
    const char *quantize;       /* --quantize passed to the executors ("none", "fp8"; NULL: none) */
    const char *kv_cache_dtype; /* --kv-cache-dtype passed to the executors ("auto", "f32", "f16", "fp8", "q8_0"; NULL: auto) */
    int         n_ctx;          /* positions per sequence (0: the model's) */
    int         max_batch;      /* sequences per step (0: executor default) */
    int         max_batch_tokens; /* tokens per step (0: executor default) */
    int         no_prefix_cache;  /* executors compute every prompt in full (--no-prefix-cache) */
    const char *chat_template;  /* built-in name replacing the model's (NULL: the model's) */
    const char *log_level;      /* passed to the executors */
    int         max_conns;      /* HTTP connections (0: default) */
    int         max_conns_per_ip; /* per client address (-1: default 256; 0: no cap; loopback never) */
    int64_t     max_buffered_mb; /* request bytes buffered by all connections (0: default 256) */
    double      drain_timeout_s; /* SIGTERM: running responses get this long (default 30) */
    int         max_requests;   /* requests in flight before 503 (0: default) */
    /* API keys and quotas (gateway/auth.h). Auth is on when a key store is configured (keys_file
     * or redis) and whenever host is not a loopback address; off on loopback without a store;
     * no_auth forces it off. Beyond loopback with no store and no no_auth, the server refuses to start. */
    const char *keys_file;      /* in-process store: the keys file */
    const char *redis;          /* redis://HOST:PORT[/DB]: the shared store */
    const char *auth_secret;    /* HMAC secret (NULL: keys_file + ".secret") */
    int         no_auth;
    int         redis_fail_closed; /* Redis unavailable: 503 instead of the local fallback */
    /* structured output, embeddings, browsers */
    const char *tool_parser;    /* hermes | llama3 | mistral | none (NULL: from the chat template) */
    const char *reasoning_parser; /* auto (the template mentions <think>) | think | none */
    const char *task;           /* auto (embed when the files say how to pool) | generate | embed */
    const char *cors_origin;    /* "*" or origins allowed from browsers (NULL: no CORS) */
    /* an executor that dies: its generations resume on the restarted one (gateway/pool.h) */
    int         max_resumes;    /* executor deaths a generation survives (default 3; 0: fail at once) */
    double      resume_timeout_s; /* longest wait for a ready executor to resume on (default 120) */
} gw_serve_opts;

void gw_serve_opts_default(gw_serve_opts *o);

/* Runs the server until shutdown. Returns the process exit code: 0 after a clean shutdown, 1
 * when something needed at start-up failed (the reason is printed on stderr as one line),
 * including an executor that fails before it was ever ready (no usable GPU, say). */
int gw_serve_run(const gw_serve_opts *o);

#endif
