/* sched: admission by policy (fair.h), running set, chunked prefill, prefix cache, preemption
 * by recompute. */
#include "sched.h"
#include "fair.h"
#include "kv.h"
#include "../common/cm_err.h"
#include "../common/cm_log.h"
#include "../common/cm_time.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRAM_CACHE 64     /* compiled grammars kept (unused ones are dropped oldest first) */
/* The decode guard's chunks beside decodes: one block until the cost model is fitted (the
 * fit then sees other sizes), and at most GUARD_GROW times the sequence's previous chunk plus a
 * block, so a model fitted on other contexts or chunk sizes cannot jump far past what it saw */
#define GUARD_GROW 2
/* Every GUARD_PROBE-th step of guarded chunks runs its decodes alone: their measured time
 * (an average over such steps) is the bound's base, fresher and closer than the fit's, which
 * shares its positions term with the chunks' */
#define GUARD_PROBE 16

typedef struct seq {
    uint64_t id;
    int32_t *toks;        /* [cap] prompt then generated tokens */
    int      n_toks, cap; /* cap = min(n_prompt + max_tokens, n_ctx) */
    int      n_prompt, n_gen;
    int      n_cached;    /* tokens whose K/V are in the cache (the next forward starts here) */
    ex_kv_table kv;
    ex_sample_params sp;  /* with sp.max_tokens, sp.min_tokens */
    struct shm_logit_bias *bias; /* [n_bias + n_stop]: the request's, then -inf for each stop id */
    int      n_bias;
    int32_t *stop;
    int      n_stop;
    int      in_batch;    /* scheduled in the step being built */
    int      guard_w;     /* its last prompt chunk beside decodes under the decode guard (0: none yet) */
    ex_fair_item fi;      /* priority, tenant, arrival; the waiting queue's links */
    uint64_t *bh;         /* [cap / block_size] prefix cache: chained hashes of toks' full blocks */
    int      n_bh;
    int32_t  pend_blk;    /* a cached block another sequence is computing that it waits for (-1: none) */
    uint32_t pend_gen;
    int      cached;      /* prompt tokens its first admission did not compute (-1: not admitted yet) */
    uint64_t t_submit, queue_ns;
    int      gslot;       /* grammar cache slot, -1: none */
    ex_gram_state gs;     /* the grammar's parse state after the generated tokens */
    int      gerr;        /* the grammar failed this step (CM_ENOMEM): finish with ERROR */
    /* embedding requests */
    int      embed, pooling, normalize;
    double  *acc;         /* [n_embd] MEAN: sum of the rows so far; LAST/CLS: the chosen row */
} seq;

typedef struct gslot {
    uint64_t key;         /* program hash ^ stop ids */
    ex_gram *g;
    int      refs;        /* sequences using it */
    uint64_t used;        /* last use (submit counter) */
} gslot;

/* A prompt chunk's place in the step (order_prefills). */
typedef struct ord_key { int32_t priority; double share; uint64_t arrival; seq *q; } ord_key;

struct ex_sched {
    ex_engine *e;
    ex_kv     *kv;
    ex_limits  lim;
    ex_sched_opts o;
    ex_batch_buf bb;
    seq      **run;       /* [max_running], admission order (oldest first) */
    int        n_run;
    ex_fair   *fair;      /* the waiting queue and the policy (fair.h) */
    int        n_wait;
    int        prefix;    /* the prefix cache is on */
    uint64_t   root;      /* its chains' root: the model */
    int32_t   *ids;       /* [max_blocks] cached blocks found for a request */
    seq      **ord;       /* [max_running] this step's prompt chunks in fair.h's order */
    ord_key   *ordk;      /* [max_running] their sort keys */
    int        n_ord;
    seq      **batch_seq; /* [max_running] sequence of each batch slot */
    int       *batch_n;   /* [max_running] tokens it forwards this step */
    ex_sample_row *srow;  /* [max_running] the step's sampling rows (sequences whose context is complete) */
    ex_sample_out *sout;  /* [max_running] their results */
    ex_event  *pend;      /* [max_running + max_waiting] finishes waiting to be reported */
    int        n_pend;
    /* the forward pass's time against its tokens, fitted as a + b * tokens over recent steps
     * (exponentially weighted least squares): how many tokens cost as much as a step's fixed part */
    double     fit_w, fit_x, fit_y, fit_xx, fit_xy;
    /* the decode guard's cost model, fitted the same way: y = k . (1, tokens, positions read,
     * attention work); the decayed normal equations cm[4][4] k = cv[4] */
    double     cm[4][4], cv[4];
    double     dec_avg;       /* the measured time of recent decode-only steps (s; 0: none yet) ... */
    uint64_t   dec_avg_step;  /* ... the step count at the last of them */
    int        guard_run;     /* steps with guarded chunks since the last decode-only step */
    double     guard_over;    /* how far such steps ran past their predicted cost (s, decayed average
                               * of the excess, 0 where they ran shorter): taken off the bound */
    ex_sched_stats st;
    /* grammars */
    ex_gram_vocab *vocab; /* token bytes (ex_sched_set_vocab), NULL: grammars refused */
    gslot     *gc;        /* [n_gc] */
    int        n_gc, cap_gc;
    uint64_t   gc_tick;
    ex_gram_state **glive; /* [max_running + max_waiting] scratch for compaction */
    /* embeddings: their own queue and batch */
    seq      **eq;        /* ring [max_waiting] */
    int        eq_head, n_eq;
    ex_batch_buf ebb;
    seq      **ebatch;    /* [max_running] sequences of the embedding batch */
    int       *ebatch_n;
    float     *eout;      /* [max_running, n_embd] vectors of the step's finished embeddings */
    int        n_embd;
    char       err[256];  /* why the last submit was refused */
};

void ex_sched_opts_default(ex_sched_opts *o) { memset(o, 0, sizeof *o); }

static void seq_free(ex_sched *s, seq *q) {
    if (!q) return;
    ex_fair_remove(s->fair, &q->fi);
    if (q->kv.blocks) { ex_kv_table_release(s->kv, &q->kv); ex_kv_table_free(&q->kv); }
    if (q->gslot >= 0) s->gc[q->gslot].refs--;
    free(q->toks); free(q->bias); free(q->stop); free(q->bh); free(q->acc);
    free(q);
}

static seq *seq_of(ex_fair_item *it) { return it ? (seq *)((char *)it - offsetof(seq, fi)) : NULL; }

/* The prefix cache's root: what identifies the model (this project has no adapters; one
 * would be mixed in here). */
static uint64_t model_root(const mdl_config *c) {
    int32_t w[48] = { c->arch, c->n_vocab, c->n_embd, c->n_layer, c->n_head, c->n_head_kv, c->head_dim, c->n_ff,
                      c->n_expert, c->n_layer_swa };
    for (int i = 0; i < 16 && c->arch_name[i]; i++) w[16 + i] = c->arch_name[i];
    for (int i = 0; i < 16 && c->name[i]; i++) w[32 + i] = c->name[i];
    return ex_kv_block_hash(0x61726b61ull, w, 48);
}

/* Hashes toks' full blocks not hashed yet. */
static void seq_hash(const ex_sched *s, seq *q) {
    int bs = s->lim.block_size;
    for (; s->prefix && (q->n_bh + 1) * bs <= q->n_toks; q->n_bh++)
        q->bh[q->n_bh] = ex_kv_block_hash(q->n_bh ? q->bh[q->n_bh - 1] : s->root, q->toks + (size_t)q->n_bh * bs, bs);
}

int ex_sched_create(ex_engine *e, const ex_sched_opts *o, ex_sched **out) {
    *out = NULL;
    const ex_limits *L = ex_engine_limits(e);
    ex_sched *s = calloc(1, sizeof *s);
    if (!s) return CM_ENOMEM;
    s->e = e;
    s->kv = ex_engine_kv(e);
    s->lim = *L;
    s->o = *o;
    if (s->o.max_running <= 0 || s->o.max_running > L->max_seqs) s->o.max_running = L->max_seqs;
    if (s->o.max_tokens <= 0 || s->o.max_tokens > L->max_tokens) s->o.max_tokens = L->max_tokens;
    if (s->o.max_waiting <= 0) s->o.max_waiting = 1024;
    if (s->o.max_running > s->o.max_tokens) s->o.max_running = s->o.max_tokens;
    int rc = CM_ENOMEM;
    int R = s->o.max_running, W = s->o.max_waiting;
    s->run = calloc((size_t)R, sizeof *s->run);
    s->ids = calloc((size_t)L->max_blocks, sizeof *s->ids);
    s->ord = calloc((size_t)R, sizeof *s->ord);
    s->ordk = calloc((size_t)R, sizeof *s->ordk);
    s->batch_seq = calloc((size_t)R, sizeof *s->batch_seq);
    s->batch_n = calloc((size_t)R, sizeof *s->batch_n);
    s->srow = calloc((size_t)R, sizeof *s->srow);
    s->sout = calloc((size_t)R, sizeof *s->sout);
    s->pend = calloc((size_t)(R + W), sizeof *s->pend);
    s->glive = calloc((size_t)(R + W), sizeof *s->glive);
    s->eq = calloc((size_t)W, sizeof *s->eq);
    s->ebatch = calloc((size_t)R, sizeof *s->ebatch);
    s->ebatch_n = calloc((size_t)R, sizeof *s->ebatch_n);
    s->n_embd = ex_engine_model(e)->cfg.n_embd;
    s->eout = calloc((size_t)R * (size_t)s->n_embd, sizeof *s->eout);
    if (!s->run || !s->ids || !s->ord || !s->ordk || !s->batch_seq || !s->batch_n || !s->srow || !s->sout || !s->pend ||
        !s->glive || !s->eq || !s->ebatch || !s->ebatch_n || !s->eout)
        goto fail;
    if ((rc = ex_batch_buf_init(&s->bb, L)) || (rc = ex_batch_buf_init(&s->ebb, L)) ||
        (rc = ex_fair_create(R + W, R, ex_kv_n_blocks(s->kv), &s->fair)))
        goto fail;
    if (!o->no_prefix_cache) {
        s->root = model_root(&ex_engine_model(e)->cfg);
        int pc = ex_kv_prefix_enable(s->kv, s->root);
        if (pc == CM_EUNSUPPORTED)
            CM_LOG_INFO("sched", "prefix cache off: the model has sliding-window layers, whose KV blocks leave the window",
                        "layers_swa=%d", ex_engine_model(e)->cfg.n_layer_swa);
        else if (pc) {
            rc = pc;
            goto fail;
        }
        s->prefix = pc == 0;
    }
    *out = s;
    return 0;
fail:
    ex_sched_destroy(s);
    return rc;
}

void ex_sched_destroy(ex_sched *s) {
    if (!s) return;
    for (int i = 0; i < s->n_run; i++) seq_free(s, s->run[i]);
    if (s->fair)
        for (ex_fair_item *it; (it = ex_fair_first(s->fair));) seq_free(s, seq_of(it));
    for (int i = 0; i < s->n_eq; i++) seq_free(s, s->eq[(s->eq_head + i) % s->o.max_waiting]);
    ex_fair_destroy(s->fair);
    ex_batch_buf_free(&s->bb);
    ex_batch_buf_free(&s->ebb);
    for (int i = 0; i < s->n_gc; i++) ex_gram_destroy(s->gc[i].g);
    free(s->gc);
    ex_gram_vocab_destroy(s->vocab);
    free(s->run); free(s->ids); free(s->ord); free(s->ordk); free(s->batch_seq); free(s->batch_n); free(s->srow); free(s->sout);
    free(s->pend);
    free(s->glive); free(s->eq); free(s->ebatch); free(s->ebatch_n); free(s->eout);
    free(s);
}

const char *ex_sched_error(const ex_sched *s) { return s->err; }

int ex_sched_set_vocab(ex_sched *s, ex_gram_vocab *v) {
    for (int i = 0; i < s->n_gc; i++)
        if (s->gc[i].refs) {
            ex_gram_vocab_destroy(v);
            return CM_ESTATE;
        }
    for (int i = 0; i < s->n_gc; i++) ex_gram_destroy(s->gc[i].g);
    s->n_gc = 0;
    ex_gram_vocab_destroy(s->vocab);
    s->vocab = v;
    return 0;
}

/* The cache slot of a grammar program for these stop ids (made when new). Returns the slot, or
 * a negative code with s->err set. */
static int gram_get(ex_sched *s, const void *prog, size_t len, const int32_t *stop, int n_stop) {
    uint64_t key = ex_gram_hash(prog, len);
    for (int i = 0; i < n_stop; i++) key = ex_rng_mix(key ^ (uint64_t)(uint32_t)stop[i]);
    for (int i = 0; i < s->n_gc; i++)
        if (s->gc[i].key == key) {
            s->gc[i].used = ++s->gc_tick;
            return i;
        }
    ex_gram *g;
    int rc = ex_gram_create(prog, len, s->vocab, stop, n_stop, &g, s->err, sizeof s->err);
    if (rc) return rc == CM_EFORMAT ? CM_EINVAL : rc;
    int slot = -1;
    if (s->n_gc >= GRAM_CACHE) /* the least recently used grammar no sequence uses */
        for (int i = 0; i < s->n_gc; i++)
            if (!s->gc[i].refs && (slot < 0 || s->gc[i].used < s->gc[slot].used)) slot = i;
    if (slot >= 0) ex_gram_destroy(s->gc[slot].g);
    else {
        if (s->n_gc == s->cap_gc) {
            int cap = s->cap_gc ? s->cap_gc * 2 : 8;
            gslot *n = realloc(s->gc, sizeof *n * (size_t)cap);
            if (!n) { ex_gram_destroy(g); return CM_ENOMEM; }
            s->gc = n;
            s->cap_gc = cap;
        }
        slot = s->n_gc++;
    }
    s->gc[slot] = (gslot){ key, g, 0, ++s->gc_tick };
    return slot;
}

static seq *find(ex_sched *s, uint64_t id, int *where, int *idx) {
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i]->id == id) { *where = 0; *idx = i; return s->run[i]; }
    for (ex_fair_item *it = ex_fair_first(s->fair); it; it = ex_fair_after(s->fair, it))
        if (seq_of(it)->id == id) { *where = 1; *idx = -1; return seq_of(it); }
    for (int i = 0; i < s->n_eq; i++) {
        seq *q = s->eq[(s->eq_head + i) % s->o.max_waiting];
        if (q->id == id) { *where = 2; *idx = i; return q; }
    }
    return NULL;
}

static int blocks_for(const ex_sched *s, int n_pos) { return (n_pos + s->lim.block_size - 1) / s->lim.block_size; }

#define REFUSE(rc, ...) do { snprintf(s->err, sizeof s->err, __VA_ARGS__); return (rc); } while (0)

/* An embedding request: its own queue. */
static int embed_submit(ex_sched *s, const ex_request *r) {
    int where, idx;
    if (!ex_engine_has_hidden(s->e)) REFUSE(CM_EUNSUPPORTED, "this backend has no hidden-state forward (no embeddings)");
    if (r->pooling != MDL_POOL_MEAN && r->pooling != MDL_POOL_LAST && r->pooling != MDL_POOL_CLS)
        REFUSE(CM_EINVAL, "pooling %d", r->pooling);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->lim.n_vocab) REFUSE(CM_EINVAL, "prompt token id out of the vocabulary");
    if (find(s, r->id, &where, &idx)) REFUSE(CM_EINVAL, "duplicate request id");
    if (r->n_prompt > s->lim.n_ctx) REFUSE(CM_ECTX, "the input does not fit the context");
    if (blocks_for(s, r->n_prompt) > ex_kv_n_blocks(s->kv)) REFUSE(CM_ENOKV, "the input could never fit the KV pool");
    if (s->n_eq >= s->o.max_waiting || s->n_wait + s->n_run + s->n_eq + s->n_pend >= s->o.max_running + s->o.max_waiting)
        REFUSE(CM_EFULL, "executor queue is full");
    seq *q = calloc(1, sizeof *q);
    if (!q) return CM_ENOMEM;
    q->gslot = -1;
    q->id = r->id;
    q->embed = 1;
    q->pooling = r->pooling;
    q->normalize = r->normalize;
    q->cap = q->n_prompt = q->n_toks = r->n_prompt;
    q->toks = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
    q->acc = calloc((size_t)s->n_embd, sizeof(double));
    if (!q->toks || !q->acc || ex_kv_table_init(&q->kv, s->lim.max_blocks)) {
        seq_free(s, q);
        return CM_ENOMEM;
    }
    memcpy(q->toks, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    s->eq[(s->eq_head + s->n_eq) % s->o.max_waiting] = q;
    s->n_eq++;
    return 0;
}

int ex_sched_submit(ex_sched *s, const ex_request *r) {
    int where, idx;
    s->err[0] = 0;
    if (!r->prompt || r->n_prompt <= 0 || (!r->embed && (r->sp.max_tokens < 1 || r->sp.max_tokens > INT32_MAX)) ||
        r->n_stop < 0 || (r->n_stop && !r->stop_ids) || r->n_generated < 0 || r->n_generated >= r->n_prompt ||
        (r->n_generated && (r->embed || (uint32_t)r->n_generated >= r->sp.max_tokens)))
        REFUSE(CM_EINVAL, "invalid request");
    if (r->embed) return embed_submit(s, r);
    ex_sample_row check = { .sp = &r->sp, .bias = r->bias, .n_bias = r->n_bias };
    if (ex_sample_row_check(&check, s->lim.n_vocab)) REFUSE(CM_EINVAL, "invalid sampling parameters");
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->lim.n_vocab) REFUSE(CM_EINVAL, "prompt token id out of the vocabulary");
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= s->lim.n_vocab) REFUSE(CM_EINVAL, "stop id out of the vocabulary");
    if (find(s, r->id, &where, &idx)) REFUSE(CM_EINVAL, "duplicate request id");
    if (r->n_prompt >= s->lim.n_ctx) REFUSE(CM_ECTX, "prompt does not fit the context");
    /* the longest the sequence can grow (prompt + max_tokens, at most n_ctx) must fit the pool
     * alone, or it could never finish: refused now rather than failed mid-generation */
    int n_orig = r->n_prompt - r->n_generated; /* the request's own prompt */
    int64_t longest = (int64_t)n_orig + r->sp.max_tokens;
    if (longest > s->lim.n_ctx) longest = s->lim.n_ctx;
    if (blocks_for(s, (int)longest) > ex_kv_n_blocks(s->kv)) REFUSE(CM_ENOKV, "the request could never fit the KV pool");
    /* pend holds one finish per sequence freed before the next step: keep live + pending
     * within its size */
    if (s->n_wait >= s->o.max_waiting || s->n_wait + s->n_run + s->n_eq + s->n_pend >= s->o.max_running + s->o.max_waiting)
        REFUSE(CM_EFULL, "executor queue is full");
    int gslot = -1;
    if (r->grammar) {
        if (!s->vocab) REFUSE(CM_ESTATE, "a grammar came before the vocabulary");
        if ((gslot = gram_get(s, r->grammar, r->grammar_len, r->stop_ids, r->n_stop)) < 0) {
            if (!s->err[0]) snprintf(s->err, sizeof s->err, "grammar: %s", cm_err_str(gslot));
            return gslot;
        }
    }

    seq *q = calloc(1, sizeof *q);
    if (!q) return CM_ENOMEM;
    q->gslot = -1;
    if (gslot >= 0) {
        if (ex_gram_state_init(s->gc[gslot].g, &q->gs)) { free(q); REFUSE(CM_ENOMEM, "grammar: out of memory"); }
        q->gslot = gslot;
        s->gc[gslot].refs++;
        /* a resumed generation: its delivered output already went through the grammar */
        for (int i = n_orig; i < r->n_prompt; i++)
            if (ex_gram_advance(s->gc[gslot].g, &q->gs, r->prompt[i])) {
                seq_free(s, q);
                REFUSE(CM_EINVAL, "a resumed generation's output does not follow its grammar");
            }
    }
    q->id = r->id;
    q->cap = (int)longest;
    q->n_toks = r->n_prompt;
    q->n_prompt = n_orig;
    q->n_gen = r->n_generated;
    q->sp = r->sp;
    q->n_stop = r->n_stop;
    q->toks = malloc(sizeof(int32_t) * (size_t)q->cap);
    if (!q->toks) goto nomem;
    memcpy(q->toks, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    if (r->n_bias || r->n_stop) {
        if (!(q->bias = malloc(sizeof *q->bias * (size_t)(r->n_bias + r->n_stop)))) goto nomem;
        if (r->n_bias) memcpy(q->bias, r->bias, sizeof *q->bias * (size_t)r->n_bias);
        for (int i = 0; i < r->n_stop; i++) q->bias[r->n_bias + i] = (struct shm_logit_bias){ r->stop_ids[i], -INFINITY };
        q->n_bias = r->n_bias;
    }
    if (r->n_stop) {
        if (!(q->stop = malloc(sizeof(int32_t) * (size_t)r->n_stop))) goto nomem;
        memcpy(q->stop, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop);
    }
    if (ex_kv_table_init(&q->kv, s->lim.max_blocks)) goto nomem;
    if (s->prefix && !(q->bh = malloc(sizeof *q->bh * (size_t)(q->cap / s->lim.block_size + 1)))) goto nomem;
    seq_hash(s, q);
    q->pend_blk = -1;
    q->cached = -1;
    q->t_submit = cm_time_ns();
    q->fi.priority = r->priority;
    if (ex_fair_wait(s->fair, &q->fi, r->tenant, r->weight)) { /* cannot happen: the caps above keep room */
        seq_free(s, q);
        return CM_EFULL;
    }
    s->n_wait++;
    return 0;
nomem:
    seq_free(s, q);
    return CM_ENOMEM;
}

static void push_pending(ex_sched *s, const seq *q, int32_t tok, int finish, int err) {
    ex_event *ev = &s->pend[s->n_pend++];
    memset(ev, 0, sizeof *ev);
    ev->id = q->id;
    ev->token = tok;
    ev->so.token = tok;
    ev->finish = finish;
    ev->err = err;
    ev->n_prompt = q->n_prompt;
    ev->n_gen = q->n_gen;
    ev->n_cached = q->cached > 0 ? q->cached : 0;
    ev->queue_ns = q->queue_ns;
}

static void run_remove(ex_sched *s, int i) {
    memmove(s->run + i, s->run + i + 1, sizeof *s->run * (size_t)(s->n_run - i - 1));
    s->n_run--;
}

int ex_sched_cancel(ex_sched *s, uint64_t id) {
    int where, idx;
    seq *q = find(s, id, &where, &idx);
    if (!q) return CM_ENOTFOUND;
    /* pend has room for every live sequence, so this cannot overflow */
    push_pending(s, q, -1, SHM_FINISH_CANCELLED, 0);
    if (where == 0) run_remove(s, idx);
    else if (where == 1) s->n_wait--;
    else {
        int W = s->o.max_waiting;
        for (int k = idx; k > 0; k--) s->eq[(s->eq_head + k) % W] = s->eq[(s->eq_head + k - 1) % W];
        s->eq_head = (s->eq_head + 1) % W;
        s->n_eq--;
    }
    seq_free(s, q);
    return 0;
}

/* Preempts running sequence i: releases its blocks (computed ones stay in the prefix cache
 * until evicted) and requeues it, ahead of its tenant's later arrivals, to be recomputed from
 * its tokens; not a candidate again in this admission round. */
static void preempt(ex_sched *s, int i) {
    seq *q = s->run[i];
    run_remove(s, i);
    ex_kv_table_release(s->kv, &q->kv);
    q->n_cached = 0;
    if (s->n_wait < s->o.max_waiting) {
        ex_fair_wait(s->fair, &q->fi, 0, 0);
        ex_fair_skip(s->fair, &q->fi);
        s->n_wait++;
    } else {
        /* the queue is full of newer requests: this one cannot wait; report it */
        push_pending(s, q, -1, SHM_FINISH_ERROR, CM_ENOKV);
        for (int k = 0; k < s->n_ord; k++)
            if (s->ord[k] == q) s->ord[k] = NULL;
        seq_free(s, q);
    }
    s->st.preemptions++;
}

static int run_index(const ex_sched *s, const seq *q) {
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i] == q) return i;
    return -1;
}

/* A running sequence (not q) whose computed positions [k*bs, k*bs + n) hold q's tokens there,
 * after the same k cached blocks: the source of a copy. Its block k, or -1. */
static int32_t copy_donor(const ex_sched *s, const seq *q, int k, int n) {
    int bs = s->lim.block_size;
    for (int i = 0; i < s->n_run; i++) {
        const seq *d = s->run[i];
        if (d->kv.n <= k || d->n_cached < k * bs + n || (k && d->kv.blocks[k - 1] != s->ids[k - 1])) continue;
        if (!memcmp(d->toks + (size_t)k * bs, q->toks + (size_t)k * bs, sizeof *q->toks * (size_t)n)) return d->kv.blocks[k];
    }
    return -1;
}

/* Prompt tokens of running sequences that go before q in this step (fair.h's order). */
static int prefill_ahead(const ex_sched *s, const seq *q) {
    int n = 0;
    for (int i = 0; i < s->n_run; i++) {
        const seq *r = s->run[i];
        int rem = r->n_toks - r->n_cached;
        if (rem > 1 && ex_fair_before(s->fair, &r->fi, &q->fi)) n += rem;
    }
    return n;
}

/* The running sequence fair.h lets q (needing need blocks) preempt, the best victim of them;
 * -1 when none may. */
static int admission_victim(const ex_sched *s, const seq *q, int need) {
    int v = -1;
    for (int i = 0; i < s->n_run; i++)
        if (ex_fair_may_preempt(s->fair, &s->run[i]->fi, &q->fi, need) &&
            (v < 0 || ex_fair_victim_before(s->fair, &s->run[i]->fi, &s->run[v]->fi)))
            v = i;
    return v;
}

/* Admissions, before the step's batch is built: waiting requests in fair.h's order while
 * running slots, KV blocks (beyond their cached prefix, and leaving the decoding sequences'
 * growth of this step) and the token budget allow. A request that does not fit may preempt
 * the running sequences fair.h lets it; one whose prefix another sequence is computing waits
 * for it. */
static void admit(ex_sched *s) {
    if (!s->n_wait) return;
    ex_kv *kv = s->kv;
    const int bs = s->lim.block_size;
    int n_dec = 0, growth = 0;
    for (int i = 0; i < s->n_run; i++) {
        const seq *r = s->run[i];
        if (r->n_toks - r->n_cached == 1) {
            n_dec++;
            growth += ex_kv_table_need(kv, &r->kv, r->n_toks);
        }
    }
    ex_fair_round(s->fair);
    for (ex_fair_item *it; (it = ex_fair_next(s->fair));) {
        seq *q = seq_of(it);
        if (q->pend_blk >= 0 && ex_kv_prefix_pending(kv, q->pend_blk, q->pend_gen)) {
            ex_fair_skip(s->fair, it);
            continue;
        }
        /* the cached prefix: whole blocks before the last token (which is always computed),
         * and the next block's positions copied when another sequence has them */
        int k = 0, copy_n = 0, last = (q->n_toks - 1) / bs;
        int32_t copy_src = -1;
        if (s->prefix) {
            k = ex_kv_prefix_match(kv, q->bh, q->toks, q->n_bh, s->ids, &q->pend_blk, &q->pend_gen);
            if (q->pend_blk >= 0) {
                ex_fair_skip(s->fair, it);
                continue;
            }
            copy_n = q->n_toks - 1 - last * bs;
            if (k > last) copy_src = s->ids[last]; /* a whole cached block holds them */
            else if (k == last && copy_n > 0) copy_src = copy_donor(s, q, k, copy_n);
            if (k > last) k = last;
            if (copy_src < 0) copy_n = 0;
        }
        if (s->o.max_tokens - n_dec - prefill_ahead(s, q) <= 0) break; /* no budget left for it this step */
        int need = blocks_for(s, q->n_toks) - k;
        int idle = ex_kv_prefix_idle(kv, s->ids, k) + (copy_src >= 0 && ex_kv_prefix_idle(kv, &copy_src, 1));
        /* besides this step's growth, 1 % of the pool stays free for the next steps' while
         * anything runs, so an admission is not preempted right after */
        int reserve = growth + (s->n_run ? ex_kv_n_blocks(kv) / 100 : 0);
        if (s->n_run >= s->o.max_running || need + idle + reserve > ex_kv_n_free(kv)) {
            int v = admission_victim(s, q, need);
            if (v < 0) break;
            if (s->run[v]->n_toks - s->run[v]->n_cached == 1) {
                n_dec--;
                growth -= ex_kv_table_need(kv, &s->run[v]->kv, s->run[v]->n_toks);
            }
            preempt(s, v);
            continue;
        }
        memcpy(q->kv.blocks, s->ids, sizeof *s->ids * (size_t)k);
        if (ex_kv_table_adopt(kv, &q->kv, k)) break; /* cannot happen: the blocks were just found */
        if (copy_src >= 0) ex_kv_block_ref(kv, copy_src); /* kept while the rest is allocated */
        int rc = ex_kv_table_reserve(kv, &q->kv, q->n_toks);
        if (!rc && copy_src >= 0 && ex_engine_kv_copy(s->e, copy_src, q->kv.blocks[k], copy_n) == 0) s->st.kv_copies++;
        else copy_n = 0;
        if (copy_src >= 0) ex_kv_block_unref(kv, copy_src);
        if (rc) { /* cannot happen: counted above */
            ex_kv_table_release(kv, &q->kv);
            break;
        }
        q->n_cached = k * bs + copy_n;
        q->pend_blk = -1;
        ex_kv_table_register(kv, &q->kv, q->bh, q->toks, q->n_bh);
        ex_fair_run(s->fair, it, q->kv.n);
        s->n_wait--;
        s->run[s->n_run++] = q;
        if (s->prefix) {
            s->st.prefix_queries += (uint64_t)q->n_toks;
            s->st.prefix_hits += (uint64_t)q->n_cached;
        }
        if (q->cached < 0) {
            q->cached = q->n_cached < q->n_prompt ? q->n_cached : q->n_prompt;
            q->queue_ns = cm_time_ns() - q->t_submit;
        }
    }
}

static int ord_cmp(const void *pa, const void *pb) {
    const ord_key *a = pa, *b = pb;
    if (a->priority != b->priority) return a->priority < b->priority ? -1 : 1;
    if (a->share != b->share) return a->share < b->share ? -1 : 1;
    return a->arrival < b->arrival ? -1 : a->arrival > b->arrival;
}

/* Orders this step's prompt chunks (running sequences with more than one token to compute)
 * into s->ord as fair.h's ex_fair_before would. */
static void order_prefills(ex_sched *s) {
    s->n_ord = 0;
    for (int i = 0; i < s->n_run; i++) {
        seq *q = s->run[i];
        if (q->n_toks - q->n_cached > 1)
            s->ordk[s->n_ord++] = (ord_key){ q->fi.priority, ex_fair_share(s->fair, &q->fi, 0, 0), q->fi.arrival, q };
    }
    qsort(s->ordk, (size_t)s->n_ord, sizeof *s->ordk, ord_cmp);
    for (int i = 0; i < s->n_ord; i++) s->ord[i] = s->ordk[i].q;
}

/* Adds a step of x tokens that took y seconds to the fitted cost (weights decay by 0.98 a step). */
static void fit_step(ex_sched *s, double x, double y) {
    const double d = 0.98;
    s->fit_w = s->fit_w * d + 1;
    s->fit_x = s->fit_x * d + x;
    s->fit_y = s->fit_y * d + y;
    s->fit_xx = s->fit_xx * d + x * x;
    s->fit_xy = s->fit_xy * d + x * y;
}

/* Adds a step that took y seconds to the decode guard's cost model: f = (1, tokens, positions
 * read (each sequence's context: its K/V pass over the memory), attention work (each token x
 * the positions it attends to)); weights decay by 0.98 a step. */
static void cost_add(ex_sched *s, const double f[4], double y) {
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) s->cm[i][j] = s->cm[i][j] * 0.98 + f[i] * f[j];
        s->cv[i] = s->cv[i] * 0.98 + f[i] * y;
    }
}

/* Whether the guard's cost model is given (opts.step_cost, in units of its own) rather than fitted. */
static int cost_given(const ex_sched *s) {
    const double *o = s->o.step_cost;
    return o[0] > 0 || o[1] > 0 || o[2] > 0;
}

/* The measured time of decode-only steps, where recent (within 4 probes' spacing): 0 if none. */
static double dec_recent(const ex_sched *s) {
    return s->dec_avg > 0 && s->st.steps - s->dec_avg_step <= 4 * GUARD_PROBE ? s->dec_avg : 0;
}

/* The guard's cost model k (opts.step_cost: a, b, c with no positions term; else the fit,
 * solved by elimination with partial pivoting). The normal equations get a ridge of 1e-4 of
 * their diagonal: steps that are alike in some direction (every step with the same tokens, a
 * chunk always of one size, a context that grows in step with the decodes') leave the fit
 * singular there, and without the ridge it stayed unfitted for the whole of a long prompt.
 * 0 while the fit has too few steps or gives no positive cost to a chunk's tokens, positions
 * or attention work: the guard then takes one block a step. */
static int cost_model(const ex_sched *s, double k[4]) {
    const double *o = s->o.step_cost;
    if (cost_given(s)) {
        k[0] = o[0], k[1] = o[1], k[2] = 0, k[3] = o[2];
        return 1;
    }
    if (s->cm[0][0] < 8) return 0;
    double A[4][5];
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) A[i][j] = s->cm[i][j];
        A[i][i] += 1e-4 * s->cm[i][i];
        A[i][4] = s->cv[i];
    }
    for (int c = 0; c < 4; c++) {
        int p = c;
        for (int r = c + 1; r < 4; r++) if (fabs(A[r][c]) > fabs(A[p][c])) p = r;
        if (!(fabs(A[p][c]) > 1e-12 * (fabs(s->cm[c][c]) + 1e-300))) return 0; /* a feature never seen */
        if (p != c) for (int j = 0; j < 5; j++) { double t = A[c][j]; A[c][j] = A[p][j]; A[p][j] = t; }
        for (int r = 0; r < 4; r++) {
            if (r == c) continue;
            double f = A[r][c] / A[c][c];
            for (int j = c; j < 5; j++) A[r][j] -= f * A[c][j];
        }
    }
    for (int i = 0; i < 4; i++) k[i] = A[i][4] / A[i][i];
    for (int i = 0; i < 4; i++) k[i] = k[i] > 0 ? k[i] : 0;
    return k[1] > 0 || k[2] > 0 || k[3] > 0;
}

/* The most tokens of a prompt chunk at context n0 whose cost b w + d (n0 + w) + c w (n0 + w)
 * fits e. */
static int chunk_fit(const double k[4], int n0, double e) {
    const double b = k[1], d = k[2], c = k[3], rest = e - d * n0;
    if (rest <= 0) return 0;
    double B = b + d + c * n0, w = c > 0 ? (-B + sqrt(B * B + 4 * c * rest)) / (2 * c) : B > 0 ? rest / B : 1e9;
    return w >= 1e9 ? 1000000000 : (int)w;
}

/* The tokens whose cost equals a step's fixed cost (a / b of the fitted a + b * tokens), within
 * [0, budget]; an eighth of the budget until the fit has seen steps of different sizes. */
static int fixed_tokens(const ex_sched *s) {
    int budget = s->o.max_tokens, dflt = budget / 8 > 0 ? budget / 8 : 1;
    if (s->o.fixed_tokens > 0) return s->o.fixed_tokens < budget ? s->o.fixed_tokens : budget;
    double den = s->fit_w * s->fit_xx - s->fit_x * s->fit_x;
    if (s->fit_w < 8 || !(den > 1e-9 * s->fit_w * s->fit_xx)) return dflt;
    double b = (s->fit_w * s->fit_xy - s->fit_x * s->fit_y) / den, a = (s->fit_y - b * s->fit_x) / s->fit_w;
    if (!(b > 0) || !(a >= 0)) return dflt;
    double t = a / b;
    return t > budget ? budget : (int)t;
}

/* The sequence to preempt so that q can grow: the best victim by fair.h among the running
 * sequences not in this step's batch, q itself included. Its index, or -1 when q is the only
 * candidate. */
static int growth_victim(const ex_sched *s, const seq *q) {
    int v = -1, others = 0;
    for (int i = 0; i < s->n_run; i++) {
        const seq *r = s->run[i];
        if (r->in_batch) continue;
        others += r != q;
        if (v < 0 || ex_fair_victim_before(s->fair, &r->fi, &s->run[v]->fi)) v = i;
    }
    return others ? v : -1;
}

static int is_stop(const seq *q, int32_t t) {
    for (int i = 0; i < q->n_stop; i++) if (q->stop[i] == t) return 1;
    return 0;
}

/* Embedding requests: one hidden-state forward over the next chunks of the queue's requests,
 * in order, pooled into their accumulators; each finished one gets its event (vector in
 * s->eout). Returns 0 or the forward's error. */
static int embed_step(ex_sched *s, ex_event *ev, int *n_ev, int cap) {
    if (!s->n_eq) return 0;
    int W = s->o.max_waiting, budget = s->o.max_tokens, rows = s->lim.max_out, nb = 0;
    ex_batch_buf_clear(&s->ebb);
    for (int i = 0; i < s->n_eq && budget > 0 && rows > 0 && nb < s->o.max_running && *n_ev + nb < cap; i++) {
        seq *q = s->eq[(s->eq_head + i) % W];
        int want = q->n_toks - q->n_cached;
        if (want > budget) want = budget;
        /* the mean needs every row, the first token's row its first chunk's */
        int all = q->pooling == MDL_POOL_MEAN || (q->pooling == MDL_POOL_CLS && q->n_cached == 0);
        if (all && want > rows) want = rows;
        if (ex_kv_table_reserve(s->kv, &q->kv, q->n_cached + want)) break; /* no blocks now: wait, in order */
        if (ex_batch_buf_add_kv(&s->ebb, q->toks + q->n_cached, want, q->n_cached, &q->kv, all) < 0) break;
        s->ebatch[nb] = q;
        s->ebatch_n[nb] = want;
        nb++;
        budget -= want;
        rows -= all ? want : 1;
    }
    if (!nb) return 0;
    const float *h;
    int rc = ex_engine_forward_hidden(s->e, &s->ebb.b, &h);
    if (rc) return rc;
    s->st.steps++;
    s->st.tokens_forwarded += (uint64_t)s->ebb.b.n_tokens;
    const int E = s->n_embd;
    const ex_batch *bt = &s->ebb.b;
    int done = 0;
    for (int b = 0; b < nb; b++) {
        seq *q = s->ebatch[b];
        int n = bt->out_all[b] ? bt->seq_len[b] : 1;
        const float *r0 = h + (size_t)bt->seq_out[b] * E;
        if (q->pooling == MDL_POOL_MEAN)
            for (int r = 0; r < n; r++)
                for (int i = 0; i < E; i++) q->acc[i] += r0[(size_t)r * E + i];
        else if (q->pooling == MDL_POOL_CLS && q->n_cached == 0)
            for (int i = 0; i < E; i++) q->acc[i] = r0[i];
        q->n_cached += s->ebatch_n[b];
        ex_kv_table_slide(s->kv, &q->kv, q->n_cached);
        if (q->n_cached < q->n_toks) continue;
        if (q->pooling == MDL_POOL_LAST)
            for (int i = 0; i < E; i++) q->acc[i] = r0[(size_t)(n - 1) * E + i];
        float *o = s->eout + (size_t)done++ * E;
        double ss = 0;
        for (int i = 0; i < E; i++) {
            o[i] = (float)(q->pooling == MDL_POOL_MEAN ? q->acc[i] / q->n_toks : q->acc[i]);
            ss += (double)o[i] * o[i];
        }
        if (q->normalize && ss > 0) {
            float inv = (float)(1.0 / sqrt(ss));
            for (int i = 0; i < E; i++) o[i] *= inv;
        }
        ex_event *e = &ev[(*n_ev)++];
        memset(e, 0, sizeof *e);
        e->id = q->id;
        e->token = -1;
        e->so.token = -1;
        e->finish = SHM_FINISH_STOP;
        e->n_prompt = q->n_prompt;
        e->embd = o;
        e->n_embd = E;
        q->embed = 2; /* finished: leaves the queue below */
    }
    /* the finished ones leave the queue, the others keep their order */
    int k = 0;
    for (int i = 0; i < s->n_eq; i++) {
        seq *q = s->eq[(s->eq_head + i) % W];
        if (q->embed == 2) seq_free(s, q);
        else s->eq[(s->eq_head + k++) % W] = q;
    }
    s->n_eq = k;
    return 0;
}

/* Compacts the tables of every grammar in use that has grown past its soft size, passing the
 * parse states of the sequences using it. */
static void gram_maintain(ex_sched *s) {
    for (int gi = 0; gi < s->n_gc; gi++) {
        if (!s->gc[gi].refs || !ex_gram_wants_compact(s->gc[gi].g)) continue;
        int n = 0;
        for (int i = 0; i < s->n_run; i++)
            if (s->run[i]->gslot == gi) s->glive[n++] = &s->run[i]->gs;
        for (ex_fair_item *it = ex_fair_first(s->fair); it; it = ex_fair_after(s->fair, it))
            if (seq_of(it)->gslot == gi) s->glive[n++] = &seq_of(it)->gs;
        ex_gram_compact(s->gc[gi].g, s->glive, n, 0); /* on failure the states' masks fail: ERROR */
    }
}

int ex_sched_step(ex_sched *s, ex_event *ev, int cap, int *n_ev) {
    *n_ev = 0;
    if (cap < s->o.max_running) return CM_EINVAL;
    gram_maintain(s);
    int n = 0;
    /* finishes from cancels and earlier preemption failures first */
    int take = s->n_pend < cap ? s->n_pend : cap;
    memcpy(ev, s->pend, sizeof *ev * (size_t)take);
    memmove(s->pend, s->pend + take, sizeof *ev * (size_t)(s->n_pend - take));
    s->n_pend -= take;
    n = take;
    int room = cap - n; /* events left for this step's sequences */

    admit(s);
    order_prefills(s);
    ex_batch_buf_clear(&s->bb);
    int budget = s->o.max_tokens, nb = 0;
    /* Between tenants (fair.h): the step's first prompt chunk in fair.h's order leads it; the
     * prompt chunks that yield to it (less urgent, or of a tenant with a larger share) wait, and
     * so do the decodes that yield to it far (less urgent, or of a tenant with more than twice
     * its share), so a light tenant's first token is not held up by a flooding one; and prompt
     * chunks of a tenant over its share while another runs may make a step cost at most twice
     * what it would without them (by the fitted cost of a step; at least a sixteenth of the
     * budget), so steps stay short while the other's next request may be waiting for its first
     * token. */
    const ex_fair_item *lead = s->n_ord ? &s->ord[0]->fi : NULL;
    int other = 0, over = 0, fixed = fixed_tokens(s), budget_min = s->o.max_tokens / 16 > 0 ? s->o.max_tokens / 16 : 1;
    for (int i = 0; i < s->n_run; i++) s->run[i]->in_batch = 0;
    /* the decode guard (sched.h): its model, the decodes' cost, the bound */
    double ck[4] = { 0 }, stall = s->o.stall_max, dec_cost = 0, cost;
    int guard = stall > 0, fitted = guard && cost_model(s, ck), n_dec = 0, n_chunks = 0, n_guarded = 0;
    const int probe = guard && s->guard_run >= GUARD_PROBE; /* the guarded chunks sit this step out */
    cost = ck[0]; /* the step's predicted cost so far */
    /* Pass 0: decoding sequences (one token each, oldest first), pass 1: prompt chunks in
     * fair.h's order, so a long prompt never delays the running decodes. A sequence that needs
     * a block when none is free preempts the best victim among the running sequences not
     * already in this step's batch (itself, when fair.h ranks it first); when there is none,
     * it sits this step out (or, alone, finishes with CM_ENOKV). */
    /* the bound's base: the decodes' measured time alone where recent (not with a given model,
     * whose units are its own), capped by the fit's */
    const int given = cost_given(s);
    const double dec_meas = given ? 0 : dec_recent(s);
    double base = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            dec_cost = cost; /* the decodes alone */
            base = dec_meas > 0 && dec_meas < dec_cost ? dec_meas : dec_cost;
        }
        for (int i = 0; i < (pass ? s->n_ord : s->n_run) && budget > 0 && nb < room; i++) {
            seq *q = pass ? s->ord[i] : s->run[i];
            if (!q || q->fi.state != EX_FAIR_RUNNING) continue; /* preempted in this pass */
            int want = q->n_toks - q->n_cached;
            if (q->in_batch || (pass == 0) != (want == 1)) continue;
            if (want > budget) want = budget;
            int is_over = pass && ex_fair_over(s->fair, &q->fi);
            int over_left = (other + fixed > budget_min ? other + fixed : budget_min) - over;
            if ((lead && ex_fair_yields(s->fair, &q->fi, lead, !pass)) || (is_over && over_left <= 0)) continue;
            if (is_over && want > over_left) want = over_left;
            /* the decode guard cuts the prompts longer than a step's budget (a shorter one costs
             * the decodes one step at most): what is left of the bound, at least a block */
            const int cut = pass && guard && n_dec && q->n_toks > s->o.max_tokens;
            if (cut && probe) continue; /* a probe: the decodes without guarded chunks */
            if (cut) {
                int w = fitted ? chunk_fit(ck, q->n_cached, dec_cost + (stall - 1) * base - s->guard_over - cost) : s->lim.block_size;
                if (q->guard_w > 0 && w > GUARD_GROW * q->guard_w + s->lim.block_size) w = GUARD_GROW * q->guard_w + s->lim.block_size;
                if (w < s->lim.block_size) {
                    if (n_chunks) continue; /* the step is full: the next one takes it */
                    w = s->lim.block_size;
                }
                if (want > w) want = w;
                q->guard_w = want;
            }
            int rc, v = -1;
            while ((rc = ex_kv_table_reserve(s->kv, &q->kv, q->n_cached + want)) == CM_ENOKV) {
                if ((v = growth_victim(s, q)) < 0 || s->run[v] == q) break;
                if (!pass && v < i) i--; /* q moves down one slot */
                preempt(s, v);
            }
            if (rc == CM_ENOKV && v >= 0) { /* q itself is the one to go */
                if (!pass) i--;
                preempt(s, v);
                continue;
            }
            if (rc == CM_ENOKV && s->n_run == 1) {
                /* the pool cannot hold this sequence even alone */
                push_pending(s, q, -1, SHM_FINISH_ERROR, CM_ENOKV);
                run_remove(s, run_index(s, q));
                seq_free(s, q);
                break;
            }
            if (rc) continue; /* every other sequence is in the batch: wait for the next step */
            ex_fair_set_blocks(s->fair, &q->fi, q->kv.n);
            if (is_over) over += want;
            else other += want;
            cost += ck[1] * want + ck[2] * (q->n_cached + want) + ck[3] * (double)want * (q->n_cached + want);
            if (pass) n_chunks++, n_guarded += cut;
            else n_dec++;
            q->in_batch = 1;
            s->batch_seq[nb] = q;
            s->batch_n[nb] = want;
            ex_batch_buf_add_kv(&s->bb, q->toks + q->n_cached, want, q->n_cached, &q->kv, 0);
            nb++;
            budget -= want;
        }
    }
    if (nb == 0) {
        *n_ev = n;
        return embed_step(s, ev, n_ev, cap);
    }

    /* every sequence whose whole context is in the cache after this step samples its next
     * token from its last logits row (a prefill chunk that leaves some prompt has nothing yet) */
    int n_rows = 0;
    for (int b = 0; b < nb; b++) {
        seq *q = s->batch_seq[b];
        if (q->n_cached + s->batch_n[b] < q->n_toks) continue;
        /* before min_tokens the stop ids cannot be drawn: their -inf entries join the bias */
        int n_bias = q->n_bias + (q->n_gen < (int64_t)q->sp.min_tokens ? q->n_stop : 0);
        const uint32_t *mask = NULL;
        if (q->gslot >= 0 && ex_gram_mask(s->gc[q->gslot].g, &q->gs, &mask)) q->gerr = CM_ENOMEM; /* mask: none allowed */
        s->srow[n_rows++] = (ex_sample_row){ .row = ex_batch_last_row(&s->bb.b, b), .sp = &q->sp, .prev = q->toks,
                                             .n_prev = q->n_toks, .pos = q->n_toks, .bias = q->bias, .n_bias = n_bias,
                                             .mask = mask };
    }
    double feat[4] = { 1, s->bb.b.n_tokens, 0, 0 }; /* the guard's features of this step */
    for (int b = 0; b < nb; b++) {
        double ctx = s->batch_seq[b]->n_cached + s->batch_n[b];
        feat[2] += ctx;
        feat[3] += s->batch_n[b] * ctx;
    }
    uint64_t t0 = cm_time_ns();
    int rc = ex_engine_forward_sample(s->e, &s->bb.b, s->srow, n_rows, s->sout);
    if (rc) { *n_ev = n; return rc; }
    double dt = (double)(cm_time_ns() - t0) * 1e-9;
    if (n_guarded)
        CM_LOG_DEBUG("sched", "decode guard step", "fitted=%d decodes=%d chunk_tokens=%d positions=%.0f work=%.0f predicted_ms=%.3f "
                     "decodes_ms=%.3f base_ms=%.3f bound_ms=%.3f measured_ms=%.3f k=%.4g,%.4g,%.4g,%.4g",
                     fitted, n_dec, s->bb.b.n_tokens - n_dec, feat[2], feat[3], cost * 1e3, dec_cost * 1e3, base * 1e3,
                     (dec_cost + (stall - 1) * base - s->guard_over) * 1e3,
                     dt * 1e3, ck[0], ck[1], ck[2], ck[3]);
    fit_step(s, s->bb.b.n_tokens, dt);
    cost_add(s, feat, dt);
    if (n_dec && !n_chunks) {
        const double prev = dec_recent(s);
        s->dec_avg = prev > 0 ? 0.75 * prev + 0.25 * dt : dt;
        s->dec_avg_step = s->st.steps;
        s->guard_run = 0;
    } else if (probe) { /* short prompts' chunks ran beside the decodes: no measurement, the run ends */
        s->guard_run = 0;
    } else if (n_guarded) {
        s->guard_run++;
        if (fitted && !given) s->guard_over = 0.9 * s->guard_over + 0.1 * (dt > cost ? dt - cost : 0);
    }
    s->st.steps++;
    s->st.tokens_forwarded += (uint64_t)s->bb.b.n_tokens;

    for (int b = 0, r = 0; b < nb; b++) {
        seq *q = s->batch_seq[b];
        q->n_cached += s->batch_n[b];
        ex_kv_table_slide(s->kv, &q->kv, q->n_cached); /* sliding-window blocks behind the window */
        ex_kv_table_computed(s->kv, &q->kv, q->n_cached); /* its cached blocks become reusable */
        if (q->n_cached < q->n_toks) continue; /* prefill chunk: nothing to sample yet */
        ex_event *e = &ev[n++];
        memset(e, 0, sizeof *e);
        e->so = s->sout[r++];
        int32_t t = e->so.token;
        e->id = q->id;
        e->token = t;
        e->n_prompt = q->n_prompt;
        ex_gram *g = q->gslot >= 0 ? s->gc[q->gslot].g : NULL;
        if (t >= 0 && g && !is_stop(q, t) && ex_gram_advance(g, &q->gs, t)) t = -1; /* outside the grammar */
        if (t < 0) { e->token = -1; e->finish = SHM_FINISH_ERROR; e->err = q->gerr ? q->gerr : CM_EINVAL; }
        else {
            q->toks[q->n_toks++] = t;
            q->n_gen++;
            s->st.tokens_generated++;
            if (s->prefix && q->n_toks % s->lim.block_size == 0) { /* a block of known tokens: cached, pending */
                seq_hash(s, q);
                ex_kv_table_register(s->kv, &q->kv, q->bh, q->toks, q->n_bh);
            }
            if (is_stop(q, t)) e->finish = SHM_FINISH_STOP;
            else if (q->n_gen >= (int64_t)q->sp.max_tokens) e->finish = SHM_FINISH_LENGTH;
            else if (q->n_toks >= s->lim.n_ctx) e->finish = SHM_FINISH_CONTEXT;
            else if (g && ex_gram_finished(g, &q->gs)) e->finish = SHM_FINISH_STOP; /* nothing more is allowed */
        }
        e->n_gen = q->n_gen;
        e->n_cached = q->cached > 0 ? q->cached : 0;
        e->queue_ns = q->queue_ns;
        if (e->finish) {
            for (int i = 0; i < s->n_run; i++) if (s->run[i] == q) { run_remove(s, i); break; }
            seq_free(s, q);
        }
    }
    *n_ev = n;
    return embed_step(s, ev, n_ev, cap);
}

int ex_sched_busy(const ex_sched *s) { return s->n_run > 0 || s->n_wait > 0 || s->n_pend > 0 || s->n_eq > 0; }

void ex_sched_stats_get(const ex_sched *s, ex_sched_stats *st) {
    *st = s->st;
    st->n_waiting = s->n_wait + s->n_eq;
    st->n_running = s->n_run;
    st->kv_free = ex_kv_n_free(s->kv);
    st->kv_total = ex_kv_n_blocks(s->kv);
    st->kv_cached = ex_kv_n_cached(s->kv);
    st->prefix_cache = s->prefix;
}
