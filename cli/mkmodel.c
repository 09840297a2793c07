/* arka mkmodel SHAPE OUT.gguf: a random-weight GGUF at a standard model's shape: llama-arch
 * (Llama, TinyLlama, Mixtral's experts), qwen3, qwen3moe, gemma2, gemma3 and phi3, with
 * llama.cpp's tensor names and keys (so llama.cpp can run the same file).
 *
 * Weights come from a counter-based PRNG keyed by (seed, tensor, row), so the file is the same
 * whatever the thread count. Rows are generated and quantized in parallel in bounded chunks and
 * streamed through gguf_write, so a 7B file needs tens of MB of memory, not GB. The vocabulary
 * (every tokenizer.* key) is copied from a vocab-only GGUF and padded with <extra_N> user-defined
 * tokens when the shape's vocabulary is larger. The file is written as OUT.part and renamed.
 */
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "model/dtype.h"
#include "model/gguf.h"
#include "model/gguf_write.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define DEFAULT_VOCAB "../shared/models/vocab/ggml-vocab-llama-spm.gguf" /* relative to the project root */
#define CHUNK_BYTES (32u << 20) /* output bytes generated per parallel step */
#define MAX_THREADS 64

typedef struct {
    const char *name;
    const char *arch;          /* GGUF architecture: llama, qwen3, qwen3moe, gemma2, gemma3, phi3 */
    int         dim, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    float       rope_base;
    int         n_expert, n_expert_used, n_ff_exp; /* mixture of experts (0: dense) */
    int         swa;           /* sliding window (gemma: on the architecture's layers; phi3: all) */
    const char *about;
    int         rope_llama3;   /* Llama 3.1's rope scaling (factor 8 past 8,192 positions): rope_freqs.weight */
} shape;

/* Every row length (dim, n_head*head_dim, n_ff, n_ff_exp) is a multiple of 256, so all types fit. */
static const shape shapes[] = {
    { "tiny",           "llama", 256,  2,  4,  2,  64,  512,   32000,  2048,  10000.f,  0, 0, 0, 0, "tests: 2 layers, ~17M params (mostly embeddings)" },
    { "small",          "llama", 768,  12, 12, 4,  64,  2048,  32000,  2048,  10000.f,  0, 0, 0, 0, "~125M params, llama-like" },
    { "tinyllama-1.1b", "llama", 2048, 22, 32, 4,  64,  5632,  32000,  2048,  10000.f,  0, 0, 0, 0, "TinyLlama 1.1B" },
    { "llama2-7b",      "llama", 4096, 32, 32, 32, 128, 11008, 32000,  4096,  10000.f,  0, 0, 0, 0, "Llama 2 7B" },
    { "llama3-8b",      "llama", 4096, 32, 32, 8,  128, 14336, 128256, 8192,  500000.f, 0, 0, 0, 0, "Llama 3 8B (vocab padded)" },
    { "llama3.1-8b",    "llama", 4096, 32, 32, 8,  128, 14336, 128256, 131072, 500000.f, 0, 0, 0, 0, "Llama 3.1 8B: 128k context, llama3 rope scaling", 1 },
    { "mixtral-8x7b",   "llama", 4096, 32, 32, 8,  128, 14336, 32000,  32768, 1e6f,     8, 2, 14336, 0, "Mixtral 8x7B (llama arch with experts)" },
    { "qwen3-8b",       "qwen3", 4096, 36, 32, 8,  128, 12288, 151936, 40960, 1e6f,     0, 0, 0, 0, "Qwen3 8B (vocab padded)" },
    { "qwen3-30b-a3b",  "qwen3moe", 2048, 48, 32, 4, 128, 6144, 151936, 40960, 1e6f,  128, 8, 768, 0, "Qwen3 30B-A3B: 128 experts, 8 per token" },
    { "gemma2-9b",      "gemma2", 3584, 42, 16, 8, 256, 14336, 256000, 8192,  10000.f,  0, 0, 0, 4096, "Gemma 2 9B (vocab padded)" },
    { "gemma3-12b",     "gemma3", 3840, 48, 16, 8, 256, 15360, 262208, 131072, 1e6f,    0, 0, 0, 1024, "Gemma 3 12B text (vocab padded)" },
    { "phi3-mini",      "phi3",  3072, 32, 32, 32, 96,  8192,  32064,  4096,  10000.f,  0, 0, 0, 2047, "Phi-3 mini 4k (fused QKV, gate|up)" },
    { "llama3.1-tiny",  "llama", 256,  2,  4,  2,  64,  512,   32000,  131072, 500000.f, 0, 0, 0, 0, "tests: llama3 rope scaling (rope_freqs), 128k context", 1 },
    { "qwen3-tiny",     "qwen3", 256,  2,  4,  2,  128, 512,   32000,  2048,  1e6f,     0, 0, 0, 0, "tests: qwen3, head_dim 128 apart from 256/4" },
    { "qwen3moe-tiny",  "qwen3moe", 256, 2, 4,  2,  64,  512,   32000,  2048,  1e6f,     8, 2, 256, 0, "tests: qwen3moe, 8 experts, 2 per token" },
    { "qwen3moe-tiny512", "qwen3moe", 512, 2, 8, 4, 64, 1024, 32000, 2048, 1e6f,   16, 4, 256, 0, "tests: qwen3moe at rows of 512, the GPU's fused decode-step MoE launches" },
    { "mixtral-tiny",   "llama", 256,  2,  4,  2,  64,  512,   32000,  2048,  1e6f,     4, 2, 512, 0, "tests: llama arch with 4 experts" },
    { "gemma2-tiny",    "gemma2", 256, 2,  4,  2,  64,  512,   32000,  2048,  10000.f,  0, 0, 0, 64, "tests: gemma2, 64-token window on layer 0" },
    { "gemma3-tiny",    "gemma3", 256, 6,  4,  2,  64,  512,   32000,  2048,  1e6f,     0, 0, 0, 64, "tests: gemma3, 64-token windows on 5 of 6 layers" },
    { "phi3-tiny",      "phi3",  256,  2,  4,  4,  64,  512,   32000,  2048,  10000.f,  0, 0, 0, 128, "tests: phi3, 128-token window" },
    { "phi3-tiny96",    "phi3",  768,  2,  8,  8,  96,  512,   32000,  2048,  10000.f,  0, 0, 0, 128, "tests: phi3-mini's head dim 96, 128-token window" },
};

/* --type q4_k_m: llama.cpp's Q4_K_M mix (Q4_K matrices; Q6_K for output.weight and for attn_v and
 * ffn_down(_exps) in the layers its use_more_bits rule picks). Not a tensor type: resolved per
 * tensor by mix_type. */
#define TYPE_Q4_K_M 1000
static int more_bits(int l, int n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }
static int mix_type(int type, int l, int n_layer, int more) {
    if (type != TYPE_Q4_K_M) return type;
    return more && (l < 0 || more_bits(l, n_layer)) ? DT_Q6_K : DT_Q4_K;
}

/* ggml's llama_ftype for a file whose weight matrices are all of one type. */
static int file_type_of(int t) {
    switch (t) {
    case DT_F32: return 0;
    case DT_F16: return 1;
    case DT_Q4_0: return 2;
    case DT_Q4_1: return 3;
    case DT_Q8_0: return 7;
    case DT_Q5_0: return 8;
    case DT_Q5_1: return 9;
    case DT_Q4_K: return 14; /* Q4_K_S */
    case DT_Q5_K: return 16; /* Q5_K_S */
    case DT_Q6_K: return 18;
    case DT_BF16: return 32;
    case TYPE_Q4_K_M: return 15;
    default: return -1;
    }
}

enum init_kind { INIT_NORM, INIT_EMBD, INIT_MATRIX, INIT_ROPE_LLAMA3 /* std: the rope base */ };

typedef struct {
    char    name[64];
    int     type;
    int     n_dims;
    int64_t ne[3];
    int     init; /* enum init_kind */
    float   std;
} tplan;

/* ---- random numbers ------------------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately N(0,1): the sum of four 16-bit uniforms (Irwin-Hall, bell-shaped, |x| < 3.5),
 * one 64-bit draw per value, which keeps a 7B generation cheap next to quantization. */
static void fill_row(float *x, int64_t n, uint64_t seed, int init, float std) {
    if (init == INIT_ROPE_LLAMA3) { /* Meta's llama3 rule, pair i of n (rope_dim 2n): factor 8, low 1, high 4, 8,192 */
        for (int64_t i = 0; i < n; i++) {
            double f = pow(std, -(double)i / (double)n), wl = 2.0 * M_PI / f, lo = 8192.0, hi = 8192.0 / 4.0;
            double sm = (8192.0 / wl - 1.0) / (4.0 - 1.0);
            x[i] = wl < hi ? 1.0f : wl > lo ? 8.0f : (float)(1.0 / ((1.0 - sm) / 8.0 + sm));
        }
        return;
    }
    uint64_t s = mix64(seed);
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = mix64(s += 0x9e3779b97f4a7c15ull);
        int32_t sum = (int32_t)((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
        float z = (float)(sum - 131070) * (1.0f / 37837.23f);
        x[i] = init == INIT_NORM ? 1.0f + std * z : std * z;
    }
}

/* ---- parallel generation ------------------------------------------------------------------- */

typedef struct {
    const tplan *t;
    uint64_t     seed;
    int          t_index;
    int64_t      row0, row1; /* rows [row0, row1) of the tensor */
    int64_t      chunk_row0; /* first row of the chunk: out is at row - chunk_row0 */
    uint8_t     *out;
    size_t       row_size;
    float       *scratch; /* [ne0] */
    int          rc;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    for (int64_t r = j->row0; r < j->row1; r++) {
        uint64_t key = j->seed * 0x100000001b3ull ^ ((uint64_t)j->t_index << 40) ^ (uint64_t)r;
        fill_row(j->scratch, j->t->ne[0], key, j->t->init, j->t->std);
        int rc = dt_quantize(j->t->type, j->scratch, j->out + (size_t)(r - j->chunk_row0) * j->row_size, j->t->ne[0]);
        if (rc) { j->rc = rc; return NULL; }
    }
    return NULL;
}

typedef struct {
    double   t0, last;
    uint64_t done, total;
    int      tty, last_pct, shown;
} progress;

static void progress_show(progress *p, int final) {
    if (p->total < (64u << 20)) return;
    double now = cm_time_s();
    int pct = (int)(100.0 * p->done / p->total);
    if (p->tty) {
        if (!final && now - p->last < 0.25) return;
        fprintf(stderr, "\rmkmodel: %7.0f / %.0f MiB (%3d%%) %6.1f s", p->done / 1048576.0, p->total / 1048576.0, pct,
                now - p->t0);
        if (final) fputc('\n', stderr);
    } else {
        if (final ? pct == p->last_pct : pct / 10 == p->last_pct / 10) return;
        fprintf(stderr, "mkmodel: %.0f / %.0f MiB (%d%%) %.1f s\n", p->done / 1048576.0, p->total / 1048576.0, pct, now - p->t0);
    }
    p->last = now;
    p->last_pct = pct;
    p->shown = 1;
}

static int write_tensor(gguf_writer *w, const tplan *t, int t_index, uint64_t seed, int n_threads, uint8_t *out,
                        float *scratch, progress *prog) {
    size_t rs = dt_row_size(t->type, t->ne[0]);
    int64_t rows = t->ne[1] * t->ne[2], chunk_rows = CHUNK_BYTES / rs;
    if (chunk_rows < 1) chunk_rows = 1;
    for (int64_t c0 = 0; c0 < rows; c0 += chunk_rows) {
        int64_t c1 = c0 + chunk_rows < rows ? c0 + chunk_rows : rows, n = c1 - c0;
        int nt = n < n_threads ? (int)n : n_threads;
        job jobs[MAX_THREADS];
        pthread_t th[MAX_THREADS];
        int started[MAX_THREADS] = { 0 };
        for (int k = 0; k < nt; k++) {
            jobs[k] = (job){ .t = t, .seed = seed, .t_index = t_index, .row0 = c0 + n * k / nt, .row1 = c0 + n * (k + 1) / nt,
                             .chunk_row0 = c0, .out = out, .row_size = rs, .scratch = scratch + (size_t)k * t->ne[0] };
            if (k > 0) started[k] = pthread_create(&th[k], NULL, run_job, &jobs[k]) == 0;
            if (k > 0 && !started[k]) run_job(&jobs[k]); /* no thread to be had: do it here */
        }
        run_job(&jobs[0]);
        int rc = 0;
        for (int k = 0; k < nt; k++) {
            if (k > 0 && started[k]) pthread_join(th[k], NULL);
            if (jobs[k].rc) rc = jobs[k].rc;
        }
        if (rc) return rc;
        if ((rc = gguf_w_write(w, out, (size_t)n * rs))) return rc;
        prog->done += (uint64_t)n * rs;
        progress_show(prog, 0);
    }
    return 0;
}

/* ---- vocabulary ----------------------------------------------------------------------------- */

/* Copies tokenizer.* from the vocab file; pads the per-token arrays up to n_vocab. */
static int copy_vocab(gguf_writer *w, const char *path, int n_vocab, char *err, size_t errlen) {
    gguf_ctx *g;
    int rc = gguf_open(path, &g, err, errlen);
    if (rc) return rc;
    const gguf_value *toks;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &toks)) {
        snprintf(err, errlen, "%s: no tokenizer.ggml.tokens string array", path);
        gguf_close(g);
        return CM_EFORMAT;
    }
    uint64_t n_tok = toks->v.arr.n;
    if (n_tok > (uint64_t)n_vocab) {
        snprintf(err, errlen, "%s: %llu tokens, more than the shape's vocabulary of %d", path, (unsigned long long)n_tok, n_vocab);
        gguf_close(g);
        return CM_EINVAL;
    }
    if ((rc = gguf_w_copy_kv(w, g, "tokenizer.", NULL))) {
        snprintf(err, errlen, "%s: %s", path, gguf_w_errmsg(w));
        gguf_close(g);
        return rc;
    }
    uint64_t extra = (uint64_t)n_vocab - n_tok;
    for (int64_t i = 0; extra && i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        const gguf_value *v = &kv->val;
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10) || v->type != GGUF_ARRAY || v->v.arr.n != n_tok) continue;
        int et = v->v.arr.elem_type;
        gguf_value nv = *v;
        nv.v.arr.n = (uint64_t)n_vocab;
        void *mem = NULL;
        char *names = NULL;
        if (et == GGUF_STRING) {
            gguf_str *s = malloc((size_t)n_vocab * sizeof *s);
            names = malloc((size_t)extra * 20);
            if (!s || !names) { free(s); free(names); rc = CM_ENOMEM; break; }
            memcpy(s, v->v.arr.strs, n_tok * sizeof *s);
            for (uint64_t k = 0; k < extra; k++) {
                char *p = names + k * 20;
                s[n_tok + k] = (gguf_str){ p, (uint64_t)snprintf(p, 20, "<extra_%llu>", (unsigned long long)k) };
            }
            nv.v.arr.strs = s;
            mem = s;
        } else if (gguf_vtype_size(et)) {
            size_t es = gguf_vtype_size(et);
            uint8_t *raw = calloc((size_t)n_vocab, es);
            if (!raw) { rc = CM_ENOMEM; break; }
            memcpy(raw, v->v.arr.raw, n_tok * es);
            /* token types: 4 = USER_DEFINED: text matches them only where it holds "<extra_N>"
             * literally, and they detokenize to that text. A random model picks padding most of
             * the time (a 32k vocabulary padded to llama3's 128k is 3/4 padding): as CONTROL
             * tokens they streamed no text, so a serving benchmark's inter-token gaps spanned
             * several tokens. */
            if (kv->key.len == 25 && !memcmp(kv->key.ptr, "tokenizer.ggml.token_type", 25) && et == GGUF_INT32)
                for (uint64_t k = 0; k < extra; k++) { int32_t c = 4; memcpy(raw + (n_tok + k) * 4, &c, 4); }
            nv.v.arr.raw = raw;
            mem = raw;
        } else continue;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 255 ? kv->key.len : 255), kv->key.ptr);
        rc = gguf_w_set_value(w, key, &nv);
        free(mem);
        free(names);
        if (rc) break;
    }
    if (rc) snprintf(err, errlen, "%s: padding the vocabulary: %s", path, rc == CM_ENOMEM ? "out of memory" : gguf_w_errmsg(w));
    else if (extra)
        fprintf(stderr, "mkmodel: %s has %llu tokens; padded to %d with %llu <extra_N> user-defined tokens\n", path,
                (unsigned long long)n_tok, n_vocab, (unsigned long long)extra);
    gguf_close(g);
    return rc;
}

/* ---- command -------------------------------------------------------------------------------- */

static void usage(const cm_opt *opts, FILE *f) {
    fprintf(f, "usage: arka mkmodel SHAPE OUT.gguf [--type T] [--vocab VOCAB.gguf|none] [--vocab-size N] [--seed N] [--threads N]\n\nshapes:\n");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        fprintf(f, "  %-15s %-8s dim %4d, %2d layers, %2d/%2d heads of %3d, ff %5d, vocab %6d  %s\n", shapes[i].name, shapes[i].arch,
                shapes[i].dim, shapes[i].n_layer, shapes[i].n_head, shapes[i].n_head_kv, shapes[i].head_dim,
                shapes[i].n_expert ? shapes[i].n_ff_exp : shapes[i].n_ff, shapes[i].n_vocab, shapes[i].about);
    fprintf(f, "types: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m (Q4_K with Q6_K for output, attn_v and ffn_down in some layers, as llama.cpp)\n"
               "default vocab: ROOT/" DEFAULT_VOCAB ", ROOT = $ARKA_ROOT or two levels above the binary (build/bin/arka)\n\noptions:\n");
    cm_config_usage(opts, f);
}

/* The default vocabulary's path, from the project root: $ARKA_ROOT, else the directory two
 * levels above the running binary (ROOT/build/bin/arka). Returns 0 with the path in buf when
 * the file is readable, else CM_ENOENT after one line on stderr naming the path tried. */
static int default_vocab(char *buf, size_t n) {
    char root[4096];
    const char *env = getenv("ARKA_ROOT"), *from = "$ARKA_ROOT";
    if (env && *env) {
        snprintf(root, sizeof root, "%s", env);
    } else {
        ssize_t l = readlink("/proc/self/exe", root, sizeof root - 1);
        if (l <= 0) {
            fprintf(stderr, "arka mkmodel: cannot find the project root (/proc/self/exe unreadable): set ARKA_ROOT or pass --vocab FILE|none\n");
            return CM_ENOENT;
        }
        root[l] = 0;
        for (int up = 0; up < 3; up++) { /* arka, bin, build; "/" ends as "" */
            char *slash = strrchr(root, '/');
            if (slash) *slash = 0;
        }
        from = "the binary's location";
    }
    snprintf(buf, n, "%s/%s", root, DEFAULT_VOCAB);
    if (access(buf, R_OK) != 0) {
        fprintf(stderr, "arka mkmodel: default vocabulary %s: %s (project root from %s); set ARKA_ROOT or pass --vocab FILE|none\n",
                buf, strerror(errno), from);
        return CM_ENOENT;
    }
    return 0;
}

static void plan_add(tplan *p, int *k, const char *name, int type, int64_t ne0, int64_t ne1, int64_t ne2, int init, float std) {
    tplan *t = &p[(*k)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = ne2 > 1 ? 3 : ne1 > 1 || (init != INIT_NORM && init != INIT_ROPE_LLAMA3) ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->init = init;
    t->std = std;
}

/* Tensor list in llama.cpp's order and names. Matrices: std 1/sqrt(fan_in) keeps each
 * projection's output at the scale of its (RMS-normalized) input; embeddings 0.02; norms
 * 1 +- 0.02 (gemma's GGUF norms hold 1 + w too); routers F32 like llama.cpp's quantizer
 * leaves them. */
static int build_plan(const shape *s, int type, tplan **out, int *n_out) {
    const int gemma = !strcmp(s->arch, "gemma2") || !strcmp(s->arch, "gemma3"), phi3 = !strcmp(s->arch, "phi3");
    const int qk_norm = !strcmp(s->arch, "qwen3") || !strcmp(s->arch, "qwen3moe") || !strcmp(s->arch, "gemma3");
    const int moe = s->n_expert > 0;
    int n = 4 + 16 * s->n_layer, k = 0, hd = s->head_dim;
    tplan *p = calloc((size_t)n, sizeof *p);
    if (!p) return CM_ENOMEM;
    const int64_t qd = (int64_t)s->n_head * hd, kvd = (int64_t)s->n_head_kv * hd;
    const float sd_in = 1.0f / sqrtf((float)s->dim), sd_o = 1.0f / sqrtf((float)qd), sd_ff = 1.0f / sqrtf((float)s->n_ff),
                sd_fe = moe ? 1.0f / sqrtf((float)s->n_ff_exp) : 0;
    char nm[64];
#define ADD(fmt, ty, a, b, c, init, sd) (snprintf(nm, sizeof nm, fmt, l), plan_add(p, &k, nm, ty, a, b, c, init, sd))
#define T(more) mix_type(type, l, s->n_layer, more)
    plan_add(p, &k, "token_embd.weight", mix_type(type, 0, s->n_layer, 0), s->dim, s->n_vocab, 1, INIT_EMBD, 0.02f);
    if (s->rope_llama3) plan_add(p, &k, "rope_freqs.weight", DT_F32, hd / 2, 1, 1, INIT_ROPE_LLAMA3, s->rope_base);
    for (int l = 0; l < s->n_layer; l++) {
        ADD("blk.%d.attn_norm.weight", DT_F32, s->dim, 1, 1, INIT_NORM, 0.02f);
        if (phi3) {
            ADD("blk.%d.attn_qkv.weight", T(0), s->dim, qd + 2 * kvd, 1, INIT_MATRIX, sd_in);
        } else {
            ADD("blk.%d.attn_q.weight", T(0), s->dim, qd, 1, INIT_MATRIX, sd_in);
            ADD("blk.%d.attn_k.weight", T(0), s->dim, kvd, 1, INIT_MATRIX, sd_in);
            ADD("blk.%d.attn_v.weight", T(1), s->dim, kvd, 1, INIT_MATRIX, sd_in);
        }
        if (qk_norm) {
            ADD("blk.%d.attn_q_norm.weight", DT_F32, hd, 1, 1, INIT_NORM, 0.02f);
            ADD("blk.%d.attn_k_norm.weight", DT_F32, hd, 1, 1, INIT_NORM, 0.02f);
        }
        ADD("blk.%d.attn_output.weight", T(0), qd, s->dim, 1, INIT_MATRIX, sd_o);
        if (gemma) ADD("blk.%d.post_attention_norm.weight", DT_F32, s->dim, 1, 1, INIT_NORM, 0.02f);
        ADD("blk.%d.ffn_norm.weight", DT_F32, s->dim, 1, 1, INIT_NORM, 0.02f);
        if (moe) {
            ADD("blk.%d.ffn_gate_inp.weight", DT_F32, s->dim, s->n_expert, 1, INIT_MATRIX, sd_in);
            ADD("blk.%d.ffn_gate_exps.weight", T(0), s->dim, s->n_ff_exp, s->n_expert, INIT_MATRIX, sd_in);
            ADD("blk.%d.ffn_up_exps.weight", T(0), s->dim, s->n_ff_exp, s->n_expert, INIT_MATRIX, sd_in);
            ADD("blk.%d.ffn_down_exps.weight", T(1), s->n_ff_exp, s->dim, s->n_expert, INIT_MATRIX, sd_fe);
        } else if (phi3) {
            ADD("blk.%d.ffn_up.weight", T(0), s->dim, 2 * (int64_t)s->n_ff, 1, INIT_MATRIX, sd_in);
            ADD("blk.%d.ffn_down.weight", T(1), s->n_ff, s->dim, 1, INIT_MATRIX, sd_ff);
        } else {
            ADD("blk.%d.ffn_gate.weight", T(0), s->dim, s->n_ff, 1, INIT_MATRIX, sd_in);
            ADD("blk.%d.ffn_up.weight", T(0), s->dim, s->n_ff, 1, INIT_MATRIX, sd_in);
            ADD("blk.%d.ffn_down.weight", T(1), s->n_ff, s->dim, 1, INIT_MATRIX, sd_ff);
        }
        if (gemma) ADD("blk.%d.post_ffw_norm.weight", DT_F32, s->dim, 1, 1, INIT_NORM, 0.02f);
    }
#undef ADD
    plan_add(p, &k, "output_norm.weight", DT_F32, s->dim, 1, 1, INIT_NORM, 0.02f);
    if (!gemma) plan_add(p, &k, "output.weight", mix_type(type, -1, s->n_layer, 1), s->dim, s->n_vocab, 1, INIT_MATRIX, sd_in); /* gemma ties it */
    *out = p;
    *n_out = k;
    return 0;
}

static int set_metadata(gguf_writer *w, const shape *s, int type) {
    char name[96], key[128];
    snprintf(name, sizeof name, "arka-random %s %s", s->name, type == TYPE_Q4_K_M ? "q4_k_m" : dt_name(type));
    const char *a = s->arch;
    const int gemma = !strcmp(a, "gemma2") || !strcmp(a, "gemma3");
    int rc;
    if ((rc = gguf_w_set_str(w, "general.architecture", a)) || (rc = gguf_w_set_str(w, "general.name", name)) ||
        (rc = gguf_w_set_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT)) ||
        (rc = gguf_w_set_u32(w, "general.file_type", (uint32_t)file_type_of(type))) ||
        (rc = gguf_w_set_u32(w, "general.quantization_version", 2)))
        return rc;
    const struct { const char *k; int v; } u32s[] = {
        { "vocab_size", s->n_vocab }, { "context_length", s->n_ctx }, { "embedding_length", s->dim }, { "block_count", s->n_layer },
        { "feed_forward_length", s->n_ff }, { "attention.head_count", s->n_head }, { "attention.head_count_kv", s->n_head_kv },
        { "rope.dimension_count", s->head_dim }, { "attention.key_length", s->head_dim }, { "attention.value_length", s->head_dim },
        { "expert_count", s->n_expert }, { "expert_used_count", s->n_expert_used },
        { "expert_feed_forward_length", strcmp(a, "qwen3moe") ? 0 : s->n_ff_exp }, { "attention.sliding_window", s->swa },
    };
    for (size_t i = 0; i < sizeof u32s / sizeof *u32s; i++) {
        if (!u32s[i].v) continue;
        snprintf(key, sizeof key, "%s.%s", a, u32s[i].k);
        if ((rc = gguf_w_set_u32(w, key, (uint32_t)u32s[i].v))) return rc;
    }
    float eps = !strcmp(a, "llama") || !strcmp(a, "phi3") ? 1e-5f : 1e-6f;
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    if ((rc = gguf_w_set_f32(w, key, s->rope_base))) return rc;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if ((rc = gguf_w_set_f32(w, key, eps))) return rc;
    if (gemma && !strcmp(a, "gemma2")) {
        if ((rc = gguf_w_set_f32(w, "gemma2.attn_logit_softcapping", 50.0f)) || (rc = gguf_w_set_f32(w, "gemma2.final_logit_softcapping", 30.0f)))
            return rc;
    }
    if (!strcmp(a, "gemma3") && s->dim >= 2560) { /* gemma 3 4B and up: global layers' positions scaled by 8 */
        if ((rc = gguf_w_set_str(w, "gemma3.rope.scaling.type", "linear")) || (rc = gguf_w_set_f32(w, "gemma3.rope.scaling.factor", 8.0f)))
            return rc;
    }
    return 0;
}

int cli_mkmodel(int argc, char **argv) {
    const char *type_name = "f16", *vocab = NULL;
    int64_t seed = 1;
    int vocab_size = 0;
    int n_threads = 0;
    cm_opt opts[] = {
        { "type", 't', CM_OPT_STR, &type_name, "weight type of the matrices and embeddings (default f16)" },
        { "vocab", 0, CM_OPT_STR, &vocab, "vocab-only GGUF whose tokenizer.* keys are copied, or 'none' (default: see above)" },
        { "seed", 's', CM_OPT_I64, &seed, "PRNG seed (default 1)" },
        { "threads", 'j', CM_OPT_INT, &n_threads, "generation threads; 0 = all CPUs (the default)" },
        { "vocab-size", 0, CM_OPT_INT, &vocab_size, "override the shape's vocabulary size (>= the vocab file's tokens)" },
        { 0 },
    };
    char err[512];
    int npos;
    char **pos;
    int prc = cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err);
    if (prc || npos != 2) {
        int help = prc && !strcmp(err, "help");
        if (prc && !help) fprintf(stderr, "arka mkmodel: %s\n", err);
        else if (!prc) fprintf(stderr, "arka mkmodel: expected SHAPE and OUT.gguf\n");
        usage(opts, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    if (n_threads == 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = ncpu > 0 ? (int)(ncpu < MAX_THREADS ? ncpu : MAX_THREADS) : 1;
    }
    const shape *s = NULL;
    shape custom;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (!strcmp(pos[0], shapes[i].name)) s = &shapes[i];
    int type = !strcasecmp(type_name, "q4_k_m") ? TYPE_Q4_K_M : dt_from_name(type_name);
    if (!s || type < 0 || file_type_of(type) < 0 || n_threads < 1 || n_threads > MAX_THREADS || vocab_size < 0 ||
        vocab_size > (1 << 24)) {
        if (!s) fprintf(stderr, "arka mkmodel: unknown shape '%s'\n", pos[0]);
        else if (n_threads < 1 || n_threads > MAX_THREADS) fprintf(stderr, "arka mkmodel: --threads must be 0..%d\n", MAX_THREADS);
        else if (vocab_size < 0 || vocab_size > (1 << 24)) fprintf(stderr, "arka mkmodel: --vocab-size must be 1..%d\n", 1 << 24);
        else if (type == DT_F8_E4M3 || !strcasecmp(type_name, "fp8"))
            fprintf(stderr, "arka mkmodel: --type '%s': GGUF has no FP8 type (write f16 or bf16 and load it with --quantize fp8)\n",
                    type_name);
        else fprintf(stderr, "arka mkmodel: unsupported --type '%s'\n", type_name);
        usage(opts, stderr);
        return 2;
    }
    char vocab_buf[4096 + sizeof DEFAULT_VOCAB];
    if (!vocab) {
        if (default_vocab(vocab_buf, sizeof vocab_buf)) return 1;
        vocab = vocab_buf;
    }
    if (vocab_size) {
        custom = *s;
        custom.n_vocab = vocab_size;
        s = &custom;
    }
    const char *out_path = pos[1];

    int rc, n_plan = 0, status = 1;
    tplan *plan = NULL;
    gguf_writer *w = NULL;
    uint8_t *out = NULL;
    float *scratch = NULL;
    char *part = NULL;
    if ((rc = build_plan(s, type, &plan, &n_plan)) || (rc = gguf_w_create(&w))) {
        fprintf(stderr, "arka mkmodel: out of memory\n");
        goto done;
    }
    if ((rc = set_metadata(w, s, type))) {
        fprintf(stderr, "arka mkmodel: %s\n", gguf_w_errmsg(w));
        goto done;
    }
    if (strcmp(vocab, "none") && (rc = copy_vocab(w, vocab, s->n_vocab, err, sizeof err))) {
        fprintf(stderr, "arka mkmodel: %s\n", err);
        goto done;
    }
    int64_t max_ne0 = 0;
    size_t max_chunk = 0;
    for (int i = 0; i < n_plan; i++) {
        int64_t ne[3] = { plan[i].ne[0], plan[i].ne[1], plan[i].ne[2] };
        if ((rc = gguf_w_add_tensor(w, plan[i].name, plan[i].type, plan[i].n_dims, ne))) {
            fprintf(stderr, "arka mkmodel: %s\n", gguf_w_errmsg(w));
            goto done;
        }
        size_t rs = dt_row_size(plan[i].type, ne[0]), rows = CHUNK_BYTES / rs ? CHUNK_BYTES / rs : 1;
        if ((int64_t)rows > ne[1] * ne[2]) rows = (size_t)(ne[1] * ne[2]);
        if (rows * rs > max_chunk) max_chunk = rows * rs;
        if (ne[0] > max_ne0) max_ne0 = ne[0];
    }
    out = malloc(max_chunk);
    scratch = malloc((size_t)max_ne0 * n_threads * sizeof *scratch);
    part = malloc(strlen(out_path) + 6);
    if (!out || !scratch || !part) {
        fprintf(stderr, "arka mkmodel: out of memory\n");
        goto done;
    }
    sprintf(part, "%s.part", out_path);
    progress prog = { .t0 = cm_time_s(), .total = gguf_w_file_size(w), .tty = isatty(2), .last_pct = -1 };
    if ((rc = gguf_w_begin(w, part))) {
        fprintf(stderr, "arka mkmodel: %s\n", gguf_w_errmsg(w));
        goto done;
    }
    prog.done = gguf_w_header_size(w);
    for (int i = 0; i < n_plan; i++)
        if ((rc = write_tensor(w, &plan[i], i, (uint64_t)seed, n_threads, out, scratch, &prog))) {
            fprintf(stderr, "%sarka mkmodel: %s\n", prog.shown && prog.tty ? "\n" : "",
                    rc == CM_EIO || rc == CM_ERANGE ? gguf_w_errmsg(w) : cm_err_str(rc));
            goto done;
        }
    if ((rc = gguf_w_finish(w))) {
        fprintf(stderr, "arka mkmodel: %s\n", gguf_w_errmsg(w));
        goto done;
    }
    prog.done = prog.total;
    progress_show(&prog, 1);
    if (rename(part, out_path) != 0) {
        perror("arka mkmodel: rename");
        goto done;
    }
    uint64_t params = 0;
    for (int i = 0; i < n_plan; i++) params += (uint64_t)plan[i].ne[0] * (uint64_t)plan[i].ne[1] * (uint64_t)plan[i].ne[2];
    fprintf(stderr, "mkmodel: wrote %s: %s, %s, %.1fM params, %.1f MiB, %d tensors, %.1f s (%d threads)\n", out_path, s->name,
            type == TYPE_Q4_K_M ? "q4_k_m" : dt_name(type), params / 1e6, gguf_w_file_size(w) / 1048576.0, n_plan, cm_time_s() - prog.t0, n_threads);
    status = 0;
done:
    if (status && part) {
        gguf_w_destroy(w);
        w = NULL;
        unlink(part);
    }
    gguf_w_destroy(w);
    free(plan);
    free(out);
    free(scratch);
    free(part);
    return status;
}
