// kc_common: device helpers shared by every kernel (warp reductions, conversions, error checks).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/cm_err.h"
#include "common/cm_log.h"
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"
}

// Logs the failed launch with file and line and returns CM_ECUDA from the launcher.
#define KC_LAUNCH_CHECK()                                                                         \
    do {                                                                                          \
        cudaError_t kc_e_ = cudaGetLastError();                                                   \
        if (kc_e_ != cudaSuccess) {                                                               \
            cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel launch failed", "err=\"%s\" file=%s line=%d", \
                         cudaGetErrorString(kc_e_), __FILE__, __LINE__);                          \
            return CM_ECUDA;                                                                      \
        }                                                                                         \
        return 0;                                                                                 \
    } while (0)

__device__ __forceinline__ float kc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (MAX: maximum) over a block of blockDim.x threads (multiple of 32, <= 1024). `red` holds 32
// floats; the barrier before it is written lets a caller use it again right after a reduction.
template <bool MAX = false> __device__ __forceinline__ float kc_block_reduce(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = MAX ? kc_warp_max(v) : kc_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = lane < nw ? red[lane] : 0.0f;
    return MAX ? kc_warp_max(v) : kc_warp_sum(v);
}
__device__ __forceinline__ float kc_block_sum(float v, float *red) { return kc_block_reduce<false>(v, red); }
__device__ __forceinline__ float kc_block_max(float v, float *red) { return kc_block_reduce<true>(v, red); }

// ---- step trace (builds with -DKC_TRACE only: cmake -DARKA_CUDA_TRACE=ON) ----------------------
// Every CTA of a traced kernel (KC_TRACE_SCOPE as its first statement) records its kind, SM,
// entry time, the time its thread 0 passed the programmatic wait and the time its last warp
// left, in %globaltimer nanoseconds, into the buffer kc_trace_begin gave (kc_trace_end reads
// it back). Each file of traced kernels holds its own copy of the buffer's address (no
// relocatable device code), set through the function KC_TRACE_TU defines (kcuda.h has the
// record). Other builds: the macros are empty and cost nothing.
#ifdef KC_TRACE
struct kc_trace_dev {
    kc_trace_rec *buf;
    unsigned *n;
    unsigned cap;
};
static __device__ kc_trace_dev kc_trace_g;
__device__ __forceinline__ unsigned long long kc_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned long long &kc_trace_twait() {
    __shared__ unsigned long long t;
    return t;
}
__device__ __forceinline__ unsigned &kc_trace_done() {
    __shared__ unsigned n;
    return n;
}
struct kc_trace_scope {
    unsigned kind;
    unsigned long long t0;
    __device__ kc_trace_scope(unsigned k) : kind(k), t0(kc_gtime()) {
        if (threadIdx.x == 0) { kc_trace_done() = 0; kc_trace_twait() = 0; }
        __syncthreads();
    }
    __device__ ~kc_trace_scope() {
        if ((threadIdx.x & 31) || !kc_trace_g.buf) return;
        const unsigned nw = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
        if (atomicAdd(&kc_trace_done(), 1u) + 1 != nw) return;
        const unsigned long long t1 = kc_gtime();
        const unsigned i = atomicAdd(kc_trace_g.n, 1u);
        if (i >= kc_trace_g.cap) return;
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        kc_trace_rec r;
        r.kind = kind;
        r.sm = sm;
        r.cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        r.n_warps = nw;
        r.t_entry = t0;
        r.t_wait = *(volatile unsigned long long *)&kc_trace_twait();
        r.t_end = t1;
        r.pad = 0;
        kc_trace_g.buf[i] = r;
    }
};
#define KC_TRACE_SCOPE(kind) kc_trace_scope kc_trace_scope_(kind)
#define KC_TRACE_WAITED()                                                                         \
    do {                                                                                          \
        if (threadIdx.x == 0) kc_trace_twait() = kc_gtime();                                      \
    } while (0)
#define KC_TRACE_TU(name)                                                                         \
    extern "C" int kc_trace_tu_##name(kc_trace_rec *buf, unsigned *n, unsigned cap) {             \
        kc_trace_dev d = { buf, n, cap };                                                         \
        return cudaMemcpyToSymbol(kc_trace_g, &d, sizeof d) == cudaSuccess ? 0 : CM_ECUDA;        \
    }
#else
#define KC_TRACE_SCOPE(kind) ((void)0)
#define KC_TRACE_WAITED() ((void)0)
#define KC_TRACE_TU(name)
#endif

// RMSNorm's arithmetic, which every kernel that normalizes a row shares (norm.cu, the MoE
// norm + router launch in arch.cu), roundings spelled out rather than left to contraction: a
// row's bits may not depend on which kernel normalized it.
__device__ __forceinline__ float rms_sumsq4(float4 v) {
    return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}
// 1 / rms from the row's sum of squares
__device__ __forceinline__ float rms_scale(float ss, int n, float eps) { return rsqrtf(__fdiv_rn(ss, (float)n) + eps); }
__device__ __forceinline__ float4 rms_apply4(float4 v, float r, float4 g) {
    return make_float4(__fmul_rn(__fmul_rn(v.x, r), g.x), __fmul_rn(__fmul_rn(v.y, r), g.y),
                       __fmul_rn(__fmul_rn(v.z, r), g.z), __fmul_rn(__fmul_rn(v.w, r), g.w));
}

// Activations per token as E4M3 codes (kc_quantize_f8, and the producers that write KC_X_F8
// images): the row's scale amax / 448, code = e4m3_sat(x / scale), all codes 0 where the scale
// is 0 (dt_fp8_scale / dt_fp8_encode).
__device__ __forceinline__ float kc_amax4(float4 v) { return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))); }
__device__ __forceinline__ float kc_f8_scale(float amax) { return __fdiv_rn(amax, 448.0f); }
__device__ __forceinline__ uint32_t kc_f8_code(float f, float sc) {
    return sc != 0.0f ? (uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(f, sc), __NV_SATFINITE, __NV_E4M3) : 0u;
}
// four codes in one word, v.x in the low byte
__device__ __forceinline__ uint32_t kc_f8_code4(float4 v, float sc) {
    return kc_f8_code(v.x, sc) | kc_f8_code(v.y, sc) << 8 | kc_f8_code(v.z, sc) << 16 | kc_f8_code(v.w, sc) << 24;
}
// One token's row of n values (n % 4 == 0) held by the CTA: thread i has float4s i, i + blockDim.x,
// ... (V of them; those at or past n / 4 ignored). Writes the row's codes into q (4-byte aligned)
// and its scale into *scale (thread 0); every thread of the CTA calls it (two barriers).
template <int V>
__device__ __forceinline__ void kc_f8_row(const float4 (&v)[V], int n, uint8_t *q, float *scale, float *red) {
    const int n4 = n / 4;
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++)
        if (threadIdx.x + j * blockDim.x < n4) amax = fmaxf(amax, kc_amax4(v[j]));
    const float sc = kc_f8_scale(kc_block_max(amax, red));
    if (threadIdx.x == 0) *scale = sc;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < n4) ((uint32_t *)q)[i] = kc_f8_code4(v[j], sc);
    }
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

// ---- programmatic dependent launch (Hopper) ---------------------------------------------------
// Kernels of the forward pass are launched with kc_launch, which sets
// cudaLaunchAttributeProgrammaticStreamSerialization: the next kernel's CTAs may start while
// this kernel drains, and run whatever does not depend on earlier kernels (a GEMV's first
// weight loads) before kc_pdl_wait(). Rules for every kernel launched with kc_launch:
//   - call kc_pdl_wait() in every thread before reading anything an earlier kernel of the
//     stream wrote and before writing anything (an earlier kernel may still read it);
//   - before the wait, touch only memory nothing in the stream writes (weights);
//   - never read what an earlier kernel wrote through the read-only path (__ldg, or const
//     __restrict__ pointers the compiler may turn into it): that path requires the data to
//     stay unchanged for the kernel's lifetime, which now overlaps the writes. Such data is
//     read with ordinary loads (made visible by the wait); weights use __ldg.
// kc_pdl_trigger() lets the next kernel launch once every CTA of this one has triggered or
// exited. Both are no-ops when the kernel was launched without the attribute.
__device__ __forceinline__ void kc_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    KC_TRACE_WAITED();
}
__device__ __forceinline__ void kc_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kc_launch sets the attribute (kc_set_pdl; on by default).
extern "C" int kc_pdl_on(void);
extern "C" int kc_pdl_class(int cls);
// The launches in a scope belong to class cls (the plan's pdl_off).
struct kc_pdl_scope {
    int old;
    explicit kc_pdl_scope(int cls) : old(kc_pdl_class(cls)) {}
    ~kc_pdl_scope() { kc_pdl_class(old); }
};

template <typename... KArgs, typename... Args>
static inline void kc_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = kc_pdl_on() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

// Raises kernel's dynamic shared-memory limit to `bytes` once per device (an attribute of the
// function in that device's context), not on every launch. done: the caller's static flags,
// one per device. 0, or CM_ECUDA with the failure logged (the caller's file and line).
template <typename K>
static inline int kc_smem_limit_once(K kernel, int bytes, unsigned char (&done)[64], const char *file, int line) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess && (dev < 0 || dev >= 64 || !done[dev])) {
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e == cudaSuccess && dev >= 0 && dev < 64) done[dev] = 1;
    }
    if (e == cudaSuccess) return 0;
    cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel attribute failed", "err=\"%s\" file=%s line=%d", cudaGetErrorString(e), file,
                 line);
    return CM_ECUDA;
}

// silu(g) * u: the one expression every SwiGLU producer uses (the fused GEMV epilogue and the
// SwiGLU kernels give the same bits).
__device__ __forceinline__ float kc_silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }
// gelu_tanh(g) * u, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))): the CPU's
// k_geglu in its order, roundings spelled out (no contraction), so that the GeGLU producers (the
// fused GEMV epilogue, kc_glu_xq, kc_glu) give the same bits.
__device__ __forceinline__ float kc_gelu_mul(float g, float u) {
    const float c = 0.7978845608028654f; // sqrt(2 / pi)
    const float g3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float t = tanhf(__fmul_rn(c, __fadd_rn(g, g3)));
    return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t)), u);
}
// act(g) * u for the gated activations: GELU false SwiGLU, true GeGLU (tanh GELU).
template <bool GELU> __device__ __forceinline__ float kc_glu_mul(float g, float u) {
    if constexpr (GELU) return kc_gelu_mul(g, u);
    else return kc_silu_mul(g, u);
}
// Four outputs of an interleaved gate|up row: a = gate j, up j, gate j + 1, up j + 1; b = j + 2, j + 3.
template <bool GELU> __device__ __forceinline__ float4 kc_glu4(float4 a, float4 b) {
    return make_float4(kc_glu_mul<GELU>(a.x, a.y), kc_glu_mul<GELU>(a.z, a.w), kc_glu_mul<GELU>(b.x, b.y), kc_glu_mul<GELU>(b.z, b.w));
}

// An FP8 matmul's unit-scale sums (kc_matmul_f8_raw) times the row scale w and the token scale
// st, rounded product by product: the one order of kc_matmul's scale pass and of every reader
// that applies the scales itself (the gated activation, the rotation, the norm's residual add).
__device__ __forceinline__ float kc_f8_scaled(float r, float w, float st) { return __fmul_rn(__fmul_rn(r, w), st); }
__device__ __forceinline__ float4 kc_f8_scaled4(float4 r, float4 w, float st) {
    return make_float4(kc_f8_scaled(r.x, w.x, st), kc_f8_scaled(r.y, w.y, st), kc_f8_scaled(r.z, w.z, st), kc_f8_scaled(r.w, w.w, st));
}
// p + the scaled sums (the pass's accumulation)
__device__ __forceinline__ float4 kc_f8_scaled_add(float4 r, float4 w, float st, float4 p) {
    const float4 v = kc_f8_scaled4(r, w, st);
    return make_float4(__fadd_rn(v.x, p.x), __fadd_rn(v.y, p.y), __fadd_rn(v.z, p.z), __fadd_rn(v.w, p.w));
}
// What a norm adds to its residual row before normalizing it (kc_rmsnorm_f8raw_xq): raw [n_tok][n]
// sums, sw [n] row scales, sx [n_tok] token scales
struct kc_f8_raw_add {
    const float *raw, *sw, *sx;
};

// Scale and min of sub-block is (0..7) of a Q4_K super-block whose head h is d | dmin << 16,
// then the 12 packed scale bytes (kcuda.h's layout): ggml's get_scale_min_k4 on bytes y|z|w.
__host__ __device__ __forceinline__ void kc_q4k_scale_min(const uint4 &h, int is, float &sc, float &mn) {
    const int sh = 8 * (is & 3);
    const uint32_t by = (h.y >> sh) & 0xFF, bz = (h.z >> sh) & 0xFF, bw = (h.w >> sh) & 0xFF;
    uint32_t s, m;
    if (is < 4) { s = by & 63; m = bz & 63; }
    else { s = (bw & 0xF) | ((by >> 6) << 4); m = (bw >> 4) | ((bz >> 6) << 4); }
    sc = (float)s;
    mn = (float)m;
}
// The same for four sub-blocks at once, as bytes: sub-blocks 0-3 (upper = 0) or 4-7, byte i of
// sv the scale of sub-block 4 upper + i, of mv its min.
__host__ __device__ __forceinline__ void kc_q4k_scales4(const uint4 &h, int upper, uint32_t &sv, uint32_t &mv) {
    if (!upper) {
        sv = h.y & 0x3F3F3F3Fu;
        mv = h.z & 0x3F3F3F3Fu;
    } else {
        sv = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
        mv = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
    }
}

// gemmq.cu: kc_gemmq into the rows of a wider output (row stride ldy >= W->n_out): kc_matmul's
// path for one row range of a KC_WEIGHT_MIXED weight. xperm: x was written by kc__to_half_gemmq
// in W's order (kc__gemmq_x_order).
extern "C" int kc__gemmq_rows(const kc_weight *W, const kc_half *x, int n_tok, float *y, int ldy, int accumulate, int cfg,
                              int xperm, cudaStream_t s);
// The order in which kc__gemmq_rows' choice for W (one type) x n_tok tokens reads x: 0 as is (the
// mma.sync tiles); else the wgmma tiles, which read x as the image of their shared stages, each
// 128-element step in their MMAs' order (they also take x as it is, slower): 1 for the
// 32-element block types, 2 for the K-quants.
extern "C" int kc__gemmq_x_order(const kc_weight *W, int n_tok);
// x [n_tok, n] f32 to half in order 1, 2 or 3 (gemmq.cu says how), kc__gemmq_x_halves(n_tok, n)
// halves of out (the tiles read up to 64 padded rows past the written ones).
extern "C" int kc__to_half_gemmq(const float *x, int n_tok, int n, int order, kc_half *out, cudaStream_t s);
extern "C" size_t kc__gemmq_x_halves(int n_tok, int n);
// gemmq_wg.cu: the same on Hopper's wgmma for one quantized type (not a mixed weight), in tile
// configuration cfg < kc__gemmq_wg_ncfg() (0 where the build or the device lacks sm_90a code).
extern "C" int kc__gemmq_wg_ncfg(void);
// The tiles' epilogue for an interleaved gate|up matrix (kc_matmul_glu): instead of y, output j
// of token t = act(y[t][2j]) y[t][2j + 1] (SiLU, or tanh GELU where gelu) as f32 into out[t][j]
// (out may be NULL) and as x's image of order img_order for the next matrix's tiles (img may be
// NULL; rows padded to img_ntp). n_out % 8 == 0.
struct kc_wg_glu {
    float *out;
    __half *img;
    int img_order, img_ntp, gelu;
};
extern "C" int kc__gemmq_wg(const kc_weight *W, const kc_half *x, int n_tok, float *y, int ldy, int accumulate, int cfg,
                            int xperm, const kc_wg_glu *glu, cudaStream_t s);
// gemmq.cu: W x (x's image of order xperm) on the configuration kc_gemmq would choose, with that
// epilogue (CM_EINVAL where the choice is not a wgmma tile or W is mixed)
// gemmq.cu: the F16 tile configuration kc_gemmq chooses for W of this shape times n_tok tokens
// (dispatch_wg_f16's), or -1 where cuBLAS is faster
extern "C" int kc__gemmq_f16_cfg(int n_tok, int n_out, int n_in);
extern "C" int kc__gemmq_glu(const kc_weight *W, const kc_half *x, int n_tok, int xperm, const kc_wg_glu *glu, cudaStream_t s);

// fp8.cu: kc_matmul's path for F8_E4M3 weights (a GEMV up to KC_GEMV_MAX_TOK tokens, on xq's
// half copy when it holds x for W, else on x; more tokens: cuBLASLt FP8 or dequantize +
// cuBLAS), into rows of stride ldy.
extern "C" int kc__matmul_f8(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, int ldy,
                             int accumulate, const kc_gemm_ws *ws, cudaStream_t s);
// kc_matmul_x_order for an F8_E4M3 matrix: KC_X_F8 where kc__matmul_f8 runs n_tok tokens on
// cuBLASLt's FP8 GEMM (the activations as codes and token scales), else 0
extern "C" int kc__f8_x_order(const kc_weight *W, int n_tok, const kc_gemm_ws *ws);
// kc_matmul_glu's one-kernel path for an F8_E4M3 gate|up matrix (the GEMV on xq's half copy,
// SwiGLU, or GeGLU when gelu, in its epilogue, into out (may be NULL) and xq_act's half copy):
// 0 when launched (or a launch error), 1 when the shape or the buffers do not allow it.
extern "C" int kc__matmul_f8_glu(const kc_weight *W, const kc_xq *xq, int n_tok, float *out, kc_xq *xq_act, int gelu,
                                 cudaStream_t s);

// ---- quantized weight layouts (kcuda.h, kc_weight) ----------------------------------------------
// Bytes of one row of a quantized kc_weight's data and d regions (n_in whole blocks of the type;
// 0 for other types). Rows of Q5_0 and Q6_K scales are padded so that every row starts aligned
// for the loads the kernels make (4 and 16 bytes).
__host__ __device__ __forceinline__ size_t kc_wq_data_row(int type, int n_in) {
    switch (type) {
    case DT_Q8_0: return (size_t)n_in;
    case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_Q4_K: case DT_Q5_K: return (size_t)n_in / 2;
    case DT_Q6_K: return (size_t)n_in / 256 * 192;
    default: return 0;
    }
}
__host__ __device__ __forceinline__ size_t kc_wq_d_row(int type, int n_in) {
    const size_t nb = (size_t)n_in / 32, nsb = (size_t)n_in / 256;
    switch (type) {
    case DT_Q8_0: case DT_Q4_0: return nb * 2;
    case DT_Q4_1: return nb * 4;
    case DT_Q5_0: return nb * 4 + (nb * 2 + 3) / 4 * 4;
    case DT_Q5_1: return nb * 8;
    case DT_Q4_K: return nsb * 16;
    case DT_Q5_K: return nsb * 48;
    case DT_Q6_K: return nsb * 16 + (nsb * 2 + 15) / 16 * 16;
    default: return 0;
    }
}

// The fifth bits of the four elements 4i .. 4i + 3 in a high-bit word (kcuda.h: element 4i + b
// at bit 8b + i), as bit 4 of bytes 0..3: ORed onto the nibbles of those elements.
__device__ __forceinline__ uint32_t kc_hbit4(uint32_t qh, int i) { return ((qh >> i) & 0x01010101u) << 4; }

// Q6_K: the quarter (64 elements) of a super-block a lane works on is 48 bytes: nibble words
// k = 0..7 (byte b of word k: element 4k + b in its low nibble, 32 + 4k + b in its high one),
// then four words of 2-bit high parts, where the parts of nibble word k sit at bits 2 (k & 3)
// of the bytes of word 2 (k >> 2) (low nibbles) and 2 (k >> 2) + 1 (high nibbles). The high
// parts of nibble word k's low (hi = 0) or high (hi = 1) nibbles, as bits 4-5 of its bytes:
__device__ __forceinline__ uint32_t kc_q6_hi4(const uint32_t *h, int k, int hi) {
    return ((h[2 * (k >> 2) + hi] >> (2 * (k & 3))) & 0x03030303u) << 4;
}

__device__ __forceinline__ float kc_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float kc_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// ---- two-level int8 activations (kc_xq, see kcuda.h) ----------------------------------------
// The block of 32 values held by 8 consecutive lanes (4 values each, lanes 8g..8g+7 of the
// warp; the whole warp must call this together, `store` false for lanes past the row) is
// quantized and written at element e (the index of v.x in the [n_tok][n] arrays; the block's
// pair at e / 32 in m). Same arithmetic as the CPU backend's quantize_block (no contraction).
// xh (may be NULL): the values also stored as half, for the F16 GEMV. qh NULL (kc_xq.no_ints):
// only xh is written.
__device__ __forceinline__ void kc_xq_block4(float4 v, bool store, int8_t *qh, int8_t *ql, int32_t *m, __half *xh, size_t e) {
    if (!qh) {
        if (store && xh) {
            __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
            *(uint2 *)(xh + e) = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
        }
        return;
    }
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const float f[4] = { v.x, v.y, v.z, v.w };
    int h[4], l[4], sum = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float q = __fmul_rn(f[k], id), hf = rintf(q);
        float lf = rintf(__fmul_rn(__fsub_rn(q, hf), 256.0f));
        h[k] = (int)hf;
        l[k] = (int)fminf(fmaxf(lf, -127.0f), 127.0f);
        sum += 256 * h[k] + l[k];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    if (!store) return;
    if (xh) {
        __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        uint2 u = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
        *(uint2 *)(xh + e) = u;
    }
    *(char4 *)(qh + e) = make_char4((signed char)h[0], (signed char)h[1], (signed char)h[2], (signed char)h[3]);
    *(char4 *)(ql + e) = make_char4((signed char)l[0], (signed char)l[1], (signed char)l[2], (signed char)l[3]);
    if ((threadIdx.x & 7) == 0) {
        int2 p = make_int2(__float_as_int(__fdiv_rn(__fdiv_rn(amax, 127.0f), 256.0f)), sum);
        *(int2 *)(m + e / 32 * 2) = p;
    }
}

// One value per lane, the warp's 32 lanes one block (element e of lane 0 is the block's first):
// the same quantization as kc_xq_block4. The whole warp calls it.
__device__ __forceinline__ void kc_xq_block1(float v, int8_t *qh, int8_t *ql, int32_t *m, __half *xh, size_t e) {
    if (xh) xh[e] = __float2half_rn(v);
    if (!qh) return; // kc_xq.no_ints
    float amax = fabsf(v);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    float q = __fmul_rn(v, id), hf = rintf(q);
    float lf = rintf(__fmul_rn(__fsub_rn(q, hf), 256.0f));
    int h = (int)hf, l = (int)fminf(fmaxf(lf, -127.0f), 127.0f), sum = 256 * h + l;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    qh[e] = (int8_t)h;
    ql[e] = (int8_t)l;
    if ((threadIdx.x & 31) == 0)
        *(int2 *)(m + e / 32 * 2) = make_int2(__float_as_int(__fdiv_rn(__fdiv_rn(amax, 127.0f), 256.0f)), sum);
}

// ---- tensor cores and asynchronous copies (sm_80 and newer) ---------------------------------
// mma.sync m16n8k16 (f16 operands, f32 accumulators), ldmatrix and cp.async. Code built for an
// older target traps: the launchers that use them check kc_code_for_device first.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define KC_OLD_ARCH 1
#endif

__device__ __forceinline__ void kc_mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef KC_OLD_ARCH
    __trap();
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 half matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8; r[i] receives matrix i as an mma operand fragment (trans: each matrix transposed).
__device__ __forceinline__ void kc_ldmatrix_x4(uint32_t (&r)[4], uint32_t saddr) {
#ifdef KC_OLD_ARCH
    __trap();
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(saddr));
#endif
}
__device__ __forceinline__ void kc_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t saddr) {
#ifdef KC_OLD_ARCH
    __trap();
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(saddr));
#endif
}

#ifdef KC_OLD_ARCH
__device__ __forceinline__ void kc_cp_async8(uint32_t, const void *) { __trap(); }
__device__ __forceinline__ void kc_cp_async16(uint32_t, const void *, bool) { __trap(); }
__device__ __forceinline__ void kc_cp_async4(uint32_t, const void *, bool) { __trap(); }
__device__ __forceinline__ void kc_cp_async_commit() {}
template <int N> __device__ __forceinline__ void kc_cp_async_wait() {}
#else
__device__ __forceinline__ void kc_cp_async8(uint32_t saddr, const void *g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(saddr), "l"(g));
}
// 16 bytes from g, or 16 zero bytes when !valid (g is not read then, but must be a valid address).
__device__ __forceinline__ void kc_cp_async16(uint32_t saddr, const void *g, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(g), "r"(valid ? 16 : 0));
}
// 4 bytes from g (4-byte aligned), or zeros when !valid (g must still be a valid address).
__device__ __forceinline__ void kc_cp_async4(uint32_t saddr, const void *g, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(saddr), "l"(g), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void kc_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void kc_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif

// The expert of CTA column i: i itself when the grid has a column per expert, else the i-th
// expert (ascending) that some entry chose (-1: fewer were chosen). A step of T tokens and k
// slots launches min(n_exp, T k) columns, so a decode step does not schedule a CTA per expert
// (128 x the row tiles, nearly all exiting at once: most of an MoE layer's time at batch 1).
__device__ __forceinline__ int kc_moe_expert(const int32_t *cnt, int n_exp, int i) {
    if ((int)gridDim.x == n_exp) return i;
    __shared__ int s_e;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int seen = 0, found = -1;
        for (int base = 0; base < n_exp && found < 0; base += 32) {
            const int j = base + lane;
            const unsigned m = __ballot_sync(0xffffffffu, j < n_exp && cnt[j] > 0);
            const int c = __popc(m);
            if (i < seen + c) {
                unsigned mm = m;
                for (int q = 0; q < i - seen; q++) mm &= mm - 1;
                found = base + __ffs(mm) - 1;
            }
            seen += c;
        }
        if (lane == 0) s_e = found;
    }
    __syncthreads();
    return s_e;
}

__device__ __forceinline__ uint32_t kc_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Two floats as the half2 bits of an mma operand (round to nearest).
__device__ __forceinline__ uint32_t kc_pack_h2(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *(uint32_t *)&h;
}

// The threads that take part in a split merge: the whole CTA (bar 0: __syncthreads), or, in a
// kernel whose other warps have exited, nt threads from threadIdx.x first on (whole warps)
// that meet at named barrier bar.
struct att_group {
    int bar, first, nt;
    __device__ __forceinline__ int tid() const { return (int)threadIdx.x - first; }
    __device__ __forceinline__ void sync() const {
        if (bar == 0) __syncthreads();
        else asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(nt) : "memory");
    }
};
__device__ __forceinline__ att_group att_cta() { return att_group{ 0, 0, (int)blockDim.x }; }

// The split-K handshake (the attention kernels' merges; kc_matmul_qkv_rope's heads): called by
// every thread of g after it wrote its partial; true in the last CTA of the n_valid that hold
// keys of counter *cnt's rows, which then resets the counter for the next launch. The barrier orders the group's partial before its first thread's
// release (the counting atomic is acq_rel); the second orders its acquire before the merge's
// loads. No __threadfence: a fence.sc in every CTA and another in the last cost more than a
// microsecond per kernel (bench/RESULTS.md).
__device__ __forceinline__ bool att_last_split(int *cnt, int n_valid, const att_group &g) {
    __shared__ int sm_last;
    g.sync();
    if (g.tid() == 0) {
        int old;
        asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(old) : "l"(cnt) : "memory");
        sm_last = old + 1 == n_valid;
        if (sm_last) *cnt = 0;
    }
    g.sync();
    return sm_last;
}
__device__ __forceinline__ bool att_last_split(int *cnt, int n_valid) { return att_last_split(cnt, n_valid, att_cta()); }
