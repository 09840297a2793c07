/* tmpl_eval: compile/render entry points, scopes, expression evaluation, statements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cm_err.h"
#include "tmpl_internal.h"

enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

/* ---- compile ---------------------------------------------------------------------------- */
int tmpl_compile(const char *src, size_t len, tmpl **out, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (!out || (!src && len)) return CM_EINVAL;
    *out = NULL;
    if (len > TMPL_MAX_SOURCE) {
        if (err && errlen) snprintf(err, errlen, "template source is larger than %zu bytes", TMPL_MAX_SOURCE);
        return CM_ETOOBIG;
    }
    if (!tmpl__utf8_valid(src, len)) {
        if (err && errlen) snprintf(err, errlen, "template source is not valid UTF-8");
        return CM_EUTF8;
    }
    tmpl *t = calloc(1, sizeof *t);
    if (!t) return CM_ENOMEM;
    tmpl__arena_init(&t->a, 0);
    /* the AST points into the source (names, text): keep a copy */
    char *copy = tmpl__strdup(&t->a, src ? src : "", len);
    int rc = copy ? tmpl__parse(t, copy, len, err, errlen) : CM_ENOMEM;
    if (rc) { tmpl_free(t); return rc; }
    *out = t;
    return 0;
}

void tmpl_free(tmpl *t) {
    if (!t) return;
    tmpl__arena_release(&t->a);
    free(t);
}

/* ---- errors ------------------------------------------------------------------------------ */
int tmpl__err(tmpl__rs *r, const tnode *at, int code, const char *fmt, ...) {
    if (r->failed) return code;
    r->failed = 1;
    if (r->err && r->errlen) {
        int k = at ? snprintf(r->err, r->errlen, "line %d, column %d: ", at->line, at->col) : 0;
        if (k >= 0 && (size_t)k < r->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return code;
}

int tmpl__oom(tmpl__rs *r, const tnode *at) {
    if (r->a.capped)
        return tmpl__err(r, at, CM_ETOOBIG, "template used more than %zu bytes of memory", r->a.cap);
    return tmpl__err(r, at, CM_ENOMEM, "out of memory");
}

/* Maps a string-builder failure to an error with a message. */
static int sb_fail(tmpl__rs *r, const tnode *at, int rc) {
    if (rc == CM_ETOOBIG)
        return tmpl__err(r, at, CM_ETOOBIG, "output is larger than %zu bytes (or captured text than %zu)", r->max_output, r->a.cap);
    if (rc == CM_ENOMEM) return tmpl__err(r, at, CM_ENOMEM, "out of memory");
    return tmpl__err(r, at, rc, "%s", cm_err_str(rc));
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tmpl__charge_n(tmpl__rs *r, const tnode *at, uint64_t units) {
    r->steps += units;
    if (r->steps > r->max_steps)
        return tmpl__err(r, at, CM_ETOOBIG, "template ran more than %llu steps", (unsigned long long)r->max_steps);
    if (r->steps >= r->next_clock) { /* wall-clock backstop, read every 1024 steps */
        r->next_clock = r->steps + 1024;
        if (mono_now() > r->deadline) return tmpl__err(r, at, CM_ETOOBIG, "template ran longer than %u ms", r->max_ms);
    }
    return 0;
}

int tmpl__step(tmpl__rs *r, const tnode *at) { return tmpl__charge_n(r, at, 1); }

int tmpl__charge(tmpl__rs *r, const tnode *at, const tmpl_value *v) {
    size_t units = v->type == TV_STR ? v->u.s.n / 64 : v->type == TV_LIST ? v->u.l->n / 64
                 : (v->type == TV_DICT || v->type == TV_NS) ? v->u.d->n / 64 : 0;
    return units ? tmpl__charge_n(r, at, units) : 0;
}

/* ---- scopes ------------------------------------------------------------------------------ */
static tmpl_value builtin_vals[] = {
    {.type = TV_BUILTIN, .u.builtin = 0},       {.type = TV_BUILTIN, .u.builtin = B_RANGE},
    {.type = TV_BUILTIN, .u.builtin = B_NAMESPACE}, {.type = TV_BUILTIN, .u.builtin = B_RAISE},
    {.type = TV_BUILTIN, .u.builtin = B_STRFTIME},  {.type = TV_BUILTIN, .u.builtin = B_DICT},
};

static tmpl_value *lookup(tmpl__rs *r, tmpl__frame *f, const char *name, size_t n) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->vars[i].kn == n && memcmp(f->vars[i].k, name, n) == 0) return f->vars[i].v;
    if (r->ctx) {
        tmpl_value *v = tmpl__dict_get(r->ctx, name, n);
        if (v) return v;
    }
    int b = tmpl__builtin_id(name, n);
    return b > 0 ? &builtin_vals[b] : &tmpl__undef;
}

static int frame_set(tmpl__rs *r, const tnode *at, tmpl__frame *f, const char *name, size_t n, tmpl_value *v) {
    for (size_t i = 0; i < f->n; i++)
        if (f->vars[i].kn == n && memcmp(f->vars[i].k, name, n) == 0) { f->vars[i].v = v; return 0; }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 8;
        tv_entry *nv = tmpl__alloc(&r->a, nc * sizeof *nv);
        if (!nv) return tmpl__oom(r, at);
        if (f->n) memcpy(nv, f->vars, f->n * sizeof *nv);
        f->vars = nv;
        f->cap = nc;
    }
    f->vars[f->n].k = name;
    f->vars[f->n].kn = n;
    f->vars[f->n].v = v;
    f->n++;
    return 0;
}

static tmpl__frame *frame_new(tmpl__rs *r, tmpl__frame *parent) {
    tmpl__frame *f = tmpl__alloc(&r->a, sizeof *f);
    if (f) { memset(f, 0, sizeof *f); f->parent = parent; }
    return f;
}

/* ---- expressions ------------------------------------------------------------------------- */
static int eval(tmpl__rs *r, tmpl__frame *f, const tnode *n, tmpl_value **out);
static int exec_body(tmpl__rs *r, tmpl__frame *f, tnode *const *body, int nbody);

static int eval_args(tmpl__rs *r, tmpl__frame *f, const tnode *n, tmpl__args *a, int extra_front) {
    memset(a, 0, sizeof *a);
    int np = n->nv + extra_front;
    if (np) {
        if (!(a->pos = tmpl__alloc(&r->a, (size_t)np * sizeof *a->pos))) return tmpl__oom(r, n);
    }
    a->npos = np;
    for (int i = 0; i < n->nv; i++) {
        int rc = eval(r, f, n->v[i], &a->pos[extra_front + i]);
        if (rc) return rc;
    }
    if (n->nw) {
        if (!(a->kw = tmpl__alloc(&r->a, (size_t)n->nw * sizeof *a->kw))) return tmpl__oom(r, n);
        a->kwn = n->names;
        a->nkw = n->nw;
        for (int i = 0; i < n->nw; i++) {
            int rc = eval(r, f, n->w[i], &a->kw[i]);
            if (rc) return rc;
        }
    }
    return 0;
}

static int capture(tmpl__rs *r, tmpl__frame *f, const tnode *at, tnode *const *body, int nbody, tmpl_value **out) {
    tmpl__sb sb = {.max = r->max_output, .live = &r->live, .live_max = r->a.cap};
    tmpl__sb *saved = r->out;
    r->out = &sb;
    int rc = exec_body(r, f, body, nbody);
    r->out = saved;
    if (rc >= 0) {
        *out = tmpl__v_str(&r->a, sb.p ? sb.p : "", sb.n, 1);
        if (!*out) rc = tmpl__oom(r, at);
    }
    tmpl__sb_free(&sb);
    return rc;
}

int tmpl__call_macro(tmpl__rs *r, const tnode *at, tmpl_value *fn, tmpl__args *args, tmpl_value **out) {
    const tnode *def = fn->u.m->def;
    if (++r->depth > r->max_depth) return tmpl__err(r, at, CM_ETOOBIG, "recursion deeper than %d", r->max_depth);
    tmpl__frame *nf = frame_new(r, fn->u.m->closure);
    if (!nf) return tmpl__oom(r, at);
    int rc = 0;
    tmpl_value *varargs = tmpl__v_list(&r->a, 0), *kwargs = tmpl__v_dict(&r->a, TV_DICT);
    if (!varargs || !kwargs) return tmpl__oom(r, at);
    varargs->is_tuple = 1;
    for (int i = 0; i < def->nnames && !rc; i++) {
        tmpl_value *v = i < args->npos ? args->pos[i] : NULL;
        for (int k = 0; k < args->nkw && !v; k++)
            if (args->kwn[k].n == def->names[i].n && !memcmp(args->kwn[k].p, def->names[i].p, def->names[i].n)) v = args->kw[k];
        if (!v && def->w[i]) {
            /* defaults see the parameters bound so far */
            if ((rc = eval(r, nf, def->w[i], &v))) break;
        }
        rc = frame_set(r, at, nf, def->names[i].p, def->names[i].n, v ? v : &tmpl__undef);
    }
    for (int i = def->nnames; i < args->npos && !rc; i++) rc = tmpl__list_push(&r->a, varargs->u.l, args->pos[i]) ? tmpl__oom(r, at) : 0;
    for (int k = 0; k < args->nkw && !rc; k++) {
        int known = 0;
        for (int i = 0; i < def->nnames; i++)
            if (args->kwn[k].n == def->names[i].n && !memcmp(args->kwn[k].p, def->names[i].p, def->names[i].n)) known = 1;
        if (!known && tmpl__dict_set(&r->a, kwargs->u.d, args->kwn[k].p, args->kwn[k].n, args->kw[k], 0)) rc = tmpl__oom(r, at);
    }
    if (!rc) rc = frame_set(r, at, nf, "varargs", 7, varargs);
    if (!rc) rc = frame_set(r, at, nf, "kwargs", 6, kwargs);
    if (!rc && fn->u.m->caller) rc = frame_set(r, at, nf, "caller", 6, fn->u.m->caller);
    if (!rc) rc = capture(r, nf, at, def->v, def->nv, out);
    if (rc > 0) rc = tmpl__err(r, at, CM_ETEMPLATE, "break/continue outside a loop");
    r->depth--;
    return rc;
}

static int call_value(tmpl__rs *r, const tnode *at, tmpl_value *fn, tmpl__args *args, tmpl_value **out) {
    switch (fn->type) {
    case TV_MACRO: return tmpl__call_macro(r, at, fn, args, out);
    case TV_BUILTIN: return tmpl__call_builtin(r, at, fn->u.builtin, args, out);
    case TV_METHOD: return tmpl__method(r, at, fn->u.meth->self, fn->u.meth->name, fn->u.meth->n, args, out);
    case TV_UNDEF: return tmpl__err(r, at, CM_ETEMPLATE, "call of an undefined value");
    default: return tmpl__err(r, at, CM_ETEMPLATE, "'%s' object is not callable", tmpl__type_name(fn));
    }
}

static int eval_call(tmpl__rs *r, tmpl__frame *f, const tnode *n, tmpl_value *caller, tmpl_value **out) {
    int rc;
    tmpl__args args;
    const tnode *c = n->a;
    if (c->kind == N_ATTR) { /* obj.name(...): a method unless obj holds a callable under name */
        tmpl_value *obj;
        if ((rc = eval(r, f, c->a, &obj))) return rc;
        tmpl_value *member = (obj->type == TV_DICT || obj->type == TV_NS) ? tmpl__dict_get(obj->u.d, c->name.p, c->name.n) : NULL;
        if (!(member && (member->type == TV_MACRO || member->type == TV_BUILTIN)) && tmpl__has_method(obj, c->name.p, c->name.n)) {
            if ((rc = eval_args(r, f, n, &args, 0)) || (rc = tmpl__method(r, n, obj, c->name.p, c->name.n, &args, out)) ||
                (rc = tmpl__charge(r, n, obj)))
                return rc;
            return tmpl__charge(r, n, *out);
        }
        if (!member) {
            if (obj->type == TV_UNDEF)
                return tmpl__err(r, n, CM_ETEMPLATE, "'%.*s' called on an undefined value", (int)c->name.n, c->name.p);
            return tmpl__err(r, n, CM_ETEMPLATE, "'%s' object has no method '%.*s'", tmpl__type_name(obj), (int)c->name.n, c->name.p);
        }
        if ((rc = eval_args(r, f, n, &args, 0))) return rc;
        return call_value(r, n, member, &args, out);
    }
    tmpl_value *fn;
    if ((rc = eval(r, f, c, &fn))) return rc;
    if (fn->type == TV_UNDEF && c->kind == N_NAME)
        return tmpl__err(r, n, CM_ETEMPLATE, "'%.*s' is undefined", (int)c->name.n, c->name.p);
    if ((rc = eval_args(r, f, n, &args, 0))) return rc;
    if (caller) {
        if (fn->type != TV_MACRO) return tmpl__err(r, n, CM_ETEMPLATE, "{%% call %%} needs a macro");
        tv_macro *m = tmpl__alloc(&r->a, sizeof *m);
        tmpl_value *v = tmpl__alloc(&r->a, sizeof *v);
        if (!m || !v) return tmpl__oom(r, n);
        *m = *fn->u.m;
        m->caller = caller;
        memset(v, 0, sizeof *v);
        v->type = TV_MACRO;
        v->u.m = m;
        fn = v;
    }
    return call_value(r, n, fn, &args, out);
}

static int as_num(const tmpl_value *v, double *d, int64_t *i, int *is_int) {
    switch (v->type) {
    case TV_BOOL: *i = v->u.b; *d = v->u.b; *is_int = 1; return 1;
    case TV_INT: *i = v->u.i; *d = (double)v->u.i; *is_int = 1; return 1;
    case TV_FLOAT: *d = v->u.f; *i = 0; *is_int = 0; return 1;
    default: return 0;
    }
}

static int num_result(tmpl__rs *r, const tnode *n, int is_int, int64_t i, double d, tmpl_value **out) {
    *out = is_int ? tmpl__v_int(&r->a, i) : tmpl__v_float(&r->a, d);
    return *out ? 0 : tmpl__oom(r, n);
}

static int compare(tmpl__rs *r, const tnode *n, tmpl_value *a, tmpl_value *b, int *cmp) {
    double x, y;
    int64_t xi, yi;
    int xint, yint;
    if (as_num(a, &x, &xi, &xint) && as_num(b, &y, &yi, &yint)) {
        if (xint && yint) *cmp = (xi > yi) - (xi < yi);
        else *cmp = (x > y) - (x < y);
        return 0;
    }
    if (a->type == TV_STR && b->type == TV_STR) {
        size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, m);
        *cmp = c ? (c > 0) - (c < 0) : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
        return 0;
    }
    return tmpl__err(r, n, CM_ETEMPLATE, "cannot compare '%s' with '%s'", tmpl__type_name(a), tmpl__type_name(b));
}

static int contains(tmpl__rs *r, const tnode *n, tmpl_value *item, tmpl_value *seq, int *res) {
    switch (seq->type) {
    case TV_STR:
        if (item->type != TV_STR) return tmpl__err(r, n, CM_ETEMPLATE, "'in <string>' needs a string on the left, not '%s'", tmpl__type_name(item));
        *res = item->u.s.n == 0 || memmem(seq->u.s.p, seq->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        return 0;
    case TV_LIST: {
        uint64_t work = 0;
        *res = 0;
        for (size_t i = 0; i < seq->u.l->n && !*res; i++, work++) *res = tmpl__equal_w(item, seq->u.l->v[i], &work);
        return tmpl__charge_n(r, n, work);
    }
    case TV_DICT: case TV_NS:
        *res = item->type == TV_STR && tmpl__dict_get(seq->u.d, item->u.s.p, item->u.s.n) != NULL;
        return 0;
    case TV_UNDEF:
        *res = 0;
        return 0;
    default:
        return tmpl__err(r, n, CM_ETEMPLATE, "argument of type '%s' is not iterable", tmpl__type_name(seq));
    }
}

static int binop(tmpl__rs *r, const tnode *n, tmpl_value *a, tmpl_value *b, tmpl_value **out) {
    int op = n->op, rc, c = 0;
    double x, y;
    int64_t xi, yi, ri;
    int xint, yint;
    switch (op) {
    case OP_EQ: case OP_NE: {
        uint64_t work = 0;
        int eq = tmpl__equal_w(a, b, &work);
        *out = tmpl__bool(op == OP_EQ ? eq : !eq);
        return tmpl__charge_n(r, n, work);
    }
    case OP_LT: case OP_LE: case OP_GT: case OP_GE:
        if ((rc = compare(r, n, a, b, &c))) return rc;
        *out = tmpl__bool(op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0);
        return 0;
    case OP_IN: case OP_NOTIN:
        if ((rc = contains(r, n, a, b, &c))) return rc;
        *out = tmpl__bool(op == OP_IN ? c : !c);
        return 0;
    case OP_CONCAT: {
        tmpl__sb sb = {.max = r->max_output};
        if ((rc = tmpl__to_str(&sb, a)) || (rc = tmpl__to_str(&sb, b))) { tmpl__sb_free(&sb); return sb_fail(r, n, rc); }
        *out = tmpl__v_str(&r->a, sb.p ? sb.p : "", sb.n, 1);
        tmpl__sb_free(&sb);
        return *out ? 0 : tmpl__oom(r, n);
    }
    }
    if (op == OP_ADD && a->type == TV_STR && b->type == TV_STR) {
        if (a->u.s.n + b->u.s.n > r->max_output) return tmpl__err(r, n, CM_ETOOBIG, "string longer than %zu bytes", r->max_output);
        char *p = tmpl__alloc(&r->a, a->u.s.n + b->u.s.n + 1);
        if (!p) return tmpl__oom(r, n);
        memcpy(p, a->u.s.p, a->u.s.n);
        memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
        p[a->u.s.n + b->u.s.n] = 0;
        *out = tmpl__v_str(&r->a, p, a->u.s.n + b->u.s.n, 0);
        return *out ? 0 : tmpl__oom(r, n);
    }
    if (op == OP_ADD && a->type == TV_LIST && b->type == TV_LIST) {
        tmpl_value *l = tmpl__v_list(&r->a, a->u.l->n + b->u.l->n);
        if (!l) return tmpl__oom(r, n);
        for (size_t i = 0; i < a->u.l->n; i++) l->u.l->v[l->u.l->n++] = a->u.l->v[i];
        for (size_t i = 0; i < b->u.l->n; i++) l->u.l->v[l->u.l->n++] = b->u.l->v[i];
        *out = l;
        return 0;
    }
    if (op == OP_MUL && (a->type == TV_STR || b->type == TV_STR) && (a->type == TV_INT || b->type == TV_INT)) {
        tmpl_value *s = a->type == TV_STR ? a : b;
        int64_t k = a->type == TV_INT ? a->u.i : b->u.i;
        if (k <= 0 || !s->u.s.n) { *out = tmpl__v_str(&r->a, "", 0, 0); return *out ? 0 : tmpl__oom(r, n); }
        if ((uint64_t)k > r->max_output / s->u.s.n) return tmpl__err(r, n, CM_ETOOBIG, "string longer than %zu bytes", r->max_output);
        char *p = tmpl__alloc(&r->a, s->u.s.n * (size_t)k + 1);
        if (!p) return tmpl__oom(r, n);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s->u.s.n, s->u.s.p, s->u.s.n);
        p[s->u.s.n * (size_t)k] = 0;
        *out = tmpl__v_str(&r->a, p, s->u.s.n * (size_t)k, 0);
        return *out ? 0 : tmpl__oom(r, n);
    }
    if (op == OP_MOD && a->type == TV_STR) { /* 'fmt %s' % value or % (tuple) */
        if (b->type == TV_LIST && b->is_tuple) return tmpl__percent_format(r, n, a, b->u.l->v, (int)b->u.l->n, out);
        return tmpl__percent_format(r, n, a, &b, 1, out);
    }
    static const char *opname[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (!as_num(a, &x, &xi, &xint) || !as_num(b, &y, &yi, &yint))
        return tmpl__err(r, n, CM_ETEMPLATE, "unsupported operand types for %s: '%s' and '%s'", op <= OP_POW ? opname[op] : "?",
                         tmpl__type_name(a), tmpl__type_name(b));
    int both_int = xint && yint;
    switch (op) {
    case OP_ADD:
        if (both_int && !__builtin_add_overflow(xi, yi, &ri)) return num_result(r, n, 1, ri, 0, out);
        return num_result(r, n, 0, 0, x + y, out);
    case OP_SUB:
        if (both_int && !__builtin_sub_overflow(xi, yi, &ri)) return num_result(r, n, 1, ri, 0, out);
        return num_result(r, n, 0, 0, x - y, out);
    case OP_MUL:
        if (both_int && !__builtin_mul_overflow(xi, yi, &ri)) return num_result(r, n, 1, ri, 0, out);
        return num_result(r, n, 0, 0, x * y, out);
    case OP_DIV:
        if (y == 0) return tmpl__err(r, n, CM_ETEMPLATE, "division by zero");
        return num_result(r, n, 0, 0, x / y, out);
    case OP_FLOORDIV:
        if (y == 0) return tmpl__err(r, n, CM_ETEMPLATE, "division by zero");
        if (both_int) {
            if (xi == INT64_MIN && yi == -1) return num_result(r, n, 0, 0, -(double)INT64_MIN, out);
            int64_t q = xi / yi;
            if ((xi % yi) && ((xi < 0) != (yi < 0))) q--;
            return num_result(r, n, 1, q, 0, out);
        }
        return num_result(r, n, 0, 0, floor(x / y), out);
    case OP_MOD:
        if (y == 0) return tmpl__err(r, n, CM_ETEMPLATE, "modulo by zero");
        if (both_int) {
            if (yi == -1) return num_result(r, n, 1, 0, 0, out);
            int64_t m = xi % yi;
            if (m && ((m < 0) != (yi < 0))) m += yi;
            return num_result(r, n, 1, m, 0, out);
        } else {
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return num_result(r, n, 0, 0, m, out);
        }
    case OP_POW:
        if (both_int && yi >= 0) {
            int64_t acc = 1, base = xi, e = yi;
            int ovf = 0;
            while (e > 0 && !ovf) {
                if (e & 1) ovf |= __builtin_mul_overflow(acc, base, &acc);
                e >>= 1;
                if (e) ovf |= __builtin_mul_overflow(base, base, &base);
            }
            if (!ovf) return num_result(r, n, 1, acc, 0, out);
        }
        if (x == 0 && y < 0) return tmpl__err(r, n, CM_ETEMPLATE, "0.0 cannot be raised to a negative power");
        return num_result(r, n, 0, 0, pow(x, y), out);
    }
    return tmpl__err(r, n, CM_ETEMPLATE, "unknown operator");
}

static int to_index(tmpl__rs *r, const tnode *n, tmpl_value *v, int64_t *out, int *given) {
    *given = 0;
    if (!v || v->type == TV_NONE || v->type == TV_UNDEF) return 0;
    if (v->type == TV_INT) { *out = v->u.i; *given = 1; return 0; }
    if (v->type == TV_BOOL) { *out = v->u.b; *given = 1; return 0; }
    return tmpl__err(r, n, CM_ETEMPLATE, "slice indices must be integers, not '%s'", tmpl__type_name(v));
}

static int slice(tmpl__rs *r, const tnode *n, tmpl_value *obj, tmpl_value *sv[3], tmpl_value **out) {
    int64_t start = 0, stop = 0, step = 1;
    int gs, ge, gp, rc;
    if ((rc = to_index(r, n, sv[0], &start, &gs)) || (rc = to_index(r, n, sv[1], &stop, &ge)) || (rc = to_index(r, n, sv[2], &step, &gp)))
        return rc;
    if (!gp) step = 1;
    if (step == 0) return tmpl__err(r, n, CM_ETEMPLATE, "slice step cannot be zero");
    if (obj->type == TV_UNDEF) { *out = &tmpl__undef; return 0; }
    if (obj->type != TV_LIST && obj->type != TV_STR) return tmpl__err(r, n, CM_ETEMPLATE, "'%s' object cannot be sliced", tmpl__type_name(obj));
    /* strings slice by code point: index the code point offsets */
    size_t len;
    size_t *offs = NULL;
    if (obj->type == TV_STR) {
        len = tmpl__cp_count(obj->u.s.p, obj->u.s.n);
        if (!(offs = tmpl__alloc(&r->a, (len + 1) * sizeof *offs))) return tmpl__oom(r, n);
        size_t k = 0;
        for (size_t i = 0; i < obj->u.s.n; k++) { offs[k] = i; i += tmpl__cp_len(obj->u.s.p + i, obj->u.s.n - i); }
        offs[len] = obj->u.s.n;
    } else {
        len = obj->u.l->n;
    }
    int64_t L = (int64_t)len;
    /* Python's PySlice_AdjustIndices */
    if (!gs) start = step < 0 ? L - 1 : 0;
    else if (start < 0) { start += L; if (start < 0) start = step < 0 ? -1 : 0; }
    else if (start >= L) start = step < 0 ? L - 1 : L;
    if (!ge) stop = step < 0 ? -1 : L;
    else if (stop < 0) { stop += L; if (stop < 0) stop = step < 0 ? -1 : 0; }
    else if (stop >= L) stop = step < 0 ? L - 1 : L;
    size_t count = 0;
    if (step > 0 && start < stop) count = (size_t)((stop - start - 1) / step + 1);
    if (step < 0 && stop < start) count = (size_t)((start - stop - 1) / (-step) + 1);
    if (obj->type == TV_LIST) {
        tmpl_value *l = tmpl__v_list(&r->a, count);
        if (!l) return tmpl__oom(r, n);
        for (size_t i = 0; i < count; i++) l->u.l->v[i] = obj->u.l->v[start + (int64_t)i * step];
        l->u.l->n = count;
        l->is_tuple = obj->is_tuple;
        *out = l;
        return 0;
    }
    if (step == 1) {
        *out = tmpl__v_str(&r->a, obj->u.s.p + offs[start], count ? offs[start + (int64_t)count] - offs[start] : 0, 1);
        return *out ? 0 : tmpl__oom(r, n);
    }
    char *p = tmpl__alloc(&r->a, obj->u.s.n + 1);
    if (!p) return tmpl__oom(r, n);
    size_t w = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t k = start + (int64_t)i * step;
        memcpy(p + w, obj->u.s.p + offs[k], offs[k + 1] - offs[k]);
        w += offs[k + 1] - offs[k];
    }
    p[w] = 0;
    *out = tmpl__v_str(&r->a, p, w, 0);
    return *out ? 0 : tmpl__oom(r, n);
}

static tmpl_value *loop_attr(tmpl__rs *r, tv_loop *L, const char *name, size_t n) {
    int64_t v;
    if (TMPL_NAME_EQ(name, n, "index")) v = (int64_t)L->i + 1;
    else if (TMPL_NAME_EQ(name, n, "index0")) v = (int64_t)L->i;
    else if (TMPL_NAME_EQ(name, n, "revindex")) v = (int64_t)(L->n - L->i);
    else if (TMPL_NAME_EQ(name, n, "revindex0")) v = (int64_t)(L->n - L->i - 1);
    else if (TMPL_NAME_EQ(name, n, "length")) v = (int64_t)L->n;
    else if (TMPL_NAME_EQ(name, n, "depth")) v = L->depth + 1;
    else if (TMPL_NAME_EQ(name, n, "depth0")) v = L->depth;
    else if (TMPL_NAME_EQ(name, n, "first")) return tmpl__bool(L->i == 0);
    else if (TMPL_NAME_EQ(name, n, "last")) return tmpl__bool(L->i + 1 == L->n);
    else if (TMPL_NAME_EQ(name, n, "previtem")) return L->i > 0 ? L->items[L->i - 1] : &tmpl__undef;
    else if (TMPL_NAME_EQ(name, n, "nextitem")) return L->i + 1 < L->n ? L->items[L->i + 1] : &tmpl__undef;
    else return &tmpl__undef;
    tmpl_value *x = tmpl__v_int(&r->a, v);
    return x ? x : &tmpl__undef;
}

tmpl_value *tmpl__getattr(tmpl__rs *r, tmpl_value *obj, const char *name, size_t n) {
    switch (obj->type) {
    case TV_DICT: case TV_NS: {
        tmpl_value *v = tmpl__dict_get(obj->u.d, name, n);
        return v ? v : &tmpl__undef;
    }
    case TV_LOOP: return loop_attr(r, obj->u.loop, name, n);
    default: return &tmpl__undef;
    }
}

int tmpl__getitem(tmpl__rs *r, const tnode *at, tmpl_value *obj, tmpl_value *key, tmpl_value **out) {
    *out = &tmpl__undef;
    if (obj->type == TV_LIST || obj->type == TV_STR) {
        if (key->type != TV_INT && key->type != TV_BOOL) {
            if (key->type == TV_STR) return 0; /* e.g. messages['x']: undefined, like an attribute */
            return tmpl__err(r, at, CM_ETEMPLATE, "indices must be integers, not '%s'", tmpl__type_name(key));
        }
        int64_t i = key->type == TV_INT ? key->u.i : key->u.b;
        if (obj->type == TV_LIST) {
            int64_t L = (int64_t)obj->u.l->n;
            if (i < 0) i += L;
            if (i >= 0 && i < L) *out = obj->u.l->v[i];
            return 0;
        }
        const char *p = obj->u.s.p;
        size_t sn = obj->u.s.n;
        if (i < 0) {
            i += (int64_t)tmpl__cp_count(p, sn);
            if (i < 0) return 0;
        }
        size_t off = 0;
        for (int64_t k = 0; k < i && off < sn; k++) off += tmpl__cp_len(p + off, sn - off);
        if (off >= sn) return 0;
        *out = tmpl__v_str(&r->a, p + off, tmpl__cp_len(p + off, sn - off), 1);
        return *out ? 0 : tmpl__oom(r, at);
    }
    if (obj->type == TV_DICT || obj->type == TV_NS || obj->type == TV_LOOP) {
        if (key->type == TV_STR) { *out = tmpl__getattr(r, obj, key->u.s.p, key->u.s.n); return 0; }
        if (obj->type == TV_LOOP) return 0;
        /* non-string keys: dicts built from JSON only have string keys; look up str(key) */
        tmpl__sb sb = {.max = 64};
        if (key->type == TV_INT && !tmpl__to_str(&sb, key)) *out = tmpl__getattr(r, obj, sb.p, sb.n);
        tmpl__sb_free(&sb);
        return 0;
    }
    return 0; /* undefined / none / numbers: undefined */
}

static int eval(tmpl__rs *r, tmpl__frame *f, const tnode *n, tmpl_value **out) {
    int rc;
    tmpl_value *a, *b;
    if ((rc = tmpl__step(r, n))) return rc;
    if (++r->depth > r->max_depth) return tmpl__err(r, n, CM_ETOOBIG, "recursion deeper than %d", r->max_depth);
    *out = &tmpl__undef;
    switch (n->kind) {
    case N_LIT: *out = n->lit; break;
    case N_NAME: *out = lookup(r, f, n->name.p, n->name.n); break;
    case N_ATTR:
        if ((rc = eval(r, f, n->a, &a))) break;
        *out = tmpl__getattr(r, a, n->name.p, n->name.n);
        break;
    case N_ITEM:
        if ((rc = eval(r, f, n->a, &a)) || (rc = eval(r, f, n->b, &b))) break;
        if (!(rc = tmpl__getitem(r, n, a, b, out)) && a->type == TV_STR) rc = tmpl__charge(r, n, a);
        break;
    case N_SLICE: {
        tmpl_value *sv[3] = {NULL, NULL, NULL};
        if ((rc = eval(r, f, n->a, &a))) break;
        for (int i = 0; i < 3 && !rc; i++)
            if (n->v[i]) rc = eval(r, f, n->v[i], &sv[i]);
        if (!rc) rc = slice(r, n, a, sv, out);
        if (!rc) rc = tmpl__charge(r, n, a);
        break;
    }
    case N_CALL: rc = eval_call(r, f, n, NULL, out); break;
    case N_FILTER: {
        tmpl__args args;
        if ((rc = eval(r, f, n->a, &a)) || (rc = eval_args(r, f, n, &args, 0))) break;
        if (!(rc = tmpl__filter(r, n, &n->name, a, &args, out)) && !(rc = tmpl__charge(r, n, a))) rc = tmpl__charge(r, n, *out);
        break;
    }
    case N_TEST: {
        tmpl__args args;
        int res = 0;
        if ((rc = eval(r, f, n->a, &a)) || (rc = eval_args(r, f, n, &args, 0))) break;
        if ((rc = tmpl__test(r, n, &n->name, a, &args, &res))) break;
        *out = tmpl__bool(n->negate ? !res : res);
        break;
    }
    case N_NEG: case N_POS: {
        if ((rc = eval(r, f, n->a, &a))) break;
        double d;
        int64_t i;
        int is_int;
        if (!as_num(a, &d, &i, &is_int)) { rc = tmpl__err(r, n, CM_ETEMPLATE, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', tmpl__type_name(a)); break; }
        if (n->kind == N_POS) rc = num_result(r, n, is_int, i, d, out);
        else if (is_int && i != INT64_MIN) rc = num_result(r, n, 1, -i, 0, out);
        else rc = num_result(r, n, 0, 0, -d, out);
        break;
    }
    case N_NOT:
        if ((rc = eval(r, f, n->a, &a))) break;
        *out = tmpl__bool(!tmpl__truthy(a));
        break;
    case N_AND: case N_OR:
        if ((rc = eval(r, f, n->a, &a))) break;
        if ((n->kind == N_AND) == !!tmpl__truthy(a)) rc = eval(r, f, n->b, out);
        else *out = a;
        break;
    case N_BIN:
        if ((rc = eval(r, f, n->a, &a)) || (rc = eval(r, f, n->b, &b))) break;
        if (!(rc = binop(r, n, a, b, out)) && n->op != OP_EQ && n->op != OP_NE && !(rc = tmpl__charge(r, n, a)) &&
            !(rc = tmpl__charge(r, n, b)))
            rc = tmpl__charge(r, n, *out);
        break;
    case N_COND:
        if ((rc = eval(r, f, n->a, &a))) break;
        if (tmpl__truthy(a)) rc = eval(r, f, n->b, out);
        else if (n->c) rc = eval(r, f, n->c, out);
        break;
    case N_LIST: case N_TUPLE: {
        tmpl_value *l = tmpl__v_list(&r->a, (size_t)n->nv);
        if (!l) { rc = tmpl__oom(r, n); break; }
        l->is_tuple = n->kind == N_TUPLE;
        for (int i = 0; i < n->nv && !rc; i++) rc = eval(r, f, n->v[i], &l->u.l->v[i]);
        l->u.l->n = (size_t)n->nv;
        *out = l;
        break;
    }
    case N_DICT: {
        tmpl_value *d = tmpl__v_dict(&r->a, TV_DICT);
        if (!d) { rc = tmpl__oom(r, n); break; }
        for (int i = 0; i < n->nv && !rc; i++) {
            if ((rc = eval(r, f, n->v[i], &a)) || (rc = eval(r, f, n->w[i], &b))) break;
            if (a->type != TV_STR) {
                tmpl__sb sb = {.max = 4096};
                if ((rc = tmpl__to_str(&sb, a))) { tmpl__sb_free(&sb); rc = sb_fail(r, n, rc); break; }
                a = tmpl__v_str(&r->a, sb.p ? sb.p : "", sb.n, 1);
                tmpl__sb_free(&sb);
                if (!a) { rc = tmpl__oom(r, n); break; }
            }
            if (tmpl__dict_set(&r->a, d->u.d, a->u.s.p, a->u.s.n, b, 0)) rc = tmpl__oom(r, n);
        }
        *out = d;
        break;
    }
    default: rc = tmpl__err(r, n, CM_ETEMPLATE, "not an expression");
    }
    r->depth--;
    return rc;
}

/* ---- statements ------------------------------------------------------------------------- */
static int emit(tmpl__rs *r, const tnode *at, const char *p, size_t n) {
    int rc = tmpl__sb_put(r->out, p, n);
    return rc ? sb_fail(r, at, rc) : 0;
}

static int bind_targets(tmpl__rs *r, tmpl__frame *f, const tnode *n, tmpl_value *v) {
    if (n->nnames == 1) return frame_set(r, n, f, n->names[0].p, n->names[0].n, v);
    if (v->type != TV_LIST)
        return tmpl__err(r, n, CM_ETEMPLATE, "cannot unpack '%s' into %d names", tmpl__type_name(v), n->nnames);
    if (v->u.l->n != (size_t)n->nnames)
        return tmpl__err(r, n, CM_ETEMPLATE, "cannot unpack %zu values into %d names", v->u.l->n, n->nnames);
    for (int i = 0; i < n->nnames; i++) {
        int rc = frame_set(r, n, f, n->names[i].p, n->names[i].n, v->u.l->v[i]);
        if (rc) return rc;
    }
    return 0;
}

/* The sequence a for loop walks: a list's items, a dict's keys, a string's characters. */
static int iter_items(tmpl__rs *r, const tnode *n, tmpl_value *seq, tmpl_value ***items, size_t *count) {
    *items = NULL;
    *count = 0;
    switch (seq->type) {
    case TV_LIST: *items = seq->u.l->v; *count = seq->u.l->n; return 0;
    case TV_UNDEF: return 0;
    case TV_DICT: {
        const tv_dict *d = seq->u.d;
        if (!d->n) return 0;
        tmpl_value **v = tmpl__alloc(&r->a, d->n * sizeof *v);
        if (!v) return tmpl__oom(r, n);
        for (size_t i = 0; i < d->n; i++)
            if (!(v[i] = tmpl__v_str(&r->a, d->e[i].k, d->e[i].kn, 0))) return tmpl__oom(r, n);
        *items = v;
        *count = d->n;
        return 0;
    }
    case TV_STR: {
        size_t k = tmpl__cp_count(seq->u.s.p, seq->u.s.n);
        if (!k) return 0;
        tmpl_value **v = tmpl__alloc(&r->a, k * sizeof *v);
        if (!v) return tmpl__oom(r, n);
        size_t off = 0;
        for (size_t i = 0; i < k; i++) {
            size_t l = tmpl__cp_len(seq->u.s.p + off, seq->u.s.n - off);
            if (!(v[i] = tmpl__v_str(&r->a, seq->u.s.p + off, l, 0))) return tmpl__oom(r, n);
            off += l;
        }
        *items = v;
        *count = k;
        return 0;
    }
    default: return tmpl__err(r, n, CM_ETEMPLATE, "'%s' object is not iterable", tmpl__type_name(seq));
    }
}

static int exec_for(tmpl__rs *r, tmpl__frame *f, const tnode *n) {
    tmpl_value *seq, **items;
    size_t count;
    int rc;
    if ((rc = eval(r, f, n->a, &seq)) || (rc = iter_items(r, n, seq, &items, &count))) return rc;
    tmpl__frame *lf = frame_new(r, f);
    if (!lf) return tmpl__oom(r, n);
    if (n->b && count) { /* for x in y if cond: filter first, so loop.length counts what runs */
        tmpl_value **kept = tmpl__alloc(&r->a, count * sizeof *kept);
        if (!kept) return tmpl__oom(r, n);
        size_t k = 0;
        for (size_t i = 0; i < count; i++) {
            tmpl_value *c;
            if ((rc = tmpl__step(r, n)) || (rc = bind_targets(r, lf, n, items[i])) || (rc = eval(r, lf, n->b, &c))) return rc;
            if (tmpl__truthy(c)) kept[k++] = items[i];
        }
        items = kept;
        count = k;
    }
    if (!count) return exec_body(r, f, n->w, n->nw);
    tv_loop *L = tmpl__alloc(&r->a, sizeof *L);
    tmpl_value *lv = tmpl__alloc(&r->a, sizeof *lv);
    if (!L || !lv) return tmpl__oom(r, n);
    memset(L, 0, sizeof *L);
    memset(lv, 0, sizeof *lv);
    L->items = items;
    L->n = count;
    lv->type = TV_LOOP;
    lv->u.loop = L;
    for (size_t i = 0; i < count; i++) {
        L->i = i;
        lf->n = 0; /* every iteration starts from the outer scope (Jinja: assignments don't carry over) */
        if ((rc = tmpl__step(r, n)) || (rc = frame_set(r, n, lf, "loop", 4, lv)) || (rc = bind_targets(r, lf, n, items[i])))
            return rc;
        rc = exec_body(r, lf, n->v, n->nv);
        if (rc == FLOW_BREAK) break;
        if (rc < 0) return rc;
    }
    return 0;
}

static int apply_chain(tmpl__rs *r, tmpl__frame *f, tnode *const *chain, int n, tmpl_value **v) {
    for (int i = 0; i < n; i++) {
        tmpl__args args;
        int rc = eval_args(r, f, chain[i], &args, 0);
        if (!rc) rc = tmpl__filter(r, chain[i], &chain[i]->name, *v, &args, v);
        if (rc) return rc;
    }
    return 0;
}

static int exec_stmt(tmpl__rs *r, tmpl__frame *f, const tnode *n) {
    int rc;
    tmpl_value *v;
    switch (n->kind) {
    case N_TEXT: return emit(r, n, n->name.p, n->name.n);
    case N_OUT:
        if ((rc = eval(r, f, n->a, &v)) || (rc = tmpl__charge(r, n, v))) return rc;
        if (v->type == TV_STR) return emit(r, n, v->u.s.p, v->u.s.n);
        rc = tmpl__to_str(r->out, v);
        return rc ? sb_fail(r, n, rc) : 0;
    case N_IF:
        if ((rc = eval(r, f, n->a, &v))) return rc;
        return tmpl__truthy(v) ? exec_body(r, f, n->v, n->nv) : exec_body(r, f, n->w, n->nw);
    case N_FOR: return exec_for(r, f, n);
    case N_SET:
        if ((rc = eval(r, f, n->a, &v))) return rc;
        if (n->b) {
            tmpl_value *ns;
            if ((rc = eval(r, f, n->b, &ns))) return rc;
            if (ns->type != TV_NS && !(ns->type == TV_DICT && ns->u.d->owner == &r->a))
                return tmpl__err(r, n, CM_ETEMPLATE, "cannot assign attribute on '%s' (only on a namespace)", tmpl__type_name(ns));
            return tmpl__dict_set(&r->a, ns->u.d, n->name.p, n->name.n, v, 0) ? tmpl__oom(r, n) : 0;
        }
        return bind_targets(r, f, n, v);
    case N_SETBLOCK:
        if ((rc = capture(r, f, n, n->v, n->nv, &v))) return rc;
        if ((rc = apply_chain(r, f, n->w, n->nw, &v))) return rc;
        return frame_set(r, n, f, n->names[0].p, n->names[0].n, v);
    case N_MACRO: {
        tv_macro *m = tmpl__alloc(&r->a, sizeof *m);
        tmpl_value *mv = tmpl__alloc(&r->a, sizeof *mv);
        if (!m || !mv) return tmpl__oom(r, n);
        m->def = n;
        m->closure = f;
        m->caller = NULL;
        memset(mv, 0, sizeof *mv);
        mv->type = TV_MACRO;
        mv->u.m = m;
        return frame_set(r, n, f, n->name.p, n->name.n, mv);
    }
    case N_CALLBLOCK: {
        tv_macro *m = tmpl__alloc(&r->a, sizeof *m);
        tmpl_value *cv = tmpl__alloc(&r->a, sizeof *cv);
        if (!m || !cv) return tmpl__oom(r, n);
        m->def = n;
        m->closure = f;
        m->caller = NULL;
        memset(cv, 0, sizeof *cv);
        cv->type = TV_MACRO;
        cv->u.m = m;
        if ((rc = eval_call(r, f, n->a, cv, &v))) return rc;
        if (v->type == TV_STR) return emit(r, n, v->u.s.p, v->u.s.n);
        rc = tmpl__to_str(r->out, v);
        return rc ? sb_fail(r, n, rc) : 0;
    }
    case N_FILTERBLOCK:
        if ((rc = capture(r, f, n, n->v, n->nv, &v))) return rc;
        if ((rc = apply_chain(r, f, n->w, n->nw, &v))) return rc;
        rc = tmpl__to_str(r->out, v);
        return rc ? sb_fail(r, n, rc) : 0;
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_DO: return eval(r, f, n->a, &v);
    case N_BLOCK: return exec_body(r, f, n->v, n->nv);
    case N_WITH: {
        tmpl__frame *wf = frame_new(r, f);
        if (!wf) return tmpl__oom(r, n);
        for (int i = 0; i < n->nnames; i++) { /* values see the outer scope, like Jinja */
            if ((rc = eval(r, f, n->w[i], &v)) || (rc = frame_set(r, n, wf, n->names[i].p, n->names[i].n, v))) return rc;
        }
        return exec_body(r, wf, n->v, n->nv);
    }
    default: return tmpl__err(r, n, CM_ETEMPLATE, "not a statement");
    }
}

static int exec_body(tmpl__rs *r, tmpl__frame *f, tnode *const *body, int nbody) {
    if (++r->depth > r->max_depth)
        return tmpl__err(r, nbody ? body[0] : NULL, CM_ETOOBIG, "recursion deeper than %d", r->max_depth);
    int rc = 0;
    for (int i = 0; i < nbody && !rc; i++) {
        if ((rc = tmpl__step(r, body[i]))) break;
        rc = exec_stmt(r, f, body[i]);
    }
    r->depth--;
    return rc;
}

int tmpl_render(const tmpl *t, const tmpl_value *ctx, const tmpl_limits *lim, char **out, size_t *out_len, char *err,
                size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out || (ctx && ctx->type != TV_DICT)) return CM_EINVAL;
    tmpl__rs r;
    memset(&r, 0, sizeof r);
    r.max_output = lim && lim->max_output ? lim->max_output : (size_t)64 << 20;
    r.max_steps = lim && lim->max_steps ? lim->max_steps : 50000000ull;
    r.max_depth = lim && lim->max_depth > 0 ? lim->max_depth : 500;
    r.max_ms = lim && lim->max_ms ? lim->max_ms : 10000;
    r.deadline = mono_now() + r.max_ms / 1000.0;
    r.next_clock = 1024;
    tmpl__arena_init(&r.a, lim && lim->max_memory ? lim->max_memory : (size_t)256 << 20);
    r.ctx = ctx ? ctx->u.d : NULL;
    r.err = err;
    r.errlen = errlen;
    tmpl__sb sb = {.max = r.max_output, .live = &r.live, .live_max = r.a.cap};
    r.out = &sb;
    int rc = CM_ENOMEM;
    tmpl__frame *root = frame_new(&r, NULL);
    if (root) rc = exec_body(&r, root, t->body, t->nbody);
    else rc = tmpl__oom(&r, NULL);
    tmpl__arena_release(&r.a);
    if (rc == 0 && !sb.p) rc = tmpl__sb_put(&sb, "", 0);
    if (rc) {
        if (rc > 0) rc = CM_ETEMPLATE;
        if (!r.failed && err && errlen) snprintf(err, errlen, "%s", cm_err_str(rc));
        tmpl__sb_free(&sb);
        return rc;
    }
    *out = sb.p;
    if (out_len) *out_len = sb.n;
    return 0;
}
