/* loadgen: `arka bench serve`, a load generator for an OpenAI-compatible server, measured as vLLM's
 * benchmark_serving measures.
 *
 *   arka bench serve --url http://127.0.0.1:8080 --requests 200 --rate 4 --prompt-len 256 \
 *                    --max-tokens 128 [--concurrency 32] [--json out.json]
 *
 * Threads: the main thread parses options, asks GET /v1/models for a model name (unless
 * --model), then releases requests at Poisson arrival times (seeded) to a pool of
 * min(concurrency, requests) worker threads. A worker runs one request at a time on its own
 * connection: POST /v1/completions with "stream": true, a minimal HTTP/1.1 client (plain
 * POSIX sockets with a per-request deadline; a Content-Length request; a chunked or
 * close-delimited response) and an SSE reader that reassembles lines across reads. A request
 * that arrives while every worker is busy waits for one, as under vLLM's --max-concurrency;
 * its clock starts when it is sent.
 *
 * Definitions (vLLM's): TTFT = send → first chunk with non-empty text; ITL = gaps between
 * successive content chunks; TPOT = (e2e − TTFT) / (output tokens − 1), for requests with
 * more than one output token; e2e = send → data: [DONE]. Output tokens are the usage chunk's
 * completion_tokens, or the number of content chunks when the server sends no usage. TTFT,
 * TPOT and e2e percentiles are exact (linear interpolation, as numpy's default); ITL
 * percentiles come from a log histogram with 1 % wide bins, so memory does not grow with the
 * token count (the ITL mean is exact). A request fails on a connection error, a timeout, a
 * status other than 200, an error event, or a stream that ends without [DONE]; failures are
 * counted and the first one's message is reported.
 *
 * Prompts: --prompt-len words drawn from 64 common four-letter English words, one token each
 * in the usual vocabularies (the usage chunk's prompt_tokens gives the real count, reported as
 * a mean). Every request gets its own random words so that a server's prefix cache cannot
 * serve one request from another, unless --prefix-len puts the same words before each. The
 * body is streamed from a fixed buffer, so the prompt length bounds time, not memory. The
 * usage's prompt_tokens_details.cached_tokens is reported when the server gives it.
 *
 * Workloads (--workload):
 *   random         (default) as above.
 *   shared-prefix  every prompt starts with the same --prefix-len words (default 2000: a
 *                  system prompt), then its own --prompt-len words.
 *   multi-turn     --users conversations at once, --turns requests each, one after the other:
 *                  each turn sends the conversation so far (its --prefix-len words, then every
 *                  earlier turn's words and the server's answer to them) and --prompt-len new
 *                  words. --requests is users x turns.
 *   tenants        fair share: first tenant B alone (--api-key-b) sends --b-requests requests
 *                  --b-interval seconds apart; then tenant A (--api-key) sends --requests all at
 *                  once while B goes on sending one every --b-interval seconds until A's last
 *                  request ends. Reports A, B alone and B beside A, and the ratio of B's TTFT.
 *
 * Memory: 40 bytes of results per request; per worker a 64 KiB read buffer, a 16 KiB write
 * buffer, an SSE line and event buffer each capped at 256 KiB, the current request's gaps
 * (at most 4 × max-tokens + 64) and a 19 KiB histogram. Exit codes: 0 when the run finished
 * with at least one successful request, 1 on a runtime error or when every request failed,
 * 2 on a usage error. */
#include "bench/loadgen.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "common/cm_file.h"
#include "common/cm_json.h"
#include "common/cm_time.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQUESTS    1000000
#define MAX_WARMUP      10000
#define MAX_CONCURRENCY 1024
#define MAX_PROMPT_LEN  (1 << 20)       /* words */
#define MAX_OUT_TOKENS  (1 << 20)
#define MAX_NAME        1024            /* --model, --api-key */
#define READ_BUF        (64 * 1024)     /* per worker: socket reads */
#define HEAD_CAP        (16 * 1024)     /* response status line + headers */
#define WRITE_BUF       (16 * 1024)     /* per worker: request header + streamed body */
#define LINE_CAP        (256 * 1024)    /* one SSE line; one event's data */
#define ERRBODY_CAP     4096            /* kept of a non-200 body, for the message */
#define MODELS_CAP      (1 << 20)       /* GET /v1/models body */
#define CONV_CAP        (16 << 20)      /* multi-turn: a conversation's text; its request body */
#define MAX_B_BESIDE    100000          /* tenants: B's requests during A's run, at most */
#define WORKER_STACK    (256 * 1024)
#define HIST_BINS       2400            /* bin 0: < 1 µs; bin i: [1 µs·1.01^(i-1), 1 µs·1.01^i), up to ~6 h */
#define HIST_MIN        1e-6
#define HIST_STEP       1.01

/* 64 common English words of exactly four letters, packed: with its leading space each is one
 * token in the usual Llama and GPT vocabularies, and a fixed width makes the body length known
 * before the words are drawn. */
static const char WORDS[] =
    "timethatwithhavethisfromtheywere" "saidwhatyourwhenthemwilleachmany"
    "somemakelikelonglookmoremadeover" "downonlyfindwordcallcomemostknow"
    "thanthenintojustalsobackheregood" "yearworkevenwantwelltakegivelife"
    "homehandhighkeeplastnameneedopen" "readshowsidetellturncitydoorface";
_Static_assert(sizeof WORDS == 64 * 4 + 1, "64 words of four letters");

/* ---- small helpers ------------------------------------------------------------------------ */

/* A byte buffer that grows by doubling up to max bytes (NUL included); NUL-terminated after
 * every append. Returns 0, CM_ETOOBIG past the cap, or CM_ENOMEM. */
typedef struct {
    char  *p;
    size_t len, cap, max;
} gbuf;

static int gbuf_add(gbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        if (b->len + n + 1 > b->max) return CM_ETOOBIG;
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->len + n + 1) c *= 2;
        if (c > b->max) c = b->max;
        char *q = realloc(b->p, c);
        if (!q) return CM_ENOMEM;
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

/* splitmix64: the arrival times and the prompt words. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_u01(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

/* strerror for worker threads (the GNU strerror_r returns the message pointer). */
static const char *errstr(int e, char *buf, size_t len) { return strerror_r(e, buf, len); }

/* Copies the first line of s[0..n) into out, control characters replaced by spaces: server
 * text inside our one-line messages. Can't fail. */
static void copy_line(char *out, size_t outlen, const char *s, size_t n) {
    size_t j = 0;
    for (size_t i = 0; i < n && s[i] != '\n' && j + 1 < outlen; i++)
        out[j++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? ' ' : s[i];
    if (outlen) out[j] = 0;
}

/* Writes s as a JSON string (quotes included). */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* Appends s as a JSON string body (no quotes) to b. */
static int gbuf_json_str(gbuf *b, const char *s) {
    int rc = 0;
    for (; *s && !rc; s++) {
        unsigned char c = (unsigned char)*s;
        char e[8];
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; rc = gbuf_add(b, e, 2); }
        else if (c < 0x20) { snprintf(e, sizeof e, "\\u%04x", c); rc = gbuf_add(b, e, 6); }
        else rc = gbuf_add(b, (const char *)&c, 1);
    }
    return rc;
}

/* ---- the server's address ------------------------------------------------------------------ */

typedef struct {
    char                    authority[300]; /* host[:port] as in the URL: the Host header */
    char                    prefix[1024];   /* path before /v1/..., no trailing slash */
    struct sockaddr_storage addr;
    socklen_t               addr_len;
} target;

/* Parses http://HOST[:PORT][/PREFIX] (a trailing "/" or "/v1" is dropped, so both the server's
 * root and its /v1 base work). CM_EINVAL with a message for a URL we do not take. */
static int target_parse(target *t, const char *url, char *host, size_t hostlen, char *port, size_t portlen,
                        char *err, size_t errlen) {
    if (strncmp(url, "http://", 7)) {
        snprintf(err, errlen, "only http:// URLs are supported (no TLS): '%s'", url);
        return CM_EINVAL;
    }
    const char *a = url + 7;
    size_t alen = strcspn(a, "/?#");
    if (!alen || alen >= sizeof t->authority || memchr(a, '@', alen)) {
        snprintf(err, errlen, "bad host in URL '%s'", url);
        return CM_EINVAL;
    }
    memcpy(t->authority, a, alen);
    t->authority[alen] = 0;
    const char *h = t->authority, *colon;
    size_t hlen;
    if (*h == '[') { /* [IPv6]:port */
        const char *close = strchr(h, ']');
        if (!close || (close[1] && close[1] != ':')) {
            snprintf(err, errlen, "bad host in URL '%s'", url);
            return CM_EINVAL;
        }
        h++;
        hlen = (size_t)(close - h);
        colon = close[1] ? close + 1 : NULL;
    } else {
        colon = strchr(h, ':');
        hlen = colon ? (size_t)(colon - h) : strlen(h);
    }
    const char *p = colon ? colon + 1 : "80";
    char *end;
    long pn = strtol(p, &end, 10);
    if (!hlen || hlen >= hostlen || !*p || *end || pn < 1 || pn > 65535 || strspn(p, "0123456789") != strlen(p)) {
        snprintf(err, errlen, "bad host or port in URL '%s'", url);
        return CM_EINVAL;
    }
    memcpy(host, h, hlen);
    host[hlen] = 0;
    snprintf(port, portlen, "%ld", pn);
    const char *path = a + alen;
    size_t plen = strcspn(path, "?#");
    if (path[plen] || plen >= sizeof t->prefix) {
        snprintf(err, errlen, "the URL must be a base URL without query or fragment: '%s'", url);
        return CM_EINVAL;
    }
    memcpy(t->prefix, path, plen);
    while (plen && t->prefix[plen - 1] == '/') plen--;
    if (plen >= 3 && !memcmp(t->prefix + plen - 3, "/v1", 3)) plen -= 3;
    t->prefix[plen] = 0;
    return 0;
}

/* Resolves host:port once, at start-up; every request connects to the first address. */
static int target_resolve(target *t, const char *host, const char *port, char *err, size_t errlen) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *ai;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(e));
        return CM_ENET;
    }
    memcpy(&t->addr, ai->ai_addr, ai->ai_addrlen);
    t->addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* ---- sockets with a deadline ----------------------------------------------------------------- */

/* Waits until fd is ready for ev (or has an error) or the deadline (monotonic seconds) passes.
 * Returns 0, CM_ETIMEOUT, or CM_ENET (errno set). */
static int wait_fd(int fd, short ev, double deadline) {
    for (;;) {
        double left = deadline - cm_time_s();
        if (left <= 0) return CM_ETIMEOUT;
        struct pollfd p = { .fd = fd, .events = ev };
        int ms = left > 3600 ? 3600000 : (int)(left * 1000) + 1;
        int r = poll(&p, 1, ms);
        if (r > 0) return 0; /* ready or failed: the next call on fd says which */
        if (r < 0 && errno != EINTR) return CM_ENET;
    }
}

/* Opens a non-blocking TCP connection to t. *out owns the socket (close it). */
static int conn_open(const target *t, double deadline, int *out, char *err, size_t errlen) {
    char eb[128];
    int fd = socket(t->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", errstr(errno, eb, sizeof eb));
        return CM_ENET;
    }
    int one = 1, e = 0;
    /* The header and the body's first words leave in separate writes: without this, Nagle's
     * algorithm and the server's delayed ACK can hold the request back ~40 ms. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)&t->addr, t->addr_len)) {
        if (errno != EINPROGRESS) {
            e = errno;
            goto fail;
        }
        int rc = wait_fd(fd, POLLOUT, deadline);
        if (rc == CM_ETIMEOUT) {
            snprintf(err, errlen, "connect to %.200s: request timed out", t->authority);
            close(fd);
            return rc;
        }
        socklen_t l = sizeof e;
        if (rc) e = errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l)) e = errno;
        if (e) goto fail;
    }
    *out = fd;
    return 0;
fail:
    snprintf(err, errlen, "connect to %.200s: %s", t->authority, errstr(e, eb, sizeof eb));
    close(fd);
    return CM_ENET;
}

static int send_all(int fd, const char *p, size_t n, double deadline, char *err, size_t errlen) {
    char eb[128];
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc == CM_ETIMEOUT) snprintf(err, errlen, "request timed out while sending");
            else if (rc) snprintf(err, errlen, "poll: %s", errstr(errno, eb, sizeof eb));
            if (rc) return rc;
            continue;
        }
        snprintf(err, errlen, "send: %s", errstr(k < 0 ? errno : EPIPE, eb, sizeof eb));
        return CM_ENET;
    }
    return 0;
}

/* Reads what is available (waiting up to the deadline): *got = bytes, 0 at end of stream. */
static int recv_some(int fd, char *buf, size_t cap, double deadline, size_t *got, char *err, size_t errlen) {
    char eb[128];
    for (;;) {
        ssize_t k = recv(fd, buf, cap, 0);
        if (k >= 0) {
            *got = (size_t)k;
            return 0;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(err, errlen, "recv: %s", errstr(errno, eb, sizeof eb));
            return CM_ENET;
        }
        int rc = wait_fd(fd, POLLIN, deadline);
        if (rc == CM_ETIMEOUT) snprintf(err, errlen, "request timed out waiting for the server");
        else if (rc) snprintf(err, errlen, "poll: %s", errstr(errno, eb, sizeof eb));
        if (rc) return rc;
    }
}

/* ---- HTTP/1.1 response ---------------------------------------------------------------------- */

/* Receives body bytes in order, with the time of the read that brought them. Returns 0 to go
 * on, 1 when it has seen enough (the reader stops), or a negative code with err set. */
typedef int (*body_fn)(void *ud, const char *p, size_t n, double now, char *err, size_t errlen);

enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER };

typedef struct {
    int      fd;
    double   deadline;
    char    *buf;        /* [cap] caller's read buffer */
    size_t   cap, len, off; /* bytes in buf; bytes of them consumed */
    int      status;
    int      chunked;
    int64_t  left;       /* Content-Length bytes still to come, or -1: close-delimited */
    int      ch_state;   /* chunked decoding: CH_* */
    uint64_t ch_left;    /* bytes left in the current chunk */
    char     ch_line[64];/* chunk size line being assembled */
    size_t   ch_line_len;/* bytes of the current line (may exceed the storage: trailers) */
} http_in;

static int parse_header(http_in *in, char *line, char *err, size_t errlen) {
    char *colon = strchr(line, ':');
    if (!colon) return 0;
    char *v = colon + 1;
    v += strspn(v, " \t");
    size_t nlen = (size_t)(colon - line);
    if (nlen == 17 && !strncasecmp(line, "transfer-encoding", 17)) {
        in->chunked = strcasestr(v, "chunked") != NULL;
    } else if (nlen == 14 && !strncasecmp(line, "content-length", 14)) {
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        end += strspn(end, " \t");
        if (errno || end == v || *end || n < 0 || *v == '-' || *v == '+') {
            snprintf(err, errlen, "bad Content-Length '%.40s'", v);
            return CM_EFORMAT;
        }
        in->left = n;
    }
    return 0;
}

/* Reads the status line and headers (at most HEAD_CAP bytes). Body bytes read with them stay
 * in buf from off on. */
static int http_read_head(http_in *in, char *err, size_t errlen) {
    char *end;
    while (!(end = memmem(in->buf, in->len, "\r\n\r\n", 4))) {
        if (in->len >= HEAD_CAP) {
            snprintf(err, errlen, "response headers over %d KiB", HEAD_CAP / 1024);
            return CM_ETOOBIG;
        }
        size_t got;
        int rc = recv_some(in->fd, in->buf + in->len, HEAD_CAP - in->len, in->deadline, &got, err, errlen);
        if (rc) return rc;
        if (!got) {
            snprintf(err, errlen, in->len ? "connection closed inside the response headers"
                                          : "connection closed before any response");
            return CM_ENET;
        }
        in->len += got;
    }
    in->off = (size_t)(end - in->buf) + 4;
    *end = 0; /* the head is now one string; the body starts after it */
    if (sscanf(in->buf, "HTTP/1.%*d %d", &in->status) != 1) {
        char l[80];
        copy_line(l, sizeof l, in->buf, strlen(in->buf));
        snprintf(err, errlen, "not an HTTP/1.x response: '%s'", l);
        return CM_EFORMAT;
    }
    in->left = -1;
    for (char *line = strstr(in->buf, "\r\n"); line;) {
        line += 2;
        char *next = strstr(line, "\r\n");
        if (next) *next = 0;
        int rc = parse_header(in, line, err, errlen);
        if (rc) return rc;
        line = next;
    }
    in->ch_state = CH_SIZE;
    return 0;
}

/* Decodes one run of chunked bytes. 0 to go on, 1 at the end of the body or when fn stopped. */
static int dechunk(http_in *in, const char *p, size_t n, body_fn fn, void *ud, double now, char *err, size_t errlen) {
    size_t i = 0;
    while (i < n) {
        if (in->ch_state == CH_DATA) {
            size_t m = n - i < in->ch_left ? n - i : (size_t)in->ch_left;
            int rc = fn(ud, p + i, m, now, err, errlen);
            i += m;
            in->ch_left -= m;
            if (!in->ch_left) in->ch_state = CH_DATA_END;
            if (rc) return rc;
            continue;
        }
        char c = p[i++]; /* size line, the CRLF after data, or trailer lines */
        if (c != '\n') {
            if (c != '\r') {
                if (in->ch_line_len + 1 < sizeof in->ch_line) in->ch_line[in->ch_line_len] = c;
                in->ch_line_len++;
            }
            continue;
        }
        size_t ll = in->ch_line_len;
        in->ch_line_len = 0;
        if (in->ch_state == CH_TRAILER) {
            if (!ll) return 1;
        } else if (in->ch_state == CH_DATA_END) {
            if (ll) goto bad;
            in->ch_state = CH_SIZE;
        } else {
            if (!ll || ll + 1 >= sizeof in->ch_line) goto bad;
            in->ch_line[ll] = 0;
            char *end;
            errno = 0;
            unsigned long long size = strtoull(in->ch_line, &end, 16);
            if (errno || !strchr("0123456789abcdefABCDEF", in->ch_line[0]) || (*end && *end != ';' && *end != ' '))
                goto bad;
            in->ch_left = size;
            in->ch_state = size ? CH_DATA : CH_TRAILER;
        }
    }
    return 0;
bad:
    snprintf(err, errlen, "bad chunked encoding in the response");
    return CM_EFORMAT;
}

/* Feeds the body to fn until it ends or fn stops: 0, or a negative code with err set. */
static int http_read_body(http_in *in, body_fn fn, void *ud, char *err, size_t errlen) {
    double now = cm_time_s();
    for (;;) {
        if (!in->chunked && in->left == 0) return 0;
        if (in->off < in->len) {
            const char *p = in->buf + in->off;
            size_t n = in->len - in->off;
            in->off = in->len;
            int rc;
            if (in->chunked) {
                rc = dechunk(in, p, n, fn, ud, now, err, errlen);
            } else {
                if (in->left > 0 && (uint64_t)n > (uint64_t)in->left) n = (size_t)in->left;
                if (in->left > 0) in->left -= (int64_t)n;
                rc = fn(ud, p, n, now, err, errlen);
            }
            if (rc) return rc < 0 ? rc : 0;
            continue;
        }
        size_t got;
        int rc = recv_some(in->fd, in->buf, in->cap, in->deadline, &got, err, errlen);
        if (rc) return rc;
        now = cm_time_s();
        if (!got) {
            if (!in->chunked && in->left < 0) return 0; /* close-delimited body: done */
            snprintf(err, errlen, "connection closed in the middle of the response");
            return CM_ENET;
        }
        in->off = 0;
        in->len = got;
    }
}

/* body_fn keeping the first bytes of a body in a gbuf; stops quietly when it is full. */
static int keep_prefix(void *ud, const char *p, size_t n, double now, char *err, size_t errlen) {
    gbuf *b = ud;
    size_t room = b->max - 1 - b->len;
    int full = n >= room;
    if (gbuf_add(b, p, full ? room : n)) {
        snprintf(err, errlen, "out of memory");
        return CM_ENOMEM;
    }
    return full;
}

/* body_fn keeping a whole body in a gbuf; a body over the cap is an error. */
static int keep_all(void *ud, const char *p, size_t n, double now, char *err, size_t errlen) {
    int rc = gbuf_add(ud, p, n);
    if (rc == CM_ETOOBIG) snprintf(err, errlen, "response over %zu bytes", ((gbuf *)ud)->max - 1);
    else if (rc) snprintf(err, errlen, "out of memory");
    return rc;
}

/* The message of an error body: its error.message (OpenAI's shape) or "error" string, else
 * its first line. */
static void error_text(const char *body, size_t len, char *out, size_t outlen) {
    cm_json_doc *d;
    char jerr[64];
    if (len && !cm_json_parse(body, len, &d, jerr, sizeof jerr)) {
        const cm_json *e = cm_json_get(cm_json_root(d), "error");
        const char *m = NULL;
        if (e && e->type == CM_JSON_STRING) m = e->str;
        else if (e) cm_json_get_str(e, "message", &m);
        if (m) copy_line(out, outlen, m, strlen(m));
        cm_json_free(d);
        if (m) return;
    }
    copy_line(out, outlen, body, len);
}

/* ---- the benchmark ----------------------------------------------------------------------- */

typedef struct {
    double  ttft, e2e, tpot; /* seconds; ttft < 0 when no text came, tpot < 0 with fewer than two output tokens */
    int32_t prompt_tokens;   /* from usage; -1 when the server sent none */
    int32_t output_tokens;
    int32_t cached_tokens;   /* usage.prompt_tokens_details.cached_tokens; -1 when the server sent none */
    int32_t ok;
} req_result;

typedef struct { /* the request a worker is running */
    double  t_send, t_first, t_last, t_done;
    int64_t chunks;          /* content chunks (non-empty text) */
    int64_t prompt_tokens, completion_tokens, cached_tokens;
    int     have_usage, have_cached;
    int     done;            /* data: [DONE] seen */
} req_state;

enum { WL_RANDOM, WL_SHARED, WL_MULTI, WL_TENANTS };

typedef struct bench bench;

typedef struct {
    bench    *b;
    pthread_t th;
    char     *rbuf;          /* [READ_BUF] */
    char     *wbuf;          /* [WRITE_BUF] */
    size_t    wlen;          /* bytes waiting in wbuf */
    gbuf      line;          /* SSE line being assembled */
    gbuf      event;         /* data of the SSE event being assembled */
    int       ev_has;        /* the event has a data field */
    gbuf      errbody;       /* start of a non-200 body */
    float    *gaps;          /* [gaps_cap] the current request's ITLs, seconds */
    size_t    n_gaps, gaps_cap, gaps_max;
    req_state r;
    uint64_t  hist[HIST_BINS]; /* ITLs of successful requests */
    double    itl_sum;
    uint64_t  itl_n;
    /* multi-turn: the conversation so far, the request's body, the answer's text */
    gbuf      conv, body, answer;
} worker;

struct bench {
    /* options (read-only once workers run) */
    const char *url, *model, *api_key, *json_path;
    double      rate, timeout;
    int64_t     seed;
    int         n, prompt_len, max_tokens, concurrency, warmup;
    int         workload;    /* WL_* */
    int         prefix_len;  /* words every prompt starts with (the same for all) */
    int         users, turns;/* multi-turn */
    double      interval;    /* > 0: arrivals this many seconds apart (tenants' B) instead of Poisson */
    volatile int *until;     /* not NULL: stop releasing requests once it is set (B beside A's flood) */
    target      tgt;
    char       *body_head;   /* {"model":"…","prompt":" */
    char       *body_tail;   /* malloc'ed */
    const char *response_format; /* --response-format FILE's JSON, or NULL */
    size_t      body_head_len, body_tail_len;
    req_result *res;         /* [n] */
    worker     *w;           /* [n_workers] */
    int         n_workers;
    int         conc;        /* effective concurrency of the measured run: min(--concurrency, n) */
    int         record;      /* this phase's results count (0 during warm-up) */
    uint64_t    tag;         /* mixed into prompt seeds: warm-up prompts differ from measured ones */
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int64_t     phase_n, released, taken;
    int         stop;
    int64_t     failed;
    char        first_err[300];
};

static int hist_bin(double x) {
    if (!(x >= HIST_MIN)) return 0;
    double k = log(x / HIST_MIN) / log(HIST_STEP);
    return k + 1 < HIST_BINS ? 1 + (int)k : HIST_BINS - 1;
}

static double hist_value(int i) { return i ? HIST_MIN * pow(HIST_STEP, i - 0.5) : 0; }

/* Buffers n request bytes, sending when the buffer fills. */
static int out_put(worker *w, int fd, const char *p, size_t n, double deadline, char *err, size_t errlen) {
    if (w->wlen + n > WRITE_BUF) {
        int rc = send_all(fd, w->wbuf, w->wlen, deadline, err, errlen);
        if (rc) return rc;
        w->wlen = 0;
        if (n > WRITE_BUF) return send_all(fd, p, n, deadline, err, errlen);
    }
    memcpy(w->wbuf + w->wlen, p, n);
    w->wlen += n;
    return 0;
}

/* The word stream of request idx: the shared prefix's (the same for every request of the
 * run), then its own. */
static uint64_t prefix_rng(const bench *b) { return (uint64_t)b->seed * 0x9e3779b97f4a7c15ull ^ 0x5052454649580000ull; }
static uint64_t own_rng(const bench *b, int64_t idx) {
    uint64_t rng = (uint64_t)b->seed * 0x9e3779b97f4a7c15ull ^ b->tag ^ ((uint64_t)idx << 1);
    rng_next(&rng);
    return rng;
}

static void next_word(uint64_t *rng, char word[5]) {
    word[0] = ' ';
    memcpy(word + 1, WORDS + 4 * (rng_next(rng) >> 58), 4);
}

/* The request line and headers of a POST /v1/completions with a body of len bytes. */
static int send_head(worker *w, int fd, size_t len, double deadline, char *err, size_t errlen) {
    const bench *b = w->b;
    char head[2 * MAX_NAME + 1024];
    int hn = snprintf(head, sizeof head,
                      "POST %s/v1/completions HTTP/1.1\r\nHost: %s\r\nUser-Agent: arka-bench\r\n"
                      "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n%s%s%s\r\n",
                      b->tgt.prefix, b->tgt.authority, len, b->api_key ? "Authorization: Bearer " : "",
                      b->api_key ? b->api_key : "", b->api_key ? "\r\n" : "");
    w->wlen = 0;
    return out_put(w, fd, head, (size_t)hn, deadline, err, errlen);
}

/* Sends POST /v1/completions with request idx's prompt, drawn word by word. */
static int send_completion(worker *w, int fd, int64_t idx, double deadline, char *err, size_t errlen) {
    const bench *b = w->b;
    int n_words = b->prefix_len + b->prompt_len;
    size_t body = b->body_head_len + (size_t)n_words * 5 - 1 + b->body_tail_len;
    int rc = send_head(w, fd, body, deadline, err, errlen);
    if (!rc) rc = out_put(w, fd, b->body_head, b->body_head_len, deadline, err, errlen);
    uint64_t pre = prefix_rng(b), own = own_rng(b, idx);
    for (int i = 0; i < n_words && !rc; i++) {
        char word[5];
        next_word(i < b->prefix_len ? &pre : &own, word);
        rc = i ? out_put(w, fd, word, 5, deadline, err, errlen) : out_put(w, fd, word + 1, 4, deadline, err, errlen);
    }
    if (!rc) rc = out_put(w, fd, b->body_tail, b->body_tail_len, deadline, err, errlen);
    if (!rc) rc = send_all(fd, w->wbuf, w->wlen, deadline, err, errlen);
    return rc;
}

/* Sends the body w->body holds (a multi-turn conversation). */
static int send_body(worker *w, int fd, double deadline, char *err, size_t errlen) {
    int rc = send_head(w, fd, w->body.len, deadline, err, errlen);
    if (!rc) rc = send_all(fd, w->wbuf, w->wlen, deadline, err, errlen);
    if (!rc) rc = send_all(fd, w->body.p, w->body.len, deadline, err, errlen);
    return rc;
}

/* Handles one SSE event's data: 0, 1 at [DONE], or a negative code with err set. */
static int on_event(worker *w, const char *data, size_t len, double now, char *err, size_t errlen) {
    req_state *r = &w->r;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->t_done = now;
        r->done = 1;
        return 1;
    }
    cm_json_doc *d;
    char jerr[96];
    if (cm_json_parse(data, len, &d, jerr, sizeof jerr)) {
        snprintf(err, errlen, "bad JSON in the stream: %s", jerr);
        return CM_EFORMAT;
    }
    const cm_json *root = cm_json_root(d), *e = cm_json_get(root, "error");
    int rc = 0;
    if (e && e->type != CM_JSON_NULL) {
        const char *m = e->type == CM_JSON_STRING ? e->str : NULL;
        if (!m && cm_json_get_str(e, "message", &m)) m = "(no message)";
        char msg[200];
        copy_line(msg, sizeof msg, m, strlen(m));
        snprintf(err, errlen, "error event: %s", msg);
        rc = CM_EIO;
        goto out;
    }
    const cm_json *text = cm_json_get(cm_json_at(cm_json_get(root, "choices"), 0), "text");
    if (text && text->type == CM_JSON_STRING && text->str_len && w->b->workload == WL_MULTI &&
        gbuf_add(&w->answer, text->str, text->str_len)) {
        snprintf(err, errlen, "an answer over %zu bytes", w->answer.max - 1);
        rc = CM_ETOOBIG;
        goto out;
    }
    if (text && text->type == CM_JSON_STRING && text->str_len) {
        if (!r->chunks) {
            r->t_first = now;
        } else {
            if (w->n_gaps == w->gaps_cap) {
                if (w->gaps_cap >= w->gaps_max) {
                    snprintf(err, errlen, "more than %zu content chunks for max_tokens %d", w->gaps_max, w->b->max_tokens);
                    rc = CM_ETOOBIG;
                    goto out;
                }
                size_t c = w->gaps_cap * 2 < w->gaps_max ? w->gaps_cap * 2 : w->gaps_max;
                float *g = realloc(w->gaps, c * sizeof *g);
                if (!g) {
                    snprintf(err, errlen, "out of memory");
                    rc = CM_ENOMEM;
                    goto out;
                }
                w->gaps = g;
                w->gaps_cap = c;
            }
            w->gaps[w->n_gaps++] = (float)(now - r->t_last);
        }
        r->t_last = now;
        r->chunks++;
    }
    const cm_json *u = cm_json_get(root, "usage");
    if (u && u->type == CM_JSON_OBJECT) {
        int64_t pt = -1, ct = -1;
        cm_json_get_int(u, "prompt_tokens", &pt);
        if (!cm_json_get_int(u, "completion_tokens", &ct)) {
            if (ct < 0 || ct > INT32_MAX || pt > INT32_MAX) {
                snprintf(err, errlen, "bad usage in the stream");
                rc = CM_EFORMAT;
                goto out;
            }
            r->have_usage = 1;
            r->completion_tokens = ct;
            r->prompt_tokens = pt;
        }
        int64_t cached = -1;
        if (!cm_json_get_int(cm_json_get(u, "prompt_tokens_details"), "cached_tokens", &cached) && cached >= 0 &&
            cached <= INT32_MAX) {
            r->have_cached = 1;
            r->cached_tokens = cached;
        }
    }
out:
    cm_json_free(d);
    return rc;
}

static int sse_overflow(int rc, const char *what, char *err, size_t errlen) {
    if (rc == CM_ETOOBIG) snprintf(err, errlen, "SSE %s over %d KiB", what, LINE_CAP / 1024);
    else snprintf(err, errlen, "out of memory");
    return rc;
}

/* Handles one complete SSE line (in w->line, without its LF). */
static int sse_line(worker *w, double now, char *err, size_t errlen) {
    char *l = w->line.p;
    size_t n = w->line.len;
    if (n && l[n - 1] == '\r') l[--n] = 0;
    if (!n) { /* blank line: the event is complete */
        if (!w->ev_has) return 0;
        w->ev_has = 0;
        int rc = on_event(w, w->event.p, w->event.len, now, err, errlen);
        w->event.len = 0;
        return rc;
    }
    if (n < 5 || memcmp(l, "data:", 5)) return 0; /* ": ping" comments, event:, id:, retry: */
    const char *v = l + 5;
    size_t vn = n - 5;
    if (vn && *v == ' ') v++, vn--;
    int rc = w->ev_has ? gbuf_add(&w->event, "\n", 1) : 0;
    if (!rc) rc = gbuf_add(&w->event, v, vn);
    if (rc) return sse_overflow(rc, "event", err, errlen);
    w->ev_has = 1;
    return 0;
}

/* body_fn of a 200 response: splits the stream into lines, whatever the read boundaries. */
static int sse_feed(void *ud, const char *p, size_t n, double now, char *err, size_t errlen) {
    worker *w = ud;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        int rc = gbuf_add(&w->line, p, take);
        if (rc) return sse_overflow(rc, "line", err, errlen);
        if (!nl) break;
        p += take + 1;
        n -= take + 1;
        rc = sse_line(w, now, err, errlen);
        w->line.len = 0;
        if (rc) return rc;
    }
    return 0;
}

/* At the end of the body: a last line without LF, an event without its blank line. */
static int sse_finish(worker *w, double now, char *err, size_t errlen) {
    int rc = 0;
    if (w->line.len) rc = sse_line(w, now, err, errlen);
    w->line.len = 0;
    if (!rc && w->ev_has) rc = on_event(w, w->event.p, w->event.len, now, err, errlen);
    w->ev_has = 0;
    return rc < 0 ? rc : 0;
}

/* Records request idx's outcome (rc 0: success) into the results and the worker's histogram. */
static void finish(worker *w, int64_t idx, int rc, const char *err) {
    bench *b = w->b;
    const req_state *r = &w->r;
    if (rc) {
        pthread_mutex_lock(&b->mu);
        b->failed++;
        if (!b->first_err[0]) snprintf(b->first_err, sizeof b->first_err, "%s", err);
        pthread_mutex_unlock(&b->mu);
        return;
    }
    if (!b->record) return;
    int64_t out = r->have_usage ? r->completion_tokens : r->chunks;
    req_result *q = &b->res[idx];
    q->ok = 1;
    q->ttft = r->chunks ? r->t_first - r->t_send : -1;
    q->e2e = r->t_done - r->t_send;
    q->tpot = out > 1 && r->chunks ? (q->e2e - q->ttft) / (double)(out - 1) : -1;
    q->prompt_tokens = r->have_usage && r->prompt_tokens >= 0 ? (int32_t)r->prompt_tokens : -1;
    q->cached_tokens = r->have_cached ? (int32_t)r->cached_tokens : -1;
    q->output_tokens = (int32_t)(out < INT32_MAX ? out : INT32_MAX);
    for (size_t i = 0; i < w->n_gaps; i++) {
        w->hist[hist_bin(w->gaps[i])]++;
        w->itl_sum += w->gaps[i];
    }
    w->itl_n += w->n_gaps;
}

/* Runs request idx from connect to [DONE] (or failure) and records it. */
static void run_request(worker *w, int64_t idx) {
    bench *b = w->b;
    req_state *r = &w->r;
    memset(r, 0, sizeof *r);
    w->n_gaps = 0;
    w->line.len = w->event.len = w->errbody.len = w->answer.len = 0;
    w->ev_has = 0;
    char err[256] = "";
    int fd = -1;
    r->t_send = cm_time_s();
    http_in in = { .deadline = r->t_send + b->timeout, .buf = w->rbuf, .cap = READ_BUF };
    int rc = conn_open(&b->tgt, in.deadline, &fd, err, sizeof err);
    if (!rc) rc = b->workload == WL_MULTI ? send_body(w, fd, in.deadline, err, sizeof err)
                                         : send_completion(w, fd, idx, in.deadline, err, sizeof err);
    in.fd = fd;
    if (!rc) rc = http_read_head(&in, err, sizeof err);
    if (!rc && in.status != 200) {
        char msg[200];
        if (http_read_body(&in, keep_prefix, &w->errbody, err, sizeof err)) w->errbody.len = 0;
        error_text(w->errbody.p ? w->errbody.p : "", w->errbody.len, msg, sizeof msg);
        snprintf(err, sizeof err, "HTTP %d%s%s", in.status, *msg ? ": " : "", msg);
        rc = CM_EIO;
    } else if (!rc) {
        rc = http_read_body(&in, sse_feed, w, err, sizeof err);
        if (!rc && !r->done) rc = sse_finish(w, cm_time_s(), err, sizeof err);
        if (!rc && !r->done) {
            snprintf(err, sizeof err, "the stream ended without data: [DONE]");
            rc = CM_EFORMAT;
        }
        /* a stream that ended properly without any text is a valid answer (the model ended at
         * once, or its tokens make no text): completed, with no TTFT, ITL or TPOT */
    }
    if (fd >= 0) close(fd);
    finish(w, idx, rc, err);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    bench *b = w->b;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        while (!b->stop && b->taken < b->phase_n && b->taken == b->released) pthread_cond_wait(&b->cv, &b->mu);
        if (b->stop || b->taken == b->phase_n) {
            pthread_mutex_unlock(&b->mu);
            return NULL;
        }
        int64_t idx = b->taken++;
        if (b->taken == b->phase_n) pthread_cond_broadcast(&b->cv); /* the idle ones may leave */
        pthread_mutex_unlock(&b->mu);
        run_request(w, idx);
    }
}

static void sleep_until(double t) {
    struct timespec ts = { .tv_sec = (time_t)t, .tv_nsec = (long)((t - floor(t)) * 1e9) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

/* Runs n requests: starts min(n, workers) threads, releases request i at its arrival time
 * (all at once when rate is 0 or infinite), waits for all. *t0, *t1: first release, last end. */
static int run_phase(bench *b, int64_t n, double rate, double *t0, double *t1, char *err, size_t errlen) {
    int nw = n < b->n_workers ? (int)n : b->n_workers, started = 0, rc = 0;
    b->phase_n = n;
    b->released = b->taken = 0;
    b->stop = 0;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, WORKER_STACK);
    for (; started < nw; started++) {
        int e = pthread_create(&b->w[started].th, &a, worker_main, &b->w[started]);
        if (e) {
            char eb[128];
            snprintf(err, errlen, "cannot start worker thread %d of %d: %s", started + 1, nw, errstr(e, eb, sizeof eb));
            rc = CM_ENOMEM;
            break;
        }
    }
    pthread_attr_destroy(&a);
    *t0 = cm_time_s();
    if (rc || (!(b->interval > 0) && (rate == 0 || isinf(rate)))) {
        pthread_mutex_lock(&b->mu);
        if (rc) b->stop = 1;
        else b->released = n;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    } else {
        uint64_t rng = (uint64_t)b->seed;
        double t = *t0;
        for (int64_t i = 0; i < n; i++) {
            if (i) {
                /* exponential gaps: Poisson arrivals; or fixed ones */
                t += b->interval > 0 ? b->interval : -log1p(-rng_u01(&rng)) / rate;
                sleep_until(t);
            }
            if (b->until && *b->until) { /* the run this one goes beside has ended: no more */
                pthread_mutex_lock(&b->mu);
                b->phase_n = b->released;
                pthread_cond_broadcast(&b->cv);
                pthread_mutex_unlock(&b->mu);
                break;
            }
            pthread_mutex_lock(&b->mu);
            b->released = i + 1;
            pthread_cond_signal(&b->cv);
            pthread_mutex_unlock(&b->mu);
        }
    }
    for (int i = 0; i < started; i++) pthread_join(b->w[i].th, NULL);
    *t1 = cm_time_s();
    return rc;
}

/* Appends word to the text in g, with a space before it unless g is empty. */
static int gbuf_word(gbuf *g, const char word[5]) { return g->len ? gbuf_add(g, word, 5) : gbuf_add(g, word + 1, 4); }

/* One conversation of the multi-turn workload per worker: turn after turn, each sending the
 * conversation so far with new words and adding the server's answer to it. A failed turn ends
 * the conversation (its later turns count as failed). */
static void *user_main(void *arg) {
    worker *w = arg;
    bench *b = w->b;
    int64_t u = w - b->w;
    char word[5];
    int rc = 0;
    w->conv.len = 0;
    uint64_t pre = prefix_rng(b);
    for (int i = 0; i < b->prefix_len && !rc; i++) {
        next_word(&pre, word);
        rc = gbuf_word(&w->conv, word);
    }
    int t = 0;
    for (; t < b->turns && !rc; t++) {
        int64_t idx = u * b->turns + t;
        uint64_t own = own_rng(b, idx);
        for (int i = 0; i < b->prompt_len && !rc; i++) {
            next_word(&own, word);
            rc = gbuf_word(&w->conv, word);
        }
        w->body.len = 0;
        if (!rc) rc = gbuf_add(&w->body, b->body_head, b->body_head_len);
        if (!rc) rc = gbuf_json_str(&w->body, w->conv.p);
        if (!rc) rc = gbuf_add(&w->body, b->body_tail, b->body_tail_len);
        if (rc) break;
        run_request(w, idx);
        if (!b->res[idx].ok || (rc = gbuf_add(&w->conv, w->answer.p ? w->answer.p : "", w->answer.len))) {
            t++;
            break;
        }
    }
    /* the turns not sent (or whose answer did not fit) failed */
    pthread_mutex_lock(&b->mu);
    if (rc && !b->first_err[0]) snprintf(b->first_err, sizeof b->first_err, "a conversation over %zu bytes", w->conv.max - 1);
    b->failed += b->turns - t;
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Runs the multi-turn workload: one thread per conversation. *t0, *t1: start, last end. */
static int run_users(bench *b, double *t0, double *t1, char *err, size_t errlen) {
    int started = 0, rc = 0;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, WORKER_STACK);
    *t0 = cm_time_s();
    for (; started < b->users; started++) {
        int e = pthread_create(&b->w[started].th, &a, user_main, &b->w[started]);
        if (e) {
            char eb[128];
            snprintf(err, errlen, "cannot start conversation thread %d of %d: %s", started + 1, b->users, errstr(e, eb, sizeof eb));
            rc = CM_ENOMEM;
            break;
        }
    }
    pthread_attr_destroy(&a);
    for (int i = 0; i < started; i++) pthread_join(b->w[i].th, NULL);
    *t1 = cm_time_s();
    return rc;
}

/* GET /v1/models: the first model's id, into out. */
static int fetch_model(bench *b, char *out, size_t outlen, char *err, size_t errlen) {
    char req[2 * MAX_NAME + 512], rbuf[HEAD_CAP], e2[256] = "";
    gbuf body = { .max = MODELS_CAP };
    double deadline = cm_time_s() + b->timeout;
    int fd = -1;
    int rc = conn_open(&b->tgt, deadline, &fd, e2, sizeof e2);
    http_in in = { .fd = fd, .deadline = deadline, .buf = rbuf, .cap = sizeof rbuf };
    if (!rc) {
        int n = snprintf(req, sizeof req,
                         "GET %s/v1/models HTTP/1.1\r\nHost: %s\r\nUser-Agent: arka-bench\r\nAccept: application/json\r\n"
                         "Connection: close\r\n%s%s%s\r\n",
                         b->tgt.prefix, b->tgt.authority, b->api_key ? "Authorization: Bearer " : "",
                         b->api_key ? b->api_key : "", b->api_key ? "\r\n" : "");
        rc = send_all(fd, req, (size_t)n, deadline, e2, sizeof e2);
    }
    if (!rc) rc = http_read_head(&in, e2, sizeof e2);
    if (!rc) rc = http_read_body(&in, keep_all, &body, e2, sizeof e2);
    if (fd >= 0) close(fd);
    if (!rc && in.status != 200) {
        char msg[200];
        error_text(body.p ? body.p : "", body.len, msg, sizeof msg);
        snprintf(e2, sizeof e2, "HTTP %d%s%s", in.status, *msg ? ": " : "", msg);
        rc = CM_EIO;
    }
    cm_json_doc *d = NULL;
    const char *id = NULL;
    if (!rc) {
        char jerr[96];
        if (cm_json_parse(body.p ? body.p : "", body.len, &d, jerr, sizeof jerr)) {
            snprintf(e2, sizeof e2, "bad JSON: %s", jerr);
            rc = CM_EFORMAT;
        } else if (cm_json_get_str(cm_json_at(cm_json_get(cm_json_root(d), "data"), 0), "id", &id) || !*id ||
                   strlen(id) >= outlen) {
            snprintf(e2, sizeof e2, "no usable model id in data[0].id (pass --model NAME)");
            rc = CM_EFORMAT;
        }
    }
    if (!rc) snprintf(out, outlen, "%s", id);
    else snprintf(err, errlen, "GET %s/v1/models: %s", b->url, e2);
    cm_json_free(d);
    free(body.p);
    return rc;
}

/* ---- the report ----------------------------------------------------------------------------- */

typedef struct {
    int64_t n;
    double  mean, p50, p90, p99; /* seconds */
} stats;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* numpy's default percentile: linear interpolation between the closest ranks. */
static double pct(const double *v, int64_t n, double p) {
    double r = p / 100 * (double)(n - 1);
    int64_t i = (int64_t)r;
    return i + 1 < n ? v[i] + (r - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* Sorts v[0..n) and summarises it. */
static void stats_exact(double *v, int64_t n, stats *s) {
    *s = (stats){ .n = n };
    if (!n) return;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += v[i];
    *s = (stats){ n, sum / (double)n, pct(v, n, 50), pct(v, n, 90), pct(v, n, 99) };
}

/* Percentiles of a histogram: the centre of the bin holding the rank (within 0.5 %). */
static void stats_hist(const uint64_t *h, uint64_t n, double sum, stats *s) {
    *s = (stats){ .n = (int64_t)n };
    if (!n) return;
    s->mean = sum / (double)n;
    const double ps[3] = { 50, 90, 99 };
    double *dst[3] = { &s->p50, &s->p90, &s->p99 };
    for (int k = 0; k < 3; k++) {
        uint64_t rank = (uint64_t)(ps[k] / 100 * (double)(n - 1)), cum = 0;
        for (int i = 0; i < HIST_BINS; i++)
            if ((cum += h[i]) > rank) {
                *dst[k] = hist_value(i);
                break;
            }
    }
}

typedef struct {
    int64_t completed, failed, out_tokens, prompt_tokens, n_prompt;
    int64_t no_text; /* completed streams that carried no text (no TTFT) */
    int64_t cached_tokens, n_cached; /* usage's cached_tokens, over the requests that reported it */
    double  duration;
    stats   ttft, itl, tpot, e2e;
} report;

/* Copies one figure of the successful requests into v: 0 TTFT, 1 e2e, 2 TPOT (where defined). */
static int64_t gather(const bench *b, double *v, int which) {
    int64_t k = 0;
    for (int64_t i = 0; i < b->n; i++) {
        const req_result *q = &b->res[i];
        if (!q->ok || (which == 2 && q->tpot < 0) || (which == 0 && q->ttft < 0)) continue;
        v[k++] = which == 0 ? q->ttft : which == 1 ? q->e2e : q->tpot;
    }
    return k;
}

static int summarise(bench *b, double duration, report *R) {
    double *v = malloc(sizeof *v * (size_t)b->n);
    if (!v) return CM_ENOMEM;
    *R = (report){ .failed = b->failed, .duration = duration };
    for (int64_t i = 0; i < b->n; i++) {
        const req_result *q = &b->res[i];
        if (!q->ok) continue;
        R->completed++;
        R->no_text += b->res[i].ttft < 0;
        R->out_tokens += q->output_tokens;
        if (q->prompt_tokens >= 0) R->prompt_tokens += q->prompt_tokens, R->n_prompt++;
        if (q->cached_tokens >= 0) R->cached_tokens += q->cached_tokens, R->n_cached++;
    }
    int64_t k = gather(b, v, 0);
    stats_exact(v, k, &R->ttft);
    k = gather(b, v, 1);
    stats_exact(v, k, &R->e2e);
    k = gather(b, v, 2);
    stats_exact(v, k, &R->tpot);
    free(v);
    uint64_t *h = calloc(HIST_BINS, sizeof *h), n = 0;
    if (!h) return CM_ENOMEM;
    double sum = 0;
    for (int j = 0; j < b->n_workers; j++) {
        for (int i = 0; i < HIST_BINS; i++) h[i] += b->w[j].hist[i];
        n += b->w[j].itl_n;
        sum += b->w[j].itl_sum;
    }
    stats_hist(h, n, sum, &R->itl);
    free(h);
    return 0;
}

static void print_row(const char *name, const stats *s) {
    if (!s->n) printf("%-10s %10s %10s %10s %10s\n", name, "-", "-", "-", "-");
    else printf("%-10s %10.2f %10.2f %10.2f %10.2f\n", name, s->mean * 1e3, s->p50 * 1e3, s->p90 * 1e3, s->p99 * 1e3);
}

static const char *const WORKLOADS[] = { "random", "shared-prefix", "multi-turn", "tenants" };

static void print_report(const bench *b, const report *R) {
    double d = R->duration > 0 ? R->duration : 1e-9;
    printf("arka bench serve: %s, model %s, workload %s\n", b->url, b->model, WORKLOADS[b->workload]);
    if (b->workload == WL_MULTI)
        printf("arrivals            %d conversations of %d turns, each turn when the one before has ended\n", b->users, b->turns);
    else if (b->interval > 0) printf("arrivals            one every %.3g s\n", b->interval);
    else if (b->rate == 0 || isinf(b->rate)) printf("arrivals            all at once, concurrency %d\n", b->conc);
    else printf("arrivals            Poisson %.3g req/s (seed %lld), concurrency %d\n", b->rate, (long long)b->seed,
                b->conc);
    if (b->prefix_len) printf("shared prefix       %d words before every prompt\n", b->prefix_len);
    printf("requests            %d: %lld completed (%lld of them without text), %lld failed\n", b->n, (long long)R->completed,
           (long long)R->no_text, (long long)R->failed);
    if (R->n_prompt)
        printf("prompt tokens       %d words asked, mean %.1f tokens (server's count)\n", b->prompt_len,
               (double)R->prompt_tokens / (double)R->n_prompt);
    else printf("prompt tokens       %d words asked (the server reported no usage)\n", b->prompt_len);
    if (R->n_cached && R->prompt_tokens)
        printf("cached tokens       mean %.1f (%.1f %% of the prompt tokens, from the server's usage)\n",
               (double)R->cached_tokens / (double)R->n_cached, 100.0 * (double)R->cached_tokens / (double)R->prompt_tokens);
    printf("max tokens          %d\n", b->max_tokens);
    printf("duration            %.3f s\n", R->duration);
    printf("request throughput  %.3f req/s\n", (double)R->completed / d);
    printf("output throughput   %.1f tok/s (%lld tokens)\n", (double)R->out_tokens / d, (long long)R->out_tokens);
    printf("total throughput    %.1f tok/s (prompt + output)\n", (double)(R->out_tokens + R->prompt_tokens) / d);
    printf("%-10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99");
    print_row("TTFT", &R->ttft);
    print_row("ITL", &R->itl);
    print_row("TPOT", &R->tpot);
    print_row("E2E", &R->e2e);
    if (R->failed) printf("first error         %s\n", b->first_err);
}

static void json_stats_obj(FILE *f, const stats *s) {
    if (!s->n) fprintf(f, "null");
    else fprintf(f, "{\"n\": %lld, \"mean\": %.4f, \"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f}", (long long)s->n,
                 s->mean * 1e3, s->p50 * 1e3, s->p90 * 1e3, s->p99 * 1e3);
}

static void json_stats(FILE *f, const char *name, const stats *s) {
    fprintf(f, "  \"%s\": ", name);
    json_stats_obj(f, s);
    fprintf(f, ",\n");
}

/* A report's counts and latencies as one JSON object (the tenants workload's B runs). */
static void json_sub(FILE *f, const char *name, const report *R) {
    fprintf(f, "  \"%s\": {\"completed\": %lld, \"failed\": %lld, \"duration_s\": %.6f, \"ttft_ms\": ", name,
            (long long)R->completed, (long long)R->failed, R->duration);
    json_stats_obj(f, &R->ttft);
    fprintf(f, ", \"e2e_ms\": ");
    json_stats_obj(f, &R->e2e);
    fprintf(f, "},\n");
}

/* The tenants workload's B runs, written with the main report (NULL otherwise). */
typedef struct { report alone, beside; } b_runs;

static int write_json(const bench *b, const report *R, const b_runs *B, char *err, size_t errlen) {
    FILE *f = fopen(b->json_path, "w");
    char eb[128];
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", b->json_path, errstr(errno, eb, sizeof eb));
        return CM_EIO;
    }
    double d = R->duration > 0 ? R->duration : 1e-9;
    fprintf(f, "{\n  \"workload\": \"%s\",\n  \"url\": ", WORKLOADS[b->workload]);
    json_str(f, b->url);
    fprintf(f, ",\n  \"model\": ");
    json_str(f, b->model);
    if (b->rate == 0 || isinf(b->rate)) fprintf(f, ",\n  \"rate\": null");
    else fprintf(f, ",\n  \"rate\": %.6g", b->rate);
    fprintf(f, ",\n  \"seed\": %lld,\n  \"concurrency\": %d,\n  \"requests\": %d,\n  \"warmup\": %d,\n", (long long)b->seed,
            b->conc, b->n, b->warmup);
    fprintf(f, "  \"prompt_len\": %d,\n  \"max_tokens\": %d,\n  \"completed\": %lld,\n  \"completed_without_text\": %lld,\n  \"failed\": %lld,\n",
            b->prompt_len, b->max_tokens, (long long)R->completed, (long long)R->no_text, (long long)R->failed);
    fprintf(f, "  \"first_error\": ");
    if (R->failed) json_str(f, b->first_err);
    else fprintf(f, "null");
    fprintf(f, ",\n  \"duration_s\": %.6f,\n  \"request_throughput\": %.6f,\n  \"output_throughput\": %.6f,\n",
            R->duration, (double)R->completed / d, (double)R->out_tokens / d);
    fprintf(f, "  \"total_token_throughput\": %.6f,\n  \"total_output_tokens\": %lld,\n  \"total_prompt_tokens\": %lld,\n",
            (double)(R->out_tokens + R->prompt_tokens) / d, (long long)R->out_tokens, (long long)R->prompt_tokens);
    if (R->n_prompt) fprintf(f, "  \"mean_prompt_tokens\": %.3f,\n", (double)R->prompt_tokens / (double)R->n_prompt);
    else fprintf(f, "  \"mean_prompt_tokens\": null,\n");
    if (R->n_cached) fprintf(f, "  \"mean_cached_tokens\": %.3f,\n", (double)R->cached_tokens / (double)R->n_cached);
    else fprintf(f, "  \"mean_cached_tokens\": null,\n");
    fprintf(f, "  \"prefix_len\": %d,\n  \"users\": %d,\n  \"turns\": %d,\n", b->prefix_len, b->users, b->turns);
    if (B) {
        json_sub(f, "b_alone", &B->alone);
        json_sub(f, "b_beside_a", &B->beside);
        if (B->alone.ttft.n && B->beside.ttft.n)
            fprintf(f, "  \"b_ttft_ratio\": {\"p50\": %.4f, \"p99\": %.4f},\n", B->beside.ttft.p50 / B->alone.ttft.p50,
                    B->beside.ttft.p99 / B->alone.ttft.p99);
    }
    json_stats(f, "ttft_ms", &R->ttft);
    json_stats(f, "itl_ms", &R->itl);
    json_stats(f, "tpot_ms", &R->tpot);
    json_stats(f, "e2e_ms", &R->e2e);
    fprintf(f, "  \"itl_percentiles\": \"log histogram, 1%% bins\"\n}\n");
    int bad = ferror(f);
    if (fclose(f) || bad) {
        snprintf(err, errlen, "cannot write %s: %s", b->json_path, errstr(errno ? errno : EIO, eb, sizeof eb));
        return CM_EIO;
    }
    return 0;
}

/* ---- set-up and the command --------------------------------------------------------------- */

/* Allocates results and worker buffers; workers start per phase. */
static int bench_alloc(bench *b) {
    b->res = calloc((size_t)b->n, sizeof *b->res);
    b->w = calloc((size_t)b->n_workers, sizeof *b->w);
    if (!b->res || !b->w) return CM_ENOMEM;
    for (int i = 0; i < b->n_workers; i++) {
        worker *w = &b->w[i];
        w->b = b;
        w->rbuf = malloc(READ_BUF);
        w->wbuf = malloc(WRITE_BUF);
        w->gaps_max = 4 * (size_t)b->max_tokens + 64;
        w->gaps_cap = w->gaps_max < 1024 ? w->gaps_max : 1024;
        w->gaps = malloc(w->gaps_cap * sizeof *w->gaps);
        w->line.max = w->event.max = LINE_CAP;
        w->errbody.max = ERRBODY_CAP;
        w->conv.max = w->body.max = w->answer.max = CONV_CAP;
        if (!w->rbuf || !w->wbuf || !w->gaps) return CM_ENOMEM;
    }
    return 0;
}

static void bench_free(bench *b) {
    for (int i = 0; b->w && i < b->n_workers; i++) {
        worker *w = &b->w[i];
        free(w->rbuf);
        free(w->wbuf);
        free(w->gaps);
        free(w->line.p);
        free(w->event.p);
        free(w->errbody.p);
        free(w->conv.p);
        free(w->body.p);
        free(w->answer.p);
    }
    free(b->w);
    free(b->res);
    free(b->body_head);
}

/* The request body around the prompt: {"model":"…","prompt":" and ",…}. */
static int build_body(bench *b) {
    gbuf h = { .max = 8 * MAX_NAME };
    int rc = gbuf_add(&h, "{\"model\":\"", 10);
    if (!rc) rc = gbuf_json_str(&h, b->model);
    if (!rc) rc = gbuf_add(&h, "\",\"prompt\":\"", 12);
    if (rc) {
        free(h.p);
        return rc;
    }
    b->body_head = h.p;
    b->body_head_len = h.len;
    /* with a response format the grammar ends the output (ignore_eos cannot be combined with it):
     * give it room to run to max_tokens, e.g. a string with a large minLength */
    const char *rf = b->response_format;
    size_t cap = 256 + (rf ? strlen(rf) : 0);
    if (!(b->body_tail = malloc(cap))) return CM_ENOMEM;
    b->body_tail_len = (size_t)snprintf(b->body_tail, cap,
                                        "\",\"max_tokens\":%d,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                                        "\"temperature\":0,%s%s}",
                                        b->max_tokens, rf ? "\"response_format\":" : "\"ignore_eos\":true", rf ? rf : "");
    return 0;
}

/* A run of tenant B's beside the main run b: b's options with B's key, n requests, interval
 * seconds apart, its own prompts (tag). */
static int bench_init_b(bench *d, const bench *b, const char *key, int n, double interval, uint64_t tag) {
    *d = *b;
    d->api_key = key;
    d->n = n;
    d->n_workers = n < 16 ? n : 16;
    d->conc = d->n_workers;
    d->interval = interval;
    d->until = NULL;
    d->tag = tag;
    d->record = 1;
    d->res = NULL;
    d->w = NULL;
    d->body_head = NULL;
    d->failed = 0;
    d->first_err[0] = 0;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    return build_body(d) || bench_alloc(d) ? CM_ENOMEM : 0;
}

static void bench_fini(bench *b) {
    bench_free(b);
    free(b->body_tail); /* its own (bench_init_b built it) */
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
}

typedef struct { bench *b; double t0, t1; int rc; char err[512]; volatile int *done; } phase_arg;

static void *phase_main(void *arg) {
    phase_arg *a = arg;
    a->rc = run_phase(a->b, a->b->n, INFINITY, &a->t0, &a->t1, a->err, sizeof a->err);
    *a->done = 1;
    return NULL;
}

static void print_b(const char *what, const report *R) {
    printf("tenant B %-10s %lld completed, %lld failed; ms TTFT p50 %.2f p99 %.2f, E2E p50 %.2f p99 %.2f\n", what,
           (long long)R->completed, (long long)R->failed, R->ttft.p50 * 1e3, R->ttft.p99 * 1e3, R->e2e.p50 * 1e3,
           R->e2e.p99 * 1e3);
}

/* The tenants workload: B alone, then A all at once with B beside it. Fills R (A) and B. */
static int run_tenants(bench *b, const char *key_b, int b_requests, double interval, report *R, b_runs *B, char *err,
                       size_t errlen) {
    bench alone, beside;
    volatile int a_done = 0;
    int rc = bench_init_b(&alone, b, key_b, b_requests, interval, 0x42414c4f4e450000ull);
    int rc2 = bench_init_b(&beside, b, key_b, MAX_B_BESIDE, interval, 0x4245534944450000ull);
    if (!rc) rc = rc2;
    if (rc) snprintf(err, errlen, "out of memory");
    double t0, t1;
    if (!rc && !(rc = run_phase(&alone, b_requests, INFINITY, &t0, &t1, err, errlen))) rc = summarise(&alone, t1 - t0, &B->alone);
    if (!rc) {
        beside.until = &a_done;
        phase_arg a = { .b = b, .done = &a_done };
        pthread_t th;
        if ((rc = pthread_create(&th, NULL, phase_main, &a))) {
            snprintf(err, errlen, "cannot start tenant A's run");
            rc = CM_ENOMEM;
        } else {
            double u0, u1;
            int rb = run_phase(&beside, MAX_B_BESIDE, INFINITY, &u0, &u1, err, errlen);
            pthread_join(th, NULL);
            if (a.rc) snprintf(err, errlen, "%s", a.err);
            rc = a.rc ? a.rc : rb;
            beside.n = (int)beside.released;
            if (!rc) rc = summarise(b, a.t1 - a.t0, R);
            if (!rc) rc = summarise(&beside, u1 - u0, &B->beside);
        }
    }
    if (!rc && alone.failed + beside.failed)
        fprintf(stderr, "arka bench serve: %lld of tenant B's requests failed, first: %s\n", (long long)(alone.failed + beside.failed),
                alone.failed ? alone.first_err : beside.first_err);
    bench_fini(&alone);
    bench_fini(&beside);
    return rc;
}

int bench_serve(int argc, char **argv) {
    const char *rf_path = NULL;
    bench b = { .rate = INFINITY, .timeout = 300, .prompt_len = 128, .max_tokens = 128, .prefix_len = -1, .users = 8,
                .turns = 4 };
    const char *workload = "random", *api_key_b = NULL;
    double b_interval = 0.5;
    int b_requests = 10;
    cm_opt opts[] = {
        { "url", 0, CM_OPT_STR, &b.url, "server base URL: http://HOST[:PORT][/PREFIX] (required)" },
        { "requests", 'n', CM_OPT_INT, &b.n, "requests to measure, 1..1000000 (required; multi-turn: users x turns)" },
        { "rate", 0, CM_OPT_F64, &b.rate, "Poisson arrival rate in requests/s (default inf; 0 or inf: all at once)" },
        { "concurrency", 'c', CM_OPT_INT, &b.concurrency, "most requests in flight, 1..1024 (default: requests, at most 1024)" },
        { "prompt-len", 0, CM_OPT_INT, &b.prompt_len, "prompt length in words, about one token each (default 128)" },
        { "max-tokens", 0, CM_OPT_INT, &b.max_tokens, "tokens to generate per request (default 128)" },
        { "model", 'm', CM_OPT_STR, &b.model, "model name to request (default: the first id from GET /v1/models)" },
        { "api-key", 0, CM_OPT_STR, &b.api_key, "send 'Authorization: Bearer KEY' (tenants: tenant A's key)" },
        { "seed", 0, CM_OPT_I64, &b.seed, "seed of the arrival times and prompt words (default 0)" },
        { "timeout", 0, CM_OPT_F64, &b.timeout, "limit per request in seconds (default 300)" },
        { "warmup", 0, CM_OPT_INT, &b.warmup, "requests sent all at once before the run and not counted (default 0)" },
        { "json", 0, CM_OPT_STR, &b.json_path, "also write the results as JSON to FILE" },
        { "response-format", 0, CM_OPT_STR, &rf_path, "send every request with the response_format in FILE (JSON), to measure "
                                                      "constrained decoding (instead of ignore_eos: the grammar ends the output)" },
        { "workload", 0, CM_OPT_STR, &workload, "random | shared-prefix | multi-turn | tenants (default random)" },
        { "prefix-len", 0, CM_OPT_INT, &b.prefix_len, "words every prompt starts with, the same for all (default: shared-prefix 2000, else 0)" },
        { "users", 0, CM_OPT_INT, &b.users, "multi-turn: conversations at once (default 8)" },
        { "turns", 0, CM_OPT_INT, &b.turns, "multi-turn: requests per conversation (default 4)" },
        { "api-key-b", 0, CM_OPT_STR, &api_key_b, "tenants: tenant B's key (required there)" },
        { "b-interval", 0, CM_OPT_F64, &b_interval, "tenants: seconds between B's requests (default 0.5)" },
        { "b-requests", 0, CM_OPT_INT, &b_requests, "tenants: B's requests alone, before A's run (default 10)" },
        { 0 } };
    char err[512], host[256], port[8], model[MAX_NAME + 1];
    int npos;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err)) {
        if (strcmp(err, "help")) {
            fprintf(stderr, "arka bench serve: %s\n", err);
            return 2;
        }
        printf("usage: arka bench serve --url URL --requests N [--rate R] [--prompt-len L] [--max-tokens M] [options]\n"
               "       --workload shared-prefix [--prefix-len 2000] | multi-turn --users U --turns T |\n"
               "       tenants --api-key KEY_A --api-key-b KEY_B [--b-interval 0.5] [--b-requests 10]\n");
        cm_config_usage(opts, stdout);
        return 0;
    }
    const char *bad = NULL;
    b.workload = -1;
    for (int i = 0; i < (int)(sizeof WORKLOADS / sizeof *WORKLOADS); i++)
        if (!strcmp(workload, WORKLOADS[i])) b.workload = i;
    if (b.prefix_len < 0) b.prefix_len = b.workload == WL_SHARED ? 2000 : 0;
    if (b.workload == WL_MULTI && !b.n && b.users > 0 && b.turns > 0 && (int64_t)b.users * b.turns <= MAX_REQUESTS)
        b.n = b.users * b.turns;
    if (npos) bad = "unexpected argument (all options are --name value)";
    else if (b.workload < 0) bad = "--workload must be random, shared-prefix, multi-turn or tenants";
    else if (!b.url || !*b.url) bad = "--url is required";
    else if (b.workload == WL_MULTI && (b.users < 1 || b.users > MAX_CONCURRENCY || b.turns < 1 || b.turns > 10000))
        bad = "--users must be 1..1024 and --turns 1..10000";
    else if (b.workload == WL_MULTI && b.n != b.users * b.turns) bad = "multi-turn: --requests must be --users x --turns (or left out)";
    else if (b.workload == WL_MULTI && b.warmup) bad = "multi-turn takes no --warmup";
    else if (b.n < 1 || b.n > MAX_REQUESTS) bad = "--requests must be 1..1000000";
    else if (isnan(b.rate) || b.rate < 0) bad = "--rate must be >= 0 (0 or inf: all at once)";
    else if (b.concurrency < 0 || b.concurrency > MAX_CONCURRENCY) bad = "--concurrency must be 1..1024";
    else if (b.prompt_len < 1 || b.prompt_len > MAX_PROMPT_LEN) bad = "--prompt-len must be 1..1048576";
    else if (b.prefix_len > MAX_PROMPT_LEN) bad = "--prefix-len must be 0..1048576";
    else if (b.max_tokens < 1 || b.max_tokens > MAX_OUT_TOKENS) bad = "--max-tokens must be 1..1048576";
    else if (b.warmup < 0 || b.warmup > MAX_WARMUP) bad = "--warmup must be 0..10000";
    else if (!(b.timeout > 0) || b.timeout > 1e6) bad = "--timeout must be a number of seconds > 0";
    else if (b.model && (!*b.model || strlen(b.model) > MAX_NAME)) bad = "--model must be 1..1024 bytes";
    else if (b.api_key && (strlen(b.api_key) > MAX_NAME || strpbrk(b.api_key, "\r\n"))) bad = "bad --api-key";
    else if (b.workload == WL_TENANTS && (!api_key_b || !*api_key_b || strlen(api_key_b) > MAX_NAME || strpbrk(api_key_b, "\r\n")))
        bad = "tenants: --api-key-b KEY is required (tenant B's key; --api-key is tenant A's)";
    else if (b.workload == WL_TENANTS && (!(b_interval > 0) || b_interval > 3600 || b_requests < 1 || b_requests > MAX_REQUESTS))
        bad = "tenants: --b-interval must be > 0 s and --b-requests 1..1000000";
    if (bad) {
        fprintf(stderr, "arka bench serve: %s (see --help)\n", bad);
        return 2;
    }
    if (target_parse(&b.tgt, b.url, host, sizeof host, port, sizeof port, err, sizeof err)) {
        fprintf(stderr, "arka bench serve: %s\n", err);
        return 2;
    }
    if (target_resolve(&b.tgt, host, port, err, sizeof err)) {
        fprintf(stderr, "arka bench serve: %s\n", err);
        return 1;
    }
    if (!b.model) {
        if (fetch_model(&b, model, sizeof model, err, sizeof err)) {
            fprintf(stderr, "arka bench serve: %s\n", err);
            return 1;
        }
        b.model = model;
    }
    char *rf = NULL;
    if (rf_path) { /* the response_format, as one line of JSON text */
        size_t rl;
        if (cm_file_read(rf_path, 1 << 20, &rf, &rl, err, sizeof err)) {
            fprintf(stderr, "arka bench serve: --response-format: %s\n", err);
            return 2;
        }
        for (size_t i = 0; i < rl; i++)
            if (rf[i] == '\n' || rf[i] == '\r') rf[i] = ' ';
        b.response_format = rf;
    }
    int conc = b.concurrency ? b.concurrency : MAX_CONCURRENCY;
    int most = b.n > b.warmup ? b.n : b.warmup;
    b.n_workers = b.workload == WL_MULTI ? b.users : conc < most ? conc : most;
    b.conc = b.workload == WL_MULTI ? b.users : conc < b.n ? conc : b.n;
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    int rc = 1;
    double t0, t1;
    report R;
    b_runs B;
    if (build_body(&b) || bench_alloc(&b)) {
        fprintf(stderr, "arka bench serve: out of memory\n");
        goto out;
    }
    if (b.warmup) {
        b.record = 0;
        b.tag = 0x5741524d55500000ull; /* distinct prompts for the warm-up */
        if (run_phase(&b, b.warmup, INFINITY, &t0, &t1, err, sizeof err)) {
            fprintf(stderr, "arka bench serve: %s\n", err);
            goto out;
        }
        if (b.failed) {
            fprintf(stderr, "arka bench serve: %lld of %d warm-up requests failed, first: %s\n", (long long)b.failed,
                    b.warmup, b.first_err);
            goto out;
        }
    }
    b.record = 1;
    b.tag = 0;
    int prc = b.workload == WL_MULTI   ? run_users(&b, &t0, &t1, err, sizeof err)
              : b.workload == WL_TENANTS ? run_tenants(&b, api_key_b, b_requests, b_interval, &R, &B, err, sizeof err)
                                         : run_phase(&b, b.n, b.rate, &t0, &t1, err, sizeof err);
    if (prc) {
        fprintf(stderr, "arka bench serve: %s\n", prc == CM_ENOMEM && !*err ? "out of memory" : err);
        goto out;
    }
    if (b.workload != WL_TENANTS && summarise(&b, t1 - t0, &R)) {
        fprintf(stderr, "arka bench serve: out of memory\n");
        goto out;
    }
    print_report(&b, &R);
    if (b.workload == WL_TENANTS) {
        print_b("alone", &B.alone);
        print_b("beside A", &B.beside);
        if (B.alone.ttft.n && B.beside.ttft.n)
            printf("tenant B TTFT beside A / alone: p50 %.2fx, p99 %.2fx\n", B.beside.ttft.p50 / B.alone.ttft.p50,
                   B.beside.ttft.p99 / B.alone.ttft.p99);
    }
    fflush(stdout);
    if (b.json_path && write_json(&b, &R, b.workload == WL_TENANTS ? &B : NULL, err, sizeof err)) {
        fprintf(stderr, "arka bench serve: %s\n", err);
        goto out;
    }
    if (!R.completed) {
        fprintf(stderr, "arka bench serve: all %d requests failed, first: %s\n", b.n, b.first_err);
        goto out;
    }
    rc = 0;
out:
    bench_free(&b);
    free(b.body_tail);
    free(rf);
    pthread_cond_destroy(&b.cv);
    pthread_mutex_destroy(&b.mu);
    return rc;
}
