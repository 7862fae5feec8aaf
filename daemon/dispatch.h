/*
 * dispatch: from a frame's bytes to a handler and back to a reply frame.
 *
 * The table in dispatch.c names every RPC once: {oneof case, name, handler}.
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

/* Decodes one request frame body, runs its handler and appends the reply
 * frame to the session's output. Returns 0 when the stream is still
 * trustworthy (including requests answered with an error), KVS_EPROTO when
 * the body does not decode (an error reply is appended; close the
 * connection), KVS_ENOMEM when not even the reply could be built, and
 * DISPATCH_DEFERRED when the handler started copies the request waits for
 * (handler_ctx_t.deferred): nothing is appended or counted, and the caller
 * runs the same frame again when they are done. */
#define DISPATCH_DEFERRED 1
int dispatch_frame(session_t *s, const uint8_t *body, size_t len);

/* Appends an error reply with no RPC body (request id `id`). */
int dispatch_error_reply(session_t *s, uint64_t id, int status, const char *message);

/* Answers a parked Lookup (inflight.h) into the session's output, as the
 * reply of its request, counted like any Lookup. Returns 0 or KVS_ENOMEM. */
struct inflight_wait;
int dispatch_lookup_resume(session_t *s, const struct inflight_wait *w);

#endif /* KVS_DAEMON_DISPATCH_H */
