/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier across restarts, through a real kvshared: a block is
 * restored only to its model identity, and a deleted block stays deleted.
 *
 * - kvshared --model llama-3.1-8b fills its disk tier; restarted on the same
 *   file with --model mistral-7b (same geometry, so the file itself is
 *   accepted) it serves none of llama's blocks and counts them
 *   (disk_identity_dropped); restarted with the same --model it serves them
 *   as before.
 * - A Clear, then SIGTERM or SIGKILL, then a restart: no cleared prompt
 *   hits, neither those whose blocks were on the disk nor those that had
 *   moved up from it to the pool before the Clear; prompts cached after the
 *   Clear come back.
 * - An Evict, then SIGKILL and a restart: no evicted prompt hits (on the
 *   disk, or moved up from it), the others do.
 * - A namespace a worker declared its identity for (kvs_options_t.identity)
 *   is bound to it again at the restart: the same declaration finds its
 *   blocks, another model's is refused at connect (KVS_EIDENTITY).
 *
 * Test geometry (the harness's, with --model naming only the identity):
 * blocks of 512 B and 4 tokens, one 4 KiB disk slot each; a pool and a
 * host tier of 16 blocks, a disk tier of 1 MiB, as test_tier_disk3.
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"
#include "kvshare_counters.h"
#include "raw_wire.h"
#include "test_tmp.h"

#define POOL    16
#define NB      4 /* blocks per prompt */
#define BT      4 /* tokens per block */
#define PROMPTS 20

static harness_t h;
static char disk_dir[256], disk_path[300];

/* kvshared's flags: the tiers of test_tier_disk3 and --model (NULL: none). */
static const char *const *flags(const char *model)
{
    static const char *f[12];
    const char *base[] = {"--host-tier",       "8KiB", "--disk-tier-path", disk_path,
                          "--disk-tier-bytes", "1MiB", "--disk-tier-io",   "threads"};
    size_t n = 0;
    for (; n < sizeof(base) / sizeof(base[0]); n++)
        f[n] = base[n];
    if (model) {
        f[n++] = "--model";
        f[n++] = model;
    }
    f[n] = NULL;
    return f;
}

static void setup(void)
{
    ck_assert_int_eq(test_tmp_dir("kvs-diskid", disk_dir, sizeof(disk_dir)), 0);
    snprintf(disk_path, sizeof(disk_path), "%s/tier3", disk_dir);
    memset(&h, 0, sizeof(h));
}

static void teardown(void)
{
    harness_cleanup(&h);
    unlink(disk_path);
    rmdir(disk_dir);
}

static void start(const char *model)
{
    ck_assert_int_eq(harness_start(&h, POOL, flags(model)), 0);
}

/* Stops kvshared (SIGTERM, or SIGKILL when kill9) and starts it again on
 * the same socket and file, with --model model. */
static void restart(bool kill9, const char *model)
{
    if (kill9) {
        ck_assert_int_eq(kill(h.pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(h.pid, NULL, 0), h.pid);
        h.pid = 0;
    } else {
        ck_assert_int_eq(harness_stop(&h), 0);
    }
    pid_t pid = 0;
    ck_assert_int_eq(harness_restart(&h, POOL, flags(model), 30000, &pid), -1);
    h.pid = pid;
    harness_wait_restored(&h);
}

static void prompt(uint32_t *t, uint32_t seed)
{
    for (size_t i = 0; i < NB * BT; i++)
        t[i] = seed * 100000 + (uint32_t)i;
}

static uint8_t pattern(uint32_t seed, uint32_t layer, uint32_t kv, size_t j, size_t i)
{
    return (uint8_t)(seed * 17 + layer * 31 + kv * 7 + j * 13 + i);
}

/* Writes NB blocks of prompt `seed` in ns, commits and releases them. */
static void write_prompt(kvs_client_t *c, const char *ns, uint32_t seed)
{
    kvs_geometry_t g;
    uint32_t tokens[NB * BT], ids[NB], can[NB];
    size_t done;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    ck_assert_uint_eq(g.block_tokens, BT);
    prompt(tokens, seed);
    ck_assert_int_eq(kvs_alloc(c, ns, NB, ids), 0);
    uint8_t slot[512];
    ck_assert_uint_le(g.slot_bytes, sizeof(slot));
    for (size_t j = 0; j < NB; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                for (size_t i = 0; i < g.slot_bytes; i++)
                    slot[i] = pattern(seed, l, kv, j, i);
                ck_assert_int_eq(kvs_block_write(c, l, kv, ids[j], slot, g.slot_bytes), 0);
            }
    int rc = kvs_commit(c, ns, tokens, NB * BT, ids, NB, can, &done);
    ck_assert_msg(rc == 0 && done == NB, "commit: %s", kvs_last_error(c));
    ck_assert_int_eq(kvs_release(c, can, NB, NULL), 0);
}

/* A pinned lookup of prompt `seed` in ns: the blocks matched, each checked
 * to hold its writer's bytes. */
static size_t hits(kvs_client_t *c, const char *ns, uint32_t seed)
{
    kvs_geometry_t g;
    uint32_t tokens[NB * BT], got[NB];
    size_t n = 0;
    ck_assert_int_eq(kvs_geometry(c, &g), 0);
    prompt(tokens, seed);
    int rc = kvs_lookup(c, ns, tokens, NB * BT, 1, got, NB, &n);
    ck_assert_msg(rc == 0, "lookup: %s", kvs_last_error(c));
    uint8_t want[512], slot[512];
    for (size_t j = 0; j < n; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                ck_assert_int_eq(kvs_block_read(c, l, kv, got[j], slot, g.slot_bytes), 0);
                for (size_t i = 0; i < g.slot_bytes; i++)
                    want[i] = pattern(seed, l, kv, j, i);
                ck_assert_msg(memcmp(slot, want, g.slot_bytes) == 0,
                              "prompt %u block %zu: wrong bytes served", seed, j);
            }
    if (n > 0)
        ck_assert_int_eq(kvs_release(c, got, n, NULL), 0);
    return n;
}

/* Waits until no block is being copied between the tiers. */
static void settle(kvs_client_t *c)
{
    for (int k = 0; k < 500; k++) {
        kvs_stats_t s;
        ck_assert_int_eq(kvs_stats(c, &s), 0);
        ck_assert_uint_eq(s.tier_copy_failures, 0);
        uint32_t copying = s.copying_blocks;
        kvs_stats_free(&s);
        if (copying == 0)
            return;
        usleep(10000);
    }
    ck_abort_msg("copies between the tiers did not end");
}

static uint32_t tier3_cached(kvs_client_t *c)
{
    kvs_stats_t s;
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    uint32_t n = s.tier3_cached_blocks;
    kvs_stats_free(&s);
    return n;
}

/* Counter `i` of the Stats reply (the counters after KVS_COUNTERS have no
 * kvs_stats_t field: read off the wire). */
static uint64_t counter(size_t i)
{
    int fd = raw_connect(h.socket_path);
    ck_assert_int_ge(fd, 0);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__StatsRequest sr = KVSHARE__STATS_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_STATS;
    req.stats = &sr;
    req.id = 5;
    ck_assert_int_eq(raw_send_request(fd, &req), 0);
    Kvshare__Response *r = raw_read_reply(fd, 5000);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->rpc_case, KVSHARE__RESPONSE__RPC_STATS);
    ck_assert_uint_gt(r->stats->n_counters, i);
    uint64_t v = r->stats->counters[i];
    kvshare__response__free_unpacked(r, NULL);
    close(fd);
    return v;
}

/* Prompts 1..PROMPTS in ns; the disk holds the first 12 or more. */
static void fill(kvs_client_t *c, const char *ns)
{
    for (uint32_t p = 1; p <= PROMPTS; p++)
        write_prompt(c, ns, p);
    settle(c);
    ck_assert_uint_ge(tier3_cached(c), 12 * NB);
}

START_TEST(other_model_restores_nothing)
{
    start("llama-3.1-8b");
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    kvs_close(c);

    restart(false, "mistral-7b");
    c = harness_client(&h, "diskid", 0);
    ck_assert_uint_eq(tier3_cached(c), 0);
    for (uint32_t p = 1; p <= PROMPTS; p++)
        ck_assert_uint_eq(hits(c, NULL, p), 0);
    ck_assert_uint_ge(counter(KVS_COUNTER_disk_identity_dropped), 12 * NB);
    ck_assert_uint_eq(counter(KVS_COUNTER_disk_deleted_dropped), 0);
    /* Mistral's own blocks go to the disk and come back for mistral. */
    fill(c, NULL);
    kvs_close(c);
    restart(true, "mistral-7b");
    c = harness_client(&h, "diskid", 0);
    ck_assert_uint_ge(tier3_cached(c), 12 * NB);
    for (uint32_t p = 1; p <= 12; p++)
        ck_assert_uint_eq(hits(c, NULL, p), NB);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

START_TEST(same_model_restores)
{
    start("llama-3.1-8b");
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    kvs_close(c);

    restart(false, "llama-3.1-8b");
    c = harness_client(&h, "diskid", 0);
    ck_assert_uint_ge(tier3_cached(c), 12 * NB);
    for (uint32_t p = 1; p <= 12; p++)
        ck_assert_uint_eq(hits(c, NULL, p), NB);
    ck_assert_uint_eq(counter(KVS_COUNTER_disk_identity_dropped), 0);
    ck_assert_uint_eq(counter(KVS_COUNTER_disk_deleted_dropped), 0);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* Fills the disk, moves prompts 1..2 up from it (their records stay there,
 * their slots free), clears the namespace, caches prompts 31..50, then
 * restarts (SIGTERM or SIGKILL): no prompt of before the Clear hits. */
static void clear_then_restart(bool kill9)
{
    start(NULL);
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    ck_assert_uint_eq(hits(c, NULL, 1), NB);
    ck_assert_uint_eq(hits(c, NULL, 2), NB);
    settle(c);
    size_t cleared = 0, kept = 0;
    ck_assert_int_eq(kvs_clear(c, NULL, &cleared, &kept), 0);
    ck_assert_uint_eq(cleared, PROMPTS * NB);
    for (uint32_t p = 31; p <= 30 + PROMPTS; p++)
        write_prompt(c, NULL, p);
    settle(c);
    kvs_close(c);

    restart(kill9, NULL);
    c = harness_client(&h, "diskid", 0);
    for (uint32_t p = 1; p <= PROMPTS; p++)
        ck_assert_msg(hits(c, NULL, p) == 0, "prompt %u, cleared, hits after the restart", p);
    ck_assert_uint_gt(counter(KVS_COUNTER_disk_deleted_dropped), 0);
    /* What was cached after the Clear is restored. */
    ck_assert_uint_ge(tier3_cached(c), 12 * NB);
    size_t after = 0;
    for (uint32_t p = 31; p <= 30 + PROMPTS; p++)
        after += hits(c, NULL, p);
    ck_assert_uint_ge(after, 12 * NB);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}

START_TEST(clear_then_sigterm_stays_cleared)
{
    clear_then_restart(false);
}
END_TEST

START_TEST(clear_then_sigkill_stays_cleared)
{
    clear_then_restart(true);
}
END_TEST

START_TEST(evict_then_sigkill_stays_evicted)
{
    start(NULL);
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    /* Prompts 1..2 move up to the pool (their records stay on the disk);
     * 3..6 are on the disk. */
    ck_assert_uint_eq(hits(c, NULL, 1), NB);
    ck_assert_uint_eq(hits(c, NULL, 2), NB);
    settle(c);
    for (uint32_t p = 1; p <= 6; p++) {
        uint32_t tokens[NB * BT];
        prompt(tokens, p);
        kvs_evict_result_t r;
        ck_assert_int_eq(kvs_evict(c, NULL, tokens, NB * BT, &r), 0);
    }
    for (uint32_t p = 1; p <= 6; p++)
        ck_assert_uint_eq(hits(c, NULL, p), 0);
    settle(c);
    kvs_close(c);

    restart(true, NULL);
    c = harness_client(&h, "diskid", 0);
    for (uint32_t p = 1; p <= 6; p++)
        ck_assert_msg(hits(c, NULL, p) == 0, "prompt %u, evicted, hits after the restart", p);
    for (uint32_t p = 7; p <= 12; p++)
        ck_assert_uint_eq(hits(c, NULL, p), NB);
    ck_assert_uint_gt(counter(KVS_COUNTER_disk_deleted_dropped), 0);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* --- warm restart in the background --- */

/* Restarts kvshared (SIGKILL) with its scan held back delay_ms
 * (KVS_TEST_RESTORE_DELAY_MS), without waiting for the restore. */
static void restart_scanning(int delay_ms)
{
    ck_assert_int_eq(kill(h.pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(h.pid, NULL, 0), h.pid);
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", delay_ms);
    setenv("KVS_TEST_RESTORE_DELAY_MS", ms, 1);
    pid_t pid = 0;
    int rc = harness_restart(&h, POOL, flags(NULL), 30000, &pid);
    unsetenv("KVS_TEST_RESTORE_DELAY_MS");
    ck_assert_int_eq(rc, -1);
    h.pid = pid;
}

static void restore_status(kvs_client_t *c, kvs_restore_status_t *rs)
{
    ck_assert_int_eq(kvs_restore_status(c, rs), 0);
}

static void evict_prompt(kvs_client_t *c, uint32_t p)
{
    uint32_t tokens[NB * BT];
    prompt(tokens, p);
    kvs_evict_result_t r;
    ck_assert_int_eq(kvs_evict(c, NULL, tokens, NB * BT, &r), 0);
}

/* kvshared listens and serves while its disk tier's file is read: the
 * file's blocks are misses until restored, Stats says where the restore
 * stands, and a SIGKILL during the scan loses nothing of the file. */
START_TEST(restart_serves_while_scanning)
{
    start(NULL);
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    kvs_close(c);

    restart_scanning(60000);
    c = harness_client(&h, "diskid", 0);
    kvs_restore_status_t rs;
    restore_status(c, &rs);
    ck_assert_str_eq(rs.phase, "scanning");
    ck_assert_uint_gt(rs.slots, 0);
    ck_assert_uint_eq(kvs_ping(c, 16, NULL), 0);
    ck_assert_uint_eq(hits(c, NULL, 5), 0); /* not restored yet: a miss */
    write_prompt(c, NULL, 77);              /* served meanwhile */
    ck_assert_uint_eq(hits(c, NULL, 77), NB);
    kvs_close(c);

    /* SIGKILL during the scan: the next start reads the same file. */
    restart_scanning(0);
    harness_wait_restored(&h);
    c = harness_client(&h, "diskid", 0);
    restore_status(c, &rs);
    ck_assert_str_eq(rs.phase, "done");
    ck_assert_uint_gt(rs.restored, 0);
    for (uint32_t p = 5; p <= 12; p++)
        ck_assert_msg(hits(c, NULL, p) == NB, "prompt %u did not come back", p);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* An Evict during the scan, the daemon left to finish: the evicted
 * prompts' records get tombstones when the scan has read them, and a
 * SIGKILL after that brings none back. */
START_TEST(evict_during_scan_stays_evicted)
{
    start(NULL);
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    kvs_close(c);

    restart_scanning(1500);
    c = harness_client(&h, "diskid", 0);
    kvs_restore_status_t rs;
    restore_status(c, &rs);
    ck_assert_str_eq(rs.phase, "scanning");
    for (uint32_t p = 1; p <= 4; p++)
        evict_prompt(c, p);
    kvs_close(c);
    harness_wait_restored(&h);
    c = harness_client(&h, "diskid", 0);
    for (uint32_t p = 1; p <= 4; p++)
        ck_assert_msg(hits(c, NULL, p) == 0, "prompt %u, evicted during the scan, hits", p);
    for (uint32_t p = 5; p <= 12; p++)
        ck_assert_msg(hits(c, NULL, p) == NB, "prompt %u did not come back", p);
    ck_assert_uint_gt(counter(KVS_COUNTER_disk_deleted_dropped), 0);
    kvs_close(c);

    restart(true, NULL);
    c = harness_client(&h, "diskid", 0);
    for (uint32_t p = 1; p <= 4; p++)
        ck_assert_msg(hits(c, NULL, p) == 0,
                      "prompt %u, evicted during a scan, hits after "
                      "another restart",
                      p);
    ck_assert_uint_eq(hits(c, NULL, 7), NB);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* A Clear during the scan deletes every record of its namespace then on
 * the disk, at once: a SIGKILL before the scan ends brings none back, and
 * the restore that was running restores none. */
START_TEST(clear_during_scan_stays_cleared)
{
    start(NULL);
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    kvs_close(c);

    restart_scanning(60000);
    c = harness_client(&h, "diskid", 0);
    size_t cleared = 0, kept = 0;
    ck_assert_int_eq(kvs_clear(c, NULL, &cleared, &kept), 0);
    kvs_close(c);

    restart_scanning(0); /* SIGKILL while the first scan had not read a slot */
    harness_wait_restored(&h);
    c = harness_client(&h, "diskid", 0);
    for (uint32_t p = 1; p <= PROMPTS; p++)
        ck_assert_msg(hits(c, NULL, p) == 0, "prompt %u, cleared during a scan, hits", p);
    ck_assert_uint_eq(tier3_cached(c), 0);
    /* Written after the Clear: alive, and restored by the next start. */
    for (uint32_t p = 41; p <= 40 + PROMPTS; p++)
        write_prompt(c, NULL, p);
    settle(c);
    kvs_close(c);
    restart(true, NULL);
    c = harness_client(&h, "diskid", 0);
    ck_assert_uint_eq(hits(c, NULL, 41), NB);
    ck_assert_uint_eq(hits(c, NULL, 1), 0);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* Connects declaring `model` for namespace "chat"; the status, the client
 * in *out when connected. */
static int connect_as(const char *model, kvs_client_t **out)
{
    kvs_identity_t id;
    kvs_identity_init(&id);
    id.ns = "chat";
    id.model = model;
    kvs_options_t o;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = HARNESS_CLIENT_MS;
    o.identity = &id;
    *out = NULL;
    return kvs_connect(&o, out);
}

START_TEST(declared_namespace_restored_to_its_model)
{
    start(NULL);
    kvs_client_t *c;
    ck_assert_int_eq(connect_as("org/base-7b", &c), 0);
    fill(c, "chat");
    kvs_close(c);

    restart(true, NULL);
    /* Another model first: the namespace is the declared one's again. */
    kvs_client_t *other = NULL;
    ck_assert_int_eq(connect_as("org/other-7b", &other), KVS_EIDENTITY);
    ck_assert_ptr_null(other);
    ck_assert_int_eq(connect_as("org/base-7b", &c), 0);
    for (uint32_t p = 1; p <= 12; p++)
        ck_assert_uint_eq(hits(c, "chat", p), NB);
    ck_assert_uint_eq(counter(KVS_COUNTER_disk_identity_dropped), 0);
    kvs_close(c);

    /* And once more, with SIGTERM, the declaring worker first: what the
     * lookups above left on the disk comes back to it. */
    restart(false, NULL);
    ck_assert_int_eq(connect_as("org/base-7b", &c), 0);
    size_t total = 0;
    for (uint32_t p = 1; p <= PROMPTS; p++)
        total += hits(c, "chat", p);
    ck_assert_uint_gt(total, 0);
    ck_assert_uint_eq(counter(KVS_COUNTER_disk_identity_dropped), 0);
    ck_assert_int_eq(connect_as("org/other-7b", &other), KVS_EIDENTITY);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

/* CRC32C (Castagnoli, reflected), bit by bit: the disk file's checksum. */
static uint32_t crc32c_sw(const uint8_t *p, size_t n)
{
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

static void put32le(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Another user who can write the file renames namespace `from` to `to`
 * (as long) in the namespace table and in every record, checksums made
 * again: the records verify and name `to`. Returns the records renamed. */
static size_t rename_on_disk(const char *from, const char *to)
{
    size_t len = strlen(from);
    ck_assert_uint_eq(strlen(to), len);
    int fd = open(disk_path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t page[4096];
    ck_assert_int_eq(pread(fd, page, sizeof(page), 0), (ssize_t)sizeof(page));
    uint32_t body = (uint32_t)page[72] | (uint32_t)page[73] << 8 | (uint32_t)page[74] << 16 |
                    (uint32_t)page[75] << 24;
    ck_assert_uint_le(80 + body, sizeof(page));
    bool named = false;
    for (size_t i = 80; i + 1 + len <= 80 + body; i++)
        if (page[i] == len && memcmp(page + i + 1, from, len) == 0) {
            memcpy(page + i + 1, to, len);
            named = true;
        }
    ck_assert(named);
    put32le(page + 68, crc32c_sw(page + 72, 8 + body));
    ck_assert_int_eq(pwrite(fd, page, sizeof(page), 0), (ssize_t)sizeof(page));
    size_t n = 0;
    for (off_t off = 4096; pread(fd, page, sizeof(page), off) == (ssize_t)sizeof(page);
         off += 4096) {
        if (memcmp(page, "KVSR", 4) != 0 || strcmp((char *)page + 56, from) != 0)
            continue;
        memcpy(page + 56, to, len);
        memset(page + 40, 0, 4);
        put32le(page + 40, crc32c_sw(page, sizeof(page)));
        ck_assert_int_eq(pwrite(fd, page, sizeof(page), off), (ssize_t)sizeof(page));
        n++;
    }
    ck_assert_int_eq(fsync(fd), 0);
    close(fd);
    return n;
}

/* Records that name a namespace the name rule forbids (a space, '!': a
 * file changed by hand) are dropped at start and counted; no such
 * namespace appears (before: it was created, `kvshare stats` printed its
 * name as it was, and a request naming it was served). */
START_TEST(misnamed_records_are_dropped)
{
    start(NULL);
    kvs_client_t *c = harness_client(&h, "diskid", 0);
    fill(c, NULL);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    size_t renamed = rename_on_disk("default", "bad n!!");
    ck_assert_uint_ge(renamed, 12 * NB);
    pid_t pid = 0;
    ck_assert_int_eq(harness_restart(&h, POOL, flags(NULL), 30000, &pid), -1);
    h.pid = pid;
    harness_wait_restored(&h);
    c = harness_client(&h, "diskid", 0);
    kvs_stats_t s;
    ck_assert_int_eq(kvs_stats(c, &s), 0);
    for (size_t i = 0; i < s.n_namespaces; i++)
        ck_assert_msg(strcmp(s.namespaces[i].name, "bad n!!") != 0, "namespace made from disk");
    ck_assert_uint_eq(s.tier3_cached_blocks, 0);
    kvs_stats_free(&s);
    ck_assert_uint_ge(counter(KVS_COUNTER_disk_identity_dropped), renamed);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
}
END_TEST

static Suite *diskid_suite(void)
{
    Suite *s = suite_create("tier_disk_identity");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, other_model_restores_nothing);
    tcase_add_test(tc, same_model_restores);
    tcase_add_test(tc, clear_then_sigterm_stays_cleared);
    tcase_add_test(tc, clear_then_sigkill_stays_cleared);
    tcase_add_test(tc, evict_then_sigkill_stays_evicted);
    tcase_add_test(tc, declared_namespace_restored_to_its_model);
    tcase_add_test(tc, misnamed_records_are_dropped);
    tcase_add_test(tc, restart_serves_while_scanning);
    tcase_add_test(tc, evict_during_scan_stays_evicted);
    tcase_add_test(tc, clear_during_scan_stays_cleared);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(diskid_suite)
