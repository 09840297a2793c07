/* tok: tokenizer.json loading from memory: a small byte-level BPE and a small
 * SentencePiece-style BPE with byte fallback built here, their encodings worked out by hand,
 * added tokens (special or not, lstrip/rstrip), unsupported constructs as clear errors, and
 * every truncation / many random corruptions of a tokenizer.json refused without a crash. */
#include "common/cm_err.h"
#include "text/tok.h"
#include "text/tok_internal.h"
#include "t.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct sb { char *p; size_t n, cap; } sb;
static void sb_add(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sb *b, const char *s) { sb_add(b, s, strlen(s)); }
/* a JSON string literal of UTF-8 bytes s */
static void sb_json(sb *b, const char *s) {
    sb_str(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char tmp[8];
        if (c == '"' || c == '\\') { tmp[0] = '\\'; tmp[1] = (char)c; sb_add(b, tmp, 2); }
        else if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); sb_str(b, tmp); }
        else sb_add(b, (const char *)&c, 1);
    }
    sb_str(b, "\"");
}

/* Byte-level: the 256 byte characters are ids 0..255, then merges h+e, he+l, hel+l, hell+o,
 * Ġ+w ("Ġ" is the space byte), Ġw+o; added tokens <|end|> (special) and [NOTE] (not special,
 * rstrip). */
static char *bytelevel_json(size_t *len, const char *pre) {
    sb b = { 0 };
    sb_str(&b, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":300,\"content\":\"<|end|>\",\"special\":true,\"lstrip\":false,\"rstrip\":false},"
               "{\"id\":301,\"content\":\"[NOTE]\",\"special\":false,\"rstrip\":true}],");
    sb_str(&b, "\"normalizer\":null,\"pre_tokenizer\":");
    sb_str(&b, pre);
    sb_str(&b, ",\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
               "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"ignore_merges\":false,\"vocab\":{");
    char cp[8];
    for (int i = 0; i < 256; i++) {
        int l = tok__utf8_enc(tok__byte_to_cp((uint8_t)i), cp);
        cp[l] = 0;
        if (i) sb_str(&b, ",");
        sb_json(&b, cp);
        char num[16];
        snprintf(num, sizeof num, ":%d", i);
        sb_str(&b, num);
    }
    sb_str(&b, ",\"he\":256,\"hel\":257,\"hell\":258,\"hello\":259,\"\xc4\xa0w\":260,\"\xc4\xa0wo\":261},"
               "\"merges\":[\"h e\",\"he l\",[\"hel\",\"l\"],\"hell o\",\"\xc4\xa0 w\",\"\xc4\xa0w o\"]}}");
    *len = b.n;
    return b.p;
}

static int enc(const tok_vocab *v, const char *s, int special, int32_t *ids, int cap) {
    int n = -1;
    int rc = tok_encode(v, s, strlen(s), 0, special, ids, cap, &n);
    return rc ? rc : n;
}

static void test_bytelevel(void) {
    size_t len;
    char *json = bytelevel_json(&len, "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}");
    tok_vocab *v;
    char err[256] = "";
    int rc = tok_load_hf_mem("mem.json", json, len, NULL, NULL, 0, &v, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    if (rc) { free(json); return; }
    T_EQ_INT(tok_kind(v), TOK_KIND_BPE);
    T_EQ_INT(tok_n_vocab(v), 302);
    int32_t ids[64];
    /* "hello wow": words "hello", " wow" -> hello | Ġwo w */
    T_EQ_INT(enc(v, "hello wow", 0, ids, 64), 3);
    T_CHECK(ids[0] == 259 && ids[1] == 261 && ids[2] == 'w');
    /* "hell" -> hell; "hel" -> hel; "eh" -> e h */
    T_EQ_INT(enc(v, "hell", 0, ids, 64), 1);
    T_EQ_INT(ids[0], 258);
    T_EQ_INT(enc(v, "eh", 0, ids, 64), 2);
    /* special token only with parse_special; the user-defined one always, eating spaces on its right */
    T_EQ_INT(enc(v, "<|end|>", 1, ids, 64), 1);
    T_EQ_INT(ids[0], 300);
    T_CHECK(enc(v, "<|end|>", 0, ids, 64) > 1);
    T_EQ_INT(enc(v, "[NOTE]   hello", 0, ids, 64), 2);
    T_CHECK(ids[0] == 301 && ids[1] == 259);
    T_EQ_INT(tok_type(v, 300), TOK_TYPE_CONTROL);
    /* <|end|> is a known end of turn: an end-of-generation id, though no eos_token names it */
    int32_t eog[TOK_EOG_MAX];
    T_CHECK(tok_is_eog(v, 300) && !tok_is_eog(v, 301));
    T_EQ_INT(tok_eog_ids(v, eog, TOK_EOG_MAX), 1);
    T_EQ_INT(eog[0], 300);
    T_EQ_INT(tok_type(v, 301), TOK_TYPE_USER_DEFINED);
    /* decode: Ġ is a space again, bytes >= 0x80 too */
    char buf[16];
    size_t pl;
    T_EQ_INT(tok_piece(v, 261, buf, sizeof buf, &pl), 0);
    T_CHECK(pl == 3 && !memcmp(buf, " wo", 3));
    T_EQ_INT(tok_piece(v, 0xE9, buf, sizeof buf, &pl), 0); /* byte 0xE9 */
    T_CHECK(pl == 1 && (unsigned char)buf[0] == 0xE9);
    T_EQ_INT(tok_piece(v, 300, buf, sizeof buf, &pl), 0);
    T_CHECK(pl == 7 && !memcmp(buf, "<|end|>", 7));
    T_EQ_INT(tok_bos(v), -1);
    T_EQ_INT(tok_add_bos(v), 0);
    tok_free(v);

    /* every truncation is an error, never a crash */
    int refused = 0;
    for (size_t cut = 0; cut < len; cut += (cut < 600 || len - cut < 400) ? 1 : 37) {
        char *part = malloc(cut + 1);
        memcpy(part, json, cut);
        v = NULL;
        rc = tok_load_hf_mem("cut.json", part, cut, NULL, NULL, 0, &v, err, sizeof err);
        refused += rc != 0;
        if (rc == 0) T_CHECKF(0, "truncated at %zu accepted", cut);
        tok_free(v);
        free(part);
    }
    T_CHECK(refused > 100);
    /* random corruption: no crash; what loads must encode */
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int it = 0; it < 300; it++) {
        char *m = malloc(len);
        memcpy(m, json, len);
        for (int k = 0; k < 4; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(seed >> 33) % len;
            m[at] = (char)(seed >> 13);
        }
        v = NULL;
        if (tok_load_hf_mem("mut.json", m, len, NULL, NULL, 0, &v, err, sizeof err) == 0) {
            int n;
            tok_encode(v, "hello world <|end|>", 19, 1, 1, ids, 64, &n);
            tok_free(v);
        }
        free(m);
    }
    free(json);
}

static void test_unsupported(void) {
    static const char *const pres[] = {
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false}",
        "{\"type\":\"Digits\",\"individual_digits\":true}",
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Removed\",\"invert\":false}",
    };
    for (size_t i = 0; i < sizeof pres / sizeof *pres; i++) {
        size_t len;
        char *json = bytelevel_json(&len, pres[i]);
        tok_vocab *v = NULL;
        char err[512] = "";
        int rc = tok_load_hf_mem("u.json", json, len, NULL, NULL, 0, &v, err, sizeof err);
        T_CHECKF(rc == CM_EUNSUPPORTED && strstr(err, "u.json") && strstr(err, "not"), "case %zu: rc %d: %s", i, rc, err);
        tok_free(v);
        free(json);
    }
    /* the Llama 3 pattern is recognised */
    size_t len;
    char *json = bytelevel_json(&len, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}");
    tok_vocab *v = NULL;
    char err[512] = "";
    T_CHECKF(tok_load_hf_mem("l3.json", json, len, NULL, NULL, 0, &v, err, sizeof err) == 0, "%s", err);
    T_EQ_STR(tok_pre_name(v), "llama-bpe");
    tok_free(v);
    free(json);
    const char *uni = "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}";
    T_EQ_INT(tok_load_hf_mem("x.json", uni, strlen(uni), NULL, NULL, 0, &v, err, sizeof err), CM_EUNSUPPORTED);
    const char *empty = "{}";
    T_EQ_INT(tok_load_hf_mem("x.json", empty, 2, NULL, NULL, 0, &v, err, sizeof err), CM_EFORMAT);
    T_EQ_INT(tok_load_hf_mem("x.json", "", 0, NULL, NULL, 0, &v, err, sizeof err), CM_EFORMAT);
    T_EQ_INT(tok_load_file("/nonexistent/tokenizer.json", &v, err, sizeof err), CM_ENOENT);
}

/* SentencePiece-converted: Metaspace(prepend first), byte fallback, <unk>, BOS from the config. */
static void test_metaspace(void) {
    const char *json =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"first\",\"split\":false},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,\"vocab\":{"
        "\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xC3>\":3,\"<0xA9>\":4,\"<0x0A>\":5,\"\xe2\x96\x81\":6,\"a\":7,\"b\":8,"
        "\"\xe2\x96\x81" "a\":9,\"ab\":10,\"\xe2\x96\x81" "ab\":11},"
        "\"merges\":[\"a b\",\"\xe2\x96\x81 ab\",\"\xe2\x96\x81 a\"]}}";
    tok_vocab *v = NULL;
    char err[256] = "";
    int rc = tok_load_hf_mem("sp.json", json, strlen(json), NULL, NULL, 0, &v, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    if (rc) return;
    T_EQ_INT(tok_kind(v), TOK_KIND_SPM);
    T_EQ_INT(tok_bos(v), 1);
    T_CHECK(tok_add_bos(v));
    int32_t ids[32];
    int n;
    /* "ab a" -> ▁ab ▁a (merges: a b first, then ▁ ab) */
    T_EQ_INT(tok_encode(v, "ab a", 4, 1, 0, ids, 32, &n), 0);
    T_EQ_INT(n, 3);
    T_CHECK(ids[0] == 1 && ids[1] == 11 && ids[2] == 9);
    /* é is not in the vocabulary: its bytes; '\n' too; 'z' has no byte token: <unk> */
    T_EQ_INT(tok_encode(v, "\xc3\xa9\nzz", 5, 0, 0, ids, 32, &n), 0);
    T_EQ_INT(n, 5);
    T_CHECK(ids[0] == 6 && ids[1] == 3 && ids[2] == 4 && ids[3] == 5 && ids[4] == 0);
    /* prepend_scheme first: no '▁' after a special token */
    T_EQ_INT(tok_encode(v, "<s>a", 4, 0, 1, ids, 32, &n), 0);
    T_EQ_INT(n, 2);
    T_CHECK(ids[0] == 1 && ids[1] == 7);
    char buf[8];
    size_t pl;
    T_EQ_INT(tok_piece(v, 11, buf, sizeof buf, &pl), 0);
    T_CHECK(pl == 3 && !memcmp(buf, " ab", 3));
    T_EQ_INT(tok_piece(v, 3, buf, sizeof buf, &pl), 0);
    T_CHECK(pl == 1 && (unsigned char)buf[0] == 0xC3);
    T_CHECK(tok_add_space_prefix(v));
    tok_free(v);
}

/* Llama-2's older tokenizer.json: Prepend('▁') + Replace(' ' -> '▁') normalizers prepend to
 * every segment, after special tokens too (as llama.cpp's add_space_prefix). */
static void test_prepend(void) {
    const char *json =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},"
        "\"pre_tokenizer\":null,\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"vocab\":{"
        "\"<unk>\":0,\"<s>\":1,\"\xe2\x96\x81\":2,\"a\":3,\"\xe2\x96\x81" "a\":4},\"merges\":[\"\xe2\x96\x81 a\"]}}";
    tok_vocab *v = NULL;
    char err[256] = "";
    int rc = tok_load_hf_mem("pp.json", json, strlen(json), NULL, NULL, 0, &v, err, sizeof err);
    T_CHECKF(rc == 0, "%s", err);
    if (rc) return;
    int32_t ids[16];
    int n;
    T_EQ_INT(tok_encode(v, "a<s>a a", 7, 0, 1, ids, 16, &n), 0);
    T_EQ_INT(n, 4);
    T_CHECK(ids[0] == 4 && ids[1] == 1 && ids[2] == 4 && ids[3] == 4);
    /* a text that starts with a space gets a second '▁' (Prepend does not look) */
    T_EQ_INT(tok_encode(v, " a", 2, 0, 0, ids, 16, &n), 0);
    T_CHECK(n == 2 && ids[0] == 2 && ids[1] == 4);
    tok_free(v);
}

int main(void) {
    test_prepend();
    test_bytelevel();
    test_unsupported();
    test_metaspace();
    return t_done();
}
