/* tmpl: chat templates, a Jinja subset interpreter.
 *
 * Models ship their prompt format as a Jinja template (GGUF tokenizer.chat_template, or
 * chat_template in tokenizer_config.json). The gateway compiles it once at model load (a
 * template that does not compile is a load error) and renders it for every chat request with
 * the messages, add_generation_prompt, bos_token, eos_token, tools and any extra variables.
 *
 *   tmpl *t; char err[256];
 *   if (tmpl_compile(src, strlen(src), &t, err, sizeof err)) die("chat template: %s", err);
 *   tmpl_arena *a = tmpl_arena_create();
 *   tmpl_value *ctx = tmpl_dict(a), *msgs = tmpl_list(a), *m = tmpl_dict(a);
 *   tmpl_dict_set(a, m, "role", 4, tmpl_str(a, "user", 4));
 *   tmpl_dict_set(a, m, "content", 7, tmpl_str(a, "Hi", 2));
 *   tmpl_list_push(a, msgs, m);
 *   tmpl_dict_set(a, ctx, "messages", 8, msgs);
 *   tmpl_dict_set(a, ctx, "add_generation_prompt", 21, tmpl_bool(a, 1));
 *   char *prompt; size_t n;
 *   if (tmpl_render(t, ctx, NULL, &prompt, &n, err, sizeof err)) reply_400(err);
 *   free(prompt); tmpl_arena_destroy(a); tmpl_free(t);
 *
 * Language: text, {{ expressions }}, {% statements %}, {# comments #}, whitespace control
 * ({%- -%} {{- -}} {#- -#}, {%+ to keep lstrip off), raw blocks, with the settings Hugging Face
 * renders chat templates with (trim_blocks, lstrip_blocks, one trailing newline dropped).
 * Statements: for (loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/
 * cycle, tuple targets, `for x in y if cond`, else, break/continue), if/elif/else, set (names,
 * tuples, namespace attributes, block set), macro (defaults, caller), call blocks, filter
 * blocks, with, do, generation. Expressions: literals (strings, ints, floats, lists, tuples, dicts),
 * arithmetic, comparison, and/or/not, in/not in, ~, a if c else b, subscripts, slices (also
 * negative steps), attributes, calls, filters, tests. The filters, tests, methods and globals
 * are listed in tmpl_lib.c. Values: undefined, none, bool, int (int64), float, string (UTF-8
 * bytes; lengths, indexing and slicing count code points), list, tuple, dict (insertion
 * ordered), namespace, macro.
 * Semantics follow Python Jinja as transformers configures it (tojson is json.dumps with
 * ensure_ascii=False; str() of True/None is "True"/"None"; floats print like Python repr).
 * Differences: str.upper/lower/title/capitalize change ASCII letters only; macros see the
 * variables of the scope they were defined in; undefined.attr is undefined (not an error);
 * list.append and dict.update work on lists/dicts the template made (transformers' sandbox
 * refuses them); iterating an undefined value is empty. Where @huggingface/jinja differs from
 * Python Jinja (it keeps a loop body's assignments across iterations, prints true/none as
 * "true"/"", concatenates str + non-str), we follow Python.
 *
 * Context conventions for the gateway (what transformers and vLLM pass): messages as a list
 * of dicts (role, content as a string or a list of {type, text} parts, tool_calls with
 * function.arguments as the object the client's JSON string encodes (vLLM's convention: chat.c
 * converts it), tool_call_id, name, ...), with a
 * null content turned into "" (templates concatenate content; None fails in Python too);
 * tools only when the request has tools (leave it undefined otherwise); bos_token and
 * eos_token as the vocabulary's text; add_generation_prompt as a bool; request extras
 * (enable_thinking, ...) as further variables.
 *
 * Errors: compile errors and render errors read "line L, column C: problem"; a template's
 * raise_exception("msg") makes tmpl_render fail with CM_ETEMPLATE and err exactly "msg".
 * Render is bounded (tmpl_limits): output bytes, memory (values and captured text), evaluation
 * steps (loop iterations, expression nodes, and work proportional to the bytes and elements
 * operations touch), recursion depth and time; going past one is CM_ETOOBIG with a message.
 *
 * Threads: a compiled tmpl is immutable; any number of threads may render it at once. A
 * tmpl_arena and the values in it belong to one thread at a time; rendering only reads the
 * context (a template cannot modify the caller's lists or dicts: list.append on them errors).
 */
#ifndef TXT_TMPL_H
#define TXT_TMPL_H

#include <stddef.h>
#include <stdint.h>

typedef struct tmpl tmpl;
typedef struct tmpl_arena tmpl_arena;
typedef struct tmpl_value tmpl_value;
struct cm_json;

typedef struct tmpl_limits {
    size_t   max_output; /* bytes of rendered text (default 64 MiB) */
    size_t   max_memory; /* bytes of values the render may create (default 256 MiB) */
    uint64_t max_steps;  /* evaluation steps (default 50 million); string and list work costs
                            one step per 64 bytes or elements it touches */
    int      max_depth;  /* nested evaluation/macro recursion (default 500) */
    uint32_t max_ms;     /* wall-clock backstop in milliseconds (default 10000) */
} tmpl_limits;

#define TMPL_MAX_SOURCE ((size_t)1 << 24) /* 16 MiB of template source */

/* Compiles len bytes of Jinja source (need not be NUL-terminated). On success *out owns a
 * copy of everything it needs. Returns 0, CM_ETEMPLATE (err: "line L, column C: problem"),
 * CM_ETOOBIG (source past TMPL_MAX_SOURCE), CM_EUTF8 (source is not valid UTF-8), CM_ENOMEM.
 * Any thread. */
int  tmpl_compile(const char *src, size_t len, tmpl **out, char *err, size_t errlen);
void tmpl_free(tmpl *t); /* accepts NULL */

/* Renders t with the variables of the dict ctx (may be NULL: no variables) under lim (NULL:
 * the defaults). On success *out is a malloc'ed NUL-terminated string of *out_len bytes the
 * caller frees. Returns 0, CM_ETEMPLATE (a template error or raise_exception; err says),
 * CM_ETOOBIG (a limit; err says which), CM_EINVAL, CM_ENOMEM. */
int tmpl_render(const tmpl *t, const tmpl_value *ctx, const tmpl_limits *lim, char **out, size_t *out_len,
                char *err, size_t errlen);

/* Built-in templates for --chat-template NAME: "chatml", "llama3", "llama2", "mistral",
 * "gemma", "phi3". Returns the Jinja source (static), or NULL for an unknown name. Used only
 * when the user asks for one; never as a silent fallback. */
const char *tmpl_builtin(const char *name);
/* The names tmpl_builtin knows, comma separated, for help and error messages. */
const char *tmpl_builtin_names(void);

/* ---- values ------------------------------------------------------------------------------
 * The caller builds the render context in an arena; every value lives until the arena is
 * destroyed. Constructors return NULL when out of memory; tmpl_list_push and tmpl_dict_set
 * take NULL values and report CM_ENOMEM, so a builder may check only the last result. */
tmpl_arena *tmpl_arena_create(void);
void        tmpl_arena_destroy(tmpl_arena *a); /* accepts NULL */

tmpl_value *tmpl_none(tmpl_arena *a);
tmpl_value *tmpl_bool(tmpl_arena *a, int b);
tmpl_value *tmpl_int(tmpl_arena *a, int64_t i);
tmpl_value *tmpl_float(tmpl_arena *a, double f);
tmpl_value *tmpl_str(tmpl_arena *a, const char *s, size_t len); /* copies */
tmpl_value *tmpl_list(tmpl_arena *a);
tmpl_value *tmpl_dict(tmpl_arena *a);
/* Appends v to list. Returns 0, CM_EINVAL (not a list of this arena), CM_ENOMEM. */
int tmpl_list_push(tmpl_arena *a, tmpl_value *list, tmpl_value *v);
/* Sets dict[key] = v (replacing in place, keeping the first insertion's position). Returns 0,
 * CM_EINVAL, CM_ENOMEM. */
int tmpl_dict_set(tmpl_arena *a, tmpl_value *dict, const char *key, size_t klen, tmpl_value *v);
/* Converts a parsed JSON value (common/cm_json.h) into a value: objects become dicts, arrays
 * lists, numbers ints when written as integers that fit, else floats. Returns 0, CM_ENOMEM. */
int tmpl_from_json(tmpl_arena *a, const struct cm_json *j, tmpl_value **out);

#endif
