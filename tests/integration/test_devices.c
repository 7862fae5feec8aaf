/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Several devices through a real kvshared (--devices) on the host backend,
 * where each simulated device is a memfd of its own: one tensor-parallel
 * group of 2 or 4 ranks shares one index. Each rank maps its own device's
 * pool, writes its shard of the blocks rank 0 allocated and commits it; a
 * block is cached only once every rank committed (or the group's scheduler
 * committed for the group, after every rank declared its shard of this very
 * prompt written), a lookup finds the prefix once for the group,
 * every rank of another group reads back its own bytes, and a rank that
 * dies mid-write frees only what it held: its group's unfinished blocks
 * stay with their holder, whose commit of them is refused.
 *
 * KVS_TEST_DEVICES_BACKEND=cuda runs the same on the cuda backend (ctest:
 * on the stand-in driver with 4 fake devices, test_devices_cuda_fake_driver).
 */
#include <check.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "kvshare.h"
#include "test_tmp.h"

#define MAX_RANKS  4
#define POOL       16
#define N_BLOCKS   3
#define BT         4 /* the harness geometry's tokens per block */
#define N_TOKENS   (N_BLOCKS * BT)
#define SLOT_BYTES 128 /* 4 tokens x 2 heads x 8 dims x fp16 */

static harness_t h;

/* Starts kvshared with extra flags (at most two) on this run's backend. */
static int start(const char *flag, const char *value)
{
    const char *backend = getenv("KVS_TEST_DEVICES_BACKEND");
    const char *extra[5] = {NULL};
    size_t n = 0;
    if (backend && backend[0]) {
        extra[n++] = "--backend";
        extra[n++] = backend;
    }
    if (flag) {
        extra[n++] = flag;
        extra[n++] = value;
    }
    return harness_start(&h, POOL, extra);
}

static void start_devices(unsigned n)
{
    char spec[16];
    snprintf(spec, sizeof(spec), "0-%u", n - 1);
    ck_assert_int_eq(start("--devices", spec), 0);
}

static int connect_as(unsigned flags, uint32_t rank, kvs_client_t **out)
{
    kvs_options_t o;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.worker_name = "test_devices";
    o.timeout_ms = 30000;
    o.flags = flags;
    o.rank = rank;
    return kvs_connect(&o, out);
}

static kvs_client_t *rank_client(uint32_t rank)
{
    kvs_client_t *c = NULL;
    int rc = connect_as(KVS_RANK, rank, &c);
    ck_assert_msg(rc == 0, "connect as rank %u: %s", rank, kvs_strerror(rc));
    return c;
}

static void prompt(uint32_t *t, uint32_t seed)
{
    for (size_t i = 0; i < N_TOKENS; i++)
        t[i] = seed * 1000 + (uint32_t)i;
}

/* Rank r's bytes of block j, layer l, K or V, of the prompt of `seed` (0:
 * any): different on every rank and every prompt. */
static void shard_bytes_of(uint8_t *out, uint32_t seed, uint32_t r, uint32_t l, uint32_t kv,
                           size_t j)
{
    for (size_t i = 0; i < SLOT_BYTES; i++)
        out[i] = (uint8_t)(seed * 29 + r * 61 + l * 17 + kv * 7 + j * 3 + i);
}

static void shard_bytes(uint8_t *out, uint32_t r, uint32_t l, uint32_t kv, size_t j)
{
    shard_bytes_of(out, 0, r, l, kv, j);
}

static void write_shard_of(kvs_client_t *c, uint32_t seed, uint32_t r, const uint32_t *ids)
{
    uint8_t slot[SLOT_BYTES];
    for (size_t j = 0; j < N_BLOCKS; j++)
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                shard_bytes_of(slot, seed, r, l, kv, j);
                ck_assert_int_eq(kvs_block_write(c, l, kv, ids[j], slot, SLOT_BYTES), 0);
            }
}

static void write_shard(kvs_client_t *c, uint32_t r, const uint32_t *ids)
{
    write_shard_of(c, 0, r, ids);
}

/* Rank r reads blocks ids[0..n) back: its shard of the prompt of seed. */
static void check_shard_of(kvs_client_t *c, uint32_t seed, uint32_t r, const uint32_t *ids,
                           size_t n)
{
    uint8_t want[SLOT_BYTES], got[SLOT_BYTES];
    for (size_t j = 0; j < n; j++)
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                shard_bytes_of(want, seed, r, l, kv, j);
                ck_assert_int_eq(kvs_block_read(c, l, kv, ids[j], got, SLOT_BYTES), 0);
                ck_assert_msg(memcmp(want, got, SLOT_BYTES) == 0,
                              "rank %u read other bytes than its shard of block %u", r, ids[j]);
            }
}

static void check_shard(kvs_client_t *c, uint32_t r, const uint32_t *ids)
{
    check_shard_of(c, 0, r, ids, N_BLOCKS);
}

static size_t commit_shard(kvs_client_t *c, const uint32_t *tokens, const uint32_t *ids,
                           size_t *pending, uint32_t *canonical)
{
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.n_pending = pending;
    size_t done = 99;
    int rc = kvs_commit_ex(c, "default", tokens, N_TOKENS, ids, N_BLOCKS, &o, canonical, &done);
    ck_assert_msg(rc == 0, "commit: %s (%s)", kvs_strerror(rc), kvs_last_error(c));
    return done;
}

/* Rank c declares its shard of ids written for tokens, for the group's
 * commit: nothing is cached, every block waits. */
static void declare_shard(kvs_client_t *c, const uint32_t *tokens, const uint32_t *ids)
{
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.shard_written = 1;
    size_t pending = 0, done = 99;
    o.n_pending = &pending;
    uint32_t canonical[2 * N_BLOCKS];
    int rc = kvs_commit_ex(c, "default", tokens, N_TOKENS, ids, N_BLOCKS, &o, canonical, &done);
    ck_assert_msg(rc == 0, "declare: %s (%s)", kvs_strerror(rc), kvs_last_error(c));
    ck_assert_uint_eq(done, 0);
    ck_assert_uint_eq(pending, N_BLOCKS);
}

/* The group's commit of ids for tokens (c: the scheduler, or a rank). */
static int commit_for_group(kvs_client_t *c, const uint32_t *tokens, const uint32_t *ids,
                            size_t *done)
{
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.for_group = 1;
    uint32_t canonical[2 * N_BLOCKS];
    return kvs_commit_ex(c, "default", tokens, N_TOKENS, ids, N_BLOCKS, &o, canonical, done);
}

static size_t lookup(kvs_client_t *c, const uint32_t *tokens, int pin, uint32_t *ids)
{
    size_t n = 99;
    ck_assert_int_eq(kvs_lookup(c, "default", tokens, N_TOKENS, pin, ids, N_BLOCKS, &n), 0);
    return n;
}

static void stats(kvs_client_t *c, uint32_t *writing, uint32_t *cached, uint32_t *freeb)
{
    kvs_stats_t s;
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    ck_assert_uint_eq(s.free_blocks + s.writing_blocks + s.cached_blocks, s.total_blocks);
    ck_assert_uint_eq(s.total_blocks, POOL);
    *writing = s.writing_blocks;
    *cached = s.cached_blocks;
    *freeb = s.free_blocks;
    kvs_stats_free(&s);
}

/* Stats per device while every rank but the last committed its shard of
 * `waiting` blocks: n rows in rank order, each with its pool, the blocks
 * in use, one worker, and the shards written (ranks 0..n-2) or missing
 * (rank n-1). */
static void check_devices(kvs_client_t *c, unsigned n, uint32_t waiting)
{
    kvs_stats_t s;
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    ck_assert_uint_eq(s.n_devices, n);
    for (uint32_t r = 0; r < n; r++) {
        const kvs_device_stats_t *d = &s.devices[r];
        ck_assert_uint_eq(d->rank, r);
        ck_assert_int_eq(d->ordinal, (int)r);
        ck_assert_uint_ge(d->pool_bytes, s.pool_bytes);
        ck_assert_uint_eq(d->used_bytes,
                          (uint64_t)(s.writing_blocks + s.cached_blocks) * s.block_bytes);
        ck_assert_uint_eq(d->workers, 1);
        ck_assert_uint_eq(d->shards_written, r + 1 < n ? waiting : 0);
        ck_assert_uint_eq(d->shards_missing, r + 1 < n ? 0 : waiting);
        ck_assert_msg(d->detail[0], "device %u has no description", r);
    }
    kvs_stats_free(&s);
}

/* One group of n ranks computes a prefix shard by shard; another group
 * finds it with one lookup and each of its ranks reads its own bytes. */
static void group_round_trip(unsigned n)
{
    start_devices(n);
    kvs_client_t *w[MAX_RANKS];
    uint32_t tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS], found[N_BLOCKS];
    uint32_t writing, cached, freeb;
    prompt(tokens, 7);
    for (uint32_t r = 0; r < n; r++) {
        w[r] = rank_client(r);
        uint32_t rank = 99, size = 0;
        ck_assert_int_eq(kvs_group(w[r], &rank, &size), 0);
        ck_assert_uint_eq(rank, r);
        ck_assert_uint_eq(size, n);
    }
    ck_assert_int_eq(kvs_alloc(w[0], "default", N_BLOCKS, ids), 0);
    for (uint32_t r = 0; r < n; r++)
        write_shard(w[r], r, ids);
    /* Every rank but the last: nothing is cached, nothing is found. */
    for (uint32_t r = 0; r + 1 < n; r++) {
        size_t pending = 0;
        ck_assert_uint_eq(commit_shard(w[r], tokens, ids, &pending, canonical), 0);
        ck_assert_uint_eq(pending, N_BLOCKS);
        ck_assert_uint_eq(lookup(w[n - 1], tokens, 0, found), 0);
    }
    stats(w[0], &writing, &cached, &freeb);
    ck_assert_uint_eq(writing, N_BLOCKS);
    ck_assert_uint_eq(cached, 0);
    check_devices(w[0], n, N_BLOCKS);
    /* The last rank's shard completes them: cached, pinned by it. */
    size_t pending = 99;
    ck_assert_uint_eq(commit_shard(w[n - 1], tokens, ids, &pending, canonical), N_BLOCKS);
    ck_assert_uint_eq(pending, 0);
    for (size_t j = 0; j < N_BLOCKS; j++)
        ck_assert_uint_eq(canonical[j], ids[j]);
    ck_assert_int_eq(kvs_release(w[n - 1], ids, N_BLOCKS, NULL), 0);
    for (uint32_t r = 0; r < n; r++)
        kvs_close(w[r]);

    /* Another group: one lookup (its scheduler's) finds the prefix for
     * all ranks; each rank reads back its own shard. */
    kvs_client_t *sched = NULL;
    ck_assert_int_eq(connect_as(KVS_GROUP_SCHEDULER, 0, &sched), 0);
    ck_assert_uint_eq(lookup(sched, tokens, 1, found), N_BLOCKS);
    ck_assert_mem_eq(found, ids, sizeof(ids));
    for (uint32_t r = 0; r < n; r++) {
        w[r] = rank_client(r);
        check_shard(w[r], r, found);
    }
    stats(sched, &writing, &cached, &freeb);
    ck_assert_uint_eq(writing, 0);
    ck_assert_uint_eq(cached, N_BLOCKS);
    ck_assert_int_eq(kvs_release(sched, found, N_BLOCKS, NULL), 0);
    for (uint32_t r = 0; r < n; r++)
        kvs_close(w[r]);
    kvs_close(sched);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}

START_TEST(test_two_devices)
{
    group_round_trip(2);
}
END_TEST

START_TEST(test_four_devices)
{
    group_round_trip(4);
}
END_TEST

/* Waits until the daemon saw a session end: no WRITING block left. */
/* A process connected as rank 3 that wrote the first slot of its shard of
 * `block` and stops there, mid-write; returns its pid once it has written. */
static pid_t fork_rank3_mid_write(uint32_t block)
{
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        kvs_client_t *c = NULL;
        if (connect_as(KVS_RANK, 3, &c) != 0)
            _exit(2);
        uint8_t slot[SLOT_BYTES];
        shard_bytes(slot, 3, 0, 0, 0);
        kvs_block_write(c, 0, 0, block, slot, SLOT_BYTES);
        char one = 1;
        if (write(ready[1], &one, 1) != 1)
            _exit(3);
        pause(); /* killed here, mid-write */
        _exit(0);
    }
    close(ready[1]);
    char one = 0;
    ck_assert_int_eq(read(ready[0], &one, 1), 1);
    close(ready[0]);
    return child;
}

/* SIGKILLs the process fork_rank3_mid_write started and reaps it. */
static void kill_rank(pid_t child)
{
    ck_assert_int_eq(kill(child, SIGKILL), 0);
    int status = 0;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert(WIFSIGNALED(status));
}

static void wait_no_writing(kvs_client_t *c)
{
    uint32_t writing = 1, cached, freeb;
    for (int i = 0; i < 500 && writing; i++) {
        stats(c, &writing, &cached, &freeb);
        if (writing) {
            struct timespec ms10 = {0, 10 * 1000 * 1000};
            nanosleep(&ms10, NULL);
        }
    }
    ck_assert_uint_eq(writing, 0);
}

/* Rank 3 is killed while it writes: the blocks ranks 0-2 committed their
 * shards of are never found and stay with their holder (rank 0), which
 * frees them; nothing else is held. */
START_TEST(test_rank_dies_mid_write)
{
    start_devices(4);
    kvs_client_t *w[3];
    uint32_t tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS], found[N_BLOCKS];
    prompt(tokens, 9);
    for (uint32_t r = 0; r < 3; r++)
        w[r] = rank_client(r);
    ck_assert_int_eq(kvs_alloc(w[0], "default", N_BLOCKS, ids), 0);
    pid_t child = fork_rank3_mid_write(ids[0]);
    for (uint32_t r = 0; r < 3; r++) {
        write_shard(w[r], r, ids);
        size_t pending = 0;
        ck_assert_uint_eq(commit_shard(w[r], tokens, ids, &pending, canonical), 0);
        ck_assert_uint_eq(pending, N_BLOCKS);
    }
    kill_rank(child);
    uint32_t writing, cached, freeb;
    stats(w[0], &writing, &cached, &freeb);
    ck_assert_uint_eq(writing, N_BLOCKS);
    ck_assert_uint_eq(lookup(w[1], tokens, 0, found), 0);
    /* Still rank 0's: its release frees them. */
    ck_assert_int_eq(kvs_release(w[0], ids, N_BLOCKS, NULL), 0);
    wait_no_writing(w[0]);
    stats(w[0], &writing, &cached, &freeb);
    ck_assert_uint_eq(freeb, POOL);
    for (uint32_t r = 0; r < 3; r++)
        kvs_close(w[r]);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* The scheduler's way (vLLM's connector): it allocated, ranks 0-2 wrote
 * their shards, rank 3 is killed mid-write. The scheduler's blocks stay
 * its own, its commit for the group is refused naming rank 3, nothing is
 * cached, and its release frees them. */
START_TEST(test_rank_dies_before_group_commit)
{
    start_devices(4);
    kvs_client_t *w[3], *sched = NULL;
    uint32_t tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS], found[N_BLOCKS];
    prompt(tokens, 10);
    ck_assert_int_eq(connect_as(KVS_GROUP_SCHEDULER, 0, &sched), 0);
    for (uint32_t r = 0; r < 3; r++)
        w[r] = rank_client(r);
    ck_assert_int_eq(kvs_alloc(sched, "default", N_BLOCKS, ids), 0);
    pid_t child = fork_rank3_mid_write(ids[0]);
    for (uint32_t r = 0; r < 3; r++)
        write_shard(w[r], r, ids);
    for (uint32_t r = 0; r < 3; r++)
        declare_shard(w[r], tokens, ids);
    kill_rank(child);
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.for_group = 1;
    size_t done = 99;
    ck_assert_int_eq(
        kvs_commit_ex(sched, "default", tokens, N_TOKENS, ids, N_BLOCKS, &o, canonical, &done),
        KVS_EBADSTATE);
    ck_assert_msg(strstr(kvs_last_error(sched), "1 rank(s): 3"), "%s", kvs_last_error(sched));
    ck_assert_uint_eq(lookup(w[0], tokens, 0, found), 0);
    ck_assert_int_eq(kvs_release(sched, ids, N_BLOCKS, NULL), 0);
    wait_no_writing(sched);
    uint32_t writing, cached, freeb;
    stats(sched, &writing, &cached, &freeb);
    ck_assert_uint_eq(cached, 0);
    ck_assert_uint_eq(freeb, POOL);
    for (uint32_t r = 0; r < 3; r++)
        kvs_close(w[r]);
    kvs_close(sched);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* Ranks that do not talk to each other (SGLang's): each Alloc declares
 * the prefix, and the later rank gets the block the earlier one declared;
 * each writes its shard there and commits; the block is cached once both
 * did. An Alloc that declares nothing, or a prefix no other rank declared,
 * gets new blocks. */
START_TEST(test_ranks_join_declared_blocks)
{
    start_devices(2);
    uint32_t tokens[N_TOKENS], other[N_TOKENS], ids0[N_BLOCKS], ids1[N_BLOCKS], fresh[N_BLOCKS];
    uint32_t canonical[2 * N_BLOCKS], found[N_BLOCKS];
    prompt(tokens, 21);
    prompt(other, 22);
    kvs_client_t *r0 = rank_client(0), *r1 = rank_client(1);
    ck_assert_int_eq(kvs_alloc_for(r0, "default", tokens, N_TOKENS, 0, N_BLOCKS, ids0), 0);
    ck_assert_int_eq(kvs_alloc_for(r1, "default", tokens, N_TOKENS, 0, N_BLOCKS, ids1), 0);
    ck_assert_mem_eq(ids1, ids0, sizeof(ids0));
    ck_assert_int_eq(kvs_alloc_for(r1, "default", other, N_TOKENS, 0, N_BLOCKS, fresh), 0);
    ck_assert_int_eq(kvs_alloc(r1, "default", 1, &fresh[0]), 0);
    for (size_t j = 0; j < N_BLOCKS; j++)
        ck_assert_uint_ne(fresh[j], ids0[j]);
    write_shard(r0, 0, ids0);
    write_shard(r1, 1, ids1);
    size_t pending = 0;
    ck_assert_uint_eq(commit_shard(r0, tokens, ids0, &pending, canonical), 0);
    ck_assert_uint_eq(pending, N_BLOCKS);
    ck_assert_uint_eq(commit_shard(r1, tokens, ids1, &pending, canonical), N_BLOCKS);
    ck_assert_uint_eq(pending, 0);
    ck_assert_int_eq(kvs_release(r1, ids1, N_BLOCKS, NULL), 0);
    ck_assert_uint_eq(lookup(r0, tokens, 0, found), N_BLOCKS);
    check_shard(r0, 0, found);
    check_shard(r1, 1, found);
    kvs_close(r0);
    kvs_close(r1);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* Tier 2 with two devices: a slot holds both shards of a block. A prefix
 * the group cached is demoted by fillers (the pool is 16 blocks), found in
 * tier 2, promoted by a pinned lookup, and each rank reads back its own
 * shard, bitwise. */
START_TEST(test_tier2_holds_every_shard)
{
    const char *backend = getenv("KVS_TEST_DEVICES_BACKEND");
    const char *extra[] = {"--devices", "0-1", "--host-tier", "64KiB", NULL, NULL, NULL};
    if (backend && backend[0]) {
        extra[4] = "--backend";
        extra[5] = backend;
    }
    ck_assert_int_eq(harness_start(&h, POOL, extra), 0);
    uint32_t tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS], found[N_BLOCKS];
    kvs_client_t *sched = NULL, *r0 = rank_client(0), *r1 = rank_client(1);
    ck_assert_int_eq(connect_as(KVS_GROUP_SCHEDULER, 0, &sched), 0);
    prompt(tokens, 31);
    ck_assert_int_eq(kvs_alloc(sched, "default", N_BLOCKS, ids), 0);
    write_shard(r0, 0, ids);
    write_shard(r1, 1, ids);
    declare_shard(r0, tokens, ids);
    declare_shard(r1, tokens, ids);
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.for_group = 1;
    size_t done = 0;
    ck_assert_int_eq(
        kvs_commit_ex(sched, "default", tokens, N_TOKENS, ids, N_BLOCKS, &o, canonical, &done), 0);
    ck_assert_uint_eq(done, N_BLOCKS);
    ck_assert_int_eq(kvs_release(sched, ids, N_BLOCKS, NULL), 0);
    /* Fillers until the prefix is in tier 2. */
    kvs_stats_t s;
    uint32_t in_tier2 = 0;
    for (uint32_t seed = 100; seed < 140 && in_tier2 < N_BLOCKS; seed++) {
        uint32_t filler[N_TOKENS], fids[N_BLOCKS];
        prompt(filler, seed);
        ck_assert_int_eq(kvs_alloc(sched, "default", N_BLOCKS, fids), 0);
        declare_shard(r0, filler, fids);
        declare_shard(r1, filler, fids);
        ck_assert_int_eq(
            kvs_commit_ex(sched, "default", filler, N_TOKENS, fids, N_BLOCKS, &o, canonical, &done),
            0);
        ck_assert_int_eq(kvs_release(sched, fids, N_BLOCKS, NULL), 0);
        ck_assert_int_eq(kvs_stats(sched, &s), 0);
        in_tier2 = s.tier2_cached_blocks;
        kvs_stats_free(&s);
    }
    ck_assert_uint_ge(in_tier2, N_BLOCKS);
    /* A pinned lookup promotes it; both shards came back. */
    ck_assert_uint_eq(lookup(sched, tokens, 1, found), N_BLOCKS);
    check_shard(r0, 0, found);
    check_shard(r1, 1, found);
    ck_assert_int_eq(kvs_stats(sched, &s), 0);
    ck_assert_uint_ge(s.tier_promotions, N_BLOCKS);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_release(sched, found, N_BLOCKS, NULL), 0);
    kvs_close(r0);
    kvs_close(r1);
    kvs_close(sched);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* The disk and cluster tiers keep one device's bytes of a block: with
 * several devices kvshared refuses to start with them. */
START_TEST(test_one_shard_tiers_refused)
{
    char dir[256], path[300];
    ck_assert_int_eq(test_tmp_dir("kvs-devices-t3", dir, sizeof(dir)), 0);
    snprintf(path, sizeof(path), "%s/tier3", dir);
    /* Each starts with one device (an unreachable cluster seed is retried
     * later, not an error; the disk tier sits below a host tier), and is
     * refused with two. */
    const char *disk[] = {
        "--devices",         "0-1",  "--host-tier", "1MiB", "--disk-tier-path", path,
        "--disk-tier-bytes", "1MiB", NULL};
    const char *cluster[] = {"--devices", "0-1", "--cluster-seeds", "127.0.0.1:1", NULL};
    ck_assert_int_eq(harness_start(&h, POOL, disk), -1);
    ck_assert_int_eq(harness_start(&h, POOL, cluster), -1);
    ck_assert_int_eq(harness_start(&h, POOL, cluster + 2), 0);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    ck_assert_int_eq(harness_start(&h, POOL, disk + 2), 0);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    unlink(path);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* A rank whose session ends before the last shard frees the blocks too,
 * even when it never wrote any (the shard can no longer come). */
START_TEST(test_missing_shard_never_served)
{
    start_devices(2);
    uint32_t tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS], found[N_BLOCKS];
    prompt(tokens, 11);
    kvs_client_t *r0 = rank_client(0), *r1 = rank_client(1);
    ck_assert_int_eq(kvs_alloc(r0, "default", N_BLOCKS, ids), 0);
    write_shard(r0, 0, ids);
    size_t pending = 0;
    ck_assert_uint_eq(commit_shard(r0, tokens, ids, &pending, canonical), 0);
    ck_assert_uint_eq(pending, N_BLOCKS);
    /* Rank 1 names another prefix for the same blocks: refused. */
    uint32_t other[N_TOKENS];
    prompt(other, 12);
    size_t done = 0;
    ck_assert_int_eq(kvs_commit(r1, "default", other, N_TOKENS, ids, N_BLOCKS, canonical, &done),
                     KVS_EINVAL);
    ck_assert_uint_eq(lookup(r1, tokens, 0, found), 0);
    ck_assert_uint_eq(lookup(r1, other, 0, found), 0);
    kvs_close(r1);
    /* Rank 1's end frees only what it held: the blocks stay rank 0's,
     * never found, until it gives them back. */
    ck_assert_uint_eq(lookup(r0, tokens, 0, found), 0);
    ck_assert_int_eq(kvs_release(r0, ids, N_BLOCKS, NULL), 0);
    wait_no_writing(r0);
    kvs_close(r0);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* The group's scheduler allocates, the workers write, and one commit for
 * the group caches the blocks; sessions without a rank are refused unless
 * they map nothing, and those may not write. */
START_TEST(test_scheduler_and_refusals)
{
    start_devices(2);
    uint32_t tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS], found[N_BLOCKS];
    prompt(tokens, 13);
    kvs_client_t *c = NULL;
    ck_assert_int_eq(connect_as(0, 0, &c), KVS_EINVAL);
    ck_assert_int_eq(connect_as(KVS_RANK, 2, &c), KVS_EINVAL);
    ck_assert_int_eq(connect_as(KVS_RANK | KVS_GROUP_SCHEDULER, 0, &c), KVS_EINVAL);
    kvs_client_t *mon = NULL;
    ck_assert_int_eq(connect_as(KVS_NO_MAP, 0, &mon), 0);
    ck_assert_int_eq(kvs_alloc(mon, "default", 1, ids), KVS_EDENIED);

    kvs_client_t *sched = NULL;
    ck_assert_int_eq(connect_as(KVS_GROUP_SCHEDULER, 0, &sched), 0);
    kvs_client_t *r0 = rank_client(0), *r1 = rank_client(1);
    ck_assert_int_eq(kvs_alloc(sched, "default", N_BLOCKS, ids), 0);
    write_shard(r0, 0, ids);
    write_shard(r1, 1, ids);
    size_t done = 0;
    /* The scheduler has no shard of its own: it commits for the group,
     * once each rank declared its shard written. */
    ck_assert_int_eq(
        kvs_commit(sched, "default", tokens, N_TOKENS, ids, N_BLOCKS, canonical, &done),
        KVS_EINVAL);
    declare_shard(r0, tokens, ids);
    declare_shard(r1, tokens, ids);
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.for_group = 1;
    ck_assert_int_eq(
        kvs_commit_ex(sched, "default", tokens, N_TOKENS, ids, N_BLOCKS, &o, canonical, &done), 0);
    ck_assert_uint_eq(done, N_BLOCKS);
    ck_assert_int_eq(kvs_release(sched, ids, N_BLOCKS, NULL), 0);
    ck_assert_uint_eq(lookup(mon, tokens, 0, found), N_BLOCKS);
    check_shard(r0, 0, found);
    check_shard(r1, 1, found);
    /* A complete block outlives a rank's end. */
    kvs_close(r1);
    ck_assert_uint_eq(lookup(mon, tokens, 0, found), N_BLOCKS);
    kvs_close(r0);
    kvs_close(sched);
    kvs_close(mon);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* The bug: a scheduler's commit for the group of a prompt only rank 0
 * wrote, into blocks reused from another prompt, was cached, and ranks
 * 1-3 read the other prompt's bytes. Now the group's commit needs every
 * rank's shard declared for this very prompt on this allocation: refused
 * (the ranks missing named, nothing changes), then cached once they
 * declared, and no rank ever reads another prompt's bytes. */
START_TEST(test_group_commit_reused_blocks_only_rank0_wrote)
{
    start_devices(4);
    kvs_client_t *w[MAX_RANKS], *sched = NULL;
    uint32_t first[N_TOKENS], second[N_TOKENS], ids[N_BLOCKS], all[POOL], found[N_BLOCKS];
    uint32_t writing, cached, freeb;
    size_t done = 99, n_cleared = 0, n_kept = 0;
    prompt(first, 41);
    prompt(second, 42);
    ck_assert_int_eq(connect_as(KVS_GROUP_SCHEDULER, 0, &sched), 0);
    for (uint32_t r = 0; r < 4; r++)
        w[r] = rank_client(r);
    /* The first prompt: every rank writes and commits its shard (the last
     * commit caches it), then the namespace is cleared. */
    uint32_t canonical[2 * N_BLOCKS];
    size_t pending = 0;
    ck_assert_int_eq(kvs_alloc(w[0], "default", N_BLOCKS, ids), 0);
    for (uint32_t r = 0; r < 4; r++) {
        write_shard_of(w[r], 41, r, ids);
        done = commit_shard(w[r], first, ids, &pending, canonical);
    }
    ck_assert_uint_eq(done, N_BLOCKS);
    ck_assert_int_eq(kvs_release(w[3], ids, N_BLOCKS, NULL), 0);
    ck_assert_int_eq(kvs_clear(sched, "default", &n_cleared, &n_kept), 0);
    ck_assert_uint_eq(n_cleared, N_BLOCKS);
    /* The second prompt gets the very same blocks again (the whole pool
     * is taken, the rest given back); only rank 0 writes and declares. */
    ck_assert_int_eq(kvs_alloc(sched, "default", POOL, all), 0);
    for (size_t i = 0; i < POOL; i++) {
        bool reused = false;
        for (size_t j = 0; j < N_BLOCKS; j++)
            reused = reused || all[i] == ids[j];
        if (!reused)
            ck_assert_int_eq(kvs_release(sched, &all[i], 1, NULL), 0);
    }
    write_shard_of(w[0], 42, 0, ids);
    declare_shard(w[0], second, ids);
    int rc = commit_for_group(sched, second, ids, &done);
    /* What each rank would be served: only its own shard of this prompt. */
    for (uint32_t r = 0; r < 4; r++) {
        size_t n = lookup(w[r], second, 0, found);
        check_shard_of(w[r], 42, r, found, n);
    }
    ck_assert_msg(rc == KVS_EBADSTATE, "group commit with ranks 1-3 missing: %s", kvs_strerror(rc));
    ck_assert_msg(strstr(kvs_last_error(sched), "1, 2, 3"), "the ranks missing: %s",
                  kvs_last_error(sched));
    ck_assert_uint_eq(lookup(w[1], second, 0, found), 0);
    stats(sched, &writing, &cached, &freeb);
    ck_assert_uint_eq(writing, N_BLOCKS); /* still the scheduler's */
    ck_assert_uint_eq(cached, 0);
    /* A rank's declaration for the first prompt is refused. */
    write_shard_of(w[1], 42, 1, ids);
    ck_assert_int_eq(kvs_commit(w[1], "default", first, N_TOKENS, ids, N_BLOCKS, canonical, &done),
                     KVS_EINVAL);
    /* Once ranks 1-3 wrote and declared theirs, the group's commit caches
     * the prompt and every rank reads its own shard of it. */
    for (uint32_t r = 1; r < 4; r++) {
        write_shard_of(w[r], 42, r, ids);
        declare_shard(w[r], second, ids);
    }
    ck_assert_int_eq(commit_for_group(sched, second, ids, &done), 0);
    ck_assert_uint_eq(done, N_BLOCKS);
    ck_assert_int_eq(kvs_release(sched, ids, N_BLOCKS, NULL), 0);
    for (uint32_t r = 0; r < 4; r++) {
        ck_assert_uint_eq(lookup(w[r], second, 0, found), N_BLOCKS);
        check_shard_of(w[r], 42, r, found, N_BLOCKS);
    }
    for (uint32_t r = 0; r < 4; r++)
        kvs_close(w[r]);
    kvs_close(sched);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* Takes the very blocks ids again (every free block allocated, the others
 * given back): what a busy pool does sooner or later. */
static void alloc_same_blocks(kvs_client_t *sched, const uint32_t *ids)
{
    uint32_t writing, cached, freeb, all[POOL];
    stats(sched, &writing, &cached, &freeb);
    ck_assert_int_eq(kvs_alloc(sched, "default", freeb, all), 0);
    size_t got = 0;
    for (size_t i = 0; i < freeb; i++) {
        bool wanted = false;
        for (size_t j = 0; j < N_BLOCKS; j++)
            wanted = wanted || all[i] == ids[j];
        if (wanted)
            got++;
        else
            ck_assert_int_eq(kvs_release(sched, &all[i], 1, NULL), 0);
    }
    ck_assert_uint_eq(got, N_BLOCKS);
}

/* A second session says rank 1 while the real rank 1 works, and hangs up.
 * Before, its end freed every unfinished block of the group (a probe every
 * 20 ms failed 82 of 4,400 group writes); now it frees only what it held,
 * and the group's commit goes through. Then the scheduler gives back a
 * prompt rank 2 has not declared its shard of yet, and the blocks are
 * allocated again for another prompt: rank 2's late commit of the first
 * is refused, and the new prompt is cached by every rank and the group.
 * Before, the late commit was taken and blocked every other rank's commit
 * of the new prompt (KVS_EINVAL). */
START_TEST(test_rank_impostor_and_late_shard_commit)
{
    start_devices(4);
    kvs_client_t *w[MAX_RANKS], *sched = NULL, *impostor = NULL;
    uint32_t first[N_TOKENS], second[N_TOKENS], third[N_TOKENS], ids[N_BLOCKS], found[N_BLOCKS];
    uint32_t canonical[2 * N_BLOCKS], writing, cached, freeb;
    size_t done = 99;
    prompt(first, 51);
    prompt(second, 52);
    prompt(third, 53);
    ck_assert_int_eq(connect_as(KVS_GROUP_SCHEDULER, 0, &sched), 0);
    for (uint32_t r = 0; r < 4; r++)
        w[r] = rank_client(r);
    ck_assert_int_eq(kvs_alloc(sched, "default", N_BLOCKS, ids), 0);
    for (uint32_t r = 0; r < 4; r++)
        write_shard_of(w[r], 51, r, ids);
    ck_assert_int_eq(connect_as(KVS_RANK, 1, &impostor), 0);
    kvs_close(impostor);
    struct timespec ms100 = {0, 100 * 1000 * 1000};
    nanosleep(&ms100, NULL);
    stats(sched, &writing, &cached, &freeb);
    ck_assert_uint_eq(writing, N_BLOCKS);
    for (uint32_t r = 0; r < 4; r++)
        declare_shard(w[r], first, ids);
    ck_assert_int_eq(commit_for_group(sched, first, ids, &done), 0);
    ck_assert_uint_eq(done, N_BLOCKS);
    ck_assert_int_eq(kvs_release(sched, ids, N_BLOCKS, NULL), 0);
    for (uint32_t r = 0; r < 4; r++) {
        ck_assert_uint_eq(lookup(w[r], first, 0, found), N_BLOCKS);
        check_shard_of(w[r], 51, r, found, N_BLOCKS);
    }

    /* Ranks 0, 1 and 3 declared the second prompt, rank 2 is late; the
     * scheduler gives its blocks back (an aborted request). */
    ck_assert_int_eq(kvs_alloc(sched, "default", N_BLOCKS, ids), 0);
    for (uint32_t r = 0; r < 4; r++)
        if (r != 2) {
            write_shard_of(w[r], 52, r, ids);
            declare_shard(w[r], second, ids);
        }
    ck_assert_int_eq(kvs_release(sched, ids, N_BLOCKS, NULL), 0);
    alloc_same_blocks(sched, ids);
    /* Rank 2's late commit of the second prompt, into the blocks the third
     * now has: refused, nothing changes. */
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.shard_written = 1;
    int rc = kvs_commit_ex(w[2], "default", second, N_TOKENS, ids, N_BLOCKS, &o, canonical, &done);
    ck_assert_msg(rc == KVS_EBADSTATE, "late commit: %s", kvs_strerror(rc));
    ck_assert_msg(strstr(kvs_last_error(w[2]), "late commit"), "%s", kvs_last_error(w[2]));
    for (uint32_t r = 0; r < 4; r++) {
        write_shard_of(w[r], 53, r, ids);
        declare_shard(w[r], third, ids);
    }
    ck_assert_int_eq(commit_for_group(sched, third, ids, &done), 0);
    ck_assert_uint_eq(done, N_BLOCKS);
    ck_assert_int_eq(kvs_release(sched, ids, N_BLOCKS, NULL), 0);
    for (uint32_t r = 0; r < 4; r++) {
        ck_assert_uint_eq(lookup(w[r], third, 0, found), N_BLOCKS);
        check_shard_of(w[r], 53, r, found, N_BLOCKS);
    }
    for (uint32_t r = 0; r < 4; r++)
        kvs_close(w[r]);
    kvs_close(sched);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* One device: a client that says rank 0 works as before, rank 1 is
 * refused, and the group is one. */
START_TEST(test_one_device_rank_zero)
{
    ck_assert_int_eq(start(NULL, NULL), 0);
    kvs_client_t *c = NULL;
    ck_assert_int_eq(connect_as(KVS_RANK, 1, &c), KVS_EINVAL);
    c = rank_client(0);
    uint32_t rank = 9, size = 0, tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS];
    kvs_stats_t s;
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    ck_assert_uint_eq(s.n_devices, 1); /* one row, its worker the rank-0 client */
    ck_assert_uint_eq(s.devices[0].workers, 1);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_group(c, &rank, &size), 0);
    ck_assert_uint_eq(rank, 0);
    ck_assert_uint_eq(size, 1);
    prompt(tokens, 15);
    ck_assert_int_eq(kvs_alloc(c, "default", N_BLOCKS, ids), 0);
    size_t pending = 9;
    ck_assert_uint_eq(commit_shard(c, tokens, ids, &pending, canonical), N_BLOCKS);
    ck_assert_uint_eq(pending, 0);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

/* The index of n devices after a group cached one prefix: its memory. */
static uint64_t index_bytes_with(unsigned n)
{
    if (n > 1)
        start_devices(n);
    else
        ck_assert_int_eq(start(NULL, NULL), 0);
    kvs_client_t *w[MAX_RANKS];
    uint32_t tokens[N_TOKENS], ids[N_BLOCKS], canonical[2 * N_BLOCKS];
    prompt(tokens, 17);
    for (uint32_t r = 0; r < n; r++)
        w[r] = rank_client(r);
    ck_assert_int_eq(kvs_alloc(w[0], "default", N_BLOCKS, ids), 0);
    size_t pending = 0, done = 0;
    for (uint32_t r = 0; r < n; r++)
        done = commit_shard(w[r], tokens, ids, &pending, canonical);
    ck_assert_uint_eq(done, N_BLOCKS);
    kvs_stats_t s;
    ck_assert_int_eq(kvs_stats(w[0], &s), 0);
    ck_assert_uint_eq(s.cached_blocks, N_BLOCKS);
    uint64_t bytes = s.index_bytes;
    kvs_stats_free(&s);
    for (uint32_t r = 0; r < n; r++)
        kvs_close(w[r]);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    return bytes;
}

/* One index for the group: its memory with 4 devices is that with one. */
START_TEST(test_index_memory_does_not_grow)
{
    uint64_t one = index_bytes_with(1), four = index_bytes_with(4);
    ck_assert_uint_gt(one, 0);
    ck_assert_uint_eq(four, one);
}
END_TEST

static Suite *devices_suite(void)
{
    Suite *s = suite_create("devices");
    TCase *tc = tcase_create("host");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_two_devices);
    tcase_add_test(tc, test_four_devices);
    tcase_add_test(tc, test_rank_dies_mid_write);
    tcase_add_test(tc, test_rank_dies_before_group_commit);
    tcase_add_test(tc, test_rank_impostor_and_late_shard_commit);
    tcase_add_test(tc, test_missing_shard_never_served);
    tcase_add_test(tc, test_ranks_join_declared_blocks);
    tcase_add_test(tc, test_tier2_holds_every_shard);
    tcase_add_test(tc, test_one_shard_tiers_refused);
    tcase_add_test(tc, test_scheduler_and_refusals);
    tcase_add_test(tc, test_group_commit_reused_blocks_only_rank0_wrote);
    tcase_add_test(tc, test_one_device_rank_zero);
    tcase_add_test(tc, test_index_memory_does_not_grow);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(devices_suite)
