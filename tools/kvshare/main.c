/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare: the operator's command line. One table maps a command name to its
 * function and a line of help; each command lives in its own file.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const kvshare_command_t commands[] = {
    {"calc", kvshare_calc,
     "KV cache capacity planner: bytes per token and sequence, the budget a node's GPUs "
     "leave, users that fit, cost per user (MLA models too)"},
    {"stats", kvshare_cmd_stats,
     "pool usage, blocks free/writing/cached/pinned, hit rates, evictions, sessions (--json)"},
    {"top", kvshare_cmd_top, "the stats view, refreshed, with rates"},
    {"tree", kvshare_cmd_tree, "top cached prefixes: tokens, blocks, hits, pins, age"},
    {"ping", kvshare_cmd_ping, "round-trip time to kvshared"},
    {"clear", kvshare_cmd_clear, "drop a namespace's cached blocks that no worker pins"},
    {"evict", kvshare_cmd_evict,
     "drop one prompt's cached blocks that no worker pins nor another prompt continues"},
    {"events", kvshare_cmd_events,
     "tail the KV events kvshared publishes for cluster routers (--json)"},
};
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
