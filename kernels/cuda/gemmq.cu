// gemmq: quantized weights (every type kc_weight_is_quant takes) times half activations on tensor cores, for
// token counts past the GEMV's (prefill chunks, large decode batches). The weights are read
// in their kc_weight layout and dequantized in registers straight into the mma fragments:
// no dequantized copy of the matrix is written anywhere.
//
// Work split: a CTA owns BM = 16 MT WM output rows and BN tokens; its WM x WK warps each own
// 16 MT rows, and the K range is split over the WK warps of a row group by steps of BK = 128
// (warp kw takes steps kw, kw + WK, ...); their partial sums are added in a fixed order at the
// end. Within a step, lane quad q owns 32 of the 128 elements (one block of the 32-element types,
// or half of a K-quant quarter) and feeds them to 8 m16n8k16 MMAs in an order of its choice: the logical k
// of an MMA operand pair is mapped to the same physical element for the weights (A, from
// registers) and the activations (B, read from a shared-memory tile stored in that order),
// so the dot product is unchanged. The activation tile is double-buffered with cp.async;
// the next step's weights are loaded into registers while this step's are multiplied.
//
// The summation order of an output depends on WK and n_in only (not on BN, BM or where the
// token sits in the batch), so a configuration of fixed WK is batch-invariant.
//
// On Hopper (sm_90a code, compute capability 9.0) configurations NCFG.. are gemmq_wg.cu's wgmma
// tiles, which the choice below prefers past KC_GEMV_MAX_TOK tokens; these mma.sync tiles stay
// for the other GPUs, the grouped MoE form and a plan with gemmq_wg=0.
#include "gemmq_types.cuh"

#include <limits.h>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

KC_TRACE_TU(gemmq)

namespace {

constexpr int XROW = BK * 2 + 32;   // bytes per token of the activation tile (padded: no bank conflicts)

// The grouped form (mixture of experts, kc_moe_gemmq): W stacks n_exp matrices of n_out rows;
// the tokens of a CTA are BN entries of one expert (kc_moe_route's grouping), each reading row
// entry / x_div of x and writing row entry of y.
struct moe_group {
    const int32_t *cnt, *off, *list;
    int n_exp, x_div;
};

// The CTA's expert and tile: the i-th BN-entry tile over the experts in order (e = -1: fewer).
template <int BN>
__device__ __forceinline__ void moe_tile(const moe_group &mg, int i, int &e_out, int &tile_out) {
    __shared__ int s_e, s_t;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int seen = 0, e = -1, tile = 0;
        for (int base = 0; base < mg.n_exp && e < 0; base += 32) {
            const int j = base + lane;
            const int nt = j < mg.n_exp ? (mg.cnt[j] + BN - 1) / BN : 0;
            int v = nt; // inclusive prefix of the tiles
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(0xffffffffu, v, o);
                if (lane >= o) v += u;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, i < seen + v && i >= seen + v - nt);
            if (hit) {
                const int l = __ffs(hit) - 1;
                e = base + l;
                tile = i - seen - (__shfl_sync(0xffffffffu, v, l) - __shfl_sync(0xffffffffu, nt, l));
            }
            seen += __shfl_sync(0xffffffffu, v, 31);
        }
        if (lane == 0) {
            s_e = e;
            s_t = tile;
        }
    }
    __syncthreads();
    e_out = s_e;
    tile_out = s_t;
}

template <int TYPE, int WM, int WK, int BN, int MT, bool GROUPED = false>
__global__ void __launch_bounds__(WM * WK * 32)
gemmq_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ D, const __half *x, float *y, int n_in,
             int n_out, int ldy, int n_tok, int accumulate, moe_group mg) {
    KC_TRACE_SCOPE(KC_TR_GEMMQ);
    typedef qt<TYPE> T;
    constexpr int NT = BN / 8, NTHR = WM * WK * 32, BM = 16 * MT * WM;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp % WM, kw = warp / WM, g = lane >> 2, q = lane & 3;
    // rows of this thread: row_a + 8 r, r < 2 MT (MMA m of r / 2, its rows g and g + 8)
    const int row_a = blockIdx.x * BM + 16 * MT * wm + g;
    const int nsteps = n_in / BK, niter = (nsteps + WK - 1) / WK;
    size_t rows[2 * MT];
    typename T::raw a[2 * MT], b[2 * MT];
    int n0 = blockIdx.y * BN;
    __shared__ int s_xrow[GROUPED ? BN : 1], s_ent[GROUPED ? BN : 1]; // grouped: x row and entry of each token slot
    if constexpr (GROUPED) { // the expert and its entries come from the kernels before: wait first
        kc_pdl_wait();
        int e, tile;
        moe_tile<BN>(mg, blockIdx.y, e, tile);
        if (e < 0) return;
        const int ne = mg.cnt[e], o = mg.off[e];
        n0 = tile * BN;
        n_tok = n0 + min(BN, ne - n0); // the slots past the expert's entries are not stored
        for (int t = threadIdx.x; t < BN; t += NTHR) {
            const int ent = mg.list[o + min(n0 + t, ne - 1)];
            s_ent[t] = ent;
            s_xrow[t] = ent / mg.x_div;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) rows[r] = (size_t)e * n_out + min(row_a + 8 * r, n_out - 1);
        if (kw < nsteps)
#pragma unroll
            for (int r = 0; r < 2 * MT; r++) T::load(a[r], W, D, rows[r], n_in, kw, q);
    } else {
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) rows[r] = (size_t)min(row_a + 8 * r, n_out - 1);
        // the first step's weights stream in before the wait (nothing in the stream writes them)
        if (kw < nsteps)
#pragma unroll
            for (int r = 0; r < 2 * MT; r++) T::load(a[r], W, D, rows[r], n_in, kw, q);
        kc_pdl_wait();
    }

    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    constexpr int TILE = WK * BN * XROW; // bytes of one buffer
    auto load_x = [&](int it, int buf) {
        for (int p = threadIdx.x; p < WK * BN * 32; p += NTHR) {
            const int k = p / (BN * 32), t = (p / 32) % BN, slot = p % 32; // slot = 4 e4 + quad
            const int ks = it * WK + k;
            if (ks >= nsteps) continue;
            const size_t xr = GROUPED ? (size_t)s_xrow[t] : (size_t)min(n0 + t, n_tok - 1);
            const __half *src = x + xr * n_in + T::xoff(ks, slot & 3, slot >> 2);
            kc_cp_async8(sbase + buf * TILE + (k * BN + t) * XROW + slot * 8, src);
        }
        kc_cp_async_commit();
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < NT; n++) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;

    load_x(0, 0);
    for (int it = 0; it < niter; it++) {
        if (it + 1 < niter) {
            load_x(it + 1, (it + 1) & 1);
            kc_cp_async_wait<1>();
        } else {
            kc_cp_async_wait<0>();
        }
        __syncthreads();
        const int ks = it * WK + kw;
        if (ks + WK < nsteps) // next step's weights in flight during this one
#pragma unroll
            for (int r = 0; r < 2 * MT; r++) T::load(b[r], W, D, rows[r], n_in, ks + WK, q);
        if (ks < nsteps) {
            const uint8_t *xs = smem + (it & 1) * TILE + (kw * BN + g) * XROW + q * 8;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t f[MT][4];
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    T::pairs(a[2 * m], i, f[m][0], f[m][2]);
                    T::pairs(a[2 * m + 1], i, f[m][1], f[m][3]);
                }
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint2 v = *(const uint2 *)(xs + n * 8 * XROW + i * 32);
#pragma unroll
                    for (int m = 0; m < MT; m++) kc_mma16816(acc[m][n], f[m], v.x, v.y);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) a[r] = b[r];
        __syncthreads();
    }

    // the next kernel's CTAs may start now: before, they would sit on SM slots this grid uses
    kc_pdl_trigger();
    // partial sums of the K split, added in warp order
    if (WK > 1) {
        float *red = (float *)smem;
        constexpr int PER_WARP = MT * NT * 32 * 4; // floats
        if (kw > 0) {
            float *o = red + (size_t)((kw - 1) * WM + wm) * PER_WARP + lane * 4;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int n = 0; n < NT; n++)
                    *(float4 *)(o + (m * NT + n) * 128) = make_float4(acc[m][n][0], acc[m][n][1], acc[m][n][2], acc[m][n][3]);
        }
        __syncthreads();
        if (kw > 0) return;
        for (int k = 1; k < WK; k++) {
            const float *o = red + (size_t)((k - 1) * WM + wm) * PER_WARP + lane * 4;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const float4 v = *(const float4 *)(o + (m * NT + n) * 128);
                    acc[m][n][0] += v.x; acc[m][n][1] += v.y; acc[m][n][2] += v.z; acc[m][n][3] += v.w;
                }
        }
    }
    // c0, c1: row g, tokens 2q, 2q + 1; c2, c3: row g + 8. y's old values (accumulate) all
    // loaded before the first store: interleaved through the one pointer, each waited a round trip
    auto yp = [&](int m, int n, int c) -> float * {
        const int row = row_a + 16 * m + (c >> 1) * 8, tok = n0 + n * 8 + 2 * q + (c & 1);
        if (row >= n_out || tok >= n_tok) return nullptr;
        return y + (size_t)(GROUPED ? s_ent[n * 8 + 2 * q + (c & 1)] : tok) * ldy + row;
    };
    auto each = [&](auto f) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) f(m, n, c);
    };
    if (accumulate)
        each([&](int m, int n, int c) {
            if (const float *p = yp(m, n, c)) acc[m][n][c] += *p;
        });
    each([&](int m, int n, int c) {
        if (float *p = yp(m, n, c)) *p = acc[m][n][c];
    });
}

// Dense: n_tok tokens of x, w->n_out rows. Grouped (mg != NULL): n_tok k entries over mg->n_exp
// experts of w->n_out / n_exp rows each, y rows of ldy = that row count.
template <int TYPE, int WM, int WK, int BN, int MT, bool GROUPED = false>
int launch(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, cudaStream_t s,
           const moe_group *mg = nullptr, int n_ent = 0) {
    const size_t tile = (size_t)WK * BN * XROW * 2;
    const size_t red = (size_t)(WK - 1) * WM * MT * (BN / 8) * 32 * 4 * 4;
    const size_t smem = tile > red ? tile : red;
    static unsigned char smem_set[64];
    if (smem > 48 * 1024)
        if (int rc = kc_smem_limit_once(gemmq_kernel<TYPE, WM, WK, BN, MT, GROUPED>, (int)smem, smem_set, __FILE__, __LINE__)) return rc;
    const int n_out = GROUPED ? w->n_out / mg->n_exp : w->n_out;
    // grouped: at most n_ent / BN full tiles plus one partial tile per chosen expert
    const int tiles = GROUPED ? n_ent / BN + min(mg->n_exp, n_ent) : (n_tok + BN - 1) / BN;
    dim3 grid((n_out + 16 * MT * WM - 1) / (16 * MT * WM), tiles), block(WM * WK * 32);
    kc_launch(gemmq_kernel<TYPE, WM, WK, BN, MT, GROUPED>, grid, block, smem, s, (const uint8_t *)w->data, (const kc_half *)w->d,
              x, y, w->n_in, n_out, ldy, n_tok, acc, mg ? *mg : moe_group{});
    KC_LAUNCH_CHECK();
}

// Tile configurations (warps over rows x over K, tokens, MMA rows per warp / 16). Chosen per
// token count from gpu_bench_gemmq on an H100 (bench/RESULTS.md).
constexpr int NCFG = 11;
template <int TYPE>
int dispatch(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, cudaStream_t s, int cfg) {
    switch (cfg) {
    case 0: return launch<TYPE, 2, 4, 16, 1>(w, x, n_tok, y, ldy, acc, s);
    case 1: return launch<TYPE, 2, 4, 32, 1>(w, x, n_tok, y, ldy, acc, s);
    case 2: return launch<TYPE, 4, 2, 64, 1>(w, x, n_tok, y, ldy, acc, s);
    case 3: return launch<TYPE, 8, 1, 64, 1>(w, x, n_tok, y, ldy, acc, s);
    case 4: return launch<TYPE, 4, 1, 128, 1>(w, x, n_tok, y, ldy, acc, s);
    case 5: return launch<TYPE, 4, 1, 64, 2>(w, x, n_tok, y, ldy, acc, s);
    case 6: return launch<TYPE, 4, 2, 32, 2>(w, x, n_tok, y, ldy, acc, s);
    case 7: return launch<TYPE, 1, 8, 16, 2>(w, x, n_tok, y, ldy, acc, s);
    case 8: return launch<TYPE, 2, 8, 16, 1>(w, x, n_tok, y, ldy, acc, s);
    case 9: return launch<TYPE, 2, 8, 8, 1>(w, x, n_tok, y, ldy, acc, s);
    default: return launch<TYPE, 4, 4, 16, 1>(w, x, n_tok, y, ldy, acc, s);
    }
}

// Grouped: four of the configurations, by the entries an expert has on average (tiles of 8, 16,
// 32, 64 entries); each keeps WK fixed for its tile, so an entry's sum order depends on the choice.
template <int TYPE>
int dispatch_moe(const kc_weight *w, const __half *x, float *y, const moe_group &mg, int n_ent, int per_exp, cudaStream_t s) {
    const int ldy = w->n_out / mg.n_exp;
    if (per_exp <= 8) return launch<TYPE, 2, 8, 8, 1, true>(w, x, 0, y, ldy, 0, s, &mg, n_ent);
    if (per_exp <= 16) return launch<TYPE, 2, 8, 16, 1, true>(w, x, 0, y, ldy, 0, s, &mg, n_ent);
    if (per_exp <= 32) return launch<TYPE, 4, 2, 32, 2, true>(w, x, 0, y, ldy, 0, s, &mg, n_ent);
    return launch<TYPE, 4, 2, 64, 1, true>(w, x, 0, y, ldy, 0, s, &mg, n_ent);
}

} // namespace

extern "C" int kc_moe_gemmq(const kc_weight *W, int n_exp, const kc_half *x, int x_div, const int32_t *cnt, const int32_t *off,
                            const int32_t *list, int n_tok, int k, float *y, cudaStream_t s) {
    if (!W || !x || !cnt || !off || !list || !y || n_exp <= 0 || x_div <= 0 || n_tok <= 0 || k <= 0 || W->n_out % n_exp ||
        W->type == KC_WEIGHT_MIXED || !kc_gemmq_ok(W))
        return CM_EINVAL;
    const int n_ent = n_tok * k, per_exp = (n_ent + min(n_exp, n_ent) - 1) / min(n_exp, n_ent);
    const moe_group mg = { cnt, off, list, n_exp, x_div };
    const __half *xh = (const __half *)x;
    switch (W->type) {
    case DT_Q8_0: return dispatch_moe<DT_Q8_0>(W, xh, y, mg, n_ent, per_exp, s);
    case DT_Q4_0: return dispatch_moe<DT_Q4_0>(W, xh, y, mg, n_ent, per_exp, s);
    case DT_Q4_1: return dispatch_moe<DT_Q4_1>(W, xh, y, mg, n_ent, per_exp, s);
    case DT_Q5_0: return dispatch_moe<DT_Q5_0>(W, xh, y, mg, n_ent, per_exp, s);
    case DT_Q5_1: return dispatch_moe<DT_Q5_1>(W, xh, y, mg, n_ent, per_exp, s);
    case DT_Q4_K: return dispatch_moe<DT_Q4_K>(W, xh, y, mg, n_ent, per_exp, s);
    case DT_Q5_K: return dispatch_moe<DT_Q5_K>(W, xh, y, mg, n_ent, per_exp, s);
    case DT_Q6_K: return dispatch_moe<DT_Q6_K>(W, xh, y, mg, n_ent, per_exp, s);
    default: return CM_EUNSUPPORTED;
    }
}

extern "C" int kc_gemmq_ok(const kc_weight *w) {
    if (!kc_code_sm80()) return 0; // mma.sync / cp.async
    switch (w->type) {
    case DT_F16: return kc_plan_get()->gemmq_wg && kc__gemmq_wg_ncfg() > 0 && w->n_in % BK == 0; // wgmma only
    case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: return w->n_in % 256 == 0;
    case DT_Q8_0: case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: return w->n_in % BK == 0;
    case KC_WEIGHT_MIXED:
        for (int i = 0; i < w->n_parts; i++) {
            const kc_weight v = kc_weight_part_view(w, i);
            if (!kc_gemmq_ok(&v)) return 0;
        }
        return w->n_parts > 0;
    default: return 0;
    }
}

// The mma.sync configurations, then gemmq_wg.cu's where the device runs them.
extern "C" int kc_gemmq_ncfg(void) { return NCFG + kc__gemmq_wg_ncfg(); }

// F16 weights: gemmq_wg.cu's F16 tiles (dispatch_wg_f16's configurations) where they ran faster
// than cuBLAS, in the layer bench (gpu_bench_gemmq f16: llama3-8b matrices, the conversion of x
// included on cuBLAS's side, the tiles reading the producer's image) and in whole steps: at 33-64
// tokens qkv (19.1 against 20.1 us) and down (39.6 against 43.2), at 65-128 gate|up (73.2 against
// 73.9; its epilogue then computes the gated activation, kc_matmul_glu). cuBLAS for the rest: at
// 9-32 tokens the tiles won wo, down and qkv alone (13.0 against 20.1 us for wo) but lost whole
// steps (16 sequences 5.156 against 5.085 ms), gate|up at 9-64 tokens (62.9 against 66.6 at 16),
// wo at 33-128, everything past 128 tokens (a layer at 256 in 214 against 372 us) and the output
// matrix (not measured) (H200, bench/RESULTS.md "2026-11-29 (fourteenth session)"). -1: cuBLAS.
extern "C" int kc__gemmq_f16_cfg(int n_tok, int n_out, int n_in) {
    if (n_tok <= 32 || n_tok > 128 || n_out > 32768) return -1;
    const int wide = n_out >= 8192 ? 2 : n_out > 4096 ? 1 : 0; // gate|up; qkv (GQA); wo, down
    if (n_tok <= 64) return wide == 2 ? -1 : wide ? 1 : n_in > 8192 ? 0 : -1;
    return wide == 2 ? 2 : -1;
}

// From gpu_bench_gemmq (H100, llama2-7b layer, bench/RESULTS.md "2026-11-24 (gemmq)"): the
// fastest configuration per token count. Without the wgmma tiles, past the plan's gemmq_max_tok
// dequantizing into a half copy for cuBLAS wins (its tensor-core GEMM outruns these mma.sync
// tiles, and the copy's cost is spread over many tokens); the configurations chosen above 64
// tokens serve larger plan limits. With them (plan.cu) there is no limit.
// Q4_1, Q5_0 and Q5_1 take Q4_0's choices, Q5_K and Q6_K Q4_K's (not measured yet).
static int gemmq_choose(int type, int n_tok, int n_out, int n_in) {
    if (type == DT_F16) return NCFG + kc__gemmq_f16_cfg(n_tok, n_out, n_in); // NCFG - 1: cuBLAS
    const bool k_quant = type == DT_Q4_K || type == DT_Q5_K || type == DT_Q6_K;
    // wgmma (gemmq_wg.cu) past the GEMV's token counts: wide matrices on 128-row CTAs, narrow
    // ones (wo, down) on clusters of 64-row CTAs that split K. H200, llama2-7b layer, through
    // kc_matmul (x written in the tiles' order): Q4_0 at 16 / 32 / 64 tokens 134 / 183 / 234 us
    // (the mma.sync tiles or dequantize + cuBLAS) -> 119 / 142 / 170 (bench/RESULTS.md "2026-11-29
    // (eleventh session)")
    // Twelfth session (x's image by bulk copies, the weights' shared ring), per matrix on x's
    // image: at 9-16 tokens qkv and gate|up run faster on 32-token tiles of four K groups (Q4_0
    // 21 / 33 against 22 / 44 us, Q4_K 36 / 56 against 37 / 73), not Q8_0's (29 / 50 against 33 /
    // 54 ... on 16-token tiles).
    // Thirteenth session (128- and 256-token tiles, configurations 16-18; the same per-matrix
    // table from 9 to 1,024 tokens, Q4_0 / Q8_0 / Q4_K): past 64 tokens wide matrices take
    // 128-token tiles (qkv at 128: 31 / 40 / 46 us against 45 / 78 / 82 on 64-token ones), from
    // 192 tokens 256-token tiles; narrow ones keep the 64-token tiles to 128 tokens, then take
    // 128-token tiles split over a cluster to 256 and whole to 512; past 512 256-token tiles for
    // all. Q8_0: gate|up at 9-16 tokens on 32-token
    // tiles (49 against 54 us), wide matrices at 33-64 tokens on 128-token ones (qkv 39 against
    // 43, gate|up 76 against 81).
    // Thirty-second session (configurations 19-22: one warp group a CTA, three CTAs an SM, alone
    // or in clusters of two along K): at 9-32 tokens the wide matrices of the 32-element types
    // (Q8_0 qkv / gate|up at 32 tokens 22.3 / 36.8 against 31.6 / 48.6 us, Q4_0 17.3 / 28.3
    // against 20.9 / 32.1; the K-quants keep 32-token tiles of four K groups), Q8_0's wide ones at
    // 33-64 (29.2 / 48.8 against 38.1 / 74.2), and wo and down at 65-128 (Q8_0 27.3 / 66.0 against
    // 32.8 / 72.9, Q4_0 18.0 / 35.8 against 25.0 / 45.8, Q4_K on 19: 20.7 / 50.4 against 28.6 /
    // 54.3). Whole llama2-7b steps: Q8_0 at 32 / 64 sequences +14 %, Q4_0 at 16 / 32 +6 %, Q4_K at
    // 128 +4 %, Q8_0 at 128 unchanged. Measured and not kept: Q8_0's qkv and gate|up at 9-16 tokens
    // on these tiles instead of int8 mma.sync (21.9 / 36.5 against 22.6 / 40.9 us alone, but 16
    // sequences 4,210 -> 4,085 tok/s).
    // (from 1 token: kc_matmul takes Q4_K past the plan's qgemv_max_tok)
    if (kc_plan_get()->gemmq_wg && kc__gemmq_wg_ncfg() > 0) {
        const bool wide = n_out >= 8192, widest = n_out >= 16384;
        if (n_tok <= 32) {
            if (!wide) return NCFG + (n_tok <= 16 ? 0 : 2);
            return NCFG + (k_quant ? 1 : widest ? 9 : 11);
        }
        if (n_tok <= 64) return NCFG + (wide ? (type == DT_Q8_0 ? (widest ? 8 : 10) : 4) : 3);
        if (n_tok <= 128) return NCFG + (wide ? 5 : k_quant ? 8 : 10);
        if (n_tok <= 256) return NCFG + (wide ? 7 : 6);
        if (n_tok <= 512) return NCFG + (wide ? 7 : 5);
        return NCFG + 7;
    }
    if (n_tok <= 8) return 9;
    if (n_tok <= 16) return 8;
    if (n_tok <= 32) return 10;
    if (n_tok <= 64) return type == DT_Q8_0 ? 1 : 6;
    if (type != DT_Q8_0 && !k_quant) return 6;
    return k_quant && n_tok > 128 ? 3 : 2;
}

// Within the GEMV's range (up to KC_GEMV_MAX_TOK tokens) kc_gemmq would win from about 8
// tokens (Q4_0 1893 against 1830 tok/s at batch 8, Q4_K 1399 against 1143), but the GEMV sums
// every row in the same order whatever the batch, and the tensor cores do not: decode steps
// of up to 8 sequences stay batch-invariant. On Hopper Q8_0 and Q4_K leave the GEMV past 4
// tokens (the plan's qgemv_max_tok), where the wgmma tiles and int8 mma.sync win by 20-80 %.
// Where it stops beating dequantize + cuBLAS is the plan's gemmq_max_tok (plan.cu).

extern "C" int kc__gemmq_rows(const kc_weight *w, const kc_half *x, int n_tok, float *y, int ldy, int accumulate, int cfg,
                              int xperm, cudaStream_t s) {
    if (!w || !x || !y || n_tok <= 0 || !kc_gemmq_ok(w) || cfg >= kc_gemmq_ncfg() || ldy < w->n_out) return CM_EINVAL;
    const __half *xh = (const __half *)x;
    if (w->type == KC_WEIGHT_MIXED) { // range by range, into its rows of y
        for (int i = 0; i < w->n_parts; i++) {
            const kc_weight v = kc_weight_part_view(w, i);
            if (int rc = kc__gemmq_rows(&v, x, n_tok, y + w->part[i].row0, ldy, accumulate, cfg, xperm, s)) return rc;
        }
        return 0;
    }
    if (cfg < 0) cfg = gemmq_choose(w->type, n_tok, w->n_out, w->n_in);
    if (cfg >= NCFG) return kc__gemmq_wg(w, x, n_tok, y, ldy, accumulate, cfg - NCFG, xperm, nullptr, s);
    if (xperm || w->type == DT_F16) return CM_EINVAL; // the mma.sync tiles read x as it is, quantized weights
    switch (w->type) {
    case DT_Q8_0: return dispatch<DT_Q8_0>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    case DT_Q4_0: return dispatch<DT_Q4_0>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    case DT_Q4_1: return dispatch<DT_Q4_1>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    case DT_Q5_0: return dispatch<DT_Q5_0>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    case DT_Q5_1: return dispatch<DT_Q5_1>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    case DT_Q4_K: return dispatch<DT_Q4_K>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    case DT_Q5_K: return dispatch<DT_Q5_K>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    default: return dispatch<DT_Q6_K>(w, xh, n_tok, y, ldy, accumulate, s, cfg);
    }
}

extern "C" int kc__gemmq_glu(const kc_weight *w, const kc_half *x, int n_tok, int xperm, const kc_wg_glu *glu, cudaStream_t s) {
    if (!w || !x || !glu || n_tok <= 0 || w->type == KC_WEIGHT_MIXED || !kc_gemmq_ok(w) || !xperm) return CM_EINVAL;
    const int cfg = gemmq_choose(w->type, n_tok, w->n_out, w->n_in);
    if (cfg < NCFG) return CM_EINVAL;
    return kc__gemmq_wg(w, x, n_tok, nullptr, w->n_out, 0, cfg - NCFG, xperm, glu, s);
}

extern "C" int kc_gemmq(const kc_weight *w, const kc_half *x, int n_tok, float *y, int accumulate, int cfg, cudaStream_t s) {
    if (!w) return CM_EINVAL;
    return kc__gemmq_rows(w, x, n_tok, y, w->n_out, accumulate, cfg, 0, s);
}

extern "C" int kc__gemmq_x_order(const kc_weight *w, int n_tok) {
    if (w->type == KC_WEIGHT_MIXED || gemmq_choose(w->type, n_tok, w->n_out, w->n_in) < NCFG) return 0;
    if (w->type == DT_F16) return 3;
    return w->type == DT_Q4_K || w->type == DT_Q5_K || w->type == DT_Q6_K ? 2 : 1;
}

namespace {
// The image of the wgmma tiles' stages (gemmq_wg.cu): for each 64-k column block b of x, ntp rows
// (the tokens, padded to 8 with zeros) of 128 bytes, 16-byte piece p of row t holding logical k
// 64 b + 8 (p ^ (t % 8)) .. + 7; logical k = 128 ks + 16 i + 8 h + 2 q + c of a row is its element
// qt::xe_t(ks, q, i, h, c) (the order's: the 32-element blocks', the K-quants' or F16's). A thread writes
// one piece: MMA i and half h are the piece's, q and c run over its eight halves.
template <int TYPE>
__global__ void to_half_gemmq_kernel(const float *x, int n_pieces, int n, int n_tok, int ntp, __half *out) {
    kc_pdl_wait();
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n_pieces; e += gridDim.x * blockDim.x) {
        const int b = e / (ntp * 8), r = e - b * ntp * 8, t = r >> 3, p = r & 7;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (t < n_tok) {
            const int k = b * 64 + ((p ^ (t & 7)) << 3), ks = k / BK, l = k % BK, i = l >> 4, h = (l >> 3) & 1;
            const float *row = x + (size_t)t * n;
            uint32_t *u = (uint32_t *)&v;
#pragma unroll
            for (int q = 0; q < 4; q++)
                u[q] = h2_bits(__floats2half2_rn(__ldg(row + qt<TYPE>::xe_t(ks, q, i, h, 0)), __ldg(row + qt<TYPE>::xe_t(ks, q, i, h, 1))));
        }
        *(uint4 *)(out + (size_t)e * 8) = v;
    }
    kc_pdl_trigger();
}
} // namespace

// the image and 256 rows of 64 halves past it: a 256-token tile reads up to 248 padded rows beyond
// the last column block's
extern "C" size_t kc__gemmq_x_halves(int n_tok, int n) { return (size_t)((n_tok + 7) & ~7) * n + 256 * 64; }

extern "C" int kc__to_half_gemmq(const float *x, int n_tok, int n, int order, kc_half *out, cudaStream_t s) {
    if (!x || !out || n_tok <= 0 || n <= 0 || n % (order == 2 ? 256 : BK) || order < 1 || order > 3) return CM_EINVAL;
    const int ntp = (n_tok + 7) & ~7;
    if ((size_t)ntp * n / 8 > INT_MAX) return CM_EINVAL;
    const int pieces = ntp * n / 8;
    const unsigned grid = (unsigned)((pieces + 255) / 256 < 4096 ? (pieces + 255) / 256 : 4096);
    if (order == 1) kc_launch(to_half_gemmq_kernel<DT_Q4_0>, dim3(grid), dim3(256), 0, s, x, pieces, n, n_tok, ntp, (__half *)out);
    else if (order == 3) kc_launch(to_half_gemmq_kernel<DT_F16>, dim3(grid), dim3(256), 0, s, x, pieces, n, n_tok, ntp, (__half *)out);
    else kc_launch(to_half_gemmq_kernel<DT_Q4_K>, dim3(grid), dim3(256), 0, s, x, pieces, n, n_tok, ntp, (__half *)out);
    KC_LAUNCH_CHECK();
}

// ---- Q8_0 and Q4_K x 9-16 tokens on int8 mma.sync (kc__gemm_q8i) ------------------------------
// The weights' codes as they are (no dequantization) times the tokens' two-level int8 activations
// (kc_xq: per block of 32, x ~ s (256 qh + ql) with s the float in m's first word, and the block's
// sum of 256 qh + ql in its second), one m16n8k32 MMA per block of 32, 16 rows, 8 tokens and qh
// or ql: a block's sum v = 256 sum(w qh) + sum(w ql) is exact in int32 (|.| < 2^28).
//   Q8_0: y += d s v (d: the row's block scale).
//   Q4_K: the codes 0..15 of a quarter's 32 bytes (low nibbles: sub-block 2j, high: 2j + 1) are
//         the A operands of two MMAs; y += (d sc) s v - (dmin m) s sum, the sub-block's scale and
//         min from the super-block's head as the reference computes them.
// A CTA of Q8I_KW warps owns Q8I_MT x 16 = 32 rows at a time; warp w takes the w-th of Q8I_KW
// contiguous ranges of the rows' units (Q8_0 blocks of 32, Q4_K quarters of 64; a multiple of 4
// units each), and the warps' sums are added in warp order at the end: the order of every sum
// depends on n_in only, so a token's row is the same bits alone and in a batch.
// Each warp streams its range through a ring of NST stages in shared memory (cp.async, as the
// decode attention does): a stage holds UB units of its 32 rows (codes, then the rows' scales or
// super-block heads), the tokens' qh and ql of those units and their block scales and sums.
// (A version that loaded the weights into registers, 64-128 bytes a lane in flight, moved 1.3
// TB/s: slower than the wgmma tiles.) Persistent: one CTA an SM takes row tiles blockIdx.x, +
// gridDim.x, ...; a warp's ring runs on across its tiles, so the next tile's first stages load
// under this one's last products and sums.
// Inside a block a lane of quad position t holds bytes 8t .. 8t + 7 of a row's 32 codes (or of a
// quarter's 32 nibble bytes) as the MMA's k slots 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3; the
// activations' bytes go to the same slots: the block's dot product is unchanged by the
// permutation. A stage's rows (weights or tokens) have their 16-byte chunks swizzled (q8i_swz) so
// that a warp's 8-byte reads of one block meet no bank conflict.
constexpr int Q8I_KW = 8, Q8I_MT = 2;
template <int WT, int NT8, int UB_, int NST_> struct q8i_cfg {
    static constexpr bool K4 = WT == DT_Q4_K;
    static constexpr int TC = 8 * NT8;             // tokens a stage holds
    static constexpr int UB = UB_, NST = NST_;     // units a stage (2 or 4), stages a ring
    static constexpr int NBX = K4 ? 2 * UB : UB;   // activation blocks of 32 a stage
    static constexpr int RB = 32 * UB, RX = 32 * NBX; // bytes of a stage's weight row, token row
    static constexpr int DB = K4 ? 16 : 2 * UB;    // a row's scales (Q4_K: its super-block's head)
    static constexpr int W_OFF = 0, QH_OFF = 32 * RB, QL_OFF = QH_OFF + TC * RX, D_OFF = QL_OFF + TC * RX,
                         DS_OFF = D_OFF + 32 * DB, S_OFF = DS_OFF + (K4 ? 32 * NBX * 8 : 0), STAGE = S_OFF + TC * 8 * NBX;
    static constexpr int RED = Q8I_KW * Q8I_MT * NT8 * 4 * 32 * 4; // a tile's sums of the warps
    static constexpr int SMEM = Q8I_KW * NST * STAGE + RED;
};
// the 16-byte chunk a row's chunk c goes to: rows of 128 bytes or more start in the same bank, rows
// of 64 in every other one
template <int ROWB> __device__ __forceinline__ int q8i_swz(int r) { return ROWB >= 128 ? 2 * (r & 3) : 2 * ((r >> 1) & 1); }

__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

template <int WT, int NT8, int UB_, int NST_>
__global__ void __launch_bounds__(Q8I_KW * 32)
q8i_kernel(const uint8_t *__restrict__ W, const uint8_t *__restrict__ wd, const int8_t *__restrict__ qh,
           const int8_t *__restrict__ ql, const int32_t *__restrict__ xm, int n_in, int n_out, int n_tok, float *y, int ldy,
           int accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    KC_TRACE_SCOPE(KC_TR_GEMV);
    using C = q8i_cfg<WT, NT8, UB_, NST_>;
    constexpr bool K4 = C::K4;
    constexpr int UB = C::UB, TC = C::TC, RB = C::RB, RX = C::RX, NBX = C::NBX, NST = C::NST;
    constexpr int CPR = RB / 16, CPX = RX / 16, XPU = NBX / UB; // 16-byte chunks a weight row, a token row; blocks a unit
    constexpr int NA = Q8I_MT * NT8 * 4;                         // a lane's sums
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nb = n_in / 32, nu = K4 ? n_in / 64 : nb, n_tiles = (n_out + 16 * Q8I_MT - 1) / (16 * Q8I_MT);
    const size_t w_row = K4 ? (size_t)n_in / 2 : (size_t)n_in, d_row = K4 ? (size_t)(n_in / 256) * 16 : (size_t)nb * 2; // bytes
    const int my_tiles = blockIdx.x < n_tiles ? (n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    // this warp's units [b_lo, b_hi): a multiple of 4 units whatever the stage's UB, so that the
    // ranges (the order of the sums) do not depend on the token count (and a Q4_K stage stays in
    // one super-block); nb is even, so every stage's first block is even and its scale pairs are
    // 4- and 16-byte aligned
    const int per = ((nu + Q8I_KW - 1) / Q8I_KW + 3) / 4 * 4, b_lo = min(nu, warp * per), b_hi = min(nu, b_lo + per);
    const int n_st = (b_hi - b_lo + UB - 1) / UB, n_all = n_st * my_tiles; // stages of one tile, of all
    uint8_t *ring = smem + (size_t)warp * NST * C::STAGE;
    const uint32_t ring_s = kc_smem_addr(ring);
    kc_pdl_trigger();
    kc_pdl_wait();
    auto issue = [&](int i) { // stage i % n_st of the warp's tile i / n_st
        if (i < n_all) {
            const int b = b_lo + (i % n_st) * UB, row_base = (blockIdx.x + (i / n_st) * gridDim.x) * 16 * Q8I_MT;
            const int xb = b * XPU; // the stage's first activation block
            const uint32_t st = ring_s + (i % NST) * C::STAGE;
            // the rows' codes: 32 rows x CPR chunks (two a unit)
#pragma unroll
            for (int k = 0; k < CPR; k++) {
                const int p = lane + 32 * k, r = p / CPR, c = p % CPR;
                const int row = min(row_base + r, n_out - 1);
                kc_cp_async16(st + C::W_OFF + r * RB + ((c ^ q8i_swz<RB>(r)) << 4), W + (size_t)row * w_row + (size_t)b * 32 + c * 16,
                              b + c / 2 < b_hi);
            }
            // the tokens' qh and ql: TC rows x CPX chunks each (two a block)
#pragma unroll
            for (int k = 0; k < TC * CPX / 32; k++) {
                const int p = lane + 32 * k, r = p / CPX, c = p % CPX;
                const bool ok = r < n_tok && b + c / (2 * XPU) < b_hi;
                const size_t o = (size_t)(r < n_tok ? r : 0) * n_in + (size_t)xb * 32 + c * 16;
                const uint32_t so = r * RX + ((c ^ q8i_swz<RX>(r)) << 4);
                kc_cp_async16(st + C::QH_OFF + so, qh + o, ok);
                kc_cp_async16(st + C::QL_OFF + so, ql + o, ok);
            }
            if constexpr (K4) { // the rows' super-block heads: 16 bytes a row (a stage is inside one)
                const int row = min(row_base + lane, n_out - 1);
                kc_cp_async16(st + C::D_OFF + lane * 16, wd + (size_t)row * d_row + (size_t)(b / 4) * 16, b < b_hi);
            } else { // the rows' d: UB halves a row, in pairs of 4 bytes
#pragma unroll
                for (int k = 0; k < (32 * UB / 2 + 31) / 32; k++) {
                    const int p = lane + 32 * k, r = p / (UB / 2), q = p % (UB / 2);
                    if (p < 32 * UB / 2) {
                        const int row = min(row_base + r, n_out - 1);
                        kc_cp_async4(st + C::D_OFF + r * 2 * UB + q * 4, wd + (size_t)row * d_row + (size_t)(b + 2 * q) * 2,
                                     b + 2 * q < b_hi);
                    }
                }
            }
            // the tokens' block scales and sums: NBX pairs of words a token, 16 bytes at a time
#pragma unroll
            for (int k = 0; k < (TC * NBX / 2 + 31) / 32; k++) {
                const int p = lane + 32 * k, r = p / (NBX / 2), q = p % (NBX / 2);
                if (p < TC * NBX / 2)
                    kc_cp_async16(st + C::S_OFF + r * 8 * NBX + q * 16, xm + 2 * ((size_t)(r < n_tok ? r : 0) * nb + xb + 2 * q),
                                  r < n_tok && b + 2 * q / XPU < b_hi);
            }
        }
        kc_cp_async_commit(); // empty groups too: the wait counts groups
    };
    float *red = (float *)(smem + (size_t)Q8I_KW * NST * C::STAGE); // [warp][NA][32]
#pragma unroll
    for (int i = 0; i < NST - 1; i++) issue(i);
    for (int ti = 0; ti < my_tiles; ti++) {
        const int row_base = (blockIdx.x + ti * gridDim.x) * 16 * Q8I_MT;
        float acc[Q8I_MT][NT8][4];
#pragma unroll
        for (int m = 0; m < Q8I_MT; m++)
#pragma unroll
            for (int j = 0; j < NT8; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[m][j][c] = 0.0f;
        for (int si = 0; si < n_st; si++) {
            const int i = ti * n_st + si;
            issue(i + NST - 1);
            kc_cp_async_wait<NST - 1>();
            __syncwarp();
            uint8_t *st = ring + (i % NST) * C::STAGE;
            if constexpr (K4) { // lane r: its row's d sc and dmin m of the stage's sub-blocks
                const uint4 h = *(const uint4 *)(st + C::D_OFF + lane * 16);
                const float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xFFFF)));
                const float dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
                const int sb0 = 2 * ((b_lo + si * UB) & 3); // the stage's first sub-block in its super-block
#pragma unroll
                for (int k = 0; k < NBX; k++) {
                    float sc, mn;
                    kc_q4k_scale_min(h, sb0 + k, sc, mn);
                    *(float2 *)(st + C::DS_OFF + (lane * NBX + k) * 8) = make_float2(d * sc, dmin * mn);
                }
                __syncwarp();
            }
            // every unit of the stage: those past the range were copied as zeros (codes and
            // scales), so they add exact zeros, and the blocks' products interleave unbranched
#pragma unroll
            for (int u = 0; u < UB; u++) {
                const int c = 2 * u + (t >> 1), hb = (t & 1) * 8; // this lane's chunk of unit u and its half
                uint2 wa[Q8I_MT][2];
#pragma unroll
                for (int m = 0; m < Q8I_MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = 16 * m + 8 * h + g;
                        wa[m][h] = *(const uint2 *)(st + C::W_OFF + r * RB + ((c ^ q8i_swz<RB>(r)) << 4) + hb);
                    }
#pragma unroll
                for (int kk = 0; kk < XPU; kk++) { // the unit's blocks of 32: Q4_K's low, then high nibbles
                    const int bx = u * XPU + kk;     // its activation block in the stage
                    const int cx = 2 * bx + (t >> 1);
                    uint32_t a[Q8I_MT][4];
                    float dw[Q8I_MT][2], dm[Q8I_MT][2];
#pragma unroll
                    for (int m = 0; m < Q8I_MT; m++) {
                        if constexpr (K4) {
                            const int sh = 4 * kk;
                            a[m][0] = (wa[m][0].x >> sh) & 0x0F0F0F0Fu, a[m][1] = (wa[m][1].x >> sh) & 0x0F0F0F0Fu;
                            a[m][2] = (wa[m][0].y >> sh) & 0x0F0F0F0Fu, a[m][3] = (wa[m][1].y >> sh) & 0x0F0F0F0Fu;
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                const float2 v = *(const float2 *)(st + C::DS_OFF + ((16 * m + 8 * h + g) * NBX + bx) * 8);
                                dw[m][h] = v.x;
                                dm[m][h] = v.y;
                            }
                        } else {
                            a[m][0] = wa[m][0].x, a[m][1] = wa[m][1].x, a[m][2] = wa[m][0].y, a[m][3] = wa[m][1].y;
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                dw[m][h] = __half2float(*(const __half *)(st + C::D_OFF + (16 * m + 8 * h + g) * 2 * UB + 2 * u));
                                dm[m][h] = 0.0f;
                            }
                        }
                    }
#pragma unroll
                    for (int j = 0; j < NT8; j++) {
                        const int r = 8 * j + g; // B's column g: token 8 j + g
                        const int so = r * RX + ((cx ^ q8i_swz<RX>(r)) << 4) + hb;
                        const uint2 bh = *(const uint2 *)(st + C::QH_OFF + so), bl = *(const uint2 *)(st + C::QL_OFF + so);
                        // C's columns 2 t, 2 t + 1: tokens 8 j + 2 t (+1): their block scale (and sum)
                        const int2 s0 = *(const int2 *)(st + C::S_OFF + (8 * j + 2 * t) * 8 * NBX + 8 * bx),
                                   s1 = *(const int2 *)(st + C::S_OFF + (8 * j + 2 * t + 1) * 8 * NBX + 8 * bx);
                        const float dx0 = __int_as_float(s0.x), dx1 = __int_as_float(s1.x);
                        float sx0 = 0.0f, sx1 = 0.0f; // Q4_K: the tokens' block sums s sum
                        if constexpr (K4) sx0 = dx0 * (float)s0.y, sx1 = dx1 * (float)s1.y;
#pragma unroll
                        for (int m = 0; m < Q8I_MT; m++) {
                            int ch[4], cl[4];
                            mma_s8_16832(ch, a[m], bh.x, bh.y);
                            mma_s8_16832(cl, a[m], bl.x, bl.y);
                            // rows g (c 0, 1) and g + 8 (c 2, 3)
#pragma unroll
                            for (int q = 0; q < 4; q++) {
                                acc[m][j][q] = fmaf(dw[m][q >> 1] * ((q & 1) ? dx1 : dx0), (float)(256 * ch[q] + cl[q]), acc[m][j][q]);
                                if constexpr (K4) acc[m][j][q] = fmaf(-dm[m][q >> 1], (q & 1) ? sx1 : sx0, acc[m][j][q]);
                            }
                        }
                    }
                }
            }
            __syncwarp(); // every lane is done with this stage before it is refilled
        }
#pragma unroll
        for (int m = 0; m < Q8I_MT; m++)
#pragma unroll
            for (int j = 0; j < NT8; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) red[((size_t)warp * NA + (m * NT8 + j) * 4 + c) * 32 + lane] = acc[m][j][c];
        // entries e of the list (k, lane), the warps' sums in warp order; y's values to add to are
        // requested before the barrier
        constexpr int NE = (32 * NA + Q8I_KW * 32 - 1) / (Q8I_KW * 32);
        float y0[NE];
#pragma unroll
        for (int q = 0; q < NE; q++) {
            const int e = threadIdx.x + q * Q8I_KW * 32, k = e / 32, ln = e % 32, m = k / (NT8 * 4), j = k / 4 % NT8, c = k % 4;
            const int row = row_base + 16 * m + 8 * (c >> 1) + (ln >> 2), tk = 8 * j + 2 * (ln & 3) + (c & 1);
            y0[q] = accumulate && e < 32 * NA && row < n_out && tk < n_tok ? y[(size_t)tk * ldy + row] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < NE; q++) {
            const int e = threadIdx.x + q * Q8I_KW * 32, k = e / 32, ln = e % 32, m = k / (NT8 * 4), j = k / 4 % NT8, c = k % 4;
            if (e >= 32 * NA) break;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < Q8I_KW; w++) v += red[((size_t)w * NA + k) * 32 + ln];
            const int row = row_base + 16 * m + 8 * (c >> 1) + (ln >> 2), tk = 8 * j + 2 * (ln & 3) + (c & 1);
            if (row < n_out && tk < n_tok) y[(size_t)tk * ldy + row] = accumulate ? y0[q] + v : v;
        }
        __syncthreads(); // the sums are read before the next tile's are written
    }
    kc_cp_async_wait<0>();
#endif
}

template <int WT, int NT8, int UB, int NST>
static int launch_q8i(const kc_weight *W, const kc_xq *xq, int n_tok, float *y, int ldy, int accumulate, cudaStream_t s) {
    using C = q8i_cfg<WT, NT8, UB, NST>;
    static unsigned char configured[64];
    static int n_sm[64];
    auto *k = q8i_kernel<WT, NT8, UB, NST>;
    if (int rc = kc_smem_limit_once(k, C::SMEM, configured, __FILE__, __LINE__)) return rc;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return CM_ECUDA;
    if (!n_sm[dev] && cudaDeviceGetAttribute(&n_sm[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return CM_ECUDA;
    const int tiles = (W->n_out + 16 * Q8I_MT - 1) / (16 * Q8I_MT); // persistent: a CTA an SM (its ring fills one)
    kc_launch(k, dim3(tiles < n_sm[dev] ? tiles : n_sm[dev]), dim3(Q8I_KW * 32), C::SMEM, s, (const uint8_t *)W->data,
              (const uint8_t *)W->d, xq->qh, xq->ql, xq->m, W->n_in, W->n_out, n_tok, y, ldy, accumulate);
    return 0;
}

extern "C" int kc__gemm_q8i(const kc_weight *W, const kc_xq *xq, int n_tok, float *y, int ldy, int accumulate, cudaStream_t s) {
    const bool k4 = W && W->type == DT_Q4_K;
    if (!W || (W->type != DT_Q8_0 && !k4) || !xq || !xq->qh || !xq->ql || !xq->m || xq->n != W->n_in || n_tok < 1 ||
        n_tok > (k4 ? 16 : 32) || n_tok > xq->cap_tok || W->n_in % (k4 ? 256 : 64) || ldy < W->n_out)
        return CM_EINVAL;
    int rc;
    // Q8_0: stages of 4 blocks, 3 a ring (llama2-7b Q8_0 at 9 / 12 / 16 sequences on an H200,
    // before the stage's blocks ran unbranched: 4.03 / 4.08 / 4.11 ms a step; stages of 2 blocks,
    // 4 or 6 a ring: 4.65-4.95 ms; bench/RESULTS.md, twenty-ninth session); 24 and 32 tokens fit
    // only stages of 2 blocks (and lose to the tiles). Q4_K: stages of 2 quarters (4 activation
    // blocks), the most that fits beside 16 tokens (llama2-7b Q4_K at 9-16 sequences: 5.1 -> 4.0-4.1
    // ms a step against the tiles; bench/RESULTS.md, thirtieth session)
    if (k4) rc = n_tok <= 8 ? launch_q8i<DT_Q4_K, 1, 2, 3>(W, xq, n_tok, y, ldy, accumulate, s)
                            : launch_q8i<DT_Q4_K, 2, 2, 3>(W, xq, n_tok, y, ldy, accumulate, s);
    else
        switch ((n_tok + 7) / 8) {
        case 1: rc = launch_q8i<DT_Q8_0, 1, 4, 3>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case 2: rc = launch_q8i<DT_Q8_0, 2, 4, 3>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case 3: rc = launch_q8i<DT_Q8_0, 3, 2, 3>(W, xq, n_tok, y, ldy, accumulate, s); break;
        default: rc = launch_q8i<DT_Q8_0, 4, 2, 3>(W, xq, n_tok, y, ldy, accumulate, s); break;
        }
    if (rc) return rc;
    KC_LAUNCH_CHECK();
}
