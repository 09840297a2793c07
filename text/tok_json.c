/* tok_json: a pull reader for the big parts of tokenizer.json (a vocabulary of 262k entries and
 * half a million merges would cost a DOM hundreds of MB). It walks the text in place, decodes
 * strings into a caller buffer and never allocates per value; small sub-documents are handed
 * to common/cm_json as byte ranges. Strict JSON syntax, nesting capped at TOK__JSON_DEPTH. */
#include "tok_internal.h"
#include "../common/cm_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int tok__tj_fail(tok__tj *j, const char *fmt, ...) {
    if (j->err && j->errlen && !j->failed) {
        /* line of the failure, for the message */
        size_t line = 1;
        for (const char *q = j->start; q < j->p && q < j->end; q++) line += *q == '\n';
        int n = snprintf(j->err, j->errlen, "line %zu: ", line);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < j->errlen) vsnprintf(j->err + n, j->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    j->failed = 1;
    return CM_EFORMAT;
}

void tok__tj_init(tok__tj *j, const char *text, size_t len, char *err, size_t errlen) {
    memset(j, 0, sizeof *j);
    j->start = j->p = text;
    j->end = text + len;
    j->err = err;
    j->errlen = errlen;
}

int tok__tj_peek(tok__tj *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

static int expect(tok__tj *j, char c) {
    if (tok__tj_peek(j) != (unsigned char)c) return tok__tj_fail(j, "expected '%c'", c);
    j->p++;
    return 0;
}

static int hex4(const char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

int tok__tj_str(tok__tj *j, char **buf, size_t *cap, size_t *len) {
    if (expect(j, '"')) return CM_EFORMAT;
    size_t w = 0;
    for (;;) {
        if (j->p >= j->end) return tok__tj_fail(j, "unterminated string");
        if (w + 8 > *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            char *nb = realloc(*buf, nc);
            if (!nb) return CM_ENOMEM;
            *buf = nb;
            *cap = nc;
        }
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') break;
        if (c < 0x20) return tok__tj_fail(j, "control character in string");
        if (c != '\\') { (*buf)[w++] = (char)c; continue; }
        if (j->p >= j->end) return tok__tj_fail(j, "unterminated string");
        c = (unsigned char)*j->p++;
        switch (c) {
        case '"': case '\\': case '/': (*buf)[w++] = (char)c; break;
        case 'b': (*buf)[w++] = '\b'; break;
        case 'f': (*buf)[w++] = '\f'; break;
        case 'n': (*buf)[w++] = '\n'; break;
        case 'r': (*buf)[w++] = '\r'; break;
        case 't': (*buf)[w++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (j->end - j->p < 4 || hex4(j->p, &cp)) return tok__tj_fail(j, "bad \\u escape");
            j->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u' && !hex4(j->p + 2, &lo) &&
                lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                j->p += 6;
            }
            /* a lone surrogate is kept as its 3-byte form: such a token can never match text */
            w += (size_t)tok__utf8_enc(cp, *buf + w);
            break;
        }
        default: return tok__tj_fail(j, "bad escape '\\%c'", c);
        }
    }
    (*buf)[w] = 0;
    *len = w;
    return 0;
}

int tok__tj_num(tok__tj *j, int64_t *out) {
    tok__tj_peek(j);
    const char *p = j->p;
    int neg = 0;
    if (p < j->end && *p == '-') { neg = 1; p++; }
    if (p >= j->end || *p < '0' || *p > '9') return tok__tj_fail(j, "expected a number");
    int64_t v = 0;
    while (p < j->end && *p >= '0' && *p <= '9') {
        if (v > (INT64_MAX - 9) / 10) return tok__tj_fail(j, "number out of range");
        v = v * 10 + (*p++ - '0');
    }
    if (p < j->end && (*p == '.' || *p == 'e' || *p == 'E')) return tok__tj_fail(j, "expected an integer");
    j->p = p;
    *out = neg ? -v : v;
    return 0;
}

/* literal true/false/null: 1, 0, -1 */
int tok__tj_lit(tok__tj *j, int *out) {
    tok__tj_peek(j);
    size_t left = (size_t)(j->end - j->p);
    if (left >= 4 && !memcmp(j->p, "true", 4)) { j->p += 4; *out = 1; return 0; }
    if (left >= 5 && !memcmp(j->p, "false", 5)) { j->p += 5; *out = 0; return 0; }
    if (left >= 4 && !memcmp(j->p, "null", 4)) { j->p += 4; *out = -1; return 0; }
    return tok__tj_fail(j, "expected true, false or null");
}

int tok__tj_skip(tok__tj *j) {
    int c = tok__tj_peek(j);
    if (c == '"') {
        j->p++;
        while (j->p < j->end && *j->p != '"') {
            if (*j->p == '\\') j->p++;
            j->p++;
        }
        if (j->p >= j->end) return tok__tj_fail(j, "unterminated string");
        j->p++;
        return 0;
    }
    if (c == '{' || c == '[') {
        if (++j->depth > TOK__JSON_DEPTH) return tok__tj_fail(j, "nesting too deep");
        j->p++;
        int close = c == '{' ? '}' : ']';
        if (tok__tj_peek(j) == close) { j->p++; j->depth--; return 0; }
        for (;;) {
            if (c == '{') {
                if (tok__tj_peek(j) != '"') return tok__tj_fail(j, "expected a member name");
                if (tok__tj_skip(j) || expect(j, ':')) return CM_EFORMAT;
            }
            if (tok__tj_skip(j)) return CM_EFORMAT;
            int d = tok__tj_peek(j);
            j->p++;
            if (d == close) break;
            if (d != ',') return tok__tj_fail(j, "expected ',' or '%c'", close);
        }
        j->depth--;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const char *p = j->p + 1;
        while (p < j->end && (strchr("0123456789+-.eE", *p) && *p)) p++;
        j->p = p;
        return 0;
    }
    int lit;
    return tok__tj_lit(j, &lit);
}

int tok__tj_obj_begin(tok__tj *j) { return expect(j, '{'); }
int tok__tj_arr_begin(tok__tj *j) { return expect(j, '['); }

/* Next member of an object: 1 with the key in *key (its ':' consumed), 0 at the closing brace,
 * negative on error. first: this is the first call after tok__tj_obj_begin. */
int tok__tj_obj_next(tok__tj *j, int first, char **key, size_t *cap, size_t *len) {
    int c = tok__tj_peek(j);
    if (c == '}') { j->p++; return 0; }
    if (!first) {
        if (c != ',') return tok__tj_fail(j, "expected ',' or '}'");
        j->p++;
    }
    int rc = tok__tj_str(j, key, cap, len);
    if (rc) return rc;
    return expect(j, ':') ? CM_EFORMAT : 1;
}

int tok__tj_arr_next(tok__tj *j, int first) {
    int c = tok__tj_peek(j);
    if (c == ']') { j->p++; return 0; }
    if (!first) {
        if (c != ',') return tok__tj_fail(j, "expected ',' or ']'");
        j->p++;
    }
    return 1;
}
