/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store: the block store. It owns the pool (block ids and their states), the
 * index (which prefix each cached block holds, pins, eviction), one record
 * per block and the tier below the pool, and it is the only code that
 * changes a block's state: the one place that publishes a block's KV events
 * (BlockStored, BlockRemoved) and counts what happens to blocks.
 *
 *     store_t
 *       |-- pool_t          pool ids: FREE / WRITING / CACHED
 *       |-- radix_tree_t    cached prefixes, pins, eviction; tier-2 ids after
 *       |                   the pool's (radix.h, Tiers)
 *       |-- rec[id]         one record per index id: pool ids, then tier-2 ids,
 *       |                   then tier-3 ids
 *       |-- medium          tier 2, below the pool (tier_medium.h); NULL: none
 *       `-- medium3         tier 3, below tier 2: the disk (store_disk.h); NULL: none
 *
 * Lifecycle (docs: DESIGN.md, Block lifecycle):
 *
 *     FREE --store_alloc--> WRITING (rec.writer = the session)
 *     WRITING --store_commit--> CACHED, pinned by the committer
 *     CACHED --store_release--> unpinned --store_evict--> FREE (BlockRemoved)
 *     WRITING --store_release or store_session_end--> FREE
 *
 * With several devices (--devices: one tensor-parallel group, a shard of
 * each block per device), a ranked session's commit records its shard
 * (rec.shards) and a block leaves WRITING only once every rank's shard is
 * in, or when one session commits for the group:
 *
 *     WRITING --store_commit_shard (a shard missing)--> WRITING, shard bit set
 *     WRITING --store_commit_shard (the last shard)--> CACHED, pinned by it
 *     WRITING --store_commit_shard (declare only)--> WRITING, shard bit set
 *     WRITING, every shard in for its tokens --store_mark_group,
 *             store_commit--> CACHED, pinned by the group's committer
 *
 * A shard bit holds for one prefix (shard_hash) and one allocation: a
 * block allocated again starts with none, and a commit for the group
 * caches a block only when every rank declared its shard for that very
 * prefix, so that no rank ever reads bytes another prompt left. A rank's
 * session that ends frees only the blocks it holds itself (as any
 * session's end does): blocks of its group that its shard is missing from
 * stay with their holder, whose commit for the group is then refused
 * (nothing tells a rank that died from a second session that said the
 * same rank and hung up). A block freed while some rank's shard was
 * missing remembers the prefix the others declared: that rank's late
 * commit of it into the block allocated again is refused
 * (store_commit_shard).
 *
 * A record holds nothing that belongs to one device: a block id names the
 * same slot on every device's pool (DESIGN.md, Pool layout), so a node with
 * several devices keeps this one index and one record per id, and only the
 * copies (the media) are per device. What names a block (its namespace,
 * chained hash and commit time, store_meta_t) moves with it when it changes
 * tier; the rest belongs to its pool id.
 *
 * Handlers decode a request, call the store, and encode its answer; they
 * read records through the accessors below and never write them. Everything
 * runs on the loop thread.
 */
#ifndef KVS_DAEMON_STORE_H
#define KVS_DAEMON_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "radix.h"
#include "server.h"

/* What names a cached block, by index id: it moves with the block between
 * the tiers. */
typedef struct store_meta {
    uint64_t hash;      /* chained hash, the key KV events name (0 while events are off) */
    uint64_t cached_ms; /* loop time of its last commit (the lifetime histogram) */
    uint32_t ns;        /* the namespace that committed it */
} store_meta_t;

/* One block. writer, writer_pos, mark and used_ms belong to pool ids only. */
typedef struct store_record {
    store_meta_t meta;
    session_t *writer;   /* WRITING: the session holding it; NULL otherwise */
    uint32_t writer_pos; /* its index in writer->writing */
    uint32_t mark;       /* scratch stamp of the duplicate check (store_mark) */
    uint64_t used_ms;    /* loop time of its last commit or lookup match */
    /* Several devices: bit r set once rank r committed its shard of this
     * WRITING block (all bits: complete); shard_hash is the chained hash
     * of the prefix the first rank committed it for, which every other
     * rank must name too. */
    uint64_t shards;
    uint64_t shard_hash;
} store_record_t;

/* A retention hint as a request gives it (radix_hint): set false for none. */
typedef struct store_hint {
    bool set;
    uint32_t priority;    /* 0 .. RADIX_PRIO_MAX, checked by the caller */
    uint32_t duration_ms; /* 0: no end */
} store_hint_t;

/* What an Alloc's evictions dropped of namespace ns, for a caller that asks
 * (AllocRequest.report_evicted): want set by the caller; the store fills
 * tokens (malloc'd, the caller frees it) with the token ids of each dropped
 * block, as the wire has them (little-endian uint32), n blocks of them. */
typedef struct store_evicted {
    bool want;
    uint32_t ns;
    uint8_t *tokens;
    size_t n;
    size_t max; /* room in tokens, in blocks */
} store_evicted_t;

/* Returned by a store call that started copies between the tiers, or queued
 * the session for copies in flight (tier.h): the request waits and runs
 * again when they end. */
#define STORE_WAIT 1
/* Returned by store_alloc that evicted a piece of what it needs
 * (STORE_PIECE_BLOCKS blocks): the request runs again in the next loop turn,
 * for the next piece. */
#define STORE_MORE 2
/* Blocks of one piece of the work that large requests do in pieces, one
 * per loop turn: a Commit's inserts, an Alloc's blocks and evictions, a
 * Lookup's promotions from the lower tiers. 16,384 blocks: 4-9 ms of loop
 * work here (test_stalls), well under the 50 ms bound on stalls. */
#define STORE_PIECE_BLOCKS 16384

struct store {
    server_t *srv; /* the daemon it serves (its loop, geometry, counters) */
    pool_t *pool;
    radix_tree_t *index;
    store_record_t *rec; /* [n_ids] */
    uint32_t n_ids;      /* pool blocks + tier-2 blocks + tier-3 blocks */
    uint32_t mark_stamp;
    uint64_t *keys;              /* [pool blocks]: one commit's BlockStored keys */
    uint32_t *lower;             /* [pool blocks]: a commit's prefix before it (KV events) */
    store_evicted_t *report;     /* during one store call: where dropped blocks go */
    struct tier_medium *medium;  /* tier 2, below the pool; NULL: none */
    struct tier_medium *medium3; /* tier 3, below tier 2 (the disk); NULL: none */
    uint64_t medium_down_until;  /* loop ms: after a failed copy, no moves before it */
    struct store_drain *drains;  /* pins of closed sessions still to let go (FIFO) */
    struct store_drain *drains_tail;
    /* Several devices: [pool blocks], what a block freed before every
     * rank's shard was in still owes (store_commit_shard); NULL with one. */
    struct store_stale *stale;
    struct store_restore *restore; /* warm restart (store_restore.h); NULL: none ran */
};

/* Pins let go of per step when a closed session held many (store_drain_step):
 * about a millisecond of the loop, so that no close stalls other sessions. */
#define STORE_RELEASE_STEP 65536

/* After a copy to or from the medium failed, this long no block moves
 * between the tiers (a full pool evicts, a hit in tier 2 is not promoted),
 * so that a failing medium costs no request a wait that cannot end. */
#define STORE_MEDIUM_RETRY_MS 1000

/* Creates the pool, the index and the records for srv's geometry, pool and
 * tier 2 (srv->num_blocks, srv->tier2_blocks, srv->cfg.eviction), and sets
 * srv->pool and srv->index. Errors (message in err): KVS_ENOMEM, radix_new's
 * and pool_new's. */
int store_open(server_t *srv, store_t **out, char *err, size_t errlen);

/* Frees the index, the pool and the records (no events). Accepts NULL. */
void store_free(store_t *st);

/* --- the lifecycle --- */

/* n FREE blocks for session s, now WRITING by it, into ids[0..n) (the
 * caller reserved room in s's list: session_writing_reserve). With hashes
 * (not NULL) they are declared in flight as block i holding hashes[i] of ns
 * (inflight.h). A full pool evicts for ns (RADIX_NS_ANY: none) first, or,
 * with a tier 2, demotes: then s waits for the copies and STORE_WAIT is
 * returned (nothing allocated). Evictions of more than STORE_PIECE_BLOCKS
 * blocks for a session with a socket, without a report, go a piece per
 * call: STORE_MORE is returned after each but the last (nothing allocated;
 * the request runs again). *evicted: blocks dropped; report (may be
 * NULL) gets the tokens of the dropped blocks of report->ns. Errors:
 * KVS_EPOOLFULL (counted: alloc_failures), KVS_ENOMEM, radix's. */
int store_alloc(store_t *st, session_t *s, uint32_t ns, uint32_t n, const uint64_t *hashes,
                uint32_t *ids, size_t *evicted, store_evicted_t *report);

/* Drops up to n unpinned cached blocks for namespace ns's need (radix_evict's
 * rule); each is a BlockRemoved. *evicted: how many; report as for
 * store_alloc. Errors: radix_evict's. */
int store_evict(store_t *st, uint32_t ns, size_t n, size_t *evicted, store_evicted_t *report);

/* Starts a duplicate check over block ids: store_mark then says whether an
 * id was marked since (O(1) each; the stamps wrap without a sweep per call). */
void store_mark_begin(store_t *st);
/* Marks b; true when it was marked already since store_mark_begin. */
bool store_mark(store_t *st, uint32_t b);

/* Several devices (server_t.n_devices > 1): rank s->rank commits its shard
 * of ids[0..n_ids), the blocks of tokens in ns. Each is WRITING (by any
 * session of the group) or cached at that position (the caller checked
 * both, reserved 2 n_ids of scratch in canonical and n_ids pins). A block
 * enters the index only once every rank committed its shard: the longest
 * prefix of ids that is cached or complete is committed as s's
 * (store_commit: s holds the pins, the duplicates stay WRITING by s);
 * *n_pending blocks after it wait for other ranks, WRITING. With
 * declare_only (CommitRequest.shard_written) the shard is recorded and
 * nothing is committed: every WRITING block counts in *n_pending, for the
 * group's commit (store_mark_group) to cache. Errors: KVS_EINVAL (a block
 * another rank committed for another prefix; nothing changes), KVS_EBADSTATE
 * (a block freed while s's rank had not committed its shard, allocated
 * again, and named with the tokens of that earlier allocation: a late
 * commit; nothing changes), KVS_ENOMEM, store_commit's. */
int store_commit_shard(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t n_ids, bool declare_only,
                       const store_hint_t *hint, uint32_t *canonical, size_t *n_done,
                       size_t *n_pending);

/* A commit for the whole group (CommitRequest.for_group) of ids[0..n_ids),
 * the blocks of tokens in ns: each block s writes must have every rank's
 * shard declared for this very prefix (a ranked s counts its own); then
 * they are marked complete (call before store_commit, so that duplicates
 * it leaves WRITING are complete). Errors: KVS_EBADSTATE (block *bad of
 * ids lacks the shards of the ranks in *missing, one bit per rank; nothing
 * changes), KVS_ENOMEM, radix_chain_hashes's. */
int store_mark_group(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens,
                     const uint32_t *ids, size_t n_ids, size_t *bad, uint64_t *missing);

/* Per device r of the group (n = server_t.n_devices, each array n long):
 * written[r] gets the WRITING blocks whose shard rank r committed that
 * still wait for another rank's; missing[r] those some other rank
 * committed a shard of, but not rank r; workers[r] the open sessions that
 * said rank r at Hello. Linear in the sessions and their WRITING blocks. */
void store_device_counts(const store_t *st, uint32_t *written, uint32_t *missing,
                         uint32_t *workers);

/* Commits ids[0..n_ids) as the blocks of tokens in ns for session s; the
 * caller checked each is WRITING by s, or cached, pinned by s and holding
 * that position (handler_commit), and reserved n_ids pins. Block i becomes
 * cached (BlockStored) or, when another block holds prefix i, stays WRITING
 * as a duplicate; canonical[i] gets the block that holds it. Every block
 * committed leaves the in-flight table and takes the hint. canonical has
 * room for 2 n_ids. Returns radix_insert's status with *n_done blocks done
 * (KVS_EQUOTA is counted: alloc_failures_quota). */
int store_commit(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                 const uint32_t *ids, size_t n_ids, const store_hint_t *hint, uint32_t *canonical,
                 size_t *n_done);

/* store_commit in pieces: blocks [0, first) of the commit were committed by
 * earlier calls (canonical[0..first) holds them, the last one pinned by s,
 * so that the walk resumes there: radix_insert_after); this call commits
 * [first, end), its work linear in end - first (but for KV events with a
 * tier 2, whose walk is as long as the prefix). canonical has room for
 * 2 end - first. *n_done counts from 0: first plus the blocks done here. */
int store_commit_range(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t first, size_t end,
                       const store_hint_t *hint, uint32_t *canonical, size_t *n_done);

/* One more pin of s on cached pool block b, with the hint (s reserved room).
 * Errors: KVS_ENOTFOUND (not cached, or in a namespace s may not use: the
 * same answer; counted: pin_misses), radix_pin's. */
int store_pin(store_t *st, session_t *s, uint32_t b, const store_hint_t *hint);

/* Lets go of one hold of s on index id b: a pool block s writes goes back
 * to the pool; otherwise one of s's pins goes, and b takes the hint.
 * Errors: KVS_ENOTHELD (s holds neither: nothing changes), radix_unpin's
 * (s's pin was not in the index). */
int store_release(store_t *st, session_t *s, uint32_t b, const store_hint_t *hint);

/* The store's side of a session's end, in one call: its held Lookup's
 * wait, its claims, the namespaces it created, its tier copies and cluster
 * fetch let go of it, and everything it holds goes: WRITING blocks to the
 * pool at once, pins to the index at once when they are at most
 * STORE_RELEASE_STEP, otherwise the store takes s's pin map over and lets
 * go of it in steps (store_drain_step), and true is returned: the caller
 * runs the steps on later loop turns (until then those blocks stay pinned,
 * held by no session). Lookups held for what it was writing look again. */
bool store_session_end(store_t *st, session_t *s);

/* Lets go of up to STORE_RELEASE_STEP pins of closed sessions (oldest
 * close first); true when some are left for another step. */
bool store_drain_step(store_t *st);

/* --- a block's bytes: every layer and plane, in that order ---
 *
 * A block is a piece per layer and plane (K and V, or one latent) in each
 * slab (geometry.h); packed, as a value or a record carries it, the pieces
 * follow each other. store_block_walk calls piece(arg, slab_off, block_off,
 * bytes) for each: its offset in a slab of slab_blocks blocks (the pool's,
 * tier 2's), and in the packed block; the first error stops the walk and is
 * returned. Safe on any thread for a block that thread owns for the time
 * (a tier copy's, a cluster fetch's). */
typedef int (*store_piece_fn)(void *arg, uint64_t slab_off, uint64_t block_off, uint64_t bytes);
int store_block_walk(const store_t *st, uint32_t slab_blocks, uint32_t b, store_piece_fn piece,
                     void *arg);

/* Pool block b's bytes from or into a packed block (the backend's errors). */
int store_block_write(const store_t *st, uint32_t b, const void *payload);
int store_block_read(const store_t *st, uint32_t b, void *out);

/* Copies the counters kept by others (the KV-event publisher, the cluster
 * tier's thread, the disk tier's file) into srv->metrics, before a Stats
 * reply or a scrape. */
void store_sync_counters(store_t *st);

/* Pins of closed sessions not let go yet. */
uint64_t store_draining_pins(const store_t *st);

/* The cached prefix of tokens in ns for session s (pinned when pin), in
 * *ids (s's scratch, valid until its next request): *n_t1 tier-1 blocks,
 * then, with in_place, *n_t2 tier-2 blocks (index ids; the match stops
 * before tier 3, which is on disk). A pinned match that goes on into tier
 * 2 or 3 promotes those blocks first (s waits: STORE_WAIT), unless waited
 * (a held lookup answering, which does not wait again). Errors: KVS_ELIMIT (session_max_pinned:
 * nothing pinned, *n_t1 says how many it would have pinned), KVS_ENOMEM, radix_lookup's, tier.h's.
 */
int store_lookup(store_t *st, session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                 bool pin, bool in_place, bool waited, uint32_t **ids, size_t *n_t1, size_t *n_t2);

/* Blocks a Clear drops per loop turn, so that a namespace of any size is
 * cleared without a stall (docs/RELIABILITY.md, H14). A block costs about
 * 0.1 us in long prompts and up to 0.5 us where every block is a leaf of its
 * own (a heap update each): 16,384 blocks stay under about 8 ms. */
#define STORE_CLEAR_STEP 16384

/* One step of a Clear: up to max of namespace ns's unpinned cached blocks go
 * (each a BlockRemoved, counted as an eviction; radix_ns_clear_step);
 * *cleared: how many (< max: nothing more can go). Counted: cleared_blocks;
 * the caller counts the whole Clear (store_clear_done). Errors:
 * radix_ns_clear_step's. */
int store_clear(store_t *st, uint32_t ns, size_t max, size_t *cleared);

/* Counts one Clear whose steps have all run (the clears metric). */
void store_clear_done(store_t *st);

/* One prompt's cached blocks of namespace ns that no session pins and no
 * other cached prefix continues go, from its last block back, from either
 * tier (each a BlockRemoved, counted as an eviction of its own namespace):
 * *n_matched cached blocks were found, *n_tier1 and *n_tier2 of them
 * dropped; their records on the disk tier are deleted for good
 * (store_disk_forget_prompt). Errors: radix_evict_prompt's, and KVS_EIO /
 * KVS_ENOMEM (the blocks left the index; their disk records may not have). */
int store_evict_prompt(store_t *st, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                       size_t *n_matched, size_t *n_tier1, size_t *n_tier2);

/* --- moves between the pool and the tier below (tier.c runs the copies) --- */

/* Whether blocks may move between the tiers now: a tier 2 exists and its
 * medium did not fail a copy within STORE_MEDIUM_RETRY_MS. */
bool store_tiers_usable(const store_t *st);

/* Makes room in the pool for up to n blocks for ns by demotion
 * (radix_demote): moves[0..*n_moved) are busy until store_move_end; what
 * tier 2 drops to make room is dropped for good (BlockRemoved). moves has
 * room for n. Errors: radix_demote's. */
int store_demote(store_t *st, uint32_t ns, size_t n, radix_move_t *moves, size_t *n_moved);

/* With a tier 3: moves up to n of tier 2's least recently used blocks to
 * it (radix_spill), so that tier 2 keeps free ids for the next demotion
 * (which then does not wait for copies to the disk first); what tier 3
 * drops for room is dropped for good. moves has room for n. */
void store_spill(store_t *st, size_t n, radix_move_t *moves, size_t *n_moved);

/* Blocks fetched from the cluster tier (cluster_store.h): payloads[j]
 * (geometry_block_bytes each) hold block m + j of tokens in ns, j < n, and
 * prefix_ids[0..m) are the tier-1 blocks that hold its first m blocks now.
 * Takes pool blocks (store_install_take: evicting for them as an Alloc
 * does), writes the bytes, and inserts the blocks cached and unpinned, published as any
 * commit is (BlockStored). *n_installed: how many of the n are now cached
 * (a prefix another session cached meanwhile keeps its block). Errors:
 * KVS_EPOOLFULL (no block to take: nothing done), KVS_ENOMEM, radix_insert's
 * (KVS_EEXIST: the prefix is not held by prefix_ids any more). */
int store_install(store_t *st, uint32_t ns, const uint32_t *tokens, const uint32_t *prefix_ids,
                  size_t m, const void *const *payloads, size_t n, size_t *n_installed);

/* store_install in two steps, for bytes written into the pool elsewhere (the
 * cluster tier's thread). store_install_take: up to n pool blocks into ids
 * (WRITING, no session's), evicting for them as an Alloc in ns would (only
 * free ones with a tier 2); *n_taken of them. Then, once
 * the first n_written of them hold blocks m .. m + n_written of tokens,
 * store_install_done inserts those as store_install does and gives every
 * taken block that is not cached now back to the pool. */
int store_install_take(store_t *st, uint32_t ns, size_t n, uint32_t *ids, size_t *n_taken);
int store_install_done(store_t *st, uint32_t ns, const uint32_t *tokens, const uint32_t *prefix_ids,
                       size_t m, const uint32_t *ids, size_t n_written, size_t n_taken,
                       size_t *n_installed);

/* Promotes the tier-2 blocks pins[first .. first + n) (a pinned lookup's,
 * in chain order, after its tier-1 blocks) into free pool blocks, as far as
 * free blocks and radix_promote allow: pool_ids[0..*n_done) get them, busy
 * until store_move_end, and pins[first + i] names pool_ids[i] now (the pin
 * moved with the block). O(*n_done), not in the other pins. */
void store_promote(store_t *st, uint32_t *pins, size_t first, size_t n, uint32_t *pool_ids,
                   size_t *n_done);

/* The copy of one move ended; id is the block's new index id (a demotion's
 * tier-2 id, a promotion's pool id). ok: the block is readable there, and a
 * demotion's pool id goes back to the pool. Not ok: the move is undone
 * (radix_copy_undo; the block is where it was, with its bytes) and *back
 * gets its id again; KVS_EBUSY when it cannot be undone. */
int store_move_end(store_t *st, uint32_t id, bool ok, uint32_t *back);

/* Puts m in place of tier 2's medium and returns the one there (the
 * caller's now); no copy may be in flight. The host tier is the default;
 * tests put theirs in its place. */
struct tier_medium *store_swap_medium(store_t *st, struct tier_medium *m);

/* One pin held by the store's own work (a promotion's) goes. */
void store_unpin(store_t *st, uint32_t b);

/* The retention hint on cached block b (a block no longer cached takes
 * none). */
void store_hint(store_t *st, const store_hint_t *hint, uint32_t b);

/* The session holding pool block b WRITING, or NULL. */
static inline session_t *store_writer(const store_t *st, uint32_t b)
{
    return st->rec[b].writer;
}

/* Whether b was marked since store_mark_begin (store_mark without marking). */
static inline bool store_marked(const store_t *st, uint32_t b)
{
    return st->rec[b].mark == st->mark_stamp;
}

/* Where b sits in its writer's list (valid while store_writer(b) is set). */
static inline uint32_t store_writer_pos(const store_t *st, uint32_t b)
{
    return st->rec[b].writer_pos;
}

/* The namespace that committed index id b (either tier). */
static inline uint32_t store_block_ns(const store_t *st, uint32_t b)
{
    return st->rec[b].meta.ns;
}

#endif /* KVS_DAEMON_STORE_H */
