/* cli: the `arka` subcommands. Each returns the process exit code (0 ok, 1 runtime error,
 * 2 usage error). main.c only dispatches. A command whose module is not built into this
 * binary (the gateway on a GPU-only host, say) is a weak symbol left NULL. */
#ifndef ARKA_CLI_H
#define ARKA_CLI_H

#include <stdio.h>

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
CLI_CMD(cli_perplexity);

/* Range checks of the cuda engine options that generate, serve and executor take
 * (--gpu-memory-fraction in (0, 1], --cuda-graph-budget-s >= 0): prints "arka CMD: ..." naming
 * the flag and returns 2 (a usage error) when one is out of range, else 0. */
static inline int cli_check_cuda_opts(const char *cmd, double mem_fraction, double graph_budget_s) {
    if (!(mem_fraction > 0 && mem_fraction <= 1)) {
        fprintf(stderr, "arka %s: --gpu-memory-fraction %g: expected a share of device memory in (0, 1] (default 0.90)\n", cmd,
                mem_fraction);
        return 2;
    }
    if (!(graph_budget_s >= 0)) {
        fprintf(stderr, "arka %s: --cuda-graph-budget-s %g: expected seconds >= 0 (0 = no CUDA graphs; default 60)\n", cmd,
                graph_budget_s);
        return 2;
    }
    return 0;
}

#endif
