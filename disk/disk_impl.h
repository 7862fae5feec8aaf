/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inside the disk tier (disk.h): the state the file code (disk.c)
 * and the I/O engines (disk_io.c) share. Not for other files.
 */
#ifndef KVS_DISK_IMPL_H
#define KVS_DISK_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "disk.h"

typedef struct disk__engine disk__engine_t;

/* A batch in flight: ops [0, next) were handed to the engine's threads;
 * left counts those not ended. */
typedef struct disk__batch {
    struct disk__batch *qnext; /* the engine's queue */
    disk_t *d;
    bool write;
    disk_op_t *ops;
    size_t n, next;
    atomic_size_t left;
    disk_done_fn done;
    void *arg;
} disk__batch_t;

struct disk {
    int fd;
    uint64_t block_bytes, slot_bytes, hdr_bytes, file_bytes;
    uint64_t pay_off;   /* the payload's offset in a slot: hdr_bytes rounded up to a page */
    uint64_t ident_off; /* the identity hash's offset in a record: after the tokens */
    bool direct_ok;     /* block_bytes is whole pages: page-aligned ops may skip the buffer */
    /* A record's CRC from its parts' without reading the zeros after the
     * block: the CRC of those pad bytes, and the factors that move a CRC
     * past them and past the slot's bytes after the header (crc32c_shift). */
    uint32_t pad_crc, pad_shift, body_shift;
    uint32_t block_tokens, nslots;
    uint64_t geometry_id;

    /* slots (one thread): LRU list, most recent at head */
    uint32_t *prev, *next, *free_stack, *free_pos; /* free_pos: index in free_stack */
    uint8_t *used;
    uint32_t head, tail, nfree, nused;

    atomic_uint_fast64_t next_seq;
    atomic_uint syncing; /* disk_sync_async threads running */
    atomic_uint_fast64_t reads, writes, read_bytes, write_bytes, io_errors, crc_failures,
        mismatches;
    uint64_t evictions, recovered, torn, deleted;
    disk_scan_t scan;

    /* the namespace table (loop thread, and the scan at open) */
    disk_ns_t *ns_tab;          /* DISK_NS_SLOTS */
    uint64_t *ns_used;          /* by entry: when last noted (0: never this run) */
    uint32_t ns_count, ns_last; /* ns_last: the entry found last (most lookups repeat it) */
    uint64_t ns_clock;
    uint8_t *page; /* the superblock page, aligned for O_DIRECT */
    /* A deferred scan (disk_config_t.defer_scan): not run yet or
     * running; the table as it was at open, which that scan judges by. */
    bool scan_pending;
    disk_ns_t *scan_tab;
    uint32_t scan_tab_n;

    disk__engine_t *eng;
    const char *io_name;

    /* notes (disk.h): queued on any thread, handed over on the caller's */
    disk_note_fn note;
    void *note_arg;
    pthread_mutex_t notes_mu;
    uint32_t notes_n;
    uint64_t notes_dropped; /* made while the queue was full */
    struct {
        disk_note_level_t level;
        char text[DISK_NOTE_MAX];
    } notes[DISK_NOTES_MAX];
};

static inline uint64_t disk__slot_offset(const disk_t *d, uint32_t slot)
{
    return DISK_ALIGN + (uint64_t)slot * d->slot_bytes;
}

/* Whether op i's I/O goes straight from (to) its data: data is page-aligned
 * and block_bytes whole pages. Then buf holds only the header page(s)
 * (pay_off bytes) and the engine does vectored I/O: [buf, pay_off) and
 * [data, block_bytes); otherwise buf holds the whole slot. */
bool disk__direct(const disk_t *d, const disk__batch_t *b, size_t i);
/* On an engine thread, before op i's I/O: a write's record into buf (or,
 * direct, its header page, with the CRC over data). */
void disk__prepare(disk_t *d, disk__batch_t *b, size_t i, uint8_t *buf);
/* On an engine thread, after it: res is the I/O's byte count or -errno. A
 * read is checked and copied out of buf. The last op of a batch calls its
 * done and frees it. */
void disk__finish(disk_t *d, disk__batch_t *b, size_t i, uint8_t *buf, long res);

/* Queues a note (disk.h), from any thread. */
void disk__note(disk_t *d, disk_note_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Engines (disk_io.c). start picks io_uring or threads as io says and
 * sets d->io_name; push queues a batch; stop waits for the queue to drain. */
int disk__engine_start(disk_t *d, disk_io_t io, uint32_t qd, char *err, size_t errlen);
void disk__engine_push(disk_t *d, disk__batch_t *b);
void disk__engine_stop(disk_t *d);

#endif /* KVS_DISK_IMPL_H */
