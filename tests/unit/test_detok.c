/* detok: incremental detokenization over the real llama-spm and gpt-2 vocabularies (byte
 * fallback and byte-level pieces split across tokens, leading-space rule, control tokens) and
 * the UTF-8 repair on hand-made byte sequences. */
#include "common/cm_err.h"
#include "text/detok.h"
#include "text/stop.h"
#include "model/gguf.h"
#include "text/tok.h"
#include "t.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static tok_vocab *load(const char *path) {
    gguf_ctx *g;
    char err[256];
    if (gguf_open(path, &g, err, sizeof err)) { fprintf(stderr, "%s\n", err); return NULL; }
    tok_vocab *v = NULL;
    if (tok_load_gguf(g, &v, err, sizeof err)) fprintf(stderr, "%s\n", err);
    gguf_close(g);
    return v;
}

/* Strict validity check (what a browser's TextDecoder with fatal: true accepts). */
static int utf8_ok(const char *s, size_t n) {
    uint8_t pend[4];
    int np = 0;
    char *tmp = malloc(3 * n + 3);
    size_t w = tok_detok_utf8(pend, &np, s, n, tmp);
    int ok = np == 0 && w == n && memcmp(tmp, s, n) == 0;
    free(tmp);
    return ok;
}

/* Streams ids through a detokenizer; checks every chunk is complete UTF-8; returns the text
 * (malloc'ed) and the number of pushes that produced nothing. */
static char *stream(const tok_vocab *v, const int32_t *ids, int n, int flags, int *empty_pushes, int *bad_chunks) {
    tok_detok d;
    T_EQ_INT(tok_detok_init(&d, v, flags), 0);
    size_t cap = tok_detok_out_cap(&d), w = 0;
    char *chunk = malloc(cap), *all = malloc(cap * (size_t)(n + 1) + 1);
    *empty_pushes = *bad_chunks = 0;
    for (int i = 0; i < n; i++) {
        size_t k;
        T_EQ_INT(tok_detok_push(&d, ids[i], chunk, cap, &k), 0);
        if (!k) (*empty_pushes)++;
        else if (!utf8_ok(chunk, k)) (*bad_chunks)++;
        memcpy(all + w, chunk, k);
        w += k;
    }
    size_t k;
    T_EQ_INT(tok_detok_flush(&d, chunk, cap, &k), 0);
    memcpy(all + w, chunk, k);
    w += k;
    all[w] = 0;
    free(chunk);
    return all;
}

static int encode(const tok_vocab *v, const char *s, int bos, int32_t *ids, int cap) {
    int n = 0;
    int rc = tok_encode(v, s, strlen(s), bos, 0, ids, cap, &n);
    T_EQ_INT(rc, 0);
    return rc ? 0 : n;
}

static void test_utf8_repair(void) {
    struct { const char *in; const char *out; int pend; } c[] = {
        {"abc", "abc", 0},
        {"\xC3\xA9", "\xC3\xA9", 0},
        {"\xC3", "", 1},                                      /* incomplete: kept */
        {"\xF0\x9F\x98", "", 3},
        {"\xC0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD", 0},          /* overlong lead */
        {"\xE0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 0},
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 0}, /* surrogate */
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 0},
        {"\xE4\xB8" "A", "\xEF\xBF\xBD" "A", 0},             /* maximal subpart = one U+FFFD */
        {"\x80" "a\xFF", "\xEF\xBF\xBD" "a\xEF\xBF\xBD", 0},
        {"x\xE4\xB8", "x", 2},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint8_t pend[4];
        int np = 0;
        char out[64];
        size_t w = tok_detok_utf8(pend, &np, c[i].in, strlen(c[i].in), out);
        out[w] = 0;
        T_CHECKF(strcmp(out, c[i].out) == 0 && np == c[i].pend, "case %zu: got %zu bytes, pend %d", i, w, np);
    }
    /* A character split over three calls comes out whole on the last one. */
    uint8_t pend[4];
    int np = 0;
    char out[16];
    T_EQ_INT(tok_detok_utf8(pend, &np, "\xF0", 1, out), 0);
    T_EQ_INT(tok_detok_utf8(pend, &np, "\x9F\x98", 2, out), 0);
    T_EQ_INT(np, 3);
    size_t w = tok_detok_utf8(pend, &np, "\x80!", 2, out);
    T_CHECK(w == 5 && memcmp(out, "\xF0\x9F\x98\x80!", 5) == 0 && np == 0);
    /* A pending prefix broken by the next chunk becomes U+FFFD, the new byte is kept. */
    np = 0;
    tok_detok_utf8(pend, &np, "\xE4", 1, out);
    w = tok_detok_utf8(pend, &np, "Z", 1, out);
    T_CHECK(w == 4 && memcmp(out, "\xEF\xBF\xBDZ", 4) == 0);
}

static void test_spm(void) {
    tok_vocab *v = load(T_MODELS "vocab/ggml-vocab-llama-spm.gguf");
    T_CHECK(v != NULL);
    if (!v) return;
    T_CHECK(tok_add_space_prefix(v));
    int32_t ids[256];
    int empty, bad;

    /* Prompt decoded from BOS: the tokenizer's leading space is removed. */
    int n = encode(v, "Hello world", 1, ids, 256);
    T_EQ_INT(ids[0], tok_bos(v));
    char *s = stream(v, ids, n, TOK_DETOK_SKIP_CONTROL, &empty, &bad);
    T_EQ_STR(s, "Hello world");
    free(s);
    /* Without SKIP_CONTROL the BOS text shows, and the space after it is still dropped. */
    s = stream(v, ids, n, 0, &empty, &bad);
    T_EQ_STR(s, "<s>Hello world");
    free(s);
    /* Generated tokens after a prompt keep their leading space. */
    s = stream(v, ids + 1, n - 1, TOK_DETOK_SKIP_CONTROL, &empty, &bad);
    T_EQ_STR(s, " Hello world");
    free(s);
    /* ...unless the caller says the text starts a document. */
    s = stream(v, ids + 1, n - 1, TOK_DETOK_STRIP_LEADING, &empty, &bad);
    T_EQ_STR(s, "Hello world");
    free(s);

    /* Byte fallback: an emoji is 4 byte tokens; the first 3 pushes emit nothing. */
    const char *txt = "Hi \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC \xCE\xB1\xCE\xB2 done";
    n = encode(v, txt, 0, ids, 256);
    s = stream(v, ids, n, 0, &empty, &bad);
    T_EQ_STR(s, " Hi \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC \xCE\xB1\xCE\xB2 done");
    T_EQ_INT(bad, 0);
    T_CHECKF(empty >= 3, "empty pushes %d", empty);
    free(s);

    /* Stray bytes from byte tokens: U+FFFD, and an unfinished character at flush too. */
    int32_t b_ff = tok_find(v, "<0xFF>", 6), b_e4 = tok_find(v, "<0xE4>", 6), b_b8 = tok_find(v, "<0xB8>", 6);
    T_CHECK(b_ff >= 0 && b_e4 >= 0 && b_b8 >= 0);
    int32_t seq[] = {b_ff, b_e4, b_b8};
    s = stream(v, seq, 3, 0, &empty, &bad);
    T_EQ_STR(s, "\xEF\xBF\xBD\xEF\xBF\xBD");
    T_EQ_INT(empty, 2);
    free(s);

    /* EOS is a control token: nothing with SKIP_CONTROL. */
    tok_detok d;
    tok_detok_init(&d, v, TOK_DETOK_SKIP_CONTROL);
    char out[8];
    size_t k = 99;
    T_EQ_INT(tok_detok_push(&d, tok_eos(v), out, sizeof out, &k), 0);
    T_EQ_INT(k, 0);
    /* Errors leave the state alone. */
    T_EQ_INT(tok_detok_push(&d, -1, out, sizeof out, &k), CM_ERANGE);
    T_EQ_INT(tok_detok_push(&d, tok_n_vocab(v), out, sizeof out, &k), CM_ERANGE);
    int32_t hello = tok_find(v, "\xE2\x96\x81Hello", 8);
    T_CHECK(hello >= 0);
    T_EQ_INT(tok_detok_push(&d, hello, out, 2, &k), CM_EFULL);
    T_EQ_INT(tok_detok_push(&d, hello, out, sizeof out, &k), CM_EFULL); /* 6 bytes * 3 > 8 */
    char big[64];
    T_EQ_INT(tok_detok_push(&d, hello, big, sizeof big, &k), 0);
    T_CHECK(k == 6 && memcmp(big, " Hello", 6) == 0);
    T_EQ_INT(tok_detok_init(NULL, v, 0), CM_EINVAL);
    T_EQ_INT(tok_detok_init(&d, NULL, 0), CM_EINVAL);
    tok_free(v);
}

static void test_bpe(void) {
    tok_vocab *v = load(T_MODELS "vocab/ggml-vocab-gpt-2.gguf");
    T_CHECK(v != NULL);
    if (!v) return;
    T_CHECK(!tok_add_space_prefix(v));
    int32_t ids[256];
    int empty, bad;
    const char *txt = " caf\xC3\xA9 \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 \xE4\xB8\xAD\xE6\x96\x87 ok";
    int n = encode(v, txt, 0, ids, 256);
    T_CHECK(n > 0);
    char *s = stream(v, ids, n, 0, &empty, &bad);
    T_EQ_STR(s, txt); /* byte-level BPE: no space rule */
    T_EQ_INT(bad, 0);
    free(s);
    /* One id at a time, the emoji pieces never leak half a character. */
    tok_detok d;
    tok_detok_init(&d, v, TOK_DETOK_STRIP_LEADING); /* no effect on byte-level BPE */
    char out[256];
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t k;
        T_EQ_INT(tok_detok_push(&d, ids[i], out, sizeof out, &k), 0);
        T_CHECK(utf8_ok(out, k));
        total += k;
    }
    T_EQ_INT(total, strlen(txt));
    tok_free(v);
}

/* The gateway's streaming path: generated ids -> tok_detok -> tok_stop -> SSE chunks. */
static void test_pipeline(void) {
    tok_vocab *v = load(T_MODELS "vocab/ggml-vocab-llama-spm.gguf");
    if (!v) return;
    const char *gen = "Done \xF0\x9F\x98\x80 caf\xC3\xA9\nUser: more text";
    int32_t ids[256];
    int n = encode(v, gen, 0, ids, 256);
    tok_detok d;
    tok_stop s;
    const char *stops[] = {"\nUser:", "###"};
    T_EQ_INT(tok_detok_init(&d, v, TOK_DETOK_SKIP_CONTROL), 0);
    T_EQ_INT(tok_stop_init(&s, stops, NULL, 2), 0);
    char piece[256], out[512], all[512];
    size_t w = 0;
    int hit = -1, hit_at = -1, bad = 0;
    for (int i = 0; i < n && hit < 0; i++) {
        size_t k, m;
        T_EQ_INT(tok_detok_push(&d, ids[i], piece, sizeof piece, &k), 0);
        T_EQ_INT(tok_stop_feed(&s, piece, k, out, sizeof out, &m, &hit), 0);
        if (m && !utf8_ok(out, m)) bad++;
        memcpy(all + w, out, m);
        w += m;
        if (hit >= 0) hit_at = i;
    }
    all[w] = 0;
    T_EQ_STR(all, " Done \xF0\x9F\x98\x80 caf\xC3\xA9");
    T_EQ_INT(hit, 0);
    T_EQ_INT(bad, 0);
    /* the stop is reported on the token that completes "User:", before the rest is generated */
    T_CHECKF(hit_at > 0 && hit_at < n - 1, "hit at %d of %d", hit_at, n);
    tok_free(v);
}

int main(void) {
    test_utf8_repair();
    test_pipeline();
    test_spm();
    test_bpe();
    return t_done();
}
