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
 * Not yet here: a Lookup miss in a shared namespace that fetches the chain's
 * next blocks from the cluster (cluster_tier_fetch is ready for it).
 */
#ifndef KVS_DAEMON_CLUSTER_STORE_H
#define KVS_DAEMON_CLUSTER_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "server.h"

/* Writes committed at once, at most. */
#define CLUSTER_STORE_MAX_PUTS 256
/* Keys start with this: one cluster may hold other data. */
#define CLUSTER_STORE_KEY_PREFIX "kvs:"

/* Starts the client when srv->cfg.cluster_seeds is set (else does
 * nothing). Returns 0, or an error with a message in err: KVS_EINVAL (bad
 * seeds), KVS_EIO (the auth file), KVS_ENOMEM. */
int cluster_store_open(server_t *srv, char *err, size_t errlen);

/* Stops the client: writes in flight are abandoned. The client's memory goes
 * when the loop runs its close callbacks. */
void cluster_store_close(server_t *srv);

/* Blocks ids[i] with fresh[i] set just became cached in namespace ns, block
 * i holding tokens[i * block_tokens ...]: writes those of a shared namespace
 * through. */
void cluster_store_committed(server_t *srv, uint32_t ns, const uint32_t *ids, const uint32_t *fresh,
                             size_t n, const uint32_t *tokens);

#endif /* KVS_DAEMON_CLUSTER_STORE_H */
