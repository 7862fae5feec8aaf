/* SPDX-License-Identifier: Apache-2.0 */
/*
 * top.c: the operator's walk (radix_top): every prefix with its hits and
 * subtree sums, ordered for a report, in one piece or in bounded steps
 * (radix_top_begin: its diagram is below). The one-piece walk's sorted node
 * list also serves the checker (check.c).
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
    radix_node_t **a = t_malloc(t, (t->slot_used + t->old_used + 1) * sizeof(*a));
    if (!a)
        return KVS_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i <= t->slot_mask; i++) {
        radix_node_t *node = t->slots[i].node;
        if (node && (ns == RADIX_NS_ALL || node->ns == ns))
            a[n++] = node;
    }
    for (size_t i = 0; t->old_slots && i <= t->old_mask; i++) { /* while the table grows */
        radix_node_t *node = t->old_slots[i].node;
        if (node && node != RADIX_TOMB && (ns == RADIX_NS_ALL || node->ns == ns))
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

/* The listing's order: larger key (hits or blocks) first, then shorter
 * prefix, lower namespace, higher last block id. < 0 when x comes first. */
static int row_order(uint64_t kx, const radix_prefix_t *x, uint64_t ky, const radix_prefix_t *y)
{
    if (kx != ky)
        return kx > ky ? -1 : 1;
    if (x->tokens != y->tokens)
        return x->tokens < y->tokens ? -1 : 1;
    if (x->ns != y->ns)
        return x->ns < y->ns ? -1 : 1;
    return (x->last_block_id > y->last_block_id) - (x->last_block_id < y->last_block_id);
}

static int cmp_row(const void *a, const void *b)
{
    const radix_top_row_t *x = a, *y = b;
    return row_order(x->key, &x->row, y->key, &y->row);
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

/* ---- the walk in steps (radix_top_begin / step / rows / end) -------------
 *
 * Phases, each resumable between two steps:
 *
 *   FIND   the first empty slot of the child table: where the sweep starts
 *   SWEEP  every slot once, from there round the table (and on past its end
 *          to the next empty slot): each node of the walk's namespace
 *          becomes an entry with its own values and its parent's key
 *   LINK   each entry finds its parent's entry (a map lookup) and counts
 *          itself among its children
 *   SUM    entries whose children are all summed add their sums into
 *          their parent's, leaves first (a parent is ready when its count
 *          of pending children reaches 0)
 *   SELECT the best `max` entries by the order, in a bounded heap
 *   DONE   the rows, sorted as radix_top sorts them
 *
 * No node pointer outlives a step: an entry is keyed by what names its
 * prefix, (last block id, chained hash of its last block), and names its
 * parent the same way. A step ends only just past an empty slot, so that a
 * node sitting after the cursor then has its home slot after it too: the
 * table's backward-shift deletion never moves a node before its home, so a
 * node that stays is still after the cursor at the next step (except one
 * wrapping round the table's end, caught by the dedup of keys). */

enum { PH_FIND, PH_SWEEP, PH_LINK, PH_SUM, PH_SELECT, PH_DONE };

#define TOP_PAGE   4096u /* entries per page: the entries never move */
#define TOP_NONE   UINT32_MAX
#define TOP_SUMMED UINT32_MAX /* pending children: the entry is summed */

typedef struct top_entry {
    radix_prefix_t row;
    uint64_t hash;        /* chained hash of its last block (its key, with row.last_block_id) */
    uint64_t parent_hash; /* its parent's, when row.has_parent */
    uint32_t parent;      /* the parent's entry (LINK), TOP_NONE: none found */
    uint32_t pending;     /* children not summed yet; TOP_SUMMED once summed */
} top_entry_t;

struct radix_top_walk {
    uint32_t ns; /* RADIX_NS_ALL or one namespace */
    radix_order_t order;
    size_t max;
    int phase;
    uint32_t restarts; /* sweeps begun again after the table grew */
    /* SWEEP: the table's size when the sweep began, where it began, and
     * slots looked at so far */
    size_t mask, start, off;
    /* the entries, in pages; a map key -> entry index + 1 (0: empty) of
     * mask + 1 slots, for at most cap entries (half of it) */
    top_entry_t **pages;
    size_t n_pages, n, cap;
    uint32_t *map;
    size_t map_mask;
    uint64_t missed; /* nodes found with every entry taken */
    /* LINK / SUM / SELECT: the next entry, and SUM's climb up the parents */
    size_t i;
    uint32_t climb;
    /* SELECT: a heap of entry indices, the worst on top */
    uint32_t *heap;
    size_t heap_len;
    radix_prefix_t *rows; /* DONE: heap_len rows in order */
    /* each namespace's seed when the walk began (ns_live then: has_seed) */
    uint64_t *ns_seed;
    bool *ns_had;
    uint32_t n_ns;
    size_t bytes;
};

static top_entry_t *top_at(const radix_top_walk_t *w, size_t i)
{
    return &w->pages[i / TOP_PAGE][i % TOP_PAGE];
}

static size_t top_key_home(const radix_top_walk_t *w, uint32_t id, uint64_t hash)
{
    uint64_t x = hash ^ ((uint64_t)id * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (size_t)x & w->map_mask;
}

/* The entry of key (id, hash), or TOP_NONE; *slot: where it is or would go. */
static uint32_t top_find(const radix_top_walk_t *w, uint32_t id, uint64_t hash, size_t *slot)
{
    size_t i = top_key_home(w, id, hash);
    while (w->map[i]) {
        const top_entry_t *e = top_at(w, w->map[i] - 1);
        if (e->hash == hash && e->row.last_block_id == id) {
            *slot = i;
            return w->map[i] - 1;
        }
        i = (i + 1) & w->map_mask;
    }
    *slot = i;
    return TOP_NONE;
}

/* Frees the entries and the map (a new sweep's, or the walk's end). */
static void top_drop_entries(radix_top_walk_t *w)
{
    for (size_t p = 0; p < w->n_pages; p++)
        free(w->pages[p]);
    free(w->pages);
    free(w->map);
    w->pages = NULL;
    w->map = NULL;
    w->n_pages = w->n = w->cap = 0;
    w->bytes = 0;
}

/* Sizes the entries and the map for the table as it is now. */
static int top_sweep_init(const radix_tree_t *t, radix_top_walk_t *w)
{
    top_drop_entries(w);
    w->mask = t->slot_mask;
    w->map_mask = t->slot_mask;
    w->cap = (t->slot_mask + 1) / 2; /* the table holds at most this many nodes */
    size_t max_pages = (w->cap + TOP_PAGE - 1) / TOP_PAGE;
    w->map = t_calloc(t, w->map_mask + 1, sizeof(*w->map));
    w->pages = t_calloc(t, max_pages + 1, sizeof(*w->pages));
    if (!w->map || !w->pages) {
        top_drop_entries(w);
        return KVS_ENOMEM;
    }
    w->bytes = (w->map_mask + 1) * sizeof(*w->map) + (max_pages + 1) * sizeof(*w->pages);
    w->start = w->off = 0;
    w->missed = 0;
    return 0;
}

/* One node of the walk's namespace becomes an entry (unless its key has
 * one: it was seen already). Returns the work done. */
static size_t top_visit(const radix_tree_t *t, radix_top_walk_t *w, const radix_node_t *node,
                        int *rc)
{
    uint32_t id = *rec_id(node, last_pos(node));
    uint64_t hash = *rec_hash(node, last_pos(node));
    size_t slot;
    if (top_find(w, id, hash, &slot) != TOP_NONE)
        return 4;
    if (w->n >= w->cap) {
        w->missed++;
        return 4;
    }
    if (w->n % TOP_PAGE == 0) {
        top_entry_t *page = t_malloc(t, TOP_PAGE * sizeof(*page));
        if (!page) {
            *rc = KVS_ENOMEM;
            return 0;
        }
        w->pages[w->n_pages++] = page;
        w->bytes += TOP_PAGE * sizeof(*page);
    }
    top_entry_t *e = top_at(w, w->n);
    memset(e, 0, sizeof(*e));
    radix_prefix_t *row = &e->row;
    row->ns = node->ns;
    row->tokens = (node->depth + node->len) * t->cfg.block_tokens;
    row->hits = node->hits;
    row->last_used = rec_stamp(node, node->first);
    row->last_block_id = id;
    row->has_parent = !is_root(node->parent);
    if (row->has_parent) {
        row->parent_block_id = *rec_id(node->parent, last_pos(node->parent));
        e->parent_hash = *rec_hash(node->parent, last_pos(node->parent));
    }
    row->blocks = node->len;
    row->tier2_blocks = node->len - node->tlen[0];
    for (uint32_t k = node->first; k <= last_pos(node); k++)
        row->pins += *rec_ref(node, k);
    e->hash = hash;
    e->parent = TOP_NONE;
    w->map[slot] = (uint32_t)(w->n + 1);
    w->n++;
    return 8 + node->len / 16;
}

/* SWEEP for up to `budget` work; a step ends just past an empty slot. */
static int top_sweep(const radix_tree_t *t, radix_top_walk_t *w, size_t budget)
{
    size_t work = 0;
    int rc = 0;
    if (!w->map || t->slot_mask != w->mask) { /* the table grew: its slots moved */
        w->restarts += w->map != NULL;
        w->phase = PH_FIND;
        return top_sweep_init(t, w); /* on failure the next step tries again */
    }
    if (w->phase == PH_FIND) {
        while (w->start <= w->mask && t->slots[w->start].node) {
            w->start++;
            if (++work >= budget)
                return 0;
        }
        w->off = 1; /* the start itself is empty */
        w->phase = PH_SWEEP;
    }
    for (;;) {
        const radix_node_t *node = t->slots[(w->start + w->off) & w->mask].node;
        w->off++;
        if (!node) {
            if (w->off > w->mask + 1) { /* round, and past the end's run of nodes */
                w->phase = PH_LINK;
                w->i = 0;
                return 0;
            }
            if (++work >= budget)
                return 0;
            continue;
        }
        if (w->ns == RADIX_NS_ALL || node->ns == w->ns)
            work += top_visit(t, w, node, &rc);
        else
            work++;
        if (rc) {
            w->off--; /* that node again at the next step */
            return rc;
        }
    }
}

/* LINK: each entry counts itself among its parent's pending children. */
static void top_link(radix_top_walk_t *w, size_t budget)
{
    for (size_t work = 0; w->i < w->n && work < budget; w->i++, work += 4) {
        top_entry_t *e = top_at(w, w->i);
        if (!e->row.has_parent)
            continue;
        size_t slot;
        e->parent = top_find(w, e->row.parent_block_id, e->parent_hash, &slot);
        if (e->parent != TOP_NONE)
            top_at(w, e->parent)->pending++;
    }
    if (w->i == w->n) {
        w->phase = PH_SUM;
        w->i = 0;
        w->climb = TOP_NONE;
    }
}

/* Adds entry x's sums into its parent; returns the parent when that was
 * its last pending child and it lies before the scan (the scan would not
 * come back to it), else TOP_NONE. */
static uint32_t top_sum_one(radix_top_walk_t *w, uint32_t x)
{
    top_entry_t *e = top_at(w, x);
    e->pending = TOP_SUMMED;
    if (e->parent == TOP_NONE)
        return TOP_NONE;
    top_entry_t *p = top_at(w, e->parent);
    p->row.blocks += e->row.blocks;
    p->row.pins += e->row.pins;
    p->row.tier2_blocks += e->row.tier2_blocks;
    if (--p->pending == 0 && e->parent < w->i)
        return e->parent;
    return TOP_NONE;
}

/* SUM: children before parents, each entry once. Entries on a cycle of
 * parent keys (possible only in an index that changed during the walk)
 * never get ready and keep their own sums. */
static void top_sum(radix_top_walk_t *w, size_t budget)
{
    size_t work = 0;
    while (work < budget) {
        if (w->climb != TOP_NONE) {
            w->climb = top_sum_one(w, w->climb);
            work += 4;
            continue;
        }
        if (w->i == w->n) {
            w->phase = PH_SELECT;
            w->i = 0;
            w->heap_len = 0;
            return;
        }
        uint32_t x = (uint32_t)w->i++;
        if (top_at(w, x)->pending == 0)
            w->climb = top_sum_one(w, x);
        work += 4;
    }
}

static uint64_t top_key(const radix_top_walk_t *w, const top_entry_t *e)
{
    return w->order == RADIX_BY_HITS ? e->row.hits : e->row.blocks;
}

/* radix_top's order (cmp_row) on two entries: < 0 when a comes first. */
static int top_cmp(const radix_top_walk_t *w, uint32_t a, uint32_t b)
{
    const top_entry_t *x = top_at(w, a), *y = top_at(w, b);
    return row_order(top_key(w, x), &x->row, top_key(w, y), &y->row);
}

/* The heap's root is its worst entry: a parent never comes before a child. */
static void top_heap_down(radix_top_walk_t *w, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < w->heap_len && top_cmp(w, w->heap[l], w->heap[worst]) > 0)
            worst = l;
        if (r < w->heap_len && top_cmp(w, w->heap[r], w->heap[worst]) > 0)
            worst = r;
        if (worst == i)
            return;
        uint32_t tmp = w->heap[i];
        w->heap[i] = w->heap[worst];
        w->heap[worst] = tmp;
        i = worst;
    }
}

static void top_heap_up(radix_top_walk_t *w, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (top_cmp(w, w->heap[i], w->heap[p]) <= 0)
            return;
        uint32_t tmp = w->heap[i];
        w->heap[i] = w->heap[p];
        w->heap[p] = tmp;
        i = p;
    }
}

/* Whether an entry's namespace is the one it was when the walk began. */
static bool top_ns_kept(const radix_tree_t *t, const radix_top_walk_t *w, uint32_t ns)
{
    return ns < w->n_ns && w->ns_had[ns] && ns_live(t, ns) && t->ns[ns]->seed == w->ns_seed[ns];
}

static int cmp_prefix_rows(const void *a, const void *b)
{
    return cmp_row(a, b);
}

/* SELECT: the best max entries in a heap of max; then the rows in order. */
static int top_select(const radix_tree_t *t, radix_top_walk_t *w, size_t budget)
{
    for (size_t work = 0; w->i < w->n && work < budget; w->i++, work += 4) {
        uint32_t x = (uint32_t)w->i;
        if (w->max == 0 || !top_ns_kept(t, w, top_at(w, x)->row.ns))
            continue;
        if (w->heap_len < w->max) {
            w->heap[w->heap_len++] = x;
            top_heap_up(w, w->heap_len - 1);
        } else if (top_cmp(w, x, w->heap[0]) < 0) {
            w->heap[0] = x;
            top_heap_down(w, 0);
        }
    }
    if (w->i < w->n)
        return 0;
    /* At most max rows (1000 for kvshared): sorted in one piece. */
    radix_top_row_t *rows = t_malloc(t, (w->heap_len + 1) * sizeof(*rows));
    radix_prefix_t *out = t_malloc(t, (w->heap_len + 1) * sizeof(*out));
    if (!rows || !out) {
        free(rows);
        free(out);
        return KVS_ENOMEM;
    }
    w->rows = out;
    for (size_t k = 0; k < w->heap_len; k++) {
        rows[k].row = top_at(w, w->heap[k])->row;
        rows[k].key = top_key(w, top_at(w, w->heap[k]));
    }
    qsort(rows, w->heap_len, sizeof(*rows), cmp_prefix_rows);
    for (size_t k = 0; k < w->heap_len; k++)
        w->rows[k] = rows[k].row;
    free(rows);
    top_drop_entries(w);
    w->bytes = (w->heap_len + 1) * sizeof(*w->rows);
    w->phase = PH_DONE;
    return 0;
}

int radix_top_begin(const radix_tree_t *t, uint32_t ns, radix_order_t order, size_t max,
                    radix_top_walk_t **out)
{
    if (!t || !out || (order != RADIX_BY_HITS && order != RADIX_BY_SIZE))
        return KVS_EINVAL;
    if (ns != RADIX_NS_ALL && !ns_live(t, ns))
        return KVS_ENONS;
    radix_top_walk_t *w = t_calloc(t, 1, sizeof(*w));
    if (!w)
        return KVS_ENOMEM;
    w->ns = ns;
    w->order = order;
    w->max = max;
    w->n_ns = t->n_ns;
    w->ns_seed = t_calloc(t, w->n_ns + 1, sizeof(*w->ns_seed));
    w->ns_had = t_calloc(t, w->n_ns + 1, sizeof(*w->ns_had));
    w->heap = max ? t_malloc(t, max * sizeof(*w->heap)) : NULL;
    if (!w->ns_seed || !w->ns_had || (max && !w->heap) || top_sweep_init(t, w) != 0) {
        radix_top_end(w);
        return KVS_ENOMEM;
    }
    for (uint32_t k = 0; k < w->n_ns; k++)
        if (ns_live(t, k)) {
            w->ns_had[k] = true;
            w->ns_seed[k] = t->ns[k]->seed;
        }
    w->phase = PH_FIND;
    *out = w;
    return 0;
}

int radix_top_step(radix_tree_t *t, radix_top_walk_t *w, size_t budget, bool *done)
{
    if (!t || !w || !done || budget == 0)
        return KVS_EINVAL;
    int rc = 0;
    switch (w->phase) {
    case PH_FIND:
    case PH_SWEEP:
        /* The sweep reads one table: while the table grows, the step moves
         * old slots instead (a slot and its node's move cost about 2 units);
         * once done the mask differs from the sweep's and it begins again. */
        if (t->old_slots)
            radix__grow_step(t, budget / 2 + 1);
        else
            rc = top_sweep(t, w, budget);
        break;
    case PH_LINK:
        top_link(w, budget);
        break;
    case PH_SUM:
        top_sum(w, budget);
        break;
    case PH_SELECT:
        rc = top_select(t, w, budget);
        break;
    default:
        break;
    }
    *done = w->phase == PH_DONE;
    return rc;
}

int radix_top_rows(const radix_top_walk_t *w, radix_prefix_t *out, size_t max, size_t *n_out)
{
    if (!w || !n_out || (max > 0 && !out))
        return KVS_EINVAL;
    if (w->phase != PH_DONE)
        return KVS_EBUSY;
    size_t k = w->heap_len < max ? w->heap_len : max;
    if (k)
        memcpy(out, w->rows, k * sizeof(*out));
    *n_out = k;
    return 0;
}

size_t radix_top_walk_bytes(const radix_top_walk_t *w)
{
    if (!w)
        return 0;
    return sizeof(*w) + w->bytes + w->max * sizeof(*w->heap) +
           (w->n_ns + 1) * (sizeof(*w->ns_seed) + sizeof(*w->ns_had));
}

void radix_top_walk_info(const radix_top_walk_t *w, size_t *entries, uint32_t *restarts,
                         uint64_t *missed)
{
    if (!w)
        return;
    if (entries)
        *entries = w->n;
    if (restarts)
        *restarts = w->restarts;
    if (missed)
        *missed = w->missed;
}

void radix_top_end(radix_top_walk_t *w)
{
    if (!w)
        return;
    top_drop_entries(w);
    free(w->heap);
    free(w->rows);
    free(w->ns_seed);
    free(w->ns_had);
    free(w);
}
