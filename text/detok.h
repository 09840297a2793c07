/* detok: incremental detokenizer for streaming output.
 *
 * The gateway feeds the ids an executor generated, one at a time, and gets back text that is
 * always complete, valid UTF-8: a multi-byte character whose bytes arrive in several tokens
 * (byte-fallback tokens, byte-level BPE pieces) is held until its last byte arrives, so no SSE
 * event ever carries half a character. One tok_detok per sequence; the caller owns the struct
 * and the output buffer; nothing is allocated after tok_detok_init (which allocates nothing
 * either: it only scans the vocabulary for the longest piece).
 *
 *   tok_detok d; char out[TOK_DETOK_OUT_MAX];   // or a buffer of tok_detok_out_cap(&d) bytes
 *   tok_detok_init(&d, vocab, TOK_DETOK_SKIP_CONTROL);
 *   for each generated id: tok_detok_push(&d, id, out, sizeof out, &n); send(out, n);
 *   at the end:            tok_detok_flush(&d, out, sizeof out, &n); send(out, n);
 *
 * Rules implemented:
 * - Leading space (SentencePiece vocabularies, tok_add_space_prefix() true): the tokenizer
 *   put a space in front of the text, so the first text piece of a *document* starts with a
 *   space that is not part of the text. Like llama.cpp's detokenizer, that space is removed
 *   only when the text starts at BOS: when the first id pushed is BOS (or the caller passes
 *   TOK_DETOK_STRIP_LEADING because it decodes from the start of a document), one leading
 *   space of the first non-empty piece is dropped. Generated tokens that follow a prompt are
 *   not the start of the text: their leading space is kept ("Hello" + " world").
 * - Invalid UTF-8 (a stray continuation byte, a bad lead, an overlong form, a surrogate, past
 *   U+10FFFF, a sequence cut by an unexpected byte) is replaced by U+FFFD, one per maximal
 *   invalid subpart (the Unicode "substitution of maximal subparts" practice), so the output
 *   is always valid UTF-8.
 * - Flush: an incomplete sequence still pending at the end becomes one U+FFFD.
 * - TOK_DETOK_SKIP_CONTROL: control tokens (BOS, EOS, <|eot_id|>, ...) produce no text.
 *
 * A tok_detok is used by one thread at a time; the vocabulary is only read.
 */
#ifndef TXT_DETOK_H
#define TXT_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "tok.h"

enum tok_detok_flags {
    TOK_DETOK_SKIP_CONTROL = 1,  /* control tokens decode to nothing */
    TOK_DETOK_STRIP_LEADING = 2, /* the text starts at the beginning of a document */
};

typedef struct tok_detok {
    const tok_vocab *v;
    int      flags;
    int      strip_next;  /* drop one leading space of the next non-empty piece */
    int      started;     /* an id has been pushed */
    size_t   max_piece;   /* longest piece of the vocabulary, bytes */
    uint8_t  pend[4];     /* incomplete UTF-8 sequence carried to the next push */
    int      npend;
} tok_detok;

/* Output capacity that is always enough for one push or flush: every byte of a piece and the
 * pending bytes may become a 3-byte U+FFFD. Can't fail. */
size_t tok_detok_out_cap(const tok_detok *d);

/* Prepares d for a new sequence over vocabulary v (which must outlive d). flags: enum
 * tok_detok_flags. Returns 0 or CM_EINVAL. Allocates nothing. */
int tok_detok_init(tok_detok *d, const tok_vocab *v, int flags);

/* Decodes id and writes the text that is now complete into out[0..*n_out). Returns 0,
 * CM_ERANGE (id outside the vocabulary; state unchanged), CM_EFULL (cap below what this push
 * needs, at most tok_detok_out_cap(); state unchanged) or CM_EINVAL. */
int tok_detok_push(tok_detok *d, int32_t id, char *out, size_t cap, size_t *n_out);

/* Ends the sequence: a pending incomplete character is written as U+FFFD. d may then be
 * reused with tok_detok_init. Returns 0, CM_EFULL (cap < 3 with bytes pending) or CM_EINVAL. */
int tok_detok_flush(tok_detok *d, char *out, size_t cap, size_t *n_out);

/* The same UTF-8 repair for arbitrary bytes, without a vocabulary: appends the complete part
 * of pend[0..*npend) + in[0..len) to out (valid UTF-8, bad bytes as U+FFFD) and leaves an
 * incomplete trailing sequence (at most 3 bytes) in pend. out needs 3 * (len + *npend) bytes.
 * Returns the number of bytes written. Can't fail. Exposed for tests and for callers that
 * stream bytes from elsewhere. */
size_t tok_detok_utf8(uint8_t pend[4], int *npend, const char *in, size_t len, char *out);

#endif
