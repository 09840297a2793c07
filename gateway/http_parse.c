/* http_parse: HTTP/1.1 request parsing on top of llhttp, with the gateway's limits.
 *
 * llhttp does the grammar; this file keeps the pieces (target, headers, body) in bounded
 * buffers and turns llhttp's pauses into one result per feed. The parser pauses llhttp at the
 * end of every header block and every message, so the caller learns exactly which bytes belong
 * to the current request (the rest is the next pipelined request or an upgraded protocol). */
#include "gateway/http.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>

#include "common/cm_err.h"
#include "gateway/gw_internal.h"

#define PARSER_BODY_KEEP 16384 /* body buffer bytes kept across the requests of a connection */

enum phase { PH_IDLE = 0, PH_HEADERS, PH_BODY, PH_DONE, PH_ERROR };
enum ev { EV_NONE = 0, EV_HEADERS, EV_MESSAGE };

struct gw_http_parser {
    llhttp_t          ll;
    llhttp_settings_t set;
    size_t max_header, max_body;
    int    phase;
    int    ev;              /* what paused llhttp */
    int    err_status;
    const char *err_reason;
    int    expect_continue; /* GW_PARSE_CONTINUE still to be reported for this request */
    int    report_headers;  /* gw_http_parser_report_headers: GW_PARSE_HEADERS at each header block's end */
    int    again_pending;   /* llhttp paused at the headers' end: the next feed runs it on (even with no bytes) */
    int    wants_continue;  /* the current request asked for 100 Continue (and a body follows) */
    long long content_length; /* the current request's Content-Length, -1 when none */
    int    overflow;        /* 414/431 once a limit was passed; reported at the next *_complete */
    int    keep_alive;
    size_t raw_hdr;         /* raw bytes fed while the header block was incomplete */
    size_t trailer_bytes;
    /* header buffer: target\0 name\0value\0 ... (fixed size: pointers into it stay valid) */
    char  *hbuf;
    size_t hlen, hcap;
    uint32_t url_off, url_len;
    int    in_field;        /* a field name is being received */
    int    in_value;        /* a value is being received (name complete) */
    uint32_t name_off[GW__MAX_HEADERS], value_off[GW__MAX_HEADERS];
    int    nh;
    size_t body_cap;
    size_t body_want;       /* Content-Length + 1: the body buffer's exact size (0: grow by doubling) */
    gw_req req;
};

static int fail(gw_http_parser *p, int status, const char *reason) {
    if (p->phase != PH_ERROR) {
        p->phase = PH_ERROR;
        p->err_status = status;
        p->err_reason = reason;
    }
    return HPE_USER;
}

/* Limits are noted when passed and reported at the next *_complete callback: llhttp delivers
 * spans at buffer boundaries, so failing inside a span callback would make the status depend on
 * how the bytes were split (a grammar error later in the same span must win either way). Once
 * over, nothing more is stored. */
static void over(gw_http_parser *p, int status) {
    if (!p->overflow) p->overflow = status;
}

static void hbuf_add(gw_http_parser *p, const char *at, size_t len) {
    if (p->overflow || len > p->hcap - p->hlen) {
        over(p, 431);
        return;
    }
    memcpy(p->hbuf + p->hlen, at, len);
    p->hlen += len;
}

static int check_over(gw_http_parser *p) {
    if (!p->overflow) return 0;
    return fail(p, p->overflow, p->overflow == 414 ? "request target too long" : "request header fields too large");
}

static gw_http_parser *P(llhttp_t *ll) { return (gw_http_parser *)ll->data; }

static int on_message_begin(llhttp_t *ll) {
    gw_http_parser *p = P(ll);
    p->phase = PH_HEADERS;
    return 0;
}

static int on_url(llhttp_t *ll, const char *at, size_t len) {
    gw_http_parser *p = P(ll);
    /* The target alone over half the header budget is "URI too long". */
    if (p->url_len + len > p->hcap / 2) over(p, 414);
    hbuf_add(p, at, len);
    p->url_len += (uint32_t)len;
    return 0;
}

static int on_url_complete(llhttp_t *ll) {
    gw_http_parser *p = P(ll);
    hbuf_add(p, "", 1);
    return check_over(p);
}

static int on_header_value_complete(llhttp_t *ll);

static int on_header_field(llhttp_t *ll, const char *at, size_t len) {
    gw_http_parser *p = P(ll);
    if (p->phase != PH_HEADERS) { /* trailer fields of a chunked body: counted, not kept */
        p->trailer_bytes += len;
        if (p->trailer_bytes > p->max_header) over(p, 431);
        return 0;
    }
    if (!p->in_field) { /* the first span of a new field name */
        if (p->in_value && on_header_value_complete(ll)) return HPE_USER;
        if (p->nh == GW__MAX_HEADERS) {
            over(p, 431);
            return 0;
        }
        p->name_off[p->nh] = (uint32_t)p->hlen;
        p->value_off[p->nh] = UINT32_MAX;
        p->nh++;
        p->in_field = 1;
    }
    hbuf_add(p, at, len);
    return 0;
}

static int on_header_field_complete(llhttp_t *ll) {
    gw_http_parser *p = P(ll);
    if (check_over(p)) return HPE_USER;
    if (p->phase != PH_HEADERS) return 0;
    /* llhttp 8 lets ": value" through as a zero-length name span: refuse it */
    if (!p->in_field || p->hlen == p->name_off[p->nh - 1]) return fail(p, 400, "empty header name");
    hbuf_add(p, "", 1);
    if (check_over(p)) return HPE_USER;
    p->value_off[p->nh - 1] = (uint32_t)p->hlen;
    p->in_field = 0;
    p->in_value = 1;
    return 0;
}

static int on_header_value(llhttp_t *ll, const char *at, size_t len) {
    gw_http_parser *p = P(ll);
    if (p->phase != PH_HEADERS) {
        p->trailer_bytes += len;
        if (p->trailer_bytes > p->max_header) over(p, 431);
        return 0;
    }
    if (p->overflow) return 0;
    if (!p->in_value) return fail(p, 400, "header value without a name");
    hbuf_add(p, at, len);
    return 0;
}

static int on_header_value_complete(llhttp_t *ll) {
    gw_http_parser *p = P(ll);
    if (check_over(p)) return HPE_USER;
    if (p->phase != PH_HEADERS) return 0;
    if (!p->in_value) return fail(p, 400, "header value without a name");
    /* trim trailing whitespace (llhttp already skipped the leading one) */
    size_t start = p->value_off[p->nh - 1];
    while (p->hlen > start && (p->hbuf[p->hlen - 1] == ' ' || p->hbuf[p->hlen - 1] == '\t')) p->hlen--;
    hbuf_add(p, "", 1);
    if (check_over(p)) return HPE_USER;
    p->in_value = 0;
    return 0;
}

static int split_target(gw_http_parser *p) {
    char *url = p->hbuf + p->url_off;
    if (p->url_len == 0) return -1;
    if (url[0] != '/') {
        /* absolute-form "http://host/path" is allowed by RFC 9112; take its path */
        char *s = strstr(url, "://");
        if (!s) return strcmp(url, "*") == 0 ? 0 : -1;
        s = strchr(s + 3, '/');
        url = s ? s : (char *)"/";
    }
    char *q = strchr(url, '?');
    p->req.path = url;
    p->req.query = "";
    if (q) {
        *q = 0;
        p->req.query = q + 1;
    }
    char *hash = strchr(url, '#');
    if (hash) *hash = 0;
    return 0;
}

static int on_headers_complete(llhttp_t *ll) {
    gw_http_parser *p = P(ll);
    if (check_over(p)) return HPE_USER;
    if (p->phase != PH_HEADERS) return fail(p, 400, "unexpected header block");
    if (p->in_field) return fail(p, 400, "header without value");
    if (p->in_value && on_header_value_complete(ll)) return HPE_USER;
    gw_req *r = &p->req;
    r->method = ll->method;
    r->http_minor = ll->http_minor;
    if (ll->http_major != 1) return fail(p, 505, "HTTP version not supported");
    r->nh = p->nh;
    for (int i = 0; i < p->nh; i++) {
        r->h[i].name = p->hbuf + p->name_off[i];
        r->h[i].value = p->hbuf + p->value_off[i];
    }
    if (split_target(p)) return fail(p, 400, "bad request target");
    r->upgrade = ll->upgrade;
    p->keep_alive = llhttp_should_keep_alive(ll);
    r->keep_alive = p->keep_alive;
    if ((ll->flags & F_CONTENT_LENGTH) && ll->content_length > p->max_body)
        return fail(p, 413, "request body too large");
    p->content_length = (ll->flags & F_CONTENT_LENGTH) ? (long long)ll->content_length : -1;
    p->body_want = p->content_length > 0 ? (size_t)p->content_length + 1 : 0;
    const char *expect = gw_req_header(r, "expect");
    if (expect) {
        if (strcasecmp(expect, "100-continue") != 0) return fail(p, 417, "unsupported expectation");
        /* only worth a 100 when a body follows and the client speaks 1.1 */
        int body_follows = (ll->flags & F_CHUNKED) || ((ll->flags & F_CONTENT_LENGTH) && ll->content_length > 0);
        p->expect_continue = body_follows && r->http_minor >= 1;
        p->wants_continue = p->expect_continue;
    }
    p->phase = PH_BODY;
    p->ev = EV_HEADERS;
    return HPE_PAUSED;
}

static int on_body(llhttp_t *ll, const char *at, size_t len) {
    gw_http_parser *p = P(ll);
    gw_req *r = &p->req;
    if (len > p->max_body - r->body_len) return fail(p, 413, "request body too large");
    if (r->body_len + len + 1 > p->body_cap) {
        /* a Content-Length body gets its exact size at once; a chunked one doubles */
        size_t cap = p->body_want >= r->body_len + len + 1 ? p->body_want : p->body_cap > 4096 ? p->body_cap : 4096;
        while (cap < r->body_len + len + 1) cap *= 2;
        if (cap > p->max_body + 1) cap = p->max_body + 1;
        char *nb = realloc(r->body, cap);
        if (!nb) return fail(p, 500, "out of memory");
        r->body = nb;
        p->body_cap = cap;
    }
    memcpy(r->body + r->body_len, at, len);
    r->body_len += len;
    r->body[r->body_len] = 0;
    return 0;
}

static int on_message_complete(llhttp_t *ll) {
    gw_http_parser *p = P(ll);
    if (check_over(p)) return HPE_USER; /* trailers too large */
    p->phase = PH_DONE;
    p->ev = EV_MESSAGE;
    return HPE_PAUSED;
}

static void reset_req(gw_http_parser *p) {
    char *body = p->req.body;
    if (p->body_cap > PARSER_BODY_KEEP) { /* an idle connection keeps no large buffer */
        free(body);
        body = NULL;
        p->body_cap = 0;
    }
    memset(&p->req, 0, sizeof p->req);
    p->req.body = body;
    p->req.body_len = 0;
    if (body) body[0] = 0;
    p->body_want = 0;
    p->content_length = -1;
    p->wants_continue = 0;
    p->again_pending = 0;
    p->req.path = "";
    p->req.query = "";
    p->phase = PH_IDLE;
    p->ev = EV_NONE;
    p->expect_continue = 0;
    p->overflow = 0;
    p->keep_alive = 0;
    p->raw_hdr = 0;
    p->trailer_bytes = 0;
    p->hlen = 0;
    p->url_off = 0;
    p->url_len = 0;
    p->in_field = 0;
    p->in_value = 0;
    p->nh = 0;
}

int gw_http_parser_create(size_t max_header, size_t max_body, gw_http_parser **out) {
    *out = NULL;
    if (max_header < 256 || max_header > (64u << 20) || max_body > ((size_t)1 << 40)) return CM_EINVAL;
    gw_http_parser *p = calloc(1, sizeof *p);
    if (!p) return CM_ENOMEM;
    p->hcap = max_header;
    p->hbuf = malloc(p->hcap);
    if (!p->hbuf) {
        free(p);
        return CM_ENOMEM;
    }
    p->max_header = max_header;
    p->max_body = max_body;
    llhttp_settings_init(&p->set);
    p->set.on_message_begin = on_message_begin;
    p->set.on_url = on_url;
    p->set.on_url_complete = on_url_complete;
    p->set.on_header_field = on_header_field;
    p->set.on_header_field_complete = on_header_field_complete;
    p->set.on_header_value = on_header_value;
    p->set.on_header_value_complete = on_header_value_complete;
    p->set.on_headers_complete = on_headers_complete;
    p->set.on_body = on_body;
    p->set.on_message_complete = on_message_complete;
    llhttp_init(&p->ll, HTTP_REQUEST, &p->set);
    p->ll.data = p;
    reset_req(p);
    *out = p;
    return 0;
}

void gw_http_parser_destroy(gw_http_parser *p) {
    if (!p) return;
    free(p->req.body);
    free(p->hbuf);
    free(p);
}

static void count_header_bytes(gw_http_parser *p, size_t n) {
    if (p->phase != PH_IDLE && p->phase != PH_HEADERS) return;
    p->raw_hdr += n;
    /* llhttp skips some bytes without callbacks (leading CRLFs, optional whitespace); the raw
     * count bounds those too. Twice the budget leaves room for generous formatting. */
    if (p->raw_hdr > 2 * p->max_header) fail(p, 431, "request header fields too large");
}

static int map_llhttp_error(gw_http_parser *p, llhttp_errno_t e) {
    if (p->phase == PH_ERROR) return GW_PARSE_ERROR; /* our own callback failed */
    switch (e) {
    case HPE_INVALID_VERSION: fail(p, 505, "HTTP version not supported"); break;
    case HPE_PAUSED_H2_UPGRADE: fail(p, 505, "HTTP/2 is not supported"); break;
    default: fail(p, 400, llhttp_errno_name(e)); break;
    }
    return GW_PARSE_ERROR;
}

int gw_http_parser_feed(gw_http_parser *p, const char *data, size_t len, size_t *used) {
    size_t off = 0;
    *used = 0;
    if (p->phase == PH_ERROR) return GW_PARSE_ERROR;
    if (p->phase == PH_DONE) return GW_PARSE_REQUEST; /* caller forgot gw_http_parser_next */
    int again = p->again_pending; /* llhttp paused at the very end of the data with steps still to run */
    p->again_pending = 0;
    while (off < len || again) {
        again = 0;
        int hdr_phase = p->phase == PH_IDLE || p->phase == PH_HEADERS;
        size_t chunk = len - off;
        /* While the header block is open, never hand llhttp more than one byte past the raw
         * budget: the 431 then falls on the same byte however the input was split. */
        if (hdr_phase && chunk > 2 * p->max_header - p->raw_hdr + 1) chunk = 2 * p->max_header - p->raw_hdr + 1;
        llhttp_errno_t e = llhttp_execute(&p->ll, data + off, chunk);
        size_t n;
        if (e == HPE_OK) {
            n = chunk;
        } else {
            const char *pos = llhttp_get_error_pos(&p->ll);
            n = pos && pos >= data + off && pos <= data + off + chunk ? (size_t)(pos - (data + off)) : chunk;
        }
        if (hdr_phase) count_header_bytes(p, n);
        off += n;
        *used = off;
        if (p->phase == PH_ERROR) return GW_PARSE_ERROR;
        if (e == HPE_OK) {
            if (off < len) continue;
            return GW_PARSE_MORE;
        }
        if (e == HPE_PAUSED) {
            int ev = p->ev;
            p->ev = EV_NONE;
            llhttp_resume(&p->ll);
            if (ev == EV_MESSAGE) return GW_PARSE_REQUEST;
            if (ev == EV_HEADERS && p->report_headers) {
                p->expect_continue = 2; /* part of this report */
                p->again_pending = 1;   /* a request without a body completes at the next feed, bytes or not */
                return GW_PARSE_HEADERS;
            }
            if (ev == EV_HEADERS && p->expect_continue == 1) {
                p->expect_continue = 2; /* reported */
                return GW_PARSE_CONTINUE;
            }
            again = 1; /* a request without a body completes without another byte */
            continue;
        }
        if (e == HPE_PAUSED_UPGRADE) {
            /* Reached after the upgrade request itself was delivered and the caller chose to
             * keep speaking HTTP: carry on with the bytes that follow. */
            llhttp_resume_after_upgrade(&p->ll);
            again = off < len;
            continue;
        }
        return map_llhttp_error(p, e);
    }
    return p->phase == PH_DONE ? GW_PARSE_REQUEST : GW_PARSE_MORE;
}

void gw_http_parser_next(gw_http_parser *p) {
    if (p->phase == PH_ERROR) return;
    reset_req(p);
}

gw_req *gw_http_parser_req(gw_http_parser *p) { return &p->req; }

int gw_http_parser_error(const gw_http_parser *p, const char **reason) {
    if (reason) *reason = p->phase == PH_ERROR ? p->err_reason : NULL;
    return p->phase == PH_ERROR ? p->err_status : 0;
}

int gw_http_parser_pending(const gw_http_parser *p) { return p->again_pending; }

int gw_http_parser_busy(const gw_http_parser *p) {
    return p->phase == PH_HEADERS || p->phase == PH_BODY || (p->phase == PH_IDLE && p->raw_hdr > 0);
}

int gw_http_parser_headers_done(const gw_http_parser *p) { return p->phase == PH_BODY || p->phase == PH_DONE; }

void gw_http_parser_report_headers(gw_http_parser *p, int on) { p->report_headers = on; }
int gw_http_parser_wants_continue(const gw_http_parser *p) { return p->wants_continue; }
long long gw_http_parser_content_length(const gw_http_parser *p) { return p->content_length; }
size_t gw_http_parser_buffered(const gw_http_parser *p) { return p->body_cap; }

char *gw_http_parser_take_body(gw_http_parser *p, size_t *len, size_t *cap) {
    char *b = p->req.body;
    *len = p->req.body_len;
    *cap = p->body_cap;
    p->req.body = NULL;
    p->req.body_len = 0;
    p->body_cap = 0;
    return b;
}

int gw_http_parser_keep_alive(const gw_http_parser *p) { return p->keep_alive; }

/* ---- request accessors (shared with http.c) ---- */

int gw_req_method(const gw_req *r) { return r->method; }
const char *gw_req_method_name(const gw_req *r) { return llhttp_method_name((llhttp_method_t)r->method); }
const char *gw_req_path(const gw_req *r) { return r->path ? r->path : ""; }
const char *gw_req_query(const gw_req *r) { return r->query ? r->query : ""; }
int gw_req_http_minor(const gw_req *r) { return r->http_minor; }
int gw_req_is_upgrade(const gw_req *r) { return r->upgrade; }

const char *gw_req_header(const gw_req *r, const char *name) {
    for (int i = 0; i < r->nh; i++)
        if (strcasecmp(r->h[i].name, name) == 0) return r->h[i].value;
    return NULL;
}

int gw_req_header_count(const gw_req *r) { return r->nh; }

void gw_req_header_at(const gw_req *r, int i, const char **name, const char **value) {
    *name = r->h[i].name;
    *value = r->h[i].value;
}

const char *gw_req_body(const gw_req *r, size_t *len) {
    if (len) *len = r->body_len;
    return r->body ? r->body : "";
}
