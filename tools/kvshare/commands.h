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

#endif /* KVSHARE_COMMANDS_H */
