// gemmq_wg: kc_gemmq on Hopper's wgmma (sm_90a code only: CMakeLists.txt's arka_cuda_sm90a).
//
// The mma.sync tiles of gemmq.cu read every activation fragment from shared memory once per warp
// and MMA; that traffic bounds them near 190 TFLOP/s, and at 9-64 tokens they stream the weights
// at a fifth of the bandwidth. Here a warp group multiplies 64 weight rows by BN tokens with one
// wgmma per 16 k: the weights are the A operand, dequantized in registers exactly as gemmq.cu's
// (gemmq_types.cuh: lane quad q of a 128-element step owns 32 elements, MMA i takes its element
// group i), and the activations are the B operand, read by the wgmma from shared memory.
//
// Activations. B holds, for each token, the step's 128 activations in the A fragments' k order:
// logical k = 16 i + 8 h + 2 q + c (MMA i, c < 2) is element qt<T>::xoff(ks, q, i) + 2 h + c, in
// the 128-byte-swizzled K-major layout of the descriptors (two 64-k column blocks of BN rows of
// 128 bytes). kc_matmul writes x in that order when it converts it to half (kc__to_half_gemmq,
// xperm): a stage is then 16-byte cp.async copies. x as it is (kc_gemmq's callers) takes a
// 4-byte copy a pair, and index arithmetic that made the first version of this kernel issue-bound
// (ncu: 0.41 instructions a cycle per scheduler, DRAM at 14 %). Stages: NS = 4, filled two steps
// ahead.
//
// Work split. A CTA owns 64 WM rows (WM warp groups over rows, sharing each B tile) and BN tokens;
// the K steps are split KW ways inside the CTA (groups of WM warp groups, each with its own
// stages and named barrier) and KS ways over a cluster of CTAs along z. Split s = rank KW + kw takes
// steps s, s + KW KS, ...; the partial sums are added in a fixed order at the end (first the
// CTA's K groups through shared memory, then the cluster's CTAs through distributed shared
// memory), so an output's summation order depends on KW, KS and n_in only: batch-invariant.
//
// Weights stream into registers two steps ahead (a ring of two raw sets, by step parity).
// Within a step, MMAs 0-3 and 4-7 use two fragment sets, so the dequantization of one half
// overlaps the other half's wgmma.
#include "gemmq_types.cuh"
#include "wgmma.cuh"

#include <cooperative_groups.h>

extern "C" {
#include "kcuda.h"
}

namespace {

constexpr int WG_NS = 4; // activation stages per K group

template <int BN, int WM, int KW> constexpr size_t wg_smem() {
    // stages, or the partial sums of the K groups past the first (the larger), + 1 KiB alignment
    constexpr size_t st = (size_t)KW * WG_NS * BN * 256, red = (size_t)(KW > 1 ? KW - 1 : 1) * WM * 128 * (BN / 2) * 4;
    return (st > red ? st : red) + 1024;
}

#ifdef KC_SM90A_DEVICE
// One MMA half (elements groups 4 hf .. 4 hf + 3) of the step: fragments from the raw weights of
// rows g and g + 8, then its four wgmma on stage b.
template <int TYPE, int BN>
__device__ __forceinline__ void wg_half(float (&acc)[BN / 2], uint32_t (&f)[4][4], const typename qt<TYPE>::raw (&cur)[2],
                                        int hf, uint32_t b) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        qt<TYPE>::pairs(cur[0], 4 * hf + k, f[k][0], f[k][2]);
        qt<TYPE>::pairs(cur[1], 4 * hf + k, f[k][1], f[k][3]);
    }
    reg_fence(f);
    reg_fence(acc);
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; k++) wgmma_rs<BN>::mma(acc, f[k], sw128_desc(b + hf * BN * 128 + k * 32, 16, 1024));
    wg_commit();
}
#endif

template <int TYPE, int BN, int WM, int KW, int KS, int MINB, bool XP>
__global__ void __cluster_dims__(1, 1, KS) __launch_bounds__(WM * KW * 128, MINB)
gemmq_wg_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ D, const __half *x, float *y, int n_in, int n_out,
                int ldy, int n_tok, int accumulate) {
#ifdef KC_SM90A_DEVICE
    typedef qt<TYPE> T;
    typedef typename T::raw raw;
    constexpr int KT = WM * 128;   // threads of a K group
    constexpr int STAGE = BN * 256; // bytes of one activation stage
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (kc_smem_addr(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = kc_smem_addr(smem);
    const int tid = threadIdx.x, wg = tid >> 7, wm = wg % WM, kw = wg / WM, kt = tid % KT;
    const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int rank = KS > 1 ? (int)blockIdx.z : 0;
    const int split = rank * KW + kw, nsplit = KW * KS;
    const int row_a = blockIdx.x * 64 * WM + 64 * wm + 16 * warp + g;
    const size_t rows[2] = { (size_t)min(row_a, n_out - 1), (size_t)min(row_a + 8, n_out - 1) };
    // this split's steps: split + j nsplit for j < nj
    const int nsteps = n_in / BK, nj = nsteps > split ? (nsteps - split + nsplit - 1) / nsplit : 0;
    const int n0 = blockIdx.y * BN;
    const uint32_t sb = sbase + kw * WG_NS * STAGE;

    auto load_w = [&](raw(&r)[2], int j) {
        T::load(r[0], W, D, rows[0], n_in, split + j * nsplit, q);
        T::load(r[1], W, D, rows[1], n_in, split + j * nsplit, q);
    };
    // the weights of the first two steps stream in before the wait (nothing writes them)
    raw pre0[2], pre1[2];
    if (nj > 0) load_w(pre0, 0);
    if (nj > 1) load_w(pre1, 1);
    kc_pdl_wait();

    // the activations of step j into stage j % NS. XP: x holds each step's 128 activations in
    // that order already (kc__to_half_gemmq): 16-byte copies, piece c of a token's step to piece
    // c % 8 of column block c / 8. Else a token's 64 pairs, lane order = the pairs' order in x
    // (coalesced reads); pair p of quad q, group i, half h goes to 16-byte piece 2 (i % 4) + h of
    // column block i / 4, word q.
    auto stage_x = [&](int j) {
        if (j < nj) {
            const int ks = split + j * nsplit;
            const uint32_t st = sb + (j % WG_NS) * STAGE;
            if constexpr (XP) {
                for (int idx = kt; idx < BN * 16; idx += KT) {
                    const int t = idx >> 4, c = idx & 15;
                    const __half *src = x + (size_t)min(n0 + t, n_tok - 1) * n_in + ks * BK + c * 8;
                    kc_cp_async16(st + (c >> 3) * BN * 128 + t * 128 + (((c & 7) ^ (t & 7)) << 4), src, true);
                }
            } else {
                for (int idx = kt; idx < BN * 64; idx += KT) {
                    const int t = idx >> 6, p = idx & 63, pq = p >> 4, pi = (p >> 1) & 7, ph = p & 1;
                    const __half *src = x + (size_t)min(n0 + t, n_tok - 1) * n_in + T::xoff(ks, pq, pi) + 2 * ph;
                    const uint32_t dst = st + (pi >> 2) * BN * 128 + t * 128 + ((((2 * (pi & 3) + ph) ^ (t & 7))) << 4) + 4 * pq;
                    kc_cp_async4(dst, src, true);
                }
            }
        }
        kc_cp_async_commit(); // one group a step, empty past the end
    };
    stage_x(0);
    stage_x(1);

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    uint32_t fa[4][4], fb[4][4];
    const int bar = 1 + kw;
    // step j, its weights in pre (replaced at once by step j + 2's: the copy cur is multiplied)
    auto step = [&](int j, raw(&pre)[2]) {
        kc_cp_async_wait<1>(); // this thread's copies of stage j have landed
        fence_proxy_async();
        asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(KT) : "memory"); // everyone's; stage j - 2 is free
        stage_x(j + 2);
        const raw cur[2] = { pre[0], pre[1] };
        if (j + 2 < nj) load_w(pre, j + 2);
        const uint32_t b = sb + (j % WG_NS) * STAGE;
        wg_wait<1>(); // the last step's first half has finished with fa
        reg_fence(fa);
        wg_half<TYPE, BN>(acc, fa, cur, 0, b);
        wg_wait<1>(); // the last step's second half has finished with fb
        reg_fence(fb);
        wg_half<TYPE, BN>(acc, fb, cur, 1, b);
    };
    int j = 0;
    for (; j + 1 < nj; j += 2) {
        step(j, pre0);
        step(j + 1, pre1);
    }
    if (j < nj) step(j, pre0);
    wg_wait<0>();
    reg_fence(acc);
    kc_pdl_trigger();

    // the K groups' partial sums, added in group order by the first group
    __syncthreads(); // every stage read and landed: the shared memory takes the sums
    float *red = (float *)smem;
    constexpr int PER = 128 * (BN / 2); // floats of one warp group's sums
    if (KW > 1) {
        if (kw > 0) {
            float *o = red + (size_t)((kw - 1) * WM + wm) * PER + (tid & 127) * (BN / 2);
#pragma unroll
            for (int i = 0; i < BN / 2; i += 4) *(float4 *)(o + i) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
        }
        __syncthreads();
        if (kw == 0)
            for (int k = 1; k < KW; k++) {
                const float *o = red + (size_t)((k - 1) * WM + wm) * PER + (tid & 127) * (BN / 2);
#pragma unroll
                for (int i = 0; i < BN / 2; i += 4) {
                    const float4 v = *(const float4 *)(o + i);
                    acc[i] += v.x, acc[i + 1] += v.y, acc[i + 2] += v.z, acc[i + 3] += v.w;
                }
            }
    }
    if constexpr (KS > 1) { // then the cluster's CTAs, in rank order, by rank 0
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        if (KW > 1) __syncthreads(); // the first group has read the others' sums
        if (rank > 0 && kw == 0) {
            float *o = red + (size_t)wm * PER + (tid & 127) * (BN / 2);
#pragma unroll
            for (int i = 0; i < BN / 2; i += 4) *(float4 *)(o + i) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
        }
        cl.sync();
        if (rank == 0 && kw == 0)
            for (int r = 1; r < KS; r++) {
                const float *o = cl.map_shared_rank(red, r) + (size_t)wm * PER + (tid & 127) * (BN / 2);
#pragma unroll
                for (int i = 0; i < BN / 2; i += 4) {
                    const float4 v = *(const float4 *)(o + i);
                    acc[i] += v.x, acc[i + 1] += v.y, acc[i + 2] += v.z, acc[i + 3] += v.w;
                }
            }
        cl.sync(); // the other CTAs' shared memory stays until rank 0 has read it
        if (rank > 0) return;
    }
    if (kw > 0) return;
    // acc[4 n + c]: row g (c < 2) or g + 8, token 8 n + 2 q + (c & 1)
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int row = row_a + (c >> 1) * 8, tok = n0 + n * 8 + 2 * q + (c & 1);
            if (row >= n_out || tok >= n_tok) continue;
            float *p = y + (size_t)tok * ldy + row;
            *p = accumulate ? *p + acc[4 * n + c] : acc[4 * n + c];
        }
#elif defined(__CUDA_ARCH__)
    __trap(); // built without sm_90a code: kc__gemmq_wg refuses every call
#endif
}

template <int TYPE, bool XP, int BN, int WM, int KW, int KS, int MINB = 1>
int launch_wg(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, cudaStream_t s) {
    constexpr size_t smem = wg_smem<BN, WM, KW>();
    static unsigned char smem_set[64];
    if (int rc = kc_smem_limit_once(gemmq_wg_kernel<TYPE, BN, WM, KW, KS, MINB, XP>, (int)smem, smem_set, __FILE__, __LINE__)) return rc;
    dim3 grid((w->n_out + 64 * WM - 1) / (64 * WM), (n_tok + BN - 1) / BN, KS), block(WM * KW * 128);
    kc_launch(gemmq_wg_kernel<TYPE, BN, WM, KW, KS, MINB, XP>, grid, block, smem, s, (const uint8_t *)w->data, (const kc_half *)w->d, x, y,
              w->n_in, w->n_out, ldy, n_tok, acc);
    KC_LAUNCH_CHECK();
}

// Tile configurations (tokens, warp groups over rows, K groups in the CTA, CTAs of a cluster
// over K, CTAs an SM): the ones gemmq_choose takes, of those measured on an H200
// (bench/RESULTS.md "2026-11-29 (eleventh session)": also two steps a stage, 128-token tiles,
// 2-3 CTAs an SM).
template <int TYPE, bool XP>
int dispatch_wg(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, cudaStream_t s, int cfg) {
    switch (cfg) {
    case 0: return launch_wg<TYPE, XP, 16, 1, 4, 2>(w, x, n_tok, y, ldy, acc, s);
    case 1: return launch_wg<TYPE, XP, 32, 1, 4, 1>(w, x, n_tok, y, ldy, acc, s);
    case 2: return launch_wg<TYPE, XP, 32, 1, 2, 2>(w, x, n_tok, y, ldy, acc, s);
    case 3: return launch_wg<TYPE, XP, 64, 1, 2, 2>(w, x, n_tok, y, ldy, acc, s);
    default: return launch_wg<TYPE, XP, 64, 2, 2, 1>(w, x, n_tok, y, ldy, acc, s);
    }
}
template <int TYPE>
int dispatch_wg(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, cudaStream_t s, int cfg, int xperm) {
    return xperm ? dispatch_wg<TYPE, true>(w, x, n_tok, y, ldy, acc, s, cfg) : dispatch_wg<TYPE, false>(w, x, n_tok, y, ldy, acc, s, cfg);
}

// Whether this build holds the sm_90a code and the device runs it (compute capability 9.0).
bool wg_device_ok() {
    static signed char ok[64];
    return sm90a_kernel_ok(gemmq_wg_kernel<DT_Q4_0, 64, 1, 2, 2, 1, true>, ok);
}

} // namespace

extern "C" int kc__gemmq_wg_ncfg(void) { return wg_device_ok() ? 5 : 0; }

// One quantized type's matrix (not a mixed one: kc__gemmq_rows splits those), cfg < kc__gemmq_wg_ncfg().
extern "C" int kc__gemmq_wg(const kc_weight *w, const kc_half *x, int n_tok, float *y, int ldy, int accumulate, int cfg,
                            int xperm, cudaStream_t s) {
    if (cfg < 0 || cfg >= kc__gemmq_wg_ncfg()) return CM_EINVAL;
    const __half *xh = (const __half *)x;
    switch (w->type) {
    case DT_Q8_0: return dispatch_wg<DT_Q8_0>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    case DT_Q4_0: return dispatch_wg<DT_Q4_0>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    case DT_Q4_1: return dispatch_wg<DT_Q4_1>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    case DT_Q5_0: return dispatch_wg<DT_Q5_0>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    case DT_Q5_1: return dispatch_wg<DT_Q5_1>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    case DT_Q4_K: return dispatch_wg<DT_Q4_K>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    case DT_Q5_K: return dispatch_wg<DT_Q5_K>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    case DT_Q6_K: return dispatch_wg<DT_Q6_K>(w, xh, n_tok, y, ldy, accumulate, s, cfg, xperm);
    default: return CM_EUNSUPPORTED;
    }
}
