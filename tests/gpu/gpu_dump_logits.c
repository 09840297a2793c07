/* gpu_dump_logits: writes the logits of every position of a token sequence, computed by one
 * backend, as raw little-endian f32 [n, n_vocab] (for tests/gpu/hf_compare.py).
 * usage: gpu_dump_logits MODEL.gguf BACKEND IDS.txt OUT.f32     (IDS.txt: ids separated by spaces) */
#include "gpu_common.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: gpu_dump_logits MODEL.gguf cpu|cuda IDS.txt OUT.f32\n");
        return 2;
    }
    mdl_model *m;
    char err[512];
    if (mdl_load(argv[1], &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    FILE *f = fopen(argv[3], "r");
    if (!f) { perror(argv[3]); return 1; }
    int32_t *ids = malloc(sizeof(int32_t) * 8192);
    int n = 0;
    while (n < 8192 && fscanf(f, "%d", &ids[n]) == 1) n++;
    fclose(f);
    int chunk = n < 512 ? n : 512;
    g_eng g;
    if (n < 1 || g_open(&g, m, argv[2], n + 16, chunk, 1, chunk, 0)) return 1;
    float *out = malloc((size_t)n * m->cfg.n_vocab * sizeof(float));
    if (g_all_logits(&g, ids, n, chunk, out)) { fprintf(stderr, "forward failed\n"); return 1; }
    FILE *o = fopen(argv[4], "wb");
    if (!o || fwrite(out, sizeof(float), (size_t)n * m->cfg.n_vocab, o) != (size_t)n * m->cfg.n_vocab) { perror(argv[4]); return 1; }
    fclose(o);
    g_close(&g);
    mdl_free(m);
    free(out);
    free(ids);
    return 0;
}
