/* grammar: program checks, the token trie, the pushdown matcher and its mask caches (see
 * grammar.h). */
#include "grammar.h"
#include "../common/cm_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODE_ROOT 0u   /* below the bottom of a real stack: popping it means the grammar ends */
#define NODE_SENT 1u   /* below the bottom of a classification stack: popping it leaves P's rule */
#define SET_DEAD  0u   /* the empty set: nothing can follow */
#define F_ACCEPT  1u   /* a stack of the set is empty: the grammar may end here */
#define F_OUT     2u   /* a stack popped past the sentinel */

/* Soft sizes (ex_gram_compact rebuilds past them) and hard ones (a computation fails past them). */
#define SOFT_NODES (1u << 20)
#define SOFT_SETS  (1u << 18)
#define SOFT_TRANS (1u << 21)
#define SOFT_MASK_BYTES ((size_t)64 << 20)
#define HARD_NODES (1u << 23)
#define HARD_SETS  (1u << 21)
#define HARD_TRANS (1u << 24)
#define MAX_TOKEN_BYTES 4096 /* longer tokens are never matched (none exists in practice) */

/* ============================================================================================
 * Program checks
 * ========================================================================================== */

typedef struct prog_view {
    uint32_t n_classes, n_rules, n_elems, root;
    const uint32_t *cls, *rstart, *el;
} prog_view;

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Fills *pv from prog (which must be 4-byte aligned) after checking every size and index. */
static int prog_view_of(const void *prog, size_t len, prog_view *pv, char *err, size_t errlen) {
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return CM_EFORMAT; } while (0)
    const uint8_t *b = prog;
    if (!prog || len < 24 || len % 4) BAD("grammar program: %zu bytes", len);
    if (len > EX_GRAM_MAX_BYTES) BAD("grammar program: %zu bytes, at most %zu", len, EX_GRAM_MAX_BYTES);
    if (rd32(b) != EX_GRAM_MAGIC) BAD("grammar program: bad magic");
    if (rd32(b + 4) != EX_GRAM_VERSION) BAD("grammar program: version %u (this executor reads %u)", rd32(b + 4), EX_GRAM_VERSION);
    pv->n_classes = rd32(b + 8);
    pv->n_rules = rd32(b + 12);
    pv->n_elems = rd32(b + 16);
    pv->root = rd32(b + 20);
    if (pv->n_rules == 0 || pv->n_elems == 0 || pv->n_elems >= (1u << 24) || pv->n_rules >= (1u << 24) ||
        pv->n_classes >= (1u << 24))
        BAD("grammar program: %u rules, %u elements, %u classes", pv->n_rules, pv->n_elems, pv->n_classes);
    uint64_t need = 24 + 32ull * pv->n_classes + 4ull * pv->n_rules + 4ull * pv->n_elems;
    if (need != len) BAD("grammar program: %zu bytes, its header says %llu", len, (unsigned long long)need);
    if (pv->root >= pv->n_rules) BAD("grammar program: root rule %u of %u", pv->root, pv->n_rules);
    pv->cls = (const uint32_t *)(b + 24);
    pv->rstart = pv->cls + 8ull * pv->n_classes;
    pv->el = pv->rstart + pv->n_rules;
    for (uint32_t r = 0; r < pv->n_rules; r++) {
        uint32_t p = pv->rstart[r], alts = 0, len_alt = 0;
        if (p >= pv->n_elems) BAD("grammar program: rule %u starts at %u of %u elements", r, p, pv->n_elems);
        for (;; p++) {
            if (p >= pv->n_elems) BAD("grammar program: rule %u runs past the elements", r);
            uint32_t e = pv->el[p], k = EX_GE_KIND(e), a = EX_GE_ARG(e);
            if (k == EX_GE_RULE_END) {
                if (len_alt) BAD("grammar program: rule %u: an alternative without its end", r);
                break;
            }
            if (k == EX_GE_END) { alts++; len_alt = 0; continue; }
            if (k == EX_GE_CLASS && a >= pv->n_classes) BAD("grammar program: rule %u: class %u of %u", r, a, pv->n_classes);
            if (k == EX_GE_REF && a >= pv->n_rules) BAD("grammar program: rule %u: reference to rule %u of %u", r, a, pv->n_rules);
            if (k > EX_GE_RULE_END) BAD("grammar program: rule %u: element kind %u", r, k);
            len_alt++;
        }
        if (!alts) BAD("grammar program: rule %u has no alternative", r);
    }
    return 0;
#undef BAD
}

/* Left recursion: rule r reaches itself through references each preceded only by nullable
 * elements. Nullable rules first (fixpoint), then each rule's "left" references, then a
 * depth-first search of that graph for a cycle. */
static int check_left_recursion(const prog_view *pv, char *err, size_t errlen) {
    uint32_t R = pv->n_rules;
    uint8_t *nullable = calloc(R, 1), *color = calloc(R, 1);
    uint32_t *l0 = calloc((size_t)R + 1, sizeof(uint32_t)), *left = malloc(sizeof(uint32_t) * pv->n_elems);
    uint32_t *stack = malloc(sizeof(uint32_t) * 2 * ((size_t)R + 1));
    int rc = 0;
    if (!nullable || !color || !l0 || !left || !stack) { rc = CM_ENOMEM; goto out; }
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < R; r++) {
            if (nullable[r]) continue;
            int alt_null = 1;
            for (uint32_t p = pv->rstart[r];; p++) {
                uint32_t e = pv->el[p], k = EX_GE_KIND(e);
                if (k == EX_GE_RULE_END) break;
                if (k == EX_GE_END) {
                    if (alt_null) { nullable[r] = 1; changed = 1; break; }
                    alt_null = 1;
                } else if (k != EX_GE_REF || !nullable[EX_GE_ARG(e)]) {
                    alt_null = 0;
                }
            }
        }
    }
    uint32_t nl = 0;
    for (uint32_t r = 0; r < R; r++) {
        l0[r] = nl;
        int live = 1; /* still at a left position of the alternative */
        for (uint32_t p = pv->rstart[r];; p++) {
            uint32_t e = pv->el[p], k = EX_GE_KIND(e);
            if (k == EX_GE_RULE_END) break;
            if (k == EX_GE_END) { live = 1; continue; }
            if (!live) continue;
            if (k == EX_GE_REF) {
                left[nl++] = EX_GE_ARG(e);
                if (!nullable[EX_GE_ARG(e)]) live = 0;
            } else {
                live = 0;
            }
        }
    }
    l0[R] = nl;
    for (uint32_t s = 0; s < R && !rc; s++) {
        if (color[s]) continue;
        int sp = 1;
        stack[0] = s, stack[1] = l0[s];
        color[s] = 1;
        while (sp > 0 && !rc) {
            uint32_t r = stack[2 * (sp - 1)], i = stack[2 * (sp - 1) + 1];
            if (i == l0[r + 1]) { color[r] = 2; sp--; continue; }
            stack[2 * (sp - 1) + 1] = i + 1;
            uint32_t t = left[i];
            if (color[t] == 1) {
                snprintf(err, errlen, "grammar program: rule %u is left-recursive (it reaches itself before any input)", t);
                rc = CM_EFORMAT;
            } else if (color[t] == 0) {
                color[t] = 1;
                stack[2 * sp] = t, stack[2 * sp + 1] = l0[t];
                sp++;
            }
        }
    }
out:
    free(nullable);
    free(color);
    free(l0);
    free(left);
    free(stack);
    return rc;
}

int ex_gram_check(const void *prog, size_t len, char *err, size_t errlen) {
    prog_view pv;
    if ((uintptr_t)prog % 4) {
        snprintf(err, errlen, "grammar program: unaligned");
        return CM_EFORMAT;
    }
    int rc = prog_view_of(prog, len, &pv, err, errlen);
    return rc ? rc : check_left_recursion(&pv, err, errlen);
}

uint64_t ex_gram_hash(const void *prog, size_t len) {
    /* FNV-1a over 64-bit words, then a finalizer: fast and well spread for cache keys */
    const uint8_t *p = prog;
    uint64_t h = 0xcbf29ce484222325ull ^ len;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* ============================================================================================
 * Vocabulary and trie
 * ========================================================================================== */

struct ex_gram_vocab {
    int n_vocab, n_tok;
    uint32_t *off;          /* [n_tok + 1] */
    uint8_t *bytes;
    /* tokens with bytes, sorted by their bytes: rank -> id */
    int32_t *rank_id;
    int n_ranked;
    /* trie: node 0 is the root; a node covers the ranks [lo, hi) of the tokens it prefixes, of
     * which [lo, lo + nend) end at it; its children are c_byte/c_node[child0 .. child0 + nchild) */
    uint32_t n_nodes;
    uint32_t *t_lo, *t_hi, *t_nend, *t_child0;
    uint16_t *t_nchild;
    uint8_t *c_byte;
    uint32_t *c_node;
};

static int rank_cmp(const void *a, const void *b, void *ctx) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const ex_gram_vocab *v = ctx;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static uint32_t tok_len(const ex_gram_vocab *v, int32_t id) { return v->off[id + 1] - v->off[id]; }
static const uint8_t *tok_bytes(const ex_gram_vocab *v, int32_t id) { return v->bytes + v->off[id]; }

/* Builds the trie over ranks [lo, hi) at depth d (all of them share their first d bytes).
 * Iterative: a work stack of pending nodes, each with its child slots allocated by its parent. */
typedef struct tb_item { uint32_t node, lo, hi, depth; } tb_item;

static int build_trie(ex_gram_vocab *v) {
    size_t total = 0;
    for (int r = 0; r < v->n_ranked; r++) total += tok_len(v, v->rank_id[r]);
    uint32_t cap = (uint32_t)total + 1;
    v->t_lo = malloc(sizeof(uint32_t) * cap);
    v->t_hi = malloc(sizeof(uint32_t) * cap);
    v->t_nend = malloc(sizeof(uint32_t) * cap);
    v->t_child0 = malloc(sizeof(uint32_t) * cap);
    v->t_nchild = malloc(sizeof(uint16_t) * cap);
    v->c_byte = malloc(cap);
    v->c_node = malloc(sizeof(uint32_t) * cap);
    tb_item *st = malloc(sizeof(tb_item) * cap);
    if (!v->t_lo || !v->t_hi || !v->t_nend || !v->t_child0 || !v->t_nchild || !v->c_byte || !v->c_node || !st) {
        free(st);
        return CM_ENOMEM;
    }
    uint32_t n_nodes = 1, n_child = 0;
    int sp = 0;
    st[sp++] = (tb_item){ 0, 0, (uint32_t)v->n_ranked, 0 };
    while (sp > 0) {
        tb_item it = st[--sp];
        uint32_t t = it.node, lo = it.lo, hi = it.hi, d = it.depth, k = lo;
        v->t_lo[t] = lo;
        v->t_hi[t] = hi;
        while (k < hi && tok_len(v, v->rank_id[k]) == d) k++;
        v->t_nend[t] = k - lo;
        /* children: runs of equal byte d */
        uint32_t c0 = n_child, nc = 0;
        for (uint32_t i = k; i < hi;) {
            uint8_t b = tok_bytes(v, v->rank_id[i])[d];
            uint32_t j = i + 1;
            while (j < hi && tok_bytes(v, v->rank_id[j])[d] == b) j++;
            uint32_t c = n_nodes++;
            v->c_byte[c0 + nc] = b;
            v->c_node[c0 + nc] = c;
            st[sp++] = (tb_item){ c, i, j, d + 1 };
            nc++;
            i = j;
        }
        n_child += nc;
        v->t_child0[t] = c0;
        v->t_nchild[t] = (uint16_t)nc;
    }
    free(st);
    v->n_nodes = n_nodes;
    return 0;
}

int ex_gram_vocab_create(int n_vocab, int n_tok, const uint32_t *off, const uint8_t *bytes, ex_gram_vocab **out) {
    *out = NULL;
    if (n_tok < 0 || n_vocab < n_tok || n_vocab <= 0 || !off || (off[n_tok] && !bytes) || off[0] != 0) return CM_EINVAL;
    for (int i = 0; i < n_tok; i++)
        if (off[i + 1] < off[i]) return CM_EINVAL;
    ex_gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return CM_ENOMEM;
    v->n_vocab = n_vocab;
    v->n_tok = n_tok;
    v->off = malloc(sizeof(uint32_t) * ((size_t)n_tok + 1));
    v->bytes = malloc(off[n_tok] ? off[n_tok] : 1);
    v->rank_id = malloc(sizeof(int32_t) * ((size_t)n_tok + 1));
    if (!v->off || !v->bytes || !v->rank_id) goto nomem;
    memcpy(v->off, off, sizeof(uint32_t) * ((size_t)n_tok + 1));
    if (off[n_tok]) memcpy(v->bytes, bytes, off[n_tok]);
    for (int i = 0; i < n_tok; i++) {
        uint32_t l = tok_len(v, i);
        if (l > 0 && l <= MAX_TOKEN_BYTES) v->rank_id[v->n_ranked++] = i;
    }
    qsort_r(v->rank_id, (size_t)v->n_ranked, sizeof(int32_t), rank_cmp, v);
    if (build_trie(v)) goto nomem;
    *out = v;
    return 0;
nomem:
    ex_gram_vocab_destroy(v);
    return CM_ENOMEM;
}

void ex_gram_vocab_destroy(ex_gram_vocab *v) {
    if (!v) return;
    free(v->off); free(v->bytes); free(v->rank_id);
    free(v->t_lo); free(v->t_hi); free(v->t_nend); free(v->t_child0); free(v->t_nchild);
    free(v->c_byte); free(v->c_node);
    free(v);
}

int ex_gram_vocab_n(const ex_gram_vocab *v) { return v->n_vocab; }

/* ============================================================================================
 * Hash maps (open addressing, linear probing)
 * ========================================================================================== */

/* u64 key -> u32 value; key UINT64_MAX marks an empty slot. */
typedef struct u64map {
    uint64_t *k;
    uint32_t *v;
    uint64_t mask, n;
} u64map;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int u64map_init(u64map *m, uint64_t cap) {
    m->k = malloc(sizeof(uint64_t) * cap);
    m->v = malloc(sizeof(uint32_t) * cap);
    if (!m->k || !m->v) return CM_ENOMEM;
    memset(m->k, 0xff, sizeof(uint64_t) * cap);
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

static void u64map_free(u64map *m) {
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof *m);
}

static void u64map_clear(u64map *m) {
    memset(m->k, 0xff, sizeof(uint64_t) * (m->mask + 1));
    m->n = 0;
}

/* Returns the value, or UINT32_MAX when absent. */
static inline uint32_t u64map_get(const u64map *m, uint64_t key) {
    for (uint64_t i = mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->k[i] == key) return m->v[i];
        if (m->k[i] == UINT64_MAX) return UINT32_MAX;
    }
}

static int u64map_put(u64map *m, uint64_t key, uint32_t val) {
    if ((m->n + 1) * 2 > m->mask + 1) {
        u64map nm;
        if (u64map_init(&nm, (m->mask + 1) * 2)) { u64map_free(&nm); return CM_ENOMEM; }
        for (uint64_t i = 0; i <= m->mask; i++)
            if (m->k[i] != UINT64_MAX) u64map_put(&nm, m->k[i], m->v[i]);
        u64map_free(m);
        *m = nm;
    }
    uint64_t i = mix64(key) & m->mask;
    while (m->k[i] != UINT64_MAX && m->k[i] != key) i = (i + 1) & m->mask;
    if (m->k[i] == UINT64_MAX) m->n++;
    m->k[i] = key;
    m->v[i] = val;
    return 0;
}

/* ============================================================================================
 * The grammar and its tables
 * ========================================================================================== */

/* The classification of one terminal position (grammar.h): accepted tokens, as a bitmap over
 * ids (dense) or a list of ids, and the uncertain ones as sorted ranks. */
typedef struct pos_ci {
    uint8_t   done, dense;
    uint32_t  n_acc, n_unc;
    uint32_t *acc;
    uint32_t *unc;
} pos_ci;

struct ex_gram {
    const ex_gram_vocab *v;
    uint32_t *prog;            /* owned copy */
    size_t    prog_len;
    prog_view pv;
    uint32_t *alt0, *nalt, *alts; /* per rule: its alternatives' first positions alts[alt0 .. alt0 + nalt) */
    uint32_t *rule_of;         /* [n_elems] the rule each position belongs to */
    uint32_t *follow;          /* [n_rules][8] the bytes that may come right after each rule */
    int32_t  *end_ids;
    int       n_end;
    int       words;
    pos_ci   *ci;              /* [n_elems] */
    /* nodes: (position, parent); 0 and 1 are ROOT and SENT */
    uint32_t *npos, *npar, *nmark;
    uint32_t  n_nodes, cap_nodes;
    u64map    node_map;
    /* sets: sorted top nodes in a pool, with flags */
    uint32_t *s_off, *s_n;
    uint8_t  *s_flags;
    uint32_t  n_sets, cap_sets;
    uint32_t *pool;
    size_t    n_pool, cap_pool;
    uint32_t *set_slots;       /* set id + 1, 0 empty */
    uint64_t  set_mask_bits, set_used;
    u64map    trans;           /* set << 8 | byte -> set */
    uint32_t **smask;          /* [cap_sets] cached masks of states */
    size_t    smask_bytes;
    uint32_t  epoch, gen;
    int       depth;           /* expand's recursion */
    /* scratch */
    uint32_t *tops;
    uint32_t  n_tops, cap_tops;
    uint8_t   tflags;
    uint32_t *wacc;            /* [ranked words] classification: accepted ranks */
    uint32_t *wunc;            /* uncertain ranks */
    size_t    n_unc, cap_unc;
    uint32_t *zero;            /* an all-zero mask */
    int       oom;             /* a table hit its hard size in this computation */
    ex_gram_stats st;
};

static inline int is_end_id(const ex_gram *g, int32_t t) {
    for (int i = 0; i < g->n_end; i++)
        if (g->end_ids[i] == t) return 1;
    return 0;
}

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return 0;
    uint32_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *np = realloc(*p, (size_t)c * elem);
    if (!np) return CM_ENOMEM;
    *p = np;
    *cap = c;
    return 0;
}

/* Interns node (pos, par); UINT32_MAX when out of room. */
static uint32_t node_get(ex_gram *g, uint32_t pos, uint32_t par) {
    uint64_t key = (uint64_t)pos << 32 | par;
    uint32_t n = u64map_get(&g->node_map, key);
    if (n != UINT32_MAX) return n;
    if (g->n_nodes >= HARD_NODES) { g->oom = 1; return UINT32_MAX; }
    uint32_t c = g->cap_nodes;
    if (grow((void **)&g->npos, &c, g->n_nodes + 1, sizeof(uint32_t))) { g->oom = 1; return UINT32_MAX; }
    c = g->cap_nodes;
    if (grow((void **)&g->npar, &c, g->n_nodes + 1, sizeof(uint32_t))) { g->oom = 1; return UINT32_MAX; }
    c = g->cap_nodes;
    if (grow((void **)&g->nmark, &c, g->n_nodes + 1, sizeof(uint32_t))) { g->oom = 1; return UINT32_MAX; }
    g->cap_nodes = c;
    n = g->n_nodes++;
    g->npos[n] = pos;
    g->npar[n] = par;
    g->nmark[n] = 0;
    if (u64map_put(&g->node_map, key, n)) { g->oom = 1; return UINT32_MAX; }
    return n;
}

static void tops_add(ex_gram *g, uint32_t n) {
    if (grow((void **)&g->tops, &g->cap_tops, g->n_tops + 1, sizeof(uint32_t))) { g->oom = 1; return; }
    g->tops[g->n_tops++] = n;
}

static void expand_at(ex_gram *g, uint32_t n, uint32_t pos, uint32_t par);

/* Adds to the set under construction every stack reached from position pos above parent par
 * (closure: rule references are expanded, ended alternatives popped), each (pos, par) once per
 * construction (the epoch marks). */
#define MAX_EXPAND 4096 /* nested expansion (references leading to references): a deeper grammar fails */

static void expand(ex_gram *g, uint32_t pos, uint32_t par) {
    uint32_t n = node_get(g, pos, par);
    if (n == UINT32_MAX || g->nmark[n] == g->epoch) return;
    if (g->depth >= MAX_EXPAND) { g->oom = 1; return; }
    g->depth++;
    expand_at(g, n, pos, par);
    g->depth--;
}

static void expand_at(ex_gram *g, uint32_t n, uint32_t pos, uint32_t par) {
    g->nmark[n] = g->epoch;
    uint32_t e = g->pv.el[pos], k = EX_GE_KIND(e);
    if (k == EX_GE_END) {
        if (par == NODE_ROOT) g->tflags |= F_ACCEPT;
        else if (par == NODE_SENT) g->tflags |= F_OUT;
        else expand(g, g->npos[par], g->npar[par]);
    } else if (k == EX_GE_CLASS || k == EX_GE_TOKEN) {
        tops_add(g, n);
    } else if (k == EX_GE_REF) {
        uint32_t r = EX_GE_ARG(e), cont = pos + 1;
        uint32_t np = EX_GE_KIND(g->pv.el[cont]) == EX_GE_END ? par : node_get(g, cont, par);
        if (np == UINT32_MAX) return;
        for (uint32_t a = 0; a < g->nalt[r]; a++) expand(g, g->alts[g->alt0[r] + a], np);
    }
}

static void begin_set(ex_gram *g) {
    if (++g->epoch == 0) { /* wrapped: clear the marks */
        memset(g->nmark, 0, sizeof(uint32_t) * g->n_nodes);
        g->epoch = 1;
    }
    g->n_tops = 0;
    g->tflags = 0;
}

static uint64_t set_hash(const uint32_t *t, uint32_t n, uint8_t flags) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ flags ^ ((uint64_t)n << 8);
    for (uint32_t i = 0; i < n; i++) h = mix64(h ^ t[i]);
    return h;
}

static int set_eq(const ex_gram *g, uint32_t s, const uint32_t *t, uint32_t n, uint8_t flags) {
    return g->s_n[s] == n && g->s_flags[s] == flags && !memcmp(g->pool + g->s_off[s], t, sizeof(uint32_t) * n);
}

static int set_slots_grow(ex_gram *g) {
    uint64_t cap = (g->set_mask_bits + 1) * 2;
    uint32_t *ns = calloc(cap, sizeof(uint32_t));
    if (!ns) return CM_ENOMEM;
    for (uint32_t s = 1; s < g->n_sets; s++) {
        uint64_t i = set_hash(g->pool + g->s_off[s], g->s_n[s], g->s_flags[s]) & (cap - 1);
        while (ns[i]) i = (i + 1) & (cap - 1);
        ns[i] = s + 1;
    }
    free(g->set_slots);
    g->set_slots = ns;
    g->set_mask_bits = cap - 1;
    return 0;
}

/* Interns the set under construction (its tops sorted first); SET_DEAD when it is empty,
 * UINT32_MAX when out of room. */
static uint32_t end_set(ex_gram *g) {
    if (g->oom) return UINT32_MAX;
    uint32_t *t = g->tops, n = g->n_tops;
    if (n == 0 && g->tflags == 0) return SET_DEAD;
    for (uint32_t i = 1; i < n; i++) { /* insertion sort: sets are small */
        uint32_t x = t[i], j = i;
        while (j > 0 && t[j - 1] > x) { t[j] = t[j - 1]; j--; }
        t[j] = x;
    }
    uint64_t h = set_hash(t, n, g->tflags);
    for (uint64_t i = h & g->set_mask_bits;; i = (i + 1) & g->set_mask_bits) {
        uint32_t s = g->set_slots[i];
        if (!s) break;
        if (set_eq(g, s - 1, t, n, g->tflags)) return s - 1;
    }
    if (g->n_sets >= HARD_SETS) { g->oom = 1; return UINT32_MAX; }
    uint32_t c = g->cap_sets;
    int rc = grow((void **)&g->s_off, &c, g->n_sets + 1, sizeof(uint32_t));
    c = g->cap_sets;
    rc |= grow((void **)&g->s_n, &c, g->n_sets + 1, sizeof(uint32_t));
    c = g->cap_sets;
    rc |= grow((void **)&g->s_flags, &c, g->n_sets + 1, 1);
    if (!rc && c != g->cap_sets) {
        uint32_t **nm = realloc(g->smask, sizeof(uint32_t *) * c);
        if (!nm) rc = CM_ENOMEM;
        else {
            memset(nm + g->cap_sets, 0, sizeof(uint32_t *) * (c - g->cap_sets));
            g->smask = nm;
        }
    }
    if (rc) { g->oom = 1; return UINT32_MAX; }
    g->cap_sets = c;
    if (g->n_pool + n > g->cap_pool) {
        size_t pc = g->cap_pool ? g->cap_pool : 1024;
        while (pc < g->n_pool + n) pc *= 2;
        uint32_t *np = realloc(g->pool, sizeof(uint32_t) * pc);
        if (!np) { g->oom = 1; return UINT32_MAX; }
        g->pool = np;
        g->cap_pool = pc;
    }
    uint32_t s = g->n_sets++;
    g->s_off[s] = (uint32_t)g->n_pool;
    g->s_n[s] = n;
    g->s_flags[s] = g->tflags;
    if (n) memcpy(g->pool + g->n_pool, t, sizeof(uint32_t) * n); /* an empty set: the pool may be NULL yet */
    g->n_pool += n;
    if ((uint64_t)(g->n_sets + 1) * 2 > g->set_mask_bits + 1 && set_slots_grow(g)) { g->oom = 1; return UINT32_MAX; }
    uint64_t i = h & g->set_mask_bits;
    while (g->set_slots[i]) i = (i + 1) & g->set_mask_bits;
    g->set_slots[i] = s + 1;
    return s;
}

static inline int class_has(const ex_gram *g, uint32_t cls, uint8_t b) {
    return (g->pv.cls[8 * cls + (b >> 5)] >> (b & 31)) & 1;
}

/* The set reached from s by byte b (memoised); UINT32_MAX when out of room. */
static uint32_t trans(ex_gram *g, uint32_t s, uint8_t b) {
    if (s == SET_DEAD) return SET_DEAD;
    uint64_t key = (uint64_t)s << 8 | b;
    uint32_t r = u64map_get(&g->trans, key);
    if (r != UINT32_MAX) return r;
    begin_set(g);
    for (uint32_t i = 0; i < g->s_n[s]; i++) {
        uint32_t n = g->pool[g->s_off[s] + i], pos = g->npos[n], e = g->pv.el[pos];
        if (EX_GE_KIND(e) == EX_GE_CLASS && class_has(g, EX_GE_ARG(e), b)) expand(g, pos + 1, g->npar[n]);
    }
    r = end_set(g);
    if (r == UINT32_MAX) return r;
    if (g->trans.n >= HARD_TRANS || u64map_put(&g->trans, key, r)) { g->oom = 1; return UINT32_MAX; }
    return r;
}

/* The set reached from s by the byte-less special token t. */
static uint32_t trans_token(ex_gram *g, uint32_t s, int32_t t) {
    begin_set(g);
    for (uint32_t i = 0; i < g->s_n[s]; i++) {
        uint32_t n = g->pool[g->s_off[s] + i], pos = g->npos[n], e = g->pv.el[pos];
        if (EX_GE_KIND(e) == EX_GE_TOKEN && EX_GE_ARG(e) == (uint32_t)t) expand(g, pos + 1, g->npar[n]);
    }
    return end_set(g);
}

/* The union of two sets. */
static uint32_t set_union(ex_gram *g, uint32_t a, uint32_t b) {
    if (a == SET_DEAD || a == b) return b;
    if (b == SET_DEAD) return a;
    begin_set(g);
    uint32_t sets[2] = { a, b };
    for (int k = 0; k < 2; k++) {
        uint32_t s = sets[k];
        g->tflags |= g->s_flags[s];
        for (uint32_t i = 0; i < g->s_n[s]; i++) {
            uint32_t n = g->pool[g->s_off[s] + i];
            if (g->nmark[n] != g->epoch) { g->nmark[n] = g->epoch; tops_add(g, n); }
        }
    }
    return end_set(g);
}

/* The set holding the single stack whose top is node n. */
static uint32_t set_single(ex_gram *g, uint32_t n) {
    begin_set(g);
    tops_add(g, n);
    return end_set(g);
}

/* ---- classification of a terminal position ------------------------------------------------ */

static int unc_push_range(ex_gram *g, uint32_t lo, uint32_t hi) {
    if (g->n_unc + (hi - lo) > g->cap_unc) {
        size_t c = g->cap_unc ? g->cap_unc : 256;
        while (c < g->n_unc + (hi - lo)) c *= 2;
        uint32_t *n = realloc(g->wunc, sizeof(uint32_t) * c);
        if (!n) { g->oom = 1; return CM_ENOMEM; }
        g->wunc = n;
        g->cap_unc = c;
    }
    for (uint32_t r = lo; r < hi; r++) g->wunc[g->n_unc++] = r;
    return 0;
}

/* Walks the trie below node t with s the set after t's bytes; o: some path left the position's
 * rule before t's end and the byte after that point may follow the rule (fol: FOLLOW of the
 * rule): what comes next then depends on the caller. Ranks are visited in order, so the
 * uncertain list comes out sorted. */
static void ci_walk(ex_gram *g, uint32_t t, uint32_t s, int o, const uint32_t *fol) {
    const ex_gram_vocab *v = g->v;
    if (v->t_nend[t]) {
        uint32_t lo = v->t_lo[t], hi = lo + v->t_nend[t];
        if (g->s_n[s] || (g->s_flags[s] & F_OUT))
            for (uint32_t r = lo; r < hi; r++) g->wacc[r >> 5] |= 1u << (r & 31);
        else if (o) unc_push_range(g, lo, hi);
    }
    int out_here = (g->s_flags[s] & F_OUT) != 0;
    for (uint32_t c = 0; c < v->t_nchild[t] && !g->oom; c++) {
        uint32_t ch = v->c_node[v->t_child0[t] + c];
        uint8_t b = v->c_byte[v->t_child0[t] + c];
        int o2 = o || (out_here && ((fol[b >> 5] >> (b & 31)) & 1));
        uint32_t s2 = trans(g, s, b);
        if (s2 == UINT32_MAX) return;
        if (s2 == SET_DEAD) {
            if (o2) unc_push_range(g, v->t_lo[ch], v->t_hi[ch]);
            continue;
        }
        ci_walk(g, ch, s2, o2, fol);
    }
}

/* FIRST (the bytes a rule may start with, and whether it may be empty) and FOLLOW (the bytes
 * that may come right after it anywhere), by fixpoint. The classification uses FOLLOW: a token
 * that leaves a position's rule can only go on with one of those bytes, so the others are
 * rejected there instead of left uncertain. Token elements add no bytes (they are matched by
 * id only). */
static int follow_sets(ex_gram *g) {
    const prog_view *pv = &g->pv;
    uint32_t R = pv->n_rules;
    uint32_t *first = calloc((size_t)R * 8, sizeof(uint32_t));
    uint8_t *nul = calloc(R, 1);
    g->follow = calloc((size_t)R * 8, sizeof(uint32_t));
    if (!first || !nul || !g->follow) { free(first); free(nul); return CM_ENOMEM; }
    for (int changed = 1; changed;) { /* FIRST and nullable */
        changed = 0;
        for (uint32_t r = 0; r < R; r++)
            for (uint32_t a = 0; a < g->nalt[r]; a++) {
                int live = 1;
                for (uint32_t p = g->alts[g->alt0[r] + a]; live; p++) {
                    uint32_t e = pv->el[p], k = EX_GE_KIND(e);
                    if (k == EX_GE_END) {
                        if (!nul[r]) { nul[r] = 1; changed = 1; }
                        break;
                    }
                    if (k == EX_GE_CLASS) {
                        for (int w = 0; w < 8; w++) {
                            uint32_t nb = first[8 * r + w] | pv->cls[8 * EX_GE_ARG(e) + w];
                            if (nb != first[8 * r + w]) { first[8 * r + w] = nb; changed = 1; }
                        }
                        live = 0;
                    } else if (k == EX_GE_REF) {
                        uint32_t t = EX_GE_ARG(e);
                        for (int w = 0; w < 8; w++) {
                            uint32_t nb = first[8 * r + w] | first[8 * t + w];
                            if (nb != first[8 * r + w]) { first[8 * r + w] = nb; changed = 1; }
                        }
                        live = nul[t];
                    } else {
                        live = 0; /* a token element */
                    }
                }
            }
    }
    for (int changed = 1; changed;) { /* FOLLOW */
        changed = 0;
        for (uint32_t r = 0; r < R; r++)
            for (uint32_t a = 0; a < g->nalt[r]; a++)
                for (uint32_t p = g->alts[g->alt0[r] + a]; EX_GE_KIND(pv->el[p]) != EX_GE_END; p++) {
                    uint32_t e = pv->el[p];
                    if (EX_GE_KIND(e) != EX_GE_REF) continue;
                    uint32_t t = EX_GE_ARG(e), add[8] = { 0 };
                    int rest_nul = 1;
                    for (uint32_t q = p + 1; rest_nul; q++) { /* FIRST of what follows in the alternative */
                        uint32_t f = pv->el[q], k = EX_GE_KIND(f);
                        if (k == EX_GE_END) break;
                        if (k == EX_GE_CLASS) { for (int w = 0; w < 8; w++) add[w] |= pv->cls[8 * EX_GE_ARG(f) + w]; rest_nul = 0; }
                        else if (k == EX_GE_REF) { for (int w = 0; w < 8; w++) add[w] |= first[8 * EX_GE_ARG(f) + w]; rest_nul = nul[EX_GE_ARG(f)]; }
                        else rest_nul = 0;
                    }
                    if (rest_nul)
                        for (int w = 0; w < 8; w++) add[w] |= g->follow[8 * r + w];
                    for (int w = 0; w < 8; w++) {
                        uint32_t nb = g->follow[8 * t + w] | add[w];
                        if (nb != g->follow[8 * t + w]) { g->follow[8 * t + w] = nb; changed = 1; }
                    }
                }
    }
    free(first);
    free(nul);
    return 0;
}

static pos_ci *classify(ex_gram *g, uint32_t pos) {
    pos_ci *ci = &g->ci[pos];
    if (ci->done) return ci;
    const ex_gram_vocab *v = g->v;
    uint32_t rwords = ((uint32_t)v->n_ranked + 31) / 32;
    memset(g->wacc, 0, sizeof(uint32_t) * (rwords ? rwords : 1));
    g->n_unc = 0;
    uint32_t n = node_get(g, pos, NODE_SENT);
    if (n == UINT32_MAX) return NULL;
    uint32_t s = set_single(g, n);
    if (s == UINT32_MAX) return NULL;
    ci_walk(g, 0, s, 0, g->follow + 8 * (size_t)g->rule_of[pos]);
    if (g->oom) return NULL;
    uint32_t n_acc = 0;
    for (uint32_t w = 0; w < rwords; w++) n_acc += (uint32_t)__builtin_popcount(g->wacc[w]);
    /* dense when a bitmap over ids is smaller than the id list */
    int dense = n_acc > (uint32_t)g->words;
    uint32_t *acc = dense ? calloc((size_t)g->words, sizeof(uint32_t)) : malloc(sizeof(uint32_t) * (n_acc ? n_acc : 1));
    uint32_t *unc = malloc(sizeof(uint32_t) * (g->n_unc ? g->n_unc : 1));
    if (!acc || !unc) {
        free(acc);
        free(unc);
        g->oom = 1;
        return NULL;
    }
    uint32_t k = 0;
    for (uint32_t w = 0; w < rwords; w++)
        for (uint32_t bits = g->wacc[w]; bits; bits &= bits - 1) {
            int32_t id = v->rank_id[w * 32 + (uint32_t)__builtin_ctz(bits)];
            if (dense) acc[id >> 5] |= 1u << (id & 31);
            else acc[k++] = (uint32_t)id;
        }
    if (g->n_unc) memcpy(unc, g->wunc, sizeof(uint32_t) * g->n_unc);
    ci->acc = acc;
    ci->unc = unc;
    ci->n_acc = n_acc;
    ci->n_unc = (uint32_t)g->n_unc;
    ci->dense = (uint8_t)dense;
    ci->done = 1;
    g->st.positions_done++;
    g->st.bytes += (dense ? (size_t)g->words * 4 : (size_t)n_acc * 4) + (size_t)g->n_unc * 4;
    return ci;
}

/* ---- masks of real states ----------------------------------------------------------------- */

static inline void set_bit(uint32_t *m, uint32_t t) { m[t >> 5] |= 1u << (t & 31); }

/* Sets the bits of the uncertain ranks U[a, b) (all inside node t's range) that the real set s
 * (after t's bytes) accepts. */
/* The first index in U[a, b) whose rank is >= x (U is sorted). */
static uint32_t lower(const uint32_t *U, uint32_t a, uint32_t b, uint32_t x) {
    while (a < b) {
        uint32_t mid = a + (b - a) / 2;
        if (U[mid] < x) a = mid + 1;
        else b = mid;
    }
    return a;
}

/* Sets the bits of the uncertain ranks U[a, b) (all inside node t's range) that the real set s
 * (after t's bytes) accepts. Children are found by binary search, so a subtree the set rejects
 * costs nothing however many uncertain tokens it holds. */
static void unc_walk(ex_gram *g, uint32_t *m, uint32_t t, uint32_t s, const uint32_t *U, uint32_t a, uint32_t b) {
    const ex_gram_vocab *v = g->v;
    uint32_t k = a;
    if (v->t_nend[t]) {
        uint32_t end = lower(U, a, b, v->t_lo[t] + v->t_nend[t]);
        if (g->s_n[s] || (g->s_flags[s] & F_ACCEPT))
            for (; k < end; k++) set_bit(m, (uint32_t)v->rank_id[U[k]]);
        k = end;
    }
    const uint32_t c0 = v->t_child0[t], nc = v->t_nchild[t];
    uint32_t c = 0;
    while (k < b && c < nc && !g->oom) {
        /* the child holding rank U[k]: the last whose range starts at or before it */
        uint32_t lo = c, hi = nc;
        while (hi - lo > 1) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (v->t_lo[v->c_node[c0 + mid]] <= U[k]) lo = mid;
            else hi = mid;
        }
        c = lo;
        uint32_t ch = v->c_node[c0 + c];
        uint32_t k2 = lower(U, k, b, v->t_hi[ch]);
        uint32_t s2 = trans(g, s, v->c_byte[c0 + c]);
        if (s2 != SET_DEAD && s2 != UINT32_MAX) unc_walk(g, m, ch, s2, U, k, k2);
        k = k2;
        c++;
    }
}

static uint32_t *compute_mask(ex_gram *g, uint32_t s) {
    uint32_t *m = calloc((size_t)g->words, sizeof(uint32_t));
    if (!m) return NULL;
    for (uint32_t i = 0; i < g->s_n[s] && !g->oom; i++) {
        uint32_t n = g->pool[g->s_off[s] + i], pos = g->npos[n], e = g->pv.el[pos];
        if (EX_GE_KIND(e) == EX_GE_TOKEN) {
            if (EX_GE_ARG(e) < (uint32_t)g->v->n_vocab) set_bit(m, EX_GE_ARG(e));
            continue;
        }
        pos_ci *ci = classify(g, pos);
        if (!ci) break;
        if (ci->dense)
            for (int w = 0; w < g->words; w++) m[w] |= ci->acc[w];
        else
            for (uint32_t j = 0; j < ci->n_acc; j++) set_bit(m, ci->acc[j]);
        if (ci->n_unc) {
            uint32_t s1 = set_single(g, n);
            if (s1 != UINT32_MAX) unc_walk(g, m, 0, s1, ci->unc, 0, ci->n_unc);
        }
    }
    if (g->oom) { free(m); return NULL; }
    if (g->s_flags[s] & F_ACCEPT)
        for (int i = 0; i < g->n_end; i++)
            if (g->end_ids[i] >= 0 && g->end_ids[i] < g->v->n_vocab) set_bit(m, (uint32_t)g->end_ids[i]);
    return m;
}

/* ---- life ---------------------------------------------------------------------------------- */

static int tables_init(ex_gram *g) {
    g->n_nodes = 2;
    g->n_sets = 1; /* SET_DEAD */
    g->n_pool = 0;
    u64map_clear(&g->node_map);
    u64map_clear(&g->trans);
    memset(g->set_slots, 0, sizeof(uint32_t) * (g->set_mask_bits + 1));
    g->s_off[0] = 0;
    g->s_n[0] = 0;
    g->s_flags[0] = 0;
    g->npos[0] = g->npos[1] = UINT32_MAX;
    g->npar[0] = g->npar[1] = UINT32_MAX;
    g->nmark[0] = g->nmark[1] = 0;
    g->gen++;
    return 0;
}

int ex_gram_create(const void *prog, size_t len, const ex_gram_vocab *v, const int32_t *end_ids, int n_end,
                   ex_gram **out, char *err, size_t errlen) {
    *out = NULL;
    if (!v || n_end < 0 || (n_end && !end_ids)) return CM_EINVAL;
    ex_gram *g = calloc(1, sizeof *g);
    if (!g) return CM_ENOMEM;
    int rc = CM_ENOMEM;
    g->v = v;
    g->prog = malloc(len ? len : 4);
    if (!g->prog) goto fail;
    memcpy(g->prog, prog, len);
    g->prog_len = len;
    if ((rc = ex_gram_check(g->prog, len, err, errlen))) goto fail;
    prog_view_of(g->prog, len, &g->pv, err, errlen);
    rc = CM_ENOMEM;
    const prog_view *pv = &g->pv;
    g->alt0 = malloc(sizeof(uint32_t) * pv->n_rules);
    g->nalt = calloc(pv->n_rules, sizeof(uint32_t));
    g->alts = malloc(sizeof(uint32_t) * pv->n_elems);
    g->ci = calloc(pv->n_elems, sizeof(pos_ci));
    g->words = ex_gram_mask_words(v->n_vocab);
    g->zero = calloc((size_t)g->words, sizeof(uint32_t));
    g->wacc = calloc(((size_t)v->n_ranked + 31) / 32 + 1, sizeof(uint32_t));
    g->end_ids = malloc(sizeof(int32_t) * (size_t)(n_end ? n_end : 1));
    if (!g->alt0 || !g->nalt || !g->alts || !g->ci || !g->zero || !g->wacc || !g->end_ids) goto fail;
    if (n_end) memcpy(g->end_ids, end_ids, sizeof(int32_t) * (size_t)n_end);
    g->n_end = n_end;
    uint32_t na = 0;
    g->rule_of = malloc(sizeof(uint32_t) * pv->n_elems);
    if (!g->rule_of) goto fail;
    for (uint32_t r = 0; r < pv->n_rules; r++) {
        g->alt0[r] = na;
        uint32_t p = pv->rstart[r];
        g->alts[na++] = p;
        for (;; p++) {
            uint32_t k = EX_GE_KIND(pv->el[p]);
            g->rule_of[p] = r;
            if (k == EX_GE_RULE_END) break;
            if (k == EX_GE_END && EX_GE_KIND(pv->el[p + 1]) != EX_GE_RULE_END) g->alts[na++] = p + 1;
        }
        g->nalt[r] = na - g->alt0[r];
    }
    if (follow_sets(g)) goto fail;
    if (u64map_init(&g->node_map, 1024) || u64map_init(&g->trans, 1024)) goto fail;
    g->set_slots = calloc(1024, sizeof(uint32_t));
    g->set_mask_bits = 1023;
    uint32_t c = 0;
    if (!g->set_slots || grow((void **)&g->npos, &c, 64, 4)) goto fail;
    c = 0;
    if (grow((void **)&g->npar, &c, 64, 4)) goto fail;
    c = 0;
    if (grow((void **)&g->nmark, &c, 64, 4)) goto fail;
    g->cap_nodes = c;
    c = 0;
    if (grow((void **)&g->s_off, &c, 64, 4)) goto fail;
    c = 0;
    if (grow((void **)&g->s_n, &c, 64, 4)) goto fail;
    c = 0;
    if (grow((void **)&g->s_flags, &c, 64, 1)) goto fail;
    g->smask = calloc(c, sizeof(uint32_t *));
    if (!g->smask) goto fail;
    g->cap_sets = c;
    tables_init(g);
    *out = g;
    return 0;
fail:
    ex_gram_destroy(g);
    return rc;
}

static void drop_masks(ex_gram *g) {
    if (!g->smask) return;
    for (uint32_t s = 0; s < g->cap_sets; s++) {
        free(g->smask[s]);
        g->smask[s] = NULL;
    }
    g->smask_bytes = 0;
}

void ex_gram_destroy(ex_gram *g) {
    if (!g) return;
    drop_masks(g);
    if (g->ci)
        for (uint32_t p = 0; p < g->pv.n_elems; p++) {
            free(g->ci[p].acc);
            free(g->ci[p].unc);
        }
    free(g->ci);
    free(g->prog); free(g->alt0); free(g->nalt); free(g->alts); free(g->end_ids); free(g->rule_of); free(g->follow);
    free(g->npos); free(g->npar); free(g->nmark);
    u64map_free(&g->node_map);
    u64map_free(&g->trans);
    free(g->s_off); free(g->s_n); free(g->s_flags); free(g->pool); free(g->set_slots); free(g->smask);
    free(g->tops); free(g->wacc); free(g->wunc); free(g->zero);
    free(g);
}

/* ---- states -------------------------------------------------------------------------------- */

static int fail_oom(ex_gram *g) {
    g->oom = 0;
    return CM_ENOMEM;
}

int ex_gram_state_init(ex_gram *g, ex_gram_state *st) {
    memset(st, 0, sizeof *st);
    begin_set(g);
    uint32_t r = g->pv.root;
    for (uint32_t a = 0; a < g->nalt[r]; a++) expand(g, g->alts[g->alt0[r] + a], NODE_ROOT);
    uint32_t s = end_set(g);
    if (s == UINT32_MAX) return fail_oom(g);
    st->set = s;
    st->gen = g->gen;
    return 0;
}

int ex_gram_mask(ex_gram *g, ex_gram_state *st, const uint32_t **mask) {
    *mask = g->zero;
    if (st->gen != g->gen) return CM_ESTATE;
    if (st->done) return 0;
    uint32_t s = st->set;
    if (g->smask[s]) {
        g->st.mask_hits++;
        *mask = g->smask[s];
        return 0;
    }
    uint32_t *m = compute_mask(g, s);
    if (!m) return fail_oom(g);
    g->smask[s] = m;
    g->smask_bytes += (size_t)g->words * 4;
    g->st.mask_misses++;
    *mask = m;
    return 0;
}

int ex_gram_advance(ex_gram *g, ex_gram_state *st, int32_t tok) {
    if (st->gen != g->gen) return CM_ESTATE;
    if (st->done || tok < 0 || tok >= g->v->n_vocab) return CM_EINVAL;
    uint32_t s = st->set;
    if (is_end_id(g, tok) && (g->s_flags[s] & F_ACCEPT)) {
        st->done = 1;
        return 0;
    }
    uint32_t r1 = SET_DEAD, len = tok < g->v->n_tok ? tok_len(g->v, tok) : 0;
    if (len > 0 && len <= MAX_TOKEN_BYTES) {
        const uint8_t *b = tok_bytes(g->v, tok);
        r1 = s;
        for (uint32_t i = 0; i < len && r1 != SET_DEAD; i++)
            if ((r1 = trans(g, r1, b[i])) == UINT32_MAX) return fail_oom(g);
        /* a token that ends with every stack's rule gone and no acceptance is no token */
    }
    uint32_t r2 = trans_token(g, s, tok);
    if (r2 == UINT32_MAX) return fail_oom(g);
    uint32_t r = set_union(g, r1, r2);
    if (r == UINT32_MAX) return fail_oom(g);
    if (r == SET_DEAD) return CM_EINVAL;
    st->set = r;
    return 0;
}

int ex_gram_accepting(ex_gram *g, const ex_gram_state *st) {
    return st->gen == g->gen && !st->done && (g->s_flags[st->set] & F_ACCEPT) != 0;
}

int ex_gram_finished(ex_gram *g, ex_gram_state *st) {
    if (st->gen != g->gen || st->done) return 1;
    return g->s_n[st->set] == 0 && !((g->s_flags[st->set] & F_ACCEPT) && g->n_end > 0);
}

/* ---- compaction ----------------------------------------------------------------------------- */

int ex_gram_wants_compact(const ex_gram *g) {
    return g->n_nodes >= SOFT_NODES || g->n_sets >= SOFT_SETS || g->trans.n >= SOFT_TRANS || g->smask_bytes >= SOFT_MASK_BYTES;
}

int ex_gram_compact(ex_gram *g, ex_gram_state *const *live, int n_live, int force) {
    if (!force && !ex_gram_wants_compact(g)) return 0;
    /* the live stacks, bottom to top: per state flags, tops, then per top depth + positions */
    size_t cap = 256, n = 0;
    uint32_t *buf = malloc(sizeof(uint32_t) * cap);
    if (!buf) return CM_ENOMEM;
#define PUT(x) do { if (n == cap) { uint32_t *nb = realloc(buf, sizeof(uint32_t) * (cap *= 2)); \
                        if (!nb) { free(buf); return CM_ENOMEM; } buf = nb; } buf[n++] = (x); } while (0)
    for (int i = 0; i < n_live; i++) {
        const ex_gram_state *st = live[i];
        uint32_t s = st->gen == g->gen ? st->set : SET_DEAD;
        PUT(g->s_flags[s]);
        PUT(g->s_n[s]);
        for (uint32_t j = 0; j < g->s_n[s]; j++) {
            size_t at = n;
            PUT(0);
            for (uint32_t nd = g->pool[g->s_off[s] + j]; nd != NODE_ROOT; nd = g->npar[nd]) PUT(g->npos[nd]);
            buf[at] = (uint32_t)(n - at - 1); /* depth; positions top to bottom */
        }
    }
#undef PUT
    drop_masks(g);
    tables_init(g);
    size_t k = 0;
    int rc = 1;
    for (int i = 0; i < n_live; i++) {
        ex_gram_state *st = live[i];
        begin_set(g);
        g->tflags = (uint8_t)buf[k++];
        uint32_t nt = buf[k++];
        for (uint32_t j = 0; j < nt; j++) {
            uint32_t d = buf[k++], par = NODE_ROOT;
            for (uint32_t q = d; q-- > 0;) par = node_get(g, buf[k + q], par);
            k += d;
            if (par != UINT32_MAX) tops_add(g, par);
        }
        uint32_t s = end_set(g);
        if (s == UINT32_MAX) { rc = fail_oom(g); break; }
        st->set = s;
        st->gen = g->gen;
    }
    free(buf);
    g->st.compactions++;
    return rc;
}

void ex_gram_stats_get(const ex_gram *g, ex_gram_stats *st) {
    *st = g->st;
    st->nodes = g->n_nodes;
    st->sets = g->n_sets;
    st->trans = g->trans.n;
    st->masks_cached = g->smask_bytes / ((size_t)g->words * 4);
    st->bytes += (uint64_t)g->n_nodes * 12 + (uint64_t)g->cap_sets * 9 + g->n_pool * 4 + g->trans.mask * 12 + g->smask_bytes;
}
