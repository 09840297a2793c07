/* fuzz_grammar: arbitrary bytes as a GBNF grammar and as a JSON schema (first byte picks),
 * compiled (text/grammar.h); a program that compiles is checked again (executor/grammar.h),
 * bound to a byte vocabulary and walked for a few steps along its masks. Anything may be an
 * error; nothing may crash, leak or hang.
 *
 *   cmake -S . -B build-fuzz -DARKA_FUZZ=ON -DCMAKE_C_COMPILER=clang -DARKA_CUDA=OFF \
 *         -DARKA_SANITIZE=fuzzer-no-link,address,undefined
 *   cmake --build build-fuzz -j2 --target fuzz_grammar
 *   mkdir -p /tmp/grammar-corpus && build-fuzz/bin/fuzz_grammar -max_total_time=120 -max_len=4096 \
 *         -rss_limit_mb=2048 -timeout=10 /tmp/grammar-corpus */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "executor/grammar.h"
#include "text/grammar.h"

static ex_gram_vocab *bytes_vocab;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!bytes_vocab) { /* 256 one-byte tokens, a two-byte one and an end token */
        uint32_t off[260];
        uint8_t b[258];
        for (int i = 0; i < 256; i++) { off[i] = (uint32_t)i; b[i] = (uint8_t)i; }
        b[256] = '{', b[257] = '"';
        off[256] = 256, off[257] = 258, off[258] = 258;
        if (ex_gram_vocab_create(258, 258, off, b, &bytes_vocab)) abort();
    }
    if (size < 1) return 0;
    char err[512];
    uint32_t *prog = NULL;
    size_t plen = 0;
    const char *src = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        tok_gbnf d;
        tok_gbnf_init(&d);
        if (tok_gbnf_schema(&d, "root", src, n, err, sizeof err) == 0) tok_gram_compile(d.s, d.len, NULL, &prog, &plen, err, sizeof err);
        tok_gbnf_free(&d);
    } else {
        tok_gram_compile(src, n, NULL, &prog, &plen, err, sizeof err);
    }
    if (!prog) return 0;
    if (ex_gram_check(prog, plen, err, sizeof err)) abort(); /* a compiled program must pass the executor's check */
    int32_t end = 257;
    ex_gram *g;
    if (ex_gram_create(prog, plen, bytes_vocab, &end, 1, &g, err, sizeof err) == 0) {
        ex_gram_state st;
        if (ex_gram_state_init(g, &st) == 0)
            for (int step = 0; step < 16; step++) {
                const uint32_t *m;
                if (ex_gram_mask(g, &st, &m)) break;
                int t = -1;
                for (int k = 0; k < 258 && t < 0; k++) /* the first allowed token after a data-driven offset */
                    if (ex_gram_mask_test(m, (k + data[step % size]) % 258)) t = (k + data[step % size]) % 258;
                if (t < 0 || t == end) break;
                if (ex_gram_advance(g, &st, t)) abort(); /* an allowed token must advance */
            }
        ex_gram_destroy(g);
    }
    free(prog);
    return 0;
}
