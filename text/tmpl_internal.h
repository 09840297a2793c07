/* tmpl_internal: shared between tmpl_value.c, tmpl_parse.c, tmpl_eval.c and tmpl_lib.c. */
#ifndef TXT_TMPL_INTERNAL_H
#define TXT_TMPL_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "tmpl.h"

/* ---- arena: chunked bump allocator with an optional byte cap ---------------------------- */
typedef struct tmpl__chunk tmpl__chunk;
struct tmpl_arena {
    tmpl__chunk *head;
    char        *cur, *end;
    size_t       used, cap; /* cap 0: unlimited */
    int          capped;    /* an allocation failed because of cap */
};
void *tmpl__alloc(tmpl_arena *a, size_t n); /* 16-byte aligned; NULL past cap or OOM */
char *tmpl__strdup(tmpl_arena *a, const char *s, size_t n); /* NUL-terminated copy */
void  tmpl__arena_init(tmpl_arena *a, size_t cap);
void  tmpl__arena_release(tmpl_arena *a);

/* ---- values ------------------------------------------------------------------------------ */
enum tv_type {
    TV_UNDEF = 0, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT, TV_NS,
    TV_MACRO, TV_BUILTIN, TV_LOOP, TV_METHOD
};

typedef struct tv_list tv_list;
typedef struct tv_dict tv_dict;
typedef struct tv_macro tv_macro;
typedef struct tv_loop tv_loop;
typedef struct tv_method tv_method;

struct tmpl_value {
    uint8_t type;     /* enum tv_type */
    uint8_t is_tuple; /* TV_LIST created as a tuple (prints with parentheses) */
    union {
        int      b;
        int64_t  i;
        double   f;
        struct { const char *p; size_t n; } s;
        tv_list  *l;
        tv_dict  *d;      /* TV_DICT and TV_NS */
        tv_macro *m;
        int       builtin;
        tv_loop  *loop;
        tv_method *meth;
    } u;
};

struct tv_list { tmpl_value **v; size_t n, cap; const tmpl_arena *owner; };
typedef struct tv_entry { const char *k; size_t kn; tmpl_value *v; } tv_entry;
struct tv_dict {
    tv_entry *e; size_t n, cap;
    uint32_t *idx; size_t icap; /* open addressing (entry index + 1), built past 8 entries */
    const tmpl_arena *owner;
};

extern tmpl_value tmpl__undef, tmpl__nonev, tmpl__true, tmpl__false;

tmpl_value *tmpl__v_str(tmpl_arena *a, const char *p, size_t n, int copy);
tmpl_value *tmpl__v_int(tmpl_arena *a, int64_t i);
tmpl_value *tmpl__v_float(tmpl_arena *a, double f);
tmpl_value *tmpl__v_list(tmpl_arena *a, size_t cap);
tmpl_value *tmpl__v_dict(tmpl_arena *a, int type);
int tmpl__list_push(tmpl_arena *a, tv_list *l, tmpl_value *v);
int tmpl__dict_set(tmpl_arena *a, tv_dict *d, const char *k, size_t kn, tmpl_value *v, int copy_key);
tmpl_value *tmpl__dict_get(const tv_dict *d, const char *k, size_t kn);
static inline tmpl_value *tmpl__bool(int b) { return b ? &tmpl__true : &tmpl__false; }

int  tmpl__truthy(const tmpl_value *v);
int  tmpl__equal(const tmpl_value *a, const tmpl_value *b);
/* The same, adding the number of elements compared to *work (nesting past 128 compares unequal). */
int  tmpl__equal_w(const tmpl_value *a, const tmpl_value *b, uint64_t *work);
const char *tmpl__type_name(const tmpl_value *v);

/* ---- string builder (malloc'ed, capped) ------------------------------------------------- */
typedef struct tmpl__sb {
    char *p; size_t n, cap, max; int over;
    size_t *live; size_t live_max; /* optional shared budget of bytes held by all capture buffers */
} tmpl__sb;
int  tmpl__sb_put(tmpl__sb *b, const char *s, size_t n); /* CM_ETOOBIG past max, CM_ENOMEM */
int  tmpl__sb_putc(tmpl__sb *b, char c);
int  tmpl__sb_printf(tmpl__sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tmpl__sb_free(tmpl__sb *b);

/* Python str(v) appended to b; repr for strings inside containers. */
int tmpl__to_str(tmpl__sb *b, const tmpl_value *v);
int tmpl__repr(tmpl__sb *b, const tmpl_value *v, int depth);
/* json.dumps(v, ensure_ascii, indent (<0: none), separators (NULL: defaults), sort_keys). */
int tmpl__to_json(tmpl__sb *b, const tmpl_value *v, int indent, const char *item_sep, const char *key_sep,
                  int sort_keys, int ensure_ascii, int depth);
void tmpl__fmt_float(char *buf, size_t cap, double f); /* Python repr(float) */

/* UTF-8 helpers: length of the code point starting at p (1 for a bad byte), code point count. */
size_t tmpl__cp_len(const char *p, size_t n);
size_t tmpl__cp_count(const char *p, size_t n);
int    tmpl__utf8_valid(const char *p, size_t n);

/* ---- AST ---------------------------------------------------------------------------------- */
enum tn_kind {
    /* expressions */
    N_LIT = 1, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_POS, N_NOT,
    N_BIN, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT,
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_BREAK, N_CONTINUE, N_DO, N_BLOCK /* plain body (generation) */, N_WITH
};

enum tn_op {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
};

typedef struct tnode tnode;
typedef struct tname { const char *p; size_t n; } tname;
struct tnode {
    uint16_t kind, op;
    uint8_t  negate; /* N_TEST: is not */
    int      line, col;
    tnode   *a, *b, *c;      /* operands / condition / iterable / filter chain ... */
    tnode  **v;  int nv;     /* positional args, list items, body, dict keys */
    tnode  **w;  int nw;     /* keyword arg values, else body, dict values, param defaults */
    tname   *names; int nnames; /* keyword names, for/set targets, macro params */
    tname    name;           /* identifier, attribute, filter/test/macro name, text */
    tmpl_value *lit;         /* N_LIT: a scalar constant (never mutated) */
};

struct tmpl {
    tmpl_arena a;    /* owns every node and literal */
    tnode    **body;
    int        nbody;
};

int tmpl__parse(tmpl *t, const char *src, size_t len, char *err, size_t errlen);

/* ---- render state --------------------------------------------------------------------- */
typedef struct tmpl__frame tmpl__frame;
struct tmpl__frame {
    tmpl__frame *parent;
    tv_entry    *vars; size_t n, cap;
};

typedef struct tmpl__rs {
    tmpl_arena  a;          /* values created by this render */
    const tv_dict *ctx;     /* caller's variables */
    tmpl__sb   *out;        /* where text goes now */
    uint64_t    steps, max_steps;
    uint64_t    next_clock;  /* steps at which the clock is read next */
    double      deadline;    /* CLOCK_MONOTONIC seconds */
    uint32_t    max_ms;
    size_t      live;        /* bytes held by capture buffers ({% set %} blocks, macro calls) */
    int         depth, max_depth;
    size_t      max_output;
    char       *err; size_t errlen;
    int         failed;
} tmpl__rs;

struct tv_macro {
    const tnode *def;        /* N_MACRO or N_CALLBLOCK */
    tmpl__frame *closure;
    tmpl_value  *caller;     /* the caller() a call block passes, or NULL */
};
struct tv_loop {
    tmpl_value **items; size_t n, i;
    int depth;
};
struct tv_method { tmpl_value *self; const char *name; size_t n; };

enum tv_builtin { B_RANGE = 1, B_NAMESPACE, B_RAISE, B_STRFTIME, B_DICT };

/* Error helpers: record the first error ("line L, column C: msg") and return the code. */
int tmpl__err(tmpl__rs *r, const tnode *at, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int tmpl__oom(tmpl__rs *r, const tnode *at);

/* Library (tmpl_lib.c): filters, tests, methods and global functions. args/kwargs evaluated. */
typedef struct tmpl__args {
    tmpl_value **pos; int npos;
    tname       *kwn; tmpl_value **kw; int nkw;
} tmpl__args;
int tmpl__filter(tmpl__rs *r, const tnode *at, const tname *name, tmpl_value *v, tmpl__args *args, tmpl_value **out);
int tmpl__test(tmpl__rs *r, const tnode *at, const tname *name, tmpl_value *v, tmpl__args *args, int *out);
int tmpl__method(tmpl__rs *r, const tnode *at, tmpl_value *self, const char *name, size_t n, tmpl__args *args,
                 tmpl_value **out);
int tmpl__has_method(const tmpl_value *self, const char *name, size_t n);
int tmpl__call_builtin(tmpl__rs *r, const tnode *at, int which, tmpl__args *args, tmpl_value **out);
int tmpl__builtin_id(const char *name, size_t n);
int tmpl__test_arity(const char *name, size_t n); /* 0, 1, or -1 for unknown tests */
int tmpl__filter_known(const char *name, size_t n);
/* Python's fmt % values (%s %r %d %i %%). */
int tmpl__percent_format(tmpl__rs *r, const tnode *at, tmpl_value *fmt, tmpl_value **vals, int nvals, tmpl_value **out);
/* Calls a macro value (used by the evaluator and by filters that call back, e.g. map). */
int tmpl__call_macro(tmpl__rs *r, const tnode *at, tmpl_value *fn, tmpl__args *args, tmpl_value **out);
/* Attribute / item access shared by the evaluator and selectattr/map/sort. */
tmpl_value *tmpl__getattr(tmpl__rs *r, tmpl_value *obj, const char *name, size_t n);
int tmpl__getitem(tmpl__rs *r, const tnode *at, tmpl_value *obj, tmpl_value *key, tmpl_value **out);
int tmpl__step(tmpl__rs *r, const tnode *at);
/* Charges work proportional to a value's size (string bytes / 64, list/dict elements / 64). */
int tmpl__charge(tmpl__rs *r, const tnode *at, const tmpl_value *v);
int tmpl__charge_n(tmpl__rs *r, const tnode *at, uint64_t units);

#define TMPL_NAME_EQ(p_, n_, lit) ((n_) == sizeof(lit) - 1 && memcmp((p_), (lit), sizeof(lit) - 1) == 0)

#endif
