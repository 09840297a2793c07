/* gguf: reader of GGUF v2/v3 model files (metadata, tensor infos, mmapped tensor data).
 *
 * gguf_open() maps the whole file read-only and validates every length, count and offset
 * against the file size before anything is allocated, so a hostile file produces an error,
 * never a crash or an unbounded allocation. Metadata is parsed into a tree of gguf_value;
 * strings and numeric array payloads point into the mapping (not NUL-terminated: use len).
 * Tensor data pointers point into the mapping and stay valid until gguf_close().
 *
 *   gguf_ctx *g; char err[256];
 *   if (gguf_open("m.gguf", &g, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
 *   uint32_t n_layer; gguf_get_u32(g, "llama.block_count", &n_layer);
 *   const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
 *   gguf_close(g);
 *
 * A gguf_ctx is immutable after open: any number of threads may read it.
 */
#ifndef MDL_GGUF_H
#define MDL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum gguf_vtype {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4, GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12, GGUF_VTYPE_COUNT
};

typedef struct gguf_str { const char *ptr; uint64_t len; } gguf_str;

typedef struct gguf_value gguf_value;
struct gguf_value {
    int type; /* enum gguf_vtype */
    union {
        uint64_t u;  /* UINT8..UINT64 and BOOL */
        int64_t  i;  /* INT8..INT64 */
        double   f;  /* FLOAT32, FLOAT64 */
        gguf_str s;  /* STRING */
        struct {
            int         elem_type; /* enum gguf_vtype */
            uint64_t    n;
            const void *raw;   /* numeric elements, packed little-endian, unaligned (into the mapping) */
            gguf_str   *strs;  /* elem_type STRING: n strings */
            gguf_value *items; /* elem_type ARRAY: n nested arrays */
        } arr;
    } v;
};

typedef struct gguf_kv { gguf_str key; gguf_value val; } gguf_kv;

typedef struct gguf_tensor {
    gguf_str    name;
    uint32_t    n_dims;
    int64_t     ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    int         type;              /* enum dt_type */
    uint64_t    offset;            /* relative to the data section */
    uint64_t    nbytes;
    const void *data;              /* into the mapping */
} gguf_tensor;

typedef struct gguf_ctx gguf_ctx;

/* Opens and validates path. On error returns a negative code and writes "PATH: problem" into err. */
int  gguf_open(const char *path, gguf_ctx **out, char *err, size_t errlen);
/* Same over a caller-owned buffer (must outlive the ctx); used by tests and the fuzzer. */
int  gguf_open_mem(const void *data, size_t size, gguf_ctx **out, char *err, size_t errlen);
/* Unmaps and frees; accepts NULL. */
void gguf_close(gguf_ctx *g);

uint32_t           gguf_version(const gguf_ctx *g);
uint64_t           gguf_alignment(const gguf_ctx *g);
uint64_t           gguf_data_offset(const gguf_ctx *g); /* start of the tensor data section in the file */
const char        *gguf_path(const gguf_ctx *g);
uint64_t           gguf_file_size(const gguf_ctx *g);
int64_t            gguf_n_kv(const gguf_ctx *g);
const gguf_kv     *gguf_kv_at(const gguf_ctx *g, int64_t i);
int64_t            gguf_n_tensors(const gguf_ctx *g);
const gguf_tensor *gguf_tensor_at(const gguf_ctx *g, int64_t i);

/* Lookups by exact name; NULL when absent. */
const gguf_value  *gguf_find(const gguf_ctx *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_ctx *g, const char *name);

/* Typed getters: 0 on success, CM_ENOTFOUND when absent, CM_EFORMAT when the type does not fit.
 * Integer getters accept any integer type whose value fits; float getters accept any number. */
int gguf_get_u32(const gguf_ctx *g, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_ctx *g, const char *key, int64_t *out);
int gguf_get_f32(const gguf_ctx *g, const char *key, float *out);
int gguf_get_bool(const gguf_ctx *g, const char *key, int *out);
/* String into a NUL-terminated malloc'ed copy the caller frees. */
int gguf_get_strdup(const gguf_ctx *g, const char *key, char **out);
/* Array of elem_type (any type when elem_type < 0). */
int gguf_get_arr(const gguf_ctx *g, const char *key, int elem_type, const gguf_value **out);

/* Reads element i of a numeric array value as double / int64; 0 if out of range or not numeric. */
double  gguf_arr_f64(const gguf_value *arr, uint64_t i);
int64_t gguf_arr_i64(const gguf_value *arr, uint64_t i);

/* Size in bytes of one element of a scalar vtype; 0 for STRING/ARRAY/unknown. */
size_t      gguf_vtype_size(int type);
const char *gguf_vtype_name(int type);

#endif
