/* SPDX-License-Identifier: Apache-2.0 */
#include "cluster_store.h"

#include "cluster.h"
#include "cluster_tier.h"
#include "config.h"
#include "kvshare_status.h"
#include "log.h"
#include "store.h"

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

static void fetch_free(server_t *srv, struct cluster_fetch *f);

void cluster_store_close(server_t *srv)
{
    /* A closed tier runs no callback of its fetches: they end here. */
    while (srv->cluster_fetches)
        fetch_free(srv, srv->cluster_fetches);
    cluster_tier_free(srv->cluster_tier);
    srv->cluster_tier = NULL;
    cluster_close(srv->cluster);
    srv->cluster = NULL;
}

void cluster_store_sync_counters(server_t *srv)
{
    if (!srv->cluster || !srv->cluster_tier)
        return;
    cluster_stats_t cs;
    cluster_tier_stats_t ts;
    cluster_get_stats(srv->cluster, &cs);
    cluster_tier_get_stats(srv->cluster_tier, &ts);
    metrics_t *m = &srv->metrics;
    m->cluster_timeouts = cs.timeouts;
    m->cluster_node_errors = cs.down;
    m->cluster_auth_errors = cs.auth_errors;
    m->cluster_redirects = cs.moved + cs.ask;
    m->cluster_map_refreshes = cs.refreshes;
    m->cluster_bad_values = ts.corrupt + ts.mismatched;
    m->cluster_bytes_out = cs.bytes_out;
    m->cluster_bytes_in = cs.bytes_in;
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

/* ---- fetches on a Lookup miss ---- */

typedef struct cluster_fetch {
    server_t *srv;
    session_t *s; /* NULL once the session is gone */
    struct cluster_fetch *prev, *next;
    uint32_t ns;
    uint32_t *tokens; /* (m + k) blocks */
    size_t m, k;
    unsigned char **payloads; /* k, NULL until block m + j arrived */
} cluster_fetch_t;

static void fetch_free(server_t *srv, cluster_fetch_t *f)
{
    if (f->prev)
        f->prev->next = f->next;
    else
        srv->cluster_fetches = f->next;
    if (f->next)
        f->next->prev = f->prev;
    if (f->s)
        f->s->cluster_fetch = NULL;
    for (size_t j = 0; f->payloads && j < f->k; j++)
        free(f->payloads[j]);
    free(f->payloads);
    free(f->tokens);
    free(f);
}

static void fetch_block(void *arg, size_t j, const void *payload, size_t len)
{
    cluster_fetch_t *f = arg;
    /* Kept aside until the fetch ends: the pool blocks are taken only then,
     * for the run that arrived whole. */
    f->payloads[j] = malloc(len);
    if (f->payloads[j])
        memcpy(f->payloads[j], payload, len);
}

/* Puts the contiguous run of blocks that arrived after the cached prefix,
 * if that prefix is still in tier 1 where it was. Returns how many went in. */
static size_t fetch_install(server_t *srv, cluster_fetch_t *f)
{
    size_t run = 0;
    while (run < f->k && f->payloads[run])
        run++;
    if (run == 0 || srv->stopping)
        return 0;
    uint32_t bt = srv->geo.block_tokens;
    uint32_t *prefix = malloc((f->m ? f->m : 1) * sizeof(*prefix));
    size_t got = 0;
    if (!prefix)
        return 0;
    int rc = f->m ? radix_match(srv->index, f->ns, f->tokens, f->m * bt, prefix, f->m, &got) : 0;
    size_t installed = 0;
    bool tier1 = true;
    for (size_t i = 0; i < got; i++)
        tier1 = tier1 && prefix[i] < srv->num_blocks;
    if (rc == 0 && got == f->m && tier1)
        store_install(srv, f->ns, f->tokens, prefix, f->m, (const void *const *)f->payloads, run,
                      &installed);
    free(prefix);
    return installed;
}

static void fetch_done(void *arg, const uint8_t *hits, size_t n)
{
    cluster_fetch_t *f = arg;
    server_t *srv = f->srv;
    (void)hits;
    size_t installed = fetch_install(srv, f);
    srv->metrics.cluster_fetched_blocks += installed;
    srv->metrics.cluster_fetch_misses += n - installed;
    session_t *s = f->s;
    fetch_free(srv, f);
    /* Only this hold is ours to end: past its deadline the Lookup already
     * answered, and the session may be held for something else now. */
    if (s && s->held == SESSION_HOLD_CLUSTER)
        session_release(s);
}

/* How many blocks of tokens ns holds in any tier, and whether to fetch. */
static int fetch_plan(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                      size_t *m, size_t *k)
{
    size_t n_full = n_tokens / srv->geo.block_tokens;
    uint32_t *ids = malloc((n_full ? n_full : 1) * sizeof(*ids));
    if (!ids)
        return KVS_ENOMEM;
    int rc = radix_match(srv->index, ns, tokens, n_tokens, ids, n_full, m);
    free(ids);
    if (rc != 0)
        return rc;
    if (*m >= n_full)
        return KVS_ENOTFOUND;
    *k = n_full - *m;
    if (*k > CLUSTER_STORE_MAX_FETCH)
        *k = CLUSTER_STORE_MAX_FETCH;
    return 0;
}

static cluster_fetch_t *fetch_new(session_t *s, uint32_t ns, const uint32_t *tokens, size_t m,
                                  size_t k)
{
    server_t *srv = s->srv;
    size_t n_tok = (m + k) * srv->geo.block_tokens;
    cluster_fetch_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->srv = srv;
    f->s = s;
    f->ns = ns;
    f->m = m;
    f->k = k;
    f->tokens = malloc(n_tok * sizeof(*f->tokens));
    f->payloads = calloc(k, sizeof(*f->payloads));
    if (!f->tokens || !f->payloads) {
        free(f->tokens);
        free(f->payloads);
        free(f);
        return NULL;
    }
    memcpy(f->tokens, tokens, n_tok * sizeof(*f->tokens));
    f->next = srv->cluster_fetches;
    if (f->next)
        f->next->prev = f;
    srv->cluster_fetches = f;
    s->cluster_fetch = f;
    return f;
}

int cluster_store_fetch(session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                        uint64_t *until_ms)
{
    server_t *srv = s->srv;
    const char *name;
    size_t m = 0, k = 0;
    if (!srv->cluster_tier || srv->stopping || s->cluster_fetch || !ns_shared(srv, ns, &name))
        return KVS_ENOTFOUND;
    int rc = fetch_plan(srv, ns, tokens, n_tokens, &m, &k);
    if (rc != 0)
        return rc;
    uint32_t bt = srv->geo.block_tokens;
    uint64_t *hashes = malloc((m + k) * sizeof(*hashes));
    cluster_block_t *blocks = malloc(k * sizeof(*blocks));
    rc = hashes && blocks ? radix_chain_hashes(srv->index, ns, tokens, m + k, hashes) : KVS_ENOMEM;
    cluster_fetch_t *f = rc == 0 ? fetch_new(s, ns, tokens, m, k) : NULL;
    if (rc == 0 && !f)
        rc = KVS_ENOMEM;
    if (rc == 0) {
        for (size_t j = 0; j < k; j++)
            blocks[j] = (cluster_block_t){.ns = name,
                                          .ns_len = strlen(name),
                                          .hash = hashes[m + j],
                                          .tokens = f->tokens + (m + j) * bt,
                                          .n_tokens = bt,
                                          .payload_len = geometry_block_bytes(&srv->geo)};
        rc = cluster_tier_fetch(srv->cluster_tier, blocks, k, fetch_block, fetch_done, f);
        if (rc != 0) {
            srv->metrics.cluster_fetch_misses += k;
            fetch_free(srv, f);
        }
    }
    free(hashes);
    free(blocks);
    if (rc == 0)
        *until_ms = uv_now(srv->loop) + srv->cfg.cluster_timeout_ms + 100;
    return rc;
}

void cluster_store_detach(session_t *s)
{
    if (s->cluster_fetch) {
        s->cluster_fetch->s = NULL;
        s->cluster_fetch = NULL;
    }
}
