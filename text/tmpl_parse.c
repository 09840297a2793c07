/* tmpl_parse: lexer (whitespace control, trim_blocks/lstrip_blocks, raw, comments) and the
 * recursive-descent parser producing the AST of tmpl_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "tmpl_internal.h"

enum { K_EOF, K_TEXT, K_VAR_B, K_VAR_E, K_BLK_B, K_BLK_E, K_NAME, K_STR, K_INT, K_FLOAT, K_OP };
enum { O_POW = 256, O_FLOORDIV, O_EQ, O_NE, O_LE, O_GE };

#define MAX_NEST 200 /* parser recursion (expressions and nested statements) */

typedef struct ltok {
    int type, op, line, col;
    const char *p; size_t n; /* NAME/TEXT: slice of the source; STR: decoded, in the arena */
    int64_t i; double f;
} ltok;

typedef struct lexer {
    const char *src; size_t len;
    tmpl_arena *a;
    ltok *t; size_t nt, cap;
    size_t lc_off; int lc_line, lc_col; /* incremental offset -> line/column */
    char *err; size_t errlen;
} lexer;

static void linecol(lexer *L, size_t off, int *line, int *col) {
    if (off < L->lc_off) { L->lc_off = 0; L->lc_line = 1; L->lc_col = 1; }
    for (; L->lc_off < off && L->lc_off < L->len; L->lc_off++) {
        if (L->src[L->lc_off] == '\n') { L->lc_line++; L->lc_col = 1; }
        else if (((uint8_t)L->src[L->lc_off] & 0xC0) != 0x80) L->lc_col++;
    }
    *line = L->lc_line;
    *col = L->lc_col;
}

static int lerr(lexer *L, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int lerr(lexer *L, size_t off, const char *fmt, ...) {
    int line, col;
    linecol(L, off, &line, &col);
    if (L->err && L->errlen) {
        int k = snprintf(L->err, L->errlen, "line %d, column %d: ", line, col);
        if (k >= 0 && (size_t)k < L->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(L->err + k, L->errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return CM_ETEMPLATE;
}

static ltok *push(lexer *L, int type, size_t off) {
    if (L->nt == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        ltok *nt = realloc(L->t, nc * sizeof *nt);
        if (!nt) return NULL;
        L->t = nt;
        L->cap = nc;
    }
    ltok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    linecol(L, off, &t->line, &t->col);
    return t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int emit_text(lexer *L, size_t b, size_t e) {
    if (e <= b) return 0;
    ltok *t = push(L, K_TEXT, b);
    if (!t) return CM_ENOMEM;
    t->p = L->src + b;
    t->n = e - b;
    return 0;
}

/* Text in [b, e) before a tag at e: whitespace control decides how much of it stays. */
static size_t text_end(lexer *L, size_t b, size_t e, char tag, char mod) {
    const char *s = L->src;
    if (mod == '-') {
        while (e > b && is_ws(s[e - 1])) e--;
    } else if ((tag == '%' || tag == '#') && mod != '+') { /* lstrip_blocks */
        size_t j = e;
        while (j > b && (s[j - 1] == ' ' || s[j - 1] == '\t')) j--;
        if (j == 0 || s[j - 1] == '\n' || s[j - 1] == '\r') e = j;
    }
    return e;
}

/* After a closing tag: '-' strips all whitespace; trim_blocks drops one newline after %} #}. */
static size_t after_close(lexer *L, size_t pos, size_t end, int strip, int block) {
    if (strip) { while (pos < end && is_ws(L->src[pos])) pos++; }
    else if (block) {
        if (pos < end && L->src[pos] == '\n') pos++;
        else if (pos + 1 < end && L->src[pos] == '\r' && L->src[pos + 1] == '\n') pos += 2;
    }
    return pos;
}

static void put_utf8(char *d, size_t *w, uint32_t cp) {
    if (cp < 0x80) d[(*w)++] = (char)cp;
    else if (cp < 0x800) { d[(*w)++] = (char)(0xC0 | (cp >> 6)); d[(*w)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        d[(*w)++] = (char)(0xE0 | (cp >> 12)); d[(*w)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[(*w)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        d[(*w)++] = (char)(0xF0 | (cp >> 18)); d[(*w)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        d[(*w)++] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[(*w)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(const char *p, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* String literal at *pos (the quote): decoded into the arena. Python escapes. */
static int lex_string(lexer *L, size_t *pos, size_t end) {
    const char *s = L->src;
    size_t start = *pos, i = start + 1;
    char q = s[start];
    size_t close = i;
    while (close < end && s[close] != q) close += s[close] == '\\' ? 2 : 1;
    if (close >= end) return lerr(L, start, "unterminated string literal");
    char *d = tmpl__alloc(L->a, close - i + 1);
    if (!d) return CM_ENOMEM;
    size_t w = 0;
    while (i < close) {
        char c = s[i++];
        if (c != '\\') { d[w++] = c; continue; }
        char e = s[i++];
        uint32_t cp;
        switch (e) {
        case 'n': d[w++] = '\n'; break;
        case 't': d[w++] = '\t'; break;
        case 'r': d[w++] = '\r'; break;
        case 'b': d[w++] = '\b'; break;
        case 'f': d[w++] = '\f'; break;
        case 'v': d[w++] = '\v'; break;
        case 'a': d[w++] = '\a'; break;
        case '0': d[w++] = '\0'; break;
        case '\\': case '\'': case '"': d[w++] = e; break;
        case '\n': break; /* line continuation */
        case 'x': case 'u': case 'U': {
            int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (i + (size_t)n > close || hexval(s + i, n, &cp)) return lerr(L, i - 2, "bad \\%c escape", e);
            i += (size_t)n;
            if (e == 'u' && cp >= 0xD800 && cp < 0xDC00 && i + 6 <= close && s[i] == '\\' && s[i + 1] == 'u') {
                uint32_t lo;
                if (!hexval(s + i + 2, 4, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if ((cp >= 0xD800 && cp < 0xE000) || cp > 0x10FFFF) cp = 0xFFFD;
            /* the escape text is at least as long as its UTF-8 form except \xNN >= 0x80 (2 bytes
             * for 4 of source): always fits in close - start */
            put_utf8(d, &w, cp);
            break;
        }
        default: d[w++] = '\\'; d[w++] = e; break; /* Python keeps unknown escapes */
        }
    }
    d[w] = 0;
    ltok *t = push(L, K_STR, start);
    if (!t) return CM_ENOMEM;
    t->p = d;
    t->n = w;
    *pos = close + 1;
    return 0;
}

static int lex_number(lexer *L, size_t *pos, size_t end) {
    const char *s = L->src;
    size_t b = *pos, i = b;
    char buf[64];
    size_t w = 0;
    int is_float = 0;
    int after_dot = L->nt && L->t[L->nt - 1].type == K_OP && L->t[L->nt - 1].op == '.';
    while (i < end && (is_digit(s[i]) || (s[i] == '_' && i + 1 < end && is_digit(s[i + 1])))) {
        if (s[i] != '_' && w < sizeof buf - 1) buf[w++] = s[i];
        i++;
    }
    if (!after_dot && i + 1 < end && s[i] == '.' && is_digit(s[i + 1])) {
        is_float = 1;
        buf[w < sizeof buf - 1 ? w++ : w] = '.';
        i++;
        while (i < end && is_digit(s[i])) { if (w < sizeof buf - 1) buf[w++] = s[i]; i++; }
    }
    if (!after_dot && i < end && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < end && (s[j] == '+' || s[j] == '-')) j++;
        if (j < end && is_digit(s[j])) {
            is_float = 1;
            for (size_t k = i; k < j; k++) if (w < sizeof buf - 1) buf[w++] = s[k];
            i = j;
            while (i < end && is_digit(s[i])) { if (w < sizeof buf - 1) buf[w++] = s[i]; i++; }
        }
    }
    buf[w] = 0;
    ltok *t = push(L, is_float ? K_FLOAT : K_INT, b);
    if (!t) return CM_ENOMEM;
    if (is_float) t->f = strtod(buf, NULL);
    else {
        char *e;
        unsigned long long v = strtoull(buf, &e, 10);
        if (w > 19 || v > (unsigned long long)INT64_MAX) return lerr(L, b, "integer literal too large");
        t->i = (int64_t)v;
    }
    *pos = i;
    return 0;
}

static int lex_op(lexer *L, size_t *pos, size_t end) {
    const char *s = L->src;
    size_t i = *pos;
    char c = s[i], n = i + 1 < end ? s[i + 1] : 0;
    int op = 0, len = 2;
    if (c == '*' && n == '*') op = O_POW;
    else if (c == '/' && n == '/') op = O_FLOORDIV;
    else if (c == '=' && n == '=') op = O_EQ;
    else if (c == '!' && n == '=') op = O_NE;
    else if (c == '<' && n == '=') op = O_LE;
    else if (c == '>' && n == '=') op = O_GE;
    else if (strchr("+-*/%~<>=.,:|()[]{}", c) && c) { op = (unsigned char)c; len = 1; }
    else {
        if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f) return lerr(L, i, "unexpected character (byte 0x%02x)", (unsigned char)c);
        return lerr(L, i, "unexpected character '%c'", c);
    }
    ltok *t = push(L, K_OP, i);
    if (!t) return CM_ENOMEM;
    t->op = op;
    *pos = i + (size_t)len;
    return 0;
}

/* {% raw %} at q (pos just past "{%" and the modifier): returns 1 and lexes the raw block when
 * it is one, 0 when it is another statement. */
static int try_raw(lexer *L, size_t q, char mod, size_t *pos, size_t end, int *rc) {
    const char *s = L->src;
    size_t i = *pos;
    while (i < end && is_ws(s[i])) i++;
    if (i + 3 > end || memcmp(s + i, "raw", 3) || (i + 3 < end && (is_alpha(s[i + 3]) || is_digit(s[i + 3])))) return 0;
    i += 3;
    while (i < end && is_ws(s[i])) i++;
    int strip_in = 0;
    if (i < end && s[i] == '-') { strip_in = 1; i++; }
    if (i + 2 > end || s[i] != '%' || s[i + 1] != '}') return 0;
    (void)mod;
    size_t body = i + 2;
    body = after_close(L, body, end, strip_in, 1);
    /* find {% [-+]? endraw [-]? %} */
    for (size_t k = body; k + 1 < end; k++) {
        if (s[k] != '{' || s[k + 1] != '%') continue;
        size_t j = k + 2;
        char emod = 0;
        if (j < end && (s[j] == '-' || s[j] == '+')) emod = s[j++];
        while (j < end && is_ws(s[j])) j++;
        if (j + 6 > end || memcmp(s + j, "endraw", 6)) continue;
        j += 6;
        while (j < end && is_ws(s[j])) j++;
        int strip_out = 0;
        if (j < end && s[j] == '-') { strip_out = 1; j++; }
        if (j + 2 > end || s[j] != '%' || s[j + 1] != '}') continue;
        size_t te = text_end(L, body, k, '%', emod);
        if ((*rc = emit_text(L, body, te))) return 1;
        *pos = after_close(L, j + 2, end, strip_out, 1);
        return 1;
    }
    *rc = lerr(L, q, "unterminated raw block (missing {%% endraw %%})");
    return 1;
}

static int lex(lexer *L) {
    const char *s = L->src;
    size_t end = L->len, pos = 0;
    if (end && s[end - 1] == '\n') end--; /* one trailing newline is dropped */
    int rc;
    while (pos < end) {
        size_t q = pos;
        while (q + 1 < end && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= end) { if ((rc = emit_text(L, pos, end))) return rc; break; }
        char tag = s[q + 1];
        char mod = q + 2 < end && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        if ((rc = emit_text(L, pos, text_end(L, pos, q, tag, mod)))) return rc;
        pos = q + 2 + (mod ? 1 : 0);
        if (tag == '#') {
            size_t c = pos;
            while (c + 1 < end && !(s[c] == '#' && s[c + 1] == '}')) c++;
            if (c + 1 >= end) return lerr(L, q, "unterminated comment");
            int strip = c > pos && s[c - 1] == '-';
            pos = after_close(L, c + 2, end, strip, 1);
            continue;
        }
        if (tag == '%' && try_raw(L, q, mod, &pos, end, &rc)) {
            if (rc) return rc;
            continue;
        }
        ltok *open = push(L, tag == '%' ? K_BLK_B : K_VAR_B, q);
        if (!open) return CM_ENOMEM;
        int depth = 0; /* { } nesting inside {{ }} */
        for (;;) {
            while (pos < end && is_ws(s[pos])) pos++;
            if (pos >= end) return lerr(L, q, "unclosed '%s' (missing '%s')", tag == '%' ? "{%" : "{{", tag == '%' ? "%}" : "}}");
            char c = s[pos], c1 = pos + 1 < end ? s[pos + 1] : 0, c2 = pos + 2 < end ? s[pos + 2] : 0;
            char cl = tag == '%' ? '%' : '}';
            int strip = c == '-' && c1 == cl && c2 == '}';
            int keep = tag == '%' && c == '+' && c1 == '%' && c2 == '}'; /* +%}: no trim_blocks */
            if ((strip || keep || (c == cl && c1 == '}')) && (tag == '%' || depth == 0)) {
                if (!push(L, tag == '%' ? K_BLK_E : K_VAR_E, pos)) return CM_ENOMEM;
                pos = after_close(L, pos + (strip || keep ? 3 : 2), end, strip, tag == '%' && !keep);
                break;
            }
            if (is_alpha(c)) {
                size_t b = pos;
                while (pos < end && (is_alpha(s[pos]) || is_digit(s[pos]))) pos++;
                ltok *t = push(L, K_NAME, b);
                if (!t) return CM_ENOMEM;
                t->p = s + b;
                t->n = pos - b;
            } else if (is_digit(c)) {
                if ((rc = lex_number(L, &pos, end))) return rc;
            } else if (c == '\'' || c == '"') {
                if ((rc = lex_string(L, &pos, end))) return rc;
            } else {
                if ((rc = lex_op(L, &pos, end))) return rc;
                if (c == '{') depth++;
                else if (c == '}' && depth > 0) depth--;
            }
        }
    }
    return push(L, K_EOF, end) ? 0 : CM_ENOMEM;
}

/* ---- parser ------------------------------------------------------------------------------- */
typedef struct parser {
    lexer *L;
    tmpl_arena *a;
    size_t i;
    int nest, loops;
} parser;

typedef struct nvec { tnode **v; int n, cap; } nvec;

static int nv_push(nvec *v, tnode *n) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 8;
        tnode **nn = realloc(v->v, (size_t)nc * sizeof *nn);
        if (!nn) return CM_ENOMEM;
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = n;
    return 0;
}

/* Moves the vector into the arena. */
static int nv_done(parser *P, nvec *v, tnode ***out, int *n) {
    *out = NULL;
    *n = v->n;
    if (v->n) {
        *out = tmpl__alloc(P->a, (size_t)v->n * sizeof **out);
        if (!*out) { free(v->v); return CM_ENOMEM; }
        memcpy(*out, v->v, (size_t)v->n * sizeof **out);
    }
    free(v->v);
    memset(v, 0, sizeof *v);
    return 0;
}

static ltok *cur(parser *P) { return &P->L->t[P->i]; }
static ltok *peek(parser *P, int k) {
    size_t j = P->i + (size_t)k;
    return j < P->L->nt ? &P->L->t[j] : &P->L->t[P->L->nt - 1];
}
static int is_op(ltok *t, int op) { return t->type == K_OP && t->op == op; }
static int is_name(ltok *t, const char *w) { return t->type == K_NAME && strlen(w) == t->n && !memcmp(t->p, w, t->n); }

static const char *tok_desc(ltok *t, char *buf, size_t cap) {
    switch (t->type) {
    case K_EOF: return "end of template";
    case K_TEXT: return "text";
    case K_VAR_B: return "'{{'";
    case K_VAR_E: return "'}}'";
    case K_BLK_B: return "'{%'";
    case K_BLK_E: return "'%}'";
    case K_NAME: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    case K_STR: return "string";
    case K_INT: case K_FLOAT: return "number";
    default:
        if (t->op < 256) snprintf(buf, cap, "'%c'", t->op);
        else snprintf(buf, cap, "'%s'", t->op == O_POW ? "**" : t->op == O_FLOORDIV ? "//" : t->op == O_EQ ? "==" :
                                          t->op == O_NE ? "!=" : t->op == O_LE ? "<=" : ">=");
        return buf;
    }
}

static int perr(parser *P, ltok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *P, ltok *t, const char *fmt, ...) {
    lexer *L = P->L;
    if (L->err && L->errlen) {
        int k = snprintf(L->err, L->errlen, "line %d, column %d: ", t->line, t->col);
        if (k >= 0 && (size_t)k < L->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(L->err + k, L->errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return CM_ETEMPLATE;
}

static int unexpected(parser *P, const char *what) {
    char buf[64];
    return perr(P, cur(P), "expected %s, got %s", what, tok_desc(cur(P), buf, sizeof buf));
}

static tnode *node(parser *P, int kind, ltok *at) {
    tnode *n = tmpl__alloc(P->a, sizeof *n);
    if (!n) return NULL;
    memset(n, 0, sizeof *n);
    n->kind = (uint16_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static int expect_op(parser *P, int op, const char *what) {
    if (!is_op(cur(P), op)) return unexpected(P, what);
    P->i++;
    return 0;
}

static int expect_type(parser *P, int type, const char *what) {
    if (cur(P)->type != type) return unexpected(P, what);
    P->i++;
    return 0;
}

static int parse_expr(parser *P, int with_cond, tnode **out);
static int parse_unary(parser *P, int with_filter, tnode **out);

#define NEST_IN(P) do { if (++(P)->nest > MAX_NEST) return perr((P), cur(P), "nesting deeper than %d", MAX_NEST); } while (0)
#define NEST_OUT(P) ((P)->nest--)

/* (args) after the '(': positional and name=value; fills n->v/nv and names/w/nw. */
static int parse_args(parser *P, tnode *n) {
    nvec pos = {0}, kw = {0};
    tname names[64];
    int nk = 0, rc = 0;
    while (!is_op(cur(P), ')')) {
        tnode *e;
        if (cur(P)->type == K_NAME && is_op(peek(P, 1), '=')) {
            if (nk == 64) { rc = perr(P, cur(P), "too many keyword arguments"); break; }
            names[nk].p = cur(P)->p;
            names[nk].n = cur(P)->n;
            P->i += 2;
            if ((rc = parse_expr(P, 1, &e)) || (rc = nv_push(&kw, e))) break;
            nk++;
        } else {
            if (kw.n) { rc = perr(P, cur(P), "positional argument after keyword argument"); break; }
            if ((rc = parse_expr(P, 1, &e)) || (rc = nv_push(&pos, e))) break;
        }
        if (is_op(cur(P), ',')) { P->i++; continue; }
        if (!is_op(cur(P), ')')) { rc = unexpected(P, "',' or ')'"); break; }
    }
    if (rc) { free(pos.v); free(kw.v); return rc; }
    P->i++; /* ')' */
    if ((rc = nv_done(P, &pos, &n->v, &n->nv)) || (rc = nv_done(P, &kw, &n->w, &n->nw))) return rc;
    if (nk) {
        if (!(n->names = tmpl__alloc(P->a, (size_t)nk * sizeof *n->names))) return CM_ENOMEM;
        memcpy(n->names, names, (size_t)nk * sizeof *names);
        n->nnames = nk;
    }
    return 0;
}

static tmpl_value *lit_value(parser *P, ltok *t) {
    switch (t->type) {
    case K_INT: return tmpl__v_int(P->a, t->i);
    case K_FLOAT: return tmpl__v_float(P->a, t->f);
    default: return NULL;
    }
}

static int parse_primary(parser *P, tnode **out) {
    ltok *t = cur(P);
    tnode *n = NULL;
    int rc = 0;
    NEST_IN(P);
    if (t->type == K_NAME) {
        P->i++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False") ||
            is_name(t, "none") || is_name(t, "None")) {
            if (!(n = node(P, N_LIT, t))) return CM_ENOMEM;
            n->lit = t->p[0] == 'n' || t->p[0] == 'N' ? &tmpl__nonev : tmpl__bool(t->p[0] == 't' || t->p[0] == 'T');
        } else {
            if (!(n = node(P, N_NAME, t))) return CM_ENOMEM;
            n->name.p = t->p;
            n->name.n = t->n;
        }
    } else if (t->type == K_STR) {
        /* adjacent literals concatenate */
        size_t total = 0, j = P->i;
        while (P->L->t[j].type == K_STR) total += P->L->t[j++].n;
        char *d = tmpl__alloc(P->a, total + 1);
        if (!d) return CM_ENOMEM;
        size_t w = 0;
        while (cur(P)->type == K_STR) { memcpy(d + w, cur(P)->p, cur(P)->n); w += cur(P)->n; P->i++; }
        d[w] = 0;
        if (!(n = node(P, N_LIT, t)) || !(n->lit = tmpl__v_str(P->a, d, w, 0))) return CM_ENOMEM;
    } else if (t->type == K_INT || t->type == K_FLOAT) {
        P->i++;
        if (!(n = node(P, N_LIT, t)) || !(n->lit = lit_value(P, t))) return CM_ENOMEM;
    } else if (is_op(t, '(')) {
        P->i++;
        if (is_op(cur(P), ')')) {
            P->i++;
            if (!(n = node(P, N_TUPLE, t))) return CM_ENOMEM;
        } else {
            tnode *e;
            if ((rc = parse_expr(P, 1, &e))) return rc;
            if (is_op(cur(P), ',')) {
                nvec items = {0};
                if ((rc = nv_push(&items, e))) return rc;
                while (is_op(cur(P), ',')) {
                    P->i++;
                    if (is_op(cur(P), ')')) break;
                    if ((rc = parse_expr(P, 1, &e)) || (rc = nv_push(&items, e))) { free(items.v); return rc; }
                }
                if (!(n = node(P, N_TUPLE, t))) { free(items.v); return CM_ENOMEM; }
                if ((rc = nv_done(P, &items, &n->v, &n->nv))) return rc;
            } else {
                n = e;
            }
            if ((rc = expect_op(P, ')', "')'"))) return rc;
        }
    } else if (is_op(t, '[')) {
        P->i++;
        nvec items = {0};
        while (!is_op(cur(P), ']')) {
            tnode *e;
            if ((rc = parse_expr(P, 1, &e)) || (rc = nv_push(&items, e))) { free(items.v); return rc; }
            if (is_op(cur(P), ',')) { P->i++; continue; }
            if (!is_op(cur(P), ']')) { free(items.v); return unexpected(P, "',' or ']'"); }
        }
        P->i++;
        if (!(n = node(P, N_LIST, t))) { free(items.v); return CM_ENOMEM; }
        if ((rc = nv_done(P, &items, &n->v, &n->nv))) return rc;
    } else if (is_op(t, '{')) {
        P->i++;
        nvec keys = {0}, vals = {0};
        while (!is_op(cur(P), '}')) {
            tnode *k, *v;
            if ((rc = parse_expr(P, 1, &k)) || (rc = expect_op(P, ':', "':'")) || (rc = parse_expr(P, 1, &v)) ||
                (rc = nv_push(&keys, k)) || (rc = nv_push(&vals, v))) { free(keys.v); free(vals.v); return rc; }
            if (is_op(cur(P), ',')) { P->i++; continue; }
            if (!is_op(cur(P), '}')) { free(keys.v); free(vals.v); return unexpected(P, "',' or '}'"); }
        }
        P->i++;
        if (!(n = node(P, N_DICT, t))) { free(keys.v); free(vals.v); return CM_ENOMEM; }
        if ((rc = nv_done(P, &keys, &n->v, &n->nv)) || (rc = nv_done(P, &vals, &n->w, &n->nw))) return rc;
    } else {
        return unexpected(P, "an expression");
    }
    NEST_OUT(P);
    *out = n;
    return 0;
}

static int parse_postfix(parser *P, tnode **io) {
    int rc;
    for (;;) {
        ltok *t = cur(P);
        if (is_op(t, '.')) {
            P->i++;
            ltok *a = cur(P);
            tnode *n;
            if (a->type == K_NAME) {
                if (!(n = node(P, N_ATTR, t))) return CM_ENOMEM;
                n->name.p = a->p;
                n->name.n = a->n;
            } else if (a->type == K_INT) {
                if (!(n = node(P, N_ITEM, t)) || !(n->b = node(P, N_LIT, a)) || !(n->b->lit = lit_value(P, a))) return CM_ENOMEM;
            } else {
                return unexpected(P, "an attribute name after '.'");
            }
            P->i++;
            n->a = *io;
            *io = n;
        } else if (is_op(t, '[')) {
            P->i++;
            tnode *parts[3] = {NULL, NULL, NULL};
            int slice = 0;
            if (!is_op(cur(P), ':') && (rc = parse_expr(P, 1, &parts[0]))) return rc;
            if (is_op(cur(P), ':')) {
                slice = 1;
                P->i++;
                if (!is_op(cur(P), ':') && !is_op(cur(P), ']') && (rc = parse_expr(P, 1, &parts[1]))) return rc;
                if (is_op(cur(P), ':')) {
                    P->i++;
                    if (!is_op(cur(P), ']') && (rc = parse_expr(P, 1, &parts[2]))) return rc;
                }
            }
            if ((rc = expect_op(P, ']', "']'"))) return rc;
            tnode *n = node(P, slice ? N_SLICE : N_ITEM, t);
            if (!n) return CM_ENOMEM;
            n->a = *io;
            if (slice) {
                if (!(n->v = tmpl__alloc(P->a, 3 * sizeof *n->v))) return CM_ENOMEM;
                memcpy(n->v, parts, sizeof parts);
                n->nv = 3;
            } else {
                n->b = parts[0];
            }
            *io = n;
        } else if (is_op(t, '(')) {
            P->i++;
            tnode *n = node(P, N_CALL, t);
            if (!n) return CM_ENOMEM;
            n->a = *io;
            if ((rc = parse_args(P, n))) return rc;
            *io = n;
        } else {
            return 0;
        }
    }
}

static int parse_filters(parser *P, tnode **io) {
    int rc;
    for (;;) {
        ltok *t = cur(P);
        if (is_op(t, '|')) {
            P->i++;
            ltok *f = cur(P);
            if (f->type != K_NAME) return unexpected(P, "a filter name after '|'");
            P->i++;
            tnode *n = node(P, N_FILTER, f);
            if (!n) return CM_ENOMEM;
            n->name.p = f->p;
            n->name.n = f->n;
            if (!tmpl__filter_known(f->p, f->n)) return perr(P, f, "unknown filter '%.*s'", (int)(f->n > 40 ? 40 : f->n), f->p);
            if (is_op(cur(P), '(')) { P->i++; if ((rc = parse_args(P, n))) return rc; }
            n->a = *io;
            *io = n;
        } else if (is_name(t, "is")) {
            P->i++;
            int neg = 0;
            if (is_name(cur(P), "not")) { neg = 1; P->i++; }
            ltok *f = cur(P);
            if (f->type != K_NAME && !(f->type == K_OP && (f->op == O_EQ || f->op == O_NE || f->op == O_LE ||
                                                             f->op == O_GE || f->op == '<' || f->op == '>')))
                return unexpected(P, "a test name after 'is'");
            P->i++;
            tnode *n = node(P, N_TEST, f);
            if (!n) return CM_ENOMEM;
            n->negate = (uint8_t)neg;
            if (f->type == K_NAME) { n->name.p = f->p; n->name.n = f->n; }
            else {
                static const char *opn[] = {"==", "!=", "<=", ">="};
                const char *nm = f->op == '<' ? "<" : f->op == '>' ? ">" : opn[f->op - O_EQ];
                n->name.p = nm;
                n->name.n = strlen(nm);
            }
            n->a = *io;
            if (tmpl__test_arity(n->name.p, n->name.n) < 0)
                return perr(P, f, "unknown test '%.*s'", (int)(n->name.n > 40 ? 40 : n->name.n), n->name.p);
            if (is_op(cur(P), '(')) {
                P->i++;
                if ((rc = parse_args(P, n))) return rc;
            } else if (tmpl__test_arity(n->name.p, n->name.n) == 1) {
                ltok *x = cur(P);
                int starts = x->type == K_STR || x->type == K_INT || x->type == K_FLOAT || is_op(x, '(') || is_op(x, '[') ||
                             is_op(x, '{') || is_op(x, '-') ||
                             (x->type == K_NAME && !is_name(x, "else") && !is_name(x, "or") && !is_name(x, "and") &&
                              !is_name(x, "if") && !is_name(x, "is") && !is_name(x, "in") && !is_name(x, "not"));
                if (starts) {
                    tnode *arg;
                    if ((rc = parse_unary(P, 0, &arg))) return rc;
                    if (!(n->v = tmpl__alloc(P->a, sizeof *n->v))) return CM_ENOMEM;
                    n->v[0] = arg;
                    n->nv = 1;
                }
            }
            *io = n;
        } else {
            return 0;
        }
    }
}

static int parse_unary(parser *P, int with_filter, tnode **out) {
    ltok *t = cur(P);
    int rc;
    tnode *n = NULL;
    NEST_IN(P);
    if (is_op(t, '-') || is_op(t, '+')) {
        P->i++;
        tnode *x;
        if ((rc = parse_unary(P, 0, &x))) return rc;
        if (!(n = node(P, is_op(t, '-') ? N_NEG : N_POS, t))) return CM_ENOMEM;
        n->a = x;
    } else if ((rc = parse_primary(P, &n))) {
        return rc;
    }
    if ((rc = parse_postfix(P, &n))) return rc;
    if (with_filter && (rc = parse_filters(P, &n))) return rc;
    NEST_OUT(P);
    *out = n;
    return 0;
}

static int bin(parser *P, ltok *t, int op, tnode *a, tnode *b, tnode **out) {
    tnode *n = node(P, op ? N_BIN : N_AND, t);
    if (!n) return CM_ENOMEM;
    n->op = (uint16_t)op;
    n->a = a;
    n->b = b;
    *out = n;
    return 0;
}

static int parse_pow(parser *P, tnode **out) {
    int rc;
    if ((rc = parse_unary(P, 1, out))) return rc;
    while (is_op(cur(P), O_POW)) {
        ltok *t = cur(P);
        P->i++;
        tnode *r;
        if ((rc = parse_unary(P, 1, &r)) || (rc = bin(P, t, OP_POW, *out, r, out))) return rc;
    }
    return 0;
}

static int parse_math2(parser *P, tnode **out) {
    int rc;
    if ((rc = parse_pow(P, out))) return rc;
    for (;;) {
        ltok *t = cur(P);
        int op = is_op(t, '*') ? OP_MUL : is_op(t, '/') ? OP_DIV : is_op(t, O_FLOORDIV) ? OP_FLOORDIV : is_op(t, '%') ? OP_MOD : 0;
        if (!op) return 0;
        P->i++;
        tnode *r;
        if ((rc = parse_pow(P, &r)) || (rc = bin(P, t, op, *out, r, out))) return rc;
    }
}

static int parse_concat(parser *P, tnode **out) {
    int rc;
    if ((rc = parse_math2(P, out))) return rc;
    while (is_op(cur(P), '~')) {
        ltok *t = cur(P);
        P->i++;
        tnode *r;
        if ((rc = parse_math2(P, &r)) || (rc = bin(P, t, OP_CONCAT, *out, r, out))) return rc;
    }
    return 0;
}

static int parse_math1(parser *P, tnode **out) {
    int rc;
    if ((rc = parse_concat(P, out))) return rc;
    for (;;) {
        ltok *t = cur(P);
        int op = is_op(t, '+') ? OP_ADD : is_op(t, '-') ? OP_SUB : 0;
        if (!op) return 0;
        P->i++;
        tnode *r;
        if ((rc = parse_concat(P, &r)) || (rc = bin(P, t, op, *out, r, out))) return rc;
    }
}

static int parse_compare(parser *P, tnode **out) {
    int rc;
    tnode *prev_rhs = NULL;
    if ((rc = parse_math1(P, out))) return rc;
    for (;;) {
        ltok *t = cur(P);
        int op = 0;
        if (is_op(t, O_EQ)) op = OP_EQ;
        else if (is_op(t, O_NE)) op = OP_NE;
        else if (is_op(t, '<')) op = OP_LT;
        else if (is_op(t, O_LE)) op = OP_LE;
        else if (is_op(t, '>')) op = OP_GT;
        else if (is_op(t, O_GE)) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) { op = OP_NOTIN; P->i++; }
        if (!op) return 0;
        P->i++;
        tnode *r, *cmp;
        if ((rc = parse_math1(P, &r)) || (rc = bin(P, t, op, prev_rhs ? prev_rhs : *out, r, &cmp))) return rc;
        if (prev_rhs) { /* chained: a < b < c is (a < b) and (b < c) */
            tnode *both;
            if ((rc = bin(P, t, 0, *out, cmp, &both))) return rc;
            *out = both;
        } else {
            *out = cmp;
        }
        prev_rhs = r;
    }
}

static int parse_not(parser *P, tnode **out) {
    ltok *t = cur(P);
    if (is_name(t, "not")) {
        P->i++;
        int rc;
        tnode *x, *n;
        NEST_IN(P);
        if ((rc = parse_not(P, &x))) return rc;
        NEST_OUT(P);
        if (!(n = node(P, N_NOT, t))) return CM_ENOMEM;
        n->a = x;
        *out = n;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(parser *P, tnode **out) {
    int rc;
    if ((rc = parse_not(P, out))) return rc;
    while (is_name(cur(P), "and")) {
        ltok *t = cur(P);
        P->i++;
        tnode *r;
        if ((rc = parse_not(P, &r)) || (rc = bin(P, t, 0, *out, r, out))) return rc;
    }
    return 0;
}

static int parse_or(parser *P, tnode **out) {
    int rc;
    if ((rc = parse_and(P, out))) return rc;
    while (is_name(cur(P), "or")) {
        ltok *t = cur(P);
        P->i++;
        tnode *r;
        if ((rc = parse_and(P, &r)) || (rc = bin(P, t, 0, *out, r, out))) return rc;
        (*out)->kind = N_OR;
    }
    return 0;
}

static int parse_expr(parser *P, int with_cond, tnode **out) {
    int rc;
    NEST_IN(P);
    if ((rc = parse_or(P, out))) return rc;
    if (with_cond && is_name(cur(P), "if")) {
        ltok *t = cur(P);
        P->i++;
        tnode *n = node(P, N_COND, t);
        if (!n) return CM_ENOMEM;
        n->b = *out;
        if ((rc = parse_or(P, &n->a))) return rc;
        if (is_name(cur(P), "else")) {
            P->i++;
            if ((rc = parse_expr(P, 1, &n->c))) return rc;
        }
        *out = n;
    }
    NEST_OUT(P);
    return 0;
}

/* expr [, expr]* as a tuple when there is a comma (set a, b = 1, 2). */
static int parse_tuple(parser *P, tnode **out) {
    ltok *t = cur(P);
    int rc;
    if ((rc = parse_expr(P, 1, out))) return rc;
    if (!is_op(cur(P), ',')) return 0;
    nvec items = {0};
    if ((rc = nv_push(&items, *out))) return rc;
    while (is_op(cur(P), ',')) {
        P->i++;
        if (cur(P)->type == K_BLK_E || cur(P)->type == K_VAR_E) break;
        tnode *e;
        if ((rc = parse_expr(P, 1, &e)) || (rc = nv_push(&items, e))) { free(items.v); return rc; }
    }
    tnode *n = node(P, N_TUPLE, t);
    if (!n) { free(items.v); return CM_ENOMEM; }
    if ((rc = nv_done(P, &items, &n->v, &n->nv))) return rc;
    *out = n;
    return 0;
}

/* ---- statements ------------------------------------------------------------------------- */
static int parse_body(parser *P, const char *const *ends, int *which, ltok *opener, tnode ***body, int *nbody);

static int names_list(parser *P, tnode *n, int allow_paren) {
    tname names[32];
    int k = 0, paren = 0;
    if (allow_paren && is_op(cur(P), '(')) { paren = 1; P->i++; }
    for (;;) {
        ltok *t = cur(P);
        if (t->type != K_NAME) return unexpected(P, "a variable name");
        if (k == 32) return perr(P, t, "too many names");
        names[k].p = t->p;
        names[k].n = t->n;
        k++;
        P->i++;
        if (!is_op(cur(P), ',')) break;
        P->i++;
        if (paren && is_op(cur(P), ')')) break;
    }
    if (paren && expect_op(P, ')', "')'")) return CM_ETEMPLATE;
    if (!(n->names = tmpl__alloc(P->a, (size_t)k * sizeof *names))) return CM_ENOMEM;
    memcpy(n->names, names, (size_t)k * sizeof *names);
    n->nnames = k;
    return 0;
}

/* Macro / call-block parameters "(a, b=1)" into names + w (defaults, NULL when none). */
static int parse_params(parser *P, tnode *n) {
    if (expect_op(P, '(', "'('")) return CM_ETEMPLATE;
    tname names[64];
    tnode *defs[64];
    int k = 0, rc;
    while (!is_op(cur(P), ')')) {
        ltok *t = cur(P);
        if (t->type != K_NAME) return unexpected(P, "a parameter name");
        if (k == 64) return perr(P, t, "too many parameters");
        names[k].p = t->p;
        names[k].n = t->n;
        defs[k] = NULL;
        P->i++;
        if (is_op(cur(P), '=')) { P->i++; if ((rc = parse_expr(P, 1, &defs[k]))) return rc; }
        k++;
        if (is_op(cur(P), ',')) { P->i++; continue; }
        if (!is_op(cur(P), ')')) return unexpected(P, "',' or ')'");
    }
    P->i++;
    if (k) {
        if (!(n->names = tmpl__alloc(P->a, (size_t)k * sizeof *names)) || !(n->w = tmpl__alloc(P->a, (size_t)k * sizeof *defs)))
            return CM_ENOMEM;
        memcpy(n->names, names, (size_t)k * sizeof *names);
        memcpy(n->w, defs, (size_t)k * sizeof *defs);
    }
    n->nnames = n->nw = k;
    return 0;
}

/* filter chain "f1(args) | f2" for {% filter %} and {% set x | f %}: N_FILTER nodes, a = NULL. */
static int parse_filter_chain(parser *P, tnode ***chain, int *n) {
    nvec v = {0};
    int rc = 0;
    for (;;) {
        ltok *f = cur(P);
        if (f->type != K_NAME) { rc = unexpected(P, "a filter name"); break; }
        P->i++;
        tnode *x = node(P, N_FILTER, f);
        if (!x) { rc = CM_ENOMEM; break; }
        x->name.p = f->p;
        x->name.n = f->n;
        if (!tmpl__filter_known(f->p, f->n)) { rc = perr(P, f, "unknown filter '%.*s'", (int)(f->n > 40 ? 40 : f->n), f->p); break; }
        if (is_op(cur(P), '(')) { P->i++; if ((rc = parse_args(P, x))) break; }
        if ((rc = nv_push(&v, x))) break;
        if (!is_op(cur(P), '|')) break;
        P->i++;
    }
    if (rc) { free(v.v); return rc; }
    return nv_done(P, &v, chain, n);
}

static int end_stmt(parser *P) { return expect_type(P, K_BLK_E, "'%}'"); }

static int parse_stmt(parser *P, tnode **out) {
    ltok *open = cur(P); /* '{%' */
    P->i++;
    ltok *kw = cur(P);
    int rc, which;
    tnode *n = NULL;
    if (kw->type != K_NAME) return unexpected(P, "a statement name");
    P->i++;
    NEST_IN(P);
    if (is_name(kw, "for")) {
        if (!(n = node(P, N_FOR, kw))) return CM_ENOMEM;
        if ((rc = names_list(P, n, 1))) return rc;
        if (!is_name(cur(P), "in")) return unexpected(P, "'in'");
        P->i++;
        if ((rc = parse_expr(P, 0, &n->a))) return rc;
        if (is_name(cur(P), "if")) { P->i++; if ((rc = parse_expr(P, 1, &n->b))) return rc; }
        if (is_name(cur(P), "recursive")) return perr(P, cur(P), "recursive for loops are not supported");
        if ((rc = end_stmt(P))) return rc;
        static const char *const e1[] = {"endfor", "else", NULL}, *const e2[] = {"endfor", NULL};
        P->loops++;
        rc = parse_body(P, e1, &which, kw, &n->v, &n->nv);
        P->loops--;
        if (rc) return rc;
        if (which == 1 && ((rc = end_stmt(P)) || (rc = parse_body(P, e2, &which, kw, &n->w, &n->nw)))) return rc;
    } else if (is_name(kw, "if")) {
        if (!(n = node(P, N_IF, kw))) return CM_ENOMEM;
        if ((rc = parse_expr(P, 1, &n->a)) || (rc = end_stmt(P))) return rc;
        static const char *const e[] = {"endif", "elif", "else", NULL}, *const e2[] = {"endif", NULL};
        if ((rc = parse_body(P, e, &which, kw, &n->v, &n->nv))) return rc;
        tnode *last = n;
        while (which == 1) { /* elif: a nested if in the else branch */
            ltok *t = &P->L->t[P->i - 1];
            tnode *m = node(P, N_IF, t);
            if (!m || !(last->w = tmpl__alloc(P->a, sizeof *last->w))) return CM_ENOMEM;
            last->w[0] = m;
            last->nw = 1;
            if ((rc = parse_expr(P, 1, &m->a)) || (rc = end_stmt(P)) || (rc = parse_body(P, e, &which, kw, &m->v, &m->nv)))
                return rc;
            last = m;
        }
        if (which == 2 && ((rc = end_stmt(P)) || (rc = parse_body(P, e2, &which, kw, &last->w, &last->nw)))) return rc;
    } else if (is_name(kw, "set")) {
        ltok *t = cur(P);
        if (t->type != K_NAME) return unexpected(P, "a variable name");
        if (is_op(peek(P, 1), '.')) { /* set ns.attr = value */
            if (!(n = node(P, N_SET, kw)) || !(n->b = node(P, N_NAME, t))) return CM_ENOMEM;
            n->b->name.p = t->p;
            n->b->name.n = t->n;
            P->i += 2;
            if (cur(P)->type != K_NAME) return unexpected(P, "an attribute name");
            n->name.p = cur(P)->p;
            n->name.n = cur(P)->n;
            P->i++;
            if ((rc = expect_op(P, '=', "'='")) || (rc = parse_tuple(P, &n->a))) return rc;
        } else {
            if (!(n = node(P, N_SET, kw))) return CM_ENOMEM;
            if ((rc = names_list(P, n, 1))) return rc;
            if (is_op(cur(P), '=')) {
                P->i++;
                if ((rc = parse_tuple(P, &n->a))) return rc;
            } else {
                if (n->nnames != 1) return unexpected(P, "'='");
                n->kind = N_SETBLOCK;
                if (is_op(cur(P), '|')) { P->i++; if ((rc = parse_filter_chain(P, &n->w, &n->nw))) return rc; }
                static const char *const e[] = {"endset", NULL};
                if ((rc = end_stmt(P)) || (rc = parse_body(P, e, &which, kw, &n->v, &n->nv))) return rc;
            }
        }
    } else if (is_name(kw, "macro")) {
        ltok *t = cur(P);
        if (t->type != K_NAME) return unexpected(P, "a macro name");
        P->i++;
        if (!(n = node(P, N_MACRO, kw))) return CM_ENOMEM;
        n->name.p = t->p;
        n->name.n = t->n;
        if ((rc = parse_params(P, n)) || (rc = end_stmt(P))) return rc;
        static const char *const e[] = {"endmacro", NULL};
        int loops = P->loops;
        P->loops = 0;
        rc = parse_body(P, e, &which, kw, &n->v, &n->nv);
        P->loops = loops;
        if (rc) return rc;
        if (cur(P)->type == K_NAME) P->i++; /* {% endmacro name %} */
    } else if (is_name(kw, "call")) {
        if (!(n = node(P, N_CALLBLOCK, kw))) return CM_ENOMEM;
        if (is_op(cur(P), '(') && (rc = parse_params(P, n))) return rc;
        if ((rc = parse_expr(P, 1, &n->a))) return rc;
        if (n->a->kind != N_CALL) return perr(P, kw, "{%% call %%} needs a macro call");
        static const char *const e[] = {"endcall", NULL};
        int loops = P->loops;
        P->loops = 0;
        rc = end_stmt(P) ? CM_ETEMPLATE : parse_body(P, e, &which, kw, &n->v, &n->nv);
        P->loops = loops;
        if (rc) return rc;
    } else if (is_name(kw, "filter")) {
        if (!(n = node(P, N_FILTERBLOCK, kw))) return CM_ENOMEM;
        static const char *const e[] = {"endfilter", NULL};
        if ((rc = parse_filter_chain(P, &n->w, &n->nw)) || (rc = end_stmt(P)) ||
            (rc = parse_body(P, e, &which, kw, &n->v, &n->nv)))
            return rc;
    } else if (is_name(kw, "break") || is_name(kw, "continue")) {
        if (!P->loops) return perr(P, kw, "'%.*s' outside a for loop", (int)kw->n, kw->p);
        if (!(n = node(P, kw->p[0] == 'b' ? N_BREAK : N_CONTINUE, kw))) return CM_ENOMEM;
    } else if (is_name(kw, "do")) {
        if (!(n = node(P, N_DO, kw))) return CM_ENOMEM;
        if ((rc = parse_tuple(P, &n->a))) return rc;
    } else if (is_name(kw, "with")) { /* {% with a = 1, b = x %} ... {% endwith %} */
        if (!(n = node(P, N_WITH, kw))) return CM_ENOMEM;
        tname names[32];
        nvec vals = {0};
        int k = 0;
        while (cur(P)->type == K_NAME) {
            if (k == 32) { free(vals.v); return perr(P, cur(P), "too many names"); }
            names[k].p = cur(P)->p;
            names[k].n = cur(P)->n;
            P->i++;
            tnode *e;
            if ((rc = expect_op(P, '=', "'='")) || (rc = parse_expr(P, 1, &e)) || (rc = nv_push(&vals, e))) { free(vals.v); return rc; }
            k++;
            if (!is_op(cur(P), ',')) break;
            P->i++;
        }
        if ((rc = nv_done(P, &vals, &n->w, &n->nw))) return rc;
        if (k) {
            if (!(n->names = tmpl__alloc(P->a, (size_t)k * sizeof *names))) return CM_ENOMEM;
            memcpy(n->names, names, (size_t)k * sizeof *names);
        }
        n->nnames = k;
        static const char *const e[] = {"endwith", NULL};
        if ((rc = end_stmt(P)) || (rc = parse_body(P, e, &which, kw, &n->v, &n->nv))) return rc;
    } else if (is_name(kw, "generation")) {
        if (!(n = node(P, N_BLOCK, kw))) return CM_ENOMEM;
        static const char *const e[] = {"endgeneration", NULL};
        if ((rc = end_stmt(P)) || (rc = parse_body(P, e, &which, kw, &n->v, &n->nv))) return rc;
    } else {
        (void)open;
        return perr(P, kw, "unknown or unexpected statement '%.*s'", (int)(kw->n > 40 ? 40 : kw->n), kw->p);
    }
    if ((rc = end_stmt(P))) return rc;
    NEST_OUT(P);
    *out = n;
    return 0;
}

/* Parses nodes until {% one-of-ends %} (consumed up to the end name; *which = its index) or the
 * end of the template (only when ends is NULL). */
static int parse_body(parser *P, const char *const *ends, int *which, ltok *opener, tnode ***body, int *nbody) {
    nvec v = {0};
    int rc = 0;
    *which = -1;
    for (;;) {
        ltok *t = cur(P);
        tnode *n = NULL;
        if (t->type == K_EOF) {
            if (ends) {
                rc = perr(P, opener, "'%.*s' is not closed (missing {%% %s %%})", (int)opener->n, opener->p, ends[0]);
            }
            break;
        }
        if (t->type == K_TEXT) {
            if (!(n = node(P, N_TEXT, t))) { rc = CM_ENOMEM; break; }
            n->name.p = t->p;
            n->name.n = t->n;
            P->i++;
        } else if (t->type == K_VAR_B) {
            P->i++;
            if (!(n = node(P, N_OUT, t))) { rc = CM_ENOMEM; break; }
            if ((rc = parse_tuple(P, &n->a)) || (rc = expect_type(P, K_VAR_E, "'}}'"))) break;
        } else if (t->type == K_BLK_B) {
            ltok *kw = peek(P, 1);
            int hit = -1;
            for (int k = 0; ends && ends[k]; k++)
                if (is_name(kw, ends[k])) { hit = k; break; }
            if (hit >= 0) { P->i += 2; *which = hit; break; }
            if ((rc = parse_stmt(P, &n))) break;
        } else {
            char buf[64];
            rc = perr(P, t, "unexpected %s", tok_desc(t, buf, sizeof buf));
            break;
        }
        if ((rc = nv_push(&v, n))) break;
    }
    if (rc) { free(v.v); return rc; }
    return nv_done(P, &v, body, nbody);
}

int tmpl__parse(tmpl *t, const char *src, size_t len, char *err, size_t errlen) {
    lexer L = {.src = src, .len = len, .a = &t->a, .lc_line = 1, .lc_col = 1, .err = err, .errlen = errlen};
    int rc = lex(&L);
    if (!rc) {
        parser P = {.L = &L, .a = &t->a};
        int which;
        rc = parse_body(&P, NULL, &which, NULL, &t->body, &t->nbody);
    }
    free(L.t);
    if (rc == CM_ENOMEM && err && errlen) snprintf(err, errlen, "out of memory");
    return rc;
}
