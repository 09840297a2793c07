/* ops: RMSNorm, RoPE, SwiGLU, softmax, add (scalar C, row-wise). */
#include "ops.h"
#include "../../common/cm_err.h"

#include <math.h>
#include <string.h>

void k_rmsnorm(const float *x, const float *w, int64_t n_tok, int64_t n, float eps, float *y) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xr = x + t * n;
        float *yr = y + t * n;
        /* Four partial double sums: the same for every row of every call. */
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            s0 += (double)xr[i] * xr[i];
            s1 += (double)xr[i + 1] * xr[i + 1];
            s2 += (double)xr[i + 2] * xr[i + 2];
            s3 += (double)xr[i + 3] * xr[i + 3];
        }
        for (; i < n; i++) s0 += (double)xr[i] * xr[i];
        double ms = (s0 + s1 + s2 + s3) / (double)n;
        float r = (float)(1.0 / sqrt(ms + (double)eps));
        for (i = 0; i < n; i++) yr[i] = xr[i] * r * w[i];
    }
}

int k_rope_init_layer(k_rope_params *rp, const mdl_rope *r, int n_ctx) {
    int d = r->dim;
    if (d <= 0 || d % 2 || d > K_ROPE_MAX_DIM) return CM_EINVAL;
    rp->rope_dim = d;
    rp->layout = r->layout;
    rp->mscale = r->attn_factor > 0 ? r->attn_factor : 1.0;
    double base = r->base > 0 ? r->base : 10000.0;
    double factor = r->factor > 0 ? r->factor : 1.0;
    /* yarn's correction range, in pairs (transformers' find_correction_range, truncated) */
    double lo = 0, hi = 0;
    if (r->scaling == MDL_ROPE_SCALING_YARN) {
        double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
        lo = floor(d * log(r->orig_ctx / (bf * 2 * M_PI)) / (2 * log(base)));
        hi = ceil(d * log(r->orig_ctx / (bs * 2 * M_PI)) / (2 * log(base)));
        if (lo < 0) lo = 0;
        if (hi > d - 1) hi = d - 1;
        if (lo == hi) hi += 0.001;
    }
    const float *ext = r->scaling != MDL_ROPE_SCALING_LONGROPE ? NULL : n_ctx > r->orig_ctx ? r->long_factor : r->short_factor;
    for (int i = 0; i < d / 2; i++) {
        double f = pow(base, -2.0 * i / d);
        if (r->scaling == MDL_ROPE_SCALING_LINEAR) {
            f /= factor;
        } else if (r->scaling == MDL_ROPE_SCALING_LLAMA3) {
            double lf = r->low_freq_factor, hf = r->high_freq_factor, orig = r->orig_ctx;
            double lo_wl = orig / lf, hi_wl = orig / hf;
            double wl = 2.0 * M_PI / f;
            if (wl < hi_wl) {
                /* high frequency: unchanged */
            } else if (wl > lo_wl) {
                f /= factor;
            } else {
                double smooth = (orig / wl - lf) / (hf - lf);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        } else if (r->scaling == MDL_ROPE_SCALING_YARN) {
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrap = 1 - ramp; /* 1: keep the original frequency */
            f = f / factor * (1 - extrap) + f * extrap;
        } else if (ext) {
            f /= ext[i];
        }
        rp->inv_freq[i] = f;
    }
    return 0;
}

int k_rope_init(k_rope_params *rp, const mdl_config *c) {
    mdl_rope r;
    mdl_layer_rope(c, 0, &r);
    if (r.base <= 0) r.base = 10000.0f;
    return k_rope_init_layer(rp, &r, c->n_ctx_train);
}

void k_rope(const k_rope_params *rp, float *x, int64_t n_tok, int n_head, int head_dim, const int32_t *pos) {
    int half = rp->rope_dim / 2;
    float cs[K_ROPE_MAX_DIM / 2], sn[K_ROPE_MAX_DIM / 2];
    for (int64_t t = 0; t < n_tok; t++) {
        for (int i = 0; i < half; i++) {
            double a = (double)pos[t] * rp->inv_freq[i];
            cs[i] = (float)(cos(a) * rp->mscale);
            sn[i] = (float)(sin(a) * rp->mscale);
        }
        for (int h = 0; h < n_head; h++) {
            float *v = x + (t * n_head + h) * (int64_t)head_dim;
            if (rp->layout == MDL_ROPE_HALF) {
                for (int i = 0; i < half; i++) {
                    float a = v[i], b = v[i + half];
                    v[i] = a * cs[i] - b * sn[i];
                    v[i + half] = a * sn[i] + b * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * cs[i] - b * sn[i];
                    v[2 * i + 1] = a * sn[i] + b * cs[i];
                }
            }
        }
    }
}

void k_swiglu(const float *gate, const float *up, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void k_geglu(const float *gate, const float *up, int64_t n, float *out) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void k_softcap(float *x, int64_t n, float cap) {
    float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] * inv);
}

void k_scale(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void k_topk_route(const float *logits, int n, int k, int norm, int32_t *idx, float *w) {
    float p[MDL_MAX_EXPERTS];
    float mx = logits[0];
    for (int e = 1; e < n; e++) if (logits[e] > mx) mx = logits[e];
    float sum = 0.0f;
    for (int e = 0; e < n; e++) { p[e] = expf(logits[e] - mx); sum += p[e]; }
    for (int e = 0; e < n; e++) p[e] /= sum;
    /* selection: k passes, each the largest remaining (the first of equals) */
    uint8_t taken[MDL_MAX_EXPERTS] = { 0 };
    float tot = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        idx[j] = best;
        w[j] = p[best];
        tot += p[best];
    }
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= tot;
}

void k_softmax(float *x, int64_t n) {
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) { x[i] = expf(x[i] - mx); sum += x[i]; }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void k_add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

void k_add_bias(float *x, const float *b, int64_t n_tok, int64_t n) {
    for (int64_t t = 0; t < n_tok; t++) k_add(x + t * n, b, n);
}
