/* SPDX-License-Identifier: Apache-2.0 */
/*
 * radix: the prefix index of kvshare. No I/O, no event loop, no logging.
 *
 * Theory of operation
 * -------------------
 * A prompt is cut into blocks of `block_tokens` token ids; only full blocks
 * are indexed (a partial last block is never cached). Block i of a prompt in
 * namespace ns is named by a chained hash
 *
 *     h_i = XXH3_64(tokens of block i, seed = h_{i-1}),   h_{-1} = ns seed
 *
 * so h_i names the whole prefix up to and including block i. Each cached block
 * holds the pool block id whose memory has that prefix's KV, its hash, and a
 * copy of its token ids; every match is verified against those tokens, so a
 * hash collision never returns a wrong block. Two prefixes whose hashes
 * collide are both cached and told apart by their tokens (and parents):
 * collisions cost probe length, never correctness.
 *
 * The index is a tree of blocks per namespace (parent = the previous block of
 * the prefix), stored as a radix tree with path compression. Lookup cost grows
 * with the length of the matched prefix only: never with the number of cached
 * blocks nor with a node's fan-out (children are found in one hash table
 * keyed by parent and chained hash).
 *
 * Recency: the tree keeps a tick that every radix_lookup and radix_insert
 * call advances by one (including calls that match nothing; not calls that
 * fail argument checks). A block's last use is the tick of the last lookup
 * that matched it (returned it in ids) or the last insert that handled it
 * (inserted it, or found it as the canonical block of a duplicate). Pins,
 * unpins and evictions do not change it. Since every walk starts at a root,
 * a block is never less recently used than its descendants.
 *
 * Hits: a block's hit count is the number of radix_lookup calls that matched
 * it (returned it in ids); inserts do not count.
 *
 * Pins: each cached block has a refcount. A pinned block (refcount > 0) is
 * never evicted, nor are its ancestors. Eviction takes unpinned leaves (cached
 * blocks with refcount 0 and no cached child) in eviction order, hands their
 * block ids back through `on_evict`, and makes a parent a candidate when its
 * last child goes.
 *
 * Eviction order: each evictable leaf has a key, taken when it becomes an
 * evictable leaf (inserted as the last block of a prompt, unpinned to 0, its
 * last child evicted) and again whenever a lookup or insert uses it while it
 * is one; the key stays fixed in between. The leaf with the smallest key goes
 * first, ties going to the older last use (last uses of evictable leaves are
 * all distinct, so the order is total). The key is
 *   - RADIX_EVICT_LRU (the default): the last use; so least recently used
 *     first;
 *   - RADIX_EVICT_FREQ: the last use + min(hits, freq_max_hits) x step, where
 *     step is freq_bonus_ticks if set, else freq_bonus_pct % of the moving
 *     average age (tick at eviction - last use) of evicted blocks, weight
 *     1/64 per eviction, all in integers: avg64 += age - avg64 / 64 at each
 *     eviction, A = avg64 / 64, step = A x pct / 100, computed when the key
 *     is taken (a parent's key after its child's eviction sees that
 *     eviction's age). A block hit before thus outlives blocks never hit by
 *     up to step ticks per hit: frequency predicts reuse, and the bonus
 *     scales with how long blocks survive anyway.
 *     Horizon (unless freq_horizon_pct is RADIX_FREQ_NO_HORIZON; never with
 *     freq_bonus_ticks): the bonus applies only while A is below
 *     H = G x freq_horizon_pct / 100, where G = gap64 / 64 is the moving
 *     average (weight 1/64, same integer form) of first-reuse gaps: at each
 *     radix_lookup that matches at least one block whose last matched block
 *     had no hits before it, gap = this lookup's tick - that block's last
 *     use before it, counted before the lookup's own leaf is queued; step =
 *     0 when A >= H. In a pool whose blocks outlive a few reuse gaps, past
 *     hits no longer tell which blocks come back, and the order is LRU's.
 * No operation scans every leaf: lookup and pin are O(1) per block; unpin is
 * O(1), or O(log leaves) when it makes a leaf evictable out of key order;
 * eviction is O(log leaves) per block. Under RADIX_EVICT_FREQ a lookup or
 * insert that ends on a leaf queues it with one heap push (O(log leaves))
 * unless its key is the largest, where LRU appends it to a list in O(1).
 *
 * Tiers: with tier2_blocks > 0 the index also holds blocks in a second tier
 * (host memory), named by ids [max_blocks, max_blocks + tier2_blocks) that
 * the tree itself hands out; ids below max_blocks are tier 1 (the pool).
 * With tier3_blocks > 0 as well, a third tier (a local disk) follows with
 * ids [max_blocks + tier2_blocks, + tier3_blocks). The tiers are exclusive:
 * a block is in one of them, so the cache holds the sum of all (an
 * inclusive tier 2 would hold only max(tier 1, tier 2) distinct blocks,
 * and every demotion would copy a block that is already there), and a
 * block's tier is never above its parent's (tier 1 is closed towards the
 * root, and so are tiers 1-2). So a matched prefix is some tier-1 blocks,
 * then some tier-2 blocks, then some tier-3 blocks. Each tier has its own
 * eviction queue. Room in tier 1 is made by radix_demote: it takes tier-1
 * candidates (unpinned tier-1 blocks with no tier-1 block below them) in
 * eviction order, by the reservation rule, and gives each a free tier-2
 * id; when tier 2 is full it makes room there the same way, one tier down:
 * its tier-2 candidates move to tier 3 (or, in the lowest tier, its leaves
 * are dropped), by the same rule. radix_promote moves a matched block of a
 * lower tier straight back to a tier-1 id. A demoted or promoted block is
 * busy until radix_copy_done: it is then in no tier's queue, and lookups
 * and matches stop before it, as if it were not cached (its bytes are
 * being copied), and its old id is not free before that either. Quotas
 * and reservations count each tier on its own (quota: tier 1 only; a
 * reservation holds in each tier). Recency, hits and pins do not depend on
 * the tier. radix_restore puts blocks straight into a lower tier (a disk
 * tier's records after a restart).
 *
 * Namespaces each have a name, a seed, a root, a quota (max cached blocks, 0 =
 * unlimited) and a reservation: capacity the namespace is guaranteed. Eviction
 * for another namespace's need never takes it below its reservation, and while
 * it holds fewer cached blocks than its reservation its own need is met first
 * from namespaces above their reservations (radix_evict states the rule).
 * Each namespace keeps its own eviction order; eviction looks at the first
 * leaf of each namespace that may give, never at every leaf. A namespace
 * that holds no cached block may be deleted, and its id reused.
 *
 * Block ids are owned by the caller (the pool); the index only records which
 * cached prefix each id holds. A tree is not thread-safe: one caller at a
 * time (the daemon's event loop). All functions return 0 or a negative KVS_*
 * code (kvshare_status.h); on error nothing has changed unless said otherwise.
 */
#ifndef KVS_RADIX_H
#define KVS_RADIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvshare_status.h"

/* radix_insert_after: the tokens start at the namespace's root. */
#define RADIX_NO_BLOCK    UINT32_MAX
#define RADIX_NS_ANY      UINT32_MAX /* radix_evict: on behalf of no namespace */
#define RADIX_NS_NAME_MAX 63         /* bytes of a namespace name, without the NUL */
#define RADIX_NS_ALL      UINT32_MAX /* radix_top: every namespace */
#define RADIX_TIERS       3          /* the pool and at most two tiers below it */

typedef struct radix_tree radix_tree_t;

/* Called once for each block the index drops for good (eviction, quota, a
 * tier-2 drop): the block id goes back to its owner (a tier-2 id, at or
 * above max_blocks, is free in the tree again already; the owner only
 * learns that its block left the cache). A demotion or promotion is not a
 * drop. Must not call back into the tree. */
typedef void (*radix_evict_fn)(void *ctx, uint32_t block_id);

/* Block hash: the default is chained XXH3-64. Tests replace it to force
 * collisions. */
typedef uint64_t (*radix_hash_fn)(const uint32_t *tokens, size_t n_tokens, uint64_t seed);

/* Defaults of the RADIX_EVICT_FREQ parameters (radix_config_t). */
#define RADIX_FREQ_MAX_HITS    2
#define RADIX_FREQ_BONUS_PCT   75
#define RADIX_FREQ_HORIZON_PCT 275
/* freq_horizon_pct: no horizon, the bonus always applies (the earlier rule). */
#define RADIX_FREQ_NO_HORIZON UINT32_MAX

/* Eviction policy: which evictable leaf goes first (see Eviction order). */
typedef enum radix_policy {
    RADIX_EVICT_LRU = 0, /* least recently used leaf first (the default) */
    RADIX_EVICT_FREQ = 1 /* smallest last use + bonus per hit first */
} radix_policy_t;

typedef struct radix_config {
    uint32_t block_tokens;   /* tokens per block, > 0 (kvshare default: 16) */
    uint32_t max_blocks;     /* block ids are in [0, max_blocks) */
    radix_evict_fn on_evict; /* may be NULL */
    void *evict_ctx;
    /* May be NULL: called with evict_ctx just before on_evict, with the
     * dropped block's namespace and its block_tokens token ids (valid during
     * the call only), for callers that report what was dropped. Must not call
     * back into the tree. */
    void (*on_evict_tokens)(void *ctx, uint32_t block_id, uint32_t ns, const uint32_t *tokens);
    radix_hash_fn hash; /* NULL: XXH3-64 */
    /* Tests only, NULL otherwise: asked before each allocation the index
     * makes once the tree exists; true makes that allocation fail, so tests
     * can check that every operation then fails cleanly (KVS_ENOMEM) and
     * leaves the tree consistent. */
    bool (*fail_alloc)(void *ctx);
    void *fail_ctx;
    /* Eviction policy and its parameters (RADIX_EVICT_FREQ only; 0 picks
     * the documented default). See Eviction order above. */
    radix_policy_t policy;
    uint32_t freq_max_hits;    /* hits that earn a bonus, at most (0: 2; <= 255) */
    uint32_t freq_bonus_pct;   /* bonus per hit, % of the mean eviction age (0: 25; <= 10000) */
    uint64_t freq_bonus_ticks; /* > 0: a fixed bonus per hit in ticks instead (<= 2^32 - 1) */
    uint32_t freq_horizon_pct; /* horizon, % of the mean reuse gap (0: 275; <= 10000,
                                * or RADIX_FREQ_NO_HORIZON) */
    uint32_t tier2_blocks;     /* blocks of tier 2 (see Tiers); 0: one tier */
    uint32_t tier3_blocks;     /* blocks of tier 3, below tier 2 (needs tier2_blocks > 0) */
} radix_config_t;

/* Retention priorities (radix_hint): 0 .. RADIX_PRIO_MAX, and the bands
 * stats count them in: 0-24, 25-49, 50-74, 75-100. */
#define RADIX_PRIO_MAX     100
#define RADIX_PRIO_DEFAULT 50
#define RADIX_PRIO_BANDS   4

typedef struct radix_ns_stats {
    uint64_t lookups;          /* radix_lookup calls */
    uint64_t lookup_tokens;    /* tokens asked for by lookups */
    uint64_t hit_tokens;       /* tokens matched by lookups (full blocks) */
    uint64_t inserted_blocks;  /* blocks that became cached */
    uint64_t duplicate_blocks; /* inserts whose prefix another block already held */
    uint64_t evicted_blocks;   /* blocks dropped, by eviction or quota: the sum of */
    uint64_t evicted_own;      /*   radix_evict for this namespace's own need, */
    uint64_t evicted_others;   /*   radix_evict for another's need or none's (RADIX_NS_ANY), */
    uint64_t evicted_quota;    /*   radix_insert at this namespace's quota */
    uint64_t tier2_dropped;    /* of evicted_blocks, those dropped from tier 2 */
    uint64_t demoted_blocks;   /* blocks moved to tier 2 (radix_demote): the sum of */
    uint64_t demoted_own;      /*   for this namespace's own need, */
    uint64_t demoted_others;   /*   for another's or none's */
    uint64_t promoted_blocks;  /* blocks moved back to tier 1 (radix_promote) */
    uint64_t t2_hit_tokens;    /* of hit_tokens, tokens matched below tier 1 (tiers 2, 3) */
    uint32_t tier2_blocks;     /* blocks in tier 2 now (cached_blocks counts tier 1) */
    uint32_t cached_blocks;    /* blocks in the tree now */
    uint32_t pinned_blocks;    /* of those, blocks with refcount > 0 */
    uint32_t quota;            /* 0: unlimited */
    uint32_t reserve;
    uint32_t prio_default; /* retention priority of blocks without a live hint */
    uint32_t prio_cap;     /* the highest a hint may give */
    uint32_t cached_by_band[RADIX_PRIO_BANDS];  /* cached + tier-2 blocks by priority band */
    uint64_t evicted_by_band[RADIX_PRIO_BANDS]; /* evicted_blocks by band when dropped */
    /* Tier 3 (tier3_blocks > 0): blocks there now (not in tier2_blocks),
     * blocks moved there from tier 2, of evicted_blocks those dropped from
     * it, of t2_hit_tokens those matched in it, and blocks restored into it
     * (radix_restore). */
    uint32_t tier3_blocks;
    uint64_t demoted3_blocks;
    uint64_t tier3_dropped;
    uint64_t t3_hit_tokens;
    uint64_t restored_blocks;
} radix_ns_stats_t;

typedef enum radix_order {
    RADIX_BY_HITS, /* most matched first */
    RADIX_BY_SIZE  /* most cached blocks under the prefix first */
} radix_order_t;

/* One row of radix_top: a prefix (a node of the tree) and its subtree. */
typedef struct radix_prefix {
    uint32_t ns;
    uint32_t tokens;        /* length of the prefix, in tokens */
    uint32_t blocks;        /* cached blocks in this prefix's subtree, itself included */
    uint32_t pins;          /* sum of refcounts in the subtree */
    uint64_t hits;          /* lookups that matched through the end of this prefix */
    uint64_t last_used;     /* tick of the last lookup or insert that touched it */
    uint32_t last_block_id; /* the block holding the prefix's last block */
    uint32_t tier2_blocks;  /* of blocks, those below tier 1 (tiers 2 and 3, see Tiers) */
    /* The node this one extends: its last_block_id, when has_parent (false
     * for a node right below its namespace's root). Lets a reader draw the
     * rows as the tree they are. */
    uint32_t parent_block_id;
    bool has_parent;
} radix_prefix_t;

/* Creates an empty index. Errors: KVS_EINVAL (block_tokens or max_blocks 0,
 * block_tokens > 65536, an unknown policy, freq_* parameters above their
 * limits), KVS_ENOMEM. The tree is freed with radix_free.
 * Memory: 23 bytes per possible block id (max_blocks) at once, then per
 * cached block 28 bytes plus its token ids, plus a node header and a table
 * slot per run of blocks. */
int radix_new(const radix_config_t *cfg, radix_tree_t **out);

/* Frees the index without calling on_evict. Accepts NULL. */
void radix_free(radix_tree_t *t);

/* Adds a namespace; *ns_out gets its id: the lowest id free, that of a
 * deleted namespace (radix_ns_delete) or the next one, so ids stay below the
 * most namespaces that ever existed at once. The name is copied. Errors:
 * KVS_EINVAL (empty or longer than RADIX_NS_NAME_MAX bytes), KVS_EEXIST (name
 * taken), KVS_ENOMEM. */
int radix_ns_create(radix_tree_t *t, const char *name, uint64_t seed, uint32_t quota,
                    uint32_t reserve, uint32_t *ns_out);

/* Finds a namespace by name. Errors: KVS_ENONS. */
int radix_ns_find(const radix_tree_t *t, const char *name, uint32_t *ns_out);

/* Deletes a namespace that holds no cached block (so no pinned one): its
 * name, seed, limits, priorities and counters go, and its id is free for
 * the next radix_ns_create (another namespace then, with a new root: nothing
 * of the deleted one's carries over). Cost: O(1) plus freeing its queues.
 * The tree's tick and totals stay. Errors: KVS_EINVAL (t NULL), KVS_ENONS
 * (no namespace with that id), KVS_EBUSY (it holds cached blocks: nothing
 * changes). */
int radix_ns_delete(radix_tree_t *t, uint32_t ns);

/* Number of namespaces. */
uint32_t radix_ns_count(const radix_tree_t *t);

/* One past the highest namespace id in use (0 for none): a walk over every
 * namespace is `for (id = 0; id < radix_ns_id_end(t); id++)`, skipping the
 * ids of deleted namespaces (radix_ns_name NULL, the others KVS_ENONS).
 * Without deletions, equal to radix_ns_count. */
uint32_t radix_ns_id_end(const radix_tree_t *t);

/* The namespace's name, owned by the tree, valid until radix_free or the
 * namespace's radix_ns_delete; NULL for an unknown or deleted id. */
const char *radix_ns_name(const radix_tree_t *t, uint32_t ns);

/* Changes quota and reservation. A lowered quota does not evict at once: the
 * next insert into the namespace does. Errors: KVS_ENONS. */
int radix_ns_set_limits(radix_tree_t *t, uint32_t ns, uint32_t quota, uint32_t reserve);

/* Copies the namespace's counters into *out. Errors: KVS_ENONS. */
int radix_ns_stats(const radix_tree_t *t, uint32_t ns, radix_ns_stats_t *out);

/* Longest cached prefix of `tokens` (full blocks only). Writes the matched
 * block ids, in prompt order, into ids[0 .. *n_blocks), at most max_ids of
 * them (matching stops there). When pin is true each returned block's
 * refcount goes up by one (release them with radix_unpin), and matching
 * also stops before a block whose refcount is at its limit (UINT32_MAX). Marks the matched
 * blocks used at this call's tick (see Recency) and counts the lookup in the
 * namespace's stats. n_tokens may be 0. Cost: one token comparison per
 * matched block, one hash and one table probe per node boundary crossed.
 * Errors: KVS_EINVAL (tokens NULL with n_tokens > 0, ids NULL with
 * max_ids > 0, n_blocks NULL), KVS_ENONS. */
int radix_lookup(radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens, bool pin,
                 uint32_t *ids, size_t max_ids, size_t *n_blocks);

/* The blocks that hold the cached prefix of `tokens`, as radix_lookup finds
 * them, but read-only: no pins, no hit counts, no namespace statistics, no
 * tick and no change of last use. For callers that must check which block
 * holds which prefix (kvshared verifies a Commit that names cached blocks)
 * without the check counting as a use. Fills ids[0 .. *n_blocks), *n_blocks
 * <= min(max_ids, n_tokens / block_tokens). Cost: one walk step per matched
 * block. Errors: KVS_EINVAL (as radix_lookup), KVS_ENONS. */
int radix_match(const radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                uint32_t *ids, size_t max_ids, size_t *n_blocks);

/* The chained hashes of the first n_blocks full blocks of `tokens` in
 * namespace ns: out[i] = h_i (see Theory of operation), whether cached or
 * not. For callers that name prefixes the index does not hold yet (kvshared
 * declares the prefixes of blocks being written). Cost: one hash per block.
 * Errors: KVS_EINVAL (NULL arrays with n_blocks > 0), KVS_ENONS. */
int radix_chain_hashes(const radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_blocks,
                       uint64_t *out);

/* Inserts the first n_ids full blocks of `tokens`, block i held by ids[i]
 * (n_ids <= n_tokens / block_tokens). Block by block: if the prefix is already
 * cached, canonical[i] is the block that holds it (a duplicate: ids[i] stays
 * the caller's), else ids[i] becomes cached and canonical[i] = ids[i]. When pin
 * is true every canonical block gets one pin.
 *
 * A duplicate whose ids[i] is the canonical block itself (a re-insert of the
 * same blocks) counts as a duplicate too. Every handled block is marked used
 * at this call's tick.
 *
 * *n_done is the number of blocks handled. A namespace at its quota first
 * evicts its own unpinned leaves in eviction order (never the block the new ones hang
 * from); when it cannot, insertion stops there and KVS_EQUOTA is returned
 * with the first *n_done blocks handled (and pinned). Evictions made for the
 * quota stay made whatever the result. Errors: KVS_EINVAL (bad counts, an id
 * >= max_blocks, NULL arrays with counts > 0, n_done NULL: nothing changes),
 * KVS_ENONS, KVS_EEXIST (ids[i] is already cached and is not the block that
 * holds prefix i, or is a tier-1 id that a demotion is still copying from
 * (radix_demote), or repeats an earlier new id of this call; ids are checked
 * as they are on entry, before any eviction: nothing from block i on is
 * inserted, *n_done = i), KVS_EBUSY (pin is true and the block holding prefix
 * i already has UINT32_MAX pins: *n_done = i, nothing from i on is done), KVS_ENOMEM (*n_done =
 * blocks done before; the tree stays consistent). */
int radix_insert(radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                 const uint32_t *ids, size_t n_ids, bool pin, uint32_t *canonical, size_t *n_done);

/* radix_insert for the blocks that follow the cached block `after` (of
 * namespace ns, in tier 1): tokens, ids and canonical start at the block
 * after it, and the walk starts at it instead of the root, so a long prompt
 * can be inserted in pieces, each one's work linear in its own blocks
 * (kvshared cuts a large Commit so). The caller keeps `after` from being
 * dropped between the pieces (a pin). Its blocks are marked used as
 * `after` was (no later than their parent). after == RADIX_NO_BLOCK is
 * radix_insert. Errors as radix_insert's, and KVS_ENOTFOUND (after is not
 * cached), KVS_EBADSTATE (after is in another namespace or below tier 1):
 * nothing changes. */
int radix_insert_after(radix_tree_t *t, uint32_t ns, uint32_t after, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t n_ids, bool pin,
                       uint32_t *canonical, size_t *n_done);

/* Adds one pin to a cached block; does not change its last use. Errors:
 * KVS_EINVAL (id out of range), KVS_ENOTFOUND (block not cached), KVS_EBUSY
 * (refcount already UINT32_MAX). */
int radix_pin(radix_tree_t *t, uint32_t block_id);

/* Removes one pin; does not change the block's last use (a leaf unpinned
 * to 0 becomes evictable at its place in eviction order). Errors: KVS_EINVAL,
 * KVS_ENOTFOUND, KVS_ENOTPINNED (refcount already 0: nothing changes). */
int radix_unpin(radix_tree_t *t, uint32_t block_id);

/* A block's refcount must stay below UINT32_MAX: radix_pin refuses with
 * KVS_EBUSY there; lookups and inserts that pin rely on the caller never
 * holding that many pins on one block. */

/* Whether the block is cached, and its refcount. Errors: KVS_EINVAL,
 * KVS_ENOTFOUND. */
int radix_block_refcount(const radix_tree_t *t, uint32_t block_id, uint32_t *refcount);

/* Retention hints. A cached block's priority is the highest that a live
 * hint gives it, else its namespace's default (RADIX_PRIO_DEFAULT unless
 * radix_ns_set_priority says otherwise). Eviction takes the lowest priority
 * first, and within a priority the order above (Eviction order): the
 * priority sits above the key's other bits. Priority is not a pin: a
 * priority-100 block is evicted when nothing lower is left, and quotas and
 * reservations (radix_evict) hold whatever the priorities.
 * A hint with until == 0 lasts while the block is cached; otherwise it ends
 * at `until`, in the clock of radix_expire_hints' `now` (kvshared: loop
 * milliseconds). block_id may be in either tier: hints, and the band the
 * block is counted in, go with a block that changes tier (radix_demote,
 * radix_promote), and the priority orders both tiers. A block keeps two: the highest hint without
 * an end, and the highest timed one (a timed hint lower than a live timed one is dropped, even when
 * it would outlast it). Hints end with the block's eviction. Cost: O(1), plus O(log leaves) when a
 * queued leaf changes place, plus a heap push for a timed hint. The expiry queue holds a block's
 * live timed hint, not its history: entries of hints replaced or ended are dropped once they
 * outnumber the live ones by 64 (amortised O(1) per push), and at most radix_hint_limit's blocks
 * hold a live timed hint. Errors: KVS_EINVAL (id
 * out of range, prio > RADIX_PRIO_MAX, until >= 2^63), KVS_ENOTFOUND (not cached), KVS_ENOMEM,
 * KVS_ELIMIT (timed only, the limit reached: nothing changes). A prio above the namespace's cap
 * counts as the cap. */
int radix_hint(radix_tree_t *t, uint32_t block_id, uint32_t prio, uint64_t until);

/* The most blocks that may hold a live timed hint at once (0, the default:
 * every block may); a timed hint for one more block is refused with
 * KVS_ELIMIT (a block's live one may still change). Hints live already
 * stay. Errors: KVS_EINVAL. */
int radix_hint_limit(radix_tree_t *t, size_t max_timed);

/* Entries in the expiry queue of timed hints: the live ones, and those
 * replaced or ended not yet dropped (at most 2 x live + 64). */
size_t radix_hint_queue_len(const radix_tree_t *t);

/* Blocks holding a live timed hint. */
size_t radix_hint_timed(const radix_tree_t *t);

/* Ends the timed hints whose `until` <= now (each block's priority falls
 * back to what its other hints, or its namespace's default, give). Call it
 * before evicting; *n_expired (may be NULL) = hints ended. Cost: O(log n)
 * per hint ended or stale. Errors: KVS_EINVAL. */
int radix_expire_hints(radix_tree_t *t, uint64_t now, size_t *n_expired);

/* A cached block's priority now. Errors: KVS_EINVAL, KVS_ENOTFOUND. */
int radix_block_priority(const radix_tree_t *t, uint32_t block_id, uint32_t *prio);

/* A namespace's default priority and the cap on its hints (both <=
 * RADIX_PRIO_MAX; hints above a lowered cap come down to it). Linear in
 * max_blocks when either changes and the namespace holds blocks (O(1) for
 * an empty one): for configuration, not the request path.
 * Errors: KVS_EINVAL, KVS_ENONS. */
int radix_ns_set_priority(radix_tree_t *t, uint32_t ns, uint32_t prio_default, uint32_t prio_cap);

/* The chained hash of a cached block (h_i of Theory of operation): the key
 * that names its whole prefix, as KV events publish it. Errors: KVS_EINVAL
 * (id out of range, hash NULL), KVS_ENOTFOUND (block not cached). */
int radix_block_hash(const radix_tree_t *t, uint32_t block_id, uint64_t *hash);
/* One block radix_demote moved: its old id `from` (a tier-1 id, or a
 * tier-2 id moving to tier 3; not free before the copy to `to` is done)
 * and its new id `to` in the tier below. */
typedef struct radix_move {
    uint32_t from;
    uint32_t to;
    uint32_t ns;
} radix_move_t;

/* Makes room for up to n blocks in tier 1 (tier 2 must exist): takes tier-1
 * candidates by the rule of radix_evict (with tier-1 counts) and demotes
 * each to a free tier-2 id, moves[*n_moved] = {from, to}; the block is busy
 * until radix_copy_done(to), and `from` stays the caller's, not free, until
 * then. When tier 2 has no free id it makes room there by the same rule
 * (for the demoted block's namespace, with tier-2 counts): with a tier 3,
 * its first tier-2 candidate moves to tier 3 (a move {tier-2 id, tier-3
 * id} in moves, counted towards n: its tier-2 id is free once copied, for
 * the caller's next call), making room in tier 3 by dropping tier-3 leaves;
 * without one, its first tier-2 leaf is dropped. When the tier below has
 * nothing that may go (everything pinned or busy), a tier-1 candidate with
 * nothing below it is dropped instead (on_evict; counted in *n_dropped),
 * and one with lower blocks below it stops the call. *n_moved + *n_dropped
 * may be less than n; that is not an error. moves has room for n. Errors:
 * KVS_EINVAL (no tier 2, NULL arguments), KVS_ENONS. */
int radix_demote(radix_tree_t *t, uint32_t for_ns, size_t n, radix_move_t *moves, size_t *n_moved,
                 size_t *n_dropped);

/* Moves up to n candidates of tier k (2: tier 3 must exist) one tier down,
 * by the rule of radix_evict for no namespace's need (RADIX_NS_ANY),
 * making room there as radix_demote does (dropping its leaves): moves[0 ..
 * *n_moved), busy until radix_copy_done(to); each old id is free once
 * copied. For a caller that keeps free ids in tier k ahead of the next
 * demotion into it, so that one does not wait for this one's copies.
 * Errors: KVS_EINVAL (k has no tier below, NULL arguments). */
int radix_spill(radix_tree_t *t, uint32_t k, size_t n, radix_move_t *moves, size_t *n_moved);

/* Ids of lower tier k (2 or 3) held by moves out of it being copied (free
 * once their copies end); 0 for tier 1 or a tier that does not exist. */
uint32_t radix_tier_leaving(const radix_tree_t *t, uint32_t k);

/* Moves the block lower_id of a lower tier (2 or 3), whose parent is in
 * tier 1, to the free tier-1 id block_id (the caller's; it becomes cached).
 * The block keeps its place, recency, hits and pins (a caller that pinned
 * lower_id holds a pin on block_id now) and is busy until
 * radix_copy_done(block_id); its lower id is free again then. Errors:
 * KVS_EINVAL (ids out of their tiers, no tier 2, the parent not in tier 1),
 * KVS_ENOTFOUND (lower_id not cached), KVS_EEXIST (block_id cached or
 * busy), KVS_EBUSY (lower_id busy, or pinned more than once: someone else
 * reads its copy). */
int radix_promote(radix_tree_t *t, uint32_t lower_id, uint32_t block_id);

/* How many of ids, from the first, radix_promote would take as far as their
 * own state goes: cached blocks of a lower tier, not busy, pinned exactly
 * once (the caller's pin from the lookup that matched them). ids is a
 * matched prefix's lower part; a block that someone else pins too (a reader
 * of its tier-2 copy in place) ends the run, so it and the blocks after it
 * stay where they are. */
size_t radix_promotable(const radix_tree_t *t, const uint32_t *ids, size_t n);

/* Ends the copy of busy block id (a promotion's tier-1 id or a demotion's
 * lower id): *peer gets its other id (for a demotion from tier 1, the
 * tier-1 id that the caller may now free; a lower old id is free in the
 * tree again). The block becomes readable and, if it is a candidate,
 * queued. Errors: KVS_EINVAL, KVS_ENOTFOUND (not busy). */
int radix_copy_done(radix_tree_t *t, uint32_t id, uint32_t *peer);

/* Ends the copy of busy block id as if the move had not happened, for a
 * copy that failed: the block goes back to its other id *peer (a demotion's
 * old id, whose bytes were never given up; a promotion's lower id, whose
 * copy is still there) with its place, recency, hits, hints and pins, and id
 * is free again (a promotion's tier-1 id is the caller's). The namespace's
 * demoted / promoted counters still count the move. Undo a batch in the
 * reverse order of its moves. Errors: KVS_EINVAL, KVS_ENOTFOUND (not busy),
 * KVS_EBUSY (moving it back would break the tier order towards the root:
 * the block before a demoted one was demoted meanwhile; nothing changes). */
int radix_copy_undo(radix_tree_t *t, uint32_t id, uint32_t *peer);

/* Takes one radix_lookup back out of namespace ns's counters: a lookup of
 * n_tokens tokens that matched n_blocks blocks, n_tier2 of them below tier
 * 1 and n_tier3 of those in tier 3 (lookups, lookup_tokens, hit_tokens,
 * t2_hit_tokens and t3_hit_tokens go down by what it added). For a caller
 * that runs one request's lookup again after moving blocks between the
 * tiers, so that the request counts once, as first matched. Recency and
 * hits of the blocks stay. Errors: KVS_EINVAL (more than was counted,
 * n_tier3 > n_tier2 > n_blocks), KVS_ENONS. */
int radix_lookup_uncount(radix_tree_t *t, uint32_t ns, size_t n_tokens, size_t n_blocks,
                         size_t n_tier2, size_t n_tier3);

/* Blocks in tier 2, free tier-2 ids, and blocks being copied. */
uint32_t radix_tier2_blocks(const radix_tree_t *t);
uint32_t radix_tier2_free(const radix_tree_t *t);
uint32_t radix_busy_blocks(const radix_tree_t *t);

/* Blocks in tier k (1: the pool, 2, 3), and free ids of lower tier k
 * (0 for tier 1 or a tier that does not exist). */
uint32_t radix_tier_blocks(const radix_tree_t *t, uint32_t k);
uint32_t radix_tier_free(const radix_tree_t *t, uint32_t k);

/* The tier (1, 2 or 3) an id below the index's end names, 0 for an id
 * beyond it. */
uint32_t radix_tier_of(const radix_tree_t *t, uint32_t id);

/* What names cached block id for a copy elsewhere: its chained hash, the
 * hash it chains from (its parent's, or its namespace's seed), and its
 * block_tokens token ids (*tokens valid until the tree next changes).
 * Errors: KVS_EINVAL, KVS_ENOTFOUND. */
int radix_block_chain(const radix_tree_t *t, uint32_t id, uint64_t *hash, uint64_t *parent_hash,
                      const uint32_t **tokens);

/* The other id of busy block id (radix_copy_done's *peer to come): where
 * its bytes are copied from. Errors: KVS_EINVAL, KVS_ENOTFOUND (not busy). */
int radix_block_peer(const radix_tree_t *t, uint32_t id, uint32_t *peer);

/* Puts blocks straight into a lower tier (a disk tier's records found at a
 * restart): the n_ids blocks of tokens in namespace ns, block i under id
 * ids[i], all ids of one lower tier k and free there. Blocks of the prefix
 * already cached stay (canonical[i] = their id; the caller's ids[i] stays
 * free); the first new block needs its parent in tier k or above. New
 * blocks are cached unpinned, used at this call's tick (a later call's
 * blocks are more recent), counted as restored_blocks (not
 * inserted_blocks), and queued in tier k's queue. No quota applies. *n_done
 * = blocks handled. Errors: KVS_EINVAL (bad counts, NULL arrays, ids not
 * all of one lower tier), KVS_ENONS, KVS_EEXIST (an id taken: nothing from
 * there on is done), KVS_EBUSY (a cached block of the prefix is in a lower
 * tier than k, or busy), KVS_ENOMEM. */
int radix_restore(radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                  const uint32_t *ids, size_t n_ids, uint32_t *canonical, size_t *n_done);

/* Evicts up to n unpinned leaf blocks, calling on_evict for each. for_ns is
 * the namespace whose need drives the eviction (RADIX_NS_ANY for none). The
 * reservation rule, applied at each block with the counts as they are then:
 * the namespaces that may give are those whose cached_blocks exceed their
 * reserve (for_ns excepted);
 *   - if for_ns holds fewer cached blocks than its reserve, the block is the
 *     first in eviction order among the leaves of the namespaces that may
 *     give, and only when they have none, for_ns's own first leaf;
 *   - otherwise (for_ns at or above its reservation, or RADIX_NS_ANY) it is
 *     the first in eviction order among for_ns's leaves and theirs.
 * So another namespace's need never takes a namespace below its reservation,
 * and a namespace below its own gets back what it lent before it evicts
 * itself. *n_evicted may be less than n (everything else pinned or reserved);
 * that is not an error. Counted as evicted_own or evicted_others of the
 * namespace that lost the block. Cost per block: O(log leaves) plus one look
 * at each namespace. With a tier 2 it drops tier-1 leaves only, and stops at
 * a candidate that has tier-2 blocks below it (radix_demote moves those).
 * Errors: KVS_ENONS. */
int radix_evict(radix_tree_t *t, uint32_t for_ns, size_t n, size_t *n_evicted);

/* Drops every cached block of namespace ns that can go: unpinned leaves,
 * then their parents as their last child goes, until only pinned blocks and
 * their ancestors are left. Calls on_evict for each; counted as evicted_own
 * (the namespace's own request). Reservations do not apply (nothing is taken
 * for another namespace), nor priorities (every unpinned block goes).
 * *n_dropped = blocks dropped; the namespace's cached_blocks afterwards are
 * those kept. Cost: O(log leaves) per block dropped. Errors: KVS_EINVAL,
 * KVS_ENONS. */
int radix_ns_clear(radix_tree_t *t, uint32_t ns, size_t *n_dropped);

/* radix_ns_clear in steps: drops at most max blocks (in the same order) and
 * returns; the index is whole after each step, so other requests may run
 * between two. *n_dropped < max: nothing more can go now (the clear is
 * done); == max: call again. Blocks cached between two steps are dropped by
 * the later ones like the others. Cost: O(log leaves) per block dropped.
 * Errors: KVS_EINVAL, KVS_ENONS. */
int radix_ns_clear_step(radix_tree_t *t, uint32_t ns, size_t max, size_t *n_dropped);

/* Blocks cached, and of those pinned, over all namespaces. */
uint32_t radix_cached_blocks(const radix_tree_t *t);
uint32_t radix_pinned_blocks(const radix_tree_t *t);

/* Top prefixes of namespace ns (or RADIX_NS_ALL) ordered by `order`: fills
 * out[0 .. *n_out), *n_out <= max. A row is a node of the compressed tree: a
 * prefix ending where prompts diverge or stop. hits counts lookups that
 * matched through its end (a node split later keeps the count on both
 * parts); ties are broken by shorter prefix first. Cost is O(nodes log nodes)
 * with temporary memory; meant for operators, not the request path. Errors:
 * KVS_ENONS, KVS_EINVAL, KVS_ENOMEM. */
int radix_top(const radix_tree_t *t, uint32_t ns, radix_order_t order, radix_prefix_t *out,
              size_t max, size_t *n_out);

/* radix_top in steps, for a caller that must not stop for the whole walk
 * (kvshared's Tree: one step per loop turn, other requests between two).
 * radix_top_begin starts a walk of namespace ns (or RADIX_NS_ALL) for the
 * top `max` rows by `order`; the walk is the caller's (free it with
 * radix_top_end, done or not) and holds no pointer into the tree between
 * calls. Each radix_top_step does about `budget` units of work (a unit is
 * a table slot looked at; a node costs 8 plus 1 per 16 of its blocks; each
 * later phase 4 per node) and sets *done once the rows are ready; a step
 * may do less, never much more (it ends just past an empty table slot).
 * radix_top_rows then copies them.
 *
 * On an index that does not change between the steps the rows are exactly
 * radix_top's (same rows, same order, same tie-breaks). Other calls may
 * change the index between two steps (only radix_free may not: end the
 * walk first); then, like Redis's SCAN, each prefix is counted as it was
 * when the step that found it ran: a prefix created or dropped during the
 * walk may be missing or stale, subtree sums are over what was found (a
 * child found before a change is counted under the parent it had), a
 * prefix whose last block moved to another tier during the walk may show
 * twice (once per id), and the rows of a namespace deleted during the walk
 * are dropped (also when its id is reused). When the child table grows
 * during the walk (it only grows, up to what max_blocks needs) the sweep of
 * nodes begins again; while it grows (its nodes move to the new table a
 * chunk per insert) a step moves `budget` / 2 slots' worth instead of
 * sweeping, which is why it takes a non-const tree. Memory: 72 bytes per node of the walk's
 * namespace plus 4 per table slot (the table holds at most half its slots),
 * and max row indices (radix_top_walk_bytes says how much now); the rows
 * alone once done.
 * Errors: radix_top_begin: KVS_EINVAL (bad order, t or out NULL),
 * KVS_ENONS, KVS_ENOMEM; radix_top_step: KVS_EINVAL (budget 0, NULL
 * arguments), KVS_ENOMEM (the walk stays whole: step again, or end it);
 * radix_top_rows: KVS_EINVAL, KVS_EBUSY (not done yet). */
typedef struct radix_top_walk radix_top_walk_t;

/* A step's budget that kvshared uses: at most about 0.5-3 ms of work on a
 * large index here (kvshare-bench walk; docs/BENCHMARKS.md). */
#define RADIX_TOP_STEP 16384

int radix_top_begin(const radix_tree_t *t, uint32_t ns, radix_order_t order, size_t max,
                    radix_top_walk_t **out);
int radix_top_step(radix_tree_t *t, radix_top_walk_t *w, size_t budget, bool *done);
int radix_top_rows(const radix_top_walk_t *w, radix_prefix_t *out, size_t max, size_t *n_out);

/* Bytes the walk holds now (its entries, map, heap; the rows once done). */
size_t radix_top_walk_bytes(const radix_top_walk_t *w);

/* For tests and benches: entries found so far, sweeps begun again after the
 * table grew, and nodes not listed because every entry was taken (a table
 * whose nodes changed many times over during one sweep). Any may be NULL. */
void radix_top_walk_info(const radix_top_walk_t *w, size_t *entries, uint32_t *restarts,
                         uint64_t *missed);

/* Frees a walk. Accepts NULL. */
void radix_top_end(radix_top_walk_t *w);

/* Index memory in bytes (nodes, tables, token copies, the by-id arrays sized
 * by max_blocks, eviction queues), as requested from malloc; for stats and
 * benches. */
size_t radix_memory_bytes(const radix_tree_t *t);

/* Checks every invariant of the tree (parent/child links, counts, LRU lists,
 * refcounts, hashes, block id map). Returns 0 or KVS_EINTERNAL (KVS_ENOMEM if
 * it cannot allocate its scratch arrays). Linear in nodes, blocks and
 * max_blocks; for tests. */
int radix_check(const radix_tree_t *t);

/* The line of check.c whose invariant the last failing radix_check found
 * broken (0 if none failed yet), so a test can say which. Process-wide. */
int radix_check_line(void);

/* Drops the cached blocks of one prompt that nothing else needs. Walks the
 * prompt's cached prefix in namespace ns as radix_match does (full blocks;
 * a block being copied ends it), *n_matched = its blocks, then drops, from
 * its last block backward, each block that no one pins, that is not being
 * copied and that no other cached prefix continues (it has no cached block
 * after it); the first block that must stay ends the drops, so a shared
 * prefix other prompts extend stays, and with it everything before it. A
 * prompt that is itself the prefix of a longer cached one drops nothing.
 * Blocks of both tiers go: each through on_evict (a tier-2 id is free in the
 * tree again), counted as evicted_own of ns (tier-2 ones also as
 * tier2_dropped); *n_tier1 and *n_tier2 = blocks dropped from each tier.
 * Reservations and priorities do not apply: the caller names the blocks. No
 * tick, hits or lookup counters change. Cost: one walk step per matched
 * block, plus O(log leaves) per block dropped. Errors: KVS_EINVAL (t or an
 * out-parameter NULL, tokens NULL with n_tokens > 0), KVS_ENONS. */
int radix_evict_prompt(radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                       size_t *n_matched, size_t *n_tier1, size_t *n_tier2);

/* Drops block block_id and every cached block after it (the prefixes that
 * continue it: a block whose bytes were found corrupt takes them with it,
 * since they can no longer be matched), leaves first, each through
 * on_evict, counted as evicted_own (and tier2_dropped / tier3_dropped) of
 * its namespace. A block not cached: nothing to do, 0. Stops at a block
 * that is pinned or being copied: KVS_EBUSY, with what could go dropped.
 * *n_dropped = blocks dropped. Cost: a scan of the child table per node
 * below the block (meant for rare events, not the request path). Errors:
 * KVS_EINVAL, KVS_EBUSY, KVS_EINTERNAL. */
int radix_drop_from(radix_tree_t *t, uint32_t block_id, size_t *n_dropped);

#endif /* KVS_RADIX_H */
