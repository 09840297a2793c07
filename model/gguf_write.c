/* gguf_write: GGUF writer; header in memory, tensor data streamed after it. */
#include "gguf_write.h"
#include "dtype.h"
#include "../common/cm_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NESTING 8

typedef struct { uint8_t *p; size_t len, cap; int oom; } buf;

typedef struct { char *key; size_t key_len; buf val; } wkv; /* val: u32 type + payload */

typedef struct {
    char    *name;
    int      type;
    int      n_dims;
    int64_t  ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset; /* relative to the data section; set by layout() */
} wtensor;

struct gguf_writer {
    uint32_t version;
    uint64_t alignment;
    wkv     *kv;
    int64_t  n_kv, cap_kv;
    wtensor *t;
    int64_t  n_t, cap_t;
    /* streaming state */
    FILE    *fp;
    int      own_fp;
    char    *path;
    int      begun;
    int64_t  cur;         /* tensor being written */
    uint64_t cur_written; /* its bytes so far */
    char     err[512];
};

static int seterr(gguf_writer *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int seterr(gguf_writer *w, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- byte buffer ------------------------------------------------------------------------- */

static void put(buf *b, const void *p, size_t n) {
    if (b->oom || !n) return;
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->len + n) nc *= 2;
        uint8_t *np = realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s, uint64_t n) { put_u64(b, n); put(b, s, n); }

/* ---- metadata ------------------------------------------------------------------------------ */

int gguf_w_create(gguf_writer **out) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return CM_ENOMEM;
    w->version = 3;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return 0;
}

void gguf_w_destroy(gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val.p);
    }
    for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    if (w->own_fp && w->fp) fclose(w->fp);
    free(w->kv);
    free(w->t);
    free(w->path);
    free(w);
}

const char *gguf_w_errmsg(const gguf_writer *w) { return w->err; }

int gguf_w_set_version(gguf_writer *w, uint32_t version) {
    if (w->begun) return seterr(w, CM_ESTATE, "version set after the header was written");
    if (version != 2 && version != 3) return seterr(w, CM_EINVAL, "GGUF version %u cannot be written", version);
    w->version = version;
    return 0;
}

/* Takes ownership of val (freed on error). The special key general.alignment is checked. */
static int store(gguf_writer *w, const char *key, size_t key_len, buf *val) {
    if (val->oom) { free(val->p); return seterr(w, CM_ENOMEM, "out of memory"); }
    if (w->begun) { free(val->p); return seterr(w, CM_ESTATE, "metadata set after the header was written"); }
    if (!key_len || key_len > 65535) {
        free(val->p);
        return seterr(w, CM_EINVAL, "metadata key of length %zu", key_len);
    }
    if (key_len == 17 && !memcmp(key, "general.alignment", 17)) {
        uint32_t type, a = 0;
        memcpy(&type, val->p, 4);
        if (type == GGUF_UINT32) memcpy(&a, val->p + 4, 4);
        if (type != GGUF_UINT32 || a == 0 || (a & (a - 1)) || a > 65536) {
            free(val->p);
            return seterr(w, CM_EINVAL, "general.alignment must be a u32 power of two up to 65536");
        }
        w->alignment = a;
    }
    for (int64_t i = 0; i < w->n_kv; i++)
        if (w->kv[i].key_len == key_len && !memcmp(w->kv[i].key, key, key_len)) {
            free(w->kv[i].val.p);
            w->kv[i].val = *val;
            return 0;
        }
    if (w->n_kv == w->cap_kv) {
        int64_t nc = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *nk = realloc(w->kv, (size_t)nc * sizeof *nk);
        if (!nk) { free(val->p); return seterr(w, CM_ENOMEM, "out of memory"); }
        w->kv = nk;
        w->cap_kv = nc;
    }
    char *k = malloc(key_len + 1);
    if (!k) { free(val->p); return seterr(w, CM_ENOMEM, "out of memory"); }
    memcpy(k, key, key_len);
    k[key_len] = 0;
    w->kv[w->n_kv++] = (wkv){ .key = k, .key_len = key_len, .val = *val };
    return 0;
}

static int set_scalar(gguf_writer *w, const char *key, int type, const void *v) {
    if (!key) return seterr(w, CM_EINVAL, "NULL metadata key");
    buf b = { 0 };
    put_u32(&b, (uint32_t)type);
    put(&b, v, gguf_vtype_size(type));
    return store(w, key, strlen(key), &b);
}

int gguf_w_set_u8(gguf_writer *w, const char *key, uint8_t v) { return set_scalar(w, key, GGUF_UINT8, &v); }
int gguf_w_set_i8(gguf_writer *w, const char *key, int8_t v) { return set_scalar(w, key, GGUF_INT8, &v); }
int gguf_w_set_u16(gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, GGUF_UINT16, &v); }
int gguf_w_set_i16(gguf_writer *w, const char *key, int16_t v) { return set_scalar(w, key, GGUF_INT16, &v); }
int gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, GGUF_UINT32, &v); }
int gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, GGUF_INT32, &v); }
int gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, GGUF_UINT64, &v); }
int gguf_w_set_i64(gguf_writer *w, const char *key, int64_t v) { return set_scalar(w, key, GGUF_INT64, &v); }
int gguf_w_set_f32(gguf_writer *w, const char *key, float v) { return set_scalar(w, key, GGUF_FLOAT32, &v); }
int gguf_w_set_f64(gguf_writer *w, const char *key, double v) { return set_scalar(w, key, GGUF_FLOAT64, &v); }
int gguf_w_set_bool(gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    return set_scalar(w, key, GGUF_BOOL, &b);
}

int gguf_w_set_strn(gguf_writer *w, const char *key, const char *s, uint64_t len) {
    if (!key || (!s && len)) return seterr(w, CM_EINVAL, "NULL key or string");
    buf b = { 0 };
    put_u32(&b, GGUF_STRING);
    put_str(&b, s, len);
    return store(w, key, strlen(key), &b);
}

int gguf_w_set_str(gguf_writer *w, const char *key, const char *s) {
    if (!s) return seterr(w, CM_EINVAL, "NULL string for key '%s'", key ? key : "");
    return gguf_w_set_strn(w, key, s, strlen(s));
}

int gguf_w_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n) {
    size_t es = gguf_vtype_size(elem_type);
    if (!key || !es || (!data && n)) return seterr(w, CM_EINVAL, "bad numeric array for key '%s'", key ? key : "");
    if (n > SIZE_MAX / es) return seterr(w, CM_ETOOBIG, "array too large for key '%s'", key);
    buf b = { 0 };
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, (uint32_t)elem_type);
    put_u64(&b, n);
    put(&b, data, (size_t)n * es);
    return store(w, key, strlen(key), &b);
}

int gguf_w_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (!key || (!strs && n)) return seterr(w, CM_EINVAL, "bad string array for key '%s'", key ? key : "");
    buf b = { 0 };
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    put_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) { free(b.p); return seterr(w, CM_EINVAL, "NULL string %llu in array '%s'", (unsigned long long)i, key); }
        put_str(&b, strs[i], strlen(strs[i]));
    }
    return store(w, key, strlen(key), &b);
}

/* Serializes v's payload (no type tag for array elements nested in arrays: GGUF writes a nested
 * array as elem_type, n, elements). Returns 0 or CM_EINVAL for an inconsistent tree. */
static int put_value(buf *b, const gguf_value *v, int depth) {
    switch (v->type) {
    case GGUF_UINT8: case GGUF_BOOL: { uint8_t x = (uint8_t)v->v.u; put(b, &x, 1); return 0; }
    case GGUF_INT8: { int8_t x = (int8_t)v->v.i; put(b, &x, 1); return 0; }
    case GGUF_UINT16: { uint16_t x = (uint16_t)v->v.u; put(b, &x, 2); return 0; }
    case GGUF_INT16: { int16_t x = (int16_t)v->v.i; put(b, &x, 2); return 0; }
    case GGUF_UINT32: { uint32_t x = (uint32_t)v->v.u; put(b, &x, 4); return 0; }
    case GGUF_INT32: { int32_t x = (int32_t)v->v.i; put(b, &x, 4); return 0; }
    case GGUF_FLOAT32: { float x = (float)v->v.f; put(b, &x, 4); return 0; }
    case GGUF_UINT64: put(b, &v->v.u, 8); return 0;
    case GGUF_INT64: put(b, &v->v.i, 8); return 0;
    case GGUF_FLOAT64: put(b, &v->v.f, 8); return 0;
    case GGUF_STRING:
        if (!v->v.s.ptr && v->v.s.len) return CM_EINVAL;
        put_str(b, v->v.s.ptr, v->v.s.len);
        return 0;
    case GGUF_ARRAY: {
        int et = v->v.arr.elem_type;
        uint64_t n = v->v.arr.n;
        if (depth >= MAX_NESTING || et < 0 || et >= GGUF_VTYPE_COUNT) return CM_EINVAL;
        put_u32(b, (uint32_t)et);
        put_u64(b, n);
        if (!n) return 0;
        size_t es = gguf_vtype_size(et);
        if (es) {
            if (!v->v.arr.raw || n > SIZE_MAX / es) return CM_EINVAL;
            put(b, v->v.arr.raw, (size_t)n * es);
            return 0;
        }
        if (et == GGUF_STRING) {
            if (!v->v.arr.strs) return CM_EINVAL;
            for (uint64_t i = 0; i < n; i++) {
                if (!v->v.arr.strs[i].ptr && v->v.arr.strs[i].len) return CM_EINVAL;
                put_str(b, v->v.arr.strs[i].ptr, v->v.arr.strs[i].len);
            }
            return 0;
        }
        if (!v->v.arr.items) return CM_EINVAL;
        for (uint64_t i = 0; i < n; i++) {
            if (v->v.arr.items[i].type != GGUF_ARRAY) return CM_EINVAL;
            int rc = put_value(b, &v->v.arr.items[i], depth + 1);
            if (rc) return rc;
        }
        return 0;
    }
    default: return CM_EINVAL;
    }
}

static int set_value_n(gguf_writer *w, const char *key, size_t key_len, const gguf_value *v) {
    buf b = { 0 };
    put_u32(&b, (uint32_t)v->type);
    int rc = put_value(&b, v, 0);
    if (rc) {
        free(b.p);
        return seterr(w, rc, "metadata '%.*s': inconsistent or too deeply nested value", (int)(key_len > 200 ? 200 : key_len), key);
    }
    return store(w, key, key_len, &b);
}

int gguf_w_set_value(gguf_writer *w, const char *key, const gguf_value *v) {
    if (!key || !v) return seterr(w, CM_EINVAL, "NULL key or value");
    return set_value_n(w, key, strlen(key), v);
}

int gguf_w_copy_kv(gguf_writer *w, const gguf_ctx *g, const char *prefix, int64_t *n_copied) {
    size_t pl = strlen(prefix);
    int64_t n = 0;
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        if (kv->key.len < pl || memcmp(kv->key.ptr, prefix, pl)) continue;
        int rc = set_value_n(w, kv->key.ptr, kv->key.len, &kv->val);
        if (rc) return rc;
        n++;
    }
    if (n_copied) *n_copied = n;
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------------- */

int gguf_w_add_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne) {
    if (w->begun) return seterr(w, CM_ESTATE, "tensor added after the header was written");
    size_t nl = name ? strlen(name) : 0;
    if (!nl || nl > GGUF_W_MAX_NAME) return seterr(w, CM_EINVAL, "tensor name '%s' must be 1..%d bytes", name ? name : "", GGUF_W_MAX_NAME);
    if (type == DT_F8_E4M3)
        return seterr(w, CM_EUNSUPPORTED, "tensor '%s': GGUF has no FP8 type (write F16 or BF16 and load with --quantize fp8)", name);
    if (type < 0 || type >= DT_GGUF_COUNT || !dt_block_size(type)) return seterr(w, CM_EUNSUPPORTED, "tensor '%s': unknown type %d", name, type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) return seterr(w, CM_EINVAL, "tensor '%s': %d dimensions (1..4 allowed)", name, n_dims);
    uint64_t nel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || ne[d] > (1ll << 40) || nel > (1ull << 42) / (uint64_t)ne[d])
            return seterr(w, CM_EINVAL, "tensor '%s': bad dimension %lld", name, (long long)ne[d]);
        nel *= (uint64_t)ne[d];
    }
    size_t rs = dt_row_size(type, ne[0]);
    if (!rs)
        return seterr(w, CM_EINVAL, "tensor '%s': row of %lld elements is not a multiple of the %s block size %d", name,
                      (long long)ne[0], dt_name(type), dt_block_size(type));
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return seterr(w, CM_EINVAL, "duplicate tensor name '%s'", name);
    if (w->n_t == w->cap_t) {
        int64_t nc = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, (size_t)nc * sizeof *nt);
        if (!nt) return seterr(w, CM_ENOMEM, "out of memory");
        w->t = nt;
        w->cap_t = nc;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return seterr(w, CM_ENOMEM, "out of memory");
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = rs * (nel / (uint64_t)ne[0]);
    w->n_t++;
    return 0;
}

uint64_t gguf_w_tensor_nbytes(const gguf_writer *w, int64_t i) { return i >= 0 && i < w->n_t ? w->t[i].nbytes : 0; }
int64_t gguf_w_current_tensor(const gguf_writer *w) { return w->cur; }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Assigns data offsets (alignment may have changed since the tensors were added) and returns
 * the size of the data section. */
static uint64_t layout(gguf_writer *w) {
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        off = align_up(off + w->t[i].nbytes, w->alignment);
    }
    return off;
}

static uint64_t header_bytes(const gguf_writer *w) {
    uint64_t n = 4 + 4 + 8 + 8;
    for (int64_t i = 0; i < w->n_kv; i++) n += 8 + w->kv[i].key_len + w->kv[i].val.len;
    for (int64_t i = 0; i < w->n_t; i++) n += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dims + 4 + 8;
    return n;
}

uint64_t gguf_w_header_size(const gguf_writer *w) { return align_up(header_bytes(w), w->alignment); }

uint64_t gguf_w_file_size(const gguf_writer *w) {
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) off = align_up(off + w->t[i].nbytes, w->alignment);
    return gguf_w_header_size(w) + off;
}

/* ---- streaming ----------------------------------------------------------------------------- */

static const uint8_t zeros[4096];

static int wr(gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->fp) != n) {
        int e = errno;
        return seterr(w, CM_EIO, "%s: write failed: %s", w->path ? w->path : "<stream>", strerror(e));
    }
    return 0;
}

static int pad(gguf_writer *w, uint64_t n) {
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        int rc = wr(w, zeros, k);
        if (rc) return rc;
        n -= k;
    }
    return 0;
}

static int write_header(gguf_writer *w) {
    layout(w);
    buf b = { 0 };
    put_u32(&b, GGUF_MAGIC);
    put_u32(&b, w->version);
    put_u64(&b, (uint64_t)w->n_t);
    put_u64(&b, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        put_str(&b, w->kv[i].key, w->kv[i].key_len);
        put(&b, w->kv[i].val.p, w->kv[i].val.len);
    }
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_str(&b, t->name, strlen(t->name));
        put_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&b, (uint64_t)t->ne[d]);
        put_u32(&b, (uint32_t)t->type);
        put_u64(&b, t->offset);
    }
    if (b.oom) { free(b.p); return seterr(w, CM_ENOMEM, "out of memory"); }
    int rc = wr(w, b.p, b.len);
    if (!rc) rc = pad(w, align_up(b.len, w->alignment) - b.len);
    free(b.p);
    return rc;
}

int gguf_w_begin_fp(gguf_writer *w, FILE *fp) {
    if (w->begun) return seterr(w, CM_ESTATE, "header already written");
    w->fp = fp;
    w->begun = 1;
    w->cur = 0;
    w->cur_written = 0;
    return write_header(w);
}

int gguf_w_begin(gguf_writer *w, const char *path) {
    if (w->begun) return seterr(w, CM_ESTATE, "header already written");
    free(w->path);
    if (!(w->path = strdup(path))) return seterr(w, CM_ENOMEM, "out of memory");
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        int e = errno;
        return seterr(w, CM_EIO, "%s: cannot create: %s", path, strerror(e));
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    w->own_fp = 1;
    return gguf_w_begin_fp(w, fp);
}

int gguf_w_write(gguf_writer *w, const void *data, size_t n) {
    if (!w->begun || !w->fp) return seterr(w, CM_ESTATE, "tensor data written before the header");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_t) return seterr(w, CM_ERANGE, "more tensor data than the tensors declared");
        wtensor *t = &w->t[w->cur];
        uint64_t room = t->nbytes - w->cur_written;
        size_t k = n < room ? n : (size_t)room;
        int rc = wr(w, p, k);
        if (rc) return rc;
        p += k;
        n -= k;
        w->cur_written += k;
        if (w->cur_written == t->nbytes) {
            if ((rc = pad(w, align_up(t->nbytes, w->alignment) - t->nbytes))) return rc;
            w->cur++;
            w->cur_written = 0;
        }
    }
    return 0;
}

int gguf_w_finish(gguf_writer *w) {
    if (!w->begun || !w->fp) return seterr(w, CM_ESTATE, "finish without a header written");
    if (w->cur < w->n_t)
        return seterr(w, CM_ESTATE, "tensor '%s' got %llu of its %llu bytes", w->t[w->cur].name,
                      (unsigned long long)w->cur_written, (unsigned long long)w->t[w->cur].nbytes);
    int bad = fflush(w->fp) != 0 || ferror(w->fp);
    int e = errno;
    if (w->own_fp) {
        if (fclose(w->fp) != 0 && !bad) {
            bad = 1;
            e = errno;
        }
        w->own_fp = 0;
    }
    w->fp = NULL;
    if (bad) return seterr(w, CM_EIO, "%s: write failed: %s", w->path ? w->path : "<stream>", strerror(e));
    return 0;
}
