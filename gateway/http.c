/* http: listener, connections, timeouts, response framing and graceful shutdown.
 * The request grammar lives in http_parse.c; this file moves bytes. */
#include "gateway/http.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <llhttp.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/gw_internal.h"

#define IN_CAP        (64u << 10) /* unparsed input kept per connection */
#define LINGER_MS     2000u       /* after shutting our side: wait this long for the client's EOF */
#define REJECT_MAX    64          /* connections being answered 503 at once; beyond: plain close */
#define PROBE_MAX     64          /* connections beyond max_conns served for a probe path at once */
#define PROBE_HDR_MS  2000u       /* such a connection's header timeout */

enum timer_kind { T_NONE = 0, T_HEADER, T_IDLE, T_BODY, T_LINGER, T_TICK };
enum lru_kind { L_NONE = 0, L_WAITING, L_UPGRADED, L_N }; /* idle lists, evicted in this order */

struct gw_conn {
    uv_tcp_t   tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    gw_server *srv;
    gw_conn   *prev, *next;
    gw_conn   *lru_prev, *lru_next; /* in the server's idle list `lru` */
    int lru;            /* enum lru_kind */
    int open_handles;   /* tcp + timer until both close callbacks ran */
    int closing;        /* uv_close issued */
    int lingering;      /* our write side is shut (or being shut); input is discarded */
    int rejecting;      /* answered 503 at once (over a cap) */
    int probe_only;     /* beyond max_conns: served for a probe path only */
    int counted;        /* holds a slot of max_conns (cleared when evicted: the slot is free at once) */
    int reading;
    int in_flight;      /* a request is with the handler, its response not ended */
    int in_process;
    int early;          /* the request is with on_headers (or held by it): its body is unread */
    int held;           /* on_headers held it: reading stopped until gw_req_resume */
    int parse_pending;  /* the parser has work without new bytes (after GW_PARSE_HEADERS) */
    int upgraded;
    int eof;            /* the client shut its side */
    int timer_kind;
    uint64_t body_deadline; /* uv_now by which the current body must be complete */
    size_t charged;     /* bytes counted toward max_buffered */
    char *in;           /* unparsed input in[in_off, in_len) */
    size_t in_off, in_len;
    gw_http_parser *parser;
    gw_req *req;
    const gw_upgrade_ops *up_ops;
    void *up_ud;
    uint32_t tick_ms;
    uint8_t addr[16];   /* the client's address key: IPv4 (mapped) or an IPv6 /64 */
    int addr_counted;   /* counted in the per-address table */
    int loopback;
    char peer[64];
    char ip[48];
};

struct addr_slot {
    uint8_t  key[16];
    uint32_t n;         /* 0: empty */
};

struct gw_server {
    uv_loop_t   *loop;
    gw_http_cfg  cfg;
    char         host[64];
    int          port;
    uv_tcp_t     listener;
    uv_async_t   async;
    uv_timer_t   drain;
    uv_signal_t  sig[2];
    int          sig_on;
    int          handles_open;
    int          listener_open;
    int          draining, finishing, closed, deadline_passed, handles_closing;
    int          n_conns, n_rejecting, n_probe;
    gw_conn     *conns;
    gw_conn     *lru_head[L_N], *lru_tail[L_N];
    struct addr_slot *addrs;    /* per-address counts, open addressing */
    uint32_t     n_addr_slots;  /* power of two */
    size_t       buffered;      /* request bytes charged (max_buffered) */
    void       (*on_closed)(gw_server *s, void *ud);
    void        *on_closed_ud;
    _Atomic uint64_t st_open, st_total, st_rejected, st_requests, st_errors, st_slow, st_evicted, st_probes, st_over,
        st_buffered;
    time_t       date_sec;
    char         date[40];
};

struct wreq {
    uv_write_t w;
    gw_conn   *c;
    size_t     len;
    char       data[];
};

static void conn_abort(gw_conn *c);
static void conn_linger(gw_conn *c);
static void conn_process(gw_conn *c);
static void server_maybe_finish(gw_server *s);

/* ---- small helpers ------------------------------------------------------------------------ */

const char *gw_http_status_text(int status) {
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* IMF-fixdate, cached per second; independent of the locale. */
static const char *http_date(gw_server *s) {
    static const char *wd[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *mo[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != s->date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        snprintf(s->date, sizeof s->date, "%s, %02d %s %04d %02d:%02d:%02d GMT", wd[tm.tm_wday], tm.tm_mday,
                 mo[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        s->date_sec = now;
    }
    return s->date;
}

/* ---- idle connections (evicted least recently active first) ------------------------------ */

static void lru_remove(gw_conn *c) {
    gw_server *s = c->srv;
    if (!c->lru) return;
    if (c->lru_prev) c->lru_prev->lru_next = c->lru_next;
    else s->lru_head[c->lru] = c->lru_next;
    if (c->lru_next) c->lru_next->lru_prev = c->lru_prev;
    else s->lru_tail[c->lru] = c->lru_prev;
    c->lru_prev = c->lru_next = NULL;
    c->lru = L_NONE;
}

static void lru_add(gw_conn *c, int kind) {
    gw_server *s = c->srv;
    if (c->lru == kind) return;
    lru_remove(c);
    if (!c->counted || c->closing || c->lingering) return;
    c->lru = kind;
    c->lru_prev = s->lru_tail[kind];
    if (s->lru_tail[kind]) s->lru_tail[kind]->lru_next = c;
    else s->lru_head[kind] = c;
    s->lru_tail[kind] = c;
}

/* Gives up c's slot of max_conns at once (its handles close later). */
static void uncount(gw_conn *c) {
    gw_server *s = c->srv;
    if (!c->counted) return;
    c->counted = 0;
    s->n_conns--;
    atomic_fetch_sub(&s->st_open, 1);
}

/* ---- client addresses --------------------------------------------------------------------- */

static uint32_t addr_hash(const uint8_t k[16]) {
    uint64_t a, b;
    memcpy(&a, k, 8);
    memcpy(&b, k + 8, 8);
    uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(z >> 32);
}

static struct addr_slot *addr_find(gw_server *s, const uint8_t k[16], int add) {
    uint32_t m = s->n_addr_slots - 1;
    for (uint32_t i = addr_hash(k) & m, n = 0; n <= m; n++, i = (i + 1) & m) {
        struct addr_slot *a = &s->addrs[i];
        if (a->n && memcmp(a->key, k, 16) == 0) return a;
        if (!a->n) {
            if (!add) return NULL;
            memcpy(a->key, k, 16);
            return a;
        }
    }
    return NULL;
}

static void addr_release(gw_conn *c) {
    gw_server *s = c->srv;
    if (!c->addr_counted) return;
    c->addr_counted = 0;
    struct addr_slot *a = addr_find(s, c->addr, 0);
    if (!a || --a->n) return;
    /* emptied: move the rest of its probe run back (linear-probing deletion) */
    uint32_t m = s->n_addr_slots - 1, i = (uint32_t)(a - s->addrs);
    for (uint32_t j = (i + 1) & m; s->addrs[j].n; j = (j + 1) & m) {
        struct addr_slot x = s->addrs[j];
        s->addrs[j].n = 0;
        struct addr_slot *y = addr_find(s, x.key, 1);
        *y = x;
    }
}

/* The client's address as a key (IPv4 as v4-mapped; IPv6 cut to its /64: one site or host holds
 * a whole /64) and its text; loopback noted. */
static void peer_name(gw_conn *c) {
    struct sockaddr_storage ss;
    int len = sizeof ss;
    int port = 0;
    snprintf(c->ip, sizeof c->ip, "?");
    memset(c->addr, 0, sizeof c->addr);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            uv_ip4_name(a, c->ip, sizeof c->ip);
            port = ntohs(a->sin_port);
            c->addr[10] = c->addr[11] = 0xff;
            memcpy(c->addr + 12, &a->sin_addr, 4);
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, c->ip, sizeof c->ip);
            port = ntohs(a->sin6_port);
            memcpy(c->addr, &a->sin6_addr, 16);
            static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
            if (memcmp(c->addr, mapped, 12) != 0) memset(c->addr + 8, 0, 8); /* the /64 */
        }
        static const uint8_t lo6[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
        c->loopback = (c->addr[10] == 0xff && c->addr[11] == 0xff && c->addr[12] == 127 && !memcmp(c->addr, lo6, 10)) ||
                      (ss.ss_family == AF_INET6 && !memcmp(&((const struct sockaddr_in6 *)&ss)->sin6_addr, lo6, 16));
    }
    snprintf(c->peer, sizeof c->peer, "%s:%d", c->ip, port);
}

/* ---- buffered request bytes --------------------------------------------------------------- */

/* Counts c's buffered bytes as `bytes` from now on. Returns 0, or CM_EFULL (nothing changed)
 * when that passes max_buffered (and grows c's share: shrinking always works). */
static int charge(gw_conn *c, size_t bytes) {
    gw_server *s = c->srv;
    if (bytes > c->charged && s->buffered - c->charged + bytes > s->cfg.max_buffered) return CM_EFULL;
    s->buffered = s->buffered - c->charged + bytes;
    c->charged = bytes;
    atomic_store(&s->st_buffered, (uint64_t)s->buffered);
    return 0;
}

int gw_conn_charge(gw_conn *c, size_t bytes) {
    int e = charge(c, bytes);
    if (e) atomic_fetch_add(&c->srv->st_over, 1);
    return e;
}

void gw_server_uncharge(gw_server *s, size_t n) {
    s->buffered = n < s->buffered ? s->buffered - n : 0;
    atomic_store(&s->st_buffered, (uint64_t)s->buffered);
}

static void on_timer(uv_timer_t *t);

static void timer_arm(gw_conn *c, int kind) {
    uint64_t ms = 0, repeat = 0;
    const gw_http_cfg *cfg = &c->srv->cfg;
    if (c->closing) return;
    if (kind == T_HEADER && c->timer_kind == T_HEADER) return; /* counted from the first byte */
    switch (kind) {
    case T_HEADER: ms = c->probe_only && cfg->header_timeout_ms > PROBE_HDR_MS ? PROBE_HDR_MS : cfg->header_timeout_ms; break;
    case T_IDLE: ms = cfg->idle_timeout_ms; break;
    case T_BODY: { /* the next pause, but never past the whole body's deadline */
        uint64_t now = uv_now(c->srv->loop);
        ms = cfg->body_idle_ms;
        if (c->body_deadline && c->body_deadline < now + ms) ms = c->body_deadline > now ? c->body_deadline - now : 1;
        break;
    }
    case T_LINGER: ms = LINGER_MS; break;
    case T_TICK: ms = repeat = c->tick_ms; break;
    default: uv_timer_stop(&c->timer); c->timer_kind = T_NONE; return;
    }
    c->timer_kind = kind;
    uv_timer_start(&c->timer, on_timer, ms, repeat);
}

/* ---- writing ------------------------------------------------------------------------------ */

static void on_write(uv_write_t *w, int status) {
    struct wreq *wr = (struct wreq *)w;
    gw_conn *c = wr->c;
    free(wr);
    if (status < 0 && !c->closing) {
        CM_LOG_DEBUG("gw", "write failed", "peer=%s err=%s", c->peer, uv_strerror(status));
        conn_abort(c);
    }
}

static struct wreq *wreq_new(gw_conn *c, size_t len) {
    struct wreq *wr = malloc(sizeof *wr + len);
    if (!wr) return NULL;
    wr->c = c;
    wr->len = len;
    return wr;
}

static int wreq_submit(gw_conn *c, struct wreq *wr) {
    if (c->closing || wr->len == 0) {
        free(wr);
        return c->closing ? CM_ENET : 0;
    }
    uv_buf_t b = uv_buf_init(wr->data, (unsigned)wr->len);
    int e = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (e) {
        free(wr);
        conn_abort(c);
        return CM_ENET;
    }
    return 0;
}

static int conn_write_copy(gw_conn *c, const char *a, size_t alen, const char *b, size_t blen) {
    struct wreq *wr = wreq_new(c, alen + blen);
    if (!wr) return CM_ENOMEM;
    if (alen) memcpy(wr->data, a, alen);
    if (blen) memcpy(wr->data + alen, b, blen);
    return wreq_submit(c, wr);
}

/* ---- closing ------------------------------------------------------------------------------ */

static void conn_free(gw_conn *c) {
    gw_server *s = c->srv;
    if (c->in_flight && c->req && c->req->abort_cb) {
        void (*cb)(gw_req *, void *) = c->req->abort_cb;
        c->req->abort_cb = NULL;
        c->in_flight = 0;
        cb(c->req, c->req->abort_ud);
    }
    if (c->upgraded && c->up_ops && c->up_ops->on_close) c->up_ops->on_close(c, c->up_ud);
    if (c->prev) c->prev->next = c->next;
    else if (s->conns == c) s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    if (c->rejecting) s->n_rejecting--;
    if (c->probe_only) s->n_probe--;
    lru_remove(c);
    uncount(c);
    addr_release(c);
    charge(c, 0);
    gw_http_parser_destroy(c->parser);
    free(c->in);
    free(c);
    server_maybe_finish(s);
}

static void on_conn_handle_closed(uv_handle_t *h) {
    gw_conn *c = h->data;
    if (--c->open_handles == 0) conn_free(c);
}

static void conn_abort(gw_conn *c) {
    if (c->closing) return;
    c->closing = 1;
    c->reading = 0;
    lru_remove(c);
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
    gw_conn *c = req->data;
    if (c->closing) return;
    if (status < 0 || c->eof) {
        conn_abort(c);
        return;
    }
    timer_arm(c, T_LINGER);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

static void read_start(gw_conn *c) {
    if (c->reading || c->closing) return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = 1;
}

static void read_stop(gw_conn *c) {
    if (!c->reading || c->closing) return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
}

/* Shuts our side after the queued writes (uv_shutdown waits for them), then discards input until
 * the client closes or LINGER_MS pass: closing with unread input would reset the connection and
 * could destroy the response before the client read it. */
static void conn_linger(gw_conn *c) {
    if (c->closing || c->lingering) return;
    c->lingering = 1;
    lru_remove(c);
    c->in_off = c->in_len = 0;
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown)) {
        conn_abort(c);
        return;
    }
    timer_arm(c, T_NONE);
    if (!c->eof) read_start(c);
}

/* The server answers a protocol error itself and closes. For 503, reason is the message (and
 * the client is told to retry after a second). */
static void conn_error(gw_conn *c, int status, const char *reason) {
    gw_server *s = c->srv;
    atomic_fetch_add(&s->st_errors, 1);
    CM_LOG_DEBUG("gw", "request refused", "peer=%s status=%d reason=\"%s\"", c->peer, status, reason ? reason : "");
    char body[384], head[512];
    int bl = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%s}}\n",
                      status == 408   ? "request timeout"
                      : status == 413 ? "request body too large"
                      : status == 414 ? "request target too long"
                      : status == 417 ? "unsupported expectation"
                      : status == 431 ? "request header fields too large"
                      : status == 505 ? "HTTP version not supported"
                      : status == 503 ? (reason ? reason : "the server is busy")
                                      : "malformed HTTP request",
                      status >= 500 ? "server_error" : "invalid_request_error",
                      status == 503 ? "\"server_busy\"" : "null");
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                      "%sConnection: close\r\n\r\n",
                      status, gw_http_status_text(status), http_date(s), bl, status == 503 ? "Retry-After: 1\r\n" : "");
    if (c->in_flight) return; /* never interleave with a response in progress */
    timer_arm(c, T_NONE);
    conn_write_copy(c, head, (size_t)hl, body, (size_t)bl);
    conn_linger(c);
}

/* ---- timers ------------------------------------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
    gw_conn *c = t->data;
    int kind = c->timer_kind;
    c->timer_kind = T_NONE;
    switch (kind) {
    case T_HEADER:
    case T_BODY:
        if (c->in_flight || c->upgraded) return;
        if (kind == T_HEADER && !gw_http_parser_busy(c->parser)) {
            conn_abort(c); /* never sent a byte */
            return;
        }
        conn_error(c, 408, kind == T_BODY ? "body timeout" : "header timeout");
        return;
    case T_IDLE:
        if (!c->in_flight && !c->upgraded) conn_abort(c);
        return;
    case T_LINGER:
        conn_abort(c);
        return;
    case T_TICK:
        c->timer_kind = T_TICK; /* repeating */
        if (c->upgraded && c->up_ops && c->up_ops->on_tick) c->up_ops->on_tick(c, c->up_ud);
        return;
    default: return;
    }
}

/* ---- reading and dispatch ----------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    gw_conn *c = h->data;
    if (c->lingering || c->upgraded || c->rejecting) {
        /* discard (lingering) or hand straight to the upgraded protocol: use the whole buffer */
        if (!c->in) c->in = malloc(IN_CAP);
        *buf = uv_buf_init(c->in, c->in ? IN_CAP : 0);
        return;
    }
    if (c->in_off > 0 && c->in_off == c->in_len) c->in_off = c->in_len = 0;
    if (c->in_off > 0 && c->in_len == IN_CAP) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    *buf = uv_buf_init(c->in + c->in_len, (unsigned)(IN_CAP - c->in_len));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    gw_conn *c = st->data;
    if (c->closing) return;
    if (nread < 0) {
        /* A client that shuts its side after its last request still gets the responses already
         * queued. Anything else (an error, EOF during a request or an upgraded conversation,
         * EOF while lingering) closes now; an in-flight request is aborted (the handler cancels). */
        c->eof = 1;
        if (nread == UV_EOF && !c->in_flight && !c->upgraded && !c->lingering && !c->rejecting)
            conn_linger(c);
        else
            conn_abort(c);
        return;
    }
    if (nread == 0) return;
    if (c->lingering || c->rejecting) return; /* discarded */
    if (c->upgraded) {
        if (c->up_ops && c->up_ops->on_data) c->up_ops->on_data(c, c->up_ud, buf->base, (size_t)nread);
        return;
    }
    if (c->lru == L_WAITING) lru_remove(c); /* a request is arriving: no longer idle */
    c->in_len += (size_t)nread;
    if (c->in_flight) {
        /* pipelined bytes wait; stop reading when the buffer is full (resumed in conn_process) */
        if (c->in_len == IN_CAP && c->in_off == 0) read_stop(c);
        return;
    }
    conn_process(c);
}

/* The current request is the handler's (or on_headers') from now on. */
static gw_req *hand_over(gw_conn *c) {
    gw_req *r = gw_http_parser_req(c->parser);
    c->req = r;
    r->conn = c;
    r->resp_state = GW__RESP_NONE;
    r->abort_cb = NULL;
    r->abort_ud = NULL;
    c->in_flight = 1;
    lru_remove(c);
    timer_arm(c, T_NONE);
    return r;
}

static void dispatch(gw_conn *c) {
    gw_server *s = c->srv;
    gw_req *r = hand_over(c);
    c->body_deadline = 0;
    atomic_fetch_add(&s->st_requests, 1);
    s->cfg.handler(r, s->cfg.ud);
}

static const char *const default_probes[] = { "/health", "/ready", "/metrics", NULL };

static int is_probe(const gw_server *s, const gw_req *r) {
    if (r->method != HTTP_GET && r->method != HTTP_HEAD) return 0;
    for (const char *const *p = s->cfg.probe_paths ? s->cfg.probe_paths : default_probes; *p; p++)
        if (strcmp(r->path, *p) == 0) return 1;
    return 0;
}

/* The body may come: 100 Continue when asked, and its timeouts. Returns 1 (go on feeding). */
static int body_go(gw_conn *c) {
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (gw_http_parser_wants_continue(c->parser)) conn_write_copy(c, cont, sizeof cont - 1, NULL, 0);
    c->body_deadline = uv_now(c->srv->loop) + c->srv->cfg.body_timeout_ms;
    timer_arm(c, T_BODY);
    c->parse_pending = 1; /* a request without a body completes at the next feed */
    return 1;
}

/* The current request's header block is complete and none of its body is read. Returns 1 to go
 * on reading, 0 when the request was refused, answered or held (reading stops). */
static int headers_done(gw_conn *c) {
    gw_server *s = c->srv;
    gw_req *r = gw_http_parser_req(c->parser);
    if (c->probe_only) {
        if (!is_probe(s, r)) {
            conn_error(c, 503, "The server is at its connection limit; retry shortly.");
            return 0;
        }
        atomic_fetch_add(&s->st_probes, 1);
    }
    long long cl = gw_http_parser_content_length(c->parser);
    if (cl > 0 && (size_t)cl + 1 > c->charged && charge(c, (size_t)cl + 1)) {
        atomic_fetch_add(&s->st_over, 1);
        CM_LOG_WARN("gw", "request body refused: the buffered-bytes cap is reached", "peer=%s length=%lld buffered=%zu cap=%zu",
                    c->peer, cl, s->buffered, s->cfg.max_buffered);
        conn_error(c, 503, "The server is busy receiving other requests; retry shortly.");
        return 0;
    }
    if (!s->cfg.on_headers) return body_go(c);
    hand_over(c);
    c->early = 1;
    int v = s->cfg.on_headers(r, s->cfg.ud);
    if (!c->in_flight || c->closing || c->lingering) return 0; /* answered, or the connection is gone */
    if (v == GW_HDR_HOLD) {
        c->held = 1;
        read_stop(c);
        return 0;
    }
    c->in_flight = 0;
    c->early = 0;
    return body_go(c);
}

void gw_req_resume(gw_req *r) {
    gw_conn *c = r->conn;
    if (!c || !c->held || c->closing || c->lingering || !c->in_flight) return;
    c->held = 0;
    c->early = 0;
    c->in_flight = 0;
    r->abort_cb = NULL;
    body_go(c);
    read_start(c);
    if (!c->in_process) conn_process(c);
}

static void conn_process(gw_conn *c) {
    if (c->in_process) return;
    c->in_process = 1;
    while (!c->closing && !c->lingering && !c->in_flight && !c->upgraded && (c->in_off < c->in_len || c->parse_pending)) {
        size_t used = 0;
        int busy_before = gw_http_parser_busy(c->parser);
        c->parse_pending = 0;
        int r = gw_http_parser_feed(c->parser, c->in + c->in_off, c->in_len - c->in_off, &used);
        c->in_off += used;
        if (!busy_before && (used > 0 || r != GW_PARSE_MORE)) timer_arm(c, T_HEADER);
        size_t held = gw_http_parser_buffered(c->parser); /* a chunked body grows as it comes */
        if (held > c->charged && r != GW_PARSE_ERROR && charge(c, held)) {
            atomic_fetch_add(&c->srv->st_over, 1);
            conn_error(c, 503, "The server is busy receiving other requests; retry shortly.");
            break;
        }
        if (r == GW_PARSE_MORE) {
            timer_arm(c, gw_http_parser_headers_done(c->parser) ? T_BODY : T_HEADER);
            break;
        }
        if (r == GW_PARSE_HEADERS) {
            if (!headers_done(c)) break;
            continue;
        }
        if (r == GW_PARSE_ERROR) {
            const char *why;
            int status = gw_http_parser_error(c->parser, &why);
            conn_error(c, status, why);
            break;
        }
        /* GW_PARSE_REQUEST */
        dispatch(c);
        if (c->upgraded && !c->closing) {
            /* bytes after the upgrade request belong to the new protocol */
            size_t n = c->in_len - c->in_off;
            if (n && c->up_ops && c->up_ops->on_data) {
                char *tmp = malloc(n);
                if (tmp) {
                    memcpy(tmp, c->in + c->in_off, n);
                    c->in_off = c->in_len = 0;
                    c->up_ops->on_data(c, c->up_ud, tmp, n);
                    free(tmp);
                } else {
                    conn_abort(c);
                }
            }
            c->in_off = c->in_len = 0;
            break;
        }
    }
    if (c->in_off == c->in_len) c->in_off = c->in_len = 0;
    if (!c->closing && !c->lingering && !c->in_flight && !c->upgraded) {
        if (!gw_http_parser_busy(c->parser)) {
            timer_arm(c, T_IDLE);
            lru_add(c, L_WAITING);
        }
        read_start(c);
    }
    c->in_process = 0;
}

/* The response to the current request has been fully queued. */
static void request_done(gw_conn *c, int keep) {
    gw_req *r = c->req;
    c->in_flight = 0;
    c->early = c->held = 0;
    r->abort_cb = NULL;
    r->resp_state = GW__RESP_ENDED;
    if (!keep) {
        conn_linger(c);
        return;
    }
    gw_http_parser_next(c->parser);
    charge(c, gw_http_parser_buffered(c->parser)); /* the body buffer went (or shrank) */
    if (!c->in_process) conn_process(c);
}

/* A request answered before its body was read cannot be followed by another on the same
 * connection (the body would read as one); nor can one beyond the cap, or during a drain. */
static int conn_keep_alive(gw_conn *c) {
    return c->req->keep_alive && !c->srv->draining && !c->early && !c->probe_only;
}

/* ---- responses ---------------------------------------------------------------------------- */

static void note_response(gw_conn *c, gw_req *r, int status) {
    if (c->srv->cfg.on_response) c->srv->cfg.on_response(c->srv->cfg.ud, r->path ? r->path : "", status);
}

static int head_format(gw_conn *c, char *dst, size_t cap, int status, const char *ctype, const char *extra,
                       long long clen, int chunked, int keep) {
    char lenline[64] = "";
    if (clen >= 0) snprintf(lenline, sizeof lenline, "Content-Length: %lld\r\n", clen);
    else if (chunked) snprintf(lenline, sizeof lenline, "Transfer-Encoding: chunked\r\n");
    int n = snprintf(dst, cap, "HTTP/1.1 %d %s\r\nDate: %s\r\n%s%s%s%sConnection: %s\r\n%s\r\n", status,
                     gw_http_status_text(status), http_date(c->srv), ctype ? "Content-Type: " : "", ctype ? ctype : "",
                     ctype ? "\r\n" : "", lenline, keep ? "keep-alive" : "close", extra ? extra : "");
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

static int resp_check(gw_req *r, int want) {
    if (!r || !r->conn) return CM_ESTATE;
    if (r->resp_state != want) return CM_ESTATE;
    if (r->conn->closing || r->conn->lingering || !r->conn->in_flight) return CM_ENET;
    return 0;
}

/* An ending call failed because the connection is gone: the request is over for the handler all
 * the same (it may free its state now), so the abort callback must not run later. */
static int end_failed(gw_req *r, int e) {
    if (e != CM_ESTATE) {
        r->abort_cb = NULL;
        r->resp_state = GW__RESP_ENDED;
    }
    return e;
}

int gw_resp_send(gw_req *r, int status, const char *ctype, const char *body, size_t len, const char *extra) {
    int e = resp_check(r, GW__RESP_NONE);
    if (e) return end_failed(r, e);
    gw_conn *c = r->conn;
    int keep = conn_keep_alive(c);
    size_t extra_len = extra ? strlen(extra) : 0;
    size_t cap = 512 + extra_len + (ctype ? strlen(ctype) : 0);
    int head_only = r->method == HTTP_HEAD || status == 204 || status == 304;
    struct wreq *wr = wreq_new(c, cap + (head_only ? 0 : len));
    int hl = wr ? head_format(c, wr->data, cap, status, ctype, extra, (status == 204 || status == 304) ? -1 : (long long)len, 0, keep) : -1;
    if (hl < 0) {
        /* the client would wait forever for an answer that cannot be built: drop it */
        int err = wr ? CM_EINVAL : CM_ENOMEM;
        free(wr);
        conn_abort(c);
        return end_failed(r, err);
    }
    if (!head_only && len) memcpy(wr->data + hl, body, len);
    wr->len = (size_t)hl + (head_only ? 0 : len);
    note_response(c, r, status);
    e = wreq_submit(c, wr);
    if (e) return end_failed(r, e);
    request_done(c, keep);
    return 0;
}

int gw_resp_stream_start(gw_req *r, int status, const char *ctype, const char *extra) {
    int e = resp_check(r, GW__RESP_NONE);
    if (e) return e;
    gw_conn *c = r->conn;
    r->chunked = r->http_minor >= 1;
    int keep = r->chunked && conn_keep_alive(c);
    size_t cap = 512 + (extra ? strlen(extra) : 0) + (ctype ? strlen(ctype) : 0);
    struct wreq *wr = wreq_new(c, cap);
    if (!wr) return CM_ENOMEM;
    int hl = head_format(c, wr->data, cap, status, ctype, extra, -1, r->chunked, keep);
    if (hl < 0) {
        free(wr);
        return CM_EINVAL;
    }
    wr->len = (size_t)hl;
    note_response(c, r, status);
    r->resp_state = GW__RESP_STREAMING;
    r->keep_alive = keep;
    return wreq_submit(c, wr);
}

/* 1 when queuing len more bytes would pass the cap: the connection is then cut off. */
static int over_cap(gw_conn *c, size_t len) {
    size_t q = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (q + len <= c->srv->cfg.write_queue_cap) return 0;
    atomic_fetch_add(&c->srv->st_slow, 1);
    CM_LOG_WARN("gw", "slow reader disconnected", "peer=%s queued=%zu cap=%zu", c->peer, q,
                c->srv->cfg.write_queue_cap);
    conn_abort(c);
    return 1;
}

int gw_resp_stream_write(gw_req *r, const char *data, size_t len) {
    int e = resp_check(r, GW__RESP_STREAMING);
    if (e) return e;
    if (len == 0) return 0;
    gw_conn *c = r->conn;
    if (r->method == HTTP_HEAD) return 0;
    if (over_cap(c, len)) return CM_ENET;
    if (!r->chunked) return conn_write_copy(c, data, len, NULL, 0);
    struct wreq *wr = wreq_new(c, len + 32);
    if (!wr) return CM_ENOMEM;
    int hl = snprintf(wr->data, 32, "%zx\r\n", len);
    memcpy(wr->data + hl, data, len);
    memcpy(wr->data + hl + len, "\r\n", 2);
    wr->len = (size_t)hl + len + 2;
    return wreq_submit(c, wr);
}

int gw_resp_stream_end(gw_req *r) {
    int e = resp_check(r, GW__RESP_STREAMING);
    if (e) return end_failed(r, e);
    gw_conn *c = r->conn;
    if (r->chunked && r->method != HTTP_HEAD) {
        e = conn_write_copy(c, "0\r\n\r\n", 5, NULL, 0);
        if (e == CM_ENET) return end_failed(r, e);
        if (e) {
            conn_abort(c); /* no memory for the terminator: the client must not wait for it */
            return end_failed(r, CM_ENET);
        }
    }
    request_done(c, r->chunked && r->keep_alive && !c->srv->draining);
    return 0;
}

void gw_req_on_abort(gw_req *r, void (*cb)(gw_req *r, void *ud), void *ud) {
    r->abort_cb = cb;
    r->abort_ud = ud;
}

uv_loop_t *gw_req_loop(const gw_req *r) { return r->conn ? r->conn->srv->loop : NULL; }
gw_server *gw_req_server(const gw_req *r) { return r->conn ? r->conn->srv : NULL; }

/* ---- upgraded connections ----------------------------------------------------------------- */

int gw_conn_upgrade(gw_req *r, const char *head, const gw_upgrade_ops *ops, void *ud, gw_conn **out) {
    int e = resp_check(r, GW__RESP_NONE);
    if (e) return e;
    gw_conn *c = r->conn;
    if (!c->in_process || c->early) return CM_ESTATE; /* only from inside the handler callback */
    e = conn_write_copy(c, head, strlen(head), NULL, 0);
    if (e) return e;
    note_response(c, r, 101);
    r->resp_state = GW__RESP_ENDED;
    r->abort_cb = NULL;
    c->in_flight = 0;
    c->upgraded = 1;
    c->up_ops = ops;
    c->up_ud = ud;
    charge(c, 0); /* the upgraded protocol charges its own buffers (gw_conn_charge) */
    timer_arm(c, T_NONE);
    uv_tcp_keepalive(&c->tcp, 1, 60); /* besides the protocol's own liveness checks: find dead peers */
    read_start(c);
    if (out) *out = c;
    return 0;
}

int gw_conn_write(gw_conn *c, const char *data, size_t len) {
    if (c->closing || c->lingering) return CM_ENET;
    if (len == 0) return 0;
    if (over_cap(c, len)) return CM_ENET;
    return conn_write_copy(c, data, len, NULL, 0);
}

void gw_conn_close(gw_conn *c) { conn_linger(c); }
gw_server *gw_conn_server(const gw_conn *c) { return c->srv; }

void gw_conn_set_evictable(gw_conn *c, int on) {
    if (!c->upgraded) return;
    if (on && !c->srv->draining) lru_add(c, L_UPGRADED);
    else lru_remove(c);
}

void gw_conn_tick(gw_conn *c, uint32_t ms) {
    if (c->closing) return;
    c->tick_ms = ms;
    timer_arm(c, ms ? T_TICK : T_NONE);
}

char *gw_req_take_body(gw_req *r, size_t *len, size_t *chg) {
    gw_conn *c = r->conn;
    size_t cap = 0;
    *chg = 0;
    if (!c) return NULL;
    char *b = gw_http_parser_take_body(c->parser, len, &cap);
    /* the connection's charge for that buffer becomes the caller's (the server total stays) */
    size_t moved = cap < c->charged ? cap : c->charged;
    c->charged -= moved;
    *chg = moved;
    return b;
}

/* ---- accepting ---------------------------------------------------------------------------- */

/* Makes room at the cap: the least recently active idle connection (one waiting for a request
 * first, then an upgraded one marked evictable) gives up its slot at once. Returns 1 when one
 * did. */
static int evict_one(gw_server *s) {
    for (int k = L_WAITING; k < L_N; k++) {
        gw_conn *v = s->lru_head[k];
        if (!v) continue;
        lru_remove(v);
        uncount(v);
        atomic_fetch_add(&s->st_evicted, 1);
        CM_LOG_DEBUG("gw", "idle connection evicted at the connection cap", "peer=%s upgraded=%d", v->peer, v->upgraded);
        if (v->upgraded && v->up_ops && v->up_ops->on_evict) v->up_ops->on_evict(v, v->up_ud);
        else if (v->upgraded) conn_linger(v);
        else conn_abort(v);
        return 1;
    }
    return 0;
}

static void on_connection(uv_stream_t *ls, int status) {
    gw_server *s = ls->data;
    if (status < 0) {
        CM_LOG_WARN("gw", "accept failed", "err=%s", uv_strerror(status));
        return;
    }
    gw_conn *c = calloc(1, sizeof *c);
    if (!c) {
        uv_tcp_t *t = malloc(sizeof *t); /* take it off the backlog all the same */
        if (t && uv_tcp_init(s->loop, t) == 0) {
            uv_accept(ls, (uv_stream_t *)t);
            uv_close((uv_handle_t *)t, (uv_close_cb)free);
        } else {
            free(t);
        }
        return;
    }
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp)) {
        conn_abort(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    peer_name(c);
    if (s->finishing) {
        conn_abort(c);
        return;
    }
    struct addr_slot *a = addr_find(s, c->addr, 0);
    if ((!c->loopback || s->cfg.cap_loopback) && s->cfg.max_conns_per_ip > 0 && a && a->n >= (uint32_t)s->cfg.max_conns_per_ip) {
        atomic_fetch_add(&s->st_rejected, 1);
        CM_LOG_DEBUG("gw", "connection refused: its address holds the most allowed", "peer=%s conns=%u", c->peer, a->n);
        if (s->n_rejecting >= REJECT_MAX) {
            conn_abort(c);
            return;
        }
        c->rejecting = 1;
        s->n_rejecting++;
        conn_error(c, 503, "Too many connections from your address; close some and retry.");
        return;
    }
    if (s->n_conns >= s->cfg.max_conns) evict_one(s);
    if (s->n_conns >= s->cfg.max_conns) {
        if (s->n_probe >= PROBE_MAX) {
            atomic_fetch_add(&s->st_rejected, 1);
            conn_abort(c);
            return;
        }
        c->probe_only = 1; /* a slot for /health and friends only */
        s->n_probe++;
    } else {
        c->counted = 1;
        s->n_conns++;
        atomic_fetch_add(&s->st_open, 1);
    }
    if ((a = addr_find(s, c->addr, 1))) {
        a->n++;
        c->addr_counted = 1;
    }
    c->in = malloc(IN_CAP);
    if (!c->in || gw_http_parser_create(s->cfg.max_header, s->cfg.max_body, &c->parser)) {
        conn_abort(c);
        return;
    }
    gw_http_parser_report_headers(c->parser, 1);
    atomic_fetch_add(&s->st_total, 1);
    if (c->probe_only) atomic_fetch_add(&s->st_rejected, 1);
    timer_arm(c, T_HEADER);
    lru_add(c, L_WAITING);
    read_start(c);
}

/* ---- server ------------------------------------------------------------------------------- */

void gw_http_cfg_default(gw_http_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->port = 8080;
    cfg->backlog = 511;
    cfg->max_conns = 1024;
    cfg->max_conns_per_ip = 256;
    cfg->max_header = 16u << 10;
    cfg->max_body = 8u << 20;
    cfg->max_buffered = 256u << 20;
    cfg->header_timeout_ms = 10000;
    cfg->idle_timeout_ms = 60000;
    cfg->body_idle_ms = 10000;
    cfg->body_timeout_ms = 60000;
    cfg->write_queue_cap = 4u << 20;
    cfg->drain_timeout_ms = 30000;
}

static void on_server_handle_closed(uv_handle_t *h) {
    gw_server *s = h->data;
    if (--s->handles_open == 0) {
        s->closed = 1;
        if (s->on_closed) s->on_closed(s, s->on_closed_ud);
    }
}

/* A connection whose request or upgraded conversation is still under way keeps a drain going. */
static int conn_working(const gw_conn *c) { return !c->closing && !c->lingering && (c->in_flight || c->upgraded); }

/* During a drain: once nothing is at work, stop listening and close what is left (idle and
 * probe connections); once every connection is gone, close the server's own handles. */
static void server_maybe_finish(gw_server *s) {
    if (!s->draining || s->closed) return;
    if (!s->finishing) {
        for (gw_conn *c = s->conns; c; c = c->next)
            if (conn_working(c)) return;
        s->finishing = 1;
        CM_LOG_INFO("gw", "drained", "conns=%d", s->n_conns);
        if (s->listener_open) {
            s->listener_open = 0;
            uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
        }
        uv_timer_stop(&s->drain);
        for (gw_conn *c = s->conns; c; c = c->next)
            if (!c->lingering) conn_abort(c); /* lingering ones end by themselves, LINGER_MS at most */
    }
    if (s->conns || s->handles_closing) return;
    s->handles_closing = 1;
    uv_close((uv_handle_t *)&s->async, on_server_handle_closed);
    uv_close((uv_handle_t *)&s->drain, on_server_handle_closed);
    if (s->sig_on) {
        uv_close((uv_handle_t *)&s->sig[0], on_server_handle_closed);
        uv_close((uv_handle_t *)&s->sig[1], on_server_handle_closed);
    }
}

/* The drain deadline (or a second signal, hard = 1): the handler ends what still runs, then
 * every connection goes (after its last writes, unless hard). */
static void drain_deadline(gw_server *s, int hard) {
    if (!s->deadline_passed) {
        s->deadline_passed = 1;
        int working = 0;
        for (gw_conn *c = s->conns; c; c = c->next) working += conn_working(c);
        CM_LOG_WARN("gw", hard ? "second signal: ending what still runs" : "drain timeout: ending what still runs",
                    "working=%d", working);
        if (s->cfg.on_drain_deadline) s->cfg.on_drain_deadline(s->cfg.ud);
    }
    for (gw_conn *c = s->conns; c; c = c->next) {
        if (c->closing) continue;
        if (hard || c->in_flight || !c->upgraded) {
            if (!c->lingering || hard) conn_abort(c);
        } else {
            conn_linger(c); /* an upgraded protocol's goodbye goes out first */
        }
    }
    server_maybe_finish(s);
}

static void on_drain_timeout(uv_timer_t *t) { drain_deadline(t->data, 0); }

void gw_server_shutdown(gw_server *s) {
    if (s->draining) return;
    s->draining = 1;
    CM_LOG_INFO("gw", "shutting down", "conns=%d", s->n_conns);
    gw_conn *next;
    for (gw_conn *c = s->conns; c; c = next) {
        next = c->next; /* conn_abort does not unlink synchronously, but be safe */
        lru_remove(c);
        if (c->closing || c->lingering || c->rejecting) continue;
        if (c->upgraded) {
            if (c->up_ops && c->up_ops->on_shutdown) c->up_ops->on_shutdown(c, c->up_ud);
            else conn_linger(c);
        } else if (!c->in_flight && !gw_http_parser_busy(c->parser)) {
            conn_abort(c);
        }
    }
    uv_timer_start(&s->drain, on_drain_timeout, s->cfg.drain_timeout_ms, 0);
    server_maybe_finish(s);
}

static void on_async(uv_async_t *a) { gw_server_shutdown(a->data); }

static void on_signal(uv_signal_t *h, int signum) {
    gw_server *s = h->data;
    if (s->draining) {
        CM_LOG_WARN("gw", "second signal: closing now", "signal=%d", signum);
        drain_deadline(s, 1);
        return;
    }
    CM_LOG_INFO("gw", "signal received", "signal=%d", signum);
    gw_server_shutdown(s);
}

int gw_server_handle_signals(gw_server *s) {
    if (s->sig_on || s->draining) return 0;
    uv_signal_init(s->loop, &s->sig[0]);
    uv_signal_init(s->loop, &s->sig[1]);
    s->sig[0].data = s->sig[1].data = s;
    s->handles_open += 2;
    s->sig_on = 1;
    if (uv_signal_start(&s->sig[0], on_signal, SIGINT) || uv_signal_start(&s->sig[1], on_signal, SIGTERM))
        return CM_ENET;
    /* both handles are unreferenced: a server with signals still ends when drained */
    uv_unref((uv_handle_t *)&s->sig[0]);
    uv_unref((uv_handle_t *)&s->sig[1]);
    return 0;
}

void gw_server_on_closed(gw_server *s, void (*cb)(gw_server *s, void *ud), void *ud) {
    s->on_closed = cb;
    s->on_closed_ud = ud;
}

void gw_server_stop_async(gw_server *s) { uv_async_send(&s->async); }
int gw_server_closed(const gw_server *s) { return s->closed; }
int gw_server_draining(const gw_server *s) { return s->draining; }
int gw_server_port(const gw_server *s) { return s->port; }
uv_loop_t *gw_server_loop(const gw_server *s) { return s->loop; }

void gw_server_stats_get(const gw_server *s, gw_server_stats *st) {
    st->conns_open = atomic_load(&s->st_open);
    st->conns_total = atomic_load(&s->st_total);
    st->conns_rejected = atomic_load(&s->st_rejected);
    st->requests_total = atomic_load(&s->st_requests);
    st->errors_total = atomic_load(&s->st_errors);
    st->slow_readers = atomic_load(&s->st_slow);
    st->evicted = atomic_load(&s->st_evicted);
    st->probes_beyond_cap = atomic_load(&s->st_probes);
    st->over_buffered = atomic_load(&s->st_over);
    st->buffered = atomic_load(&s->st_buffered);
}

int gw_server_create(uv_loop_t *loop, const gw_http_cfg *cfg, gw_server **out) {
    *out = NULL;
    if (!loop || !cfg || !cfg->handler || !cfg->host || cfg->max_conns < 1 || cfg->max_header < 256 ||
        cfg->header_timeout_ms == 0 || cfg->idle_timeout_ms == 0 || cfg->body_idle_ms == 0 || cfg->body_timeout_ms == 0 ||
        cfg->write_queue_cap == 0 || cfg->max_buffered == 0 || cfg->max_conns_per_ip < 0 || cfg->port < 0 ||
        cfg->port > 65535 || strlen(cfg->host) >= 64)
        return CM_EINVAL;
    struct sockaddr_storage addr;
    if (uv_ip4_addr(cfg->host, cfg->port, (struct sockaddr_in *)&addr) &&
        uv_ip6_addr(cfg->host, cfg->port, (struct sockaddr_in6 *)&addr))
        return CM_EINVAL;
    gw_server *s = calloc(1, sizeof *s);
    if (!s) return CM_ENOMEM;
    /* every connection that can be open at once (counted, probe, evicted but not yet closed) */
    uint32_t n = 64;
    while (n < 4u * ((uint32_t)cfg->max_conns + PROBE_MAX)) n <<= 1;
    s->addrs = calloc(n, sizeof *s->addrs);
    if (!s->addrs) {
        free(s);
        return CM_ENOMEM;
    }
    s->n_addr_slots = n;
    s->loop = loop;
    s->cfg = *cfg;
    snprintf(s->host, sizeof s->host, "%s", cfg->host);
    s->cfg.host = s->host;
    if (s->cfg.backlog <= 0) s->cfg.backlog = 511;
    /* a client that vanishes mid-write must give EPIPE, not kill the gateway */
    signal(SIGPIPE, SIG_IGN);
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->handles_open = 1;
    s->listener_open = 1;
    int e = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0);
    if (!e) e = uv_listen((uv_stream_t *)&s->listener, s->cfg.backlog, on_connection);
    if (e) {
        CM_LOG_ERROR("gw", "listen failed", "host=%s port=%d err=%s", cfg->host, cfg->port, uv_strerror(e));
        /* the listener must be closed through the loop before s can go */
        s->draining = s->finishing = 1;
        uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
        while (!s->closed) uv_run(loop, UV_RUN_NOWAIT);
        free(s->addrs);
        free(s);
        return CM_ENET;
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    uv_async_init(loop, &s->async, on_async);
    s->async.data = s;
    uv_timer_init(loop, &s->drain);
    s->drain.data = s;
    uv_unref((uv_handle_t *)&s->drain);
    s->handles_open += 2;
    CM_LOG_INFO("gw", "listening", "host=%s port=%d", cfg->host, s->port);
    *out = s;
    return 0;
}

void gw_server_destroy(gw_server *s) {
    if (!s) return;
    if (!s->closed) {
        /* Not drained through the loop: close everything now and spin the loop until the close
         * callbacks ran. Only valid outside uv_run. */
        gw_server_shutdown(s);
        for (gw_conn *c = s->conns; c; c = c->next) conn_abort(c);
        server_maybe_finish(s);
        while (!s->closed) uv_run(s->loop, UV_RUN_NOWAIT);
    }
    free(s->addrs);
    free(s);
}
