/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_restore: warm restart in the background. A daemon started on an
 * existing disk tier file listens at once and serves (the file's blocks are
 * misses until restored) while the file is read on a thread of its own and
 * its records go into the index as tier-3 blocks, a few milliseconds of the
 * loop per turn (store_restore.c says how; store_disk.h what a record must
 * be to go in). A Clear, an identity change or an Evict during the restore
 * deletes what it names, restored or not. Progress: the log (a line every
 * 5 s and one at the end), Stats and /metrics (store_restore_progress).
 */
#ifndef KVS_DAEMON_STORE_RESTORE_H
#define KVS_DAEMON_STORE_RESTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server.h"

typedef struct store_restore store_restore_t;

/* Starts the restore when the disk tier's scan was deferred (kvshared.c opens
 * it so), after the config's namespaces exist. 0, or KVS_ENOMEM / KVS_EIO
 * (nothing started: the tier starts empty, its records stay on the disk). */
int store_restore_start(server_t *srv);

/* Stops it (the scan's thread joined) and closes its handles: their memory
 * goes in the loop's close callbacks. For the shutdown; accepts none. */
void store_restore_close(server_t *srv);

/* Whether a restore runs: tier 3 then takes no new block (store_spill). */
bool store_restore_busy(const server_t *srv);

/* An Evict's blocks of namespace ns (their chained hashes) that the index
 * does not hold: their records on the disk are not restored, and get
 * tombstones (now, or when the scan has read them). */
void store_restore_forget(server_t *srv, const char *ns, const uint64_t *hashes, size_t n);

typedef struct store_restore_progress {
    const char *phase;       /* "scanning", "restoring", "done", "failed"; NULL: no restore ran */
    uint64_t slots, scanned; /* the file's slots; read so far */
    uint64_t records;        /* valid records the scan found (0 until it ends) */
    uint64_t restored;       /* blocks put in the index so far */
    uint64_t dropped;        /* records not restored */
    uint64_t elapsed_ms;     /* since the start, to the end once ended */
} store_restore_progress_t;

void store_restore_progress(const server_t *srv, store_restore_progress_t *out);

#endif /* KVS_DAEMON_STORE_RESTORE_H */
