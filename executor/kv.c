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

struct ex_kv {
    int  block_size;
    int  window;        /* sliding pool: positions a query sees; 0 without one */
    pool p[2];          /* [0] full-attention layers, [1] sliding-window layers (n_blocks 0: none) */
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
    free(kv);
}

static int has_swa(const ex_kv *kv) { return kv->p[1].n_blocks > 0; }

int ex_kv_n_blocks(const ex_kv *kv) {
    return has_swa(kv) && kv->p[1].n_blocks < kv->p[0].n_blocks ? kv->p[1].n_blocks : kv->p[0].n_blocks;
}
int ex_kv_n_free(const ex_kv *kv) { return has_swa(kv) && kv->p[1].n_free < kv->p[0].n_free ? kv->p[1].n_free : kv->p[0].n_free; }
int ex_kv_n_blocks_swa(const ex_kv *kv) { return kv->p[1].n_blocks; }
int ex_kv_n_free_swa(const ex_kv *kv) { return kv->p[1].n_free; }
int ex_kv_window(const ex_kv *kv) { return kv->window; }

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

int ex_kv_block_alloc(ex_kv *kv, int32_t *block) {
    if (kv->p[0].n_free == 0) return CM_ENOKV;
    *block = pool_alloc(&kv->p[0]);
    return 0;
}

void ex_kv_block_ref(ex_kv *kv, int32_t block) {
    assert(block >= 0 && block < kv->p[0].n_blocks && kv->p[0].refs[block] > 0);
    kv->p[0].refs[block]++;
}

void ex_kv_block_unref(ex_kv *kv, int32_t block) { pool_unref(&kv->p[0], block); }

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
    if (want - t->n > kv->p[0].n_free || (has_swa(kv) && want - t->n > kv->p[1].n_free)) return CM_ENOKV;
    for (; t->n < want; t->n++) {
        t->blocks[t->n] = pool_alloc(&kv->p[0]);
        t->blocks_swa[t->n] = has_swa(kv) ? pool_alloc(&kv->p[1]) : -1;
    }
    return 0;
}

void ex_kv_table_release(ex_kv *kv, ex_kv_table *t) {
    for (int j = t->n - 1; j >= 0; j--) {
        pool_unref(&kv->p[0], t->blocks[j]);
        if (has_swa(kv) && j >= t->swa_lo) pool_unref(&kv->p[1], t->blocks_swa[j]);
    }
    t->n = 0;
    t->swa_lo = 0;
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
    return 0;
}
