/* SPDX-License-Identifier: Apache-2.0 */
/*
 * listener: the daemon's Unix socket. listener_open checks the path and its
 * folder, binds (mode 0660, the socket group), listens and accepts each
 * connection as a session (session_io.h); listener_close stops accepting
 * and removes the socket file if it is still this daemon's.
 */
#ifndef KVS_DAEMON_LISTENER_H
#define KVS_DAEMON_LISTENER_H

#include <stddef.h>

#include "server.h"

/* Checks the socket path before anything is built: KVS_EBUSY when a live
 * daemon answers there, KVS_EINVAL for a bad path or a file that is not a
 * socket, KVS_EDENIED when the socket's directory is not ours or root's, or
 * others can write it (without the sticky bit), or the socket belongs to
 * another uid (someone could pose as kvshared there); 0 for no file or a
 * stale socket of ours (server_listen replaces it). */
int server_check_socket(const char *path, char *err, size_t errlen);

/* Binds and listens on cfg.socket_path, replacing a socket file no daemon
 * answers on. Errors (message in err): server_check_socket's, KVS_EIO. */
int listener_open(server_t *s, char *err, size_t errlen);

/* Closes the listening handle and removes its socket file, after a failure
 * between listener_open and the end of server_listen. */
void listener_abandon(server_t *s);

/* Stops accepting and removes the socket file if it is still ours (not a
 * successor's). Idempotent. */
void listener_close(server_t *s);

#endif /* KVS_DAEMON_LISTENER_H */
