/* CPU ops (RMSNorm, RoPE with yarn / longrope / attention factor, SwiGLU, GeGLU, soft-capping,
 * softmax, add, expert routing) and paged attention (full, and windowed + soft-capped with the
 * blocks behind the window taken away) against scalar double references on random inputs;
 * bounds of the KV store; thread-count invariance. */
#include "kernels/cpu/attn.h"
#include "kernels/cpu/kcpu.h"
#include "kernels/cpu/ops.h"
#include "common/cm_err.h"
#include "model/dtype.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x1234567;
static double urand(void) { /* [0,1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(float a) { return (float)((urand() * 2 - 1) * a); }

/* max |a-b| / max(|b|, floor) over n values */
static double rel_err(const float *a, const double *b, int64_t n, double floor) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), floor);
        if (d > e || isnan(d)) e = isnan(d) ? INFINITY : d;
    }
    return e;
}

static void test_rmsnorm(void) {
    int T = 5, n = 300;
    float *x = malloc(sizeof(float) * T * n), *w = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * T * n);
    double *r = malloc(sizeof(double) * T * n);
    for (int i = 0; i < T * n; i++) x[i] = frand(3);
    for (int i = 0; i < n; i++) w[i] = frand(2);
    for (int i = 0; i < T * n; i++) y[i] = NAN;
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[t * n + i] * x[t * n + i];
        double s = 1.0 / sqrt(ss / n + 1e-5);
        for (int i = 0; i < n; i++) r[t * n + i] = x[t * n + i] * s * w[i];
    }
    k_rmsnorm(x, w, T, n, 1e-5f, y);
    T_CHECKF(rel_err(y, r, T * n, 1e-3) < 1e-5, "rmsnorm rel err %g", rel_err(y, r, T * n, 1e-3));
    k_rmsnorm(x, w, T, n, 1e-5f, x); /* in place gives the same */
    T_CHECK(memcmp(x, y, sizeof(float) * T * n) == 0);
    free(x); free(w); free(y); free(r);
}

/* Double reference of the rotation with the scaling written out independently. */
static void rope_ref(const mdl_config *c, const float *x, double *y, int T, int H, int D, const int32_t *pos) {
    int rd = c->rope_dim, half = rd / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *v = x + (t * H + h) * D;
            double *o = y + (t * H + h) * D;
            for (int d = 0; d < D; d++) o[d] = v[d];
            for (int i = 0; i < half; i++) {
                double f = 1.0 / pow((double)c->rope_base, (2.0 * i) / rd);
                if (c->rope_scaling == MDL_ROPE_SCALING_LINEAR) f /= c->rope_factor;
                if (c->rope_scaling == MDL_ROPE_SCALING_LLAMA3) {
                    double wl = 2 * M_PI / f, lo = c->rope_orig_ctx / c->rope_low_freq_factor,
                           hi = c->rope_orig_ctx / c->rope_high_freq_factor;
                    if (wl > lo) f = f / c->rope_factor;
                    else if (wl >= hi) {
                        double sm = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) /
                                    (c->rope_high_freq_factor - c->rope_low_freq_factor);
                        f = (1 - sm) * f / c->rope_factor + sm * f;
                    }
                }
                double a = pos[t] * f, cs = cos(a), sn = sin(a);
                int i0 = c->rope_layout == MDL_ROPE_HALF ? i : 2 * i;
                int i1 = c->rope_layout == MDL_ROPE_HALF ? i + half : 2 * i + 1;
                o[i0] = v[i0] * cs - v[i1] * sn;
                o[i1] = v[i0] * sn + v[i1] * cs;
            }
        }
}

static void test_rope(void) {
    int T = 7, H = 3, D = 64;
    int32_t pos[7] = { 0, 1, 2, 17, 300, 4095, 70000 };
    float *x = malloc(sizeof(float) * T * H * D), *y = malloc(sizeof(float) * T * H * D);
    double *r = malloc(sizeof(double) * T * H * D);
    for (int i = 0; i < T * H * D; i++) x[i] = frand(2);
    struct { int layout, scaling, rope_dim; float base, factor; } cases[] = {
        { MDL_ROPE_ADJACENT, MDL_ROPE_SCALING_NONE, 64, 10000.0f, 1 },
        { MDL_ROPE_HALF, MDL_ROPE_SCALING_NONE, 64, 1000000.0f, 1 },
        { MDL_ROPE_ADJACENT, MDL_ROPE_SCALING_LINEAR, 64, 10000.0f, 4 },
        { MDL_ROPE_HALF, MDL_ROPE_SCALING_LLAMA3, 64, 500000.0f, 8 },
        { MDL_ROPE_ADJACENT, MDL_ROPE_SCALING_LLAMA3, 64, 500000.0f, 32 },
        { MDL_ROPE_HALF, MDL_ROPE_SCALING_NONE, 32, 10000.0f, 1 },     /* partial rotation */
        { MDL_ROPE_ADJACENT, MDL_ROPE_SCALING_NONE, 16, 10000.0f, 1 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        mdl_config c;
        memset(&c, 0, sizeof c);
        c.rope_dim = cases[k].rope_dim; c.rope_base = cases[k].base; c.rope_layout = cases[k].layout;
        c.rope_scaling = cases[k].scaling; c.rope_factor = cases[k].factor;
        c.rope_low_freq_factor = 1; c.rope_high_freq_factor = 4; c.rope_orig_ctx = 8192;
        k_rope_params rp;
        T_EQ_INT(k_rope_init(&rp, &c), 0);
        memcpy(y, x, sizeof(float) * T * H * D);
        k_rope(&rp, y, T, H, D, pos);
        rope_ref(&c, x, r, T, H, D, pos);
        double e = 0;
        for (int i = 0; i < T * H * D; i++) e = fmax(e, fabs(y[i] - r[i]));
        /* |x| <= 2: absolute error of a float rotation of float inputs */
        T_CHECKF(e < 2e-6, "rope case %zu: max abs err %g", k, e);
        if (c.rope_dim < D) { /* untouched tail */
            int same = 1;
            for (int t = 0; t < T * H; t++)
                for (int d = c.rope_dim; d < D; d++) same &= y[t * D + d] == x[t * D + d];
            T_CHECK(same);
        }
    }
    mdl_config bad;
    memset(&bad, 0, sizeof bad);
    bad.rope_dim = 7;
    k_rope_params rp;
    T_EQ_INT(k_rope_init(&rp, &bad), CM_EINVAL);
    free(x); free(y); free(r);
}

static void test_swiglu_softmax_add(void) {
    int n = 1000;
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n);
    double *r = malloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) { g[i] = frand(12); u[i] = frand(3); o[i] = NAN; }
    for (int i = 0; i < n; i++) r[i] = g[i] / (1 + exp(-(double)g[i])) * u[i];
    k_swiglu(g, u, n, o);
    T_CHECKF(rel_err(o, r, n, 1e-2) < 2e-6, "swiglu %g", rel_err(o, r, n, 1e-2));

    for (int i = 0; i < n; i++) o[i] = frand(30);
    double mx = -1e300, s = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, o[i]);
    for (int i = 0; i < n; i++) s += exp(o[i] - mx);
    for (int i = 0; i < n; i++) r[i] = exp(o[i] - mx) / s;
    k_softmax(o, n);
    T_CHECKF(rel_err(o, r, n, 1e-30) < 1e-5, "softmax %g", rel_err(o, r, n, 1e-30));
    double tot = 0;
    for (int i = 0; i < n; i++) tot += o[i];
    T_NEAR(tot, 1.0, 1e-5);
    float one = 5.0f;
    k_softmax(&one, 1);
    T_CHECK(one == 1.0f);

    for (int i = 0; i < n; i++) { g[i] = frand(1); u[i] = frand(1); r[i] = (double)g[i] + u[i]; }
    k_add(g, u, n);
    T_CHECKF(rel_err(g, r, n, 1e-3) < 1e-6, "add");
    float xb[6] = { 1, 2, 3, 4, 5, 6 }, bb[3] = { 10, 20, 30 };
    k_add_bias(xb, bb, 2, 3);
    T_CHECK(xb[0] == 11 && xb[2] == 33 && xb[3] == 14 && xb[5] == 36);
    free(g); free(u); free(o); free(r);
}

/* Paged attention: 3 sequences with scattered block tables, GQA 8:2, block size 4 (many
 * blocks per sequence), queries at mixed positions (prefill chunk + decode). */
static void test_attention(void) {
    enum { H = 8, HKV = 2, D = 32, BS = 4, NB = 64, S = 3 };
    int lens[S] = { 19, 1, 37 };       /* context length after the step */
    int n_new[S] = { 6, 1, 3 };        /* new tokens this step */
    int T = 0;
    for (int s = 0; s < S; s++) T += n_new[s];
    int64_t row = HKV * D;
    float *kp = malloc(sizeof(float) * NB * BS * row), *vp = malloc(sizeof(float) * NB * BS * row);
    for (int64_t i = 0; i < NB * BS * row; i++) { kp[i] = NAN; vp[i] = NAN; } /* poison */
    int32_t bt[S * 16], nblk[S];
    /* a shuffled permutation of blocks so sequences interleave in the pool */
    int32_t perm[NB];
    for (int i = 0; i < NB; i++) perm[i] = i;
    for (int i = NB - 1; i > 0; i--) { int j = (int)(urand() * (i + 1)); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int used = 0;
    for (int s = 0; s < S; s++) {
        nblk[s] = (lens[s] + BS - 1) / BS;
        for (int j = 0; j < nblk[s]; j++) bt[s * 16 + j] = perm[used++];
    }
    /* full K/V per sequence [len, HKV, D], the old part stored directly, new part via k_kv_write */
    float *K[S], *V[S];
    int32_t *tpos = malloc(sizeof(int32_t) * T), *tseq = malloc(sizeof(int32_t) * T);
    float *knew = malloc(sizeof(float) * T * row), *vnew = malloc(sizeof(float) * T * row);
    int t = 0;
    for (int s = 0; s < S; s++) {
        K[s] = malloc(sizeof(float) * lens[s] * row);
        V[s] = malloc(sizeof(float) * lens[s] * row);
        for (int i = 0; i < lens[s] * row; i++) { K[s][i] = frand(1.5f); V[s][i] = frand(1); }
        for (int p = 0; p < lens[s]; p++) {
            if (p < lens[s] - n_new[s]) {
                int64_t b = bt[s * 16 + p / BS];
                memcpy(kp + (b * BS + p % BS) * row, K[s] + p * row, sizeof(float) * row);
                memcpy(vp + (b * BS + p % BS) * row, V[s] + p * row, sizeof(float) * row);
            } else {
                tpos[t] = p; tseq[t] = s;
                memcpy(knew + t * row, K[s] + p * row, sizeof(float) * row);
                memcpy(vnew + t * row, V[s] + p * row, sizeof(float) * row);
                t++;
            }
        }
    }
    float *q = malloc(sizeof(float) * T * H * D), *out = malloc(sizeof(float) * T * H * D),
          *out2 = malloc(sizeof(float) * T * H * D);
    double *ref = malloc(sizeof(double) * T * H * D);
    for (int i = 0; i < T * H * D; i++) { q[i] = frand(1.5f); out[i] = NAN; out2[i] = NAN; }
    k_attn_args a = { .n_tok = T, .n_head = H, .n_head_kv = HKV, .head_dim = D, .block_size = BS,
                      .scale = 1.0f / sqrtf(D), .q = q, .out = out, .tok_pos = tpos, .tok_seq = tseq,
                      .block_tables = bt, .bt_stride = 16, .n_blocks = nblk, .k_pool = kp, .v_pool = vp,
                      .n_pool_blocks = NB };
    T_EQ_INT(k_kv_write(&a, knew, vnew), 0);
    k_pool *p1, *p2;
    k_pool_create(1, &p1);
    k_pool_create(2, &p2);
    T_EQ_INT(k_attn_paged(p2, &a), 0);
    a.out = out2;
    T_EQ_INT(k_attn_paged(p1, &a), 0);
    T_CHECK(memcmp(out, out2, sizeof(float) * T * H * D) == 0); /* thread count invariance */
    /* reference */
    for (t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int s = tseq[t], p = tpos[t], kh = h / (H / HKV);
            double sc[64], mx = -1e300, sum = 0;
            for (int j = 0; j <= p; j++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)q[(t * H + h) * D + i] * K[s][j * row + kh * D + i];
                sc[j] = d / sqrt((double)D);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int j = 0; j <= p; j++) o += sc[j] * V[s][j * row + kh * D + i];
                ref[(t * H + h) * D + i] = o / sum;
            }
        }
    double e = 0;
    for (int i = 0; i < T * H * D; i++) e = fmax(e, fabs(out[i] - ref[i]));
    T_CHECKF(e < 1e-5, "attention max abs err %g", e);

    /* the result of a token does not depend on the other tokens of the call: run sequence 2's
     * last token alone */
    {
        float o1[H * D];
        k_attn_args b = a;
        b.n_tok = 1; b.q = q + (T - 1) * H * D; b.out = o1; b.tok_pos = tpos + T - 1; b.tok_seq = tseq + T - 1;
        T_EQ_INT(k_attn_paged(p2, &b), 0);
        T_CHECK(memcmp(o1, out + (T - 1) * H * D, sizeof o1) == 0);
    }
    /* bounds: a position beyond the block table, a block id outside the pool */
    {
        k_attn_args b = a;
        int32_t badpos = lens[0] + BS * 8;
        b.n_tok = 1; b.tok_pos = &badpos; b.tok_seq = tseq; b.out = out2;
        T_EQ_INT(k_kv_write(&b, knew, vnew), CM_EINVAL);
        T_EQ_INT(k_attn_paged(p2, &b), CM_EINVAL);
        int32_t bt2[16], nb1 = 2;
        bt2[0] = 0; bt2[1] = NB; /* second block outside */
        int32_t pos5 = 5, s0 = 0;
        b.block_tables = bt2; b.n_blocks = &nb1; b.tok_pos = &pos5; b.tok_seq = &s0;
        T_EQ_INT(k_kv_write(&b, knew, vnew), CM_EINVAL);
        T_EQ_INT(k_attn_paged(p1, &b), CM_EINVAL);
    }
    /* sliding window of 5 with soft-capping: the blocks wholly before every query's window are
     * removed from the table (-1), as the KV cache frees them */
    {
        enum { W = 5 };
        const float cap = 1.5f;
        int32_t bt3[S * 16];
        memcpy(bt3, bt, sizeof bt3);
        for (int s = 0; s < S; s++) {
            int first = lens[s] - n_new[s] - W + 1; /* the earliest position the step's queries read */
            for (int j = 0; j < nblk[s] && first > 0 && (j + 1) * BS <= first; j++) bt3[s * 16 + j] = -1;
        }
        k_attn_args b = a;
        b.block_tables = bt3;
        b.window = W;
        b.softcap = cap;
        b.out = out2;
        T_EQ_INT(k_attn_paged(p2, &b), 0);
        for (t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                int s = tseq[t], p = tpos[t], kh = h / (H / HKV), j0 = p - W + 1 > 0 ? p - W + 1 : 0;
                double sc[64], mx = -1e300, sum = 0;
                for (int j = j0; j <= p; j++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)q[(t * H + h) * D + i] * K[s][j * row + kh * D + i];
                    sc[j] = cap * tanh(d / sqrt((double)D) / cap);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = j0; j <= p; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int j = j0; j <= p; j++) o += sc[j] * V[s][j * row + kh * D + i];
                    ref[(t * H + h) * D + i] = o / sum;
                }
            }
        e = 0;
        for (int i = 0; i < T * H * D; i++) e = fmax(e, fabs(out2[i] - ref[i]));
        T_CHECKF(e < 1e-5, "windowed soft-capped attention max abs err %g", e);
        /* without the window the freed blocks would be read: refused */
        b.window = 0;
        T_EQ_INT(k_attn_paged(p1, &b), CM_EINVAL);
    }
    k_pool_destroy(p1);
    k_pool_destroy(p2);
    for (int s = 0; s < S; s++) { free(K[s]); free(V[s]); }
    free(kp); free(vp); free(tpos); free(tseq); free(knew); free(vnew); free(q); free(out); free(out2); free(ref);
}

/* The values a KV type keeps of x[D] (attn.h's rounding, written here from the dtype
 * functions): what attention must read back. st: a static scale or 0 (online, amax / 448). */
static void kv_emulate(int type, const float *x, int d, float st, float *out) {
    uint8_t buf[4 * 256];
    if (type == DT_F8_E4M3) {
        float s = st > 0 ? st : dt_fp8_scale(x, d);
        dt_fp8_encode(x, d, s, buf);
        dt_fp8_decode(buf, d, s, out);
    } else {
        dt_quantize(type, x, buf, d);
        dt_dequantize(type, buf, out, d);
    }
}

/* Attention over a cache of each KV type: the output equals double-precision attention over
 * the values the type keeps (so the kernel rounds exactly as attn.h says, no more, no less);
 * the F8_E4M3 bytes sit where attn.h puts them; k_kv_copy moves codes and scales; a static
 * scale saturates what it cannot hold; thread and batch invariance as for f32. */
static void test_attention_kv_types(void) {
    enum { H = 4, HKV = 2, D = 32, BS = 4, NB = 8, LEN = 13 };
    static const struct { int type; float st; const char *what; } cases[] = {
        { DT_F16, 0, "f16" }, { DT_F8_E4M3, 0, "fp8 online" }, { DT_F8_E4M3, 0.004f, "fp8 static" }, { DT_Q8_0, 0, "q8_0" },
    };
    T_EQ_INT(k_kv_block_bytes(DT_F8_E4M3, BS, HKV, D), BS * HKV * (D + 4));
    T_EQ_INT(k_kv_block_bytes(DT_Q8_0, BS, HKV, D), BS * HKV * 34);
    T_EQ_INT(k_kv_block_bytes(DT_Q8_0, BS, HKV, 16), 0);
    T_EQ_INT(k_kv_block_bytes(DT_F16, BS, HKV, D), BS * HKV * D * 2);
    T_EQ_INT(k_kv_block_bytes(DT_Q4_0, BS, HKV, D), 0);
    k_pool *p1, *p2;
    k_pool_create(1, &p1);
    k_pool_create(2, &p2);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int type = cases[c].type;
        const size_t blk = k_kv_block_bytes(type, BS, HKV, D);
        uint8_t *kp = malloc(blk * NB), *vp = malloc(blk * NB);
        memset(kp, 0xa5, blk * NB);
        memset(vp, 0xa5, blk * NB);
        static float K[LEN * HKV * D], V[LEN * HKV * D], Kq[LEN * HKV * D], Vq[LEN * HKV * D], q[LEN * H * D], out[LEN * H * D],
            out2[LEN * H * D];
        float kst[HKV], vst[HKV];
        for (int h = 0; h < HKV; h++) { kst[h] = cases[c].st; vst[h] = cases[c].st * 2; }
        for (int i = 0; i < LEN * HKV * D; i++) {
            K[i] = frand(2.0f) * (1 + i % 5);   /* rows of different ranges */
            V[i] = frand(1.0f);
        }
        K[7] = 0; /* a zero and a row of zeros */
        for (int i = 0; i < D; i++) V[3 * HKV * D + i] = 0;
        for (int i = 0; i < LEN * H * D; i++) q[i] = frand(1.0f);
        for (int p = 0; p < LEN; p++)
            for (int h = 0; h < HKV; h++) {
                int64_t at = ((int64_t)p * HKV + h) * D;
                kv_emulate(type, K + at, D, cases[c].st, Kq + at);
                kv_emulate(type, V + at, D, cases[c].st * 2, Vq + at);
            }
        int32_t bt[4] = { 5, 1, 6, 2 }, nb = 4, pos[LEN], seq[LEN];
        for (int p = 0; p < LEN; p++) { pos[p] = p; seq[p] = 0; }
        k_attn_args a = { .n_tok = LEN, .n_head = H, .n_head_kv = HKV, .head_dim = D, .block_size = BS, .scale = 0.2f,
                          .q = q, .out = out, .tok_pos = pos, .tok_seq = seq, .block_tables = bt, .bt_stride = 4,
                          .n_blocks = &nb, .k_pool = kp, .v_pool = vp, .n_pool_blocks = NB, .kv_type = type,
                          .k_scale = cases[c].st > 0 ? kst : NULL, .v_scale = cases[c].st > 0 ? vst : NULL };
        T_EQ_INT(k_kv_write(&a, K, V), 0);
        T_EQ_INT(k_attn_paged(p2, &a), 0);
        a.out = out2;
        T_EQ_INT(k_attn_paged(p1, &a), 0);
        T_CHECKF(!memcmp(out, out2, sizeof out), "%s: thread count changes the result", cases[c].what);
        double e = 0, moved = 0;
        for (int t = 0; t < LEN; t++)
            for (int h = 0; h < H; h++) {
                int kh = h / (H / HKV);
                double sc[LEN], mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)q[(t * H + h) * D + i] * Kq[(j * HKV + kh) * D + i];
                    sc[j] = d * 0.2;
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= t; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++) o += sc[j] * Vq[(j * HKV + kh) * D + i];
                    e = fmax(e, fabs(out[(t * H + h) * D + i] - o / sum));
                }
            }
        for (int i = 0; i < LEN * HKV * D; i++) moved = fmax(moved, fabs((double)Kq[i] - K[i]));
        printf("kv %-10s: attention vs the kept values max abs err %.2e (the type moved K by up to %.3g)\n", cases[c].what, e,
               moved);
        T_CHECKF(e < 1e-5, "%s: attention max abs err %g", cases[c].what, e);
        T_CHECKF(moved > 0, "%s: the type kept K exactly?", cases[c].what);
        if (type == DT_F8_E4M3) {
            /* position 6 (block bt[1] = 1, row 2), head 1: codes at [row][head][D], after the codes the
             * scales at [head][row] */
            const uint8_t *codes = kp + 1 * blk + ((size_t)2 * HKV + 1) * D;
            float s;
            memcpy(&s, kp + 1 * blk + (size_t)BS * HKV * D + ((size_t)1 * BS + 2) * 4, 4);
            const float *x = K + (6 * HKV + 1) * D;
            float want_s = cases[c].st > 0 ? cases[c].st : dt_fp8_scale(x, D);
            T_CHECK(s == want_s);
            int bad = 0;
            for (int i = 0; i < D; i++) bad += codes[i] != dt_f32_to_e4m3_sat(x[i] / want_s);
            T_EQ_INT(bad, 0);
            if (cases[c].st > 0) {
                int sat = 0;
                for (int i = 0; i < D; i++) sat += (codes[i] & 0x7f) == 0x7e;
                T_CHECKF(sat > 0, "a static scale of %g saturates values up to %g", cases[c].st, 448 * cases[c].st);
            }
        }
        /* the last token alone gives the same bits (batch invariance) */
        float o1[H * D];
        k_attn_args b1 = a;
        b1.n_tok = 1; b1.q = q + (LEN - 1) * H * D; b1.out = o1; b1.tok_pos = pos + LEN - 1; b1.tok_seq = seq;
        T_EQ_INT(k_attn_paged(p2, &b1), 0);
        T_CHECK(!memcmp(o1, out + (LEN - 1) * H * D, sizeof o1));
        /* k_kv_copy: block 6 (positions 8..11) copied to block 3 for 3 positions, then read through a table using it */
        T_EQ_INT(k_kv_copy(&a, 6, 3, 3), 0);
        int32_t bt2[4] = { 5, 1, 3, 2 }, pos11 = 10;
        k_attn_args b2 = a;
        b2.block_tables = bt2; b2.n_tok = 1; b2.q = q + 10 * H * D; b2.out = o1; b2.tok_pos = &pos11;
        T_EQ_INT(k_attn_paged(p2, &b2), 0);
        T_CHECKF(!memcmp(o1, out + 10 * H * D, sizeof o1), "%s: attention over the copied block differs", cases[c].what);
        T_EQ_INT(k_kv_copy(&a, 6, 3, BS + 1), CM_EINVAL);
        T_EQ_INT(k_kv_copy(&a, NB, 3, 1), CM_EINVAL);
        free(kp);
        free(vp);
    }
    /* a type without a layout, or Q8_0 heads that are not whole blocks of 32 */
    float z[64] = { 0 };
    int32_t bt0 = 0, nb1 = 1, p0 = 0, s0 = 0;
    k_attn_args bad = { .n_tok = 1, .n_head = 1, .n_head_kv = 1, .head_dim = 16, .block_size = 4, .scale = 1, .q = z, .out = z,
                        .tok_pos = &p0, .tok_seq = &s0, .block_tables = &bt0, .bt_stride = 1, .n_blocks = &nb1, .k_pool = z,
                        .v_pool = z, .n_pool_blocks = 1, .kv_type = DT_Q8_0 };
    T_EQ_INT(k_kv_write(&bad, z, z), CM_EINVAL);
    bad.kv_type = DT_Q4_0;
    T_EQ_INT(k_attn_paged(p1, &bad), CM_EINVAL);
    k_pool_destroy(p1);
    k_pool_destroy(p2);
}

static double gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

static void test_geglu_softcap_route(void) {
    enum { N = 1000 };
    float g[N], u[N], o[N];
    double r[N];
    for (int i = 0; i < N; i++) { g[i] = frand(6); u[i] = frand(2); r[i] = gelu_tanh(g[i]) * u[i]; }
    k_geglu(g, u, N, o);
    /* absolute on values of order 1: 1 + tanh(...) cancels in float for negative gates, as in PyTorch */
    T_CHECKF(rel_err(o, r, N, 1.0) < 2e-6, "geglu %g", rel_err(o, r, N, 1.0));
    float one = 1, m1 = -1, up = 1, y;
    k_geglu(&one, &up, 1, &y);
    T_NEAR(y, 0.8411919906082768, 1e-6);  /* PyTorch gelu(1, approximate='tanh') */
    k_geglu(&m1, &up, 1, &y);
    T_NEAR(y, -0.15880800939172324, 1e-6);
    float c[4] = { 0, 1, 100, -1000 };
    k_softcap(c, 4, 30);
    T_NEAR(c[0], 0, 0);
    T_NEAR(c[1], 30 * tanh(1.0 / 30), 1e-6);
    T_CHECK(c[2] < 30 && c[2] > 29.9 && c[3] >= -30 && c[3] < -29.99);
    /* routing: softmax, top-k by probability, ties to the lower index, optional renormalisation */
    float lg[5] = { 1.0f, 1.0f, 0.5f, 2.0f, -1.0f };
    int32_t idx[5];
    float w[5];
    double z = exp(1.0) * 2 + exp(0.5) + exp(2.0) + exp(-1.0);
    k_topk_route(lg, 5, 2, 0, idx, w);
    T_EQ_INT(idx[0], 3);
    T_EQ_INT(idx[1], 0); /* 0 and 1 tie: the lower index */
    T_NEAR(w[0], exp(2.0) / z, 1e-6);
    T_NEAR(w[1], exp(1.0) / z, 1e-6);
    k_topk_route(lg, 5, 3, 1, idx, w);
    T_CHECK(idx[0] == 3 && idx[1] == 0 && idx[2] == 1);
    T_NEAR(w[0] + w[1] + w[2], 1, 1e-6);
    T_NEAR(w[1], exp(1.0) / (exp(2.0) + 2 * exp(1.0)), 1e-6);
    k_topk_route(lg, 5, 5, 0, idx, w);
    T_CHECK(idx[0] == 3 && idx[1] == 0 && idx[2] == 1 && idx[3] == 2 && idx[4] == 4);
}

/* yarn and longrope frequencies (written from transformers' formulas) and the attention
 * factor on cos/sin. */
static void test_rope_scaling(void) {
    const int d = 16;
    mdl_rope r = { .dim = d, .layout = MDL_ROPE_HALF, .scaling = MDL_ROPE_SCALING_YARN, .base = 10000, .factor = 4,
                   .beta_fast = 32, .beta_slow = 1, .attn_factor = 1.5f, .orig_ctx = 16 };
    k_rope_params rp;
    T_EQ_INT(k_rope_init_layer(&rp, &r, 64), 0);
    double lo = floor(d * log(16 / (32 * 2 * M_PI)) / (2 * log(10000.0))), hi = ceil(d * log(16 / (1 * 2 * M_PI)) / (2 * log(10000.0)));
    lo = fmax(lo, 0);
    hi = fmin(hi, d - 1);
    double worst = 0;
    for (int i = 0; i < d / 2; i++) {
        double b = pow(10000.0, 2.0 * i / d), ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1), ef = 1 - ramp;
        double want = 1 / (4 * b) * (1 - ef) + 1 / b * ef;
        worst = fmax(worst, fabs(rp.inv_freq[i] - want) / want);
    }
    T_CHECKF(worst < 1e-12, "yarn inv_freq %g", worst);
    T_NEAR(rp.mscale, 1.5, 1e-7);
    /* position 0 rotates nothing but scales by the factor */
    float x[16], x0[16];
    for (int i = 0; i < 16; i++) x[i] = x0[i] = frand(1);
    int32_t p0 = 0;
    k_rope(&rp, x, 1, 1, 16, &p0);
    for (int i = 0; i < 16; i++) T_NEAR(x[i], 1.5 * x0[i], 1e-6);
    const float lf[4] = { 1, 2, 3, 4 }, sf[4] = { 1.5f, 1.5f, 1.5f, 1.5f };
    mdl_rope l = { .dim = 8, .layout = MDL_ROPE_HALF, .scaling = MDL_ROPE_SCALING_LONGROPE, .base = 10000, .attn_factor = 1,
                   .orig_ctx = 32, .long_factor = lf, .short_factor = sf };
    for (int ctx = 32; ctx <= 33; ctx++) {
        T_EQ_INT(k_rope_init_layer(&rp, &l, ctx), 0);
        for (int i = 0; i < 4; i++) {
            double want = 1 / ((ctx > 32 ? lf[i] : sf[i]) * pow(10000.0, 2.0 * i / 8));
            T_NEAR(rp.inv_freq[i], want, 1e-12 * want);
        }
    }
}

int main(void) {
    test_geglu_softcap_route();
    test_rope_scaling();
    test_rmsnorm();
    test_rope();
    test_swiglu_softmax_add();
    test_attention();
    test_attention_kv_types();
    return t_done();
}
