/* tmpl_value: arena, values, dicts, Python str()/repr() and json.dumps() of values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"
#include "common/cm_json.h"
#include "tmpl_internal.h"

/* ---- arena ---------------------------------------------------------------------------------- */
struct tmpl__chunk { tmpl__chunk *next; size_t size; };
#define CHUNK_HDR ((sizeof(tmpl__chunk) + 15) & ~(size_t)15)
#define CHUNK_MIN ((size_t)64 << 10)

void tmpl__arena_init(tmpl_arena *a, size_t cap) {
    memset(a, 0, sizeof *a);
    a->cap = cap;
}

void tmpl__arena_release(tmpl_arena *a) {
    tmpl__chunk *c = a->head;
    while (c) { tmpl__chunk *n = c->next; free(c); c = n; }
    a->head = NULL;
    a->cur = a->end = NULL;
    a->used = 0;
}

void *tmpl__alloc(tmpl_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if ((size_t)(a->end - a->cur) >= n && a->cur) { void *p = a->cur; a->cur += n; return p; }
    if (n > ((size_t)1 << 40)) { a->capped = 1; return NULL; }
    int big = n > CHUNK_MIN / 4;
    size_t size = CHUNK_HDR + (big ? n : CHUNK_MIN);
    if (a->cap && a->used + size > a->cap) { a->capped = 1; return NULL; }
    tmpl__chunk *c = malloc(size);
    if (!c) return NULL;
    c->size = size;
    a->used += size;
    char *data = (char *)c + CHUNK_HDR;
    if (big && a->head) { /* keep bumping in the current chunk */
        c->next = a->head->next;
        a->head->next = c;
        return data;
    }
    c->next = a->head;
    a->head = c;
    a->cur = data + n;
    a->end = (char *)c + size;
    return data;
}

char *tmpl__strdup(tmpl_arena *a, const char *s, size_t n) {
    char *p = tmpl__alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

tmpl_arena *tmpl_arena_create(void) {
    tmpl_arena *a = malloc(sizeof *a);
    if (a) tmpl__arena_init(a, 0);
    return a;
}

void tmpl_arena_destroy(tmpl_arena *a) {
    if (!a) return;
    tmpl__arena_release(a);
    free(a);
}

/* ---- values ----------------------------------------------------------------------------- */
tmpl_value tmpl__undef = {.type = TV_UNDEF}, tmpl__nonev = {.type = TV_NONE};
tmpl_value tmpl__true = {.type = TV_BOOL, .u.b = 1}, tmpl__false = {.type = TV_BOOL, .u.b = 0};

static tmpl_value *vnew(tmpl_arena *a, int type) {
    tmpl_value *v = tmpl__alloc(a, sizeof *v);
    if (v) { memset(v, 0, sizeof *v); v->type = (uint8_t)type; }
    return v;
}

tmpl_value *tmpl__v_str(tmpl_arena *a, const char *p, size_t n, int copy) {
    tmpl_value *v = vnew(a, TV_STR);
    if (!v) return NULL;
    if (copy) { p = tmpl__strdup(a, p, n); if (!p) return NULL; }
    v->u.s.p = p;
    v->u.s.n = n;
    return v;
}

tmpl_value *tmpl__v_int(tmpl_arena *a, int64_t i) {
    tmpl_value *v = vnew(a, TV_INT);
    if (v) v->u.i = i;
    return v;
}

tmpl_value *tmpl__v_float(tmpl_arena *a, double f) {
    tmpl_value *v = vnew(a, TV_FLOAT);
    if (v) v->u.f = f;
    return v;
}

tmpl_value *tmpl__v_list(tmpl_arena *a, size_t cap) {
    tmpl_value *v = vnew(a, TV_LIST);
    tv_list *l = v ? tmpl__alloc(a, sizeof *l) : NULL;
    if (!l) return NULL;
    memset(l, 0, sizeof *l);
    l->owner = a;
    if (cap) {
        if (cap > ((size_t)1 << 32) || !(l->v = tmpl__alloc(a, cap * sizeof *l->v))) return NULL;
        l->cap = cap;
    }
    v->u.l = l;
    return v;
}

tmpl_value *tmpl__v_dict(tmpl_arena *a, int type) {
    tmpl_value *v = vnew(a, type);
    tv_dict *d = v ? tmpl__alloc(a, sizeof *d) : NULL;
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    d->owner = a;
    v->u.d = d;
    return v;
}

int tmpl__list_push(tmpl_arena *a, tv_list *l, tmpl_value *v) {
    if (!v) return CM_ENOMEM;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        tmpl_value **nv = nc < ((size_t)1 << 32) ? tmpl__alloc(a, nc * sizeof *nv) : NULL;
        if (!nv) return CM_ENOMEM;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

static uint32_t hash_key(const char *k, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)k[i]) * 16777619u;
    return h;
}

static int reindex(tmpl_arena *a, tv_dict *d, size_t icap) {
    uint32_t *idx = tmpl__alloc(a, icap * sizeof *idx);
    if (!idx) return CM_ENOMEM;
    memset(idx, 0, icap * sizeof *idx);
    for (size_t i = 0; i < d->n; i++) {
        size_t h = hash_key(d->e[i].k, d->e[i].kn) & (icap - 1);
        while (idx[h]) h = (h + 1) & (icap - 1);
        idx[h] = (uint32_t)(i + 1);
    }
    d->idx = idx;
    d->icap = icap;
    return 0;
}

static long find_entry(const tv_dict *d, const char *k, size_t kn) {
    if (d->idx) {
        size_t h = hash_key(k, kn) & (d->icap - 1);
        for (; d->idx[h]; h = (h + 1) & (d->icap - 1)) {
            const tv_entry *e = &d->e[d->idx[h] - 1];
            if (e->kn == kn && memcmp(e->k, k, kn) == 0) return (long)(d->idx[h] - 1);
        }
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].kn == kn && memcmp(d->e[i].k, k, kn) == 0) return (long)i;
    return -1;
}

tmpl_value *tmpl__dict_get(const tv_dict *d, const char *k, size_t kn) {
    long i = find_entry(d, k, kn);
    return i < 0 ? NULL : d->e[i].v;
}

int tmpl__dict_set(tmpl_arena *a, tv_dict *d, const char *k, size_t kn, tmpl_value *v, int copy_key) {
    if (!v) return CM_ENOMEM;
    long i = find_entry(d, k, kn);
    if (i >= 0) { d->e[i].v = v; return 0; }
    if (d->n >= ((size_t)1 << 30)) return CM_ENOMEM;
    if (copy_key && !(k = tmpl__strdup(a, k, kn))) return CM_ENOMEM;
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        tv_entry *ne = tmpl__alloc(a, nc * sizeof *ne);
        if (!ne) return CM_ENOMEM;
        if (d->n) memcpy(ne, d->e, d->n * sizeof *ne);
        d->e = ne;
        d->cap = nc;
    }
    d->e[d->n].k = k;
    d->e[d->n].kn = kn;
    d->e[d->n].v = v;
    d->n++;
    if (d->n > 8 && d->n * 2 > d->icap) {
        size_t ic = 32;
        while (ic < d->n * 4) ic *= 2;
        if (reindex(a, d, ic)) { d->n--; return CM_ENOMEM; }
    } else if (d->idx) {
        size_t h = hash_key(k, kn) & (d->icap - 1);
        while (d->idx[h]) h = (h + 1) & (d->icap - 1);
        d->idx[h] = (uint32_t)d->n;
    }
    return 0;
}

/* ---- public value API --------------------------------------------------------------------- */
tmpl_value *tmpl_none(tmpl_arena *a) { return a ? vnew(a, TV_NONE) : NULL; }
tmpl_value *tmpl_bool(tmpl_arena *a, int b) {
    tmpl_value *v = a ? vnew(a, TV_BOOL) : NULL;
    if (v) v->u.b = !!b;
    return v;
}
tmpl_value *tmpl_int(tmpl_arena *a, int64_t i) { return a ? tmpl__v_int(a, i) : NULL; }
tmpl_value *tmpl_float(tmpl_arena *a, double f) { return a ? tmpl__v_float(a, f) : NULL; }
tmpl_value *tmpl_str(tmpl_arena *a, const char *s, size_t len) {
    return a && (s || !len) ? tmpl__v_str(a, s ? s : "", len, 1) : NULL;
}
tmpl_value *tmpl_list(tmpl_arena *a) { return a ? tmpl__v_list(a, 0) : NULL; }
tmpl_value *tmpl_dict(tmpl_arena *a) { return a ? tmpl__v_dict(a, TV_DICT) : NULL; }

int tmpl_list_push(tmpl_arena *a, tmpl_value *list, tmpl_value *v) {
    if (!v) return CM_ENOMEM;
    if (!a || !list || list->type != TV_LIST || list->u.l->owner != a) return CM_EINVAL;
    return tmpl__list_push(a, list->u.l, v);
}

int tmpl_dict_set(tmpl_arena *a, tmpl_value *dict, const char *key, size_t klen, tmpl_value *v) {
    if (!v) return CM_ENOMEM;
    if (!a || !dict || dict->type != TV_DICT || dict->u.d->owner != a || (!key && klen)) return CM_EINVAL;
    return tmpl__dict_set(a, dict->u.d, key ? key : "", klen, v, 1);
}

int tmpl_from_json(tmpl_arena *a, const cm_json *j, tmpl_value **out) {
    *out = NULL;
    if (!a || !j) return CM_EINVAL;
    tmpl_value *v = NULL;
    int rc = 0;
    switch (j->type) {
    case CM_JSON_NULL: v = tmpl_none(a); break;
    case CM_JSON_BOOL: v = tmpl_bool(a, j->boolean); break;
    case CM_JSON_NUMBER: v = j->is_int ? tmpl_int(a, j->i) : tmpl_float(a, j->num); break;
    case CM_JSON_STRING: v = tmpl_str(a, j->str, j->str_len); break;
    case CM_JSON_ARRAY:
        v = tmpl_list(a);
        for (const cm_json *c = j->child; v && c && !rc; c = c->next) {
            tmpl_value *cv;
            if (!(rc = tmpl_from_json(a, c, &cv))) rc = tmpl_list_push(a, v, cv);
        }
        break;
    case CM_JSON_OBJECT:
        v = tmpl_dict(a);
        for (const cm_json *c = j->child; v && c && !rc; c = c->next) {
            tmpl_value *cv;
            if (!(rc = tmpl_from_json(a, c, &cv))) rc = tmpl_dict_set(a, v, c->key, c->key_len, cv);
        }
        break;
    default: return CM_EINVAL;
    }
    if (rc) return rc;
    if (!v) return CM_ENOMEM;
    *out = v;
    return 0;
}

/* ---- truth, equality -------------------------------------------------------------------- */
int tmpl__truthy(const tmpl_value *v) {
    switch (v->type) {
    case TV_UNDEF: case TV_NONE: return 0;
    case TV_BOOL: return v->u.b;
    case TV_INT: return v->u.i != 0;
    case TV_FLOAT: return v->u.f != 0.0;
    case TV_STR: return v->u.s.n != 0;
    case TV_LIST: return v->u.l->n != 0;
    case TV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

static int is_num(const tmpl_value *v) { return v->type == TV_BOOL || v->type == TV_INT || v->type == TV_FLOAT; }

static int equal_d(const tmpl_value *a, const tmpl_value *b, uint64_t *work, int depth) {
    if (a == b) return 1;
    if (is_num(a) && is_num(b)) {
        if (a->type != TV_FLOAT && b->type != TV_FLOAT) {
            int64_t x = a->type == TV_BOOL ? a->u.b : a->u.i, y = b->type == TV_BOOL ? b->u.b : b->u.i;
            return x == y;
        }
        double x = a->type == TV_FLOAT ? a->u.f : a->type == TV_BOOL ? a->u.b : (double)a->u.i;
        double y = b->type == TV_FLOAT ? b->u.f : b->type == TV_BOOL ? b->u.b : (double)b->u.i;
        return x == y;
    }
    if (a->type != b->type || depth > 128) return 0;
    switch (a->type) {
    case TV_UNDEF: case TV_NONE: return 1;
    case TV_STR:
        if (work) *work += a->u.s.n / 64;
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case TV_LIST:
        if (a->u.l->n != b->u.l->n) return 0;
        for (size_t i = 0; i < a->u.l->n; i++) {
            if (work) (*work)++;
            if (!equal_d(a->u.l->v[i], b->u.l->v[i], work, depth + 1)) return 0;
        }
        return 1;
    case TV_DICT:
        if (a->u.d->n != b->u.d->n) return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            if (work) (*work)++;
            tmpl_value *o = tmpl__dict_get(b->u.d, a->u.d->e[i].k, a->u.d->e[i].kn);
            if (!o || !equal_d(a->u.d->e[i].v, o, work, depth + 1)) return 0;
        }
        return 1;
    case TV_NS: return a->u.d == b->u.d;
    case TV_MACRO: return a->u.m == b->u.m;
    case TV_BUILTIN: return a->u.builtin == b->u.builtin;
    default: return 0;
    }
}

int tmpl__equal(const tmpl_value *a, const tmpl_value *b) { return equal_d(a, b, NULL, 0); }
int tmpl__equal_w(const tmpl_value *a, const tmpl_value *b, uint64_t *work) { return equal_d(a, b, work, 0); }

const char *tmpl__type_name(const tmpl_value *v) {
    static const char *names[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict",
                                  "namespace", "macro", "function", "loop", "method"};
    if (v->type == TV_LIST && v->is_tuple) return "tuple";
    return v->type < sizeof names / sizeof names[0] ? names[v->type] : "?";
}

/* ---- string builder ------------------------------------------------------------------------ */
int tmpl__sb_put(tmpl__sb *b, const char *s, size_t n) {
    if (b->max && n > b->max - b->n) { b->over = 1; return CM_ETOOBIG; }
    if (b->live && n > b->live_max - *b->live) { b->over = 1; return CM_ETOOBIG; }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) return CM_ENOMEM;
        b->p = p;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    if (b->live) *b->live += n;
    return 0;
}

int tmpl__sb_putc(tmpl__sb *b, char c) { return tmpl__sb_put(b, &c, 1); }

int tmpl__sb_printf(tmpl__sb *b, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return CM_EINVAL;
    return tmpl__sb_put(b, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

void tmpl__sb_free(tmpl__sb *b) {
    if (b->live) *b->live -= b->n;
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- number formatting ------------------------------------------------------------------- */
void tmpl__fmt_float(char *buf, size_t cap, double f) {
    if (isnan(f)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(f)) { snprintf(buf, cap, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(buf, cap, signbit(f) ? "-0.0" : "0.0"); return; }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) { /* shortest round-trip digits, like Python's repr */
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d.ddde[+-]XX */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *w = buf, *end = buf + cap - 1;
#define PUT(c) do { if (w < end) *w++ = (c); } while (0)
    if (neg) PUT('-');
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) PUT(i < nd ? digits[i] : '0');
            PUT('.');
            if (nd > e + 1) for (int i = e + 1; i < nd; i++) PUT(digits[i]);
            else PUT('0');
        } else {
            PUT('0'); PUT('.');
            for (int i = 0; i < -e - 1; i++) PUT('0');
            for (int i = 0; i < nd; i++) PUT(digits[i]);
        }
    } else {
        PUT(digits[0]);
        if (nd > 1) { PUT('.'); for (int i = 1; i < nd; i++) PUT(digits[i]); }
        PUT('e');
        PUT(e < 0 ? '-' : '+');
        int ae = e < 0 ? -e : e;
        char eb[16];
        snprintf(eb, sizeof eb, "%02d", ae);
        for (char *q = eb; *q; q++) PUT(*q);
    }
#undef PUT
    *w = 0;
}

/* ---- UTF-8 ------------------------------------------------------------------------------------ */
size_t tmpl__cp_len(const char *p, size_t n) {
    uint8_t c = (uint8_t)p[0];
    size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (l > n) return 1;
    for (size_t i = 1; i < l; i++)
        if (((uint8_t)p[i] & 0xC0) != 0x80) return 1;
    return l;
}

size_t tmpl__cp_count(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; c++) i += tmpl__cp_len(p + i, n - i);
    return c;
}

int tmpl__utf8_valid(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        size_t l;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) l = 2;
        else if (c == 0xE0) { l = 3; lo = 0xA0; }
        else if (c == 0xED) { l = 3; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) l = 3;
        else if (c == 0xF0) { l = 4; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) l = 4;
        else if (c == 0xF4) { l = 4; hi = 0x8F; }
        else return 0;
        if (i + l > n || p[i + 1] < lo || p[i + 1] > hi) return 0;
        for (size_t k = 2; k < l; k++)
            if ((p[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

/* ---- str(), repr() ---------------------------------------------------------------------- */
static int repr_str(tmpl__sb *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    int rc = tmpl__sb_putc(b, q);
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == (unsigned char)q) { char e[2] = {'\\', (char)c}; rc = tmpl__sb_put(b, e, 2); }
        else if (c == '\n') rc = tmpl__sb_put(b, "\\n", 2);
        else if (c == '\r') rc = tmpl__sb_put(b, "\\r", 2);
        else if (c == '\t') rc = tmpl__sb_put(b, "\\t", 2);
        else if (c < 0x20 || c == 0x7f) rc = tmpl__sb_printf(b, "\\x%02x", c);
        else rc = tmpl__sb_putc(b, (char)c);
    }
    return rc ? rc : tmpl__sb_putc(b, q);
}

int tmpl__repr(tmpl__sb *b, const tmpl_value *v, int depth) {
    if (depth > 64) return tmpl__sb_put(b, "...", 3);
    int rc = 0;
    switch (v->type) {
    case TV_STR: return repr_str(b, v->u.s.p, v->u.s.n);
    case TV_LIST: {
        rc = tmpl__sb_putc(b, v->is_tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n && !rc; i++) {
            if (i) rc = tmpl__sb_put(b, ", ", 2);
            if (!rc) rc = tmpl__repr(b, v->u.l->v[i], depth + 1);
        }
        if (!rc && v->is_tuple && v->u.l->n == 1) rc = tmpl__sb_putc(b, ',');
        return rc ? rc : tmpl__sb_putc(b, v->is_tuple ? ')' : ']');
    }
    case TV_DICT: case TV_NS: {
        if (v->type == TV_NS) rc = tmpl__sb_put(b, "<Namespace ", 11);
        if (!rc) rc = tmpl__sb_putc(b, '{');
        for (size_t i = 0; i < v->u.d->n && !rc; i++) {
            if (i) rc = tmpl__sb_put(b, ", ", 2);
            if (!rc) rc = repr_str(b, v->u.d->e[i].k, v->u.d->e[i].kn);
            if (!rc) rc = tmpl__sb_put(b, ": ", 2);
            if (!rc) rc = tmpl__repr(b, v->u.d->e[i].v, depth + 1);
        }
        if (!rc) rc = tmpl__sb_putc(b, '}');
        if (!rc && v->type == TV_NS) rc = tmpl__sb_putc(b, '>');
        return rc;
    }
    case TV_UNDEF: return 0;
    default: return tmpl__to_str(b, v);
    }
}

int tmpl__to_str(tmpl__sb *b, const tmpl_value *v) {
    char buf[64];
    switch (v->type) {
    case TV_UNDEF: return 0;
    case TV_NONE: return tmpl__sb_put(b, "None", 4);
    case TV_BOOL: return v->u.b ? tmpl__sb_put(b, "True", 4) : tmpl__sb_put(b, "False", 5);
    case TV_INT: return tmpl__sb_printf(b, "%lld", (long long)v->u.i);
    case TV_FLOAT: tmpl__fmt_float(buf, sizeof buf, v->u.f); return tmpl__sb_put(b, buf, strlen(buf));
    case TV_STR: return tmpl__sb_put(b, v->u.s.p, v->u.s.n);
    case TV_LIST: case TV_DICT: case TV_NS: return tmpl__repr(b, v, 0);
    case TV_MACRO: return tmpl__sb_put(b, "<macro>", 7);
    case TV_BUILTIN: return tmpl__sb_put(b, "<built-in function>", 19);
    case TV_LOOP: return tmpl__sb_put(b, "<LoopContext>", 13);
    default: return tmpl__sb_put(b, "<method>", 8);
    }
}

/* ---- json.dumps ---------------------------------------------------------------------------- */
static int json_str(tmpl__sb *b, const char *s, size_t n, int ensure_ascii) {
    int rc = tmpl__sb_putc(b, '"');
    size_t run = 0; /* plain bytes copied in runs */
    for (size_t i = 0; i < n && !rc;) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        }
        if (!esc && c >= 0x20 && (c < 0x80 || !ensure_ascii)) { run++; i++; continue; }
        if (run) { rc = tmpl__sb_put(b, s + i - run, run); run = 0; if (rc) break; }
        if (esc) { rc = tmpl__sb_put(b, esc, 2); i++; continue; }
        if (c < 0x20) { rc = tmpl__sb_printf(b, "\\u%04x", c); i++; continue; }
        /* ensure_ascii: \uXXXX, surrogate pairs past the BMP */
        size_t l = tmpl__cp_len(s + i, n - i);
        uint32_t cp = l == 1 ? 0xFFFD : l == 2 ? (c & 0x1Fu) : l == 3 ? (c & 0x0Fu) : (c & 0x07u);
        for (size_t k = 1; k < l; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3Fu);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            rc = tmpl__sb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else {
            rc = tmpl__sb_printf(b, "\\u%04x", cp);
        }
        i += l;
    }
    if (!rc && run) rc = tmpl__sb_put(b, s + n - run, run);
    return rc ? rc : tmpl__sb_putc(b, '"');
}

static int newline_indent(tmpl__sb *b, int indent, int depth) {
    int rc = tmpl__sb_putc(b, '\n');
    for (int i = 0; i < indent * depth && !rc; i++) rc = tmpl__sb_putc(b, ' ');
    return rc;
}

static int cmp_entry(const void *x, const void *y) {
    const tv_entry *a = *(const tv_entry *const *)x, *b = *(const tv_entry *const *)y;
    size_t n = a->kn < b->kn ? a->kn : b->kn;
    int c = memcmp(a->k, b->k, n);
    return c ? c : (a->kn > b->kn) - (a->kn < b->kn);
}

int tmpl__to_json(tmpl__sb *b, const tmpl_value *v, int indent, const char *item_sep, const char *key_sep,
                  int sort_keys, int ensure_ascii, int depth) {
    if (depth > 128) return CM_ERANGE;
    const char *isep = item_sep ? item_sep : indent >= 0 ? "," : ", ";
    const char *ksep = key_sep ? key_sep : ": ";
    char buf[64];
    int rc = 0;
    switch (v->type) {
    case TV_UNDEF: case TV_NONE: return tmpl__sb_put(b, "null", 4);
    case TV_BOOL: return v->u.b ? tmpl__sb_put(b, "true", 4) : tmpl__sb_put(b, "false", 5);
    case TV_INT: return tmpl__sb_printf(b, "%lld", (long long)v->u.i);
    case TV_FLOAT:
        if (isnan(v->u.f)) return tmpl__sb_put(b, "NaN", 3);
        if (isinf(v->u.f)) return v->u.f < 0 ? tmpl__sb_put(b, "-Infinity", 9) : tmpl__sb_put(b, "Infinity", 8);
        tmpl__fmt_float(buf, sizeof buf, v->u.f);
        return tmpl__sb_put(b, buf, strlen(buf));
    case TV_STR: return json_str(b, v->u.s.p, v->u.s.n, ensure_ascii);
    case TV_LIST: {
        const tv_list *l = v->u.l;
        if (!l->n) return tmpl__sb_put(b, "[]", 2);
        rc = tmpl__sb_putc(b, '[');
        for (size_t i = 0; i < l->n && !rc; i++) {
            if (i) rc = tmpl__sb_put(b, isep, strlen(isep));
            if (!rc && indent >= 0) rc = newline_indent(b, indent, depth + 1);
            if (!rc) rc = tmpl__to_json(b, l->v[i], indent, item_sep, key_sep, sort_keys, ensure_ascii, depth + 1);
        }
        if (!rc && indent >= 0) rc = newline_indent(b, indent, depth);
        return rc ? rc : tmpl__sb_putc(b, ']');
    }
    case TV_DICT: case TV_NS: {
        const tv_dict *d = v->u.d;
        if (!d->n) return tmpl__sb_put(b, "{}", 2);
        const tv_entry **order = malloc(d->n * sizeof *order);
        if (!order) return CM_ENOMEM;
        for (size_t i = 0; i < d->n; i++) order[i] = &d->e[i];
        if (sort_keys) qsort(order, d->n, sizeof *order, cmp_entry);
        rc = tmpl__sb_putc(b, '{');
        for (size_t i = 0; i < d->n && !rc; i++) {
            if (i) rc = tmpl__sb_put(b, isep, strlen(isep));
            if (!rc && indent >= 0) rc = newline_indent(b, indent, depth + 1);
            if (!rc) rc = json_str(b, order[i]->k, order[i]->kn, ensure_ascii);
            if (!rc) rc = tmpl__sb_put(b, ksep, strlen(ksep));
            if (!rc) rc = tmpl__to_json(b, order[i]->v, indent, item_sep, key_sep, sort_keys, ensure_ascii, depth + 1);
        }
        free(order);
        if (!rc && indent >= 0) rc = newline_indent(b, indent, depth);
        return rc ? rc : tmpl__sb_putc(b, '}');
    }
    default: return CM_EINVAL; /* not serializable */
    }
}
