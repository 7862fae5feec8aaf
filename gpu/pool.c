/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The block ids of the pool: a free stack and one state byte per block.
 *
 *     stack: [ id id id ... id | unused ... ]      state: [F W C F F ...]
 *             0            top-1                           one per block id
 *
 * The stack holds exactly the FREE ids, so alloc pops and release pushes,
 * O(1) each; the state array is what rejects a double free.
 */
#include "pool.h"

#include <stdlib.h>

struct pool {
    uint32_t total;
    uint32_t top; /* number of free ids on the stack */
    uint32_t writing;
    uint32_t cached;
    uint64_t alloc_failures;
    uint32_t *stack;
    uint8_t *state;
};

int pool_new(uint32_t num_blocks, pool_t **out)
{
    pool_t *p = NULL;
    if (out == NULL || num_blocks == 0)
        return KVS_EINVAL;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        goto fail;
    p->stack = malloc((size_t)num_blocks * sizeof(*p->stack));
    p->state = calloc(num_blocks, sizeof(*p->state));
    if (p->stack == NULL || p->state == NULL)
        goto fail;
    /* Lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
    for (uint32_t i = 0; i < num_blocks; i++)
        p->stack[i] = num_blocks - 1 - i;
    p->total = num_blocks;
    p->top = num_blocks;
    *out = p;
    return 0;
fail:
    pool_free(p);
    return KVS_ENOMEM;
}

void pool_free(pool_t *p)
{
    if (p == NULL)
        return;
    free(p->stack);
    free(p->state);
    free(p);
}

int pool_alloc(pool_t *p, uint32_t n, uint32_t *ids)
{
    if (p == NULL || ids == NULL || n == 0)
        return KVS_EINVAL;
    if (n > p->top) {
        p->alloc_failures++;
        return KVS_EPOOLFULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = p->stack[--p->top];
        p->state[id] = POOL_WRITING;
        ids[i] = id;
    }
    p->writing += n;
    return 0;
}

int pool_set_cached(pool_t *p, uint32_t id)
{
    if (p == NULL || id >= p->total)
        return KVS_EINVAL;
    if (p->state[id] != POOL_WRITING)
        return KVS_EBADSTATE;
    p->state[id] = POOL_CACHED;
    p->writing--;
    p->cached++;
    return 0;
}

int pool_release(pool_t *p, uint32_t id)
{
    if (p == NULL || id >= p->total)
        return KVS_EINVAL;
    switch (p->state[id]) {
    case POOL_WRITING:
        p->writing--;
        break;
    case POOL_CACHED:
        p->cached--;
        break;
    default:
        return KVS_EBADSTATE;
    }
    p->state[id] = POOL_FREE;
    p->stack[p->top++] = id;
    return 0;
}

int pool_state(const pool_t *p, uint32_t id, pool_state_t *out)
{
    if (p == NULL || out == NULL || id >= p->total)
        return KVS_EINVAL;
    *out = (pool_state_t)p->state[id];
    return 0;
}

void pool_counts(const pool_t *p, pool_counts_t *out)
{
    if (p == NULL || out == NULL)
        return;
    out->total = p->total;
    out->free = p->top;
    out->writing = p->writing;
    out->cached = p->cached;
    out->alloc_failures = p->alloc_failures;
}
