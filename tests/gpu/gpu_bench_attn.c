/* gpu_bench_attn: the attention kernels alone at llama3-8b's shape (32 query heads, 8 KV heads,
 * head dim 128, KV blocks of 16): decode over B sequences of C positions (bytes of K and V read
 * against the copy bandwidth measured in the same run; the tensor-core kernel with the backend's
 * split rule, and the per-head kernel with 64-position splits) and causal prefill of one
 * sequence (TFLOP/s of the 4 n_head hd T^2 / 2 multiply-adds: mma.sync with 4 and 8 warps, and the
 * wgmma kernel of attention_fa3.cu on compute capability 9.0).
 * usage: gpu_bench_attn [mha] [decode|short|decode8|decode8x|prefill|splits|chunk]... (default: decode and prefill;
 * mha: 32 KV heads instead of 8; short: decode at 128-1,024 positions and 16-256 sequences;
 * decode8: the FP8 cache against the F16 one, decode8x: only 256 x 1,024, for a profiler; splits sweeps
 * the decode kernel's split count at 1-32 sequences of 8k-128k positions; chunk: a chunk of a
 * long prompt on the prefill kernel, whole and split over the keys). Variants of the prefill and
 * chunk benches: rand (random K, V and queries instead of constants, so that the running maxima
 * move as they do on real data), rev (the tiles longest first), shuffle (the KV blocks scattered
 * over a pool), hot (each launch after a 3 ms cuBLAS GEMM, as in a forward pass). The wgmma kernel
 * is timed with its f32 output and its half output. An argument key=value[,...] sets kernel-plan
 * fields (kcuda.h kc_plan) for A/B arms. */
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_ck.h"
#include "gpu_plan.h"

enum { NH = 32, HD = 128, BS = 16 };
static int g_nkv = 8; /* KV heads: llama3-8b's 8; "mha" makes it 32 (llama2-7b) */

static int g_rand; /* "rand": random K, V and queries for the prefill benches */
/* prefill bench variants: "rev": the tile list longest first; "shuffle": the sequence's KV blocks
 * in a shuffled order of a pool twice its size; "hot": a cuBLAS GEMM of gate|up's shape at
 * 8,192 tokens before each timed launch, timed apart (the clocks of a forward pass) */
static int g_rev, g_shuffle, g_hot;

/* n values, half (esz 2) or float (esz 4), roughly normal with standard deviation sd, fixed seed */
static void fill_random(void *dev, size_t n, int esz, float sd, uint32_t seed) {
    void *h = malloc(n * esz);
    if (!h) { fprintf(stderr, "out of host memory\n"); exit(1); }
    uint32_t r = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        float u = 0;
        for (int j = 0; j < 4; j++) { /* Irwin-Hall of 4: mean 2, variance 1/3 */
            r = r * 1664525u + 1013904223u;
            u += (float)(r >> 8) * (1.0f / 16777216.0f);
        }
        const float g = (u - 2.0f) * 1.7320508f * sd;
        if (esz == 4) ((float *)h)[i] = g;
        else ((kc_half *)h)[i] = dt_f32_to_f16(g);
    }
    CK(cudaMemcpy(dev, h, n * esz, cudaMemcpyHostToDevice));
    free(h);
}

/* Copy bandwidth: a 4 GiB device-to-device copy, bytes read + written, best of 5. */
static double copy_gbs(void) {
    size_t n = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i && ms < best) best = ms;
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * n / (best * 1e-3) / 1e9;
}

static float time_ms(cudaEvent_t e0, cudaEvent_t e1) {
    float ms;
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
}

/* One decode shape: B sequences of C positions on the tensor-core kernel with ns splits of the
 * fewest 64-position units that cover C (0: the backend's rule, kc_plan_dec_splits and
 * kc_plan_dec_chunk of the installed plan), and unless tc_only the per-head kernel with
 * 64-position splits. f8: an FP8 cache (codes and a scale per position and head) on the
 * tensor-core kernel only. */
static void decode_one(double bw, int B, int C, int ns, int tc_only, int f8) {
    const int mb = C / BS, nblk = B * mb;
    /* elements (F16) or bytes (FP8: HD codes + a 4-byte scale per row) */
    const size_t ce = (size_t)(nblk + 1) * g_nkv * BS * (f8 ? HD + 4 : HD), esz = f8 ? 1 : 2;
    if (f8) tc_only = 1;
    void *k, *v;
    float *q, *out, *part;
    int32_t *pos, *seq, *bt, *chunk, *cnt;
    CK(cudaMalloc((void **)&k, ce * esz));
    CK(cudaMalloc((void **)&v, ce * esz));
    CK(cudaMemset(k, 0x3a, ce * esz)); /* E4M3 0x3a = 1.25, 0x39 = 1.125; scales ~7e-4 */
    CK(cudaMemset(v, 0x39, ce * esz));
    CK(cudaMalloc((void **)&q, (size_t)B * NH * HD * 4));
    CK(cudaMemset(q, 0x3c, (size_t)B * NH * HD * 4));
    CK(cudaMalloc((void **)&out, (size_t)B * NH * HD * 4));
    int32_t *hp = malloc((size_t)B * 4), *hs = malloc((size_t)B * 4), *hb = malloc((size_t)nblk * 4);
    for (int i = 0; i < B; i++) { hp[i] = C - 1; hs[i] = i; }
    /* blocks of a sequence scattered: block j of sequence i is physical j * B + i */
    for (int i = 0; i < B; i++)
        for (int j = 0; j < mb; j++) hb[i * mb + j] = j * B + i;
    CK(cudaMalloc((void **)&pos, (size_t)B * 4));
    CK(cudaMalloc((void **)&seq, (size_t)B * 4));
    CK(cudaMalloc((void **)&bt, (size_t)nblk * 4));
    CK(cudaMemcpy(pos, hp, (size_t)B * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(seq, hs, (size_t)B * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bt, hb, (size_t)nblk * 4, cudaMemcpyHostToDevice));
    const int units = C / 64;
    int ch;
    if (ns <= 0) {
        ns = kc_plan_dec_splits(kc_plan_get(), g_nkv, B, C);
        ch = kc_plan_dec_chunk(kc_plan_get(), g_nkv, B, ns, C - 1);
    } else {
        if (ns > units) ns = units;
        ch = (units + ns - 1) / ns * 64;
    }
    const int ph_split = C / 64, used = (C + ch - 1) / ch;
    size_t part_n = (size_t)B * NH * (ph_split > ns ? ph_split : ns) * (HD + 2);
    CK(cudaMalloc((void **)&part, part_n * 4));
    CK(cudaMalloc((void **)&chunk, 4));
    CK(cudaMemcpy(chunk, &ch, 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&cnt, (size_t)B * NH * 4));
    CK(cudaMemset(cnt, 0, (size_t)B * NH * 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const double bytes = 2.0 * B * C * g_nkv * (f8 ? HD + 4 : HD * 2);
    for (int arm = 0; arm < (tc_only ? 1 : 2); arm++) {
        const int iters = 20;
        for (int i = 0; i < iters + 3; i++) {
            if (i == 3) CK(cudaEventRecord(e0, 0));
            int rc = arm == 1   ? kc_attention_ex(q, k, v, out, NULL, pos, seq, bt, mb, B, NH, g_nkv, HD, BS, 0.088f, ph_split, 64,
                                                  0, part, cnt, 0, 0)
                     : f8 ? kc_attention_decode_tc_f8(q, k, v, out, NULL, NULL, B, pos, seq, bt, mb, NH, g_nkv, HD, BS, 0.088f, ns,
                                                       chunk, part, cnt, 0)
                          : kc_attention_decode_tc(q, k, v, out, NULL, NULL, B, pos, seq, bt, mb, NH, g_nkv, HD, BS, 0.088f, ns,
                                                   chunk, part, cnt, 0);
            if (rc) { fprintf(stderr, "launch failed (%d)\n", rc); exit(1); }
        }
        CK(cudaEventRecord(e1, 0));
        double ms = time_ms(e0, e1) / iters;
        printf("  %-9s B=%-4d C=%-6d splits=%-4d ctas=%-5d %8.1f MB %9.4f ms %7.0f GB/s %5.1f %%\n", arm ? "per-head" : f8 ? "tc-fp8" : "tc", B, C,
               arm ? ph_split : used, arm ? B * g_nkv * ph_split : B * g_nkv * used, bytes / 1e6, ms, bytes / ms / 1e6,
               100 * bytes / ms / 1e6 / bw);
    }
    cudaFree(k); cudaFree(v); cudaFree(q); cudaFree(out); cudaFree(part); cudaFree(pos); cudaFree(seq); cudaFree(bt);
    cudaFree(chunk); cudaFree(cnt);
    free(hp); free(hs); free(hb);
}

static void bench_decode(double bw) {
    const int Bs[] = { 1, 2, 4, 8, 16, 64, 128, 256 }, Cs[] = { 1024, 8192, 32768, 131072 };
    printf("decode: B x C positions, KV bytes read per call, time, GB/s and fraction of %.0f GB/s copy bandwidth\n", bw);
    for (int ci = 0; ci < 4; ci++)
        for (int bi = 0; bi < 8; bi++)
            if ((size_t)Bs[bi] * Cs[ci] <= ((size_t)2 << 20)) decode_one(bw, Bs[bi], Cs[ci], 0, Cs[ci] > 32768, 0);
}

/* Decode at the short contexts of batched serving benchmarks (128-1,024 positions, 16-256
 * sequences) on the tensor-core kernel with the plan's splits: the per-CTA start and end weigh
 * more there than at long contexts. With "mha": 32 KV heads (llama2-7b). */
static void bench_decode_short(double bw) {
    const int Bs[] = { 16, 32, 64, 128, 256 }, Cs[] = { 128, 192, 256, 512, 1024 };
    printf("decode, short contexts, %d query heads / %d KV heads: B x C positions\n", NH, g_nkv);
    for (int ci = 0; ci < 5; ci++)
        for (int bi = 0; bi < 5; bi++) decode_one(bw, Bs[bi], Cs[ci], 0, 1, 0);
}

/* The FP8 cache against the F16 one on the tensor-core decode kernel (the plan's splits). */
static void bench_decode_f8(double bw, int one) {
    const int BC[][2] = { { 1, 8192 }, { 1, 32768 }, { 8, 32768 }, { 64, 1024 }, { 128, 1024 }, { 256, 1024 }, { 64, 8192 },
                          { 256, 4096 } };
    printf("decode, FP8 cache vs F16: B x C positions, bytes read per call (FP8: codes + scales)\n");
    for (size_t i = one ? 5 : 0; i < (one ? 6 : sizeof BC / sizeof BC[0]); i++) {
        decode_one(bw, BC[i][0], BC[i][1], 0, 1, 0);
        decode_one(bw, BC[i][0], BC[i][1], 0, 1, 1);
    }
}

/* The split count of the tensor-core decode kernel swept at few sequences and long contexts:
 * tokens x KV heads x splits = m x SMs for m in 1..8, and the per-sequence split counts between. */
static void bench_splits(double bw, int sms) {
    const int Bs[] = { 1, 2, 4, 8, 16, 32 }, Cs[] = { 8192, 32768, 131072 }, Ms[] = { 1, 2, 3, 4, 6, 8 };
    printf("decode splits: B x C positions, splits so that B x %d KV heads x splits reaches m x %d SMs\n", g_nkv, sms);
    for (int ci = 0; ci < 3; ci++)
        for (int bi = 0; bi < 6; bi++) {
            const int B = Bs[bi], C = Cs[ci];
            if ((size_t)B * C > ((size_t)2 << 20)) continue;
            int last = 0;
            for (int mi = 0; mi < 6; mi++) {
                const int ns = (Ms[mi] * sms + B * g_nkv - 1) / (B * g_nkv);
                if (ns == last) continue;
                last = ns;
                decode_one(bw, B, C, ns, 1, 0);
            }
        }
}

/* gate|up's GEMM at 8,192 tokens (about 3 ms of tensor cores: the clocks of a forward pass) */
static void hot_gemm(void) {
    static cublasHandle_t h;
    static void *w, *x, *y;
    if (!h) {
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); exit(1); }
        CK(cudaMalloc(&w, (size_t)28672 * 4096 * 2));
        CK(cudaMalloc(&x, (size_t)8192 * 4096 * 2));
        CK(cudaMalloc(&y, (size_t)8192 * 28672 * 4));
        fill_random(w, (size_t)28672 * 4096, 2, 0.05f, 7);
        fill_random(x, (size_t)8192 * 4096, 2, 0.05f, 8);
    }
    const float one = 1.0f, zero = 0.0f;
    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 28672, 8192, 4096, &one, w, CUDA_R_16F, 4096, x, CUDA_R_16F, 4096, &zero, y,
                     CUDA_R_32F, 28672, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "hot GEMM failed\n");
        exit(1);
    }
}

/* One sequence of T positions in blocks 0, 1, ... of a fresh cache (constant K, V and queries):
 * device arrays for the prefill launchers, and host tiles (ht) to fill. */
typedef struct seq1 {
    int T, mb;
    kc_half *k, *v;
    float *q, *out;
    int32_t *pos, *seq, *bt, *tiles, *ht;
    cudaEvent_t e0, e1;
} seq1;

static seq1 seq1_new(int T) {
    seq1 a = { .T = T, .mb = T / BS };
    const size_t ce = (size_t)a.mb * (g_shuffle ? 2 : 1) * g_nkv * BS * HD;
    CK(cudaMalloc((void **)&a.k, ce * 2));
    CK(cudaMalloc((void **)&a.v, ce * 2));
    CK(cudaMemset(a.k, 0x3a, ce * 2));
    CK(cudaMemset(a.v, 0x39, ce * 2));
    CK(cudaMalloc((void **)&a.q, (size_t)T * NH * HD * 4));
    CK(cudaMemset(a.q, 0x3c, (size_t)T * NH * HD * 4));
    if (g_rand) { /* scores q.k * 0.088 of standard deviation about 1 */
        fill_random(a.k, ce, 2, 1.0f, 1);
        fill_random(a.v, ce, 2, 1.0f, 2);
        fill_random(a.q, (size_t)T * NH * HD, 4, 1.0f, 3);
    }
    CK(cudaMalloc((void **)&a.out, (size_t)T * NH * HD * 4));
    int32_t *hp = malloc((size_t)T * 4), *hs = calloc((size_t)T, 4), *hb = malloc((size_t)a.mb * 4);
    a.ht = malloc((size_t)T * 8);
    for (int i = 0; i < T; i++) hp[i] = i;
    for (int j = 0; j < a.mb; j++) hb[j] = j;
    if (g_shuffle) { /* blocks drawn from a pool of 2 mb: a random injection */
        int *perm = malloc((size_t)2 * a.mb * sizeof(int));
        uint32_t r = 12345;
        for (int j = 0; j < 2 * a.mb; j++) perm[j] = j;
        for (int j = 2 * a.mb - 1; j > 0; j--) {
            r = r * 1664525u + 1013904223u;
            const int o = (int)((r >> 8) % (uint32_t)(j + 1)), t = perm[j];
            perm[j] = perm[o];
            perm[o] = t;
        }
        for (int j = 0; j < a.mb; j++) hb[j] = perm[j];
        free(perm);
    }
    CK(cudaMalloc((void **)&a.pos, (size_t)T * 4));
    CK(cudaMalloc((void **)&a.seq, (size_t)T * 4));
    CK(cudaMalloc((void **)&a.bt, (size_t)a.mb * 4));
    CK(cudaMalloc((void **)&a.tiles, (size_t)T * 8));
    CK(cudaMemcpy(a.pos, hp, (size_t)T * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.seq, hs, (size_t)T * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.bt, hb, (size_t)a.mb * 4, cudaMemcpyHostToDevice));
    CK(cudaEventCreate(&a.e0));
    CK(cudaEventCreate(&a.e1));
    free(hp); free(hs); free(hb);
    return a;
}

static void seq1_free(seq1 *a) {
    cudaFree(a->k); cudaFree(a->v); cudaFree(a->q); cudaFree(a->out); cudaFree(a->pos); cudaFree(a->seq); cudaFree(a->bt);
    cudaFree(a->tiles);
    cudaEventDestroy(a->e0);
    cudaEventDestroy(a->e1);
    free(a->ht);
}

static void bench_prefill(void) {
    const int Ts[] = { 2048, 8192, 32768 };
    printf("prefill: one causal sequence of T positions, 4 n_head hd T^2/2 FLOPs per call\n");
    for (int ti = 0; ti < 3; ti++) {
        const int T = Ts[ti], mb = T / BS;
        seq1 a = seq1_new(T);
        kc_half *k = a.k, *v = a.v;
        float *q = a.q, *out = a.out;
        int32_t *pos = a.pos, *seq = a.seq, *bt = a.bt, *tiles = a.tiles, *ht = a.ht;
        cudaEvent_t e0 = a.e0, e1 = a.e1;
        const double flops = 4.0 * NH * HD * (double)T * T / 2;
        for (int kind = 0; kind < 3; kind++) { /* mma.sync with 4 and 8 warps, then wgmma (where it runs) */
            const int warps = kind ? 8 : 4, fa3 = kind == 2;
            if (fa3 && !kc_attention_fa3_ok(HD, NH, g_nkv, BS)) {
                printf("  T=%-6d fa3: not on this device (needs compute capability 9.0 and this build's sm_90a code)\n", T);
                continue;
            }
            const int tt = fa3 ? kc_attention_fa3_tile_tok(NH, g_nkv) : kc_attention_tc_tile_tok(warps, NH, g_nkv);
            int nt = 0;
            for (int j = 0; j < T; j += tt, nt++) {
                ht[2 * nt] = j;
                ht[2 * nt + 1] = T - j < tt ? T - j : tt;
            }
            if (g_rev)
                for (int i = 0; i < nt / 2; i++)
                    for (int c = 0; c < 2; c++) {
                        const int32_t t = ht[2 * i + c];
                        ht[2 * i + c] = ht[2 * (nt - 1 - i) + c];
                        ht[2 * (nt - 1 - i) + c] = t;
                    }
            CK(cudaMemcpy(tiles, ht, (size_t)nt * 8, cudaMemcpyHostToDevice));
            const int iters = T >= 32768 ? 3 : 10;
            double ms = 0;
            for (int half = 0; half < (fa3 ? 2 : 1); half++) { /* fa3: f32 output, then half */
                ms = 0;
                for (int i = 0; i < iters + 1; i++) {
                    if (g_hot) hot_gemm();
                    if (i == 1 || (g_hot && i)) CK(cudaEventRecord(e0, 0));
                    if (fa3 ? (half ? kc_attention_prefill_fa3_half(q, NULL, k, v, (kc_half *)out, tiles, nt, pos, seq, bt, mb,
                                                                    NH, g_nkv, HD, BS, 0.088f, 0)
                                    : kc_attention_prefill_fa3(q, NULL, k, v, out, tiles, nt, pos, seq, bt, mb, NH, g_nkv, HD, BS,
                                                               0.088f, 0))
                            : kc_attention_prefill_tc(q, k, v, out, tiles, nt, pos, seq, bt, mb, NH, g_nkv, HD, BS, 0.088f, warps,
                                                      0)) {
                        fprintf(stderr, "prefill launch failed\n");
                        exit(1);
                    }
                    if (g_hot && i) {
                        CK(cudaEventRecord(e1, 0));
                        ms += time_ms(e0, e1);
                    }
                }
                if (!g_hot) {
                    CK(cudaEventRecord(e1, 0));
                    ms = time_ms(e0, e1);
                }
                ms /= iters;
                if (fa3 && !half)
                    printf("  T=%-6d %s tile=%-3d %9.3f ms per layer %7.1f TFLOP/s\n", T, "fa3 f32  ", tt, ms, flops / ms / 1e9);
            }
            printf("  T=%-6d %s tile=%-3d %9.3f ms per layer %7.1f TFLOP/s\n", T, fa3 ? "fa3 half " : warps == 4 ? "warps=4  " : "warps=8  ",
                   tt, ms, flops / ms / 1e9);
        }
        seq1_free(&a);
    }
}

/* A chunk of T prompt tokens at the end of a C-position context (chunked prefill of a long
 * prompt): the prefill kernel (8 warps, then 4 warps on tiles of half the tokens) with one CTA per
 * tile and KV head, and with the keys split by the plan's rule (kc_plan_pf_splits); then, where
 * it runs, the wgmma kernel (the 8-warp kernel's tiles), whole and split by its rule
 * (kc_plan_pf_splits_fa3). GB/s counts the context's K/V bytes once per tile. */
static void bench_chunk(double bw) {
    const int Ts[] = { 16, 64, 256, 1024 }, Cs[] = { 8192, 32768, 131072 };
    printf("chunk: T new tokens after C - T cached positions, one sequence; KV bytes of the context a tile reads, GB/s of those\n");
    for (int ci = 0; ci < 3; ci++) {
        const int C = Cs[ci], mb = C / BS;
        seq1 a = seq1_new(C);
        kc_half *k = a.k, *v = a.v;
        float *q = a.q, *out = a.out, *part;
        int32_t *pos = a.pos, *seq = a.seq, *bt = a.bt, *tiles = a.tiles, *ht = a.ht, *cnt;
        cudaEvent_t e0 = a.e0, e1 = a.e1;
        CK(cudaMalloc((void **)&part, (size_t)2 * kc_plan_get()->att_dec_ctas * 16 * 8 * (HD + 2) * 4));
        CK(cudaMalloc((void **)&cnt, (size_t)kc_plan_get()->att_dec_ctas * 4));
        CK(cudaMemset(cnt, 0, (size_t)kc_plan_get()->att_dec_ctas * 4));
        const int fa3 = kc_attention_fa3_ok(HD, NH, g_nkv, BS);
        for (int wi = 0; wi < (fa3 ? 12 : 8); wi++) { /* tiles of the 8-warp kernel, of the 4-warp kernel (half the tokens), the wgmma kernel's */
            const int warps = wi < 4 || wi >= 8 ? 8 : 4, ti = wi % 4, T = Ts[ti], tt = kc_attention_tc_tile_tok(warps, NH, g_nkv);
            int nt = 0;
            for (int j = C - T; j < C; j += tt, nt++) {
                ht[2 * nt] = j;
                ht[2 * nt + 1] = C - j < tt ? C - j : tt;
            }
            CK(cudaMemcpy(tiles, ht, (size_t)nt * 8, cudaMemcpyHostToDevice));
            int kchunk = 0;
            const int rule = wi >= 8 ? kc_plan_pf_splits_fa3(kc_plan_get(), g_nkv, nt, C - 1, &kchunk)
                                     : kc_plan_pf_splits(kc_plan_get(), g_nkv, nt, C - 1, &kchunk);
            const double bytes = (double)nt * C * g_nkv * HD * 2 * 2;
            for (int arm = 0; arm < 2; arm++) {
                const int ns = arm ? rule : 1;
                if (arm && ns == 1) break;
                const int iters = 10;
                for (int i = 0; i < iters + 1; i++) {
                    if (i == 1) CK(cudaEventRecord(e0, 0));
                    if (wi >= 8 ? kc_attention_prefill_fa3_split(q, NULL, k, v, out, tiles, nt, pos, seq, bt, mb, NH, g_nkv, HD, BS,
                                                                 0.088f, ns, kchunk, part, cnt, 0)
                                : kc_attention_prefill_tc_split(q, k, v, out, tiles, nt, pos, seq, bt, mb, NH, g_nkv, HD, BS,
                                                                0.088f, warps, 0, ns, kchunk, part, cnt, 0)) {
                        fprintf(stderr, "chunk launch failed\n");
                        exit(1);
                    }
                }
                CK(cudaEventRecord(e1, 0));
                const double ms = time_ms(e0, e1) / iters;
                printf("  C=%-6d T=%-5d %s tiles=%-3d splits=%-3d %9.4f ms per layer %7.0f GB/s %5.1f %%\n", C, T,
                       wi >= 8 ? "fa3 v3 " : warps == 4 ? "warps=4" : "warps=8", nt, ns, ms,
                       bytes / ms / 1e6, 100 * bytes / ms / 1e6 / bw);
            }
        }
        cudaFree(part);
        cudaFree(cnt);
        seq1_free(&a);
    }
}

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) { fprintf(stderr, "no CUDA device\n"); return 1; }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "mha")) g_nkv = NH;
    kc_plan p;
    if (kc_plan_choose(0, HD, NH, g_nkv, BS, 0, &p)) return 1;
    for (int i = 1; i < argc; i++) /* key=value[,...]: plan fields for A/B arms (kc_plan_override) */
        if (strchr(argv[i], '=') && gpu_plan_args(&p, argv[i], "gpu_bench_attn")) return 2;
    kc_plan_set(&p);
    double bw = copy_gbs();
    printf("%s, %d SMs, copy bandwidth %.0f GB/s\n", prop.name, prop.multiProcessorCount, bw);
    int dec = argc < 2, pf = argc < 2, spl = 0, chk = 0, d8 = 0, dshort = 0;
    for (int i = 1; i < argc; i++) {
        dec |= !strcmp(argv[i], "decode");
        pf |= !strcmp(argv[i], "prefill");
        spl |= !strcmp(argv[i], "splits");
        dshort |= !strcmp(argv[i], "short");
        chk |= !strcmp(argv[i], "chunk");
        d8 |= !strcmp(argv[i], "decode8") ? 1 : !strcmp(argv[i], "decode8x") ? 2 : 0;
        g_rand |= !strcmp(argv[i], "rand");
        g_rev |= !strcmp(argv[i], "rev");
        g_shuffle |= !strcmp(argv[i], "shuffle");
        g_hot |= !strcmp(argv[i], "hot");
    }
    printf("prefill variants:%s%s%s%s\n", g_rand ? " rand" : "", g_rev ? " rev" : "", g_shuffle ? " shuffle" : "", g_hot ? " hot" : "");
    if (dec) bench_decode(bw);
    if (dshort) bench_decode_short(bw);
    if (d8) bench_decode_f8(bw, d8 == 2);
    if (spl) bench_splits(bw, prop.multiProcessorCount);
    if (chk) bench_chunk(bw);
    if (pf) bench_prefill();
    return 0;
}
