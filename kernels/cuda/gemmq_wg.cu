// gemmq_wg: kc_gemmq on Hopper's wgmma (sm_90a code only: CMakeLists.txt's arka_cuda_sm90a).
//
// The mma.sync tiles of gemmq.cu read every activation fragment from shared memory once per warp
// and MMA; that traffic bounds them near 190 TFLOP/s, and at 9-64 tokens they stream the weights
// at a fifth of the bandwidth. Here a warp group multiplies 64 weight rows by BN tokens with one
// wgmma per 16 k: the weights are the A operand, dequantized in registers exactly as gemmq.cu's
// (gemmq_types.cuh: lane quad q of a 128-element step owns 32 elements, MMA i takes its element
// group i), and the activations are the B operand, read by the wgmma from shared memory.
//
// Activations. B holds, for each token, the step's 128 activations in the A fragments' k order,
// in the 128-byte-swizzled K-major layout of the descriptors (two 64-k column blocks of BN rows of
// 128 bytes). kc_matmul writes x as exactly that image when it converts it to half
// (kc__to_half_gemmq, xperm): logical k = 16 i + 8 h + 2 q + c (MMA i, c < 2) is element
// qt<T>::xe_t(ks, q, i, h, c), whose pairs qt<T>::pairs_t builds with the fewest integer
// instructions; per 64-k column block of x, the rows of all tokens (padded to 8). One thread
// then fills a stage with two bulk copies that complete a barrier's transaction count. x as it
// is (kc_gemmq's callers) takes a 4-byte cp.async a pair in xoff's order (qt<T>::pairs): index
// arithmetic on every thread. Stages: NS = 4, filled two steps ahead (256-token tiles: three,
// filled one step ahead).
//
// What bounded it (ncu, Q4_0 12288 x 4096 x 64 tokens on an H200, the version with 16-byte
// cp.async copies of x in MMA order): 455 instructions a thread a step, half of them on the ALU
// pipe (the copies' addresses; prmt + and + or + sub + mul a pair), 0.44 issued a cycle per
// scheduler, the most stalls on the weights' loads: 10.2 M instructions, 38.0 us. With x's image
// by bulk copies and pairs_t: 6.3 M, 27.9 us; with the weights' shared ring (below): 25.4 us.
//
// Weights. With x's image, each thread's raw weights of a step go through a shared ring of
// wg_nw() stages (cp.async, one group a step, NW - 1 steps ahead) where it fits; else (x as it
// is, or too little shared memory) into registers two steps ahead (two raw sets, by step parity).
//
// Work split. A CTA owns 64 WM rows (WM warp groups over rows, sharing each B tile) and BN tokens;
// the K steps are split KW ways inside the CTA (groups of WM warp groups, each with its own
// stages and named barrier) and KS ways over a cluster of CTAs along z. Split s = rank KW + kw takes
// steps s, s + KW KS, ...; the partial sums are added in a fixed order at the end (first the
// CTA's K groups through shared memory, then the cluster's CTAs through distributed shared
// memory), so an output's summation order depends on KW, KS and n_in only: batch-invariant.
// The first K group of the cluster's first CTA then stages the sums in shared memory and writes
// y a token's 64 WM rows at a time (16 bytes a thread, the residual of wo and down read
// coalesced). Tiles of 16-64 tokens serve decode batches; 128 and 256 (wgmma m64n256k16, 128
// accumulators a thread) large batches and prefill, where a weight is dequantized once for that
// many tokens.
//
// F16 weights take the same kernel with nothing to dequantize (qt<DT_F16>: a lane quad's 16-byte
// pieces of a row are the A fragments' pairs as they are, x's image of order 3 in the matching k
// order). For an interleaved gate|up matrix the epilogue can compute the gated activation instead
// of writing y (kc_wg_glu: the f32 activation and down's image).
//
// Within a step, MMAs 0-3 and 4-7 use two fragment sets, so the dequantization of one half
// overlaps the other half's wgmma.
#include "gemmq_types.cuh"
#include "wgmma.cuh"

extern "C" {
#include "kcuda.h"
}

namespace {

// activation stages per K group: four (filled two steps ahead), three for 256-token tiles (64
// KiB a stage; filled one step ahead, a step being ~2,000 cycles of wgmma there)
template <int BN> __host__ __device__ constexpr int wg_ns() { return BN >= 256 ? 3 : 4; }

constexpr size_t WG_SMEM_MAX = 227 * 1024; // an SM's shared memory for one CTA

// The weights' shared ring (x's image only: XP): a warp group's stage holds each thread's raw
// weights of one step, both rows, as loadv reads them: its 16-, 8- and 4-byte items each in a
// column of the group's 128 threads (conflict-free loads). wg_nw() stages where they fit beside
// the activation stages (up to 6), else 0: the weights stream into registers two steps ahead.
template <int TYPE> __host__ __device__ constexpr size_t wg_ring_stage() {
    return (size_t)256 * (16 * qt<TYPE>::N16 + 8 * qt<TYPE>::N8 + 4 * qt<TYPE>::N4);
}
template <int TYPE, int BN, int WM, int KW, bool XP> __host__ __device__ constexpr int wg_nw() {
    constexpr size_t xst = (size_t)KW * wg_ns<BN>() * BN * 256, fixed = xst + KW * wg_ns<BN>() * 8 + 1024;
    constexpr size_t n = fixed < WG_SMEM_MAX ? (WG_SMEM_MAX - fixed) / (WM * KW * wg_ring_stage<TYPE>()) : 0;
    // Q8_0 (36 bytes a row and step) ran slower from the ring than from registers (H200, 16
    // tokens: 146 against 114 us a llama2-7b layer)
    return XP && n >= 3 && TYPE != DT_Q8_0 ? (n > 6 ? 6 : (int)n) : 0;
}
// activation stages and the ring, or the partial sums of the K groups past the first (the
// larger); then the stages' barriers, and 1 KiB for the alignment
template <int TYPE, int BN, int WM, int KW, bool XP> __host__ __device__ constexpr size_t wg_bar_off() {
    constexpr size_t st = (size_t)KW * wg_ns<BN>() * BN * 256 + (size_t)WM * KW * wg_nw<TYPE, BN, WM, KW, XP>() * wg_ring_stage<TYPE>();
    constexpr size_t red = (size_t)(KW > 1 ? KW - 1 : 1) * WM * 128 * (BN / 2) * 4;
    return st > red ? st : red;
}
template <int TYPE, int BN, int WM, int KW, bool XP> constexpr size_t wg_smem() {
    return wg_bar_off<TYPE, BN, WM, KW, XP>() + KW * wg_ns<BN>() * 8 + 1024;
}

#ifdef KC_SM90A_DEVICE
__device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t a) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}
// loadv's items into a thread's ring stage (b16 / b8 / b4: its columns' first entries; a u16 as
// the aligned word holding it), issued as cp.async ...
struct acc_cp {
    uint32_t b16, b8, b4;
    int i16 = 0, i8 = 0, i4 = 0;
    __device__ __forceinline__ uint4 u4(const void *p) {
        kc_cp_async16(b16 + 2048 * i16++, p, true);
        return make_uint4(0, 0, 0, 0);
    }
    __device__ __forceinline__ uint2 u2(const void *p) {
        kc_cp_async8(b8 + 1024 * i8++, p);
        return make_uint2(0, 0);
    }
    __device__ __forceinline__ uint32_t u32(const void *p) {
        kc_cp_async4(b4 + 512 * i4++, p, true);
        return 0;
    }
    __device__ __forceinline__ unsigned short u16(const void *p) {
        kc_cp_async4(b4 + 512 * i4++, (const void *)((uintptr_t)p & ~(uintptr_t)3), true);
        return 0;
    }
};
// ... and read back in the same order
struct acc_lds {
    uint32_t b16, b8, b4;
    int i16 = 0, i8 = 0, i4 = 0;
    __device__ __forceinline__ uint4 u4(const void *) { return lds128(b16 + 2048 * i16++); }
    __device__ __forceinline__ uint2 u2(const void *) { return lds64(b8 + 1024 * i8++); }
    __device__ __forceinline__ uint32_t u32(const void *) { return lds32(b4 + 512 * i4++); }
    __device__ __forceinline__ unsigned short u16(const void *p) {
        const uint32_t v = lds32(b4 + 512 * i4++);
        return (unsigned short)((uintptr_t)p & 2 ? v >> 16 : v & 0xFFFF);
    }
};
#endif

#ifdef KC_SM90A_DEVICE
// One MMA half (elements groups 4 hf .. 4 hf + 3) of the step: fragments from the raw weights of
// rows g and g + 8, then its four wgmma on the stage of low descriptor word bl (warp-uniform:
// each descriptor one uniform add).
template <int TYPE, int BN, bool XP>
__device__ __forceinline__ void wg_half(float (&acc)[BN / 2], uint32_t (&f)[4][4], const typename qt<TYPE>::raw (&cur)[2],
                                        int hf, uint32_t bl) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (XP) {
            qt<TYPE>::pairs_t(cur[0], 4 * hf + k, f[k][0], f[k][2]);
            qt<TYPE>::pairs_t(cur[1], 4 * hf + k, f[k][1], f[k][3]);
        } else {
            qt<TYPE>::pairs(cur[0], 4 * hf + k, f[k][0], f[k][2]);
            qt<TYPE>::pairs(cur[1], 4 * hf + k, f[k][1], f[k][3]);
        }
    }
    reg_fence(f);
    reg_fence(acc);
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; k++) wgmma_rs<BN>::mma(acc, f[k], sw128_join(bl + ((hf * BN * 128 + k * 32) >> 4), 1024));
    wg_commit();
}
#endif

template <int TYPE, int BN, int WM, int KW, int KS, int MINB, bool XP>
__global__ void __cluster_dims__(1, 1, KS) __launch_bounds__(WM * KW * 128, MINB)
gemmq_wg_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ D, const __half *x, float *y, int n_in, int n_out,
                int ldy, int n_tok, int accumulate, kc_wg_glu ep) {
#ifdef KC_SM90A_DEVICE
    typedef qt<TYPE> T;
    typedef typename T::raw raw;
    constexpr int KT = WM * 128;   // threads of a K group
    constexpr int STAGE = BN * 256; // bytes of one activation stage
    constexpr int WG_NS = wg_ns<BN>(), PD = WG_NS - 2; // stages; steps filled ahead
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
    // The weights of the first steps stream in before the wait (nothing writes them): into
    // registers two steps ahead, or the ring NW - 1 steps ahead (a cp.async group a step).
    constexpr int NW = wg_nw<TYPE, BN, WM, KW, XP>();
    constexpr uint32_t RS = (uint32_t)wg_ring_stage<TYPE>();
    const uint32_t ring = sbase + KW * WG_NS * STAGE + (uint32_t)wg * NW * RS + (tid & 127) * 16;
    auto ring_acc = [&](auto &a, int j) { // thread's columns in ring stage j % NW
        const uint32_t st = ring + (NW > 0 ? j % NW : 0) * RS;
        a.b16 = st;
        a.b8 = st + (uint32_t)(2 * T::N16) * 2048 - (tid & 127) * 8;
        a.b4 = a.b8 + (uint32_t)(2 * T::N8) * 1024 - (tid & 127) * 4;
    };
    auto issue_w = [&](int j) { // step j's weights into the ring; one group, empty past the end
        if (j < nj) {
            acc_cp a;
            ring_acc(a, j);
            raw r;
            T::loadv(r, a, W, D, rows[0], n_in, split + j * nsplit, q);
            T::loadv(r, a, W, D, rows[1], n_in, split + j * nsplit, q);
        }
        kc_cp_async_commit();
    };
    raw pre0[2], pre1[2];
    if constexpr (NW > 0) {
#pragma unroll 1
        for (int i = 0; i < NW - 1; i++) issue_w(i);
    } else {
        if (nj > 0) load_w(pre0, 0);
        if (nj > 1) load_w(pre1, 1);
    }
    // XP: stage s of K group kw is full when barrier full + 8 s completes a phase
    const uint32_t full = sbase + (uint32_t)wg_bar_off<TYPE, BN, WM, KW, XP>() + kw * WG_NS * 8;
    if constexpr (XP) {
        if (kt == 0) {
#pragma unroll
            for (int i = 0; i < WG_NS; i++) mbar_init(full + 8 * i, 1);
            mbar_init_fence();
        }
        __syncthreads();
    }
    const int ntp = (n_tok + 7) & ~7; // XP: x's rows a column block, padded to 8
    kc_pdl_wait();

    // the activations of step j into stage j % NS. XP: x holds the stage's image already
    // (kc__to_half_gemmq): for each 64-k column block of the step, the rows of the tokens, 128
    // swizzled bytes each; one thread copies the stage's two column blocks by the bulk-copy
    // engine. Else a token's 64 pairs, lane order = the pairs' order in x (coalesced reads);
    // pair p of quad q, group i, half h goes to 16-byte piece 2 (i % 4) + h of column block i / 4,
    // word q.
    auto stage_x = [&](int j) {
        if constexpr (XP) {
            if (j < nj && kt == 0) {
                const int ks = split + j * nsplit;
                const uint32_t st = sb + (j % WG_NS) * STAGE, bar = full + 8 * (j % WG_NS);
                const __half *src = x + ((size_t)(2 * ks) * ntp + n0) * 64;
                mbar_arrive_tx(bar, 2 * BN * 128);
                bulk_g2s(st, src, BN * 128, bar);
                bulk_g2s(st + BN * 128, src + (size_t)ntp * 64, BN * 128, bar);
            }
            return;
        }
        if (j < nj) {
            const int ks = split + j * nsplit;
            const uint32_t st = sb + (j % WG_NS) * STAGE;
            for (int idx = kt; idx < BN * 64; idx += KT) {
                const int t = idx >> 6, p = idx & 63, pq = p >> 4, pi = (p >> 1) & 7, ph = p & 1;
                const __half *src = x + (size_t)min(n0 + t, n_tok - 1) * n_in + T::xoff(ks, pq, pi) + 2 * ph;
                const uint32_t dst = st + (pi >> 2) * BN * 128 + t * 128 + ((((2 * (pi & 3) + ph) ^ (t & 7))) << 4) + 4 * pq;
                kc_cp_async4(dst, src, true);
            }
        }
        kc_cp_async_commit(); // one group a step, empty past the end
    };
#pragma unroll
    for (int i = 0; i < PD; i++) stage_x(i);

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    uint32_t fa[4][4], fb[4][4];
    const int bar = 1 + kw;
    // step j, its weights in pre (replaced at once by step j + 2's: the copy cur is multiplied)
    auto step = [&](int j, raw(&pre)[2]) {
        if constexpr (XP) {
            mbar_wait(full + 8 * (j % WG_NS), (j / WG_NS) & 1); // stage j has landed
        } else {
            kc_cp_async_wait<PD - 1>(); // this thread's copies of stage j have landed
            fence_proxy_async();
        }
        // everyone's; stage j + PD's slot, last read by step j + PD - NS = j - 2, is free (each
        // thread waited in step j - 1 until its step j - 2's wgmma were done)
        asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(KT) : "memory");
        stage_x(j + PD);
        raw cur[2];
        if constexpr (NW > 0) {
            kc_cp_async_wait<NW - 2>(); // this thread's copies of step j's weights have landed
            acc_lds a;
            ring_acc(a, j);
            T::loadv(cur[0], a, W, D, rows[0], n_in, split + j * nsplit, q);
            T::loadv(cur[1], a, W, D, rows[1], n_in, split + j * nsplit, q);
            issue_w(j + NW - 1); // into step j - 1's stage, read in that step
        } else {
            cur[0] = pre[0];
            cur[1] = pre[1];
            if (j + 2 < nj) load_w(pre, j + 2);
        }
        const uint32_t bl = kc_uniform(sw128_lo(sb + (j % WG_NS) * STAGE, 16)); // stage j % WG_NS
        wg_wait<1>(); // the last step's first half has finished with fa
        reg_fence(fa);
        wg_half<TYPE, BN, XP>(acc, fa, cur, 0, bl);
        wg_wait<1>(); // the last step's second half has finished with fb
        reg_fence(fb);
        wg_half<TYPE, BN, XP>(acc, fb, cur, 1, bl);
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

    // the K groups' and the cluster's partial sums, added in order by the first K group of rank 0
    __syncthreads(); // every stage read and landed: the shared memory takes the sums
    if (!ksplit_sum<KW, KS, WM, BN / 2>(acc, (float *)smem, kw, wm, tid & 127, rank)) return;
    // The CTA's outputs through shared memory (a token's rows contiguous, 4 floats of padding:
    // conflict-free writes), then into y a token's 64 WM rows at a time, 16 bytes a thread: wo's
    // and down's residual (accumulate) read coalesced and all in flight. acc[4 n + c]: row g
    // (c < 2) or g + 8 of the warp's 16, token 8 n + 2 q + (c & 1). Each thread of the first K
    // group did its reads of the others' sums before the barrier.
    constexpr int SR = 64 * WM + 4, R4 = 16 * WM, ET = WM * 128; // staging row; float4 a token; threads
    static_assert((size_t)BN * SR * 4 <= wg_bar_off<TYPE, BN, WM, KW, XP>(), "gemmq_wg: the output staging");
    float *stg = (float *)smem;
    asm volatile("bar.sync 8, %0;" ::"n"(ET) : "memory");
    const int rl = 64 * wm + 16 * warp + g; // this thread's row in the CTA (row_a's)
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) stg[(n * 8 + 2 * q + (c & 1)) * SR + rl + (c >> 1) * 8] = acc[4 * n + c];
    asm volatile("bar.sync 8, %0;" ::"n"(ET) : "memory");
    const int r0 = blockIdx.x * 64 * WM;
    if (ep.out || ep.img) { // gate|up: output j from rows 2j and 2j + 1, four outputs (8 rows) a thread
        constexpr int R8 = 8 * WM;
        const int n_ff = n_out / 2;
        const img_out im{ ep.img, ep.img_order, ep.img_ntp, n_ff };
        for (int i = tid; i < BN * R8; i += ET) {
            const int t = i / R8, r = (i % R8) * 8, tok = n0 + t, row = r0 + r;
            if (tok >= n_tok) break; // i grows with t
            if (row >= n_out) continue;
            const float4 a = *(const float4 *)(stg + t * SR + r), b = *(const float4 *)(stg + t * SR + r + 4);
            const float4 o = ep.gelu ? kc_glu4<true>(a, b) : kc_glu4<false>(a, b);
            const int j = row >> 1;
            if (ep.out) *(float4 *)(ep.out + (size_t)tok * n_ff + j) = o;
            if (ep.img) img_store4(im, o, tok, j);
        }
        return;
    }
    const bool vec = ((uintptr_t)y & 15) == 0 && (ldy & 3) == 0;
    for (int i = tid; i < BN * R4; i += ET) {
        const int t = i / R4, r = (i % R4) * 4, tok = n0 + t, row = r0 + r;
        if (tok >= n_tok) break; // i grows with t
        const float *sp = stg + t * SR + r;
        float *yp = y + (size_t)tok * ldy + row;
        if (vec && row + 3 < n_out) {
            float4 v = *(const float4 *)sp;
            if (accumulate) {
                const float4 o = *(const float4 *)yp;
                v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
            }
            *(float4 *)yp = v;
        } else {
            for (int k = 0; k < 4 && row + k < n_out; k++) yp[k] = accumulate ? yp[k] + sp[k] : sp[k];
        }
    }
#elif defined(__CUDA_ARCH__)
    __trap(); // built without sm_90a code: kc__gemmq_wg refuses every call
#endif
}

template <int TYPE, bool XP, int BN, int WM, int KW, int KS, int MINB = 1>
int launch_wg(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, const kc_wg_glu &ep, cudaStream_t s) {
    constexpr size_t smem = wg_smem<TYPE, BN, WM, KW, XP>();
    static_assert(smem <= WG_SMEM_MAX, "gemmq_wg: shared memory");
    static unsigned char smem_set[64];
    if (int rc = kc_smem_limit_once(gemmq_wg_kernel<TYPE, BN, WM, KW, KS, MINB, XP>, (int)smem, smem_set, __FILE__, __LINE__)) return rc;
    dim3 grid((w->n_out + 64 * WM - 1) / (64 * WM), (n_tok + BN - 1) / BN, KS), block(WM * KW * 128);
    kc_launch(gemmq_wg_kernel<TYPE, BN, WM, KW, KS, MINB, XP>, grid, block, smem, s, (const uint8_t *)w->data, (const kc_half *)w->d, x, y,
              w->n_in, w->n_out, ldy, n_tok, acc, ep);
    KC_LAUNCH_CHECK();
}

// Tile configurations (tokens, warp groups over rows, K groups in the CTA, CTAs of a cluster
// over K, CTAs an SM): the ones gemmq_choose takes, of those measured on an H200
// (bench/RESULTS.md "2026-11-29 (eleventh session)": also two steps a stage, 128-token tiles,
// 2-3 CTAs an SM).
template <int TYPE, bool XP>
int dispatch_wg(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, const kc_wg_glu &ep, cudaStream_t s, int cfg) {
    if constexpr (!XP) cfg = cfg < 4 ? cfg : 4; // x as it is: the tiles up to 64 tokens
    switch (cfg) {
    case 0: return launch_wg<TYPE, XP, 16, 1, 4, 2>(w, x, n_tok, y, ldy, acc, ep, s);
    case 1: return launch_wg<TYPE, XP, 32, 1, 4, 1>(w, x, n_tok, y, ldy, acc, ep, s);
    case 2: return launch_wg<TYPE, XP, 32, 1, 2, 2>(w, x, n_tok, y, ldy, acc, ep, s);
    case 3: return launch_wg<TYPE, XP, 64, 1, 2, 2>(w, x, n_tok, y, ldy, acc, ep, s);
    case 4: return launch_wg<TYPE, XP, 64, 2, 2, 1>(w, x, n_tok, y, ldy, acc, ep, s);
    default: break;
    }
    // Large batches and prefill: 128 and 256 tokens a tile, so that a weight is dequantized once
    // for that many tokens; on x's image only. Measured and
    // not kept: 256-token tiles split over a cluster (never the fastest of a llama2-7b matrix from
    // 9 to 1,024 tokens; bench/RESULTS.md "2026-11-29 (thirteenth session)").
    if constexpr (XP) {
        switch (cfg) {
        case 5: return launch_wg<TYPE, XP, 128, 2, 1, 1>(w, x, n_tok, y, ldy, acc, ep, s);
        case 6: return launch_wg<TYPE, XP, 128, 2, 1, 2>(w, x, n_tok, y, ldy, acc, ep, s);
        case 7: return launch_wg<TYPE, XP, 256, 2, 1, 1>(w, x, n_tok, y, ldy, acc, ep, s);
        // One warp group a CTA, up to three CTAs an SM (Q8_0: 160 registers a thread at 64 tokens,
        // so one 256-thread CTA an SM before), alone or split over a cluster of two along K: one
        // CTA's start and end overlap the others' steps, and the grid's last wave is a third of
        // an SM's. wg_nw sizes the weights' ring for one CTA an SM, so the types that take one
        // fit fewer (at 64 tokens Q4_0 two an SM, the K-quants one: 113-125 KiB a CTA; at 32
        // tokens Q4_0 three, the K-quants two); Q8_0 (registers) fits three. Where gemmq_choose
        // takes them, and the times: gemmq.cu, bench/RESULTS.md "2026-12-01 (thirty-second session)".
        case 8: return launch_wg<TYPE, XP, 64, 1, 1, 1, 3>(w, x, n_tok, y, ldy, acc, ep, s);
        case 9: return launch_wg<TYPE, XP, 32, 1, 1, 1, 3>(w, x, n_tok, y, ldy, acc, ep, s);
        case 10: return launch_wg<TYPE, XP, 64, 1, 1, 2, 3>(w, x, n_tok, y, ldy, acc, ep, s);
        default: return launch_wg<TYPE, XP, 32, 1, 1, 2, 3>(w, x, n_tok, y, ldy, acc, ep, s);
        }
    }
    return CM_EINVAL; // not reached
}
template <int TYPE>
int dispatch_wg(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, const kc_wg_glu &ep, cudaStream_t s, int cfg,
                int xperm) {
    return xperm ? dispatch_wg<TYPE, true>(w, x, n_tok, y, ldy, acc, ep, s, cfg) : dispatch_wg<TYPE, false>(w, x, n_tok, y, ldy, acc, ep, s, cfg);
}

// F16 weights (x's image of order 3 only; qt<DT_F16>): nothing to dequantize, so the tiles stream
// 16 KiB a warp group and step through the ring; one K group. The three configurations
// kc__gemmq_f16_cfg chooses: 64 tokens on 64- or 128-row CTAs in clusters of two along K (down,
// qkv at 33-64 tokens), 128 tokens on 128-row CTAs (gate|up at 65-128). Measured on llama3-8b's
// matrices and not kept: 32-token tiles, 64- and 128-token tiles in clusters of four, 128-token
// tiles of 64 rows (bench/RESULTS.md "2026-11-29 (fourteenth session)"). 0 and 1 sum in one order.
int dispatch_wg_f16(const kc_weight *w, const __half *x, int n_tok, float *y, int ldy, int acc, const kc_wg_glu &ep, cudaStream_t s, int cfg) {
    switch (cfg) {
    case 0: return launch_wg<DT_F16, true, 64, 1, 1, 2>(w, x, n_tok, y, ldy, acc, ep, s);
    case 1: return launch_wg<DT_F16, true, 64, 2, 1, 2>(w, x, n_tok, y, ldy, acc, ep, s);
    case 2: return launch_wg<DT_F16, true, 128, 2, 1, 1>(w, x, n_tok, y, ldy, acc, ep, s);
    default: return CM_EINVAL;
    }
}

// Whether this build holds the sm_90a code and the device runs it (compute capability 9.0).
bool wg_device_ok() {
    static signed char ok[64];
    return sm90a_kernel_ok(gemmq_wg_kernel<DT_Q4_0, 64, 1, 2, 2, 1, true>, ok);
}

} // namespace

extern "C" int kc__gemmq_wg_ncfg(void) { return wg_device_ok() ? 12 : 0; }

// One quantized type's matrix (not a mixed one: kc__gemmq_rows splits those), or an F16 one on x's
// image, cfg < kc__gemmq_wg_ncfg().
extern "C" int kc__gemmq_wg(const kc_weight *w, const kc_half *x, int n_tok, float *y, int ldy, int accumulate, int cfg,
                            int xperm, const kc_wg_glu *glu, cudaStream_t s) {
    if (cfg < 0 || cfg >= kc__gemmq_wg_ncfg()) return CM_EINVAL;
    const kc_wg_glu none = {}, &ep = glu ? *glu : none;
    const kc_pdl_scope pdl_cls((w->type == DT_F16 ? KC_PDL_WGF16 : w->type == DT_Q8_0 ? KC_PDL_WGQ8 : KC_PDL_WG0) + cfg);
    if ((ep.out || ep.img) && (w->n_out % 8 || accumulate || ((uintptr_t)ep.out & 15) || (ep.img && n_tok > ep.img_ntp))) return CM_EINVAL;
    const __half *xh = (const __half *)x;
    switch (w->type) {
    case DT_Q8_0: return dispatch_wg<DT_Q8_0>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_Q4_0: return dispatch_wg<DT_Q4_0>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_Q4_1: return dispatch_wg<DT_Q4_1>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_Q5_0: return dispatch_wg<DT_Q5_0>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_Q5_1: return dispatch_wg<DT_Q5_1>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_Q4_K: return dispatch_wg<DT_Q4_K>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_Q5_K: return dispatch_wg<DT_Q5_K>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_Q6_K: return dispatch_wg<DT_Q6_K>(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg, xperm);
    case DT_F16: return xperm == 3 ? dispatch_wg_f16(w, xh, n_tok, y, ldy, accumulate, ep, s, cfg) : CM_EINVAL;
    default: return CM_EUNSUPPORTED;
    }
}
