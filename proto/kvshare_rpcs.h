/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The RPCs of the kvshare protocol: one row each, the one list that the
 * daemon and the client build their per-RPC code from (the way
 * KVS_STATUS_TABLE and KVS_COUNTERS work), so that adding an RPC is a row
 * here, its messages in kvshare.proto, its handler and its client call.
 *
 *   X(CASE, Name, field)
 *     CASE   the oneof case: KVSHARE__REQUEST__RPC_<CASE> and
 *            KVSHARE__RESPONSE__RPC_<CASE> (the same field number in
 *            Request and Response; dispatch.c checks it at compile time)
 *     Name   the RPC's name in logs and metrics (rpc="Name"), and its
 *            messages Kvshare__<Name>Request / Kvshare__<Name>Reply
 *     field  the oneof member (req->field, resp->field) and the daemon's
 *            handler handler_<field> (handlers.h)
 *
 * What the rows become:
 *   - daemon/rpc/dispatch.c: the dispatch table {case, "Name", handler_field},
 *     and its lookup by case;
 *   - daemon/rpc/handlers.h: the handler prototypes and the reply union;
 *   - daemon/core/metrics.h: one per-RPC metrics slot per row, in row order
 *     (METRICS_MAX_RPC is their number), named by Name on /metrics;
 *   - client/client.c: the check that a reply answers the RPC asked, and
 *     the RPC's name in the message when it does not.
 * A test (tests/daemon/test_proto.c) checks that every case of the
 * Request oneof has a row.
 *
 * Rows are appended: their order is the order of the per-RPC metrics.
 * Nothing here includes the generated protocol header: the rows are names,
 * each user pastes them into its own types.
 */
#ifndef KVSHARE_RPCS_H
#define KVSHARE_RPCS_H

#define KVS_RPCS(X)                                                                                \
    X(HELLO, Hello, hello)                                                                         \
    X(LOOKUP, Lookup, lookup)                                                                      \
    X(ALLOC, Alloc, alloc)                                                                         \
    X(COMMIT, Commit, commit)                                                                      \
    X(PIN, Pin, pin)                                                                               \
    X(RELEASE, Release, release)                                                                   \
    X(STATS, Stats, stats)                                                                         \
    X(TREE, Tree, tree)                                                                            \
    X(PING, Ping, ping)                                                                            \
    X(CLEAR, Clear, clear)                                                                         \
    X(EVICT, Evict, evict)                                                                         \
    X(SESSIONS, Sessions, sessions)

/* Each RPC's position in the list (KVS_RPC_SLOT_LOOKUP, ...) and their
 * number (KVS_RPC_COUNT). */
#define KVS_RPC_SLOT(CASE, Name, field) KVS_RPC_SLOT_##CASE,
enum kvs_rpc_slot { KVS_RPCS(KVS_RPC_SLOT) KVS_RPC_COUNT };
#undef KVS_RPC_SLOT

#endif /* KVSHARE_RPCS_H */
