/* safetensors: Hugging Face checkpoints (config.json + one or more .safetensors shards) into
 * the same mdl_model the GGUF path builds.
 *
 * Accepted paths: a directory holding config.json and either model.safetensors or
 * model.safetensors.index.json (whose weight_map names the shards), or a single .safetensors
 * file with config.json beside it. Each shard is mmapped read-only; its header (8-byte
 * little-endian length, then JSON {name: {dtype, shape, data_offsets}, "__metadata__": {...}})
 * is checked completely before any tensor is used: header length within the file and under
 * ST_MAX_HEADER, tensors tiling the data section exactly (sorted by offset, no overlap, no
 * gap, nothing after the last one, as the reference implementation requires), byte size =
 * product(shape) * element size, ranks <= 4, dims sane. A hostile file gives a one-line error
 * "PATH: problem", never a crash or an unbounded allocation.
 *
 * Shapes: safetensors shapes are row-major [out, in]; mdl_tensor.ne is GGUF order, ne[0]
 * contiguous, so ne[0] = shape[rank-1], ne[1] = shape[rank-2], ...; no data is copied.
 *
 * Rotary layout. HF llama/mistral/qwen2 checkpoints apply RoPE to the two halves of each head
 * (x[i], x[i + head_dim/2]); llama.cpp's converter instead permutes the rows of q_proj and
 * k_proj so that adjacent pairs (x[2i], x[2i+1]) rotate. ArkaTensor permutes nothing: every
 * safetensors model gets cfg.rope_layout = MDL_ROPE_HALF and the engine uses the half-split
 * rotation with the weights exactly as stored. mdl_permute_qk_hf_to_gguf() below is the
 * converter's permutation, for tests that check both layouts describe the same network:
 * per head h, GGUF row h*hd + 2*i + t = HF row h*hd + t*hd/2 + i (t in {0, 1},
 * i < hd/2), i.e. numpy's w.reshape(n_head, 2, hd/2, n_embd).swapaxes(1, 2).reshape(w.shape),
 * with n_head = num_key_value_heads for k_proj.
 *
 * Norm weights and QKV biases: HF stores them in the checkpoint's dtype (often BF16/F16). They
 * are converted here, at load, into F32 buffers owned by the safetensors state, so every
 * mdl_model carries F32 norm vectors and F32 biases (as GGUF files do). Large matrices stay
 * mapped in their own dtype (F32, F16 or BF16). A matrix whose data is not aligned to its
 * element size inside the file is copied into an aligned owned buffer (one warning per load).
 *
 * Called from the loading thread only (mdl_load); the result is immutable afterwards.
 */
#include "model_internal.h"
#include "dtype.h"
#include "../common/cm_err.h"
#include "../common/cm_json.h"
#include "../common/cm_log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER   (100u << 20) /* bytes of one shard's JSON header */
#define ST_MAX_JSON     (64u << 20)  /* config.json, the index file */
#define ST_MAX_SHARDS   4096
#define ST_MAX_RANK     4
#define ST_MAX_DIM      (INT64_C(1) << 40)

typedef struct st_shard {
    char       *path;
    void       *map;      /* whole file, read-only */
    size_t      size;
    uint64_t    data_off; /* 8 + header length: where data_offsets count from */
} st_shard;

typedef struct st_entry {
    char    *name;
    int      shard;
    int      type;        /* enum dt_type, or -1 when the dtype is one ArkaTensor cannot use */
    char     dtype[16];   /* as written in the header */
    size_t   esize;       /* bytes per element */
    int      n_dims;
    int64_t  shape[ST_MAX_RANK]; /* row-major, as in the header */
    uint64_t begin, end;  /* relative to the shard's data section */
    int      used;        /* taken into the model (or deliberately skipped) */
} st_entry;

typedef struct st_state {
    st_shard *shards;
    int       n_shards;
    st_entry *entries;    /* sorted by name once every shard is read */
    size_t    n_entries, cap_entries;
    void    **owned;      /* F32 conversions and realigned copies */
    size_t    n_owned, cap_owned;
    size_t    n_realigned; /* matrices copied because their data was misaligned in the file */
    uint64_t  realigned_bytes;
    const mdl__fp8 *fp8;   /* the checkpoint's quantization_config while tensors are taken, else NULL */
    size_t    n_in_scales; /* static activation scales recorded (informational) */
} st_state;

void mdl__st_free(void *p) {
    st_state *st = p;
    if (!st) return;
    for (int i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map) munmap(st->shards[i].map, st->shards[i].size);
        free(st->shards[i].path);
    }
    free(st->shards);
    for (size_t i = 0; i < st->n_entries; i++) free(st->entries[i].name);
    free(st->entries);
    for (size_t i = 0; i < st->n_owned; i++) free(st->owned[i]);
    free(st->owned);
    free(st);
}

/* ---- files ---------------------------------------------------------------------------- */

/* Reads a whole small file into a malloc'ed buffer (cap bytes at most). */
static int read_small(const char *path, size_t cap, char **out, size_t *len, char *err, size_t errlen) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT ? CM_ENOENT : CM_EIO;
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return CM_EIO;
    }
    if ((uint64_t)sb.st_size > cap) {
        snprintf(err, errlen, "%s: file of %lld bytes is larger than the %zu MiB cap", path, (long long)sb.st_size, cap >> 20);
        close(fd);
        return CM_ETOOBIG;
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "%s: out of memory", path);
        return CM_ENOMEM;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s: read failed: %s", path, r ? strerror(errno) : "file shrank");
            free(buf);
            close(fd);
            return CM_EIO;
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
}

int mdl__read_json(const char *path, cm_json_doc **doc, char *err, size_t errlen) {
    char *text;
    size_t len;
    int rc = read_small(path, ST_MAX_JSON, &text, &len, err, errlen);
    if (rc) return rc;
    char jerr[160];
    rc = cm_json_parse(text, len, doc, jerr, sizeof jerr);
    free(text);
    if (rc) {
        snprintf(err, errlen, "%s: malformed JSON: %s", path, jerr);
        return rc == CM_ENOMEM ? rc : CM_EFORMAT;
    }
    if (cm_json_root(*doc)->type != CM_JSON_OBJECT) {
        snprintf(err, errlen, "%s: top-level JSON value is not an object", path);
        cm_json_free(*doc);
        *doc = NULL;
        return CM_EFORMAT;
    }
    return 0;
}

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- one shard's header ---------------------------------------------------------------- */

static const struct { const char *name; int type; size_t esize; } dtypes[] = {
    { "F32", DT_F32, 4 }, { "F16", DT_F16, 2 }, { "BF16", DT_BF16, 2 },
    { "F8_E4M3", DT_F8_E4M3, 1 }, /* linear layers of FP8 checkpoints only (mdl__st_take WEIGHT) */
    /* Known to the format, not usable by ArkaTensor: sizes are still checked. */
    { "F64", -1, 8 }, { "I64", -1, 8 }, { "U64", -1, 8 }, { "I32", -1, 4 }, { "U32", -1, 4 },
    { "I16", -1, 2 }, { "U16", -1, 2 }, { "I8", -1, 1 }, { "U8", -1, 1 }, { "BOOL", -1, 1 },
    { "F8_E5M2", -1, 1 }, { "F8_E8M0", -1, 1 },
};

static int add_entry(st_state *st, st_entry *e) {
    if (st->n_entries == st->cap_entries) {
        size_t cap = st->cap_entries ? st->cap_entries * 2 : 256;
        st_entry *n = realloc(st->entries, cap * sizeof *n);
        if (!n) return CM_ENOMEM;
        st->entries = n;
        st->cap_entries = cap;
    }
    st->entries[st->n_entries++] = *e;
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

/* Parses one tensor's {dtype, shape, data_offsets} into e. */
static int parse_tensor_info(const cm_json *v, const char *path, st_entry *e, char *err, size_t errlen) {
    const char *name = v->key;
    if (v->type != CM_JSON_OBJECT) {
        snprintf(err, errlen, "%s: header entry '%s' is not an object", path, name);
        return CM_EFORMAT;
    }
    const char *dt;
    if (cm_json_get_str(v, "dtype", &dt)) {
        snprintf(err, errlen, "%s: tensor '%s' has no string 'dtype'", path, name);
        return CM_EFORMAT;
    }
    e->type = -2;
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (!strcmp(dt, dtypes[i].name)) {
            e->type = dtypes[i].type;
            e->esize = dtypes[i].esize;
        }
    if (e->type == -2) {
        snprintf(err, errlen, "%s: tensor '%s' has unknown dtype '%.16s'", path, name, dt);
        return CM_EUNSUPPORTED;
    }
    snprintf(e->dtype, sizeof e->dtype, "%s", dt);

    const cm_json *shape = cm_json_get(v, "shape"), *offs = cm_json_get(v, "data_offsets");
    if (!shape || shape->type != CM_JSON_ARRAY) {
        snprintf(err, errlen, "%s: tensor '%s' has no 'shape' array", path, name);
        return CM_EFORMAT;
    }
    if (shape->n > ST_MAX_RANK) {
        snprintf(err, errlen, "%s: tensor '%s' has rank %zu (at most %d supported)", path, name, shape->n, ST_MAX_RANK);
        return CM_EUNSUPPORTED;
    }
    uint64_t nelem = 1;
    e->n_dims = (int)shape->n;
    int d = 0;
    for (const cm_json *c = shape->child; c; c = c->next, d++) {
        if (c->type != CM_JSON_NUMBER || !c->is_int || c->i < 0 || c->i > ST_MAX_DIM) {
            snprintf(err, errlen, "%s: tensor '%s' has an invalid or absurd dimension in 'shape'", path, name);
            return CM_EFORMAT;
        }
        e->shape[d] = c->i;
        if (__builtin_mul_overflow(nelem, (uint64_t)c->i, &nelem) || nelem > ST_MAX_DIM * 16) {
            snprintf(err, errlen, "%s: tensor '%s' has an absurd element count", path, name);
            return CM_EFORMAT;
        }
    }
    if (!offs || offs->type != CM_JSON_ARRAY || offs->n != 2) {
        snprintf(err, errlen, "%s: tensor '%s' has no 'data_offsets' pair", path, name);
        return CM_EFORMAT;
    }
    const cm_json *b = offs->child, *en = b->next;
    if (b->type != CM_JSON_NUMBER || !b->is_int || b->i < 0 || en->type != CM_JSON_NUMBER || !en->is_int || en->i < 0) {
        snprintf(err, errlen, "%s: tensor '%s' has invalid 'data_offsets'", path, name);
        return CM_EFORMAT;
    }
    e->begin = (uint64_t)b->i;
    e->end = (uint64_t)en->i;
    if (e->begin > e->end) {
        snprintf(err, errlen, "%s: tensor '%s' has reversed data_offsets [%llu, %llu]", path, name,
                 (unsigned long long)e->begin, (unsigned long long)e->end);
        return CM_EFORMAT;
    }
    if (nelem * e->esize != e->end - e->begin) {
        snprintf(err, errlen, "%s: tensor '%s' (%s, %llu elements) needs %llu bytes but data_offsets span %llu", path, name,
                 e->dtype, (unsigned long long)nelem, (unsigned long long)(nelem * e->esize),
                 (unsigned long long)(e->end - e->begin));
        return CM_EFORMAT;
    }
    return 0;
}

/* Maps one shard and appends its tensors to st->entries. */
static int open_shard(st_state *st, const char *path, char *err, size_t errlen) {
    if (st->n_shards >= ST_MAX_SHARDS) {
        snprintf(err, errlen, "%s: more than %d shards", path, ST_MAX_SHARDS);
        return CM_ETOOBIG;
    }
    st_shard *sh = &st->shards[st->n_shards];
    memset(sh, 0, sizeof *sh);
    if (!(sh->path = strdup(path))) goto oom;
    st->n_shards++; /* from here on mdl__st_free releases it */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT ? CM_ENOENT : CM_EIO;
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        snprintf(err, errlen, "%s: not a regular file", path);
        return CM_EIO;
    }
    if (sb.st_size < 8) {
        close(fd);
        snprintf(err, errlen, "%s: file of %lld bytes is too short for a safetensors header", path, (long long)sb.st_size);
        return CM_EFORMAT;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        return CM_EIO;
    }
    sh->map = map;
    sh->size = (size_t)sb.st_size;
    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)p[i] << (8 * i);
    if (hlen > ST_MAX_HEADER) {
        snprintf(err, errlen, "%s: header length %llu exceeds the %u MiB cap", path, (unsigned long long)hlen, ST_MAX_HEADER >> 20);
        return CM_EFORMAT;
    }
    if (hlen > sh->size - 8) {
        snprintf(err, errlen, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                 (unsigned long long)hlen, sh->size);
        return CM_EFORMAT;
    }
    if (hlen < 2 || p[8] != '{') {
        snprintf(err, errlen, "%s: header is not a JSON object", path);
        return CM_EFORMAT;
    }
    sh->data_off = 8 + hlen;
    uint64_t data_size = sh->size - sh->data_off;

    cm_json_doc *doc;
    char jerr[160];
    int rc = cm_json_parse((const char *)p + 8, (size_t)hlen, &doc, jerr, sizeof jerr);
    if (rc) {
        snprintf(err, errlen, "%s: malformed header JSON: %s", path, jerr);
        return rc == CM_ENOMEM ? rc : CM_EFORMAT;
    }
    const cm_json *root = cm_json_root(doc);
    if (root->type != CM_JSON_OBJECT) {
        snprintf(err, errlen, "%s: header is not a JSON object", path);
        cm_json_free(doc);
        return CM_EFORMAT;
    }
    size_t first = st->n_entries;
    for (const cm_json *v = root->child; v; v = v->next) {
        if (!strcmp(v->key, "__metadata__")) {
            if (v->type != CM_JSON_OBJECT) {
                snprintf(err, errlen, "%s: '__metadata__' is not an object", path);
                rc = CM_EFORMAT;
                break;
            }
            continue;
        }
        if (v->key_len == 0 || strlen(v->key) != v->key_len) {
            snprintf(err, errlen, "%s: empty tensor name or one containing NUL", path);
            rc = CM_EFORMAT;
            break;
        }
        st_entry e;
        memset(&e, 0, sizeof e);
        e.shard = st->n_shards - 1;
        if ((rc = parse_tensor_info(v, path, &e, err, errlen))) break;
        if (e.end > data_size) {
            snprintf(err, errlen, "%s: tensor '%s' data_offsets [%llu, %llu] run past the end of the data (%llu bytes)", path,
                     v->key, (unsigned long long)e.begin, (unsigned long long)e.end, (unsigned long long)data_size);
            rc = CM_EFORMAT;
            break;
        }
        if (!(e.name = strdup(v->key)) || add_entry(st, &e)) {
            free(e.name);
            rc = CM_ENOMEM;
            snprintf(err, errlen, "%s: out of memory", path);
            break;
        }
    }
    cm_json_free(doc);
    if (rc) return rc;

    /* The tensors must tile the data section: sorted by offset, each starts where the previous
     * one ended, the last ends at the end of the file. */
    size_t n = st->n_entries - first;
    st_entry **order = malloc((n ? n : 1) * sizeof *order);
    if (!order) goto oom;
    for (size_t i = 0; i < n; i++) order[i] = &st->entries[first + i];
    qsort(order, n, sizeof *order, by_offset);
    uint64_t at = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const st_entry *e = order[i];
        if (e->begin < at) {
            snprintf(err, errlen, "%s: tensor '%s' data_offsets [%llu, %llu] overlap tensor '%s'", path, e->name,
                     (unsigned long long)e->begin, (unsigned long long)e->end, order[i - 1]->name);
            rc = CM_EFORMAT;
        } else if (e->begin > at) {
            snprintf(err, errlen, "%s: %llu unaccounted bytes before tensor '%s' in the data section", path,
                     (unsigned long long)(e->begin - at), e->name);
            rc = CM_EFORMAT;
        }
        at = e->end;
    }
    free(order);
    if (!rc && at != data_size) {
        snprintf(err, errlen, "%s: %llu bytes after the last tensor (data section %llu bytes, tensors end at %llu)", path,
                 (unsigned long long)(data_size - at), (unsigned long long)data_size, (unsigned long long)at);
        rc = CM_EFORMAT;
    }
    return rc;
oom:
    snprintf(err, errlen, "%s: out of memory", path);
    return CM_ENOMEM;
}

static const st_entry *find_entry(const st_state *st, const char *name) {
    st_entry key;
    key.name = (char *)name;
    return bsearch(&key, st->entries, st->n_entries, sizeof key, by_name);
}

/* Sorts the table by name for find_entry(); a name must not appear twice. */
static int sort_entries(st_state *st, char *err, size_t errlen) {
    qsort(st->entries, st->n_entries, sizeof *st->entries, by_name);
    for (size_t i = 1; i < st->n_entries; i++) {
        const st_entry *a = &st->entries[i - 1], *b = &st->entries[i];
        if (!strcmp(a->name, b->name)) {
            snprintf(err, errlen, "%s: tensor '%s' appears twice (also in %s)", st->shards[b->shard].path, b->name,
                     st->shards[a->shard].path);
            return CM_EFORMAT;
        }
    }
    return 0;
}

/* ---- shard discovery -------------------------------------------------------------------- */

static int join(char *out, size_t outlen, const char *dir, const char *name, char *err, size_t errlen) {
    int n = snprintf(out, outlen, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= outlen) {
        snprintf(err, errlen, "%s: path too long", dir);
        return CM_EINVAL;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Opens every shard the index's weight_map names and checks each mapping. */
static int open_indexed(st_state *st, const char *dir, const char *index_path, char *err, size_t errlen) {
    cm_json_doc *doc;
    int rc = mdl__read_json(index_path, &doc, err, errlen);
    if (rc) return rc;
    const cm_json *wm = cm_json_get(cm_json_root(doc), "weight_map");
    const char **files = NULL;
    if (!wm || wm->type != CM_JSON_OBJECT || wm->n == 0) {
        snprintf(err, errlen, "%s: missing or empty 'weight_map' object", index_path);
        rc = CM_EFORMAT;
        goto out;
    }
    files = malloc(wm->n * sizeof *files);
    if (!files) { rc = CM_ENOMEM; snprintf(err, errlen, "%s: out of memory", index_path); goto out; }
    size_t nf = 0;
    for (const cm_json *v = wm->child; v; v = v->next) {
        if (v->type != CM_JSON_STRING || !v->str_len || strlen(v->str) != v->str_len || strchr(v->str, '/') ||
            !strcmp(v->str, ".") || !strcmp(v->str, "..")) {
            snprintf(err, errlen, "%s: weight_map entry '%s' does not name a file in the directory", index_path, v->key);
            rc = CM_EFORMAT;
            goto out;
        }
        files[nf++] = v->str;
    }
    qsort(files, nf, sizeof *files, cmp_str);
    size_t nu = 0;
    for (size_t i = 0; i < nf; i++)
        if (!nu || strcmp(files[nu - 1], files[i])) files[nu++] = files[i];
    if (nu > ST_MAX_SHARDS) {
        snprintf(err, errlen, "%s: more than %d shards", index_path, ST_MAX_SHARDS);
        rc = CM_ETOOBIG;
        goto out;
    }
    if (!(st->shards = calloc(nu, sizeof *st->shards))) { rc = CM_ENOMEM; snprintf(err, errlen, "%s: out of memory", index_path); goto out; }
    for (size_t i = 0; i < nu; i++) {
        char p[PATH_MAX];
        if ((rc = join(p, sizeof p, dir, files[i], err, errlen))) goto out;
        if (!is_file(p)) {
            snprintf(err, errlen, "%s: shard '%s' named by the index is missing", index_path, files[i]);
            rc = CM_ENOENT;
            goto out;
        }
        if ((rc = open_shard(st, p, err, errlen))) goto out;
    }
    if ((rc = sort_entries(st, err, errlen))) goto out;
    for (const cm_json *v = wm->child; v; v = v->next) {
        const st_entry *e = find_entry(st, v->key);
        const char *base = e ? strrchr(st->shards[e->shard].path, '/') + 1 : NULL;
        if (!e || strcmp(base, v->str)) {
            snprintf(err, errlen, "%s: index maps tensor '%s' to '%s' but that shard does not hold it", index_path, v->key, v->str);
            rc = CM_EFORMAT;
            goto out;
        }
    }
out:
    free(files);
    cm_json_free(doc);
    return rc;
}

/* ---- tensors into the model ------------------------------------------------------------- */

static void *own(st_state *st, size_t bytes) {
    if (st->n_owned == st->cap_owned) {
        size_t cap = st->cap_owned ? st->cap_owned * 2 : 64;
        void **n = realloc(st->owned, cap * sizeof *n);
        if (!n) return NULL;
        st->owned = n;
        st->cap_owned = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p) st->owned[st->n_owned++] = p;
    return p;
}

int mdl__st_has(const mdl_model *m, const char *name) { return find_entry(m->st, name) != NULL; }

void mdl__st_skip(mdl_model *m, const char *name) {
    st_entry *e = (st_entry *)find_entry(m->st, name);
    if (e) e->used = 1;
}

void mdl__st_skip_prefix(mdl_model *m, const char *prefix) {
    st_state *st = m->st;
    size_t n = strlen(prefix);
    for (size_t i = 0; i < st->n_entries; i++)
        if (!strncmp(st->entries[i].name, prefix, n)) st->entries[i].used = 1;
}

static const char *float_name(int type) { return type == DT_F32 ? "F32" : type == DT_F16 ? "F16" : type == DT_BF16 ? "BF16" : NULL; }

static float elem_f32(const st_entry *e, const uint8_t *p, uint64_t i) {
    if (e->type == DT_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return e->type == DT_F16 ? dt_f16_to_f32(h) : dt_bf16_to_f32(h);
}

static const uint8_t *entry_data(const st_state *st, const st_entry *e) {
    const st_shard *sh = &st->shards[e->shard];
    return (const uint8_t *)sh->map + sh->data_off + e->begin;
}

int mdl__st_scales(mdl_model *m, const char *path, const char *name, int64_t n, const float **out, int *per_tensor, char *err,
                   size_t errlen) {
    st_state *st = m->st;
    st_entry *e = (st_entry *)find_entry(st, name);
    if (!e) return CM_ENOTFOUND;
    e->used = 1;
    uint64_t nel = e->esize ? (e->end - e->begin) / e->esize : 0;
    if (!float_name(e->type) || (nel != 1 && nel != (uint64_t)n)) {
        snprintf(err, errlen, "%s: scale tensor '%s' is %s with %llu values; expected F32, F16 or BF16 with 1 (per tensor) or %lld "
                 "(per output row or head)", path, name, e->dtype, (unsigned long long)nel, (long long)n);
        return CM_EUNSUPPORTED;
    }
    float *f = own(st, sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!f) {
        snprintf(err, errlen, "%s: out of memory", path);
        return CM_ENOMEM;
    }
    const uint8_t *src = entry_data(st, e);
    for (int64_t i = 0; i < n; i++) {
        f[i] = elem_f32(e, src, nel == 1 ? 0 : (uint64_t)i);
        if (!(f[i] >= 0) || !isfinite(f[i])) {
            snprintf(err, errlen, "%s: scale tensor '%s' holds %g at %lld (scales must be finite and >= 0)", path, name, f[i],
                     (long long)(nel == 1 ? 0 : i));
            return CM_EFORMAT;
        }
    }
    *out = f;
    if (per_tensor) *per_tensor = nel == 1;
    return 0;
}

/* A zero point beside an FP8 weight: symmetric quantization writes none or zeros. */
static int zero_point_ok(st_state *st, const char *path, const char *name, char *err, size_t errlen) {
    st_entry *z = (st_entry *)find_entry(st, name);
    if (!z) return 0;
    z->used = 1;
    const uint8_t *p = entry_data(st, z);
    for (uint64_t i = 0; i < z->end - z->begin; i++)
        if (p[i]) {
            snprintf(err, errlen, "%s: tensor '%s' is not zero: asymmetric quantization is not supported (FP8 scales are symmetric)",
                     path, name);
            return CM_EUNSUPPORTED;
        }
    return 0;
}

/* MDL__ST_WEIGHT: the scales of an F8_E4M3 matrix "X.weight" from its siblings (contract in
 * model_internal.h); a float matrix must have none. */
static int weight_scales(mdl_model *m, const char *path, const st_entry *e, mdl_tensor *t, char *err, size_t errlen) {
    st_state *st = m->st;
    const char *name = e->name;
    size_t n = strlen(name);
    char base[256], sn[288];
    int has_weight = n >= 6 && !strcmp(name + n - 6, "weight") && n - 6 < sizeof base;
    if (has_weight) snprintf(base, sizeof base, "%.*s", (int)(n - 6), name);
    static const char *const sfx[2] = { "weight_scale", "weight_scale_inv" };
    int found = -1;
    for (int i = 0; has_weight && i < 2; i++) {
        snprintf(sn, sizeof sn, "%s%s", base, sfx[i]);
        if (find_entry(st, sn)) {
            if (found >= 0) {
                snprintf(err, errlen, "%s: tensor '%s' has both %s and %s", path, name, sfx[0], sfx[1]);
                return CM_EFORMAT;
            }
            found = i;
        }
    }
    if (e->type != DT_F8_E4M3) {
        if (found >= 0) {
            snprintf(err, errlen, "%s: tensor '%s' is %s but has a %s: only F8_E4M3 weights are read with scales", path, name, e->dtype,
                     sfx[found]);
            return CM_EUNSUPPORTED;
        }
        return 0;
    }
    if (!st->fp8 || !st->fp8->on) {
        snprintf(err, errlen, "%s: tensor '%s' is F8_E4M3 but config.json has no quantization_config saying how it is scaled", path,
                 name);
        return CM_EUNSUPPORTED;
    }
    if (!has_weight || found < 0) {
        snprintf(err, errlen, "%s: F8_E4M3 tensor '%s' has no %sweight_scale (or weight_scale_inv) beside it", path, name,
                 has_weight ? base : "");
        return CM_EFORMAT;
    }
    int64_t rows = 1;
    for (int d = 0; d + 1 < e->n_dims; d++) rows *= e->shape[d];
    if (e->n_dims < 2) {
        snprintf(err, errlen, "%s: F8_E4M3 tensor '%s' is not a matrix", path, name);
        return CM_EFORMAT;
    }
    snprintf(sn, sizeof sn, "%s%s", base, sfx[found]);
    /* per tensor: [], [1], [1, 1]; per output row: [rows], [rows, 1] */
    const st_entry *se = find_entry(st, sn);
    if (se->n_dims > 2 || (se->n_dims == 2 && se->shape[1] != 1)) {
        snprintf(err, errlen, "%s: '%s' has shape [%lld, %lld%s]: block-wise FP8 scales are not implemented (per-tensor and "
                 "per-channel scales are)", path, sn, (long long)se->shape[0], (long long)se->shape[1], se->n_dims > 2 ? ", ..." : "");
        return CM_EUNSUPPORTED;
    }
    int per_tensor = 0, rc;
    if ((rc = mdl__st_scales(m, path, sn, rows, &t->scale, &per_tensor, err, errlen))) return rc;
    /* NaN codes (0x7f, 0xff) in weights: a broken file; the kernels assume finite codes */
    const uint8_t *q = entry_data(st, e);
    for (uint64_t i = 0; i < e->end - e->begin; i++)
        if ((q[i] & 0x7f) == 0x7f) {
            snprintf(err, errlen, "%s: F8_E4M3 tensor '%s' holds a NaN code at element %llu", path, name, (unsigned long long)i);
            return CM_EFORMAT;
        }
    t->scale_per_tensor = per_tensor;
    snprintf(sn, sizeof sn, "%sinput_scale", base);
    const float *in = NULL;
    rc = mdl__st_scales(m, path, sn, 1, &in, NULL, err, errlen);
    if (rc && rc != CM_ENOTFOUND) return rc;
    if (!rc) {
        t->in_scale = in[0];
        st->n_in_scales++;
    }
    snprintf(sn, sizeof sn, "%sweight_zero_point", base);
    if ((rc = zero_point_ok(st, path, sn, err, errlen))) return rc;
    snprintf(sn, sizeof sn, "%sinput_zero_point", base);
    return zero_point_ok(st, path, sn, err, errlen);
}

int mdl__st_take(mdl_model *m, const char *path, const char *name, mdl_tensor *t, int required, int conv, char *err,
                 size_t errlen) {
    st_state *st = m->st;
    memset(t, 0, sizeof *t);
    if (!(t->name = mdl__strdup(m, name))) goto oom;
    st_entry *e = (st_entry *)find_entry(st, name);
    if (!e) {
        if (!required) return 0;
        snprintf(err, errlen, "%s: missing tensor '%s'", path, name);
        return CM_ENOTFOUND;
    }
    e->used = 1;
    if (e->type < 0) {
        snprintf(err, errlen, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16; F8_E4M3 for the linear layers of an FP8 "
                 "checkpoint)", st->shards[e->shard].path, name, e->dtype);
        return CM_EUNSUPPORTED;
    }
    int rc;
    if (conv == MDL__ST_WEIGHT && (rc = weight_scales(m, path, e, t, err, errlen))) return rc;
    if (e->type == DT_F8_E4M3 && conv != MDL__ST_WEIGHT) {
        snprintf(err, errlen, "%s: tensor '%s' is F8_E4M3: FP8 is read for the weights of linear layers only", path, name);
        return CM_EUNSUPPORTED;
    }
    const st_shard *sh = &st->shards[e->shard];
    const uint8_t *src = (const uint8_t *)sh->map + sh->data_off + e->begin;
    uint64_t nelem = (e->end - e->begin) / e->esize;
    t->type = e->type;
    t->n_dims = e->n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < e->n_dims ? e->shape[e->n_dims - 1 - d] : 1;
    t->nbytes = e->end - e->begin;
    t->data = src;
    if ((conv == MDL__ST_TO_F32 || conv == MDL__ST_TO_F32_PLUS1) && (e->type != DT_F32 || conv == MDL__ST_TO_F32_PLUS1 || (uintptr_t)src % 4)) {
        float *f = own(st, (size_t)nelem * sizeof *f);
        if (!f) goto oom;
        for (uint64_t i = 0; i < nelem; i++) {
            if (e->type == DT_F32) {
                memcpy(&f[i], src + 4 * i, 4);
            } else {
                uint16_t h;
                memcpy(&h, src + 2 * i, 2);
                f[i] = e->type == DT_F16 ? dt_f16_to_f32(h) : dt_bf16_to_f32(h);
            }
            if (conv == MDL__ST_TO_F32_PLUS1) f[i] += 1.0f;
        }
        t->type = DT_F32;
        t->nbytes = nelem * sizeof *f;
        t->data = f;
    } else if ((uintptr_t)src % e->esize) {
        void *copy = own(st, (size_t)t->nbytes);
        if (!copy) goto oom;
        memcpy(copy, src, (size_t)t->nbytes);
        t->data = copy;
        st->n_realigned++;
        st->realigned_bytes += t->nbytes;
    }
    return 0;
oom:
    snprintf(err, errlen, "%s: out of memory", path);
    return CM_ENOMEM;
}

/* Every "model.layers.N." tensor must have N < n_layer: a mismatch means config.json does not
 * describe this checkpoint. */
static int check_layer_range(const st_state *st, const char *path, int n_layer, char *err, size_t errlen) {
    static const char pre[] = "model.layers.";
    for (size_t i = 0; i < st->n_entries; i++) {
        const char *nm = st->entries[i].name;
        if (strncmp(nm, pre, sizeof pre - 1)) continue;
        char *end;
        errno = 0;
        unsigned long l = strtoul(nm + sizeof pre - 1, &end, 10);
        if (end != nm + sizeof pre - 1 && *end == '.' && (errno || l >= (unsigned long)n_layer)) {
            snprintf(err, errlen, "%s: tensor '%s' is beyond num_hidden_layers %d", path, nm, n_layer);
            return CM_EFORMAT;
        }
    }
    return 0;
}

/* Every tensor of the checkpoint must be part of the model: one the engine does not read
 * means the file describes a network the engine would run wrong. Rotary caches that old
 * checkpoints persisted are derived data and pass. */
static int check_unused(const st_state *st, const char *path, const char *model_type, char *err, size_t errlen) {
    for (size_t i = 0; i < st->n_entries; i++) {
        const st_entry *e = &st->entries[i];
        size_t n = strlen(e->name);
        if (e->used || (n >= 19 && !strcmp(e->name + n - 19, "rotary_emb.inv_freq"))) continue;
        snprintf(err, errlen, "%s: tensor '%s' is not part of model_type '%s' as this engine reads it", path, e->name, model_type);
        return CM_EUNSUPPORTED;
    }
    return 0;
}

int mdl__load_safetensors(const char *path, mdl_model **out, char *err, size_t errlen) {
    *out = NULL;
    char dir[PATH_MAX], cfg_path[PATH_MAX], p[PATH_MAX];
    struct stat sb;
    int rc;
    if (stat(path, &sb)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return CM_ENOENT;
    }
    int is_dir = S_ISDIR(sb.st_mode);
    if (is_dir) {
        if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) goto too_long;
    } else {
        const char *slash = strrchr(path, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == path) snprintf(dir, sizeof dir, "/");
        else if ((size_t)(slash - path) >= sizeof dir) goto too_long;
        else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    }
    if ((rc = join(cfg_path, sizeof cfg_path, dir, "config.json", err, errlen))) return rc;
    if (!is_file(cfg_path)) {
        snprintf(err, errlen, "%s: no config.json %s", path, is_dir ? "in the directory" : "beside the file");
        return CM_ENOENT;
    }

    mdl_model *m = calloc(1, sizeof *m);
    st_state *st = calloc(1, sizeof *st);
    if (!m || !st) {
        free(m);
        free(st);
        snprintf(err, errlen, "%s: out of memory", path);
        return CM_ENOMEM;
    }
    m->format = MDL_FORMAT_SAFETENSORS;
    m->st = st;
    st->fp8 = NULL;
    mdl_config *c = &m->cfg;
    mdl__hf hf;
    memset(&hf, 0, sizeof hf);
    if ((rc = mdl__hf_config(cfg_path, dir, m, &hf, err, errlen))) goto fail;
    if (!c->name[0]) {
        const char *b = strrchr(dir, '/');
        snprintf(c->name, sizeof c->name, "%.127s", b && b[1] ? b + 1 : dir);
    }

    if (is_dir) {
        if ((rc = join(p, sizeof p, dir, "model.safetensors.index.json", err, errlen))) goto fail;
        if (is_file(p)) {
            if ((rc = open_indexed(st, dir, p, err, errlen))) goto fail;
        } else {
            if ((rc = join(p, sizeof p, dir, "model.safetensors", err, errlen))) goto fail;
            if (!is_file(p)) {
                snprintf(err, errlen, "%s: neither model.safetensors nor model.safetensors.index.json in the directory", path);
                rc = CM_ENOENT;
                goto fail;
            }
        }
    } else {
        snprintf(p, sizeof p, "%s", path);
    }
    if (!st->n_shards) {
        if (!(st->shards = calloc(1, sizeof *st->shards))) goto oom;
        if ((rc = open_shard(st, p, err, errlen)) || (rc = sort_entries(st, err, errlen))) goto fail;
    }
    st->fp8 = &hf.fp8;
    rc = check_layer_range(st, path, c->n_layer, err, errlen);
    if (!rc) rc = mdl__hf_tensors(m, path, &hf, err, errlen);
    st->fp8 = NULL;
    if (rc || (rc = mdl__validate(m, path, err, errlen)) || (rc = check_unused(st, path, c->arch_name, err, errlen)))
        goto fail;
    if (hf.fp8.on && !c->fp8_weights) {
        snprintf(err, errlen, "%s: config.json's quantization_config (%s) describes FP8 weights but no tensor is F8_E4M3", path,
                 hf.fp8.what);
        rc = CM_EFORMAT;
        goto fail;
    }
    if (st->n_in_scales)
        CM_LOG_INFO("safetensors", "static activation scales (input_scale) recorded; activations are scaled per token at run time",
                    "path=%s tensors=%zu", path, st->n_in_scales);
    if (st->n_realigned)
        CM_LOG_WARN("safetensors", "tensor data not aligned to element size in the file: copied", "path=%s tensors=%zu bytes=%llu",
                    path, st->n_realigned, (unsigned long long)st->realigned_bytes);
    *out = m;
    return 0;
too_long:
    snprintf(err, errlen, "%.64s...: path too long", path);
    return CM_EINVAL;
oom:
    snprintf(err, errlen, "%s: out of memory", path);
    rc = CM_ENOMEM;
fail:
    mdl_free(m);
    return rc;
}

int mdl_permute_qk_hf_to_gguf(const float *src, float *dst, int n_head, int head_dim, int n_embd) {
    if (!src || !dst || src == dst || n_head <= 0 || head_dim <= 0 || head_dim % 2 || n_embd <= 0) return CM_EINVAL;
    int half = head_dim / 2;
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < half; i++)
            for (int t = 0; t < 2; t++)
                memcpy(dst + ((size_t)h * head_dim + 2 * i + t) * n_embd, src + ((size_t)h * head_dim + t * half + i) * n_embd,
                       (size_t)n_embd * sizeof *dst);
    return 0;
}
