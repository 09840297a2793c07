/* arka tokenize -m FILE [--ids] [-f FILE] [--no-bos] [--parse-special] [TEXT]: token ids of a
 * text with a model's tokenizer (GGUF model, vocab-only GGUF, tokenizer.json or its directory).
 * With --decode the other way: ids in, text out. */
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "text/detok.h"
#include "text/tok.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int read_all(FILE *f, char **out, size_t *len) {
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    if (!buf) return CM_ENOMEM;
    for (;;) {
        if (n == cap) {
            if (cap >= TOK_MAX_TEXT) { free(buf); return CM_ETOOBIG; }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); return CM_ENOMEM; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) { free(buf); return CM_EIO; }
    *out = buf;
    *len = n;
    return 0;
}

/* Prints bytes as a double-quoted C-like string: valid UTF-8 as is, the rest escaped. */
static void print_quoted(const char *p, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') { printf("\\%c", c); i++; }
        else if (c == '\n') { fputs("\\n", stdout); i++; }
        else if (c == '\t') { fputs("\\t", stdout); i++; }
        else if (c == '\r') { fputs("\\r", stdout); i++; }
        else if (c < 0x20 || c == 0x7f) { printf("\\x%02x", c); i++; }
        else if (c < 0x80) { putchar(c); i++; }
        else {
            size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            int ok = l > 1 && c <= 0xF4 && i + l <= n;
            for (size_t k = 1; ok && k < l; k++) ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
            if (ok) { fwrite(p + i, 1, l, stdout); i += l; }
            else { printf("\\x%02x", c); i++; }
        }
    }
    putchar('"');
}

/* --decode: text[0..len) holds ids (separated by spaces, tabs or commas), one sequence per line
 * (a final newline ends the last one). Each sequence is decoded from the start of a document
 * (an SPM vocabulary's space prefix dropped, control tokens as their text, bad UTF-8 as U+FFFD)
 * and written followed by a newline, or with split set, the texts are joined by split. Every id
 * is checked before anything is written. Returns 0, or 1 after one line on stderr. */
static int decode(const tok_vocab *v, const char *text, size_t len, const char *split) {
    tok_detok d;
    tok_detok_init(&d, v, TOK_DETOK_STRIP_LEADING); /* for the capacity; again per sequence */
    size_t cap = tok_detok_out_cap(&d), n;
    char *out = malloc(cap);
    if (!out) {
        fprintf(stderr, "arka tokenize: out of memory\n");
        return 1;
    }
    int rc = 0;
    for (int write = 0; write < 2 && !rc; write++) { /* pass 0 checks, pass 1 writes */
        for (size_t at = 0;;) {
            const char *nl = memchr(text + at, '\n', len - at);
            size_t end = nl ? (size_t)(nl - text) : len;
            if (write && at && split) fputs(split, stdout);
            tok_detok_init(&d, v, TOK_DETOK_STRIP_LEADING);
            for (size_t i = at; i < end && !rc;) {
                if (strchr(" \t,\r", text[i])) { i++; continue; }
                char *e;
                errno = 0;
                long id = strtol(text + i, &e, 10);
                if (e == text + i || errno || (size_t)(e - text) > end || id < 0 || id >= tok_n_vocab(v)) {
                    fprintf(stderr, "arka tokenize: --decode: '%.*s' is not a token id in [0, %d)\n",
                            (int)strcspn(text + i, " \t,\r\n"), text + i, tok_n_vocab(v));
                    rc = 1;
                    break;
                }
                if (write && tok_detok_push(&d, (int32_t)id, out, cap, &n) == 0) fwrite(out, 1, n, stdout);
                i = (size_t)(e - text);
            }
            if (rc) break;
            if (write && tok_detok_flush(&d, out, cap, &n) == 0) fwrite(out, 1, n, stdout);
            if (write && !split) putchar('\n');
            if (!nl || end + 1 == len) break; /* a final newline ends the last sequence */
            at = end + 1;
        }
    }
    free(out);
    return rc;
}

int cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *split = NULL;
    int ids_only = 0, no_bos = 0, parse_special = 0, do_decode = 0;
    cm_opt opts[] = {
        { "model", 'm', CM_OPT_STR, &model, "GGUF model, vocab-only GGUF, tokenizer.json or a directory holding one" },
        { "file", 'f', CM_OPT_STR, &file, "read the text from this file (else TEXT, else stdin)" },
        { "ids", 0, CM_OPT_BOOL, &ids_only, "print only the ids, space-separated, on one line" },
        { "no-bos", 0, CM_OPT_BOOL, &no_bos, "do not add BOS (nor EOS) even when the model asks for it" },
        { "parse-special", 0, CM_OPT_BOOL, &parse_special, "match special tokens' text (<|eot_id|>, <s>, ...) in the input" },
        { "split", 0, CM_OPT_STR, &split, "encode each SEP-separated part on its own, one line of ids per part (implies --ids)" },
        { "decode", 0, CM_OPT_BOOL, &do_decode, "the input is ids, one sequence per line: print each one's text (--split SEP: join them with SEP)" },
        { 0 },
    };
    char err[512] = "";
    int npos = 0;
    char **pos = NULL;
    int prc = cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err);
    int bad_decode = do_decode && (ids_only || no_bos || parse_special);
    if (prc || !model || npos > 1 || (npos == 1 && file) || bad_decode) {
        int help = prc && !strcmp(err, "help");
        if (prc && !help) fprintf(stderr, "arka tokenize: %s\n", err);
        else if (!prc && !model) fprintf(stderr, "arka tokenize: -m FILE is required\n");
        else if (!prc && bad_decode) fprintf(stderr, "arka tokenize: --ids, --no-bos and --parse-special are for encoding, not --decode\n");
        else if (!prc) fprintf(stderr, "arka tokenize: give the text once: as TEXT or with -f FILE\n");
        fprintf(help ? stdout : stderr, "usage: arka tokenize -m FILE [--ids] [-f FILE] [--no-bos] [--parse-special] [--split SEP] [TEXT]\n"
                                        "       arka tokenize -m FILE --decode [-f FILE] [--split SEP] [IDS]\n");
        cm_config_usage(opts, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    tok_vocab *v;
    int rc = tok_load_file(model, &v, err, sizeof err);
    if (rc) {
        fprintf(stderr, "arka tokenize: %s\n", err);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    if (npos == 1) {
        len = strlen(pos[0]);
        text = malloc(len + 1);
        if (text) memcpy(text, pos[0], len + 1);
        rc = text ? 0 : CM_ENOMEM;
    } else if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) {
            fprintf(stderr, "arka tokenize: %s: cannot open\n", file);
            tok_free(v);
            return 1;
        }
        rc = read_all(f, &text, &len);
        fclose(f);
    } else {
        rc = read_all(stdin, &text, &len);
    }
    if (rc) {
        fprintf(stderr, "arka tokenize: reading the text: %s\n", cm_err_str(rc));
        tok_free(v);
        return 1;
    }
    if (split && !*split) split = NULL;
    if (do_decode) {
        rc = decode(v, text, len, split);
        free(text);
        tok_free(v);
        return rc || fflush(stdout) ? 1 : 0;
    }
    int add_bos = !no_bos && tok_add_bos(v);
    if (split) ids_only = 1;
    int cap = 1024, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) rc = CM_ENOMEM;
    for (size_t at = 0; !rc && at <= len;) {
        const char *end = split ? memmem(text + at, len - at, split, strlen(split)) : NULL;
        size_t plen = end ? (size_t)(end - (text + at)) : len - at;
        rc = tok_encode(v, text + at, plen, add_bos, parse_special, ids, cap, &n);
        if (rc == CM_EFULL) {
            free(ids);
            cap = n;
            ids = malloc((size_t)cap * sizeof *ids);
            rc = ids ? tok_encode(v, text + at, plen, add_bos, parse_special, ids, cap, &n) : CM_ENOMEM;
        }
        if (rc) break;
        for (int i = 0; i < n; i++) {
            if (ids_only) {
                printf(i ? " %d" : "%d", ids[i]);
                continue;
            }
            size_t pl = 0;
            const char *p = tok_piece_ref(v, ids[i], &pl);
            printf("%6d ", ids[i]);
            print_quoted(p ? p : "", p ? pl : 0);
            putchar('\n');
        }
        if (ids_only) putchar('\n');
        if (!end) break;
        at += plen + strlen(split);
    }
    if (rc) {
        fprintf(stderr, "arka tokenize: %s\n", rc == CM_EUTF8 ? "the text is not valid UTF-8" : cm_err_str(rc));
        free(ids);
        free(text);
        tok_free(v);
        return 1;
    }
    free(ids);
    free(text);
    tok_free(v);
    return fflush(stdout) == 0 ? 0 : 1;
}
