/* fuzz_tok: libFuzzer target for tok_encode / tok_piece over the llama-spm and gpt-2 test
 * vocabularies (loaded once; run from the project root or set ARKA_ROOT).
 *
 *   build-fuzz/bin/fuzz_tok -max_total_time=120 -max_len=4096
 *
 * Byte 0 of the input picks the mode, the vocabulary and the flags; the rest is the text, or
 * (mode bit 0x80) a tokenizer.json given to tok_load_hf_mem, which must load or fail cleanly;
 * what loads must encode and decode; or (mode bit 0x40) byte 1 names a pre-tokenizer whose
 * words must cover valid UTF-8 text exactly, in order, none empty. For texts, checked:
 *  - tok_encode returns CM_EUTF8 exactly when the text is not valid UTF-8, else 0;
 *  - a too small output buffer gives CM_EFULL, the same count and the same leading ids;
 *  - every id is in range and decodes;
 *  - gpt-2 (byte-level): decode(encode(x)) == x, with or without parse_special;
 *  - llama-spm without parse_special: decode(encode(x)) == " " + x with each '▁' of x read as a
 *    space (SentencePiece's space marker; the one lossy spot). */
#include "common/cm_err.h"
#include "model/gguf.h"
#include "text/tok.h"
#include "text/tok_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tok_vocab *vocabs[2];

static tok_vocab *load(const char *name) {
    char path[1024];
    const char *root = getenv("ARKA_ROOT");
    snprintf(path, sizeof path, "%s%s../shared/models/vocab/%s", root ? root : "", root ? "/" : "", name);
    tok_vocab *v;
    char err[256];
    if (tok_load_file(path, &v, err, sizeof err)) {
        fprintf(stderr, "fuzz_tok: %s\n", err);
        abort();
    }
    return v;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    vocabs[0] = load("ggml-vocab-llama-spm.gguf");
    vocabs[1] = load("ggml-vocab-gpt-2.gguf");
    return 0;
}

/* An independent strict UTF-8 check. */
static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        uint32_t cp;
        size_t l;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { l = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { l = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { l = 4; cp = c & 0x07; }
        else return 0;
        if (i + l > n) return 0;
        for (size_t k = 1; k < l; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((l == 2 && cp < 0x80) || (l == 3 && cp < 0x800) || (l == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += l;
    }
    return 1;
}

typedef struct cover { size_t at, words; } cover;
static int cover_word(void *ctx, size_t a, size_t b) {
    cover *c = ctx;
    if (a != c->at || b <= a) abort(); /* words are contiguous and never empty */
    c->at = b;
    c->words++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 0x80) {
        tok_vocab *hv = NULL;
        char err[256] = "";
        if (tok_load_hf_mem("fuzz.json", (const char *)data + 1, size - 1, NULL, NULL, 0, &hv, err, sizeof err) == 0) {
            static const char probe[] = "Hello world, it's 2024! \xc3\xa9\xe2\x96\x81 <|end|> [NOTE]  \n";
            int32_t pid[256];
            int pn;
            if (tok_encode(hv, probe, sizeof probe - 1, 1, 1, pid, 256, &pn) == 0)
                for (int i = 0; i < pn; i++) {
                    size_t pl;
                    if (pid[i] < 0 || pid[i] >= tok_n_vocab(hv) || !tok_piece_ref(hv, pid[i], &pl)) abort();
                }
            tok_free(hv);
        } else if (!err[0]) {
            abort(); /* a failure must say why */
        }
        return 0;
    }
    if (data[0] & 0x40) {
        if (size < 2 || !valid_utf8(data + 2, size - 2)) return 0;
        cover c = { 0, 0 };
        int pre = 1 + data[1] % (TOK__PRE_COUNT - 1);
        if (tok__pretokenize(pre, data + 2, size - 2, cover_word, &c) != 0 || c.at != size - 2) abort();
        return 0;
    }
    int which = data[0] & 1, parse_special = (data[0] >> 1) & 1, add_bos = (data[0] >> 2) & 1;
    const tok_vocab *v = vocabs[which];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int cap = (int)len * 2 + 8, n = -1;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int rc = tok_encode(v, text, len, add_bos, parse_special, ids, cap, &n);
    int valid = valid_utf8((const uint8_t *)text, len);
    if (!valid) {
        if (rc != CM_EUTF8 || n != 0) abort();
        free(ids);
        return 0;
    }
    if (rc != 0 || n < 0 || n > cap) abort();
    /* a short buffer: CM_EFULL, same count, same prefix */
    if (n > 1) {
        int small = n / 2, n2 = -1;
        int32_t *ids2 = malloc((size_t)small * sizeof *ids2);
        if (tok_encode(v, text, len, add_bos, parse_special, ids2, small, &n2) != CM_EFULL || n2 != n) abort();
        if (memcmp(ids, ids2, (size_t)small * sizeof *ids)) abort();
        free(ids2);
    }
    /* decode */
    size_t dcap = len * 3 + 64, dl = 0;
    char *d = malloc(dcap);
    int start = add_bos && tok_bos(v) >= 0 ? 1 : 0;
    if (start && ids[0] != tok_bos(v)) abort();
    for (int i = 0; i < n; i++) {
        size_t pl;
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(v)) abort();
        const char *p = tok_piece_ref(v, ids[i], &pl);
        if (!p) abort();
        if (i < start) continue;
        if (dl + pl > dcap) {
            dcap = (dl + pl) * 2;
            d = realloc(d, dcap);
        }
        memcpy(d + dl, p, pl);
        dl += pl;
    }
    if (which == 1) {
        if (dl != len || memcmp(d, text, len)) abort();
    } else if (!parse_special) {
        /* " " + x, '▁' -> ' ' */
        char *want = malloc(len + 2);
        size_t w = 0;
        if (len) want[w++] = ' ';
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && !memcmp(text + i, "\xe2\x96\x81", 3)) { want[w++] = ' '; i += 3; }
            else want[w++] = text[i++];
        }
        if (dl != w || memcmp(d, want, w)) abort();
        free(want);
    }
    free(d);
    free(ids);
    return 0;
}
