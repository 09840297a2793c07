/* cm_config: defaults < file < env < CLI, one table of names. */
#include "cm_config.h"
#include "cm_err.h"
#include "cm_log.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cm_opt *find(cm_opt *opts, const char *name, size_t len) {
    for (cm_opt *o = opts; o->kind != CM_OPT_END; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
    return NULL;
}

/* `log-level` belongs to every command: a table that does not declare it still takes it from
 * each source, and a value sets the process's log threshold at once (sources arrive in
 * precedence order, so the last one wins). A table that declares its own `log-level` gets the
 * value like any other option instead. Never written: set_value() handles it before `seen`. */
static cm_opt log_level_opt = { "log-level", 0, CM_OPT_STR, NULL, "debug | info | warn | error | off (default info)", 0 };

static int declares_log_level(cm_opt *opts) { return find(opts, log_level_opt.name, strlen(log_level_opt.name)) != NULL; }

/* The table's option of that name, else the built-in log-level, else NULL. */
static cm_opt *lookup(cm_opt *opts, const char *name, size_t len) {
    cm_opt *o = find(opts, name, len);
    if (!o && strlen(log_level_opt.name) == len && strncmp(log_level_opt.name, name, len) == 0) o = &log_level_opt;
    return o;
}

static cm_opt *find_alias(cm_opt *opts, char c) {
    for (cm_opt *o = opts; o->kind != CM_OPT_END; o++)
        if (o->alias == c) return o;
    return NULL;
}

/* Keeps strings from the config file alive until exit (bounded by the files' sizes): option
 * destinations point at them. They hang off one chain so they stay reachable (a leak checker
 * sees process-lifetime config, not a leak). Parsing runs on the main thread only. */
struct kept {
    struct kept *next;
    char s[];
};
static struct kept *kept_chain;

static char *keep(const char *s) {
    size_t n = strlen(s) + 1;
    struct kept *k = malloc(sizeof *k + n);
    if (!k) return NULL;
    memcpy(k->s, s, n);
    k->next = kept_chain;
    kept_chain = k;
    return k->s;
}

static int set_value(cm_opt *o, const char *v, char *err, size_t errlen) {
    char *end = NULL;
    errno = 0;
    if (o == &log_level_opt) {
        int lvl;
        if (cm_log_parse_level(v, &lvl)) {
            snprintf(err, errlen, "invalid value '%s' for option 'log-level' (debug | info | warn | error | off)", v);
            return CM_EINVAL;
        }
        cm_log_set_level(lvl);
        return 0;
    }
    switch (o->kind) {
    case CM_OPT_STR:
        *(const char **)o->dst = v;
        break;
    case CM_OPT_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < -2147483647L - 1 || x > 2147483647L) goto bad;
        *(int *)o->dst = (int)x;
        break;
    }
    case CM_OPT_I64: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end) goto bad;
        *(int64_t *)o->dst = (int64_t)x;
        break;
    }
    case CM_OPT_F64:
    case CM_OPT_F32: {
        double x = strtod(v, &end);
        if (errno || end == v || *end) goto bad;
        if (o->kind == CM_OPT_F64) *(double *)o->dst = x;
        else *(float *)o->dst = (float)x;
        break;
    }
    case CM_OPT_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on")) *(int *)o->dst = 1;
        else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off")) *(int *)o->dst = 0;
        else goto bad;
        break;
    default:
        goto bad;
    }
    o->seen = 1;
    return 0;
bad:
    snprintf(err, errlen, "invalid value '%s' for option '%s'", v, o->name);
    return CM_EINVAL;
}

int cm_config_set(cm_opt *opts, const char *name, const char *value, char *err, size_t errlen) {
    cm_opt *o = lookup(opts, name, strlen(name));
    if (!o) {
        snprintf(err, errlen, "unknown option '%s'", name);
        return CM_ENOTFOUND;
    }
    return set_value(o, value, err, errlen);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

/* Every option some arka command takes: a config-file name that is none of them is a typo,
 * refused with the file and line (the file is shared, so a name another command takes is fine).
 * tests/integration/test_config.sh checks this list against every command's --help. */
static const char *const all_names[] = {
    "api-key", "api-key-b", "auth-secret", "b-interval", "b-requests", "backend", "batch", "bw-gbs",
    "chat-template", "chunks", "concurrency", "cors-origin", "ctx", "cuda-fault-at-step",
    "cuda-graph-budget-s", "cuda-graph-timing", "cuda-plan", "cuda-profile", "daily-tokens", "decode",
    "device", "devices", "drain-timeout", "file", "first", "frequency-penalty", "gen",
    "gpu-memory-fraction", "host", "ids", "json", "keys-file", "kl-divergence-base", "kv-block-size",
    "kv-cache-dtype", "kv-cache-mb", "log-level", "max-batch", "max-batch-tokens", "max-buffered-mb",
    "max-conns", "max-conns-per-ip", "max-requests", "max-resumes", "max-tokens", "max-waiting",
    "min-p", "model", "models", "n-predict", "no-auth", "no-bos", "no-prefix-cache", "output-dir",
    "parse-special", "port", "prefix-len", "presence-penalty", "progress", "prompt", "prompt-ids",
    "prompt-len", "quantize", "rate", "reasoning-parser", "redis", "redis-fail-closed", "repeat-last-n",
    "repeat-penalty", "reps", "requests", "response-format", "resume-timeout", "rpm", "save-logits",
    "seed", "served-model-name", "sha256", "shm", "split", "task", "temp", "tenant", "threads",
    "timeout", "tool-parser", "top-k", "top-p", "tpm", "turns", "type", "url", "users", "verbose",
    "vocab", "vocab-size", "warmup", "weight", "workload",
};

static int known_anywhere(const char *name) {
    for (size_t i = 0; i < sizeof all_names / sizeof *all_names; i++)
        if (strcmp(all_names[i], name) == 0) return 1;
    return 0;
}

static int load_file(cm_opt *opts, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open config file: %s", path, strerror(errno));
        return CM_ENOENT;
    }
    char line[4096];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, errlen, "%s:%d: line too long", path, lineno);
            rc = CM_EFORMAT;
            break;
        }
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *s = trim(line);
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected 'name = value'", path, lineno);
            rc = CM_EFORMAT;
            break;
        }
        *eq = 0;
        char *name = trim(s), *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = 0;
            val++;
        }
        cm_opt *o = lookup(opts, name, strlen(name));
        if (!o && !known_anywhere(name)) {
            snprintf(err, errlen, "%s:%d: unknown option '%s' (no arka command takes it; see `arka <command> --help`)", path,
                     lineno, name);
            rc = CM_EINVAL;
            break;
        }
        if (!o) continue; /* another command's: the file is shared by every subcommand */
        char e2[256];
        if (set_value(o, o->kind == CM_OPT_STR ? keep(val) : val, e2, sizeof e2)) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, e2);
            rc = CM_EINVAL;
            break;
        }
    }
    fclose(f);
    return rc;
}

static int load_env_one(cm_opt *o, char *err, size_t errlen) {
    char key[128] = "ARKA_";
    size_t n = 5;
    for (const char *p = o->name; *p && n < sizeof key - 1; p++)
        key[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    key[n] = 0;
    const char *v = getenv(key);
    if (v && set_value(o, v, err, errlen)) {
        size_t l = strlen(err);
        snprintf(err + l, errlen - l, " (from env %s)", key);
        return CM_EINVAL;
    }
    return 0;
}

static int load_env(cm_opt *opts, char *err, size_t errlen) {
    for (cm_opt *o = opts; o->kind != CM_OPT_END; o++)
        if (load_env_one(o, err, errlen)) return CM_EINVAL;
    if (!declares_log_level(opts)) return load_env_one(&log_level_opt, err, errlen);
    return 0;
}

int cm_config_parse(cm_opt *opts, int argc, char **argv, int *npos, char ***pos, char *err, size_t errlen) {
    static char **positional;
    free(positional);
    positional = calloc((size_t)argc + 1, sizeof *positional);
    if (!positional) return CM_ENOMEM;
    *npos = 0;
    *pos = positional;

    /* The config file comes first so env and CLI override it. */
    const char *cfg = getenv("ARKA_CONFIG");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9)) cfg = argv[i] + 9;
    }
    if (cfg && *cfg) {
        int rc = load_file(opts, cfg, err, errlen);
        if (rc) return rc;
    }
    int rc = load_env(opts, err, errlen);
    if (rc) return rc;

    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == 0) {
            positional[(*npos)++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            snprintf(err, errlen, "help");
            return CM_EINVAL;
        }
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--config=", 9)) continue;
        cm_opt *o;
        const char *val = NULL;
        if (a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            o = lookup(opts, name, len);
            if (!o && !eq && len > 3 && !strncmp(name, "no-", 3)) {
                cm_opt *b = find(opts, name + 3, len - 3);
                if (b && b->kind == CM_OPT_BOOL) {
                    *(int *)b->dst = 0;
                    b->seen = 1;
                    continue;
                }
            }
            if (!o) {
                snprintf(err, errlen, "unknown option '--%.*s'", (int)len, name);
                return CM_EINVAL;
            }
            if (eq) val = eq + 1;
        } else {
            if (a[2] != 0) {
                snprintf(err, errlen, "unknown option '%s'", a);
                return CM_EINVAL;
            }
            o = find_alias(opts, a[1]);
            if (!o) {
                snprintf(err, errlen, "unknown option '%s'", a);
                return CM_EINVAL;
            }
        }
        if (!val) {
            if (o->kind == CM_OPT_BOOL) val = "1";
            else if (i + 1 < argc) val = argv[++i];
            else {
                snprintf(err, errlen, "option '--%s' needs a value", o->name);
                return CM_EINVAL;
            }
        }
        rc = set_value(o, val, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

static void usage_line(const cm_opt *o, FILE *f) {
    static const char *const kinds[] = { "", "STR", "INT", "INT", "NUM", "NUM", "" };
    char head[96];
    if (o->alias) snprintf(head, sizeof head, "-%c, --%s %s", o->alias, o->name, kinds[o->kind]);
    else snprintf(head, sizeof head, "    --%s %s", o->name, kinds[o->kind]);
    fprintf(f, "  %-34s %s\n", head, o->help ? o->help : "");
}

void cm_config_usage(const cm_opt *opts, void *fp) {
    FILE *f = fp;
    for (const cm_opt *o = opts; o->kind != CM_OPT_END; o++) usage_line(o, f);
    if (!declares_log_level((cm_opt *)opts)) usage_line(&log_level_opt, f);
    fprintf(f, "  %-34s %s\n", "    --config FILE", "config file of name = value lines (also ARKA_CONFIG)");
}
