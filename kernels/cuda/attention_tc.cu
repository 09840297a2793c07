// attention_tc: causal GQA attention over the paged KV cache on the tensor cores (mma.sync
// m16n8k16, f16 operands, f32 accumulation, online softmax in the log2 domain). The query
// heads that share a KV head are the rows of one tile, so every K/V block is read once for
// all of them.
//
//   decode:  one CTA per (token, KV head, split of the keys). The G query heads of the token
//            are rows 0..G-1 of a 16-row tile; the CTA's 4 warps take 16-key groups of its key
//            range in turn (warp w: keys start + 16 w + 64 i), each with its own ring of
//            cp.async stages in shared memory, and merge their softmax states in warp order at
//            the end. Splits write partials that the last split's CTA merges (attn_common.cuh).
//            The key range of a split is `chunk` positions, read from the device at run time
//            (the backend sizes it to the step's longest context, so one captured graph serves
//            every context length). The KV heads of a token are neighbours in the grid.
//            Unsplit steps of many (token, KV head) pairs (the plan's att_dec_hpw) take CTAs of
//            four KV heads instead, a warp walking all the keys of one (HW 4); an FP8 cache's
//            keys-as-rows steps of fewer (att_dec_pair) CTAs of two, two warps a head (HW 2).
//            An FP8 cache's codes go from the copied stage straight into mma fragments
//            (attend_f8), and where G <= 8 with the keys as the rows of the products instead
//            of the query heads (attend_f8t).
//   prefill: one CTA per (tile of consecutive query tokens of one sequence, KV head): its NW
//            warps own 16 rows each (row r = token r / G, head r % G) and share K/V tiles of
//            64 positions, double- or triple-buffered with cp.async; causal tiles past the
//            tile's last position are never loaded, and warps whose rows all end before a
//            tile skip it.
//
// K and V rows sit in shared memory with 8 halves of padding (row pitch HD + 8), so the
// ldmatrix of 8 rows at one column touches 8 different bank groups.
#include "attn_common.cuh"

extern "C" {
#include "kcuda.h"
}

KC_TRACE_TU(attention_tc)

namespace {

constexpr float LOG2E = 1.4426950408889634f;

// 2^x on the special-function unit (ex2.approx.ftz: one instruction; exp2(-inf) = 0).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
constexpr float LN2 = 0.6931471805599453f;
// The online softmax's new maximum of a row (m: so far, mx: this step's), the factor its running
// sums take (corr) and what this step's scores subtract (mref). A row that has seen no key yet
// keeps m = -inf and subtracts 0 instead (no branch), so its masked scores give exp2(-inf) = 0
// and its empty state stays 0; corr is 0 after a first step's -inf, exactly 1 for an unchanged
// maximum.
__device__ __forceinline__ float online_max(float m, float mx, float &corr, float &mref) {
    const float mn = fmaxf(m, mx), ms = mn == -INFINITY ? 0.0f : mn;
    corr = ex2(m - ms);
    mref = ms;
    return mn;
}
constexpr int DEC_WARPS = 4;

// A warp's online-softmax state for its 16 rows: this thread holds rows g and g + 8
// (g = lane / 4) and, of O, columns 8 d + 2 (lane % 4) + {0, 1}. l is this thread's share
// (its columns of each key step) until the quad sums it at the end.
template <int HD> struct wstate {
    float o[HD / 8][4];
    float m[2], l[2];
};

template <int HD> __device__ __forceinline__ void wstate_init(wstate<HD> &st) {
#pragma unroll
    for (int d = 0; d < HD / 8; d++) st.o[d][0] = st.o[d][1] = st.o[d][2] = st.o[d][3] = 0.0f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.0f;
}

// The A fragments of 16 query rows of HD values: r0 / r1 point at this thread's rows g and
// g + 8 (NULL: a zero row), scaled by qscale (softmax scale x log2 e) and rounded to half.
template <int HD>
__device__ __forceinline__ void load_q(uint32_t (&qa)[HD / 16][4], const float *r0, const float *r1, float qscale, int t4) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const int c = kk * 16 + 2 * t4;
        const float2 z = make_float2(0.0f, 0.0f);
        const float2 x0 = r0 ? *(const float2 *)(r0 + c) : z, x1 = r1 ? *(const float2 *)(r1 + c) : z;
        const float2 x2 = r0 ? *(const float2 *)(r0 + c + 8) : z, x3 = r1 ? *(const float2 *)(r1 + c + 8) : z;
        qa[kk][0] = kc_pack_h2(x0.x * qscale, x0.y * qscale);
        qa[kk][1] = kc_pack_h2(x1.x * qscale, x1.y * qscale);
        qa[kk][2] = kc_pack_h2(x2.x * qscale, x2.y * qscale);
        qa[kk][3] = kc_pack_h2(x3.x * qscale, x3.y * qscale);
    }
}

// The online-softmax update of a warp's 16 rows from their scores s against NK keys (C
// fragments of S = Q Kᵀ, in the log2 domain): soft-capped (capl = softcap x log2 e, 0: none),
// where masked set to -inf where allowed(hi, key) is false (hi: the row is g + 8; key:
// 0..NK-1), then m, l and O updated and P written as the A fragments of P V (pa).
// F8: the keys' codes entered S unscaled; ksc / vsc (shared memory, NK floats each) hold the
// keys' K and V scales: a score is (q . codes) x its key's K scale, in f32, and P enters P V as
// p x the key's V scale x F8_PV (O comes out F8_PV times too large; the caller divides): no
// scale is rounded to half, and small V scales stay clear of half subnormals.
constexpr float F8_PV = 1024.0f;
template <int HD, int NK, bool F8, typename Allowed>
__device__ __forceinline__ void softmax_step(wstate<HD> &st, float (&s)[NK / 8][4], uint32_t (&pa)[NK / 16][4], int lane,
                                             float capl, bool masked, Allowed allowed, const float *ksc, const float *vsc) {
    const int t4 = lane & 3;
    float vsk[NK / 8][2];
    if constexpr (F8) {
#pragma unroll
        for (int n = 0; n < NK / 8; n++) {
            const float2 k2 = *(const float2 *)(ksc + n * 8 + 2 * t4), v2 = *(const float2 *)(vsc + n * 8 + 2 * t4);
            s[n][0] *= k2.x;
            s[n][1] *= k2.y;
            s[n][2] *= k2.x;
            s[n][3] *= k2.y;
            vsk[n][0] = v2.x * F8_PV;
            vsk[n][1] = v2.y * F8_PV;
        }
    }
    if (capl > 0.0f)
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[n][c] = capl * tanhf(s[n][c] / capl);
    if (masked) // a uniform branch: most steps see every key
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                if (!allowed(c >> 1, n * 8 + 2 * t4 + (c & 1))) s[n][c] = -INFINITY;
    float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
    for (int n = 0; n < NK / 8; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) mx[c >> 1] = fmaxf(mx[c >> 1], s[n][c]);
    float mn[2], corr[2], mref[2], rs[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mn[r] = online_max(st.m[r], mx[r], corr[r], mref[r]);
    }
    // P as the A operand of P V: keys 16 kp + 0..7 come from n-tile 2 kp, 8..15 from 2 kp + 1
#pragma unroll
    for (int n = 0; n < NK / 8; n++) {
        float p[4];
#pragma unroll
        for (int c = 0; c < 4; c++) p[c] = ex2(s[n][c] - mref[c >> 1]);
        rs[0] += p[0] + p[1];
        rs[1] += p[2] + p[3];
        if constexpr (F8) {
            p[0] *= vsk[n][0];
            p[1] *= vsk[n][1];
            p[2] *= vsk[n][0];
            p[3] *= vsk[n][1];
        }
        pa[n >> 1][(n & 1) * 2] = kc_pack_h2(p[0], p[1]);
        pa[n >> 1][(n & 1) * 2 + 1] = kc_pack_h2(p[2], p[3]);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        st.l[r] = st.l[r] * corr[r] + rs[r];
        st.m[r] = mn[r];
    }
    // O keeps its scale where no row's maximum moved (corr = 1 exactly), which after the
    // first keys is most steps: 4 HD / 8 multiplications a thread saved
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f))
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            st.o[d][0] *= corr[0];
            st.o[d][1] *= corr[0];
            st.o[d][2] *= corr[1];
            st.o[d][3] *= corr[1];
        }
}

// One online-softmax step of a warp's 16 rows against NK keys in shared memory (ks, vs: the
// shared addresses of K and V rows, [NK][HD + 8] halves each): S = Q Kᵀ, softmax_step, O += P V.
template <int HD, int NK, typename Allowed>
__device__ __forceinline__ void attend(wstate<HD> &st, const uint32_t (&qa)[HD / 16][4], uint32_t ks, uint32_t vs, int lane,
                                       float capl, Allowed allowed, bool masked = true) {
    constexpr int ROW = (HD + 8) * 2; // bytes per shared row
    float s[NK / 8][4];
#pragma unroll
    for (int n = 0; n < NK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    // K as the B operand (k = dims, n = keys): matrix i of the x4 is keys 8 (i / 2) + 0..7,
    // dims 8 (i % 2) + 0..7 of a 16 x 16 block, so r[0..1] feed keys 0..7 and r[2..3] keys 8..15
    const uint32_t k_lane = ks + ((lane >> 4) * 8 + (lane & 7)) * ROW + ((lane >> 3) & 1) * 16;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int np = 0; np < NK / 16; np++) {
            uint32_t b[4];
            kc_ldmatrix_x4(b, k_lane + np * 16 * ROW + kk * 32);
            kc_mma16816(s[2 * np], qa[kk], b[0], b[1]);
            kc_mma16816(s[2 * np + 1], qa[kk], b[2], b[3]);
        }
    uint32_t pa[NK / 16][4];
    softmax_step<HD, NK, false>(st, s, pa, lane, capl, masked, allowed, nullptr, nullptr);
    // V as the B operand (k = keys, n = dims), transposed by ldmatrix: matrix i is keys
    // 8 (i % 2) + 0..7, dims 8 (i / 2) + 0..7, so r[0..1] feed dims 0..7 and r[2..3] dims 8..15
    const uint32_t v_lane = vs + (((lane >> 3) & 1) * 8 + (lane & 7)) * ROW + (lane >> 4) * 16;
#pragma unroll
    for (int kp = 0; kp < NK / 16; kp++)
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t b[4];
            kc_ldmatrix_x4_trans(b, v_lane + kp * 16 * ROW + dp * 32);
            kc_mma16816(st.o[2 * dp], pa[kp], b[0], b[1]);
            kc_mma16816(st.o[2 * dp + 1], pa[kp], b[2], b[3]);
        }
}

// ---- FP8 decode: the cache's codes straight into mma fragments ------------------------------
//
// A decode warp's raw stage holds a 16-position group as the cache stores it (K codes [16][HD],
// V codes [16][HD], K scales [16], V scales [16]; stage_f8_raw), each row's 16-byte chunks
// XOR-swizzled by the row (f8_swz) so that the loads below are free of bank conflicts. Lanes
// read their operands from it directly; no half copy goes through shared memory.
//
// K: the dims of Q Kᵀ may be taken in any order that Q and K share. Lane (g, t4) takes the
// bytes [HD/4 t4, HD/4 (t4 + 1)) of key rows g and g + 8; their word kk is the B fragment of
// k-step kk (low half: its k = 2 t4, 2 t4 + 1; high half: 2 t4 + 8, 2 t4 + 9), and load_q_f8
// puts the same dims in the A fragments. So K needs no transposition.
// V: the output dims may be assigned to mma columns in any order. Column g of n-tile i is dim
// HD/8 g + i, so lane (g, t4) reads bytes [HD/8 g, HD/8 (g + 1)) of key rows 2 t4, 2 t4 + 1,
// 2 t4 + 8, 2 t4 + 9 and pairs them byte by byte (prmt); O's column c of n-tile i is then dim
// HD/8 c + i (f8_out_dim).
template <int HD> __device__ __forceinline__ int f8_swz(int r, int chunk) { return chunk ^ (r & (HD / 16 - 1)); }
__host__ __device__ constexpr int f8_out_dim(int HD, int col, int i) { return HD / 8 * col + i; }

// Four E4M3 codes as two half2 (exact): lo from bytes 0, 1 of x, hi from bytes 2, 3.
__device__ __forceinline__ void f8x4_h2(uint32_t x, uint32_t &lo, uint32_t &hi) {
    asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
template <int N> __device__ __forceinline__ void lds(uint32_t *u, uint32_t a) {
    if constexpr (N == 4)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "r"(a));
    else
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(u[0]), "=r"(u[1]) : "r"(a));
}

// The dims of a query row in the order of a lane's K piece (see above), as the B fragments of
// Qᵀ (qb[kk]: the low and high halves of word kk) for attend_f8t; qr NULL: a zero row.
template <int HD>
__device__ __forceinline__ void load_q_f8t(uint32_t (&qb)[HD / 16][2], const float *qr, float qscale, int t4) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const float4 x = qr ? *(const float4 *)(qr + HD / 4 * t4 + 4 * kk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        qb[kk][0] = kc_pack_h2(x.x * qscale, x.y * qscale);
        qb[kk][1] = kc_pack_h2(x.z * qscale, x.w * qscale);
    }
}
// The same as the A fragments of 16 query rows (r0, r1: this thread's rows g and g + 8).
template <int HD>
__device__ __forceinline__ void load_q_f8(uint32_t (&qa)[HD / 16][4], const float *r0, const float *r1, float qscale, int t4) {
    uint32_t x0[HD / 16][2], x1[HD / 16][2];
    load_q_f8t<HD>(x0, r0, qscale, t4);
    load_q_f8t<HD>(x1, r1, qscale, t4);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        qa[kk][0] = x0[kk][0];
        qa[kk][1] = x1[kk][0];
        qa[kk][2] = x0[kk][1];
        qa[kk][3] = x1[kk][1];
    }
}

// The lane's K piece of key row r of a raw stage (bytes [HD/4 t4, HD/4 (t4 + 1)): word kk holds
// k-step kk's fragment) and its V pieces (bytes [HD/8 g, HD/8 (g + 1)) of key rows 2 t4,
// 2 t4 + 1, 2 t4 + 8, 2 t4 + 9).
template <int HD> __device__ __forceinline__ void f8_k_piece(uint32_t (&u)[HD / 16], uint32_t raw, int r, int t4) {
#pragma unroll
    for (int c = 0; c < HD / 64; c++) lds<4>(u + 4 * c, raw + r * HD + f8_swz<HD>(r, HD / 64 * t4 + c) * 16);
}
template <int HD> __device__ __forceinline__ void f8_v_pieces(uint32_t (&v)[4][HD / 32], uint32_t raw, int g, int t4) {
    const int bo = HD / 8 * g; // the piece's first byte in its row
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int r = 2 * t4 + (k & 1) + 8 * (k >> 1);
        lds<HD / 32>(v[k], raw + 16 * HD + r * HD + f8_swz<HD>(r, bo / 16) * 16 + bo % 16);
    }
}

// One online-softmax step of a warp's 16 rows against the 16 keys of a raw FP8 stage at raw.
template <int HD, typename Allowed>
__device__ __forceinline__ void attend_f8(wstate<HD> &st, const uint32_t (&qa)[HD / 16][4], uint32_t raw, int lane, float capl,
                                          bool masked, Allowed allowed, const float *ksc, const float *vsc) {
    const int g = lane >> 2, t4 = lane & 3;
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        uint32_t u[HD / 16];
        f8_k_piece<HD>(u, raw, g + 8 * j, t4);
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t b0, b1;
            f8x4_h2(u[kk], b0, b1);
            kc_mma16816(s[j], qa[kk], b0, b1);
        }
    }
    uint32_t pa[1][4];
    softmax_step<HD, 16, true>(st, s, pa, lane, capl, masked, allowed, ksc, vsc);
    constexpr int VW = HD / 32; // words of a lane's piece of a V row
    uint32_t v[4][VW];
    f8_v_pieces<HD>(v, raw, g, t4);
#pragma unroll
    for (int w = 0; w < VW; w++) {
        // bytes b of rows 2 t4 and 2 t4 + 1 side by side (b0 of n-tile 4 w + b), and of rows
        // 2 t4 + 8 and 2 t4 + 9 (b1)
        uint32_t b[4][2];
        f8x4_h2(prmt(v[0][w], v[1][w], 0x5140), b[0][0], b[1][0]);
        f8x4_h2(prmt(v[0][w], v[1][w], 0x7362), b[2][0], b[3][0]);
        f8x4_h2(prmt(v[2][w], v[3][w], 0x5140), b[0][1], b[1][1]);
        f8x4_h2(prmt(v[2][w], v[3][w], 0x7362), b[2][1], b[3][1]);
#pragma unroll
        for (int k = 0; k < 4; k++) kc_mma16816(st.o[4 * w + k], pa[0], b[k][0], b[k][1]);
    }
}

// ---- FP8 decode with the keys as rows (G <= 8) ----------------------------------------------
//
// With at most 8 query heads to a KV head, decode computes Sᵀ = K Qᵀ and Oᵀ = Vᵀ Pᵀ: the 16 keys
// of a group are the 16 rows of the mma and the heads its 8 columns, so half the products of
// attend_f8's (which pads G heads to 16 rows) and half its softmax work a thread. The operands
// come from the same pieces of the raw stage: K's as A fragments (rows g and g + 8, the dims in
// load_q_f8's order), Qᵀ as B fragments of the same dims (load_q_f8t), Vᵀ as A fragments (m-tile i,
// row g: dim HD/8 g + 2 i; row g + 8: HD/8 g + 2 i + 1). Pᵀ reaches the B operand of Oᵀ by four
// shuffles: a thread's scores are heads 2 t4, 2 t4 + 1 of keys g and g + 8, the fragment wants
// head g of keys 2 t4, 2 t4 + 1 (b0) and 2 t4 + 8, 2 t4 + 9 (b1).
template <int HD> struct tstate {
    float o[HD / 16][4]; // m-tile i: dims HD/8 g + 2 i (c 0, 1) and + 1 (c 2, 3); heads 2 t4 (c 0, 2), 2 t4 + 1 (c 1, 3)
    float m[2], l[2];    // heads 2 t4 + e; l: this thread's keys' share until tstate_finish
};

template <int HD, typename Allowed>
__device__ __forceinline__ void attend_f8t(tstate<HD> &st, const uint32_t (&qb)[HD / 16][2], uint32_t raw, int lane, float capl,
                                           bool masked, Allowed allowed, const float *ksc, const float *vsc) {
    const int g = lane >> 2, t4 = lane & 3;
    uint32_t u0[HD / 16], u1[HD / 16];
    f8_k_piece<HD>(u0, raw, g, t4);
    f8_k_piece<HD>(u1, raw, g + 8, t4);
    float s[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[4];
        f8x4_h2(u0[kk], a[0], a[2]);
        f8x4_h2(u1[kk], a[1], a[3]);
        kc_mma16816(s, a, qb[kk][0], qb[kk][1]);
    }
    const float k0 = ksc[g], k1 = ksc[g + 8];
    s[0] *= k0;
    s[1] *= k0;
    s[2] *= k1;
    s[3] *= k1;
    if (capl > 0.0f)
#pragma unroll
        for (int c = 0; c < 4; c++) s[c] = capl * tanhf(s[c] / capl);
    if (masked) {
        if (!allowed(0, g)) s[0] = s[1] = -INFINITY;
        if (!allowed(0, g + 8)) s[2] = s[3] = -INFINITY;
    }
    float mx[2] = { fmaxf(s[0], s[2]), fmaxf(s[1], s[3]) }, corr[2], mref[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], x));
        st.m[e] = online_max(st.m[e], mx[e], corr[e], mref[e]);
    }
    float p[4];
#pragma unroll
    for (int c = 0; c < 4; c++) p[c] = ex2(s[c] - mref[c & 1]);
#pragma unroll
    for (int e = 0; e < 2; e++) st.l[e] = st.l[e] * corr[e] + p[e] + p[2 + e];
    const float v0 = vsc[g] * F8_PV, v1 = vsc[g + 8] * F8_PV;
    const uint32_t plo = kc_pack_h2(p[0] * v0, p[1] * v0), phi = kc_pack_h2(p[2] * v1, p[3] * v1);
    const int sa = 8 * t4 + (g >> 1), sb = sa + 4;
    const uint32_t xa = __shfl_sync(0xffffffffu, plo, sa), xb = __shfl_sync(0xffffffffu, plo, sb);
    const uint32_t ya = __shfl_sync(0xffffffffu, phi, sa), yb = __shfl_sync(0xffffffffu, phi, sb);
    const uint32_t sel = (g & 1) ? 0x7632 : 0x5410;
    const uint32_t b0 = prmt(xa, xb, sel), b1 = prmt(ya, yb, sel);
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f))
#pragma unroll
        for (int i = 0; i < HD / 16; i++) {
            st.o[i][0] *= corr[0];
            st.o[i][1] *= corr[1];
            st.o[i][2] *= corr[0];
            st.o[i][3] *= corr[1];
        }
    constexpr int VW = HD / 32;
    uint32_t v[4][VW];
    f8_v_pieces<HD>(v, raw, g, t4);
#pragma unroll
    for (int w = 0; w < VW; w++) {
        uint32_t a0[4], a1[4]; // m-tiles 2 w and 2 w + 1
        f8x4_h2(prmt(v[0][w], v[1][w], 0x5140), a0[0], a0[1]);
        f8x4_h2(prmt(v[2][w], v[3][w], 0x5140), a0[2], a0[3]);
        f8x4_h2(prmt(v[0][w], v[1][w], 0x7362), a1[0], a1[1]);
        f8x4_h2(prmt(v[2][w], v[3][w], 0x7362), a1[2], a1[3]);
        kc_mma16816(st.o[2 * w], a0, b0, b1);
        kc_mma16816(st.o[2 * w + 1], a1, b0, b1);
    }
}

// The quad's shares of l added up (every lane of a quad then holds its rows' sums).
template <int HD> __device__ __forceinline__ void wstate_finish(wstate<HD> &st) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 1);
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 2);
    }
}

// Copies `rows` rows of HD halves starting at the cache row `src` (consecutive positions of one
// block) into shared rows of pitch HD + 8 at dst, zero-filling rows >= n_ok. Threads tid, tid +
// nthr, ... of the caller's group take 16-byte pieces.
template <int HD>
__device__ __forceinline__ void stage_rows(uint32_t dst, const __half *src, int rows, int n_ok, int tid, int nthr) {
    for (int c = tid; c < rows * (HD / 8); c += nthr) {
        const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const bool ok = r < n_ok;
        kc_cp_async16(dst + (r * (HD + 8) + col) * 2, src + (ok ? r * HD + col : 0), ok);
    }
}

// The same from an FP8 cache (attn_common.cuh): NP 16-byte pieces of K rows and of V rows per
// thread (piece c = c0 + p * stride: tile row c / (HD / 8), columns 8 (c % (HD / 8)) + 0..7)
// into shared rows of pitch HD + 8 at dst (K) and dst + v_off (V). where(c, b, r, ok) names the
// piece's block, its row in the block and whether it holds a key (else zeros). Every piece's
// codes and scale are loaded first (all in flight at once), then expanded to halves (code x
// scale, rounded) and stored: plain loads and shared stores, visible after the caller's
// barrier like the completed copies of the F16 path.
template <int HD, int NP, typename Where>
__device__ __forceinline__ void stage_f8(uint32_t dst, uint32_t v_off, const uint8_t *kc, const uint8_t *vc, int n_kv, int bs,
                                         int h, int c0, int stride, Where where) {
    const size_t blk = (size_t)bs * n_kv * (HD + 4);
    uint2 kq[NP], vq[NP];
    float ks[NP], vs[NP];
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c = c0 + p * stride, col = (c % (HD / 8)) * 8;
        size_t b;
        int r;
        bool ok;
        where(c, b, r, ok);
        kq[p] = vq[p] = make_uint2(0, 0);
        ks[p] = vs[p] = 0.0f;
        if (ok) {
            const size_t rh = (size_t)r * n_kv + h;
            const uint8_t *kb = kc + b * blk, *vb = vc + b * blk;
            kq[p] = __ldcg((const uint2 *)(kb + rh * HD + col));
            vq[p] = __ldcg((const uint2 *)(vb + rh * HD + col));
            ks[p] = __ldcg((const float *)(kb + kv_f8_scale(r, h, n_kv, bs, HD)));
            vs[p] = __ldcg((const float *)(vb + kv_f8_scale(r, h, n_kv, bs, HD)));
        }
    }
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int c = c0 + p * stride;
        const uint32_t a = dst + ((c / (HD / 8)) * (HD + 8) + (c % (HD / 8)) * 8) * 2;
        const uint4 k8 = kv_f8_expand8(kq[p], ks[p]), v8 = kv_f8_expand8(vq[p], vs[p]);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(k8.x), "r"(k8.y), "r"(k8.z), "r"(k8.w) : "memory");
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a + v_off), "r"(v8.x), "r"(v8.y), "r"(v8.z), "r"(v8.w)
                     : "memory");
    }
}

// The FP8 decode path's raw stage: a 16-position group's K codes [16][HD], V codes [16][HD],
// then K scales [16] and V scales [16] (f32), copied by cp.async like the F16 rows (rows at or
// past n_ok zero-filled), the 16-byte chunks of row r at chunk positions f8_swz(r, chunk).
// b: the group's block, r0: its first row in the block.
template <int HD> __host__ __device__ constexpr int f8_raw_bytes() { return 2 * 16 * HD + 2 * 16 * 4; }

constexpr int DEC_NST = 3; // cp.async stages per decode warp (two groups in flight while one is used)
// The decode kernel's dynamic shared memory: the warps' stages, or the merge of the warps'
// states if that is larger.
__host__ __device__ constexpr size_t dec_stage_bytes(int HD, bool F8) {
    return F8 ? (size_t)DEC_WARPS * DEC_NST * (2 * 16 * HD + 2 * 16 * 4) : (size_t)DEC_WARPS * DEC_NST * 2 * 16 * (HD + 8) * 2;
}
__host__ __device__ constexpr size_t dec_smem_bytes(int HD, bool F8) {
    return dec_stage_bytes(HD, F8) > ((size_t)DEC_WARPS * 16 * HD + 2 * DEC_WARPS * 16) * 4
               ? dec_stage_bytes(HD, F8)
               : ((size_t)DEC_WARPS * 16 * HD + 2 * DEC_WARPS * 16) * 4;
}
// The lane's share of stage_f8_raw's copies, the same for every group: chunk lane % PR of rows
// lane / PR + j 32 / PR (PR = HD / 16 chunks a row), for the K rows (j < 16 PR / 32) and then
// the V rows. goff: its offset in the cache from the group's first row; soff: in the stage.
template <int HD> struct f8_lane {
    static constexpr int PR = HD / 16, NJ = 16 * PR / 32, RPI = 32 / PR;
    uint32_t goff, soff[NJ];
    int row;
    __device__ __forceinline__ f8_lane(int lane, int n_kv) {
        row = lane / PR;
        goff = (uint32_t)row * n_kv * HD + lane % PR * 16;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int r = row + RPI * j;
            soff[j] = r * HD + f8_swz<HD>(r, lane % PR) * 16;
        }
    }
};
template <int HD>
__device__ __forceinline__ void stage_f8_raw(uint32_t dst, const uint8_t *kc, const uint8_t *vc, size_t b, int r0, int n_ok,
                                             int n_kv, int bs, int h, int lane, const f8_lane<HD> &fl) {
    using L = f8_lane<HD>;
    const size_t blk = (size_t)bs * n_kv * (HD + 4), first = ((size_t)r0 * n_kv + h) * HD;
    const uint8_t *kb = kc + b * blk, *vb = vc + b * blk;
    const uint8_t *kr = kb + first + fl.goff, *vr = vb + first + fl.goff;
    const size_t step = (size_t)L::RPI * n_kv * HD;
#pragma unroll
    for (int j = 0; j < L::NJ; j++) {
        const bool ok = fl.row + L::RPI * j < n_ok;
        kc_cp_async16(dst + fl.soff[j], ok ? kr + j * step : kb, ok);
        kc_cp_async16(dst + 16 * HD + fl.soff[j], ok ? vr + j * step : vb, ok);
    }
    const int r = lane & 15, isv = lane >> 4;
    const bool ok = r < n_ok;
    const uint8_t *src = (isv ? vb : kb) + kv_f8_scale(r0 + r, h, n_kv, bs, HD); // 16 side by side: two sectors
    kc_cp_async4(dst + 2 * 16 * HD + lane * 4, ok ? src : kb, ok);
}

// ---- decode ---------------------------------------------------------------------------------

// The split merge of one (token, head) by the whole CTA (the last split's; partials in
// natural-log units, [n_valid][HD + 2]): the maximum over all splits first, then warp w adds
// splits w, w + DEC_WARPS, ... (lane: elements 2 lane, 2 lane + 1 and 64 more for HD 128, with
// independent loads in flight), and the warps' sums meet in shared memory in warp order. red:
// shared scratch of DEC_WARPS * (HD + 2) + DEC_WARPS floats (rows of HD + 2 keep float2
// alignment). Only where tc_merge_rows' sums do not fit shared memory (more splits than any
// plan launches).
template <int HD>
__device__ void tc_merge(const float *pp, int n_valid, const att_emit &em, size_t row, float *red) {
    static_assert(HD == 64 || HD == 128, "tc_merge: head dim");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float M = -INFINITY;
    for (int i = threadIdx.x; i < n_valid; i += blockDim.x) M = fmaxf(M, __ldcg(pp + (size_t)i * (HD + 2)));
    M = kc_warp_max(M);
    float *red_m = red + DEC_WARPS * (HD + 2);
    if (lane == 0) red_m[warp] = M;
    __syncthreads();
    M = red_m[0];
#pragma unroll
    for (int w = 1; w < DEC_WARPS; w++) M = fmaxf(M, red_m[w]);
    constexpr int NP = HD / 64; // float2 pairs per lane
    float2 o[NP];
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < NP; k++) o[k] = make_float2(0.0f, 0.0f);
#pragma unroll 4
    for (int i = warp; i < n_valid; i += DEC_WARPS) {
        const float *pi = pp + (size_t)i * (HD + 2);
        const float c = __expf(__ldcg(pi) - M);
        L = fmaf(__ldcg(pi + 1), c, L);
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const float2 v = __ldcg((const float2 *)(pi + 2 + 64 * k + 2 * lane));
            o[k].x = fmaf(v.x, c, o[k].x);
            o[k].y = fmaf(v.y, c, o[k].y);
        }
    }
    float *ro = red + warp * (HD + 2);
#pragma unroll
    for (int k = 0; k < NP; k++) *(float2 *)(ro + 64 * k + 2 * lane) = o[k];
    if (lane == 0) ro[HD] = L;
    __syncthreads();
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float Ls = 0.0f, Os = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            Ls += red[w * (HD + 2) + HD];
            Os += red[w * (HD + 2) + e];
        }
        att_finish<HD>(em, row, e, Ls > 0.0f ? Os / Ls : 0.0f);
    }
    __syncthreads(); // red is reused by the next row
}

// The split merge of all G rows of one (token, KV head) at once, by the whole CTA (the last
// split's). Row r's partials sit at pp + r * n_split * (HD + 2), n_valid of them. The maxima and
// sums of every row's splits come to shared memory in one pass; warp w then adds splits w,
// w + DEC_WARPS, ... of every row (lane: elements 2 lane, 2 lane + 1 and 64 more for HD 128),
// so the loads of all rows are in flight together, and the warps' sums meet in shared memory
// in warp order. tc_merge took the rows one after another: four or five dependent L2 round
// trips a row at the end of the step's attention (batch 1, 32k positions: 4 rows x 66 splits).
// red: shared scratch of merge_rows_floats(GM, n_valid) floats.
__host__ __device__ constexpr size_t merge_rows_floats(int HD, int GM, int n_valid) {
    return ((size_t)2 * GM * n_valid + 16 + 3) / 4 * 4 + (size_t)DEC_WARPS * GM * HD;
}
template <int HD, int GM>
__device__ void tc_merge_rows(const float *pp, int n_split, int G, int n_valid, const att_emit &em, size_t row0, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *sm_c = split_weights<HD>(pp, n_split, G, n_valid, red, att_cta()), *sm_L = sm_c + 2 * G * n_valid;
    float *ro = red + ((size_t)2 * GM * n_valid + 16 + 3) / 4 * 4; // [DEC_WARPS][GM][HD]
    constexpr int NP = HD / 64; // float2 pairs per lane
    float2 o[GM][NP];
#pragma unroll
    for (int r = 0; r < GM; r++)
#pragma unroll
        for (int k = 0; k < NP; k++) o[r][k] = make_float2(0.0f, 0.0f);
    // US splits a warp at a time, every row of each: their loads are one basic block, so they are
    // all in flight together (rows past G read row G - 1 again with weight 0, never a branch)
    constexpr int US = GM >= 16 ? 1 : GM >= 8 ? 2 : 4;
    for (int s0 = warp; s0 < n_valid; s0 += US * DEC_WARPS) {
        float2 v[US][GM][NP];
        float c[US][GM];
#pragma unroll
        for (int u = 0; u < US; u++) {
            const int sp = min(s0 + u * DEC_WARPS, n_valid - 1);
#pragma unroll
            for (int r = 0; r < GM; r++) {
                const int rr = min(r, G - 1);
                const float *pi = pp + ((size_t)rr * n_split + sp) * (HD + 2) + 2;
#pragma unroll
                for (int k = 0; k < NP; k++) v[u][r][k] = __ldcg((const float2 *)(pi + 64 * k + 2 * lane));
                c[u][r] = r < G && s0 + u * DEC_WARPS < n_valid ? sm_c[rr * n_valid + sp] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < US; u++)
#pragma unroll
            for (int r = 0; r < GM; r++)
#pragma unroll
                for (int k = 0; k < NP; k++) {
                    o[r][k].x = fmaf(v[u][r][k].x, c[u][r], o[r][k].x);
                    o[r][k].y = fmaf(v[u][r][k].y, c[u][r], o[r][k].y);
                }
    }
#pragma unroll
    for (int r = 0; r < GM; r++) {
        if (r >= G) break;
#pragma unroll
        for (int k = 0; k < NP; k++) *(float2 *)(ro + ((size_t)warp * GM + r) * HD + 64 * k + 2 * lane) = o[r][k];
    }
    __syncthreads();
    // G HD-wide rows; a warp's 32 consecutive outputs are one block of one row (HD % 32 == 0)
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const int r = i / HD, e = i % HD;
        float O = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) O += ro[((size_t)w * GM + r) * HD + e];
        const float L = sm_L[r];
        att_finish<HD>(em, row0 + (size_t)r * HD, e, L > 0.0f ? O / L : 0.0f);
    }
}

// HW 4: a warp's G finished rows (ro: [16][HD] unnormalized, rl: [16] sums, in its own stages'
// shared memory, written by the warp before a __syncwarp) divided by their sums and emitted; a
// row's 32 consecutive outputs a pass (HD % 32 == 0): kc_xq_block1's blocks.
template <int HD>
__device__ __forceinline__ void dec_hpw_emit(const att_emit &em, const float *ro, const float *rl, int G, size_t row0, int lane) {
    for (int i = lane; i < G * HD; i += 32) {
        const int r = i / HD, e = i % HD;
        const float L = rl[r];
        att_finish<HD>(em, row0 + (size_t)r * HD, e, L > 0.0f ? ro[i] / L : 0.0f);
    }
}

// F8: the cache holds E4M3 codes and scales (attn_common.cuh), else halves. KROWS (F8, G <= 8):
// the keys as the rows of the products (attend_f8t). HW: the KV heads of a CTA, its DEC_WARPS / HW
// warps a head (WH) taking every WH-th 16-key group of it. HW 1: the warps' states merge through
// the CTA's shared memory (and splits through partials). HW 4 (one split; F16, or F8 with KROWS):
// warp w takes KV head 4 blockIdx.x + w, all its keys, and writes its rows itself (no merge): at
// short contexts a CTA's start and its merge weigh as much as its copies, and a warp walking a
// whole head keeps its two groups in flight for longer. HW 2 (one split, F8 with KROWS): two warps
// a head, merged by the pair through its own shared memory (a named barrier): as many warps as
// HW 1 in half the CTAs where HW 4 leaves too few warps an SM (128 sequences of llama3-8b).
template <int HD, int NST, bool F8, bool KROWS = false, int MINB = 1, int HW = 1>
__global__ void __launch_bounds__(DEC_WARPS * 32, MINB)
attn_dec_kernel(const float *q, const void *k_cache, const void *v_cache, att_emit em, float *partial, int *counters,
                const int32_t *toks, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                const int32_t *chunk_p, int max_blocks, int n_head, int n_kv, int block_size, float qscale, int n_split,
                float capl, int window) {
    KC_TRACE_SCOPE(KC_TR_ATTN);
    static_assert(HW == 1 || HW == 4 || (HW == 2 && F8 && KROWS), "attn_dec_kernel: heads a CTA");
    static_assert(HW == 1 || !F8 || KROWS, "attn_dec_kernel: an FP8 cache's heads a CTA take the keys as the rows");
    constexpr int WH = DEC_WARPS / HW; // warps a KV head
    constexpr int ROWH = HD + 8, STAGE = 2 * 16 * ROWH; // halves per stage: 16 K rows, then 16 V rows
    extern __shared__ __align__(16) uint8_t smem[];
    kc_pdl_trigger();
    // toks, pos, seq, the block tables and the chunk were staged before the step's first kernel
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    // the KV heads of a token are neighbours in the grid: they run together and share the FP8
    // cache's scale sectors (and the F16 cache's block) in L2
    const int ti = blockIdx.y, t = toks ? toks[ti] : ti; // partials and counters go by ti
    const int kvh = blockIdx.x * HW + warp / WH, sub = warp % WH, split = blockIdx.z;
    const int G = n_head / n_kv, h0 = kvh * G;
    if (HW > 1 && kvh >= n_kv) { // the warps of a head past the last (n_kv % HW)
        kc_pdl_wait();
        return;
    }
    const int p = pos[t], chunk = *chunk_p;
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    const int start = split * chunk, end = min(start + chunk, p + 1);
    if (n_split > 1 && start > p) { // no key of this token here: the merge reads only splits below p / chunk + 1
        kc_pdl_wait();
        return;
    }
    kc_pdl_wait();

    // F16: NST stages of half rows a warp. F8: NST raw stages.
    constexpr int WBYTES = F8 ? NST * f8_raw_bytes<HD>() : NST * STAGE * 2;
    const uint32_t sw = kc_smem_addr(smem) + warp * WBYTES;
    const uint8_t *sraw = smem + warp * WBYTES; // F8: the raw stages (generic address)
    // the warp's groups: keys first + GS i .. + 15
    constexpr int GS = 16 * WH;
    const int first = start + 16 * sub;
    const int n_grp = end > first ? (end - first + GS - 1) / GS : 0;
    // sliding window: keys below lo are masked; groups entirely below it are skipped (their
    // blocks may have been freed), starting at the first group i_lo that reaches lo
    const int lo = window > 0 ? max(0, p - window + 1) : 0;
    const int i_lo = lo > first + 15 ? (lo - first - 15 + GS - 1) / GS : 0;
    const f8_lane<HD> fl(lane, n_kv); // F8: the lane's copies
    auto issue = [&](int i) {
        if (i < n_grp) {
            const int j0 = first + GS * i;
            const uint32_t dst = sw + (i % NST) * STAGE * 2; // F16
            if constexpr (F8) { // 16 rows of one block (j0 % 16 == 0, block_size % 16 == 0)
                stage_f8_raw<HD>(sw + (i % NST) * f8_raw_bytes<HD>(), (const uint8_t *)k_cache, (const uint8_t *)v_cache,
                                 bt[j0 / block_size], j0 % block_size, end - j0, n_kv, block_size, kvh, lane, fl);
            } else {
                const size_t base = (((size_t)bt[j0 / block_size] * n_kv + kvh) * block_size + j0 % block_size) * HD;
                stage_rows<HD>(dst, (const __half *)k_cache + base, 16, end - j0, lane, 32);
                stage_rows<HD>(dst + 16 * ROWH * 2, (const __half *)v_cache + base, 16, end - j0, lane, 32);
            }
        }
        kc_cp_async_commit(); // empty groups too: the wait below counts groups
    };
#pragma unroll
    for (int i = 0; i < NST - 1; i++) issue(i_lo + i);
    // step(stage, masked, allowed) for each of the warp's groups as its copies land
    auto each_group = [&](auto &&step) {
        for (int i = i_lo; i < n_grp; i++) {
            issue(i + NST - 1);
            kc_cp_async_wait<NST - 1>();
            __syncwarp();
            const int lim = end - (first + GS * i); // keys of this group below end
            const int low = lo - (first + GS * i);  // and from lo
            step(i % NST, lim < 16 || low > 0, [&](int, int key) { return key < lim && key >= low; });
            __syncwarp(); // every lane is done with this stage before it is refilled
        }
        kc_cp_async_wait<0>();
    };
    float *red_o = (float *)smem; // [DEC_WARPS][16][HD]
    float *red_m = red_o + DEC_WARPS * 16 * HD, *red_l = red_m + DEC_WARPS * 16;
    const float *qt = q + ((size_t)t * n_head + h0) * HD;
    if constexpr (KROWS) {
        uint32_t qb[HD / 16][2];
        load_q_f8t<HD>(qb, g < G ? qt + (size_t)g * HD : nullptr, qscale, t4);
        tstate<HD> st;
#pragma unroll
        for (int i = 0; i < HD / 16; i++) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;
        st.m[0] = st.m[1] = -INFINITY;
        st.l[0] = st.l[1] = 0.0f;
        each_group([&](int b, bool masked, auto allowed) {
            const float *sc = (const float *)(sraw + b * f8_raw_bytes<HD>() + 2 * 16 * HD);
            attend_f8t<HD>(st, qb, sw + b * f8_raw_bytes<HD>(), lane, capl, masked, allowed, sc, sc + 16);
        });
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], x);
        if constexpr (HW > 1) { // the warp's rows 2 t4 + e (< G) through its own stages, now free
            static_assert((16 * HD + 32) * 4 <= WBYTES, "attn_dec_kernel: a warp's rows in its stages");
            __syncwarp();
            // [16][HD], then [16] sums and [16] maxima
            float *ro = (float *)(smem + warp * WBYTES), *rl = ro + 16 * HD, *rm = rl + 16;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = 2 * t4 + e;
                if (r >= G) continue;
#pragma unroll
                for (int i = 0; i < HD / 16; i++)
                    *(float2 *)(ro + r * HD + HD / 8 * g + 2 * i) = make_float2(st.o[i][e] * (1.0f / F8_PV), st.o[i][2 + e] * (1.0f / F8_PV));
                if (g == 0) {
                    rl[r] = st.l[e];
                    rm[r] = st.m[e];
                }
            }
            const size_t row0 = ((size_t)t * n_head + h0) * HD;
            if constexpr (WH == 1) {
                __syncwarp();
                dec_hpw_emit<HD>(em, ro, rl, G, row0, lane);
            } else { // the head's WH warps meet at named barrier 1 + its index in the CTA
                asm volatile("bar.sync %0, %1;" ::"r"(1 + warp / WH), "r"(32 * WH) : "memory");
                const float *r0 = (const float *)(smem + (warp - sub) * WBYTES); // the head's first warp's rows
                constexpr int WF = WBYTES / 4;                                    // floats from a warp's rows to the next's
                for (int i = sub * 32 + lane; i < G * HD; i += 32 * WH) {
                    const int r = i / HD;
                    float M = -INFINITY;
#pragma unroll
                    for (int w = 0; w < WH; w++) M = fmaxf(M, r0[w * WF + 16 * HD + 16 + r]);
                    float L = 0.0f, O = 0.0f;
                    if (M > -INFINITY)
#pragma unroll
                        for (int w = 0; w < WH; w++) {
                            const float *rw = r0 + w * WF, c = ex2(rw[16 * HD + 16 + r] - M);
                            L += rw[16 * HD + r] * c;
                            O += rw[i] * c;
                        }
                    att_finish<HD>(em, row0 + (size_t)r * HD, i % HD, L > 0.0f ? O / L : 0.0f);
                }
            }
            return;
        }
        __syncthreads(); // the stages are free: the warps' states meet there
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int r = 2 * t4 + e;
            if (r >= G) continue;
            float *ro = red_o + ((size_t)warp * 16 + r) * HD + HD / 8 * g;
#pragma unroll
            for (int i = 0; i < HD / 16; i++)
                *(float2 *)(ro + 2 * i) = make_float2(st.o[i][e] * (1.0f / F8_PV), st.o[i][2 + e] * (1.0f / F8_PV));
            if (g == 0) {
                red_m[warp * 16 + r] = st.m[e];
                red_l[warp * 16 + r] = st.l[e];
            }
        }
    } else {
        // the queries after the first stages' copies are on their way
        uint32_t qa[HD / 16][4];
        if constexpr (F8)
            load_q_f8<HD>(qa, g < G ? qt + (size_t)g * HD : nullptr, g + 8 < G ? qt + (size_t)(g + 8) * HD : nullptr, qscale, t4);
        else
            load_q<HD>(qa, g < G ? qt + (size_t)g * HD : nullptr, g + 8 < G ? qt + (size_t)(g + 8) * HD : nullptr, qscale, t4);
        wstate<HD> st;
        wstate_init(st);
        each_group([&](int b, bool masked, auto allowed) {
            if constexpr (F8) {
                const float *sc = (const float *)(sraw + b * f8_raw_bytes<HD>() + 2 * 16 * HD);
                attend_f8<HD>(st, qa, sw + b * f8_raw_bytes<HD>(), lane, capl, masked, allowed, sc, sc + 16);
            } else {
                const uint32_t ks = sw + b * STAGE * 2;
                attend<HD, 16>(st, qa, ks, ks + 16 * ROWH * 2, lane, capl, allowed, masked);
            }
        });
        wstate_finish(st);
        if constexpr (HW == 4) { // the warp's rows g and g + 8 (< G) through its own stages, now free
            static_assert((16 * HD + 16) * 4 <= WBYTES, "attn_dec_kernel: a warp's rows in its stages");
            __syncwarp();
            float *ro = (float *)(smem + warp * WBYTES), *rl = ro + 16 * HD; // [16][HD], then [16] sums
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int r = g + 8 * hi;
                if (r >= G) continue;
#pragma unroll
                for (int d = 0; d < HD / 8; d++) *(float2 *)(ro + r * HD + d * 8 + 2 * t4) = make_float2(st.o[d][2 * hi], st.o[d][2 * hi + 1]);
                if (t4 == 0) rl[r] = st.l[hi];
            }
            __syncwarp();
            dec_hpw_emit<HD>(em, ro, rl, G, ((size_t)t * n_head + h0) * HD, lane);
            return;
        }
        if constexpr (F8) // attend_f8's F8_PV
#pragma unroll
            for (int d = 0; d < HD / 8; d++)
#pragma unroll
                for (int c = 0; c < 4; c++) st.o[d][c] *= 1.0f / F8_PV;
        __syncthreads(); // the stages are free: the warps' states meet there
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const int r = g + 8 * hi;
            if (r >= G) continue;
            float *ro = red_o + ((size_t)warp * 16 + r) * HD;
            if constexpr (F8) // attend_f8's columns
#pragma unroll
                for (int d = 0; d < HD / 8; d++) {
                    ro[f8_out_dim(HD, 2 * t4, d)] = st.o[d][2 * hi];
                    ro[f8_out_dim(HD, 2 * t4 + 1, d)] = st.o[d][2 * hi + 1];
                }
            else
#pragma unroll
                for (int d = 0; d < HD / 8; d++)
                    *(float2 *)(ro + d * 8 + 2 * t4) = make_float2(st.o[d][2 * hi], st.o[d][2 * hi + 1]);
            if (t4 == 0) {
                red_m[warp * 16 + r] = st.m[hi];
                red_l[warp * 16 + r] = st.l[hi];
            }
        }
    }
    __syncthreads();
    // G HD-wide rows; a warp's 32 consecutive outputs are one block of one row (HD % 32 == 0)
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const int r = i / HD, e = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, red_m[w * 16 + r]);
        float L = 0.0f, O = 0.0f;
        if (M > -INFINITY)
#pragma unroll
            for (int w = 0; w < DEC_WARPS; w++) {
                const float c = ex2(red_m[w * 16 + r] - M);
                L += red_l[w * 16 + r] * c;
                O += red_o[((size_t)w * 16 + r) * HD + e] * c;
            }
        if (n_split == 1) {
            att_finish<HD>(em, ((size_t)t * n_head + h0 + r) * HD, e, L > 0.0f ? O / L : 0.0f);
        } else { // the partial in natural-log units, as att_merge reads it
            float *ps = partial + ((((size_t)ti * n_head + h0 + r) * n_split) + split) * (HD + 2);
            if (e == 0) {
                ps[0] = M * LN2;
                ps[1] = L;
            }
            ps[2 + e] = O;
        }
    }
    if (n_split == 1) return;
    const int n_valid = min(n_split, p / chunk + 1);
    if (!att_last_split(counters + (size_t)ti * n_head + h0, n_valid)) return;
    const float *pp = partial + ((size_t)ti * n_head + h0) * n_split * (HD + 2);
    const size_t row0 = ((size_t)t * n_head + h0) * HD;
    constexpr size_t SMEM = dec_smem_bytes(HD, F8);
    if (G <= 4 && merge_rows_floats(HD, 4, n_valid) * 4 <= SMEM)
        tc_merge_rows<HD, 4>(pp, n_split, G, n_valid, em, row0, (float *)smem);
    else if (G <= 8 && merge_rows_floats(HD, 8, n_valid) * 4 <= SMEM)
        tc_merge_rows<HD, 8>(pp, n_split, G, n_valid, em, row0, (float *)smem);
    else if (merge_rows_floats(HD, 16, n_valid) * 4 <= SMEM)
        tc_merge_rows<HD, 16>(pp, n_split, G, n_valid, em, row0, (float *)smem);
    else // more splits than shared memory holds the sums of
        for (int r = 0; r < G; r++)
            tc_merge<HD>(pp + (size_t)r * n_split * (HD + 2), n_valid, em, row0 + (size_t)r * HD, (float *)smem);
}

// ---- prefill --------------------------------------------------------------------------------

constexpr int PF_NK = 64; // key positions per shared tile

template <int HD, int NW, int NST, bool F8>
__global__ void __launch_bounds__(NW * 32)
attn_pf_kernel(const float *q, const void *k_cache, const void *v_cache, float *out, const int32_t *tiles,
               const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks, int n_head, int n_kv,
               int block_size, float qscale, float capl, int window, int kchunk, float *partial, int *counters) {
    KC_TRACE_SCOPE(KC_TR_ATTN);
    constexpr int ROWH = HD + 8, STAGE = 2 * PF_NK * ROWH;
    extern __shared__ __align__(16) uint8_t smem[];
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int tile = gridDim.x - 1 - blockIdx.x; // the backend lists tiles by position: the longest start first
    const int kvh = blockIdx.y, split = blockIdx.z, n_split = gridDim.z;
    const int t0 = tiles[2 * tile], nq = tiles[2 * tile + 1];
    const int G = n_head / n_kv, h0 = kvh * G;
    const int p0 = pos[t0], p_last = p0 + nq - 1;
    const int32_t *bt = block_tables + (size_t)seq[t0] * max_blocks;
    if (n_split > 1 && split * kchunk > p_last) { // no key of this tile here: the merge reads only splits below p_last / kchunk + 1
        kc_pdl_wait();
        return;
    }
    kc_pdl_wait();
    // this thread's rows r = 16 warp + g (+ 8): token r / G of the tile, head r % G
    const int r0 = 16 * warp + g, r1 = r0 + 8, i0 = r0 / G, i1 = r1 / G;
    uint32_t qa[HD / 16][4];
    load_q<HD>(qa, i0 < nq ? q + ((size_t)(t0 + i0) * n_head + h0 + r0 % G) * HD : nullptr,
               i1 < nq ? q + ((size_t)(t0 + i1) * n_head + h0 + r1 % G) * HD : nullptr, qscale, t4);
    const int lim0 = p0 + i0, lim1 = p0 + i1; // the last key each row sees
    const bool live = (16 * warp) / G < nq;
    const int w_lo = p0 + (16 * warp) / G, w_hi = p0 + min((16 * warp + 15) / G, nq - 1);

    const uint32_t sb = kc_smem_addr(smem);
    // split: key tiles [split kchunk, (split + 1) kchunk) / PF_NK only (kchunk % PF_NK == 0)
    const int n_kt = n_split > 1 ? min(p_last / PF_NK + 1, (split + 1) * (kchunk / PF_NK)) : p_last / PF_NK + 1;
    // sliding window: row r sees keys (lim - window, lim]; the tile's first row from lo0 on, so
    // key tiles below lo0 are skipped and positions below it never loaded (freed blocks)
    const int lo0 = window > 0 ? max(0, p0 - window + 1) : 0;
    const int i_lo = max(lo0 / PF_NK, n_split > 1 ? split * (kchunk / PF_NK) : 0);
    const int wlo0 = window > 0 ? lim0 - window : -1, wlo1 = window > 0 ? lim1 - window : -1;
    auto issue = [&](int i) {
        if (i < n_kt) {
            const int j0 = i * PF_NK;
            const uint32_t dst = sb + (i % NST) * STAGE * 2;
            if constexpr (F8) { // the same pieces, zero past p_last and (window) before lo0
                constexpr int NP = PF_NK * (HD / 8) / (NW * 32);
                static_assert(NP * NW * 32 == PF_NK * (HD / 8), "prefill FP8 staging: whole pieces per thread");
                stage_f8<HD, NP>(dst, PF_NK * ROWH * 2, (const uint8_t *)k_cache, (const uint8_t *)v_cache, n_kv, block_size, kvh,
                                 threadIdx.x, NW * 32, [&](int c, size_t &b, int &r, bool &ok) {
                                     const int j = j0 + c / (HD / 8);
                                     ok = j <= p_last && j >= lo0;
                                     b = ok ? bt[j / block_size] : 0;
                                     r = j % block_size;
                                 });
            } else {
                // 16-position pieces of blocks (block_size % 16 == 0), zero past p_last and (window) before lo0
                for (int c = threadIdx.x; c < PF_NK * (HD / 8); c += NW * 32) {
                    const int r = c / (HD / 8), col = (c % (HD / 8)) * 8, j = j0 + r;
                    const bool ok = j <= p_last && j >= lo0;
                    const size_t src =
                        ok ? (((size_t)bt[j / block_size] * n_kv + kvh) * block_size + j % block_size) * HD + col : 0;
                    kc_cp_async16(dst + (r * ROWH + col) * 2, (const __half *)k_cache + src, ok);
                    kc_cp_async16(dst + ((PF_NK + r) * ROWH + col) * 2, (const __half *)v_cache + src, ok);
                }
            }
        }
        kc_cp_async_commit();
    };
    wstate<HD> st;
    wstate_init(st);
#pragma unroll
    for (int i = 0; i < NST - 1; i++) issue(i_lo + i);
    for (int i = i_lo; i < n_kt; i++) {
        issue(i + NST - 1);
        kc_cp_async_wait<NST - 1>();
        __syncthreads();
        const int j0 = i * PF_NK;
        // a warp skips tiles past its rows' last keys, and (window) tiles before its rows' first
        if (live && j0 <= w_hi && (window <= 0 || j0 + PF_NK - 1 > w_lo - window)) {
            const uint32_t ks = sb + (i % NST) * STAGE * 2;
            if (j0 + PF_NK - 1 <= w_lo && (window <= 0 || j0 > w_hi - window)) // every row sees the whole tile
                attend<HD, PF_NK>(st, qa, ks, ks + PF_NK * ROWH * 2, lane, capl, [](int, int) { return true; });
            else
                attend<HD, PF_NK>(st, qa, ks, ks + PF_NK * ROWH * 2, lane, capl, [&](int hi, int key) {
                    return j0 + key <= (hi ? lim1 : lim0) && j0 + key > (hi ? wlo1 : wlo0);
                });
        }
        __syncthreads(); // the stage is refilled next
    }
    kc_cp_async_wait<0>();
    wstate_finish(st);
    if (n_split == 1) {
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const int r = hi ? r1 : r0, i = hi ? i1 : i0;
            if (i >= nq) continue;
            const float il = st.l[hi] > 0.0f ? 1.0f / st.l[hi] : 0.0f;
            float *o = out + ((size_t)(t0 + i) * n_head + h0 + r % G) * HD + 2 * t4;
#pragma unroll
            for (int d = 0; d < HD / 8; d++) *(float2 *)(o + d * 8) = make_float2(st.o[d][2 * hi] * il, st.o[d][2 * hi + 1] * il);
        }
        return;
    }
    // split: the rows' partials (natural-log maximum, sum, unnormalized output), then the last
    // split's CTA merges them (pf_merge)
    constexpr int R = 16 * NW;
    float *pp = partial + (size_t)(tile * n_kv + kvh) * R * n_split * (HD + 2);
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
        const int r = hi ? r1 : r0, i = hi ? i1 : i0;
        if (i >= nq) continue;
        float *ps = pp + ((size_t)r * n_split + split) * (HD + 2);
        if (t4 == 0) {
            ps[0] = st.m[hi] * LN2;
            ps[1] = st.l[hi];
        }
#pragma unroll
        for (int d = 0; d < HD / 8; d++) *(float2 *)(ps + 2 + d * 8 + 2 * t4) = make_float2(st.o[d][2 * hi], st.o[d][2 * hi + 1]);
    }
    const int n_valid = min(n_split, p_last / kchunk + 1);
    if (!att_last_split(counters + (size_t)tile * n_kv + kvh, n_valid)) return;
    pf_merge<HD, R, NW * 32>(pp, n_split, n_valid, min(R, nq * G), G, out + ((size_t)t0 * n_head + h0) * HD, n_head, (float *)smem,
                              att_cta());
}

constexpr int PF_NST = 2;

// The soft-cap in the kernels' log2 units (0: none).
float mods_capl() {
    const float c = kc_attention_mods_get().softcap;
    return c > 0.0f ? c * LOG2E : 0.0f;
}

template <int HD> size_t pf_smem() { return (size_t)PF_NST * 2 * PF_NK * (HD + 8) * 2; }

template <int HD, bool F8, bool KROWS, int MINB, int HW = 1>
int launch_dec1(const float *q, const void *k, const void *v, const att_emit &em, const int32_t *toks, int n_tok,
                const int32_t *pos, const int32_t *seq, const int32_t *bt, const int32_t *chunk, int max_blocks, int n_head,
                int n_kv, int bs, float qscale, int n_split, float *partial, int *counters, cudaStream_t s) {
    static unsigned char configured[64];
    const kc_pdl_scope pdl_cls(KC_PDL_ATT_DEC);
    const size_t smem = dec_smem_bytes(HD, F8);
    auto *kern = attn_dec_kernel<HD, DEC_NST, F8, KROWS, MINB, HW>;
    if (int rc = kc_smem_limit_once(kern, (int)smem, configured, __FILE__, __LINE__)) return rc;
    kc_launch(kern, dim3((n_kv + HW - 1) / HW, n_tok, n_split), dim3(DEC_WARPS * 32), smem, s, q, k, v, em,
              partial, counters, toks, pos, seq, bt, chunk, max_blocks, n_head, n_kv, bs, qscale, n_split, mods_capl(),
              kc_attention_mods_get().window);
    return 0;
}
template <int HD, bool F8>
int launch_dec(const float *q, const void *k, const void *v, const att_emit &em, const int32_t *toks, int n_tok,
               const int32_t *pos, const int32_t *seq, const int32_t *bt, const int32_t *chunk, int max_blocks, int n_head,
               int n_kv, int bs, float qscale, int n_split, float *partial, int *counters, cudaStream_t s) {
    const kc_plan *pl = kc_plan_get();
    const long pairs = (long)n_tok * n_kv;
    const bool whole = n_split == 1 && pl->att_dec_hpw > 0 && pairs >= pl->att_dec_hpw; // a warp a KV head
    // FP8 with at most 8 query heads to a KV head: the keys as the rows (attend_f8t), at 128
    // registers so that four CTAs share an SM (H200, 64-128 sequences of 1k: 1.05-1.17x the
    // same kernel at three; 256 sequences: 0.97x)
    if constexpr (F8)
        if (n_head / n_kv <= 8) {
            if (whole)
                return launch_dec1<HD, true, true, 4, 4>(q, k, v, em, toks, n_tok, pos, seq, bt, chunk, max_blocks, n_head, n_kv, bs,
                                                         qscale, n_split, partial, counters, s);
            if (n_split == 1 && pl->att_dec_pair > 0 && pairs >= pl->att_dec_pair) // two warps a KV head
                return launch_dec1<HD, true, true, 4, 2>(q, k, v, em, toks, n_tok, pos, seq, bt, chunk, max_blocks, n_head, n_kv, bs,
                                                         qscale, n_split, partial, counters, s);
            return launch_dec1<HD, true, true, 4>(q, k, v, em, toks, n_tok, pos, seq, bt, chunk, max_blocks, n_head, n_kv, bs, qscale,
                                                  n_split, partial, counters, s);
        }
    if constexpr (!F8)
        if (whole)
            return launch_dec1<HD, false, false, 1, 4>(q, k, v, em, toks, n_tok, pos, seq, bt, chunk, max_blocks, n_head, n_kv, bs,
                                                       qscale, n_split, partial, counters, s);
    // F8 rows: 3 CTAs an SM (left alone, ptxas takes 194 registers: two)
    return launch_dec1<HD, F8, false, F8 ? 3 : 1>(q, k, v, em, toks, n_tok, pos, seq, bt, chunk, max_blocks, n_head, n_kv, bs,
                                                  qscale, n_split, partial, counters, s);
}

template <int HD, int NW, bool F8>
int launch_pf(const float *q, const void *k, const void *v, float *out, const int32_t *tiles, int n_tiles,
              const int32_t *pos, const int32_t *seq, const int32_t *bt, int max_blocks, int n_head, int n_kv, int bs,
              float qscale, int n_split, int kchunk, float *partial, int *counters, cudaStream_t s) {
    static unsigned char configured[64];
    const size_t smem = pf_smem<HD>();
    // pf_merge's shared scratch: 2 R n_split + R floats in the stages' memory
    static_assert(2 * 16 * 8 * KC_PF_MAX_SPLIT + 16 * 8 <= PF_NST * 2 * PF_NK * (64 + 8) * 2 / 4, "prefill merge scratch");
    if (int rc = kc_smem_limit_once(attn_pf_kernel<HD, NW, PF_NST, F8>, (int)smem, configured, __FILE__, __LINE__)) return rc;
    kc_launch(attn_pf_kernel<HD, NW, PF_NST, F8>, dim3(n_tiles, n_kv, n_split), dim3(NW * 32), smem, s, q, k, v, out, tiles, pos,
              seq, bt, max_blocks, n_head, n_kv, bs, qscale, mods_capl(), kc_attention_mods_get().window, kchunk, partial, counters);
    return 0;
}

} // namespace

extern "C" int kc_attention_tc_ok(int hd, int n_head, int n_kv, int block_size) {
    if (!kc_code_sm80()) return 0; // mma.sync, ldmatrix and cp.async
    return (hd == 64 || hd == 128) && n_kv > 0 && n_head % n_kv == 0 && n_head / n_kv <= 16 && block_size % 16 == 0;
}

extern "C" int kc_attention_dec_per_sm(int hd) {
    if (hd != 64 && hd != 128) return 0;
    int n = 0, dev = 0, optin = 0;
    const size_t smem = dec_smem_bytes(hd, false);
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        (size_t)optin < smem) {
        cudaGetLastError();
        return 0;
    }
    cudaError_t e = hd == 64 ? cudaFuncSetAttribute(attn_dec_kernel<64, DEC_NST, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                             : cudaFuncSetAttribute(attn_dec_kernel<128, DEC_NST, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess)
        e = hd == 64 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_dec_kernel<64, DEC_NST, false>, DEC_WARPS * 32, smem)
                     : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_dec_kernel<128, DEC_NST, false>, DEC_WARPS * 32, smem);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int kc_attention_tc_tile_tok(int warps, int n_head, int n_kv) {
    if (n_kv <= 0 || n_head % n_kv || (warps != 4 && warps != 8)) return 0;
    return 16 * warps / (n_head / n_kv);
}

template <bool F8>
static int attention_decode_tc(const float *q, const void *k_cache, const void *v_cache, float *out, kc_xq *xq,
                               const int32_t *toks, int n_tok, const int32_t *pos, const int32_t *seq,
                               const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                               float scale, int n_split, const int32_t *chunk, float *partial, int *counters, cudaStream_t s) {
    if (!q || !k_cache || !v_cache || !pos || !seq || !block_tables || !chunk || n_tok <= 0 || n_tok > 65535 || n_split <= 0 ||
        (n_split > 1 && (!partial || !counters)) || !kc_attention_tc_ok(hd, n_head, n_kv, block_size))
        return CM_EINVAL;
    const int nq = n_head * hd;
    const bool quant = xq && n_tok <= xq->cap_tok && nq <= xq->cap_n && (!xq->no_ints || xq->xh);
    if (!out && !quant) return CM_EINVAL; /* nothing would be written */
    if (xq) xq->n = quant ? nq : 0;
    att_emit em = { out, quant && !xq->no_ints ? xq->qh : nullptr, quant ? xq->ql : nullptr, quant ? xq->m : nullptr,
                    quant ? (__half *)xq->xh : nullptr };
    const float qs = scale * LOG2E;
    int rc = hd == 64 ? launch_dec<64, F8>(q, k_cache, v_cache, em, toks, n_tok, pos, seq, block_tables, chunk, max_blocks, n_head,
                                       n_kv, block_size, qs, n_split, partial, counters, s)
                      : launch_dec<128, F8>(q, k_cache, v_cache, em, toks, n_tok, pos, seq, block_tables, chunk, max_blocks, n_head,
                                        n_kv, block_size, qs, n_split, partial, counters, s);
    if (rc) return rc;
    KC_LAUNCH_CHECK();
}

template <bool F8>
static int attention_prefill_tc(const float *q, const void *k_cache, const void *v_cache, float *out, const int32_t *tiles,
                                int n_tiles, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                                int max_blocks, int n_head, int n_kv, int hd, int block_size, float scale, int warps,
                                int n_split, int kchunk, float *partial, int *counters, cudaStream_t s) {
    if (!q || !k_cache || !v_cache || !out || !tiles || !pos || !seq || !block_tables || n_tiles <= 0 ||
        !kc_attention_tc_ok(hd, n_head, n_kv, block_size) || (warps != 4 && warps != 8) || n_split < 1 ||
        n_split > KC_PF_MAX_SPLIT || (n_split > 1 && (!partial || !counters || kchunk <= 0 || kchunk % PF_NK)))
        return CM_EINVAL;
    const float qs = scale * LOG2E;
    int rc;
    if (hd == 64)
        rc = warps == 4 ? launch_pf<64, 4, F8>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                                           n_kv, block_size, qs, n_split, kchunk, partial, counters, s)
                        : launch_pf<64, 8, F8>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                                           n_kv, block_size, qs, n_split, kchunk, partial, counters, s);
    else
        rc = warps == 4 ? launch_pf<128, 4, F8>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks,
                                            n_head, n_kv, block_size, qs, n_split, kchunk, partial, counters, s)
                        : launch_pf<128, 8, F8>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks,
                                            n_head, n_kv, block_size, qs, n_split, kchunk, partial, counters, s);
    if (rc) return rc;
    KC_LAUNCH_CHECK();
}

extern "C" int kc_attention_decode_tc(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out, kc_xq *xq,
                                      const int32_t *toks, int n_tok, const int32_t *pos, const int32_t *seq,
                                      const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd,
                                      int block_size, float scale, int n_split, const int32_t *chunk, float *partial,
                                      int *counters, cudaStream_t s) {
    return attention_decode_tc<false>(q, k_cache, v_cache, out, xq, toks, n_tok, pos, seq, block_tables, max_blocks, n_head,
                                      n_kv, hd, block_size, scale, n_split, chunk, partial, counters, s);
}

extern "C" int kc_attention_decode_tc_f8(const float *q, const void *k_cache, const void *v_cache, float *out, kc_xq *xq,
                                         const int32_t *toks, int n_tok, const int32_t *pos, const int32_t *seq,
                                         const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd,
                                         int block_size, float scale, int n_split, const int32_t *chunk, float *partial,
                                         int *counters, cudaStream_t s) {
    return attention_decode_tc<true>(q, k_cache, v_cache, out, xq, toks, n_tok, pos, seq, block_tables, max_blocks, n_head,
                                     n_kv, hd, block_size, scale, n_split, chunk, partial, counters, s);
}

extern "C" int kc_attention_prefill_tc(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out,
                                       const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                       const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd,
                                       int block_size, float scale, int warps, cudaStream_t s) {
    return attention_prefill_tc<false>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                                       n_kv, hd, block_size, scale, warps, 1, 0, nullptr, nullptr, s);
}

extern "C" int kc_attention_prefill_tc_f8(const float *q, const void *k_cache, const void *v_cache, float *out,
                                          const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                          const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd,
                                          int block_size, float scale, int warps, cudaStream_t s) {
    return attention_prefill_tc<true>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                                      n_kv, hd, block_size, scale, warps, 1, 0, nullptr, nullptr, s);
}

extern "C" int kc_attention_prefill_tc_split(const float *q, const void *k_cache, const void *v_cache, float *out,
                                             const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                             const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd,
                                             int block_size, float scale, int warps, int f8, int n_split, int kchunk,
                                             float *partial, int *counters, cudaStream_t s) {
    return f8 ? attention_prefill_tc<true>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                                           n_kv, hd, block_size, scale, warps, n_split, kchunk, partial, counters, s)
              : attention_prefill_tc<false>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head,
                                            n_kv, hd, block_size, scale, warps, n_split, kchunk, partial, counters, s);
}
