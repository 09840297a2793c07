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
#include "kc_common.cuh"

#include <type_traits>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

KC_TRACE_TU(gemmq)

namespace {

constexpr int BK = 128;             // elements of K per warp step (4 lane quads x 32)
constexpr int XROW = BK * 2 + 32;   // bytes per token of the activation tile (padded: no bank conflicts)

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(uint32_t *)&h; }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *(__half2 *)&u; }

// Bytes 2p and 2p + 1 of u as the low bytes of the two 16-bit halves.
template <int P> __device__ __forceinline__ uint32_t spread2(uint32_t u) {
    return __byte_perm(u, 0, P == 0 ? 0x4140 : 0x4342);
}

// Per type: what one lane quad holds for one row in one step (raw), how it is loaded, where
// its element group e4 (elements 4 e4 .. 4 e4 + 3 of the quad's 32) lies in the step's 128
// activations, and the half pairs of MMA i (elements 4i, 4i + 1 | 4i + 2, 4i + 3).
template <int TYPE> struct qt;

template <> struct qt<DT_Q8_0> {
    struct raw { uint4 w[2]; __half2 d; };
    __device__ static void load(raw &r, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const uint4 *p = (const uint4 *)(W + row * (size_t)n_in + (size_t)ks * BK + 32 * q);
        r.w[0] = __ldg(p);
        r.w[1] = __ldg(p + 1);
        r.d = __half2half2(__ushort_as_half(__ldg((const unsigned short *)D + row * (size_t)(n_in / 32) + ks * 4 + q)));
    }
    __device__ static int xoff(int ks, int q, int e4) { return ks * BK + 32 * q + 4 * e4; }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)r.w;
        const uint32_t v = u[i] ^ 0x80808080u; // int8 + 128 in [0, 255]
        const __half2 off = __half2half2(__ushort_as_half(0x6480)); // 1152 = 1024 + 128
        lo = h2_bits(__hmul2(__hsub2(bits_h2(spread2<0>(v) | 0x64006400u), off), r.d));
        hi = h2_bits(__hmul2(__hsub2(bits_h2(spread2<1>(v) | 0x64006400u), off), r.d));
    }
};

// Q4_0, Q4_1, Q5_0, Q5_1: quad q takes block 4 ks + q of the row; its elements 0..15 are the low
// nibbles of bytes 0..15, 16..31 the high nibbles (Q5: the fifth bits from the high-bit word).
// Each pair of elements becomes half exactly (1024 + q as bits), then d (q - offset) or d q + m
// in one half operation.
template <int TYPE> struct qt_b32 {
    static constexpr bool HI = TYPE == DT_Q5_0 || TYPE == DT_Q5_1, MIN = TYPE == DT_Q4_1 || TYPE == DT_Q5_1;
    struct raw_min { uint4 w; uint32_t qh; __half2 d, m; };
    struct raw_sym { uint4 w; uint32_t qh; __half2 d; };
    struct raw_q4 { uint4 w; __half2 d; };
    typedef typename std::conditional<MIN, raw_min, typename std::conditional<HI, raw_sym, raw_q4>::type>::type raw;
    __device__ static void load(raw &r, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const size_t b = row * (size_t)(n_in / 32) + (size_t)ks * 4 + q;
        r.w = __ldg((const uint4 *)W + b);
        if constexpr (TYPE == DT_Q4_0) {
            r.d = __half2half2(__ushort_as_half(__ldg((const unsigned short *)D + b)));
        } else {
            uint32_t dm;
            if constexpr (TYPE == DT_Q4_1) {
                dm = __ldg((const uint32_t *)D + b);
            } else if constexpr (TYPE == DT_Q5_1) {
                const uint2 v = __ldg((const uint2 *)D + b);
                dm = v.x;
                r.qh = v.y;
            } else { // Q5_0: a row is n_in / 32 high-bit words, then as many halves
                const uint8_t *p = (const uint8_t *)D + row * kc_wq_d_row(DT_Q5_0, n_in);
                const int bi = ks * 4 + q;
                r.qh = __ldg((const uint32_t *)p + bi);
                dm = __ldg((const unsigned short *)(p + (size_t)n_in / 8) + bi);
            }
            r.d = __half2half2(__ushort_as_half((unsigned short)(dm & 0xFFFF)));
            if constexpr (MIN) r.m = __half2half2(__ushort_as_half((unsigned short)(dm >> 16)));
        }
    }
    __device__ static int xoff(int ks, int q, int e4) { return ks * BK + 32 * q + 4 * e4; }
    // elements 4i .. 4i + 3: bytes 4 (i % 4) .. of the low (i < 4) or high nibbles
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const int sh = i < 4 ? 0 : 4;
        const uint32_t v = u[i & 3] >> sh;
        if constexpr (TYPE == DT_Q4_0) {
            const __half2 off = __half2half2(__ushort_as_half(0x6408)); // 1032 = 1024 + 8
            lo = h2_bits(__hmul2(__hsub2(bits_h2((spread2<0>(v) & 0x000F000Fu) | 0x64006400u), off), r.d));
            hi = h2_bits(__hmul2(__hsub2(bits_h2((spread2<1>(v) & 0x000F000Fu) | 0x64006400u), off), r.d));
        } else {
            uint32_t q5 = v & 0x0F0F0F0Fu;
            if constexpr (HI) q5 |= kc_hbit4(r.qh, i);
            const __half2 a = bits_h2(spread2<0>(q5) | 0x64006400u), b = bits_h2(spread2<1>(q5) | 0x64006400u);
            if constexpr (TYPE == DT_Q5_0) {
                const __half2 off = __half2half2(__ushort_as_half(0x6410)); // 1040 = 1024 + 16
                lo = h2_bits(__hmul2(__hsub2(a, off), r.d));
                hi = h2_bits(__hmul2(__hsub2(b, off), r.d));
            } else {
                const __half2 off = __half2half2(__ushort_as_half(0x6400)); // 1024
                lo = h2_bits(__hfma2(__hsub2(a, off), r.d, r.m));
                hi = h2_bits(__hfma2(__hsub2(b, off), r.d, r.m));
            }
        }
    }
};
template <> struct qt<DT_Q4_0> : qt_b32<DT_Q4_0> {};
template <> struct qt<DT_Q4_1> : qt_b32<DT_Q4_1> {};
template <> struct qt<DT_Q5_0> : qt_b32<DT_Q5_0> {};
template <> struct qt<DT_Q5_1> : qt_b32<DT_Q5_1> {};

// Q4_K, Q5_K, Q6_K: step ks covers half of super-block ks / 2; quad q takes its 16-byte piece
// u = 4 (ks % 2) + q: quarter j = u / 2, half h = u % 2. Low nibbles: elements 64j + 16h + 0..15,
// high nibbles: 64j + 32 + 16h + 0..15 (Q4_K, Q5_K: sub-blocks 2j and 2j + 1; Q6_K: sub-blocks of
// 16 4j + h and 4j + 2 + h).
__device__ __forceinline__ int xoff_k(int ks, int q, int e4) {
    const int u = 4 * (ks & 1) + q, j = u >> 1, h = u & 1;
    return (ks >> 1) * 256 + 64 * j + 16 * h + (e4 < 4 ? 4 * e4 : 32 + 4 * (e4 - 4));
}
__device__ __forceinline__ float nib(uint32_t v) { return __uint_as_float(0x4B000000u | v) - 8388608.0f; }

// Q4_K, Q5_K (Q5_K: the fifth bits from the two sub-blocks' high-bit words, shifted to the
// quad's half so that nibble word i % 4 takes bits i % 4 + 8b)
template <int TYPE> struct qt_k {
    static constexpr bool HI = TYPE == DT_Q5_K;
    struct raw_q4 { uint4 w; float ds[2], dm[2]; };
    struct raw_q5 { uint4 w; uint32_t qh[2]; float ds[2], dm[2]; };
    typedef typename std::conditional<HI, raw_q5, raw_q4>::type raw;
    __device__ static void load(raw &r, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const size_t sb = row * (size_t)(n_in / 256) + (size_t)(ks >> 1);
        const int u = 4 * (ks & 1) + q, j = u >> 1;
        r.w = __ldg((const uint4 *)(W + sb * 128) + u);
        uint4 h;
        if constexpr (HI) {
            const uint8_t *p = (const uint8_t *)D + sb * 48;
            h = __ldg((const uint4 *)p);
            const uint2 qh = __ldg((const uint2 *)(p + 16) + j);
            r.qh[0] = qh.x >> (4 * (u & 1));
            r.qh[1] = qh.y >> (4 * (u & 1));
        } else {
            h = __ldg((const uint4 *)D + sb);
        }
        const float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xFFFF)));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float s, m;
            kc_q4k_scale_min(h, 2 * j + k, s, m);
            r.ds[k] = d * s;
            r.dm[k] = dmin * m;
        }
    }
    __device__ static int xoff(int ks, int q, int e4) { return xoff_k(ks, q, e4); }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const int k = i < 4 ? 0 : 1;
        uint32_t v = (u[i & 3] >> (4 * k)) & 0x0F0F0F0Fu;
        if constexpr (HI) v |= kc_hbit4(r.qh[k], i & 3);
        const float ds = r.ds[k], dm = -r.dm[k];
        float f[4];
#pragma unroll
        for (int b = 0; b < 4; b++) f[b] = fmaf(nib((v >> (8 * b)) & 0xFF), ds, dm);
        lo = h2_bits(__floats2half2_rn(f[0], f[1]));
        hi = h2_bits(__floats2half2_rn(f[2], f[3]));
    }
};
template <> struct qt<DT_Q4_K> : qt_k<DT_Q4_K> {};
template <> struct qt<DT_Q5_K> : qt_k<DT_Q5_K> {};

// Q6_K: the quad's 16 nibble bytes of its quarter and the two words of 2-bit high parts they
// need (kc_common.cuh's layout: words 2h and 2h + 1 of the quarter's four), the two sub-blocks'
// d sc. Values d sc (q - 32) in f32 as the reference computes them, then rounded to half.
template <> struct qt<DT_Q6_K> {
    struct raw { uint4 w; uint2 hb; float ds[2]; };
    __device__ static void load(raw &r, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const int nsb = n_in / 256, sb = ks >> 1, u = 4 * (ks & 1) + q, j = u >> 1, h = u & 1;
        const uint8_t *p = W + row * (size_t)(192 * nsb) + (size_t)sb * 192 + 48 * j;
        r.w = __ldg((const uint4 *)p + h);
        r.hb = __ldg((const uint2 *)(p + 32) + h);
        const uint8_t *dr = (const uint8_t *)D + row * kc_wq_d_row(DT_Q6_K, n_in);
        const uint32_t sc = __ldg((const uint32_t *)dr + 4 * sb + j); // scales 4j .. 4j + 3
        const float d = __half2float(__ushort_as_half(__ldg((const unsigned short *)(dr + 16 * (size_t)nsb) + sb)));
        r.ds[0] = d * (float)(int8_t)(sc >> (8 * h));
        r.ds[1] = d * (float)(int8_t)(sc >> (8 * (2 + h)));
    }
    __device__ static int xoff(int ks, int q, int e4) { return xoff_k(ks, q, e4); }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const int k = i < 4 ? 0 : 1, ww = i & 3;
        const uint32_t hw = k ? r.hb.y : r.hb.x;
        const uint32_t v = ((u[ww] >> (4 * k)) & 0x0F0F0F0Fu) | (((hw >> (2 * ww)) & 0x03030303u) << 4);
        const float ds = r.ds[k];
        float f[4];
#pragma unroll
        for (int b = 0; b < 4; b++) f[b] = (__uint_as_float(0x4B000000u | ((v >> (8 * b)) & 0xFF)) - 8388640.0f) * ds; // q - 32
        lo = h2_bits(__floats2half2_rn(f[0], f[1]));
        hi = h2_bits(__floats2half2_rn(f[2], f[3]));
    }
};

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
    // c0, c1: row g, tokens 2q, 2q + 1; c2, c3: row g + 8
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int row = row_a + 16 * m + (c >> 1) * 8, tok = n0 + n * 8 + 2 * q + (c & 1);
                if (row >= n_out || tok >= n_tok) continue;
                float *p = y + (size_t)(GROUPED ? s_ent[n * 8 + 2 * q + (c & 1)] : tok) * ldy + row;
                *p = accumulate ? *p + acc[m][n][c] : acc[m][n][c];
            }
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
    static int arch = -1; // the SASS this build runs on the device: mma.sync / cp.async need sm_80
    if (arch < 0 && !kc_code_for_device(&arch)) arch = 0;
    if (arch < 80) return 0;
    switch (w->type) {
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

extern "C" int kc_gemmq_ncfg(void) { return NCFG; }

// From gpu_bench_gemmq (H100, llama2-7b layer, bench/RESULTS.md "2026-11-24 (gemmq)"): the
// fastest configuration per token count. Past the plan's gemmq_max_tok dequantizing into a half copy
// for cuBLAS wins (its tensor-core GEMM outruns these mma.sync tiles, and the copy's cost is
// spread over many tokens); the configurations chosen above 64 tokens serve larger plan limits.
// Q4_1, Q5_0 and Q5_1 take Q4_0's choices, Q5_K and Q6_K Q4_K's (not measured yet).
static int gemmq_choose(int type, int n_tok) {
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
                              cudaStream_t s) {
    if (!w || !x || !y || n_tok <= 0 || !kc_gemmq_ok(w) || cfg >= NCFG || ldy < w->n_out) return CM_EINVAL;
    const __half *xh = (const __half *)x;
    if (w->type == KC_WEIGHT_MIXED) { // range by range, into its rows of y
        for (int i = 0; i < w->n_parts; i++) {
            const kc_weight v = kc_weight_part_view(w, i);
            if (int rc = kc__gemmq_rows(&v, x, n_tok, y + w->part[i].row0, ldy, accumulate, cfg, s)) return rc;
        }
        return 0;
    }
    if (cfg < 0) cfg = gemmq_choose(w->type, n_tok);
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

extern "C" int kc_gemmq(const kc_weight *w, const kc_half *x, int n_tok, float *y, int accumulate, int cfg, cudaStream_t s) {
    if (!w) return CM_EINVAL;
    return kc__gemmq_rows(w, x, n_tok, y, w->n_out, accumulate, cfg, s);
}
