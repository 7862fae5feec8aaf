/* SPDX-License-Identifier: Apache-2.0 */
#include "handlers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_store.h"
#include "errbuf.h"
#include "inflight.h"
#include "kvshare_counters.h"
#include "kvshare_status.h"
#include "kvshare_version.h"
#include "log.h"
#include "now.h"
#include "session.h"
#include "tier.h"
#include "disk.h"
#include "store.h"
#include "store_disk.h"
#include "store_restore.h"
#include "namespaces.h"

/* Records the message of a failing request and returns its status. */
#define fail(ctx, status, ...) errbuf_set((ctx)->msg, sizeof((ctx)->msg), (status), __VA_ARGS__)

/* The namespace id for `name`, created on first use when `create` is true
 * (namespaces.h); the failure's message goes to the reply. */
static int ns_resolve(session_t *s, const char *name, bool create, uint32_t *ns, handler_ctx_t *ctx)
{
    return namespaces_resolve(s, name, create, ns, ctx->msg, sizeof(ctx->msg));
}

/* Token ids from the wire: little-endian uint32 packed in bytes. On a
 * little-endian host with aligned data they are used in place. */
static int tokens_view(const server_t *srv, const ProtobufCBinaryData *bytes,
                       const uint32_t **tokens, size_t *n, void **copy, handler_ctx_t *ctx)
{
    *copy = NULL;
    if (bytes->len % 4 != 0)
        return fail(ctx, KVS_EINVAL,
                    "tokens field has %zu bytes, not a multiple of 4: token ids travel as "
                    "little-endian uint32",
                    bytes->len);
    *n = bytes->len / 4;
    /* The request's work is one piece on the loop, linear in its blocks. */
    if (*n / srv->geo.block_tokens > srv->cfg.max_prompt_blocks)
        return fail(ctx, KVS_ELIMIT,
                    "a prompt of %zu tokens (%zu blocks) is over max_prompt_blocks (%u): "
                    "requests this long would hold every client back",
                    *n, *n / srv->geo.block_tokens, srv->cfg.max_prompt_blocks);
    if (*n == 0) {
        *tokens = NULL;
        return 0;
    }
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (((uintptr_t)bytes->data & 3) == 0) {
        *tokens = (const uint32_t *)(const void *)bytes->data;
        return 0;
    }
#endif
    uint32_t *t = malloc(bytes->len);
    if (!t)
        return fail(ctx, KVS_ENOMEM, "out of memory copying %zu tokens", *n);
    for (size_t i = 0; i < *n; i++) {
        const uint8_t *p = bytes->data + 4 * i;
        t[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
    *tokens = t;
    *copy = t;
    return 0;
}

/* The per-session limits (session_max_pinned, session_max_writing). */
static int over_pin_limit(session_t *s, size_t more, handler_ctx_t *ctx)
{
    s->srv->metrics.session_limit_refusals++;
    return fail(ctx, KVS_ELIMIT,
                "session limit session_max_pinned = %u: this session holds %llu pins and this "
                "request needs %zu more; release blocks first",
                s->srv->cfg.session_max_pinned, (unsigned long long)s->own.pins.total, more);
}

static int over_pin_limit_check(session_t *s, size_t more, handler_ctx_t *ctx)
{
    uint32_t max = s->srv->cfg.session_max_pinned;
    if (max && s->own.pins.total + more > max)
        return over_pin_limit(s, more, ctx);
    return 0;
}

/* A request's retention hint, checked before anything changes. */
static int hint_check(const Kvshare__RetentionHint *h, handler_ctx_t *ctx)
{
    if (h && h->priority > RADIX_PRIO_MAX)
        return fail(ctx, KVS_EINVAL, "retention priority %u: use 0 to %d", h->priority,
                    RADIX_PRIO_MAX);
    return 0;
}

/* The request's hint as the store takes it (none when h is NULL). */
static store_hint_t hint_of(const Kvshare__RetentionHint *h)
{
    store_hint_t sh = {.set = h != NULL};
    if (h) {
        sh.priority = h->priority;
        sh.duration_ms = h->duration_ms;
    }
    return sh;
}

static int check_range(session_t *s, uint32_t block_id, handler_ctx_t *ctx)
{
    if (block_id >= s->srv->num_blocks)
        return fail(ctx, KVS_EINVAL, "block %u is out of range: the pool has %u blocks (ids 0..%u)",
                    block_id, s->srv->num_blocks, s->srv->num_blocks - 1);
    return 0;
}

/* Who the session is in the device group: a rank (its device), the
 * group's scheduler, or neither. With several devices, neither is allowed
 * only without fds (monitoring; group_writer_check refuses its Alloc and Commit),
 * since a pool fd would give no rank's shard. Sets s->rank and
 * s->group_scheduler. Errors: KVS_EINVAL. */
static int hello_group(session_t *s, const Kvshare__HelloRequest *hello, handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    s->rank = -1;
    s->group_scheduler = false;
    if (hello->ranked && hello->group_scheduler)
        return fail(ctx, KVS_EINVAL,
                    "a session is either a rank (a worker on one device) or the group's "
                    "scheduler, not both");
    if (hello->ranked) {
        if (hello->rank >= srv->n_devices)
            return fail(ctx, KVS_EINVAL,
                        "rank %u: this kvshared serves %u device(s), ranks 0 to %u; start it "
                        "with --devices for every rank of the group",
                        hello->rank, srv->n_devices, srv->n_devices - 1);
        s->rank = (int)hello->rank;
    }
    s->group_scheduler = hello->group_scheduler;
    if (srv->n_devices > 1 && s->rank < 0 && !s->group_scheduler && !hello->no_fds)
        return fail(ctx, KVS_EINVAL,
                    "this kvshared serves %u devices (one tensor-parallel group): a worker must "
                    "say its rank at connect (kvs_options_t.rank with KVS_RANK), the group's "
                    "scheduler KVS_GROUP_SCHEDULER; other clients connect with KVS_NO_MAP",
                    srv->n_devices);
    return 0;
}

/* With several devices, only the group's ranks and its scheduler change
 * blocks. Errors: KVS_EDENIED. */
static int group_writer_check(session_t *s, const char *rpc, handler_ctx_t *ctx)
{
    if (s->srv->n_devices <= 1 || s->rank >= 0 || s->group_scheduler)
        return 0;
    return fail(ctx, KVS_EDENIED,
                "%s: this kvshared serves %u devices; only a session that said its rank, or "
                "the group's scheduler, may write blocks",
                rpc, s->srv->n_devices);
}

/* Hello's model identity (HelloRequest.identity): what the worker declares,
 * its fields left 0 taken from the pool's, bound to or checked against its
 * namespace (namespaces_identity_declare); from then on every request of
 * the session is held to it (namespaces_resolve). */
static int hello_identity(session_t *s, const Kvshare__ModelIdentity *mi, uint32_t *ns,
                          handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    if (!mi)
        return 0;
    identity_t *id = calloc(1, sizeof(*id));
    if (!id)
        return fail(ctx, KVS_ENOMEM, "out of memory for the model identity");
    geometry_t g = srv->geo;
    const Kvshare__Geometry *dg = mi->geometry;
    bool bad_dtype = false;
    if (dg) {
        /* Fields left 0 are not declared: the pool's stand. */
        g.layers = dg->layers ? dg->layers : g.layers;
        g.kv_heads = dg->kv_heads ? dg->kv_heads : g.kv_heads;
        g.head_dim = dg->head_dim ? dg->head_dim : g.head_dim;
        g.block_tokens = dg->block_tokens ? dg->block_tokens : g.block_tokens;
        g.kv_lora_rank = dg->kv_lora_rank ? dg->kv_lora_rank : g.kv_lora_rank;
        g.rope_head_dim = dg->rope_head_dim ? dg->rope_head_dim : g.rope_head_dim;
        if (dg->dtype && dg->dtype[0])
            bad_dtype = geometry_dtype_parse(dg->dtype, &g.dtype) != 0;
    }
    uint32_t tp = mi->tp_size ? mi->tp_size : srv->ns.daemon_ident->id.tp_size;
    int rc = KVS_EINVAL;
    if (!mi->model || !identity_model_valid(mi->model))
        rc = fail(ctx, KVS_EINVAL,
                  "Hello's model identity needs a model name of 1 to %d bytes without control "
                  "characters",
                  IDENTITY_MODEL_MAX);
    else if (mi->revision && mi->revision[0] && !identity_revision_valid(mi->revision))
        rc = fail(ctx, KVS_EINVAL, "model revision: at most %d bytes, no spaces",
                  IDENTITY_REVISION_MAX);
    else if (bad_dtype)
        rc = fail(ctx, KVS_EINVAL, "model identity: unknown dtype (give fp32, fp16, bf16 or fp8)");
    else if (identity_make(mi->model, mi->revision, &g, tp, id) != 0)
        rc = fail(ctx, KVS_EINVAL, "model identity: the declared geometry is not valid");
    else
        rc = 0;
    if (rc != 0) {
        free(id);
        return rc;
    }
    s->ident = id;
    s->ident_hash = identity_hash(id);
    rc = namespaces_resolve(s, mi->ns, true, ns, ctx->msg, sizeof(ctx->msg));
    if (rc != 0) {
        free(s->ident);
        s->ident = NULL;
        s->ident_hash = 0;
        return rc; /* ctx->msg says why */
    }
    return 0;
}

int handler_hello(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__HelloRequest *hello = req->hello;

    if (s->hello_done || s->requests > 0)
        return fail(ctx, KVS_EPROTO,
                    "Hello must be the first request of a connection (and only one); "
                    "reconnect to map the pool again");
    if (hello->version / 1000 != KVS_VERSION_MAJOR)
        return fail(ctx, KVS_EVERSION,
                    "client protocol version %u.%u does not match kvshared %d.%d; use the "
                    "libkvshare of the same release",
                    hello->version / 1000, hello->version % 1000, KVS_VERSION_MAJOR,
                    KVS_VERSION_MINOR);
    /* Escaped: it is printed in log lines. */
    log_escape(hello->worker, s->worker, sizeof(s->worker));
    int rc0 = hello_group(s, hello, ctx);
    if (rc0 != 0)
        return rc0;
    uint32_t ident_ns = 0;
    rc0 = hello_identity(s, hello->identity, &ident_ns, ctx);
    if (rc0 != 0)
        return rc0;
    /* A worker maps its own device's pool only; the scheduler and the
     * monitoring tools map none. */
    backend_t *mine = srv->backends[s->rank > 0 ? s->rank : 0];

    backend_desc_t desc;
    backend_describe(mine, &desc);
    /* The reply outlives this frame's locals until it is packed: copy what
     * it points to into memory dispatch frees. */
    uint64_t *slabs = malloc(sizeof(uint64_t) * (desc.n_slabs ? desc.n_slabs : 1));
    uint8_t *uuid = malloc(BACKEND_UUID_LEN);
    ctx->heap[0] = slabs;
    ctx->heap[1] = uuid;
    if (!slabs || !uuid)
        return fail(ctx, KVS_ENOMEM, "out of memory building the Hello reply");
    memcpy(slabs, desc.slab_bytes, sizeof(uint64_t) * desc.n_slabs);
    memcpy(uuid, desc.device_uuid, BACKEND_UUID_LEN);
    if (!hello->no_fds && !s->group_scheduler) {
        size_t n_fds = 0;
        char why[320];
        int rc = backend_export(mine, s->fds, BACKEND_MAX_SLABS, &n_fds, why, sizeof(why));
        if (rc != 0)
            return fail(ctx, rc, "exporting the pool for this worker failed: %s", why);
        s->n_fds = n_fds;
    }
    /* Tier 2 goes only to a client that asks: one that does not would
     * count the fds as slabs (or lose the extra one to a short control
     * buffer). */
    bool tier2_fd = false;
    /* A rank reads its own device's shards of tier 2. */
    backend_t *tier_be = s->rank >= 0 ? srv->backends[s->rank] : srv->backend;
    if (!hello->no_fds && hello->map_tier2 && srv->tier2_blocks) {
        char why[320];
        int fd = -1;
        int rc = backend_tier_export_readonly(tier_be, &fd, why, sizeof(why));
        if (rc == KVS_EIO) {
            /* Read-only is a safeguard the system may not offer (no /proc):
             * the reader's mapping is PROT_READ all the same, and tier 2 is
             * sealed against every write but the daemon's own mapping
             * (backend_tier_open). */
            LOG_WARN("session %llu: %s; sending the tier-2 memfd read-write",
                     (unsigned long long)s->id, why);
            rc = backend_tier_export(tier_be, &fd, why, sizeof(why));
        }
        if (rc != 0) {
            for (size_t i = 0; i < s->n_fds; i++)
                close(s->fds[i]);
            s->n_fds = 0;
            return fail(ctx, rc, "exporting tier 2 for this worker failed: %s", why);
        }
        s->fds[s->n_fds++] = fd;
        tier2_fd = true;
    }
    s->hello_done = true;

    Kvshare__Geometry *g = &ctx->geometry;
    kvshare__geometry__init(g);
    g->layers = srv->geo.layers;
    g->kv_heads = srv->geo.kv_heads;
    g->head_dim = srv->geo.head_dim;
    g->dtype = (char *)geometry_dtype_name(srv->geo.dtype);
    g->dtype_bytes = geometry_dtype_bytes(srv->geo.dtype);
    g->block_tokens = srv->geo.block_tokens;
    g->kv_lora_rank = srv->geo.kv_lora_rank;
    g->rope_head_dim = srv->geo.rope_head_dim;

    Kvshare__HelloReply *r = &ctx->reply.hello;
    kvshare__hello_reply__init(r);
    r->version = KVS_PROTOCOL_VERSION;
    r->geometry = g;
    if (s->ident) {
        const ns_identity_t *ni = namespaces_identity(srv, ident_ns);
        r->identity = (char *)ni->text;
        r->identity_hash = ni->hash;
    }
    r->num_blocks = srv->num_blocks;
    r->block_bytes = srv->block_bytes;
    r->slot_bytes = geometry_slot_bytes(&srv->geo);
    r->block_stride = geometry_offset(&srv->geo, srv->num_blocks, 0, 0, 1);
    r->kv_stride =
        geometry_planes(&srv->geo) > 1 ? geometry_offset(&srv->geo, srv->num_blocks, 0, 1, 0) : 0;
    r->layer_stride = geometry_offset(&srv->geo, srv->num_blocks, 1, 0, 0);
    r->backend = (Kvshare__Backend)desc.kind;
    if (desc.kind == BACKEND_CUDA) {
        r->device_uuid.data = uuid;
        r->device_uuid.len = BACKEND_UUID_LEN;
    }
    r->pool_bytes = desc.size;
    r->n_slab_bytes = desc.n_slabs;
    r->slab_bytes = slabs;
    r->n_fds = (uint32_t)s->n_fds;
    r->session_id = s->id;
    r->tier2_blocks = srv->tier2_blocks;
    r->tier2_bytes = srv->tier2_blocks ? backend_tier_size(tier_be) : 0;
    r->tier2_fd = tier2_fd;
    r->rank = s->rank > 0 ? (uint32_t)s->rank : 0;
    r->group_size = srv->n_devices;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_HELLO;
    resp->hello = r;
    if (srv->n_devices > 1)
        LOG_INFO("session %llu: hello from '%s', pid %d, uid %u, %s %d of %u (%u fds)",
                 (unsigned long long)s->id, s->worker[0] ? s->worker : "?", (int)s->peer.pid,
                 s->peer.uid,
                 s->group_scheduler ? "scheduler"
                 : s->rank >= 0     ? "rank"
                                    : "monitor",
                 s->rank, srv->n_devices, r->n_fds);
    else
        LOG_INFO("session %llu: hello from '%s', pid %d, uid %u (%u fds)",
                 (unsigned long long)s->id, s->worker[0] ? s->worker : "?", (int)s->peer.pid,
                 s->peer.uid, r->n_fds);
    return 0;
}

int handler_lookup_answer(session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                          bool pin, bool in_place, bool waited, bool claim, Kvshare__Response *resp,
                          handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    size_t n_t1 = 0, n_t2 = 0;
    uint32_t *ids = NULL, inflight = 0;
    int rc = store_lookup(srv->store, s, ns, tokens, n_tokens, pin, in_place, waited, &ids, &n_t1,
                          &n_t2);
    if (rc == STORE_WAIT) {
        ctx->hold = tier_hold(s);
        return 0;
    }
    if (rc == KVS_ELIMIT)
        return over_pin_limit(s, n_t1, ctx);
    if (rc == KVS_ENOMEM)
        return fail(ctx, KVS_ENOMEM, "out of memory for a lookup of %zu tokens", n_tokens);
    if (rc != 0)
        return fail(ctx, rc, "lookup failed: %s", kvs_status_text(rc));
    size_t n_blocks = n_t1 + n_t2;
    /* Telling what is in flight is advice: without memory for it, none. */
    if (inflight_count(srv, s, ns, tokens, n_tokens, n_blocks, &inflight) != 0)
        inflight = 0;
    /* A waiting worker computes what it misses: others wait for it. */
    if (claim && inflight == 0)
        inflight_claim(srv, s, ns, tokens, n_tokens, n_blocks);

    /* The tier-2 part by block number in tier 2 (the index's ids follow the
     * pool's). */
    for (size_t i = n_t1; i < n_blocks; i++)
        ids[i] -= srv->num_blocks;
    srv->metrics.tier2_in_place_blocks += n_t2;
    Kvshare__LookupReply *r = &ctx->reply.lookup;
    kvshare__lookup_reply__init(r);
    r->n_block_ids = n_t1;
    r->block_ids = ids;
    r->n_tier2_block_ids = n_t2;
    r->tier2_block_ids = n_t2 ? ids + n_t1 : NULL;
    r->hit_tokens = (uint32_t)(n_blocks * srv->geo.block_tokens);
    r->inflight_blocks = inflight;
    r->waited = waited;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
    resp->lookup = r;
    return 0;
}

/* Lookup: the cached prefix at once, or with wait_ms > 0 and blocks after
 * it that other sessions are writing, held until they are committed (see
 * inflight.h), then answered with what is cached. */
int handler_lookup(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                   handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__LookupRequest *lk = req->lookup;
    const uint32_t *tokens = NULL;
    size_t n_tokens = 0;
    uint32_t ns;
    void *copy = NULL;

    int rc = tokens_view(srv, &lk->tokens, &tokens, &n_tokens, &copy, ctx);
    if (rc != 0)
        return rc;
    ctx->heap[0] = copy;
    if (lk->wait_ms > KVS_LOOKUP_MAX_WAIT_MS)
        return fail(ctx, KVS_EINVAL, "lookup wait_ms %u is over the limit of %u ms", lk->wait_ms,
                    KVS_LOOKUP_MAX_WAIT_MS);
    if (lk->tier2_in_place && !lk->pin)
        return fail(ctx, KVS_EINVAL,
                    "lookup with tier2_in_place must pin: tier-2 blocks are named only while "
                    "this session pins them");
    rc = ns_resolve(s, lk->ns, true, &ns, ctx);
    if (rc != 0)
        return rc;
    /* A new lookup ends this session's claims: it never waits for itself. */
    inflight_unclaim(srv, s);
    /* One that was held for writers, or for tier copies, answers now (a
     * lookup that waited answers without promoting). */
    session_hold_reason_t rerun = session_rerun(s);
    bool waited = rerun == SESSION_HOLD_INFLIGHT;
    /* A miss in a shared namespace asks the cluster tier first, once. */
    if (rerun == SESSION_HOLD_NONE && srv->cluster &&
        cluster_store_fetch(s, ns, tokens, n_tokens, &ctx->hold_until_ms) == 0) {
        ctx->hold = SESSION_HOLD_CLUSTER;
        return 0;
    }
    if (lk->wait_ms > 0 && !srv->stopping && rerun != SESSION_HOLD_INFLIGHT &&
        rerun != SESSION_HOLD_TIER_JOB && rerun != SESSION_HOLD_TIER_ANY &&
        inflight_declared(srv) > 0) {
        uint32_t *ids, inflight = 0;
        size_t max_ids = n_tokens / srv->geo.block_tokens, cached = 0;
        if (max_ids > srv->num_blocks)
            max_ids = srv->num_blocks;
        if (session_scratch(s, max_ids ? max_ids : 1, &ids) != 0)
            return fail(ctx, KVS_ENOMEM, "out of memory for a lookup of %zu tokens", n_tokens);
        rc = radix_match(srv->index, ns, tokens, n_tokens, ids, max_ids, &cached);
        if (rc == 0)
            rc = inflight_count(srv, s, ns, tokens, n_tokens, cached, &inflight);
        if (rc == 0 && inflight > 0) {
            rc = inflight_park(srv, s, ns, tokens, n_tokens, lk->wait_ms);
            if (rc == 0) {
                ctx->hold = SESSION_HOLD_INFLIGHT;
                ctx->hold_until_ms = s->wait->deadline_ms;
                return 0;
            }
        }
        /* Without memory to wait, answer now: waiting is an optimisation. */
    }
    return handler_lookup_answer(s, ns, tokens, n_tokens, lk->pin, lk->tier2_in_place, waited,
                                 lk->wait_ms > 0, resp, ctx);
}

/* A failed Alloc gives back the blocks its earlier pieces took (ids[0 ..
 * s->steps.alloc_done)): all or none. */
static void alloc_give_back(session_t *s, const uint32_t *ids)
{
    for (uint32_t i = 0; i < s->steps.alloc_done; i++)
        if (store_release(s->srv->store, s, ids[i], NULL) != 0)
            LOG_ERROR("session %llu: block %u of a failed alloc could not be given back",
                      (unsigned long long)s->id, ids[i]);
    s->steps.alloc_done = 0;
}

/* An Alloc of many blocks in pieces of STORE_PIECE_BLOCKS, one per loop
 * turn, like a Commit's (commit_pieces): after each but the last the
 * session is held (SESSION_HOLD_ALLOC, a deadline of now) and its frame
 * runs again for the next piece; the ids taken so far wait in the scratch.
 * A piece that must evict evicts in pieces too (store_alloc: STORE_MORE).
 * A piece that fails gives back the blocks the earlier ones took: an
 * Alloc takes all its blocks or none. Only a session with a socket, for
 * an Alloc that does not ask for its evicted blocks (the report would
 * span turns), goes in pieces. Returns STORE_MORE when held (ctx->hold
 * set), else store_alloc's status with every block taken (0) or none;
 * the evictions of every piece add up in s->steps.alloc_evicted. */
static int alloc_pieces(session_t *s, uint32_t ns, uint32_t n, const uint64_t *hashes,
                        uint32_t *ids, size_t *evicted, store_evicted_t *report, handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    bool pieces = s->sock.has_pipe && !srv->stopping && !report->want;
    uint32_t done = s->steps.alloc_done, k = n - done;
    if (pieces && k > STORE_PIECE_BLOCKS)
        k = STORE_PIECE_BLOCKS;
    *evicted = 0;
    int rc = store_alloc(srv->store, s, ns, k, hashes ? hashes + done : NULL, ids + done, evicted,
                         report);
    s->steps.alloc_evicted += *evicted;
    if (rc == 0) {
        done += k;
        s->steps.alloc_done = done;
        if (done == n)
            return 0;
        rc = STORE_MORE;
    }
    if (rc == STORE_MORE || rc == STORE_WAIT) {
        s->steps.alloc = true; /* the frame runs again: held here or for copies */
        if (rc == STORE_MORE) {
            uint64_t now = uv_now(srv->loop);
            ctx->hold = SESSION_HOLD_ALLOC;
            ctx->hold_until_ms = now ? now : 1; /* 0 would mean no deadline */
        }
        return rc;
    }
    alloc_give_back(s, ids);
    return rc;
}

/* A rank's Alloc that declares its prefixes (several devices): a block
 * another member of the group declared for the same prefix, and whose
 * shard of this rank is not committed, is given to this rank too, so that
 * ranks that do not talk to each other (SGLang's tensor-parallel ranks, each
 * storing the same pages) write their shards into one block id; the other
 * positions get new blocks (store_alloc). A joined block stays its
 * writer's: this rank commits its shard of it, as of any block of its
 * group. Returns store_alloc's codes. */
static int alloc_joining(server_t *srv, session_t *s, uint32_t ns, uint32_t n,
                         const uint64_t *hashes, uint32_t *ids, size_t *evicted,
                         store_evicted_t *report)
{
    uint64_t *fresh_hashes = malloc(n * (sizeof(uint64_t) + 2 * sizeof(uint32_t)));
    if (!fresh_hashes)
        return KVS_ENOMEM;
    uint32_t *fresh_ids = (uint32_t *)(fresh_hashes + n), *fresh_pos = fresh_ids + n;
    uint32_t n_fresh = 0;
    store_mark_begin(srv->store);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = inflight_group_block(srv, s, ns, hashes[i]);
        if (b != UINT32_MAX) {
            store_mark(srv->store, b);
            ids[i] = b;
            continue;
        }
        fresh_hashes[n_fresh] = hashes[i];
        fresh_pos[n_fresh++] = i;
    }
    int rc = n_fresh == 0 ? 0
                          : store_alloc(srv->store, s, ns, n_fresh, fresh_hashes, fresh_ids,
                                        evicted, report);
    for (uint32_t k = 0; rc == 0 && k < n_fresh; k++)
        ids[fresh_pos[k]] = fresh_ids[k];
    if (rc == 0 && n_fresh < n)
        LOG_DEBUG("session %llu (rank %d): alloc of %u blocks joined %u its group declared",
                  (unsigned long long)s->id, s->rank, n, n - n_fresh);
    free(fresh_hashes);
    return rc;
}

static int alloc_run(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                     handler_ctx_t *ctx);

/* Alloc: the checks and the pieces are alloc_run's; here, an Alloc that
 * fails after earlier pieces took blocks (a check that no longer passes
 * when its frame runs again) gives them back: all or none. */
int handler_alloc(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    bool resumed = s->steps.alloc;
    s->steps.alloc = false;
    if (!resumed) {
        s->steps.alloc_done = 0;
        s->steps.alloc_evicted = 0;
    }
    int rc = alloc_run(s, req, resp, ctx);
    if (rc != 0)
        alloc_give_back(s, s->own.scratch);
    return rc;
}

static int alloc_run(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                     handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__AllocRequest *al = req->alloc;
    uint32_t ns = RADIX_NS_ANY, *ids;
    size_t evicted = 0;

    int grc = group_writer_check(s, "Alloc", ctx);
    if (grc != 0)
        return grc;
    if (al->n == 0 || al->n > srv->num_blocks)
        return fail(ctx, KVS_EINVAL, "alloc of %u blocks: ask for 1 to %u (the pool size)", al->n,
                    srv->num_blocks);
    /* Its work is linear in its blocks, bounded as a prompt's
     * (tokens_view); evictions to make room go in pieces (store_alloc). */
    if (al->n > srv->cfg.max_prompt_blocks)
        return fail(ctx, KVS_ELIMIT,
                    "alloc of %u blocks is over max_prompt_blocks (%u): allocations this "
                    "large would hold every client back; allocate in pieces",
                    al->n, srv->cfg.max_prompt_blocks);
    if (al->ns && al->ns[0]) {
        int rc = ns_resolve(s, al->ns, true, &ns, ctx);
        if (rc != 0)
            return rc;
    }
    /* A declaration of what the blocks will hold (inflight.h). */
    const uint64_t *hashes = NULL;
    if (al->report_evicted && ns == RADIX_NS_ANY)
        return fail(ctx, KVS_EINVAL,
                    "an alloc that asks for its evicted blocks must name its "
                    "namespace (only that namespace's blocks are reported)");
    if (al->tokens.len > 0) {
        const uint32_t *tokens;
        size_t n_tokens;
        void *copy = NULL;
        if (ns == RADIX_NS_ANY)
            return fail(ctx, KVS_EINVAL,
                        "an alloc that declares its prefix (tokens) must name its namespace");
        int rc = tokens_view(srv, &al->tokens, &tokens, &n_tokens, &copy, ctx);
        if (rc != 0)
            return rc;
        ctx->heap[0] = copy;
        size_t n_full = n_tokens / srv->geo.block_tokens;
        if ((uint64_t)al->first_block + al->n > n_full)
            return fail(ctx, KVS_EINVAL,
                        "alloc declares blocks %u..%u of a prompt of %zu full blocks (%zu "
                        "tokens, %u per block)",
                        al->first_block, al->first_block + al->n - 1, n_full, n_tokens,
                        srv->geo.block_tokens);
        rc = inflight_hashes(srv, ns, tokens, al->first_block + al->n, &hashes);
        if (rc != 0)
            return fail(ctx, rc, "declaring the alloc's prefix failed: %s", kvs_status_text(rc));
        hashes += al->first_block;
    } else if (al->first_block > 0) {
        return fail(ctx, KVS_EINVAL, "alloc first_block %u without the tokens it counts in",
                    al->first_block);
    }
    /* On the next piece of this frame's Alloc (alloc_pieces), the blocks
     * it took so far are this session's WRITING blocks already. */
    uint32_t left = al->n - s->steps.alloc_done;
    if (srv->cfg.session_max_writing &&
        (uint64_t)s->own.n_writing + left > srv->cfg.session_max_writing) {
        srv->metrics.session_limit_refusals++;
        return fail(ctx, KVS_ELIMIT,
                    "session limit session_max_writing = %u: this session holds %u WRITING "
                    "blocks and asked for %u more; commit or release blocks first",
                    srv->cfg.session_max_writing, s->own.n_writing, left);
    }
    if (session_scratch(s, al->n, &ids) != 0 || session_writing_reserve(s, left) != 0)
        return fail(ctx, KVS_ENOMEM, "out of memory for an alloc of %u blocks", al->n);

    store_evicted_t report = {.want = al->report_evicted, .ns = ns};
    int rc;
    if (hashes && s->rank >= 0 && srv->n_devices > 1) {
        rc = alloc_joining(srv, s, ns, al->n, hashes, ids, &evicted, &report);
    } else {
        rc = alloc_pieces(s, ns, al->n, hashes, ids, &evicted, &report, ctx);
        if (rc == STORE_MORE)
            return 0; /* held for the next piece */
    }
    /* Freed by dispatch with the reply it travels in. */
    ctx->heap[1] = report.tokens;
    if (rc == STORE_WAIT) {
        ctx->hold = tier_hold(s);
        return 0;
    }
    evicted = (size_t)s->steps.alloc_evicted;
    if (rc == KVS_EPOOLFULL) {
        pool_counts_t c;
        pool_counts(srv->pool, &c);
        return fail(ctx, KVS_EPOOLFULL,
                    "pool full: %u blocks wanted, %u free after evicting %zu; %u are being "
                    "written and %u of %u cached are pinned (release blocks or grow the pool)",
                    al->n, c.free, evicted, c.writing, radix_pinned_blocks(srv->index), c.cached);
    }
    if (rc != 0)
        return fail(ctx, rc, "alloc failed: %s", kvs_status_text(rc));

    Kvshare__AllocReply *r = &ctx->reply.alloc;
    kvshare__alloc_reply__init(r);
    r->n_block_ids = al->n;
    r->block_ids = ids;
    r->evicted = (uint32_t)evicted;
    if (report.tokens) {
        r->evicted_tokens.data = report.tokens;
        r->evicted_tokens.len = report.n * srv->geo.block_tokens * 4;
    }
    resp->rpc_case = KVSHARE__RESPONSE__RPC_ALLOC;
    resp->alloc = r;
    return 0;
}

/* Why block b cannot be committed or released by s, as a status + message. */
static int not_held(session_t *s, uint32_t b, handler_ctx_t *ctx)
{
    pool_state_t st = POOL_FREE;
    if (store_writer(s->srv->store, b) && store_writer(s->srv->store, b) != s)
        return fail(ctx, KVS_ENOTHELD,
                    "block %u is not held by this session: another session is writing it", b);
    pool_state(s->srv->pool, b, &st);
    /* Another namespace's block, to a peer that may not use it, looks free. */
    if (st == POOL_FREE || !namespaces_allowed(s, store_block_ns(s->srv->store, b)))
        return fail(ctx, KVS_ENOTHELD,
                    "block %u is not held by this session: it is free (released twice, or "
                    "never allocated)",
                    b);
    return fail(ctx, KVS_ENOTHELD,
                "block %u is not held by this session: it is cached and this session holds no "
                "pin on it",
                b);
}

/* Why the cached block b, pinned by this session, cannot stand at position i
 * of this commit: the index holds another block there, or nothing. */
static int not_at_position(uint32_t b, size_t i, size_t n_matched, const uint32_t *matched,
                           const char *ns_name, handler_ctx_t *ctx)
{
    if (i < n_matched)
        return fail(ctx, KVS_EEXIST,
                    "block %u is cached but does not hold block %zu of these tokens in namespace "
                    "'%s' (block %u does): name a cached block only where Lookup returned it",
                    b, i, ns_name, matched[i]);
    return fail(ctx, KVS_EEXIST,
                "block %u is cached but does not hold block %zu of these tokens in namespace '%s' "
                "(no block does: only the first %zu are cached): name a cached block only where "
                "Lookup returned it",
                b, i, ns_name, n_matched);
}

/* A commit for the group (several devices): every block this session
 * writes must have every rank's shard declared for these very tokens
 * (store_mark_group), else the commit is refused with the ranks missing
 * and nothing changes: a rank must never read bytes another prompt left in
 * a block it did not write again. */
static int group_complete_check(session_t *s, uint32_t ns, const uint32_t *tokens,
                                const uint32_t *ids, size_t n_ids, handler_ctx_t *ctx)
{
    size_t bad = 0;
    uint64_t missing = 0;
    int rc = store_mark_group(s->srv->store, s, ns, tokens, ids, n_ids, &bad, &missing);
    if (rc == 0)
        return 0;
    if (rc != KVS_EBADSTATE)
        return fail(ctx, rc, "commit for the group failed: %s", kvs_status_text(rc));
    char ranks[256];
    size_t len = 0;
    unsigned n_missing = 0;
    ranks[0] = '\0';
    for (uint32_t r = 0; r < s->srv->n_devices && r < 64; r++) {
        if (!(missing & ((uint64_t)1 << r)))
            continue;
        int w = snprintf(ranks + len, sizeof(ranks) - len, "%s%u", n_missing ? ", " : "", r);
        n_missing++;
        if (w < 0 || (size_t)w >= sizeof(ranks) - len)
            break; /* the list is cut; the count below is whole */
        len += (size_t)w;
    }
    return fail(ctx, KVS_EBADSTATE,
                "commit for the group refused: block %u (block %zu of these tokens) lacks the "
                "shard of %u rank(s): %s; each rank declares its shard written for these tokens "
                "(a commit of its shard, or kvs_commit_opts_t.shard_written) before the group's "
                "commit; nothing was committed",
                ids[bad], bad, n_missing, ranks);
}

/* handler_commit's checks, before anything changes: every block must be
 * WRITING and held by this session, or cached and pinned by it at its
 * position, and named once; the namespace, the pin limit, room for the
 * reply (canonical) and for the pins. */
static int commit_check(session_t *s, const Kvshare__CommitRequest *cm, bool shard,
                        const uint32_t *tokens, size_t n_tokens, uint32_t *ns, uint32_t **canonical,
                        handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    size_t n_ids = cm->n_block_ids, n_named_cached = 0;
    int rc;

    store_mark_begin(srv->store);
    for (size_t i = 0; i < n_ids; i++) {
        uint32_t b = cm->block_ids[i];
        rc = check_range(s, b, ctx);
        if (rc != 0)
            return rc;
        session_t *w = store_writer(srv->store, b);
        /* A rank commits its shard of the blocks its group writes. */
        bool group_block = shard && w && (w->rank >= 0 || w->group_scheduler);
        if (w != s && !group_block) {
            pool_state_t st = POOL_FREE;
            if (w)
                return not_held(s, b, ctx);
            pool_state(srv->pool, b, &st);
            /* Another namespace's block, to a peer that may not use it,
             * looks free (see handler_pin). */
            if (st != POOL_CACHED || !namespaces_allowed(s, store_block_ns(srv->store, b)))
                return fail(ctx, KVS_EBADSTATE,
                            "block %u is not in WRITING (it is free): commit only blocks this "
                            "session got from Alloc (once), or cached blocks it pinned",
                            b);
            /* A rank's shard of a cached block adds nothing: its position
             * is checked below, the pin is not needed. */
            if (!shard && session_pin_count(s, b) == 0)
                return fail(ctx, KVS_ENOTHELD,
                            "block %u is cached but this session holds no pin on it (other "
                            "sessions' pins do not count): commit a cached block only while "
                            "holding a pin on it from Lookup or Pin",
                            b);
            n_named_cached++;
        }
        if (store_mark(srv->store, b))
            return fail(ctx, KVS_EINVAL, "block %u appears twice in this commit", b);
    }
    /* A commit naming cached blocks does not create its namespace: they
     * cannot be in one that does not exist. */
    rc = ns_resolve(s, cm->ns, n_named_cached == 0, ns, ctx);
    if (rc != 0)
        return rc;
    /* Cached blocks named here are pinned by this session already. */
    rc = over_pin_limit_check(s, n_ids - n_named_cached, ctx);
    if (rc != 0)
        return rc;
    if (session_scratch(s, n_ids ? 2 * n_ids : 1, canonical) != 0 ||
        session_pins_reserve(s, (uint32_t)n_ids) != 0)
        return fail(ctx, KVS_ENOMEM, "out of memory for a commit of %zu blocks", n_ids);
    if (n_named_cached > 0) {
        /* Read-only: checking the positions must not count as a lookup. */
        uint32_t *matched = *canonical + n_ids;
        size_t n_matched = 0;
        rc = radix_match(srv->index, *ns, tokens, n_tokens, matched, n_ids, &n_matched);
        if (rc != 0)
            return fail(ctx, rc, "commit check failed: %s", kvs_status_text(rc));
        for (size_t i = 0; i < n_ids; i++) {
            uint32_t b = cm->block_ids[i];
            if (!store_writer(srv->store, b) && (i >= n_matched || matched[i] != b))
                return not_at_position(b, i, n_matched, matched, radix_ns_name(srv->index, *ns),
                                       ctx);
        }
    }
    return 0;
}

/* Times one Commit waits for tier copies to end when its prompt runs
 * through a block in flight between the tiers; then KVS_EBUSY, as before
 * (a block pinned where it is stays busy however long it waits). */
#define COMMIT_TIER_WAITS 8

/* The rest of a commit on one device, a piece of STORE_PIECE_BLOCKS blocks
 * per loop turn when it is larger: after a piece with more to do, the
 * session is held (SESSION_HOLD_COMMIT) with a deadline of now, so that
 * the hold timer runs its frame again in the next turn, after other
 * sessions' requests, and the Commit goes on where it stopped
 * (session_t.steps.commit). Between two pieces the blocks committed so far
 * are cached and pinned by this session, the rest still WRITING and held by
 * it: nothing another session does can change them, and this session's
 * later frames wait behind the held one. A reader meanwhile finds the
 * prefix committed so far, as of a commit that stopped there. Returns
 * true when held for the next piece. */
static bool commit_pieces(session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                          const uint32_t *ids, size_t n_ids, size_t first, const store_hint_t *hint,
                          uint32_t *canonical, size_t *n_done, int *irc, handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    /* Sessions without a socket (tests) are never held; when stopping,
     * there is no next turn. */
    bool pieces = s->sock.has_pipe && !srv->stopping && n_ids - first > STORE_PIECE_BLOCKS;
    size_t end = pieces ? first + STORE_PIECE_BLOCKS : n_ids;
    *irc = store_commit_range(srv->store, s, ns, tokens, n_tokens, ids, first, end, hint, canonical,
                              n_done);
    if (*irc == KVS_EBUSY && s->sock.has_pipe && !srv->stopping &&
        s->steps.commit_waits < COMMIT_TIER_WAITS && radix_busy_blocks(srv->index) > 0 &&
        tier_wait(srv, s) == 1) {
        /* The prompt runs through a cached block being copied between the
         * tiers (a spill to the disk, which no request waits for): once
         * the copies end it is a block again, and the Commit goes on from
         * where it stopped. */
        s->steps.commit_waits++;
        s->steps.commit = true;
        s->steps.commit_ns = ns;
        s->steps.commit_done = *n_done;
        ctx->hold = tier_hold(s);
        return true;
    }
    s->steps.commit = *irc == 0 && end < n_ids;
    if (!s->steps.commit)
        return false;
    uint64_t now = uv_now(srv->loop);
    s->steps.commit_ns = ns;
    s->steps.commit_done = *n_done;
    ctx->hold = SESSION_HOLD_COMMIT;
    ctx->hold_until_ms = now ? now : 1; /* 0 would mean no deadline */
    return true;
}

/*
 * Commit: block i of the prompt is either a WRITING block of this session
 * (it becomes cached, or stays WRITING as a duplicate when another block
 * holds that prefix), or a CACHED block this session holds a pin on and that
 * already holds prefix i (a block from this session's Lookup: it lets a
 * worker commit its whole prompt without allocating for the hit part). The
 * request is checked in full first, so a refused block changes nothing.
 * Pins: each canonical block gets one pin, except the cached blocks named
 * here, on which the session keeps the pin it already has and gains none.
 * A large commit on one device runs in pieces, one per loop turn
 * (commit_pieces).
 */
int handler_commit(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                   handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__CommitRequest *cm = req->commit;
    const uint32_t *tokens;
    size_t n_tokens, n_ids = cm->n_block_ids, n_done = 0, first = 0;
    uint32_t ns, *canonical;
    void *copy = NULL;

    /* The next piece of this frame's Commit: checked at its first. */
    bool resumed = s->steps.commit;
    s->steps.commit = false;
    if (!resumed)
        s->steps.commit_waits = 0;
    int rc = resumed ? 0 : group_writer_check(s, "Commit", ctx);
    if (rc != 0)
        return rc;
    /* Several devices: a rank commits its own shard unless it says it
     * commits for the group; a session without a rank only for the group. */
    bool shard = srv->n_devices > 1 && s->rank >= 0 && !cm->for_group;
    if (srv->n_devices > 1 && s->rank < 0 && !cm->for_group)
        return fail(ctx, KVS_EINVAL,
                    "this kvshared serves %u devices: a session without a rank commits only "
                    "for the whole group, after every rank wrote its shard "
                    "(kvs_commit_opts_t.for_group)",
                    srv->n_devices);
    if (cm->shard_written && cm->for_group)
        return fail(ctx, KVS_EINVAL,
                    "a commit either declares this rank's shard written (shard_written) or "
                    "caches the blocks for the group (for_group), not both");
    rc = tokens_view(srv, &cm->tokens, &tokens, &n_tokens, &copy, ctx);
    if (rc != 0)
        return rc;
    ctx->heap[0] = copy;
    rc = hint_check(cm->hint, ctx);
    if (rc != 0)
        return rc;
    if (n_ids > n_tokens / srv->geo.block_tokens)
        return fail(ctx, KVS_EINVAL,
                    "commit of %zu blocks needs at least %zu tokens (%u per block); got %zu", n_ids,
                    n_ids * srv->geo.block_tokens, srv->geo.block_tokens, n_tokens);
    if (resumed) {
        ns = s->steps.commit_ns;
        first = s->steps.commit_done;
        canonical = s->own.scratch;
    } else {
        rc = commit_check(s, cm, shard, tokens, n_tokens, &ns, &canonical, ctx);
        if (rc != 0)
            return rc;
    }

    store_hint_t hint = hint_of(cm->hint);
    size_t n_pending = 0;
    int irc;
    if (shard) {
        irc = store_commit_shard(srv->store, s, ns, tokens, n_tokens, cm->block_ids, n_ids,
                                 cm->shard_written, &hint, canonical, &n_done, &n_pending);
        if (irc == KVS_EINVAL)
            return fail(ctx, irc,
                        "rank %d: a block of this commit was committed by another rank for "
                        "another prefix; every rank commits the same tokens and block ids",
                        s->rank);
        if (irc == KVS_EBADSTATE)
            return fail(ctx, irc,
                        "rank %d: a block of this commit was freed before this rank's shard of "
                        "these tokens came, and is allocated again: a late commit is refused, "
                        "nothing changed",
                        s->rank);
    } else if (srv->n_devices > 1) {
        irc = group_complete_check(s, ns, tokens, cm->block_ids, n_ids, ctx);
        if (irc != 0)
            return irc;
        irc = store_commit(srv->store, s, ns, tokens, n_tokens, cm->block_ids, n_ids, &hint,
                           canonical, &n_done);
    } else if (commit_pieces(s, ns, tokens, n_tokens, cm->block_ids, n_ids, first, &hint, canonical,
                             &n_done, &irc, ctx)) {
        return 0;
    }

    Kvshare__CommitReply *r = &ctx->reply.commit;
    kvshare__commit_reply__init(r);
    r->n_canonical = n_done;
    r->canonical = canonical;
    r->n_committed = (uint32_t)n_done;
    r->n_pending = (uint32_t)n_pending;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_COMMIT;
    resp->commit = r;
    if (irc == KVS_EQUOTA) {
        return fail(ctx, irc,
                    "namespace quota reached: %zu of %zu blocks committed, the rest stay "
                    "WRITING (release them)",
                    n_done, n_ids);
    }
    if (irc != 0)
        return fail(ctx, irc, "commit stopped after %zu of %zu blocks: %s", n_done, n_ids,
                    kvs_status_text(irc));
    return 0;
}

int handler_pin(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                handler_ctx_t *ctx)
{
    const Kvshare__PinRequest *pn = req->pin;
    Kvshare__PinReply *r = &ctx->reply.pin;
    int rc = 0;

    kvshare__pin_reply__init(r);
    resp->rpc_case = KVSHARE__RESPONSE__RPC_PIN;
    resp->pin = r;
    if (pn->n_block_ids > s->srv->num_blocks)
        return fail(ctx, KVS_EINVAL, "pin of %zu blocks in one request: at most %u (the pool size)",
                    pn->n_block_ids, s->srv->num_blocks);
    rc = hint_check(pn->hint, ctx);
    if (rc != 0)
        return rc;
    rc = over_pin_limit_check(s, pn->n_block_ids, ctx);
    if (rc != 0)
        return rc;
    if (session_pins_reserve(s, (uint32_t)pn->n_block_ids) != 0)
        return fail(ctx, KVS_ENOMEM, "out of memory pinning %zu blocks", pn->n_block_ids);
    store_hint_t hint = hint_of(pn->hint);
    for (size_t i = 0; i < pn->n_block_ids; i++) {
        uint32_t b = pn->block_ids[i];
        rc = check_range(s, b, ctx);
        if (rc != 0)
            break;
        rc = store_pin(s->srv->store, s, b, &hint);
        if (rc == KVS_ENOTFOUND) {
            fail(ctx, rc,
                 "block %u is not cached (evicted, or not committed yet); %u of %zu blocks "
                 "pinned: look the prefix up again",
                 b, r->n_pinned, pn->n_block_ids);
            break;
        }
        if (rc != 0) {
            fail(ctx, rc, "pin of block %u failed: %s", b, kvs_status_text(rc));
            break;
        }
        r->n_pinned++;
    }
    return rc;
}

int handler_release(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                    handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__ReleaseRequest *rl = req->release;
    Kvshare__ReleaseReply *r = &ctx->reply.release;
    int rc = 0;

    kvshare__release_reply__init(r);
    resp->rpc_case = KVSHARE__RESPONSE__RPC_RELEASE;
    resp->release = r;
    rc = hint_check(rl->hint, ctx);
    if (rc != 0)
        return rc;
    store_hint_t hint = hint_of(rl->hint);
    /* In order; on an error the blocks before it stay released and
     * n_released says how many. */
    for (size_t i = 0; i < rl->n_block_ids; i++) {
        uint32_t b = rl->block_ids[i];
        rc = check_range(s, b, ctx);
        if (rc != 0)
            break;
        rc = store_release(srv->store, s, b, &hint);
        if (rc == KVS_ENOTHELD) {
            rc = not_held(s, b, ctx);
            break;
        }
        if (rc != 0) {
            rc = fail(ctx, KVS_EINTERNAL, "block %u: this session's pin is not in the index (%s)",
                      b, kvs_status_text(rc));
            break;
        }
        r->n_released++;
    }
    /* Then the tier-2 pins of lookups with tier2_in_place, named by block
     * number in tier 2; the session pins them by index id. */
    for (size_t i = 0; rc == 0 && i < rl->n_tier2_block_ids; i++) {
        uint32_t t = rl->tier2_block_ids[i];
        if (t >= srv->tier2_blocks) {
            rc = srv->tier2_blocks
                     ? fail(ctx, KVS_EINVAL,
                            "tier-2 block %u is out of range: tier 2 has %u blocks (0..%u)", t,
                            srv->tier2_blocks, srv->tier2_blocks - 1)
                     : fail(ctx, KVS_EINVAL,
                            "tier-2 block %u named, but this kvshared has no tier 2 "
                            "(--host-tier)",
                            t);
            break;
        }
        uint32_t b = srv->num_blocks + t;
        if (session_pin_count(s, b) == 0) {
            rc = fail(ctx, KVS_ENOTHELD,
                      "tier-2 block %u is not held by this session: no pin of a lookup with "
                      "tier2_in_place (released twice?)",
                      t);
            break;
        }
        rc = store_release(srv->store, s, b, &hint);
        if (rc != 0) {
            rc = fail(ctx, KVS_EINTERNAL,
                      "tier-2 block %u: this session's pin is not in the index (%s)", t,
                      kvs_status_text(rc));
            break;
        }
        r->n_released++;
    }
    return rc;
}

/* Bytes stats_devices needs: per device a pointer, a row and three counts. */
static size_t stats_devices_bytes(const server_t *srv)
{
    return srv->n_devices *
           (sizeof(Kvshare__DeviceStats *) + sizeof(Kvshare__DeviceStats) + 3 * sizeof(uint32_t));
}

/* One row per device into r, built in mem (stats_devices_bytes of it):
 * its pool, the blocks in use (the same ids on every device), the workers
 * of its rank and the shards of blocks still being written. */
static void stats_devices(const server_t *srv, void *mem, uint32_t used_blocks,
                          Kvshare__StatsReply *r)
{
    uint32_t n = srv->n_devices;
    Kvshare__DeviceStats **ptrs = mem;
    Kvshare__DeviceStats *rows = (void *)(ptrs + n);
    uint32_t *written = (void *)(rows + n), *missing = written + n, *workers = missing + n;
    if (n == 0)
        return;
    store_device_counts(srv->store, written, missing, workers);
    for (uint32_t d = 0; d < n; d++) {
        Kvshare__DeviceStats *row = &rows[d];
        kvshare__device_stats__init(row);
        row->rank = d;
        row->ordinal = srv->device_ordinals[d];
        row->detail = (char *)backend_detail(srv->backends[d]);
        row->pool_bytes = backend_size(srv->backends[d]);
        row->used_bytes = (uint64_t)used_blocks * srv->block_bytes;
        row->shards_written = written[d];
        row->shards_missing = missing[d];
        row->workers = workers[d];
        ptrs[d] = row;
    }
    r->n_devices = n;
    r->devices = ptrs;
}

/* The cluster tier's nodes into r (one allocation, freed with the reply
 * through ctx->heap[3]). */
static int stats_cluster_nodes(server_t *srv, Kvshare__StatsReply *r, handler_ctx_t *ctx)
{
    if (!srv->cluster)
        return 0;
    cluster_node_stats_t nodes[CLUSTER_MAX_NODES];
    size_t n = cluster_store_nodes(srv, nodes, CLUSTER_MAX_NODES);
    if (n == 0)
        return 0;
    size_t bytes = n * (sizeof(void *) + sizeof(Kvshare__ClusterNode) + CLUSTER_ADDR_MAX);
    void *mem = malloc(bytes);
    if (!mem)
        return fail(ctx, KVS_ENOMEM, "out of memory for the stats of %zu cluster nodes", n);
    ctx->heap[3] = mem;
    Kvshare__ClusterNode **ptrs = mem;
    Kvshare__ClusterNode *rows = (void *)(ptrs + n);
    char *addrs = (void *)(rows + n);
    for (size_t i = 0; i < n; i++) {
        kvshare__cluster_node__init(&rows[i]);
        memcpy(addrs + i * CLUSTER_ADDR_MAX, nodes[i].addr, CLUSTER_ADDR_MAX);
        rows[i].address = addrs + i * CLUSTER_ADDR_MAX;
        rows[i].slots = nodes[i].slots;
        rows[i].state = (char *)cluster_node_state_name(nodes[i].state);
        rows[i].requests = nodes[i].requests;
        rows[i].errors = nodes[i].errors;
        rows[i].replies = nodes[i].replies;
        rows[i].latency_us_sum = nodes[i].latency_us_sum;
        rows[i].latency_us_max = nodes[i].latency_us_max;
        ptrs[i] = &rows[i];
    }
    r->n_cluster_nodes = n;
    r->cluster_nodes = ptrs;
    return 0;
}

int handler_stats(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    Kvshare__StatsReply *r = &ctx->reply.stats;
    pool_counts_t c;
    (void)req;

    kvshare__stats_reply__init(r);
    pool_counts(srv->pool, &c);
    r->total_blocks = c.total;
    r->free_blocks = c.free;
    r->writing_blocks = c.writing;
    r->cached_blocks = c.cached;
    r->pinned_blocks = radix_pinned_blocks(srv->index);
    r->sessions = srv->sessions.len;
    /* Every counter in the list (a copy: dispatch counts this request
     * before the reply is packed), and the named fields older clients read. */
    store_sync_counters(srv->store);
    uint64_t *counters = malloc(sizeof(srv->metrics.counters));
    if (!counters)
        return fail(ctx, KVS_ENOMEM, "out of memory for the stats counters");
    ctx->heap[1] = counters;
    memcpy(counters, srv->metrics.counters, sizeof(srv->metrics.counters));
    r->n_counters = KVS_N_COUNTERS_ALL;
    r->counters = counters;
#define NAMED_1(name) r->name = srv->metrics.name;
#define NAMED_0(name)
#define NAMED(name, named, ...) NAMED_##named(name)
    KVS_COUNTERS(NAMED)
#undef NAMED
#undef NAMED_0
#undef NAMED_1
    r->block_bytes = srv->block_bytes;
    r->pool_bytes = (uint64_t)srv->num_blocks * srv->block_bytes;
    r->backend = (Kvshare__Backend)backend_kind(srv->backend);
    r->uptime_ms = (uint64_t)now_ms() - srv->start_ms;
    r->index_bytes = radix_memory_bytes(srv->index);
    r->block_tokens = srv->geo.block_tokens;
    r->tier2_total_blocks = srv->tier2_blocks;
    r->tier2_cached_blocks = radix_tier2_blocks(srv->index);
    r->copying_blocks = radix_busy_blocks(srv->index);
    r->loop_busy_max_us = srv->metrics.loop_busy_max_us;
    r->tier3_total_blocks = srv->tier3_blocks;
    r->tier3_cached_blocks = radix_tier_blocks(srv->index, 3);
    r->disk_io = srv->disk_tier ? (char *)disk_io_name(srv->disk_tier) : "";
    /* One allocation: the device rows, the copy path's text, the restore. */
    size_t dev_bytes = stats_devices_bytes(srv);
    size_t dr_at = (dev_bytes + 512 + 15) & ~(size_t)15;
    char *mem = malloc(dr_at + sizeof(Kvshare__DiskRestore));
    if (!mem)
        return fail(ctx, KVS_ENOMEM, "out of memory for the stats");
    ctx->heap[2] = mem;
    stats_devices(srv, mem, c.writing + c.cached, r);
    char *copy_path = mem + dev_bytes;
    backend_copy_describe(srv->backend, copy_path, 512);
    r->copy_path = copy_path;
    store_restore_progress_t rp;
    store_restore_progress(srv, &rp);
    if (rp.phase) {
        Kvshare__DiskRestore *dr = (Kvshare__DiskRestore *)(void *)(mem + dr_at);
        kvshare__disk_restore__init(dr);
        dr->phase = (char *)rp.phase;
        dr->slots = rp.slots;
        dr->scanned = rp.scanned;
        dr->records = rp.records;
        dr->restored = rp.restored;
        dr->dropped = rp.dropped;
        dr->elapsed_ms = rp.elapsed_ms;
        r->disk_restore = dr;
    }
    int rc_nodes = stats_cluster_nodes(srv, r, ctx);
    if (rc_nodes != 0)
        return rc_nodes;

    uint32_t n_ns = radix_ns_count(srv->index), id_end = radix_ns_id_end(srv->index);
    if (n_ns > 0) {
        /* One allocation for the pointer array, the rows and their bands. */
        size_t bytes = n_ns * (sizeof(void *) + sizeof(Kvshare__NamespaceStats) +
                               2 * RADIX_PRIO_BANDS * sizeof(uint64_t));
        void *mem = malloc(bytes);
        if (!mem)
            return fail(ctx, KVS_ENOMEM, "out of memory for the stats of %u namespaces", n_ns);
        ctx->heap[0] = mem;
        Kvshare__NamespaceStats **ptrs = mem;
        Kvshare__NamespaceStats *rows = (void *)(ptrs + n_ns);
        uint64_t *bands = (void *)(rows + n_ns);
        uint32_t n_rows = 0;
        for (uint32_t i = 0; i < id_end && n_rows < n_ns; i++) {
            radix_ns_stats_t st;
            /* Other tenants' namespaces are none of this peer's business;
             * reclaimed ones are gone. */
            if (!namespaces_allowed(s, i) || radix_ns_stats(srv->index, i, &st) != 0)
                continue;
            kvshare__namespace_stats__init(&rows[n_rows]);
            rows[n_rows].name = (char *)radix_ns_name(srv->index, i);
            rows[n_rows].lookups = st.lookups;
            rows[n_rows].lookup_tokens = st.lookup_tokens;
            rows[n_rows].hit_tokens = st.hit_tokens;
            rows[n_rows].inserted_blocks = st.inserted_blocks;
            rows[n_rows].duplicate_blocks = st.duplicate_blocks;
            rows[n_rows].evicted_blocks = st.evicted_blocks;
            rows[n_rows].cached_blocks = st.cached_blocks;
            rows[n_rows].pinned_blocks = st.pinned_blocks;
            rows[n_rows].quota = st.quota;
            rows[n_rows].reserve = st.reserve;
            rows[n_rows].evicted_own = st.evicted_own;
            rows[n_rows].evicted_others = st.evicted_others;
            rows[n_rows].evicted_quota = st.evicted_quota;
            uint64_t *cached = bands + 2 * RADIX_PRIO_BANDS * n_rows;
            uint64_t *evicted = cached + RADIX_PRIO_BANDS;
            for (int b = 0; b < RADIX_PRIO_BANDS; b++) {
                cached[b] = st.cached_by_band[b];
                evicted[b] = st.evicted_by_band[b];
            }
            rows[n_rows].n_cached_by_priority = RADIX_PRIO_BANDS;
            rows[n_rows].cached_by_priority = cached;
            rows[n_rows].n_evicted_by_priority = RADIX_PRIO_BANDS;
            rows[n_rows].evicted_by_priority = evicted;
            rows[n_rows].tier2_blocks = st.tier2_blocks;
            rows[n_rows].tier2_hit_tokens = st.t2_hit_tokens;
            ptrs[n_rows] = &rows[n_rows];
            n_rows++;
        }
        r->n_namespaces = n_rows;
        r->namespaces = ptrs;
    }
    resp->rpc_case = KVSHARE__RESPONSE__RPC_STATS;
    resp->stats = r;
    return 0;
}

#define TREE_DEFAULT_ROWS 20
#define TREE_MAX_ROWS     1000
/* Trees held at most until they may walk, one after another: past them a
 * Tree is refused at once (KVS_EBUSY), not queued behind every walk (64
 * sessions asking at once were answered over 66 s, spaced walk after
 * walk, and a 65th waited for all of them). */
#define TREE_MAX_WAITING 2

/* Tree: the index's walk (radix_top_begin), cut into steps of
 * RADIX_TOP_STEP units, one per loop turn, like Clear: after a step with
 * more to do, the session is held (SESSION_HOLD_TREE) with a deadline of
 * now, so that the hold timer runs it again in the next turn, after the
 * other sessions' requests. One walk runs at a time in the daemon
 * (server_t.tree.walk): its memory (about 90 bytes per prefix) counts in
 * the session's buffers (max_buffer_memory), and a Tree of another session
 * waits for it, held for the same reason until it ends. A walk starts only
 * when the spacing of large work allows (server.h), and its steps' time in
 * all sets the spacing once it ends. Over an index that changes between
 * the steps, each prefix is listed as it was when its step ran
 * (radix.h). */
static void tree_end(server_t *srv)
{
    radix_top_end(srv->tree.walk);
    srv->tree.walk = NULL;
    srv->tree.owner = NULL;
    session_release_all(srv, SESSION_HOLD_TREE); /* the Trees waiting for it */
}

/* s's Tree no longer waits to walk (it walks, ended or is gone). */
static void tree_unwait(session_t *s)
{
    if (s->tree.counted)
        s->srv->tree.waiting--;
    s->tree.waiting = s->tree.counted = false;
}

/* s no longer waits for a shared walk's rows; the last such session
 * frees them. */
static void tree_leave(session_t *s)
{
    server_t *srv = s->srv;
    if (!s->tree.join)
        return;
    s->tree.join = 0;
    if (--srv->tree.joiners == 0) {
        free(srv->tree.rows);
        srv->tree.rows = NULL;
        srv->tree.n_rows = 0;
    }
}

void handler_tree_gone(session_t *s)
{
    tree_unwait(s);
    tree_leave(s);
    if (s->srv->tree.owner == s)
        tree_end(s->srv);
}

/* The rows a walk for tr needs: what it asks, or all a listing may give
 * when rows of namespaces the peer may not use are dropped at the end. */
static size_t tree_walk_rows(const server_t *srv, const Kvshare__TreeRequest *tr)
{
    size_t max = tr->max ? tr->max : TREE_DEFAULT_ROWS;
    if (max > TREE_MAX_ROWS)
        max = TREE_MAX_ROWS;
    if (srv->ns.any_acl && !(tr->ns && tr->ns[0]))
        max = TREE_MAX_ROWS;
    return max;
}

/* Joins the walk in progress when it lists what tr asks for (the same
 * namespace, that s may use, the same order, at least as many rows): s is
 * held until the walk ends, then answers with its rows, for no walk of
 * its own, so that any number of sessions asking for one listing cost one
 * walk. Returns true when s joined (ctx->hold set). */
static bool tree_join(session_t *s, const Kvshare__TreeRequest *tr, handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    if (!srv->tree.owner || srv->tree.by_size != tr->by_size ||
        srv->tree.max < tree_walk_rows(srv, tr))
        return false;
    if (tr->ns && tr->ns[0]) {
        const char *name = radix_ns_name(srv->index, srv->tree.ns);
        if (srv->tree.ns == RADIX_NS_ALL || !name || strcmp(name, tr->ns) != 0 ||
            !namespaces_allowed(s, srv->tree.ns))
            return false;
    } else if (srv->tree.ns != RADIX_NS_ALL) {
        return false;
    }
    tree_unwait(s);
    s->tree.join = srv->tree.gen;
    srv->tree.joiners++;
    ctx->hold = SESSION_HOLD_TREE;
    ctx->hold_until_ms = 0;
    return true;
}

/* Whether the Tree t waits for (held, with a place) lists what tr asks
 * for, or more. */
static bool tree_same(const session_t *t, const Kvshare__TreeRequest *tr, size_t max)
{
    const char *ns = tr->ns ? tr->ns : "";
    return t->tree.counted && t->tree.by_size == tr->by_size && t->tree.max >= max &&
           strcmp(t->tree.ns, ns) == 0;
}

/* Holds s's Tree until it may walk. A Tree that lists what a waiting one
 * lists follows it (it joins that walk once it begins: tree_join);
 * another takes one of TREE_MAX_WAITING places, or is refused when they
 * are taken. A Tree held by its own session's spacing (it walked a moment
 * ago) waits outside them: a session pipelining Trees takes a place only
 * once its own clock has passed. Returns 0 with ctx->hold set, or
 * KVS_EBUSY. */
static int tree_wait(session_t *s, const Kvshare__TreeRequest *tr, session_hold_reason_t why,
                     uint64_t until_ms, handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    size_t max = tree_walk_rows(srv, tr);
    srv->metrics.requests_spaced++;
    ctx->hold = why;
    ctx->hold_until_ms = until_ms;
    if (why == SESSION_HOLD_SPACING && uv_hrtime() < s->turn.walk_next_ns) {
        tree_unwait(s);
        return 0;
    }
    if (s->tree.counted)
        return 0;
    LIST_FOR_EACH (&srv->sched.held, session_t, turn.held_link, t) {
        if (t != s && tree_same(t, tr, max)) {
            s->tree.waiting = true; /* released when a walk begins (tree_begin) */
            ctx->hold = SESSION_HOLD_TREE;
            ctx->hold_until_ms = 0;
            return 0;
        }
    }
    if (srv->tree.waiting >= TREE_MAX_WAITING) {
        ctx->hold = SESSION_HOLD_NONE;
        ctx->hold_until_ms = 0;
        srv->metrics.requests_spaced--;
        tree_unwait(s);
        return fail(ctx, KVS_EBUSY,
                    "%u tree listings of other namespaces, orders or lengths are waiting for "
                    "their turn to walk the index (one walk at a time, spaced): ask again later",
                    srv->tree.waiting);
    }
    s->tree.waiting = s->tree.counted = true;
    srv->tree.waiting++;
    s->tree.by_size = tr->by_size;
    s->tree.max = (uint32_t)max;
    snprintf(s->tree.ns, sizeof s->tree.ns, "%s", tr->ns ? tr->ns : "");
    return 0;
}

size_t handler_tree_bytes(const session_t *s)
{
    return s->srv->tree.owner == s ? radix_top_walk_bytes(s->srv->tree.walk) : 0;
}

/* Begins s's walk, or holds s: for the spacing, or for another session's
 * walk. Returns 0 with ctx->hold set, or with the walk begun, or an error. */
static int tree_begin(session_t *s, const Kvshare__TreeRequest *tr, handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    uint32_t ns = RADIX_NS_ALL;
    size_t max = tree_walk_rows(srv, tr);
    /* Spaced as large work (server.h), however many Trees a client
     * pipelines (a session without a socket, in tests, is never held). */
    uint64_t t0 = uv_hrtime();
    if (s->sock.has_pipe && t0 < session_spacing_next(s))
        return tree_wait(s, tr, SESSION_HOLD_SPACING, session_spacing_until(s, t0), ctx);
    if (srv->tree.owner) /* another session's walk: until it ends */
        return tree_wait(s, tr, SESSION_HOLD_TREE, 0, ctx);
    tree_unwait(s);
    if (tr->ns && tr->ns[0]) {
        int rc = ns_resolve(s, tr->ns, false, &ns, ctx);
        if (rc != 0)
            return rc;
    }
    int rc = radix_top_begin(srv->index, ns, tr->by_size ? RADIX_BY_SIZE : RADIX_BY_HITS, max,
                             &srv->tree.walk);
    if (rc != 0)
        return fail(ctx, rc, "tree listing failed: %s", kvs_status_text(rc));
    srv->tree.owner = s;
    srv->tree.max = max;
    srv->tree.gen++;
    srv->tree.ns = ns;
    srv->tree.by_size = tr->by_size;
    s->tree.work_ns = 0;
    /* The Trees waiting look again: those that list the same join it. */
    LIST_FOR_EACH_SAFE (&srv->sched.held, session_t, turn.held_link, h, next) {
        if (h->tree.waiting)
            session_release(h);
    }
    return 0;
}

/* Runs steps of s's walk: one, or (a session without a socket, or the
 * daemon stopping: no later turn) all. *done once the rows are ready;
 * otherwise ctx->hold is set for the next step. */
static int tree_steps(session_t *s, handler_ctx_t *ctx, bool *done)
{
    server_t *srv = s->srv;
    *done = false;
    for (;;) {
        uint64_t t0 = uv_hrtime();
        int rc = radix_top_step(srv->index, srv->tree.walk, RADIX_TOP_STEP, done);
        uint64_t t1 = uv_hrtime();
        s->tree.work_ns += t1 - t0;
        if (rc != 0) {
            tree_end(srv);
            return fail(ctx, rc, "tree listing failed: %s", kvs_status_text(rc));
        }
        /* Its memory grows with the prefixes found: counted with the
         * buffers of every session (held_bytes), it must fit beside them. */
        size_t walk = radix_top_walk_bytes(srv->tree.walk);
        size_t others = srv->net.buf_bytes - s->sock.buf_bytes;
        if (others + walk > srv->cfg.max_buffer_memory) {
            tree_end(srv);
            return fail(
                ctx, KVS_ELIMIT,
                "the tree listing needs %zu MiB of temporary memory (about 90 bytes per "
                "prefix) and the sessions' buffers leave %zu MiB of max_buffer_memory: "
                "list one namespace, or raise max_buffer_memory",
                walk >> 20,
                (srv->cfg.max_buffer_memory > others ? srv->cfg.max_buffer_memory - others : 0) >>
                    20);
        }
        if (*done) {
            session_spacing_done(s, t1 - s->tree.work_ns, t1);
            return 0;
        }
        if (s->sock.has_pipe && !srv->stopping) {
            uint64_t now = uv_now(srv->loop);
            ctx->hold = SESSION_HOLD_TREE;
            ctx->hold_until_ms = now ? now : 1; /* 0 would mean no deadline */
            return 0;
        }
    }
}

int handler_tree(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                 handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__TreeRequest *tr = req->tree;
    size_t want = tr->max ? tr->max : TREE_DEFAULT_ROWS, n = 0;
    if (want > TREE_MAX_ROWS)
        want = TREE_MAX_ROWS;

    size_t max;
    radix_prefix_t *rows;
    void *mem;
    int rc;
    if (s->tree.join && s->tree.join == srv->tree.rows_gen && srv->tree.rows) {
        /* The walk it joined ended: its rows, as the walker got them. */
        max = srv->tree.n_rows;
        rows = malloc((max + 1) * sizeof(*rows));
        mem = malloc((max + 1) * (sizeof(Kvshare__Prefix) + sizeof(void *)));
        ctx->heap[0] = rows;
        ctx->heap[1] = mem;
        if (rows)
            memcpy(rows, srv->tree.rows, max * sizeof(*rows));
        n = max;
        tree_leave(s);
        if (!rows || !mem)
            return fail(ctx, KVS_ENOMEM, "out of memory for %zu tree rows", max);
        goto answer;
    }
    if (s->tree.join && srv->tree.owner && srv->tree.gen == s->tree.join) {
        ctx->hold = SESSION_HOLD_TREE; /* still walking */
        ctx->hold_until_ms = 0;
        return 0;
    }
    tree_leave(s); /* a walk that ended without rows: its own */
    if (srv->tree.owner != s) {
        if (tree_join(s, tr, ctx))
            return 0;
        rc = tree_begin(s, tr, ctx);
        if (rc != 0 || ctx->hold != SESSION_HOLD_NONE)
            return rc;
    }
    bool done;
    rc = tree_steps(s, ctx, &done);
    if (rc != 0 || !done)
        return rc;
    max = srv->tree.max;
    rows = malloc((max + 1) * sizeof(*rows));
    mem = malloc((max + 1) * (sizeof(Kvshare__Prefix) + sizeof(void *)));
    ctx->heap[0] = rows;
    ctx->heap[1] = mem;
    if (!rows || !mem) {
        tree_end(srv);
        return fail(ctx, KVS_ENOMEM, "out of memory for %zu tree rows", max);
    }
    rc = radix_top_rows(srv->tree.walk, rows, max, &n);
    /* Kept for the Trees that joined this walk (without memory for them,
     * each walks on its own). */
    if (rc == 0 && srv->tree.joiners > 0) {
        radix_prefix_t *keep = malloc((n + 1) * sizeof(*keep));
        if (keep) {
            memcpy(keep, rows, n * sizeof(*keep));
            free(srv->tree.rows);
            srv->tree.rows = keep;
            srv->tree.n_rows = n;
            srv->tree.rows_gen = srv->tree.gen;
        }
    }
    tree_end(srv);
    if (rc != 0)
        return fail(ctx, rc, "tree listing failed: %s", kvs_status_text(rc));
answer:;

    uint64_t newest = 0;
    size_t kept = 0;
    for (size_t i = 0; i < n && kept < want; i++)
        if (namespaces_allowed(s, rows[i].ns))
            rows[kept++] = rows[i];
    n = kept;
    for (size_t i = 0; i < n; i++)
        if (rows[i].last_used > newest)
            newest = rows[i].last_used;
    Kvshare__Prefix **ptrs = mem;
    Kvshare__Prefix *out = (void *)(ptrs + max);
    for (size_t i = 0; i < n; i++) {
        kvshare__prefix__init(&out[i]);
        const char *name = radix_ns_name(srv->index, rows[i].ns);
        out[i].ns = (char *)(name ? name : "");
        out[i].tokens = rows[i].tokens;
        out[i].blocks = rows[i].blocks;
        out[i].pins = rows[i].pins;
        out[i].hits = rows[i].hits;
        out[i].last_used = rows[i].last_used;
        out[i].age_ticks = newest - rows[i].last_used;
        out[i].last_block_id = rows[i].last_block_id;
        uint32_t id = rows[i].last_block_id;
        out[i].tier = id < srv->num_blocks ? 1 : id - srv->num_blocks < srv->tier2_blocks ? 2 : 3;
        out[i].tier2_blocks = rows[i].tier2_blocks;
        out[i].parent_block_id = rows[i].parent_block_id;
        out[i].has_parent = rows[i].has_parent;
        ptrs[i] = &out[i];
    }
    Kvshare__TreeReply *r = &ctx->reply.tree;
    kvshare__tree_reply__init(r);
    r->n_prefixes = n;
    r->prefixes = ptrs;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_TREE;
    resp->tree = r;
    return 0;
}

int handler_ping(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                 handler_ctx_t *ctx)
{
    Kvshare__PingReply *r = &ctx->reply.ping;
    (void)s;
    kvshare__ping_reply__init(r);
    r->payload = req->ping->payload;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_PING;
    resp->ping = r;
    return 0;
}

/* Clear: the namespace's unpinned cached blocks go back to the pool (each
 * an eviction of the store, so KV events and metrics see them as such).
 * Pinned blocks and their prefixes stay; WRITING blocks are not in the
 * index. A namespace is never created here.
 * The work is cut into steps of STORE_CLEAR_STEP blocks, one per loop turn:
 * after a step with more to do, the session is held (SESSION_HOLD_CLEAR)
 * with a deadline of now, so the hold timer lets it run again in the next
 * turn, after other sessions' requests. The index is whole after each step:
 * a request between two sees the blocks not dropped yet, as if it came
 * before the Clear; blocks cached meanwhile may be dropped by later steps,
 * and blocks pinned meanwhile stay, like any pinned block. The steps drop
 * at most the namespace's blocks at the start, so the Clear ends. */
static bool clear_step(session_t *s, uint32_t ns, int *rc)
{
    server_t *srv = s->srv;
    radix_ns_stats_t st;
    if (session_rerun(s) != SESSION_HOLD_CLEAR) { /* its first step */
        *rc = radix_ns_stats(srv->index, ns, &st);
        if (*rc != 0)
            return false;
        s->steps.clear_dropped = 0;
        s->steps.clear_left = (uint64_t)st.cached_blocks + st.tier2_blocks + st.tier3_blocks;
    }
    size_t step =
        s->steps.clear_left < STORE_CLEAR_STEP ? (size_t)s->steps.clear_left : STORE_CLEAR_STEP;
    size_t n = 0;
    *rc = store_clear(srv->store, ns, step, &n);
    if (*rc != 0)
        return false;
    s->steps.clear_dropped += n;
    s->steps.clear_left -= n;
    /* n < step: nothing more can go now. When stopping, no next turn. */
    return n == step && s->steps.clear_left > 0 && !srv->stopping;
}

int handler_clear(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    uint32_t ns;
    radix_ns_stats_t st;

    int rc = ns_resolve(s, req->clear->ns, false, &ns, ctx);
    if (rc != 0)
        return rc;
    if (!namespaces_may_clear(s, ns)) {
        srv->metrics.clears_denied++;
        return fail(ctx, KVS_EDENIED,
                    "clearing namespace '%s' is not allowed for uid %u: Clear drops a whole "
                    "tenant's cache; it takes uid 0, a uid or gid in clear_uids / clear_gids, or "
                    "one the namespace's own allow_uids / allow_gids names",
                    radix_ns_name(srv->index, ns), (unsigned)s->peer.uid);
    }
    while (clear_step(s, ns, &rc)) {
        if (s->sock.has_pipe) { /* sessions without a socket (tests) are never held */
            uint64_t now = uv_now(srv->loop);
            ctx->hold = SESSION_HOLD_CLEAR;
            ctx->hold_until_ms = now ? now : 1; /* 0 would mean no deadline */
            return 0;
        }
    }
    if (rc == 0)
        rc = radix_ns_stats(srv->index, ns, &st);
    if (rc != 0)
        return fail(ctx, KVS_EINTERNAL, "clearing namespace '%s' failed: %s",
                    radix_ns_name(srv->index, ns), kvs_status_text(rc));
    /* The disk tier's records of ns are deleted for every later start
     * before the reply says the namespace is cleared. */
    rc = store_disk_forget_ns(srv, ns);
    if (rc != 0)
        return fail(ctx, KVS_EIO,
                    "namespace '%s' was cleared, but the disk tier could not record it: its "
                    "blocks could come back at the next start (%s)",
                    radix_ns_name(srv->index, ns), kvs_status_text(rc));
    store_clear_done(srv->store);
    cluster_store_cleared(srv, ns); /* cluster_clear: its keys too, off the loop */
    LOG_INFO("namespace '%s' cleared by session %llu: %llu blocks dropped, %u kept (pinned)",
             radix_ns_name(srv->index, ns), (unsigned long long)s->id,
             (unsigned long long)s->steps.clear_dropped, st.cached_blocks);

    Kvshare__ClearReply *r = &ctx->reply.clear;
    kvshare__clear_reply__init(r);
    r->n_cleared = (uint32_t)s->steps.clear_dropped;
    r->n_kept = st.cached_blocks;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_CLEAR;
    resp->clear = r;
    return 0;
}

/* Evict: one prompt's cached blocks that nothing else needs leave every
 * tier (store_evict_prompt), each like any eviction (BlockRemoved, the
 * evictions and tier-2 drop counters). A namespace is never created here. */
int handler_evict(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    const Kvshare__EvictRequest *ev = req->evict;
    const uint32_t *tokens;
    size_t n_tokens, matched, n1, n2;
    uint32_t ns;

    int rc = ns_resolve(s, ev->ns, false, &ns, ctx);
    if (rc == 0)
        rc = tokens_view(s->srv, &ev->tokens, &tokens, &n_tokens, &ctx->heap[0], ctx);
    if (rc != 0)
        return rc;
    rc = store_evict_prompt(s->srv->store, ns, tokens, n_tokens, &matched, &n1, &n2);
    if (rc != 0)
        return fail(ctx, KVS_EINTERNAL, "evicting a prompt of namespace '%s' failed: %s",
                    radix_ns_name(s->srv->index, ns), kvs_status_text(rc));
    LOG_DEBUG("session %llu evicted %zu + %zu of %zu cached blocks of a prompt in '%s'",
              (unsigned long long)s->id, n1, n2, matched, radix_ns_name(s->srv->index, ns));

    Kvshare__EvictReply *r = &ctx->reply.evict;
    kvshare__evict_reply__init(r);
    r->n_tier1 = (uint32_t)n1;
    r->n_tier2 = (uint32_t)n2;
    r->n_kept = (uint32_t)(matched - n1 - n2);
    resp->rpc_case = KVSHARE__RESPONSE__RPC_EVICT;
    resp->evict = r;
    return 0;
}
