/* pull: download a model file over HTTP(S) into a directory, resumably and verifiably.
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
 *   mdl_pull_opts o = { .url = url, .dir = dir, .sha256 = hex_or_null, .progress = isatty(2) };
 *   mdl_pull_result r; char err[512];
 *   if (mdl_pull(&o, &r, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
 *   printf("%s\n", r.path);
 *
 * Uses libcurl (built in when ARKA_WITH_CURL is defined; otherwise mdl_pull returns
 * CM_EUNSUPPORTED). Call from a process's main thread (it runs curl_global_init once).
 */
#ifndef MDL_PULL_H
#define MDL_PULL_H

#include <stddef.h>
#include <stdint.h>

typedef struct mdl_pull_opts {
    const char *url;               /* http:// or https:// */
    const char *dir;               /* destination directory, created (with parents) if missing */
    const char *sha256;            /* expected digest as 64 hex digits, or NULL */
    int         progress;          /* 1: a progress line on stderr (bytes, %, MB/s) */
    long        connect_timeout_s; /* 0: 30 s */
    long        stall_timeout_s;   /* abort when under 1 byte/s for this long; 0: 60 s */
} mdl_pull_opts;

typedef struct mdl_pull_result {
    char     path[4096];    /* the final file */
    char     sha256[65];    /* its digest in hex ("" when it already existed and no digest was asked for) */
    uint64_t bytes;         /* its size */
    uint64_t downloaded;    /* bytes received by this call */
    int      resumed;       /* a .part was continued with a 206 answer */
    int      restarted;     /* a .part existed but the server sent the whole file */
    int      already;       /* the final file was already there (and matched the digest, if given) */
} mdl_pull_result;

/* Downloads o->url. Returns 0, or: CM_EINVAL (bad URL, digest or directory), CM_ENET (HTTP
 * error status, connection, timeout, interrupted transfer), CM_EIO (disk: write, rename,
 * mkdir), CM_ECHECKSUM (digest mismatch), CM_ESTATE (another pull holds the .part),
 * CM_EUNSUPPORTED (no libcurl). err gets one line "URL-or-PATH: problem". */
int mdl_pull(const mdl_pull_opts *o, mdl_pull_result *res, char *err, size_t errlen);

/* The file name a URL downloads to: its last path segment without query or fragment,
 * percent-decoded. 0, or CM_EINVAL when there is none or it is not a plain file name. */
int mdl_pull_name_from_url(const char *url, char *name, size_t len);

/* ${ARKA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/arka}/models. 0 or CM_EINVAL (no HOME). */
int mdl_pull_default_dir(char *out, size_t len);

#endif
