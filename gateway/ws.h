/* ws: WebSocket (RFC 6455) for the gateway: handshake, frame parsing and building, and a
 * connection wrapper over an upgraded HTTP connection.
 *
 * Server side only: client frames must be masked; server frames are not. No extensions (RSV bits
 * must be 0), no subprotocols. Fragmented messages are reassembled (control frames may arrive
 * between fragments) up to max_message bytes (close 1009 beyond); text messages must be valid
 * UTF-8 (close 1007). Protocol violations close with 1002. Pings are answered with pongs; a
 * close frame is answered with a close frame echoing the code, then the TCP connection is shut.
 * The message being reassembled counts toward the server's buffered-bytes cap (close 1013
 * beyond); gw_ws_set_liveness adds pings, an idle timeout and a message timeout.
 *
 * Loop thread only, like http.h.
 *
 *   static void on_msg(gw_ws *ws, void *ud, const char *text, size_t len) { gw_ws_send_text(ws, text, len); }
 *   static void on_close(gw_ws *ws, void *ud) { ... cancel work; ws is freed after this returns ... }
 *   gw_ws_ops ops = { on_msg, on_close };
 *   // inside the HTTP handler for GET /v1/ws:
 *   if (gw_ws_upgrade(req, 1 << 20, &ops, state, &ws)) return;  // an error response was sent
 */
#ifndef GW_WS_H
#define GW_WS_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/http.h"

enum gw_ws_opcode { GW_WS_CONT = 0x0, GW_WS_TEXT = 0x1, GW_WS_BINARY = 0x2, GW_WS_CLOSE = 0x8, GW_WS_PING = 0x9, GW_WS_PONG = 0xA };

enum gw_ws_close_code {
    GW_WS_NORMAL = 1000,
    GW_WS_GOING_AWAY = 1001,
    GW_WS_PROTOCOL_ERROR = 1002,
    GW_WS_UNSUPPORTED = 1003,
    GW_WS_NO_STATUS = 1005,    /* never sent: a close frame without a code */
    GW_WS_ABNORMAL = 1006,     /* never sent: the connection dropped */
    GW_WS_INVALID_DATA = 1007,
    GW_WS_POLICY = 1008,
    GW_WS_TOO_BIG = 1009,
    GW_WS_INTERNAL = 1011,
    GW_WS_TRY_AGAIN = 1013,    /* the server is at a limit (connections, buffered bytes) */
};

/* Sec-WebSocket-Accept for a client's Sec-WebSocket-Key: base64(SHA-1(key + GUID)), 28 chars +
 * NUL into out. Can't fail. */
void gw_ws_accept_key(const char *client_key, char out[29]);

/* Checks a request for a valid WebSocket handshake (GET, HTTP/1.1, Upgrade: websocket,
 * Connection: upgrade, Sec-WebSocket-Version: 13, a Sec-WebSocket-Key of 16 base64 bytes).
 * Returns 0, or the HTTP status to refuse with (400; 426 for a wrong version) and a reason. */
int gw_ws_handshake_check(const gw_req *r, const char **reason);

/* ---- frame parser (pure; exposed for tests and fuzzing) ----------------------------------- */

/* Called for each complete message (GW_WS_TEXT/BINARY, reassembled) and control frame
 * (PING/PONG payload, CLOSE with code (GW_WS_NO_STATUS when absent) and reason). The payload is
 * valid only during the call. Return non-zero to stop parsing (feed then returns 1). */
typedef int (*gw_ws_frame_cb)(void *ud, int opcode, const char *payload, size_t len, int close_code);

typedef struct gw_ws_parser gw_ws_parser;

/* max_message: largest reassembled message; require_mask: 1 for a server. Returns 0, CM_ENOMEM. */
int  gw_ws_parser_create(size_t max_message, int require_mask, gw_ws_parser **out);
void gw_ws_parser_destroy(gw_ws_parser *p); /* accepts NULL */
/* Feeds bytes. Returns 0 (all consumed), 1 (a callback asked to stop; *used tells how far), or
 * -1 on a violation: gw_ws_parser_error() gives the close code to send (1002, 1007, 1009) and a
 * reason. After -1 every feed returns -1. used may be NULL. */
int  gw_ws_parser_feed(gw_ws_parser *p, const char *data, size_t len, size_t *used, gw_ws_frame_cb cb, void *ud);
int  gw_ws_parser_error(const gw_ws_parser *p, const char **reason);

/* Writes a server frame header (FIN set, no mask) for a payload of len bytes into hdr (10 bytes
 * max); returns the header length. Can't fail. */
size_t gw_ws_frame_header(int opcode, size_t len, uint8_t hdr[10]);

/* Bytes the parser holds for the message being reassembled (its buffer's size; a buffer past
 * 64 KiB is freed once its message is delivered). */
size_t gw_ws_parser_buffered(const gw_ws_parser *p);
/* 1 while a message or frame is partly received. */
int  gw_ws_parser_partial(const gw_ws_parser *p);

/* 1 when s[0..len) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int gw_ws_utf8_valid(const char *s, size_t len);

/* ---- connections -------------------------------------------------------------------------- */

typedef struct gw_ws gw_ws;

typedef struct gw_ws_ops {
    /* A complete text message. Binary messages are refused with close 1003. */
    void (*on_message)(gw_ws *ws, void *ud, const char *text, size_t len);
    /* The connection is gone (closed by either side, or lost). Runs once, from the loop; the ws is
     * freed after it returns. */
    void (*on_close)(gw_ws *ws, void *ud);
} gw_ws_ops;

/* Validates the handshake of req and, if good, answers 101 and turns the connection into a
 * WebSocket. On a bad handshake answers 400/426 itself and returns CM_EINVAL. Must be called
 * from inside the HTTP handler callback. Returns 0, CM_EINVAL, CM_ENET, CM_ENOMEM. */
int gw_ws_upgrade(gw_req *req, size_t max_message, const gw_ws_ops *ops, void *ud, gw_ws **out);

/* Sends a text message (one frame). Returns 0, CM_ENET (closing/closed, or cut off because the
 * client does not read: the connection is then closing), CM_ENOMEM. */
int gw_ws_send_text(gw_ws *ws, const char *text, size_t len);

/* Liveness (0 turns each off): a ping after ping_ms without a byte from the client, closed (1001)
 * when no byte answers within ping_ms more; closed (1001 "idle timeout") after idle_ms without a
 * message either way while not busy; closed (1008) when a message takes longer than message_ms
 * to arrive. Call once after gw_ws_upgrade. */
void gw_ws_set_liveness(gw_ws *ws, uint32_t ping_ms, uint32_t idle_ms, uint32_t message_ms);
/* The application has work in progress on ws (busy = 1) or not. An idle connection may be
 * closed (1013) to make room for a new one at the server's connection cap; during a drain it
 * closes (1001) as soon as it is not busy. */
void gw_ws_set_busy(gw_ws *ws, int busy);

/* Starts the closing handshake with code and a reason (<= 123 bytes; longer is cut). Messages
 * received afterwards are ignored; on_close follows. Idempotent. */
void gw_ws_close(gw_ws *ws, int code, const char *reason);

/* 1 once a close frame was sent or the connection is gone. */
int gw_ws_closing(const gw_ws *ws);
gw_server *gw_ws_server(const gw_ws *ws);

#endif
