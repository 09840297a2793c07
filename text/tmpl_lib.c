/* tmpl_lib: the filters, tests, methods and global functions templates may call.
 *
 * Filters: abs, attr, capitalize, center, count, d, default, dictsort, e, escape, first, float,
 *   forceescape, format, indent, int, items, join, last, length, list, lower, map, max, min,
 *   pprint, reject, rejectattr, replace, reverse, round, safe, select, selectattr, sort, string,
 *   sum, title, tojson, trim, unique, upper, wordcount.
 * Tests: boolean, callable, defined, divisibleby, eq/equalto/==, even, false, filter?, float, ge/>=,
 *   gt/greaterthan/>, in, integer, iterable, le/<=, lower, lt/lessthan/<, mapping, ne/!=, none,
 *   number, odd, sameas, sequence, string, true, undefined, upper.
 * Methods: str: strip lstrip rstrip split rsplit splitlines startswith endswith upper lower
 *   title capitalize replace find rfind count join format isdigit isalpha isalnum isspace
 *   islower isupper removeprefix removesuffix; list: append extend pop insert index count;
 *   dict: get items keys values update pop setdefault; loop: cycle.
 * Globals: range, namespace, raise_exception, strftime_now, dict.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cm_err.h"
#include "tmpl_internal.h"

#define ERR(...) tmpl__err(r, at, CM_ETEMPLATE, __VA_ARGS__)

/* ---- small helpers ------------------------------------------------------------------------ */
static tmpl_value *arg(tmpl__args *a, int i, const char *name) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    size_t n = name ? strlen(name) : 0;
    for (int k = 0; name && k < a->nkw; k++)
        if (a->kwn[k].n == n && !memcmp(a->kwn[k].p, name, n)) return a->kw[k];
    return NULL;
}

static int want_str(tmpl__rs *r, const tnode *at, tmpl_value *v, const char *what) {
    if (v && v->type == TV_STR) return 0;
    return ERR("%s must be a string, not '%s'", what, v ? tmpl__type_name(v) : "nothing");
}

static int want_int(tmpl__rs *r, const tnode *at, tmpl_value *v, const char *what, int64_t *out) {
    if (v && v->type == TV_INT) { *out = v->u.i; return 0; }
    if (v && v->type == TV_BOOL) { *out = v->u.b; return 0; }
    return ERR("%s must be an integer, not '%s'", what, v ? tmpl__type_name(v) : "nothing");
}

static int ret_str(tmpl__rs *r, const tnode *at, const char *p, size_t n, int copy, tmpl_value **out) {
    *out = tmpl__v_str(&r->a, p ? p : "", n, copy);
    return *out ? 0 : tmpl__oom(r, at);
}

static int ret_sb(tmpl__rs *r, const tnode *at, tmpl__sb *sb, int rc, tmpl_value **out) {
    if (!rc) rc = ret_str(r, at, sb->p, sb->n, 1, out);
    else if (rc == CM_ETOOBIG) rc = tmpl__err(r, at, CM_ETOOBIG, "string longer than %zu bytes", r->max_output);
    else if (rc == CM_ENOMEM) rc = tmpl__oom(r, at);
    else if (rc == CM_EINVAL) rc = ERR("value is not JSON serializable");
    else if (rc == CM_ERANGE) rc = ERR("value nested too deeply for JSON");
    else rc = ERR("%s", cm_err_str(rc));
    tmpl__sb_free(sb);
    return rc;
}

static int ret_int(tmpl__rs *r, const tnode *at, int64_t i, tmpl_value **out) {
    *out = tmpl__v_int(&r->a, i);
    return *out ? 0 : tmpl__oom(r, at);
}

static int ret_float(tmpl__rs *r, const tnode *at, double f, tmpl_value **out) {
    *out = tmpl__v_float(&r->a, f);
    return *out ? 0 : tmpl__oom(r, at);
}

/* str(v) as a value (strings pass through). */
static int as_str(tmpl__rs *r, const tnode *at, tmpl_value *v, tmpl_value **out) {
    if (v->type == TV_STR) { *out = v; return 0; }
    tmpl__sb sb = {.max = r->max_output};
    return ret_sb(r, at, &sb, tmpl__to_str(&sb, v), out);
}

static uint32_t decode_cp(const char *p, size_t n, size_t *len) {
    size_t l = tmpl__cp_len(p, n);
    uint8_t c = (uint8_t)p[0];
    uint32_t cp = l == 1 ? c : l == 2 ? (c & 0x1Fu) : l == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; k < l; k++) cp = (cp << 6) | ((uint8_t)p[k] & 0x3Fu);
    *len = l;
    return cp;
}

static int is_space_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python str.strip/lstrip/rstrip: chars NULL strips whitespace, else any code point in chars. */
static void strip_range(const char *p, size_t n, const tmpl_value *chars, int left, int right, size_t *b, size_t *e) {
    size_t i = 0, j = n;
    if (left) {
        while (i < j) {
            size_t l;
            uint32_t cp = decode_cp(p + i, j - i, &l);
            int in = 0;
            if (chars) {
                for (size_t k = 0; k < chars->u.s.n && !in;) {
                    size_t cl;
                    in = decode_cp(chars->u.s.p + k, chars->u.s.n - k, &cl) == cp;
                    k += cl;
                }
            } else in = is_space_cp(cp);
            if (!in) break;
            i += l;
        }
    }
    if (right) {
        while (j > i) {
            size_t s = j - 1;
            while (s > i && ((uint8_t)p[s] & 0xC0) == 0x80 && j - s < 4) s--;
            size_t l;
            uint32_t cp = decode_cp(p + s, j - s, &l);
            if (s + l != j) { s = j - 1; cp = (uint8_t)p[s]; }
            int in = 0;
            if (chars) {
                for (size_t k = 0; k < chars->u.s.n && !in;) {
                    size_t cl;
                    in = decode_cp(chars->u.s.p + k, chars->u.s.n - k, &cl) == cp;
                    k += cl;
                }
            } else in = is_space_cp(cp);
            if (!in) break;
            j = s;
        }
    }
    *b = i;
    *e = j;
}

static char up(char c) { return c >= 'a' && c <= 'z' ? (char)(c - 32) : c; }
static char lo(char c) { return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c; }
static int is_alpha_c(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAP, CASE_TITLE_WORDS };
static int change_case(tmpl__rs *r, const tnode *at, tmpl_value *s, int how, tmpl_value **out) {
    char *p = tmpl__alloc(&r->a, s->u.s.n + 1);
    if (!p) return tmpl__oom(r, at);
    int prev_cased = 0;
    for (size_t i = 0; i < s->u.s.n; i++) {
        char c = s->u.s.p[i];
        switch (how) {
        case CASE_UPPER: c = up(c); break;
        case CASE_LOWER: c = lo(c); break;
        case CASE_CAP: c = i == 0 ? up(c) : lo(c); break;
        case CASE_TITLE_WORDS: /* Jinja's title filter: words start after whitespace, - ( { [ < */
            c = prev_cased ? lo(c) : up(c);
            prev_cased = !(c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '-' ||
                           c == '(' || c == '{' || c == '[' || c == '<');
            break;
        default: /* str.title(): words are runs of letters */
            c = prev_cased ? lo(c) : up(c);
            prev_cased = is_alpha_c(c) || ((uint8_t)c >= 0x80 && prev_cased);
        }
        p[i] = c;
    }
    p[s->u.s.n] = 0;
    return ret_str(r, at, p, s->u.s.n, 0, out);
}

/* Attribute path "a.b.0" for map/selectattr/sort/join/sum/unique/min/max. */
static tmpl_value *attr_path(tmpl__rs *r, tmpl_value *v, tmpl_value *attr) {
    if (attr->type == TV_INT) {
        tmpl_value *o;
        return tmpl__getitem(r, NULL, v, attr, &o) ? &tmpl__undef : o;
    }
    const char *p = attr->u.s.p, *end = p + attr->u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        int all_digits = n > 0 && n < 18;
        for (size_t i = 0; i < n && all_digits; i++) all_digits = p[i] >= '0' && p[i] <= '9';
        if (all_digits && v->type == TV_LIST) {
            int64_t idx = strtoll(p, NULL, 10);
            v = idx < (int64_t)v->u.l->n ? v->u.l->v[idx] : &tmpl__undef;
        } else {
            v = tmpl__getattr(r, v, p, n);
        }
        if (!dot) break;
        p = dot + 1;
    }
    return v;
}

static int get_attr_arg(tmpl__rs *r, const tnode *at, tmpl_value *a, tmpl_value **attr) {
    *attr = NULL;
    if (!a || a->type == TV_NONE || a->type == TV_UNDEF) return 0;
    if (a->type != TV_STR && a->type != TV_INT) return ERR("attribute must be a string or an integer");
    *attr = a;
    return 0;
}

/* Sorting: Python ordering of numbers and strings (case-insensitive unless asked), stable. */
typedef struct sort_ctx { tmpl__rs *r; const tnode *at; tmpl_value *attr; int case_sensitive, by_value, bad, depth; } sort_ctx;
typedef struct sort_item { tmpl_value *v, *key; size_t idx; } sort_item;

static int cmp_values(sort_ctx *c, tmpl_value *a, tmpl_value *b) {
    int an = a->type == TV_INT || a->type == TV_FLOAT || a->type == TV_BOOL;
    int bn = b->type == TV_INT || b->type == TV_FLOAT || b->type == TV_BOOL;
    if (an && bn) {
        if (a->type != TV_FLOAT && b->type != TV_FLOAT) {
            int64_t x = a->type == TV_BOOL ? a->u.b : a->u.i, y = b->type == TV_BOOL ? b->u.b : b->u.i;
            return (x > y) - (x < y);
        }
        double x = a->type == TV_FLOAT ? a->u.f : a->type == TV_BOOL ? a->u.b : (double)a->u.i;
        double y = b->type == TV_FLOAT ? b->u.f : b->type == TV_BOOL ? b->u.b : (double)b->u.i;
        return (x > y) - (x < y);
    }
    if (a->type == TV_STR && b->type == TV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        for (size_t i = 0; i < n; i++) {
            unsigned char x = (unsigned char)a->u.s.p[i], y = (unsigned char)b->u.s.p[i];
            if (!c->case_sensitive) { x = (unsigned char)lo((char)x); y = (unsigned char)lo((char)y); }
            if (x != y) return x < y ? -1 : 1;
        }
        return (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    }
    if (a->type == TV_LIST && b->type == TV_LIST) {
        if (c->depth > 64) { c->bad = 1; return 0; } /* cyclic or absurdly nested */
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        c->depth++;
        for (size_t i = 0; i < n; i++) {
            int k = cmp_values(c, a->u.l->v[i], b->u.l->v[i]);
            if (k) { c->depth--; return k; }
        }
        c->depth--;
        return (a->u.l->n > b->u.l->n) - (a->u.l->n < b->u.l->n);
    }
    if ((a->type == TV_NONE && b->type == TV_NONE) || (a->type == TV_UNDEF && b->type == TV_UNDEF)) return 0;
    c->bad = 1;
    return 0;
}

static int cmp_items(const void *x, const void *y, void *ctx) {
    const sort_item *a = x, *b = y;
    int k = cmp_values(ctx, a->key, b->key);
    return k ? k : (a->idx > b->idx) - (a->idx < b->idx);
}

static int sorted_items(tmpl__rs *r, const tnode *at, tmpl_value **v, size_t n, tmpl_value *attr, int cs, int reverse,
                        tmpl_value **out) {
    sort_item *it = n ? malloc(n * sizeof *it) : NULL;
    if (n && !it) return tmpl__oom(r, at);
    for (size_t i = 0; i < n; i++) { it[i].v = v[i]; it[i].key = attr ? attr_path(r, v[i], attr) : v[i]; it[i].idx = i; }
    sort_ctx c = {r, at, attr, cs, 0, 0, 0};
    if (n > 1) qsort_r(it, n, sizeof *it, cmp_items, &c);
    if (c.bad) { free(it); return ERR("cannot sort values of different or unorderable types"); }
    tmpl_value *l = tmpl__v_list(&r->a, n);
    if (!l) { free(it); return tmpl__oom(r, at); }
    for (size_t i = 0; i < n; i++) l->u.l->v[i] = it[reverse ? n - 1 - i : i].v;
    l->u.l->n = n;
    free(it);
    *out = l;
    return tmpl__step(r, at);
}

/* Items of an iterable for filters: list items, dict keys, string characters. */
static int seq_of(tmpl__rs *r, const tnode *at, tmpl_value *v, tmpl_value ***items, size_t *n, const char *fname) {
    *items = NULL;
    *n = 0;
    if (v->type == TV_LIST) { *items = v->u.l->v; *n = v->u.l->n; return 0; }
    if (v->type == TV_UNDEF) return 0;
    if (v->type == TV_DICT) {
        tmpl_value **k = v->u.d->n ? tmpl__alloc(&r->a, v->u.d->n * sizeof *k) : NULL;
        if (v->u.d->n && !k) return tmpl__oom(r, at);
        for (size_t i = 0; i < v->u.d->n; i++)
            if (!(k[i] = tmpl__v_str(&r->a, v->u.d->e[i].k, v->u.d->e[i].kn, 0))) return tmpl__oom(r, at);
        *items = k;
        *n = v->u.d->n;
        return 0;
    }
    if (v->type == TV_STR) {
        size_t c = tmpl__cp_count(v->u.s.p, v->u.s.n), off = 0;
        tmpl_value **k = c ? tmpl__alloc(&r->a, c * sizeof *k) : NULL;
        if (c && !k) return tmpl__oom(r, at);
        for (size_t i = 0; i < c; i++) {
            size_t l = tmpl__cp_len(v->u.s.p + off, v->u.s.n - off);
            if (!(k[i] = tmpl__v_str(&r->a, v->u.s.p + off, l, 0))) return tmpl__oom(r, at);
            off += l;
        }
        *items = k;
        *n = c;
        return 0;
    }
    return ERR("filter '%s' needs a sequence, not '%s'", fname, tmpl__type_name(v));
}

static int new_list(tmpl__rs *r, const tnode *at, size_t cap, tmpl_value **out) {
    *out = tmpl__v_list(&r->a, cap);
    return *out ? 0 : tmpl__oom(r, at);
}

/* ---- tests -------------------------------------------------------------------------------- */
static const struct { const char *name; int arity; } test_table[] = {
    {"defined", 0}, {"undefined", 0}, {"none", 0}, {"boolean", 0}, {"false", 0}, {"true", 0}, {"integer", 0},
    {"float", 0}, {"number", 0}, {"string", 0}, {"mapping", 0}, {"iterable", 0}, {"sequence", 0}, {"callable", 0},
    {"odd", 0}, {"even", 0}, {"lower", 0}, {"upper", 0}, {"escaped", 0},
    {"divisibleby", 1}, {"eq", 1}, {"equalto", 1}, {"==", 1}, {"ne", 1}, {"!=", 1}, {"lt", 1}, {"lessthan", 1},
    {"<", 1}, {"le", 1}, {"<=", 1}, {"gt", 1}, {"greaterthan", 1}, {">", 1}, {"ge", 1}, {">=", 1}, {"in", 1},
    {"sameas", 1},
};

int tmpl__test_arity(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof test_table / sizeof test_table[0]; i++)
        if (strlen(test_table[i].name) == n && !memcmp(test_table[i].name, name, n)) return test_table[i].arity;
    return -1;
}

int tmpl__test(tmpl__rs *r, const tnode *at, const tname *tn, tmpl_value *v, tmpl__args *args, int *out) {
    const char *s = tn->p;
    size_t n = tn->n;
#define IS(lit) TMPL_NAME_EQ(s, n, lit)
    int t = v->type;
    if (IS("defined")) *out = t != TV_UNDEF;
    else if (IS("undefined")) *out = t == TV_UNDEF;
    else if (IS("none")) *out = t == TV_NONE;
    else if (IS("boolean")) *out = t == TV_BOOL;
    else if (IS("false")) *out = t == TV_BOOL && !v->u.b;
    else if (IS("true")) *out = t == TV_BOOL && v->u.b;
    else if (IS("integer")) *out = t == TV_INT;
    else if (IS("float")) *out = t == TV_FLOAT;
    else if (IS("number")) *out = t == TV_INT || t == TV_FLOAT || t == TV_BOOL;
    else if (IS("string")) *out = t == TV_STR;
    else if (IS("mapping")) *out = t == TV_DICT;
    else if (IS("iterable")) *out = t == TV_LIST || t == TV_DICT || t == TV_STR;
    else if (IS("sequence")) *out = t == TV_LIST || t == TV_DICT || t == TV_STR;
    else if (IS("callable")) *out = t == TV_MACRO || t == TV_BUILTIN || t == TV_METHOD;
    else if (IS("escaped")) *out = 0;
    else if (IS("odd") || IS("even")) {
        if (t != TV_INT) return ERR("test '%.*s' needs an integer, not '%s'", (int)n, s, tmpl__type_name(v));
        *out = (v->u.i % 2 != 0) == IS("odd");
    } else if (IS("lower") || IS("upper")) {
        *out = 0;
        if (t == TV_STR) {
            int ok = 1, cased = 0;
            for (size_t i = 0; i < v->u.s.n; i++) {
                char c = v->u.s.p[i];
                if (is_alpha_c(c)) { cased = 1; if (IS("lower") ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) ok = 0; }
            }
            *out = ok && cased;
        }
    } else {
        tmpl_value *o = arg(args, 0, NULL);
        if (tmpl__test_arity(s, n) != 1) return ERR("unknown test '%.*s'", (int)n, s);
        if (!o) return ERR("test '%.*s' needs an argument", (int)n, s);
        if (IS("divisibleby")) {
            int64_t d = 0;
            if (t != TV_INT || want_int(r, at, o, "divisibleby argument", &d)) return ERR("divisibleby needs integers");
            if (d == 0) return ERR("division by zero");
            *out = d == -1 || v->u.i % d == 0;
        } else if (IS("eq") || IS("equalto") || IS("==")) *out = tmpl__equal(v, o);
        else if (IS("ne") || IS("!=")) *out = !tmpl__equal(v, o);
        else if (IS("sameas")) /* Python 'is': singletons, and equal scalars (small ints, interned strings) */
            *out = v == o || (v->type == o->type && (t == TV_NONE || t == TV_UNDEF || t == TV_BOOL || t == TV_STR ||
                                                     (t == TV_INT && v->u.i >= -5 && v->u.i <= 256)) && tmpl__equal(v, o));
        else if (IS("in")) {
            *out = 0;
            if (o->type == TV_STR && t == TV_STR) *out = !v->u.s.n || memmem(o->u.s.p, o->u.s.n, v->u.s.p, v->u.s.n) != NULL;
            else if (o->type == TV_LIST) for (size_t i = 0; i < o->u.l->n && !*out; i++) *out = tmpl__equal(v, o->u.l->v[i]);
            else if (o->type == TV_DICT) *out = t == TV_STR && tmpl__dict_get(o->u.d, v->u.s.p, v->u.s.n) != NULL;
            else return ERR("test 'in' needs a container");
        } else {
            sort_ctx c = {r, at, NULL, 1, 0, 0, 0};
            int k = cmp_values(&c, v, o);
            if (c.bad || (v->type == TV_STR) != (o->type == TV_STR) || v->type == TV_LIST)
                return ERR("cannot compare '%s' with '%s'", tmpl__type_name(v), tmpl__type_name(o));
            if (IS("lt") || IS("lessthan") || IS("<")) *out = k < 0;
            else if (IS("le") || IS("<=")) *out = k <= 0;
            else if (IS("gt") || IS("greaterthan") || IS(">")) *out = k > 0;
            else *out = k >= 0;
        }
    }
#undef IS
    return 0;
}

/* ---- filters ------------------------------------------------------------------------------ */
static const char *const filter_names[] = {
    "abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
    "min", "pprint", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr",
    "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", NULL};

int tmpl__filter_known(const char *name, size_t n) {
    for (int i = 0; filter_names[i]; i++)
        if (strlen(filter_names[i]) == n && !memcmp(filter_names[i], name, n)) return 1;
    return 0;
}

static int parse_int(const char *p, size_t n, int base, int64_t *out) {
    char buf[80];
    size_t b = 0, e = n;
    while (b < e && is_space_cp((uint8_t)p[b])) b++;
    while (e > b && is_space_cp((uint8_t)p[e - 1])) e--;
    if (e - b == 0 || e - b >= sizeof buf) return -1;
    size_t w = 0;
    for (size_t i = b; i < e; i++)
        if (p[i] != '_') buf[w++] = p[i];
    buf[w] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, base);
    if (*end || errno) return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *p, size_t n, double *out) {
    char buf[80];
    size_t b = 0, e = n;
    while (b < e && is_space_cp((uint8_t)p[b])) b++;
    while (e > b && is_space_cp((uint8_t)p[e - 1])) e--;
    if (e - b == 0 || e - b >= sizeof buf) return -1;
    memcpy(buf, p + b, e - b);
    buf[e - b] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (*end) return -1;
    *out = v;
    return 0;
}

static int select_like(tmpl__rs *r, const tnode *at, tmpl_value *v, tmpl__args *args, int by_attr, int keep, const char *fname,
                       tmpl_value **out) {
    tmpl_value **items, *l;
    size_t n;
    int rc;
    if ((rc = seq_of(r, at, v, &items, &n, fname)) || (rc = new_list(r, at, n, &l))) return rc;
    int first = 0;
    tmpl_value *attr = NULL;
    if (by_attr) {
        if (!(attr = arg(args, 0, NULL)) || (attr->type != TV_STR && attr->type != TV_INT))
            return ERR("%s needs an attribute name", fname);
        first = 1;
    }
    tmpl_value *test = arg(args, first, NULL);
    if (test && test->type != TV_STR) return ERR("%s: the test name must be a string", fname);
    tname tn = {test ? test->u.s.p : NULL, test ? test->u.s.n : 0};
    if (test && tmpl__test_arity(tn.p, tn.n) < 0) return ERR("unknown test '%.*s'", (int)tn.n, tn.p);
    tmpl__args targs = {0};
    if (args->npos > first + 1) { targs.pos = args->pos + first + 1; targs.npos = args->npos - first - 1; }
    for (size_t i = 0; i < n; i++) {
        if ((rc = tmpl__step(r, at))) return rc;
        tmpl_value *x = attr ? attr_path(r, items[i], attr) : items[i];
        int res;
        if (test) { if ((rc = tmpl__test(r, at, &tn, x, &targs, &res))) return rc; }
        else res = tmpl__truthy(x);
        if (res == keep) l->u.l->v[l->u.l->n++] = items[i];
    }
    *out = l;
    return 0;
}

int tmpl__percent_format(tmpl__rs *r, const tnode *at, tmpl_value *fmt, tmpl_value **vals, int nvals, tmpl_value **out) {
    tmpl__sb sb = {.max = r->max_output};
    int rc = 0, k = 0;
    const char *p = fmt->u.s.p, *end = p + fmt->u.s.n;
    while (p < end && !rc) {
        if (*p != '%') { rc = tmpl__sb_putc(&sb, *p++); continue; }
        if (p + 1 >= end) { tmpl__sb_free(&sb); return ERR("incomplete format"); }
        char c = p[1];
        p += 2;
        if (c == '%') { rc = tmpl__sb_putc(&sb, '%'); continue; }
        if (k >= nvals) { tmpl__sb_free(&sb); return ERR("not enough arguments for format string"); }
        tmpl_value *v = vals[k++];
        if (c == 's') rc = tmpl__to_str(&sb, v);
        else if (c == 'r') rc = tmpl__repr(&sb, v, 0);
        else if (c == 'd' || c == 'i') {
            if (v->type == TV_INT || v->type == TV_BOOL) rc = tmpl__sb_printf(&sb, "%lld", (long long)(v->type == TV_INT ? v->u.i : v->u.b));
            else if (v->type == TV_FLOAT) rc = tmpl__sb_printf(&sb, "%lld", (long long)v->u.f);
            else { tmpl__sb_free(&sb); return ERR("%%d format: a number is required"); }
        } else { tmpl__sb_free(&sb); return ERR("unsupported format character '%c'", c); }
    }
    return ret_sb(r, at, &sb, rc, out);
}

static int str_replace(tmpl__rs *r, const tnode *at, tmpl_value *s, tmpl_value *old, tmpl_value *new_, int64_t count, tmpl_value **out) {
    tmpl__sb sb = {.max = r->max_output};
    int rc = 0;
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    if (!old->u.s.n) { /* insert between characters, like Python */
        int64_t done = 0;
        while (!rc) {
            if (count < 0 || done < count) { rc = tmpl__sb_put(&sb, new_->u.s.p, new_->u.s.n); done++; }
            if (p >= end || rc) break;
            size_t l = tmpl__cp_len(p, (size_t)(end - p));
            rc = tmpl__sb_put(&sb, p, l);
            p += l;
        }
        return ret_sb(r, at, &sb, rc, out);
    }
    int64_t done = 0;
    while (p < end && !rc) {
        const char *q = (count < 0 || done < count) ? memmem(p, (size_t)(end - p), old->u.s.p, old->u.s.n) : NULL;
        if (!q) { rc = tmpl__sb_put(&sb, p, (size_t)(end - p)); break; }
        rc = tmpl__sb_put(&sb, p, (size_t)(q - p));
        if (!rc) rc = tmpl__sb_put(&sb, new_->u.s.p, new_->u.s.n);
        p = q + old->u.s.n;
        done++;
    }
    return ret_sb(r, at, &sb, rc, out);
}

static int escape_html(tmpl__rs *r, const tnode *at, tmpl_value *s, tmpl_value **out) {
    tmpl__sb sb = {.max = r->max_output};
    int rc = 0;
    for (size_t i = 0; i < s->u.s.n && !rc; i++) {
        char c = s->u.s.p[i];
        switch (c) {
        case '&': rc = tmpl__sb_put(&sb, "&amp;", 5); break;
        case '<': rc = tmpl__sb_put(&sb, "&lt;", 4); break;
        case '>': rc = tmpl__sb_put(&sb, "&gt;", 4); break;
        case '"': rc = tmpl__sb_put(&sb, "&#34;", 5); break;
        case '\'': rc = tmpl__sb_put(&sb, "&#39;", 5); break;
        default: rc = tmpl__sb_putc(&sb, c);
        }
    }
    return ret_sb(r, at, &sb, rc, out);
}

int tmpl__filter(tmpl__rs *r, const tnode *at, const tname *fn, tmpl_value *v, tmpl__args *args, tmpl_value **out) {
    const char *f = fn->p;
    size_t fl = fn->n;
    int rc;
    int64_t iv = 0;
#define IS(lit) TMPL_NAME_EQ(f, fl, lit)
    *out = &tmpl__undef;
    if (IS("safe")) { *out = v; return 0; }
    if (IS("default") || IS("d")) {
        tmpl_value *dv = arg(args, 0, "default_value"), *bo = arg(args, 1, "boolean");
        int use = v->type == TV_UNDEF || (bo && tmpl__truthy(bo) && !tmpl__truthy(v));
        if (!use) { *out = v; return 0; }
        if (dv) { *out = dv; return 0; }
        return ret_str(r, at, "", 0, 0, out);
    }
    if (IS("tojson")) {
        tmpl_value *ind = arg(args, 0, "indent"), *ea = arg(args, -1, "ensure_ascii"), *sk = arg(args, -1, "sort_keys"),
                   *sep = arg(args, -1, "separators");
        int64_t indent = -1;
        if (ind && ind->type != TV_NONE && (rc = want_int(r, at, ind, "indent", &indent))) return rc;
        if (indent > 64) indent = 64;
        if (indent < -1) indent = 0;
        const char *isep = NULL, *ksep = NULL;
        char *sepbuf[2] = {NULL, NULL};
        if (sep && sep->type != TV_NONE) {
            if (sep->type != TV_LIST || sep->u.l->n != 2 || sep->u.l->v[0]->type != TV_STR || sep->u.l->v[1]->type != TV_STR)
                return ERR("separators must be a pair of strings");
            for (int i = 0; i < 2; i++)
                if (!(sepbuf[i] = tmpl__strdup(&r->a, sep->u.l->v[i]->u.s.p, sep->u.l->v[i]->u.s.n))) return tmpl__oom(r, at);
            isep = sepbuf[0];
            ksep = sepbuf[1];
        }
        tmpl__sb sb = {.max = r->max_output};
        rc = tmpl__to_json(&sb, v, (int)indent, isep, ksep, sk && tmpl__truthy(sk), ea && tmpl__truthy(ea), 0);
        return ret_sb(r, at, &sb, rc, out);
    }
    if (IS("length") || IS("count")) {
        if (v->type == TV_STR) return ret_int(r, at, (int64_t)tmpl__cp_count(v->u.s.p, v->u.s.n), out);
        if (v->type == TV_LIST) return ret_int(r, at, (int64_t)v->u.l->n, out);
        if (v->type == TV_DICT || v->type == TV_NS) return ret_int(r, at, (int64_t)v->u.d->n, out);
        if (v->type == TV_UNDEF) return ret_int(r, at, 0, out);
        return ERR("object of type '%s' has no length", tmpl__type_name(v));
    }
    if (IS("string")) return as_str(r, at, v, out);
    if (IS("pprint")) { tmpl__sb sb = {.max = r->max_output}; return ret_sb(r, at, &sb, tmpl__repr(&sb, v, 0), out); }
    if (IS("trim") || IS("upper") || IS("lower") || IS("capitalize") || IS("title") || IS("escape") || IS("e") ||
        IS("forceescape") || IS("wordcount") || IS("replace") || IS("indent") || IS("format") || IS("center")) {
        tmpl_value *s;
        if (v->type == TV_UNDEF) s = tmpl__v_str(&r->a, "", 0, 0);
        else if ((rc = as_str(r, at, v, &s))) return rc;
        if (!s) return tmpl__oom(r, at);
        if (IS("trim")) {
            tmpl_value *chars = arg(args, 0, "chars");
            if (chars && chars->type == TV_NONE) chars = NULL;
            if (chars && (rc = want_str(r, at, chars, "trim chars"))) return rc;
            size_t b, e;
            strip_range(s->u.s.p, s->u.s.n, chars, 1, 1, &b, &e);
            return ret_str(r, at, s->u.s.p + b, e - b, 0, out);
        }
        if (IS("upper")) return change_case(r, at, s, CASE_UPPER, out);
        if (IS("lower")) return change_case(r, at, s, CASE_LOWER, out);
        if (IS("capitalize")) return change_case(r, at, s, CASE_CAP, out);
        if (IS("title")) return change_case(r, at, s, CASE_TITLE_WORDS, out);
        if (IS("escape") || IS("e") || IS("forceescape")) return escape_html(r, at, s, out);
        if (IS("wordcount")) {
            int64_t words = 0;
            int in = 0;
            for (size_t i = 0; i < s->u.s.n; i++) {
                int sp = is_space_cp((uint8_t)s->u.s.p[i]);
                if (!sp && !in) words++;
                in = !sp;
            }
            return ret_int(r, at, words, out);
        }
        if (IS("format")) return tmpl__percent_format(r, at, s, args->pos, args->npos, out);
        if (IS("center")) { /* str.center(width): extra space goes right when odd, like Python */
            tmpl_value *w = arg(args, 0, "width");
            int64_t width = 80;
            if (w && (rc = want_int(r, at, w, "center width", &width))) return rc;
            size_t len = tmpl__cp_count(s->u.s.p, s->u.s.n);
            if (width > 65536) width = 65536;
            if (width <= (int64_t)len) { *out = s; return 0; }
            size_t pad = (size_t)width - len, left = pad / 2 + (pad & (size_t)width & 1);
            tmpl__sb sb = {.max = r->max_output};
            rc = 0;
            for (size_t i = 0; i < left && !rc; i++) rc = tmpl__sb_putc(&sb, ' ');
            if (!rc) rc = tmpl__sb_put(&sb, s->u.s.p, s->u.s.n);
            for (size_t i = left; i < pad && !rc; i++) rc = tmpl__sb_putc(&sb, ' ');
            return ret_sb(r, at, &sb, rc, out);
        }
        if (IS("replace")) {
            tmpl_value *o = arg(args, 0, "old"), *nw = arg(args, 1, "new"), *c = arg(args, 2, "count");
            int64_t count = -1;
            if ((rc = want_str(r, at, o, "replace: old")) || (rc = want_str(r, at, nw, "replace: new"))) return rc;
            if (c && c->type != TV_NONE && (rc = want_int(r, at, c, "replace: count", &count))) return rc;
            return str_replace(r, at, s, o, nw, count, out);
        }
        /* indent(width=4, first=False, blank=False) */
        tmpl_value *w = arg(args, 0, "width"), *first = arg(args, 1, "first"), *blank = arg(args, 2, "blank");
        tmpl_value *ind;
        if (!w) { if (!(ind = tmpl__v_str(&r->a, "    ", 4, 0))) return tmpl__oom(r, at); }
        else if (w->type == TV_STR) ind = w;
        else {
            if ((rc = want_int(r, at, w, "indent width", &iv))) return rc;
            if (iv < 0) iv = 0;
            if (iv > 1024) return ERR("indent width too large");
            char *sp = tmpl__alloc(&r->a, (size_t)iv + 1);
            if (!sp) return tmpl__oom(r, at);
            memset(sp, ' ', (size_t)iv);
            sp[iv] = 0;
            if (!(ind = tmpl__v_str(&r->a, sp, (size_t)iv, 0))) return tmpl__oom(r, at);
        }
        /* Jinja: lines = (s + "\n").splitlines(), i.e. s split on "\n"; blank lines are
         * indented only with blank=True, the first line only with first=True */
        tmpl__sb sb = {.max = r->max_output};
        rc = 0;
        int want_blank = blank && tmpl__truthy(blank);
        if (first && tmpl__truthy(first)) rc = tmpl__sb_put(&sb, ind->u.s.p, ind->u.s.n);
        const char *p = s->u.s.p, *end = p + s->u.s.n;
        for (int line = 0; !rc; line++) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t ln = nl ? (size_t)(nl - p) : (size_t)(end - p);
            if (line) {
                rc = tmpl__sb_putc(&sb, '\n');
                if (!rc && (ln || want_blank)) rc = tmpl__sb_put(&sb, ind->u.s.p, ind->u.s.n);
            }
            if (!rc) rc = tmpl__sb_put(&sb, p, ln);
            if (!nl) break;
            p = nl + 1;
        }
        return ret_sb(r, at, &sb, rc, out);
    }
    if (IS("abs")) {
        if (v->type == TV_INT) return v->u.i == INT64_MIN ? ret_float(r, at, -(double)v->u.i, out) : ret_int(r, at, v->u.i < 0 ? -v->u.i : v->u.i, out);
        if (v->type == TV_BOOL) return ret_int(r, at, v->u.b, out);
        if (v->type == TV_FLOAT) return ret_float(r, at, fabs(v->u.f), out);
        return ERR("bad operand type for abs(): '%s'", tmpl__type_name(v));
    }
    if (IS("int")) {
        tmpl_value *def = arg(args, 0, "default"), *base = arg(args, 1, "base");
        int64_t b = 10;
        if (base && (rc = want_int(r, at, base, "base", &b))) return rc;
        if (b != 0 && (b < 2 || b > 36)) return ERR("int base must be 0 or 2..36");
        if (v->type == TV_INT) { *out = v; return 0; }
        if (v->type == TV_BOOL) return ret_int(r, at, v->u.b, out);
        if (v->type == TV_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18) return ret_int(r, at, (int64_t)v->u.f, out);
        if (v->type == TV_STR) {
            double d;
            if (!parse_int(v->u.s.p, v->u.s.n, (int)b, &iv)) return ret_int(r, at, iv, out);
            if (!parse_float(v->u.s.p, v->u.s.n, &d) && isfinite(d) && fabs(d) < 9.2e18) return ret_int(r, at, (int64_t)d, out);
        }
        if (def) { *out = def; return 0; }
        return ret_int(r, at, 0, out);
    }
    if (IS("float")) {
        tmpl_value *def = arg(args, 0, "default");
        double d;
        if (v->type == TV_FLOAT) { *out = v; return 0; }
        if (v->type == TV_INT) return ret_float(r, at, (double)v->u.i, out);
        if (v->type == TV_BOOL) return ret_float(r, at, v->u.b, out);
        if (v->type == TV_STR && !parse_float(v->u.s.p, v->u.s.n, &d)) return ret_float(r, at, d, out);
        if (def) { *out = def; return 0; }
        return ret_float(r, at, 0.0, out);
    }
    if (IS("round")) {
        tmpl_value *pr = arg(args, 0, "precision"), *m = arg(args, 1, "method");
        int64_t prec = 0;
        if (pr && (rc = want_int(r, at, pr, "precision", &prec))) return rc;
        if (prec > 15) prec = 15;
        if (prec < -15) prec = -15;
        double x;
        if (v->type == TV_INT) x = (double)v->u.i;
        else if (v->type == TV_FLOAT) x = v->u.f;
        else if (v->type == TV_BOOL) x = v->u.b;
        else return ERR("round needs a number, not '%s'", tmpl__type_name(v));
        double sc = pow(10.0, (double)prec), y = x * sc;
        if (!m || (m->type == TV_STR && TMPL_NAME_EQ(m->u.s.p, m->u.s.n, "common"))) {
            if (prec >= 0 && isfinite(x)) { /* Python round(): the exact binary value, ties to even */
                char buf[400];
                snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
                return ret_float(r, at, strtod(buf, NULL), out);
            }
            y = nearbyint(y);
        }
        else if (m->type == TV_STR && TMPL_NAME_EQ(m->u.s.p, m->u.s.n, "ceil")) y = ceil(y);
        else if (m->type == TV_STR && TMPL_NAME_EQ(m->u.s.p, m->u.s.n, "floor")) y = floor(y);
        else return ERR("round method must be 'common', 'ceil' or 'floor'");
        return ret_float(r, at, y / sc, out);
    }
    if (IS("items")) {
        if (v->type == TV_UNDEF) return new_list(r, at, 0, out);
        if (v->type != TV_DICT && v->type != TV_NS) return ERR("filter 'items' needs a mapping, not '%s'", tmpl__type_name(v));
        tmpl_value *l;
        if ((rc = new_list(r, at, v->u.d->n, &l))) return rc;
        for (size_t i = 0; i < v->u.d->n; i++) {
            tmpl_value *pair = tmpl__v_list(&r->a, 2), *k = tmpl__v_str(&r->a, v->u.d->e[i].k, v->u.d->e[i].kn, 0);
            if (!pair || !k) return tmpl__oom(r, at);
            pair->is_tuple = 1;
            pair->u.l->v[0] = k;
            pair->u.l->v[1] = v->u.d->e[i].v;
            pair->u.l->n = 2;
            l->u.l->v[l->u.l->n++] = pair;
        }
        *out = l;
        return 0;
    }
    if (IS("dictsort")) {
        tmpl_value *cs = arg(args, 0, "case_sensitive"), *by = arg(args, 1, "by"), *rev = arg(args, 2, "reverse");
        if (v->type != TV_DICT) return ERR("filter 'dictsort' needs a mapping, not '%s'", tmpl__type_name(v));
        int by_value = by && by->type == TV_STR && TMPL_NAME_EQ(by->u.s.p, by->u.s.n, "value");
        tmpl_value *pairs, *idx = tmpl__v_int(&r->a, by_value ? 1 : 0);
        tname items = {"items", 5};
        tmpl__args none = {0};
        if (!idx) return tmpl__oom(r, at);
        if ((rc = tmpl__filter(r, at, &items, v, &none, &pairs))) return rc;
        return sorted_items(r, at, pairs->u.l->v, pairs->u.l->n, idx, cs && tmpl__truthy(cs), rev && tmpl__truthy(rev), out);
    }
    if (IS("attr")) {
        tmpl_value *name = arg(args, 0, "name");
        if ((rc = want_str(r, at, name, "attr name"))) return rc;
        *out = tmpl__getattr(r, v, name->u.s.p, name->u.s.n);
        return 0;
    }
    /* sequence filters */
    tmpl_value **items, *l;
    size_t n;
    if (IS("first") || IS("last")) {
        if ((rc = seq_of(r, at, v, &items, &n, IS("first") ? "first" : "last"))) return rc;
        *out = n ? items[IS("first") ? 0 : n - 1] : &tmpl__undef;
        return 0;
    }
    if (IS("list")) {
        if ((rc = seq_of(r, at, v, &items, &n, "list")) || (rc = new_list(r, at, n, &l))) return rc;
        if (n) memcpy(l->u.l->v, items, n * sizeof *items);
        l->u.l->n = n;
        *out = l;
        return 0;
    }
    if (IS("reverse")) {
        if (v->type == TV_STR) {
            char *p = tmpl__alloc(&r->a, v->u.s.n + 1);
            if (!p) return tmpl__oom(r, at);
            size_t w = v->u.s.n;
            for (size_t i = 0; i < v->u.s.n;) {
                size_t cl = tmpl__cp_len(v->u.s.p + i, v->u.s.n - i);
                w -= cl;
                memcpy(p + w, v->u.s.p + i, cl);
                i += cl;
            }
            p[v->u.s.n] = 0;
            return ret_str(r, at, p, v->u.s.n, 0, out);
        }
        if ((rc = seq_of(r, at, v, &items, &n, "reverse")) || (rc = new_list(r, at, n, &l))) return rc;
        for (size_t i = 0; i < n; i++) l->u.l->v[i] = items[n - 1 - i];
        l->u.l->n = n;
        *out = l;
        return 0;
    }
    if (IS("join")) {
        tmpl_value *sep = arg(args, 0, "d"), *attr;
        if (sep && (rc = want_str(r, at, sep, "join separator"))) return rc;
        if ((rc = get_attr_arg(r, at, arg(args, 1, "attribute"), &attr)) || (rc = seq_of(r, at, v, &items, &n, "join"))) return rc;
        tmpl__sb sb = {.max = r->max_output};
        rc = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            if (i && sep) rc = tmpl__sb_put(&sb, sep->u.s.p, sep->u.s.n);
            if (!rc) rc = tmpl__to_str(&sb, attr ? attr_path(r, items[i], attr) : items[i]);
        }
        return ret_sb(r, at, &sb, rc, out);
    }
    if (IS("sort")) {
        tmpl_value *rev = arg(args, 0, "reverse"), *cs = arg(args, 1, "case_sensitive"), *attr;
        if ((rc = get_attr_arg(r, at, arg(args, 2, "attribute"), &attr)) || (rc = seq_of(r, at, v, &items, &n, "sort"))) return rc;
        return sorted_items(r, at, items, n, attr, cs && tmpl__truthy(cs), rev && tmpl__truthy(rev), out);
    }
    if (IS("min") || IS("max")) {
        tmpl_value *cs = arg(args, 0, "case_sensitive"), *attr, *sorted;
        if ((rc = get_attr_arg(r, at, arg(args, 1, "attribute"), &attr)) || (rc = seq_of(r, at, v, &items, &n, "min/max"))) return rc;
        if (!n) return 0; /* undefined, like Jinja */
        if ((rc = sorted_items(r, at, items, n, attr, cs && tmpl__truthy(cs), 0, &sorted))) return rc;
        *out = sorted->u.l->v[IS("min") ? 0 : n - 1];
        return 0;
    }
    if (IS("unique")) {
        tmpl_value *cs = arg(args, 0, "case_sensitive"), *attr;
        if ((rc = get_attr_arg(r, at, arg(args, 1, "attribute"), &attr)) || (rc = seq_of(r, at, v, &items, &n, "unique")) ||
            (rc = new_list(r, at, n, &l)))
            return rc;
        int sensitive = cs && tmpl__truthy(cs);
        sort_ctx c = {r, at, NULL, sensitive, 0, 0, 0};
        for (size_t i = 0; i < n; i++) {
            tmpl_value *ki = attr ? attr_path(r, items[i], attr) : items[i];
            int dup = 0;
            for (size_t j = 0; j < l->u.l->n && !dup; j++) {
                if ((rc = tmpl__step(r, at))) return rc;
                tmpl_value *kj = attr ? attr_path(r, l->u.l->v[j], attr) : l->u.l->v[j];
                if (ki->type == TV_STR && kj->type == TV_STR && !sensitive) { c.bad = 0; dup = cmp_values(&c, ki, kj) == 0; }
                else dup = tmpl__equal(ki, kj);
            }
            if (!dup) l->u.l->v[l->u.l->n++] = items[i];
        }
        *out = l;
        return 0;
    }
    if (IS("sum")) {
        tmpl_value *attr, *acc = arg(args, 1, "start");
        if ((rc = get_attr_arg(r, at, arg(args, 0, "attribute"), &attr)) || (rc = seq_of(r, at, v, &items, &n, "sum"))) return rc;
        int is_int = 1;
        int64_t si = 0;
        double sf = 0;
        if (acc) {
            if (acc->type == TV_INT || acc->type == TV_BOOL) si = acc->type == TV_INT ? acc->u.i : acc->u.b;
            else if (acc->type == TV_FLOAT) { is_int = 0; sf = acc->u.f; }
            else return ERR("sum start must be a number");
        }
        for (size_t i = 0; i < n; i++) {
            tmpl_value *x = attr ? attr_path(r, items[i], attr) : items[i];
            if (x->type == TV_INT || x->type == TV_BOOL) {
                int64_t k = x->type == TV_INT ? x->u.i : x->u.b;
                if (is_int && __builtin_add_overflow(si, k, &si)) { is_int = 0; sf = (double)si + (double)k; }
                else if (!is_int) sf += (double)k;
            } else if (x->type == TV_FLOAT) {
                if (is_int) { is_int = 0; sf = (double)si; }
                sf += x->u.f;
            } else {
                return ERR("sum: unsupported operand '%s'", tmpl__type_name(x));
            }
        }
        return is_int ? ret_int(r, at, si, out) : ret_float(r, at, sf, out);
    }
    if (IS("map")) {
        tmpl_value *attr = arg(args, -1, "attribute"), *def = arg(args, -1, "default");
        if ((rc = seq_of(r, at, v, &items, &n, "map")) || (rc = new_list(r, at, n, &l))) return rc;
        if (attr) {
            if (attr->type != TV_STR && attr->type != TV_INT) return ERR("map: attribute must be a string");
            for (size_t i = 0; i < n; i++) {
                tmpl_value *x = attr_path(r, items[i], attr);
                l->u.l->v[i] = x->type == TV_UNDEF && def ? def : x;
            }
        } else {
            tmpl_value *fname = arg(args, 0, NULL);
            if (!fname || fname->type != TV_STR) return ERR("map needs a filter name or attribute=");
            tname sub = {fname->u.s.p, fname->u.s.n};
            if (!tmpl__filter_known(sub.p, sub.n)) return ERR("unknown filter '%.*s'", (int)sub.n, sub.p);
            tmpl__args sargs = {0};
            if (args->npos > 1) { sargs.pos = args->pos + 1; sargs.npos = args->npos - 1; }
            for (size_t i = 0; i < n; i++) {
                if ((rc = tmpl__step(r, at)) || (rc = tmpl__filter(r, at, &sub, items[i], &sargs, &l->u.l->v[i]))) return rc;
            }
        }
        l->u.l->n = n;
        *out = l;
        return 0;
    }
    if (IS("select")) return select_like(r, at, v, args, 0, 1, "select", out);
    if (IS("reject")) return select_like(r, at, v, args, 0, 0, "reject", out);
    if (IS("selectattr")) return select_like(r, at, v, args, 1, 1, "selectattr", out);
    if (IS("rejectattr")) return select_like(r, at, v, args, 1, 0, "rejectattr", out);
#undef IS
    return ERR("unknown filter '%.*s'", (int)fl, f);
}

/* ---- methods ------------------------------------------------------------------------------ */
static const char *const str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower", "title",
    "capitalize", "replace", "find", "rfind", "count", "join", "format", "isdigit", "isalpha", "isalnum", "isspace",
    "islower", "isupper", "removeprefix", "removesuffix", NULL};
static const char *const list_methods[] = {"append", "extend", "pop", "insert", "index", "count", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", "update", "pop", "setdefault", NULL};

static int in_list(const char *const *l, const char *name, size_t n) {
    for (int i = 0; l[i]; i++)
        if (strlen(l[i]) == n && !memcmp(l[i], name, n)) return 1;
    return 0;
}

int tmpl__has_method(const tmpl_value *self, const char *name, size_t n) {
    switch (self->type) {
    case TV_STR: return in_list(str_methods, name, n);
    case TV_LIST: return in_list(list_methods, name, n);
    case TV_DICT: return in_list(dict_methods, name, n);
    case TV_LOOP: return TMPL_NAME_EQ(name, n, "cycle");
    default: return 0;
    }
}

static int split_str(tmpl__rs *r, const tnode *at, tmpl_value *s, tmpl_value *sep, int64_t maxsplit, int from_right, tmpl_value **out) {
    tmpl_value *l;
    int rc;
    if ((rc = new_list(r, at, 0, &l))) return rc;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (sep && sep->type != TV_NONE) {
        if ((rc = want_str(r, at, sep, "separator"))) return rc;
        if (!sep->u.s.n) return ERR("empty separator");
        if (!from_right || maxsplit < 0) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *q = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
                size_t e = q ? (size_t)(q - p) : n;
                if (tmpl__list_push(&r->a, l->u.l, tmpl__v_str(&r->a, p + i, e - i, 1))) return tmpl__oom(r, at);
                if ((rc = tmpl__step(r, at))) return rc;
                if (!q) break;
                i = e + sep->u.s.n;
                done++;
            }
        } else { /* rsplit with a limit: collect from the right, then reverse */
            size_t e = n;
            int64_t done = 0;
            while (done < maxsplit) {
                const char *q = NULL;
                for (size_t k = e >= sep->u.s.n ? e - sep->u.s.n + 1 : 0; k-- > 0;)
                    if (!memcmp(p + k, sep->u.s.p, sep->u.s.n)) { q = p + k; break; }
                if (!q) break;
                size_t b = (size_t)(q - p) + sep->u.s.n;
                if (tmpl__list_push(&r->a, l->u.l, tmpl__v_str(&r->a, p + b, e - b, 1))) return tmpl__oom(r, at);
                e = (size_t)(q - p);
                done++;
            }
            if (tmpl__list_push(&r->a, l->u.l, tmpl__v_str(&r->a, p, e, 1))) return tmpl__oom(r, at);
            for (size_t i = 0, j = l->u.l->n - 1; i < j; i++, j--) { tmpl_value *t = l->u.l->v[i]; l->u.l->v[i] = l->u.l->v[j]; l->u.l->v[j] = t; }
        }
        *out = l;
        return 0;
    }
    /* whitespace runs; from_right with a limit is rare: treated like split */
    size_t i = 0;
    int64_t done = 0;
    while (i < n) {
        while (i < n && is_space_cp((uint8_t)p[i])) i++;
        if (i >= n) break;
        size_t b = i;
        if (maxsplit >= 0 && done >= maxsplit) { /* the rest, trailing whitespace kept (Python) */
            if (tmpl__list_push(&r->a, l->u.l, tmpl__v_str(&r->a, p + b, n - b, 1))) return tmpl__oom(r, at);
            break;
        }
        while (i < n && !is_space_cp((uint8_t)p[i])) i++;
        if (tmpl__list_push(&r->a, l->u.l, tmpl__v_str(&r->a, p + b, i - b, 1))) return tmpl__oom(r, at);
        if ((rc = tmpl__step(r, at))) return rc;
        done++;
    }
    *out = l;
    return 0;
}

static int affix_match(tmpl__rs *r, const tnode *at, tmpl_value *s, tmpl_value *x, int end, int *res) {
    *res = 0;
    if (x && x->type == TV_LIST) {
        for (size_t i = 0; i < x->u.l->n && !*res; i++) {
            int rc = affix_match(r, at, s, x->u.l->v[i], end, res);
            if (rc) return rc;
        }
        return 0;
    }
    int rc = want_str(r, at, x, end ? "endswith argument" : "startswith argument");
    if (rc) return rc;
    if (x->u.s.n > s->u.s.n) return 0;
    *res = !memcmp(s->u.s.p + (end ? s->u.s.n - x->u.s.n : 0), x->u.s.p, x->u.s.n);
    return 0;
}

static int str_format(tmpl__rs *r, const tnode *at, tmpl_value *s, tmpl__args *args, tmpl_value **out) {
    tmpl__sb sb = {.max = r->max_output};
    int rc = 0, auto_idx = 0;
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    while (p < end && !rc) {
        if (*p == '{' && p + 1 < end && p[1] == '{') { rc = tmpl__sb_putc(&sb, '{'); p += 2; continue; }
        if (*p == '}' && p + 1 < end && p[1] == '}') { rc = tmpl__sb_putc(&sb, '}'); p += 2; continue; }
        if (*p != '{') { rc = tmpl__sb_putc(&sb, *p++); continue; }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) { tmpl__sb_free(&sb); return ERR("format: unmatched '{'"); }
        const char *field = p + 1;
        size_t fl = (size_t)(q - field);
        if (memchr(field, ':', fl) || memchr(field, '!', fl)) { tmpl__sb_free(&sb); return ERR("format: conversions and format specs are not supported"); }
        tmpl_value *v = NULL;
        if (fl == 0) v = arg(args, auto_idx++, NULL);
        else if (field[0] >= '0' && field[0] <= '9') v = arg(args, atoi(field), NULL);
        else for (int k = 0; k < args->nkw && !v; k++)
            if (args->kwn[k].n == fl && !memcmp(args->kwn[k].p, field, fl)) v = args->kw[k];
        if (!v) { tmpl__sb_free(&sb); return ERR("format: missing argument for '{%.*s}'", (int)fl, field); }
        rc = tmpl__to_str(&sb, v);
        p = q + 1;
    }
    return ret_sb(r, at, &sb, rc, out);
}

static int mutable_check(tmpl__rs *r, const tnode *at, const void *owner) {
    if (owner == &r->a) return 0;
    return ERR("cannot modify a list or dict the template did not create");
}

int tmpl__method(tmpl__rs *r, const tnode *at, tmpl_value *self, const char *m, size_t mn, tmpl__args *args, tmpl_value **out) {
    int rc;
    int64_t iv = 0;
#define IS(lit) TMPL_NAME_EQ(m, mn, lit)
    *out = &tmpl__nonev;
    if (self->type == TV_STR) {
        tmpl_value *a0 = arg(args, 0, NULL), *a1 = arg(args, 1, NULL);
        const char *p = self->u.s.p;
        size_t n = self->u.s.n;
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            tmpl_value *chars = a0 && a0->type != TV_NONE ? a0 : NULL;
            if (chars && (rc = want_str(r, at, chars, "strip chars"))) return rc;
            size_t b, e;
            strip_range(p, n, chars, !IS("rstrip"), !IS("lstrip"), &b, &e);
            return ret_str(r, at, p + b, e - b, 0, out);
        }
        if (IS("split") || IS("rsplit")) {
            tmpl_value *sep = arg(args, 0, "sep"), *mx = arg(args, 1, "maxsplit");
            int64_t maxsplit = -1;
            if (mx && (rc = want_int(r, at, mx, "maxsplit", &maxsplit))) return rc;
            return split_str(r, at, self, sep, maxsplit, IS("rsplit"), out);
        }
        if (IS("splitlines")) {
            tmpl_value *l;
            if ((rc = new_list(r, at, 0, &l))) return rc;
            size_t i = 0;
            while (i < n) {
                size_t e = i;
                while (e < n && p[e] != '\n' && p[e] != '\r') e++;
                if (tmpl__list_push(&r->a, l->u.l, tmpl__v_str(&r->a, p + i, e - i, 1))) return tmpl__oom(r, at);
                if (e < n && p[e] == '\r' && e + 1 < n && p[e + 1] == '\n') e++;
                i = e + 1;
            }
            *out = l;
            return 0;
        }
        if (IS("startswith") || IS("endswith")) {
            int res;
            if ((rc = affix_match(r, at, self, a0, IS("endswith"), &res))) return rc;
            *out = tmpl__bool(res);
            return 0;
        }
        if (IS("upper")) return change_case(r, at, self, CASE_UPPER, out);
        if (IS("lower")) return change_case(r, at, self, CASE_LOWER, out);
        if (IS("title")) return change_case(r, at, self, CASE_TITLE, out);
        if (IS("capitalize")) return change_case(r, at, self, CASE_CAP, out);
        if (IS("replace")) {
            tmpl_value *c = arg(args, 2, "count");
            int64_t count = -1;
            if ((rc = want_str(r, at, a0, "replace: old")) || (rc = want_str(r, at, a1, "replace: new"))) return rc;
            if (c && (rc = want_int(r, at, c, "replace: count", &count))) return rc;
            return str_replace(r, at, self, a0, a1, count, out);
        }
        if (IS("find") || IS("rfind") || IS("count")) {
            if ((rc = want_str(r, at, a0, "argument"))) return rc;
            if (IS("count")) {
                int64_t c = 0;
                if (!a0->u.s.n) return ret_int(r, at, (int64_t)tmpl__cp_count(p, n) + 1, out);
                for (const char *q = p; (q = memmem(q, (size_t)(p + n - q), a0->u.s.p, a0->u.s.n)); q += a0->u.s.n) c++;
                return ret_int(r, at, c, out);
            }
            const char *q = NULL;
            if (IS("find")) q = memmem(p, n, a0->u.s.p, a0->u.s.n);
            else for (size_t k = n >= a0->u.s.n ? n - a0->u.s.n + 1 : 0; k-- > 0;)
                if (!memcmp(p + k, a0->u.s.p, a0->u.s.n)) { q = p + k; break; }
            return ret_int(r, at, q ? (int64_t)tmpl__cp_count(p, (size_t)(q - p)) : -1, out);
        }
        if (IS("join")) {
            tmpl_value **items;
            size_t k;
            if (!a0) return ERR("join needs an argument");
            if ((rc = seq_of(r, at, a0, &items, &k, "join"))) return rc;
            tmpl__sb sb = {.max = r->max_output};
            rc = 0;
            for (size_t i = 0; i < k && !rc; i++) {
                if (i) rc = tmpl__sb_put(&sb, p, n);
                if (!rc) rc = tmpl__to_str(&sb, items[i]);
            }
            return ret_sb(r, at, &sb, rc, out);
        }
        if (IS("format")) return str_format(r, at, self, args, out);
        if (IS("removeprefix") || IS("removesuffix")) {
            if ((rc = want_str(r, at, a0, "argument"))) return rc;
            int res;
            if ((rc = affix_match(r, at, self, a0, IS("removesuffix"), &res))) return rc;
            if (!res) { *out = self; return 0; }
            return ret_str(r, at, p + (IS("removeprefix") ? a0->u.s.n : 0), n - a0->u.s.n, 0, out);
        }
        /* is* predicates (ASCII classes; non-ASCII letters count as alphabetic) */
        int all = n > 0, any_cased = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)p[i];
            int d = c >= '0' && c <= '9', a = is_alpha_c((char)c) || c >= 0x80, s = is_space_cp(c);
            if (IS("isdigit")) all &= d;
            else if (IS("isalpha")) all &= a;
            else if (IS("isalnum")) all &= a || d;
            else if (IS("isspace")) all &= s;
            else if (IS("islower")) { if (c >= 'A' && c <= 'Z') all = 0; if (c >= 'a' && c <= 'z') any_cased = 1; }
            else if (IS("isupper")) { if (c >= 'a' && c <= 'z') all = 0; if (c >= 'A' && c <= 'Z') any_cased = 1; }
        }
        if (IS("islower") || IS("isupper")) all = all && any_cased;
        *out = tmpl__bool(all);
        return 0;
    }
    if (self->type == TV_LIST) {
        tv_list *l = self->u.l;
        tmpl_value *a0 = arg(args, 0, NULL), *a1 = arg(args, 1, NULL);
        if (IS("index") || IS("count")) {
            if (!a0) return ERR("%.*s needs an argument", (int)mn, m);
            int64_t c = 0;
            for (size_t i = 0; i < l->n; i++) {
                if (tmpl__equal(l->v[i], a0)) {
                    if (IS("index")) return ret_int(r, at, (int64_t)i, out);
                    c++;
                }
            }
            if (IS("index")) return ERR("value is not in list");
            return ret_int(r, at, c, out);
        }
        if ((rc = mutable_check(r, at, l->owner))) return rc;
        if (IS("append")) {
            if (!a0) return ERR("append needs an argument");
            if (tmpl__list_push(&r->a, l, a0)) return tmpl__oom(r, at);
            return 0;
        }
        if (IS("extend")) {
            tmpl_value **items;
            size_t k;
            if (!a0) return ERR("extend needs an argument");
            if ((rc = seq_of(r, at, a0, &items, &k, "extend"))) return rc;
            for (size_t i = 0; i < k; i++)
                if (tmpl__list_push(&r->a, l, items[i])) return tmpl__oom(r, at);
            return 0;
        }
        if (IS("pop")) {
            int64_t i = -1;
            if (a0 && (rc = want_int(r, at, a0, "pop index", &i))) return rc;
            if (i < 0) i += (int64_t)l->n;
            if (i < 0 || i >= (int64_t)l->n) return ERR("pop index out of range");
            *out = l->v[i];
            memmove(l->v + i, l->v + i + 1, (l->n - (size_t)i - 1) * sizeof *l->v);
            l->n--;
            return 0;
        }
        /* insert(i, x) */
        if ((rc = want_int(r, at, a0, "insert index", &iv))) return rc;
        if (!a1) return ERR("insert needs two arguments");
        if (iv < 0) iv += (int64_t)l->n;
        if (iv < 0) iv = 0;
        if (iv > (int64_t)l->n) iv = (int64_t)l->n;
        if (tmpl__list_push(&r->a, l, a1)) return tmpl__oom(r, at);
        memmove(l->v + iv + 1, l->v + iv, (l->n - 1 - (size_t)iv) * sizeof *l->v);
        l->v[iv] = a1;
        return 0;
    }
    if (self->type == TV_DICT) {
        tv_dict *d = self->u.d;
        tmpl_value *a0 = arg(args, 0, NULL), *a1 = arg(args, 1, NULL);
        if (IS("get")) {
            tmpl_value *v = a0 && a0->type == TV_STR ? tmpl__dict_get(d, a0->u.s.p, a0->u.s.n) : NULL;
            if (!a0) return ERR("get needs a key");
            *out = v ? v : a1 ? a1 : &tmpl__nonev;
            return 0;
        }
        if (IS("items")) { tname it = {"items", 5}; tmpl__args none = {0}; return tmpl__filter(r, at, &it, self, &none, out); }
        if (IS("keys") || IS("values")) {
            tmpl_value *l;
            if ((rc = new_list(r, at, d->n, &l))) return rc;
            for (size_t i = 0; i < d->n; i++) {
                l->u.l->v[i] = IS("values") ? d->e[i].v : tmpl__v_str(&r->a, d->e[i].k, d->e[i].kn, 0);
                if (!l->u.l->v[i]) return tmpl__oom(r, at);
            }
            l->u.l->n = d->n;
            *out = l;
            return 0;
        }
        if ((rc = mutable_check(r, at, d->owner))) return rc;
        if (IS("update")) {
            if (a0 && a0->type == TV_DICT)
                for (size_t i = 0; i < a0->u.d->n; i++)
                    if (tmpl__dict_set(&r->a, d, a0->u.d->e[i].k, a0->u.d->e[i].kn, a0->u.d->e[i].v, 0)) return tmpl__oom(r, at);
            for (int k = 0; k < args->nkw; k++)
                if (tmpl__dict_set(&r->a, d, args->kwn[k].p, args->kwn[k].n, args->kw[k], 0)) return tmpl__oom(r, at);
            return 0;
        }
        if ((rc = want_str(r, at, a0, "key"))) return rc;
        tmpl_value *cur = tmpl__dict_get(d, a0->u.s.p, a0->u.s.n);
        if (IS("setdefault")) {
            if (cur) { *out = cur; return 0; }
            *out = a1 ? a1 : &tmpl__nonev;
            return tmpl__dict_set(&r->a, d, a0->u.s.p, a0->u.s.n, *out, 1) ? tmpl__oom(r, at) : 0;
        }
        /* pop(key[, default]): order-preserving removal */
        if (!cur) {
            if (a1) { *out = a1; return 0; }
            return ERR("key '%.*s' not found", (int)(a0->u.s.n > 40 ? 40 : a0->u.s.n), a0->u.s.p);
        }
        *out = cur;
        size_t k = 0;
        for (size_t i = 0; i < d->n; i++)
            if (!(d->e[i].kn == a0->u.s.n && !memcmp(d->e[i].k, a0->u.s.p, a0->u.s.n))) d->e[k++] = d->e[i];
        d->n = k;
        d->idx = NULL;
        d->icap = 0;
        if (d->n > 8) { /* rebuild the index */
            tv_entry *e = d->e;
            size_t cnt = d->n;
            d->n = 0;
            d->e = NULL;
            d->cap = 0;
            for (size_t i = 0; i < cnt; i++)
                if (tmpl__dict_set(&r->a, d, e[i].k, e[i].kn, e[i].v, 0)) return tmpl__oom(r, at);
        }
        return 0;
    }
    if (self->type == TV_LOOP && IS("cycle")) {
        if (!args->npos) return ERR("loop.cycle needs arguments");
        *out = args->pos[self->u.loop->i % (size_t)args->npos];
        return 0;
    }
#undef IS
    return ERR("'%s' object has no method '%.*s'", tmpl__type_name(self), (int)mn, m);
}

/* ---- global functions ------------------------------------------------------------------- */
int tmpl__builtin_id(const char *name, size_t n) {
    if (TMPL_NAME_EQ(name, n, "range")) return B_RANGE;
    if (TMPL_NAME_EQ(name, n, "namespace")) return B_NAMESPACE;
    if (TMPL_NAME_EQ(name, n, "raise_exception")) return B_RAISE;
    if (TMPL_NAME_EQ(name, n, "strftime_now")) return B_STRFTIME;
    if (TMPL_NAME_EQ(name, n, "dict")) return B_DICT;
    return 0;
}

int tmpl__call_builtin(tmpl__rs *r, const tnode *at, int which, tmpl__args *args, tmpl_value **out) {
    int rc;
    switch (which) {
    case B_RANGE: {
        int64_t a = 0, b = 0, s = 1;
        if (args->npos < 1 || args->npos > 3) return ERR("range expects 1 to 3 integer arguments");
        if (args->npos == 1) { if ((rc = want_int(r, at, args->pos[0], "range stop", &b))) return rc; }
        else {
            if ((rc = want_int(r, at, args->pos[0], "range start", &a)) || (rc = want_int(r, at, args->pos[1], "range stop", &b))) return rc;
            if (args->npos == 3 && (rc = want_int(r, at, args->pos[2], "range step", &s))) return rc;
        }
        if (s == 0) return ERR("range() step must not be zero");
        double cnt = s > 0 ? ceil(((double)b - (double)a) / (double)s) : ceil(((double)a - (double)b) / (double)-s);
        if (cnt < 0) cnt = 0;
        if (cnt > 1e7 || cnt * 40 > (double)(r->a.cap ? r->a.cap : ((size_t)1 << 40)))
            return tmpl__err(r, at, CM_ETOOBIG, "range of %.0f items is too large", cnt);
        tmpl_value *l;
        if ((rc = new_list(r, at, (size_t)cnt, &l))) return rc;
        for (size_t i = 0; i < (size_t)cnt; i++) {
            if (!(l->u.l->v[i] = tmpl__v_int(&r->a, a + (int64_t)i * s))) return tmpl__oom(r, at);
        }
        l->u.l->n = (size_t)cnt;
        *out = l;
        return 0;
    }
    case B_NAMESPACE: case B_DICT: {
        tmpl_value *d = tmpl__v_dict(&r->a, which == B_NAMESPACE ? TV_NS : TV_DICT);
        if (!d) return tmpl__oom(r, at);
        if (args->npos > 1) return ERR("%s takes at most one positional argument", which == B_DICT ? "dict" : "namespace");
        if (args->npos == 1) {
            tmpl_value *src = args->pos[0];
            if (src->type != TV_DICT && src->type != TV_NS) return ERR("%s argument must be a mapping", which == B_DICT ? "dict" : "namespace");
            for (size_t i = 0; i < src->u.d->n; i++)
                if (tmpl__dict_set(&r->a, d->u.d, src->u.d->e[i].k, src->u.d->e[i].kn, src->u.d->e[i].v, 0)) return tmpl__oom(r, at);
        }
        for (int k = 0; k < args->nkw; k++)
            if (tmpl__dict_set(&r->a, d->u.d, args->kwn[k].p, args->kwn[k].n, args->kw[k], 0)) return tmpl__oom(r, at);
        *out = d;
        return 0;
    }
    case B_RAISE: {
        tmpl_value *msg = arg(args, 0, NULL);
        tmpl__sb sb = {.max = 4096};
        if (msg) tmpl__to_str(&sb, msg);
        if (!r->failed) {
            r->failed = 1;
            if (r->err && r->errlen) snprintf(r->err, r->errlen, "%s", sb.p ? sb.p : "raise_exception");
        }
        tmpl__sb_free(&sb);
        return CM_ETEMPLATE;
    }
    case B_STRFTIME: {
        tmpl_value *fmt = arg(args, 0, NULL);
        if ((rc = want_str(r, at, fmt, "strftime_now format"))) return rc;
        char f[256], buf[512];
        if (fmt->u.s.n >= sizeof f) return ERR("strftime_now format too long");
        memcpy(f, fmt->u.s.p, fmt->u.s.n);
        f[fmt->u.s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(buf, sizeof buf, f, &tm);
        return ret_str(r, at, buf, k, 1, out);
    }
    default: return ERR("unknown function");
    }
}
