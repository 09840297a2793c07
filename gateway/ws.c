/* ws: RFC 6455 handshake, frame parser, frame writer, and the upgraded connection. */
#include "gateway/ws.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/sha.h>

#include "common/cm_err.h"
#include "common/cm_log.h"

static const char GUID[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

#define MSG_KEEP (64u << 10) /* message buffer bytes a parser keeps between messages */

/* ---- handshake ---------------------------------------------------------------------------- */

static void base64(const uint8_t *in, size_t n, char *out) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = al[v >> 18 & 63];
        out[o++] = al[v >> 12 & 63];
        out[o++] = i + 1 < n ? al[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? al[v & 63] : '=';
    }
    out[o] = 0;
}

void gw_ws_accept_key(const char *client_key, char out[29]) {
    uint8_t md[SHA_DIGEST_LENGTH];
    char stackbuf[256];
    size_t kl = strlen(client_key), n = kl + sizeof GUID - 1;
    char *buf = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!buf) {
        out[0] = 0; /* no memory for an absurd key: an accept value no client will match */
        return;
    }
    memcpy(buf, client_key, kl);
    memcpy(buf + kl, GUID, sizeof GUID - 1);
    SHA1((const unsigned char *)buf, n, md);
    if (buf != stackbuf) free(buf);
    base64(md, sizeof md, out);
}

/* 1 when the comma-separated header value contains token (case-insensitive). */
static int has_token(const char *v, const char *token) {
    size_t tl = strlen(token);
    while (v && *v) {
        while (*v == ' ' || *v == '\t' || *v == ',') v++;
        const char *e = v;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > v && (t[-1] == ' ' || t[-1] == '\t')) t--;
        if ((size_t)(t - v) == tl && strncasecmp(v, token, tl) == 0) return 1;
        v = e;
    }
    return 0;
}

/* A key is 16 random bytes in base64: 22 base64 characters then "==". */
static int key_ok(const char *k) {
    if (!k || strlen(k) != 24 || strcmp(k + 22, "==") != 0) return 0;
    for (int i = 0; i < 22; i++)
        if (!isalnum((unsigned char)k[i]) && k[i] != '+' && k[i] != '/') return 0;
    /* the last character before the padding carries only 2 significant bits */
    return strchr("AQgw", k[21]) != NULL;
}

int gw_ws_handshake_check(const gw_req *r, const char **reason) {
    const char *why = NULL;
    int status = 400;
    const char *ver = gw_req_header(r, "sec-websocket-version");
    if (gw_req_method(r) != 1 /* HTTP_GET */) why = "WebSocket handshake must use GET";
    else if (gw_req_http_minor(r) < 1) why = "WebSocket needs HTTP/1.1";
    else if (!has_token(gw_req_header(r, "upgrade"), "websocket")) why = "missing 'Upgrade: websocket'";
    else if (!has_token(gw_req_header(r, "connection"), "upgrade")) why = "missing 'Connection: Upgrade'";
    else if (!ver || strcmp(ver, "13") != 0) {
        why = "unsupported Sec-WebSocket-Version (13 is supported)";
        status = 426;
    } else if (!key_ok(gw_req_header(r, "sec-websocket-key"))) why = "bad Sec-WebSocket-Key";
    if (reason) *reason = why;
    return why ? status : 0;
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

int gw_ws_utf8_valid(const char *s, size_t len) {
    if (len == 0) return 1; /* s may be NULL then */
    const uint8_t *p = (const uint8_t *)s, *end = p + len;
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int n;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) n = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) n = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) n = 3, cp = c & 0x07;
        else return 0;
        if (end - p <= n) return 0;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (p[i] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        p += n + 1;
    }
    return 1;
}

/* ---- frame parser ------------------------------------------------------------------------- */

enum { ST_HDR = 0, ST_PAYLOAD, ST_ERROR };

struct gw_ws_parser {
    size_t   max_message;
    int      require_mask;
    int      state;
    uint8_t  hdr[14];
    size_t   hlen;          /* header bytes gathered */
    size_t   hneed;         /* header bytes needed (2 until the length byte is known) */
    int      fin, opcode, masked;
    uint8_t  mask[4];
    uint64_t plen, pgot;    /* current frame payload length / bytes received */
    /* the message being reassembled */
    int      msg_opcode;    /* GW_WS_TEXT/BINARY while fragments are pending, 0 otherwise */
    char    *msg;
    size_t   msg_len, msg_cap;
    char     ctl[125];      /* control frame payload */
    int      err_code;
    const char *err_reason;
};

static int perr(gw_ws_parser *p, int code, const char *reason) {
    p->state = ST_ERROR;
    p->err_code = code;
    p->err_reason = reason;
    return -1;
}

int gw_ws_parser_create(size_t max_message, int require_mask, gw_ws_parser **out) {
    gw_ws_parser *p = calloc(1, sizeof *p);
    *out = NULL;
    if (!p) return CM_ENOMEM;
    p->max_message = max_message;
    p->require_mask = require_mask;
    p->hneed = 2;
    *out = p;
    return 0;
}

void gw_ws_parser_destroy(gw_ws_parser *p) {
    if (!p) return;
    free(p->msg);
    free(p);
}

int gw_ws_parser_error(const gw_ws_parser *p, const char **reason) {
    if (reason) *reason = p->state == ST_ERROR ? p->err_reason : NULL;
    return p->state == ST_ERROR ? p->err_code : 0;
}

static int close_code_ok(int c) {
    return (c >= 1000 && c <= 1003) || (c >= 1007 && c <= 1014) || (c >= 3000 && c <= 4999);
}

/* The header is complete: validate it. */
static int header_done(gw_ws_parser *p) {
    uint8_t b0 = p->hdr[0], b1 = p->hdr[1];
    p->fin = b0 >> 7;
    p->opcode = b0 & 0x0F;
    p->masked = b1 >> 7;
    uint64_t len = b1 & 0x7F;
    size_t o = 2;
    if (len == 126) {
        len = (uint64_t)p->hdr[2] << 8 | p->hdr[3];
        if (len < 126) return perr(p, 1002, "non-minimal length");
        o = 4;
    } else if (len == 127) {
        len = 0;
        for (int i = 0; i < 8; i++) len = len << 8 | p->hdr[2 + i];
        if (len >> 63) return perr(p, 1002, "length with the top bit set");
        if (len < 65536) return perr(p, 1002, "non-minimal length");
        o = 10;
    }
    if (p->masked) memcpy(p->mask, p->hdr + o, 4);
    if (b0 & 0x70) return perr(p, 1002, "reserved bits set");
    if (p->require_mask && !p->masked) return perr(p, 1002, "client frames must be masked");
    int control = p->opcode & 0x8;
    switch (p->opcode) {
    case GW_WS_CONT:
        if (!p->msg_opcode) return perr(p, 1002, "continuation without a message");
        break;
    case GW_WS_TEXT:
    case GW_WS_BINARY:
        if (p->msg_opcode) return perr(p, 1002, "new message inside a fragmented one");
        break;
    case GW_WS_CLOSE:
    case GW_WS_PING:
    case GW_WS_PONG:
        if (!p->fin) return perr(p, 1002, "fragmented control frame");
        if (len > 125) return perr(p, 1002, "control frame over 125 bytes");
        break;
    default: return perr(p, 1002, "reserved opcode");
    }
    if (!control) {
        size_t have = p->opcode == GW_WS_CONT ? p->msg_len : 0;
        if (len > p->max_message - have) return perr(p, 1009, "message too big");
        if (p->opcode != GW_WS_CONT) {
            p->msg_opcode = p->opcode;
            p->msg_len = 0;
        }
        size_t need = p->msg_len + (size_t)len;
        if (need > p->msg_cap) {
            size_t cap = p->msg_cap ? p->msg_cap : 1024;
            while (cap < need) cap *= 2;
            if (cap > p->max_message) cap = p->max_message;
            char *m = realloc(p->msg, cap ? cap : 1);
            if (!m) return perr(p, 1011, "out of memory");
            p->msg = m;
            p->msg_cap = cap;
        }
    }
    p->plen = len;
    p->pgot = 0;
    p->state = ST_PAYLOAD;
    return 0;
}

/* The frame's payload is complete. Returns 0, 1 (stop), -1. */
static int frame_done(gw_ws_parser *p, gw_ws_frame_cb cb, void *ud) {
    p->state = ST_HDR;
    p->hlen = 0;
    p->hneed = 2;
    if (p->opcode & 0x8) {
        size_t n = (size_t)p->plen;
        int code = 0;
        const char *pl = p->ctl;
        if (p->opcode == GW_WS_CLOSE) {
            if (n == 1) return perr(p, 1002, "close frame with a 1-byte payload");
            code = GW_WS_NO_STATUS;
            if (n >= 2) {
                code = (uint8_t)p->ctl[0] << 8 | (uint8_t)p->ctl[1];
                if (!close_code_ok(code)) return perr(p, 1002, "invalid close code");
                if (!gw_ws_utf8_valid(p->ctl + 2, n - 2)) return perr(p, 1007, "close reason is not UTF-8");
                pl += 2;
                n -= 2;
            }
        }
        return cb(ud, p->opcode, pl, n, code) ? 1 : 0;
    }
    if (!p->fin) return 0;
    int op = p->msg_opcode;
    p->msg_opcode = 0;
    if (op == GW_WS_TEXT && !gw_ws_utf8_valid(p->msg, p->msg_len)) return perr(p, 1007, "text message is not UTF-8");
    size_t n = p->msg_len;
    p->msg_len = 0;
    int stop = cb(ud, op, p->msg ? p->msg : "", n, 0);
    if (p->msg_cap > MSG_KEEP) { /* a large message's buffer does not outlive it */
        free(p->msg);
        p->msg = NULL;
        p->msg_cap = 0;
    }
    return stop ? 1 : 0;
}

size_t gw_ws_parser_buffered(const gw_ws_parser *p) { return p->msg_cap; }

int gw_ws_parser_partial(const gw_ws_parser *p) {
    return p->state != ST_ERROR && (p->msg_opcode != 0 || p->state == ST_PAYLOAD || p->hlen > 0);
}

int gw_ws_parser_feed(gw_ws_parser *p, const char *data, size_t len, size_t *used, gw_ws_frame_cb cb, void *ud) {
    size_t off = 0;
    int r = 0;
    while (p->state != ST_ERROR) {
        if (p->state == ST_HDR) {
            if (off == len) break;
            while (p->hlen < p->hneed && off < len) p->hdr[p->hlen++] = (uint8_t)data[off++];
            if (p->hlen < p->hneed) break;
            if (p->hneed == 2) {
                uint8_t l7 = p->hdr[1] & 0x7F;
                p->hneed = 2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0) + ((p->hdr[1] & 0x80) ? 4 : 0);
                if (p->hlen < p->hneed) continue;
            }
            if (header_done(p)) break;
            if (p->plen != 0) continue;
        } else {
            size_t n = len - off;
            if ((uint64_t)n > p->plen - p->pgot) n = (size_t)(p->plen - p->pgot);
            char *dst = (p->opcode & 0x8) ? p->ctl + p->pgot : p->msg + p->msg_len;
            for (size_t i = 0; i < n; i++) dst[i] = (char)((uint8_t)data[off + i] ^ (p->masked ? p->mask[(p->pgot + i) & 3] : 0));
            p->pgot += n;
            if (!(p->opcode & 0x8)) p->msg_len += n;
            off += n;
            if (p->pgot < p->plen) break;
        }
        r = frame_done(p, cb, ud);
        if (r) break;
    }
    if (used) *used = off;
    if (p->state == ST_ERROR) return -1;
    return r;
}

size_t gw_ws_frame_header(int opcode, size_t len, uint8_t hdr[10]) {
    hdr[0] = (uint8_t)(0x80 | (opcode & 0x0F));
    if (len < 126) {
        hdr[1] = (uint8_t)len;
        return 2;
    }
    if (len < 65536) {
        hdr[1] = 126;
        hdr[2] = (uint8_t)(len >> 8);
        hdr[3] = (uint8_t)len;
        return 4;
    }
    hdr[1] = 127;
    for (int i = 0; i < 8; i++) hdr[2 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
    return 10;
}

/* ---- connections -------------------------------------------------------------------------- */

struct gw_ws {
    gw_conn *conn;
    gw_ws_parser *parser;   /* NULL once a message was refused for the buffered-bytes cap */
    const gw_ws_ops *ops;
    void *ud;
    int close_sent;
    int gone;
    int in_feed;
    int busy;               /* the application has work in progress (gw_ws_set_busy) */
    int draining;           /* the server drains: close once not busy */
    /* liveness (gw_ws_set_liveness); uv_now times */
    uint32_t ping_ms, idle_ms, message_ms;
    uint64_t last_rx;       /* any bytes from the client */
    uint64_t last_active;   /* a message either way, or the end of the application's work */
    uint64_t ping_sent;
    int      ping_out;      /* a ping is unanswered */
    uint64_t partial_since; /* a message (or frame) is half in since then; 0: none */
};

static uint64_t ws_now(const gw_ws *ws) { return uv_now(gw_server_loop(gw_conn_server(ws->conn))); }

static int send_frame(gw_ws *ws, int opcode, const char *payload, size_t len) {
    if (ws->gone) return CM_ENET;
    uint8_t hdr[10];
    size_t hl = gw_ws_frame_header(opcode, len, hdr);
    char *buf = malloc(hl + len);
    if (!buf) return CM_ENOMEM;
    memcpy(buf, hdr, hl);
    if (len) memcpy(buf + hl, payload, len);
    int e = gw_conn_write(ws->conn, buf, hl + len);
    free(buf);
    return e;
}

static void send_close(gw_ws *ws, int code, const char *reason) {
    if (ws->close_sent || ws->gone) return;
    ws->close_sent = 1;
    char pl[125];
    size_t n = 0;
    if (code != GW_WS_NO_STATUS) {
        pl[0] = (char)(code >> 8);
        pl[1] = (char)code;
        n = 2;
        size_t rl = reason ? strlen(reason) : 0;
        if (rl > 123) rl = 123;
        /* do not cut a character in two */
        while (rl > 0 && rl < (reason ? strlen(reason) : 0) && ((uint8_t)reason[rl] & 0xC0) == 0x80) rl--;
        if (rl) memcpy(pl + 2, reason, rl);
        n += rl;
    }
    send_frame(ws, GW_WS_CLOSE, pl, n);
    gw_conn_close(ws->conn);
}

static int on_frame(void *ud, int opcode, const char *payload, size_t len, int close_code) {
    gw_ws *ws = ud;
    switch (opcode) {
    case GW_WS_TEXT:
        ws->last_active = ws_now(ws);
        if (!ws->close_sent && ws->ops->on_message) ws->ops->on_message(ws, ws->ud, payload, len);
        break;
    case GW_WS_BINARY:
        send_close(ws, GW_WS_UNSUPPORTED, "binary messages are not supported");
        return 1;
    case GW_WS_PING:
        if (!ws->close_sent) send_frame(ws, GW_WS_PONG, payload, len);
        break;
    case GW_WS_PONG: break;
    case GW_WS_CLOSE:
        /* echo the code; a close without one is answered with an empty close */
        send_close(ws, close_code, NULL);
        return 1;
    }
    return ws->close_sent || ws->gone;
}

/* The parser's buffer is counted toward the server's buffered-bytes cap; past it the message is
 * refused (close 1013: try again later) and its buffer freed at once. */
static void ws_charge(gw_ws *ws) {
    if (!ws->parser || gw_conn_charge(ws->conn, gw_ws_parser_buffered(ws->parser)) == 0) return;
    CM_LOG_WARN("gw", "websocket message refused: the buffered-bytes cap is reached", "bytes=%zu",
                gw_ws_parser_buffered(ws->parser));
    send_close(ws, GW_WS_TRY_AGAIN, "server busy: message refused, try again later");
    gw_ws_parser_destroy(ws->parser);
    ws->parser = NULL;
    gw_conn_charge(ws->conn, 0);
}

static void ws_on_data(gw_conn *c, void *ud, const char *data, size_t len) {
    gw_ws *ws = ud;
    if (ws->close_sent || ws->gone || !ws->parser) return; /* after our close frame, input is ignored */
    uint64_t now = ws_now(ws);
    ws->last_rx = now;
    ws->ping_out = 0; /* whatever it sent, the peer is alive */
    ws->in_feed = 1;
    int r = gw_ws_parser_feed(ws->parser, data, len, NULL, on_frame, ws);
    ws->in_feed = 0;
    if (r < 0) {
        const char *why;
        int code = gw_ws_parser_error(ws->parser, &why);
        CM_LOG_DEBUG("gw", "websocket protocol error", "code=%d reason=\"%s\"", code, why ? why : "");
        send_close(ws, code, why);
        return;
    }
    if (ws->close_sent || ws->gone) return;
    ws->partial_since = gw_ws_parser_partial(ws->parser) ? (ws->partial_since ? ws->partial_since : now) : 0;
    ws_charge(ws);
}

/* Liveness, every tick: a ping after ping_ms without a byte from the client, and a close when it
 * stays unanswered for ping_ms more (a dead or stuck peer); a close after idle_ms without a
 * message either way while the application has nothing in progress; a close when a message
 * takes longer than message_ms to arrive (a trickle holding a buffer). */
static void ws_on_tick(gw_conn *c, void *ud) {
    gw_ws *ws = ud;
    if (ws->close_sent || ws->gone) return;
    uint64_t now = ws_now(ws);
    if (ws->message_ms && ws->partial_since && now - ws->partial_since >= ws->message_ms) {
        send_close(ws, GW_WS_POLICY, "message timeout");
        return;
    }
    if (ws->ping_ms && ws->ping_out && now - ws->ping_sent >= ws->ping_ms) {
        CM_LOG_DEBUG("gw", "websocket peer did not answer a ping", "ms=%llu", (unsigned long long)(now - ws->ping_sent));
        send_close(ws, GW_WS_GOING_AWAY, "ping timeout");
        return;
    }
    if (ws->idle_ms && !ws->busy && now - ws->last_active >= ws->idle_ms) {
        send_close(ws, GW_WS_GOING_AWAY, "idle timeout");
        return;
    }
    if (ws->ping_ms && !ws->ping_out && now - ws->last_rx >= ws->ping_ms) {
        uint8_t pl[8];
        for (int i = 0; i < 8; i++) pl[i] = (uint8_t)(now >> (8 * i));
        if (send_frame(ws, GW_WS_PING, (const char *)pl, sizeof pl) == 0) {
            ws->ping_out = 1;
            ws->ping_sent = now;
        }
    }
}

static void ws_on_close(gw_conn *c, void *ud) {
    gw_ws *ws = ud;
    ws->gone = 1;
    if (ws->ops->on_close) ws->ops->on_close(ws, ws->ud);
    gw_ws_parser_destroy(ws->parser);
    free(ws);
}

/* The server drains: close now when nothing is in progress, else when it ends (gw_ws_set_busy). */
static void ws_on_shutdown(gw_conn *c, void *ud) {
    gw_ws *ws = ud;
    ws->draining = 1;
    if (!ws->busy) send_close(ws, GW_WS_GOING_AWAY, "server shutting down");
}

/* Its slot went to a new connection (it was idle at the connection cap). */
static void ws_on_evict(gw_conn *c, void *ud) {
    send_close(ud, GW_WS_TRY_AGAIN, "server at its connection limit; reconnect later");
}

static const gw_upgrade_ops ws_upgrade_ops = {ws_on_data, ws_on_close, ws_on_shutdown, ws_on_evict, ws_on_tick};

int gw_ws_upgrade(gw_req *req, size_t max_message, const gw_ws_ops *ops, void *ud, gw_ws **out) {
    const char *why;
    int status = gw_ws_handshake_check(req, &why);
    if (status) {
        char body[256];
        int n = snprintf(body, sizeof body,
                         "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}", why);
        gw_resp_send(req, status, "application/json", body, (size_t)n, status == 426 ? "Sec-WebSocket-Version: 13\r\n" : NULL);
        return CM_EINVAL;
    }
    gw_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return CM_ENOMEM;
    if (gw_ws_parser_create(max_message, 1, &ws->parser)) {
        free(ws);
        return CM_ENOMEM;
    }
    ws->ops = ops;
    ws->ud = ud;
    char accept[29], head[256];
    gw_ws_accept_key(gw_req_header(req, "sec-websocket-key"), accept);
    snprintf(head, sizeof head,
             "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
             accept);
    int e = gw_conn_upgrade(req, head, &ws_upgrade_ops, ws, &ws->conn);
    if (e) {
        gw_ws_parser_destroy(ws->parser);
        free(ws);
        return e;
    }
    ws->last_rx = ws->last_active = ws_now(ws);
    gw_conn_set_evictable(ws->conn, 1);
    *out = ws;
    return 0;
}

int gw_ws_send_text(gw_ws *ws, const char *text, size_t len) {
    if (ws->close_sent || ws->gone) return CM_ENET;
    ws->last_active = ws_now(ws);
    return send_frame(ws, GW_WS_TEXT, text, len);
}

void gw_ws_set_liveness(gw_ws *ws, uint32_t ping_ms, uint32_t idle_ms, uint32_t message_ms) {
    if (ws->gone) return;
    ws->ping_ms = ping_ms;
    ws->idle_ms = idle_ms;
    ws->message_ms = message_ms;
    uint32_t tick = 0;
    const uint32_t all[3] = { ping_ms, idle_ms, message_ms };
    for (int i = 0; i < 3; i++)
        if (all[i] && (!tick || all[i] / 4 < tick)) tick = all[i] / 4;
    gw_conn_tick(ws->conn, tick ? (tick < 10 ? 10 : tick) : 0);
}

void gw_ws_set_busy(gw_ws *ws, int busy) {
    if (ws->gone || ws->busy == !!busy) return;
    ws->busy = !!busy;
    if (!busy) ws->last_active = ws_now(ws);
    gw_conn_set_evictable(ws->conn, !busy && !ws->close_sent);
    if (!busy && ws->draining) send_close(ws, GW_WS_GOING_AWAY, "server shutting down");
}

void gw_ws_close(gw_ws *ws, int code, const char *reason) { send_close(ws, code, reason); }
int gw_ws_closing(const gw_ws *ws) { return ws->close_sent || ws->gone; }
gw_server *gw_ws_server(const gw_ws *ws) { return gw_conn_server(ws->conn); }
