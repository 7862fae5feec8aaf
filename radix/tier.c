/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier.c: blocks moving between tier 1 (the pool) and tier 2 (host
 * memory) (radix.h, Tiers): demotion, promotion, the end of a copy, and
 * the tier counters. Which block goes down is evict.c's choice
 * (radix__evict_choice).
 */
#include "radix_internal.h"

/* Moves the block at record pos of n (the first tier-2 block of n, or its
 * last tier-1 block) to the other tier under new_id and returns its old id.
 * busy: it is being copied, with the old id as its peer, until
 * radix_copy_done. The caller checked that tier 1 stays closed towards the
 * root (a block in tier 1 only below blocks in tier 1). */
uint32_t radix__retier(radix_tree_t *t, radix_node_t *n, uint32_t pos, uint32_t new_id, bool busy)
{
    radix_ns_t *ns = t->ns[n->ns];
    uint32_t old_id = *rec_id(n, pos);
    bool up = in_tier2(t, old_id);
    radix__make_unevictable(t, n);
    t->by_node[old_id] = NULL;
    t->by_node[new_id] = n;
    t->by_pos[new_id] = pos;
    *rec_id(n, pos) = new_id;
    radix__move_hints(t, old_id, new_id);
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

int radix_demote(radix_tree_t *t, uint32_t for_ns, size_t n, radix_move_t *moves, size_t *n_moved,
                 size_t *n_dropped)
{
    if (!t || !n_moved || !n_dropped || (n > 0 && !moves) || t->t2_blocks == 0)
        return KVS_EINVAL;
    *n_moved = *n_dropped = 0;
    if (for_ns != RADIX_NS_ANY && for_ns >= t->n_ns)
        return KVS_ENONS;
    while (*n_moved + *n_dropped < n) {
        radix_node_t *v = radix__evict_choice(t, for_ns, Q_T1);
        if (!v)
            break;
        evict_cause_t cause = v->ns == for_ns ? EVICT_OWN : EVICT_OTHERS;
        if (t->t2_n_free == 0) {
            /* Tier 2 makes room by the same rule, for the demoted block's
             * namespace. */
            radix_node_t *d = radix__evict_choice(t, v->ns, Q_T2);
            if (d) {
                radix__evict_leaf(t, d, Q_T2, d->ns == v->ns ? EVICT_OWN : EVICT_OTHERS);
                continue; /* the drop may have changed the first candidate */
            }
        }
        if (t->t2_n_free == 0) {
            if (v->n_children > 0 || v->t1_len < v->len)
                break; /* tier 2 is all pinned or being copied */
            radix__evict_leaf(t, v, Q_T1, cause);
            (*n_dropped)++;
            continue;
        }
        uint32_t to = t->t2_free[--t->t2_n_free];
        radix_ns_t *ns = t->ns[v->ns];
        radix_move_t *mv = &moves[(*n_moved)++];
        mv->ns = v->ns;
        mv->to = to;
        mv->from = radix__retier(t, v, cand_pos(v, Q_T1), to, true);
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
    radix__retier(t, n, pos, block_id, true);
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
    radix__retier(t, n, pos, back, false);
    if (demotion) /* its tier-2 id was never written: free again */
        t->t2_free[t->t2_n_free++] = id;
    *peer = back;
    return 0;
}
