/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The test daemon: a real kvshared on a socket in a new temporary directory
 * (under $TMPDIR, else /tmp), host backend, a small geometry, started through
 * launch.h so that no test races its start and none hangs on a daemon that
 * never starts. KVS_TEST_DAEMON_LOG sets its log level (default warn).
 *
 * The daemon binary is KVSHARED_PATH, fixed when this file is compiled (see
 * tests/support/CMakeLists.txt: one library per daemon binary), or
 * $KVS_KVSHARED when set (a packed device run, tools/device-pack.sh).
 */
#ifndef KVS_TEST_DAEMON_HARNESS_H
#define KVS_TEST_DAEMON_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#include "socket_path.h"

typedef struct harness {
    pid_t pid;
    char dir[SOCKET_PATH_MAX];
    char socket_path[SOCKET_PATH_MAX];
} harness_t;

/* Starts kvshared with the test geometry (2 layers, 2 kv heads, head_dim 8,
 * fp16, 4 tokens per block, `blocks` blocks) plus extra flags (NULL-ended).
 * Returns 0 when it is listening, -1 otherwise (nothing left running). */
int harness_start(harness_t *h, unsigned blocks, const char *const *extra);

/* The same with the geometry flags given (NULL-ended, e.g. {"--model",
 * "deepseek-v2-lite", NULL}) instead of the test geometry. */
int harness_start_geometry(harness_t *h, unsigned blocks, const char *const *geometry,
                           const char *const *extra);

/* Same socket path as h, as a new process; *pid_out gets its pid (0 once it
 * is reaped). Returns -1 if it is listening (still running), its exit status
 * if it exited within timeout_ms, -2 if it did neither (it is killed). */
int harness_start_again(const harness_t *h, unsigned blocks, int timeout_ms, pid_t *pid_out);

/* harness_start_again with extra flags (NULL-ended), as harness_start. */
int harness_restart(const harness_t *h, unsigned blocks, const char *const *extra, int timeout_ms,
                    pid_t *pid_out);

/* SIGTERM, waits (up to a minute, then SIGKILL); returns the exit status
 * (0 expected) or -1. */
int harness_stop(harness_t *h);

/* Kills the daemon if still running, removes the temporary directory. */
void harness_cleanup(harness_t *h);

#endif
