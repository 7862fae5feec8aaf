/* SPDX-License-Identifier: Apache-2.0 */
/*
 * launch: starts kvshared and waits, up to a deadline, for the READY line it
 * writes on --ready-fd once it listens. The one way every C test and
 * kvshare-bench start a daemon: none of them races the daemon's start, and a
 * daemon that never starts fails the caller within the deadline instead of
 * hanging it.
 */
#ifndef KVS_TEST_LAUNCH_H
#define KVS_TEST_LAUNCH_H

#include <sys/types.h>

/* How long a daemon may take to say READY unless the caller says otherwise
 * (valgrind and sanitizer builds start slowly). */
#define LAUNCH_READY_MS 30000

/* Starts argv[0] with argv[1..] (NULL-ended, at most 120 entries) and
 * "--ready-fd N" appended, as a child that is killed if the caller dies.
 * Returns its pid once it wrote READY within timeout_ms. Otherwise returns -1
 * and, when exit_status is not NULL, sets *exit_status to the daemon's exit
 * status if it exited (127: it could not be run), or to -1 if it was still
 * silent at the deadline (it is then killed); the daemon is reaped either way. */
pid_t launch_daemon(const char *const *argv, int timeout_ms, int *exit_status);

/* Sends sig to pid and waits up to timeout_ms for it to exit, then SIGKILLs
 * it. Returns its exit status, or -1 if it ended by a signal, was killed at
 * the deadline, or could not be waited for. Sig 0 sends nothing: it waits
 * for a daemon that exits by itself. */
int launch_stop(pid_t pid, int sig, int timeout_ms);

#endif /* KVS_TEST_LAUNCH_H */
