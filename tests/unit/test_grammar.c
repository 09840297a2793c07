/* test_grammar: constrained decoding — the GBNF and JSON Schema compilers (text/grammar.h) and
 * the executor's mask engine (executor/grammar.h), against an independent, naive reference
 * matcher: every keyword's valid and invalid documents, random documents valid under a schema
 * accepted token by token through real tokenizers, masks equal to a brute-force check of every
 * token of the vocabulary along random walks, errors that name the problem, compaction, and the
 * compile time of a 50-property schema. */
#include "t.h"

#include <stdlib.h>

#include "common/cm_err.h"
#include "common/cm_json.h"
#include "common/cm_time.h"
#include "executor/grammar.h"
#include "text/grammar.h"
#include "text/tok.h"

/* ============================================================================================
 * The reference matcher: explicit stacks of positions, no sharing, no memo.
 * ========================================================================================== */

typedef struct rprog { uint32_t n_classes, n_rules, n_elems, root; const uint32_t *cls, *rs, *el; } rprog;
#define RDEPTH 48
typedef struct rstk { int n; uint32_t s[RDEPTH]; } rstk;
typedef struct rset { int n, cap, accept; rstk *v; } rset;

static void rprog_of(const uint32_t *w, rprog *p) {
    p->n_classes = w[2], p->n_rules = w[3], p->n_elems = w[4], p->root = w[5];
    p->cls = w + 6;
    p->rs = p->cls + 8 * p->n_classes;
    p->el = p->rs + p->n_rules;
}

static void rset_add(rset *o, const rstk *st) {
    for (int i = 0; i < o->n; i++)
        if (o->v[i].n == st->n && !memcmp(o->v[i].s, st->s, sizeof(uint32_t) * (size_t)st->n)) return;
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 8;
        o->v = realloc(o->v, sizeof(rstk) * (size_t)o->cap);
    }
    o->v[o->n++] = *st;
}

static void r_expand(const rprog *p, rstk st, rset *o, int guard) {
    if (guard > 400) return;
    if (st.n == 0) { o->accept = 1; return; }
    uint32_t pos = st.s[st.n - 1], e = p->el[pos], k = EX_GE_KIND(e);
    if (k == EX_GE_END) {
        st.n--;
        if (st.n == 0) { o->accept = 1; return; }
        r_expand(p, st, o, guard + 1);
    } else if (k == EX_GE_CLASS || k == EX_GE_TOKEN) {
        rset_add(o, &st);
    } else if (k == EX_GE_REF) {
        uint32_t cont = pos + 1;
        st.s[st.n - 1] = cont;
        if (EX_GE_KIND(p->el[cont]) == EX_GE_END) st.n--;
        uint32_t r = EX_GE_ARG(e), q = p->rs[r];
        for (;;) { /* each alternative */
            rstk s2 = st;
            if (s2.n == RDEPTH) return;
            s2.s[s2.n++] = q;
            r_expand(p, s2, o, guard + 1);
            while (EX_GE_KIND(p->el[q]) != EX_GE_END) q++;
            q++;
            if (EX_GE_KIND(p->el[q]) == EX_GE_RULE_END) break;
        }
    }
}

static void r_init(const rprog *p, rset *o) {
    memset(o, 0, sizeof *o);
    rstk st = { 0 };
    st.n = 1;
    uint32_t q = p->rs[p->root];
    for (;;) {
        st.s[0] = q;
        r_expand(p, st, o, 0);
        while (EX_GE_KIND(p->el[q]) != EX_GE_END) q++;
        q++;
        if (EX_GE_KIND(p->el[q]) == EX_GE_RULE_END) break;
    }
}

static void r_byte(const rprog *p, const rset *in, uint8_t b, rset *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < in->n; i++) {
        rstk st = in->v[i];
        uint32_t e = p->el[st.s[st.n - 1]];
        if (EX_GE_KIND(e) != EX_GE_CLASS || !((p->cls[8 * EX_GE_ARG(e) + (b >> 5)] >> (b & 31)) & 1)) continue;
        st.s[st.n - 1]++;
        r_expand(p, st, o, 0);
    }
}

static void r_special(const rprog *p, const rset *in, int32_t t, rset *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < in->n; i++) {
        rstk st = in->v[i];
        uint32_t e = p->el[st.s[st.n - 1]];
        if (EX_GE_KIND(e) != EX_GE_TOKEN || EX_GE_ARG(e) != (uint32_t)t) continue;
        st.s[st.n - 1]++;
        r_expand(p, st, o, 0);
    }
}

static void rset_free(rset *s) { free(s->v); memset(s, 0, sizeof *s); }

static void rset_copy(rset *dst, const rset *src) {
    dst->n = dst->cap = src->n;
    dst->accept = src->accept;
    dst->v = malloc(sizeof(rstk) * (size_t)(src->n ? src->n : 1));
    if (src->n) memcpy(dst->v, src->v, sizeof(rstk) * (size_t)src->n);
}

/* The reference state after bytes s[0..n): 1 when they are a valid prefix. */
static int r_walk(const rprog *p, const rset *st, const uint8_t *s, size_t n, rset *out) {
    rset cur;
    rset_copy(&cur, st);
    for (size_t i = 0; i < n && (cur.n || cur.accept); i++) {
        rset nx;
        r_byte(p, &cur, s[i], &nx);
        rset_free(&cur);
        cur = nx;
    }
    int ok = cur.n || cur.accept;
    if (out) *out = cur;
    else rset_free(&cur);
    return ok;
}

/* ============================================================================================
 * Helpers
 * ========================================================================================== */

static uint32_t *compile(const char *gbnf, const tok_vocab *v, size_t *len) {
    char err[256];
    uint32_t *prog;
    if (tok_gram_compile(gbnf, strlen(gbnf), v, &prog, len, err, sizeof err)) {
        fprintf(stderr, "compile failed: %s\n--- grammar:\n%s\n", err, gbnf);
        return NULL;
    }
    return prog;
}

static uint32_t *compile_schema(const char *schema, size_t *len, char *err, size_t errlen) {
    tok_gbnf d;
    tok_gbnf_init(&d);
    uint32_t *prog = NULL;
    if (tok_gbnf_schema(&d, "root", schema, strlen(schema), err, errlen) == 0 &&
        tok_gram_compile(d.s, d.len, NULL, &prog, len, err, errlen) != 0) {
        fprintf(stderr, "schema grammar does not compile: %s\n%s\n", err, d.s);
        prog = NULL;
    }
    tok_gbnf_free(&d);
    return prog;
}

/* The byte vocabulary: token b is byte b, token 256 the end. */
static ex_gram_vocab *byte_vocab(void) {
    uint32_t off[258];
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++) { off[i] = (uint32_t)i; bytes[i] = (uint8_t)i; }
    off[256] = off[257] = 256;
    ex_gram_vocab *v;
    return ex_gram_vocab_create(257, 257, off, bytes, &v) ? NULL : v;
}

static ex_gram_vocab *gram_vocab_of(const tok_vocab *tv) {
    uint32_t *off;
    uint8_t *bytes;
    int n;
    if (tok_gram_vocab(tv, &off, &bytes, &n)) return NULL;
    ex_gram_vocab *v = NULL;
    ex_gram_vocab_create(n, n, off, bytes, &v);
    free(off);
    free(bytes);
    return v;
}

/* 1 when the program accepts exactly s (the engine, byte by byte, then the end token), and the
 * reference agrees. */
static int accepts(const uint32_t *prog, size_t plen, const ex_gram_vocab *bv, const char *s) {
    int32_t end = 256;
    ex_gram *g;
    char err[200];
    if (ex_gram_create(prog, plen, bv, &end, 1, &g, err, sizeof err)) { fprintf(stderr, "ex_gram_create: %s\n", err); return -1; }
    ex_gram_state st;
    ex_gram_state_init(g, &st);
    int ok = 1;
    for (size_t i = 0; s[i] && ok; i++) {
        const uint32_t *m;
        ex_gram_mask(g, &st, &m);
        int allowed = ex_gram_mask_test(m, (unsigned char)s[i]);
        ok = ex_gram_advance(g, &st, (unsigned char)s[i]) == 0;
        if (allowed != ok) { fprintf(stderr, "mask and advance disagree at byte %zu of %s\n", i, s); ok = 0; }
    }
    if (ok) {
        const uint32_t *m;
        ex_gram_mask(g, &st, &m);
        ok = ex_gram_mask_test(m, end) && ex_gram_accepting(g, &st) && ex_gram_advance(g, &st, end) == 0;
    }
    ex_gram_destroy(g);
    rprog p;
    rprog_of(prog, &p);
    rset r0, r1;
    r_init(&p, &r0);
    int rok = r_walk(&p, &r0, (const uint8_t *)s, strlen(s), &r1) && r1.accept;
    rset_free(&r0);
    rset_free(&r1);
    if (rok != ok) { fprintf(stderr, "engine %d, reference %d on %s\n", ok, rok, s); return -1; }
    return ok;
}

/* ============================================================================================
 * GBNF
 * ========================================================================================== */

static void test_gbnf(const ex_gram_vocab *bv) {
    static const struct { const char *g; const char *yes[6]; const char *no[6]; } C[] = {
        { "root ::= \"ab\" | \"cd\"", { "ab", "cd" }, { "", "a", "abc", "ad" } },
        { "root ::= [a-c]+", { "a", "abcabc" }, { "", "d", "ad" } },
        { "root ::= [^a-c]*", { "", "xyz", "é€😀" }, { "a", "xa" } },
        { "root ::= x? y\nx ::= \"x\"\ny ::= \"y\"", { "xy", "y" }, { "x", "xxy" } },
        { "root ::= \"a\"{2,3} \"b\"{2} \"c\"{1,}", { "aabbc", "aaabbccc" }, { "abbc", "aaaabbc", "aabc", "aabb" } },
        { "root ::= (\"a\" | \"b\" \"c\")*  # comment\n", { "", "abca", "bcbc" }, { "b", "ac" } },
        { "root ::= .\n", { "a", "é", "😀" }, { "", "ab" } },
        { "root ::= [α-ω] \"\\x41\\u00e9\\n\"", { "βAé\n" }, { "aAé\n", "βAe\n" } },
        { "root ::= \"(\" root \")\" | \"\"", { "", "()", "((()))" }, { "(", "())" } },
        { "root ::=\n  \"a\" |\n  \"b\"", { "a", "b" }, { "ab" } },
        { "root ::= ( \"a\"\n   \"b\" )", { "ab" }, { "a" } },
        { "root ::= [\\]\\-\\\\]", { "]", "-", "\\" }, { "a" } },
        { "root ::= \"a\"{0,2} \"b\"?", { "", "a", "aab", "b" }, { "aaa", "bb" } },
        { "root::=#", { "" }, { "a", "#" } }, /* an empty rule and no classes (fuzz_grammar found a NULL memcpy) */
    };
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
        size_t len;
        uint32_t *prog = compile(C[i].g, NULL, &len);
        T_CHECKF(prog != NULL, "grammar %zu compiles", i);
        if (!prog) continue;
        for (int k = 0; k < 6 && C[i].yes[k]; k++) T_CHECKF(accepts(prog, len, bv, C[i].yes[k]) == 1, "%s accepts '%s'", C[i].g, C[i].yes[k]);
        for (int k = 0; k < 6 && C[i].no[k]; k++) T_CHECKF(accepts(prog, len, bv, C[i].no[k]) == 0, "%s rejects '%s'", C[i].g, C[i].no[k]);
        free(prog);
    }
    /* errors name the problem and the place */
    static const struct { const char *g; const char *msg; } E[] = {
        { "root ::= \"a", "line 1, column 10: unterminated literal" },
        { "root ::= [a-", "unterminated character class" },
        { "root ::= x", "rule 'x' is used but not defined" },
        { "x ::= \"a\"", "no rule 'root'" },
        { "root ::= root \"a\"", "rule 'root' is left-recursive" },
        { "root ::= a\na ::= b? a \"x\"\nb ::= \"b\"", "rule 'a' is left-recursive" },
        { "root ::= \"a\" )", "line 1, column 14: unexpected ')'" },
        { "root ::= (\"a\"", "'(' without its ')'" },
        { "root ::= \"a\"{3,2}", "repetition {3,2}" },
        { "root ::= \"\\q\"", "unknown escape '\\q'" },
        { "root = \"a\"", "expected '::=' after the rule name" },
        { "root ::= \"a\"\nroot ::= \"b\"", "rule 'root' is defined twice" },
        { "root ::= [z-a]", "character range is backwards" },
        { "root ::= <[5]>", "token id 5 is not in the vocabulary" },
        { "root ::= \"\\uD800\"", "no Unicode scalar value" },
    };
    for (size_t i = 0; i < sizeof E / sizeof *E; i++) {
        char err[256] = "";
        uint32_t *prog = NULL;
        size_t len;
        int rc = tok_gram_compile(E[i].g, strlen(E[i].g), NULL, &prog, &len, err, sizeof err);
        T_CHECKF(rc == CM_EINVAL && strstr(err, E[i].msg), "'%s': rc %d, err '%s' (want '%s')", E[i].g, rc, err, E[i].msg);
        free(prog);
    }
    /* the program checker refuses corrupt programs */
    size_t len;
    uint32_t *prog = compile("root ::= \"a\" b\nb ::= \"b\"", NULL, &len);
    char err[200];
    T_CHECK(prog && ex_gram_check(prog, len, err, sizeof err) == 0);
    if (prog) {
        uint32_t *bad = malloc(len);
        memcpy(bad, prog, len);
        bad[5] = 7; /* root out of range */
        T_CHECK(ex_gram_check(bad, len, err, sizeof err) == CM_EFORMAT && strstr(err, "root rule"));
        memcpy(bad, prog, len);
        T_CHECK(ex_gram_check(bad, len - 4, err, sizeof err) == CM_EFORMAT);
        memcpy(bad, prog, len);
        rprog p;
        rprog_of(bad, &p);
        ((uint32_t *)p.el)[1] = EX_GE(EX_GE_REF, 9); /* a reference past the rules */
        T_CHECK(ex_gram_check(bad, len, err, sizeof err) == CM_EFORMAT && strstr(err, "reference to rule 9"));
        memcpy(bad, prog, len);
        ((uint32_t *)p.el)[0] = EX_GE(EX_GE_REF, 0); /* left recursion */
        T_CHECK(ex_gram_check(bad, len, err, sizeof err) == CM_EFORMAT && strstr(err, "left-recursive"));
        free(bad);
        free(prog);
    }
}

/* ============================================================================================
 * JSON Schema: every keyword, valid and invalid documents
 * ========================================================================================== */

static void test_schema_keywords(const ex_gram_vocab *bv) {
    static const struct { const char *schema; const char *yes[8]; const char *no[8]; } C[] = {
        { "{\"type\":\"string\"}", { "\"\"", "\"a b\"", "\"\\\"\\\\\\n\\u00e9\"", "\"é😀\"" }, { "a", "\"a", "\"\n\"", "1", "\"\\x\"" } },
        { "{\"type\":\"integer\"}", { "0", "-12", "1234567890123456" }, { "01", "1.5", "-", "12345678901234567", "\"1\"" } },
        { "{\"type\":\"number\"}", { "0", "-1.5", "2e10", "3.25E-3" }, { ".5", "1.", "1e", "--1" } },
        { "{\"type\":\"boolean\"}", { "true", "false" }, { "True", "1" } },
        { "{\"type\":\"null\"}", { "null" }, { "nul", "\"null\"" } },
        { "{\"type\":[\"string\",\"null\"]}", { "\"x\"", "null" }, { "1" } },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
          { "{\"a\":1}", "{\"a\": 1, \"b\": \"x\"}", "{\n  \"a\": 1,\n  \"b\": \"x\"\n}" },
          { "{}", "{\"b\":\"x\"}", "{\"b\":\"x\",\"a\":1}", "{\"a\":1,\"c\":2}", "{\"a\":1,}" } },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false}",
          { "{}", "{\"a\":5}" }, { "{\"b\":1}" } },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
          { "{}", "{\"a\":5}", "{\"b\":[1,{\"c\":null}]}", "{\"a\":5,\"ab\":\"x\",\"\":1}" }, { "{\"a\":\"x\"}", "{\"a\":1,\"a\":2}" } },
        { "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", { "{}", "{\"x\":1,\"y\":2}" }, { "{\"x\":\"1\"}" } },
        { "{\"enum\":[\"red\",1,null,{\"a\":[true]}]}", { "\"red\"", "1", "null", "{\"a\":[true]}" }, { "\"blue\"", "2", "{\"a\":[false]}" } },
        { "{\"const\":\"only\"}", { "\"only\"" }, { "\"other\"" } },
        { "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}", { "1", "true" }, { "\"x\"" } },
        { "{\"oneOf\":[{\"const\":1},{\"const\":2}]}", { "1", "2" }, { "3" } },
        { "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":\"null\"}},\"required\":[\"b\"]}]}",
          { "{\"a\":1,\"b\":null}" }, { "{\"a\":1}" } },
        { "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/n\"}",
          { "{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}" }, { "{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}" } },
        { "{\"definitions\":{\"x\":{\"type\":\"boolean\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/x\"}}", { "[]", "[true,false]" }, { "[1]" } },
        { "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", { "[1]", "[1, 2, 3]" }, { "[]", "[1,2,3,4]", "[1,]" } },
        { "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}", { "[]", "[\"a\"]", "[\"a\",1]" }, { "[1]", "[\"a\",1,2]" } },
        { "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}],\"items\":{\"type\":\"integer\"},\"minItems\":2}", { "[\"a\",1]", "[\"a\",1,2]" }, { "[\"a\"]", "[1,2]" } },
        { "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", { "\"ab\"", "\"abc\"", "\"éé\"", "\"\\n\\t\"" }, { "\"a\"", "\"abcd\"" } },
        { "{\"type\":\"string\",\"format\":\"date-time\"}", { "\"2024-02-29T13:05:00Z\"", "\"1999-12-31T23:59:59.123+05:30\"" }, { "\"2024-13-01T00:00:00Z\"", "\"2024-01-01 00:00:00Z\"" } },
        { "{\"type\":\"string\",\"format\":\"date\"}", { "\"2024-01-31\"", "\"2024-02-29\"", "\"2000-02-29\"", "\"1999-04-30\"" },
          { "\"2024-1-31\"", "\"2023-02-29\"", "\"1900-02-29\"", "\"2024-04-31\"", "\"0000-01-01\"" } },
        { "{\"type\":\"string\",\"format\":\"time\"}", { "\"23:59:59Z\"" }, { "\"24:00:00Z\"" } },
        { "{\"type\":\"string\",\"format\":\"uuid\"}", { "\"123e4567-e89b-12d3-a456-426614174000\"" }, { "\"123e4567e89b12d3a456426614174000\"" } },
        { "{\"type\":\"string\",\"format\":\"email\"}", { "\"a.b+c@example.com\"" }, { "\"a@b\"", "\"@x.com\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv4\"}", { "\"192.168.0.255\"" }, { "\"256.1.1.1\"", "\"1.2.3\"" } },
        { "{\"type\":\"string\",\"format\":\"ipv6\"}", { "\"::1\"", "\"2001:db8::8a2e:370:7334\"", "\"1:2:3:4:5:6:7:8\"" }, { "\"1:2:3:4:5:6:7:8:9\"", "\":::\"" } },
        { "{\"type\":\"string\",\"format\":\"hostname\"}", { "\"example.com\"", "\"a-b\"" }, { "\"-a\"", "\"a..b\"" } },
        { "{\"type\":\"string\",\"format\":\"duration\"}", { "\"P3Y6M4DT12H30M5S\"", "\"PT5M\"", "\"P2W\"" }, { "\"P\"", "\"PT\"" } },
        { "{\"type\":\"integer\",\"minimum\":-5,\"maximum\":123}", { "-5", "0", "9", "99", "123" }, { "-6", "124", "200", "1000" } },
        { "{\"type\":\"integer\",\"exclusiveMinimum\":10,\"exclusiveMaximum\":100}", { "11", "99" }, { "10", "100" } },
        { "{\"type\":\"integer\",\"minimum\":100}", { "100", "5000", "1234567890123456" }, { "99", "-1" } },
        { "{\"title\":\"t\",\"description\":\"d\",\"default\":1,\"examples\":[1],\"type\":\"integer\"}", { "7" }, { "x" } },
        { "{\"properties\":{\"a\":{\"type\":\"null\"}},\"required\":[\"a\"]}", { "{\"a\":null}" }, { "null" } },
        { "{}", { "1", "{\"a\":[]}", "\"s\"" }, { "", "{" } },
    };
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
        char err[300];
        size_t len;
        uint32_t *prog = compile_schema(C[i].schema, &len, err, sizeof err);
        T_CHECKF(prog != NULL, "schema %s compiles: %s", C[i].schema, prog ? "" : err);
        if (!prog) continue;
        for (int k = 0; k < 8 && C[i].yes[k]; k++) T_CHECKF(accepts(prog, len, bv, C[i].yes[k]) == 1, "%s accepts %s", C[i].schema, C[i].yes[k]);
        for (int k = 0; k < 8 && C[i].no[k]; k++) T_CHECKF(accepts(prog, len, bv, C[i].no[k]) == 0, "%s rejects %s", C[i].schema, C[i].no[k]);
        free(prog);
    }
    /* errors name the keyword and the place */
    static const struct { const char *schema; const char *msg; } E[] = {
        { "{\"type\":\"string\",\"pattern\":\"^a\"}", "keyword 'pattern' is not supported (at #/pattern)" },
        { "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0}}}", "'minimum' is supported on integers only, not on type number (at #/properties/a/minimum)" },
        { "{\"type\":\"strin\"}", "unknown type 'strin'" },
        { "{\"$ref\":\"#/$defs/x\"}", "names no definition" },
        { "{\"$ref\":\"http://x\"}", "only \"#\"" },
        { "{\"type\":\"object\",\"required\":[\"a\"]}", "required property 'a' is not among the properties" },
        { "{\"type\":\"string\",\"format\":\"iri\"}", "string format 'iri' is not supported" },
        { "{\"type\":\"array\",\"uniqueItems\":true}", "keyword 'uniqueItems'" },
        { "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer lies between" },
        { "{\"type\":\"string\",\"maxLength\":-1}", "'maxLength' must be a non-negative integer (at #/maxLength)" },
        { "{\"not\":{}}", "keyword 'not' is not supported" },
        { "{\"type\":", "the schema is not valid JSON" },
        { "false", "accepts nothing" },
    };
    for (size_t i = 0; i < sizeof E / sizeof *E; i++) {
        tok_gbnf d;
        tok_gbnf_init(&d);
        char err[300] = "";
        int rc = tok_gbnf_schema(&d, "root", E[i].schema, strlen(E[i].schema), err, sizeof err);
        T_CHECKF(rc == CM_EINVAL && strstr(err, E[i].msg), "%s: rc %d err '%s' (want '%s')", E[i].schema, rc, err, E[i].msg);
        tok_gbnf_free(&d);
    }
}

/* ============================================================================================
 * Random documents valid under a schema, accepted token by token
 * ========================================================================================== */

static uint64_t rng_s = 0x1234567;
static uint32_t rnd(uint32_t n) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return n ? (uint32_t)(rng_s % n) : 0;
}

typedef struct buf { char *s; size_t n, cap; } buf;
static void put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }
static void sep(buf *b) { static const char *ws[] = { "", " ", "\n  " }; puts_(b, ws[rnd(3)]); }

static void gen_json_string(buf *b, int min, int max) {
    static const char *chars[] = { "a", "Z", " ", "é", "😀", "\\n", "\\\"", "\\\\", "\\u00e9", "1", "{", "," };
    int n = min + (int)rnd((uint32_t)(max - min + 1));
    puts_(b, "\"");
    for (int i = 0; i < n; i++) puts_(b, chars[rnd(sizeof chars / sizeof *chars)]);
    puts_(b, "\"");
}

static const cm_json *g_root;

static void gen_value(buf *b, const cm_json *s, int depth);

static void gen_any(buf *b, int depth) {
    switch (depth > 2 ? rnd(4) : rnd(6)) {
    case 0: gen_json_string(b, 0, 4); break;
    case 1: puts_(b, rnd(2) ? "-12" : "3.5e2"); break;
    case 2: puts_(b, "true"); break;
    case 3: puts_(b, "null"); break;
    case 4: puts_(b, "["); gen_any(b, depth + 1); puts_(b, ","); sep(b); gen_any(b, depth + 1); puts_(b, "]"); break;
    default: puts_(b, "{\"k\":"); sep(b); gen_any(b, depth + 1); puts_(b, "}"); break;
    }
}

static void gen_value(buf *b, const cm_json *s, int depth) {
    const cm_json *v;
    if ((v = cm_json_get(s, "$ref"))) {
        const cm_json *defs = cm_json_get(g_root, "$defs");
        gen_value(b, strcmp(v->str, "#") ? cm_json_get(defs, v->str + 8) : g_root, depth + 1);
        return;
    }
    if ((v = cm_json_get(s, "const"))) { gen_value(b, v, depth); return; }
    if (s->type != CM_JSON_OBJECT) { /* a literal value (enum / const member) */
        if (s->type == CM_JSON_STRING) { puts_(b, "\""); puts_(b, s->str); puts_(b, "\""); }
        else if (s->type == CM_JSON_NUMBER) { char t[32]; snprintf(t, sizeof t, "%lld", (long long)s->i); puts_(b, t); }
        else if (s->type == CM_JSON_BOOL) puts_(b, s->boolean ? "true" : "false");
        else puts_(b, "null");
        return;
    }
    if ((v = cm_json_get(s, "enum"))) { gen_value(b, cm_json_at(v, rnd((uint32_t)v->n)), depth); return; }
    if ((v = cm_json_get(s, "anyOf"))) { gen_value(b, cm_json_at(v, depth > 3 ? v->n - 1 : rnd((uint32_t)v->n)), depth + 1); return; }
    const cm_json *t = cm_json_get(s, "type");
    const char *ty = !t ? "any" : t->type == CM_JSON_STRING ? t->str : cm_json_at(t, rnd((uint32_t)t->n))->str;
    if (!strcmp(ty, "string")) {
        const char *f = NULL;
        cm_json_get_str(s, "format", &f);
        int64_t mn = 0, mx = 8;
        cm_json_get_int(s, "minLength", &mn);
        cm_json_get_int(s, "maxLength", &mx);
        if (f && !strcmp(f, "date-time")) puts_(b, "\"2031-07-09T08:15:30.5-03:00\"");
        else if (f && !strcmp(f, "uuid")) puts_(b, "\"0f8fad5b-d9cb-469f-a165-70867728950e\"");
        else if (f && !strcmp(f, "email")) puts_(b, "\"jane.doe@mail.example.org\"");
        else gen_json_string(b, (int)mn, (int)mx);
    } else if (!strcmp(ty, "integer")) {
        int64_t lo = -1000, hi = 1000;
        cm_json_get_int(s, "minimum", &lo);
        cm_json_get_int(s, "maximum", &hi);
        char x[32];
        snprintf(x, sizeof x, "%lld", (long long)(lo + (int64_t)rnd((uint32_t)(hi - lo + 1))));
        puts_(b, x);
    } else if (!strcmp(ty, "number")) {
        static const char *nums[] = { "0", "-0.25", "1e3", "12.5E-2", "7" };
        puts_(b, nums[rnd(5)]);
    } else if (!strcmp(ty, "boolean")) puts_(b, rnd(2) ? "true" : "false");
    else if (!strcmp(ty, "null")) puts_(b, "null");
    else if (!strcmp(ty, "array")) {
        int64_t mn = 0, mx = 4;
        cm_json_get_int(s, "minItems", &mn);
        cm_json_get_int(s, "maxItems", &mx);
        int n = (int)(mn + rnd((uint32_t)(mx - mn + 1)));
        const cm_json *items = cm_json_get(s, "items");
        puts_(b, "[");
        sep(b);
        for (int i = 0; i < n; i++) {
            if (i) { puts_(b, ","); sep(b); }
            if (items) gen_value(b, items, depth + 1);
            else gen_any(b, depth + 1);
        }
        if (n) sep(b); /* one run of whitespace in an empty array */
        puts_(b, "]");
    } else if (!strcmp(ty, "object")) {
        const cm_json *props = cm_json_get(s, "properties"), *req = cm_json_get(s, "required");
        puts_(b, "{");
        sep(b);
        int first = 1;
        /* required first (schema order), then optional ones at random */
        for (int pass = 0; pass < 2; pass++)
            for (const cm_json *p = props ? props->child : NULL; p; p = p->next) {
                int is_req = 0;
                for (const cm_json *r = req ? req->child : NULL; r; r = r->next) is_req |= !strcmp(r->str, p->key);
                if (is_req != (pass == 0) || (!is_req && rnd(2))) continue;
                if (!first) { puts_(b, ","); sep(b); }
                first = 0;
                puts_(b, "\"");
                puts_(b, p->key);
                puts_(b, "\":");
                sep(b);
                gen_value(b, p, depth + 1);
            }
        if (!first) sep(b);
        puts_(b, "}");
    } else {
        gen_any(b, depth);
    }
}

/* Advances a fresh state over the tokens of text, checking every token against the mask. */
static int tokens_accept(ex_gram *g, const tok_vocab *tv, const char *text, int32_t end) {
    int32_t ids[4096];
    int n;
    if (tok_encode(tv, text, strlen(text), 0, 0, ids, 4096, &n)) return -1;
    ex_gram_state st;
    ex_gram_state_init(g, &st);
    for (int i = 0; i < n; i++) {
        const uint32_t *m;
        if (ex_gram_mask(g, &st, &m) || !ex_gram_mask_test(m, ids[i])) {
            fprintf(stderr, "token %d (%d, '%s') of %s not in the mask\n", i, ids[i], tok_text(tv, ids[i]), text);
            return 0;
        }
        if (ex_gram_advance(g, &st, ids[i])) return 0;
    }
    const uint32_t *m;
    ex_gram_mask(g, &st, &m);
    return ex_gram_mask_test(m, end) && ex_gram_accepting(g, &st);
}

static const char *const RANDOM_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"},"
    "\"when\":{\"type\":\"string\",\"format\":\"date-time\"},\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"score\":{\"type\":[\"number\",\"null\"]}},"
    "\"required\":[\"name\",\"age\",\"tags\"]}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{\"type\":\"number\"}},\"required\":[\"kind\",\"r\"]},"
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"square\"},\"side\":{\"type\":\"integer\"},\"email\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"kind\"]}]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":5}},\"additionalProperties\":true},\"minItems\":1,\"maxItems\":3}",
};

static void test_random_documents(const tok_vocab *tv) {
    ex_gram_vocab *gv = gram_vocab_of(tv);
    T_CHECK(gv != NULL);
    if (!gv) return;
    int32_t end = tok_eos(tv) >= 0 ? tok_eos(tv) : 0;
    for (size_t i = 0; i < sizeof RANDOM_SCHEMAS / sizeof *RANDOM_SCHEMAS; i++) {
        char err[300];
        size_t len;
        uint32_t *prog = compile_schema(RANDOM_SCHEMAS[i], &len, err, sizeof err);
        T_CHECKF(prog != NULL, "schema %zu: %s", i, err);
        if (!prog) continue;
        ex_gram *g;
        T_CHECK(ex_gram_create(prog, len, gv, &end, 1, &g, err, sizeof err) == 0);
        cm_json_doc *doc;
        cm_json_parse(RANDOM_SCHEMAS[i], strlen(RANDOM_SCHEMAS[i]), &doc, err, sizeof err);
        g_root = cm_json_root(doc);
        int good = 0, total = 40;
        for (int k = 0; k < total; k++) {
            buf b = { 0 };
            gen_value(&b, g_root, 0);
            int ok = tokens_accept(g, tv, b.s, end);
            good += ok == 1;
            if (ok != 1) fprintf(stderr, "schema %zu rejects a valid document: %s\n", i, b.s);
            free(b.s);
        }
        T_CHECKF(good == total, "schema %zu: %d of %d random valid documents accepted token by token", i, good, total);
        cm_json_free(doc);
        ex_gram_destroy(g);
        free(prog);
    }
    ex_gram_vocab_destroy(gv);
}

/* ============================================================================================
 * Masks against brute force over the whole vocabulary, along random walks
 * ========================================================================================== */

static void test_masks_brute_force(const tok_vocab *tv, const char *what) {
    ex_gram_vocab *gv = gram_vocab_of(tv);
    T_CHECK(gv != NULL);
    if (!gv) return;
    int nv = ex_gram_vocab_n(gv);
    int32_t end = tok_eos(tv);
    /* a grammar with special-token elements: the id of the vocabulary's BOS as a marker */
    char tokgram[256];
    snprintf(tokgram, sizeof tokgram, "root ::= <[%d]> \"x\" | \"{\" [a-z]+ \"}\" <[%d]>?", tok_bos(tv), tok_bos(tv));
    const char *grammars[] = { NULL /* json object */, NULL /* schema 0 */, NULL /* schema 2 */, tokgram,
                               "root ::= ( \"ab\" | \"a\" )* \"c\" [^c]{0,3}" };
    tok_gbnf docs[3];
    for (int k = 0; k < 3; k++) tok_gbnf_init(&docs[k]);
    char err[300];
    tok_gbnf_json(&docs[0], "root", 1);
    tok_gbnf_schema(&docs[1], "root", RANDOM_SCHEMAS[0], strlen(RANDOM_SCHEMAS[0]), err, sizeof err);
    tok_gbnf_schema(&docs[2], "root", RANDOM_SCHEMAS[2], strlen(RANDOM_SCHEMAS[2]), err, sizeof err);
    for (int k = 0; k < 3; k++) grammars[k] = docs[k].s;
    uint32_t *off;
    uint8_t *bytes;
    int n;
    tok_gram_vocab(tv, &off, &bytes, &n);
    int mismatches = 0, checked = 0;
    for (size_t gi = 0; gi < sizeof grammars / sizeof *grammars; gi++) {
        size_t len;
        uint32_t *prog = compile(grammars[gi], tv, &len);
        T_CHECKF(prog != NULL, "%s: grammar %zu compiles", what, gi);
        if (!prog) continue;
        ex_gram *g;
        T_CHECK(ex_gram_create(prog, len, gv, &end, 1, &g, err, sizeof err) == 0);
        rprog p;
        rprog_of(prog, &p);
        for (int walk = 0; walk < 2; walk++) {
            ex_gram_state st;
            ex_gram_state_init(g, &st);
            rset ref;
            r_init(&p, &ref);
            for (int step = 0; step < 12; step++) {
                const uint32_t *m;
                T_CHECK(ex_gram_mask(g, &st, &m) == 0);
                int32_t allowed[1 << 16];
                int n_allowed = 0;
                for (int t = 0; t < nv; t++) {
                    int want;
                    uint32_t tl = off[t + 1] - off[t];
                    if (t == end) want = ref.accept;
                    else if (tl) want = r_walk(&p, &ref, bytes + off[t], tl, NULL);
                    else { rset o; r_special(&p, &ref, t, &o); want = o.n || o.accept; rset_free(&o); }
                    /* a token with bytes may also be named by a token element */
                    if (!want && tl) { rset o; r_special(&p, &ref, t, &o); want = o.n || o.accept; rset_free(&o); }
                    int got = ex_gram_mask_test(m, t);
                    checked++;
                    if (got != want && mismatches++ < 10)
                        fprintf(stderr, "%s grammar %zu step %d: token %d '%s' engine %d brute force %d\n", what, gi, step, t,
                                tok_text(tv, t), got, want);
                    if (got && n_allowed < (1 << 16)) allowed[n_allowed++] = t;
                }
                if (!n_allowed) break;
                /* next token: prefer non-end tokens so the walk goes somewhere */
                int32_t tk = allowed[rnd((uint32_t)n_allowed)];
                if (tk == end && n_allowed > 1) tk = allowed[(rnd((uint32_t)n_allowed - 1) + 1) % n_allowed];
                if (tk == end) break;
                T_CHECK(ex_gram_advance(g, &st, tk) == 0);
                uint32_t tl = off[tk + 1] - off[tk];
                rset nx = { 0 }, sp;
                if (tl) r_walk(&p, &ref, bytes + off[tk], tl, &nx);
                r_special(&p, &ref, tk, &sp);
                for (int i = 0; i < sp.n; i++) rset_add(&nx, &sp.v[i]);
                nx.accept |= sp.accept;
                rset_free(&sp);
                rset_free(&ref);
                ref = nx;
            }
            rset_free(&ref);
        }
        ex_gram_destroy(g);
        free(prog);
    }
    T_CHECKF(mismatches == 0, "%s: %d of %d mask bits differ from brute force", what, mismatches, checked);
    for (int k = 0; k < 3; k++) tok_gbnf_free(&docs[k]);
    free(off);
    free(bytes);
    ex_gram_vocab_destroy(gv);
}

/* ============================================================================================
 * Compaction, speed
 * ========================================================================================== */

static void test_compaction(const tok_vocab *tv) {
    ex_gram_vocab *gv = gram_vocab_of(tv);
    if (!gv) return;
    tok_gbnf d;
    tok_gbnf_init(&d);
    tok_gbnf_json(&d, "root", 0);
    size_t len;
    uint32_t *prog = compile(d.s, tv, &len);
    int32_t end = tok_eos(tv);
    ex_gram *g;
    char err[200];
    T_CHECK(prog && ex_gram_create(prog, len, gv, &end, 1, &g, err, sizeof err) == 0);
    const char *doc = "{\"a\": [1, {\"b\": \"xyz\"}, true], \"c\": null}";
    int32_t ids[256];
    int n;
    tok_encode(tv, doc, strlen(doc), 0, 0, ids, 256, &n);
    ex_gram_state a, b;
    ex_gram_state_init(g, &a);
    ex_gram_state_init(g, &b);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        const uint32_t *m;
        if (i == n / 2) {
            ex_gram_state *live[1] = { &a };
            T_CHECK(ex_gram_compact(g, live, 1, 1) == 1);
            T_CHECK(ex_gram_mask(g, &b, &m) == CM_ESTATE); /* not passed: invalid */
        }
        ok &= ex_gram_mask(g, &a, &m) == 0 && ex_gram_mask_test(m, ids[i]) && ex_gram_advance(g, &a, ids[i]) == 0;
    }
    T_CHECK(ok && ex_gram_accepting(g, &a));
    ex_gram_stats st;
    ex_gram_stats_get(g, &st);
    T_CHECK(st.compactions == 1);
    ex_gram_destroy(g);
    free(prog);
    tok_gbnf_free(&d);
    ex_gram_vocab_destroy(gv);
}

static void test_compile_time(void) {
    /* 50 properties of every kind, all required: OpenAI strict style */
    buf b = { 0 };
    puts_(&b, "{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{");
    static const char *kinds[] = { "{\"type\":\"string\"}", "{\"type\":\"integer\",\"minimum\":0,\"maximum\":1000}",
                                   "{\"type\":\"number\"}", "{\"type\":\"boolean\"}", "{\"enum\":[\"x\",\"y\",\"z\"]}",
                                   "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":20},\"maxItems\":5}",
                                   "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":[\"integer\",\"null\"]}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
                                   "{\"type\":\"string\",\"format\":\"date-time\"}" };
    char t[64];
    for (int i = 0; i < 50; i++) {
        snprintf(t, sizeof t, "%s\"field_%02d\":", i ? "," : "", i);
        puts_(&b, t);
        puts_(&b, kinds[i % 8]);
    }
    puts_(&b, "},\"required\":[");
    for (int i = 0; i < 50; i++) { snprintf(t, sizeof t, "%s\"field_%02d\"", i ? "," : "", i); puts_(&b, t); }
    puts_(&b, "]}");
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = cm_time_s();
        char err[300];
        size_t len;
        uint32_t *prog = compile_schema(b.s, &len, err, sizeof err);
        double dt = cm_time_s() - t0;
        T_CHECK(prog != NULL);
        free(prog);
        if (dt < best) best = dt;
    }
    printf("compile of a 50-property schema: %.2f ms (best of 5)\n", best * 1e3);
    T_CHECKF(best < 0.050, "50-property schema compiled in %.1f ms (limit 50)", best * 1e3);
    free(b.s);
}

int main(void) {
    ex_gram_vocab *bv = byte_vocab();
    T_CHECK(bv != NULL);
    test_gbnf(bv);
    test_schema_keywords(bv);
    ex_gram_vocab_destroy(bv);

    char err[256];
    tok_vocab *gpt2 = NULL, *spm = NULL;
    T_CHECK(tok_load_file(T_MODELS "vocab/ggml-vocab-gpt-2.gguf", &gpt2, err, sizeof err) == 0);
    T_CHECK(tok_load_file(T_MODELS "vocab/ggml-vocab-llama-spm.gguf", &spm, err, sizeof err) == 0);
    if (gpt2) test_random_documents(gpt2);
    if (spm) test_masks_brute_force(spm, "llama-spm");
    if (gpt2) test_compaction(gpt2);
    test_compile_time();
    tok_free(gpt2);
    tok_free(spm);
    return t_done();
}
