/* auth: keys, the keys file, the server secret and the in-process quota store (see auth.h). */
#include "gateway/auth.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/cm_err.h"
#include "common/cm_log.h"
#include "gateway/auth_internal.h"

/* ---- keys ---------------------------------------------------------------------------------- */

static const char HEX[] = "0123456789abcdef";

static void to_hex(const uint8_t *b, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = HEX[b[i] >> 4];
        out[2 * i + 1] = HEX[b[i] & 15];
    }
    out[2 * n] = 0;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int from_hex(const char *s, size_t len, uint8_t *out, size_t n) {
    if (len != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (uint8_t)(hi * 16 + lo);
    }
    return 0;
}

static int fill_random(void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((char *)buf + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return CM_EIO;
        }
        got += (size_t)r;
    }
    return 0;
}

int gw_key_generate(char out[GW_KEY_BUF]) {
    uint8_t rnd[GW_KEY_HEX / 2];
    if (fill_random(rnd, sizeof rnd)) return CM_EIO;
    memcpy(out, GW_KEY_PREFIX, 3);
    to_hex(rnd, sizeof rnd, out + 3);
    OPENSSL_cleanse(rnd, sizeof rnd);
    return 0;
}

void gw_key_hash(const uint8_t *secret, size_t secret_len, const char *key, size_t key_len, uint8_t hash[32],
                 char id[GW_KEY_ID_BUF]) {
    unsigned int n = 32;
    HMAC(EVP_sha256(), secret, (int)secret_len, (const unsigned char *)key, key_len, hash, &n);
    if (id) {
        char hex[65];
        to_hex(hash, 32, hex);
        memcpy(id, hex, GW_KEY_ID_BUF - 1);
        id[GW_KEY_ID_BUF - 1] = 0;
    }
}

int gw_key_well_formed(const char *s, size_t len) {
    if (!s || len != 3 + GW_KEY_HEX || memcmp(s, GW_KEY_PREFIX, 3) != 0) return 0;
    for (size_t i = 3; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

int gw_key_allows(const gw_key *k, const char *model) {
    if (!k->models[0] || strcmp(k->models, "*") == 0) return 1;
    size_t ml = strlen(model);
    for (const char *p = k->models; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == ml && memcmp(p, model, l) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int gw_tenant_valid(const char *t) {
    size_t n = t ? strlen(t) : 0;
    if (n == 0 || n >= GW_TENANT_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

uint64_t gw_tenant_id(const char *tenant) {
    if (!tenant || !*tenant) return 0;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = tenant; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h ? h : 1;
}

/* ---- the keys file ------------------------------------------------------------------------- */

int gw_key_format(const gw_key *k, char *buf, size_t cap) {
    char hex[65];
    to_hex(k->hash, 32, hex);
    int n = snprintf(buf, cap,
                     "hash=%s tenant=%s models=%s rpm=%lld tpm=%lld concurrency=%lld daily-tokens=%lld weight=%lld enabled=%d "
                     "created=%lld",
                     hex, k->tenant, k->models[0] ? k->models : "*", (long long)k->rpm, (long long)k->tpm,
                     (long long)k->concurrency, (long long)k->daily_tokens, (long long)(k->weight ? k->weight : 1),
                     k->enabled ? 1 : 0, (long long)k->created);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

static int parse_i64(const char *v, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < 0) return -1;
    *out = x;
    return 0;
}

static int models_valid(const char *m) {
    if (!*m || strlen(m) >= GW_MODELS_MAX) return 0;
    for (const char *p = m; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == '"' || *p == '\\') return 0;
    return 1;
}

/* Parses one line (modified in place). Returns 1 for a key, 0 for blank/comment, -1 with why set. */
static int parse_line(char *line, gw_key *k, const char **why) {
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p || *p == '#' || *p == '\n' || *p == '\r') return 0;
    memset(k, 0, sizeof *k);
    k->enabled = 1;
    k->weight = 1;
    strcpy(k->models, "*");
    int have_hash = 0;
    char *save = NULL;
    for (char *tok = strtok_r(p, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) { *why = "expected name=value fields"; return -1; }
        *eq = 0;
        const char *n = tok, *v = eq + 1;
        int64_t x = 0;
        if (!strcmp(n, "hash")) {
            if (from_hex(v, strlen(v), k->hash, 32)) { *why = "hash: expected 64 hex digits"; return -1; }
            have_hash = 1;
        } else if (!strcmp(n, "tenant")) {
            if (!gw_tenant_valid(v)) { *why = "tenant: expected 1..63 of [A-Za-z0-9._-]"; return -1; }
            strcpy(k->tenant, v);
        } else if (!strcmp(n, "models")) {
            if (!models_valid(v)) { *why = "models: expected * or a comma-separated list"; return -1; }
            strcpy(k->models, v);
        } else if (!strcmp(n, "enabled")) {
            if (strcmp(v, "0") && strcmp(v, "1")) { *why = "enabled: expected 0 or 1"; return -1; }
            k->enabled = v[0] == '1';
        } else if (parse_i64(v, &x)) {
            *why = "expected a non-negative integer value";
            return -1;
        } else if (!strcmp(n, "rpm")) k->rpm = x;
        else if (!strcmp(n, "tpm")) k->tpm = x;
        else if (!strcmp(n, "concurrency")) k->concurrency = x;
        else if (!strcmp(n, "daily-tokens")) k->daily_tokens = x;
        else if (!strcmp(n, "weight")) {
            if (x < 1 || x > GW_WEIGHT_MAX) { *why = "weight: expected 1..1000"; return -1; }
            k->weight = x;
        } else if (!strcmp(n, "created")) k->created = x;
        else { *why = "unknown field (known: hash tenant models rpm tpm concurrency daily-tokens weight enabled created)"; return -1; }
    }
    if (!have_hash || !k->tenant[0]) { *why = "hash= and tenant= are required"; return -1; }
    char hex[65];
    to_hex(k->hash, 32, hex);
    memcpy(k->id, hex, GW_KEY_ID_BUF - 1);
    return 1;
}

int gw_keyfile_load(const char *path, gw_key **keys, int *n, char *err, size_t errlen) {
    *keys = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return CM_EIO;
    }
    char line[1024];
    int cap = 0, lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        gw_key k;
        const char *why = NULL;
        int r = parse_line(line, &k, &why);
        if (r == 0) continue;
        if (r < 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
            rc = CM_EFORMAT;
            break;
        }
        if (*n == cap) {
            int nc = cap ? cap * 2 : 16;
            gw_key *nk = realloc(*keys, (size_t)nc * sizeof *nk);
            if (!nk) { rc = CM_ENOMEM; break; }
            *keys = nk;
            cap = nc;
        }
        (*keys)[(*n)++] = k;
    }
    fclose(f);
    if (rc) {
        free(*keys);
        *keys = NULL;
        *n = 0;
    }
    return rc;
}

static const char KEYFILE_HEAD[] =
    "# arka API keys: one key per line, only HMAC-SHA256(secret, key) is stored (see config/keys.conf).\n"
    "# Written by `arka keys`; 0 means unlimited for rpm, tpm, concurrency and daily-tokens.\n";

int gw_keyfile_append(const char *path, const gw_key *k) {
    char line[1024];
    int len = gw_key_format(k, line, sizeof line - 1);
    if (len < 0) return CM_EINVAL;
    line[len++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return CM_EIO;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) == 0 && st.st_size == 0 && write(fd, KEYFILE_HEAD, sizeof KEYFILE_HEAD - 1) != (ssize_t)(sizeof KEYFILE_HEAD - 1))
        rc = CM_EIO;
    if (!rc && write(fd, line, (size_t)len) != len) rc = CM_EIO;
    if (!rc && fsync(fd)) rc = CM_EIO;
    close(fd);
    return rc;
}

int gw_keyfile_set_enabled(const char *path, const char *id, int enabled) {
    FILE *in = fopen(path, "r");
    if (!in) return errno == ENOENT ? CM_ENOTFOUND : CM_EIO;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!out) {
        if (fd >= 0) close(fd);
        fclose(in);
        return CM_EIO;
    }
    char line[1024], copy[1024];
    int found = 0, rc = 0;
    size_t idl = strlen(id);
    while (fgets(line, sizeof line, in)) {
        gw_key k;
        const char *why;
        memcpy(copy, line, sizeof line);
        int r = parse_line(copy, &k, &why);
        if (r < 0) { rc = CM_EFORMAT; break; }
        char hex[65];
        if (r == 1) to_hex(k.hash, 32, hex);
        if (r == 1 && idl >= GW_KEY_ID_BUF - 1 && idl <= 64 && strncmp(hex, id, idl) == 0) {
            k.enabled = enabled;
            int len = gw_key_format(&k, line, sizeof line - 1);
            if (len < 0) { rc = CM_EINVAL; break; }
            line[len] = '\n';
            line[len + 1] = 0;
            found++;
        }
        if (fputs(line, out) == EOF) { rc = CM_EIO; break; }
    }
    fclose(in);
    if (fflush(out) || fsync(fileno(out))) rc = rc ? rc : CM_EIO;
    fclose(out);
    if (!rc && !found) rc = CM_ENOTFOUND;
    if (!rc && rename(tmp, path)) rc = CM_EIO;
    if (rc) unlink(tmp);
    return rc;
}

/* ---- the secret --------------------------------------------------------------------------- */

int gw_auth_secret_load(const char *given, const char *keys_file, int create, uint8_t *out, size_t cap, size_t *len,
                        char *err, size_t errlen) {
    *len = 0;
    if (given && *given) {
        size_t n = strlen(given);
        if (n < 16 || n > cap) {
            snprintf(err, errlen, "the auth secret must be 16..%zu bytes", cap);
            return CM_EINVAL;
        }
        memcpy(out, given, n);
        *len = n;
        return 0;
    }
    if (!keys_file || !*keys_file) {
        snprintf(err, errlen, "no auth secret: give --auth-secret (or ARKA_AUTH_SECRET) or a keys file");
        return CM_EINVAL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.secret", keys_file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
        uint8_t rnd[32];
        char hex[66];
        if (fill_random(rnd, sizeof rnd)) return CM_EIO;
        to_hex(rnd, sizeof rnd, hex);
        OPENSSL_cleanse(rnd, sizeof rnd);
        strcat(hex, "\n");
        int w = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (w >= 0) {
            int ok = write(w, hex, 65) == 65 && fsync(w) == 0;
            close(w);
            if (!ok) {
                unlink(path);
                snprintf(err, errlen, "%s: cannot write the secret", path);
                return CM_EIO;
            }
            CM_LOG_INFO("auth", "created the auth secret", "path=%s", path);
        } else if (errno != EEXIST) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return CM_EIO;
        }
        OPENSSL_cleanse(hex, sizeof hex);
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? CM_ENOENT : CM_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) || (st.st_mode & 077)) {
        close(fd);
        snprintf(err, errlen, "%s: the secret file must be readable by its owner only (chmod 600)", path);
        return CM_EINVAL;
    }
    ssize_t n = read(fd, out, cap);
    close(fd);
    if (n < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return CM_EIO;
    }
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r')) n--;
    if (n < 16 || (size_t)n >= cap) {
        snprintf(err, errlen, "%s: the secret must be 16..%zu bytes", path, cap - 1);
        return CM_EINVAL;
    }
    *len = (size_t)n;
    return 0;
}

/* ---- usage file ---------------------------------------------------------------------------- */

int gw_usage_load(const char *keys_file, gw_key_usage **u, int *n) {
    *u = NULL;
    *n = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s.usage", keys_file);
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : CM_EIO;
    char line[256];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        gw_key_usage x;
        long long day, tok, req;
        char id[32];
        if (line[0] == '#' || sscanf(line, "%31s %lld %lld %lld", id, &day, &tok, &req) != 4 || strlen(id) != GW_KEY_ID_BUF - 1)
            continue;
        memcpy(x.id, id, GW_KEY_ID_BUF);
        x.day = day, x.tokens = tok, x.requests = req;
        if (*n == cap) {
            int nc = cap ? cap * 2 : 16;
            gw_key_usage *nu = realloc(*u, (size_t)nc * sizeof *nu);
            if (!nu) {
                fclose(f);
                free(*u);
                *u = NULL;
                *n = 0;
                return CM_ENOMEM;
            }
            *u = nu;
            cap = nc;
        }
        (*u)[(*n)++] = x;
    }
    fclose(f);
    return 0;
}

/* ---- the limiter (shared by the in-process store and the Redis fallback) ------------------- */

int64_t gw__auth_now(const gw_auth *a) {
    if (a->cfg.clock) return a->cfg.clock(a->cfg.clock_ud);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void gw__auth_refuse(gw_auth_result *r, int status, const char *type, const char *code, int retry, int64_t after_s,
                     const char *fmt, ...) {
    r->status = status;
    snprintf(r->type, sizeof r->type, "%s", type);
    snprintf(r->code, sizeof r->code, "%s", code);
    r->should_retry = retry;
    r->retry_after_s = after_s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
}

void gw__limit_admit(const gw_key *k, gw__kstate *s, int64_t now, const char *model, int64_t reserve, gw_auth_result *r) {
    int64_t minute = now / 60000, day = now / 86400000;
    if (s->minute != minute) s->minute = minute, s->req_m = 0, s->tok_m = 0;
    if (s->day != day) s->day = day, s->tok_d = 0, s->req_d = 0;
    int64_t reset_ms = (minute + 1) * 60000 - now, day_s = ((day + 1) * 86400000 - now + 999) / 1000;
    int64_t reset_s = (reset_ms + 999) / 1000;
    r->lim_req = k->rpm;
    r->rem_req = k->rpm ? (k->rpm > s->req_m ? k->rpm - s->req_m : 0) : 0;
    r->lim_tok = k->tpm;
    r->rem_tok = k->tpm ? (k->tpm > s->tok_m ? k->tpm - s->tok_m : 0) : 0;
    r->reset_req_ms = r->reset_tok_ms = reset_ms;
    memcpy(r->tenant, k->tenant, sizeof r->tenant);
    if (!k->enabled) {
        gw__auth_refuse(r, 401, "invalid_request_error", "invalid_api_key", 0, 0, "This API key has been revoked.");
        return;
    }
    if (!gw_key_allows(k, model)) {
        gw__auth_refuse(r, 403, "invalid_request_error", "model_not_allowed", 0, 0,
                        "This API key may not use the model `%.100s`.", model);
        return;
    }
    if (k->daily_tokens && s->tok_d + reserve > k->daily_tokens) {
        gw__auth_refuse(r, 429, "insufficient_quota", "insufficient_quota", 0, day_s,
                        "The daily token budget of this key (%lld) is spent or smaller than this request's reservation "
                        "(%lld tokens, %lld used today).",
                        (long long)k->daily_tokens, (long long)reserve, (long long)s->tok_d);
        return;
    }
    if (k->tpm && reserve > k->tpm) {
        gw__auth_refuse(r, 429, "tokens", "request_too_large", 0, 0,
                        "This request reserves %lld tokens, more than the key's %lld tokens per minute; lower max_tokens.",
                        (long long)reserve, (long long)k->tpm);
        return;
    }
    if (k->concurrency && s->inflight >= k->concurrency) {
        gw__auth_refuse(r, 429, "requests", "concurrency_limit_exceeded", 1, 1,
                        "This key has %lld requests in progress, its limit.", (long long)s->inflight);
        return;
    }
    if (k->rpm && s->req_m >= k->rpm) {
        gw__auth_refuse(r, 429, "requests", "rate_limit_exceeded", 1, reset_s,
                        "Rate limit reached: %lld requests per minute. Retry in %lld s.", (long long)k->rpm, (long long)reset_s);
        return;
    }
    if (k->tpm && s->tok_m + reserve > k->tpm) {
        gw__auth_refuse(r, 429, "tokens", "rate_limit_exceeded", 1, reset_s,
                        "Rate limit reached: %lld tokens per minute (%lld used, this request reserves %lld). Retry in %lld s.",
                        (long long)k->tpm, (long long)s->tok_m, (long long)reserve, (long long)reset_s);
        return;
    }
    s->req_m++;
    s->tok_m += reserve;
    memcpy(r->tenant, k->tenant, sizeof r->tenant);
    s->req_d++;
    s->tok_d += reserve;
    s->inflight++;
    r->status = 0;
    r->rem_req = k->rpm ? k->rpm - s->req_m : 0;
    r->rem_tok = k->tpm ? k->tpm - s->tok_m : 0;
    gw_auth_ticket *t = &r->ticket;
    memset(t, 0, sizeof *t);
    memcpy(t->id, k->id, sizeof t->id);
    memcpy(t->tenant, k->tenant, sizeof t->tenant);
    t->minute = minute;
    t->day = day;
    t->reserved = reserve;
    t->live = 1;
    t->weight = k->weight >= 1 && k->weight <= GW_WEIGHT_MAX ? (uint32_t)k->weight : 1;
}

void gw__limit_settle(gw__kstate *s, const gw_auth_ticket *t, int64_t now, int64_t used) {
    int64_t minute = now / 60000, day = now / 86400000, delta = used - t->reserved;
    if (s->inflight > 0) s->inflight--;
    /* the correction goes to the window that holds the reservation; once that window has passed,
     * only an overrun is charged (to the current window) */
    if (s->minute == t->minute) s->tok_m += delta;
    else if (delta > 0 && s->minute == minute) s->tok_m += delta;
    else if (delta > 0) s->minute = minute, s->req_m = 0, s->tok_m = delta;
    if (s->tok_m < 0) s->tok_m = 0;
    if (s->day == t->day) s->tok_d += delta;
    else if (delta > 0 && s->day == day) s->tok_d += delta;
    else if (delta > 0) s->day = day, s->req_d = 0, s->tok_d = delta;
    if (s->tok_d < 0) s->tok_d = 0;
}

/* ---- the in-process store ------------------------------------------------------------------- */

static int local_find(const gw_auth *a, const char *id) {
    for (int i = 0; i < a->n_keys; i++)
        if (strcmp(a->keys[i].id, id) == 0) return i;
    return -1;
}

static void usage_flush(gw_auth *a, int64_t now) {
    if (!a->cfg.keys_file || !a->usage_dirty) return;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s.usage", a->cfg.keys_file);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        CM_LOG_WARN("auth", "cannot write the usage file", "path=%s err=%s", tmp, strerror(errno));
        a->usage_flushed = now;
        return;
    }
    fprintf(f, "# key-id utc-day tokens requests (written by arka serve)\n");
    for (int i = 0; i < a->n_keys; i++)
        if (a->state[i].day)
            fprintf(f, "%s %lld %lld %lld\n", a->keys[i].id, (long long)a->state[i].day, (long long)a->state[i].tok_d,
                    (long long)a->state[i].req_d);
    int ok = fflush(f) == 0;
    fclose(f);
    if (ok && rename(tmp, path) == 0) a->usage_dirty = 0;
    else unlink(tmp);
    a->usage_flushed = now;
}

/* (Re)reads the keys file, keeping the counters of keys that stay. */
static int local_load(gw_auth *a, char *err, size_t errlen) {
    gw_key *keys;
    int n;
    int rc = gw_keyfile_load(a->cfg.keys_file, &keys, &n, err, errlen);
    if (rc) return rc;
    gw__kstate *st = calloc((size_t)(n ? n : 1), sizeof *st);
    if (!st) {
        free(keys);
        return CM_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        int j = local_find(a, keys[i].id);
        if (j >= 0) st[i] = a->state[j];
    }
    if (!a->keys) { /* first load: daily usage from the last run */
        gw_key_usage *u;
        int nu;
        int64_t today = gw__auth_now(a) / 86400000;
        if (gw_usage_load(a->cfg.keys_file, &u, &nu) == 0) {
            for (int k = 0; k < nu; k++)
                for (int i = 0; i < n; i++)
                    if (u[k].day == today && strcmp(u[k].id, keys[i].id) == 0)
                        st[i].day = today, st[i].tok_d = u[k].tokens, st[i].req_d = u[k].requests;
            free(u);
        }
    }
    free(a->keys);
    free(a->state);
    a->keys = keys;
    a->state = st;
    a->n_keys = n;
    return 0;
}

static void local_maybe_reload(gw_auth *a, int64_t now) {
    if (now - a->checked < (int64_t)a->cfg.reload_ms) return;
    a->checked = now;
    struct stat st;
    if (stat(a->cfg.keys_file, &st) != 0) memset(&st, 0, sizeof st);
    if (st.st_ino == a->f_ino && st.st_size == a->f_size && st.st_mtim.tv_sec == a->f_mtime.tv_sec &&
        st.st_mtim.tv_nsec == a->f_mtime.tv_nsec)
        return;
    char err[512];
    if (local_load(a, err, sizeof err)) {
        CM_LOG_WARN("auth", "keys file not reloaded; keeping the previous keys", "err=%s", err);
        return;
    }
    a->f_ino = st.st_ino, a->f_size = st.st_size, a->f_mtime = st.st_mtim;
    CM_LOG_INFO("auth", "keys file reloaded", "path=%s keys=%d", a->cfg.keys_file, a->n_keys);
}

int gw__local_lookup(gw_auth *a, const char *bearer, const gw_key **k, gw__kstate **s) {
    *k = NULL;
    *s = NULL;
    if (!bearer || !gw_key_well_formed(bearer, strlen(bearer))) return -1;
    uint8_t h[32];
    gw_key_hash(a->secret, a->secret_len, bearer, strlen(bearer), h, NULL);
    int found = -1;
    for (int i = 0; i < a->n_keys; i++) /* no early exit: the time does not depend on which key matched */
        if (CRYPTO_memcmp(h, a->keys[i].hash, 32) == 0) found = i;
    if (found < 0) return -1;
    *k = &a->keys[found];
    *s = &a->state[found];
    return found;
}

void gw__refuse_key(gw_auth_result *r) {
    gw__auth_refuse(r, 401, "invalid_request_error", "invalid_api_key", 0, 0,
                    "Incorrect API key provided. Pass a valid key as 'Authorization: Bearer ak-...'.");
}

void gw__local_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_result *r) {
    int64_t now = gw__auth_now(a);
    if (a->cfg.keys_file) local_maybe_reload(a, now);
    if (a->usage_dirty && now - a->usage_flushed >= 1000) usage_flush(a, now);
    const gw_key *k;
    gw__kstate *s;
    if (gw__local_lookup(a, bearer, &k, &s) < 0) {
        gw__refuse_key(r);
        return;
    }
    gw__limit_admit(k, s, now, model, reserve, r);
}

void gw__local_settle(gw_auth *a, const gw_auth_ticket *t, int64_t used) {
    int64_t now = gw__auth_now(a);
    int i = local_find(a, t->id);
    if (i < 0) return; /* the key was removed from the file meanwhile */
    gw__limit_settle(&a->state[i], t, now, used);
    a->usage_dirty = 1;
    if (now - a->usage_flushed >= 1000) usage_flush(a, now);
}

/* ---- gw_auth -------------------------------------------------------------------------------- */

static gw_auth_tenant_stats *tenant_slot(gw_auth *a, const char *tenant);

void gw_auth_cfg_default(gw_auth_cfg *c) {
    memset(c, 0, sizeof *c);
    c->reserve_default = 1024;
    c->reload_ms = 1000;
}

int gw_auth_create(uv_loop_t *loop, const gw_auth_cfg *c, gw_auth **out) {
    *out = NULL;
    if (!c || !c->secret || c->secret_len == 0 || c->secret_len > sizeof ((gw_auth *)0)->secret) return CM_EINVAL;
    gw_auth *a = calloc(1, sizeof *a);
    if (!a) return CM_ENOMEM;
    a->cfg = *c;
    a->loop = loop;
    memcpy(a->secret, c->secret, c->secret_len);
    a->secret_len = c->secret_len;
    a->cfg.secret = NULL;
    if (c->keys_file && !(a->cfg.keys_file = a->keys_path = strdup(c->keys_file))) {
        free(a);
        return CM_ENOMEM;
    }
    a->cfg.redis_url = NULL;
    int rc = 0;
    char err[512] = "";
    if (a->cfg.keys_file) {
        struct stat st;
        if (stat(a->cfg.keys_file, &st) == 0) a->f_ino = st.st_ino, a->f_size = st.st_size, a->f_mtime = st.st_mtim;
        rc = local_load(a, err, sizeof err);
        a->checked = gw__auth_now(a);
        if (rc) CM_LOG_ERROR("auth", "cannot load the keys file", "err=%s", err);
    }
    if (!rc && c->redis_url) rc = gw__redis_open(a, c->redis_url);
    if (rc) {
        gw_auth_destroy(a);
        return rc;
    }
    *out = a;
    return 0;
}

void gw_auth_shutdown(gw_auth *a) {
    if (a && a->redis) gw__redis_shutdown(a);
}

void gw_auth_destroy(gw_auth *a) {
    if (!a) return;
    gw__redis_close(a);
    usage_flush(a, gw__auth_now(a));
    OPENSSL_cleanse(a->secret, sizeof a->secret);
    free(a->keys);
    free(a->state);
    free(a->keys_path);
    for (int i = 0; i < a->n_tenants; i++) free((char *)a->tenants[i].tenant);
    free(a->tenants);
    free(a);
}

int64_t gw_auth_reserve(const gw_auth *a, size_t body_len, int max_tokens, int n) {
    if (n < 1) n = 1;
    return (int64_t)(body_len / 2) + (int64_t)n * (max_tokens > 0 ? max_tokens : a->cfg.reserve_default);
}

void gw_auth_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_cb cb, void *ud) {
    if (a->redis) {
        gw__redis_admit(a, bearer, model, reserve, cb, ud);
        return;
    }
    gw_auth_result r;
    memset(&r, 0, sizeof r);
    gw__local_admit(a, bearer, model, reserve, &r);
    gw__auth_count(a, &r);
    cb(ud, &r);
}

void gw_auth_identify(gw_auth *a, const char *bearer, gw_auth_cb cb, void *ud) {
    if (a->redis) {
        gw__redis_identify(a, bearer, cb, ud);
        return;
    }
    gw_auth_result r;
    memset(&r, 0, sizeof r);
    int64_t now = gw__auth_now(a);
    if (a->cfg.keys_file) local_maybe_reload(a, now);
    const gw_key *k;
    gw__kstate *st;
    if (gw__local_lookup(a, bearer, &k, &st) < 0) gw__refuse_key(&r);
    else if (!k->enabled) gw__auth_refuse(&r, 401, "invalid_request_error", "invalid_api_key", 0, 0, "This API key has been revoked.");
    else memcpy(r.tenant, k->tenant, sizeof r.tenant);
    cb(ud, &r);
}

void gw_auth_settle(gw_auth *a, gw_auth_ticket *t, int64_t used) {
    if (!t || !t->live) return;
    t->live = 0;
    if (used < 0) used = 0;
    a->stats.settles++;
    gw_auth_tenant_stats *ts = tenant_slot(a, t->tenant);
    if (ts) ts->tokens += (uint64_t)used;
    if (a->redis) gw__redis_settle(a, t, used);
    else gw__local_settle(a, t, used);
}

void gw_auth_stats_get(const gw_auth *a, gw_auth_stats *st) { *st = a->stats; }

static gw_auth_tenant_stats *tenant_slot(gw_auth *a, const char *tenant) {
    if (!tenant || !tenant[0]) return NULL;
    for (int i = 0; i < a->n_tenants; i++)
        if (strcmp(a->tenants[i].tenant, tenant) == 0) return &a->tenants[i];
    if (a->n_tenants >= GW_AUTH_TENANTS_MAX - 1) { /* the last slot is "_other" */
        tenant = "_other";
        for (int i = 0; i < a->n_tenants; i++)
            if (strcmp(a->tenants[i].tenant, tenant) == 0) return &a->tenants[i];
    }
    if (a->n_tenants % 16 == 0) {
        gw_auth_tenant_stats *nt = realloc(a->tenants, (size_t)(a->n_tenants + 16) * sizeof *nt);
        if (!nt) return NULL;
        a->tenants = nt;
    }
    char *name = strdup(tenant);
    if (!name) return NULL;
    gw_auth_tenant_stats *t = &a->tenants[a->n_tenants++];
    memset(t, 0, sizeof *t);
    t->tenant = name;
    return t;
}

void gw__auth_count(gw_auth *a, const gw_auth_result *r) {
    if (r->status) a->stats.refused++;
    else a->stats.admitted++;
    gw_auth_tenant_stats *t = tenant_slot(a, r->tenant);
    if (!t) return;
    if (r->status) t->refused++;
    else t->admitted++;
}

void gw_auth_tenants(const gw_auth *a, void (*fn)(void *ud, const gw_auth_tenant_stats *t), void *ud) {
    for (int i = 0; i < a->n_tenants; i++) fn(ud, &a->tenants[i]);
}

int gw_auth_key_state(gw_auth *a, const char *id, int64_t *req_minute, int64_t *tok_minute, int64_t *inflight,
                      int64_t *tok_day) {
    int i = local_find(a, id);
    if (i < 0) return CM_ENOTFOUND;
    int64_t now = gw__auth_now(a);
    gw__kstate *s = &a->state[i];
    int cur_m = s->minute == now / 60000, cur_d = s->day == now / 86400000;
    if (req_minute) *req_minute = cur_m ? s->req_m : 0;
    if (tok_minute) *tok_minute = cur_m ? s->tok_m : 0;
    if (inflight) *inflight = s->inflight;
    if (tok_day) *tok_day = cur_d ? s->tok_d : 0;
    return 0;
}
