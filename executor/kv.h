/* kv: the paged KV cache's bookkeeping: a pool of fixed-size blocks (block_size positions of
 * every layer's K and V), a free list, reference counts (a block shared by several
 * sequences' prefixes is freed when its last holder lets go), and per-sequence block tables.
 *
 * The storage itself belongs to the backend (host memory for cpu, device memory for cuda);
 * this module only hands out block ids in [0, n_blocks). The pool's size is fixed at start-up
 * from a byte budget; running out is reported as CM_ENOKV, never by growing.
 *
 *   ex_kv *kv; ex_kv_create(n_blocks, 16, &kv);
 *   ex_kv_table t; ex_kv_table_init(&t, max_blocks_per_seq);
 *   if (ex_kv_table_reserve(kv, &t, n_pos) == CM_ENOKV) preempt_someone();
 *   ... t.blocks[0 .. t.n) go into the batch ...
 *   ex_kv_table_release(kv, &t); ex_kv_table_free(&t); ex_kv_destroy(kv);
 *
 * Sliding-window layers (cfg.n_layer_swa > 0) keep their K and V in a second pool with its own
 * block ids: a sequence's table then holds two rows of the same length, blocks[] for the
 * full-attention layers and blocks_swa[] for the sliding ones. Both are reserved together;
 * ex_kv_table_slide() frees the sliding blocks whose every position lies before the window of
 * the next query (marking them -1), so a long sequence holds only about window / block_size
 * of them. A model whose layers all slide has no full-attention storage: its blocks[] ids are
 * bookkeeping only and the engine makes that pool large enough never to be the limit.
 *
 * Prefix cache (ex_kv_prefix_enable; the full-attention pool only). A full block is known by
 * its key: its block_size token ids and its parent, the block before it in the sequence (none
 * for block 0, whose key also takes the pool's root: the model and adapter identity). Equal
 * prefixes therefore map to the same physical blocks. A block joins the cache when a sequence
 * registers it (ex_kv_table_register: its tokens are known, its positions maybe not computed
 * yet: "pending") and becomes reusable once computed (ex_kv_table_computed). When its last
 * holder lets go, a computed cached block is not freed but queued in an LRU of reusable
 * blocks; allocation takes truly free blocks first, then evicts the least recently released
 * cached block (its key leaves the cache). A pending block whose holder lets go leaves the
 * cache at once. Blocks held by any table are never evicted, and a cached block is never
 * written again (a sequence writes only positions past its cached prefix, in blocks of its
 * own), so reuse cannot corrupt what another sequence reads. Keys are compared exactly (token
 * ids and the parent's identity; the 64-bit hash only finds candidates), so a hash collision
 * cannot return a wrong block.
 *
 *   uint64_t h[N]; h[j] = ex_kv_block_hash(j ? h[j-1] : ex_kv_prefix_root(kv), toks + j*bs, bs);
 *   int32_t pend; int k = ex_kv_prefix_match(kv, h, toks, n_full, t.blocks, &pend, NULL);
 *   ex_kv_table_adopt(kv, &t, k);                     // t holds the k cached blocks
 *   ex_kv_table_reserve(kv, &t, n_pos);               // the rest, fresh
 *   ex_kv_table_register(kv, &t, h, toks, n_full);    // pending until ...
 *   ... forward ...; ex_kv_table_computed(kv, &t, n_cached);
 *
 * Sliding-window pools are not cached (ex_kv_prefix_enable refuses them): a cached prefix would
 * also need the sliding layers' last window of positions, which ex_kv_table_slide frees.
 *
 * One thread (the engine's step thread) uses a pool; there is no locking.
 */
#ifndef EX_KV_H
#define EX_KV_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"

typedef struct ex_kv ex_kv;

/* The KV element types (--kv-cache-dtype), the same layout for every backend. A block holds
 * block_size positions of every layer's K and V; one layer's K (or V) part of a block, with
 * B = block_size, H = n_head_kv, D = head_dim:
 *
 *   F32, F16, BF16  [B][H][D] elements
 *   F8_E4M3 ("fp8") codes [B][H][D] bytes, then scales [H][B] f32 (a head's scales of the
 *                   block's positions side by side). Position p, head h:
 *                   code = e4m3_sat(x / s) (dt_f32_to_e4m3_sat of the f32 quotient), value =
 *                   e4m3(code) * s (f32 product). s is chosen per (position, head): the
 *                   layer's static scale of head h when the checkpoint has one
 *                   (kv_cache_scheme: mdl_layer.k_scale / v_scale), else amax / 448 over
 *                   the head's D values at that position, computed when the position is
 *                   written (dt_fp8_scale; all-zero rows get s = 0 and codes 0). A position's
 *                   bytes never change after they are written, whatever else the block holds
 *                   later, so shared prefix blocks stay valid.
 *   Q8_0            [B][H][D / 32] ggml Q8_0 blocks (D a multiple of 32): cpu backend only
 *
 * Bytes of one position of one head: ex_kv_head_bytes (0: the type cannot hold this head). */
size_t ex_kv_head_bytes(int kv_type, int head_dim);
/* Parses --kv-cache-dtype: "auto" (-1: the backend's default), "f32", "f16", "fp8" (or
 * "fp8_e4m3"), "q8_0"; -2 for anything else. */
int ex_kv_type_from_name(const char *name);
/* "f32", "f16", "bf16", "fp8", "q8_0" for messages; "?" otherwise. */
const char *ex_kv_type_name(int kv_type);

/* Bytes one block takes in a backend's storage: K and V of every layer,
 * 2 * n_layer * block_size * n_head_kv * ex_kv_head_bytes(kv_type, head_dim). 0 for a bad
 * kv_type (or one that cannot hold the model's heads). */
size_t ex_kv_block_bytes(const mdl_config *c, int block_size, int kv_type);
/* The default budget when none is configured: a quarter of MemAvailable (/proc/meminfo;
 * 1 GiB when unreadable), at most `want` bytes (what the configured sequences could use)
 * and at most 16 GiB. Can't fail. */
int64_t ex_kv_default_bytes(int64_t want);
/* Blocks a device's memory budget holds: how the cuda backend sizes its pool when no explicit
 * size is given (like vLLM's gpu_memory_utilization). All sizes in bytes:
 *
 *   budget   = fraction * total - (total - free_at_start) - used
 *   n_blocks = floor(budget / block_bytes) - reserved          (0 when negative)
 *
 * total: the device's memory; free_at_start: free when the backend started (the rest belongs
 * to other processes and this process's CUDA context); used: what the backend took since
 * (weights, activations, workspaces: the drop in free memory). reserved: blocks the backend
 * allocates beside the pool (cuda: one scratch block). The caller applies its own floor and
 * cap. *budget_out (may be NULL) gets the budget, negative when the fraction is spent before
 * the pool. Can't fail. */
int64_t ex_kv_fit_blocks(int64_t total, int64_t free_at_start, int64_t used, double fraction, int64_t block_bytes,
                         int reserved, int64_t *budget_out);

/* Bytes one block of one pool takes: K and V of the full-attention layers (swa 0) or of the
 * sliding-window layers (swa 1). ex_kv_block_bytes is the sum of the two. */
size_t ex_kv_group_bytes(const mdl_config *c, int swa, int block_size, int kv_type);

/* Creates the allocator for n_blocks blocks (all free). Returns 0, CM_EINVAL or CM_ENOMEM. */
int  ex_kv_create(int n_blocks, int block_size, ex_kv **out);
/* The same with a second pool of n_swa blocks for sliding-window layers that see `window`
 * positions (n_swa 0: none, as ex_kv_create). */
int  ex_kv_create_swa(int n_blocks, int n_swa, int block_size, int window, ex_kv **out);
void ex_kv_destroy(ex_kv *kv); /* accepts NULL */

/* Blocks (free blocks) one sequence can get: the smaller pool's when there are two. Free
 * blocks include cached blocks nobody holds (ex_kv_n_cached): allocation evicts them. */
int ex_kv_n_blocks(const ex_kv *kv);
int ex_kv_n_free(const ex_kv *kv);
/* The sliding-window pool: its blocks, free blocks, window (all 0 without one). */
int ex_kv_n_blocks_swa(const ex_kv *kv);
int ex_kv_n_free_swa(const ex_kv *kv);
int ex_kv_window(const ex_kv *kv);

/* Takes one free block (reference count 1) into *block. Returns 0 or CM_ENOKV. */
int  ex_kv_block_alloc(ex_kv *kv, int32_t *block);
/* Adds a holder to an allocated block (prefix sharing), or to a computed cached block nobody
 * holds (it leaves the LRU). Asserts it is one of those. */
void ex_kv_block_ref(ex_kv *kv, int32_t block);
/* Drops a holder; the block returns to the free list at zero. Asserts it was allocated. */
void ex_kv_block_unref(ex_kv *kv, int32_t block);
/* Holders of a block (0 = free); -1 for an id outside the pool. */
int  ex_kv_block_refcount(const ex_kv *kv, int32_t block);

/* A sequence's block table: blocks[j] holds positions [j*block_size, (j+1)*block_size). */
typedef struct ex_kv_table {
    int32_t *blocks; /* [cap] */
    int      n;      /* blocks in use */
    int      cap;    /* max blocks (ceil(n_ctx / block_size)) */
    int32_t *blocks_swa; /* [cap] the sliding-window pool's blocks of the same positions; entries
                          * [0, swa_lo) were freed (-1) */
    int      swa_lo;
    /* prefix cache: blocks [0, n_reg) are the cached blocks of their keys; [0, n_done) are
     * computed. reg_off: a block of this table duplicated one already cached, so none after it
     * is registered (its parent would not be the cached one). */
    int      n_reg, n_done, reg_off;
} ex_kv_table;

/* Allocates the table's array (no blocks). Returns 0, CM_EINVAL or CM_ENOMEM. */
int  ex_kv_table_init(ex_kv_table *t, int cap);
/* Frees the array; the table must hold no blocks (release it first). Accepts zeroed tables. */
void ex_kv_table_free(ex_kv_table *t);
/* Makes the table cover positions [0, n_pos): allocates the missing blocks (in both pools),
 * all or nothing. Returns 0, CM_ENOKV (not enough free blocks; the table is unchanged) or
 * CM_ECTX (n_pos needs more than cap blocks). */
int  ex_kv_table_reserve(ex_kv *kv, ex_kv_table *t, int n_pos);
/* Blocks the table still needs to cover n_pos positions (0 when covered). */
int  ex_kv_table_need(const ex_kv *kv, const ex_kv_table *t, int n_pos);
/* Unrefs every block of the table and empties it. Can't fail. */
void ex_kv_table_release(ex_kv *kv, ex_kv_table *t);
/* The sequence's cache now holds positions [0, n_cached): frees the sliding-window blocks
 * whose positions all lie before n_cached - window + 1, the first position the next query
 * reads. Nothing without a sliding pool. Can't fail. */
void ex_kv_table_slide(ex_kv *kv, ex_kv_table *t, int n_cached);
/* ---- prefix cache (see the top of this file) ------------------------------------------ */

/* Turns the prefix cache on for the full-attention pool, with root (the model and adapter
 * identity) mixed into every block-0 key. Returns 0, CM_EUNSUPPORTED (the pool has a
 * sliding-window part), CM_ESTATE (blocks are allocated already) or CM_ENOMEM. */
int      ex_kv_prefix_enable(ex_kv *kv, uint64_t root);
int      ex_kv_prefix_enabled(const ex_kv *kv);
uint64_t ex_kv_prefix_root(const ex_kv *kv);
/* The chained hash of a full block: parent is the previous block's hash, ex_kv_prefix_root
 * for block 0. Pure; any thread. */
uint64_t ex_kv_block_hash(uint64_t parent, const int32_t *toks, int block_size);
/* The longest cached prefix of a sequence: blocks [0, n) with hashes h[] and tokens
 * toks[0 .. n*block_size). Writes the physical ids of the leading blocks that are cached and
 * computed into ids and returns how many (0 with the cache off). *pending (may be NULL): the
 * block that stopped the walk when it is cached but not computed yet (a sequence is computing
 * it: worth waiting for), else -1; *pending_gen its generation (ex_kv_prefix_pending). Reads
 * only. */
int      ex_kv_prefix_match(const ex_kv *kv, const uint64_t *h, const int32_t *toks, int n, int32_t *ids,
                            int32_t *pending, uint32_t *pending_gen);
/* 1 while block id is still the pending (cached, not computed) block of generation gen. */
int      ex_kv_prefix_pending(const ex_kv *kv, int32_t id, uint32_t gen);
/* Of ids[0..n) (cached blocks), how many sit in the LRU (no holder): taking them reduces what
 * ex_kv_n_free counts. */
int      ex_kv_prefix_idle(const ex_kv *kv, const int32_t *ids, int n);
/* The empty table t takes the cached blocks t->blocks[0..n) (from ex_kv_prefix_match): one
 * reference each, out of the LRU; n_reg = n_done = n. Returns 0 or CM_EINVAL (t not empty, a
 * block not cached and computed). */
int      ex_kv_table_adopt(ex_kv *kv, ex_kv_table *t, int n);
/* Registers t's blocks [n_reg, min(n_full, t->n)) whose tokens are toks[j*bs .. (j+1)*bs)
 * and hashes h[j], in order, as pending (computed ones as computed). Stops at a block whose
 * key is cached already (another sequence's copy: t->reg_off). Nothing with the cache off.
 * Can't fail. */
void     ex_kv_table_register(ex_kv *kv, ex_kv_table *t, const uint64_t *h, const int32_t *toks, int n_full);
/* The table's positions [0, n_cached) are computed: its registered blocks inside become
 * reusable by others. Can't fail. */
void     ex_kv_table_computed(ex_kv *kv, ex_kv_table *t, int n_cached);
/* Cached blocks without a holder (the LRU; ex_kv_n_free counts them as free). */
int      ex_kv_n_cached(const ex_kv *kv);
/* Checks the pool's invariants: every block free, in the LRU or held, exactly once; refcounts
 * match the holders; the cache's index finds every cached block. O(blocks). Returns 0 or
 * CM_ESTATE with the first broken rule in err (CM_ENOMEM). For tests. */
int      ex_kv_check(const ex_kv *kv, char *err, size_t errlen);

/* Makes dst (empty) share src's first n blocks (refcounts + 1): a forked prefix. The caller
 * copies a partly filled last block before writing to it (backend kv_copy). Returns 0,
 * CM_EINVAL (dst not empty, n out of range) or CM_ECTX. */
int  ex_kv_table_share(ex_kv *kv, const ex_kv_table *src, int n, ex_kv_table *dst);

#endif
