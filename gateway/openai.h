/* openai: the OpenAI API's JSON, in and out.
 *
 * Parsing: a request body of POST /v1/completions, /v1/chat/completions, /v1/responses or
 * /v1/embeddings becomes a gw_oai_req (every value validated; JSON null means "not given").
 * No field is silently ignored: every field is implemented, or one of the accepted no-ops
 * (user, service_tier, store, metadata: they change nothing here), or refused with a 400 that
 * names it ("Unrecognized request argument supplied: X", as OpenAI words it). Invalid input
 * yields a gw_oai_err that gw_oai_error_json() turns into OpenAI's error body
 * {"error":{"message","type","param","code"}}.
 *
 * Building: the non-streaming response objects, the streamed chunk objects (SSE `data:` payloads)
 * and the WebSocket (Realtime-style) events, all as malloc'ed NUL-terminated JSON the caller
 * frees. Builders take a gw_oai_meta (id, created, model, ...) so that every chunk of one
 * response carries the same values.
 *
 * Pure functions: no I/O, no globals (gw_oai_make_id reads getrandom). Any thread.
 *
 *   gw_oai_req q; gw_oai_err e;
 *   if (gw_oai_parse(GW_OAI_CHAT, body, len, &q, &e)) { char *j = gw_oai_error_json(&e); send(e.status, j); }
 *   ...
 *   gw_oai_req_free(&q);
 */
#ifndef GW_OPENAI_H
#define GW_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "shm/shm.h"

#define GW_OAI_N_MAX         16   /* choices per request */
#define GW_OAI_STOP_MAX      4    /* stop strings (OpenAI's limit) */
#define GW_OAI_STOP_LEN_MAX  256  /* bytes per stop string (text/stop.h's TOK_STOP_MAX_LEN) */
#define GW_OAI_LOGPROBS_MAX  20   /* top alternatives per token */
#define GW_OAI_BIAS_MAX      1024 /* logit_bias entries */
#define GW_OAI_ID_LEN        40   /* buffer for a response id */

enum gw_oai_kind { GW_OAI_COMPLETION = 0, GW_OAI_CHAT = 1, GW_OAI_RESPONSES = 2, GW_OAI_EMBEDDINGS = 3 };

/* What the output must look like (response_format / text.format, or grammar). */
enum gw_oai_fmt { GW_FMT_TEXT = 0, GW_FMT_JSON_OBJECT, GW_FMT_JSON_SCHEMA, GW_FMT_GRAMMAR };
/* tool_choice */
enum gw_oai_tc { GW_TC_AUTO = 0, GW_TC_NONE, GW_TC_REQUIRED, GW_TC_NAMED };

#define GW_OAI_TOOLS_MAX   128   /* functions per request */
#define GW_OAI_INPUTS_MAX  2048  /* embeddings: inputs per request (OpenAI's limit) */

typedef struct gw_oai_tool {
    char *name;            /* [a-zA-Z0-9_-]{1,64} */
    char *params_json;     /* the parameters' JSON schema, re-serialized; NULL: none given */
} gw_oai_tool;

typedef struct gw_oai_err {
    int  status;          /* HTTP status (400, 404, 413, 500, 503, ...) */
    char message[512];
    const char *type;     /* "invalid_request_error", "not_found_error", "server_error", ... */
    char param[64];       /* "" means null */
    char code[48];        /* "" means null */
} gw_oai_err;

typedef struct gw_oai_msg {
    char *role;           /* system | developer | user | assistant | tool */
    char *content;        /* text (text parts concatenated); NULL when the message had none */
    char *name;           /* or NULL */
    char *tool_call_id;   /* or NULL */
    char *tool_calls;     /* JSON array text (assistant), or NULL */
    char *reasoning;      /* reasoning_content of an assistant turn, or NULL */
} gw_oai_msg;

typedef struct gw_oai_req {
    int      kind;                /* enum gw_oai_kind */
    char    *model;
    /* completions: exactly one of prompt / prompt_tokens */
    char    *prompt;
    int32_t *prompt_tokens;
    int      n_prompt_tokens;
    /* chat */
    gw_oai_msg *msgs;
    int      n_msgs;
    char    *messages_json;       /* the messages array re-serialized (for templates that need more) */
    char    *tools_json;          /* "tools" in chat's form ({type, function: {...}}), or NULL */
    gw_oai_tool *tools;           /* [n_tools] the functions */
    int      n_tools;
    int      tool_choice;         /* enum gw_oai_tc (AUTO when not given) */
    char    *tool_choice_name;    /* NAMED: the function */
    char    *tool_choice_json;    /* as given, for the template (NULL: not given) */
    int      parallel_tool_calls; /* default 1 */
    char    *template_kwargs_json;/* chat_template_kwargs object, or NULL */
    /* output format */
    int      fmt;                 /* enum gw_oai_fmt */
    char    *schema_json;         /* JSON_SCHEMA: the schema */
    char    *schema_name;         /* JSON_SCHEMA: its name ("" allowed for responses) */
    int      schema_strict;
    char    *grammar;             /* GRAMMAR: GBNF text (llama-server's "grammar") */
    /* responses */
    char    *instructions;        /* echoed in the response object (already a system message) */
    int      store;               /* accepted no-op: nothing is stored (default 1 as OpenAI's) */
    char    *metadata_json;       /* echoed (accepted no-op), or NULL */
    /* embeddings: n inputs, each text or token ids */
    char   **inputs;              /* [n] text, or NULL where input_ids has the item */
    int32_t **input_ids;          /* [n] ids, or NULL */
    int     *n_input_ids;         /* [n] */
    int      encoding_base64;     /* encoding_format "base64" */
    int      dimensions;          /* 0: the model's */
    /* sampling: the ring's one struct (shm/shm.h), filled here from the API's names (the API's
     * repetition_penalty is sp.repeat_penalty). sp.max_tokens 0: not given (max_tokens and
     * max_completion_tokens, the newer name, which wins). Chat's logprobs/top_logprobs and
     * completions' logprobs N become sp.logprobs (0/1) and sp.top_logprobs (0..20). */
    struct shm_sampling sp;
    char    *stop[GW_OAI_STOP_MAX];
    int      n_stop;
    int      n;                   /* 1..GW_OAI_N_MAX */
    int      priority;            /* vLLM's: lower values are scheduled first; 0 when not given */
    struct shm_logit_bias *logit_bias;
    int      n_logit_bias;
    int      stream;
    int      include_usage;
    char    *user;
} gw_oai_req;

/* Parses and validates body (len bytes, need not be NUL-terminated) as a request of kind.
 * Returns 0 and fills *q (free with gw_oai_req_free), or CM_EINVAL and fills *e (status 400),
 * or CM_ENOMEM (e: 500). *q needs no freeing after an error. For GW_OAI_RESPONSES the input
 * items and instructions become messages (function_call items an assistant turn with
 * tool_calls, function_call_output items tool turns) and the tools chat's form. */
int  gw_oai_parse(int kind, const char *body, size_t len, gw_oai_req *q, gw_oai_err *e);
void gw_oai_req_free(gw_oai_req *q); /* accepts a zeroed struct */

/* Fills e. param/code may be NULL (JSON null). message is printf-style. Can't fail. */
void gw_oai_err_set(gw_oai_err *e, int status, const char *type, const char *param, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The context-length error: ctx tokens available, prompt tokens, completion tokens asked. */
void gw_oai_err_context(gw_oai_err *e, int kind, int ctx, int prompt_tokens, int completion_tokens);

/* {"error":{"message","type","param","code"}}; NULL only when out of memory. */
char *gw_oai_error_json(const gw_oai_err *e);

/* A new response id: "chatcmpl-" / "cmpl-" / "resp_" + 24 random characters. */
void gw_oai_make_id(char *dst, size_t cap, const char *prefix);

/* ---- response building ------------------------------------------------------------------- */

typedef struct gw_oai_meta {
    int         kind;          /* enum gw_oai_kind */
    const char *id;
    int64_t     created;       /* Unix seconds */
    const char *model;
    const char *fingerprint;   /* system_fingerprint, or NULL (null) */
    int         include_usage; /* streaming: "usage": null on every chunk, a usage chunk at the end */
} gw_oai_meta;

typedef struct gw_oai_top {
    const char *text;
    size_t      len;
    float       logprob;
} gw_oai_top;

/* One generated token with its log-probability and the top alternatives (when asked). */
typedef struct gw_oai_tok {
    const char *text;     /* the token's bytes (may be a partial UTF-8 sequence) */
    size_t      len;
    float       logprob;
    int         n_top;
    const gw_oai_top *top;
} gw_oai_tok;

typedef struct gw_oai_usage {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;    /* prompt tokens served from the prefix cache (0 if unknown) */
} gw_oai_usage;

/* A tool call the model made (its arguments: the JSON text as the model wrote it). */
typedef struct gw_oai_call {
    const char *id;       /* "call_..." */
    const char *name;
    const char *args;
    size_t      args_len;
} gw_oai_call;

typedef struct gw_oai_choice {
    const char *text;     /* content (chat: after reasoning and tool calls were split off) */
    size_t      len;
    int         finish;   /* enum shm_finish (shm/shm.h) */
    const gw_oai_tok *toks; /* logprobs, or NULL when not asked */
    int         n_toks;
    const char *reasoning; /* chat: reasoning_content (NULL: none) */
    size_t      reasoning_len;
    const gw_oai_call *calls; /* chat: tool calls */
    int         n_calls;
} gw_oai_choice;

/* Non-streaming response: "chat.completion" or "text_completion" with choices and usage. */
char *gw_oai_response_json(const gw_oai_meta *m, const gw_oai_choice *ch, int n, const gw_oai_usage *u,
                           int want_logprobs);

/* gw_oai_chunk_json's finish for a choice that ended with tool calls ("tool_calls"). */
#define GW_FINISH_TOOL_CALLS 100

/* One streamed chunk for choice `index`:
 * - chat: role != 0 gives delta {"role":"assistant","content":""}; text gives delta {"content":text};
 *   finish != NONE with text NULL gives delta {} and the finish_reason;
 * - completions: {"text":text (or ""),"finish_reason":...}.
 * toks/n_toks: logprobs of the tokens in this chunk (NULL: "logprobs": null). *text_offset (for
 * completions' logprobs.text_offset) is advanced by the token lengths; may be NULL otherwise. */
char *gw_oai_chunk_json(const gw_oai_meta *m, int index, int role, const char *text, size_t len, int finish,
                        const gw_oai_tok *toks, int n_toks, size_t *text_offset);

/* Chat chunks of the structured output: delta {"reasoning_content": text}; a tool call's start
 * delta {"tool_calls":[{"index":k,"id","type":"function","function":{"name","arguments":""}}]}
 * (id and name non-NULL) or an argument fragment {"tool_calls":[{"index":k,"function":
 * {"arguments":frag}}]} (id NULL). */
char *gw_oai_chunk_reasoning_json(const gw_oai_meta *m, int index, const char *text, size_t len);
char *gw_oai_chunk_call_json(const gw_oai_meta *m, int index, int k, const char *id, const char *name, const char *args,
                             size_t args_len);

/* The final usage chunk (choices: []). */
char *gw_oai_usage_chunk_json(const gw_oai_meta *m, const gw_oai_usage *u);

/* SSE framing: "data: " + json + "\n\n" (json may contain no raw newline: cJSON prints compact
 * JSON). Returns a malloc'ed string and its length, or NULL. */
char *gw_sse_data(const char *json, size_t *len);
#define GW_SSE_DONE "data: [DONE]\n\n"
#define GW_SSE_PING ": ping\n\n"

/* ---- WebSocket events (Realtime-style) ------------------------------------------------- */

/* {"type":"response.created","event_id":...,"response":{"id","object":"realtime.response",
 *  "status":"in_progress","model","created_at"}} */
char *gw_rt_created_json(const char *event_id, const gw_oai_meta *m);
/* {"type":"response.output_text.delta","event_id","response_id","output_index","content_index":0,"delta"} */
char *gw_rt_delta_json(const char *event_id, const char *response_id, int output_index, const char *text, size_t len);
/* {"type":"response.done","event_id","response":{"id","object","status":completed|cancelled|failed|incomplete,
 *  "status_details","output":[{"index","text","finish_reason"}...],"usage":{input_tokens,output_tokens,total_tokens}}} */
char *gw_rt_done_json(const char *event_id, const gw_oai_meta *m, const char *status, const char *reason,
                      const gw_oai_choice *ch, int n, const gw_oai_usage *u);
/* {"type":"error","event_id","error":{"type","code","message","param","event_id"(client's, or null)}} */
char *gw_rt_error_json(const char *event_id, const gw_oai_err *e, const char *client_event_id);

/* OpenAI's finish_reason of an enum shm_finish: "stop", "length" (LENGTH and CONTEXT), or NULL
 * (NONE; a cancelled or failed choice has none either). */
const char *gw_finish_name(int finish);
/* The same for a chat choice that made n_calls tool calls: "tool_calls" when it stopped after
 * them. */
const char *gw_finish_name_chat(int finish, int n_calls);

/* ---- /v1/responses (openai_resp.c) --------------------------------------------------------- */

/* What a response object repeats from its request. */
typedef struct gw_rsp_info {
    const gw_oai_req *q;
    const char *id;
    int64_t     created;
    const char *model;
    uint32_t    max_output_tokens; /* 0: null */
} gw_rsp_info;

/* An output item in the making (the streamed sequence numbers them). */
typedef struct gw_rsp_item {
    int  type;            /* 0 message, 1 function_call, 2 reasoning */
    char id[GW_OAI_ID_LEN];
    const char *text;     /* message / reasoning text, or the call's arguments */
    size_t len;
    const char *name;     /* function_call */
    const char *call_id;  /* function_call */
    int  done;            /* completed (or in_progress) */
} gw_rsp_item;

/* The response object as JSON text: status "in_progress", "completed", "incomplete"
 * (max_output_tokens) or "failed", with its output items and usage (NULL: null). */
char *gw_rsp_json(const gw_rsp_info *ri, const char *status, const gw_rsp_item *items, int n, const gw_oai_usage *u);

/* Streamed events (SSE "event: TYPE\ndata: {...}" frames): each carries its type and the
 * sequence number seq. */
char *gw_rsp_event_response(const char *type, int seq, const gw_rsp_info *ri, const char *status, const gw_rsp_item *items,
                            int n, const gw_oai_usage *u, const gw_oai_err *err);
/* response.output_item.added / .done for item it at output_index. */
char *gw_rsp_event_item(const char *type, int seq, int output_index, const gw_rsp_item *it);
/* response.content_part.added / .done (message text part), response.output_text.delta / .done,
 * response.function_call_arguments.delta / .done, response.reasoning_text.delta / .done: the
 * piece (delta) or the whole text (done). */
char *gw_rsp_event_text(const char *type, int seq, int output_index, const char *item_id, const char *text, size_t len);
/* An SSE frame "event: TYPE\ndata: JSON\n\n" (type read from the JSON's "type"). */
char *gw_sse_event(const char *json, size_t *len);

/* ---- /v1/embeddings ------------------------------------------------------------------------ */

/* {"object":"list","data":[{"object":"embedding","index":i,"embedding":[...] or "base64"}],
 * "model","usage":{"prompt_tokens","total_tokens"}}; vecs: n rows of dim floats. */
char *gw_oai_embeddings_json(const char *model, const float *const *vecs, int n, int dim, int base64, int prompt_tokens);

#endif
