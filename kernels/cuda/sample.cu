// sample: the executor's sampler on the device (one CTA per logits row), and argmax.
//
// kc_sample follows executor/sampler.h step by step with the same float and double operations
// (explicit _rn intrinsics, so nothing is contracted into an FMA). Where the CPU sorts the
// candidates, the device selects: every candidate has a unique 64-bit key
//     key = mono(value) << 32 | (n_vocab - 1 - id)
// (mono: the order-preserving uint32 image of a float, -0 folded onto +0), so "larger key" is
// exactly the CPU's order (value desc, id asc). A select finds the first key, in descending
// order, at which a running count or probability mass reaches a target:
//   pass: a histogram of the bucket [lo, hi] into 256 bins of equal key width (per-warp bins,
//         same-bin lanes summed in lane order, warps merged in order: deterministic),
//         a scan of the bins to the one where the target is reached, which becomes the bucket;
//   end:  once the bucket holds <= 64 members they are gathered, ordered by key and walked
//         one by one, as the CPU walks its sorted candidates.
// top-k is a count select over all ids, top-p a mass select over the top-k (or min-p)
// candidates, the draw a mass select over what top-p and min-p keep, the top logprobs a count
// select over the log-probability keys. Masses are exp(z - z_max) in double; the CPU divides
// them by their sum first and adds them one by one in sorted order, the device adds them in a
// different order, so the two agree except where a running sum and the target straddle each
// other within double rounding (documented in executor/cuda/cuda_sample.h).
//
// The algorithm is written once against a small "block" interface: dev_blk (1,024 threads,
// shared memory) for the kernel, host_blk (one thread) for kc_sample_host, which tests run
// without a GPU.
#include "kc_common.cuh"

extern "C" {
#include "kcuda.h"
}
#include "common/cm_philox.h" /* the draw: the same cm_philox_u01 as ex_rng_u01 (executor/sampler.h) */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HD __host__ __device__ inline

/* A row's passes over the vocabulary are the sampler's time: 1,024 threads a row rather than 512
 * (H200, 128 rows of 128,256 N(0, 1) logits, T = 0.8, top_p = 0.95: 0.960 -> 0.621 ms;
 * bench/RESULTS.md "2026-11-29 (fifteenth session)") */
enum { S_THREADS = 1024, S_WARPS = S_THREADS / 32, S_BINS = 256, S_GATHER = 64 };
/* A pass over a row loads S_UNROLL of each thread's elements before it works on any: with one
 * load in flight a thread, every pass waited on memory (H200, 128 rows of 128,256 logits at
 * T = 1, top_p = 0.9: 0.665 -> 0.430 ms; bench/RESULTS.md "2026-11-29 (ninth session)"). */
enum { S_UNROLL = 8 };
enum { SET_ALL, SET_C0, SET_C1, SET_C2, SET_LP }; /* candidate sets; C2 within C1 within C0 */
enum { C0_ALL, C0_KEY, C0_VAL };
#define S_HIST_BYTES ((size_t)S_WARPS * S_BINS * (sizeof(uint32_t) + sizeof(double)))

static_assert(sizeof(kc_sample_row) % 8 == 0, "pool rows keep 8-byte alignment");
static_assert(S_HIST_BYTES >= KC_SAMPLE_MAX_WINDOW * sizeof(int32_t), "the window sort reuses the histogram memory");

/* ---- exact arithmetic (never contracted) --------------------------------------------------- */

#ifdef __CUDA_ARCH__
HD float f_add(float a, float b) { return __fadd_rn(a, b); }
HD float f_sub(float a, float b) { return __fsub_rn(a, b); }
HD float f_mul(float a, float b) { return __fmul_rn(a, b); }
HD float f_div(float a, float b) { return __fdiv_rn(a, b); }
HD double d_add(double a, double b) { return __dadd_rn(a, b); }
HD double d_sub(double a, double b) { return __dsub_rn(a, b); }
HD double d_mul(double a, double b) { return __dmul_rn(a, b); }
HD double d_div(double a, double b) { return __ddiv_rn(a, b); }
HD uint32_t f_bits(float f) { return __float_as_uint(f); }
HD float bits_f(uint32_t u) { return __uint_as_float(u); }
HD int clz64(uint64_t v) { return __clzll((long long)v); }
#else
/* host: x86-64 without -mfma has no FMA to contract into; sample.cu is also built with
 * -ffp-contract=off (CMakeLists.txt) */
HD float f_add(float a, float b) { return a + b; }
HD float f_sub(float a, float b) { return a - b; }
HD float f_mul(float a, float b) { return a * b; }
HD float f_div(float a, float b) { return a / b; }
HD double d_add(double a, double b) { return a + b; }
HD double d_sub(double a, double b) { return a - b; }
HD double d_mul(double a, double b) { return a * b; }
HD double d_div(double a, double b) { return a / b; }
HD uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
HD float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
HD int clz64(uint64_t v) { return __builtin_clzll(v); }
#endif

/* Order-preserving image of a float (NaN aside); -0 and +0 compare equal, so they share one. */
HD uint32_t mono(float f) {
    uint32_t u = f == 0.0f ? 0u : f_bits(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
HD float mono_inv(uint32_t m) { return bits_f((m & 0x80000000u) ? (m & 0x7fffffffu) : ~m); }
HD uint64_t ckey(float v, int id, int V) { return ((uint64_t)mono(v) << 32) | (uint32_t)(V - 1 - id); }
HD int key_id(uint64_t key, int V) { return V - 1 - (int)(uint32_t)key; }

/* ---- one row's state and its candidate sets ------------------------------------------------ */

typedef struct rowctx {
    float *z;          /* [V] logits, bias and penalties applied in place */
    int V;
    float inv_t, zt0;  /* 1/T (float, as the CPU), max of z * inv_t */
    int c0_mode;       /* C0: all, key >= k0 (top-k), or zt >= thr_pre (min-p before the sort) */
    uint64_t k0;
    double thr_pre;
    int c1_on;         /* C1: C0 and key >= k1 (top-p) */
    uint64_t k1;
    int c2_on;         /* C2: C1 and e / S >= pthr (min-p after top-p) */
    double S, pthr;
    double inv_t_d, lse; /* logprobs: 1/T in double (1 when greedy), log-sum-exp */
} rowctx;

HD float lp_of(const rowctx &c, float z) { return (float)d_sub(d_mul((double)z, c.inv_t_d), c.lse); }

/* Membership of element i (value zi = c.z[i]) in set (all but the C2 filter, which needs the
 * mass) and its key. */
HD bool member_key_z(const rowctx &c, int set, int i, float zi, uint64_t &key, float &zt) {
    if (set == SET_LP) {
        key = ckey(lp_of(c, zi), i, c.V);
        return true;
    }
    zt = f_mul(zi, c.inv_t);
    key = ckey(zt, i, c.V);
    if (set == SET_ALL) return true;
    if (c.c0_mode == C0_KEY && key < c.k0) return false;
    if (c.c0_mode == C0_VAL && !((double)zt >= c.thr_pre)) return false;
    if (set >= SET_C1 && c.c1_on && key < c.k1) return false;
    return true;
}
HD bool member_key(const rowctx &c, int set, int i, uint64_t &key, float &zt) {
    return member_key_z(c, set, i, c.z[i], key, zt);
}

/* The unnormalised probability exp(zt - zt0) (the CPU's pr[i] * sum), and the C2 filter. */
HD bool weigh(const rowctx &c, int set, float zt, double &w) {
    w = exp(d_sub((double)zt, (double)c.zt0));
    return !(set == SET_C2 && c.c2_on && !(d_div(w, c.S) >= c.pthr));
}

typedef struct scan_res {
    int found;          /* the target is reached in bin `bin` (else: bin = last non-empty) */
    int bin;
    uint32_t bin_count; /* members in that bin */
    double before;      /* mass of the members before that bin (running, from earlier passes) */
    uint32_t before_c;  /* their count */
    double total;       /* mass of the pass's members */
    double target;
} scan_res;

/* ---- the device block ------------------------------------------------------------------------ */

struct dev_blk {
    uint32_t *hc;    /* [S_WARPS][S_BINS] per-warp counts (dynamic shared) */
    double *hm;      /* [S_WARPS][S_BINS] per-warp masses */
    double *wsc;     /* [S_WARPS][32] a warp's lanes' masses */
    uint32_t *bc;    /* [S_BINS] merged */
    double *bm;
    uint64_t *gk, *gk_raw; /* [S_GATHER] gathered keys: ordered desc / as found */
    double *gw, *gw_raw;
    int *gn;
    uint64_t *red;   /* [S_WARPS + 1] reduction scratch */
    scan_res *sr;

    HD int tid() const {
#ifdef __CUDA_ARCH__
        return threadIdx.x;
#else
        return 0;
#endif
    }
    HD int nt() const { return S_THREADS; }
    HD void sync() {
#ifdef __CUDA_ARCH__
        __syncthreads();
#endif
    }
    HD int32_t *win() { return (int32_t *)hc; }

#ifdef __CUDA_ARCH__
    template <class T, class Op> __device__ T reduce(T v, Op op) {
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
        T *r = (T *)red;
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        __syncthreads();
        if (lane == 0) r[warp] = v;
        __syncthreads();
        if (threadIdx.x == 0) {
            T a = r[0];
            for (int w = 1; w < S_WARPS; w++) a = op(a, r[w]);
            r[S_WARPS] = a;
        }
        __syncthreads();
        T out = r[S_WARPS];
        __syncthreads();
        return out;
    }
    struct op_maxf { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
    struct op_minf { __device__ float operator()(float a, float b) const { return fminf(a, b); } };
    struct op_maxk { __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; } };
    struct op_mink { __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a < b ? a : b; } };
    struct op_sumd { __device__ double operator()(double a, double b) const { return __dadd_rn(a, b); } };
#endif
    HD float max_f(float v) {
#ifdef __CUDA_ARCH__
        return reduce(v, op_maxf());
#else
        return v;
#endif
    }
    HD float min_f(float v) {
#ifdef __CUDA_ARCH__
        return reduce(v, op_minf());
#else
        return v;
#endif
    }
    HD uint64_t max_k(uint64_t v) {
#ifdef __CUDA_ARCH__
        return reduce(v, op_maxk());
#else
        return v;
#endif
    }
    HD uint64_t min_k(uint64_t v) {
#ifdef __CUDA_ARCH__
        return reduce(v, op_mink());
#else
        return v;
#endif
    }
    HD double sum_d(double v) {
#ifdef __CUDA_ARCH__
        return reduce(v, op_sumd());
#else
        return v;
#endif
    }
    /* thread 0's value to every thread */
    HD uint64_t bcast(uint64_t v) {
#ifdef __CUDA_ARCH__
        __syncthreads();
        if (threadIdx.x == 0) red[S_WARPS] = v;
        __syncthreads();
        v = red[S_WARPS];
        __syncthreads();
#endif
        return v;
    }

    /* Histogram of the members of `set` with keys in [lo, hi] into bins (hi - key) >> s, merged
     * into bc / bm. Same-bin lanes of a warp are summed in lane order and each warp adds
     * into its own bins in its own element order, so the sums do not depend on timing. */
    template <bool COUNT> HD void hist(const rowctx &c, int set, uint64_t lo, uint64_t hi, int s) {
#ifdef __CUDA_ARCH__
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (int j = threadIdx.x; j < S_WARPS * S_BINS; j += S_THREADS) {
            hc[j] = 0;
            if (!COUNT) hm[j] = 0;
        }
        __syncthreads();
        uint32_t *wc = hc + warp * S_BINS;
        double *wm = hm + warp * S_BINS;
        for (int base0 = warp * 32; base0 < c.V; base0 += S_THREADS * S_UNROLL) {
            float zv[S_UNROLL];
#pragma unroll
            for (int u = 0; u < S_UNROLL; u++) {
                int i = base0 + u * S_THREADS + lane;
                zv[u] = i < c.V ? c.z[i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < S_UNROLL; u++) {
                /* the same elements in the same order as one at a time */
                int i = base0 + u * S_THREADS + lane, bin = -1;
                double w = 0;
                uint64_t key;
                float zt;
                if (i < c.V && member_key_z(c, set, i, zv[u], key, zt) && key >= lo && key <= hi && (COUNT || weigh(c, set, zt, w)))
                    bin = (int)((hi - key) >> s);
                if (!__ballot_sync(0xffffffffu, bin >= 0)) continue;
                unsigned grp = __match_any_sync(0xffffffffu, bin);
                int leader = __ffs(grp) - 1;
                if (COUNT) {
                    if (bin >= 0 && lane == leader) wc[bin] += __popc(grp);
                } else {
                    const int single = (grp & (grp - 1)) == 0;
                    if (bin >= 0 && single) {
                        wc[bin] += 1;
                        wm[bin] += w;
                    }
                    /* bins of several lanes: where there are many of them for their size, each
                     * bin's leader adds its lanes' masses in lane order through shared memory
                     * (steps: the largest bin's lanes), else a butterfly of shuffles per bin
                     * (steps: 5 a bin); the butterflies were most of a pass's time where the
                     * candidates fill a handful of bins (N(0, 1) logits), the leaders' loops
                     * where a few bins hold most lanes (one token far ahead). Either way the
                     * order of the sums depends only on the data */
                    const unsigned multi = __ballot_sync(0xffffffffu, bin >= 0 && !single && lane == leader);
                    if (multi) {
                        const int most = __reduce_max_sync(0xffffffffu, bin >= 0 ? __popc(grp) : 0);
                        if (most < 4 * __popc(multi)) {
                            double *ws = wsc + warp * 32;
                            ws[lane] = w;
                            __syncwarp();
                            if (bin >= 0 && !single && lane == leader) {
                                double v = 0.0;
                                for (unsigned g = grp; g; g &= g - 1) v = __dadd_rn(v, ws[__ffs(g) - 1]);
                                wc[bin] += __popc(grp);
                                wm[bin] += v;
                            }
                        } else {
                            for (unsigned mm = multi; mm;) {
                                const int l = __ffs(mm) - 1;
                                mm &= mm - 1;
                                const int b = __shfl_sync(0xffffffffu, bin, l);
                                double v = bin == b ? w : 0.0;
                                for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
                                if (lane == l) {
                                    wc[b] += __popc(grp);
                                    wm[b] += v;
                                }
                            }
                        }
                    }
                }
                __syncwarp();
            }
        }
        __syncthreads();
        for (int b = threadIdx.x; b < S_BINS; b += S_THREADS) {
            uint32_t n = 0;
            double m = 0;
            for (int w = 0; w < S_WARPS; w++) {
                n += hc[w * S_BINS + b];
                if (!COUNT) m += hm[w * S_BINS + b];
            }
            bc[b] = n;
            bm[b] = m;
        }
        __syncthreads();
#endif
    }

    /* Finds the first bin (descending keys) where before + running mass (or count) reaches the
     * target; first: the target is frac * total (mass) or count_target. Warp 0 scans, eight bins
     * per lane; every thread gets the result. */
    template <bool COUNT>
    HD scan_res scan(double before, uint32_t before_c, int first, double frac, double target, uint32_t count_target, int ge) {
        scan_res r;
#ifdef __CUDA_ARCH__
        const int lane = threadIdx.x & 31;
        if (threadIdx.x < 32) {
            const int b0 = lane * (S_BINS / 32);
            double sm = 0;
            uint32_t sc = 0;
            for (int j = 0; j < S_BINS / 32; j++) {
                sc += bc[b0 + j];
                if (!COUNT) sm = __dadd_rn(sm, bm[b0 + j]);
            }
            double im = sm;
            uint32_t ic = sc;
            for (int o = 1; o < 32; o <<= 1) {
                double t = __shfl_up_sync(0xffffffffu, im, o);
                uint32_t tc = __shfl_up_sync(0xffffffffu, ic, o);
                if (lane >= o) {
                    im = __dadd_rn(t, im);
                    ic += tc;
                }
            }
            double total = __shfl_sync(0xffffffffu, im, 31);
            double ex = __shfl_up_sync(0xffffffffu, im, 1);
            uint32_t exc = __shfl_up_sync(0xffffffffu, ic, 1);
            if (lane == 0) { ex = 0; exc = 0; }
            double tgt = first && !COUNT ? __dmul_rn(frac, total) : target;
            double run = __dadd_rn(before, ex);
            uint32_t runc = before_c + exc;
            int fj = -1, lj = -1;
            double fb = 0, lb = 0;
            uint32_t fbc = 0, lbc = 0;
            for (int j = 0; j < S_BINS / 32; j++) {
                uint32_t n = bc[b0 + j];
                double nm = COUNT ? 0 : __dadd_rn(run, bm[b0 + j]);
                uint32_t nc = runc + n;
                if (n) {
                    int reach = COUNT ? nc >= count_target : ge ? nm >= tgt : nm > tgt;
                    if (reach && fj < 0) { fj = j; fb = run; fbc = runc; }
                    lj = j; lb = run; lbc = runc;
                }
                run = nm;
                runc = nc;
            }
            unsigned fm = __ballot_sync(0xffffffffu, fj >= 0), lm = __ballot_sync(0xffffffffu, lj >= 0);
            int src = fm ? __ffs(fm) - 1 : lm ? 31 - __clz(lm) : 0;
            if (lane == src) {
                sr->found = fm != 0;
                sr->bin = lm ? b0 + (fm ? fj : lj) : -1;
                sr->bin_count = lm ? bc[sr->bin] : 0;
                sr->before = fm ? fb : lb;
                sr->before_c = fm ? fbc : lbc;
                sr->total = total;
                sr->target = tgt;
            }
        }
        __syncthreads();
        r = *sr;
        __syncthreads();
#else
        (void)before; (void)before_c; (void)first; (void)frac; (void)target; (void)count_target; (void)ge;
        memset(&r, 0, sizeof r);
#endif
        return r;
    }

    /* Gathers the members of set with keys in [lo, hi] (at most S_GATHER) into gk / gw,
     * ordered by key desc; returns how many. */
    template <bool W> HD int gather(const rowctx &c, int set, uint64_t lo, uint64_t hi) {
#ifdef __CUDA_ARCH__
        if (threadIdx.x == 0) *gn = 0;
        __syncthreads();
        for (int i0 = threadIdx.x; i0 < c.V; i0 += S_THREADS * S_UNROLL) {
            float zv[S_UNROLL];
#pragma unroll
            for (int u = 0; u < S_UNROLL; u++) zv[u] = i0 + u * S_THREADS < c.V ? c.z[i0 + u * S_THREADS] : 0.0f;
#pragma unroll
            for (int u = 0; u < S_UNROLL; u++) {
                int i = i0 + u * S_THREADS;
                uint64_t key;
                float zt;
                double w = 0;
                if (i < c.V && member_key_z(c, set, i, zv[u], key, zt) && key >= lo && key <= hi && (!W || weigh(c, set, zt, w))) {
                    int slot = atomicAdd(gn, 1);
                    if (slot < S_GATHER) {
                        gk_raw[slot] = key;
                        gw_raw[slot] = w;
                    }
                }
            }
        }
        __syncthreads();
        int n = *gn < S_GATHER ? *gn : S_GATHER;
        if ((int)threadIdx.x < n) {
            uint64_t k = gk_raw[threadIdx.x];
            int rank = 0;
            for (int j = 0; j < n; j++) rank += gk_raw[j] > k;
            gk[rank] = k;
            gw[rank] = gw_raw[threadIdx.x];
        }
        __syncthreads();
        return n;
#else
        return 0;
#endif
    }
};

/* ---- the host block (one thread) --------------------------------------------------------- */

struct host_blk {
    uint32_t bc[S_BINS];
    double bm[S_BINS];
    uint64_t gk[S_GATHER];
    double gw[S_GATHER];
    int32_t wbuf[KC_SAMPLE_MAX_WINDOW];

    HD int tid() const { return 0; }
    HD int nt() const { return 1; }
    HD void sync() {}
    HD int32_t *win() { return wbuf; }
    HD float max_f(float v) { return v; }
    HD float min_f(float v) { return v; }
    HD uint64_t max_k(uint64_t v) { return v; }
    HD uint64_t min_k(uint64_t v) { return v; }
    HD double sum_d(double v) { return v; }
    HD uint64_t bcast(uint64_t v) { return v; }

    template <bool COUNT> HD void hist(const rowctx &c, int set, uint64_t lo, uint64_t hi, int s) {
        memset(bc, 0, sizeof bc);
        for (int b = 0; b < S_BINS; b++) bm[b] = 0;
        for (int i = 0; i < c.V; i++) {
            uint64_t key;
            float zt;
            double w = 0;
            if (member_key(c, set, i, key, zt) && key >= lo && key <= hi && (COUNT || weigh(c, set, zt, w))) {
                int b = (int)((hi - key) >> s);
                bc[b]++;
                if (!COUNT) bm[b] = d_add(bm[b], w);
            }
        }
    }

    template <bool COUNT>
    HD scan_res scan(double before, uint32_t before_c, int first, double frac, double target, uint32_t count_target, int ge) {
        scan_res r;
        memset(&r, 0, sizeof r);
        double total = 0;
        for (int b = 0; b < S_BINS; b++) total = d_add(total, bm[b]);
        double tgt = first && !COUNT ? d_mul(frac, total) : target;
        double run = before;
        uint32_t runc = before_c;
        int lj = -1;
        double lb = 0;
        uint32_t lbc = 0;
        r.bin = -1;
        for (int b = 0; b < S_BINS; b++) {
            uint32_t n = bc[b];
            double nm = COUNT ? 0 : d_add(run, bm[b]);
            uint32_t nc = runc + n;
            if (n) {
                int reach = COUNT ? nc >= count_target : ge ? nm >= tgt : nm > tgt;
                if (reach) {
                    r.found = 1; r.bin = b; r.before = run; r.before_c = runc;
                    break;
                }
                lj = b; lb = run; lbc = runc;
            }
            run = nm;
            runc = nc;
        }
        if (!r.found && lj >= 0) { r.bin = lj; r.before = lb; r.before_c = lbc; }
        r.bin_count = r.bin >= 0 ? bc[r.bin] : 0;
        r.total = total;
        r.target = tgt;
        return r;
    }

    template <bool W> HD int gather(const rowctx &c, int set, uint64_t lo, uint64_t hi) {
        int n = 0;
        for (int i = 0; i < c.V; i++) {
            uint64_t key;
            float zt;
            double w = 0;
            if (member_key(c, set, i, key, zt) && key >= lo && key <= hi && (!W || weigh(c, set, zt, w)) && n < S_GATHER) {
                int j = n++;
                while (j > 0 && gk[j - 1] < key) { gk[j] = gk[j - 1]; gw[j] = gw[j - 1]; j--; }
                gk[j] = key;
                gw[j] = w;
            }
        }
        return n;
    }
};

/* ---- the algorithm ---------------------------------------------------------------------------- */

typedef struct sel_res {
    int found;
    uint64_t key;
    double total; /* mass (or count) of the set */
} sel_res;

/* The first member of set in descending key order (keys within [lo, hi]) at which the running
 * count reaches count_target (COUNT), or the running mass reaches frac * (the set's mass):
 * >= when ge, > otherwise. found = 0 when the whole set falls short (rounding only). */
template <bool COUNT, class B>
HD sel_res select(B &k, const rowctx &c, int set, uint64_t lo, uint64_t hi, double frac, uint32_t count_target, int ge) {
    sel_res res = { 0, 0, 0 };
    double before = 0, target = 0;
    uint32_t before_c = 0;
    for (int first = 1;; first = 0) {
        uint64_t d = hi - lo;
        int s = d < S_BINS ? 0 : (64 - clz64(d)) - 8;
        k.template hist<COUNT>(c, set, lo, hi, s);
        scan_res sr = k.template scan<COUNT>(before, before_c, first, frac, target, count_target, ge);
        if (first) {
            res.total = sr.total;
            target = sr.target;
            if (!sr.found) return res;
        }
        if (sr.bin < 0) return res; /* cannot happen: a chosen bucket has members */
        /* Not reached inside the chosen bucket (the bins summed in another order than the
         * pass before): the bucket's last member is the one. */
        uint64_t b = (uint64_t)sr.bin;
        uint64_t nhi = hi - (b << s);
        uint64_t nlo = b == (d >> s) ? lo : hi - ((b + 1) << s) + 1;
        lo = nlo;
        hi = nhi;
        before = sr.before;
        before_c = sr.before_c;
        if (sr.bin_count <= S_GATHER) {
            int n = k.template gather<!COUNT>(c, set, lo, hi);
            uint64_t key = 0;
            if (k.tid() == 0 && n > 0) {
                key = k.gk[n - 1];
                double cum = before;
                uint32_t cc = before_c;
                for (int j = 0; j < n; j++) {
                    int reach;
                    if (COUNT) reach = ++cc >= count_target;
                    else {
                        cum = d_add(cum, k.gw[j]);
                        reach = ge ? cum >= target : cum > target;
                    }
                    if (reach) { key = k.gk[j]; break; }
                }
            }
            res.found = 1;
            res.key = k.bcast(key);
            return res;
        }
    }
}

template <class B>
HD void sample_row(B &k, float *z, int V, const kc_sample_row &p, const uint32_t *words, kc_sample_out *out) {
    const int tid = k.tid(), nt = k.nt();
    /* 1. z = logits + bias, duplicates added in list order (by the entry that comes first) */
    const uint32_t *bias = words + p.bias_off;
    for (int j = tid; j < p.n_bias; j += nt) {
        int32_t id = (int32_t)bias[2 * j];
        int first = 1;
        for (int q = 0; q < j && first; q++) first = (int32_t)bias[2 * q] != id;
        if (!first) continue;
        float v = z[id];
        for (int q = j; q < p.n_bias; q++)
            if ((int32_t)bias[2 * q] == id) v = f_add(v, bits_f(bias[2 * q + 1]));
        z[id] = v;
    }
    k.sync();
    /* 2. penalties: the window sorted, each distinct id once with its count */
    if (p.n_win > 0) {
        int32_t *w = k.win();
        int P = 1;
        while (P < p.n_win) P <<= 1;
        for (int j = tid; j < P; j += nt) w[j] = j < p.n_win ? (int32_t)words[p.win_off + j] : 0x7fffffff;
        k.sync();
        for (int kk = 2; kk <= P; kk <<= 1)
            for (int jj = kk >> 1; jj > 0; jj >>= 1) {
                for (int i = tid; i < P; i += nt) {
                    int l = i ^ jj;
                    if (l > i && (w[i] > w[l]) == ((i & kk) == 0)) {
                        int32_t t = w[i];
                        w[i] = w[l];
                        w[l] = t;
                    }
                }
                k.sync();
            }
        for (int j = tid; j < p.n_win; j += nt) {
            if (j > 0 && w[j] == w[j - 1]) continue;
            int32_t id = w[j];
            int lo = j + 1, hi = p.n_win;
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (w[mid] <= id) lo = mid + 1;
                else hi = mid;
            }
            float v = z[id];
            if (p.repeat_penalty != 1.0f) v = v > 0 ? f_div(v, p.repeat_penalty) : f_mul(v, p.repeat_penalty);
            v = f_sub(v, f_add(p.presence_penalty, f_mul(p.frequency_penalty, (float)(lo - j))));
            z[id] = v;
        }
        k.sync();
    }
    /* the token mask: a token the grammar does not allow is never a candidate (z = -inf) */
    if (p.mask_words > 0) {
        const uint32_t *mk = words + p.mask_off;
        for (int i = tid; i < V; i += nt)
            if (!((mk[i >> 5] >> (i & 31)) & 1u)) z[i] = -INFINITY;
        k.sync();
    }
    /* 3. range of z */
    float lmax = -INFINITY, lmin = INFINITY;
    for (int i = tid; i < V; i += nt) {
        lmax = fmaxf(lmax, z[i]);
        lmin = fminf(lmin, z[i]);
    }
    const float zmax = k.max_f(lmax), zmin = k.min_f(lmin);
    rowctx c;
    memset(&c, 0, sizeof c);
    c.z = z;
    c.V = V;
    int tok;
    if (p.mask_words > 0 && !(zmax > -INFINITY)) {
        tok = p.mask_first; /* every allowed token is impossible: the lowest allowed id, as the CPU */
    } else if (!(p.temperature > 0)) {
        /* 4. greedy: the largest z, lowest id on ties */
        uint64_t best = 0;
        for (int i = tid; i < V; i += nt) {
            uint64_t kk = ckey(z[i], i, V);
            best = kk > best ? kk : best;
        }
        tok = key_id(k.max_k(best), V);
    } else {
        /* 5. z / T, top-k, min-p's early cut, top-p, min-p, 6. the draw */
        c.inv_t = f_div(1.0f, p.temperature);
        c.zt0 = f_mul(zmax, c.inv_t);
        uint64_t lo = (uint64_t)mono(f_mul(zmin, c.inv_t)) << 32, hi = ((uint64_t)mono(c.zt0) << 32) | 0xffffffffu;
        if (p.top_k > 0 && p.top_k < V) {
            sel_res r = select<true>(k, c, SET_ALL, lo, hi, 0.0, (uint32_t)p.top_k, 1);
            c.c0_mode = C0_KEY;
            c.k0 = lo = r.key;
        } else if (p.min_p > 0) {
            c.c0_mode = C0_VAL;
            c.thr_pre = d_add((double)c.zt0, log((double)p.min_p));
        }
        double S = -1;
        if (p.top_p < 1.0f) {
            sel_res r = select<false>(k, c, SET_C0, lo, hi, (double)p.top_p, 0, 1);
            S = r.total;
            if (r.found) {
                c.c1_on = 1;
                c.k1 = lo = r.key;
            }
        }
        if (p.min_p > 0) {
            if (S < 0) {
                double ls = 0;
                for (int i = tid; i < V; i += nt) {
                    uint64_t key;
                    float zt;
                    double w;
                    if (member_key(c, SET_C0, i, key, zt) && weigh(c, SET_C0, zt, w)) ls = d_add(ls, w);
                }
                S = k.sum_d(ls);
            }
            c.S = S;
            c.pthr = d_mul((double)p.min_p, d_div(1.0, S));
            c.c2_on = 1;
        }
        sel_res r = select<false>(k, c, SET_C2, lo, hi, cm_philox_u01(p.seed, (uint64_t)p.pos), 0, 0);
        if (!r.found) { /* rounding left the draw past the end: the last candidate (as the CPU) */
            uint64_t m = ~0ull;
            for (int i = tid; i < V; i += nt) {
                uint64_t key;
                float zt;
                double w;
                if (member_key(c, SET_C2, i, key, zt) && weigh(c, SET_C2, zt, w)) m = key < m ? key : m;
            }
            r.key = k.min_k(m);
        }
        tok = key_id(r.key, V);
    }
    /* 3. (after the draw, as on the CPU) log-softmax of z / T over the whole vocabulary */
    float lp_tok = 0;
    int n_top = 0;
    if (p.logprobs || p.top_logprobs) {
        c.inv_t_d = p.temperature > 0 ? d_div(1.0, (double)p.temperature) : 1.0;
        double mxd = d_mul((double)zmax, c.inv_t_d), ls = 0;
        for (int i = tid; i < V; i += nt) ls = d_add(ls, exp(d_sub(d_mul((double)z[i], c.inv_t_d), mxd)));
        c.lse = d_add(mxd, log(k.sum_d(ls)));
        lp_tok = lp_of(c, z[tok]);
        int N = p.top_logprobs < V ? p.top_logprobs : V;
        if (N > 0) {
            uint64_t llo = (uint64_t)mono(lp_of(c, zmin)) << 32, lhi = ((uint64_t)mono(lp_of(c, zmax)) << 32) | 0xffffffffu;
            sel_res r = select<true>(k, c, SET_LP, llo, lhi, 0.0, (uint32_t)N, 1);
            n_top = k.template gather<false>(c, SET_LP, r.key, ~0ull);
        }
    }
    if (tid == 0) {
        out->token = tok;
        out->logprob = lp_tok;
        out->n_top = n_top;
        for (int j = 0; j < KC_SAMPLE_MAX_TOP; j++) {
            out->top_id[j] = j < n_top ? key_id(k.gk[j], V) : 0;
            out->top_logprob[j] = j < n_top ? mono_inv((uint32_t)(k.gk[j] >> 32)) : 0.0f;
        }
    }
}

__global__ void __launch_bounds__(S_THREADS) sample_kernel(float *logits, int ld, int V, const uint8_t *pool, kc_sample_out *out) {
    extern __shared__ __align__(16) unsigned char s_dyn[];
    __shared__ uint32_t s_bc[S_BINS];
    __shared__ double s_bm[S_BINS];
    __shared__ uint64_t s_gk[S_GATHER], s_gkr[S_GATHER];
    __shared__ double s_gw[S_GATHER], s_gwr[S_GATHER];
    __shared__ int s_gn;
    __shared__ uint64_t s_red[S_WARPS + 1];
    __shared__ scan_res s_sr;
    __shared__ double s_wsc[S_WARPS * 32];
    dev_blk k;
    k.wsc = s_wsc;
    k.hm = (double *)s_dyn;
    k.hc = (uint32_t *)(s_dyn + (size_t)S_WARPS * S_BINS * sizeof(double));
    k.bc = s_bc;
    k.bm = s_bm;
    k.gk = s_gk;
    k.gk_raw = s_gkr;
    k.gw = s_gw;
    k.gw_raw = s_gwr;
    k.gn = &s_gn;
    k.red = s_red;
    k.sr = &s_sr;
    const kc_sample_row p = ((const kc_sample_row *)pool)[blockIdx.x];
    sample_row(k, logits + (size_t)p.logits_row * ld, V, p, (const uint32_t *)pool, out + blockIdx.x);
}

extern "C" size_t kc_sample_pool_words_start(int max_rows) { return (size_t)max_rows * sizeof(kc_sample_row) / 4; }

extern "C" size_t kc_sample_pool_bytes(int max_rows, int n_vocab) {
    size_t masked = max_rows < KC_SAMPLE_MAX_MASKED ? (size_t)max_rows : KC_SAMPLE_MAX_MASKED;
    return 4 * (kc_sample_pool_words_start(max_rows) + (size_t)max_rows * (KC_SAMPLE_MAX_WINDOW + 2 * KC_SAMPLE_MAX_BIAS) +
                masked * (((size_t)n_vocab + 31) / 32));
}

extern "C" int kc_sample(float *logits, int ld, int n_vocab, const void *pool, int n_rows, kc_sample_out *out, cudaStream_t s) {
    if (!logits || !pool || !out || n_rows < 0 || n_vocab <= 0 || ld < n_vocab) return CM_EINVAL;
    if (n_rows == 0) return 0;
    static unsigned char attr_set[64];
    if (int rc = kc_smem_limit_once(sample_kernel, (int)S_HIST_BYTES, attr_set, __FILE__, __LINE__)) return rc;
    sample_kernel<<<n_rows, S_THREADS, S_HIST_BYTES, s>>>(logits, ld, n_vocab, (const uint8_t *)pool, out);
    KC_LAUNCH_CHECK();
}

extern "C" int kc_sample_host(float *logits, int ld, int n_vocab, const void *pool, int n_rows, kc_sample_out *out) {
    if (!logits || !pool || !out || n_rows < 0 || n_vocab <= 0 || ld < n_vocab) return CM_EINVAL;
    host_blk *k = (host_blk *)malloc(sizeof *k);
    if (!k) return CM_ENOMEM;
    for (int r = 0; r < n_rows; r++) {
        const kc_sample_row p = ((const kc_sample_row *)pool)[r];
        sample_row(*k, logits + (size_t)p.logits_row * ld, n_vocab, p, (const uint32_t *)pool, out + r);
    }
    free(k);
    return 0;
}

/* ---- argmax ------------------------------------------------------------------------------------ */

__global__ void argmax_kernel(const float *logits, int n_vocab, int32_t *out) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        float v = row[i];
        if (v > best) { best = v; idx = i; } // strided scan keeps the lowest index per thread on ties
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { bv[warp] = best; bi[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        best = lane < nw ? bv[lane] : -INFINITY;
        idx = lane < nw ? bi[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}

extern "C" int kc_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, cudaStream_t s) {
    if (!logits || !out || n_rows <= 0 || n_vocab <= 0) return CM_EINVAL;
    argmax_kernel<<<n_rows, 1024, 0, s>>>(logits, n_vocab, out);
    KC_LAUNCH_CHECK();
}
