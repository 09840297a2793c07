/* tok: tokenizers from hand-built GGUF metadata: a tiny SentencePiece and a tiny byte-level
 * vocabulary whose encodings are worked out by hand, and hostile metadata (wrong types, ids out
 * of range, counts that disagree, merges without a space, unknown models and pre-tokenizers,
 * empty and duplicate tokens), which must load sanely or fail with a clear error. */
#include "common/cm_err.h"
#include "model/gguf.h"
#include "text/tok.h"
#include "text/tok_internal.h"
#include "t.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct gb { uint8_t *p; size_t n, cap; uint64_t n_kv; } gb;
static void put(gb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void u32(gb *b, uint32_t x) { put(b, &x, 4); }
static void u64(gb *b, uint64_t x) { put(b, &x, 8); }
static void str(gb *b, const char *s) { u64(b, strlen(s)); put(b, s, strlen(s)); }
static void key(gb *b, const char *k, uint32_t type) { str(b, k); u32(b, type); b->n_kv++; }
static void kv_str(gb *b, const char *k, const char *v) { key(b, k, GGUF_STRING); str(b, v); }
static void kv_u32(gb *b, const char *k, uint32_t v) { key(b, k, GGUF_UINT32); u32(b, v); }
static void kv_bool(gb *b, const char *k, int v) { key(b, k, GGUF_BOOL); uint8_t x = (uint8_t)v; put(b, &x, 1); }
static void kv_strs(gb *b, const char *k, const char *const *v, size_t n) {
    key(b, k, GGUF_ARRAY);
    u32(b, GGUF_STRING);
    u64(b, n);
    for (size_t i = 0; i < n; i++) str(b, v[i]);
}
static void kv_f32s(gb *b, const char *k, const float *v, size_t n) {
    key(b, k, GGUF_ARRAY);
    u32(b, GGUF_FLOAT32);
    u64(b, n);
    put(b, v, n * 4);
}
static void kv_i32s(gb *b, const char *k, const int32_t *v, size_t n) {
    key(b, k, GGUF_ARRAY);
    u32(b, GGUF_INT32);
    u64(b, n);
    put(b, v, n * 4);
}

/* Finishes the file: header in front, padding at the end. */
static uint8_t *finish(gb *kvs, size_t *len) {
    gb f = { 0 };
    put(&f, "GGUF", 4);
    u32(&f, 3);
    u64(&f, 0);
    u64(&f, kvs->n_kv);
    put(&f, kvs->p, kvs->n);
    while (f.n % 32) { uint8_t z = 0; put(&f, &z, 1); }
    free(kvs->p);
    *len = f.n;
    return f.p;
}

static int load(gb *kvs, tok_vocab **v, char *err, size_t errlen) {
    size_t len;
    uint8_t *file = finish(kvs, &len);
    gguf_ctx *g;
    int rc = gguf_open_mem(file, len, &g, err, errlen);
    *v = NULL;
    if (rc == 0) {
        rc = tok_load_gguf(g, v, err, errlen);
        gguf_close(g);
    }
    free(file);
    return rc;
}

/* SPM: <unk> <s> </s> <0x41> <0x0A> ▁ a b c ▁a ab ▁ab bc; scores favour ab over ▁a. */
static const char *const spm_tok[] = { "<unk>", "<s>", "</s>", "<0x41>", "<0x0A>", "\xe2\x96\x81", "a", "b", "c",
                                       "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "bc" };
static const float spm_score[] = { 0, 0, 0, 0, 0, -1, -2, -2, -2, -5, -3, -4, -6 };
static const int32_t spm_type[] = { 2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1 };

static void spm_kvs(gb *b) {
    kv_str(b, "tokenizer.ggml.model", "llama");
    kv_strs(b, "tokenizer.ggml.tokens", spm_tok, 13);
    kv_f32s(b, "tokenizer.ggml.scores", spm_score, 13);
    kv_i32s(b, "tokenizer.ggml.token_type", spm_type, 13);
    kv_u32(b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(b, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(b, "tokenizer.ggml.unknown_token_id", 0);
}

static void test_spm(void) {
    gb b = { 0 };
    spm_kvs(&b);
    tok_vocab *v;
    char err[256] = "";
    int rc = load(&b, &v, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    if (rc) return;
    int32_t ids[32];
    int n;
    /* "ab": ▁ a b -> (a,b)=ab score -3 beats (▁,a)=▁a -5 -> ▁ ab -> ▁ab */
    T_EQ_INT(tok_encode(v, "ab", 2, 1, 0, ids, 32, &n), 0);
    T_CHECK(n == 2 && ids[0] == 1 && ids[1] == 11);
    /* "abc": ab(-3) first, then bc is gone, ▁+ab -> ▁ab, c */
    T_EQ_INT(tok_encode(v, "abc", 3, 0, 0, ids, 32, &n), 0);
    T_CHECK(n == 2 && ids[0] == 11 && ids[1] == 8);
    /* "A" has a byte token, "Z" does not: <unk> */
    T_EQ_INT(tok_encode(v, "A\nZ", 3, 0, 0, ids, 32, &n), 0);
    T_CHECK(n == 4 && ids[0] == 5 && ids[1] == 3 && ids[2] == 4 && ids[3] == 0);
    /* parse_special: a '▁' again after the special token */
    T_EQ_INT(tok_encode(v, "</s>a", 5, 0, 1, ids, 32, &n), 0);
    T_CHECK(n == 2 && ids[0] == 2 && ids[1] == 9);
    T_CHECK(tok_is_eog(v, 2));
    tok_free(v);

    /* add_space_prefix false */
    b = (gb){ 0 };
    spm_kvs(&b);
    kv_bool(&b, "tokenizer.ggml.add_space_prefix", 0);
    T_EQ_INT(load(&b, &v, err, sizeof err), 0);
    T_EQ_INT(tok_encode(v, "ab", 2, 0, 0, ids, 32, &n), 0);
    T_CHECK(n == 1 && ids[0] == 10);
    T_CHECK(!tok_add_space_prefix(v));
    tok_free(v);
}

/* byte-level: the 256 byte characters, then "he" "hel" "hello", merges h e / he l / hel l? no:
 * only "h e" and "he l", so "hello" is he l l o unless ignore_merges finds it whole. */
static void bpe_kvs(gb *b, const char *pre, int with_merges) {
    static char cps[256][8];
    static const char *toks[260];
    for (int i = 0; i < 256; i++) {
        int l = tok__utf8_enc(tok__byte_to_cp((uint8_t)i), cps[i]);
        cps[i][l] = 0;
        toks[i] = cps[i];
    }
    toks[256] = "he";
    toks[257] = "hel";
    toks[258] = "hello";
    toks[259] = "<|eot|>";
    int32_t types[260];
    for (int i = 0; i < 260; i++) types[i] = 1;
    types[259] = 3;
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    if (pre) kv_str(b, "tokenizer.ggml.pre", pre);
    kv_strs(b, "tokenizer.ggml.tokens", toks, 260);
    kv_i32s(b, "tokenizer.ggml.token_type", types, 260);
    static const char *const merges[] = { "h e", "he l" };
    if (with_merges) kv_strs(b, "tokenizer.ggml.merges", merges, 2);
    kv_u32(b, "tokenizer.ggml.eos_token_id", 259);
}

static void test_bpe(void) {
    gb b = { 0 };
    bpe_kvs(&b, "gpt-2", 1);
    tok_vocab *v;
    char err[256] = "";
    int rc = load(&b, &v, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    if (rc) return;
    int32_t ids[32];
    int n;
    T_EQ_INT(tok_encode(v, "hello", 5, 0, 0, ids, 32, &n), 0);
    T_CHECK(n == 3 && ids[0] == 257 && ids[1] == 'l' && ids[2] == 'o');
    T_EQ_INT(tok_encode(v, "<|eot|>", 7, 0, 1, ids, 32, &n), 0);
    T_CHECK(n == 1 && ids[0] == 259);
    T_CHECK(tok_is_eog(v, 259));
    tok_free(v);
    /* llama-bpe: ignore_merges finds "hello" whole */
    b = (gb){ 0 };
    bpe_kvs(&b, "llama-bpe", 1);
    T_EQ_INT(load(&b, &v, err, sizeof err), 0);
    T_EQ_INT(tok_encode(v, "hello", 5, 0, 0, ids, 32, &n), 0);
    T_CHECK(n == 1 && ids[0] == 258);
    T_EQ_STR(tok_pre_name(v), "llama-bpe");
    T_EQ_INT(tok_add_bos(v), 1);
    tok_free(v);
    /* dbrx shares the Llama-3 regex but not ignore_merges (llama.cpp) */
    b = (gb){ 0 };
    bpe_kvs(&b, "dbrx", 1);
    T_EQ_INT(load(&b, &v, err, sizeof err), 0);
    T_EQ_INT(tok_encode(v, "hello", 5, 0, 0, ids, 32, &n), 0);
    T_EQ_INT(n, 3);
    T_EQ_INT(tok_add_bos(v), 0);
    tok_free(v);
    /* unknown pre-tokenizer: a clear error */
    b = (gb){ 0 };
    bpe_kvs(&b, "no-such-pre", 1);
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_EUNSUPPORTED);
    T_CHECK(strstr(err, "no-such-pre") != NULL);
    /* gpt2 without merges */
    b = (gb){ 0 };
    bpe_kvs(&b, "gpt-2", 0);
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_EFORMAT);
    T_CHECK(strstr(err, "merges") != NULL);
    /* no pre key: llama.cpp's default pre-tokenizer */
    b = (gb){ 0 };
    bpe_kvs(&b, NULL, 1);
    T_EQ_INT(load(&b, &v, err, sizeof err), 0);
    T_EQ_STR(tok_pre_name(v), "default");
    tok_free(v);
}

static void test_hostile(void) {
    tok_vocab *v;
    char err[256];
    gb b;
    /* no tokenizer at all */
    b = (gb){ 0 };
    kv_str(&b, "general.name", "x");
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_ENOTFOUND);
    /* unknown model */
    b = (gb){ 0 };
    kv_str(&b, "tokenizer.ggml.model", "bert");
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_EUNSUPPORTED);
    T_CHECK(strstr(err, "bert") != NULL);
    /* model of the wrong type */
    b = (gb){ 0 };
    kv_u32(&b, "tokenizer.ggml.model", 7);
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_ENOTFOUND);
    /* tokens not strings */
    b = (gb){ 0 };
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_i32s(&b, "tokenizer.ggml.tokens", spm_type, 13);
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_EFORMAT);
    /* scores shorter than tokens */
    b = (gb){ 0 };
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", spm_tok, 13);
    kv_f32s(&b, "tokenizer.ggml.scores", spm_score, 12);
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_EFORMAT);
    /* token types out of range, ids out of range, empty and duplicate tokens: loads, sanely */
    static const char *const odd[] = { "", "a", "a", "<s>", "\xff\xfe", "b" };
    static const int32_t odd_type[] = { 1, 1, 1, 99, 1, -4 };
    static const float odd_score[] = { 0, -1, -2, 0, 0, -1 };
    b = (gb){ 0 };
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", odd, 6);
    kv_f32s(&b, "tokenizer.ggml.scores", odd_score, 6);
    kv_i32s(&b, "tokenizer.ggml.token_type", odd_type, 6);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 1000);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 4000000000u);
    T_EQ_INT(load(&b, &v, err, sizeof err), 0);
    if (v) {
        T_EQ_INT(tok_bos(v), -1);
        T_EQ_INT(tok_eos(v), -1);
        int32_t ids[16];
        int n;
        T_EQ_INT(tok_encode(v, "ab<s>", 5, 1, 1, ids, 16, &n), 0);
        for (int i = 0; i < n; i++) T_CHECK(ids[i] >= 0 && ids[i] < 6);
        T_EQ_INT(tok_find(v, "a", 1), 2); /* llama.cpp: the last duplicate wins */
        tok_free(v);
    }
    /* a merge without a space */
    b = (gb){ 0 };
    bpe_kvs(&b, "gpt-2", 0);
    static const char *const bad_merges[] = { "h e", "hel" };
    kv_strs(&b, "tokenizer.ggml.merges", bad_merges, 2);
    T_EQ_INT(load(&b, &v, err, sizeof err), CM_EFORMAT);
    T_CHECK(strstr(err, "merge 1") != NULL);
}

int main(void) {
    test_spm();
    test_bpe();
    test_hostile();
    return t_done();
}
