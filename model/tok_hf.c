/* tok_hf: tokenizers from Hugging Face tokenizer.json, and tok_load_file. */
#include "tok_internal.h"
#include "../common/cm_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

int tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, tok_vocab **out, char *err, size_t errlen) {
    (void)tokenizer_config;
    if (out) *out = NULL;
    snprintf(err, errlen, "%s: tokenizer.json support is not built yet", tokenizer_json ? tokenizer_json : "?");
    return CM_EUNSUPPORTED;
}

int tok_load_file(const char *path, tok_vocab **out, char *err, size_t errlen) {
    if (!path || !out) return CM_EINVAL;
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: no such file or directory", path);
        return CM_ENOENT;
    }
    char json[4096], cfg[4096];
    if (S_ISDIR(st.st_mode)) {
        snprintf(json, sizeof json, "%s/tokenizer.json", path);
    } else {
        unsigned char magic[4] = { 0 };
        FILE *f = fopen(path, "rb");
        if (!f) {
            snprintf(err, errlen, "%s: cannot open", path);
            return CM_EIO;
        }
        size_t got = fread(magic, 1, 4, f);
        fclose(f);
        if (got == 4 && !memcmp(magic, "GGUF", 4)) {
            gguf_ctx *g;
            int rc = gguf_open(path, &g, err, errlen);
            if (rc) return rc;
            rc = tok_load_gguf(g, out, err, errlen);
            gguf_close(g);
            return rc;
        }
        snprintf(json, sizeof json, "%s", path);
    }
    /* the config sits next to tokenizer.json */
    snprintf(cfg, sizeof cfg, "%s", json);
    char *slash = strrchr(cfg, '/');
    size_t dirlen = slash ? (size_t)(slash - cfg + 1) : 0;
    snprintf(cfg + dirlen, sizeof cfg - dirlen, "tokenizer_config.json");
    return tok_load_hf(json, stat(cfg, &st) == 0 ? cfg : NULL, out, err, errlen);
}
