/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The `kvshare` subcommands. Each takes the arguments after its name
 * (argv[0] is the command name) and returns the process exit status:
 * 0 success, 1 the operation failed, 2 bad usage.
 */
#ifndef KVSHARE_COMMANDS_H
#define KVSHARE_COMMANDS_H

typedef struct kvshare_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help; /* one line */
} kvshare_command_t;

/* Every command, one row each: X(name, function, one line of help). main.c
 * builds its table from the rows, in this order (the order of `kvshare
 * help`); the prototypes below come from them too.
 *   calc.c: KV capacity planner (no daemon needed);
 *   cmd_*.c: the commands that talk to kvshared, over kvshare.h only;
 *   cmd_events.c: tails kvshared's KV events (ZeroMQ, msgpack; no client API). */
#define KVSHARE_COMMANDS(X)                                                                        \
    X(calc, kvshare_calc,                                                                          \
      "KV cache capacity planner: bytes per token and sequence, the budget a node's GPUs "         \
      "leave, users that fit, cost per user (MLA models too)")                                     \
    X(stats, kvshare_cmd_stats,                                                                    \
      "pool usage, blocks free/writing/cached/pinned, hit rates, evictions, sessions (--json)")    \
    X(top, kvshare_cmd_top,                                                                        \
      "live view: hit rate and its history, rates, usage, namespaces by traffic (--once, --json)") \
    X(tree, kvshare_cmd_tree,                                                                      \
      "the prefix tree per namespace: branches with hits, share, blocks, tier (--json)")           \
    X(sessions, kvshare_cmd_sessions,                                                              \
      "the connected workers: pid, worker name, pins, WRITING blocks, buffers, idle (--json)")     \
    X(ping, kvshare_cmd_ping, "round-trip time to kvshared")                                       \
    X(clear, kvshare_cmd_clear, "drop a namespace's cached blocks that no worker pins")            \
    X(evict, kvshare_cmd_evict,                                                                    \
      "drop one prompt's cached blocks that no worker pins nor another prompt continues")          \
    X(events, kvshare_cmd_events,                                                                  \
      "tail the KV events kvshared publishes for cluster routers (--json)")

#define KVSHARE_COMMAND_PROTO(name, fn, help) int fn(int argc, char **argv);
KVSHARE_COMMANDS(KVSHARE_COMMAND_PROTO)
#undef KVSHARE_COMMAND_PROTO

#endif /* KVSHARE_COMMANDS_H */
