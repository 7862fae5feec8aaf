/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_disk: the disk tier (disk.h) as tier 3 of the store's chain.
 *
 *     pool (tier 1) --demote--> host (tier 2) --demote--> disk (tier 3)
 *          ^                                                   |
 *          `------------------- promote (a Lookup's hit) ------'
 *
 * The index (radix.h, Tiers) names tier-3 blocks by ids after tier 2's; the
 * medium (store_disk_medium.h) copies them: a put gathers a tier-2 block's
 * pieces from host memory into one record, a get scatters a verified
 * record into a pool block (the pool's layout keeps a block's bytes in
 * pieces, one per layer and plane). The gather runs on the disk tier's
 * threads, with the I/O; the scatter on the loop (the backend writes the
 * pool).
 *
 * Warm restart (store_restore.h, in the background): the records the
 * disk tier's scan found at start (CRC
 * verified, newest sequence number of each block) name their namespace,
 * chained hash, parent's chained hash and tokens, so each chain is rebuilt
 * from its namespace's seed (namespaces_seed) down and put into the index
 * as tier-3 blocks (radix_restore). A record whose chain does not reach its
 * namespace's seed (a parent lost or torn), or whose namespace this
 * kvshared does not serve, is dropped and its slot freed.
 *
 * Identity (identity.h): a record is restored only when the identity it
 * carries is its namespace's now; a namespace whose identity a worker had
 * declared (the file's namespace table says so) is bound back to it first,
 * so the same engine finds its cache and another model is refused. Others
 * are dropped (disk_identity_dropped, one log line per namespace naming
 * both identities). Records deleted by a Clear or an Evict are dropped by
 * the scan already, or by the restore when the deletion came during it
 * (disk_deleted_dropped; disk.h).
 */
#ifndef KVS_DAEMON_STORE_DISK_H
#define KVS_DAEMON_STORE_DISK_H

#include <stddef.h>

#include "server.h"
#include "tier_medium.h"

/* The disk medium over srv->disk_tier, sourcing blocks from srv's host tier
 * and pool. Errors: store_disk_medium_open's. */
int store_disk_open(server_t *srv, tier_medium_t **out);

/* Clear: namespace ns's records on the disk, of any identity, written up
 * to now (in flight included), are deleted for every later start (its
 * watermark: one 4 KiB O_DIRECT write before this returns, so no SIGKILL
 * undoes it; an fdatasync follows on a thread, for a power loss). Blocks
 * of ns that moved up from the disk leave their records behind: those go
 * too. 0 without a disk tier. Errors: KVS_EIO. */
int store_disk_forget_ns(server_t *srv, uint32_t ns);

/* Evict: the records on the disk of the full blocks of `tokens` in ns that
 * no block of the index holds (the ones just evicted, and copies left by
 * blocks that moved up since) get tombstones (store_disk_medium_forget;
 * written when this returns, an fdatasync following on a thread). 0
 * without a disk tier. Errors: KVS_EIO, KVS_ENOMEM, KVS_ENONS. */
int store_disk_forget_prompt(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_tokens);

#endif /* KVS_DAEMON_STORE_DISK_H */
