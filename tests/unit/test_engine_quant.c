/* Quantized weights through the CPU backend against the same weights dequantized to F32 (the
 * differences left are the kernels' activation quantization, two int8 levels per value, and
 * summation order), over 256 positions, every comparison strict:
 * - logits: per-position relative L2 error below 1e-3 (measured ~1.3e-4 for Q8_0/Q4_0 and
 *   ~1.9e-4 for Q4_K on `small`; with 8-bit activations it was ~3e-2);
 * - raw top-1 agreement >= 99 % over all positions, and >= 99 % over the positions whose F32
 *   top-1 leads the runner-up by more than 4x the position's RMS logit difference (at least
 *   half of them must be such "decisive" positions; random models have near-ties).
 * Models: `arka mkmodel tiny` and `small` (12 layers) at Q8_0, Q4_0, Q4_K (random weights;
 * small Q4_K only with ARKA_LONG_TESTS=1), and the trained stories260K with its matrices requantized in memory to Q8_0 and Q4_0 (every
 * matrix whose rows are a multiple of 32), on 256 positions of its greedy text. The mkmodel
 * files are written by the arka binary (ARKA_BIN, set by ctest) into a temporary directory. */
#include "executor/engine.h"
#include "executor/kv.h"
#include "common/cm_err.h"
#include "model/dtype.h"
#include "model/model.h"
#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NPOS 256
#define MAX_REL 1e-3
/* Under the sanitizers the random-weight shapes use fewer positions (their output head is
 * 32000 x 256 F32 per position) and skip Q4_K (mkmodel's quantizer is slow when instrumented)
 * and `small`, to stay well under a minute; stories260K keeps 256 positions. */
#if defined(__SANITIZE_ADDRESS__)
static int npos_tiny = 48;
#else
static int npos_tiny = NPOS;
#endif
static int npos = NPOS; /* positions of the current comparison */

/* A copy of m whose matrices (and embeddings) are F32 arrays dequantized from m's blocks. */
typedef struct { mdl_model m; void *bufs[512]; int nb; } f32_model;

static int deq(f32_model *f, mdl_tensor *t) {
    if (!t->data || t->type == DT_F32) return 0;
    int64_t n = t->ne[0] * t->ne[1];
    float *p = malloc(sizeof(float) * (size_t)n);
    if (!p || dt_dequantize(t->type, t->data, p, n)) { free(p); return -1; }
    f->bufs[f->nb++] = p;
    t->data = p;
    t->type = DT_F32;
    t->nbytes = sizeof(float) * (uint64_t)n;
    return 0;
}

static int to_f32(const mdl_model *q, f32_model *f) {
    memset(f, 0, sizeof *f);
    f->m = *q;
    f->m.layers = malloc(sizeof(mdl_layer) * (size_t)q->cfg.n_layer);
    if (!f->m.layers) return -1;
    memcpy(f->m.layers, q->layers, sizeof(mdl_layer) * (size_t)q->cfg.n_layer);
    int tied = q->output.data == q->tok_embd.data;
    if (deq(f, &f->m.tok_embd)) return -1;
    if (tied) f->m.output = f->m.tok_embd;
    else if (deq(f, &f->m.output)) return -1;
    for (int l = 0; l < q->cfg.n_layer; l++) {
        mdl_layer *y = &f->m.layers[l];
        mdl_tensor *ts[] = { &y->wq, &y->wk, &y->wv, &y->wo, &y->w_gate, &y->w_up, &y->w_down };
        for (int i = 0; i < 7; i++) if (deq(f, ts[i])) return -1;
    }
    return 0;
}

static void f32_free(f32_model *f) {
    for (int i = 0; i < f->nb; i++) free(f->bufs[i]);
    free(f->m.layers);
}

static float *logits_of(const mdl_model *m, const int32_t *ids) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_ctx = NPOS;
    o.max_tokens = npos;
    o.max_seqs = 1;
    o.max_out = npos;
    o.kv_cache_mb = 64;
    ex_engine *e;
    char err[256];
    if (ex_engine_create(m, &o, &e, err, sizeof err)) { fprintf(stderr, "%s\n", err); return NULL; }
    ex_kv_table t;
    ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
    ex_kv_table_reserve(ex_engine_kv(e), &t, npos);
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(e));
    ex_batch_buf_add(&bb, ids, npos, 0, t.blocks, t.n, 1);
    const float *lg;
    float *out = NULL;
    int V = m->cfg.n_vocab;
    if (ex_engine_forward(e, &bb.b, &lg) == 0 && (out = malloc(sizeof(float) * npos * (size_t)V)))
        memcpy(out, lg, sizeof(float) * npos * (size_t)V);
    ex_batch_buf_free(&bb);
    ex_kv_table_release(ex_engine_kv(e), &t);
    ex_kv_table_free(&t);
    ex_engine_destroy(e);
    return out;
}

/* Runs both models over ids and checks the agreement (see the header). */
static void compare(const mdl_model *q, const mdl_model *f, const int32_t *ids, const char *shape, const char *type) {
    int V = q->cfg.n_vocab;
    float *a = logits_of(q, ids), *b = logits_of(f, ids);
    T_CHECK(a && b);
    if (a && b) {
        int agree = 0, decisive = 0, agree_dec = 0;
        double worst = 0, mean = 0;
        for (int p = 0; p < npos; p++) {
            const float *ra = a + (size_t)p * V, *rb = b + (size_t)p * V;
            double num = 0, den = 0;
            int ia = 0, ib = 0;
            for (int i = 0; i < V; i++) {
                num += (double)(ra[i] - rb[i]) * (ra[i] - rb[i]);
                den += (double)rb[i] * rb[i];
                if (ra[i] > ra[ia]) ia = i;
                if (rb[i] > rb[ib]) ib = i;
            }
            double second = -INFINITY;
            for (int i = 0; i < V; i++) if (i != ib && rb[i] > second) second = rb[i];
            double rel = sqrt(num / (den > 0 ? den : 1)), rms = sqrt(num / V);
            worst = fmax(worst, isnan(rel) ? INFINITY : rel);
            mean += rel / npos;
            agree += ia == ib;
            if (rb[ib] - second > 4 * rms) { decisive++; agree_dec += ia == ib; }
        }
        printf("%s %s: logits rel L2 err mean %.2e max %.2e (bound %.0e); top-1 agreement %d/%d raw, %d/%d decisive\n",
               shape, type, mean, worst, MAX_REL, agree, npos, agree_dec, decisive);
        T_CHECKF(worst < MAX_REL, "%s %s: max rel err %g", shape, type, worst);
        T_CHECKF(agree * 100 >= 99 * npos, "%s %s: raw top-1 agreement %d/%d", shape, type, agree, npos);
        T_CHECKF(decisive >= npos / 2, "%s %s: only %d decisive positions", shape, type, decisive);
        T_CHECKF(agree_dec * 100 >= 99 * decisive, "%s %s: decisive top-1 agreement %d/%d", shape, type, agree_dec, decisive);
    }
    free(a);
    free(b);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check_type(const char *arka, const char *dir, const char *shape, const char *type) {
    double t0 = now_s();
    char path[512], cmd[1400];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, shape, type);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel %s '%s' --type %s --seed 11 >/dev/null 2>&1", arka, shape, path, type);
    int rc = system(cmd);
    T_CHECKF(rc == 0, "%s failed", cmd);
    if (rc) return;
    mdl_model *q;
    char err[256];
    rc = mdl_load(path, &q, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    if (rc) return;
    T_EQ_INT(q->layers[0].wq.type, dt_from_name(type));
    f32_model f;
    T_EQ_INT(to_f32(q, &f), 0);
    int V = q->cfg.n_vocab;
    static int32_t ids[NPOS];
    uint32_t x = 5;
    ids[0] = 1;
    for (int i = 1; i < NPOS; i++) { x = x * 1664525u + 1013904223u; ids[i] = 3 + (int32_t)((x >> 8) % (uint32_t)(V - 3)); }
    npos = npos_tiny;
    compare(q, &f.m, ids, shape, type);
    f32_free(&f);
    mdl_free(q);
    unlink(path);
    printf("%s %s: %.1f s\n", shape, type, now_s() - t0);
}

/* stories260K with its eligible matrices quantized to `type` (quantized copy) and the same
 * blocks dequantized (f32 copy). */
static void check_stories(const char *type_name) {
    mdl_model *m;
    char err[256];
    if (mdl_load(T_MODELS "stories260K.gguf", &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); T_CHECK(0); return; }
    int type = dt_from_name(type_name), bs = dt_block_size(type);
    mdl_model q = *m, f = *m;
    q.layers = malloc(sizeof(mdl_layer) * (size_t)m->cfg.n_layer);
    f.layers = malloc(sizeof(mdl_layer) * (size_t)m->cfg.n_layer);
    memcpy(q.layers, m->layers, sizeof(mdl_layer) * (size_t)m->cfg.n_layer);
    memcpy(f.layers, m->layers, sizeof(mdl_layer) * (size_t)m->cfg.n_layer);
    void *bufs[128];
    int nb = 0, n_quant = 0;
    for (int l = -1; l < m->cfg.n_layer; l++) {
        mdl_tensor *tq[7], *tf[7];
        int n = 0;
        if (l < 0) { tq[n] = &q.output; tf[n++] = &f.output; }
        else {
            mdl_layer *a = &q.layers[l], *b = &f.layers[l];
            tq[n] = &a->wq; tf[n++] = &b->wq; tq[n] = &a->wk; tf[n++] = &b->wk; tq[n] = &a->wv; tf[n++] = &b->wv;
            tq[n] = &a->wo; tf[n++] = &b->wo; tq[n] = &a->w_gate; tf[n++] = &b->w_gate;
            tq[n] = &a->w_up; tf[n++] = &b->w_up; tq[n] = &a->w_down; tf[n++] = &b->w_down;
        }
        for (int i = 0; i < n; i++) {
            int64_t n_in = tq[i]->ne[0], n_out = tq[i]->ne[1];
            if (tq[i]->type != DT_F32 || n_in % bs) continue;
            size_t rs = dt_row_size(type, n_in);
            uint8_t *qb = malloc(rs * (size_t)n_out);
            float *fb = malloc(sizeof(float) * (size_t)(n_in * n_out));
            for (int64_t r = 0; r < n_out; r++) {
                dt_quantize(type, (const float *)tq[i]->data + r * n_in, qb + r * rs, n_in);
                dt_dequantize(type, qb + r * rs, fb + r * n_in, n_in);
            }
            bufs[nb++] = qb; bufs[nb++] = fb;
            tq[i]->data = qb; tq[i]->type = type; tq[i]->nbytes = rs * (size_t)n_out;
            tf[i]->data = fb;
            n_quant++;
        }
    }
    T_CHECK(n_quant >= 31); /* all but the 5 w_down (rows of 172) */
    /* 256 positions of the model's own greedy text */
    static int32_t ids[NPOS];
    static const int32_t once[5] = { 1, 403, 407, 261, 378 };
    memcpy(ids, once, sizeof once);
    {
        ex_engine_opts o;
        ex_engine_opts_default(&o);
        o.n_ctx = NPOS; o.max_seqs = 1; o.kv_cache_mb = 8;
        ex_engine *e;
        if (ex_engine_create(m, &o, &e, err, sizeof err) == 0) {
            ex_kv_table t;
            ex_kv_table_init(&t, ex_engine_limits(e)->max_blocks);
            ex_batch_buf bb;
            ex_batch_buf_init(&bb, ex_engine_limits(e));
            for (int p = 0; p + 1 < NPOS; p++) {
                ex_kv_table_reserve(ex_engine_kv(e), &t, p + 1);
                ex_batch_buf_clear(&bb);
                ex_batch_buf_add(&bb, ids + p, 1, p, t.blocks, t.n, 0);
                const float *lg;
                if (ex_engine_forward(e, &bb.b, &lg)) break;
                if (p + 1 < 5) continue;
                int best = 0;
                for (int i = 1; i < m->cfg.n_vocab; i++) if (lg[i] > lg[best]) best = i;
                ids[p + 1] = best;
            }
            ex_batch_buf_free(&bb);
            ex_kv_table_release(ex_engine_kv(e), &t);
            ex_kv_table_free(&t);
            ex_engine_destroy(e);
        }
    }
    npos = NPOS;
    compare(&q, &f, ids, "stories260K", type_name);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(q.layers);
    free(f.layers);
    mdl_free(m);
}

int main(void) {
    const char *arka = getenv("ARKA_BIN");
    if (!arka) arka = "build/bin/arka";
    const char *lng = getenv("ARKA_LONG_TESTS");
    int long_tests = lng && !strcmp(lng, "1");
    char dir[] = "/tmp/arka_quant_XXXXXX";
    if (!mkdtemp(dir)) { T_CHECK(0); return t_done(); }
    check_stories("q8_0");
    check_stories("q4_0");
    check_type(arka, dir, "tiny", "q8_0");
    check_type(arka, dir, "tiny", "q4_0");
#if defined(__SANITIZE_ADDRESS__)
    /* the reference Q4_K quantizer inside an instrumented mkmodel alone takes ~45 s here */
    printf("NOTICE: tiny q4_k and small skipped in the sanitizer build (covered by the normal build)\n");
    (void)long_tests;
#else
    check_type(arka, dir, "tiny", "q4_k");
    /* ~2 s each; small Q4_K takes ~4 s (half of it mkmodel's Q4_K quantizer) */
    check_type(arka, dir, "small", "q8_0");
    check_type(arka, dir, "small", "q4_0");
    if (long_tests) check_type(arka, dir, "small", "q4_k");
    else printf("NOTICE: small q4_k runs with ARKA_LONG_TESTS=1\n");
#endif
    rmdir(dir);
    return t_done();
}
