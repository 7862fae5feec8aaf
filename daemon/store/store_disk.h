/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_disk: the disk tier (tier_disk.h) as tier 3 of the store's chain.
 *
 *     pool (tier 1) --demote--> host (tier 2) --demote--> disk (tier 3)
 *          ^                                                   |
 *          `------------------- promote (a Lookup's hit) ------'
 *
 * The index (radix.h, Tiers) names tier-3 blocks by ids after tier 2's; the
 * medium (tier_disk_medium.h) copies them: a put gathers a tier-2 block's
 * pieces from host memory into one record, a get scatters a verified
 * record into a pool block (the pool's layout keeps a block's bytes in
 * pieces, one per layer and plane). The gather runs on the disk tier's
 * threads, with the I/O; the scatter on the loop (the backend writes the
 * pool).
 *
 * Warm restart: the records the disk tier's scan found at start (CRC
 * verified, newest sequence number of each block) name their namespace,
 * chained hash, parent's chained hash and tokens, so each chain is rebuilt
 * from its namespace's seed (namespaces_seed) down and put into the index
 * as tier-3 blocks (radix_restore). A record whose chain does not reach its
 * namespace's seed (a parent lost or torn), or whose namespace this
 * kvshared does not serve, is dropped and its slot freed.
 */
#ifndef KVS_DAEMON_STORE_DISK_H
#define KVS_DAEMON_STORE_DISK_H

#include <stddef.h>

#include "server.h"
#include "tier_medium.h"

/* The disk medium over srv->disk_tier, sourcing blocks from srv's host tier
 * and pool. Errors: tier_disk_medium_open's. */
int store_disk_open(server_t *srv, tier_medium_t **out);

/* Puts the disk tier's scanned records into the index (once, before
 * sessions are served; the namespaces declared by the config exist).
 * *restored = blocks now in tier 3, *dropped = records not restored.
 * Errors: KVS_ENOMEM (the index holds what was restored so far). */
int store_disk_restore(server_t *srv, size_t *restored, size_t *dropped);

#endif /* KVS_DAEMON_STORE_DISK_H */
