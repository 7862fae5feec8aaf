/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inside the disk tier (tier_disk.h): the state the file code (tier_disk.c)
 * and the I/O engines (tier_disk_io.c) share. Not for other files.
 */
#ifndef KVS_DAEMON_TIER_DISK_IMPL_H
#define KVS_DAEMON_TIER_DISK_IMPL_H

#include <stdatomic.h>

#include "tier_disk.h"

typedef struct td_engine td_engine_t;

/* A batch in flight: ops [0, next) were handed to the engine's threads;
 * left counts those not ended. */
typedef struct td_batch {
    struct td_batch *qnext; /* the engine's queue */
    tier_disk_t *td;
    bool write;
    tier_disk_op_t *ops;
    size_t n, next;
    atomic_size_t left;
    tier_disk_done_fn done;
    void *arg;
} td_batch_t;

struct tier_disk {
    int fd;
    uint64_t block_bytes, slot_bytes, hdr_bytes, file_bytes;
    uint64_t pay_off;   /* the payload's offset in a slot: hdr_bytes rounded up to a page */
    uint64_t ident_off; /* the identity hash's offset in a record: after the tokens */
    bool direct_ok;     /* block_bytes is whole pages: page-aligned ops may skip the buffer */
    uint32_t block_tokens, nslots;
    uint64_t geometry_id;

    /* slots (one thread): LRU list, most recent at head */
    uint32_t *prev, *next, *free_stack, *free_pos; /* free_pos: index in free_stack */
    uint8_t *used;
    uint32_t head, tail, nfree, nused;

    atomic_uint_fast64_t next_seq;
    atomic_uint syncing; /* tier_disk_sync_async threads running */
    atomic_uint_fast64_t reads, writes, read_bytes, write_bytes, io_errors, crc_failures,
        mismatches;
    uint64_t evictions, recovered, torn, deleted;
    tier_disk_scan_t scan;

    /* the namespace table (loop thread, and the scan at open) */
    tier_disk_ns_t *ns_tab;     /* TIER_DISK_NS_SLOTS */
    uint64_t *ns_used;          /* by entry: when last noted (0: never this run) */
    uint32_t ns_count, ns_last; /* ns_last: the entry found last (most lookups repeat it) */
    uint64_t ns_clock;
    uint8_t *page; /* the superblock page, aligned for O_DIRECT */
    /* A deferred scan (tier_disk_config_t.defer_scan): not run yet or
     * running; the table as it was at open, which that scan judges by. */
    bool scan_pending;
    tier_disk_ns_t *scan_tab;
    uint32_t scan_tab_n;

    td_engine_t *eng;
    const char *io_name;
};

static inline uint64_t td_slot_offset(const tier_disk_t *td, uint32_t slot)
{
    return TIER_DISK_ALIGN + (uint64_t)slot * td->slot_bytes;
}

/* Whether op i's I/O goes straight from (to) its data: data is page-aligned
 * and block_bytes whole pages. Then buf holds only the header page(s)
 * (pay_off bytes) and the engine does vectored I/O: [buf, pay_off) and
 * [data, block_bytes); otherwise buf holds the whole slot. */
bool td_direct(const tier_disk_t *td, const td_batch_t *b, size_t i);
/* On an engine thread, before op i's I/O: a write's record into buf (or,
 * direct, its header page, with the CRC over data). */
void td_prepare(tier_disk_t *td, td_batch_t *b, size_t i, uint8_t *buf);
/* On an engine thread, after it: res is the I/O's byte count or -errno. A
 * read is checked and copied out of buf. The last op of a batch calls its
 * done and frees it. */
void td_finish(tier_disk_t *td, td_batch_t *b, size_t i, uint8_t *buf, long res);

/* Engines (tier_disk_io.c). start picks io_uring or threads as io says and
 * sets td->io_name; push queues a batch; stop waits for the queue to drain. */
int td_engine_start(tier_disk_t *td, tier_disk_io_t io, uint32_t qd, char *err, size_t errlen);
void td_engine_push(tier_disk_t *td, td_batch_t *b);
void td_engine_stop(tier_disk_t *td);

#endif /* KVS_DAEMON_TIER_DISK_IMPL_H */
