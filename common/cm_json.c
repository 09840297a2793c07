/* cm_json: strict recursive-descent JSON reader into an arena of nodes. */
#include "cm_json.h"
#include "cm_err.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Caps that keep a hostile document's memory bounded: nodes are ~100 bytes each. */
#define MAX_NODES (1u << 20)
#define MAX_NUMBER_LEN 512
#define ARENA_BLOCK (64 * 1024)

/* Numbers are read in the "C" locale whatever LC_NUMERIC the process has set. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

static double to_double(const char *s) {
    pthread_once(&c_locale_once, c_locale_init);
    return c_locale ? strtod_l(s, NULL, c_locale) : strtod(s, NULL);
}

typedef struct arena_block { struct arena_block *next; size_t used, cap; } arena_block;

struct cm_json_doc {
    arena_block *blocks;
    cm_json     *root;
};

typedef struct parser {
    const char  *s;
    size_t       len, pos;
    cm_json_doc *doc;
    size_t       n_nodes;
    int          rc;
    char        *err;
    size_t       errlen;
} parser;

static void *arena_alloc(cm_json_doc *d, size_t size) {
    size = (size + 15) & ~(size_t)15;
    arena_block *b = d->blocks;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > ARENA_BLOCK ? size : ARENA_BLOCK;
        b = malloc(sizeof *b + 16 + cap);
        if (!b) return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = d->blocks;
        d->blocks = b;
    }
    /* The payload starts 16-aligned after the header. */
    char *base = (char *)b + ((sizeof *b + 15) & ~(size_t)15);
    void *p = base + b->used;
    b->used += size;
    return p;
}

static int fail(parser *p, int rc, const char *msg) {
    if (p->rc) return p->rc;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->s[i] == '\n') { line++; col = 1; }
        else col++;
    }
    snprintf(p->err, p->errlen, "line %zu, column %zu: %s", line, col, msg);
    p->rc = rc;
    return rc;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static cm_json *new_node(parser *p, int type) {
    if (p->n_nodes >= MAX_NODES) {
        fail(p, CM_ETOOBIG, "too many values");
        return NULL;
    }
    cm_json *n = arena_alloc(p->doc, sizeof *n);
    if (!n) {
        fail(p, CM_ENOMEM, "out of memory");
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->type = type;
    p->n_nodes++;
    return n;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence starting at s (at most n bytes), or 0 when invalid
 * (overlong forms, surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
        return 4;
    }
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parses a string starting at the opening quote; the decoded text goes into the arena. */
static int parse_string(parser *p, const char **out, size_t *out_len) {
    size_t start = ++p->pos; /* past the quote */
    /* Find the closing quote first: the decoded text is never longer than the raw text. */
    size_t end = start;
    while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->len) return fail(p, CM_EFORMAT, "unterminated string");
    char *o = arena_alloc(p->doc, end - start + 1);
    if (!o) return fail(p, CM_ENOMEM, "out of memory");
    size_t n = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) return fail(p, CM_EFORMAT, "control character in string");
        if (c == '\\') {
            char e = p->s[p->pos + 1];
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *k = e ? strchr(from, e) : NULL;
            if (k) {
                o[n++] = to[k - from];
                p->pos += 2;
                continue;
            }
            if (e != 'u') return fail(p, CM_EFORMAT, "invalid escape in string");
            unsigned cp, lo;
            if (p->pos + 6 > end || hex4(p->s + p->pos + 2, &cp)) return fail(p, CM_EFORMAT, "invalid \\u escape");
            p->pos += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, CM_EFORMAT, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->pos + 6 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' || hex4(p->s + p->pos + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return fail(p, CM_EFORMAT, "unpaired high surrogate in \\u escape");
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            n += put_utf8(o + n, cp);
            continue;
        }
        size_t l = utf8_len((const unsigned char *)p->s + p->pos, end - p->pos);
        if (!l) return fail(p, CM_EFORMAT, "invalid UTF-8 in string");
        memcpy(o + n, p->s + p->pos, l);
        n += l;
        p->pos += l;
    }
    o[n] = 0;
    p->pos = end + 1;
    *out = o;
    *out_len = n;
    return 0;
}

static int parse_number(parser *p, cm_json *node) {
    size_t start = p->pos, i = p->pos;
    const char *s = p->s;
    int integral = 1;
    if (i < p->len && s[i] == '-') i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') return fail(p, CM_EFORMAT, "invalid number");
    if (s[i] == '0') {
        i++;
        if (i < p->len && s[i] >= '0' && s[i] <= '9') return fail(p, CM_EFORMAT, "leading zero in number");
    } else
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    if (i < p->len && s[i] == '.') {
        integral = 0;
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') return fail(p, CM_EFORMAT, "invalid number: digit expected after '.'");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        integral = 0;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') return fail(p, CM_EFORMAT, "invalid number: digit expected in exponent");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t n = i - start;
    if (n > MAX_NUMBER_LEN) return fail(p, CM_EFORMAT, "number too long");
    char buf[MAX_NUMBER_LEN + 1];
    memcpy(buf, s + start, n);
    buf[n] = 0;
    double d = to_double(buf);
    if (!isfinite(d)) return fail(p, CM_EFORMAT, "number out of range");
    node->num = d;
    if (integral) {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno == 0) {
            node->i = v;
            node->is_int = 1;
        }
    }
    p->pos = i;
    return 0;
}

static int match_word(parser *p, const char *w) {
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n)) return 0;
    p->pos += n;
    return 1;
}

static int parse_value(parser *p, cm_json **out, int depth);

static int parse_container(parser *p, cm_json *node, int depth) {
    int is_obj = node->type == CM_JSON_OBJECT;
    if (depth >= CM_JSON_MAX_DEPTH) return fail(p, CM_EFORMAT, "nesting too deep");
    char close = is_obj ? '}' : ']';
    cm_json **tail = &node->child;
    p->pos++; /* past the bracket */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0;
        int rc;
        skip_ws(p);
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, CM_EFORMAT, "object key (a string) expected");
            if ((rc = parse_string(p, &key, &key_len))) return rc;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, CM_EFORMAT, "':' expected after object key");
            p->pos++;
        }
        cm_json *child;
        if ((rc = parse_value(p, &child, depth + 1))) return rc;
        child->key = key;
        child->key_len = key_len;
        *tail = child;
        tail = &child->next;
        node->n++;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, CM_EFORMAT, is_obj ? "unterminated object" : "unterminated array");
        char c = p->s[p->pos++];
        if (c == close) return 0;
        if (c != ',') {
            p->pos--;
            return fail(p, CM_EFORMAT, is_obj ? "',' or '}' expected" : "',' or ']' expected");
        }
    }
}

static int parse_value(parser *p, cm_json **out, int depth) {
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, CM_EFORMAT, "value expected");
    char c = p->s[p->pos];
    if (!strchr("{[\"tfn-0123456789", c) || !c) return fail(p, CM_EFORMAT, "unexpected character");
    int type = c == '{' ? CM_JSON_OBJECT : c == '[' ? CM_JSON_ARRAY : c == '"' ? CM_JSON_STRING
             : c == 't' || c == 'f' ? CM_JSON_BOOL : c == 'n' ? CM_JSON_NULL : CM_JSON_NUMBER;
    cm_json *node = new_node(p, type);
    if (!node) return p->rc;
    *out = node;
    switch (type) {
    case CM_JSON_OBJECT:
    case CM_JSON_ARRAY:
        return parse_container(p, node, depth);
    case CM_JSON_STRING:
        return parse_string(p, &node->str, &node->str_len);
    case CM_JSON_BOOL:
        if (match_word(p, "true")) node->boolean = 1;
        else if (!match_word(p, "false")) return fail(p, CM_EFORMAT, "invalid literal");
        return 0;
    case CM_JSON_NULL:
        return match_word(p, "null") ? 0 : fail(p, CM_EFORMAT, "invalid literal");
    default:
        return parse_number(p, node);
    }
}

void cm_json_free(cm_json_doc *d) {
    if (!d) return;
    for (arena_block *b = d->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(d);
}

int cm_json_parse(const char *text, size_t len, cm_json_doc **out, char *err, size_t errlen) {
    *out = NULL;
    cm_json_doc *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return CM_ENOMEM;
    }
    parser p = { .s = text, .len = len, .doc = d, .err = err, .errlen = errlen };
    int rc = parse_value(&p, &d->root, 0);
    if (!rc) {
        skip_ws(&p);
        if (p.pos != p.len) rc = fail(&p, CM_EFORMAT, "trailing characters after the value");
    }
    if (rc) {
        cm_json_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

const cm_json *cm_json_root(const cm_json_doc *d) { return d ? d->root : NULL; }

const cm_json *cm_json_get(const cm_json *obj, const char *key) {
    if (!obj || obj->type != CM_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (const cm_json *c = obj->child; c; c = c->next)
        if (c->key_len == n && !memcmp(c->key, key, n)) return c;
    return NULL;
}

const cm_json *cm_json_at(const cm_json *arr, size_t i) {
    if (!arr || arr->type != CM_JSON_ARRAY) return NULL;
    const cm_json *c = arr->child;
    while (c && i--) c = c->next;
    return c;
}

static const cm_json *member(const cm_json *obj, const char *key, int type, int *rc) {
    const cm_json *v = cm_json_get(obj, key);
    if (!v || v->type == CM_JSON_NULL) {
        *rc = CM_ENOTFOUND;
        return NULL;
    }
    *rc = v->type == type ? 0 : CM_EFORMAT;
    return *rc ? NULL : v;
}

int cm_json_get_int(const cm_json *obj, const char *key, int64_t *out) {
    int rc;
    const cm_json *v = member(obj, key, CM_JSON_NUMBER, &rc);
    if (rc) return rc;
    if (v->is_int) *out = v->i;
    /* 4096.0 is still the integer 4096 (some writers emit floats); 1e3 likewise. */
    else if (v->num == floor(v->num) && fabs(v->num) < 9007199254740992.0) *out = (int64_t)v->num;
    else return CM_EFORMAT;
    return 0;
}

int cm_json_get_num(const cm_json *obj, const char *key, double *out) {
    int rc;
    const cm_json *v = member(obj, key, CM_JSON_NUMBER, &rc);
    if (!rc) *out = v->num;
    return rc;
}

int cm_json_get_bool(const cm_json *obj, const char *key, int *out) {
    int rc;
    const cm_json *v = member(obj, key, CM_JSON_BOOL, &rc);
    if (!rc) *out = v->boolean;
    return rc;
}

int cm_json_get_str(const cm_json *obj, const char *key, const char **out) {
    int rc;
    const cm_json *v = member(obj, key, CM_JSON_STRING, &rc);
    if (!rc) *out = v->str;
    return rc;
}
