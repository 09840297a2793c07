/* auth: API keys and quotas for the gateway's generate routes.
 *
 * Keys are "ak-" + 48 hex digits (192 random bits from getrandom). Only HMAC-SHA256(secret, key)
 * is ever stored; a presented key is hashed and compared in constant time (CRYPTO_memcmp)
 * against every stored hash. Each key carries a tenant, the models it may use (or all), and
 * limits: requests per minute, tokens per minute, concurrent requests, tokens per UTC day
 * (0 means unlimited for each), and an enabled flag.
 *
 * The in-process store (this file's gw_auth without Redis) reads the keys file (config/keys.conf
 * documents the format), re-reads it when it changes (checked at most every reload_ms), and keeps
 * the counters in memory; daily usage is written to "<keys file>.usage" (at most once a second
 * and at destroy) so budgets survive a restart and `arka keys usage` can read them.
 *
 * Limits use fixed windows: the minute (epoch ms / 60000) and the UTC day. At admission a request
 * reserves tokens; the prompt length is not known before tokenization, so the reservation is
 * body bytes / 2 (a bound on prompt tokens for typical text: JSON overhead and BPE tokens of
 * ~4 bytes keep it above the real count) plus n * max_tokens (or n * reserve_default without
 * max_tokens). When the request ends, gw_auth_settle() replaces the reservation with the real
 * usage, exactly once, and frees the concurrency slot.
 *
 * Loop thread only (the clock callback and the keys file are read from it).
 *
 *   gw_auth_cfg c; gw_auth_cfg_default(&c); c.keys_file = "keys.conf"; c.secret = s; c.secret_len = n;
 *   gw_auth *a; gw_auth_create(loop, &c, &a);
 *   gw_auth_admit(a, bearer, model, gw_auth_reserve(a, body_len, max_tokens, n), on_admit, ud);
 *   ... on_admit(ud, res): res->status == 0: serve, keep res->ticket ...
 *   gw_auth_settle(a, &ticket, prompt_tokens + completion_tokens);   // once, when the request ends
 *   gw_auth_destroy(a);
 */
#ifndef GW_AUTH_H
#define GW_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#define GW_KEY_PREFIX     "ak-"
#define GW_KEY_HEX        48                  /* hex digits after the prefix (192 bits) */
#define GW_KEY_BUF        (3 + GW_KEY_HEX + 1)
#define GW_KEY_ID_BUF     13                  /* 12 hex digits of the hash + NUL */
#define GW_TENANT_MAX     64
#define GW_MODELS_MAX     256
#define GW_WEIGHT_MAX     1000                /* a key's fair-share weight (shm/shm.h SHM_MAX_WEIGHT) */

/* ---- keys and the keys file ------------------------------------------------------------ */

typedef struct gw_key {
    uint8_t hash[32];                 /* HMAC-SHA256(secret, key text) */
    char    id[GW_KEY_ID_BUF];        /* first 12 hex digits of the hash: names the key in lists */
    char    tenant[GW_TENANT_MAX];    /* [A-Za-z0-9._-]+ */
    char    models[GW_MODELS_MAX];    /* comma-separated model ids, or "*" for all */
    int64_t rpm, tpm;                 /* requests / tokens per minute (0: unlimited) */
    int64_t concurrency;              /* requests in flight (0: unlimited) */
    int64_t daily_tokens;             /* tokens per UTC day (0: no budget) */
    int64_t weight;                   /* fair-share weight of its requests in the executors'
                                       * scheduling, 1..GW_WEIGHT_MAX (0 read as 1) */
    int     enabled;
    int64_t created;                  /* unix seconds */
} gw_key;

/* Fills out with a new key ("ak-" + 48 hex, NUL-terminated). Returns 0 or CM_EIO (getrandom). */
int  gw_key_generate(char out[GW_KEY_BUF]);
/* HMAC-SHA256(secret, key) into hash, and the key id (12 hex) into id when id is not NULL. Can't fail. */
void gw_key_hash(const uint8_t *secret, size_t secret_len, const char *key, size_t key_len, uint8_t hash[32],
                 char id[GW_KEY_ID_BUF]);
/* 1 when s has the shape of a key ("ak-" + 48 lower-case hex). */
int  gw_key_well_formed(const char *s, size_t len);
/* 1 when model is in k->models (or k->models is "*" or empty). */
int  gw_key_allows(const gw_key *k, const char *model);
/* 1 when tenant is a valid tenant name (1..63 of [A-Za-z0-9._-]). */
int  gw_tenant_valid(const char *tenant);
/* The id an executor knows a tenant by (SUBMIT's tenant): a 64-bit hash of the name, never 0;
 * 0 for NULL or "" (no key store). Can't fail. */
uint64_t gw_tenant_id(const char *tenant);

/* Reads a keys file into a malloc'ed array (*keys, free() it; *n may be 0). A file that does not
 * exist reads as empty. Returns 0, CM_EIO, CM_ENOMEM, or CM_EFORMAT with "path:line: reason" in err. */
int  gw_keyfile_load(const char *path, gw_key **keys, int *n, char *err, size_t errlen);
/* Appends one key line (creating the file 0600 with a header comment). Returns 0, CM_EIO. */
int  gw_keyfile_append(const char *path, const gw_key *k);
/* Sets the enabled flag of the key whose id (or full 64-hex hash) is id, rewriting the file
 * atomically (temporary file + rename). Returns 0, CM_ENOTFOUND, CM_EIO, CM_EFORMAT. */
int  gw_keyfile_set_enabled(const char *path, const char *id, int enabled);
/* One keys-file line for k (without newline) into buf. Returns the length or -1 if cap is short. */
int  gw_key_format(const gw_key *k, char *buf, size_t cap);

/* The server secret: given (flag, ARKA_AUTH_SECRET or config auth-secret) when not NULL/empty;
 * otherwise "<keys_file>.secret", created with 32 random bytes (hex) and mode 0600 when create is
 * set and the file is missing. A secret file readable by group or others is refused. The secret
 * is the text itself (no trailing newline), up to cap bytes. Returns 0, CM_ENOENT (no secret and
 * create unset), CM_EIO, CM_EINVAL (empty, too long, bad permissions) with a reason in err. */
int  gw_auth_secret_load(const char *given, const char *keys_file, int create, uint8_t *out, size_t cap, size_t *len,
                         char *err, size_t errlen);

/* Daily usage written by the in-process store next to the keys file: "<keys_file>.usage". */
typedef struct gw_key_usage {
    char    id[GW_KEY_ID_BUF];
    int64_t day;              /* UTC day (unix seconds / 86400) */
    int64_t tokens, requests; /* settled that day */
} gw_key_usage;
/* Reads "<keys_file>.usage" (missing: *n = 0). Returns 0, CM_EIO, CM_ENOMEM. */
int  gw_usage_load(const char *keys_file, gw_key_usage **u, int *n);

/* ---- admission --------------------------------------------------------------------------- */

typedef struct gw_auth gw_auth;

typedef struct gw_auth_cfg {
    const char    *keys_file;       /* the in-process store's keys file */
    const char    *redis_url;       /* redis://HOST:PORT[/DB]: the shared store (auth_redis.c) */
    const uint8_t *secret;          /* copied */
    size_t         secret_len;
    int64_t        reserve_default; /* completion tokens reserved per choice without max_tokens (1024) */
    uint32_t       reload_ms;       /* keys-file change check period (1000) */
    int            fail_closed;     /* redis: refuse (503) instead of falling back locally */
    /* the clock (ms since the epoch); NULL: CLOCK_REALTIME. Tests pass a fake. */
    int64_t      (*clock)(void *ud);
    void          *clock_ud;
} gw_auth_cfg;

/* One admitted request's claim on the limits; settle it exactly once. Owned by the caller. */
typedef struct gw_auth_ticket {
    char    id[GW_KEY_ID_BUF];
    char    tenant[GW_TENANT_MAX];
    int64_t minute, day;      /* windows of admission */
    int64_t reserved;         /* tokens reserved */
    int     live;             /* 1 until settled */
    uint32_t weight;          /* the key's fair-share weight (1..GW_WEIGHT_MAX) */
    int     fallback;         /* admitted by the local limiter while Redis was unavailable */
    char    lease[48];        /* Redis: the concurrency lease (and settle-once marker) */
} gw_auth_ticket;

typedef struct gw_auth_result {
    int     status;           /* 0 admitted; 401, 403, 429, 503 refused */
    char    type[32];         /* OpenAI error type ("invalid_request_error", ...) */
    char    code[40];         /* "invalid_api_key", "model_not_allowed", "rate_limit_exceeded", ... */
    char    msg[200];
    char    tenant[GW_TENANT_MAX]; /* the key's tenant when the key was recognised ("" for 401 unknown) */
    int     should_retry;     /* x-should-retry */
    int64_t retry_after_s;    /* Retry-After (429/503) */
    /* rate-limit headers; limit 0: that dimension is unlimited (its headers are left out) */
    int64_t lim_req, rem_req, reset_req_ms;
    int64_t lim_tok, rem_tok, reset_tok_ms;
    gw_auth_ticket ticket;    /* status 0: the claim to settle */
} gw_auth_result;

/* Called once per gw_auth_admit, maybe before gw_auth_admit returns. res is valid during the call. */
typedef void (*gw_auth_cb)(void *ud, const gw_auth_result *res);

/* Defaults: reserve_default 1024, reload_ms 1000, fail open. Can't fail. */
void gw_auth_cfg_default(gw_auth_cfg *c);
/* Loads the keys (in-process store) or connects to Redis (redis_url set). Returns 0, CM_EINVAL
 * (no secret, bad URL), CM_EFORMAT (keys file), CM_EIO, CM_ENOMEM, CM_EUNSUPPORTED (no hiredis). */
int  gw_auth_create(uv_loop_t *loop, const gw_auth_cfg *c, gw_auth **out);
/* Closes the Redis connection and timer (pending admissions are answered 503, later ones are
 * limited locally); their handles close when the loop runs next. Call it while the loop still
 * runs (e.g. when the HTTP server has closed) so that uv_run can return. Idempotent; a no-op for
 * the in-process store. */
void gw_auth_shutdown(gw_auth *a);
/* Frees the store (after gw_auth_shutdown and a loop run, or for the in-process store at any
 * time); writes the usage file. Accepts NULL. */
void gw_auth_destroy(gw_auth *a);

/* Tokens to reserve for a request of body_len bytes asking n choices of max_tokens (-1: not given). */
int64_t gw_auth_reserve(const gw_auth *a, size_t body_len, int max_tokens, int n);

/* Admits (or refuses) one request presenting bearer (the text after "Bearer ", may be NULL) for
 * model, reserving reserve tokens. cb runs exactly once: before return for the in-process store,
 * later from the loop with Redis. Can't fail (errors become a refusal in cb). */
void gw_auth_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_cb cb, void *ud);

/* Checks only who bearer is, from a request's headers before its body is read: cb(ud, res) with
 * res->status 0 (a key the store knows and has not revoked; res->tenant set), 401 (none, not a
 * key, unknown or revoked) or 503 (the store cannot tell: Redis away with fail_closed). Limits
 * are not checked or charged (gw_auth_admit does that once the body is in). cb runs exactly
 * once: before return for the in-process store and for a key Redis was asked about before,
 * else later from the loop (within the Redis call timeout). Not counted in the admission stats. */
void gw_auth_identify(gw_auth *a, const char *bearer, gw_auth_cb cb, void *ud);

/* Ends a claim: the reservation is replaced by used_tokens (prompt + completion, as really
 * consumed: also for failed and cancelled requests) and the concurrency slot is freed. A ticket
 * that is not live (already settled, or zeroed) is ignored, so a second call is harmless. */
void gw_auth_settle(gw_auth *a, gw_auth_ticket *t, int64_t used_tokens);

typedef struct gw_auth_stats {
    uint64_t admitted, refused;  /* admissions answered */
    uint64_t fallback_admits;    /* admitted by the local limiter because Redis was unavailable */
    uint64_t redis_errors;       /* failed or timed-out Redis calls */
    uint64_t settles;
} gw_auth_stats;
/* Counters for /metrics. Can't fail. */
void gw_auth_stats_get(const gw_auth *a, gw_auth_stats *st);

/* Per-tenant counters for /metrics (labels carry the tenant name, never a key). Tenants beyond
 * GW_AUTH_TENANTS_MAX are counted under "_other". */
#define GW_AUTH_TENANTS_MAX 1024
typedef struct gw_auth_tenant_stats {
    const char *tenant;
    uint64_t admitted;        /* requests admitted */
    uint64_t refused;         /* refused for this tenant's key: revoked, model, limits, budget */
    uint64_t tokens;          /* tokens settled (prompt + completion) */
} gw_auth_tenant_stats;
/* Calls fn once per tenant seen so far (loop thread). Can't fail. */
void gw_auth_tenants(const gw_auth *a, void (*fn)(void *ud, const gw_auth_tenant_stats *t), void *ud);

/* Redis key management (blocking; for `arka keys --redis` and tests). Return 0, CM_EIO (with
 * err), CM_ENOTFOUND, CM_ENOMEM, CM_EUNSUPPORTED (built without hiredis). */
int  gw_redis_key_put(const char *url, const gw_key *k, char *err, size_t errlen);
/* Every key (and, when usage is not NULL, today's usage of each, same order). free() both. */
int  gw_redis_keys_list(const char *url, gw_key **keys, int *n, gw_key_usage **usage, char *err, size_t errlen);
int  gw_redis_key_set_enabled(const char *url, const char *id, int enabled, char *err, size_t errlen);

/* Current counters of one key in the in-process store (for tests and `arka keys usage`): 0 and
 * the values, or CM_ENOTFOUND. */
int  gw_auth_key_state(gw_auth *a, const char *id, int64_t *req_minute, int64_t *tok_minute, int64_t *inflight,
                       int64_t *tok_day);

#endif
