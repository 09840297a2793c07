/* fuzz_http: libFuzzer target for the gateway's HTTP request parsing (llhttp plus our limits,
 * header storage, chunked bodies, pipelining, 100-continue and upgrade handling), the WebSocket
 * handshake check, and the OpenAI body parser on every request body that comes out.
 *
 *   make build-fuzz && build-fuzz/bin/fuzz_http -max_total_time=120 -max_len=8192   (tests/fuzz/README.md)
 *
 * Checked: the input parsed in one piece, in pieces of random sizes (seeded by the input), and in
 * pieces with every header block's end reported (GW_PARSE_HEADERS, as the server parses) gives
 * the same requests (method, target, headers, body) and the same final error status;
 * every request respects the limits; every error status is one the server may send. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/http.h"
#include "gateway/openai.h"
#include "gateway/ws.h"

#define MAX_HEADER 1024
#define MAX_BODY   4096

typedef struct trace {
    char  *s;
    size_t len, cap;
} trace;

static void tr_add(trace *t, const void *p, size_t n) {
    if (t->len + n > t->cap) {
        t->cap = (t->len + n) * 2 + 256;
        t->s = realloc(t->s, t->cap);
        if (!t->s) abort();
    }
    memcpy(t->s + t->len, p, n);
    t->len += n;
}

static void tr_str(trace *t, const char *s) { tr_add(t, s, strlen(s) + 1); }

static void check_request(gw_req *r, trace *t) {
    size_t blen;
    const char *body = gw_req_body(r, &blen);
    if (blen > MAX_BODY || body[blen] != 0) abort();
    if (gw_req_header_count(r) > 100) abort();
    char m[32];
    snprintf(m, sizeof m, "%d %d %d|", gw_req_method(r), gw_req_http_minor(r), gw_req_is_upgrade(r));
    tr_str(t, m);
    tr_str(t, gw_req_path(r));
    tr_str(t, gw_req_query(r));
    size_t hbytes = 0;
    for (int i = 0; i < gw_req_header_count(r); i++) {
        const char *n, *v;
        gw_req_header_at(r, i, &n, &v);
        if (!*n) abort(); /* llhttp refuses empty names */
        hbytes += strlen(n) + strlen(v);
        tr_str(t, n);
        tr_str(t, v);
        if (gw_req_header(r, n) == NULL) abort();
    }
    if (hbytes > MAX_HEADER) abort();
    tr_add(t, body, blen);
    const char *why;
    int st = gw_ws_handshake_check(r, &why);
    if (st != 0 && st != 400 && st != 426) abort();
    if (st == 0) {
        char acc[29];
        gw_ws_accept_key(gw_req_header(r, "sec-websocket-key"), acc);
        if (strlen(acc) != 28) abort();
    }
    for (int kind = 0; kind < 2; kind++) {
        gw_oai_req q;
        gw_oai_err e;
        int rc = gw_oai_parse(kind, body, blen, &q, &e);
        if (rc == 0) {
            if (q.n < 1 || q.n > GW_OAI_N_MAX || q.n_stop > GW_OAI_STOP_MAX || !q.model) abort();
            gw_oai_req_free(&q);
        } else {
            if (e.status != 400 && e.status != 500) abort();
            char *js = gw_oai_error_json(&e);
            free(js);
        }
    }
}

/* Parses data in pieces (step() gives piece sizes; NULL: one piece). Returns the final status.
 * report: the server's way, with GW_PARSE_HEADERS at every header block's end. */
static int run(const uint8_t *data, size_t size, uint32_t seed, int chunked, int report, trace *t) {
    gw_http_parser *p;
    if (gw_http_parser_create(MAX_HEADER, MAX_BODY, &p)) abort();
    gw_http_parser_report_headers(p, report);
    size_t off = 0, avail = 0; /* bytes [off, avail) are fed, as the server's buffer would hold them */
    int status = 0;
    uint32_t x = seed | 1;
    while (off < size) {
        size_t piece = size - avail;
        if (chunked) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            piece = 1 + x % 97;
            if (piece > size - avail) piece = size - avail;
        }
        avail += piece;
        for (;;) {
            size_t used = 0;
            int r = gw_http_parser_feed(p, (const char *)data + off, avail - off, &used);
            if (used > avail - off) abort();
            off += used;
            if (r == GW_PARSE_MORE) {
                if (off != avail) abort();
                break;
            }
            if (r == GW_PARSE_CONTINUE) {
                if (report) abort(); /* folded into GW_PARSE_HEADERS */
                tr_str(t, "100");
                continue;
            }
            if (r == GW_PARSE_HEADERS) {
                if (!report || !gw_http_parser_headers_done(p)) abort();
                if (gw_http_parser_wants_continue(p)) tr_str(t, "100");
                continue; /* the next feed runs on, bytes or not */
            }
            if (r == GW_PARSE_ERROR) {
                const char *why;
                status = gw_http_parser_error(p, &why);
                if (status != 400 && status != 413 && status != 414 && status != 417 && status != 431 && status != 505 &&
                    status != 500)
                    abort();
                if (!why) abort();
                goto out;
            }
            check_request(gw_http_parser_req(p), t);
            if (gw_req_is_upgrade(gw_http_parser_req(p)) && gw_ws_handshake_check(gw_http_parser_req(p), NULL) == 0) {
                tr_str(t, "upgrade");
                goto out; /* the rest belongs to the WebSocket */
            }
            gw_http_parser_next(p);
            if (off == avail) break;
        }
    }
out:
    gw_http_parser_destroy(p);
    return status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t seed = 2166136261u;
    for (size_t i = 0; i < size && i < 16; i++) seed = (seed ^ data[i]) * 16777619u;
    trace a = {0}, b = {0}, c = {0};
    int sa = run(data, size, seed, 0, 0, &a);
    int sb = run(data, size, seed, 1, 0, &b);
    int sc = run(data, size, seed, 1, 1, &c); /* pieces, with the headers reported as the server has them */
    if (sa != sb || a.len != b.len || (a.len && memcmp(a.s, b.s, a.len) != 0)) {
        fprintf(stderr, "whole vs pieces differ: status %d vs %d, trace %zu vs %zu bytes\n", sa, sb, a.len, b.len);
        abort();
    }
    if (sa != sc || a.len != c.len || (a.len && memcmp(a.s, c.s, a.len) != 0)) {
        fprintf(stderr, "with headers reported: status %d vs %d, trace %zu vs %zu bytes\n", sa, sc, a.len, c.len);
        abort();
    }
    free(a.s);
    free(b.s);
    free(c.s);
    return 0;
}
