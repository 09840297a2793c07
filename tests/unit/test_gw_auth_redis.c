/* test_gw_auth_redis: the Redis key store against a real redis-server started here on a free
 * loopback port, with two gateway processes (forked from this one: routes + auth + a fake
 * backend) sharing it. Checks: 401/403, requests- and tokens-per-minute limits hit exactly under
 * 50 concurrent clients spread over both gateways, the concurrency limit (and its release when
 * clients leave), the daily budget (no retry), usage settled once for completed, cancelled and
 * failed requests, revocation, Redis killed (no 5xx, fallback admissions counted) and restarted
 * (Redis limits again). Prints "skipped" and passes when redis-server is not installed. */
#include "gateway/auth.h"

#include <stdio.h>

#ifndef ARKA_WITH_HIREDIS
int main(void) {
    printf("skipped: built without hiredis\n0 passed, 0 failed\n");
    return 0;
}
#else

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/routes.h"
#include "tests/unit/gw_fake.h"
#include "tests/unit/t.h"

static const char SECRET[] = "redis-test-secret-0123456789";
static char dir[256], url[128];
static int redis_port;
static pid_t redis_pid;

/* ---- the gateway child: routes + auth(redis) + a fake backend ----------------------------- */

/* Generations run on gw_fake.h's backend (5 ms steps; "hold" holds after its first token, "fail"
 * fails after it). */

static gw_auth *child_auth;
static _Atomic int64_t *clock_skew; /* shared with the gateway children: added to their auth clock (ms) */

static int64_t child_clock(void *ud) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + atomic_load(clock_skew);
}

static char *child_metrics(void *ud, size_t *len) {
    gw_auth_stats st;
    gw_auth_stats_get(child_auth, &st);
    char *s = malloc(256);
    if (!s) return NULL;
    *len = (size_t)snprintf(s, 256, "fallback %llu\nredis_errors %llu\nadmitted %llu\n", (unsigned long long)st.fallback_admits,
                            (unsigned long long)st.redis_errors, (unsigned long long)st.admitted);
    return s;
}

static void child_closed(gw_server *s, void *ud) { gw_auth_shutdown(ud); }

static void child_main(int wfd) {
    if (getenv("T_CHILD_LOG")) cm_log_set_level(CM_LOG_LEVEL_DEBUG);
    uv_loop_t loop;
    uv_loop_init(&loop);
    fake be;
    fake_init(&be, &loop);
    be.step_ms = 5;
    be.hold_ms = 600000;
    be.fail_at = 1;
    gw_gen_env env = fake_env(&be, 4096);
    gw_auth_cfg c;
    gw_auth_cfg_default(&c);
    c.redis_url = url;
    c.secret = (const uint8_t *)SECRET;
    c.secret_len = strlen(SECRET);
    c.clock = child_clock;
    gw_app_cfg ac;
    gw_app_cfg_default(&ac);
    ac.env = &env;
    ac.model_id = "m1";
    ac.metrics = child_metrics;
    gw_app *app = NULL;
    gw_server *s = NULL;
    gw_http_cfg hc;
    gw_http_cfg_default(&hc);
    hc.port = 0;
    hc.handler = gw_app_handle;
    hc.on_headers = gw_app_on_headers;
    int port = -1;
    if (be.vocab && gw_auth_create(&loop, &c, &child_auth) == 0 && (ac.auth = child_auth, gw_app_create(&ac, &app) == 0) &&
        (hc.ud = app, gw_server_create(&loop, &hc, &s) == 0))
        port = gw_server_port(s);
    if (write(wfd, &port, sizeof port) != sizeof port || port < 0) _exit(1);
    close(wfd);
    gw_server_on_closed(s, child_closed, child_auth);
    gw_server_handle_signals(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    gw_server_destroy(s);
    gw_app_destroy(app);
    gw_auth_destroy(child_auth);
    uv_run(&loop, UV_RUN_NOWAIT);
    fake_free(&be);
    _exit(0);
}

static pid_t gw_pid[2];
static int gw_port[2];

static int start_gateway(int i) {
    int p[2];
    if (pipe(p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        child_main(p[1]);
    }
    close(p[1]);
    int port = -1;
    if (read(p[0], &port, sizeof port) != sizeof port) port = -1;
    close(p[0]);
    gw_pid[i] = pid;
    gw_port[i] = port;
    return port;
}

/* ---- redis-server ---------------------------------------------------------------------- */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) {
        close(fd);
        return -1;
    }
    int port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static redisContext *rc_connect(void) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static int redis_start(void) {
    char port[16];
    snprintf(port, sizeof port, "%d", redis_port);
    redis_pid = fork();
    if (redis_pid == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 1);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir", dir, "--save", "",
               "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        redisContext *c = rc_connect();
        if (c) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            redisFree(c);
            if (ok) return 0;
        }
        usleep(10000);
    }
    return -1;
}

static void redis_kill(void) {
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
}

static long long redis_int(const char *fmt, const char *a1, const char *a2) {
    redisContext *c = rc_connect();
    if (!c) return -1;
    redisReply *r = redisCommand(c, fmt, a1, a2);
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) v = atoll(r->str);
    else if (r && r->type == REDIS_REPLY_INTEGER) v = r->integer;
    else if (r && r->type == REDIS_REPLY_NIL) v = 0;
    if (r) freeReplyObject(r);
    redisFree(c);
    return v;
}

/* ---- keys and clients ---------------------------------------------------------------------- */

typedef struct tkey {
    char key[GW_KEY_BUF];
    gw_key k;
} tkey;

static void mk_key(tkey *t, const char *tenant, const char *models, int64_t rpm, int64_t tpm, int64_t conc, int64_t daily) {
    memset(t, 0, sizeof *t);
    gw_key_generate(t->key);
    gw_key_hash((const uint8_t *)SECRET, strlen(SECRET), t->key, strlen(t->key), t->k.hash, t->k.id);
    snprintf(t->k.tenant, sizeof t->k.tenant, "%s", tenant);
    snprintf(t->k.models, sizeof t->k.models, "%s", models);
    t->k.rpm = rpm, t->k.tpm = tpm, t->k.concurrency = conc, t->k.daily_tokens = daily, t->k.enabled = 1;
    char err[256];
    T_CHECKF(gw_redis_key_put(url, &t->k, err, sizeof err) == 0, "%s", err);
}

static long long day_tokens(const tkey *t) {
    char k[160];
    snprintf(k, sizeof k, "arka:{%s}:k:%s:d:%lld", t->k.tenant, t->k.id, (long long)(time(NULL) / 86400));
    return redis_int("HGET %s %s", k, "tok");
}

static int connect_port(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

typedef struct resp {
    int status;
    char head[4096];
    char body[4096];
} resp;

/* POST /v1/completions; out NULL: returns the socket once the response head has arrived. */
static int post(int port, const char *key, const char *body, resp *out) {
    int fd = connect_port(port);
    if (fd < 0) return -1;
    char req[4096];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", key, strlen(body), body);
    send(fd, req, (size_t)n, MSG_NOSIGNAL);
    char buf[16384];
    size_t got = 0;
    ssize_t r;
    if (!out) { /* wait for the head of a streamed answer, keep the connection */
        while (got < sizeof buf - 1 && (r = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0) {
            got += (size_t)r;
            buf[got] = 0;
            if (strstr(buf, "\r\n\r\n")) break;
        }
        if (atoi(buf + 9) != 200) {
            close(fd);
            return -atoi(buf + 9) - 1;
        }
        return fd;
    }
    memset(out, 0, sizeof *out);
    while (got < sizeof buf - 1 && (r = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0) got += (size_t)r;
    close(fd);
    buf[got] = 0;
    char *end = strstr(buf, "\r\n\r\n");
    if (!end) return -1;
    snprintf(out->head, sizeof out->head, "%.*s", (int)(end - buf + 2), buf);
    snprintf(out->body, sizeof out->body, "%s", end + 4);
    out->status = atoi(buf + 9);
    return out->status;
}

static int hdr(const resp *r, const char *name, char *v, size_t cap) {
    size_t nl = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n"))
        if (strncasecmp(p + 2, name, nl) == 0 && p[2 + nl] == ':') {
            const char *s = p + 3 + nl;
            while (*s == ' ') s++;
            snprintf(v, cap, "%.*s", (int)strcspn(s, "\r"), s);
            return 1;
        }
    return 0;
}

static long long metric(int i, const char *name) {
    int fd = connect_port(gw_port[i]);
    if (fd < 0) return -1;
    const char req[] = "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
    char buf[4096];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0) got += (size_t)r;
    close(fd);
    buf[got] = 0;
    const char *p = strstr(buf, name);
    return p ? atoll(p + strlen(name) + 1) : -1;
}

/* A body whose reservation (bytes / 2 + max_tokens) equals its usage (prompt bytes + max_tokens). */
static void exact_body(char *out, size_t cap, int max_tokens) {
    char fill[256];
    for (int L = 1; L < 200; L++) {
        memset(fill, 'x', (size_t)L);
        fill[L] = 0;
        int n = snprintf(out, cap, "{\"model\":\"m1\",\"prompt\":\"%s\",\"max_tokens\":%d}", fill, max_tokens);
        if (n / 2 == L) return;
    }
}

typedef struct burst {
    const char *key, *body;
    int i;
    int status;
} burst;

static void *burst_one(void *arg) {
    burst *b = arg;
    resp r;
    b->status = post(gw_port[b->i % 2], b->key, b->body, &r);
    if (b->status != 200 && b->status != 429) fprintf(stderr, "burst body: %s\n", r.body);
    return NULL;
}

/* n concurrent clients, alternating gateways; counts of 200 and 429 and anything else. */
static void run_burst(int n, const char *key, const char *body, int *ok, int *limited, int *other) {
    pthread_t th[64];
    burst b[64];
    *ok = *limited = *other = 0;
    for (int i = 0; i < n; i++) {
        b[i] = (burst){key, body, i, 0};
        pthread_create(&th[i], NULL, burst_one, &b[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (b[i].status == 200) (*ok)++;
        else if (b[i].status == 429) (*limited)++;
        else {
            (*other)++;
            fprintf(stderr, "burst: status %d from gateway %d\n", b[i].status, i % 2);
        }
    }
}

/* Waits until a burst has at least 10 s left in the current minute (limits are per minute). */
static void avoid_minute_edge(void) {
    time_t t = time(NULL);
    if (t % 60 >= 50) sleep((unsigned)(61 - t % 60));
}

static int wait_value(const tkey *t, long long want) {
    for (int i = 0; i < 300; i++) {
        if (day_tokens(t) == want) return 1;
        usleep(10000);
    }
    return 0;
}

int main(void) {
    cm_log_set_level(CM_LOG_LEVEL_ERROR);
    signal(SIGPIPE, SIG_IGN);
    if (system("command -v redis-server >/dev/null 2>&1") != 0) {
        printf("skipped: redis-server is not installed\n");
        return t_done();
    }
    clock_skew = mmap(NULL, sizeof *clock_skew, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (clock_skew == MAP_FAILED) return 1;
    atomic_store(clock_skew, 0);
    snprintf(dir, sizeof dir, "/tmp/arka_test_redis.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    redis_port = free_port();
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", redis_port);
    if (redis_start()) {
        fprintf(stderr, "redis-server did not start\n");
        return 1;
    }
    tkey krpm, ktpm, kconc, kday, kone, kfall;
    mk_key(&krpm, "acme", "*", 20, 0, 0, 0);
    mk_key(&ktpm, "acme", "*", 0, 0, 0, 0); /* tpm set below, once the reservation is known */
    mk_key(&kconc, "beta", "m1", 0, 0, 3, 0);
    mk_key(&kday, "gamma", "*", 0, 0, 0, 100);
    mk_key(&kone, "delta", "m2", 0, 0, 0, 0);
    mk_key(&kfall, "eps", "*", 0, 0, 0, 0);
    char body[512], err[256];
    exact_body(body, sizeof body, 2);
    int reserve = (int)strlen(body) / 2 + 2;
    ktpm.k.tpm = 10 * reserve;
    T_CHECKF(gw_redis_key_put(url, &ktpm.k, err, sizeof err) == 0, "%s", err);

    T_CHECK(start_gateway(0) > 0 && start_gateway(1) > 0);
    usleep(200000); /* both connected */
    resp r;
    char v[128];

    /* 401, 403 */
    char unknown[GW_KEY_BUF];
    gw_key_generate(unknown);
    T_EQ_INT(post(gw_port[0], unknown, body, &r), 401);
    T_CHECK(strstr(r.body, "invalid_api_key") != NULL);
    T_EQ_INT(post(gw_port[1], kone.key, body, &r), 403);
    T_CHECK(strstr(r.body, "model_not_allowed") != NULL);

    /* requests per minute: 50 concurrent clients on two gateways, exactly 20 admitted */
    int ok, lim, other;
    avoid_minute_edge();
    run_burst(50, krpm.key, body, &ok, &lim, &other);
    T_EQ_INT(ok, 20);
    T_EQ_INT(lim, 30);
    T_EQ_INT(other, 0);
    /* tokens per minute: room for exactly 10 reservations (usage equals the reservation) */
    avoid_minute_edge();
    run_burst(50, ktpm.key, body, &ok, &lim, &other);
    T_EQ_INT(ok, 10);
    T_EQ_INT(lim, 40);
    T_EQ_INT(other, 0);
    T_EQ_INT(post(gw_port[0], ktpm.key, body, &r), 429);
    T_CHECK(hdr(&r, "x-ratelimit-remaining-tokens", v, sizeof v) && atoi(v) == 0);
    T_CHECK(hdr(&r, "Retry-After", v, sizeof v) && atoi(v) >= 1);

    /* concurrency 3 across both gateways; released when the clients leave */
    int held[8], nheld = 0, refused = 0;
    for (int i = 0; i < 6; i++) {
        int fd = post(gw_port[i % 2], kconc.key, "{\"model\":\"m1\",\"prompt\":\"hold\",\"max_tokens\":5,\"stream\":true}", NULL);
        if (fd >= 0) held[nheld++] = fd;
        else if (fd == -430) refused++;
    }
    T_EQ_INT(nheld, 3);
    T_EQ_INT(refused, 3);
    usleep(50000); /* each held request has produced its first token */
    for (int i = 0; i < nheld; i++) close(held[i]);
    long long want = 3 * (4 + 1); /* cancelled: prompt "hold" + the one token seen */
    T_CHECKF(wait_value(&kconc, want), "day tokens %lld, want %lld", day_tokens(&kconc), want);
    T_EQ_INT(post(gw_port[0], kconc.key, body, &r), 200);
    want += reserve;
    /* a failed request: prompt + the token before the failure */
    T_EQ_INT(post(gw_port[1], kconc.key, "{\"model\":\"m1\",\"prompt\":\"fail\",\"max_tokens\":5}", &r), 500);
    want += 4 + 1;
    T_CHECKF(wait_value(&kconc, want), "day tokens %lld, want %lld", day_tokens(&kconc), want);
    usleep(300000); /* settled once: nothing more arrives */
    T_EQ_INT(day_tokens(&kconc), want);

    /* daily budget 100: two requests of `reserve` (43 tokens) fit, the third is not to be retried */
    T_EQ_INT(post(gw_port[0], kday.key, body, &r), 200);
    T_EQ_INT(post(gw_port[1], kday.key, body, &r), 200);
    T_EQ_INT(post(gw_port[0], kday.key, body, &r), 429);
    T_CHECK(strstr(r.body, "insufficient_quota") != NULL);
    T_CHECK(hdr(&r, "x-should-retry", v, sizeof v) && !strcmp(v, "false"));
    T_EQ_INT(day_tokens(&kday), 2 * reserve);

    /* revocation: at once, on both gateways */
    T_EQ_INT(post(gw_port[0], kfall.key, body, &r), 200);
    T_EQ_INT(post(gw_port[1], kfall.key, body, &r), 200);
    T_CHECK(gw_redis_key_set_enabled(url, krpm.k.id, 0, err, sizeof err) == 0);
    T_EQ_INT(post(gw_port[1], krpm.key, body, &r), 401);

    /* list and usage through Redis */
    gw_key *ks;
    gw_key_usage *us;
    int nk = 0;
    T_CHECK(gw_redis_keys_list(url, &ks, &nk, &us, err, sizeof err) == 0);
    T_EQ_INT(nk, 6);
    int seen = 0;
    for (int i = 0; i < nk; i++)
        if (!strcmp(ks[i].id, kday.k.id)) seen = us[i].tokens == 2 * reserve && us[i].requests == 2 && ks[i].daily_tokens == 100;
    T_CHECK(seen);
    free(ks);
    free(us);

    /* Redis slow (stopped): a client that leaves while its admission waits frees everything; the
     * fallback answers the others within the timeout; the late grant from Redis is undone */
    {
        char lk[160];
        snprintf(lk, sizeof lk, "arka:{%s}:k:%s:lease", kconc.k.tenant, kconc.k.id);
        long long before = day_tokens(&kconc);
        kill(redis_pid, SIGSTOP);
        int fd = connect_port(gw_port[0]); /* sends a request and leaves before any answer */
        char req[512];
        int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
                         "Content-Length: %zu\r\n\r\n%s", kconc.key, strlen(body), body);
        send(fd, req, (size_t)n, MSG_NOSIGNAL);
        usleep(20000);
        close(fd);
        fd = -1;
        struct timeval t0, t1;
        gettimeofday(&t0, NULL);
        T_EQ_INT(post(gw_port[1], kfall.key, body, &r), 200);
        gettimeofday(&t1, NULL);
        long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_usec - t0.tv_usec) / 1000;
        T_CHECKF(ms < 2000, "fallback took %ld ms", ms);
        if (fd >= 0) close(fd);
        usleep(100000);
        kill(redis_pid, SIGCONT);
        usleep(500000);
        T_EQ_INT(redis_int("ZCARD %s", lk, NULL), 0);
        T_EQ_INT(day_tokens(&kconc), before);
    }

    /* The key is checked from the headers, before the body is read: an unknown key gets its 401
     * without a byte of its 8 MB body sent; a known one's body is read once Redis answered */
    {
        char unk[GW_KEY_BUF];
        gw_key_generate(unk);
        int fd = connect_port(gw_port[0]);
        char req[512];
        int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
                         "Content-Length: 8000000\r\n\r\n", unk);
        struct timeval t0, t1;
        gettimeofday(&t0, NULL);
        send(fd, req, (size_t)n, MSG_NOSIGNAL);
        char buf[2048];
        ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
        gettimeofday(&t1, NULL);
        buf[got > 0 ? got : 0] = 0;
        long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_usec - t0.tv_usec) / 1000;
        T_CHECKF(got > 0 && atoi(buf + 9) == 401 && strstr(buf, "invalid_api_key"), "unknown key before its body: %s", buf);
        T_CHECKF(ms < 1000, "401 after %ld ms", ms);
        close(fd);
        T_EQ_INT(post(gw_port[1], kfall.key, body, &r), 200);
    }

    /* A Redis hang (3 s; 20 s with ARKA_LONG_TESTS=1) while a key of concurrency 1 is used one
     * request at a time: those during the hang are admitted by the fallback, and none leaves a
     * lease in Redis (ADMIT refuses to run past its deadline), so right after the hang Redis
     * admits the key again, one request at a time */
    {
        tkey kseq;
        mk_key(&kseq, "theta", "*", 0, 0, 1, 0);
        char lk[160];
        snprintf(lk, sizeof lk, "arka:{%s}:k:%s:lease", kseq.k.tenant, kseq.k.id);
        /* one gateway: its settlement and its next admission share one Redis connection, in order
         * (across gateways a settlement may land after the other's next admission) */
        T_CHECKF(post(gw_port[0], kseq.key, body, &r) == 200, "%s", r.body);
        T_CHECKF(post(gw_port[0], kseq.key, body, &r) == 200, "%s", r.body);
        int hang_ms = getenv("ARKA_LONG_TESTS") && !strcmp(getenv("ARKA_LONG_TESTS"), "1") ? 20000 : 3000;
        kill(redis_pid, SIGSTOP);
        struct timeval t0, t1;
        gettimeofday(&t0, NULL);
        int during = 0, during_ok = 0;
        long el = 0;
        while (el < hang_ms) {
            during_ok += post(gw_port[0], kseq.key, body, &r) == 200;
            during++;
            usleep(50000);
            gettimeofday(&t1, NULL);
            el = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_usec - t0.tv_usec) / 1000;
        }
        kill(redis_pid, SIGCONT);
        T_CHECKF(during_ok == during, "during the hang: %d of %d admitted", during_ok, during);
        /* Redis back: the gateway reconnects (back-off up to 5 s); then one request at a time */
        usleep(300000);
        int ok_after = 0, tries = 0;
        long long fbh = metric(0, "fallback");
        for (; tries < 200 && ok_after < 10; tries++) {
            int st = post(gw_port[0], kseq.key, body, &r);
            if (st == 200) ok_after++;
            else {
                fprintf(stderr, "after the hang: %d %s\n", st, r.body);
                break;
            }
            long long fbn = metric(0, "fallback");
            if (fbn != fbh) ok_after = 0, fbh = fbn; /* still the fallback: wait for Redis */
            usleep(50000);
        }
        T_CHECKF(ok_after == 10, "after a %d ms hang: %d sequential admissions through Redis", hang_ms, ok_after);
        usleep(200000);
        T_EQ_INT(redis_int("ZCARD %s", lk, NULL), 0);
    }

    /* A key revoked just before a hang is refused during it: the revocation reached the
     * gateways' cache (POLL) before Redis stopped answering */
    {
        tkey krev;
        mk_key(&krev, "iota", "*", 0, 0, 0, 0);
        T_EQ_INT(post(gw_port[0], krev.key, body, &r), 200);
        T_EQ_INT(post(gw_port[1], krev.key, body, &r), 200);
        T_CHECK(gw_redis_key_set_enabled(url, krev.k.id, 0, err, sizeof err) == 0);
        T_EQ_INT(redis_int("SISMEMBER arka:revoked %s", "iota:", NULL) >= 0, 1);
        usleep(2500000); /* a POLL (every second) on each gateway */
        kill(redis_pid, SIGSTOP);
        int s0 = post(gw_port[0], krev.key, body, &r), s1 = post(gw_port[1], krev.key, body, &r);
        int sk = post(gw_port[0], kfall.key, body, &r); /* a key in good standing: still served */
        kill(redis_pid, SIGCONT);
        T_CHECKF(s0 == 401 && s1 == 401, "revoked key during the hang: %d %d", s0, s1);
        T_EQ_INT(sk, 200);
    }

    /* Redis killed: known keys keep being served (no 5xx), counted as fallback admissions */
    long long fb0 = metric(0, "fallback") + metric(1, "fallback");
    redis_kill();
    int fives = 0, oks = 0;
    for (int i = 0; i < 10; i++) {
        int st = post(gw_port[i % 2], kfall.key, body, &r);
        if (st >= 500) fives++;
        if (st == 200) oks++;
    }
    T_EQ_INT(fives, 0);
    T_EQ_INT(oks, 10);
    long long fb1 = metric(0, "fallback") + metric(1, "fallback");
    T_CHECKF(fb1 >= fb0 + 10, "fallback %lld -> %lld", fb0, fb1);
    /* the fallback starts from Redis's counts: kday's budget, spent in Redis, stays spent */
    T_EQ_INT(post(gw_port[0], kday.key, body, &r), 429);
    T_CHECK(strstr(r.body, "insufficient_quota") != NULL);
    /* an unknown key cannot be checked: 401, still no 5xx */
    T_EQ_INT(post(gw_port[0], unknown, body, &r), 401);

    /* restarted (same data, append-only file): Redis limits again */
    T_CHECK(redis_start() == 0);
    tkey kafter, kprobe; /* made after the restart: only Redis knows them */
    mk_key(&kafter, "zeta", "*", 5, 0, 0, 0);
    mk_key(&kprobe, "zeta", "*", 0, 0, 0, 0);
    int back = 0;
    for (int i = 0; i < 100 && !back; i++) { /* reconnect back-off is at most 5 s */
        int s0 = post(gw_port[0], kprobe.key, body, &r), s1 = s0 == 200 ? post(gw_port[1], kprobe.key, body, &r) : 0;
        back = s0 == 200 && s1 == 200;
        if (!back) usleep(100000);
    }
    T_CHECK(back);
    fb1 = metric(0, "fallback") + metric(1, "fallback");
    avoid_minute_edge();
    run_burst(20, kafter.key, body, &ok, &lim, &other);
    T_EQ_INT(ok, 5);
    T_EQ_INT(lim, 15);
    T_EQ_INT(other, 0);
    long long fb2 = metric(0, "fallback") + metric(1, "fallback");
    T_EQ_INT(fb2, fb1);

    /* A long outage: the gateways' clocks jump 3 hours ahead with Redis gone; keys they know are
     * still served by the local limiter (not 401), unknown ones still refused */
    redis_kill();
    atomic_store(clock_skew, 3 * 3600 * 1000ll);
    usleep(200000);
    for (int i = 0; i < 2; i++) {
        int st = post(gw_port[i], kfall.key, body, &r);
        T_CHECKF(st == 200, "known key after a 3-hour outage on gateway %d: %d %s", i, st, r.body);
    }
    T_EQ_INT(post(gw_port[0], unknown, body, &r), 401);
    atomic_store(clock_skew, 0);

    for (int i = 0; i < 2; i++) {
        kill(gw_pid[i], SIGTERM);
        int stx = 0;
        waitpid(gw_pid[i], &stx, 0);
        T_CHECK(WIFEXITED(stx) && WEXITSTATUS(stx) == 0);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
#endif
