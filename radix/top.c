/* SPDX-License-Identifier: Apache-2.0 */
/*
 * top.c: the operator's walk (radix_top): every prefix with its hits and
 * subtree sums, ordered for a report. Its sorted node list also serves the
 * checker (check.c).
 */
#include "radix_internal.h"

#include <stdlib.h>
#include <string.h>

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (radix_node_t *const *)a;
    uintptr_t y = (uintptr_t) * (radix_node_t *const *)b;
    return (x > y) - (x < y);
}

/* Every non-root node (of namespace ns, or all), sorted by address so that a
 * parent's index is found by bsearch. *out is malloc'ed (may be NULL when
 * *n_out is 0). */
int radix__collect_nodes(const radix_tree_t *t, uint32_t ns, radix_node_t ***out, size_t *n_out)
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

size_t radix__node_index(radix_node_t *const *a, size_t n, const radix_node_t *node)
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
    rc = radix__collect_nodes(t, ns, &nodes, &n);
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
        row->tier2_blocks += node->len - node->tlen[0];
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
        size_t c = radix__node_index(nodes, n, node), p = radix__node_index(nodes, n, node->parent);
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
