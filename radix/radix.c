/* SPDX-License-Identifier: Apache-2.0 */
/*
 * radix.c: the prefix index.
 *
 * Structure
 * ---------
 *
 *   namespace "a" (seed Sa)          namespace "b" (seed Sb)
 *       root (len 0)                     root (len 0)
 *        /        \                         |
 *   node [b0 b1 b2]  node [c0]            node [d0 d1]
 *        /    \
 *   [e0 e1]  [f0 f1 f2 f3]      <- leaf nodes; their last block is a leaf block
 *
 * A node is one allocation: a header, then `cap` block records stored as
 * parallel arrays (hash, stamp, block id, refcount, token ids), so that a walk
 * streams through token ids and block ids and touches nothing else. The
 * records in use are [first, first + len). A node is a run of blocks that was
 * inserted or split off as one piece (path compression): only its last block
 * can have children, so inside a node a walk compares tokens and never hashes
 * (a block's chained hash follows from its verified prefix). Nodes are split
 * when a prompt diverges inside them, and a leaf node grows in place when a
 * prompt extends it; nodes are not merged back, so a node may have one child.
 *
 *   header | hash[cap] | stamp[cap] | id[cap] | ref[cap] | tokens[cap][bt]
 *
 * Children are not listed in their parent. One open-addressing table (linear
 * probing, backward-shift deletion) holds every non-root node, keyed by
 * (parent pointer, chained hash of the node's first block); a probe verifies
 * the parent and the block's tokens, so colliding hashes only lengthen the
 * probe and two prefixes with equal hashes are both stored and told apart.
 * Finding a child is O(1) whatever the fan-out.
 *
 *   table: [ h|node ][  --  ][ h|node ][ h|node ][  --  ] ...
 *
 *   by_node[id], by_pos[id]: block id -> (node, record index), O(1) pins.
 *
 * Recency and eviction
 * --------------------
 * Every lookup and insert takes the next tick of the tree; each block it
 * matches or handles gets that tick as its stamp (a walk through a whole node
 * writes the node's full_stamp once instead of every record's). Since these
 * walks always start at a root, a block's stamp is never older than any
 * descendant's.
 * A block is evictable when it is cached, unpinned and has no children (a
 * leaf block, always the last block of a childless node). Blocks that are
 * evictable leaves are kept per namespace in two structures:
 *
 *   lru list: leaves ordered by stamp, oldest at the head. A lookup or insert
 *             that touches a leaf moves it to the tail (its stamp is now the
 *             newest), O(1).
 *   heap:     a min-heap on stamp for leaves that become evictable with an
 *             older stamp (an unpin, or a parent whose last child went) and
 *             fit neither end of the list. Entries are dropped lazily: a node
 *             records the sequence number of its live entry.
 *
 * Both are ordered by each leaf's key (leaf_key, taken when it is queued;
 * see radix.h, Eviction order), then stamp. Under LRU the key is the stamp,
 * so a touched leaf always goes to the list's tail; under FREQ it is the
 * stamp plus a bonus per hit, so a touched leaf goes to the tail only when
 * its key is the largest, and to the heap otherwise.
 *
 * Eviction takes the first of the list head and the heap top, so it is exact
 * order on (key, stamp). Stamps of evictable leaves are all distinct (one
 * walk touches one path, which holds one leaf), so the order is total.
 *
 * Hits per block (FREQ) are counted the way stamps are written: a lookup
 * through a whole node adds one to the node's full_hits, a partial one adds
 * to each matched record's own count; a record's hits are the sum, and a new
 * record appended to a node starts its own count at -full_hits (mod 2^32).
 */
#include "radix.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Pins one block may hold. Every path that pins checks it (radix_pin
 * refuses, a pinning lookup stops before the block, a pinning duplicate
 * insert refuses), so a count never wraps to 0 under its holders. A test
 * build lowers it to reach it (tests/radix, like rax's allocator swap). */
#ifndef RADIX_MAX_PINS
#define RADIX_MAX_PINS UINT32_MAX
#endif

enum { WHERE_NONE = 0, WHERE_LIST = 1, WHERE_HEAP = 2 };

/* The two eviction queues: Q_T1 orders tier-1 candidates (demotion, or
 * eviction when there is no tier 2), Q_T2 tier-2 leaves (drops). */
enum { Q_T1 = 0, Q_T2 = 1 };

typedef struct radix_node radix_node_t;

/* A node's place in one queue. */
typedef struct radix_qlink {
    radix_node_t *prev;
    radix_node_t *next;
    uint64_t key;   /* eviction key of the candidate, set when queued */
    uint32_t seq;   /* sequence number of the live heap entry */
    uint32_t where; /* WHERE_*: where the candidate is queued */
} radix_qlink_t;

struct radix_node {
    radix_node_t *parent; /* NULL for a namespace root */
    radix_qlink_t q[2];   /* Q_T1, Q_T2 */
    uint64_t hits;        /* lookups that matched through this node's end */
    uint64_t full_stamp;  /* a tick at which every record here was touched */
    uint32_t first;       /* records in use: [first, first + len) */
    uint32_t len;
    uint32_t cap;
    uint32_t n_children;
    uint32_t depth; /* blocks before this node's first block */
    uint32_t ns;
    uint32_t full_hits;   /* lookups that matched every record here (mod 2^32) */
    uint32_t t1_len;      /* records [first, first + t1_len) are in tier 1, the rest in tier 2 */
    uint32_t t1_children; /* children whose first block is in tier 1 */
    uint64_t recs[];      /* the record arrays, see rec_hash() .. rec_tokens() */
};

typedef struct radix_heap_entry {
    uint64_t key;
    uint64_t stamp;
    uint32_t id;
    uint32_t seq;
} radix_heap_entry_t;

/* One eviction queue of a namespace: a list and a heap (see Recency). */
typedef struct radix_queue {
    radix_node_t *head;
    radix_node_t *tail;
    radix_heap_entry_t *heap;
    size_t heap_len;
    size_t heap_cap;
    size_t heap_live;
} radix_queue_t;

typedef struct radix_ns {
    char name[RADIX_NS_NAME_MAX + 1];
    uint64_t seed;
    radix_node_t *root;
    radix_ns_stats_t st;  /* counters, cached/pinned blocks, quota, reserve */
    uint32_t n_nodes;     /* non-root nodes */
    radix_queue_t q[2];   /* Q_T1, Q_T2 */
    uint8_t prio_default; /* priority of blocks without a live hint */
    uint8_t prio_cap;     /* the highest priority a hint may give */
} radix_ns_t;

/* A timed hint's end, queued by time (min-heap); stale entries (the hint
 * was replaced or its block evicted) are dropped when they come up. */
typedef struct radix_expiry {
    uint64_t until;
    uint32_t id;
} radix_expiry_t;

typedef struct radix_slot {
    uint64_t hash;
    radix_node_t *node; /* NULL: empty */
} radix_slot_t;

struct radix_tree {
    radix_config_t cfg;
    radix_hash_fn hash;
    size_t rec_bytes;       /* bytes of one record over all its arrays */
    radix_node_t **by_node; /* [max_blocks] */
    uint32_t *by_pos;       /* [max_blocks] */
    radix_slot_t *slots;
    size_t slot_mask;
    size_t slot_used;
    radix_ns_t **ns; /* [n_ns]: NULL where a deleted namespace was */
    uint32_t n_ns;   /* ids are below it; ns[n_ns - 1] is live */
    uint32_t n_live; /* namespaces */
    uint32_t ns_cap;
    uint64_t tick;
    uint32_t cached;
    uint32_t pinned;
    size_t node_bytes;
    uint32_t heap_seq;   /* tree-wide, so an entry never matches another namespace's node */
    radix_node_t *guard; /* a block that quota eviction must keep */
    uint32_t guard_pos;
    uint64_t evict_age64; /* 64 x moving average of evicted blocks' age, in ticks */
    /* Retention hints, per block id (RADIX_PRIO_NONE: none): the highest
     * hint without an end, the highest timed one and its end, and the band
     * the block is counted in (cached_by_band). */
    uint8_t *hint_base;
    uint8_t *hint_timed;
    uint64_t *hint_until;
    uint8_t *band_of;
    radix_expiry_t *exp;
    size_t exp_len, exp_cap;
    size_t exp_live;      /* blocks with a live timed hint (hint_timed set) */
    size_t exp_max;       /* the most exp_live may be (radix_hint_limit); 0: no limit */
    uint64_t reuse_gap64; /* 64 x moving average of first-reuse gaps, in ticks */
    /* Tier 2: ids [max_blocks, max_blocks + t2_blocks), owned by the tree. */
    uint32_t t2_blocks;
    uint32_t *t2_free; /* stack of free tier-2 ids */
    uint32_t t2_n_free;
    uint32_t t2_cached;   /* tier-2 blocks in the index */
    uint32_t t2_inflight; /* tier-2 ids held by promotions being copied */
    uint32_t *peer;       /* [max_blocks + t2_blocks]: a busy block's other id, else UINT32_MAX */
    uint32_t n_busy;      /* blocks being copied */
};

#define RADIX_PRIO_NONE 0xff

/* Marks ids in by_node while an insert checks them for repeats. */
static radix_node_t radix_mark;

static uint64_t radix_xxh3(const uint32_t *tokens, size_t n_tokens, uint64_t seed)
{
    return XXH3_64bits_withSeed(tokens, n_tokens * sizeof(uint32_t), seed);
}

/* Every allocation after the tree exists goes through these, so tests can
 * make any one of them fail (radix_config_t.fail_alloc). */
static bool alloc_fails(const radix_tree_t *t)
{
    return t->cfg.fail_alloc && t->cfg.fail_alloc(t->cfg.fail_ctx);
}

static void *t_malloc(const radix_tree_t *t, size_t size)
{
    return alloc_fails(t) ? NULL : malloc(size);
}

static void *t_calloc(const radix_tree_t *t, size_t n, size_t size)
{
    return alloc_fails(t) ? NULL : calloc(n, size);
}

static void *t_realloc(const radix_tree_t *t, void *p, size_t size)
{
    return alloc_fails(t) ? NULL : realloc(p, size);
}

/* ---- records and nodes ------------------------------------------------ */

/* A node's records are stored as parallel arrays after its header, so that a
 * walk streams through token ids (64 B a block) and block ids only:
 *   hash[cap] stamp[cap] | id[cap] ref[cap] hits[cap] | tokens[cap][bt]  */
static inline uint64_t *rec_hash(const radix_node_t *n, uint32_t i)
{
    return (uint64_t *)n->recs + i;
}

static inline uint64_t *rec_stampp(const radix_node_t *n, uint32_t i)
{
    return (uint64_t *)n->recs + n->cap + i;
}

static inline uint32_t *rec_id(const radix_node_t *n, uint32_t i)
{
    return (uint32_t *)((uint64_t *)n->recs + 2 * (size_t)n->cap) + i;
}

static inline uint32_t *rec_ref(const radix_node_t *n, uint32_t i)
{
    return rec_id(n, 0) + n->cap + i;
}

/* A block's hits are rec_hits + the node's full_hits (both mod 2^32): a walk
 * through a whole node counts once on the node, as it stamps once. */
static inline uint32_t *rec_hitsp(const radix_node_t *n, uint32_t i)
{
    return rec_id(n, 0) + 2 * (size_t)n->cap + i;
}

static inline uint32_t rec_hits(const radix_node_t *n, uint32_t i)
{
    return *rec_hitsp(n, i) + n->full_hits;
}

static inline uint32_t *rec_tokens(const radix_tree_t *t, const radix_node_t *n, uint32_t i)
{
    return rec_id(n, 0) + 3 * (size_t)n->cap + (size_t)i * t->cfg.block_tokens;
}

/* Copies records [from, from + count) of a to b at index `to`. */
static void recs_copy(const radix_tree_t *t, radix_node_t *b, uint32_t to, const radix_node_t *a,
                      uint32_t from, uint32_t count)
{
    memcpy(rec_hash(b, to), rec_hash(a, from), count * sizeof(uint64_t));
    memcpy(rec_stampp(b, to), rec_stampp(a, from), count * sizeof(uint64_t));
    memcpy(rec_id(b, to), rec_id(a, from), count * sizeof(uint32_t));
    memcpy(rec_ref(b, to), rec_ref(a, from), count * sizeof(uint32_t));
    /* b's full_hits is a's (split, resize) */
    memcpy(rec_hitsp(b, to), rec_hitsp(a, from), count * sizeof(uint32_t));
    memcpy(rec_tokens(t, b, to), rec_tokens(t, a, from),
           (size_t)count * t->cfg.block_tokens * sizeof(uint32_t));
}

static inline uint32_t last_pos(const radix_node_t *n)
{
    return n->first + n->len - 1;
}

static inline bool is_root(const radix_node_t *n)
{
    return n->parent == NULL;
}

static inline bool tokens_eq(const uint32_t *a, const uint32_t *b, uint32_t n)
{
    /* Branch-free so that it vectorizes; the common block size gets a
     * fixed-length copy the compiler unrolls. */
    if (n == 16) {
        uint64_t x[8], y[8], diff = 0;
        memcpy(x, a, sizeof(x));
        memcpy(y, b, sizeof(y));
        for (int k = 0; k < 8; k++)
            diff |= x[k] ^ y[k];
        return diff == 0;
    }
    uint32_t diff = 0;
    for (uint32_t k = 0; k < n; k++)
        diff |= a[k] ^ b[k];
    return diff == 0;
}

static uint64_t end_hash(const radix_tree_t *t, const radix_node_t *n)
{
    if (n->len == 0)
        return t->ns[n->ns]->seed;
    return *rec_hash(n, last_pos(n));
}

static radix_node_t *node_new(radix_tree_t *t, uint32_t cap)
{
    size_t size = sizeof(radix_node_t) + (size_t)cap * t->rec_bytes;
    radix_node_t *n = t_malloc(t, size);
    if (!n)
        return NULL;
    memset(n, 0, sizeof(*n));
    n->cap = cap;
    t->node_bytes += size;
    return n;
}

static void node_free(radix_tree_t *t, radix_node_t *n)
{
    t->node_bytes -= sizeof(radix_node_t) + (size_t)n->cap * t->rec_bytes;
    free(n);
}

/* ---- child table -------------------------------------------------------- */

static inline size_t slot_home(const radix_tree_t *t, uint64_t h, const radix_node_t *parent)
{
    /* The parent takes part so that equal hashes under different parents
     * (forced or crafted collisions) spread over the table. */
    uint64_t x = h ^ ((uint64_t)(uintptr_t)parent * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (size_t)x & t->slot_mask;
}

static radix_node_t *child_find(const radix_tree_t *t, const radix_node_t *parent, uint64_t h,
                                const uint32_t *block)
{
    size_t i = slot_home(t, h, parent);
    for (;;) {
        const radix_slot_t *s = &t->slots[i];
        if (!s->node)
            return NULL;
        if (s->hash == h && s->node->parent == parent &&
            tokens_eq(rec_tokens(t, s->node, s->node->first), block, t->cfg.block_tokens))
            return s->node;
        i = (i + 1) & t->slot_mask;
    }
}

static void slot_put(radix_tree_t *t, radix_node_t *n)
{
    uint64_t h = *rec_hash(n, n->first);
    size_t i = slot_home(t, h, n->parent);
    while (t->slots[i].node)
        i = (i + 1) & t->slot_mask;
    t->slots[i].hash = h;
    t->slots[i].node = n;
    t->slot_used++;
}

static size_t slot_of(const radix_tree_t *t, const radix_node_t *n)
{
    size_t i = slot_home(t, *rec_hash(n, n->first), n->parent);
    while (t->slots[i].node != n)
        i = (i + 1) & t->slot_mask;
    return i;
}

static void slot_remove(radix_tree_t *t, radix_node_t *n)
{
    size_t i = slot_of(t, n);
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->slot_mask;
        radix_slot_t *s = &t->slots[j];
        if (!s->node)
            break;
        size_t home = slot_home(t, s->hash, s->node->parent);
        /* Move s back into the hole unless its home lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            t->slots[i] = *s;
            i = j;
        }
    }
    t->slots[i].node = NULL;
    t->slots[i].hash = 0;
    t->slot_used--;
}

/* Makes room for `extra` more nodes, keeping the load at most 1/2. */
static int slot_reserve(radix_tree_t *t, size_t extra)
{
    size_t cap = t->slot_mask + 1;
    if ((t->slot_used + extra) * 2 <= cap)
        return 0;
    size_t ncap = cap * 2;
    while ((t->slot_used + extra) * 2 > ncap)
        ncap *= 2;
    radix_slot_t *old = t->slots;
    radix_slot_t *slots = t_calloc(t, ncap, sizeof(*slots));
    if (!slots)
        return KVS_ENOMEM;
    t->slots = slots;
    t->slot_mask = ncap - 1;
    t->slot_used = 0;
    for (size_t i = 0; i < cap; i++)
        if (old[i].node)
            slot_put(t, old[i].node);
    free(old);
    return 0;
}

/* ---- eviction queues ----------------------------------------------------- */

/* A record's stamp: a walk through a whole node stamps the node once
 * (full_stamp) instead of writing every record, so the hot lookup path reads
 * records without dirtying them. */
static inline uint64_t rec_stamp(const radix_node_t *n, uint32_t i)
{
    uint64_t s = *rec_stampp(n, i);
    return s > n->full_stamp ? s : n->full_stamp;
}

static inline bool in_tier2(const radix_tree_t *t, uint32_t id)
{
    return id >= t->cfg.max_blocks;
}

static inline bool is_busy(const radix_tree_t *t, uint32_t id)
{
    return t->n_busy > 0 && t->peer[id] != UINT32_MAX;
}

/* Whether a caller's id may not become a block: it is cached, or it is the
 * tier-1 id a demotion is still copying from (the caller gets it back at
 * radix_copy_done). */
static inline bool id_taken(const radix_tree_t *t, uint32_t id)
{
    return t->by_node[id] || (t->peer && t->peer[id] != UINT32_MAX);
}

/* The record a node offers to queue q: its last tier-1 block (Q_T1, a
 * demotion or, single-tier, eviction candidate) or its last block when that is
 * in tier 2 (Q_T2, a drop candidate). Only meaningful when has_cand(). */
static inline uint32_t cand_pos(const radix_node_t *n, int q)
{
    return q == Q_T1 ? n->first + n->t1_len - 1 : last_pos(n);
}

static inline bool has_cand(const radix_node_t *n, int q)
{
    return n->len > 0 && (q == Q_T1 ? n->t1_len > 0 : n->t1_len < n->len);
}

static inline uint64_t cand_stamp(const radix_node_t *n, int q)
{
    return rec_stamp(n, cand_pos(n, q));
}

/* Bonus per hit under RADIX_EVICT_FREQ, in ticks: a share of the eviction
 * age while that age is below the horizon (horizon_pct % of the mean
 * first-reuse gap), else none. Past about three reuse gaps a block that was
 * hit is no likelier to come back than one that was not (measured on the
 * Mooncake trace), so a large pool gains nothing from the bonus and loses
 * recent blocks to it; there the order becomes LRU's. */
static uint64_t freq_step(const radix_tree_t *t)
{
    if (t->cfg.freq_bonus_ticks > 0)
        return t->cfg.freq_bonus_ticks;
    uint64_t age = t->evict_age64 / 64;
    uint64_t step = age * t->cfg.freq_bonus_pct / 100;
    if (t->cfg.freq_horizon_pct == RADIX_FREQ_NO_HORIZON)
        return step;
    uint64_t horizon = t->reuse_gap64 / 64 * t->cfg.freq_horizon_pct / 100;
    return age < horizon ? step : 0;
}

/* A cached block's retention priority: the highest live hint, else its
 * namespace's default. */
static inline uint32_t block_prio(const radix_tree_t *t, uint32_t id, uint32_t ns)
{
    uint32_t b = t->hint_base[id], m = t->hint_timed[id];
    if (b == RADIX_PRIO_NONE)
        b = m;
    else if (m != RADIX_PRIO_NONE && m > b)
        b = m;
    return b == RADIX_PRIO_NONE ? t->ns[ns]->prio_default : b;
}

static inline uint32_t prio_band(uint32_t prio)
{
    return prio >= 75 ? 3 : prio / 25;
}

/* The key a candidate is queued with: its retention priority above
 * everything (RADIX_PRIO_SHIFT), then its last use, plus under
 * RADIX_EVICT_FREQ a bonus for each hit up to freq_max_hits. Fixed while it
 * stays queued. */
#define RADIX_PRIO_SHIFT 56
static uint64_t queue_key(const radix_tree_t *t, const radix_node_t *n, int q)
{
    uint32_t pos = cand_pos(n, q);
    uint32_t id = *rec_id(n, pos);
    uint64_t key = rec_stamp(n, pos) + ((uint64_t)block_prio(t, id, n->ns) << RADIX_PRIO_SHIFT);
    if (t->cfg.policy == RADIX_EVICT_FREQ) {
        uint32_t hits = rec_hits(n, pos);
        if (hits > t->cfg.freq_max_hits)
            hits = t->cfg.freq_max_hits;
        key += hits * freq_step(t);
    }
    return key;
}

/* Order of two candidates queued in q: key, then last use (distinct among
 * the candidates of one queue, so the order is total). */
static inline bool goes_before(const radix_node_t *a, const radix_node_t *b, int q)
{
    if (a->q[q].key != b->q[q].key)
        return a->q[q].key < b->q[q].key;
    return cand_stamp(a, q) < cand_stamp(b, q);
}

static inline bool entry_before(const radix_heap_entry_t *a, const radix_heap_entry_t *b)
{
    return a->key != b->key ? a->key < b->key : a->stamp < b->stamp;
}

/* Whether n's candidate for queue q may go: unpinned, not being copied, and
 * with no tier-1 block below it (Q_T1: the tier-1 blocks stay closed towards
 * the root) or nothing below it (Q_T2). Single-tier, Q_T1 is "an unpinned
 * leaf", as always. */
static bool queueable(const radix_tree_t *t, const radix_node_t *n, int q)
{
    if (is_root(n) || !has_cand(n, q))
        return false;
    uint32_t pos = cand_pos(n, q);
    if (q == Q_T1) {
        if (n->t1_len == n->len && n->t1_children > 0)
            return false;
        if (n == t->guard && pos == t->guard_pos)
            return false;
    } else if (n->n_children > 0) {
        return false;
    }
    return *rec_ref(n, pos) == 0 && !is_busy(t, *rec_id(n, pos));
}

static void list_unlink(radix_queue_t *Q, radix_node_t *n, int q)
{
    radix_qlink_t *l = &n->q[q];
    if (l->prev)
        l->prev->q[q].next = l->next;
    else
        Q->head = l->next;
    if (l->next)
        l->next->q[q].prev = l->prev;
    else
        Q->tail = l->prev;
    l->prev = l->next = NULL;
}

static void list_append(radix_queue_t *Q, radix_node_t *n, int q)
{
    n->q[q].next = NULL;
    n->q[q].prev = Q->tail;
    if (Q->tail)
        Q->tail->q[q].next = n;
    else
        Q->head = n;
    Q->tail = n;
    n->q[q].where = WHERE_LIST;
}

static void list_prepend(radix_queue_t *Q, radix_node_t *n, int q)
{
    n->q[q].prev = NULL;
    n->q[q].next = Q->head;
    if (Q->head)
        Q->head->q[q].prev = n;
    else
        Q->tail = n;
    Q->head = n;
    n->q[q].where = WHERE_LIST;
}

/* The node an entry of queue q stands for, or NULL when the entry is stale. */
static radix_node_t *heap_entry_node(const radix_tree_t *t, const radix_heap_entry_t *e, int q)
{
    radix_node_t *n = t->by_node[e->id];
    if (!n || n == &radix_mark || n->q[q].where != WHERE_HEAP || n->q[q].seq != e->seq ||
        !has_cand(n, q) || t->by_pos[e->id] != cand_pos(n, q))
        return NULL;
    return cand_stamp(n, q) == e->stamp && n->q[q].key == e->key ? n : NULL;
}

static void heap_sift_down(radix_queue_t *Q, size_t i)
{
    radix_heap_entry_t *h = Q->heap;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < Q->heap_len && entry_before(&h[l], &h[m]))
            m = l;
        if (l + 1 < Q->heap_len && entry_before(&h[l + 1], &h[m]))
            m = l + 1;
        if (m == i)
            return;
        radix_heap_entry_t tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
}

static void heap_sift_up(radix_queue_t *Q, size_t i)
{
    radix_heap_entry_t *h = Q->heap;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!entry_before(&h[i], &h[p]))
            return;
        radix_heap_entry_t tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
}

static void heap_pop(radix_queue_t *Q)
{
    Q->heap[0] = Q->heap[--Q->heap_len];
    heap_sift_down(Q, 0);
}

/* Drops stale entries and rebuilds the heap: linear, and paid for by the
 * pushes that made the entries stale. */
static void heap_compact(const radix_tree_t *t, radix_queue_t *Q, int q)
{
    size_t k = 0;
    for (size_t i = 0; i < Q->heap_len; i++)
        if (heap_entry_node(t, &Q->heap[i], q))
            Q->heap[k++] = Q->heap[i];
    Q->heap_len = k;
    for (size_t i = k / 2; i-- > 0;)
        heap_sift_down(Q, i);
}

/* The heap never needs more than 2 x nodes + 34 entries (compaction keeps
 * stale entries below live + 33), so reserving that when nodes are created
 * means pushes, which happen in unpin, eviction and copies, never allocate.
 * The tier-2 queue exists only when there is a tier 2. */
static int heap_reserve(const radix_tree_t *t, radix_ns_t *ns, size_t nodes)
{
    size_t need = 2 * nodes + 34;
    for (int q = 0; q < (t->t2_blocks > 0 ? 2 : 1); q++) {
        radix_queue_t *Q = &ns->q[q];
        if (Q->heap_cap >= need)
            continue;
        size_t ncap = Q->heap_cap ? Q->heap_cap : 64;
        while (ncap < need)
            ncap *= 2;
        radix_heap_entry_t *h = t_realloc(t, Q->heap, ncap * sizeof(*h));
        if (!h)
            return KVS_ENOMEM;
        Q->heap = h;
        Q->heap_cap = ncap;
    }
    return 0;
}

static void heap_push(radix_tree_t *t, radix_queue_t *Q, radix_node_t *n, int q)
{
    if (Q->heap_len > 2 * Q->heap_live + 32 || Q->heap_len == Q->heap_cap)
        heap_compact(t, Q, q);
    uint32_t pos = cand_pos(n, q);
    n->q[q].seq = ++t->heap_seq;
    n->q[q].where = WHERE_HEAP;
    Q->heap_live++;
    Q->heap[Q->heap_len].key = n->q[q].key;
    Q->heap[Q->heap_len].stamp = rec_stamp(n, pos);
    Q->heap[Q->heap_len].id = *rec_id(n, pos);
    Q->heap[Q->heap_len].seq = n->q[q].seq;
    Q->heap_len++;
    heap_sift_up(Q, Q->heap_len - 1);
}

/* Takes n out of queue q (it was pinned, got a child, ...). */
static void unqueue(radix_tree_t *t, radix_node_t *n, int q)
{
    radix_queue_t *Q = &t->ns[n->ns]->q[q];
    if (n->q[q].where == WHERE_LIST)
        list_unlink(Q, n, q);
    else if (n->q[q].where == WHERE_HEAP)
        Q->heap_live--;
    n->q[q].where = WHERE_NONE;
}

static void make_unevictable(radix_tree_t *t, radix_node_t *n)
{
    unqueue(t, n, Q_T1);
    unqueue(t, n, Q_T2);
}

/* Queues a candidate that is in no queue, with its key as of now, at its
 * place in q's order: an end of the list when it fits there (always the tail
 * for a block just used under LRU), else the heap. */
static void expose(radix_tree_t *t, radix_node_t *n, int q)
{
    radix_queue_t *Q = &t->ns[n->ns]->q[q];
    n->q[q].key = queue_key(t, n, q);
    if (!Q->tail || goes_before(Q->tail, n, q))
        list_append(Q, n, q);
    else if (goes_before(n, Q->head, q))
        list_prepend(Q, n, q);
    else
        heap_push(t, Q, n, q);
}

/* Puts n where it belongs in queue q after its blocks, tiers or children
 * changed. touched: its candidate was just stamped with the newest tick. */
static void refresh_q(radix_tree_t *t, radix_node_t *n, int q, bool touched)
{
    if (!queueable(t, n, q)) {
        unqueue(t, n, q);
    } else if (touched) {
        /* Under LRU with one priority the newest goes to the tail; expose
         * finds that with one comparison. */
        unqueue(t, n, q);
        expose(t, n, q);
    } else if (n->q[q].where == WHERE_NONE) {
        expose(t, n, q);
    }
}

/* Both queues; touched: every block of the node was just stamped (a walk
 * went through its end), so both its candidates were. */
static void refresh(radix_tree_t *t, radix_node_t *n, bool touched)
{
    if (is_root(n))
        return;
    refresh_q(t, n, Q_T1, touched);
    if (t->t2_blocks > 0)
        refresh_q(t, n, Q_T2, touched);
}

/* After a walk stamped n's blocks up to record pos: its tier-1 candidate was
 * touched if it lies there, its tier-2 candidate if pos is its last block. */
static void refresh_at(radix_tree_t *t, radix_node_t *n, uint32_t pos)
{
    if (is_root(n))
        return;
    refresh_q(t, n, Q_T1, has_cand(n, Q_T1) && cand_pos(n, Q_T1) <= pos);
    if (t->t2_blocks > 0)
        refresh_q(t, n, Q_T2, pos == last_pos(n));
}

/* The first candidate of the namespace's queue q, or NULL. */
static radix_node_t *candidate(radix_tree_t *t, radix_ns_t *ns, int q)
{
    radix_queue_t *Q = &ns->q[q];
    radix_node_t *h = NULL;
    while (Q->heap_len > 0 && !(h = heap_entry_node(t, &Q->heap[0], q)))
        heap_pop(Q);
    radix_node_t *l = Q->head;
    if (!l)
        return h;
    if (!h)
        return l;
    return goes_before(h, l, q) ? h : l;
}

/* Why a block is dropped, for the namespace's counters. */
typedef enum evict_cause { EVICT_OWN, EVICT_OTHERS, EVICT_QUOTA } evict_cause_t;

/* Drops n's last block, a candidate of queue q with nothing below it (a
 * tier-1 leaf, or a tier-2 leaf), and hands its id back: a tier-1 id to the
 * owner through on_evict, a tier-2 id to the tree's free tier-2 slots. */
static void evict_leaf(radix_tree_t *t, radix_node_t *n, int q, evict_cause_t cause)
{
    radix_ns_t *ns = t->ns[n->ns];
    make_unevictable(t, n);
    /* The moving average (weight 1/64) sets the FREQ bonus; updated before
     * the parent is queued, so the parent's key already sees it. */
    t->evict_age64 += (t->tick - rec_stamp(n, last_pos(n))) - t->evict_age64 / 64;
    uint32_t id = *rec_id(n, last_pos(n));
    if (t->cfg.on_evict_tokens)
        t->cfg.on_evict_tokens(t->cfg.evict_ctx, id, n->ns, rec_tokens(t, n, last_pos(n)));
    t->by_node[id] = NULL;
    ns->st.cached_by_band[t->band_of[id]]--;
    ns->st.evicted_by_band[t->band_of[id]]++;
    if (t->hint_timed[id] != RADIX_PRIO_NONE)
        t->exp_live--;
    t->hint_base[id] = t->hint_timed[id] = RADIX_PRIO_NONE;
    ns->st.evicted_blocks++;
    if (cause == EVICT_OWN)
        ns->st.evicted_own++;
    else if (cause == EVICT_OTHERS)
        ns->st.evicted_others++;
    else
        ns->st.evicted_quota++;
    bool tier1 = q == Q_T1;
    if (tier1) {
        ns->st.cached_blocks--;
        t->cached--;
        n->t1_len--;
    } else {
        ns->st.tier2_blocks--;
        ns->st.tier2_dropped++;
        t->t2_cached--;
        t->t2_free[t->t2_n_free++] = id;
    }
    if (n->len == 1) {
        radix_node_t *parent = n->parent;
        slot_remove(t, n);
        ns->n_nodes--;
        node_free(t, n);
        parent->n_children--;
        if (tier1)
            parent->t1_children--;
        refresh(t, parent, false);
    } else {
        n->len--;
        refresh(t, n, false);
    }
    if (t->cfg.on_evict)
        t->cfg.on_evict(t->cfg.evict_ctx, id);
}

static void prio_changed(radix_tree_t *t, uint32_t id, uint32_t before);
static int expiry_push(radix_tree_t *t, uint64_t until, uint32_t id);

/* Retention hints and band go with a block to its new id (the band counts
 * both tiers). A timed hint's end is queued again under the new id; when
 * that cannot be (no memory) the timed hint ends now. */
static void move_hints(radix_tree_t *t, uint32_t old_id, uint32_t new_id)
{
    radix_node_t *n = t->by_node[new_id];
    t->hint_base[new_id] = t->hint_base[old_id];
    t->hint_timed[new_id] = t->hint_timed[old_id];
    t->hint_until[new_id] = t->hint_until[old_id];
    t->band_of[new_id] = t->band_of[old_id];
    t->hint_base[old_id] = t->hint_timed[old_id] = RADIX_PRIO_NONE;
    t->hint_until[old_id] = 0;
    if (t->hint_timed[new_id] != RADIX_PRIO_NONE &&
        expiry_push(t, t->hint_until[new_id], new_id) != 0) {
        uint32_t before = block_prio(t, new_id, n->ns);
        t->hint_timed[new_id] = RADIX_PRIO_NONE;
        t->hint_until[new_id] = 0;
        t->exp_live--;
        prio_changed(t, new_id, before);
    }
}

/* Moves the block at record pos of n (the first tier-2 block of n, or its
 * last tier-1 block) to the other tier under new_id and returns its old id.
 * busy: it is being copied, with the old id as its peer, until
 * radix_copy_done. The caller checked that tier 1 stays closed towards the
 * root (a block in tier 1 only below blocks in tier 1). */
static uint32_t retier(radix_tree_t *t, radix_node_t *n, uint32_t pos, uint32_t new_id, bool busy)
{
    radix_ns_t *ns = t->ns[n->ns];
    uint32_t old_id = *rec_id(n, pos);
    bool up = in_tier2(t, old_id);
    make_unevictable(t, n);
    t->by_node[old_id] = NULL;
    t->by_node[new_id] = n;
    t->by_pos[new_id] = pos;
    *rec_id(n, pos) = new_id;
    move_hints(t, old_id, new_id);
    if (busy) {
        t->peer[new_id] = old_id;
        if (!up) /* a demotion: its tier-1 id is not the caller's until copy done */
            t->peer[old_id] = new_id;
        t->n_busy++;
    }
    if (up) {
        n->t1_len++;
        ns->st.cached_blocks++;
        ns->st.tier2_blocks--;
        t->cached++;
        t->t2_cached--;
    } else {
        n->t1_len--;
        ns->st.cached_blocks--;
        ns->st.tier2_blocks++;
        t->cached--;
        t->t2_cached++;
    }
    if (pos == n->first) {
        if (up)
            n->parent->t1_children++;
        else
            n->parent->t1_children--;
        refresh(t, n->parent, false);
    }
    refresh(t, n, false);
    return old_id;
}

/* ---- tree and namespaces --------------------------------------------------- */

/* Whether id names a namespace (not a deleted one's free slot). */
static inline bool ns_live(const radix_tree_t *t, uint32_t id)
{
    return id < t->n_ns && t->ns[id] != NULL;
}

int radix_new(const radix_config_t *cfg, radix_tree_t **out)
{
    int rc = KVS_EINVAL;
    radix_tree_t *t = NULL;
    if (!cfg || !out || cfg->block_tokens == 0 || cfg->max_blocks == 0 ||
        cfg->block_tokens > 65536 || cfg->tier2_blocks > UINT32_MAX - cfg->max_blocks ||
        (cfg->policy != RADIX_EVICT_LRU && cfg->policy != RADIX_EVICT_FREQ) ||
        cfg->freq_max_hits > 255 || cfg->freq_bonus_pct > 10000 ||
        cfg->freq_bonus_ticks > UINT32_MAX ||
        (cfg->freq_horizon_pct > 10000 && cfg->freq_horizon_pct != RADIX_FREQ_NO_HORIZON))
        goto fail;
    rc = KVS_ENOMEM;
    t = calloc(1, sizeof(*t));
    if (!t)
        goto fail;
    t->cfg = *cfg;
    t->hash = cfg->hash ? cfg->hash : radix_xxh3;
    if (t->cfg.freq_max_hits == 0)
        t->cfg.freq_max_hits = RADIX_FREQ_MAX_HITS;
    if (t->cfg.freq_bonus_pct == 0)
        t->cfg.freq_bonus_pct = RADIX_FREQ_BONUS_PCT;
    if (t->cfg.freq_horizon_pct == 0)
        t->cfg.freq_horizon_pct = RADIX_FREQ_HORIZON_PCT;
    t->rec_bytes =
        2 * sizeof(uint64_t) + 3 * sizeof(uint32_t) + (size_t)cfg->block_tokens * sizeof(uint32_t);
    size_t ids = (size_t)cfg->max_blocks + cfg->tier2_blocks;
    t->t2_blocks = cfg->tier2_blocks;
    t->by_node = t_calloc(t, ids, sizeof(*t->by_node));
    t->by_pos = t_calloc(t, ids, sizeof(*t->by_pos));
    t->slots = t_calloc(t, 64, sizeof(*t->slots));
    t->hint_base = t_malloc(t, ids);
    t->hint_timed = t_malloc(t, ids);
    t->hint_until = t_calloc(t, ids, sizeof(*t->hint_until));
    t->band_of = t_calloc(t, ids, 1);
    if (!t->by_node || !t->by_pos || !t->slots || !t->hint_base || !t->hint_timed ||
        !t->hint_until || !t->band_of)
        goto fail;
    memset(t->hint_base, RADIX_PRIO_NONE, ids);
    memset(t->hint_timed, RADIX_PRIO_NONE, ids);
    if (t->t2_blocks > 0) {
        t->peer = t_malloc(t, ids * sizeof(*t->peer));
        t->t2_free = t_malloc(t, (size_t)t->t2_blocks * sizeof(*t->t2_free));
        if (!t->peer || !t->t2_free)
            goto fail;
        for (size_t i = 0; i < ids; i++)
            t->peer[i] = UINT32_MAX;
        /* popped in increasing order */
        for (uint32_t i = 0; i < t->t2_blocks; i++)
            t->t2_free[i] = cfg->max_blocks + t->t2_blocks - 1 - i;
        t->t2_n_free = t->t2_blocks;
    }
    t->slot_mask = 63;
    *out = t;
    return 0;
fail:
    radix_free(t);
    return rc;
}

void radix_free(radix_tree_t *t)
{
    if (!t)
        return;
    if (t->slots)
        for (size_t i = 0; i <= t->slot_mask; i++)
            if (t->slots[i].node)
                free(t->slots[i].node);
    for (uint32_t i = 0; i < t->n_ns; i++) {
        if (!t->ns[i])
            continue;
        free(t->ns[i]->root);
        free(t->ns[i]->q[Q_T1].heap);
        free(t->ns[i]->q[Q_T2].heap);
        free(t->ns[i]);
    }
    free(t->ns);
    free(t->slots);
    free(t->by_node);
    free(t->by_pos);
    free(t->hint_base);
    free(t->hint_timed);
    free(t->hint_until);
    free(t->band_of);
    free(t->exp);
    free(t->peer);
    free(t->t2_free);
    free(t);
}

int radix_ns_create(radix_tree_t *t, const char *name, uint64_t seed, uint32_t quota,
                    uint32_t reserve, uint32_t *ns_out)
{
    if (!t || !name || !ns_out)
        return KVS_EINVAL;
    size_t len = strnlen(name, RADIX_NS_NAME_MAX + 1);
    if (len == 0 || len > RADIX_NS_NAME_MAX)
        return KVS_EINVAL;
    uint32_t id;
    if (radix_ns_find(t, name, &id) == 0)
        return KVS_EEXIST;
    /* The lowest free id: a deleted namespace's, else a new one. */
    for (id = 0; id < t->n_ns && t->ns[id]; id++)
        ;
    if (id == RADIX_NS_ANY - 1)
        return KVS_ENOMEM;
    if (id == t->ns_cap) {
        uint32_t ncap = t->ns_cap ? t->ns_cap * 2 : 4;
        radix_ns_t **a = t_realloc(t, t->ns, ncap * sizeof(*a));
        if (!a)
            return KVS_ENOMEM;
        t->ns = a;
        t->ns_cap = ncap;
    }
    radix_ns_t *ns = t_calloc(t, 1, sizeof(*ns));
    radix_node_t *root = node_new(t, 0);
    if (!ns || !root) {
        free(ns);
        if (root)
            node_free(t, root);
        return KVS_ENOMEM;
    }
    memcpy(ns->name, name, len);
    ns->seed = seed;
    ns->st.quota = quota;
    ns->st.reserve = reserve;
    ns->prio_default = RADIX_PRIO_DEFAULT;
    ns->prio_cap = RADIX_PRIO_MAX;
    ns->st.prio_default = RADIX_PRIO_DEFAULT;
    ns->st.prio_cap = RADIX_PRIO_MAX;
    root->ns = id;
    ns->root = root;
    t->ns[id] = ns;
    if (id == t->n_ns)
        t->n_ns++;
    t->n_live++;
    *ns_out = id;
    return 0;
}

int radix_ns_delete(radix_tree_t *t, uint32_t ns_id)
{
    if (!t)
        return KVS_EINVAL;
    if (!ns_live(t, ns_id))
        return KVS_ENONS;
    radix_ns_t *ns = t->ns[ns_id];
    if (ns->st.cached_blocks > 0 || ns->st.tier2_blocks > 0)
        return KVS_EBUSY;
    /* No cached block in either tier: the root has no child, no node is
     * queued (the heaps hold stale entries at most), and no block id or hint
     * names it. */
    node_free(t, ns->root);
    free(ns->q[Q_T1].heap);
    free(ns->q[Q_T2].heap);
    free(ns);
    t->ns[ns_id] = NULL;
    t->n_live--;
    while (t->n_ns > 0 && !t->ns[t->n_ns - 1])
        t->n_ns--;
    return 0;
}

int radix_ns_find(const radix_tree_t *t, const char *name, uint32_t *ns_out)
{
    if (!t || !name || !ns_out)
        return KVS_EINVAL;
    for (uint32_t i = 0; i < t->n_ns; i++) {
        if (t->ns[i] && strcmp(t->ns[i]->name, name) == 0) {
            *ns_out = i;
            return 0;
        }
    }
    return KVS_ENONS;
}

uint32_t radix_ns_count(const radix_tree_t *t)
{
    return t ? t->n_live : 0;
}

uint32_t radix_ns_id_end(const radix_tree_t *t)
{
    return t ? t->n_ns : 0;
}

const char *radix_ns_name(const radix_tree_t *t, uint32_t ns)
{
    if (!t || !ns_live(t, ns))
        return NULL;
    return t->ns[ns]->name;
}

int radix_ns_set_limits(radix_tree_t *t, uint32_t ns, uint32_t quota, uint32_t reserve)
{
    if (!t)
        return KVS_EINVAL;
    if (!ns_live(t, ns))
        return KVS_ENONS;
    t->ns[ns]->st.quota = quota;
    t->ns[ns]->st.reserve = reserve;
    return 0;
}

int radix_ns_stats(const radix_tree_t *t, uint32_t ns, radix_ns_stats_t *out)
{
    if (!t || !out)
        return KVS_EINVAL;
    if (!ns_live(t, ns))
        return KVS_ENONS;
    *out = t->ns[ns]->st;
    return 0;
}

/* ---- the walk -------------------------------------------------------------- */

/* Position after the last matched block: a node and the record index of that
 * block (pos is meaningless at a root, where nothing matched yet). */
typedef struct radix_cursor {
    radix_node_t *node;
    uint32_t pos;
} radix_cursor_t;

/* The one walk on which lookup and insert are built: matches the next block
 * of a prompt below the cursor and advances it. Inside a node a match is a
 * token comparison; at a node's end it is one hash and one table probe. */
static inline bool walk_next(const radix_tree_t *t, radix_cursor_t *c, const uint32_t *block)
{
    radix_node_t *n = c->node;
    uint32_t bt = t->cfg.block_tokens;
    if (n->len > 0 && c->pos < last_pos(n)) {
        if (!tokens_eq(rec_tokens(t, n, c->pos + 1), block, bt))
            return false;
        c->pos++;
        return true;
    }
    if (n->n_children == 0)
        return false;
    radix_node_t *child = child_find(t, n, t->hash(block, bt, end_hash(t, n)), block);
    if (!child)
        return false;
    c->node = child;
    c->pos = child->first;
    return true;
}

static void pin_rec(radix_tree_t *t, radix_ns_t *ns, radix_node_t *n, uint32_t i)
{
    if ((*rec_ref(n, i))++ == 0) {
        ns->st.pinned_blocks++;
        t->pinned++;
    }
}

/* How many of the first `run` records of node n match the query blocks q
 * (the first one is known to match). Token ids of a node and of a prompt are
 * both contiguous, so runs of blocks are compared with one memcmp a chunk,
 * the next chunk being prefetched meanwhile; only a chunk that differs is
 * searched block by block. Halfway, the child slot's node is prefetched. */
static uint32_t match_run(const radix_tree_t *t, const radix_node_t *n, const uint32_t *q,
                          uint32_t run, const radix_slot_t *slot, uint32_t halfway)
{
    enum { CHUNK = 32 };
    uint32_t bt = t->cfg.block_tokens;
    size_t block_bytes = (size_t)bt * sizeof(uint32_t);
    const char *tok = (const char *)rec_tokens(t, n, n->first);
    const char *end = tok + (size_t)run * block_bytes;
    __builtin_prefetch(rec_id(n, n->first));
    for (const char *p = tok; p < end && p < tok + CHUNK * block_bytes; p += 64)
        __builtin_prefetch(p);
    uint32_t k = 1;
    while (k < run) {
        uint32_t m = run - k < CHUNK ? run - k : CHUNK;
        const char *a = tok + (size_t)k * block_bytes;
        for (const char *p = a + CHUNK * block_bytes; p < end && p < a + 2 * CHUNK * block_bytes;
             p += 64)
            __builtin_prefetch(p);
        if (slot && k >= halfway && slot->node) {
            __builtin_prefetch(slot->node);
            slot = NULL;
        }
        if (memcmp(a, q + (size_t)k * bt, (size_t)m * block_bytes) != 0) {
            while (tokens_eq((const uint32_t *)a, q + (size_t)k * bt, bt)) {
                a += block_bytes;
                k++;
            }
            return k;
        }
        k += m;
    }
    return k;
}

int radix_lookup(radix_tree_t *t, uint32_t ns_id, const uint32_t *tokens, size_t n_tokens, bool pin,
                 uint32_t *ids, size_t max_ids, size_t *n_blocks)
{
    if (!t || !n_blocks || (n_tokens > 0 && !tokens) || (max_ids > 0 && !ids))
        return KVS_EINVAL;
    if (!ns_live(t, ns_id))
        return KVS_ENONS;
    radix_ns_t *ns = t->ns[ns_id];
    uint32_t bt = t->cfg.block_tokens;
    size_t want = n_tokens / bt;
    if (want > max_ids)
        want = max_ids;
    uint64_t tick = ++t->tick;
    radix_node_t *n = ns->root;
    uint32_t pos = 0;
    size_t i = 0;
    uint64_t h = 0;
    bool have_h = false;
    /* What the last matched block was before this lookup (FREQ's reuse gap):
     * the node header's stamp and hits, or the record's own in a partial run */
    uint64_t prev_full_stamp = 0, prev_stamp = 0;
    uint32_t prev_full_hits = 0, prev_hits = 0;
    bool partial = false;
    bool stop = false;
    radix_node_t *f_node = NULL; /* holds the last tier-1 block matched */
    bool f_full = false;         /* its tier-1 candidate was matched */
    while (i < want) {
        if (n->n_children == 0)
            break; /* no hash, no probe: nothing below */
        const uint32_t *q = tokens + i * bt;
        if (!have_h)
            h = t->hash(q, bt, end_hash(t, n));
        radix_node_t *child = child_find(t, n, h, q);
        if (!child || (pin && *rec_ref(child, child->first) >= RADIX_MAX_PINS))
            break; /* a block that takes no more pins ends a pinning match */
        if (!is_root(n))
            n->hits++; /* matched through its end */
        uint32_t run = child->len;
        if (run > want - i)
            run = (uint32_t)(want - i);
        /* If the prompt goes on past this node, hash its next block now and
         * fetch the table slot, and halfway the child's header, while the
         * token comparison streams: the walk then crosses the branch point
         * without waiting on memory. */
        have_h = child->n_children > 0 && i + child->len < want;
        const radix_slot_t *slot = NULL;
        uint32_t halfway = UINT32_MAX;
        if (have_h) {
            h = t->hash(q + (size_t)child->len * bt, bt, *rec_hash(child, last_pos(child)));
            slot = &t->slots[slot_home(t, h, child)];
            __builtin_prefetch(slot);
            halfway = run / 2;
        }
        uint32_t k = match_run(t, child, q, run, slot, halfway);
        if (pin)
            for (uint32_t b = 1; b < k; b++)
                if (*rec_ref(child, child->first + b) >= RADIX_MAX_PINS)
                    k = b;
        memcpy(ids + i, rec_id(child, child->first), (size_t)k * sizeof(uint32_t));
        if (t->n_busy > 0) {
            /* a block being copied is not readable: the match ends there */
            uint32_t b = 0;
            while (b < k && !is_busy(t, ids[i + b]))
                b++;
            if (b < k) {
                stop = true;
                k = b;
                if (k == 0)
                    break;
            }
        }
        if (child->t1_len > 0) {
            f_node = child;
            f_full = k >= child->t1_len;
        }
        if (pin)
            for (uint32_t b = 0; b < k; b++)
                pin_rec(t, ns, child, child->first + b);
        if (k == child->len) {
            prev_full_stamp = child->full_stamp;
            prev_full_hits = child->full_hits;
            child->full_stamp = tick;
            child->full_hits++;
        } else {
            partial = true;
            prev_stamp = rec_stamp(child, child->first + k - 1);
            prev_hits = rec_hits(child, child->first + k - 1);
            for (uint32_t j = 0; j < k; j++) {
                *rec_stampp(child, child->first + j) = tick;
                (*rec_hitsp(child, child->first + j))++;
            }
        }
        i += k;
        n = child;
        pos = child->first + k - 1;
        if (k < child->len || stop)
            break;
    }
    if (i > 0 && t->cfg.policy == RADIX_EVICT_FREQ) {
        if (!partial) {
            uint64_t s = *rec_stampp(n, pos);
            prev_stamp = s > prev_full_stamp ? s : prev_full_stamp;
            prev_hits = *rec_hitsp(n, pos) + prev_full_hits;
        }
        /* First reuses only: the re-reads of a hot shared prefix come
         * ticks apart and would hide how long a block waits for its
         * conversation's next turn. */
        if (prev_hits == 0)
            t->reuse_gap64 += (tick - prev_stamp) - t->reuse_gap64 / 64;
    }
    if (i > 0 && pos == last_pos(n)) {
        n->hits++;
        refresh(t, n, true);
    }
    if (t->t2_blocks > 0 && i > 0) {
        /* the path's tier-1 candidate was stamped too, if it lies above */
        if (f_node && f_full && !(f_node == n && pos == last_pos(n)))
            refresh_q(t, f_node, Q_T1, true);
        size_t k1 = i;
        while (k1 > 0 && in_tier2(t, ids[k1 - 1]))
            k1--;
        ns->st.t2_hit_tokens += (uint64_t)(i - k1) * bt;
    }
    ns->st.lookups++;
    ns->st.lookup_tokens += n_tokens;
    ns->st.hit_tokens += (uint64_t)i * bt;
    *n_blocks = i;
    return 0;
}

/* Copies node n into a new allocation of `cap` records (first = 0) and points
 * everything that refers to it there. Only for childless, unqueued nodes. */
static radix_node_t *node_resize(radix_tree_t *t, radix_node_t *n, uint32_t cap)
{
    radix_node_t *m = node_new(t, cap);
    if (!m)
        return NULL;
    size_t slot = slot_of(t, n);
    memcpy(m, n, sizeof(*m));
    m->cap = cap;
    m->first = 0;
    recs_copy(t, m, 0, n, n->first, n->len);
    for (uint32_t k = 0; k < m->len; k++) {
        uint32_t id = *rec_id(m, k);
        t->by_node[id] = m;
        t->by_pos[id] = k;
    }
    t->slots[slot].node = m;
    node_free(t, n);
    return m;
}

/* Splits n after record `pos`: the records up to pos move to `upper`, which
 * takes n's place under n's parent; n keeps the rest, its children and its
 * queue position (its last block does not change). */
static void node_split(radix_tree_t *t, radix_node_t *n, uint32_t pos, radix_node_t *upper)
{
    uint32_t j = pos - n->first + 1;
    size_t slot = slot_of(t, n);
    upper->parent = n->parent;
    upper->depth = n->depth;
    upper->hits = n->hits;
    upper->full_stamp = n->full_stamp;
    upper->full_hits = n->full_hits;
    upper->ns = n->ns;
    upper->n_children = 1;
    upper->len = j;
    /* n's tier-1 candidate moves up unless it lies below the split */
    if (n->t1_len <= j)
        unqueue(t, n, Q_T1);
    upper->t1_len = n->t1_len < j ? n->t1_len : j;
    upper->t1_children = n->t1_len > j ? 1 : 0;
    n->t1_len -= upper->t1_len;
    recs_copy(t, upper, 0, n, n->first, j);
    for (uint32_t k = 0; k < j; k++) {
        uint32_t id = *rec_id(upper, k);
        t->by_node[id] = upper;
        t->by_pos[id] = k;
    }
    t->slots[slot].node = upper; /* same key: same parent, same first block */
    n->first += j;
    n->len -= j;
    n->depth += j;
    n->parent = upper;
    slot_put(t, n);
    t->ns[n->ns]->n_nodes++;
}

/* Writes new blocks i .. i+m-1 into records [base, base+m) of n. */
static void fill_recs(radix_tree_t *t, radix_ns_t *ns, radix_node_t *n, uint32_t base, uint64_t h,
                      const uint32_t *tokens, const uint32_t *ids, size_t i, size_t m, bool pin,
                      uint64_t tick, uint32_t *canonical)
{
    uint32_t bt = t->cfg.block_tokens;
    for (size_t k = 0; k < m; k++) {
        const uint32_t *block = tokens + (i + k) * bt;
        uint32_t pos = base + (uint32_t)k, id = ids[i + k];
        h = t->hash(block, bt, h);
        *rec_hash(n, pos) = h;
        *rec_stampp(n, pos) = tick;
        *rec_id(n, pos) = id;
        *rec_ref(n, pos) = 0;
        *rec_hitsp(n, pos) = 0u - n->full_hits; /* no hit yet */
        memcpy(rec_tokens(t, n, pos), block, (size_t)bt * sizeof(uint32_t));
        t->by_node[id] = n;
        t->by_pos[id] = pos;
        t->band_of[id] = (uint8_t)prio_band(block_prio(t, id, n->ns));
        ns->st.cached_by_band[t->band_of[id]]++;
        canonical[i + k] = id;
        if (pin)
            pin_rec(t, ns, n, pos);
    }
    ns->st.inserted_blocks += m;
    ns->st.cached_blocks += (uint32_t)m;
    t->cached += (uint32_t)m;
}

int radix_match(const radix_tree_t *t, uint32_t ns_id, const uint32_t *tokens, size_t n_tokens,
                uint32_t *ids, size_t max_ids, size_t *n_blocks)
{
    if (!t || !n_blocks || (n_tokens > 0 && !tokens) || (max_ids > 0 && !ids))
        return KVS_EINVAL;
    *n_blocks = 0;
    if (!ns_live(t, ns_id))
        return KVS_ENONS;
    uint32_t bt = t->cfg.block_tokens;
    size_t want = n_tokens / bt;
    if (want > max_ids)
        want = max_ids;
    radix_cursor_t c = {t->ns[ns_id]->root, 0};
    size_t i = 0;
    for (; i < want; i++) {
        if (!walk_next(t, &c, tokens + i * bt))
            break;
        ids[i] = *rec_id(c.node, c.pos);
        if (is_busy(t, ids[i]))
            break;
    }
    *n_blocks = i;
    return 0;
}

int radix_chain_hashes(const radix_tree_t *t, uint32_t ns_id, const uint32_t *tokens,
                       size_t n_blocks, uint64_t *out)
{
    if (!t || (n_blocks > 0 && (!tokens || !out)))
        return KVS_EINVAL;
    if (!ns_live(t, ns_id))
        return KVS_ENONS;
    uint32_t bt = t->cfg.block_tokens;
    uint64_t h = t->ns[ns_id]->seed;
    for (size_t i = 0; i < n_blocks; i++)
        out[i] = h = t->hash(tokens + i * bt, bt, h);
    return 0;
}

int radix_insert(radix_tree_t *t, uint32_t ns_id, const uint32_t *tokens, size_t n_tokens,
                 const uint32_t *ids, size_t n_ids, bool pin, uint32_t *canonical, size_t *n_done)
{
    if (!t || !n_done)
        return KVS_EINVAL;
    *n_done = 0;
    if ((n_tokens > 0 && !tokens) || (n_ids > 0 && (!ids || !canonical)) ||
        n_ids > n_tokens / t->cfg.block_tokens)
        return KVS_EINVAL;
    for (size_t k = 0; k < n_ids; k++)
        if (ids[k] >= t->cfg.max_blocks)
            return KVS_EINVAL;
    if (!ns_live(t, ns_id))
        return KVS_ENONS;
    int rc = 0;
    radix_ns_t *ns = t->ns[ns_id];
    uint32_t bt = t->cfg.block_tokens;
    uint64_t tick = ++t->tick;

    /* Blocks already cached: duplicates. */
    radix_cursor_t c = {ns->root, 0};
    size_t i = 0;
    for (; i < n_ids; i++) {
        radix_cursor_t next = c;
        if (!walk_next(t, &next, tokens + i * bt))
            break;
        uint32_t id = *rec_id(next.node, next.pos);
        if (ids[i] != id && id_taken(t, ids[i])) {
            rc = KVS_EEXIST;
            break;
        }
        bool upgrade = in_tier2(t, id);
        if (is_busy(t, id) || (upgrade && *rec_ref(next.node, next.pos) > 0) ||
            (pin && *rec_ref(next.node, next.pos) >= RADIX_MAX_PINS)) {
            rc = KVS_EBUSY;
            break;
        }
        if (upgrade && ns->st.quota > 0 && ns->st.cached_blocks >= ns->st.quota) {
            rc = KVS_EQUOTA;
            break;
        }
        c = next;
        *rec_stampp(c.node, c.pos) = tick;
        if (upgrade) {
            /* The caller's tier-1 copy replaces the tier-2 one. */
            t->t2_free[t->t2_n_free++] = retier(t, c.node, c.pos, ids[i], false);
            ns->st.inserted_blocks++;
            id = ids[i];
        } else {
            ns->st.duplicate_blocks++;
        }
        canonical[i] = id;
        if (pin)
            pin_rec(t, ns, c.node, c.pos);
    }
    if (i > 0)
        refresh_at(t, c.node, c.pos);
    if (rc)
        goto done;

    /* New blocks: up to the first id that is cached (or repeated). */
    size_t m = 0;
    while (i + m < n_ids && !id_taken(t, ids[i + m])) {
        t->by_node[ids[i + m]] = &radix_mark;
        m++;
    }
    for (size_t k = 0; k < m; k++)
        t->by_node[ids[i + k]] = NULL;
    if (i + m < n_ids)
        rc = KVS_EEXIST;
    if (m == 0)
        goto done;

    uint32_t quota = ns->st.quota;
    if (quota > 0 && ns->st.cached_blocks + m > quota) {
        /* Evict the namespace's own LRU leaves, never the block we attach to. */
        if (!is_root(c.node)) {
            t->guard = c.node;
            t->guard_pos = c.pos;
            if (has_cand(c.node, Q_T1) && cand_pos(c.node, Q_T1) == c.pos)
                unqueue(t, c.node, Q_T1);
        }
        /* Only tier-1 leaves: a candidate with tier-2 blocks below it would
         * have to be demoted, which takes a copy (radix_demote). */
        radix_node_t *v;
        while (ns->st.cached_blocks + m > quota && (v = candidate(t, ns, Q_T1)) &&
               v->n_children == 0 && v->t1_len == v->len)
            evict_leaf(t, v, Q_T1, EVICT_QUOTA);
        t->guard = NULL;
        if (!is_root(c.node))
            refresh_at(t, c.node, c.pos);
        if (ns->st.cached_blocks + m > quota) {
            m = ns->st.cached_blocks < quota ? quota - ns->st.cached_blocks : 0;
            rc = KVS_EQUOTA;
            if (m == 0)
                goto done;
        }
    }

    int arc = slot_reserve(t, 2);
    if (arc == 0)
        arc = heap_reserve(t, ns, (size_t)ns->n_nodes + 2);
    if (arc) {
        rc = arc;
        goto done;
    }
    radix_node_t *n = c.node;
    bool at_end = is_root(n) || c.pos == last_pos(n);
    uint64_t h = is_root(n) ? ns->seed : *rec_hash(n, c.pos);
    if (at_end && n->len > 0 && n->n_children == 0 && !is_root(n)) {
        /* Extend a leaf node in place: keeps runs in one node. */
        if (n->first + n->len + m > n->cap) {
            size_t want = (size_t)n->len + m;
            size_t grown = (size_t)n->len + n->len / 2;
            if (grown > want && grown <= UINT32_MAX)
                want = grown;
            make_unevictable(t, n);
            radix_node_t *bigger = node_resize(t, n, (uint32_t)want);
            if (!bigger) {
                refresh(t, n, true);
                rc = KVS_ENOMEM;
                goto done;
            }
            n = bigger;
        }
        fill_recs(t, ns, n, n->first + n->len, h, tokens, ids, i, m, pin, tick, canonical);
        n->len += (uint32_t)m;
        n->t1_len += (uint32_t)m;
        refresh(t, n, true);
    } else {
        radix_node_t *leaf = node_new(t, (uint32_t)m);
        radix_node_t *upper = NULL;
        if (leaf && !at_end)
            upper = node_new(t, c.pos - n->first + 1);
        if (!leaf || (!at_end && !upper)) {
            if (leaf)
                node_free(t, leaf);
            rc = KVS_ENOMEM;
            goto done;
        }
        if (!at_end) {
            node_split(t, n, c.pos, upper);
            n = upper;
        }
        leaf->parent = n;
        leaf->ns = ns_id;
        leaf->depth = n->depth + n->len;
        fill_recs(t, ns, leaf, 0, h, tokens, ids, i, m, pin, tick, canonical);
        leaf->len = (uint32_t)m;
        leaf->t1_len = (uint32_t)m;
        slot_put(t, leaf);
        ns->n_nodes++;
        n->n_children++;
        n->t1_children++;
        refresh(t, n, false);
        refresh(t, leaf, true);
    }
    i += m;
done:
    *n_done = i;
    return rc;
}

/* ---- pins ------------------------------------------------------------------ */

int radix_pin(radix_tree_t *t, uint32_t block_id)
{
    if (!t || block_id >= t->cfg.max_blocks + t->t2_blocks)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[block_id];
    if (!n)
        return KVS_ENOTFOUND;
    uint32_t pos = t->by_pos[block_id];
    if (*rec_ref(n, pos) >= RADIX_MAX_PINS)
        return KVS_EBUSY;
    pin_rec(t, t->ns[n->ns], n, pos);
    refresh(t, n, false);
    return 0;
}

int radix_unpin(radix_tree_t *t, uint32_t block_id)
{
    if (!t || block_id >= t->cfg.max_blocks + t->t2_blocks)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[block_id];
    if (!n)
        return KVS_ENOTFOUND;
    uint32_t pos = t->by_pos[block_id];
    uint32_t *ref = rec_ref(n, pos);
    if (*ref == 0)
        return KVS_ENOTPINNED;
    if (--*ref == 0) {
        t->ns[n->ns]->st.pinned_blocks--;
        t->pinned--;
        refresh(t, n, false);
    }
    return 0;
}

int radix_block_refcount(const radix_tree_t *t, uint32_t block_id, uint32_t *refcount)
{
    if (!t || !refcount || block_id >= t->cfg.max_blocks + t->t2_blocks)
        return KVS_EINVAL;
    const radix_node_t *n = t->by_node[block_id];
    if (!n)
        return KVS_ENOTFOUND;
    *refcount = *rec_ref(n, t->by_pos[block_id]);
    return 0;
}

/* ---- retention hints -------------------------------------------------------- */

/* After block id's hints changed from giving `before`: its band count, and
 * its place in eviction order when it is a queued leaf (requeued with its
 * new key: O(1) at a list end, else O(log leaves)). */
static void prio_changed(radix_tree_t *t, uint32_t id, uint32_t before)
{
    radix_node_t *n = t->by_node[id];
    uint32_t now = block_prio(t, id, n->ns);
    if (now == before)
        return;
    radix_ns_t *ns = t->ns[n->ns];
    uint32_t band = prio_band(now);
    if (band != t->band_of[id]) {
        ns->st.cached_by_band[t->band_of[id]]--;
        ns->st.cached_by_band[band]++;
        t->band_of[id] = (uint8_t)band;
    }
    for (int q = 0; q < 2; q++) {
        if (n->q[q].where != WHERE_NONE && cand_pos(n, q) == t->by_pos[id]) {
            unqueue(t, n, q);
            expose(t, n, q);
        }
    }
}

/* The expiry queue keeps each block's live timed hint once: entries whose
 * hint was replaced, ended or evicted, and repeats of a live one, go, and
 * the heap is rebuilt (linear, paid for by the pushes since the last
 * compaction, which at least doubled it). Bit 63 of hint_until marks a
 * block already kept during the pass (radix_hint refuses such ends). Then
 * the array shrinks when mostly empty, so memory follows the live hints,
 * not their history. */
static void expiry_compact(radix_tree_t *t)
{
    const uint64_t seen = 1ull << 63;
    size_t k = 0;
    for (size_t i = 0; i < t->exp_len; i++) {
        radix_expiry_t e = t->exp[i];
        radix_node_t *n = t->by_node[e.id];
        if (!n || n == &radix_mark || t->hint_timed[e.id] == RADIX_PRIO_NONE ||
            t->hint_until[e.id] != e.until)
            continue; /* stale, or (bit 63 set) a repeat of a kept one */
        t->hint_until[e.id] |= seen;
        t->exp[k++] = e;
    }
    t->exp_len = k;
    for (size_t i = 0; i < k; i++)
        t->hint_until[t->exp[i].id] &= ~seen;
    for (size_t i = k / 2; i-- > 0;) { /* heapify: sift each parent down */
        size_t j = i;
        radix_expiry_t v = t->exp[j];
        for (;;) {
            size_t c = 2 * j + 1;
            if (c >= k)
                break;
            if (c + 1 < k && t->exp[c + 1].until < t->exp[c].until)
                c++;
            if (t->exp[c].until >= v.until)
                break;
            t->exp[j] = t->exp[c];
            j = c;
        }
        t->exp[j] = v;
    }
    if (t->exp_cap > 64 && 4 * k < t->exp_cap) {
        size_t ncap = 2 * k > 64 ? 2 * k : 64;
        radix_expiry_t *e = t_realloc(t, t->exp, ncap * sizeof(*e));
        if (e) {
            t->exp = e;
            t->exp_cap = ncap;
        }
    }
}

static int expiry_push(radix_tree_t *t, uint64_t until, uint32_t id)
{
    /* Stale entries never outnumber the live ones by more than 64. */
    if (t->exp_len >= 2 * t->exp_live + 64)
        expiry_compact(t);
    if (t->exp_len == t->exp_cap) {
        size_t ncap = t->exp_cap ? 2 * t->exp_cap : 64;
        radix_expiry_t *e = t_realloc(t, t->exp, ncap * sizeof(*e));
        if (!e)
            return KVS_ENOMEM;
        t->exp = e;
        t->exp_cap = ncap;
    }
    size_t i = t->exp_len++;
    while (i > 0 && t->exp[(i - 1) / 2].until > until) {
        t->exp[i] = t->exp[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    t->exp[i].until = until;
    t->exp[i].id = id;
    return 0;
}

static void expiry_pop(radix_tree_t *t)
{
    radix_expiry_t last = t->exp[--t->exp_len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= t->exp_len)
            break;
        if (c + 1 < t->exp_len && t->exp[c + 1].until < t->exp[c].until)
            c++;
        if (t->exp[c].until >= last.until)
            break;
        t->exp[i] = t->exp[c];
        i = c;
    }
    if (t->exp_len > 0)
        t->exp[i] = last;
}

int radix_hint(radix_tree_t *t, uint32_t block_id, uint32_t prio, uint64_t until)
{
    if (!t || block_id >= t->cfg.max_blocks + t->t2_blocks || prio > RADIX_PRIO_MAX ||
        until >= (1ull << 63))
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[block_id];
    if (!n || n == &radix_mark)
        return KVS_ENOTFOUND;
    radix_ns_t *ns = t->ns[n->ns];
    if (prio > ns->prio_cap)
        prio = ns->prio_cap;
    uint32_t before = block_prio(t, block_id, n->ns);
    if (until == 0) {
        if (t->hint_base[block_id] == RADIX_PRIO_NONE || prio > t->hint_base[block_id])
            t->hint_base[block_id] = (uint8_t)prio;
    } else {
        uint32_t cur = t->hint_timed[block_id];
        if (cur != RADIX_PRIO_NONE &&
            (prio < cur || (prio == cur && until <= t->hint_until[block_id])))
            return 0; /* a higher (or as high and longer) timed hint holds */
        if (cur == RADIX_PRIO_NONE && t->exp_max && t->exp_live >= t->exp_max)
            return KVS_ELIMIT; /* a block's own hint may change; a new one waits */
        /* The queue's entry for this end stays good when only the priority
         * rises; otherwise one more entry, and the old one goes stale. */
        if (cur == RADIX_PRIO_NONE || until != t->hint_until[block_id]) {
            int prc = expiry_push(t, until, block_id);
            if (prc != 0)
                return prc;
        }
        if (cur == RADIX_PRIO_NONE)
            t->exp_live++;
        t->hint_timed[block_id] = (uint8_t)prio;
        t->hint_until[block_id] = until;
    }
    prio_changed(t, block_id, before);
    return 0;
}

int radix_expire_hints(radix_tree_t *t, uint64_t now, size_t *n_expired)
{
    if (!t)
        return KVS_EINVAL;
    size_t done = 0;
    while (t->exp_len > 0 && t->exp[0].until <= now) {
        radix_expiry_t e = t->exp[0];
        expiry_pop(t);
        radix_node_t *n = t->by_node[e.id];
        /* Stale: the block was evicted, or its timed hint replaced. */
        if (!n || n == &radix_mark || t->hint_timed[e.id] == RADIX_PRIO_NONE ||
            t->hint_until[e.id] != e.until)
            continue;
        uint32_t before = block_prio(t, e.id, n->ns);
        t->hint_timed[e.id] = RADIX_PRIO_NONE;
        t->hint_until[e.id] = 0;
        t->exp_live--;
        prio_changed(t, e.id, before);
        done++;
    }
    if (t->exp_cap > 64 && 4 * t->exp_len < t->exp_cap)
        expiry_compact(t); /* give back what a burst of hints took */
    if (n_expired)
        *n_expired = done;
    return 0;
}

int radix_hint_limit(radix_tree_t *t, size_t max_timed)
{
    if (!t)
        return KVS_EINVAL;
    t->exp_max = max_timed;
    return 0;
}

size_t radix_hint_queue_len(const radix_tree_t *t)
{
    return t ? t->exp_len : 0;
}

size_t radix_hint_timed(const radix_tree_t *t)
{
    return t ? t->exp_live : 0;
}

int radix_block_priority(const radix_tree_t *t, uint32_t block_id, uint32_t *prio)
{
    if (!t || !prio || block_id >= t->cfg.max_blocks + t->t2_blocks)
        return KVS_EINVAL;
    const radix_node_t *n = t->by_node[block_id];
    if (!n || n == &radix_mark)
        return KVS_ENOTFOUND;
    *prio = block_prio(t, block_id, n->ns);
    return 0;
}

int radix_ns_set_priority(radix_tree_t *t, uint32_t ns_id, uint32_t prio_default, uint32_t prio_cap)
{
    if (!t || prio_default > RADIX_PRIO_MAX || prio_cap > RADIX_PRIO_MAX)
        return KVS_EINVAL;
    if (!ns_live(t, ns_id))
        return KVS_ENONS;
    radix_ns_t *ns = t->ns[ns_id];
    if (ns->prio_default == prio_default && ns->prio_cap == prio_cap)
        return 0;
    if (ns->st.cached_blocks == 0 && ns->st.tier2_blocks == 0) {
        /* No block to look at (a namespace just made): O(1). */
        ns->prio_default = (uint8_t)prio_default;
        ns->prio_cap = (uint8_t)prio_cap;
        ns->st.prio_default = prio_default;
        ns->st.prio_cap = prio_cap;
        return 0;
    }
    /* Rare (configuration): every block of the namespace is looked at, and
     * hints above the new cap come down to it. */
    uint32_t old_default = ns->prio_default;
    for (uint32_t id = 0; id < t->cfg.max_blocks + t->t2_blocks; id++) {
        radix_node_t *n = t->by_node[id];
        if (!n || n == &radix_mark || n->ns != ns_id)
            continue;
        ns->prio_default = (uint8_t)old_default;
        uint32_t before = block_prio(t, id, ns_id);
        if (t->hint_base[id] != RADIX_PRIO_NONE && t->hint_base[id] > prio_cap)
            t->hint_base[id] = (uint8_t)prio_cap;
        if (t->hint_timed[id] != RADIX_PRIO_NONE && t->hint_timed[id] > prio_cap)
            t->hint_timed[id] = (uint8_t)prio_cap;
        ns->prio_default = (uint8_t)prio_default;
        prio_changed(t, id, before);
    }
    ns->prio_default = (uint8_t)prio_default;
    ns->prio_cap = (uint8_t)prio_cap;
    ns->st.prio_default = prio_default;
    ns->st.prio_cap = prio_cap;
    return 0;
}

int radix_block_hash(const radix_tree_t *t, uint32_t block_id, uint64_t *hash)
{
    if (!t || !hash || block_id >= t->cfg.max_blocks + t->t2_blocks)
        return KVS_EINVAL;
    const radix_node_t *n = t->by_node[block_id];
    if (!n || n == &radix_mark)
        return KVS_ENOTFOUND;
    *hash = *rec_hash(n, t->by_pos[block_id]);
    return 0;
}

/* ---- eviction -------------------------------------------------------------- */

/* The reservation rule (radix.h, radix_evict): the leaf that goes next when
 * namespace for_ns (RADIX_NS_ANY: none) needs a block, or NULL. Namespaces
 * above their reservation may give, first leaf in eviction order among them;
 * for_ns's own first leaf competes with theirs, unless for_ns is below its
 * reservation and one of them has a leaf to give. One look at each
 * namespace's first leaf (candidate()), never a scan of leaves.
 *
 * This is the one place that decides whose block makes room. A host tier
 * that demotes blocks instead of dropping them is to take its victims from
 * here too, and a retention priority orders leaves inside each namespace's
 * queue (candidate()), within what this choice allows: neither may bypass
 * it, or a reservation stops guaranteeing capacity. */
static uint32_t tier_count(const radix_ns_t *ns, int q)
{
    return q == Q_T1 ? ns->st.cached_blocks : ns->st.tier2_blocks;
}

static radix_node_t *evict_choice(radix_tree_t *t, uint32_t for_ns, int q)
{
    radix_node_t *best = NULL;
    for (uint32_t k = 0; k < t->n_ns; k++) {
        radix_ns_t *ns = t->ns[k];
        if (!ns || k == for_ns || tier_count(ns, q) <= ns->st.reserve)
            continue;
        radix_node_t *v = candidate(t, ns, q);
        if (v && (!best || goes_before(v, best, q)))
            best = v;
    }
    if (for_ns == RADIX_NS_ANY)
        return best;
    radix_ns_t *own = t->ns[for_ns];
    if (best && tier_count(own, q) < own->st.reserve)
        return best; /* take back what it lent before evicting itself */
    radix_node_t *v = candidate(t, own, q);
    if (v && (!best || goes_before(v, best, q)))
        best = v;
    return best;
}

int radix_evict(radix_tree_t *t, uint32_t for_ns, size_t n, size_t *n_evicted)
{
    if (!t || !n_evicted)
        return KVS_EINVAL;
    if (for_ns != RADIX_NS_ANY && !ns_live(t, for_ns))
        return KVS_ENONS;
    size_t done = 0;
    while (done < n) {
        radix_node_t *v = evict_choice(t, for_ns, Q_T1);
        if (!v || v->n_children > 0 || v->t1_len < v->len)
            break; /* nothing, or a block that only demotion can move */
        evict_leaf(t, v, Q_T1, v->ns == for_ns ? EVICT_OWN : EVICT_OTHERS);
        done++;
    }
    *n_evicted = done;
    return 0;
}

/* A clear is not a choice of whose block makes room: the namespace asks for
 * all of its unpinned blocks to go, so evict_choice (and the reservations
 * it guards) has nothing to decide. Leaves go in the namespace's own order,
 * each parent after its last child: tier 2's first (they hang below tier
 * 1), then tier 1's, stopping at a tier-1 candidate that still has tier-2
 * blocks below it (pinned or being copied). */
int radix_ns_clear(radix_tree_t *t, uint32_t ns, size_t *n_dropped)
{
    if (!t || !n_dropped)
        return KVS_EINVAL;
    if (!ns_live(t, ns))
        return KVS_ENONS;
    size_t done = 0;
    radix_node_t *v;
    while ((v = candidate(t, t->ns[ns], Q_T2)) != NULL) {
        evict_leaf(t, v, Q_T2, EVICT_OWN);
        done++;
    }
    while ((v = candidate(t, t->ns[ns], Q_T1)) != NULL && v->n_children == 0 &&
           v->t1_len == v->len) {
        evict_leaf(t, v, Q_T1, EVICT_OWN);
        done++;
    }
    *n_dropped = done;
    return 0;
}

int radix_demote(radix_tree_t *t, uint32_t for_ns, size_t n, radix_move_t *moves, size_t *n_moved,
                 size_t *n_dropped)
{
    if (!t || !n_moved || !n_dropped || (n > 0 && !moves) || t->t2_blocks == 0)
        return KVS_EINVAL;
    *n_moved = *n_dropped = 0;
    if (for_ns != RADIX_NS_ANY && for_ns >= t->n_ns)
        return KVS_ENONS;
    while (*n_moved + *n_dropped < n) {
        radix_node_t *v = evict_choice(t, for_ns, Q_T1);
        if (!v)
            break;
        evict_cause_t cause = v->ns == for_ns ? EVICT_OWN : EVICT_OTHERS;
        if (t->t2_n_free == 0) {
            /* Tier 2 makes room by the same rule, for the demoted block's
             * namespace. */
            radix_node_t *d = evict_choice(t, v->ns, Q_T2);
            if (d) {
                evict_leaf(t, d, Q_T2, d->ns == v->ns ? EVICT_OWN : EVICT_OTHERS);
                continue; /* the drop may have changed the first candidate */
            }
        }
        if (t->t2_n_free == 0) {
            if (v->n_children > 0 || v->t1_len < v->len)
                break; /* tier 2 is all pinned or being copied */
            evict_leaf(t, v, Q_T1, cause);
            (*n_dropped)++;
            continue;
        }
        uint32_t to = t->t2_free[--t->t2_n_free];
        radix_ns_t *ns = t->ns[v->ns];
        radix_move_t *mv = &moves[(*n_moved)++];
        mv->ns = v->ns;
        mv->to = to;
        mv->from = retier(t, v, cand_pos(v, Q_T1), to, true);
        ns->st.demoted_blocks++;
        if (cause == EVICT_OWN)
            ns->st.demoted_own++;
        else
            ns->st.demoted_others++;
    }
    return 0;
}

int radix_promote(radix_tree_t *t, uint32_t tier2_id, uint32_t block_id)
{
    if (!t || t->t2_blocks == 0 || !in_tier2(t, tier2_id) ||
        tier2_id >= t->cfg.max_blocks + t->t2_blocks || block_id >= t->cfg.max_blocks)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[tier2_id];
    if (!n)
        return KVS_ENOTFOUND;
    if (id_taken(t, block_id))
        return KVS_EEXIST;
    uint32_t pos = t->by_pos[tier2_id];
    if (is_busy(t, tier2_id) || *rec_ref(n, pos) > 1)
        return KVS_EBUSY;
    /* Its parent must be in tier 1: it is the first tier-2 block of its
     * node, and the node's first block is its parent's child. */
    const radix_node_t *p = n->parent;
    if (pos != n->first + n->t1_len || (n->t1_len == 0 && !is_root(p) && p->t1_len < p->len))
        return KVS_EINVAL;
    t->t2_inflight++;
    retier(t, n, pos, block_id, true);
    t->ns[n->ns]->st.promoted_blocks++;
    return 0;
}

size_t radix_promotable(const radix_tree_t *t, const uint32_t *ids, size_t n)
{
    size_t k = 0;
    if (!t || !ids || t->t2_blocks == 0)
        return 0;
    for (; k < n; k++) {
        uint32_t id = ids[k];
        if (!in_tier2(t, id) || id >= t->cfg.max_blocks + t->t2_blocks || !t->by_node[id] ||
            is_busy(t, id) || *rec_ref(t->by_node[id], t->by_pos[id]) != 1)
            break;
    }
    return k;
}

int radix_copy_done(radix_tree_t *t, uint32_t id, uint32_t *peer)
{
    if (!t || !peer || t->t2_blocks == 0 || id >= t->cfg.max_blocks + t->t2_blocks)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[id];
    if (!n || t->peer[id] == UINT32_MAX)
        return KVS_ENOTFOUND;
    *peer = t->peer[id];
    t->peer[id] = UINT32_MAX;
    t->n_busy--;
    if (!in_tier2(t, id)) { /* a promotion: its tier-2 slot is free again */
        t->t2_inflight--;
        t->t2_free[t->t2_n_free++] = *peer;
    } else { /* a demotion: its tier-1 id is the caller's again */
        t->peer[*peer] = UINT32_MAX;
    }
    refresh(t, n, false);
    return 0;
}

int radix_lookup_uncount(radix_tree_t *t, uint32_t ns, size_t n_tokens, size_t n_blocks,
                         size_t n_tier2)
{
    if (!t)
        return KVS_EINVAL;
    if (ns >= t->n_ns)
        return KVS_ENONS;
    radix_ns_stats_t *st = &t->ns[ns]->st;
    uint64_t bt = t->cfg.block_tokens;
    if (n_tier2 > n_blocks || st->lookups == 0 || st->lookup_tokens < n_tokens ||
        st->hit_tokens < n_blocks * bt || st->t2_hit_tokens < n_tier2 * bt)
        return KVS_EINVAL;
    st->lookups--;
    st->lookup_tokens -= n_tokens;
    st->hit_tokens -= n_blocks * bt;
    st->t2_hit_tokens -= n_tier2 * bt;
    return 0;
}

uint32_t radix_tier2_blocks(const radix_tree_t *t)
{
    return t ? t->t2_cached : 0;
}

uint32_t radix_tier2_free(const radix_tree_t *t)
{
    return t ? t->t2_n_free : 0;
}

uint32_t radix_busy_blocks(const radix_tree_t *t)
{
    return t ? t->n_busy : 0;
}

uint32_t radix_cached_blocks(const radix_tree_t *t)
{
    return t ? t->cached : 0;
}

uint32_t radix_pinned_blocks(const radix_tree_t *t)
{
    return t ? t->pinned : 0;
}

size_t radix_memory_bytes(const radix_tree_t *t)
{
    if (!t)
        return 0;
    size_t bytes =
        sizeof(*t) + t->node_bytes + (t->slot_mask + 1) * sizeof(radix_slot_t) +
        ((size_t)t->cfg.max_blocks + t->t2_blocks) * (sizeof(*t->by_node) + sizeof(*t->by_pos)) +
        (size_t)t->ns_cap * sizeof(*t->ns) + t->exp_cap * sizeof(*t->exp);
    for (uint32_t i = 0; i < t->n_ns; i++)
        if (t->ns[i])
            bytes +=
                sizeof(radix_ns_t) + (t->ns[i]->q[Q_T1].heap_cap + t->ns[i]->q[Q_T2].heap_cap) *
                                         sizeof(radix_heap_entry_t);
    if (t->t2_blocks > 0)
        bytes += (size_t)t->t2_blocks * sizeof(*t->t2_free) +
                 ((size_t)t->cfg.max_blocks + t->t2_blocks) * sizeof(*t->peer);
    return bytes;
}

/* ---- operator walk ----------------------------------------------------------- */

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (radix_node_t *const *)a;
    uintptr_t y = (uintptr_t) * (radix_node_t *const *)b;
    return (x > y) - (x < y);
}

/* Every non-root node (of namespace ns, or all), sorted by address so that a
 * parent's index is found by bsearch. *out is malloc'ed (may be NULL when
 * *n_out is 0). */
static int collect_nodes(const radix_tree_t *t, uint32_t ns, radix_node_t ***out, size_t *n_out)
{
    radix_node_t **a = t_malloc(t, (t->slot_used + 1) * sizeof(*a));
    if (!a)
        return KVS_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i <= t->slot_mask; i++) {
        radix_node_t *node = t->slots[i].node;
        if (node && (ns == RADIX_NS_ALL || node->ns == ns))
            a[n++] = node;
    }
    qsort(a, n, sizeof(*a), cmp_ptr);
    *out = a;
    *n_out = n;
    return 0;
}

static size_t node_index(radix_node_t *const *a, size_t n, const radix_node_t *node)
{
    radix_node_t *const *p = bsearch(&node, a, n, sizeof(*a), cmp_ptr);
    return p ? (size_t)(p - a) : SIZE_MAX;
}

typedef struct radix_top_row {
    radix_prefix_t row;
    uint64_t key; /* hits or blocks, by the order asked for */
} radix_top_row_t;

static int cmp_row(const void *a, const void *b)
{
    const radix_top_row_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    if (x->row.tokens != y->row.tokens)
        return x->row.tokens < y->row.tokens ? -1 : 1;
    if (x->row.ns != y->row.ns)
        return x->row.ns < y->row.ns ? -1 : 1;
    return (x->row.last_block_id > y->row.last_block_id) -
           (x->row.last_block_id < y->row.last_block_id);
}

static int cmp_depth_desc(const void *a, const void *b)
{
    const radix_node_t *x = *(radix_node_t *const *)a;
    const radix_node_t *y = *(radix_node_t *const *)b;
    return (x->depth < y->depth) - (x->depth > y->depth);
}

int radix_top(const radix_tree_t *t, uint32_t ns, radix_order_t order, radix_prefix_t *out,
              size_t max, size_t *n_out)
{
    if (!t || !n_out || (max > 0 && !out) || (order != RADIX_BY_HITS && order != RADIX_BY_SIZE))
        return KVS_EINVAL;
    if (ns != RADIX_NS_ALL && !ns_live(t, ns))
        return KVS_ENONS;
    int rc;
    radix_node_t **nodes = NULL, **by_depth = NULL;
    radix_top_row_t *rows = NULL;
    size_t n = 0;
    rc = collect_nodes(t, ns, &nodes, &n);
    if (rc)
        goto out;
    rc = KVS_ENOMEM;
    rows = t_calloc(t, n + 1, sizeof(*rows));
    by_depth = t_malloc(t, (n + 1) * sizeof(*by_depth));
    if (!rows || !by_depth)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const radix_node_t *node = nodes[i];
        radix_prefix_t *row = &rows[i].row;
        row->ns = node->ns;
        row->tokens = (node->depth + node->len) * t->cfg.block_tokens;
        row->hits = node->hits;
        row->last_used = rec_stamp(node, node->first);
        row->last_block_id = *rec_id(node, last_pos(node));
        row->has_parent = !is_root(node->parent);
        if (row->has_parent)
            row->parent_block_id = *rec_id(node->parent, last_pos(node->parent));
        row->blocks += node->len;
        row->tier2_blocks += node->len - node->t1_len;
        for (uint32_t k = node->first; k <= last_pos(node); k++)
            row->pins += *rec_ref(node, k);
    }
    /* Subtree sums: children before parents (a child is deeper). */
    memcpy(by_depth, nodes, n * sizeof(*by_depth));
    qsort(by_depth, n, sizeof(*by_depth), cmp_depth_desc);
    for (size_t i = 0; i < n; i++) {
        const radix_node_t *node = by_depth[i];
        if (is_root(node->parent))
            continue;
        size_t c = node_index(nodes, n, node), p = node_index(nodes, n, node->parent);
        rows[p].row.blocks += rows[c].row.blocks;
        rows[p].row.pins += rows[c].row.pins;
        rows[p].row.tier2_blocks += rows[c].row.tier2_blocks;
    }
    for (size_t i = 0; i < n; i++)
        rows[i].key = order == RADIX_BY_HITS ? rows[i].row.hits : rows[i].row.blocks;
    qsort(rows, n, sizeof(*rows), cmp_row);
    size_t k = n < max ? n : max;
    for (size_t i = 0; i < k; i++)
        out[i] = rows[i].row;
    *n_out = k;
    rc = 0;
out:
    free(nodes);
    free(by_depth);
    free(rows);
    return rc;
}

/* ---- invariant checker --------------------------------------------------------- */

/* Source line of the last check that failed, for tests to report. */
static int radix_check_failed_line;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            radix_check_failed_line = __LINE__;                                                    \
            goto bad;                                                                              \
        }                                                                                          \
    } while (0)

/* One queue of one namespace: the list linked both ways in strict order,
 * the heap in heap order with heap_live live entries. */
static bool check_queue(const radix_tree_t *t, uint32_t k, int q, radix_node_t *const *nodes,
                        size_t n, uint32_t heap_nodes)
{
    const radix_queue_t *Q = &t->ns[k]->q[q];
    const radix_node_t *prev = NULL;
    for (const radix_node_t *l = Q->head; l; l = l->q[q].next) {
        if (l->q[q].where != WHERE_LIST || l->ns != k || l->q[q].prev != prev ||
            node_index(nodes, n, l) == SIZE_MAX)
            return false;
        if (prev && !goes_before(prev, l, q))
            return false;
        if (t->cfg.policy == RADIX_EVICT_LRU && l->q[q].key != queue_key(t, l, q))
            return false;
        prev = l;
    }
    if (Q->tail != prev || Q->heap_len > Q->heap_cap)
        return false;
    size_t live = 0;
    for (size_t i = 0; i < Q->heap_len; i++) {
        if (i > 0 && entry_before(&Q->heap[i], &Q->heap[(i - 1) / 2]))
            return false;
        const radix_node_t *hn = heap_entry_node(t, &Q->heap[i], q);
        if (hn) {
            if (hn->ns != k)
                return false;
            live++;
        }
    }
    if (live != Q->heap_live || live != heap_nodes)
        return false;
    size_t nodes_k = t->ns[k]->n_nodes;
    bool has_heap = q == Q_T1 || t->t2_blocks > 0;
    return !has_heap || Q->heap_cap >= 2 * nodes_k + 34 || nodes_k == 0;
}

int radix_check(const radix_tree_t *t)
{
    if (!t)
        return KVS_EINVAL;
    int rc = KVS_EINTERNAL;
    radix_node_t **nodes = NULL;
    uint32_t *children = NULL, *t1_children = NULL, *ns_cached = NULL, *ns_t2 = NULL,
             *ns_pinned = NULL, *ns_nodes = NULL, *ns_heap = NULL, *ns_root_children = NULL,
             *ns_root_t1 = NULL;
    uint8_t *t2_seen = NULL;
    size_t n = 0;
    uint32_t bt = t->cfg.block_tokens;
    uint32_t max_ids = t->cfg.max_blocks + t->t2_blocks;
    size_t timed = 0; /* blocks with a live timed hint */
    if (collect_nodes(t, RADIX_NS_ALL, &nodes, &n))
        return KVS_ENOMEM;
    children = t_calloc(t, n + 1, sizeof(*children));
    t1_children = t_calloc(t, n + 1, sizeof(*t1_children));
    ns_cached = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_t2 = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_pinned = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_nodes = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_heap = t_calloc(t, 2 * (t->n_ns + 1), sizeof(uint32_t));
    ns_root_children = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_root_t1 = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    t2_seen = t_calloc(t, (size_t)t->t2_blocks + 1, 1);
    if (!children || !t1_children || !ns_cached || !ns_t2 || !ns_pinned || !ns_nodes || !ns_heap ||
        !ns_root_children || !ns_root_t1 || !t2_seen) {
        rc = KVS_ENOMEM;
        goto out;
    }
    CHECK(t->slot_used == n && t->guard == NULL);

    /* Table: every entry reachable from its home slot, key = first block. */
    for (size_t i = 0; i <= t->slot_mask; i++) {
        const radix_slot_t *s = &t->slots[i];
        if (!s->node)
            continue;
        CHECK(s->hash == *rec_hash(s->node, s->node->first));
        for (size_t j = slot_home(t, s->hash, s->node->parent); j != i; j = (j + 1) & t->slot_mask)
            CHECK(t->slots[j].node);
    }

    size_t node_bytes = 0;
    uint32_t cached = 0, t2_cached = 0, pinned = 0, busy = 0;
    uint32_t live = 0;
    for (uint32_t k = 0; k < t->n_ns; k++) {
        if (!t->ns[k])
            continue;
        live++;
        const radix_node_t *root = t->ns[k]->root;
        CHECK(root->parent == NULL && root->len == 0 && root->ns == k);
        CHECK(root->q[Q_T1].where == WHERE_NONE && root->q[Q_T2].where == WHERE_NONE);
        node_bytes += sizeof(radix_node_t) + (size_t)root->cap * t->rec_bytes;
    }
    for (size_t i = 0; i < n; i++) {
        const radix_node_t *node = nodes[i];
        const radix_node_t *parent = node->parent;
        CHECK(ns_live(t, node->ns) && parent && parent->ns == node->ns);
        CHECK(node->len >= 1 && (size_t)node->first + node->len <= node->cap);
        CHECK(node->t1_len <= node->len);
        /* Tier 1 is closed towards the root. */
        CHECK(node->t1_len == 0 || is_root(parent) || parent->t1_len == parent->len);
        node_bytes += sizeof(radix_node_t) + (size_t)node->cap * t->rec_bytes;
        ns_nodes[node->ns]++;
        if (is_root(parent)) {
            CHECK(parent == t->ns[node->ns]->root && node->depth == 0);
            ns_root_children[node->ns]++;
            ns_root_t1[node->ns] += node->t1_len > 0;
        } else {
            size_t p = node_index(nodes, n, parent);
            CHECK(p != SIZE_MAX);
            children[p]++;
            t1_children[p] += node->t1_len > 0;
            CHECK(node->depth == parent->depth + parent->len);
        }
        /* Siblings are distinct: the probe finds this node for its own block. */
        CHECK(child_find(t, parent, *rec_hash(node, node->first),
                         rec_tokens(t, node, node->first)) == node);
        uint64_t h = end_hash(t, parent);
        uint64_t stamp = is_root(parent) ? t->tick : rec_stamp(parent, last_pos(parent));
        CHECK(node->full_stamp <= t->tick);
        for (uint32_t k = node->first; k <= last_pos(node); k++) {
            h = t->hash(rec_tokens(t, node, k), bt, h);
            CHECK(*rec_hash(node, k) == h);
            CHECK(rec_stamp(node, k) <= stamp && *rec_stampp(node, k) > 0);
            stamp = rec_stamp(node, k);
            uint32_t id = *rec_id(node, k);
            CHECK(id < max_ids && t->by_node[id] == node && t->by_pos[id] == k);
            CHECK(in_tier2(t, id) == (k >= node->first + node->t1_len));
            CHECK(t->band_of[id] == prio_band(block_prio(t, id, node->ns)));
            uint32_t hb = t->hint_base[id], ht = t->hint_timed[id];
            timed += ht != RADIX_PRIO_NONE;
            CHECK((hb == RADIX_PRIO_NONE || hb <= RADIX_PRIO_MAX) &&
                  (ht == RADIX_PRIO_NONE || (ht <= RADIX_PRIO_MAX && t->hint_until[id] > 0)));
            if (in_tier2(t, id)) {
                t2_cached++;
                ns_t2[node->ns]++;
                t2_seen[id - t->cfg.max_blocks] = 1;
            } else {
                cached++;
                ns_cached[node->ns]++;
            }
            if (t->peer && t->peer[id] != UINT32_MAX) {
                /* busy: its other id is in the other tier and not cached */
                uint32_t peer = t->peer[id];
                busy++;
                CHECK(peer < max_ids && in_tier2(t, peer) != in_tier2(t, id) && !t->by_node[peer]);
                /* a demotion's tier-1 id is marked as leaving */
                CHECK(!in_tier2(t, id) || t->peer[peer] == id);
                if (!in_tier2(t, id)) {
                    CHECK(!t2_seen[peer - t->cfg.max_blocks]);
                    t2_seen[peer - t->cfg.max_blocks] = 2;
                }
            }
            if (*rec_ref(node, k) > 0) {
                pinned++;
                ns_pinned[node->ns]++;
            }
        }
        for (int q = 0; q < 2; q++)
            if (node->q[q].where == WHERE_HEAP)
                ns_heap[2 * node->ns + q]++;
    }
    for (size_t i = 0; i < n; i++) {
        CHECK(nodes[i]->n_children == children[i] && nodes[i]->t1_children == t1_children[i]);
        for (int q = 0; q < 2; q++) {
            bool ev = queueable(t, nodes[i], q) && (q == Q_T1 || t->t2_blocks > 0);
            CHECK(ev == (nodes[i]->q[q].where != WHERE_NONE));
            if (nodes[i]->q[q].where != WHERE_LIST)
                CHECK(!nodes[i]->q[q].prev && !nodes[i]->q[q].next);
        }
    }
    CHECK(node_bytes == t->node_bytes);
    CHECK(cached == t->cached && pinned == t->pinned && t2_cached == t->t2_cached);
    CHECK(busy == t->n_busy);
    uint32_t mapped = 0;
    for (uint32_t id = 0; id < max_ids; id++)
        if (t->by_node[id]) {
            CHECK(t->by_node[id] != &radix_mark);
            mapped++;
        }
    CHECK(mapped == cached + t2_cached);
    /* Tier-2 ids: each free, cached, or held by a promotion being copied. */
    CHECK(t->t2_n_free + t->t2_cached + t->t2_inflight == t->t2_blocks);
    for (uint32_t i = 0; i < t->t2_n_free; i++) {
        uint32_t id = t->t2_free[i];
        CHECK(in_tier2(t, id) && id < max_ids && !t2_seen[id - t->cfg.max_blocks]);
        t2_seen[id - t->cfg.max_blocks] = 3;
    }

    /* Deleted ids are empty slots below n_ns, the last slot is live. */
    CHECK(live == t->n_live && (t->n_ns == 0 || t->ns[t->n_ns - 1]));
    for (uint32_t k = 0; k < t->n_ns; k++) {
        const radix_ns_t *ns = t->ns[k];
        if (!ns)
            continue;
        CHECK(ns->st.cached_blocks == ns_cached[k] && ns->st.pinned_blocks == ns_pinned[k]);
        CHECK(ns->st.tier2_blocks == ns_t2[k]);
        CHECK(ns->st.evicted_blocks ==
              ns->st.evicted_own + ns->st.evicted_others + ns->st.evicted_quota);
        uint64_t by_band = 0, ev_band = 0;
        for (int b = 0; b < RADIX_PRIO_BANDS; b++) {
            by_band += ns->st.cached_by_band[b];
            ev_band += ns->st.evicted_by_band[b];
        }
        CHECK(by_band == ns->st.cached_blocks + ns->st.tier2_blocks &&
              ev_band == ns->st.evicted_blocks);
        CHECK(ns->st.demoted_blocks == ns->st.demoted_own + ns->st.demoted_others);
        CHECK(ns->n_nodes == ns_nodes[k] && ns->root->n_children == ns_root_children[k]);
        CHECK(ns->root->t1_children == ns_root_t1[k]);
        CHECK(check_queue(t, k, Q_T1, nodes, n, ns_heap[2 * k]));
        CHECK(check_queue(t, k, Q_T2, nodes, n, ns_heap[2 * k + 1]));
    }
    CHECK(timed == t->exp_live);
    rc = 0;
    goto out;
bad:
    rc = KVS_EINTERNAL;
out:
    free(nodes);
    free(children);
    free(t1_children);
    free(ns_cached);
    free(ns_t2);
    free(ns_pinned);
    free(ns_nodes);
    free(ns_heap);
    free(ns_root_children);
    free(ns_root_t1);
    free(t2_seen);
    return rc;
}

int radix_check_line(void)
{
    return radix_check_failed_line;
}

int radix_copy_undo(radix_tree_t *t, uint32_t id, uint32_t *peer)
{
    if (!t || !peer || t->t2_blocks == 0 || id >= t->cfg.max_blocks + t->t2_blocks)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[id];
    if (!n || t->peer[id] == UINT32_MAX)
        return KVS_ENOTFOUND;
    uint32_t pos = t->by_pos[id], back = t->peer[id];
    bool demotion = in_tier2(t, id);
    if (demotion) {
        /* Back up: the block before it must be in tier 1. */
        const radix_node_t *p = n->parent;
        if (pos != n->first + n->t1_len || (n->t1_len == 0 && !is_root(p) && p->t1_len < p->len))
            return KVS_EBUSY;
    } else if (pos != n->first + n->t1_len - 1 || (n->t1_len == n->len && n->t1_children > 0)) {
        return KVS_EBUSY; /* back down: nothing below it may be in tier 1 */
    }
    t->peer[id] = UINT32_MAX;
    t->n_busy--;
    if (demotion)
        t->peer[back] = UINT32_MAX;
    else
        t->t2_inflight--;
    retier(t, n, pos, back, false);
    if (demotion) /* its tier-2 id was never written: free again */
        t->t2_free[t->t2_n_free++] = id;
    *peer = back;
    return 0;
}

/* ---- dropping one prompt ----------------------------------------------------- */

/* Like radix_ns_clear this makes no choice of whose block makes room (the
 * caller names the blocks), so it does not go through evict_choice; unlike
 * it, it follows one chain, not the queues: its last block first, then each
 * block before it as it becomes the end of its prefix. A block another
 * cached prefix continues has a child record or node, so the walk back stops
 * there, as it does at a pin or a copy, and keeps everything before it. */
int radix_evict_prompt(radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                       size_t *n_matched, size_t *n_tier1, size_t *n_tier2)
{
    if (!t || !n_matched || !n_tier1 || !n_tier2 || (n_tokens > 0 && !tokens))
        return KVS_EINVAL;
    *n_matched = *n_tier1 = *n_tier2 = 0;
    if (!ns_live(t, ns))
        return KVS_ENONS;
    uint32_t bt = t->cfg.block_tokens;
    size_t want = n_tokens / bt;
    radix_cursor_t at = {t->ns[ns]->root, 0}, next = at;
    while (*n_matched < want && walk_next(t, &next, tokens + *n_matched * bt) &&
           !is_busy(t, *rec_id(next.node, next.pos))) {
        at = next;
        (*n_matched)++;
    }
    radix_node_t *n = at.node;
    uint32_t pos = at.pos;
    while (!is_root(n) && pos == last_pos(n) && n->n_children == 0) {
        uint32_t id = *rec_id(n, pos);
        if (*rec_ref(n, pos) > 0 || is_busy(t, id))
            break;
        radix_node_t *parent = n->parent;
        bool gone = n->len == 1; /* evict_leaf frees the node with its last block */
        bool tier2 = in_tier2(t, id);
        evict_leaf(t, n, tier2 ? Q_T2 : Q_T1, EVICT_OWN);
        (*(tier2 ? n_tier2 : n_tier1))++;
        if (gone)
            n = parent;
        pos = is_root(n) ? 0 : last_pos(n);
    }
    return 0;
}
