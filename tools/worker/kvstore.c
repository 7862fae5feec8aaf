/* SPDX-License-Identifier: Apache-2.0 */
#include "kvstore.h"

#include <stdlib.h>
#include <string.h>

uint64_t kvstore_slot_bytes(const geometry_t *g)
{
    if (!g || g->dtype != GEOMETRY_FP32 || !g->layers || !g->kv_heads || !g->head_dim ||
        !g->block_tokens)
        return 0;
    return geometry_slot_bytes(g);
}

uint64_t kvstore_region_bytes(const geometry_t *g, uint32_t num_blocks)
{
    return kvstore_slot_bytes(g) ? geometry_offset(g, num_blocks, g->layers, 0, 0) : 0;
}

static int kvstore_init(kvstore_t **out, const geometry_t *g, uint32_t num_blocks)
{
    kvstore_t *ks;

    if (!num_blocks || !kvstore_slot_bytes(g))
        return KVS_EINVAL;
    ks = calloc(1, sizeof(*ks));
    if (!ks)
        return KVS_ENOMEM;
    ks->geom = *g;
    ks->num_blocks = num_blocks;
    ks->slot_bytes = kvstore_slot_bytes(g);
    ks->token_floats = (uint64_t)g->kv_heads * g->head_dim;
    *out = ks;
    return 0;
}

int kvstore_new_private(const geometry_t *g, uint32_t num_blocks, kvstore_t **out)
{
    kvstore_t *ks = NULL;
    int rc;

    if (!out)
        return KVS_EINVAL;
    rc = kvstore_init(&ks, g, num_blocks);
    if (rc < 0)
        return rc;
    ks->owned = 1;
    ks->base = calloc(1, kvstore_region_bytes(g, num_blocks));
    ks->free_ids = malloc(sizeof(*ks->free_ids) * num_blocks);
    if (!ks->base || !ks->free_ids) {
        rc = KVS_ENOMEM;
        goto fail;
    }
    /* Lowest ids come out first: runs are easy to read, and tests that want
     * scattered ids shuffle on purpose. */
    for (uint32_t i = 0; i < num_blocks; i++)
        ks->free_ids[i] = num_blocks - 1 - i;
    ks->free_count = num_blocks;
    *out = ks;
    return 0;
fail:
    kvstore_free(ks);
    return rc;
}

int kvstore_wrap(void *base, const geometry_t *g, uint32_t num_blocks, kvstore_t **out)
{
    kvstore_t *ks = NULL;
    int rc;

    if (!base || !out)
        return KVS_EINVAL;
    rc = kvstore_init(&ks, g, num_blocks);
    if (rc < 0)
        return rc;
    ks->base = base;
    *out = ks;
    return 0;
}

void kvstore_free(kvstore_t *ks)
{
    if (!ks)
        return;
    if (ks->owned)
        free(ks->base);
    free(ks->free_ids);
    free(ks);
}

int kvstore_alloc(kvstore_t *ks, uint32_t n, uint32_t *ids)
{
    if (!ks || (n && !ids))
        return KVS_EINVAL;
    if (!ks->owned)
        return KVS_ENOTSUP;
    if (n > ks->free_count)
        return KVS_EPOOLFULL;
    for (uint32_t i = 0; i < n; i++)
        ids[i] = ks->free_ids[--ks->free_count];
    return 0;
}

int kvstore_release(kvstore_t *ks, uint32_t n, const uint32_t *ids)
{
    if (!ks || (n && !ids))
        return KVS_EINVAL;
    if (!ks->owned)
        return KVS_ENOTSUP;
    if (n > ks->num_blocks - ks->free_count)
        return KVS_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= ks->num_blocks)
            return KVS_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        ks->free_ids[ks->free_count++] = ids[i];
    return 0;
}

uint32_t kvstore_free_blocks(const kvstore_t *ks)
{
    return ks && ks->owned ? ks->free_count : 0;
}
