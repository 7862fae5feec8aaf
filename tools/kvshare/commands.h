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

/* calc.c: KV capacity planner (no daemon needed). */
int kvshare_calc(int argc, char **argv);

/* The commands that talk to kvshared (cmd_*.c, over kvshare.h only). */
int kvshare_cmd_stats(int argc, char **argv);
int kvshare_cmd_top(int argc, char **argv);
int kvshare_cmd_tree(int argc, char **argv);
int kvshare_cmd_ping(int argc, char **argv);
int kvshare_cmd_clear(int argc, char **argv);
int kvshare_cmd_evict(int argc, char **argv);

/* cmd_events.c: tails kvshared's KV events (ZeroMQ, msgpack; no client API). */
int kvshare_cmd_events(int argc, char **argv);

#endif /* KVSHARE_COMMANDS_H */
