/* backend: the interface every compute backend implements (cpu: backend_cpu.c; cuda:
 * executor/cuda/). A small struct of function pointers, created from a model description and
 * the engine's limits, driven by the engine's step thread.
 *
 * What a backend owns: its copy or mapping of the weights, the KV storage (n_kv_blocks
 * physical blocks laid out as it likes; the block ids in a batch index it), scratch sized for
 * the limits, and the host logits buffer it returns. What it does not own: which blocks
 * belong to which sequence (executor/kv.h) or the sampling rules (executor/sampler.h), which
 * a backend may run on its own device (forward_sample) but must not change.
 *
 *   ex_backend_opts o = { .lim = lim, .n_threads = 2, .kv_type = DT_F32 };
 *   ex_backend *b;
 *   if (ex_backend_create("cpu", model, &o, &b, err, sizeof err)) die(err);
 *   const float *logits; b->forward(b, &batch, &logits);   // batch already ex_batch_check'ed
 *   b->destroy(b);
 *
 * A forward call reads each sequence's KV for positions [0, pos) through its block table,
 * writes the new tokens' K and V at their positions, and returns the logits rows the batch
 * asks for. It must keep the batch-invariance promise of engine.h.
 */
#ifndef EX_BACKEND_H
#define EX_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

typedef struct ex_backend_opts {
    ex_limits lim;   /* sizes; lim.n_kv_blocks blocks of lim.block_size tokens to allocate, exactly;
                      * 0: the backend sizes the pool from its device memory (cuda only, below);
                      * lim.n_kv_blocks_swa blocks more for the sliding-window layers, when the
                      * model has some (their own block ids: batch->block_tables_swa) */
    int n_threads;   /* cpu: threads including the caller; <= 0 = automatic */
    int device;      /* cuda: device ordinal */
    int kv_type;     /* element type of the KV storage (executor/kv.h's layouts): cpu DT_F32, DT_F16,
                      * DT_F8_E4M3, DT_Q8_0; cuda DT_F16, DT_F8_E4M3 (the engine refuses a backend whose
                      * ex_backend.kv_type differs from what was asked) */
    /* cuda, lim.n_kv_blocks == 0: the pool takes what is left of mem_fraction x the device's
     * memory after the weights, activations and workspaces (ex_kv_fit_blocks), at least one
     * sequence of n_ctx positions (max(2, lim.max_blocks) blocks, else CM_ENOKV) and at most
     * what every sequence at full context can use (lim.max_seqs x lim.max_blocks blocks). */
    double mem_fraction;   /* in (0, 1] */
    /* cuda: seconds for capturing decode graphs at start-up; the buckets not captured when it
     * runs out run eagerly. 0 = no graphs. */
    double graph_budget_s;
    ex_cuda_opts cuda;     /* cuda: kernel-plan overrides, diagnostics */
} ex_backend_opts;

struct ex_backend {
    const char *name;   /* "cpu", "cuda" */
    int kv_type;        /* element type actually used for K and V */
    int n_kv_blocks;    /* blocks in the KV pool it allocated (the engine's ex_kv hands out these) */
    /* One forward pass over a batch that passed ex_batch_check against this backend's limits.
     * *logits: host memory [batch->n_out, n_vocab], owned by the backend, valid until the
     * next call. Returns 0 or a negative CM_E* code; allocates nothing. */
    int  (*forward)(ex_backend *b, const ex_batch *batch, const float **logits);
    /* Optional (NULL: the engine samples on the host): one forward pass over a batch, then
     * samples rows (indices checked by the engine) where the logits are, into out; a row the
     * sampler refuses gets token -1. May refuse the whole step with CM_EUNSUPPORTED before
     * doing any work (a row beyond what it can sample): the engine then runs forward and
     * samples on the host. Returns 0 or a negative CM_E* code; allocates nothing. */
    int  (*forward_sample)(ex_backend *b, const ex_batch *batch, const ex_sample_row *rows, int n_rows,
                           ex_sample_out *out);
    /* Copies positions [0, n_tok) of physical block src into block dst, every full-attention
     * layer (copy on write of a shared prefix block; block ids of the main pool). Returns 0 or
     * CM_EINVAL. */
    int  (*kv_copy)(ex_backend *b, int32_t src, int32_t dst, int n_tok);
    /* Frees everything; accepts NULL. */
    void (*destroy)(ex_backend *b);
    void *impl;         /* the backend's state */
    /* Blocks of the sliding-window layers' pool it allocated (lim.n_kv_blocks_swa, or sized
     * from device memory with the main pool); 0 when the model has no such layers. A backend
     * that does not implement sliding-window layers refuses the model at create (mdl_features). */
    int n_kv_blocks_swa;
    /* Optional (NULL: no embeddings): forward() that returns, instead of logits, the hidden
     * states after the final norm of the rows the batch asks for: *hidden [n_out, n_embd],
     * host memory owned by the backend, valid until the next call. Allocates nothing. */
    int (*forward_hidden)(ex_backend *b, const ex_batch *batch, const float **hidden);
    /* The model features (enum mdl_feature bits) this backend implements. The engine refuses a
     * model needing any other, naming them, so a backend that predates a feature never runs a
     * model wrong: one that leaves this 0 runs the Llama-2 forward pass only. */
    unsigned features;
    /* What forward_sample does beyond the plain rows (EX_SAMPLE_CAP_* bits). A backend that
     * leaves a bit clear never sees such rows: the engine runs forward and samples on the host
     * for that step instead, so nothing is silently ignored. */
    unsigned sample_caps;
};

/* forward_sample applies the rows' token masks (ex_sample_row.mask, executor/sampler.h): the
 * contract for a device sampler that sets it. Per row with mask != NULL: the mask is host
 * memory of ex_gram_mask_words(n_vocab) u32 words (bit t of word t / 32 = token t allowed),
 * valid for the call only (copy it to the device within the call: upload the step's masks as
 * one [n_rows, words] bitmask block). In the sampler's step 1, after the bias, every token whose
 * bit is clear gets z = -inf, so it is never a candidate (greedy included) and its logprob is
 * -inf; top-k / top-p / min-p and the draw then run over the allowed tokens exactly as the CPU
 * sampler does (when every allowed token has z = -inf: the lowest allowed id); a row whose mask
 * allows nothing gets token -1. Rows without a mask are sampled as before. */
#define EX_SAMPLE_CAP_MASK 1u

typedef int (*ex_backend_create_fn)(const mdl_model *m, const ex_backend_opts *o, ex_backend **out,
                                    char *err, size_t errlen);

/* The CPU backend (always built). Weights are used in place (mmapped; F8_E4M3 as code x row
 * scale), K/V in any of its kv types. Every model the loader accepts runs on it (mdl_features:
 * all).
 * Returns 0, CM_EUNSUPPORTED (architecture or a weight type without a kernel), CM_ENOMEM,
 * CM_EINVAL; writes one line into err. */
int ex_backend_cpu_create(const mdl_model *m, const ex_backend_opts *o, ex_backend **out,
                          char *err, size_t errlen);
/* The CUDA backend: defined by executor/cuda/ when built, NULL otherwise. Besides the codes
 * above, CM_ENOMEM when the weights or an explicit pool do not fit the free device memory and
 * CM_ENOKV when mem_fraction leaves less than the smallest pool, each with the numbers in err. */
int ex_backend_cuda_create(const mdl_model *m, const ex_backend_opts *o, ex_backend **out,
                           char *err, size_t errlen) __attribute__((weak));
/* The cuda backend's sequences and tokens per step for a model on a device, when the engine's
 * options leave them 0 (from the device's memory and SMs and the model's size; engine.h).
 * Returns 0 or CM_ECUDA (no such device). NULL when not built. */
int ex_backend_cuda_defaults(int device, const mdl_config *c, int *max_seqs, int *max_tokens) __attribute__((weak));

/* Dispatches by name ("cpu" | "cuda"). CM_EUNSUPPORTED for a backend not built in. */
int ex_backend_create(const char *name, const mdl_model *m, const ex_backend_opts *o, ex_backend **out,
                      char *err, size_t errlen);
/* The KV element type a backend prefers (cpu: DT_F32, cuda: DT_F16); -1 for an unknown name. */
int ex_backend_default_kv_type(const char *name);

#endif
