/* The quantized kc_weight layouts (kernels/cuda/kcuda.h) on the host: every type's rows repacked
 * by kc_weight_repack and read back as the layout's description says (the way the kernels read
 * them) give exactly the CPU reference dequantization (dt_dequantize) of the GGUF blocks; the
 * regions take the file's bytes (Q5_0 and Q6_K rows padded by a few); fused matrices of mixed
 * types lay out their row ranges (kc_weight_layout, kc_weight_row_at). Host code only: runs
 * without a GPU (it links the CUDA runtime, which loads without one), and on the GPU host with
 * the other tests/gpu programs.
 * usage: test_gpu_layout */
#include "common/cm_err.h"
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"
#include "tests/unit/t.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return dt_f16_to_f32(h);
}
static uint32_t u32at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
/* the fifth bit of element e (0..31) of a block from its high-bit word: bit 8 (e % 4) + e / 4 */
static int hbit(uint32_t w, int e) { return (int)(w >> (8 * (e & 3) + (e >> 2))) & 1; }

/* ggml's get_scale_min_k4 on the 12 scale bytes */
static void scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Element e of row r as kcuda.h describes the layout (data, d: the regions; dr, sr: bytes per
 * row of each), with the float operations of the CPU reference. */
static float layout_elem(int type, const uint8_t *data, const uint8_t *d, size_t dr, size_t sr, int n_in, int r, int e) {
    const uint8_t *row = data + (size_t)r * dr, *srow = d + (size_t)r * sr;
    const int b = e / 32, e32 = e % 32, nb = n_in / 32, nsb = n_in / 256, sb = e / 256, es = e % 256;
    const int nib = (row[b * 16 + (e32 & 15)] >> (e32 >= 16 ? 4 : 0)) & 15; /* the 32-element types */
    switch (type) {
    case DT_Q8_0: return (int8_t)row[e] * h2f(srow + 2 * b);
    case DT_Q4_0: return (nib - 8) * h2f(srow + 2 * b);
    case DT_Q4_1: return nib * h2f(srow + 4 * b) + h2f(srow + 4 * b + 2);
    case DT_Q5_0: return ((nib | hbit(u32at(srow + 4 * b), e32) << 4) - 16) * h2f(srow + 4 * (size_t)nb + 2 * b);
    case DT_Q5_1: return (nib | hbit(u32at(srow + 8 * b + 4), e32) << 4) * h2f(srow + 8 * b) + h2f(srow + 8 * b + 2);
    case DT_Q4_K: case DT_Q5_K: {
        const size_t hs = type == DT_Q4_K ? 16 : 48;
        const uint8_t *h = srow + sb * hs;
        const int j = es / 64, l = es % 64, is = 2 * j + (l >= 32);
        int q = (row[sb * 128 + 32 * j + (l & 31)] >> (l >= 32 ? 4 : 0)) & 15, sc, m;
        if (type == DT_Q5_K) q |= hbit(u32at(h + 16 + 4 * is), l & 31) << 4;
        scale_min(h + 4, is, &sc, &m);
        const float d1 = h2f(h) * sc, m1 = h2f(h + 2) * m;
        return d1 * q - m1;
    }
    case DT_Q6_K: {
        const uint8_t *base = row + (size_t)sb * 192 + 48 * (es / 64);
        const int ep = es % 64, p = ep >= 32, l = ep & 31, k = l >> 2;
        const int lo = (base[l] >> (4 * p)) & 15, hi = (base[32 + 4 * (2 * (k >> 2) + p) + (l & 3)] >> (2 * (k & 3))) & 3;
        const int8_t q = (int8_t)((lo | hi << 4) - 32), sc = (int8_t)srow[16 * sb + es / 16];
        return h2f(srow + 16 * (size_t)nsb + 2 * sb) * sc * q;
    }
    }
    return 0;
}

static void test_repack(void) {
    const int types[] = { DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K };
    const int widths[] = { 96, 256, 768, 2816, 11008 }; /* 2816, 11008: odd super-block counts */
    const int rows = 5;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
            const int t = types[ti], n_in = widths[wi];
            if (n_in % dt_block_size(t)) {
                size_t a, b;
                T_CHECKF(kc_weight_sizes(t, n_in, rows, &a, &b) == CM_EINVAL, "%s n_in=%d refused", dt_name(t), n_in);
                continue;
            }
            const size_t n = (size_t)n_in * rows;
            float *x = malloc(n * 4), *ref = malloc(n * 4);
            for (size_t i = 0; i < n; i++) x[i] = frand() * (i % 61 == 0 ? 3.0f : 0.5f);
            for (int i = 0; i < 64; i++) x[i] = 0; /* a zero block */
            void *blocks = malloc(dt_row_size(t, n_in) * rows);
            T_EQ_INT(dt_quantize(t, x, blocks, (int64_t)n), 0);
            T_EQ_INT(dt_dequantize(t, blocks, ref, (int64_t)n), 0);
            size_t db, sb;
            T_EQ_INT(kc_weight_sizes(t, n_in, rows, &db, &sb), 0);
            const size_t file = dt_row_size(t, n_in) * rows, pad = t == DT_Q5_0 ? 2 : t == DT_Q6_K ? 14 : 0;
            T_CHECKF(db + sb >= file && db + sb <= file + pad * rows, "%s n_in=%d: %zu device bytes for %zu in the file", dt_name(t),
                     n_in, db + sb, file);
            uint8_t *q = malloc(db), *d = malloc(sb);
            memset(q, 0xA5, db);
            memset(d, 0xA5, sb);
            T_EQ_INT(kc_weight_repack(t, blocks, n_in, rows, q, (kc_half *)d), 0);
            int bad = -1;
            for (int r = 0; r < rows && bad < 0; r++)
                for (int e = 0; e < n_in; e++) {
                    const float v = layout_elem(t, q, d, db / rows, sb / rows, n_in, r, e), w = ref[(size_t)r * n_in + e];
                    if (memcmp(&v, &w, 4)) {
                        bad = r * n_in + e;
                        break;
                    }
                }
            T_CHECKF(bad < 0, "%s n_in=%d: element %d read from the layout differs from the reference", dt_name(t), n_in, bad);
            free(q); free(d); free(blocks); free(x); free(ref);
        }
}

static void test_layout(void) {
    kc_weight w;
    size_t db, sb, od, os;
    /* Q|K|V of a Q4_K_M layer: wq and wk merge into one range */
    const int t1[] = { DT_Q4_K, DT_Q4_K, DT_Q6_K }, r1[] = { 4096, 1024, 1024 };
    T_EQ_INT(kc_weight_layout(t1, r1, 3, 4096, &w, &db, &sb), 0);
    T_CHECK(w.type == KC_WEIGHT_MIXED && w.n_parts == 2 && w.n_in == 4096 && w.n_out == 6144 && kc_weight_is_quant(w.type));
    T_CHECK(w.part[0].type == DT_Q4_K && w.part[0].row0 == 0 && w.part[0].n_rows == 5120 && w.part[0].data_off == 0 &&
            w.part[0].d_off == 0);
    T_CHECK(w.part[1].type == DT_Q6_K && w.part[1].row0 == 5120 && w.part[1].n_rows == 1024 && w.part[1].data_off % 256 == 0 &&
            w.part[1].d_off % 256 == 0 && w.part[1].data_off >= (size_t)5120 * 2048 && w.part[1].d_off >= (size_t)5120 * 256);
    const size_t file = dt_row_size(DT_Q4_K, 4096) * 5120 + dt_row_size(DT_Q6_K, 4096) * 1024;
    T_CHECKF(db + sb >= file && db + sb <= file + 2 * 255, "mixed Q|K|V: %zu device bytes for %zu in the file", db + sb, file);
    kc_weight_row_at(&w, 5120 + 60, &od, &os);
    T_CHECK(od == w.part[1].data_off + (size_t)60 * 16 * 192 && os == w.part[1].d_off + (size_t)60 * (16 * 16 + 32));
    kc_weight_row_at(&w, 4096, &od, &os);
    T_CHECK(od == (size_t)4096 * 2048 && os == (size_t)4096 * 256);
    kc_weight v = kc_weight_part_view(&w, 1);
    T_CHECK(v.type == DT_Q6_K && v.n_in == 4096 && v.n_out == 1024 && v.n_parts == 0);
    /* one type: an ordinary weight of it */
    const int t2[] = { DT_Q8_0, DT_Q8_0 }, r2[] = { 32, 32 };
    T_CHECK(kc_weight_layout(t2, r2, 2, 256, &w, &db, &sb) == 0 && w.type == DT_Q8_0 && w.n_parts == 0 && w.n_out == 64 &&
            db == 64 * 256 && sb == 64 * 16);
    kc_weight_row_at(&w, 33, &od, &os);
    T_CHECK(od == 33 * 256 && os == 33 * 16);
    /* types that differ must all be quantized; rows whole blocks; at most KC_WEIGHT_MAX_PARTS ranges */
    const int t3[] = { DT_F16, DT_Q8_0 }, t4[] = { DT_Q4_K, DT_Q8_0 };
    T_EQ_INT(kc_weight_layout(t3, r2, 2, 256, &w, &db, &sb), CM_EUNSUPPORTED);
    T_EQ_INT(kc_weight_layout(t4, r2, 2, 96, &w, &db, &sb), CM_EINVAL);
    const int t5[] = { DT_Q8_0, DT_Q4_0, DT_Q8_0, DT_Q4_0, DT_Q8_0 }, r5[] = { 1, 1, 1, 1, 1 };
    T_EQ_INT(kc_weight_layout(t5, r5, 5, 256, &w, &db, &sb), CM_EUNSUPPORTED);
    T_EQ_INT(kc_weight_layout(t5, r5, 4, 256, &w, &db, &sb), 0);
    T_CHECK(w.n_parts == 4 && w.part[3].row0 == 3);
    /* the types the kernels read, and the plan's order of them */
    const int q[] = { DT_Q8_0, DT_Q4_0, DT_Q4_K, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q5_K, DT_Q6_K };
    for (int i = 0; i < KC_N_QTYPES; i++) T_CHECK(kc_qtype_index(q[i]) == i && kc_weight_is_quant(q[i]) && kc_weight_type_ok(q[i]));
    T_CHECK(kc_qtype_index(DT_F16) < 0 && !kc_weight_is_quant(DT_F16) && kc_weight_type_ok(DT_BF16) && !kc_weight_type_ok(DT_Q8_K));
}

/* every quantized type's gemmq_max_tok key is taken and printed */
static void test_plan_keys(void) {
    kc_plan p;
    kc_plan_default(&p);
    char err[256], line[2048];
    T_EQ_INT(kc_plan_override(&p, "gemmq_max_tok_q4_1=11,gemmq_max_tok_q5_0=12,gemmq_max_tok_q5_1=13,gemmq_max_tok_q5_k=14,"
                                  "gemmq_max_tok_q6_k=15", err, sizeof err), 0);
    T_CHECK(p.gemmq_max_tok[kc_qtype_index(DT_Q4_1)] == 11 && p.gemmq_max_tok[kc_qtype_index(DT_Q5_0)] == 12 &&
            p.gemmq_max_tok[kc_qtype_index(DT_Q5_1)] == 13 && p.gemmq_max_tok[kc_qtype_index(DT_Q5_K)] == 14 &&
            p.gemmq_max_tok[kc_qtype_index(DT_Q6_K)] == 15);
    kc_plan_format(&p, line, sizeof line);
    T_CHECK(strstr(line, "gemmq_max_tok_q6_k=15") && strstr(line, "gemmq_max_tok_q4_k="));
    /* a decode split is whole 64-position groups */
    T_EQ_INT(kc_plan_override(&p, "att_dec_min_chunk=1024", err, sizeof err), 0);
    T_CHECK(p.att_dec_min_chunk == 1024);
    T_EQ_INT(kc_plan_override(&p, "att_dec_min_chunk=1000", err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, "multiple of 64") != NULL);
    /* a refused override changes nothing, also the keys before the bad one */
    T_CHECK(p.att_dec_min_chunk == 1024);
    T_EQ_INT(kc_plan_override(&p, "att_pf_warps=4,att_pf_split_warps=5", err, sizeof err), CM_EINVAL);
    T_CHECK(p.att_pf_warps == 8 && p.att_pf_split_warps == 4);
    /* the split chunks' CTAs: 4 (the default) or 8 warps, nothing else */
    T_CHECK(p.att_pf_split_warps == 4);
    T_EQ_INT(kc_plan_override(&p, "att_pf_split_warps=8", err, sizeof err), 0);
    T_CHECK(p.att_pf_split_warps == 8);
    T_EQ_INT(kc_plan_override(&p, "att_pf_split_warps=6", err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, "att_pf_split_warps must be 4 or 8") != NULL);
    p.att_pf_split_warps = 4;
}

/* the tensor-core decode's splits: two waves a launch; a step's splits of min_chunk positions,
 * but at least one wave and at most the launch's */
static void test_dec_splits(void) {
    kc_plan p;
    kc_plan_default(&p);
    p.att_dec_ctas = 264;
    p.att_dec_min_chunk = 1024;
    T_EQ_INT(kc_plan_dec_splits(&p, 8, 1, 131072), 66);
    T_EQ_INT(kc_plan_dec_splits(&p, 8, 16, 131072), 4);
    T_EQ_INT(kc_plan_dec_splits(&p, 8, 64, 131072), 1);
    T_EQ_INT(kc_plan_dec_splits(&p, 8, 256, 131072), 1);
    T_EQ_INT(kc_plan_dec_splits(&p, 8, 1, 1000), 16); /* one per 64 positions of the context */
    T_EQ_INT(kc_plan_dec_chunk(&p, 8, 1, 66, 32767), 1024);   /* 32 splits of 1,024 */
    T_EQ_INT(kc_plan_dec_chunk(&p, 8, 1, 66, 8191), 256);     /* a wave: 33 splits, 32 used */
    T_EQ_INT(kc_plan_dec_chunk(&p, 8, 1, 66, 131071), 2048);  /* all 66: 64 used */
    T_EQ_INT(kc_plan_dec_chunk(&p, 8, 1, 66, 0), 64);
    T_EQ_INT(kc_plan_dec_chunk(&p, 8, 16, 4, 8191), 2048);    /* 4 splits: one wave is 2 */
    T_EQ_INT(kc_plan_dec_chunk(&p, 8, 64, 1, 8191), 8192);
    int kchunk = 0; /* prefill tiles: split where tiles x KV heads are at most half a wave */
    T_EQ_INT(kc_plan_pf_splits(&p, 8, 1, 131071, &kchunk), KC_PF_MAX_SPLIT);
    T_EQ_INT(kchunk, 4096);
    T_EQ_INT(kc_plan_pf_splits(&p, 8, 1, 8191, &kchunk), 8);
    T_EQ_INT(kchunk, 1024);
    T_EQ_INT(kc_plan_pf_splits(&p, 8, 16, 32767, &kchunk), 4);
    T_EQ_INT(kchunk, 8192);
    T_EQ_INT(kc_plan_pf_splits(&p, 8, 64, 32767, &kchunk), 1);
    T_EQ_INT(kc_plan_pf_splits(&p, 8, 32, 32767, &kchunk), 1); /* 256 CTAs: near a wave already */
    T_EQ_INT(kc_plan_pf_splits(&p, 8, 1, 500, &kchunk), 1);
    for (int pos = 0; pos < 140000; pos += 997)
        for (int nt = 1; nt <= 40; nt += 3) {
            const int ns = kc_plan_pf_splits(&p, 8, nt, pos, &kchunk);
            T_CHECK(ns >= 1 && ns <= KC_PF_MAX_SPLIT && (ns == 1 || (kchunk % 64 == 0 && (ns - 1) * kchunk <= pos && ns * kchunk > pos)));
        }
    /* ... on the wgmma kernel: one wave of att_pf_fa3_ctas CTAs, splits of whole 128-position tiles */
    p.att_pf_fa3_ctas = 0;
    T_EQ_INT(kc_plan_pf_splits_fa3(&p, 8, 1, 131071, &kchunk), 1); /* off */
    p.att_pf_fa3_ctas = 132;
    T_EQ_INT(kc_plan_pf_splits_fa3(&p, 8, 1, 131071, &kchunk), 16);
    T_EQ_INT(kchunk, 8192);
    T_EQ_INT(kc_plan_pf_splits_fa3(&p, 8, 1, 119999, &kchunk), 16); /* 938 tiles: 59 a split, the last 53 */
    T_EQ_INT(kchunk, 59 * 128);
    T_EQ_INT(kc_plan_pf_splits_fa3(&p, 8, 2, 2047, &kchunk), 2); /* at least att_dec_min_chunk a split */
    T_EQ_INT(kchunk, 1024);
    T_EQ_INT(kc_plan_pf_splits_fa3(&p, 8, 8, 32767, &kchunk), 2);
    T_EQ_INT(kc_plan_pf_splits_fa3(&p, 8, 9, 32767, &kchunk), 1); /* 72 CTAs: more than half a wave */
    T_EQ_INT(kc_plan_pf_splits_fa3(&p, 8, 1, 1000, &kchunk), 1);
    for (int pos = 0; pos < 140000; pos += 997)
        for (int nt = 1; nt <= 10; nt++) {
            const int ns = kc_plan_pf_splits_fa3(&p, 8, nt, pos, &kchunk);
            T_CHECK(ns >= 1 && ns <= KC_PF_MAX_SPLIT && ns * nt * 8 <= 132 &&
                    (ns == 1 || (kchunk % 128 == 0 && kchunk >= 1024 && (ns - 1) * kchunk <= pos && ns * kchunk > pos)));
        }
    p.att_pf_fa3_ctas = 0;
    for (int pos = 0; pos < 140000; pos += 997) /* the splits used cover the context within the launch's */
        for (int b = 1; b <= 64; b *= 2) {
            const int ns = kc_plan_dec_splits(&p, 8, b, 140000), ch = kc_plan_dec_chunk(&p, 8, b, ns, pos);
            T_CHECK(ch % 64 == 0 && ch >= 64 && (pos + ch) / ch <= ns);
        }
}

/* the plan puts prefill tiles on the wgmma kernel exactly where it runs: compute
 * capability 9.0, head dim 64 / 128, blocks a power of two of at least 16 */
static void test_plan_prefill(void) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
        return;
    kc_plan p;
    const int cc90 = major == 9 && minor == 0;
    T_EQ_INT(kc_plan_choose(0, 128, 32, 8, 16, 0, &p), 0);
    T_CHECKF(p.att_pf_fa3 == (cc90 ? 1 : 0), "att_pf_fa3 %d on compute capability %d.%d", p.att_pf_fa3, major, minor);
    int sms = 0;
    T_EQ_INT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    T_CHECKF(p.att_pf_fa3_ctas == (cc90 ? sms : 0), "att_pf_fa3_ctas %d (%d SMs)", p.att_pf_fa3_ctas, sms);
    T_EQ_INT(kc_plan_choose(0, 64, 16, 16, 32, 0, &p), 0);
    T_EQ_INT(p.att_pf_fa3, cc90 ? 1 : 0);
    T_EQ_INT(kc_plan_choose(0, 128, 32, 8, 8, 0, &p), 0); /* blocks of 8: mma.sync */
    T_EQ_INT(p.att_pf_fa3, 0);
    T_EQ_INT(p.att_pf_fa3_ctas, 0);
    T_EQ_INT(kc_plan_choose(0, 128, 32, 8, 48, 0, &p), 0); /* not a power of two */
    T_EQ_INT(p.att_pf_fa3, 0);
    T_EQ_INT(kc_plan_choose(0, 96, 32, 8, 16, 0, &p), 0); /* head dim 96 */
    T_EQ_INT(p.att_pf_fa3, 0);
    /* per-head decode splits from each token's position: MoE models only */
    T_EQ_INT(p.att_ph_splits, 0);
    T_EQ_INT(kc_plan_choose(0, 128, 32, 4, 16, 128, &p), 0);
    T_EQ_INT(p.att_ph_splits, 16);
}

int main(void) {
    test_repack();
    test_plan_prefill();
    test_layout();
    test_plan_keys();
    test_dec_splits();
    return t_done();
}
