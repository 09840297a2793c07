/* gpu_bench_overlap: can a decode step hide its attention (memory-bound) under its matmuls
 * (compute-bound at 128+ tokens) by running two halves of the batch at once? At llama3-8b's
 * shapes (32 layers; 32 query heads, 8 KV heads, head dim 128, KV blocks of 16; Q|K|V 4096 x 6144,
 * wo 4096 x 4096, gate|up 4096 x 28672, down 14336 x 4096), B sequences of C positions, each layer
 * one decode-attention launch and the four matmuls, timed as a whole step (the norms, rotation,
 * gated activation and sampling of a real step are left out). Arms:
 *   serial       attention of B, matmuls of B, layer after layer, one stream (today's order)
 *   halves       the same per half (B / 2), one stream: what splitting costs (weights read twice)
 *   two-chains   each half's layers on its own stream, the hardware interleaving them
 *   by-kind      every attention on one stream, every matmul on another, events for each half's
 *                order (half 1's matmuls under half 2's attention and back), both on the whole GPU
 *   green S      by-kind with the attention stream in a green context of S SMs and the matmuls in
 *                one of the rest (cuGreenCtxCreate), for several S
 * Printed: ms a step, tokens a second (B / step) and the ratio to serial. No checks of values:
 * the kernels are the backend's (kc_attention_decode_tc[_f8]) and cuBLAS / cuBLASLt's, with
 * constant inputs.
 * usage: gpu_bench_overlap [f16|fp8] [B [C]] [key=value,... kernel-plan fields]
 *        (default fp8 256 1024: the FP8 weights and FP8 KV cache of issue 23's engine figure) */
#include "kernels/cuda/kcuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_ck.h"
#include "gpu_plan.h"

enum { NH = 32, NKV = 8, HD = 128, BS = 16, NL = 32, NSETS = 2, NMAT = 4 };
static const int k_in[NMAT] = { 4096, 4096, 4096, 14336 }, k_out[NMAT] = { 6144, 4096, 28672, 4096 };

#define DRV(x)                                                                            \
    do {                                                                                  \
        CUresult r_ = (x);                                                                \
        if (r_ != CUDA_SUCCESS) {                                                         \
            const char *s_ = "?";                                                         \
            cuGetErrorString(r_, &s_);                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_);               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static int g_f8;

/* One half (or the whole batch) of the decode step: its attention's inputs and scratch, its
 * matmuls' activations and outputs. */
typedef struct half_s {
    int n;                 /* sequences (tokens) */
    void *k, *v;           /* its own cache: n x C positions, blocks scattered */
    float *q, *out, *part;
    int32_t *pos, *seq, *bt, *chunk, *cnt;
    int mb, ns;
    void *x;               /* matmul input: n x 14336 (half, or E4M3 codes) */
    float *y;              /* matmul output: n x 28672 */
    float *sx;             /* FP8: token scales */
} half_s;

static half_s half_new(int n, int C) {
    half_s h = { .n = n, .mb = C / BS };
    const int nblk = n * h.mb;
    const size_t ce = (size_t)(nblk + 1) * NKV * BS * (g_f8 ? HD + 4 : HD), esz = g_f8 ? 1 : 2;
    CK(cudaMalloc(&h.k, ce * esz));
    CK(cudaMalloc(&h.v, ce * esz));
    CK(cudaMemset(h.k, 0x3a, ce * esz));
    CK(cudaMemset(h.v, 0x39, ce * esz));
    CK(cudaMalloc((void **)&h.q, (size_t)n * NH * HD * 4));
    CK(cudaMemset(h.q, 0x3c, (size_t)n * NH * HD * 4));
    CK(cudaMalloc((void **)&h.out, (size_t)n * NH * HD * 4));
    int32_t *hp = malloc((size_t)n * 4), *hs = malloc((size_t)n * 4), *hb = malloc((size_t)nblk * 4);
    for (int i = 0; i < n; i++) { hp[i] = C - 1; hs[i] = i; }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < h.mb; j++) hb[i * h.mb + j] = j * n + i;
    CK(cudaMalloc((void **)&h.pos, (size_t)n * 4));
    CK(cudaMalloc((void **)&h.seq, (size_t)n * 4));
    CK(cudaMalloc((void **)&h.bt, (size_t)nblk * 4));
    CK(cudaMemcpy(h.pos, hp, (size_t)n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(h.seq, hs, (size_t)n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(h.bt, hb, (size_t)nblk * 4, cudaMemcpyHostToDevice));
    free(hp); free(hs); free(hb);
    h.ns = kc_plan_dec_splits(kc_plan_get(), NKV, n, C);
    const int ch = kc_plan_dec_chunk(kc_plan_get(), NKV, n, h.ns, C - 1);
    CK(cudaMalloc((void **)&h.part, (size_t)n * NH * (h.ns + 1) * (HD + 2) * 4));
    CK(cudaMalloc((void **)&h.chunk, 4));
    CK(cudaMemcpy(h.chunk, &ch, 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&h.cnt, (size_t)n * NH * 4));
    CK(cudaMemset(h.cnt, 0, (size_t)n * NH * 4));
    CK(cudaMalloc(&h.x, (size_t)n * 14336 * (g_f8 ? 1 : 2)));
    CK(cudaMemset(h.x, g_f8 ? 0x30 : 0x20, (size_t)n * 14336 * (g_f8 ? 1 : 2)));
    CK(cudaMalloc((void **)&h.y, (size_t)n * 28672 * 4));
    CK(cudaMalloc((void **)&h.sx, (size_t)n * 4));
    CK(cudaMemset(h.sx, 0, (size_t)n * 4));
    return h;
}

static void attention(const half_s *h, cudaStream_t s) {
    const int rc = g_f8 ? kc_attention_decode_tc_f8(h->q, h->k, h->v, h->out, NULL, NULL, h->n, h->pos, h->seq, h->bt, h->mb, NH,
                                                    NKV, HD, BS, 0.088f, h->ns, h->chunk, h->part, h->cnt, s)
                        : kc_attention_decode_tc(h->q, h->k, h->v, h->out, NULL, NULL, h->n, h->pos, h->seq, h->bt, h->mb, NH, NKV,
                                                 HD, BS, 0.088f, h->ns, h->chunk, h->part, h->cnt, s);
    if (rc) { fprintf(stderr, "attention launch failed (%d)\n", rc); exit(1); }
}

/* The matmuls: weights (NSETS copies of the layer's four, so that a layer's reads leave the L2),
 * a cuBLAS handle and a cuBLASLt plan per (matrix, token count) and stream. */
typedef struct mm_s {
    void *w[NSETS][NMAT];
    float *sw;                      /* FP8: row scales (1/64) */
    cublasHandle_t cb;
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la[NMAT], lb[NMAT][2], lc[NMAT][2];
    cublasLtMatmulAlgo_t algo[NMAT][2];
    int ntok[2];
} mm_s;

static void mm_plan(mm_s *m, int slot, int n, const half_s *h) {
    m->ntok[slot] = n;
    if (!g_f8) return;
    for (int i = 0; i < NMAT; i++) {
        CKB(cublasLtMatrixLayoutCreate(&m->lb[i][slot], CUDA_R_8F_E4M3, k_in[i], n, k_in[i]));
        CKB(cublasLtMatrixLayoutCreate(&m->lc[i][slot], CUDA_R_32F, k_out[i], n, k_out[i]));
        cublasLtMatmulPreference_t pref;
        CKB(cublasLtMatmulPreferenceCreate(&pref));
        CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &m->ws_bytes, sizeof m->ws_bytes));
        cublasLtMatmulHeuristicResult_t r;
        int nr = 0;
        /* the scale pointers are part of the descriptor: set the half's before the query */
        CKB(cublasLtMatmulDescSetAttribute(m->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &h->sx, sizeof h->sx));
        if (cublasLtMatmulAlgoGetHeuristic(m->lt, m->op, m->la[i], m->lb[i][slot], m->lc[i][slot], m->lc[i][slot], pref, 1, &r, &nr) !=
                CUBLAS_STATUS_SUCCESS || nr < 1) {
            fprintf(stderr, "no cuBLASLt FP8 algorithm for %d x %d x %d\n", k_out[i], n, k_in[i]);
            exit(1);
        }
        m->algo[i][slot] = r.algo;
        cublasLtMatmulPreferenceDestroy(pref);
    }
}

static mm_s mm_new(const mm_s *share) {
    mm_s m;
    memset(&m, 0, sizeof m);
    CKB(cublasCreate(&m.cb));
    CKB(cublasLtCreate(&m.lt));
    m.ws_bytes = 32u << 20;
    CK(cudaMalloc(&m.ws, m.ws_bytes));
    CKB(cublasSetWorkspace(m.cb, m.ws, m.ws_bytes));
    if (share) {
        memcpy(m.w, share->w, sizeof m.w);
        m.sw = share->sw;
    } else {
        for (int s = 0; s < NSETS; s++)
            for (int i = 0; i < NMAT; i++) {
                const size_t b = (size_t)k_in[i] * k_out[i] * (g_f8 ? 1 : 2);
                CK(cudaMalloc(&m.w[s][i], b));
                CK(cudaMemset(m.w[s][i], g_f8 ? 0x28 : 0x18, b));
            }
        CK(cudaMalloc((void **)&m.sw, 28672 * 4));
        CK(cudaMemset(m.sw, 0, 28672 * 4));
    }
    if (g_f8) {
        CKB(cublasLtMatmulDescCreate(&m.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CKB(cublasLtMatmulDescSetAttribute(m.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CKB(cublasLtMatmulDescSetAttribute(m.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        const int32_t vm = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        CKB(cublasLtMatmulDescSetAttribute(m.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vm, sizeof vm));
        CKB(cublasLtMatmulDescSetAttribute(m.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vm, sizeof vm));
        CKB(cublasLtMatmulDescSetAttribute(m.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &m.sw, sizeof m.sw));
        for (int i = 0; i < NMAT; i++) CKB(cublasLtMatrixLayoutCreate(&m.la[i], CUDA_R_8F_E4M3, k_in[i], k_out[i], k_in[i]));
    }
    return m;
}

/* layer l's four matmuls for half h (slot: its token count's plans) on stream s */
static void matmuls(mm_s *m, int slot, const half_s *h, int l, cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    const int n = m->ntok[slot];
    if (!g_f8) {
        CKB(cublasSetStream(m->cb, s));
        for (int i = 0; i < NMAT; i++)
            CKB(cublasGemmEx(m->cb, CUBLAS_OP_T, CUBLAS_OP_N, k_out[i], n, k_in[i], &one, m->w[l % NSETS][i], CUDA_R_16F, k_in[i], h->x,
                            CUDA_R_16F, k_in[i], &zero, h->y, CUDA_R_32F, k_out[i], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    CKB(cublasLtMatmulDescSetAttribute(m->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &h->sx, sizeof h->sx));
    for (int i = 0; i < NMAT; i++)
        CKB(cublasLtMatmul(m->lt, m->op, &one, m->w[l % NSETS][i], m->la[i], h->x, m->lb[i][slot], &zero, h->y, m->lc[i][slot], h->y,
                          m->lc[i][slot], &m->algo[i][slot], m->ws, m->ws_bytes, s));
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Streams and events of one arm: sa runs attention, sm matmuls (the same stream for serial arms);
 * ev[k][l]: half k's attention of layer l done, evm[k][l]: its matmuls done. */
typedef struct arm_s {
    cudaStream_t sa, sm;
    cudaEvent_t ev[2][NL], evm[2][NL];
} arm_s;

static void arm_events(arm_s *a) {
    for (int k = 0; k < 2; k++)
        for (int l = 0; l < NL; l++) {
            CK(cudaEventCreateWithFlags(&a->ev[k][l], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&a->evm[k][l], cudaEventDisableTiming));
        }
}

enum { SERIAL, HALVES, CHAINS, BYKIND };

/* One step of an arm: whole (the batch), hv (the halves), mA / mM the matmul handles of the
 * attention-side and matmul-side streams (two-chains: one per half). */
static void step(int kind, arm_s *a, half_s *whole, half_s *hv, mm_s *mA, mm_s *mM) {
    for (int l = 0; l < NL; l++) {
        switch (kind) {
        case SERIAL:
            attention(whole, a->sa);
            matmuls(mA, 1, whole, l, a->sa);
            break;
        case HALVES:
            for (int k = 0; k < 2; k++) {
                attention(&hv[k], a->sa);
                matmuls(mA, 0, &hv[k], l, a->sa);
            }
            break;
        case CHAINS:
            attention(&hv[0], a->sa);
            matmuls(mA, 0, &hv[0], l, a->sa);
            attention(&hv[1], a->sm);
            matmuls(mM, 0, &hv[1], l, a->sm);
            break;
        case BYKIND:
            /* attention of half k after its matmuls of layer l - 1; matmuls after its attention */
            for (int k = 0; k < 2; k++) {
                if (l) CK(cudaStreamWaitEvent(a->sa, a->evm[k][l - 1], 0));
                attention(&hv[k], a->sa);
                CK(cudaEventRecord(a->ev[k][l], a->sa));
                CK(cudaStreamWaitEvent(a->sm, a->ev[k][l], 0));
                matmuls(mM, 0, &hv[k], l, a->sm);
                CK(cudaEventRecord(a->evm[k][l], a->sm));
            }
            break;
        }
    }
}

static double time_arm(int kind, arm_s *a, half_s *whole, half_s *hv, mm_s *mA, mm_s *mM) {
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        CK(cudaStreamSynchronize(a->sa));
        CK(cudaStreamSynchronize(a->sm));
        const double t0 = now_ms();
        step(kind, a, whole, hv, mA, mM);
        CK(cudaStreamSynchronize(a->sa));
        CK(cudaStreamSynchronize(a->sm));
        const double ms = now_ms() - t0;
        if (r && ms < best) best = ms; /* the first: warm-up */
    }
    return best;
}

/* A green context of n SMs (and one of the rest) and a stream in each; 0 when the driver refuses. */
static int green_pair(CUdevice dev, unsigned n, CUstream *s_att, CUstream *s_mm, unsigned *got_att, unsigned *got_mm) {
    CUdevResource all, part[1], rest;
    DRV(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    unsigned ng = 1;
    if (cuDevSmResourceSplitByCount(part, &ng, &all, &rest, 0, n) != CUDA_SUCCESS || ng < 1) return 0;
    CUdevResourceDesc da, dm;
    CUgreenCtx ga, gm;
    if (cuDevResourceGenerateDesc(&da, part, 1) != CUDA_SUCCESS || cuDevResourceGenerateDesc(&dm, &rest, 1) != CUDA_SUCCESS) return 0;
    if (cuGreenCtxCreate(&ga, da, dev, CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS ||
        cuGreenCtxCreate(&gm, dm, dev, CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS)
        return 0;
    if (cuGreenCtxStreamCreate(s_att, ga, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
        cuGreenCtxStreamCreate(s_mm, gm, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS)
        return 0;
    *got_att = part[0].sm.smCount;
    *got_mm = rest.sm.smCount;
    return 1;
}

int main(int argc, char **argv) {
    int B = 256, C = 1024, ai = 1;
    g_f8 = 1;
    if (ai < argc && (!strcmp(argv[ai], "f16") || !strcmp(argv[ai], "fp8"))) g_f8 = !strcmp(argv[ai++], "fp8");
    if (ai < argc && !strchr(argv[ai], '=')) B = atoi(argv[ai++]);
    if (ai < argc && !strchr(argv[ai], '=')) C = atoi(argv[ai++]);
    if (B < 2 || B % 2 || C < 64 || C % 64) {
        fprintf(stderr, "usage: gpu_bench_overlap [f16|fp8] [B (even) [C (multiple of 64)]] [key=value,...]\n");
        return 2;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    kc_plan p;
    if (kc_plan_choose(0, HD, NH, NKV, BS, 0, &p)) return 1;
    for (int i = ai; i < argc; i++)
        if (gpu_plan_args(&p, argv[i], "gpu_bench_overlap")) return 2;
    kc_plan_set(&p);
    CK(cudaFree(0));
    DRV(cuInit(0));
    CUdevice dev;
    DRV(cuDeviceGet(&dev, 0));
    printf("%s, %d SMs: llama3-8b shapes, %s weights and KV cache, %d sequences x %d positions, %d layers\n", prop.name,
           prop.multiProcessorCount, g_f8 ? "FP8" : "F16", B, C, NL);
    half_s whole = half_new(B, C), hv[2] = { half_new(B / 2, C), half_new(B / 2, C) };
    mm_s mA = mm_new(NULL), mM = mm_new(&mA);
    mm_plan(&mA, 0, B / 2, &hv[0]);
    mm_plan(&mA, 1, B, &whole);
    mm_plan(&mM, 0, B / 2, &hv[1]);
    arm_s one, two;
    CK(cudaStreamCreateWithFlags(&one.sa, cudaStreamNonBlocking));
    one.sm = one.sa;
    CK(cudaStreamCreateWithFlags(&two.sa, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&two.sm, cudaStreamNonBlocking));
    arm_events(&two);
    /* the parts alone, whole GPU: attention of the batch, its matmuls */
    double t_att = 1e30, t_mm = 1e30;
    for (int r = 0; r < 6; r++) {
        CK(cudaStreamSynchronize(one.sa));
        double t0 = now_ms();
        for (int l = 0; l < NL; l++) attention(&whole, one.sa);
        CK(cudaStreamSynchronize(one.sa));
        double t1 = now_ms();
        for (int l = 0; l < NL; l++) matmuls(&mA, 1, &whole, l, one.sa);
        CK(cudaStreamSynchronize(one.sa));
        double t2 = now_ms();
        if (r) {
            if (t1 - t0 < t_att) t_att = t1 - t0;
            if (t2 - t1 < t_mm) t_mm = t2 - t1;
        }
    }
    printf("parts alone: attention %.3f ms, matmuls %.3f ms a step (sum %.3f)\n", t_att, t_mm, t_att + t_mm);
    const double t_ser = time_arm(SERIAL, &one, &whole, hv, &mA, &mM);
    printf("%-22s %8.3f ms  %8.0f tok/s  x%.3f\n", "serial", t_ser, B / t_ser * 1e3, 1.0);
    const char *names[] = { "serial", "halves", "two-chains", "by-kind" };
    for (int kind = HALVES; kind <= BYKIND; kind++) {
        const double t = time_arm(kind, kind == HALVES ? &one : &two, &whole, hv, &mA, &mM);
        printf("%-22s %8.3f ms  %8.0f tok/s  x%.3f\n", names[kind], t, B / t * 1e3, t_ser / t);
        fflush(stdout);
    }
    const unsigned splits[] = { 16, 32, 48, 64, 80, 96 };
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        arm_s g;
        unsigned na = 0, nm = 0;
        if (!green_pair(dev, splits[i], (CUstream *)&g.sa, (CUstream *)&g.sm, &na, &nm)) {
            printf("green %u: the driver refused the partition\n", splits[i]);
            continue;
        }
        arm_events(&g);
        char name[64];
        snprintf(name, sizeof name, "green %u att / %u mm", na, nm);
        const double t = time_arm(BYKIND, &g, &whole, hv, &mA, &mM);
        printf("%-22s %8.3f ms  %8.0f tok/s  x%.3f\n", name, t, B / t * 1e3, t_ser / t);
        fflush(stdout);
    }
    return 0;
}
