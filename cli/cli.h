/* cli: the `arka` subcommands. Each returns the process exit code (0 ok, 1 runtime error,
 * 2 usage error). main.c only dispatches. */
#ifndef ARKA_CLI_H
#define ARKA_CLI_H

int cli_inspect(int argc, char **argv);

#endif
