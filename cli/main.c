/* arka: one binary, subcommands like git. This file only dispatches. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

typedef int (*cmd_fn)(int, char **);
typedef struct { const char *name; cmd_fn fn; const char *help; } command;

static command commands[] = {
    { "serve",    NULL, "serve a model over the OpenAI-compatible HTTP API" },
    { "generate", NULL, "generate text from a prompt locally (no HTTP)" },
    { "inspect",  NULL, "print a model file's architecture, tensors and tokenizer" },
    { "tokenize", NULL, "print the token ids of a text" },
    { "mkmodel",  NULL, "write a random-weight GGUF at a standard shape" },
    { "perplexity", NULL, "perplexity of a model over a text; save or compare logits (KL divergence)" },
    { "pull",     NULL, "download a model file" },
    { "bench",    NULL, "benchmarks (kernels, decode, serving load)" },
    { "keys",     NULL, "manage API keys" },
    { "executor", NULL, "internal: the process `serve` spawns per device" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: arka <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (commands[i].fn) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'arka <command> --help' shows a command's options.\n");
}

static void bind(void) {
    const struct { const char *name; cmd_fn fn; } fns[] = {
        { "serve", cli_serve }, { "generate", cli_generate }, { "inspect", cli_inspect }, { "tokenize", cli_tokenize },
        { "mkmodel", cli_mkmodel }, { "pull", cli_pull }, { "bench", cli_bench }, { "keys", cli_keys },
        { "executor", cli_executor }, { "perplexity", cli_perplexity },
    };
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        for (size_t j = 0; j < sizeof fns / sizeof *fns; j++)
            if (!strcmp(commands[i].name, fns[j].name)) commands[i].fn = fns[j].fn;
}

int main(int argc, char **argv) {
    bind();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            if (!commands[i].fn) {
                fprintf(stderr, "arka: command '%s' is not part of this build\n", argv[1]);
                return 2;
            }
            return commands[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "arka: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
