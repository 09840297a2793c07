/* The executor process end to end over shared memory: this test plays the gateway. It creates
 * the segment, starts the real `arka executor` on stories260K (CPU backend), and checks greedy
 * text against the recorded reference, concurrent requests against their solo runs, seeded
 * sampling, cancel, a bad request, per-token sequence numbers, the stats block, the heartbeat
 * and a clean drain on SIGTERM. */
#include "common/cm_err.h"
#include "common/cm_time.h"
#include "model/gguf.h"
#include "text/tok.h"
#include "shm/shm.h"
#include "t.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL T_MODELS "stories260K.gguf"
#define MAXR 32
#define MAXT 512

static const char *k_reference =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, "
    "red ball. She wanted to play with it, but it was too high.\nLily's mom said, \"Lily, let's go to the park.\" Lily was "
    "sad and didn't know what to do. She said, \"I want to play with your ball, but I can't find it.\"\nLily was sad and "
    "didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily didn't want to help her mom, "
    "so she said, \"I";

typedef struct result {
    uint64_t id;
    int32_t tok[MAXT];
    int n, done, finish, error, seq_ok;
    uint32_t completion;
} result;

static struct shm_seg seg;
static result res[MAXR];
static tok_vocab *voc;
static pid_t child;

static result *res_get(uint64_t id) {
    for (int i = 0; i < MAXR; i++)
        if (res[i].id == id) return &res[i];
    for (int i = 0; i < MAXR; i++)
        if (!res[i].id) {
            memset(&res[i], 0, sizeof res[i]);
            res[i].id = id;
            res[i].seq_ok = 1;
            return &res[i];
        }
    return NULL;
}

static void res_clear(void) { memset(res, 0, sizeof res); }

/* Reads every record available; waits up to ms for the first. */
static void pump(int ms) {
    if (shm_ring_wait(&seg.event, ms) != 0) return;
    const void *buf;
    size_t len;
    while (shm_ring_peek(&seg.event, &buf, &len) == 0) {
        uint32_t type;
        T_EQ_INT(shm_msg_type(buf, len, &type), 0);
        if (type == SHM_MSG_TOKENS) {
            struct shm_tokens_r rd;
            T_EQ_INT(shm_tokens_open(&rd, buf, len), 0);
            struct shm_tok t;
            const struct shm_top *top;
            while (shm_tokens_next(&rd, &t, &top) == 0) {
                result *r = res_get(t.req_id);
                if (!r) continue;
                if (t.seq != (uint32_t)r->n) r->seq_ok = 0;
                if (r->n < MAXT) r->tok[r->n] = t.token;
                r->n++;
            }
        } else if (type == SHM_MSG_DONE) {
            struct shm_done d;
            T_EQ_INT(shm_done_decode(buf, len, &d), 0);
            result *r = res_get(d.req_id);
            if (r) {
                r->done = 1;
                r->finish = (int)d.finish;
                r->completion = d.completion_tokens;
            }
        } else if (type == SHM_MSG_ERROR) {
            struct shm_error e;
            T_EQ_INT(shm_error_decode(buf, len, &e), 0);
            result *r = res_get(e.req_id);
            if (r) r->error = e.code;
            if (!e.req_id) fprintf(stderr, "executor error: %s\n", e.msg);
        }
        shm_ring_release(&seg.event);
    }
}

static int wait_done(const uint64_t *ids, int n, int timeout_ms) {
    uint64_t end = cm_time_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++) all &= res_get(ids[i])->done;
        if (all) return 1;
        if (cm_time_ns() > end) return 0;
        pump(50);
    }
}

static int submit(uint64_t id, const int32_t *prompt, int n, int max_tokens, float temp, int has_seed, uint64_t seed) {
    struct shm_submit s = { .req_id = id, .prompt = prompt, .n_prompt = (uint32_t)n };
    shm_sampling_default(&s.sp);
    s.sp.temperature = temp;
    s.sp.max_tokens = (uint32_t)max_tokens;
    s.sp.has_seed = (uint8_t)has_seed;
    s.sp.seed = seed;
    res_get(id);
    int rc;
    while ((rc = shm_send_submit(&seg.submit, &s)) == CM_EFULL) pump(10);
    return rc;
}

static int encode(const char *text, int32_t *ids, int cap) {
    int n = 0;
    T_EQ_INT(tok_encode(voc, text, strlen(text), 1, 0, ids, cap, &n), 0);
    return n;
}

static void text_of(const result *r, char *out, size_t cap) {
    size_t len = strlen(out);
    for (int i = 0; i < r->n && i < MAXT; i++) {
        size_t k;
        if (tok_piece(voc, r->tok[i], out + len, cap - len - 1, &k) == 0) len += k;
    }
    out[len] = 0;
}

static void test_greedy_reference(void) {
    int32_t p[64];
    int n = encode("Once upon a time", p, 64);
    uint64_t id = 1;
    T_EQ_INT(submit(id, p, n, 200, 0.0f, 0, 0), 0);
    T_CHECK(wait_done(&id, 1, 60000));
    result *r = res_get(id);
    char text[4096] = "Once upon a time";
    text_of(r, text, sizeof text);
    T_CHECKF(strncmp(text, k_reference, strlen(k_reference)) == 0, "executor greedy text differs:\n%s", text);
    T_EQ_INT(r->n, 200);
    T_EQ_INT(r->completion, 200);
    T_EQ_INT(r->finish, SHM_FINISH_LENGTH);
    T_CHECK(r->seq_ok);
}

static void test_concurrent_equals_solo(void) {
    const char *prompts[8] = { "Once", "Once upon", "Lily was sad", "One day, she saw", "The cat", "Tom and Sam went",
                               "She loved to play", "Once upon a time, there was" };
    int32_t p[8][64];
    int n[8];
    int32_t solo[8][40];
    for (int i = 0; i < 8; i++) n[i] = encode(prompts[i], p[i], 64);
    res_clear();
    for (int i = 0; i < 8; i++) {
        uint64_t id = 100 + i;
        submit(id, p[i], n[i], 40, 0.0f, 0, 0);
        T_CHECK(wait_done(&id, 1, 30000));
        memcpy(solo[i], res_get(id)->tok, sizeof solo[i]);
    }
    res_clear();
    uint64_t ids[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = 200 + i;
        submit(ids[i], p[i], n[i], 40, 0.0f, 0, 0);
    }
    T_CHECK(wait_done(ids, 8, 60000));
    int same = 1, seq = 1;
    for (int i = 0; i < 8; i++) {
        result *r = res_get(ids[i]);
        same &= r->n == 40 && memcmp(r->tok, solo[i], sizeof solo[i]) == 0;
        seq &= r->seq_ok && r->completion == 40;
    }
    T_CHECKF(same, "8 concurrent greedy requests differ from their solo runs");
    T_CHECK(seq);
}

static void test_seeded_sampling(void) {
    int32_t p[64];
    int n = encode("Once upon a time", p, 64);
    res_clear();
    uint64_t ids[3] = { 300, 301, 302 };
    submit(ids[0], p, n, 60, 0.9f, 1, 42);
    submit(ids[1], p, n, 60, 0.9f, 1, 42);
    submit(ids[2], p, n, 60, 0.9f, 1, 43);
    T_CHECK(wait_done(ids, 3, 60000));
    result *a = res_get(ids[0]), *b = res_get(ids[1]), *c = res_get(ids[2]);
    T_CHECKF(a->n == b->n && memcmp(a->tok, b->tok, (size_t)a->n * 4) == 0, "same seed, different tokens");
    T_CHECKF(a->n != c->n || memcmp(a->tok, c->tok, (size_t)a->n * 4) != 0, "seeds 42 and 43 gave identical 60-token samples");
}

static void test_cancel_and_errors(void) {
    int32_t p[64];
    int n = encode("Once upon a time", p, 64);
    res_clear();
    uint64_t id = 400;
    submit(id, p, n, 400, 0.0f, 0, 0);
    uint64_t end = cm_time_ns() + 30000000000ull;
    while (res_get(id)->n < 3 && cm_time_ns() < end) pump(20);
    T_EQ_INT(shm_send_cancel(&seg.submit, id), 0);
    T_CHECK(wait_done(&id, 1, 30000));
    result *r = res_get(id);
    T_EQ_INT(r->finish, SHM_FINISH_CANCELLED);
    T_CHECK(r->n >= 3 && r->n < 400);
    T_EQ_INT(r->completion, (uint32_t)r->n);
    T_CHECK(r->seq_ok);
    /* a token id outside the vocabulary: ERROR then DONE(error), and the executor keeps serving */
    int32_t bad[3] = { 1, 100000, 5 };
    uint64_t bid = 401;
    submit(bid, bad, 3, 10, 0.0f, 0, 0);
    T_CHECK(wait_done(&bid, 1, 10000));
    T_EQ_INT(res_get(bid)->finish, SHM_FINISH_ERROR);
    T_EQ_INT(res_get(bid)->error, CM_EINVAL);
    /* a prompt longer than the context (--ctx 512) */
    static int32_t longp[600];
    for (int i = 0; i < 600; i++) longp[i] = 1 + i % 400;
    uint64_t lid = 402;
    submit(lid, longp, 600, 10, 0.0f, 0, 0);
    T_CHECK(wait_done(&lid, 1, 10000));
    T_EQ_INT(res_get(lid)->finish, SHM_FINISH_ERROR);
    T_EQ_INT(res_get(lid)->error, CM_ECTX);
    uint64_t ok = 403;
    submit(ok, p, n, 5, 0.0f, 0, 0);
    T_CHECK(wait_done(&ok, 1, 10000));
    T_EQ_INT(res_get(ok)->n, 5);
}

int main(void) {
    const char *bin = getenv("ARKA_BIN");
    if (!bin) {
        fprintf(stderr, "ARKA_BIN is not set (run through ctest)\n");
        T_CHECK(0);
        return t_done();
    }
    gguf_ctx *g;
    char err[256];
    if (gguf_open(MODEL, &g, err, sizeof err) || tok_load_gguf(g, &voc, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        T_CHECK(0);
        return t_done();
    }
    T_EQ_INT(shm_seg_create(&seg, NULL), 0);
    T_EQ_INT(shm_seg_set_inherit(&seg, 1), 0);
    char spec[128];
    T_EQ_INT(shm_seg_spec(&seg, NULL, spec, sizeof spec), 0);
    child = fork();
    if (child == 0) {
        execl(bin, "arka", "executor", "--shm", spec, "-m", MODEL, "--ctx", "512", "--kv-cache-mb", "8", "--threads", "1",
              "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    shm_seg_set_inherit(&seg, 0);
    uint64_t end = cm_time_ns() + 60000000000ull;
    while (shm_seg_state(&seg) != SHM_STATE_READY && cm_time_ns() < end && waitpid(child, NULL, WNOHANG) == 0) cm_time_sleep_ms(10);
    T_EQ_INT(shm_seg_state(&seg), SHM_STATE_READY);
    if (shm_seg_state(&seg) == SHM_STATE_READY) {
        uint64_t hb0 = seg.hdr->heartbeat;
        test_greedy_reference();
        test_concurrent_equals_solo();
        test_seeded_sampling();
        test_cancel_and_errors();
        T_CHECK(seg.hdr->heartbeat > hb0);
        T_CHECK(shm_stat_get(&seg.stats->requests_finished_total) >= 20);
        T_CHECK(shm_stat_get(&seg.stats->kv_blocks_total) > 0);
        T_CHECK(shm_stat_get(&seg.stats->generation_tokens_total) >= 200);
        /* everything finished: no block leaked (gauges settle when the executor goes idle) */
        uint64_t until = cm_time_ns() + 2000000000ull;
        while (shm_stat_get(&seg.stats->kv_blocks_used) != 0 && cm_time_ns() < until) cm_time_sleep_ms(10);
        T_EQ_INT(shm_stat_get(&seg.stats->kv_blocks_used), 0);
    }
    kill(child, SIGTERM);
    int status = 0;
    end = cm_time_ns() + 20000000000ull;
    while (waitpid(child, &status, WNOHANG) == 0 && cm_time_ns() < end) cm_time_sleep_ms(10);
    T_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "executor did not exit cleanly on SIGTERM (status %d)", status);
    T_EQ_INT(shm_seg_state(&seg), SHM_STATE_DEAD);
    shm_seg_close(&seg);
    tok_free(voc);
    gguf_close(g);
    return t_done();
}
