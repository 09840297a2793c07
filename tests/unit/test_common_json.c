/* cm_json: values, escapes, strictness, limits, and every truncation of a valid document. */
#include "common/cm_err.h"
#include "common/cm_json.h"
#include "t.h"

#include <locale.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int parse_ok(const char *s) {
    cm_json_doc *d;
    char err[128];
    int rc = cm_json_parse(s, strlen(s), &d, err, sizeof err);
    cm_json_free(d);
    return rc;
}

static int parse_err(const char *s, char *err, size_t errlen) {
    cm_json_doc *d;
    int rc = cm_json_parse(s, strlen(s), &d, err, errlen);
    if (!rc) cm_json_free(d);
    return rc;
}

int main(void) {
    char err[128];
    cm_json_doc *d;
    const char *cfg =
        "{\n  \"model_type\": \"llama\", \"hidden_size\": 4096, \"rms_norm_eps\": 1e-05,\n"
        "  \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"head_dim\": null,\n"
        "  \"neg\": -17, \"big\": 9007199254740993, \"f\": 4096.0, \"frac\": 0.5,\n"
        "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0},\n"
        "  \"arr\": [1, [2, 3], {\"x\": true}, \"s\", null, -0.0e+1],\n"
        "  \"esc\": \"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\u4e2d\\ud83d\\ude00\",\n"
        "  \"utf8\": \"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\", \"nul\": \"a\\u0000b\", \"\": 1\n}\n";
    T_EQ_INT(cm_json_parse(cfg, strlen(cfg), &d, err, sizeof err), 0);
    const cm_json *r = cm_json_root(d);
    T_EQ_INT(r->type, CM_JSON_OBJECT);
    T_EQ_INT(r->n, 16);
    const char *s = NULL;
    int64_t i = 0;
    double x = 0;
    int b = -1;
    T_EQ_INT(cm_json_get_str(r, "model_type", &s), 0);
    T_EQ_STR(s, "llama");
    T_EQ_INT(cm_json_get_int(r, "hidden_size", &i), 0);
    T_EQ_INT(i, 4096);
    T_EQ_INT(cm_json_get_num(r, "rms_norm_eps", &x), 0);
    T_NEAR(x, 1e-5, 1e-12);
    T_EQ_INT(cm_json_get_int(r, "rms_norm_eps", &i), CM_EFORMAT);
    T_EQ_INT(cm_json_get_int(r, "f", &i), 0);
    T_EQ_INT(i, 4096);
    T_EQ_INT(cm_json_get_int(r, "frac", &i), CM_EFORMAT);
    T_EQ_INT(cm_json_get_int(r, "neg", &i), 0);
    T_EQ_INT(i, -17);
    T_EQ_INT(cm_json_get_int(r, "big", &i), 0);
    T_EQ_INT(i, 9007199254740993LL); /* exact beyond double precision */
    T_EQ_INT(cm_json_get_bool(r, "tie_word_embeddings", &b), 0);
    T_EQ_INT(b, 0);
    T_EQ_INT(cm_json_get_int(r, "head_dim", &i), CM_ENOTFOUND); /* null counts as absent */
    T_EQ_INT(cm_json_get_int(r, "nope", &i), CM_ENOTFOUND);
    T_EQ_INT(cm_json_get_str(r, "hidden_size", &s), CM_EFORMAT);
    T_EQ_INT(cm_json_get_bool(r, "model_type", &b), CM_EFORMAT);
    const cm_json *rs = cm_json_get(r, "rope_scaling");
    T_CHECK(rs && rs->type == CM_JSON_OBJECT);
    T_EQ_INT(cm_json_get_str(rs, "rope_type", &s), 0);
    T_EQ_STR(s, "llama3");
    const cm_json *arr = cm_json_get(r, "arr");
    T_CHECK(arr && arr->type == CM_JSON_ARRAY && arr->n == 6);
    T_EQ_INT(cm_json_at(arr, 0)->i, 1);
    T_EQ_INT(cm_json_at(cm_json_at(arr, 1), 1)->i, 3);
    T_EQ_INT(cm_json_get(cm_json_at(arr, 2), "x")->boolean, 1);
    T_EQ_STR(cm_json_at(arr, 3)->str, "s");
    T_EQ_INT(cm_json_at(arr, 4)->type, CM_JSON_NULL);
    T_CHECK(cm_json_at(arr, 5)->num == 0.0 && !cm_json_at(arr, 5)->is_int);
    T_CHECK(cm_json_at(arr, 6) == NULL);
    T_CHECK(cm_json_at(r, 0) == NULL);
    T_CHECK(cm_json_get(arr, "x") == NULL);
    T_EQ_INT(cm_json_get_str(r, "esc", &s), 0);
    T_EQ_STR(s, "a\"b\\c/d\b\f\n\r\t\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
    T_EQ_INT(cm_json_get_str(r, "utf8", &s), 0);
    T_EQ_STR(s, "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80");
    const cm_json *nul = cm_json_get(r, "nul");
    T_CHECK(nul && nul->str_len == 3 && !memcmp(nul->str, "a\0b", 3));
    T_CHECK(cm_json_get(r, "") != NULL);
    /* Children keep document order and keys. */
    T_EQ_STR(r->child->key, "model_type");
    size_t count = 0;
    for (const cm_json *c = r->child; c; c = c->next) count++;
    T_EQ_INT(count, r->n);
    cm_json_free(d);

    /* Scalars at the top level, whitespace around. */
    T_EQ_INT(parse_ok(" 42 "), 0);
    T_EQ_INT(parse_ok("\"x\""), 0);
    T_EQ_INT(parse_ok("null"), 0);
    T_EQ_INT(parse_ok("[]"), 0);
    T_EQ_INT(parse_ok("{}"), 0);
    T_EQ_INT(parse_ok("-0"), 0);
    T_EQ_INT(parse_ok("1E+2"), 0);
    cm_json_free(NULL);

    /* Strictness: each must fail with CM_EFORMAT and a message. */
    static const char *const bad[] = {
        "", " ", "{", "}", "[1,]", "{\"a\":1,}", "[1 2]", "{\"a\" 1}", "{a:1}", "{'a':1}", "01", "1.", ".5", "-",
        "1e", "1e+", "+1", "NaN", "Infinity", "-Infinity", "tru", "nul", "truex", "[1]]", "{} {}", "\"abc",
        "\"a\nb\"", "\"\\x\"", "\"\\u12\"", "\"\\u12G4\"", "\"\\ud800\"", "\"\\ud800\\u0041\"", "\"\\udc00\"",
        "\"\xff\"", "\"\xc0\xaf\"", "\"\xe0\x80\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xc3\"",
        "1e999", "-1e999", "[\"a\"/*c*/]", "// c\n1", "\"\\\"", "{\"a\":}", "[,1]", "{,}", "[1,,2]", "\x01",
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        err[0] = 0;
        int rc = parse_err(bad[k], err, sizeof err);
        T_CHECKF(rc == CM_EFORMAT && err[0], "input %zu '%s' gave %d '%s'", k, bad[k], rc, err);
    }
    /* Position in the message. */
    parse_err("{\n  \"a\": 1,\n  \"b\" 2\n}", err, sizeof err);
    T_CHECKF(strstr(err, "line 3") != NULL, "%s", err);

    /* Depth cap: 64 levels fine, 65 refused (no stack overflow on a million). */
    char deep[200];
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    deep[128] = 0;
    T_EQ_INT(parse_ok(deep), 0);
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    deep[130] = 0;
    T_EQ_INT(parse_err(deep, err, sizeof err), CM_EFORMAT);
    size_t big = 1000000;
    char *many = malloc(big + 1);
    memset(many, '[', big);
    many[big] = 0;
    T_EQ_INT(parse_err(many, err, sizeof err), CM_EFORMAT);
    /* Node cap: a flat array of 1.5M zeros is refused with CM_ETOOBIG, not eaten. */
    size_t nz = 1500000;
    char *flat = malloc(nz * 2 + 2);
    flat[0] = '[';
    for (size_t k = 0; k < nz; k++) { flat[1 + 2 * k] = '0'; flat[2 + 2 * k] = ','; }
    flat[nz * 2] = ']';
    flat[nz * 2 + 1] = 0;
    T_EQ_INT(parse_err(flat, err, sizeof err), CM_ETOOBIG);
    free(flat);
    free(many);

    /* Not NUL-terminated input: the parser reads only len bytes. */
    char exact[4] = { '[', '7', ']', 'x' };
    T_EQ_INT(cm_json_parse(exact, 3, &d, err, sizeof err), 0);
    T_EQ_INT(cm_json_at(cm_json_root(d), 0)->i, 7);
    cm_json_free(d);

    /* Every strict prefix of a valid document fails cleanly (prefixes that are themselves a
     * complete value, e.g. a bare number cut short, cannot occur for an object). */
    size_t n = strlen(cfg);
    int bad_prefix = 0;
    for (size_t k = 0; k < n; k++) {
        char *cp = malloc(k ? k : 1); /* exact size: ASan catches any read past len */
        memcpy(cp, cfg, k);
        int rc = cm_json_parse(cp, k, &d, err, sizeof err);
        /* The only complete prefix is the document minus its trailing newline. */
        if (k == n - 1) bad_prefix += rc != 0;
        else bad_prefix += rc != CM_EFORMAT;
        if (!rc) cm_json_free(d);
        free(cp);
    }
    T_EQ_INT(bad_prefix, 0);

    /* Random byte mutations never crash or read past len (ASan build): the result is either a
     * document or CM_EFORMAT with a message. */
    uint32_t rng = 12345;
    int odd = 0;
    char *mut = malloc(n);
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(mut, cfg, n);
        for (int k = 0; k < 1 + iter % 4; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t at = (rng >> 8) % n;
            rng = rng * 1664525u + 1013904223u;
            static const char pool[] = "{}[]\",:\"\\u0aZ-+.eE \x80\xff\x01";
            mut[at] = (rng >> 24) % 3 ? pool[(rng >> 8) % (sizeof pool - 1)] : (char)(rng >> 16);
        }
        err[0] = 0;
        int rc = cm_json_parse(mut, n, &d, err, sizeof err);
        if (rc == 0) cm_json_free(d);
        else odd += rc != CM_EFORMAT || !err[0];
    }
    free(mut);
    T_EQ_INT(odd, 0);

    /* A decimal point is a point whatever the locale (if a comma locale is installed). */
    if (setlocale(LC_NUMERIC, "de_DE.UTF-8") || setlocale(LC_NUMERIC, "fr_FR.UTF-8")) {
        T_EQ_INT(cm_json_parse("2.5", 3, &d, err, sizeof err), 0);
        T_CHECK(cm_json_root(d)->num == 2.5);
        cm_json_free(d);
        setlocale(LC_NUMERIC, "C");
    }
    return t_done();
}
