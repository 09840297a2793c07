/* Sampler: each filter on hand-made distributions, penalties, bias, logprobs, seeded
 * reproducibility independent of call order, parameter checks. */
#include "executor/sampler.h"
#include "common/cm_err.h"
#include "common/cm_philox.h"
#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* logits whose softmax is exactly probs */
/* ex_sampler_sample on one row built from the arguments (bias may be NULL). */
static int sample(ex_sampler *s, const ex_sample_params *p, const struct shm_logit_bias *bias, int n_bias, const float *z,
                  const int32_t *prev, int n_prev, int64_t pos, ex_sample_out *o) {
    ex_sample_row r = { .sp = p, .prev = prev, .n_prev = n_prev, .pos = pos, .bias = bias, .n_bias = n_bias };
    return ex_sampler_sample(s, &r, z, o);
}

static void from_probs(const double *p, int n, float *z) {
    for (int i = 0; i < n; i++) z[i] = (float)log(p[i]);
}

/* Draws positions 0..n-1 and counts tokens. */
static void histogram(ex_sampler *s, const ex_sample_params *p, const float *z, int V, int n, int *cnt) {
    memset(cnt, 0, sizeof(int) * V);
    ex_sample_out o;
    for (int i = 0; i < n; i++) {
        sample(s, p, NULL, 0, z, NULL, 0, i, &o);
        cnt[o.token]++;
    }
}

/* Philox4x32-10 against Random123's known-answer vectors (kat_vectors, philox4x32 10). */
static void test_philox_kat(void) {
    static const struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
        { { 0, 0, 0, 0 }, { 0, 0 }, { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 } },
        { { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff }, { 0xffffffff, 0xffffffff },
          { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd } },
        { { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 }, { 0xa4093822, 0x299f31d0 },
          { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 } },
    };
    for (size_t t = 0; t < sizeof kat / sizeof kat[0]; t++) {
        uint32_t out[4] = { 0xdeadbeef, 0xdeadbeef, 0xdeadbeef, 0xdeadbeef }; /* poisoned */
        cm_philox4x32_10(kat[t].ctr, kat[t].key, out);
        for (int i = 0; i < 4; i++)
            T_CHECKF(out[i] == kat[t].out[i], "vector %zu word %d: %08x != %08x", t, i, out[i], kat[t].out[i]);
    }
    /* out may alias ctr */
    uint32_t io[4] = { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 };
    cm_philox4x32_10(io, kat[2].key, io);
    T_CHECK(memcmp(io, kat[2].out, sizeof io) == 0);
    /* the draw: counter { pos lo, pos hi, 0, 0 }, key { seed lo, seed hi }, top 53 bits of
     * r[0] << 32 | r[1]; vector 0 gives u(0, 0) */
    T_CHECK(ex_rng_u01(0, 0) == (double)(0x6627e8d5e169c58dull >> 11) * 0x1p-53);
    uint64_t seed = 0x0123456789abcdefull;
    int64_t pos = 0x0000000500000007ll;
    uint32_t c[4] = { 7, 5, 0, 0 }, k[2] = { 0x89abcdef, 0x01234567 }, r[4];
    cm_philox4x32_10(c, k, r);
    T_CHECK(ex_rng_u01(seed, pos) == (double)((((uint64_t)r[0] << 32) | r[1]) >> 11) * 0x1p-53);
    T_CHECK(ex_rng_u01(seed, pos) != ex_rng_u01(seed, 7));               /* pos high word counts */
    T_CHECK(ex_rng_u01(seed, 7) != ex_rng_u01(seed & 0xffffffffull, 7)); /* seed high word counts */
}

static void test_greedy_and_rng(void) {
    ex_sampler *s;
    T_EQ_INT(ex_sampler_create(0, &s), CM_EINVAL);
    T_EQ_INT(ex_sampler_create(6, &s), 0);
    ex_sample_params p;
    ex_sample_params_default(&p);
    float z[6] = { 0.5f, 3.0f, -1.0f, 3.0f, 2.9f, -INFINITY };
    ex_sample_out o;
    T_EQ_INT(sample(s, &p, NULL, 0, z, NULL, 0, 0, &o), 0);
    T_EQ_INT(o.token, 1); /* tie between 1 and 3: lowest id */
    /* the draw: repeatable, different positions and seeds differ, in range, mean 1/2 */
    T_CHECK(ex_rng_u01(42, 7) == ex_rng_u01(42, 7));
    T_CHECK(ex_rng_u01(42, 7) != ex_rng_u01(42, 8));
    T_CHECK(ex_rng_u01(42, 7) != ex_rng_u01(43, 7));
    double mean = 0;
    for (int i = 0; i < 100000; i++) {
        double u = ex_rng_u01(1, i);
        T_CHECK(u >= 0 && u < 1);
        mean += u;
    }
    T_NEAR(mean / 100000, 0.5, 0.005);
    T_EQ_INT(ex_rng_mix(0), 0xE220A8397B1DCDAFull); /* splitmix64's first output for state 0 */
    ex_sampler_destroy(s);
}

static void test_filters(void) {
    enum { V = 5, N = 20000 };
    ex_sampler *s;
    ex_sampler_create(V, &s);
    double pr[V] = { 0.5, 0.3, 0.15, 0.05, 0.0 };
    pr[4] = 1e-9;
    float z[V];
    from_probs(pr, V, z);
    int cnt[V];
    ex_sample_params p;
    ex_sample_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 1234;
    histogram(s, &p, z, V, N, cnt);
    for (int i = 0; i < 4; i++) T_NEAR((double)cnt[i] / N, pr[i], 0.015);
    /* top-k 2: only the two largest, renormalized 5:3 */
    p.top_k = 2;
    histogram(s, &p, z, V, N, cnt);
    T_CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[4] == 0);
    T_NEAR((double)cnt[0] / N, 0.625, 0.015);
    /* top-p 0.75: {0, 1} (0.5 < 0.75 <= 0.8) */
    p.top_k = 0; p.top_p = 0.75f;
    histogram(s, &p, z, V, N, cnt);
    T_CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[0] > 0 && cnt[1] > 0);
    p.top_p = 0.85f; /* {0, 1, 2} */
    histogram(s, &p, z, V, N, cnt);
    T_CHECK(cnt[2] > 0 && cnt[3] == 0);
    T_NEAR((double)cnt[2] / N, 0.15 / 0.95, 0.015);
    /* min-p 0.2: keep p >= 0.1 -> {0, 1, 2}; 0.4: p >= 0.2 -> {0, 1} */
    p.top_p = 1.0f; p.min_p = 0.2f;
    histogram(s, &p, z, V, N, cnt);
    T_CHECK(cnt[2] > 0 && cnt[3] == 0 && cnt[4] == 0);
    p.min_p = 0.4f;
    histogram(s, &p, z, V, N, cnt);
    T_CHECK(cnt[2] == 0 && cnt[1] > 0);
    /* temperature: 0.05 is nearly greedy, 10 nearly uniform */
    p.min_p = 0; p.temperature = 0.05f;
    histogram(s, &p, z, V, N, cnt);
    T_CHECK(cnt[0] > N - 5);
    p.temperature = 10.0f;
    histogram(s, &p, z, V, N, cnt);
    T_CHECK(cnt[3] > N / 10 && cnt[4] > N / 50); /* p4 = 0.036 */
    /* same seed, same position: same token whatever was sampled before (call order) */
    p.temperature = 1.0f;
    ex_sample_out a, b, junk;
    sample(s, &p, NULL, 0, z, NULL, 0, 77, &a);
    ex_sample_params q = p;
    q.seed = 999; q.top_k = 1;
    sample(s, &q, NULL, 0, z, NULL, 0, 3, &junk);
    sample(s, &p, NULL, 0, z, NULL, 0, 77, &b);
    T_EQ_INT(a.token, b.token);
    ex_sampler_destroy(s);
}

static void test_penalties_bias(void) {
    enum { V = 4 };
    ex_sampler *s;
    ex_sampler_create(V, &s);
    ex_sample_params p;
    ex_sample_params_default(&p);
    p.logprobs = 1;
    p.top_logprobs = V;
    float z[V] = { 2.0f, 1.9f, -1.0f, -1.1f };
    ex_sample_out o;
    int32_t prev[6] = { 0, 2, 2, 2, 1, 1 };
    /* repetition: 0 positive -> 2/2 = 1 < 1.9; so 1 wins... but 1 is in prev too -> 0.95 */
    p.repeat_penalty = 2.0f;
    p.penalty_last_n = 1;                       /* only the last token (1) */
    sample(s, &p, NULL, 0, z, prev, 6, 6, &o);
    T_EQ_INT(o.token, 0);
    p.penalty_last_n = -1;                      /* all: 0 -> 1.0, 1 -> 0.95 */
    sample(s, &p, NULL, 0, z, prev, 6, 6, &o);
    T_EQ_INT(o.token, 0);
    p.penalty_last_n = 64;
    sample(s, &p, NULL, 0, z, prev + 1, 5, 6, &o); /* 0 not in window: 2.0 vs 0.95 */
    T_EQ_INT(o.token, 0);
    /* check exact processed values through logprobs (greedy: log-softmax of z) */
    sample(s, &p, NULL, 0, z, prev, 6, 6, &o);
    {
        double zz[V] = { 1.0, 0.95, -2.0, -1.1 }, mx = 1.0, sum = 0; /* negative 2 multiplied */
        for (int i = 0; i < V; i++) sum += exp(zz[i] - mx);
        double lse = mx + log(sum);
        int found = 0;
        for (int i = 0; i < o.n_top; i++)
            if (o.top_id[i] == 2) { T_NEAR(o.top_logprob[i], -2.0 - lse, 1e-5); found = 1; }
        T_CHECK(found);
        T_NEAR(o.logprob, 1.0 - lse, 1e-5);
    }
    /* presence + frequency: 1 appears twice: 1.9 - 0.5 - 2 * 0.3 = 0.8 */
    p.repeat_penalty = 1.0f; p.presence_penalty = 0.5f; p.frequency_penalty = 0.3f;
    float z2[V] = { 0.0f, 1.9f, 0.9f, -5.0f };
    int32_t prev2[2] = { 1, 1 };
    sample(s, &p, NULL, 0, z2, prev2, 2, 2, &o);
    T_EQ_INT(o.token, 2);
    /* logit bias */
    p.presence_penalty = p.frequency_penalty = 0;
    struct shm_logit_bias bias[2] = { { 3, 100.0f }, { 0, -INFINITY } };
    sample(s, &p, bias, 2, z, NULL, 0, 0, &o);
    T_EQ_INT(o.token, 3);
    p.temperature = 1.0f;
    int ok = 1;
    for (int i = 0; i < 200; i++) { sample(s, &p, bias, 2, z, NULL, 0, i, &o); ok &= o.token != 0; }
    T_CHECK(ok); /* -inf bias never drawn */
    /* logprobs normalize; top sorted, sampled token's logprob matches its entry */
    p.temperature = 0.7f; p.seed = 5;
    sample(s, &p, NULL, 0, z, NULL, 0, 11, &o);
    T_EQ_INT(o.n_top, V);
    double tot = 0;
    int sorted = 1, match = 0;
    for (int i = 0; i < o.n_top; i++) {
        tot += exp(o.top_logprob[i]);
        if (i) sorted &= o.top_logprob[i] <= o.top_logprob[i - 1];
        if (o.top_id[i] == o.token) match = fabsf(o.top_logprob[i] - o.logprob) < 1e-6f;
    }
    T_NEAR(tot, 1.0, 1e-5);
    T_CHECK(sorted && match);
    T_NEAR(o.top_logprob[0], 2.0 / 0.7 - log(exp(2.0 / 0.7) + exp(1.9 / 0.7) + exp(-1 / 0.7) + exp(-1.1 / 0.7)), 1e-5);
    p.top_logprobs = 2;
    sample(s, &p, NULL, 0, z, NULL, 0, 11, &o);
    T_EQ_INT(o.n_top, 2);
    T_CHECK(o.top_id[0] == 0 && o.top_id[1] == 1);
    ex_sampler_destroy(s);
}

static void test_big_vocab_topk(void) {
    enum { V = 32000 };
    ex_sampler *s;
    ex_sampler_create(V, &s);
    float *z = malloc(sizeof(float) * V);
    uint64_t r = 99;
    for (int i = 0; i < V; i++) { r = ex_rng_mix(r); z[i] = (float)((r >> 40) % 1000) / 100.0f; } /* many ties */
    /* threshold: the 40th largest value under (z desc, id asc) */
    int *rank = calloc(V, sizeof(int));
    ex_sample_params p;
    ex_sample_params_default(&p);
    p.temperature = 1.0f; p.top_k = 40;
    int ok = 1;
    for (int pos = 0; pos < 300; pos++) {
        ex_sample_out o;
        sample(s, &p, NULL, 0, z, NULL, 0, pos, &o);
        int better = 0; /* tokens ordered before o.token */
        for (int i = 0; i < V; i++) better += z[i] > z[o.token] || (z[i] == z[o.token] && i < o.token);
        ok &= better < 40;
        rank[o.token]++;
    }
    T_CHECK(ok);
    /* top_p alone over a big vocabulary with min_p */
    p.top_k = 0; p.top_p = 0.5f; p.min_p = 0.01f;
    ex_sample_out o;
    T_EQ_INT(sample(s, &p, NULL, 0, z, NULL, 0, 1, &o), 0);
    T_CHECK(z[o.token] > 9.0f);
    free(z); free(rank);
    ex_sampler_destroy(s);
}

static void test_checks(void) {
    ex_sampler *s;
    ex_sampler_create(4, &s);
    float z[4] = { 0 };
    ex_sample_out o;
    ex_sample_params p;
    ex_sample_params_default(&p);
    T_EQ_INT(shm_sampling_check(&p), 0);
    p.top_p = 0; T_EQ_INT(shm_sampling_check(&p), CM_EINVAL); p.top_p = 1;
    p.min_p = 2; T_EQ_INT(shm_sampling_check(&p), CM_EINVAL); p.min_p = 0;
    p.repeat_penalty = 0; T_EQ_INT(shm_sampling_check(&p), CM_EINVAL); p.repeat_penalty = 1;
    p.temperature = NAN; T_EQ_INT(shm_sampling_check(&p), CM_EINVAL); p.temperature = 0;
    p.temperature = -1; T_EQ_INT(shm_sampling_check(&p), CM_EINVAL); p.temperature = 0;
    p.penalty_last_n = -2; T_EQ_INT(shm_sampling_check(&p), CM_EINVAL); p.penalty_last_n = 64;
    p.top_logprobs = EX_MAX_LOGPROBS + 1; T_EQ_INT(shm_sampling_check(&p), CM_EINVAL); p.top_logprobs = 0;
    struct shm_logit_bias b = { 4, 1.0f };
    T_EQ_INT(sample(s, &p, &b, 1, z, NULL, 0, 0, &o), CM_EINVAL); /* id 4 in a vocabulary of 4 */
    b.token = 3; b.bias = NAN;
    T_EQ_INT(sample(s, &p, &b, 1, z, NULL, 0, 0, &o), CM_EINVAL);
    b.bias = -INFINITY;
    T_EQ_INT(sample(s, &p, &b, 1, z, NULL, 0, 0, &o), 0); /* -inf masks token 3 */
    T_CHECK(o.token != 3);
    int32_t prev[1] = { 9 };
    p.repeat_penalty = 1.1f;
    T_EQ_INT(sample(s, &p, NULL, 0, z, prev, 1, 1, &o), CM_EINVAL);
    ex_sampler_destroy(s);
}

int main(void) {
    test_philox_kat();
    test_greedy_and_rng();
    test_filters();
    test_penalties_bias();
    test_big_vocab_topk();
    test_checks();
    return t_done();
}
