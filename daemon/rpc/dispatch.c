/* SPDX-License-Identifier: Apache-2.0 */
#include "dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "handlers.h"
#include "inflight.h"
#include "kvshare_status.h"
#include "kvshare_version.h"
#include "log.h"
#include "session.h"
#include "lookup_codec.h"

/* Every RPC the daemon answers, one row per entry of KVS_RPCS
 * (kvshare_rpcs.h), in its order: find one by its name there. */
#define DISPATCH_ROW(CASE, Name, field) {KVSHARE__REQUEST__RPC_##CASE, #Name, handler_##field},
static const dispatch_entry_t dispatch_table[] = {KVS_RPCS(DISPATCH_ROW)};
#undef DISPATCH_ROW

#define DISPATCH_N (sizeof(dispatch_table) / sizeof(dispatch_table[0]))

/* A reply answers its request in the oneof of the same name and number, so
 * that a client can check that it got the answer to what it asked. */
#define DISPATCH_SAME_CASE(CASE, Name, field)                                                      \
    _Static_assert((int)KVSHARE__REQUEST__RPC_##CASE == (int)KVSHARE__RESPONSE__RPC_##CASE,        \
                   #Name ": Request and Response oneof fields must share a number");
KVS_RPCS(DISPATCH_SAME_CASE)
#undef DISPATCH_SAME_CASE

/* The per-RPC metrics have one slot per entry. */
_Static_assert(DISPATCH_N == METRICS_MAX_RPC, "one per-RPC metrics slot per dispatch row");
_Static_assert(offsetof(handler_ctx_t, msg) == 0, "dispatch zeroes what follows the message");

size_t dispatch_count(void)
{
    return DISPATCH_N;
}

const dispatch_entry_t *dispatch_at(size_t i)
{
    return i < DISPATCH_N ? &dispatch_table[i] : NULL;
}

size_t dispatch_index(const dispatch_entry_t *e)
{
    return (size_t)(e - dispatch_table);
}

/* One jump on the oneof case, not a scan of the table. */
const dispatch_entry_t *dispatch_find(Kvshare__Request__RpcCase rpc)
{
    switch (rpc) {
#define DISPATCH_CASE(CASE, Name, field)                                                           \
    case KVSHARE__REQUEST__RPC_##CASE:                                                             \
        return &dispatch_table[KVS_RPC_SLOT_##CASE];
        KVS_RPCS(DISPATCH_CASE)
#undef DISPATCH_CASE
    default:
        return NULL;
    }
}

static int append_reply(session_t *s, Kvshare__Response *resp)
{
    size_t before = s->out.len;
    int rc = frame_append_response(&s->out, resp);
    if (rc == 0)
        s->srv->metrics.bytes_out += s->out.len - before;
    return rc;
}

int dispatch_error_reply(session_t *s, uint64_t id, int status, const char *message)
{
    Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
    resp.id = id;
    resp.status = (Kvshare__Status)(-status);
    resp.message = (char *)message;
    return append_reply(s, &resp);
}

/* The decode arena: protobuf-c's allocations for one request come from one
 * reused buffer. What does not fit goes to malloc, and the arena grows to
 * the size the request wanted (at most DECODE_ARENA_MAX, so that one large
 * request does not leave the daemon holding its size) for the next one. */
#define DECODE_ARENA_MIN 65536
#define DECODE_ARENA_MAX (1u << 20)
/* A request decodes into at most this many times its frame (plus
 * DECODE_ARENA_MIN): packed ids and token bytes need about 1x. */
#define DISPATCH_DECODE_FACTOR 4

static void *arena_alloc(void *data, size_t size)
{
    server_t *srv = data;
    size_t need = (size + 15) & ~(size_t)15;
    srv->decode.want += need;
    /* protobuf-c keeps every unknown field (24 bytes and a copy each, for
     * as little as 2 bytes of frame): past the frame's budget, the decode
     * fails instead of growing. */
    if (srv->decode.want > srv->decode.budget) {
        srv->decode.over = true;
        return NULL;
    }
    if (srv->decode.arena && srv->decode.used + need <= srv->decode.cap) {
        void *p = srv->decode.arena + srv->decode.used;
        srv->decode.used += need;
        return p;
    }
    srv->decode.heap = true;
    return malloc(size);
}

/* Compared as integers: before the first request the arena is NULL, and
 * NULL + 0 or an order between unrelated pointers is undefined in C. */
static void arena_free(void *data, void *p)
{
    server_t *srv = data;
    uintptr_t at = (uintptr_t)p;
    uintptr_t lo = (uintptr_t)srv->decode.arena;
    if (p && (lo == 0 || at < lo || at - lo >= srv->decode.cap))
        free(p);
}

static void arena_reset(server_t *srv)
{
    if (srv->decode.want > srv->decode.cap && srv->decode.want <= DECODE_ARENA_MAX &&
        !srv->decode.over) {
        size_t cap = srv->decode.cap ? srv->decode.cap : DECODE_ARENA_MIN;
        while (cap < srv->decode.want)
            cap *= 2;
        uint8_t *a = malloc(cap);
        if (a) {
            free(srv->decode.arena);
            srv->decode.arena = a;
            srv->decode.cap = cap;
        }
    }
    srv->decode.used = 0;
    srv->decode.want = 0;
    srv->decode.heap = false;
}

/* Frees a decoded request. Memory wholly in the arena needs no walk of the
 * message (every arena_free of it would do nothing): the reset frees it. */
static void request_free(server_t *srv, Kvshare__Request *req, ProtobufCAllocator *arena)
{
    if (srv->decode.heap)
        kvshare__request__free_unpacked(req, arena);
    arena_reset(srv);
}

/* Fields a request may carry that this daemon does not know (a newer
 * client's): a few are fine, more are an attack on decode memory. */
#define DISPATCH_MAX_UNKNOWN_FIELDS 32

static size_t unknown_fields(const Kvshare__Request *req)
{
    size_t n = req->base.n_unknown_fields;
    /* Every RPC's message is in the oneof's union: any member reaches it. */
    const ProtobufCMessage *rpc = (const ProtobufCMessage *)req->hello;
    if (req->rpc_case != KVSHARE__REQUEST__RPC__NOT_SET && rpc)
        n += rpc->n_unknown_fields;
    return n;
}

/* Room in the arena as it is now, or NULL: never malloc (a request decoded
 * by hand holds nothing to free). What was wanted still grows the arena
 * for the next request. */
static void *arena_take(server_t *srv, size_t size)
{
    size_t need = (size + 15) & ~(size_t)15;
    srv->decode.want += need;
    if (!srv->decode.arena || srv->decode.used + need > srv->decode.cap)
        return NULL;
    void *p = srv->decode.arena + srv->decode.used;
    srv->decode.used += need;
    return p;
}

/* A plain Lookup decoded by hand (lookup_codec.h) into *req and *lk: the namespace
 * and the tokens copied to the arena (aligned, the namespace ended by a
 * NUL, as protobuf-c gives them). NULL when the frame is of another shape,
 * or the arena has no room yet: protobuf-c decodes it then. */
static Kvshare__Request *decode_by_hand(server_t *srv, const uint8_t *body, size_t len,
                                        Kvshare__Request *req, Kvshare__LookupRequest *lk)
{
    lookup_frame_t w;
    if (!lookup_decode(body, len, &w))
        return NULL;
    char *ns = arena_take(srv, w.ns_len + 1);
    uint8_t *tokens = w.tokens_len ? arena_take(srv, w.tokens_len) : NULL;
    if (!ns || (w.tokens_len && !tokens)) {
        srv->decode.used = srv->decode.want = 0; /* protobuf-c starts afresh */
        return NULL;
    }
    memcpy(ns, w.ns, w.ns_len);
    ns[w.ns_len] = '\0';
    if (w.tokens_len)
        memcpy(tokens, w.tokens, w.tokens_len);
    *lk = (Kvshare__LookupRequest)KVSHARE__LOOKUP_REQUEST__INIT;
    lk->ns = ns;
    lk->tokens.len = w.tokens_len;
    lk->tokens.data = tokens;
    lk->pin = w.pin;
    lk->wait_ms = w.wait_ms;
    lk->tier2_in_place = w.tier2_in_place;
    *req = (Kvshare__Request)KVSHARE__REQUEST__INIT;
    req->id = w.id;
    req->rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req->lookup = lk;
    return req;
}

int dispatch_frame(session_t *s, const uint8_t *body, size_t len, uint64_t *clock_ns)
{
    ProtobufCAllocator arena = {arena_alloc, arena_free, s->srv};
    s->srv->decode.budget = DISPATCH_DECODE_FACTOR * len + DECODE_ARENA_MIN;
    s->srv->decode.over = false;
    Kvshare__Request by_hand;
    Kvshare__LookupRequest by_hand_lookup;
    Kvshare__Request *req = decode_by_hand(s->srv, body, len, &by_hand, &by_hand_lookup);
    if (!req)
        req = kvshare__request__unpack(&arena, len, body);
    if (req && unknown_fields(req) > DISPATCH_MAX_UNKNOWN_FIELDS) {
        s->srv->decode.over = true;
        request_free(s->srv, req, &arena);
        req = NULL;
    }
    if (!req) {
        char msg[200];
        s->srv->metrics.protocol_errors++;
        if (s->srv->decode.over)
            snprintf(msg, sizeof(msg),
                     "a frame of %zu bytes carries more than %d unknown fields or needs more "
                     "than %d times its size to decode; closing the connection",
                     len, DISPATCH_MAX_UNKNOWN_FIELDS, DISPATCH_DECODE_FACTOR);
        else
            snprintf(msg, sizeof(msg),
                     "a frame of %zu bytes does not decode as a kvshare Request; closing the "
                     "connection (is the client speaking the kvshare protocol?)",
                     len);
        dispatch_error_reply(s, 0, KVS_EPROTO, msg);
        arena_reset(s->srv);
        return KVS_EPROTO;
    }

    Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
    handler_ctx_t ctx;
    /* The message (1 KiB) is written only on a failure: not zeroed. */
    ctx.msg[0] = '\0';
    memset((char *)&ctx + sizeof(ctx.msg), 0, sizeof(ctx) - sizeof(ctx.msg));
    resp.id = req->id;

    const dispatch_entry_t *entry = dispatch_find(req->rpc_case);
    unsigned slot = METRICS_MAX_RPC; /* no per-RPC slot for an unknown RPC */
    int status;
    if (!entry) {
        snprintf(ctx.msg, sizeof(ctx.msg),
                 "unknown or missing RPC (field %d); this daemon speaks kvshare protocol %d.%d: "
                 "upgrade kvshared or use a matching client",
                 (int)req->rpc_case, KVS_VERSION_MAJOR, KVS_VERSION_MINOR);
        status = KVS_EPROTO;
    } else {
        uint32_t claim_gen = s->claim.gen;
        status = entry->handler(s, req, &resp, &ctx);
        /* Claims last until the next request has been handled (inflight.h). */
        if (s->claim.first && s->claim.gen == claim_gen)
            inflight_unclaim(s->srv, s);
        if (ctx.hold != SESSION_HOLD_NONE) {
            /* Not now: the frame stays, and runs again when released. */
            for (size_t i = 0; i < sizeof(ctx.heap) / sizeof(ctx.heap[0]); i++)
                free(ctx.heap[i]);
            request_free(s->srv, req, &arena);
            session_hold(s, ctx.hold, ctx.hold_until_ms);
            *clock_ns = uv_hrtime(); /* a held request's time is not the next one's */
            return DISPATCH_HELD;
        }
        slot = (unsigned)dispatch_index(entry);
        if (status != 0)
            LOG_DEBUG("session %llu: %s: %s", (unsigned long long)s->id, entry->name, ctx.msg);
    }
    s->requests++;
    metrics_count_rpc(&s->srv->metrics, slot, status);
    if (status != 0) {
        resp.status = (Kvshare__Status)(-status);
        resp.message = ctx.msg[0] ? ctx.msg : (char *)kvs_status_text(status);
    }

    int rc = append_reply(s, &resp);
    for (size_t i = 0; i < sizeof(ctx.heap) / sizeof(ctx.heap[0]); i++)
        free(ctx.heap[i]);
    request_free(s->srv, req, &arena);
    /* One clock read per request: its end is the next one's start. */
    uint64_t now = uv_hrtime();
    if (slot < METRICS_MAX_RPC)
        metrics_observe(&s->srv->metrics.rpc_latency[slot], metrics_latency_bounds_ns,
                        metrics_latency_n_bounds, now - *clock_ns);
    *clock_ns = now;
    /* A Commit or Release that ended declarations: held lookups look
     * again (released ones run from the ready queue, not in here). */
    if (inflight_pending(s->srv))
        inflight_wake(s->srv, false);
    return rc;
}
