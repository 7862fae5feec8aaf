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
    if (radix__collect_nodes(t, RADIX_NS_ALL, &nodes, &n))
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
            size_t p = radix__node_index(nodes, n, parent);
            CHECK(p != SIZE_MAX);
            children[p]++;
            t1_children[p] += node->t1_len > 0;
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
            bool ev = radix__queueable(t, nodes[i], q) && (q == Q_T1 || t->t2_blocks > 0);
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
            CHECK(t->by_node[id] != &radix__mark);
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
