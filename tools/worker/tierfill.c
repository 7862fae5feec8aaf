/* SPDX-License-Identifier: Apache-2.0 */
#include "tierfill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Blocks per filler commit: a chain of its own. */
#define FILL_CHUNK 16u

/* Where namespace ns's blocks are now, by the daemon's count. */
static int ns_where(kvs_client_t *c, const char *ns, uint32_t *pool, uint32_t *tier2)
{
    kvs_stats_t st;
    int rc = kvs_stats(c, &st), found = 0;

    if (rc < 0)
        return rc;
    for (size_t i = 0; i < st.n_namespaces; i++)
        if (strcmp(st.namespaces[i].name, ns) == 0) {
            *pool = st.namespaces[i].cached_blocks;
            *tier2 = st.namespaces[i].tier2_blocks;
            found = 1;
        }
    kvs_stats_free(&st);
    return found ? 0 : KVS_ENOTFOUND;
}

int tierfill_demote(kvs_client_t *c, const char *ns, const char *filler_ns, uint32_t want_tier2,
                    uint32_t *serial, tierfill_result_t *res, char *err, size_t err_len)
{
    kvs_geometry_t g;
    tierfill_result_t r = {0};
    uint32_t *tokens = NULL, *ids = NULL, *canonical = NULL, chunk;
    uint64_t limit;
    char dummy[8];
    int rc;

    if (!err)
        err = dummy, err_len = sizeof(dummy);
    if (err_len)
        err[0] = '\0';
    if (!c || !ns || !ns[0] || !filler_ns || !filler_ns[0] || strcmp(ns, filler_ns) == 0 ||
        !serial) {
        snprintf(err, err_len, "invalid argument");
        return KVS_EINVAL;
    }
    rc = kvs_geometry(c, &g);
    if (rc < 0) {
        snprintf(err, err_len, "no pool geometry: %s", kvs_strerror(rc));
        return rc;
    }
    if (!g.tier2_blocks) {
        snprintf(err, err_len, "kvshared has no tier 2: start it with --host-tier SIZE");
        return KVS_ENOTSUP;
    }
    chunk = g.num_blocks < FILL_CHUNK ? g.num_blocks : FILL_CHUNK;
    tokens = malloc(sizeof(*tokens) * chunk * g.block_tokens);
    ids = malloc(sizeof(*ids) * chunk);
    canonical = malloc(sizeof(*canonical) * chunk);
    if (!tokens || !ids || !canonical) {
        rc = KVS_ENOMEM;
        snprintf(err, err_len, "out of memory");
        goto out;
    }
    /* Past this much filler, whatever of ns is older than it has left the
     * pool unless something pins it. */
    limit = (uint64_t)g.num_blocks + g.tier2_blocks + chunk;
    for (;;) {
        size_t done = 0;

        rc = ns_where(c, ns, &r.pool_blocks, &r.tier2_blocks);
        if (rc < 0) {
            snprintf(err, err_len, "namespace '%s': %s", ns,
                     rc == KVS_ENOTFOUND ? "kvshared does not know it" : kvs_strerror(rc));
            goto out;
        }
        if (r.pool_blocks == 0) {
            if (r.tier2_blocks >= want_tier2)
                break;
            rc = KVS_ENOTFOUND;
            snprintf(err, err_len,
                     "namespace '%s' has %u blocks in tier 2, not %u: tier 2 (%u blocks) dropped "
                     "some",
                     ns, r.tier2_blocks, want_tier2, g.tier2_blocks);
            goto out;
        }
        if (r.filler_blocks >= limit) {
            rc = KVS_ENOTFOUND;
            snprintf(err, err_len,
                     "namespace '%s' keeps %u blocks in the pool after %u filler blocks: are they "
                     "pinned?",
                     ns, r.pool_blocks, r.filler_blocks);
            goto out;
        }
        /* A chain of its own: token 0 names the chain, tokens >= 2^31. */
        for (uint32_t i = 0; i < chunk * g.block_tokens; i++)
            tokens[i] = 0x80000000u | (i ? i : *serial & 0x7fffffffu);
        (*serial)++;
        rc = kvs_alloc(c, filler_ns, chunk, ids);
        if (rc == 0)
            rc = kvs_commit(c, filler_ns, tokens, (size_t)chunk * g.block_tokens, ids, chunk,
                            canonical, &done);
        if (rc < 0) {
            snprintf(err, err_len, "filler blocks in '%s': %s (%s)", filler_ns, kvs_strerror(rc),
                     kvs_last_error(c));
            goto out;
        }
        /* Duplicates (a serial seen before by this daemon) stay WRITING:
         * giving back ids and canonical frees both. */
        rc = kvs_release(c, canonical, chunk, NULL);
        for (uint32_t i = 0; rc == 0 && i < chunk; i++)
            if (ids[i] != canonical[i])
                rc = kvs_release(c, &ids[i], 1, NULL);
        if (rc < 0) {
            snprintf(err, err_len, "release of filler blocks: %s", kvs_strerror(rc));
            goto out;
        }
        r.filler_blocks += chunk;
    }
    rc = 0;
out:
    if (res)
        *res = r;
    free(canonical);
    free(ids);
    free(tokens);
    return rc;
}
