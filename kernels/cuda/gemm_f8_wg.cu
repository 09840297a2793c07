// gemm_f8_wg: F8_E4M3 weights times a KC_X_F8 image (E4M3 codes of the activations, one scale a
// token) on Hopper's FP8 wgmma, with the weight rows' and the tokens' scales and the residual in
// the one launch (sm_90a code only: CMakeLists.txt's arka_cuda_sm90a).
//
// Why: past the GEMV, cuBLASLt's FP8 GEMM runs llama3-8b's narrow matrices far from both bounds
// at decode sizes: at 256 tokens wo took 24 us a layer (355 TFLOP/s) and qkv 20 us (eager, H200;
// bench/RESULTS.md, twenty-seventh session), its tiles leaving half the SMs idle, and its fast
// algorithms apply the scales in a second launch (fp8.cu's scalar path). Here the K steps of a
// tile are also split over a cluster of CTAs (reduced in rank order through distributed shared
// memory), so a 4,096-row matrix fills the GPU at any token count.
//
// Tile. A CTA owns 64 WM weight rows (WM warp groups, each the A operand of its own wgmma, m64)
// and BN tokens (the B operand, n = BN, shared by the warp groups). A K step is 128 codes: the
// stage holds the rows' and the tokens' 128 bytes each in the 128-byte-swizzled K-major layout
// of the descriptors (16-byte piece c of row r at r 128 + 16 (c ^ r % 8)), filled by cp.async
// NS - 1 steps ahead; a step is four m64nBNk32 wgmma, 32 bytes further along the rows each.
//
// Accumulation. Hopper's FP8 MMA keeps a narrower sum than f32 (cuBLASLt's default mode adds its
// partial sums in f32 at intervals too): each step's four wgmma start a fresh partial (scale-d 0),
// added into the f32 accumulators once they are done. (Two partials in turn, one added while the
// next step's wgmma run, gain nothing: ptxas then waits for every wgmma before the add anyway.)
// The other warp group, or the SM's other CTA, keeps the tensor cores busy meanwhile. The sum of an output is therefore in a fixed order: the K
// steps in order within a CTA, then the cluster's CTAs in rank order; it depends on the tile
// configuration and n_in only, not on the token count (batch-invariant within a configuration).
//
// Epilogue: y[t][r] (+)= sum x sw[r] x sx[t], written from the accumulators (a warp's 8 rows of
// a token are 32 contiguous bytes).
#include "kc_common.cuh"
#include "wgmma.cuh"

#include <cooperative_groups.h>
#include <stdio.h>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
}

namespace {

constexpr int F8K = 128;                   // codes a K step
constexpr int F8_NS = 4, F8_PD = F8_NS - 1; // stages; steps filled ahead

template <int WM, int BN> __host__ __device__ constexpr size_t f8wg_stage() { return (size_t)(64 * WM + BN) * F8K; }
template <int WM, int BN> constexpr size_t f8wg_smem() {
    constexpr size_t st = F8_NS * f8wg_stage<WM, BN>(), red = (size_t)WM * 128 * (BN / 2) * 4;
    return (st > red ? st : red) + 1024;
}

#ifdef KC_SM90A_DEVICE
// D (m64nN, f32) = scale_d D + A (64 x 32 codes, shared, K-major) B (32 x N codes, shared, K-major)
template <int N> struct wgmma_f8;
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
#endif

template <int WM, int BN, int KS>
__global__ void __cluster_dims__(1, 1, KS) __launch_bounds__(WM * 128, 1)
gemm_f8_wg_kernel(const uint8_t *__restrict__ W, const float *__restrict__ sw, const uint8_t *x, const float *sx, float *y,
                  int n_in, int n_out, int ldy, int n_tok, int accumulate) {
#ifdef KC_SM90A_DEVICE
    constexpr int NT = WM * 128, AR = 64 * WM; // threads; weight rows of the CTA
    constexpr uint32_t STAGE = (uint32_t)f8wg_stage<WM, BN>();
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (kc_smem_addr(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = kc_smem_addr(smem);
    const int tid = threadIdx.x, wm = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int rank = KS > 1 ? (int)blockIdx.z : 0;
    const int r0 = blockIdx.x * AR, n0 = blockIdx.y * BN;
    // this CTA's K steps: a contiguous share of the row
    const int nsteps = n_in / F8K, s0 = (int)((long)nsteps * rank / KS), s1 = (int)((long)nsteps * (rank + 1) / KS), nj = s1 - s0;

    // step j's 16-byte pieces into stage j % NS: the weights' (before the wait: nothing writes
    // them) or the activations' (rows past the matrix or the tokens read as zeros)
    auto issue_w = [&](int j) {
        const uint32_t st = sbase + (uint32_t)(j % F8_NS) * STAGE;
        const size_t k0 = (size_t)(s0 + j) * F8K;
        for (int i = tid; i < AR * 8; i += NT) {
            const int r = i >> 3, c = i & 7, row = r0 + r;
            kc_cp_async16(st + r * 128 + ((c ^ (r & 7)) << 4), W + (size_t)min(row, n_out - 1) * n_in + k0 + 16 * c, row < n_out);
        }
    };
    auto issue_x = [&](int j) {
        const uint32_t st = sbase + (uint32_t)(j % F8_NS) * STAGE + AR * 128;
        const size_t k0 = (size_t)(s0 + j) * F8K;
        for (int i = tid; i < BN * 8; i += NT) {
            const int t = i >> 3, c = i & 7, tok = n0 + t;
            kc_cp_async16(st + t * 128 + ((c ^ (t & 7)) << 4), x + (size_t)min(tok, n_tok - 1) * n_in + k0 + 16 * c, tok < n_tok);
        }
    };
#pragma unroll
    for (int i = 0; i < F8_PD; i++)
        if (i < nj) issue_w(i);
    kc_pdl_wait();
#pragma unroll
    for (int i = 0; i < F8_PD; i++) {
        if (i < nj) issue_x(i);
        kc_cp_async_commit(); // group i: step i (with step 0's group also the weights of 1 .. PD - 1)
    }

    float acc[BN / 2], p[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = p[i] = 0.0f;
    const uint32_t a_off = (uint32_t)wm * 64 * 128;
    // step j: its stage landed, and every thread's step j - 1 done (so stage j + PD may take step
    // j - 1's slot); the four wgmma of a fresh partial, added into acc once done
#pragma unroll 1
    for (int j = 0; j < nj; j++) {
        kc_cp_async_wait<F8_PD - 1>();
        fence_proxy_async();
        __syncthreads();
        if (j + F8_PD < nj) {
            issue_w(j + F8_PD);
            issue_x(j + F8_PD);
        }
        kc_cp_async_commit();
        const uint32_t st = sbase + (uint32_t)(j % F8_NS) * STAGE;
        const uint32_t al = kc_uniform(sw128_lo(st + a_off, 16)), bl = kc_uniform(sw128_lo(st + AR * 128, 16));
        reg_fence(p);
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; k++) wgmma_f8<BN>::mma(p, sw128_join(al + 2 * k, 1024), sw128_join(bl + 2 * k, 1024), k);
        wg_commit();
        wg_wait<0>();
        reg_fence(p);
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] += p[i];
    }
    kc_cp_async_wait<0>();
    kc_pdl_trigger();

    if constexpr (KS > 1) { // the cluster's partial sums, added in rank order by rank 0
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        float *red = (float *)smem;
        __syncthreads(); // every stage read: the shared memory takes the sums
        if (rank > 0) {
            float *o = red + (size_t)tid * (BN / 2);
#pragma unroll
            for (int i = 0; i < BN / 2; i += 4) *(float4 *)(o + i) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
        }
        cl.sync();
        if (rank == 0)
            for (int r = 1; r < KS; r++) {
                const float *o = cl.map_shared_rank(red, r) + (size_t)tid * (BN / 2);
#pragma unroll
                for (int i = 0; i < BN / 2; i += 4) {
                    const float4 v = *(const float4 *)(o + i);
                    acc[i] += v.x, acc[i + 1] += v.y, acc[i + 2] += v.z, acc[i + 3] += v.w;
                }
            }
        cl.sync(); // the other CTAs' shared memory stays until rank 0 has read it
        if (rank > 0) return;
    }
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

template <int WM, int BN, int KS>
int launch_f8wg(const kc_weight *w, const uint8_t *x, const float *sx, int n_tok, float *y, int ldy, int acc, cudaStream_t s) {
    constexpr size_t smem = f8wg_smem<WM, BN>();
    static_assert(smem <= 227 * 1024, "gemm_f8_wg: shared memory");
    static unsigned char smem_set[64];
    if (int rc = kc_smem_limit_once(gemm_f8_wg_kernel<WM, BN, KS>, (int)smem, smem_set, __FILE__, __LINE__)) return rc;
    dim3 grid((w->n_out + 64 * WM - 1) / (64 * WM), (n_tok + BN - 1) / BN, KS), block(WM * 128);
    kc_launch(gemm_f8_wg_kernel<WM, BN, KS>, grid, block, smem, s, (const uint8_t *)w->data, (const float *)w->d, x, sx, y, w->n_in,
              w->n_out, ldy, n_tok, acc);
    KC_LAUNCH_CHECK();
}

bool f8wg_device_ok() {
    static signed char ok[64];
    return sm90a_kernel_ok(gemm_f8_wg_kernel<2, 128, 1>, ok);
}

} // namespace

// The configurations (warp groups over rows, tokens a tile, CTAs of a cluster over K), timed
// against cuBLASLt per shape and token count by kc_matmul_tune_f8.
static const int F8WG_CFG[][3] = { { 2, 128, 1 }, { 2, 128, 2 }, { 1, 128, 2 }, { 1, 128, 4 }, { 2, 128, 4 },
                                   { 2, 64, 1 },  { 2, 64, 2 },  { 1, 64, 4 },  { 1, 64, 2 } };
#define F8WG_NCFG ((int)(sizeof F8WG_CFG / sizeof *F8WG_CFG))

extern "C" int kc__gemm_f8_wg_ncfg(void) { return f8wg_device_ok() ? F8WG_NCFG : 0; }

extern "C" const char *kc__gemm_f8_wg_name(int cfg, char *buf, size_t len) {
    if (cfg < 0 || cfg >= F8WG_NCFG) snprintf(buf, len, "?");
    else snprintf(buf, len, "wg%dx%d/%d", 64 * F8WG_CFG[cfg][0], F8WG_CFG[cfg][1], F8WG_CFG[cfg][2]);
    return buf;
}

// y[t][r] (+)= sum_k W[r][k] x[t][k] (codes) x W's row scale r x xs[t]; n_in % 128 == 0, 16-byte
// aligned codes. CM_EINVAL where the configuration or the shape does not fit.
extern "C" int kc__gemm_f8_wg(const kc_weight *w, const uint8_t *x, const float *xs, int n_tok, float *y, int ldy, int accumulate,
                              int cfg, cudaStream_t s) {
    if (!w || !x || !xs || !y || w->type != DT_F8_E4M3 || !w->data || !w->d || n_tok <= 0 || w->n_in % F8K || ldy < w->n_out ||
        ((uintptr_t)x & 15) || ((uintptr_t)w->data & 15) || cfg < 0 || cfg >= kc__gemm_f8_wg_ncfg())
        return CM_EINVAL;
    const kc_pdl_scope pdl_cls(KC_PDL_OTHER);
    switch (cfg) {
    case 0: return launch_f8wg<2, 128, 1>(w, x, xs, n_tok, y, ldy, accumulate, s);
    case 1: return launch_f8wg<2, 128, 2>(w, x, xs, n_tok, y, ldy, accumulate, s);
    case 2: return launch_f8wg<1, 128, 2>(w, x, xs, n_tok, y, ldy, accumulate, s);
    case 3: return launch_f8wg<1, 128, 4>(w, x, xs, n_tok, y, ldy, accumulate, s);
    case 4: return launch_f8wg<2, 128, 4>(w, x, xs, n_tok, y, ldy, accumulate, s);
    case 5: return launch_f8wg<2, 64, 1>(w, x, xs, n_tok, y, ldy, accumulate, s);
    case 6: return launch_f8wg<2, 64, 2>(w, x, xs, n_tok, y, ldy, accumulate, s);
    case 7: return launch_f8wg<1, 64, 4>(w, x, xs, n_tok, y, ldy, accumulate, s);
    default: return launch_f8wg<1, 64, 2>(w, x, xs, n_tok, y, ldy, accumulate, s);
    }
}
