/* test_gw_ws: WebSocket handshake (RFC 6455's example key), the frame parser (masked, fragmented,
 * interleaved control frames, every violation and its close code, any split of the input), frame
 * headers, and a live echo server spoken to through raw sockets (ping/pong, close handshake,
 * 1002/1003/1009, 1001 on shutdown, refused handshakes). */
#include "gateway/ws.h"

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

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "tests/unit/t.h"

/* ---- parser harness ----------------------------------------------------------------------- */

typedef struct ev {
    int opcode, code;
    char payload[2048];
    size_t len;
} ev;

typedef struct evs {
    ev e[32];
    int n;
} evs;

static int collect(void *ud, int opcode, const char *payload, size_t len, int code) {
    evs *v = ud;
    if (v->n < 32) {
        ev *e = &v->e[v->n++];
        e->opcode = opcode;
        e->code = code;
        e->len = len < sizeof e->payload ? len : sizeof e->payload;
        memcpy(e->payload, payload, e->len);
    }
    return 0;
}

/* Builds a client frame: masked with a fixed key unless mask == 0. */
static size_t frame(uint8_t *out, int fin, int rsv, int opcode, const void *payload, size_t len, int mask) {
    static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
    size_t o = 0;
    out[o++] = (uint8_t)((fin ? 0x80 : 0) | (rsv << 4) | opcode);
    uint8_t mb = mask ? 0x80 : 0;
    if (len < 126) out[o++] = mb | (uint8_t)len;
    else if (len < 65536) {
        out[o++] = mb | 126;
        out[o++] = (uint8_t)(len >> 8);
        out[o++] = (uint8_t)len;
    } else {
        out[o++] = mb | 127;
        for (int i = 0; i < 8; i++) out[o++] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
    }
    if (mask) {
        memcpy(out + o, key, 4);
        o += 4;
    }
    for (size_t i = 0; i < len; i++) out[o + i] = ((const uint8_t *)payload)[i] ^ (mask ? key[i & 3] : 0);
    return o + len;
}

/* Feeds buf in pieces of `step` bytes (0: all at once). Returns the last feed result. */
static int feed(gw_ws_parser *p, const uint8_t *buf, size_t len, size_t step, evs *v) {
    int r = 0;
    if (!step) step = len ? len : 1;
    for (size_t off = 0; off < len && r == 0; off += step) {
        size_t n = len - off < step ? len - off : step;
        r = gw_ws_parser_feed(p, (const char *)buf + off, n, NULL, collect, v);
    }
    return r;
}

static int violation(const uint8_t *buf, size_t len, size_t max, int *code) {
    gw_ws_parser *p;
    gw_ws_parser_create(max, 1, &p);
    evs v = {0};
    int r = feed(p, buf, len, 0, &v);
    *code = gw_ws_parser_error(p, NULL);
    /* sticky */
    if (r < 0 && gw_ws_parser_feed(p, "\x81\x80\0\0\0\0", 6, NULL, collect, &v) != -1) r = 99;
    gw_ws_parser_destroy(p);
    return r;
}

static void test_handshake_key(void) {
    char acc[29];
    gw_ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", acc); /* RFC 6455 section 1.3 */
    T_EQ_STR(acc, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    gw_ws_accept_key("x3JJHMbDL1EzLkh9GBhXDw==", acc); /* RFC 6455 section 4.2.2 example */
    T_EQ_STR(acc, "HSmrc0sMlYUkAGmm5OPpG2HaGWk=");

    /* handshake validation on parsed requests */
    struct {
        const char *req;
        int status;
    } cases[] = {
        {"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: "
         "dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", 0},
        {"GET /v1/ws HTTP/1.1\r\nUpgrade: WebSocket\r\nConnection: upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
         "Sec-WebSocket-Version: 13\r\n\r\n", 0},
        {"GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n", 400},
        {"GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: abc\r\nSec-WebSocket-Version: 13\r\n\r\n", 400},
        {"GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
         "Sec-WebSocket-Version: 8\r\n\r\n", 426},
        {"GET /v1/ws HTTP/1.1\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", 400},
        {"GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", 400},
        {"POST /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
         "Sec-WebSocket-Version: 13\r\nContent-Length: 0\r\n\r\n", 400},
        {"GET /v1/ws HTTP/1.0\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
         "Sec-WebSocket-Version: 13\r\n\r\n", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gw_http_parser *hp;
        gw_http_parser_create(4096, 0, &hp);
        size_t used;
        int r = gw_http_parser_feed(hp, cases[i].req, strlen(cases[i].req), &used);
        T_CHECKF(r == GW_PARSE_REQUEST, "case %zu: parse %d", i, r);
        const char *why;
        int st = gw_ws_handshake_check(gw_http_parser_req(hp), &why);
        T_CHECKF(st == cases[i].status, "case %zu: status %d (%s)", i, st, why ? why : "");
        gw_http_parser_destroy(hp);
    }
}

static void test_parser(void) {
    uint8_t buf[200000];
    size_t n;
    gw_ws_parser *p;
    evs v;

    /* RFC 6455 5.7: a single-frame masked text message "Hello" */
    static const uint8_t hello[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    for (size_t step = 0; step <= 3; step++) {
        gw_ws_parser_create(1 << 16, 1, &p);
        memset(&v, 0, sizeof v);
        T_EQ_INT(feed(p, hello, sizeof hello, step, &v), 0);
        T_EQ_INT(v.n, 1);
        T_EQ_INT(v.e[0].opcode, GW_WS_TEXT);
        T_CHECK(v.e[0].len == 5 && memcmp(v.e[0].payload, "Hello", 5) == 0);
        gw_ws_parser_destroy(p);
    }
    /* unmasked "Hello" from a client: 1002 */
    static const uint8_t hello_unmasked[] = {0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f};
    int code;
    T_EQ_INT(violation(hello_unmasked, sizeof hello_unmasked, 1 << 16, &code), -1);
    T_EQ_INT(code, 1002);
    /* ...which a parser not requiring masks accepts */
    gw_ws_parser_create(1 << 16, 0, &p);
    memset(&v, 0, sizeof v);
    T_EQ_INT(feed(p, hello_unmasked, sizeof hello_unmasked, 1, &v), 0);
    T_EQ_INT(v.n, 1);
    gw_ws_parser_destroy(p);

    /* fragmented "Hel" + "lo" with a ping and a pong between the fragments; fed in every split */
    n = frame(buf, 0, 0, GW_WS_TEXT, "Hel", 3, 1);
    n += frame(buf + n, 1, 0, GW_WS_PING, "pp", 2, 1);
    n += frame(buf + n, 1, 0, GW_WS_PONG, "", 0, 1);
    n += frame(buf + n, 0, 0, GW_WS_CONT, "", 0, 1);
    n += frame(buf + n, 1, 0, GW_WS_CONT, "lo", 2, 1);
    int all_ok = 1;
    for (size_t step = 0; step <= n; step++) {
        gw_ws_parser_create(1 << 16, 1, &p);
        memset(&v, 0, sizeof v);
        int r = feed(p, buf, n, step, &v);
        if (r != 0 || v.n != 3 || v.e[0].opcode != GW_WS_PING || v.e[0].len != 2 || v.e[1].opcode != GW_WS_PONG ||
            v.e[2].opcode != GW_WS_TEXT || v.e[2].len != 5 || memcmp(v.e[2].payload, "Hello", 5) != 0)
            all_ok = 0;
        gw_ws_parser_destroy(p);
    }
    T_CHECK(all_ok);

    /* an empty text message before any buffer exists (found by fuzz_ws) */
    gw_ws_parser_create(1 << 16, 1, &p);
    memset(&v, 0, sizeof v);
    n = frame(buf, 1, 0, GW_WS_TEXT, "", 0, 1);
    T_EQ_INT(feed(p, buf, n, 0, &v), 0);
    T_EQ_INT(v.n, 1);
    T_EQ_INT(v.e[0].len, 0);
    gw_ws_parser_destroy(p);

    /* 16-bit and 64-bit lengths */
    static char big[70000];
    memset(big, 'a', sizeof big);
    gw_ws_parser_create(1 << 20, 1, &p);
    memset(&v, 0, sizeof v);
    n = frame(buf, 1, 0, GW_WS_TEXT, big, 300, 1);
    n += frame(buf + n, 1, 0, GW_WS_BINARY, big, 70000, 1);
    T_EQ_INT(feed(p, buf, n, 4093, &v), 0);
    T_EQ_INT(v.n, 2);
    T_EQ_INT(v.e[0].len, 300 < sizeof v.e[0].payload ? 300 : sizeof v.e[0].payload);
    T_EQ_INT(v.e[1].opcode, GW_WS_BINARY);
    gw_ws_parser_destroy(p);

    /* message too big: one frame, and across fragments */
    n = frame(buf, 1, 0, GW_WS_TEXT, big, 1025, 1);
    T_EQ_INT(violation(buf, n, 1024, &code), -1);
    T_EQ_INT(code, 1009);
    n = frame(buf, 0, 0, GW_WS_TEXT, big, 600, 1);
    n += frame(buf + n, 1, 0, GW_WS_CONT, big, 600, 1);
    T_EQ_INT(violation(buf, n, 1024, &code), -1);
    T_EQ_INT(code, 1009);
    /* exactly the limit is fine */
    n = frame(buf, 0, 0, GW_WS_TEXT, big, 512, 1);
    n += frame(buf + n, 1, 0, GW_WS_CONT, big, 512, 1);
    T_EQ_INT(violation(buf, n, 1024, &code), 0);

    /* protocol errors */
    n = frame(buf, 1, 0, GW_WS_PING, big, 126, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* control frame > 125 */
    n = frame(buf, 0, 0, GW_WS_PING, "x", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* fragmented control */
    n = frame(buf, 1, 4, GW_WS_TEXT, "x", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* RSV1 */
    n = frame(buf, 1, 0, 0x3, "x", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* reserved data opcode */
    n = frame(buf, 1, 0, 0xB, "x", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* reserved control opcode */
    n = frame(buf, 1, 0, GW_WS_CONT, "x", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* continuation without a message */
    n = frame(buf, 0, 0, GW_WS_TEXT, "x", 1, 1);
    n += frame(buf + n, 1, 0, GW_WS_TEXT, "y", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* new message inside a fragmented one */
    static const uint8_t nonmin16[] = {0x81, 0xFE, 0x00, 0x05, 0, 0, 0, 0, 'a', 'b', 'c', 'd', 'e'};
    T_EQ_INT(violation(nonmin16, sizeof nonmin16, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);
    static const uint8_t topbit[] = {0x81, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    T_EQ_INT(violation(topbit, sizeof topbit, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);
    /* invalid UTF-8 in a text message (also split across fragments), and in a close reason */
    n = frame(buf, 1, 0, GW_WS_TEXT, "a\xC3\x28", 3, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1007);
    n = frame(buf, 1, 0, GW_WS_TEXT, "\xED\xA0\x80", 3, 1); /* a surrogate */
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1007);
    n = frame(buf, 0, 0, GW_WS_TEXT, "\xE2\x82", 2, 1); /* a character split across fragments is fine */
    n += frame(buf + n, 1, 0, GW_WS_CONT, "\xAC", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), 0);
    /* close frames */
    gw_ws_parser_create(1 << 16, 1, &p);
    memset(&v, 0, sizeof v);
    n = frame(buf, 1, 0, GW_WS_CLOSE, "\x03\xE8" "bye", 5, 1);
    n += frame(buf + n, 1, 0, GW_WS_CLOSE, "", 0, 1);
    T_EQ_INT(feed(p, buf, n, 0, &v), 0);
    T_EQ_INT(v.n, 2);
    T_EQ_INT(v.e[0].opcode, GW_WS_CLOSE);
    T_EQ_INT(v.e[0].code, 1000);
    T_CHECK(v.e[0].len == 3 && memcmp(v.e[0].payload, "bye", 3) == 0);
    T_EQ_INT(v.e[1].code, GW_WS_NO_STATUS);
    gw_ws_parser_destroy(p);
    n = frame(buf, 1, 0, GW_WS_CLOSE, "\x03", 1, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* 1-byte close payload */
    n = frame(buf, 1, 0, GW_WS_CLOSE, "\x03\xED", 2, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1002);                                   /* 1005 must not be sent */
    n = frame(buf, 1, 0, GW_WS_CLOSE, "\x0B\xB8", 2, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), 0);          /* 3000: application code */
    n = frame(buf, 1, 0, GW_WS_CLOSE, "\x03\xE8\xFF", 3, 1);
    T_EQ_INT(violation(buf, n, 1 << 20, &code), -1);
    T_EQ_INT(code, 1007);

    /* server frame headers */
    uint8_t h[10];
    T_EQ_INT(gw_ws_frame_header(GW_WS_TEXT, 5, h), 2);
    T_CHECK(h[0] == 0x81 && h[1] == 5);
    T_EQ_INT(gw_ws_frame_header(GW_WS_TEXT, 200, h), 4);
    T_CHECK(h[1] == 126 && h[2] == 0 && h[3] == 200);
    T_EQ_INT(gw_ws_frame_header(GW_WS_BINARY, 70000, h), 10);
    T_CHECK(h[0] == 0x82 && h[1] == 127 && h[7] == 0x01 && h[8] == 0x11 && h[9] == 0x70);
    T_EQ_INT(gw_ws_frame_header(GW_WS_CLOSE, 125, h), 2);
    T_CHECK(h[0] == 0x88 && h[1] == 125);

    /* UTF-8 validation */
    T_CHECK(gw_ws_utf8_valid("h\xC3\xA9llo \xF0\x9F\x98\x80", 11));
    T_CHECK(!gw_ws_utf8_valid("\xC0\xAF", 2));         /* overlong */
    T_CHECK(!gw_ws_utf8_valid("\xF4\x90\x80\x80", 4)); /* past U+10FFFF */
    T_CHECK(!gw_ws_utf8_valid("\xE2\x82", 2));         /* truncated */
}

/* ---- live server -------------------------------------------------------------------------- */

static atomic_int closes;

static void echo_msg(gw_ws *ws, void *ud, const char *text, size_t len) {
    if (len == 5 && memcmp(text, "close", 5) == 0) {
        gw_ws_close(ws, GW_WS_POLICY, "asked to");
        return;
    }
    if (len == 4 && memcmp(text, "busy", 4) == 0) gw_ws_set_busy(ws, 1);
    if (len == 4 && memcmp(text, "free", 4) == 0) gw_ws_set_busy(ws, 0);
    gw_ws_send_text(ws, text, len);
}

static void echo_close(gw_ws *ws, void *ud) { atomic_fetch_add(&closes, 1); }

static const gw_ws_ops echo_ops = {echo_msg, echo_close};

static void handler(gw_req *r, void *ud) {
    if (strcmp(gw_req_path(r), "/v1/ws") == 0) {
        gw_ws *ws;
        /* liveness from the query: "ping,idle,message" in ms (none: off) */
        unsigned ping = 0, idle = 0, msg = 0;
        sscanf(gw_req_query(r), "%u,%u,%u", &ping, &idle, &msg);
        if (gw_ws_upgrade(r, ping || idle || msg ? 1u << 20 : 4096, &echo_ops, NULL, &ws) == 0)
            gw_ws_set_liveness(ws, ping, idle, msg);
        return;
    }
    gw_resp_send(r, 404, "text/plain", "no\n", 3, NULL);
}

typedef struct srv {
    pthread_t th;
    uv_loop_t loop;
    gw_server *s;
    atomic_int ready;
    int max_conns;      /* 0: default */
    size_t max_buffered; /* 0: default */
} srv;

static void *srv_main(void *arg) {
    srv *st = arg;
    gw_http_cfg cfg;
    gw_http_cfg_default(&cfg);
    cfg.port = 0;
    cfg.handler = handler;
    cfg.write_queue_cap = 1 << 20;
    if (st->max_conns) cfg.max_conns = st->max_conns;
    if (st->max_buffered) cfg.max_buffered = st->max_buffered;
    uv_loop_init(&st->loop);
    if (gw_server_create(&st->loop, &cfg, &st->s)) {
        atomic_store(&st->ready, -1);
        return NULL;
    }
    atomic_store(&st->ready, 1);
    uv_run(&st->loop, UV_RUN_DEFAULT);
    return NULL;
}

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

/* Opens a WebSocket (query: the liveness "ping,idle,message"); returns the fd or -1. The 101
 * response is checked. */
static int ws_open_q(int port, const char *query) {
    int fd = connect_port(port);
    char req[512];
    snprintf(req, sizeof req, "GET /v1/ws?%s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", query);
    send_all(fd, req, strlen(req));
    char head[1024];
    size_t n = 0;
    while (n < sizeof head - 1) {
        if (recv(fd, head + n, 1, 0) != 1) break;
        n++;
        if (n >= 4 && memcmp(head + n - 4, "\r\n\r\n", 4) == 0) break;
    }
    head[n] = 0;
    T_CHECKF(strncmp(head, "HTTP/1.1 101 Switching Protocols\r\n", 34) == 0, "%s", head);
    T_CHECK(strstr(head, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n") != NULL);
    T_CHECK(strstr(head, "Upgrade: websocket\r\n") != NULL);
    return fd;
}

static int ws_open(int port) { return ws_open_q(port, ""); }

/* Reads one server frame; returns opcode or -1. Checks it is unmasked and final. */
static int read_frame(int fd, char *payload, size_t cap, size_t *len) {
    uint8_t h[2];
    if (recv_n(fd, h, 2)) return -1;
    T_CHECK((h[1] & 0x80) == 0);
    T_CHECK((h[0] & 0x80) != 0);
    uint64_t n = h[1] & 0x7F;
    if (n == 126) {
        uint8_t e[2];
        if (recv_n(fd, e, 2)) return -1;
        n = (uint64_t)e[0] << 8 | e[1];
    } else if (n == 127) {
        uint8_t e[8];
        if (recv_n(fd, e, 8)) return -1;
        n = 0;
        for (int i = 0; i < 8; i++) n = n << 8 | e[i];
    }
    if (n > cap) return -1;
    if (recv_n(fd, payload, (size_t)n)) return -1;
    *len = (size_t)n;
    return h[0] & 0x0F;
}

static int eof_within(int fd, int ms) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    double t0 = cm_time_s();
    while ((cm_time_s() - t0) * 1000 < ms) {
        if (poll(&pf, 1, 20) > 0) {
            char b[256];
            ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN)) return 1;
        }
    }
    return 0;
}

static char close_reason[128];

static void expect_close(int fd, int want_code) {
    char pl[256];
    size_t n = 0;
    int op = read_frame(fd, pl, sizeof pl, &n);
    T_EQ_INT(op, GW_WS_CLOSE);
    int code = n >= 2 ? ((uint8_t)pl[0] << 8 | (uint8_t)pl[1]) : GW_WS_NO_STATUS;
    T_EQ_INT(code, want_code);
    snprintf(close_reason, sizeof close_reason, "%.*s", n > 2 ? (int)n - 2 : 0, pl + 2);
}

/* Liveness (ping, idle, message timeouts), eviction at the connection cap, the buffered-bytes cap. */
static void test_liveness(void) {
    srv st = {0};
    st.max_conns = 2;
    st.max_buffered = 64 << 10;
    pthread_create(&st.th, NULL, srv_main, &st);
    while (atomic_load(&st.ready) == 0) cm_time_sleep_ms(1);
    int port = gw_server_port(st.s);
    uint8_t buf[4096];
    char pl[256];
    size_t n, len;

    /* a ping after 200 ms of silence; answered, the connection stays; unanswered, it closes */
    int fd = ws_open_q(port, "200,0,0");
    double t0 = cm_time_s();
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_PING);
    double dt = cm_time_s() - t0;
    T_CHECKF(dt > 0.15 && dt < 0.8, "ping after %.3f s", dt);
    n = frame(buf, 1, 0, GW_WS_PONG, pl, len, 1);
    send_all(fd, buf, n);
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_PING); /* the next one, unanswered */
    t0 = cm_time_s();
    expect_close(fd, GW_WS_GOING_AWAY);
    T_EQ_STR(close_reason, "ping timeout");
    dt = cm_time_s() - t0;
    T_CHECKF(dt > 0.15 && dt < 0.8, "closed %.3f s after the unanswered ping", dt);
    close(fd);

    /* idle: closed after 300 ms without a message, but not while the application is busy */
    fd = ws_open_q(port, "0,300,0");
    n = frame(buf, 1, 0, GW_WS_TEXT, "busy", 4, 1);
    send_all(fd, buf, n);
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_TEXT);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    T_EQ_INT(poll(&pf, 1, 700), 0); /* busy: nothing comes */
    n = frame(buf, 1, 0, GW_WS_TEXT, "free", 4, 1);
    send_all(fd, buf, n);
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_TEXT);
    t0 = cm_time_s();
    expect_close(fd, GW_WS_GOING_AWAY);
    T_EQ_STR(close_reason, "idle timeout");
    dt = cm_time_s() - t0;
    T_CHECKF(dt > 0.2 && dt < 0.9, "idle close after %.3f s", dt);
    close(fd);

    /* a message that trickles (its first fragment, then nothing) is cut at 300 ms */
    fd = ws_open_q(port, "0,0,300");
    n = frame(buf, 0, 0, GW_WS_TEXT, "ab", 2, 1);
    send_all(fd, buf, n);
    t0 = cm_time_s();
    expect_close(fd, GW_WS_POLICY);
    T_EQ_STR(close_reason, "message timeout");
    dt = cm_time_s() - t0;
    T_CHECKF(dt > 0.2 && dt < 0.9, "message timeout after %.3f s", dt);
    close(fd);

    /* a message larger than what the server may buffer (64 KiB) is refused with 1013 */
    fd = ws_open_q(port, "0,0,5000");
    uint8_t hdr[14] = {0x81, 0x80 | 127, 0, 0, 0, 0, 0, 0x01, 0x86, 0xA0, 1, 2, 3, 4}; /* 100000 bytes announced */
    send_all(fd, hdr, sizeof hdr);
    expect_close(fd, GW_WS_TRY_AGAIN);
    close(fd);
    for (int i = 0; i < 100; i++) { /* both slots free again */
        gw_server_stats ss;
        gw_server_stats_get(st.s, &ss);
        if (ss.conns_open == 0) break;
        cm_time_sleep_ms(10);
    }

    /* the cap (2): an idle WebSocket makes room for a new connection (1013 "reconnect later");
     * a busy one is kept */
    int idle_ws = ws_open_q(port, "0,0,0");
    int busy_ws = ws_open_q(port, "0,0,0");
    n = frame(buf, 1, 0, GW_WS_TEXT, "busy", 4, 1);
    send_all(busy_ws, buf, n);
    T_EQ_INT(read_frame(busy_ws, pl, sizeof pl, &len), GW_WS_TEXT);
    int c = connect_port(port);
    send_all(c, "GET /x HTTP/1.1\r\n\r\n", 19);
    char resp[256] = {0};
    T_CHECK(recv(c, resp, sizeof resp - 1, 0) > 0 && strncmp(resp, "HTTP/1.1 404", 12) == 0);
    expect_close(idle_ws, GW_WS_TRY_AGAIN);
    close(c);
    n = frame(buf, 1, 0, GW_WS_TEXT, "still", 5, 1);
    send_all(busy_ws, buf, n);
    T_EQ_INT(read_frame(busy_ws, pl, sizeof pl, &len), GW_WS_TEXT);
    T_CHECK(len == 5 && memcmp(pl, "still", 5) == 0);
    close(idle_ws);
    close(busy_ws);
    gw_server_stop_async(st.s);
    pthread_join(st.th, NULL);
    gw_server_destroy(st.s);
    uv_loop_close(&st.loop);
}

static void test_live(void) {
    srv st = {0};
    pthread_create(&st.th, NULL, srv_main, &st);
    while (atomic_load(&st.ready) == 0) cm_time_sleep_ms(1);
    T_EQ_INT(atomic_load(&st.ready), 1);
    int port = gw_server_port(st.s);
    uint8_t buf[70000];
    char pl[8192];
    size_t n, len;

    /* echo, ping/pong, fragmented message, then a normal close handshake */
    int fd = ws_open(port);
    n = frame(buf, 1, 0, GW_WS_TEXT, "{\"type\":\"x\"}", 12, 1);
    send_all(fd, buf, n);
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_TEXT);
    T_CHECK(len == 12 && memcmp(pl, "{\"type\":\"x\"}", 12) == 0);
    n = frame(buf, 1, 0, GW_WS_PING, "hb", 2, 1);
    send_all(fd, buf, n);
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_PONG);
    T_CHECK(len == 2 && memcmp(pl, "hb", 2) == 0);
    n = frame(buf, 0, 0, GW_WS_TEXT, "ab", 2, 1);
    n += frame(buf + n, 1, 0, GW_WS_PING, "", 0, 1);
    n += frame(buf + n, 1, 0, GW_WS_CONT, "cd", 2, 1);
    send_all(fd, buf, n);
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_PONG); /* the interleaved ping first */
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_TEXT);
    T_CHECK(len == 4 && memcmp(pl, "abcd", 4) == 0);
    /* a 300-byte message needs a 16-bit length in the echo */
    static char m300[300];
    memset(m300, 'q', sizeof m300);
    n = frame(buf, 1, 0, GW_WS_TEXT, m300, 300, 1);
    send_all(fd, buf, n);
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_TEXT);
    T_EQ_INT(len, 300);
    int c0 = atomic_load(&closes);
    n = frame(buf, 1, 0, GW_WS_CLOSE, "\x03\xE8", 2, 1);
    send_all(fd, buf, n);
    expect_close(fd, 1000);
    T_CHECK(eof_within(fd, 3000));
    close(fd);
    for (int i = 0; i < 200 && atomic_load(&closes) == c0; i++) cm_time_sleep_ms(5);
    T_EQ_INT(atomic_load(&closes), c0 + 1);

    /* the server closes on request of the application (1008) */
    fd = ws_open(port);
    n = frame(buf, 1, 0, GW_WS_TEXT, "close", 5, 1);
    send_all(fd, buf, n);
    expect_close(fd, 1008);
    T_CHECK(eof_within(fd, 3000));
    close(fd);

    /* violations: unmasked (1002), binary (1003), too big (1009), bad UTF-8 (1007) */
    struct {
        int mask, opcode;
        size_t len;
        const char *data;
        int code;
    } bad[] = {{0, GW_WS_TEXT, 2, "hi", 1002}, {1, GW_WS_BINARY, 2, "hi", 1003}, {1, GW_WS_TEXT, 5000, NULL, 1009},
               {1, GW_WS_TEXT, 2, "\xC3\x28", 1007}};
    static char filler[5000];
    memset(filler, 'z', sizeof filler);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fd = ws_open(port);
        n = frame(buf, 1, 0, bad[i].opcode, bad[i].data ? bad[i].data : filler, bad[i].len, bad[i].mask);
        send_all(fd, buf, n);
        expect_close(fd, bad[i].code);
        T_CHECK(eof_within(fd, 3000));
        close(fd);
    }

    /* bytes sent together with the handshake are not lost */
    fd = connect_port(port);
    char req[512];
    int rl = snprintf(req, sizeof req,
                      "GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "
                      "dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    memcpy(buf, req, (size_t)rl);
    n = (size_t)rl + frame(buf + rl, 1, 0, GW_WS_TEXT, "early", 5, 1);
    send_all(fd, buf, n);
    char head[512];
    size_t hn = 0;
    while (hn < sizeof head - 1 && recv(fd, head + hn, 1, 0) == 1) {
        hn++;
        if (hn >= 4 && memcmp(head + hn - 4, "\r\n\r\n", 4) == 0) break;
    }
    T_EQ_INT(read_frame(fd, pl, sizeof pl, &len), GW_WS_TEXT);
    T_CHECK(len == 5 && memcmp(pl, "early", 5) == 0);

    /* refused handshakes */
    int fd2 = connect_port(port);
    const char *v8 = "GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "
                     "dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n";
    send_all(fd2, v8, strlen(v8));
    char resp[1024] = {0};
    ssize_t got = recv(fd2, resp, sizeof resp - 1, 0);
    T_CHECK(got > 0 && strncmp(resp, "HTTP/1.1 426 ", 13) == 0 && strstr(resp, "Sec-WebSocket-Version: 13\r\n"));
    const char *nokey = "GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n";
    send_all(fd2, nokey, strlen(nokey));
    memset(resp, 0, sizeof resp);
    got = recv(fd2, resp, sizeof resp - 1, 0);
    T_CHECK(got > 0 && strncmp(resp, "HTTP/1.1 400 ", 13) == 0);
    close(fd2);

    /* shutdown: the open socket gets 1001 */
    gw_server_stop_async(st.s);
    expect_close(fd, 1001);
    n = frame(buf, 1, 0, GW_WS_CLOSE, "\x03\xE9", 2, 1);
    send_all(fd, buf, n);
    T_CHECK(eof_within(fd, 3000));
    close(fd);
    pthread_join(st.th, NULL);
    T_CHECK(gw_server_closed(st.s));
    gw_server_destroy(st.s);
    uv_loop_close(&st.loop);
}

int main(void) {
    cm_log_set_level(CM_LOG_LEVEL_ERROR);
    test_handshake_key();
    test_parser();
    test_live();
    test_liveness();
    return t_done();
}
