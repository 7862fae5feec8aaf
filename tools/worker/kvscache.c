/* SPDX-License-Identifier: Apache-2.0 */
#include "kvscache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "kvshare.h"

struct kvscache {
    const model_t *model;
    geometry_t geom;
    /* One worker: the worker's client, mapping the pool. A tensor-parallel
     * group (tp > 1): the group's scheduler, which maps nothing and makes
     * every call; ranks[r] maps device r's pool, wrapped as shards[r]. */
    kvs_client_t *client;
    char *ns;
    kvstore_t *shared; /* wraps the pool mapped at connection `epoch`; NULL: none yet */
    uint64_t epoch;
    uint32_t tp;
    geometry_t shard_geom; /* one rank's heads: kv_heads / tp */
    kvs_client_t *ranks[KVSCACHE_MAX_TP];
    kvstore_t *shards[KVSCACHE_MAX_TP];
    uint64_t rank_epoch[KVSCACHE_MAX_TP];
    int disabled; /* the daemon's pool does not fit the model: private only */
    kvstore_t *priv;

    /* The request in flight. */
    int lost;        /* a call failed, or was not made: the run does not count */
    uint32_t *extra; /* blocks to release besides the request's table */
    uint32_t n_extra, cap_extra;
    uint32_t *scratch; /* commit: canonical ids */
    uint32_t cap_scratch;

    kvscache_stats_t stats;
    char note[512];
};

/* Leaves a message for kvscache_note(). */
#define note(kc, ...) errbuf_set((kc)->note, sizeof((kc)->note), 0, __VA_ARGS__)

static int grow(uint32_t **arr, uint32_t *cap, uint32_t need)
{
    uint32_t *p;

    if (need <= *cap)
        return 0;
    p = realloc(*arr, sizeof(*p) * need);
    if (!p)
        return KVS_ENOMEM;
    *arr = p;
    *cap = need;
    return 0;
}

static int extra_add(kvscache_t *kc, const uint32_t *ids, uint32_t n)
{
    if (grow(&kc->extra, &kc->cap_extra, kc->n_extra + n) < 0)
        return KVS_ENOMEM;
    memcpy(kc->extra + kc->n_extra, ids, sizeof(*ids) * n);
    kc->n_extra += n;
    return 0;
}

/* Whether the pool the client maps is one this model can compute in: host
 * memory, the model's geometry, and the layout of geometry.h (the daemon's
 * strides and one far block address agree with geometry_offset). */
static int check_pool(kvs_client_t *client, const geometry_t *g, char *err, size_t err_len)
{
    kvs_geometry_t pg;
    geometry_dtype_t dtype;
    uintptr_t base = kvs_pool_base(client), far = 0;
    uint64_t slot = geometry_slot_bytes(g);

    if (kvs_geometry(client, &pg) < 0) {
        snprintf(err, err_len, "kvshared described no pool");
        return KVS_ENOTSUP;
    }
    if (pg.backend != KVS_BACKEND_HOST) {
        snprintf(err, err_len,
                 "kvshared's pool is in GPU memory; this worker computes on the CPU and needs "
                 "a host pool: start kvshared with --backend host");
        return KVS_ENOTSUP;
    }
    if (geometry_dtype_parse(pg.dtype, &dtype) < 0 || dtype != g->dtype || pg.layers != g->layers ||
        pg.kv_heads != g->kv_heads || pg.head_dim != g->head_dim ||
        pg.block_tokens != g->block_tokens) {
        snprintf(err, err_len,
                 "kvshared serves %u layers x %u kv_heads x %u head_dim %s, %u-token blocks; "
                 "this model needs %u x %u x %u fp32, %u-token blocks: start kvshared with "
                 "--layers %u --kv-heads %u --head-dim %u --dtype fp32 --block-tokens %u",
                 pg.layers, pg.kv_heads, pg.head_dim, pg.dtype, pg.block_tokens, g->layers,
                 g->kv_heads, g->head_dim, g->block_tokens, g->layers, g->kv_heads, g->head_dim,
                 g->block_tokens);
        return KVS_ENOTSUP;
    }
    if (!base || !pg.num_blocks || pg.slot_bytes != slot || pg.block_stride != slot ||
        pg.kv_stride != geometry_offset(g, pg.num_blocks, 0, 1, 0) ||
        pg.layer_stride != geometry_offset(g, pg.num_blocks, 1, 0, 0) ||
        pg.pool_bytes < geometry_offset(g, pg.num_blocks, g->layers, 0, 0) ||
        kvs_block_addr(client, g->layers - 1, 1, pg.num_blocks - 1, &far) < 0 ||
        far - base != geometry_offset(g, pg.num_blocks, g->layers - 1, 1, pg.num_blocks - 1)) {
        snprintf(err, err_len,
                 "kvshared's pool is not laid out as [layer][k|v][block][token][kv_head]"
                 "[head_dim] (slot %llu B, strides %llu/%llu/%llu, mapped at %p)",
                 (unsigned long long)pg.slot_bytes, (unsigned long long)pg.layer_stride,
                 (unsigned long long)pg.kv_stride, (unsigned long long)pg.block_stride,
                 (void *)base);
        return KVS_ENOTSUP;
    }
    return 0;
}

/* A group: the daemon serves tp ranks, and client is rank `rank` of them
 * (the scheduler: any rank). */
static int check_group(kvs_client_t *client, uint32_t tp, uint32_t rank, char *err, size_t err_len)
{
    uint32_t r = 0, size = 0;

    if (kvs_group(client, &r, &size) < 0 || size != tp || (rank != UINT32_MAX && r != rank)) {
        snprintf(err, err_len,
                 "kvshared serves %u devices (ranks); this worker group has %u: start kvshared "
                 "with --devices 0-%u",
                 size, tp, tp - 1);
        return KVS_ENOTSUP;
    }
    return 0;
}

/* A group: checks the scheduler's view and wraps each rank's pool (its
 * shard of every block) when its connection is new. */
static int adopt_shards(kvscache_t *kc, char *err, size_t err_len)
{
    kvs_geometry_t pg;
    int rc = check_group(kc->client, kc->tp, UINT32_MAX, err, err_len);

    for (uint32_t r = 0; rc == 0 && r < kc->tp; r++) {
        if (kc->shards[r] && kc->rank_epoch[r] == kvs_epoch(kc->ranks[r]))
            continue;
        kvstore_free(kc->shards[r]);
        kc->shards[r] = NULL;
        rc = check_group(kc->ranks[r], kc->tp, r, err, err_len);
        if (rc == 0)
            rc = check_pool(kc->ranks[r], &kc->shard_geom, err, err_len);
        if (rc < 0)
            return rc;
        kvs_geometry(kc->ranks[r], &pg);
        rc = kvstore_wrap((void *)kvs_pool_base(kc->ranks[r]), &kc->shard_geom, pg.num_blocks,
                          &kc->shards[r]);
        if (rc < 0) {
            snprintf(err, err_len, "cannot wrap rank %u's pool: %s", r, kvs_strerror(rc));
            return rc;
        }
        kc->rank_epoch[r] = kvs_epoch(kc->ranks[r]);
    }
    return rc;
}

/* Wraps the pool of the current connection when it is new. */
static int adopt_pool(kvscache_t *kc, char *err, size_t err_len)
{
    kvs_geometry_t pg;
    int rc;

    if (kc->tp > 1)
        return adopt_shards(kc, err, err_len);
    if (kc->shared && kc->epoch == kvs_epoch(kc->client))
        return 0;
    kvstore_free(kc->shared);
    kc->shared = NULL;
    rc = check_pool(kc->client, &kc->geom, err, err_len);
    if (rc < 0)
        return rc;
    kvs_geometry(kc->client, &pg);
    rc = kvstore_wrap((void *)kvs_pool_base(kc->client), &kc->geom, pg.num_blocks, &kc->shared);
    if (rc < 0) {
        snprintf(err, err_len, "cannot wrap the pool: %s", kvs_strerror(rc));
        return rc;
    }
    kc->epoch = kvs_epoch(kc->client);
    return 0;
}

/* The scheduler's connection and, in a group, every rank's. */
static int all_connected(const kvscache_t *kc)
{
    if (!kvs_connected(kc->client))
        return 0;
    for (uint32_t r = 0; kc->tp > 1 && r < kc->tp; r++)
        if (!kvs_connected(kc->ranks[r]))
            return 0;
    return 1;
}

int kvscache_open(const kvscache_opts_t *o, const model_t *m, kvscache_t **out, char *err,
                  size_t err_len)
{
    kvscache_t *kc = NULL;
    kvs_options_t ko;
    char dummy[8];
    int rc;

    if (!err)
        err = dummy, err_len = sizeof(dummy);
    if (err_len)
        err[0] = '\0';
    if (!o || !m || !out || !o->private_blocks) {
        snprintf(err, err_len, "invalid argument");
        return KVS_EINVAL;
    }
    if (o->tp > KVSCACHE_MAX_TP || (o->tp > 1 && m->cfg.kv_heads % o->tp)) {
        snprintf(err, err_len,
                 "a group of %u ranks cannot split this model's %u KV heads (at most %d ranks, "
                 "a divisor of the KV heads)",
                 o->tp, m->cfg.kv_heads, KVSCACHE_MAX_TP);
        return KVS_EINVAL;
    }
    kc = calloc(1, sizeof(*kc));
    if (!kc || !(kc->ns = strdup(o->ns ? o->ns : ""))) {
        rc = KVS_ENOMEM;
        goto fail;
    }
    kc->model = m;
    kc->tp = o->tp > 1 ? o->tp : 1;
    model_config_geometry(&m->cfg, &kc->geom);
    kc->shard_geom = kc->geom;
    kc->shard_geom.kv_heads = kc->geom.kv_heads / kc->tp;
    rc = kvstore_new_private(&kc->geom, o->private_blocks, &kc->priv);
    if (rc < 0)
        goto fail;

    kvs_options_init(&ko);
    ko.socket_path = o->socket_path;
    ko.worker_name = o->worker_name;
    ko.timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 1000;
    ko.reconnect_ms = o->reconnect_ms > 0 ? o->reconnect_ms : 1000;
    ko.flags = KVS_LAZY | (kc->tp > 1 ? KVS_GROUP_SCHEDULER : 0);
    rc = kvs_connect(&ko, &kc->client);
    if (rc < 0) {
        snprintf(err, err_len, "kvs_connect: %s", kvs_strerror(rc));
        goto fail;
    }
    for (uint32_t r = 0; kc->tp > 1 && r < kc->tp; r++) {
        ko.flags = KVS_LAZY | KVS_RANK;
        ko.rank = r;
        rc = kvs_connect(&ko, &kc->ranks[r]);
        if (rc < 0) {
            snprintf(err, err_len, "kvs_connect (rank %u): %s", r, kvs_strerror(rc));
            goto fail;
        }
    }
    /* A daemon of another group size refuses the ranks' connections: say
     * why now, from the scheduler's view, rather than run privately. */
    if (kc->tp > 1 && kvs_connected(kc->client)) {
        rc = check_group(kc->client, kc->tp, UINT32_MAX, err, err_len);
        if (rc < 0)
            goto fail;
    }
    if (all_connected(kc)) {
        rc = adopt_pool(kc, err, err_len);
        if (rc < 0)
            goto fail;
    }
    *out = kc;
    return 0;
fail:
    if (rc == KVS_ENOMEM && !err[0])
        snprintf(err, err_len, "out of memory");
    kvscache_free(kc);
    return rc;
}

void kvscache_free(kvscache_t *kc)
{
    if (!kc)
        return;
    for (uint32_t r = 0; r < kc->tp && r < KVSCACHE_MAX_TP; r++) {
        kvs_close(kc->ranks[r]);
        kvstore_free(kc->shards[r]);
    }
    kvs_close(kc->client);
    kvstore_free(kc->shared);
    kvstore_free(kc->priv);
    free(kc->extra);
    free(kc->scratch);
    free(kc->ns);
    free(kc);
}

/* The callbacks of a shared run. None calls the daemon once the connection
 * has dropped: the call would reconnect and map the pool anew while the
 * request still reads the old mapping's blocks. */
static int usable(kvscache_t *kc)
{
    if (!kvs_connected(kc->client) || (kc->tp == 1 && kvs_epoch(kc->client) != kc->epoch))
        kc->lost = 1;
    for (uint32_t r = 0; kc->tp > 1 && r < kc->tp; r++)
        if (!kvs_connected(kc->ranks[r]) || kvs_epoch(kc->ranks[r]) != kc->rank_epoch[r])
            kc->lost = 1;
    return !kc->lost;
}

static int kvs_lookup_cb(void *ctx, const uint32_t *tokens, uint32_t n, uint32_t *ids,
                         uint32_t max_blocks, uint32_t *matched_blocks)
{
    kvscache_t *kc = ctx;
    size_t got = 0;

    *matched_blocks = 0;
    if (!usable(kc))
        return 0;
    if (kvs_lookup(kc->client, kc->ns, tokens, n, 1, ids, max_blocks, &got) < 0 ||
        got > max_blocks) {
        usable(kc);
        return 0; /* a miss */
    }
    *matched_blocks = (uint32_t)got;
    return 0;
}

static int kvs_alloc_cb(void *ctx, uint32_t n, uint32_t *ids)
{
    kvscache_t *kc = ctx;
    int rc;

    if (!usable(kc))
        return KVS_ENOTCONN;
    rc = kvs_alloc(kc->client, kc->ns, n, ids);
    if (rc < 0)
        usable(kc);
    return rc;
}

/* Commits the table as it is: the lookup's pinned blocks lead it, the
 * daemon keeps their pins as they are, so nothing is allocated for them. */
static int kvs_commit_cb(void *ctx, const uint32_t *tokens, uint32_t n_blocks, uint32_t n_matched,
                         uint32_t *ids)
{
    kvscache_t *kc = ctx;
    uint32_t bt = kc->geom.block_tokens, *canonical;
    kvs_commit_opts_t co;
    size_t done = 0;
    int rc;

    if (!usable(kc))
        return KVS_ENOTCONN;
    rc = grow(&kc->scratch, &kc->cap_scratch, n_blocks);
    if (rc < 0)
        goto out;
    canonical = kc->scratch;
    /* A group: worker_run calls commit after the forward pass, so every
     * rank's shard is written; each rank declares its own for these tokens,
     * then the scheduler commits for the group (the daemon caches no block
     * some rank did not declare). */
    for (uint32_t r = 0; kc->tp > 1 && r < kc->tp; r++) {
        kvs_commit_opts_t wo;
        size_t none = 0;
        kvs_commit_opts_init(&wo);
        wo.shard_written = 1;
        rc = kvs_commit_ex(kc->ranks[r], kc->ns, tokens, (size_t)n_blocks * bt, ids, n_blocks, &wo,
                           canonical, &none);
        if (rc < 0) {
            kc->lost = 1;
            goto out;
        }
    }
    kvs_commit_opts_init(&co);
    co.for_group = kc->tp > 1;
    rc = kvs_commit_ex(kc->client, kc->ns, tokens, (size_t)n_blocks * bt, ids, n_blocks, &co,
                       canonical, &done);
    if (rc < 0)
        usable(kc);
    if (done > n_blocks)
        done = 0;
    /* Blocks 0..m: the table holds the lookup's pin, the commit adds none.
     * Later blocks: the commit pins the canonical block, which the table
     * then holds; a duplicate of ours stays WRITING, in the extras. */
    for (uint32_t i = 0; i < done; i++) {
        int erc = 0;

        if (i < n_matched) {
            /* The daemon checked that block i holds prefix i. */
            if (canonical[i] != ids[i])
                kc->lost = 1;
        } else if (canonical[i] != ids[i]) {
            /* Another worker committed this prefix first: read its block
             * from now on (the same bits), give ours back at the end. */
            erc = extra_add(kc, &ids[i], 1);
            if (erc == 0) {
                ids[i] = canonical[i];
                kc->stats.duplicates++;
            }
        }
        if (erc < 0) {
            kc->lost = 1; /* a block that would outlive the request */
            rc = erc;
            break;
        }
    }
out:
    if (rc < 0)
        kc->stats.commit_errors++;
    else
        kc->stats.commits++;
    return rc;
}

/* The request's table (lookup pins, committed or granted blocks) and the
 * extras (duplicates), in one Release. */
static int kvs_release_cb(void *ctx, const uint32_t *ids, uint32_t n_matched, uint32_t n)
{
    kvscache_t *kc = ctx;
    int rc;

    (void)n_matched;
    if (!usable(kc))
        return KVS_ENOTCONN;
    rc = grow(&kc->extra, &kc->cap_extra, kc->n_extra + n);
    if (rc < 0) {
        kc->lost = 1;
        return rc;
    }
    memmove(kc->extra + n, kc->extra, sizeof(*ids) * kc->n_extra);
    memcpy(kc->extra, ids, sizeof(*ids) * n);
    rc = kvs_release(kc->client, kc->extra, kc->n_extra + n, NULL);
    kc->n_extra = 0;
    if (rc < 0)
        kc->lost = 1;
    return rc;
}

static const worker_cache_ops_t kvscache_ops = {
    .lookup = kvs_lookup_cb,
    .alloc = kvs_alloc_cb,
    .commit = kvs_commit_cb,
    .release = kvs_release_cb,
};

/* Whether the daemon can take this request: connected (a reconnect is tried
 * here, between requests, at most once per reconnect_ms) and its pool fits. */
static int daemon_ready(kvscache_t *kc)
{
    char err[sizeof(kc->note)];

    if (kc->disabled)
        return 0;
    for (uint32_t r = 0; r <= kc->tp; r++) {
        /* The scheduler, then (a group) each rank. */
        kvs_client_t *c = r == 0 ? kc->client : kc->tp > 1 ? kc->ranks[r - 1] : NULL;
        if (c && !kvs_connected(c) && kvs_ping(c, 0, NULL) < 0) {
            note(kc, "kvshared does not answer (%s): computing privately", kvs_last_error(c));
            return 0;
        }
    }
    if (adopt_pool(kc, err, sizeof(err)) < 0) {
        kc->disabled = 1;
        note(kc, "%s; sharing is off, computing privately", err);
        return 0;
    }
    return 1;
}

int kvscache_run(kvscache_t *kc, const uint32_t *prompt, uint32_t n, uint32_t decode,
                 uint32_t *generated, float *logits, worker_result_t *res)
{
    worker_t w;
    int rc;

    if (!kc || !res)
        return KVS_EINVAL;
    kc->note[0] = '\0';
    if (daemon_ready(kc)) {
        w = (worker_t){.model = kc->model,
                       .store = kc->shared,
                       .shards = kc->shards,
                       .tp = kc->tp,
                       .ops = &kvscache_ops,
                       .ctx = kc};
        kc->lost = 0;
        kc->n_extra = 0;
        rc = worker_run(&w, prompt, n, decode, generated, logits, res);
        if (rc == 0 && !kc->lost) {
            res->cache = WORKER_CACHE_SHARED;
            kc->stats.shared++;
            return 0;
        }
        kc->stats.lost += rc == 0 || kc->lost;
        if (rc < 0)
            note(kc, "shared run failed (%s: %s): computing privately", kvs_strerror(rc),
                 kvs_last_error(kc->client));
        else
            note(kc, "kvshared session lost during the request (%s): computing privately",
                 kvs_last_error(kc->client));
    }
    w = (worker_t){
        .model = kc->model, .store = kc->priv, .ops = &worker_private_ops, .ctx = kc->priv};
    rc = worker_run(&w, prompt, n, decode, generated, logits, res);
    if (rc < 0)
        return rc;
    res->cache = WORKER_CACHE_FALLBACK;
    kc->stats.fallbacks++;
    return 0;
}

void kvscache_stats(const kvscache_t *kc, kvscache_stats_t *out)
{
    if (!out)
        return;
    *out = kc ? kc->stats : (kvscache_stats_t){0};
}

const char *kvscache_note(const kvscache_t *kc)
{
    return kc ? kc->note : "";
}
