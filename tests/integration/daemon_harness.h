/*
 * Starts a real kvshared on a temporary socket (host backend, a small pool)
 * and waits for its READY line on --ready-fd, so no test races its start.
 */
#ifndef KVS_TEST_DAEMON_HARNESS_H
#define KVS_TEST_DAEMON_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct harness {
    pid_t pid;
    char dir[64];
    char socket_path[96];
} harness_t;

/* Starts kvshared with the test geometry (2 layers, 2 kv heads, head_dim 8,
 * fp16, 4 tokens per block, `blocks` blocks) plus extra flags (NULL-ended).
 * Returns 0 when it is listening, -1 otherwise. */
int harness_start(harness_t *h, unsigned blocks, const char *const *extra);

/* The same with the geometry flags given (NULL-ended, e.g. {"--model",
 * "deepseek-v2-lite", NULL}) instead of the test geometry. */
int harness_start_geometry(harness_t *h, unsigned blocks, const char *const *geometry,
                           const char *const *extra);

/* Same socket path as h, as a new process; *pid_out gets its pid. Returns
 * the exit status if it exited within timeout_ms, -1 if still running. */
int harness_start_again(const harness_t *h, unsigned blocks, int timeout_ms, pid_t *pid_out);

/* harness_start_again with extra flags (NULL-ended), as harness_start. */
int harness_restart(const harness_t *h, unsigned blocks, const char *const *extra, int timeout_ms,
                    pid_t *pid_out);

/* SIGTERM, waits; returns the exit status (0 expected) or -1. */
int harness_stop(harness_t *h);

/* Removes the temporary directory. */
void harness_cleanup(harness_t *h);

#endif
