/* kv: block allocator with reference counts and per-sequence block tables; an optional second
 * pool for the sliding-window layers. */
#include "kv.h"
#include "../common/cm_err.h"
#include "../model/dtype.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int      n_blocks;
    int      n_free;
    int32_t *free_list; /* [n_blocks] stack of free ids; the top is free_list[n_free-1] */
    int32_t *refs;      /* [n_blocks] holders per block */
} pool;

/* What the prefix cache knows of a block of the full-attention pool. */
typedef struct {
    uint64_t hash;      /* ex_kv_block_hash of its key (valid while cached) */
    int32_t  parent;    /* the block before it in its sequence, -1 for block 0 */
    uint32_t pgen;      /* the parent's generation when this block was cached */
    uint32_t gen;       /* bumped whenever the block leaves the cache: its children's keys die */
    uint8_t  cached;    /* its key is in the index */
    uint8_t  computed;  /* its positions are written */
    int32_t  prev, next;/* LRU links while cached, computed and unheld (-1 ends) */
} bmeta;

typedef struct {
    int       on;
    uint64_t  root;     /* mixed into block-0 keys: the model and adapter */
    bmeta    *m;        /* [n_blocks] */
    int32_t  *toks;     /* [n_blocks * block_size] the token ids of each cached block */
    int32_t  *slot;     /* [mask + 1] open addressing by hash, linear probing: block ids, -1 empty */
    uint32_t  mask;
    int32_t   lru_head, lru_tail; /* head: released longest ago, evicted first */
    int       n_lru;
} cache;

struct ex_kv {
    int  block_size;
    int  window;        /* sliding pool: positions a query sees; 0 without one */
    pool p[2];          /* [0] full-attention layers, [1] sliding-window layers (n_blocks 0: none) */
    cache c;            /* the prefix cache of p[0] */
};

size_t ex_kv_head_bytes(int kv_type, int head_dim) {
    if (head_dim <= 0) return 0;
    switch (kv_type) {
    case DT_F32: return 4 * (size_t)head_dim;
    case DT_F16: case DT_BF16: return 2 * (size_t)head_dim;
    case DT_F8_E4M3: return (size_t)head_dim + 4; /* codes + one f32 scale */
    case DT_Q8_0: return head_dim % QK8_0 ? 0 : (size_t)(head_dim / QK8_0) * sizeof(blk_q8_0);
    default: return 0;
    }
}

size_t ex_kv_group_bytes(const mdl_config *c, int swa, int block_size, int kv_type) {
    int layers = swa ? c->n_layer_swa : c->n_layer - c->n_layer_swa;
    return 2 * (size_t)layers * (size_t)block_size * (size_t)c->n_head_kv * ex_kv_head_bytes(kv_type, c->head_dim);
}

size_t ex_kv_block_bytes(const mdl_config *c, int block_size, int kv_type) {
    return 2 * (size_t)c->n_layer * (size_t)block_size * (size_t)c->n_head_kv * ex_kv_head_bytes(kv_type, c->head_dim);
}

int ex_kv_type_from_name(const char *name) {
    static const struct { const char *name; int type; } t[] = {
        { "auto", -1 }, { "f32", DT_F32 }, { "f16", DT_F16 }, { "fp8", DT_F8_E4M3 }, { "fp8_e4m3", DT_F8_E4M3 },
        { "q8_0", DT_Q8_0 },
    };
    for (size_t i = 0; name && i < sizeof t / sizeof *t; i++)
        if (!strcmp(name, t[i].name)) return t[i].type;
    return -2;
}

const char *ex_kv_type_name(int kv_type) {
    switch (kv_type) {
    case DT_F32: return "f32";
    case DT_F16: return "f16";
    case DT_BF16: return "bf16";
    case DT_F8_E4M3: return "fp8";
    case DT_Q8_0: return "q8_0";
    default: return "?";
    }
}

int64_t ex_kv_default_bytes(int64_t want) {
    int64_t avail = 4LL << 30; /* assume 4 GiB available when /proc/meminfo is unreadable */
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) { avail = kb * 1024; break; }
        fclose(f);
    }
    int64_t b = avail / 4;
    if (b > (16LL << 30)) b = 16LL << 30;
    if (want > 0 && b > want) b = want;
    return b;
}

int64_t ex_kv_fit_blocks(int64_t total, int64_t free_at_start, int64_t used, double fraction, int64_t block_bytes,
                         int reserved, int64_t *budget_out) {
    int64_t budget = (int64_t)(fraction * (double)total) - (total - free_at_start) - used;
    if (budget_out) *budget_out = budget;
    if (budget <= 0 || block_bytes <= 0) return 0;
    int64_t n = budget / block_bytes - reserved;
    return n < 0 ? 0 : n;
}

static int pool_init(pool *p, int n) {
    memset(p, 0, sizeof *p);
    if (n == 0) return 0;
    p->free_list = malloc(sizeof(int32_t) * (size_t)n);
    p->refs = calloc((size_t)n, sizeof(int32_t));
    if (!p->free_list || !p->refs) return CM_ENOMEM;
    p->n_blocks = n;
    /* Lowest ids on top so a fresh pool hands out 0, 1, 2, ... (easier to read in tests). */
    for (int i = 0; i < n; i++) p->free_list[i] = n - 1 - i;
    p->n_free = n;
    return 0;
}

int ex_kv_create_swa(int n_blocks, int n_swa, int block_size, int window, ex_kv **out) {
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0 || n_swa < 0 || (n_swa > 0 && window <= 0)) return CM_EINVAL;
    ex_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return CM_ENOMEM;
    kv->block_size = block_size;
    kv->window = n_swa > 0 ? window : 0;
    if (pool_init(&kv->p[0], n_blocks) || pool_init(&kv->p[1], n_swa)) {
        ex_kv_destroy(kv);
        return CM_ENOMEM;
    }
    *out = kv;
    return 0;
}

int ex_kv_create(int n_blocks, int block_size, ex_kv **out) { return ex_kv_create_swa(n_blocks, 0, block_size, 0, out); }

void ex_kv_destroy(ex_kv *kv) {
    if (!kv) return;
    for (int g = 0; g < 2; g++) {
        free(kv->p[g].free_list);
        free(kv->p[g].refs);
    }
    free(kv->c.m);
    free(kv->c.toks);
    free(kv->c.slot);
    free(kv);
}

static int has_swa(const ex_kv *kv) { return kv->p[1].n_blocks > 0; }

int ex_kv_n_blocks(const ex_kv *kv) {
    return has_swa(kv) && kv->p[1].n_blocks < kv->p[0].n_blocks ? kv->p[1].n_blocks : kv->p[0].n_blocks;
}
/* Blocks of the full-attention pool an allocation can get: free, or cached without a holder. */
static int avail0(const ex_kv *kv) { return kv->p[0].n_free + kv->c.n_lru; }

int ex_kv_n_free(const ex_kv *kv) { return has_swa(kv) && kv->p[1].n_free < avail0(kv) ? kv->p[1].n_free : avail0(kv); }
int ex_kv_n_cached(const ex_kv *kv) { return kv->c.n_lru; }
int ex_kv_n_blocks_swa(const ex_kv *kv) { return kv->p[1].n_blocks; }
int ex_kv_n_free_swa(const ex_kv *kv) { return kv->p[1].n_free; }
int ex_kv_window(const ex_kv *kv) { return kv->window; }

/* ---- the prefix cache's index and LRU ---- */

static void lru_remove(cache *c, int32_t b) {
    bmeta *m = &c->m[b];
    if (m->prev >= 0) c->m[m->prev].next = m->next;
    else c->lru_head = m->next;
    if (m->next >= 0) c->m[m->next].prev = m->prev;
    else c->lru_tail = m->prev;
    m->prev = m->next = -1;
    c->n_lru--;
}

static void lru_push(cache *c, int32_t b) {
    bmeta *m = &c->m[b];
    m->prev = c->lru_tail;
    m->next = -1;
    if (c->lru_tail >= 0) c->m[c->lru_tail].next = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_lru++;
}

/* The cached block of key (h, parent, pgen, toks), or -1. */
static int32_t index_find(const ex_kv *kv, uint64_t h, int32_t parent, uint32_t pgen, const int32_t *toks) {
    const cache *c = &kv->c;
    size_t bs = (size_t)kv->block_size;
    for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
        int32_t b = c->slot[i];
        if (b < 0) return -1;
        const bmeta *m = &c->m[b];
        if (m->hash == h && m->parent == parent && m->pgen == pgen && !memcmp(c->toks + (size_t)b * bs, toks, bs * sizeof *toks))
            return b;
    }
}

static void index_insert(cache *c, int32_t b) {
    uint32_t i = (uint32_t)c->m[b].hash & c->mask;
    while (c->slot[i] >= 0) i = (i + 1) & c->mask;
    c->slot[i] = b;
}

/* Removes b from the index (backward-shift deletion keeps every probe run unbroken). */
static void index_remove(cache *c, int32_t b) {
    uint32_t i = (uint32_t)c->m[b].hash & c->mask;
    while (c->slot[i] != b) i = (i + 1) & c->mask;
    for (uint32_t j = i;;) {
        j = (j + 1) & c->mask;
        int32_t x = c->slot[j];
        if (x < 0) break;
        uint32_t home = (uint32_t)c->m[x].hash & c->mask;
        /* x may move to the hole at i unless its home lies cyclically in (i, j] */
        if ((j > i) ? (home <= i || home > j) : (home <= i && home > j)) {
            c->slot[i] = x;
            i = j;
        }
    }
    c->slot[i] = -1;
}

/* b leaves the cache (not in the LRU): its key goes, and with the new generation so do its
 * children's. */
static void uncache(cache *c, int32_t b) {
    index_remove(c, b);
    c->m[b].cached = c->m[b].computed = 0;
    c->m[b].gen++;
}

static int32_t pool_alloc(pool *p) {
    int32_t b = p->free_list[--p->n_free];
    assert(p->refs[b] == 0);
    p->refs[b] = 1;
    return b;
}

static void pool_unref(pool *p, int32_t block) {
    assert(block >= 0 && block < p->n_blocks && p->refs[block] > 0);
    if (--p->refs[block] == 0) {
        assert(p->n_free < p->n_blocks);
        p->free_list[p->n_free++] = block;
    }
}

/* A block of the full-attention pool: a free one, else the least recently released cached
 * one (evicted). The caller checked avail0() > 0. */
static int32_t alloc0(ex_kv *kv) {
    pool *p = &kv->p[0];
    if (p->n_free > 0) return pool_alloc(p);
    cache *c = &kv->c;
    int32_t b = c->lru_head;
    assert(b >= 0 && p->refs[b] == 0);
    lru_remove(c, b);
    uncache(c, b);
    p->refs[b] = 1;
    return b;
}

/* Drops a holder of a full-attention block: at zero a computed cached block waits in the
 * LRU, any other goes back to the free list (a pending one leaves the cache). */
static void unref0(ex_kv *kv, int32_t b) {
    pool *p = &kv->p[0];
    assert(b >= 0 && b < p->n_blocks && p->refs[b] > 0);
    if (p->refs[b] > 1 || !kv->c.on || !kv->c.m[b].cached) {
        pool_unref(p, b);
        return;
    }
    p->refs[b] = 0;
    if (kv->c.m[b].computed) {
        lru_push(&kv->c, b);
        return;
    }
    uncache(&kv->c, b);
    p->free_list[p->n_free++] = b;
}

int ex_kv_block_alloc(ex_kv *kv, int32_t *block) {
    if (avail0(kv) == 0) return CM_ENOKV;
    *block = alloc0(kv);
    return 0;
}

void ex_kv_block_ref(ex_kv *kv, int32_t block) {
    assert(block >= 0 && block < kv->p[0].n_blocks);
    if (kv->p[0].refs[block] == 0) { /* a cached block nobody holds: out of the LRU */
        assert(kv->c.on && kv->c.m[block].cached && kv->c.m[block].computed);
        lru_remove(&kv->c, block);
    }
    kv->p[0].refs[block]++;
}

void ex_kv_block_unref(ex_kv *kv, int32_t block) { unref0(kv, block); }

int ex_kv_block_refcount(const ex_kv *kv, int32_t block) {
    if (block < 0 || block >= kv->p[0].n_blocks) return -1;
    return kv->p[0].refs[block];
}

int ex_kv_table_init(ex_kv_table *t, int cap) {
    memset(t, 0, sizeof *t);
    if (cap <= 0) return CM_EINVAL;
    t->blocks = malloc(sizeof(int32_t) * (size_t)cap);
    t->blocks_swa = malloc(sizeof(int32_t) * (size_t)cap);
    if (!t->blocks || !t->blocks_swa) {
        free(t->blocks);
        free(t->blocks_swa);
        memset(t, 0, sizeof *t);
        return CM_ENOMEM;
    }
    t->cap = cap;
    return 0;
}

void ex_kv_table_free(ex_kv_table *t) {
    assert(t->n == 0);
    free(t->blocks);
    free(t->blocks_swa);
    memset(t, 0, sizeof *t);
}

int ex_kv_table_need(const ex_kv *kv, const ex_kv_table *t, int n_pos) {
    int want = (n_pos + kv->block_size - 1) / kv->block_size;
    return want > t->n ? want - t->n : 0;
}

int ex_kv_table_reserve(ex_kv *kv, ex_kv_table *t, int n_pos) {
    if (n_pos < 0) return CM_EINVAL;
    int want = (n_pos + kv->block_size - 1) / kv->block_size;
    if (want > t->cap) return CM_ECTX;
    if (want <= t->n) return 0;
    if (want - t->n > avail0(kv) || (has_swa(kv) && want - t->n > kv->p[1].n_free)) return CM_ENOKV;
    for (; t->n < want; t->n++) {
        t->blocks[t->n] = alloc0(kv);
        t->blocks_swa[t->n] = has_swa(kv) ? pool_alloc(&kv->p[1]) : -1;
    }
    return 0;
}

void ex_kv_table_release(ex_kv *kv, ex_kv_table *t) {
    /* last block first: a sequence's deepest blocks are the first the LRU evicts */
    for (int j = t->n - 1; j >= 0; j--) {
        unref0(kv, t->blocks[j]);
        if (has_swa(kv) && j >= t->swa_lo) pool_unref(&kv->p[1], t->blocks_swa[j]);
    }
    t->n = 0;
    t->swa_lo = 0;
    t->n_reg = t->n_done = t->reg_off = 0;
}

void ex_kv_table_slide(ex_kv *kv, ex_kv_table *t, int n_cached) {
    if (!has_swa(kv)) return;
    int first = n_cached - kv->window + 1; /* the next query (at n_cached) reads [first, n_cached] */
    int lo = first > 0 ? first / kv->block_size : 0;
    if (lo > t->n) lo = t->n;
    for (; t->swa_lo < lo; t->swa_lo++) {
        pool_unref(&kv->p[1], t->blocks_swa[t->swa_lo]);
        t->blocks_swa[t->swa_lo] = -1;
    }
}

int ex_kv_table_share(ex_kv *kv, const ex_kv_table *src, int n, ex_kv_table *dst) {
    if (dst->n != 0 || n < 0 || n > src->n) return CM_EINVAL;
    if (n > dst->cap) return CM_ECTX;
    for (int j = 0; j < n; j++) {
        ex_kv_block_ref(kv, src->blocks[j]);
        dst->blocks[j] = src->blocks[j];
        dst->blocks_swa[j] = -1;
        if (has_swa(kv) && j >= src->swa_lo) {
            kv->p[1].refs[src->blocks_swa[j]]++;
            dst->blocks_swa[j] = src->blocks_swa[j];
        }
    }
    dst->n = n;
    dst->swa_lo = src->swa_lo < n ? src->swa_lo : n;
    dst->n_reg = src->n_reg < n ? src->n_reg : n;
    dst->n_done = src->n_done < n ? src->n_done : n;
    dst->reg_off = n > src->n_reg ? src->reg_off : 0;
    return 0;
}

/* ---- prefix cache -------------------------------------------------------------------- */

int ex_kv_prefix_enable(ex_kv *kv, uint64_t root) {
    cache *c = &kv->c;
    if (has_swa(kv)) return CM_EUNSUPPORTED;
    if (c->on) return 0;
    int n = kv->p[0].n_blocks;
    if (kv->p[0].n_free != n) return CM_ESTATE;
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap <<= 1;
    c->m = calloc((size_t)n, sizeof *c->m);
    c->toks = malloc(sizeof *c->toks * (size_t)n * (size_t)kv->block_size);
    c->slot = malloc(sizeof *c->slot * cap);
    if (!c->m || !c->toks || !c->slot) {
        free(c->m); free(c->toks); free(c->slot);
        memset(c, 0, sizeof *c);
        return CM_ENOMEM;
    }
    memset(c->slot, 0xff, sizeof *c->slot * cap);
    for (int b = 0; b < n; b++) c->m[b].prev = c->m[b].next = -1;
    c->mask = cap - 1;
    c->lru_head = c->lru_tail = -1;
    c->root = root;
    c->on = 1;
    return 0;
}

int ex_kv_prefix_enabled(const ex_kv *kv) { return kv->c.on; }
uint64_t ex_kv_prefix_root(const ex_kv *kv) { return kv->c.root; }

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser: every input bit reaches every output bit */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t ex_kv_block_hash(uint64_t parent, const int32_t *toks, int block_size) {
    uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < block_size; i++) h = mix64(h ^ ((uint64_t)(uint32_t)toks[i] * 0x9e3779b97f4a7c15ull));
    return h;
}

int ex_kv_prefix_match(const ex_kv *kv, const uint64_t *h, const int32_t *toks, int n, int32_t *ids, int32_t *pending,
                       uint32_t *pending_gen) {
    const cache *c = &kv->c;
    if (pending) *pending = -1;
    if (!c->on) return 0;
    int32_t parent = -1;
    uint32_t pgen = 0;
    int j = 0;
    for (; j < n; j++) {
        int32_t b = index_find(kv, h[j], parent, pgen, toks + (size_t)j * kv->block_size);
        if (b < 0) break;
        if (!c->m[b].computed) {
            if (pending) *pending = b;
            if (pending_gen) *pending_gen = c->m[b].gen;
            break;
        }
        ids[j] = b;
        parent = b;
        pgen = c->m[b].gen;
    }
    return j;
}

int ex_kv_prefix_pending(const ex_kv *kv, int32_t id, uint32_t gen) {
    const cache *c = &kv->c;
    return c->on && id >= 0 && id < kv->p[0].n_blocks && c->m[id].gen == gen && c->m[id].cached && !c->m[id].computed;
}

int ex_kv_prefix_idle(const ex_kv *kv, const int32_t *ids, int n) {
    int k = 0;
    for (int j = 0; j < n; j++) k += kv->p[0].refs[ids[j]] == 0;
    return k;
}

int ex_kv_table_adopt(ex_kv *kv, ex_kv_table *t, int n) {
    cache *c = &kv->c;
    if (t->n != 0 || n < 0 || n > t->cap || (n && !c->on)) return CM_EINVAL;
    for (int j = 0; j < n; j++) {
        int32_t b = t->blocks[j];
        if (b < 0 || b >= kv->p[0].n_blocks || !c->m[b].cached || !c->m[b].computed) return CM_EINVAL;
    }
    for (int j = 0; j < n; j++) {
        int32_t b = t->blocks[j];
        if (kv->p[0].refs[b]++ == 0) lru_remove(c, b);
        t->blocks_swa[j] = -1;
    }
    t->n = t->n_reg = t->n_done = n;
    t->reg_off = 0;
    return 0;
}

void ex_kv_table_register(ex_kv *kv, ex_kv_table *t, const uint64_t *h, const int32_t *toks, int n_full) {
    cache *c = &kv->c;
    if (!c->on) return;
    int bs = kv->block_size, end = n_full < t->n ? n_full : t->n;
    for (int j = t->n_reg; j < end && !t->reg_off; j++) {
        int32_t b = t->blocks[j];
        bmeta *m = &c->m[b];
        if (m->cached) { /* a block is cached under one key only: this table's is that key's */
            t->n_reg++;
            continue;
        }
        int32_t parent = j ? t->blocks[j - 1] : -1;
        uint32_t pgen = j ? c->m[parent].gen : 0;
        const int32_t *tk = toks + (size_t)j * bs;
        if (index_find(kv, h[j], parent, pgen, tk) >= 0) { /* computed twice: keep the cached copy */
            t->reg_off = 1;
            break;
        }
        m->hash = h[j];
        m->parent = parent;
        m->pgen = pgen;
        m->cached = 1;
        m->computed = j < t->n_done;
        memcpy(c->toks + (size_t)b * bs, tk, sizeof *tk * (size_t)bs);
        index_insert(c, b);
        t->n_reg++;
    }
}

void ex_kv_table_computed(ex_kv *kv, ex_kv_table *t, int n_cached) {
    int nd = n_cached / kv->block_size;
    if (nd > t->n) nd = t->n;
    for (int j = t->n_done; j < nd; j++)
        if (j < t->n_reg) kv->c.m[t->blocks[j]].computed = 1;
    if (nd > t->n_done) t->n_done = nd;
}

int ex_kv_check(const ex_kv *kv, char *err, size_t errlen) {
    const pool *p = &kv->p[0];
    const cache *c = &kv->c;
    int n = p->n_blocks, rc = 0;
    uint8_t *seen = calloc((size_t)n, 1);
    if (!seen) {
        snprintf(err, errlen, "out of memory");
        return CM_ENOMEM;
    }
    for (int i = 0; i < p->n_free && !rc; i++) {
        int32_t b = p->free_list[i];
        if (b < 0 || b >= n || seen[b]++) { snprintf(err, errlen, "free list: block %d twice or outside", b); rc = CM_ESTATE; }
        else if (p->refs[b]) { snprintf(err, errlen, "free block %d has %d holders", b, p->refs[b]); rc = CM_ESTATE; }
        else if (c->on && c->m[b].cached) { snprintf(err, errlen, "free block %d is cached", b); rc = CM_ESTATE; }
    }
    int n_lru = 0;
    for (int32_t b = c->on ? c->lru_head : -1, prev = -1; b >= 0 && !rc; prev = b, b = c->m[b].next) {
        if (b >= n || seen[b]++ || c->m[b].prev != prev || ++n_lru > n) {
            snprintf(err, errlen, "LRU: block %d twice, outside or mislinked", b);
            rc = CM_ESTATE;
        } else if (p->refs[b] || !c->m[b].cached || !c->m[b].computed) {
            snprintf(err, errlen, "LRU block %d: %d holders, cached %d, computed %d", b, p->refs[b], c->m[b].cached, c->m[b].computed);
            rc = CM_ESTATE;
        }
    }
    if (!rc && n_lru != c->n_lru) { snprintf(err, errlen, "LRU holds %d blocks, counted %d", n_lru, c->n_lru); rc = CM_ESTATE; }
    for (int b = 0; b < n && !rc; b++) {
        if (!seen[b] && p->refs[b] <= 0) { snprintf(err, errlen, "block %d lost: not free, not cached, no holder", b); rc = CM_ESTATE; }
        else if (c->on && c->m[b].cached) {
            const bmeta *m = &c->m[b];
            if (index_find(kv, m->hash, m->parent, m->pgen, c->toks + (size_t)b * kv->block_size) != b) {
                snprintf(err, errlen, "cached block %d not found under its key", b);
                rc = CM_ESTATE;
            }
        }
    }
    for (uint32_t i = 0; c->on && i <= c->mask && !rc; i++)
        if (c->slot[i] >= 0 && (c->slot[i] >= n || !c->m[c->slot[i]].cached)) {
            snprintf(err, errlen, "index slot %u holds block %d, not cached", i, c->slot[i]);
            rc = CM_ESTATE;
        }
    free(seen);
    return rc;
}
