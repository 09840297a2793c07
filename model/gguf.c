/* gguf: GGUF v2/v3 reader with every length checked against the file before use. */
#include "gguf.h"
#include "dtype.h"
#include "../common/cm_err.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_NESTING 8
#define MAX_KEY_LEN 65535

struct gguf_ctx {
    const uint8_t *base;
    uint64_t       size;
    int            mapped;
    char          *path;
    uint32_t       version;
    uint64_t       alignment;
    uint64_t       data_offset;
    int64_t        n_kv;
    gguf_kv       *kv;
    int64_t        n_tensors;
    gguf_tensor   *tensors;
    /* every array of strings / nested values allocated while parsing, freed at close */
    void         **allocs;
    size_t         n_allocs, cap_allocs;
};

typedef struct {
    gguf_ctx      *g;
    uint64_t       pos;
    char          *err;
    size_t         errlen;
} rd;

static int fail(rd *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(rd *r, int code, const char *fmt, ...) {
    int n = snprintf(r->err, r->errlen, "%s: ", r->g->path ? r->g->path : "<memory>");
    if (n < 0 || (size_t)n >= r->errlen) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t left(const rd *r) { return r->g->size - r->pos; }

static int need(rd *r, uint64_t n, const char *what) {
    if (n > left(r)) return fail(r, CM_EFORMAT, "truncated file: %s at offset %llu needs %llu bytes, %llu left", what,
                                 (unsigned long long)r->pos, (unsigned long long)n, (unsigned long long)left(r));
    return 0;
}

static int rd_bytes(rd *r, void *dst, uint64_t n, const char *what) {
    int rc = need(r, n, what);
    if (rc) return rc;
    memcpy(dst, r->g->base + r->pos, n);
    r->pos += n;
    return 0;
}

static int rd_u32(rd *r, uint32_t *v, const char *what) { return rd_bytes(r, v, 4, what); }
static int rd_u64(rd *r, uint64_t *v, const char *what) { return rd_bytes(r, v, 8, what); }

static int track(gguf_ctx *g, void *p) {
    if (g->n_allocs == g->cap_allocs) {
        size_t nc = g->cap_allocs ? g->cap_allocs * 2 : 16;
        void **na = realloc(g->allocs, nc * sizeof *na);
        if (!na) return CM_ENOMEM;
        g->allocs = na;
        g->cap_allocs = nc;
    }
    g->allocs[g->n_allocs++] = p;
    return 0;
}

static int rd_str(rd *r, gguf_str *s, const char *what) {
    uint64_t len;
    int rc = rd_u64(r, &len, what);
    if (rc) return rc;
    if (len > left(r))
        return fail(r, CM_EFORMAT, "%s: string length %llu at offset %llu runs past the end of the file", what,
                    (unsigned long long)len, (unsigned long long)(r->pos - 8));
    s->ptr = (const char *)r->g->base + r->pos;
    s->len = len;
    r->pos += len;
    return 0;
}

size_t gguf_vtype_size(int type) {
    switch (type) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gguf_vtype_name(int type) {
    static const char *const names[] = { "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                         "str", "arr", "u64", "i64", "f64" };
    return type >= 0 && type < GGUF_VTYPE_COUNT ? names[type] : "?";
}

/* Decodes one scalar of a numeric vtype at p (unaligned, little-endian host assumed). */
static void scalar_at(int type, const uint8_t *p, gguf_value *v) {
    v->type = type;
    switch (type) {
    case GGUF_UINT8: v->v.u = p[0]; break;
    case GGUF_BOOL: v->v.u = p[0] != 0; break;
    case GGUF_INT8: v->v.i = (int8_t)p[0]; break;
    case GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); v->v.u = x; break; }
    case GGUF_INT16: { int16_t x; memcpy(&x, p, 2); v->v.i = x; break; }
    case GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); v->v.u = x; break; }
    case GGUF_INT32: { int32_t x; memcpy(&x, p, 4); v->v.i = x; break; }
    case GGUF_FLOAT32: { float x; memcpy(&x, p, 4); v->v.f = x; break; }
    case GGUF_UINT64: { uint64_t x; memcpy(&x, p, 8); v->v.u = x; break; }
    case GGUF_INT64: { int64_t x; memcpy(&x, p, 8); v->v.i = x; break; }
    case GGUF_FLOAT64: { double x; memcpy(&x, p, 8); v->v.f = x; break; }
    }
}

static int rd_value(rd *r, int type, gguf_value *v, int depth, const char *key);

static int rd_array(rd *r, gguf_value *v, int depth, const char *key) {
    uint32_t et;
    uint64_t n;
    int rc;
    if (depth >= MAX_NESTING) return fail(r, CM_EFORMAT, "key '%s': arrays nested deeper than %d", key, MAX_NESTING);
    if ((rc = rd_u32(r, &et, "array type")) || (rc = rd_u64(r, &n, "array length"))) return rc;
    if (et >= GGUF_VTYPE_COUNT)
        return fail(r, CM_EFORMAT, "key '%s': unknown array element type %u", key, et);
    v->type = GGUF_ARRAY;
    v->v.arr.elem_type = (int)et;
    v->v.arr.n = n;
    v->v.arr.raw = NULL;
    v->v.arr.strs = NULL;
    v->v.arr.items = NULL;
    size_t es = gguf_vtype_size((int)et);
    if (es) {
        if (n > left(r) / es)
            return fail(r, CM_EFORMAT, "key '%s': array of %llu elements runs past the end of the file", key,
                        (unsigned long long)n);
        v->v.arr.raw = r->g->base + r->pos;
        r->pos += n * es;
        return 0;
    }
    /* Each string takes at least 8 bytes and each nested array 12, so n is bounded by the file. */
    uint64_t min = et == GGUF_STRING ? 8 : 12;
    if (n > left(r) / min)
        return fail(r, CM_EFORMAT, "key '%s': array of %llu elements runs past the end of the file", key,
                    (unsigned long long)n);
    if (n == 0) return 0;
    if (et == GGUF_STRING) {
        gguf_str *s = malloc(n * sizeof *s);
        if (!s || track(r->g, s)) { free(s); return fail(r, CM_ENOMEM, "out of memory"); }
        v->v.arr.strs = s;
        for (uint64_t i = 0; i < n; i++)
            if ((rc = rd_str(r, &s[i], key))) return rc;
        return 0;
    }
    gguf_value *items = calloc(n, sizeof *items);
    if (!items || track(r->g, items)) { free(items); return fail(r, CM_ENOMEM, "out of memory"); }
    v->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++)
        if ((rc = rd_value(r, (int)et, &items[i], depth + 1, key))) return rc;
    return 0;
}

static int rd_value(rd *r, int type, gguf_value *v, int depth, const char *key) {
    if (type == GGUF_STRING) {
        v->type = GGUF_STRING;
        return rd_str(r, &v->v.s, key);
    }
    if (type == GGUF_ARRAY) return rd_array(r, v, depth, key);
    size_t es = gguf_vtype_size(type);
    if (!es) return fail(r, CM_EFORMAT, "key '%s': unknown value type %d", key, type);
    int rc = need(r, es, key);
    if (rc) return rc;
    scalar_at(type, r->g->base + r->pos, v);
    r->pos += es;
    return 0;
}

static int str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

static int cmp_strp(const void *a, const void *b) {
    const gguf_str *x = *(const gguf_str *const *)a, *y = *(const gguf_str *const *)b;
    int c = memcmp(x->ptr, y->ptr, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Finds a name that occurs twice among n strings at base + i*stride (sorting pointers, so a
 * hostile file with many entries costs n log n, not n^2). Sets *dup to it or NULL. */
static int find_dup(const void *base, size_t stride, int64_t n, const gguf_str **dup) {
    *dup = NULL;
    if (n < 2) return 0;
    const gguf_str **p = malloc((size_t)n * sizeof *p);
    if (!p) return CM_ENOMEM;
    for (int64_t i = 0; i < n; i++) p[i] = (const gguf_str *)((const uint8_t *)base + (size_t)i * stride);
    qsort(p, (size_t)n, sizeof *p, cmp_strp);
    for (int64_t i = 1; i < n && !*dup; i++)
        if (!cmp_strp(&p[i - 1], &p[i])) *dup = p[i];
    free(p);
    return 0;
}

static int parse(gguf_ctx *g, char *err, size_t errlen) {
    rd r = { .g = g, .pos = 0, .err = err, .errlen = errlen };
    uint32_t magic;
    int rc;
    if (g->size < 4 || (memcpy(&magic, g->base, 4), magic != GGUF_MAGIC)) {
        if (g->size >= 4 && memcmp(g->base, "FUGG", 4) == 0)
            return fail(&r, CM_EUNSUPPORTED, "big-endian GGUF is not supported");
        return fail(&r, CM_EFORMAT, "not a GGUF file (bad magic)");
    }
    r.pos = 4;
    if ((rc = rd_u32(&r, &g->version, "version"))) return rc;
    if (g->version == 1) return fail(&r, CM_EUNSUPPORTED, "GGUF version 1 is not supported (convert to v3)");
    if (g->version != 2 && g->version != 3) {
        uint32_t sw = __builtin_bswap32(g->version);
        if (sw == 2 || sw == 3) return fail(&r, CM_EUNSUPPORTED, "big-endian GGUF is not supported");
        return fail(&r, CM_EUNSUPPORTED, "unknown GGUF version %u", g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(&r, &n_tensors, "tensor count")) || (rc = rd_u64(&r, &n_kv, "metadata count"))) return rc;
    /* A key-value takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8+4+8+4+8. */
    if (n_kv > left(&r) / 13) return fail(&r, CM_EFORMAT, "metadata count %llu is larger than the file can hold", (unsigned long long)n_kv);
    if (n_tensors > left(&r) / 32) return fail(&r, CM_EFORMAT, "tensor count %llu is larger than the file can hold", (unsigned long long)n_tensors);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return fail(&r, CM_ENOMEM, "out of memory");

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        uint32_t type;
        if ((rc = rd_str(&r, &kv->key, "metadata key"))) return rc;
        if (kv->key.len == 0 || kv->key.len > MAX_KEY_LEN)
            return fail(&r, CM_EFORMAT, "metadata key %llu has invalid length %llu", (unsigned long long)i, (unsigned long long)kv->key.len);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 120 ? kv->key.len : 120), kv->key.ptr);
        if ((rc = rd_u32(&r, &type, key))) return rc;
        if (type >= GGUF_VTYPE_COUNT) return fail(&r, CM_EFORMAT, "key '%s': unknown value type %u", key, type);
        if ((rc = rd_value(&r, (int)type, &kv->val, 0, key))) return rc;
        g->n_kv = (int64_t)i + 1;
        if (str_eq(kv->key, "general.alignment")) {
            if (kv->val.type != GGUF_UINT32) return fail(&r, CM_EFORMAT, "general.alignment must be u32");
            uint64_t a = kv->val.v.u;
            if (a == 0 || (a & (a - 1)) || a > 65536)
                return fail(&r, CM_EFORMAT, "general.alignment %llu is not a power of two up to 65536", (unsigned long long)a);
            g->alignment = a;
        }
    }

    const gguf_str *dup;
    if (find_dup(&g->kv[0].key, sizeof *g->kv, g->n_kv, &dup)) return fail(&r, CM_ENOMEM, "out of memory");
    if (dup) return fail(&r, CM_EFORMAT, "duplicate metadata key '%.*s'", (int)(dup->len < 120 ? dup->len : 120), dup->ptr);

    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint32_t type;
        if ((rc = rd_str(&r, &t->name, "tensor name"))) return rc;
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)(t->name.len < 90 ? t->name.len : 90), t->name.ptr);
        if ((rc = rd_u32(&r, &t->n_dims, name))) return rc;
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
            return fail(&r, CM_EFORMAT, "tensor '%s': %u dimensions (1..%d allowed)", name, t->n_dims, GGUF_MAX_DIMS);
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            if ((rc = rd_u64(&r, &ne, name))) return rc;
            if (ne == 0 || ne > (1ull << 40) || nel > (1ull << 42) / ne)
                return fail(&r, CM_EFORMAT, "tensor '%s': absurd dimension %llu", name, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
            nel *= ne;
        }
        if ((rc = rd_u32(&r, &type, name)) || (rc = rd_u64(&r, &t->offset, name))) return rc;
        t->type = (int)type;
        if (type >= DT_GGUF_COUNT || !dt_block_size(t->type))
            return fail(&r, CM_EUNSUPPORTED, "tensor '%s': unknown tensor type %u (GGUF defines no FP8 type; FP8 weights come "
                        "from safetensors checkpoints or --quantize fp8)", name, type);
        if (t->ne[0] % dt_block_size(t->type))
            return fail(&r, CM_EFORMAT, "tensor '%s': row of %lld elements is not a multiple of the %s block size %d", name,
                        (long long)t->ne[0], dt_name(t->type), dt_block_size(t->type));
        t->nbytes = dt_row_size(t->type, t->ne[0]) * (nel / (uint64_t)t->ne[0]);
        g->n_tensors = (int64_t)i + 1;
    }

    uint64_t a = g->alignment;
    g->data_offset = (r.pos + a - 1) / a * a;
    if (n_tensors && g->data_offset > g->size)
        return fail(&r, CM_EFORMAT, "truncated file: tensor data section at %llu is past the end (%llu bytes)",
                    (unsigned long long)g->data_offset, (unsigned long long)g->size);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t room = g->size - g->data_offset;
        if (t->offset % a)
            return fail(&r, CM_EFORMAT, "tensor '%.*s': offset %llu is not aligned to %llu", (int)t->name.len, t->name.ptr,
                        (unsigned long long)t->offset, (unsigned long long)a);
        if (t->offset > room || t->nbytes > room - t->offset)
            return fail(&r, CM_EFORMAT, "truncated file: tensor '%.*s' (%llu bytes at data offset %llu) runs past the end of the file",
                        (int)t->name.len, t->name.ptr, (unsigned long long)t->nbytes, (unsigned long long)t->offset);
        t->data = g->base + g->data_offset + t->offset;
    }
    if (find_dup(&g->tensors[0].name, sizeof *g->tensors, g->n_tensors, &dup)) return fail(&r, CM_ENOMEM, "out of memory");
    if (dup) return fail(&r, CM_EFORMAT, "duplicate tensor name '%.*s'", (int)(dup->len < 120 ? dup->len : 120), dup->ptr);
    return 0;
}

static int open_common(gguf_ctx *g, gguf_ctx **out, char *err, size_t errlen) {
    int rc = parse(g, err, errlen);
    if (rc) {
        gguf_close(g);
        *out = NULL;
        return rc;
    }
    *out = g;
    return 0;
}

int gguf_open_mem(const void *data, size_t size, gguf_ctx **out, char *err, size_t errlen) {
    gguf_ctx *g = calloc(1, sizeof *g);
    if (!g) return CM_ENOMEM;
    g->base = data;
    g->size = size;
    return open_common(g, out, err, errlen);
}

int gguf_open(const char *path, gguf_ctx **out, char *err, size_t errlen) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT ? CM_ENOENT : CM_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return CM_EIO;
    }
    gguf_ctx *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        close(fd);
        snprintf(err, errlen, "%s: out of memory", path);
        return CM_ENOMEM;
    }
    g->size = (uint64_t)st.st_size;
    if (g->size == 0) {
        close(fd);
        snprintf(err, errlen, "%s: empty file", path);
        gguf_close(g);
        return CM_EFORMAT;
    }
    void *p = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        gguf_close(g);
        return CM_EIO;
    }
    g->base = p;
    g->mapped = 1;
    return open_common(g, out, err, errlen);
}

void gguf_close(gguf_ctx *g) {
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, g->size);
    for (size_t i = 0; i < g->n_allocs; i++) free(g->allocs[i]);
    free(g->allocs);
    free(g->kv);
    free(g->tensors);
    free(g->path);
    free(g);
}

uint32_t gguf_version(const gguf_ctx *g) { return g->version; }
uint64_t gguf_alignment(const gguf_ctx *g) { return g->alignment; }
uint64_t gguf_data_offset(const gguf_ctx *g) { return g->data_offset; }
const char *gguf_path(const gguf_ctx *g) { return g->path ? g->path : "<memory>"; }
uint64_t gguf_file_size(const gguf_ctx *g) { return g->size; }
int64_t gguf_n_kv(const gguf_ctx *g) { return g->n_kv; }
const gguf_kv *gguf_kv_at(const gguf_ctx *g, int64_t i) { return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL; }
int64_t gguf_n_tensors(const gguf_ctx *g) { return g->n_tensors; }
const gguf_tensor *gguf_tensor_at(const gguf_ctx *g, int64_t i) { return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL; }

const gguf_value *gguf_find(const gguf_ctx *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key)) return &g->kv[i].val;
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int is_uint(int t) { return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64 || t == GGUF_BOOL; }
static int is_sint(int t) { return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64; }

int gguf_get_i64(const gguf_ctx *g, const char *key, int64_t *out) {
    const gguf_value *v = gguf_find(g, key);
    if (!v) return CM_ENOTFOUND;
    if (is_sint(v->type)) *out = v->v.i;
    else if (is_uint(v->type) && v->v.u <= (uint64_t)INT64_MAX) *out = (int64_t)v->v.u;
    else return CM_EFORMAT;
    return 0;
}

int gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out) {
    int64_t x;
    int rc = gguf_get_i64(g, key, &x);
    if (rc) return rc;
    if (x < 0 || x > (int64_t)UINT32_MAX) return CM_EFORMAT;
    *out = (uint32_t)x;
    return 0;
}

int gguf_get_f32(const gguf_ctx *g, const char *key, float *out) {
    const gguf_value *v = gguf_find(g, key);
    if (!v) return CM_ENOTFOUND;
    if (v->type == GGUF_FLOAT32 || v->type == GGUF_FLOAT64) *out = (float)v->v.f;
    else if (is_sint(v->type)) *out = (float)v->v.i;
    else if (is_uint(v->type)) *out = (float)v->v.u;
    else return CM_EFORMAT;
    return 0;
}

int gguf_get_bool(const gguf_ctx *g, const char *key, int *out) {
    const gguf_value *v = gguf_find(g, key);
    if (!v) return CM_ENOTFOUND;
    if (v->type != GGUF_BOOL) return CM_EFORMAT;
    *out = v->v.u != 0;
    return 0;
}

int gguf_get_strdup(const gguf_ctx *g, const char *key, char **out) {
    const gguf_value *v = gguf_find(g, key);
    if (!v) return CM_ENOTFOUND;
    if (v->type != GGUF_STRING) return CM_EFORMAT;
    char *s = malloc(v->v.s.len + 1);
    if (!s) return CM_ENOMEM;
    memcpy(s, v->v.s.ptr, v->v.s.len);
    s[v->v.s.len] = 0;
    *out = s;
    return 0;
}

int gguf_get_arr(const gguf_ctx *g, const char *key, int elem_type, const gguf_value **out) {
    const gguf_value *v = gguf_find(g, key);
    if (!v) return CM_ENOTFOUND;
    if (v->type != GGUF_ARRAY || (elem_type >= 0 && v->v.arr.elem_type != elem_type)) return CM_EFORMAT;
    *out = v;
    return 0;
}

double gguf_arr_f64(const gguf_value *arr, uint64_t i) {
    if (arr->type != GGUF_ARRAY || i >= arr->v.arr.n || !arr->v.arr.raw) return 0;
    gguf_value v;
    size_t es = gguf_vtype_size(arr->v.arr.elem_type);
    scalar_at(arr->v.arr.elem_type, (const uint8_t *)arr->v.arr.raw + i * es, &v);
    if (v.type == GGUF_FLOAT32 || v.type == GGUF_FLOAT64) return v.v.f;
    return is_sint(v.type) ? (double)v.v.i : (double)v.v.u;
}

int64_t gguf_arr_i64(const gguf_value *arr, uint64_t i) {
    if (arr->type != GGUF_ARRAY || i >= arr->v.arr.n || !arr->v.arr.raw) return 0;
    gguf_value v;
    size_t es = gguf_vtype_size(arr->v.arr.elem_type);
    scalar_at(arr->v.arr.elem_type, (const uint8_t *)arr->v.arr.raw + i * es, &v);
    if (v.type == GGUF_FLOAT32 || v.type == GGUF_FLOAT64) /* truncated; NaN and out-of-range give 0 */
        return v.v.f > -9.2e18 && v.v.f < 9.2e18 ? (int64_t)v.v.f : 0;
    return is_sint(v.type) ? v.v.i : (int64_t)v.v.u;
}
