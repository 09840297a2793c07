/* gpu_plan: the GPU-host programs set kernel-plan fields (kcuda.h kc_plan) for their A/B arms
 * and checks. Header-only, test code only. */
#ifndef ARKA_GPU_PLAN_H
#define ARKA_GPU_PLAN_H

#include "kernels/cuda/kcuda.h"

#include <stdio.h>

/* The installed plan with the quantized tensor-core matmul at its default limits (on) or never
 * taken (off: dequantize + cuBLAS past the GEMV). */
static inline void gpu_plan_gemmq(int on) {
    kc_plan p = *kc_plan_get(), d;
    kc_plan_default(&d);
    for (int i = 0; i < KC_N_QTYPES; i++) p.gemmq_max_tok[i] = on ? d.gemmq_max_tok[i] : 0;
    kc_plan_set(&p);
}

static inline void gpu_plan_norm_split(int on) { /* on: split rows at every token count */
    kc_plan p = *kc_plan_get();
    p.norm_split = on ? 1 << 20 : 0;
    kc_plan_set(&p);
}

/* Plan fields from a program's argument (key=value[,...], kc_plan_override) into p: 0, or 2 after
 * printing what was wrong. */
static inline int gpu_plan_args(kc_plan *p, const char *spec, const char *prog) {
    char err[256];
    if (!kc_plan_override(p, spec, err, sizeof err)) return 0;
    fprintf(stderr, "%s: %s\n", prog, err);
    return 2;
}

/* The installed plan with Q8_0 and Q4_K on the integer GEMV up to n tokens (kc_plan.qgemv_max_tok);
 * returns the value it replaced. */
static inline int gpu_plan_qgemv(int n) {
    kc_plan p = *kc_plan_get();
    const int was = p.qgemv_max_tok;
    p.qgemv_max_tok = n;
    kc_plan_set(&p);
    return was;
}

static inline void gpu_plan_pdl(int on) {
    kc_plan p = *kc_plan_get();
    p.pdl = on;
    kc_plan_set(&p);
}

#endif
