/* SPDX-License-Identifier: Apache-2.0 */
#include "store_disk.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "kvshare_status.h"
#include "log.h"
#include "namespaces.h"
#include "nsname.h"
#include "store.h"
#include "tier_disk.h"
#include "tier_disk_medium.h"

/* --- the medium's source --- */

/* What a put's record names: tier-3 index id `id` (the block being copied
 * there; its chain is in the index under it already). */
static void src_meta(void *arg, uint32_t id, tier_disk_meta_t *out)
{
    server_t *srv = arg;
    store_t *st = srv->store;
    memset(out, 0, sizeof(*out));
    uint32_t ns = st->rec[id].meta.ns;
    out->ns_id = ns;
    const char *name = radix_ns_name(st->index, ns);
    const ns_identity_t *ni = namespaces_identity(srv, ns);
    out->ident_hash = ni->hash;
    if (name) {
        strncpy(out->ns, name, TIER_DISK_NS_MAX - 1);
        /* The file names the identity in words before its records do (a
         * compare when it does already; a failed write is logged, and
         * leaves those records unrestorable, never wrongly restored). */
        (void)tier_disk_ns_note(srv->disk_tier, name, ni->hash, ni->source, ni->text);
    }
    if (radix_block_chain(st->index, id, &out->chain_hash, &out->parent_hash, &out->tokens) == 0)
        out->ntokens = srv->geo.block_tokens;
}

/* On the loop: the tier-2 slot a put of tier-3 id `id` copies from (its
 * peer in the index while the move is in flight; that slot is not reused
 * before the move ends). UINT32_MAX when it is not one (cannot happen). */
static uint32_t src_locate(void *arg, uint32_t id)
{
    server_t *srv = arg;
    uint32_t from = 0;
    if (radix_block_peer(srv->store->index, id, &from) != 0 || from < srv->num_blocks ||
        from >= srv->num_blocks + srv->tier2_blocks)
        return UINT32_MAX;
    return from - srv->num_blocks;
}

/* On a tier thread: tier-2 slot `slot`'s pieces (one per layer and plane,
 * laid out as the pool's) gathered into dst, checksummed as they are
 * copied; returns the CRC32C of the block. Reads host memory only, which
 * the move keeps in place; touches nothing the loop changes. */
static uint32_t src_gather(void *arg, uint32_t slot, void *dst)
{
    const server_t *srv = arg;
    if (slot == UINT32_MAX) {
        memset(dst, 0, srv->block_bytes); /* a record of zeros, never named by the index */
        return crc32c(0, dst, srv->block_bytes);
    }
    const uint8_t *base = (const uint8_t *)backend_tier_base(srv->backend);
    uint64_t piece = geometry_slot_bytes(&srv->geo);
    uint32_t planes = geometry_planes(&srv->geo);
    uint8_t *out = dst;
    uint32_t crc = 0;
    for (uint32_t l = 0; l < srv->geo.layers; l++)
        for (uint32_t p = 0; p < planes; p++, out += piece)
            crc = crc32c_copy(
                crc, out, base + geometry_offset(&srv->geo, srv->tier2_blocks, l, p, slot), piece);
    return crc;
}

/* On a tier thread: a verified get's bytes into pool block id, piece by
 * piece (the backend writes device memory on cuda). The block is the
 * get's alone until it ends: a pool block the promotion took, which no one
 * reads or writes before the loop hears the get's end; the backend is used
 * from other threads the same way by the host tier's copies. Reads only
 * fields set at start. A failed write fails the get (undone: a miss). */
static int src_store(void *arg, uint32_t id, const void *buf)
{
    const server_t *srv = arg;
    uint64_t piece = geometry_slot_bytes(&srv->geo);
    uint32_t planes = geometry_planes(&srv->geo);
    const uint8_t *in = buf;
    for (uint32_t l = 0; l < srv->geo.layers; l++)
        for (uint32_t p = 0; p < planes; p++, in += piece) {
            int rc = backend_write(
                srv->backend, geometry_offset(&srv->geo, srv->num_blocks, l, p, id), in, piece);
            if (rc != 0)
                return rc;
        }
    return 0;
}

/* A tier-3 slot whose record did not verify at a get (its promotion was
 * undone): its block, and every block after it, can never be served, so
 * they leave the index (and the slot is free) rather than fail every
 * lookup that reaches them. The disk tier counted the failure. */
static void src_bad(void *arg, uint32_t slot)
{
    server_t *srv = arg;
    uint32_t id = srv->num_blocks + srv->tier2_blocks + slot;
    size_t n = 0;
    int rc = radix_drop_from(srv->store->index, id, &n);
    LOG_WARN("disk tier: slot %u did not verify: %zu blocks dropped from the index%s", slot, n,
             rc == KVS_EBUSY ? " (some kept: pinned or being copied)" : "");
}

int store_disk_open(server_t *srv, tier_medium_t **out)
{
    tier_disk_source_t src = {.meta = src_meta,
                              .bad = src_bad,
                              .arg = srv,
                              .store = src_store,
                              .locate = src_locate,
                              .gather = src_gather,
                              .block_tokens = srv->geo.block_tokens};
    return tier_disk_medium_open(srv->loop, srv->disk_tier, &src, out);
}

/* --- warm restart --- */

/* Records by (namespace name, chained hash): an open-addressing table of
 * record indexes. */
typedef struct rec_table {
    uint32_t *at; /* record index + 1; 0: empty */
    size_t mask;
} rec_table_t;

static uint64_t rec_key(const tier_disk_record_t *r, uint64_t hash)
{
    return hash ^ namespaces_seed(r->ns) * 0x9E3779B97F4A7C15ull;
}

static int table_build(rec_table_t *tb, const tier_disk_scan_t *sc)
{
    size_t cap = 64;
    while (cap < 2 * sc->n)
        cap *= 2;
    tb->at = calloc(cap, sizeof(*tb->at));
    tb->mask = cap - 1;
    if (!tb->at)
        return KVS_ENOMEM;
    for (size_t i = 0; i < sc->n; i++) {
        size_t h = rec_key(&sc->recs[i], sc->recs[i].chain_hash) & tb->mask;
        while (tb->at[h])
            h = (h + 1) & tb->mask;
        tb->at[h] = (uint32_t)i + 1;
    }
    return 0;
}

/* The record of namespace `like`'s namespace whose chained hash is hash,
 * or SIZE_MAX. */
static size_t table_find(const rec_table_t *tb, const tier_disk_scan_t *sc,
                         const tier_disk_record_t *like, uint64_t hash)
{
    for (size_t h = rec_key(like, hash) & tb->mask; tb->at[h]; h = (h + 1) & tb->mask) {
        const tier_disk_record_t *r = &sc->recs[tb->at[h] - 1];
        if (r->chain_hash == hash && strcmp(r->ns, like->ns) == 0)
            return tb->at[h] - 1;
    }
    return SIZE_MAX;
}

/* The namespace a record names, when this kvshared serves it (created if
 * the configuration allows dynamic namespaces). */
static int restore_ns(server_t *srv, const char *name, uint32_t *ns)
{
    if (radix_ns_find(srv->index, name, ns) == 0)
        return namespaces_usable(srv, *ns) ? 0 : KVS_ENONS;
    if (!srv->cfg.dynamic_namespaces || radix_ns_count(srv->index) >= srv->cfg.max_namespaces)
        return KVS_ENONS;
    int rc = radix_ns_create(srv->index, name, namespaces_seed(name), 0, 0, ns);
    if (rc == 0)
        radix_ns_set_priority(srv->index, *ns, RADIX_PRIO_DEFAULT, srv->cfg.default_max_priority);
    return rc;
}

/* Routers hear of blocks restored from the disk (the stream began with
 * AllBlocksCleared, before the restore): BlockStored on the disk's medium
 * for chain blocks [first, end) of path (root first), with the parent of
 * the first unless it chains from the namespace's seed. */
static void publish_restored(server_t *srv, uint32_t ns, const tier_disk_scan_t *sc,
                             const size_t *path, size_t depth, size_t first, size_t end,
                             const uint32_t *tokens, uint64_t *keys)
{
    const events_stream_t *es = namespaces_events_stream(srv, ns);
    if (!srv->events || !es->on || first == end)
        return;
    for (size_t k = first; k < end; k++)
        keys[k - first] = sc->recs[path[depth - 1 - k]].chain_hash;
    const tier_disk_record_t *r = &sc->recs[path[depth - 1 - first]];
    bool has_parent = r->parent_hash != namespaces_seed(r->ns);
    if (events_stored(srv->events, es, EVENTS_MEDIUM_DISK, keys, end - first, has_parent,
                      r->parent_hash, tokens + first * srv->geo.block_tokens) != 0)
        srv->metrics.kv_events_dropped++;
}

/* Restores the chain that ends at record `leaf`: walks its parents up to
 * the namespace's seed, then puts the chain in, root first. Returns the
 * blocks newly restored (0 when the chain does not reach its seed). */
static size_t restore_chain(server_t *srv, const tier_disk_scan_t *sc, const rec_table_t *tb,
                            size_t leaf, size_t *path, uint32_t *tokens, uint32_t *ids,
                            uint32_t *canonical, uint8_t *state, uint64_t *keys)
{
    store_t *st = srv->store;
    const tier_disk_record_t *r = &sc->recs[leaf];
    uint32_t bt = srv->geo.block_tokens, base3 = srv->num_blocks + srv->tier2_blocks;
    uint64_t seed = namespaces_seed(r->ns);
    size_t depth = 0, i = leaf;
    for (;;) {
        if (depth == sc->n || sc->recs[i].ntokens != bt)
            return 0; /* a cycle (crafted hashes) or a short block */
        path[depth++] = i;
        if (sc->recs[i].parent_hash == seed)
            break;
        i = table_find(tb, sc, r, sc->recs[i].parent_hash);
        if (i == SIZE_MAX)
            return 0; /* its parent was lost: unreachable */
    }
    uint32_t ns;
    if (restore_ns(srv, r->ns, &ns) != 0)
        return 0;
    for (size_t k = 0; k < depth; k++) {
        const tier_disk_record_t *c = &sc->recs[path[depth - 1 - k]];
        memcpy(tokens + k * bt, c->tokens, bt * sizeof(uint32_t));
        ids[k] = base3 + c->slot;
    }
    size_t done = 0;
    int rc = radix_restore(st->index, ns, tokens, depth * bt, ids, depth, canonical, &done);
    if (rc != 0)
        LOG_DEBUG("disk tier: a chain of %zu blocks restored up to %zu: %s", depth, done,
                  kvs_status_text(rc));
    size_t fresh = 0, run = 0; /* run: the blocks restored just before k */
    uint64_t now = uv_now(srv->loop);
    for (size_t k = 0; k < done; k++) {
        size_t ri = path[depth - 1 - k];
        if (canonical[k] != ids[k] || state[ri]) {
            publish_restored(srv, ns, sc, path, depth, k - run, k, tokens, keys);
            run = 0;
            continue;
        }
        const tier_disk_record_t *c = &sc->recs[ri];
        uint64_t h = 0;
        /* The index hashed the tokens under this kvshared's seed: a record
         * whose own hash disagrees is not what it claims; it goes again. */
        if (radix_block_hash(st->index, ids[k], &h) != 0 || h != c->chain_hash) {
            publish_restored(srv, ns, sc, path, depth, k - run, k, tokens, keys);
            run = 0;
            continue;
        }
        state[ri] = 1;
        store_record_t *rec = &st->rec[ids[k]];
        rec->meta = (store_meta_t){.hash = h, .cached_ms = now, .ns = ns};
        tier_disk_medium_restore(st->medium3, c->slot, c->chain_hash, c->seq, c->ns_id);
        fresh++;
        run++;
    }
    publish_restored(srv, ns, sc, path, depth, done - run, done, tokens, keys);
    return fresh;
}

/* --- identity at restart --- */

/* What the restore decided for one entry of the file's namespace table. */
typedef struct ns_verdict {
    bool resolved, served; /* served: the namespace exists here (restore_ns) */
    bool own;              /* a record carries the entry's identity */
    uint32_t ns;
    uint64_t hash; /* the namespace's identity now */
    size_t dropped;
    uint64_t dropped_hash; /* one dropped record's identity (the log's) */
} ns_verdict_t;

/* The namespace of table entry en now: created where it may be, and bound
 * back to the identity a worker had declared for it when its records are
 * of that identity (namespaces_identity_declare refuses where the config
 * or the daemon names another). */
static void resolve_verdict(server_t *srv, const tier_disk_ns_t *en, ns_verdict_t *v)
{
    v->resolved = true;
    if (restore_ns(srv, en->ns, &v->ns) != 0)
        return; /* not served: restore_chain drops its records */
    v->served = true;
    identity_t id;
    char msg[1024];
    if (en->source == IDENTITY_DECLARED && v->own && identity_parse(en->ident, &id) == 0 &&
        identity_hash(&id) == en->ident_hash &&
        namespaces_identity_declare(srv, v->ns, &id, IDENTITY_DECLARED, msg, sizeof(msg)) != 0)
        LOG_WARN("disk tier: namespace '%s' is not bound back to its declared identity: %s", en->ns,
                 msg);
    v->hash = namespaces_identity(srv, v->ns)->hash;
}

/* Drops from the scan every record whose identity is not its namespace's
 * now (or is unknown: its namespace is not in the table), before any chain
 * is restored: its slot is free, it is counted (disk_identity_dropped) and
 * each namespace says so once, with both identities in words. */
static int filter_identity(server_t *srv, tier_disk_t *td, tier_disk_scan_t *sc)
{
    ns_verdict_t *v = calloc(TIER_DISK_NS_SLOTS, sizeof(*v));
    tier_disk_ns_t *en = malloc(sizeof(*en));
    if (!v || !en) {
        free(v);
        free(en);
        return KVS_ENOMEM;
    }
    for (size_t i = 0; i < sc->n; i++) {
        const tier_disk_record_t *r = &sc->recs[i];
        if (r->entry < TIER_DISK_NS_SLOTS && tier_disk_ns_get(td, r->entry, en) == 0 &&
            r->ident_hash == en->ident_hash)
            v[r->entry].own = true;
    }
    size_t w = 0, unnamed = 0, misnamed = 0;
    for (size_t i = 0; i < sc->n; i++) {
        tier_disk_record_t *r = &sc->recs[i];
        bool keep = false;
        if (!nsname_valid(r->ns)) {
            /* Only a file changed by hand names one. It is no namespace
             * here, so no identity of one: dropped and counted with the
             * records of an identity the file does not name. */
            if (misnamed++ == 0)
                LOG_WARN("disk tier: records of a namespace whose name breaks the rule (%s) "
                         "are dropped",
                         nsname_rule());
        } else if (r->entry < TIER_DISK_NS_SLOTS && tier_disk_ns_get(td, r->entry, en) == 0) {
            ns_verdict_t *vr = &v[r->entry];
            if (!vr->resolved)
                resolve_verdict(srv, en, vr);
            keep = !vr->served || r->ident_hash == vr->hash;
            if (!keep && vr->dropped++ == 0)
                vr->dropped_hash = r->ident_hash;
        } else if (unnamed++ == 0) {
            LOG_WARN("disk tier: records of namespace '%s' (and maybe others) are not restored: "
                     "the file's namespace table does not name their identity",
                     r->ns);
        }
        if (keep) {
            sc->recs[w++] = *r;
            continue;
        }
        srv->metrics.disk_identity_dropped++;
        tier_disk_slot_free(td, r->slot);
        tier_disk_medium_found(srv->store->medium3, r->slot, r->chain_hash);
        free(r->tokens);
    }
    sc->n = w;
    for (uint32_t e = 0; e < TIER_DISK_NS_SLOTS; e++) {
        if (v[e].dropped == 0 || tier_disk_ns_get(td, e, en) != 0)
            continue;
        const ns_identity_t *now = namespaces_identity(srv, v[e].ns);
        char was[TIER_DISK_IDENT_MAX + 64];
        if (v[e].dropped_hash == en->ident_hash)
            snprintf(was, sizeof(was), "'%s' (%s)", en->ident,
                     identity_source_name((identity_source_t)en->source));
        else
            snprintf(was, sizeof(was), "an identity the file no longer names (hash %016" PRIx64 ")",
                     v[e].dropped_hash);
        LOG_WARN("disk tier: namespace '%s': %zu blocks not restored: they hold the KV of %s, and "
                 "the namespace's identity is now '%s' (%s); their slots are free",
                 en->ns, v[e].dropped, was, now->text, identity_source_name(now->source));
    }
    if (unnamed > 0)
        LOG_WARN("disk tier: %zu records of namespaces the table does not name were dropped",
                 unnamed);
    free(v);
    free(en);
    return 0;
}

/* Whether record i is some other record's parent (then a longer chain
 * restores it). */
static void mark_parents(const tier_disk_scan_t *sc, const rec_table_t *tb, uint8_t *is_parent)
{
    for (size_t i = 0; i < sc->n; i++) {
        const tier_disk_record_t *r = &sc->recs[i];
        if (r->parent_hash == namespaces_seed(r->ns))
            continue;
        size_t p = table_find(tb, sc, r, r->parent_hash);
        if (p != SIZE_MAX)
            is_parent[p] = 1;
    }
}

int store_disk_restore(server_t *srv, size_t *restored, size_t *dropped)
{
    store_t *st = srv->store;
    *restored = *dropped = 0;
    if (!st->medium3)
        return 0;
    tier_disk_t *td = tier_disk_medium_disk(st->medium3);
    tier_disk_scan_t sc;
    tier_disk_take_scan(td, &sc);
    srv->metrics.disk_deleted_dropped += sc.deleted;
    int frc = filter_identity(srv, td, &sc);
    if (frc != 0 || sc.n == 0) {
        for (size_t i = 0; i < sc.n; i++) /* out of memory: nothing is restored */
            tier_disk_slot_free(td, sc.recs[i].slot);
        tier_disk_scan_free(&sc);
        return frc;
    }
    uint32_t bt = srv->geo.block_tokens;
    rec_table_t tb = {0};
    size_t *path = malloc(sc.n * sizeof(*path));
    uint32_t *tokens = malloc(sc.n * bt * sizeof(*tokens));
    uint32_t *ids = malloc(sc.n * sizeof(*ids));
    uint32_t *canonical = malloc(sc.n * sizeof(*canonical));
    uint8_t *is_parent = calloc(sc.n, 1);
    uint8_t *state = calloc(sc.n, 1); /* 1: restored */
    uint64_t *keys = malloc(sc.n * sizeof(*keys));
    int rc = path && tokens && ids && canonical && is_parent && state && keys
                 ? table_build(&tb, &sc)
                 : KVS_ENOMEM;
    if (rc == 0) {
        mark_parents(&sc, &tb, is_parent);
        /* Leaves oldest first (the scan's order), so recency follows the
         * sequence numbers: the newest chains are the last to go. */
        for (size_t i = 0; i < sc.n; i++)
            if (!is_parent[i])
                *restored +=
                    restore_chain(srv, &sc, &tb, i, path, tokens, ids, canonical, state, keys);
        /* A parent no leaf reached (its leaves were dropped): its own chain. */
        for (size_t i = sc.n; i-- > 0;)
            if (is_parent[i] && !state[i])
                *restored +=
                    restore_chain(srv, &sc, &tb, i, path, tokens, ids, canonical, state, keys);
    }
    /* Whatever did not go in frees its slot: never served. */
    for (size_t i = 0; i < sc.n; i++)
        if (!state || !state[i]) {
            tier_disk_slot_free(td, sc.recs[i].slot);
            tier_disk_medium_found(st->medium3, sc.recs[i].slot, sc.recs[i].chain_hash);
            (*dropped)++;
        }
    free(tb.at);
    free(path);
    free(tokens);
    free(ids);
    free(canonical);
    free(is_parent);
    free(state);
    free(keys);
    tier_disk_scan_free(&sc);
    return rc;
}

/* --- deletion ---
 *
 * A deletion is on the disk when its call returns (O_DIRECT writes): no
 * SIGKILL undoes it. The fdatasync that makes it outlast a power loss too
 * takes milliseconds (the disk's cache flush): it runs on a thread
 * (tier_disk_sync_async), and the loop goes on. */

int store_disk_forget_ns(server_t *srv, uint32_t ns)
{
    if (!srv->store || !srv->store->medium3)
        return 0;
    const char *name = radix_ns_name(srv->index, ns);
    if (!name)
        return 0;
    const ns_identity_t *ni = namespaces_identity(srv, ns);
    int rc = tier_disk_ns_delete(srv->disk_tier, name, ni->hash, ni->source, ni->text);
    if (rc == 0)
        tier_disk_sync_async(srv->disk_tier);
    return rc;
}

int store_disk_forget_prompt(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_tokens)
{
    size_t n = n_tokens / srv->geo.block_tokens, k = 0;
    if (!srv->store || !srv->store->medium3 || n == 0)
        return 0;
    uint64_t *hashes = malloc(n * sizeof(*hashes));
    uint32_t *ids = malloc(n * sizeof(*ids));
    size_t kept = 0;
    /* The blocks the Evict kept (pinned, or continued by another prompt)
     * are the prompt's cached prefix: their records stay. */
    int rc =
        hashes && ids ? radix_match(srv->index, ns, tokens, n_tokens, ids, n, &kept) : KVS_ENOMEM;
    if (rc == 0)
        rc = radix_chain_hashes(srv->index, ns, tokens, n, hashes);
    size_t looked = 0;
    if (rc == 0 && kept < n)
        rc = tier_disk_medium_forget(srv->store->medium3, hashes + kept, n - kept, &k, &looked);
    LOG_DEBUG("disk tier: an Evict of %zu blocks deleted %zu records (%zu slots looked at)",
              n - kept, k, looked);
    if (rc == 0 && k > 0)
        tier_disk_sync_async(srv->disk_tier);
    free(hashes);
    free(ids);
    return rc;
}
