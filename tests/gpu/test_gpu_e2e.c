/* End to end on a GPU host: the cuda backend against the cpu backend.
 *   1. stories260K, "Once upon a time", greedy 200 tokens: identical tokens on both backends and
 *      the text recorded in ../shared/models/README.md (the copy carried as models/stories260K.gguf).
 *   2. Random-weight models (F16, Q8_0; paths on the command line): logits of 512 positions,
 *      relative error <= 1e-2 and top-1 agreement >= 99 %.
 *   3. Batch invariance: 4 prompts of different lengths decoded alone and together give the same
 *      greedy tokens, with CUDA graphs and without.
 * usage: test_gpu_e2e STORIES.gguf [MODEL.gguf ...] */
#include "gpu_common.h"
#include "text/tok.h"
#include "tests/unit/t.h"

#include <math.h>

static const char *k_reference =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, "
    "red ball. She wanted to play with it, but it was too high.\nLily's mom said, \"Lily, let's go to the park.\" Lily was "
    "sad and didn't know what to do. She said, \"I want to play with your ball, but I can't find it.\"\nLily was sad and "
    "didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily didn't want to help her mom, "
    "so she said, \"I";

static void test_stories(const char *path) {
    mdl_model *m;
    char err[512];
    if (mdl_load(path, &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); T_CHECK(0); return; }
    tok_vocab *v;
    T_EQ_INT(tok_load_gguf(m->gguf, &v, err, sizeof err), 0);
    int32_t prompt[64];
    int np = 0;
    T_EQ_INT(tok_encode(v, "Once upon a time", 16, 1, 0, prompt, 64, &np), 0);
    int32_t cpu_out[200], gpu_out[200], *pp[1] = { prompt }, *oc[1] = { cpu_out }, *og[1] = { gpu_out };
    g_eng gc, gg;
    if (g_open(&gc, m, "cpu", 512, 256, 8, 8, 64) || g_open(&gg, m, "cuda", 512, 256, 8, 8, 64)) {
        T_CHECK(!"engines open");
        return;
    }
    T_EQ_INT(g_greedy(&gc, 1, pp, &np, 200, oc), 0);
    T_EQ_INT(g_greedy(&gg, 1, pp, &np, 200, og), 0);
    int same = 0;
    while (same < 200 && cpu_out[same] == gpu_out[same]) same++;
    T_CHECKF(same == 200, "stories260K: cuda and cpu greedy tokens agree for %d of 200", same);
    char text[4096] = "Once upon a time";
    size_t len = strlen(text);
    for (int i = 0; i < 200; i++) {
        size_t n;
        if (tok_piece(v, gpu_out[i], text + len, sizeof text - len - 1, &n) == 0) len += n;
    }
    text[len] = 0;
    T_CHECKF(strncmp(text, k_reference, strlen(k_reference)) == 0, "stories260K cuda text differs:\n%s", text);
    printf("stories260K: cuda == cpu for %d/200 greedy tokens\n", same);
    g_close(&gc);
    g_close(&gg);
    tok_free(v);
    mdl_free(m);
}

static void test_logits(const char *path) {
    mdl_model *m;
    char err[512];
    if (mdl_load(path, &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); T_CHECK(0); return; }
    const int n = 512, V = m->cfg.n_vocab;
    int32_t *ids = malloc(n * sizeof *ids);
    uint64_t r = 42;
    for (int i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % (uint64_t)V);
    }
    float *lc = malloc((size_t)n * V * 4), *lg = malloc((size_t)n * V * 4);
    g_eng gc, gg;
    if (g_open(&gc, m, "cpu", 1024, 512, 4, 512, 256) || g_open(&gg, m, "cuda", 1024, 512, 4, 512, 256)) {
        T_CHECK(!"engines open");
        return;
    }
    T_EQ_INT(g_all_logits(&gc, ids, n, 128, lc), 0);
    T_EQ_INT(g_all_logits(&gg, ids, n, 128, lg), 0);
    int agree = 0;
    double worst = 0, sum = 0;
    for (int p = 0; p < n; p++) {
        double num = 0, den = 0;
        for (int j = 0; j < V; j++) {
            double d = (double)lg[(size_t)p * V + j] - lc[(size_t)p * V + j];
            num += d * d;
            den += (double)lc[(size_t)p * V + j] * lc[(size_t)p * V + j];
        }
        double e = sqrt(num / (den > 0 ? den : 1));
        worst = e > worst ? e : worst;
        sum += e;
        agree += g_argmax(lg + (size_t)p * V, V) == g_argmax(lc + (size_t)p * V, V);
    }
    printf("%s: 512 positions, rel err mean %.2e max %.2e, top-1 agreement %.2f%%\n", path, sum / n, worst, 100.0 * agree / n);
    T_CHECKF(worst <= 1e-2, "%s: max rel err %.3g", path, worst);
    T_CHECKF(agree * 100 >= 99 * n, "%s: top-1 agreement %d/%d", path, agree, n);
    g_close(&gc);
    g_close(&gg);
    free(ids);
    free(lc);
    free(lg);
    mdl_free(m);
}

static void test_batch_invariance(const char *path, int graphs) {
    mdl_model *m;
    char err[512];
    if (mdl_load(path, &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); T_CHECK(0); return; }
    if (graphs) unsetenv("ARKA_CUDA_NO_GRAPHS");
    else setenv("ARKA_CUDA_NO_GRAPHS", "1", 1);
    const int lens[4] = { 3, 17, 40, 9 }, n_gen = 48, V = m->cfg.n_vocab;
    int32_t *prompts[4], *alone[4], *together[4];
    uint64_t r = 7;
    for (int s = 0; s < 4; s++) {
        prompts[s] = malloc(lens[s] * sizeof(int32_t));
        alone[s] = malloc(n_gen * sizeof(int32_t));
        together[s] = malloc(n_gen * sizeof(int32_t));
        for (int i = 0; i < lens[s]; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            prompts[s][i] = (int32_t)((r >> 33) % (uint64_t)V);
        }
    }
    g_eng g;
    if (g_open(&g, m, "cuda", 256, 128, 8, 8, 64)) {
        T_CHECK(!"engine opens");
        return;
    }
    for (int s = 0; s < 4; s++) T_EQ_INT(g_greedy(&g, 1, &prompts[s], &lens[s], n_gen, &alone[s]), 0);
    T_EQ_INT(g_greedy(&g, 4, prompts, lens, n_gen, together), 0);
    int same = 1;
    for (int s = 0; s < 4; s++) same &= memcmp(alone[s], together[s], n_gen * sizeof(int32_t)) == 0;
    T_CHECKF(same, "%s: greedy tokens alone != together (graphs %s)", path, graphs ? "on" : "off");
    printf("%s: batch invariance with graphs %s: %s\n", path, graphs ? "on" : "off", same ? "identical" : "DIFFERENT");
    g_close(&g);
    for (int s = 0; s < 4; s++) {
        free(prompts[s]);
        free(alone[s]);
        free(together[s]);
    }
    unsetenv("ARKA_CUDA_NO_GRAPHS");
    mdl_free(m);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_gpu_e2e STORIES.gguf [MODEL.gguf ...]\n");
        return 2;
    }
    test_stories(argv[1]);
    test_batch_invariance(argv[1], 1);
    test_batch_invariance(argv[1], 0);
    for (int i = 2; i < argc; i++) {
        test_logits(argv[i]);
        test_batch_invariance(argv[i], 1);
        test_batch_invariance(argv[i], 0);
    }
    return t_done();
}
