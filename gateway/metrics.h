/* metrics: the gateway's Prometheus registry and its /metrics text (exposition format 0.0.4).
 *
 * Two layers in one module:
 *   - a small generic registry: families of counters, gauges and fixed-bucket histograms, each
 *     series told apart by up to GW_MET_LABELS_MAX label values, plus one constant label that the
 *     registry adds to every sample (model_name); rendered with HELP/TYPE lines, cumulative
 *     `_bucket{le=...}` lines, `_sum` and `_count`, label values escaped (\\, \", \n);
 *   - the gateway's families under vLLM's names with the prefix `arka:` (vLLM uses `vllm:`) and
 *     vLLM's histogram buckets, fed by the calls below (gw_met_request_done, gw_met_http, ...).
 *
 * Cardinality is bounded: a family holds at most GW_MET_SERIES_MAX distinct label sets. Once it
 * is full, observations for a new label set go to one extra series whose every variable label
 * is "other" (so a runaway tenant or route label can't grow memory or the scrape without bound;
 * a real label set whose values are all "other" shares that series). The constant label is
 * never replaced.
 *
 * Executor figures come from each executor's shared-memory stats block (gw_met_executor, called
 * just before rendering): gauges are summed over executors, counters and the per-executor
 * histograms are kept monotonic across executor restarts (a restart reported through
 * gw_met_executor_restart, or any value that went backwards, folds the old totals into a base).
 *
 * Loop thread only: no locks, and nothing here blocks.
 *
 *   gw_met *m; gw_met_create("llama-3-8b", 8192, &m);
 *   ... per request:  gw_met_itl(m, dt) per token after the first;
 *                     gw_met_request_done(m, tenant, "stop", 12, 100, 0.05, 1.9, 0.01);
 *   ... per response: gw_met_http(m, "/v1/chat/completions", 200);
 *   ... GET /metrics: for each executor k: gw_met_executor(m, k, seg->stats);
 *                     char *txt = gw_met_render(m, &len);  ... send ...; free(txt);
 *   gw_met_destroy(m);
 */
#ifndef GW_METRICS_H
#define GW_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "shm/shm.h"

#define GW_MET_PREFIX      "arka:"
/* Content-Type of a GET /metrics response carrying gw_met_render()'s text. */
#define GW_MET_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define GW_MET_LABELS_MAX  3      /* variable labels per family (the constant label comes on top) */
#define GW_MET_SERIES_MAX  1024   /* distinct label sets per family; then the "other" set */
#define GW_MET_FAMILIES_MAX 64
#define GW_MET_BOUNDS_MAX  64     /* histogram bucket bounds per family (+Inf is implied) */
#define GW_MET_EXEC_MAX    64     /* executors whose stats are tracked (idx 0..63) */

typedef struct gw_met gw_met;
typedef struct gw_met_fam gw_met_fam;

enum gw_met_type { GW_MET_COUNTER, GW_MET_GAUGE, GW_MET_HISTOGRAM };

/* ---- the generic registry ---- */

/* An empty registry; const_label/const_value (both or neither; NULL: none) is added as the first
 * label of every sample. Returns 0, CM_EINVAL (a bad label name) or CM_ENOMEM. */
int gw_met_create_bare(const char *const_label, const char *const_value, gw_met **out);
void gw_met_destroy(gw_met *m); /* accepts NULL */

/* Registers a family. name: [a-zA-Z_:][a-zA-Z0-9_:]* (a counter's name should end in _total);
 * help: one line (copied, escaped on output); labels: n_labels (0..GW_MET_LABELS_MAX) label
 * names; bounds: histograms only, n_bounds (1..GW_MET_BOUNDS_MAX) strictly ascending finite
 * upper bounds (+Inf is added). The family lives as long as the registry. Returns 0, CM_EINVAL
 * (a bad argument, or the name is taken), CM_EFULL (GW_MET_FAMILIES_MAX families) or CM_ENOMEM. */
int gw_met_family(gw_met *m, enum gw_met_type type, const char *name, const char *help,
                  const char *const *labels, int n_labels, const double *bounds, int n_bounds,
                  gw_met_fam **out);

/* Updates the series of label values lv (the family's n_labels strings; NULL stands for "").
 * They create the series on first use (value 0), or use the "other" series once the family holds
 * GW_MET_SERIES_MAX label sets. On a family of another type, or out of memory, they do nothing
 * and return CM_EINVAL / CM_ENOMEM; 0 otherwise. */
int gw_met_add(gw_met_fam *f, const char *const *lv, double v);      /* counter += v (v >= 0); gauge += v */
int gw_met_set(gw_met_fam *f, const char *const *lv, double v);      /* gauge = v; counter = v (a mirrored total) */
int gw_met_observe(gw_met_fam *f, const char *const *lv, double v);  /* histogram: one observation */

/* Label sets the family holds (the "other" set included); for tests. */
int gw_met_series(const gw_met_fam *f);

/* The whole registry as Prometheus text, families in registration order, series in creation
 * order. Returns a malloc'ed, NUL-terminated string (the caller frees it) and sets *len, or NULL
 * when out of memory. */
char *gw_met_render(gw_met *m, size_t *len);

/* ---- the gateway's families (vLLM's names, arka: prefix, model_name label) ---- */

/* A registry with every gateway family registered (none has samples until they are fed).
 * max_model_len sizes the request_prompt_tokens / request_generation_tokens buckets (vLLM's
 * 1-2-5 steps up to it). Returns 0, CM_EINVAL (no model name, max_model_len < 1) or CM_ENOMEM. */
int gw_met_create(const char *model_name, int max_model_len, gw_met **out);

/* vLLM's build_1_2_5_buckets(max): 1, 2, 5, 10, 20, 50, ... while <= max. Writes at most cap
 * values into out and returns how many there are. */
int gw_met_buckets_125(double max, double *out, int cap);

/* One finished request (one choice). tenant: the tenant's name, never the key (NULL or "": no
 * per-tenant counters); finish_reason: "stop", "length", "abort", ... counts in
 * request_success_total{finished_reason}, except "error", which counts in request_failure_total.
 * Histograms: request_prompt_tokens, request_generation_tokens, and the times in seconds
 * (time_to_first_token, e2e_request_latency, request_queue_time); a negative time is not observed
 * (no first token, unknown queue time). Per tenant: tenant_requests_total,
 * tenant_prompt_tokens_total, tenant_generation_tokens_total. Can't fail (out of memory: dropped). */
void gw_met_request_done(gw_met *m, const char *tenant, const char *finish_reason,
                         uint64_t prompt_tokens, uint64_t gen_tokens,
                         double ttft_s, double e2e_s, double queue_s);

/* One inter-token gap of a streamed response, in seconds (inter_token_latency_seconds, vLLM's
 * time_per_output_token buckets). */
void gw_met_itl(gw_met *m, double seconds);

/* One HTTP response: http_requests_total{route,status}. route: the matched route's pattern
 * ("/v1/chat/completions"), never the raw path ("other" for unknown paths) so the label stays
 * small; the series cap catches mistakes. */
void gw_met_http(gw_met *m, const char *route, int status);

/* Reads executor idx's stats block (idx < GW_MET_EXEC_MAX; others ignored): sets the model-wide
 * gauges num_requests_running, num_requests_waiting (plus gw_met_set_queued), kv_cache_usage_perc
 * (blocks used / blocks total over all executors), the counters prompt_tokens_total,
 * generation_tokens_total, num_preemptions_total, engine_steps_total, prefix_cache_queries_total,
 * prefix_cache_hits_total (tokens, as vLLM counts them; sums over executors), and
 * the per-executor histograms batch_size, batch_tokens, step_time_seconds{executor}. Call it for
 * every live executor before gw_met_render. */
void gw_met_executor(gw_met *m, int idx, const struct shm_stats *s);

/* Executor idx failed and is being restarted: executor_restarts_total{executor} += 1, and its
 * next stats block (a fresh segment) counts on top of the totals seen so far. */
void gw_met_executor_restart(gw_met *m, int idx);

/* The HTTP server's counters, copied before rendering: http_connections, the totals
 * http_connections_evicted_total, http_connections_refused_total, http_buffer_refusals_total, and
 * http_request_bytes_buffered. */
void gw_met_http_server(gw_met *m, uint64_t open, uint64_t evicted, uint64_t refused, uint64_t buffered,
                        uint64_t buffer_refused);

/* A generation went to an executor again after its own failed: requests_resumed_total += 1. */
void gw_met_request_resumed(gw_met *m);

/* Gauges the gateway owns: requests it holds but no executor has admitted yet (added to
 * num_requests_waiting) and requests in flight as a whole (gateway_requests_in_flight). */
void gw_met_set_queued(gw_met *m, uint64_t n);
void gw_met_set_inflight(gw_met *m, uint64_t n);

/* Quota store health: redis_errors_total (a failed or timed-out Redis call) and
 * fallback_admissions_total (a request admitted by the local limiter because Redis was down). */
void gw_met_redis_error(gw_met *m);
void gw_met_fallback_admission(gw_met *m);
/* The same two counters mirrored from the quota store's own totals (use one way or the other). */
void gw_met_auth_totals(gw_met *m, uint64_t redis_errors, uint64_t fallback_admissions);

/* One request of tenant settled with its final usage: tenant_requests_total += 1 and the tenant's
 * prompt / generation token counters (without the model-wide success counters, which
 * gw_met_request_done keeps). tenant: the name, never a key; NULL or "": nothing. */
void gw_met_tenant_usage(gw_met *m, const char *tenant, uint64_t prompt_tokens, uint64_t gen_tokens);

#endif
