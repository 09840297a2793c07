/* shm: the shared-memory transport between the gateway and one executor process.
 *
 * One segment per executor, created by the gateway (memfd_create; shm_open by name for debugging)
 * and inherited by the executor child across exec together with two eventfds. The segment holds:
 *
 *   [header page]  magic, version, sizes and offsets of every part, executor state, heartbeat, pid
 *   [submit ring]  gateway -> executor: SUBMIT, CANCEL
 *   [event ring]   executor -> gateway: TOKENS (one per engine step), DONE, ERROR
 *   [stats block]  atomic counters and fixed-bucket histograms written by the executor and read by
 *                  the gateway's /metrics without a round trip
 *
 * Everything inside the segment is an offset, never a pointer: the two processes map it at different
 * addresses. A handle (struct shm_seg, struct shm_ring) is process-private and caller-owned.
 *
 * Rings are single-producer single-consumer queues of variable-length records (8-byte length/tag
 * header, payload padded to 8 bytes, a PAD record fills the tail end when a record does not fit
 * before the wrap). head is written only by the producer, tail only by the consumer (acquire/release,
 * separate cache lines). No locks, no syscalls on the fast path: the producer writes the consumer's
 * eventfd only when the consumer has announced it is about to sleep (the `waiting` flag, with a
 * check-again on both sides so that no wake-up is lost). A ring handle is used by one thread at a time.
 *
 * Record size limit: a record (8-byte header + padded payload) may take at most a quarter of its
 * ring (CM_ETOOBIG otherwise). A SUBMIT is never split: the submit ring is sized so that the longest
 * prompt fits (shm_submit_ring_cap_for()); the default 8 MiB ring takes prompts of ~520k tokens.
 * A prompt larger than that is refused with CM_ETOOBIG at encode time (the gateway answers with a
 * context-length error) rather than being chunked.
 *
 * Usage, gateway side:
 *   struct shm_seg seg;
 *   shm_seg_create(&seg, NULL);                          // memfd + 2 eventfds, defaults
 *   shm_seg_spec(&seg, child_fds, spec, sizeof spec);    // "fd:3:4:5" for the executor's argv
 *   ... spawn executor with the three fds ...
 *   shm_send_submit(&seg.submit, &req);                  // CM_EFULL: keep it queued, retry later
 *   uv_poll on seg.event_efd; on readable: shm_ring_drain_efd(&seg.event), then
 *   while (shm_ring_peek(&seg.event, &p, &n) == 0) { decode; shm_ring_release(&seg.event); }
 *   if (shm_ring_prepare_wait(&seg.event) == 0) drain again;   // else: sleep in the loop
 *   shm_seg_close(&seg);
 *
 * Usage, executor side:
 *   shm_seg_attach_spec(&seg, spec, err, sizeof err);   // refuses wrong magic/version/size
 *   shm_seg_set_pid(&seg, getpid()); shm_seg_set_state(&seg, SHM_STATE_LOADING); ...
 *   loop: shm_seg_beat(&seg); drain seg.submit; step; publish TOKENS/DONE on seg.event;
 *         idle: shm_ring_wait(&seg.submit, 100);
 *
 * Dependencies: libc only (plus the error codes of common/cm_err.h, a header).
 */
#ifndef SHM_H
#define SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm_err.h"

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory atomics must be lock-free (address-free across processes)");

/* ============================================================================================
 * Segment layout (shared memory)
 * ========================================================================================== */

#define SHM_MAGIC   0x314d48534b524141ull   /* "AARKSHM1" little-endian */
#define SHM_VERSION 5u  /* 3: SUBMIT's flags and grammar, VOCAB and EMBED records; 4: SUBMIT's n_generated; 5: SUBMIT's tenant and weight, TOKENS' admission data, the prefix-cache counters */
#define SHM_ALIGN   4096u                    /* every part starts on a page */

#define SHM_SUBMIT_CAP_DEFAULT (8u << 20)   /* bytes of submit ring data */
#define SHM_EVENT_CAP_DEFAULT  (4u << 20)   /* bytes of event ring data */
#define SHM_RING_CAP_MIN       4096u
#define SHM_RING_CAP_MAX       (1u << 30)

/* Executor life cycle, stored in the header. The gateway writes STARTING (at creation) and DEAD
 * (after reaping the process); the executor writes LOADING, READY and DRAINING. */
enum shm_exec_state {
    SHM_STATE_STARTING = 0,
    SHM_STATE_LOADING  = 1,
    SHM_STATE_READY    = 2,
    SHM_STATE_DRAINING = 3,
    SHM_STATE_DEAD     = 4,
    SHM_STATE_COUNT
};

/* The first bytes of the segment. Fields above `state` are written once by the creator. */
struct shm_hdr {
    uint64_t magic;         /* SHM_MAGIC, written last at creation */
    uint32_t version;       /* SHM_VERSION */
    uint32_t hdr_size;      /* sizeof(struct shm_hdr) */
    uint64_t total_size;    /* bytes of the whole segment (== file size) */
    uint64_t submit_off;    /* ring region: struct shm_ring_ctl, then submit_cap data bytes */
    uint64_t submit_size;   /* sizeof(struct shm_ring_ctl) + submit_cap */
    uint64_t event_off;
    uint64_t event_size;
    uint64_t stats_off;     /* struct shm_stats */
    uint64_t stats_size;    /* sizeof(struct shm_stats) */
    uint32_t submit_cap;    /* power of two */
    uint32_t event_cap;     /* power of two */
    uint64_t created_ns;    /* CLOCK_MONOTONIC at creation */
    int32_t  gateway_pid;
    uint32_t reserved0;
    /* mutable */
    _Atomic uint32_t state;        /* enum shm_exec_state */
    _Atomic int32_t  exec_pid;     /* written by the executor at start; 0 before */
    _Atomic uint64_t heartbeat;    /* incremented by the executor on every beat */
    _Atomic uint64_t last_beat_ns; /* CLOCK_MONOTONIC (system-wide) of the last beat; 0 before */
};

/* Ring control block, at the start of each ring region; the data bytes follow it. */
struct shm_ring_ctl {
    _Alignas(64) _Atomic uint64_t head;     /* bytes ever written; producer-owned */
    _Alignas(64) _Atomic uint64_t tail;     /* bytes ever consumed; consumer-owned */
    _Alignas(64) _Atomic uint32_t waiting;  /* 1: consumer is (about to be) asleep on its eventfd */
    _Alignas(64) uint32_t cap;              /* data bytes, power of two; written once */
    uint32_t reserved[15];
};

/* Fixed-bucket histogram: counts are per bucket (not cumulative); bucket i counts observations
 * v <= le[i] (and > le[i-1]); the last bucket in use has le = UINT64_MAX (+Inf). The bounds live
 * in the segment so the reader never needs its own copy. */
#define SHM_HIST_MAX 20
struct shm_hist {
    uint32_t n;                         /* buckets in use, 1..SHM_HIST_MAX; written once */
    uint32_t reserved;
    uint64_t le[SHM_HIST_MAX];          /* ascending upper bounds; written once */
    _Atomic uint64_t count[SHM_HIST_MAX];
    _Atomic uint64_t sum;               /* sum of observed values */
};

/* Executor statistics. Written by the executor only (relaxed atomics), read by the gateway at any
 * time; a reader sees each value atomically but the set is not a consistent snapshot. Gauges are
 * set, counters only grow. */
struct shm_stats {
    _Atomic uint64_t requests_running;        /* gauge: sequences in the running batch */
    _Atomic uint64_t requests_waiting;        /* gauge: admitted, waiting for KV blocks/budget */
    _Atomic uint64_t kv_blocks_used;          /* gauge */
    _Atomic uint64_t kv_blocks_total;         /* gauge (set once loaded) */
    _Atomic uint64_t prompt_tokens_total;     /* prompt tokens prefilled (cache hits excluded) */
    _Atomic uint64_t cached_prompt_tokens_total; /* prompt tokens served from the prefix cache (the
                                              * requests' cached_tokens, counted when they end) */
    _Atomic uint64_t generation_tokens_total; /* tokens sampled */
    _Atomic uint64_t preemptions_total;
    _Atomic uint64_t requests_finished_total; /* DONE records published */
    _Atomic uint64_t steps_total;             /* engine steps */
    _Atomic uint64_t prefix_queries_total;    /* tokens looked up in the prefix cache (every admission,
                                              * re-admissions after preemption too, as vLLM counts) */
    _Atomic uint64_t prefix_hits_total;       /* of those, tokens found there */
    _Atomic uint64_t reserved[4];
    struct shm_hist step_time_us;             /* wall time of one engine step, microseconds */
    struct shm_hist batch_size;               /* sequences in one step */
    struct shm_hist batch_tokens;             /* tokens (prefill + decode) in one step */
};

/* ============================================================================================
 * Rings
 * ========================================================================================== */

/* Process-private ring handle (one per side). The fields are private to ring.c except `efd`
 * (the consumer's eventfd, -1 when none), which the caller may read (e.g. to register uv_poll). */
struct shm_ring {
    struct shm_ring_ctl *ctl;   /* shared */
    uint8_t *data;              /* shared, cap bytes */
    uint64_t cap, mask;         /* private copies: never re-read from shared memory */
    int efd;
    /* producer side */
    uint64_t head;              /* next write position (== ctl->head when nothing is reserved) */
    uint64_t tail_seen;         /* last tail read from ctl */
    uint64_t res_pos;           /* data offset of the reserved record header */
    uint64_t res_head;          /* head at which the reserved record starts (after any PAD) */
    uint32_t res_len;           /* payload bytes reserved; 0 and res_pos = UINT64_MAX: none */
    /* consumer side */
    uint64_t tail;              /* next read position */
    uint64_t head_seen;         /* last head read from ctl */
    uint32_t peek_rec;          /* bytes of the record handed out by peek (0: none) */
};

/* Bytes of a ring region (control block + data) for a data capacity cap. */
static inline size_t shm_ring_region_size(uint32_t cap) { return sizeof(struct shm_ring_ctl) + cap; }

/* Formats a ring region of shm_ring_region_size(cap) bytes (empty ring). cap must be a power of two
 * in [SHM_RING_CAP_MIN, SHM_RING_CAP_MAX]. Returns 0 or CM_EINVAL. Creator only, before sharing. */
int shm_ring_init(void *region, uint32_t cap);

/* Binds a handle to a formatted region of region_size bytes; efd is the consumer's eventfd (the
 * producer writes it, the consumer waits on it; -1: none, waiters sleep-poll). Validates the
 * control block against region_size: CM_EFORMAT when it does not match. Can't fail otherwise. */
int shm_ring_open(struct shm_ring *r, void *region, size_t region_size, int efd);

/* Largest payload a record may carry: cap/4 - 8. */
static inline size_t shm_ring_max_payload(const struct shm_ring *r) { return (size_t)(r->cap / 4 - 8); }

/* --- producer --- */

/* Reserves room for a record of len payload bytes and points *ptr at it (8-byte aligned, in shared
 * memory). Nothing is visible to the consumer until shm_ring_commit(). A later reserve without a
 * commit drops the earlier reservation. Returns 0, CM_EFULL (no room now; retry after the consumer
 * made progress) or CM_ETOOBIG (len > shm_ring_max_payload()). */
int shm_ring_reserve(struct shm_ring *r, size_t len, void **ptr);

/* Publishes the reserved record with len payload bytes (len <= the reserved length: reserve the
 * worst case, commit what was written) and wakes the consumer if it sleeps. Returns 0, or
 * CM_EINVAL when nothing is reserved or len is larger than reserved. */
int shm_ring_commit(struct shm_ring *r, size_t len);

/* As shm_ring_commit() without the wake-up check; follow a batch with shm_ring_notify(). */
int shm_ring_commit_quiet(struct shm_ring *r, size_t len);

/* Wakes the consumer if it announced sleeping (one eventfd write; nothing otherwise). */
void shm_ring_notify(struct shm_ring *r);

/* Copying reserve + memcpy + commit. Same returns as shm_ring_reserve(). */
int shm_ring_push(struct shm_ring *r, const void *data, size_t len);

/* Waits until a record of len payload bytes fits, polling with a growing sleep (the consumer sends
 * no wake-ups for space). timeout_ms < 0: forever. Returns 0, CM_ETIMEOUT or CM_ETOOBIG. */
int shm_ring_wait_space(struct shm_ring *r, size_t len, int timeout_ms);

/* --- consumer --- */

/* Points *ptr and *len at the oldest record's payload without consuming it (PAD records are skipped).
 * The payload stays valid and unchanged until shm_ring_release(). Returns 0, CM_EEMPTY, or
 * CM_EFORMAT when the shared indices or a record header are corrupt (the ring is then unusable:
 * treat the peer as broken). Peeking twice returns the same record. */
int shm_ring_peek(struct shm_ring *r, const void **ptr, size_t *len);

/* Consumes the record returned by the last successful peek. No-op if there is none. */
void shm_ring_release(struct shm_ring *r);

/* Copying peek + memcpy + release. Returns 0, CM_EEMPTY, CM_EFORMAT, or CM_ERANGE when the record
 * is larger than cap (*len is set to its size and it stays in the ring). */
int shm_ring_pop(struct shm_ring *r, void *buf, size_t cap, size_t *len);

/* Sleep protocol for consumers that block in their own event loop (the gateway with uv_poll):
 * prepare_wait sets the waiting flag and checks again. Returns 1 when the ring is still empty and
 * the caller may sleep until its eventfd is readable; 0 when records arrived meanwhile (the flag is
 * cleared; drain them and call again). Returns CM_EFORMAT on corrupt indices. */
int shm_ring_prepare_wait(struct shm_ring *r);
/* Clears the waiting flag (after waking up, before draining). */
void shm_ring_cancel_wait(struct shm_ring *r);
/* Reads the eventfd counter to zero (non-blocking). Call when it polled readable. */
void shm_ring_drain_efd(struct shm_ring *r);

/* Blocking wait for records: prepare, poll the eventfd (or sleep-poll in 1 ms steps without one),
 * drain, cancel, and again after a spurious wake-up or a signal. timeout_ms < 0: forever.
 * Returns 0 when records are available, CM_ETIMEOUT when none arrived within timeout_ms (never
 * earlier), CM_EFORMAT on corruption. */
int shm_ring_wait(struct shm_ring *r, int timeout_ms);

/* Bytes in use (records not yet consumed), read from shared memory; for metrics. */
uint64_t shm_ring_used(const struct shm_ring *r);

/* ============================================================================================
 * Segment
 * ========================================================================================== */

struct shm_seg_opts {
    uint32_t submit_cap;    /* 0: SHM_SUBMIT_CAP_DEFAULT; rounded up to a power of two */
    uint32_t event_cap;     /* 0: SHM_EVENT_CAP_DEFAULT */
    const char *name;       /* NULL: memfd; else a POSIX shm name ("/arka-ex0"), for debugging */
    int no_eventfd;         /* 1: create no eventfds (waiters sleep-poll); for tests/debugging */
};

/* Process-private segment handle. Read-only to callers after create/attach. */
struct shm_seg {
    void *base;                 /* mapping */
    size_t size;
    struct shm_hdr *hdr;
    struct shm_stats *stats;
    struct shm_ring submit;     /* gateway produces, executor consumes; efd = submit_efd */
    struct shm_ring event;      /* executor produces, gateway consumes; efd = event_efd */
    int fd;                     /* memfd / shm fd (-1 after close) */
    int submit_efd, event_efd;  /* -1: none */
    int owner;                  /* created here: unlink the name on close */
    char name[64];              /* shm_open name, "" for memfd */
};

/* Creates and formats a segment (gateway). opts may be NULL (defaults). All fds are O_CLOEXEC:
 * the spawner maps them into the child (uv_spawn stdio, or shm_seg_set_inherit()). Returns 0,
 * CM_EINVAL (bad capacity or name), CM_EIO (a syscall failed; errno kept) or CM_ENOMEM.
 * On failure nothing is left open and *seg is zeroed with fds -1. */
int shm_seg_create(struct shm_seg *seg, const struct shm_seg_opts *opts);

/* Maps an existing segment from fd (executor) and validates its header: magic, version, header,
 * stats and histogram sizes, file size, part offsets/sizes and ring capacities. A mismatch is
 * refused: CM_EFORMAT (bad magic, size or layout) or CM_EUNSUPPORTED (other version), with a
 * one-line reason in err (may be NULL). On success the handle owns fd and the eventfds (closed by
 * shm_seg_close); on failure the caller still owns them. submit_efd/event_efd may be -1. */
int shm_seg_attach_fd(struct shm_seg *seg, int fd, int submit_efd, int event_efd, char *err, size_t errlen);

/* As shm_seg_attach_fd() for a segment created with a name. CM_ENOENT when it does not exist. */
int shm_seg_attach_name(struct shm_seg *seg, const char *name, int submit_efd, int event_efd,
                        char *err, size_t errlen);

/* Writes the attach spec for a child into buf: "fd:SEG:SUBMIT_EFD:EVENT_EFD" or
 * "name:NAME:SUBMIT_EFD:EVENT_EFD" (an absent eventfd is "-"). child_fds[3] are the numbers the
 * three fds will have in the child (NULL: the same as here). Returns 0 or CM_ERANGE (buf small). */
int shm_seg_spec(const struct shm_seg *seg, const int child_fds[3], char *buf, size_t len);

/* Parses a spec written by shm_seg_spec() and attaches. Returns as shm_seg_attach_fd(), plus
 * CM_EINVAL for a malformed spec. */
int shm_seg_attach_spec(struct shm_seg *seg, const char *spec, char *err, size_t errlen);

/* Sets (on=1) or clears FD_CLOEXEC on the segment fd and both eventfds, so that they survive exec
 * at their current numbers. Returns 0 or CM_EIO. */
int shm_seg_set_inherit(struct shm_seg *seg, int on);

/* Unmaps, closes the fds, unlinks the name if this handle created it. NULL or a zeroed/closed
 * handle is fine; idempotent. */
void shm_seg_close(struct shm_seg *seg);

/* Executor state and heartbeat. Any thread; lock-free. */
void     shm_seg_set_state(struct shm_seg *seg, enum shm_exec_state st);
enum shm_exec_state shm_seg_state(const struct shm_seg *seg);
const char *shm_state_name(int st);               /* "ready"; "unknown" when out of range */
void     shm_seg_set_pid(struct shm_seg *seg, int pid);
void     shm_seg_beat(struct shm_seg *seg);       /* heartbeat++, last_beat_ns = now */
/* Nanoseconds since the last beat (since creation when none yet); now_ns from shm_now_ns(). */
uint64_t shm_seg_beat_age_ns(const struct shm_seg *seg, uint64_t now_ns);
uint64_t shm_now_ns(void);                        /* CLOCK_MONOTONIC */

/* --- stats: executor updates (single writer), gateway reads --- */

static inline void shm_stat_set(_Atomic uint64_t *c, uint64_t v) {
    atomic_store_explicit(c, v, memory_order_relaxed);
}
/* Single writer: a relaxed load + store (no locked instruction); readers see each value whole. */
static inline void shm_stat_add(_Atomic uint64_t *c, uint64_t v) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}
static inline uint64_t shm_stat_get(const _Atomic uint64_t *c) {
    return atomic_load_explicit((_Atomic uint64_t *)c, memory_order_relaxed);
}
/* Counts v in its bucket and adds it to sum. Executor only (single writer). */
void shm_hist_observe(struct shm_hist *h, uint64_t v);

/* A reader's copy of a histogram: cumulative counts as Prometheus wants them; count is the last
 * cumulative value (so buckets and count always agree). */
struct shm_hist_snap {
    uint32_t n;
    uint64_t le[SHM_HIST_MAX];
    uint64_t cum[SHM_HIST_MAX];
    uint64_t count;
    uint64_t sum;
};
void shm_hist_read(const struct shm_hist *h, struct shm_hist_snap *out);

/* ============================================================================================
 * Protocol records (payloads of ring records). Types and enums only grow at the end.
 * Every record starts with an 8-byte header {u32 type, u32 flags=0}; all fields are little-endian
 * host order (both processes run on the same host) and naturally aligned.
 * ========================================================================================== */

enum shm_msg_type {
    SHM_MSG_SUBMIT = 1,   /* gateway -> executor */
    SHM_MSG_CANCEL = 2,   /* gateway -> executor */
    SHM_MSG_TOKENS = 3,   /* executor -> gateway */
    SHM_MSG_DONE   = 4,   /* executor -> gateway */
    SHM_MSG_ERROR  = 5,   /* executor -> gateway */
    SHM_MSG_VOCAB  = 6,   /* gateway -> executor: a chunk of the token bytes grammars match */
    SHM_MSG_EMBED  = 7,   /* executor -> gateway: an embedding request's vector (its DONE follows) */
    SHM_MSG_COUNT
};

/* How a sequence ended: the one finish enum of the scheduler's events, the DONE record and the
 * gateway's choices. */
enum shm_finish {
    SHM_FINISH_NONE      = 0,   /* not finished (scheduler events while a sequence runs; never in DONE) */
    SHM_FINISH_STOP      = 1,   /* one of the request's stop ids was sampled (the end-of-generation ids
                                 * the gateway sends among them), or the gateway matched a stop string */
    SHM_FINISH_LENGTH    = 2,   /* max_tokens reached */
    SHM_FINISH_CONTEXT   = 3,   /* the context window is full */
    SHM_FINISH_CANCELLED = 4,   /* CANCEL received */
    SHM_FINISH_ERROR     = 5,   /* failed: the executor sends an ERROR record with the code first */
    SHM_FINISH_COUNT
};
/* "none", "stop", "length", "ctx", "cancelled", "error" (for logs; "?" out of range). */
const char *shm_finish_name(int finish);

#define SHM_MAX_STOP         16    /* stop token ids per request */
#define SHM_MAX_LOGIT_BIAS   300   /* logit bias entries per request */
#define SHM_MAX_TOP_LOGPROBS 20    /* alternatives per token */
#define SHM_ERR_MSG_MAX      256   /* bytes of an ERROR message */

struct shm_logit_bias {
    int32_t token;
    float   bias;          /* finite */
};

/* The sampling parameters of one sequence: the one struct from the OpenAI request (the gateway's
 * parser fills it) through the SUBMIT record to the scheduler and both backends' samplers
 * (executor/sampler.h names it ex_sample_params; the transforms are documented there), with
 * one name per parameter everywhere. Plain values only: the ring carries it as it is. The
 * logit bias list travels beside it (a variable-length array of struct shm_logit_bias).
 * shm_sampling_check() holds the sampler's ranges; decode checks those and the caps below. */
struct shm_sampling {
    float    temperature;         /* >= 0; 0 = greedy */
    float    top_p;               /* (0, 1]; 1 = off */
    float    min_p;               /* [0, 1]; 0 = off */
    float    repeat_penalty;      /* > 0; 1 = off (the API's repetition_penalty) */
    float    presence_penalty;    /* finite; 0 = off */
    float    frequency_penalty;   /* finite; 0 = off */
    int32_t  top_k;               /* >= 0; 0 = off */
    int32_t  penalty_last_n;      /* previous tokens the penalties see: -1 all, 0 none (default 64) */
    uint32_t max_tokens;          /* tokens to generate at most; >= 1 in a SUBMIT (the gateway's
                                   * parser leaves 0 for "not given" and resolves it later) */
    uint32_t min_tokens;          /* <= max_tokens: the stop ids cannot be sampled (the scheduler
                                   * masks them) before this many tokens, and the gateway looks for
                                   * stop strings only from the min_tokens-th token's text on */
    uint64_t seed;                /* the draw's key; when !has_seed the executor picks one */
    uint8_t  has_seed;            /* 0/1 */
    uint8_t  logprobs;            /* 0/1: report the sampled token's logprob */
    uint8_t  top_logprobs;        /* 0..SHM_MAX_TOP_LOGPROBS alternatives per token */
    uint8_t  ignore_eos;          /* 0/1: the gateway leaves the end-of-generation ids out of the
                                   * stop ids, so the sequence runs to max_tokens */
    uint8_t  reserved[4];         /* 0 */
};

/* Defaults: greedy (temperature 0), top_p 1, min_p 0, repeat_penalty 1, presence and frequency
 * 0, top_k 0, penalty_last_n 64, max_tokens 0, min_tokens 0, no seed, no logprobs, ignore_eos
 * 0. Can't fail. */
void shm_sampling_default(struct shm_sampling *p);
/* The sampler's ranges (above): 0 or CM_EINVAL. max_tokens and the reserved fields are the
 * record's business (decode checks them), not the sampler's. */
int  shm_sampling_check(const struct shm_sampling *p);

/* SUBMIT flags */
#define SHM_SUBMIT_EMBED   0x1u   /* an embedding request: the prompt's pooled hidden state comes back
                                   * in an EMBED record, nothing is sampled (sp.max_tokens is 1) */
#define SHM_SUBMIT_GRAMMAR 0x2u   /* the output follows the grammar program carried (executor/grammar.h) */
#define SHM_MAX_GRAMMAR    (1u << 20) /* bytes of a grammar program in a SUBMIT */
#define SHM_MAX_EMBD       65536u /* floats of an EMBED vector */
#define SHM_MAX_WEIGHT     1000u  /* a tenant's fair-share weight: 1..SHM_MAX_WEIGHT */

/* A request. n (choices) is handled by the gateway as n separate requests (the executor's
 * prefix cache lets them share the prompt's KV). On decode the array pointers point into the
 * ring record: valid until shm_ring_release() (copy the prompt first). */
struct shm_submit {
    uint64_t req_id;              /* != 0, unique per segment */
    int32_t  priority;            /* admission and preemption order: lower first (vLLM's convention;
                                   * the API's priority, default 0) */
    struct shm_sampling sp;
    const int32_t *prompt;        /* [n_prompt] token ids >= 0 */
    uint32_t n_prompt;            /* >= 1 */
    uint32_t n_stop;              /* <= SHM_MAX_STOP */
    int32_t  stop[SHM_MAX_STOP];  /* stop token ids >= 0 (copied) */
    const struct shm_logit_bias *bias;  /* [n_bias] */
    uint32_t n_bias;              /* <= SHM_MAX_LOGIT_BIAS */
    /* version 3 */
    uint32_t flags;               /* SHM_SUBMIT_* */
    uint8_t  pooling;             /* EMBED: enum mdl_pooling (1 mean, 2 last, 3 cls); else 0 */
    uint8_t  normalize;           /* EMBED: 0/1 L2-normalise; else 0 */
    const void *grammar;          /* GRAMMAR: the program (4-byte aligned; on decode, in the record) */
    uint32_t grammar_len;         /* GRAMMAR: bytes, a multiple of 4, 1..SHM_MAX_GRAMMAR; else 0 */
    uint32_t n_generated;         /* version 4: a resumed generation (its executor died): the last n_generated
                                   * prompt ids are the request's own output delivered so far.
                                   * They count toward sp.max_tokens and sp.min_tokens, the TOKENS
                                   * sequence numbers and DONE's completion_tokens continue from
                                   * there, and DONE's prompt_tokens leaves them out; the draws
                                   * keep their positions (the sequence's length), so the stream
                                   * goes on as if nothing had happened. < n_prompt and
                                   * < sp.max_tokens; 0 for a new request. */
    /* version 5 */
    uint64_t tenant;              /* who the request is billed to, for fair share between tenants (a
                                   * hash of the key's tenant name; 0: no key store, one tenant) */
    uint32_t weight;              /* the key's weight in that share: 1..SHM_MAX_WEIGHT (0 is sent as 1) */
};

/* One generated token inside a TOKENS record (wire layout, 24 bytes; n_top shm_top pairs follow,
 * then a struct shm_tok_admit when flags has SHM_TOK_ADMIT). */
#define SHM_TOK_LOGPROB 0x1u      /* logprob is valid */
#define SHM_TOK_ADMIT   0x2u      /* the request's first token from this executor: its admission follows */
struct shm_tok {
    uint64_t req_id;
    uint32_t seq;                 /* per-request token sequence number, from 0, no gaps */
    int32_t  token;               /* >= 0 */
    float    logprob;             /* the sampled token's logprob when flags & SHM_TOK_LOGPROB */
    uint8_t  n_top;               /* 0..SHM_MAX_TOP_LOGPROBS alternatives that follow */
    uint8_t  flags;               /* SHM_TOK_* */
    uint16_t reserved;            /* 0 */
};
struct shm_top {
    int32_t token;
    float   logprob;
};
/* How a request was admitted, with its first token (wire layout, 16 bytes): what the final usage
 * needs even when the gateway ends the request before the executor's DONE comes. */
struct shm_tok_admit {
    uint32_t cached_prompt_tokens;/* prompt tokens taken from the prefix cache (as DONE's) */
    uint32_t reserved;            /* 0 */
    uint64_t queue_ns;            /* SUBMIT read -> first scheduled (as DONE's) */
};

struct shm_done {
    uint64_t req_id;
    uint32_t finish;              /* enum shm_finish */
    uint32_t prompt_tokens;
    uint32_t completion_tokens;   /* == number of TOKENS entries sent for the request */
    uint32_t cached_prompt_tokens;/* <= prompt_tokens: taken from the prefix cache at the request's
                                   * first admission (the gateway reports it as usage's cached_tokens) */
    uint64_t queue_ns;            /* SUBMIT read -> first scheduled (0: never scheduled) */
    uint64_t prefill_ns;          /* first scheduled -> first token sampled */
    uint64_t decode_ns;           /* first token -> finished */
};

struct shm_error {
    uint64_t req_id;              /* 0: the executor as a whole */
    int32_t  code;                /* a CM_E* code (< 0) */
    uint32_t msg_len;             /* <= SHM_ERR_MSG_MAX */
    char     msg[SHM_ERR_MSG_MAX + 1]; /* NUL-terminated on decode */
};

/* A chunk of the vocabulary's token bytes (gateway -> executor; grammars match them): tokens
 * [first, first + count) of n_total, token first + i being bytes[off[i] .. off[i + 1]) (empty:
 * a token grammars match only by id). The gateway sends chunks in order from token 0, before
 * the first SUBMIT that carries a grammar; a chunk with first 0 starts the table over. On decode
 * off and bytes point into the record. */
struct shm_vocab {
    uint32_t n_total;             /* tokens in the whole table, >= 1 */
    uint32_t first, count;        /* first + count <= n_total; count >= 1 */
    const uint32_t *off;          /* [count + 1], off[0] = 0, ascending, off[count] = bytes_len */
    const uint8_t  *bytes;
    uint32_t bytes_len;
};

/* An embedding request's vector (executor -> gateway), before its DONE. */
struct shm_embed {
    uint64_t req_id;
    uint32_t n_embd;              /* 1..SHM_MAX_EMBD */
    uint32_t prompt_tokens;
    const float *v;               /* [n_embd] finite (on decode: in the record, 4-byte aligned) */
};

/* Reads the record header: *type is a known enum shm_msg_type. Returns 0 or CM_EFORMAT. */
int shm_msg_type(const void *buf, size_t len, uint32_t *type);

/* Record sizes; 0 when the counts exceed their caps. */
size_t shm_submit_size(const struct shm_submit *s);
#define SHM_CANCEL_SIZE 16u
#define SHM_DONE_SIZE   56u
size_t shm_error_size(size_t msg_len);   /* msg_len clamped to SHM_ERR_MSG_MAX */

/* Smallest submit ring capacity that carries a prompt of max_prompt tokens with full stop and
 * logit-bias lists (a power of two, at least SHM_RING_CAP_MIN); 0 if over SHM_RING_CAP_MAX. */
uint32_t shm_submit_ring_cap_for(uint32_t max_prompt);

/* Encoders write into buf (cap bytes, 8-byte aligned) and set *len. They check what decode checks,
 * so a record that encodes also decodes. Return 0, CM_EINVAL (a field out of its sanity range),
 * CM_ETOOBIG (counts over their caps) or CM_ERANGE (cap too small). */
int shm_submit_encode(const struct shm_submit *s, void *buf, size_t cap, size_t *len);
int shm_cancel_encode(uint64_t req_id, void *buf, size_t cap, size_t *len);
int shm_done_encode(const struct shm_done *d, void *buf, size_t cap, size_t *len);
/* msg: NUL-terminated, truncated to SHM_ERR_MSG_MAX bytes; code must be < 0. */
int shm_error_encode(uint64_t req_id, int code, const char *msg, void *buf, size_t cap, size_t *len);

/* Decoders read buf[0..len) only, each field once, and return 0 or CM_EFORMAT for anything that is
 * not a well-formed record of their type (wrong type, length not exact, counts over caps, values
 * out of their sanity ranges, non-zero reserved fields). Out-structs are undefined on error. */
int shm_submit_decode(const void *buf, size_t len, struct shm_submit *out);
int shm_cancel_decode(const void *buf, size_t len, uint64_t *req_id);
int shm_done_decode(const void *buf, size_t len, struct shm_done *out);
int shm_error_decode(const void *buf, size_t len, struct shm_error *out);

/* TOKENS writer (executor, once per step, no allocation): reserve shm_tokens_size(worst case) in
 * the event ring, begin on that memory, add one entry per new token, end, commit the returned
 * length. A step with more output than one record may carry (the ring's max payload) is split
 * into several TOKENS records by the caller. */
struct shm_tokens_w {
    uint8_t *buf;
    size_t cap, len;
    uint32_t n;
};
/* Bytes of a TOKENS record with n_tok entries carrying n_top alternatives in total (add
 * sizeof(struct shm_tok_admit) per entry with SHM_TOK_ADMIT). */
size_t shm_tokens_size(uint32_t n_tok, uint32_t n_top);
/* Returns 0 or CM_ERANGE (cap below the empty record). */
int shm_tokens_begin(struct shm_tokens_w *w, void *buf, size_t cap, uint64_t step);
/* Appends t with t->n_top alternatives from top (may be NULL when n_top == 0). Returns 0,
 * CM_EINVAL (token < 0, n_top over the cap, NaN logprob, unknown flags) or CM_EFULL (no room;
 * the record so far is intact). */
int shm_tokens_add(struct shm_tokens_w *w, const struct shm_tok *t, const struct shm_top *top);
/* The same for an entry with SHM_TOK_ADMIT in t->flags, carrying *a (its reserved field 0).
 * shm_tokens_add refuses that flag; this one requires it. */
int shm_tokens_add_admit(struct shm_tokens_w *w, const struct shm_tok *t, const struct shm_top *top,
                         const struct shm_tok_admit *a);
/* Finalizes the entry count; returns the record length. */
size_t shm_tokens_end(struct shm_tokens_w *w);

/* TOKENS reader (gateway): open validates the whole record, then next walks it. */
struct shm_tokens_r {
    const uint8_t *buf;
    size_t len, off;
    uint32_t n, i;
    uint64_t step;            /* engine step number */
    const uint8_t *adm;       /* the last entry's admission data (SHM_TOK_ADMIT), else NULL */
};
/* Returns 0 or CM_EFORMAT. */
int shm_tokens_open(struct shm_tokens_r *rd, const void *buf, size_t len);
/* Next entry into *t and *top (points into the record; valid until release). Returns 0,
 * CM_EEMPTY after the last entry, or CM_EFORMAT. */
int shm_tokens_next(struct shm_tokens_r *rd, struct shm_tok *t, const struct shm_top **top);
/* The admission data of the entry shm_tokens_next returned last, when its flags had
 * SHM_TOK_ADMIT: 0, or CM_ENOENT. */
int shm_tokens_admit(const struct shm_tokens_r *rd, struct shm_tok_admit *out);

/* Ring convenience: reserve, encode in place, commit (with wake-up). Return the encoder's codes
 * plus CM_EFULL (ring full now: retry later) and CM_ETOOBIG (record over the ring's limit). */
int shm_send_submit(struct shm_ring *r, const struct shm_submit *s);
int shm_send_cancel(struct shm_ring *r, uint64_t req_id);
int shm_send_done(struct shm_ring *r, const struct shm_done *d);
int shm_send_error(struct shm_ring *r, uint64_t req_id, int code, const char *msg);

/* VOCAB and EMBED: sizes, encoders and decoders as above (same returns). */
size_t shm_vocab_size(uint32_t count, uint32_t bytes_len);
int shm_vocab_encode(const struct shm_vocab *v, void *buf, size_t cap, size_t *len);
int shm_vocab_decode(const void *buf, size_t len, struct shm_vocab *out);
int shm_send_vocab(struct shm_ring *r, const struct shm_vocab *v);
size_t shm_embed_size(uint32_t n_embd);
int shm_embed_encode(const struct shm_embed *e, void *buf, size_t cap, size_t *len);
int shm_embed_decode(const void *buf, size_t len, struct shm_embed *out);
int shm_send_embed(struct shm_ring *r, const struct shm_embed *e);

#endif
