/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench replay: a request trace (trace.h) against a real kvshared,
 * through libkvshare, by one or more worker processes.
 *
 * Unless --socket names a running daemon, kvshared (the one built next to
 * this program, or --kvshared PATH) is started on a temporary socket with
 * the host backend, the pool size asked for (--pool-blocks, --cap-units or
 * --pool-bytes) and a small geometry by default (1 layer, 1 KV head, head
 * dim 8, fp16: 512 B per 16-token block), since only hit rates and RPC costs
 * are measured, not KV bandwidth.
 *
 * Workers (--workers N) take the requests in trace order from one shared
 * counter, each the next one when it is free, as a router hands requests to
 * free workers (so no worker runs ahead of the others, whatever its requests
 * cost); with --speed X > 0 request i starts no earlier than its timestamp /
 * X after the start (X = 0: as fast as possible). Per request, as a decode
 * worker does:
 *   1. Lookup(prompt, pin): the cached prefix, pinned;
 *   2. Alloc(n - m): one WRITING block per full block of the prompt past
 *      the m hit ones (none for a full hit);
 *   3. writes --write-bytes bytes into each new block's first slot;
 *   4. Commit(prompt, the m hit blocks then the new ones), when there are
 *      new ones: the daemon takes the hit blocks as they are (this session
 *      pins them, at their prefix; no second pin), and the new blocks'
 *      canonical blocks come back pinned;
 *   5. Release: the Lookup pins, the Commit pins and the duplicates, in one
 *      call.
 * Namespaces (--namespaces K > 1): request goes to "trace-<h % K>", h its
 * second hash id (its first when it has one), so a conversation stays in one
 * namespace while the shared first block is cached once per namespace.
 *
 * Tier 2 (--tier2-units U or --tier2-blocks N): the daemon is started with
 * --host-tier of that many blocks, so blocks the pool evicts are demoted to
 * host memory and a pinned Lookup that matches them waits for their
 * promotion; the workers do nothing differently. With --socket, start
 * kvshared with --host-tier yourself and give the same --tier2-* here for
 * the simulator. Hits in tier 2 are the daemon's tier_promotions counter
 * over the run (a block is promoted only for a pinned Lookup that matched
 * it, and every Lookup here pins), in tokens.
 *
 * Tier 3 (--tier3-units U, with a tier 2): the daemon also gets a disk tier
 * of that many blocks (--disk-tier-path, a file in the run's temporary
 * directory, removed after it); tier 2 demotes to it, and its hits are the
 * daemon's disk_reads (part of the tier-2 hits above).
 *
 * Reported: token hit rate (hit tokens / prompt tokens, from the Lookup
 * replies), of it the part found in tier 2 and the blocks demoted, promoted
 * and dropped (the daemon's counters), the offline simulator's hit rates at
 * the same pool (and tier-2) size with the same policy and with unlimited
 * capacity (trace_sim.c), latency percentiles of each RPC as the worker sees
 * them, requests/s.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "geometry.h"
#include "kvshare.h"
#include "launch.h"
#include "redis_cluster.h"
#include "now.h"
#include "socket_path.h"
#include "test_tmp.h"
#include "trace.h"
#include "trace_sim.h"

enum { RPC_LOOKUP, RPC_ALLOC, RPC_COMMIT, RPC_RELEASE, N_RPC };
static const char *const rpc_names[N_RPC] = {"lookup", "alloc", "commit", "release"};

/* One request's outcome, written by its worker into shared memory. */
typedef struct replay_rec {
    float us[N_RPC]; /* latency of each RPC; < 0: not made */
    uint32_t hit_blocks;
    uint32_t dup_blocks; /* new blocks another worker committed first */
    uint32_t waited;     /* the Lookup waited for another worker's blocks */
    int32_t status;      /* 0 or the first failing call's KVS_* code */
    uint32_t node;       /* the kvshared it went to (--nodes) */
    uint32_t done;
} replay_rec_t;

#define REPLAY_MAX_NODES    16
#define REPLAY_MAX_RESTARTS 8
/* Recovery after a restart: the node's hit rate over this many of its
 * requests in a row, against the others' over the same requests. */
#define REPLAY_RECOVERY_WINDOW 30

typedef struct replay_opts {
    const char *trace, *socket, *kvshared, *eviction, *model, *dtype, *pool_bytes;
    size_t max_reqs;
    uint32_t workers, namespaces, pool_blocks, layers, kv_heads, head_dim;
    uint32_t tier2_blocks; /* > 0: kvshared --host-tier of that many blocks */
    uint32_t tier3_blocks; /* > 0: and a --disk-tier-path of that many blocks */
    double cap_units, tier2_units, tier3_units, speed;
    char disk_path[4200]; /* the disk tier's file, in the run's directory */
    size_t write_bytes;
    double max_sim_gap;   /* > 0: fail when |hit rate - simulator's| exceeds it (points) */
    double prefill_us;    /* simulated prefill, microseconds per computed token */
    uint32_t wait_ms;     /* > 0: declare allocs, and Lookups wait this long for them */
    double hint_accuracy; /* > 0: retention hints from sim_oracle_t at this accuracy */
    bool hint_per_unit;
    uint64_t hint_seed;
    const size_t *next_use; /* trace_next_uses(), with hints */
    bool json;
    /* Several nodes (--nodes): one kvshared each, requests routed at
     * random; with a cluster tier (--cluster-units), on one Redis Cluster. */
    uint32_t nodes;
    double cluster_units;
    const char *cluster_seeds;  /* set once the cluster runs */
    const char *conf;           /* the daemons' config file (shared namespaces) */
    uint32_t cluster_samples;   /* Redis's maxmemory-samples (0: its default, 5) */
    const char *cluster_policy; /* Redis's maxmemory-policy (default allkeys-lru) */
    int restart_node;           /* >= 0: restarts (--restart-node) asked for */
    /* Restart k: node restart_nodes[k] restarts empty once request
     * restart_ats[k] is dispatched (ascending). */
    size_t n_restarts;
    int restart_nodes[REPLAY_MAX_RESTARTS];
    size_t restart_ats[REPLAY_MAX_RESTARTS];
    uint64_t route_seed;
} replay_opts_t;

static double mono_ms(void)
{
    return (double)now_ns() / 1e6;
}

static void sleep_until_ms(double t)
{
    double now = mono_ms();
    if (t <= now)
        return;
    struct timespec ts = {.tv_sec = (time_t)((t - now) / 1e3),
                          .tv_nsec =
                              (long)(((t - now) - (double)(long)((t - now) / 1e3) * 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

/* ---- the daemon ------------------------------------------------------------- */

/* Bytes of one block of the geometry kvshared is started with; 0 for an
 * unknown model or dtype. */
static uint64_t daemon_block_bytes(const replay_opts_t *o)
{
    geometry_t g = {
        .layers = o->layers, .kv_heads = o->kv_heads, .head_dim = o->head_dim, .block_tokens = 16};
    if (o->model ? geometry_preset(o->model, &g) != 0
                 : geometry_dtype_parse(o->dtype, &g.dtype) != 0)
        return 0;
    g.block_tokens = 16;
    return geometry_validate(&g) == 0 ? geometry_block_bytes(&g) : 0;
}

/* Node k's disk tier file in the run's directory (one node: "tier3"). */
static void node_disk_path(replay_opts_t *o, const char *dir, uint32_t k, uint32_t n_nodes)
{
    if (n_nodes > 1)
        snprintf(o->disk_path, sizeof(o->disk_path), "%s/tier3-%u", dir, k);
    else
        snprintf(o->disk_path, sizeof(o->disk_path), "%s/tier3", dir);
}

/* Starts kvshared on sock and waits for its READY line. */
static pid_t start_daemon(const replay_opts_t *o, const char *sock)
{
    char nb[32], layers[16], heads[16], dim[16], tier[32], disk_bytes[32];
    const char *argv[40];
    int a = 0;
    snprintf(layers, sizeof(layers), "%u", o->layers);
    snprintf(heads, sizeof(heads), "%u", o->kv_heads);
    snprintf(dim, sizeof(dim), "%u", o->head_dim);
    argv[a++] = o->kvshared;
    argv[a++] = "--socket";
    argv[a++] = sock;
    argv[a++] = "--backend";
    argv[a++] = "host";
    if (o->model) {
        argv[a++] = "--model";
        argv[a++] = o->model;
    } else {
        argv[a++] = "--layers";
        argv[a++] = layers;
        argv[a++] = "--kv-heads";
        argv[a++] = heads;
        argv[a++] = "--head-dim";
        argv[a++] = dim;
        argv[a++] = "--dtype";
        argv[a++] = o->dtype;
    }
    argv[a++] = "--block-tokens";
    argv[a++] = "16";
    if (o->pool_bytes) {
        argv[a++] = "--pool-bytes";
        argv[a++] = o->pool_bytes;
    } else {
        snprintf(nb, sizeof(nb), "%u", o->pool_blocks);
        argv[a++] = "--pool-blocks";
        argv[a++] = nb;
    }
    if (o->tier2_blocks) {
        uint64_t bb = daemon_block_bytes(o);
        if (bb == 0) {
            fprintf(stderr, "replay: unknown geometry: cannot size tier 2 in blocks\n");
            return -1;
        }
        snprintf(tier, sizeof(tier), "%llu", (unsigned long long)(bb * o->tier2_blocks));
        argv[a++] = "--host-tier";
        argv[a++] = tier;
        if (o->tier3_blocks) {
            /* One 4 KiB-aligned slot per block: its record header (120 B and
             * 4 B a token), then the block; then the superblock's page. */
            uint64_t slot = (120 + 4 * 16 + bb + 4095) / 4096 * 4096;
            snprintf(disk_bytes, sizeof(disk_bytes), "%llu",
                     (unsigned long long)(4096 + slot * o->tier3_blocks));
            argv[a++] = "--disk-tier-path";
            argv[a++] = o->disk_path;
            argv[a++] = "--disk-tier-bytes";
            argv[a++] = disk_bytes;
        }
    }
    argv[a++] = "--eviction";
    argv[a++] = o->eviction;
    argv[a++] = "--max-frame";
    argv[a++] = "64MiB";
    argv[a++] = "--max-output";
    argv[a++] = "64MiB";
    argv[a++] = "--log-level";
    argv[a++] = "warn";
    if (o->cluster_seeds) {
        argv[a++] = "--cluster-seeds";
        argv[a++] = o->cluster_seeds;
        argv[a++] = "--cluster-timeout-ms";
        argv[a++] = "5000";
    }
    if (o->conf) {
        argv[a++] = "--config";
        argv[a++] = o->conf;
    }
    argv[a] = NULL;
    /* A large pool takes a while to allocate and fault in. */
    return launch_daemon(argv, 2 * LAUNCH_READY_MS, NULL);
}

/* Starts a Redis Cluster of 3 masters for the cluster tier, each master's
 * maxmemory a third of `blocks` values of this geometry (the cluster's own
 * eviction: --cluster-policy, allkeys-lru by default). A value is the block,
 * its 48-byte header, the namespace name and 4 bytes per token; Redis adds
 * its key and about 100 bytes of bookkeeping. */
static int start_cluster(const replay_opts_t *o, rc_cluster_t *rc, uint64_t blocks)
{
    uint64_t bb = daemon_block_bytes(o);
    if (bb == 0 || rc_start(rc, 3, 0, NULL) != 0) {
        fprintf(stderr, "replay: cannot start a Redis Cluster (redis-server, redis-cli)\n");
        return -1;
    }
    uint64_t per_value = bb + 48 + 8 + 16 * 4 + 60 + 100;
    for (int i = 0; i < rc->n; i++) {
        redisContext *ctx = rc_connect(rc, i);
        redisReply *r = ctx ? redisCommand(ctx, "INFO memory") : NULL;
        const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "used_memory:") : NULL;
        unsigned long long base = p ? strtoull(p + strlen("used_memory:"), NULL, 10) : 0;
        freeReplyObject(r);
        unsigned long long max = base + blocks * per_value / (uint64_t)rc->n;
        r = ctx ? redisCommand(ctx, "CONFIG SET maxmemory %llu", max) : NULL;
        int ok = r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        r = ctx ? redisCommand(ctx, "CONFIG SET maxmemory-policy %s", o->cluster_policy) : NULL;
        ok = ok && r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (o->cluster_samples) {
            r = ctx ? redisCommand(ctx, "CONFIG SET maxmemory-samples %u", o->cluster_samples)
                    : NULL;
            ok = ok && r && r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
        }
        redisFree(ctx);
        if (!ok) {
            rc_stop(rc);
            return -1;
        }
    }
    return 0;
}

/* ---- a worker ------------------------------------------------------------- */

static void ns_name(const replay_opts_t *o, const trace_t *tr, const trace_req_t *q, char *buf,
                    size_t len)
{
    uint32_t h = q->n_hash >= 2 ? tr->hash_ids[q->first_hash + 1]
                 : q->n_hash    ? tr->hash_ids[q->first_hash]
                                : 0;
    if (o->namespaces <= 1)
        snprintf(buf, len, "trace");
    else
        snprintf(buf, len, "trace-%u", h % o->namespaces);
}

/* The node request i goes to: at random (a fixed draw per request, so that
 * every run with the same seed routes alike), as a plain round-robin or
 * random Service in front of the nodes would. */
static uint32_t route(const replay_opts_t *o, size_t i)
{
    if (o->nodes <= 1)
        return 0;
    uint64_t z = (uint64_t)i + o->route_seed + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (uint32_t)(z % o->nodes);
}

static float since_us(double t0_ms)
{
    return (float)((mono_ms() - t0_ms) * 1e3);
}

/* Releases rel[0 .. n) with the hints the oracle gave their units (prio[k]
 * for rel[k], < 0: none), in one call per priority. */
static int release_hinted(kvs_client_t *c, const uint32_t *rel, const int *prio, size_t n,
                          uint32_t duration_ms, uint32_t *group)
{
    const int classes[] = {SIM_HINT_KEEP, SIM_HINT_DROP, -1};
    int rc = 0;
    for (size_t g = 0; g < sizeof(classes) / sizeof(classes[0]); g++) {
        size_t m = 0;
        for (size_t k = 0; k < n; k++)
            if (prio[k] == classes[g])
                group[m++] = rel[k];
        kvs_hint_t hint = {.priority = (uint32_t)classes[g], .duration_ms = duration_ms};
        int grc = m ? kvs_release_hint(c, group, m, NULL, classes[g] < 0 ? NULL : &hint) : 0;
        if (rc == 0)
            rc = grc;
    }
    return rc;
}

/* Replays requests w, w + N, ... Returns the exit status of the process. */
static int worker(const replay_opts_t *o, const trace_t *tr, char (*socks)[SOCKET_PATH_MAX],
                  uint32_t w, double start_ms, replay_rec_t *recs)
{
    kvs_options_t ko;
    kvs_options_init(&ko);
    ko.timeout_ms = 30000;
    char name[32];
    snprintf(name, sizeof(name), "replay-%u", w);
    ko.worker_name = name;
    kvs_client_t *clients[REPLAY_MAX_NODES] = {0}, *c = NULL;
    uint32_t n_nodes = o->nodes > 1 ? o->nodes : 1;
    int rc = 0;
    for (uint32_t k = 0; k < n_nodes && rc == 0; k++) {
        ko.socket_path = socks[k];
        rc = kvs_connect(&ko, &clients[k]);
    }
    if (rc) {
        fprintf(stderr, "replay worker %u: connect: %s\n", w, kvs_strerror(rc));
        for (uint32_t k = 0; k < n_nodes; k++)
            kvs_close(clients[k]);
        return 1;
    }
    c = clients[0];
    kvs_geometry_t g;
    kvs_geometry(c, &g);
    size_t max_tokens = 0;
    for (size_t i = 0; i < tr->n_reqs; i++) {
        size_t n = trace_prompt_tokens(tr, &tr->reqs[i]);
        max_tokens = n > max_tokens ? n : max_tokens;
    }
    size_t max_blocks = max_tokens / g.block_tokens + 1;
    uint32_t *tokens = malloc((max_tokens + 1) * sizeof(*tokens));
    uint32_t *hit = malloc(max_blocks * sizeof(*hit));
    uint32_t *fresh = malloc(max_blocks * sizeof(*fresh));
    uint32_t *canon = malloc(max_blocks * sizeof(*canon));
    uint32_t *rel = malloc(3 * max_blocks * sizeof(*rel));
    uint32_t *group = malloc(3 * max_blocks * sizeof(*group));
    int *rel_prio = malloc(3 * max_blocks * sizeof(*rel_prio));
    int *unit_prio = malloc(max_blocks * sizeof(*unit_prio));
    size_t wb = o->write_bytes < g.slot_bytes ? o->write_bytes : g.slot_bytes;
    uint8_t *pattern = calloc(1, wb + 1);
    /* This worker's engine: the same draws per request as trace-sim's. */
    sim_oracle_t oracle = {.tr = tr,
                           .next_use = o->next_use,
                           .accuracy = o->hint_accuracy,
                           .seed = o->hint_seed,
                           .per_unit = o->hint_per_unit,
                           .capacity = g.num_blocks,
                           .unit_blocks = TRACE_HASH_TOKENS / g.block_tokens};
    if (!tokens || !hit || !fresh || !canon || !rel || !group || !rel_prio || !unit_prio ||
        !pattern) {
        rc = KVS_ENOMEM;
        goto out;
    }
    /* The record past the last one holds the shared dispatch counter. */
    uint32_t *next = &recs[tr->n_reqs].done;
    for (;;) {
        size_t i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
        if (i >= tr->n_reqs)
            break;
        const trace_req_t *q = &tr->reqs[i];
        replay_rec_t *r = &recs[i];
        char ns[48];
        for (int k = 0; k < N_RPC; k++)
            r->us[k] = -1;
        if (o->speed > 0)
            sleep_until_ms(start_ms + (double)q->timestamp_ms / o->speed);
        size_t n = trace_prompt_tokens(tr, q), want = n / g.block_tokens, n_hit = 0, done = 0;
        r->node = route(o, i);
        c = clients[r->node];
        trace_expand(tr, q, tokens);
        ns_name(o, tr, q, ns, sizeof(ns));
        double t0 = mono_ms();
        int waited = 0;
        rc = kvs_lookup_wait(c, ns, tokens, n, 1, o->wait_ms, hit, want, &n_hit, NULL, &waited);
        r->us[RPC_LOOKUP] = since_us(t0);
        if (rc)
            goto next;
        r->hit_blocks = (uint32_t)n_hit;
        r->waited = (uint32_t)waited;
        /* blocks: the hit ones, then the new ones (fresh + n_hit). */
        memcpy(fresh, hit, n_hit * sizeof(*fresh));
        if (want > n_hit) {
            t0 = mono_ms();
            /* With waits, the blocks are declared so that others wait. */
            rc = o->wait_ms ? kvs_alloc_for(c, ns, tokens, n, (uint32_t)n_hit,
                                            (uint32_t)(want - n_hit), fresh + n_hit)
                            : kvs_alloc(c, ns, (uint32_t)(want - n_hit), fresh + n_hit);
            r->us[RPC_ALLOC] = since_us(t0);
        }
        size_t n_rel = 0;
        memcpy(rel, hit, n_hit * sizeof(*rel));
        n_rel = n_hit;
        for (size_t k = 0; k < n_hit; k++)
            rel_prio[k] = (int)k; /* the block's place in the prompt, until the hints */
        if (rc == 0 && want > n_hit) {
            memset(pattern, (int)(i & 0xff), wb);
            for (size_t k = n_hit; k < want && wb > 0 && rc == 0; k++)
                rc = kvs_block_write(c, 0, 0, fresh[k], pattern, wb);
            /* The prefill of the tokens past the hit, as a GPU would take. */
            if (o->prefill_us > 0)
                sleep_until_ms(mono_ms() +
                               o->prefill_us * (double)(n - n_hit * g.block_tokens) / 1e3);
            if (rc == 0) {
                t0 = mono_ms();
                rc = kvs_commit(c, ns, tokens, n, fresh, want, canon, &done);
                r->us[RPC_COMMIT] = since_us(t0);
            }
            /* The hit blocks carry only the Lookup's pin, already in rel. */
            for (size_t k = n_hit; k < want; k++) {
                if (k < done) {
                    rel_prio[n_rel] = (int)k;
                    rel[n_rel++] = canon[k];
                }
                if (k >= done || canon[k] != fresh[k]) {
                    rel_prio[n_rel] = -1;
                    rel[n_rel++] = fresh[k];
                    r->dup_blocks += k < done;
                }
            }
        } else if (want == n_hit) {
            done = want;
        }
        int rrc;
        if (o->hint_accuracy > 0 && rc == 0) {
            /* The hints for the cached blocks it touched, as trace-sim gives
             * them; the horizon in requests becomes milliseconds at the
             * replay's pace so far. */
            uint64_t horizon;
            sim_oracle_hints(&oracle, i, done, n_hit, unit_prio, &horizon);
            double ms = (double)horizon * (mono_ms() - start_ms) / (double)(i + 1);
            uint32_t duration_ms = ms < 1 ? 1 : ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
            for (size_t k = 0; k < n_rel; k++)
                if (rel_prio[k] >= 0)
                    rel_prio[k] = unit_prio[(size_t)rel_prio[k] / oracle.unit_blocks];
            t0 = mono_ms();
            rrc = release_hinted(c, rel, rel_prio, n_rel, duration_ms, group);
        } else {
            t0 = mono_ms();
            rrc = kvs_release(c, rel, n_rel, NULL);
        }
        r->us[RPC_RELEASE] = since_us(t0);
        if (rc == 0)
            rc = rrc;
    next:
        r->status = rc;
        r->done = 1;
        /* A node restarting (--restart-node) answers nothing for a while:
         * its requests are misses, as a worker's would be. */
        if ((rc == KVS_ENOTCONN || rc == KVS_ETIMEDOUT) && o->restart_node < 0) {
            fprintf(stderr, "replay worker %u: request %zu: %s (%s)\n", w, i, kvs_strerror(rc),
                    kvs_last_error(c));
            break;
        }
        rc = 0;
    }
out:
    free(tokens);
    free(hit);
    free(fresh);
    free(canon);
    free(rel);
    free(group);
    free(rel_prio);
    free(unit_prio);
    free(pattern);
    for (uint32_t k = 0; k < n_nodes; k++)
        kvs_close(clients[k]);
    return rc ? 1 : 0;
}

/* After node `node` restarted at request `from` (and before request
 * `until`, the next restart or the end): the first window of `win` of its
 * requests in a row whose hit rate is within 0.95x of the other nodes'
 * over the same span of the trace. *lead: trace requests from the restart
 * to the window's first request (when the node was back); *trail: to its
 * last (when a trailing window of win requests shows it, the measure
 * before; it cannot be under about win * nodes). Both -1 if no window
 * qualifies. *node_hr and *others_hr: the two rates of that window (or of
 * the last one). */
static void recovery(const trace_t *tr, const replay_rec_t *recs, uint32_t bt, uint32_t node,
                     size_t from, size_t until, size_t win, long *lead, long *trail,
                     double *node_hr, double *others_hr)
{
    size_t n = tr->n_reqs < until ? tr->n_reqs : until;
    uint64_t *oh = calloc(n + 1, sizeof(*oh)), *ot = calloc(n + 1, sizeof(*ot));
    size_t *idx = calloc(n + 1, sizeof(*idx));
    uint64_t *nh = calloc(n + 1, sizeof(*nh)), *nt = calloc(n + 1, sizeof(*nt));
    *lead = *trail = -1;
    *node_hr = *others_hr = 0;
    if (!oh || !ot || !idx || !nh || !nt || win == 0)
        goto done;
    size_t m = 0; /* the node's requests from `from` on: idx[0..m) */
    for (size_t i = 0; i < n; i++) {
        bool other = recs[i].done && recs[i].node != node;
        uint64_t hit = (uint64_t)recs[i].hit_blocks * bt,
                 tok = trace_prompt_tokens(tr, &tr->reqs[i]);
        oh[i + 1] = oh[i] + (other ? hit : 0);
        ot[i + 1] = ot[i] + (other ? tok : 0);
        if (i >= from && recs[i].done && recs[i].node == node) {
            idx[m] = i;
            nh[m + 1] = nh[m] + hit;
            nt[m + 1] = nt[m] + tok;
            m++;
        }
    }
    for (size_t k = 0; k + win <= m; k++) {
        size_t first = idx[k], last = idx[k + win - 1];
        uint64_t h = nh[k + win] - nh[k], t = nt[k + win] - nt[k];
        uint64_t th = oh[last + 1] - oh[first], tt = ot[last + 1] - ot[first];
        *node_hr = t ? (double)h / (double)t : 0;
        *others_hr = tt ? (double)th / (double)tt : 0;
        if (*others_hr > 0 && *node_hr >= 0.95 * *others_hr) {
            *lead = (long)(first - from);
            *trail = (long)(last - from);
            break;
        }
    }
done:
    free(oh);
    free(ot);
    free(idx);
    free(nh);
    free(nt);
}

/* Reads "a,b,c" (at most max numbers) into out. Returns how many, or 0 when
 * the text is not such a list. */
static size_t parse_list(const char *text, size_t *out, size_t max)
{
    size_t n = 0;
    const char *p = text;
    while (*p && n < max) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || (*end != ',' && *end != '\0'))
            return 0;
        out[n++] = (size_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    return *p ? 0 : n;
}

/* ---- the subcommand ---------------------------------------------------------- */

static void replay_usage(FILE *f)
{
    fprintf(f, "usage: kvshare-bench replay --trace FILE [options]\n"
               "  --requests N        first N requests only (default: all)\n"
               "  --workers N         worker processes (default 1)\n"
               "  --speed X           time compression: request i starts at timestamp / X\n"
               "                      (default 0: as fast as possible)\n"
               "  --namespaces K      spread conversations over K namespaces (default 1)\n"
               "  --pool-blocks N     pool size in 16-token blocks\n"
               "  --cap-units U       pool size in units of the trace's 512-token blocks\n"
               "                      (default 9139: 5 %% of the Mooncake trace's distinct ids)\n"
               "  --pool-bytes SIZE   pool size in bytes (with the geometry below)\n"
               "  --tier2-units U     start kvshared with a tier 2 (--host-tier) of U units of\n"
               "                      512-token blocks (default 0: one tier)\n"
               "  --tier2-blocks N    the same in 16-token blocks\n"
               "  --tier3-units U     with a tier 2, also a tier 3 (--disk-tier-path, a file in\n"
               "                      the run's temporary directory) of U units\n"
               "  --model NAME | --layers N --kv-heads N --head-dim N --dtype T\n"
               "                      geometry (default 1 layer, 1 head, dim 8, fp16)\n"
               "  --eviction P        lru | freq, given to kvshared (default lru)\n"
               "  --write-bytes N     bytes written into each new block (default 64)\n"
               "  --prefill-us-per-token F  simulated prefill: sleep F us per token computed\n"
               "                      (past the hit) before Commit (default 0)\n"
               "  --wait-ms N         declare each Alloc's prefix and let Lookups wait up to N ms\n"
               "                      for blocks other workers are writing (default 0: no wait)\n"
               "  --hint-accuracy A   retention hints from the trace's own future, right with\n"
               "                      probability A (0.5 .. 1), given with each Release as\n"
               "                      trace-sim --hint-accuracy gives them (trace_sim.h)\n"
               "  --hint-knowledge request|unit  as trace-sim's (default request)\n"
               "  --hint-seed N       seed of the hints' noise\n"
               "  --kvshared PATH     the daemon to start (default: built next to this program)\n"
               "  --socket PATH       use a running kvshared instead (pool, tier 2 and policy are\n"
               "                      its own; give its tier-2 size with --tier2-* for the\n"
               "                      simulator)\n"
               "  --max-sim-gap P     exit 1 if the hit rate and the simulator's differ by\n"
               "                      more than P points, or with a tier 2 the hits in it\n"
               "                      (for tests)\n"
               "  --nodes N           N kvshared (each its own pool), each request sent to one\n"
               "                      at random (default 1)\n"
               "  --cluster-units U   a cluster tier: the nodes share a Redis Cluster of 3\n"
               "                      masters started here, holding U units of 512-token\n"
               "                      blocks (maxmemory, --cluster-policy); every namespace\n"
               "                      shared\n"
               "  --cluster-policy P  Redis's maxmemory-policy: allkeys-lru (default),\n"
               "                      allkeys-lfu or allkeys-random\n"
               "  --cluster-samples N Redis's maxmemory-samples: keys its LRU or LFU compares\n"
               "                      per eviction (default: Redis's, 5)\n"
               "  --restart-node K --restart-at N  node K restarts empty once request N is\n"
               "                      dispatched: how soon it gets back to the others' hit rate\n"
               "                      (lists: --restart-node 0,1,2 --restart-at 3000,6000,9000,\n"
               "                      ascending; one node for every restart, or one each)\n"
               "  --route-seed N      seed of the random routing\n"
               "  --json              one JSON object instead of text\n");
}

int bench_replay(int argc, char **argv)
{
    char kvshared[PATH_MAX + 32];
    replay_opts_t o = {.workers = 1,
                       .namespaces = 1,
                       .cap_units = 9139,
                       .layers = 1,
                       .kv_heads = 1,
                       .head_dim = 8,
                       .dtype = "fp16",
                       .eviction = "lru",
                       .write_bytes = 64,
                       .nodes = 1,
                       .cluster_policy = "allkeys-lru",
                       .restart_node = -1};
    o.kvshared = bench_default_kvshared(kvshared, sizeof(kvshared));
    size_t rnodes[REPLAY_MAX_RESTARTS], n_rnodes = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            replay_usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            o.json = true;
            continue;
        } else if (!v) {
            ok = false;
        } else if (strcmp(a, "--trace") == 0) {
            o.trace = v;
        } else if (strcmp(a, "--requests") == 0) {
            o.max_reqs = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--workers") == 0) {
            o.workers = (uint32_t)strtoul(v, NULL, 0);
            ok = o.workers >= 1 && o.workers <= 256;
        } else if (strcmp(a, "--speed") == 0) {
            o.speed = strtod(v, NULL);
            ok = o.speed >= 0;
        } else if (strcmp(a, "--namespaces") == 0) {
            o.namespaces = (uint32_t)strtoul(v, NULL, 0);
            ok = o.namespaces >= 1 && o.namespaces <= 1000;
        } else if (strcmp(a, "--pool-blocks") == 0) {
            o.pool_blocks = (uint32_t)strtoul(v, NULL, 0);
            ok = o.pool_blocks > 0;
        } else if (strcmp(a, "--cap-units") == 0) {
            o.cap_units = strtod(v, NULL);
            ok = o.cap_units > 0;
        } else if (strcmp(a, "--tier2-units") == 0) {
            o.tier2_units = strtod(v, NULL);
            ok = o.tier2_units >= 0 && o.tier2_units * TRACE_HASH_TOKENS / 16 < UINT32_MAX;
        } else if (strcmp(a, "--tier3-units") == 0) {
            o.tier3_units = strtod(v, NULL);
            ok = o.tier3_units >= 0 && o.tier3_units * TRACE_HASH_TOKENS / 16 < UINT32_MAX;
        } else if (strcmp(a, "--tier2-blocks") == 0) {
            o.tier2_blocks = (uint32_t)strtoul(v, NULL, 0);
        } else if (strcmp(a, "--pool-bytes") == 0) {
            o.pool_bytes = v;
        } else if (strcmp(a, "--model") == 0) {
            o.model = v;
        } else if (strcmp(a, "--layers") == 0) {
            o.layers = (uint32_t)strtoul(v, NULL, 0);
        } else if (strcmp(a, "--kv-heads") == 0) {
            o.kv_heads = (uint32_t)strtoul(v, NULL, 0);
        } else if (strcmp(a, "--head-dim") == 0) {
            o.head_dim = (uint32_t)strtoul(v, NULL, 0);
        } else if (strcmp(a, "--dtype") == 0) {
            o.dtype = v;
        } else if (strcmp(a, "--eviction") == 0) {
            o.eviction = v;
            ok = strcmp(v, "lru") == 0 || strcmp(v, "freq") == 0;
        } else if (strcmp(a, "--write-bytes") == 0) {
            o.write_bytes = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--prefill-us-per-token") == 0) {
            o.prefill_us = strtod(v, NULL);
            ok = o.prefill_us >= 0 && o.prefill_us <= 1e6;
        } else if (strcmp(a, "--wait-ms") == 0) {
            o.wait_ms = (uint32_t)strtoul(v, NULL, 0);
            ok = o.wait_ms <= KVS_LOOKUP_MAX_WAIT_MS;
        } else if (strcmp(a, "--hint-accuracy") == 0) {
            o.hint_accuracy = strtod(v, NULL);
            ok = o.hint_accuracy >= 0.5 && o.hint_accuracy <= 1;
        } else if (strcmp(a, "--hint-knowledge") == 0) {
            o.hint_per_unit = strcmp(v, "unit") == 0;
            ok = o.hint_per_unit || strcmp(v, "request") == 0;
        } else if (strcmp(a, "--hint-seed") == 0) {
            o.hint_seed = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--max-sim-gap") == 0) {
            o.max_sim_gap = strtod(v, NULL);
            ok = o.max_sim_gap > 0;
        } else if (strcmp(a, "--nodes") == 0) {
            o.nodes = (uint32_t)strtoul(v, NULL, 0);
            ok = o.nodes >= 1 && o.nodes <= REPLAY_MAX_NODES;
        } else if (strcmp(a, "--cluster-units") == 0) {
            o.cluster_units = strtod(v, NULL);
            ok = o.cluster_units >= 0;
        } else if (strcmp(a, "--cluster-samples") == 0) {
            o.cluster_samples = (uint32_t)strtoul(v, NULL, 0);
            ok = o.cluster_samples >= 1 && o.cluster_samples <= 64;
        } else if (strcmp(a, "--cluster-policy") == 0) {
            o.cluster_policy = v;
            ok = strcmp(v, "allkeys-lru") == 0 || strcmp(v, "allkeys-lfu") == 0 ||
                 strcmp(v, "allkeys-random") == 0;
        } else if (strcmp(a, "--restart-node") == 0) {
            n_rnodes = parse_list(v, rnodes, REPLAY_MAX_RESTARTS);
            ok = n_rnodes > 0;
            o.restart_node = ok ? (int)rnodes[0] : -1;
        } else if (strcmp(a, "--restart-at") == 0) {
            o.n_restarts = parse_list(v, o.restart_ats, REPLAY_MAX_RESTARTS);
            ok = o.n_restarts > 0;
        } else if (strcmp(a, "--route-seed") == 0) {
            o.route_seed = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--kvshared") == 0) {
            o.kvshared = v;
        } else if (strcmp(a, "--socket") == 0) {
            o.socket = v;
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "replay: bad option or value: %s\n", a);
            replay_usage(stderr);
            return 2;
        }
        i++;
    }
    if ((o.nodes > 1 || o.cluster_units > 0 || o.restart_node >= 0) && o.socket) {
        fprintf(stderr, "replay: --nodes, --cluster-units and --restart-node start their own "
                        "daemons: not with --socket\n");
        return 2;
    }
    bool restarts_ok =
        o.restart_node < 0 || (o.n_restarts > 0 && (n_rnodes == 1 || n_rnodes == o.n_restarts));
    for (size_t k = 0; restarts_ok && o.restart_node >= 0 && k < o.n_restarts; k++) {
        size_t node = rnodes[n_rnodes == 1 ? 0 : k];
        o.restart_nodes[k] = (int)node;
        restarts_ok = node < o.nodes && o.restart_ats[k] > 0 &&
                      (k == 0 || o.restart_ats[k] > o.restart_ats[k - 1]);
    }
    if (!restarts_ok) {
        fprintf(stderr, "replay: --restart-node K needs K < --nodes and --restart-at N > 0 "
                        "(lists: as many nodes as restarts, or one; ascending requests)\n");
        return 2;
    }
    const char *missing = o.cluster_units > 0 ? rc_missing() : NULL;
    if (missing) {
        printf("skipped: --cluster-units: %s\n", missing);
        return 77;
    }
    if (!o.trace) {
        fprintf(stderr, "replay: --trace FILE is required\n");
        replay_usage(stderr);
        return 2;
    }
    if (!o.pool_blocks && !o.pool_bytes)
        o.pool_blocks = (uint32_t)(o.cap_units * TRACE_HASH_TOKENS / 16);
    if (!o.tier2_blocks)
        o.tier2_blocks = (uint32_t)(o.tier2_units * TRACE_HASH_TOKENS / 16);
    if (o.tier2_blocks)
        o.tier3_blocks = (uint32_t)(o.tier3_units * TRACE_HASH_TOKENS / 16);

    trace_t tr;
    char err[256] = "";
    int rc = trace_load(o.trace, o.max_reqs, &tr, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "replay: %s (%s)\n", err, kvs_strerror(rc));
        return 1;
    }
    size_t *next_use = NULL;
    if (o.hint_accuracy > 0) {
        if (trace_next_uses(&tr, &next_use) != 0) {
            fprintf(stderr, "replay: out of memory for the trace's next uses\n");
            trace_free(&tr);
            return 1;
        }
        o.next_use = next_use;
    }
    signal(SIGPIPE, SIG_IGN);
    int status = 1;
    uint32_t n_nodes = o.nodes > 1 ? o.nodes : 1;
    pid_t daemons[REPLAY_MAX_NODES];
    for (uint32_t k = 0; k < REPLAY_MAX_NODES; k++)
        daemons[k] = -1;
    rc_cluster_t rcl = {0};
    bool cluster_up = false;
    char conf[SOCKET_PATH_MAX + 16] = "";
    char dir[SOCKET_PATH_MAX - sizeof("/kvshared-15.sock")] = "";
    char socks[REPLAY_MAX_NODES][SOCKET_PATH_MAX];
    replay_rec_t *recs = MAP_FAILED;
    size_t recs_bytes = (tr.n_reqs + 1) * sizeof(replay_rec_t);
    uint64_t cluster_blocks = 0;
    if (o.socket) {
        snprintf(socks[0], sizeof(socks[0]), "%s", o.socket);
    } else {
        if (test_tmp_dir("kvs-replay", dir, sizeof(dir)) != 0) {
            fprintf(stderr, "replay: cannot make a temporary directory: %s\n", strerror(errno));
            dir[0] = '\0';
            goto out;
        }
        if (o.cluster_units > 0) {
            /* The cluster tier: a Redis Cluster of its own, its memory
             * cluster_units of 512-token blocks (allkeys-lru). */
            cluster_blocks = (uint64_t)(o.cluster_units * TRACE_HASH_TOKENS / 16);
            if (start_cluster(&o, &rcl, cluster_blocks) != 0)
                goto out;
            cluster_up = true;
            o.cluster_seeds = rcl.seeds;
            snprintf(conf, sizeof(conf), "%s/kvshared.conf", dir);
            FILE *cf = fopen(conf, "w");
            if (!cf)
                goto out;
            fprintf(cf, "[namespace trace]\nshared = yes\n");
            for (uint32_t k = 0; k < o.namespaces && o.namespaces > 1; k++)
                fprintf(cf, "[namespace trace-%u]\nshared = yes\n", k);
            fclose(cf);
            o.conf = conf;
        }
        for (uint32_t k = 0; k < n_nodes; k++) {
            int len = n_nodes > 1
                          ? snprintf(socks[k], sizeof(socks[k]), "%s/kvshared-%u.sock", dir, k)
                          : snprintf(socks[k], sizeof(socks[k]), "%s/kvshared.sock", dir);
            if (len < 0 || (size_t)len >= sizeof(socks[k])) {
                fprintf(stderr, "replay: the socket path in %s is too long\n", dir);
                goto out;
            }
            node_disk_path(&o, dir, k, n_nodes);
            daemons[k] = start_daemon(&o, socks[k]);
            if (daemons[k] < 0) {
                fprintf(stderr, "replay: kvshared (%s) did not start; give --kvshared PATH\n",
                        o.kvshared);
                goto out;
            }
        }
    }
    const char *sock = socks[0];
    /* The pool as the daemon made it, and its block size. */
    kvs_options_t ko;
    kvs_options_init(&ko);
    ko.socket_path = sock;
    ko.flags = KVS_NO_MAP;
    kvs_client_t *mon = NULL;
    kvs_geometry_t g;
    kvs_stats_t before = {0}, after = {0};
    if ((rc = kvs_connect(&ko, &mon)) != 0 || (rc = kvs_geometry(mon, &g)) != 0 ||
        (rc = kvs_stats(mon, &before)) != 0) {
        fprintf(stderr, "replay: cannot reach kvshared at %s: %s\n", sock, kvs_strerror(rc));
        kvs_close(mon);
        goto out;
    }
    kvs_stats_free(&before);
    kvs_close(mon);
    mon = NULL;

    recs = mmap(NULL, recs_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (recs == MAP_FAILED)
        goto out;
    memset(recs, 0, recs_bytes);
    pid_t pids[256];
    /* The CPU the daemons this bench started take over the run (none when
     * --socket names a running one; a node restarted loses its share). */
    double cpu0 = 0;
    bool cpu_known = true;
    for (uint32_t k = 0; k < n_nodes; k++) {
        double c = daemons[k] > 0 ? bench_process_cpu_seconds(daemons[k]) : 0;
        cpu_known &= c >= 0;
        cpu0 += c;
    }
    double t0 = mono_ms();
    for (uint32_t w = 0; w < o.workers; w++) {
        fflush(NULL);
        pids[w] = fork();
        if (pids[w] == 0)
            _exit(worker(&o, &tr, socks, w, t0, recs));
        if (pids[w] < 0) {
            fprintf(stderr, "replay: fork: %s\n", strerror(errno));
            for (uint32_t k = 0; k < w; k++)
                kill(pids[k], SIGKILL);
            o.workers = w;
        }
    }
    bool failed = false;
    double restart_ms[REPLAY_MAX_RESTARTS];
    size_t restarted_at[REPLAY_MAX_RESTARTS];
    size_t n_restarted = 0;
    for (size_t k = 0; o.restart_node >= 0 && k < o.n_restarts && !failed; k++) {
        /* Restarts the node empty once the dispatch passes its request:
         * its pool and index are gone; the others and the cluster stay. */
        int node = o.restart_nodes[k];
        const uint32_t *next = &recs[tr.n_reqs].done;
        while (__atomic_load_n(next, __ATOMIC_RELAXED) < o.restart_ats[k])
            usleep(1000);
        restarted_at[k] = __atomic_load_n(next, __ATOMIC_RELAXED);
        double r0 = mono_ms();
        launch_stop(daemons[node], SIGKILL, LAUNCH_READY_MS);
        unlink(socks[node]);
        /* Its own disk file, which it finds again: only the pool and the
         * host tier start empty. */
        node_disk_path(&o, dir, (uint32_t)node, n_nodes);
        daemons[node] = start_daemon(&o, socks[node]);
        restart_ms[k] = mono_ms() - r0;
        n_restarted++;
        if (daemons[node] < 0) {
            fprintf(stderr, "replay: node %d did not start again\n", node);
            failed = true;
        }
    }
    for (uint32_t w = 0; w < o.workers; w++) {
        int ws = 0;
        waitpid(pids[w], &ws, 0);
        failed |= !WIFEXITED(ws) || WEXITSTATUS(ws) != 0;
    }
    double wall_s = (mono_ms() - t0) / 1e3;
    double cpu_s = -cpu0;
    for (uint32_t k = 0; k < n_nodes; k++) {
        double c = daemons[k] > 0 ? bench_process_cpu_seconds(daemons[k]) : 0;
        cpu_known &= c >= 0;
        cpu_s += c;
    }
    /* The counters over the run, summed over the nodes (fresh daemons: the
     * run's own). */
    kvs_stats_t sum = {0};
    double node_lat_us = 0;
    uint64_t node_replies = 0;
    for (uint32_t k = 0; k < n_nodes; k++) {
        ko.socket_path = socks[k];
        if ((rc = kvs_connect(&ko, &mon)) == 0)
            rc = kvs_stats(mon, &after);
        if (rc == 0) {
            for (size_t i = 0; i < KVS_N_COUNTERS; i++)
                sum.counters[i] += after.counters[i];
            for (size_t i = 0; i < after.n_cluster_nodes; i++) {
                node_lat_us += (double)after.cluster_nodes[i].latency_us_sum;
                node_replies += after.cluster_nodes[i].replies;
            }
        }
        kvs_stats_free(&after);
        kvs_close(mon);
        mon = NULL;
        if (rc) {
            fprintf(stderr, "replay: kvshared's stats after the run: %s\n", kvs_strerror(rc));
            goto out;
        }
    }
    after = sum;
    uint64_t demoted = after.tier_demotions, promoted = after.tier_promotions,
             t1_drops = after.tier_drops_t1, evictions = after.evictions,
             disk_reads = after.disk_reads;
    uint64_t t2_hit_tokens = promoted * g.block_tokens, t3_hit_tokens = disk_reads * g.block_tokens;
    /* Tally. */
    uint64_t prompt_tokens = 0, hit_tokens = 0, dups = 0, errors = 0, done_reqs = 0, waits = 0,
             unavailable = 0;
    double wait_us = 0;
    for (size_t i = 0; i < tr.n_reqs; i++) {
        if (!recs[i].done)
            continue;
        done_reqs++;
        prompt_tokens += trace_prompt_tokens(&tr, &tr.reqs[i]);
        hit_tokens += (uint64_t)recs[i].hit_blocks * g.block_tokens;
        dups += recs[i].dup_blocks;
        /* A node restarting (--restart-node) answers nothing for a while:
         * its requests then are misses, counted apart, not failures. */
        bool away = o.restart_node >= 0 &&
                    (recs[i].status == KVS_ENOTCONN || recs[i].status == KVS_ETIMEDOUT);
        unavailable += away;
        errors += recs[i].status != 0 && !away;
        if (recs[i].waited) {
            waits++;
            wait_us += recs[i].us[RPC_LOOKUP];
        }
    }
    float *lat = malloc((tr.n_reqs + 1) * sizeof(*lat));
    double pct[N_RPC][4] = {{0}}; /* p50 p90 p99 max */
    size_t n_lat[N_RPC] = {0};
    for (int k = 0; k < N_RPC && lat; k++) {
        size_t n = 0;
        for (size_t i = 0; i < tr.n_reqs; i++)
            if (recs[i].done && recs[i].us[k] >= 0)
                lat[n++] = recs[i].us[k];
        qsort(lat, n, sizeof(*lat), bench_cmp_float);
        n_lat[k] = n;
        if (n) {
            pct[k][0] = lat[(size_t)(0.50 * (double)(n - 1))];
            pct[k][1] = lat[(size_t)(0.90 * (double)(n - 1))];
            pct[k][2] = lat[(size_t)(0.99 * (double)(n - 1))];
            pct[k][3] = lat[n - 1];
        }
    }
    free(lat);

    /* The offline simulator on the same trace, pool and tier-2 size (policy
     * from --eviction; a --socket daemon's own policy is not known here). */
    sim_params_t sp = {.block_tokens = g.block_tokens,
                       .capacity = g.num_blocks,
                       .tier2 = o.tier2_blocks,
                       .tier3 = o.tier3_blocks,
                       .policy =
                           strcmp(o.eviction, "freq") == 0 ? RADIX_EVICT_FREQ : RADIX_EVICT_LRU,
                       .hints = o.hint_accuracy > 0,
                       .hint_accuracy = o.hint_accuracy,
                       .hint_seed = o.hint_seed,
                       .hint_per_unit = o.hint_per_unit,
                       .next_use = next_use};
    sim_result_t sim = {0}, unl = {0};
    int src = sim_run(&tr, &sp, &sim);
    sp.hints = false;
    sp.capacity = (uint32_t)sim_unlimited_blocks(&tr, g.block_tokens);
    sp.tier2 = 0;
    if (src == 0)
        src = sim_run(&tr, &sp, &unl);
    double hr = prompt_tokens ? (double)hit_tokens / (double)prompt_tokens : 0;
    double sim_hr = src == 0 ? (double)sim.hit_tokens / (double)sim.prompt_tokens : -1;
    double unl_hr = src == 0 ? (double)unl.hit_tokens / (double)unl.prompt_tokens : -1;
    double t2_hr = prompt_tokens ? (double)t2_hit_tokens / (double)prompt_tokens : 0;
    /* Several nodes: what came from the cluster tier, the simulator with
     * one node holding every node's pool, and the restarted node. */
    double cluster_share = prompt_tokens ? (double)after.cluster_fetched_blocks * g.block_tokens /
                                               (double)prompt_tokens
                                         : 0;
    double pooled_hr = -1;
    if (n_nodes > 1 && src == 0) {
        sim_result_t pooled = {0};
        sp.capacity = g.num_blocks * n_nodes;
        sp.tier2 = 0;
        if (sim_run(&tr, &sp, &pooled) == 0)
            pooled_hr = (double)pooled.hit_tokens / (double)pooled.prompt_tokens;
    }
    long rec_lead[REPLAY_MAX_RESTARTS], rec_trail[REPLAY_MAX_RESTARTS];
    double rec_node_hr[REPLAY_MAX_RESTARTS], rec_others_hr[REPLAY_MAX_RESTARTS];
    const size_t rec_win = REPLAY_RECOVERY_WINDOW;
    for (size_t k = 0; k < n_restarted; k++)
        recovery(&tr, recs, g.block_tokens, (uint32_t)o.restart_nodes[k], restarted_at[k],
                 k + 1 < n_restarted ? restarted_at[k + 1] : tr.n_reqs, rec_win, &rec_lead[k],
                 &rec_trail[k], &rec_node_hr[k], &rec_others_hr[k]);
    double sim_t2_hr = src == 0 ? (double)sim.t2_hit_tokens / (double)sim.prompt_tokens : -1;
    if (o.json) {
        printf("{\"nodes\": %u, \"cluster_blocks\": %llu, \"cluster_policy\": \"%s\", "
               "\"cluster_samples\": %u, \"cluster_share\": %.4f, "
               "\"pooled_sim_hit_rate\": %.4f, \"cluster_reply_us\": %.1f, "
               "\"cluster_puts\": %llu, \"cluster_put_drops\": %llu, \"recovery_window\": %zu, "
               "\"restarts\": [",
               n_nodes, (unsigned long long)cluster_blocks, o.cluster_policy,
               o.cluster_samples ? o.cluster_samples : 5, cluster_share, pooled_hr,
               node_replies ? node_lat_us / (double)node_replies : 0.0,
               (unsigned long long)after.cluster_puts, (unsigned long long)after.cluster_put_drops,
               rec_win);
        for (size_t k = 0; k < n_restarted; k++)
            printf("%s{\"node\": %d, \"at\": %zu, \"ms\": %.0f, \"lead\": %ld, \"trail\": %ld, "
                   "\"node_hit_rate\": %.4f, \"others_hit_rate\": %.4f}",
                   k ? ", " : "", o.restart_nodes[k], restarted_at[k], restart_ms[k], rec_lead[k],
                   rec_trail[k], rec_node_hr[k], rec_others_hr[k]);
        printf("], ");
        printf("\"trace\": \"%s\", \"requests\": %zu, \"done\": %llu, \"errors\": %llu, "
               "\"workers\": %u, \"namespaces\": %u, \"speed\": %g, \"eviction\": \"%s\", "
               "\"pool_blocks\": %u, \"block_tokens\": %u, \"block_bytes\": %llu, "
               "\"prompt_tokens\": %llu, \"hit_tokens\": %llu, \"hit_rate\": %.4f, "
               "\"sim_hit_rate\": %.4f, \"unlimited_hit_rate\": %.4f, \"dup_blocks\": %llu, "
               "\"prefill_us_per_token\": %g, \"wait_ms\": %u, \"waits\": %llu, "
               "\"hint_accuracy\": %g, "
               "\"wait_ms_total\": %.1f, "
               "\"tier2_blocks\": %u, \"t2_hit_tokens\": %llu, \"t2_hit_rate\": %.4f, "
               "\"sim_t2_hit_rate\": %.4f, \"demoted\": %llu, \"promoted\": %llu, "
               "\"demote_drops\": %llu, \"evictions\": %llu, \"tier3_blocks\": %u, "
               "\"t3_hit_rate\": %.4f, \"sim_t3_hit_rate\": %.4f, "
               "\"wall_s\": %.2f, \"requests_per_s\": %.1f, \"latency_us\": {",
               o.trace, tr.n_reqs, (unsigned long long)done_reqs, (unsigned long long)errors,
               o.workers, o.namespaces, o.speed, o.socket ? "daemon's" : o.eviction, g.num_blocks,
               g.block_tokens, (unsigned long long)g.block_bytes, (unsigned long long)prompt_tokens,
               (unsigned long long)hit_tokens, hr, sim_hr, unl_hr, (unsigned long long)dups,
               o.prefill_us, o.wait_ms, (unsigned long long)waits, o.hint_accuracy, wait_us / 1e3,
               o.tier2_blocks, (unsigned long long)t2_hit_tokens, t2_hr, sim_t2_hr,
               (unsigned long long)demoted, (unsigned long long)promoted,
               (unsigned long long)t1_drops, (unsigned long long)evictions, o.tier3_blocks,
               prompt_tokens ? (double)t3_hit_tokens / (double)prompt_tokens : 0,
               src == 0 ? (double)sim.t3_hit_tokens / (double)sim.prompt_tokens : -1, wall_s,
               (double)done_reqs / wall_s);
        for (int k = 0; k < N_RPC; k++)
            printf("%s\"%s\": {\"n\": %zu, \"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f, "
                   "\"max\": %.1f}",
                   k ? ", " : "", rpc_names[k], n_lat[k], pct[k][0], pct[k][1], pct[k][2],
                   pct[k][3]);
        printf("}}\n");
    } else {
        printf("trace %s: %llu of %zu requests replayed (%llu failed) by %u worker(s), %u "
               "namespace(s), speed %s\n",
               o.trace, (unsigned long long)done_reqs, tr.n_reqs, (unsigned long long)errors,
               o.workers, o.namespaces, o.speed > 0 ? "paced" : "as fast as possible");
        printf("pool %u blocks of %u tokens (%llu B each), eviction %s\n", g.num_blocks,
               g.block_tokens, (unsigned long long)g.block_bytes,
               o.socket ? "(the daemon's)" : o.eviction);
        printf("hit_rate %.2f %% (%llu of %llu prompt tokens)\n", 100 * hr,
               (unsigned long long)hit_tokens, (unsigned long long)prompt_tokens);
        if (o.tier2_blocks || promoted || demoted)
            printf("tier 2: %u blocks; hits in it %.2f %% of prompt tokens (simulator %.2f %%); "
                   "%llu blocks demoted, %llu promoted, %llu dropped from the pool while "
                   "demoting, %llu dropped for good (evictions)\n",
                   o.tier2_blocks, 100 * t2_hr, 100 * sim_t2_hr, (unsigned long long)demoted,
                   (unsigned long long)promoted, (unsigned long long)t1_drops,
                   (unsigned long long)evictions);
        if (o.tier3_blocks)
            printf("tier 3 (disk): %u blocks; hits in it %.2f %% of prompt tokens (simulator "
                   "%.2f %%)\n",
                   o.tier3_blocks,
                   prompt_tokens ? 100.0 * (double)t3_hit_tokens / (double)prompt_tokens : 0,
                   src == 0 ? 100.0 * (double)sim.t3_hit_tokens / (double)sim.prompt_tokens : -1);
        if (n_nodes > 1 || cluster_blocks)
            printf("nodes %u (random routing), cluster tier %llu blocks (%s, samples %u): "
                   "hits local %.2f %%, from the cluster %.2f %%, misses %.2f %%; %llu blocks "
                   "written through (%llu dropped), %llu fetched; cluster replies %.0f us on "
                   "average\n",
                   n_nodes, (unsigned long long)cluster_blocks, o.cluster_policy,
                   o.cluster_samples ? o.cluster_samples : 5, 100 * (hr - cluster_share),
                   100 * cluster_share, 100 * (1 - hr), (unsigned long long)after.cluster_puts,
                   (unsigned long long)after.cluster_put_drops,
                   (unsigned long long)after.cluster_fetched_blocks,
                   node_replies ? node_lat_us / (double)node_replies : 0.0);
        if (pooled_hr >= 0)
            printf("pooled_sim_hit_rate %.2f %% (offline simulator: one node with the %u pools)\n",
                   100 * pooled_hr, n_nodes);
        if (o.restart_node >= 0) {
            printf("restart: %llu requests found a restarting node away (misses)\n",
                   (unsigned long long)unavailable);
            for (size_t k = 0; k < n_restarted; k++) {
                printf("restart %zu: node %d restarted empty at request %zu (%.0f ms); ", k + 1,
                       o.restart_nodes[k], restarted_at[k], restart_ms[k]);
                if (rec_lead[k] >= 0)
                    printf("the first %zu of its requests in a row within 0.95x of the others' "
                           "hit rate (%.2f %% vs %.2f %%) start %ld requests later (%.2f %% of "
                           "the trace) and end %ld later (%.2f %%)\n",
                           rec_win, 100 * rec_node_hr[k], 100 * rec_others_hr[k], rec_lead[k],
                           100.0 * (double)rec_lead[k] / (double)tr.n_reqs, rec_trail[k],
                           100.0 * (double)rec_trail[k] / (double)tr.n_reqs);
                else
                    printf("no %zu of its requests in a row came within 0.95x of the others' "
                           "hit rate (last %.2f %% vs %.2f %%)\n",
                           rec_win, 100 * rec_node_hr[k], 100 * rec_others_hr[k]);
            }
        }
        printf("sim_hit_rate %.2f %% (offline simulator, same pool, tier 2, policy and hints)\n",
               100 * sim_hr);
        if (o.hint_accuracy > 0)
            printf("hints from the trace's future, accuracy %g, knowledge per %s\n",
                   o.hint_accuracy, o.hint_per_unit ? "unit" : "request");
        printf("unlimited_hit_rate %.2f %%\n", 100 * unl_hr);
        printf("duplicate_new_blocks %llu (committed first by another worker)\n",
               (unsigned long long)dups);
        printf("prefill %g us per token, wait up to %u ms: %llu lookups waited, %.1f ms in all "
               "(%.2f ms each)\n",
               o.prefill_us, o.wait_ms, (unsigned long long)waits, wait_us / 1e3,
               waits ? wait_us / 1e3 / (double)waits : 0.0);
        printf("wall %.2f s, %.1f requests/s\n", wall_s, (double)done_reqs / wall_s);
        if (daemons[0] > 0 && cpu_known && n_restarted == 0 && done_reqs > 0)
            printf("kvshared cpu %.2f s, %.0f us per request (user + system, %u daemon%s)\n", cpu_s,
                   cpu_s * 1e6 / (double)done_reqs, n_nodes, n_nodes > 1 ? "s" : "");
        printf("%-8s %8s %10s %10s %10s %10s\n", "rpc", "n", "p50 us", "p90 us", "p99 us",
               "max us");
        for (int k = 0; k < N_RPC; k++)
            printf("%-8s %8zu %10.1f %10.1f %10.1f %10.1f\n", rpc_names[k], n_lat[k], pct[k][0],
                   pct[k][1], pct[k][2], pct[k][3]);
    }
    status = failed || errors ? 1 : 0;
    if (o.max_sim_gap > 0 &&
        !(src == 0 && 100 * (hr > sim_hr ? hr - sim_hr : sim_hr - hr) <= o.max_sim_gap)) {
        fprintf(stderr, "replay: hit rate %.2f %% and simulator's %.2f %% differ by more than %g\n",
                100 * hr, 100 * sim_hr, o.max_sim_gap);
        status = 1;
    }
    if (o.max_sim_gap > 0 && o.tier2_blocks > 0 &&
        !(src == 0 &&
          100 * (t2_hr > sim_t2_hr ? t2_hr - sim_t2_hr : sim_t2_hr - t2_hr) <= o.max_sim_gap)) {
        fprintf(stderr,
                "replay: hits in tier 2 %.2f %% and simulator's %.2f %% differ by more than %g\n",
                100 * t2_hr, 100 * sim_t2_hr, o.max_sim_gap);
        status = 1;
    }
out:
    if (recs != MAP_FAILED)
        munmap(recs, recs_bytes);
    for (uint32_t k = 0; k < n_nodes; k++)
        if (daemons[k] > 0)
            launch_stop(daemons[k], SIGTERM, LAUNCH_READY_MS);
    if (cluster_up)
        rc_stop(&rcl);
    if (dir[0]) {
        for (uint32_t k = 0; k < n_nodes; k++) {
            unlink(socks[k]);
            if (o.tier3_blocks) {
                node_disk_path(&o, dir, k, n_nodes);
                unlink(o.disk_path);
            }
        }
        if (conf[0])
            unlink(conf);
        rmdir(dir);
    }
    free(next_use);
    trace_free(&tr);
    return status;
}
