/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench tier-hit: what a Lookup that hits one small block in tier 3
 * (the disk) costs, through a real kvshared, against a Lookup that hits one
 * block in tier 1 in the same run.
 *
 * kvshared is started with the host backend, the replay's geometry (1
 * layer, 1 KV head, head dim 8, fp16, 16-token blocks: 512 B a block), a
 * pool of --pool-blocks, a host tier of as many and a disk tier 16 times
 * that (a file in the bench's temporary directory, or --dir). The bench
 * writes one-block prompts until the oldest have gone through host memory
 * to the disk (the pool and host memory full, plus --samples), then, for
 * each of --samples of the oldest prompts, oldest first:
 *   1. a pinned Lookup of a prompt kept in tier 1 (the baseline), Release;
 *   2. a pinned Lookup of the old prompt: the pool is full, so kvshared
 *      demotes a block to make room, reads the block from the disk,
 *      verifies it and copies it into the pool before it answers; Release.
 * A sample counts as a tier-3 hit when the Lookup found the block and the
 * daemon's disk_reads grew by one over it (Stats, outside the timing).
 * Each sample's promotion demotes a block, so host memory spills to the
 * disk now and then (tier.c): some reads find the disk writing.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "kvshare.h"
#include "launch.h"
#include "socket_path.h"
#include "test_tmp.h"

#define HIT_BT          16u /* tokens a block */
#define HIT_BLOCK_BYTES 512u

typedef struct hit_cfg {
    const char *kvshared;
    unsigned pool_blocks, samples;
    unsigned loop_rt; /* > 0: kvshared --loop-rt-priority */
    char dir[SOCKET_PATH_MAX - sizeof("/kvshared.sock")], sock[SOCKET_PATH_MAX];
    char disk[PATH_MAX + 16];
    pid_t pid;
} hit_cfg_t;

/* Prompt i's tokens (one block). */
static void prompt(uint32_t *t, uint64_t i, uint32_t salt)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ULL + salt;
    for (unsigned k = 0; k < HIT_BT; k++) {
        z ^= z >> 31;
        z *= 0xBF58476D1CE4E5B9ULL;
        t[k] = (uint32_t)(z >> 33) % 128000u;
    }
}

static int start_daemon(hit_cfg_t *b)
{
    char pool[32], host[32], disk[32];
    snprintf(pool, sizeof(pool), "%u", b->pool_blocks);
    snprintf(host, sizeof(host), "%llu", (unsigned long long)b->pool_blocks * HIT_BLOCK_BYTES);
    /* One 4 KiB slot a block (its record header and the block), then the
     * superblock's page. */
    snprintf(disk, sizeof(disk), "%llu", 4096ull + 4096ull * 16u * b->pool_blocks);
    const char *argv[32] = {
        b->kvshared, "--socket",         b->sock, "--backend",         "host", "--layers",
        "1",         "--kv-heads",       "1",     "--head-dim",        "8",    "--dtype",
        "fp16",      "--block-tokens",   "16",    "--pool-blocks",     pool,   "--host-tier",
        host,        "--disk-tier-path", b->disk, "--disk-tier-bytes", disk,   "--log-level",
        "warn"};
    size_t n = 0;
    while (argv[n])
        n++;
    char rt[16];
    if (b->loop_rt) {
        snprintf(rt, sizeof(rt), "%u", b->loop_rt);
        argv[n++] = "--loop-rt-priority";
        argv[n++] = rt;
    }
    argv[n] = NULL;
    b->pid = launch_daemon(argv, 2 * LAUNCH_READY_MS, NULL);
    return b->pid > 0 ? 0 : -1;
}

static kvs_client_t *hit_connect(const hit_cfg_t *b, const char *who)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.timeout_ms = 30000;
    o.worker_name = who;
    int rc = kvs_connect(&o, &c);
    if (rc != 0) {
        fprintf(stderr, "bench tier-hit: connect: %s\n", kvs_strerror(rc));
        return NULL;
    }
    return c;
}

/* Writes the n-block prompt of tokens t (Lookup first, as a worker does):
 * Alloc, a write into each block, Commit, Release. */
static int write_prompt(kvs_client_t *c, const uint32_t *t, uint32_t n)
{
    uint32_t ids[1], canon[1], rel[2];
    if (n != 1)
        return KVS_EINVAL;
    size_t hit = 0, done = 0, n_rel = 0;
    int rc = kvs_lookup(c, NULL, t, (size_t)n * HIT_BT, 1, ids, n, &hit);
    if (rc != 0)
        return rc;
    memcpy(rel, ids, hit * sizeof(*ids));
    n_rel = hit;
    if (hit < n) {
        uint8_t pattern[64];
        memset(pattern, (int)(t[0] & 0xff), sizeof(pattern));
        rc = kvs_alloc(c, NULL, (uint32_t)(n - hit), ids + hit);
        for (size_t k = hit; rc == 0 && k < n; k++)
            rc = kvs_block_write(c, 0, 0, ids[k], pattern, sizeof(pattern));
        if (rc == 0)
            rc = kvs_commit(c, NULL, t, (size_t)n * HIT_BT, ids, n, canon, &done);
        for (size_t k = hit; rc == 0 && k < n; k++) {
            if (k < done)
                rel[n_rel++] = canon[k];
            if (k >= done || canon[k] != ids[k])
                rel[n_rel++] = ids[k];
        }
    }
    int rrc = n_rel ? kvs_release(c, rel, n_rel, NULL) : 0;
    return rc ? rc : rrc;
}

/* A timed pinned Lookup of the one-block prompt t, then its Release.
 * Returns the blocks found, or -1 on an error. */
static int timed_lookup(kvs_client_t *c, const uint32_t *t, uint64_t *ns)
{
    uint32_t id;
    size_t got = 0;
    int64_t t0 = now_ns();
    int rc = kvs_lookup(c, NULL, t, HIT_BT, 1, &id, 1, &got);
    *ns = (uint64_t)(now_ns() - t0);
    if (rc != 0)
        return -1;
    if (got && kvs_release(c, &id, 1, NULL) != 0)
        return -1;
    return (int)got;
}

static uint64_t disk_reads(kvs_client_t *c)
{
    kvs_stats_t st;
    memset(&st, 0, sizeof(st));
    if (kvs_stats(c, &st) != 0)
        return UINT64_MAX;
    uint64_t r = st.disk_reads;
    kvs_stats_free(&st);
    return r;
}

static void report(const char *what, uint64_t *ns, size_t n)
{
    if (n == 0) {
        printf("%s_samples 0\n", what);
        return;
    }
    double p50 = bench_quantile(ns, n, 0.50), p99 = bench_quantile(ns, n, 0.99);
    printf("%s_samples %zu\n", what, n);
    printf("%s_p50 %.1f us\n", what, p50 / 1e3);
    printf("%s_p99 %.1f us\n", what, p99 / 1e3);
    printf("%s_max %.1f us\n", what, (double)ns[n - 1] / 1e3);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare-bench tier-hit [--kvshared PATH] [--pool-blocks N] [--samples N]\n"
               "                              [--dir DIR] [--loop-rt N]\n\n"
               "A pinned Lookup of one 512-byte block in tier 3 (the disk: kvshared reads,\n"
               "verifies and promotes it, demoting another to make room) against one that\n"
               "hits tier 1, in the same run. Pool and host tier of --pool-blocks (default\n"
               "4096) each, a disk tier 16 times that in --dir (default: a temporary\n"
               "directory); --samples of each (default 2000). --loop-rt N: kvshared\n"
               "--loop-rt-priority N (its loop thread under SCHED_RR).\n");
}

int bench_tier_hit(int argc, char **argv)
{
    hit_cfg_t b;
    char kvshared[PATH_MAX + 32];
    const char *dir = NULL;
    memset(&b, 0, sizeof(b));
    b.kvshared = bench_default_kvshared(kvshared, sizeof(kvshared));
    b.pool_blocks = 4096;
    b.samples = 2000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kvshared") == 0 && i + 1 < argc) {
            b.kvshared = argv[++i];
        } else if (strcmp(argv[i], "--pool-blocks") == 0 && i + 1 < argc) {
            b.pool_blocks = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc) {
            b.samples = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else if (strcmp(argv[i], "--loop-rt") == 0 && i + 1 < argc) {
            b.loop_rt = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (b.pool_blocks < 256 || b.pool_blocks > (1u << 20) || b.samples < 1 ||
        b.samples > b.pool_blocks * 4) {
        fprintf(stderr, "bench tier-hit: --pool-blocks 256 to 2^20, --samples 1 to 4 x the "
                        "pool\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (test_tmp_dir("kvs-bench", b.dir, sizeof(b.dir)) != 0) {
        fprintf(stderr, "bench tier-hit: cannot make a temporary directory: %s\n", strerror(errno));
        return 1;
    }
    snprintf(b.sock, sizeof(b.sock), "%s/kvshared.sock", b.dir);
    snprintf(b.disk, sizeof(b.disk), "%s/tier-hit.kvs", dir ? dir : b.dir);
    if (start_daemon(&b) != 0) {
        fprintf(stderr, "bench tier-hit: kvshared (%s) did not start; give --kvshared PATH\n",
                b.kvshared);
        rmdir(b.dir);
        return 1;
    }
    int rc = 1;
    uint64_t *t1_ns = malloc(b.samples * sizeof(uint64_t));
    uint64_t *t3_ns = malloc(b.samples * sizeof(uint64_t));
    kvs_client_t *c = hit_connect(&b, "tier-hit");
    size_t n1 = 0, n3 = 0, missed = 0, not_disk = 0;
    uint32_t hot[HIT_BT], t[HIT_BT];
    if (!t1_ns || !t3_ns || !c)
        goto out;
    /* The pool and host memory full, the oldest samples' worth beyond
     * them (and the spill kept ahead of demotions) on the disk. */
    uint64_t n_fill = 2ull * b.pool_blocks + b.samples + b.pool_blocks / 4;
    for (uint64_t i = 0; i < n_fill; i++) {
        prompt(t, i, 1);
        if (write_prompt(c, t, 1) != 0) {
            fprintf(stderr, "bench tier-hit: writing prompt %llu: %s\n", (unsigned long long)i,
                    kvs_last_error(c));
            goto out;
        }
    }
    prompt(hot, UINT64_MAX, 2);
    if (write_prompt(c, hot, 1) != 0)
        goto out;
    kvs_stats_t st;
    memset(&st, 0, sizeof(st));
    if (kvs_stats(c, &st) == 0) {
        printf("# pool %u blocks of %u B, host tier %u, disk tier %u (%s, %s); tier 3 holds %u "
               "blocks\n",
               b.pool_blocks, HIT_BLOCK_BYTES, st.tier2_total_blocks, st.tier3_total_blocks, b.disk,
               st.disk_io ? st.disk_io : "?", st.tier3_cached_blocks);
        kvs_stats_free(&st);
    }
    for (uint64_t i = 0; i < b.samples; i++) {
        uint64_t ns;
        if (timed_lookup(c, hot, &ns) == 1)
            t1_ns[n1++] = ns;
        prompt(t, i, 1);
        uint64_t r0 = disk_reads(c);
        int got = timed_lookup(c, t, &ns);
        uint64_t r1 = disk_reads(c);
        if (got != 1)
            missed++;
        else if (r0 == UINT64_MAX || r1 != r0 + 1)
            not_disk++;
        else
            t3_ns[n3++] = ns;
    }
    printf("tier3_missed %zu (not found)\n", missed);
    printf("tier3_not_from_disk %zu (found above the disk)\n", not_disk);
    report("tier1_hit", t1_ns, n1);
    report("tier3_hit", t3_ns, n3);
    rc = n3 > 0 ? 0 : 1;
out:
    kvs_close(c);
    free(t1_ns);
    free(t3_ns);
    launch_stop(b.pid, SIGTERM, 10000);
    unlink(b.disk);
    unlink(b.sock);
    rmdir(b.dir);
    return rc;
}
