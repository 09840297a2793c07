/* GGUF reader (model/gguf.h) and writer (model/gguf_write.h), through their public APIs:
 * files written with every metadata type, nested arrays, versions 2 and 3 and several
 * alignments read back equal; hostile headers (built byte by byte) fail with an error that
 * names the problem; the real stories260K model truncated at every header offset and at a
 * sample of data offsets always fails cleanly (run under ASan by `make test`); mistral and qwen2
 * files written here (Q/K/V biases, tied output, rope scaling keys) give the expected mdl_config. */
#include "t.h"
#include "common/cm_err.h"
#include "model/dtype.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------- */

/* Opens a private exact-size copy of data[0..n) so that ASan sees any read past the end. */
static int open_copy(const void *data, size_t n, gguf_ctx **g, void **copy, char *err, size_t errlen) {
    *copy = malloc(n ? n : 1);
    if (n) memcpy(*copy, data, n);
    err[0] = 0;
    return gguf_open_mem(*copy, n, g, err, errlen);
}

static int gstr_eq(gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0; }

/* Writes w (header + the given tensor bytes) into memory. */
static int write_mem(gguf_writer *w, const void *data, size_t n, char **buf, size_t *len) {
    FILE *fp = open_memstream(buf, len);
    if (!fp) return CM_EIO;
    int rc = gguf_w_begin_fp(w, fp);
    if (!rc && n) rc = gguf_w_write(w, data, n);
    if (!rc) rc = gguf_w_finish(w);
    fclose(fp);
    return rc;
}

/* ---- round trip of every metadata type ------------------------------------------------------ */

static const uint8_t a_u8[] = { 0, 1, 255 };
static const int8_t a_i8[] = { -128, 0, 127 };
static const uint16_t a_u16[] = { 0, 65535 };
static const int16_t a_i16[] = { -32768, 32767, -1 };
static const uint32_t a_u32[] = { 0, 4000000000u, 7 };
static const int32_t a_i32[] = { INT32_MIN, INT32_MAX };
static const float a_f32[] = { 1.5f, -0.0f, 3.4e38f };
static const uint8_t a_bool[] = { 1, 0, 1, 1 };
static const uint64_t a_u64[] = { UINT64_MAX, 0 };
static const int64_t a_i64[] = { INT64_MIN, INT64_MAX, -5 };
static const double a_f64[] = { 1e300, -2.5 };

static void fill_metadata(gguf_writer *w) {
    T_EQ_INT(gguf_w_set_u8(w, "t.u8", 200), 0);
    T_EQ_INT(gguf_w_set_i8(w, "t.i8", -100), 0);
    T_EQ_INT(gguf_w_set_u16(w, "t.u16", 60000), 0);
    T_EQ_INT(gguf_w_set_i16(w, "t.i16", -30000), 0);
    T_EQ_INT(gguf_w_set_u32(w, "t.u32", 4000000000u), 0);
    T_EQ_INT(gguf_w_set_i32(w, "t.i32", -2000000000), 0);
    T_EQ_INT(gguf_w_set_f32(w, "t.f32", 0.1f), 0);
    T_EQ_INT(gguf_w_set_bool(w, "t.bool", 1), 0);
    T_EQ_INT(gguf_w_set_str(w, "t.str", "héllo wörld"), 0);
    T_EQ_INT(gguf_w_set_strn(w, "t.strnul", "a\0b", 3), 0);
    T_EQ_INT(gguf_w_set_str(w, "t.empty", ""), 0);
    T_EQ_INT(gguf_w_set_u64(w, "t.u64", UINT64_MAX), 0);
    T_EQ_INT(gguf_w_set_i64(w, "t.i64", INT64_MIN), 0);
    T_EQ_INT(gguf_w_set_f64(w, "t.f64", 2.718281828459045), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.u8", GGUF_UINT8, a_u8, 3), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.i8", GGUF_INT8, a_i8, 3), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.u16", GGUF_UINT16, a_u16, 2), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.i16", GGUF_INT16, a_i16, 3), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.u32", GGUF_UINT32, a_u32, 3), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.i32", GGUF_INT32, a_i32, 2), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.f32", GGUF_FLOAT32, a_f32, 3), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.bool", GGUF_BOOL, a_bool, 4), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.u64", GGUF_UINT64, a_u64, 2), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.i64", GGUF_INT64, a_i64, 3), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.f64", GGUF_FLOAT64, a_f64, 2), 0);
    T_EQ_INT(gguf_w_set_arr(w, "a.empty", GGUF_UINT32, NULL, 0), 0);
    const char *strs[] = { "one", "", "three" };
    T_EQ_INT(gguf_w_set_arr_str(w, "a.str", strs, 3), 0);
    /* nested: [[1,2,3],[],[4]] of u32; [["x"],["y","zz"]]; and 3 levels [[[7]]] */
    static const uint32_t n1[] = { 1, 2, 3 }, n3[] = { 4 }, n7[] = { 7 };
    gguf_value inner[3] = {
        { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_UINT32, .n = 3, .raw = n1 } },
        { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_UINT32, .n = 0 } },
        { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_UINT32, .n = 1, .raw = n3 } },
    };
    gguf_value outer = { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_ARRAY, .n = 3, .items = inner } };
    T_EQ_INT(gguf_w_set_value(w, "n.u32", &outer), 0);
    gguf_str s0[] = { { "x", 1 } }, s1[] = { { "y", 1 }, { "zz", 2 } };
    gguf_value sin[2] = {
        { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_STRING, .n = 1, .strs = s0 } },
        { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_STRING, .n = 2, .strs = s1 } },
    };
    gguf_value sout = { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_ARRAY, .n = 2, .items = sin } };
    T_EQ_INT(gguf_w_set_value(w, "n.str", &sout), 0);
    gguf_value l3 = { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_UINT32, .n = 1, .raw = n7 } };
    gguf_value l2 = { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_ARRAY, .n = 1, .items = &l3 } };
    gguf_value l1 = { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_ARRAY, .n = 1, .items = &l2 } };
    T_EQ_INT(gguf_w_set_value(w, "n.deep", &l1), 0);
    /* scalar through set_value too */
    gguf_value sv = { .type = GGUF_INT16, .v.i = -7 };
    T_EQ_INT(gguf_w_set_value(w, "t.viaval", &sv), 0);
    /* set twice: keeps its place, takes the new value */
    T_EQ_INT(gguf_w_set_u32(w, "t.replaced", 1), 0);
    T_EQ_INT(gguf_w_set_str(w, "t.replaced", "second"), 0);
}

static int arr_eq(const gguf_ctx *g, const char *key, int et, const void *want, uint64_t n) {
    const gguf_value *v;
    if (gguf_get_arr(g, key, et, &v)) return 0;
    if (v->v.arr.n != n) return 0;
    return n == 0 || memcmp(v->v.arr.raw, want, n * gguf_vtype_size(et)) == 0;
}

static void check_metadata(const gguf_ctx *g) {
    const gguf_value *v;
    T_CHECK((v = gguf_find(g, "t.u8")) && v->type == GGUF_UINT8 && v->v.u == 200);
    T_CHECK((v = gguf_find(g, "t.i8")) && v->type == GGUF_INT8 && v->v.i == -100);
    T_CHECK((v = gguf_find(g, "t.u16")) && v->type == GGUF_UINT16 && v->v.u == 60000);
    T_CHECK((v = gguf_find(g, "t.i16")) && v->type == GGUF_INT16 && v->v.i == -30000);
    T_CHECK((v = gguf_find(g, "t.u32")) && v->type == GGUF_UINT32 && v->v.u == 4000000000u);
    T_CHECK((v = gguf_find(g, "t.i32")) && v->type == GGUF_INT32 && v->v.i == -2000000000);
    T_CHECK((v = gguf_find(g, "t.f32")) && v->type == GGUF_FLOAT32 && (float)v->v.f == 0.1f);
    T_CHECK((v = gguf_find(g, "t.bool")) && v->type == GGUF_BOOL && v->v.u == 1);
    T_CHECK((v = gguf_find(g, "t.str")) && v->type == GGUF_STRING && gstr_eq(v->v.s, "héllo wörld"));
    T_CHECK((v = gguf_find(g, "t.strnul")) && v->v.s.len == 3 && memcmp(v->v.s.ptr, "a\0b", 3) == 0);
    T_CHECK((v = gguf_find(g, "t.empty")) && v->type == GGUF_STRING && v->v.s.len == 0);
    T_CHECK((v = gguf_find(g, "t.u64")) && v->type == GGUF_UINT64 && v->v.u == UINT64_MAX);
    T_CHECK((v = gguf_find(g, "t.i64")) && v->type == GGUF_INT64 && v->v.i == INT64_MIN);
    T_CHECK((v = gguf_find(g, "t.f64")) && v->type == GGUF_FLOAT64 && v->v.f == 2.718281828459045);
    T_CHECK((v = gguf_find(g, "t.viaval")) && v->type == GGUF_INT16 && v->v.i == -7);
    T_CHECK(arr_eq(g, "a.u8", GGUF_UINT8, a_u8, 3));
    T_CHECK(arr_eq(g, "a.i8", GGUF_INT8, a_i8, 3));
    T_CHECK(arr_eq(g, "a.u16", GGUF_UINT16, a_u16, 2));
    T_CHECK(arr_eq(g, "a.i16", GGUF_INT16, a_i16, 3));
    T_CHECK(arr_eq(g, "a.u32", GGUF_UINT32, a_u32, 3));
    T_CHECK(arr_eq(g, "a.i32", GGUF_INT32, a_i32, 2));
    T_CHECK(arr_eq(g, "a.f32", GGUF_FLOAT32, a_f32, 3));
    T_CHECK(arr_eq(g, "a.bool", GGUF_BOOL, a_bool, 4));
    T_CHECK(arr_eq(g, "a.u64", GGUF_UINT64, a_u64, 2));
    T_CHECK(arr_eq(g, "a.i64", GGUF_INT64, a_i64, 3));
    T_CHECK(arr_eq(g, "a.f64", GGUF_FLOAT64, a_f64, 2));
    T_CHECK(arr_eq(g, "a.empty", GGUF_UINT32, NULL, 0));
    if (gguf_get_arr(g, "a.i64", GGUF_INT64, &v) == 0) {
        T_EQ_INT(gguf_arr_i64(v, 2), -5);
        T_NEAR(gguf_arr_f64(v, 2), -5.0, 0);
        T_EQ_INT(gguf_arr_i64(v, 3), 0); /* out of range */
    }
    if (gguf_get_arr(g, "a.f32", GGUF_FLOAT32, &v) == 0) {
        T_EQ_INT(gguf_arr_i64(v, 0), 1); /* 1.5 truncates */
        T_EQ_INT(gguf_arr_i64(v, 2), 0); /* 3.4e38 does not fit: 0, not undefined behaviour */
        T_NEAR(gguf_arr_f64(v, 2), 3.4e38, 1e32);
    }
    T_CHECK(gguf_get_arr(g, "a.str", GGUF_STRING, &v) == 0 && v->v.arr.n == 3 && gstr_eq(v->v.arr.strs[0], "one") &&
            gstr_eq(v->v.arr.strs[1], "") && gstr_eq(v->v.arr.strs[2], "three"));
    T_CHECK(gguf_get_arr(g, "n.u32", GGUF_ARRAY, &v) == 0 && v->v.arr.n == 3);
    if (v && v->v.arr.items) {
        T_CHECK(v->v.arr.items[0].v.arr.elem_type == GGUF_UINT32 && v->v.arr.items[0].v.arr.n == 3);
        T_EQ_INT(gguf_arr_i64(&v->v.arr.items[0], 2), 3);
        T_EQ_INT(v->v.arr.items[1].v.arr.n, 0);
        T_EQ_INT(gguf_arr_i64(&v->v.arr.items[2], 0), 4);
    }
    T_CHECK(gguf_get_arr(g, "n.str", GGUF_ARRAY, &v) == 0 && v->v.arr.n == 2 && v->v.arr.items[1].v.arr.n == 2 &&
            gstr_eq(v->v.arr.items[1].v.arr.strs[1], "zz") && gstr_eq(v->v.arr.items[0].v.arr.strs[0], "x"));
    T_CHECK(gguf_get_arr(g, "n.deep", GGUF_ARRAY, &v) == 0 && v->v.arr.items[0].v.arr.elem_type == GGUF_ARRAY &&
            gguf_arr_i64(&v->v.arr.items[0].v.arr.items[0], 0) == 7);
    /* typed getters */
    uint32_t u;
    int64_t i;
    float f;
    int b;
    char *s = NULL;
    T_EQ_INT(gguf_get_u32(g, "t.u16", &u), 0);
    T_EQ_INT(u, 60000);
    T_EQ_INT(gguf_get_u32(g, "t.i8", &u), CM_EFORMAT); /* negative */
    T_EQ_INT(gguf_get_u32(g, "t.u64", &u), CM_EFORMAT);
    T_EQ_INT(gguf_get_i64(g, "t.i64", &i), 0);
    T_CHECK(i == INT64_MIN);
    T_EQ_INT(gguf_get_f32(g, "t.f64", &f), 0);
    T_NEAR(f, 2.7182817, 1e-6);
    T_EQ_INT(gguf_get_bool(g, "t.bool", &b), 0);
    T_EQ_INT(b, 1);
    T_EQ_INT(gguf_get_bool(g, "t.u8", &b), CM_EFORMAT);
    T_EQ_INT(gguf_get_u32(g, "no.such", &u), CM_ENOTFOUND);
    T_EQ_INT(gguf_get_strdup(g, "t.replaced", &s), 0);
    if (s) T_EQ_STR(s, "second");
    free(s);
    T_EQ_INT(gguf_get_strdup(g, "t.u8", &s), CM_EFORMAT);
}

/* The tensors of the round-trip files: various types, shapes and sizes not multiples of 32. */
typedef struct { const char *name; int type; int n_dims; int64_t ne[4]; } tdecl;
static const tdecl tdecls[] = {
    { "a", DT_F32, 1, { 3 } },
    { "blk.0.b", DT_Q8_0, 2, { 64, 3 } },
    { "c", DT_F16, 3, { 5, 2, 3 } },
    { "d", DT_Q4_K, 4, { 256, 1, 2, 1 } },
    { "e", DT_BF16, 2, { 1, 1 } },
    { "f", DT_Q6_K, 1, { 512 } },
};
#define N_TDECLS (int)(sizeof tdecls / sizeof *tdecls)

static void roundtrip(uint32_t version, uint32_t alignment, int via_file) {
    gguf_writer *w;
    T_EQ_INT(gguf_w_create(&w), 0);
    if (version != 3) T_EQ_INT(gguf_w_set_version(w, version), 0);
    fill_metadata(w);
    if (alignment) T_EQ_INT(gguf_w_set_u32(w, "general.alignment", alignment), 0);
    uint64_t total = 0;
    for (int i = 0; i < N_TDECLS; i++) {
        T_EQ_INT(gguf_w_add_tensor(w, tdecls[i].name, tdecls[i].type, tdecls[i].n_dims, tdecls[i].ne), 0);
        total += gguf_w_tensor_nbytes(w, i);
    }
    uint8_t *data = malloc(total);
    for (uint64_t i = 0; i < total; i++) data[i] = (uint8_t)(i * 31 + 7);
    /* Q-type bytes are opaque to the reader; keep f16 NaN-free anyway: not needed for equality */
    char *buf = NULL;
    size_t len = 0;
    uint64_t want_size = gguf_w_file_size(w);
    char path[] = "/tmp/arka_test_gguf_XXXXXX";
    if (via_file) {
        int fd = mkstemp(path);
        T_CHECK(fd >= 0);
        close(fd);
        T_EQ_INT(gguf_w_begin(w, path), 0);
        /* odd chunking: the writer must carry bytes across tensor boundaries */
        for (uint64_t off = 0; off < total;) {
            size_t k = (size_t)(total - off < 77 ? total - off : 77);
            T_EQ_INT(gguf_w_write(w, data + off, k), 0);
            off += k;
        }
        T_EQ_INT(gguf_w_finish(w), 0);
    } else {
        T_EQ_INT(write_mem(w, data, total, &buf, &len), 0);
        T_EQ_INT(len, want_size);
    }
    gguf_w_destroy(w);

    gguf_ctx *g = NULL;
    char err[256];
    void *copy = NULL;
    int rc = via_file ? gguf_open(path, &g, err, sizeof err) : open_copy(buf, len, &g, &copy, err, sizeof err);
    T_CHECKF(rc == 0, "v%u align %u: %s", version, alignment, err);
    if (!rc) {
        uint64_t a = alignment ? alignment : 32;
        T_EQ_INT(gguf_version(g), version);
        T_EQ_INT(gguf_alignment(g), a);
        T_EQ_INT(gguf_data_offset(g) % a, 0);
        T_EQ_INT(gguf_file_size(g), want_size);
        check_metadata(g);
        /* keys keep their order of first setting */
        T_CHECK(gstr_eq(gguf_kv_at(g, 0)->key, "t.u8"));
        T_EQ_INT(gguf_n_tensors(g), N_TDECLS);
        uint64_t off = 0;
        for (int i = 0; i < N_TDECLS && i < gguf_n_tensors(g); i++) {
            const gguf_tensor *t = gguf_tensor_at(g, i);
            T_CHECK(gstr_eq(t->name, tdecls[i].name));
            T_EQ_INT(t->type, tdecls[i].type);
            T_EQ_INT(t->n_dims, tdecls[i].n_dims);
            for (int d = 0; d < 4; d++) T_EQ_INT(t->ne[d], d < tdecls[i].n_dims ? tdecls[i].ne[d] : 1);
            T_EQ_INT(t->offset % a, 0);
            T_CHECKF(memcmp(t->data, data + off, t->nbytes) == 0, "tensor %s data", tdecls[i].name);
            T_CHECK(gguf_find_tensor(g, tdecls[i].name) == t);
            off += t->nbytes;
        }
    }
    gguf_close(g);
    free(copy);
    free(buf);
    free(data);
    if (via_file) unlink(path);
}

/* ---- writer misuse -------------------------------------------------------------------------- */

static void test_writer_errors(void) {
    gguf_writer *w;
    T_EQ_INT(gguf_w_create(&w), 0);
    int64_t ne[4] = { 32, 2, 1, 1 }, bad_ne[2] = { 33, 1 }, zero[2] = { 0, 4 };
    T_EQ_INT(gguf_w_add_tensor(w, "x", DT_Q8_0, 2, ne), 0);
    T_EQ_INT(gguf_w_add_tensor(w, "x", DT_F32, 1, ne), CM_EINVAL);
    T_CHECK(strstr(gguf_w_errmsg(w), "duplicate") != NULL);
    T_EQ_INT(gguf_w_add_tensor(w, "y", DT_Q8_0, 2, bad_ne), CM_EINVAL);
    T_CHECK(strstr(gguf_w_errmsg(w), "block size") != NULL);
    T_EQ_INT(gguf_w_add_tensor(w, "y", DT_F32, 2, zero), CM_EINVAL);
    T_EQ_INT(gguf_w_add_tensor(w, "y", DT_F32, 5, ne), CM_EINVAL);
    T_EQ_INT(gguf_w_add_tensor(w, "y", DT_F32, 0, ne), CM_EINVAL);
    T_EQ_INT(gguf_w_add_tensor(w, "y", 77, 1, ne), CM_EUNSUPPORTED);
    T_EQ_INT(gguf_w_add_tensor(w, "", DT_F32, 1, ne), CM_EINVAL);
    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = 0;
    T_EQ_INT(gguf_w_add_tensor(w, longname, DT_F32, 1, ne), CM_EINVAL);
    longname[63] = 0;
    T_EQ_INT(gguf_w_add_tensor(w, longname, DT_F32, 1, ne), 0);
    T_EQ_INT(gguf_w_set_u32(w, "", 1), CM_EINVAL);
    T_EQ_INT(gguf_w_set_u32(w, "general.alignment", 48), CM_EINVAL);
    T_EQ_INT(gguf_w_set_u32(w, "general.alignment", 0), CM_EINVAL);
    T_EQ_INT(gguf_w_set_u64(w, "general.alignment", 64), CM_EINVAL);
    T_EQ_INT(gguf_w_set_version(w, 1), CM_EINVAL);
    gguf_value bad = { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_STRING, .n = 2, .strs = NULL } };
    T_EQ_INT(gguf_w_set_value(w, "k", &bad), CM_EINVAL);
    gguf_value notarr = { .type = GGUF_UINT8 };
    gguf_value outer = { .type = GGUF_ARRAY, .v.arr = { .elem_type = GGUF_ARRAY, .n = 1, .items = &notarr } };
    T_EQ_INT(gguf_w_set_value(w, "k", &outer), CM_EINVAL);
    gguf_value chain[10];
    for (int i = 0; i < 10; i++)
        chain[i] = (gguf_value){ .type = GGUF_ARRAY, .v.arr = { .elem_type = i < 9 ? GGUF_ARRAY : GGUF_UINT8, .n = i < 9 ? 1 : 0,
                                                               .items = i < 9 ? &chain[i + 1] : NULL } };
    T_EQ_INT(gguf_w_set_value(w, "deep", &chain[0]), CM_EINVAL);
    T_EQ_INT(gguf_w_set_value(w, "deep", &chain[2]), 0); /* 8 levels are fine */
    T_EQ_INT(gguf_w_write(w, "x", 1), CM_ESTATE);         /* before begin */

    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    T_EQ_INT(gguf_w_begin_fp(w, fp), 0);
    T_EQ_INT(gguf_w_begin_fp(w, fp), CM_ESTATE);
    T_EQ_INT(gguf_w_set_u32(w, "late", 1), CM_ESTATE);
    T_EQ_INT(gguf_w_add_tensor(w, "late", DT_F32, 1, ne), CM_ESTATE);
    uint8_t blob[2 * 34 + 32 * 4 + 1] = { 0 };
    T_EQ_INT(gguf_w_write(w, blob, 10), 0);
    T_EQ_INT(gguf_w_current_tensor(w), 0);
    T_EQ_INT(gguf_w_finish(w), CM_ESTATE); /* data missing */
    T_CHECK(strstr(gguf_w_errmsg(w), "'x' got 10 of its 68 bytes") != NULL);
    T_EQ_INT(gguf_w_write(w, blob, 58 + 128), 0);
    T_EQ_INT(gguf_w_current_tensor(w), 2);
    T_EQ_INT(gguf_w_write(w, blob, 1), CM_ERANGE);
    T_EQ_INT(gguf_w_finish(w), 0);
    fclose(fp);
    gguf_ctx *g;
    char err[256];
    void *copy;
    T_EQ_INT(open_copy(buf, len, &g, &copy, err, sizeof err), 0);
    gguf_close(g);
    free(copy);
    free(buf);
    gguf_w_destroy(w);

    /* a full disk is reported (at the latest by finish), naming the file */
    if (access("/dev/full", W_OK) == 0) {
        T_EQ_INT(gguf_w_create(&w), 0);
        int64_t big[1] = { 1 << 20 };
        T_EQ_INT(gguf_w_add_tensor(w, "big", DT_F32, 1, big), 0);
        int rc = gguf_w_begin(w, "/dev/full");
        float *zeros = calloc(1 << 20, sizeof *zeros);
        if (!rc) rc = gguf_w_write(w, zeros, (size_t)4 << 20);
        if (!rc) rc = gguf_w_finish(w);
        T_EQ_INT(rc, CM_EIO);
        T_CHECK(strstr(gguf_w_errmsg(w), "/dev/full") != NULL);
        free(zeros);
        gguf_w_destroy(w);
    }
    T_EQ_INT(gguf_w_create(&w), 0);
    T_EQ_INT(gguf_w_begin(w, "/nonexistent-dir/x.gguf"), CM_EIO);
    T_CHECK(strstr(gguf_w_errmsg(w), "/nonexistent-dir/x.gguf") != NULL);
    gguf_w_destroy(w);
    gguf_w_destroy(NULL);
}

/* Copying tokenizer.* from the real model keeps every value. */
static void test_copy_kv(void) {
    gguf_ctx *src;
    char err[256];
    if (gguf_open(T_MODELS "stories260K.gguf", &src, err, sizeof err)) {
        T_CHECKF(0, "%s", err);
        return;
    }
    gguf_writer *w;
    T_EQ_INT(gguf_w_create(&w), 0);
    int64_t n = 0, want = 0;
    T_EQ_INT(gguf_w_copy_kv(w, src, "tokenizer.", &n), 0);
    for (int64_t i = 0; i < gguf_n_kv(src); i++) want += gguf_kv_at(src, i)->key.len >= 10 && !memcmp(gguf_kv_at(src, i)->key.ptr, "tokenizer.", 10);
    T_CHECK(n == want && n >= 3);
    char *buf = NULL;
    size_t len = 0;
    T_EQ_INT(write_mem(w, NULL, 0, &buf, &len), 0);
    gguf_w_destroy(w);
    gguf_ctx *g;
    void *copy;
    T_EQ_INT(open_copy(buf, len, &g, &copy, err, sizeof err), 0);
    if (g) {
        T_EQ_INT(gguf_n_kv(g), n);
        T_CHECK(gguf_find(g, "general.architecture") == NULL);
        const gguf_value *a, *b;
        T_EQ_INT(gguf_get_arr(src, "tokenizer.ggml.tokens", GGUF_STRING, &a), 0);
        T_EQ_INT(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &b), 0);
        int same = a->v.arr.n == b->v.arr.n && a->v.arr.n == 512;
        for (uint64_t i = 0; same && i < a->v.arr.n; i++)
            same = a->v.arr.strs[i].len == b->v.arr.strs[i].len && !memcmp(a->v.arr.strs[i].ptr, b->v.arr.strs[i].ptr, a->v.arr.strs[i].len);
        T_CHECK(same);
        T_EQ_INT(gguf_get_arr(src, "tokenizer.ggml.scores", GGUF_FLOAT32, &a), 0);
        T_EQ_INT(gguf_get_arr(g, "tokenizer.ggml.scores", GGUF_FLOAT32, &b), 0);
        T_CHECK(a->v.arr.n == b->v.arr.n && !memcmp(a->v.arr.raw, b->v.arr.raw, a->v.arr.n * 4));
        uint32_t bos;
        T_EQ_INT(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos), 0);
        T_EQ_INT(bos, 1);
    }
    gguf_close(g);
    free(copy);
    free(buf);
    gguf_close(src);
}

/* ---- hostile headers, byte by byte ------------------------------------------------------------ */

typedef struct { uint8_t *p; size_t len, cap; } hb;
static void hb_put(hb *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}
static void hb_u32(hb *b, uint32_t v) { hb_put(b, &v, 4); }
static void hb_u64(hb *b, uint64_t v) { hb_put(b, &v, 8); }
static void hb_str(hb *b, const char *s) { hb_u64(b, strlen(s)); hb_put(b, s, strlen(s)); }
static void hb_head(hb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->len = 0;
    hb_put(b, "GGUF", 4);
    hb_u32(b, version);
    hb_u64(b, n_tensors);
    hb_u64(b, n_kv);
}
static void hb_kv_u32(hb *b, const char *k, uint32_t v) { hb_str(b, k); hb_u32(b, GGUF_UINT32); hb_u32(b, v); }
static void hb_tensor(hb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    hb_str(b, name);
    hb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) hb_u64(b, ne[d]);
    hb_u32(b, type);
    hb_u64(b, off);
}
static void hb_pad(hb *b, size_t a, size_t extra) {
    static const uint8_t z[4096];
    size_t n = (b->len + a - 1) / a * a - b->len + extra;
    while (n) {
        size_t k = n < sizeof z ? n : sizeof z;
        hb_put(b, z, k);
        n -= k;
    }
}

static void expect_err(const hb *b, const char *needle, const char *what) {
    gguf_ctx *g = (gguf_ctx *)1;
    char err[256];
    void *copy;
    int rc = open_copy(b->p, b->len, &g, &copy, err, sizeof err);
    T_CHECKF(rc < 0 && g == NULL, "%s: accepted (rc %d)", what, rc);
    T_CHECKF(strstr(err, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, needle);
    T_CHECKF(strncmp(err, "<memory>: ", 10) == 0, "%s: message \"%s\" does not start with the source", what, err);
    if (!rc) gguf_close(g);
    free(copy);
}

static void expect_ok(const hb *b, const char *what) {
    gguf_ctx *g;
    char err[256];
    void *copy;
    int rc = open_copy(b->p, b->len, &g, &copy, err, sizeof err);
    T_CHECKF(rc == 0, "%s: %s", what, err);
    gguf_close(g);
    free(copy);
}

static void test_hostile(void) {
    hb b = { 0 };
    const uint64_t ne32[] = { 32 }, ne2[] = { 8, 4 }, ne5[] = { 1, 1, 1, 1, 1 };

    /* a valid minimal file first, in v2 and v3: the builder is right */
    for (uint32_t v = 2; v <= 3; v++) {
        hb_head(&b, v, 1, 1);
        hb_kv_u32(&b, "k", 5);
        hb_tensor(&b, "t", 1, ne32, DT_F32, 0);
        hb_pad(&b, 32, 128);
        expect_ok(&b, v == 2 ? "minimal v2" : "minimal v3");
    }

    hb_head(&b, 3, 0, 0);
    memcpy(b.p, "GGML", 4);
    expect_err(&b, "bad magic", "wrong magic");
    hb_head(&b, 3, 0, 0);
    memcpy(b.p, "FUGG", 4);
    expect_err(&b, "big-endian", "reversed magic");
    hb_head(&b, 0x03000000u, 0, 0);
    expect_err(&b, "big-endian", "big-endian version");
    hb_head(&b, 1, 0, 0);
    expect_err(&b, "version 1", "version 1");
    hb_head(&b, 99, 0, 0);
    expect_err(&b, "unknown GGUF version 99", "version 99");
    b.len = 0;
    expect_err(&b, "bad magic", "empty");
    hb_head(&b, 3, 0, 0);
    b.len = 10;
    expect_err(&b, "truncated", "cut in the version/counts");

    hb_head(&b, 3, 1ull << 62, 0);
    hb_pad(&b, 32, 64);
    expect_err(&b, "tensor count", "absurd tensor count");
    hb_head(&b, 3, 0, UINT64_MAX);
    hb_pad(&b, 32, 64);
    expect_err(&b, "metadata count", "absurd kv count");

    hb_head(&b, 3, 0, 1);
    hb_u64(&b, 1ull << 40); /* key length */
    hb_put(&b, "abc", 3);
    hb_pad(&b, 32, 32);
    expect_err(&b, "past the end", "key length past the end");
    hb_head(&b, 3, 0, 1);
    hb_str(&b, "k");
    hb_u32(&b, GGUF_STRING);
    hb_u64(&b, 1000);
    hb_put(&b, "short", 5);
    expect_err(&b, "past the end", "string value past the end");
    hb_head(&b, 3, 0, 1);
    hb_u64(&b, 0);
    hb_u32(&b, GGUF_UINT8);
    hb_put(&b, "x", 1);
    expect_err(&b, "invalid length", "empty key");
    hb_head(&b, 3, 0, 1);
    hb_str(&b, "k");
    hb_u32(&b, 13);
    hb_u32(&b, 0);
    expect_err(&b, "unknown value type", "unknown value type");
    hb_head(&b, 3, 0, 1);
    hb_str(&b, "k");
    hb_u32(&b, GGUF_ARRAY);
    hb_u32(&b, GGUF_UINT32);
    hb_u64(&b, 1ull << 61);
    hb_pad(&b, 32, 64);
    expect_err(&b, "array of", "absurd array length");
    hb_head(&b, 3, 0, 1);
    hb_str(&b, "k");
    hb_u32(&b, GGUF_ARRAY);
    hb_u32(&b, GGUF_STRING);
    hb_u64(&b, 3);
    hb_str(&b, "a");
    hb_u64(&b, 100);
    expect_err(&b, "past the end", "string in array past the end");
    hb_head(&b, 3, 0, 1);
    hb_str(&b, "k");
    hb_u32(&b, GGUF_ARRAY);
    hb_u32(&b, 77);
    hb_u64(&b, 0);
    expect_err(&b, "unknown array element type", "unknown array element type");
    hb_head(&b, 3, 0, 1);
    hb_str(&b, "k");
    hb_u32(&b, GGUF_ARRAY);
    for (int i = 0; i < 12; i++) { hb_u32(&b, GGUF_ARRAY); hb_u64(&b, 1); }
    hb_u32(&b, GGUF_UINT8);
    hb_u64(&b, 0);
    expect_err(&b, "nested deeper", "arrays nested too deep");

    hb_head(&b, 3, 0, 1);
    hb_str(&b, "general.alignment");
    hb_u32(&b, GGUF_UINT64);
    hb_u64(&b, 32);
    expect_err(&b, "must be u32", "alignment of the wrong type");
    hb_head(&b, 3, 0, 1);
    hb_kv_u32(&b, "general.alignment", 48);
    expect_err(&b, "power of two", "alignment 48");
    hb_head(&b, 3, 0, 1);
    hb_kv_u32(&b, "general.alignment", 0);
    expect_err(&b, "power of two", "alignment 0");
    hb_head(&b, 3, 0, 2);
    hb_kv_u32(&b, "dup", 1);
    hb_kv_u32(&b, "dup", 2);
    expect_err(&b, "duplicate metadata key 'dup'", "duplicate key");

    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 5, ne5, DT_F32, 0);
    hb_pad(&b, 32, 64);
    expect_err(&b, "5 dimensions", "n_dims 5");
    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 0, ne5, DT_F32, 0);
    hb_pad(&b, 32, 64);
    expect_err(&b, "0 dimensions", "n_dims 0");
    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 1, ne32, 99, 0);
    hb_pad(&b, 32, 64);
    expect_err(&b, "unknown tensor type 99", "unknown tensor type");
    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 1, ne32, 4, 0); /* 4 and 5 were Q4_2/Q4_3, long removed */
    hb_pad(&b, 32, 64);
    expect_err(&b, "unknown tensor type 4", "removed tensor type");
    {
        const uint64_t big[] = { 1ull << 41 }, zero[] = { 0 }, two[] = { 1ull << 30, 1ull << 30 }, odd[] = { 33 };
        hb_head(&b, 3, 1, 0);
        hb_tensor(&b, "t", 1, big, DT_F32, 0);
        hb_pad(&b, 32, 64);
        expect_err(&b, "absurd dimension", "dimension 2^41");
        hb_head(&b, 3, 1, 0);
        hb_tensor(&b, "t", 1, zero, DT_F32, 0);
        hb_pad(&b, 32, 64);
        expect_err(&b, "absurd dimension", "dimension 0");
        hb_head(&b, 3, 1, 0);
        hb_tensor(&b, "t", 2, two, DT_F32, 0);
        hb_pad(&b, 32, 64);
        expect_err(&b, "absurd dimension", "2^60 elements");
        hb_head(&b, 3, 1, 0);
        hb_tensor(&b, "t", 1, odd, DT_Q8_0, 0);
        hb_pad(&b, 32, 64);
        expect_err(&b, "block size", "row not a multiple of the block");
    }
    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 1, ne32, DT_F32, 1ull << 40);
    hb_pad(&b, 32, 256);
    expect_err(&b, "runs past the end", "offset past EOF");
    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 1, ne32, DT_F32, UINT64_MAX - 31);
    hb_pad(&b, 32, 256);
    expect_err(&b, "runs past the end", "offset near 2^64");
    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 2, ne2, DT_F32, 0);
    hb_pad(&b, 32, 127); /* needs 128 */
    expect_err(&b, "runs past the end", "data one byte short");
    hb_head(&b, 3, 1, 0);
    hb_tensor(&b, "t", 1, ne32, DT_F32, 16);
    hb_pad(&b, 32, 256);
    expect_err(&b, "not aligned", "misaligned offset");
    hb_head(&b, 3, 1, 1);
    hb_kv_u32(&b, "general.alignment", 64);
    hb_tensor(&b, "t", 1, ne32, DT_F32, 32);
    hb_pad(&b, 64, 256);
    expect_err(&b, "not aligned to 64", "offset aligned to 32 but not 64");
    hb_head(&b, 3, 2, 0);
    hb_tensor(&b, "same", 1, ne32, DT_F32, 0);
    hb_tensor(&b, "same", 1, ne32, DT_F32, 128);
    hb_pad(&b, 32, 256);
    expect_err(&b, "duplicate tensor name 'same'", "duplicate tensor names");
    hb_head(&b, 3, 1, 0);
    hb_u64(&b, 1ull << 33); /* tensor name length */
    hb_pad(&b, 32, 64);
    expect_err(&b, "past the end", "tensor name past the end");
    hb_head(&b, 3, 2, 0);
    hb_tensor(&b, "t", 1, ne32, DT_F32, 0);
    hb_u64(&b, 1000); /* second name: longer than what is left */
    hb_pad(&b, 8, 40);
    expect_err(&b, "past the end", "second tensor name past the end");
    hb_head(&b, 3, 2, 0);
    hb_tensor(&b, "tensor_with_a_long_name", 1, ne32, DT_F32, 0);
    hb_str(&b, "u");
    hb_u32(&b, 2);
    hb_u64(&b, 32);
    hb_put(&b, "1234567", 7); /* the counts fit, the second dimension does not */
    expect_err(&b, "truncated", "second tensor info cut in its dimensions");

    /* many duplicate-free tensors are accepted and checked quickly (no quadratic blow-up) */
    {
        const int n = 20000;
        hb_head(&b, 3, (uint64_t)n, 0);
        char nm[32];
        const uint64_t one[] = { 1 };
        for (int i = 0; i < n; i++) {
            snprintf(nm, sizeof nm, "t%d", i);
            hb_tensor(&b, nm, 1, one, DT_F32, (uint64_t)i * 32);
        }
        hb_pad(&b, 32, (size_t)n * 32);
        expect_ok(&b, "20000 tensors");
        memcpy(b.p + 24 + 8, "t1", 2); /* first name "t0" -> "t1": a duplicate of the second */
        expect_err(&b, "duplicate tensor name 't1'", "duplicate among 20000");
    }
    free(b.p);
}

/* ---- truncation of the real model ------------------------------------------------------------ */

static void test_truncation(void) {
    FILE *f = fopen(T_MODELS "stories260K.gguf", "rb");
    T_CHECK(f != NULL);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *all = malloc((size_t)size);
    T_EQ_INT(fread(all, 1, (size_t)size, f), size);
    fclose(f);

    gguf_ctx *g;
    char err[256];
    T_EQ_INT(gguf_open_mem(all, (size_t)size, &g, err, sizeof err), 0);
    uint64_t data_off = gguf_data_offset(g), end = data_off;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (data_off + t->offset + t->nbytes > end) end = data_off + t->offset + t->nbytes;
    }
    mdl_model *m;
    T_EQ_INT(mdl_from_gguf(g, &m, err, sizeof err), 0);
    mdl_free(m);

    int accepted = 0, no_msg = 0, tried = 0;
    /* every offset of the header, then every 997th byte of the data */
    for (uint64_t n = 0; n < end; n += n < data_off + 64 ? 1 : 997) {
        void *copy;
        gguf_ctx *tg;
        int rc = open_copy(all, n, &tg, &copy, err, sizeof err);
        tried++;
        if (rc == 0) {
            accepted++;
            /* mdl_from_gguf must cope too; close whatever it leaves us */
            if (mdl_from_gguf(tg, &m, err, sizeof err) == 0) mdl_free(m);
            else gguf_close(tg);
        } else if (!err[0]) no_msg++;
        free(copy);
    }
    printf("  truncation: %d prefixes tried (header %llu bytes, tensors end at %llu of %ld)\n", tried,
           (unsigned long long)data_off, (unsigned long long)end, size);
    T_EQ_INT(accepted, 0);
    T_EQ_INT(no_msg, 0);
    free(all);
}

/* A file whose tensors all fit is accepted however much trailing padding is cut. */
static void test_mdl_on_written(void) {
    gguf_writer *w;
    T_EQ_INT(gguf_w_create(&w), 0);
    gguf_w_set_str(w, "general.architecture", "llama");
    gguf_w_set_u32(w, "llama.embedding_length", 32);
    gguf_w_set_u32(w, "llama.block_count", 1);
    gguf_w_set_u32(w, "llama.feed_forward_length", 64);
    gguf_w_set_u32(w, "llama.attention.head_count", 4);
    gguf_w_set_u32(w, "llama.attention.head_count_kv", 2);
    gguf_w_set_u32(w, "llama.vocab_size", 16);
    gguf_w_set_u32(w, "llama.context_length", 256);
    gguf_w_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    struct { const char *n; int64_t a, b; } ts[] = {
        { "token_embd.weight", 32, 16 }, { "output_norm.weight", 32, 1 }, { "output.weight", 32, 16 },
        { "blk.0.attn_norm.weight", 32, 1 }, { "blk.0.attn_q.weight", 32, 32 }, { "blk.0.attn_k.weight", 32, 16 },
        { "blk.0.attn_v.weight", 32, 16 }, { "blk.0.attn_output.weight", 32, 32 }, { "blk.0.ffn_norm.weight", 32, 1 },
        { "blk.0.ffn_gate.weight", 32, 64 }, { "blk.0.ffn_up.weight", 32, 64 }, { "blk.0.ffn_down.weight", 64, 32 },
    };
    uint64_t total = 0;
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        int64_t ne[2] = { ts[i].a, ts[i].b };
        T_EQ_INT(gguf_w_add_tensor(w, ts[i].n, ts[i].b == 1 ? DT_F32 : DT_Q8_0, ts[i].b == 1 ? 1 : 2, ne), 0);
        total += gguf_w_tensor_nbytes(w, (int64_t)i);
    }
    uint8_t *data = calloc(1, total);
    char *buf = NULL;
    size_t len = 0;
    T_EQ_INT(write_mem(w, data, total, &buf, &len), 0);
    gguf_w_destroy(w);
    gguf_ctx *g;
    char err[256];
    void *copy;
    T_EQ_INT(open_copy(buf, len, &g, &copy, err, sizeof err), 0);
    mdl_model *m = NULL;
    int rc = g ? mdl_from_gguf(g, &m, err, sizeof err) : -1;
    T_CHECKF(rc == 0, "%s", err);
    if (rc == 0) {
        T_EQ_INT(m->cfg.n_embd, 32);
        T_EQ_INT(m->cfg.n_head_kv, 2);
        T_EQ_INT(m->cfg.n_vocab, 16);
        T_EQ_INT(m->layers[0].w_down.type, DT_Q8_0);
        mdl_free(m);
    } else gguf_close(g);
    free(copy);
    free(buf);
    free(data);
}

/* ---- architectures: mistral and qwen2 files written here ------------------------------------ */

/* A writer with a 2-layer model's hyper-parameters for arch: n_embd 32, 4 heads of 8, 2 KV
 * heads, n_ff 64, 16 tokens, context 512 and RMS epsilon 1e-5 (the two keys llama.cpp
 * requires). The caller adds keys (a later set overrides), then calls load_arch(). */
static gguf_writer *arch_writer(const char *arch) {
    gguf_writer *w;
    if (gguf_w_create(&w)) return NULL;
    char key[96];
    const struct { const char *k; uint32_t v; } u[] = {
        { "embedding_length", 32 }, { "block_count", 2 }, { "feed_forward_length", 64 }, { "attention.head_count", 4 },
        { "attention.head_count_kv", 2 }, { "vocab_size", 16 }, { "context_length", 512 },
    };
    gguf_w_set_str(w, "general.architecture", arch);
    for (size_t i = 0; i < sizeof u / sizeof *u; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, u[i].k);
        gguf_w_set_u32(w, key, u[i].v);
    }
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_w_set_f32(w, key, 1e-5f);
    return w;
}

typedef struct { char n[48]; int64_t a, b; } mtensor;

static void mtensor_add(mtensor *ts, int *k, const char *name, int64_t a, int64_t b) {
    snprintf(ts[*k].n, sizeof ts[*k].n, "%s", name);
    ts[*k].a = a;
    ts[*k].b = b;
    (*k)++;
}

/* Adds the tensors (Q/K/V biases when bias_k_len > 0, with that length for K's; no
 * output.weight when tied), writes the file into memory and builds the model. On success the
 * model reads from *copy, which the caller frees after mdl_free. Consumes w. */
static int load_arch(gguf_writer *w, int64_t bias_k_len, int tied, mdl_model **m, void **copy, char *err, size_t errlen) {
    *m = NULL;
    *copy = NULL;
    mtensor ts[40];
    int k = 0;
    mtensor_add(ts, &k, "token_embd.weight", 32, 16);
    mtensor_add(ts, &k, "output_norm.weight", 32, 1);
    if (!tied) mtensor_add(ts, &k, "output.weight", 32, 16);
    for (int l = 0; l < 2; l++) {
        static const struct { const char *s; int64_t a, b; } per[] = {
            { "attn_norm.weight", 32, 1 }, { "attn_q.weight", 32, 32 }, { "attn_k.weight", 32, 16 }, { "attn_v.weight", 32, 16 },
            { "attn_output.weight", 32, 32 }, { "ffn_norm.weight", 32, 1 }, { "ffn_gate.weight", 32, 64 },
            { "ffn_up.weight", 32, 64 }, { "ffn_down.weight", 64, 32 },
        };
        char nm[48];
        for (size_t i = 0; i < sizeof per / sizeof *per; i++) {
            snprintf(nm, sizeof nm, "blk.%d.%s", l, per[i].s);
            mtensor_add(ts, &k, nm, per[i].a, per[i].b);
        }
        if (bias_k_len > 0) {
            snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", l);
            mtensor_add(ts, &k, nm, 32, 1);
            snprintf(nm, sizeof nm, "blk.%d.attn_k.bias", l);
            mtensor_add(ts, &k, nm, bias_k_len, 1);
            snprintf(nm, sizeof nm, "blk.%d.attn_v.bias", l);
            mtensor_add(ts, &k, nm, 16, 1);
        }
    }
    uint64_t total = 0;
    int rc = 0;
    for (int i = 0; i < k && !rc; i++) {
        int64_t ne[2] = { ts[i].a, ts[i].b };
        rc = gguf_w_add_tensor(w, ts[i].n, ts[i].b == 1 ? DT_F32 : DT_Q8_0, ts[i].b == 1 ? 1 : 2, ne);
        total += rc ? 0 : gguf_w_tensor_nbytes(w, i);
    }
    uint8_t *data = calloc(1, total);
    char *buf = NULL;
    size_t len = 0;
    if (!rc) rc = data ? write_mem(w, data, total, &buf, &len) : CM_ENOMEM;
    gguf_w_destroy(w);
    free(data);
    if (rc) {
        snprintf(err, errlen, "writing the file failed (%d)", rc);
        free(buf);
        return rc;
    }
    gguf_ctx *g;
    rc = open_copy(buf, len, &g, copy, err, errlen);
    free(buf);
    if (!rc && (rc = mdl_from_gguf(g, m, err, errlen))) gguf_close(g);
    if (rc) {
        free(*copy);
        *copy = NULL;
    }
    return rc;
}

static void test_mdl_mistral(void) {
    char err[256];
    mdl_model *m;
    void *copy;
    gguf_writer *w = arch_writer("mistral");
    gguf_w_set_u32(w, "mistral.context_length", 32768);
    gguf_w_set_f32(w, "mistral.rope.freq_base", 1000000.0f);
    gguf_w_set_f32(w, "mistral.attention.layer_norm_rms_epsilon", 1e-6f);
    int rc = load_arch(w, 0, 0, &m, &copy, err, sizeof err);
    T_CHECKF(rc == 0, "mistral: %s", err);
    if (rc == 0) {
        const mdl_config *c = &m->cfg;
        T_EQ_INT(c->arch, MDL_ARCH_MISTRAL);
        T_EQ_STR(c->arch_name, "mistral");
        T_EQ_INT(c->n_layer, 2);
        T_EQ_INT(c->n_head, 4);
        T_EQ_INT(c->n_head_kv, 2);
        T_EQ_INT(c->head_dim, 8);
        T_EQ_INT(c->rope_dim, 8);
        T_EQ_INT(c->n_ctx_train, 32768);
        T_NEAR(c->rope_base, 1e6, 0);
        T_NEAR(c->norm_eps, 1e-6, 1e-12);
        T_EQ_INT(c->rope_layout, MDL_ROPE_ADJACENT); /* llama.cpp permutes mistral's Q/K like llama's */
        T_EQ_INT(c->rope_scaling, MDL_ROPE_SCALING_NONE);
        T_NEAR(c->rope_factor, 1, 0);
        T_EQ_INT(c->has_qkv_bias, 0);
        T_EQ_INT(c->tied_output, 0);
        T_CHECK(m->output.data != NULL && m->output.data != m->tok_embd.data);
        T_CHECK(m->layers[1].bq.data == NULL && m->layers[1].bk.data == NULL && m->layers[1].bv.data == NULL);
        mdl_free(m);
        free(copy);
    }
    /* older files: linear scaling as rope.scale_linear */
    w = arch_writer("mistral");
    gguf_w_set_f32(w, "mistral.rope.scale_linear", 4.0f);
    rc = load_arch(w, 0, 0, &m, &copy, err, sizeof err);
    T_CHECKF(rc == 0, "mistral scale_linear: %s", err);
    if (rc == 0) {
        T_EQ_INT(m->cfg.rope_scaling, MDL_ROPE_SCALING_LINEAR);
        T_NEAR(m->cfg.rope_factor, 4, 0);
        mdl_free(m);
        free(copy);
    }
}

static void test_mdl_qwen2(void) {
    char err[256];
    mdl_model *m;
    void *copy;
    /* Q/K/V biases, tied output, llama3-style scaling keys */
    gguf_writer *w = arch_writer("qwen2");
    gguf_w_set_f32(w, "qwen2.rope.freq_base", 500000.0f);
    gguf_w_set_str(w, "qwen2.rope.scaling.type", "llama3");
    gguf_w_set_f32(w, "qwen2.rope.scaling.factor", 8.0f);
    gguf_w_set_u32(w, "qwen2.rope.scaling.original_context_length", 4096);
    int rc = load_arch(w, 16, 1, &m, &copy, err, sizeof err);
    T_CHECKF(rc == 0, "qwen2: %s", err);
    if (rc == 0) {
        const mdl_config *c = &m->cfg;
        T_EQ_INT(c->arch, MDL_ARCH_QWEN2);
        T_EQ_STR(c->arch_name, "qwen2");
        T_EQ_INT(c->rope_layout, MDL_ROPE_HALF); /* qwen2 GGUFs keep HF's unpermuted Q/K */
        T_NEAR(c->rope_base, 500000, 0);
        T_EQ_INT(c->rope_scaling, MDL_ROPE_SCALING_LLAMA3);
        T_NEAR(c->rope_factor, 8, 0);
        T_EQ_INT(c->rope_orig_ctx, 4096);
        T_NEAR(c->rope_low_freq_factor, 1, 0);
        T_NEAR(c->rope_high_freq_factor, 4, 0);
        T_EQ_INT(c->has_qkv_bias, 1);
        T_EQ_INT(c->tied_output, 1);
        T_CHECK(m->output.data != NULL && m->output.data == m->tok_embd.data);
        T_EQ_INT(m->output.ne[0], 32);
        T_EQ_INT(m->output.ne[1], 16);
        for (int l = 0; l < 2; l++) {
            T_CHECK(m->layers[l].bq.data && m->layers[l].bk.data && m->layers[l].bv.data);
            T_EQ_INT(m->layers[l].bq.ne[0], 32);
            T_EQ_INT(m->layers[l].bk.ne[0], 16);
            T_EQ_INT(m->layers[l].bv.ne[0], 16);
            T_EQ_INT(m->layers[l].bk.type, DT_F32);
        }
        mdl_free(m);
        free(copy);
    }
    /* linear scaling through the scaling keys; no biases, separate output */
    w = arch_writer("qwen2");
    gguf_w_set_str(w, "qwen2.rope.scaling.type", "linear");
    gguf_w_set_f32(w, "qwen2.rope.scaling.factor", 2.0f);
    rc = load_arch(w, 0, 0, &m, &copy, err, sizeof err);
    T_CHECKF(rc == 0, "qwen2 linear: %s", err);
    if (rc == 0) {
        T_EQ_INT(m->cfg.rope_scaling, MDL_ROPE_SCALING_LINEAR);
        T_NEAR(m->cfg.rope_factor, 2, 0);
        T_EQ_INT(m->cfg.rope_layout, MDL_ROPE_HALF);
        T_EQ_INT(m->cfg.has_qkv_bias, 0);
        T_EQ_INT(m->cfg.tied_output, 0);
        mdl_free(m);
        free(copy);
    }
    /* a K bias of Q's length (32, not n_head_kv * head_dim = 16) is refused, naming it */
    rc = load_arch(arch_writer("qwen2"), 32, 1, &m, &copy, err, sizeof err);
    T_EQ_INT(rc, CM_EFORMAT);
    T_CHECKF(strstr(err, "blk.0.attn_k.bias") != NULL, "%s", err);
    if (rc == 0) { mdl_free(m); free(copy); }
    /* a scaling type we do not implement is refused, not ignored */
    w = arch_writer("qwen2");
    gguf_w_set_str(w, "qwen2.rope.scaling.type", "dynamic");
    rc = load_arch(w, 16, 1, &m, &copy, err, sizeof err);
    T_EQ_INT(rc, CM_EUNSUPPORTED);
    T_CHECKF(strstr(err, "dynamic") != NULL, "%s", err);
    if (rc == 0) { mdl_free(m); free(copy); }
}

int main(void) {
    for (uint32_t v = 2; v <= 3; v++) roundtrip(v, 0, 0);
    const uint32_t aligns[] = { 1, 8, 32, 64, 4096 };
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) roundtrip(3, aligns[i], 0);
    roundtrip(3, 64, 1);
    test_writer_errors();
    test_copy_kv();
    test_hostile();
    test_truncation();
    test_mdl_on_written();
    test_mdl_mistral();
    test_mdl_qwen2();
    return t_done();
}
