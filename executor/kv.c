/* kv: block allocator with reference counts and per-sequence block tables. */
#include "kv.h"
#include "../common/cm_err.h"
#include "../model/dtype.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ex_kv {
    int      n_blocks;
    int      block_size;
    int      n_free;
    int32_t *free_list; /* [n_blocks] stack of free ids; the top is free_list[n_free-1] */
    int32_t *refs;      /* [n_blocks] holders per block */
};

size_t ex_kv_block_bytes(const mdl_config *c, int block_size, int kv_type) {
    size_t el = kv_type == DT_F32 ? 4 : (kv_type == DT_F16 || kv_type == DT_BF16) ? 2 : 0;
    return 2 * (size_t)c->n_layer * (size_t)block_size * (size_t)c->n_head_kv * (size_t)c->head_dim * el;
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

int ex_kv_create(int n_blocks, int block_size, ex_kv **out) {
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0) return CM_EINVAL;
    ex_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return CM_ENOMEM;
    kv->free_list = malloc(sizeof(int32_t) * (size_t)n_blocks);
    kv->refs = calloc((size_t)n_blocks, sizeof(int32_t));
    if (!kv->free_list || !kv->refs) { ex_kv_destroy(kv); return CM_ENOMEM; }
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    /* Lowest ids on top so a fresh pool hands out 0, 1, 2, ... (easier to read in tests). */
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    *out = kv;
    return 0;
}

void ex_kv_destroy(ex_kv *kv) {
    if (!kv) return;
    free(kv->free_list);
    free(kv->refs);
    free(kv);
}

int ex_kv_n_blocks(const ex_kv *kv) { return kv->n_blocks; }
int ex_kv_n_free(const ex_kv *kv) { return kv->n_free; }
int ex_kv_block_size(const ex_kv *kv) { return kv->block_size; }

int ex_kv_block_alloc(ex_kv *kv, int32_t *block) {
    if (kv->n_free == 0) return CM_ENOKV;
    int32_t b = kv->free_list[--kv->n_free];
    assert(kv->refs[b] == 0);
    kv->refs[b] = 1;
    *block = b;
    return 0;
}

void ex_kv_block_ref(ex_kv *kv, int32_t block) {
    assert(block >= 0 && block < kv->n_blocks && kv->refs[block] > 0);
    kv->refs[block]++;
}

void ex_kv_block_unref(ex_kv *kv, int32_t block) {
    assert(block >= 0 && block < kv->n_blocks && kv->refs[block] > 0);
    if (--kv->refs[block] == 0) {
        assert(kv->n_free < kv->n_blocks);
        kv->free_list[kv->n_free++] = block;
    }
}

int ex_kv_block_refcount(const ex_kv *kv, int32_t block) {
    if (block < 0 || block >= kv->n_blocks) return -1;
    return kv->refs[block];
}

int ex_kv_table_init(ex_kv_table *t, int cap) {
    memset(t, 0, sizeof *t);
    if (cap <= 0) return CM_EINVAL;
    t->blocks = malloc(sizeof(int32_t) * (size_t)cap);
    if (!t->blocks) return CM_ENOMEM;
    t->cap = cap;
    return 0;
}

void ex_kv_table_free(ex_kv_table *t) {
    assert(t->n == 0);
    free(t->blocks);
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
    if (want - t->n > kv->n_free) return CM_ENOKV;
    while (t->n < want) {
        int rc = ex_kv_block_alloc(kv, &t->blocks[t->n]);
        assert(rc == 0);
        (void)rc;
        t->n++;
    }
    return 0;
}

void ex_kv_table_release(ex_kv *kv, ex_kv_table *t) {
    for (int j = t->n - 1; j >= 0; j--) ex_kv_block_unref(kv, t->blocks[j]);
    t->n = 0;
}

int ex_kv_table_share(ex_kv *kv, const ex_kv_table *src, int n, ex_kv_table *dst) {
    if (dst->n != 0 || n < 0 || n > src->n) return CM_EINVAL;
    if (n > dst->cap) return CM_ECTX;
    for (int j = 0; j < n; j++) {
        ex_kv_block_ref(kv, src->blocks[j]);
        dst->blocks[j] = src->blocks[j];
    }
    dst->n = n;
    return 0;
}
