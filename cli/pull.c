/* arka pull URL [-o DIR] [--sha256 HEX] [--progress]: download a model file over HTTP(S) into a
 * directory, resumably and verifiably. Only this command downloads, so the downloader lives here.
 *
 * The file is written to DIR/NAME.part (NAME: the URL's last path segment, percent-decoded),
 * which a later call resumes with a Range request: a 206 answer is appended (its
 * Content-Range must start where the .part ends), a 200 answer means the server ignored the
 * Range and the .part is restarted from zero, a 416 whose total equals the .part's size means
 * the .part is already complete. The version the .part holds is remembered in
 * DIR/NAME.part.etag (the response's strong ETag, else its Last-Modified) and sent as If-Range
 * when resuming, so a file changed on the server is downloaded afresh (200) instead of being
 * spliced onto the old prefix. Only a complete file whose SHA-256 matches (when one is
 * given) is renamed to DIR/NAME; on a mismatch the .part is removed. An interrupted transfer
 * or a write error keeps the .part for the next call. The .part is flock()ed while written,
 * so two pulls of the same file refuse each other instead of interleaving.
 *
 * Uses libcurl (built in when ARKA_WITH_CURL is defined; otherwise the command says the
 * build has none). Call from a process's main thread (it runs curl_global_init once).
 */
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "common/cm_sha256.h"
#include "common/cm_time.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef ARKA_WITH_CURL
#include <curl/curl.h>
#endif

typedef struct pull_opts {
    const char *url;               /* http:// or https:// */
    const char *dir;               /* destination directory, created (with parents) if missing */
    const char *sha256;            /* expected digest as 64 hex digits, or NULL */
    int         progress;          /* 1: a progress line on stderr (bytes, %, MB/s) */
    long        connect_timeout_s; /* 0: 30 s */
    long        stall_timeout_s;   /* abort when under 1 byte/s for this long; 0: 60 s */
} pull_opts;

typedef struct pull_result {
    char     path[4096];    /* the final file */
    char     sha256[65];    /* its digest in hex ("" when it already existed and no digest was asked for) */
    uint64_t bytes;         /* its size */
    uint64_t downloaded;    /* bytes received by this call */
    int      resumed;       /* a .part was continued with a 206 answer */
    int      restarted;     /* a .part existed but the server sent the whole file */
    int      already;       /* the final file was already there (and matched the digest, if given) */
} pull_result;


static int pull_default_dir(char *out, size_t len) {
    const char *v = getenv("ARKA_CACHE_DIR");
    int n;
    if (v && *v) n = snprintf(out, len, "%s/models", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) n = snprintf(out, len, "%s/arka/models", v);
    else if ((v = getenv("HOME")) && *v) n = snprintf(out, len, "%s/.cache/arka/models", v);
    else return CM_EINVAL;
    return n < 0 || (size_t)n >= len ? CM_EINVAL : 0;
}

/* mkdir -p */
static int make_dirs(const char *dir, char *err, size_t errlen) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        snprintf(err, errlen, "%.64s...: path too long", dir);
        return CM_EINVAL;
    }
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) {
                snprintf(err, errlen, "%s: cannot create directory: %s", p, strerror(errno));
                return CM_EIO;
            }
            *s = c;
            if (!c) break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "%s: not a directory", dir);
        return CM_EINVAL;
    }
    return 0;
}

/* Hashes the first n bytes of fd into c. */
static int hash_fd(int fd, uint64_t n, cm_sha256_ctx *c) {
    char buf[1 << 16];
    uint64_t off = 0;
    while (off < n) {
        size_t want = n - off < sizeof buf ? (size_t)(n - off) : sizeof buf;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return CM_EIO;
        cm_sha256_update(c, buf, (size_t)r);
        off += (uint64_t)r;
    }
    return 0;
}

#ifdef ARKA_WITH_CURL

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int pull_name_from_url(const char *url, char *name, size_t len) {
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    p = strchr(p, '/'); /* past the authority */
    if (!p) return CM_EINVAL;
    size_t end = strcspn(p, "?#");
    const char *seg = p;
    for (size_t i = 0; i < end; i++)
        if (p[i] == '/') seg = p + i + 1;
    size_t seglen = (size_t)(p + end - seg), n = 0;
    for (size_t i = 0; i < seglen; i++) {
        int c = (unsigned char)seg[i];
        if (c == '%') {
            if (i + 2 >= seglen) return CM_EINVAL;
            int hi = hexval((unsigned char)seg[i + 1]), lo = hexval((unsigned char)seg[i + 2]);
            if (hi < 0 || lo < 0) return CM_EINVAL;
            c = hi << 4 | lo;
            i += 2;
        }
        if (c < 0x20 || c == 0x7f || c == '/' || c == '\\') return CM_EINVAL;
        if (n + 1 >= len) return CM_EINVAL;
        name[n++] = (char)c;
    }
    name[n] = 0;
    if (!n || !strcmp(name, ".") || !strcmp(name, "..")) return CM_EINVAL;
    return 0;
}

typedef struct xfer {
    int           fd;
    const char   *part;
    uint64_t      offset;      /* bytes already in the .part before this response's body */
    uint64_t      written;     /* body bytes written from this response */
    cm_sha256_ctx sha;         /* over the .part's whole content so far */
    /* The latest response's head (a redirect's is overwritten by the next one). */
    long          status;
    char          reason[64];
    int           have_range;
    uint64_t      range_start;
    int64_t       range_total; /* -1 unknown */
    int64_t       content_length;
    char          etag[256];   /* strong ETag of the response, "" if none or weak */
    char          last_mod[64];/* Last-Modified of the response */
    /* The validator the .part was downloaded under (NAME.part.etag), sent as If-Range. */
    const char   *vpath;
    char          validator[256];
    /* Decisions and failures inside callbacks. */
    int           started;     /* the final response's body began */
    int           restarted;
    int           write_errno;
    int           bad_range;
    long          os_errno;    /* the socket error behind a failed connect */
    /* Progress. */
    int           progress, printed;
    double        t0, last;
    uint64_t      received;
} xfer;

static size_t on_header(char *buf, size_t size, size_t n, void *ud) {
    xfer *x = ud;
    size_t len = size * n;
    char line[512];
    size_t l = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, buf, l);
    line[l] = 0;
    while (l && (line[l - 1] == '\r' || line[l - 1] == '\n')) line[--l] = 0;
    if (!strncmp(line, "HTTP/", 5)) {
        const char *sp = strchr(line, ' ');
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        const char *r = sp ? strchr(sp + 1, ' ') : NULL;
        snprintf(x->reason, sizeof x->reason, "%s", r ? r + 1 : "");
        x->have_range = 0;
        x->range_total = -1;
        x->content_length = -1;
        x->etag[0] = x->last_mod[0] = 0;
    } else if (!strncasecmp(line, "etag:", 5)) {
        const char *v = line + 5;
        while (*v == ' ' || *v == '\t') v++;
        /* Only strong validators may be used with If-Range. */
        if (*v == '"' && strlen(v) < sizeof x->etag) snprintf(x->etag, sizeof x->etag, "%s", v);
    } else if (!strncasecmp(line, "last-modified:", 14)) {
        const char *v = line + 14;
        while (*v == ' ' || *v == '\t') v++;
        if (strlen(v) < sizeof x->last_mod) snprintf(x->last_mod, sizeof x->last_mod, "%s", v);
    } else if (!strncasecmp(line, "content-range:", 14)) {
        const char *v = line + 14;
        while (*v == ' ' || *v == '\t') v++;
        unsigned long long a, b, t;
        if (sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &t) == 3) {
            x->have_range = 1;
            x->range_start = a;
            x->range_total = (int64_t)t;
        } else if (sscanf(v, "bytes %llu-%llu/*", &a, &b) == 2) {
            x->have_range = 1;
            x->range_start = a;
        } else if (sscanf(v, "bytes */%llu", &t) == 1) {
            x->range_total = (int64_t)t;
        }
    } else if (!strncasecmp(line, "content-length:", 15)) {
        x->content_length = strtoll(line + 15, NULL, 10);
    }
    return len;
}

static void show_progress(xfer *x, int last) {
    double now = cm_time_s();
    if (!last && x->printed && now - x->last < 0.1) return;
    x->last = now;
    uint64_t have = x->offset + x->written;
    int64_t total = x->range_total >= 0 ? x->range_total
                  : x->content_length >= 0 ? (int64_t)(x->offset + (uint64_t)x->content_length) : -1;
    double el = now - x->t0, rate = el > 0 ? x->received / el / 1e6 : 0;
    if (total > 0)
        fprintf(stderr, "\r%9.1f / %.1f MiB %3d%% %8.2f MB/s ", have / 1048576.0, total / 1048576.0,
                (int)(100.0 * (double)have / (double)total), rate);
    else
        fprintf(stderr, "\r%9.1f MiB %8.2f MB/s ", have / 1048576.0, rate);
    if (last) fputc('\n', stderr);
    x->printed = 1;
}

/* Remembers what identifies the version of the file being written to the .part (strong ETag,
 * else Last-Modified), so that a resume can ask for the rest of that version only. */
static void save_validator(xfer *x) {
    const char *v = x->etag[0] ? x->etag : x->last_mod;
    unlink(x->vpath);
    if (!*v) return;
    int fd = open(x->vpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return; /* without it a later resume just sends no If-Range */
    size_t n = strlen(v);
    if (write(fd, v, n) != (ssize_t)n) {
        close(fd);
        unlink(x->vpath);
        return;
    }
    close(fd);
}

static void load_validator(xfer *x) {
    x->validator[0] = 0;
    int fd = open(x->vpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, x->validator, sizeof x->validator - 1);
    close(fd);
    x->validator[n > 0 ? n : 0] = 0;
    /* One header value: no line breaks or other control characters. */
    for (ssize_t i = 0; i < n; i++)
        if ((unsigned char)x->validator[i] < 0x20) x->validator[0] = 0;
}

static size_t on_body(char *buf, size_t size, size_t n, void *ud) {
    xfer *x = ud;
    size_t len = size * n;
    if (x->status < 200 || x->status >= 300) return len; /* an error page: not the file */
    if (!x->started) {
        x->started = 1;
        if (x->status == 206) {
            if (!x->have_range || x->range_start != x->offset) {
                x->bad_range = 1;
                return 0;
            }
        } else {
            if (x->offset) {
                /* The server ignored Range, or the file changed (If-Range): start over. */
                if (ftruncate(x->fd, 0)) {
                    x->write_errno = errno;
                    return 0;
                }
                x->offset = 0;
                x->restarted = 1;
                cm_sha256_init(&x->sha);
            }
            save_validator(x);
        }
    }
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(x->fd, buf + done, len - done, (off_t)(x->offset + x->written));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            x->write_errno = w < 0 ? errno : EIO;
            return 0;
        }
        done += (size_t)w;
        x->written += (uint64_t)w;
    }
    cm_sha256_update(&x->sha, buf, len);
    x->received += len;
    if (x->progress) show_progress(x, 0);
    return len;
}

/* One GET of url into x->fd, from x->offset on. Returns the curl code. */
static CURLcode fetch(const pull_opts *o, xfer *x, char *cerr) {
    CURL *c = curl_easy_init();
    if (!c) return CURLE_FAILED_INIT;
    char range[32];
    snprintf(range, sizeof range, "%llu-", (unsigned long long)x->offset);
    cerr[0] = 0;
    curl_easy_setopt(c, CURLOPT_URL, o->url);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_USERAGENT, "arka-pull/1");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, o->connect_timeout_s > 0 ? o->connect_timeout_s : 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, o->stall_timeout_s > 0 ? o->stall_timeout_s : 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    /* CURLOPT_RANGE rather than RESUME_FROM: libcurl then leaves a 200 answer to us. */
    struct curl_slist *hdrs = NULL;
    char ifrange[300];
    if (x->offset) {
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        load_validator(x);
        if (x->validator[0]) {
            snprintf(ifrange, sizeof ifrange, "If-Range: %s", x->validator);
            hdrs = curl_slist_append(NULL, ifrange);
            curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
        }
    }
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    CURLcode rc = curl_easy_perform(c);
    x->os_errno = 0;
    if (rc != CURLE_OK) curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &x->os_errno);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    return rc;
}

static void reset_response(xfer *x) {
    x->status = 0;
    x->reason[0] = 0;
    x->have_range = 0;
    x->range_total = -1;
    x->content_length = -1;
    x->started = 0;
    x->written = 0;
}

/* Downloads into the open, locked .part; on success the .part holds the whole file. */
static int download(const pull_opts *o, xfer *x, pull_result *res, char *err, size_t errlen) {
    char cerr[CURL_ERROR_SIZE];
    for (int attempt = 0;; attempt++) {
        reset_response(x);
        CURLcode rc = fetch(o, x, cerr);
        if (x->progress && x->printed) show_progress(x, 1), x->printed = 0;
        res->downloaded += x->written;
        if (x->write_errno) {
            snprintf(err, errlen, "%s: write failed: %s (partial download kept for resuming)", x->part, strerror(x->write_errno));
            return CM_EIO;
        }
        if (x->bad_range) {
            snprintf(err, errlen, "%s: server answered a Range request for byte %llu with a different range", o->url,
                     (unsigned long long)x->offset);
            return CM_ENET;
        }
        if (x->status == 416 && x->offset && attempt == 0) {
            /* Nothing past the .part's end: complete if the server's size equals it, else
             * the .part is not a prefix of this file: start over. */
            if (x->range_total == (int64_t)x->offset) return 0;
            if (ftruncate(x->fd, 0)) {
                snprintf(err, errlen, "%s: truncate failed: %s", x->part, strerror(errno));
                return CM_EIO;
            }
            x->offset = 0;
            x->restarted = 1;
            cm_sha256_init(&x->sha);
            continue;
        }
        if (rc != CURLE_OK) {
            uint64_t have = x->offset + x->written;
            if (rc == CURLE_PARTIAL_FILE || rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_RECV_ERROR)
                snprintf(err, errlen, "%s: transfer interrupted after %llu bytes: %s (run again to resume)", o->url,
                         (unsigned long long)have, cerr[0] ? cerr : curl_easy_strerror(rc));
            else if (x->os_errno)
                snprintf(err, errlen, "%s: %s (%s)", o->url, cerr[0] ? cerr : curl_easy_strerror(rc), strerror((int)x->os_errno));
            else
                snprintf(err, errlen, "%s: %s", o->url, cerr[0] ? cerr : curl_easy_strerror(rc));
            return rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT ? CM_EINVAL : CM_ENET;
        }
        if (x->status < 200 || x->status >= 300) {
            snprintf(err, errlen, "%s: HTTP %ld%s%s", o->url, x->status, x->reason[0] ? " " : "", x->reason);
            return CM_ENET;
        }
        uint64_t have = x->offset + x->written;
        int64_t total = x->status == 206 ? x->range_total
                      : x->content_length >= 0 ? x->content_length : -1;
        if (total >= 0 && have != (uint64_t)total) {
            snprintf(err, errlen, "%s: incomplete download: %llu of %lld bytes (run again to resume)", o->url,
                     (unsigned long long)have, (long long)total);
            return CM_ENET;
        }
        if (x->status == 206 && x->offset) res->resumed = 1;
        return 0;
    }
}

/* Downloads o->url. Returns 0, or: CM_EINVAL (bad URL, digest or directory), CM_ENET (HTTP
 * error status, connection, timeout, interrupted transfer), CM_EIO (disk: write, rename,
 * mkdir), CM_ECHECKSUM (digest mismatch), CM_ESTATE (another pull holds the .part),
 * CM_EUNSUPPORTED (no libcurl). err gets one line "URL-or-PATH: problem". */
static int pull(const pull_opts *o, pull_result *res, char *err, size_t errlen) {
    static int curl_ready;
    memset(res, 0, sizeof *res);
    if (!o->url || (strncasecmp(o->url, "http://", 7) && strncasecmp(o->url, "https://", 8))) {
        snprintf(err, errlen, "%s: only http:// and https:// URLs are supported", o->url ? o->url : "(null)");
        return CM_EINVAL;
    }
    uint8_t want[CM_SHA256_LEN];
    if (o->sha256 && cm_sha256_parse_hex(o->sha256, want)) {
        snprintf(err, errlen, "%s: not a SHA-256 digest (64 hex digits)", o->sha256);
        return CM_EINVAL;
    }
    char name[256], part[4096 + 8], vpath[4096 + 16];
    if (pull_name_from_url(o->url, name, sizeof name)) {
        snprintf(err, errlen, "%s: the URL does not end in a file name", o->url);
        return CM_EINVAL;
    }
    int rc = make_dirs(o->dir, err, errlen);
    if (rc) return rc;
    if (snprintf(res->path, sizeof res->path, "%s/%s", o->dir, name) >= (int)sizeof res->path) {
        snprintf(err, errlen, "%.64s...: path too long", o->dir);
        return CM_EINVAL;
    }
    snprintf(part, sizeof part, "%s.part", res->path);
    snprintf(vpath, sizeof vpath, "%s.part.etag", res->path);

    /* Already there: done, if it has the asked-for digest. */
    struct stat sb;
    if (stat(res->path, &sb) == 0) {
        res->already = 1;
        res->bytes = (uint64_t)sb.st_size;
        if (!o->sha256) return 0;
        int fd = open(res->path, O_RDONLY | O_CLOEXEC);
        cm_sha256_ctx c;
        cm_sha256_init(&c);
        if (fd < 0 || hash_fd(fd, res->bytes, &c)) {
            snprintf(err, errlen, "%s: cannot read: %s", res->path, strerror(errno));
            if (fd >= 0) close(fd);
            return CM_EIO;
        }
        close(fd);
        uint8_t got[CM_SHA256_LEN];
        cm_sha256_final(&c, got);
        cm_sha256_hex(got, res->sha256);
        if (memcmp(got, want, sizeof got)) {
            snprintf(err, errlen, "%s: exists with sha256 %s, not %s; remove it to download again", res->path, res->sha256,
                     o->sha256);
            return CM_ECHECKSUM;
        }
        return 0;
    }

    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
            snprintf(err, errlen, "%s: libcurl initialization failed", o->url);
            return CM_ENET;
        }
        curl_ready = 1;
    }
    xfer x;
    memset(&x, 0, sizeof x);
    x.part = part;
    x.vpath = vpath;
    x.progress = o->progress;
    x.t0 = x.last = cm_time_s();
    cm_sha256_init(&x.sha);
    x.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (x.fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", part, strerror(errno));
        return CM_EIO;
    }
    if (flock(x.fd, LOCK_EX | LOCK_NB)) {
        snprintf(err, errlen, "%s: another download of this file is in progress", part);
        close(x.fd);
        return CM_ESTATE;
    }
    if (fstat(x.fd, &sb) || hash_fd(x.fd, (uint64_t)sb.st_size, &x.sha)) {
        snprintf(err, errlen, "%s: cannot read: %s", part, strerror(errno));
        close(x.fd);
        return CM_EIO;
    }
    x.offset = (uint64_t)sb.st_size;
    rc = download(o, &x, res, err, errlen);
    res->restarted = x.restarted;
    if (!rc && fsync(x.fd)) {
        snprintf(err, errlen, "%s: fsync failed: %s (partial download kept for resuming)", part, strerror(errno));
        rc = CM_EIO;
    }
    if (rc) {
        /* Keep a partial download for resuming, but leave no empty .part behind. */
        if (x.offset + x.written == 0) {
            unlink(part);
            unlink(vpath);
        }
        close(x.fd);
        return rc;
    }
    res->bytes = x.offset + x.written;
    uint8_t got[CM_SHA256_LEN];
    cm_sha256_final(&x.sha, got);
    cm_sha256_hex(got, res->sha256);
    if (o->sha256 && memcmp(got, want, sizeof got)) {
        unlink(part);
        unlink(vpath);
        close(x.fd);
        snprintf(err, errlen, "%s: checksum mismatch: expected sha256 %s, got %s (download removed)", o->url, o->sha256,
                 res->sha256);
        return CM_ECHECKSUM;
    }
    /* Rename while still holding the lock, so no second pull can open the .part in between. */
    if (rename(part, res->path)) {
        snprintf(err, errlen, "%s: rename to %s failed: %s", part, res->path, strerror(errno));
        close(x.fd);
        return CM_EIO;
    }
    unlink(vpath);
    close(x.fd);
    int dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* make the rename durable; failure here loses nothing already verified */
        close(dfd);
    }
    return 0;
}

#else /* !ARKA_WITH_CURL */

static int pull(const pull_opts *o, pull_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    (void)hash_fd;
    (void)make_dirs;
    snprintf(err, errlen, "%s: this build has no libcurl (install libcurl4-openssl-dev and rebuild)", o->url ? o->url : "pull");
    return CM_EUNSUPPORTED;
}

#endif

int cli_pull(int argc, char **argv) {
    const char *dir = NULL, *sha = NULL;
    int progress = 0;
    cm_opt opts[] = {
        { "output-dir", 'o', CM_OPT_STR, &dir, "directory to save into (default ${ARKA_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/arka}/models)" },
        { "sha256", 0, CM_OPT_STR, &sha, "expected SHA-256 (64 hex digits); the file is kept only if it matches" },
        { "progress", 0, CM_OPT_BOOL, &progress, "show a progress line even when stderr is not a terminal" },
        { 0 },
    };
    char err[3 * 4096 + 256]; /* messages name up to two paths of 4096 bytes */
    int npos;
    char **pos;
    int rc = cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err);
    if (rc || npos != 1) {
        int help = rc && !strcmp(err, "help");
        if (rc && !help) fprintf(stderr, "arka pull: %s\n", err);
        else if (!rc) fprintf(stderr, "arka pull: expected exactly one URL\n");
        fprintf(help ? stdout : stderr, "usage: arka pull URL [-o DIR] [--sha256 HEX] [--progress]\n");
        cm_config_usage(opts, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    char defdir[4096];
    if (!dir || !*dir) {
        if (pull_default_dir(defdir, sizeof defdir)) {
            fprintf(stderr, "arka pull: no download directory: set -o DIR, ARKA_CACHE_DIR or HOME\n");
            return 2;
        }
        dir = defdir;
    }
    pull_opts o = { .url = pos[0], .dir = dir, .sha256 = sha && *sha ? sha : NULL,
                        .progress = progress || isatty(2) };
    pull_result r;
    rc = pull(&o, &r, err, sizeof err);
    if (rc) {
        fprintf(stderr, "arka pull: %s\n", err);
        return rc == CM_EINVAL ? 2 : 1;
    }
    if (r.already)
        fprintf(stderr, "arka pull: %s already present (%llu bytes%s%s)\n", r.path, (unsigned long long)r.bytes,
                r.sha256[0] ? ", sha256 " : "", r.sha256);
    else
        fprintf(stderr, "arka pull: saved %s (%llu bytes, %llu downloaded%s, sha256 %s)\n", r.path,
                (unsigned long long)r.bytes, (unsigned long long)r.downloaded,
                r.resumed ? ", resumed" : r.restarted ? ", server ignored the resume request" : "", r.sha256);
    printf("%s\n", r.path);
    return 0;
}
