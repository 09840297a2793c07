/* engine: the executor's step API, shared by every backend (cpu, cuda).
 *
 * One step = one forward pass over a batch. A batch is a list of sequences; each brings its
 * new token ids (1 for a decode step, many for a prefill or a chunk of one), the position of
 * its first new token (= how many of its tokens the KV cache already holds) and its KV block
 * table. The backend sees every token of every sequence at once, token-major:
 *
 *   tok[t], pos[t], seq[t]          t < n_tokens   (flat; a sequence's tokens are contiguous,
 *                                                   in order, positions consecutive)
 *   seq_start[s], seq_len[s]        s < n_seqs     (its slice of the flat arrays)
 *   block_tables[s * bt_stride + j] j < n_blocks[s] (physical KV block of positions
 *                                                   [j*block_size, (j+1)*block_size))
 *   block_tables_swa[...]           the same positions' blocks in the sliding-window
 *                                   layers' pool (models with such layers; entries of
 *                                   blocks wholly before the window may be -1)
 *
 * After the step the KV cache holds positions [0, pos[last] + 1) of every sequence, and the
 * logits of the requested positions are returned, one row of n_vocab floats each, in token
 * order: a sequence's last new token always, and every new token when out_all[s] is set
 * (seq_out[s] is the row of its first output; its last output is row
 * seq_out[s] + (out_all[s] ? seq_len[s] : 1) - 1).
 *
 * Invariant every backend keeps (batch invariance): the logits of a token depend only on its
 * sequence's tokens, never on which other sequences or how many tokens share the step, nor
 * on the thread count. Greedy decoding is therefore the same alone or batched. The CUDA
 * backend keeps it bit for bit within each matmul path (the GEMVs up to 8 tokens a step, the
 * tensor-core tiles and cuBLAS past that); a token whose step falls on the other side of that
 * boundary in another run (a short prompt prefilled alone, then among others) can differ in
 * the last bits, and a greedy choice with it only at a near tie (bench/RESULTS.md, twentieth
 * session).
 *
 *   ex_engine *e; char err[256];
 *   ex_engine_opts o; ex_engine_opts_default(&o);
 *   if (ex_engine_create(model, &o, &e, err, sizeof err)) die(err);
 *   ex_batch_buf bb; ex_batch_buf_init(&bb, ex_engine_limits(e));
 *   ex_batch_buf_add(&bb, ids, n, 0, table, n_blocks, 0);     // one sequence, prefill
 *   const float *logits; ex_engine_forward(e, &bb.b, &logits); // [n_out, n_vocab]
 *   // or forward + sampling in one call (on the device when the backend can):
 *   ex_sample_row r = { .row = 0, .sp = &params, .prev = ids, .n_prev = n, .pos = n };
 *   ex_sample_out o; ex_engine_forward_sample(e, &bb.b, &r, 1, &o);
 *   ex_batch_buf_free(&bb); ex_engine_destroy(e);
 *
 * Threads: an engine is driven by one thread at a time (the executor's step thread); the
 * backend may use its own workers inside a call. Nothing is allocated per step: all buffers
 * are sized at create time from the limits.
 */
#ifndef EX_ENGINE_H
#define EX_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "sampler.h"

typedef struct ex_kv ex_kv;            /* executor/kv.h: the block allocator */
typedef struct ex_backend ex_backend;  /* executor/backend.h */

/* One forward pass's input. All arrays are owned by the caller and must stay valid for the
 * duration of the forward call only. */
typedef struct ex_batch {
    int n_tokens;                 /* new tokens over all sequences, >= 1 */
    int n_seqs;                   /* >= 1 */
    /* token-major, [n_tokens] */
    const int32_t *tok;           /* token ids, each in [0, n_vocab) */
    const int32_t *pos;           /* absolute position of each token in its sequence */
    const int32_t *seq;           /* sequence index (into the per-sequence arrays) */
    /* per sequence, [n_seqs] */
    const int32_t *seq_start;     /* first flat index of the sequence's tokens */
    const int32_t *seq_len;       /* its number of new tokens (>= 1) */
    const int32_t *n_blocks;      /* valid entries of its block-table row; must cover pos+len */
    const uint8_t *out_all;       /* 1: logits for every new token; 0: the last only */
    const int32_t *seq_out;       /* row of its first logits output */
    const int32_t *block_tables;  /* [n_seqs, bt_stride] physical block ids */
    int bt_stride;                /* >= max n_blocks */
    int n_out;                    /* total logits rows */
    const int32_t *block_tables_swa; /* [n_seqs, bt_stride] sliding-window pool ids; NULL when the
                                   * model has no sliding-window layers */
} ex_batch;

/* Sizes a backend is created for; a batch must fit all of them. */
typedef struct ex_limits {
    int max_tokens;     /* new tokens per forward (the step's token budget) */
    int max_seqs;       /* sequences per forward */
    int max_out;        /* logits rows per forward */
    int max_blocks;     /* block-table entries per sequence = ceil(n_ctx / block_size) */
    int n_ctx;          /* positions per sequence */
    int block_size;     /* tokens per KV block */
    int n_kv_blocks;    /* physical blocks in the KV pool */
    int n_vocab;
    int n_kv_blocks_swa; /* blocks in the sliding-window layers' pool (0: the model has none) */
    int swa_window;     /* positions a query of a sliding layer sees (0: none) */
} ex_limits;

/* Caller-owned storage for building batches without allocating per step. */
typedef struct ex_batch_buf {
    ex_batch b;
    ex_limits lim;
    int32_t *tok, *pos, *seq;                    /* [max_tokens] */
    int32_t *seq_start, *seq_len, *n_blocks, *seq_out; /* [max_seqs] */
    uint8_t *out_all;                            /* [max_seqs] */
    int32_t *block_tables;                       /* [max_seqs, max_blocks] (bt_stride = max_blocks) */
    int32_t *block_tables_swa;                   /* [max_seqs, max_blocks] when lim.n_kv_blocks_swa > 0 */
} ex_batch_buf;

/* Allocates the buffers for lim (once, at start-up). Returns 0 or CM_ENOMEM. */
int  ex_batch_buf_init(ex_batch_buf *bb, const ex_limits *lim);
void ex_batch_buf_free(ex_batch_buf *bb); /* accepts a zeroed or freed buffer */
/* Empties the batch (keeps the storage). Can't fail. */
void ex_batch_buf_clear(ex_batch_buf *bb);
/* Appends one sequence: n new tokens at positions [pos0, pos0+n), its block table (copied;
 * n_blocks entries covering at least pos0+n positions), out_all as above. Returns the
 * sequence's index in the batch (>= 0), or CM_EFULL when the batch cannot take it (tokens,
 * sequences or logits rows), CM_EINVAL for bad arguments, CM_ECTX past n_ctx. */
int  ex_batch_buf_add(ex_batch_buf *bb, const int32_t *ids, int n, int pos0,
                      const int32_t *block_table, int n_blocks, int out_all);
/* The same from a sequence's KV table (executor/kv.h), both pools' rows: what a model with
 * sliding-window layers needs (ex_batch_buf_add leaves their row at -1, which the batch check
 * refuses). */
struct ex_kv_table;
int  ex_batch_buf_add_kv(ex_batch_buf *bb, const int32_t *ids, int n, int pos0, const struct ex_kv_table *t, int out_all);
/* Row of the logits of sequence s's last new token. */
static inline int ex_batch_last_row(const ex_batch *b, int s) {
    return b->seq_out[s] + (b->out_all[s] ? b->seq_len[s] : 1) - 1;
}

/* Checks a batch against limits (shapes, ranges, block tables covering every position, block
 * ids inside the pool). Every backend calls it before touching memory. Returns 0 or CM_EINVAL
 * with a reason in err. */
int ex_batch_check(const ex_batch *b, const ex_limits *lim, char *err, size_t errlen);

/* ---- the engine: a backend + the KV block allocator ----------------------------------- */

/* The cuda backend's kernel-plan overrides and diagnostics (kernels/cuda/kcuda.h kc_plan). */
typedef struct ex_cuda_opts {
    const char *plan;       /* "key=value,..." over the plan chosen from the device (--cuda-plan) */
    int         profile;    /* eager steps timed per launch, the breakdown printed at exit (--cuda-profile) */
    int         graph_timing; /* device time per graph replay printed at exit (--cuda-graph-timing) */
    int         trace_step; /* the N-th decode graph replay recorded per CTA (--cuda-trace N; builds with
                             * -DARKA_CUDA_TRACE=ON) into trace_file (default arka-trace.csv) */
    const char *trace_file;
    int64_t     fault_at_step; /* testing: a trapping kernel in that step (--cuda-fault-at-step) */
} ex_cuda_opts;

/* Weight conversion at create (--quantize). */
enum ex_quant { EX_QUANT_NONE = 0, EX_QUANT_FP8 = 1 };
/* Parses --quantize: "none" -> EX_QUANT_NONE, "fp8" -> EX_QUANT_FP8; -1 for anything else. */
int ex_quant_from_name(const char *name);

typedef struct ex_engine_opts {
    const char *backend;    /* "cpu" (default) or "cuda" (when built) */
    int     n_threads;      /* cpu: threads including the caller; 0 = automatic (cores, fewer for tiny models) */
    int64_t kv_cache_mb;    /* KV pool budget in MiB, exactly; 0 = automatic: cpu ex_kv_default_bytes(),
                             * cuda what gpu_mem_fraction leaves (backend.h, ex_backend_opts) */
    int     kv_blocks;      /* > 0: exactly this many blocks (overrides kv_cache_mb; tests, tuning) */
    double  gpu_mem_fraction; /* cuda: share of the device's memory this process may fill, weights
                             * included, in (0, 1]; default 0.90 */
    double  cuda_graph_budget_s; /* cuda: seconds for capturing decode graphs at start-up; 0 = no
                             * graphs; default 60 */
    int     block_size;     /* tokens per KV block; 0 = 16 */
    int     n_ctx;          /* positions per sequence; 0 = the model's training context */
    int     max_tokens;     /* token budget per step; 0 = cpu 512, cuda ex_backend_cuda_defaults (backend.h) */
    int     max_seqs;       /* sequences per step; 0 = cpu 64, cuda ex_backend_cuda_defaults */
    int     max_out;        /* logits rows per step; 0 = max_seqs */
    int     device;         /* cuda: device ordinal */
    int     kv_type;        /* KV element type (executor/kv.h: DT_F32, DT_F16, DT_F8_E4M3, DT_Q8_0; --kv-cache-dtype,
                             * ex_kv_type_from_name); -1 = the backend's default. A backend that would
                             * store another type than asked is refused at create, naming both */
    ex_cuda_opts cuda;
    int     quantize;       /* enum ex_quant. EX_QUANT_FP8: the engine runs a copy of the model whose F32/F16/BF16
                             * layer matrices are FP8 E4M3 with per-output-channel scales (mdl_quantize), made at
                             * create with n_threads threads (0: every core) and freed with the engine */
} ex_engine_opts;

typedef struct ex_engine ex_engine;

/* Fills the defaults above (zero = automatic, except the two cuda defaults). Can't fail. */
void ex_engine_opts_default(ex_engine_opts *o);
/* Sets o->quantize and o->kv_type from the command-line words of --quantize ("none", "fp8";
 * NULL: none) and --kv-cache-dtype ("auto", "f32", "f16", "fp8", "q8_0"; NULL: auto).
 * Returns 0, or CM_EINVAL with "--flag 'value': expected ..." in err. */
int ex_engine_opts_types(ex_engine_opts *o, const char *quantize, const char *kv_cache_dtype, char *err, size_t errlen);

/* Creates the backend for model m (which must outlive the engine), then the KV block
 * allocator for the pool the backend allocated (its size is known only then on cuda, where
 * it comes from gpu_mem_fraction unless kv_cache_mb or kv_blocks is given). On error returns
 * CM_EUNSUPPORTED (architecture, tensor type or backend), CM_ENOKV (the KV budget holds fewer
 * than 2 blocks; cuda sized from the fraction: fewer than one sequence of n_ctx), CM_ENOMEM
 * (cuda: weights or an explicit pool larger than the free device memory), CM_EINVAL (limits,
 * gpu_mem_fraction outside (0, 1], a negative graph budget), and writes one line into err.
 * Whether the pool can hold a given request is the scheduler's (or the caller's) check. */
int  ex_engine_create(const mdl_model *m, const ex_engine_opts *o, ex_engine **out, char *err, size_t errlen);
void ex_engine_destroy(ex_engine *e); /* accepts NULL */

const ex_limits *ex_engine_limits(const ex_engine *e);
ex_kv           *ex_engine_kv(ex_engine *e);
ex_backend      *ex_engine_backend(ex_engine *e);
/* The model the backend runs: the one given to ex_engine_create, or its quantized copy. */
const mdl_model *ex_engine_model(const ex_engine *e);

/* Runs one forward pass. On success *logits points to [b->n_out, n_vocab] floats owned by
 * the engine, valid until the next forward or destroy. Returns 0, CM_EINVAL (the batch
 * failed ex_batch_check), or a backend error. */
int ex_engine_forward(ex_engine *e, const ex_batch *b, const float **logits);

/* Runs one forward pass and samples rows[0..n_rows) (executor/sampler.h: each row names its
 * logits row of the batch, its parameters, bias and previous tokens) into out[0..n_rows), each
 * exactly as ex_sampler_sample on that logits row would: the logits stay
 * where they were computed when the backend can sample there (cuda: only the tokens and
 * logprobs cross to the host), else forward + ex_sampler_sample on the host. Both give the
 * CPU sampler's tokens (the device's exceptions: executor/cuda/cuda_sample.h). A row whose
 * parameters or previous tokens the sampler refuses gets out.token = -1 (the others are
 * sampled). n_rows may be 0 (a step of prefill chunks only). Returns 0, CM_EINVAL (the batch
 * failed ex_batch_check, a row index outside the batch or without parameters), or a backend
 * error. Allocates nothing. */
int ex_engine_forward_sample(ex_engine *e, const ex_batch *b, const ex_sample_row *rows, int n_rows, ex_sample_out *out);

/* Copies positions [0, n_tok) of KV block src into block dst (the full-attention layers; the
 * backend's kv_copy): a partly filled block shared by copy instead of recomputed. Returns 0,
 * CM_EINVAL (ids or n_tok out of range) or CM_EUNSUPPORTED (the backend cannot). */
int ex_engine_kv_copy(ex_engine *e, int32_t src, int32_t dst, int n_tok);

/* Embeddings: one forward pass over b, then one vector per sequence from the final-norm
 * hidden states, pooled as `pooling` says (enum mdl_pooling: MDL_POOL_LAST the last new
 * token's, MDL_POOL_MEAN the mean over the sequence, MDL_POOL_CLS its first token's) and
 * L2-normalised when normalize is set. MEAN and CLS need the whole sequence in this batch
 * (position 0 first) with out_all set; LAST needs the sequence's last token. out:
 * [b->n_seqs, n_embd]. Returns 0, CM_EINVAL (batch, pooling), CM_EUNSUPPORTED (the backend
 * has no hidden-state forward) or a backend error. Allocates nothing. */
int ex_engine_embed(ex_engine *e, const ex_batch *b, int pooling, int normalize, float *out);

/* One forward pass returning, instead of logits, the final-norm hidden states of the rows the
 * batch asks for: *hidden [b->n_out, n_embd], owned by the engine, valid until the next call
 * (what ex_engine_embed pools; the scheduler pools prompts longer than a step itself). Returns
 * 0, CM_EINVAL (batch), CM_EUNSUPPORTED (no hidden-state forward on this backend) or a backend
 * error. Allocates nothing. */
int ex_engine_forward_hidden(ex_engine *e, const ex_batch *b, const float **hidden);
/* 1 when the backend has a hidden-state forward (embeddings). */
int ex_engine_has_hidden(const ex_engine *e);

#endif
