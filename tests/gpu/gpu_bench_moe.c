/* gpu_bench_moe: the one-token MoE expert launches of a decode step (kc_moe_gemvq_glu then
 * kc_moe_gemvq_f, what each of qwen3-30b-a3b's 48 layers runs at batch 1: 8 of 128 experts, gate|up
 * Q4_K rows of 2048, down Q6_K rows of 768, ~24 MB a layer) by where the chosen experts lie, to
 * tell the memory's bandwidth from its address translation (bench/RESULTS.md, nineteenth session:
 * these launches read at ~1 TB/s whichever way the rows are copied):
 *   spread   48 layers of 128 experts (~20 GB, as the model), 8 experts drawn at random per layer
 *            and step: the pages a step touches are new every layer;
 *   fixed    the same 48 layers, each with the same 8 experts every step (1.2 GB: past the L2);
 *   few      4 layers cycled, 8 fixed experts each (~100 MB: past the 50 MB L2, few pages);
 *   hot      1 layer, 8 fixed experts (24 MB: held in the L2);
 *   dense    for scale, kc_matmul_xq of Q4_K matrices of about the same bytes, cycled past the L2.
 * Each mode times STEPS steps of all its launches between two events (back to back, programmatic
 * launch on as in the forward, replayed from one CUDA graph as the forward's decode steps are
 * unless --no-graph) and prints us a layer and GB/s. Weights: one expert's random rows,
 * quantized, repacked, copied to every expert and layer on the device.
 * usage: gpu_bench_moe [--no-pdl] [--no-graph] [--plan key=value,...] */
#include "kernels/cuda/kcuda.h"
#include "model/dtype.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_bench_w.h"
#include "gpu_ck.h"
#include "gpu_plan.h"

enum { N_LAYER = 48, N_EXP = 128, K = 8, E = 2048, F = 768, STEPS = 20 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((next() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* An expert stack of n_exp experts of rows x n_in (type), every expert a copy of one random expert. */
static kc_weight experts_up(int type, int n_in, int rows) {
    const size_t n = (size_t)n_in * rows;
    float *wf = malloc(n * 4);
    for (size_t i = 0; i < n; i++) wf[i] = frand() * 0.05f;
    void *blocks = malloc(dt_row_size(type, n_in) * rows);
    dt_quantize(type, wf, blocks, (int64_t)n);
    size_t db, sb, Db, Sb;
    kc_weight_sizes(type, n_in, rows, &db, &sb);
    kc_weight_sizes(type, n_in, rows * N_EXP, &Db, &Sb);
    void *hq = malloc(db), *hs = malloc(sb);
    kc_weight_repack(type, blocks, n_in, rows, hq, hs);
    kc_weight w = { .type = type, .n_in = n_in, .n_out = rows * N_EXP };
    CK(cudaMalloc(&w.data, Db));
    CK(cudaMalloc((void **)&w.d, Sb));
    CK(cudaMemcpy(w.data, hq, db, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w.d, hs, sb, cudaMemcpyHostToDevice));
    for (size_t have = 1; have < N_EXP; have *= 2) { /* expert e's rows start at e rows (kc_weight_row_at) */
        const size_t c = have * 2 <= N_EXP ? have : N_EXP - have;
        CK(cudaMemcpy((uint8_t *)w.data + have * db, w.data, c * db, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy((uint8_t *)w.d + have * sb, w.d, c * sb, cudaMemcpyDeviceToDevice));
    }
    free(wf); free(blocks); free(hq); free(hs);
    return w;
}

int main(int argc, char **argv) {
    int graph = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-pdl")) gpu_plan_pdl(0);
        else if (!strcmp(argv[i], "--no-graph")) graph = 0;
        else if (!strcmp(argv[i], "--plan") && i + 1 < argc) {
            kc_plan p = *kc_plan_get();
            if (gpu_plan_args(&p, argv[++i], argv[0])) return 2;
            kc_plan_set(&p);
        } else {
            fprintf(stderr, "usage: %s [--no-pdl] [--no-graph] [--plan key=value,...]\n", argv[0]);
            return 2;
        }
    }
    {
        char buf[2048];
        kc_plan_format(kc_plan_get(), buf, sizeof buf);
        printf("plan: %s\n", buf);
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    kc_weight gu[N_LAYER], dn[N_LAYER];
    gu[0] = experts_up(DT_Q4_K, E, 2 * F);
    dn[0] = experts_up(DT_Q6_K, F, E);
    size_t gdb, gsb, ddb, dsb, g1, g2, d1, d2;
    kc_weight_sizes(DT_Q4_K, E, 2 * F * N_EXP, &gdb, &gsb);
    kc_weight_sizes(DT_Q6_K, F, E * N_EXP, &ddb, &dsb);
    kc_weight_sizes(DT_Q4_K, E, 2 * F, &g1, &g2);
    kc_weight_sizes(DT_Q6_K, F, E, &d1, &d2);
    const double layer_mb = K * (double)(g1 + g2 + d1 + d2) / 1e6; /* what a layer's launches must read */
    for (int l = 1; l < N_LAYER; l++) {
        gu[l] = gu[0];
        dn[l] = dn[0];
        CK(cudaMalloc(&gu[l].data, gdb));
        CK(cudaMalloc((void **)&gu[l].d, gsb));
        CK(cudaMalloc(&dn[l].data, ddb));
        CK(cudaMalloc((void **)&dn[l].d, dsb));
        CK(cudaMemcpy(gu[l].data, gu[0].data, gdb, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(gu[l].d, gu[0].d, gsb, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(dn[l].data, dn[0].data, ddb, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(dn[l].d, dn[0].d, dsb, cudaMemcpyDeviceToDevice));
    }
    /* the choices: [step][layer][k] distinct experts (random), and fixed ones */
    int32_t *hidx = malloc((size_t)STEPS * N_LAYER * K * 4), *hfix = malloc((size_t)N_LAYER * K * 4);
    for (int i = 0; i < STEPS * N_LAYER + N_LAYER; i++) {
        int32_t *o = i < STEPS * N_LAYER ? hidx + (size_t)i * K : hfix + (size_t)(i - STEPS * N_LAYER) * K;
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = (int)(next() % N_EXP);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= o[j] == e;
            } while (dup);
            o[k] = e;
        }
    }
    int32_t *didx, *dfix;
    CK(cudaMalloc((void **)&didx, (size_t)STEPS * N_LAYER * K * 4));
    CK(cudaMalloc((void **)&dfix, (size_t)N_LAYER * K * 4));
    CK(cudaMemcpy(didx, hidx, (size_t)STEPS * N_LAYER * K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dfix, hfix, (size_t)N_LAYER * K * 4, cudaMemcpyHostToDevice));
    float hx[E], hw[K];
    for (int i = 0; i < E; i++) hx[i] = frand();
    for (int k = 0; k < K; k++) hw[k] = 1.0f / K;
    float *dx, *drw, *dact, *dout;
    CK(cudaMalloc((void **)&dx, sizeof hx));
    CK(cudaMalloc((void **)&drw, sizeof hw));
    CK(cudaMalloc((void **)&dact, (size_t)K * F * 4));
    CK(cudaMalloc((void **)&dout, (size_t)K * E * 4));
    CK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(drw, hw, sizeof hw, cudaMemcpyHostToDevice));
    kc_xq xq = { .cap_tok = 1, .cap_n = E };
    CK(cudaMalloc((void **)&xq.qh, E));
    CK(cudaMalloc((void **)&xq.ql, E));
    CK(cudaMalloc((void **)&xq.m, E / 32 * 8));
    if (kc_quantize_x(dx, 1, E, &xq, s)) {
        fprintf(stderr, "kc_quantize_x failed\n");
        return 1;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("8 of %d experts a layer, gate|up Q4_K %dx%d, down Q6_K %dx%d: %.1f MB a layer\n", N_EXP, 2 * F, E, E, F, layer_mb);
    printf("%-8s %8s %10s %10s %10s\n", "mode", "layers", "us/layer", "GB/s", "footprint");
    const struct { const char *name; int layers, random; } modes[] = {
        { "spread", N_LAYER, 1 }, { "fixed", N_LAYER, 0 }, { "few", 4, 0 }, { "hot", 1, 0 }, { "spread", N_LAYER, 1 },
    };
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        const int nl = modes[mi].layers;
        int rc = 0;
        cudaGraphExec_t ge = NULL;
        for (int pass = 0; pass < 2 + graph; pass++) { /* a warm-up pass, then the timed one (graph: capture first) */
            if (graph && pass == 0) CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            if (pass == 1 + graph) CK(cudaEventRecord(e0, s));
            if (graph && pass > 0) {
                CK(cudaGraphLaunch(ge, s));
                continue;
            }
            for (int st = 0; st < STEPS; st++)
                for (int l = 0; l < N_LAYER; l++) {
                    const int ll = l % nl;
                    const int32_t *idx = modes[mi].random ? didx + ((size_t)st * N_LAYER + l) * K : dfix + (size_t)ll * K;
                    rc |= kc_moe_gemvq_glu(&gu[ll], N_EXP, &xq, K, idx, NULL, NULL, NULL, 1, K, drw, dact, s);
                    rc |= kc_moe_gemvq_f(&dn[ll], N_EXP, dact, idx, NULL, NULL, NULL, 1, K, dout, s);
                }
            if (graph) {
                cudaGraph_t g;
                CK(cudaStreamEndCapture(s, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                CK(cudaGraphDestroy(g));
            }
        }
        CK(cudaEventRecord(e1, s));
        if (ge) CK(cudaGraphExecDestroy(ge));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1000.0 / (STEPS * N_LAYER);
        printf("%-8s %8d %10.2f %10.0f %8.0f MB%s\n", modes[mi].name, nl, us, layer_mb / us * 1e3,
               modes[mi].random ? N_LAYER * (double)(gdb + gsb + ddb + dsb) / 1e6 : nl * layer_mb, rc ? "  (a launch failed)" : "");
    }
    /* dense: Q4_K rows of 2048 of about a layer's bytes, cycled past the L2 */
    {
        kc_weight w[32];
        size_t wb;
        const int rows = (int)(layer_mb * 1e6 / ((double)E * 9 / 16)) / 16 * 16;
        const int nc = bench_w_upload(DT_Q4_K, E, rows, frand, w, 32, &wb);
        kc_gemm_ws ws = { 0 };
        ws.xq = xq;
        float *dy;
        CK(cudaMalloc((void **)&dy, (size_t)rows * 4));
        int rc = 0;
        for (int i = 0; i < 20; i++) rc |= kc_matmul_xq(&w[i % nc], dx, &xq, 1, dy, 0, &ws, s);
        const int iters = 8 * nc > 200 ? 8 * nc : 200;
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < iters; i++) rc |= kc_matmul_xq(&w[i % nc], dx, &xq, 1, dy, 0, &ws, s);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1000.0 / iters;
        printf("%-8s %8d %10.2f %10.0f %8.0f MB  (one launch of %d rows)%s\n", "dense", nc, us, wb / 1e6 / us * 1e3, nc * wb / 1e6,
               rows, rc ? "  (a launch failed)" : "");
        bench_w_free(w, nc);
        cudaFree(dy);
    }
    return 0;
}
