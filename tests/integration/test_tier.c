/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tier 2 through a real kvshared (--host-tier): a full pool demotes instead
 * of dropping, a pinned lookup of a demoted prefix gets it back with the
 * bytes its writer wrote, and workers killed while their lookups promote
 * leave no pin, no WRITING block and no lost block behind.
 *
 * The daemon runs on the host backend, or on the cuda backend where
 * KVS_TEST_TIER_BACKEND=cuda (ctest on the stand-in driver, and
 * tests/device/run.sh on a GPU: the copies are then DMA between device
 * memory and pinned tier-2 memory on the backend's stream). Blocks are
 * written and read through libkvshare (kvs_block_write, kvs_block_read), so
 * the same checks hold on either.
 */
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"
#include "launch.h"

#define MAX_BLOCKS 64

static harness_t h;
static const char *tier_backend; /* NULL: kvshared's default (host here) */

/* Starts the daemon with extra flags (NULL-ended; may be NULL), on the
 * backend this run tests, and with geometry flags when geo is not NULL. */
static int start(unsigned blocks, const char *const *geo, const char *const *extra)
{
    const char *args[16];
    size_t n = 0;
    if (tier_backend) {
        args[n++] = "--backend";
        args[n++] = tier_backend;
    }
    for (size_t k = 0; extra && extra[k]; k++) {
        ck_assert_uint_lt(n, 15);
        args[n++] = extra[k];
    }
    args[n] = NULL;
    return geo ? harness_start_geometry(&h, blocks, geo, args) : harness_start(&h, blocks, args);
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

/* Writes nb blocks of prompt `seed`, commits them and lets go of them. */
static void write_prompt(kvs_client_t *c, uint32_t seed, size_t nb)
{
    kvs_geometry_t g;
    uint32_t tokens[MAX_BLOCKS * 16], ids[MAX_BLOCKS], can[MAX_BLOCKS];
    size_t done;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    ck_assert_uint_le(nb * g.block_tokens, sizeof(tokens) / sizeof(tokens[0]));
    prompt(tokens, nb * g.block_tokens, seed);
    int rc = kvs_alloc(c, NULL, (uint32_t)nb, ids);
    ck_assert_msg(rc == 0, "alloc: %s", kvs_last_error(c));
    uint8_t *slot = malloc(g.slot_bytes);
    ck_assert_ptr_nonnull(slot);
    for (size_t j = 0; j < nb; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                for (size_t i = 0; i < g.slot_bytes; i++)
                    slot[i] = pattern(seed, l, kv, j, i);
                rc = kvs_block_write(c, l, kv, ids[j], slot, g.slot_bytes);
                ck_assert_msg(rc == 0, "block write: %s", kvs_last_error(c));
            }
    free(slot);
    ck_assert_int_eq(kvs_commit(c, NULL, tokens, nb * g.block_tokens, ids, nb, can, &done), 0);
    ck_assert_uint_eq(done, nb);
    ck_assert_int_eq(kvs_release(c, can, nb, NULL), 0);
}

/* A pinned lookup of prompt `seed`: all nb blocks, holding its writer's
 * bytes; the pins are released. */
static void check_prompt(kvs_client_t *c, uint32_t seed, size_t nb)
{
    kvs_geometry_t g;
    uint32_t tokens[MAX_BLOCKS * 16], got[MAX_BLOCKS];
    size_t n = 0;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    prompt(tokens, nb * g.block_tokens, seed);
    int rc = kvs_lookup(c, NULL, tokens, nb * g.block_tokens, 1, got, MAX_BLOCKS, &n);
    ck_assert_msg(rc == 0, "lookup: %s", kvs_last_error(c));
    ck_assert_uint_eq(n, nb);
    uint8_t *want = malloc(g.slot_bytes), *slot = malloc(g.slot_bytes);
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(slot);
    for (size_t j = 0; j < n; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                rc = kvs_block_read(c, l, kv, got[j], slot, g.slot_bytes);
                ck_assert_msg(rc == 0, "block read: %s", kvs_last_error(c));
                for (size_t i = 0; i < g.slot_bytes; i++)
                    want[i] = pattern(seed, l, kv, j, i);
                ck_assert_msg(memcmp(slot, want, g.slot_bytes) == 0,
                              "prompt %u block %zu layer %u kv %u differs", seed, j, l, kv);
            }
    free(want);
    free(slot);
    ck_assert_int_eq(kvs_release(c, got, n, NULL), 0);
}

/* free + writing + cached == pool, nothing pinned, written or being copied,
 * and every tier-2 slot either holds a block that was demoted and has not
 * left since, or is free. */
static void check_idle(kvs_client_t *c, kvs_stats_t *s)
{
    ck_assert_int_eq(kvs_stats(c, s), 0);
    ck_assert_uint_eq(s->free_blocks + s->writing_blocks + s->cached_blocks, s->total_blocks);
    ck_assert_uint_eq(s->writing_blocks, 0);
    ck_assert_uint_eq(s->pinned_blocks, 0);
    ck_assert_uint_eq(s->copying_blocks, 0);
    ck_assert_uint_le(s->tier2_cached_blocks, s->tier2_total_blocks);
    ck_assert_uint_eq(s->tier2_cached_blocks,
                      s->tier_demotions - s->tier_promotions - s->tier2_drops);
    uint32_t t2 = 0;
    for (size_t i = 0; i < s->n_namespaces; i++)
        t2 += s->namespaces[i].tier2_blocks;
    ck_assert_uint_eq(t2, s->tier2_cached_blocks);
    /* What the pool copies with: memcpy on host; on cuda the kernel or the
     * engine per direction, or why the kernel is not used. */
    ck_assert_ptr_nonnull(s->copy_path);
    if (s->backend == KVS_BACKEND_CUDA)
        ck_assert_msg(strstr(s->copy_path, "pool->host") != NULL ||
                          strstr(s->copy_path, "kernel not used") != NULL ||
                          strstr(s->copy_path, "forced") != NULL,
                      "%s", s->copy_path);
    else
        ck_assert_str_eq(s->copy_path, "memcpy");
}

/* Starts the daemon on a pool of 16 blocks (of 512 B: the default geometry)
 * and a tier 2 of tier_size bytes. */
static void start_tier(const char *tier_size)
{
    const char *const extra[] = {"--host-tier", tier_size, NULL};
    ck_assert_int_eq(start(16, NULL, extra), 0);
}

/* Writes prompts first..last, nb blocks each, in that order. */
static void write_prompts(kvs_client_t *c, uint32_t first, uint32_t last, size_t nb)
{
    for (uint32_t p = first; p <= last; p++)
        write_prompt(c, p, nb);
}

/* A pinned lookup of prompt `seed` (nb blocks) finds none of it. */
static void check_miss(kvs_client_t *c, uint32_t seed, size_t nb)
{
    kvs_geometry_t g;
    uint32_t tokens[MAX_BLOCKS * 16], got[MAX_BLOCKS];
    size_t n = 99;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    ck_assert_uint_le(nb * g.block_tokens, sizeof(tokens) / sizeof(tokens[0]));
    prompt(tokens, nb * g.block_tokens, seed);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, nb * g.block_tokens, 1, got, nb, &n), 0);
    ck_assert_uint_eq(n, 0);
}

/* Closes c, the test's last client, and stops the daemon, which must exit 0. */
static void stop(kvs_client_t *c)
{
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}

/* Forks a worker that connects with `flags` and runs body(w, ready_fd,
 * seed), which writes one byte to ready_fd (with ready()) once the parent
 * may go on; the worker then waits to be killed. Returns its pid once that
 * byte came. */
static pid_t fork_worker(unsigned flags, void (*body)(kvs_client_t *w, int ready_fd, uint32_t seed),
                         uint32_t seed)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        kvs_options_t o;
        kvs_client_t *w;
        close(p[0]);
        kvs_options_init(&o);
        o.socket_path = h.socket_path;
        o.flags = flags;
        if (kvs_connect(&o, &w) != 0)
            _exit(1);
        body(w, p[1], seed);
        pause();
        _exit(0);
    }
    close(p[1]);
    char x;
    ck_assert_int_eq(read(p[0], &x, 1), 1);
    close(p[0]);
    return pid;
}

/* In a worker: tells the parent to go on. */
static void ready(int ready_fd)
{
    if (write(ready_fd, "x", 1) != 1)
        _exit(2);
}

/* Kills worker pid and waits until the daemon has ended its session (it
 * sees the EOF on a later loop turn): then only c's session is left, and
 * check_idle holds, with the stats in s (the caller frees them). */
static void kill_worker(kvs_client_t *c, pid_t pid, kvs_stats_t *s)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    /* A deadline of 2 minutes (the daemon may run under valgrind), not a
     * bound: it ends as soon as the session is gone. */
    for (int i = 0; i < 12000; i++) {
        ck_assert_int_eq(kvs_stats(c, s), 0);
        int gone = s->sessions == 1 && s->pinned_blocks == 0 && s->writing_blocks == 0 &&
                   s->copying_blocks == 0;
        kvs_stats_free(s);
        if (gone)
            break;
        usleep(10000);
    }
    check_idle(c, s);
    ck_assert_uint_eq(s->sessions, 1);
}

START_TEST(test_demote_then_promote)
{
    start_tier("16KiB"); /* 32 blocks in tier 2 */
    kvs_client_t *c = harness_client(&h, "tier", 0);
    kvs_stats_t s;
    write_prompts(c, 1, 3, 8); /* the pool is full: prompt 1 goes to tier 2 */
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier_demotions, 8);
    ck_assert_uint_eq(s.tier_promotions, 0);
    ck_assert_uint_eq(s.evictions, 0);
    ck_assert_uint_eq(s.cached_blocks, 16);
    ck_assert_uint_eq(s.tier2_total_blocks, 32);
    ck_assert_uint_eq(s.tier2_cached_blocks, 8);
    ck_assert_uint_eq(s.tier_copied_bytes, 8 * 512);
    kvs_stats_free(&s);
    /* The tree says where each prompt is: all three are 8-block prefixes. */
    kvs_prefix_t rows[8];
    size_t n_rows = 0;
    ck_assert_int_eq(kvs_tree(c, NULL, 1, rows, 8, &n_rows), 0);
    ck_assert_uint_eq(n_rows, 3);
    uint32_t in_t2 = 0, rows_t2 = 0;
    for (size_t i = 0; i < n_rows; i++) {
        ck_assert_uint_eq(rows[i].blocks, 8);
        ck_assert_uint_eq(rows[i].tier, rows[i].tier2_blocks ? 2 : 1);
        in_t2 += rows[i].tier2_blocks;
        rows_t2 += rows[i].tier == 2;
    }
    ck_assert_uint_eq(in_t2, 8);
    ck_assert_uint_eq(rows_t2, 1);
    /* Prompt 1 comes back (prompt 2, least recent, makes room), and its bytes with it. */
    check_prompt(c, 1, 8);
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier_demotions, 16);
    ck_assert_uint_eq(s.tier_promotions, 8);
    ck_assert_uint_eq(s.tier_copied_bytes, 24 * 512);
    ck_assert_uint_eq(s.evictions, 0);
    /* Hits by tier: the one lookup found its 8 blocks in tier 2, and counts
     * once although it ran again after the copies. */
    ck_assert_uint_eq(s.n_namespaces, 1);
    ck_assert_uint_eq(s.namespaces[0].lookups, 1);
    ck_assert_uint_eq(s.namespaces[0].hit_tokens, 8 * s.block_tokens);
    ck_assert_uint_eq(s.namespaces[0].tier2_hit_tokens, 8 * s.block_tokens);
    kvs_stats_free(&s);
    /* Then prompt 2, for which prompt 3 (now least recent) goes, and prompt 3. */
    check_prompt(c, 2, 8);
    check_prompt(c, 3, 8);
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier_promotions, 24); /* prompt 3 made room for prompt 2 */
    kvs_stats_free(&s);
    stop(c);
}
END_TEST

/* In a worker: a pinned lookup of prompt `seed` (16 blocks), which the
 * parent may kill once it is sent. */
static void lookup_16(kvs_client_t *w, int ready_fd, uint32_t seed)
{
    kvs_geometry_t g;
    uint32_t tokens[16 * 16], got[16];
    size_t n;
    if (kvs_geometry(w, &g) != 0)
        _exit(1);
    prompt(tokens, 16 * g.block_tokens, seed);
    ready(ready_fd);
    kvs_lookup(w, NULL, tokens, 16 * g.block_tokens, 1, got, 16, &n);
}

/* Children look up prompts held in tier 2 and are killed while the daemon
 * promotes them (blocks of 512 KiB, so the copies take a while): afterwards
 * nothing is pinned or lost, and every prompt still reads back whole. */
START_TEST(test_sigkill_during_promotion)
{
    const char *const geo[] = {"--model", "llama-3.2-1b", NULL};
    const char *const extra[] = {"--host-tier", "64MiB", NULL}; /* 128 blocks */
    ck_assert_int_eq(start(32, geo, extra), 0);
    kvs_client_t *c = harness_client(&h, "observer", 0);
    kvs_geometry_t g;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    write_prompts(c, 1, 4, 16); /* prompts 1 and 2 end in tier 2 */
    kvs_stats_t s;
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier_demotions, 32);
    kvs_stats_free(&s);
    for (int round = 0; round < 8; round++) {
        pid_t pid = fork_worker(0, lookup_16, 1 + (uint32_t)round % 4);
        kill_worker(c, pid, &s);
        kvs_stats_free(&s);
    }
    for (uint32_t p = 1; p <= 4; p++)
        check_prompt(c, p, 16);
    check_idle(c, &s);
    ck_assert_uint_eq(s.evictions, 0); /* tier 2 holds everything: nothing was dropped */
    ck_assert_uint_ge(s.tier_promotions, 32);
    kvs_stats_free(&s);
    stop(c);
}
END_TEST

/* Tier 2 smaller than the pool, and full: a demotion then drops tier 2's
 * least recently used blocks for good (evictions, tier2_drops), and the
 * blocks still there come back whole. */
START_TEST(test_full_tier2)
{
    start_tier("4KiB"); /* 8 blocks in tier 2 */
    kvs_client_t *c = harness_client(&h, "tier", 0);
    kvs_stats_t s;
    write_prompts(c, 1, 3, 8); /* prompt 1 to tier 2, which is then full */
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier2_total_blocks, 8);
    ck_assert_uint_eq(s.tier2_cached_blocks, 8);
    ck_assert_uint_eq(s.tier2_drops, 0);
    kvs_stats_free(&s);
    write_prompt(c, 4, 8); /* prompt 2 to tier 2: prompt 1 leaves for good */
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier_demotions, 16);
    ck_assert_uint_eq(s.tier2_drops, 8);
    ck_assert_uint_eq(s.evictions, 8);
    ck_assert_uint_eq(s.tier2_cached_blocks, 8);
    ck_assert_uint_eq(s.namespaces[0].evicted_blocks, 8);
    kvs_stats_free(&s);
    /* Prompt 1 is gone; prompt 2 comes back. Tier 2 holds only prompt 2,
     * pinned by the lookup, so the pool's least recent blocks (prompt 3)
     * make room by leaving for good. */
    check_miss(c, 1, 8);
    check_prompt(c, 2, 8);
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier_promotions, 8);
    ck_assert_uint_eq(s.tier_drops_t1, 8);
    ck_assert_uint_eq(s.evictions, 16);
    ck_assert_uint_eq(s.tier2_cached_blocks, 0);
    kvs_stats_free(&s);
    check_prompt(c, 4, 8);
    stop(c);
}
END_TEST

/* In a worker: an Alloc of 16 blocks, which the parent may kill once it
 * is sent. */
static void alloc_16(kvs_client_t *w, int ready_fd, uint32_t seed)
{
    uint32_t ids[16];
    (void)seed;
    ready(ready_fd);
    kvs_alloc(w, NULL, 16, ids); /* demotes 16 blocks, or finds free ones */
}

/* Children fill the pool so that their Alloc demotes (blocks of 512 KiB,
 * so the copies take a while) and are killed while it does: afterwards
 * nothing is pinned, written, copied or lost, every tier-2 slot is
 * accounted for, and every prompt still reads back whole. */
START_TEST(test_sigkill_during_demotion)
{
    const char *const geo[] = {"--model", "llama-3.2-1b", NULL};
    const char *const extra[] = {"--host-tier", "64MiB", NULL}; /* 128 blocks */
    ck_assert_int_eq(start(32, geo, extra), 0);
    kvs_client_t *c = harness_client(&h, "observer", 0);
    write_prompts(c, 1, 2, 16); /* the pool is full and everything cached */
    kvs_stats_t s;
    for (int round = 0; round < 6; round++) {
        pid_t pid = fork_worker(0, alloc_16, 0);
        kill_worker(c, pid, &s);
        kvs_stats_free(&s);
        /* The next round finds the pool full again. */
        write_prompt(c, 10 + (uint32_t)round, 16);
    }
    check_idle(c, &s);
    ck_assert_uint_ge(s.tier_demotions, 16);
    ck_assert_uint_eq(s.evictions, 0); /* tier 2 holds everything: nothing was dropped */
    kvs_stats_free(&s);
    check_prompt(c, 1, 16);
    check_prompt(c, 2, 16);
    for (uint32_t r = 0; r < 6; r++)
        check_prompt(c, 10 + r, 16);
    check_idle(c, &s);
    kvs_stats_free(&s);
    stop(c);
}
END_TEST

/* A lookup with tier2_in_place of prompt `seed` (nb blocks): all of them,
 * the first n_t1 in the pool and the rest in tier 2, into ids and tiers,
 * pinned; every block holds its writer's bytes, read through the pool's
 * mapping or the tier-2 one. */
static void lookup_in_place(kvs_client_t *c, uint32_t seed, size_t nb, size_t n_t1, uint32_t *ids,
                            uint8_t *tiers)
{
    kvs_geometry_t g;
    uint32_t tokens[MAX_BLOCKS * 16];
    size_t n = 0;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    prompt(tokens, nb * g.block_tokens, seed);
    int rc = kvs_lookup_tier2(c, NULL, tokens, nb * g.block_tokens, ids, tiers, MAX_BLOCKS, &n);
    ck_assert_msg(rc == 0, "lookup_tier2: %s", kvs_last_error(c));
    ck_assert_uint_eq(n, nb);
    uint8_t *want = malloc(g.slot_bytes), *got = malloc(g.slot_bytes);
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(got);
    for (size_t j = 0; j < n; j++) {
        ck_assert_uint_eq(tiers[j], j < n_t1 ? 1 : 2);
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                for (size_t i = 0; i < g.slot_bytes; i++)
                    want[i] = pattern(seed, l, kv, j, i);
                if (tiers[j] == 1) {
                    ck_assert_int_eq(kvs_block_read(c, l, kv, ids[j], got, g.slot_bytes), 0);
                } else {
                    uintptr_t addr;
                    ck_assert_uint_lt(ids[j], g.tier2_blocks);
                    ck_assert_int_eq(kvs_tier2_block_addr(c, l, kv, ids[j], &addr), 0);
                    ck_assert_int_eq(kvs_tier2_block_read(c, l, kv, ids[j], got, g.slot_bytes), 0);
                    ck_assert_int_eq(memcmp((const void *)addr, got, g.slot_bytes), 0);
                }
                ck_assert_msg(memcmp(got, want, g.slot_bytes) == 0,
                              "prompt %u block %zu (tier %u) layer %u kv %u differs", seed, j,
                              tiers[j], l, kv);
            }
    }
    free(want);
    free(got);
}

/* A worker writes a prompt, it is demoted, and a second worker that maps
 * tier 2 looks it up in place: tier-2 blocks, not promoted, holding the
 * writer's bytes. While pinned they stay put even when tier 2 must make
 * room (other blocks go), and a plain pinned lookup of the same prompt
 * does not move them either. Released with the usual Release. */
START_TEST(test_tier2_in_place)
{
    start_tier("8KiB"); /* 16 blocks in tier 2 */
    kvs_client_t *w = harness_client(&h, "writer", 0);
    kvs_client_t *r = harness_client(&h, "reader", KVS_MAP_TIER2);
    kvs_geometry_t g;
    kvs_stats_t s;
    ck_assert_int_eq(kvs_geometry(r, &g), 0);
    ck_assert_uint_eq(g.tier2_blocks, 16);
    ck_assert_uint_ge(g.tier2_bytes, 16 * g.block_bytes);
    ck_assert_uint_ne(kvs_tier2_base(r), 0);
    ck_assert_uint_eq(kvs_tier2_base(w), 0); /* it did not ask */
    uintptr_t addr;
    ck_assert_int_eq(kvs_tier2_block_addr(w, 0, 0, 0, &addr), KVS_ENOTSUP);
    ck_assert_int_eq(kvs_tier2_block_addr(r, 0, 0, 16, &addr), KVS_EINVAL);
    write_prompts(w, 1, 3, 8); /* the pool is full: prompt 1 goes to tier 2 */
    check_idle(w, &s);
    ck_assert_uint_eq(s.tier2_cached_blocks, 8);
    kvs_stats_free(&s);

    uint32_t ids[MAX_BLOCKS], ids3[MAX_BLOCKS];
    uint8_t tiers[MAX_BLOCKS], tiers3[MAX_BLOCKS];
    lookup_in_place(r, 1, 8, 0, ids, tiers);
    lookup_in_place(r, 3, 8, 8, ids3, tiers3); /* in the pool: named there */
    ck_assert_int_eq(kvs_stats(w, &s), 0);
    ck_assert_uint_eq(s.tier_promotions, 0);
    ck_assert_uint_eq(s.pinned_blocks, 16);
    ck_assert_uint_eq(s.tier2_in_place_blocks, 8);
    ck_assert_uint_eq(s.namespaces[0].tier2_hit_tokens, 8 * g.block_tokens);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_release_tiers(r, ids3, tiers3, 8, NULL), 0);

    /* A plain pinned lookup of prompt 1 leaves it where the reader reads
     * it: no promotion, and no demotion to make room for one. */
    check_miss(w, 1, 8);
    ck_assert_int_eq(kvs_stats(w, &s), 0);
    ck_assert_uint_eq(s.tier_promotions, 0);
    ck_assert_uint_eq(s.tier_demotions, 8);
    kvs_stats_free(&s);

    /* Prompt 4 demotes prompt 2: tier 2 is full. Prompt 5 must demote
     * prompt 3, so tier 2 drops what it can: prompt 2, never the pinned
     * prompt 1. Then prompt 6 demotes prompt 4, dropping prompt 3. */
    write_prompt(w, 4, 8);
    write_prompt(w, 5, 8);
    ck_assert_int_eq(kvs_stats(w, &s), 0);
    ck_assert_uint_eq(s.tier_demotions, 24);
    ck_assert_uint_eq(s.tier2_drops, 8);
    ck_assert_uint_eq(s.pinned_blocks, 8);
    kvs_stats_free(&s);
    write_prompt(w, 6, 8);
    ck_assert_int_eq(kvs_stats(w, &s), 0);
    ck_assert_uint_eq(s.tier_demotions, 32);
    ck_assert_uint_eq(s.tier2_drops, 16);
    ck_assert_uint_eq(s.tier2_cached_blocks, 16);
    ck_assert_uint_eq(s.pinned_blocks, 8);
    kvs_stats_free(&s);
    uint32_t again[MAX_BLOCKS];
    uint8_t again_tiers[MAX_BLOCKS];
    lookup_in_place(r, 1, 8, 0, again, again_tiers); /* the same blocks, the same bytes */
    ck_assert_int_eq(memcmp(again, ids, 8 * sizeof(uint32_t)), 0);
    ck_assert_int_eq(kvs_release_tiers(r, again, again_tiers, 8, NULL), 0);

    /* Released: no pin left; releasing again is refused. */
    size_t done = 99;
    ck_assert_int_eq(kvs_release_tiers(r, ids, tiers, 8, &done), 0);
    ck_assert_uint_eq(done, 8);
    ck_assert_int_eq(kvs_release_tiers(r, ids, tiers, 8, &done), KVS_ENOTHELD);
    ck_assert_uint_eq(done, 0);
    uint8_t bad_tier = 3;
    ck_assert_int_eq(kvs_release_tiers(r, ids, &bad_tier, 1, NULL), KVS_EINVAL);
    uint32_t out_of_range = 16;
    uint8_t two = 2;
    ck_assert_int_eq(kvs_release_tiers(r, &out_of_range, &two, 1, NULL), KVS_EINVAL);
    check_idle(w, &s);
    kvs_stats_free(&s);
    /* Unpinned, prompt 1 now comes back into the pool as usual. */
    check_prompt(w, 1, 8);
    kvs_close(r);
    stop(w);
}
END_TEST

#define SEGV_EXIT 42

static void on_segv(int sig)
{
    (void)sig;
    _exit(SEGV_EXIT);
}

/* The tier-2 mapping is for reading: a write through it faults, and it
 * cannot be made writable (the fd came read-only). */
START_TEST(test_tier2_mapping_read_only)
{
    start_tier("8KiB");
    kvs_client_t *r = harness_client(&h, "reader", KVS_MAP_TIER2);
    uintptr_t base = kvs_tier2_base(r);
    ck_assert_uint_ne(base, 0);
    long page = sysconf(_SC_PAGESIZE);
    ck_assert_int_eq(mprotect((void *)base, (size_t)page, PROT_READ | PROT_WRITE), -1);
    ck_assert_int_eq(errno, EACCES);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Our own handler (a sanitizer's would exit 1 for any fault). */
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_segv;
        sigaction(SIGSEGV, &sa, NULL);
        *(volatile uint8_t *)base = 1;
        _exit(0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == SEGV_EXIT,
                  "a write to tier 2 did not fault (status %d)", status);
    stop(r);
}
END_TEST

/* In a worker: a lookup in place of prompt 1 (8 blocks, in tier 2), which
 * holds its tier-2 pins when the parent goes on. */
static void lookup_in_place_8(kvs_client_t *w, int ready_fd, uint32_t seed)
{
    kvs_geometry_t g;
    uint32_t tokens[8 * 16], ids[8];
    uint8_t tiers[8];
    size_t n = 0;
    if (kvs_geometry(w, &g) != 0)
        _exit(1);
    prompt(tokens, 8 * g.block_tokens, seed);
    if (kvs_lookup_tier2(w, NULL, tokens, 8 * g.block_tokens, ids, tiers, 8, &n) != 0 || n != 8 ||
        tiers[0] != 2)
        _exit(2);
    ready(ready_fd);
}

/* A reader killed while it holds tier-2 pins leaks none, and the blocks
 * are free to move again. */
START_TEST(test_tier2_in_place_sigkill)
{
    start_tier("8KiB");
    kvs_client_t *c = harness_client(&h, "observer", 0);
    kvs_stats_t s;
    write_prompts(c, 1, 3, 8); /* prompt 1 in tier 2 */
    pid_t pid = fork_worker(KVS_MAP_TIER2, lookup_in_place_8, 1);
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    ck_assert_uint_eq(s.pinned_blocks, 8);
    kvs_stats_free(&s);
    kill_worker(c, pid, &s);
    ck_assert_uint_eq(s.tier_promotions, 0);
    kvs_stats_free(&s);
    check_prompt(c, 1, 8); /* unpinned: it comes back into the pool */
    stop(c);
}
END_TEST

/* Without a tier 2 the option asks for nothing more: the mapping flag maps
 * the pool only, and the lookup is a pinned lookup of pool blocks. */
START_TEST(test_tier2_in_place_without_tier2)
{
    ck_assert_int_eq(start(16, NULL, NULL), 0);
    kvs_client_t *c = harness_client(&h, "reader", KVS_MAP_TIER2);
    kvs_geometry_t g;
    kvs_stats_t s;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    ck_assert_uint_eq(g.tier2_blocks, 0);
    ck_assert_uint_eq(g.tier2_bytes, 0);
    ck_assert_uint_eq(kvs_tier2_base(c), 0);
    uintptr_t addr;
    ck_assert_int_eq(kvs_tier2_block_addr(c, 0, 0, 0, &addr), KVS_ENOTSUP);
    write_prompt(c, 1, 8);
    uint32_t ids[MAX_BLOCKS];
    uint8_t tiers[MAX_BLOCKS];
    lookup_in_place(c, 1, 8, 8, ids, tiers);
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    ck_assert_uint_eq(s.pinned_blocks, 8);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_release_tiers(c, ids, tiers, 8, NULL), 0);
    uint32_t zero = 0;
    uint8_t two = 2;
    ck_assert_int_eq(kvs_release_tiers(c, &zero, &two, 1, NULL), KVS_EINVAL);
    ck_assert_msg(strstr(kvs_last_error(c), "no tier 2") != NULL, "%s", kvs_last_error(c));
    check_idle(c, &s);
    kvs_stats_free(&s);
    stop(c);
}
END_TEST

/* Blocks committed without their bytes written (the cuda pool's memory is
 * not the test's to write). */
static void commit_prompt(kvs_client_t *c, uint32_t seed, size_t nb)
{
    kvs_geometry_t g;
    uint32_t tokens[MAX_BLOCKS * 16], ids[MAX_BLOCKS], can[MAX_BLOCKS];
    size_t done;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    prompt(tokens, nb * g.block_tokens, seed);
    int rc = kvs_alloc(c, NULL, (uint32_t)nb, ids);
    ck_assert_msg(rc == 0, "alloc: %s", kvs_last_error(c));
    ck_assert_int_eq(kvs_commit(c, NULL, tokens, nb * g.block_tokens, ids, nb, can, &done), 0);
    ck_assert_uint_eq(done, nb);
    ck_assert_int_eq(kvs_release(c, can, nb, NULL), 0);
}

/* A copy between the tiers that fails (the cuda backend on the test driver,
 * whose copies from and to host memory fail as on a faulting device): the
 * index would name blocks whose bytes were never copied, so kvshared stops
 * (exit status 1) instead of answering; the request waiting for the copy
 * gets no blocks, and nothing is answered after it. */
START_TEST(test_copy_failure_stops_the_daemon)
{
    const char *const extra[] = {"--backend", "cuda", "--host-tier", "16KiB", NULL};
    ck_assert_int_eq(harness_start(&h, 16, extra), 0);
    kvs_client_t *c = harness_client(&h, "tier", 0);
    commit_prompt(c, 1, 8);
    commit_prompt(c, 2, 8);
    /* The pool is full: this Alloc demotes prompt 1, and the copy fails. */
    uint32_t ids[8];
    int rc = kvs_alloc(c, NULL, 8, ids);
    ck_assert_msg(rc == KVS_ENOTCONN, "alloc after a failed copy: %s (%s)", kvs_strerror(rc),
                  kvs_last_error(c));
    kvs_close(c);
    /* It exits by itself (a signal now could end it before its status). */
    ck_assert_int_eq(launch_stop(h.pid, 0, 30000), 1);
    h.pid = 0;
    harness_cleanup(&h);
}
END_TEST

/* The nice value of thread tid of process pid (field 19 of its stat). */
static int thread_nice(pid_t pid, int tid)
{
    char path[96], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, tid);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* After the command name in parentheses: field 3 (state) onwards. */
    const char *p = strrchr(buf, ')');
    ck_assert_ptr_nonnull(p);
    int field = 2, nice = 0;
    for (p++; *p && field < 19; p++)
        if (*p == ' ' && ++field == 19)
            nice = atoi(p + 1);
    ck_assert_int_eq(field, 19);
    return nice;
}

/* The threads that copied between the tiers run tier_copy_nice nicer than
 * the loop thread (the main thread); no thread of the daemon is niced in
 * any other way. */
START_TEST(test_copy_threads_nicer)
{
    const char *const extra[] = {"--host-tier", "16KiB", "--tier-copy-nice", "7", NULL};
    ck_assert_int_eq(harness_start(&h, 16, extra), 0);
    kvs_client_t *c = harness_client(&h, "tier", 0);
    write_prompts(c, 1, 3, 8); /* prompt 1 is demoted: a copy ran */
    kvs_stats_t s;
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier_demotions, 8);
    kvs_stats_free(&s);
    int loop = thread_nice(h.pid, h.pid), want = loop + 7 > 19 ? 19 : loop + 7;
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)h.pid);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int niced = 0, others = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int tid = atoi(e->d_name);
        if (tid <= 0 || tid == h.pid)
            continue;
        int nice = thread_nice(h.pid, tid);
        ck_assert_msg(nice == loop || nice == want, "thread %d: nice %d (loop %d, copies %d)", tid,
                      nice, loop, want);
        niced += nice == want;
        others++;
    }
    closedir(d);
    ck_assert_int_gt(others, 0);
    ck_assert_int_gt(niced, 0);
    stop(c);
}
END_TEST

/* Evict drops a prompt from whichever tier holds it: tier-2 slots come
 * free, pool blocks go back to the pool, each counted as a drop. */
START_TEST(test_evict_from_both_tiers)
{
    start_tier("16KiB"); /* 32 blocks in tier 2 */
    kvs_client_t *c = harness_client(&h, "tier", 0);
    kvs_geometry_t g;
    kvs_stats_t s;
    kvs_evict_result_t r;
    uint32_t tokens[8 * 16];
    write_prompts(c, 1, 3, 8); /* the pool is full: prompt 1 goes to tier 2 */
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    prompt(tokens, 8 * g.block_tokens, 1);
    ck_assert_int_eq(kvs_evict(c, NULL, tokens, 8 * g.block_tokens, &r), 0);
    ck_assert_uint_eq(r.tier2_blocks, 8);
    ck_assert_uint_eq(r.tier1_blocks, 0);
    ck_assert_uint_eq(r.kept_blocks, 0);
    prompt(tokens, 8 * g.block_tokens, 2);
    ck_assert_int_eq(kvs_evict(c, NULL, tokens, 8 * g.block_tokens, &r), 0);
    ck_assert_uint_eq(r.tier1_blocks, 8);
    ck_assert_uint_eq(r.tier2_blocks, 0);
    check_idle(c, &s);
    ck_assert_uint_eq(s.tier2_cached_blocks, 0);
    ck_assert_uint_eq(s.tier2_drops, 8);
    ck_assert_uint_eq(s.evictions, 16);
    ck_assert_uint_eq(s.cached_blocks, 8);
    ck_assert_uint_eq(s.free_blocks, 8);
    kvs_stats_free(&s);
    check_miss(c, 1, 8);
    check_miss(c, 2, 8);
    check_prompt(c, 3, 8);
    stop(c);
}
END_TEST

/* A child that pings the daemon on its own connection until told to stop
 * (a byte on stop_fd) and then writes the longest round trip it saw, in
 * microseconds, to out_fd: how long the loop stalled for other clients. */
static void ping_child(int stop_fd, int out_fd)
{
    kvs_client_t *p = harness_client(&h, "pinger", 0);
    double worst = 0;
    for (;;) {
        struct pollfd pf = {.fd = stop_fd, .events = POLLIN};
        if (poll(&pf, 1, 0) > 0)
            break;
        double rtt = 0;
        if (kvs_ping(p, 0, &rtt) != 0)
            _exit(3);
        if (rtt > worst)
            worst = rtt;
    }
    uint64_t us = (uint64_t)worst;
    if (write(out_fd, &us, sizeof(us)) != (ssize_t)sizeof(us))
        _exit(2);
    kvs_close(p);
    _exit(0);
}

/* Allocates and commits prompt `seed` of nb blocks without writing bytes
 * (what they hold does not matter here) and lets go of them. */
static void commit_blank(kvs_client_t *c, uint32_t seed, size_t nb)
{
    size_t n_tokens = nb * 4;
    uint32_t *tokens = malloc(n_tokens * sizeof(*tokens));
    uint32_t *ids = malloc(nb * sizeof(*ids)), *can = malloc(2 * nb * sizeof(*can));
    ck_assert(tokens && ids && can);
    prompt(tokens, n_tokens, seed);
    size_t done = 0;
    ck_assert_int_eq(kvs_alloc(c, NULL, (uint32_t)nb, ids), 0);
    int rc = kvs_commit(c, NULL, tokens, n_tokens, ids, nb, can, &done);
    ck_assert_msg(rc == 0, "commit: %s", kvs_last_error(c));
    ck_assert_uint_eq(done, nb);
    ck_assert_int_eq(kvs_release(c, can, nb, NULL), 0);
    free(tokens);
    free(ids);
    free(can);
}

/* Issue: a pinned Lookup of a 64k-block prefix in tier 2 stalled every
 * client for over a second: each promoted block's pin was found by a scan
 * of all the Lookup's pins. Now the promotion is linear: no stretch of the
 * loop's work passes 50 ms (the quadratic scan took about 1.2 s at this
 * size), and another client's Ping is printed. */
START_TEST(test_large_promotion_is_linear)
{
    enum { NB = 65536 };
    const char *const extra[] = {"--host-tier", "64MiB", "--max-frame", "8MiB", NULL};
    ck_assert_int_eq(start(NB, NULL, extra), 0);
    /* Each large request from a session of its own: a session's next large
     * request waits 99 times its previous one's time (docs/RELIABILITY.md,
     * H4), another session's 9 times; under valgrind on a loaded machine
     * the first took the Lookup past the client's 30 s timeout. */
    kvs_client_t *w1 = harness_client(&h, "tier-1", 0), *w2 = harness_client(&h, "tier-2", 0), *c;
    commit_blank(w1, 1, NB);
    commit_blank(w2, 2, NB); /* prompt 1 goes to tier 2 */
    kvs_close(w1);
    kvs_close(w2);
    c = harness_client(&h, "tier", 0);
    kvs_stats_t s;
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    ck_assert_uint_eq(s.tier2_cached_blocks, NB);
    kvs_stats_free(&s);
    int stop_p[2], out_p[2];
    ck_assert_int_eq(pipe(stop_p), 0);
    ck_assert_int_eq(pipe(out_p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        ping_child(stop_p[0], out_p[1]);
    usleep(50000);
    uint32_t *tokens = malloc(NB * 4 * sizeof(*tokens)), *got = malloc(NB * sizeof(*got));
    ck_assert(tokens && got);
    prompt(tokens, NB * 4, 1);
    size_t n = 0;
    int rc = kvs_lookup(c, NULL, tokens, NB * 4, 1, got, NB, &n);
    ck_assert_msg(rc == 0, "lookup: %s", kvs_last_error(c));
    ck_assert_uint_eq(n, NB);
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_lt(got[i], NB); /* promoted: every block in the pool */
    ck_assert_int_eq(write(stop_p[1], "x", 1), 1);
    uint64_t worst_us = 0;
    ck_assert_int_eq(read(out_p[0], &worst_us, sizeof(worst_us)), (ssize_t)sizeof(worst_us));
    int status = 0;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("test_large_promotion_is_linear: %d blocks promoted, longest ping %llu us\n", NB,
           (unsigned long long)worst_us);
    kvs_stats_t st;
    ck_assert_int_eq(kvs_stats(c, &st), 0);
    uint64_t stalls = st.counters[KVS_COUNTER_loop_stalls];
    uint64_t busy_us = st.loop_busy_max_us;
    kvs_stats_free(&st);
    printf("test_large_promotion_is_linear: the loop's longest work %llu us, %llu stalls over "
           "50 ms of CPU\n",
           (unsigned long long)busy_us, (unsigned long long)stalls);
    /* The bound is the daemon's own count of loop work over 50 ms of CPU
     * (loop_watch.c; the quadratic scan was 1.2 s of it): another client's
     * Ping is wall-clock time and on a loaded machine passed 400 ms with no
     * stall of the daemon's. Under valgrind (KVS_KVSHARED names its wrapper)
     * and ASan everything is slower: there the Ping bound stays, scaled
     * (the quadratic scan took about 50 s under valgrind; the Lookup's own
     * decoding and walk of 64k blocks took 2.3 s on a loaded machine). */
    const char *wrapper = getenv("KVS_KVSHARED");
    bool valgrind = wrapper && strstr(wrapper, "valgrind");
#ifdef __SANITIZE_ADDRESS__
    bool checked = true;
#else
    bool checked = valgrind;
#endif
    if (checked)
        ck_assert_uint_lt(worst_us, valgrind ? 10000000 : 2000000);
    else
        ck_assert_msg(stalls == 0, "%llu stretches of loop work over 50 ms of CPU",
                      (unsigned long long)stalls);
    ck_assert_int_eq(kvs_release(c, got, n, NULL), 0);
    free(tokens);
    free(got);
    close(stop_p[0]);
    close(stop_p[1]);
    close(out_p[0]);
    close(out_p[1]);
    stop(c);
}
END_TEST

int main(void)
{
    /* The copy-failure case needs the cuda backend on the test driver, so
     * ctest runs it alone as test_tier_copy_failure, with that driver acting
     * it out; the daemon cases run on the host backend. */
    const char *fake = getenv("KVS_FAKE_CUDA");
    bool copy_failure = fake && strcmp(fake, "hostcopyfail") == 0;
    tier_backend = getenv("KVS_TEST_TIER_BACKEND");
    if (tier_backend && strcmp(tier_backend, "cuda") != 0 && strcmp(tier_backend, "host") != 0) {
        fprintf(stderr, "test_tier: KVS_TEST_TIER_BACKEND is host or cuda, not %s\n", tier_backend);
        return EXIT_FAILURE;
    }
    Suite *su = suite_create("tier");
    TCase *tc = tcase_create(copy_failure ? "cuda" : "daemon");
    if (tier_backend)
        printf("test_tier: kvshared --backend %s\n", tier_backend);
    tcase_set_timeout(tc, 120);
    if (copy_failure) {
        tcase_add_test(tc, test_copy_failure_stops_the_daemon);
    } else {
        tcase_add_test(tc, test_demote_then_promote);
        tcase_add_test(tc, test_sigkill_during_promotion);
        tcase_add_test(tc, test_full_tier2);
        tcase_add_test(tc, test_sigkill_during_demotion);
        tcase_add_test(tc, test_tier2_in_place);
        tcase_add_test(tc, test_tier2_mapping_read_only);
        tcase_add_test(tc, test_tier2_in_place_sigkill);
        tcase_add_test(tc, test_tier2_in_place_without_tier2);
        tcase_add_test(tc, test_copy_threads_nicer);
        tcase_add_test(tc, test_evict_from_both_tiers);
        tcase_add_test(tc, test_large_promotion_is_linear);
        printf("test_copy_failure_stops_the_daemon: not in this run (it needs the cuda test "
               "driver); ctest runs it as test_tier_copy_failure\n");
    }
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
