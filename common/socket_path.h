/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where kvshared listens: the default socket path, which the daemon and its
 * clients compute alike so that both agree without configuration, and the
 * longest path a Unix socket address holds.
 */
#ifndef KVS_COMMON_SOCKET_PATH_H
#define KVS_COMMON_SOCKET_PATH_H

#include <stddef.h>
#include <sys/un.h>

/* Bytes of a Unix socket path, NUL included (108 on Linux): a path of
 * SOCKET_PATH_MAX - 1 characters is the longest that can be bound. */
#define SOCKET_PATH_MAX sizeof(((struct sockaddr_un *)0)->sun_path)

/* Writes the default socket path into buf: $KVSHARE_SOCKET if set, else
 * $XDG_RUNTIME_DIR/kvshare/kvshared.sock, else /run/kvshare/kvshared.sock for
 * root, else /tmp/kvshare-$UID/kvshared.sock (not $TMPDIR: a daemon and a
 * client started from different environments must still meet).
 * Errors: KVS_EINVAL (buf NULL or too small). */
int socket_path_default(char *buf, size_t len);

#endif /* KVS_COMMON_SOCKET_PATH_H */
