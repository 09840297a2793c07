/* arka: one binary, subcommands like git. This file only dispatches. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

typedef struct { const char *name; int (*fn)(int, char **); const char *help; } command;

static const command commands[] = {
    { "inspect", cli_inspect, "print a model file's architecture, tensors and tokenizer" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: arka <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'arka <command> --help' shows a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "arka: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
