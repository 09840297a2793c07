/* tok: the llama.cpp vocabulary test vectors (../shared/models/vocab/X.gguf.inp and .out) for the
 * SentencePiece (llama-spm) and byte-level BPE (gpt-2) vocabularies, decode(encode(x)) round
 * trips, the stories260K tokenizer, and bad input (invalid UTF-8, NUL bytes, long texts). */
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "model/gguf.h"
#include "text/tok.h"
#include "t.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The long-input cases shrink 8x under the sanitizers (kept under a minute there); the normal
 * build runs them at full size: a 1 MB single word and a 10 MB prompt. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define BIG_SHIFT 3
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BIG_SHIFT 3
#endif
#endif
#ifndef BIG_SHIFT
#define BIG_SHIFT 0
#endif

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; *len = (size_t)n; }
    return buf;
}

static tok_vocab *load(const char *path) {
    gguf_ctx *g;
    char err[256];
    if (gguf_open(path, &g, err, sizeof err)) { fprintf(stderr, "%s\n", err); return NULL; }
    tok_vocab *v = NULL;
    if (tok_load_gguf(g, &v, err, sizeof err)) fprintf(stderr, "%s\n", err);
    gguf_close(g); /* the vocab copies what it needs */
    return v;
}

/* Encodes into a malloc'ed array (grown on CM_EFULL). */
static int encode(const tok_vocab *v, const char *s, size_t n, int bos, int special, int32_t **ids, int *nids) {
    int cap = 8;
    *ids = malloc((size_t)cap * sizeof **ids);
    int rc = tok_encode(v, s, n, bos, special, *ids, cap, nids);
    if (rc == CM_EFULL) {
        free(*ids);
        cap = *nids;
        *ids = malloc((size_t)(cap ? cap : 1) * sizeof **ids);
        rc = tok_encode(v, s, n, bos, special, *ids, cap, nids);
    }
    return rc;
}

static char *decode(const tok_vocab *v, const int32_t *ids, int n, size_t *len) {
    size_t cap = 64, w = 0;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        size_t pl;
        const char *p = tok_piece_ref(v, ids[i], &pl);
        if (!p) continue;
        while (w + pl + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + w, p, pl);
        w += pl;
    }
    out[w] = 0;
    *len = w;
    return out;
}

/* Runs every case of X.gguf.inp against X.gguf.out; checks the round trip too. */
static void vocab_cases(const char *gguf, int spm) {
    char path[512];
    size_t inl, outl;
    snprintf(path, sizeof path, "%s.inp", gguf);
    char *inp = slurp(path, &inl);
    snprintf(path, sizeof path, "%s.out", gguf);
    char *outp = slurp(path, &outl);
    tok_vocab *v = load(gguf);
    T_CHECKF(inp && outp && v, "%s: missing test data", gguf);
    if (!inp || !outp || !v) { free(inp); free(outp); tok_free(v); return; }
    const char *sep = "\n__ggml_vocab_test__\n";
    char *in = inp, *line = outp;
    int cases = 0, ok = 0, rt_ok = 0, rt_n = 0;
    while (in && *in) {
        char *end = strstr(in, sep);
        size_t n = end ? (size_t)(end - in) : strlen(in);
        char *nl = strchr(line, '\n');
        if (!nl) { T_CHECKF(0, "%s: fewer outputs than inputs", gguf); break; }
        *nl = 0;
        /* expected ids */
        int32_t want[4096];
        int nw = 0;
        for (char *p = line; *p;) {
            while (*p == ' ') p++;
            if (!*p) break;
            want[nw++] = (int32_t)strtol(p, &p, 10);
        }
        int32_t *ids;
        int nids;
        int rc = encode(v, in, n, 0, 0, &ids, &nids);
        int same = rc == 0 && nids == nw && !memcmp(ids, want, (size_t)nw * sizeof *ids);
        T_CHECKF(same, "%s case %d (\"%.*s\"): rc %d, %d ids, want %d", gguf, cases, (int)(n > 40 ? 40 : n), in, rc, nids, nw);
        if (!same && rc == 0) {
            fprintf(stderr, "  got :");
            for (int i = 0; i < nids; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want:");
            for (int i = 0; i < nw; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n");
        }
        ok += same;
        /* round trip: byte-level BPE is lossless; SPM adds one leading space (add_space_prefix)
         * to a non-empty text, which decoding drops again */
        if (rc == 0) {
            size_t dl;
            char *d = decode(v, ids, nids, &dl);
            const char *got = d;
            if (spm && n > 0 && dl > 0 && d[0] == ' ') { got++; dl--; }
            int rt = dl == n && !memcmp(got, in, n);
            T_CHECKF(rt, "%s case %d: decode(encode(x)) != x", gguf, cases);
            rt_ok += rt;
            rt_n++;
            free(d);
        }
        free(ids);
        cases++;
        line = nl + 1;
        in = end ? end + strlen(sep) : NULL;
    }
    printf("%s: %d/%d cases match, %d/%d round trips\n", gguf, ok, cases, rt_ok, rt_n);
    T_CHECK(cases >= 30);
    free(inp);
    free(outp);
    tok_free(v);
}

static void stories(void) {
    tok_vocab *v = load(T_MODELS "stories260K.gguf");
    T_CHECK(v != NULL);
    if (!v) return;
    T_EQ_INT(tok_kind(v), TOK_KIND_SPM);
    T_EQ_INT(tok_n_vocab(v), 512);
    T_EQ_INT(tok_bos(v), 1);
    T_EQ_INT(tok_eos(v), 2);
    T_CHECK(tok_add_bos(v));
    T_CHECK(tok_is_eog(v, 2));
    T_CHECK(!tok_is_eog(v, 1));
    int32_t eog[TOK_EOG_MAX];
    T_EQ_INT(tok_eog_ids(v, eog, TOK_EOG_MAX), 1); /* EOS only: the gateway's stop ids and generate's */
    T_EQ_INT(eog[0], 2);
    int32_t ids[32];
    int n;
    const char *text = "Once upon a time";
    T_EQ_INT(tok_encode(v, text, strlen(text), 1, 0, ids, 32, &n), 0);
    /* llama2.c's run.c and llama.cpp agree on these ids for stories260K */
    const int32_t want[] = { 1, 403, 407, 261, 378 };
    T_EQ_INT(n, 5);
    T_CHECK(n == 5 && !memcmp(ids, want, sizeof want));
    size_t dl;
    char *d = decode(v, ids + 1, n - 1, &dl);
    T_EQ_STR(d, " Once upon a time");
    free(d);
    /* CM_EFULL reports the size needed */
    int32_t small[2];
    T_EQ_INT(tok_encode(v, text, strlen(text), 1, 0, small, 2, &n), CM_EFULL);
    T_EQ_INT(n, 5);
    T_EQ_INT(small[0], 1);
    /* piece API */
    char buf[16];
    size_t len;
    T_EQ_INT(tok_piece(v, 403, buf, sizeof buf, &len), 0);
    T_CHECK(len == 5 && !memcmp(buf, " Once", 5));
    T_EQ_INT(tok_piece(v, 403, buf, 2, &len), CM_EFULL);
    T_EQ_INT(len, 5);
    T_EQ_INT(tok_piece(v, 512, buf, sizeof buf, &len), CM_ERANGE);
    T_EQ_INT(tok_piece(v, -1, buf, sizeof buf, &len), CM_ERANGE);
    /* byte fallback: newline is <0x0A> */
    T_EQ_INT(tok_encode(v, "a\nb", 3, 0, 0, ids, 32, &n), 0);
    int has_nl = 0;
    for (int i = 0; i < n; i++) {
        const char *t = tok_text(v, ids[i]);
        if (t && !strcmp(t, "<0x0A>")) {
            has_nl = 1;
            T_EQ_INT(tok_piece(v, ids[i], buf, sizeof buf, &len), 0);
            T_CHECK(len == 1 && buf[0] == '\n');
        }
    }
    T_CHECK(has_nl);
    /* special tokens: "<s>" is text unless parse_special */
    T_EQ_INT(tok_encode(v, "<s>hi", 5, 0, 1, ids, 32, &n), 0);
    T_CHECK(n >= 2 && ids[0] == 1);
    T_EQ_INT(tok_encode(v, "<s>hi", 5, 0, 0, ids, 32, &n), 0);
    T_CHECK(n >= 2 && ids[0] != 1);
    tok_free(v);
}

static void bad_input(const char *gguf) {
    tok_vocab *v = load(gguf);
    T_CHECK(v != NULL);
    if (!v) return;
    int32_t ids[64];
    int n = 123;
    /* invalid UTF-8 is refused whole */
    static const char *const bad[] = { "\xff", "abc\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\x80z", "\xe2\x82" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        T_EQ_INT(tok_encode(v, bad[i], strlen(bad[i]), 0, 0, ids, 64, &n), CM_EUTF8);
        T_EQ_INT(n, 0);
    }
    /* valid edge cases */
    const char *good = "\xf4\x8f\xbf\xbf \xef\xbf\xbf \xc2\x80";
    T_EQ_INT(tok_encode(v, good, strlen(good), 0, 0, ids, 64, &n), 0);
    /* NUL in the middle is a character like any other, and survives the round trip */
    const char nul[] = { 'a', 'b', 0, 'c', 'd' };
    int32_t *pids;
    int np;
    T_EQ_INT(encode(v, nul, sizeof nul, 0, 0, &pids, &np), 0);
    size_t dl;
    char *d = decode(v, pids, np, &dl);
    const char *cmp = d;
    if (dl == sizeof nul + 1 && d[0] == ' ') { cmp++; dl--; }
    T_CHECK(dl == sizeof nul && !memcmp(cmp, nul, sizeof nul));
    free(d);
    free(pids);
    /* bad arguments */
    T_EQ_INT(tok_encode(v, NULL, 3, 0, 0, ids, 64, &n), CM_EINVAL);
    T_EQ_INT(tok_encode(v, "x", 1, 0, 0, NULL, 4, &n), CM_EINVAL);
    T_EQ_INT(tok_encode(v, "", 0, 0, 0, NULL, 0, &n), 0);
    T_EQ_INT(n, 0);

    /* 1 MB single word: no quadratic behaviour */
    size_t big = (size_t)1 << (20 - BIG_SHIFT);
    char *w = malloc(big);
    for (size_t i = 0; i < big; i++) w[i] = "abcdefghij"[(i * 7 + i / 13) % 10];
    double t0 = cm_time_s();
    T_EQ_INT(encode(v, w, big, 0, 0, &pids, &np), 0);
    double t1 = cm_time_s();
    T_CHECK(np > (int)(big >> 10));
    d = decode(v, pids, np, &dl);
    cmp = d;
    if (dl == big + 1 && d[0] == ' ') { cmp++; dl--; }
    T_CHECK(dl == big && !memcmp(cmp, w, big));
    free(d);
    free(pids);
    printf("%s: %zu KB single word: %d tokens in %.2f s\n", gguf, big >> 10, np, t1 - t0);
    T_CHECKF(t1 - t0 < 20, "1 MB single word took %.1f s", t1 - t0);
    /* the same letter repeated (every pair joins: one chunk) */
    memset(w, 'a', big);
    t0 = cm_time_s();
    T_EQ_INT(encode(v, w, big, 0, 0, &pids, &np), 0);
    t1 = cm_time_s();
    printf("%s: %zu KB of 'a': %d tokens in %.2f s\n", gguf, big >> 10, np, t1 - t0);
    T_CHECKF(t1 - t0 < 20, "1 MB of 'a' took %.1f s", t1 - t0);
    free(pids);
    free(w);

    /* 10 MB prompt of English-like text */
    size_t ten = (size_t)10 << (20 - BIG_SHIFT);
    char *txt = malloc(ten);
    static const char *const words[] = { "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog,", "and", "then",
                                         "it", "said:", "\"hello\"", "world.", "\n", "3.14", "tokenizer", "naïve", "café" };
    size_t k = 0, wi = 0;
    while (k < ten) {
        const char *x = words[(wi * 2654435761u >> 7) % (sizeof words / sizeof *words)];
        size_t xl = strlen(x);
        if (k + xl + 1 > ten) break;
        memcpy(txt + k, x, xl);
        k += xl;
        txt[k++] = ' ';
        wi++;
    }
    t0 = cm_time_s();
    T_EQ_INT(encode(v, txt, k, 1, 0, &pids, &np), 0);
    t1 = cm_time_s();
    printf("%s: %zu KB prompt: %d tokens in %.2f s\n", gguf, ten >> 10, np, t1 - t0);
    T_CHECK(np > (int)(k / 8));
    d = decode(v, pids + 1, np - 1, &dl);
    cmp = d;
    if (dl == k + 1 && d[0] == ' ') { cmp++; dl--; }
    T_CHECK(dl == k && !memcmp(cmp, txt, k));
    free(d);
    free(pids);
    free(txt);
    tok_free(v);
}

/* 8 MB of one letter: every adjacent pair can merge, so no exact cut exists; the 64 KB chunk
 * cap keeps the working memory small (the uncapped merge needed ~40 bytes per input byte). */
static void hostile_memory(void) {
#if BIG_SHIFT == 0
    tok_vocab *v = load(T_MODELS "vocab/ggml-vocab-llama-spm.gguf");
    if (!v) return;
    size_t n = 8u << 20;
    char *a = malloc(n);
    memset(a, 'a', n);
    int cap = (int)(n / 2);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    memset(ids, 0, (size_t)cap * sizeof *ids); /* touch the output before measuring */
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    int got = 0;
    double t0 = cm_time_s();
    T_EQ_INT(tok_encode(v, a, n, 0, 0, ids, cap, &got), 0);
    double t1 = cm_time_s();
    getrusage(RUSAGE_SELF, &r1);
    long grew_kb = r1.ru_maxrss - r0.ru_maxrss;
    printf("8 MB of 'a': %d tokens in %.2f s, peak RSS grew %ld KB\n", got, t1 - t0, grew_kb);
    T_CHECKF(grew_kb < 32 * 1024, "peak RSS grew %ld KB", grew_kb);
    free(ids);
    free(a);
    tok_free(v);
#endif
}

int main(void) {
    hostile_memory();
    vocab_cases(T_MODELS "vocab/ggml-vocab-llama-spm.gguf", 1);
    vocab_cases(T_MODELS "vocab/ggml-vocab-gpt-2.gguf", 0);
    stories();
    bad_input(T_MODELS "vocab/ggml-vocab-llama-spm.gguf");
    bad_input(T_MODELS "vocab/ggml-vocab-gpt-2.gguf");
    return t_done();
}
