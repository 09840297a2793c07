/* grammar (text side): what a request asks the output to look like, compiled into the
 * executor's grammar program (executor/grammar.h: the format, the matcher, and why the work is
 * split this way).
 *
 * Three sources, one path: a JSON schema (response_format json_schema, function parameters)
 * and json_object become GBNF text (tok_gbnf_schema / tok_gbnf_json), tool-call formats add
 * their own rules around those (gateway/tools.c), and a GBNF grammar (llama-server's `grammar`
 * field) is taken as it is; the GBNF text is then compiled by tok_gram_compile. Errors name the
 * problem: "line L, column C: ..." for GBNF, the keyword and its JSON pointer for schemas.
 *
 * GBNF (llama.cpp's): `name ::= alternatives`, one rule per line (a rule continues after `|`,
 * `::=` and inside parentheses), `root` is the start; "literals" and [character classes] with
 * \n \r \t \\ \" \] \- \xHH \uHHHH \UHHHHHHHH escapes, [^...] negation, `.` (any character),
 * ( groups ), postfix * + ? {m} {m,} {m,n}, # comments, and two token forms: <[123]> (the token
 * with that id) and <|text|> or <text> (the token whose vocabulary text is exactly that), which
 * match the token itself (control tokens included), never its spelling in bytes. Characters are
 * code points; the program matches their UTF-8 bytes.
 *
 * The compiled programs are cached (tok_gram_cache: by a hash of the source, shared by threads)
 * so a schema used again is not compiled again.
 *
 *   tok_gbnf d; tok_gbnf_init(&d);
 *   if (tok_gbnf_schema(&d, "root", schema_json, len, 1, err, sizeof err)) reply_400(err);
 *   uint32_t *prog; size_t n;
 *   if (tok_gram_compile(d.s, d.len, vocab, &prog, &n, err, sizeof err)) ...
 *   tok_gbnf_free(&d); free(prog);
 *
 * Pure functions of their input (and the vocabulary, read only); any thread.
 */
#ifndef TXT_GRAMMAR_H
#define TXT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "tok.h"

#define TOK_GBNF_MAX ((size_t)4 << 20) /* bytes of GBNF text accepted */

/* Compiles GBNF text into a program (malloc'ed words the caller frees; *prog_len bytes). v
 * resolves the token forms (may be NULL when the text has none). Returns 0, CM_EINVAL (err:
 * "line L, column C: problem", or an undefined rule, or a left-recursive one), CM_ETOOBIG (past
 * TOK_GBNF_MAX or the program's limit) or CM_ENOMEM. */
int tok_gram_compile(const char *src, size_t len, const tok_vocab *v, uint32_t **prog, size_t *prog_len, char *err,
                     size_t errlen);

/* The bytes every token stands for, as the grammar engine matches them (executor/grammar.h
 * ex_gram_vocab_create): the detokenizer's bytes (tok_piece_ref) for normal, byte and
 * user-defined tokens; nothing for control, unknown and unused ones (those are matched only by
 * a token element or as an end id). *off: [*n + 1] offsets into *bytes, both malloc'ed. Returns
 * 0 or CM_ENOMEM. */
int tok_gram_vocab(const tok_vocab *v, uint32_t **off, uint8_t **bytes, int *n);

/* ---- building GBNF text ----------------------------------------------------------------- */

typedef struct tok_gbnf {
    char    *s;          /* the text so far, NUL-terminated */
    size_t   len, cap;
    unsigned prims;      /* shared rules already added (json values, strings, formats) */
    int      n_names;    /* counter for generated rule names */
    int      oom;        /* an append failed: the text is incomplete */
} tok_gbnf;

void tok_gbnf_init(tok_gbnf *d);
void tok_gbnf_free(tok_gbnf *d);
/* Appends printf-style text. Sets d->oom on failure. */
void tok_gbnf_add(tok_gbnf *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a GBNF literal ("..." with escapes). */
void tok_gbnf_lit(tok_gbnf *d, const char *s, size_t len);

/* Adds rule `name` matching any JSON value (json_object: `name` any JSON object when
 * object_only). Returns 0 or CM_ENOMEM. */
int tok_gbnf_json(tok_gbnf *d, const char *name, int object_only);

/* Adds rule `name` for the JSON schema text (len bytes) and the rules it needs, prefixed with
 * name. The supported keywords: type (one or a list), properties, required, additionalProperties
 * (false, true or a schema), enum, const, anyOf / oneOf (as anyOf), allOf (of object schemas,
 * merged), $ref to "#", "#/$defs/..." or "#/definitions/...", items, prefixItems, minItems,
 * maxItems, minLength, maxLength, format (date-time, date, time, duration, uuid, email, hostname,
 * ipv4, ipv6), minimum / maximum / exclusiveMinimum / exclusiveMaximum on integers, and the
 * annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
 * readOnly, writeOnly, $defs, definitions). Any other keyword is refused, naming it and where it
 * is: a schema the output could not be held to is an error, never a silent approximation.
 * Semantics to know: an object whose schema does not say additionalProperties gets no others
 * (as OpenAI's strict mode and XGrammar do: say additionalProperties: true for them); oneOf is
 * compiled as anyOf (exact when the branches are disjoint, as discriminated unions are); a
 * schema with properties and no type is an object. Objects keep the schema's property order:
 * required properties first, then the optional ones, each present or not. Whitespace between
 * tokens is limited to a newline and 20 spaces or tabs, number parts to 16 digits, so a weak
 * model cannot run away inside the syntax. Returns 0, CM_EINVAL (err names the keyword and its
 * JSON pointer), CM_ENOMEM. */
int tok_gbnf_schema(tok_gbnf *d, const char *name, const char *schema, size_t len, char *err, size_t errlen);

/* ---- the compile cache ---------------------------------------------------------------------- */

typedef struct tok_gram_cache tok_gram_cache;

/* A cache of up to cap programs (least recently used out first). Returns 0 or CM_ENOMEM. */
int  tok_gram_cache_create(int cap, tok_gram_cache **out);
void tok_gram_cache_destroy(tok_gram_cache *c); /* accepts NULL */
/* The program compiled from key (any bytes that determine it: the GBNF text, or a schema and
 * its options), or NULL. On a hit *prog is a malloc'ed copy the caller frees. Thread-safe. */
int  tok_gram_cache_get(tok_gram_cache *c, const char *key, size_t klen, uint32_t **prog, size_t *prog_len);
/* Stores a copy of the program under key. Returns 0 or CM_ENOMEM. Thread-safe. */
int  tok_gram_cache_put(tok_gram_cache *c, const char *key, size_t klen, const uint32_t *prog, size_t prog_len);

#endif
