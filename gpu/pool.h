/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool: the block ids of the KV pool and the state of each block.
 *
 *     FREE --pool_alloc--> WRITING --pool_set_cached--> CACHED
 *     WRITING --pool_release--> FREE      CACHED --pool_release--> FREE (evicted)
 *
 * Ids come from a free stack: O(1) per block. The pool knows nothing of the
 * memory (see backend.h) nor of who holds a block (the daemon's sessions do).
 */
#ifndef KVS_POOL_H
#define KVS_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare_status.h"

typedef enum pool_state {
    POOL_FREE = 0,
    POOL_WRITING = 1,
    POOL_CACHED = 2,
} pool_state_t;

typedef struct pool pool_t;

typedef struct pool_counts {
    uint32_t total, free, writing, cached;
    uint64_t alloc_failures; /* pool_alloc calls refused with KVS_EPOOLFULL */
} pool_counts_t;

/* A pool of num_blocks ids, all FREE. Errors: KVS_EINVAL (0), KVS_ENOMEM. */
int pool_new(uint32_t num_blocks, pool_t **out);
void pool_free(pool_t *p); /* accepts NULL */

/* Takes n FREE blocks into WRITING, all or nothing; ids[0..n) get them.
 * Errors: KVS_EINVAL, KVS_EPOOLFULL (fewer than n free: nothing taken). */
int pool_alloc(pool_t *p, uint32_t n, uint32_t *ids);

/* WRITING -> CACHED. Errors: KVS_EINVAL (out of range), KVS_EBADSTATE. */
int pool_set_cached(pool_t *p, uint32_t id);

/* WRITING or CACHED -> FREE. Errors: KVS_EINVAL, KVS_EBADSTATE (already
 * FREE: a double free, nothing changes). */
int pool_release(pool_t *p, uint32_t id);

/* State of a block. Errors: KVS_EINVAL (out of range). */
int pool_state(const pool_t *p, uint32_t id, pool_state_t *out);

void pool_counts(const pool_t *p, pool_counts_t *out);

#endif /* KVS_POOL_H */
