/* grammar_schema: JSON Schema (and json_object) -> GBNF rules (see grammar.h for the keywords
 * and semantics). Every schema node becomes one rule; shared pieces (whitespace, strings,
 * numbers, formats, any JSON value) are added once per document. */
#include "grammar.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "common/cm_json.h"

#define MAX_DEPTH 64          /* schema nesting (references aside) */
#define INT_DIGITS 16         /* digits of an integer part */
#define NAME_MAX_LEN 96

/* ---- shared rules ----------------------------------------------------------------------------- */

enum {
    P_WS = 1, P_STRING = 2, P_NUMBER = 4, P_INTEGER = 8, P_VALUE = 16, P_DATE = 32, P_TIME = 64, P_UUID = 128,
    P_HOST = 256, P_IPV4 = 512, P_IPV6 = 1024, P_DURATION = 2048, P_EMAIL = 4096, P_CHAR = 8192,
};

static void prim(tok_gbnf *d, unsigned p) {
    if (d->prims & p) return;
    d->prims |= p;
    switch (p) {
    case P_WS:
        tok_gbnf_add(d, "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
        break;
    case P_CHAR:
        tok_gbnf_add(d, "json-char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n");
        break;
    case P_STRING:
        prim(d, P_CHAR);
        tok_gbnf_add(d, "json-string ::= \"\\\"\" json-char* \"\\\"\"\n");
        break;
    case P_INTEGER:
        tok_gbnf_add(d, "json-integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,%d})\n", INT_DIGITS - 1);
        break;
    case P_NUMBER:
        prim(d, P_INTEGER);
        tok_gbnf_add(d, "json-number ::= json-integer (\".\" [0-9]{1,%d})? ([eE] [-+]? [0-9]{1,3})?\n", INT_DIGITS);
        break;
    case P_VALUE:
        prim(d, P_WS);
        prim(d, P_STRING);
        prim(d, P_NUMBER);
        tok_gbnf_add(d, "json-value ::= json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\"\n"
                        "json-object ::= \"{\" ws ( json-string ws \":\" ws json-value ( ws \",\" ws json-string ws \":\" ws json-value )* ws )? \"}\"\n"
                        "json-array ::= \"[\" ws ( json-value ( ws \",\" ws json-value )* ws )? \"]\"\n");
        break;
    case P_DATE: /* a real calendar day (29 February in leap years only), years 1000-9999 */
        tok_gbnf_add(d, "fmt-md ::= ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
                        "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] )\n"
                        "fmt-leap ::= [1-9] [0-9] ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( [2468] [048] | [13579] [26] ) \"00\"\n"
                        "fmt-date ::= [1-9] [0-9]{3} \"-\" fmt-md | fmt-leap \"-02-29\"\n");
        break;
    case P_TIME:
        tok_gbnf_add(d, "fmt-time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
                        "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n");
        break;
    case P_UUID:
        tok_gbnf_add(d, "fmt-uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}\n");
        break;
    case P_HOST:
        tok_gbnf_add(d, "fmt-label ::= [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,61} [a-zA-Z0-9] )?\n"
                        "fmt-hostname ::= fmt-label ( \".\" fmt-label ){0,8}\n");
        break;
    case P_EMAIL:
        prim(d, P_HOST);
        tok_gbnf_add(d, "fmt-email ::= [a-zA-Z0-9!#$%%&'*+/=?^_`{|}~-]{1,32} ( \".\" [a-zA-Z0-9!#$%%&'*+/=?^_`{|}~-]{1,32} ){0,4} "
                        "\"@\" fmt-label ( \".\" fmt-label ){1,8}\n");
        break;
    case P_IPV4:
        tok_gbnf_add(d, "fmt-octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]\n"
                        "fmt-ipv4 ::= fmt-octet \".\" fmt-octet \".\" fmt-octet \".\" fmt-octet\n");
        break;
    case P_IPV6: {
        /* eight groups, or i groups "::" and at most 7 - i more */
        tok_gbnf_add(d, "fmt-h16 ::= [0-9a-fA-F]{1,4}\nfmt-ipv6 ::= fmt-h16 ( \":\" fmt-h16 ){7}");
        for (int i = 0; i <= 7; i++) {
            tok_gbnf_add(d, " | ");
            if (i) tok_gbnf_add(d, "fmt-h16 ( \":\" fmt-h16 ){%d} ", i - 1);
            tok_gbnf_add(d, "\"::\"");
            if (7 - i - 1 >= 0) tok_gbnf_add(d, " ( fmt-h16 ( \":\" fmt-h16 ){0,%d} )?", 7 - i - 1 > 0 ? 7 - i - 1 : 0);
        }
        tok_gbnf_add(d, "\n");
        break;
    }
    case P_DURATION:
        tok_gbnf_add(d, "fmt-dnum ::= [0-9]{1,9}\n"
                        "fmt-ddate ::= fmt-dnum \"Y\" ( fmt-dnum \"M\" )? ( fmt-dnum \"D\" )? | fmt-dnum \"M\" ( fmt-dnum \"D\" )? | fmt-dnum \"D\"\n"
                        "fmt-dtime ::= fmt-dnum \"H\" ( fmt-dnum \"M\" )? ( fmt-dnum \"S\" )? | fmt-dnum \"M\" ( fmt-dnum \"S\" )? | fmt-dnum \"S\"\n"
                        "fmt-duration ::= \"P\" ( fmt-ddate ( \"T\" fmt-dtime )? | \"T\" fmt-dtime | fmt-dnum \"W\" )\n");
        break;
    }
}

int tok_gbnf_json(tok_gbnf *d, const char *name, int object_only) {
    prim(d, P_VALUE);
    tok_gbnf_add(d, "%s ::= %s\n", name, object_only ? "json-object" : "json-value");
    return d->oom ? CM_ENOMEM : 0;
}

/* ---- the converter ---------------------------------------------------------------------------- */

typedef struct sref { const cm_json *node; char name[NAME_MAX_LEN]; } sref;

typedef struct sc {
    tok_gbnf *d;
    const char *base;          /* rule name prefix */
    const cm_json *root;
    char *err;
    size_t errlen;
    int failed;
    sref *refs;                /* schemas already given a rule (references, in progress or done) */
    int n_refs, cap_refs;
} sc;

static int fail(sc *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(sc *c, const char *path, const char *fmt, ...) {
    if (c->failed) return CM_EINVAL;
    c->failed = 1;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errlen, "%s (at %s)", msg, path[0] ? path : "#");
    return CM_EINVAL;
}

static void new_name(sc *c, char *out) { snprintf(out, NAME_MAX_LEN, "%s-%d", c->base, c->d->n_names++); }

/* path + "/" + seg (JSON pointer escaping of ~ and /). */
static void path_join(char *out, size_t cap, const char *path, const char *seg) {
    size_t n = (size_t)snprintf(out, cap, "%s/", path[0] ? path : "#");
    for (const char *s = seg; *s && n + 3 < cap; s++) {
        if (*s == '~') { out[n++] = '~'; out[n++] = '0'; }
        else if (*s == '/') { out[n++] = '~'; out[n++] = '1'; }
        else out[n++] = *s;
    }
    out[n < cap ? n : cap - 1] = 0;
}

/* ---- JSON text of a value (enum, const) ---- */

typedef struct sbuf { char *s; size_t n, cap; int oom; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        char *ns = realloc(b->s, c);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void json_str(sbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '"') sb_put(b, "\\\"", 2);
        else if (ch == '\\') sb_put(b, "\\\\", 2);
        else if (ch == '\n') sb_put(b, "\\n", 2);
        else if (ch == '\r') sb_put(b, "\\r", 2);
        else if (ch == '\t') sb_put(b, "\\t", 2);
        else if (ch == '\b') sb_put(b, "\\b", 2);
        else if (ch == '\f') sb_put(b, "\\f", 2);
        else if (ch < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", ch); sb_put(b, esc, 6); }
        else sb_put(b, (const char *)&s[i], 1);
    }
    sb_put(b, "\"", 1);
}

static void json_num(sbuf *b, const cm_json *v) {
    char t[40];
    if (v->is_int) snprintf(t, sizeof t, "%lld", (long long)v->i);
    else {
        /* the shortest text that reads back as the same double */
        for (int p = 15; p <= 17; p++) {
            snprintf(t, sizeof t, "%.*g", p, v->num);
            if (strtod(t, NULL) == v->num) break;
        }
    }
    sb_put(b, t, strlen(t));
}

static void json_write(sbuf *b, const cm_json *v) {
    switch (v->type) {
    case CM_JSON_NULL: sb_put(b, "null", 4); break;
    case CM_JSON_BOOL: v->boolean ? sb_put(b, "true", 4) : sb_put(b, "false", 5); break;
    case CM_JSON_NUMBER: json_num(b, v); break;
    case CM_JSON_STRING: json_str(b, v->str, v->str_len); break;
    case CM_JSON_ARRAY:
        sb_put(b, "[", 1);
        for (const cm_json *e = v->child; e; e = e->next) {
            if (e != v->child) sb_put(b, ",", 1);
            json_write(b, e);
        }
        sb_put(b, "]", 1);
        break;
    case CM_JSON_OBJECT:
        sb_put(b, "{", 1);
        for (const cm_json *e = v->child; e; e = e->next) {
            if (e != v->child) sb_put(b, ",", 1);
            json_str(b, e->key, e->key_len);
            sb_put(b, ":", 1);
            json_write(b, e);
        }
        sb_put(b, "}", 1);
        break;
    }
}

/* Appends the GBNF literal of v's compact JSON text. */
static int lit_json(sc *c, const cm_json *v) {
    sbuf b = { 0 };
    json_write(&b, v);
    if (b.oom) { free(b.s); c->d->oom = 1; return CM_ENOMEM; }
    tok_gbnf_lit(c->d, b.s, b.n);
    free(b.s);
    return 0;
}

/* ---- keywords ---- */

static const char *const ANNOTATIONS[] = { "title", "description", "default", "examples", "$schema", "$id", "$comment",
                                           "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL };
static const char *const SUPPORTED[] = { "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf",
                                         "oneOf", "allOf", "$ref", "items", "prefixItems", "minItems", "maxItems", "minLength",
                                         "maxLength", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                         NULL };

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int gen(sc *c, const cm_json *s, const char *path, int depth, char *out);

/* The schema node a "$ref" names. */
static const cm_json *resolve(sc *c, const char *ref, const char *path) {
    if (!strcmp(ref, "#")) return c->root;
    const char *pre[] = { "#/$defs/", "#/definitions/" };
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(pre[i]);
        if (strncmp(ref, pre[i], n)) continue;
        const cm_json *defs = cm_json_get(c->root, i ? "definitions" : "$defs");
        /* the name, with JSON pointer escapes undone */
        char key[256];
        size_t k = 0;
        for (const char *p = ref + n; *p && k + 1 < sizeof key; p++) {
            if (*p == '~' && p[1] == '0') { key[k++] = '~'; p++; }
            else if (*p == '~' && p[1] == '1') { key[k++] = '/'; p++; }
            else if (*p == '/') { fail(c, path, "$ref '%.100s': only references to a top-level definition are supported", ref); return NULL; }
            else key[k++] = *p;
        }
        key[k] = 0;
        const cm_json *t = defs ? cm_json_get(defs, key) : NULL;
        if (!t) fail(c, path, "$ref '%.100s' names no definition", ref);
        return t;
    }
    fail(c, path, "$ref '%.100s': only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported", ref);
    return NULL;
}

/* The rule name of the schema node s (made once: references and recursion share it). */
static int rule_for(sc *c, const cm_json *s, const char *path, int depth, char *out) {
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].node == s) { strcpy(out, c->refs[i].name); return 0; }
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 16;
        sref *n = realloc(c->refs, sizeof(sref) * (size_t)cap);
        if (!n) { c->d->oom = 1; return CM_ENOMEM; }
        c->refs = n;
        c->cap_refs = cap;
    }
    sref *r = &c->refs[c->n_refs++];
    r->node = s;
    new_name(c, r->name);
    strcpy(out, r->name);
    char inner[NAME_MAX_LEN];
    int rc = gen(c, s, path, depth, inner);
    if (rc) return rc;
    tok_gbnf_add(c->d, "%s ::= %s\n", out, inner);
    return 0;
}

/* ---- integers in a range ---- */

/* Appends alternatives for the decimal numbers of exactly n digits in [lo, hi] (text, same
 * length), as a GBNF expression. */
static void digits_range(tok_gbnf *d, const char *lo, const char *hi, int n) {
    if (n == 0) return;
    int all_lo = 1, all_hi = 1;
    for (int i = 0; i < n; i++) {
        all_lo &= lo[i] == '0';
        all_hi &= hi[i] == '9';
    }
    if (all_lo && all_hi) { tok_gbnf_add(d, n == 1 ? "[0-9]" : "[0-9]{%d}", n); return; }
    if (n == 1) { tok_gbnf_add(d, "[%c-%c]", lo[0], hi[0]); return; }
    if (lo[0] == hi[0]) {
        tok_gbnf_add(d, "\"%c\" ", lo[0]);
        digits_range(d, lo + 1, hi + 1, n - 1);
        return;
    }
    char nines[INT_DIGITS + 2], zeros[INT_DIGITS + 2];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    tok_gbnf_add(d, "( \"%c\" ", lo[0]);
    digits_range(d, lo + 1, nines, n - 1);
    if (lo[0] + 1 <= hi[0] - 1) tok_gbnf_add(d, " | [%c-%c] [0-9]{%d}", lo[0] + 1, hi[0] - 1, n - 1);
    tok_gbnf_add(d, " | \"%c\" ", hi[0]);
    digits_range(d, zeros, hi + 1, n - 1);
    tok_gbnf_add(d, " )");
}

/* Non-negative integers in [a, b] (no leading zeros) as alternatives. */
static void uint_range(tok_gbnf *d, long long a, long long b) {
    int first = 1;
    long long p10 = 1;
    for (int n = 1; n <= 19 && a <= b; n++) {
        long long lo_n = n == 1 ? 0 : p10, hi_n = n >= 19 ? LLONG_MAX : p10 * 10 - 1;
        if (n < 19) p10 *= 10;
        long long lo = a > lo_n ? a : lo_n, hi = b < hi_n ? b : hi_n;
        if (lo <= hi) {
            char ls[24], hs[24];
            snprintf(ls, sizeof ls, "%lld", lo);
            snprintf(hs, sizeof hs, "%lld", hi);
            if (!first) tok_gbnf_add(d, " | ");
            first = 0;
            tok_gbnf_add(d, "( ");
            digits_range(d, ls, hs, (int)strlen(ls));
            tok_gbnf_add(d, " )");
        }
        if (hi_n >= b) break;
    }
}

static int int_bound(sc *c, const cm_json *s, const char *kw, int upper, long long *out, const char *path) {
    const cm_json *v = cm_json_get(s, kw);
    if (!v) return 0;
    char p[512];
    path_join(p, sizeof p, path, kw);
    if (v->type != CM_JSON_NUMBER) return fail(c, p, "'%s' must be a number", kw);
    double x = v->num, lim = pow(10, INT_DIGITS) - 1;
    int excl = kw[0] == 'e';
    double r = upper ? (excl ? ceil(x) - 1 : floor(x)) : (excl ? floor(x) + 1 : ceil(x));
    if (r > lim) r = lim;
    if (r < -lim) r = -lim;
    long long y = (long long)r;
    if (upper ? y < *out : y > *out) *out = y;
    return 0;
}

static int gen_integer(sc *c, const cm_json *s, const char *path, char *expr, size_t cap) {
    int has = cm_json_get(s, "minimum") || cm_json_get(s, "maximum") || cm_json_get(s, "exclusiveMinimum") ||
              cm_json_get(s, "exclusiveMaximum");
    if (!has) {
        prim(c->d, P_INTEGER);
        snprintf(expr, cap, "json-integer");
        return 0;
    }
    long long lim = 1;
    for (int i = 0; i < INT_DIGITS; i++) lim *= 10;
    long long lo = -(lim - 1), hi = lim - 1;
    if (int_bound(c, s, "minimum", 0, &lo, path) || int_bound(c, s, "exclusiveMinimum", 0, &lo, path) ||
        int_bound(c, s, "maximum", 1, &hi, path) || int_bound(c, s, "exclusiveMaximum", 1, &hi, path))
        return CM_EINVAL;
    if (lo > hi) return fail(c, path, "no integer lies between the minimum and the maximum");
    char name[NAME_MAX_LEN];
    new_name(c, name);
    tok_gbnf *d = c->d;
    tok_gbnf_add(d, "%s ::= ", name);
    int alt = 0;
    if (lo < 0) { /* negatives: "-" and [max(1, -hi), -lo] */
        tok_gbnf_add(d, "\"-\" ( ");
        uint_range(d, hi < 0 ? -hi : 1, -lo);
        tok_gbnf_add(d, " )");
        alt = 1;
    }
    if (hi >= 0) {
        if (alt) tok_gbnf_add(d, " | ");
        uint_range(d, lo > 0 ? lo : 0, hi);
    }
    tok_gbnf_add(d, "\n");
    snprintf(expr, cap, "%s", name);
    return 0;
}

/* ---- strings ---- */

static int get_count(sc *c, const cm_json *s, const char *kw, long long *out, const char *path) {
    const cm_json *v = cm_json_get(s, kw);
    if (!v) return 0;
    char p[512];
    path_join(p, sizeof p, path, kw);
    if (v->type != CM_JSON_NUMBER || !v->is_int || v->i < 0) return fail(c, p, "'%s' must be a non-negative integer", kw);
    if (v->i > 100000) return fail(c, p, "'%s' is %lld; at most 100000 is supported", kw, (long long)v->i);
    *out = v->i;
    return 0;
}

static int gen_string(sc *c, const cm_json *s, const char *path, char *expr, size_t cap) {
    const cm_json *f = cm_json_get(s, "format");
    long long mn = 0, mx = -1;
    if (get_count(c, s, "minLength", &mn, path) || get_count(c, s, "maxLength", &mx, path)) return CM_EINVAL;
    if (mx >= 0 && mx < mn) return fail(c, path, "maxLength is below minLength");
    if (f) {
        char p[512];
        path_join(p, sizeof p, path, "format");
        if (f->type != CM_JSON_STRING) return fail(c, p, "'format' must be a string");
        static const struct { const char *name; unsigned prim; const char *rule; } F[] = {
            { "date-time", P_DATE | P_TIME, "fmt-date \"T\" fmt-time" }, { "date", P_DATE, "fmt-date" },
            { "time", P_TIME, "fmt-time" }, { "duration", P_DURATION, "fmt-duration" }, { "uuid", P_UUID, "fmt-uuid" },
            { "email", P_EMAIL, "fmt-email" }, { "hostname", P_HOST, "fmt-hostname" }, { "ipv4", P_IPV4, "fmt-ipv4" },
            { "ipv6", P_IPV6, "fmt-ipv6" },
        };
        for (size_t i = 0; i < sizeof F / sizeof *F; i++) {
            if (strcmp(f->str, F[i].name)) continue;
            if (cm_json_get(s, "minLength") || cm_json_get(s, "maxLength"))
                return fail(c, path, "minLength/maxLength together with format '%s' are not supported", f->str);
            for (unsigned b = 1; b <= P_CHAR; b <<= 1)
                if (F[i].prim & b) prim(c->d, b);
            snprintf(expr, cap, "\"\\\"\" %s \"\\\"\"", F[i].rule);
            return 0;
        }
        return fail(c, p, "string format '%.60s' is not supported (date-time, date, time, duration, uuid, email, hostname, "
                           "ipv4, ipv6 are)", f->str);
    }
    prim(c->d, P_CHAR);
    if (mn == 0 && mx < 0) {
        prim(c->d, P_STRING);
        snprintf(expr, cap, "json-string");
        return 0;
    }
    /* one rule per length range, shared by every string that has it (the mask engine then
     * classifies its positions once) */
    char name[NAME_MAX_LEN], head[NAME_MAX_LEN + 8];
    if (mx < 0) snprintf(name, sizeof name, "json-string-%lld-", mn);
    else snprintf(name, sizeof name, "json-string-%lld-%lld", mn, mx);
    snprintf(head, sizeof head, "\n%s ::=", name);
    if (!c->d->s || (strncmp(c->d->s, head + 1, strlen(head) - 1) && !strstr(c->d->s, head))) {
        if (mx < 0) tok_gbnf_add(c->d, "%s ::= \"\\\"\" json-char{%lld,} \"\\\"\"\n", name, mn);
        else tok_gbnf_add(c->d, "%s ::= \"\\\"\" json-char{%lld,%lld} \"\\\"\"\n", name, mn, mx);
    }
    snprintf(expr, cap, "%s", name);
    return 0;
}

/* ---- objects ---- */

typedef struct prop { const char *key; size_t klen; const cm_json *schema; char path[512]; int required; } prop;

/* A string other than the given keys (the JSON spelling of each; keys that need escapes are
 * left out of the exclusion: such a key is then also accepted as an extra one). Rules over a
 * code-point trie of the keys: at each node the string may end (unless a key ends there), go on
 * with a character no key continues with (then anything), or follow the trie. */
typedef struct ktrie { uint32_t cp; int child, sib, end; } ktrie;

static int kt_add(ktrie **t, int *n, int *cap, int parent, uint32_t cp) {
    for (int k = (*t)[parent].child; k >= 0; k = (*t)[k].sib)
        if ((*t)[k].cp == cp) return k;
    if (*n == *cap) {
        int c2 = *cap * 2;
        ktrie *nt = realloc(*t, sizeof(ktrie) * (size_t)c2);
        if (!nt) return -1;
        *t = nt;
        *cap = c2;
    }
    int k = (*n)++;
    (*t)[k] = (ktrie){ cp, -1, (*t)[parent].child, 0 };
    (*t)[parent].child = k;
    return k;
}

static void kt_emit(sc *c, const ktrie *t, int node, const char *name) {
    tok_gbnf *d = c->d;
    char kid[NAME_MAX_LEN];
    /* names of the children's rules first: the rule text refers to them */
    tok_gbnf_add(d, "%s ::= ", name);
    int alt = 0;
    if (!t[node].end) { tok_gbnf_add(d, "\"\""); alt = 1; }
    tok_gbnf_add(d, "%s[^\"\\\\\\x7F\\x00-\\x1F", alt ? " | " : "");
    for (int k = t[node].child; k >= 0; k = t[k].sib) {
        if (t[k].cp < 0x80 && (t[k].cp == ']' || t[k].cp == '-' || t[k].cp == '^' || t[k].cp == '\\')) tok_gbnf_add(d, "\\%c", (char)t[k].cp);
        else if (t[k].cp < 0x80) tok_gbnf_add(d, "%c", (char)t[k].cp);
        else tok_gbnf_add(d, "\\U%08X", t[k].cp);
    }
    tok_gbnf_add(d, "] json-char* | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) json-char*");
    int first_kid = d->n_names;
    int nk = 0;
    for (int k = t[node].child; k >= 0; k = t[k].sib) {
        snprintf(kid, sizeof kid, "%s-%d", c->base, first_kid + nk);
        char ch[16];
        if (t[k].cp == '"' || t[k].cp == '\\') snprintf(ch, sizeof ch, "\"\\%c\"", (char)t[k].cp);
        else if (t[k].cp < 0x80) snprintf(ch, sizeof ch, "\"%c\"", (char)t[k].cp);
        else snprintf(ch, sizeof ch, "[\\U%08X]", t[k].cp);
        tok_gbnf_add(d, " | %s %s", ch, kid);
        nk++;
    }
    tok_gbnf_add(d, "\n");
    d->n_names += nk;
    nk = 0;
    for (int k = t[node].child; k >= 0; k = t[k].sib) {
        snprintf(kid, sizeof kid, "%s-%d", c->base, first_kid + nk++);
        kt_emit(c, t, k, kid);
    }
}

static int key_needs_escape(const char *k, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (k[i] == '"' || k[i] == '\\' || (unsigned char)k[i] < 0x20 || k[i] == 0x7f) return 1;
    return 0;
}

static int string_except(sc *c, const prop *props, int n, char *out) {
    prim(c->d, P_CHAR);
    int cap = 64, nt = 1;
    ktrie *t = malloc(sizeof(ktrie) * (size_t)cap);
    if (!t) return CM_ENOMEM;
    t[0] = (ktrie){ 0, -1, -1, 0 };
    for (int i = 0; i < n; i++) {
        if (key_needs_escape(props[i].key, props[i].klen)) continue;
        int node = 0;
        const unsigned char *s = (const unsigned char *)props[i].key;
        for (size_t j = 0; j < props[i].klen && node >= 0;) {
            uint32_t cp = s[j];
            int len = cp < 0x80 ? 1 : cp < 0xE0 ? 2 : cp < 0xF0 ? 3 : 4;
            if (len > 1) {
                cp &= len == 2 ? 31 : len == 3 ? 15 : 7;
                for (int q = 1; q < len && j + (size_t)q < props[i].klen; q++) cp = cp << 6 | (s[j + (size_t)q] & 63);
            }
            j += (size_t)len;
            node = kt_add(&t, &nt, &cap, node, cp);
        }
        if (node < 0) { free(t); return CM_ENOMEM; }
        t[node].end = 1;
    }
    new_name(c, out);
    kt_emit(c, t, 0, out);
    free(t);
    return 0;
}

static int collect_props(sc *c, const cm_json *s, const char *path, prop **props, int *n, int *cap, int *closed,
                         const cm_json **extra, int depth);

static int gen_object(sc *c, const cm_json *s, const char *path, int depth, char *expr, size_t cap) {
    prop *props = NULL;
    int n = 0, pcap = 0, closed = 1;
    const cm_json *extra = NULL;
    int rc = collect_props(c, s, path, &props, &n, &pcap, &closed, &extra, depth);
    if (rc) { free(props); return rc; }
    tok_gbnf *d = c->d;
    prim(d, P_WS);
    /* one rule per member: "key" ws ":" ws value */
    char (*kv)[NAME_MAX_LEN] = calloc((size_t)n + 1, NAME_MAX_LEN);
    char add[NAME_MAX_LEN] = "";
    if (!kv) { free(props); return CM_ENOMEM; }
    for (int i = 0; i < n && !rc; i++) {
        char val[NAME_MAX_LEN];
        if ((rc = rule_for(c, props[i].schema, props[i].path, depth + 1, val))) break;
        new_name(c, kv[i]);
        tok_gbnf_add(d, "%s ::= ", kv[i]);
        sbuf b = { 0 };
        json_str(&b, props[i].key, props[i].klen);
        if (b.oom) { rc = CM_ENOMEM; break; }
        tok_gbnf_lit(d, b.s, b.n);
        free(b.s);
        tok_gbnf_add(d, " ws \":\" ws %s\n", val);
    }
    if (!rc && !closed) { /* extra members: a key other than the properties', any value or extra's schema */
        char val[NAME_MAX_LEN], ex[NAME_MAX_LEN];
        char p[512];
        path_join(p, sizeof p, path, "additionalProperties");
        if (extra) rc = rule_for(c, extra, p, depth + 1, val);
        else { prim(d, P_VALUE); snprintf(val, sizeof val, "json-value"); }
        if (!rc) rc = string_except(c, props, n, ex);
        if (!rc) {
            new_name(c, add);
            tok_gbnf_add(d, "%s ::= \"\\\"\" %s \"\\\"\" ws \":\" ws %s\n", add, ex, val);
        }
    }
    if (rc) { free(kv); free(props); return rc; }
    /* optional members in order, then extras: C_i ::= O_i (sep C_{i+1})? | C_{i+1} */
    int n_opt = 0;
    for (int i = 0; i < n; i++) n_opt += !props[i].required;
    char chain[NAME_MAX_LEN] = ""; /* C_{i+1} (built backwards) */
    if (add[0]) {
        new_name(c, chain);
        tok_gbnf_add(d, "%s ::= %s ( ws \",\" ws %s )*\n", chain, add, add);
    }
    for (int i = n - 1; i >= 0; i--) {
        if (props[i].required) continue;
        char ci[NAME_MAX_LEN];
        new_name(c, ci);
        if (chain[0]) tok_gbnf_add(d, "%s ::= %s ( ws \",\" ws %s )? | %s\n", ci, kv[i], chain, chain);
        else tok_gbnf_add(d, "%s ::= %s\n", ci, kv[i]);
        strcpy(chain, ci);
    }
    char body[NAME_MAX_LEN];
    new_name(c, body);
    tok_gbnf_add(d, "%s ::= ", body);
    int n_req = 0;
    for (int i = 0; i < n; i++) {
        if (!props[i].required) continue;
        tok_gbnf_add(d, n_req ? " ws \",\" ws %s" : "%s", kv[i]);
        n_req++;
    }
    if (n_req && chain[0]) tok_gbnf_add(d, " ( ws \",\" ws %s )?", chain);
    else if (!n_req) tok_gbnf_add(d, "%s", chain[0] ? chain : "\"\"");
    tok_gbnf_add(d, "\n");
    if (n_req) snprintf(expr, cap, "\"{\" ws %s ws \"}\"", body);
    else if (chain[0]) snprintf(expr, cap, "\"{\" ws ( %s ws )? \"}\"", body);
    else snprintf(expr, cap, "\"{\" ws \"}\"");
    free(kv);
    free(props);
    return 0;
}

/* Properties of an object schema (allOf members merged in). */
static int collect_props(sc *c, const cm_json *s, const char *path, prop **props, int *n, int *cap, int *closed,
                         const cm_json **extra, int depth) {
    char p[512];
    const cm_json *ref = cm_json_get(s, "$ref");
    if (ref) {
        path_join(p, sizeof p, path, "$ref");
        if (ref->type != CM_JSON_STRING) return fail(c, p, "'$ref' must be a string");
        const cm_json *t = resolve(c, ref->str, p);
        if (!t) return CM_EINVAL;
        if (depth > MAX_DEPTH) return fail(c, path, "allOf/$ref nesting deeper than %d", MAX_DEPTH);
        int rc = collect_props(c, t, ref->str, props, n, cap, closed, extra, depth + 1);
        if (rc) return rc;
    }
    const cm_json *pr = cm_json_get(s, "properties"), *req = cm_json_get(s, "required"), *ap = cm_json_get(s, "additionalProperties");
    if (pr && pr->type != CM_JSON_OBJECT) { path_join(p, sizeof p, path, "properties"); return fail(c, p, "'properties' must be an object"); }
    for (const cm_json *e = pr ? pr->child : NULL; e; e = e->next) {
        int dup = -1;
        for (int i = 0; i < *n; i++)
            if ((*props)[i].klen == e->key_len && !memcmp((*props)[i].key, e->key, e->key_len)) dup = i;
        if (dup >= 0) {
            path_join(p, sizeof p, path, "allOf");
            return fail(c, p, "property '%.60s' is defined by more than one allOf member", e->key);
        }
        if (*n == *cap) {
            int nc = *cap ? *cap * 2 : 8;
            prop *np = realloc(*props, sizeof(prop) * (size_t)nc);
            if (!np) return CM_ENOMEM;
            *props = np;
            *cap = nc;
        }
        prop *q = &(*props)[(*n)++];
        q->key = e->key;
        q->klen = e->key_len;
        q->schema = e;
        q->required = 0;
        char pp[512];
        path_join(pp, sizeof pp, path, "properties");
        path_join(q->path, sizeof q->path, pp, e->key);
    }
    if (req) {
        path_join(p, sizeof p, path, "required");
        if (req->type != CM_JSON_ARRAY) return fail(c, p, "'required' must be an array of strings");
        for (const cm_json *e = req->child; e; e = e->next) {
            if (e->type != CM_JSON_STRING) return fail(c, p, "'required' must be an array of strings");
            int found = 0;
            for (int i = 0; i < *n; i++)
                if ((*props)[i].klen == e->str_len && !memcmp((*props)[i].key, e->str, e->str_len)) (*props)[i].required = found = 1;
            if (!found)
                return fail(c, p, "required property '%.60s' is not among the properties (a required property needs a "
                                  "schema here)", e->str);
        }
    }
    if (ap) {
        path_join(p, sizeof p, path, "additionalProperties");
        if (ap->type == CM_JSON_BOOL) { if (ap->boolean) *closed = 0; }
        else if (ap->type == CM_JSON_OBJECT) { *closed = 0; *extra = ap; }
        else return fail(c, p, "'additionalProperties' must be a boolean or a schema");
    }
    const cm_json *all = cm_json_get(s, "allOf");
    if (all) {
        path_join(p, sizeof p, path, "allOf");
        if (all->type != CM_JSON_ARRAY || !all->n) return fail(c, p, "'allOf' must be a non-empty array");
        int i = 0;
        for (const cm_json *e = all->child; e; e = e->next, i++) {
            char ip[512], num[16];
            snprintf(num, sizeof num, "%d", i);
            path_join(ip, sizeof ip, p, num);
            if (e->type != CM_JSON_OBJECT) return fail(c, ip, "allOf members must be schemas");
            const cm_json *t = cm_json_get(e, "type");
            if (t && !(t->type == CM_JSON_STRING && !strcmp(t->str, "object")))
                return fail(c, ip, "allOf is supported for object schemas only");
            for (const cm_json *k = e->child; k; k = k->next)
                if (!in_list(ANNOTATIONS, k->key) && strcmp(k->key, "type") && strcmp(k->key, "properties") &&
                    strcmp(k->key, "required") && strcmp(k->key, "additionalProperties") && strcmp(k->key, "$ref") &&
                    strcmp(k->key, "allOf")) {
                    char kp[512];
                    path_join(kp, sizeof kp, ip, k->key);
                    return fail(c, kp, "keyword '%.40s' inside allOf is not supported (allOf merges object properties)", k->key);
                }
            if (depth > MAX_DEPTH) return fail(c, ip, "allOf nesting deeper than %d", MAX_DEPTH);
            int rc = collect_props(c, e, ip, props, n, cap, closed, extra, depth + 1);
            if (rc) return rc;
        }
    }
    return 0;
}

/* ---- arrays ---- */

static int gen_array(sc *c, const cm_json *s, const char *path, int depth, char *expr, size_t cap) {
    tok_gbnf *d = c->d;
    prim(d, P_WS);
    long long mn = 0, mx = -1;
    if (get_count(c, s, "minItems", &mn, path) || get_count(c, s, "maxItems", &mx, path)) return CM_EINVAL;
    if (mx >= 0 && mx < mn) return fail(c, path, "maxItems is below minItems");
    const cm_json *items = cm_json_get(s, "items"), *pre = cm_json_get(s, "prefixItems");
    char p[512], item[NAME_MAX_LEN] = "";
    int items_ok = 1;
    if (items) {
        path_join(p, sizeof p, path, "items");
        if (items->type == CM_JSON_BOOL) items_ok = items->boolean;
        else if (items->type != CM_JSON_OBJECT) return fail(c, p, "'items' must be a schema (an array of schemas is prefixItems)");
        else {
            int rc = rule_for(c, items, p, depth + 1, item);
            if (rc) return rc;
        }
    }
    if (items_ok && !item[0]) { prim(d, P_VALUE); snprintf(item, sizeof item, "json-value"); }
    int k = 0;
    char (*pi)[NAME_MAX_LEN] = NULL;
    if (pre) {
        path_join(p, sizeof p, path, "prefixItems");
        if (pre->type != CM_JSON_ARRAY) return fail(c, p, "'prefixItems' must be an array of schemas");
        pi = calloc(pre->n + 1, NAME_MAX_LEN);
        if (!pi) return CM_ENOMEM;
        for (const cm_json *e = pre->child; e; e = e->next, k++) {
            char ip[512], num[16];
            snprintf(num, sizeof num, "%d", k);
            path_join(ip, sizeof ip, p, num);
            int rc = rule_for(c, e, ip, depth + 1, pi[k]);
            if (rc) { free(pi); return rc; }
        }
    }
    if (!items_ok && mn > k) { free(pi); return fail(c, path, "minItems %lld is more than the %d items allowed", mn, k); }
    if (!items_ok && (mx < 0 || mx > k)) mx = k;
    /* tail after the prefix: extra items, between max(0, mn - k) and mx - k (unbounded: -1) */
    char tail[NAME_MAX_LEN] = "";
    long long tmin = mn > k ? mn - k : 0, tmax = mx < 0 ? -1 : (mx > k ? mx - k : 0);
    if (items_ok && tmax != 0) {
        new_name(c, tail);
        if (tmax < 0) tok_gbnf_add(d, "%s ::= %s ( ws \",\" ws %s ){%lld,}\n", tail, item, item, tmin > 0 ? tmin - 1 : 0);
        else tok_gbnf_add(d, "%s ::= %s ( ws \",\" ws %s ){%lld,%lld}\n", tail, item, item, tmin > 0 ? tmin - 1 : 0, tmax - 1);
    }
    /* S_j = item j, then the rest; required while j + 1 < mn */
    long long kmax = mx >= 0 && mx < k ? mx : k;
    char next[NAME_MAX_LEN];
    strcpy(next, tail);
    int next_required = tmin > 0;
    for (long long j = kmax - 1; j >= 0; j--) {
        char sj[NAME_MAX_LEN];
        new_name(c, sj);
        if (!next[0]) tok_gbnf_add(d, "%s ::= %s\n", sj, pi[j]);
        else if (next_required) tok_gbnf_add(d, "%s ::= %s ws \",\" ws %s\n", sj, pi[j], next);
        else tok_gbnf_add(d, "%s ::= %s ( ws \",\" ws %s )?\n", sj, pi[j], next);
        strcpy(next, sj);
        next_required = j < mn;
    }
    free(pi);
    if (!next[0]) snprintf(expr, cap, "\"[\" ws \"]\"");
    else if (mn > 0) snprintf(expr, cap, "\"[\" ws %s ws \"]\"", next);
    else snprintf(expr, cap, "\"[\" ws ( %s ws )? \"]\"", next);
    return 0;
}

/* ---- a schema node ---- */

static int check_keywords(sc *c, const cm_json *s, const char *path) {
    for (const cm_json *k = s->child; k; k = k->next) {
        if (in_list(SUPPORTED, k->key) || in_list(ANNOTATIONS, k->key)) continue;
        char p[512];
        path_join(p, sizeof p, path, k->key);
        return fail(c, p, "JSON Schema keyword '%.60s' is not supported", k->key);
    }
    return 0;
}

/* The expression for schema s restricted to one type name. */
static int gen_type(sc *c, const cm_json *s, const char *type, const char *path, int depth, char *expr, size_t cap) {
    if (!strcmp(type, "string")) return gen_string(c, s, path, expr, cap);
    if (!strcmp(type, "integer")) return gen_integer(c, s, path, expr, cap);
    if (!strcmp(type, "number")) {
        static const char *const B[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
        for (int i = 0; i < 4; i++)
            if (cm_json_get(s, B[i])) {
                char p[512];
                path_join(p, sizeof p, path, B[i]);
                return fail(c, p, "'%s' is supported on integers only, not on type number", B[i]);
            }
        prim(c->d, P_NUMBER);
        snprintf(expr, cap, "json-number");
        return 0;
    }
    if (!strcmp(type, "boolean")) { snprintf(expr, cap, "( \"true\" | \"false\" )"); return 0; }
    if (!strcmp(type, "null")) { snprintf(expr, cap, "\"null\""); return 0; }
    if (!strcmp(type, "object")) return gen_object(c, s, path, depth, expr, cap);
    if (!strcmp(type, "array")) return gen_array(c, s, path, depth, expr, cap);
    char p[512];
    path_join(p, sizeof p, path, "type");
    return fail(c, p, "unknown type '%.40s'", type);
}

static int gen_alts(sc *c, const cm_json *arr, const char *kw, const char *path, int depth, char *out) {
    char p[512];
    path_join(p, sizeof p, path, kw);
    if (arr->type != CM_JSON_ARRAY || !arr->n) return fail(c, p, "'%s' must be a non-empty array of schemas", kw);
    char (*names)[NAME_MAX_LEN] = calloc(arr->n, NAME_MAX_LEN);
    if (!names) return CM_ENOMEM;
    int i = 0, rc = 0;
    for (const cm_json *e = arr->child; e && !rc; e = e->next, i++) {
        char ip[512], num[16];
        snprintf(num, sizeof num, "%d", i);
        path_join(ip, sizeof ip, p, num);
        rc = rule_for(c, e, ip, depth + 1, names[i]);
    }
    if (!rc) {
        new_name(c, out);
        tok_gbnf_add(c->d, "%s ::= ", out);
        for (int k = 0; k < i; k++) tok_gbnf_add(c->d, k ? " | %s" : "%s", names[k]);
        tok_gbnf_add(c->d, "\n");
    }
    free(names);
    return rc;
}

/* The GBNF expression (a rule name or a short expression) matching schema s into out. */
static int gen(sc *c, const cm_json *s, const char *path, int depth, char *out) {
    if (c->failed) return CM_EINVAL;
    if (depth > MAX_DEPTH) return fail(c, path, "schema nested deeper than %d", MAX_DEPTH);
    if (s->type == CM_JSON_BOOL) {
        if (!s->boolean) return fail(c, path, "the schema false accepts nothing");
        prim(c->d, P_VALUE);
        snprintf(out, NAME_MAX_LEN, "json-value");
        return 0;
    }
    if (s->type != CM_JSON_OBJECT) return fail(c, path, "a schema must be an object or a boolean");
    int rc = check_keywords(c, s, path);
    if (rc) return rc;
    char p[512];
    const cm_json *v;
    if ((v = cm_json_get(s, "$ref")) && !cm_json_get(s, "allOf") && !cm_json_get(s, "properties")) {
        path_join(p, sizeof p, path, "$ref");
        if (v->type != CM_JSON_STRING) return fail(c, p, "'$ref' must be a string");
        for (const cm_json *k = s->child; k; k = k->next)
            if (strcmp(k->key, "$ref") && !in_list(ANNOTATIONS, k->key))
                return fail(c, p, "keywords beside '$ref' ('%.40s') are not supported", k->key);
        const cm_json *t = resolve(c, v->str, p);
        return t ? rule_for(c, t, v->str, depth + 1, out) : CM_EINVAL;
    }
    if ((v = cm_json_get(s, "const"))) {
        char name[NAME_MAX_LEN];
        new_name(c, name);
        tok_gbnf_add(c->d, "%s ::= ", name);
        if ((rc = lit_json(c, v))) return rc;
        tok_gbnf_add(c->d, "\n");
        strcpy(out, name);
        return 0;
    }
    if ((v = cm_json_get(s, "enum"))) {
        path_join(p, sizeof p, path, "enum");
        if (v->type != CM_JSON_ARRAY || !v->n) return fail(c, p, "'enum' must be a non-empty array");
        char name[NAME_MAX_LEN];
        new_name(c, name);
        tok_gbnf_add(c->d, "%s ::= ", name);
        for (const cm_json *e = v->child; e; e = e->next) {
            if (e != v->child) tok_gbnf_add(c->d, " | ");
            if ((rc = lit_json(c, e))) return rc;
        }
        tok_gbnf_add(c->d, "\n");
        strcpy(out, name);
        return 0;
    }
    if ((v = cm_json_get(s, "anyOf")) || (v = cm_json_get(s, "oneOf"))) {
        const char *kw = cm_json_get(s, "anyOf") ? "anyOf" : "oneOf";
        if (cm_json_get(s, "anyOf") && cm_json_get(s, "oneOf")) return fail(c, path, "anyOf and oneOf together are not supported");
        if (cm_json_get(s, "type") || cm_json_get(s, "properties"))
            return fail(c, path, "'%s' beside 'type' or 'properties' is not supported (put them inside each branch)", kw);
        return gen_alts(c, v, kw, path, depth, out);
    }
    const cm_json *t = cm_json_get(s, "type");
    char expr[4 * NAME_MAX_LEN];
    if (!t) {
        if (cm_json_get(s, "properties") || cm_json_get(s, "allOf") || cm_json_get(s, "additionalProperties") ||
            cm_json_get(s, "required") || cm_json_get(s, "$ref"))
            rc = gen_object(c, s, path, depth, expr, sizeof expr);
        else if (cm_json_get(s, "items") || cm_json_get(s, "prefixItems"))
            rc = gen_array(c, s, path, depth, expr, sizeof expr);
        else {
            prim(c->d, P_VALUE);
            snprintf(expr, sizeof expr, "json-value");
        }
    } else if (t->type == CM_JSON_STRING) {
        rc = gen_type(c, s, t->str, path, depth, expr, sizeof expr);
    } else if (t->type == CM_JSON_ARRAY && t->n) {
        char name[NAME_MAX_LEN];
        new_name(c, name);
        /* each type's expression first (they may add rules), then the alternatives */
        char (*ex)[4 * NAME_MAX_LEN] = calloc(t->n, 4 * NAME_MAX_LEN);
        if (!ex) return CM_ENOMEM;
        int i = 0;
        for (const cm_json *e = t->child; e && !rc; e = e->next, i++) {
            path_join(p, sizeof p, path, "type");
            if (e->type != CM_JSON_STRING) rc = fail(c, p, "'type' must be a string or an array of strings");
            else rc = gen_type(c, s, e->str, path, depth, ex[i], sizeof ex[i]);
        }
        if (!rc) {
            tok_gbnf_add(c->d, "%s ::= ", name);
            for (int k = 0; k < i; k++) tok_gbnf_add(c->d, k ? " | %s" : "%s", ex[k]);
            tok_gbnf_add(c->d, "\n");
            snprintf(expr, sizeof expr, "%s", name);
        }
        free(ex);
    } else {
        path_join(p, sizeof p, path, "type");
        return fail(c, p, "'type' must be a string or a non-empty array of strings");
    }
    if (rc) return rc;
    size_t el = strlen(expr);
    if (el < NAME_MAX_LEN) memcpy(out, expr, el + 1);
    else { /* a long expression becomes a rule */
        new_name(c, out);
        tok_gbnf_add(c->d, "%s ::= %s\n", out, expr);
    }
    return 0;
}

int tok_gbnf_schema(tok_gbnf *d, const char *name, const char *schema, size_t len, char *err, size_t errlen) {
    cm_json_doc *doc;
    char jerr[160];
    if (cm_json_parse(schema, len, &doc, jerr, sizeof jerr)) {
        snprintf(err, errlen, "the schema is not valid JSON: %s", jerr);
        return CM_EINVAL;
    }
    sc c = { .d = d, .base = name, .root = cm_json_root(doc), .err = err, .errlen = errlen };
    char top[NAME_MAX_LEN];
    int rc = rule_for(&c, c.root, "#", 0, top);
    if (!rc && !c.failed) tok_gbnf_add(d, "%s ::= %s\n", name, top);
    free(c.refs);
    cm_json_free(doc);
    if (c.failed) return CM_EINVAL;
    if (rc == CM_ENOMEM || d->oom) {
        snprintf(err, errlen, "out of memory");
        return CM_ENOMEM;
    }
    return rc;
}
