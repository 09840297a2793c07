/* tools: what a chat model's output means beyond text — tool calls in the model's own format
 * and reasoning between <think> and </think> — parsed as the text streams in, and the grammar
 * that makes a model emit calls in its format (tool_choice "required" or a named function).
 *
 * Formats (the ones instruction-tuned models are trained on):
 *  - hermes (Hermes, Qwen2.5/3, the built-in chatml template): <tool_call>\n{"name": ...,
 *    "arguments": {...}}\n</tool_call>, one block per call, text before them is content;
 *  - llama3 (Llama 3.1-3.3 JSON tool calling): the whole reply is a call, optionally after
 *    <|python_tag|>: {"name": ..., "parameters": {...}}, several separated by ';';
 *  - mistral: [TOOL_CALLS] then a JSON array of {"name", "arguments"} objects, or (v11+
 *    tokenizers) [TOOL_CALLS]name[ARGS]{...} per call.
 * "arguments" and "parameters" are both accepted in every format; arguments given as a JSON
 * string are decoded. The format comes from --tool-parser or from the chat template's text
 * (tok_tools_detect).
 *
 * The parser (tok_out) is fed the reply's text in pieces and calls back with content, reasoning
 * and tool-call events (begin with the name, argument fragments, end), holding back only what
 * may be the start of a marker; argument fragments stream as the model writes them. An object
 * that is not a call (no name) is given back as content. Markers that are control tokens
 * (<|python_tag|>, [TOOL_CALLS], [ARGS]) must be fed as their text by the caller: the
 * detokenizer drops control tokens (tok_tools_markers lists them).
 *
 *   tok_out o; tok_out_init(&o, TOK_TOOLS_HERMES, 1, 0, &cb, ud);
 *   for each text piece: tok_out_feed(&o, s, n);
 *   tok_out_end(&o); tok_out_free(&o);
 *
 * One tok_out per reply, one thread at a time; tok_tools_* functions are pure (any thread).
 */
#ifndef TXT_TOOLS_H
#define TXT_TOOLS_H

#include <stddef.h>

#include "grammar.h"

enum tok_tools { TOK_TOOLS_NONE = 0, TOK_TOOLS_HERMES = 1, TOK_TOOLS_LLAMA3 = 2, TOK_TOOLS_MISTRAL = 3 };

/* "hermes", "llama3", "mistral" -> enum; -1 for another name. "none": TOK_TOOLS_NONE. */
int tok_tools_parse(const char *name);
const char *tok_tools_name(int fmt); /* "none" ... */
/* The format a chat template's source writes calls in (its markers), TOK_TOOLS_NONE when it has
 * none. */
int tok_tools_detect(const char *tmpl_src);
/* The marker texts of a format that tokenizers may hold as control tokens (NULL-terminated). */
const char *const *tok_tools_markers(int fmt);

/* ---- the grammar of calls -------------------------------------------------------------------- */

typedef struct tok_tool_fn {
    const char *name;
    const char *params;     /* the JSON schema of the arguments (NULL: any object) */
    size_t      params_len;
} tok_tool_fn;

/* Adds rule `name` to d: one call (or one or more when parallel) of the functions fns[0..n) in
 * format fmt, arguments valid under each function's schema; control-token markers are written
 * as token references when the vocabulary v holds them as tokens (else as text). Returns 0,
 * CM_EINVAL (a schema the grammar compiler refuses: err names the function and the keyword),
 * CM_ENOMEM. */
int tok_tools_gbnf(tok_gbnf *d, const char *name, int fmt, const tok_tool_fn *fns, int n, int parallel,
                   const tok_vocab *v, char *err, size_t errlen);

/* Adds rule `name`: any text up to and including the literal end (which it cannot contain
 * before), e.g. the reasoning before </think>. Returns 0 or CM_ENOMEM. */
int tok_gbnf_until(tok_gbnf *d, const char *name, const char *end);

/* ---- the output parser ----------------------------------------------------------------------- */

typedef struct tok_out_cb {
    void (*content)(void *ud, const char *s, size_t n);
    void (*reasoning)(void *ud, const char *s, size_t n);
    void (*call_begin)(void *ud, int index, const char *name, size_t name_len);
    void (*call_args)(void *ud, int index, const char *s, size_t n);
    void (*call_end)(void *ud, int index);
} tok_out_cb;

typedef struct tok_obuf { char *s; size_t n, cap; } tok_obuf;

typedef struct tok_out {
    int fmt;                /* enum tok_tools */
    int state;              /* private */
    int reasoning;          /* <think> ... </think> is split off */
    const tok_out_cb *cb;
    void *ud;
    tok_obuf pend;          /* text not yet decided on (a possible marker start) */
    int n_calls;            /* calls begun */
    int err;                /* CM_ENOMEM / CM_ETOOBIG once failed: later feeds do nothing */
    /* the call being scanned */
    struct {
        int depth, in_str, esc, expect, kind, probe, array, margs;
        tok_obuf raw, key, name, args;
        int named, begun, args_started, args_string, args_done;
    } c;
} tok_out;

#define TOK_OUT_MAX_CALL ((size_t)8 << 20) /* bytes of one call's text */

/* fmt: enum tok_tools. reasoning: split <think>...</think> off the start of the reply;
 * in_reasoning: the reply starts inside the reasoning (the prompt ended with <think>). Can't
 * fail (allocates on feed). */
void tok_out_init(tok_out *o, int fmt, int reasoning, int in_reasoning, const tok_out_cb *cb, void *ud);
/* Feeds n bytes of the reply. Returns 0, CM_ENOMEM or CM_ETOOBIG (a call past
 * TOK_OUT_MAX_CALL); after an error nothing more is parsed. */
int tok_out_feed(tok_out *o, const char *s, size_t n);
/* The reply ended: held text is released, an unfinished call is ended (its arguments as they
 * are) or, without a name, given back as content. Returns as tok_out_feed. */
int tok_out_end(tok_out *o);
void tok_out_free(tok_out *o);

#endif
