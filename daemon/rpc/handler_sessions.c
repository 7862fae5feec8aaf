/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sessions: the connected workers, one row each, as Redis's CLIENT LIST:
 * id, peer, worker name, namespaces, holdings, buffers, age, idle time and
 * hold. Read-only; linear in the sessions and in their pin maps. A
 * session's age counts from its accept (session_t.connected_ms).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "kvshare_status.h"
#include "namespaces.h"
#include "radix.h"
#include "server.h"
#include "session.h"
#include "store.h"

/* Namespaces named per row at most. */
#define SESSIONS_NS_PER_ROW 16

/* Loop time of s's accept; now for a session without a socket. */
static uint64_t since_ms(const session_t *s, uint64_t now)
{
    return s->sock.has_pipe ? s->sock.connected_ms : now;
}

static const char *hold_name(session_hold_reason_t why)
{
    switch (why) {
    case SESSION_HOLD_NONE:
        return "";
    case SESSION_HOLD_SPACING:
        return "spacing";
    case SESSION_HOLD_INFLIGHT:
        return "inflight";
    case SESSION_HOLD_TIER_JOB:
    case SESSION_HOLD_TIER_ANY:
        return "tier";
    case SESSION_HOLD_CLUSTER:
        return "cluster";
    case SESSION_HOLD_CLEAR:
        return "clear";
    case SESSION_HOLD_COMMIT:
        return "commit";
    case SESSION_HOLD_ALLOC:
        return "alloc";
    case SESSION_HOLD_TREE:
        return "tree";
    default:
        return "steps";
    }
}

static void add_ns(const session_t *viewer, uint32_t ns, uint32_t *ids, size_t *n)
{
    if (*n >= SESSIONS_NS_PER_ROW || !namespaces_allowed(viewer, ns))
        return;
    for (size_t i = 0; i < *n; i++)
        if (ids[i] == ns)
            return;
    ids[(*n)++] = ns;
}

static uint64_t sub_floor(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

int handler_sessions(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                     handler_ctx_t *ctx)
{
    (void)req;
    server_t *srv = s->srv;
    Kvshare__SessionsReply *r = &ctx->reply.sessions;
    kvshare__sessions_reply__init(r);
    resp->rpc_case = KVSHARE__RESPONSE__RPC_SESSIONS;
    resp->sessions = r;

    size_t n = 0;
    LIST_FOR_EACH (&srv->sessions, const session_t, link, o)
        if (!o->closing)
            n++;
    if (srv->cfg.max_sessions && n > srv->cfg.max_sessions)
        n = srv->cfg.max_sessions;
    if (n == 0)
        return 0;

    /* One allocation: the rows, their pointers, their namespace names. */
    size_t bytes = n * (sizeof(Kvshare__SessionInfo) + sizeof(Kvshare__SessionInfo *) +
                        SESSIONS_NS_PER_ROW * sizeof(char *));
    uint8_t *mem = malloc(bytes);
    if (!mem) {
        snprintf(ctx->msg, sizeof(ctx->msg), "kvshared is out of memory for the session list");
        return KVS_ENOMEM;
    }
    ctx->heap[0] = mem;
    Kvshare__SessionInfo *rows = (Kvshare__SessionInfo *)mem;
    Kvshare__SessionInfo **ptrs = (Kvshare__SessionInfo **)(rows + n);
    char **names = (char **)(ptrs + n);

    uint64_t now = uv_now(srv->loop);
    size_t k = 0;
    LIST_FOR_EACH (&srv->sessions, session_t, link, o) {
        if (k == n)
            break;
        if (o->closing)
            continue;
        Kvshare__SessionInfo *row = &rows[k];
        kvshare__session_info__init(row);
        row->id = o->id;
        row->pid = o->peer.known ? o->peer.pid : 0;
        row->uid = o->peer.known ? o->peer.uid : 0;
        row->worker = o->worker;
        row->pins = o->own.pins.used;
        row->pins_total = o->own.pins.total;
        row->writing = o->own.n_writing;
        row->buffered = (uint64_t)(o->in.len - o->in.head) + (uint64_t)(o->out.len - o->out.head) +
                        o->sock.queued;
        row->age_s = sub_floor(now, since_ms(o, now)) / 1000;
        row->idle_s = o->sock.has_pipe ? sub_floor(now, o->sock.last_request_ms) / 1000 : 0;
        row->held = session_held(o);
        row->held_for = (char *)hold_name(o->turn.held);
        row->requests = o->requests;

        uint32_t ids[SESSIONS_NS_PER_ROW];
        size_t n_ids = 0;
        if (srv->ns.creator)
            for (uint32_t ns = 0; ns < srv->cfg.max_namespaces; ns++)
                if (srv->ns.creator[ns] == o)
                    add_ns(s, ns, ids, &n_ids);
        for (uint32_t i = 0; i < o->own.pins.cap && n_ids < SESSIONS_NS_PER_ROW; i++)
            if (o->own.pins.keys[i] != SESSION_NO_BLOCK && o->own.pins.counts[i])
                add_ns(s, store_block_ns(srv->store, o->own.pins.keys[i]), ids, &n_ids);
        char **row_names = names + k * SESSIONS_NS_PER_ROW;
        size_t m = 0;
        for (size_t i = 0; i < n_ids; i++) {
            const char *name = radix_ns_name(srv->index, ids[i]);
            if (name)
                row_names[m++] = (char *)name;
        }
        row->namespaces = row_names;
        row->n_namespaces = m;
        ptrs[k++] = row;
    }
    r->sessions = ptrs;
    r->n_sessions = k;
    return 0;
}
