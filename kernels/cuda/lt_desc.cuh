// cuBLASLt's descriptors for kc_matmul's layout, shared by the F16 (matmul.cu) and FP8 (fp8.cu)
// paths: y[n][m] (row stride ldy) (+)= W[m][k] x[n][k]^T with W and x of type ab and y of type c,
// f32 accumulation; FP8 also sets the fast-accumulation flag and, where given, the row and token
// scales as outer vectors.
#pragma once
#include <cublasLt.h>

extern "C" {
#include "kcuda.h"
}

struct kc_lt_desc {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    // fast < 0: the flag left unset; a_scale NULL: no scales (unit)
    cublasStatus_t make(int m, int n, int k, int ldy, cudaDataType_t ab, cudaDataType_t c, int fast = -1,
                        const void *a_scale = nullptr, const void *b_scale = nullptr) {
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        const int8_t f = fast > 0 ? 1 : 0;
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        if (!st && fast >= 0) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof f);
        if (a_scale) {
            if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
            if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
            if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale);
            if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale);
        }
        if (!st) st = cublasLtMatrixLayoutCreate(&la, ab, k, m, k);
        if (!st) st = cublasLtMatrixLayoutCreate(&lb, ab, k, n, k);
        if (!st) st = cublasLtMatrixLayoutCreate(&lc, c, m, n, ldy);
        return st;
    }
    cublasStatus_t run(const kc_gemm_ws *ws, const cublasLtMatmulAlgo_t *algo, const void *w, const void *x, void *y, float beta,
                       cudaStream_t s) const {
        const float one = 1.0f;
        return cublasLtMatmul((cublasLtHandle_t)ws->cublaslt, op, &one, w, la, x, lb, &beta, y, lc, y, lc, algo, ws->lt_ws,
                              ws->lt_ws_bytes, s);
    }
    // whether cuBLASLt takes algo for these descriptors within the workspace
    bool takes(const kc_gemm_ws *ws, const cublasLtMatmulAlgo_t *algo) const {
        cublasLtMatmulHeuristicResult_t r = {};
        return cublasLtMatmulAlgoCheck((cublasLtHandle_t)ws->cublaslt, op, la, lb, lc, lc, algo, &r) == CUBLAS_STATUS_SUCCESS &&
               r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws->lt_ws_bytes;
    }
    // up to max of the heuristic's algorithms within the workspace (0: none, or an error)
    int heuristic(const kc_gemm_ws *ws, cublasLtMatmulHeuristicResult_t *hr, int max) const {
        cublasLtMatmulPreference_t pref = nullptr;
        const uint64_t wsb = ws->lt_ws_bytes;
        int n = 0;
        if (cublasLtMatmulPreferenceCreate(&pref) ||
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb) ||
            cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)ws->cublaslt, op, la, lb, lc, lc, pref, max, hr, &n))
            n = 0;
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        return n > 0 && hr[0].state == CUBLAS_STATUS_SUCCESS ? n : 0;
    }
    ~kc_lt_desc() {
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

// The start-up timings' loop (kc_matmul_tune_f16, kc_matmul_tune_f8): PASSES round-robin passes
// over candidates 0..n-1, each a warm call then REPS timed calls of run(c) (one call on s, its
// cuBLAS status), each candidate's best pass into best[c]. A candidate entering with best[c] < 0,
// or whose call fails, is left out (best[c] = -1). *last: the last candidate that ran. 0, or
// CM_ECUDA (events).
template <class Run>
static int lt_time(int n, float *best, int *last, cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, Run run) {
    enum { PASSES = 2, REPS = 3 };
    for (int p = 0; p < PASSES; p++)
        for (int c = 0; c < n; c++) {
            if (best[c] < 0) continue;
            cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
            for (int r = 0; r <= REPS && !st; r++) {
                if (r == 1) cudaEventRecord(e0, s);
                st = run(c);
            }
            if (st != CUBLAS_STATUS_SUCCESS) { // this algorithm refuses these sizes: left out
                best[c] = -1.0f;
                continue;
            }
            cudaEventRecord(e1, s);
            float ms = 0;
            if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) return CM_ECUDA;
            if (ms < best[c]) best[c] = ms;
            if (last) *last = c;
        }
    return 0;
}
