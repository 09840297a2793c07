/* gen: one generation request of the OpenAI API — the one object behind SSE, non-streaming JSON
 * and WebSocket alike.
 *
 * A gw_gen holds the parsed request, the prompt ids once prepared, the sampling parameters and
 * stop ids the executors run, and per choice every token delivered so far (what lets a
 * generation continue elsewhere), the text pipeline (detokenizer, stop-string matcher) and its
 * timings. Its output goes to a sink: the transport that writes it (SSE, JSON or a WebSocket),
 * which also settles the request's quota claim and records its metrics when it ends.
 *
 * The per-token path runs one way: the backend (gateway/pool.c, the executors' rings) hands
 * each token to gw_gen_token, which checks its sequence number, keeps it, decodes it, matches
 * stop strings and calls the sink. A sink only writes: it never ends, cancels or frees the
 * generation from inside a call (a transport that sees its client leave calls gw_gen_cancel
 * later, from its own callback), so nothing on this path checks whether the generation still
 * exists after a call.
 *
 * Life: gw_gen_create, then gw_gen_start (checks what it can at once, then renders the chat
 * template and tokenizes on the libuv threadpool, checks the context length and submits to the
 * backend); the backend reports through gw_gen_token / gw_gen_choice_done / gw_gen_fail. A
 * generation ends exactly once — every choice finished, a failure, or gw_gen_cancel — with the
 * sink's end call; it is freed right after, or when the last hold (threadpool work, a pending
 * admission) is released.
 *
 * Loop thread only; the threadpool work reads only the generation's own input and the
 * immutable vocabulary and chat template.
 *
 *   gw_gen *g; gw_gen_create(env, &q, &sink, ud, &g);    // takes q
 *   if (gw_gen_start(g) == 0) ... in flight: sink calls follow, end last ...
 *   ... client gone: gw_gen_cancel(g);                    // sink end runs inside
 */
#ifndef GW_GEN_H
#define GW_GEN_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "gateway/auth.h"
#include "gateway/backend.h"
#include "gateway/openai.h"
#include "shm/shm.h"
#include "text/chat.h"
#include "text/detok.h"
#include "text/stop.h"
#include "text/tok.h"
#include "text/tools.h"

struct gw_met;
struct tok_gram_cache;

/* Ring ids: a generation's id << GW_GEN_RID_SHIFT | its choice index (choices, and an
 * embedding request's inputs, <= 2^11). */
#define GW_GEN_RID_SHIFT 11
_Static_assert(GW_OAI_N_MAX <= 1 << GW_GEN_RID_SHIFT, "a choice index fits the ring id's low bits");
_Static_assert(GW_OAI_INPUTS_MAX <= 1 << GW_GEN_RID_SHIFT, "an input index fits the ring id's low bits");

/* What every generation runs on, shared by all of them: fixed for the server's life except the
 * counters. Owned by the server (serve.c) or a test; outlives every generation. */
typedef struct gw_gen_env {
    uv_loop_t       *loop;
    const tok_vocab *vocab;
    const tok_chat  *chat;        /* may have no template (chat requests then get a 400) */
    int              n_ctx;       /* positions per sequence, as the executors run them */
    int              max_requests; /* generations in flight before new ones get 503 */
    gw_backend       backend;
    struct gw_met   *met;         /* inter-token latency (NULL: none) */
    /* structured output (text/grammar.h, text/tools.h) */
    struct tok_gram_cache *gcache; /* compiled grammars by their source (NULL: compiled every time) */
    int              tool_fmt;    /* enum tok_tools the model writes calls in (TOK_TOOLS_NONE: tools refused) */
    int              reasoning;   /* split <think> ... </think> off chat replies as reasoning_content */
    int32_t          markers[8];  /* control tokens whose text the output parser reads (tok_tools_markers) */
    int              n_markers;
    /* the vocabulary's token bytes the executors' grammars match (gw_gen_vocab_init) */
    uint32_t        *vb_off;      /* [vb_n + 1] */
    uint8_t         *vb_bytes;
    int              vb_n;
    /* embeddings (--task embed) */
    int              embed;       /* the model is served for /v1/embeddings (generation routes refuse) */
    int              pooling;     /* enum mdl_pooling */
    int              normalize;
    int              n_embd;
    /* counters (loop thread) */
    int              inflight;    /* started and not yet ended */
    int              preparing;   /* of those, on the threadpool */
} gw_gen_env;

/* How a generation's output is written. Called by the generation only, loop thread, never
 * re-entered. start, text and finish may be NULL. */
typedef struct gw_gen_sink {
    /* The prompt fits and generation begins: g->usage.prompt_tokens is known. */
    void (*start)(gw_gen *g);
    /* New text of choice i (complete UTF-8, possibly empty) and, when logprobs were asked, the
     * tokens it came from. Pointers are valid during the call only. */
    void (*text)(gw_gen *g, int i, const char *text, size_t len, const gw_oai_tok *toks, int n_toks);
    /* Choice i is complete (finish: enum shm_finish). */
    void (*finish)(gw_gen *g, int i, int finish);
    /* The last call, exactly once: every choice finished (err NULL), the generation failed
     * (err: its status, 400 for the context length, 503 overloaded, 500 executor failure, ...),
     * or it was cancelled (g->cancelled; inside gw_gen_cancel). g->usage holds the final usage:
     * the prompt when it reached an executor, every token received. The sink settles the quota
     * claim and records the metrics here; g is freed after it returns (never keep it). */
    void (*end)(gw_gen *g, const gw_oai_err *err);
    /* Chat replies, when the reply is parsed (reasoning, tool calls): reasoning text of choice i. */
    void (*reasoning)(gw_gen *g, int i, const char *text, size_t len);
    /* Tool call k of choice i: begins (id and name set, args NULL), an argument fragment (id
     * NULL), or ends (end 1). */
    void (*call)(gw_gen *g, int i, int k, const char *id, const char *name, const char *args, size_t len, int end);
} gw_gen_sink;

/* What the generation keeps of its output for a sink that writes it at the end (JSON, the
 * WebSocket's response.done): text, and logprobs when asked. */
enum { GW_GEN_KEEP_TEXT = 1, GW_GEN_KEEP_LOGPROBS = 2 };

enum gw_gen_state { GW_GEN_NEW = 0, GW_GEN_PREPARING, GW_GEN_RUNNING, GW_GEN_ENDED };

typedef struct gw_gen_kept gw_gen_kept; /* gen.c: text and logprobs kept per choice */

/* A tool call of a choice, as parsed (always kept: the finish reason and the Responses API's
 * items need them). */
typedef struct gw_gen_call {
    char   id[GW_OAI_ID_LEN];     /* "call_..." */
    char  *name;
    char  *args;                  /* the arguments' JSON text so far */
    size_t len, cap;
    int    ended;
} gw_gen_call;

typedef struct gw_gen_choice {
    int32_t  *toks;               /* [n_toks] the tokens delivered, in order */
    int       n_toks, cap_toks;
    uint32_t  next_seq;           /* the sequence number the next token must carry */
    int       finish;             /* enum shm_finish; SHM_FINISH_NONE while running */
    uint64_t  t_first, t_last, t_end; /* uv_hrtime: first / latest token, finish (0: not yet) */
    tok_detok dt;
    tok_stop  st;
    gw_gen_kept *kept;            /* NULL unless the sink keeps output */
    /* chat replies: the output parser and what it found */
    tok_out   op;
    int       op_on, op_ended;
    gw_gen   *g;                  /* back pointers for the parser's callbacks */
    int       idx;
    const gw_oai_tok *ptoks;      /* logprobs waiting for the next content text */
    int       pn;
    gw_gen_call *calls;
    int       n_calls, cap_calls;
    int       call_stop;          /* parallel_tool_calls false: a call ended, the choice stops */
    int       oom;
    /* embeddings: input i's tokens and its vector */
    int32_t  *prompt;             /* NULL: the generation's prompt */
    int       n_prompt;
    float    *embd;               /* [n_embd] once it came */
    int64_t   queue_ns;           /* its executor's queue time (SUBMIT read -> first scheduled); -1 unknown */
} gw_gen_choice;

struct gw_gen {
    gw_gen_env    *env;
    gw_oai_req     q;             /* the request as parsed (owned); q.sp as asked */
    gw_oai_meta    meta;          /* repeated by every chunk and event of the response */
    char           id[GW_OAI_ID_LEN]; /* "chatcmpl-..." / "cmpl-..." / "resp_..." */
    int            state;         /* enum gw_gen_state */
    int            cancelled;     /* ended by gw_gen_cancel */
    int            n;             /* choices (q.n) */
    /* what the executors run, once prepared */
    int32_t       *prompt;        /* [n_prompt] */
    int            n_prompt;
    struct shm_sampling sp;       /* q.sp with max_tokens resolved; choice i draws with seed sp.seed + i */
    int32_t        stop_ids[SHM_MAX_STOP]; /* text/'s end-of-generation ids (none with ignore_eos) */
    int            n_stop_ids;
    uint32_t      *gram;          /* the grammar program the output follows (NULL: none) */
    size_t         gram_len;
    int            in_reasoning;  /* the prompt ended inside <think>: the reply starts in reasoning */
    /* progress */
    int            n_open;        /* choices running */
    int            ran;           /* it reached RUNNING (the sink's start ran) */
    int            reached;       /* its choices went to an executor: the prompt is billed */
    int            cached;        /* prompt tokens the executor took from its prefix cache for the
                                   * first choice (usage's cached_tokens; the prompt is billed once) */
    gw_oai_usage   usage;         /* prompt tokens once prepared; completion tokens when it ends */
    uint64_t       t_start;       /* uv_hrtime at gw_gen_start */
    /* the transport's */
    const gw_gen_sink *sink;
    void          *sink_ud;
    int            keep;          /* GW_GEN_KEEP_*, set before gw_gen_start */
    gw_auth_ticket ticket;        /* the admission's quota claim, settled by the sink's end */
    /* the backend's bookkeeping (gateway/pool.c links the generation into its tables here) */
    struct {
        uint64_t id;              /* ring ids are id << GW_GEN_RID_SHIFT | choice */
        void    *ex;              /* the executor holding it, NULL before submit and while waiting */
        gw_gen  *hnext, *prev, *next, *qnext;
        int      n_sent;          /* choices whose SUBMIT went out (or that need none) */
        uint64_t seed;            /* the draws' seed: sp.seed, or one the pool picked (choice i: + i) */
        int      resumes;         /* times its executor died under it */
        int      waiting;         /* waits for an executor to resume on */
        uint64_t wait_since;      /* uv_now when it started waiting */
    } be;
    /* private to gen.c */
    int            holds;
    char          *text;          /* threadpool: the rendered prompt */
    uv_work_t      work;
    gw_oai_err     werr;
    int            wrc;
    gw_gen_choice  ch[];
};

/* Takes ownership of *q (zeroed on return, success or not) and makes a generation that writes
 * to sink (sink_ud for the sink's own state). Returns 0, CM_EINVAL (stop strings the matcher
 * refuses; e filled, 400) or CM_ENOMEM (e filled). Nothing is called back on failure. */
int  gw_gen_create(gw_gen_env *env, gw_oai_req *q, const gw_gen_sink *sink, void *sink_ud, gw_gen **out,
                   gw_oai_err *e);

/* Starts g (state NEW): the checks that need no tokens (an executor ready, the in-flight cap,
 * a chat template, token ids in the vocabulary), then the threadpool work. Returns 0 when g is
 * on its way (its sink hears from it until end), or the error's code after ending g with it
 * (the sink's end ran: 503 no executor or overloaded, 400 bad ids or no template, 500). */
int  gw_gen_start(gw_gen *g);

/* Ends g at once if it has not ended (the executors get a CANCEL for its open choices): the
 * sink's end runs inside with g->cancelled set and the usage delivered so far. g must not be
 * used after this returns. */
void gw_gen_cancel(gw_gen *g);

/* Ends g with err if it has not ended (an admission refusal, a backend failure): the sink's end
 * runs inside. g must not be used after this returns. */
void gw_gen_error(gw_gen *g, const gw_oai_err *err);

/* Keeps g's memory past its end until gw_gen_release (a callback that will still receive g,
 * such as a pending admission). Check g->state == GW_GEN_ENDED after waiting. */
void gw_gen_hold(gw_gen *g);
void gw_gen_release(gw_gen *g);

/* ---- events from the backend (loop thread; nothing is called for g after it ends) -------- */

/* A token of choice i; top: t->n_top alternatives (may be NULL when none). */
void gw_gen_token(gw_gen *g, int i, const struct shm_tok *t, const struct shm_top *top);
/* Choice i's admission in the executor, with its first token (before gw_gen_token): the prompt
 * tokens taken from the prefix cache and the time queued. */
void gw_gen_admitted(gw_gen *g, int i, const struct shm_tok_admit *a);
/* Choice i ended in the executor: d->finish, d->completion_tokens (must equal the tokens
 * received), d->cached_prompt_tokens. */
void gw_gen_choice_done(gw_gen *g, int i, const struct shm_done *d);
/* Input i of an embedding request: its vector (the DONE follows). */
void gw_gen_embedding(gw_gen *g, int i, const struct shm_embed *em);
/* gw_gen_error with an error made of status, OpenAI type and code, and a message. */
void gw_gen_fail(gw_gen *g, int status, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- for sinks that write everything at the end ------------------------------------------ */

/* Builds the choices from the kept output (text, reasoning, tool calls, finish, and logprobs
 * when want_logprobs) and returns build(ctx, choices, n) (the choices are valid during that
 * call). NULL when out of memory. */
char *gw_gen_build(const gw_gen *g, int want_logprobs, char *(*build)(void *ctx, const gw_oai_choice *ch, int n),
                   void *ctx);

/* Makes env's table of token bytes from its vocabulary (once, at start). Returns 0 or CM_ENOMEM. */
int gw_gen_vocab_init(gw_gen_env *env);
/* Sends the next VOCAB records of env's table on ring r, from token *next on (advanced), until
 * all went (0) or the ring is full (CM_EFULL: call again later). The pool calls it before the
 * first SUBMIT with a grammar to each executor, and again after an executor restarts. */
int gw_gen_send_vocab(const gw_gen_env *env, struct shm_ring *r, uint32_t *next);

#endif
