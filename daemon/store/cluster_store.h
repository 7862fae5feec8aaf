/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster_store: the cluster tier in the daemon (docs/CLUSTER.md).
 *
 * With cluster_seeds set, kvshared keeps one cluster client (cluster.h) on
 * its loop. Namespaces opt in with `shared = yes` in their section: when a
 * block of such a namespace is committed and becomes cached, it is written
 * through to the cluster (cluster_tier.h), keyed by the namespace name (the
 * model identity), the geometry and its chain hash. The write never makes
 * the commit wait: it is sent, and a write that finds too many in flight is
 * dropped and counted (cluster_put_drops).
 *
 * The client runs on a thread of its own, with its own libuv loop: the
 * connections, the values' checksums and every copy of a block's bytes (out
 * of the pool into a value, a reply into the pool) stay off the daemon's
 * loop. The loop pins a committed block until the thread has copied it out,
 * and takes free pool blocks for a fetch before the thread writes into them.
 *
 * A Lookup that misses locally in a shared namespace asks the cluster for
 * the chain's next blocks (at most CLUSTER_STORE_MAX_FETCH, in growing
 * rounds that stop at the first block missing), its session held
 * (SESSION_HOLD_CLUSTER) until they are in, or the client's timeout ends
 * them. The contiguous run that verified goes into the pool blocks
 * taken for it (store_install_take: evicting for them as an Alloc does,
 * the prefix it extends pinned meanwhile) and the Lookup runs again,
 * answering as for any cached prefix. A session that ends meanwhile is
 * detached: the blocks still go into the pool.
 */
#ifndef KVS_DAEMON_CLUSTER_STORE_H
#define KVS_DAEMON_CLUSTER_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "server.h"
#include "session.h"

/* Writes waiting for their turn at most (their blocks pinned, not copied:
 * at most this many, and a quarter of the pool or 64); one more is dropped
 * and counted. In flight to the cluster at most CLUSTER_STORE_PUT_BYTES of
 * values (and CLUSTER_STORE_MAX_PUTS), so that a fetch's GETs never queue
 * behind more than that on a connection. */
#define CLUSTER_STORE_MAX_QUEUED 65536
#define CLUSTER_STORE_MAX_PUTS   256
#define CLUSTER_STORE_PUT_BYTES  (64u << 20)

/* Starts the client when srv->cfg.cluster_seeds is set (else does
 * nothing). Returns 0, or an error with a message in err: KVS_EINVAL (bad
 * seeds), KVS_EIO (the auth file), KVS_ENOMEM. */
int cluster_store_open(server_t *srv, char *err, size_t errlen);

/* Stops the client: writes in flight are abandoned. The client's memory goes
 * when the loop runs its close callbacks. */
void cluster_store_close(server_t *srv);

/* Copies the client's counters into srv->metrics (Stats, /metrics); keeps
 * the last copy once the client is closed. */
void cluster_store_sync_counters(server_t *srv);

/* Copies the cluster nodes' figures (as of at most 50 ms ago) into out, at
 * most max of them. Returns how many; 0 without a cluster tier. */
size_t cluster_store_nodes(server_t *srv, cluster_node_stats_t *out, size_t max);

/* Blocks of a chain one Lookup fetches at most: this many, this many bytes
 * of blocks, and a quarter of the pool. It asks in rounds: the first
 * CLUSTER_STORE_FETCH_FIRST blocks, then, while every block of a round
 * came, CLUSTER_STORE_FETCH_GROWTH times as many as the round before. */
#define CLUSTER_STORE_MAX_FETCH    8192
#define CLUSTER_STORE_FETCH_BYTES  (1024u << 20)
#define CLUSTER_STORE_FETCH_FIRST  64
#define CLUSTER_STORE_FETCH_GROWTH 4

/* For a Lookup of s in ns that the pool does not fully hold: starts fetching
 * the next blocks from the cluster when ns is shared. Returns 0 when it
 * started (hold s for SESSION_HOLD_CLUSTER until *until_ms; the fetch
 * releases it), else KVS_ENOTFOUND (nothing to fetch: no cluster tier, ns
 * not shared, the prefix all cached, s already fetching) or an error of the
 * start. */
int cluster_store_fetch(session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                        uint64_t *until_ms);

/* s is closing: its fetch, if any, goes on without it. */
void cluster_store_detach(session_t *s);

/* Blocks ids[i] with fresh[i] set just became cached in namespace ns, block
 * i holding tokens[i * block_tokens ...]: writes those of a shared namespace
 * through. */
void cluster_store_committed(server_t *srv, uint32_t ns, const uint32_t *ids, const uint32_t *fresh,
                             size_t n, const uint32_t *tokens);

/* Namespace ns was just cleared (Clear): when it is shared and its section
 * says cluster_clear, its keys of its identity are deleted in the cluster,
 * off the loop, within cluster_clear_timeout_ms (cluster_tier_clear;
 * counted: cluster_keys_deleted, and cluster_clears_incomplete when keys
 * are left, which is logged). From now on this daemon never fetches a
 * value of it written before now (the cut: a value's written stamp), even
 * while the deletion runs or where it left keys. Writes of it handed over
 * and not yet sent are dropped. The Clear's reply does not wait. */
void cluster_store_cleared(server_t *srv, uint32_t ns);

#endif /* KVS_DAEMON_CLUSTER_STORE_H */
