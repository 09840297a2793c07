/* stop: stop strings across token boundaries, overlapping and nested stops, unicode, limits,
 * and a brute-force cross-check against a whole-text reference on random splits. */
#include "common/cm_err.h"
#include "text/stop.h"
#include "t.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Feeds the pieces (NULL-terminated) and returns the released text; *hit gets the stop
 * index, *hit_piece the piece on which the stop was reported. Also checks that nothing is
 * released after a hit and that every release is a prefix of the final text. */
static char *run(const char *const *stops, int nstops, const char *const *pieces, int *hit, int *hit_piece) {
    tok_stop s;
    T_EQ_INT(tok_stop_init(&s, stops, NULL, nstops), 0);
    static char all[4096];
    size_t w = 0;
    *hit = -1;
    *hit_piece = -1;
    for (int i = 0; pieces[i]; i++) {
        char out[1024];
        size_t n;
        int h;
        T_EQ_INT(tok_stop_feed(&s, pieces[i], strlen(pieces[i]), out, sizeof out, &n, &h), 0);
        if (*hit >= 0) T_EQ_INT(n, 0);
        memcpy(all + w, out, n);
        w += n;
        if (h >= 0 && *hit < 0) { *hit = h; *hit_piece = i; }
    }
    if (*hit < 0) {
        char out[TOK_STOP_MAX_LEN];
        size_t n;
        T_EQ_INT(tok_stop_flush(&s, out, sizeof out, &n), 0);
        memcpy(all + w, out, n);
        w += n;
    }
    all[w] = 0;
    return all;
}

#define P(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_cases(void) {
    int hit, at;
    /* "ab" in "aab": the first 'a' is released, the second is held until 'b' completes it. */
    {
        const char *st[] = {"ab"};
        tok_stop s;
        tok_stop_init(&s, st, NULL, 1);
        char out[512];
        size_t n;
        int h;
        tok_stop_feed(&s, "a", 1, out, sizeof out, &n, &h);
        T_CHECK(n == 0 && h == -1);
        tok_stop_feed(&s, "a", 1, out, sizeof out, &n, &h);
        T_CHECK(n == 1 && out[0] == 'a' && h == -1); /* held exactly one 'a' */
        tok_stop_feed(&s, "b", 1, out, sizeof out, &n, &h);
        T_CHECK(n == 0 && h == 0);
    }
    const char *ab[] = {"ab"};
    T_EQ_STR(run(ab, 1, P("aab"), &hit, &at), "a");
    T_EQ_INT(hit, 0);
    T_EQ_STR(run(ab, 1, P("xa", "a", "a", "bz", "more"), &hit, &at), "xaa");
    T_EQ_INT(at, 3);
    /* Held text that turns out not to be a stop is released intact. */
    T_EQ_STR(run(ab, 1, P("xa", "c", "a"), &hit, &at), "xaca");
    T_EQ_INT(hit, -1);

    /* Stops that are prefixes of each other: the earliest start wins; same start: shortest. */
    const char *nested[] = {"abc", "ab", "b"};
    T_EQ_STR(run(nested, 3, P("xx", "a", "bc"), &hit, &at), "xx");
    T_EQ_INT(hit, 1); /* "ab" and "abc" both start at 2; "ab" is reported */
    const char *nested2[] = {"abcd", "bc"};
    T_EQ_STR(run(nested2, 2, P("za", "bc", "d"), &hit, &at), "za");
    T_EQ_INT(hit, 1); /* "bc" completes first even though "abcd" started earlier */
    T_EQ_INT(at, 1);
    /* Self-overlapping stop: "aab" inside "aaab". */
    const char *aab[] = {"aab"};
    T_EQ_STR(run(aab, 1, P("a", "a", "a", "b"), &hit, &at), "a");
    T_EQ_INT(hit, 0);

    /* A stop spanning three tokens. */
    const char *user[] = {"\nUser:"};
    T_EQ_STR(run(user, 1, P("Sure.", "\nUs", "er", ": hi"), &hit, &at), "Sure.");
    T_EQ_INT(at, 3);
    /* Multi-byte: a stop made of CJK and emoji, split across bytes of the characters. */
    const char *uni[] = {"\xE7\xB5\x82\xE4\xBA\x86", "\xF0\x9F\x9B\x91"};
    T_EQ_STR(run(uni, 2, P("\xE6\x97\xA5\xE6\x9C\xAC", "\xE7\xB5\x82", "\xE4\xBA\x86!"), &hit, &at), "\xE6\x97\xA5\xE6\x9C\xAC");
    T_EQ_INT(hit, 0);
    T_EQ_STR(run(uni, 2, P("ok ", "\xF0\x9F", "\x9B", "\x91", "tail"), &hit, &at), "ok ");
    T_EQ_INT(hit, 1);
    /* A character sharing a lead byte with the stop is released whole once it differs. */
    T_EQ_STR(run(uni, 2, P("\xE7\xB5\x82", "\xE5\xB0\x8F"), &hit, &at), "\xE7\xB5\x82\xE5\xB0\x8F");
    T_EQ_INT(hit, -1);
    /* Match inside one piece, text before it in the same piece. */
    T_EQ_STR(run(user, 1, P("a\nUser: b"), &hit, &at), "a");
    /* No stops: everything passes. */
    T_EQ_STR(run(NULL, 0, P("a", "b"), &hit, &at), "ab");
    /* Feed after a hit releases nothing. */
    T_EQ_STR(run(ab, 1, P("ab", "cd", "ab"), &hit, &at), "");
    /* A long piece (> TOK_STOP_MAX_LEN) with the stop prefix at its end. */
    static char longp[1000];
    memset(longp, 'x', 600);
    memcpy(longp + 600, "\nUse", 5);
    T_EQ_INT(strlen(run(user, 1, P(longp, "r:"), &hit, &at)), 600);
    T_CHECK(hit == 0 && at == 1);
    T_EQ_INT(strlen(run(user, 1, P(longp, "r!"), &hit, &at)), 606);
    memset(longp, 'y', 400);
    memcpy(longp + 400, "\nUser:", 7);
    T_EQ_INT(strlen(run(user, 1, P("\nU", longp), &hit, &at)), 402);
}

static void test_limits(void) {
    tok_stop s;
    const char *many[TOK_STOP_MAX + 1];
    for (int i = 0; i <= TOK_STOP_MAX; i++) many[i] = "x";
    T_EQ_INT(tok_stop_init(&s, many, NULL, TOK_STOP_MAX), 0);
    T_EQ_INT(tok_stop_init(&s, many, NULL, TOK_STOP_MAX + 1), CM_ERANGE);
    char big[TOK_STOP_MAX_LEN + 2];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *b[] = {big};
    T_EQ_INT(tok_stop_init(&s, b, NULL, 1), CM_ETOOBIG);
    size_t l = TOK_STOP_MAX_LEN;
    T_EQ_INT(tok_stop_init(&s, b, &l, 1), 0);
    const char *e[] = {""};
    T_EQ_INT(tok_stop_init(&s, e, NULL, 1), CM_EINVAL);
    const char *bad[] = {"\xC3"};
    T_EQ_INT(tok_stop_init(&s, bad, NULL, 1), CM_EUTF8);
    T_EQ_INT(tok_stop_init(NULL, e, NULL, 1), CM_EINVAL);
    const char *ok[] = {"stop"};
    tok_stop_init(&s, ok, NULL, 1);
    char out[TOK_STOP_MAX_LEN + 4];
    size_t n;
    int h;
    T_EQ_INT(tok_stop_feed(&s, "abcdef", 6, out, TOK_STOP_MAX_LEN + 5, &n, &h), CM_EFULL);
    T_EQ_INT(tok_stop_feed(&s, "abcd", 4, out, sizeof out, &n, &h), 0);
    /* Stop of the maximum length, held over many pieces. */
    T_EQ_INT(tok_stop_init(&s, b, &l, 1), 0);
    size_t rel = 0;
    for (size_t i = 0; i < TOK_STOP_MAX_LEN; i++) {
        T_EQ_INT(tok_stop_feed(&s, "q", 1, out, sizeof out, &n, &h), 0);
        rel += n;
    }
    T_CHECK(rel == 0 && h == 0);
}

/* Random texts over a tiny alphabet, random stops and random splits, against a direct
 * reference of the rule in stop.h. */
static void test_random(void) {
    uint64_t x = 0x9E3779B97F4A7C15ull;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    int mismatches = 0, trials = 3000;
    for (int t = 0; t < trials; t++) {
        char text[64], stops[4][8];
        const char *sp[4];
        int ns = 1 + (int)(RND() % 4), tl = (int)(RND() % 40);
        for (int i = 0; i < tl; i++) text[i] = "abc"[RND() % 3];
        text[tl] = 0;
        for (int i = 0; i < ns; i++) {
            int l = 1 + (int)(RND() % 5);
            for (int j = 0; j < l; j++) stops[i][j] = "abc"[RND() % 3];
            stops[i][l] = 0;
            sp[i] = stops[i];
        }
        /* split points first, then the reference: at each piece boundary B, the stops that
         * have ended by B are known; the earliest start among them is the cut. */
        int bounds[64], nb = 0;
        for (int i = 0; i < tl;) {
            int k = 1 + (int)(RND() % 4);
            if (i + k > tl) k = tl - i;
            i += k;
            bounds[nb++] = i;
        }
        size_t cut = (size_t)tl;
        for (int b = 0; b < nb && cut == (size_t)tl; b++) {
            for (int i = 0; i < ns; i++) {
                size_t l = strlen(stops[i]);
                for (size_t p = 0; p + l <= (size_t)bounds[b]; p++)
                    if (!memcmp(text + p, stops[i], l) && p < cut) { cut = p; break; }
            }
        }
        tok_stop s;
        tok_stop_init(&s, sp, NULL, ns);
        char got[128];
        size_t w = 0, n;
        int h = -1;
        for (int b = 0, i = 0; b < nb; i = bounds[b++]) {
            char out[TOK_STOP_MAX_LEN + 8];
            tok_stop_feed(&s, text + i, (size_t)(bounds[b] - i), out, sizeof out, &n, &h);
            memcpy(got + w, out, n);
            w += n;
        }
        char out[TOK_STOP_MAX_LEN];
        tok_stop_flush(&s, out, sizeof out, &n);
        memcpy(got + w, out, n);
        w += n;
        int expect_hit = cut < (size_t)tl;
        if (w != cut || memcmp(got, text, cut) != 0 || (h >= 0) != expect_hit) {
            if (mismatches++ < 5) fprintf(stderr, "text %s: got %zu bytes, want %zu\n", text, w, cut);
        }
    }
    T_EQ_INT(mismatches, 0);
}

int main(void) {
    test_cases();
    test_limits();
    test_random();
    return t_done();
}
