/* arka keys: create, list, revoke API keys and show their usage (gateway/auth.h). Built only with
 * the gateway; elsewhere the command is absent from `arka --help`. */
#ifdef ARKA_WITH_GATEWAY
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "gateway/auth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f, const cm_opt *opts) {
    fprintf(f, "usage: arka keys create --tenant T [--rpm N] [--tpm N] [--concurrency N] [--daily-tokens N] [--weight W] [--models a,b] STORE\n"
               "       arka keys list STORE\n"
               "       arka keys revoke ID|KEY STORE\n"
               "       arka keys usage STORE\n"
               "STORE: --keys-file F (the in-process store's file), or --redis redis://HOST:PORT[/DB] with\n"
               "--auth-secret S (the secret every gateway sharing that Redis is started with)\n"
               "\n"
               "create prints the new key once; only its HMAC-SHA256 is stored. 0 means unlimited for\n"
               "--rpm, --tpm, --concurrency and --daily-tokens. The secret comes from --auth-secret\n"
               "(ARKA_AUTH_SECRET) or the file F.secret (created 0600 on first use). A running server\n"
               "picks up changes to the keys file within a second. --weight sets the key's share when\n"
               "tenants compete for an executor (fair share: a tenant of weight 2 gets twice the share of\n"
               "one of weight 1; a tenant's weight is that of the key its latest request came with).\n\n");
    cm_config_usage(opts, f);
}

static const char *day_str(int64_t unix_s, char *buf, size_t cap) {
    time_t t = (time_t)unix_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

static const char *lim(int64_t v, char *buf, size_t cap) {
    if (v) snprintf(buf, cap, "%lld", (long long)v);
    else snprintf(buf, cap, "-");
    return buf;
}

static int cmd_create(const char *file, const char *redis, const char *secret_opt, const char *tenant, const char *models, int64_t rpm,
                      int64_t tpm, int64_t conc, int64_t daily, int64_t weight) {
    if (!gw_tenant_valid(tenant)) {
        fprintf(stderr, "arka keys: --tenant '%s': expected 1..63 of [A-Za-z0-9._-]\n", tenant ? tenant : "");
        return 2;
    }
    if (rpm < 0 || tpm < 0 || conc < 0 || daily < 0) {
        fprintf(stderr, "arka keys: limits must not be negative (0 = unlimited)\n");
        return 2;
    }
    if (weight < 1 || weight > GW_WEIGHT_MAX) {
        fprintf(stderr, "arka keys: --weight %lld: expected 1..%d\n", (long long)weight, GW_WEIGHT_MAX);
        return 2;
    }
    gw_key k;
    memset(&k, 0, sizeof k);
    snprintf(k.tenant, sizeof k.tenant, "%s", tenant);
    if (!models || !*models) models = "*";
    if (strlen(models) >= sizeof k.models || strpbrk(models, " \t\"\\=")) {
        fprintf(stderr, "arka keys: --models '%s': expected * or a comma-separated list of model ids\n", models);
        return 2;
    }
    snprintf(k.models, sizeof k.models, "%s", models);
    k.rpm = rpm, k.tpm = tpm, k.concurrency = conc, k.daily_tokens = daily, k.weight = weight, k.enabled = 1;
    k.created = (int64_t)time(NULL);
    uint8_t secret[256];
    size_t slen;
    char err[512];
    if (gw_auth_secret_load(secret_opt, file, !redis, secret, sizeof secret, &slen, err, sizeof err)) {
        fprintf(stderr, "arka keys: %s\n", err);
        return 1;
    }
    char key[GW_KEY_BUF];
    if (gw_key_generate(key)) {
        fprintf(stderr, "arka keys: no random bytes (getrandom failed)\n");
        return 1;
    }
    gw_key_hash(secret, slen, key, strlen(key), k.hash, k.id);
    int rc = redis ? gw_redis_key_put(redis, &k, err, sizeof err) : gw_keyfile_append(file, &k);
    if (rc) {
        if (redis) fprintf(stderr, "arka keys: %s\n", err);
        else fprintf(stderr, "arka keys: cannot write %s: %s\n", file, cm_err_str(rc));
        return 1;
    }
    printf("%s\n", key);
    fprintf(stderr, "arka keys: created key %s for tenant %s in %s (the key is shown only this once)\n", k.id, k.tenant,
            redis ? redis : file);
    return 0;
}

static int cmd_list(const char *file, const char *redis) {
    gw_key *ks;
    int n;
    char err[512], a[32], b[32], c[32], d[32], t[32];
    if (redis ? gw_redis_keys_list(redis, &ks, &n, NULL, err, sizeof err) : gw_keyfile_load(file, &ks, &n, err, sizeof err)) {
        fprintf(stderr, "arka keys: %s\n", err);
        return 1;
    }
    printf("%-12s  %-20s  %-7s  %8s  %10s  %5s  %12s  %6s  %-20s  %s\n", "id", "tenant", "enabled", "rpm", "tpm", "conc",
           "daily-tokens", "weight", "created", "models");
    for (int i = 0; i < n; i++)
        printf("%-12s  %-20s  %-7s  %8s  %10s  %5s  %12s  %6lld  %-20s  %s\n", ks[i].id, ks[i].tenant,
               ks[i].enabled ? "yes" : "revoked", lim(ks[i].rpm, a, sizeof a), lim(ks[i].tpm, b, sizeof b),
               lim(ks[i].concurrency, c, sizeof c), lim(ks[i].daily_tokens, d, sizeof d),
               (long long)(ks[i].weight ? ks[i].weight : 1), day_str(ks[i].created, t, sizeof t), ks[i].models);
    free(ks);
    return 0;
}

static int cmd_revoke(const char *file, const char *redis, const char *secret_opt, const char *what) {
    char id[65];
    if (gw_key_well_formed(what, strlen(what))) { /* the key itself: find it by its hash */
        uint8_t secret[256], h[32];
        size_t slen;
        char err[512];
        if (gw_auth_secret_load(secret_opt, file, 0, secret, sizeof secret, &slen, err, sizeof err)) {
            fprintf(stderr, "arka keys: %s\n", err);
            return 1;
        }
        gw_key_hash(secret, slen, what, strlen(what), h, id);
    } else {
        size_t l = strlen(what);
        if (l < GW_KEY_ID_BUF - 1 || l > 64 || strspn(what, "0123456789abcdef") != l) {
            fprintf(stderr, "arka keys: revoke: expected a key id (12 hex digits, see `arka keys list`) or the key\n");
            return 2;
        }
        snprintf(id, sizeof id, "%s", what);
    }
    char err[512];
    int rc = redis ? gw_redis_key_set_enabled(redis, id, 0, err, sizeof err) : gw_keyfile_set_enabled(file, id, 0);
    if (rc == CM_ENOTFOUND) {
        fprintf(stderr, "arka keys: no key %s in %s\n", id, redis ? redis : file);
        return 1;
    }
    if (rc && redis) {
        fprintf(stderr, "arka keys: %s\n", err);
        return 1;
    }
    if (rc) {
        fprintf(stderr, "arka keys: cannot rewrite %s: %s\n", file, cm_err_str(rc));
        return 1;
    }
    fprintf(stderr, "arka keys: revoked %s\n", id);
    return 0;
}

static int cmd_usage(const char *file, const char *redis) {
    gw_key *ks;
    gw_key_usage *u;
    int n, nu;
    char err[512], b[32];
    if (redis) {
        if (gw_redis_keys_list(redis, &ks, &n, &u, err, sizeof err)) {
            fprintf(stderr, "arka keys: %s\n", err);
            return 1;
        }
        nu = n;
    } else if (gw_keyfile_load(file, &ks, &n, err, sizeof err)) {
        fprintf(stderr, "arka keys: %s\n", err);
        return 1;
    } else if (gw_usage_load(file, &u, &nu)) {
        fprintf(stderr, "arka keys: cannot read %s.usage\n", file);
        free(ks);
        return 1;
    }
    int64_t today = (int64_t)time(NULL) / 86400;
    printf("%-12s  %-20s  %12s  %10s  %12s\n", "id", "tenant", "tokens-today", "requests", "daily-tokens");
    for (int i = 0; i < n; i++) {
        int64_t tok = 0, req = 0;
        for (int j = 0; j < nu; j++)
            if (u[j].day == today && strcmp(u[j].id, ks[i].id) == 0) tok = u[j].tokens, req = u[j].requests;
        printf("%-12s  %-20s  %12lld  %10lld  %12s\n", ks[i].id, ks[i].tenant, (long long)tok, (long long)req,
               lim(ks[i].daily_tokens, b, sizeof b));
    }
    free(ks);
    free(u);
    return 0;
}

int cli_keys(int argc, char **argv) {
    const char *file = NULL, *redis = NULL, *secret = NULL, *tenant = NULL, *models = "*";
    int64_t rpm = 60, tpm = 100000, conc = 8, daily = 0, weight = 1;
    cm_opt opts[] = {
        { "keys-file", 0, CM_OPT_STR, &file, "the keys file (one key per line, hashes only; see config/keys.conf)" },
        { "redis", 0, CM_OPT_STR, &redis, "redis://HOST:PORT[/DB]: keys in Redis (shared by gateways) instead of a file" },
        { "auth-secret", 0, CM_OPT_STR, &secret, "HMAC secret (default: the file KEYS_FILE.secret, created 0600)" },
        { "tenant", 0, CM_OPT_STR, &tenant, "create: tenant name" },
        { "models", 0, CM_OPT_STR, &models, "create: models the key may use, comma-separated (default * = all)" },
        { "rpm", 0, CM_OPT_I64, &rpm, "create: requests per minute (default 60; 0 = unlimited)" },
        { "tpm", 0, CM_OPT_I64, &tpm, "create: tokens per minute (default 100000; 0 = unlimited)" },
        { "concurrency", 0, CM_OPT_I64, &conc, "create: requests in flight (default 8; 0 = unlimited)" },
        { "daily-tokens", 0, CM_OPT_I64, &daily, "create: tokens per UTC day (default 0 = no budget)" },
        { "weight", 0, CM_OPT_I64, &weight, "create: fair-share weight between tenants, 1..1000 (default 1)" },
        { 0 },
    };
    char err[512];
    int npos;
    char **pos;
    if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err)) {
        int help = strcmp(err, "help") == 0;
        if (!help) fprintf(stderr, "arka keys: %s\n", err);
        usage(help ? stdout : stderr, opts);
        return help ? 0 : 2;
    }
    if (npos < 1) {
        usage(stderr, opts);
        return 2;
    }
    const char *cmd = pos[0];
    if (redis && !*redis) redis = NULL;
    if (file && !*file) file = NULL;
    if (!file && !redis) {
        fprintf(stderr, "arka keys: no key store: give --keys-file F or --redis URL (or ARKA_KEYS_FILE / ARKA_REDIS, or the config)\n");
        return 2;
    }
    if (file && redis) {
        fprintf(stderr, "arka keys: --keys-file and --redis name two stores; give one\n");
        return 2;
    }
    int want = !strcmp(cmd, "revoke") ? 2 : 1;
    if (npos != want) {
        fprintf(stderr, "arka keys %s: %s\n", cmd, npos < want ? "which key? give its id" : "unexpected argument");
        return 2;
    }
    if (!strcmp(cmd, "create")) return cmd_create(file, redis, secret, tenant, models, rpm, tpm, conc, daily, weight);
    if (!strcmp(cmd, "list")) return cmd_list(file, redis);
    if (!strcmp(cmd, "revoke")) return cmd_revoke(file, redis, secret, pos[1]);
    if (!strcmp(cmd, "usage")) return cmd_usage(file, redis);
    fprintf(stderr, "arka keys: unknown subcommand '%s' (create, list, revoke, usage)\n", cmd);
    return 2;
}
#endif
