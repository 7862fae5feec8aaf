/* SPDX-License-Identifier: Apache-2.0 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_store.h"
#include "events.h"
#include "inflight.h"
#include "kvshare_status.h"
#include "log.h"
#include "session.h"
#include "namespaces.h"
#include "store_disk.h"
#include "store_restore.h"
#include "tier.h"
#include "disk.h"
#include "tier_medium.h"

/* --- records, and what the index tells of the blocks it drops --- */

/* The medium KV events name for index id `id`: its tier's. */
static events_medium_t tier_event_medium(const server_t *srv, uint32_t id)
{
    if (id < srv->num_blocks)
        return EVENTS_MEDIUM_POOL;
    return id < srv->num_blocks + srv->tier2_blocks ? EVENTS_MEDIUM_HOST : EVENTS_MEDIUM_DISK;
}

/* The index dropped block_id for good, from any tier: it goes back to
 * the pool (a lower tier's id is the index's own, free there already), and
 * routers hear that it left the node: BlockRemoved on the medium of the
 * tier it was in, its only one (tiers are exclusive; a move between them
 * publishes in publish_moved). */
static void on_evict(void *ctx, uint32_t block_id)
{
    server_t *srv = ctx;
    store_t *st = srv->store;
    const store_meta_t *m = &st->rec[block_id].meta;
    bool tier2 = block_id >= srv->num_blocks; /* or tier 3 */
    bool tier3 = block_id >= srv->num_blocks + srv->tier2_blocks;
    srv->metrics.evictions++;
    if (tier2)
        srv->metrics.tier2_drops++;
    if (srv->events && events_removed(srv->events, namespaces_events_stream(srv, m->ns),
                                      tier_event_medium(srv, block_id), m->hash) != 0)
        srv->metrics.kv_events_dropped++;
    metrics_observe(&srv->metrics.block_lifetime, metrics_block_bounds_ms, metrics_block_n_bounds,
                    uv_now(srv->loop) - m->cached_ms);
    if (!tier2) {
        pool_release(st->pool, block_id);
    } else if (tier3 && st->medium3) {
        uint32_t slot = block_id - srv->num_blocks - srv->tier2_blocks;
        st->medium3->ops->drop(st->medium3, &slot, 1);
    } else if (!tier3 && st->medium) {
        uint32_t slot = block_id - srv->num_blocks;
        st->medium->ops->drop(st->medium, &slot, 1);
    }
}

/* Just before on_evict: the dropped block's tokens, for the report of the
 * store call running (store_evicted_t), if it asked for this namespace. */
static void on_evict_tokens(void *ctx, uint32_t block_id, uint32_t ns, const uint32_t *tokens)
{
    server_t *srv = ctx;
    store_evicted_t *r = srv->store->report;
    (void)block_id;
    if (!r || !r->tokens || ns != r->ns || r->n >= r->max)
        return;
    uint32_t bt = srv->geo.block_tokens;
    uint8_t *out = r->tokens + r->n * bt * 4;
    for (uint32_t i = 0; i < bt; i++) {
        out[4 * i] = (uint8_t)tokens[i];
        out[4 * i + 1] = (uint8_t)(tokens[i] >> 8);
        out[4 * i + 2] = (uint8_t)(tokens[i] >> 16);
        out[4 * i + 3] = (uint8_t)(tokens[i] >> 24);
    }
    r->n++;
}

/* Several devices: a block freed while some ranks' shards were missing
 * (its holder released it, or ended). Those ranks may yet send that
 * commit, late, into the block allocated again: one that names the prefix
 * the other ranks had declared is refused (store_commit_shard). A rank's
 * first commit into the block after that settles it either way. */
typedef struct store_stale {
    uint64_t hash;  /* the prefix the shards in were declared for */
    uint64_t ranks; /* the ranks whose shard was missing and that did not commit since */
} store_stale_t;

int store_open(server_t *srv, store_t **out, char *err, size_t errlen)
{
    store_t *st = calloc(1, sizeof(*st));
    if (!st) {
        snprintf(err, errlen, "out of memory for the block store");
        return KVS_ENOMEM;
    }
    st->srv = srv;
    int rc = pool_new(srv->num_blocks, &st->pool);
    if (rc != 0) {
        snprintf(err, errlen, "cannot create a pool of %u blocks: %s", srv->num_blocks,
                 kvs_status_text(rc));
        goto fail;
    }
    radix_config_t rcfg = {
        .block_tokens = srv->geo.block_tokens,
        .max_blocks = srv->num_blocks,
        .on_evict = on_evict,
        .on_evict_tokens = on_evict_tokens,
        .evict_ctx = srv,
        .policy = srv->cfg.eviction,
        .tier2_blocks = srv->tier2_blocks,
        .tier3_blocks = srv->tier3_blocks,
    };
    rc = radix_new(&rcfg, &st->index);
    if (rc != 0) {
        snprintf(err, errlen, "cannot create the index: %s", kvs_status_text(rc));
        goto fail;
    }
    radix_hint_limit(st->index, srv->cfg.max_timed_hints);
    /* By index id: tier-2 blocks keep what names them too. */
    st->n_ids = srv->num_blocks + srv->tier2_blocks + srv->tier3_blocks;
    st->rec = calloc(st->n_ids, sizeof(*st->rec));
    st->keys = calloc(srv->num_blocks, sizeof(*st->keys));
    st->lower = calloc(srv->num_blocks, sizeof(*st->lower));
    if (srv->n_devices > 1)
        st->stale = calloc(srv->num_blocks, sizeof(*st->stale));
    if (!st->rec || !st->keys || !st->lower || (srv->n_devices > 1 && !st->stale)) {
        snprintf(err, errlen, "out of memory for the records of %u blocks", st->n_ids);
        rc = KVS_ENOMEM;
        goto fail;
    }
    /* The medium below the pool: host memory (--host-tier). */
    if (srv->tier2_blocks > 0 && (rc = tier_host_open(srv, &st->medium)) != 0) {
        snprintf(err, errlen, "out of memory for the host tier");
        goto fail;
    }
    /* Below it, the disk (--disk-tier-path). */
    srv->store = st; /* the disk medium's source reads the store's records */
    if (srv->tier3_blocks > 0 && (rc = store_disk_open(srv, &st->medium3)) != 0) {
        snprintf(err, errlen, "cannot start the disk tier's medium: %s", kvs_status_text(rc));
        srv->store = NULL;
        goto fail;
    }
    srv->pool = st->pool;
    srv->index = st->index;
    *out = st;
    return 0;
fail:
    store_free(st);
    return rc;
}

static void drains_free(store_t *st);

void store_free(store_t *st)
{
    if (!st)
        return;
    if (st->medium) {
        tier_medium_stats_t ms;
        st->medium->ops->stats(st->medium, &ms);
        LOG_INFO("tier 2 (%s, %u blocks): %llu puts, %llu gets, %llu blocks copied, %llu failed",
                 st->medium->ops->name, st->medium->capacity, (unsigned long long)ms.puts,
                 (unsigned long long)ms.gets, (unsigned long long)ms.blocks,
                 (unsigned long long)ms.failures);
    }
    tier_medium_close(st->medium);
    tier_medium_close(st->medium3);
    drains_free(st); /* the index goes whole: no pin needs letting go */
    radix_free(st->index);
    pool_free(st->pool);
    free(st->rec);
    free(st->keys);
    free(st->lower);
    free(st->stale);
    free(st);
}

/* --- holdings: a session's WRITING blocks --- */

static uint64_t full_mask(const server_t *srv);

/* Notes what block b, leaving WRITING, still owes (store_stale_t). */
static void stale_note(server_t *srv, uint32_t b)
{
    store_t *st = srv->store;
    if (!st->stale || b >= srv->num_blocks)
        return;
    uint64_t shards = st->rec[b].shards, full = full_mask(srv);
    st->stale[b].ranks = shards != 0 && shards != full ? full & ~shards : 0;
    st->stale[b].hash = st->rec[b].shard_hash;
}

/* b is WRITING by s (room reserved in s's list). */
static void writing_add(store_t *st, session_t *s, uint32_t b)
{
    store_record_t *r = &st->rec[b];
    r->writer = s;
    r->writer_pos = s->own.n_writing;
    r->shards = 0; /* no rank has written its shard yet */
    s->own.writing[s->own.n_writing++] = b;
}

/* s no longer writes b (the caller changes its pool state); it leaves the
 * in-flight table. */
static void writing_remove(server_t *srv, session_t *s, uint32_t b)
{
    store_record_t *rec = srv->store->rec;
    inflight_undeclare(srv, b);
    uint32_t pos = rec[b].writer_pos;
    uint32_t last = s->own.writing[--s->own.n_writing];
    s->own.writing[pos] = last;
    rec[last].writer_pos = pos;
    rec[b].writer = NULL;
    stale_note(srv, b);
}

/* --- hints --- */

void store_hint(store_t *st, const store_hint_t *h, uint32_t b)
{
    server_t *srv = st->srv;
    if (!h || !h->set)
        return;
    uint64_t until = h->duration_ms ? uv_now(srv->loop) + h->duration_ms : 0;
    int rc = radix_hint(srv->store->index, b, h->priority, until);
    if (rc == KVS_ELIMIT) {
        srv->metrics.hints_refused++; /* max_timed_hints: a hint, never an error */
        return;
    }
    if (rc != 0 && rc != KVS_ENOTFOUND)
        LOG_WARN("retention hint on block %u: %s", b, kvs_status_text(rc));
}

/* Timed hints that ended go back to their namespace's default before the
 * index chooses what to evict. */
static void hints_expire(server_t *srv)
{
    radix_expire_hints(srv->store->index, uv_now(srv->loop), NULL);
}

/* --- alloc and evict --- */

/* Room in the report for the blocks an eviction of n may drop. */
static int report_open(store_evicted_t *r, size_t n, uint32_t block_tokens)
{
    if (!r || !r->want)
        return 0;
    free(r->tokens);
    r->n = 0;
    r->max = n;
    r->tokens = malloc(n * block_tokens * 4);
    return r->tokens ? 0 : KVS_ENOMEM;
}

int store_evict(store_t *st, uint32_t ns, size_t n, size_t *evicted, store_evicted_t *report)
{
    st->report = report;
    int rc = radix_evict(st->index, ns, n, evicted);
    st->report = NULL;
    return rc;
}

int store_alloc(store_t *st, session_t *s, uint32_t ns, uint32_t n, const uint64_t *hashes,
                uint32_t *ids, size_t *evicted, store_evicted_t *report)
{
    server_t *srv = st->srv;
    *evicted = 0;
    int rc = pool_alloc(st->pool, n, ids);
    if (rc == KVS_EPOOLFULL) {
        /* A full pool is the signal to evict unpinned cached blocks, then retry. */
        pool_counts_t c;
        pool_counts(st->pool, &c);
        size_t need = n - c.free;
        hints_expire(srv);
        if (report_open(report, need, srv->geo.block_tokens) != 0)
            return KVS_ENOMEM;
        if (store_tiers_usable(st)) {
            /* Demote instead of drop: the request waits for the copies,
             * and the report names what the run that answers dropped. */
            st->report = report;
            rc = tier_demote(srv, s, ns, need);
            st->report = NULL;
            if (rc == 0)
                rc = tier_wait(srv, s);
            if (rc == 1)
                return STORE_WAIT;
        } else {
            /* In pieces, each bounded: another session's requests run
             * between them (they may take blocks freed here: then this one
             * evicts more at its next run). */
            bool pieces = s->sock.has_pipe && !srv->stopping && !(report && report->want) &&
                          need > STORE_PIECE_BLOCKS;
            size_t step = pieces ? STORE_PIECE_BLOCKS : need;
            rc = store_evict(st, ns, step, evicted, report);
            if (rc == 0 && pieces && *evicted == step)
                return STORE_MORE;
        }
        if (rc != 0)
            return rc;
        rc = pool_alloc(st->pool, n, ids);
    }
    if (rc == KVS_EPOOLFULL)
        srv->metrics.alloc_failures++;
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        writing_add(st, s, ids[i]);
    if (hashes)
        inflight_declare(srv, ns, hashes, ids, n);
    return 0;
}

/* --- commit --- */

void store_mark_begin(store_t *st)
{
    if (++st->mark_stamp == 0) {
        for (uint32_t b = 0; b < st->n_ids; b++)
            st->rec[b].mark = 0;
        st->mark_stamp = 1;
    }
}

bool store_mark(store_t *st, uint32_t b)
{
    if (st->rec[b].mark == st->mark_stamp)
        return true;
    st->rec[b].mark = st->mark_stamp;
    return false;
}

/* Before a commit's insert, with KV events and lower tiers: which blocks
 * of its prefix are cached now (st->lower[0 .. return)), so that
 * publish_stored sees those below tier 1 that the commit's own copies
 * replace (radix_insert upgrades them without an eviction). */
static size_t lower_before(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_tokens)
{
    size_t n = 0;
    if (!srv->events || srv->tier2_blocks == 0 ||
        radix_match(srv->store->index, ns, tokens, n_tokens, srv->store->lower, srv->num_blocks,
                    &n) != 0)
        return 0;
    return n;
}

/* KV events of blocks [first, end) of a commit: one BlockStored per run of
 * blocks it cached (fresh[i - first] != 0), whose parent is the block before the run. A duplicate
 * publishes nothing. Parents go first: a run's parent was cached before
 * this commit or earlier in it, and its event queued then. A block that
 * was below tier 1 before the commit (st->lower[i], i < n_lower) moved to
 * the pool: BlockRemoved on its old medium follows the BlockStored. */
static void publish_stored(server_t *srv, uint32_t ns, const uint32_t *ids,
                           const uint32_t *canonical, const uint32_t *fresh, size_t first,
                           size_t end, const uint32_t *tokens, size_t n_lower)
{
    store_t *st = srv->store;
    const events_stream_t *es = namespaces_events_stream(srv, ns);
    uint32_t bt = srv->geo.block_tokens;
    if (!es->on)
        return;
    for (size_t i = first; i < end;) {
        if (!fresh[i - first]) {
            i++;
            continue;
        }
        size_t run = i;
        while (run < end && fresh[run - first])
            run++;
        uint64_t parent = 0;
        bool has_parent = i > 0 && radix_block_hash(st->index, canonical[i - 1], &parent) == 0;
        for (size_t k = i; k < run; k++)
            st->keys[k - i] = st->rec[ids[k]].meta.hash;
        if (events_stored(srv->events, es, EVENTS_MEDIUM_POOL, st->keys, run - i, has_parent,
                          parent, tokens + i * bt) != 0)
            srv->metrics.kv_events_dropped++;
        for (size_t k = i; k < run && k < n_lower; k++) {
            events_medium_t was = tier_event_medium(srv, st->lower[k]);
            if (st->lower[k] >= srv->num_blocks &&
                strcmp(events_medium_name(srv->events, was),
                       events_medium_name(srv->events, EVENTS_MEDIUM_POOL)) != 0 &&
                events_removed(srv->events, es, was, st->keys[k - i]) != 0)
                srv->metrics.kv_events_dropped++;
        }
        i = run;
    }
}

/* Block b of session s now holds a prefix of ns in the index: CACHED. */
static void became_cached(server_t *srv, session_t *s, uint32_t ns, uint32_t b)
{
    store_t *st = srv->store;
    store_record_t *r = &st->rec[b];
    r->meta.cached_ms = r->used_ms = uv_now(srv->loop);
    r->meta.ns = ns;
    r->meta.hash = 0;
    if (srv->events)
        radix_block_hash(st->index, b, &r->meta.hash);
    writing_remove(srv, s, b);
    if (pool_set_cached(st->pool, b) != 0)
        LOG_ERROR("block %u was WRITING for session %llu but the pool refused it", b,
                  (unsigned long long)s->id);
}

int store_commit_range(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t first, size_t end,
                       const store_hint_t *hint, uint32_t *canonical, size_t *n_done)
{
    server_t *srv = st->srv;
    uint32_t bt = srv->geo.block_tokens;
    size_t n = end - first, done = 0;
    *n_done = first;
    hints_expire(srv); /* a namespace at its quota evicts in the insert */
    /* Read before the insert upgrades them: which positions were below
     * tier 1 (KV events). A walk from the root, as long as the prefix. */
    size_t n_lower = n ? lower_before(srv, ns, tokens, end * bt) : 0;
    int irc = 0;
    if (n > 0)
        irc = radix_insert_after(st->index, ns, first ? canonical[first - 1] : RADIX_NO_BLOCK,
                                 tokens + first * bt, n_tokens - first * bt, ids + first, n, true,
                                 canonical + first, &done);
    /* Which blocks this call cached (KV events, the cluster tier), in the
     * scratch after end. */
    uint32_t *fresh = canonical + end;
    memset(fresh, 0, done * sizeof(*fresh));
    for (size_t j = 0; j < done; j++) {
        size_t i = first + j;
        uint32_t b = ids[i];
        if (st->rec[b].writer != s) {
            /* A cached block named here: the session already pins it; the
             * insert's pin is taken back so that one Release frees it. */
            if (canonical[i] == b && radix_unpin(st->index, b) == 0)
                continue;
            LOG_ERROR("cached block %u of session %llu was checked at position %zu but the "
                      "index disagrees",
                      b, (unsigned long long)s->id, i);
            if (canonical[i] != b)
                session_pin_add(s, canonical[i]);
            continue;
        }
        if (canonical[i] == b) {
            fresh[j] = srv->events != NULL || srv->cluster != NULL;
            became_cached(srv, s, ns, b);
        }
        /* A duplicate stays WRITING, held by this session until released;
         * its prefix is cached now, so it is no longer in flight. */
        inflight_undeclare(srv, b);
        session_pin_add(s, canonical[i]);
    }
    for (size_t j = 0; j < done; j++)
        store_hint(st, hint, canonical[first + j]);
    /* An empty Commit may carry no tokens or ids at all (NULL arrays). */
    if (srv->events && done > 0)
        publish_stored(srv, ns, ids, canonical, fresh, first, first + done, tokens, n_lower);
    if (done > 0)
        cluster_store_committed(srv, ns, ids + first, fresh, done, tokens + first * bt);
    if (irc == KVS_EQUOTA)
        srv->metrics.alloc_failures_quota++;
    *n_done = first + done;
    return irc;
}

int store_commit(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                 const uint32_t *ids, size_t n_ids, const store_hint_t *hint, uint32_t *canonical,
                 size_t *n_done)
{
    return store_commit_range(st, s, ns, tokens, n_tokens, ids, 0, n_ids, hint, canonical, n_done);
}

int store_block_walk(const store_t *st, uint32_t slab_blocks, uint32_t b, store_piece_fn piece,
                     void *arg)
{
    const server_t *srv = st->srv;
    const geometry_t *g = &srv->geo;
    uint64_t bytes = geometry_slot_bytes(g);
    uint32_t planes = geometry_planes(g);
    uint64_t at = 0;
    for (uint32_t l = 0; l < g->layers; l++)
        for (uint32_t p = 0; p < planes; p++, at += bytes) {
            int rc = piece(arg, geometry_offset(g, slab_blocks, l, p, b), at, bytes);
            if (rc != 0)
                return rc;
        }
    return 0;
}

typedef struct block_copy {
    backend_t *backend;
    const unsigned char *in; /* store_block_write */
    unsigned char *out;      /* store_block_read */
} block_copy_t;

static int piece_write(void *arg, uint64_t slab_off, uint64_t block_off, uint64_t bytes)
{
    const block_copy_t *c = arg;
    return backend_write(c->backend, slab_off, c->in + block_off, bytes);
}

static int piece_read(void *arg, uint64_t slab_off, uint64_t block_off, uint64_t bytes)
{
    const block_copy_t *c = arg;
    return backend_read(c->backend, slab_off, c->out + block_off, bytes);
}

int store_block_write(const store_t *st, uint32_t b, const void *payload)
{
    const server_t *srv = st->srv;
    block_copy_t c = {.backend = srv->backend, .in = payload};
    return store_block_walk(st, srv->num_blocks, b, piece_write, &c);
}

int store_block_read(const store_t *st, uint32_t b, void *out)
{
    const server_t *srv = st->srv;
    block_copy_t c = {.backend = srv->backend, .out = out};
    return store_block_walk(st, srv->num_blocks, b, piece_read, &c);
}

int store_install_take(store_t *st, uint32_t ns, size_t n, uint32_t *ids, size_t *n_taken)
{
    server_t *srv = st->srv;
    pool_counts_t pc;
    *n_taken = 0;
    pool_counts(st->pool, &pc);
    if (n > pc.free && !store_tiers_usable(st)) {
        /* Room as an Alloc makes it: the least worth keeping unpinned
         * blocks go. (With a tier 2 that would be demotions the request
         * waits for: only free blocks are taken then.) */
        size_t evicted = 0;
        hints_expire(srv);
        store_evict(st, ns, n - pc.free, &evicted, NULL);
        pool_counts(st->pool, &pc);
    }
    if (n > pc.free)
        n = pc.free;
    if (n == 0)
        return KVS_EPOOLFULL;
    int rc = pool_alloc(st->pool, (uint32_t)n, ids);
    if (rc == 0)
        *n_taken = n;
    return rc;
}

int store_install_done(store_t *st, uint32_t ns, const uint32_t *tokens, const uint32_t *prefix_ids,
                       size_t m, const uint32_t *taken, size_t written, size_t n_taken,
                       size_t *n_installed)
{
    server_t *srv = st->srv;
    *n_installed = 0;
    size_t total = m + written;
    uint32_t *ids = malloc((total ? total : 1) * sizeof(*ids));
    uint32_t *canonical = malloc(2 * (total ? total : 1) * sizeof(*canonical));
    int rc = ids && canonical ? 0 : KVS_ENOMEM;
    size_t n_done = 0, n_lower = 0;
    if (rc == 0 && written > 0) {
        memcpy(ids, prefix_ids, m * sizeof(*ids));
        memcpy(ids + m, taken, written * sizeof(*ids));
        n_lower = lower_before(srv, ns, tokens, total * srv->geo.block_tokens);
        rc = radix_insert(st->index, ns, tokens, total * srv->geo.block_tokens, ids, total, false,
                          canonical, &n_done);
    }
    uint32_t *fresh = canonical ? canonical + total : NULL;
    if (fresh)
        memset(fresh, 0, total * sizeof(*fresh));
    uint64_t now = uv_now(srv->loop);
    for (size_t j = 0; j < n_taken; j++) {
        uint32_t b = taken[j];
        size_t i = m + j;
        if (j < written && fresh && i < n_done && canonical[i] == b) {
            store_record_t *r = &st->rec[b];
            r->meta.cached_ms = r->used_ms = now;
            r->meta.ns = ns;
            r->meta.hash = 0;
            radix_block_hash(st->index, b, &r->meta.hash);
            r->writer = NULL;
            fresh[i] = 1;
            pool_set_cached(st->pool, b);
            (*n_installed)++;
        } else {
            pool_release(st->pool, b);
        }
    }
    if (srv->events && n_done > 0)
        publish_stored(srv, ns, ids, canonical, fresh, 0, n_done, tokens, n_lower);
    free(ids);
    free(canonical);
    return rc;
}

int store_install(store_t *st, uint32_t ns, const uint32_t *tokens, const uint32_t *prefix_ids,
                  size_t m, const void *const *payloads, size_t n, size_t *n_installed)
{
    *n_installed = 0;
    uint32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    size_t taken = 0, written = 0;
    if (!ids)
        return KVS_ENOMEM;
    int rc = store_install_take(st, ns, n, ids, &taken);
    if (rc != 0) {
        free(ids);
        return rc;
    }
    while (written < taken && store_block_write(st, ids[written], payloads[written]) == 0)
        written++;
    rc = store_install_done(st, ns, tokens, prefix_ids, m, ids, written, taken, n_installed);
    free(ids);
    return rc;
}

/* --- pins and releases --- */

int store_pin(store_t *st, session_t *s, uint32_t b, const store_hint_t *hint)
{
    server_t *srv = st->srv;
    pool_state_t ps = POOL_FREE;
    /* A block of a namespace this peer may not use is not its to pin, and
     * is answered exactly as a block that is not cached: a different answer
     * would let it find the other namespace's blocks by probing ids. */
    bool hidden = pool_state(st->pool, b, &ps) == 0 && ps == POOL_CACHED &&
                  !namespaces_allowed(s, st->rec[b].meta.ns);
    int rc = hidden ? KVS_ENOTFOUND : radix_pin(st->index, b);
    if (rc == KVS_ENOTFOUND)
        srv->metrics.pin_misses++;
    if (rc != 0)
        return rc;
    session_pin_add(s, b);
    store_hint(st, hint, b);
    return 0;
}

int store_release(store_t *st, session_t *s, uint32_t b, const store_hint_t *hint)
{
    server_t *srv = st->srv;
    if (b < srv->num_blocks && st->rec[b].writer == s) {
        writing_remove(srv, s, b);
        pool_release(st->pool, b);
        return 0;
    }
    if (session_pin_count(s, b) == 0)
        return KVS_ENOTHELD;
    int rc = radix_unpin(st->index, b);
    if (rc != 0)
        return rc;
    session_pin_drop(s, b);
    store_hint(st, hint, b);
    return 0;
}

/* A closed session's pin map, let go of in steps. */
typedef struct store_drain {
    struct store_drain *next;
    uint32_t *keys; /* the session's map (session_pins_t), now the store's */
    uint32_t *counts;
    uint32_t cap;
    uint32_t pos;  /* next slot to let go of */
    uint64_t left; /* pins not let go of yet */
    uint64_t session_id;
} store_drain_t;

/* Lets go of up to *budget pins of d (each radix_unpin, and each slot
 * looked at, costs one); true when d is done. */
static bool drain_some(server_t *srv, store_drain_t *d, uint64_t *budget)
{
    store_t *st = srv->store;
    while (*budget > 0 && d->pos < d->cap) {
        uint32_t b = d->keys[d->pos];
        (*budget)--;
        if (b == SESSION_NO_BLOCK) {
            d->pos++;
            continue;
        }
        while (d->counts[d->pos] > 0 && *budget > 0) {
            if (radix_unpin(st->index, b) != 0) {
                LOG_ERROR("session %llu: pin on block %u was not in the index",
                          (unsigned long long)d->session_id, b);
                d->left -= d->counts[d->pos];
                d->counts[d->pos] = 0;
                break;
            }
            d->counts[d->pos]--;
            d->left--;
            (*budget)--;
        }
        if (d->counts[d->pos] == 0)
            d->pos++;
    }
    return d->pos >= d->cap;
}

static void drain_free(store_drain_t *d)
{
    free(d->keys);
    free(d->counts);
    free(d);
}

static void drains_free(store_t *st)
{
    while (st->drains) {
        store_drain_t *d = st->drains;
        st->drains = d->next;
        drain_free(d);
    }
    st->drains_tail = NULL;
}

bool store_drain_step(store_t *st)
{
    server_t *srv = st->srv;
    uint64_t budget = STORE_RELEASE_STEP;
    while (st->drains && budget > 0) {
        store_drain_t *d = st->drains;
        if (!drain_some(srv, d, &budget))
            break;
        st->drains = d->next;
        if (!st->drains)
            st->drains_tail = NULL;
        drain_free(d);
    }
    return st->drains != NULL;
}

uint64_t store_draining_pins(const store_t *st)
{
    const server_t *srv = st->srv;
    uint64_t n = 0;
    for (const store_drain_t *d = srv->store->drains; d; d = d->next)
        n += d->left;
    return n;
}

static bool release_session(store_t *st, session_t *s);

bool store_session_end(store_t *st, session_t *s)
{
    server_t *srv = st->srv;
    inflight_cancel(srv, s);
    inflight_unclaim(srv, s);
    namespaces_session_gone(s);
    tier_detach(s);
    cluster_store_detach(s);
    bool steps = release_session(st, s);
    /* Its declarations ended: lookups held for them look again. */
    if (inflight_pending(srv))
        inflight_wake(srv, false);
    return steps;
}

/* Everything s holds goes (store_session_end). */
static bool release_session(store_t *st, session_t *s)
{
    server_t *srv = st->srv;
    for (uint32_t i = 0; i < s->own.n_writing; i++) {
        uint32_t b = s->own.writing[i];
        inflight_undeclare(srv, b);
        st->rec[b].writer = NULL;
        if (pool_release(st->pool, b) != 0)
            LOG_ERROR("session %llu: block %u was WRITING but the pool refused its release",
                      (unsigned long long)s->id, b);
    }
    s->own.n_writing = 0;
    store_drain_t one = {.keys = s->own.pins.keys,
                         .counts = s->own.pins.counts,
                         .cap = s->own.pins.cap,
                         .left = s->own.pins.total,
                         .session_id = s->id};
    bool later = false;
    /* A map over one step (pins and slots) goes to the drain list whole;
     * with no memory for the record, at once (a stall, not a leak). */
    store_drain_t *d =
        s->own.pins.total + s->own.pins.cap > STORE_RELEASE_STEP ? malloc(sizeof(*d)) : NULL;
    if (d) {
        *d = one;
        if (st->drains_tail)
            st->drains_tail->next = d;
        else
            st->drains = d;
        st->drains_tail = d;
        s->own.pins.keys = NULL; /* the store's now */
        s->own.pins.counts = NULL;
        s->own.pins.cap = 0;
        later = true;
    } else {
        uint64_t budget = UINT64_MAX;
        drain_some(srv, &one, &budget);
        for (uint32_t i = 0; i < s->own.pins.cap; i++)
            s->own.pins.keys[i] = SESSION_NO_BLOCK;
    }
    s->own.pins.used = 0;
    s->own.pins.total = 0;
    return later;
}

/* --- shards: several devices --- */

/* The shard mask of a block every rank of the group committed. */
static uint64_t full_mask(const server_t *srv)
{
    return srv->n_devices >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << srv->n_devices) - 1;
}

void store_device_counts(const store_t *st, uint32_t *written, uint32_t *missing, uint32_t *workers)
{
    const server_t *srv = st->srv;
    uint64_t full = full_mask(srv);
    for (uint32_t r = 0; r < srv->n_devices; r++)
        written[r] = missing[r] = workers[r] = 0;
    LIST_FOR_EACH (&srv->sessions, const session_t, link, t) {
        if (t->rank >= 0 && (uint32_t)t->rank < srv->n_devices && !t->closing)
            workers[t->rank]++;
        /* One device: no block ever waits for another shard. */
        for (uint32_t i = 0; srv->n_devices > 1 && i < t->own.n_writing; i++) {
            uint64_t shards = st->rec[t->own.writing[i]].shards;
            if (shards == 0 || shards == full)
                continue;
            for (uint32_t r = 0; r < srv->n_devices; r++) {
                if (shards & ((uint64_t)1 << r))
                    written[r]++;
                else
                    missing[r]++;
            }
        }
    }
}

int store_mark_group(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens,
                     const uint32_t *ids, size_t n_ids, size_t *bad, uint64_t *missing)
{
    server_t *srv = st->srv;
    uint64_t full = full_mask(srv), own = s->rank >= 0 ? (uint64_t)1 << s->rank : 0;
    *bad = 0;
    *missing = 0;
    if (n_ids == 0)
        return 0;
    uint64_t *hashes = malloc(n_ids * sizeof(*hashes));
    if (!hashes)
        return KVS_ENOMEM;
    int rc = radix_chain_hashes(st->index, ns, tokens, n_ids, hashes);
    /* Every block is checked before any is marked: a refusal changes
     * nothing. A shard declared for another prefix does not count. */
    for (size_t i = 0; rc == 0 && i < n_ids; i++) {
        const store_record_t *r = &st->rec[ids[i]];
        if (r->writer != s)
            continue; /* cached already, at this position (the caller checked) */
        uint64_t have = (r->shards != 0 && r->shard_hash == hashes[i] ? r->shards : 0) | own;
        if (have != full) {
            *bad = i;
            *missing = full & ~have;
            rc = KVS_EBADSTATE;
        }
    }
    for (size_t i = 0; rc == 0 && i < n_ids; i++) {
        store_record_t *r = &st->rec[ids[i]];
        if (r->writer != s)
            continue;
        r->shards = full;
        r->shard_hash = hashes[i];
    }
    free(hashes);
    return rc;
}

int store_commit_shard(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t n_ids, bool declare_only,
                       const store_hint_t *hint, uint32_t *canonical, size_t *n_done,
                       size_t *n_pending)
{
    server_t *srv = st->srv;
    uint64_t bit = (uint64_t)1 << s->rank, full = full_mask(srv);
    *n_done = 0;
    *n_pending = 0;
    if (n_ids == 0)
        return 0;
    uint64_t *hashes = malloc(n_ids * sizeof(*hashes));
    if (!hashes)
        return KVS_ENOMEM;
    int rc = radix_chain_hashes(st->index, ns, tokens, n_ids, hashes);
    /* Every rank must have written the same prefix into a block: checked
     * before anything changes. A late commit of this rank's shard for the
     * block's earlier allocation is refused; either way, this rank's
     * first commit after it settles what it owed. */
    for (size_t i = 0; rc == 0 && i < n_ids; i++) {
        const store_record_t *r = &st->rec[ids[i]];
        if (r->writer && r->shards != 0 && r->shard_hash != hashes[i])
            rc = KVS_EINVAL;
    }
    for (size_t i = 0; rc == 0 && st->stale && i < n_ids; i++) {
        store_stale_t *x = &st->stale[ids[i]];
        if (st->rec[ids[i]].writer && (x->ranks & bit) && x->hash == hashes[i])
            rc = KVS_EBADSTATE;
    }
    for (size_t i = 0; st->stale && i < n_ids; i++)
        if (st->rec[ids[i]].writer && rc != KVS_EINVAL)
            st->stale[ids[i]].ranks &= ~bit;
    for (size_t i = 0; rc == 0 && i < n_ids; i++) {
        store_record_t *r = &st->rec[ids[i]];
        if (!r->writer)
            continue; /* cached already, at this position (the caller checked) */
        if (r->shards == 0)
            r->shard_hash = hashes[i];
        r->shards |= bit;
    }
    free(hashes);
    if (rc != 0)
        return rc;
    /* The longest prefix whose blocks are cached or complete enters the
     * index as this session's commit: its blocks become this session's. A
     * declaration commits nothing: the group's commit will. */
    size_t k = 0;
    while (!declare_only && k < n_ids &&
           (!st->rec[ids[k]].writer || st->rec[ids[k]].shards == full))
        k++;
    for (size_t i = k; i < n_ids; i++)
        if (st->rec[ids[i]].writer)
            (*n_pending)++;
    if (k == 0)
        return 0;
    if (session_writing_reserve(s, (uint32_t)k) != 0)
        return KVS_ENOMEM;
    for (size_t i = 0; i < k; i++) {
        session_t *w = st->rec[ids[i]].writer;
        if (!w || w == s)
            continue;
        writing_remove(srv, w, ids[i]);
        writing_add(st, s, ids[i]);
        st->rec[ids[i]].shards = full; /* writing_add reset it */
    }
    return store_commit(st, s, ns, tokens, n_tokens, ids, k, hint, canonical, n_done);
}

/* --- lookup --- */

/* The reuse-gap histogram: the time since the matched prefix's last block
 * was last used (committed, or the end of a lookup's match). One
 * observation per lookup that hits, O(1): the blocks before it were used at
 * least as recently (every walk starts at the root). */
static void observe_reuse(server_t *srv, const uint32_t *ids, size_t n)
{
    if (n == 0)
        return;
    store_record_t *r = &srv->store->rec[ids[n - 1]];
    uint64_t now = uv_now(srv->loop);
    metrics_observe(&srv->metrics.block_reuse_gap, metrics_block_bounds_ms, metrics_block_n_bounds,
                    now - r->used_ms);
    r->used_ms = now;
}

static void unpin_range(store_t *st, const uint32_t *ids, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        radix_unpin(st->index, ids[i]);
}

/* A pinned match that goes on into tier 2: its tier-2 blocks ids[n_t1 ..
 * n_t1 + n_promote) come back to the pool first. Returns STORE_WAIT (s
 * waits, the pins handled), 0 (no room: the tier-2 part is unpinned), or an
 * error (every pin of the match let go). */
static int promote_match(server_t *srv, session_t *s, uint32_t ns, uint32_t *ids, size_t n_t1,
                         size_t n_promote, size_t n_blocks)
{
    store_t *st = srv->store;
    int started = tier_promote(srv, s, ids, n_blocks, n_t1, n_promote);
    if (started == 0) { /* no free pool block: make room first, then promote */
        started = tier_demote(srv, s, ns, n_promote);
        /* Nothing to wait for when the room came from blocks dropped
         * at once (tier 2 full of blocks it cannot drop: these). */
        if (started == 0)
            started = tier_promote(srv, s, ids, n_blocks, n_t1, n_promote);
    }
    if (started == 0) /* copies in flight will free or move blocks */
        started = tier_wait(srv, s);
    LOG_DEBUG("session %llu: lookup matched %zu + %zu tier-2 blocks: %s (pinned %u, busy %u, "
              "tier-2 free %u, copies %u)",
              (unsigned long long)s->id, n_t1, n_promote,
              started == 1   ? "waiting"
              : started == 0 ? "no room"
                             : kvs_status_text(started),
              radix_pinned_blocks(st->index), radix_busy_blocks(st->index),
              radix_tier2_free(st->index), srv->tier_jobs);
    if (started == 1) {
        /* A promotion holds the pins until its copies are done; for a
         * demotion they only kept this prefix out of its way. */
        if (!s->tier_job || !tier_job_holds_pins(s->tier_job))
            unpin_range(st, ids, 0, n_blocks);
        return STORE_WAIT;
    }
    unpin_range(st, ids, started < 0 ? 0 : n_t1, n_blocks);
    return started;
}

int store_lookup(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                 bool pin, bool in_place, bool waited, uint32_t **ids_out, size_t *n_t1_out,
                 size_t *n_t2_out)
{
    server_t *srv = st->srv;
    size_t n_blocks = 0;
    uint32_t *ids;
    in_place = in_place && pin;
    /* A chain of cached blocks is never longer than the pool, or the pool
     * and tier 2 for a lookup that returns the tier-2 part as it is. */
    size_t max_ids = n_tokens / srv->geo.block_tokens;
    size_t chain_max = (size_t)srv->num_blocks + (in_place ? srv->tier2_blocks : 0);
    if (max_ids > chain_max)
        max_ids = chain_max;
    if (session_scratch(s, max_ids ? max_ids : 1, &ids) != 0 ||
        (pin && session_pins_reserve(s, (uint32_t)max_ids) != 0))
        return KVS_ENOMEM;
    int rc = radix_lookup(st->index, ns, tokens, n_tokens, pin, ids, max_ids, &n_blocks);
    if (rc != 0)
        return rc;
    /* A match goes on into tier 2 after its tier-1 blocks: a pinned lookup
     * waits for them to come back (tier.h), or with in_place keeps them
     * pinned where they are and names them; otherwise the reply names
     * tier-1 blocks only. */
    size_t n_t1 = 0, n_t2 = 0;
    while (n_t1 < n_blocks && ids[n_t1] < srv->num_blocks)
        n_t1++;
    /* ... and ends with some tier-3 blocks, on the disk. */
    size_t n_t3 = 0, t3_from = (size_t)srv->num_blocks + srv->tier2_blocks;
    while (n_t3 < n_blocks - n_t1 && ids[n_blocks - 1 - n_t3] >= t3_from)
        n_t3++;
    /* A request run again after its copies counts once, as it first matched
     * (hits by tier included): this run comes out of the counters. */
    if ((session_rerun(s) == SESSION_HOLD_TIER_JOB || session_rerun(s) == SESSION_HOLD_TIER_ANY) &&
        !waited)
        radix_lookup_uncount(st->index, ns, n_tokens, n_blocks, n_blocks - n_t1, n_t3);
    /* Tier-2 blocks that another session reads in place stay, and so do
     * the blocks after them (radix_promotable). */
    size_t n_promote = 0;
    if (n_t1 < n_blocks && pin && !in_place && !waited && store_tiers_usable(st))
        n_promote = radix_promotable(st->index, ids + n_t1, n_blocks - n_t1);
    /* A piece at a time: the Lookup runs again once its copies end, and
     * promotes the next (or answers with what is in the pool). */
    if (n_promote > STORE_PIECE_BLOCKS && s->sock.has_pipe)
        n_promote = STORE_PIECE_BLOCKS;
    if (n_t1 < n_blocks && in_place) {
        /* pinned in tier 2: neither promoted nor dropped; tier 3 is on disk,
         * not readable in place */
        n_t2 = n_blocks - n_t1 - n_t3;
        unpin_range(st, ids, n_t1 + n_t2, n_blocks);
    } else if (n_promote > 0) {
        rc = promote_match(srv, s, ns, ids, n_t1, n_promote, n_blocks);
        if (rc != 0)
            return rc;
    } else if (n_t1 < n_blocks && pin) {
        /* A lookup that waited for writers (inflight.h) is not held again,
         * and blocks pinned in place stay where they are: the tier-2 part
         * is not returned. */
        unpin_range(st, ids, n_t1, n_blocks);
    }
    n_blocks = n_t1 + n_t2; /* without pin, only the tier-1 part is of use */
    if (pin && !waited && n_blocks < max_ids && radix_busy_blocks(st->index) > 0 &&
        tier_wait(srv, s) == 1) {
        /* The match may have stopped at a block being copied between the
         * tiers: it is readable again once the copies end. */
        unpin_range(st, ids, 0, n_blocks);
        return STORE_WAIT;
    }
    if (pin && srv->cfg.session_max_pinned &&
        s->own.pins.total + n_blocks > srv->cfg.session_max_pinned) {
        /* Over the limit: the pins just taken go back, nothing is returned. */
        unpin_range(st, ids, 0, n_blocks);
        *n_t1_out = n_blocks; /* what it would have pinned, for the message */
        return KVS_ELIMIT;
    }
    /* Tier-2 blocks are pinned by their index id, as Release names them. */
    if (pin)
        for (size_t i = 0; i < n_blocks; i++)
            session_pin_add(s, ids[i]);
    observe_reuse(srv, ids, n_t1);
    *ids_out = ids;
    *n_t1_out = n_t1;
    *n_t2_out = n_t2;
    return 0;
}

/* --- clear --- */

int store_clear(store_t *st, uint32_t ns, size_t max, size_t *cleared)
{
    server_t *srv = st->srv;
    int rc = radix_ns_clear_step(srv->store->index, ns, max, cleared);
    if (rc != 0)
        return rc;
    srv->metrics.cleared_blocks += *cleared;
    return 0;
}

void store_clear_done(store_t *st)
{
    server_t *srv = st->srv;
    srv->metrics.clears++;
}

int store_evict_prompt(store_t *st, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                       size_t *n_matched, size_t *n_tier1, size_t *n_tier2)
{
    server_t *srv = st->srv;
    int rc =
        radix_evict_prompt(srv->store->index, ns, tokens, n_tokens, n_matched, n_tier1, n_tier2);
    /* The disk's records of the prompt, the evicted tier-3 blocks' and the
     * copies left there by blocks that moved up, are deleted for every
     * later start before the reply (store_disk.h). */
    return rc == 0 ? store_disk_forget_prompt(srv, ns, tokens, n_tokens) : rc;
}

/* --- moves between the tiers --- */

bool store_tiers_usable(const store_t *st)
{
    const server_t *srv = st->srv;
    return srv->tier2_blocks > 0 && uv_now(srv->loop) >= srv->store->medium_down_until;
}

int store_demote(store_t *st, uint32_t ns, size_t n, radix_move_t *moves, size_t *n_moved)
{
    server_t *srv = st->srv;
    size_t n_dropped = 0;
    int rc = radix_demote(st->index, ns, n, moves, n_moved, &n_dropped);
    srv->metrics.tier_drops_t1 += n_dropped;
    /* What names the block goes with it (by index id). */
    for (size_t i = 0; rc == 0 && i < *n_moved; i++)
        st->rec[moves[i].to].meta = st->rec[moves[i].from].meta;
    return rc;
}

void store_spill(store_t *st, size_t n, radix_move_t *moves, size_t *n_moved)
{
    server_t *srv = st->srv;
    *n_moved = 0;
    /* While the disk's records go back into the index, no new block takes
     * a slot that one of them may still claim. */
    if (srv->tier3_blocks == 0 || store_restore_busy(srv) ||
        radix_spill(st->index, 2, n, moves, n_moved) != 0)
        return;
    for (size_t i = 0; i < *n_moved; i++)
        st->rec[moves[i].to].meta = st->rec[moves[i].from].meta;
}

void store_promote(store_t *st, uint32_t *pins, size_t first, size_t n, uint32_t *pool_ids,
                   size_t *n_done)
{
    server_t *srv = st->srv;
    uint32_t *t2_ids = pins + first;
    pool_counts_t c;
    pool_counts(st->pool, &c);
    size_t m = n < c.free ? n : c.free, done = 0;
    *n_done = 0;
    if (m == 0 || pool_alloc(st->pool, (uint32_t)m, pool_ids) != 0)
        return;
    uint64_t now = uv_now(srv->loop);
    for (; done < m; done++) {
        uint32_t id = pool_ids[done], from = t2_ids[done];
        /* The lookup's pin on the tier-2 id is on the pool id now: the
         * promoted blocks are a run of the pins, so each moves in O(1) (a
         * search of the pins per block made a large promotion quadratic). */
        t2_ids[done] = id;
        int prc = radix_promote(st->index, from, id);
        if (prc != 0) {
            LOG_DEBUG("promotion of tier-2 block %u to %u stopped: %s", from, id,
                      kvs_status_text(prc));
            break;
        }
        pool_set_cached(st->pool, id);
        /* What names the block goes with it; KV events tell of the move
         * once its copy is done (publish_moved). */
        st->rec[id].meta = st->rec[from].meta;
        st->rec[id].used_ms = now;
    }
    for (size_t i = done; i < m; i++)
        pool_release(st->pool, pool_ids[i]);
    *n_done = done;
}

/* KV events of a block whose copy from index id `from` to `to` (another
 * tier) is done: BlockStored on the new medium, then BlockRemoved on the
 * old one, so a router that keeps blocks per medium (llm-d, Dynamo) moves
 * its claim and never sees the block leave the node. Stored goes first: a
 * router never holds the block on no medium, and the parent link of the
 * BlockStored stays known to it. Nothing when both media have one name (a
 * pool in host memory above the host tier). */
static void publish_moved(server_t *srv, uint32_t from, uint32_t to)
{
    store_t *st = srv->store;
    const store_meta_t *m = &st->rec[to].meta;
    events_medium_t was = tier_event_medium(srv, from), now = tier_event_medium(srv, to);
    if (!srv->events ||
        strcmp(events_medium_name(srv->events, was), events_medium_name(srv->events, now)) == 0)
        return;
    const events_stream_t *es = namespaces_events_stream(srv, m->ns);
    uint64_t hash, parent;
    const uint32_t *tokens;
    if (!es->on || radix_block_chain(st->index, to, &hash, &parent, &tokens) != 0)
        return;
    /* A first block chains from its namespace's seed: it has no parent. */
    const char *name = radix_ns_name(st->index, m->ns);
    bool has_parent = !name || parent != namespaces_seed(name);
    if (events_stored(srv->events, es, now, &hash, 1, has_parent, parent, tokens) != 0 ||
        events_removed(srv->events, es, was, hash) != 0)
        srv->metrics.kv_events_dropped++;
}

int store_move_end(store_t *st, uint32_t id, bool ok, uint32_t *back)
{
    server_t *srv = st->srv;
    uint32_t peer;
    bool demotion = id >= srv->num_blocks;
    if (ok) {
        int rc = radix_copy_done(st->index, id, &peer);
        if (rc == 0)
            publish_moved(srv, peer, id);
        if (rc == 0 && peer < srv->num_blocks && pool_release(st->pool, peer) != 0)
            LOG_ERROR("demoted block %u was not cached in the pool", peer);
        *back = id;
        return rc;
    }
    int rc = radix_copy_undo(st->index, id, &peer);
    if (rc != 0)
        return rc;
    /* Back where it was, with its bytes; a promotion's pool id was never
     * readable and goes back to the pool. */
    if (!demotion)
        pool_release(st->pool, id);
    *back = peer;
    return 0;
}

tier_medium_t *store_swap_medium(store_t *st, tier_medium_t *m)
{
    tier_medium_t *old = st->medium;
    st->medium = m;
    return old;
}

void store_unpin(store_t *st, uint32_t b)
{
    server_t *srv = st->srv;
    if (radix_unpin(srv->store->index, b) != 0)
        LOG_ERROR("a pin of the store's own on block %u was not in the index", b);
}

void store_sync_counters(store_t *st)
{
    server_t *s = st->srv;
    if (s->events) {
        events_stats_t es;
        events_counters(s->events, &es);
        s->metrics.kv_events_published = es.published;
        s->metrics.kv_events_replay_requests = es.replay_requests;
        s->metrics.kv_events_replay_refused = es.replay_refused;
        s->metrics.kv_events_replay_stalled = es.replay_stalled;
        s->metrics.kv_events_send_drops = es.send_drops;
    }
    cluster_store_sync_counters(s);
    if (s->disk_tier) {
        disk_notes_flush(s->disk_tier); /* what its threads had to say since */
        disk_stats_t ds;
        disk_stats(s->disk_tier, &ds);
        s->metrics.disk_reads = ds.reads;
        /* slots torn or flipped found by the start's scan fail their CRC too */
        s->metrics.disk_crc_failures = ds.crc_failures + ds.torn;
    }
}
