/* ops: RMSNorm, RoPE, SwiGLU, softmax, add (scalar C, row-wise). */
#include "ops.h"
#include "../../common/cm_err.h"

#include <math.h>

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

int k_rope_init(k_rope_params *rp, const mdl_config *c) {
    int d = c->rope_dim;
    if (d <= 0 || d % 2 || d > K_ROPE_MAX_DIM) return CM_EINVAL;
    rp->rope_dim = d;
    rp->layout = c->rope_layout;
    double base = c->rope_base > 0 ? c->rope_base : 10000.0;
    double factor = c->rope_factor > 0 ? c->rope_factor : 1.0;
    for (int i = 0; i < d / 2; i++) {
        double f = pow(base, -2.0 * i / d);
        if (c->rope_scaling == MDL_ROPE_SCALING_LINEAR) {
            f /= factor;
        } else if (c->rope_scaling == MDL_ROPE_SCALING_LLAMA3) {
            double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor, orig = c->rope_orig_ctx;
            double lo_wl = orig / lo, hi_wl = orig / hi;
            double wl = 2.0 * M_PI / f;
            if (wl < hi_wl) {
                /* high frequency: unchanged */
            } else if (wl > lo_wl) {
                f /= factor;
            } else {
                double smooth = (orig / wl - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        rp->inv_freq[i] = f;
    }
    return 0;
}

void k_rope(const k_rope_params *rp, float *x, int64_t n_tok, int n_head, int head_dim, const int32_t *pos) {
    int half = rp->rope_dim / 2;
    float cs[K_ROPE_MAX_DIM / 2], sn[K_ROPE_MAX_DIM / 2];
    for (int64_t t = 0; t < n_tok; t++) {
        for (int i = 0; i < half; i++) {
            double a = (double)pos[t] * rp->inv_freq[i];
            cs[i] = (float)cos(a);
            sn[i] = (float)sin(a);
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
