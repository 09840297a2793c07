// attention_fa3: causal GQA prefill attention over the paged KV cache for Hopper (sm_90a: wgmma,
// mbarriers, setmaxnreg), FlashAttention-3 style.
//
// One CTA per (tile of consecutive query tokens of one sequence, KV head), 3 warp groups:
//   - warp group 0 loads: for each key tile of FA_NK positions it copies K, then V, into a
//     ring of FA_NST stages with cp.async (16-byte pieces of the paged cache, zero past the
//     tile's last position and, with a window, before its first key), and each thread's
//     cp.async.mbarrier.arrive marks the stage full once its copies have landed. The tile's
//     cache rows (block table lookups) are computed a tile ahead, one per thread, into a small
//     ring in shared memory: a division and a block-table load per copy made the loader the
//     bottleneck (147 against 440 TFLOP/s at 8k on an H200);
//   - warp groups 1 and 2 compute 64 query rows each (row r = token r / G, head r % G of the
//     KV head's G query heads, like attention_tc.cu's prefill): S = Q K^T with wgmma
//     m64n128k16 (Q and K from shared memory), masking (causal, window) and soft-cap, online
//     softmax in the log2 domain, then O += P V with P from registers and V as an MN-major
//     ("transposed") shared operand. Each releases a stage's K as soon as S is computed and
//     its V after P V, so the loader refills while the other group still computes. A group
//     issues S of tile i with P V of tile i - 1 and runs the softmax of tile i while that P V
//     is computed (FlashAttention-3's intra-warpgroup overlap: two P register sets), and the two
//     groups take turns to issue their wgmma (named barriers 4 and 5: FlashAttention-3's
//     ping-pong), so one group's softmax runs under the other's products. (S, softmax and P V in
//     turn, and the overlap without the turns, were measured against it and removed:
//     bench/RESULTS.md, 2026-11-29, eighth session.)
// Registers: the loader gives back all but 24 (setmaxnreg), the computing groups take 240.
// Key tiles past the tile's last position are never loaded (causal skipping); a group whose
// rows all end before a key tile (or, with a window, start after it) skips its math but still
// takes part in the stage handshake.
// Persistent (unsplit launches, kc_plan.att_pf_persist): one CTA an SM; after blockIdx.x, the
// loader takes the next (tile, KV head) from a counter at an item's first key tile, reads its
// tile's tokens and publishes them to the computing groups at its last (a ring of FA_NSLOT), and
// goes on loading the next item's keys while the groups finish this one's products and output;
// the ring of stages and the ping-pong turns run on across items. The same bits as a CTA a tile.
// Split over the keys (a chunk of a long prompt: few tiles, a long context): CTAs per (tile,
// KV head, split), each on its range of whole key tiles, write their rows' partials in the
// mma.sync kernel's layout, and the last split's CTA merges them on its computing groups
// (attn_common.cuh's pf_merge, 64 rows at a time).
//
// Shared tiles use the 128-byte swizzle of the wgmma descriptors: a row of HD halves is cut
// into 64-half (128-byte) column blocks; column block c of row r sits at c * (rows * 128) +
// r * 128, with its 16-byte piece k stored at piece k ^ (r % 8). K (key rows) is the K-major
// B of Q K^T, Q the K-major A, and the same bytes of V are the MN-major B of P V.
#include "attn_common.cuh"
#include "wgmma.cuh"

extern "C" {
#include "kcuda.h"
}

namespace {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr int FA_NK = 128;     // key positions per shared tile
constexpr int FA_ROWS = 128;   // query rows per CTA: two computing warp groups of 64
constexpr int FA_NST = 3;      // K/V stages (3 x 64 KiB + Q: 225 KiB at head dim 128)
constexpr int FA_THREADS = 384;
constexpr int FA_NSLOT = 4;    // persistent launches: the ring of items the loader publishes

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA3_DEVICE_CODE 1
#endif

#ifdef FA3_DEVICE_CODE
// 2^x on the special-function unit (exp2(-inf) = 0).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// An arrival on bar once every cp.async this thread issued so far has landed (counted in the
// barrier's expected arrivals: .noinc).
__device__ __forceinline__ void mbar_cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t saddr, const void *g, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(g), "r"(valid ? 16 : 0) : "memory");
}
// D (m64n128, f32) = scale_d D + A (64 x 16, shared, K-major) B (16 x 128, shared, K-major).
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                 "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
                 "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
                 "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : KC_F8(d, 0), KC_F8(d, 8), KC_F8(d, 16), KC_F8(d, 24),
                   KC_F8(d, 32), KC_F8(d, 40), KC_F8(d, 48), KC_F8(d, 56)
                 : "l"(da), "l"(db), "r"(scale_d));
}

// P V for one 16-key step: the m64n(HD) wgmma of the head dim.
template <int HD> __device__ __forceinline__ void wgmma_pv(float (&o)[HD / 2], const uint32_t (&a)[4], uint64_t db);
template <> __device__ __forceinline__ void wgmma_pv<128>(float (&o)[64], const uint32_t (&a)[4], uint64_t db) {
    wgmma_rs<128, 1>::mma(o, a, db);
}
template <> __device__ __forceinline__ void wgmma_pv<64>(float (&o)[32], const uint32_t (&a)[4], uint64_t db) {
    wgmma_rs<64, 1>::mma(o, a, db);
}

// S = Q K^T of the group's 64 rows (their shared Q) and a key tile: the wgmma of each 16 dims
// (column block kk / 4, 32 bytes further per step inside it). Issued, not waited. The
// descriptors are the low words ql (Q) and kl (the K tile) made warp-uniform (sw128_lo,
// kc_uniform) plus each step's offset: one uniform add a wgmma. (Descriptors computed per thread
// cost 4 R2UR and 5 more instructions a wgmma, inside the turn: 84 instructions instead of 167 for
// the 16 wgmma of a key tile; bench/RESULTS.md, 2026-11-30.)
template <int HD> __device__ __forceinline__ void issue_qk(float (&sc)[64], uint32_t ql, uint32_t kl) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss_n128(sc, sw128_join(ql + (((kk / 4) * FA_ROWS * 128 + (kk % 4) * 32) >> 4), 1024),
                      sw128_join(kl + (((kk / 4) * FA_NK * 128 + (kk % 4) * 32) >> 4), 1024), kk > 0);
}
// O += P V with V the tile of low descriptor word vl: 16 keys (2 KiB of rows) per step; column
// blocks FA_NK * 128 bytes apart (the leading byte offset of an MN-major operand).
template <int HD> __device__ __forceinline__ void issue_pv(float (&o)[HD / 2], const uint32_t (&pa)[FA_NK / 16][4], uint32_t vl) {
#pragma unroll
    for (int kp = 0; kp < FA_NK / 16; kp++) wgmma_pv<HD>(o, pa[kp], sw128_join(vl + ((kp * 16 * 128) >> 4), 1024));
}

// What a thread needs to mask its two rows: the last key each sees, the last key below its
// window (-1: none), its quad lane, and the soft-cap in log2 units (0: none).
struct fa3_rows {
    int lim0, lim1, wlo0, wlo1, t4;
    float capl;
};

// One online-softmax step on the scores sc of key tile j0 (sc[4 n + c]: row g + 8 (c >> 1),
// key j0 + 8 n + 2 t4 + (c & 1)): soft-cap, masking (unless every key is visible to every
// row), the new maxima m and sums l, the factors corr that rescale O, and P as the A operand
// of P V (16 x 16 per warp and key step: keys 16 kp + 0..7 from n-tile 2 kp, 8..15 from
// 2 kp + 1).
template <bool MASK>
__device__ __forceinline__ void softmax_step(const float (&sc)[64], uint32_t (&pa)[FA_NK / 16][4], float (&corr)[2],
                                             float (&m)[2], float (&l)[2], const fa3_rows &rw, int j0) {
    // sc is only read (computed twice where capped or masked): with overlap, S's registers
    // must not be written while the P V of the same wgmma batch is in flight
    auto val = [&](int n, int c) {
        float x = sc[4 * n + c];
        if (rw.capl > 0.0f) x = rw.capl * tanhf(x / rw.capl);
        if (MASK) {
            const int key = j0 + 8 * n + 2 * rw.t4 + (c & 1);
            if (key > (c >> 1 ? rw.lim1 : rw.lim0) || key <= (c >> 1 ? rw.wlo1 : rw.wlo0)) x = -INFINITY;
        }
        return x;
    };
    float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
    for (int n = 0; n < FA_NK / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) mx[c >> 1] = fmaxf(mx[c >> 1], val(n, c));
    float mref[2], rs[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[r], mx[r]);
        // a row that has seen no key yet keeps m = -inf: subtract 0 instead, so its masked
        // scores give exp2(-inf) = 0 and its empty state stays 0
        const float ms = mn == -INFINITY ? 0.0f : mn;
        corr[r] = ex2(m[r] - ms);
        mref[r] = ms;
        m[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < FA_NK / 8; n++) {
        float p[4];
#pragma unroll
        for (int c = 0; c < 4; c++) p[c] = ex2(val(n, c) - mref[c >> 1]);
        rs[0] += p[0] + p[1];
        rs[1] += p[2] + p[3];
        pa[n >> 1][(n & 1) * 2] = kc_pack_h2(p[0], p[1]);
        pa[n >> 1][(n & 1) * 2 + 1] = kc_pack_h2(p[2], p[3]);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * corr[r] + rs[r];
}

// The step without the masking code where every row sees every key of the tile (all but the
// tiles on the causal diagonal or a window's edge): the compares and selects were as many
// instructions as the rest of the softmax.
__device__ __forceinline__ void softmax_any(const float (&sc)[64], uint32_t (&pa)[FA_NK / 16][4], float (&corr)[2],
                                            float (&m)[2], float (&l)[2], const fa3_rows &rw, int j0, bool unmasked) {
    if (unmasked) softmax_step<false>(sc, pa, corr, m, l, rw, j0);
    else softmax_step<true>(sc, pa, corr, m, l, rw, j0);
}

// O's rows (o[4 d + c]: row g + 8 (c >> 1)) scaled by corr, unless no row of the warp has a new
// maximum (every corr 1: the same bits). Past the first key tiles few rows get one: 32k prompts
// +3-7 % alone.
template <int HD> __device__ __forceinline__ void rescale(float (&o)[HD / 2], const float (&corr)[2]) {
    if (!__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) return;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        o[4 * d] *= corr[0];
        o[4 * d + 1] *= corr[0];
        o[4 * d + 2] *= corr[1];
        o[4 * d + 3] *= corr[1];
    }
}
#endif // FA3_DEVICE_CODE

template <int HD> constexpr size_t fa3_smem() {
    // 1 KiB of slack to align the tiles to the swizzle's 1,024-byte period
    return 1024 + (size_t)FA_ROWS * HD * 2 + (size_t)FA_NST * 2 * FA_NK * HD * 2;
}

// Item w of a launch: a (tile, KV head). Head-major (every tile of KV head 0, longest first, then
// head 1, ...) keeps one head's keys of a long prompt in L2 while the SMs work on them; tile-major
// (the KV heads of the longest tile first) balances launches of few tiles a head (2,048 tokens,
// 64 tiles: 84 % of the SMs' time busy head-major, 97 % tile-major, by a simulation of the
// causal costs; bench/RESULTS.md "2026-11-29 (seventeenth session)").
__device__ __forceinline__ void fa3_item(int w, int n_tiles, int n_kv, int tile_major, int &tile, int &kvh) {
    const int x = tile_major ? w / n_kv : w % n_tiles;
    kvh = tile_major ? w % n_kv : w / n_tiles;
    tile = n_tiles - 1 - x; // the backend lists tiles by position: the longest start first
}

// Item w's tile: {w, its first token t0, its token count nq, t0's position p0} and t0's sequence.
__device__ __forceinline__ int4 fa3_meta(int w, int n_tiles, int n_kv, int tile_major, const int32_t *tiles, const int32_t *pos,
                                         const int32_t *seq, int &sqn) {
    int tile, kvh;
    fa3_item(w, n_tiles, n_kv, tile_major, tile, kvh);
    const int t0 = tiles[2 * tile];
    sqn = seq[t0];
    return make_int4(w, t0, tiles[2 * tile + 1], pos[t0]);
}

// The key tiles [i_lo, n_kt) of a tile whose positions are p0 .. p_last. Sliding window: row r
// sees keys (lim - window, lim]; the tile's first row from lo0 on, so key tiles below lo0 are
// skipped and positions below it never loaded (freed blocks). Split over the keys: key tiles
// [split kchunk, (split + 1) kchunk) / FA_NK only.
struct fa3_keys {
    int lo0, i_lo, n_kt;
    __device__ fa3_keys(int p0, int p_last, int window, int split, int n_split, int kchunk) {
        lo0 = window > 0 ? max(0, p0 - window + 1) : 0;
        i_lo = max(lo0 / FA_NK, split * (kchunk / FA_NK));
        n_kt = n_split > 1 ? min(p_last / FA_NK + 1, (split + 1) * (kchunk / FA_NK)) : p_last / FA_NK + 1;
    }
};

// Persistent launches (one at a time on a device: the backend's stream): [0] the next item past
// the grid's first ones, [1] the CTAs that have finished; the last one sets both back to 0.
__device__ unsigned g_fa3_sched[2];

template <int HD>
__global__ void __launch_bounds__(FA_THREADS, 1)
fa3_pf_kernel(const float *q, const __half *qh, const __half *k_cache, const __half *v_cache, float *out, __half *out_h, const int32_t *tiles,
              int n_tiles, const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_head,
              int n_kv, int block_size, float qscale, float capl, int window, int kchunk, float *partial, int *counters,
              int persist, int tile_major) {
#ifdef FA3_DEVICE_CODE
    constexpr int TILE = FA_NK * HD * 2;    // bytes of one K (or V) stage
    constexpr int CB_Q = FA_ROWS * 128;     // bytes between 64-half column blocks of Q
    constexpr int CB_K = FA_NK * 128;       // ... of a K or V tile
    constexpr int CPR = HD / 8;             // 16-byte pieces per row
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bars[4 * FA_NST + FA_NSLOT];
    __shared__ uint32_t rows_s[2 * FA_NK]; // the loader's ring of key rows
    __shared__ int4 slot_s[FA_NSLOT];      // persistent: the items after the first (w, t0, nq, p0) ...
    __shared__ int slot_seq[FA_NSLOT];     // ... and their sequence
    const uint32_t sq = (kc_smem_addr(smem_raw) + 1023) & ~1023u, sk = sq + FA_ROWS * HD * 2, sv = sk + FA_NST * TILE;
    // per stage s: K full, V full (the loader's 128 threads arrive), K empty, V empty (the 8
    // computing warps arrive); per item slot: published (the loader's thread 0)
    const uint32_t bar0 = kc_smem_addr(bars);
    auto kfull = [&](int s) { return bar0 + 8 * s; };
    auto vfull = [&](int s) { return bar0 + 8 * (FA_NST + s); };
    auto kempty = [&](int s) { return bar0 + 8 * (2 * FA_NST + s); };
    auto vempty = [&](int s) { return bar0 + 8 * (3 * FA_NST + s); };
    auto ifull = [&](int j) { return bar0 + 8 * (4 * FA_NST + j); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < FA_NST; s++) {
            mbar_init(kfull(s), 128);
            mbar_init(vfull(s), 128);
            mbar_init(kempty(s), 8);
            mbar_init(vempty(s), 8);
        }
        for (int j = 0; j < FA_NSLOT; j++) mbar_init(ifull(j), 1);
    }
    __syncthreads();
    kc_pdl_trigger();
    kc_pdl_wait();
    const int split = blockIdx.z, n_split = gridDim.z, n_items = n_tiles * n_kv;
    const int G = n_head / n_kv;
    const int wg = kc_uniform(threadIdx.x >> 7), tid = threadIdx.x & 127;
    // The CTA's items: persistent, blockIdx.x then those the loader takes from g_fa3_sched,
    // published in slot_s (a ring of FA_NSLOT: the loader, at most FA_NST key tiles ahead, is at
    // most FA_NSLOT items ahead); else the one of blockIdx (grid n_tiles x n_kv x n_split).
    int w = persist ? (int)blockIdx.x : (int)(blockIdx.y * gridDim.x + blockIdx.x);
    int sqn;
    const int4 first = fa3_meta(w, n_tiles, n_kv, tile_major, tiles, pos, seq, sqn);
    int t0 = first.y, nq = first.z, p0 = first.w;
    // a split with no key of its tile (never persistent): the merge reads only splits below
    // p_last / kchunk + 1
    if (n_split > 1 && split * kchunk > p0 + nq - 1) return;

    if (wg == 0) { // ---- the loader
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        // this thread's pieces: rows r_in + RPP p of a tile, 16-byte piece c of each (the
        // swizzled place depends on r % 8 only, the same for all of them)
        constexpr int RPP = 128 / CPR;
        const int r_in = tid / CPR, c = tid % CPR;
        const uint32_t off = (c / 8) * CB_K + r_in * 128 + ((c % 8) ^ (r_in % 8)) * 16;
        const int lbs = __ffs(block_size) - 1, bsm = block_size - 1;
        unsigned nw = 0; // persistent: the next item (thread 0)
        for (int k = 0, gt = 0;; k++) {
            int tile, kvh;
            fa3_item(w, n_tiles, n_kv, tile_major, tile, kvh);
            const int p_last = p0 + nq - 1;
            const int32_t *bt = block_tables + (size_t)sqn * max_blocks;
            const fa3_keys ks(p0, p_last, window, split, n_split, kchunk);
            const int lo0 = ks.lo0, i_lo = ks.i_lo, n_kt = ks.n_kt;
            // Each key tile's rows in the cache (row = (block * n_kv + kvh) * block_size + offset,
            // HD halves each; ~0: outside the tile's keys), one per thread, written a tile ahead
            // into a ring of two, so the copies read shared memory, not the block table.
            auto row_of = [&](int j) -> uint32_t {
                return j <= p_last && j >= lo0 ? (uint32_t)(bt[j >> lbs] * n_kv + kvh) << lbs | (uint32_t)(j & bsm) : ~0u;
            };
            rows_s[(gt & 1) * FA_NK + tid] = row_of(i_lo * FA_NK + tid);
            asm volatile("bar.sync 3, 128;" ::: "memory");
            for (int i = i_lo; i < n_kt; i++, gt++) {
                const int s = gt % FA_NST, u = gt / FA_NST;
                const uint32_t *rows = rows_s + (gt & 1) * FA_NK;
                const uint32_t next = i + 1 < n_kt ? row_of((i + 1) * FA_NK + tid) : ~0u; // in flight during the copies
#pragma unroll
                for (int kv = 0; kv < 2; kv++) {
                    if (u > 0) mbar_wait(kv ? vempty(s) : kempty(s), (u - 1) & 1);
                    const char *src = (const char *)(kv ? v_cache : k_cache) + c * 16;
                    const uint32_t dst = (kv ? sv : sk) + s * TILE + off;
#pragma unroll
                    for (int p = 0; p < FA_NK / RPP; p++) {
                        const uint32_t row = rows[r_in + RPP * p];
                        cp_async16(dst + p * RPP * 128, src + (row != ~0u ? (size_t)row * (HD * 2) : 0), row != ~0u);
                    }
                    mbar_cp_async_arrive(kv ? vfull(s) : kfull(s));
                }
                if (persist && tid == 0) {
                    // the next item: taken at the item's first key tile, its tile's tokens and
                    // sequence read and published at its last (the loads in flight between)
                    if (i == i_lo) nw = gridDim.x + atomicAdd(g_fa3_sched, 1u);
                    if (i == n_kt - 1) {
                        int sn = 0;
                        const int4 sl = nw < (unsigned)n_items ? fa3_meta((int)nw, n_tiles, n_kv, tile_major, tiles, pos, seq, sn)
                                                               : make_int4(n_items, 0, 0, 0);
                        slot_s[k % FA_NSLOT] = sl;
                        slot_seq[k % FA_NSLOT] = sn;
                        mbar_arrive(ifull(k % FA_NSLOT));
                    }
                }
                rows_s[((gt + 1) & 1) * FA_NK + tid] = next;
                asm volatile("bar.sync 3, 128;" ::: "memory");
            }
            if (!persist) break;
            const int4 sl = slot_s[k % FA_NSLOT]; // written before the last bar.sync 3
            if (sl.x >= n_items) break;
            w = sl.x, t0 = sl.y, nq = sl.z, p0 = sl.w, sqn = slot_seq[k % FA_NSLOT];
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        if (persist && tid == 0) {
            __threadfence(); // this CTA's last take of g_fa3_sched[0] before its count
            if (atomicAdd(g_fa3_sched + 1, 1u) == gridDim.x - 1) {
                g_fa3_sched[0] = 0;
                g_fa3_sched[1] = 0;
            }
        }
        return;
    }

    // ---- the computing warp groups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int cw = wg - 1, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // this thread's rows r0 = 64 cw + 16 warp + g and r1 = r0 + 8 (token r / G of the tile)
    const int r0 = 64 * cw + 16 * warp + g, r1 = r0 + 8, i0 = r0 / G, i1 = r1 / G;
    const uint32_t qa = sq + cw * 64 * 128, ql = kc_uniform(sw128_lo(qa, 16));
    // the low descriptor words of stage s's K (Q K^T's B) and V (P V's MN-major B)
    auto k_lo = [&](int s) { return kc_uniform(sw128_lo(sk + s * TILE, 16)); };
    auto v_lo = [&](int s) { return kc_uniform(sw128_lo(sv + s * TILE, FA_NK * 128)); };
    // ping-pong turns: the group waits for its turn (barrier 4 + cw: its own 128 threads and the
    // other group's arrival), issues, then hands the turn over. Every group takes the same number
    // of turns per item (one a key tile, plus one), so the arrivals balance.
    auto turn_begin = [&]() {
        asm volatile("bar.sync %0, 256;" ::"r"(4 + cw) : "memory");
    };
    auto turn_end = [&]() {
        asm volatile("bar.arrive %0, 256;" ::"r"(5 - cw) : "memory");
    };
    if (cw == 1) asm volatile("bar.arrive 4, 256;" ::: "memory"); // group 0 goes first
    float o[HD / 2];
    float m[2], l[2];
    int tile, kvh;
    for (int k = 0, gt = 0;; k++) {
        if (k > 0) {
            mbar_wait(ifull((k - 1) % FA_NSLOT), ((k - 1) / FA_NSLOT) & 1);
            const int4 sl = slot_s[(k - 1) % FA_NSLOT];
            if (sl.x >= n_items) break;
            w = sl.x, t0 = sl.y, nq = sl.z, p0 = sl.w;
        }
        fa3_item(w, n_tiles, n_kv, tile_major, tile, kvh);
        const int h0 = kvh * G;
        const fa3_keys ks(p0, p0 + nq - 1, window, split, n_split, kchunk);
        const int i_lo = ks.i_lo, n_kt = ks.n_kt;
        // this group's 64 rows of Q, scaled by softmax scale x log2 e, as halves in shared memory
        // (every load issued before the first store); the group's products on the previous
        // item's Q are done (its last P V waited). qh: those halves as the rotation wrote them
        // (kc_rope_store_kv_pf), copied as they are.
        if (qh) {
            constexpr int QP = 64 * CPR / 128;
            uint4 qw[QP];
#pragma unroll
            for (int j = 0; j < QP; j++) {
                const int pc = tid + 128 * j, r = 64 * cw + pc / CPR, c = pc % CPR, i = r / G;
                qw[j] = i < nq ? *(const uint4 *)(qh + ((size_t)(t0 + i) * n_head + h0 + r % G) * HD + c * 8) : make_uint4(0, 0, 0, 0);
            }
            if (k > 0) wg_bar_sync(1 + cw);
#pragma unroll
            for (int j = 0; j < QP; j++) {
                const int pc = tid + 128 * j, r = 64 * cw + pc / CPR, c = pc % CPR;
                const uint32_t dst = sq + (c / 8) * CB_Q + r * 128 + ((c % 8) ^ (r % 8)) * 16;
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(qw[j].x), "r"(qw[j].y), "r"(qw[j].z),
                             "r"(qw[j].w) : "memory");
            }
        } else {
            constexpr int QP = 64 * CPR / 128;
            float4 qv[2 * QP];
#pragma unroll
            for (int j = 0; j < QP; j++) {
                const int pc = tid + 128 * j, r = 64 * cw + pc / CPR, c = pc % CPR, i = r / G;
                const float *src = q + ((size_t)(t0 + i) * n_head + h0 + r % G) * HD + c * 8;
                qv[2 * j] = i < nq ? *(const float4 *)src : make_float4(0, 0, 0, 0);
                qv[2 * j + 1] = i < nq ? *(const float4 *)(src + 4) : make_float4(0, 0, 0, 0);
            }
            if (k > 0) wg_bar_sync(1 + cw);
#pragma unroll
            for (int j = 0; j < QP; j++) {
                const int pc = tid + 128 * j, r = 64 * cw + pc / CPR, c = pc % CPR;
                const float4 a = qv[2 * j], b = qv[2 * j + 1];
                const uint4 v = make_uint4(kc_pack_h2(a.x * qscale, a.y * qscale), kc_pack_h2(a.z * qscale, a.w * qscale),
                                           kc_pack_h2(b.x * qscale, b.y * qscale), kc_pack_h2(b.z * qscale, b.w * qscale));
                const uint32_t dst = sq + (c / 8) * CB_Q + r * 128 + ((c % 8) ^ (r % 8)) * 16;
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
            }
        }
        fence_proxy_async();
        wg_bar_sync(1 + cw);

        const int lim0 = p0 + i0, lim1 = p0 + i1; // the last key each row sees
        const int wlo0 = window > 0 ? lim0 - window : -1, wlo1 = window > 0 ? lim1 - window : -1;
        const bool live = (64 * cw) / G < nq;
        const int w_lo = p0 + (64 * cw) / G, w_hi = p0 + min((64 * cw + 63) / G, nq - 1);
#pragma unroll
        for (int d = 0; d < HD / 2; d++) o[d] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;

        const fa3_rows rw = { lim0, lim1, wlo0, wlo1, t4, capl };
        // every row of the group sees every key of tile i: no masking
        auto unmasked = [&](int i) {
            const int j0 = i * FA_NK;
            return j0 + FA_NK - 1 <= w_lo && (window <= 0 || j0 > w_hi - window);
        };
        // stage and use of the item's key tile i (the ring's count goes on over the items)
        auto st_of = [&](int i) { return (gt + i - i_lo) % FA_NST; };
        auto use_of = [&](int i) { return (gt + i - i_lo) / FA_NST; };
        // a tile this group skips: its stages are released in turn, each after it filled (so that
        // the arrival counts for this use of the stage, not the previous one), and its turn taken
        auto pass = [&](int s, int u) {
            mbar_wait(kfull(s), u & 1);
            if (lane == 0) mbar_arrive(kempty(s));
            mbar_wait(vfull(s), u & 1);
            if (lane == 0) mbar_arrive(vempty(s));
            turn_begin();
            turn_end();
        };
        float sc[64];
        uint32_t pa[FA_NK / 16][4];
        float corr[2];
        // O += P V of the tile in stage s, use u, then its V released
        auto pv_step = [&](int s, int u) {
            mbar_wait(vfull(s), u & 1);
            fence_proxy_async();
            reg_fence(o);
            reg_fence(pa);
            turn_begin();
            wg_fence();
            issue_pv<HD>(o, pa, v_lo(s));
            wg_commit();
            turn_end();
            wg_wait<0>();
            reg_fence(o);
            reg_fence(pa);
            if (lane == 0) mbar_arrive(vempty(s));
        };
        {
            // FlashAttention-3's overlap within the group: S of tile i and P V of tile i - 1 are
            // issued together; the softmax of tile i runs while P V of tile i - 1 is computed.
            // The tiles the group computes on are a range [a_lo, a_hi] (causal end, window start);
            // no wgmma sits in a branch inside it (ptxas serializes wgmma on divergent paths).
            const int x = w_lo - window + 1; // the first key the group's first row sees (window)
            const int a_lo = window > 0 && x > 0 ? max(i_lo, x / FA_NK) : i_lo;
            const int a_hi = live ? min(n_kt - 1, w_hi / FA_NK) : i_lo - 1;
            for (int i = i_lo; i < min(a_lo, n_kt); i++) pass(st_of(i), use_of(i));
            if (a_lo <= a_hi) {
                int s = st_of(a_lo), u = use_of(a_lo);
                mbar_wait(kfull(s), u & 1);
                fence_proxy_async();
                reg_fence(sc);
                turn_begin();
                wg_fence();
                issue_qk<HD>(sc, ql, k_lo(s));
                wg_commit();
                turn_end();
                wg_wait<0>();
                reg_fence(sc);
                if (lane == 0) mbar_arrive(kempty(s));
                softmax_any(sc, pa, corr, m, l, rw, a_lo * FA_NK, unmasked(a_lo)); // O is 0: no rescale
                // tile i: S = Q K_i^T and O += P_{i-1} V_{i-1} (P_{i-1} in pin, of the stage s, use
                // u), then the softmax of tile i into pout. P alternates between pa and pb (a copy
                // inside the loop makes ptxas serialize the wgmma).
                uint32_t pb[FA_NK / 16][4];
                auto overlap_step = [&](int i, uint32_t(&pin)[FA_NK / 16][4], uint32_t(&pout)[FA_NK / 16][4]) {
                    const int sn = st_of(i), un = use_of(i);
                    mbar_wait(kfull(sn), un & 1);
                    mbar_wait(vfull(s), u & 1);
                    fence_proxy_async();
                    reg_fence(sc);
                    reg_fence(o);
                    reg_fence(pin);
                    turn_begin();
                    wg_fence();
                    issue_qk<HD>(sc, ql, k_lo(sn));
                    wg_commit();
                    issue_pv<HD>(o, pin, v_lo(s));
                    wg_commit();
                    turn_end();
                    wg_wait<1>(); // S done, P V may still run
                    reg_fence(sc);
                    if (lane == 0) mbar_arrive(kempty(sn));
                    softmax_any(sc, pout, corr, m, l, rw, i * FA_NK, unmasked(i));
                    wg_wait<0>();
                    reg_fence(o);
                    reg_fence(pin);
                    if (lane == 0) mbar_arrive(vempty(s));
                    rescale<HD>(o, corr);
                    s = sn;
                    u = un;
                };
                int i = a_lo + 1;
                for (; i < a_hi; i += 2) {
                    overlap_step(i, pa, pb);
                    overlap_step(i + 1, pb, pa);
                }
                if (i == a_hi) { // an odd count: the last P into pa for pv_step
                    overlap_step(i, pa, pb);
#pragma unroll
                    for (int kp = 0; kp < FA_NK / 16; kp++)
#pragma unroll
                        for (int c = 0; c < 4; c++) pa[kp][c] = pb[kp][c];
                }
                pv_step(s, u);
            } else { // no final P V: the turn it would have taken
                turn_begin();
                turn_end();
            }
            for (int i = max(a_hi + 1, a_lo); i < n_kt; i++) pass(st_of(i), use_of(i));
        }
        gt += n_kt - i_lo;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        if (n_split > 1) break; // the split's partials: below (never persistent)
        // o[4 d + c]: row (c >> 1 ? g + 8 : g), dims 8 d + 2 t4 + (c & 1)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const int r = hi ? r1 : r0, i = hi ? i1 : i0;
            if (i >= nq) continue;
            const float il = l[hi] > 0.0f ? 1.0f / l[hi] : 0.0f;
            const size_t at = ((size_t)(t0 + i) * n_head + h0 + r % G) * HD + 2 * t4;
            if (out_h) { // as half, rounded from the f32 values below (what wo's conversion of them gives)
#pragma unroll
                for (int d = 0; d < HD / 8; d++)
                    *(__half2 *)(out_h + at + d * 8) = __floats2half2_rn(o[4 * d + 2 * hi] * il, o[4 * d + 2 * hi + 1] * il);
                continue;
            }
#pragma unroll
            for (int d = 0; d < HD / 8; d++)
                *(float2 *)(out + at + d * 8) = make_float2(o[4 * d + 2 * hi] * il, o[4 * d + 2 * hi + 1] * il);
        }
        if (!persist) break;
    }
    if (cw == 0) asm volatile("bar.sync 4, 256;" ::: "memory"); // group 1's last hand-over
    if (n_split == 1) return;
    // split: the rows' partials (natural-log maximum, sum, unnormalized output) in the layout of
    // the mma.sync kernel's, then the last split's CTA merges them on the two computing groups
    // (the loader has exited: named barrier 6 of their 256 threads; the stages hold the merge's
    // scratch, every copy into them having landed)
    const int p_last = p0 + nq - 1, h0 = kvh * G;
    float *pp = partial + (size_t)(tile * n_kv + kvh) * FA_ROWS * n_split * (HD + 2);
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
        const int r = hi ? r1 : r0, i = hi ? i1 : i0;
        if (i >= nq) continue;
        float *ps = pp + ((size_t)r * n_split + split) * (HD + 2);
        if (t4 == 0) {
            ps[0] = m[hi] * LN2;
            ps[1] = l[hi];
        }
#pragma unroll
        for (int d = 0; d < HD / 8; d++) *(float2 *)(ps + 2 + d * 8 + 2 * t4) = make_float2(o[4 * d + 2 * hi], o[4 * d + 2 * hi + 1]);
    }
    const att_group grp = { 6, 128, 256 };
    const int n_valid = min(n_split, p_last / kchunk + 1);
    if (!att_last_split(counters + (size_t)tile * n_kv + kvh, n_valid, grp)) return;
    fence_proxy_async(); // the stages were last read by wgmma (the async proxy)
    // 64 rows at a time: all 128 took more registers than the computing groups have (spills)
    const int n_rows = min(FA_ROWS, nq * G);
    for (int r0m = 0; r0m < n_rows; r0m += 64) {
        if (r0m) grp.sync(); // the first half's weights are read until here
        pf_merge<HD, 64, 256>(pp + (size_t)r0m * n_split * (HD + 2), n_split, n_valid, min(64, n_rows - r0m), G,
                              out + ((size_t)(t0 + r0m / G) * n_head + h0) * HD, n_head,
                              (float *)(smem_raw + (sk - kc_smem_addr(smem_raw))), grp);
    }
#elif defined(__CUDA_ARCH__)
    __trap(); // built without sm_90a code: kc_attention_fa3_ok refuses every shape
#endif
}

template <int HD>
int launch_fa3(const float *q, const kc_half *qh, const kc_half *k, const kc_half *v, float *out, kc_half *out_h,
               const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq, const int32_t *bt, int max_blocks,
               int n_head, int n_kv, int bs, float qscale, int n_split, int kchunk, float *partial, int *counters, cudaStream_t s) {
    static unsigned char configured[64];
    constexpr size_t smem = fa3_smem<HD>();
    if (int rc = kc_smem_limit_once(fa3_pf_kernel<HD>, (int)smem, configured, __FILE__, __LINE__)) return rc;
    const kc_attn_mods mods = kc_attention_mods_get();
    const kc_plan *pl = kc_plan_get();
    // unsplit launches: persistent on one CTA an SM (att_pf_fa3_ctas) where the plan says so;
    // tile-major where the items are at most four waves
    const int ctas = pl->att_pf_fa3_ctas, n_items = n_tiles * n_kv;
    const int persist = n_split == 1 && pl->att_pf_persist && ctas > 0 && n_items > ctas;
    const int tile_major = n_split == 1 && ctas > 0 && n_items <= 4 * ctas;
    const dim3 grid = persist ? dim3(ctas) : dim3(n_tiles, n_kv, n_split);
    kc_launch(fa3_pf_kernel<HD>, grid, dim3(FA_THREADS), smem, s, q, (const __half *)qh, (const __half *)k,
              (const __half *)v, out, (__half *)out_h,
              tiles, n_tiles, pos, seq, bt, max_blocks, n_head, n_kv, bs, qscale,
              mods.softcap > 0.0f ? mods.softcap * LOG2E : 0.0f, mods.window, kchunk, partial, counters, persist, tile_major);
    return 0;
}

// Whether this build holds sm_90a code for the kernel and the device runs it (compute
// capability 9.0 exactly: sm_90a code runs nowhere else). Cached per device.
bool fa3_device_ok() {
    static signed char ok[64];
    return sm90a_kernel_ok(fa3_pf_kernel<128>, ok);
}

} // namespace

extern "C" int kc_attention_fa3_ok(int hd, int n_head, int n_kv, int block_size) {
    return (hd == 64 || hd == 128) && n_kv > 0 && n_head % n_kv == 0 && n_head / n_kv <= 16 && block_size >= 16 &&
           (block_size & (block_size - 1)) == 0 &&
           fa3_device_ok();
}

extern "C" float kc_attention_fa3_qscale(float scale) { return scale * LOG2E; }

extern "C" int kc_attention_fa3_tile_tok(int n_head, int n_kv) {
    if (n_kv <= 0 || n_head % n_kv || n_head / n_kv > FA_ROWS) return 0;
    return FA_ROWS / (n_head / n_kv);
}

// The launchers' one body: f32 output (out) or half (out_h, unsplit steps only), one of them.
static int prefill_fa3(const float *q, const kc_half *q_half, const kc_half *k_cache, const kc_half *v_cache, float *out,
                       kc_half *out_h, const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                       const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size, float scale,
                       int n_split, int kchunk, float *partial, int *counters, cudaStream_t s) {
    if ((!q && !q_half) || !k_cache || !v_cache || !out == !out_h || !tiles || !pos || !seq || !block_tables || n_tiles <= 0 ||
        n_split < 1 || n_split > KC_PF_MAX_SPLIT || (out_h && n_split > 1) ||
        (n_split > 1 && (!partial || !counters || kchunk <= 0 || kchunk % FA_NK)) ||
        !kc_attention_fa3_ok(hd, n_head, n_kv, block_size))
        return CM_EINVAL;
    auto *f = hd == 64 ? launch_fa3<64> : launch_fa3<128>;
    if (int rc = f(q, q_half, k_cache, v_cache, out, out_h, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head, n_kv,
                   block_size, kc_attention_fa3_qscale(scale), n_split, n_split > 1 ? kchunk : 0, partial, counters, s))
        return rc;
    KC_LAUNCH_CHECK();
}

extern "C" int kc_attention_prefill_fa3_split(const float *q, const kc_half *q_half, const kc_half *k_cache,
                                              const kc_half *v_cache, float *out, const int32_t *tiles, int n_tiles,
                                              const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                                              int n_head, int n_kv, int hd, int block_size, float scale, int n_split, int kchunk,
                                              float *partial, int *counters, cudaStream_t s) {
    if (!out) return CM_EINVAL;
    return prefill_fa3(q, q_half, k_cache, v_cache, out, nullptr, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                       n_kv, hd, block_size, scale, n_split, kchunk, partial, counters, s);
}

extern "C" int kc_attention_prefill_fa3_half(const float *q, const kc_half *q_half, const kc_half *k_cache,
                                             const kc_half *v_cache, kc_half *out_h, const int32_t *tiles, int n_tiles,
                                             const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                                             int n_head, int n_kv, int hd, int block_size, float scale, cudaStream_t s) {
    if (!out_h) return CM_EINVAL;
    return prefill_fa3(q, q_half, k_cache, v_cache, nullptr, out_h, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                       n_kv, hd, block_size, scale, 1, 0, nullptr, nullptr, s);
}

extern "C" int kc_attention_prefill_fa3(const float *q, const kc_half *q_half, const kc_half *k_cache, const kc_half *v_cache,
                                        float *out, const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                        const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                                        float scale, cudaStream_t s) {
    return kc_attention_prefill_fa3_split(q, q_half, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks,
                                          n_head, n_kv, hd, block_size, scale, 1, 0, nullptr, nullptr, s);
}
