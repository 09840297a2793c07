/* arka pull URL [-o DIR] [--sha256 HEX] [--progress]: download a model file (model/pull.h). */
#include "cli.h"
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "model/pull.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cli_pull(int argc, char **argv) {
    const char *dir = NULL, *sha = NULL;
    int progress = 0;
    cm_opt opts[] = {
        { "output-dir", 'o', CM_OPT_STR, &dir, "directory to save into (default ${ARKA_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/arka}/models)" },
        { "sha256", 0, CM_OPT_STR, &sha, "expected SHA-256 (64 hex digits); the file is kept only if it matches" },
        { "progress", 0, CM_OPT_BOOL, &progress, "show a progress line even when stderr is not a terminal" },
        { 0 },
    };
    char err[1024];
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
        if (mdl_pull_default_dir(defdir, sizeof defdir)) {
            fprintf(stderr, "arka pull: no download directory: set -o DIR, ARKA_CACHE_DIR or HOME\n");
            return 2;
        }
        dir = defdir;
    }
    mdl_pull_opts o = { .url = pos[0], .dir = dir, .sha256 = sha && *sha ? sha : NULL,
                        .progress = progress || isatty(2) };
    mdl_pull_result r;
    rc = mdl_pull(&o, &r, err, sizeof err);
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
