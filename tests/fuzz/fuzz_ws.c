/* fuzz_ws: libFuzzer target for the WebSocket frame parser.
 *
 *   make build-fuzz && build-fuzz/bin/fuzz_ws -max_total_time=120 -max_len=4096   (tests/fuzz/README.md)
 *
 * Byte 0 picks the message limit (64..16384 bytes) and whether masks are required; the rest is
 * the byte stream from a client. Checked: the stream parsed whole and in random pieces yields
 * the same events and the same close code; messages never exceed the limit; text messages and
 * close reasons are valid UTF-8; control payloads are at most 125 bytes; close codes are ones
 * RFC 6455 allows (or 1005 for none); error codes are 1002, 1007, 1009 or 1011. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/ws.h"

typedef struct trace {
    char  *s;
    size_t len, cap;
    size_t max;
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

static int on_frame(void *ud, int opcode, const char *payload, size_t len, int code) {
    trace *t = ud;
    switch (opcode) {
    case GW_WS_TEXT:
        if (!gw_ws_utf8_valid(payload, len)) abort();
        /* fall through */
    case GW_WS_BINARY:
        if (len > t->max) abort();
        break;
    case GW_WS_PING:
    case GW_WS_PONG:
        if (len > 125) abort();
        break;
    case GW_WS_CLOSE:
        if (len > 123 || !gw_ws_utf8_valid(payload, len)) abort();
        if (code != GW_WS_NO_STATUS && !((code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
                                         (code >= 3000 && code <= 4999)))
            abort();
        break;
    default: abort();
    }
    uint8_t h[16];
    memcpy(h, &opcode, 4);
    memcpy(h + 4, &code, 4);
    uint64_t l = len;
    memcpy(h + 8, &l, 8);
    tr_add(t, h, sizeof h);
    tr_add(t, payload, len);
    return 0;
}

static int run(const uint8_t *data, size_t size, size_t max, int mask, uint32_t seed, int chunked, trace *t) {
    gw_ws_parser *p;
    if (gw_ws_parser_create(max, mask, &p)) abort();
    t->max = max;
    uint32_t x = seed | 1;
    int r = 0;
    for (size_t off = 0; off < size && r == 0;) {
        size_t piece = size - off;
        if (chunked) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            piece = 1 + x % 23;
            if (piece > size - off) piece = size - off;
        }
        size_t used;
        r = gw_ws_parser_feed(p, (const char *)data + off, piece, &used, on_frame, t);
        if (r == 0 && used != piece) abort();
        off += piece;
    }
    int code = gw_ws_parser_error(p, NULL);
    if (r < 0 && code != 1002 && code != 1007 && code != 1009 && code != 1011) abort();
    if (r < 0 && gw_ws_parser_feed(p, "\x81\x80\0\0\0\0", 6, NULL, on_frame, t) != -1) abort();
    gw_ws_parser_destroy(p);
    return r < 0 ? code : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t max = (size_t)64 << (data[0] & 7);
    int mask = !(data[0] & 8);
    uint32_t seed = 2166136261u;
    for (size_t i = 0; i < size && i < 16; i++) seed = (seed ^ data[i]) * 16777619u;
    trace a = {0}, b = {0};
    int ca = run(data + 1, size - 1, max, mask, seed, 0, &a);
    int cb = run(data + 1, size - 1, max, mask, seed, 1, &b);
    if (ca != cb || a.len != b.len || (a.len && memcmp(a.s, b.s, a.len) != 0)) {
        fprintf(stderr, "whole vs pieces differ: code %d vs %d\n", ca, cb);
        abort();
    }
    free(a.s);
    free(b.s);
    return 0;
}
