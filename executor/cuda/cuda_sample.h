/* cuda_sample: packs the engine's sampling rows (ex_sample_row) into the pool the device
 * sampler reads (kc_sample in kernels/cuda/kcuda.h). Used by the cuda backend's forward_sample
 * and by tests/gpu/test_gpu_sample.c; called from the step thread; allocates nothing.
 *
 *   int slot[R], n_dev; size_t bytes;
 *   if (ex__cuda_sample_stage(h_pool, R, n_vocab, n_out, rows, n, mark, slot, &n_dev, &bytes) == 0) {
 *       cudaMemcpyAsync(d_pool, h_pool, bytes, ...);             // one copy
 *       kc_sample(d_logits, n_vocab, n_vocab, d_pool, n_dev, d_out, stream);
 *   }   // slot[r] < 0: row r refused (token -1); CM_EUNSUPPORTED: sample this step on the host
 *
 * What the device sampler gives compared with ex_sampler_sample on the same logits:
 *  - the same bias, penalties, temperature, greedy argmax, top-k, min-p cut, top-N logprob
 *    ranking and the same draw u = ex_rng_u01(seed, pos) (Philox4x32-10 from the one
 *    common/cm_philox.h both sides compile), with the same float and double operations, so
 *    the same token, except:
 *  - where a running probability sum and its target (top_p, or u * mass for the draw) are
 *    within double rounding of each other: the CPU normalises each probability and adds them
 *    one by one in sorted order, the device adds unnormalised masses in another (fixed) order,
 *    and exp() may differ by one ulp between CUDA and glibc. Each decision is deterministic
 *    on both sides; they can disagree only when the two sums straddle the target, which for
 *    a random draw is a ~1e-13 event.
 *  - logprobs: the log-sum-exp is summed in another order: within a few ulp of the CPU's
 *    (1e-5 absolute is the tested bound), so two alternatives whose float logprobs tie on
 *    one side may be ordered by id differently on the other.
 *  - rows whose logits contain NaN (undefined on both sides).
 * Token masks (ex_sample_row.mask, EX_SAMPLE_CAP_MASK) are applied as the CPU sampler does
 * (a disallowed token's z is -inf; when every allowed z is -inf, the lowest allowed id; a mask
 * that allows nothing refuses the row: token -1).
 * Limits: a row whose penalty window (active penalties) exceeds KC_SAMPLE_MAX_WINDOW tokens or
 * whose bias list exceeds KC_SAMPLE_MAX_BIAS entries, more than KC_SAMPLE_MAX_MASKED rows with
 * masks, or two rows naming the same logits row
 * (the device sampler works in place), make the whole step CM_EUNSUPPORTED: the engine then
 * samples it on the host (ex_engine_forward_sample), so the result is still the CPU's. */
#ifndef EX_CUDA_SAMPLE_H
#define EX_CUDA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "executor/engine.h"
#include "kernels/cuda/kcuda.h"

/* Packs rows[0..n_rows) into pool (host memory of kc_sample_pool_bytes(max_rows, n_vocab)). slot[r]:
 * the row's index among the *n_dev packed rows, or -1 when ex_sampler_sample would refuse it
 * (parameters, a previous token out of range). *bytes: the prefix of pool to copy to the
 * device. n_logits: logits rows of the step (rows[r].row < n_logits, checked by the engine);
 * mark: scratch of n_logits bytes. Returns 0, or CM_EUNSUPPORTED (see Limits above; nothing
 * usable is staged). */
int ex__cuda_sample_stage(void *pool, int max_rows, int n_vocab, int n_logits, const ex_sample_row *rows, int n_rows,
                          uint8_t *mark, int *slot, int *n_dev, size_t *bytes);

/* Copies a device result into the engine's form. Can't fail. */
void ex__cuda_sample_out(const kc_sample_out *d, ex_sample_out *o);

#endif
