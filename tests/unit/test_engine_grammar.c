/* Constrained decoding and embeddings in the scheduler over stories260K (a model that cannot
 * write JSON on its own): the masked sampler (allowed tokens only, greedy and sampled, empty
 * masks refused), batched sequences under a JSON schema whose every output is a complete,
 * valid document, a grammar that ends without an end id, grammar refusals at submit; then
 * embedding requests pooled as the engine's whole-batch ex_engine_embed pools them (mean over
 * chunks, last, first token), normalised, side by side with generation. */
#include "common/cm_err.h"
#include "executor/engine.h"
#include "executor/grammar.h"
#include "executor/kv.h"
#include "executor/sched.h"
#include "model/model.h"
#include "t.h"
#include "text/grammar.h"
#include "text/tok.h"

#include <stdlib.h>
#include <string.h>

static mdl_model *m;
static tok_vocab *tv;

static ex_engine *mk(int max_out) {
    ex_engine_opts o;
    ex_engine_opts_default(&o);
    o.n_threads = 1;
    o.kv_cache_mb = 8;
    o.max_tokens = 128;
    o.max_seqs = 16;
    o.max_out = max_out;
    char err[256];
    ex_engine *e = NULL;
    int rc = ex_engine_create(m, &o, &e, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    return e;
}

static ex_gram_vocab *gram_vocab(int n_vocab) {
    uint32_t *off;
    uint8_t *bytes;
    int n;
    ex_gram_vocab *v = NULL;
    if (tok_gram_vocab(tv, &off, &bytes, &n) == 0) ex_gram_vocab_create(n_vocab, n, off, bytes, &v);
    free(off);
    free(bytes);
    return v;
}

static void test_sampler_mask(void) {
    enum { V = 70 };
    ex_sampler *s;
    T_CHECK(ex_sampler_create(V, &s) == 0);
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)(i % 7);
    uint32_t mask[3] = { 0 };
    mask[0] = 1u << 3 | 1u << 5;
    mask[2] = 1u << (66 - 64);
    ex_sample_params p;
    ex_sample_params_default(&p);
    ex_sample_row r = { .sp = &p, .pos = 0, .mask = mask };
    ex_sample_out o;
    T_CHECK(ex_sampler_sample(s, &r, logits, &o) == 0 && o.token == 5); /* greedy among 3, 5, 66: 5 (z 5) over 66 (z 3) */
    p.temperature = 1.5f;
    p.logprobs = 1;
    int seen[V] = { 0 };
    for (int k = 0; k < 300; k++) {
        p.seed = (uint64_t)k;
        T_CHECK(ex_sampler_sample(s, &r, logits, &o) == 0);
        if (o.token >= 0) seen[o.token]++;
    }
    int outside = 0;
    for (int i = 0; i < V; i++) outside += seen[i] && i != 3 && i != 5 && i != 66;
    T_CHECK(outside == 0 && seen[3] && seen[5] && seen[66]);
    p.top_k = 1; /* top-k counts allowed tokens only */
    T_CHECK(ex_sampler_sample(s, &r, logits, &o) == 0 && o.token == 5);
    p.top_k = 0;
    /* every allowed token impossible (bias -inf): the lowest allowed id */
    struct shm_logit_bias b[3] = { { 3, -INFINITY }, { 5, -INFINITY }, { 66, -INFINITY } };
    r.bias = b;
    r.n_bias = 3;
    T_CHECK(ex_sampler_sample(s, &r, logits, &o) == 0 && o.token == 3);
    p.temperature = 0;
    T_CHECK(ex_sampler_sample(s, &r, logits, &o) == 0 && o.token == 3);
    r.n_bias = 0;
    uint32_t none[3] = { 0, 0, 0 };
    r.mask = none;
    T_CHECK(ex_sampler_sample(s, &r, logits, &o) == CM_EINVAL && o.token == -1);
    ex_sampler_destroy(s);

    /* greedy against a plain scan: vocabularies that end inside a mask word, masks from empty-ish
     * to full, logits with ties, -inf, +inf and NaN */
    enum { V2 = 1000, W2 = (V2 + 31) / 32 };
    T_CHECK(ex_sampler_create(V2, &s) == 0);
    float z[V2];
    uint32_t mk[W2];
    uint64_t x = 88172645463325252ull;
    int bad = 0;
    p.temperature = 0;
    p.logprobs = 0;
    for (int trial = 0; trial < 2000; trial++) {
        int v = 1 + (int)(trial * 7919u % V2);
        int density = trial % 5; /* 0 sparse .. 4 full */
        for (int i = 0; i < v; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int k = (int)(x % 64);
            z[i] = k == 0 ? -INFINITY : k == 1 && trial % 3 == 0 ? NAN : k == 2 && trial % 7 == 0 ? INFINITY : (float)(x >> 40 & 15);
        }
        for (int w = 0; w < W2; w++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t m = (uint32_t)x;
            mk[w] = density == 0 ? m & (uint32_t)(x >> 32) & (uint32_t)(x >> 16) & 0x01010101u : density == 1 ? m & (uint32_t)(x >> 32)
                  : density == 2 ? m : density == 3 ? m | (uint32_t)(x >> 32) : ~0u;
        }
        int want = -1, lowest = -1;
        for (int i = 0; i < v; i++) {
            if (!((mk[i >> 5] >> (i & 31)) & 1)) continue;
            if (lowest < 0) lowest = i;
            if (!isnan(z[i]) && z[i] != -INFINITY && (want < 0 || z[i] > z[want])) want = i;
        }
        if (want < 0) want = lowest;
        ex_sampler *sv;
        T_CHECK(ex_sampler_create(v, &sv) == 0);
        ex_sample_row rr = { .sp = &p, .pos = 0, .mask = mk };
        int rc = ex_sampler_sample(sv, &rr, z, &o);
        if (lowest < 0) bad += rc != CM_EINVAL;
        else bad += rc != 0 || o.token != want;
        rr.mask = NULL; /* and without a mask */
        want = -1;
        for (int i = 0; i < v; i++)
            if (!isnan(z[i]) && z[i] != -INFINITY && (want < 0 || z[i] > z[want])) want = i;
        if (want < 0) want = 0;
        bad += ex_sampler_sample(sv, &rr, z, &o) != 0 || o.token != want;
        ex_sampler_destroy(sv);
    }
    T_EQ_INT(bad, 0);
    ex_sampler_destroy(s);
}

/* The detokenized text of tokens (their bytes, stop ids left out). */
static char *text_of(const int32_t *t, int n) {
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++) {
        size_t l = 0;
        const char *p = tok_type(tv, t[i]) == TOK_TYPE_CONTROL ? "" : tok_piece_ref(tv, t[i], &l);
        if (len + l + 1 > cap) s = realloc(s, cap = (len + l + 1) * 2);
        memcpy(s + len, p, l);
        len += l;
    }
    s[len] = 0;
    return s;
}

/* 1 when the byte-level matcher of prog accepts text whole. */
static int valid(const uint32_t *prog, size_t plen, const char *text) {
    uint32_t off[258];
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++) { off[i] = (uint32_t)i; bytes[i] = (uint8_t)i; }
    off[256] = off[257] = 256;
    ex_gram_vocab *bv;
    ex_gram_vocab_create(257, 257, off, bytes, &bv);
    int32_t end = 256;
    ex_gram *g;
    char err[200];
    int ok = ex_gram_create(prog, plen, bv, &end, 1, &g, err, sizeof err) == 0;
    ex_gram_state st;
    ok = ok && ex_gram_state_init(g, &st) == 0;
    for (const char *p = text; ok && *p; p++) ok = ex_gram_advance(g, &st, (unsigned char)*p) == 0;
    ok = ok && ex_gram_accepting(g, &st);
    ex_gram_destroy(g);
    ex_gram_vocab_destroy(bv);
    return ok;
}

#define NSEQ 24
static void test_schema_batch(void) {
    ex_engine *e = mk(16);
    if (!e) return;
    ex_sched *s;
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    T_CHECK(ex_sched_create(e, &so, &s) == 0);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
                         "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"pet\":{\"enum\":[\"cat\",\"dog\"]},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3}},"
                         "\"required\":[\"name\",\"age\",\"pet\",\"tags\"],\"additionalProperties\":false}";
    tok_gbnf d;
    tok_gbnf_init(&d);
    char err[300];
    uint32_t *prog = NULL;
    size_t plen = 0;
    T_CHECK(tok_gbnf_schema(&d, "root", schema, strlen(schema), err, sizeof err) == 0 &&
            tok_gram_compile(d.s, d.len, tv, &prog, &plen, err, sizeof err) == 0);
    tok_gbnf_free(&d);
    int32_t prompt[8], eog[16];
    int np = 0, n_eog = tok_eog_ids(tv, eog, 16);
    tok_encode(tv, "Once upon a time", 16, 1, 0, prompt, 8, &np);
    ex_request r = { .prompt = prompt, .n_prompt = np, .stop_ids = eog, .n_stop = n_eog, .grammar = prog, .grammar_len = plen };
    ex_sample_params_default(&r.sp);
    r.sp.max_tokens = 200;
    r.sp.temperature = 1.0f;
    /* no vocabulary yet: refused, naming why */
    r.id = 1;
    T_CHECK(ex_sched_submit(s, &r) == CM_ESTATE && strstr(ex_sched_error(s), "vocabulary"));
    T_CHECK(ex_sched_set_vocab(s, gram_vocab(m->cfg.n_vocab)) == 0);
    /* a corrupt program: refused */
    uint32_t bad[8] = { EX_GRAM_MAGIC, EX_GRAM_VERSION, 0, 1, 1, 5, 0, 0 };
    ex_request rb = r;
    rb.grammar = bad;
    rb.grammar_len = sizeof bad;
    T_CHECK(ex_sched_submit(s, &rb) == CM_EINVAL && strstr(ex_sched_error(s), "grammar program"));
    int32_t *toks[NSEQ];
    int n_tok[NSEQ] = { 0 }, fin[NSEQ] = { 0 };
    for (int i = 0; i < NSEQ; i++) {
        toks[i] = malloc(sizeof(int32_t) * 256);
        r.id = 10 + i;
        r.sp.seed = 77 + i;
        r.sp.has_seed = 1;
        T_CHECK(ex_sched_submit(s, &r) == 0);
    }
    ex_event ev[64];
    int n_ev, steps = 0;
    while (ex_sched_busy(s) && steps++ < 4000) {
        T_CHECK(ex_sched_step(s, ev, 64, &n_ev) == 0);
        for (int k = 0; k < n_ev; k++) {
            int i = (int)ev[k].id - 10;
            if (i < 0 || i >= NSEQ) continue;
            if (ev[k].token >= 0 && !tok_is_eog(tv, ev[k].token)) toks[i][n_tok[i]++] = ev[k].token;
            if (ev[k].finish) fin[i] = ev[k].finish;
        }
    }
    int ok = 0, stopped = 0;
    for (int i = 0; i < NSEQ; i++) {
        char *t = text_of(toks[i], n_tok[i]);
        int v = valid(prog, plen, t);
        ok += v;
        stopped += fin[i] == SHM_FINISH_STOP;
        if (!v || fin[i] != SHM_FINISH_STOP) fprintf(stderr, "sequence %d (finish %d): %s\n", i, fin[i], t);
        if (i == 0) printf("sample: %s\n", t);
        free(t);
        free(toks[i]);
    }
    T_CHECKF(ok == NSEQ && stopped == NSEQ, "%d of %d documents valid, %d ended by the grammar", ok, NSEQ, stopped);

    /* a grammar that ends with nothing more allowed and no end id: finishes by itself */
    uint32_t *p2;
    size_t l2;
    T_CHECK(tok_gram_compile("root ::= \"ab\" [0-9]", 19, tv, &p2, &l2, err, sizeof err) == 0);
    ex_request r2 = { .id = 500, .prompt = prompt, .n_prompt = np, .grammar = p2, .grammar_len = l2 };
    ex_sample_params_default(&r2.sp);
    r2.sp.max_tokens = 50;
    T_CHECK(ex_sched_submit(s, &r2) == 0);
    int32_t got[64];
    int ng = 0, f2 = 0;
    while (ex_sched_busy(s)) {
        T_CHECK(ex_sched_step(s, ev, 64, &n_ev) == 0);
        for (int k = 0; k < n_ev; k++) {
            if (ev[k].token >= 0) got[ng++] = ev[k].token;
            if (ev[k].finish) f2 = ev[k].finish;
        }
    }
    char *t2 = text_of(got, ng);
    T_CHECKF(f2 == SHM_FINISH_STOP && strlen(t2) == 3 && !strncmp(t2, "ab", 2) && t2[2] >= '0' && t2[2] <= '9', "finish %d text '%s'", f2, t2);
    free(t2);
    free(p2);
    free(prog);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
}

static void test_embeddings(void) {
    ex_engine *e = mk(16), *ref = mk(128);
    if (!e || !ref) return;
    ex_sched *s;
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    T_CHECK(ex_sched_create(e, &so, &s) == 0);
    const int E = m->cfg.n_embd;
    int32_t prompt[100];
    int np = 0;
    const char *txt = "Once upon a time there was a little girl named Lily who loved to play outside in the park with her dog";
    tok_encode(tv, txt, strlen(txt), 1, 0, prompt, 100, &np);
    T_CHECK(np > 16); /* the mean then needs several chunks of 16 rows */
    const int pools[3] = { MDL_POOL_MEAN, MDL_POOL_LAST, MDL_POOL_CLS };
    float want[3][512];
    ex_batch_buf bb;
    ex_batch_buf_init(&bb, ex_engine_limits(ref));
    for (int k = 0; k < 3; k++) { /* the reference: one whole batch through ex_engine_embed */
        ex_kv_table t;
        ex_kv_table_init(&t, ex_engine_limits(ref)->max_blocks);
        ex_kv_table_reserve(ex_engine_kv(ref), &t, np);
        ex_batch_buf_clear(&bb);
        ex_batch_buf_add_kv(&bb, prompt, np, 0, &t, pools[k] != MDL_POOL_LAST);
        T_CHECK(ex_engine_embed(ref, &bb.b, pools[k], 1, want[k]) == 0);
        ex_kv_table_release(ex_engine_kv(ref), &t);
        ex_kv_table_free(&t);
    }
    ex_batch_buf_free(&bb);
    /* the same three, batched with a generation */
    for (int k = 0; k < 3; k++) {
        ex_request r = { .id = 1 + k, .prompt = prompt, .n_prompt = np, .embed = 1, .pooling = pools[k], .normalize = 1 };
        T_CHECK(ex_sched_submit(s, &r) == 0);
    }
    ex_request g = { .id = 9, .prompt = prompt, .n_prompt = 5 };
    ex_sample_params_default(&g.sp);
    g.sp.max_tokens = 20;
    T_CHECK(ex_sched_submit(s, &g) == 0);
    ex_request bad = { .id = 4, .prompt = prompt, .n_prompt = np, .embed = 1, .pooling = 0 };
    T_CHECK(ex_sched_submit(s, &bad) == CM_EINVAL);
    ex_event ev[64];
    int n_ev, got = 0, gen = 0;
    while (ex_sched_busy(s)) {
        T_CHECK(ex_sched_step(s, ev, 64, &n_ev) == 0);
        for (int i = 0; i < n_ev; i++) {
            if (ev[i].id == 9) { gen += ev[i].token >= 0; continue; }
            int k = (int)ev[i].id - 1;
            T_CHECK(k >= 0 && k < 3 && ev[i].finish == SHM_FINISH_STOP && ev[i].embd && ev[i].n_embd == E &&
                    ev[i].token == -1 && ev[i].n_prompt == np);
            if (k < 0 || k >= 3 || !ev[i].embd) continue;
            double dot = 0, n2 = 0, maxd = 0;
            for (int j = 0; j < E; j++) {
                dot += (double)ev[i].embd[j] * want[k][j];
                n2 += (double)ev[i].embd[j] * ev[i].embd[j];
                double dd = fabs(ev[i].embd[j] - want[k][j]);
                if (dd > maxd) maxd = dd;
            }
            T_CHECKF(fabs(n2 - 1) < 1e-5 && dot > 0.99999 && maxd < 1e-4, "pooling %d: cosine %.7f, max diff %g", pools[k], dot, maxd);
            got++;
        }
    }
    T_CHECK(got == 3 && gen == 20);
    ex_sched_destroy(s);
    ex_engine_destroy(e);
    ex_engine_destroy(ref);
}

int main(void) {
    char err[256];
    if (mdl_load(T_MODELS "stories260K.gguf", &m, err, sizeof err) || tok_load_file(T_MODELS "stories260K.gguf", &tv, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    test_sampler_mask();
    test_schema_batch();
    test_embeddings();
    tok_free(tv);
    mdl_free(m);
    return t_done();
}
