/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tree.c: the prefix index's tree: nodes and their records, the child
 * table, the walk, lookup, match, insert and pins.
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
 * Recency and eviction order: evict.c. Tiers: tier.c. What the files
 * share: radix_internal.h.
 */
#include "radix_internal.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Marks ids in by_node while an insert checks them for repeats. */
radix_node_t radix__mark;

static uint64_t radix_xxh3(const uint32_t *tokens, size_t n_tokens, uint64_t seed)
{
    return XXH3_64bits_withSeed(tokens, n_tokens * sizeof(uint32_t), seed);
}

/* ---- records and nodes ------------------------------------------------ */

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

radix_node_t *radix__node_new(radix_tree_t *t, uint32_t cap)
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

void radix__node_free(radix_tree_t *t, radix_node_t *n)
{
    t->node_bytes -= sizeof(radix_node_t) + (size_t)n->cap * t->rec_bytes;
    free(n);
}

/* ---- child table -------------------------------------------------------- */

radix_node_t radix__tomb; /* RADIX_TOMB: parent NULL, never written */

/* The node of (parent, h, block) in the new table, or NULL. */
static radix_node_t *table_find(const radix_tree_t *t, const radix_node_t *parent, uint64_t h,
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

/* The old table's probes skip the slots already moved, [0, old_next): a
 * node still there lies at or past old_next, and between its home and it
 * every slot not moved is taken (or a tombstone), as when the table was
 * whole. Slots moved are emptied so that later probes need not walk them. */
static size_t old_start(const radix_tree_t *t, size_t home)
{
    return home < t->old_next ? t->old_next : home;
}

static size_t old_next_slot(const radix_tree_t *t, size_t i)
{
    i = (i + 1) & t->old_mask;
    return i < t->old_next ? t->old_next : i;
}

/* The node of (parent, h, block) in the old table, or NULL. At most the
 * slots not moved are looked at (they may all be taken near the end). */
static radix_node_t *old_find(const radix_tree_t *t, const radix_node_t *parent, uint64_t h,
                              const uint32_t *block)
{
    size_t i = old_start(t, slot_home_in(t->old_mask, h, parent));
    for (size_t k = t->old_next; k <= t->old_mask; k++) {
        const radix_slot_t *s = &t->old_slots[i];
        if (!s->node)
            return NULL;
        if (s->hash == h && s->node->parent == parent &&
            tokens_eq(rec_tokens(t, s->node, s->node->first), block, t->cfg.block_tokens))
            return s->node;
        i = old_next_slot(t, i);
    }
    return NULL;
}

/* The child of parent whose first block is `block`, h being that block's
 * chained hash, or NULL. The probe compares parents and tokens, so equal
 * hashes never confuse two nodes. While the table grows, a node not in the
 * new table may still be in the old one: one more branch, on a miss only. */
radix_node_t *radix__child_find(const radix_tree_t *t, const radix_node_t *parent, uint64_t h,
                                const uint32_t *block)
{
    radix_node_t *n = table_find(t, parent, h, block);
    if (n || !t->old_slots)
        return n;
    return old_find(t, parent, h, block);
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

/* n's slot in the new table, or NULL when n is not there. */
static radix_slot_t *new_slot(radix_tree_t *t, const radix_node_t *n)
{
    size_t i = slot_home(t, *rec_hash(n, n->first), n->parent);
    while (t->slots[i].node != n) {
        if (!t->slots[i].node)
            return NULL;
        i = (i + 1) & t->slot_mask;
    }
    return &t->slots[i];
}

/* n's slot in the old table (n is there). */
static radix_slot_t *old_slot(radix_tree_t *t, const radix_node_t *n)
{
    size_t i = old_start(t, slot_home_in(t->old_mask, *rec_hash(n, n->first), n->parent));
    while (t->old_slots[i].node != n)
        i = old_next_slot(t, i);
    return &t->old_slots[i];
}

/* n's slot, in whichever table holds it (n is in one). */
static radix_slot_t *slot_of(radix_tree_t *t, const radix_node_t *n)
{
    radix_slot_t *s = new_slot(t, n);
    return s ? s : old_slot(t, n);
}

/* Frees the old table once the last node has left it. */
static void old_done(radix_tree_t *t)
{
    if (t->old_slots && t->old_used == 0) {
        free(t->old_slots);
        t->old_slots = NULL;
        t->old_mask = 0;
        t->old_next = 0;
    }
}

void radix__slot_remove(radix_tree_t *t, radix_node_t *n)
{
    radix_slot_t *tab = t->slots;
    size_t i = slot_home(t, *rec_hash(n, n->first), n->parent);
    while (tab[i].node != n) {
        if (!tab[i].node) {
            /* In the old table: a tombstone keeps its probe chains whole. */
            radix_slot_t *s = old_slot(t, n);
            s->node = RADIX_TOMB;
            s->hash = 0;
            t->old_used--;
            old_done(t);
            return;
        }
        i = (i + 1) & t->slot_mask;
    }
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->slot_mask;
        radix_slot_t *s = &tab[j];
        if (!s->node)
            break;
        size_t home = slot_home(t, s->hash, s->node->parent);
        /* Move s back into the hole unless its home lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            tab[i] = *s;
            i = j;
        }
    }
    tab[i].node = NULL;
    tab[i].hash = 0;
    t->slot_used--;
}

void radix__grow_step(radix_tree_t *t, size_t budget)
{
    while (t->old_slots && budget-- > 0) {
        radix_slot_t *s = &t->old_slots[t->old_next++];
        if (s->node && s->node != RADIX_TOMB) {
            slot_put(t, s->node);
            t->old_used--;
        }
        s->node = NULL; /* probes skip it (old_start) */
        s->hash = 0;
        old_done(t);
    }
}

size_t radix__grow_left(const radix_tree_t *t)
{
    return t->old_slots ? t->old_used : 0;
}

/* Makes room for `extra` more nodes, keeping the load of the new table at
 * most 1/2 over the nodes of both tables; grows incrementally, so no insert
 * moves more than RADIX_GROW_CHUNK old slots (plus, never in practice, the
 * fallback below).
 *
 * Why a chunk of 128 per insert suffices: the table of C slots starts to
 * grow when its nodes (both tables' together) would pass C/2; the new table
 * has 2C slots and would need to grow again only past C nodes, so at least
 * C/2 nodes are added in between. An insert calls this once and adds at
 * most 2 nodes (extra), so at least C/4 calls come first, which move
 * 128 * C/4 = 32 C old slots: the C old slots are all moved after C/128 of
 * them, long before. Removals only make room. The fallback (finish moving
 * in one piece, then grow again) is kept for safety only. */
static int slot_reserve(radix_tree_t *t, size_t extra)
{
    radix__grow_step(t, RADIX_GROW_CHUNK);
    size_t cap = t->slot_mask + 1;
    size_t used = t->slot_used + t->old_used;
    if ((used + extra) * 2 <= cap)
        return 0;
    size_t ncap = cap * 2;
    while ((used + extra) * 2 > ncap)
        ncap *= 2;
    radix_slot_t *slots = t_calloc(t, ncap, sizeof(*slots));
    if (!slots)
        return KVS_ENOMEM;
    radix__grow_step(t, SIZE_MAX); /* the fallback: still moving (see above) */
    t->old_slots = t->slots;
    t->old_mask = t->slot_mask;
    t->old_used = t->slot_used;
    t->old_next = 0;
    t->slots = slots;
    t->slot_mask = ncap - 1;
    t->slot_used = 0;
    radix__grow_step(t, RADIX_GROW_CHUNK);
    return 0;
}

/* ---- create and free ----------------------------------------------------- */

int radix_new(const radix_config_t *cfg, radix_tree_t **out)
{
    int rc = KVS_EINVAL;
    radix_tree_t *t = NULL;
    if (!cfg || !out || cfg->block_tokens == 0 || cfg->max_blocks == 0 ||
        cfg->block_tokens > 65536 || cfg->tier2_blocks > UINT32_MAX - cfg->max_blocks ||
        cfg->tier3_blocks > UINT32_MAX - cfg->max_blocks - cfg->tier2_blocks ||
        (cfg->tier3_blocks > 0 && cfg->tier2_blocks == 0) ||
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
    size_t ids = (size_t)cfg->max_blocks + cfg->tier2_blocks + cfg->tier3_blocks;
    uint32_t sizes[RADIX_TIERS] = {cfg->max_blocks, cfg->tier2_blocks, cfg->tier3_blocks};
    t->n_tiers = cfg->tier3_blocks > 0 ? 3 : cfg->tier2_blocks > 0 ? 2 : 1;
    for (uint32_t k = 0; k < RADIX_TIERS; k++)
        t->base[k + 1] = t->base[k] + sizes[k];
    t->id_end = (uint32_t)ids;
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
    if (t->n_tiers > 1) {
        t->peer = t_malloc(t, ids * sizeof(*t->peer));
        t->free_at = t_malloc(t, (ids - cfg->max_blocks) * sizeof(*t->free_at));
        if (!t->peer || !t->free_at)
            goto fail;
        for (size_t i = 0; i < ids; i++)
            t->peer[i] = UINT32_MAX;
        for (uint32_t k = 1; k < t->n_tiers; k++) {
            t->lower[k].free = t_malloc(t, (size_t)sizes[k] * sizeof(*t->lower[k].free));
            if (!t->lower[k].free)
                goto fail;
            /* popped in increasing order */
            for (uint32_t id = t->base[k + 1]; id-- > t->base[k];)
                lower_push(t, id);
        }
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
    if (t->old_slots)
        for (size_t i = 0; i <= t->old_mask; i++)
            if (t->old_slots[i].node && t->old_slots[i].node != RADIX_TOMB)
                free(t->old_slots[i].node);
    for (uint32_t i = 0; i < t->n_ns; i++) {
        if (!t->ns[i])
            continue;
        free(t->ns[i]->root);
        for (int q = 0; q < RADIX_TIERS; q++)
            free(t->ns[i]->q[q].heap);
        free(t->ns[i]);
    }
    free(t->ns);
    free(t->slots);
    free(t->old_slots);
    free(t->by_node);
    free(t->by_pos);
    free(t->hint_base);
    free(t->hint_timed);
    free(t->hint_until);
    free(t->band_of);
    free(t->exp);
    free(t->peer);
    free(t->free_at);
    for (int k = 0; k < RADIX_TIERS; k++)
        free(t->lower[k].free);
    free(t);
}

/* ---- the walk -------------------------------------------------------------- */

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
    /* Per tier: the node holding the last block of that tier matched, and
     * whether its candidate of that tier was matched. */
    radix_node_t *f_node[RADIX_TIERS] = {NULL};
    bool f_full[RADIX_TIERS] = {false};
    while (i < want) {
        if (n->n_children == 0)
            break; /* no hash, no probe: nothing below */
        const uint32_t *q = tokens + i * bt;
        if (!have_h)
            h = t->hash(q, bt, end_hash(t, n));
        radix_node_t *child = radix__child_find(t, n, h, q);
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
        for (uint32_t q = 0; q < t->n_tiers; q++) {
            if (child->tlen[q] > 0) {
                f_node[q] = child;
                f_full[q] = k >= tier_end(child, q);
            }
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
    if (t->n_tiers > 1 && i > 0) {
        /* the path's candidates of the upper tiers were stamped too, if
         * they lie above (the lowest tier's is the last block, done) */
        for (uint32_t q = 0; q + 1 < t->n_tiers; q++)
            if (f_node[q] && f_full[q] && !(f_node[q] == n && pos == last_pos(n)))
                radix__refresh_q(t, f_node[q], (int)q, true);
        size_t k1 = i, k2 = i;
        while (k1 > 0 && in_lower(t, ids[k1 - 1]))
            k1--;
        while (t->n_tiers > 2 && k2 > k1 && tier_of(t, ids[k2 - 1]) == 2)
            k2--;
        ns->st.t2_hit_tokens += (uint64_t)(i - k1) * bt;
        ns->st.t3_hit_tokens += (uint64_t)(i - k2) * bt;
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
    radix_node_t *m = radix__node_new(t, cap);
    if (!m)
        return NULL;
    radix_slot_t *slot = slot_of(t, n);
    memcpy(m, n, sizeof(*m));
    m->cap = cap;
    m->first = 0;
    recs_copy(t, m, 0, n, n->first, n->len);
    for (uint32_t k = 0; k < m->len; k++) {
        uint32_t id = *rec_id(m, k);
        t->by_node[id] = m;
        t->by_pos[id] = k;
    }
    slot->node = m;
    radix__node_free(t, n);
    return m;
}

/* Splits n after record `pos`: the records up to pos move to `upper`, which
 * takes n's place under n's parent; n keeps the rest, its children and its
 * queue position (its last block does not change). */
static void node_split(radix_tree_t *t, radix_node_t *n, uint32_t pos, radix_node_t *upper)
{
    uint32_t j = pos - n->first + 1;
    radix_slot_t *slot = slot_of(t, n);
    upper->parent = n->parent;
    upper->depth = n->depth;
    upper->hits = n->hits;
    upper->full_stamp = n->full_stamp;
    upper->full_hits = n->full_hits;
    upper->ns = n->ns;
    upper->n_children = 1;
    upper->len = j;
    /* n's candidate of a tier moves up unless it lies below the split */
    for (uint32_t q = 0; q < RADIX_TIERS; q++)
        if (n->tlen[q] > 0 && tier_end(n, q) <= j)
            radix__unqueue(t, n, (int)q);
    uint32_t left = j;
    for (uint32_t q = 0; q < RADIX_TIERS; q++) {
        upper->tlen[q] = n->tlen[q] < left ? n->tlen[q] : left;
        left -= upper->tlen[q];
        n->tlen[q] -= upper->tlen[q];
        upper->tchildren[q] = 0;
    }
    upper->tchildren[tier_of(t, *rec_id(n, n->first + j))] = 1; /* n, from its first block on */
    recs_copy(t, upper, 0, n, n->first, j);
    for (uint32_t k = 0; k < j; k++) {
        uint32_t id = *rec_id(upper, k);
        t->by_node[id] = upper;
        t->by_pos[id] = k;
    }
    slot->node = upper; /* same key, same table: same parent, same first block */
    n->first += j;
    n->len -= j;
    n->depth += j;
    n->parent = upper;
    slot_put(t, n);
    t->ns[n->ns]->n_nodes++;
}

/* Writes new blocks i .. i+m-1, of tier `tier`, into records [base, base+m)
 * of n. */
static void fill_recs(radix_tree_t *t, radix_ns_t *ns, radix_node_t *n, uint32_t base, uint64_t h,
                      const uint32_t *tokens, const uint32_t *ids, size_t i, size_t m, bool pin,
                      uint64_t tick, uint32_t *canonical, uint32_t tier)
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
    *radix__tier_count(ns, tier) += (uint32_t)m;
    if (tier == 0) {
        ns->st.inserted_blocks += m;
        t->cached += (uint32_t)m;
        return;
    }
    ns->st.restored_blocks += m;
    t->lower[tier].cached += (uint32_t)m;
    for (size_t k = 0; k < m; k++) { /* off the free stack: swap with its top */
        uint32_t id = ids[i + k], at = t->free_at[id - t->cfg.max_blocks];
        uint32_t top = t->lower[tier].free[--t->lower[tier].n_free];
        t->lower[tier].free[at] = top;
        t->free_at[top - t->cfg.max_blocks] = at;
        t->free_at[id - t->cfg.max_blocks] = UINT32_MAX;
    }
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

/* Arguments of radix_insert and radix_insert_after. */
static int insert_args(const radix_tree_t *t, uint32_t ns_id, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t n_ids,
                       const uint32_t *canonical, const size_t *n_done)
{
    if (!t || !n_done)
        return KVS_EINVAL;
    if ((n_tokens > 0 && !tokens) || (n_ids > 0 && (!ids || !canonical)) ||
        n_ids > n_tokens / t->cfg.block_tokens)
        return KVS_EINVAL;
    for (size_t k = 0; k < n_ids; k++)
        if (ids[k] >= t->cfg.max_blocks)
            return KVS_EINVAL;
    return ns_live(t, ns_id) ? 0 : KVS_ENONS;
}

int radix_insert(radix_tree_t *t, uint32_t ns_id, const uint32_t *tokens, size_t n_tokens,
                 const uint32_t *ids, size_t n_ids, bool pin, uint32_t *canonical, size_t *n_done)
{
    if (n_done)
        *n_done = 0;
    int rc = insert_args(t, ns_id, tokens, n_tokens, ids, n_ids, canonical, n_done);
    if (rc != 0)
        return rc;
    return radix__insert_tier(t, ns_id, RADIX_NO_BLOCK, tokens, n_tokens, ids, n_ids, 0, pin,
                              canonical, n_done);
}

int radix_insert_after(radix_tree_t *t, uint32_t ns_id, uint32_t after, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t n_ids, bool pin,
                       uint32_t *canonical, size_t *n_done)
{
    if (n_done)
        *n_done = 0;
    int rc = insert_args(t, ns_id, tokens, n_tokens, ids, n_ids, canonical, n_done);
    if (rc != 0)
        return rc;
    if (after != RADIX_NO_BLOCK) {
        if (after >= t->id_end || !t->by_node[after] || t->by_node[after] == &radix__mark)
            return KVS_ENOTFOUND;
        if (t->by_node[after]->ns != ns_id || in_lower(t, after))
            return KVS_EBADSTATE;
    }
    return radix__insert_tier(t, ns_id, after, tokens, n_tokens, ids, n_ids, 0, pin, canonical,
                              n_done);
}

/* radix_insert for tier 0 (the caller's pool ids: a cached block of a lower
 * tier at a position is upgraded to the caller's tier-1 id, a quota
 * applies), radix_restore for a lower tier (cached blocks stay as they are,
 * in a tier no lower than `tier`). Arguments checked by the callers. */
int radix__insert_tier(radix_tree_t *t, uint32_t ns_id, uint32_t from, const uint32_t *tokens,
                       size_t n_tokens, const uint32_t *ids, size_t n_ids, uint32_t tier, bool pin,
                       uint32_t *canonical, size_t *n_done)
{
    (void)n_tokens; /* checked by the callers: n_ids blocks of tokens */
    int rc = 0;
    radix_ns_t *ns = t->ns[ns_id];
    uint32_t bt = t->cfg.block_tokens;
    /* Blocks already cached: duplicates. */
    radix_cursor_t c = {ns->root, 0};
    uint64_t tick;
    if (from == RADIX_NO_BLOCK) {
        tick = ++t->tick;
    } else {
        /* A piece of a longer insert: its blocks are used as the block
         * they follow was, no later (a block is never used more recently
         * than its parent: each walk starts at the root). */
        c = (radix_cursor_t){t->by_node[from], t->by_pos[from]};
        tick = rec_stamp(c.node, c.pos);
    }
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
        bool upgrade = tier == 0 && in_lower(t, id);
        if (is_busy(t, id) || (upgrade && *rec_ref(next.node, next.pos) > 0) ||
            (pin && *rec_ref(next.node, next.pos) >= RADIX_MAX_PINS) ||
            (!upgrade && tier_of(t, id) > tier)) {
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
            /* The caller's tier-1 copy replaces the lower one. */
            lower_push(t, radix__retier(t, c.node, c.pos, ids[i], false));
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
        radix__refresh_at(t, c.node, c.pos);
    if (rc)
        goto done;

    /* New blocks: up to the first id that is cached (or repeated). */
    size_t m = 0;
    while (i + m < n_ids && !id_taken(t, ids[i + m]) &&
           (tier == 0 || t->free_at[ids[i + m] - t->cfg.max_blocks] != UINT32_MAX)) {
        t->by_node[ids[i + m]] = &radix__mark;
        m++;
    }
    for (size_t k = 0; k < m; k++)
        t->by_node[ids[i + k]] = NULL;
    if (i + m < n_ids)
        rc = KVS_EEXIST;
    if (m == 0)
        goto done;

    uint32_t quota = tier == 0 ? ns->st.quota : 0;
    if (quota > 0 && ns->st.cached_blocks + m > quota) {
        /* Evict the namespace's own LRU leaves, never the block we attach to. */
        if (!is_root(c.node)) {
            t->guard = c.node;
            t->guard_pos = c.pos;
            if (has_cand(c.node, Q_T1) && cand_pos(c.node, Q_T1) == c.pos)
                radix__unqueue(t, c.node, Q_T1);
        }
        /* Only tier-1 leaves: a candidate with tier-2 blocks below it would
         * have to be demoted, which takes a copy (radix_demote). */
        radix_node_t *v;
        while (ns->st.cached_blocks + m > quota && (v = radix__candidate(t, ns, Q_T1)) &&
               v->n_children == 0 && v->tlen[0] == v->len)
            radix__evict_leaf(t, v, Q_T1, EVICT_QUOTA);
        t->guard = NULL;
        if (!is_root(c.node))
            radix__refresh_at(t, c.node, c.pos);
        if (ns->st.cached_blocks + m > quota) {
            m = ns->st.cached_blocks < quota ? quota - ns->st.cached_blocks : 0;
            rc = KVS_EQUOTA;
            if (m == 0)
                goto done;
        }
    }

    int arc = slot_reserve(t, 2);
    if (arc == 0)
        arc = radix__heap_reserve(t, ns, (size_t)ns->n_nodes + 2);
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
            radix__make_unevictable(t, n);
            radix_node_t *bigger = node_resize(t, n, (uint32_t)want);
            if (!bigger) {
                refresh(t, n, true);
                rc = KVS_ENOMEM;
                goto done;
            }
            n = bigger;
        }
        fill_recs(t, ns, n, n->first + n->len, h, tokens, ids, i, m, pin, tick, canonical, tier);
        n->len += (uint32_t)m;
        n->tlen[tier] += (uint32_t)m;
        refresh(t, n, true);
    } else {
        radix_node_t *leaf = radix__node_new(t, (uint32_t)m);
        radix_node_t *upper = NULL;
        if (leaf && !at_end)
            upper = radix__node_new(t, c.pos - n->first + 1);
        if (!leaf || (!at_end && !upper)) {
            if (leaf)
                radix__node_free(t, leaf);
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
        fill_recs(t, ns, leaf, 0, h, tokens, ids, i, m, pin, tick, canonical, tier);
        leaf->len = (uint32_t)m;
        leaf->tlen[tier] = (uint32_t)m;
        slot_put(t, leaf);
        ns->n_nodes++;
        n->n_children++;
        n->tchildren[tier]++;
        refresh(t, n, false);
        refresh(t, leaf, true);
    }
    i += m;
done:
    *n_done = i;
    return rc;
}

/* ---- pins and per-block queries ------------------------------------------ */

int radix_pin(radix_tree_t *t, uint32_t block_id)
{
    if (!t || block_id >= t->id_end)
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
    if (!t || block_id >= t->id_end)
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
    if (!t || !refcount || block_id >= t->id_end)
        return KVS_EINVAL;
    const radix_node_t *n = t->by_node[block_id];
    if (!n)
        return KVS_ENOTFOUND;
    *refcount = *rec_ref(n, t->by_pos[block_id]);
    return 0;
}

int radix_block_hash(const radix_tree_t *t, uint32_t block_id, uint64_t *hash)
{
    if (!t || !hash || block_id >= t->id_end)
        return KVS_EINVAL;
    const radix_node_t *n = t->by_node[block_id];
    if (!n || n == &radix__mark)
        return KVS_ENOTFOUND;
    *hash = *rec_hash(n, t->by_pos[block_id]);
    return 0;
}

int radix_block_chain(const radix_tree_t *t, uint32_t id, uint64_t *hash, uint64_t *parent_hash,
                      const uint32_t **tokens)
{
    if (!t || !hash || !parent_hash || !tokens || id >= t->id_end)
        return KVS_EINVAL;
    const radix_node_t *n = t->by_node[id];
    if (!n || n == &radix__mark)
        return KVS_ENOTFOUND;
    uint32_t pos = t->by_pos[id];
    *hash = *rec_hash(n, pos);
    *parent_hash = pos > n->first ? *rec_hash(n, pos - 1) : end_hash(t, n->parent);
    *tokens = rec_tokens(t, n, pos);
    return 0;
}

/* ---- counters -------------------------------------------------------------- */

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
    size_t old = t->old_slots ? t->old_mask + 1 : 0;
    size_t bytes = sizeof(*t) + t->node_bytes + (t->slot_mask + 1 + old) * sizeof(radix_slot_t) +
                   ((size_t)t->id_end) * (sizeof(*t->by_node) + sizeof(*t->by_pos)) +
                   (size_t)t->ns_cap * sizeof(*t->ns) + t->exp_cap * sizeof(*t->exp);
    for (uint32_t i = 0; i < t->n_ns; i++)
        if (t->ns[i])
            bytes += sizeof(radix_ns_t) + (t->ns[i]->q[Q_T1].heap_cap + t->ns[i]->q[Q_T2].heap_cap +
                                           t->ns[i]->q[Q_T3].heap_cap) *
                                              sizeof(radix_heap_entry_t);
    if (t->n_tiers > 1) /* the free stacks, free_at and peer */
        bytes += ((size_t)t->id_end - t->cfg.max_blocks) * 2 * sizeof(uint32_t) +
                 ((size_t)t->id_end) * sizeof(*t->peer);
    return bytes;
}
