/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check.c: the invariant checker (radix_check), run by the tests after
 * every step: links, counts, hashes, queues and tiers, recomputed from
 * the nodes and compared with what the tree keeps.
 */
#include "radix_internal.h"

#include <stdlib.h>

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
            radix__node_index(nodes, n, l) == SIZE_MAX)
            return false;
        if (prev && !goes_before(prev, l, q))
            return false;
        if (t->cfg.policy == RADIX_EVICT_LRU && l->q[q].key != radix__queue_key(t, l, q))
            return false;
        prev = l;
    }
    if (Q->tail != prev || Q->heap_len > Q->heap_cap)
        return false;
    size_t live = 0;
    for (size_t i = 0; i < Q->heap_len; i++) {
        if (i > 0 && entry_before(&Q->heap[i], &Q->heap[(i - 1) / 2]))
            return false;
        const radix_node_t *hn = radix__heap_entry_node(t, &Q->heap[i], q);
        if (hn) {
            if (hn->ns != k)
                return false;
            live++;
        }
    }
    if (live != Q->heap_live || live != heap_nodes)
        return false;
    size_t nodes_k = t->ns[k]->n_nodes;
    bool has_heap = q < (int)t->n_tiers;
    return !has_heap || Q->heap_cap >= 2 * nodes_k + 34 || nodes_k == 0;
}

/* One child table of mask + 1 slots: each node's hash is its first
 * block's and it is reachable from its home slot (only tombstones or
 * nodes on the way); tombstones only where `old`, whose probes skip the
 * slots moved, [0, skip). Returns the nodes in it, or SIZE_MAX when one of
 * these fails. */
static size_t check_table(const radix_slot_t *tab, size_t mask, bool old, size_t skip)
{
    size_t nodes = 0;
    for (size_t i = 0; i <= mask; i++) {
        const radix_slot_t *s = &tab[i];
        if (!s->node)
            continue;
        if (s->node == RADIX_TOMB) {
            if (!old)
                return SIZE_MAX;
            continue;
        }
        if (s->node->parent == NULL || s->hash != *rec_hash(s->node, s->node->first))
            return SIZE_MAX;
        if (i < skip)
            return SIZE_MAX;
        size_t j = slot_home_in(mask, s->hash, s->node->parent);
        for (j = j < skip ? skip : j; j != i;) {
            if (!tab[j].node)
                return SIZE_MAX;
            j = (j + 1) & mask;
            j = j < skip ? skip : j;
        }
        nodes++;
    }
    return nodes;
}

int radix_check(const radix_tree_t *t)
{
    if (!t)
        return KVS_EINVAL;
    int rc = KVS_EINTERNAL;
    radix_node_t **nodes = NULL;
    /* per node / namespace, RADIX_TIERS counters each: tier k at [i * RADIX_TIERS + k] */
    uint32_t *children = NULL, *tchildren = NULL, *ns_tier = NULL, *ns_pinned = NULL,
             *ns_nodes = NULL, *ns_heap = NULL, *ns_root_children = NULL, *ns_root_t = NULL;
    uint8_t *lower_seen = NULL; /* per lower id: 1 cached, 2 held by a move, 3 free */
    size_t n = 0;
    uint32_t bt = t->cfg.block_tokens;
    uint32_t max_ids = t->id_end;
    uint32_t n_lower = t->id_end - t->cfg.max_blocks;
    const size_t T = RADIX_TIERS;
    size_t timed = 0; /* blocks with a live timed hint */
    if (radix__collect_nodes(t, RADIX_NS_ALL, &nodes, &n))
        return KVS_ENOMEM;
    children = t_calloc(t, n + 1, sizeof(*children));
    tchildren = t_calloc(t, T * (n + 1), sizeof(*tchildren));
    ns_tier = t_calloc(t, T * (t->n_ns + 1), sizeof(uint32_t));
    ns_pinned = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_nodes = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_heap = t_calloc(t, T * (t->n_ns + 1), sizeof(uint32_t));
    ns_root_children = t_calloc(t, t->n_ns + 1, sizeof(uint32_t));
    ns_root_t = t_calloc(t, T * (t->n_ns + 1), sizeof(uint32_t));
    lower_seen = t_calloc(t, (size_t)n_lower + 1, 1);
    if (!children || !tchildren || !ns_tier || !ns_pinned || !ns_nodes || !ns_heap ||
        !ns_root_children || !ns_root_t || !lower_seen) {
        rc = KVS_ENOMEM;
        goto out;
    }
    CHECK(t->slot_used + t->old_used == n && t->guard == NULL);

    /* Tables: every entry reachable from its home slot, key = first block;
     * tombstones only in the old table; each table holds what it counts. */
    CHECK(check_table(t->slots, t->slot_mask, false, 0) == t->slot_used);
    if (t->old_slots) {
        CHECK(t->old_used > 0 && t->old_next <= t->old_mask + 1 && t->old_mask < t->slot_mask);
        CHECK(check_table(t->old_slots, t->old_mask, true, t->old_next) == t->old_used);
        /* the slots before the cursor have all moved: empty */
        for (size_t i = 0; i < t->old_next; i++)
            CHECK(!t->old_slots[i].node);
    } else {
        CHECK(t->old_used == 0);
    }

    size_t node_bytes = 0;
    uint32_t tier_cached[RADIX_TIERS] = {0}, pinned = 0, busy = 0;
    uint32_t live = 0;
    for (uint32_t k = 0; k < t->n_ns; k++) {
        if (!t->ns[k])
            continue;
        live++;
        const radix_node_t *root = t->ns[k]->root;
        CHECK(root->parent == NULL && root->len == 0 && root->ns == k);
        for (size_t q = 0; q < T; q++)
            CHECK(root->q[q].where == WHERE_NONE);
        node_bytes += sizeof(radix_node_t) + (size_t)root->cap * t->rec_bytes;
    }
    for (size_t i = 0; i < n; i++) {
        const radix_node_t *node = nodes[i];
        const radix_node_t *parent = node->parent;
        CHECK(ns_live(t, node->ns) && parent && parent->ns == node->ns);
        CHECK(node->len >= 1 && (size_t)node->first + node->len <= node->cap);
        CHECK(tier_end(node, RADIX_TIERS - 1) == node->len);
        for (uint32_t k = t->n_tiers; k < RADIX_TIERS; k++)
            CHECK(node->tlen[k] == 0);
        /* The tiers are in order towards the root: the first block's tier
         * is no higher than the parent's last block's. */
        uint32_t first_tier = tier_of(t, *rec_id(node, node->first));
        CHECK(is_root(parent) || last_tier(parent) <= first_tier);
        node_bytes += sizeof(radix_node_t) + (size_t)node->cap * t->rec_bytes;
        ns_nodes[node->ns]++;
        if (is_root(parent)) {
            CHECK(parent == t->ns[node->ns]->root && node->depth == 0);
            ns_root_children[node->ns]++;
            ns_root_t[T * node->ns + first_tier]++;
        } else {
            size_t p = radix__node_index(nodes, n, parent);
            CHECK(p != SIZE_MAX);
            children[p]++;
            tchildren[T * p + first_tier]++;
            CHECK(node->depth == parent->depth + parent->len);
        }
        /* Siblings are distinct: the probe finds this node for its own block. */
        CHECK(radix__child_find(t, parent, *rec_hash(node, node->first),
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
            uint32_t tier = tier_of(t, id);
            CHECK(k >= node->first + (tier ? tier_end(node, tier - 1) : 0) &&
                  k < node->first + tier_end(node, tier));
            CHECK(t->band_of[id] == prio_band(block_prio(t, id, node->ns)));
            uint32_t hb = t->hint_base[id], ht = t->hint_timed[id];
            timed += ht != RADIX_PRIO_NONE;
            CHECK((hb == RADIX_PRIO_NONE || hb <= RADIX_PRIO_MAX) &&
                  (ht == RADIX_PRIO_NONE || (ht <= RADIX_PRIO_MAX && t->hint_until[id] > 0)));
            tier_cached[tier]++;
            ns_tier[T * node->ns + tier]++;
            if (tier > 0)
                lower_seen[id - t->cfg.max_blocks] = 1;
            if (t->peer && t->peer[id] != UINT32_MAX) {
                /* busy: its other id is in another tier and not cached */
                uint32_t peer = t->peer[id];
                uint32_t ptier = tier_of(t, peer);
                busy++;
                CHECK(peer < max_ids && ptier != tier && !t->by_node[peer]);
                /* a demotion (one tier down, or up to tier 1 at once) marks
                 * its old id as leaving */
                CHECK(ptier > tier ? tier == 0 : (ptier + 1 == tier && t->peer[peer] == id));
                if (ptier > 0) {
                    CHECK(!lower_seen[peer - t->cfg.max_blocks]);
                    lower_seen[peer - t->cfg.max_blocks] = 2;
                }
            }
            if (*rec_ref(node, k) > 0) {
                pinned++;
                ns_pinned[node->ns]++;
            }
        }
        for (size_t q = 0; q < T; q++)
            if (node->q[q].where == WHERE_HEAP)
                ns_heap[T * node->ns + q]++;
    }
    for (size_t i = 0; i < n; i++) {
        CHECK(nodes[i]->n_children == children[i]);
        for (size_t q = 0; q < T; q++)
            CHECK(nodes[i]->tchildren[q] == tchildren[T * i + q]);
        for (int q = 0; q < RADIX_TIERS; q++) {
            bool ev = radix__queueable(t, nodes[i], q) && q < (int)t->n_tiers;
            CHECK(ev == (nodes[i]->q[q].where != WHERE_NONE));
            if (nodes[i]->q[q].where != WHERE_LIST)
                CHECK(!nodes[i]->q[q].prev && !nodes[i]->q[q].next);
        }
    }
    CHECK(node_bytes == t->node_bytes);
    uint32_t all_cached = tier_cached[0];
    CHECK(tier_cached[0] == t->cached && pinned == t->pinned);
    for (uint32_t k = 1; k < RADIX_TIERS; k++) {
        CHECK(tier_cached[k] == (k < t->n_tiers ? t->lower[k].cached : 0));
        all_cached += tier_cached[k];
    }
    CHECK(busy == t->n_busy);
    uint32_t mapped = 0;
    for (uint32_t id = 0; id < max_ids; id++)
        if (t->by_node[id]) {
            CHECK(t->by_node[id] != &radix__mark);
            mapped++;
        }
    CHECK(mapped == all_cached);
    /* Lower ids: each free, cached, or held by a move being copied out. */
    for (uint32_t k = 1; k < t->n_tiers; k++) {
        CHECK(t->lower[k].n_free + t->lower[k].cached + t->lower[k].inflight ==
              t->base[k + 1] - t->base[k]);
        for (uint32_t i = 0; i < t->lower[k].n_free; i++) {
            uint32_t id = t->lower[k].free[i];
            CHECK(id >= t->base[k] && id < t->base[k + 1] && !lower_seen[id - t->cfg.max_blocks]);
            CHECK(t->free_at[id - t->cfg.max_blocks] == i);
            lower_seen[id - t->cfg.max_blocks] = 3;
        }
    }
    for (uint32_t i = 0; i < n_lower; i++)
        CHECK(lower_seen[i] != 0);

    /* Deleted ids are empty slots below n_ns, the last slot is live. */
    CHECK(live == t->n_live && (t->n_ns == 0 || t->ns[t->n_ns - 1]));
    for (uint32_t k = 0; k < t->n_ns; k++) {
        const radix_ns_t *ns = t->ns[k];
        if (!ns)
            continue;
        CHECK(ns->st.cached_blocks == ns_tier[T * k] && ns->st.pinned_blocks == ns_pinned[k]);
        CHECK(ns->st.tier2_blocks == ns_tier[T * k + 1] &&
              ns->st.tier3_blocks == ns_tier[T * k + 2]);
        CHECK(ns->st.evicted_blocks ==
              ns->st.evicted_own + ns->st.evicted_others + ns->st.evicted_quota);
        uint64_t by_band = 0, ev_band = 0;
        for (int b = 0; b < RADIX_PRIO_BANDS; b++) {
            by_band += ns->st.cached_by_band[b];
            ev_band += ns->st.evicted_by_band[b];
        }
        CHECK(by_band == ns->st.cached_blocks + ns->st.tier2_blocks + ns->st.tier3_blocks &&
              ev_band == ns->st.evicted_blocks);
        CHECK(ns->st.demoted_blocks == ns->st.demoted_own + ns->st.demoted_others);
        CHECK(ns->n_nodes == ns_nodes[k] && ns->root->n_children == ns_root_children[k]);
        for (size_t q = 0; q < T; q++) {
            CHECK(ns->root->tchildren[q] == ns_root_t[T * k + q]);
            CHECK(check_queue(t, k, (int)q, nodes, n, ns_heap[T * k + q]));
        }
    }
    CHECK(timed == t->exp_live);
    rc = 0;
    goto out;
bad:
    rc = KVS_EINTERNAL;
out:
    free(nodes);
    free(children);
    free(tchildren);
    free(ns_tier);
    free(ns_pinned);
    free(ns_nodes);
    free(ns_heap);
    free(ns_root_children);
    free(ns_root_t);
    free(lower_seen);
    return rc;
}

int radix_check_line(void)
{
    return radix_check_failed_line;
}
