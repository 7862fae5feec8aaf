/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Warm restart in the background (store_restore.h): the disk tier's scan on
 * a thread of its own, then its records into the index a few milliseconds
 * per loop turn, while the daemon serves.
 *
 *     SCANNING   thread: every slot read (disk_scan_run), the records
 *                by (namespace, chained hash) in a table, which are parents
 *     CHECKING   loop: the watermarks and identities of now; kept records
 *                claim their slots, oldest first
 *     LEAVES     loop: each chain from a leaf up to its namespace's seed
 *     PARENTS    loop: parents whose leaves were dropped, as chains of
 *                their own
 *     FREEING    loop: what was not restored frees its slot
 *
 * What changes meanwhile applies to the records not restored yet: a Clear
 * or another identity moves its namespace's watermark (checked again as
 * each chain goes in), an Evict deletes its blocks' records
 * (store_restore_forget). Until the end, tier 3 takes no new block
 * (store_restore_busy: a demotion past host memory drops), so no slot of a
 * record still to be restored is written over.
 */
#include "store_restore.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvshare_status.h"
#include "log.h"
#include "loop_wake.h"
#include "namespaces.h"
#include "nsname.h"
#include "store.h"
#include "disk.h"
#include "store_disk_medium.h"

/* Loop work per turn: then the loop polls again. */
#define STEP_NS (2 * 1000 * 1000ull)
/* A progress line in the log at most this often. */
#define LOG_EVERY_NS (5 * 1000 * 1000 * 1000ull)

typedef enum phase {
    PH_SCANNING,
    PH_CHECKING,
    PH_LEAVES,
    PH_PARENTS,
    PH_FREEING,
    PH_DONE,
    PH_FAILED,
} phase_t;

/* A record's state. */
enum { ST_NEW, ST_KEPT, ST_RESTORED, ST_DROPPED };

/* Records by (namespace name, chained hash): an open-addressing table of
 * record indexes. */
typedef struct rec_table {
    uint32_t *at; /* record index + 1; 0: empty */
    size_t mask;
} rec_table_t;

/* What the restore decided for one entry of the file's namespace table. */
typedef struct ns_verdict {
    char name[DISK_NS_MAX]; /* the entry's namespace when resolved */
    bool resolved, served;  /* served: the namespace exists here (restore_ns) */
    uint32_t ns;
    uint64_t hash; /* the namespace's identity now */
    size_t dropped;
    uint64_t dropped_hash; /* one dropped record's identity (the log's) */
} ns_verdict_t;

/* An Evict's block while the scan runs: its record goes once read. */
typedef struct forget {
    char ns[DISK_NS_MAX];
    uint64_t hash;
} forget_t;

struct store_restore {
    server_t *srv;
    disk_t *td;
    phase_t phase;
    pthread_t thread;
    bool joined;
    atomic_bool stop;
    atomic_uint_fast64_t scanned;
    loop_wake_t wake;
    uv_idle_t idle;
    bool idle_on;
    int handles; /* open: wake, idle */
    int rc;      /* the scan's */
    char err[256];
    disk_scan_t sc;
    rec_table_t tb;
    uint8_t *is_parent, *state;
    size_t *path;
    uint32_t *tokens, *ids, *canonical;
    uint64_t *keys;
    ns_verdict_t *verdicts; /* DISK_NS_SLOTS */
    size_t cursor;
    size_t unnamed, misnamed;
    forget_t *forgets;
    size_t n_forgets, cap_forgets;
    uint64_t records; /* the scan found (valid, newest of their block) */
    uint64_t restored, dropped, deleted, identity_dropped;
    uint64_t started_ns, scanned_ns, ended_ns, logged_ns;
};

static uint64_t rec_key(const char *ns, uint64_t hash)
{
    return hash ^ namespaces_seed(ns) * 0x9E3779B97F4A7C15ull;
}

static int table_build(rec_table_t *tb, const disk_scan_t *sc)
{
    size_t cap = 64;
    while (cap < 2 * sc->n)
        cap *= 2;
    tb->at = calloc(cap, sizeof(*tb->at));
    tb->mask = cap - 1;
    if (!tb->at)
        return KVS_ENOMEM;
    for (size_t i = 0; i < sc->n; i++) {
        size_t h = rec_key(sc->recs[i].ns, sc->recs[i].chain_hash) & tb->mask;
        while (tb->at[h])
            h = (h + 1) & tb->mask;
        tb->at[h] = (uint32_t)i + 1;
    }
    return 0;
}

/* The record of namespace ns whose chained hash is hash, or SIZE_MAX. */
static size_t table_find(const rec_table_t *tb, const disk_scan_t *sc, const char *ns,
                         uint64_t hash)
{
    for (size_t h = rec_key(ns, hash) & tb->mask; tb->at[h]; h = (h + 1) & tb->mask) {
        const disk_record_t *r = &sc->recs[tb->at[h] - 1];
        if (r->chain_hash == hash && strcmp(r->ns, ns) == 0)
            return tb->at[h] - 1;
    }
    return SIZE_MAX;
}

/* Whether record i is some other record's parent (then a longer chain
 * restores it). */
static void mark_parents(const disk_scan_t *sc, const rec_table_t *tb, uint8_t *is_parent)
{
    for (size_t i = 0; i < sc->n; i++) {
        const disk_record_t *r = &sc->recs[i];
        if (r->parent_hash == namespaces_seed(r->ns))
            continue;
        size_t p = table_find(tb, sc, r->ns, r->parent_hash);
        if (p != SIZE_MAX)
            is_parent[p] = 1;
    }
}

/* --- the scan, on its thread --- */

static void *scan_main(void *arg)
{
    store_restore_t *r = arg;
    /* For tests of what happens during the scan (tests/integration/
     * test_restore_background.c): the scan waits this long first. */
    const char *delay = getenv("KVS_TEST_RESTORE_DELAY_MS");
    for (long ms = delay ? atol(delay) : 0; ms > 0 && !atomic_load(&r->stop); ms -= 10)
        usleep(10000);
    r->rc = disk_scan_run(r->td, &r->sc, &r->stop, &r->scanned, r->err, sizeof(r->err));
    size_t n = r->sc.n, bt = r->srv->geo.block_tokens;
    if (r->rc == 0 && n > 0) {
        r->path = malloc(n * sizeof(*r->path));
        r->tokens = malloc(n * bt * sizeof(*r->tokens));
        r->ids = malloc(n * sizeof(*r->ids));
        r->canonical = malloc(n * sizeof(*r->canonical));
        r->is_parent = calloc(n, 1);
        r->state = calloc(n, 1);
        r->keys = malloc(n * sizeof(*r->keys));
        bool mem =
            r->path && r->tokens && r->ids && r->canonical && r->is_parent && r->state && r->keys;
        r->rc = mem ? table_build(&r->tb, &r->sc) : KVS_ENOMEM;
        if (r->rc == 0)
            mark_parents(&r->sc, &r->tb, r->is_parent);
        else
            snprintf(r->err, sizeof(r->err), "out of memory for the restore of %zu records", n);
    }
    loop_wake_send(&r->wake);
    return NULL;
}

/* --- putting records in --- */

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

/* Record i does not go in: its slot is free again (a record still on the
 * disk that a later Evict may name: store_disk_medium_found). */
static void drop(store_restore_t *r, size_t i)
{
    const disk_record_t *c = &r->sc.recs[i];
    if (r->state[i] == ST_KEPT)
        disk_slot_free(r->td, c->slot);
    if (r->state[i] == ST_KEPT || r->state[i] == ST_NEW)
        store_disk_medium_found(r->srv->store->medium3, c->slot, c->chain_hash);
    r->state[i] = ST_DROPPED;
    r->dropped++;
}

/* Routers hear of blocks restored from the disk (the stream began with
 * AllBlocksCleared, at start): BlockStored on the disk's medium for chain
 * blocks [first, end) of path (root first), with the parent of the first
 * unless it chains from the namespace's seed. */
static void publish_restored(store_restore_t *r, uint32_t ns, size_t depth, size_t first,
                             size_t end)
{
    server_t *srv = r->srv;
    const events_stream_t *es = namespaces_events_stream(srv, ns);
    if (!srv->events || !es->on || first == end)
        return;
    for (size_t k = first; k < end; k++)
        r->keys[k - first] = r->sc.recs[r->path[depth - 1 - k]].chain_hash;
    const disk_record_t *c = &r->sc.recs[r->path[depth - 1 - first]];
    bool has_parent = c->parent_hash != namespaces_seed(c->ns);
    if (events_stored(srv->events, es, EVENTS_MEDIUM_DISK, r->keys, end - first, has_parent,
                      c->parent_hash, r->tokens + first * srv->geo.block_tokens) != 0)
        srv->metrics.kv_events_dropped++;
}

/* Whether kept record i may still go in: not deleted since it was checked
 * (a Clear, another identity), of its namespace's identity now. */
static bool still_valid(store_restore_t *r, size_t i, uint32_t ns)
{
    disk_record_t *c = &r->sc.recs[i];
    if (disk_record_deleted(r->td, c)) {
        r->deleted++;
        drop(r, i);
        return false;
    }
    if (c->ident_hash != namespaces_identity(r->srv, ns)->hash) {
        r->identity_dropped++;
        drop(r, i);
        return false;
    }
    return true;
}

/* Restores the chain that ends at record `leaf`: walks its parents up to
 * the namespace's seed, then puts the chain in, root first. Returns the
 * blocks newly restored (0 when the chain does not reach its seed). */
static size_t restore_chain(store_restore_t *r, size_t leaf)
{
    server_t *srv = r->srv;
    store_t *st = srv->store;
    const disk_scan_t *sc = &r->sc;
    const disk_record_t *lr = &sc->recs[leaf];
    uint32_t bt = srv->geo.block_tokens, base3 = srv->num_blocks + srv->tier2_blocks;
    uint64_t seed = namespaces_seed(lr->ns);
    size_t depth = 0, i = leaf;
    for (;;) {
        if (depth == sc->n || sc->recs[i].ntokens != bt || r->state[i] == ST_DROPPED ||
            r->state[i] == ST_NEW)
            return 0; /* a cycle (crafted hashes), a short block, a parent dropped */
        r->path[depth++] = i;
        if (sc->recs[i].parent_hash == seed)
            break;
        i = table_find(&r->tb, sc, lr->ns, sc->recs[i].parent_hash);
        if (i == SIZE_MAX)
            return 0; /* its parent was lost: unreachable */
    }
    uint32_t ns;
    if (restore_ns(srv, lr->ns, &ns) != 0)
        return 0;
    for (size_t k = 0; k < depth; k++) {
        size_t ri = r->path[depth - 1 - k];
        if (r->state[ri] == ST_KEPT && !still_valid(r, ri, ns))
            return 0;
        const disk_record_t *c = &sc->recs[ri];
        memcpy(r->tokens + k * bt, c->tokens, bt * sizeof(uint32_t));
        r->ids[k] = base3 + c->slot;
    }
    size_t done = 0;
    int rc =
        radix_restore(st->index, ns, r->tokens, depth * bt, r->ids, depth, r->canonical, &done);
    if (rc != 0)
        LOG_DEBUG("disk tier: a chain of %zu blocks restored up to %zu: %s", depth, done,
                  kvs_status_text(rc));
    size_t fresh = 0, run = 0; /* run: the blocks restored just before k */
    uint64_t now = uv_now(srv->loop);
    for (size_t k = 0; k < done; k++) {
        size_t ri = r->path[depth - 1 - k];
        if (r->canonical[k] != r->ids[k] || r->state[ri] == ST_RESTORED) {
            publish_restored(r, ns, depth, k - run, k);
            run = 0;
            continue;
        }
        const disk_record_t *c = &sc->recs[ri];
        uint64_t h = 0;
        /* The index hashed the tokens under this kvshared's seed: a record
         * whose own hash disagrees is not what it claims; it goes again. */
        if (radix_block_hash(st->index, r->ids[k], &h) != 0 || h != c->chain_hash) {
            publish_restored(r, ns, depth, k - run, k);
            run = 0;
            continue;
        }
        r->state[ri] = ST_RESTORED;
        store_record_t *rec = &st->rec[r->ids[k]];
        rec->meta = (store_meta_t){.hash = h, .cached_ms = now, .ns = ns};
        store_disk_medium_restore(st->medium3, c->slot, c->chain_hash, c->seq, c->ns_id);
        fresh++;
        run++;
    }
    publish_restored(r, ns, depth, done - run, done);
    srv->metrics.disk_restored += fresh;
    r->restored += fresh;
    return fresh;
}

/* --- identity at restart --- */

/* The namespace of table entry en now (created where it may be) and its
 * identity, which records must carry to go in. */
static void resolve_verdict(server_t *srv, const disk_ns_t *en, ns_verdict_t *v)
{
    *v = (ns_verdict_t){.resolved = true};
    snprintf(v->name, sizeof(v->name), "%s", en->ns);
    if (restore_ns(srv, en->ns, &v->ns) != 0)
        return; /* not served: restore_chain drops its records */
    v->served = true;
    v->hash = namespaces_identity(srv, v->ns)->hash;
}

/* Before the first session: the namespaces the file's table names exist
 * (where the config lets namespaces be made), so that a Clear or an Evict
 * of one during the restore applies; each whose identity a worker had
 * declared is bound back to it, so the same engine finds its cache and
 * another model is refused, also while the file is still being read
 * (namespaces_identity_declare refuses where the config or the daemon
 * names another; then its records are dropped). */
static void namespaces_from_table(server_t *srv, disk_t *td)
{
    disk_ns_t en;
    for (uint32_t e = 0; e < DISK_NS_SLOTS && disk_ns_get(td, e, &en) == 0; e++) {
        identity_t id;
        uint32_t ns;
        char msg[1024];
        if (!nsname_valid(en.ns) || restore_ns(srv, en.ns, &ns) != 0)
            continue;
        if (en.source != IDENTITY_DECLARED || identity_parse(en.ident, &id) != 0 ||
            identity_hash(&id) != en.ident_hash)
            continue;
        if (namespaces_identity_declare(srv, ns, &id, IDENTITY_DECLARED, msg, sizeof(msg)) != 0)
            LOG_WARN("disk tier: namespace '%s' is not bound back to its declared identity: %s",
                     en.ns, msg);
    }
}

/* CHECKING, record i: kept (its slot claimed) when it was
 * not deleted since the scan and its identity is its namespace's now (or
 * its namespace is not served: restore_chain drops it); otherwise dropped
 * and counted. */
static void check_one(store_restore_t *r, size_t i)
{
    server_t *srv = r->srv;
    disk_record_t *c = &r->sc.recs[i];
    disk_ns_t en;
    if (r->state[i] != ST_NEW)
        return; /* an Evict's, dropped already */
    if (!nsname_valid(c->ns)) {
        /* Only a file changed by hand names one. It is no namespace here,
         * so no identity of one: dropped and counted with the records of
         * an identity the file does not name. */
        if (r->misnamed++ == 0)
            LOG_WARN("disk tier: records of a namespace whose name breaks the rule (%s) are "
                     "dropped",
                     nsname_rule());
        r->identity_dropped++;
        drop(r, i);
        return;
    }
    if (disk_record_deleted(r->td, c)) {
        r->deleted++;
        drop(r, i);
        return;
    }
    if (c->entry >= DISK_NS_SLOTS || disk_ns_get(r->td, c->entry, &en) != 0) {
        if (r->unnamed++ == 0)
            LOG_WARN("disk tier: records of namespace '%s' (and maybe others) are not restored: "
                     "the file's namespace table does not name their identity",
                     c->ns);
        r->identity_dropped++;
        drop(r, i);
        return;
    }
    ns_verdict_t *v = &r->verdicts[c->entry];
    if (!v->resolved || strcmp(v->name, en.ns) != 0)
        resolve_verdict(srv, &en, v);
    if (v->served && c->ident_hash != v->hash) {
        if (v->dropped++ == 0)
            v->dropped_hash = c->ident_hash;
        r->identity_dropped++;
        drop(r, i);
        return;
    }
    /* Oldest first (the scan's order): recency follows the sequence
     * numbers, so the newest records are the last the disk's LRU takes. */
    disk_slot_claim(r->td, c->slot);
    r->state[i] = ST_KEPT;
}

/* After CHECKING: each namespace whose records were of another identity
 * says so once, with both identities in words. */
static void log_identity_drops(store_restore_t *r)
{
    disk_ns_t en;
    for (uint32_t e = 0; e < DISK_NS_SLOTS; e++) {
        const ns_verdict_t *v = &r->verdicts[e];
        if (v->dropped == 0 || disk_ns_get(r->td, e, &en) != 0)
            continue;
        const ns_identity_t *now = namespaces_identity(r->srv, v->ns);
        char was[DISK_IDENT_MAX + 64];
        if (v->dropped_hash == en.ident_hash)
            snprintf(was, sizeof(was), "'%s' (%s)", en.ident,
                     identity_source_name((identity_source_t)en.source));
        else
            snprintf(was, sizeof(was), "an identity the file no longer names (hash %016" PRIx64 ")",
                     v->dropped_hash);
        LOG_WARN("disk tier: namespace '%s': %zu blocks not restored: they hold the KV of %s, and "
                 "the namespace's identity is now '%s' (%s); their slots are free",
                 v->name, v->dropped, was, now->text, identity_source_name(now->source));
    }
    if (r->unnamed > 0)
        LOG_WARN("disk tier: %zu records of namespaces the table does not name were dropped",
                 r->unnamed);
}

/* --- the steps --- */

static const char *phase_name(phase_t p)
{
    switch (p) {
    case PH_SCANNING:
        return "scanning";
    case PH_CHECKING:
    case PH_LEAVES:
    case PH_PARENTS:
    case PH_FREEING:
        return "restoring";
    case PH_DONE:
        return "done";
    case PH_FAILED:
        return "failed";
    }
    return "?";
}

static void free_work(store_restore_t *r)
{
    free(r->tb.at);
    free(r->path);
    free(r->tokens);
    free(r->ids);
    free(r->canonical);
    free(r->is_parent);
    free(r->state);
    free(r->keys);
    free(r->verdicts);
    free(r->forgets);
    disk_scan_free(&r->sc);
    r->tb.at = NULL;
    r->path = NULL;
    r->tokens = r->ids = r->canonical = NULL;
    r->is_parent = r->state = NULL;
    r->keys = NULL;
    r->verdicts = NULL;
    r->forgets = NULL;
    r->n_forgets = r->cap_forgets = 0;
}

static void finish(store_restore_t *r, phase_t how)
{
    r->phase = how;
    r->ended_ns = uv_hrtime();
    if (r->idle_on) {
        uv_idle_stop(&r->idle);
        r->idle_on = false;
    }
    server_t *srv = r->srv;
    srv->metrics.disk_deleted_dropped += r->deleted;
    srv->metrics.disk_identity_dropped += r->identity_dropped;
    disk_stats_t ds;
    disk_stats(r->td, &ds);
    double secs = (double)(r->ended_ns - r->started_ns) / 1e9;
    if (how == PH_DONE)
        LOG_INFO("tier 3: %" PRIu64 " blocks restored from %s in %.2f s (scan %.2f s); %" PRIu64
                 " records not restored (unreachable, deleted, of another identity or of a "
                 "namespace not served), %llu torn or failing their CRC",
                 r->restored, srv->cfg.disk_tier_path, secs,
                 (double)(r->scanned_ns - r->started_ns) / 1e9, r->dropped,
                 (unsigned long long)ds.torn);
    else
        LOG_ERROR("tier 3: restoring %s stopped after %.2f s: %s; the tier starts empty",
                  srv->cfg.disk_tier_path, secs, r->err[0] ? r->err : kvs_status_text(r->rc));
    free_work(r);
}

/* Every record not restored frees its slot (the scan's error, or the end). */
static void drop_rest(store_restore_t *r)
{
    for (size_t i = 0; i < r->sc.n; i++)
        if (r->state[i] == ST_NEW || r->state[i] == ST_KEPT)
            drop(r, i);
}

/* Record (ns, hash) of an Evict during the restore: deleted on the disk
 * now (a tombstone) and never restored. */
static void forget_record(store_restore_t *r, const char *ns, uint64_t hash)
{
    size_t i = r->tb.at ? table_find(&r->tb, &r->sc, ns, hash) : SIZE_MAX;
    if (i == SIZE_MAX || r->state[i] == ST_DROPPED || r->state[i] == ST_RESTORED)
        return; /* a restored block's record goes by the medium (store_disk_forget_prompt) */
    uint32_t slot = r->sc.recs[i].slot;
    char err[160];
    if (disk_forget(r->td, &slot, 1, err, sizeof(err)) != 0) {
        LOG_ERROR("disk tier: %s", err);
        LOG_ERROR("disk tier: the tombstone of an evicted block (slot %u) was not written", slot);
    }
    bool claimed = r->state[i] == ST_KEPT;
    r->state[i] = ST_DROPPED;
    r->deleted++;
    r->dropped++;
    if (claimed)
        disk_slot_free(r->td, slot);
}

static void on_idle(uv_idle_t *h);

static void on_scanned(loop_wake_t *w)
{
    store_restore_t *r = w->data;
    if (r->phase != PH_SCANNING || r->joined)
        return;
    pthread_join(r->thread, NULL);
    r->joined = true;
    r->scanned_ns = uv_hrtime();
    disk_scan_settle(r->td, &r->sc);
    r->deleted += r->sc.deleted;
    r->records = r->sc.n;
    r->verdicts = calloc(DISK_NS_SLOTS, sizeof(*r->verdicts));
    if (r->rc == 0 && !r->verdicts)
        r->rc = KVS_ENOMEM;
    if (r->rc != 0) {
        r->dropped += r->sc.n; /* never claimed: their slots are free */
        finish(r, PH_FAILED);
        return;
    }
    LOG_INFO("tier 3: scanned %s in %.2f s: %zu records to restore, %" PRIu64
             " deleted by a Clear or an Evict, %" PRIu64 " torn; restoring them into the index",
             r->srv->cfg.disk_tier_path, (double)(r->scanned_ns - r->started_ns) / 1e9, r->sc.n,
             r->sc.deleted, r->sc.torn);
    for (size_t k = 0; k < r->n_forgets; k++)
        forget_record(r, r->forgets[k].ns, r->forgets[k].hash);
    if (r->n_forgets > 0)
        disk_sync_async(r->td);
    r->phase = PH_CHECKING;
    r->cursor = 0;
    r->logged_ns = r->scanned_ns;
    uv_idle_start(&r->idle, on_idle);
    r->idle_on = true;
}

static bool out_of_time(uint64_t t0, size_t k)
{
    return (k & 63) == 63 && uv_hrtime() - t0 > STEP_NS;
}

/* One turn's share of the work: STEP_NS of it, then the loop polls. */
static void on_idle(uv_idle_t *h)
{
    store_restore_t *r = h->data;
    uint64_t t0 = uv_hrtime();
    size_t n = r->sc.n, k = 0;
    for (; r->phase == PH_CHECKING; k++) {
        if (out_of_time(t0, k))
            return;
        if (r->cursor == n) {
            r->cursor = 0;
            log_identity_drops(r);
            r->phase = PH_LEAVES;
            continue;
        }
        check_one(r, r->cursor++);
    }
    /* Leaves oldest first (the scan's order), so recency follows the
     * sequence numbers: the newest chains are the last to go. */
    for (; r->phase == PH_LEAVES; k++) {
        if (out_of_time(t0, k))
            return;
        if (r->cursor == n) {
            r->phase = PH_PARENTS;
            r->cursor = n;
            continue;
        }
        size_t i = r->cursor++;
        if (!r->is_parent[i] && r->state[i] == ST_KEPT)
            restore_chain(r, i);
    }
    /* A parent no leaf reached (its leaves were dropped): its own chain. */
    for (; r->phase == PH_PARENTS; k++) {
        if (out_of_time(t0, k))
            return;
        if (r->cursor == 0) {
            r->phase = PH_FREEING;
            continue;
        }
        size_t i = --r->cursor;
        if (r->is_parent[i] && r->state[i] == ST_KEPT)
            restore_chain(r, i);
    }
    if (r->phase == PH_FREEING) {
        drop_rest(r);
        finish(r, PH_DONE);
        return;
    }
    uint64_t now = uv_hrtime();
    if (now - r->logged_ns > LOG_EVERY_NS) {
        r->logged_ns = now;
        LOG_INFO("tier 3: restoring: %" PRIu64 " blocks restored, %zu records left to look at",
                 r->restored, r->phase == PH_PARENTS ? r->cursor : n - r->cursor);
    }
}

/* --- the interface --- */

static void on_closed_part(store_restore_t *r)
{
    if (--r->handles == 0) {
        free_work(r);
        free(r);
    }
}

static void on_wake_closed(loop_wake_t *w)
{
    on_closed_part(w->data);
}

static void on_idle_closed(uv_handle_t *h)
{
    on_closed_part(h->data);
}

int store_restore_start(server_t *srv)
{
    store_t *st = srv->store;
    if (!st || !st->medium3 || !srv->disk_tier || !disk_scan_pending(srv->disk_tier))
        return 0;
    store_restore_t *r = calloc(1, sizeof(*r));
    if (!r)
        return KVS_ENOMEM;
    r->srv = srv;
    r->td = srv->disk_tier;
    r->phase = PH_SCANNING;
    atomic_init(&r->stop, false);
    atomic_init(&r->scanned, 0);
    if (loop_wake_init(srv->loop, &r->wake, on_scanned) != 0) {
        free(r);
        return KVS_EIO;
    }
    r->wake.data = r;
    r->handles = 2;
    uv_idle_init(srv->loop, &r->idle);
    r->idle.data = r;
    r->started_ns = uv_hrtime();
    st->restore = r;
    namespaces_from_table(srv, r->td);
    if (pthread_create(&r->thread, NULL, scan_main, r) != 0) {
        r->joined = true;
        r->rc = KVS_ENOMEM;
        snprintf(r->err, sizeof(r->err), "no thread for the scan");
        disk_scan_settle(r->td, &r->sc);
        finish(r, PH_FAILED);
        return 0;
    }
    LOG_INFO("tier 3: restoring %s in the background: reading %u slots; the daemon serves "
             "meanwhile (blocks of the file are misses until restored)",
             srv->cfg.disk_tier_path, disk_capacity(r->td));
    return 0;
}

void store_restore_close(server_t *srv)
{
    store_t *st = srv->store;
    store_restore_t *r = st ? st->restore : NULL;
    if (!r)
        return;
    st->restore = NULL;
    if (!r->joined) {
        atomic_store(&r->stop, true);
        pthread_join(r->thread, NULL);
        r->joined = true;
        disk_scan_settle(r->td, &r->sc);
        LOG_INFO("tier 3: the restore of %s was stopped by the shutdown; its records stay on "
                 "the disk for the next start",
                 srv->cfg.disk_tier_path);
    }
    if (r->idle_on)
        uv_idle_stop(&r->idle);
    uv_close((uv_handle_t *)&r->idle, on_idle_closed);
    loop_wake_close(&r->wake, on_wake_closed);
}

bool store_restore_busy(const server_t *srv)
{
    const store_restore_t *r = srv->store ? srv->store->restore : NULL;
    return r && r->phase != PH_DONE && r->phase != PH_FAILED;
}

void store_restore_forget(server_t *srv, const char *ns, const uint64_t *hashes, size_t n)
{
    store_restore_t *r = srv->store ? srv->store->restore : NULL;
    if (!store_restore_busy(srv))
        return;
    if (r->phase != PH_SCANNING) {
        for (size_t k = 0; k < n; k++)
            forget_record(r, ns, hashes[k]);
        return;
    }
    /* Read by the scan's end, before any record goes in. */
    for (size_t k = 0; k < n; k++) {
        if (r->n_forgets == r->cap_forgets) {
            size_t cap = r->cap_forgets ? 2 * r->cap_forgets : 64;
            forget_t *f = realloc(r->forgets, cap * sizeof(*f));
            if (!f) {
                LOG_ERROR("disk tier: out of memory for an Evict during the restore: %zu of its "
                          "blocks may come back from the disk",
                          n - k);
                return;
            }
            r->forgets = f;
            r->cap_forgets = cap;
        }
        forget_t *f = &r->forgets[r->n_forgets++];
        snprintf(f->ns, sizeof(f->ns), "%s", ns);
        f->hash = hashes[k];
    }
}

void store_restore_progress(const server_t *srv, store_restore_progress_t *out)
{
    memset(out, 0, sizeof(*out));
    const store_restore_t *r = srv->store ? srv->store->restore : NULL;
    if (!r)
        return;
    out->phase = phase_name(r->phase);
    out->slots = disk_capacity(r->td);
    out->scanned = atomic_load(&((store_restore_t *)r)->scanned);
    out->records = r->records;
    out->restored = r->restored;
    out->dropped = r->dropped;
    uint64_t end = r->phase == PH_DONE || r->phase == PH_FAILED ? r->ended_ns : uv_hrtime();
    out->elapsed_ms = (end - r->started_ns) / 1000000;
}
