/* cuda_sample: the engine's sampling rows packed for the device sampler. */
#include "cuda_sample.h"
#include "common/cm_err.h"

#include <string.h>

_Static_assert(KC_SAMPLE_MAX_TOP == EX_MAX_LOGPROBS, "device and host report the same number of alternatives");

/* Tokens of the penalty window ex_sampler_sample checks (and, with a penalty on, uses). */
static int window_of(const ex_sample_params *p, int n_prev) {
    return p->penalty_last_n < 0 ? n_prev : (p->penalty_last_n < n_prev ? p->penalty_last_n : n_prev);
}

static int penalties_on(const ex_sample_params *p) {
    return p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

int ex__cuda_sample_stage(void *pool, int max_rows, int n_vocab, int n_logits, const ex_sample_row *rows, int n_rows,
                          uint8_t *mark, int *slot, int *n_dev, size_t *bytes) {
    *n_dev = 0;
    *bytes = 0;
    if (n_rows > max_rows || n_rows > n_logits) return CM_EUNSUPPORTED; /* some logits row twice */
    memset(mark, 0, (size_t)n_logits);
    int n_masked = 0;
    for (int r = 0; r < n_rows; r++) {
        const ex_sample_params *p = rows[r].sp;
        if (mark[rows[r].row]++) return CM_EUNSUPPORTED;
        if (rows[r].mask && ++n_masked > KC_SAMPLE_MAX_MASKED) return CM_EUNSUPPORTED;
        if ((penalties_on(p) && rows[r].n_prev > 0 && window_of(p, rows[r].n_prev) > KC_SAMPLE_MAX_WINDOW) ||
            rows[r].n_bias > KC_SAMPLE_MAX_BIAS)
            return CM_EUNSUPPORTED;
    }
    kc_sample_row *kr = pool;
    uint32_t *words = pool;
    size_t w = kc_sample_pool_words_start(max_rows);
    int n = 0;
    for (int r = 0; r < n_rows; r++) {
        const ex_sample_row *sr = &rows[r];
        const ex_sample_params *p = sr->sp;
        slot[r] = -1;
        /* the CPU sampler's refusals, in its order */
        if (ex_sample_row_check(sr, n_vocab)) continue;
        int n_win = window_of(p, sr->n_prev), bad = 0;
        const int32_t *win = sr->prev + sr->n_prev - n_win;
        for (int i = 0; i < n_win && !bad; i++) bad = win[i] < 0 || win[i] >= n_vocab;
        if (bad) continue;
        const int mw = (n_vocab + 31) / 32;
        int first = -1;
        if (sr->mask) { /* nothing allowed: refused, as the CPU sampler does */
            for (int i = 0; i < mw && first < 0; i++) {
                uint32_t m = sr->mask[i];
                if (i == n_vocab / 32 && n_vocab % 32) m &= (1u << (n_vocab % 32)) - 1;
                if (m) first = i * 32 + __builtin_ctz(m);
            }
            if (first < 0) continue;
        }
        if (!penalties_on(p)) n_win = 0;
        kc_sample_row *d = &kr[n];
        memset(d, 0, sizeof *d);
        d->logits_row = sr->row;
        d->top_k = p->top_k;
        d->temperature = p->temperature;
        d->top_p = p->top_p;
        d->min_p = p->min_p;
        d->repeat_penalty = p->repeat_penalty;
        d->presence_penalty = p->presence_penalty;
        d->frequency_penalty = p->frequency_penalty;
        d->logprobs = p->logprobs;
        d->top_logprobs = p->top_logprobs;
        d->seed = p->seed;
        d->pos = sr->pos;
        d->n_bias = sr->n_bias;
        d->bias_off = (int32_t)w;
        for (int i = 0; i < sr->n_bias; i++) {
            words[w++] = (uint32_t)sr->bias[i].token;
            memcpy(&words[w++], &sr->bias[i].bias, 4);
        }
        d->n_win = n_win;
        d->win_off = (int32_t)w;
        memcpy(&words[w], win, sizeof(int32_t) * (size_t)n_win);
        w += (size_t)n_win;
        if (sr->mask) {
            d->mask_words = mw;
            d->mask_off = (int32_t)w;
            d->mask_first = first;
            memcpy(&words[w], sr->mask, sizeof(uint32_t) * (size_t)mw);
            if (n_vocab % 32) words[w + (size_t)mw - 1] &= (1u << (n_vocab % 32)) - 1; /* no bits past the vocabulary */
            w += (size_t)mw;
        }
        slot[r] = n++;
    }
    *n_dev = n;
    *bytes = w * 4;
    return 0;
}

void ex__cuda_sample_out(const kc_sample_out *d, ex_sample_out *o) {
    memset(o, 0, sizeof *o);
    o->token = d->token;
    o->logprob = d->logprob;
    o->n_top = d->n_top;
    memcpy(o->top_id, d->top_id, sizeof o->top_id);
    memcpy(o->top_logprob, d->top_logprob, sizeof o->top_logprob);
}
