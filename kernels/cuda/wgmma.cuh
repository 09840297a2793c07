// wgmma: what the Hopper (sm_90a) kernels share: shared-memory matrix descriptors, the fences and
// waits of asynchronous warp-group MMAs, and wgmma with A from registers and B from shared memory.
// Only for translation units compiled for sm_90a alone (CMakeLists.txt: arka_cuda_sm90a).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KC_SM90A_DEVICE 1
#endif

namespace {

// Whether kernel (of a translation unit built for sm_90a alone) has its code in this build and
// the current device runs it: compute capability 9.0 exactly. Cached per device in ok.
template <typename K> bool sm90a_kernel_ok(K kernel, signed char (&ok)[64]) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return false;
    }
    if (!ok[dev]) {
        cudaFuncAttributes a;
        int major = 0, minor = 0;
        const bool yes = cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.binaryVersion == 90 &&
                         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
                         minor == 0;
        cudaGetLastError(); // a missing image is an answer, not an error for later calls
        ok[dev] = yes ? 1 : -1;
    }
    return ok[dev] > 0;
}

} // namespace

#ifdef KC_SM90A_DEVICE
// Eight accumulator operands d[i] .. d[i + 7] of a wgmma's inline asm (read and written).
#define KC_F8(d, i)                                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])

// The 128 accumulator operands %0 .. %127 of an m64n256 wgmma's inline asm, as its D list.
#define KC_WG_ACC128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

namespace {

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// One arrival on bar that also expects bytes more of asynchronous (bulk) copies before the phase
// completes.
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Makes barrier initializations visible to the async proxy (bulk copies) before any use.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// bytes (a multiple of 16, both addresses 16-byte aligned) from global g to shared saddr by the
// bulk-copy engine; bar's transaction count goes down by bytes when they have landed.
__device__ __forceinline__ void bulk_g2s(uint32_t saddr, const void *g, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(saddr), "l"(g),
                 "r"(bytes), "r"(bar)
                 : "memory");
}

// A shared-memory matrix descriptor for the 128-byte swizzle, as two words: the low one (start
// address and leading byte offset, in 16-byte units), to which offsets inside a tile are added (the
// 14-bit start field cannot carry: shared addresses are below 256 KiB), and the high one, a
// constant (stride byte offset in 16-byte units; swizzle mode 1 in bits 62-63 of the whole).
__device__ __forceinline__ uint32_t sw128_lo(uint32_t saddr, uint32_t lbo) {
    return ((saddr & 0x3FFFF) >> 4) | ((lbo >> 4) & 0x3FFF) << 16;
}
__device__ __forceinline__ uint64_t sw128_join(uint32_t lo, uint32_t sbo) {
    return (uint64_t)(((sbo >> 4) & 0x3FFF) | 1u << 30) << 32 | lo;
}
// x as a value the compiler knows to be the same in every lane (lane 0's): kept in uniform
// registers where an instruction needs one (wgmma descriptors), not moved there each time.
__device__ __forceinline__ uint32_t kc_uniform(uint32_t x) { return __shfl_sync(0xffffffffu, x, 0); }

// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async proxy
// that wgmma reads shared operands through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wg_bar_sync(int id) { asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory"); }

// Before a batch of wgmma; the reg_fence of its accumulators and A operands just before it
// keeps their last writes ahead of it (ptxas serializes wgmma otherwise).
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed groups of this warp group's wgmma are pending.
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Placed after a wait: keeps the compiler from moving accesses of a wgmma's accumulator, or
// reusing the registers of its A operand, before the asynchronous wgmma is done with them;
// placed before wg_fence: keeps their definitions before it.
template <int N> __device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
}

// The partial sums of a tile whose K steps are split KW ways inside the CTA (K groups of WM warp
// groups, N floats a thread; t: the thread's index in its warp group) and KS ways over a cluster,
// added in a fixed order into the first K group of the cluster's first CTA: the CTA's K groups
// in order through shared memory red, then the cluster's CTAs in rank order through distributed
// shared memory. red holds max(KW - 1, 1) WM 128 N floats, free for the sums: every thread calls
// this after a __syncthreads that follows its last read of what red overlaps. False for the
// threads left with nothing to write (the other K groups and CTAs).
template <int KW, int KS, int WM, int N>
__device__ __forceinline__ bool ksplit_sum(float (&acc)[N], float *red, int kw, int wm, int t, int rank) {
    constexpr int PER = 128 * N; // floats of one warp group's sums
    auto put = [&](float *o) {
#pragma unroll
        for (int i = 0; i < N; i += 4) *(float4 *)(o + i) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
    };
    auto add = [&](const float *o) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 v = *(const float4 *)(o + i);
            acc[i] += v.x, acc[i + 1] += v.y, acc[i + 2] += v.z, acc[i + 3] += v.w;
        }
    };
    if constexpr (KW > 1) {
        if (kw > 0) put(red + (size_t)((kw - 1) * WM + wm) * PER + t * N);
        __syncthreads();
        if (kw == 0)
            for (int k = 1; k < KW; k++) add(red + (size_t)((k - 1) * WM + wm) * PER + t * N);
    }
    if constexpr (KS > 1) {
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        if (KW > 1) __syncthreads(); // the first group has read the others' sums
        if (rank > 0 && kw == 0) put(red + (size_t)wm * PER + t * N);
        cl.sync();
        if (rank == 0 && kw == 0)
            for (int r = 1; r < KS; r++) add(cl.map_shared_rank(red, r) + (size_t)wm * PER + t * N);
        cl.sync(); // the other CTAs' shared memory stays until rank 0 has read it
        if (rank > 0) return false;
    }
    return kw == 0;
}

// D (m64nN, f32) += A (64 x 16, registers: each warp's 16 rows as an m16n8k16 A fragment) B (16 x N,
// shared, 128-byte swizzle, descriptor db): K-major (the N rows of 16 k), or MN-major with TB = 1
// ("transposed": the 16 rows of N).
template <int N, int TB = 0> struct wgmma_rs;
template <int TB> struct wgmma_rs<16, TB> {
    __device__ static __forceinline__ void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7}, "
                     "{%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
                     : KC_F8(d, 0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TB));
    }
};

template <int TB> struct wgmma_rs<32, TB> {
    __device__ static __forceinline__ void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                     "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TB));
    }
};

template <int TB> struct wgmma_rs<64, TB> {
    __device__ static __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8), KC_F8(d, 16), KC_F8(d, 24)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TB));
    }
};

template <int TB> struct wgmma_rs<128, TB> {
    __device__ static __forceinline__ void mma(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8), KC_F8(d, 16), KC_F8(d, 24),
                       KC_F8(d, 32), KC_F8(d, 40), KC_F8(d, 48), KC_F8(d, 56)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TB));
    }
};

template <int TB> struct wgmma_rs<256, TB> {
    __device__ static __forceinline__ void mma(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" KC_WG_ACC128 "}, "
                     "{%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
                     : KC_F8(d, 0), KC_F8(d, 8), KC_F8(d, 16), KC_F8(d, 24), KC_F8(d, 32), KC_F8(d, 40), KC_F8(d, 48), KC_F8(d, 56),
                       KC_F8(d, 64), KC_F8(d, 72), KC_F8(d, 80), KC_F8(d, 88), KC_F8(d, 96), KC_F8(d, 104), KC_F8(d, 112), KC_F8(d, 120)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TB));
    }
};

} // namespace
#endif
