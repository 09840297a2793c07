// gemmq_types: how the tensor-core kernels for quantized weights (gemmq.cu's mma.sync tiles,
// gemmq_wg.cu's wgmma) read each weight type. A warp step covers BK = 128 elements of K: lane
// quad q of the step owns 32 of them (one block of the 32-element types, or half of a K-quant
// quarter), loads them into registers in the type's raw form (qt<T>::load) and turns element
// group i (elements 4 i .. 4 i + 3 of its 32) into two half pairs (qt<T>::pairs): the A
// fragment's k = 2 q, 2 q + 1 and k = 2 q + 8, 2 q + 9 of MMA i. qt<T>::xoff says where those four
// elements lie in the step's activations, so the activations are staged in the same order.
#pragma once

#include "kc_common.cuh"

#include <type_traits>

extern "C" {
#include "model/dtype.h"
}

namespace {

constexpr int BK = 128;             // elements of K per warp step (4 lane quads x 32)

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(uint32_t *)&h; }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *(__half2 *)&u; }

// Bytes 2p and 2p + 1 of u as the low bytes of the two 16-bit halves.
template <int P> __device__ __forceinline__ uint32_t spread2(uint32_t u) {
    return __byte_perm(u, 0, P == 0 ? 0x4140 : 0x4342);
}
// (a & b) | c in one instruction
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// Bytes 0 and 2 (H = 0) or 1 and 3 (H = 1) of u as the low bytes of the two halves, high bytes 0x64:
// 1024 + byte as half.
template <int H> __device__ __forceinline__ __half2 bytes_h2(uint32_t u) {
    return bits_h2(__byte_perm(u, 0x64646464u, H == 0 ? 0x4240 : 0x4341));
}
// The tile order of the 32-element block types (see above)
__device__ __forceinline__ int xe_b32(int ks, int q, int i, int h, int c) {
    return ks * BK + 32 * q + 4 * (i >> 1) + 16 * (i & 1) + h + 2 * c;
}

// F16 weights' order (qt<DT_F16>): quad q's 16-byte piece p of a row's step is elements 32 p +
// 8 q .. + 7 (a quad reads 64 contiguous bytes a load); MMA i takes piece i / 2's words 2 (i % 2)
// (h = 0) and 2 (i % 2) + 1 (h = 1).
__device__ __forceinline__ int xe_f16(int ks, int q, int i, int h, int c) {
    return ks * BK + 32 * (i >> 1) + 8 * q + 4 * (i & 1) + 2 * h + c;
}

// The other way, for a producer that writes x's image itself (kc_rmsnorm_xq): elements e .. e + 3
// of a row (e % 4 == 0) form the pair h = 0 at logical k img_k0(order, e) (c = 0, 1) and the pair
// h = 1 at k + 8; order 1 (xe_b32): elements (e, e + 2) and (e + 1, e + 3); order 2 (the K-quants'
// xoff_k below) and order 3 (xe_f16): (e, e + 1) and (e + 2, e + 3).
__device__ __forceinline__ int img_k0(int order, int e) {
    if (order == 1) {
        const int r = e & 127, w = r & 31, i = 2 * ((w & 15) >> 2) + (w >> 4);
        return (e >> 7) * BK + 16 * i + 2 * (r >> 5);
    }
    if (order == 3) {
        const int r = e & 127, i = 2 * (r >> 5) + ((r >> 2) & 1);
        return (e >> 7) * BK + 16 * i + 2 * ((r >> 3) & 3);
    }
    const int r = e & 255, r2 = r & 63, e4 = ((r2 & 15) >> 2) + 4 * (r2 >> 5), u = 2 * (r >> 6) + ((r2 >> 4) & 1);
    return (2 * (e >> 8) + (u >> 2)) * BK + 16 * e4 + 2 * (u & 3);
}
// Where logical k (even) of token t lies in the image of ntp rows (gemmq.cu, to_half_gemmq_kernel)
__device__ __forceinline__ size_t img_off(int k, int t, int ntp) {
    const int kk = k & 63;
    return ((size_t)(k >> 6) * ntp + t) * 64 + ((((kk >> 3) ^ (t & 7)) << 3) | (kk & 7));
}

// A producer's rows also written as x's image for the wgmma tiles (kc_xq.img), where p != NULL:
// elements e .. e + 3 of token t's row by img_store4. Order KC_X_PLAIN (kcuda.h) is no tile's:
// the rows as half as they are (n a row, no padding), what cuBLAS reads.
// Order KC_X_F8 (only the producers that write it ask for it: img_asked's f8): E4M3 codes in
// p's bytes, [t][n], and token t's scale in sc[t] (kc_f8_store_row).
struct img_out {
    __half *p;
    int order, ntp, n;
    float *sc;
};
__device__ __forceinline__ void img_store4(const img_out &im, float4 o, int t, int e) {
    if (im.order == KC_X_PLAIN) {
        const __half2 h[2] = { __floats2half2_rn(o.x, o.y), __floats2half2_rn(o.z, o.w) };
        *(uint2 *)(im.p + (size_t)t * im.n + e) = *(const uint2 *)h;
        return;
    }
    const int k0 = img_k0(im.order, e);
    const __half2 a = im.order == 1 ? __floats2half2_rn(o.x, o.z) : __floats2half2_rn(o.x, o.y);
    const __half2 b = im.order == 1 ? __floats2half2_rn(o.y, o.w) : __floats2half2_rn(o.z, o.w);
    *(__half2 *)(im.p + img_off(k0, t, im.ntp)) = a;
    *(__half2 *)(im.p + img_off(k0 + 8, t, im.ntp)) = b;
}
// Whether xq asks for an image of n_tok rows of n that fits its buffer (kc_xq.img_*): the tiles'
// orders pad the rows (kc__gemmq_x_halves), the plain one does not.
static inline bool img_fits(const kc_xq *xq, int n_tok, int n) {
    if (!xq || !xq->img || n_tok <= 0 || n <= 0) return false;
    if (xq->img_order == KC_X_PLAIN) return n % 4 == 0 && (size_t)n_tok * (size_t)n <= xq->img_cap;
    if (xq->img_order == KC_X_F8)
        return n % 4 == 0 && (size_t)n_tok * (size_t)n <= 2 * xq->img_cap && xq->img_scale && n_tok <= xq->img_scale_cap;
    return xq->img_order >= 1 && xq->img_order <= 3 && n % (xq->img_order == 2 ? 256 : 128) == 0 &&
           kc__gemmq_x_halves(n_tok, n) <= xq->img_cap;
}
// The image a producer of n_tok rows of n writes where xq asks for one that fits (img_tok
// cleared: the caller sets img_tok and img_n once it has launched the writes). f8: the producer
// writes KC_X_F8 images (whole rows in one CTA); the others are given none of that order.
static inline img_out img_asked(kc_xq *xq, int n_tok, int n, bool f8 = false) {
    if (xq) xq->img_tok = 0;
    if (img_fits(xq, n_tok, n) && (f8 || xq->img_order != KC_X_F8))
        return img_out{ (__half *)xq->img, xq->img_order, xq->img_order == KC_X_PLAIN || xq->img_order == KC_X_F8 ? n_tok : (n_tok + 7) & ~7,
                        n, xq->img_order == KC_X_F8 ? xq->img_scale : nullptr };
    return img_out{};
}

// A KC_X_F8 image's row from the CTA's values in registers: thread i of the CTA holds float4s
// i, i + blockDim.x, ... (V of them; those at or past n / 4 ignored) of row t. The codes and scale
// kc_quantize_f8 writes for the same values. Every thread of the CTA calls it (two barriers).
template <int V>
__device__ __forceinline__ void kc_f8_store_row(const img_out &im, const float4 (&v)[V], int t, float *red) {
    kc_f8_row(v, im.n, (uint8_t *)im.p + (size_t)t * im.n, im.sc + t, red);
}

// How qt<T>::loadv reads a raw set: straight from global memory here; gemmq_wg.cu's shared ring
// replays the same calls, first as asynchronous copies, then as shared loads. N16, N8, N4: the
// calls of each size (u16 counts as 4 bytes: its aligned word) one row's loadv makes.
struct acc_ldg {
    __device__ __forceinline__ uint4 u4(const void *p) { return __ldg((const uint4 *)p); }
    __device__ __forceinline__ uint2 u2(const void *p) { return __ldg((const uint2 *)p); }
    __device__ __forceinline__ uint32_t u32(const void *p) { return __ldg((const uint32_t *)p); }
    __device__ __forceinline__ unsigned short u16(const void *p) { return __ldg((const unsigned short *)p); }
};

// load: Q::loadv straight from global memory (what every type's traits provide)
template <class Q> struct qt_load {
    template <class R>
    __device__ static void load(R &r, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        acc_ldg a;
        Q::loadv(r, a, W, D, row, n_in, ks, q);
    }
};

// Per type: what one lane quad holds for one row in one step (raw), how it is loaded, where
// its element group e4 (elements 4 e4 .. 4 e4 + 3 of the quad's 32) lies in the step's 128
// activations, and the half pairs of MMA i (elements 4i, 4i + 1 | 4i + 2, 4i + 3).
template <int TYPE> struct qt;

template <> struct qt<DT_Q8_0> : qt_load<qt<DT_Q8_0>> {
    struct raw { uint4 w[2]; __half2 d; };
    static constexpr int N16 = 2, N8 = 0, N4 = 1;
    template <class A>
    __device__ static void loadv(raw &r, A &a, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const uint4 *p = (const uint4 *)(W + row * (size_t)n_in + (size_t)ks * BK + 32 * q);
        r.w[0] = a.u4(p);
        r.w[1] = a.u4(p + 1);
        r.d = __half2half2(__ushort_as_half(a.u16((const unsigned short *)D + row * (size_t)(n_in / 32) + ks * 4 + q)));
    }
    __device__ static int xoff(int ks, int q, int e4) { return ks * BK + 32 * q + 4 * e4; }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)r.w;
        const uint32_t v = u[i] ^ 0x80808080u; // int8 + 128 in [0, 255]
        const __half2 off = __half2half2(__ushort_as_half(0x6480)); // 1152 = 1024 + 128
        lo = h2_bits(__hmul2(__hsub2(bits_h2(spread2<0>(v) | 0x64006400u), off), r.d));
        hi = h2_bits(__hmul2(__hsub2(bits_h2(spread2<1>(v) | 0x64006400u), off), r.d));
    }
    __device__ static int xe_t(int ks, int q, int i, int h, int c) { return xe_b32(ks, q, i, h, c); }
    __device__ static void pairs_t(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)r.w;
        const uint32_t v = u[(i >> 1) + 4 * (i & 1)] ^ 0x80808080u;
        const __half2 off = __half2half2(__ushort_as_half(0x6480)); // 1152 = 1024 + 128
        lo = h2_bits(__hmul2(__hsub2(bytes_h2<0>(v), off), r.d));
        hi = h2_bits(__hmul2(__hsub2(bytes_h2<1>(v), off), r.d));
    }
};

// Q4_0, Q4_1, Q5_0, Q5_1: quad q takes block 4 ks + q of the row; its elements 0..15 are the low
// nibbles of bytes 0..15, 16..31 the high nibbles (Q5: the fifth bits from the high-bit word).
// Each pair of elements becomes half exactly (1024 + q as bits), then d (q - offset) or d q + m
// in one half operation.
template <int TYPE> struct qt_b32 : qt_load<qt_b32<TYPE>> {
    static constexpr bool HI = TYPE == DT_Q5_0 || TYPE == DT_Q5_1, MIN = TYPE == DT_Q4_1 || TYPE == DT_Q5_1;
    struct raw_min { uint4 w; uint32_t qh; __half2 d, m; };
    struct raw_sym { uint4 w; uint32_t qh; __half2 d; };
    struct raw_q4 { uint4 w; __half2 d; };
    typedef typename std::conditional<MIN, raw_min, typename std::conditional<HI, raw_sym, raw_q4>::type>::type raw;
    static constexpr int N16 = 1, N8 = TYPE == DT_Q5_1, N4 = TYPE == DT_Q5_0 ? 2 : TYPE == DT_Q5_1 ? 0 : 1;
    template <class A>
    __device__ static void loadv(raw &r, A &a, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const size_t b = row * (size_t)(n_in / 32) + (size_t)ks * 4 + q;
        r.w = a.u4((const uint4 *)W + b);
        if constexpr (TYPE == DT_Q4_0) {
            r.d = __half2half2(__ushort_as_half(a.u16((const unsigned short *)D + b)));
        } else {
            uint32_t dm;
            if constexpr (TYPE == DT_Q4_1) {
                dm = a.u32((const uint32_t *)D + b);
            } else if constexpr (TYPE == DT_Q5_1) {
                const uint2 v = a.u2((const uint2 *)D + b);
                dm = v.x;
                r.qh = v.y;
            } else { // Q5_0: a row is n_in / 32 high-bit words, then as many halves
                const uint8_t *p = (const uint8_t *)D + row * kc_wq_d_row(DT_Q5_0, n_in);
                const int bi = ks * 4 + q;
                r.qh = a.u32((const uint32_t *)p + bi);
                dm = a.u16((const unsigned short *)(p + (size_t)n_in / 8) + bi);
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
            scale(r, bits_h2(spread2<0>(q5) | 0x64006400u), bits_h2(spread2<1>(q5) | 0x64006400u), lo, hi);
        }
    }
    // Q4_1, Q5_0, Q5_1: two pairs of 1024 + q as half to d (q - 16) | d q + m
    __device__ static void scale(const raw &r, __half2 a, __half2 b, uint32_t &lo, uint32_t &hi) {
        if constexpr (TYPE == DT_Q5_0) {
            const __half2 off = __half2half2(__ushort_as_half(0x6410)); // 1040 = 1024 + 16
            lo = h2_bits(__hmul2(__hsub2(a, off), r.d));
            hi = h2_bits(__hmul2(__hsub2(b, off), r.d));
        } else if constexpr (MIN) {
            const __half2 off = __half2half2(__ushort_as_half(0x6400)); // 1024
            lo = h2_bits(__hfma2(__hsub2(a, off), r.d, r.m));
            hi = h2_bits(__hfma2(__hsub2(b, off), r.d, r.m));
        }
    }
    __device__ static int xe_t(int ks, int q, int i, int h, int c) { return xe_b32(ks, q, i, h, c); }
    // word i / 2, low (i even) or high nibbles. Q4: one lop3 a pair (a high nibble n lands as
    // 1024 + 16 n, scaled back exactly by an fma); Q5: the nibbles and fifth bits as bytes, then a prmt.
    __device__ static void pairs_t(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const uint32_t w = u[i >> 1];
        __half2 a, b; // q as half (Q4: q - 8 for Q4_0)
        if constexpr (!HI) {
            const uint32_t m = i & 1 ? 0x00F000F0u : 0x000F000Fu;
            a = bits_h2(and_or(w, m, 0x64006400u));
            b = bits_h2(and_or(w >> 8, m, 0x64006400u));
            // low: 1024 + q; high: (1024 + 16 q) / 16 - 64 = q; Q4_0 takes 8 more off
            if (i & 1) {
                const __half2 s16 = __half2half2(__ushort_as_half(0x2C00));                                   // 1/16
                const __half2 o = __half2half2(__ushort_as_half(TYPE == DT_Q4_0 ? 0xD480 : 0xD400));          // -72 | -64
                a = __hfma2(a, s16, o);
                b = __hfma2(b, s16, o);
            } else {
                const __half2 o = __half2half2(__ushort_as_half(TYPE == DT_Q4_0 ? 0x6408 : 0x6400)); // 1032 | 1024
                a = __hsub2(a, o);
                b = __hsub2(b, o);
            }
            if constexpr (TYPE == DT_Q4_0) {
                lo = h2_bits(__hmul2(a, r.d));
                hi = h2_bits(__hmul2(b, r.d));
            } else {
                lo = h2_bits(__hfma2(a, r.d, r.m));
                hi = h2_bits(__hfma2(b, r.d, r.m));
            }
        } else {
            const int e4 = (i >> 1) + 4 * (i & 1); // pairs()'s element group of the same four bytes
            const uint32_t q5 = ((w >> (4 * (i & 1))) & 0x0F0F0F0Fu) | kc_hbit4(r.qh, e4);
            scale(r, bytes_h2<0>(q5), bytes_h2<1>(q5), lo, hi);
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

// Q4_K, Q5_K (Q5_K: the fifth bits from the two sub-blocks' high-bit words, shifted to the
// quad's half so that nibble word i % 4 takes bits i % 4 + 8b)
// The K-quants keep xoff_k's order in x's image too (pairs_t = pairs)
template <class Q> struct qt_kord : qt_load<Q> {
    __device__ static int xoff(int ks, int q, int e4) { return xoff_k(ks, q, e4); }
    __device__ static int xe_t(int ks, int q, int i, int h, int c) { return xoff_k(ks, q, i) + 2 * h + c; }
    template <class R> __device__ static void pairs_t(const R &r, int i, uint32_t &lo, uint32_t &hi) { Q::pairs(r, i, lo, hi); }
};

// A quad's element group as two half pairs of q exactly: bytes 0, 1 (a) and 2, 3 (b) of v with
// high bytes 0x64 are 1024 + byte; off takes that 1024 (and a type's offset) off.
__device__ __forceinline__ void q_h2(uint32_t v, __half2 off, __half2 &a, __half2 &b) {
    a = __hsub2(bits_h2(__byte_perm(v, 0x64646464u, 0x4140)), off);
    b = __hsub2(bits_h2(__byte_perm(v, 0x64646464u, 0x4342)), off);
}

// The sub-block's d sc and -dmin m are rounded to half once a step (loadv), and an element is
// d sc q - dmin m in one half fma, q exact as half: three half operations a pair instead of f32
// math and a conversion (4 f32 values, 4 fma and 2 conversions a group). Against the f32 value
// rounded to half this adds the two scales' roundings (2^-12 of each, relative), the same for
// the 32 elements of a sub-block: `small` Q4_K against the CPU, 300 ids at 16-300 tokens a
// step, rel_mean 1.75e-3 -> 4.1e-3, KL 1.5e-6 -> 8.6e-6, top-1 100 -> 99.0 % (near ties);
// llama2-7b Q4_K at 32 / 64 sequences +22 % / +19 %. Measured and not kept: q sc exact, then
// (q sc) d and - m dmin in two roundings of no shared error (rel_mean 3.3e-3, 7 % slower
// than this); bench/RESULTS.md, thirty-first session.
template <int TYPE> struct qt_k : qt_kord<qt_k<TYPE>> {
    static constexpr bool HI = TYPE == DT_Q5_K;
    // ds: d sc of the quarter's sub-blocks 2j (low half) and 2j + 1; ndm: -dmin m likewise
    struct raw_q4 { uint4 w; __half2 ds, ndm; };
    struct raw_q5 { uint4 w; uint32_t qh[2]; __half2 ds, ndm; };
    typedef typename std::conditional<HI, raw_q5, raw_q4>::type raw;
    static constexpr int N16 = 2, N8 = HI ? 1 : 0, N4 = 0;
    template <class A>
    __device__ static void loadv(raw &r, A &a, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const size_t sb = row * (size_t)(n_in / 256) + (size_t)(ks >> 1);
        const int u = 4 * (ks & 1) + q, j = u >> 1;
        r.w = a.u4((const uint4 *)(W + sb * 128) + u);
        uint4 h;
        if constexpr (HI) {
            const uint8_t *p = (const uint8_t *)D + sb * 48;
            h = a.u4((const uint4 *)p);
            const uint2 qh = a.u2((const uint2 *)(p + 16) + j);
            r.qh[0] = qh.x >> (4 * (u & 1));
            r.qh[1] = qh.y >> (4 * (u & 1));
        } else {
            h = a.u4((const uint4 *)D + sb);
        }
        // the 6-bit sc and m of the four sub-blocks of this half of the super-block as bytes
        uint32_t sv, mv;
        kc_q4k_scales4(h, ks & 1, sv, mv);
        // sub-blocks 2j and 2j + 1 (bytes 2 (j % 2), + 1) as half (1024 + byte, less 1024),
        // times d and -dmin in half: the products rounded once, the bits f32 products (exact)
        // rounded to half give. Against two kc_q4k_scale_min and f32 products a step: llama2-7b
        // Q4_K at 32 sequences +4 %, prefill 512 +2 %, 64 sequences -2 % (H200, the same bits)
        const uint32_t sel = j & 1 ? 0x4342 : 0x4140;
        const __half2 c1024 = __half2half2(__ushort_as_half(0x6400));
        const __half2 sc = __hsub2(bits_h2(__byte_perm(sv, 0x64646464u, sel)), c1024);
        const __half2 m = __hsub2(bits_h2(__byte_perm(mv, 0x64646464u, sel)), c1024);
        r.ds = __hmul2(sc, bits_h2(__byte_perm(h.x, 0, 0x1010)));
        r.ndm = __hmul2(m, bits_h2(__byte_perm(h.x, 0, 0x3232) ^ 0x80008000u));
    }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const int k = i < 4 ? 0 : 1;
        const __half2 o1024 = __half2half2(__ushort_as_half(0x6400));
        __half2 a, b;
        if constexpr (HI) {
            q_h2(((u[i & 3] >> (4 * k)) & 0x0F0F0F0Fu) | kc_hbit4(r.qh[k], i & 3), o1024, a, b);
        } else if (k == 0) {
            q_h2(u[i & 3] & 0x0F0F0F0Fu, o1024, a, b);
        } else { // the high nibbles in place: 1024 + 16 q, then (1024 + 16 q) / 16 - 64 = q
            const uint32_t v = u[i & 3] & 0xF0F0F0F0u;
            const __half2 s16 = __half2half2(__ushort_as_half(0x2C00)), m64 = __half2half2(__ushort_as_half(0xD400)); // 1/16, -64
            a = __hfma2(bits_h2(__byte_perm(v, 0x64646464u, 0x4140)), s16, m64);
            b = __hfma2(bits_h2(__byte_perm(v, 0x64646464u, 0x4342)), s16, m64);
        }
        const __half2 ds = k ? __high2half2(r.ds) : __low2half2(r.ds), ndm = k ? __high2half2(r.ndm) : __low2half2(r.ndm);
        lo = h2_bits(__hfma2(a, ds, ndm));
        hi = h2_bits(__hfma2(b, ds, ndm));
    }
};
template <> struct qt<DT_Q4_K> : qt_k<DT_Q4_K> {};
template <> struct qt<DT_Q5_K> : qt_k<DT_Q5_K> {};

// Q6_K: the quad's 16 nibble bytes of its quarter and the two words of 2-bit high parts they
// need (kc_common.cuh's layout: words 2h and 2h + 1 of the quarter's four), the two sub-blocks'
// d sc rounded to half once a step; an element is (q - 32) d sc in one half product, q - 32
// exact (as qt_k: one rounding shared by the sub-block's elements).
template <> struct qt<DT_Q6_K> : qt_kord<qt<DT_Q6_K>> {
    struct raw { uint4 w; uint2 hb; __half2 ds[2]; };
    static constexpr int N16 = 1, N8 = 1, N4 = 2;
    template <class A>
    __device__ static void loadv(raw &r, A &a, const uint8_t *W, const kc_half *D, size_t row, int n_in, int ks, int q) {
        const int nsb = n_in / 256, sb = ks >> 1, u = 4 * (ks & 1) + q, j = u >> 1, h = u & 1;
        const uint8_t *p = W + row * (size_t)(192 * nsb) + (size_t)sb * 192 + 48 * j;
        r.w = a.u4((const uint4 *)p + h);
        r.hb = a.u2((const uint2 *)(p + 32) + h);
        const uint8_t *dr = (const uint8_t *)D + row * kc_wq_d_row(DT_Q6_K, n_in);
        const uint32_t sc = a.u32((const uint32_t *)dr + 4 * sb + j); // scales 4j .. 4j + 3
        const float d = __half2float(__ushort_as_half(a.u16((const unsigned short *)(dr + 16 * (size_t)nsb) + sb)));
        r.ds[0] = __float2half2_rn(d * (float)(int8_t)(sc >> (8 * h)));
        r.ds[1] = __float2half2_rn(d * (float)(int8_t)(sc >> (8 * (2 + h))));
    }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w;
        const int k = i < 4 ? 0 : 1, ww = i & 3;
        const uint32_t hw = k ? r.hb.y : r.hb.x;
        const uint32_t v = ((u[ww] >> (4 * k)) & 0x0F0F0F0Fu) | (((hw >> (2 * ww)) & 0x03030303u) << 4);
        __half2 a, b;
        q_h2(v, __half2half2(__ushort_as_half(0x6420)), a, b); // 1056 = 1024 + 32
        lo = h2_bits(__hmul2(a, r.ds[k]));
        hi = h2_bits(__hmul2(b, r.ds[k]));
    }
};

// F16 (gemmq_wg.cu only, on x's image of order 3): quad q's pieces 0-3 of the step (xe_f16),
// taken as they are.
template <> struct qt<DT_F16> : qt_load<qt<DT_F16>> {
    struct raw { uint4 w[4]; };
    static constexpr int N16 = 4, N8 = 0, N4 = 0;
    template <class A>
    __device__ static void loadv(raw &r, A &a, const uint8_t *W, const kc_half *, size_t row, int n_in, int ks, int q) {
        const uint4 *p = (const uint4 *)(W + 2 * (row * (size_t)n_in + (size_t)ks * BK)) + q;
#pragma unroll
        for (int k = 0; k < 4; k++) r.w[k] = a.u4(p + 4 * k);
    }
    __device__ static int xoff(int ks, int q, int e4) { return xe_f16(ks, q, e4, 0, 0); }
    __device__ static int xe_t(int ks, int q, int i, int h, int c) { return xe_f16(ks, q, i, h, c); }
    __device__ static void pairs_t(const raw &r, int i, uint32_t &lo, uint32_t &hi) {
        const uint32_t *u = (const uint32_t *)&r.w[i >> 1];
        lo = u[2 * (i & 1)];
        hi = u[2 * (i & 1) + 1];
    }
    __device__ static void pairs(const raw &r, int i, uint32_t &lo, uint32_t &hi) { pairs_t(r, i, lo, hi); }
};

} // namespace
