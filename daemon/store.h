/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store: the block store. It owns the pool (block ids and their states), the
 * index (which prefix each cached block holds, pins, eviction), one record
 * per block and the tier below the pool, and it is the only code that
 * changes a block's state: the one place that publishes a block's KV events
 * (BlockStored, BlockRemoved) and counts what happens to blocks.
 *
 *     store_t
 *       |-- pool_t          pool ids: FREE / WRITING / CACHED
 *       |-- radix_tree_t    cached prefixes, pins, eviction; tier-2 ids after
 *       |                   the pool's (radix.h, Tiers)
 *       |-- rec[id]         one record per index id: pool ids, then tier-2 ids
 *       `-- medium          the tier below the pool (tier_medium.h); NULL: none
 *
 * Lifecycle (docs: DESIGN.md, Block lifecycle):
 *
 *     FREE --store_alloc--> WRITING (rec.writer = the session)
 *     WRITING --store_commit--> CACHED, pinned by the committer
 *     CACHED --store_release--> unpinned --store_evict--> FREE (BlockRemoved)
 *     WRITING --store_release or store_release_session--> FREE
 *
 * A record holds nothing that belongs to one device: a block id names the
 * same slot on every device's pool (DESIGN.md, Pool layout), so a node with
 * several devices keeps this one index and one record per id, and only the
 * copies (the media) are per device. What names a block (its namespace,
 * chained hash and commit time, store_meta_t) moves with it when it changes
 * tier; the rest belongs to its pool id.
 *
 * Handlers decode a request, call the store, and encode its answer; they
 * read records through the accessors below and never write them. Everything
 * runs on the loop thread.
 */
#ifndef KVS_DAEMON_STORE_H
#define KVS_DAEMON_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"

/* What names a cached block, by index id: it moves with the block between
 * the tiers. */
typedef struct store_meta {
    uint64_t hash;      /* chained hash, the key KV events name (0 while events are off) */
    uint64_t cached_ms; /* loop time of its last commit (the lifetime histogram) */
    uint32_t ns;        /* the namespace that committed it */
} store_meta_t;

/* One block. writer, writer_pos, mark and used_ms belong to pool ids only. */
typedef struct store_record {
    store_meta_t meta;
    session_t *writer;   /* WRITING: the session holding it; NULL otherwise */
    uint32_t writer_pos; /* its index in writer->writing */
    uint32_t mark;       /* scratch stamp of the duplicate check (store_mark) */
    uint64_t used_ms;    /* loop time of its last commit or lookup match */
} store_record_t;

struct store {
    store_record_t *rec; /* [n_ids] */
    uint32_t n_ids;      /* pool blocks + tier-2 blocks */
    uint32_t mark_stamp;
    uint64_t *keys; /* [pool blocks]: one commit's BlockStored keys */
};

/* Creates the records for the server's pool and tier 2 (srv->num_blocks,
 * srv->tier2_blocks). Errors: KVS_ENOMEM. */
int store_open(server_t *srv, store_t **out);

/* Frees the records. Accepts NULL. */
void store_free(store_t *st);

/* The session holding pool block b WRITING, or NULL. */
static inline session_t *store_writer(const store_t *st, uint32_t b)
{
    return st->rec[b].writer;
}

/* Where b sits in its writer's list (valid while store_writer(b) is set). */
static inline uint32_t store_writer_pos(const store_t *st, uint32_t b)
{
    return st->rec[b].writer_pos;
}

/* The namespace that committed index id b (either tier). */
static inline uint32_t store_block_ns(const store_t *st, uint32_t b)
{
    return st->rec[b].meta.ns;
}

#endif /* KVS_DAEMON_STORE_H */
