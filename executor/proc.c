/* proc: the executor process's loop between the shared-memory rings and the scheduler. */
#include "proc.h"
#include "kv.h"
#include "sched.h"
#include "../common/cm_err.h"
#include "../common/cm_log.h"
#include "../common/cm_time.h"
#include "../model/model.h"
#include "../shm/shm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

void ex_proc_opts_default(ex_proc_opts *o) {
    memset(o, 0, sizeof *o);
    ex_engine_opts_default(&o->engine);
}

/* Per-request bookkeeping: the next token sequence number and timings, in a fixed open-
 * addressing table sized for every request the scheduler can hold. */
typedef struct req_slot {
    uint64_t id;          /* 0: empty */
    uint32_t seq;         /* next TOKENS sequence number */
    int      logprobs;    /* the request asked for logprobs */
    uint64_t t_submit, t_first;
} req_slot;

/* The vocabulary's token bytes as VOCAB records bring them (grammars need them). */
typedef struct vocab_in {
    uint32_t n_total, next;   /* tokens announced / received so far */
    uint32_t *off;            /* [n_total + 1] */
    uint8_t  *bytes;
    size_t    len, cap;
} vocab_in;

typedef struct proc {
    struct shm_seg seg;
    vocab_in vin;
    mdl_model *m;
    ex_engine *e;
    ex_sched *s;
    req_slot *slots;
    uint32_t n_slots;     /* power of two */
    ex_event *ev;
    int ev_cap;
    uint64_t last_forwarded;   /* scheduler's tokens_forwarded at the last stats update */
    uint64_t step_no;
    uint64_t seed_ctr;
} proc;

static uint32_t slot_hash(uint64_t id) { return (uint32_t)(ex_rng_mix(id) >> 32); }

static req_slot *slot_find(proc *p, uint64_t id) {
    for (uint32_t i = slot_hash(id) & (p->n_slots - 1), k = 0; k < p->n_slots; k++, i = (i + 1) & (p->n_slots - 1)) {
        if (p->slots[i].id == id) return &p->slots[i];
        if (p->slots[i].id == 0) return NULL;
    }
    return NULL;
}

static req_slot *slot_add(proc *p, uint64_t id) {
    for (uint32_t i = slot_hash(id) & (p->n_slots - 1), k = 0; k < p->n_slots; k++, i = (i + 1) & (p->n_slots - 1))
        if (p->slots[i].id == 0) {
            p->slots[i] = (req_slot){ .id = id };
            return &p->slots[i];
        }
    return NULL;
}

/* Removes a slot, re-inserting the rest of its probe run (linear probing deletion). */
static void slot_del(proc *p, req_slot *sl) {
    uint32_t i = (uint32_t)(sl - p->slots);
    p->slots[i].id = 0;
    for (uint32_t j = (i + 1) & (p->n_slots - 1); p->slots[j].id; j = (j + 1) & (p->n_slots - 1)) {
        req_slot r = p->slots[j];
        p->slots[j].id = 0;
        *slot_add(p, r.id) = r;
    }
}

/* Sends a record, waiting for room while the gateway drains (beating meanwhile). */
static int send_retry(proc *p, int (*fn)(struct shm_ring *, const void *), const void *arg) {
    for (;;) {
        int rc = fn(&p->seg.event, arg);
        if (rc != CM_EFULL) return rc;
        shm_seg_beat(&p->seg);
        if (g_stop > 1) return CM_ECANCELLED;
        shm_ring_wait_space(&p->seg.event, 4096, 100);
    }
}

static int send_done_fn(struct shm_ring *r, const void *d) { return shm_send_done(r, d); }
static int send_embed_fn(struct shm_ring *r, const void *e) { return shm_send_embed(r, e); }

typedef struct err_arg { uint64_t id; int code; const char *msg; } err_arg;
static int send_error_fn(struct shm_ring *r, const void *a) {
    const err_arg *e = a;
    return shm_send_error(r, e->id, e->code, e->msg);
}

static void fail_request(proc *p, uint64_t id, int code, const char *msg, uint32_t n_prompt) {
    err_arg ea = { id, code, msg };
    send_retry(p, send_error_fn, &ea);
    struct shm_done d = { .req_id = id, .finish = SHM_FINISH_ERROR, .prompt_tokens = n_prompt };
    send_retry(p, send_done_fn, &d);
    shm_stat_add(&p->seg.stats->requests_finished_total, 1);
}

static void take_submit(proc *p, const struct shm_submit *sb) {
    const ex_limits *L = ex_engine_limits(p->e);
    uint32_t n_orig = sb->n_prompt - sb->n_generated; /* the request's own prompt (decode checked) */
    if (g_stop) {
        fail_request(p, sb->req_id, CM_ESTATE, "executor is shutting down", n_orig);
        return;
    }
    if (slot_find(p, sb->req_id)) {
        fail_request(p, sb->req_id, CM_EINVAL, "duplicate request id", n_orig);
        return;
    }
    for (uint32_t i = 0; i < sb->n_prompt; i++)
        if (sb->prompt[i] >= L->n_vocab) {
            fail_request(p, sb->req_id, CM_EINVAL, "prompt token id out of the vocabulary", n_orig);
            return;
        }
    ex_request r = { .id = sb->req_id, .prompt = sb->prompt, .n_prompt = (int)sb->n_prompt, .sp = sb->sp,
                     .bias = sb->bias, .n_bias = (int)sb->n_bias, .stop_ids = sb->stop, .n_stop = (int)sb->n_stop,
                     .grammar = sb->grammar, .grammar_len = sb->grammar_len, .embed = !!(sb->flags & SHM_SUBMIT_EMBED),
                     .pooling = sb->pooling, .normalize = sb->normalize, .n_generated = (int)sb->n_generated,
                     .priority = sb->priority, .tenant = sb->tenant, .weight = sb->weight };
    /* without a seed each request still gets its own stream, fixed for its lifetime */
    if (!r.sp.has_seed) r.sp.seed = ex_rng_mix(sb->req_id ^ ex_rng_mix(++p->seed_ctr ^ cm_time_ns()));
    int rc = ex_sched_submit(p->s, &r);
    if (rc) {
        char why[256];
        if (rc == CM_ENOKV) {
            /* never fits: name the limit (the pool, in positions) and what the request needs */
            int64_t longest = (int64_t)n_orig + sb->sp.max_tokens;
            if (longest > L->n_ctx) longest = L->n_ctx;
            snprintf(why, sizeof why, "the request needs %lld positions of KV cache (%u prompt tokens + max_tokens %d, at most "
                     "the context of %d) and the whole KV pool holds %lld positions: lower max_tokens or the prompt",
                     (long long)longest, n_orig, (int)sb->sp.max_tokens, L->n_ctx,
                     (long long)ex_kv_n_blocks(ex_engine_kv(p->e)) * L->block_size);
        } else if (ex_sched_error(p->s)[0])
            snprintf(why, sizeof why, "%s", ex_sched_error(p->s));
        else
            snprintf(why, sizeof why, "%s", rc == CM_ECTX ? "prompt does not fit the context"
                                            : rc == CM_EFULL ? "executor queue is full" : "invalid request");
        fail_request(p, sb->req_id, rc, why, n_orig);
        return;
    }
    req_slot *sl = slot_add(p, sb->req_id); /* the table holds every request the scheduler can */
    if (sl) {
        sl->seq = sb->n_generated; /* a resumed generation's numbers go on from its delivered tokens */
        sl->t_submit = cm_time_ns();
        sl->logprobs = sb->sp.logprobs || sb->sp.top_logprobs;
    }
}

/* A VOCAB chunk: appended in order; the whole table goes to the scheduler. */
static void take_vocab(proc *p, const struct shm_vocab *v) {
    vocab_in *in = &p->vin;
    if (v->first == 0) { /* a (new) table starts */
        free(in->off);
        in->off = calloc((size_t)v->n_total + 1, sizeof(uint32_t));
        in->n_total = in->off ? v->n_total : 0;
        in->next = 0;
        in->len = 0;
    }
    if (!in->off || v->n_total != in->n_total || v->first != in->next) {
        CM_LOG_WARN("executor", "VOCAB chunk out of order dropped", "first=%u expected=%u", v->first, in->next);
        return;
    }
    if (in->len + v->bytes_len > in->cap) {
        size_t c = in->cap ? in->cap : 1 << 20;
        while (c < in->len + v->bytes_len) c *= 2;
        uint8_t *nb = realloc(in->bytes, c);
        if (!nb) { CM_LOG_ERROR("executor", "out of memory for the vocabulary", NULL); return; }
        in->bytes = nb;
        in->cap = c;
    }
    memcpy(in->bytes + in->len, v->bytes, v->bytes_len);
    for (uint32_t i = 0; i < v->count; i++) in->off[v->first + i] = (uint32_t)in->len + v->off[i];
    in->len += v->bytes_len;
    in->next += v->count;
    in->off[in->next] = (uint32_t)in->len;
    if (in->next < in->n_total) return;
    int nv = ex_engine_limits(p->e)->n_vocab, n = (int)in->n_total < nv ? (int)in->n_total : nv;
    ex_gram_vocab *gv;
    int rc = ex_gram_vocab_create(nv, n, in->off, in->bytes, &gv);
    if (!rc) rc = ex_sched_set_vocab(p->s, gv);
    if (rc) CM_LOG_ERROR("executor", "vocabulary for grammars refused", "rc=%s", cm_err_str(rc));
    else CM_LOG_INFO("executor", "vocabulary for grammars", "tokens=%u bytes=%zu", in->n_total, in->len);
    free(in->off);
    free(in->bytes);
    memset(in, 0, sizeof *in);
}

/* Drains the submit ring. Returns 0 or CM_EFORMAT (the gateway's ring is corrupt: fatal). */
static int drain_submits(proc *p) {
    for (;;) {
        const void *buf;
        size_t len;
        int rc = shm_ring_peek(&p->seg.submit, &buf, &len);
        if (rc == CM_EEMPTY) return 0;
        if (rc) return rc;
        uint32_t type;
        if (shm_msg_type(buf, len, &type) == 0 && type == SHM_MSG_SUBMIT) {
            struct shm_submit sb;
            if (shm_submit_decode(buf, len, &sb) == 0) take_submit(p, &sb); /* the scheduler copies the prompt */
            else CM_LOG_WARN("executor", "malformed SUBMIT record dropped", NULL);
        } else if (type == SHM_MSG_CANCEL) {
            uint64_t id;
            if (shm_cancel_decode(buf, len, &id) == 0) ex_sched_cancel(p->s, id); /* unknown ids: already done */
        } else if (type == SHM_MSG_VOCAB) {
            struct shm_vocab v;
            if (shm_vocab_decode(buf, len, &v) == 0) take_vocab(p, &v);
            else CM_LOG_WARN("executor", "malformed VOCAB record dropped", NULL);
        } else {
            CM_LOG_WARN("executor", "unexpected record on the submit ring", "type=%u", type);
        }
        shm_ring_release(&p->seg.submit);
    }
}

/* 1 when ev's token is its request's first here: its entry carries the admission. */
static int first_token(proc *p, const ex_event *ev) {
    const req_slot *sl = slot_find(p, ev->id);
    return sl && !sl->t_first;
}

/* Publishes one step's events: TOKENS records (split when one would exceed the ring's limit)
 * and a DONE (after an ERROR for failures) per finished request. */
static int publish(proc *p, int n_ev) {
    size_t maxp = shm_ring_max_payload(&p->seg.event);
    int i = 0;
    uint64_t now = cm_time_ns();
    while (i < n_ev) {
        uint32_t n_tok = 0, n_top = 0;
        size_t n_adm = 0; /* bytes of admission data */
        int j = i;
        for (; j < n_ev; j++) {
            if (p->ev[j].token < 0) continue;
            uint32_t t = (uint32_t)p->ev[j].so.n_top;
            size_t a = first_token(p, &p->ev[j]) ? sizeof(struct shm_tok_admit) : 0;
            if (shm_tokens_size(n_tok + 1, n_top + t) + n_adm + a > maxp) break;
            n_tok++;
            n_top += t;
            n_adm += a;
        }
        if (n_tok) {
            size_t need = shm_tokens_size(n_tok, n_top) + n_adm;
            void *buf;
            int rc;
            while ((rc = shm_ring_reserve(&p->seg.event, need, &buf)) == CM_EFULL) {
                shm_seg_beat(&p->seg);
                shm_ring_wait_space(&p->seg.event, need, 100);
            }
            if (rc) return rc;
            struct shm_tokens_w w;
            shm_tokens_begin(&w, buf, need, p->step_no);
            for (int k = i; k < j; k++) {
                const ex_event *ev = &p->ev[k];
                if (ev->token < 0) continue;
                req_slot *sl = slot_find(p, ev->id);
                struct shm_tok t = { .req_id = ev->id, .seq = sl ? sl->seq++ : 0, .token = ev->token };
                struct shm_top top[SHM_MAX_TOP_LOGPROBS];
                struct shm_tok_admit adm = { .cached_prompt_tokens = (uint32_t)ev->n_cached, .queue_ns = ev->queue_ns };
                int first = sl && !sl->t_first;
                if (first) {
                    sl->t_first = now;
                    t.flags |= SHM_TOK_ADMIT;
                }
                if (sl && sl->logprobs) {
                    t.flags |= SHM_TOK_LOGPROB;
                    t.logprob = ev->so.logprob;
                    t.n_top = (uint8_t)ev->so.n_top;
                    for (int q = 0; q < ev->so.n_top; q++) top[q] = (struct shm_top){ ev->so.top_id[q], ev->so.top_logprob[q] };
                }
                if ((rc = shm_tokens_add_admit(&w, &t, top, first ? &adm : NULL))) return rc;
            }
            shm_ring_commit(&p->seg.event, shm_tokens_end(&w));
        }
        i = j > i ? j : i + 1;
    }
    for (int k = 0; k < n_ev; k++) {
        const ex_event *ev = &p->ev[k];
        if (ev->finish == SHM_FINISH_NONE) continue;
        req_slot *sl = slot_find(p, ev->id);
        if (ev->finish == SHM_FINISH_ERROR) {
            err_arg ea = { ev->id, ev->err ? ev->err : CM_ESTATE,
                           ev->err == CM_ENOKV    ? "out of KV cache blocks while running alone"
                           : ev->err == CM_ENOMEM ? "the grammar's parse states outgrew their limit"
                                                  : "the sampler refused the request (or its grammar allowed no token)" };
            send_retry(p, send_error_fn, &ea);
        }
        if (ev->embd) {
            struct shm_embed em = { ev->id, (uint32_t)ev->n_embd, (uint32_t)ev->n_prompt, ev->embd };
            send_retry(p, send_embed_fn, &em);
        }
        struct shm_done d = { .req_id = ev->id, .finish = (uint32_t)ev->finish, .prompt_tokens = (uint32_t)ev->n_prompt,
                              .completion_tokens = sl ? sl->seq : 0, .cached_prompt_tokens = (uint32_t)ev->n_cached,
                              .queue_ns = ev->queue_ns };
        if (sl) {
            uint64_t t_run = sl->t_submit + ev->queue_ns; /* first scheduled */
            d.prefill_ns = sl->t_first ? sl->t_first - t_run : ev->queue_ns ? now - t_run : 0;
            d.decode_ns = sl->t_first ? now - sl->t_first : 0;
            slot_del(p, sl);
        }
        send_retry(p, send_done_fn, &d);
        /* once per request, at its end: what its prompt computed, what the cache gave it */
        shm_stat_add(&p->seg.stats->requests_finished_total, 1);
        shm_stat_add(&p->seg.stats->prompt_tokens_total, (uint64_t)(ev->n_prompt - ev->n_cached));
        shm_stat_add(&p->seg.stats->cached_prompt_tokens_total, (uint64_t)ev->n_cached);
    }
    return 0;
}

static void update_stats(proc *p, int n_ev, uint64_t step_us) {
    ex_sched_stats st;
    ex_sched_stats_get(p->s, &st);
    uint64_t fwd = st.tokens_forwarded - p->last_forwarded; /* tokens this step ran (prefill + decode) */
    p->last_forwarded = st.tokens_forwarded;
    struct shm_stats *S = p->seg.stats;
    shm_stat_set(&S->requests_running, (uint64_t)st.n_running);
    shm_stat_set(&S->requests_waiting, (uint64_t)st.n_waiting);
    shm_stat_set(&S->kv_blocks_used, (uint64_t)(st.kv_total - st.kv_free));
    shm_stat_set(&S->kv_blocks_total, (uint64_t)st.kv_total);
    shm_stat_set(&S->generation_tokens_total, st.tokens_generated);
    shm_stat_set(&S->preemptions_total, st.preemptions);
    shm_stat_set(&S->steps_total, st.steps);
    shm_stat_set(&S->prefix_queries_total, st.prefix_queries);
    shm_stat_set(&S->prefix_hits_total, st.prefix_hits);
    if (step_us) {
        shm_hist_observe(&S->step_time_us, step_us);
        shm_hist_observe(&S->batch_size, (uint64_t)n_ev);
        shm_hist_observe(&S->batch_tokens, fwd);
    }
}

int ex_proc_run(const ex_proc_opts *o) {
    proc P = { 0 }, *p = &P;
    char err[512];
    int rc, code = 1;
    if (!o->spec || !o->model) {
        fprintf(stderr, "arka executor: --shm SPEC and --model PATH are required\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if ((rc = shm_seg_attach_spec(&p->seg, o->spec, err, sizeof err))) {
        fprintf(stderr, "arka executor: cannot attach the shared-memory segment: %s\n", err);
        return 1;
    }
    shm_seg_set_pid(&p->seg, (int)getpid());
    shm_seg_set_state(&p->seg, SHM_STATE_LOADING);
    shm_seg_beat(&p->seg);
    double t0 = cm_time_s();
    if ((rc = mdl_load(o->model, &p->m, err, sizeof err)) || (rc = ex_engine_create(p->m, &o->engine, &p->e, err, sizeof err))) {
        CM_LOG_ERROR("executor", "load failed", "err=\"%s\"", err);
        err_arg ea = { 0, rc, err };
        send_error_fn(&p->seg.event, &ea);
        goto out;
    }
    ex_sched_opts so;
    ex_sched_opts_default(&so);
    so.max_waiting = o->max_waiting;
    so.no_prefix_cache = o->no_prefix_cache;
    const ex_limits *L = ex_engine_limits(p->e);
    p->ev_cap = L->max_seqs > 0 ? L->max_seqs * 2 : 64;
    uint32_t want = (uint32_t)((o->max_waiting ? o->max_waiting : 1024) + L->max_seqs) * 2, n = 64;
    while (n < want) n <<= 1;
    p->n_slots = n;
    p->slots = calloc(n, sizeof *p->slots);
    p->ev = calloc((size_t)p->ev_cap, sizeof *p->ev);
    if (!p->slots || !p->ev || (rc = ex_sched_create(p->e, &so, &p->s))) {
        err_arg ea = { 0, CM_ENOMEM, "out of memory creating the scheduler" };
        send_error_fn(&p->seg.event, &ea);
        goto out;
    }
    update_stats(p, 0, 0);
    shm_seg_set_state(&p->seg, SHM_STATE_READY);
    ex_sched_stats st0;
    ex_sched_stats_get(p->s, &st0);
    CM_LOG_INFO("executor", "ready", "model=%s backend=%s kv_blocks=%d prefix_cache=%s seconds=%.2f", o->model,
                o->engine.backend ? o->engine.backend : "cpu", L->n_kv_blocks, st0.prefix_cache ? "on" : "off",
                cm_time_s() - t0);
    int idle_ms = o->idle_ms > 0 ? o->idle_ms : 100;
    for (;;) {
        shm_seg_beat(&p->seg);
        if (g_stop && shm_seg_state(&p->seg) == SHM_STATE_READY) shm_seg_set_state(&p->seg, SHM_STATE_DRAINING);
        if ((rc = drain_submits(p))) {
            CM_LOG_ERROR("executor", "submit ring corrupt", "rc=%d", rc);
            goto out;
        }
        if (!ex_sched_busy(p->s)) {
            update_stats(p, 0, 0); /* gauges settle once the last finish has released its blocks */
            if (g_stop) break;
            rc = shm_ring_wait(&p->seg.submit, idle_ms);
            if (rc == CM_EFORMAT) goto out;
            continue;
        }
        int n_ev = 0;
        uint64_t a = cm_time_ns();
        if ((rc = ex_sched_step(p->s, p->ev, p->ev_cap, &n_ev))) {
            /* the engine is unusable: fail everything we hold, then exit for a restart */
            CM_LOG_ERROR("executor", "engine step failed", "rc=%d err=\"%s\"", rc, cm_err_str(rc));
            err_arg ea = { 0, rc, "engine step failed" };
            send_error_fn(&p->seg.event, &ea);
            goto out;
        }
        p->step_no++;
        if ((rc = publish(p, n_ev))) {
            CM_LOG_ERROR("executor", "publishing events failed", "rc=%d", rc);
            goto out;
        }
        update_stats(p, n_ev, (cm_time_ns() - a) / 1000);
    }
    code = 0;
out:
    shm_seg_set_state(&p->seg, SHM_STATE_DEAD);
    ex_sched_destroy(p->s);
    ex_engine_destroy(p->e);
    mdl_free(p->m);
    free(p->vin.off);
    free(p->vin.bytes);
    free(p->slots);
    free(p->ev);
    shm_seg_close(&p->seg);
    return code;
}
