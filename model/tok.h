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

/* From the tokenizer.ggml.* keys of an open GGUF (the vocab copies what it needs). */
int  tok_load_gguf(const gguf_ctx *g, tok_vocab **out, char *err, size_t errlen);
/* From tokenizer.json (+ optional tokenizer_config.json, may be NULL). */
int  tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, tok_vocab **out, char *err, size_t errlen);
void tok_free(tok_vocab *v); /* accepts NULL */

int     tok_kind(const tok_vocab *v);
int     tok_n_vocab(const tok_vocab *v);
int32_t tok_bos(const tok_vocab *v);   /* -1 when none */
int32_t tok_eos(const tok_vocab *v);   /* -1 when none */
int     tok_add_bos(const tok_vocab *v); /* the model's default for add_bos */
/* 1 when id ends generation (EOS, EOT, and other end-of-generation tokens). */
int     tok_is_eog(const tok_vocab *v, int32_t id);

/* Encodes len bytes of UTF-8 text. add_bos: prepend BOS (when the vocab has one).
 * parse_special: match special/added tokens' text in the input (else they are plain text).
 * Writes up to cap ids and sets *n_out to the number of ids the text needs; returns
 * CM_EFULL when cap was too small (call again with a larger buffer), CM_EUTF8 for
 * invalid UTF-8, 0 on success. */
int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_bos, int parse_special,
               int32_t *ids, int cap, int *n_out);

/* The bytes token id stands for (byte-fallback tokens resolved, SentencePiece '▁' as space,
 * byte-level BPE's unicode-to-byte mapping undone). May be a partial UTF-8 sequence.
 * Returns 0, CM_EFULL (cap too small; *len says how much is needed) or CM_ERANGE. */
int tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap, size_t *len);

/* The raw vocabulary string of id (as stored in the file), NUL-terminated; NULL if out of range. */
const char *tok_text(const tok_vocab *v, int32_t id);

#endif
