/* gw_fake.h: what the gateway's route tests run generations on, instead of executors and a
 * real model (header-only; for tests/unit/test_gw_*.c).
 *
 * The vocabulary is a byte-level BPE with no merges, so a text is one token per byte and the
 * prompt token counts are the prompt's bytes; its chat template concatenates the messages'
 * contents. Besides the 256 bytes it has one token per word " c<C>t<I>" (C < 16, I < 64): what
 * the fake backend generates, so that every byte the routes send can be predicted. It never
 * generates an end-of-generation token.
 *
 * The fake backend honours gateway/backend.h like the pool does (no call back inside submit,
 * none after detach): on a timer, each step gives every choice C its token " c<C>t<step>" (with
 * logprob -0.25 and up to three alternatives: itself, "x" -1.5, "y" -2.5), up to
 * g->q.sp.max_tokens tokens and then DONE(length), or 4 tokens and DONE(stop) when the request
 * named no max_tokens. A prompt (or last chat message) starting with "hold" waits hold_ms between
 * steps, "slow" 300 ms, "fail" fails the generation (500 executor_failed) at step fail_at.
 * detach() of a generation still running counts as a cancel.
 *
 *   fake f; fake_init(&f, loop);        // after uv_loop_init; T_CHECK(f.vocab)
 *   gw_gen_env env = fake_env(&f, 64);  // context 64
 *   ... routes with ac.env = &env ...
 *   fake_free(&f);                      // after the loop has run the last close callbacks
 */
#ifndef GW_FAKE_H
#define GW_FAKE_H

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "gateway/gen.h"
#include "text/tok_internal.h"

#define FAKE_WORDS   (16 * 64)
#define FAKE_WORD(c, i) (256 + (c) * 64 + (i))

typedef struct fake_job {
    uv_timer_t t;
    struct fake *f;
    gw_gen *g;              /* NULL once detached */
    int step, max, given_max, mode;
    struct fake_job *next;
} fake_job;

typedef struct fake {
    uv_loop_t  *loop;
    tok_vocab  *vocab;
    tok_chat   *chat;
    atomic_int  ready;
    atomic_int  cancels, submits;
    int         step_ms, hold_ms, fail_at;
    fake_job   *jobs;
    char        dir[64];
} fake;

enum { FAKE_NORMAL = 0, FAKE_FAIL, FAKE_SLOW, FAKE_HOLD };

static void fake_job_closed(uv_handle_t *h) { free(h->data); }

static void fake_job_end(fake_job *j) {
    fake_job **pp = &j->f->jobs;
    while (*pp && *pp != j) pp = &(*pp)->next;
    if (*pp) *pp = j->next;
    j->g = NULL;
    uv_timer_stop(&j->t);
    uv_close((uv_handle_t *)&j->t, fake_job_closed);
}

static void fake_tick(uv_timer_t *t) {
    fake_job *j = t->data;
    fake *f = j->f;
    if (j->mode == FAKE_FAIL && j->step == f->fail_at) {
        gw_gen_fail(j->g, 500, "server_error", "executor_failed", "the executor stopped"); /* detaches j */
        return;
    }
    int n = j->g->n;
    if (j->step < j->max) {
        for (int c = 0; c < n && j->g; c++) {
            int32_t id = FAKE_WORD(c, j->step);
            struct shm_top tops[3] = { { id, -0.25f }, { 'x', -1.5f }, { 'y', -2.5f } };
            struct shm_tok tk = { .seq = (uint32_t)j->step, .token = id, .logprob = -0.25f, .n_top = 3,
                                  .flags = SHM_TOK_LOGPROB };
            gw_gen_token(j->g, c, &tk, tops); /* may end the generation (and detach j) */
        }
        if (!j->g) return;
        j->step++;
        uv_timer_start(&j->t, fake_tick, j->mode == FAKE_SLOW ? 300 : j->mode == FAKE_HOLD ? f->hold_ms : f->step_ms, 0);
        return;
    }
    struct shm_done d = { .finish = j->given_max ? SHM_FINISH_LENGTH : SHM_FINISH_STOP, .completion_tokens = (uint32_t)j->step,
                          .prompt_tokens = (uint32_t)j->g->n_prompt };
    for (int c = 0; c < n && j->g; c++) gw_gen_choice_done(j->g, c, &d); /* the last one ends it */
}

/* The text that decides the mode: the prompt, or the last chat message's content. */
static const char *fake_mode_text(const gw_gen *g) {
    if (g->q.kind != GW_OAI_CHAT) return g->q.prompt;
    return g->q.n_msgs ? g->q.msgs[g->q.n_msgs - 1].content : NULL;
}

static int fake_submit(void *impl, gw_gen *g, gw_oai_err *e) {
    fake *f = impl;
    fake_job *j = calloc(1, sizeof *j);
    if (!j) {
        gw_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    j->f = f;
    j->g = g;
    j->given_max = g->q.sp.max_tokens > 0;
    j->max = j->given_max ? (int)g->sp.max_tokens : 4;
    const char *text = fake_mode_text(g);
    if (text && !strncmp(text, "fail", 4)) j->mode = FAKE_FAIL;
    if (text && !strncmp(text, "slow", 4)) j->mode = FAKE_SLOW;
    if (text && !strncmp(text, "hold", 4)) j->mode = FAKE_HOLD;
    g->be.ex = j;
    g->reached = 1;
    uv_timer_init(f->loop, &j->t);
    j->t.data = j;
    j->next = f->jobs;
    f->jobs = j;
    uv_timer_start(&j->t, fake_tick, 1, 0);
    atomic_fetch_add(&f->submits, 1);
    return 0;
}

static void fake_stop(void *impl, gw_gen *g, int i) { (void)impl, (void)g, (void)i; }

static void fake_detach(void *impl, gw_gen *g) {
    fake_job *j = g->be.ex;
    fake *f = impl;
    if (!j) return;
    int running = 0;
    for (int c = 0; c < g->n; c++) running |= g->ch[c].finish == SHM_FINISH_NONE;
    if (running) atomic_fetch_add(&f->cancels, 1);
    g->be.ex = NULL;
    fake_job_end(j);
}

static int fake_ready(void *impl) { return atomic_load(&((fake *)impl)->ready); }

static const gw_backend_ops fake_ops = { fake_submit, fake_stop, fake_detach, fake_ready };

/* Writes the vocabulary and template into a fresh directory and loads them (f->vocab stays
 * NULL on failure). Ready, 1 ms steps, holds of a minute, failures at step 2. */
static void fake_init(fake *f, uv_loop_t *loop) {
    memset(f, 0, sizeof *f);
    f->loop = loop;
    f->step_ms = 1;
    f->hold_ms = 60000;
    f->fail_at = 2;
    atomic_store(&f->ready, 1);
    snprintf(f->dir, sizeof f->dir, "/tmp/arka-fake-XXXXXX");
    if (!mkdtemp(f->dir)) return;
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", f->dir);
    FILE *fp = fopen(path, "w");
    if (!fp) return;
    fprintf(fp, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":%d,\"content\":\"<|endoftext|>\",\"special\":true}],"
                "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
                "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
                "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"merges\":[],\"vocab\":{",
            256 + FAKE_WORDS);
    for (int b = 0; b < 256; b++) {
        char cp[8];
        cp[tok__utf8_enc(tok__byte_to_cp((uint8_t)b), cp)] = 0;
        if (b == '"' || b == '\\') fprintf(fp, "\"\\%s\":%d,", cp, b);
        else fprintf(fp, "\"%s\":%d,", cp, b);
    }
    for (int c = 0; c < 16; c++)
        for (int i = 0; i < 64; i++) fprintf(fp, "%s\"\xc4\xa0" "c%dt%d\":%d", c || i ? "," : "", c, i, FAKE_WORD(c, i));
    fprintf(fp, "}}}");
    fclose(fp);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", f->dir);
    if (!(fp = fopen(path, "w"))) return;
    fprintf(fp, "{\"add_bos_token\":false,\"eos_token\":\"<|endoftext|>\","
                "\"chat_template\":\"{%% for m in messages %%}{{ m.content }}{%% endfor %%}\"}");
    fclose(fp);
    char err[256];
    if (tok_load_file(f->dir, &f->vocab, err, sizeof err)) {
        fprintf(stderr, "fake vocabulary: %s\n", err);
        return;
    }
    if (tok_chat_load(f->dir, NULL, f->vocab, &f->chat, err, sizeof err)) {
        fprintf(stderr, "fake chat template: %s\n", err);
        tok_free(f->vocab);
        f->vocab = NULL;
    }
}

static gw_gen_env fake_env(fake *f, int n_ctx) {
    return (gw_gen_env){ .loop = f->loop, .vocab = f->vocab, .chat = f->chat, .n_ctx = n_ctx, .max_requests = 4096,
                         .backend = { &fake_ops, f } };
}

static void fake_free(fake *f) {
    char path[128];
    tok_chat_free(f->chat);
    tok_free(f->vocab);
    snprintf(path, sizeof path, "%s/tokenizer.json", f->dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", f->dir);
    unlink(path);
    rmdir(f->dir);
}

#endif
