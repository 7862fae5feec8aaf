/* SPDX-License-Identifier: Apache-2.0 */
#include "handlers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "inflight.h"
#include "kvshare_counters.h"
#include "kvshare_status.h"
#include "kvshare_version.h"
#include "log.h"
#include "now.h"
#include "nsname.h"
#include "peer.h"
#include "tier.h"
#include "session.h"
#include "tenants.h"

/* Records the message of a failing request and returns its status. */
#define fail(ctx, status, ...) errbuf_set((ctx)->msg, sizeof((ctx)->msg), (status), __VA_ARGS__)

/* A namespace not created: logged at most once a second, with a count. */
static void ns_refused(server_t *srv, const char *why)
{
    uint64_t now = uv_now(srv->loop);
    srv->ns_refused_unlogged++;
    if (srv->ns_refuse_log_ms == 0 || now - srv->ns_refuse_log_ms >= 1000) {
        LOG_WARN("refused to create %llu namespace(s): %s",
                 (unsigned long long)srv->ns_refused_unlogged, why);
        srv->ns_refuse_log_ms = now;
        srv->ns_refused_unlogged = 0;
    }
}

/* The namespace id for `name` ("" is the default namespace), created on first
 * use when `create` is true (and counted against the session's
 * session_max_namespaces; a full table first reclaims unused ones). */
static int ns_resolve(session_t *s, const char *name, bool create, uint32_t *ns, handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    if (!name || !name[0])
        name = SERVER_DEFAULT_NS;
    size_t len = strlen(name);
    if (len > RADIX_NS_NAME_MAX)
        return fail(ctx, KVS_EINVAL, "namespace name of %zu bytes is too long (%d at most)", len,
                    RADIX_NS_NAME_MAX);
    if (!nsname_valid(name)) {
        char shown[4 * RADIX_NS_NAME_MAX + 1];
        return fail(ctx, KVS_EINVAL, "namespace name '%s': use %s",
                    log_escape(name, shown, sizeof(shown)), nsname_rule());
    }
    int rc = radix_ns_find(srv->index, name, ns);
    if (rc == 0 && !tenants_usable(srv, *ns))
        rc = KVS_ENONS;
    if (rc == 0 && !tenants_allowed(s, *ns)) {
        srv->metrics.namespace_denied++;
        return fail(ctx, KVS_EDENIED,
                    "permission denied: namespace '%s' does not allow uid %u / gid %u "
                    "(allow_uids / allow_gids of its [namespace] section)",
                    name, s->peer_uid, s->peer_gid);
    }
    if (rc == 0)
        return 0;
    if (!srv->cfg.dynamic_namespaces)
        return fail(ctx, KVS_ENONS,
                    "unknown namespace '%s': this kvshared serves only the namespaces its config "
                    "declares; add a [namespace %s] section (then SIGHUP) or use a declared one",
                    name, name);
    if (!create)
        return fail(ctx, KVS_ENONS,
                    "unknown namespace '%s'; `kvshare stats` lists the namespaces in use", name);
    uint32_t limit = srv->cfg.session_max_namespaces;
    if (limit && s->ns_created >= limit) {
        srv->metrics.namespace_session_refusals++;
        ns_refused(srv, "a connection reached session_max_namespaces");
        return fail(ctx, KVS_ELIMIT,
                    "cannot create namespace '%s': this connection already created %u "
                    "namespaces that still exist (session_max_namespaces); reuse one of them",
                    name, limit);
    }
    if (radix_ns_count(srv->index) >= srv->cfg.max_namespaces && tenants_reclaim(srv) == 0) {
        srv->metrics.namespace_table_refusals++;
        ns_refused(srv, "the namespace table is full of declared or used namespaces");
        return fail(ctx, KVS_ELIMIT,
                    "cannot create namespace '%s': kvshared already has %u namespaces (the "
                    "limit, max_namespaces), each declared or holding blocks; reuse one",
                    name, srv->cfg.max_namespaces);
    }
    rc = radix_ns_create(srv->index, name, server_ns_seed(name), 0, 0, ns);
    if (rc == 0 && tenants_created(s, *ns) != 0) {
        radix_ns_delete(srv->index, *ns);
        rc = KVS_ENOMEM;
    }
    if (rc != 0)
        return fail(ctx, rc, "cannot create namespace '%s': %s", name, kvs_status_text(rc));
    LOG_DEBUG("namespace '%s' created (id %u)", name, *ns);
    return 0;
}

/* Token ids from the wire: little-endian uint32 packed in bytes. On a
 * little-endian host with aligned data they are used in place. */
static int tokens_view(const ProtobufCBinaryData *bytes, const uint32_t **tokens, size_t *n,
                       void **copy, handler_ctx_t *ctx)
{
    if (bytes->len % 4 != 0)
        return fail(ctx, KVS_EINVAL,
                    "tokens field has %zu bytes, not a multiple of 4: token ids travel as "
                    "little-endian uint32",
                    bytes->len);
    *n = bytes->len / 4;
    *copy = NULL;
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

/* The reuse-gap histogram: the time since the matched prefix's last block
 * was last used (committed, or the end of a lookup's match). One
 * observation per lookup that hits, O(1): the blocks before it were used at
 * least as recently (every walk starts at the root). */
static void observe_reuse(server_t *srv, const uint32_t *ids, size_t n)
{
    if (n == 0)
        return;
    uint32_t last = ids[n - 1];
    uint64_t now = uv_now(srv->loop);
    metrics_observe(&srv->metrics.block_reuse_gap, metrics_block_bounds_ms, metrics_block_n_bounds,
                    now - srv->block_used_ms[last]);
    srv->block_used_ms[last] = now;
}

/* The per-session limits (session_max_pinned, session_max_writing). */
static int over_pin_limit(session_t *s, size_t more, handler_ctx_t *ctx)
{
    s->srv->metrics.session_limit_refusals++;
    return fail(ctx, KVS_ELIMIT,
                "session limit session_max_pinned = %u: this session holds %llu pins and this "
                "request needs %zu more; release blocks first",
                s->srv->cfg.session_max_pinned, (unsigned long long)s->pins.total, more);
}

static int over_pin_limit_check(session_t *s, size_t more, handler_ctx_t *ctx)
{
    uint32_t max = s->srv->cfg.session_max_pinned;
    if (max && s->pins.total + more > max)
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

/* Gives cached block b the request's hint (radix_hint; a block no longer
 * cached takes none). */
static void hint_apply(server_t *srv, const Kvshare__RetentionHint *h, uint32_t b)
{
    if (!h)
        return;
    uint64_t until = h->duration_ms ? uv_now(srv->loop) + h->duration_ms : 0;
    int rc = radix_hint(srv->index, b, h->priority, until);
    if (rc != 0 && rc != KVS_ENOTFOUND)
        LOG_WARN("retention hint on block %u: %s", b, kvs_status_text(rc));
}

/* Timed hints that ended go back to their namespace's default before the
 * index chooses what to evict. */
static void hints_expire(server_t *srv)
{
    radix_expire_hints(srv->index, uv_now(srv->loop), NULL);
}

static int check_range(session_t *s, uint32_t block_id, handler_ctx_t *ctx)
{
    if (block_id >= s->srv->num_blocks)
        return fail(ctx, KVS_EINVAL, "block %u is out of range: the pool has %u blocks (ids 0..%u)",
                    block_id, s->srv->num_blocks, s->srv->num_blocks - 1);
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
    peer_set_worker(s, hello->worker);

    backend_desc_t desc;
    backend_describe(srv->backend, &desc);
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
    if (!hello->no_fds) {
        size_t n_fds = 0;
        char why[320];
        int rc = backend_export(srv->backend, s->fds, BACKEND_MAX_SLABS, &n_fds, why, sizeof(why));
        if (rc != 0)
            return fail(ctx, rc, "exporting the pool for this worker failed: %s", why);
        s->n_fds = n_fds;
    }
    /* Tier 2 goes only to a client that asks: one that does not would
     * count the fds as slabs (or lose the extra one to a short control
     * buffer). */
    bool tier2_fd = false;
    if (!hello->no_fds && hello->map_tier2 && srv->tier2_blocks) {
        char why[320];
        int fd = -1;
        int rc = backend_tier_export_readonly(srv->backend, &fd, why, sizeof(why));
        if (rc == KVS_EIO) {
            /* Read-only is a safeguard the system may not offer (no /proc):
             * the reader's mapping is PROT_READ all the same. */
            LOG_WARN("session %llu: %s; sending the tier-2 memfd read-write",
                     (unsigned long long)s->id, why);
            rc = backend_tier_export(srv->backend, &fd, why, sizeof(why));
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
    r->tier2_bytes = srv->tier2_blocks ? backend_tier_size(srv->backend) : 0;
    r->tier2_fd = tier2_fd;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_HELLO;
    resp->hello = r;
    LOG_INFO("session %llu: hello from '%s', pid %d, uid %u (%u fds)", (unsigned long long)s->id,
             s->worker[0] ? s->worker : "?", (int)s->peer_pid, s->peer_uid, r->n_fds);
    return 0;
}

int handler_lookup_answer(session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                          bool pin, bool in_place, bool waited, bool claim, Kvshare__Response *resp,
                          handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    size_t n_blocks = 0;
    uint32_t *ids, inflight = 0;
    in_place = in_place && pin;
    /* A chain of cached blocks is never longer than the pool, or the pool
     * and tier 2 for a lookup that returns the tier-2 part as it is. */
    size_t max_ids = n_tokens / srv->geo.block_tokens;
    size_t chain_max = (size_t)srv->num_blocks + (in_place ? srv->tier2_blocks : 0);
    if (max_ids > chain_max)
        max_ids = chain_max;
    if (session_scratch(s, max_ids ? max_ids : 1, &ids) != 0 ||
        (pin && session_pins_reserve(s, (uint32_t)max_ids) != 0))
        return fail(ctx, KVS_ENOMEM, "out of memory for a lookup of %zu tokens", n_tokens);
    int rc = radix_lookup(srv->index, ns, tokens, n_tokens, pin, ids, max_ids, &n_blocks);
    if (rc != 0)
        return fail(ctx, rc, "lookup failed: %s", kvs_status_text(rc));
    /* A match goes on into tier 2 after its tier-1 blocks: a pinned lookup
     * waits for them to come back (tier.h), or with in_place keeps them
     * pinned where they are and names them; otherwise the reply names
     * tier-1 blocks only. */
    size_t n_t1 = 0, n_t2 = 0;
    while (n_t1 < n_blocks && ids[n_t1] < srv->num_blocks)
        n_t1++;
    /* A request run again after its copies counts once, as it first matched
     * (hits by tier included): this run comes out of the counters. */
    if (s->tier_rerun && !waited)
        radix_lookup_uncount(srv->index, ns, n_tokens, n_blocks, n_blocks - n_t1);
    /* Tier-2 blocks that another session reads in place stay, and so do
     * the blocks after them (radix_promotable). */
    size_t n_promote = 0;
    if (n_t1 < n_blocks && pin && !in_place && !waited)
        n_promote = radix_promotable(srv->index, ids + n_t1, n_blocks - n_t1);
    if (n_t1 < n_blocks && in_place) {
        n_t2 = n_blocks - n_t1; /* pinned in tier 2: neither promoted nor dropped */
    } else if (n_promote > 0) {
        int started = tier_promote(srv, s, ids + n_t1, n_promote, ids, n_blocks);
        if (started == 0) { /* no free pool block: make room first, then promote */
            started = tier_demote(srv, s, ns, n_promote);
            /* Nothing to wait for when the room came from blocks dropped
             * at once (tier 2 full of blocks it cannot drop: these). */
            if (started == 0)
                started = tier_promote(srv, s, ids + n_t1, n_promote, ids, n_blocks);
        }
        if (started == 0) /* copies in flight will free or move blocks */
            started = tier_wait(srv, s);
        LOG_DEBUG("session %llu: lookup matched %zu + %zu tier-2 blocks: %s (pinned %u, busy %u, "
                  "tier-2 free %u, copies %u)",
                  (unsigned long long)s->id, n_t1, n_promote,
                  started == 1   ? "waiting"
                  : started == 0 ? "no room"
                                 : kvs_status_text(started),
                  radix_pinned_blocks(srv->index), radix_busy_blocks(srv->index),
                  radix_tier2_free(srv->index), srv->tier_jobs);
        if (started == 1) {
            ctx->deferred = true;
            /* A promotion holds the pins until its copies are done; for a
             * demotion they only kept this prefix out of its way. */
            if (!s->tier_job || !tier_job_holds_pins(s->tier_job))
                for (size_t i = 0; i < n_blocks; i++)
                    radix_unpin(srv->index, ids[i]);
            return 0;
        }
        for (size_t i = started < 0 ? 0 : n_t1; i < n_blocks; i++)
            radix_unpin(srv->index, ids[i]);
        if (started < 0)
            return fail(ctx, started, "lookup: moving blocks between tiers failed: %s",
                        kvs_status_text(started));
    } else if (n_t1 < n_blocks && pin) {
        /* A parked lookup answers from its resume (inflight.h), where it
         * cannot wait again, and blocks pinned in place stay where they
         * are: the tier-2 part is not returned. */
        for (size_t i = n_t1; i < n_blocks; i++)
            radix_unpin(srv->index, ids[i]);
    }
    n_blocks = n_t1 + n_t2; /* without pin, only the tier-1 part is of use */
    if (pin && !waited && n_blocks < max_ids && radix_busy_blocks(srv->index) > 0 &&
        tier_wait(srv, s) == 1) {
        /* The match may have stopped at a block being copied between the
         * tiers: it is readable again once the copies end. */
        for (size_t i = 0; i < n_blocks; i++)
            radix_unpin(srv->index, ids[i]);
        ctx->deferred = true;
        return 0;
    }
    if (pin && srv->cfg.session_max_pinned &&
        s->pins.total + n_blocks > srv->cfg.session_max_pinned) {
        /* Over the limit: the pins just taken go back, nothing is returned. */
        for (size_t i = 0; i < n_blocks; i++)
            radix_unpin(srv->index, ids[i]);
        return over_pin_limit(s, n_blocks, ctx);
    }
    /* Tier-2 blocks are pinned by their index id, as Release names them. */
    if (pin) {
        for (size_t i = 0; i < n_blocks; i++)
            session_pin_add(s, ids[i]);
    }
    observe_reuse(srv, ids, n_t1);
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
 * it that other sessions are writing, parked until they are committed (see
 * inflight.h). */
int handler_lookup(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                   handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__LookupRequest *lk = req->lookup;
    const uint32_t *tokens;
    size_t n_tokens;
    uint32_t ns;
    void *copy = NULL;

    int rc = tokens_view(&lk->tokens, &tokens, &n_tokens, &copy, ctx);
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
    /* One that already waited for tier copies answers now (it was counted,
     * and a parked lookup answers without promoting). */
    if (lk->wait_ms > 0 && !srv->stopping && !s->tier_rerun && inflight_declared(srv) > 0) {
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
            rc = inflight_park(srv, s, req->id, ns, tokens, n_tokens, lk->pin, lk->tier2_in_place,
                               lk->wait_ms);
            if (rc == 0) {
                ctx->parked = true;
                return 0;
            }
        }
        /* Without memory to wait, answer now: waiting is an optimisation. */
    }
    return handler_lookup_answer(s, ns, tokens, n_tokens, lk->pin, lk->tier2_in_place, false,
                                 lk->wait_ms > 0, resp, ctx);
}

int handler_alloc(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__AllocRequest *al = req->alloc;
    uint32_t ns = RADIX_NS_ANY, *ids;
    size_t evicted = 0;

    if (al->n == 0 || al->n > srv->num_blocks)
        return fail(ctx, KVS_EINVAL, "alloc of %u blocks: ask for 1 to %u (the pool size)", al->n,
                    srv->num_blocks);
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
        int rc = tokens_view(&al->tokens, &tokens, &n_tokens, &copy, ctx);
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
    if (srv->cfg.session_max_writing &&
        (uint64_t)s->n_writing + al->n > srv->cfg.session_max_writing) {
        srv->metrics.session_limit_refusals++;
        return fail(ctx, KVS_ELIMIT,
                    "session limit session_max_writing = %u: this session holds %u WRITING "
                    "blocks and asked for %u more; commit or release blocks first",
                    srv->cfg.session_max_writing, s->n_writing, al->n);
    }
    if (session_scratch(s, al->n, &ids) != 0 || session_writing_reserve(s, al->n) != 0)
        return fail(ctx, KVS_ENOMEM, "out of memory for an alloc of %u blocks", al->n);

    int rc = pool_alloc(srv->pool, al->n, ids);
    if (rc == KVS_EPOOLFULL) {
        /* A full pool is the signal to evict unpinned cached blocks, then retry. */
        pool_counts_t c;
        pool_counts(srv->pool, &c);
        hints_expire(srv);
        if (al->report_evicted) {
            /* Freed by dispatch with the reply it travels in. */
            ctx->heap[1] = malloc((size_t)(al->n - c.free) * srv->geo.block_tokens * 4);
            if (!ctx->heap[1])
                return fail(ctx, KVS_ENOMEM, "out of memory for the evicted blocks' tokens");
            srv->evict_report.ns = ns;
            srv->evict_report.tokens = ctx->heap[1];
            srv->evict_report.n = 0;
            srv->evict_report.max = al->n - c.free;
        }
        if (srv->tier2_blocks) {
            /* Demote instead of drop: the reply waits for the copies. The
             * report names what the run that answers dropped. */
            rc = tier_demote(srv, s, ns, al->n - c.free);
            srv->evict_report.tokens = NULL;
            if (rc == 0)
                rc = tier_wait(srv, s);
            if (rc == 1) {
                ctx->deferred = true;
                return 0;
            }
        } else {
            rc = radix_evict(srv->index, ns, al->n - c.free, &evicted);
            srv->evict_report.tokens = NULL;
        }
        if (rc != 0)
            return fail(ctx, rc, "eviction failed: %s", kvs_status_text(rc));
        rc = pool_alloc(srv->pool, al->n, ids);
    }
    if (rc == KVS_EPOOLFULL) {
        pool_counts_t c;
        pool_counts(srv->pool, &c);
        srv->metrics.alloc_failures++;
        return fail(ctx, KVS_EPOOLFULL,
                    "pool full: %u blocks wanted, %u free after evicting %zu; %u are being "
                    "written and %u of %u cached are pinned (release blocks or grow the pool)",
                    al->n, c.free, evicted, c.writing, radix_pinned_blocks(srv->index), c.cached);
    }
    if (rc != 0)
        return fail(ctx, rc, "alloc failed: %s", kvs_status_text(rc));
    for (uint32_t i = 0; i < al->n; i++)
        session_writing_add(s, ids[i]);
    if (hashes)
        inflight_declare(srv, ns, hashes, ids, al->n);

    Kvshare__AllocReply *r = &ctx->reply.alloc;
    kvshare__alloc_reply__init(r);
    r->n_block_ids = al->n;
    r->block_ids = ids;
    r->evicted = (uint32_t)evicted;
    if (ctx->heap[1]) {
        r->evicted_tokens.data = ctx->heap[1];
        r->evicted_tokens.len = srv->evict_report.n * srv->geo.block_tokens * 4;
    }
    resp->rpc_case = KVSHARE__RESPONSE__RPC_ALLOC;
    resp->alloc = r;
    return 0;
}

/* Why block b cannot be committed or released by s, as a status + message. */
static int not_held(session_t *s, uint32_t b, handler_ctx_t *ctx)
{
    pool_state_t st = POOL_FREE;
    if (s->srv->writer[b] && s->srv->writer[b] != s)
        return fail(ctx, KVS_ENOTHELD,
                    "block %u is not held by this session: another session is writing it", b);
    pool_state(s->srv->pool, b, &st);
    /* Another namespace's block, to a peer that may not use it, looks free. */
    if (st == POOL_FREE || !tenants_allowed(s, s->srv->block_ns[b]))
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

/* KV events of a commit: one BlockStored per run of blocks it cached
 * (fresh[i] != 0), whose parent is the block before the run. A duplicate
 * publishes nothing. Parents go first: a run's parent was cached before
 * this commit or earlier in it, and its event queued then. */
static void publish_stored(server_t *srv, uint32_t ns, const uint32_t *ids,
                           const uint32_t *canonical, const uint32_t *fresh, size_t n,
                           const uint32_t *tokens)
{
    const events_stream_t *st = server_events_stream(srv, ns);
    uint32_t bt = srv->geo.block_tokens;
    if (!st->on)
        return;
    for (size_t i = 0; i < n;) {
        if (!fresh[i]) {
            i++;
            continue;
        }
        size_t end = i;
        while (end < n && fresh[end])
            end++;
        uint64_t parent = 0;
        bool has_parent = i > 0 && radix_block_hash(srv->index, canonical[i - 1], &parent) == 0;
        if (events_stored(srv->events, st, ids + i, end - i, srv->block_hash, has_parent, parent,
                          tokens + i * bt) != 0)
            srv->metrics.kv_events_dropped++;
        i = end;
    }
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
 */
int handler_commit(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                   handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__CommitRequest *cm = req->commit;
    const uint32_t *tokens;
    size_t n_tokens, n_ids = cm->n_block_ids, n_done = 0, n_named_cached = 0;
    uint32_t ns, *canonical;
    void *copy = NULL;

    int rc = tokens_view(&cm->tokens, &tokens, &n_tokens, &copy, ctx);
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
    /* Every block must be WRITING and held by this session, or cached and
     * pinned by it, and named once. */
    if (++srv->mark_stamp == 0) {
        memset(srv->mark, 0, sizeof(uint32_t) * srv->num_blocks);
        srv->mark_stamp = 1;
    }
    for (size_t i = 0; i < n_ids; i++) {
        uint32_t b = cm->block_ids[i];
        rc = check_range(s, b, ctx);
        if (rc != 0)
            return rc;
        if (srv->writer[b] != s) {
            pool_state_t st = POOL_FREE;
            if (srv->writer[b])
                return not_held(s, b, ctx);
            pool_state(srv->pool, b, &st);
            /* Another namespace's block, to a peer that may not use it,
             * looks free (see handler_pin). */
            if (st != POOL_CACHED || !tenants_allowed(s, srv->block_ns[b]))
                return fail(ctx, KVS_EBADSTATE,
                            "block %u is not in WRITING (it is free): commit only blocks this "
                            "session got from Alloc (once), or cached blocks it pinned",
                            b);
            if (session_pin_count(s, b) == 0)
                return fail(ctx, KVS_ENOTHELD,
                            "block %u is cached but this session holds no pin on it (other "
                            "sessions' pins do not count): commit a cached block only while "
                            "holding a pin on it from Lookup or Pin",
                            b);
            n_named_cached++;
        }
        if (srv->mark[b] == srv->mark_stamp)
            return fail(ctx, KVS_EINVAL, "block %u appears twice in this commit", b);
        srv->mark[b] = srv->mark_stamp;
    }
    /* A commit naming cached blocks does not create its namespace: they
     * cannot be in one that does not exist. */
    rc = ns_resolve(s, cm->ns, n_named_cached == 0, &ns, ctx);
    if (rc != 0)
        return rc;
    /* Cached blocks named here are pinned by this session already. */
    rc = over_pin_limit_check(s, n_ids - n_named_cached, ctx);
    if (rc != 0)
        return rc;
    if (session_scratch(s, n_ids ? 2 * n_ids : 1, &canonical) != 0 ||
        session_pins_reserve(s, (uint32_t)n_ids) != 0)
        return fail(ctx, KVS_ENOMEM, "out of memory for a commit of %zu blocks", n_ids);
    if (n_named_cached > 0) {
        /* Read-only: checking the positions must not count as a lookup. */
        uint32_t *matched = canonical + n_ids;
        size_t n_matched = 0;
        rc = radix_match(srv->index, ns, tokens, n_tokens, matched, n_ids, &n_matched);
        if (rc != 0)
            return fail(ctx, rc, "commit check failed: %s", kvs_status_text(rc));
        for (size_t i = 0; i < n_ids; i++) {
            uint32_t b = cm->block_ids[i];
            if (srv->writer[b] != s && (i >= n_matched || matched[i] != b))
                return not_at_position(b, i, n_matched, matched, radix_ns_name(srv->index, ns),
                                       ctx);
        }
    }

    hints_expire(srv); /* a namespace at its quota evicts in the insert */
    int irc = n_ids ? radix_insert(srv->index, ns, tokens, n_tokens, cm->block_ids, n_ids, true,
                                   canonical, &n_done)
                    : 0;
    /* Which blocks this commit cached (KV events), in the scratch's second
     * half. */
    uint32_t *fresh = canonical + n_ids;
    memset(fresh, 0, n_done * sizeof(*fresh));
    for (size_t i = 0; i < n_done; i++) {
        uint32_t b = cm->block_ids[i];
        if (srv->writer[b] != s) {
            /* A cached block named here: the session already pins it; the
             * insert's pin is taken back so that one Release frees it. */
            if (canonical[i] == b && radix_unpin(srv->index, b) == 0)
                continue;
            LOG_ERROR("cached block %u of session %llu was checked at position %zu but the "
                      "index disagrees",
                      b, (unsigned long long)s->id, i);
            if (canonical[i] != b)
                session_pin_add(s, canonical[i]);
            continue;
        }
        if (canonical[i] == b) {
            srv->block_cached_ms[b] = srv->block_used_ms[b] = uv_now(srv->loop);
            srv->block_ns[b] = ns;
            if (srv->events) {
                fresh[i] = 1;
                radix_block_hash(srv->index, b, &srv->block_hash[b]);
            }
            session_writing_remove(s, b);
            if (pool_set_cached(srv->pool, b) != 0)
                LOG_ERROR("block %u was WRITING for session %llu but the pool refused it", b,
                          (unsigned long long)s->id);
        }
        /* A duplicate stays WRITING, held by this session until released;
         * its prefix is cached now, so it is no longer in flight. */
        inflight_undeclare(srv, b);
        session_pin_add(s, canonical[i]);
    }
    for (size_t i = 0; i < n_done; i++)
        hint_apply(srv, cm->hint, canonical[i]);

    if (srv->events)
        publish_stored(srv, ns, cm->block_ids, canonical, fresh, n_done, tokens);

    Kvshare__CommitReply *r = &ctx->reply.commit;
    kvshare__commit_reply__init(r);
    r->n_canonical = n_done;
    r->canonical = canonical;
    r->n_committed = (uint32_t)n_done;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_COMMIT;
    resp->commit = r;
    if (irc == KVS_EQUOTA) {
        srv->metrics.alloc_failures_quota++;
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
    for (size_t i = 0; i < pn->n_block_ids; i++) {
        uint32_t b = pn->block_ids[i];
        pool_state_t st = POOL_FREE;
        rc = check_range(s, b, ctx);
        if (rc != 0)
            break;
        /* A block of a namespace this peer may not use is not its to pin,
         * and is answered exactly as a block that is not cached: a
         * different answer would let it find the other namespace's blocks
         * by probing ids. */
        bool hidden = pool_state(s->srv->pool, b, &st) == 0 && st == POOL_CACHED &&
                      !tenants_allowed(s, s->srv->block_ns[b]);
        rc = hidden ? KVS_ENOTFOUND : radix_pin(s->srv->index, b);
        if (rc == KVS_ENOTFOUND) {
            s->srv->metrics.pin_misses++;
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
        session_pin_add(s, b);
        hint_apply(s->srv, pn->hint, b);
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
    /* In order; on an error the blocks before it stay released and
     * n_released says how many. */
    for (size_t i = 0; i < rl->n_block_ids; i++) {
        uint32_t b = rl->block_ids[i];
        rc = check_range(s, b, ctx);
        if (rc != 0)
            break;
        if (srv->writer[b] == s) {
            session_writing_remove(s, b);
            pool_release(srv->pool, b);
        } else if (session_pin_count(s, b) > 0) {
            rc = radix_unpin(srv->index, b);
            if (rc != 0) {
                rc = fail(ctx, KVS_EINTERNAL,
                          "block %u: this session's pin is not in the index (%s)", b,
                          kvs_status_text(rc));
                break;
            }
            session_pin_drop(s, b);
            hint_apply(srv, rl->hint, b);
        } else {
            rc = not_held(s, b, ctx);
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
        rc = radix_unpin(srv->index, b);
        if (rc != 0) {
            rc = fail(ctx, KVS_EINTERNAL,
                      "tier-2 block %u: this session's pin is not in the index (%s)", t,
                      kvs_status_text(rc));
            break;
        }
        session_pin_drop(s, b);
        hint_apply(srv, rl->hint, b);
        r->n_released++;
    }
    return rc;
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
    r->sessions = srv->n_sessions;
    /* Every counter in the list (a copy: dispatch counts this request
     * before the reply is packed), and the named fields older clients read. */
    server_sync_counters(srv);
    uint64_t *counters = malloc(sizeof(srv->metrics.counters));
    if (!counters)
        return fail(ctx, KVS_ENOMEM, "out of memory for the stats counters");
    ctx->heap[1] = counters;
    memcpy(counters, srv->metrics.counters, sizeof(srv->metrics.counters));
    r->n_counters = KVS_N_COUNTERS;
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
            if (!tenants_allowed(s, i) || radix_ns_stats(srv->index, i, &st) != 0)
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

int handler_tree(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                 handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    const Kvshare__TreeRequest *tr = req->tree;
    uint32_t ns = RADIX_NS_ALL;
    size_t max = tr->max ? tr->max : TREE_DEFAULT_ROWS, n = 0;

    if (max > TREE_MAX_ROWS)
        max = TREE_MAX_ROWS;
    /* The listing walks the whole index: spaced so that walks take at most
     * 1/SERVER_WALK_SPACING of the loop's time, however many Trees a client
     * pipelines (a session without a socket, in tests, is never deferred). */
    uint64_t t0 = uv_hrtime();
    if (s->has_pipe && t0 < srv->walk_next_ns) {
        srv->metrics.requests_spaced++;
        return DISPATCH_DEFER;
    }
    if (tr->ns && tr->ns[0]) {
        int rc = ns_resolve(s, tr->ns, false, &ns, ctx);
        if (rc != 0)
            return rc;
    }
    /* Rows of namespaces this peer may not use are dropped below: ask for
     * more so the listing still fills. */
    size_t want = max;
    if (ns == RADIX_NS_ALL && srv->any_ns_acl)
        max = TREE_MAX_ROWS;
    radix_prefix_t *rows = malloc(max * sizeof(*rows));
    void *mem = malloc(max * (sizeof(Kvshare__Prefix) + sizeof(void *)));
    ctx->heap[0] = rows;
    ctx->heap[1] = mem;
    if (!rows || !mem)
        return fail(ctx, KVS_ENOMEM, "out of memory for %zu tree rows", max);
    int rc = radix_top(srv->index, ns, tr->by_size ? RADIX_BY_SIZE : RADIX_BY_HITS, rows, max, &n);
    uint64_t t1 = uv_hrtime();
    srv->walk_next_ns = t1 + (t1 - t0) * SERVER_WALK_SPACING;
    if (rc != 0)
        return fail(ctx, rc, "tree listing failed: %s", kvs_status_text(rc));

    uint64_t newest = 0;
    size_t kept = 0;
    for (size_t i = 0; i < n && kept < want; i++)
        if (tenants_allowed(s, rows[i].ns))
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
        out[i].tier = rows[i].last_block_id < srv->num_blocks ? 1 : 2;
        out[i].tier2_blocks = rows[i].tier2_blocks;
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
 * through server_on_evict, so KV events and metrics see them as evictions).
 * Pinned blocks and their prefixes stay; WRITING blocks are not in the
 * index. A namespace is never created here. */
int handler_clear(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    server_t *srv = s->srv;
    uint32_t ns;
    size_t cleared = 0;
    radix_ns_stats_t st;

    int rc = ns_resolve(s, req->clear->ns, false, &ns, ctx);
    if (rc != 0)
        return rc;
    rc = radix_ns_clear(srv->index, ns, &cleared);
    if (rc == 0)
        rc = radix_ns_stats(srv->index, ns, &st);
    if (rc != 0)
        return fail(ctx, KVS_EINTERNAL, "clearing namespace '%s' failed: %s",
                    radix_ns_name(srv->index, ns), kvs_status_text(rc));
    srv->metrics.clears++;
    srv->metrics.cleared_blocks += cleared;
    LOG_INFO("namespace '%s' cleared by session %llu: %zu blocks dropped, %u kept (pinned)",
             radix_ns_name(srv->index, ns), (unsigned long long)s->id, cleared, st.cached_blocks);

    Kvshare__ClearReply *r = &ctx->reply.clear;
    kvshare__clear_reply__init(r);
    r->n_cleared = (uint32_t)cleared;
    r->n_kept = st.cached_blocks;
    resp->rpc_case = KVSHARE__RESPONSE__RPC_CLEAR;
    resp->clear = r;
    return 0;
}

/* Evict: one prompt's cached blocks that nothing else needs leave every
 * tier (radix_evict_prompt), each through server_on_evict like any
 * eviction (BlockRemoved, the evictions and tier-2 drop counters). A
 * namespace is never created here. */
int handler_evict(session_t *s, const Kvshare__Request *req, Kvshare__Response *resp,
                  handler_ctx_t *ctx)
{
    const Kvshare__EvictRequest *ev = req->evict;
    const uint32_t *tokens;
    size_t n_tokens, matched, n1, n2;
    uint32_t ns;

    int rc = ns_resolve(s, ev->ns, false, &ns, ctx);
    if (rc == 0)
        rc = tokens_view(&ev->tokens, &tokens, &n_tokens, &ctx->heap[0], ctx);
    if (rc != 0)
        return rc;
    rc = radix_evict_prompt(s->srv->index, ns, tokens, n_tokens, &matched, &n1, &n2);
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
