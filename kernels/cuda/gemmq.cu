// gemmq: quantized weights (Q8_0, Q4_0, Q4_K) times half activations on tensor cores, for
// token counts past the GEMV's (prefill chunks, large decode batches). The weights are read
// in their kc_weight layout and dequantized in registers straight into the mma fragments:
// no dequantized copy of the matrix is written anywhere.
//
// Work split: a CTA owns BM = 16 MT WM output rows and BN tokens; its WM x WK warps each own
// 16 MT rows, and the K range is split over the WK warps of a row group by steps of BK = 128
// (warp kw takes steps kw, kw + WK, ...); their partial sums are added in a fixed order at the
// end. Within a step, lane quad q owns 32 of the 128 elements (one Q8_0/Q4_0 block, or half of
// a Q4_K quarter) and feeds them to 8 m16n8k16 MMAs in an order of its choice: the logical k
// of an MMA operand pair is mapped to the same physical element for the weights (A, from
// registers) and the activations (B, read from a shared-memory tile stored in that order),
// so the dot product is unchanged. The activation tile is double-buffered with cp.async;
// the next step's weights are loaded into registers while this step's are multiplied.
//
// The summation order of an output depends on WK and n_in only (not on BN, BM or where the
// token sits in the batch), so a configuration of fixed WK is batch-invariant.
#include "kc_common.cuh"

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

template <> struct qt<DT_Q4_0> {
    struct raw { uint4 w; __half2 d; };
    __device__ static void load(raw &r, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const size_t b = row * (size_t)(n_in / 32) + (size_t)ks * 4 + q;
        r.w = __ldg((const uint4 *)W + b);
        r.d = __half2half2(__ushort_as_half(__ldg((const unsigned short *)D + b)));
    }
    __device__ static int xoff(int ks, int q, int e4) { return ks * BK + 32 * q + 4 * e4; }
    // elements 0..15: low nibbles of bytes 0..15; 16..31: high nibbles
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const int sh = i < 4 ? 0 : 4;
        const uint32_t v = u[i & 3] >> sh;
        const __half2 off = __half2half2(__ushort_as_half(0x6408)); // 1032 = 1024 + 8
        lo = h2_bits(__hmul2(__hsub2(bits_h2((spread2<0>(v) & 0x000F000Fu) | 0x64006400u), off), r.d));
        hi = h2_bits(__hmul2(__hsub2(bits_h2((spread2<1>(v) & 0x000F000Fu) | 0x64006400u), off), r.d));
    }
};

template <> struct qt<DT_Q4_K> {
    // step ks covers half of super-block ks / 2; quad q takes its 16-byte piece u = 4 (ks % 2) + q:
    // quarter j = u / 2, half h = u % 2. Low nibbles: elements 64j + 16h + 0..15 (sub-block 2j),
    // high nibbles: 64j + 32 + 16h + 0..15 (sub-block 2j + 1).
    struct raw { uint4 w; float ds[2], dm[2]; };
    __device__ static void load(raw &r, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const size_t sb = row * (size_t)(n_in / 256) + (size_t)(ks >> 1);
        const int u = 4 * (ks & 1) + q, j = u >> 1;
        r.w = __ldg((const uint4 *)(W + sb * 128) + u);
        const uint4 h = __ldg((const uint4 *)D + sb);
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
    __device__ static int xoff(int ks, int q, int e4) {
        const int u = 4 * (ks & 1) + q, j = u >> 1, h = u & 1;
        return (ks >> 1) * 256 + 64 * j + 16 * h + (e4 < 4 ? 4 * e4 : 32 + 4 * (e4 - 4));
    }
    __device__ static float nib(uint32_t v) { return __uint_as_float(0x4B000000u | v) - 8388608.0f; }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const int k = i < 4 ? 0 : 1;
        const uint32_t v = (u[i & 3] >> (4 * k)) & 0x0F0F0F0Fu;
        const float ds = r.ds[k], dm = -r.dm[k];
        float f[4];
#pragma unroll
        for (int b = 0; b < 4; b++) f[b] = fmaf(nib((v >> (8 * b)) & 0xFF), ds, dm);
        lo = h2_bits(__floats2half2_rn(f[0], f[1]));
        hi = h2_bits(__floats2half2_rn(f[2], f[3]));
    }
};

template <int TYPE, int WM, int WK, int BN, int MT>
__global__ void __launch_bounds__(WM * WK * 32)
gemmq_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ D, const __half *x, float *y, int n_in,
             int n_out, int n_tok, int accumulate) {
    KC_TRACE_SCOPE(KC_TR_GEMMQ);
    typedef qt<TYPE> T;
    constexpr int NT = BN / 8, NTHR = WM * WK * 32, BM = 16 * MT * WM;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp % WM, kw = warp / WM, g = lane >> 2, q = lane & 3;
    // rows of this thread: row_a + 8 r, r < 2 MT (MMA m of r / 2, its rows g and g + 8)
    const int row_a = blockIdx.x * BM + 16 * MT * wm + g;
    size_t rows[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) rows[r] = (size_t)min(row_a + 8 * r, n_out - 1);
    const int n0 = blockIdx.y * BN;
    const int nsteps = n_in / BK, niter = (nsteps + WK - 1) / WK;

    // the first step's weights stream in before the wait (nothing in the stream writes them)
    typename T::raw a[2 * MT], b[2 * MT];
    if (kw < nsteps)
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) T::load(a[r], W, D, rows[r], n_in, kw, q);
    kc_pdl_wait();

    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    constexpr int TILE = WK * BN * XROW; // bytes of one buffer
    auto load_x = [&](int it, int buf) {
        for (int p = threadIdx.x; p < WK * BN * 32; p += NTHR) {
            const int k = p / (BN * 32), t = (p / 32) % BN, slot = p % 32; // slot = 4 e4 + quad
            const int ks = it * WK + k;
            if (ks >= nsteps) continue;
            const int tok = min(n0 + t, n_tok - 1);
            const __half *src = x + (size_t)tok * n_in + T::xoff(ks, slot & 3, slot >> 2);
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
                float *p = y + (size_t)tok * n_out + row;
                *p = accumulate ? *p + acc[m][n][c] : acc[m][n][c];
            }
}

template <int TYPE, int WM, int WK, int BN, int MT>
int launch(const kc_weight *w, const __half *x, int n_tok, float *y, int acc, cudaStream_t s) {
    const size_t tile = (size_t)WK * BN * XROW * 2;
    const size_t red = (size_t)(WK - 1) * WM * MT * (BN / 8) * 32 * 4 * 4;
    const size_t smem = tile > red ? tile : red;
    static unsigned char smem_set[64];
    if (smem > 48 * 1024)
        if (int rc = kc_smem_limit_once(gemmq_kernel<TYPE, WM, WK, BN, MT>, (int)smem, smem_set, __FILE__, __LINE__)) return rc;
    dim3 grid((w->n_out + 16 * MT * WM - 1) / (16 * MT * WM), (n_tok + BN - 1) / BN), block(WM * WK * 32);
    kc_launch(gemmq_kernel<TYPE, WM, WK, BN, MT>, grid, block, smem, s, (const uint8_t *)w->data, (const kc_half *)w->d,
              x, y, w->n_in, w->n_out, n_tok, acc);
    KC_LAUNCH_CHECK();
}

// Tile configurations (warps over rows x over K, tokens, MMA rows per warp / 16). Chosen per
// token count from gpu_bench_gemmq on an H100 (bench/RESULTS.md).
constexpr int NCFG = 11;
template <int TYPE> int dispatch(const kc_weight *w, const __half *x, int n_tok, float *y, int acc, cudaStream_t s, int cfg) {
    switch (cfg) {
    case 0: return launch<TYPE, 2, 4, 16, 1>(w, x, n_tok, y, acc, s);
    case 1: return launch<TYPE, 2, 4, 32, 1>(w, x, n_tok, y, acc, s);
    case 2: return launch<TYPE, 4, 2, 64, 1>(w, x, n_tok, y, acc, s);
    case 3: return launch<TYPE, 8, 1, 64, 1>(w, x, n_tok, y, acc, s);
    case 4: return launch<TYPE, 4, 1, 128, 1>(w, x, n_tok, y, acc, s);
    case 5: return launch<TYPE, 4, 1, 64, 2>(w, x, n_tok, y, acc, s);
    case 6: return launch<TYPE, 4, 2, 32, 2>(w, x, n_tok, y, acc, s);
    case 7: return launch<TYPE, 1, 8, 16, 2>(w, x, n_tok, y, acc, s);
    case 8: return launch<TYPE, 2, 8, 16, 1>(w, x, n_tok, y, acc, s);
    case 9: return launch<TYPE, 2, 8, 8, 1>(w, x, n_tok, y, acc, s);
    default: return launch<TYPE, 4, 4, 16, 1>(w, x, n_tok, y, acc, s);
    }
}

} // namespace

extern "C" int kc_gemmq_ok(const kc_weight *w) {
    static int arch = -1; // the SASS this build runs on the device: mma.sync / cp.async need sm_80
    if (arch < 0 && !kc_code_for_device(&arch)) arch = 0;
    if (arch < 80) return 0;
    if (w->type == DT_Q4_K) return w->n_in % 256 == 0;
    return (w->type == DT_Q8_0 || w->type == DT_Q4_0) && w->n_in % BK == 0;
}

extern "C" int kc_gemmq_ncfg(void) { return NCFG; }

// From gpu_bench_gemmq (H100, llama2-7b layer, bench/RESULTS.md "2026-11-24 (gemmq)"): the
// fastest configuration per token count. Past the plan's gemmq_max_tok dequantizing into a half copy
// for cuBLAS wins (its tensor-core GEMM outruns these mma.sync tiles, and the copy's cost is
// spread over many tokens); the configurations chosen above 64 tokens serve larger plan limits.
static int gemmq_choose(int type, int n_tok) {
    if (n_tok <= 8) return 9;
    if (n_tok <= 16) return 8;
    if (n_tok <= 32) return 10;
    if (n_tok <= 64) return type == DT_Q8_0 ? 1 : 6;
    if (type == DT_Q4_0) return 6;
    return type == DT_Q4_K && n_tok > 128 ? 3 : 2;
}

// Within the GEMV's range (up to KC_GEMV_MAX_TOK tokens) kc_gemmq would win from about 8
// tokens (Q4_0 1893 against 1830 tok/s at batch 8, Q4_K 1399 against 1143), but the GEMV sums
// every row in the same order whatever the batch, and the tensor cores do not: decode steps
// of up to 8 sequences stay batch-invariant. Where it stops beating dequantize + cuBLAS is the
// plan's gemmq_max_tok (plan.cu).

extern "C" int kc_gemmq(const kc_weight *w, const kc_half *x, int n_tok, float *y, int accumulate, int cfg, cudaStream_t s) {
    if (!w || !x || !y || n_tok <= 0 || !kc_gemmq_ok(w) || cfg >= NCFG) return CM_EINVAL;
    if (cfg < 0) cfg = gemmq_choose(w->type, n_tok);
    const __half *xh = (const __half *)x;
    switch (w->type) {
    case DT_Q8_0: return dispatch<DT_Q8_0>(w, xh, n_tok, y, accumulate, s, cfg);
    case DT_Q4_0: return dispatch<DT_Q4_0>(w, xh, n_tok, y, accumulate, s, cfg);
    default: return dispatch<DT_Q4_K>(w, xh, n_tok, y, accumulate, s, cfg);
    }
}
