/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier (disk.h) on a file in a temporary directory: CRC32C
 * against known values and across its two paths; the file's setup errors;
 * batches of writes and reads on io_uring and on the forced thread fallback;
 * the slot LRU; and the warm restart: records written before a close, a
 * SIGKILL in the middle of writes, torn slots and flipped bytes are found
 * again bitwise or not at all, never as wrong bytes.
 */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVS_UNDER_ASAN 1
#else
#define KVS_UNDER_ASAN 0
#endif

#include "check_main.h"
#include "crc32c.h"
#include "kvshare_status.h"
#include "log.h"
#include "metrics_text.h"
#include "kvshared.h"
#include "test_server.h"
#include "test_tmp.h"
#include "disk.h"
#include "store_disk_medium.h"

#define BLOCK  (12 * 1024) /* payload; the slot is 16 KiB: four sectors to tear */
#define TOKENS 16
#define GEO_ID 0x5eed

static char dir[256], path[300];

static void setup(void)
{
    log_level = LOG_LEVEL_ERROR;
    ck_assert_int_eq(test_tmp_dir("kvs-tier-disk", dir, sizeof(dir)), 0);
    snprintf(path, sizeof(path), "%s/tier3", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

static disk_config_t config(uint32_t slots, disk_io_t io)
{
    return (disk_config_t){.path = path,
                           .bytes = 4096 + (uint64_t)slots * 16384,
                           .block_bytes = BLOCK,
                           .block_tokens = TOKENS,
                           .geometry_id = GEO_ID,
                           .io = io,
                           .queue_depth = 32};
}

/* Opens; an io_uring that cannot start on this machine skips the caller. */
static disk_t *open_ok(const disk_config_t *cfg)
{
    disk_t *td = NULL;
    char err[256] = "";
    int rc = disk_open(cfg, &td, err, sizeof(err));
    ck_assert_msg(rc == 0, "open: %s", err);
    return td;
}

/* The deterministic content of block h: payload and tokens. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static void fill_block(uint64_t h, uint8_t *p)
{
    uint64_t s = mix(h + 1);
    for (size_t i = 0; i < BLOCK; i += 8) {
        s = mix(s);
        memcpy(p + i, &s, 8);
    }
}

static void fill_meta(uint64_t h, disk_meta_t *m, uint32_t *tokens)
{
    memset(m, 0, sizeof(*m));
    m->ns_id = (uint32_t)(h % 3) + 1;
    snprintf(m->ns, sizeof(m->ns), "ns-%u", m->ns_id);
    m->chain_hash = mix(h);
    m->ntokens = TOKENS - (uint32_t)(h % 4);
    for (uint32_t i = 0; i < m->ntokens; i++)
        tokens[i] = (uint32_t)(h * 100 + i);
    m->tokens = tokens;
}

/* A batch and its wait: done runs on a tier thread. */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
} waiter_t;

static void on_done(void *arg, disk_op_t *ops, size_t n)
{
    (void)ops;
    (void)n;
    waiter_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void run_batch(disk_t *td, bool write, disk_op_t *ops, size_t n)
{
    waiter_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    ck_assert_int_eq(disk_submit(td, write, ops, n, on_done, &w), 0);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
}

/* Op i's block in a buffer of n * BSTRIDE bytes: even ops on a page (the
 * tier's I/O goes in place), odd ones 64 bytes off (through its buffers). */
#define BSTRIDE (BLOCK + 4096)
static uint8_t *op_block(uint8_t *data, size_t i)
{
    return data + i * BSTRIDE + (i % 2 ? 64 : 0);
}

/* Writes blocks h0 .. h0+n-1 into slots[i]. */
static void write_blocks(disk_t *td, const uint32_t *slots, uint64_t h0, size_t n)
{
    disk_op_t *ops = calloc(n, sizeof(*ops));
    uint8_t *data = aligned_alloc(4096, n * BSTRIDE);
    uint32_t *tokens = malloc(n * TOKENS * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        fill_block(h0 + i, op_block(data, i));
        fill_meta(h0 + i, &ops[i].meta, tokens + i * TOKENS);
        ops[i].slot = slots[i];
        ops[i].data = op_block(data, i);
    }
    run_batch(td, true, ops, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ops[i].status, 0);
    free(ops);
    free(data);
    free(tokens);
}

/* Reads slots[i] expecting block h0+i; returns how many came back (each
 * checked bitwise); a read that fails through the tier's buffers leaves
 * its block untouched (one in place may hold anything). */
static size_t read_blocks(disk_t *td, const uint32_t *slots, uint64_t h0, size_t n)
{
    disk_op_t *ops = calloc(n, sizeof(*ops));
    uint8_t *data = aligned_alloc(4096, n * BSTRIDE), *want = malloc(BLOCK);
    uint32_t tokens[TOKENS];
    memset(data, 0xa5, n * BSTRIDE);
    for (size_t i = 0; i < n; i++) {
        fill_meta(h0 + i, &ops[i].meta, tokens);
        ops[i].meta.tokens = NULL;
        ops[i].slot = slots[i];
        ops[i].data = op_block(data, i);
    }
    run_batch(td, false, ops, n);
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].status == 0) {
            fill_block(h0 + i, want);
            ck_assert(memcmp(op_block(data, i), want, BLOCK) == 0);
            ok++;
        } else {
            ck_assert_int_eq(ops[i].status, KVS_ENOTFOUND);
            for (size_t j = 0; j < BLOCK && i % 2 == 1; j++)
                ck_assert_uint_eq(op_block(data, i)[j], 0xa5);
        }
    }
    free(ops);
    free(data);
    free(want);
    return ok;
}

/* --- CRC32C --- */

START_TEST(crc_known_values)
{
    /* The check value of CRC-32C, and RFC 3720's 32 zero bytes. */
    ck_assert_uint_eq(crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(crc32c_portable(0, "123456789", 9), 0xE3069283u);
    uint8_t z[32] = {0};
    ck_assert_uint_eq(crc32c(0, z, 32), 0x8A9136AAu);
    ck_assert_uint_eq(crc32c_portable(0, z, 32), 0x8A9136AAu);
    ck_assert_uint_eq(crc32c(0, "", 0), 0);
}
END_TEST

START_TEST(crc_paths_agree)
{
    uint8_t buf[4099];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)mix(i);
    size_t step = getenv("KVS_TEST_SMALL") ? 301 : 37; /* valgrind */
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len + off <= sizeof(buf); len += step) {
            uint32_t a = crc32c(0, buf + off, len);
            ck_assert_uint_eq(a, crc32c_portable(0, buf + off, len));
            size_t cut = len / 3;
            ck_assert_uint_eq(a, crc32c(crc32c(0, buf + off, cut), buf + off + cut, len - cut));
        }
}
END_TEST

/* crc32c_copy: the bytes copied and the CRC of what was read, short and
 * striped lengths, any alignment; crc32c_combine (and crc32c_combine_shift
 * with the length's factor) joins two CRCs as one pass over both buffers
 * would. */
START_TEST(crc_copy_and_combine)
{
    size_t max = 3 * 65536 + 77;
    uint8_t *src = malloc(max + 8), *dst = malloc(max + 8);
    ck_assert_ptr_nonnull(src);
    ck_assert_ptr_nonnull(dst);
    for (size_t i = 0; i < max + 8; i++)
        src[i] = (uint8_t)mix(i * 5 + 3);
    size_t lens[] = {0, 1, 7, 8, 63, 4095, 4096, 4097, 12289, 99999, 3 * 65536 + 70};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
        for (size_t off = 0; off < 3; off++) {
            size_t len = lens[k];
            memset(dst, 0xee, max + 8);
            uint32_t c = crc32c_copy(0x0badf00du, dst + 2 * off, src + off, len);
            ck_assert_uint_eq(c, crc32c_portable(0x0badf00du, src + off, len));
            ck_assert_int_eq(memcmp(dst + 2 * off, src + off, len), 0);
            ck_assert_uint_eq(dst[2 * off + len], 0xee); /* nothing past len */
            if (off > 0)
                ck_assert_uint_eq(dst[2 * off - 1], 0xee); /* nothing before */
            size_t cut = len / 3;
            uint32_t a = crc32c(0, src + off, cut), b = crc32c(0, src + off + cut, len - cut);
            ck_assert_uint_eq(crc32c_combine(a, b, len - cut), crc32c(0, src + off, len));
            ck_assert_uint_eq(crc32c_combine_shift(a, b, crc32c_shift(len - cut)),
                              crc32c(0, src + off, len));
        }
    free(src);
    free(dst);
}
END_TEST

/* Long buffers take the three-stripe path: the same CRC as the table. */
START_TEST(crc_long_buffers)
{
    size_t max = 3 * 65536 + 77;
    uint8_t *buf = malloc(max);
    for (size_t i = 0; i < max; i++)
        buf[i] = (uint8_t)mix(i * 7 + 1);
    size_t lens[] = {4095, 4096, 4097, 4100, 12288, 12289, 65536, 99999, 3 * 65536 + 70};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
        for (size_t off = 0; off < 3; off++) {
            ck_assert_uint_eq(crc32c(0, buf + off, lens[k]),
                              crc32c_portable(0, buf + off, lens[k]));
            ck_assert_uint_eq(crc32c(0x12345678u, buf + off, lens[k]),
                              crc32c_portable(0x12345678u, buf + off, lens[k]));
        }
    free(buf);
}
END_TEST

/* --- setup errors --- */

static int open_err(const disk_config_t *cfg, char *err, size_t len)
{
    disk_t *td = NULL;
    int rc = disk_open(cfg, &td, err, len);
    ck_assert_ptr_null(td);
    return rc;
}

START_TEST(bad_setup_is_named)
{
    char err[256];
    disk_config_t cfg = config(8, DISK_IO_AUTO);
    cfg.bytes = 8192;
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "disk_tier_bytes"));
    ck_assert_int_ne(access(path, F_OK), 0); /* nothing left behind */

    char missing[400];
    snprintf(missing, sizeof(missing), "%s/no-such-dir/tier3", dir);
    cfg = config(8, DISK_IO_AUTO);
    cfg.path = missing;
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "does not exist"));

    /* A file that is not a tier file. */
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "hello", 5), 5);
    close(fd);
    cfg = config(8, DISK_IO_AUTO);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "is refused: it is shorter than a superblock"));

    /* A read-only file, where permissions hold (not for root). */
    if (geteuid() != 0) {
        chmod(path, 0400);
        ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "cannot be opened for writing"));
        chmod(path, 0600);
    }
    ck_assert_int_eq(cfg.queue_depth, 32);
    cfg.queue_depth = 8;
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
}
END_TEST

START_TEST(other_geometry_refused_or_wiped)
{
    disk_config_t cfg = config(8, DISK_IO_AUTO);
    disk_t *td = open_ok(&cfg);
    uint32_t slots[2] = {0, 5};
    write_blocks(td, slots, 10, 2);
    disk_close(td);

    char err[256];
    cfg.geometry_id = GEO_ID + 1;
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "another block geometry"));
    ck_assert_ptr_nonnull(strstr(err, "disk_tier_wipe"));
    cfg = config(9, DISK_IO_AUTO);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "another disk_tier_bytes"));

    /* Another format version: the superblock's, with its CRC made right. */
    int fd = open(path, O_RDWR);
    uint8_t sb[52];
    ck_assert_int_eq(pread(fd, sb, sizeof(sb), 0), (ssize_t)sizeof(sb));
    sb[8] = DISK_FORMAT + 1;
    uint32_t c = crc32c(0, sb, 48);
    memcpy(sb + 48, &c, 4); /* little-endian host */
    ck_assert_int_eq(pwrite(fd, sb, sizeof(sb), 0), (ssize_t)sizeof(sb));
    close(fd);
    cfg = config(8, DISK_IO_AUTO);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "another format version"));

    cfg.wipe = true;
    td = open_ok(&cfg);
    /* One file, one owner. */
    disk_config_t again = cfg;
    again.wipe = false;
    ck_assert_int_eq(open_err(&again, err, sizeof(err)), KVS_EBUSY);
    ck_assert_ptr_nonnull(strstr(err, "in use by another process"));
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.recovered, 0);
    ck_assert_uint_eq(st.used, 0);
    disk_close(td);
    struct stat sbuf;
    ck_assert_int_eq(stat(path, &sbuf), 0);
    ck_assert_int_eq(sbuf.st_size, 4096 + 8 * 16384);
}
END_TEST

/* --- I/O --- */

static void roundtrip(disk_io_t io, const char *name)
{
    enum { N = 200 };
    disk_config_t cfg = config(N, io);
    disk_t *td = open_ok(&cfg);
    ck_assert_str_eq(disk_io_name(td), name);
    ck_assert_uint_eq(disk_capacity(td), N);
    ck_assert_uint_eq(disk_slot_bytes(td), 16384);
    uint32_t slots[N];
    for (uint32_t i = 0; i < N; i++)
        slots[i] = (i * 7) % N; /* scattered */
    write_blocks(td, slots, 1000, N);
    ck_assert_uint_eq(read_blocks(td, slots, 1000, N), N);
    /* Asking a slot for another block gets nothing. */
    ck_assert_uint_eq(read_blocks(td, slots, 5000, 10), 0);
    /* A never-written slot: nothing. */
    disk_close(td);
    unlink(path);
    cfg = config(N, io);
    td = open_ok(&cfg);
    ck_assert_uint_eq(read_blocks(td, slots, 1000, 4), 0);
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_str_eq(st.io, name);
    ck_assert_uint_eq(st.reads, 0);
    ck_assert_uint_eq(st.crc_failures, 0);
    disk_close(td);
}

/* Long runs of neighbouring small slots (512 B blocks: 4 KiB slots, up to
 * 256 of them in one merged I/O), ascending and descending, written and
 * read in batches longer than one merged I/O: every block comes back. */
#define SMALL 512u

static void small_batch(disk_t *td, bool write, const uint32_t *slots, size_t n, uint8_t *data)
{
    disk_op_t *ops = calloc(n, sizeof(*ops));
    uint32_t *tokens = malloc(n * TOKENS * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        fill_meta(slots[i], &ops[i].meta, tokens + i * TOKENS);
        if (!write)
            ops[i].meta.tokens = NULL;
        ops[i].slot = slots[i];
        ops[i].data = data + (size_t)slots[i] * SMALL;
    }
    run_batch(td, write, ops, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(ops[i].status == 0, "slot %u: %d", slots[i], ops[i].status);
    free(ops);
    free(tokens);
}

START_TEST(long_runs_of_small_slots)
{
    enum { N = 700, HALF = 400 };
    disk_config_t cfg = config(N, DISK_IO_AUTO);
    cfg.block_bytes = SMALL;
    cfg.bytes = 4096 + (uint64_t)N * 4096;
    disk_t *td = open_ok(&cfg);
    ck_assert_uint_eq(disk_slot_bytes(td), 4096);
    ck_assert_uint_eq(disk_capacity(td), N);
    uint8_t *data = malloc((size_t)N * SMALL), *got = malloc((size_t)N * SMALL);
    for (size_t i = 0; i < (size_t)N * SMALL; i++)
        data[i] = (uint8_t)mix(i / 8 + 7);
    uint32_t up[N], down[N];
    for (uint32_t i = 0; i < N; i++) {
        up[i] = i;
        down[i] = N - 1 - i;
    }
    small_batch(td, true, up, HALF, data);       /* 0 .. 399 ascending */
    small_batch(td, true, down, N - HALF, data); /* 699 .. 400 descending */
    memset(got, 0, (size_t)N * SMALL);
    small_batch(td, false, up, N, got);
    ck_assert(memcmp(got, data, (size_t)N * SMALL) == 0);
    memset(got, 0, (size_t)N * SMALL);
    small_batch(td, false, down, N, got);
    ck_assert(memcmp(got, data, (size_t)N * SMALL) == 0);
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.writes, N);
    ck_assert_uint_eq(st.reads, 2 * N);
    ck_assert_uint_eq(st.crc_failures, 0);
    free(data);
    free(got);
    disk_close(td);
}
END_TEST

START_TEST(roundtrip_io_uring)
{
    roundtrip(DISK_IO_URING, "io_uring");
}
END_TEST

START_TEST(roundtrip_threads_forced)
{
    roundtrip(DISK_IO_THREADS, "threads");
}
END_TEST

/* Reads with drain and no data: each verified block reaches drain from the
 * tier's own buffer, once, with its bytes; a slot that does not verify never
 * reaches it; a read with neither data nor drain is refused. */
typedef struct drained {
    pthread_mutex_t mu;
    uint8_t *into; /* N blocks, by drain_dst */
    unsigned calls[64];
    int fail_dst; /* drain of this dst fails; -1: none */
} drained_t;

static int drain_into(void *ctx, uint32_t dst, const void *src)
{
    drained_t *d = ctx;
    pthread_mutex_lock(&d->mu);
    d->calls[dst]++;
    pthread_mutex_unlock(&d->mu);
    if ((int)dst == d->fail_dst)
        return KVS_EIO;
    memcpy(d->into + (size_t)dst * BLOCK, src, BLOCK);
    return 0;
}

START_TEST(drain_from_the_tiers_buffer)
{
    enum { N = 40 };
    disk_io_t io = _i == 0 ? DISK_IO_URING : DISK_IO_THREADS;
    disk_config_t cfg = config(N, io);
    disk_t *td = open_ok(&cfg);
    uint32_t slots[N];
    for (uint32_t i = 0; i < N; i++)
        slots[i] = (i * 3) % N;
    write_blocks(td, slots, 7000, N);
    drained_t d = {PTHREAD_MUTEX_INITIALIZER, malloc((size_t)N * BLOCK), {0}, 5};
    memset(d.into, 0xa5, (size_t)N * BLOCK);
    disk_op_t ops[N];
    uint32_t tokens[TOKENS];
    memset(ops, 0, sizeof(ops));
    for (uint32_t i = 0; i < N; i++) {
        fill_meta(7000 + i, &ops[i].meta, tokens);
        ops[i].meta.tokens = NULL;
        ops[i].slot = slots[i];
        ops[i].drain = drain_into;
        ops[i].drain_ctx = &d;
        ops[i].drain_dst = i;
    }
    ops[9].meta.chain_hash ^= 1; /* asks slot 9's for another block */
    run_batch(td, false, ops, N);
    uint8_t *want = malloc(BLOCK);
    for (uint32_t i = 0; i < N; i++) {
        uint8_t *got = d.into + (size_t)i * BLOCK;
        if (i == 9) {
            ck_assert_int_eq(ops[i].status, KVS_ENOTFOUND);
            ck_assert_uint_eq(d.calls[i], 0);
            ck_assert_uint_eq(got[0], 0xa5);
        } else if (i == 5) {
            ck_assert_int_eq(ops[i].status, KVS_EIO);
            ck_assert_uint_eq(d.calls[i], 1);
        } else {
            ck_assert_int_eq(ops[i].status, 0);
            ck_assert_uint_eq(d.calls[i], 1);
            fill_block(7000 + i, want);
            ck_assert(memcmp(got, want, BLOCK) == 0);
        }
    }
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.reads, N - 2);
    ck_assert_uint_eq(st.mismatches, 1);
    ck_assert_uint_eq(st.io_errors, 1);
    /* Neither data nor drain: refused, nothing queued. */
    ops[0].drain = NULL;
    ck_assert_int_eq(disk_submit(td, false, ops, 1, on_done, NULL), KVS_EINVAL);
    free(want);
    free(d.into);
    disk_close(td);
}
END_TEST

/* Many batches from several threads at once, overlapping in the queue. */
typedef struct hammer {
    disk_t *td;
    uint32_t base;
    int rounds;
} hammer_t;

static void *hammer_main(void *arg)
{
    hammer_t *h = arg;
    uint32_t slots[16];
    for (int round = 0; round < h->rounds; round++) {
        for (uint32_t i = 0; i < 16; i++)
            slots[i] = h->base + i;
        write_blocks(h->td, slots, (uint64_t)h->base * 1000 + (uint64_t)round * 16, 16);
        ck_assert_uint_eq(
            read_blocks(h->td, slots, (uint64_t)h->base * 1000 + (uint64_t)round * 16, 16), 16);
    }
    return NULL;
}

START_TEST(concurrent_batches)
{
    disk_io_t io = _i == 0 ? DISK_IO_URING : DISK_IO_THREADS;
    disk_config_t cfg = config(64, io);
    disk_t *td = open_ok(&cfg);
    pthread_t t[4];
    hammer_t h[4];
    int rounds = getenv("KVS_TEST_SMALL") ? 2 : 10; /* valgrind */
    for (int k = 0; k < 4; k++) {
        h[k] = (hammer_t){td, (uint32_t)k * 16, rounds};
        pthread_create(&t[k], NULL, hammer_main, &h[k]);
    }
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.writes, 4 * (uint64_t)rounds * 16);
    ck_assert_uint_eq(st.reads, 4 * (uint64_t)rounds * 16);
    ck_assert_uint_eq(st.io_errors, 0);
    disk_close(td);
}
END_TEST

/* --- slots --- */

START_TEST(slot_lru)
{
    disk_config_t cfg = config(4, DISK_IO_THREADS);
    disk_t *td = open_ok(&cfg);
    bool ev;
    uint32_t s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = disk_slot_alloc(td, &ev);
        ck_assert(!ev);
        ck_assert(disk_slot_used(td, s[i]));
    }
    ck_assert_uint_eq(s[0], 0);
    disk_slot_touch(td, s[0]); /* s[1] is now the least recent */
    ck_assert_uint_eq(disk_slot_alloc(td, &ev), s[1]);
    ck_assert(ev);
    disk_slot_free(td, s[2]);
    ck_assert(!disk_slot_used(td, s[2]));
    ck_assert_uint_eq(disk_slot_alloc(td, &ev), s[2]);
    ck_assert(!ev);
    ck_assert_uint_eq(disk_slot_alloc(td, &ev), s[3]);
    ck_assert(ev);
    /* A slot chosen by the caller leaves the free stack. */
    disk_slot_free(td, 1);
    disk_slot_free(td, 3);
    disk_slot_claim(td, 1);
    ck_assert(disk_slot_used(td, 1));
    ck_assert_uint_eq(disk_slot_alloc(td, &ev), 3);
    ck_assert(!ev);
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.evictions, 2);
    ck_assert_uint_eq(disk_slot_alloc(td, &ev), s[0]); /* least recent now */
    ck_assert(ev);
    ck_assert_uint_eq(st.used, 4);
    disk_close(td);
}
END_TEST

/* --- warm restart --- */

/* Reopens the file, checks every recovered record against the block its
 * chain hash names (h is the record's tokens[0] / 100), bitwise through a
 * read, and returns the scan. */
static void reopen_and_verify(disk_t **tdp, disk_scan_t *sc, disk_io_t io, uint32_t nslots)
{
    disk_config_t cfg = config(nslots, io);
    *tdp = open_ok(&cfg);
    disk_take_scan(*tdp, sc);
    for (size_t i = 0; i < sc->n; i++) {
        disk_record_t *r = &sc->recs[i];
        uint64_t h = r->tokens[0] / 100;
        disk_meta_t m;
        uint32_t tokens[TOKENS];
        fill_meta(h, &m, tokens);
        ck_assert_uint_eq(r->chain_hash, m.chain_hash);
        ck_assert_uint_eq(r->ns_id, m.ns_id);
        ck_assert_str_eq(r->ns, m.ns);
        ck_assert_uint_eq(r->ntokens, m.ntokens);
        ck_assert(memcmp(r->tokens, tokens, m.ntokens * sizeof(uint32_t)) == 0);
        ck_assert(disk_slot_used(*tdp, r->slot));
        ck_assert_uint_eq(read_blocks(*tdp, &r->slot, h, 1), 1);
        if (i > 0)
            ck_assert_uint_lt(sc->recs[i - 1].seq, r->seq);
    }
}

START_TEST(restart_finds_records)
{
    disk_config_t cfg = config(32, DISK_IO_AUTO);
    disk_t *td = open_ok(&cfg);
    uint32_t slots[20];
    for (uint32_t i = 0; i < 20; i++)
        slots[i] = i + 5;
    write_blocks(td, slots, 100, 20);
    /* Block 103 again, into another slot: the newer record wins. */
    uint32_t again = 30;
    write_blocks(td, &again, 103, 1);
    disk_close(td);

    disk_scan_t sc;
    reopen_and_verify(&td, &sc, DISK_IO_AUTO, 32);
    ck_assert_uint_eq(sc.n, 20);
    ck_assert_uint_eq(sc.stale, 1);
    ck_assert_uint_eq(sc.torn, 0);
    ck_assert_uint_eq(sc.recs[sc.n - 1].slot, 30); /* newest last */
    ck_assert(!disk_slot_used(td, 8));             /* the stale copy's slot is free */
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.recovered, 20);
    ck_assert_uint_eq(st.used, 20);
    /* Sequence numbers go on from the newest found. */
    uint32_t s = 0;
    write_blocks(td, &s, 999, 1);
    disk_close(td);
    disk_scan_free(&sc);
    reopen_and_verify(&td, &sc, DISK_IO_AUTO, 32);
    ck_assert_uint_eq(sc.n, 21);
    ck_assert_uint_eq(sc.recs[sc.n - 1].slot, 0);
    disk_scan_free(&sc);
    disk_close(td);
}
END_TEST

/* Format 4: the namespace table names each namespace's identity and
 * survives a reopen; a namespace deleted (Clear) loses every record written
 * before, in flight or not, a tombstoned slot (Evict) its record, and what
 * is written after either is found again; sequence numbers never fall back
 * under a watermark, even when no record of above it is left. */
START_TEST(deletions_and_identities_survive_reopen)
{
    disk_config_t cfg = config(32, DISK_IO_AUTO);
    disk_t *td = open_ok(&cfg);
    const char *text[3] = {"kvs-id1 model=a", "kvs-id1 model=b", "kvs-id1 model=c"};
    for (uint32_t k = 0; k < 3; k++) {
        char ns[16];
        snprintf(ns, sizeof(ns), "ns-%u", k + 1);
        ck_assert_int_eq(disk_ns_note(td, ns, 11 * (k + 1), k, text[k], NULL, 0), 0);
    }
    uint32_t slots[20];
    for (uint32_t i = 0; i < 20; i++)
        slots[i] = i + 5;
    write_blocks(td, slots, 100, 20); /* ns-2: 100, 103, ..., 118 (7 blocks) */
    ck_assert_int_eq(disk_ns_delete(td, "ns-2", 22, 1, text[1], NULL, 0), 0);
    uint32_t tomb = 7; /* block 102, of ns-1 */
    ck_assert_int_eq(disk_forget(td, &tomb, 1, NULL, 0), 0);
    uint32_t after = 30;
    write_blocks(td, &after, 202, 1); /* ns-2, after its Clear */
    disk_close(td);

    disk_scan_t sc;
    reopen_and_verify(&td, &sc, DISK_IO_AUTO, 32);
    ck_assert_uint_eq(sc.n, 20 - 7 - 1 + 1);
    ck_assert_uint_eq(sc.deleted, 8);
    ck_assert(!disk_slot_used(td, 5)); /* block 100 (ns-2): deleted, free */
    ck_assert(!disk_slot_used(td, tomb));
    for (size_t i = 0; i < sc.n; i++) {
        disk_ns_t en;
        ck_assert_int_eq(disk_ns_get(td, sc.recs[i].entry, &en), 0);
        ck_assert_str_eq(en.ns, sc.recs[i].ns);
        uint32_t k = (uint32_t)(en.ns[3] - '1');
        ck_assert_uint_eq(en.ident_hash, 11 * (k + 1));
        ck_assert_uint_eq(en.source, k);
        ck_assert_str_eq(en.ident, text[k]);
        ck_assert_uint_ge(sc.recs[i].seq, en.valid_from);
    }
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.deleted, 8);
    disk_scan_free(&sc);

    /* Everything of ns-2 cleared again: the newest sequence number left is
     * below the watermark, yet a block written next is alive. */
    ck_assert_int_eq(disk_ns_delete(td, "ns-2", 22, 1, text[1], NULL, 0), 0);
    disk_close(td);
    reopen_and_verify(&td, &sc, DISK_IO_AUTO, 32);
    ck_assert_uint_eq(sc.n, 12);
    disk_scan_free(&sc);
    write_blocks(td, &after, 205, 1);
    disk_close(td);
    reopen_and_verify(&td, &sc, DISK_IO_AUTO, 32);
    ck_assert_uint_eq(sc.n, 13);
    /* Another identity noted for ns-1 deletes its older records. */
    ck_assert_int_eq(disk_ns_note(td, "ns-1", 99, 0, "kvs-id1 model=z", NULL, 0), 0);
    disk_scan_free(&sc);
    disk_close(td);
    reopen_and_verify(&td, &sc, DISK_IO_AUTO, 32);
    for (size_t i = 0; i < sc.n; i++)
        ck_assert_str_ne(sc.recs[i].ns, "ns-1");
    disk_scan_free(&sc);
    disk_close(td);
}
END_TEST

/* A child writes batches over and over (each batch overwrites slots with new
 * blocks) and is SIGKILLed in the middle; then some slots are torn by hand
 * (a new record's first sector over an old record). The reopened file
 * serves every verifying record bitwise and nothing of a torn slot. */
START_TEST(sigkill_mid_writes)
{
    enum { NS = 64 };
    disk_io_t io = _i == 0 ? DISK_IO_AUTO : DISK_IO_THREADS;
    disk_config_t cfg = config(NS, io);
    disk_t *td = open_ok(&cfg);
    disk_close(td);
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        td = open_ok(&cfg);
        uint32_t slots[NS];
        for (uint64_t round = 0;; round++) {
            for (uint32_t i = 0; i < NS; i++)
                slots[i] = (uint32_t)((i * 5 + round) % NS);
            write_blocks(td, slots, 10000 + round * NS, NS);
            if (round == 3 && write(pfd[1], "x", 1) != 1)
                _exit(2);
        }
    }
    close(pfd[1]);
    char c;
    ck_assert_int_eq(read(pfd[0], &c, 1), 1);
    usleep(2000); /* into the next batches */
    kill(pid, SIGKILL);
    int wst;
    ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
    ck_assert(WIFSIGNALED(wst));
    close(pfd[0]);

    disk_scan_t sc;
    reopen_and_verify(&td, &sc, io, NS);
    ck_assert_uint_ge(sc.n, NS / 2); /* at least four whole rounds were written */
    size_t before = sc.n;
    uint64_t torn_before = sc.torn;
    /* Tear 8 valid slots: the first sector of another block's record. */
    uint8_t *rec = aligned_alloc(4096, 16384);
    uint32_t tokens[TOKENS];
    disk_meta_t m;
    uint8_t *payload = malloc(BLOCK);
    int fd = open(path, O_RDWR);
    uint32_t torn_slots[8];
    for (int k = 0; k < 8; k++) {
        torn_slots[k] = sc.recs[k * 3].slot;
        fill_meta(777 + (uint64_t)k, &m, tokens);
        m.seq = sc.recs[sc.n - 1].seq + 1 + (uint64_t)k;
        fill_block(777 + (uint64_t)k, payload);
        disk_encode(td, rec, torn_slots[k], &m, payload);
        ck_assert_int_eq(pwrite(fd, rec, 4096, 4096 + (off_t)torn_slots[k] * 16384), 4096);
    }
    close(fd);
    disk_close(td);
    disk_scan_free(&sc);
    reopen_and_verify(&td, &sc, io, NS);
    ck_assert_uint_eq(sc.torn, torn_before + 8);
    /* A torn slot's old block is gone too (its record no longer verifies);
     * another copy of a block may survive elsewhere only if it was stale. */
    ck_assert_uint_le(sc.n, before - 8 + sc.stale);
    for (size_t i = 0; i < sc.n; i++)
        for (int k = 0; k < 8; k++)
            ck_assert_uint_ne(sc.recs[i].slot, torn_slots[k]);
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.torn, sc.torn);
    free(rec);
    free(payload);
    disk_scan_free(&sc);
    disk_close(td);
}
END_TEST

/* Random bytes flipped in random slots of a closed file: no flipped slot is
 * recovered or read, every other one is. */
START_TEST(flipped_bytes_never_pass)
{
    enum { NS = 48 };
    disk_config_t cfg = config(NS, DISK_IO_AUTO);
    disk_t *td = open_ok(&cfg);
    uint32_t slots[NS];
    for (uint32_t i = 0; i < NS; i++)
        slots[i] = i;
    write_blocks(td, slots, 500, NS);
    disk_close(td);

    srand(12345);
    bool flipped[NS] = {false};
    int fd = open(path, O_RDWR);
    for (uint32_t s = 0; s < NS; s++) {
        if (rand() % 2)
            continue;
        flipped[s] = true;
        int nflips = 1 + rand() % 3;
        for (int k = 0; k < nflips; k++) {
            off_t off = 4096 + (off_t)s * 16384 + rand() % 16384;
            uint8_t b;
            ck_assert_int_eq(pread(fd, &b, 1, off), 1);
            b ^= (uint8_t)(1 + rand() % 255);
            ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
        }
    }
    close(fd);

    disk_scan_t sc;
    reopen_and_verify(&td, &sc, DISK_IO_AUTO, NS);
    size_t nflipped = 0;
    for (uint32_t s = 0; s < NS; s++)
        nflipped += flipped[s];
    ck_assert_uint_gt(nflipped, 0);
    ck_assert_uint_eq(sc.n, NS - nflipped);
    ck_assert_uint_eq(sc.torn, nflipped);
    for (size_t i = 0; i < sc.n; i++)
        ck_assert(!flipped[sc.recs[i].slot]);
    /* Read directly, a flipped slot fails its CRC and is counted. */
    for (uint32_t s = 0; s < NS; s++)
        ck_assert_uint_eq(read_blocks(td, &s, 500 + s, 1), flipped[s] ? 0 : 1);
    disk_stats_t st;
    disk_stats(td, &st);
    ck_assert_uint_eq(st.crc_failures, nflipped);
    disk_scan_free(&sc);
    disk_close(td);
}
END_TEST

/* --- the tier medium --- */

enum { MB = 8 }; /* "pool" blocks of the fake source */
static uint8_t *src_blocks;
static uint32_t src_tokens[MB][TOKENS];

static void *src_block(void *arg, uint32_t id)
{
    (void)arg;
    return src_blocks + (size_t)id * BLOCK;
}

static void src_meta(void *arg, uint32_t id, disk_meta_t *out)
{
    (void)arg;
    fill_meta(id, out, src_tokens[id]);
}

typedef struct medium_res {
    int calls;
    tier_medium_result_t res;
} medium_res_t;

static void medium_done(void *arg, const tier_medium_result_t *res)
{
    medium_res_t *r = arg;
    r->calls++;
    r->res = *res;
}

static medium_res_t medium_run(uv_loop_t *loop, tier_medium_t *m, bool put, const uint32_t *ids,
                               const uint32_t *slots, size_t n)
{
    medium_res_t r = {0};
    int rc = put ? m->ops->put(m, ids, slots, n, medium_done, &r)
                 : m->ops->get(m, ids, slots, n, medium_done, &r);
    ck_assert_int_eq(rc, 0);
    while (r.calls == 0)
        uv_run(loop, UV_RUN_ONCE);
    ck_assert_int_eq(r.calls, 1);
    return r;
}

START_TEST(medium_put_get_drop)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    disk_config_t cfg = config(16, _i == 0 ? DISK_IO_URING : DISK_IO_THREADS);
    disk_t *td = open_ok(&cfg);
    src_blocks = malloc((size_t)MB * BLOCK);
    for (uint32_t id = 0; id < 4; id++)
        fill_block(id, src_blocks + (size_t)id * BLOCK);
    store_disk_source_t src = {.block = src_block, .meta = src_meta};
    tier_medium_t *m;
    ck_assert_int_eq(store_disk_medium_open(&loop, td, &src, &m), 0);
    ck_assert_uint_eq(m->capacity, 16);
    ck_assert_str_eq(m->ops->name, "disk");

    uint32_t ids[4] = {0, 1, 2, 3}, slots[4] = {9, 3, 12, 0};
    ck_assert_int_eq(medium_run(&loop, m, true, ids, slots, 4).res.status, 0);
    ck_assert(disk_slot_used(td, 9) && disk_slot_used(td, 0));
    /* Back into blocks 4..7 (ids 0..3's bytes, as promotions do). */
    uint32_t back[4] = {4, 5, 6, 7};
    memset(src_blocks + 4 * BLOCK, 0, 4 * BLOCK);
    medium_res_t r = medium_run(&loop, m, false, back, slots, 4);
    ck_assert_int_eq(r.res.status, 0);
    ck_assert(!r.res.fatal);
    ck_assert(memcmp(src_blocks, src_blocks + 4 * BLOCK, 4 * BLOCK) == 0);

    /* Dropped: a get of the slot misses, not fatal. */
    m->ops->drop(m, &slots[1], 1);
    ck_assert(!disk_slot_used(td, 3));
    r = medium_run(&loop, m, false, back, slots, 2);
    ck_assert_int_eq(r.res.status, KVS_ENOTFOUND);
    ck_assert(!r.res.fatal);
    /* A slot overwritten on disk behind the medium's back: a miss. */
    int fd = open(path, O_RDWR);
    uint8_t junk = 0x5a;
    ck_assert_int_eq(pwrite(fd, &junk, 1, 4096 + 12 * 16384 + 5000), 1);
    close(fd);
    r = medium_run(&loop, m, false, &back[2], &slots[2], 1);
    ck_assert_int_eq(r.res.status, KVS_ENOTFOUND);
    tier_medium_stats_t st;
    m->ops->stats(m, &st);
    ck_assert_uint_eq(st.puts, 1);
    ck_assert_uint_eq(st.gets, 3);
    ck_assert_uint_eq(st.blocks, 8);
    ck_assert_uint_eq(st.failures, 2);
    disk_stats_t ds;
    disk_stats(td, &ds);
    ck_assert_uint_eq(ds.crc_failures, 1);
    tier_medium_close(m);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    disk_close(td);
    free(src_blocks);
}
END_TEST

/* An Evict's deletion looks at the slots of its own blocks' records, not at
 * every slot (before: one probe per slot of the file, on the loop, about
 * 5 ms per million slots). The buckets are keyed at random per process, so
 * a hash's bucket may also hold another block's record: what is looked at
 * is bounded by the records on the disk (each hash's bucket walked once),
 * never by the file's 64 slots. */
START_TEST(evict_looks_only_at_its_blocks)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    disk_config_t cfg = config(64, DISK_IO_THREADS);
    disk_t *td = open_ok(&cfg);
    src_blocks = malloc((size_t)MB * BLOCK);
    for (uint32_t id = 0; id < 4; id++)
        fill_block(id, src_blocks + (size_t)id * BLOCK);
    store_disk_source_t src = {.block = src_block, .meta = src_meta};
    tier_medium_t *m;
    ck_assert_int_eq(store_disk_medium_open(&loop, td, &src, &m), 0);
    uint32_t ids[4] = {0, 1, 2, 3}, slots[4] = {40, 3, 12, 63};
    ck_assert_int_eq(medium_run(&loop, m, true, ids, slots, 4).res.status, 0);
    /* Block 1's record again in slot 20 (a block that moved up and down). */
    uint32_t again = 20;
    ck_assert_int_eq(medium_run(&loop, m, true, &ids[1], &again, 1).res.status, 0);

    disk_meta_t meta;
    uint32_t tokens[TOKENS];
    uint64_t hashes[3];
    fill_meta(1, &meta, tokens);
    hashes[0] = meta.chain_hash;
    fill_meta(7, &meta, tokens); /* on no slot */
    hashes[1] = meta.chain_hash;
    hashes[2] = hashes[0]; /* twice: once */
    size_t k = 0, looked = 0;
    ck_assert_int_eq(store_disk_medium_forget(m, hashes, 3, &k, &looked), 0);
    ck_assert_uint_eq(k, 2); /* slots 3 and 20 */
    /* two hashes (the third a repeat); five records on the disk */
    ck_assert_uint_ge(looked, 2);
    ck_assert_uint_le(looked, 2 * 5);
    /* Gone: a second forget finds nothing; the others stay. */
    ck_assert_int_eq(store_disk_medium_forget(m, hashes, 1, &k, &looked), 0);
    ck_assert_uint_eq(k, 0);
    fill_meta(2, &meta, tokens);
    ck_assert_int_eq(store_disk_medium_forget(m, &meta.chain_hash, 1, &k, &looked), 0);
    ck_assert_uint_eq(k, 1);
    /* its own record, and those of blocks 0 and 3 if they share its bucket */
    ck_assert_uint_ge(looked, 1);
    ck_assert_uint_le(looked, 3);
    tier_medium_close(m);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    disk_close(td);
    free(src_blocks);
}
END_TEST

/* --- the file's path: nobody else's doing --- */

/* A file made beforehand with a mode others can write, a symbolic link, a
 * directory others can write, a FIFO: refused, naming owner and mode, and
 * what is behind a link is left as it was, wipe or not (before: a 0666
 * file was used as it was; a link was followed, its target formatted or
 * wiped). */
START_TEST(path_of_someone_else_is_refused)
{
    char err[512];
    disk_config_t cfg = config(8, DISK_IO_THREADS);

    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(chmod(path, 0666), 0);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "mode 0666") && strstr(err, "owner uid") &&
                      strstr(err, "writable by every user"),
                  "%s", err);
    ck_assert_int_eq(disk_check_path(path, geteuid(), err, sizeof(err)), KVS_EDENIED);
    ck_assert_int_eq(chmod(path, 0620), 0);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "writable by its group"), "%s", err);
    unlink(path);

    /* A link to an empty file and to a file of data: neither is touched. */
    char target[400];
    snprintf(target, sizeof(target), "%s/target", dir);
    for (int wipe = 0; wipe <= 1; wipe++)
        for (int data = 0; data <= 1; data++) {
            fd = open(target, O_CREAT | O_TRUNC | O_WRONLY, 0600);
            ck_assert_int_ge(fd, 0);
            if (data)
                ck_assert_int_eq(write(fd, "root's own", 10), 10);
            close(fd);
            ck_assert_int_eq(symlink(target, path), 0);
            cfg.wipe = wipe;
            ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
            ck_assert_msg(strstr(err, "symbolic link"), "%s", err);
            struct stat st;
            ck_assert_int_eq(stat(target, &st), 0);
            ck_assert_int_eq(st.st_size, data ? 10 : 0);
            unlink(path);
        }
    unlink(target);
    cfg.wipe = false;

    /* A FIFO: refused by its type at once, never waited on. */
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    alarm(10);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EINVAL);
    alarm(0);
    ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
    unlink(path);

    /* The directory: others may write it (not sticky), then its parent. */
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "the directory") && strstr(err, "mode 0777"), "%s", err);
    ck_assert_int_ne(access(path, F_OK), 0); /* nothing made there */
    ck_assert_int_eq(chmod(dir, 01777), 0);  /* sticky, like /tmp: ours stays ours */
    disk_t *td = open_ok(&cfg);
    disk_close(td);
    unlink(path);
    char sub[400], deep[500];
    snprintf(sub, sizeof(sub), "%s/sub", dir);
    snprintf(deep, sizeof(deep), "%s/tier3", sub);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    ck_assert_int_eq(chmod(dir, 0757), 0);
    cfg.path = deep;
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, dir) && strstr(err, "mode 0757"), "%s", err);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    td = open_ok(&cfg);
    disk_close(td);
    unlink(deep);
    rmdir(sub);
}
END_TEST

/* Files and links of another user (as root only: chown needs it). The
 * root daemon's case of the finding: a file made beforehand by uid 65534
 * in a sticky shared directory, rewritten by its owner while kvshared ran. */
START_TEST(path_of_another_user_is_refused)
{
    if (geteuid() != 0)
        return; /* needs chown: a skip here */
    char err[512];
    disk_config_t cfg = config(8, DISK_IO_THREADS);
    ck_assert_int_eq(chmod(dir, 01777), 0);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(chown(path, 65534, 65534), 0);
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "owner uid 65534") && strstr(err, "kvshared's uid 0"), "%s", err);
    /* --check-config as root: owners are start's to check. */
    ck_assert_int_eq(disk_check_path(path, DISK_ANY_UID, err, sizeof(err)), 0);
    unlink(path);

    /* A link of uid 65534 on the way to the directory. */
    char sub[400], link[400], via[500];
    snprintf(sub, sizeof(sub), "%s/real", dir);
    snprintf(link, sizeof(link), "%s/link", dir);
    snprintf(via, sizeof(via), "%s/tier3", link);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    ck_assert_int_eq(symlink(sub, link), 0);
    ck_assert_int_eq(lchown(link, 65534, 65534), 0);
    cfg.path = via;
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "symbolic link of uid 65534"), "%s", err);
    ck_assert_int_eq(lchown(link, 0, 0), 0); /* root's own link: followed */
    disk_t *td = open_ok(&cfg);
    disk_close(td);
    unlink(via);
    unlink(link);

    /* A directory of uid 65534. */
    ck_assert_int_eq(chown(sub, 65534, 65534), 0);
    char in_sub[500];
    snprintf(in_sub, sizeof(in_sub), "%s/tier3", sub);
    cfg.path = in_sub;
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "the directory") && strstr(err, "owner uid 65534"), "%s", err);
    rmdir(sub);
    ck_assert_int_eq(chmod(dir, 0700), 0);
}
END_TEST

/* Another process's lock on the file is named: pid, command, uid (before:
 * "in use by another process"). */
START_TEST(foreign_lock_is_named)
{
    disk_config_t cfg = config(8, DISK_IO_THREADS);
    disk_close(open_ok(&cfg));
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(path, O_RDONLY);
        if (fd < 0 || flock(fd, LOCK_EX) != 0)
            _exit(1);
        (void)!write(ready[1], "x", 1);
        pause();
        _exit(0);
    }
    char c;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    char err[512], want[64];
    ck_assert_int_eq(open_err(&cfg, err, sizeof(err)), KVS_EBUSY);
    snprintf(want, sizeof(want), "held by pid %d", (int)pid);
    ck_assert_msg(strstr(err, "in use by another process") && strstr(err, want) &&
                      strstr(err, "uid "),
                  "%s", err);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(ready[0]);
    close(ready[1]);
}
END_TEST

/* kvshared's start: the file is made, then refused for another geometry
 * (the error names the setting) unless disk_tier_wipe. */
static int start_server(const geometry_t *g, bool wipe, char *err, size_t len)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    server_config_t cfg;
    test_server_config(&cfg, g->block_tokens, 4);
    cfg.geometry = *g;
    cfg.host_tier_bytes = 4 * geometry_block_bytes(g); /* the disk tier hangs below it */
    cfg.disk_tier_path = path;
    cfg.disk_tier_bytes = 1 << 20;
    cfg.disk_tier_wipe = wipe;
    cfg.disk_tier_io = DISK_IO_THREADS;
    server_t *srv = NULL;
    int rc = server_open(&cfg, &loop, &srv, err, len);
    if (rc == 0) {
        ck_assert_ptr_nonnull(srv->disk_tier);
        ck_assert_uint_gt(disk_capacity(srv->disk_tier), 0);
        char *text = NULL;
        size_t len = 0;
        ck_assert_int_eq(metrics_render(srv, &text, &len), 0);
        ck_assert_ptr_nonnull(strstr(text, "kvshare_tier3_info{io=\"threads\"} 1\n"));
        ck_assert_ptr_nonnull(strstr(text, "kvshare_tier3_slots{state=\"used\"} 0\n"));
        ck_assert_ptr_nonnull(strstr(text, "kvshare_tier3_recovered_blocks 0\n"));
        free(text);
        server_free(srv);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    return rc;
}

/* The line of /proc/self/smaps' entry for the mapping holding p that
 * starts with field (e.g. "THPeligible:"), into out; false if none. */
static bool smaps_field(const void *p, const char *field, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return false;
    char line[512];
    bool in = false, found = false;
    uintptr_t a = (uintptr_t)p;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            in = a >= lo && a < hi;
        else if (in && strncmp(line, field, strlen(field)) == 0) {
            snprintf(out, len, "%s", line);
            found = true;
        }
    }
    fclose(f);
    return found;
}

START_TEST(io_buffers_ask_for_huge_pages)
{
    const size_t huge = 2u << 20, big = 5 * huge + 12345, small = 12 * 1024;
    uint8_t *p = disk_buffer_alloc(big), *q = disk_buffer_alloc(small);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(q);
    ck_assert_uint_eq((uintptr_t)p % huge, 0);
    ck_assert_uint_eq((uintptr_t)q % DISK_ALIGN, 0);
    memset(p, 0xa5, big);
    memset(q, 0x5a, small);
    ck_assert_uint_eq(p[big - 1], 0xa5);
    /* Where THP can back what asks for it, the kernel says the mapping is
     * eligible (valgrind's and ASan's allocators map memory their own way:
     * the check is for the plain build). */
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "", line[512] = "";
    if (f) {
        if (!fgets(mode, sizeof(mode), f))
            mode[0] = 0;
        fclose(f);
    }
    bool thp = strstr(mode, "[always]") || strstr(mode, "[madvise]");
    if (!thp)
        fprintf(stderr,
                "io_buffers_ask_for_huge_pages: THP eligibility not checked: THP is "
                "off here (transparent_hugepage/enabled: %s)\n",
                mode[0] ? mode : "unreadable");
    else if (RUNNING_ON_VALGRIND || KVS_UNDER_ASAN)
        fprintf(stderr, "io_buffers_ask_for_huge_pages: THP eligibility not checked under a "
                        "sanitizer's or valgrind's allocator\n");
    else if (!smaps_field(p, "THPeligible:", line, sizeof(line)))
        fprintf(stderr, "io_buffers_ask_for_huge_pages: THP eligibility not checked: this "
                        "kernel's /proc/self/smaps has no THPeligible field\n");
    else
        ck_assert_msg(strstr(line, "1") != NULL, "not eligible for THP: %s", line);
    free(p);
    free(q);
}
END_TEST

START_TEST(server_opens_and_checks)
{
    geometry_t g = TEST_GEOMETRY(4);
    char err[256] = "";
    ck_assert_int_eq(start_server(&g, false, err, sizeof(err)), 0);
    ck_assert_int_eq(start_server(&g, false, err, sizeof(err)), 0);
    g.layers = 3;
    ck_assert_int_eq(start_server(&g, false, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "disk_tier_path"));
    ck_assert_ptr_nonnull(strstr(err, "another block geometry"));
    ck_assert_int_eq(start_server(&g, true, err, sizeof(err)), 0);
}
END_TEST

/* The library logs nothing: what an operator should hear at an open (a
 * file others can read, a file wiped) reaches the caller's note function
 * on the caller's thread, in the words kvshared logs. */
typedef struct notes {
    int n;
    disk_note_level_t level[8];
    char text[8][DISK_NOTE_MAX];
} notes_t;

static void keep_note(void *arg, disk_note_level_t level, const char *text)
{
    notes_t *nt = arg;
    if (nt->n < 8) {
        nt->level[nt->n] = level;
        snprintf(nt->text[nt->n], sizeof(nt->text[0]), "%s", text);
    }
    nt->n++;
}

START_TEST(notes_reach_the_caller)
{
    notes_t nt = {0};
    disk_config_t cfg = config(8, DISK_IO_THREADS);
    cfg.note = keep_note;
    cfg.note_arg = &nt;
    disk_t *td = open_ok(&cfg);
    disk_notes_flush(td);
    disk_close(td);
    ck_assert_int_eq(nt.n, 0); /* a new file of this process's, 0600 */

    ck_assert_int_eq(chmod(path, 0640), 0);
    cfg.geometry_id = GEO_ID + 1;
    cfg.wipe = true;
    td = open_ok(&cfg);
    ck_assert_int_eq(nt.n, 2);
    ck_assert_int_eq(nt.level[0], DISK_NOTE_WARN);
    ck_assert_msg(strstr(nt.text[0], "mode 0640") && strstr(nt.text[0], "can be read by its group"),
                  "%s", nt.text[0]);
    ck_assert_int_eq(nt.level[1], DISK_NOTE_WARN);
    ck_assert_msg(strstr(nt.text[1], "another block geometry; wiping it (disk_tier_wipe)"), "%s",
                  nt.text[1]);
    ck_assert_ptr_null(strstr(nt.text[1], "disk tier:")); /* the caller names the subject */
    disk_close(td);
    ck_assert_int_eq(nt.n, 2);
}
END_TEST

static Suite *tier_disk_suite(void)
{
    Suite *s = suite_create("tier_disk");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, crc_known_values);
    tcase_add_test(tc, crc_paths_agree);
    tcase_add_test(tc, crc_long_buffers);
    tcase_add_test(tc, crc_copy_and_combine);
    tcase_add_test(tc, bad_setup_is_named);
    tcase_add_test(tc, other_geometry_refused_or_wiped);
    tcase_add_test(tc, roundtrip_io_uring);
    tcase_add_test(tc, long_runs_of_small_slots);
    tcase_add_test(tc, roundtrip_threads_forced);
    tcase_add_loop_test(tc, concurrent_batches, 0, 2);
    tcase_add_loop_test(tc, drain_from_the_tiers_buffer, 0, 2);
    tcase_add_test(tc, slot_lru);
    tcase_add_test(tc, restart_finds_records);
    tcase_add_test(tc, deletions_and_identities_survive_reopen);
    tcase_add_loop_test(tc, sigkill_mid_writes, 0, 2);
    tcase_add_test(tc, flipped_bytes_never_pass);
    tcase_add_loop_test(tc, medium_put_get_drop, 0, 2);
    tcase_add_test(tc, server_opens_and_checks);
    tcase_add_test(tc, evict_looks_only_at_its_blocks);
    tcase_add_test(tc, path_of_someone_else_is_refused);
    tcase_add_test(tc, path_of_another_user_is_refused);
    tcase_add_test(tc, foreign_lock_is_named);
    tcase_add_test(tc, io_buffers_ask_for_huge_pages);
    tcase_add_test(tc, notes_reach_the_caller);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(tier_disk_suite)
