// gemm_f8_wg: F8_E4M3 weights times a KC_X_F8 image (E4M3 codes of the activations, one scale a
// token) on Hopper's FP8 wgmma, with the weight rows' and the tokens' scales and the residual in
// the one launch (sm_90a code only: CMakeLists.txt's arka_cuda_sm90a).
//
// Why: past the GEMV, cuBLASLt's FP8 GEMM applies the scales either as outer vectors (its one
// algorithm for them: llama3-8b's wo at 16 tokens 15.6 us) or in a second launch after a
// unit-scale GEMM (7.7 us plus the pass). Where these tiles are faster is timed at start-up
// (kc_matmul_tune_f8); on an H200 that is 16-32 tokens for every llama3-8b matrix and some shapes
// at 64 (wo at 16: 7.2 us), never 128-256, where a step's wait for its wgmma (below) costs more
// than cuBLASLt's whole GEMM (bench/RESULTS.md, thirty-seventh session).
//
// Tile. A CTA owns 64 WM weight rows (WM warp groups, each the A operand of its own wgmma, m64)
// and BN tokens (the B operand, n = BN, shared by the warp groups). A K step is 128 codes: the
// stage holds the rows' and the tokens' 128 bytes each in the 128-byte-swizzled K-major layout
// of the descriptors, as the bulk-copy engine writes a tensor map's box (rows past the matrix or
// the tokens read as zeros). The K steps are split KW ways inside the CTA (K groups of WM warp
// groups, each with its own stages and barriers: a group takes every KW-th step) and KS ways
// over a cluster of CTAs (contiguous shares). A K group's first thread fills its stages (as many
// as fit 200 KiB, at most 8; the weights of the first ones before the programmatic wait) and
// refills each once every warp of the group has arrived on its empty barrier; the warp groups
// wait only for their stage, not for each other. A step is four m64nBNk32 wgmma, 32 bytes
// further along the rows each.
// Measured on the way (wo at 16 tokens): 16-byte cp.async copies three steps ahead with a CTA
// barrier a step, 14.5 us at best; the bulk copies eight steps ahead, one K group, 10.8 us; K
// groups and 16-token tiles, 7.2 us.
//
// Accumulation. Hopper's FP8 MMA keeps a narrower sum than f32 (cuBLASLt's default mode adds its
// partial sums in f32 at intervals too): each step's four wgmma start a fresh partial (scale-d 0),
// added into the f32 accumulators once they are done. (Two partials in turn, one added while the
// next step's wgmma run, gain nothing: ptxas then waits for every wgmma before the add anyway.)
// The other K groups keep the tensor cores busy meanwhile. The sum of an output is therefore in
// a fixed order: a K group's steps in order, the CTA's K groups in order (through shared memory),
// then the cluster's CTAs in rank order (through distributed shared memory); it depends on the
// configuration and n_in only, not on the token count (batch-invariant within a configuration).
// Fast accumulation (FA, the configurations timed under the plan's fp8_fast_accum): every step's
// wgmma add into the accumulators themselves, one step's in flight while the next is issued (no
// wait a step); ~1e-3 off the f32 partials' sums at 4,096 codes a row. Even so, 128- and
// 256-token tiles stay 1.5-2x slower than cuBLASLt at 128-512 tokens on an H200 (qkv at 256:
// 21.0 us against 13.2; bench/RESULTS.md, thirty-ninth session): the tune keeps them at 16-32.
//
// Epilogue: y[t][r] (+)= sum x sw[r] x sx[t], written from the accumulators (a warp's 8 rows of
// a token are 32 contiguous bytes).
#include "kc_common.cuh"
#include "wgmma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdio.h>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

namespace {

constexpr int F8K = 128; // codes a K step
constexpr size_t F8_SMEM = 200 * 1024; // the stages' budget: one CTA an SM

template <int WM, int BN> __host__ __device__ constexpr size_t f8wg_stage() { return (size_t)(64 * WM + BN) * F8K; }
// stages of a K group: as many as fit the budget, at most 8
template <int WM, int BN, int KW> __host__ __device__ constexpr int f8wg_ns() {
    return F8_SMEM / (KW * f8wg_stage<WM, BN>()) > 8 ? 8 : (int)(F8_SMEM / (KW * f8wg_stage<WM, BN>()));
}
// the stages, or the partial sums of the K groups past the first (at least one group's, for the
// cluster's); then the barriers, and 1 KiB for the alignment
template <int WM, int BN, int KW> __host__ __device__ constexpr size_t f8wg_bar_off() {
    constexpr size_t st = (size_t)KW * f8wg_ns<WM, BN, KW>() * f8wg_stage<WM, BN>(),
                     red = (size_t)(KW > 1 ? KW - 1 : 1) * WM * 128 * (BN / 2) * 4;
    return st > red ? st : red;
}
template <int WM, int BN, int KW> __host__ __device__ constexpr size_t f8wg_smem() {
    return f8wg_bar_off<WM, BN, KW>() + 2 * 8 * KW * f8wg_ns<WM, BN, KW>() + 1024;
}

#ifdef KC_SM90A_DEVICE
// D (m64nN, f32) = scale_d D + A (64 x 32 codes, shared, K-major) B (32 x N codes, shared, K-major)
template <int N> struct wgmma_f8;
template <> struct wgmma_f8<16> {
    __device__ static __forceinline__ void mma(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7}, "
                     "%8, %9, p, 1, 1;\n}\n"
                     : KC_F8(d, 0)
                     : "l"(da), "l"(db), "r"(scale_d));
    }
};
template <> struct wgmma_f8<32> {
    __device__ static __forceinline__ void mma(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                     "%16, %17, p, 1, 1;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8)
                     : "l"(da), "l"(db), "r"(scale_d));
    }
};
template <> struct wgmma_f8<64> {
    __device__ static __forceinline__ void mma(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "%32, %33, p, 1, 1;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8), KC_F8(d, 16), KC_F8(d, 24)
                     : "l"(da), "l"(db), "r"(scale_d));
    }
};
template <> struct wgmma_f8<128> {
    __device__ static __forceinline__ void mma(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "%64, %65, p, 1, 1;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8), KC_F8(d, 16), KC_F8(d, 24),
                       KC_F8(d, 32), KC_F8(d, 40), KC_F8(d, 48), KC_F8(d, 56)
                     : "l"(da), "l"(db), "r"(scale_d));
    }
};
template <> struct wgmma_f8<256> {
    __device__ static __forceinline__ void mma(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" KC_WG_ACC128 "}, "
                     "%128, %129, p, 1, 1;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8), KC_F8(d, 16), KC_F8(d, 24), KC_F8(d, 32), KC_F8(d, 40), KC_F8(d, 48), KC_F8(d, 56),
                       KC_F8(d, 64), KC_F8(d, 72), KC_F8(d, 80), KC_F8(d, 88), KC_F8(d, 96), KC_F8(d, 104), KC_F8(d, 112), KC_F8(d, 120)
                     : "l"(da), "l"(db), "r"(scale_d));
    }
};
#endif

#ifdef KC_SM90A_DEVICE
// A 2-D tile of a tensor map (box at coordinates c0 (the codes), c1 (rows)) into shared memory
// by the bulk-copy engine, completing bar's transaction count.
__device__ __forceinline__ void tma_2d(uint32_t saddr, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(saddr),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
#endif

template <int WM, int BN, int KW, int KS, bool FA>
__global__ void __cluster_dims__(1, 1, KS) __launch_bounds__(KW * WM * 128, 1)
gemm_f8_wg_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, const float *__restrict__ sw,
                  const float *sx, float *y, int n_in, int n_out, int ldy, int n_tok, int accumulate) {
#ifdef KC_SM90A_DEVICE
    constexpr int AR = 64 * WM, NS = f8wg_ns<WM, BN, KW>(), KT = WM * 128; // weight rows of the CTA; stages; threads of a K group
    constexpr uint32_t STAGE = (uint32_t)f8wg_stage<WM, BN>(), ABYTES = AR * F8K;
    static_assert(!FA || NS >= 3, "gemm_f8_wg: fast accumulation refills a stage two steps late");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (kc_smem_addr(smem_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, wg = tid >> 7, wm = wg % WM, kw = wg / WM, kt = tid % KT;
    const int warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const uint32_t sbase = kc_smem_addr(smem) + (uint32_t)(kw * NS) * STAGE; // this K group's stages
    const uint32_t full = kc_smem_addr(smem) + (uint32_t)f8wg_bar_off<WM, BN, KW>() + 16 * NS * kw, empty = full + 8 * NS;
    const int rank = KS > 1 ? (int)blockIdx.z : 0;
    const int r0 = blockIdx.x * AR, n0 = blockIdx.y * BN;
    // this CTA's K steps, a contiguous share of the row; K group kw takes s0 + kw, s0 + kw + KW, ...
    const int nsteps = n_in / F8K, s0 = (int)((long)nsteps * rank / KS), s1 = (int)((long)nsteps * (rank + 1) / KS);
    const int nj = s1 - s0 > kw ? (s1 - s0 - kw + KW - 1) / KW : 0;
    auto kstep = [&](int j) { return (s0 + kw + j * KW) * F8K; };

    // Stage j % NS of a K group is full when its barrier full + 8 (j % NS) completes the phase of
    // step j (the group's first thread arms it for both tiles' bytes, the bulk copies complete
    // it); empty when every warp of the group has arrived on empty + 8 (j % NS) after its wgmma of
    // step j. The first thread refills the slot of step j - 1 once it is empty, with step j - 1 + NS.
    if (kt == 0) {
        for (int i = 0; i < NS; i++) {
            mbar_init(full + 8 * i, 1);
            mbar_init(empty + 8 * i, WM * 4);
        }
        mbar_init_fence();
        asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&tw) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&tx) : "memory");
        // the weights of the first steps before the wait (nothing writes them)
        for (int i = 0; i < NS && i < nj; i++) {
            mbar_arrive_tx(full + 8 * i, STAGE);
            tma_2d(sbase + i * STAGE, &tw, kstep(i), r0, full + 8 * i);
        }
    }
    kc_pdl_wait();
    if (kt == 0)
        for (int i = 0; i < NS && i < nj; i++) tma_2d(sbase + i * STAGE + ABYTES, &tx, kstep(i), n0, full + 8 * i);
    __syncthreads(); // the barriers' initialization is visible to every thread

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    const uint32_t a_off = (uint32_t)wm * 64 * 128;
    // f32 partials (FA false): step j's four wgmma start a fresh partial p, added into acc once
    // done, and the stage is released at once. Fast accumulation: they add into acc itself, one
    // step's in flight while the next is issued, so step j - 1's stage is released at step j.
    // The first thread refills a slot LAG steps after its step, once every warp released it.
    float p[FA ? 1 : BN / 2];
#pragma unroll
    for (int i = 0; i < (FA ? 1 : BN / 2); i++) p[i] = 0.0f;
    constexpr int LAG = FA ? 2 : 1;
#pragma unroll 1
    for (int j = 0; j < nj; j++) {
        const int sl = j % NS;
        mbar_wait(full + 8 * sl, (j / NS) & 1);
        const uint32_t st = sbase + (uint32_t)sl * STAGE;
        const uint32_t al = kc_uniform(sw128_lo(st + a_off, 16)), bl = kc_uniform(sw128_lo(st + ABYTES, 16));
        if constexpr (FA) {
            reg_fence(acc);
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; k++) wgmma_f8<BN>::mma(acc, sw128_join(al + 2 * k, 1024), sw128_join(bl + 2 * k, 1024), 1);
            wg_commit();
            wg_wait<1>();
            reg_fence(acc);
            if (j >= 1) {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + 8 * ((j - 1) % NS));
            }
        } else {
            reg_fence(p);
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; k++) wgmma_f8<BN>::mma(p, sw128_join(al + 2 * k, 1024), sw128_join(bl + 2 * k, 1024), k);
            wg_commit();
            wg_wait<0>();
            reg_fence(p);
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + 8 * sl);
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[i] += p[i];
        }
        if (kt == 0 && j >= LAG && j - LAG + NS < nj) { // step j - LAG's slot, once every warp is done with it
            const int jr = j - LAG, sr = jr % NS;
            mbar_wait(empty + 8 * sr, (jr / NS) & 1);
            mbar_arrive_tx(full + 8 * sr, STAGE);
            tma_2d(sbase + sr * STAGE, &tw, kstep(jr + NS), r0, full + 8 * sr);
            tma_2d(sbase + sr * STAGE + ABYTES, &tx, kstep(jr + NS), n0, full + 8 * sr);
        }
    }
    if constexpr (FA) {
        wg_wait<0>();
        reg_fence(acc);
    }
    kc_pdl_trigger();

    // the K groups' and the cluster's partial sums, added in order by the first K group of rank 0
    if constexpr (KW > 1 || KS > 1) __syncthreads(); // every stage read: the shared memory takes the sums
    if (!ksplit_sum<KW, KS, WM, BN / 2>(acc, (float *)smem, kw, wm, tid & 127, rank)) return;
    // acc[4 n + c]: row g (c < 2) or g + 8 of the warp's 16, token 8 n + 2 q + (c & 1)
    const int ra = r0 + 64 * wm + 16 * warp + g;
    const float swa = ra < n_out ? sw[ra] : 0.0f, swb = ra + 8 < n_out ? sw[ra + 8] : 0.0f;
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int tok = n0 + 8 * n + 2 * q + h;
            if (tok >= n_tok) continue;
            const float st = sx[tok];
            float *yp = y + (size_t)tok * ldy + ra;
            if (ra < n_out) {
                const float v = acc[4 * n + h] * swa * st;
                yp[0] = accumulate ? yp[0] + v : v;
            }
            if (ra + 8 < n_out) {
                const float v = acc[4 * n + 2 + h] * swb * st;
                yp[8] = accumulate ? yp[8] + v : v;
            }
        }
#elif defined(__CUDA_ARCH__)
    __trap(); // built without sm_90a code: kc__gemm_f8_wg refuses every call
#endif
}

// cuTensorMapEncodeTiled through the runtime (no link against the driver library); NULL where
// the driver has none
PFN_cuTensorMapEncodeTiled_v12000 tmap_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static bool tried;
    if (!tried) {
        tried = true;
        cudaDriverEntryPointQueryResult q;
        void *f = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
        cudaGetLastError();
    }
    return fn;
}

// A tensor map of rows x n_in bytes (row stride n_in), boxes of 128 codes x box_rows rows in the
// 128-byte swizzle the wgmma descriptors read; rows past the end read as zeros.
bool tmap_codes(CUtensorMap *m, const void *base, int n_in, int rows, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tmap_encoder();
    if (!enc) return false;
    const cuuint64_t dim[2] = { (cuuint64_t)n_in, (cuuint64_t)rows }, stride[1] = { (cuuint64_t)n_in };
    const cuuint32_t box[2] = { (cuuint32_t)F8K, (cuuint32_t)box_rows }, es[2] = { 1, 1 };
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void *>(base), dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int WM, int BN, int KW, int KS, bool FA>
int launch_f8wg(const kc_weight *w, const uint8_t *x, const float *sx, int n_tok, float *y, int ldy, int acc, cudaStream_t s) {
    constexpr size_t smem = f8wg_smem<WM, BN, KW>();
    static_assert(smem <= 227 * 1024, "gemm_f8_wg: shared memory");
    static unsigned char smem_set[64];
    CUtensorMap tw, tx;
    if (!tmap_codes(&tw, w->data, w->n_in, w->n_out, 64 * WM) || !tmap_codes(&tx, x, w->n_in, n_tok, BN)) return CM_EUNSUPPORTED;
    if (int rc = kc_smem_limit_once(gemm_f8_wg_kernel<WM, BN, KW, KS, FA>, (int)smem, smem_set, __FILE__, __LINE__)) return rc;
    dim3 grid((w->n_out + 64 * WM - 1) / (64 * WM), (n_tok + BN - 1) / BN, KS), block(KW * WM * 128);
    kc_launch(gemm_f8_wg_kernel<WM, BN, KW, KS, FA>, grid, block, smem, s, tw, tx, (const float *)w->d, sx, y, w->n_in, w->n_out, ldy,
              n_tok, acc);
    KC_LAUNCH_CHECK();
}

bool f8wg_device_ok() {
    static signed char ok[64];
    return sm90a_kernel_ok(gemm_f8_wg_kernel<2, 128, 1, 1, false>, ok);
}

} // namespace

// The configurations (warp groups over rows, tokens a tile, K groups in the CTA, CTAs of a
// cluster over K), timed against cuBLASLt per shape and token count by kc_matmul_tune_f8. On an
// H200 llama3-8b took 0-5 at 16-64 tokens (wg64x16k4/1 for qkv, wg64x16k4/2 for wo, wg128x16k2/1
// and wg128x32k2/1 for gate|up, ...). Measured and dropped: three K groups of 128-token tiles
// (64 or 128 rows), never faster than two at 128-256 tokens (bench/RESULTS.md, thirty-seventh session).
// The last column: fast accumulation (the plan's fp8_fast_accum; the tune times only the
// configurations of the plan's mode, named with an "f"): 128- and 256-token tiles of one K group,
// split over a cluster for the narrow matrices.
#define F8WG_CONFIGS(X)                                                                                                        \
    X(0, 1, 16, 4, 1, 0) X(1, 1, 16, 4, 2, 0) X(2, 1, 16, 2, 2, 0) X(3, 2, 16, 2, 1, 0) X(4, 1, 32, 4, 1, 0)                   \
    X(5, 1, 32, 4, 2, 0) X(6, 2, 32, 2, 1, 0) X(7, 1, 64, 2, 2, 0) X(8, 2, 64, 2, 1, 0) X(9, 1, 64, 4, 1, 0)                   \
    X(10, 2, 64, 1, 2, 0) X(11, 2, 128, 1, 1, 0) X(12, 2, 128, 1, 2, 0) X(13, 1, 128, 2, 1, 0) X(14, 1, 128, 2, 2, 0)          \
    X(15, 1, 16, 4, 1, 1) X(16, 1, 16, 4, 2, 1) X(17, 2, 16, 2, 1, 1) X(18, 1, 32, 4, 1, 1) X(19, 2, 32, 2, 1, 1)              \
    X(20, 1, 64, 2, 2, 1) X(21, 2, 64, 2, 1, 1) X(22, 2, 64, 1, 2, 1) X(23, 2, 128, 1, 1, 1) X(24, 2, 128, 1, 2, 1)            \
    X(25, 1, 128, 2, 1, 1) X(26, 1, 128, 1, 2, 1) X(27, 2, 256, 1, 1, 1) X(28, 2, 256, 1, 2, 1) X(29, 2, 256, 1, 4, 1)         \
    X(30, 1, 256, 1, 2, 1)
#define F8WG_ROW(i, wm, bn, kw, ks, fa) { wm, bn, kw, ks, fa },
static const int F8WG_CFG[][5] = { F8WG_CONFIGS(F8WG_ROW) };
#define F8WG_NCFG ((int)(sizeof F8WG_CFG / sizeof *F8WG_CFG))

extern "C" int kc__gemm_f8_wg_ncfg(void) { return f8wg_device_ok() && tmap_encoder() ? F8WG_NCFG : 0; }

extern "C" const char *kc__gemm_f8_wg_name(int cfg, char *buf, size_t len) {
    if (cfg < 0 || cfg >= F8WG_NCFG) snprintf(buf, len, "?");
    else
        snprintf(buf, len, "wg%dx%dk%d/%d%s", 64 * F8WG_CFG[cfg][0], F8WG_CFG[cfg][1], F8WG_CFG[cfg][2], F8WG_CFG[cfg][3],
                 F8WG_CFG[cfg][4] ? "f" : "");
    return buf;
}

extern "C" int kc__gemm_f8_wg_fast(int cfg) { return cfg >= 0 && cfg < F8WG_NCFG && F8WG_CFG[cfg][4]; }

// y[t][r] (+)= sum_k W[r][k] x[t][k] (codes) x W's row scale r x xs[t]; n_in % 128 == 0, 16-byte
// aligned codes. CM_EINVAL where the configuration or the shape does not fit.
extern "C" int kc__gemm_f8_wg(const kc_weight *w, const uint8_t *x, const float *xs, int n_tok, float *y, int ldy, int accumulate,
                              int cfg, cudaStream_t s) {
    if (!w || !x || !xs || !y || w->type != DT_F8_E4M3 || !w->data || !w->d || n_tok <= 0 || w->n_in % F8K || ldy < w->n_out ||
        ((uintptr_t)x & 15) || ((uintptr_t)w->data & 15) || cfg < 0 || cfg >= kc__gemm_f8_wg_ncfg())
        return CM_EINVAL;
    const kc_pdl_scope pdl_cls(KC_PDL_OTHER);
    switch (cfg) {
#define F8WG_CASE(i, wm, bn, kw, ks, fa) \
    case i: return launch_f8wg<wm, bn, kw, ks, fa != 0>(w, x, xs, n_tok, y, ldy, accumulate, s);
        F8WG_CONFIGS(F8WG_CASE)
#undef F8WG_CASE
    default: return CM_EINVAL;
    }
}
