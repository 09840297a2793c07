/* sampler: logits -> token, in the order documented in sampler.h. */
#include "sampler.h"
#include "../common/cm_err.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float z; int32_t id; } cand;

struct ex_sampler {
    int      n_vocab;
    float   *z;      /* [n_vocab] processed logits */
    cand    *c;      /* [n_vocab] candidates */
    double  *p;      /* [n_vocab] candidate probabilities */
    int32_t *count;  /* [n_vocab] occurrences in the penalty window; all zero between calls */
};

int ex_sample_row_check(const ex_sample_row *r, int n_vocab) {
    if (!r->sp || shm_sampling_check(r->sp) || r->n_bias < 0 || (r->n_bias && !r->bias) || r->n_prev < 0 ||
        (r->n_prev && !r->prev))
        return CM_EINVAL;
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias[i].token < 0 || r->bias[i].token >= n_vocab || isnan(r->bias[i].bias)) return CM_EINVAL;
    return 0;
}

int ex_sampler_create(int n_vocab, ex_sampler **out) {
    *out = NULL;
    if (n_vocab <= 0) return CM_EINVAL;
    ex_sampler *s = calloc(1, sizeof *s);
    if (!s) return CM_ENOMEM;
    s->n_vocab = n_vocab;
    s->z = malloc(sizeof(float) * (size_t)n_vocab);
    s->c = malloc(sizeof(cand) * (size_t)n_vocab);
    s->p = malloc(sizeof(double) * (size_t)n_vocab);
    s->count = calloc((size_t)n_vocab, sizeof(int32_t));
    if (!s->z || !s->c || !s->p || !s->count) { ex_sampler_destroy(s); return CM_ENOMEM; }
    *out = s;
    return 0;
}

void ex_sampler_destroy(ex_sampler *s) {
    if (!s) return;
    free(s->z); free(s->c); free(s->p); free(s->count);
    free(s);
}

/* Total order: larger z first, then smaller id (ids are unique, so no two compare equal). */
static inline int before(const cand *a, const cand *b) {
    return a->z > b->z || (a->z == b->z && a->id < b->id);
}
static int cand_cmp(const void *x, const void *y) {
    const cand *a = x, *b = y;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Moves the k first (in the order above) of c[0..n) into c[0..k), unordered. O(n) average. */
static void select_k(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand piv = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (before(&c[i], &piv)) i++;
            while (before(&piv, &c[j])) j--;
            if (i <= j) { cand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

static void apply_penalties(ex_sampler *s, const ex_sample_params *p, const int32_t *prev, int n_prev) {
    int n = p->penalty_last_n < 0 ? n_prev : (p->penalty_last_n < n_prev ? p->penalty_last_n : n_prev);
    if (n == 0 || (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)) return;
    const int32_t *w = prev + n_prev - n;
    for (int i = 0; i < n; i++) s->count[w[i]]++;
    for (int i = 0; i < n; i++) {
        int32_t id = w[i];
        int cnt = s->count[id];
        if (cnt == 0) continue; /* already applied for this id */
        float z = s->z[id];
        if (p->repeat_penalty != 1.0f) z = z > 0 ? z / p->repeat_penalty : z * p->repeat_penalty;
        z -= p->presence_penalty + p->frequency_penalty * (float)cnt;
        s->z[id] = z;
        s->count[id] = 0; /* marks done and restores the all-zero invariant */
    }
}

static void fill_logprobs(ex_sampler *s, const ex_sample_params *p, ex_sample_out *o) {
    const int V = s->n_vocab;
    double inv_t = p->temperature > 0 ? 1.0 / p->temperature : 1.0;
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) if (s->z[i] * inv_t > mx) mx = s->z[i] * inv_t;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp(s->z[i] * inv_t - mx);
    double lse = mx + log(sum);
    o->logprob = (float)(s->z[o->token] * inv_t - lse);
    /* top-N by insertion into a short sorted list (N <= 20) */
    int n = 0, N = p->top_logprobs;
    for (int i = 0; i < V && N > 0; i++) {
        float lp = (float)(s->z[i] * inv_t - lse);
        if (n == N && !(lp > o->top_logprob[n - 1])) continue;
        int j = n < N ? n++ : n - 1;
        while (j > 0 && lp > o->top_logprob[j - 1]) {
            o->top_logprob[j] = o->top_logprob[j - 1];
            o->top_id[j] = o->top_id[j - 1];
            j--;
        }
        o->top_logprob[j] = lp;
        o->top_id[j] = i;
    }
    o->n_top = n;
}

/* The greedy draw: the highest logit among the allowed tokens (all when mk is NULL), the lowest
 * id on ties, the lowest allowed id when every allowed logit is -inf or NaN; -1 when nothing is
 * allowed. Blocks of 32 (one mask word): a branch-free maximum over the block in four independent
 * lanes, then the block is searched for its index only when it beats the best so far (rare), so
 * the pass runs at the loads' rate whatever the mask's shape. */
static float mask_add[256][8]; /* byte of a mask -> eight addends: 0 where the bit is set, -inf not */
static pthread_once_t mask_add_once = PTHREAD_ONCE_INIT;
static void mask_add_init(void) {
    for (int b = 0; b < 256; b++)
        for (int l = 0; l < 8; l++) mask_add[b][l] = ((b >> l) & 1) ? 0.0f : -INFINITY;
}

static int32_t argmax_masked(const float *z, const uint32_t *mk, int V) {
    if (mk) pthread_once(&mask_add_once, mask_add_init);
    float best = -INFINITY;
    int32_t tok = -1, first = -1;
    const int W = (V + 31) / 32;
    for (int w = 0; w < W; w++) {
        const int base = w * 32, n = V - base < 32 ? V - base : 32;
        uint32_t m = mk ? mk[w] : ~0u;
        if (n < 32) m &= (1u << n) - 1;
        if (!m) continue;
        if (first < 0) first = base + __builtin_ctz(m);
        const float *zb = z + base;
        float bm;
        if (n == 32) {
            float a[8];
            for (int l = 0; l < 8; l++) a[l] = -INFINITY;
            if (m == ~0u) {
                for (int j = 0; j < 32; j += 8)
                    for (int l = 0; l < 8; l++) a[l] = zb[j + l] > a[l] ? zb[j + l] : a[l];
            } else {
                for (int j = 0; j < 32; j += 8) {
                    const float *add = mask_add[(m >> j) & 255]; /* 0 allowed, -inf not */
                    for (int l = 0; l < 8; l++) {
                        float v = zb[j + l] + add[l];
                        a[l] = v > a[l] ? v : a[l];
                    }
                }
            }
            bm = a[0];
            for (int l = 1; l < 8; l++) bm = a[l] > bm ? a[l] : bm;
        } else {
            bm = -INFINITY;
            for (int j = 0; j < n; j++)
                if (((m >> j) & 1) && zb[j] > bm) bm = zb[j];
        }
        if (bm > best) {
            best = bm;
            for (int j = 0; j < n; j++)
                if (((m >> j) & 1) && zb[j] == bm) { tok = base + j; break; }
        }
    }
    return tok >= 0 ? tok : first;
}

int ex_sampler_sample(ex_sampler *s, const ex_sample_row *r, const float *logits, ex_sample_out *o) {
    const int V = s->n_vocab;
    const ex_sample_params *p = r->sp;
    const int32_t *prev = r->prev;
    int n_prev = r->n_prev;
    memset(o, 0, sizeof *o);
    o->token = -1;
    if (ex_sample_row_check(r, V)) return CM_EINVAL;
    int n_win = p->penalty_last_n < 0 ? n_prev : (p->penalty_last_n < n_prev ? p->penalty_last_n : n_prev);
    for (int i = n_prev - n_win; i < n_prev; i++)
        if (prev[i] < 0 || prev[i] >= V) return CM_EINVAL;

    memcpy(s->z, logits, sizeof(float) * (size_t)V);
    for (int i = 0; i < r->n_bias; i++) s->z[r->bias[i].token] += r->bias[i].bias;
    apply_penalties(s, p, prev, n_prev);
    /* a mask is walked word by word (skipping empty words, taking full ones whole): only the
     * allowed tokens are looked at, and -inf is written only when logprobs need it */
    const uint32_t *mk = r->mask;
    const int W = (V + 31) / 32;
#define MASK_WORD(w) (mk[w] & ((w) == V / 32 ? (V % 32 ? (1u << (V % 32)) - 1 : 0u) : ~0u))
    if (mk) {
        int any = 0;
        for (int w = 0; w < W && !any; w++) any = MASK_WORD(w) != 0;
        if (!any) return CM_EINVAL; /* nothing allowed */
        if (p->logprobs || p->top_logprobs)
            for (int w = 0; w < W; w++) {
                uint32_t m = MASK_WORD(w);
                if (m == ~0u) continue;
                for (int i = w * 32; i < w * 32 + 32 && i < V; i++)
                    if (!((m >> (i & 31)) & 1)) s->z[i] = -INFINITY;
            }
    }

    int32_t tok;
    if (p->temperature <= 0) {
        tok = argmax_masked(s->z, mk, V);
    } else {
        float inv_t = 1.0f / p->temperature;
        cand *c = s->c;
        int n = 0;
        if (mk) {
            for (int w = 0; w < W; w++)
                for (uint32_t m = MASK_WORD(w); m; m &= m - 1) {
                    int i = w * 32 + __builtin_ctz(m);
                    c[n].z = s->z[i] * inv_t;
                    c[n].id = i;
                    n++;
                }
        } else {
            for (int i = 0; i < V; i++) { c[i].z = s->z[i] * inv_t; c[i].id = i; }
            n = V;
        }
        const int n_all = n;
        if (p->top_k > 0 && p->top_k < n_all) { select_k(c, n_all, p->top_k); n = p->top_k; }
        else if (p->min_p > 0) {
            /* min-p's threshold is known before sorting: p_i >= min_p * p_max  <=>
             * z_i >= z_max + log(min_p). Dropping the rest first keeps the sort short. */
            float mx = c[0].z;
            for (int i = 1; i < n_all; i++) if (c[i].z > mx) mx = c[i].z;
            double thr = mx + log((double)p->min_p);
            int m = 0;
            for (int i = 0; i < n_all; i++) if (c[i].z >= thr) c[m++] = c[i];
            n = m ? m : n_all; /* every allowed token at -inf: all stay */
        }
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        if (!(c[0].z > -INFINITY)) { /* every candidate is impossible: the lowest allowed id */
            o->token = c[0].id;
            for (int i = 1; i < n; i++) if (c[i].id < o->token) o->token = c[i].id;
            if (p->logprobs || p->top_logprobs) fill_logprobs(s, p, o);
            return 0;
        }
        double *pr = s->p, sum = 0;
        for (int i = 0; i < n; i++) { pr[i] = exp((double)c[i].z - (double)c[0].z); sum += pr[i]; }
        for (int i = 0; i < n; i++) pr[i] /= sum;
        if (p->top_p < 1.0f) {
            double cum = 0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                cum += pr[i];
                if (cum >= p->top_p) { keep = i + 1; break; }
            }
            n = keep;
        }
        if (p->min_p > 0) {
            double thr = p->min_p * pr[0];
            int keep = 1;
            while (keep < n && pr[keep] >= thr) keep++;
            n = keep;
        }
        double mass = 0;
        for (int i = 0; i < n; i++) mass += pr[i];
        double u = ex_rng_u01(p->seed, r->pos) * mass, cum = 0;
        tok = c[n - 1].id;
        for (int i = 0; i < n; i++) {
            cum += pr[i];
            if (cum > u) { tok = c[i].id; break; }
        }
    }
    o->token = tok;
    if (p->logprobs || p->top_logprobs) fill_logprobs(s, p, o);
    return 0;
#undef MASK_WORD
}
