/* test_gw_exec: executor supervision with the real `arka executor` (ARKA_BIN) on stories260K.
 *
 * The supervisor starts an executor, which must become READY; a SUBMIT through its segment
 * comes back as a DONE with the asked number of tokens; SIGKILL of the child is noticed, reported
 * (up = 0) and followed by a restart on a fresh segment; a stopped (SIGSTOP) child's stale
 * heartbeat gets it killed and restarted; a child that cannot load its model is restarted with a
 * doubling back-off; gw_exec_stop drains and closes every handle. Skipped (0 checks) when the
 * binary or the model is missing. */
#include "gateway/exec.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "tests/unit/t.h"

#define MODEL T_MODELS "stories260K.gguf"

typedef struct st {
    int ups, downs;
    char last_why[200];
    int dones, tokens, errors;
    uint32_t finish, completion;
    int stopped;
} st;

static void on_state(gw_exec *x, void *ud, int up, const char *why) {
    st *s = ud;
    if (up) s->ups++;
    else {
        s->downs++;
        snprintf(s->last_why, sizeof s->last_why, "%s", why ? why : "");
    }
}

static void on_events(gw_exec *x, void *ud, struct shm_seg *seg) {
    st *s = ud;
    const void *p;
    size_t n;
    while (shm_ring_peek(&seg->event, &p, &n) == 0) {
        uint32_t type;
        if (shm_msg_type(p, n, &type) == 0) {
            if (type == SHM_MSG_TOKENS) s->tokens++;
            if (type == SHM_MSG_ERROR) {
                struct shm_error er;
                s->errors++;
                if (shm_error_decode(p, n, &er) == 0) fprintf(stderr, "executor error: %s\n", er.msg);
            }
            if (type == SHM_MSG_DONE) {
                struct shm_done d;
                if (shm_done_decode(p, n, &d) == 0) {
                    s->dones++;
                    s->finish = d.finish;
                    s->completion = d.completion_tokens;
                }
            }
        }
        shm_ring_release(&seg->event);
    }
}

static void on_stopped(gw_exec *x, void *ud) { ((st *)ud)->stopped = 1; }

/* Runs the loop until *flag reaches want or ms pass. Returns 1 when reached. */
static int run_until(uv_loop_t *loop, int *flag, int want, int ms) {
    uint64_t t0 = uv_now(loop);
    while (*flag < want && uv_now(loop) - t0 < (uint64_t)ms) {
        uv_run(loop, UV_RUN_ONCE);
        uv_update_time(loop);
    }
    return *flag >= want;
}

static int submit(struct shm_seg *seg, uint64_t id, uint32_t max_tokens) {
    static const int32_t prompt[] = {1, 403, 407, 100, 200}; /* ids inside the 512-token vocabulary */
    struct shm_submit q;
    memset(&q, 0, sizeof q);
    q.req_id = id;
    shm_sampling_default(&q.sp);
    q.sp.max_tokens = max_tokens;
    q.prompt = prompt;
    q.n_prompt = sizeof prompt / sizeof *prompt;
    static uint8_t buf[4096] __attribute__((aligned(8)));
    size_t len;
    int e = shm_submit_encode(&q, buf, sizeof buf, &len);
    if (e) return e;
    return shm_ring_push(&seg->submit, buf, len);
}

int main(void) {
    cm_log_set_level(CM_LOG_LEVEL_ERROR);
    const char *bin = getenv("ARKA_BIN");
    if (!bin || access(bin, X_OK) != 0 || access(MODEL, R_OK) != 0) {
        printf("skipped: ARKA_BIN or %s missing\n", MODEL);
        return t_done();
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    st s;
    memset(&s, 0, sizeof s);
    static const char *args[] = {"-m", MODEL, "--backend", "cpu", "--threads", "1", "--log-level", "error", NULL};
    gw_exec_cfg c;
    gw_exec_cfg_default(&c);
    c.bin = bin;
    c.args = args;
    c.heartbeat_timeout_ms = 1500;
    c.backoff_min_ms = 50;
    c.backoff_max_ms = 400;
    c.on_state = on_state;
    c.on_events = on_events;
    c.ud = &s;
    gw_exec *x;
    T_EQ_INT(gw_exec_start(&loop, &c, &x), 0);
    T_CHECK(run_until(&loop, &s.ups, 1, 30000));
    T_EQ_INT(gw_exec_ready(x), 1);
    T_CHECK(gw_exec_pid(x) > 0);

    /* a request through the segment */
    T_EQ_INT(submit(gw_exec_seg(x), 1, 6), 0);
    T_CHECK(run_until(&loop, &s.dones, 1, 20000));
    T_EQ_INT(s.finish, SHM_FINISH_LENGTH);
    T_EQ_INT(s.completion, 6);
    T_EQ_INT(s.errors, 0);
    T_CHECK(s.tokens >= 1);

    /* SIGKILL: noticed, reported, restarted on a fresh segment */
    int pid = gw_exec_pid(x);
    struct shm_seg *seg0 = gw_exec_seg(x);
    void *base0 = seg0->base;
    kill(pid, SIGKILL);
    T_CHECK(run_until(&loop, &s.downs, 1, 5000));
    T_CHECK(strstr(s.last_why, "signal 9") != NULL);
    T_EQ_INT(gw_exec_ready(x), 0);
    T_CHECK(run_until(&loop, &s.ups, 2, 30000));
    T_EQ_INT(gw_exec_spawns(x), 2);
    T_CHECK(gw_exec_pid(x) != pid && gw_exec_pid(x) > 0);
    (void)base0;
    T_EQ_INT(submit(gw_exec_seg(x), 1, 3), 0);
    T_CHECK(run_until(&loop, &s.dones, 2, 20000));
    T_EQ_INT(s.completion, 3);

    /* a frozen executor: its heartbeat goes stale and it is replaced */
    pid = gw_exec_pid(x);
    kill(pid, SIGSTOP);
    T_CHECK(run_until(&loop, &s.downs, 2, 10000));
    T_CHECK(strstr(s.last_why, "heartbeat stalled") != NULL);
    T_CHECK(run_until(&loop, &s.ups, 3, 30000));
    T_EQ_INT(gw_exec_spawns(x), 3);

    /* stop: SIGTERM, drained, handles closed */
    gw_exec_stop(x, on_stopped, &s);
    T_CHECK(run_until(&loop, &s.stopped, 1, 20000));
    T_EQ_INT(gw_exec_pid(x), 0);
    gw_exec_destroy(x);
    T_EQ_INT(uv_run(&loop, UV_RUN_NOWAIT), 0);

    /* a model that cannot load: the executor exits, and restarts back off 50, 100, 200, 400, 400 ms */
    memset(&s, 0, sizeof s);
    static const char *bad_args[] = {"-m", "/nonexistent/model.gguf", "--backend", "cpu", "--log-level", "off", NULL};
    c.args = bad_args;
    T_EQ_INT(gw_exec_start(&loop, &c, &x), 0);
    T_CHECK(run_until(&loop, &s.downs, 4, 20000));
    T_EQ_INT(s.ups, 0);
    T_CHECK(strstr(s.last_why, "exited with status") != NULL);
    T_EQ_INT(gw_exec_backoff_ms(x), 400);
    gw_exec_stop(x, on_stopped, &s);
    T_CHECK(run_until(&loop, &s.stopped, 1, 20000));
    gw_exec_destroy(x);

    /* a binary that does not exist: reported, retried, stoppable */
    memset(&s, 0, sizeof s);
    c.bin = "/nonexistent/arka";
    T_EQ_INT(gw_exec_start(&loop, &c, &x), 0);
    T_CHECK(run_until(&loop, &s.downs, 2, 5000));
    T_CHECK(strstr(s.last_why, "cannot start") != NULL);
    gw_exec_stop(x, on_stopped, &s);
    T_CHECK(run_until(&loop, &s.stopped, 1, 5000));
    gw_exec_destroy(x);
    uv_run(&loop, UV_RUN_DEFAULT);
    T_EQ_INT(uv_loop_close(&loop), 0);
    return t_done();
}
