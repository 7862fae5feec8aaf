/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dispatch: from a frame's bytes to a handler and back to a reply frame.
 *
 * The table in dispatch.c has one row per RPC, {oneof case, name, handler},
 * generated from the RPC list (proto/kvshare_rpcs.h), in its order.
 * A handler fills the reply through a handler_ctx_t (handlers.h) and returns a
 * KVS_* status; dispatch turns it into Response.status (= -code) and
 * Response.message, echoes the request id and appends the frame.
 */
#ifndef KVS_DAEMON_DISPATCH_H
#define KVS_DAEMON_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare.pb-c.h"

typedef struct session session_t;
typedef struct handler_ctx handler_ctx_t;

typedef int (*dispatch_handler_fn)(session_t *s, const Kvshare__Request *req,
                                   Kvshare__Response *resp, handler_ctx_t *ctx);

typedef struct dispatch_entry {
    Kvshare__Request__RpcCase rpc;
    const char *name;
    dispatch_handler_fn handler;
} dispatch_entry_t;

/* The entry for an RPC, or NULL for one this daemon does not know. */
const dispatch_entry_t *dispatch_find(Kvshare__Request__RpcCase rpc);

/* The table by position (0 .. dispatch_count() - 1; NULL past it), and an
 * entry's position: the index of the per-RPC metrics. */
size_t dispatch_count(void);
const dispatch_entry_t *dispatch_at(size_t i);
size_t dispatch_index(const dispatch_entry_t *e);

/* dispatch_frame's answer "not now": the handler asked for a hold
 * (handler_ctx_t.hold). Nothing is replied or counted; the session is held
 * (session.h) and keeps the frame, which runs again once it is released. */
#define DISPATCH_HELD 1

/* Decodes one request frame body, runs its handler and appends the reply
 * frame to the session's output. *clock_ns is when the request's work
 * began (uv_hrtime: read by the caller at the start of a turn, or the end
 * of the request before it); it is set to when the reply was built, and
 * the difference goes to the RPC's latency histogram. Returns 0 when the stream is still
 * trustworthy (including requests answered with an error), DISPATCH_HELD,
 * KVS_EPROTO when the body does not decode (an error reply is appended;
 * close the connection), KVS_ENOMEM when not even the reply could be
 * built. */
int dispatch_frame(session_t *s, const uint8_t *body, size_t len, uint64_t *clock_ns);

/* Appends an error reply with no RPC body (request id `id`). */
int dispatch_error_reply(session_t *s, uint64_t id, int status, const char *message);

#endif /* KVS_DAEMON_DISPATCH_H */
