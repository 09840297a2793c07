/* cli: the `arka` subcommands. Each returns the process exit code (0 ok, 1 runtime error,
 * 2 usage error). main.c only dispatches. A command whose module is not built into this
 * binary (the gateway on a GPU-only host, say) is a weak symbol left NULL. */
#ifndef ARKA_CLI_H
#define ARKA_CLI_H

#define CLI_CMD(name) int name(int argc, char **argv) __attribute__((weak))

CLI_CMD(cli_inspect);
CLI_CMD(cli_mkmodel);
CLI_CMD(cli_pull);
CLI_CMD(cli_tokenize);
CLI_CMD(cli_generate);
CLI_CMD(cli_bench);
CLI_CMD(cli_serve);
CLI_CMD(cli_executor);
CLI_CMD(cli_keys);

/* `arka bench serve` (cli/bench_serve.c), dispatched by cli_bench; always built. */
int cli_bench_serve(int argc, char **argv);

#endif
