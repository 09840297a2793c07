/* chat: a model's chat template, found, compiled and rendered for chat requests.
 *
 * The gateway (and any in-process caller) loads it once at model load: the template the model
 * ships (GGUF `tokenizer.chat_template`; for a Hugging Face directory `chat_template.jinja`, or
 * `chat_template` in tokenizer_config.json, a string or a list of {name, template} of which
 * "default" is taken), or a built-in one the user named (`--chat-template chatml|llama3|...`).
 * A template that does not compile is a load error; a model without one loads, and chat
 * requests are then refused with a message saying how to name one (never a silent fallback).
 *
 *   tok_chat *c; char err[256];
 *   if (tok_chat_load("model.gguf", NULL, vocab, &c, err, sizeof err)) die(err);
 *   if (!tok_chat_ready(c)) ... refuse chat requests (tok_chat_render says how to name a template)
 *   tok_chat_msg m[] = {{.role = "user", .content = "Hi"}};
 *   char *prompt; size_t n;
 *   if (tok_chat_render(c, m, 1, NULL, 1, &prompt, &n, err, sizeof err)) reply_400(err);
 *   free(prompt); tok_chat_free(c);
 *
 * Render context (what transformers and vLLM pass): messages as dicts {role, content (a NULL
 * content becomes ""), name, tool_call_id, tool_calls (the JSON the client sent, as values)},
 * add_generation_prompt, bos_token and eos_token as the vocabulary's texts, tools when given.
 *
 * A loaded tok_chat is immutable: any number of threads may render at once.
 */
#ifndef TXT_CHAT_H
#define TXT_CHAT_H

#include <stddef.h>

#include "tok.h"

typedef struct tok_chat tok_chat;

typedef struct tok_chat_msg {
    const char *role;            /* system | developer | user | assistant | tool */
    const char *content;         /* NULL: "" */
    const char *name;            /* or NULL */
    const char *tool_call_id;    /* or NULL */
    const char *tool_calls_json; /* JSON array text, or NULL */
    const char *reasoning_content; /* an assistant turn's reasoning, or NULL */
} tok_chat_msg;

/* Finds and compiles the chat template of the model at path (GGUF file or Hugging Face
 * directory). builtin: a tmpl_builtin() name that replaces the model's own (NULL or "": the
 * model's). v: the model's vocabulary (bos/eos texts; borrowed, must outlive *out; may be NULL).
 * Returns 0 (also when the model has no template: tok_chat_ready() is then 0), CM_EINVAL (an
 * unknown builtin name; err lists the names), CM_ETEMPLATE (the template does not compile: err
 * names its source, line and column), CM_EFORMAT / CM_EIO (an unreadable tokenizer_config.json),
 * CM_ENOMEM. */
int  tok_chat_load(const char *path, const char *builtin, const tok_vocab *v, tok_chat **out, char *err, size_t errlen);
void tok_chat_free(tok_chat *c); /* accepts NULL */

/* 1 when a template is loaded. */
int tok_chat_ready(const tok_chat *c);
/* Where the template came from: "gguf:tokenizer.chat_template", "tokenizer_config.json",
 * "chat_template.jinja", "builtin:NAME", or "none". */
const char *tok_chat_source(const tok_chat *c);

/* Renders n messages (and tools_json, a JSON array text, or NULL) into a malloc'ed prompt the
 * caller frees. Returns 0, CM_ESTATE (no template loaded: err says how to name one), CM_EINVAL
 * (tools_json or a tool_calls_json is not valid JSON), CM_ETEMPLATE (the template refused the
 * conversation, e.g. raise_exception: err is its message), CM_ETOOBIG, CM_ENOMEM. As vLLM
 * does, a tool call's function.arguments given as a JSON string reaches the template as the
 * object it encodes (templates write it with tojson). */
int tok_chat_render(const tok_chat *c, const tok_chat_msg *msgs, int n, const char *tools_json, int add_generation_prompt,
                    char **out, size_t *out_len, char *err, size_t errlen);

/* The same with more of the request: tool_choice_json (the request's tool_choice as JSON text,
 * or NULL) as the variable tool_choice, and kwargs_json (chat_template_kwargs, a JSON object
 * text, or NULL) whose members become variables (enable_thinking, ...); a member named like
 * one of the variables above is refused (CM_EINVAL, err names it). */
int tok_chat_render_ex(const tok_chat *c, const tok_chat_msg *msgs, int n, const char *tools_json,
                       const char *tool_choice_json, const char *kwargs_json, int add_generation_prompt, char **out,
                       size_t *out_len, char *err, size_t errlen);

/* The tool-call format the template writes calls in (text/tools.h enum tok_tools; NONE when it
 * has no tool markers). */
int tok_chat_tool_format(const tok_chat *c);
/* 1 when the template knows reasoning blocks (it mentions <think>). */
int tok_chat_thinks(const tok_chat *c);

#endif
