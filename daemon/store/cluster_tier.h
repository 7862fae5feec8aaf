/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster_tier: blocks up to and down from the cluster (cluster.h), one
 * Redis value per block (cluster_value.h).
 *
 * Up: cluster_tier_put writes one block through, fire and forget. At most
 * max_puts writes are in flight; one more is dropped and counted, never
 * queued behind a slow cluster: a write-through that waits would make the
 * commit path wait.
 *
 * Down: cluster_tier_fetch asks for the blocks of a chain at once (the
 * client pipelines them per node). Each reply is checked: a value that
 * does not verify, or that names another block, is a miss, counted, and
 * never handed on. on_block runs for each block that verified, as it
 * arrives; on_done runs once, after every block has its answer, which is
 * within the client's timeout (cluster.h ends a command at its deadline).
 *
 * Clear: cluster_tier_clear deletes every key of one namespace and identity
 * (cluster_value_match), incrementally: on each master of the slot map, a
 * SCAN with MATCH of the keys' prefix (CLUSTER_TIER_SCAN_COUNT slots of the
 * keyspace per step), then one UNLINK per key found (a key's slot routes
 * it; keys of two slots cannot share one command), then the next SCAN once
 * those are answered: at most one step's keys per master are in flight. A
 * master that fails is scanned again from its start after a back-off, as
 * is a master the map names after a failover. It ends when every master of
 * the map has been scanned through, or at its deadline with what is left
 * (cluster_tier_tick). SCAN returns every key that was there when it
 * started and stayed: a key written before the clear and sent on the same
 * connection before its SCAN is deleted.
 *
 * Loop thread only.
 */
#ifndef KVS_DAEMON_CLUSTER_TIER_H
#define KVS_DAEMON_CLUSTER_TIER_H

#include "cluster.h"
#include "cluster_value.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cluster_tier cluster_tier_t;

typedef struct cluster_tier_stats {
    uint64_t puts;              /* writes sent */
    uint64_t put_ok;            /* writes the cluster acknowledged */
    uint64_t put_errors;        /* writes that failed after being sent */
    uint64_t put_drops;         /* writes dropped: too many in flight, or refused at once */
    uint64_t put_bytes;         /* bytes of values written */
    uint64_t gets;              /* blocks asked for */
    uint64_t hits;              /* blocks that verified */
    uint64_t misses;            /* blocks the cluster does not hold */
    uint64_t corrupt;           /* values that did not verify */
    uint64_t mismatched;        /* sound values of another block */
    uint64_t get_errors;        /* gets that failed: timeouts, nodes down, AUTH */
    uint64_t get_bytes;         /* payload bytes of hits */
    uint64_t fetch_us_sum;      /* microseconds from fetch to on_done, summed */
    uint64_t fetches;           /* fetches done */
    uint64_t identity_misses;   /* sound values of this block's key naming another identity */
    uint64_t cleared;           /* sound values of the block written before its Clear */
    uint64_t keys_deleted;      /* keys a clear deleted (UNLINK answered 1) */
    uint64_t clears;            /* clears ended, whole or not */
    uint64_t clears_incomplete; /* of them, ended at their deadline with keys left */
} cluster_tier_stats_t;

/* A block that verified: its index in the fetch and its payload (valid
 * during the call only; NULL from cluster_tier_fetch_into, which placed it
 * already). */
typedef void (*cluster_tier_block_cb)(void *arg, size_t i, const void *payload, size_t len);
/* The fetch is over: hits[i] says whether block i verified (the array is
 * valid during the call only). */
typedef void (*cluster_tier_done_cb)(void *arg, const uint8_t *hits, size_t n);

/* A tier over the client c (not owned: close the tier first), with keys
 * under prefix (copied; NULL: none). Returns 0, KVS_EINVAL, KVS_ENOMEM. */
int cluster_tier_new(cluster_t *c, const char *prefix, uint32_t max_puts, cluster_tier_t **out);

/* Frees the tier; writes and fetches still in flight end into the void (their
 * callbacks do not run; the memory goes when the client has ended them).
 * Accepts NULL. */
void cluster_tier_free(cluster_tier_t *t);

/* Writes block b (payload: b->payload_len bytes, copied) through. Returns 0
 * (sent), KVS_EBUSY (dropped: max_puts in flight, or the client refused it;
 * counted), KVS_EINVAL, KVS_ENOMEM. */
int cluster_tier_put(cluster_tier_t *t, const cluster_block_t *b, const void *payload);

/* cluster_tier_put for a value the caller built in place: value holds
 * cluster_value_size(b) bytes, the payload in its last b->payload_len
 * (the header before it is written here). Saves a copy of the payload. */
int cluster_tier_put_value(cluster_tier_t *t, const cluster_block_t *b, unsigned char *value);

/* Writes bytes [off, off + n) of block i's payload to where it goes (valid
 * during the call only). Returns 0, or an error that makes block i a miss. */
typedef int (*cluster_tier_piece_cb)(void *arg, size_t i, size_t off, const void *src, size_t n);

/* Fetches blocks[0..n), all of one namespace and geometry (the names are
 * copied). Returns 0: on_done will run, later, never inside this call.
 * Otherwise it will not: KVS_EINVAL, KVS_ENOMEM, or KVS_EIO when the client
 * refused every GET at once (nodes down, too many in flight). A block the
 * client refuses at once is a miss (counted: get_errors). */
int cluster_tier_fetch(cluster_tier_t *t, const cluster_block_t *blocks, size_t n,
                       cluster_tier_block_cb on_block, cluster_tier_done_cb on_done, void *arg);

/* cluster_tier_fetch, each value verified and copied in one pass straight
 * out of the client's reader: on_piece gets the payload in consecutive
 * pieces of piece bytes (the last may be shorter), each just after it is
 * hashed, and on_block(arg, i, NULL, len) runs once block i's checksum
 * verified. A block that fails after some of its pieces were placed is a
 * miss: on_block does not run for it, and what was placed is garbage.
 * KVS_EINVAL also when on_piece is set and piece is 0. */
int cluster_tier_fetch_into(cluster_tier_t *t, const cluster_block_t *blocks, size_t n,
                            size_t piece, cluster_tier_piece_cb on_piece,
                            cluster_tier_block_cb on_block, cluster_tier_done_cb on_done,
                            void *arg);

void cluster_tier_get_stats(const cluster_tier_t *t, cluster_tier_stats_t *out);

/* cb(arg) runs after each write ended (acknowledged or failed), while the
 * tier is open: room for one more (a caller that queues its own). */
void cluster_tier_on_put_done(cluster_tier_t *t, void (*cb)(void *arg), void *arg);

/* Keys of a SCAN step of a clear, per master (the COUNT hint). */
#define CLUSTER_TIER_SCAN_COUNT 256
/* A master whose SCAN failed is tried again after this long. */
#define CLUSTER_TIER_CLEAR_RETRY_MS 200

/* A clear ended: keys deleted, and whether every master was scanned
 * through (0: its deadline came first, or the tier was closed; left says
 * how many masters were not). */
typedef void (*cluster_tier_clear_cb)(void *arg, uint64_t deleted, int whole, size_t left);

/* Deletes every key of namespace ns (ns_len bytes) and identity under the
 * tier's prefix, as described above, within timeout_ms (from now). done
 * runs once, later, on the loop (at the latest in cluster_tier_free, whole
 * 0; it must not call the tier), unless this returns an error: KVS_EINVAL,
 * KVS_ENOMEM. */
int cluster_tier_clear(cluster_tier_t *t, const char *ns, size_t ns_len, uint64_t identity,
                       uint32_t timeout_ms, cluster_tier_clear_cb done, void *arg);

/* Runs the clears' clocks: masters to try again, deadlines. Call every few
 * tens of milliseconds while clears run. */
void cluster_tier_tick(cluster_tier_t *t);

/* The key of block b under this tier's prefix (cluster_value_key). */
int cluster_tier_key(const cluster_tier_t *t, const cluster_block_t *b, char *buf, size_t len);

/* 1 when a write now would be sent rather than dropped for max_puts. */
int cluster_tier_put_room(const cluster_tier_t *t);

#endif /* KVS_DAEMON_CLUSTER_TIER_H */
