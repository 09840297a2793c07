// matmul: weight-stationary GEMV for small token counts (every weight type, dequantized in
// registers) and the cuBLAS path for larger ones; plus weight repacking for upload.
#include "kc_common.cuh"
#include "gemmq_types.cuh"
#include "rope_common.cuh"
#include "lt_desc.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <type_traits>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kcuda.h"
#include "model/dtype.h"
#include "model/model.h"
}

KC_TRACE_TU(matmul)

// ---- weight layout ---------------------------------------------------------------------------

static bool is_quant(int type) {
    switch (type) {
    case DT_Q8_0: case DT_Q4_0: case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: return true;
    default: return false;
    }
}
extern "C" int kc_weight_is_quant(int type) { return type == KC_WEIGHT_MIXED || is_quant(type); }

extern "C" int kc_weight_type_ok(int type) {
    return type == DT_F32 || type == DT_F16 || type == DT_BF16 || type == DT_F8_E4M3 || is_quant(type);
}

// The types embed.cu's kernel reads.
extern "C" int kc_embed_type_ok(int type) {
    return type == DT_F32 || type == DT_F16 || type == DT_BF16 || type == DT_Q8_0 || type == DT_Q4_0 || type == DT_Q4_K;
}

extern "C" int kc_qtype_index(int type) {
    static const int order[KC_N_QTYPES] = { DT_Q8_0, DT_Q4_0, DT_Q4_K, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q5_K, DT_Q6_K };
    for (int i = 0; i < KC_N_QTYPES; i++)
        if (order[i] == type) return i;
    return -1;
}

extern "C" int kc_weight_sizes(int type, int n_in, int n_out, size_t *data_bytes, size_t *d_bytes) {
    size_t n = (size_t)n_in * (size_t)n_out;
    *d_bytes = 0;
    switch (type) {
    case DT_F32: *data_bytes = n * 4; return 0;
    case DT_F16: case DT_BF16: *data_bytes = n * 2; return 0;
    case DT_F8_E4M3: *data_bytes = n; *d_bytes = (size_t)n_out * 4; return 0; // codes, f32 row scales
    default:
        if (!is_quant(type)) return CM_EUNSUPPORTED;
        if (n_in <= 0 || n_in % dt_block_size(type)) return CM_EINVAL;
        *data_bytes = kc_wq_data_row(type, n_in) * (size_t)n_out;
        *d_bytes = kc_wq_d_row(type, n_in) * (size_t)n_out;
        return 0;
    }
}

extern "C" int kc_weight_layout(const int *types, const int *rows, int n_parts, int n_in, kc_weight *w, size_t *data_bytes,
                                size_t *d_bytes) {
    if (n_parts <= 0) return CM_EINVAL;
    kc_weight v = {};
    v.n_in = n_in;
    v.type = types[0];
    size_t db = 0, sb = 0;
    for (int i = 0; i < n_parts; i++) {
        if (types[i] != types[0]) v.type = KC_WEIGHT_MIXED;
        if (rows[i] <= 0) return CM_EINVAL;
        v.n_out += rows[i];
    }
    if (v.type != KC_WEIGHT_MIXED) {
        if (int rc = kc_weight_sizes(v.type, n_in, v.n_out, data_bytes, d_bytes)) return rc;
        *w = v;
        return 0;
    }
    for (int i = 0, row = 0; i < n_parts; row += rows[i++]) {
        if (!is_quant(types[i])) return CM_EUNSUPPORTED;
        if (i > 0 && types[i] == types[i - 1]) { /* the same type as the range before: one range */
            v.part[v.n_parts - 1].n_rows += rows[i];
        } else {
            if (v.n_parts == KC_WEIGHT_MAX_PARTS) return CM_EUNSUPPORTED;
            kc_weight_part *p = &v.part[v.n_parts++];
            p->type = types[i];
            p->row0 = row;
            p->n_rows = rows[i];
        }
    }
    for (int i = 0; i < v.n_parts; i++) {
        kc_weight_part *p = &v.part[i];
        size_t pd, ps;
        if (int rc = kc_weight_sizes(p->type, n_in, p->n_rows, &pd, &ps)) return rc;
        p->data_off = db;
        p->d_off = sb;
        db += (pd + 255) & ~(size_t)255;
        sb += (ps + 255) & ~(size_t)255;
    }
    *data_bytes = db;
    *d_bytes = sb;
    *w = v;
    return 0;
}

// Bytes per row of a uniform weight's regions.
static void row_bytes(int type, int n_in, size_t *data_row, size_t *d_row) {
    switch (type) {
    case DT_F32: *data_row = (size_t)n_in * 4; *d_row = 0; break;
    case DT_F16: case DT_BF16: *data_row = (size_t)n_in * 2; *d_row = 0; break;
    case DT_F8_E4M3: *data_row = (size_t)n_in; *d_row = 4; break;
    default: *data_row = kc_wq_data_row(type, n_in); *d_row = kc_wq_d_row(type, n_in); break;
    }
}

extern "C" void kc_weight_row_at(const kc_weight *w, int r, size_t *data_off, size_t *d_off) {
    int type = w->type;
    size_t base_data = 0, base_d = 0;
    for (int i = 0; i < w->n_parts; i++)
        if (r >= w->part[i].row0 && r < w->part[i].row0 + w->part[i].n_rows) {
            type = w->part[i].type;
            base_data = w->part[i].data_off;
            base_d = w->part[i].d_off;
            r -= w->part[i].row0;
        }
    size_t dr, sr;
    row_bytes(type, w->n_in, &dr, &sr);
    *data_off = base_data + (size_t)r * dr;
    *d_off = base_d + (size_t)r * sr;
}

extern "C" kc_weight kc_weight_part_view(const kc_weight *w, int i) {
    const kc_weight_part *p = &w->part[i];
    kc_weight v = {};
    v.type = p->type;
    v.n_in = w->n_in;
    v.n_out = p->n_rows;
    v.data = (uint8_t *)w->data + p->data_off;
    v.d = (kc_half *)((uint8_t *)w->d + p->d_off);
    return v;
}

// PDL needs the kernels' griddepcontrol instructions, which exist only in code built for
// sm_90 or newer: code JIT-compiled from older PTX would start early and never wait.
__global__ void pdl_probe_kernel() { kc_pdl_wait(); }
static int pdl_capable(void) {
    static int v = -1;
    cudaFuncAttributes a;
    if (v < 0) v = cudaFuncGetAttributes(&a, pdl_probe_kernel) == cudaSuccess && a.ptxVersion >= 90 && a.binaryVersion >= 90;
    return v;
}
extern "C" int kc_code_for_device(int *arch) {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, pdl_probe_kernel);
    *arch = e == cudaSuccess ? a.binaryVersion : 0;
    if (e != cudaSuccess) cudaGetLastError(); /* clear it: the caller reports */
    return e == cudaSuccess;
}
extern "C" int kc_code_sm80(void) {
    static int arch = -1;
    if (arch < 0 && !kc_code_for_device(&arch)) arch = 0;
    return arch >= 80;
}
static thread_local int g_pdl_cls; // the launch class of this thread's next launches (kc_pdl_class)
extern "C" int kc_pdl_class(int cls) {
    const int old = g_pdl_cls;
    g_pdl_cls = cls;
    return old;
}
extern "C" int kc_pdl_on(void) {
    const kc_plan *p = kc_plan_get();
    return p->pdl && !((p->pdl_off >> g_pdl_cls) & 1) && pdl_capable();
}

// A block's high-bit word (bit e: the fifth bit of element e) in kcuda.h's order: element
// 4i + b at bit 8b + i.
static uint32_t hbits_perm(uint32_t qh) {
    uint32_t r = 0;
    for (int e = 0; e < 32; e++) r |= ((qh >> e) & 1u) << (8 * (e & 3) + (e >> 2));
    return r;
}

// Q4_1, Q5_1 blocks: {d | m << 16} per block in d (Q5_1: then the block's high-bit word), the
// nibbles in qs.
template <typename B> static void repack_dm(const B *b, size_t nblk, uint8_t *qs, uint32_t *dm) {
    constexpr bool HI = std::is_same<B, blk_q5_1>::value;
    for (size_t i = 0; i < nblk; i++) {
        uint32_t *o = dm + (HI ? 2 * i : i);
        o[0] = (uint32_t)b[i].d | (uint32_t)b[i].m << 16;
        if constexpr (HI) {
            uint32_t qh;
            memcpy(&qh, b[i].qh, 4);
            o[1] = hbits_perm(qh);
        }
        memcpy(qs + i * 16, b[i].qs, 16);
    }
}

// Q6_K super-block b as kcuda.h's 192 data bytes (qs) and its 16 scales and d at sc / dh.
static void repack_q6k(const blk_q6_K *b, uint8_t *qs, uint8_t *sc, uint8_t *dh) {
    uint8_t q[256]; // the 6-bit values 0..63 (value = d sc (q - 32)), in element order
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const uint8_t ql0 = b->ql[64 * n + l], ql1 = b->ql[64 * n + l + 32], qh = b->qh[32 * n + l];
            q[128 * n + l] = (uint8_t)((ql0 & 15) | ((qh & 3) << 4));
            q[128 * n + l + 32] = (uint8_t)((ql1 & 15) | (((qh >> 2) & 3) << 4));
            q[128 * n + l + 64] = (uint8_t)((ql0 >> 4) | (((qh >> 4) & 3) << 4));
            q[128 * n + l + 96] = (uint8_t)((ql1 >> 4) | (((qh >> 6) & 3) << 4));
        }
    memset(qs, 0, 192);
    for (int j = 0; j < 4; j++) {
        uint8_t *o = qs + 48 * j, *h = o + 32;
        for (int l = 0; l < 32; l++) o[l] = (uint8_t)((q[64 * j + l] & 15) | ((q[64 * j + 32 + l] & 15) << 4));
        for (int e = 0; e < 64; e++) { // element e of the quarter: nibble word k = (e % 32) / 4, byte e % 4
            const int hi = e >= 32, k = (e & 31) >> 2, bt = e & 3;
            h[4 * (2 * (k >> 2) + hi) + bt] |= (uint8_t)((q[64 * j + e] >> 4) << (2 * (k & 3)));
        }
    }
    memcpy(sc, b->scales, 16);
    memcpy(dh, &b->d, 2);
}

extern "C" int kc_weight_repack(int type, const void *src, int n_in, int n_rows, void *qs_out, kc_half *d_out) {
    size_t n = (size_t)n_in * (size_t)n_rows;
    if (is_quant(type) && (n_in <= 0 || n_in % dt_block_size(type))) return CM_EINVAL;
    const size_t nb = (size_t)n_in / 32, drow = kc_wq_d_row(type, n_in);
    switch (type) {
    case DT_F32: memcpy(qs_out, src, n * 4); return 0;
    case DT_F16: case DT_BF16: memcpy(qs_out, src, n * 2); return 0;
    case DT_F8_E4M3: memcpy(qs_out, src, n); return 0; // the codes; the row scales are not in src (kcuda.h)
    case DT_Q8_0: {
        const blk_q8_0 *b = (const blk_q8_0 *)src;
        int8_t *qs = (int8_t *)qs_out;
        for (size_t i = 0; i < n / 32; i++) {
            d_out[i] = b[i].d;
            memcpy(qs + i * 32, b[i].qs, 32);
        }
        return 0;
    }
    case DT_Q4_0: {
        const blk_q4_0 *b = (const blk_q4_0 *)src;
        uint8_t *qs = (uint8_t *)qs_out;
        for (size_t i = 0; i < n / 32; i++) {
            d_out[i] = b[i].d;
            memcpy(qs + i * 16, b[i].qs, 16);
        }
        return 0;
    }
    case DT_Q4_K: {
        const blk_q4_K *b = (const blk_q4_K *)src;
        uint8_t *qs = (uint8_t *)qs_out, *head = (uint8_t *)d_out;
        for (size_t i = 0; i < n / 256; i++) {
            memcpy(head + i * 16, &b[i].d, 2);
            memcpy(head + i * 16 + 2, &b[i].dmin, 2);
            memcpy(head + i * 16 + 4, b[i].scales, 12);
            memcpy(qs + i * 128, b[i].qs, 128);
        }
        return 0;
    }
    case DT_Q4_1: repack_dm((const blk_q4_1 *)src, n / 32, (uint8_t *)qs_out, (uint32_t *)d_out); return 0;
    case DT_Q5_1: repack_dm((const blk_q5_1 *)src, n / 32, (uint8_t *)qs_out, (uint32_t *)d_out); return 0;
    case DT_Q5_0: { // per row: nb high-bit words, nb halves, padding
        const blk_q5_0 *b = (const blk_q5_0 *)src;
        uint8_t *qs = (uint8_t *)qs_out;
        for (size_t r = 0; r < (size_t)n_rows; r++) {
            uint8_t *dr = (uint8_t *)d_out + r * drow;
            memset(dr, 0, drow);
            for (size_t j = 0; j < nb; j++) {
                const blk_q5_0 *x = &b[r * nb + j];
                uint32_t qh;
                memcpy(&qh, x->qh, 4);
                qh = hbits_perm(qh);
                memcpy(dr + 4 * j, &qh, 4);
                memcpy(dr + 4 * nb + 2 * j, &x->d, 2);
                memcpy(qs + (r * nb + j) * 16, x->qs, 16);
            }
        }
        return 0;
    }
    case DT_Q5_K: { // per super-block: the Q4_K head, then the high-bit words of its 8 sub-blocks
        const blk_q5_K *b = (const blk_q5_K *)src;
        uint8_t *qs = (uint8_t *)qs_out, *head = (uint8_t *)d_out;
        for (size_t i = 0; i < n / 256; i++) {
            uint8_t *h = head + i * 48;
            memcpy(h, &b[i].d, 2);
            memcpy(h + 2, &b[i].dmin, 2);
            memcpy(h + 4, b[i].scales, 12);
            for (int sb = 0; sb < 8; sb++) { // bit sb of qh[l]: element l of sub-block sb
                uint32_t w = 0;
                for (int l = 0; l < 32; l++) w |= (uint32_t)((b[i].qh[l] >> sb) & 1) << l;
                w = hbits_perm(w);
                memcpy(h + 16 + 4 * sb, &w, 4);
            }
            memcpy(qs + i * 128, b[i].qs, 128);
        }
        return 0;
    }
    case DT_Q6_K: { // per row: nsb x 192 data bytes; nsb x 16 scales, nsb halves, padding
        const blk_q6_K *b = (const blk_q6_K *)src;
        const size_t nsb = (size_t)n_in / 256;
        for (size_t r = 0; r < (size_t)n_rows; r++) {
            uint8_t *dr = (uint8_t *)d_out + r * drow;
            memset(dr, 0, drow);
            for (size_t j = 0; j < nsb; j++)
                repack_q6k(&b[r * nsb + j], (uint8_t *)qs_out + (r * nsb + j) * 192, dr + 16 * j, dr + 16 * nsb + 2 * j);
        }
        return 0;
    }
    default: return CM_EUNSUPPORTED;
    }
}

// ---- GEMV (F32, F16, BF16 weights) ---------------------------------------------------------
// Each warp owns R consecutive output rows; each lane walks 16-byte chunks of those rows (EPC
// elements per chunk), loads the matching activations once for all R rows, and accumulates in
// f32. F16 rows multiply in half2, two products a lane, and add the chunk's partials to the f32
// accumulator. For every (token, row) the summation order is fixed by the row length alone, so
// results do not depend on how many tokens share a call. (Quantized weights: the integer GEMV
// below.)

template <int TYPE> struct wchunk;

template <> struct wchunk<DT_F32> {
    static constexpr int EPC = 4;
    template <int NT> __device__ static void dot(uint4 w, const kc_half *, int, const float (*x)[4], float *acc) {
        const float f[4] = { __uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z), __uint_as_float(w.w) };
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[t] = fmaf(f[k], x[t][k], acc[t]);
    }
};

template <> struct wchunk<DT_BF16> {
    static constexpr int EPC = 8;
    template <int NT> __device__ static void dot(uint4 w, const kc_half *, int, const float (*x)[8], float *acc) {
        const uint32_t u[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                acc[t] = fmaf(__uint_as_float(u[k] << 16), x[t][2 * k], acc[t]);
                acc[t] = fmaf(__uint_as_float(u[k] & 0xffff0000u), x[t][2 * k + 1], acc[t]);
            }
    }
};

template <> struct wchunk<DT_F16> {
    static constexpr int EPC = 8;
    // activations already half (the producer's copy, kc_xq.xh, or converted just before). Half
    // sums of two products a lane, added in f32: the chains of four half sums this replaced left
    // phi3-tiny96's F16 decode at top-1 98.667 % against the CPU (4 near ties; rel_mean 1.51e-3
    // -> 1.30e-3, top-1 100 %) for 0.6 % of llama2-7b F16 batch 1 (276.8 -> 275.2 tok/s on an
    // H200); exact products with f32 sums gave rel_mean 9.1e-4 at 265 tok/s (bench/RESULTS.md,
    // twenty-eighth session)
    template <int NT> __device__ static void dot_h(uint4 w, const __half2 (*x)[4], float *acc) {
        const __half2 *h = (const __half2 *)&w;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            __half2 p = __hmul2(h[0], x[t][0]);
            p = __hfma2(h[1], x[t][1], p);
            __half2 q = __hmul2(h[2], x[t][2]);
            q = __hfma2(h[3], x[t][3], q);
            const float2 f = __half22float2(p), g = __half22float2(q);
            acc[t] += (f.x + f.y) + (g.x + g.y);
        }
    }
    template <int NT> __device__ static void dot(uint4 w, const kc_half *, int, const float (*x)[8], float *acc) {
        __half2 xh[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int k = 0; k < 4; k++) xh[t][k] = __floats2half2_rn(x[t][2 * k], x[t][2 * k + 1]);
        dot_h<NT>(w, xh, acc);
    }
};

#define GEMV_WARPS 4

// When accumulating (the residual), lane 0 loads what y holds right after the programmatic
// wait, so the add at the end does not wait for a memory round trip on the kernel's tail.
// ldy: y's row stride (n_out, or the whole fused matrix's for one range of a mixed weight).
template <int R, int NT>
__device__ __forceinline__ void gemv_load_residual(float (*res)[NT], const float *y, int row0, int n_out, int ldy, int lane,
                                                   int accumulate) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            res[r][t] = accumulate && lane == 0 && row0 + r < n_out ? y[(size_t)t * ldy + row0 + r] : 0.0f;
}

// The warp's R x NT sums to y (lane 0), added to the residual loaded before when accumulating.
template <int R, int NT>
__device__ __forceinline__ void gemv_store(float (*acc)[NT], const float (*res)[NT], float *y, int row0, int n_out, int ldy,
                                           int lane, int accumulate) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = kc_warp_sum(acc[r][t]);
            if (lane == 0 && row0 + r < n_out) {
                float *dst = y + (size_t)t * ldy + row0 + r;
                *dst = accumulate ? res[r][t] + v : v;
            }
        }
}

// SwiGLU / GeGLU fused into the F16 gate|up GEMV (kc_matmul_glu): rows interleave gate and up,
// so rows (row0 + r, row0 + r + 1) of a warp (R even, row0 even) are gate j and up j.
struct gemv_swi {
    float *out;  // [NT][n_ff] f32, or NULL
    __half *xh;  // [NT][n_ff] half
    int n_ff;
    int gelu;    // GeGLU (tanh GELU), else SwiGLU
};
template <int R, int NT, bool GELU>
__device__ __forceinline__ void gemv_store_swiglu(float (*acc)[NT], const gemv_swi &sw, int row0, int lane) {
#pragma unroll
    for (int r = 0; r + 1 < R; r += 2)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float g = kc_warp_sum(acc[r][t]), u = kc_warp_sum(acc[r + 1][t]);
            const int j = (row0 + r) / 2;
            if (lane == 0 && j < sw.n_ff) {
                const float v = kc_glu_mul<GELU>(g, u);
                const size_t e = (size_t)t * sw.n_ff + j;
                if (sw.out) sw.out[e] = v;
                sw.xh[e] = __float2half_rn(v);
            }
        }
}

// One chunk of R rows: loads the NT tokens' activations for chunk c once and accumulates.
// XH (F16 weights only): x is the producer's half copy of the activations (kc_xq.xh), the
// same values the f32 path rounds to half per chunk, so the sums are bitwise the same and no
// warp converts them again.
template <int TYPE, int NT, int R, bool XH>
__device__ __forceinline__ void gemv_step(const uint4 *w, const void *xv, int n_in, int c,
                                          const kc_half *__restrict__ d, int row0, int n_out, int row_scales,
                                          float (*acc)[NT]) {
    typedef wchunk<TYPE> C;
    constexpr int EPC = C::EPC;
    if constexpr (XH) {
        static_assert(TYPE == DT_F16, "half activations are for F16 weights");
        __half2 xs[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            uint4 v = __ldca((const uint4 *)((const __half *)xv + (size_t)t * n_in + (size_t)c * 8));
            memcpy(xs[t], &v, 16);
        }
#pragma unroll
        for (int r = 0; r < R; r++) C::template dot_h<NT>(w[r], xs, acc[r]);
        return;
    }
    const float *x = (const float *)xv;
    float xs[NT][EPC];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *p = (const float4 *)(x + (size_t)t * n_in + (size_t)c * EPC);
#pragma unroll
        for (int k = 0; k < EPC / 4; k++) {
            float4 v = __ldca(p + k); // written by the previous kernel: not the read-only path
            xs[t][4 * k] = v.x; xs[t][4 * k + 1] = v.y; xs[t][4 * k + 2] = v.z; xs[t][4 * k + 3] = v.w;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const kc_half *dr = d ? d + (size_t)min(row0 + r, n_out - 1) * row_scales : nullptr;
        C::template dot<NT>(w[r], dr, c, xs, acc[r]);
    }
}

// GLU: 0 a plain GEMV, 1 SwiGLU, 2 GeGLU in the epilogue (gemv_store_swiglu).
template <int TYPE, int NT, int R, int U, bool XH, int GLU = 0>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(const uint8_t *__restrict__ W, const kc_half *__restrict__ d, const void *x, float *y, int n_in, int n_out,
            int accumulate, gemv_swi sw) {
    KC_TRACE_SCOPE(KC_TR_GEMV);
    static_assert(!GLU || (R % 2 == 0 && TYPE == DT_F16), "a fused GLU needs gate and up rows in one warp");
    typedef wchunk<TYPE> C;
    constexpr int EPC = C::EPC;
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) {
        kc_pdl_wait();
        return;
    }
    const int nchunks = n_in / EPC;
    const size_t row_bytes = (size_t)nchunks * 16;
    const int row_scales = n_in / 32;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    const uint4 *wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) wrow[r] = (const uint4 *)(W + (size_t)min(row0 + r, n_out - 1) * row_bytes);

    // Two batches of U chunks per row are in flight: both are loaded before waiting for the
    // activations (programmatic launch: they stream while the previous kernel finishes), and
    // each iteration multiplies one batch while the next is arriving, then issues the one
    // after. The order in which chunks are added to a row's accumulator is the same whatever
    // R, U and NT are (c ascending per lane).
    int c = lane;
    uint4 w[U][R], wn[U][R];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (c + 32 * u < nchunks) w[u][r] = __ldg(wrow[r] + c + 32 * u);
            if (c + 32 * (U + u) < nchunks) wn[u][r] = __ldg(wrow[r] + c + 32 * (U + u));
        }
    kc_pdl_wait();
    float res[R][NT];
    gemv_load_residual<R, NT>(res, y, row0, n_out, n_out, lane, accumulate);
    for (; c + 32 * (U - 1) < nchunks; c += 32 * U) {
#pragma unroll
        for (int u = 0; u < U; u++) gemv_step<TYPE, NT, R, XH>(w[u], x, n_in, c + 32 * u, d, row0, n_out, row_scales, acc);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                w[u][r] = wn[u][r];
                if (c + 32 * (2 * U + u) < nchunks) wn[u][r] = __ldg(wrow[r] + c + 32 * (2 * U + u));
            }
    }
#pragma unroll
    for (int u = 0; u < U; u++)
        if (c + 32 * u < nchunks) gemv_step<TYPE, NT, R, XH>(w[u], x, n_in, c + 32 * u, d, row0, n_out, row_scales, acc);
    if constexpr (GLU) gemv_store_swiglu<R, NT, GLU == 2>(acc, sw, row0, lane);
    else gemv_store<R, NT>(acc, res, y, row0, n_out, n_out, lane, accumulate);
}

// ---- F16 GEMV on the tensor cores (1-8 tokens; the plan's f16_tc) -------------------------
// gemv_kernel's warps, rows and loads with R = 2 (lane l reads chunk l + 32 u of rows row0 and
// row0 + 1, 16 bytes each; U batches of chunks in flight and as many arriving), but the
// products on mma.sync m16n8k16, exact and summed in f32 (the FMA path rounds each product and
// each chunk's sum to half). Per block of 256 elements, lane (g, q) = (lane / 4, lane % 4)
// holds elements 8 q .. 8 q + 7 of segment g (32 elements) of both rows: A's row g is row0's
// segment g, row g + 8 row1's, B's column g the activations' segment g, in the same order (the
// k slots {2q, 2q + 1, 2q + 8, 2q + 9} of the first mma are the lane's elements 0..3, of the
// second 4..7). The products of A row i and B column j != i % 8 mix segments and are never
// read: C[g][g] and C[g + 8][g] collect the two rows' sums of segment g over the blocks, and the
// warp adds the eight segments. Each token has its own C; its sums do not depend on the other
// tokens, on U or on the launch, so a token's result is the same in any batch.
template <int NT, int U, bool XH, int GLU>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_f16_tc_kernel(const uint8_t *__restrict__ W, const void *x, float *y, int n_in, int n_out, int accumulate, gemv_swi sw) {
    KC_TRACE_SCOPE(KC_TR_GEMV);
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * 2;
    if (row0 >= n_out) {
        kc_pdl_wait();
        return;
    }
    const int nchunks = n_in / 8, nblk = (nchunks + 31) / 32;
    const uint4 *w0 = (const uint4 *)(W + (size_t)row0 * n_in * 2), *w1 = (const uint4 *)(W + (size_t)min(row0 + 1, n_out - 1) * n_in * 2);
    const uint4 z = make_uint4(0, 0, 0, 0);
    uint4 w[U][2], wn[U][2];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = 32 * u + lane, cn = 32 * (U + u) + lane;
        w[u][0] = c < nchunks ? __ldg(w0 + c) : z;
        w[u][1] = c < nchunks ? __ldg(w1 + c) : z;
        wn[u][0] = cn < nchunks ? __ldg(w0 + cn) : z;
        wn[u][1] = cn < nchunks ? __ldg(w1 + cn) : z;
    }
    kc_pdl_wait();
    float res[2][NT];
    gemv_load_residual<2, NT>(res, y, row0, n_out, n_out, lane, accumulate);
    float c[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.0f;
    // token t's activations of chunk ch (zeros past the row)
    auto xload = [&](int t, int ch) {
        uint4 xv = z;
        if (ch < nchunks) {
            if constexpr (XH) {
                xv = __ldca((const uint4 *)((const __half *)x + (size_t)t * n_in + (size_t)ch * 8));
            } else { // the half copy's values: each float rounded to half
                const float4 *p = (const float4 *)((const float *)x + (size_t)t * n_in + (size_t)ch * 8);
                const float4 f0 = __ldca(p), f1 = __ldca(p + 1);
                const __half2 h[4] = { __floats2half2_rn(f0.x, f0.y), __floats2half2_rn(f0.z, f0.w), __floats2half2_rn(f1.x, f1.y),
                                       __floats2half2_rn(f1.z, f1.w) };
                memcpy(&xv, h, 16);
            }
        }
        return xv;
    };
    for (int b = 0; b < nblk; b += U) { // warp-uniform: every lane takes part in each mma
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (b + u >= nblk) break;
            const int ch = 32 * (b + u) + lane;
            const uint32_t a0[4] = { w[u][0].x, w[u][1].x, w[u][0].y, w[u][1].y }, a1[4] = { w[u][0].z, w[u][1].z, w[u][0].w, w[u][1].w };
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const uint4 xv = xload(t, ch);
                kc_mma16816(c[t], a0, xv.x, xv.y);
                kc_mma16816(c[t], a1, xv.z, xv.w);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cn = 32 * (b + 2 * U + u) + lane;
            w[u][0] = wn[u][0];
            w[u][1] = wn[u][1];
            wn[u][0] = cn < nchunks ? __ldg(w0 + cn) : z;
            wn[u][1] = cn < nchunks ? __ldg(w1 + cn) : z;
        }
    }
    // the diagonal: lane (g, g / 2) holds C[g][g] (c0 or c1) and C[g + 8][g] (c2 or c3)
    const int g = lane >> 2, q = lane & 3;
    const bool diag = q == (g >> 1), odd = g & 1;
    float acc[2][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        acc[0][t] = diag ? (odd ? c[t][1] : c[t][0]) : 0.0f;
        acc[1][t] = diag ? (odd ? c[t][3] : c[t][2]) : 0.0f;
    }
    if constexpr (GLU) gemv_store_swiglu<2, NT, GLU == 2>(acc, sw, row0, lane);
    else gemv_store<2, NT>(acc, res, y, row0, n_out, n_out, lane, accumulate);
}

// Whether the F16 GEMV takes the tensor cores: the plan's f16_tc, on sm_80 code or newer.
static bool gemv_f16_tc_on() { return kc_plan_get()->f16_tc && kc_code_sm80(); }

template <int NT, bool XH>
static void launch_gemv_f16_tc(const kc_weight *W, const void *x, float *y, int acc, cudaStream_t s, const gemv_swi *sw) {
    constexpr int U = NT == 1 ? 4 : 2;
    const dim3 grid((W->n_out + 2 * GEMV_WARPS - 1) / (2 * GEMV_WARPS)), block(GEMV_WARPS * 32);
    const uint8_t *w = (const uint8_t *)W->data;
    if (!sw) kc_launch(gemv_f16_tc_kernel<NT, U, XH, 0>, grid, block, 0, s, w, x, y, W->n_in, W->n_out, acc, gemv_swi{});
    else if (sw->gelu) kc_launch(gemv_f16_tc_kernel<NT, U, XH, 2>, grid, block, 0, s, w, x, y, W->n_in, W->n_out, acc, *sw);
    else kc_launch(gemv_f16_tc_kernel<NT, U, XH, 1>, grid, block, 0, s, w, x, y, W->n_in, W->n_out, acc, *sw);
}

// Rows whose length is not a multiple of the vector width (tiny models): one element at a time.
__global__ void gemv_scalar_kernel(const void *W, int type, const float *x, float *y, int n_in, int n_out,
                                   int n_tok, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= n_out) return;
    for (int t = 0; t < n_tok; t++) {
        float acc = 0.0f;
        for (int i = lane; i < n_in; i += 32) {
            size_t k = (size_t)row * n_in + i;
            float w = type == DT_F32 ? ((const float *)W)[k]
                    : type == DT_F16 ? kc_h2f(((const uint16_t *)W)[k]) : kc_bf2f(((const uint16_t *)W)[k]);
            acc = fmaf(w, x[(size_t)t * n_in + i], acc);
        }
        acc = kc_warp_sum(acc);
        if (lane == 0) {
            float *dst = y + (size_t)t * n_out + row;
            *dst = accumulate ? *dst + acc : acc;
        }
    }
}

// Rows per warp: more rows share each activation load; fewer keep more warps in flight.
// sw (F16 gate|up only): SwiGLU / GeGLU fused when R is even; false, nothing launched, when it cannot be.
template <int TYPE, int NT, int R, int U, bool XH>
static bool launch_gemv_r(const kc_weight *W, const void *x, float *y, int acc, cudaStream_t s, const gemv_swi *sw) {
    if constexpr (TYPE == DT_F16)
        if (gemv_f16_tc_on()) { // two rows a warp: the SwiGLU fuses at every token count
            launch_gemv_f16_tc<NT, XH>(W, x, y, acc, s, sw);
            return true;
        }
    const int rows_per_block = GEMV_WARPS * R;
    dim3 grid((W->n_out + rows_per_block - 1) / rows_per_block), block(GEMV_WARPS * 32);
    if (sw) {
        if constexpr (TYPE == DT_F16 && R % 2 == 0) {
            if (sw->gelu)
                kc_launch(gemv_kernel<TYPE, NT, R, U, XH, 2>, grid, block, 0, s, (const uint8_t *)W->data,
                          (const kc_half *)W->d, x, y, W->n_in, W->n_out, acc, *sw);
            else
                kc_launch(gemv_kernel<TYPE, NT, R, U, XH, 1>, grid, block, 0, s, (const uint8_t *)W->data,
                          (const kc_half *)W->d, x, y, W->n_in, W->n_out, acc, *sw);
            return true;
        }
        return false;
    }
    kc_launch(gemv_kernel<TYPE, NT, R, U, XH>, grid, block, 0, s, (const uint8_t *)W->data, (const kc_half *)W->d, x, y,
              W->n_in, W->n_out, acc, gemv_swi{});
    return true;
}

// Bytes in flight per SM grow with n_out x U (not with R), so narrow matrices get U = 4.
// sw: see launch_gemv_r (returns whether the kernel was launched).
template <int TYPE, bool XH = false>
static bool launch_gemv(const kc_weight *W, const void *x, int n_tok, float *y, int acc, cudaStream_t s,
                        const gemv_swi *sw = nullptr) {
    switch (n_tok) {
    case 1:
        // 2 rows per warp, 4 batches of chunks in flight for every shape (F16: the wide matrices
        // 2-3 % faster too; whole F16 step 196.2 -> 197.0 tok/s, same run; bench/RESULTS.md
        // "2026-11-24 (gemmq)"); F32 / BF16 (rare: norms, small models) the same way
        return launch_gemv_r<TYPE, 1, 2, 4, XH>(W, x, y, acc, s, sw);
    case 2: return launch_gemv_r<TYPE, 2, 2, 2, XH>(W, x, y, acc, s, sw);
    case 3: return launch_gemv_r<TYPE, 3, 2, 2, XH>(W, x, y, acc, s, sw);
    case 4: return launch_gemv_r<TYPE, 4, 2, 2, XH>(W, x, y, acc, s, sw);
    case 5: return launch_gemv_r<TYPE, 5, 1, 2, XH>(W, x, y, acc, s, sw);
    case 6: return launch_gemv_r<TYPE, 6, 1, 2, XH>(W, x, y, acc, s, sw);
    case 7: return launch_gemv_r<TYPE, 7, 1, 2, XH>(W, x, y, acc, s, sw);
    case 8: return launch_gemv_r<TYPE, 8, 1, 2, XH>(W, x, y, acc, s, sw);
    }
    return false;
}

// ---- integer GEMV: quantized weights against two-level int8 activations (kc_xq) -------------
// A lane's unit of work is a chunk of EPC elements: one block of 32 (Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1) or a quarter super-block (Q4_K, Q5_K: two sub-blocks of 32; Q6_K: four of 16), NV
// 16-byte weight loads. Per block of 32 the dot product is exact in int32, I = 256 sum(w qh) +
// sum(w ql) (dp4a), and becomes a float once: d_w (d_x / 256) I for Q8_0, with I - 8 S for
// Q4_0's offset nibbles (I - 16 S: Q5_0), d I + m S for Q4_1 / Q5_1, d sc I - dmin m S per
// Q4_K / Q5_K sub-block, d sc (I - 32 S) per Q6_K sub-block of 16. The fifth (Q5) or fifth and
// sixth bits (Q6_K) are ORed onto the nibbles before the dot products. About a fifth of the
// instructions of the f32 path per weight, so these kernels stay bound by memory. The
// summation order of a (token, row) is fixed by the row length alone, as in the f32 GEMV.

template <int TYPE> struct qchunk;

template <> struct qchunk<DT_Q8_0> {
    static constexpr int EPC = 32, NV = 2;
    typedef uint32_t scale_t; // the block's half d
    __device__ static scale_t load_scale(const uint8_t *sc, size_t row, int nchunks, int c) {
        return __ldg((const uint16_t *)sc + row * nchunks + c);
    }
    __device__ static float dot(const uint4 *w, scale_t sc, const int *xh, const int *xl, const int2 *xm) {
        const int *wi = (const int *)w;
        int ih = 0, il = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            ih = __dp4a(wi[k], xh[k], ih);
            il = __dp4a(wi[k], xl[k], il);
        }
        return kc_h2f((uint16_t)sc) * __int_as_float(xm[0].x) * (float)(ih * 256 + il);
    }
};

// Q4_0, Q4_1, Q5_0, Q5_1: byte j of the block holds element j (low nibble) and j + 16 (high
// nibble); Q5 types OR the fifth bits from the block's high-bit word.
template <int TYPE> struct qchunk_b32 {
    static constexpr bool HI = TYPE == DT_Q5_0 || TYPE == DT_Q5_1;
    static constexpr int EPC = 32, NV = 1;
    // Q4_0: the block's half d; Q4_1: d | m << 16; Q5_0, Q5_1: { d (| m << 16), high-bit word }
    typedef typename std::conditional<HI, uint2, uint32_t>::type scale_t;
    __device__ static scale_t load_scale(const uint8_t *sc, size_t row, int nchunks, int c) {
        if constexpr (TYPE == DT_Q4_0) return __ldg((const uint16_t *)sc + row * nchunks + c);
        else if constexpr (TYPE == DT_Q4_1) return __ldg((const uint32_t *)sc + row * nchunks + c);
        else if constexpr (TYPE == DT_Q5_1) return __ldg((const uint2 *)sc + row * nchunks + c);
        else { // Q5_0: a row is nchunks high-bit words, then nchunks halves
            const uint8_t *r = sc + row * kc_wq_d_row(DT_Q5_0, 32 * nchunks);
            return make_uint2(__ldg((const uint16_t *)(r + 4 * (size_t)nchunks) + c), __ldg((const uint32_t *)r + c));
        }
    }
    __device__ static float dot(const uint4 *w, scale_t sc, const int *xh, const int *xl, const int2 *xm) {
        const uint32_t u[4] = { w[0].x, w[0].y, w[0].z, w[0].w };
        int ih = 0, il = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int lo = (int)(u[k] & 0x0F0F0F0Fu), hi = (int)((u[k] >> 4) & 0x0F0F0F0Fu);
            if constexpr (HI) {
                lo |= (int)kc_hbit4(sc.y, k);
                hi |= (int)kc_hbit4(sc.y, k + 4);
            }
            ih = __dp4a(lo, xh[k], ih);
            ih = __dp4a(hi, xh[k + 4], ih);
            il = __dp4a(lo, xl[k], il);
            il = __dp4a(hi, xl[k + 4], il);
        }
        if constexpr (TYPE == DT_Q4_0)
            return kc_h2f((uint16_t)sc) * __int_as_float(xm[0].x) * (float)(ih * 256 + il - 8 * xm[0].y);
        else if constexpr (TYPE == DT_Q5_0)
            return kc_h2f((uint16_t)sc.x) * __int_as_float(xm[0].x) * (float)(ih * 256 + il - 16 * xm[0].y);
        else {
            uint32_t dm;
            if constexpr (TYPE == DT_Q4_1) dm = sc;
            else dm = sc.x;
            return __int_as_float(xm[0].x) *
                   (kc_h2f((uint16_t)(dm & 0xFFFF)) * (float)(ih * 256 + il) + kc_h2f((uint16_t)(dm >> 16)) * (float)xm[0].y);
        }
    }
};
template <> struct qchunk<DT_Q4_0> : qchunk_b32<DT_Q4_0> {};
template <> struct qchunk<DT_Q4_1> : qchunk_b32<DT_Q4_1> {};
template <> struct qchunk<DT_Q5_0> : qchunk_b32<DT_Q5_0> {};
template <> struct qchunk<DT_Q5_1> : qchunk_b32<DT_Q5_1> {};

// Q4_K, Q5_K: chunk c is quarter j = c % 4 of its super-block: 32 bytes whose low nibbles are
// sub-block 2j (elements in order) and high nibbles sub-block 2j + 1; Q5_K ORs the fifth bits
// from those sub-blocks' high-bit words.
template <int TYPE> struct qchunk_k {
    static constexpr bool HI = TYPE == DT_Q5_K;
    static constexpr int EPC = 64, NV = 2;
    struct q5 { uint4 h; uint2 qh; };
    // the super-block's head: d | dmin << 16, then the 12 scale bytes (Q5_K: and the high-bit
    // words of the quarter's two sub-blocks)
    typedef typename std::conditional<HI, q5, uint4>::type scale_t;
    __device__ static scale_t load_scale(const uint8_t *sc, size_t row, int nchunks, int c) {
        if constexpr (HI) {
            const uint8_t *p = sc + (row * (nchunks / 4) + c / 4) * 48;
            return { __ldg((const uint4 *)p), __ldg((const uint2 *)(p + 16) + (c & 3)) };
        } else {
            return __ldg((const uint4 *)sc + row * (nchunks / 4) + c / 4);
        }
    }
    __device__ static float dot_c(const uint4 *w, const scale_t &s, int c, const int *xh, const int *xl, const int2 *xm) {
        const uint4 *hp;
        if constexpr (HI) hp = &s.h;
        else hp = &s;
        const uint4 &h = *hp;
        const uint32_t *u = (const uint32_t *)w;
        int ha = 0, la = 0, hb = 0, lb = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int lo = (int)(u[k] & 0x0F0F0F0Fu), hi = (int)((u[k] >> 4) & 0x0F0F0F0Fu);
            if constexpr (HI) {
                lo |= (int)kc_hbit4(s.qh.x, k);
                hi |= (int)kc_hbit4(s.qh.y, k);
            }
            ha = __dp4a(lo, xh[k], ha);
            la = __dp4a(lo, xl[k], la);
            hb = __dp4a(hi, xh[k + 8], hb);
            lb = __dp4a(hi, xl[k + 8], lb);
        }
        const int j = c & 3;
        float sa, ma, sb, mb;
        kc_q4k_scale_min(h, 2 * j, sa, ma);
        kc_q4k_scale_min(h, 2 * j + 1, sb, mb);
        const float d = kc_h2f((uint16_t)(h.x & 0xFFFF)), dmin = kc_h2f((uint16_t)(h.x >> 16));
        const float ra = d * sa * (float)(ha * 256 + la) - dmin * ma * (float)xm[0].y;
        const float rb = d * sb * (float)(hb * 256 + lb) - dmin * mb * (float)xm[1].y;
        return __int_as_float(xm[0].x) * ra + __int_as_float(xm[1].x) * rb;
    }
};
template <> struct qchunk<DT_Q4_K> : qchunk_k<DT_Q4_K> {};
template <> struct qchunk<DT_Q5_K> : qchunk_k<DT_Q5_K> {};

// Q6_K: chunk c is quarter c % 4 of its super-block (kc_common.cuh's 48 bytes), four sub-blocks
// of 16 with their own scales. The quants are used as they are (0..63) and the offset of 32
// comes off with the activations' sums over each sub-block of 16: the first of each block of 32
// by dp4a once per token (shared by the warp's rows, qaux), the second is the block's S less it.
template <> struct qchunk<DT_Q6_K> {
    static constexpr int EPC = 64, NV = 3;
    typedef uint2 scale_t; // x: the quarter's four int8 scales, y: the super-block's half d
    __device__ static scale_t load_scale(const uint8_t *sc, size_t row, int nchunks, int c) {
        const uint8_t *r = sc + row * kc_wq_d_row(DT_Q6_K, 64 * nchunks);
        return make_uint2(__ldg((const uint32_t *)r + c), __ldg((const uint16_t *)(r + 4 * (size_t)nchunks) + c / 4));
    }
    // 256 sum(qh) + sum(ql) over the chunk's elements 0..15 and 32..47
    __device__ static int2 xsums(const int *xh, const int *xl) {
        int h0 = 0, l0 = 0, h2 = 0, l2 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            h0 = __dp4a(xh[k], 0x01010101, h0);
            l0 = __dp4a(xl[k], 0x01010101, l0);
            h2 = __dp4a(xh[k + 8], 0x01010101, h2);
            l2 = __dp4a(xl[k + 8], 0x01010101, l2);
        }
        return make_int2(256 * h0 + l0, 256 * h2 + l2);
    }
    __device__ static float dot(const uint4 *w, scale_t sc, const int *xh, const int *xl, const int2 *xm, int2 xs) {
        const uint32_t *u = (const uint32_t *)w; // nibble words 0..7, then the high parts' 8..11
        int ih[4] = { 0, 0, 0, 0 }, il[4] = { 0, 0, 0, 0 };
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int lo = (int)((u[k] & 0x0F0F0F0Fu) | kc_q6_hi4(u + 8, k, 0));
            const int hi = (int)(((u[k] >> 4) & 0x0F0F0F0Fu) | kc_q6_hi4(u + 8, k, 1));
            const int a = k >> 2, b = 2 + (k >> 2); // the sub-blocks of elements 4k.. and 32 + 4k..
            ih[a] = __dp4a(lo, xh[k], ih[a]);
            il[a] = __dp4a(lo, xl[k], il[a]);
            ih[b] = __dp4a(hi, xh[k + 8], ih[b]);
            il[b] = __dp4a(hi, xl[k + 8], il[b]);
        }
        const int S[4] = { xs.x, xm[0].y - xs.x, xs.y, xm[1].y - xs.y };
        float r[4];
#pragma unroll
        for (int i = 0; i < 4; i++) r[i] = (float)(int8_t)(sc.x >> (8 * i)) * (float)(ih[i] * 256 + il[i] - 32 * S[i]);
        return kc_h2f((uint16_t)sc.y) * (__int_as_float(xm[0].x) * (r[0] + r[1]) + __int_as_float(xm[1].x) * (r[2] + r[3]));
    }
};

// What a type's dot products of one token share over the warp's rows, computed once per token
// and chunk (Q6_K: the sub-block sums of the activations; nothing for the others).
template <int TYPE> struct qaux {
    struct type {};
    __device__ static type make(const int *, const int *) { return {}; }
};
template <> struct qaux<DT_Q6_K> {
    typedef int2 type;
    __device__ static type make(const int *xh, const int *xl) { return qchunk<DT_Q6_K>::xsums(xh, xl); }
};

template <int TYPE> __device__ __forceinline__ float qdot(const uint4 *w, const typename qchunk<TYPE>::scale_t &sc, int c,
                                                         const int *xh, const int *xl, const int2 *xm,
                                                         const typename qaux<TYPE>::type &aux) {
    if constexpr (TYPE == DT_Q4_K || TYPE == DT_Q5_K) return qchunk<TYPE>::dot_c(w, sc, c, xh, xl, xm);
    else if constexpr (TYPE == DT_Q6_K) return qchunk<TYPE>::dot(w, sc, xh, xl, xm, aux);
    else return qchunk<TYPE>::dot(w, sc, xh, xl, xm);
}

// Loads a lane's batch of U chunks from c0 (chunks c0, c0 + L, ..., L lanes to a row) of the
// R rows wrow / rows into bw / bs.
template <int TYPE, int R, int U, int L>
__device__ __forceinline__ void gemvq_load(const uint4 *const (&wrow)[R], const size_t (&rows)[R], const uint8_t *sc, int nchunks,
                                           int c0, uint4 (&bw)[U][R][qchunk<TYPE>::NV],
                                           typename qchunk<TYPE>::scale_t (&bs)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int cc = c0 + L * u;
        if (cc < nchunks)
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int v = 0; v < qchunk<TYPE>::NV; v++) bw[u][r][v] = __ldg(wrow[r] + (size_t)cc * qchunk<TYPE>::NV + v);
                bs[u][r] = qchunk<TYPE>::load_scale(sc, rows[r], nchunks, cc);
            }
    }
}

// The lane's share of R rows times nb <= NT activation rows (xrow(t): the row of the two-level
// activations xqh / xql / xm that token t reads), added to acc[r][t]. The first batch of chunks
// (from the lane's first chunk c) is already in w / s; each iteration multiplies one batch while
// the next is in flight. A row's summation order depends only on its length and L. SX: the
// activations are in shared memory (ordinary loads; __ldca is a global-space load). ONE: the
// row has at most L U chunks, so one batch is all (no registers for a next one in flight).
template <int TYPE, int NT, int R, int U, int L, typename XRow, bool SX = false, bool ONE = false>
__device__ __forceinline__ void gemvq_loop(const uint4 *const (&wrow)[R], const size_t (&rows)[R], const uint8_t *sc,
                                           const int8_t *xqh, const int8_t *xql, const int2 *xm, int n_in, XRow xrow, int nb,
                                           int c, uint4 (&w)[U][R][qchunk<TYPE>::NV],
                                           typename qchunk<TYPE>::scale_t (&s)[U][R], float (&acc)[R][NT]) {
    typedef qchunk<TYPE> C;
    constexpr int EPC = C::EPC, NV = C::NV;
    const int nchunks = n_in / EPC, nblk = n_in / 32;
    uint4 wn[U][R][NV];
    typename C::scale_t sn[U][R];
    for (;;) {
        if constexpr (!ONE) gemvq_load<TYPE, R, U, L>(wrow, rows, sc, nchunks, c + L * U, wn, sn); // the next batch
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = c + L * u;
            if (cc >= nchunks) break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nb) break;
                const size_t xr = (size_t)xrow(t);
                int xh[EPC / 4], xl[EPC / 4];
                int2 xb[EPC / 32];
                const int4 *ph = (const int4 *)(xqh + xr * n_in + (size_t)cc * EPC);
                const int4 *pl = (const int4 *)(xql + xr * n_in + (size_t)cc * EPC);
#pragma unroll
                for (int k = 0; k < EPC / 16; k++) {
                    int4 a, b;
                    if constexpr (SX) a = ph[k], b = pl[k];
                    else a = __ldca(ph + k), b = __ldca(pl + k); // activations: not the read-only path
                    xh[4 * k] = a.x; xh[4 * k + 1] = a.y; xh[4 * k + 2] = a.z; xh[4 * k + 3] = a.w;
                    xl[4 * k] = b.x; xl[4 * k + 1] = b.y; xl[4 * k + 2] = b.z; xl[4 * k + 3] = b.w;
                }
#pragma unroll
                for (int k = 0; k < EPC / 32; k++) {
                    if constexpr (SX) xb[k] = xm[xr * nblk + (size_t)cc * (EPC / 32) + k];
                    else xb[k] = __ldca(xm + xr * nblk + (size_t)cc * (EPC / 32) + k);
                }
                const typename qaux<TYPE>::type aux = qaux<TYPE>::make(xh, xl);
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t] += qdot<TYPE>(w[u][r], s[u][r], cc, xh, xl, xb, aux);
            }
        }
        if constexpr (ONE) {
            break;
        } else {
            c += L * U;
            if (c >= nchunks) break;
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) {
#pragma unroll
                    for (int v = 0; v < NV; v++) w[u][r][v] = wn[u][r][v];
                    s[u][r] = sn[u][r];
                }
        }
    }
}

// The dense kernel keeps its own copy of gemvq_loop's body: built on the shared helpers, nvcc
// allocated Q6_K's 4-row one-token variant (llama2-7b's qkv and gate|up) with a 4-byte spill and
// the Q6_K llama2-7b step went from 420 to 357 tok/s on the H200 (bench/RESULTS.md, fourth
// 2026-11-25 session).
// The kernel's body for CTA blk of the launch (gemvq_kernel: blockIdx.x; gemvq2_kernel: its
// index within its range), after the programmatic trigger. hook: called by the warps that hold
// rows once their first weights are requested, before the wait (gemvq_rope_kernel's lookups).
struct gemv_no_hook {
    __device__ void operator()() const {}
};
template <int TYPE, int NT, int R, int U, class H = gemv_no_hook>
__device__ __forceinline__ void gemvq_body(const uint8_t *__restrict__ W, const uint8_t *__restrict__ sc, const int8_t *xqh,
                                           const int8_t *xql, const int2 *xm, float *y, int n_in, int n_out, int ldy, int accumulate,
                                           int blk, const H &hook = H()) {
    typedef qchunk<TYPE> C;
    constexpr int EPC = C::EPC, NV = C::NV;
    const int lane = threadIdx.x & 31;
    const int row0 = (blk * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= n_out) {
        kc_pdl_wait();
        return;
    }
    const int nchunks = n_in / EPC, nblk = n_in / 32;
    size_t rows[R];
    const uint4 *wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rows[r] = (size_t)min(row0 + r, n_out - 1);
        wrow[r] = (const uint4 *)(W + rows[r] * (size_t)nchunks * NV * 16);
    }
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    uint4 w[U][R][NV], wn[U][R][NV];
    typename C::scale_t s[U][R], sn[U][R];
    // loads the batch of U chunks from c0 (each lane's chunks c0 + 32 u) into bw / bs
    auto load = [&](int c0, uint4 (&bw)[U][R][NV], typename C::scale_t (&bs)[U][R]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = c0 + 32 * u;
            if (cc < nchunks)
#pragma unroll
                for (int r = 0; r < R; r++) {
#pragma unroll
                    for (int v = 0; v < NV; v++) bw[u][r][v] = __ldg(wrow[r] + (size_t)cc * NV + v);
                    bs[u][r] = C::load_scale(sc, rows[r], nchunks, cc);
                }
        }
    };
    // The first batch of U chunks of every row is loaded before waiting for the activations:
    // with programmatic launch it streams while the previous kernel finishes. Then each
    // iteration multiplies one batch while the next is in flight. One batch before the wait is
    // the fastest on an H100 (llama2-7b batch 1, none / two: Q4_0 -5 % / -3 %, Q8_0 -4 % / -6 %,
    // Q4_K -7 % / -13 %; bench/RESULTS.md): more loads then slow the kernels before this one.
    int c = lane;
    load(c, w, s);
    hook();
    kc_pdl_wait();
    float res[R][NT];
    gemv_load_residual<R, NT>(res, y, row0, n_out, ldy, lane, accumulate);
    for (;;) {
        load(c + 32 * U, wn, sn); // the next batch, in flight while this one is multiplied
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int cc = c + 32 * u;
            if (cc >= nchunks) break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int xh[EPC / 4], xl[EPC / 4];
                int2 xb[EPC / 32];
                const int4 *ph = (const int4 *)(xqh + (size_t)t * n_in + (size_t)cc * EPC);
                const int4 *pl = (const int4 *)(xql + (size_t)t * n_in + (size_t)cc * EPC);
#pragma unroll
                for (int k = 0; k < EPC / 16; k++) {
                    int4 a = __ldca(ph + k), b = __ldca(pl + k); // activations: not the read-only path
                    xh[4 * k] = a.x; xh[4 * k + 1] = a.y; xh[4 * k + 2] = a.z; xh[4 * k + 3] = a.w;
                    xl[4 * k] = b.x; xl[4 * k + 1] = b.y; xl[4 * k + 2] = b.z; xl[4 * k + 3] = b.w;
                }
#pragma unroll
                for (int k = 0; k < EPC / 32; k++) xb[k] = __ldca(xm + (size_t)t * nblk + (size_t)cc * (EPC / 32) + k);
                const typename qaux<TYPE>::type aux = qaux<TYPE>::make(xh, xl);
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t] += qdot<TYPE>(w[u][r], s[u][r], cc, xh, xl, xb, aux);
            }
        }
        c += 32 * U;
        if (c >= nchunks) break;
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int v = 0; v < NV; v++) w[u][r][v] = wn[u][r][v];
                s[u][r] = sn[u][r];
            }
    }
    gemv_store<R, NT>(acc, res, y, row0, n_out, ldy, lane, accumulate);
}

template <int TYPE, int NT, int R, int U>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemvq_kernel(const uint8_t *__restrict__ W, const uint8_t *__restrict__ sc, const int8_t *xqh, const int8_t *xql,
             const int2 *xm, float *y, int n_in, int n_out, int ldy, int accumulate) {
    KC_TRACE_SCOPE(KC_TR_GEMVQ);
    kc_pdl_trigger();
    gemvq_body<TYPE, NT, R, U>(W, sc, xqh, xql, xm, y, n_in, n_out, ldy, accumulate, blockIdx.x);
}

// One row range of a mixed matrix for gemvq2_kernel: its weights, scales, rows and output.
struct gemvq_range {
    const uint8_t *w, *sc;
    float *y;
    int n_out;
};

// A mixed matrix of two ranges at one token in one launch (the plan's mixed_one: Q4_K_M's Q|K
// with its Q6_K V): CTAs below nb1 take range a with T1's body and shape, the others range b
// with T2's, so each range's rows are the bits of its own launch, and b's CTAs run beside a's
// instead of in a second launch after them.
template <int T1, int R1, int U1, int T2, int R2, int U2>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemvq2_kernel(gemvq_range a, gemvq_range b, const int8_t *xqh, const int8_t *xql, const int2 *xm, int n_in, int ldy,
              int accumulate, int nb1) {
    KC_TRACE_SCOPE(KC_TR_GEMVQ);
    kc_pdl_trigger();
    if ((int)blockIdx.x < nb1) gemvq_body<T1, 1, R1, U1>(a.w, a.sc, xqh, xql, xm, a.y, n_in, a.n_out, ldy, accumulate, blockIdx.x);
    else gemvq_body<T2, 1, R2, U2>(b.w, b.sc, xqh, xql, xm, b.y, n_in, b.n_out, ldy, accumulate, blockIdx.x - nb1);
}

template <int TYPE, int NT, int R, int U>
static void launch_gemvq_r(const kc_weight *W, const kc_xq *xq, float *y, int ldy, int acc, cudaStream_t s) {
    const int rows_per_block = GEMV_WARPS * R;
    dim3 grid((W->n_out + rows_per_block - 1) / rows_per_block), block(GEMV_WARPS * 32);
    kc_launch(gemvq_kernel<TYPE, NT, R, U>, grid, block, 0, s, (const uint8_t *)W->data, (const uint8_t *)W->d, (const int8_t *)xq->qh,
              (const int8_t *)xq->ql, (const int2 *)xq->m, y, W->n_in, W->n_out, ldy, acc);
}

// Rows per warp for 2..8 tokens: every row re-reads the tokens' activations (from L1), so with
// one row per warp their loads, not the weights, bound the kernel as tokens are added. Chosen
// on an H100 from whole decode steps of llama2-7b at batch 2, 4 and 8 (bench/RESULTS.md
// "2026-11-24 (gemmq)"): 4 rows, but 2 for Q8_0 up to 4 tokens. Q4_1, Q5_0 and Q5_1 take
// Q4_0's 4 rows; Q5_K takes 2 rows from 4 tokens and Q6_K (48 bytes a row per chunk) from 3,
// where 4 rows spill 24 to 176 bytes of registers (nvcc -Xptxas -v; Q4_K's measured choice
// spills up to 128 there). Not yet measured on a GPU. A row's summation order does not depend
// on it (batch invariance).
template <int TYPE, int NT> constexpr int gemvq_rows() {
    if (TYPE == DT_Q8_0 && NT <= 4) return 2;
    if (TYPE == DT_Q5_K && NT >= 4) return 2;
    if (TYPE == DT_Q6_K && NT >= 3) return 2;
    return 4;
}
template <int TYPE, int NT>
static void launch_gemvq_nt(const kc_weight *W, const kc_xq *xq, float *y, int ldy, int acc, cudaStream_t s) {
    launch_gemvq_r<TYPE, NT, gemvq_rows<TYPE, NT>(), 1>(W, xq, y, ldy, acc, s);
}

// One token: rows per warp x chunks in flight, as 0xRU, per matrix shape: chosen on an H100
// from 1x1, 1x2, 1x4, 2x1, 2x2, 2x4, 4x1, 4x2, 8x1 with gpu_bench_gemv at llama2-7b's shapes
// (bench/RESULTS.md "2026-11-24 (gemmq)"). More rows share each activation load; fewer rows
// give the narrow matrices (4096 rows) enough CTAs; the long rows of down (11008) want two
// batches of chunks in flight. Then retuned on whole steps (bench/RESULTS.md "fourth
// session"), where the microbenchmark's order did not hold: Q4_0 8x1 for every matrix over
// 8192 rows (gate|up and the head too: +0.6 %), 2x1 for wo and 4x2 for down (+0.5 %); Q8_0
// 2x2 for down (+1.2 %). The types added since take their nearest measured type's choice
// (Q4_1, Q5_0, Q5_1: Q4_0's; Q5_K, Q6_K: Q4_K's, but 2x2 where Q4_K takes 4x2, which spills
// 100-170 bytes of registers with their larger chunks) until gpu_bench_gemv has been run on
// them.
template <int R_, int U_> struct gemvq_shape {
    static constexpr int R = R_, U = U_;
};
// The one-token shape above for an n_in x n_out matrix of TYPE: f(gemvq_shape<R, U>{}); true. With
// LONG false, rows past 8,192 columns are not taken (false, f's long-row shape not compiled).
template <int TYPE, bool LONG = true, class F> static bool gemvq1_shape(int n_in, int n_out, F &&f) {
    constexpr bool q32 = TYPE == DT_Q4_0 || TYPE == DT_Q4_1 || TYPE == DT_Q5_0 || TYPE == DT_Q5_1;
    constexpr bool kq = TYPE == DT_Q4_K || TYPE == DT_Q5_K || TYPE == DT_Q6_K;
    if (n_in > 8192) {
        if constexpr (!LONG) return false;
        else if constexpr (q32) f(gemvq_shape<4, 2>{});
        else if constexpr (kq) f(gemvq_shape<2, 1>{});
        else f(gemvq_shape<2, 2>{}); // Q8_0
        return true;
    }
    if constexpr (q32) {
        if (n_out > 8192) f(gemvq_shape<8, 1>{});
        else f(gemvq_shape<2, 1>{});
    } else if constexpr (kq) {
        constexpr int RN = TYPE == DT_Q4_K ? 4 : 2; // narrow matrices
        if (n_out <= 4096) f(gemvq_shape<RN, 2>{});
        else f(gemvq_shape<4, 1>{});
    } else {
        f(gemvq_shape<4, 1>{}); // Q8_0
    }
    return true;
}
template <int TYPE>
static void launch_gemvq1(const kc_weight *W, const kc_xq *xq, float *y, int ldy, int acc, cudaStream_t s) {
    gemvq1_shape<TYPE>(W->n_in, W->n_out, [&](auto sh) {
        launch_gemvq_r<TYPE, 1, decltype(sh)::R, decltype(sh)::U>(W, xq, y, ldy, acc, s);
    });
}

// gemvq2_kernel on the two ranges of a mixed matrix (a of T1, b of T2) at one token: a with its
// own one-token shape (gemvq1_shape), b (V, the smaller) with 2 rows a warp and one batch of
// chunks in flight, the shape of fewest registers (Q4_K_M's Q|K at 4,608 rows and V: 165 a
// thread, about the Q|K launch's own 168, where V's own <2, 2> would take 212 and leave room for
// two CTAs an SM instead of three). A row's bits do not depend on the shape (gemvq_rows). Only
// Q4_K or Q5_K followed by Q6_K (the K-quant mixes' Q|K|V) are compiled for it.
template <int T1, int T2>
static void launch_gemvq2(const kc_weight &a, const kc_weight &b, const kc_xq *xq, float *y, int ldy, int acc, cudaStream_t s) {
    gemvq1_shape<T1>(a.n_in, a.n_out, [&](auto sh) {
        constexpr int R1 = decltype(sh)::R;
        const int nb1 = (a.n_out + GEMV_WARPS * R1 - 1) / (GEMV_WARPS * R1), nb2 = (b.n_out + GEMV_WARPS * 2 - 1) / (GEMV_WARPS * 2);
        const gemvq_range ra = { (const uint8_t *)a.data, (const uint8_t *)a.d, y, a.n_out },
                          rb = { (const uint8_t *)b.data, (const uint8_t *)b.d, y + a.n_out, b.n_out };
        kc_launch(gemvq2_kernel<T1, R1, decltype(sh)::U, T2, 2, 1>, dim3(nb1 + nb2), dim3(GEMV_WARPS * 32), 0, s, ra, rb,
                  (const int8_t *)xq->qh, (const int8_t *)xq->ql, (const int2 *)xq->m, a.n_in, ldy, acc, nb1);
    });
}
// Whether gemvq2_kernel takes mixed matrix W: two ranges, Q4_K or Q5_K then Q6_K
static bool gemvq2_pair(const kc_weight *W) {
    return W->n_parts == 2 && W->part[0].row0 == 0 && W->part[1].row0 == W->part[0].n_rows && W->part[1].type == DT_Q6_K &&
           (W->part[0].type == DT_Q4_K || W->part[0].type == DT_Q5_K);
}
static bool gemvq2_take(const kc_weight *W, const kc_xq *xq, float *y, int acc, cudaStream_t s) {
    if (!gemvq2_pair(W)) return false;
    const kc_weight a = kc_weight_part_view(W, 0), b = kc_weight_part_view(W, 1);
    if (a.type == DT_Q4_K) launch_gemvq2<DT_Q4_K, DT_Q6_K>(a, b, xq, y, W->n_out, acc, s);
    else if (a.type == DT_Q5_K) launch_gemvq2<DT_Q5_K, DT_Q6_K>(a, b, xq, y, W->n_out, acc, s);
    else return false;
    return true;
}

// ---- one token's Q|K|V GEMV rotating its own heads (the plan's qkv_rope) --------------------
// The RoPE launch after a one-token Q|K|V GEMV costs a launch and its wait a layer. Here the CTAs
// of V rows store them into the cache, and the last CTA of each q or k head to finish (a counter a
// head, att_last_split: no fence) reads the head back through the L2 and rotates it
// with kc_rope_store_kv's code (rope_common.cuh): the same bits as the two launches.

// The token's position and its cache row (block row of KV head 0): pos, seq and the block tables
// are staged before the step, so one lane of the last warp reads them before the programmatic
// wait, once its first weights are requested (gemvq_body's hook), so that the lookup's two
// dependent loads do not hold that warp's weight requests back.
struct qkv_where {
    int p;
    size_t slot;
};
__device__ __forceinline__ void qkv_rope_where(const kc_qkv_rope &e, qkv_where *w) {
    if (threadIdx.x != (GEMV_WARPS - 1) * 32) return;
    w->p = e.pos[0];
    w->slot = rope_cache_slot(e.pos, e.seq, e.block_tables, 0, e.max_blocks, e.n_kv, e.block_size);
}

// After the CTA's rows [r0, r0 + nr) of y (one head's, nr dividing hd) were stored by its warps.
__device__ __forceinline__ void qkv_rope_epilogue(const kc_qkv_rope &e, const float *y, int r0, int nr, const qkv_where &w) {
    __shared__ float hv[256], red[2];
    const int hd = e.hd, h = r0 / hd, tid = threadIdx.x;
    if (h >= e.n_head + e.n_kv) { // v rows: into the cache as half
        __syncthreads(); // the CTA's rows (y) and w
        __half *dst = (__half *)e.v_cache + (w.slot + (size_t)(h - e.n_head - e.n_kv) * e.block_size) * hd + (r0 - h * hd);
        for (int i = tid; i < nr; i += blockDim.x) dst[i] = __float2half(__ldcg(y + r0 + i));
        return;
    }
    if (!att_last_split(e.counters + h, hd / nr)) return; // its barrier: the CTA's rows and w
    const int p = w.p;
    const size_t slot = w.slot;
    float s0 = 0.0f, c0 = 0.0f;
    if (tid < e.rope.rope_dim / 2) sincosf((float)p * rope_freq(e.rope, tid), &s0, &c0);
    for (int i = tid; i < hd; i += blockDim.x) hv[i] = __ldcg(y + (size_t)h * hd + i);
    __syncthreads();
    const bool q = h < e.n_head;
    const float *nw = e.rope.q_norm ? (q ? e.rope.q_norm : e.rope.k_norm) : nullptr;
    rope_head(hv, nw, q ? e.q_out + (size_t)h * hd : nullptr,
              q ? nullptr : (__half *)e.k_cache + (slot + (size_t)(h - e.n_head) * e.block_size) * hd, nullptr, hd, p, s0, c0, e.rope, tid,
              rope_head_threads(hd), red);
}

template <int TYPE, int R, int U>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemvq_rope_kernel(const uint8_t *__restrict__ W, const uint8_t *__restrict__ sc, const int8_t *xqh, const int8_t *xql,
                  const int2 *xm, float *y, int n_in, int n_out, const __grid_constant__ kc_qkv_rope e) {
    KC_TRACE_SCOPE(KC_TR_GEMVQ);
    kc_pdl_trigger();
    __shared__ qkv_where w;
    gemvq_body<TYPE, 1, R, U>(W, sc, xqh, xql, xm, y, n_in, n_out, n_out, 0, blockIdx.x, [&] { qkv_rope_where(e, &w); });
    qkv_rope_epilogue(e, y, blockIdx.x * GEMV_WARPS * R, GEMV_WARPS * R, w);
}

// gemvq2_kernel's two ranges (Q|K, then V) with the rotation
template <int T1, int R1, int U1, int T2, int R2, int U2>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemvq2_rope_kernel(gemvq_range a, gemvq_range b, const int8_t *xqh, const int8_t *xql, const int2 *xm, int n_in, int nb1,
                   const __grid_constant__ kc_qkv_rope e) {
    KC_TRACE_SCOPE(KC_TR_GEMVQ);
    kc_pdl_trigger();
    __shared__ qkv_where w;
    const int ldy = a.n_out + b.n_out;
    const auto where = [&] { qkv_rope_where(e, &w); };
    int r0, nr;
    if ((int)blockIdx.x < nb1) {
        gemvq_body<T1, 1, R1, U1>(a.w, a.sc, xqh, xql, xm, a.y, n_in, a.n_out, ldy, 0, blockIdx.x, where);
        r0 = blockIdx.x * GEMV_WARPS * R1;
        nr = GEMV_WARPS * R1;
    } else {
        gemvq_body<T2, 1, R2, U2>(b.w, b.sc, xqh, xql, xm, b.y, n_in, b.n_out, ldy, 0, blockIdx.x - nb1, where);
        r0 = a.n_out + (blockIdx.x - nb1) * GEMV_WARPS * R2;
        nr = GEMV_WARPS * R2;
    }
    qkv_rope_epilogue(e, a.y, r0, nr, w);
}

// Rows a CTA of TYPE's one-token launch for an n_in x n_out matrix (0: a shape not compiled here)
template <int TYPE> static int gemvq1_cta_rows(int n_in, int n_out) {
    int rows = 0;
    gemvq1_shape<TYPE, false>(n_in, n_out, [&](auto sh) { rows = GEMV_WARPS * decltype(sh)::R; });
    return rows;
}
template <int TYPE>
static void launch_gemvq_rope(const kc_weight *W, const kc_xq *xq, float *y, const kc_qkv_rope &e, cudaStream_t s) {
    gemvq1_shape<TYPE, false>(W->n_in, W->n_out, [&](auto sh) {
        constexpr int R = decltype(sh)::R;
        kc_launch(gemvq_rope_kernel<TYPE, R, decltype(sh)::U>, dim3(W->n_out / (GEMV_WARPS * R)), dim3(GEMV_WARPS * 32), 0, s,
                  (const uint8_t *)W->data, (const uint8_t *)W->d, (const int8_t *)xq->qh, (const int8_t *)xq->ql,
                  (const int2 *)xq->m, y, W->n_in, W->n_out, e);
    });
}
// launch_gemvq2's shapes (b: 2 rows a warp, one batch of chunks)
template <int T1>
static void launch_gemvq2_rope(const kc_weight &a, const kc_weight &b, const kc_xq *xq, float *y, const kc_qkv_rope &e,
                               cudaStream_t s) {
    gemvq1_shape<T1, false>(a.n_in, a.n_out, [&](auto sh) {
        constexpr int R1 = decltype(sh)::R;
        const int nb1 = a.n_out / (GEMV_WARPS * R1), nb2 = b.n_out / (GEMV_WARPS * 2);
        const gemvq_range ra = { (const uint8_t *)a.data, (const uint8_t *)a.d, y, a.n_out },
                          rb = { (const uint8_t *)b.data, (const uint8_t *)b.d, y + a.n_out, b.n_out };
        kc_launch(gemvq2_rope_kernel<T1, R1, decltype(sh)::U, DT_Q6_K, 2, 1>, dim3(nb1 + nb2), dim3(GEMV_WARPS * 32), 0, s, ra, rb,
                  (const int8_t *)xq->qh, (const int8_t *)xq->ql, (const int2 *)xq->m, a.n_in, nb1, e);
    });
}

static int gemv_activations(const kc_weight *W, const float *x, const kc_xq **xq, int n_tok, const kc_gemm_ws *ws,
                            cudaStream_t s);
extern "C" int kc_matmul_qkv_rope(const kc_weight *W, const float *x, const kc_xq *xq, float *y, const kc_qkv_rope *e,
                                  const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W || !x || !y || !e) return CM_EINVAL;
    const int hd = e->hd;
    if (!e->q_out || !e->k_cache || !e->v_cache || !e->pos || !e->seq || !e->block_tables || !e->counters || e->n_head <= 0 ||
        e->n_kv <= 0 || hd <= 0 || hd > 256 || e->block_size <= 0 || e->max_blocks <= 0 || e->rope.rope_dim <= 0 ||
        e->rope.rope_dim > hd || e->rope.rope_dim % 2 || (e->rope.q_norm && !e->rope.k_norm))
        return CM_EINVAL;
    if (!kc_plan_get()->qkv_rope || W->n_out != (e->n_head + 2 * e->n_kv) * hd) return 0;
    // the CTAs' rows (each range's): every CTA within one head
    int rows = 0, rows_b = 0;
    kc_weight a = *W, b = {};
    const bool mixed = W->type == KC_WEIGHT_MIXED;
    if (mixed) {
        if (!kc_plan_get()->mixed_one || !gemvq2_pair(W)) return 0;
        a = kc_weight_part_view(W, 0);
        b = kc_weight_part_view(W, 1);
        if (a.n_out % hd) return 0;
        rows_b = GEMV_WARPS * 2;
    }
    // the K-quants only: llama2-7b batch 1 on an H200, Q4_K_M 465 -> 473 tok/s, qwen3-30b-a3b Q4_K_M
    // 453 -> 455, but Q4_0 598 -> 570 (ptxas gives its 8-row variant 128 registers where
    // gemvq_kernel's takes 167: the literal accumulate = 0 compiles the residual out; passed as a
    // parameter it takes 168, not measured) and Q8_0 not measured (bench/RESULTS.md, twenty-fourth
    // session)
    switch (a.type) {
    case DT_Q4_K: rows = gemvq1_cta_rows<DT_Q4_K>(a.n_in, a.n_out); break;
    case DT_Q5_K: rows = gemvq1_cta_rows<DT_Q5_K>(a.n_in, a.n_out); break;
    case DT_Q6_K: rows = mixed ? 0 : gemvq1_cta_rows<DT_Q6_K>(a.n_in, a.n_out); break;
    default: return 0;
    }
    if (!rows || hd % rows || (mixed && hd % rows_b)) return 0;
    if (int rc = gemv_activations(W, x, &xq, 1, ws, s)) return rc;
    switch (mixed ? -a.type : a.type) {
    case DT_Q4_K: launch_gemvq_rope<DT_Q4_K>(W, xq, y, *e, s); break;
    case DT_Q5_K: launch_gemvq_rope<DT_Q5_K>(W, xq, y, *e, s); break;
    case DT_Q6_K: launch_gemvq_rope<DT_Q6_K>(W, xq, y, *e, s); break;
    case -DT_Q4_K: launch_gemvq2_rope<DT_Q4_K>(a, b, xq, y, *e, s); break;
    default: launch_gemvq2_rope<DT_Q5_K>(a, b, xq, y, *e, s); break;
    }
    const int rc = []() -> int { KC_LAUNCH_CHECK(); }();
    return rc ? rc : 1;
}

template <int TYPE>
static void launch_gemvq(const kc_weight *W, const kc_xq *xq, int n_tok, float *y, int ldy, int acc, cudaStream_t s) {
    switch (n_tok) {
    case 1: launch_gemvq1<TYPE>(W, xq, y, ldy, acc, s); break;
    case 2: launch_gemvq_nt<TYPE, 2>(W, xq, y, ldy, acc, s); break;
    case 3: launch_gemvq_nt<TYPE, 3>(W, xq, y, ldy, acc, s); break;
    case 4: launch_gemvq_nt<TYPE, 4>(W, xq, y, ldy, acc, s); break;
    case 5: launch_gemvq_nt<TYPE, 5>(W, xq, y, ldy, acc, s); break;
    case 6: launch_gemvq_nt<TYPE, 6>(W, xq, y, ldy, acc, s); break;
    case 7: launch_gemvq_nt<TYPE, 7>(W, xq, y, ldy, acc, s); break;
    case 8: launch_gemvq_nt<TYPE, 8>(W, xq, y, ldy, acc, s); break;
    }
}

// ---- grouped integer GEMV over the chosen experts (mixture of experts) ----------------------
// CTA (i, row tile) computes rows of the i-th chosen expert (kc_moe_expert) for each of its
// entries, NT at a time, on the integer GEMV's chunks (gemvq_loop). L lanes share a row: 32, or 16
// for rows of at most 16 chunks (an expert's down projection: 768 values are 12 Q4_K chunks), so a
// warp has two rows' loads in flight instead of idle lanes; L depends on n_in alone, so a row's
// summation order does not change with NT or R. Entries are the activation rows of xq through
// x_div (gate|up: token i / k; down: entry i).
constexpr int MOEQ_WARPS = 4;
// What a launch of moe_gemvq_kernel does around the dot products: MOEQ_PLAIN y = W x from the
// blocks in xq; MOEQ_GLU the gate|up experts with the SwiGLU in the epilogue (a lane group's R
// rows are R / 2 gate rows and the up rows of the same columns; y = act [entries][n_out / 2]);
// MOEQ_SX x in f32, each CTA quantizing its entries' rows into shared memory first.
enum { MOEQ_PLAIN = 0, MOEQ_GLU = 1, MOEQ_SX = 2 };
// The plan's moe_pre (one-token launches with the choices, idx1): MOEQ_PRE_LATE, the gate|up
// launch lets the next one start only past its wait, when the routing it waited for has
// finished; MOEQ_PRE_SPEC, the down launch reads its choice and requests its rows before its
// wait, and reloads after the wait if the choice read then differs. Same bits either way.
// Measured (gpu_bench_moe, 48 layers of qwen3-30b-a3b's experts, H200): the pair 19.3 us a
// layer, 17.95 with SPEC, SPEC and LATE together the same, LATE alone 19.3: the down launch
// starts while gate|up's last CTAs run, after the routing, without LATE.
// MOEQ_PRE_SPEC_GU: the gate|up launch reads its choice before its wait too. Right only where the
// routing finished before that launch started (gpu_bench_moe's fixed choices: an upper bound of
// what an early routing would give); in the forward the norm launch routes after gate|up has
// started, so the early read is the previous layer's and the rows are loaded twice. Same bits.
enum { MOEQ_PRE_LATE = 1, MOEQ_PRE_SPEC = 2, MOEQ_PRE_SPEC_GU = 4 };

// ONE: rows of at most L chunks (moe_gemvq_loop's ONE). idx1 (one token, NT = 1): CTA i takes
// entry i, of expert idx1[i] (kc_moe_route's choices; cnt, off and list are not read).
template <int TYPE, int NT, int R, int L, int MODE, bool ONE>
__global__ void __launch_bounds__(MOEQ_WARPS * 32)
moe_gemvq_kernel(const uint8_t *__restrict__ W, const uint8_t *__restrict__ sc, const int8_t *xqh, const int8_t *xql,
                 const int2 *xm, float *y, const int32_t *cnt, const int32_t *off, const int32_t *list, int n_in, int n_out,
                 int x_div, int n_exp, const float *xf, const float *row_w, const int32_t *idx1, int pre) {
    KC_TRACE_SCOPE(MODE == MOEQ_GLU ? KC_TR_SWIGLU : KC_TR_GEMVQ); // the fused gate|up apart from down in a trace
    typedef qchunk<TYPE> C;
    constexpr int NV = C::NV, G = 32 / L, RO = MODE == MOEQ_GLU ? R / 2 : R; // RO: output rows of a lane group
    static_assert(MODE != MOEQ_GLU || R % 2 == 0, "gate and up rows in pairs");
    const int lane = threadIdx.x & 31, ll = lane % L;
    const int n_rows = MODE == MOEQ_GLU ? n_out / 2 : n_out; // the output rows (columns of act for GLU)
    const int row0 = ((blockIdx.y * MOEQ_WARPS + (threadIdx.x >> 5)) * G + lane / L) * RO;
    const bool idle = (row0 - (lane / L) * RO) >= n_rows; // the warp's first row: whole warps
    const int nchunks = n_in / C::EPC;
    size_t rows[R];
    const uint4 *wrow[R];
    auto expert_rows = [&](int e) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int j = MODE == MOEQ_GLU ? (r < RO ? 0 : n_rows) + min(row0 + r % RO, n_rows - 1) : min(row0 + r, n_out - 1);
            rows[r] = (size_t)e * n_out + j;
            wrow[r] = (const uint4 *)(W + rows[r] * (size_t)nchunks * NV * 16);
        }
    };
    uint4 w[1][R][NV];
    typename C::scale_t s[1][R];
    // MOEQ_PRE_SPEC (one token): the CTA's choice as it reads before the wait, its rows requested
    // at once; the choice read again after the wait says whether they were the right ones
    const bool spec = NT == 1 && idx1 && (pre & (MODE == MOEQ_GLU ? MOEQ_PRE_SPEC_GU : MOEQ_PRE_SPEC));
    int es = -1;
    if (spec) {
        es = min(max(__ldcg(idx1 + blockIdx.x), 0), n_exp - 1); // in bounds whatever the memory held
        expert_rows(es);
        if (!idle) gemvq_load<TYPE, R, 1, L>(wrow, rows, sc, nchunks, ll, w, s);
    }
    if (!(pre & MOEQ_PRE_LATE)) kc_pdl_trigger();
    kc_pdl_wait();
    if (pre & MOEQ_PRE_LATE) kc_pdl_trigger(); // the next launch starts past this one's wait (MOEQ_PRE_LATE)
    int e, n = 1, o0 = 0;
    if (NT == 1 && idx1) {
        e = idx1[blockIdx.x];
    } else {
        e = kc_moe_expert(cnt, n_exp, blockIdx.x);
        if (e < 0) return;
        n = cnt[e], o0 = off[e];
        if (!n) return;
    }
    // entry q of the CTA's (q < n)
    auto entry = [&](int q) { return NT == 1 && idx1 ? (int)blockIdx.x : list[o0 + q]; };
    if (MODE != MOEQ_SX && idle) return;
    if (!spec || e != es) { // the first weights in flight before anything else is read
        expert_rows(e);
        if (!idle) gemvq_load<TYPE, R, 1, L>(wrow, rows, sc, nchunks, ll, w, s);
    }
    if constexpr (MODE == MOEQ_SX) { // the entries' rows (at most NT: the launcher's condition) as blocks, kc_xq_block4's bits
        extern __shared__ int4 s_xq[];
        int8_t *sqh = (int8_t *)s_xq, *sql = sqh + (size_t)NT * n_in;
        int32_t *sm = (int32_t *)(sql + (size_t)NT * n_in);
        const int n4 = n_in / 4, tot = n * n4; // whole blocks: 8 consecutive threads, n_in % 32 == 0
        for (int i0 = 0; i0 < tot; i0 += blockDim.x) {
            const int i = i0 + threadIdx.x, q = i / n4, c = (i - q * n4) * 4;
            const bool ok = i < tot;
            float4 v = make_float4(0, 0, 0, 0);
            if (ok) v = *(const float4 *)(xf + (size_t)entry(q) * n_in + c);
            kc_xq_block4(v, ok, sqh, sql, sm, nullptr, (size_t)q * n_in + c);
        }
        __syncthreads();
        if (idle) return;
        xqh = sqh, xql = sql, xm = (const int2 *)sm;
    }
    for (int b = 0; b < n; b += NT) {
        const int nb = min(NT, n - b);
        int ent[NT], xr[NT];
#pragma unroll
        for (int q = 0; q < NT; q++) {
            ent[q] = q < nb ? entry(b + q) : 0;
            xr[q] = MODE == MOEQ_SX ? q : ent[q] / x_div;
        }
        float acc[R][NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        if (b > 0) gemvq_load<TYPE, R, 1, L>(wrow, rows, sc, nchunks, ll, w, s);
        auto xrow = [&](int t) { return xr[t]; };
        gemvq_loop<TYPE, NT, R, 1, L, decltype(xrow), MODE == MOEQ_SX, ONE>(wrow, rows, sc, xqh, xql, xm, n_in, xrow, nb, ll, w, s, acc);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int o = L / 2; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
#pragma unroll
        for (int r = 0; r < RO; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (!(t < nb && ll == 0 && row0 + r < n_rows)) continue;
                if constexpr (MODE == MOEQ_GLU) { // glu_split_xq_kernel's expression
                    float v = kc_silu_mul(acc[r][t], acc[r + RO][t]);
                    if (row_w) v = v * row_w[ent[t]];
                    y[(size_t)ent[t] * n_rows + row0 + r] = v;
                } else
                    y[(size_t)ent[t] * n_out + row0 + r] = acc[r][t];
            }
    }
}

template <int TYPE, int NT, int R, int L, int MODE, bool ONE>
static void launch_moe_gemvq_r(const kc_weight *W, int n_exp, const kc_xq *xq, int x_div, const int32_t *cnt, const int32_t *off,
                               const int32_t *list, int n_ent, float *y, const float *xf, const float *row_w, size_t smem,
                               const int32_t *idx1, cudaStream_t s) {
    const int n_out = W->n_out / n_exp, rows_per_cta = MOEQ_WARPS * (32 / L) * (MODE == MOEQ_GLU ? R / 2 : R);
    const int n_rows = MODE == MOEQ_GLU ? n_out / 2 : n_out;
    const dim3 grid(n_ent < n_exp ? n_ent : n_exp, (n_rows + rows_per_cta - 1) / rows_per_cta), block(MOEQ_WARPS * 32);
    const int pre = !idx1 ? 0
                          : kc_plan_get()->moe_pre &
                                (MODE == MOEQ_GLU ? MOEQ_PRE_LATE | MOEQ_PRE_SPEC_GU : MODE == MOEQ_SX ? MOEQ_PRE_SPEC : 0);
    kc_launch(moe_gemvq_kernel<TYPE, NT, R, L, MODE, ONE>, grid, block, smem, s, (const uint8_t *)W->data, (const uint8_t *)W->d,
              xq ? (const int8_t *)xq->qh : nullptr, xq ? (const int8_t *)xq->ql : nullptr, xq ? (const int2 *)xq->m : nullptr, y,
              cnt, off, list, W->n_in, n_out, x_div, n_exp, xf, row_w, idx1, pre);
}

// One token (an entry per expert): 4 rows a warp (2 for Q5_K and Q6_K, whose larger chunks
// spill with 4); rows of at most L chunks (qwen3-30b-a3b's experts: 32 chunks of gate|up, 12 of
// down) without the next batch's registers: 193-242 registers a thread took two CTAs an SM and
// three to four waves of CTAs a launch. More tokens: 8 entries a pass, 4 rows a warp but 2 for
// the K-quants (4 spill 264 bytes of registers with Q4_K; nvcc -Xptxas -v).
template <int TYPE, int L, int MODE>
static void launch_moe_gemvq_l(const kc_weight *W, int n_exp, const kc_xq *xq, int x_div, const int32_t *cnt, const int32_t *off,
                               const int32_t *list, int n_ent, int n_tok, float *y, const float *xf, const float *row_w, size_t smem,
                               const int32_t *idx1, cudaStream_t s) {
    constexpr bool K = TYPE == DT_Q4_K || TYPE == DT_Q5_K || TYPE == DT_Q6_K;
    constexpr int R1 = TYPE == DT_Q5_K || TYPE == DT_Q6_K ? 2 : 4, R8 = K ? 2 : 4;
    if (n_tok == 1 && W->n_in / qchunk<TYPE>::EPC <= L)
        launch_moe_gemvq_r<TYPE, 1, R1, L, MODE, true>(W, n_exp, xq, x_div, cnt, off, list, n_ent, y, xf, row_w, smem, idx1, s);
    else if (n_tok == 1)
        launch_moe_gemvq_r<TYPE, 1, R1, L, MODE, false>(W, n_exp, xq, x_div, cnt, off, list, n_ent, y, xf, row_w, smem, idx1, s);
    else launch_moe_gemvq_r<TYPE, 8, R8, L, MODE, false>(W, n_exp, xq, x_div, cnt, off, list, n_ent, y, xf, row_w, smem, nullptr, s);
}

// Every quantized type, L by the row width (half a warp for rows of at most 16 chunks).
template <int MODE>
static int launch_moe_gemvq(const kc_weight *W, int n_exp, const kc_xq *xq, int x_div, const int32_t *cnt, const int32_t *off,
                            const int32_t *list, int n_tok, int k, float *y, const float *xf, const float *row_w, size_t smem,
                            const int32_t *idx1, cudaStream_t s) {
    const int n_ent = n_tok * k; // an expert has at most n_tok entries: a token chooses it once
    const bool half = W->n_in / (W->type == DT_Q4_K || W->type == DT_Q5_K || W->type == DT_Q6_K ? 64 : 32) <= 16;
#define MOEQ_T(T)                                                                                                  \
    case T:                                                                                                        \
        if (half) launch_moe_gemvq_l<T, 16, MODE>(W, n_exp, xq, x_div, cnt, off, list, n_ent, n_tok, y, xf, row_w, smem, idx1, s); \
        else launch_moe_gemvq_l<T, 32, MODE>(W, n_exp, xq, x_div, cnt, off, list, n_ent, n_tok, y, xf, row_w, smem, idx1, s); \
        break;
    switch (W->type) {
        MOEQ_T(DT_Q4_0)
        MOEQ_T(DT_Q4_1)
        MOEQ_T(DT_Q5_0)
        MOEQ_T(DT_Q5_1)
        MOEQ_T(DT_Q8_0)
        MOEQ_T(DT_Q4_K)
        MOEQ_T(DT_Q5_K)
        MOEQ_T(DT_Q6_K)
    default: return CM_EUNSUPPORTED;
    }
#undef MOEQ_T
    KC_LAUNCH_CHECK();
}

extern "C" int kc_moe_type_ok(int type, int n_in) {
    if (type == DT_F16) return n_in > 0 && n_in % 8 == 0;
    return is_quant(type) && n_in > 0 && n_in % dt_block_size(type) == 0 && n_in % 32 == 0;
}

extern "C" int kc_moe_gemvq(const kc_weight *W, int n_exp, const kc_xq *xq, int x_div, const int32_t *cnt, const int32_t *off,
                            const int32_t *list, int n_tok, int k, float *y, cudaStream_t s) {
    if (!W || !W->data || !W->d || !xq || !xq->qh || !cnt || !off || !list || !y || n_exp <= 0 || x_div <= 0 || n_tok <= 0 ||
        k <= 0 || !is_quant(W->type) || W->n_out % n_exp || !kc_moe_type_ok(W->type, W->n_in) || xq->n != W->n_in)
        return CM_EINVAL;
    return launch_moe_gemvq<MOEQ_PLAIN>(W, n_exp, xq, x_div, cnt, off, list, n_tok, k, y, nullptr, nullptr, 0, nullptr, s);
}

// The entries' lookup of the fused launches: with one token and idx, the choices themselves (k
// distinct experts, k <= n_exp), else the grouping.
static bool moe_lookup_ok(const int32_t *idx, const int32_t *cnt, const int32_t *off, const int32_t *list, int n_tok, int k, int n_exp) {
    return (n_tok == 1 && idx && k <= n_exp) || (cnt && off && list);
}

extern "C" int kc_moe_gemvq_glu(const kc_weight *W, int n_exp, const kc_xq *xq, int x_div, const int32_t *idx, const int32_t *cnt,
                                const int32_t *off, const int32_t *list, int n_tok, int k, const float *row_w, float *act,
                                cudaStream_t s) {
    if (!W || !W->data || !W->d || !xq || !xq->qh || !act || n_exp <= 0 || x_div <= 0 || n_tok <= 0 || k <= 0 ||
        W->n_out % (2 * n_exp) || xq->n != W->n_in || !moe_lookup_ok(idx, cnt, off, list, n_tok, k, n_exp))
        return CM_EINVAL;
    if (!is_quant(W->type) || !kc_moe_type_ok(W->type, W->n_in) || n_tok > KC_GEMV_MAX_TOK) return CM_EUNSUPPORTED;
    return launch_moe_gemvq<MOEQ_GLU>(W, n_exp, xq, x_div, cnt, off, list, n_tok, k, act, nullptr, row_w, 0,
                                      n_tok == 1 ? idx : nullptr, s);
}

// Shared memory of kc_moe_gemvq_f: the rows of up to NT entries (the kernel's, by n_tok) as blocks.
static size_t moe_sx_smem(int n_in, int n_tok) { return (size_t)(n_tok == 1 ? 1 : 8) * ((size_t)n_in * 2 + (size_t)n_in / 32 * 8); }

extern "C" int kc_moe_gemvq_f_ok(const kc_weight *W, int n_exp, int n_tok) {
    return W && n_exp > 0 && n_tok > 0 && n_tok <= KC_GEMV_MAX_TOK && is_quant(W->type) && kc_moe_type_ok(W->type, W->n_in) &&
           moe_sx_smem(W->n_in, n_tok) <= 48 * 1024;
}

extern "C" int kc_moe_gemvq_f(const kc_weight *W, int n_exp, const float *x, const int32_t *idx, const int32_t *cnt, const int32_t *off,
                              const int32_t *list, int n_tok, int k, float *y, cudaStream_t s) {
    if (!W || !W->data || !W->d || !x || !y || n_exp <= 0 || n_tok <= 0 || k <= 0 || W->n_out % n_exp ||
        !moe_lookup_ok(idx, cnt, off, list, n_tok, k, n_exp))
        return CM_EINVAL;
    if (!kc_moe_gemvq_f_ok(W, n_exp, n_tok)) return CM_EUNSUPPORTED;
    static_assert(KC_GEMV_MAX_TOK <= 8, "an expert's entries in one pass of the 8-entry variant");
    return launch_moe_gemvq<MOEQ_SX>(W, n_exp, nullptr, 1, cnt, off, list, n_tok, k, y, x, nullptr, moe_sx_smem(W->n_in, n_tok),
                                     n_tok == 1 ? idx : nullptr, s);
}

// ---- activation quantization ---------------------------------------------------------------

__global__ void quantize_x_kernel(const float *x, int n, int8_t *qh, int8_t *ql, int32_t *m, __half *xh) {
    KC_TRACE_SCOPE(KC_TR_OTHER);
    kc_pdl_trigger();
    kc_pdl_wait();
    const int n4 = n / 4;
    const size_t row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x; // float4 index in the row
    const bool ok = i < n4;
    float4 v = ok ? ((const float4 *)(x + row * n))[i] : make_float4(0, 0, 0, 0);
    kc_xq_block4(v, ok, qh, ql, m, xh, row * n + (size_t)i * 4);
}

extern "C" int kc_quantize_x(const float *x, int n_tok, int n, kc_xq *xq, cudaStream_t s) {
    if (!x || !xq || n_tok <= 0 || n <= 0 || n % 32 || n_tok > xq->cap_tok || n > xq->cap_n) return CM_EINVAL;
    const int n4 = n / 4, threads = 256;
    dim3 grid((n4 + threads - 1) / threads, n_tok);
    kc_launch(quantize_x_kernel, grid, dim3(threads), 0, s, x, n, xq->qh, xq->ql, xq->m, (__half *)xq->xh);
    xq->n = n;
    KC_LAUNCH_CHECK();
}

// ---- dequantize to half (for the cuBLAS path) ---------------------------------------------------

// Quantized weights as half for the cuBLAS path, eight consecutive elements per thread (four
// threads a block of 32): every store of a warp is 512 contiguous bytes. One element per
// thread moved the copy at ~1.2 TB/s: a 512-token prefill of llama2-7b Q4_0 took 33.2 ms
// against 24.2 ms now (F16: 18.0; bench/RESULTS.md, third 2026-11-24 entry). qs and d: the
// slice's first row in W's regions (n_in: the row length, for the types with padded rows).
template <int TYPE>
__global__ void dequant_half8_kernel(const uint8_t *qs, const kc_half *d, int n_in, size_t n8, __half *out) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += stride) {
        const size_t b = i / 4;
        const int part = (int)(i % 4); // elements 8 part .. 8 part + 7 of block b
        float v[8];
        if constexpr (TYPE == DT_Q8_0) {
            const float sc = kc_h2f(d[b]);
            const uint2 q0 = __ldg((const uint2 *)(qs + b * 32 + part * 8));
            const int8_t *q = (const int8_t *)&q0;
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = sc * (float)q[k];
        } else if constexpr (TYPE == DT_Q4_0) {
            const float sc = kc_h2f(d[b]);
            const uint2 q0 = __ldg((const uint2 *)(qs + b * 16 + (part & 1) * 8));
            const uint8_t *q = (const uint8_t *)&q0;
            const int sh = part >= 2 ? 4 : 0;
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = sc * (float)((int)((q[k] >> sh) & 15) - 8);
        } else if constexpr (TYPE == DT_Q4_1 || TYPE == DT_Q5_0 || TYPE == DT_Q5_1) {
            const uint32_t *d32 = (const uint32_t *)d;
            uint32_t dm, qh = 0;
            if constexpr (TYPE == DT_Q4_1) dm = d32[b];
            else if constexpr (TYPE == DT_Q5_1) {
                dm = d32[2 * b];
                qh = d32[2 * b + 1];
            } else { // Q5_0: a row is nb high-bit words, then nb halves
                const size_t nb = (size_t)n_in / 32, row = b / nb, bi = b % nb;
                const uint8_t *r = (const uint8_t *)d + row * kc_wq_d_row(DT_Q5_0, n_in);
                qh = ((const uint32_t *)r)[bi];
                dm = ((const uint16_t *)(r + 4 * nb))[bi];
            }
            const float sc = kc_h2f((uint16_t)(dm & 0xFFFF)), mn = kc_h2f((uint16_t)(dm >> 16));
            const uint2 q0 = __ldg((const uint2 *)(qs + b * 16 + (part & 1) * 8));
            const uint8_t *q = (const uint8_t *)&q0;
            const int sh = part >= 2 ? 4 : 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int e = 8 * part + k; // element of the block: bit 8 (e % 4) + e / 4 of qh
                const int qv = ((q[k] >> sh) & 15) | (int)((qh >> (8 * (e & 3) + (e >> 2))) & 1) << 4;
                if constexpr (TYPE == DT_Q5_0) v[k] = sc * (float)(qv - 16);
                else v[k] = sc * (float)qv + mn;
            }
        } else if constexpr (TYPE == DT_Q6_K) { // block b: half p = b % 2 of quarter j = b % 8 / 2
            const size_t nb = (size_t)n_in / 32, nsb = nb / 8, row = b / nb, sbl = b % nb / 8;
            const int j = (int)(b % 8) / 2, p = (int)(b % 2);
            const uint8_t *base = qs + b / 8 * 192 + 48 * j;
            const uint8_t *r = (const uint8_t *)d + row * kc_wq_d_row(DT_Q6_K, n_in);
            const float dd = kc_h2f(((const uint16_t *)(r + 16 * nsb))[sbl]);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int l = 8 * part + k, kw = l >> 2; // nibble word kw, byte l % 4
                const int hb = (base[32 + 4 * (2 * (kw >> 2) + p) + (l & 3)] >> (2 * (kw & 3))) & 3;
                const int qv = ((base[l] >> (4 * p)) & 15) | hb << 4;
                const int sc = (int8_t)r[16 * sbl + 4 * j + 2 * p + l / 16];
                v[k] = dd * (float)sc * (float)(qv - 32);
            }
        } else { // Q4_K, Q5_K: sub-block is = b % 8 of super-block b / 8 (Q5_K: its high-bit word)
            const size_t sb = b / 8;
            const int is = (int)(b % 8), j = is / 2;
            uint4 h;
            uint32_t qh = 0;
            if constexpr (TYPE == DT_Q4_K) {
                h = __ldg((const uint4 *)d + sb);
            } else {
                const uint8_t *hp = (const uint8_t *)d + sb * 48;
                h = __ldg((const uint4 *)hp);
                qh = __ldg((const uint32_t *)(hp + 16) + is);
            }
            float scf, mnf;
            kc_q4k_scale_min(h, is, scf, mnf);
            const float dd = kc_h2f((uint16_t)(h.x & 0xFFFF)), dm = kc_h2f((uint16_t)(h.x >> 16));
            const uint2 q0 = __ldg((const uint2 *)(qs + sb * 128 + j * 32 + part * 8));
            const uint8_t *q = (const uint8_t *)&q0;
            const int sh = (is & 1) ? 4 : 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int qv = (q[k] >> sh) & 15;
                if constexpr (TYPE == DT_Q5_K) qv |= (int)((qh >> (8 * (k & 3) + 2 * part + (k >> 2))) & 1) << 4;
                v[k] = dd * scf * (float)qv - dm * mnf;
            }
        }
        uint4 o;
        __half2 *oh = (__half2 *)&o;
#pragma unroll
        for (int k = 0; k < 4; k++) oh[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        ((uint4 *)out)[i] = o;
    }
}


__global__ void to_half_kernel(const float *x, size_t n, __half *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = __float2half(x[i]);
}

__global__ void bf16_to_half_kernel(const uint16_t *x, size_t n, __half *out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) out[i] = __float2half(kc_bf2f(x[i]));
}

static int cublas_ok(cublasStatus_t st, int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "cublas call failed", "status=%d file=%s line=%d", (int)st, __FILE__, line);
    return CM_ECUDA;
}

// 0, or CM_ECUDA with the launch error logged (file, the caller's line).
static int launch_ok(int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    cm_log_write(CM_LOG_LEVEL_ERROR, "cuda", "kernel launch failed", "err=\"%s\" file=%s line=%d", cudaGetErrorString(e), __FILE__, line);
    return CM_ECUDA;
}

// x [nx] as half into out (the tensor-core paths' activations).
static void to_half(const float *x, size_t nx, kc_half *out, cudaStream_t s) {
    to_half_kernel<<<(unsigned)((nx + 255) / 256 < 4096 ? (nx + 255) / 256 : 4096), 256, 0, s>>>(x, nx, (__half *)out);
}


// The most tokens kc_matmul multiplies W by on the integer GEMV: the plan's qgemv_max_tok for
// Q8_0 and Q4_K, KC_GEMV_MAX_TOK for the other types and for a mixed W (all its ranges, whatever
// their types: kc_matmul_xq)
static int gemv_max(const kc_weight *W) {
    return W->type == DT_Q8_0 || W->type == DT_Q4_K ? kc_plan_get()->qgemv_max_tok : KC_GEMV_MAX_TOK;
}

// Whether kc_matmul takes kc__gemm_q8i for W x n_tok tokens: the plan's q8_mma_max_tok (Q8_0) or
// q4k_mma_max_tok (Q4_K), where the workspace can hold the activations' int8 blocks (when x's
// producer did not write them)
// The shapes kc__gemm_q8i takes, past the GEMV
static bool q8i_shape(const kc_weight *W, int n_tok) {
    const bool shape = W->type == DT_Q8_0 ? n_tok <= 32 && W->n_in % 64 == 0 : W->type == DT_Q4_K && n_tok <= 16 && W->n_in % 256 == 0;
    return shape && n_tok > gemv_max(W);
}
static bool q8i_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    const kc_plan *p = kc_plan_get();
    return q8i_shape(W, n_tok) && n_tok <= (W->type == DT_Q8_0 ? p->q8_mma_max_tok : p->q4k_mma_max_tok) && ws &&
           ws->xq.cap_tok >= n_tok && ws->xq.cap_n >= W->n_in;
}
// Whether xq holds x's int8 blocks for W x n_tok tokens, written by x's producer
static bool xq_blocks(const kc_xq *q, const kc_weight *W, int n_tok) {
    return q && !q->no_ints && q->n == W->n_in && q->cap_tok >= n_tok;
}
// Whether a whole Q4_K matrix past the GEMV takes kc__gemm_q8i because x's producer wrote the
// int8 blocks and no image for the tiles (wo after the decode attention): the tiles would first
// convert x's f32 rows in a launch of their own. llama2-7b Q4_K 128 + 128 on an H200 at 5 / 6 /
// 8 sequences 1,331-1,347 / 1,568 / 2,146-2,152 -> 1,376-1,378 / 1,626 / 2,260-2,270 tok/s; at
// 9-16 within +-0.6 % (bench/RESULTS.md, thirty-sixth session). The blocks are the CPU's
// two-level activations, so wo also keeps the GEMV's accuracy there.
static bool q8i_blocks_use(const kc_weight *W, const kc_xq *xq, int n_tok, int ldy) {
    return W->type == DT_Q4_K && ldy == W->n_out && q8i_shape(W, n_tok) && xq_blocks(xq, W, n_tok);
}
// Whether kc_matmul sends W (one type) x n_tok tokens to kc_gemmq (tensor cores, dequantized
// in registers): quantized weights of a shape it takes, past the GEMV's token counts, up to the
// plan's gemmq_max_tok for the type (not where kc__gemm_q8i takes them); F16 weights
// (gemmq_wg.cu's tiles on x's image) up to f16_wg_max_tok where those tiles beat cuBLAS for the
// shape (kc__gemmq_f16_cfg).
static bool gemmq_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    if (n_tok <= gemv_max(W) || !kc_gemmq_ok(W) || q8i_use(W, n_tok, ws)) return false;
    if (W->type == DT_F16) return n_tok <= kc_plan_get()->f16_wg_max_tok && kc__gemmq_f16_cfg(n_tok, W->n_out, W->n_in) >= 0;
    return is_quant(W->type) && n_tok <= kc_plan_get()->gemmq_max_tok[kc_qtype_index(W->type)];
}
// Whether x's image for W (rows padded, kc__gemmq_x_halves) fits the workspace's x_half. F16
// weights take the tiles only where it does (they do not read x as it is).
static bool image_fits(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return ws && kc__gemmq_x_halves(n_tok, W->n_in) <= ws->x_cap;
}

// The order kc_matmul writes x_half in for W x n_tok tokens (kc__gemmq_x_order): that of the
// wgmma tiles when kc_gemmq takes W (every range of a mixed W, in one order), else 0 = as is.
static int x_order(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    if (!image_fits(W, n_tok, ws)) return 0; // no room for the padded image
    if (W->type != KC_WEIGHT_MIXED) return gemmq_use(W, n_tok, ws) ? kc__gemmq_x_order(W, n_tok) : 0;
    int order = -1;
    for (int i = 0; i < W->n_parts; i++) {
        const kc_weight v = kc_weight_part_view(W, i);
        const int o = x_order(&v, n_tok, ws);
        if (!o || (order >= 0 && o != order)) return 0;
        order = o;
    }
    return order > 0 ? order : 0;
}

// x [n_tok, n_in] as half into ws->x_half, in that order.
static int x_to_half(const float *x, int n_tok, int n_in, int order, const kc_gemm_ws *ws, cudaStream_t s) {
    if (order) return kc__to_half_gemmq(x, n_tok, n_in, order, ws->x_half, s);
    to_half(x, (size_t)n_tok * n_in, ws->x_half, s);
    return launch_ok(__LINE__);
}

extern "C" int kc_matmul_reads_x(const kc_weight *W, int n_tok) {
    if (W->type == KC_WEIGHT_MIXED) {
        if (n_tok <= KC_GEMV_MAX_TOK) return 0; /* every range on the integer GEMV */
        for (int i = 0; i < W->n_parts; i++) {
            const kc_weight v = kc_weight_part_view(W, i);
            if (kc_matmul_reads_x(&v, n_tok)) return 1;
        }
        return 0;
    }
    if (n_tok > KC_GEMV_MAX_TOK) return 1;
    if (gemmq_use(W, n_tok, nullptr)) return 1;
    if (is_quant(W->type)) return 0;
    return !((W->type == DT_F16 || W->type == DT_F8_E4M3) && W->n_in % 32 == 0); /* the half copy */
}

extern "C" int kc_matmul(const kc_weight *W, const float *x, int n_tok, float *y, int accumulate,
                         const kc_gemm_ws *ws, cudaStream_t s) {
    return kc_matmul_xq(W, x, NULL, n_tok, y, accumulate, ws, s);
}

// The integer GEMVs' activations: *xq when it holds x quantized for W (its producer wrote it),
// else x quantized here into the workspace's scratch (*xq pointed at it).
static int gemv_activations(const kc_weight *W, const float *x, const kc_xq **xq, int n_tok, const kc_gemm_ws *ws,
                            cudaStream_t s) {
    if (xq_blocks(*xq, W, n_tok)) return 0;
    if (!ws || ws->xq.cap_tok < n_tok || ws->xq.cap_n < W->n_in) return CM_EINVAL;
    kc_xq *wq = (kc_xq *)&ws->xq; /* scratch: the workspace's buffers, not its shape */
    if (int rc = kc_quantize_x(x, n_tok, W->n_in, wq, s)) return rc;
    *xq = wq;
    return 0;
}

// ---- F16 matrices on cuBLASLt: the algorithm timed at start-up (kc_matmul_tune_f16) ----------

namespace {
// The fastest of cublasGemmEx and cuBLASLt's heuristic algorithms for an m x k matrix times n
// tokens (host memory; the step thread only)
struct f16_algo {
    int m, k, n;
    bool oh; // the output as half (kc_matmul_half_out), else f32
    bool lt; // cuBLASLt's algo, else cublasGemmEx
    cublasLtMatmulAlgo_t algo;
};
f16_algo g_f16[256];
int g_f16_n;
bool g_f16_lt_always; // tests: keep cuBLASLt's fastest algorithm even where cublasGemmEx beats it

} // namespace

// Whether matmul_one multiplies W (F16) x n_tok tokens on cuBLAS.
static bool f16_on_cublas(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return W && W->type == DT_F16 && n_tok > KC_GEMV_MAX_TOK && !(gemmq_use(W, n_tok, ws) && image_fits(W, n_tok, ws)) &&
           (size_t)n_tok * W->n_in <= ws->x_cap;
}

extern "C" void kc__matmul_tune_f8_reset(void);
extern "C" void kc_matmul_tune_reset(void) {
    g_f16_n = 0;
    kc__matmul_tune_f8_reset();
}
extern "C" void kc__matmul_tune_lt_always(int on) { g_f16_lt_always = on != 0; }

// The timed entry for W at n_tok tokens (output as half: oh) where the plan takes cuBLASLt: the
// largest timed count <= n_tok, if cuBLASLt's algorithm won there (NULL: cublasGemmEx)
static const f16_algo *f16_lt_pick(const kc_weight *W, int n_tok, const kc_gemm_ws *ws, bool oh) {
    const int lo = kc_plan_get()->f16_lt_min_tok;
    if (!lo || n_tok < lo || !ws->cublaslt) return nullptr;
    const f16_algo *best = nullptr;
    for (int i = 0; i < g_f16_n; i++) {
        const f16_algo &e = g_f16[i];
        if (e.m == W->n_out && e.k == W->n_in && e.oh == oh && e.n <= n_tok && (!best || e.n > best->n)) best = &e;
    }
    return best && best->lt ? best : nullptr;
}

// 0 where cuBLASLt ran W x (into y, f32 or half by e->oh, accumulating with beta 1), 1 where the
// algorithm does not take these sizes or pointers (nothing launched: cublasGemmEx instead), or
// CM_ECUDA.
static int f16_lt_matmul(const f16_algo *e, const kc_weight *W, const kc_half *x, int n_tok, void *y, float beta,
                         const kc_gemm_ws *ws, cudaStream_t s) {
    kc_lt_desc d;
    cublasStatus_t st = d.make(W->n_out, n_tok, W->n_in, W->n_out, CUDA_R_16F, e->oh ? CUDA_R_16F : CUDA_R_32F);
    if (!st) st = d.run(ws, &e->algo, W->data, x, y, beta, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) return 1;
    return cublas_ok(st, __LINE__);
}

// y[n][m] (f32, or half: oh) (+)= W[m][k] x[n][k]^T on cublasGemmEx's own algorithm (f32 sums)
static cublasStatus_t gemmex_f16(const kc_gemm_ws *ws, int m, int n, int k, const void *w, const kc_half *x, void *y, bool oh,
                                 float beta, cudaStream_t s) {
    (void)s; // the handle is bound to the stream by the caller
    const float one = 1.0f;
    return cublasGemmEx((cublasHandle_t)ws->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16F, k, x, CUDA_R_16F, k,
                        &beta, y, oh ? CUDA_R_16F : CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// An F16 W x (x as half, in xin) on cuBLAS: the algorithm timed fastest at start-up for the
// shape, else cublasGemmEx's.
static int f16_gemm(const kc_weight *W, const kc_half *xin, int n_tok, void *y, bool oh, float beta, const kc_gemm_ws *ws,
                    cudaStream_t s) {
    if (const f16_algo *e = f16_lt_pick(W, n_tok, ws, oh))
        if (int rc = f16_lt_matmul(e, W, xin, n_tok, y, beta, ws, s); rc <= 0) return rc;
    return cublas_ok(gemmex_f16(ws, W->n_out, n_tok, W->n_in, W->data, xin, y, oh, beta, s), __LINE__);
}

// y (row stride ldy) = W x for a matrix of one type (a whole weight, or one range of a mixed
// one, whose ldy is the fused matrix's n_out; quantized types only then). xh_ready: ws->x_half
// already holds x as half (converted once for every range), or xsrc (non-NULL) holds x's image
// in order x_ord, written by x's producer. gemv: a range of a mixed W in a step of up to
// KC_GEMV_MAX_TOK tokens, which takes the integer GEMV whatever its type.
static int matmul_one(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, int ldy, int accumulate,
                      const kc_gemm_ws *ws, bool xh_ready, int x_ord, const kc_half *xsrc, cudaStream_t s, bool gemv = false) {
    if (W->type == DT_F8_E4M3) return kc__matmul_f8(W, x, xq, n_tok, y, ldy, accumulate, ws, s);
    if (ldy != W->n_out && !is_quant(W->type)) return CM_EINVAL;
    if (!gemv && !xh_ready && q8i_blocks_use(W, xq, n_tok, ldy)) return kc__gemm_q8i(W, xq, n_tok, y, ldy, accumulate, s);
    if (!gemv && gemmq_use(W, n_tok, ws) && (W->type != DT_F16 || image_fits(W, n_tok, ws))) { /* tensor cores, dequantized in registers: no w_half */
        size_t nx = (size_t)n_tok * W->n_in;
        if (!ws || nx > ws->x_cap) return CM_EINVAL;
        // the wgmma tiles read x in their MMAs' order where it was written so (xh_ready: the
        // caller's x_ord, which is W's or 0 = as is, read with 4-byte copies)
        const int own = x_order(W, n_tok, ws), order = xh_ready ? (x_ord == own ? own : 0) : own;
        if (!xh_ready)
            if (int rc = x_to_half(x, n_tok, W->n_in, order, ws, s)) return rc;
        return kc__gemmq_rows(W, xh_ready && order && xsrc ? xsrc : ws->x_half, n_tok, y, ldy, accumulate, -1, order, s);
    }
    if (!gemv && q8i_use(W, n_tok, ws)) { /* the producer's int8 blocks, or x quantized into the workspace's */
        if (int rc = gemv_activations(W, x, &xq, n_tok, ws, s)) return rc;
        return kc__gemm_q8i(W, xq, n_tok, y, ldy, accumulate, s);
    }
    if (n_tok <= KC_GEMV_MAX_TOK && is_quant(W->type)) {
        if (int rc = gemv_activations(W, x, &xq, n_tok, ws, s)) return rc;
        switch (W->type) {
        case DT_Q8_0: launch_gemvq<DT_Q8_0>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case DT_Q4_0: launch_gemvq<DT_Q4_0>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case DT_Q4_1: launch_gemvq<DT_Q4_1>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case DT_Q5_0: launch_gemvq<DT_Q5_0>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case DT_Q5_1: launch_gemvq<DT_Q5_1>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case DT_Q4_K: launch_gemvq<DT_Q4_K>(W, xq, n_tok, y, ldy, accumulate, s); break;
        case DT_Q5_K: launch_gemvq<DT_Q5_K>(W, xq, n_tok, y, ldy, accumulate, s); break;
        default: launch_gemvq<DT_Q6_K>(W, xq, n_tok, y, ldy, accumulate, s); break;
        }
        KC_LAUNCH_CHECK();
    }
    if (n_tok <= KC_GEMV_MAX_TOK && W->type == DT_F16 && xq && xq->xh && xq->n == W->n_in && n_tok <= xq->cap_tok &&
        W->n_in % 8 == 0) {
        launch_gemv<DT_F16, true>(W, xq->xh, n_tok, y, accumulate, s);
        KC_LAUNCH_CHECK();
    }
    if (n_tok <= KC_GEMV_MAX_TOK) {
        int vec = W->type == DT_F32 ? 4 : 8;
        if (W->n_in % vec) {
            if (W->type != DT_F32 && W->type != DT_F16 && W->type != DT_BF16) return CM_EINVAL;
            dim3 grid((W->n_out + GEMV_WARPS - 1) / GEMV_WARPS), block(GEMV_WARPS * 32);
            gemv_scalar_kernel<<<grid, block, 0, s>>>(W->data, W->type, x, y, W->n_in, W->n_out, n_tok, accumulate);
            KC_LAUNCH_CHECK();
        }
        switch (W->type) {
        case DT_F32: launch_gemv<DT_F32>(W, x, n_tok, y, accumulate, s); break;
        case DT_F16: launch_gemv<DT_F16>(W, x, n_tok, y, accumulate, s); break;
        case DT_BF16: launch_gemv<DT_BF16>(W, x, n_tok, y, accumulate, s); break;
        default: return CM_EUNSUPPORTED;
        }
        KC_LAUNCH_CHECK();
    }
    if (!ws || !ws->cublas) return CM_EINVAL;
    cublasHandle_t h = (cublasHandle_t)ws->cublas;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (W->type == DT_F32)
        return cublas_ok(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, W->n_out, n_tok, W->n_in, &one, (const float *)W->data,
                                     W->n_in, x, W->n_in, &beta, y, W->n_out), __LINE__);
    size_t nx = (size_t)n_tok * W->n_in;
    if (nx > ws->x_cap) return CM_EINVAL;
    if (!xh_ready) to_half(x, nx, ws->x_half, s);
    if (W->type == DT_F16) {
        if (int rc = launch_ok(__LINE__)) return rc;
        // x as half as it is: converted above, or written so by its producer (KC_X_PLAIN)
        const kc_half *xin = xh_ready && x_ord == KC_X_PLAIN && xsrc ? xsrc : ws->x_half;
        return f16_gemm(W, xin, n_tok, y, false, beta, ws, s);
    }
    // BF16 and quantized weights: converted to half in slices of whole rows that fit w_half
    // (sized by the caller, at least one row), each multiplied into its rows of y.
    const size_t per = ws->w_cap / (size_t)W->n_in;
    if (per == 0) return CM_EINVAL;
    size_t data_row, d_row;
    row_bytes(W->type, W->n_in, &data_row, &d_row);
    for (size_t o0 = 0; o0 < (size_t)W->n_out; o0 += per) {
        const size_t nr = (size_t)W->n_out - o0 < per ? (size_t)W->n_out - o0 : per, ne = nr * W->n_in;
        if (W->type == DT_BF16) {
            bf16_to_half_kernel<<<4096, 256, 0, s>>>((const uint16_t *)W->data + o0 * W->n_in, ne, (__half *)ws->w_half);
        } else {
            const uint8_t *q = (const uint8_t *)W->data + o0 * data_row;
            const kc_half *d = (const kc_half *)((const uint8_t *)W->d + o0 * d_row);
            const size_t n8 = ne / 8;
            const unsigned g8 = (unsigned)((n8 + 255) / 256 < 16384 ? (n8 + 255) / 256 : 16384);
            __half *wh = (__half *)ws->w_half;
            switch (W->type) {
            case DT_Q8_0: dequant_half8_kernel<DT_Q8_0><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            case DT_Q4_0: dequant_half8_kernel<DT_Q4_0><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            case DT_Q4_1: dequant_half8_kernel<DT_Q4_1><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            case DT_Q5_0: dequant_half8_kernel<DT_Q5_0><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            case DT_Q5_1: dequant_half8_kernel<DT_Q5_1><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            case DT_Q4_K: dequant_half8_kernel<DT_Q4_K><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            case DT_Q5_K: dequant_half8_kernel<DT_Q5_K><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            default: dequant_half8_kernel<DT_Q6_K><<<g8, 256, 0, s>>>(q, d, W->n_in, n8, wh); break;
            }
        }
        if (int rc = launch_ok(__LINE__)) return rc;
        int rc = cublas_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n_tok, W->n_in, &one, ws->w_half, CUDA_R_16F, W->n_in,
                                        ws->x_half, CUDA_R_16F, W->n_in, &beta, y + o0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                           __LINE__);
        if (rc) return rc;
    }
    return 0;
}

// A mixed W range by range, into its rows of y
static int mixed_ranges(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, int accumulate,
                        const kc_gemm_ws *ws, bool xh_ready, int ord, const kc_half *xsrc, cudaStream_t s) {
    for (int i = 0; i < W->n_parts; i++) {
        const kc_weight v = kc_weight_part_view(W, i);
        if (int rc = matmul_one(&v, x, xq, n_tok, y + W->part[i].row0, W->n_out, accumulate, ws, xh_ready, ord, xsrc, s,
                                n_tok <= KC_GEMV_MAX_TOK))
            return rc;
    }
    return 0;
}

// F16 weights that matmul_one multiplies on cuBLAS past the GEMV, x's half copy in x_half: its
// producer can write that copy (KC_X_PLAIN) instead of f32 rows for the conversion to read.
static bool plain_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return kc_plan_get()->x_plain && W->type == DT_F16 && n_tok > KC_GEMV_MAX_TOK && !gemmq_use(W, n_tok, ws) && ws && ws->cublas &&
           W->n_in % 4 == 0 && (size_t)n_tok * W->n_in <= ws->x_cap;
}

extern "C" int kc_matmul_x_order(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    if (!W || n_tok <= gemv_max(W) || q8i_use(W, n_tok, ws)) return 0; /* the GEMVs and kc__gemm_q8i: int8 blocks */
    if (W->type == DT_F8_E4M3) return kc_plan_get()->f8_x_img ? kc__f8_x_order(W, n_tok, ws) : 0;
    if (plain_use(W, n_tok, ws)) return KC_X_PLAIN;
    return W->type == KC_WEIGHT_MIXED || is_quant(W->type) || W->type == DT_F16 ? x_order(W, n_tok, ws) : 0;
}

extern "C" int kc_xq_img_fits(const kc_xq *xq, int n_tok, int n) {
    return n_tok <= 65535 && n <= 4 * 1024 * 8 && img_fits(xq, n_tok, n); // every producer's limits (grid.y, the norms' rows)
}

// Whether xq->img (ws->x_half, or a buffer of the caller's) holds x's image in W's order, written
// by x's producer (kc_xq.img)
static int x_image(const kc_weight *W, const kc_xq *xq, int n_tok, const kc_gemm_ws *ws) {
    if (!xq || !ws || !xq->img || xq->img_tok != n_tok || xq->img_n != W->n_in || !xq->img_order) return 0;
    return kc_matmul_x_order(W, n_tok, ws) == xq->img_order ? xq->img_order : 0;
}

extern "C" int kc_matmul_xq(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, int accumulate,
                            const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W || !x || !y || n_tok <= 0) return CM_EINVAL;
    const int img = x_image(W, xq, n_tok, ws);
    const kc_half *xsrc = img ? (const kc_half *)xq->img : nullptr;
    if (W->type != KC_WEIGHT_MIXED) return matmul_one(W, x, xq, n_tok, y, W->n_out, accumulate, ws, img != 0, img, xsrc, s);
    int ord = 0;           // the order x_half holds x in for the ranges
    bool xh_ready = true;  // x_half converted once for every range
    if (W->n_parts < 1 || W->n_parts > KC_WEIGHT_MAX_PARTS) return CM_EINVAL;
    // the activations once for every range: quantized for the GEMVs, as half for the others
    // (every range is a quantized type: the integer GEMV up to KC_GEMV_MAX_TOK tokens, kc_gemmq
    // or dequantize + cuBLAS above, both reading x_half)
    if (n_tok <= KC_GEMV_MAX_TOK) {
        if (int rc = gemv_activations(W, x, &xq, n_tok, ws, s)) return rc;
        if (n_tok == 1 && kc_plan_get()->mixed_one && gemvq2_take(W, xq, y, accumulate, s)) KC_LAUNCH_CHECK();
    } else {
        const size_t nx = (size_t)n_tok * W->n_in;
        if (!ws || nx > ws->x_cap) return CM_EINVAL;
        ord = x_order(W, n_tok, ws);
        if (img) return mixed_ranges(W, x, xq, n_tok, y, accumulate, ws, true, img, xsrc, s); // x's producer wrote the image
        // ranges that read x in different orders (the wgmma tiles' images of two kinds, or one
        // and x as it is): each range converts x for itself, so that its rows are the same bits
        // as its part alone
        for (int i = 0; i < W->n_parts && !ord && xh_ready; i++) {
            const kc_weight v = kc_weight_part_view(W, i);
            xh_ready = x_order(&v, n_tok, ws) == 0;
        }
        if (xh_ready)
            if (int rc = x_to_half(x, n_tok, W->n_in, ord, ws, s)) return rc;
    }
    return mixed_ranges(W, x, xq, n_tok, y, accumulate, ws, xh_ready, ord, nullptr, s);
}

// kc_matmul_glu past the GEMV where gate|up (one type) runs on the wgmma tiles on x's image: the
// activation in the tiles' epilogue (f32 into out where non-NULL, down's image into xq_act's where
// it asks for one and that buffer is not the tiles' input), the same bits as kc_glu_xq on the
// tiles' output. 1: not taken here (kc_glu_xq's int8 blocks asked for, no room for x's image, ...).
static int glu_tiles(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *out, kc_xq *xq_act, bool gelu,
                     const kc_gemm_ws *ws, cudaStream_t s) {
    const int n_ff = W->n_out / 2;
    if (!kc_plan_get()->glu_tiles || n_tok <= gemv_max(W) || W->type == KC_WEIGHT_MIXED || W->n_out % 8 || !gemmq_use(W, n_tok, ws) ||
        ((uintptr_t)out & 15))
        return 1;
    if (xq_act && n_ff % 32 == 0 && n_tok <= xq_act->cap_tok && n_ff <= xq_act->cap_n && (!xq_act->no_ints || xq_act->xh))
        return 1; // kc_glu_xq would write the GEMVs' blocks too
    const int own = x_order(W, n_tok, ws);
    if (!own) return 1; // x as it is: not these tiles
    const int img = x_image(W, xq, n_tok, ws);
    const kc_half *xsrc = img ? (const kc_half *)xq->img : ws->x_half;
    img_out im = n_tok <= 65535 ? img_asked(xq_act, n_tok, n_ff) : img_out{};
    if (im.p && (const kc_half *)im.p == xsrc) return 1; // down's image would overwrite gate|up's input
    if (!out && !im.p) return 1;
    if (xq_act) xq_act->n = 0;
    if (!img)
        if (int rc = x_to_half(x, n_tok, W->n_in, own, ws, s)) return rc;
    const kc_wg_glu ep = { out, im.p, im.order, im.ntp, gelu };
    if (int rc = kc__gemmq_glu(W, xsrc, n_tok, own, &ep, s)) return rc;
    if (im.p) xq_act->img_tok = n_tok, xq_act->img_n = n_ff;
    return 0;
}

// an F16 matrix on cuBLAS writing half rows from lo tokens (0: never)
static bool half_rows_use(int lo, const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return lo && n_tok >= lo && n_tok <= 65535 && ws && ws->cublas && W->n_out % 8 == 0 && f16_on_cublas(W, n_tok, ws);
}
static bool glu_half_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return half_rows_use(kc_plan_get()->glu_half_min_tok, W, n_tok, ws);
}

extern "C" int kc_glu_half_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) { return W && glu_half_use(W, n_tok, ws); }
extern "C" int kc_qkv_half_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws) {
    return W && half_rows_use(kc_plan_get()->qkv_half_min_tok, W, n_tok, ws);
}

extern "C" int kc_matmul_half_out(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, kc_half *y, const kc_gemm_ws *ws,
                                  cudaStream_t s) {
    if (!W || !y || n_tok <= 0 || !ws || !ws->cublas || !ws->x_half || !f16_on_cublas(W, n_tok, ws)) return CM_EINVAL;
    // x as half as it is: its producer's image (KC_X_PLAIN), or converted from the f32 rows
    const kc_half *xin = ws->x_half;
    if (x_image(W, xq, n_tok, ws) == KC_X_PLAIN) xin = (const kc_half *)xq->img;
    else if (!x) return CM_EINVAL;
    else {
        to_half(x, (size_t)n_tok * W->n_in, ws->x_half, s);
        if (int rc = launch_ok(__LINE__)) return rc;
    }
    return f16_gemm(W, xin, n_tok, y, true, 0.0f, ws, s);
}

extern "C" int kc_matmul_glu(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *gu, float *out,
                             kc_xq *xq_act, int act, const kc_gemm_ws *ws, cudaStream_t s) {
    if (!W || !x || n_tok <= 0 || W->n_out % 2 || (act != MDL_ACT_SILU && act != MDL_ACT_GELU_TANH)) return CM_EINVAL;
    const int n_ff = W->n_out / 2;
    if (xq_act) xq_act->img_tok = 0; // no image unless kc_glu_xq writes one
    const bool fuse = n_tok <= kc_plan_get()->swiglu_fuse && W->type == DT_F16 && xq && xq->xh && xq->n == W->n_in &&
                      n_tok <= xq->cap_tok && W->n_in % 8 == 0 && xq_act && xq_act->no_ints && xq_act->xh &&
                      n_ff % 32 == 0 && n_tok <= xq_act->cap_tok && n_ff <= xq_act->cap_n;
    if (fuse) {
        const gemv_swi sw = { out, (__half *)xq_act->xh, n_ff, act == MDL_ACT_GELU_TANH };
        if (launch_gemv<DT_F16, true>(W, xq->xh, n_tok, nullptr, 0, s, &sw)) {
            xq_act->n = n_ff;
            KC_LAUNCH_CHECK();
        }
    }
    if (n_tok <= kc_plan_get()->swiglu_fuse && W->type == DT_F8_E4M3) {
        int rc = kc__matmul_f8_glu(W, xq, n_tok, out, xq_act, act == MDL_ACT_GELU_TANH, s);
        if (rc <= 0) return rc;
    }
    if (int rc = glu_tiles(W, x, xq, n_tok, out, xq_act, act == MDL_ACT_GELU_TANH, ws, s); rc <= 0) return rc;
    if (!gu) return CM_EINVAL;
    if (glu_half_use(W, n_tok, ws)) { // prefill sizes: gate|up as half rows, in gu's memory
        int rc = kc_matmul_half_out(W, x, xq, n_tok, (kc_half *)gu, ws, s);
        return rc ? rc : kc_glu_xq_half((const kc_half *)gu, out, xq_act, n_tok, n_ff, act, s);
    }
    if (W->type == DT_F8_E4M3 && n_ff % 4 == 0 && ((uintptr_t)W->d & 15) == 0) { // FP8 past the GEMV: the unit-scale sums, scaled by the activation, where timed faster
        const float *sx = nullptr;
        const int rc = kc_matmul_f8_raw(W, x, xq, n_tok, gu, &sx, 0, ws, s);
        if (rc <= 0) return rc ? rc : kc_glu_xq_scaled(gu, (const float *)W->d, sx, out, xq_act, n_tok, n_ff, act, s);
    }
    int rc = kc_matmul_xq(W, x, xq, n_tok, gu, 0, ws, s);
    return rc ? rc : kc_glu_xq(gu, out, xq_act, n_tok, n_ff, act, s);
}

extern "C" int kc_matmul_swiglu(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *gu, float *out,
                                kc_xq *xq_act, const kc_gemm_ws *ws, cudaStream_t s) {
    return kc_matmul_glu(W, x, xq, n_tok, gu, out, xq_act, MDL_ACT_SILU, ws, s);
}

// ---- kc_matmul_tune_f16 ----------------------------------------------------------------------

// n halves uniform in about +-1/16 (a hash of the index): activations for timing, varied bits
// (tensor cores draw more power, and clock lower, on varied operands than on zeros)
__global__ void tune_fill_kernel(__half *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __ushort_as_half((unsigned short)(((h >> 31) << 15) | ((10u + ((h >> 30) & 1)) << 10) | ((h >> 12) & 0x3ff)));
    }
}


extern "C" int kc_matmul_tune_f16(const kc_weight *const *W, const unsigned char *half_out, int n_w, int max_tok,
                                  const kc_gemm_ws *ws, cudaStream_t s, char *report, size_t report_len) {
    if (report && report_len) report[0] = 0;
    const int lo = kc_plan_get()->f16_lt_min_tok, hi = max_tok < KC_TUNE_MAX_TOK ? max_tok : KC_TUNE_MAX_TOK;
    if (!lo || lo > hi || !ws || !ws->cublas || !ws->cublaslt || !ws->x_half || !ws->lt_ws) return 0;
    enum { MAX_SHAPES = 32, MAX_ALGOS = 16, MAX_CANDS = 1 + MAX_ALGOS };
    int shp[MAX_SHAPES][3], n_shp = 0; // n_out, n_in, output as half
    size_t y_max = 0, x_max = 0;
    for (int i = 0; i < n_w; i++) {
        if (!f16_on_cublas(W[i], lo, ws)) continue;
        const int oh = half_out && half_out[i];
        bool seen = false;
        for (int j = 0; j < n_shp && !seen; j++) seen = shp[j][0] == W[i]->n_out && shp[j][1] == W[i]->n_in && shp[j][2] == oh;
        if (seen || n_shp == MAX_SHAPES) continue;
        shp[n_shp][0] = W[i]->n_out;
        shp[n_shp][1] = W[i]->n_in;
        shp[n_shp][2] = oh;
        n_shp++;
        if ((size_t)W[i]->n_out > y_max) y_max = (size_t)W[i]->n_out;
        if ((size_t)W[i]->n_in > x_max) x_max = (size_t)W[i]->n_in;
    }
    if (!n_shp) return 0;
    float *y = nullptr;
    if (cudaMalloc(&y, y_max * (size_t)hi * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        return CM_ENOMEM;
    }
    const size_t nx = (size_t)hi * x_max < ws->x_cap ? (size_t)hi * x_max : ws->x_cap;
    tune_fill_kernel<<<1024, 256, 0, s>>>((__half *)ws->x_half, nx);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    int rc = launch_ok(__LINE__);
    if (!rc && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)) rc = CM_ECUDA;
    int n_timed = 0, n_won = 0;
    size_t at = 0;
    for (int si = 0; si < n_shp && !rc; si++) {
        const int m = shp[si][0], k = shp[si][1];
        const bool oh = shp[si][2];
        const kc_weight *w = nullptr;
        for (int i = 0; i < n_w && !w; i++)
            if (W[i] && W[i]->type == DT_F16 && W[i]->n_out == m && W[i]->n_in == k) w = W[i];
        // half outputs from the first count kc_glu_half_use or kc_qkv_half_use takes
        const kc_plan *pl = kc_plan_get();
        int hmin = pl->glu_half_min_tok;
        if (pl->qkv_half_min_tok && (!hmin || pl->qkv_half_min_tok < hmin)) hmin = pl->qkv_half_min_tok;
        const int from = oh && hmin > lo ? hmin : lo;
        for (int n = from; n <= hi && !rc; n *= 2) {
            if (!f16_on_cublas(w, n, ws)) continue;
            bool done = false;
            for (int i = 0; i < g_f16_n && !done; i++)
                done = g_f16[i].m == m && g_f16[i].k == k && g_f16[i].oh == oh && g_f16[i].n == n;
            if (done || g_f16_n == (int)(sizeof g_f16 / sizeof *g_f16)) continue;
            kc_lt_desc d;
            cublasLtMatmulHeuristicResult_t hr[MAX_ALGOS];
            const int n_hr = d.make(m, n, k, m, CUDA_R_16F, oh ? CUDA_R_16F : CUDA_R_32F) ? 0 : d.heuristic(ws, hr, MAX_ALGOS);
            // candidate 0: cublasGemmEx; then the heuristic's algorithms (each candidate's best
            // pass: the clocks settle over the first)
            cublasLtMatmulAlgo_t ca[MAX_CANDS];
            int nc = 1;
            for (int i = 0; i < n_hr; i++)
                if (hr[i].state == CUBLAS_STATUS_SUCCESS) ca[nc++] = hr[i].algo;
            float best[MAX_CANDS];
            for (int c = 0; c < nc; c++) best[c] = 1e30f;
            rc = lt_time(nc, best, nullptr, s, e0, e1, [&](int c) {
                return c ? d.run(ws, &ca[c], w->data, ws->x_half, y, 0.0f, s) : gemmex_f16(ws, m, n, k, w->data, ws->x_half, y, oh, 0.0f, s);
            });
            if (rc || best[0] < 0) break;
            int win = 0;
            for (int c = 1; c < nc; c++)
                if (best[c] >= 0 && (best[c] < best[win] || (g_f16_lt_always && win == 0))) win = c;
            f16_algo &e = g_f16[g_f16_n++];
            e.m = m, e.k = k, e.n = n, e.oh = oh;
            // cuBLASLt where it gains more than the noise
            e.lt = win > 0 && (best[win] < 0.99f * best[0] || g_f16_lt_always);
            if (e.lt) e.algo = ca[win];
            n_timed++;
            if (e.lt) {
                n_won++;
                if (report && at + 48 < report_len)
                    at += (size_t)snprintf(report + at, report_len - at, "%s%dx%d%s@%d %.1f%%", n_won > 1 ? " " : "", m, k,
                                           oh ? "(half)" : "", n, 100.0 * (best[win] - best[0]) / best[0]);
            }
        }
    }
    if (!rc) rc = launch_ok(__LINE__);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamSynchronize(s);
    cudaFree(y);
    if (report && report_len && !rc) {
        char head[96];
        snprintf(head, sizeof head, "%d of %d shape x count timed faster on cuBLASLt%s", n_won, n_timed, n_won ? ": " : "");
        const size_t hl = strlen(head), bl = strlen(report);
        if (hl + bl < report_len) {
            memmove(report + hl, report, bl + 1);
            memcpy(report, head, hl);
        }
    }
    return rc;
}
