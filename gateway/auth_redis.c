/* auth_redis: the key store and quotas in Redis, shared by every gateway that points at it.
 *
 * hiredis's async API on the gateway's libuv loop. Data (every quota key carries the hash tag
 * {tenant}, so one admission's keys live in one Redis Cluster slot):
 *
 *   arka:keyidx:<hash hex>                 "tenant id": which record a presented key names
 *   arka:{T}:key:<id>                      HASH tenant models rpm tpm concurrency daily_tokens weight enabled created
 *   arka:{T}:k:<id>:m:<minute>             HASH req tok   (expires after 2 minutes)
 *   arka:{T}:k:<id>:d:<day>                HASH req tok   (expires after 2 days)
 *   arka:{T}:k:<id>:lease                  ZSET lease id -> expiry ms: requests in flight; a lease
 *                                          not renewed (dead gateway) drops out after lease_ms
 *   arka:{T}:settled:<lease>               settle-once marker (1 hour)
 *
 * Admission is one EVALSHA of ADMIT (EVAL again on NOSCRIPT); the key index is read with GET on
 * a cache miss only (cached KEY_CACHE_MS while Redis answers). Settlement is one EVALSHA of
 * SETTLE, made idempotent by the marker, so it is retried after a reconnect. Live leases are
 * renewed every lease_ms / 3.
 *
 * Every command has a timeout: replies come in order, so the send time of the oldest unanswered
 * command is known, and one unanswered for CMD_TIMEOUT_MS drops the connection (its admissions
 * are answered by the fallback, its settlements queued for the next connection). An admission
 * carries a deadline in Redis's clock (the moment the fallback answers it here; the clocks'
 * offset is measured by every POLL): ADMIT refuses to run later, so a request that waited
 * through a hang is admitted by the fallback (with no lease in Redis) or refused, never granted
 * a lease nobody will release; leases live on Redis's clock and expire LEASE_MS after their last
 * renewal.
 *
 * Revocations: `arka keys revoke` (and every key write) adds the key to the set arka:revoked (or
 * removes it) and increments arka:rev. POLL (every POLL_MS: Redis's TIME, arka:rev, and the set
 * when arka:rev moved) keeps the revoked state of every cached key with the version it came from,
 * so a revocation reaches every gateway within POLL_MS while Redis answers, and holds afterwards
 * however long Redis stays away.
 *
 * Redis down or slow (no answer within OP_TIMEOUT_MS): a key Redis confirmed before (and not
 * revoked as of the last POLL) is admitted by the local limiter (auth.c) with its cached limits,
 * starting from the counts Redis last reported to this gateway (each gateway limits on its own
 * meanwhile), counted in fallback_admits, for as long as the outage lasts; an unknown key gets
 * 401 with x-should-retry: true. With fail_closed, 503 instead. A late reply that admitted is
 * undone (settled with 0 tokens). Reconnects back off from 100 ms to 5 s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/auth_internal.h"

#ifndef ARKA_WITH_HIREDIS

int gw__redis_open(gw_auth *a, const char *url) {
    (void)a, (void)url;
    return CM_EUNSUPPORTED;
}
void gw__redis_shutdown(gw_auth *a) { (void)a; }
void gw__redis_close(gw_auth *a) { (void)a; }
/* A new operation for bearer (queued in r->ops), or NULL after answering cb itself (not a key,
 * out of memory). */
void gw__redis_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_cb cb, void *ud) {
    (void)a, (void)bearer, (void)model, (void)reserve, (void)cb, (void)ud;
}
void gw__redis_identify(gw_auth *a, const char *bearer, gw_auth_cb cb, void *ud) {
    (void)a, (void)bearer, (void)cb, (void)ud;
}
void gw__redis_settle(gw_auth *a, const gw_auth_ticket *t, int64_t used) { (void)a, (void)t, (void)used; }
/* A key's enabled state changed (or was written): the revoked set follows it and the version
 * moves, so every gateway's POLL picks it up. */
static int revocation_note(redisContext *c, const char *tenant, const char *id, int enabled) {
    redisReply *rp = redisCommand(c, "%s %s %s:%s", enabled ? "SREM" : "SADD", REVOKED_KEY, tenant, id);
    int rc = !rp || rp->type == REDIS_REPLY_ERROR ? CM_EIO : 0;
    if (rp) freeReplyObject(rp);
    if (rc) return rc;
    rp = redisCommand(c, "INCR %s", REV_KEY);
    rc = !rp || rp->type == REDIS_REPLY_ERROR ? CM_EIO : 0;
    if (rp) freeReplyObject(rp);
    return rc;
}

int gw_redis_key_put(const char *url, const gw_key *k, char *err, size_t errlen) {
    snprintf(err, errlen, "this build has no hiredis");
    return CM_EUNSUPPORTED;
}
int gw_redis_keys_list(const char *url, gw_key **keys, int *n, gw_key_usage **usage, char *err, size_t errlen) {
    snprintf(err, errlen, "this build has no hiredis");
    return CM_EUNSUPPORTED;
}
int gw_redis_key_set_enabled(const char *url, const char *id, int enabled, char *err, size_t errlen) {
    snprintf(err, errlen, "this build has no hiredis");
    return CM_EUNSUPPORTED;
}

#else

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#define OP_TIMEOUT_MS   250     /* an admission's answer: the fallback's after this */
#define CMD_TIMEOUT_MS  1000    /* any command: unanswered this long drops the connection */
#define CMD_RING        4096    /* commands waiting for replies at most */
#define POLL_MS         1000    /* TIME, revocation version */
#define KEY_CACHE_MS    60000
#define KEY_CACHE_MAX   4096
#define LEASE_MS        60000
#define SETTLE_QUEUE    4096
#define TICK_MS         50

static const char REV_KEY[] = "arka:rev";          /* revocation version: +1 on every key write */
static const char REVOKED_KEY[] = "arka:revoked";  /* "tenant:id" of every disabled key */

/* ARGV: now (this gateway's clock: minute and day windows), reserve, model, lease, lease ttl,
 * deadline (Redis's clock, ms; 0: none). Leases are scored on Redis's clock. */
static const char ADMIT_LUA[] =
    "local t = redis.call('TIME')\n"
    "local rnow = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local dl = tonumber(ARGV[6]) or 0\n"
    "if dl > 0 and rnow > dl then return {-2} end\n"
    "local r = redis.call('HMGET', KEYS[1], 'enabled', 'models', 'rpm', 'tpm', 'concurrency', 'daily_tokens', 'weight')\n"
    "if not r[1] then return {-1} end\n"
    "local lim = {tonumber(r[3]) or 0, tonumber(r[4]) or 0, tonumber(r[5]) or 0, tonumber(r[6]) or 0}\n"
    "local models = r[2] or '*'\n"
    "local now, reserve = tonumber(ARGV[1]), tonumber(ARGV[2])\n"
    "local mreq = tonumber(redis.call('HGET', KEYS[2], 'req') or '0')\n"
    "local mtok = tonumber(redis.call('HGET', KEYS[2], 'tok') or '0')\n"
    "local dtok = tonumber(redis.call('HGET', KEYS[3], 'tok') or '0')\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', rnow)\n"
    "local inf = redis.call('ZCARD', KEYS[4])\n"
    "local function out(c) return {c, lim[1], lim[2], lim[3], lim[4], mreq, mtok, dtok, inf, models, tonumber(r[7]) or 1} end\n"
    "if r[1] ~= '1' then return out(2) end\n"
    "if models ~= '*' and models ~= '' and not string.find(','..models..',', ','..ARGV[3]..',', 1, true) then return out(3) end\n"
    "if lim[4] > 0 and dtok + reserve > lim[4] then return out(4) end\n"
    "if lim[2] > 0 and reserve > lim[2] then return out(5) end\n"
    "if lim[3] > 0 and inf >= lim[3] then return out(6) end\n"
    "if lim[1] > 0 and mreq >= lim[1] then return out(7) end\n"
    "if lim[2] > 0 and mtok + reserve > lim[2] then return out(8) end\n"
    "redis.call('HINCRBY', KEYS[2], 'req', 1)\n"
    "redis.call('HINCRBY', KEYS[2], 'tok', reserve)\n"
    "redis.call('PEXPIRE', KEYS[2], 120000)\n"
    "redis.call('HINCRBY', KEYS[3], 'req', 1)\n"
    "redis.call('HINCRBY', KEYS[3], 'tok', reserve)\n"
    "redis.call('EXPIRE', KEYS[3], 172800)\n"
    "redis.call('ZADD', KEYS[4], rnow + tonumber(ARGV[5]), ARGV[4])\n"
    "redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[5]) * 2)\n"
    "mreq = mreq + 1; mtok = mtok + reserve; dtok = dtok + reserve; inf = inf + 1\n"
    "return out(0)\n";

/* KEYS: minute of admission, day of admission, leases, current minute, marker; ARGV: lease, delta */
static const char SETTLE_LUA[] =
    "if not redis.call('SET', KEYS[5], '1', 'NX', 'PX', 3600000) then return 0 end\n"
    "redis.call('ZREM', KEYS[3], ARGV[1])\n"
    "local d = tonumber(ARGV[2])\n"
    "local function adj(k)\n"
    "  if redis.call('EXISTS', k) == 0 then return false end\n"
    "  if redis.call('HINCRBY', k, 'tok', d) < 0 then redis.call('HSET', k, 'tok', 0) end\n"
    "  return true\n"
    "end\n"
    "if not adj(KEYS[1]) and d > 0 then\n"
    "  redis.call('HINCRBY', KEYS[4], 'tok', d)\n"
    "  redis.call('PEXPIRE', KEYS[4], 120000)\n"
    "end\n"
    "adj(KEYS[2])\n"
    "return 1\n";

/* KEYS: the revocation version, the revoked set; ARGV: the version this gateway has. */
static const char POLL_LUA[] =
    "local t = redis.call('TIME')\n"
    "local v = redis.call('GET', KEYS[1]) or '0'\n"
    "if v == ARGV[1] then return {t[1], t[2], v} end\n"
    "return {t[1], t[2], v, redis.call('SMEMBERS', KEYS[2])}\n";

/* A key seen through Redis: what the fallback needs. */
typedef struct kcache {
    uint8_t    hash[32];
    gw_key     k;           /* tenant, id, limits and models as Redis last said */
    gw__kstate s;           /* the local limiter's counters (fallback only) */
    int64_t    seen;        /* ms */
    int        known;       /* limits are filled (an admission reply came back) */
    int        revoked;     /* in arka:revoked as of the last POLL (or refused as disabled since) */
} kcache;

typedef struct rop rop;

/* A live lease (renewed until settled). */
typedef struct lease {
    char tenant[GW_TENANT_MAX], id[GW_KEY_ID_BUF], lease[48];
    struct lease *prev, *next;
} lease;

/* A settlement waiting for Redis. */
typedef struct settle_rec {
    struct gw__redis *r;
    gw_auth_ticket t;
    char lease[48];
    int64_t delta, now;
} settle_rec;

typedef struct gw__redis {
    gw_auth *a;
    char host[256];
    int port, db;
    redisAsyncContext *ac;
    int connected, connecting, closing;
    uv_timer_t tick;
    int tick_init, tick_done, orphan; /* orphan: gw_auth is gone, the tick's close frees this */
    int64_t backoff_ms, reconnect_at;
    int64_t connect_started, ping_sent;
    int ping_out;                /* a POLL is unanswered */
    uint64_t sent, replied;      /* commands on this connection (replies come in order) */
    int64_t sent_at[CMD_RING];   /* their send times, by sent % CMD_RING */
    int64_t offset;              /* Redis's clock minus ours (ms), from the last POLL */
    char rev[32];                /* the revocation version the cache reflects ("": none yet) */
    int64_t rev_at;              /* when it was last confirmed */
    int64_t degraded_until;
    int64_t renewed;
    char admit_sha[41], settle_sha[41];
    kcache *cache;
    int n_cache;
    rop *ops;                /* pending admissions, oldest first */
    rop *ops_tail;
    lease *leases;
    settle_rec *queue;       /* settlements made while Redis was away */
    int n_queue;
    uint64_t lease_seq;
    char gw_id[17];
} gw__redis;

struct rop {
    gw__redis *r;
    gw_auth_cb cb;
    void *ud;
    uint8_t hash[32];
    char model[256];
    int64_t reserve, start;
    char tenant[GW_TENANT_MAX], id[GW_KEY_ID_BUF], lease[48];
    int64_t minute, day;
    int stage;               /* 0: index GET, 1: ADMIT */
    int answered;            /* the caller has its answer (maybe from the fallback) */
    int eval_retry;          /* NOSCRIPT seen once */
    int in_redis;            /* a command for it is outstanding */
    int identify;            /* gw_auth_identify: who the key is, nothing charged */
    rop *prev, *next;
};

/* ---- commands: every one has a callback (replies are counted) and a timeout ----------------- */

/* Sends a command on the current connection and notes when. Returns REDIS_OK or REDIS_ERR. */
static int cmd(gw__redis *r, redisCallbackFn *fn, void *priv, int argc, const char **argv) {
    if (!r->ac || r->sent - r->replied >= CMD_RING) return REDIS_ERR;
    if (redisAsyncCommandArgv(r->ac, fn, priv, argc, argv, NULL) != REDIS_OK) return REDIS_ERR;
    r->sent_at[r->sent++ % CMD_RING] = gw__auth_now(r->a);
    return REDIS_OK;
}

/* Every reply callback starts here: a reply on the current connection answers its oldest
 * command (callbacks of a dropped connection run with no reply and count nothing). */
static void replied(gw__redis *r, const redisAsyncContext *ac) {
    if (r && ac && ac == r->ac && r->replied < r->sent) r->replied++;
}

static void on_plain(redisAsyncContext *ac, void *reply, void *priv) { replied(priv, ac); }

static void sha1_hex(const char *s, char out[41]) {
    uint8_t d[20];
    SHA1((const unsigned char *)s, strlen(s), d);
    for (int i = 0; i < 20; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void hexify(const uint8_t *b, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

/* ---- cache ---------------------------------------------------------------------------------- */

static kcache *cache_find(gw__redis *r, const uint8_t h[32]) {
    kcache *f = NULL;
    for (int i = 0; i < r->n_cache; i++)
        if (CRYPTO_memcmp(h, r->cache[i].hash, 32) == 0) f = &r->cache[i];
    return f;
}

static kcache *cache_put(gw__redis *r, const uint8_t h[32], const char *tenant, const char *id, int64_t now) {
    kcache *c = cache_find(r, h);
    if (!c) {
        if (r->n_cache == KEY_CACHE_MAX) { /* evict the least recently seen */
            int o = 0;
            for (int i = 1; i < r->n_cache; i++)
                if (r->cache[i].seen < r->cache[o].seen) o = i;
            c = &r->cache[o];
        } else {
            c = &r->cache[r->n_cache++];
        }
        memset(c, 0, sizeof *c);
        memcpy(c->hash, h, 32);
    }
    snprintf(c->k.tenant, sizeof c->k.tenant, "%s", tenant);
    snprintf(c->k.id, sizeof c->k.id, "%s", id);
    c->seen = now;
    return c;
}

/* ---- ops ------------------------------------------------------------------------------------ */

static void op_unlink(gw__redis *r, rop *o) {
    if (o->prev) o->prev->next = o->next;
    else r->ops = o->next;
    if (o->next) o->next->prev = o->prev;
    else r->ops_tail = o->prev;
    o->prev = o->next = NULL;
}

static void answer(rop *o, gw_auth_result *res) {
    gw_auth *a = o->r->a;
    o->answered = 1;
    if (!o->identify) gw__auth_count(a, res);
    o->cb(o->ud, res);
}

static void refuse_revoked(gw_auth_result *res) {
    gw__auth_refuse(res, 401, "invalid_request_error", "invalid_api_key", 0, 0, "This API key has been revoked.");
}

/* What is known of a key without asking Redis: 0 known and not revoked, 401 revoked, -1 not
 * known (never confirmed by an admission). */
static int cached_verdict(const kcache *c) {
    if (!c || !c->known) return -1;
    return c->revoked || !c->k.enabled ? 401 : 0;
}

/* Answers o without Redis: the local limiter for a key Redis confirmed before and has not
 * revoked as of the last POLL (however long ago: an outage does not make a key unknown), or a
 * refusal. */
static void answer_fallback(rop *o) {
    gw__redis *r = o->r;
    gw_auth *a = r->a;
    gw_auth_result res;
    memset(&res, 0, sizeof res);
    if (a->cfg.fail_closed) {
        gw__auth_refuse(&res, 503, "server_error", "key_store_unavailable", 1, 1,
                        "The key store is unavailable; try again shortly.");
        answer(o, &res);
        return;
    }
    int64_t now = gw__auth_now(a);
    kcache *c = cache_find(r, o->hash);
    int v = cached_verdict(c);
    if (v < 0 && o->identify && c && c->k.tenant[0]) v = 0; /* the index named it: it exists */
    if (v < 0) {
        gw__auth_refuse(&res, 401, "invalid_request_error", "invalid_api_key", 1, 1,
                        "The API key could not be verified (the key store is unavailable); try again shortly.");
        answer(o, &res);
        return;
    }
    if (v == 401) {
        refuse_revoked(&res);
        answer(o, &res);
        return;
    }
    if (o->identify) {
        snprintf(res.tenant, sizeof res.tenant, "%s", c->k.tenant);
        answer(o, &res);
        return;
    }
    gw__limit_admit(&c->k, &c->s, now, o->model, o->reserve, &res);
    if (res.status == 0) {
        res.ticket.fallback = 1;
        a->stats.fallback_admits++;
    }
    answer(o, &res);
}

static void op_free(rop *o) {
    op_unlink(o->r, o);
    free(o);
}

static void send_admit(rop *o);
static void settle_send(gw__redis *r, const settle_rec *s);

static void lease_drop(gw__redis *r, const char *name) {
    for (lease *l = r->leases; l; l = l->next)
        if (strcmp(l->lease, name) == 0) {
            if (l->prev) l->prev->next = l->next;
            else r->leases = l->next;
            if (l->next) l->next->prev = l->prev;
            free(l);
            return;
        }
}

static void reply_admit(redisAsyncContext *ac, void *reply, void *priv) {
    rop *o = priv;
    gw__redis *r = o->r;
    gw_auth *a = r->a;
    redisReply *rp = reply;
    replied(r, ac);
    o->in_redis = 0;
    if (r->closing || !rp || rp->type == REDIS_REPLY_ERROR) {
        if (rp && rp->type == REDIS_REPLY_ERROR && strncmp(rp->str, "NOSCRIPT", 8) == 0 && !o->eval_retry && !r->closing) {
            o->eval_retry = 1;
            send_admit(o);
            if (o->in_redis) return;
        }
        if (rp && rp->type == REDIS_REPLY_ERROR) CM_LOG_WARN("auth", "redis admission failed", "err=%s", rp->str);
        if (!r->closing) a->stats.redis_errors++;
        if (!o->answered) {
            if (r->closing) {
                gw_auth_result res = {0};
                gw__auth_refuse(&res, 503, "server_error", "shutting_down", 1, 1, "The server is shutting down.");
                answer(o, &res);
            } else {
                answer_fallback(o);
            }
        }
        op_free(o);
        return;
    }
    r->degraded_until = 0;
    int64_t now = gw__auth_now(a);
    if (o->stage == 0) { /* the key index */
        if (rp->type == REDIS_REPLY_STRING) {
            char tenant[GW_TENANT_MAX], id[GW_KEY_ID_BUF];
            if (sscanf(rp->str, "%63s %12s", tenant, id) == 2 && gw_tenant_valid(tenant)) {
                kcache *c = cache_put(r, o->hash, tenant, id, now);
                if (o->answered) { /* too late: the fallback answered; the cache is warmer now */
                    op_free(o);
                    return;
                }
                if (o->identify) { /* the key exists; a revocation, when known, says more */
                    gw_auth_result res;
                    memset(&res, 0, sizeof res);
                    if (cached_verdict(c) == 401) refuse_revoked(&res);
                    else snprintf(res.tenant, sizeof res.tenant, "%s", tenant);
                    answer(o, &res);
                    op_free(o);
                    return;
                }
                snprintf(o->tenant, sizeof o->tenant, "%s", tenant);
                snprintf(o->id, sizeof o->id, "%s", id);
                o->stage = 1;
                send_admit(o);
                if (o->in_redis) return;
                if (!o->answered) answer_fallback(o);
                op_free(o);
                return;
            }
        }
        if (!o->answered) {
            gw_auth_result res = {0};
            gw__refuse_key(&res);
            answer(o, &res);
        }
        op_free(o);
        return;
    }
    /* ADMIT's reply: {code, rpm, tpm, conc, daily, mreq, mtok, dtok, inflight, models, weight} */
    if (rp->type != REDIS_REPLY_ARRAY || rp->elements < 1 || rp->element[0]->type != REDIS_REPLY_INTEGER) {
        a->stats.redis_errors++;
        if (!o->answered) answer_fallback(o);
        op_free(o);
        return;
    }
    long long code = rp->element[0]->integer;
    if (code == -2) { /* ran after its deadline (Redis was stuck, it answers again now): granted nothing */
        a->stats.redis_errors++;
        if (!o->answered) answer_fallback(o);
        op_free(o);
        return;
    }
    gw_auth_result res;
    memset(&res, 0, sizeof res);
    kcache *c = cache_find(r, o->hash);
    if (code == -1 || rp->elements < 10) {
        if (c) c->known = 0, c->seen = 0;
        gw__refuse_key(&res);
    } else {
        long long v[9];
        for (int i = 0; i < 9; i++) v[i] = rp->element[i]->type == REDIS_REPLY_INTEGER ? rp->element[i]->integer : 0;
        int64_t weight = rp->elements > 10 && rp->element[10]->type == REDIS_REPLY_INTEGER ? rp->element[10]->integer : 1;
        if (c) {
            c->k.rpm = v[1], c->k.tpm = v[2], c->k.concurrency = v[3], c->k.daily_tokens = v[4], c->k.weight = weight;
            c->k.enabled = code != 2;
            if (code == 2) c->revoked = 1; /* until a POLL says otherwise */
            if (rp->element[9]->type == REDIS_REPLY_STRING)
                snprintf(c->k.models, sizeof c->k.models, "%s", rp->element[9]->str);
            c->known = 1;
            c->seen = now;
            /* the fallback starts from Redis's counts, not from zero (its own in-flight count stays) */
            c->s.minute = o->minute, c->s.req_m = v[5], c->s.tok_m = v[6];
            c->s.day = o->day, c->s.tok_d = v[7];
        }
        /* the limiter's answer, from Redis's counters (a copy: nothing local is charged) */
        gw_key k;
        memset(&k, 0, sizeof k);
        snprintf(k.tenant, sizeof k.tenant, "%s", o->tenant);
        snprintf(k.id, sizeof k.id, "%s", o->id);
        k.rpm = v[1], k.tpm = v[2], k.concurrency = v[3], k.daily_tokens = v[4], k.enabled = code != 2, k.weight = weight;
        snprintf(k.models, sizeof k.models, "%s", rp->element[9]->type == REDIS_REPLY_STRING ? rp->element[9]->str : "*");
        gw__kstate s = {o->minute, v[5], v[6], o->day, 0, v[7], v[8]};
        if (code == 0) { /* counters as they were before this admission */
            s.req_m--, s.tok_m -= o->reserve, s.tok_d -= o->reserve, s.inflight--;
        }
        gw__limit_admit(&k, &s, o->start, o->model, o->reserve, &res);
        if ((code == 0) != (res.status == 0)) /* the script and the limiter disagree: trust the script */
            CM_LOG_WARN("auth", "redis and local limiter disagree", "code=%lld status=%d", code, res.status);
        if (code != 0 && res.status == 0) gw__auth_refuse(&res, 429, "requests", "rate_limit_exceeded", 1, 1, "Rate limit reached.");
        if (code == 0) {
            res.status = 0;
            memset(&res.ticket, 0, sizeof res.ticket);
            snprintf(res.ticket.id, sizeof res.ticket.id, "%s", o->id);
            snprintf(res.ticket.tenant, sizeof res.ticket.tenant, "%s", o->tenant);
            res.ticket.minute = o->minute;
            res.ticket.day = o->day;
            res.ticket.reserved = o->reserve;
            res.ticket.live = 1;
            res.ticket.weight = weight >= 1 && weight <= GW_WEIGHT_MAX ? (uint32_t)weight : 1;
            snprintf(res.ticket.lease, sizeof res.ticket.lease, "%s", o->lease);
        }
    }
    if (o->answered) { /* the fallback answered already: undo what Redis just granted */
        if (code == 0) {
            settle_rec s;
            memset(&s, 0, sizeof s);
            s.t = res.ticket;
            s.delta = -o->reserve;
            s.now = now;
            snprintf(s.lease, sizeof s.lease, "%s", o->lease);
            settle_send(r, &s);
        }
        op_free(o);
        return;
    }
    if (code == 0) {
        lease *l = calloc(1, sizeof *l);
        if (l) {
            snprintf(l->tenant, sizeof l->tenant, "%s", o->tenant);
            snprintf(l->id, sizeof l->id, "%s", o->id);
            snprintf(l->lease, sizeof l->lease, "%s", o->lease);
            l->next = r->leases;
            if (r->leases) r->leases->prev = l;
            r->leases = l;
        }
    }
    answer(o, &res);
    op_free(o);
}

static void key_names(const char *tenant, const char *id, int64_t minute, int64_t day, char rec[160], char m[160],
                      char d[160], char l[160]) {
    snprintf(rec, 160, "arka:{%s}:key:%s", tenant, id);
    snprintf(m, 160, "arka:{%s}:k:%s:m:%lld", tenant, id, (long long)minute);
    snprintf(d, 160, "arka:{%s}:k:%s:d:%lld", tenant, id, (long long)day);
    snprintf(l, 160, "arka:{%s}:k:%s:lease", tenant, id);
}

static void send_admit(rop *o) {
    gw__redis *r = o->r;
    if (!r->connected) return;
    char rec[160], m[160], d[160], l[160], now[24], res[24], ttl[24], dl[24];
    key_names(o->tenant, o->id, o->minute, o->day, rec, m, d, l);
    snprintf(now, sizeof now, "%lld", (long long)o->start);
    snprintf(res, sizeof res, "%lld", (long long)o->reserve);
    snprintf(ttl, sizeof ttl, "%d", LEASE_MS);
    /* no later than the fallback answers here, in Redis's clock */
    snprintf(dl, sizeof dl, "%lld", (long long)(o->start + r->offset + OP_TIMEOUT_MS));
    const char *argv[] = {o->eval_retry ? "EVAL" : "EVALSHA", o->eval_retry ? ADMIT_LUA : r->admit_sha, "4", rec, m, d, l,
                          now, res, o->model, o->lease, ttl, dl};
    if (cmd(r, reply_admit, o, 13, argv) == REDIS_OK) o->in_redis = 1;
}

/* ---- settlement ----------------------------------------------------------------------------- */

static void reply_settle(redisAsyncContext *ac, void *reply, void *priv) {
    settle_rec *s = priv;
    gw__redis *r = s->r;
    redisReply *rp = reply;
    replied(r, ac);
    if (rp && rp->type == REDIS_REPLY_ERROR && strncmp(rp->str, "NOSCRIPT", 8) == 0 && r && !r->closing && r->connected) {
        char m[160], d[160], l[160], cur[160], mk[200], delta[24];
        snprintf(m, sizeof m, "arka:{%s}:k:%s:m:%lld", s->t.tenant, s->t.id, (long long)s->t.minute);
        snprintf(d, sizeof d, "arka:{%s}:k:%s:d:%lld", s->t.tenant, s->t.id, (long long)s->t.day);
        snprintf(l, sizeof l, "arka:{%s}:k:%s:lease", s->t.tenant, s->t.id);
        snprintf(cur, sizeof cur, "arka:{%s}:k:%s:m:%lld", s->t.tenant, s->t.id, (long long)(s->now / 60000));
        snprintf(mk, sizeof mk, "arka:{%s}:settled:%s", s->t.tenant, s->lease);
        snprintf(delta, sizeof delta, "%lld", (long long)s->delta);
        const char *argv[] = {"EVAL", SETTLE_LUA, "5", m, d, l, cur, mk, s->lease, delta};
        if (cmd(r, reply_settle, s, 10, argv) == REDIS_OK) return;
    }
    if ((!rp || rp->type == REDIS_REPLY_ERROR) && r && !r->closing) {
        r->a->stats.redis_errors++;
        if (r->n_queue < SETTLE_QUEUE) r->queue[r->n_queue++] = *s; /* idempotent: replayed on reconnect */
        else CM_LOG_WARN("auth", "settlement queue full; dropping one (its lease expires on its own)", "tenant=%s", s->t.tenant);
    }
    free(s);
}

static void settle_send(gw__redis *r, const settle_rec *src) {
    if (!r->connected) {
        if (r->n_queue < SETTLE_QUEUE) r->queue[r->n_queue++] = *src;
        return;
    }
    settle_rec *s = malloc(sizeof *s);
    if (!s) return;
    *s = *src;
    s->r = r;
    char m[160], d[160], l[160], cur[160], mk[200], delta[24];
    snprintf(m, sizeof m, "arka:{%s}:k:%s:m:%lld", s->t.tenant, s->t.id, (long long)s->t.minute);
    snprintf(d, sizeof d, "arka:{%s}:k:%s:d:%lld", s->t.tenant, s->t.id, (long long)s->t.day);
    snprintf(l, sizeof l, "arka:{%s}:k:%s:lease", s->t.tenant, s->t.id);
    snprintf(cur, sizeof cur, "arka:{%s}:k:%s:m:%lld", s->t.tenant, s->t.id, (long long)(s->now / 60000));
    snprintf(mk, sizeof mk, "arka:{%s}:settled:%s", s->t.tenant, s->lease);
    snprintf(delta, sizeof delta, "%lld", (long long)s->delta);
    const char *argv[] = {"EVALSHA", r->settle_sha, "5", m, d, l, cur, mk, s->lease, delta};
    if (cmd(r, reply_settle, s, 10, argv) != REDIS_OK) {
        if (r->n_queue < SETTLE_QUEUE) r->queue[r->n_queue++] = *s;
        free(s);
    }
}

/* ---- connection ------------------------------------------------------------------------------ */

static void connect_now(gw__redis *r);

static void backoff(gw__redis *r) {
    r->reconnect_at = gw__auth_now(r->a) + r->backoff_ms;
    r->backoff_ms = r->backoff_ms * 2 > 5000 ? 5000 : r->backoff_ms * 2;
}

/* Gives up on the current connection (connect or PING timed out: libuv stops polling a socket
 * after POLLERR and hiredis's adapter never hears of it). Pending commands get no reply: their
 * admissions are answered by the fallback, their settlements queued for the next connection. */
static void drop_context(gw__redis *r, const char *why) {
    redisAsyncContext *ac = r->ac;
    CM_LOG_WARN("auth", "redis connection dropped; limiting locally until it is back", "why=%s", why);
    r->a->stats.redis_errors++;
    r->ac = NULL;
    r->connected = r->connecting = r->ping_out = 0;
    backoff(r);
    if (ac) {
        ac->data = NULL; /* its connect/disconnect callbacks must not touch r */
        redisAsyncFree(ac);
    }
}

/* POLL's reply: {TIME seconds, microseconds, version[, revoked set]}. */
static void on_poll(redisAsyncContext *ac, void *reply, void *priv) {
    gw__redis *r = priv;
    redisReply *rp = reply;
    replied(r, ac);
    if (!rp || r->ac != ac) return;
    r->ping_out = 0;
    r->backoff_ms = 100;
    if (rp->type != REDIS_REPLY_ARRAY || rp->elements < 3) return;
    for (size_t i = 0; i < 3; i++)
        if (rp->element[i]->type != REDIS_REPLY_STRING) return;
    int64_t now = gw__auth_now(r->a);
    int64_t rt = atoll(rp->element[0]->str) * 1000 + atoll(rp->element[1]->str) / 1000;
    r->offset = rt - (r->ping_sent + now) / 2;
    const char *v = rp->element[2]->str;
    if (strcmp(v, r->rev) != 0) {
        if (rp->elements < 4 || rp->element[3]->type != REDIS_REPLY_ARRAY) return; /* raced: the next POLL */
        redisReply *set = rp->element[3];
        int n_revoked = 0;
        for (int i = 0; i < r->n_cache; i++) {
            kcache *c = &r->cache[i];
            char member[GW_TENANT_MAX + GW_KEY_ID_BUF + 2];
            snprintf(member, sizeof member, "%s:%s", c->k.tenant, c->k.id);
            int in = 0;
            for (size_t j = 0; j < set->elements && !in; j++)
                in = set->element[j]->type == REDIS_REPLY_STRING && strcmp(set->element[j]->str, member) == 0;
            if (in && !c->revoked) n_revoked++;
            if (!in && c->revoked && c->k.enabled) c->revoked = 0;
            if (in) c->revoked = 1;
        }
        if (r->rev[0]) CM_LOG_INFO("auth", "key revocations updated", "version=%s revoked=%zu newly=%d", v, set->elements, n_revoked);
        snprintf(r->rev, sizeof r->rev, "%s", v);
    }
    r->rev_at = now;
}

static void send_poll(gw__redis *r, int64_t now) {
    const char *argv[] = {"EVAL", POLL_LUA, "2", REV_KEY, REVOKED_KEY, r->rev[0] ? r->rev : "-"};
    r->ping_sent = now;
    if (cmd(r, on_poll, r, 6, argv) == REDIS_OK) r->ping_out = 1;
}

static void on_connect(const redisAsyncContext *ac, int status) {
    gw__redis *r = ac->data;
    if (!r) return;
    r->connecting = 0;
    if (status != REDIS_OK) { /* hiredis frees the context */
        r->ac = NULL;
        backoff(r);
        return;
    }
    r->connected = 1;
    r->ping_out = 0;
    /* the back-off resets at the first POLL answer: a stuck Redis accepts connections (the
     * kernel does) without answering, and reconnecting to it must not spin */
    CM_LOG_INFO("auth", "redis connected", "host=%s port=%d db=%d", r->host, r->port, r->db);
    send_poll(r, gw__auth_now(r->a)); /* the clock offset and revocations first */
    int n = r->n_queue; /* replay settlements made while away */
    r->n_queue = 0;
    settle_rec *q = malloc((size_t)(n ? n : 1) * sizeof *q);
    if (q) {
        memcpy(q, r->queue, (size_t)n * sizeof *q);
        for (int i = 0; i < n; i++) settle_send(r, &q[i]);
        free(q);
    }
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
    gw__redis *r = ac->data;
    if (!r) return;
    r->connected = 0;
    r->connecting = 0;
    r->ac = NULL;
    if (r->closing) return;
    CM_LOG_WARN("auth", "redis connection lost; limiting locally until it is back", "host=%s port=%d", r->host, r->port);
    r->a->stats.redis_errors++;
    backoff(r);
}

static void connect_now(gw__redis *r) {
    redisAsyncContext *ac = redisAsyncConnect(r->host, r->port);
    if (!ac || ac->err) {
        if (ac) redisAsyncFree(ac);
        backoff(r);
        return;
    }
    ac->data = r;
    if (redisLibuvAttach(ac, r->a->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        r->reconnect_at = gw__auth_now(r->a) + 1000;
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    r->ac = ac;
    r->connecting = 1;
    r->connect_started = gw__auth_now(r->a);
    r->sent = r->replied = 0;
    if (r->db) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        const char *argv[] = {"SELECT", db};
        cmd(r, on_plain, r, 2, argv);
    }
}

static void renew_leases(gw__redis *r, int64_t now) {
    char l[160], exp[24];
    snprintf(exp, sizeof exp, "%lld", (long long)(now + r->offset + LEASE_MS)); /* leases live on Redis's clock */
    for (lease *x = r->leases; x; x = x->next) {
        snprintf(l, sizeof l, "arka:{%s}:k:%s:lease", x->tenant, x->id);
        const char *argv[] = {"ZADD", l, "XX", exp, x->lease};
        cmd(r, on_plain, r, 5, argv);
    }
}

static void on_tick(uv_timer_t *t) {
    gw__redis *r = t->data;
    int64_t now = gw__auth_now(r->a);
    if (r->closing) return;
    if (r->ac && r->connecting && now - r->connect_started > 1000) drop_context(r, "connect timed out");
    if (r->ac && r->replied < r->sent && now - r->sent_at[r->replied % CMD_RING] > CMD_TIMEOUT_MS)
        drop_context(r, "a command went unanswered for 1 s");
    if (r->connected && !r->ping_out && now - r->ping_sent >= POLL_MS) send_poll(r, now);
    if (!r->ac && now >= r->reconnect_at) connect_now(r);
    /* admissions Redis did not answer in time: the fallback answers, the op waits for its reply */
    for (rop *o = r->ops; o; o = o->next)
        if (!o->answered && now - o->start >= OP_TIMEOUT_MS) {
            r->a->stats.redis_errors++;
            r->degraded_until = now + 1000;
            answer_fallback(o);
        }
    if (r->connected && now - r->renewed >= LEASE_MS / 3) {
        r->renewed = now;
        renew_leases(r, now);
    }
}

/* redis://HOST:PORT[/DB] */
static int parse_url(const char *url, char *host, size_t cap, int *port, int *db) {
    if (strncmp(url, "redis://", 8) != 0) return CM_EINVAL;
    const char *h = url + 8, *colon = strrchr(h, ':'), *slash = strchr(h, '/');
    *port = 6379;
    *db = 0;
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    if (colon && (!slash || colon < slash)) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || p < 1 || p > 65535 || (*end && *end != '/')) return CM_EINVAL;
        *port = (int)p;
        hl = (size_t)(colon - h);
    }
    if (hl == 0 || hl >= cap) return CM_EINVAL;
    memcpy(host, h, hl);
    host[hl] = 0;
    if (slash && slash[1]) {
        char *end;
        long d = strtol(slash + 1, &end, 10);
        if (*end || d < 0 || d > 15) return CM_EINVAL;
        *db = (int)d;
    }
    return 0;
}

int gw__redis_open(gw_auth *a, const char *url) {
    gw__redis *r = calloc(1, sizeof *r);
    if (!r) return CM_ENOMEM;
    r->queue = calloc(SETTLE_QUEUE, sizeof *r->queue);
    r->cache = calloc(KEY_CACHE_MAX, sizeof *r->cache);
    if (!r->queue || !r->cache) {
        free(r->queue);
        free(r->cache);
        free(r);
        return CM_ENOMEM;
    }
    if (!a->loop || parse_url(url, r->host, sizeof r->host, &r->port, &r->db)) {
        CM_LOG_ERROR("auth", "bad redis url (expected redis://HOST:PORT[/DB])", "url=%s", url);
        free(r->queue);
        free(r->cache);
        free(r);
        return CM_EINVAL;
    }
    r->a = a;
    a->redis = r;
    sha1_hex(ADMIT_LUA, r->admit_sha);
    sha1_hex(SETTLE_LUA, r->settle_sha);
    uint8_t rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) memset(rnd, 0x5a, sizeof rnd);
    hexify(rnd, sizeof rnd, r->gw_id);
    r->backoff_ms = 100;
    uv_timer_init(a->loop, &r->tick);
    r->tick.data = r;
    r->tick_init = 1;
    uv_timer_start(&r->tick, on_tick, TICK_MS, TICK_MS);
    uv_unref((uv_handle_t *)&r->tick);
    connect_now(r);
    return 0;
}

static void redis_free(gw__redis *r) {
    free(r->queue);
    free(r->cache);
    free(r);
}

static void tick_closed(uv_handle_t *h) {
    gw__redis *r = h->data;
    r->tick_done = 1;
    if (r->orphan) redis_free(r);
}

void gw__redis_shutdown(gw_auth *a) {
    gw__redis *r = a->redis;
    if (!r || r->closing) return;
    r->closing = 1;
    if (r->ac) {
        redisAsyncContext *ac = r->ac;
        r->ac = NULL;
        r->connected = 0;
        redisAsyncFree(ac); /* pending callbacks run with no reply: answered 503 */
    }
    while (r->ops) { /* anything not answered through a callback */
        rop *o = r->ops;
        if (!o->answered) {
            gw_auth_result res = {0};
            gw__auth_refuse(&res, 503, "server_error", "shutting_down", 1, 1, "The server is shutting down.");
            answer(o, &res);
        }
        op_free(o);
    }
    while (r->leases) lease_drop(r, r->leases->lease);
    if (r->tick_init) {
        uv_timer_stop(&r->tick);
        r->tick_init = 0;
        uv_close((uv_handle_t *)&r->tick, tick_closed);
    }
}

void gw__redis_close(gw_auth *a) {
    gw__redis *r = a->redis;
    if (!r) return;
    gw__redis_shutdown(a);
    a->redis = NULL;
    if (r->tick_done) redis_free(r);
    else r->orphan = 1; /* the timer's close callback frees r when the loop runs again */
}

static rop *op_new(gw_auth *a, const char *bearer, int identify, gw_auth_cb cb, void *ud) {
    gw__redis *r = a->redis;
    gw_auth_result res;
    memset(&res, 0, sizeof res);
    if (!bearer || !gw_key_well_formed(bearer, strlen(bearer))) {
        gw__refuse_key(&res);
        if (!identify) a->stats.refused++;
        cb(ud, &res);
        return NULL;
    }
    rop *o = calloc(1, sizeof *o);
    if (!o) {
        gw__auth_refuse(&res, 503, "server_error", "out_of_memory", 1, 1, "Out of memory.");
        if (!identify) a->stats.refused++;
        cb(ud, &res);
        return NULL;
    }
    o->r = r;
    o->cb = cb;
    o->ud = ud;
    o->identify = identify;
    o->start = gw__auth_now(a);
    o->minute = o->start / 60000;
    o->day = o->start / 86400000;
    gw_key_hash(a->secret, a->secret_len, bearer, strlen(bearer), o->hash, NULL);
    o->prev = r->ops_tail;
    if (r->ops_tail) r->ops_tail->next = o;
    else r->ops = o;
    r->ops_tail = o;
    return o;
}

/* Asks Redis which key o->hash is (the index); the reply goes on in reply_admit. */
static void send_index_get(rop *o) {
    char idx[96];
    memcpy(idx, "arka:keyidx:", 12);
    hexify(o->hash, 32, idx + 12);
    const char *argv[] = {"GET", idx};
    if (cmd(o->r, reply_admit, o, 2, argv) == REDIS_OK) o->in_redis = 1;
}

void gw__redis_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_cb cb, void *ud) {
    gw__redis *r = a->redis;
    rop *o = op_new(a, bearer, 0, cb, ud);
    if (!o) return;
    o->reserve = reserve;
    snprintf(o->model, sizeof o->model, "%s", model ? model : "");
    snprintf(o->lease, sizeof o->lease, "%s:%llu", r->gw_id, (unsigned long long)++r->lease_seq);
    if (!r->connected || r->closing || o->start < r->degraded_until) {
        answer_fallback(o);
        op_free(o);
        return;
    }
    kcache *c = cache_find(r, o->hash);
    if (c && o->start - c->seen < KEY_CACHE_MS && c->k.tenant[0]) {
        snprintf(o->tenant, sizeof o->tenant, "%s", c->k.tenant);
        snprintf(o->id, sizeof o->id, "%s", c->k.id);
        o->stage = 1;
        send_admit(o);
    } else {
        send_index_get(o);
    }
    if (!o->in_redis) {
        a->stats.redis_errors++;
        answer_fallback(o);
        op_free(o);
    }
}

void gw__redis_identify(gw_auth *a, const char *bearer, gw_auth_cb cb, void *ud) {
    gw__redis *r = a->redis;
    rop *o = op_new(a, bearer, 1, cb, ud);
    if (!o) return;
    kcache *c = cache_find(r, o->hash);
    /* a key Redis confirmed (or named in its index) needs no round trip; a revoked one neither */
    if (cached_verdict(c) >= 0 || (c && c->k.tenant[0]) || !r->connected || r->closing || o->start < r->degraded_until) {
        answer_fallback(o);
        op_free(o);
        return;
    }
    send_index_get(o);
    if (!o->in_redis) {
        a->stats.redis_errors++;
        answer_fallback(o);
        op_free(o);
    }
}

void gw__redis_settle(gw_auth *a, const gw_auth_ticket *t, int64_t used) {
    gw__redis *r = a->redis;
    int64_t now = gw__auth_now(a);
    if (t->fallback) {
        for (int i = 0; i < r->n_cache; i++)
            if (strcmp(r->cache[i].k.id, t->id) == 0 && strcmp(r->cache[i].k.tenant, t->tenant) == 0) {
                gw__limit_settle(&r->cache[i].s, t, now, used);
                break;
            }
        return;
    }
    lease_drop(r, t->lease);
    if (r->closing) return;
    settle_rec s;
    memset(&s, 0, sizeof s);
    s.t = *t;
    snprintf(s.lease, sizeof s.lease, "%s", t->lease);
    s.delta = used - t->reserved;
    s.now = now;
    settle_send(r, &s);
}

/* ---- synchronous helpers for `arka keys --redis` and tests ----------------------------------- */

static redisContext *sync_connect(const char *url, char *err, size_t errlen) {
    char host[256];
    int port, db;
    if (parse_url(url, host, sizeof host, &port, &db)) {
        snprintf(err, errlen, "bad redis url '%s' (expected redis://HOST:PORT[/DB])", url);
        return NULL;
    }
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (!c || c->err) {
        snprintf(err, errlen, "cannot connect to %s: %s", url, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (db) {
        redisReply *rp = redisCommand(c, "SELECT %d", db);
        int bad = !rp || rp->type == REDIS_REPLY_ERROR;
        if (rp) freeReplyObject(rp);
        if (bad) {
            snprintf(err, errlen, "%s: SELECT %d failed", url, db);
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

/* A key's enabled state changed (or was written): the revoked set follows it and the version
 * moves, so every gateway's POLL picks it up. */
static int revocation_note(redisContext *c, const char *tenant, const char *id, int enabled) {
    redisReply *rp = redisCommand(c, "%s %s %s:%s", enabled ? "SREM" : "SADD", REVOKED_KEY, tenant, id);
    int rc = !rp || rp->type == REDIS_REPLY_ERROR ? CM_EIO : 0;
    if (rp) freeReplyObject(rp);
    if (rc) return rc;
    rp = redisCommand(c, "INCR %s", REV_KEY);
    rc = !rp || rp->type == REDIS_REPLY_ERROR ? CM_EIO : 0;
    if (rp) freeReplyObject(rp);
    return rc;
}

int gw_redis_key_put(const char *url, const gw_key *k, char *err, size_t errlen) {
    redisContext *c = sync_connect(url, err, errlen);
    if (!c) return CM_EIO;
    char hex[65], idx[96], rec[160], val[96];
    hexify(k->hash, 32, hex);
    snprintf(idx, sizeof idx, "arka:keyidx:%s", hex);
    snprintf(rec, sizeof rec, "arka:{%s}:key:%s", k->tenant, k->id);
    snprintf(val, sizeof val, "%s %s", k->tenant, k->id);
    redisReply *rp = redisCommand(c, "HSET %s tenant %s models %s rpm %lld tpm %lld concurrency %lld daily_tokens %lld weight %lld enabled %d created %lld hash %s",
                                  rec, k->tenant, k->models[0] ? k->models : "*", (long long)k->rpm, (long long)k->tpm,
                                  (long long)k->concurrency, (long long)k->daily_tokens, (long long)(k->weight ? k->weight : 1),
                                  k->enabled ? 1 : 0, (long long)k->created, hex);
    int rc = !rp || rp->type == REDIS_REPLY_ERROR ? CM_EIO : 0;
    if (rp) freeReplyObject(rp);
    if (!rc) {
        rp = redisCommand(c, "SET %s %s", idx, val);
        rc = !rp || rp->type == REDIS_REPLY_ERROR ? CM_EIO : 0;
        if (rp) freeReplyObject(rp);
    }
    if (!rc) rc = revocation_note(c, k->tenant, k->id, k->enabled);
    if (rc) snprintf(err, errlen, "%s: cannot write the key", url);
    redisFree(c);
    return rc;
}

static int64_t field_i64(redisReply *h, const char *name) {
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        if (h->element[i]->type == REDIS_REPLY_STRING && strcmp(h->element[i]->str, name) == 0)
            return h->element[i + 1]->type == REDIS_REPLY_STRING ? strtoll(h->element[i + 1]->str, NULL, 10) : 0;
    return 0;
}

static const char *field_str(redisReply *h, const char *name) {
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        if (h->element[i]->type == REDIS_REPLY_STRING && strcmp(h->element[i]->str, name) == 0 &&
            h->element[i + 1]->type == REDIS_REPLY_STRING)
            return h->element[i + 1]->str;
    return "";
}

int gw_redis_keys_list(const char *url, gw_key **keys, int *n, gw_key_usage **usage, char *err, size_t errlen) {
    *keys = NULL;
    *n = 0;
    if (usage) *usage = NULL;
    redisContext *c = sync_connect(url, err, errlen);
    if (!c) return CM_EIO;
    int cap = 0, rc = 0;
    char cursor[32] = "0";
    int64_t day = (int64_t)time(NULL) / 86400;
    do {
        redisReply *rp = redisCommand(c, "SCAN %s MATCH arka:keyidx:* COUNT 500", cursor);
        if (!rp || rp->type != REDIS_REPLY_ARRAY || rp->elements != 2) {
            if (rp) freeReplyObject(rp);
            rc = CM_EIO;
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", rp->element[0]->str);
        redisReply *ks = rp->element[1];
        for (size_t i = 0; i < ks->elements && !rc; i++) {
            redisReply *v = redisCommand(c, "GET %s", ks->element[i]->str);
            char tenant[GW_TENANT_MAX], id[GW_KEY_ID_BUF];
            int ok = v && v->type == REDIS_REPLY_STRING && sscanf(v->str, "%63s %12s", tenant, id) == 2;
            if (v) freeReplyObject(v);
            if (!ok) continue;
            redisReply *h = redisCommand(c, "HGETALL arka:{%s}:key:%s", tenant, id);
            if (!h || h->type != REDIS_REPLY_ARRAY || h->elements == 0) {
                if (h) freeReplyObject(h);
                continue;
            }
            if (*n == cap) {
                int nc = cap ? cap * 2 : 16;
                gw_key *nk = realloc(*keys, (size_t)nc * sizeof *nk);
                gw_key_usage *nu = usage ? realloc(*usage, (size_t)nc * sizeof *nu) : NULL;
                if (!nk || (usage && !nu)) {
                    if (nk) *keys = nk;
                    if (nu) *usage = nu;
                    freeReplyObject(h);
                    rc = CM_ENOMEM;
                    break;
                }
                *keys = nk;
                if (usage) *usage = nu;
                cap = nc;
            }
            gw_key *k = &(*keys)[*n];
            memset(k, 0, sizeof *k);
            snprintf(k->tenant, sizeof k->tenant, "%s", tenant);
            snprintf(k->id, sizeof k->id, "%s", id);
            snprintf(k->models, sizeof k->models, "%s", field_str(h, "models"));
            k->rpm = field_i64(h, "rpm"), k->tpm = field_i64(h, "tpm"), k->concurrency = field_i64(h, "concurrency");
            k->daily_tokens = field_i64(h, "daily_tokens"), k->enabled = field_i64(h, "enabled") == 1;
            k->weight = field_i64(h, "weight") > 0 ? field_i64(h, "weight") : 1;
            k->created = field_i64(h, "created");
            freeReplyObject(h);
            if (usage) {
                gw_key_usage *u = &(*usage)[*n];
                memset(u, 0, sizeof *u);
                snprintf(u->id, sizeof u->id, "%s", id);
                u->day = day;
                redisReply *d = redisCommand(c, "HMGET arka:{%s}:k:%s:d:%lld tok req", tenant, id, (long long)day);
                if (d && d->type == REDIS_REPLY_ARRAY && d->elements == 2) {
                    if (d->element[0]->type == REDIS_REPLY_STRING) u->tokens = strtoll(d->element[0]->str, NULL, 10);
                    if (d->element[1]->type == REDIS_REPLY_STRING) u->requests = strtoll(d->element[1]->str, NULL, 10);
                }
                if (d) freeReplyObject(d);
            }
            (*n)++;
        }
        freeReplyObject(rp);
    } while (!rc && strcmp(cursor, "0") != 0);
    if (rc == CM_EIO) snprintf(err, errlen, "%s: cannot list keys", url);
    redisFree(c);
    return rc;
}

int gw_redis_key_set_enabled(const char *url, const char *id, int enabled, char *err, size_t errlen) {
    gw_key *ks;
    int n;
    int rc = gw_redis_keys_list(url, &ks, &n, NULL, err, errlen);
    if (rc) return rc;
    int found = -1;
    for (int i = 0; i < n; i++)
        if (strncmp(ks[i].id, id, GW_KEY_ID_BUF - 1) == 0) found = i;
    if (found < 0) {
        free(ks);
        snprintf(err, errlen, "no key %s in %s", id, url);
        return CM_ENOTFOUND;
    }
    redisContext *c = sync_connect(url, err, errlen);
    if (!c) {
        free(ks);
        return CM_EIO;
    }
    redisReply *rp = redisCommand(c, "HSET arka:{%s}:key:%s enabled %d", ks[found].tenant, ks[found].id, enabled ? 1 : 0);
    rc = !rp || rp->type == REDIS_REPLY_ERROR ? CM_EIO : 0;
    if (rp) freeReplyObject(rp);
    if (!rc) rc = revocation_note(c, ks[found].tenant, ks[found].id, enabled);
    redisFree(c);
    free(ks);
    if (rc) snprintf(err, errlen, "%s: cannot update the key", url);
    return rc;
}

#endif
