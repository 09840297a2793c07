/* test_gw_auth: API keys, the keys file, the secret, the in-process quota store with a fake clock,
 * and admission in front of the generate routes over loopback HTTP (a fake backend in this file). */
#include "gateway/auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/routes.h"
#include "tests/unit/gw_fake.h"
#include "tests/unit/t.h"

static const uint8_t SECRET[] = "0123456789abcdef-test-secret";
#define SECRET_LEN (sizeof SECRET - 1)

/* 2026-11-23 12:00:30 UTC: mid-minute, mid-day */
static _Atomic int64_t fake_now = 1795435230000LL;
static int64_t fake_clock(void *ud) { return atomic_load(&fake_now); }

static char dir[256];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* Creates a key with the given limits in the keys file; returns its text in key and id in id. */
static void mk_key(const char *file, const char *tenant, const char *models, int64_t rpm, int64_t tpm, int64_t conc,
                   int64_t daily, char key[GW_KEY_BUF], char id[GW_KEY_ID_BUF]) {
    gw_key k = {0};
    T_CHECK(gw_key_generate(key) == 0);
    gw_key_hash(SECRET, SECRET_LEN, key, strlen(key), k.hash, k.id);
    snprintf(k.tenant, sizeof k.tenant, "%s", tenant);
    snprintf(k.models, sizeof k.models, "%s", models);
    k.rpm = rpm, k.tpm = tpm, k.concurrency = conc, k.daily_tokens = daily, k.enabled = 1, k.created = 1;
    T_CHECK(gw_keyfile_append(file, &k) == 0);
    memcpy(id, k.id, GW_KEY_ID_BUF);
}

/* ---- keys, HMAC, keys file, secret ------------------------------------------------------ */

static void test_keys(void) {
    char a[GW_KEY_BUF], b[GW_KEY_BUF];
    T_CHECK(gw_key_generate(a) == 0 && gw_key_generate(b) == 0);
    T_EQ_INT(strlen(a), 51);
    T_CHECK(strncmp(a, "ak-", 3) == 0);
    T_CHECK(strcmp(a, b) != 0);
    T_CHECK(gw_key_well_formed(a, strlen(a)));
    T_CHECK(!gw_key_well_formed(a, strlen(a) - 1));
    T_CHECK(!gw_key_well_formed("sk-0123", 7));
    char up[GW_KEY_BUF];
    memcpy(up, a, sizeof up);
    up[10] = 'G';
    T_CHECK(!gw_key_well_formed(up, strlen(up)));

    /* RFC 4231 test case 2 */
    uint8_t h[32];
    char id[GW_KEY_ID_BUF];
    const char *data = "what do ya want for nothing?";
    gw_key_hash((const uint8_t *)"Jefe", 4, data, strlen(data), h, id);
    static const uint8_t want[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
                                     0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
    T_CHECK(memcmp(h, want, 32) == 0);
    T_EQ_STR(id, "5bdcc146bf60");

    gw_key k = {0};
    strcpy(k.models, "m1,m2");
    T_CHECK(gw_key_allows(&k, "m1") && gw_key_allows(&k, "m2") && !gw_key_allows(&k, "m") && !gw_key_allows(&k, "m12"));
    strcpy(k.models, "*");
    T_CHECK(gw_key_allows(&k, "anything"));
    T_CHECK(gw_tenant_valid("acme-1.x_y") && !gw_tenant_valid("") && !gw_tenant_valid("a b") && !gw_tenant_valid("a=b"));
    /* the executors' tenant ids: 0 only for no tenant, stable, distinct */
    T_CHECK(gw_tenant_id(NULL) == 0 && gw_tenant_id("") == 0 && gw_tenant_id("a") != 0);
    T_CHECK(gw_tenant_id("acme") == gw_tenant_id("acme") && gw_tenant_id("acme") != gw_tenant_id("acmf"));
}

static void test_keyfile(void) {
    char f[512], key1[GW_KEY_BUF], key2[GW_KEY_BUF], id1[GW_KEY_ID_BUF], id2[GW_KEY_ID_BUF], err[512];
    path_in(f, sizeof f, "kf.conf");
    mk_key(f, "acme", "*", 60, 1000, 4, 0, key1, id1);
    mk_key(f, "beta", "m1,m2", 1, 2, 3, 4, key2, id2);
    struct stat st;
    T_CHECK(stat(f, &st) == 0 && (st.st_mode & 0777) == 0600);
    gw_key *ks;
    int n;
    T_CHECK(gw_keyfile_load(f, &ks, &n, err, sizeof err) == 0);
    T_EQ_INT(n, 2);
    if (n == 2) {
        T_EQ_STR(ks[0].tenant, "acme");
        T_EQ_STR(ks[0].id, id1);
        T_EQ_INT(ks[0].rpm, 60);
        T_EQ_INT(ks[0].tpm, 1000);
        T_EQ_INT(ks[1].concurrency, 3);
        T_EQ_INT(ks[1].daily_tokens, 4);
        T_EQ_STR(ks[1].models, "m1,m2");
        T_CHECK(ks[0].enabled && ks[1].enabled);
        uint8_t h[32];
        gw_key_hash(SECRET, SECRET_LEN, key2, strlen(key2), h, NULL);
        T_CHECK(memcmp(h, ks[1].hash, 32) == 0);
    }
    free(ks);
    /* the key text itself is nowhere in the file */
    FILE *fp = fopen(f, "r");
    char buf[8192];
    size_t got = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[got] = 0;
    T_CHECK(!strstr(buf, key1 + 3) && !strstr(buf, key2 + 3));

    T_CHECK(gw_keyfile_set_enabled(f, id2, 0) == 0);
    T_CHECK(gw_keyfile_set_enabled(f, "000000000000", 0) == CM_ENOTFOUND);
    T_CHECK(gw_keyfile_load(f, &ks, &n, err, sizeof err) == 0);
    T_CHECK(n == 2 && ks[0].enabled && !ks[1].enabled && ks[1].rpm == 1);
    free(ks);

    char bad[512];
    path_in(bad, sizeof bad, "bad.conf");
    fp = fopen(bad, "w");
    fprintf(fp, "# comment\n\nhash=%064d tenant=x rpm=-1\n", 0);
    fclose(fp);
    T_CHECK(gw_keyfile_load(bad, &ks, &n, err, sizeof err) == CM_EFORMAT);
    T_CHECK(strstr(err, "bad.conf:3:") != NULL);
    fp = fopen(bad, "w");
    fprintf(fp, "hash=%064d\n", 0);
    fclose(fp);
    T_CHECK(gw_keyfile_load(bad, &ks, &n, err, sizeof err) == CM_EFORMAT);
    char none[512];
    path_in(none, sizeof none, "missing.conf");
    T_CHECK(gw_keyfile_load(none, &ks, &n, err, sizeof err) == 0 && n == 0);
}

static void test_secret(void) {
    char f[512], sf[600], err[512];
    uint8_t s1[256], s2[256];
    size_t l1, l2;
    path_in(f, sizeof f, "sec.conf");
    snprintf(sf, sizeof sf, "%s.secret", f);
    T_CHECK(gw_auth_secret_load(NULL, f, 0, s1, sizeof s1, &l1, err, sizeof err) == CM_ENOENT);
    T_CHECK(gw_auth_secret_load(NULL, f, 1, s1, sizeof s1, &l1, err, sizeof err) == 0);
    T_EQ_INT(l1, 64);
    struct stat st;
    T_CHECK(stat(sf, &st) == 0 && (st.st_mode & 0777) == 0600);
    T_CHECK(gw_auth_secret_load(NULL, f, 1, s2, sizeof s2, &l2, err, sizeof err) == 0);
    T_CHECK(l1 == l2 && memcmp(s1, s2, l1) == 0); /* created once, then read back */
    chmod(sf, 0644);
    T_CHECK(gw_auth_secret_load(NULL, f, 0, s2, sizeof s2, &l2, err, sizeof err) == CM_EINVAL);
    T_CHECK(strstr(err, "chmod 600") != NULL);
    T_CHECK(gw_auth_secret_load("short", f, 0, s2, sizeof s2, &l2, err, sizeof err) == CM_EINVAL);
    T_CHECK(gw_auth_secret_load("a-long-enough-secret", NULL, 0, s2, sizeof s2, &l2, err, sizeof err) == 0 && l2 == 20);
    T_CHECK(gw_auth_secret_load(NULL, NULL, 0, s2, sizeof s2, &l2, err, sizeof err) == CM_EINVAL);
}

/* ---- the in-process store with a fake clock ---------------------------------------------- */

typedef struct got {
    int n;
    gw_auth_result r;
} got;

static void on_res(void *ud, const gw_auth_result *r) {
    got *g = ud;
    g->n++;
    g->r = *r;
}

static gw_auth_result admit(gw_auth *a, const char *key, const char *model, int64_t reserve) {
    got g = {0};
    gw_auth_admit(a, key, model, reserve, on_res, &g);
    T_EQ_INT(g.n, 1); /* synchronous, exactly once */
    return g.r;
}

static gw_auth *mk_auth(const char *file) {
    gw_auth_cfg c;
    gw_auth_cfg_default(&c);
    c.keys_file = file;
    c.secret = SECRET;
    c.secret_len = SECRET_LEN;
    c.clock = fake_clock;
    gw_auth *a = NULL;
    T_CHECK(gw_auth_create(NULL, &c, &a) == 0);
    return a;
}

typedef struct tcount {
    int n, keyish;
    long long tpm_admitted, tpm_tokens, rpm_refused, daily_refused;
} tcount;

static void count_tenant(void *ud, const gw_auth_tenant_stats *t) {
    tcount *c = ud;
    c->n++;
    if (strncmp(t->tenant, "ak-", 3) == 0) c->keyish = 1;
    if (!strcmp(t->tenant, "tpm")) c->tpm_admitted = (long long)t->admitted, c->tpm_tokens = (long long)t->tokens;
    if (!strcmp(t->tenant, "rpm")) c->rpm_refused = (long long)t->refused;
    if (!strcmp(t->tenant, "daily")) c->daily_refused = (long long)t->refused;
}

static void test_store(void) {
    char f[512];
    path_in(f, sizeof f, "store.conf");
    char kr[GW_KEY_BUF], kt[GW_KEY_BUF], kc[GW_KEY_BUF], kd[GW_KEY_BUF], km[GW_KEY_BUF];
    char ir[GW_KEY_ID_BUF], it[GW_KEY_ID_BUF], ic[GW_KEY_ID_BUF], id_[GW_KEY_ID_BUF], im[GW_KEY_ID_BUF];
    mk_key(f, "rpm", "*", 3, 0, 0, 0, kr, ir);
    mk_key(f, "tpm", "*", 0, 100, 0, 0, kt, it);
    mk_key(f, "conc", "*", 0, 0, 2, 0, kc, ic);
    mk_key(f, "daily", "*", 0, 0, 0, 100, kd, id_);
    mk_key(f, "models", "m1,m2", 0, 0, 0, 0, km, im);
    char kw[GW_KEY_BUF];
    {   /* a key with a fair-share weight */
        gw_key k = {0};
        T_CHECK(gw_key_generate(kw) == 0);
        gw_key_hash(SECRET, SECRET_LEN, kw, strlen(kw), k.hash, k.id);
        strcpy(k.tenant, "heavy");
        strcpy(k.models, "*");
        k.weight = 7;
        k.enabled = 1;
        T_CHECK(gw_keyfile_append(f, &k) == 0);
    }
    gw_auth *a = mk_auth(f);
    if (!a) return;
    gw_auth_result r;
    r = admit(a, kw, "m1", 1);
    T_CHECK(r.status == 0 && r.ticket.weight == 7 && !strcmp(r.ticket.tenant, "heavy"));
    gw_auth_settle(a, &r.ticket, 1);
    r = admit(a, km, "m1", 1);
    T_CHECK(r.status == 0 && r.ticket.weight == 1); /* written without one: weight=1 */
    gw_auth_settle(a, &r.ticket, 1);

    /* 401: missing, malformed, unknown */
    r = admit(a, NULL, "m1", 1);
    T_EQ_INT(r.status, 401);
    T_EQ_STR(r.code, "invalid_api_key");
    r = admit(a, "nope", "m1", 1);
    T_EQ_INT(r.status, 401);
    char unknown[GW_KEY_BUF];
    gw_key_generate(unknown);
    r = admit(a, unknown, "m1", 1);
    T_EQ_INT(r.status, 401);
    T_EQ_INT(r.should_retry, 0);

    /* 403 */
    r = admit(a, km, "m3", 1);
    T_EQ_INT(r.status, 403);
    T_EQ_STR(r.code, "model_not_allowed");
    r = admit(a, km, "m2", 1);
    T_EQ_INT(r.status, 0);
    gw_auth_settle(a, &r.ticket, 1);

    /* requests per minute: exactly 3, then 429 until the next minute */
    gw_auth_ticket tk[8];
    for (int i = 0; i < 3; i++) {
        r = admit(a, kr, "x", 1);
        T_EQ_INT(r.status, 0);
        T_EQ_INT(r.lim_req, 3);
        T_EQ_INT(r.rem_req, 2 - i);
        T_EQ_INT(r.reset_req_ms, 30000);
        T_EQ_INT(r.lim_tok, 0);
        tk[i] = r.ticket;
    }
    r = admit(a, kr, "x", 1);
    T_EQ_INT(r.status, 429);
    T_EQ_STR(r.code, "rate_limit_exceeded");
    T_EQ_INT(r.should_retry, 1);
    T_EQ_INT(r.retry_after_s, 30);
    T_EQ_INT(r.rem_req, 0);
    for (int i = 0; i < 3; i++) gw_auth_settle(a, &tk[i], 1); /* settling frees no request slot */
    r = admit(a, kr, "x", 1);
    T_EQ_INT(r.status, 429);
    atomic_fetch_add(&fake_now, 29999);
    r = admit(a, kr, "x", 1);
    T_EQ_INT(r.status, 429);
    T_EQ_INT(r.retry_after_s, 1);
    atomic_fetch_add(&fake_now, 1); /* next minute */
    r = admit(a, kr, "x", 1);
    T_EQ_INT(r.status, 0);
    T_EQ_INT(r.rem_req, 2);
    T_EQ_INT(r.reset_req_ms, 60000);
    gw_auth_settle(a, &r.ticket, 1);

    /* tokens per minute: reservations, then settlement to the real usage */
    int64_t rm, tm, inf, td;
    r = admit(a, kt, "x", 40);
    T_EQ_INT(r.status, 0);
    T_EQ_INT(r.rem_tok, 60);
    tk[0] = r.ticket;
    r = admit(a, kt, "x", 40);
    T_EQ_INT(r.status, 0);
    tk[1] = r.ticket;
    r = admit(a, kt, "x", 40);
    T_EQ_INT(r.status, 429);
    T_EQ_STR(r.type, "tokens");
    T_EQ_INT(r.should_retry, 1);
    gw_auth_settle(a, &tk[0], 10);
    T_CHECK(gw_auth_key_state(a, it, &rm, &tm, &inf, &td) == 0);
    T_EQ_INT(tm, 50);
    T_EQ_INT(inf, 1);
    T_EQ_INT(rm, 2);
    gw_auth_settle(a, &tk[0], 10); /* a second settle is a no-op */
    gw_auth_settle(a, &tk[0], 1000);
    T_CHECK(gw_auth_key_state(a, it, &rm, &tm, &inf, &td) == 0);
    T_EQ_INT(tm, 50);
    T_EQ_INT(inf, 1);
    r = admit(a, kt, "x", 50);
    T_EQ_INT(r.status, 0);
    T_EQ_INT(r.rem_tok, 0);
    tk[2] = r.ticket;
    r = admit(a, kt, "x", 1);
    T_EQ_INT(r.status, 429);
    r = admit(a, kt, "x", 101); /* can never fit */
    T_EQ_INT(r.status, 429);
    T_EQ_STR(r.code, "request_too_large");
    T_EQ_INT(r.should_retry, 0);
    gw_auth_settle(a, &tk[1], 60); /* over the reservation: charged */
    gw_auth_settle(a, &tk[2], 0);
    T_CHECK(gw_auth_key_state(a, it, &rm, &tm, &inf, &td) == 0);
    T_EQ_INT(tm, 70);
    T_EQ_INT(inf, 0);
    T_EQ_INT(td, 70);

    /* concurrency */
    r = admit(a, kc, "x", 1);
    tk[0] = r.ticket;
    T_EQ_INT(r.status, 0);
    r = admit(a, kc, "x", 1);
    tk[1] = r.ticket;
    T_EQ_INT(r.status, 0);
    r = admit(a, kc, "x", 1);
    T_EQ_INT(r.status, 429);
    T_EQ_STR(r.code, "concurrency_limit_exceeded");
    T_EQ_INT(r.should_retry, 1);
    T_CHECK(r.retry_after_s >= 1);
    gw_auth_settle(a, &tk[0], 1);
    r = admit(a, kc, "x", 1);
    T_EQ_INT(r.status, 0);
    gw_auth_settle(a, &r.ticket, 1);
    gw_auth_settle(a, &tk[1], 1);
    T_CHECK(gw_auth_key_state(a, ic, NULL, NULL, &inf, NULL) == 0 && inf == 0);

    /* daily budget: spent means no retry (until tomorrow) */
    r = admit(a, kd, "x", 60);
    T_EQ_INT(r.status, 0);
    gw_auth_settle(a, &r.ticket, 60);
    r = admit(a, kd, "x", 50);
    T_EQ_INT(r.status, 429);
    T_EQ_STR(r.code, "insufficient_quota");
    T_EQ_INT(r.should_retry, 0);
    int64_t now = atomic_load(&fake_now);
    T_EQ_INT(r.retry_after_s, ((now / 86400000 + 1) * 86400000 - now + 999) / 1000);
    r = admit(a, kd, "x", 40);
    T_EQ_INT(r.status, 0);
    gw_auth_settle(a, &r.ticket, 40);
    r = admit(a, kd, "x", 1);
    T_EQ_INT(r.status, 429);
    T_EQ_INT(r.should_retry, 0);

    /* daily usage survives a restart (the usage file), counters per minute do not need to */
    gw_auth_destroy(a);
    a = mk_auth(f);
    if (!a) return;
    T_CHECK(gw_auth_key_state(a, id_, NULL, NULL, NULL, &td) == 0);
    T_EQ_INT(td, 100);
    r = admit(a, kd, "x", 1);
    T_EQ_INT(r.status, 429);
    gw_key_usage *u;
    int nu;
    T_CHECK(gw_usage_load(f, &u, &nu) == 0);
    int seen = 0;
    for (int i = 0; i < nu; i++)
        if (!strcmp(u[i].id, id_)) seen = u[i].tokens == 100 && u[i].requests == 2;
    T_CHECK(seen);
    free(u);
    atomic_fetch_add(&fake_now, 86400000); /* tomorrow */
    r = admit(a, kd, "x", 1);
    T_EQ_INT(r.status, 0);
    gw_auth_settle(a, &r.ticket, 1);

    /* revocation through the file: picked up within reload_ms */
    r = admit(a, kr, "x", 1);
    T_EQ_INT(r.status, 0);
    tk[0] = r.ticket;
    T_CHECK(gw_keyfile_set_enabled(f, ir, 0) == 0);
    atomic_fetch_add(&fake_now, 1000);
    r = admit(a, kr, "x", 1);
    T_EQ_INT(r.status, 401);
    T_EQ_STR(r.code, "invalid_api_key");
    r = admit(a, kt, "x", 1); /* the others stay */
    T_EQ_INT(r.status, 0);
    gw_auth_settle(a, &r.ticket, 1);
    gw_auth_settle(a, &tk[0], 1); /* a claim of a revoked key settles fine */
    T_CHECK(gw_auth_key_state(a, ir, NULL, NULL, &inf, NULL) == 0 && inf == 0);

    /* reservation: body bytes / 2 + n * max_tokens (or the default) */
    T_EQ_INT(gw_auth_reserve(a, 100, 10, 2), 70);
    T_EQ_INT(gw_auth_reserve(a, 101, -1, 1), 50 + 1024);

    gw_auth_stats st;
    gw_auth_stats_get(a, &st);
    T_CHECK(st.admitted > 0 && st.refused > 0 && st.fallback_admits == 0);
    /* per tenant (this instance, since the restart): "tpm" admitted once and settled 1 token */
    tcount tc = {0};
    gw_auth_tenants(a, count_tenant, &tc);
    T_EQ_INT(tc.tpm_admitted, 1);
    T_EQ_INT(tc.tpm_tokens, 1);
    T_EQ_INT(tc.rpm_refused, 1); /* the revoked key: its tenant is known */
    T_EQ_INT(tc.daily_refused, 1);
    T_CHECK(tc.n >= 3 && !tc.keyish);
    gw_auth_destroy(a);
}

/* ---- admission in the routes, over HTTP -------------------------------------------------- */

/* Generations run on gw_fake.h's backend: prompt tokens = prompt bytes; a prompt "hold" waits a
 * minute after its first token. */

typedef struct srv {
    pthread_t th;
    uv_loop_t loop;
    gw_server *s;
    gw_app *app;
    gw_auth *auth;
    fake be;
    gw_gen_env env;
    const char *keys_file;
    atomic_int ready;
} srv;

static void *srv_main(void *arg) {
    srv *st = arg;
    uv_loop_init(&st->loop);
    fake_init(&st->be, &st->loop);
    st->env = fake_env(&st->be, 4096);
    gw_auth_cfg c;
    gw_auth_cfg_default(&c);
    c.keys_file = st->keys_file;
    c.secret = SECRET;
    c.secret_len = SECRET_LEN;
    c.clock = fake_clock;
    gw_app_cfg ac;
    gw_app_cfg_default(&ac);
    ac.env = &st->env;
    ac.model_id = "m1";
    gw_http_cfg hc;
    gw_http_cfg_default(&hc);
    hc.port = 0;
    hc.handler = gw_app_handle;
    hc.on_headers = gw_app_on_headers;
    if (!st->be.vocab || gw_auth_create(&st->loop, &c, &st->auth) || (ac.auth = st->auth, gw_app_create(&ac, &st->app)) ||
        (hc.ud = st->app, gw_server_create(&st->loop, &hc, &st->s))) {
        atomic_store(&st->ready, -1);
        return NULL;
    }
    atomic_store(&st->ready, 1);
    uv_run(&st->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int srv_start(srv *st) {
    pthread_create(&st->th, NULL, srv_main, st);
    while (!atomic_load(&st->ready)) usleep(1000);
    return atomic_load(&st->ready) == 1 ? gw_server_port(st->s) : -1;
}

static void srv_stop(srv *st) {
    if (st->s) gw_server_stop_async(st->s);
    pthread_join(st->th, NULL);
    gw_server_destroy(st->s);
    gw_app_destroy(st->app);
    gw_auth_destroy(st->auth);
    uv_loop_close(&st->loop);
    fake_free(&st->be);
}

typedef struct resp {
    int status;
    char head[4096];
    char body[8192];
} resp;

static int connect_port(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Sends a POST with an optional key; with out == NULL returns the open socket without reading. */
static int post(int port, const char *path, const char *key, const char *body, resp *out) {
    int fd = connect_port(port);
    if (fd < 0) return -1;
    char req[8192];
    char auth[128] = "";
    if (key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    int n = snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s", path, auth, strlen(body), body);
    send(fd, req, (size_t)n, MSG_NOSIGNAL);
    if (!out) return fd;
    memset(out, 0, sizeof *out);
    char buf[16384];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0) got += (size_t)r;
    close(fd);
    buf[got] = 0;
    char *end = strstr(buf, "\r\n\r\n");
    if (!end) return -1;
    snprintf(out->head, sizeof out->head, "%.*s", (int)(end - buf + 2), buf);
    snprintf(out->body, sizeof out->body, "%s", end + 4);
    out->status = atoi(buf + 9);
    return out->status;
}

/* Value of a response header (case-insensitive name) into v; 1 when present. */
static int hdr(const resp *r, const char *name, char *v, size_t cap) {
    size_t nl = strlen(name);
    for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
        if (strncasecmp(p + 2, name, nl) == 0 && p[2 + nl] == ':') {
            const char *s = p + 3 + nl;
            while (*s == ' ') s++;
            snprintf(v, cap, "%.*s", (int)strcspn(s, "\r"), s);
            return 1;
        }
    }
    return 0;
}

static int hdr_int(const resp *r, const char *name) {
    char v[64];
    return hdr(r, name, v, sizeof v) ? atoi(v) : -1;
}

/* ---- WebSocket client bits ---- */

static void ws_send(int fd, const char *text) {
    static const uint8_t key[4] = {1, 2, 3, 4};
    uint8_t out[4096];
    size_t len = strlen(text), o = 0;
    out[o++] = 0x81;
    if (len < 126) out[o++] = 0x80 | (uint8_t)len;
    else out[o++] = 0x80 | 126, out[o++] = (uint8_t)(len >> 8), out[o++] = (uint8_t)len;
    memcpy(out + o, key, 4);
    o += 4;
    for (size_t i = 0; i < len; i++) out[o + i] = (uint8_t)text[i] ^ key[i & 3];
    send(fd, out, o + len, MSG_NOSIGNAL);
}

static int recv_n(int fd, void *b, size_t n) {
    char *p = b;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static cJSON *ws_event(int fd) {
    uint8_t h[2];
    if (recv_n(fd, h, 2)) return NULL;
    size_t n = h[1] & 0x7F;
    if (n == 126) {
        uint8_t e[2];
        if (recv_n(fd, e, 2)) return NULL;
        n = (size_t)e[0] << 8 | e[1];
    }
    char *p = malloc(n + 1);
    if (recv_n(fd, p, n)) {
        free(p);
        return NULL;
    }
    p[n] = 0;
    cJSON *j = (h[0] & 0x0F) == 1 ? cJSON_Parse(p) : NULL;
    free(p);
    return j;
}

static const char *type_of(cJSON *j) {
    cJSON *t = cJSON_GetObjectItem(j, "type");
    return cJSON_IsString(t) ? t->valuestring : "(none)";
}

/* Opens /v1/ws with key (or none); returns the socket after a 101, or -status. */
static int ws_open(int port, const char *key) {
    int fd = connect_port(port);
    char hs[512], auth[128] = "";
    if (key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    int n = snprintf(hs, sizeof hs, "GET /v1/ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n%s"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", auth);
    send(fd, hs, (size_t)n, MSG_NOSIGNAL);
    char head[1024];
    size_t hn = 0;
    while (hn < sizeof head - 1 && recv(fd, head + hn, 1, 0) == 1) {
        hn++;
        if (hn >= 4 && memcmp(head + hn - 4, "\r\n\r\n", 4) == 0) break;
    }
    head[hn] = 0;
    int status = hn > 12 ? atoi(head + 9) : -1;
    if (status == 101) return fd;
    close(fd);
    return -status;
}

static int wait_inflight(gw_auth *a, const char *id, int64_t want) {
    int64_t inf = -1;
    for (int i = 0; i < 500; i++) {
        gw_auth_key_state(a, id, NULL, NULL, &inf, NULL);
        if (inf == want) return 1;
        usleep(2000);
    }
    return 0;
}

static void test_routes(void) {
    char f[512];
    path_in(f, sizeof f, "routes.conf");
    char k1[GW_KEY_BUF], k2[GW_KEY_BUF], i1[GW_KEY_ID_BUF], i2[GW_KEY_ID_BUF];
    mk_key(f, "acme", "m1", 3, 1000, 1, 0, k1, i1);
    mk_key(f, "other", "m2", 0, 0, 0, 0, k2, i2);
    char kw[GW_KEY_BUF], iw[GW_KEY_ID_BUF];
    mk_key(f, "ws", "m1", 1, 0, 0, 0, kw, iw);
    srv st = {0};
    st.keys_file = f;
    int port = srv_start(&st);
    T_CHECK(port > 0);
    if (port <= 0) return;
    resp r;
    char v[256];
    const char *body = "{\"model\":\"m1\",\"prompt\":\"hello\",\"max_tokens\":3}"; /* 46 bytes: reserve 23 + 3 */

    /* 401 without a key, with a bad one, with an unknown one; no request reaches the backend */
    T_EQ_INT(post(port, "/v1/completions", NULL, body, &r), 401);
    T_CHECK(strstr(r.body, "\"code\":\"invalid_api_key\"") != NULL);
    T_CHECK(hdr(&r, "x-request-id", v, sizeof v) && strncmp(v, "req_", 4) == 0);
    T_CHECK(hdr(&r, "x-should-retry", v, sizeof v) && !strcmp(v, "false"));
    T_EQ_INT(post(port, "/v1/completions", "sk-wrong", body, &r), 401);
    char unknown[GW_KEY_BUF];
    gw_key_generate(unknown);
    T_EQ_INT(post(port, "/v1/chat/completions", unknown, "{\"model\":\"m1\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r), 401);
    T_CHECK(strstr(r.body, "invalid_api_key") != NULL);
    T_EQ_INT(atomic_load(&st.be.submits), 0);

    /* 403: the key may not use m1 */
    T_EQ_INT(post(port, "/v1/completions", k2, body, &r), 403);
    T_CHECK(strstr(r.body, "model_not_allowed") != NULL);

    /* 200 with the rate-limit headers; usage settled exactly */
    T_EQ_INT(post(port, "/v1/completions", k1, body, &r), 200);
    T_EQ_INT(hdr_int(&r, "x-ratelimit-limit-requests"), 3);
    T_EQ_INT(hdr_int(&r, "x-ratelimit-remaining-requests"), 2);
    T_CHECK(hdr(&r, "x-ratelimit-reset-requests", v, sizeof v) && v[strlen(v) - 1] == 's');
    T_EQ_INT(hdr_int(&r, "x-ratelimit-limit-tokens"), 1000);
    T_EQ_INT(hdr_int(&r, "x-ratelimit-remaining-tokens"), 1000 - 26);
    T_CHECK(hdr(&r, "x-ratelimit-reset-tokens", v, sizeof v));
    T_CHECK(hdr(&r, "x-request-id", v, sizeof v));
    T_CHECK(strstr(r.body, "\"completion_tokens\":3") != NULL);
    T_CHECK(wait_inflight(st.auth, i1, 0));
    int64_t tm = -1, td = -1;
    gw_auth_key_state(st.auth, i1, NULL, &tm, NULL, &td);
    int64_t used1 = 5 + 3; /* prompt "hello" + 3 tokens */
    T_EQ_INT(tm, used1);
    T_EQ_INT(td, used1);

    /* streaming carries the headers too */
    const char *sbody = "{\"model\":\"m1\",\"prompt\":\"hello\",\"max_tokens\":2,\"stream\":true}";
    T_EQ_INT(post(port, "/v1/completions", k1, sbody, &r), 200);
    T_EQ_INT(hdr_int(&r, "x-ratelimit-remaining-requests"), 1);
    T_CHECK(strstr(r.head, "text/event-stream") != NULL);
    T_CHECK(wait_inflight(st.auth, i1, 0));
    int64_t used2 = 5 + 2;
    gw_auth_key_state(st.auth, i1, NULL, &tm, NULL, NULL);
    T_EQ_INT(tm, used1 + used2);

    /* concurrency 1: a held request blocks a second one; the client leaving settles what was seen */
    int held = post(port, "/v1/completions", k1, "{\"model\":\"m1\",\"prompt\":\"hold\",\"max_tokens\":5}", NULL);
    T_CHECK(held >= 0);
    T_CHECK(wait_inflight(st.auth, i1, 1));
    usleep(20000); /* the first token has been produced */
    T_EQ_INT(post(port, "/v1/completions", k1, body, &r), 429);
    T_CHECK(strstr(r.body, "concurrency_limit_exceeded") != NULL);
    T_CHECK(hdr(&r, "x-should-retry", v, sizeof v) && !strcmp(v, "true"));
    T_CHECK(hdr_int(&r, "Retry-After") >= 1);
    close(held);
    T_CHECK(wait_inflight(st.auth, i1, 0));
    gw_auth_key_state(st.auth, i1, NULL, &tm, NULL, NULL);
    T_EQ_INT(tm, used1 + used2 + 4 + 1); /* prompt "hold" + the one token it produced */

    /* requests per minute: the third was the held one; the fourth is refused with Retry-After */
    T_EQ_INT(post(port, "/v1/completions", k1, body, &r), 429);
    T_CHECK(strstr(r.body, "rate_limit_exceeded") != NULL);
    T_EQ_INT(hdr_int(&r, "x-ratelimit-remaining-requests"), 0);
    T_EQ_INT(hdr_int(&r, "Retry-After"), 60 - (int)((atomic_load(&fake_now) % 60000) / 1000));
    T_CHECK(hdr(&r, "x-should-retry", v, sizeof v) && !strcmp(v, "true"));
    T_CHECK(hdr(&r, "x-request-id", v, sizeof v));

    /* the key is checked from the headers: an unknown one gets its 401 before a byte of its
     * (8 MB) body is sent, and the connection closes */
    {
        int sub0 = atomic_load(&st.be.submits);
        int fd = connect_port(port);
        char req[512];
        int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
                         "Content-Length: 8000000\r\n\r\n", unknown);
        send(fd, req, (size_t)n, MSG_NOSIGNAL);
        char buf[2048];
        ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
        buf[got > 0 ? got : 0] = 0;
        T_CHECKF(got > 0 && atoi(buf + 9) == 401 && strstr(buf, "invalid_api_key") && strstr(buf, "Connection: close"),
                 "unknown key before its body: %s", buf);
        close(fd);
        T_EQ_INT(atomic_load(&st.be.submits), sub0);
    }

    /* WebSocket: the upgrade needs a key the store knows (not just one shaped like a key); each
     * response.create is admitted (rpm 1 here) */
    T_EQ_INT(ws_open(port, NULL), -401);
    T_EQ_INT(ws_open(port, "ak-nope"), -401);
    T_EQ_INT(ws_open(port, unknown), -401);
    int ws = ws_open(port, kw);
    T_CHECK(ws >= 0);
    if (ws >= 0) {
        ws_send(ws, "{\"type\":\"response.create\",\"response\":{\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}");
        cJSON *j = ws_event(ws);
        T_EQ_STR(type_of(j), "response.created");
        cJSON_Delete(j);
        int done = 0;
        for (int i = 0; i < 10 && !done; i++) {
            j = ws_event(ws);
            done = j && !strcmp(type_of(j), "response.done");
            cJSON_Delete(j);
        }
        T_CHECK(done);
        ws_send(ws, "{\"type\":\"response.create\",\"event_id\":\"e2\",\"response\":{\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}");
        j = ws_event(ws);
        T_EQ_STR(type_of(j), "error");
        cJSON *err = cJSON_GetObjectItem(j, "error");
        cJSON *code = cJSON_GetObjectItem(err, "code");
        T_CHECK(cJSON_IsString(code) && !strcmp(code->valuestring, "rate_limit_exceeded"));
        cJSON_Delete(j);
        close(ws);
        T_CHECK(wait_inflight(st.auth, iw, 0));
        int64_t wd = -1;
        gw_auth_key_state(st.auth, iw, NULL, NULL, NULL, &wd);
        T_EQ_INT(wd, 2 + 2); /* chat: the message "hi" (the fake template renders the content alone) + 2 */
    }
    srv_stop(&st);
}

/* Without an auth hook the routes answer as before: no key needed, no rate-limit headers. */
static void test_routes_off(void) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    fake be;
    fake_init(&be, &loop);
    T_CHECK(be.vocab != NULL);
    gw_gen_env env = fake_env(&be, 4096);
    gw_app_cfg ac;
    gw_app_cfg_default(&ac);
    ac.env = &env;
    ac.model_id = "m1";
    gw_app *app;
    T_CHECK(gw_app_create(&ac, &app) == 0);
    gw_http_cfg hc;
    gw_http_cfg_default(&hc);
    hc.port = 0;
    hc.handler = gw_app_handle;
    hc.ud = app;
    gw_server *s;
    T_CHECK(gw_server_create(&loop, &hc, &s) == 0);
    int port = gw_server_port(s);
    int fd = post(port, "/v1/completions", NULL, "{\"model\":\"m1\",\"prompt\":\"hi\",\"max_tokens\":2}", NULL);
    for (int i = 0; i < 200; i++) uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    char buf[8192];
    ssize_t n = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    T_CHECK(strncmp(buf, "HTTP/1.1 200", 12) == 0);
    T_CHECK(strstr(buf, "x-ratelimit") == NULL && strstr(buf, "x-request-id") == NULL);
    gw_server_shutdown(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    gw_server_destroy(s);
    gw_app_destroy(app);
    uv_loop_close(&loop);
    fake_free(&be);
}

/* ---- near misses of a real key are all refused -------------------------------------------- */

static uint64_t nm_state = 0x9E3779B97F4A7C15ull;
static uint32_t nm_rand(void) {
    nm_state ^= nm_state << 13;
    nm_state ^= nm_state >> 7;
    nm_state ^= nm_state << 17;
    return (uint32_t)(nm_state >> 11);
}

static int nm_refused, nm_admitted;
static void nm_cb(void *ud, const gw_auth_result *res) {
    if (res->status == 401) nm_refused++;
    else nm_admitted++;
}

/* One candidate through both checks the gateway makes (the headers' gw_auth_identify and the
 * admission); counts an admission by either. */
static void nm_try(gw_auth *a, const char *cand, const char *real, int *tried, int *bad) {
    if (strcmp(cand, real) == 0) return; /* a random suffix can rebuild the key itself */
    int before = nm_admitted;
    gw_auth_identify(a, cand, nm_cb, NULL);
    gw_auth_admit(a, cand, "m1", 1, nm_cb, NULL);
    (*tried)++;
    if (nm_admitted != before) {
        (*bad)++;
        if (*bad <= 5) fprintf(stderr, "near miss admitted: %s (key %s)\n", cand, real);
    }
}

/* 10^6 near misses of a stored key (fewer under sanitizers unless ARKA_LONG_TESTS=1): every hex
 * digit position set to every other value, the first k digits (k = 0..47) with random digits
 * after, truncations, extensions, upper case, other prefixes and separators; the key itself,
 * presented alongside, is admitted each time. */
static void test_near_misses(void) {
    char f[512];
    path_in(f, sizeof f, "near.conf");
    char key[GW_KEY_BUF], id[GW_KEY_ID_BUF], other[GW_KEY_BUF], oid[GW_KEY_ID_BUF];
    mk_key(f, "acme", "*", 0, 0, 0, 0, key, id);
    mk_key(f, "acme2", "*", 0, 0, 0, 0, other, oid);
    gw_auth_cfg c;
    gw_auth_cfg_default(&c);
    c.keys_file = f;
    c.secret = SECRET;
    c.secret_len = SECRET_LEN;
    c.clock = fake_clock;
    gw_auth *a;
    T_EQ_INT(gw_auth_create(NULL, &c, &a), 0);
    if (!a) return;
    const char *lt = getenv("ARKA_LONG_TESTS");
#if defined(__SANITIZE_ADDRESS__)
    int total = lt && !strcmp(lt, "1") ? 1000000 : 100000;
#else
    int total = 1000000;
    (void)lt;
#endif
    static const char hex[] = "0123456789abcdef";
    int tried = 0, bad = 0;
    char cand[GW_KEY_BUF + 16];
    /* every position, every other digit */
    for (int pos = 3; pos < 3 + GW_KEY_HEX; pos++)
        for (int d = 0; d < 16; d++) {
            if (hex[d] == key[pos]) continue;
            memcpy(cand, key, GW_KEY_BUF);
            cand[pos] = hex[d];
            nm_try(a, cand, key, &tried, &bad);
        }
    /* truncations and extensions */
    for (int len = 0; len < 3 + GW_KEY_HEX; len++) {
        snprintf(cand, sizeof cand, "%.*s", len, key);
        nm_try(a, cand, key, &tried, &bad);
    }
    for (int extra = 1; extra <= 8; extra++)
        for (int rep = 0; rep < 50; rep++) {
            snprintf(cand, sizeof cand, "%s", key);
            for (int k = 0; k < extra; k++) cand[3 + GW_KEY_HEX + k] = hex[nm_rand() % 16];
            cand[3 + GW_KEY_HEX + extra] = 0;
            nm_try(a, cand, key, &tried, &bad);
        }
    /* upper case, other prefixes, separators */
    for (int pos = 3; pos < 3 + GW_KEY_HEX; pos++)
        if (key[pos] >= 'a') {
            memcpy(cand, key, GW_KEY_BUF);
            cand[pos] = (char)(cand[pos] - 'a' + 'A');
            nm_try(a, cand, key, &tried, &bad);
        }
    const char *pre[] = { "AK-", "ak_", "ak:", "sk-", "ak-ak-", "" };
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++) {
        snprintf(cand, sizeof cand, "%s%s", pre[i], key + 3);
        nm_try(a, cand, key, &tried, &bad);
    }
    snprintf(cand, sizeof cand, " %s", key);
    nm_try(a, cand, key, &tried, &bad);
    snprintf(cand, sizeof cand, "%s\n", key);
    nm_try(a, cand, key, &tried, &bad);
    /* the rest: a real prefix of random length, random digits after it (the "first 44 +
     * 4 random" among them), now and then the other key's digits mixed in */
    int admitted_real = 0;
    while (tried < total) {
        int k = (int)(nm_rand() % GW_KEY_HEX);
        if (tried % 3 == 0) k = GW_KEY_HEX - 1 - (int)(nm_rand() % 8); /* most of the key right */
        memcpy(cand, key, GW_KEY_BUF);
        for (int j = 3 + k; j < 3 + GW_KEY_HEX; j++) cand[j] = nm_rand() % 5 == 0 ? other[j] : hex[nm_rand() % 16];
        nm_try(a, cand, key, &tried, &bad);
        if (tried % 100000 == 0) { /* the real key, alongside */
            int before = nm_admitted;
            gw_auth_identify(a, key, nm_cb, NULL);
            admitted_real += nm_admitted == before + 1;
        }
    }
    T_CHECKF(bad == 0, "%d of %d near misses admitted", bad, tried);
    T_CHECKF(nm_refused == 2 * tried, "%d refusals for %d near misses (each checked twice)", nm_refused, tried);
    T_CHECK(admitted_real >= 1);
    printf("near misses: %d refused (identify and admit), %d admitted; the key itself admitted %d times\n", tried, bad,
           admitted_real);
    gw_auth_destroy(a);
}

int main(void) {
    cm_log_set_level(CM_LOG_LEVEL_WARN);
    snprintf(dir, sizeof dir, "/tmp/arka_test_auth.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_keys();
    test_keyfile();
    test_secret();
    test_store();
    test_routes();
    test_routes_off();
    test_near_misses();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
