/* tok: tokenizers (SentencePiece-style BPE with byte fallback, byte-level BPE with
 * pre-tokenizer regexes), loaded from GGUF metadata or Hugging Face tokenizer.json.
 *
 * The gateway turns text into ids and back with this; the executor never sees text.
 * `arka generate` uses it in-process.
 *
 *   tok_vocab *v; char err[256];
 *   if (tok_load_gguf(g, &v, err, sizeof err)) die(err);
 *   int32_t ids[256]; int n;
 *   tok_encode(v, "Hello", 5, 1, 0, ids, 256, &n);
 *   char buf[64]; size_t len;
 *   tok_piece(v, ids[1], buf, sizeof buf, &len);    // decoded bytes of one token
 *   tok_free(v);
 *
 * A tok_vocab is immutable after loading: any number of threads may encode/decode at once.
 */
#ifndef MDL_TOK_H
#define MDL_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tok_vocab tok_vocab;

enum tok_kind { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 };

/* Token types (llama.cpp's tokenizer.ggml.token_type values). CONTROL and UNKNOWN tokens are
 * matched in text only with parse_special; USER_DEFINED tokens (HF: added tokens that are
 * not special) are always matched before the model runs. */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0, TOK_TYPE_NORMAL = 1, TOK_TYPE_UNKNOWN = 2, TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4, TOK_TYPE_UNUSED = 5, TOK_TYPE_BYTE = 6
};

/* Longest text tok_encode accepts (CM_ETOOBIG beyond). */
#define TOK_MAX_TEXT ((size_t)1 << 30)

/* From the tokenizer.ggml.* keys of an open GGUF (the vocab copies what it needs). */
int  tok_load_gguf(const gguf_ctx *g, tok_vocab **out, char *err, size_t errlen);
/* From tokenizer.json (+ optional tokenizer_config.json, may be NULL). */
int  tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, tok_vocab **out, char *err, size_t errlen);
/* Same from memory: name (and config_name) label error messages; config may be NULL. The
 * buffers are only read during the call. */
int  tok_load_hf_mem(const char *name, const char *json, size_t json_len, const char *config_name, const char *config,
                     size_t config_len, tok_vocab **out, char *err, size_t errlen);
/* From a path: a GGUF file (full model or vocab-only), a tokenizer.json (its sibling
 * tokenizer_config.json is read when present) or a directory holding tokenizer.json. */
int  tok_load_file(const char *path, tok_vocab **out, char *err, size_t errlen);
void tok_free(tok_vocab *v); /* accepts NULL */

int     tok_kind(const tok_vocab *v);
int     tok_n_vocab(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);   /* -1 when none */
int32_t tok_eos(const tok_vocab *v);   /* -1 when none */
int32_t tok_eot(const tok_vocab *v);   /* -1 when none */
int32_t tok_pad(const tok_vocab *v);   /* -1 when none */
int32_t tok_unk(const tok_vocab *v);   /* -1 when none */
int     tok_add_bos(const tok_vocab *v); /* the model's default for add_bos */
int     tok_add_eos(const tok_vocab *v); /* the model appends EOS when special tokens are added */
/* 1 when SentencePiece-style decoding should drop the leading space of the first piece. */
int     tok_add_space_prefix(const tok_vocab *v);
int     tok_type(const tok_vocab *v, int32_t id); /* enum tok_type; -1 when out of range */
/* Pre-tokenizer name ("llama-bpe", "gpt-2", "none", ...) for diagnostics. */
const char *tok_pre_name(const tok_vocab *v);
/* 1 when id ends generation (EOS, EOT, and other end-of-generation tokens). */
int     tok_is_eog(const tok_vocab *v, int32_t id);

/* Encodes len bytes of UTF-8 text. add_bos: prepend BOS (when the vocab has one), and append
 * EOS when the vocab's add_eos is set (tok_add_eos).
 * parse_special: match special/added tokens' text in the input (else they are plain text).
 * Writes up to cap ids and sets *n_out to the number of ids the text needs; returns
 * CM_EFULL when cap was too small (call again with a larger buffer), CM_EUTF8 for
 * invalid UTF-8, CM_ETOOBIG past TOK_MAX_TEXT, 0 on success.
 *
 * Invalid UTF-8 policy: the whole text is refused (CM_EUTF8, nothing encoded), strict
 * RFC 3629 (no overlong forms, surrogates or code points past U+10FFFF); callers that must
 * accept arbitrary bytes replace bad sequences with U+FFFD first. NUL bytes are ordinary
 * characters. Working memory is bounded by the longest merge unit: long inputs are cut where
 * no token can span the cut (exact) and merged chunk by chunk; O(n log n) per chunk. */
int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_bos, int parse_special,
               int32_t *ids, int cap, int *n_out);

/* The bytes token id stands for (byte-fallback tokens resolved, SentencePiece '▁' as space,
 * byte-level BPE's unicode-to-byte mapping undone). May be a partial UTF-8 sequence.
 * Returns 0, CM_EFULL (cap too small; *len says how much is needed) or CM_ERANGE. */
int tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap, size_t *len);

/* The same bytes without copying: valid while v lives; NULL if out of range. */
const char *tok_piece_ref(const tok_vocab *v, int32_t id, size_t *len);

/* The raw vocabulary string of id (as stored in the file), NUL-terminated; NULL if out of range. */
const char *tok_text(const tok_vocab *v, int32_t id);
/* The id whose raw vocabulary string is exactly text[0..len), or -1. */
int32_t tok_find(const tok_vocab *v, const char *text, size_t len);

#endif
