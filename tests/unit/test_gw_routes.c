/* test_gw_routes: the OpenAI routes end to end over loopback (HTTP JSON, SSE, WebSocket events):
 * real generations (gateway/gen.h: tokenizing, the chat template, detokenizing) on the fake
 * backend of gw_fake.h, which is NOT a model: it produces " c<choice>t<i>" tokens on a timer so
 * that every byte the routes send can be predicted, and counts cancels, so client disconnects
 * and response.cancel can be checked. */
#include "gateway/routes.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "gateway/ws.h"
#include "tests/unit/gw_fake.h"
#include "tests/unit/t.h"

#define TB_CTX 64

/* ---- server thread ------------------------------------------------------------------------ */

typedef struct srv {
    pthread_t th;
    uv_loop_t loop;
    gw_server *s;
    gw_app *app;
    fake be;
    gw_gen_env env;
    atomic_int ready;
} srv;

static void *srv_main(void *arg) {
    srv *st = arg;
    uv_loop_init(&st->loop);
    fake_init(&st->be, &st->loop);
    if (!st->be.vocab) {
        atomic_store(&st->ready, -1);
        return NULL;
    }
    st->env = fake_env(&st->be, TB_CTX);
    gw_app_cfg ac;
    gw_app_cfg_default(&ac);
    ac.env = &st->env;
    ac.model_id = "test-model";
    ac.ping_ms = 50;
    ac.ws_max_responses = 3;
    gw_app_create(&ac, &st->app);
    gw_http_cfg hc;
    gw_http_cfg_default(&hc);
    hc.port = 0;
    hc.handler = gw_app_handle;
    hc.ud = st->app;
    if (gw_server_create(&st->loop, &hc, &st->s)) {
        atomic_store(&st->ready, -1);
        return NULL;
    }
    atomic_store(&st->ready, 1);
    uv_run(&st->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---- client helpers ----------------------------------------------------------------------- */

static int connect_port(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const void *b, size_t n) {
    const char *p = b;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

typedef struct resp {
    int status;
    char head[4096];
    char *body;
    size_t len;
} resp;

/* One request on a fresh connection (Connection: close); reads the whole response, de-chunks. */
static int http(int port, const char *method, const char *path, const char *body, resp *r) {
    memset(r, 0, sizeof *r);
    int fd = connect_port(port);
    if (fd < 0) return -1;
    char head[512];
    int hl = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n", method, path, body ? strlen(body) : 0);
    send_all(fd, head, (size_t)hl);
    if (body) send_all(fd, body, strlen(body));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t got = recv(fd, buf + n, cap - n - 1, 0);
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fd);
    buf[n] = 0;
    char *end = strstr(buf, "\r\n\r\n");
    if (!end) {
        free(buf);
        return -1;
    }
    size_t hlen = (size_t)(end - buf) + 4;
    snprintf(r->head, sizeof r->head, "%.*s", (int)hlen, buf);
    r->status = atoi(buf + 9);
    r->body = malloc(n - hlen + 1);
    if (strstr(r->head, "Transfer-Encoding: chunked")) {
        const char *p = buf + hlen;
        size_t o = 0;
        for (;;) {
            size_t cl = strtoul(p, NULL, 16);
            p = strstr(p, "\r\n") + 2;
            if (cl == 0) break;
            memcpy(r->body + o, p, cl);
            o += cl;
            p += cl + 2;
        }
        r->len = o;
    } else {
        memcpy(r->body, buf + hlen, n - hlen);
        r->len = n - hlen;
    }
    r->body[r->len] = 0;
    free(buf);
    return 0;
}

static cJSON *err_of(resp *r, const char **code, const char **param) {
    cJSON *j = cJSON_Parse(r->body);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    cJSON *c = cJSON_GetObjectItem(e, "code"), *p = cJSON_GetObjectItem(e, "param");
    *code = cJSON_IsString(c) ? c->valuestring : "(null)";
    *param = cJSON_IsString(p) ? p->valuestring : "(null)";
    return j;
}

/* ---- HTTP tests --------------------------------------------------------------------------- */

static void test_basic_routes(srv *st, int port) {
    resp r;
    atomic_store(&st->be.ready, 0);
    T_EQ_INT(http(port, "GET", "/health", NULL, &r), 0);
    T_EQ_INT(r.status, 503);
    T_EQ_STR(r.body, "{\"status\":\"loading\"}");
    free(r.body);
    T_EQ_INT(http(port, "POST", "/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"hi\"}", &r), 0);
    T_EQ_INT(r.status, 503);
    T_CHECK(strstr(r.head, "Retry-After: 1\r\n") != NULL);
    T_CHECK(strstr(r.body, "model_not_ready") != NULL);
    free(r.body);
    atomic_store(&st->be.ready, 1);
    T_EQ_INT(http(port, "GET", "/health", NULL, &r), 0);
    T_EQ_INT(r.status, 200);
    T_EQ_STR(r.body, "{\"status\":\"ok\"}");
    T_CHECK(strstr(r.head, "Content-Type: application/json\r\n") != NULL);
    free(r.body);
    T_EQ_INT(http(port, "HEAD", "/health", NULL, &r), 0);
    T_EQ_INT(r.status, 200);
    T_EQ_INT(r.len, 0);
    T_CHECK(strstr(r.head, "Content-Length: 15\r\n") != NULL);
    free(r.body);
    T_EQ_INT(http(port, "GET", "/ready", NULL, &r), 0);
    T_EQ_INT(r.status, 200);
    free(r.body);
    T_EQ_INT(http(port, "GET", "/v1/models", NULL, &r), 0);
    T_EQ_INT(r.status, 200);
    cJSON *j = cJSON_Parse(r.body);
    T_EQ_STR(cJSON_GetObjectItem(j, "object")->valuestring, "list");
    cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    T_EQ_STR(cJSON_GetObjectItem(m0, "id")->valuestring, "test-model");
    T_EQ_STR(cJSON_GetObjectItem(m0, "object")->valuestring, "model");
    T_EQ_STR(cJSON_GetObjectItem(m0, "owned_by")->valuestring, "arka");
    cJSON_Delete(j);
    free(r.body);
    T_EQ_INT(http(port, "GET", "/v1/models/test%2Dmodel", NULL, &r), 0);
    T_EQ_INT(r.status, 200);
    T_CHECK(strstr(r.body, "\"id\":\"test-model\"") != NULL);
    free(r.body);
    const char *code, *param;
    T_EQ_INT(http(port, "GET", "/v1/models/gpt-4", NULL, &r), 0);
    T_EQ_INT(r.status, 404);
    j = err_of(&r, &code, &param);
    T_EQ_STR(code, "model_not_found");
    cJSON_Delete(j);
    free(r.body);
    T_EQ_INT(http(port, "GET", "/v1/nothing", NULL, &r), 0);
    T_EQ_INT(r.status, 404);
    j = err_of(&r, &code, &param);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring, "Invalid URL (GET /v1/nothing)");
    cJSON_Delete(j);
    free(r.body);
    T_EQ_INT(http(port, "GET", "/v1/chat/completions", NULL, &r), 0);
    T_EQ_INT(r.status, 405);
    T_CHECK(strstr(r.head, "Allow: POST\r\n") != NULL);
    T_CHECK(strstr(r.body, "\"type\":\"invalid_request_error\"") != NULL);
    free(r.body);
    T_EQ_INT(http(port, "DELETE", "/health", NULL, &r), 0);
    T_EQ_INT(r.status, 405);
    free(r.body);
}

static void test_completions(srv *st, int port) {
    resp r;
    const char *code, *param;
    T_EQ_INT(http(port, "POST", "/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"hi\",\"n\":2,\"max_tokens\":3,\"logprobs\":2}", &r), 0);
    T_EQ_INT(r.status, 200);
    cJSON *j = cJSON_Parse(r.body);
    T_CHECK(strncmp(cJSON_GetObjectItem(j, "id")->valuestring, "cmpl-", 5) == 0);
    T_EQ_STR(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    T_EQ_STR(cJSON_GetObjectItem(j, "model")->valuestring, "test-model");
    T_EQ_STR(cJSON_GetObjectItem(j, "system_fingerprint")->valuestring, "fp_arka");
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    T_EQ_INT(cJSON_GetArraySize(ch), 2);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 0), "text")->valuestring, " c0t0 c0t1 c0t2");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "text")->valuestring, " c1t0 c1t1 c1t2");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "finish_reason")->valuestring, "length");
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "logprobs");
    T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(lp, "tokens")), 3);
    T_EQ_STR(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 2)->valuestring, " c1t2");
    T_NEAR(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 2)->valuedouble, 10, 0);
    T_EQ_INT(cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0)), 2);
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    T_NEAR(cJSON_GetObjectItem(u, "prompt_tokens")->valuedouble, 2, 0);
    T_NEAR(cJSON_GetObjectItem(u, "completion_tokens")->valuedouble, 6, 0);
    T_NEAR(cJSON_GetObjectItem(u, "total_tokens")->valuedouble, 8, 0);
    cJSON_Delete(j);
    free(r.body);

    /* stop strings, and min_tokens: they are looked for from the min_tokens-th token's text on */
    const char *stop_bodies[3] = {
        "{\"model\":\"test-model\",\"prompt\":\"hi\",\"max_tokens\":4,\"stop\":[\" c0t1\"]}",
        "{\"model\":\"test-model\",\"prompt\":\"hi\",\"max_tokens\":4,\"stop\":[\" c0t1\"],\"min_tokens\":2}",
        "{\"model\":\"test-model\",\"prompt\":\"hi\",\"max_tokens\":4,\"stop\":[\" c0t1\"],\"min_tokens\":3}" };
    const char *want_text[3] = { " c0t0", " c0t0", " c0t0 c0t1 c0t2 c0t3" }, *want_finish[3] = { "stop", "stop", "length" };
    for (int k = 0; k < 3; k++) {
        T_EQ_INT(http(port, "POST", "/v1/completions", stop_bodies[k], &r), 0);
        T_EQ_INT(r.status, 200);
        j = cJSON_Parse(r.body);
        cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        T_EQ_STR(cJSON_GetObjectItem(c0, "text")->valuestring, want_text[k]);
        T_EQ_STR(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, want_finish[k]);
        cJSON_Delete(j);
        free(r.body);
    }
    /* min_tokens above the max_tokens that applies (given, or completions' default of 16) */
    T_EQ_INT(http(port, "POST", "/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"hi\",\"min_tokens\":17}", &r), 0);
    T_EQ_INT(r.status, 400);
    j = err_of(&r, &code, &param);
    T_EQ_STR(param, "min_tokens");
    T_CHECK(strstr(r.body, "max_tokens=16") != NULL);
    cJSON_Delete(j);
    free(r.body);

    /* validation errors are 400s before anything is streamed */
    T_EQ_INT(http(port, "POST", "/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"hi\",\"stream\":true,\"temperature\":9}", &r), 0);
    T_EQ_INT(r.status, 400);
    T_CHECK(strstr(r.head, "application/json") != NULL);
    j = err_of(&r, &code, &param);
    T_EQ_STR(param, "temperature");
    cJSON_Delete(j);
    free(r.body);
    /* another model */
    T_EQ_INT(http(port, "POST", "/v1/completions", "{\"model\":\"gpt-4\",\"prompt\":\"hi\"}", &r), 0);
    T_EQ_INT(r.status, 404);
    j = err_of(&r, &code, &param);
    T_EQ_STR(code, "model_not_found");
    T_EQ_STR(param, "model");
    cJSON_Delete(j);
    free(r.body);
    /* context length, reported by the backend before it starts, even for a stream */
    char big[512];
    snprintf(big, sizeof big, "{\"model\":\"test-model\",\"stream\":true,\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"%060d\"}]}", 0);
    T_EQ_INT(http(port, "POST", "/v1/chat/completions", big, &r), 0);
    T_EQ_INT(r.status, 400);
    j = err_of(&r, &code, &param);
    T_EQ_STR(code, "context_length_exceeded");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring,
             "This model's maximum context length is 64 tokens. However, you requested 70 tokens (60 in the messages, 10 in "
             "the completion). Please reduce the length of the messages or completion.");
    cJSON_Delete(j);
    free(r.body);
    /* not JSON */
    T_EQ_INT(http(port, "POST", "/v1/chat/completions", "{{", &r), 0);
    T_EQ_INT(r.status, 400);
    T_CHECK(strstr(r.body, "We could not parse the JSON body") != NULL);
    free(r.body);
}

/* Splits an SSE body into events; checks each is exactly "data: ...\n\n". Returns the count. */
static int sse_events(const char *body, char ev[][2048], int max, int *pings) {
    int n = 0;
    *pings = 0;
    const char *p = body;
    while (*p) {
        const char *e = strstr(p, "\n\n");
        if (!e) return -1;
        if (strncmp(p, ": ping", 6) == 0 && e - p == 6) {
            (*pings)++;
        } else {
            if (strncmp(p, "data: ", 6) != 0 || memchr(p, '\n', (size_t)(e - p)) || n == max) return -1;
            snprintf(ev[n++], 2048, "%.*s", (int)(e - p - 6), p + 6);
        }
        p = e + 2;
    }
    return n;
}

static void test_chat_stream(srv *st, int port) {
    resp r;
    static char ev[64][2048];
    int pings;
    T_EQ_INT(http(port, "POST", "/v1/chat/completions",
                  "{\"model\":\"test-model\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":2,"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}", &r), 0);
    T_EQ_INT(r.status, 200);
    T_CHECK(strstr(r.head, "Content-Type: text/event-stream\r\n") != NULL);
    T_CHECK(strstr(r.head, "Cache-Control: no-cache\r\n") != NULL);
    int n = sse_events(r.body, ev, 64, &pings);
    /* role, 2 content, finish, usage, [DONE] */
    T_EQ_INT(n, 6);
    T_EQ_STR(ev[n - 1], "[DONE]");
    const char *id = NULL;
    double created = 0;
    for (int i = 0; i < n - 1; i++) {
        cJSON *j = cJSON_Parse(ev[i]);
        T_CHECKF(j != NULL, "event %d: %s", i, ev[i]);
        if (!j) continue;
        T_EQ_STR(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion.chunk");
        T_EQ_STR(cJSON_GetObjectItem(j, "model")->valuestring, "test-model");
        if (i == 0) {
            id = strdup(cJSON_GetObjectItem(j, "id")->valuestring);
            created = cJSON_GetObjectItem(j, "created")->valuedouble;
        } else {
            T_EQ_STR(cJSON_GetObjectItem(j, "id")->valuestring, id);
            T_NEAR(cJSON_GetObjectItem(j, "created")->valuedouble, created, 0);
        }
        cJSON *ch = cJSON_GetObjectItem(j, "choices");
        cJSON *c0 = cJSON_GetArrayItem(ch, 0);
        cJSON *d = cJSON_GetObjectItem(c0, "delta");
        if (i == 0) {
            T_EQ_STR(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
            T_EQ_STR(cJSON_GetObjectItem(d, "content")->valuestring, "");
            T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")));
        } else if (i == 1 || i == 2) {
            T_EQ_STR(cJSON_GetObjectItem(d, "content")->valuestring, i == 1 ? " c0t0" : " c0t1");
            T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
        } else if (i == 3) {
            T_EQ_INT(cJSON_GetArraySize(d), 0);
            T_EQ_STR(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
        } else {
            T_EQ_INT(cJSON_GetArraySize(ch), 0);
            cJSON *u = cJSON_GetObjectItem(j, "usage");
            T_NEAR(cJSON_GetObjectItem(u, "prompt_tokens")->valuedouble, 5, 0);
            T_NEAR(cJSON_GetObjectItem(u, "completion_tokens")->valuedouble, 2, 0);
        }
        cJSON_Delete(j);
    }
    free((void *)id);
    free(r.body);

    /* n = 2 with logprobs: a role chunk per choice first, each token's logprob on its chunk, a
     * finish chunk per choice, [DONE] */
    T_EQ_INT(http(port, "POST", "/v1/chat/completions",
                  "{\"model\":\"test-model\",\"stream\":true,\"n\":2,\"max_tokens\":1,\"logprobs\":true,\"top_logprobs\":2,"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r), 0);
    n = sse_events(r.body, ev, 64, &pings);
    T_EQ_INT(n, 7); /* 2 roles, 2 tokens, 2 finishes, [DONE] */
    int roles = 0, toks = 0, fins = 0;
    for (int i = 0; i < n - 1; i++) {
        cJSON *j = cJSON_Parse(ev[i]);
        cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        cJSON *d = cJSON_GetObjectItem(c0, "delta");
        int idx = (int)cJSON_GetObjectItem(c0, "index")->valuedouble;
        if (cJSON_GetObjectItem(d, "role")) {
            T_CHECK(i < 2 && idx == i); /* both role chunks come before any content */
            roles++;
        } else if (cJSON_GetObjectItem(d, "content")) {
            char want[16];
            snprintf(want, sizeof want, " c%dt0", idx);
            T_EQ_STR(cJSON_GetObjectItem(d, "content")->valuestring, want);
            cJSON *lc = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
            T_EQ_INT(cJSON_GetArraySize(lc), 1);
            T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(lc, 0), "top_logprobs")), 2);
            toks++;
        } else if (cJSON_IsString(cJSON_GetObjectItem(c0, "finish_reason"))) {
            fins++;
        }
        cJSON_Delete(j);
    }
    T_EQ_INT(roles, 2);
    T_EQ_INT(toks, 2);
    T_EQ_INT(fins, 2);
    T_EQ_STR(ev[n - 1], "[DONE]");
    free(r.body);

    /* completions stream without usage: text chunks, a finish chunk, [DONE] */
    T_EQ_INT(http(port, "POST", "/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"x\",\"stream\":true}", &r), 0);
    n = sse_events(r.body, ev, 64, &pings);
    T_EQ_INT(n, 6);
    T_CHECK(strstr(ev[0], "\"text\":\" c0t0\"") && strstr(ev[0], "\"object\":\"text_completion\""));
    T_CHECK(strstr(ev[4], "\"text\":\"\"") && strstr(ev[4], "\"finish_reason\":\"stop\""));
    T_CHECK(strstr(ev[0], "\"usage\"") == NULL);
    T_EQ_STR(ev[5], "[DONE]");
    free(r.body);

    /* a failure mid-stream arrives as an error event, without [DONE] */
    T_EQ_INT(http(port, "POST", "/v1/chat/completions",
                  "{\"model\":\"test-model\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"fail-mid\"}]}", &r), 0);
    T_EQ_INT(r.status, 200);
    n = sse_events(r.body, ev, 64, &pings);
    T_EQ_INT(n, 4); /* role, 2 tokens, error */
    T_CHECK(n > 0 && strncmp(ev[n - 1], "{\"error\":{", 10) == 0 && strstr(ev[n - 1], "executor_failed"));
    free(r.body);

    /* keep-alive comments while nothing is produced */
    T_EQ_INT(http(port, "POST", "/v1/chat/completions",
                  "{\"model\":\"test-model\",\"stream\":true,\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"slow\"}]}", &r), 0);
    n = sse_events(r.body, ev, 64, &pings);
    T_EQ_INT(n, 5);
    T_CHECKF(pings >= 3, "%d pings", pings);
    free(r.body);
}

static void test_disconnect(srv *st, int port) {
    int c0 = atomic_load(&st->be.cancels);
    int fd = connect_port(port);
    const char *body = "{\"model\":\"test-model\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hold\"}]}";
    char req[512];
    int n = snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    send_all(fd, req, (size_t)n);
    char buf[4096];
    T_CHECK(recv(fd, buf, sizeof buf, 0) > 0); /* headers and the first chunks */
    close(fd);
    int ok = 0;
    for (int i = 0; i < 200 && !ok; i++) {
        cm_time_sleep_ms(5);
        ok = atomic_load(&st->be.cancels) == c0 + 1;
    }
    T_CHECK(ok);
    /* a non-streaming request whose client leaves is cancelled as well */
    fd = connect_port(port);
    body = "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hold\"}]}";
    n = snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    send_all(fd, req, (size_t)n);
    cm_time_sleep_ms(30);
    close(fd);
    ok = 0;
    for (int i = 0; i < 200 && !ok; i++) {
        cm_time_sleep_ms(5);
        ok = atomic_load(&st->be.cancels) == c0 + 2;
    }
    T_CHECK(ok);
}

/* ---- WebSocket tests ---------------------------------------------------------------------- */

static size_t ws_frame(uint8_t *out, int opcode, const char *p, size_t len) {
    static const uint8_t key[4] = {1, 2, 3, 4};
    size_t o = 0;
    out[o++] = (uint8_t)(0x80 | opcode);
    if (len < 126) out[o++] = 0x80 | (uint8_t)len;
    else if (len < 65536) {
        out[o++] = 0x80 | 126;
        out[o++] = (uint8_t)(len >> 8);
        out[o++] = (uint8_t)len;
    } else {
        out[o++] = 0x80 | 127;
        for (int i = 0; i < 8; i++) out[o++] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
    }
    memcpy(out + o, key, 4);
    o += 4;
    for (size_t i = 0; i < len; i++) out[o + i] = (uint8_t)p[i] ^ key[i & 3];
    return o + len;
}

static void ws_send(int fd, const char *text) {
    uint8_t buf[8192];
    size_t n = ws_frame(buf, 1, text, strlen(text));
    send_all(fd, buf, n);
}

static int recv_n(int fd, void *b, size_t n) {
    char *p = b;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Next text event as parsed JSON (NULL on close/EOF). */
static cJSON *ws_event(int fd) {
    uint8_t h[2];
    if (recv_n(fd, h, 2)) return NULL;
    size_t n = h[1] & 0x7F;
    if (n == 126) {
        uint8_t e[2];
        recv_n(fd, e, 2);
        n = (size_t)e[0] << 8 | e[1];
    }
    char *p = malloc(n + 1);
    if (recv_n(fd, p, n)) {
        free(p);
        return NULL;
    }
    p[n] = 0;
    cJSON *j = (h[0] & 0x0F) == 1 ? cJSON_Parse(p) : NULL;
    free(p);
    return j;
}

static const char *type_of(cJSON *j) {
    cJSON *t = cJSON_GetObjectItem(j, "type");
    return cJSON_IsString(t) ? t->valuestring : "(none)";
}

static void test_ws(srv *st, int port) {
    int fd = connect_port(port);
    const char *hs = "GET /v1/ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    send_all(fd, hs, strlen(hs));
    char head[512];
    size_t hn = 0;
    while (hn < sizeof head - 1 && recv(fd, head + hn, 1, 0) == 1) {
        hn++;
        if (hn >= 4 && memcmp(head + hn - 4, "\r\n\r\n", 4) == 0) break;
    }
    head[hn] = 0;
    T_CHECK(strncmp(head, "HTTP/1.1 101 ", 13) == 0);

    /* one response, start to finish */
    ws_send(fd, "{\"type\":\"response.create\",\"event_id\":\"c1\",\"response\":{\"max_tokens\":2,"
                "\"messages\":[{\"role\":\"user\",\"content\":\"hey\"}]}}");
    cJSON *j = ws_event(fd);
    T_EQ_STR(type_of(j), "response.created");
    cJSON *resp = cJSON_GetObjectItem(j, "response");
    char rid[64];
    snprintf(rid, sizeof rid, "%s", cJSON_GetObjectItem(resp, "id")->valuestring);
    T_CHECK(strncmp(rid, "resp_", 5) == 0);
    T_EQ_STR(cJSON_GetObjectItem(resp, "status")->valuestring, "in_progress");
    T_EQ_STR(cJSON_GetObjectItem(resp, "model")->valuestring, "test-model");
    cJSON_Delete(j);
    for (int i = 0; i < 2; i++) {
        j = ws_event(fd);
        T_EQ_STR(type_of(j), "response.output_text.delta");
        T_EQ_STR(cJSON_GetObjectItem(j, "response_id")->valuestring, rid);
        T_EQ_STR(cJSON_GetObjectItem(j, "delta")->valuestring, i == 0 ? " c0t0" : " c0t1");
        cJSON_Delete(j);
    }
    j = ws_event(fd);
    T_EQ_STR(type_of(j), "response.done");
    resp = cJSON_GetObjectItem(j, "response");
    T_EQ_STR(cJSON_GetObjectItem(resp, "status")->valuestring, "incomplete"); /* max_tokens cut it */
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(resp, "status_details"), "reason")->valuestring, "max_output_tokens");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(resp, "output"), 0), "text")->valuestring, " c0t0 c0t1");
    T_NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(resp, "usage"), "input_tokens")->valuedouble, 3, 0);
    T_NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(resp, "usage"), "output_tokens")->valuedouble, 2, 0);
    cJSON_Delete(j);

    /* two at once: a held one and a quick one; cancel the held one by id */
    int c0 = atomic_load(&st->be.cancels);
    ws_send(fd, "{\"type\":\"response.create\",\"response\":{\"messages\":[{\"role\":\"user\",\"content\":\"hold\"}]}}");
    j = ws_event(fd);
    T_EQ_STR(type_of(j), "response.created");
    char held[64];
    snprintf(held, sizeof held, "%s", cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "id")->valuestring);
    cJSON_Delete(j);
    j = ws_event(fd); /* the held one's first delta */
    T_EQ_STR(type_of(j), "response.output_text.delta");
    cJSON_Delete(j);
    ws_send(fd, "{\"type\":\"response.create\",\"response\":{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}}");
    int deltas = 0, done = 0;
    while (!done) {
        j = ws_event(fd);
        if (!j) break;
        if (strcmp(type_of(j), "response.output_text.delta") == 0) {
            T_CHECK(strcmp(cJSON_GetObjectItem(j, "response_id")->valuestring, held) != 0);
            deltas++;
        }
        if (strcmp(type_of(j), "response.done") == 0) {
            T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "status")->valuestring, "completed");
            done = 1;
        }
        cJSON_Delete(j);
    }
    T_EQ_INT(deltas, 4);
    char cancel[160];
    snprintf(cancel, sizeof cancel, "{\"type\":\"response.cancel\",\"response_id\":\"%s\"}", held);
    ws_send(fd, cancel);
    j = ws_event(fd);
    T_EQ_STR(type_of(j), "response.done");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "id")->valuestring, held);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "status")->valuestring, "cancelled");
    cJSON_Delete(j);
    T_EQ_INT(atomic_load(&st->be.cancels), c0 + 1);

    /* a large message (parsed on the threadpool) keeps its place: the small cancel sent right
     * behind it finds the response it created */
    {
        size_t big = 200000;
        char *msg = malloc(big + 256), *cn = "{\"type\":\"response.cancel\"}";
        int n = snprintf(msg, 256, "{\"type\":\"response.create\",\"event_id\":\"big\",\"response\":{\"messages\":[{\"role\":\"user\",\"content\":\"hold ");
        memset(msg + n, 'x', big);
        snprintf(msg + n + big, 256, "\"}]}}");
        size_t ml = strlen(msg);
        uint8_t *fr = malloc(ml + 64);
        size_t fl = ws_frame(fr, 1, msg, ml);
        fl += ws_frame(fr + fl, 1, cn, strlen(cn));
        send_all(fd, fr, fl);
        free(fr);
        free(msg);
        j = ws_event(fd);
        T_EQ_STR(type_of(j), "response.created");
        cJSON_Delete(j);
        int cancelled = 0, errors = 0;
        for (int k = 0; k < 4 && !cancelled; k++) {
            j = ws_event(fd);
            if (j && strcmp(type_of(j), "error") == 0) errors++;
            if (j && strcmp(type_of(j), "response.done") == 0)
                cancelled = !strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "status")->valuestring, "cancelled");
            cJSON_Delete(j);
        }
        T_CHECK(cancelled && errors == 0);
    }

    /* errors: bad parameter, unknown type, not JSON, unknown response id, too many responses */
    ws_send(fd, "{\"type\":\"response.create\",\"event_id\":\"e9\",\"response\":{\"temperature\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}}");
    j = ws_event(fd);
    T_EQ_STR(type_of(j), "error");
    cJSON *er = cJSON_GetObjectItem(j, "error");
    T_EQ_STR(cJSON_GetObjectItem(er, "param")->valuestring, "response.temperature");
    T_EQ_STR(cJSON_GetObjectItem(er, "event_id")->valuestring, "e9");
    cJSON_Delete(j);
    ws_send(fd, "{\"type\":\"session.update\"}");
    j = ws_event(fd);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring, "unknown_event_type");
    cJSON_Delete(j);
    ws_send(fd, "not json");
    j = ws_event(fd);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring, "invalid_json");
    cJSON_Delete(j);
    ws_send(fd, "{\"type\":\"response.cancel\",\"response_id\":\"resp_nope\"}");
    j = ws_event(fd);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring, "response_not_found");
    cJSON_Delete(j);
    for (int i = 0; i < 3; i++) {
        ws_send(fd, "{\"type\":\"response.create\",\"response\":{\"messages\":[{\"role\":\"user\",\"content\":\"hold\"}]}}");
        for (int k = 0; k < 2; k++) cJSON_Delete(ws_event(fd)); /* created + first delta */
    }
    ws_send(fd, "{\"type\":\"response.create\",\"response\":{\"messages\":[{\"role\":\"user\",\"content\":\"hold\"}]}}");
    j = ws_event(fd);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring, "too_many_responses");
    cJSON_Delete(j);
    T_EQ_INT(gw_app_active(st->app), 3);
    /* closing the socket cancels the three held responses */
    c0 = atomic_load(&st->be.cancels);
    close(fd);
    int ok = 0;
    for (int i = 0; i < 200 && !ok; i++) {
        cm_time_sleep_ms(5);
        ok = atomic_load(&st->be.cancels) == c0 + 3;
    }
    T_CHECK(ok);
    /* a socket that closes while its large message is on the threadpool: nothing is left behind
     * (the sanitizer build checks) and no response starts */
    fd = connect_port(port);
    send_all(fd, hs, strlen(hs));
    hn = 0;
    while (hn < sizeof head - 1 && recv(fd, head + hn, 1, 0) == 1) {
        hn++;
        if (hn >= 4 && memcmp(head + hn - 4, "\r\n\r\n", 4) == 0) break;
    }
    size_t big = 300000;
    char *msg = malloc(big + 256);
    int n = snprintf(msg, 256, "{\"type\":\"response.create\",\"response\":{\"messages\":[{\"role\":\"user\",\"content\":\"");
    memset(msg + n, 'y', big);
    snprintf(msg + n + big, 256, "\"}]}}");
    uint8_t *fr = malloc(strlen(msg) + 64);
    size_t fl = ws_frame(fr, 1, msg, strlen(msg));
    send_all(fd, fr, fl);
    close(fd);
    free(fr);
    free(msg);
    for (int i = 0; i < 100 && gw_app_active(st->app) != 0; i++) cm_time_sleep_ms(5);
}

int main(void) {
    cm_log_set_level(CM_LOG_LEVEL_ERROR);
    srv st;
    memset(&st, 0, sizeof st);
    pthread_create(&st.th, NULL, srv_main, &st);
    while (atomic_load(&st.ready) == 0) cm_time_sleep_ms(1);
    T_EQ_INT(atomic_load(&st.ready), 1);
    int port = gw_server_port(st.s);
    test_basic_routes(&st, port);
    test_completions(&st, port);
    test_chat_stream(&st, port);
    test_disconnect(&st, port);
    test_ws(&st, port);
    cm_time_sleep_ms(20);
    gw_server_stop_async(st.s);
    pthread_join(st.th, NULL);
    T_EQ_INT(gw_app_active(st.app), 0);
    T_EQ_INT(st.be.jobs == NULL, 1);
    gw_server_destroy(st.s);
    gw_app_destroy(st.app);
    uv_run(&st.loop, UV_RUN_DEFAULT);
    T_EQ_INT(uv_loop_close(&st.loop), 0);
    fake_free(&st.be);
    return t_done();
}
