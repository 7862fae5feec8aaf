/* SPDX-License-Identifier: Apache-2.0 */
#include "cluster_store.h"

#include "cluster.h"
#include "cluster_tier.h"
#include "config.h"
#include "kvshare_status.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cluster_store_open(server_t *srv, char *err, size_t errlen)
{
    if (!srv->cfg.cluster_seeds || !srv->cfg.cluster_seeds[0])
        return 0;
    cluster_options_t opt = {.seeds = srv->cfg.cluster_seeds,
                             .auth_file = srv->cfg.cluster_auth_file,
                             .timeout_ms = srv->cfg.cluster_timeout_ms};
    int rc = cluster_new(srv->loop, &opt, &srv->cluster);
    if (rc != 0) {
        snprintf(err, errlen, "cluster tier: %s (cluster_seeds '%s'%s)", kvs_status_text(rc),
                 srv->cfg.cluster_seeds,
                 rc == KVS_EIO ? ", or the cluster_auth_file cannot be read" : "");
        return rc;
    }
    rc = cluster_tier_new(srv->cluster, CLUSTER_STORE_KEY_PREFIX, CLUSTER_STORE_MAX_PUTS,
                          &srv->cluster_tier);
    if (rc != 0) {
        cluster_close(srv->cluster);
        srv->cluster = NULL;
        snprintf(err, errlen, "cluster tier: %s", kvs_status_text(rc));
        return rc;
    }
    LOG_INFO("cluster tier: seeds %s, timeout %u ms", srv->cfg.cluster_seeds,
             srv->cfg.cluster_timeout_ms);
    return 0;
}

void cluster_store_close(server_t *srv)
{
    cluster_tier_free(srv->cluster_tier);
    srv->cluster_tier = NULL;
    cluster_close(srv->cluster);
    srv->cluster = NULL;
}

static bool ns_shared(const server_t *srv, uint32_t ns, const char **name)
{
    *name = radix_ns_name(srv->index, ns);
    const config_ns_t *sec = *name ? config_find_ns(srv->conf, *name) : NULL;
    return sec && sec->shared;
}

/* The bytes of pool block b, every layer and plane, in that order. */
static int read_block(server_t *srv, uint32_t b, unsigned char *out)
{
    uint64_t slot = geometry_slot_bytes(&srv->geo);
    uint32_t planes = geometry_planes(&srv->geo);
    for (uint32_t l = 0; l < srv->geo.layers; l++)
        for (uint32_t p = 0; p < planes; p++) {
            uint64_t off = geometry_offset(&srv->geo, srv->num_blocks, l, p, b);
            int rc = backend_read(srv->backend, off, out, slot);
            if (rc != 0)
                return rc;
            out += slot;
        }
    return 0;
}

void cluster_store_committed(server_t *srv, uint32_t ns, const uint32_t *ids, const uint32_t *fresh,
                             size_t n, const uint32_t *tokens)
{
    const char *name;
    if (!srv->cluster_tier || n == 0 || !ns_shared(srv, ns, &name))
        return;
    size_t bytes = geometry_block_bytes(&srv->geo);
    unsigned char *payload = malloc(bytes);
    if (!payload) {
        srv->metrics.cluster_put_drops += n;
        return;
    }
    uint32_t bt = srv->geo.block_tokens;
    for (size_t i = 0; i < n; i++) {
        uint64_t hash;
        if (!fresh[i])
            continue;
        /* The copy out of the pool is synchronous: a memcpy on the host
         * backend; on cuda a device-to-host copy (to move off the loop). */
        if (radix_block_hash(srv->index, ids[i], &hash) != 0 ||
            read_block(srv, ids[i], payload) != 0) {
            srv->metrics.cluster_put_drops++;
            continue;
        }
        cluster_block_t b = {.ns = name,
                             .ns_len = strlen(name),
                             .hash = hash,
                             .tokens = tokens + i * bt,
                             .n_tokens = bt,
                             .payload_len = bytes};
        if (cluster_tier_put(srv->cluster_tier, &b, payload) == 0)
            srv->metrics.cluster_puts++;
        else
            srv->metrics.cluster_put_drops++;
    }
    free(payload);
}
