/* llamacpp_logits: llama.cpp's logits for a reference model, to check that the GGUFs written by
 * tests/models/make_refs.py load in llama.cpp and give transformers' logits. Used by
 * tests/models/llamacpp_check.sh; not part of the CMake build or CI (llama.cpp is not a
 * dependency of the project).
 *
 *   llamacpp_logits MODEL.gguf IDS.txt OUT.bin [THREADS]
 *
 * Reads the ids (whitespace- or comma-separated, as arka perplexity --ids), runs them as one
 * sequence from position 0 in one batch with logits requested at every position, and writes
 * float32 [n_ids][n_vocab] raw little-endian to OUT.bin. KV cache in F32, flash attention off,
 * so the only roundings apart from float32 are those of llama.cpp's CPU matmuls.
 * Returns 0, or 1 with a message on stderr.
 *
 * Built against a llama.cpp build tree (llama.h's public API only):
 *
 *   cc -O2 -o llamacpp_logits tests/models/llamacpp_logits.c -I$LLAMA_SRC/include \
 *      -I$LLAMA_SRC/ggml/include -L$LLAMA_BUILD/bin -lllama -Wl,-rpath,$LLAMA_BUILD/bin
 */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_IDS 4096

static int read_ids(const char *path, llama_token *ids, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, c;
    long v;
    while (n < cap) {
        while ((c = fgetc(f)) == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {}
        if (c == EOF) break;
        ungetc(c, f);
        if (fscanf(f, "%ld", &v) != 1) { n = -1; break; }
        ids[n++] = (llama_token)v;
    }
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS.txt OUT.bin [THREADS]\n", argv[0]);
        return 1;
    }
    static llama_token ids[MAX_IDS];
    int n = read_ids(argv[2], ids, MAX_IDS), rc = 1;
    if (n <= 0) { fprintf(stderr, "%s: no ids read\n", argv[2]); return 1; }

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    struct llama_context *ctx = NULL;
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    FILE *out = NULL;
    if (!model) { fprintf(stderr, "%s: llama.cpp could not load the model\n", argv[1]); goto done; }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n; // llama.cpp pads it to a multiple of 256
    cp.n_batch = cp.n_ubatch = (uint32_t)n;
    cp.n_threads = cp.n_threads_batch = argc > 4 ? atoi(argv[4]) : 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (!(ctx = llama_init_from_model(model, cp))) { fprintf(stderr, "%s: no context\n", argv[1]); goto done; }

    for (int i = 0; i < n; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch)) { fprintf(stderr, "%s: llama_decode failed\n", argv[1]); goto done; }

    int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (!(out = fopen(argv[3], "wb"))) { perror(argv[3]); goto done; }
    for (int i = 0; i < n; i++) {
        const float *row = llama_get_logits_ith(ctx, i); // [n_vocab]
        if (!row || fwrite(row, sizeof *row, (size_t)V, out) != (size_t)V) { fprintf(stderr, "%s: row %d\n", argv[3], i); goto done; }
    }
    rc = 0;
done:
    if (out && fclose(out)) rc = 1;
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
