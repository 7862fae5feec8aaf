/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier_medium: the interface of a tier below the pool. Host memory (tier_host.c)
 * and a local disk (store_disk_medium.c, below host memory) implement it. The
 * store (store.h) keeps the index of every tier and decides what moves; a
 * medium only holds the bytes of whole blocks in numbered slots
 * [0, capacity) and copies them to and from pool blocks.
 *
 *     pool block ids --put--> slots          (demotion: room in the pool)
 *     slots --get--> pool block ids          (promotion: a lookup's hit)
 *
 * put and get are asynchronous: they start a batch and return at once; the
 * medium calls done once, on the loop thread, with the batch's result. A
 * batch that fails stored nothing the store may read: after a failed put the
 * slots hold nothing, after a failed get the pool blocks hold nothing (the
 * store undoes the moves, tier.c). A result marked fatal says more than
 * the batch is lost (a device fault): the daemon stops. Adding a medium is a
 * new file that fills a tier_medium_ops_t, plus its settings rows.
 */
#ifndef KVS_DAEMON_TIER_MEDIUM_H
#define KVS_DAEMON_TIER_MEDIUM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tier_medium tier_medium_t;

/* How one batch ended. */
typedef struct tier_medium_result {
    int status;       /* 0, or a KVS_* code: the batch failed (KVS_ENOTFOUND: only because
                         some slots did not verify, the medium itself works) */
    bool fatal;       /* with status: the medium cannot be trusted any more */
    uint64_t copy_ns; /* wall time of the copies */
} tier_medium_result_t;

typedef void (*tier_medium_done_fn)(void *arg, const tier_medium_result_t *res);

typedef struct tier_medium_stats {
    uint64_t puts, gets; /* batches started */
    uint64_t blocks;     /* blocks copied, both ways */
    uint64_t failures;   /* batches that failed */
} tier_medium_stats_t;

typedef struct tier_medium_ops {
    const char *name;
    /* Starts copying pool blocks pool_ids[i] into slots[i], i < n (the
     * arrays stay the caller's and unchanged until done). Returns 0 (done
     * will be called) or an error (it will not). */
    int (*put)(tier_medium_t *m, const uint32_t *pool_ids, const uint32_t *slots, size_t n,
               tier_medium_done_fn done, void *arg);
    /* The same from slots[i] into pool blocks pool_ids[i]. */
    int (*get)(tier_medium_t *m, const uint32_t *pool_ids, const uint32_t *slots, size_t n,
               tier_medium_done_fn done, void *arg);
    /* The slots' blocks are gone from the index: their bytes may go. */
    void (*drop)(tier_medium_t *m, const uint32_t *slots, size_t n);
    void (*stats)(const tier_medium_t *m, tier_medium_stats_t *out);
    /* Frees the medium (no batch in flight). */
    void (*close)(tier_medium_t *m);
} tier_medium_ops_t;

struct tier_medium {
    const tier_medium_ops_t *ops;
    uint32_t capacity; /* slots, blocks of block_bytes each */
};

/* The host-memory tier (tier_host.c) over the backend's tier memory
 * (backend_tier_open, --host-tier): copies run on the tier's own threads,
 * at tier_copy_nice. Errors: KVS_ENOMEM, KVS_EIO. */
struct server;
int tier_host_open(struct server *srv, tier_medium_t **out);

static inline void tier_medium_close(tier_medium_t *m)
{
    if (m)
        m->ops->close(m);
}

#endif /* KVS_DAEMON_TIER_MEDIUM_H */
