/* openai: the OpenAI API's JSON, in and out.
 *
 * Parsing: a request body of POST /v1/completions or POST /v1/chat/completions becomes a
 * gw_oai_req (every value validated; unknown fields ignored; JSON null means "not given").
 * Invalid input yields a gw_oai_err that gw_oai_error_json() turns into OpenAI's error body
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

enum gw_oai_kind { GW_OAI_COMPLETION = 0, GW_OAI_CHAT = 1 };

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
    char    *tools_json;          /* "tools" array, or NULL */
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
 * or CM_ENOMEM (e: 500). *q needs no freeing after an error. */
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

typedef struct gw_oai_choice {
    const char *text;
    size_t      len;
    int         finish;   /* enum shm_finish (shm/shm.h) */
    const gw_oai_tok *toks; /* logprobs, or NULL when not asked */
    int         n_toks;
} gw_oai_choice;

/* Non-streaming response: "chat.completion" or "text_completion" with choices and usage. */
char *gw_oai_response_json(const gw_oai_meta *m, const gw_oai_choice *ch, int n, const gw_oai_usage *u,
                           int want_logprobs);

/* One streamed chunk for choice `index`:
 * - chat: role != 0 gives delta {"role":"assistant","content":""}; text gives delta {"content":text};
 *   finish != NONE with text NULL gives delta {} and the finish_reason;
 * - completions: {"text":text (or ""),"finish_reason":...}.
 * toks/n_toks: logprobs of the tokens in this chunk (NULL: "logprobs": null). *text_offset (for
 * completions' logprobs.text_offset) is advanced by the token lengths; may be NULL otherwise. */
char *gw_oai_chunk_json(const gw_oai_meta *m, int index, int role, const char *text, size_t len, int finish,
                        const gw_oai_tok *toks, int n_toks, size_t *text_offset);

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

#endif
