/* SPDX-License-Identifier: Apache-2.0 */
/*
 * session_io: a session's connection (net/session.c): accepting it, its
 * reads, its turns, its replies and its end. What a session is and what it
 * holds is core/session.h; this is the socket's side, for the daemon's
 * assembly, net/ and the tests (a session without a socket, session_new,
 * is driven by session_feed and its replies read from `out`).
 */
#ifndef KVS_DAEMON_SESSION_IO_H
#define KVS_DAEMON_SESSION_IO_H

#include <stddef.h>
#include <stdint.h>

#include "session.h"

/* A session with no socket (tests). Errors: KVS_ENOMEM. */
int session_new(server_t *srv, session_t **out);

/* Accepts the pending connection of the server's listener. Errors:
 * KVS_ENOMEM, KVS_EIO, KVS_ELIMIT (over max_sessions: refused and closed). */
int session_accept(server_t *srv);

/* Releases everything the session holds and ends it; its memory goes when
 * libuv has closed the socket (at once for a session without one).
 * Idempotent until then. */
void session_close(session_t *s, const char *reason);

/* Sends an unsolicited error reply (request id 0) with status and message,
 * as far as the socket takes it now; the caller then closes the session. */
void session_goodbye(session_t *s, int status, const char *message);

/* Appends bytes to the input and answers every whole frame into `out`.
 * Returns 0, or KVS_ETOOBIG / KVS_EPROTO when the stream cannot be trusted
 * (the error reply is in `out`; the caller closes). */
int session_feed(session_t *s, const uint8_t *bytes, size_t len);

/* Answers every whole frame already in `in` (see session_feed). A request
 * whose session is held (session_hold) stays in `in`, and no later one is
 * answered until the session is released and takes its turn. */
int session_process(session_t *s);

/* 0, or the error (KVS_ETOOBIG, KVS_EPROTO) that stopped the stream of a
 * session without a socket in a turn from the ready queue; the error reply
 * is in `out`, session_feed and session_process return the error from then
 * on, and the owner closes the session. */
int session_broken(const session_t *s);

/* One turn of s: at most a turn's worth of frames answered, replies sent
 * (the hold's turn hook, session_hooks_t). */
void session_take_turn(session_t *s);

/* Starts the idle sweep when cfg.idle_timeout_ms is set (server_listen).
 * Errors: KVS_EIO. */
int session_idle_start(server_t *srv);

/* Stops the idle sweep (server_shutdown): closes its timer. */
void session_idle_stop(server_t *srv);

#endif /* KVS_DAEMON_SESSION_IO_H */
