/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ns.c: namespaces: each one a root, a seed, a quota and a reservation,
 * its eviction queues and its counters (radix_ns_t). Ids are reused, the
 * lowest free first.
 */
#include "radix_internal.h"

#include <stdlib.h>
#include <string.h>

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
    radix_node_t *root = radix__node_new(t, 0);
    if (!ns || !root) {
        free(ns);
        if (root)
            radix__node_free(t, root);
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
    if (ns->st.cached_blocks > 0 || ns->st.tier2_blocks > 0 || ns->st.tier3_blocks > 0)
        return KVS_EBUSY;
    /* No cached block in either tier: the root has no child, no node is
     * queued (the heaps hold stale entries at most), and no block id or hint
     * names it. */
    radix__node_free(t, ns->root);
    for (int q = 0; q < RADIX_TIERS; q++)
        free(ns->q[q].heap);
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
