/* http: the gateway's HTTP/1.1 server on a libuv loop.
 *
 * One gw_server listens on a TCP address and hands every complete request to one handler
 * callback. Everything runs on the loop's thread; no function here is thread-safe except
 * gw_server_stop_async().
 *
 * What the server does for the handler:
 * - keep-alive and pipelining: requests on one connection are handled one at a time, in order;
 *   bytes of the next request wait in the connection's input buffer until the current response
 *   has been ended, so responses always go out in request order;
 * - limits: header bytes (431, or 414 for the request target alone), body bytes (413, also
 *   up front from Content-Length or before answering `Expect: 100-continue`), header timeout
 *   (408 then close), body timeouts (the longest pause between body bytes, and the whole body
 *   from the end of its headers: 408 then close), keep-alive idle timeout (silent close);
 * - request bytes buffered by all connections together (bodies being received or parsed, and
 *   upgraded protocols' messages, gw_conn_charge): a body whose Content-Length does not fit what
 *   is left, or a chunked body that grows past it, gets 503 with Retry-After before (or instead
 *   of) being read;
 * - connections: at the cap, a new connection takes the slot of the least recently active idle
 *   one (a keep-alive connection waiting for its next request, else an upgraded one its protocol
 *   marked evictable); with none idle it is served only for the probe paths (GET/HEAD /health,
 *   /ready, /metrics by default; a few such connections at once), anything else gets 503 +
 *   Retry-After; a client address (an IPv6 /64) holds at most max_conns_per_ip connections
 *   (loopback is never capped; 503 beyond);
 * - on_headers: the handler may answer (401, 503) or hold a request as soon as its headers are
 *   in, before a byte of its body is read;
 * - bodies with Content-Length or chunked transfer coding (decoded), `Expect: 100-continue`
 *   (417 for any other expectation);
 * - a malformed request gets 400 and the connection is closed after the response (lingering
 *   close: write side shut down, input drained briefly); a protocol error closes that one client,
 *   never the server;
 * - responses: status line, Date, Content-Type, Content-Length (or chunked transfer coding for
 *   streams; close-delimited for HTTP/1.0 clients), Connection; HEAD gets the headers only;
 * - back-pressure: a streaming response whose unsent bytes exceed write_queue_cap is cut off and
 *   the connection closed (a slow reader cannot make the gateway buffer without bound);
 * - graceful shutdown (gw_server_shutdown, SIGINT/SIGTERM with gw_server_handle_signals): close
 *   idle connections, let in-flight requests finish (their responses carry `Connection: close`)
 *   while still accepting connections, so that probes hear 503 (the handler sees
 *   gw_server_draining) and new requests are refused with it; at drain_timeout_ms on_drain_deadline
 *   lets the handler end what is still running (an SSE error event, say), then what is left is
 *   closed; once nothing runs, the listener and every handle close so uv_run() returns.
 *
 * A request (gw_req) is owned by its connection. The handler may answer it at once or later
 * (from any loop callback) with gw_resp_send() or gw_resp_stream_*(); the request is valid until
 * the response has been ended or until its abort callback ran, whichever comes first. The abort
 * callback (gw_req_on_abort) runs when the connection is lost before the response ended (client
 * gone, slow reader cut off, shutdown timeout); it always runs from the loop, never from inside a
 * gw_resp_* call; after it the request must not be touched.
 *
 *   static void handle(gw_req *r, void *ud) {
 *       gw_resp_send(r, 200, "text/plain", "hi\n", 3, NULL);
 *   }
 *   gw_http_cfg cfg; gw_http_cfg_default(&cfg);
 *   cfg.port = 8080; cfg.handler = handle;
 *   gw_server *s; if (gw_server_create(loop, &cfg, &s)) ...;
 *   gw_server_handle_signals(s);
 *   uv_run(loop, UV_RUN_DEFAULT);   // returns after a signal has drained the server
 *   gw_server_destroy(s);
 */
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

typedef struct gw_server gw_server;
typedef struct gw_req gw_req;
typedef struct gw_conn gw_conn;

/* Called on the loop thread for every complete request. */
typedef void (*gw_handler_fn)(gw_req *req, void *ud);
/* Called when a connection holding an upgraded (WebSocket) conversation closes; see ws.h. */

/* on_headers verdicts */
enum { GW_HDR_GO = 0, GW_HDR_ANSWERED = 1, GW_HDR_HOLD = 2 };

typedef struct gw_http_cfg {
    const char *host;            /* listen address, numeric IPv4 or IPv6 ("127.0.0.1") */
    int         port;            /* 0: ephemeral (read back with gw_server_port) */
    int         backlog;         /* listen(2) backlog */
    int         max_conns;       /* open connections (then idle ones are evicted; see above) */
    int         max_conns_per_ip; /* connections per client address (IPv6: /64); 0: no cap; loopback: never */
    int         cap_loopback;    /* 1: max_conns_per_ip applies to loopback clients too (tests) */
    size_t      max_header;      /* bytes of request line + headers (431 beyond) */
    size_t      max_body;        /* bytes of a request body after chunked decoding (413 beyond) */
    size_t      max_buffered;    /* request bytes buffered by all connections together (503 beyond) */
    uint32_t    header_timeout_ms; /* from a request's first byte (or accept) to its last header */
    uint32_t    idle_timeout_ms; /* keep-alive idle */
    uint32_t    body_idle_ms;    /* the longest pause while a body arrives */
    uint32_t    body_timeout_ms; /* a whole body, from the end of its headers */
    size_t      write_queue_cap; /* unsent bytes a streaming response may have queued */
    uint32_t    drain_timeout_ms; /* graceful shutdown: on_drain_deadline, then close, after this */
    const char *const *probe_paths; /* served beyond the connection cap (GET/HEAD), NULL-terminated;
                                     * NULL: /health, /ready, /metrics */
    gw_handler_fn handler;
    void       *ud;              /* passed to handler */
    /* Optional: a request's header block is complete and no body byte has been read. Return
     * GW_HDR_GO to read the body (then the handler gets the request as usual), GW_HDR_ANSWERED
     * after answering it with gw_resp_send (its body is never read: the connection closes after
     * the response), or GW_HDR_HOLD to stop reading until gw_req_resume(req) (go on) or
     * gw_resp_send (answered as above), from any later loop callback; the abort callback runs
     * if the client leaves meanwhile. Loop thread. */
    int       (*on_headers)(gw_req *req, void *ud);
    /* Optional: the drain deadline passed with requests still running: end them now (an error
     * event, a 503); whatever is still open afterwards is closed. Loop thread. */
    void      (*on_drain_deadline)(void *ud);
    /* Optional: called as each response head to a request is written (status 101 for an
     * upgrade; not for the server's own protocol-error answers), with the request's path; for
     * metrics. Loop thread; must not touch the request. */
    void      (*on_response)(void *ud, const char *path, int status);
} gw_http_cfg;

/* Defaults: 127.0.0.1:8080, backlog 511, 1024 connections, 256 per client address, 16 KiB
 * headers, 8 MiB bodies, 256 MiB buffered, 10 s header timeout, 60 s idle, 10 s body pause,
 * 60 s body, 4 MiB write queue, 30 s drain. Can't fail. */
void gw_http_cfg_default(gw_http_cfg *cfg);

/* Creates the server on loop, binds and listens. cfg is copied (host too). Returns 0,
 * CM_EINVAL (bad address, no handler, zero limits), CM_ENET (bind/listen failed; the libuv
 * reason is logged), CM_ENOMEM. Loop thread. */
int gw_server_create(uv_loop_t *loop, const gw_http_cfg *cfg, gw_server **out);

/* The bound port (useful with port 0). Can't fail. */
int gw_server_port(const gw_server *s);
uv_loop_t *gw_server_loop(const gw_server *s);

/* Installs SIGINT and SIGTERM handlers that start a graceful shutdown. Returns 0 or CM_ENET. */
int gw_server_handle_signals(gw_server *s);

/* Starts a graceful shutdown (idempotent). When the last connection has closed, every handle
 * of the server is closed and on_closed (if set) runs; uv_run then returns unless the caller
 * has handles of its own. Loop thread. */
void gw_server_shutdown(gw_server *s);
void gw_server_on_closed(gw_server *s, void (*cb)(gw_server *s, void *ud), void *ud);

/* Thread-safe: asks the loop thread to start a graceful shutdown. */
void gw_server_stop_async(gw_server *s);

/* 1 once the shutdown has completed (all handles closed). */
int gw_server_closed(const gw_server *s);

/* Frees the server. Only after the shutdown completed (or before uv_run ever ran the loop with
 * it: then the handles are closed and the loop must run once more to finish; prefer shutdown).
 * Accepts NULL. */
void gw_server_destroy(gw_server *s);

/* Counters (loop thread, or any thread for a racy but atomic-per-field read). */
typedef struct gw_server_stats {
    uint64_t conns_open;      /* connections being served (rejected ones not included) */
    uint64_t conns_total;     /* accepted and served */
    uint64_t conns_rejected;  /* accepted and answered 503 because of max_conns */
    uint64_t requests_total;  /* requests handed to the handler */
    uint64_t errors_total;    /* protocol errors answered 4xx/5xx by the server itself */
    uint64_t slow_readers;    /* connections cut off by the write-queue cap */
    uint64_t evicted;         /* idle connections closed to make room at the cap */
    uint64_t probes_beyond_cap; /* connections beyond the cap served for a probe path */
    uint64_t over_buffered;   /* requests refused because max_buffered was reached */
    uint64_t buffered;        /* request bytes buffered now */
} gw_server_stats;
void gw_server_stats_get(const gw_server *s, gw_server_stats *st);

/* 1 while shutting down (handlers may refuse new work with 503). */
int gw_server_draining(const gw_server *s);

/* ---- requests -------------------------------------------------------------------------- */

/* Method as llhttp's enum llhttp_method (HTTP_GET, HTTP_POST, ...), and its name. */
int         gw_req_method(const gw_req *r);
const char *gw_req_method_name(const gw_req *r);
/* Path of the request target without the query ("/v1/models"), NUL-terminated. */
const char *gw_req_path(const gw_req *r);
/* Query string without '?', "" when none. */
const char *gw_req_query(const gw_req *r);
/* First header with this name (case-insensitive), value NUL-terminated without surrounding
 * whitespace, or NULL. */
const char *gw_req_header(const gw_req *r, const char *name);
/* Number of headers and the i-th name/value (for iteration). */
int         gw_req_header_count(const gw_req *r);
void        gw_req_header_at(const gw_req *r, int i, const char **name, const char **value);
/* Body bytes (decoded from chunked), NUL-terminated for convenience; *len may be NULL. */
const char *gw_req_body(const gw_req *r, size_t *len);
/* HTTP minor version (0 or 1). */
int         gw_req_http_minor(const gw_req *r);
/* 1 when the request asked for a protocol upgrade (Connection: upgrade + Upgrade). */
int         gw_req_is_upgrade(const gw_req *r);
uv_loop_t  *gw_req_loop(const gw_req *r);
gw_server  *gw_req_server(const gw_req *r);

/* After on_headers held req: read its body and hand it to the handler as usual. Loop thread. */
void        gw_req_resume(gw_req *r);
/* Moves the (complete) request body to the caller, who free()s it and then gives its charge back
 * with gw_server_uncharge(server, *charge): until then it counts toward max_buffered. The body
 * reads as empty afterwards. */
char       *gw_req_take_body(gw_req *r, size_t *len, size_t *charge);
void        gw_server_uncharge(gw_server *s, size_t charge);

/* Sets the callback that runs if the connection is lost before the response ended; cb NULL
 * detaches (do that before ending a response whose state is freed right after, so a failed final
 * write can never leave a callback pointing at freed state). */
void gw_req_on_abort(gw_req *r, void (*cb)(gw_req *r, void *ud), void *ud);

/* ---- responses ------------------------------------------------------------------------- */

/* Sends a complete response and ends the request. extra_headers: NULL or complete header lines
 * ("Name: value\r\n..."). Status text comes from the code. Returns 0, CM_ESTATE (a response was
 * already started/ended: nothing changes), CM_ENET (connection lost), CM_ENOMEM or CM_EINVAL
 * (response could not be built: the connection is closed). Except after
 * CM_ESTATE, the request is over when this returns, whatever the result: the abort callback will
 * not run, and the handler may free its state. */
int gw_resp_send(gw_req *r, int status, const char *content_type, const char *body, size_t len,
                 const char *extra_headers);

/* Starts a streaming response (chunked for HTTP/1.1, close-delimited for HTTP/1.0).
 * Returns as gw_resp_send. */
int gw_resp_stream_start(gw_req *r, int status, const char *content_type, const char *extra_headers);

/* Queues len bytes of a started stream (len 0 is a no-op). Returns 0, CM_ESTATE, CM_ENET
 * (connection lost or cut off because the unsent bytes would exceed write_queue_cap; the abort
 * callback will run from the loop), CM_ENOMEM. */
int gw_resp_stream_write(gw_req *r, const char *data, size_t len);

/* Ends a started stream and the request. Returns 0, CM_ESTATE, CM_ENET. As with gw_resp_send,
 * the request is over afterwards (except after CM_ESTATE): no abort callback follows. */
int gw_resp_stream_end(gw_req *r);

/* Reason phrase for a status code ("Not Found"); "Unknown" for codes not in the table. */
const char *gw_http_status_text(int status);

/* ---- upgrade (for ws.c) ------------------------------------------------------------------ */

/* Hooks of an upgraded connection. on_data gets every byte read after the upgrade response
 * (including bytes that arrived with the request); on_close runs once from the loop when the
 * connection is gone. ud is the upgraded protocol's state. */
typedef struct gw_upgrade_ops {
    void (*on_data)(gw_conn *c, void *ud, const char *data, size_t len);
    void (*on_close)(gw_conn *c, void *ud);
    void (*on_shutdown)(gw_conn *c, void *ud); /* server is draining: say goodbye when done */
    void (*on_evict)(gw_conn *c, void *ud);    /* its slot went to a new connection: say goodbye now */
    void (*on_tick)(gw_conn *c, void *ud);     /* gw_conn_tick's period passed */
} gw_upgrade_ops;

/* Sends response_head (a complete "HTTP/1.1 101 ...\r\n...\r\n\r\n") and switches the request's
 * connection to the upgraded protocol; the request ends. Returns 0, CM_ESTATE, CM_ENET. The
 * connection then belongs to ops until on_close. */
int gw_conn_upgrade(gw_req *r, const char *response_head, const gw_upgrade_ops *ops, void *ud, gw_conn **out);

/* Writes raw bytes on an upgraded connection. Returns 0, CM_ENET (closed, or the write queue
 * would exceed write_queue_cap: the connection is being closed), CM_ENOMEM. */
int gw_conn_write(gw_conn *c, const char *data, size_t len);
/* Closes an upgraded connection after the queued bytes have been written (lingering close).
 * on_close runs later from the loop. */
void gw_conn_close(gw_conn *c);
gw_server *gw_conn_server(const gw_conn *c);
/* Marks an upgraded connection as idle (evictable: at the cap its slot may go to a new
 * connection, on_evict saying goodbye) or busy. Least recently marked goes first. */
void gw_conn_set_evictable(gw_conn *c, int on);
/* Calls on_tick every ms milliseconds (0: stop). */
void gw_conn_tick(gw_conn *c, uint32_t ms);
/* The upgraded protocol now buffers bytes in all (its partial message): counted toward
 * max_buffered. Returns 0, or CM_EFULL when that would pass max_buffered (nothing is charged
 * then; the caller should refuse the message). */
int  gw_conn_charge(gw_conn *c, size_t bytes);

/* ---- the request parser (pure: no I/O; exposed for tests and fuzzing) ------------------- */

typedef struct gw_http_parser gw_http_parser;

enum gw_parse_result {
    GW_PARSE_MORE = 0,      /* everything consumed, the request is not complete yet */
    GW_PARSE_CONTINUE,      /* headers done and the client expects "100 Continue" before the body */
    GW_PARSE_REQUEST,       /* a request is complete: read it through gw_http_parser_req() */
    GW_PARSE_ERROR,         /* malformed or over a limit: gw_http_parser_error() gives the status */
    GW_PARSE_HEADERS,       /* with gw_http_parser_report_headers on: a header block is complete and
                             * no body byte is consumed yet (the request reads as complete except
                             * its body); instead of GW_PARSE_CONTINUE: see wants_continue */
};

/* Creates a parser with the given limits (max_header >= 256, max_body >= 0). Returns 0,
 * CM_EINVAL, CM_ENOMEM. */
int  gw_http_parser_create(size_t max_header, size_t max_body, gw_http_parser **out);
void gw_http_parser_destroy(gw_http_parser *p); /* accepts NULL */

/* Feeds bytes. *used is set to how many bytes were consumed; bytes after *used belong to the next
 * request (or, after an upgrade request, to the new protocol) and must be fed again later.
 * After GW_PARSE_REQUEST, call gw_http_parser_next() before feeding more. After
 * GW_PARSE_ERROR every later feed returns GW_PARSE_ERROR. */
int  gw_http_parser_feed(gw_http_parser *p, const char *data, size_t len, size_t *used);
/* Prepares for the next request on the same connection. */
void gw_http_parser_next(gw_http_parser *p);
/* The complete request (valid until gw_http_parser_next / destroy). */
gw_req *gw_http_parser_req(gw_http_parser *p);
/* After GW_PARSE_ERROR: the status to answer (400, 408, 413, 414, 417, 431, 505) and a short reason. */
int  gw_http_parser_error(const gw_http_parser *p, const char **reason);
/* 1 when a request has started (bytes seen) but is not complete (for timeouts). */
int  gw_http_parser_busy(const gw_http_parser *p);
/* 1 once the current request's headers are complete. */
int  gw_http_parser_headers_done(const gw_http_parser *p);
/* 1 when the connection may stay open after the current request (keep-alive). */
int  gw_http_parser_keep_alive(const gw_http_parser *p);
/* Report every header block's end with GW_PARSE_HEADERS (on = 1; off by default). */
void gw_http_parser_report_headers(gw_http_parser *p, int on);
/* 1 after GW_PARSE_HEADERS: the next feed has work even without new bytes (call it with len 0). */
int  gw_http_parser_pending(const gw_http_parser *p);
/* The current request asked for "100 Continue" before its body. */
int  gw_http_parser_wants_continue(const gw_http_parser *p);
/* The current request's Content-Length, -1 when it has none (chunked or no body). */
long long gw_http_parser_content_length(const gw_http_parser *p);
/* Bytes the parser holds for request bodies (its body buffer's size; a Content-Length body gets
 * exactly Content-Length + 1, a chunked one grows by doubling; at most 16 KiB stay between
 * requests). */
size_t gw_http_parser_buffered(const gw_http_parser *p);
/* Moves the current (complete) request's body to the caller (free() it); the request's body
 * reads as empty afterwards. *cap: its allocation size. */
char *gw_http_parser_take_body(gw_http_parser *p, size_t *len, size_t *cap);

#endif
