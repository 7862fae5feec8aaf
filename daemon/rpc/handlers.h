/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handlers: one function per RPC. Each validates its request first and
 * answers with a status and, on error, a message that names the block, the
 * limit or the namespace involved and what to do about it.
 *
 * A handler's reply lives in the handler_ctx_t (on dispatch's stack) and in
 * the session's scratch array; both stay valid until the reply is packed.
 */
#ifndef KVS_DAEMON_HANDLERS_H
#define KVS_DAEMON_HANDLERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dispatch.h"
#include "session.h"
#include "kvshare.pb-c.h"
#include "kvshare_rpcs.h"

#define HANDLER_MSG_MAX 1024 /* a refusal names two model identities */

/* One reply message per RPC (kvshare_rpcs.h); the handler fills its own. */
#define HANDLER_REPLY(CASE, Name, field) Kvshare__##Name##Reply field;

struct handler_ctx {
    char msg[HANDLER_MSG_MAX];
    union {
        KVS_RPCS(HANDLER_REPLY)
    } reply;
    Kvshare__Geometry geometry;
    /* Stats and Tree rows: freed by dispatch after packing. */
    void *heap[4];
    /* Set by a handler that cannot answer now: dispatch holds the session
     * for this reason until loop time hold_until_ms (0: until released),
     * replies nothing, and the request runs again (session.h). */
    session_hold_reason_t hold;
    uint64_t hold_until_ms;
};
#undef HANDLER_REPLY

/* The Lookup reply for a prompt whose namespace is resolved: the one path
 * of an immediate and a held lookup. waited: the reply's `waited`;
 * in_place (with pin): the request's tier2_in_place. */
int handler_lookup_answer(session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                          bool pin, bool in_place, bool waited, bool claim, Kvshare__Response *resp,
                          handler_ctx_t *ctx);

/* The Tree walk in steps (handler_tree): s closes, and its walk, if it has
 * the daemon's one walk, ends (the Trees waiting for it go on). */
void handler_tree_gone(session_t *s);

/* Bytes of the daemon's one Tree walk when s has it, else 0 (counted with
 * s's buffers). */
size_t handler_tree_bytes(const session_t *s);

/* One handler per RPC of kvshare_rpcs.h: handler_hello, handler_lookup, ...
 * Each answers its request into resp (through ctx) and returns a KVS_*
 * status (dispatch.h). */
#define HANDLER_PROTO(CASE, Name, field)                                                           \
    int handler_##field(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,        \
                        handler_ctx_t *ctx);
KVS_RPCS(HANDLER_PROTO)
#undef HANDLER_PROTO

#endif /* KVS_DAEMON_HANDLERS_H */
