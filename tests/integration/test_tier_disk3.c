/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tier 3 (the disk, --disk-tier-path below --host-tier) through a real
 * kvshared: blocks go pool -> host -> disk as the pool fills and come back
 * to the pool, bitwise equal, on a pinned lookup; a kvshared killed with
 * SIGKILL while it writes the disk serves, once restarted on the same file,
 * every block it finds there with its writer's bytes and misses the rest;
 * and a slot whose bytes were flipped while kvshared was stopped is never
 * served.
 *
 * Test geometry: blocks of 512 B and 4 tokens, so each disk slot is one
 * 4 KiB page. The disk file lives in its own temporary directory (the
 * harness's holds the socket).
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"
#include "launch.h"
#include "test_tmp.h"

#define MAX_BLOCKS 64
#define POOL       16
#define NB         4 /* blocks per prompt */
#define SLOT       4096u

static harness_t h;
static char disk_dir[256], disk_path[300];

/* kvshared's flags for a pool of POOL blocks, a host tier of as many and a
 * disk tier of 1 MiB, on the backend KVS_TEST_TIER_BACKEND names (cuda on
 * the stand-in driver: the disk's reads go into device memory through the
 * backend) or the harness's (host). */
static const char *const *tier_flags(void)
{
    static const char *flags[11] = {"--host-tier",       "8KiB", "--disk-tier-path", NULL,
                                    "--disk-tier-bytes", "1MiB", "--disk-tier-io",   "threads"};
    const char *backend = getenv("KVS_TEST_TIER_BACKEND");
    flags[3] = disk_path;
    flags[8] = backend ? "--backend" : NULL;
    flags[9] = backend;
    return flags;
}

static void setup(void)
{
    ck_assert_int_eq(test_tmp_dir("kvs-disk3", disk_dir, sizeof(disk_dir)), 0);
    snprintf(disk_path, sizeof(disk_path), "%s/tier3", disk_dir);
    ck_assert_int_eq(harness_start(&h, POOL, tier_flags()), 0);
}

static void teardown(void)
{
    harness_cleanup(&h);
    unlink(disk_path);
    rmdir(disk_dir);
}

static void prompt(uint32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = seed * 100000 + (uint32_t)i;
}

static uint8_t pattern(uint32_t seed, uint32_t layer, uint32_t kv, size_t j, size_t i)
{
    return (uint8_t)(seed * 17 + layer * 31 + kv * 7 + j * 13 + i);
}

/* Writes NB blocks of prompt `seed`, commits and releases them. Returns 0,
 * or -1 when the daemon went away (the killing test's writer). */
static int write_prompt(kvs_client_t *c, uint32_t seed)
{
    kvs_geometry_t g;
    uint32_t tokens[MAX_BLOCKS * 4], ids[NB], can[NB];
    size_t done;
    if (kvs_geometry(c, &g) != 0)
        return -1;
    prompt(tokens, NB * g.block_tokens, seed);
    if (kvs_alloc(c, NULL, NB, ids) != 0)
        return -1;
    uint8_t slot[512];
    ck_assert_uint_le(g.slot_bytes, sizeof(slot));
    for (size_t j = 0; j < NB; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                for (size_t i = 0; i < g.slot_bytes; i++)
                    slot[i] = pattern(seed, l, kv, j, i);
                if (kvs_block_write(c, l, kv, ids[j], slot, g.slot_bytes) != 0)
                    return -1;
            }
    if (kvs_commit(c, NULL, tokens, NB * g.block_tokens, ids, NB, can, &done) != 0 || done != NB)
        return -1;
    return kvs_release(c, can, NB, NULL) == 0 ? 0 : -1;
}

/* A pinned lookup of prompt `seed`: returns the blocks matched, each
 * checked to hold its writer's bytes (a wrong byte fails the test). */
static size_t lookup_checked(kvs_client_t *c, uint32_t seed)
{
    kvs_geometry_t g;
    uint32_t tokens[MAX_BLOCKS * 4], got[MAX_BLOCKS];
    size_t n = 0;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    prompt(tokens, NB * g.block_tokens, seed);
    int rc = kvs_lookup(c, NULL, tokens, NB * g.block_tokens, 1, got, MAX_BLOCKS, &n);
    ck_assert_msg(rc == 0, "lookup: %s", kvs_last_error(c));
    uint8_t want[512], slot[512];
    for (size_t j = 0; j < n; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                ck_assert_int_eq(kvs_block_read(c, l, kv, got[j], slot, g.slot_bytes), 0);
                for (size_t i = 0; i < g.slot_bytes; i++)
                    want[i] = pattern(seed, l, kv, j, i);
                ck_assert_msg(memcmp(slot, want, g.slot_bytes) == 0,
                              "prompt %u block %zu layer %u kv %u: wrong bytes served", seed, j, l,
                              kv);
            }
    if (n > 0)
        ck_assert_int_eq(kvs_release(c, got, n, NULL), 0);
    return n;
}

/* Waits until no block is being copied between the tiers; no copy may
 * have failed (a failed batch is undone and blocks are evicted instead,
 * which the figures below could miss). */
static void settle(kvs_client_t *c, kvs_stats_t *s)
{
    for (int k = 0; k < 500; k++) {
        ck_assert_int_eq(kvs_stats(c, s), 0);
        ck_assert_uint_eq(s->tier_copy_failures, 0);
        if (s->copying_blocks == 0)
            return;
        kvs_stats_free(s);
        usleep(10000);
    }
    ck_abort_msg("copies between the tiers did not end");
}

/* Restarts kvshared on the same socket and disk file. */
static void restart(void)
{
    pid_t pid = 0;
    ck_assert_int_eq(harness_restart(&h, POOL, tier_flags(), 30000, &pid), -1);
    h.pid = pid;
    harness_wait_restored(&h);
}

/* Prompts 1..20 (80 blocks): the pool and host tier hold the last 8
 * prompts, the disk the first 12. Every one comes back equal, from
 * wherever it is, and the disk was read. */
START_TEST(three_tiers_round_trip)
{
    kvs_client_t *c = harness_client(&h, "disk3", 0);
    for (uint32_t p = 1; p <= 20; p++)
        ck_assert_int_eq(write_prompt(c, p), 0);
    kvs_stats_t s;
    settle(c, &s);
    /* host memory keeps free room for the next demotion (store_spill) */
    ck_assert_uint_le(s.tier2_cached_blocks, 16);
    ck_assert_uint_ge(s.tier2_cached_blocks, 16 - NB);
    /* 1 MiB: a superblock page and 255 slots of 4 KiB */
    ck_assert_uint_eq(s.tier3_total_blocks, 255);
    ck_assert_uint_ge(s.tier3_cached_blocks, 12 * NB);
    ck_assert_uint_eq(s.cached_blocks + s.tier2_cached_blocks + s.tier3_cached_blocks, 20 * NB);
    ck_assert_ptr_nonnull(s.disk_io);
    ck_assert_str_eq(s.disk_io, "threads");
    ck_assert_uint_eq(s.disk_reads, 0);
    ck_assert_uint_eq(s.evictions, 0); /* 80 blocks fit in 16 + 16 + 255 */
    kvs_stats_free(&s);
    for (uint32_t p = 1; p <= 20; p++)
        ck_assert_uint_eq(lookup_checked(c, p), NB);
    /* Twice: what came up went down again and comes up again. */
    for (uint32_t p = 1; p <= 20; p++)
        ck_assert_uint_eq(lookup_checked(c, p), NB);
    settle(c, &s);
    ck_assert_uint_ge(s.disk_reads, 12 * NB);
    ck_assert_uint_eq(s.disk_crc_failures, 0);
    ck_assert_uint_eq(s.tier3_cached_blocks + s.tier2_cached_blocks + s.cached_blocks, 20 * NB);
    ck_assert_uint_eq(s.evictions, 0);
    ck_assert_uint_eq(s.pinned_blocks, 0);
    kvs_stats_free(&s);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* A writer keeps committing prompts while the daemon is SIGKILLed at a
 * random moment, so some disk writes are cut. Restarted on the same file:
 * prompts 1..12, on the disk before the writer started, hit whole; any
 * other prompt hits a prefix or misses; no lookup ever returns a byte its
 * writer did not write. */
START_TEST(warm_restart_after_sigkill)
{
    kvs_client_t *c = harness_client(&h, "disk3", 0);
    for (uint32_t p = 1; p <= 20; p++)
        ck_assert_int_eq(write_prompt(c, p), 0);
    kvs_stats_t s;
    settle(c, &s);
    kvs_stats_free(&s);
    kvs_close(c);

    pid_t writer = fork();
    ck_assert_int_ge(writer, 0);
    if (writer == 0) {
        kvs_client_t *w = harness_client(&h, "disk3", 0);
        for (uint32_t p = 21; p <= 60; p++)
            if (write_prompt(w, p) != 0)
                _exit(0);
        _exit(0);
    }
    srand((unsigned)time(NULL));
    usleep(2000 + (useconds_t)(rand() % 30000));
    ck_assert_int_eq(kill(h.pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(h.pid, NULL, 0), h.pid);
    h.pid = 0;
    ck_assert_int_eq(waitpid(writer, NULL, 0), writer);

    restart();
    c = harness_client(&h, "disk3", 0);
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    /* The pool and the host tier start empty: what is cached is what the
     * file gave back. */
    ck_assert_uint_ge(s.tier3_cached_blocks, 12 * NB);
    ck_assert_uint_eq(s.cached_blocks + s.tier2_cached_blocks, 0);
    kvs_stats_free(&s);
    for (uint32_t p = 1; p <= 12; p++)
        ck_assert_uint_eq(lookup_checked(c, p), NB);
    for (uint32_t p = 13; p <= 60; p++)
        ck_assert_uint_le(lookup_checked(c, p), NB);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* The prompt and block a slot's record names, from its header (formats 2
 * and 3: tokens from byte 120); false for a slot holding no record. */
static bool slot_block(const uint8_t *slot, uint32_t *seed, uint32_t *block)
{
    uint32_t magic, tok;
    memcpy(&magic, slot, 4);
    if (magic != 0x5253564Bu)
        return false;
    memcpy(&tok, slot + 120, 4); /* the block's first token; little-endian host */
    *seed = tok / 100000;
    *block = (tok % 100000) / 4;
    return true;
}

/* With kvshared stopped, one byte of some slots of its file is flipped
 * (header, tokens or payload). Restarted, a prompt whose block was flipped
 * hits at most the blocks before it; nothing flipped is served. */
START_TEST(flipped_slots_never_served)
{
    kvs_client_t *c = harness_client(&h, "disk3", 0);
    for (uint32_t p = 1; p <= 20; p++)
        ck_assert_int_eq(write_prompt(c, p), 0);
    kvs_stats_t s;
    settle(c, &s);
    kvs_stats_free(&s);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);

    uint32_t first_bad[21]; /* per prompt: its first flipped block, NB if none */
    for (int p = 0; p <= 20; p++)
        first_bad[p] = NB;
    int fd = open(disk_path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    srand((unsigned)time(NULL));
    size_t flipped = 0;
    for (uint32_t slot = 0; slot < 64; slot++) {
        uint8_t buf[SLOT];
        off_t off = (off_t)SLOT + (off_t)slot * SLOT;
        ck_assert_int_eq(pread(fd, buf, SLOT, off), (ssize_t)SLOT);
        uint32_t seed, block;
        if (!slot_block(buf, &seed, &block) || seed < 1 || seed > 20 || rand() % 3 != 0)
            continue;
        size_t at = (size_t)rand() % (120 + 16 + 512); /* header, tokens or payload */
        buf[at] ^= (uint8_t)(1u << (rand() % 8));
        ck_assert_int_eq(pwrite(fd, buf, SLOT, off), (ssize_t)SLOT);
        if (block < first_bad[seed])
            first_bad[seed] = block;
        flipped++;
    }
    close(fd);
    ck_assert_uint_gt(flipped, 0);

    restart();
    c = harness_client(&h, "disk3", 0);
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    ck_assert_uint_ge(s.disk_crc_failures, flipped);
    kvs_stats_free(&s);
    for (uint32_t p = 1; p <= 20; p++) {
        size_t n = lookup_checked(c, p);
        ck_assert_msg(n <= first_bad[p], "prompt %u: %zu blocks hit, block %u was flipped", p, n,
                      first_bad[p]);
    }
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* Waits until no block is being copied between the tiers (a failure
 * allowed); returns the stats then. */
static void quiet(kvs_client_t *c, kvs_stats_t *s)
{
    for (int k = 0; k < 500; k++) {
        ck_assert_int_eq(kvs_stats(c, s), 0);
        if (s->copying_blocks == 0)
            return;
        kvs_stats_free(s);
        usleep(10000);
    }
    ck_abort_msg("copies between the tiers did not end");
}

/* A slot flipped under a running kvshared: the lookup that reads it misses
 * (its promotion is undone), the CRC failure is counted once, and the block
 * and the two after it leave the index: a later lookup of the prompt, once
 * the tiers move again, hits at most the block before it and does not read
 * the bad slot again. */
START_TEST(flipped_while_running_dropped)
{
    kvs_client_t *c = harness_client(&h, "disk3", 0);
    for (uint32_t p = 1; p <= 20; p++)
        ck_assert_int_eq(write_prompt(c, p), 0);
    kvs_stats_t s;
    settle(c, &s);
    uint64_t crc0 = s.disk_crc_failures, ev0 = s.evictions;
    uint32_t cached0 = s.cached_blocks + s.tier2_cached_blocks + s.tier3_cached_blocks;
    kvs_stats_free(&s);
    ck_assert_uint_eq(cached0, 20 * NB);

    /* Block 1 of a prompt on the disk: one byte of its payload flipped. */
    int fd = open(disk_path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint32_t victim = 0;
    for (uint32_t slot = 0; slot < 255 && victim == 0; slot++) {
        uint8_t buf[SLOT];
        off_t off = (off_t)SLOT + (off_t)slot * SLOT;
        ck_assert_int_eq(pread(fd, buf, SLOT, off), (ssize_t)SLOT);
        uint32_t seed, block;
        if (!slot_block(buf, &seed, &block) || seed < 1 || seed > 12 || block != 1)
            continue;
        buf[120 + 16 + 77] ^= 0x10;
        ck_assert_int_eq(pwrite(fd, buf, SLOT, off), (ssize_t)SLOT);
        victim = seed;
    }
    ck_assert_int_eq(fsync(fd), 0);
    close(fd);
    ck_assert_uint_gt(victim, 0);

    ck_assert_uint_le(lookup_checked(c, victim), 1);
    quiet(c, &s);
    ck_assert_uint_eq(s.disk_crc_failures, crc0 + 1);
    ck_assert_uint_eq(s.evictions, ev0 + NB - 1); /* blocks 1 .. 3 */
    ck_assert_uint_eq(s.cached_blocks + s.tier2_cached_blocks + s.tier3_cached_blocks,
                      cached0 - (NB - 1));
    kvs_stats_free(&s);
    /* After the pause that follows a failed copy (STORE_MEDIUM_RETRY_MS). */
    usleep(1200 * 1000);
    ck_assert_uint_le(lookup_checked(c, victim), 1);
    quiet(c, &s);
    ck_assert_uint_eq(s.disk_crc_failures, crc0 + 1);
    ck_assert_uint_eq(s.evictions, ev0 + NB - 1);
    kvs_stats_free(&s);
    /* The other prompts are whole. */
    for (uint32_t p = 1; p <= 20; p++)
        if (p != victim)
            ck_assert_uint_eq(lookup_checked(c, p), NB);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* One slot that does not verify costs only its own block: right after the
 * lookup that read it, every other prompt on the disk is promoted and hits
 * whole (before: no block moved between the tiers for 1 s after it,
 * STORE_MEDIUM_RETRY_MS, so these lookups hit nothing). */
START_TEST(bad_slot_costs_only_its_block)
{
    kvs_client_t *c = harness_client(&h, "disk3", 0);
    for (uint32_t p = 1; p <= 20; p++)
        ck_assert_int_eq(write_prompt(c, p), 0);
    kvs_stats_t s;
    settle(c, &s);
    kvs_stats_free(&s);
    int fd = open(disk_path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint32_t victim = 0;
    for (uint32_t slot = 0; slot < 255 && victim == 0; slot++) {
        uint8_t buf[SLOT];
        off_t off = (off_t)SLOT + (off_t)slot * SLOT;
        ck_assert_int_eq(pread(fd, buf, SLOT, off), (ssize_t)SLOT);
        uint32_t seed, block;
        if (!slot_block(buf, &seed, &block) || seed < 1 || seed > 12 || block != 1)
            continue;
        buf[120 + 16 + 77] ^= 0x10;
        ck_assert_int_eq(pwrite(fd, buf, SLOT, off), (ssize_t)SLOT);
        victim = seed;
    }
    ck_assert_int_eq(fsync(fd), 0);
    close(fd);
    ck_assert_uint_gt(victim, 0);
    ck_assert_uint_le(lookup_checked(c, victim), 1);
    quiet(c, &s);
    uint64_t failures = s.tier_copy_failures;
    kvs_stats_free(&s);
    /* At once, no pause: the victim's first block, and the other prompts
     * that were on the disk, whole. */
    ck_assert_uint_eq(lookup_checked(c, victim), 1);
    for (uint32_t p = 1; p <= 12; p++)
        if (p != victim)
            ck_assert_msg(lookup_checked(c, p) == NB, "prompt %u did not hit whole", p);
    quiet(c, &s);
    ck_assert_uint_eq(s.tier_copy_failures, failures); /* nothing else failed */
    ck_assert_uint_eq(s.disk_crc_failures, 1);
    kvs_stats_free(&s);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

static Suite *disk3_suite(void)
{
    Suite *s = suite_create("tier_disk3");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, three_tiers_round_trip);
    tcase_add_test(tc, warm_restart_after_sigkill);
    tcase_add_test(tc, flipped_slots_never_served);
    tcase_add_test(tc, flipped_while_running_dropped);
    tcase_add_test(tc, bad_slot_costs_only_its_block);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(disk3_suite)
