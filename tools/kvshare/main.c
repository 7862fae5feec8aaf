/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare: the operator's command line. One table (KVSHARE_COMMANDS, in
 * commands.h) maps a command name to its function and a line of help; each
 * command lives in its own file.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"

#define COMMAND_ROW(name, fn, help) {#name, fn, help},
static const kvshare_command_t commands[] = {KVSHARE_COMMANDS(COMMAND_ROW)};
#undef COMMAND_ROW
#define COMMAND_COUNT (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: kvshare COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n`kvshare COMMAND --help` describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < COMMAND_COUNT; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvshare: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
