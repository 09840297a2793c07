/* auth_internal: what auth.c (keys, in-process store, limiter) and auth_redis.c share. */
#ifndef GW_AUTH_INTERNAL_H
#define GW_AUTH_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "gateway/auth.h"

/* One key's counters (in-process store, and the local limiter Redis falls back to). */
typedef struct gw__kstate {
    int64_t minute, req_m, tok_m;   /* current minute window: requests and tokens */
    int64_t day, req_d, tok_d;      /* current UTC day */
    int64_t inflight;               /* admitted, not yet settled */
} gw__kstate;

struct gw_auth {
    gw_auth_cfg cfg;                /* secret and redis_url cleared; keys_file points at keys_path */
    uv_loop_t  *loop;
    uint8_t     secret[256];
    size_t      secret_len;
    char       *keys_path;
    gw_key     *keys;               /* the keys file's keys */
    gw__kstate *state;              /* [n_keys] */
    int         n_keys;
    int64_t     checked;            /* last keys-file change check (ms) */
    ino_t       f_ino;
    off_t       f_size;
    struct timespec f_mtime;
    int         usage_dirty;
    int64_t     usage_flushed;
    gw_auth_stats stats;
    gw_auth_tenant_stats *tenants;  /* [n_tenants]; tenant strings owned */
    int         n_tenants;
    struct gw__redis *redis;        /* NULL: in-process store */
};

int64_t gw__auth_now(const gw_auth *a);
/* Counts an answered admission (global and per tenant). */
void    gw__auth_count(gw_auth *a, const gw_auth_result *r);
void    gw__auth_refuse(gw_auth_result *r, int status, const char *type, const char *code, int retry, int64_t after_s,
                        const char *fmt, ...) __attribute__((format(printf, 7, 8)));
void    gw__refuse_key(gw_auth_result *r);
/* The limiter: admits (committing the counters) or fills the refusal. */
void    gw__limit_admit(const gw_key *k, gw__kstate *s, int64_t now, const char *model, int64_t reserve, gw_auth_result *r);
void    gw__limit_settle(gw__kstate *s, const gw_auth_ticket *t, int64_t now, int64_t used);
/* In-process store: index of the key bearer names (and its key and counters), or -1. */
int     gw__local_lookup(gw_auth *a, const char *bearer, const gw_key **k, gw__kstate **s);
void    gw__local_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_result *r);
void    gw__local_settle(gw_auth *a, const gw_auth_ticket *t, int64_t used);

/* auth_redis.c */
int  gw__redis_open(gw_auth *a, const char *url);
void gw__redis_shutdown(gw_auth *a);
void gw__redis_close(gw_auth *a);
void gw__redis_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_cb cb, void *ud);
void gw__redis_identify(gw_auth *a, const char *bearer, gw_auth_cb cb, void *ud);
void gw__redis_settle(gw_auth *a, const gw_auth_ticket *t, int64_t used);

#endif
