/* SPDX-License-Identifier: Apache-2.0 */
/*
 * disk: the disk tier's file (tier 3 of kvshared's store, and what
 * kvshare-bench tier-copy --disk measures): one preallocated file on a
 * local disk, read and written with O_DIRECT in fixed slots aligned to
 * 4 KiB, each holding one block and a record header that names it (namespace, chain hash, tokens)
 * and a CRC32C over the whole slot (header, payload, padding). Because every slot names its block
 * and checks itself, a daemon started on an existing file finds what it held (disk_take_scan): a
 * restart keeps the cache.
 *
 * File layout (little endian; docs/OPERATING.md):
 *
 *     [0, 4096)              superblock: magic, format, geometry, slot count
 *                            (bytes 0-51), then the namespace table (64-4095)
 *     [4096 + i * slot_bytes) slot i: header (DISK_HDR_FIXED bytes, then
 *                            block_tokens u32 tokens, then the u64 identity
 *                            hash), zero-padded to a multiple of 4096 when
 *                            block_bytes is one, then block_bytes of payload,
 *                            zero-padded to a multiple of 4096
 *
 * Identity and deletion (format 4). A block's KV is valid only for the
 * model identity that computed it (daemon/core/identity.h): every record carries its
 * namespace's identity hash, and the namespace table names, per namespace,
 * the identity in words (its canonical text and source) and a deletion
 * watermark: a record of that namespace with a sequence number below it was
 * deleted (a Clear), whatever its CRC says. An Evict's blocks get a
 * tombstone instead: their slot's first page is overwritten with a header
 * that is no record (disk_forget). Both are written (O_DIRECT) before
 * the call returns, so no restart, SIGKILL included, brings a deleted block
 * back; disk_sync (fdatasync, a few ms: for a thread) makes them
 * outlast a power loss too. The scan applies both; whether a record's identity
 * is its namespace's now is the store's to judge (store_disk.c).
 *
 * I/O runs on io_uring (batched submission at the queue depth, registered
 * buffers, completions reaped on the tier's own thread) or, where io_uring is
 * unavailable or refused, on a pool of threads doing pread/pwrite; which one
 * is chosen at open (disk_io_name). Headers are encoded and checked on
 * those threads, never on the caller's.
 *
 * Slots: the file keeps its own allocator with an LRU (disk_slot_*),
 * called from one thread (the caller's loop); the I/O calls are thread-safe.
 *
 * No event loop, no logging: calls return codes (kvshare_status.h), with a
 * message for a person in a caller-given err where there are words to say.
 * What an operator should hear and is no call's error (at open, or on the
 * disk's own threads) is a note, handed to the caller on its thread
 * (disk_notes_flush, below).
 */
#ifndef KVS_DISK_H
#define KVS_DISK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* 2: records name their parent's chained hash; 3: the payload starts on a
 * page; 4: records name their identity, the namespace table, tombstones. */
#define DISK_FORMAT    4u
#define DISK_ALIGN     4096u
#define DISK_NS_MAX    64u  /* namespace name bytes, with its NUL */
#define DISK_HDR_FIXED 120u /* header bytes before the tokens */
#define DISK_NO_SLOT   UINT32_MAX
#define DISK_IDENT_MAX 512u /* bytes of an identity's text (IDENTITY_TEXT_MAX) */
#define DISK_NS_SLOTS  256u /* namespaces the table keeps in memory */
#define DISK_NO_ENTRY  UINT32_MAX
#define DISK_ANY_UID   ((uid_t)-1) /* disk_check_path: owners not checked */

typedef enum disk_io {
    DISK_IO_AUTO = 0, /* io_uring, else threads */
    DISK_IO_URING,    /* io_uring or fail */
    DISK_IO_THREADS,  /* pread/pwrite on a pool of threads */
} disk_io_t;

/* How much a note says (disk_notes_flush, below). */
typedef enum disk_note_level {
    DISK_NOTE_WARN = 0, /* the disk tier works, in a way its operator should know */
    DISK_NOTE_ERROR,    /* something failed that no call returned */
} disk_note_level_t;

/* Called with a note's level and text (one line, without a subject: the
 * caller names the disk tier), on the thread that called disk_open,
 * disk_notes_flush, disk_scan_settle or disk_close, never on the disk's own
 * threads. text is
 * valid during the call. */
typedef void (*disk_note_fn)(void *arg, disk_note_level_t level, const char *text);

typedef struct disk_config {
    const char *path;      /* the file (created if missing; its directory must exist) */
    uint64_t bytes;        /* the file's size: superblock + whole slots */
    uint64_t block_bytes;  /* one block's payload */
    uint32_t block_tokens; /* tokens per block (header room) */
    uint64_t geometry_id;  /* the model's geometry: a file of another is refused */
    bool wipe;             /* another geometry or format: start the file over instead */
    disk_io_t io;
    uint32_t queue_depth; /* I/Os in flight; 0: 64; at least 32 */
    /* An existing file's records are not read by disk_open but by
     * disk_scan_run, later, on a thread of the caller's (warm restart
     * in the background, below). */
    bool defer_scan;
    /* Where notes go (disk_notes_flush); NULL: they are dropped. */
    disk_note_fn note;
    void *note_arg;
} disk_config_t;

/* What a slot holds besides the bytes. */
typedef struct disk_meta {
    uint32_t ns_id;
    char ns[DISK_NS_MAX]; /* NUL-terminated */
    uint64_t chain_hash;
    uint64_t parent_hash; /* the hash it chains from: the prefix's, or the namespace's seed */
    uint32_t ntokens;     /* <= block_tokens */
    const uint32_t *tokens;
    uint64_t seq;        /* written by disk_submit (writes); checked on reads when non-zero */
    uint64_t ident_hash; /* the namespace's identity (identity_hash) when written */
} disk_meta_t;

/* One slot's I/O in a batch. A write stores data (block_bytes) and meta in
 * slot; a read fills data from slot, and ends in KVS_ENOTFOUND unless the
 * slot verifies (CRC) and holds meta's chain hash, namespace id and (when
 * meta.seq is non-zero) sequence number: wrong bytes are never returned
 * (data's content is undefined after a read that did not end in 0). Data
 * aligned to 4 KiB (with a block_bytes of whole pages) goes to and from the
 * disk in place, without a copy through the tier's buffers. */
typedef struct disk_op {
    uint32_t slot;
    void *data;
    disk_meta_t meta;
    int status; /* out: 0, KVS_EIO (the disk failed), KVS_ENOTFOUND (see above) */
    /* A write may give fill instead of data: called on a tier thread with
     * fill_src to write the block's block_bytes into dst (the record's
     * payload), so that gathering a block's pieces is not the caller's
     * thread's work. It must only read memory that stays put until done,
     * and returns the CRC32C of the block_bytes it wrote (crc32c(0, dst,
     * block_bytes): crc32c_copy gives it for the price of the copy), which
     * the record's checksum then takes without reading the block again. */
    uint32_t (*fill)(void *ctx, uint32_t src, void *dst);
    void *fill_ctx;
    uint32_t fill_src;
    /* A read may give drain: called on a tier thread once the slot verified,
     * with drain_dst and the block's bytes, to put them where they go (a
     * pool block), so that scattering a block's pieces is not the caller's
     * thread's work either. A non-zero return fails the op (KVS_EIO). With
     * drain, data may be NULL: the slot is then read into the tier's own
     * buffer (registered with the ring) and drained from there, so a
     * caller needs no staging memory (fresh memory per batch costs a page
     * fault per page on the tier's thread, more than the copy). */
    int (*drain)(void *ctx, uint32_t dst, const void *src);
    void *drain_ctx;
    uint32_t drain_dst;
} disk_op_t;

/* Called once per batch, on one of the tier's threads, after every op ended. */
typedef void (*disk_done_fn)(void *arg, disk_op_t *ops, size_t n);

typedef struct disk_stats {
    const char *io;         /* "io_uring", "io_uring (unregistered buffers)" or "threads" */
    uint32_t slots, used;   /* capacity; slots holding a block */
    uint64_t reads, writes; /* slot I/Os that succeeded */
    uint64_t read_bytes, write_bytes;
    uint64_t io_errors;    /* I/Os the disk failed */
    uint64_t crc_failures; /* reads whose slot did not verify */
    uint64_t mismatches;   /* reads of a slot holding another block */
    uint64_t evictions;    /* slots its LRU took back */
    uint64_t recovered;    /* valid records found at open (disk_scan) */
    uint64_t torn;         /* slots with a header that did not verify at the scan */
    uint64_t deleted;      /* records found deleted at the scan (watermark, tombstone) */
} disk_stats_t;

typedef struct disk disk_t;

/* Whether path may be the disk tier's file of a daemon running as uid
 * (DISK_ANY_UID: owners are not checked, only modes, types and
 * links): every directory on the way (links resolved) is uid's or root's
 * and writable by nobody else unless sticky; a symbolic link on the way is
 * uid's or root's; the file, when it exists, is no symbolic link, a regular
 * file, uid's, and writable by nobody else. Touches nothing. Returns 0, or
 * KVS_EDENIED (someone else could have put it there or change it) /
 * KVS_EINVAL (no such directory, not a regular file), with a message naming
 * the path, its owner and its mode in err. disk_open checks the same,
 * and again on the opened descriptor. */
int disk_check_path(const char *path, uid_t uid, char *err, size_t errlen);

/* Opens (or creates, preallocating with fallocate) the file and starts the
 * I/O threads. The path must pass disk_check_path for this process's
 * effective uid; the file is opened without following a link and without
 * waiting (O_NOFOLLOW, O_NONBLOCK) and checked again by fstat. A file of
 * another format, geometry or size is refused unless cfg->wipe. Returns 0
 * or KVS_EINVAL / KVS_EDENIED / KVS_EBUSY (locked by another process, named
 * when /proc/locks tells) / KVS_EIO / KVS_ENOTSUP / KVS_ENOMEM with a
 * message naming the problem in err. The notes of the open (a namespace
 * table that did not verify, a file others can read, a file wiped, threads
 * instead of io_uring, unregistered buffers) go to cfg->note before it
 * returns, whatever it returns. */
int disk_open(const disk_config_t *cfg, disk_t **out, char *err, size_t errlen);
/* Waits for the I/O in flight and disk_sync_async's threads, stops the
 * threads, hands the notes left to cfg->note, closes the file. NULL: no-op. */
void disk_close(disk_t *d);

uint32_t disk_capacity(const disk_t *d);
uint64_t disk_slot_bytes(const disk_t *d);
const char *disk_io_name(const disk_t *d);
void disk_stats(const disk_t *d, disk_stats_t *out);

/* Starts a batch of writes (write = true) or reads; returns at once. done
 * runs once all ended (maybe before this returns). ops stay the caller's
 * until done. Returns 0, or KVS_EINVAL (a slot out of range, n == 0, an op
 * with no data and neither fill, for a write, nor drain, for a read). */
int disk_submit(disk_t *d, bool write, disk_op_t *ops, size_t n, disk_done_fn done, void *arg);

/* Memory for the disk's I/O (ring and thread buffers): aligned to 4 KiB, and
 * from `bytes` of 2 MiB up on a 2 MiB boundary with transparent huge pages
 * asked for (MADV_HUGEPAGE). A direct I/O is cut into one segment per
 * physically contiguous run of its pages, and a virtio or NVMe queue takes
 * a few hundred segments a request: a 2 MiB block on 4 KiB pages is 512 of
 * them, three requests where huge pages make it one (docs/BENCHMARKS.md,
 * "Huge pages and the disk tier"). Where THP is off it is 4 KiB pages, as
 * before. NULL when out of memory; free with free(). */
void *disk_buffer_alloc(size_t bytes);

/* --- slots: allocator and LRU (one thread) --- */

/* A free slot, else the least recently used one, whose block is forgotten
 * (*evicted = true: tell the index). Marks it used and most recent. */
uint32_t disk_slot_alloc(disk_t *d, bool *evicted);
/* Takes a given free slot (a caller that chooses slots itself, like the
 * store through tier_medium.h); most recent. No-op if used. */
void disk_slot_claim(disk_t *d, uint32_t slot);
/* The slot was read: most recent. */
void disk_slot_touch(disk_t *d, uint32_t slot);
/* The slot's block is gone; the slot is free. */
void disk_slot_free(disk_t *d, uint32_t slot);
bool disk_slot_used(const disk_t *d, uint32_t slot);

/* --- warm restart --- */

typedef struct disk_record {
    uint32_t slot;
    uint64_t seq;
    uint32_t ns_id;
    char ns[DISK_NS_MAX];
    uint64_t chain_hash;
    uint64_t parent_hash;
    uint32_t ntokens;
    uint32_t *tokens; /* ntokens, owned by the scan */
    uint64_t ident_hash;
    uint32_t entry; /* its namespace's in the table (disk_ns_get), or DISK_NO_ENTRY */
} disk_record_t;

typedef struct disk_scan {
    disk_record_t *recs; /* valid records, oldest first */
    size_t n;
    uint64_t max_seq; /* the highest sequence number read, deleted records' too */
    uint64_t torn;    /* slots written once whose record did not verify */
    uint64_t stale;   /* valid records of a block a newer record replaced */
    uint64_t deleted; /* valid records deleted since: under their namespace's
                         watermark, or tombstones */
} disk_scan_t;

/* Every slot's record is read by disk_open on an existing file; the
 * result is kept until disk_take_scan hands it over (once). A record
 * counts when its CRC over the slot verifies and it was not deleted (a
 * tombstone, or a sequence number under its namespace's watermark: its slot
 * stays free); for a block found more than once the newest sequence number
 * wins and the older slots are freed. The valid slots become used, in
 * sequence order (oldest least recent). */
void disk_take_scan(disk_t *d, disk_scan_t *out);
void disk_scan_free(disk_scan_t *s);

/* Warm restart in the background (cfg->defer_scan). disk_open then
 * reads only the superblock and its namespace table, and the daemon serves
 * while disk_scan_run reads every slot on a thread of its own: the
 * same records as disk_take_scan's, judged by the watermarks of the
 * table at open, none of their slots taken. Until disk_scan_settle,
 * no slot may be taken or written (the file's sequence numbers are not
 * known), and a Clear or another identity (disk_ns_delete,
 * disk_ns_note) deletes every record then on the disk of its
 * namespace (its watermark is written as DISK_SEQ_ALL, which also a
 * restart honours). disk_scan_run is thread-safe against every other
 * call here; it stops with KVS_EBUSY when *stop turns true, and adds the
 * slots it has read to *progress (either may be NULL). Returns 0, KVS_EIO
 * or KVS_ENOMEM (message in err); 0 and no records when no scan is
 * pending. */
#define DISK_SEQ_ALL UINT64_MAX
int disk_scan_run(disk_t *d, disk_scan_t *out, const atomic_bool *stop,
                  atomic_uint_fast64_t *progress, char *err, size_t errlen);
/* On the loop's thread once disk_scan_run returned (whatever it
 * returned): sequence numbers go on above sc's, the watermarks written
 * while it ran become real, and slots may be taken (the caller claims
 * each record's it keeps: disk_slot_claim, oldest first). The notes
 * queued so far (a watermark that could not be written) go to cfg->note
 * before it returns. */
void disk_scan_settle(disk_t *d, const disk_scan_t *sc);
bool disk_scan_pending(const disk_t *d);
/* Whether record r was deleted by its namespace's watermark of now (a Clear
 * or an identity change since the scan judged it); sets r->entry to its
 * namespace's entry of now. */
bool disk_record_deleted(disk_t *d, disk_record_t *r);

/* --- the namespace table (the superblock page) ---
 *
 * One entry per namespace name that wrote a record: the identity its
 * records carry (hash, canonical text, source: identity_source_t) and the
 * deletion watermark. The loop's thread only. Written (pwrite of the
 * superblock page) when an entry changes; the page holds what fits (a few
 * dozen namespaces with long names, over a hundred with short ones; texts
 * shared by namespaces are stored once), most recently used first: a
 * namespace left out has its records dropped at the next start (identity
 * unknown), never restored wrongly. */
typedef struct disk_ns {
    char ns[DISK_NS_MAX];
    uint64_t ident_hash;
    uint32_t source;
    uint64_t valid_from; /* records of ns with seq below it are deleted */
    char ident[DISK_IDENT_MAX + 1];
} disk_ns_t;

/* Table entry `entry` (a scan record's) into *out. KVS_ENOTFOUND if none. */
int disk_ns_get(const disk_t *d, uint32_t entry, disk_ns_t *out);

/* Namespace ns writes records of identity (hash, source, text): a no-op
 * when its entry says so already (a name compare); otherwise the entry is
 * made or changed, its watermark moved to the next sequence number (its
 * older records are of another identity, or of none the table named) and
 * the page written. Returns 0 or KVS_EIO (the page was not written; the
 * records still name their identity by hash; the message in err). */
int disk_ns_note(disk_t *d, const char *ns, uint64_t ident_hash, uint32_t source, const char *ident,
                 char *err, size_t errlen);

/* Namespace ns was cleared: every record of it written so far (in flight
 * included) is deleted, by moving its watermark to the next sequence
 * number (the entry made with the given identity if missing). The page is
 * written (one 4 KiB O_DIRECT write) before this returns: a SIGKILL after
 * it cannot undo the Clear; disk_sync after it, a power loss neither.
 * Returns 0 or KVS_EIO (message in err). */
int disk_ns_delete(disk_t *d, const char *ns, uint64_t ident_hash, uint32_t source,
                   const char *ident, char *err, size_t errlen);

/* Tombstones: each slot's first page is overwritten with one that is no
 * record (the scan counts it deleted), one 4 KiB O_DIRECT write each, done
 * when this returns (disk_sync for a power loss). For slots no write
 * is in flight to (the caller's to know). Returns 0, or KVS_EIO / KVS_ENOMEM
 * with a message in err. */
int disk_forget(disk_t *d, const uint32_t *slots, size_t n, char *err, size_t errlen);

/* fdatasync of the file: what was written outlasts a power loss. Blocks
 * for the disk's cache flush (milliseconds): call it off the loop.
 * Thread-safe. Returns 0 or KVS_EIO. */
int disk_sync(disk_t *d);

/* disk_sync on a thread of its own (here when none starts); a failure is
 * a note (DISK_NOTE_ERROR); disk_close waits for it. Returns at once. */
void disk_sync_async(disk_t *d);

/* --- notes ---
 *
 * What happened on the disk's own threads that an operator should hear (an
 * io_uring_submit that failed, a wake-up eventfd the ring cannot read, an
 * fdatasync of disk_sync_async that failed) is queued there as a note and
 * handed to cfg->note here, on the caller's thread, oldest first: call it
 * from the caller's loop now and then (after a batch's done, with the
 * counters). The queue keeps DISK_NOTES_MAX notes; those made while it is
 * full are counted, and the count is a note of its own. Thread-safe. */
#define DISK_NOTES_MAX 32u
#define DISK_NOTE_MAX  256u /* a note's bytes, with its NUL */
void disk_notes_flush(disk_t *d);

/* --- record encoding (tests, tools) --- */

/* Encodes a record into buf (slot_bytes, zeroed past the payload). */
void disk_encode(const disk_t *d, uint8_t *buf, uint32_t slot, const disk_meta_t *meta,
                 const void *payload);
/* 0 if buf holds a verifying record for slot (meta filled, tokens copied
 * into the caller's array of block_tokens), KVS_ENOTFOUND otherwise (*blank
 * tells a never-written slot from a torn or corrupt one). */
int disk_decode(const disk_t *d, const uint8_t *buf, uint32_t slot, disk_meta_t *meta,
                uint32_t *tokens, bool *blank);

#endif /* KVS_DISK_H */
