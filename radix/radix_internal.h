/* SPDX-License-Identifier: Apache-2.0 */
/*
 * radix_internal.h: what the files of the index share. Only the .c files of
 * radix/ include it; radix.h is the folder's one public header.
 *
 *   tree.c   the structure (its diagram), nodes and records, the child
 *            table, the walk, lookup, match, insert, pins, radix_new/free
 *   evict.c  recency and eviction order: the two queues (list + heap) of
 *            each namespace, which block makes room (reservations),
 *            radix_evict, radix_ns_clear; retention hints and priorities
 *   tier.c   moves between the tiers (pool, host, disk): demote, promote,
 *            copy done, restore
 *   ns.c     namespaces: create, delete, find, limits, counters
 *   top.c    the operator's walk (radix_top, and in steps: radix_top_begin)
 *   check.c  the invariant checker (radix_check)
 *
 * The small helpers every file uses are static inline here; a function one
 * file offers the others is named radix__ (libuv's uv__) and has its
 * contract above its definition.
 */
#ifndef KVS_RADIX_INTERNAL_H
#define KVS_RADIX_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "radix.h"

/* Pins one block may hold. Every path that pins checks it (radix_pin
 * refuses, a pinning lookup stops before the block, a pinning duplicate
 * insert refuses), so a count never wraps to 0 under its holders. A test
 * build lowers it to reach it (tests/radix, like rax's allocator swap). */
#ifndef RADIX_MAX_PINS
#define RADIX_MAX_PINS UINT32_MAX

#endif

enum { WHERE_NONE = 0, WHERE_LIST = 1, WHERE_HEAP = 2 };

/* One eviction queue per tier: queue k orders tier-k candidates, each the
 * last tier-k block of a node with no tier-k block below it
 * (radix__queueable). The lowest tier's queue holds leaves
 * (drops); every other queue holds demotion candidates (or, with one tier,
 * eviction candidates). Q_T1 is the pool's. */
enum { Q_T1 = 0, Q_T2 = 1, Q_T3 = 2 };

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
    radix_node_t *parent;         /* NULL for a namespace root */
    radix_qlink_t q[RADIX_TIERS]; /* one link per tier's queue */
    uint64_t hits;                /* lookups that matched through this node's end */
    uint64_t full_stamp;          /* a tick at which every record here was touched */
    uint32_t first;               /* records in use: [first, first + len) */
    uint32_t len;
    uint32_t cap;
    uint32_t n_children;
    uint32_t depth; /* blocks before this node's first block */
    uint32_t ns;
    uint32_t full_hits; /* lookups that matched every record here (mod 2^32) */
    /* tlen[k] records of tier k, in tier order: records [first, first +
     * tlen[0]) are in tier 1, the next tlen[1] in tier 2, and so on (a
     * block's tier is never above its parent's: tier_of grows along a path). */
    uint32_t tlen[RADIX_TIERS];
    uint32_t tchildren[RADIX_TIERS]; /* children whose first block is in tier k */
    uint64_t recs[];                 /* the record arrays, see rec_hash() .. rec_tokens() */
};

typedef struct radix_heap_entry {
    uint64_t key;
    uint64_t stamp;
    uint32_t id;
    uint32_t seq;
} radix_heap_entry_t;

/* One eviction queue of a namespace: a list and a heap (evict.c). */
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
    radix_ns_stats_t st;          /* counters, cached/pinned blocks, quota, reserve */
    uint32_t n_nodes;             /* non-root nodes */
    radix_queue_t q[RADIX_TIERS]; /* one per tier */
    uint8_t prio_default;         /* priority of blocks without a live hint */
    uint8_t prio_cap;             /* the highest priority a hint may give */
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
    radix_slot_t *slots;    /* the child table (new nodes go here) */
    size_t slot_mask;
    size_t slot_used; /* nodes in slots */
    /* While the table grows (slot_reserve), the table it outgrew: its nodes
     * move into slots a chunk per insert (or per walk step), in slot order
     * from old_next on; each node is in exactly one of the two. Slots
     * before old_next are moved (emptied; probes skip them); a node removed
     * from here leaves RADIX_TOMB, so other probe chains stay whole;
     * nothing is ever put here. Freed (NULL) once old_used reaches 0. */
    radix_slot_t *old_slots;
    size_t old_mask;
    size_t old_used; /* nodes still in old_slots */
    size_t old_next; /* the next old slot to move */
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
    /* Tiers below the pool: tier k's ids are [base[k], base[k + 1]), owned
     * by the tree (base[0] = 0, base[1] = max_blocks; id_end = base[n_tiers]
     * = base[RADIX_TIERS]). lower[0] is unused: the pool's ids are the
     * caller's. */
    uint32_t n_tiers; /* 1 + the tiers below the pool */
    uint32_t base[RADIX_TIERS + 1];
    uint32_t id_end;
    struct {
        uint32_t *free; /* stack of free ids */
        uint32_t n_free;
        uint32_t cached;   /* blocks of this tier in the index */
        uint32_t inflight; /* ids held by moves being copied out of this tier */
    } lower[RADIX_TIERS];
    uint32_t *free_at; /* [id_end - max_blocks]: a free lower id's place in its stack */
    uint32_t *peer;    /* [id_end]: a busy block's other id, else UINT32_MAX */
    uint32_t n_busy;   /* blocks being copied */
};

#define RADIX_PRIO_NONE 0xff

/* Why a block is dropped, for the namespace's counters. */
typedef enum evict_cause { EVICT_OWN, EVICT_OTHERS, EVICT_QUOTA } evict_cause_t;

/* Every allocation after the tree exists goes through these, so tests can
 * make any one of them fail (radix_config_t.fail_alloc). */
static inline bool alloc_fails(const radix_tree_t *t)
{
    return t->cfg.fail_alloc && t->cfg.fail_alloc(t->cfg.fail_ctx);
}

static inline void *t_malloc(const radix_tree_t *t, size_t size)
{
    return alloc_fails(t) ? NULL : malloc(size);
}

static inline void *t_calloc(const radix_tree_t *t, size_t n, size_t size)
{
    return alloc_fails(t) ? NULL : calloc(n, size);
}

static inline void *t_realloc(const radix_tree_t *t, void *p, size_t size)
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

static inline uint64_t end_hash(const radix_tree_t *t, const radix_node_t *n)
{
    if (n->len == 0)
        return t->ns[n->ns]->seed;
    return *rec_hash(n, last_pos(n));
}

/* ---- child table -------------------------------------------------------- */

/* A key's home slot in a table of mask + 1 slots. */
static inline size_t slot_home_in(size_t mask, uint64_t h, const radix_node_t *parent)
{
    /* The parent takes part so that equal hashes under different parents
     * (forced or crafted collisions) spread over the table. */
    uint64_t x = h ^ ((uint64_t)(uintptr_t)parent * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (size_t)x & mask;
}

static inline size_t slot_home(const radix_tree_t *t, uint64_t h, const radix_node_t *parent)
{
    return slot_home_in(t->slot_mask, h, parent);
}

/* The old table's mark of a node removed from it: not
 * NULL, so probes go on past it, and its parent is NULL, which no table
 * node has, so a probe's key compare never matches it. */
extern radix_node_t radix__tomb;
#define RADIX_TOMB (&radix__tomb)

/* Old slots moved per insert while the table grows (slot_reserve says why
 * this is enough), and the work of moving n old slots for a walk step. */
#define RADIX_GROW_CHUNK 128

/* ---- eviction queues ----------------------------------------------------- */

/* A record's stamp: a walk through a whole node stamps the node once
 * (full_stamp) instead of writing every record, so the hot lookup path reads
 * records without dirtying them. */
static inline uint64_t rec_stamp(const radix_node_t *n, uint32_t i)
{
    uint64_t s = *rec_stampp(n, i);
    return s > n->full_stamp ? s : n->full_stamp;
}

/* Whether id is in a tier below the pool. */
static inline bool in_lower(const radix_tree_t *t, uint32_t id)
{
    return id >= t->cfg.max_blocks;
}

/* The tier (0: the pool) of an id below id_end. */
static inline uint32_t tier_of(const radix_tree_t *t, uint32_t id)
{
    uint32_t k = 0;
    while (k + 1 < t->n_tiers && id >= t->base[k + 1])
        k++;
    return k;
}

/* Records of n in tiers 0 .. k (k < RADIX_TIERS; the bound is also said in
 * the loop, or gcc -O3 warns of a read past tlen where it cannot see it). */
static inline uint32_t tier_end(const radix_node_t *n, uint32_t k)
{
    uint32_t e = 0;
    for (uint32_t j = 0; j <= k && j < RADIX_TIERS; j++)
        e += n->tlen[j];
    return e;
}

/* The tier of a node's last block (0 for a root). */
static inline uint32_t last_tier(const radix_node_t *n)
{
    uint32_t k = RADIX_TIERS - 1;
    while (k > 0 && n->tlen[k] == 0)
        k--;
    return k;
}

/* Pushes a free lower id on its tier's stack. */
static inline void lower_push(radix_tree_t *t, uint32_t id)
{
    uint32_t k = tier_of(t, id);
    t->free_at[id - t->cfg.max_blocks] = t->lower[k].n_free;
    t->lower[k].free[t->lower[k].n_free++] = id;
}

/* Takes the top free id of lower tier k (the caller checked n_free). */
static inline uint32_t lower_pop(radix_tree_t *t, uint32_t k)
{
    uint32_t id = t->lower[k].free[--t->lower[k].n_free];
    t->free_at[id - t->cfg.max_blocks] = UINT32_MAX;
    return id;
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

/* The record a node offers to queue q: its last block of tier q (a
 * demotion candidate, or a drop candidate in the lowest tier, where it is
 * the node's last block). Only meaningful when has_cand(). */
static inline uint32_t cand_pos(const radix_node_t *n, int q)
{
    return n->first + tier_end(n, (uint32_t)q) - 1;
}

static inline bool has_cand(const radix_node_t *n, int q)
{
    return n->len > 0 && n->tlen[q] > 0;
}

static inline uint64_t cand_stamp(const radix_node_t *n, int q)
{
    return rec_stamp(n, cand_pos(n, q));
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

/* Whether id names a namespace (not a deleted one's free slot). */
static inline bool ns_live(const radix_tree_t *t, uint32_t id)
{
    return id < t->n_ns && t->ns[id] != NULL;
}

/* Hidden: the index is built with -fPIC, and a function other code could
 * interpose is never inlined, not even inside its own file; hidden ones are,
 * as when they were static, and no radix__ symbol leaves a shared object. */
#pragma GCC visibility push(hidden)

/* Marks ids in by_node while an insert checks them for repeats (tree.c). */
extern radix_node_t radix__mark;

/* tree.c */
radix_node_t *radix__node_new(radix_tree_t *t, uint32_t cap);
void radix__node_free(radix_tree_t *t, radix_node_t *n);
radix_node_t *radix__child_find(const radix_tree_t *t, const radix_node_t *parent, uint64_t h,
                                const uint32_t *block);
void radix__slot_remove(radix_tree_t *t, radix_node_t *n);
/* Moves up to `budget` slots of the table being outgrown (if any) into the
 * new one; frees the old once empty. */
void radix__grow_step(radix_tree_t *t, size_t budget);
/* For tests: nodes still in the table being outgrown (0: not growing). */
size_t radix__grow_left(const radix_tree_t *t);
/* from: the cached block the tokens follow (RADIX_NO_BLOCK: the root). */
int radix__insert_tier(radix_tree_t *t, uint32_t ns_id, uint32_t from, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t n_ids, uint32_t tier, bool pin,
                       uint32_t *canonical, size_t *n_done);

/* evict.c: the queues */
uint64_t radix__queue_key(const radix_tree_t *t, const radix_node_t *n, int q);
bool radix__queueable(const radix_tree_t *t, const radix_node_t *n, int q);
radix_node_t *radix__heap_entry_node(const radix_tree_t *t, const radix_heap_entry_t *e, int q);
int radix__heap_reserve(const radix_tree_t *t, radix_ns_t *ns, size_t nodes);
void radix__unqueue(radix_tree_t *t, radix_node_t *n, int q);
void radix__make_unevictable(radix_tree_t *t, radix_node_t *n);
void radix__refresh_q(radix_tree_t *t, radix_node_t *n, int q, bool touched);
void radix__refresh_at(radix_tree_t *t, radix_node_t *n, uint32_t pos);
radix_node_t *radix__candidate(radix_tree_t *t, radix_ns_t *ns, int q);
/* evict.c: dropping a block, and whose block goes */
void radix__evict_leaf(radix_tree_t *t, radix_node_t *n, int q, evict_cause_t cause);
radix_node_t *radix__evict_choice(radix_tree_t *t, uint32_t for_ns, int q);
/* evict.c: hints */
void radix__move_hints(radix_tree_t *t, uint32_t old_id, uint32_t new_id);

/* tier.c */
uint32_t radix__retier(radix_tree_t *t, radix_node_t *n, uint32_t pos, uint32_t new_id, bool busy);
uint32_t *radix__tier_count(radix_ns_t *ns, uint32_t k);

/* top.c */
int radix__collect_nodes(const radix_tree_t *t, uint32_t ns, radix_node_t ***out, size_t *n_out);
size_t radix__node_index(radix_node_t *const *a, size_t n, const radix_node_t *node);

#pragma GCC visibility pop

/* Every tier's queue; touched: every block of the node was just stamped (a
 * walk went through its end), so all its candidates were. Inline: every
 * lookup that ends on a leaf calls it. */
static inline void refresh(radix_tree_t *t, radix_node_t *n, bool touched)
{
    if (is_root(n))
        return;
    for (uint32_t q = 0; q < t->n_tiers; q++)
        radix__refresh_q(t, n, (int)q, touched);
}

/* ---- the walk (tree.c builds lookup and insert on it, evict.c one prompt's drop) ---- */

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
    radix_node_t *child = radix__child_find(t, n, t->hash(block, bt, end_hash(t, n)), block);
    if (!child)
        return false;
    c->node = child;
    c->pos = child->first;
    return true;
}

#endif /* KVS_RADIX_INTERNAL_H */
