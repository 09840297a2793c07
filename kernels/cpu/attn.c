/* attn: paged causal GQA attention (online softmax over blocks) and the KV store, over the
 * KV element types of attn.h. */
#include "attn.h"
#include "kcpu_internal.h"
#include "../../common/cm_err.h"

#include <math.h>
#include <string.h>

/* Bytes of one position of one head (F8_E4M3: its codes and its scale). */
static size_t head_bytes(int kv_type, int D) {
    switch (kv_type) {
    case DT_F32: return 4 * (size_t)D;
    case DT_F16: return 2 * (size_t)D;
    case DT_F8_E4M3: return (size_t)D + 4;
    case DT_Q8_0: return D % QK8_0 ? 0 : (size_t)(D / QK8_0) * sizeof(blk_q8_0);
    default: return 0;
    }
}

size_t k_kv_block_bytes(int kv_type, int block_size, int n_head_kv, int head_dim) {
    if (block_size <= 0 || n_head_kv <= 0 || head_dim <= 0) return 0;
    return head_bytes(kv_type, head_dim) * (size_t)block_size * (size_t)n_head_kv;
}

static int args_ok(const k_attn_args *a) {
    return a->n_tok >= 0 && a->n_head > 0 && a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 &&
           a->head_dim > 0 && a->head_dim <= K_ATTN_MAX_HEAD_DIM && a->block_size > 0 &&
           a->block_size <= K_ATTN_MAX_BLOCK && a->n_pool_blocks > 0 && head_bytes(a->kv_type, a->head_dim);
}

/* Where (block b, row r, head h) lives in a pool: its data (elements, codes or Q8_0 blocks)
 * and, for F8_E4M3, its scale. */
typedef struct {
    int    type, D, H, B;
    size_t blk;    /* bytes per block */
    size_t hb;     /* bytes of one head's data (F8_E4M3: codes only) */
    size_t codes;  /* F8_E4M3: bytes of the block's codes, where its scales start */
} kv_layout;

static kv_layout layout_of(const k_attn_args *a) {
    kv_layout l = { a->kv_type, a->head_dim, a->n_head_kv, a->block_size, 0, 0, 0 };
    l.blk = k_kv_block_bytes(a->kv_type, a->block_size, a->n_head_kv, a->head_dim);
    l.hb = a->kv_type == DT_F8_E4M3 ? (size_t)a->head_dim : head_bytes(a->kv_type, a->head_dim);
    l.codes = (size_t)a->block_size * a->n_head_kv * a->head_dim;
    return l;
}

static inline uint8_t *head_data(const kv_layout *l, void *pool, int64_t b, int r, int h) {
    return (uint8_t *)pool + (size_t)b * l->blk + ((size_t)r * l->H + h) * l->hb;
}

static inline float *head_scale(const kv_layout *l, void *pool, int64_t b, int r, int h) {
    return (float *)((uint8_t *)pool + (size_t)b * l->blk + l->codes) + (size_t)h * l->B + r;
}

/* x[D] into (b, r, h); st: the static scale of head h or NULL. */
static void encode_head(const kv_layout *l, void *pool, int64_t b, int r, int h, const float *x, const float *st) {
    uint8_t *d = head_data(l, pool, b, r, h);
    switch (l->type) {
    case DT_F32: memcpy(d, x, sizeof(float) * (size_t)l->D); break;
    case DT_F16: dt_quantize(DT_F16, x, d, l->D); break;
    case DT_Q8_0: dt_quantize(DT_Q8_0, x, d, l->D); break;
    case DT_F8_E4M3: {
        float s = st ? st[h] : dt_fp8_scale(x, l->D);
        dt_fp8_encode(x, l->D, s, d);
        *head_scale(l, pool, b, r, h) = s;
        break;
    }
    }
}

/* The f32 values of (b, r, h) into out[D] (not F32: that one is read in place). */
static void decode_head(const kv_layout *l, void *pool, int64_t b, int r, int h, float *out) {
    const uint8_t *d = head_data(l, pool, b, r, h);
    if (l->type == DT_F8_E4M3) {
        const float *lut = k__e4m3_lut(), s = *head_scale(l, pool, b, r, h);
        for (int i = 0; i < l->D; i++) out[i] = lut[d[i]] * s;
    } else {
        dt_dequantize(l->type, d, out, l->D);
    }
}

/* Physical block of position p of sequence s, or -1 outside the table or the pool. */
static inline int64_t block_of(const k_attn_args *a, int s, int p) {
    int j = p / a->block_size;
    if (p < 0 || j >= a->n_blocks[s] || j >= a->bt_stride) return -1;
    int64_t b = a->block_tables[(int64_t)s * a->bt_stride + j];
    return b >= 0 && b < a->n_pool_blocks ? b : -1;
}

int k_kv_write(const k_attn_args *a, const float *k, const float *v) {
    if (!args_ok(a)) return CM_EINVAL;
    const kv_layout l = layout_of(a);
    const float *ks = a->kv_type == DT_F8_E4M3 ? a->k_scale : NULL, *vs = a->kv_type == DT_F8_E4M3 ? a->v_scale : NULL;
    int64_t row = (int64_t)a->n_head_kv * a->head_dim;
    for (int64_t t = 0; t < a->n_tok; t++) {
        int s = a->tok_seq[t], p = a->tok_pos[t];
        int64_t b = block_of(a, s, p);
        if (b < 0) return CM_EINVAL;
        for (int h = 0; h < a->n_head_kv; h++) {
            encode_head(&l, a->k_pool, b, p % a->block_size, h, k + t * row + (int64_t)h * a->head_dim, ks);
            encode_head(&l, a->v_pool, b, p % a->block_size, h, v + t * row + (int64_t)h * a->head_dim, vs);
        }
    }
    return 0;
}

int k_kv_copy(const k_attn_args *a, int64_t src, int64_t dst, int n_tok) {
    if (!args_ok(a) || src < 0 || dst < 0 || src >= a->n_pool_blocks || dst >= a->n_pool_blocks || n_tok < 0 ||
        n_tok > a->block_size)
        return CM_EINVAL;
    const kv_layout l = layout_of(&(k_attn_args){ .kv_type = a->kv_type, .block_size = a->block_size, .n_head_kv = a->n_head_kv,
                                                  .head_dim = a->head_dim });
    void *pools[2] = { a->k_pool, a->v_pool };
    for (int i = 0; i < 2; i++) {
        uint8_t *p = pools[i];
        memmove(p + (size_t)dst * l.blk, p + (size_t)src * l.blk, (size_t)n_tok * l.H * l.hb);
        if (l.type == DT_F8_E4M3) /* scales [H][B]: each head's first n_tok */
            for (int h = 0; h < l.H; h++)
                memmove(head_scale(&l, p, dst, 0, h), head_scale(&l, p, src, 0, h), sizeof(float) * (size_t)n_tok);
    }
    return 0;
}

typedef struct {
    const k_attn_args *a;
    int bad; /* set by a worker that met an uncovered position (each writes 1 only) */
} attn_job;

/* Positions are processed in chunks of K_ATTN_CHUNK whatever the block size, so the
 * rounding of the online softmax depends on positions only, not on the cache's paging. */
#define K_ATTN_CHUNK 64

/* 8-lane vectors (GCC vector extensions: AVX with the x86-64-v3 clone below, two SSE halves
 * otherwise). Rows are only 4-byte aligned, so loads and stores go through memcpy; no vector
 * crosses a function boundary (that would change the ABI between the clones). */
typedef float v8f __attribute__((vector_size(32)));

/* q·k over D (a fixed summation order for a given D: 8 lanes, then a fixed tree). */
static inline float dot(const float *q, const float *k, int D) {
    int d = 0;
    float r = 0.0f;
    if (D >= 8) {
        v8f s = { 0 }, a, b;
        for (; d + 8 <= D; d += 8) {
            memcpy(&a, q + d, sizeof a);
            memcpy(&b, k + d, sizeof b);
            s += a * b;
        }
        r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    }
    for (; d < D; d++) r += q[d] * k[d];
    return r;
}

/* acc += w * v over D */
static inline void axpy(float *acc, float w, const float *v, int D) {
    int d = 0;
    for (; d + 8 <= D; d += 8) {
        v8f a, b;
        memcpy(&a, acc + d, sizeof a);
        memcpy(&b, v + d, sizeof b);
        a += w * b;
        memcpy(acc + d, &a, sizeof a);
    }
    for (; d < D; d++) acc[d] += w * v[d];
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
static void attn_one(const k_attn_args *a, int64_t t, int h, int *bad) {
    const int D = a->head_dim, BS = a->block_size;
    const int64_t row = (int64_t)a->n_head_kv * D;
    const int kvh = h / (a->n_head / a->n_head_kv);
    const int f32 = a->kv_type == DT_F32;
    const kv_layout lay = layout_of(a);
    float kbuf[K_ATTN_MAX_HEAD_DIM], vbuf[K_ATTN_MAX_HEAD_DIM];
    int64_t vblk[K_ATTN_CHUNK];
    const float *q = a->q + (t * a->n_head + h) * (int64_t)D;
    float *o = a->out + (t * a->n_head + h) * (int64_t)D;
    const int s = a->tok_seq[t], p = a->tok_pos[t];
    const int start = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
    const float cap = a->softcap, inv_cap = cap > 0 ? 1.0f / cap : 0.0f;
    float acc[K_ATTN_MAX_HEAD_DIM], sc[K_ATTN_CHUNK];
    const float *vrow[K_ATTN_CHUNK];
    float m = -INFINITY, l = 0.0f;
    for (int d = 0; d < D; d++) acc[d] = 0.0f;
    for (int j0 = start; j0 <= p; j0 += K_ATTN_CHUNK) {
        int nv = p + 1 - j0 < K_ATTN_CHUNK ? p + 1 - j0 : K_ATTN_CHUNK;
        float mb = m;
        int64_t b = -1;
        for (int i = 0; i < nv; i++) {
            int pp = j0 + i;
            if (i == 0 || pp % BS == 0) {
                b = block_of(a, s, pp);
                if (b < 0) { *bad = 1; memset(o, 0, sizeof(float) * (size_t)D); return; }
            }
            float x;
            if (f32) {
                int64_t off = (b * BS + pp % BS) * row + (int64_t)kvh * D;
                vrow[i] = (const float *)a->v_pool + off;
                x = dot(q, (const float *)a->k_pool + off, D) * a->scale;
            } else {
                vblk[i] = b;
                decode_head(&lay, a->k_pool, b, pp % BS, kvh, kbuf);
                x = dot(q, kbuf, D) * a->scale;
            }
            if (cap > 0) x = cap * tanhf(x * inv_cap);
            sc[i] = x;
            if (x > mb) mb = x;
        }
        if (mb > m) {
            float r = expf(m - mb); /* m = -inf on the first chunk: r = 0, acc and l are 0 */
            l *= r;
            for (int d = 0; d < D; d++) acc[d] *= r;
            m = mb;
        }
        for (int i = 0; i < nv; i++) {
            float w = expf(sc[i] - m);
            l += w;
            if (f32) {
                axpy(acc, w, vrow[i], D);
            } else {
                decode_head(&lay, a->v_pool, vblk[i], (j0 + i) % BS, kvh, vbuf);
                axpy(acc, w, vbuf, D);
            }
        }
    }
    float inv = 1.0f / l;
    for (int d = 0; d < D; d++) o[d] = acc[d] * inv;
}

static void attn_worker(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    const k_attn_args *a = j->a;
    int64_t n_items = a->n_tok * a->n_head;
    int bad = 0;
    /* Interleaved items: later tokens of a prefill cost more, so stripes balance better. */
    for (int64_t i = ith; i < n_items; i += nth) attn_one(a, i / a->n_head, (int)(i % a->n_head), &bad);
    if (bad) __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
}

int k_attn_paged(k_pool *pool, const k_attn_args *a) {
    if (!args_ok(a)) return CM_EINVAL;
    attn_job j = { a, 0 };
    /* Waking workers costs more than a few thousand multiply-adds: small steps run inline
     * (same result: the split never changes a (token, head) computation). */
    int64_t work = 0;
    for (int64_t t = 0; t < a->n_tok && work < (1 << 16); t++) {
        int64_t span = a->tok_pos[t] + 1;
        if (a->window > 0 && span > a->window) span = a->window;
        work += span * a->n_head * a->head_dim;
    }
    if (pool && k_pool_size(pool) > 1 && work >= (1 << 16)) k_pool_run(pool, attn_worker, &j);
    else attn_worker(&j, 0, 1);
    return j.bad ? CM_EINVAL : 0;
}
