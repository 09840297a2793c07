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
    if (kc_plan_get()->gemmq_wg && kc__gemmq_wg_ncfg() > 0 && n_tok > KC_GEMV_MAX_TOK) {
        const bool wide = n_out >= 8192;
        if (n_tok <= 16) return NCFG + (wide && (type != DT_Q8_0 || n_out >= 16384) ? 1 : 0);
        if (n_tok <= 32) return NCFG + (wide ? 1 : 2);
        if (n_tok <= 64) return NCFG + (wide ? (type == DT_Q8_0 ? 5 : 4) : 3);
        if (n_tok <= 128) return NCFG + (wide ? 5 : 3);
        if (n_tok <= 256) return NCFG + (wide ? 7 : 6);
        if (n_tok <= 512) return NCFG + (wide ? 7 : 5);
        return NCFG + 7;
    }
    const bool k_quant = type == DT_Q4_K || type == DT_Q5_K || type == DT_Q6_K;
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
// of up to 8 sequences stay batch-invariant. Where it stops beating dequantize + cuBLAS is the
// plan's gemmq_max_tok (plan.cu).

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
