/* cm_config: one option table, three sources with the same names.
 *
 * A command declares its options once (name, kind, destination, help). Values are applied in
 * this order, later wins: the defaults already in the destinations, the config file
 * (`name = value` lines, `#` comments; see config/arka.conf), environment variables
 * (`ARKA_` + name upper-cased with '-' → '_', e.g. kv-cache-mb → ARKA_KV_CACHE_MB), and
 * command-line flags (`--name value`, `--name=value`, or a bare `--name` for booleans).
 * Single-letter aliases (`-m`) are allowed on the command line.
 *
 * Options the config file names that another command takes are ignored (the file is shared by
 * all subcommands); a name no command takes is an error naming the file and line, and so are
 * unknown command-line flags.
 *
 * Every table also takes `log-level` (debug | info | warn | error | off) from all three sources
 * without declaring it: a value sets the cm_log threshold (cm_log_set_level) as it is parsed,
 * and cm_config_usage lists it. A table that declares `log-level` itself receives it instead.
 *
 *   int n = 128; const char *model = NULL;
 *   cm_opt opts[] = {
 *       { "model", 'm', CM_OPT_STR, &model, "model file (GGUF or safetensors dir)" },
 *       { "n-predict", 'n', CM_OPT_INT, &n, "tokens to generate" },
 *       { 0 } };
 *   char err[256]; int npos; char **pos;
 *   if (cm_config_parse(opts, argc, argv, &npos, &pos, err, sizeof err)) { fprintf(stderr, "%s\n", err); }
 *
 * Called from main threads at start-up only. Strings stored into CM_OPT_STR destinations point
 * into argv, the environment, or storage owned by the module until process exit.
 */
#ifndef CM_CONFIG_H
#define CM_CONFIG_H

#include <stddef.h>
#include <stdint.h>

enum cm_opt_kind { CM_OPT_END = 0, CM_OPT_STR, CM_OPT_INT, CM_OPT_I64, CM_OPT_F64, CM_OPT_F32, CM_OPT_BOOL };

typedef struct cm_opt {
    const char *name;  /* long name, also the config-file key and env suffix */
    char        alias; /* single-letter CLI alias or 0 */
    int         kind;  /* enum cm_opt_kind; CM_OPT_END terminates the table */
    void       *dst;   /* const char ** | int * | int64_t * | double * | float * | int * (bool) */
    const char *help;
    int         seen;  /* out: set to 1 when any source gave a value */
} cm_opt;

/* Parses argv (argv[0] is the subcommand name and is skipped). The config file is taken from
 * `--config PATH` or env ARKA_CONFIG; with neither, no file is read. Non-option arguments are
 * returned in *pos (array owned by the module, valid until exit). On error returns CM_EINVAL
 * and writes one line into err. `--help` returns CM_EINVAL with err = "help". */
int cm_config_parse(cm_opt *opts, int argc, char **argv, int *npos, char ***pos, char *err, size_t errlen);

/* Applies one `name = value` assignment (used by the file parser and tests); `log-level` is
 * accepted as above. */
int cm_config_set(cm_opt *opts, const char *name, const char *value, char *err, size_t errlen);

/* Writes "  --name, -m KIND  help" lines for the table, then the built-in --log-level and
 * --config lines, to f (a FILE *). */
void cm_config_usage(const cm_opt *opts, void *f);

#endif
