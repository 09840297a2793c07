/* gw_internal: structures shared by the gateway's own files (http_parse.c, http.c, ws.c).
 * Not for use outside gateway/. */
#ifndef GW_INTERNAL_H
#define GW_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/http.h"

#define GW__MAX_HEADERS 100

struct gw__hdr {
    const char *name;
    const char *value;
};

enum gw__resp_state { GW__RESP_NONE = 0, GW__RESP_STREAMING, GW__RESP_ENDED };

struct gw_req {
    gw_conn *conn;          /* NULL when owned by a bare parser (tests, fuzzing) */
    int      method;        /* enum llhttp_method */
    int      http_minor;
    int      upgrade;       /* Connection: upgrade + Upgrade header */
    int      keep_alive;    /* the client allows keep-alive after this request */
    const char *path;       /* into the parser's header buffer */
    const char *query;
    int      nh;
    struct gw__hdr h[GW__MAX_HEADERS];
    char    *body;          /* parser-owned, NUL-terminated */
    size_t   body_len;
    /* response side (http.c) */
    int      resp_state;    /* enum gw__resp_state */
    int      chunked;       /* stream framing: 1 chunked, 0 close-delimited */
    void   (*abort_cb)(gw_req *r, void *ud);
    void    *abort_ud;
};

#endif
