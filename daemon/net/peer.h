/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer: who is on the other end of a session, and whether it may connect.
 *
 * The kernel vouches for a Unix socket peer's uid, gid and pid
 * (SO_PEERCRED, taken at connect). They are logged with the session, and
 * checked against the daemon's allow-lists (allow_uids / allow_gids): a peer
 * not allowed gets a KVS_EDENIED reply and is closed. Namespace allow-lists
 * are checked per request by namespaces.c with the same identity.
 */
#ifndef KVS_DAEMON_PEER_H
#define KVS_DAEMON_PEER_H

#include "session.h"

/* Fills s->peer from the socket (peer.known stays false if the kernel does
 * not tell, or for a session without a socket). */
void peer_identify(session_t *s);

/* 0 when the peer passes the daemon's allow-lists; else appends a
 * KVS_EDENIED reply, counts and logs it, and returns KVS_EDENIED (the caller
 * flushes and closes). */
int peer_admit(session_t *s);

#endif /* KVS_DAEMON_PEER_H */
