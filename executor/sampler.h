/* sampler: turns one sequence's logits into its next token: logit bias, repetition /
 * presence / frequency penalties, temperature, top-k, top-p, min-p, a seeded draw, and
 * log-probabilities. Each sequence is sampled from its own logits, its own previous tokens,
 * its own parameters and a random number keyed by (seed, position): the result never depends
 * on which other sequences shared the step, and a recomputed (preempted) sequence draws the
 * same tokens again.
 *
 * The parameters are the ring's struct shm_sampling (shm/shm.h), here named ex_sample_params:
 * the same struct, with the same field names, from the OpenAI request to this sampler and the
 * cuda backend's device sampler. The logit bias list travels beside it, in the sample row.
 *
 * Order of the transforms (documented because the cuda backend's device sampler must do the
 * same):
 *   1. z = logits + bias[id]; z = -inf where the row's mask (when it has one) clears the bit:
 *      only allowed tokens are candidates below (when every allowed token has z = -inf, the
 *      lowest allowed id is taken)
 *   2. penalties over the last penalty_last_n previous tokens (each distinct token once):
 *      repetition (llama.cpp): z > 0 ? z / r : z * r;  then z -= presence + frequency * count
 *   3. logprobs (when asked): log-softmax of z / temperature (z itself when greedy) over the
 *      whole vocabulary, before any truncation; top-N alternatives by that value
 *   4. temperature 0: the argmax of z (lowest id on ties); done
 *   5. z /= temperature; candidates sorted by (z desc, id asc); top-k keeps the first k;
 *      probabilities p = softmax over the candidates (double); top-p keeps the shortest
 *      prefix whose mass reaches top_p; min-p keeps p >= min_p * p_max
 *   6. u = ex_rng_u01(seed, pos) (Philox4x32-10, below); pick the first candidate whose
 *      cumulative mass exceeds u * (mass kept); the last one if rounding leaves none
 *
 *   ex_sampler *s; ex_sampler_create(n_vocab, &s);
 *   ex_sample_params p; ex_sample_params_default(&p); p.temperature = 0.8f; p.seed = 42;
 *   ex_sample_row r = { .sp = &p, .prev = prev, .n_prev = n_prev, .pos = n_prev };
 *   ex_sample_out o; ex_sampler_sample(s, &r, logits, &o);
 *   ex_sampler_destroy(s);
 *
 * A sampler is scratch for one thread; ex_sampler_sample allocates nothing.
 */
#ifndef EX_SAMPLER_H
#define EX_SAMPLER_H

#include <stdint.h>

#include "common/cm_philox.h"
#include "shm/shm.h"

#define EX_MAX_LOGPROBS SHM_MAX_TOP_LOGPROBS

/* The ring's sampling parameters (shm/shm.h): the one struct, under the executor's name. */
typedef struct shm_sampling ex_sample_params;

/* One token to sample: its parameters and bias, the sequence's previous tokens, the position.
 * After a batched forward pass, row names the logits row it samples from (e.g.
 * ex_batch_last_row); ex_sampler_sample takes the row's logits directly and ignores it. */
typedef struct ex_sample_row {
    int                     row;    /* [0, batch n_out) */
    const ex_sample_params *sp;
    const int32_t          *prev;   /* [n_prev] the sequence's tokens before this one (prompt included) */
    int                     n_prev;
    int64_t                 pos;    /* position being sampled (usually n_prev) */
    const struct shm_logit_bias *bias; /* [n_bias] ids in [0, n_vocab), bias not NaN (-inf masks a token) */
    int                     n_bias;
    /* Constrained decoding (executor/grammar.h): NULL, or a bitmask of ceil(n_vocab / 32) words,
     * bit t (word t / 32, bit t % 32) set when token t is allowed. Applied with the bias (step 1
     * below): a token outside it is never drawn, and its logprob is -inf. An empty mask refuses
     * the row (token -1). */
    const uint32_t         *mask;
} ex_sample_row;

typedef struct ex_sample_out {
    int32_t token;
    float   logprob;                      /* of token (logprobs or top_logprobs set) */
    int     n_top;                        /* alternatives filled */
    int32_t top_id[EX_MAX_LOGPROBS];      /* by logprob desc, id asc */
    float   top_logprob[EX_MAX_LOGPROBS];
} ex_sample_out;

/* Defaults: shm_sampling_default's (greedy, penalties off, penalty_last_n 64, no logprobs).
 * Can't fail. */
static inline void ex_sample_params_default(ex_sample_params *p) { shm_sampling_default(p); }
/* Checks a row: the parameters' ranges (shm_sampling_check), bias ids in [0, n_vocab) and no
 * NaN bias, n_prev >= 0 with prev set. Returns 0 or CM_EINVAL. */
int  ex_sample_row_check(const ex_sample_row *r, int n_vocab);

/* The random number of a draw: Philox4x32-10 (common/cm_philox.h) keyed by the seed and
 * counting positions,
 *   r = Philox4x32-10(counter = { pos lo32, pos hi32, 0, 0 }, key = { seed lo32, seed hi32 }),
 *   u = ((r[0] << 32 | r[1]) >> 11) * 2^-53  in [0, 1),
 * where pos is the position of the token being drawn (the sequence's length before it). The
 * device sampler (kernels/cuda/sample.cu) calls the same cm_philox_u01. Can't fail. */
static inline double ex_rng_u01(uint64_t seed, int64_t pos) {
    return cm_philox_u01(seed, (uint64_t)pos);
}

/* splitmix64's finalizer (not the draw: seeds and hashes elsewhere in the executor),
 *   mix(z) = { z += 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
 *              z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31; }. Can't fail. */
static inline uint64_t ex_rng_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct ex_sampler ex_sampler;

/* Scratch for n_vocab. Returns 0, CM_EINVAL or CM_ENOMEM. */
int  ex_sampler_create(int n_vocab, ex_sampler **out);
void ex_sampler_destroy(ex_sampler *s); /* accepts NULL */

/* Samples r's token from logits [n_vocab] (not modified). Returns 0 or CM_EINVAL (a row
 * failing ex_sample_row_check, a previous id in the penalty window out of range). */
int ex_sampler_sample(ex_sampler *s, const ex_sample_row *r, const float *logits, ex_sample_out *out);

#endif
