/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvstore: KV blocks in kvshare's pool layout, as a decode worker sees them.
 *
 * A store is a base pointer, a geometry and a block count. The region is laid
 * out exactly as the daemon's pool, [layer][k|v][block][token][kv_head][head_dim]
 * (fp32 only): slot addresses come from geometry_offset() (gpu/geometry.h), the
 * one layout function of kvshare, so the worker holds no copy of the layout.
 *
 * A request's KV lives in the blocks of its block table: block_table[i] holds
 * the tokens [i * block_tokens, (i + 1) * block_tokens) of its sequence. The
 * same attention code reads a block whatever its id, so a sequence whose KV
 * sits in other blocks (shared or private, in any order) computes the same bits.
 *
 * Two kinds of store:
 *  - private: kvstore_new_private() allocates the region and hands out block ids
 *    from a local free stack (the worker without a daemon, the reference);
 *  - wrapped: kvstore_wrap() borrows a region mapped by someone else (the
 *    daemon's pool); ids then come from the daemon, kvstore_alloc() refuses.
 */
#ifndef KVS_WORKER_KVSTORE_H
#define KVS_WORKER_KVSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "geometry.h"
#include "kvshare_status.h"

typedef struct kvstore {
    uint8_t *base;
    geometry_t geom;
    uint32_t num_blocks;
    uint64_t slot_bytes;   /* one layer, K or V, one block */
    uint64_t token_floats; /* kv_heads x head_dim: one token of one slot */
    int owned;             /* base was allocated by kvstore_new_private */
    uint32_t *free_ids;    /* private stores: the free stack */
    uint32_t free_count;
} kvstore_t;

/* Bytes of one slot, and of the whole region, for a fp32 geometry. 0 when the
 * geometry is not usable here (a field 0, or a dtype other than fp32). */
uint64_t kvstore_slot_bytes(const geometry_t *g);
uint64_t kvstore_region_bytes(const geometry_t *g, uint32_t num_blocks);

/* Allocates a zeroed region of num_blocks blocks and a free stack holding all of
 * them. The caller frees *out with kvstore_free.
 * Errors: KVS_EINVAL (NULL, num_blocks 0, geometry not fp32 or incomplete),
 * KVS_ENOMEM. */
int kvstore_new_private(const geometry_t *g, uint32_t num_blocks, kvstore_t **out);

/* A store over a region the caller keeps mapped for the store's lifetime (at
 * least kvstore_region_bytes bytes). kvstore_free does not unmap it.
 * Errors: KVS_EINVAL, KVS_ENOMEM. */
int kvstore_wrap(void *base, const geometry_t *g, uint32_t num_blocks, kvstore_t **out);

/* Frees the store, and its region when it is private. Accepts NULL. */
void kvstore_free(kvstore_t *ks);

/* Takes n free blocks, all or nothing, into ids[0..n).
 * Errors: KVS_EINVAL, KVS_ENOTSUP (a wrapped store: the daemon grants ids),
 * KVS_EPOOLFULL (fewer than n free; nothing taken). */
int kvstore_alloc(kvstore_t *ks, uint32_t n, uint32_t *ids);

/* Gives n blocks back to the free stack of a private store.
 * Errors: KVS_EINVAL (an id out of range, or more blocks than the store has),
 * KVS_ENOTSUP (a wrapped store). */
int kvstore_release(kvstore_t *ks, uint32_t n, const uint32_t *ids);

/* Free blocks of a private store (0 for a wrapped one). */
uint32_t kvstore_free_blocks(const kvstore_t *ks);

/* Byte offset of slot (layer, kv, block) from the base: the pool layout. */
static inline uint64_t kvstore_offset(const kvstore_t *ks, uint32_t layer, uint32_t kv,
                                      uint32_t block)
{
    return geometry_offset(&ks->geom, ks->num_blocks, layer, kv, block);
}

/* The kv_heads x head_dim floats of K (kv = 0) or V (kv = 1) of one token of a
 * block in one layer. No bounds check: callers check block ids once per request. */
static inline float *kvstore_token(const kvstore_t *ks, uint32_t layer, uint32_t kv, uint32_t block,
                                   uint32_t token)
{
    return (float *)(ks->base + kvstore_offset(ks, layer, kv, block)) +
           (uint64_t)token * ks->token_floats;
}

#endif /* KVS_WORKER_KVSTORE_H */
