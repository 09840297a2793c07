/* gpu_requant: rewrites a GGUF with the weight types of a quantization mix, for the GPU checks
 * of the types the cuda backend keeps quantized (`arka mkmodel` writes one type throughout).
 *   q4_k_m, q5_k_m: llama.cpp's recipes as they apply to llama-style models: output Q6_K;
 *     attn_v and ffn_down Q6_K in the layers use_more_bits picks (the first and last eighth of
 *     the layers and every third one between), every other matrix (token_embd too) Q4_K / Q5_K;
 *     rows that are not whole super-blocks fall back as llama.cpp does (Q4_K: Q5_0, Q5_K: Q5_1,
 *     Q6_K: Q8_0).
 *   a type name (q4_1, q5_0, q6_k, ...): every matrix in that type.
 * Vectors (norms, biases) keep their type. Metadata is copied; general.file_type says the mix
 * (and is left out for a single type, which has no llama.cpp name here).
 * usage: gpu_requant IN.gguf OUT.gguf RECIPE [THREADS] */
#include "common/cm_err.h"
#include "model/dtype.h"
#include "model/gguf.h"
#include "model/gguf_write.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MIX_NONE, MIX_Q4_K_M, MIX_Q5_K_M };

static int use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama.cpp's fallback for rows that are not whole super-blocks */
static int fallback(int type, int64_t ne0) {
    if (ne0 % 256 == 0) return type;
    switch (type) {
    case DT_Q4_K: return DT_Q5_0;
    case DT_Q5_K: return DT_Q5_1;
    case DT_Q6_K: return DT_Q8_0;
    default: return type;
    }
}

static int type_for(const gguf_tensor *t, int mix, int single, int n_layer) {
    if (t->n_dims < 2 || t->ne[1] == 1) return t->type; /* vectors keep their type */
    if (mix == MIX_NONE) return t->ne[0] % dt_block_size(single) ? t->type : single;
    char name[GGUF_W_MAX_NAME + 1];
    snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
    const int base = mix == MIX_Q4_K_M ? DT_Q4_K : DT_Q5_K;
    int layer = -1, type = base;
    if (sscanf(name, "blk.%d.", &layer) != 1) layer = -1;
    if (!strcmp(name, "output.weight")) type = DT_Q6_K;
    else if (layer >= 0 && (strstr(name, "attn_v.weight") || strstr(name, "ffn_down")) && use_more_bits(layer, n_layer))
        type = DT_Q6_K;
    return fallback(type, t->ne[0]);
}

typedef struct job {
    const gguf_tensor *t;
    int type;
    int64_t row0, n_rows, rows_per; /* this call's rows, split over the threads */
    uint8_t *out;                    /* rows requantized, in order */
    int rc;
} job;

typedef struct part { job *j; int k; } part;

static void *work(void *arg) {
    part *p = arg;
    job *j = p->j;
    const int64_t n_in = j->t->ne[0], r0 = j->row0 + p->k * j->rows_per;
    int64_t r1 = r0 + j->rows_per;
    if (r1 > j->row0 + j->n_rows) r1 = j->row0 + j->n_rows;
    float *f = malloc((size_t)n_in * 4);
    const size_t in_row = dt_row_size(j->t->type, n_in), out_row = dt_row_size(j->type, n_in);
    for (int64_t r = r0; r < r1 && f; r++) {
        int rc = dt_dequantize(j->t->type, (const uint8_t *)j->t->data + r * in_row, f, n_in);
        if (!rc) rc = dt_quantize(j->type, f, j->out + (r - j->row0) * out_row, n_in);
        if (rc) j->rc = rc;
    }
    if (!f) j->rc = CM_ENOMEM;
    free(f);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: gpu_requant IN.gguf OUT.gguf q4_k_m|q5_k_m|TYPE [THREADS]\n");
        return 2;
    }
    const int n_threads = argc > 4 ? atoi(argv[4]) : 8;
    int mix = MIX_NONE, single = -1;
    if (!strcmp(argv[3], "q4_k_m")) mix = MIX_Q4_K_M;
    else if (!strcmp(argv[3], "q5_k_m")) mix = MIX_Q5_K_M;
    else if ((single = dt_from_name(argv[3])) < 0 || !dt_is_supported(single) || n_threads < 1 || n_threads > 256) {
        fprintf(stderr, "gpu_requant: unknown recipe or type '%s' (or bad thread count)\n", argv[3]);
        return 2;
    }
    char err[512];
    gguf_ctx *g;
    if (gguf_open(argv[1], &g, err, sizeof err)) {
        fprintf(stderr, "gpu_requant: %s\n", err);
        return 1;
    }
    int n_layer = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[GGUF_W_MAX_NAME + 1];
        int l;
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (sscanf(name, "blk.%d.", &l) == 1 && l + 1 > n_layer) n_layer = l + 1;
    }
    gguf_writer *w;
    int rc = gguf_w_create(&w);
    for (int64_t i = 0; !rc && i < gguf_n_kv(g); i++) {
        const gguf_kv *kv = gguf_kv_at(g, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (strcmp(key, "general.file_type")) rc = gguf_w_set_value(w, key, &kv->val);
    }
    if (!rc && mix) rc = gguf_w_set_u32(w, "general.file_type", mix == MIX_Q4_K_M ? 15 : 17); /* llama_ftype */
    int *types = calloc((size_t)gguf_n_tensors(g), sizeof *types);
    for (int64_t i = 0; !rc && i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[GGUF_W_MAX_NAME + 1];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        types[i] = type_for(t, mix, single, n_layer);
        rc = gguf_w_add_tensor(w, name, types[i], (int)t->n_dims, t->ne);
    }
    if (!rc) rc = gguf_w_begin(w, argv[2]);
    if (rc) {
        fprintf(stderr, "gpu_requant: %s: %s\n", argv[2], gguf_w_errmsg(w)[0] ? gguf_w_errmsg(w) : cm_err_str(rc));
        return 1;
    }
    size_t counts[64] = { 0 };
    for (int64_t i = 0; !rc && i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        const int64_t rows = t->nbytes / dt_row_size(t->type, t->ne[0]);
        const size_t out_row = dt_row_size(types[i], t->ne[0]);
        if (types[i] >= 0 && types[i] < 64) counts[types[i]]++;
        if (types[i] == t->type) { /* as it is */
            rc = gguf_w_write(w, t->data, t->nbytes);
            continue;
        }
        const int64_t chunk = (int64_t)((64u << 20) / out_row) + 1; /* rows per write, about 64 MB */
        uint8_t *buf = malloc((size_t)(chunk < rows ? chunk : rows) * out_row);
        for (int64_t r0 = 0; !rc && r0 < rows && buf; r0 += chunk) {
            job j = { t, types[i], r0, rows - r0 < chunk ? rows - r0 : chunk, 0, buf, 0 };
            j.rows_per = (j.n_rows + n_threads - 1) / n_threads;
            pthread_t th[256];
            part ps[256];
            for (int k = 0; k < n_threads; k++) {
                ps[k] = (part){ &j, k };
                pthread_create(&th[k], NULL, work, &ps[k]);
            }
            for (int k = 0; k < n_threads; k++) pthread_join(th[k], NULL);
            rc = j.rc ? j.rc : gguf_w_write(w, buf, (size_t)j.n_rows * out_row);
        }
        if (!buf) rc = CM_ENOMEM;
        free(buf);
    }
    if (!rc) rc = gguf_w_finish(w);
    if (rc) {
        fprintf(stderr, "gpu_requant: %s: %s\n", argv[2], gguf_w_errmsg(w)[0] ? gguf_w_errmsg(w) : cm_err_str(rc));
        return 1;
    }
    printf("%s: %s, %.1f MB:", argv[2], argv[3], gguf_w_file_size(w) / 1e6);
    for (int t = 0; t < 64; t++)
        if (counts[t]) printf(" %zu %s", counts[t], dt_name(t));
    printf(" tensors\n");
    gguf_w_destroy(w);
    gguf_close(g);
    free(types);
    return 0;
}
