/* grammar_gbnf: GBNF text -> the executor's grammar program, the GBNF text builder and the
 * compile cache (see grammar.h). */
#include "grammar.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "executor/grammar.h"

#define MAX_RULES (1 << 20)
#define MAX_REPEAT 100000 /* {m,n}: n at most */

/* ============================================================================================
 * The program under construction
 * ========================================================================================== */

typedef struct alt { uint32_t *el; int n, cap; } alt;
typedef struct rule {
    char *name;     /* NULL for generated rules */
    int   defined;
    int   loop;     /* made by a repetition: x loop | ... (inline_loops may take x's alternatives in) */
    size_t at;      /* byte offset of its first mention, for "undefined rule" */
    alt  *alts;
    int   n_alts, cap_alts;
} rule;

typedef struct gb {
    rule     *rules;
    int       n_rules, cap_rules;
    uint32_t (*cls)[8];
    int       n_cls, cap_cls;
    int       any_char;  /* rule index of `.` (-1: not made yet) */
    int       oom;
    const tok_vocab *v;
    int      *names;     /* open addressing: rule index + 1 of named rules, 0 empty */
    uint64_t  names_mask, n_names;
} gb;

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static int gb_grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *np = realloc(*p, (size_t)c * elem);
    if (!np) return CM_ENOMEM;
    *p = np;
    *cap = c;
    return 0;
}

static int find_rule(gb *b, const char *name, size_t nlen) {
    if (!b->names) return -1;
    for (uint64_t i = name_hash(name, nlen) & b->names_mask; b->names[i]; i = (i + 1) & b->names_mask) {
        const char *n = b->rules[b->names[i] - 1].name;
        if (strlen(n) == nlen && !memcmp(n, name, nlen)) return b->names[i] - 1;
    }
    return -1;
}

static int names_put(gb *b, int r) {
    if ((b->n_names + 1) * 2 > b->names_mask + 1 || !b->names) {
        uint64_t cap = b->names ? (b->names_mask + 1) * 2 : 64;
        int *nn = calloc(cap, sizeof(int));
        if (!nn) return CM_ENOMEM;
        for (uint64_t i = 0; b->names && i <= b->names_mask; i++) {
            if (!b->names[i]) continue;
            const char *n = b->rules[b->names[i] - 1].name;
            uint64_t j = name_hash(n, strlen(n)) & (cap - 1);
            while (nn[j]) j = (j + 1) & (cap - 1);
            nn[j] = b->names[i];
        }
        free(b->names);
        b->names = nn;
        b->names_mask = cap - 1;
    }
    const char *n = b->rules[r].name;
    uint64_t j = name_hash(n, strlen(n)) & b->names_mask;
    while (b->names[j]) j = (j + 1) & b->names_mask;
    b->names[j] = r + 1;
    b->n_names++;
    return 0;
}

static int new_rule(gb *b, const char *name, size_t nlen) {
    if (b->n_rules >= MAX_RULES || gb_grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof(rule))) {
        b->oom = 1;
        return -1;
    }
    rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = malloc(nlen + 1);
        if (!r->name) { b->oom = 1; return -1; }
        memcpy(r->name, name, nlen);
        r->name[nlen] = 0;
    }
    int i = b->n_rules++;
    if (name && names_put(b, i)) { b->oom = 1; return -1; }
    return i;
}

/* A new, empty alternative of rule r; NULL when out of memory. */
static alt *new_alt(gb *b, int r) {
    rule *ru = &b->rules[r];
    if (gb_grow((void **)&ru->alts, &ru->cap_alts, ru->n_alts + 1, sizeof(alt))) { b->oom = 1; return NULL; }
    alt *a = &ru->alts[ru->n_alts++];
    memset(a, 0, sizeof *a);
    return a;
}

static void alt_push(gb *b, alt *a, uint32_t e) {
    if (!a || gb_grow((void **)&a->el, &a->cap, a->n + 1, sizeof(uint32_t))) { b->oom = 1; return; }
    a->el[a->n++] = e;
}

static int class_of(gb *b, const uint32_t bits[8]) {
    for (int i = 0; i < b->n_cls; i++)
        if (!memcmp(b->cls[i], bits, 32)) return i;
    if (gb_grow((void **)&b->cls, &b->cap_cls, b->n_cls + 1, 32)) { b->oom = 1; return 0; }
    memcpy(b->cls[b->n_cls], bits, 32);
    return b->n_cls++;
}

static uint32_t byte_elem(gb *b, uint8_t lo, uint8_t hi) {
    uint32_t bits[8] = { 0 };
    for (int c = lo; c <= hi; c++) bits[c >> 5] |= 1u << (c & 31);
    return EX_GE(EX_GE_CLASS, class_of(b, bits));
}

static void gb_free(gb *b) {
    for (int i = 0; i < b->n_rules; i++) {
        for (int k = 0; k < b->rules[i].n_alts; k++) free(b->rules[i].alts[k].el);
        free(b->rules[i].alts);
        free(b->rules[i].name);
    }
    free(b->rules);
    free(b->cls);
    free(b->names);
}

/* ---- code points to UTF-8 byte sequences ----------------------------------------------------- */

typedef struct cprange { uint32_t lo, hi; } cprange;

static int utf8_enc(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | c >> 6); o[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12); o[1] = (uint8_t)(0x80 | ((c >> 6) & 63)); o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18); o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63)); o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* Adds alternatives of rule r for code points [lo, hi] that all encode in the same number of
 * bytes (the classic split: until each byte position covers a whole range). ascii collects
 * single-byte ranges into one class. */
static void utf8_split(gb *b, int r, uint32_t lo, uint32_t hi, uint32_t ascii[8]) {
    if (lo > hi || b->oom) return;
    static const uint32_t lim[4] = { 0x7F, 0x7FF, 0xFFFF, 0x10FFFF };
    for (int n = 0; n < 4; n++) {
        uint32_t a = n ? lim[n - 1] + 1 : 0;
        if (lo < a && hi >= a) { utf8_split(b, r, lo, a - 1, ascii); utf8_split(b, r, a, hi, ascii); return; }
    }
    if (hi < 0x80) {
        for (uint32_t c = lo; c <= hi; c++) ascii[c >> 5] |= 1u << (c & 31);
        return;
    }
    int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) { utf8_split(b, r, lo, lo | m, ascii); utf8_split(b, r, (lo | m) + 1, hi, ascii); return; }
            if ((hi & m) != m) { utf8_split(b, r, lo, (hi & ~m) - 1, ascii); utf8_split(b, r, hi & ~m, hi, ascii); return; }
        }
    }
    uint8_t x[4], y[4];
    utf8_enc(lo, x);
    utf8_enc(hi, y);
    alt *a = new_alt(b, r);
    for (int i = 0; i < n; i++) alt_push(b, a, byte_elem(b, x[i], y[i]));
    alt_push(b, a, EX_GE(EX_GE_END, 0));
}

/* One element matching any code point in the ranges (sorted, disjoint, surrogates excluded):
 * a class when every one is ASCII, else a generated rule. */
static uint32_t cp_class(gb *b, const cprange *rg, int n) {
    int ascii_only = 1;
    for (int i = 0; i < n; i++) ascii_only &= rg[i].hi < 0x80;
    uint32_t ascii[8] = { 0 };
    if (ascii_only) {
        for (int i = 0; i < n; i++) utf8_split(b, -1, rg[i].lo, rg[i].hi, ascii);
        return EX_GE(EX_GE_CLASS, class_of(b, ascii));
    }
    int r = new_rule(b, NULL, 0);
    if (r < 0) return 0;
    b->rules[r].defined = 1;
    for (int i = 0; i < n; i++) utf8_split(b, r, rg[i].lo, rg[i].hi, ascii);
    int any = 0;
    for (int w = 0; w < 8; w++) any |= ascii[w] != 0;
    if (any) {
        alt *a = new_alt(b, r);
        alt_push(b, a, EX_GE(EX_GE_CLASS, class_of(b, ascii)));
        alt_push(b, a, EX_GE(EX_GE_END, 0));
    }
    return EX_GE(EX_GE_REF, r);
}

/* Sorts and merges ranges, removes the surrogates, negates when asked. Returns the new count. */
static int cp_normalize(cprange *rg, int n, int negate, cprange *out) {
    for (int i = 1; i < n; i++) { /* insertion sort */
        cprange x = rg[i];
        int j = i;
        while (j > 0 && rg[j - 1].lo > x.lo) { rg[j] = rg[j - 1]; j--; }
        rg[j] = x;
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && rg[i].lo <= out[m - 1].hi + 1) { if (rg[i].hi > out[m - 1].hi) out[m - 1].hi = rg[i].hi; }
        else out[m++] = rg[i];
    }
    if (negate) {
        cprange tmp[2 * 256 + 4];
        int k = 0;
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (out[i].lo > next) tmp[k++] = (cprange){ next, out[i].lo - 1 };
            next = out[i].hi + 1;
        }
        if (next <= 0x10FFFF) tmp[k++] = (cprange){ next, 0x10FFFF };
        memcpy(out, tmp, sizeof(cprange) * (size_t)k);
        m = k;
    }
    /* cut out U+D800..U+DFFF */
    cprange tmp[2 * 256 + 8];
    int k = 0;
    for (int i = 0; i < m; i++) {
        cprange x = out[i];
        if (x.hi < 0xD800 || x.lo > 0xDFFF) { tmp[k++] = x; continue; }
        if (x.lo < 0xD800) tmp[k++] = (cprange){ x.lo, 0xD7FF };
        if (x.hi > 0xDFFF) tmp[k++] = (cprange){ 0xE000, x.hi };
    }
    memcpy(out, tmp, sizeof(cprange) * (size_t)k);
    return k;
}

/* ============================================================================================
 * The parser
 * ========================================================================================== */

#define MAX_NEST 64 /* ( groups ) inside each other */

typedef struct ps {
    const char *s, *end, *p;
    gb  *b;
    char *err;
    size_t errlen;
    int  failed;
    int  depth;     /* groups open */
    int  cur_rule;  /* the rule whose alternative parse_class appends to */
} ps;

static void where(const ps *P, const char *at, int *line, int *col) {
    int l = 1, c = 1;
    for (const char *q = P->s; q < at && q < P->end; q++) {
        if (*q == '\n') { l++; c = 1; }
        else if (((unsigned char)*q & 0xC0) != 0x80) c++;
    }
    *line = l;
    *col = c;
}

static void perr(ps *P, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void perr(ps *P, const char *at, const char *fmt, ...) {
    if (P->failed) return;
    P->failed = 1;
    int l, c;
    where(P, at, &l, &c);
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(P->err, P->errlen, "grammar: line %d, column %d: %s", l, c, msg);
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when nl. */
static void skip(ps *P, int nl) {
    while (P->p < P->end) {
        char c = *P->p;
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) P->p++;
        else if (c == '#') { while (P->p < P->end && *P->p != '\n') P->p++; }
        else break;
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes one UTF-8 code point at P->p (no escapes). */
static int read_utf8(ps *P, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)P->p;
    size_t left = (size_t)(P->end - P->p);
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > left) { perr(P, P->p, "invalid UTF-8"); return -1; }
    uint32_t v = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) { perr(P, P->p, "invalid UTF-8"); return -1; }
        v = v << 6 | (s[i] & 63);
    }
    if ((n == 2 && v < 0x80) || (n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF)) {
        perr(P, P->p, "invalid UTF-8");
        return -1;
    }
    P->p += n;
    *cp = v;
    return 0;
}

/* One character of a literal or class, escapes decoded. */
static int read_char(ps *P, uint32_t *cp) {
    if (P->p >= P->end) { perr(P, P->p, "unexpected end of grammar"); return -1; }
    if (*P->p != '\\') return read_utf8(P, cp);
    const char *at = P->p++;
    if (P->p >= P->end) { perr(P, at, "unfinished escape"); return -1; }
    char c = *P->p++;
    int nhex = 0;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '0': *cp = 0; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': *cp = (unsigned char)c; return 0;
    case 'x': nhex = 2; break;
    case 'u': nhex = 4; break;
    case 'U': nhex = 8; break;
    default: perr(P, at, "unknown escape '\\%c'", c); return -1;
    }
    uint32_t v = 0;
    for (int i = 0; i < nhex; i++) {
        int h = P->p < P->end ? hexval(*P->p) : -1;
        if (h < 0) { perr(P, at, "escape '\\%c' needs %d hex digits", c, nhex); return -1; }
        v = v << 4 | (uint32_t)h;
        P->p++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { perr(P, at, "escape names no Unicode scalar value (U+%X)", v); return -1; }
    *cp = v;
    return 0;
}

static int parse_alts(ps *P, int r, int nested);
/* A [character class] into the last alternative of rule P->cur_rule (the caller refreshes its
 * pointer). Not inlined into parse_primary: its buffers stay off the recursion's stack. */
__attribute__((noinline)) static int parse_class(ps *P) {
    gb *b = P->b;
    const char *at = P->p++;
    int neg = 0;
    if (P->p < P->end && *P->p == '^') { neg = 1; P->p++; }
    cprange rg[256], out[2 * 256 + 8];
    int n = 0;
    while (P->p < P->end && *P->p != ']') {
        if (*P->p == '\n') { perr(P, at, "unterminated character class"); return -1; }
        uint32_t lo, hi;
        if (read_char(P, &lo)) return -1;
        hi = lo;
        if (P->p + 1 < P->end && *P->p == '-' && P->p[1] != ']') {
            P->p++;
            if (read_char(P, &hi)) return -1;
            if (hi < lo) { perr(P, at, "character range is backwards"); return -1; }
        }
        if (n == 256) { perr(P, at, "character class with more than 256 ranges"); return -1; }
        rg[n++] = (cprange){ lo, hi };
    }
    if (P->p >= P->end) { perr(P, at, "unterminated character class"); return -1; }
    P->p++;
    int m = cp_normalize(rg, n, neg, out);
    if (m == 0) { perr(P, at, "the character class matches nothing"); return -1; }
    uint32_t e = cp_class(b, out, m);
    rule *ru = &b->rules[P->cur_rule];
    alt_push(b, &ru->alts[ru->n_alts - 1], e);
    return 1;
}

/* A symbol for the items of a sequence: appended to a, possibly as a reference to a new rule.
 * Returns the number of elements appended (a literal appends one per byte) or -1. */
static int parse_primary(ps *P, alt **pa, int r, int *first) {
    gb *b = P->b;
    const char *at = P->p;
    char c = *P->p;
    *first = (*pa)->n;
    if (c == '"') {
        P->p++;
        int n = 0;
        while (P->p < P->end && *P->p != '"') {
            if (*P->p == '\n') { perr(P, at, "unterminated literal"); return -1; }
            uint32_t cp;
            if (read_char(P, &cp)) return -1;
            uint8_t buf[4];
            int k = utf8_enc(cp, buf);
            for (int i = 0; i < k; i++) alt_push(b, *pa, byte_elem(b, buf[i], buf[i]));
            n += k;
        }
        if (P->p >= P->end) { perr(P, at, "unterminated literal"); return -1; }
        P->p++;
        return n;
    }
    if (c == '[') {
        P->cur_rule = r;
        if (parse_class(P) < 0) return -1;
        *pa = &b->rules[r].alts[b->rules[r].n_alts - 1]; /* the rules array may have moved */
        return 1;
    }
    if (c == '.') {
        P->p++;
        if (b->any_char < 0) {
            cprange all[1] = { { 0, 0x10FFFF } }, out[4];
            int m = cp_normalize(all, 1, 0, out);
            uint32_t e = cp_class(b, out, m);
            b->any_char = (int)EX_GE_ARG(e);
        }
        *pa = &b->rules[r].alts[b->rules[r].n_alts - 1];
        alt_push(b, *pa, EX_GE(EX_GE_REF, b->any_char));
        return 1;
    }
    if (c == '(') {
        if (++P->depth > MAX_NEST) { perr(P, at, "groups nested deeper than %d", MAX_NEST); return -1; }
        P->p++;
        int g = new_rule(b, NULL, 0);
        if (g < 0) return -1;
        b->rules[g].defined = 1;
        skip(P, 1);
        if (parse_alts(P, g, 1)) return -1;
        skip(P, 1);
        if (P->p >= P->end || *P->p != ')') { perr(P, at, "'(' without its ')'"); return -1; }
        P->p++;
        P->depth--;
        *pa = &b->rules[r].alts[b->rules[r].n_alts - 1];
        alt_push(b, *pa, EX_GE(EX_GE_REF, g));
        return 1;
    }
    if (c == '<') {
        const char *q = P->p + 1;
        int32_t id = -1;
        if (q < P->end && *q == '[') {
            long long v = 0;
            int nd = 0;
            for (q++; q < P->end && *q >= '0' && *q <= '9' && nd < 10; q++, nd++) v = v * 10 + (*q - '0');
            if (!nd || q + 1 >= P->end || q[0] != ']' || q[1] != '>') { perr(P, at, "a token by id is written <[123]>"); return -1; }
            q += 2;
            int nv = b->v ? tok_n_vocab(b->v) : 0;
            if (v >= nv) { perr(P, at, "token id %lld is not in the vocabulary (%d tokens)", v, nv); return -1; }
            id = (int32_t)v;
        } else {
            const char *e = q;
            while (e < P->end && *e != '>' && *e != '\n') e++;
            if (e >= P->end || *e != '>') { perr(P, at, "a token is written <[id]> or <text>"); return -1; }
            /* the token whose vocabulary text is the whole <...> (e.g. <|python_tag|>, <think>) */
            size_t tl = (size_t)(e + 1 - P->p);
            id = b->v ? tok_find(b->v, P->p, tl) : -1;
            if (id < 0) { perr(P, at, "no token's text is '%.*s'", (int)(tl > 80 ? 80 : tl), P->p); return -1; }
            q = e + 1;
        }
        P->p = q;
        alt_push(b, *pa, EX_GE(EX_GE_TOKEN, id));
        return 1;
    }
    if (is_name_char(c)) {
        const char *s = P->p;
        while (P->p < P->end && is_name_char(*P->p)) P->p++;
        size_t nl = (size_t)(P->p - s);
        int t = find_rule(b, s, nl);
        if (t < 0) {
            t = new_rule(b, s, nl);
            if (t < 0) return -1;
            b->rules[t].at = (size_t)(s - P->s);
            *pa = &b->rules[r].alts[b->rules[r].n_alts - 1];
        }
        alt_push(b, *pa, EX_GE(EX_GE_REF, t));
        return 1;
    }
    perr(P, at, "unexpected '%c'", c);
    return -1;
}

/* Wraps elements [first, n) of a into a new rule when there are several (a literal before a
 * postfix operator) and returns the one element standing for them. */
static uint32_t as_symbol(gb *b, int r, int first) {
    alt *a = &b->rules[r].alts[b->rules[r].n_alts - 1];
    if (a->n - first == 1) return a->el[--a->n];
    int g = new_rule(b, NULL, 0);
    if (g < 0) return 0;
    b->rules[g].defined = 1;
    a = &b->rules[r].alts[b->rules[r].n_alts - 1];
    alt *ga = new_alt(b, g);
    a = &b->rules[r].alts[b->rules[r].n_alts - 1];
    for (int i = first; i < a->n; i++) alt_push(b, ga, a->el[i]);
    alt_push(b, ga, EX_GE(EX_GE_END, 0));
    a->n = first;
    return EX_GE(EX_GE_REF, g);
}

/* A rule for x repeated: min copies are appended to the caller's alternative, then (max < 0)
 * x* or (max > min) a chain of max - min optional copies. */
static void repeat(gb *b, int r, uint32_t x, int min, int max) {
    alt *a = &b->rules[r].alts[b->rules[r].n_alts - 1];
    for (int i = 0; i < min; i++) alt_push(b, a, x);
    if (max == min) return;
    int prev = -1;
    if (max < 0) { /* S ::= x S | ε */
        int s = new_rule(b, NULL, 0);
        if (s < 0) return;
        b->rules[s].defined = 1;
        b->rules[s].loop = 1;
        alt *sa = new_alt(b, s);
        alt_push(b, sa, x);
        alt_push(b, sa, EX_GE(EX_GE_REF, s));
        alt_push(b, sa, EX_GE(EX_GE_END, 0));
        alt_push(b, new_alt(b, s), EX_GE(EX_GE_END, 0));
        prev = s;
    } else { /* O_k ::= x O_{k-1} | ε, O_1 ::= x | ε */
        for (int k = 1; k <= max - min && !b->oom; k++) {
            int o = new_rule(b, NULL, 0);
            if (o < 0) return;
            b->rules[o].defined = 1;
            b->rules[o].loop = 1;
            alt *oa = new_alt(b, o);
            alt_push(b, oa, x);
            if (prev >= 0) alt_push(b, oa, EX_GE(EX_GE_REF, prev));
            alt_push(b, oa, EX_GE(EX_GE_END, 0));
            alt_push(b, new_alt(b, o), EX_GE(EX_GE_END, 0));
            prev = o;
        }
    }
    a = &b->rules[r].alts[b->rules[r].n_alts - 1];
    if (prev >= 0) alt_push(b, a, EX_GE(EX_GE_REF, prev));
}

static int read_int(ps *P, int *v) {
    long long x = 0;
    int n = 0;
    while (P->p < P->end && *P->p >= '0' && *P->p <= '9' && n < 9) { x = x * 10 + (*P->p++ - '0'); n++; }
    if (!n) return -1;
    *v = (int)x;
    return 0;
}

/* A sequence into a new alternative of rule r. */
static int parse_seq(ps *P, int r, int nested) {
    gb *b = P->b;
    alt *a = new_alt(b, r);
    if (!a) return -1;
    for (;;) {
        skip(P, nested);
        if (P->p >= P->end) break;
        char c = *P->p;
        if (c == '|' || c == ')' || c == '\n') break;
        int first;
        if (parse_primary(P, &a, r, &first) < 0) return -1;
        if (b->oom) { perr(P, P->p, "out of memory"); return -1; }
        a = &b->rules[r].alts[b->rules[r].n_alts - 1];
        if (P->p < P->end && (*P->p == '*' || *P->p == '+' || *P->p == '?' || *P->p == '{')) {
            const char *at = P->p;
            int min = 0, max = -1;
            char op = *P->p++;
            if (op == '+') min = 1;
            else if (op == '?') max = 1;
            else if (op == '{') {
                skip(P, 0);
                if (read_int(P, &min)) { perr(P, at, "'{' needs a count: {m}, {m,} or {m,n}"); return -1; }
                skip(P, 0);
                max = min;
                if (P->p < P->end && *P->p == ',') {
                    P->p++;
                    skip(P, 0);
                    max = -1;
                    if (P->p < P->end && *P->p != '}' && read_int(P, &max)) { perr(P, at, "bad repetition count"); return -1; }
                    skip(P, 0);
                }
                if (P->p >= P->end || *P->p != '}') { perr(P, at, "'{' without its '}'"); return -1; }
                P->p++;
                if ((max >= 0 && max < min) || min > MAX_REPEAT || max > MAX_REPEAT) {
                    perr(P, at, "repetition {%d,%d} (at most %d, and max >= min)", min, max, MAX_REPEAT);
                    return -1;
                }
            }
            uint32_t x = as_symbol(b, r, first);
            repeat(b, r, x, min, max);
            a = &b->rules[r].alts[b->rules[r].n_alts - 1];
        }
    }
    alt_push(b, a, EX_GE(EX_GE_END, 0));
    return b->oom ? -1 : 0;
}

static int parse_alts(ps *P, int r, int nested) {
    if (parse_seq(P, r, nested)) return -1;
    while (P->p < P->end && *P->p == '|') {
        P->p++;
        skip(P, 1);
        if (parse_seq(P, r, nested)) return -1;
    }
    return 0;
}

static int parse_rule(ps *P) {
    gb *b = P->b;
    const char *at = P->p;
    if (!is_name_char(*P->p)) { perr(P, at, "a rule starts with its name"); return -1; }
    const char *s = P->p;
    while (P->p < P->end && is_name_char(*P->p)) P->p++;
    size_t nl = (size_t)(P->p - s);
    skip(P, 0);
    if (P->end - P->p < 3 || memcmp(P->p, "::=", 3) != 0) { perr(P, P->p, "expected '::=' after the rule name"); return -1; }
    P->p += 3;
    int r = find_rule(b, s, nl);
    if (r >= 0 && b->rules[r].defined) { perr(P, at, "rule '%.*s' is defined twice", (int)nl, s); return -1; }
    if (r < 0 && (r = new_rule(b, s, nl)) < 0) { perr(P, at, "out of memory"); return -1; }
    b->rules[r].defined = 1;
    skip(P, 1);
    if (parse_alts(P, r, 0)) return -1;
    skip(P, 0);
    if (P->p < P->end && *P->p != '\n') { perr(P, P->p, "unexpected '%c' (a rule ends at the end of its line)", *P->p); return -1; }
    return 0;
}

/* 1 when rule r can be taken into a repetition loop's alternatives: a few short alternatives,
 * each starting with a terminal (so the loop stays free of left recursion), none referring to r. */
static int inlinable(const gb *b, int r) {
    const rule *ru = &b->rules[r];
    if (!ru->defined || ru->n_alts < 1 || ru->n_alts > 64) return 0;
    for (int k = 0; k < ru->n_alts; k++) {
        const alt *a = &ru->alts[k];
        if (a->n < 2 || a->n > 13) return 0; /* at least one element and its END */
        uint32_t k0 = EX_GE_KIND(a->el[0]);
        if (k0 != EX_GE_CLASS && k0 != EX_GE_TOKEN) return 0;
        for (int i = 0; i < a->n; i++)
            if (EX_GE_KIND(a->el[i]) == EX_GE_REF && (int)EX_GE_ARG(a->el[i]) == r) return 0;
    }
    return 1;
}

/* 1 when every alternative of rule r starts with a terminal. */
static int terminal_led(const gb *b, int r) {
    const rule *ru = &b->rules[r];
    if (!ru->defined || ru->n_alts < 1) return 0;
    for (int k = 0; k < ru->n_alts; k++) {
        uint32_t k0 = EX_GE_KIND(ru->alts[k].el[0]);
        if (ru->alts[k].n < 2 || (k0 != EX_GE_CLASS && k0 != EX_GE_TOKEN)) return 0;
    }
    return 1;
}

/* An alternative that is one reference to a generated, terminal-led rule (a character class
 * over code points, a group) takes that rule's alternatives in: json-char ::= <class> | ...
 * becomes json-char ::= <its UTF-8 byte sequences> | ..., which inline_loops can then take
 * into a loop. */
static void flatten_alts(gb *b) {
    int n = b->n_rules;
    for (int r = 0; r < n && !b->oom; r++) {
        rule *ru = &b->rules[r];
        int changed = 0;
        for (int k = 0; k < ru->n_alts; k++) {
            const alt *a = &ru->alts[k];
            int x = a->n == 2 && EX_GE_KIND(a->el[0]) == EX_GE_REF ? (int)EX_GE_ARG(a->el[0]) : -1;
            changed |= x >= 0 && x != r && !b->rules[x].name && terminal_led(b, x) && b->rules[x].n_alts <= 64;
        }
        if (!changed) continue;
        alt *old = ru->alts;
        int n_old = ru->n_alts;
        ru->alts = NULL;
        ru->n_alts = ru->cap_alts = 0;
        for (int k = 0; k < n_old && !b->oom; k++) {
            const alt *a = &old[k];
            int x = a->n == 2 && EX_GE_KIND(a->el[0]) == EX_GE_REF ? (int)EX_GE_ARG(a->el[0]) : -1;
            if (x >= 0 && x != r && !b->rules[x].name && terminal_led(b, x) && b->rules[x].n_alts <= 64) {
                for (int j = 0; j < b->rules[x].n_alts; j++) {
                    alt *na = new_alt(b, r);
                    for (int i = 0; i < b->rules[x].alts[j].n; i++) alt_push(b, na, b->rules[x].alts[j].el[i]);
                }
            } else {
                alt *na = new_alt(b, r);
                for (int i = 0; i < a->n; i++) alt_push(b, na, a->el[i]);
            }
        }
        for (int k = 0; k < n_old; k++) free(old[k].el);
        free(old);
    }
}

/* Repetition loops (S ::= x S | ε, and the chains of bounded repetitions) take a small x's
 * alternatives in: S ::= x1 S | x2 S | ... | ε. A run of x is then one frame of the parse
 * stack, so the mask engine decides the tokens that stay inside the run once per position
 * (a JSON string's characters: nearly every token) instead of leaving them uncertain. */
static void inline_loops(gb *b) {
    int n = b->n_rules;
    for (int r = 0; r < n && !b->oom; r++) {
        rule *ru = &b->rules[r];
        if (!ru->loop) continue;
        int changed = 0;
        for (int k = 0; k < ru->n_alts; k++) {
            const alt *a = &ru->alts[k];
            changed |= a->n >= 2 && EX_GE_KIND(a->el[0]) == EX_GE_REF && (int)EX_GE_ARG(a->el[0]) != r && inlinable(b, (int)EX_GE_ARG(a->el[0]));
        }
        if (!changed) continue;
        alt *old = ru->alts;
        int n_old = ru->n_alts;
        ru->alts = NULL;
        ru->n_alts = ru->cap_alts = 0;
        for (int k = 0; k < n_old && !b->oom; k++) {
            alt *a = &old[k];
            int x = a->n >= 2 && EX_GE_KIND(a->el[0]) == EX_GE_REF ? (int)EX_GE_ARG(a->el[0]) : -1;
            if (x < 0 || x == r || !inlinable(b, x)) { /* kept as it is */
                alt *na = new_alt(b, r);
                for (int i = 0; i < a->n; i++) alt_push(b, na, a->el[i]);
                continue;
            }
            for (int j = 0; j < b->rules[x].n_alts && !b->oom; j++) {
                alt *na = new_alt(b, r);
                const alt *xa = &b->rules[x].alts[j];
                for (int i = 0; i < xa->n - 1; i++) alt_push(b, na, xa->el[i]);
                for (int i = 1; i < a->n; i++) alt_push(b, na, a->el[i]);
            }
        }
        for (int k = 0; k < n_old; k++) free(old[k].el);
        free(old);
    }
}

/* Serializes the rules into a program. */
static int emit(gb *b, int root, uint32_t **prog, size_t *prog_len) {
    size_t n_el = 0;
    for (int i = 0; i < b->n_rules; i++) {
        for (int k = 0; k < b->rules[i].n_alts; k++) n_el += (size_t)b->rules[i].alts[k].n;
        n_el++;
    }
    size_t words = 6 + 8 * (size_t)b->n_cls + (size_t)b->n_rules + n_el;
    if (words * 4 > EX_GRAM_MAX_BYTES || n_el >= (1u << 24)) return CM_ETOOBIG;
    uint32_t *w = malloc(words * 4);
    if (!w) return CM_ENOMEM;
    w[0] = EX_GRAM_MAGIC;
    w[1] = EX_GRAM_VERSION;
    w[2] = (uint32_t)b->n_cls;
    w[3] = (uint32_t)b->n_rules;
    w[4] = (uint32_t)n_el;
    w[5] = (uint32_t)root;
    if (b->n_cls) memcpy(w + 6, b->cls, 32 * (size_t)b->n_cls); /* no classes: cls may be NULL */
    uint32_t *rs = w + 6 + 8 * (size_t)b->n_cls, *el = rs + b->n_rules, p = 0;
    for (int i = 0; i < b->n_rules; i++) {
        rs[i] = p;
        for (int k = 0; k < b->rules[i].n_alts; k++) {
            if (b->rules[i].alts[k].n) memcpy(el + p, b->rules[i].alts[k].el, 4 * (size_t)b->rules[i].alts[k].n);
            p += (uint32_t)b->rules[i].alts[k].n;
        }
        el[p++] = EX_GE(EX_GE_RULE_END, 0);
    }
    *prog = w;
    *prog_len = words * 4;
    return 0;
}

int tok_gram_compile(const char *src, size_t len, const tok_vocab *v, uint32_t **prog, size_t *prog_len, char *err,
                     size_t errlen) {
    *prog = NULL;
    *prog_len = 0;
    if (len > TOK_GBNF_MAX) {
        snprintf(err, errlen, "grammar: %zu bytes, at most %zu", len, TOK_GBNF_MAX);
        return CM_ETOOBIG;
    }
    gb b = { .any_char = -1, .v = v };
    ps P = { .s = src, .end = src + len, .p = src, .b = &b, .err = err, .errlen = errlen };
    int rc = 0;
    for (;;) {
        skip(&P, 1);
        if (P.p >= P.end) break;
        if (parse_rule(&P)) break;
    }
    if (b.oom && !P.failed) { snprintf(err, errlen, "out of memory"); rc = CM_ENOMEM; goto out; }
    if (P.failed) { rc = CM_EINVAL; goto out; }
    int root = find_rule(&b, "root", 4);
    if (root < 0 || !b.rules[root].defined) {
        snprintf(err, errlen, "grammar: no rule 'root' (the start symbol)");
        rc = CM_EINVAL;
        goto out;
    }
    for (int i = 0; i < b.n_rules; i++)
        if (!b.rules[i].defined) {
            int l, c;
            where(&P, src + b.rules[i].at, &l, &c);
            snprintf(err, errlen, "grammar: line %d, column %d: rule '%s' is used but not defined", l, c,
                     b.rules[i].name ? b.rules[i].name : "?");
            rc = CM_EINVAL;
            goto out;
        }
    flatten_alts(&b);
    inline_loops(&b);
    if (b.oom) { snprintf(err, errlen, "out of memory"); rc = CM_ENOMEM; goto out; }
    if ((rc = emit(&b, root, prog, prog_len))) {
        snprintf(err, errlen, rc == CM_ETOOBIG ? "grammar: the compiled grammar is larger than %zu bytes" : "out of memory",
                 EX_GRAM_MAX_BYTES);
        goto out;
    }
    char cerr[200];
    if (ex_gram_check(*prog, *prog_len, cerr, sizeof cerr)) {
        /* name the rule for the user: the program numbers rules as they were first seen */
        unsigned ri;
        const char *name = NULL;
        if (sscanf(cerr, "grammar program: rule %u is left-recursive", &ri) == 1 && ri < (unsigned)b.n_rules) name = b.rules[ri].name;
        if (name) snprintf(err, errlen, "grammar: rule '%s' is left-recursive (it reaches itself before any input)", name);
        else snprintf(err, errlen, "grammar: %s", cerr);
        free(*prog);
        *prog = NULL;
        *prog_len = 0;
        rc = CM_EINVAL;
    }
out:
    gb_free(&b);
    return rc;
}

int tok_gram_vocab(const tok_vocab *v, uint32_t **off, uint8_t **bytes, int *n) {
    int nv = tok_n_vocab(v);
    size_t total = 0;
    for (int i = 0; i < nv; i++) {
        int t = tok_type(v, i);
        size_t l = 0;
        if (t != TOK_TYPE_CONTROL && t != TOK_TYPE_UNKNOWN && t != TOK_TYPE_UNUSED) tok_piece_ref(v, i, &l);
        total += l;
    }
    *off = malloc(sizeof(uint32_t) * ((size_t)nv + 1));
    *bytes = malloc(total ? total : 1);
    if (!*off || !*bytes || total > UINT32_MAX) {
        free(*off);
        free(*bytes);
        *off = NULL;
        *bytes = NULL;
        return CM_ENOMEM;
    }
    uint32_t o = 0;
    for (int i = 0; i < nv; i++) {
        (*off)[i] = o;
        int t = tok_type(v, i);
        if (t == TOK_TYPE_CONTROL || t == TOK_TYPE_UNKNOWN || t == TOK_TYPE_UNUSED) continue;
        size_t l = 0;
        const char *p = tok_piece_ref(v, i, &l);
        if (p && l) memcpy(*bytes + o, p, l);
        o += (uint32_t)l;
    }
    (*off)[nv] = o;
    *n = nv;
    return 0;
}

/* ============================================================================================
 * GBNF text builder
 * ========================================================================================== */

void tok_gbnf_init(tok_gbnf *d) { memset(d, 0, sizeof *d); }

void tok_gbnf_free(tok_gbnf *d) {
    free(d->s);
    memset(d, 0, sizeof *d);
}

static void gbnf_reserve(tok_gbnf *d, size_t more) {
    if (d->oom || d->len + more + 1 <= d->cap) return;
    size_t c = d->cap ? d->cap : 1024;
    while (c < d->len + more + 1) c *= 2;
    char *n = realloc(d->s, c);
    if (!n) { d->oom = 1; return; }
    d->s = n;
    d->cap = c;
}

void tok_gbnf_add(tok_gbnf *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) { d->oom = 1; return; }
    gbnf_reserve(d, (size_t)n);
    if (d->oom) return;
    va_start(ap, fmt);
    vsnprintf(d->s + d->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    d->len += (size_t)n;
}

void tok_gbnf_lit(tok_gbnf *d, const char *s, size_t len) {
    gbnf_reserve(d, len * 4 + 2);
    if (d->oom) return;
    char *o = d->s + d->len;
    *o++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
        else if (c == '\n') { *o++ = '\\'; *o++ = 'n'; }
        else if (c == '\r') { *o++ = '\\'; *o++ = 'r'; }
        else if (c == '\t') { *o++ = '\\'; *o++ = 't'; }
        else if (c < 0x20 || c == 0x7f) { o += sprintf(o, "\\x%02X", c); }
        else *o++ = (char)c;
    }
    *o++ = '"';
    *o = 0;
    d->len = (size_t)(o - d->s);
}

/* ============================================================================================
 * Cache
 * ========================================================================================== */

typedef struct centry {
    uint64_t  h;
    char     *key;
    size_t    klen;
    uint32_t *prog;
    size_t    plen;
    uint64_t  used;
} centry;

struct tok_gram_cache {
    pthread_mutex_t mu;
    centry *e;
    int     n, cap;
    uint64_t tick;
};

int tok_gram_cache_create(int cap, tok_gram_cache **out) {
    *out = NULL;
    tok_gram_cache *c = calloc(1, sizeof *c);
    if (!c || cap < 1 || !(c->e = calloc((size_t)cap, sizeof(centry)))) {
        free(c);
        return cap < 1 ? CM_EINVAL : CM_ENOMEM;
    }
    c->cap = cap;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return 0;
}

void tok_gram_cache_destroy(tok_gram_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        free(c->e[i].prog);
    }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static uint64_t key_hash(const char *k, size_t n) { return ex_gram_hash(k, n); }

int tok_gram_cache_get(tok_gram_cache *c, const char *key, size_t klen, uint32_t **prog, size_t *prog_len) {
    *prog = NULL;
    *prog_len = 0;
    uint64_t h = key_hash(key, klen);
    int rc = CM_ENOTFOUND;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        centry *e = &c->e[i];
        if (e->h != h || e->klen != klen || memcmp(e->key, key, klen)) continue;
        e->used = ++c->tick;
        *prog = malloc(e->plen);
        if (*prog) {
            memcpy(*prog, e->prog, e->plen);
            *prog_len = e->plen;
            rc = 0;
        } else rc = CM_ENOMEM;
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int tok_gram_cache_put(tok_gram_cache *c, const char *key, size_t klen, const uint32_t *prog, size_t prog_len) {
    char *k = malloc(klen ? klen : 1);
    uint32_t *p = malloc(prog_len ? prog_len : 4);
    if (!k || !p) {
        free(k);
        free(p);
        return CM_ENOMEM;
    }
    memcpy(k, key, klen);
    memcpy(p, prog, prog_len);
    uint64_t h = key_hash(key, klen);
    pthread_mutex_lock(&c->mu);
    int slot = -1;
    for (int i = 0; i < c->n && slot < 0; i++)
        if (c->e[i].h == h && c->e[i].klen == klen && !memcmp(c->e[i].key, key, klen)) slot = i;
    if (slot < 0 && c->n < c->cap) slot = c->n++;
    if (slot < 0) { /* least recently used out */
        slot = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[slot].used) slot = i;
    }
    centry *e = &c->e[slot];
    free(e->key);
    free(e->prog);
    *e = (centry){ h, k, klen, p, prog_len, ++c->tick };
    pthread_mutex_unlock(&c->mu);
    return 0;
}
