// trace: the step trace's buffer on the device (builds with KC_TRACE; kc_common.cuh).
#include "kc_common.cuh"

#ifdef KC_TRACE
#define TU(n) extern "C" int kc_trace_tu_##n(kc_trace_rec *buf, unsigned *cnt, unsigned cap);
TU(act) TU(arch) TU(attention) TU(attention_tc) TU(embed) TU(fp8) TU(gemmq) TU(matmul) TU(norm) TU(rope)
#undef TU

static kc_trace_rec *g_buf;
static unsigned *g_n;
static unsigned g_cap;

// Points every file's copy of the trace address at buf (NULL: recording off).
static int set_all(kc_trace_rec *buf, unsigned *n, unsigned cap) {
    int (*const set[])(kc_trace_rec *, unsigned *, unsigned) = { kc_trace_tu_act,   kc_trace_tu_arch,  kc_trace_tu_attention,
                                                                  kc_trace_tu_attention_tc, kc_trace_tu_embed, kc_trace_tu_fp8,
                                                                  kc_trace_tu_gemmq, kc_trace_tu_matmul, kc_trace_tu_norm,
                                                                  kc_trace_tu_rope };
    for (auto f : set)
        if (int rc = f(buf, n, cap)) return rc;
    return 0;
}

extern "C" int kc_trace_begin(unsigned cap) {
    if (cap == 0) return CM_EINVAL;
    if (cap > g_cap) {
        cudaFree(g_buf);
        g_buf = nullptr;
        g_cap = 0;
        if (cudaMalloc(&g_buf, (size_t)cap * sizeof *g_buf) != cudaSuccess) return CM_ENOMEM;
        g_cap = cap;
    }
    if (!g_n && cudaMalloc(&g_n, sizeof *g_n) != cudaSuccess) return CM_ENOMEM;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemset(g_n, 0, sizeof *g_n) != cudaSuccess) return CM_ECUDA;
    return set_all(g_buf, g_n, g_cap);
}

extern "C" int kc_trace_end(kc_trace_rec *out, unsigned cap, unsigned *n_out) {
    if (!g_buf || !out || !n_out) return CM_EINVAL;
    unsigned n = 0;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(&n, g_n, sizeof n, cudaMemcpyDeviceToHost) != cudaSuccess)
        return CM_ECUDA;
    unsigned k = n < cap ? n : cap;
    if (k > g_cap) k = g_cap;
    if (k && cudaMemcpy(out, g_buf, (size_t)k * sizeof *out, cudaMemcpyDeviceToHost) != cudaSuccess) return CM_ECUDA;
    *n_out = n;
    return set_all(nullptr, nullptr, 0);
}
#else
extern "C" int kc_trace_begin(unsigned cap) {
    (void)cap;
    return CM_EUNSUPPORTED;
}
extern "C" int kc_trace_end(kc_trace_rec *out, unsigned cap, unsigned *n_out) {
    (void)out, (void)cap, (void)n_out;
    return CM_EUNSUPPORTED;
}
#endif
