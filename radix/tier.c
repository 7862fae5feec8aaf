/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier.c: blocks moving between the tiers (radix.h, Tiers): tier 1 (the
 * pool), tier 2 (host memory) and tier 3 (a local disk). Demotion goes one
 * tier down at a time, promotion straight back to tier 1; the end of a
 * copy; restores into a lower tier; the tier counters. Which block goes
 * down is evict.c's choice (radix__evict_choice), in each tier's queue.
 *
 * A node's records are in tier order (tlen[0] of tier 1, then tlen[1] of
 * tier 2, ...), so a move changes the tier of a block at a boundary of
 * those runs: a demotion takes the last block of tier k to tier k + 1, a
 * promotion the first block below tier 1 to tier 1.
 */
#include "radix_internal.h"

/* The namespace's count of blocks in tier k. */
uint32_t *radix__tier_count(radix_ns_t *ns, uint32_t k)
{
    return k == 0 ? &ns->st.cached_blocks : k == 1 ? &ns->st.tier2_blocks : &ns->st.tier3_blocks;
}

/* Moves the block at record pos of n (the first block of its node below
 * tier 1, or its last block of some tier) to new_id's tier and returns its
 * old id. busy: it is being copied, with the old id as its peer, until
 * radix_copy_done; an old lower id is held (inflight) until then. The
 * caller checked that the tiers stay in order towards the root. */
uint32_t radix__retier(radix_tree_t *t, radix_node_t *n, uint32_t pos, uint32_t new_id, bool busy)
{
    radix_ns_t *ns = t->ns[n->ns];
    uint32_t old_id = *rec_id(n, pos);
    uint32_t from = tier_of(t, old_id), to = tier_of(t, new_id);
    radix__make_unevictable(t, n);
    t->by_node[old_id] = NULL;
    t->by_node[new_id] = n;
    t->by_pos[new_id] = pos;
    *rec_id(n, pos) = new_id;
    radix__move_hints(t, old_id, new_id);
    if (busy) {
        t->peer[new_id] = old_id;
        if (to > from) /* a demotion: its old id is not free until copy done */
            t->peer[old_id] = new_id;
        if (from > 0)
            t->lower[from].inflight++;
        t->n_busy++;
    }
    n->tlen[from]--;
    n->tlen[to]++;
    (*radix__tier_count(ns, from))--;
    (*radix__tier_count(ns, to))++;
    if (from == 0)
        t->cached--;
    else
        t->lower[from].cached--;
    if (to == 0)
        t->cached++;
    else
        t->lower[to].cached++;
    if (pos == n->first) {
        n->parent->tchildren[from]--;
        n->parent->tchildren[to]++;
        refresh(t, n->parent, false);
    }
    refresh(t, n, false);
    return old_id;
}

/* Moves the tier-k candidate d one tier down, to a free id of tier k + 1
 * (the caller made sure there is one), as move *mv. */
static void demote_one(radix_tree_t *t, radix_node_t *d, uint32_t k, evict_cause_t cause,
                       radix_move_t *mv)
{
    radix_ns_t *ns = t->ns[d->ns];
    uint32_t to = lower_pop(t, k + 1);
    mv->ns = d->ns;
    mv->to = to;
    mv->from = radix__retier(t, d, cand_pos(d, (int)k), to, true);
    if (k > 0) {
        ns->st.demoted3_blocks++;
        return;
    }
    ns->st.demoted_blocks++;
    if (cause == EVICT_OWN)
        ns->st.demoted_own++;
    else
        ns->st.demoted_others++;
}

/* Whether n's candidate of queue k is the node's last block with nothing
 * below it: a leaf that can be dropped. */
static bool cand_is_leaf(const radix_node_t *n, uint32_t k)
{
    return n->n_children == 0 && cand_pos(n, (int)k) == last_pos(n);
}

/* Makes room in lower tier k for a block of namespace for_ns: 1 when a
 * free id is there now (a leaf of the lowest tier, or one with nothing
 * below, dropped for it), 0 when a move one tier down started that frees
 * one once copied (moves[(*n_moved)++]), -1 when nothing in tier k may go. */
static int make_room(radix_tree_t *t, uint32_t k, uint32_t for_ns, radix_move_t *moves,
                     size_t *n_moved)
{
    /* Never true (callers stay under n_tiers <= RADIX_TIERS), but said so
     * that gcc -O3 sees the recursion end within lower[] (-Warray-bounds). */
    if (k >= RADIX_TIERS)
        return -1;
    while (t->lower[k].n_free == 0) {
        radix_node_t *d = radix__evict_choice(t, for_ns, (int)k);
        if (!d)
            return -1;
        evict_cause_t cause = d->ns == for_ns ? EVICT_OWN : EVICT_OTHERS;
        if (k + 1 < t->n_tiers) {
            int below = make_room(t, k + 1, d->ns, moves, n_moved);
            if (below == 0)
                return 0;
            if (below == 1) {
                /* the room below may have changed the first candidate */
                d = radix__evict_choice(t, for_ns, (int)k);
                if (!d)
                    return -1;
                demote_one(t, d, k, d->ns == for_ns ? EVICT_OWN : EVICT_OTHERS,
                           &moves[(*n_moved)++]);
                return 0;
            }
            if (!cand_is_leaf(d, k))
                return -1; /* the tier below is all pinned or being copied */
        }
        radix__evict_leaf(t, d, (int)k, cause);
    }
    return 1;
}

int radix_demote(radix_tree_t *t, uint32_t for_ns, size_t n, radix_move_t *moves, size_t *n_moved,
                 size_t *n_dropped)
{
    if (!t || !n_moved || !n_dropped || (n > 0 && !moves) || t->n_tiers < 2)
        return KVS_EINVAL;
    *n_moved = *n_dropped = 0;
    if (for_ns != RADIX_NS_ANY && for_ns >= t->n_ns)
        return KVS_ENONS;
    while (*n_moved + *n_dropped < n) {
        radix_node_t *v = radix__evict_choice(t, for_ns, Q_T1);
        if (!v)
            break;
        int room = make_room(t, 1, v->ns, moves, n_moved);
        if (room == 0)
            continue; /* a move below counts: its id is free once copied */
        if (room == 1) {
            /* the room made may have changed the first candidate */
            v = radix__evict_choice(t, for_ns, Q_T1);
            if (!v)
                break;
            demote_one(t, v, 0, v->ns == for_ns ? EVICT_OWN : EVICT_OTHERS, &moves[(*n_moved)++]);
            continue;
        }
        if (!cand_is_leaf(v, 0))
            break; /* tier 2 is all pinned or being copied */
        radix__evict_leaf(t, v, Q_T1, v->ns == for_ns ? EVICT_OWN : EVICT_OTHERS);
        (*n_dropped)++;
    }
    return 0;
}

int radix_spill(radix_tree_t *t, uint32_t k, size_t n, radix_move_t *moves, size_t *n_moved)
{
    if (!t || !n_moved || (n > 0 && !moves) || k < 2 || k >= t->n_tiers)
        return KVS_EINVAL;
    uint32_t q = k - 1; /* the tier's queue */
    *n_moved = 0;
    while (*n_moved < n) {
        if (!radix__evict_choice(t, RADIX_NS_ANY, (int)q))
            break;
        /* the lowest tier makes room by dropping: 1 or -1 */
        if (make_room(t, q + 1, RADIX_NS_ANY, moves, n_moved) != 1)
            break;
        radix_node_t *d = radix__evict_choice(t, RADIX_NS_ANY, (int)q);
        if (!d)
            break;
        demote_one(t, d, q, EVICT_OTHERS, &moves[(*n_moved)++]);
    }
    return 0;
}

uint32_t radix_tier_leaving(const radix_tree_t *t, uint32_t k)
{
    if (!t || k < 2 || k > t->n_tiers)
        return 0;
    return t->lower[k - 1].inflight;
}

/* Whether the block at record pos of n is the first block of n below tier
 * 1 and its parent block is in tier 1: a promotion keeps the tier order. */
static bool promotable_at(const radix_node_t *n, uint32_t pos)
{
    const radix_node_t *p = n->parent;
    return pos == n->first + n->tlen[0] && (n->tlen[0] > 0 || is_root(p) || p->tlen[0] == p->len);
}

int radix_promote(radix_tree_t *t, uint32_t lower_id, uint32_t block_id)
{
    if (!t || t->n_tiers < 2 || !in_lower(t, lower_id) || lower_id >= t->id_end ||
        block_id >= t->cfg.max_blocks)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[lower_id];
    if (!n)
        return KVS_ENOTFOUND;
    if (id_taken(t, block_id))
        return KVS_EEXIST;
    uint32_t pos = t->by_pos[lower_id];
    if (is_busy(t, lower_id) || *rec_ref(n, pos) > 1)
        return KVS_EBUSY;
    if (!promotable_at(n, pos))
        return KVS_EINVAL;
    radix__retier(t, n, pos, block_id, true);
    t->ns[n->ns]->st.promoted_blocks++;
    return 0;
}

size_t radix_promotable(const radix_tree_t *t, const uint32_t *ids, size_t n)
{
    size_t k = 0;
    if (!t || !ids || t->n_tiers < 2)
        return 0;
    for (; k < n; k++) {
        uint32_t id = ids[k];
        if (!in_lower(t, id) || id >= t->id_end || !t->by_node[id] || is_busy(t, id) ||
            *rec_ref(t->by_node[id], t->by_pos[id]) != 1)
            break;
    }
    return k;
}

int radix_copy_done(radix_tree_t *t, uint32_t id, uint32_t *peer)
{
    if (!t || !peer || t->n_tiers < 2 || id >= t->id_end)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[id];
    if (!n || t->peer[id] == UINT32_MAX)
        return KVS_ENOTFOUND;
    *peer = t->peer[id];
    t->peer[id] = UINT32_MAX;
    t->n_busy--;
    uint32_t from = tier_of(t, *peer);
    if (tier_of(t, id) > from) /* a demotion: its old id is no longer leaving */
        t->peer[*peer] = UINT32_MAX;
    if (from > 0) { /* an old lower id is free again; a tier-1 one is the caller's */
        t->lower[from].inflight--;
        lower_push(t, *peer);
    }
    refresh(t, n, false);
    return 0;
}

int radix_lookup_uncount(radix_tree_t *t, uint32_t ns, size_t n_tokens, size_t n_blocks,
                         size_t n_tier2, size_t n_tier3)
{
    if (!t)
        return KVS_EINVAL;
    if (ns >= t->n_ns)
        return KVS_ENONS;
    radix_ns_stats_t *st = &t->ns[ns]->st;
    uint64_t bt = t->cfg.block_tokens;
    if (n_tier2 > n_blocks || n_tier3 > n_tier2 || st->lookups == 0 ||
        st->lookup_tokens < n_tokens || st->hit_tokens < n_blocks * bt ||
        st->t2_hit_tokens < n_tier2 * bt || st->t3_hit_tokens < n_tier3 * bt)
        return KVS_EINVAL;
    st->lookups--;
    st->lookup_tokens -= n_tokens;
    st->hit_tokens -= n_blocks * bt;
    st->t2_hit_tokens -= n_tier2 * bt;
    st->t3_hit_tokens -= n_tier3 * bt;
    return 0;
}

uint32_t radix_tier2_blocks(const radix_tree_t *t)
{
    return radix_tier_blocks(t, 2);
}

uint32_t radix_tier2_free(const radix_tree_t *t)
{
    return radix_tier_free(t, 2);
}

uint32_t radix_tier_blocks(const radix_tree_t *t, uint32_t k)
{
    if (!t || k == 0 || k > t->n_tiers)
        return 0;
    return k == 1 ? t->cached : t->lower[k - 1].cached;
}

uint32_t radix_tier_free(const radix_tree_t *t, uint32_t k)
{
    if (!t || k < 2 || k > t->n_tiers)
        return 0;
    return t->lower[k - 1].n_free;
}

uint32_t radix_tier_of(const radix_tree_t *t, uint32_t id)
{
    if (!t || id >= t->id_end)
        return 0;
    return tier_of(t, id) + 1;
}

int radix_block_peer(const radix_tree_t *t, uint32_t id, uint32_t *peer)
{
    if (!t || !peer || id >= t->id_end)
        return KVS_EINVAL;
    if (!t->peer || !t->by_node[id] || t->peer[id] == UINT32_MAX)
        return KVS_ENOTFOUND;
    *peer = t->peer[id];
    return 0;
}

uint32_t radix_busy_blocks(const radix_tree_t *t)
{
    return t ? t->n_busy : 0;
}

int radix_copy_undo(radix_tree_t *t, uint32_t id, uint32_t *peer)
{
    if (!t || !peer || t->n_tiers < 2 || id >= t->id_end)
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[id];
    if (!n || t->peer[id] == UINT32_MAX)
        return KVS_ENOTFOUND;
    uint32_t pos = t->by_pos[id], back = t->peer[id];
    uint32_t now = tier_of(t, id), was = tier_of(t, back);
    bool demotion = now > was;
    if (demotion) {
        /* Back up to tier `was`: the block before it must be in that tier
         * or above. */
        const radix_node_t *p = n->parent;
        uint32_t above = tier_end(n, was);
        if (pos != n->first + above || (above == 0 && !is_root(p) && tier_end(p, was) < p->len))
            return KVS_EBUSY;
    } else {
        /* Back down from tier 1 to tier `was`: nothing below it may be in a
         * tier above `was`. */
        bool last_t1 = pos == n->first + n->tlen[0] - 1;
        /* no records of the tiers between 1 and `was` after it ... */
        bool clear_below = tier_end(n, was - 1) == n->tlen[0];
        /* ... and, when it ends the node then, no child in those tiers */
        if (tier_end(n, was - 1) == n->len)
            for (uint32_t k = 0; k < was; k++)
                clear_below = clear_below && n->tchildren[k] == 0;
        if (!last_t1 || !clear_below)
            return KVS_EBUSY;
    }
    t->peer[id] = UINT32_MAX;
    t->n_busy--;
    if (demotion)
        t->peer[back] = UINT32_MAX;
    if (was > 0)
        t->lower[was].inflight--;
    radix__retier(t, n, pos, back, false);
    if (demotion) /* its new id was never written: free again */
        lower_push(t, id);
    *peer = back;
    return 0;
}

/* ---- restore -------------------------------------------------------------- */

int radix_restore(radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                  const uint32_t *ids, size_t n_ids, uint32_t *canonical, size_t *n_done)
{
    if (!t || !n_done)
        return KVS_EINVAL;
    *n_done = 0;
    if ((n_tokens > 0 && !tokens) || (n_ids > 0 && (!ids || !canonical)) ||
        n_ids > n_tokens / t->cfg.block_tokens || t->n_tiers < 2)
        return KVS_EINVAL;
    uint32_t k = n_ids > 0 && in_lower(t, ids[0]) && ids[0] < t->id_end ? tier_of(t, ids[0]) : 0;
    for (size_t i = 0; i < n_ids; i++)
        if (k == 0 || ids[i] < t->base[k] || ids[i] >= t->base[k + 1])
            return KVS_EINVAL;
    if (!ns_live(t, ns))
        return KVS_ENONS;
    return radix__insert_tier(t, ns, RADIX_NO_BLOCK, tokens, n_tokens, ids, n_ids, k, false,
                              canonical, n_done);
}
