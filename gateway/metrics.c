/* metrics: the gateway's Prometheus registry (see metrics.h). */
#include "gateway/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"

/* One label set of a family. Histograms keep per-bucket (not cumulative) counts; render sums. */
struct series {
    char *lv[GW_MET_LABELS_MAX];   /* raw label values, owned */
    uint32_t hash;
    double v;                      /* counter / gauge */
    uint64_t *b;                   /* histogram: n_bounds + 1 counts, the last one +Inf */
    double sum;
    uint64_t count;
};

struct gw_met_fam {
    enum gw_met_type type;
    char *name, *help;
    char *label[GW_MET_LABELS_MAX];
    int n_labels;
    double bounds[GW_MET_BOUNDS_MAX];
    int n_bounds;
    struct series *s;              /* [cap], n in use, creation order */
    int n, cap;
    int32_t *idx;                  /* open addressing over s: index or -1; idx_cap a power of two */
    uint32_t idx_cap;
    int full;                      /* GW_MET_SERIES_MAX label sets reached: new ones go to "other" */
};

/* Running totals of one executor's stats block, kept monotonic across restarts. */
enum { CTR_PROMPT, CTR_GEN, CTR_PREEMPT, CTR_STEPS, CTR_PREFIX_Q, CTR_PREFIX_H, CTR_N };
enum { H_BATCH, H_TOKENS, H_STEP, H_N };
struct hist_acc {
    uint64_t last[GW_MET_BOUNDS_MAX + 1], base[GW_MET_BOUNDS_MAX + 1];  /* cumulative, family bounds */
    double last_sum, base_sum;
};
struct exec_acc {
    int seen;
    uint64_t last[CTR_N], base[CTR_N];
    uint64_t running, waiting, kv_used, kv_total;
    struct hist_acc h[H_N];
};

struct gw_met {
    char *const_label, *const_value;
    gw_met_fam *fam[GW_MET_FAMILIES_MAX];
    int n_fam;
    /* the gateway's families (NULL in a bare registry) */
    gw_met_fam *running, *waiting, *kv_usage, *inflight;
    gw_met_fam *prompt_tok, *gen_tok, *success, *failure, *preempt, *steps, *prefix_q, *prefix_h;
    gw_met_fam *ttft, *itl, *e2e, *queue, *req_prompt, *req_gen;
    gw_met_fam *t_requests, *t_prompt, *t_gen, *http, *restarts, *resumed, *redis_err, *fallback;
    gw_met_fam *conns, *evicted, *conns_refused, *buffered, *buffer_refused;
    gw_met_fam *hist[H_N];
    uint64_t queued;
    struct exec_acc ex[GW_MET_EXEC_MAX];
};

/* ============================================================================================
 * Registry
 * ========================================================================================== */

static int valid_name(const char *s, int colon_ok) {
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':') ||
                 (p > s && c >= '0' && c <= '9');
        if (!ok) return 0;
    }
    return 1;
}

int gw_met_create_bare(const char *const_label, const char *const_value, gw_met **out) {
    if (!out || !const_label != !const_value) return CM_EINVAL;
    if (const_label && (!valid_name(const_label, 0) || !strncmp(const_label, "__", 2))) return CM_EINVAL;
    gw_met *m = calloc(1, sizeof *m);
    if (!m) return CM_ENOMEM;
    if (const_label) {
        m->const_label = strdup(const_label);
        m->const_value = strdup(const_value);
        if (!m->const_label || !m->const_value) {
            gw_met_destroy(m);
            return CM_ENOMEM;
        }
    }
    *out = m;
    return 0;
}

static void fam_free(gw_met_fam *f) {
    for (int i = 0; i < f->n; i++) {
        for (int k = 0; k < f->n_labels; k++) free(f->s[i].lv[k]);
        free(f->s[i].b);
    }
    free(f->s);
    free(f->idx);
    for (int k = 0; k < f->n_labels; k++) free(f->label[k]);
    free(f->name);
    free(f->help);
    free(f);
}

void gw_met_destroy(gw_met *m) {
    if (!m) return;
    for (int i = 0; i < m->n_fam; i++) fam_free(m->fam[i]);
    free(m->const_label);
    free(m->const_value);
    free(m);
}

int gw_met_family(gw_met *m, enum gw_met_type type, const char *name, const char *help,
                  const char *const *labels, int n_labels, const double *bounds, int n_bounds,
                  gw_met_fam **out) {
    if (!m || !out || !valid_name(name, 1) || !help || n_labels < 0 || n_labels > GW_MET_LABELS_MAX ||
        (n_labels && !labels) || (type != GW_MET_COUNTER && type != GW_MET_GAUGE && type != GW_MET_HISTOGRAM))
        return CM_EINVAL;
    if (type == GW_MET_HISTOGRAM) {
        if (!bounds || n_bounds < 1 || n_bounds > GW_MET_BOUNDS_MAX) return CM_EINVAL;
        for (int i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1])) return CM_EINVAL;
    }
    if (strchr(help, '\n')) return CM_EINVAL;
    for (int k = 0; k < n_labels; k++) {
        if (!valid_name(labels[k], 0) || !strncmp(labels[k], "__", 2) || !strcmp(labels[k], "le") ||
            (m->const_label && !strcmp(labels[k], m->const_label)))
            return CM_EINVAL;
        for (int j = 0; j < k; j++)
            if (!strcmp(labels[j], labels[k])) return CM_EINVAL;
    }
    for (int i = 0; i < m->n_fam; i++)
        if (!strcmp(m->fam[i]->name, name)) return CM_EINVAL;
    if (m->n_fam == GW_MET_FAMILIES_MAX) return CM_EFULL;

    gw_met_fam *f = calloc(1, sizeof *f);
    if (!f) return CM_ENOMEM;
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help);
    f->n_labels = n_labels;
    int oom = !f->name || !f->help;
    for (int k = 0; k < n_labels; k++) oom |= !(f->label[k] = strdup(labels[k]));
    if (type == GW_MET_HISTOGRAM) {
        f->n_bounds = n_bounds;
        memcpy(f->bounds, bounds, (size_t)n_bounds * sizeof *bounds);
    }
    if (oom) {
        fam_free(f);
        return CM_ENOMEM;
    }
    m->fam[m->n_fam++] = f;
    *out = f;
    return 0;
}

int gw_met_series(const gw_met_fam *f) { return f ? f->n : 0; }

static const char *lv_at(const char *const *lv, int k) { return lv && lv[k] ? lv[k] : ""; }

static uint32_t lv_hash(const gw_met_fam *f, const char *const *lv) {
    uint32_t h = 2166136261u;   /* FNV-1a over the values, each followed by a 0xff separator */
    for (int k = 0; k < f->n_labels; k++) {
        for (const unsigned char *p = (const unsigned char *)lv_at(lv, k); *p; p++) h = (h ^ *p) * 16777619u;
        h = (h ^ 0xffu) * 16777619u;
    }
    return h;
}

static int lv_equal(const gw_met_fam *f, const struct series *s, const char *const *lv) {
    for (int k = 0; k < f->n_labels; k++)
        if (strcmp(s->lv[k], lv_at(lv, k))) return 0;
    return 1;
}

/* Slot of lv in the index: its series' slot, or the empty slot where it would go. */
static uint32_t idx_slot(const gw_met_fam *f, uint32_t h, const char *const *lv) {
    uint32_t mask = f->idx_cap - 1, i = h & mask;
    while (f->idx[i] >= 0 && !(f->s[f->idx[i]].hash == h && lv_equal(f, &f->s[f->idx[i]], lv))) i = (i + 1) & mask;
    return i;
}

static int idx_grow(gw_met_fam *f) {
    uint32_t cap = f->idx_cap ? f->idx_cap * 2 : 16;
    int32_t *idx = malloc(cap * sizeof *idx);
    if (!idx) return CM_ENOMEM;
    for (uint32_t i = 0; i < cap; i++) idx[i] = -1;
    for (int j = 0; j < f->n; j++) {
        uint32_t i = f->s[j].hash & (cap - 1);
        while (idx[i] >= 0) i = (i + 1) & (cap - 1);
        idx[i] = j;
    }
    free(f->idx);
    f->idx = idx;
    f->idx_cap = cap;
    return 0;
}

/* The series of lv, created when new; the "other" series once the family is full. NULL: no memory. */
static struct series *series_get(gw_met_fam *f, const char *const *lv) {
    static const char *const other[GW_MET_LABELS_MAX] = { "other", "other", "other" };
    if (!f->idx && idx_grow(f)) return NULL;
    uint32_t h = lv_hash(f, lv);
    uint32_t i = idx_slot(f, h, lv);
    if (f->idx[i] >= 0) return &f->s[f->idx[i]];
    if (f->full) {
        /* the cap: everything new shares one label set, created once past the cap */
        lv = other;
        h = lv_hash(f, lv);
        i = idx_slot(f, h, lv);
        if (f->idx[i] >= 0) return &f->s[f->idx[i]];
    }
    if ((uint32_t)(f->n + 1) * 2 > f->idx_cap) {
        if (idx_grow(f)) return NULL;
        i = idx_slot(f, h, lv);
    }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 4;
        if (cap > GW_MET_SERIES_MAX + 1) cap = GW_MET_SERIES_MAX + 1;
        struct series *s = realloc(f->s, (size_t)cap * sizeof *s);
        if (!s) return NULL;
        f->s = s;
        f->cap = cap;
    }
    struct series *s = &f->s[f->n];
    memset(s, 0, sizeof *s);
    int oom = 0;
    for (int k = 0; k < f->n_labels; k++) oom |= !(s->lv[k] = strdup(lv_at(lv, k)));
    if (f->type == GW_MET_HISTOGRAM) oom |= !(s->b = calloc((size_t)f->n_bounds + 1, sizeof *s->b));
    if (oom) {
        for (int k = 0; k < f->n_labels; k++) free(s->lv[k]);
        free(s->b);
        return NULL;
    }
    s->hash = h;
    f->idx[i] = f->n++;
    if (f->n >= GW_MET_SERIES_MAX) f->full = 1;
    return s;
}

int gw_met_add(gw_met_fam *f, const char *const *lv, double v) {
    if (!f || f->type == GW_MET_HISTOGRAM || (f->type == GW_MET_COUNTER && !(v >= 0))) return CM_EINVAL;
    struct series *s = series_get(f, lv);
    if (!s) return CM_ENOMEM;
    s->v += v;
    return 0;
}

int gw_met_set(gw_met_fam *f, const char *const *lv, double v) {
    if (!f || f->type == GW_MET_HISTOGRAM) return CM_EINVAL;
    struct series *s = series_get(f, lv);
    if (!s) return CM_ENOMEM;
    s->v = v;
    return 0;
}

int gw_met_observe(gw_met_fam *f, const char *const *lv, double v) {
    if (!f || f->type != GW_MET_HISTOGRAM || isnan(v)) return CM_EINVAL;
    struct series *s = series_get(f, lv);
    if (!s) return CM_ENOMEM;
    int i = 0;
    while (i < f->n_bounds && v > f->bounds[i]) i++;
    s->b[i]++;
    s->count++;
    s->sum += v;
    return 0;
}

/* Cumulative counts of snapshot sn over the family's bounds (n_bounds + 1 values, the last one
 * the total count); a family bucket takes the snapshot's buckets with a bound <= its own. */
static void rebin(const gw_met_fam *f, const struct shm_hist_snap *sn, double div, uint64_t *cum, double *sum) {
    uint32_t n = sn->n > SHM_HIST_MAX ? SHM_HIST_MAX : sn->n;
    for (int i = 0; i < f->n_bounds; i++) {
        uint64_t c = 0;
        for (uint32_t j = 0; j < n && sn->le[j] != UINT64_MAX; j++)
            if ((double)sn->le[j] / div <= f->bounds[i] * (1 + 1e-9)) c = sn->cum[j];
        cum[i] = c;
    }
    cum[f->n_bounds] = sn->count;
    *sum = (double)sn->sum / div;
}

static void series_set_cum(const gw_met_fam *f, struct series *s, const uint64_t *cum, double sum) {
    uint64_t prev = 0;
    for (int i = 0; i <= f->n_bounds; i++) {
        uint64_t c = cum[i] < prev ? prev : cum[i];   /* torn reads must not make buckets negative */
        s->b[i] = c - prev;
        prev = c;
    }
    s->count = prev;
    s->sum = sum;
}

/* ============================================================================================
 * Exposition
 * ========================================================================================== */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const char *s, size_t len) {
    if (b->oom) return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap * 2;
        while (cap < b->n + len + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

/* Label values escape \, " and newline; HELP text escapes \ and newline. */
static void put_escaped(buf *b, const char *s, int quote) {
    const char *run = s;
    for (; *s; s++) {
        const char *esc = *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : (quote && *s == '"') ? "\\\"" : NULL;
        if (!esc) continue;
        put(b, run, (size_t)(s - run));
        puts_(b, esc);
        run = s + 1;
    }
    put(b, run, (size_t)(s - run));
}

/* Shortest text that reads back as v: integers without a fraction, +Inf/-Inf/NaN as Prometheus
 * spells them. */
static void fmt_num(double v, char *out, size_t cap) {
    if (isnan(v)) snprintf(out, cap, "NaN");
    else if (isinf(v)) snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
    else if (v == 0) snprintf(out, cap, "0");
    else if (v == floor(v) && fabs(v) < 1e15) snprintf(out, cap, "%.0f", v);
    else {
        snprintf(out, cap, "%.15g", v);
        if (strtod(out, NULL) != v) snprintf(out, cap, "%.17g", v);
    }
}

static void put_num(buf *b, double v) {
    char t[40];
    fmt_num(v, t, sizeof t);
    puts_(b, t);
}

static void put_u64(buf *b, uint64_t v) {
    char t[24];
    snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    puts_(b, t);
}

/* name{const="..",l1="..",...,le=".."} with the suffix after name (may be ""); le may be NULL. */
static void put_sample_name(buf *b, const gw_met *m, const gw_met_fam *f, const struct series *s,
                            const char *suffix, const char *le) {
    puts_(b, f->name);
    puts_(b, suffix);
    int first = 1;
    if (!m->const_label && !f->n_labels && !le) {
        puts_(b, " ");
        return;
    }
    puts_(b, "{");
    if (m->const_label) {
        puts_(b, m->const_label);
        puts_(b, "=\"");
        put_escaped(b, m->const_value, 1);
        puts_(b, "\"");
        first = 0;
    }
    for (int k = 0; k < f->n_labels; k++) {
        if (!first) puts_(b, ",");
        first = 0;
        puts_(b, f->label[k]);
        puts_(b, "=\"");
        put_escaped(b, s->lv[k], 1);
        puts_(b, "\"");
    }
    if (le) {
        if (!first) puts_(b, ",");
        puts_(b, "le=\"");
        puts_(b, le);
        puts_(b, "\"");
    }
    puts_(b, "} ");
}

static void render_family(buf *b, const gw_met *m, const gw_met_fam *f) {
    static const char *const type_name[] = { "counter", "gauge", "histogram" };
    puts_(b, "# HELP ");
    puts_(b, f->name);
    puts_(b, " ");
    put_escaped(b, f->help, 0);
    puts_(b, "\n# TYPE ");
    puts_(b, f->name);
    puts_(b, " ");
    puts_(b, type_name[f->type]);
    puts_(b, "\n");
    for (int i = 0; i < f->n; i++) {
        const struct series *s = &f->s[i];
        if (f->type != GW_MET_HISTOGRAM) {
            put_sample_name(b, m, f, s, "", NULL);
            put_num(b, s->v);
            puts_(b, "\n");
            continue;
        }
        uint64_t cum = 0;
        char le[40];
        for (int j = 0; j <= f->n_bounds; j++) {
            cum += s->b[j];
            if (j < f->n_bounds) fmt_num(f->bounds[j], le, sizeof le);
            else snprintf(le, sizeof le, "+Inf");
            put_sample_name(b, m, f, s, "_bucket", le);
            put_u64(b, cum);
            puts_(b, "\n");
        }
        put_sample_name(b, m, f, s, "_sum", NULL);
        put_num(b, s->sum);
        puts_(b, "\n");
        put_sample_name(b, m, f, s, "_count", NULL);
        put_u64(b, s->count);
        puts_(b, "\n");
    }
}

char *gw_met_render(gw_met *m, size_t *len) {
    if (!m) return NULL;
    buf b = { malloc(16384), 0, 16384, 0 };
    if (!b.p) return NULL;
    b.p[0] = 0;
    for (int i = 0; i < m->n_fam; i++) render_family(&b, m, m->fam[i]);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len) *len = b.n;
    return b.p;
}

/* ============================================================================================
 * The gateway's families
 * ========================================================================================== */

/* vLLM's buckets (vllm/v1/metrics/loggers.py). */
static const double ttft_bounds[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                      1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0 };
static const double tpot_bounds[] = { 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                      0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0 };
static const double latency_bounds[] = { 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0 };
/* The executors' histograms (shm/seg.c), step time in seconds; other bounds would be re-binned. */
static const double step_bounds[] = { 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                      0.1, 0.25, 0.5, 1, 2.5, 5, 10 };
static const double batch_bounds[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024 };
static const double batch_tok_bounds[] = { 1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384 };

#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

int gw_met_buckets_125(double max, double *out, int cap) {
    static const double mant[] = { 1, 2, 5 };
    int n = 0;
    for (double e = 1; e <= max; e *= 10)
        for (int k = 0; k < 3; k++) {
            double v = mant[k] * e;
            if (v > max) return n;
            if (n < cap) out[n] = v;
            n++;
        }
    return n;
}

/* One row of the family table; *slot receives the handle. */
struct fam_def {
    size_t slot;                   /* offsetof(gw_met, member) */
    enum gw_met_type type;
    const char *name, *help;
    const char *labels[GW_MET_LABELS_MAX];
    int n_labels;
    const double *bounds;          /* NULL for the token-count histograms (built from max_model_len) */
    int n_bounds;
};

#define SLOT(member) offsetof(gw_met, member)
#define C GW_MET_COUNTER
#define G GW_MET_GAUGE
#define H GW_MET_HISTOGRAM
static const struct fam_def fam_defs[] = {
    { SLOT(running), G, "num_requests_running", "Requests in the executors' running batches.", {0}, 0, NULL, 0 },
    { SLOT(waiting), G, "num_requests_waiting", "Requests waiting to run (executor queues and gateway queue).", {0}, 0, NULL, 0 },
    { SLOT(kv_usage), G, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", {0}, 0, NULL, 0 },
    { SLOT(inflight), G, "gateway_requests_in_flight", "Requests the gateway holds (preparing, queued or running).", {0}, 0, NULL, 0 },
    { SLOT(prompt_tok), C, "prompt_tokens_total", "Prompt tokens prefilled (prefix cache hits excluded).", {0}, 0, NULL, 0 },
    { SLOT(gen_tok), C, "generation_tokens_total", "Tokens generated.", {0}, 0, NULL, 0 },
    { SLOT(success), C, "request_success_total", "Requests finished, by finish reason.", {"finished_reason"}, 1, NULL, 0 },
    { SLOT(failure), C, "request_failure_total", "Requests that failed with an error.", {0}, 0, NULL, 0 },
    { SLOT(preempt), C, "num_preemptions_total", "Sequences preempted for lack of KV-cache blocks.", {0}, 0, NULL, 0 },
    { SLOT(steps), C, "engine_steps_total", "Engine steps run by the executors.", {0}, 0, NULL, 0 },
    { SLOT(prefix_q), C, "prefix_cache_queries_total", "Prefix cache queries, in tokens (every admission's tokens).", {0}, 0, NULL, 0 },
    { SLOT(prefix_h), C, "prefix_cache_hits_total", "Prefix cache hits, in tokens (tokens an admission took from the cache).", {0}, 0, NULL, 0 },
    { SLOT(ttft), H, "time_to_first_token_seconds", "Histogram of time to first token in seconds.", {0}, 0, ttft_bounds, NB(ttft_bounds) },
    { SLOT(itl), H, "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", {0}, 0, tpot_bounds, NB(tpot_bounds) },
    { SLOT(e2e), H, "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", {0}, 0, latency_bounds, NB(latency_bounds) },
    { SLOT(queue), H, "request_queue_time_seconds", "Histogram of time spent waiting to be scheduled, in seconds.", {0}, 0, latency_bounds, NB(latency_bounds) },
    { SLOT(req_prompt), H, "request_prompt_tokens", "Number of prefill tokens processed, per request.", {0}, 0, NULL, 0 },
    { SLOT(req_gen), H, "request_generation_tokens", "Number of generation tokens processed, per request.", {0}, 0, NULL, 0 },
    { SLOT(t_requests), C, "tenant_requests_total", "Requests finished, by tenant.", {"tenant"}, 1, NULL, 0 },
    { SLOT(t_prompt), C, "tenant_prompt_tokens_total", "Prompt tokens of finished requests, by tenant.", {"tenant"}, 1, NULL, 0 },
    { SLOT(t_gen), C, "tenant_generation_tokens_total", "Generated tokens of finished requests, by tenant.", {"tenant"}, 1, NULL, 0 },
    { SLOT(http), C, "http_requests_total", "HTTP responses, by route and status.", {"route", "status"}, 2, NULL, 0 },
    { SLOT(restarts), C, "executor_restarts_total", "Executor failures (each followed by a restart).", {"executor"}, 1, NULL, 0 },
    { SLOT(resumed), C, "requests_resumed_total", "Generations sent again, with their delivered tokens, to an executor after theirs failed.", {0}, 0, NULL, 0 },
    { SLOT(conns), G, "http_connections", "Open HTTP connections holding a slot of --max-conns.", {0}, 0, NULL, 0 },
    { SLOT(evicted), C, "http_connections_evicted_total", "Idle HTTP connections closed to make room at --max-conns.", {0}, 0, NULL, 0 },
    { SLOT(conns_refused), C, "http_connections_refused_total", "Connections answered 503 or closed at a connection cap (probe paths beyond --max-conns included).", {0}, 0, NULL, 0 },
    { SLOT(buffered), G, "http_request_bytes_buffered", "Request body bytes the gateway holds (--max-buffered-mb caps it).", {0}, 0, NULL, 0 },
    { SLOT(buffer_refused), C, "http_buffer_refusals_total", "Requests refused (503) because --max-buffered-mb was reached.", {0}, 0, NULL, 0 },
    { SLOT(redis_err), C, "redis_errors_total", "Redis calls of the quota store that failed or timed out.", {0}, 0, NULL, 0 },
    { SLOT(fallback), C, "fallback_admissions_total", "Requests admitted by the local limiter while Redis was unavailable.", {0}, 0, NULL, 0 },
    { SLOT(hist[H_BATCH]), H, "batch_size", "Sequences in one engine step, per executor.", {"executor"}, 1, batch_bounds, NB(batch_bounds) },
    { SLOT(hist[H_TOKENS]), H, "batch_tokens", "Tokens (prefill + decode) in one engine step, per executor.", {"executor"}, 1, batch_tok_bounds, NB(batch_tok_bounds) },
    { SLOT(hist[H_STEP]), H, "step_time_seconds", "Wall time of one engine step in seconds, per executor.", {"executor"}, 1, step_bounds, NB(step_bounds) },
};
#undef C
#undef G
#undef H

int gw_met_create(const char *model_name, int max_model_len, gw_met **out) {
    if (!model_name || !*model_name || max_model_len < 1 || !out) return CM_EINVAL;
    gw_met *m;
    int e = gw_met_create_bare("model_name", model_name, &m);
    if (e) return e;
    double tok_bounds[GW_MET_BOUNDS_MAX];
    int n_tok = gw_met_buckets_125(max_model_len, tok_bounds, GW_MET_BOUNDS_MAX);
    if (n_tok > GW_MET_BOUNDS_MAX) n_tok = GW_MET_BOUNDS_MAX;
    for (size_t i = 0; i < sizeof fam_defs / sizeof fam_defs[0]; i++) {
        const struct fam_def *d = &fam_defs[i];
        char name[128];
        snprintf(name, sizeof name, GW_MET_PREFIX "%s", d->name);
        const double *bounds = d->bounds ? d->bounds : tok_bounds;
        int n_bounds = d->bounds ? d->n_bounds : n_tok;
        gw_met_fam **slot = (gw_met_fam **)((char *)m + d->slot);
        e = gw_met_family(m, d->type, name, d->help, d->labels, d->n_labels, bounds, n_bounds, slot);
        /* families without variable labels show their zero sample from the start (as vLLM's do) */
        if (!e && !d->n_labels)
            e = d->type == GW_MET_HISTOGRAM ? (series_get(*slot, NULL) ? 0 : CM_ENOMEM) : gw_met_add(*slot, NULL, 0);
        if (e) {
            gw_met_destroy(m);
            return e;
        }
    }
    *out = m;
    return 0;
}

static void observe_if(gw_met_fam *f, double v) {
    if (v >= 0) gw_met_observe(f, NULL, v);
}

void gw_met_request_done(gw_met *m, const char *tenant, const char *finish_reason,
                         uint64_t prompt_tokens, uint64_t gen_tokens,
                         double ttft_s, double e2e_s, double queue_s) {
    if (!m || !m->success) return;
    const char *reason = finish_reason && *finish_reason ? finish_reason : "unknown";
    if (!strcmp(reason, "error")) gw_met_add(m->failure, NULL, 1);
    else gw_met_add(m->success, &reason, 1);
    gw_met_observe(m->req_prompt, NULL, (double)prompt_tokens);
    gw_met_observe(m->req_gen, NULL, (double)gen_tokens);
    observe_if(m->ttft, ttft_s);
    observe_if(m->e2e, e2e_s);
    observe_if(m->queue, queue_s);
    if (tenant && *tenant) {
        gw_met_add(m->t_requests, &tenant, 1);
        gw_met_add(m->t_prompt, &tenant, (double)prompt_tokens);
        gw_met_add(m->t_gen, &tenant, (double)gen_tokens);
    }
}

void gw_met_itl(gw_met *m, double seconds) {
    if (m && m->itl) observe_if(m->itl, seconds);
}

void gw_met_http(gw_met *m, const char *route, int status) {
    if (!m || !m->http) return;
    char st[16];
    snprintf(st, sizeof st, "%d", status);
    const char *lv[2] = { route && *route ? route : "other", st };
    gw_met_add(m->http, lv, 1);
}

/* Recomputes the model-wide gauges and counters from every executor's figures. */
static void exec_totals(gw_met *m) {
    uint64_t run = 0, wait = m->queued, used = 0, total = 0, ctr[CTR_N] = { 0 };
    for (int k = 0; k < GW_MET_EXEC_MAX; k++) {
        const struct exec_acc *x = &m->ex[k];
        if (!x->seen) continue;
        run += x->running;
        wait += x->waiting;
        used += x->kv_used;
        total += x->kv_total;
        for (int c = 0; c < CTR_N; c++) ctr[c] += x->base[c] + x->last[c];
    }
    gw_met_set(m->running, NULL, (double)run);
    gw_met_set(m->waiting, NULL, (double)wait);
    gw_met_set(m->kv_usage, NULL, total ? (double)used / (double)total : 0.0);
    gw_met_set(m->prompt_tok, NULL, (double)ctr[CTR_PROMPT]);
    gw_met_set(m->gen_tok, NULL, (double)ctr[CTR_GEN]);
    gw_met_set(m->preempt, NULL, (double)ctr[CTR_PREEMPT]);
    gw_met_set(m->steps, NULL, (double)ctr[CTR_STEPS]);
    gw_met_set(m->prefix_q, NULL, (double)ctr[CTR_PREFIX_Q]);
    gw_met_set(m->prefix_h, NULL, (double)ctr[CTR_PREFIX_H]);
}

static void fold(struct exec_acc *x) {
    for (int c = 0; c < CTR_N; c++) {
        x->base[c] += x->last[c];
        x->last[c] = 0;
    }
    for (int h = 0; h < H_N; h++) {
        for (int i = 0; i <= GW_MET_BOUNDS_MAX; i++) {
            x->h[h].base[i] += x->h[h].last[i];
            x->h[h].last[i] = 0;
        }
        x->h[h].base_sum += x->h[h].last_sum;
        x->h[h].last_sum = 0;
    }
}

void gw_met_executor(gw_met *m, int idx, const struct shm_stats *s) {
    if (!m || !m->running || !s || idx < 0 || idx >= GW_MET_EXEC_MAX) return;
    struct exec_acc *x = &m->ex[idx];
    x->seen = 1;
    x->running = shm_stat_get(&s->requests_running);
    x->waiting = shm_stat_get(&s->requests_waiting);
    x->kv_used = shm_stat_get(&s->kv_blocks_used);
    x->kv_total = shm_stat_get(&s->kv_blocks_total);
    uint64_t cur[CTR_N] = { shm_stat_get(&s->prompt_tokens_total), shm_stat_get(&s->generation_tokens_total),
                            shm_stat_get(&s->preemptions_total), shm_stat_get(&s->steps_total),
                            shm_stat_get(&s->prefix_queries_total), shm_stat_get(&s->prefix_hits_total) };
    /* a counter that went backwards: a new stats block behind an unreported restart */
    for (int c = 0; c < CTR_N; c++) {
        if (cur[c] < x->last[c]) x->base[c] += x->last[c];
        x->last[c] = cur[c];
    }
    const struct shm_hist *src[H_N] = { &s->batch_size, &s->batch_tokens, &s->step_time_us };
    const double div[H_N] = { 1, 1, 1e6 };
    char ex_name[16];
    snprintf(ex_name, sizeof ex_name, "%d", idx);
    const char *lv = ex_name;
    for (int h = 0; h < H_N; h++) {
        gw_met_fam *f = m->hist[h];
        struct hist_acc *a = &x->h[h];
        struct shm_hist_snap sn;
        shm_hist_read(src[h], &sn);
        uint64_t cum[GW_MET_BOUNDS_MAX + 1];
        double sum;
        rebin(f, &sn, div[h], cum, &sum);
        if (cum[f->n_bounds] < a->last[f->n_bounds]) {
            for (int i = 0; i <= f->n_bounds; i++) a->base[i] += a->last[i];
            a->base_sum += a->last_sum;
        }
        memcpy(a->last, cum, sizeof cum);
        a->last_sum = sum;
        for (int i = 0; i <= f->n_bounds; i++) cum[i] += a->base[i];
        struct series *ser = series_get(f, &lv);
        if (ser) series_set_cum(f, ser, cum, sum + a->base_sum);
    }
    exec_totals(m);
}

void gw_met_executor_restart(gw_met *m, int idx) {
    if (!m || !m->restarts || idx < 0 || idx >= GW_MET_EXEC_MAX) return;
    char ex_name[16];
    snprintf(ex_name, sizeof ex_name, "%d", idx);
    const char *lv = ex_name;
    gw_met_add(m->restarts, &lv, 1);
    struct exec_acc *x = &m->ex[idx];
    fold(x);
    x->running = x->waiting = x->kv_used = x->kv_total = 0;
    exec_totals(m);
}

void gw_met_http_server(gw_met *m, uint64_t open, uint64_t evicted, uint64_t refused, uint64_t buffered,
                        uint64_t buffer_refused) {
    if (!m || !m->conns) return;
    gw_met_set(m->conns, NULL, (double)open);
    gw_met_set(m->evicted, NULL, (double)evicted);
    gw_met_set(m->conns_refused, NULL, (double)refused);
    gw_met_set(m->buffered, NULL, (double)buffered);
    gw_met_set(m->buffer_refused, NULL, (double)buffer_refused);
}

void gw_met_request_resumed(gw_met *m) {
    if (m && m->resumed) gw_met_add(m->resumed, NULL, 1);
}

void gw_met_set_queued(gw_met *m, uint64_t n) {
    if (!m || !m->waiting) return;
    m->queued = n;
    exec_totals(m);
}

void gw_met_set_inflight(gw_met *m, uint64_t n) {
    if (m && m->inflight) gw_met_set(m->inflight, NULL, (double)n);
}

void gw_met_redis_error(gw_met *m) {
    if (m && m->redis_err) gw_met_add(m->redis_err, NULL, 1);
}

void gw_met_fallback_admission(gw_met *m) {
    if (m && m->fallback) gw_met_add(m->fallback, NULL, 1);
}
void gw_met_auth_totals(gw_met *m, uint64_t redis_errors, uint64_t fallback_admissions) {
    if (!m) return;
    if (m->redis_err) gw_met_set(m->redis_err, NULL, (double)redis_errors);
    if (m->fallback) gw_met_set(m->fallback, NULL, (double)fallback_admissions);
}
void gw_met_tenant_usage(gw_met *m, const char *tenant, uint64_t prompt_tokens, uint64_t gen_tokens) {
    if (!m || !tenant || !*tenant) return;
    gw_met_add(m->t_requests, &tenant, 1);
    gw_met_add(m->t_prompt, &tenant, (double)prompt_tokens);
    gw_met_add(m->t_gen, &tenant, (double)gen_tokens);
}
