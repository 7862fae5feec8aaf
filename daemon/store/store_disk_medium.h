/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier as a tier medium (tier_medium.h): put and get of whole
 * blocks between host memory and the disk tier's slots, drop and stats, with
 * each batch's end delivered on the loop thread. The store chains it below
 * tier 2 (store_disk.c): puts come from tier-2 blocks, gets go to the pool.
 *
 * A medium only sees block ids; what a record must name (namespace, chain
 * hash, tokens) and where a block's bytes are in host memory come from the
 * source the opener gives. A get checks that the slot holds the record the
 * last put wrote there (chain hash, namespace id, sequence number) and its
 * CRC: otherwise the batch fails with KVS_ENOTFOUND, not fatal (a disk that
 * fails turns reads into misses, never wrong bytes).
 */
#ifndef KVS_DAEMON_STORE_DISK_MEDIUM_H
#define KVS_DAEMON_STORE_DISK_MEDIUM_H

#include <uv.h>

#include "disk.h"
#include "tier_medium.h"

typedef struct store_disk_source {
    /* The bytes (block_bytes) of block id in host memory, valid until the
     * batch ends: puts and gets go to and from it in place. NULL: the
     * blocks go through the tier's own buffers, on a tier thread, with
     * locate, gather and store below. */
    void *(*block)(void *arg, uint32_t id);
    /* What block id is (for a put's record). tokens are copied at once. */
    void (*meta)(void *arg, uint32_t id, disk_meta_t *out);
    void *arg;
    /* Without block: a put names where block id's bytes are (on the loop:
     * locate) and a tier thread gathers them into the record (gather, which
     * must only read memory the put keeps in place, and returns the CRC32C
     * of the block it wrote: disk_op_t's fill); a get's block, once it
     * verified, goes where it belongs from the tier's buffer (store, on a
     * tier thread, one at a time; non-zero fails the get: disk_op_t's
     * drain). */
    uint32_t (*locate)(void *arg, uint32_t id);
    uint32_t (*gather)(void *arg, uint32_t src, void *dst);
    int (*store)(void *arg, uint32_t id, const void *buf);
    /* May be NULL. On the loop, after a failed get's done: slot's record
     * did not verify or is not the block last put there (KVS_ENOTFOUND; not
     * a disk error). It can never be served: the index should forget it. */
    void (*bad)(void *arg, uint32_t slot);
    uint32_t block_tokens; /* tokens per block (a put's copy of them) */
} store_disk_source_t;

/* A medium over td (which stays the caller's, closed after the medium).
 * Its close finishes on the loop: run the loop once more after it. Returns
 * 0 or KVS_ENOMEM / KVS_EIO. */
int store_disk_medium_open(uv_loop_t *loop, disk_t *td, const store_disk_source_t *src,
                           tier_medium_t **out);

/* Slot holds the record a scan found (disk_take_scan): a get of it
 * checks that record, as one a put wrote. */
void store_disk_medium_restore(tier_medium_t *m, uint32_t slot, uint64_t chain_hash, uint64_t seq,
                               uint32_t ns_id);

/* The disk tier under the medium. */
/* At start, for every record the scan found (restored or not): slot holds
 * chain_hash's record on the disk, so a later Evict of that block deletes
 * it there too (store_disk_medium_forget). */
void store_disk_medium_found(tier_medium_t *m, uint32_t slot, uint64_t chain_hash);

/* Evict: the records on the disk of the blocks whose chained hashes are
 * hashes[0..n) (0 is none), blocks the index no longer holds, get a
 * tombstone (disk_forget) in every slot no put is writing: a block
 * evicted from tier 3, and the copy left behind by one that moved up from
 * it before (a promotion leaves its slot's record as it was). Runs on
 * the loop: the medium keeps its slots by the hash of the record each
 * holds, so the work is the n blocks' own records (*n_looked: the slots
 * looked at, about as many as there are such records; never a pass over
 * every slot), and a 4 KiB O_DIRECT write per record found (not
 * fdatasync'd: disk_sync). *n_forgotten: records deleted. Errors:
 * KVS_EIO, KVS_ENOMEM (nothing recorded as deleted). */
int store_disk_medium_forget(tier_medium_t *m, const uint64_t *hashes, size_t n,
                             size_t *n_forgotten, size_t *n_looked);

disk_t *store_disk_medium_disk(const tier_medium_t *m);

#endif /* KVS_DAEMON_STORE_DISK_MEDIUM_H */
