/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda backend. Without a device: the errors (cause and fix), and that auto
 * falls back to host; then the program prints "skipped: no CUDA device
 * (<reason>)" and exits 77 (ctest's SKIP_RETURN_CODE). With a device: pool
 * creation, sizing errors, copies, and export in this process with import in
 * another one.
 *
 * CUDA does not survive fork: the main process never touches the driver (it
 * probes in a child), each Check case runs in its own forked child, and the
 * importing processes are this same program exec'd with --import-child.
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "geometry.h"
#include "tier_checks.h"

#define SKIP_CODE  77
#define NUM_BLOCKS 64
#define CHILD_FD0  3

static int probe_rc;
static char probe_reason[512];

/* llama-3.2-1b in bf16: 16 KiB slots, 512 KiB blocks, a 32 MiB pool. */
static geometry_t test_geom(void)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.2-1b", &g), 0);
    return g;
}

static void fill_pattern(uint8_t *buf, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)((i * 167u + seed * 13u + 5u) & 0xff);
}

static backend_t *open_cuda(uint64_t bytes)
{
    backend_config_t cfg = {.kind = BACKEND_CUDA, .device = 0, .bytes = bytes};
    backend_t *b = NULL;
    char err[512] = "";
    int rc = backend_open(&cfg, &b, err, sizeof(err));
    ck_assert_msg(rc == 0, "backend_open(cuda): %d: %s", rc, err);
    return b;
}

/* ---- the importing process ---------------------------------------------- */

static int hex_decode(const char *hex, void *out, size_t n)
{
    uint8_t *p = out;
    if (strlen(hex) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        p[i] = (uint8_t)v;
    }
    return 0;
}

/* argv: --import-child MODE DESC_HEX LAYER KV BLOCK SEED; slab fds at 3...
 * MODE write: write the pattern into the slot; read: check it is there;
 * hold: write it, say 'r' on stdout, wait for a byte on stdin (the exporter
 * closes its pool meanwhile), then check the memory still holds it. */
static int import_child(int argc, char **argv)
{
    if (argc != 9)
        return 20;
    const char *mode = argv[2];
    backend_desc_t desc;
    if (hex_decode(argv[3], &desc, sizeof(desc)) != 0)
        return 21;
    uint32_t layer = (uint32_t)atoi(argv[4]), kv = (uint32_t)atoi(argv[5]);
    uint32_t block = (uint32_t)atoi(argv[6]), seed = (uint32_t)atoi(argv[7]);
    uint32_t num_blocks = (uint32_t)atoi(argv[8]);
    geometry_t g;
    geometry_preset("llama-3.2-1b", &g);
    int fds[BACKEND_MAX_SLABS];
    for (uint32_t i = 0; i < desc.n_slabs && i < BACKEND_MAX_SLABS; i++)
        fds[i] = CHILD_FD0 + (int)i;
    backend_mapping_t *m = NULL;
    char err[512] = "";
    int rc = backend_import(&desc, fds, desc.n_slabs, &m, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "import child: backend_import: %d: %s\n", rc, err);
        return 22;
    }
    uint64_t slot = geometry_slot_bytes(&g);
    uint64_t offset = geometry_offset(&g, num_blocks, layer, kv, block);
    uint8_t *want = malloc(slot), *got = malloc(slot);
    fill_pattern(want, slot, seed);
    int status = 0;
    if (strcmp(mode, "write") == 0 || strcmp(mode, "hold") == 0) {
        if (backend_mapping_write(m, offset, want, slot) != 0)
            status = 23;
    }
    if (status == 0 && strcmp(mode, "hold") == 0) {
        char c = 'r';
        if (write(1, &c, 1) != 1 || read(0, &c, 1) != 1)
            status = 24;
    }
    if (status == 0 && (strcmp(mode, "read") == 0 || strcmp(mode, "hold") == 0)) {
        if (backend_mapping_read(m, offset, got, slot) != 0)
            status = 25;
        else if (memcmp(got, want, slot) != 0)
            status = 26;
    }
    free(want);
    free(got);
    backend_unmap(m);
    return status;
}

/* Starts this program as an importer of b's pool. The exported fds go to the
 * child at 3.. and are closed here. pipe_in/pipe_out (or -1) become the
 * child's stdin and stdout. */
static pid_t spawn_importer(backend_t *b, const char *mode, uint32_t layer, uint32_t kv,
                            uint32_t block, uint32_t seed, int pipe_in, int pipe_out)
{
    backend_desc_t desc;
    backend_describe(b, &desc);
    int fds[BACKEND_MAX_SLABS];
    size_t n = 0;
    ck_assert_int_eq(backend_export(b, fds, BACKEND_MAX_SLABS, &n, NULL, 0), 0);
    ck_assert_uint_eq(n, desc.n_slabs);
    char hex[2 * sizeof(desc) + 1];
    const uint8_t *raw = (const uint8_t *)&desc;
    for (size_t i = 0; i < sizeof(desc); i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    char a_layer[16], a_kv[16], a_block[16], a_seed[16], a_nb[16];
    snprintf(a_layer, sizeof(a_layer), "%u", layer);
    snprintf(a_kv, sizeof(a_kv), "%u", kv);
    snprintf(a_block, sizeof(a_block), "%u", block);
    snprintf(a_seed, sizeof(a_seed), "%u", seed);
    snprintf(a_nb, sizeof(a_nb), "%u", NUM_BLOCKS);
    char *argv[] = {"test_backend_cuda",
                    "--import-child",
                    (char *)mode,
                    hex,
                    a_layer,
                    a_kv,
                    a_block,
                    a_seed,
                    a_nb,
                    NULL};
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Only async-signal-safe calls until exec: the parent holds a CUDA
         * context. Move the fds out of the way first, then into place. */
        int high[BACKEND_MAX_SLABS];
        for (size_t i = 0; i < n; i++)
            high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 200);
        if (pipe_in >= 0)
            dup2(pipe_in, 0);
        if (pipe_out >= 0)
            dup2(pipe_out, 1);
        for (size_t i = 0; i < n; i++)
            dup2(high[i], CHILD_FD0 + (int)i); /* dup2 clears close-on-exec */
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
    return pid;
}

static void wait_ok(pid_t pid)
{
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "importer failed: status 0x%x (exit %d)", status,
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* ---- with a device -------------------------------------------------------- */

START_TEST(open_describes_pool)
{
    geometry_t g = test_geom();
    uint64_t want = NUM_BLOCKS * geometry_block_bytes(&g) + 1; /* forces rounding */
    backend_t *b = open_cuda(want);
    ck_assert_int_eq(backend_kind(b), BACKEND_CUDA);
    ck_assert_uint_ge(backend_size(b), want);
    ck_assert_uint_eq(backend_size(b) % (64 * 1024), 0);
    ck_assert_uint_ne(backend_base(b), 0);
    backend_desc_t d;
    backend_describe(b, &d);
    ck_assert_int_eq(d.kind, BACKEND_CUDA);
    ck_assert_uint_eq(d.size, backend_size(b));
    ck_assert_uint_ge(d.n_slabs, 1);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < d.n_slabs; i++)
        sum += d.slab_bytes[i];
    ck_assert_uint_eq(sum, d.size);
    const char *slab = getenv("KVS_CUDA_SLAB_BYTES");
    if (slab != NULL) /* the override makes one slab per that many bytes */
        ck_assert_uint_eq(d.n_slabs,
                          (d.size + strtoull(slab, NULL, 10) - 1) / strtoull(slab, NULL, 10));
    static const uint8_t zero[BACKEND_UUID_LEN];
    ck_assert_int_ne(memcmp(d.device_uuid, zero, sizeof(zero)), 0);
    ck_assert_ptr_nonnull(strstr(backend_detail(b), "cuda device 0"));
    printf("cuda backend: %s\n", backend_detail(b));
    backend_close(b);
}
END_TEST

START_TEST(auto_picks_cuda)
{
    backend_config_t cfg = {.kind = BACKEND_AUTO, .bytes = 8 << 20};
    backend_t *b = NULL;
    char err[512] = "";
    ck_assert_msg(backend_open(&cfg, &b, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(backend_kind(b), BACKEND_CUDA);
    backend_close(b);
}
END_TEST

START_TEST(missing_device_named)
{
    backend_config_t cfg = {.kind = BACKEND_CUDA, .device = 4096, .bytes = 8 << 20};
    backend_t *b = NULL;
    char err[512] = "";
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), KVS_ENODEV);
    ck_assert_ptr_nonnull(strstr(err, "device 4096 does not exist"));
    ck_assert_ptr_nonnull(strstr(err, "--device"));
    ck_assert_ptr_null(b);
}
END_TEST

START_TEST(too_big_is_enomem)
{
    backend_config_t cfg = {.kind = BACKEND_CUDA, .device = 0, .bytes = 1ull << 50};
    backend_t *b = NULL;
    char err[512] = "";
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), KVS_ENOMEM);
    ck_assert_ptr_nonnull(strstr(err, "not enough memory"));
    ck_assert_ptr_nonnull(strstr(err, "free"));
    /* auto does not hide it behind host memory */
    cfg.kind = BACKEND_AUTO;
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), KVS_ENOMEM);
}
END_TEST

START_TEST(mem_fraction_sizes_pool)
{
    geometry_t g = test_geom();
    backend_config_t cfg = {
        .kind = BACKEND_CUDA, .mem_fraction = 0.01, .round_bytes = geometry_block_bytes(&g)};
    backend_t *b = NULL;
    char err[512] = "";
    ck_assert_msg(backend_open(&cfg, &b, err, sizeof(err)) == 0, "%s", err);
    ck_assert_uint_ge(backend_size(b), geometry_block_bytes(&g));
    backend_close(b);
    cfg.mem_fraction = 1.5;
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), KVS_EINVAL);
}
END_TEST

START_TEST(copies_on_device)
{
    geometry_t g = test_geom();
    uint64_t slot = geometry_slot_bytes(&g);
    backend_t *b = open_cuda(NUM_BLOCKS * geometry_block_bytes(&g));
    uint8_t *want = malloc(slot), *got = malloc(slot);
    for (uint32_t l = 0; l < g.layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
            fill_pattern(want, slot, l * 2 + kv);
            ck_assert_int_eq(
                backend_write(b, geometry_offset(&g, NUM_BLOCKS, l, kv, 9), want, slot), 0);
        }
    ck_assert_int_eq(backend_copy_block(b, &g, NUM_BLOCKS, 40, 9), 0);
    for (uint32_t l = 0; l < g.layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
            fill_pattern(want, slot, l * 2 + kv);
            ck_assert_int_eq(backend_read(b, geometry_offset(&g, NUM_BLOCKS, l, kv, 40), got, slot),
                             0);
            ck_assert_int_eq(memcmp(got, want, slot), 0);
        }
    /* plain range copy, and the overlap it refuses */
    ck_assert_int_eq(backend_copy(b, 5 * slot, geometry_offset(&g, NUM_BLOCKS, 0, 0, 9), slot), 0);
    ck_assert_int_eq(backend_read(b, 5 * slot, got, slot), 0);
    fill_pattern(want, slot, 0);
    ck_assert_int_eq(memcmp(got, want, slot), 0);
    ck_assert_int_eq(backend_copy(b, 100, 0, 200), KVS_EINVAL);
    ck_assert_int_eq(backend_copy(b, backend_size(b), 0, 1), KVS_EINVAL);
    free(want);
    free(got);
    backend_close(b);
}
END_TEST

/* Batches: three blocks and three ranges in one wait each, the device time
 * reported, and a bad entry refused before anything is copied. */
START_TEST(copy_batches_on_device)
{
    geometry_t g = test_geom();
    uint64_t slot = geometry_slot_bytes(&g), block = geometry_block_bytes(&g);
    backend_t *b = open_cuda(NUM_BLOCKS * block);
    uint8_t *want = malloc(slot), *got = malloc(slot);
    const uint32_t src[3] = {1, 2, 3}, dst[3] = {20, 21, 22};
    for (int i = 0; i < 3; i++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                fill_pattern(want, slot, src[i] * 64 + l * 2 + kv);
                ck_assert_int_eq(
                    backend_write(b, geometry_offset(&g, NUM_BLOCKS, l, kv, src[i]), want, slot),
                    0);
            }
    double ms = -1;
    ck_assert_int_eq(backend_copy_blocks(b, &g, NUM_BLOCKS, dst, src, 3, &ms), 0);
    ck_assert(ms >= 0);
    for (int i = 0; i < 3; i++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                fill_pattern(want, slot, src[i] * 64 + l * 2 + kv);
                ck_assert_int_eq(
                    backend_read(b, geometry_offset(&g, NUM_BLOCKS, l, kv, dst[i]), got, slot), 0);
                ck_assert_int_eq(memcmp(got, want, slot), 0);
            }
    /* Ranges: slot-sized pieces of layer 0's K row, moved to the V row. */
    uint64_t from[3], to[3];
    for (int i = 0; i < 3; i++) {
        from[i] = geometry_offset(&g, NUM_BLOCKS, 0, 0, src[i]);
        to[i] = geometry_offset(&g, NUM_BLOCKS, 0, 1, 30 + (uint32_t)i);
    }
    ck_assert_int_eq(backend_copy_many(b, to, from, slot, 3, NULL), 0);
    for (int i = 0; i < 3; i++) {
        fill_pattern(want, slot, src[i] * 64);
        ck_assert_int_eq(backend_read(b, to[i], got, slot), 0);
        ck_assert_int_eq(memcmp(got, want, slot), 0);
    }
    /* Refused whole: a block out of range, a copy onto itself, an overlap. */
    const uint32_t bad_dst[2] = {23, NUM_BLOCKS}, self[1] = {5};
    ck_assert_int_eq(backend_copy_blocks(b, &g, NUM_BLOCKS, bad_dst, src, 2, NULL), KVS_EINVAL);
    ck_assert_int_eq(backend_copy_blocks(b, &g, NUM_BLOCKS, self, self, 1, NULL), KVS_EINVAL);
    ck_assert_int_eq(backend_read(b, geometry_offset(&g, NUM_BLOCKS, 0, 0, 23), got, slot), 0);
    fill_pattern(want, slot, src[0] * 64);
    ck_assert_int_ne(memcmp(got, want, slot), 0);
    uint64_t o_dst[1] = {100}, o_src[1] = {0};
    ck_assert_int_eq(backend_copy_many(b, o_dst, o_src, 200, 1, NULL), KVS_EINVAL);
    free(want);
    free(got);
    backend_close(b);
}
END_TEST

/* ---- copy engine and gather kernel: the same bytes -------------------------- */

/* Fills the whole pool (and img, the model of it) with a pattern. */
static void fill_pool(backend_t *b, uint8_t *img, uint64_t size, uint32_t seed)
{
    fill_pattern(img, size, seed);
    ck_assert_int_eq(backend_write(b, 0, img, size), 0);
}

static void check_pool(backend_t *b, const uint8_t *img, uint64_t size, const char *what)
{
    uint8_t *got = malloc(size);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(backend_read(b, 0, got, size), 0);
    uint64_t i = 0;
    if (memcmp(got, img, size) != 0)
        while (got[i] == img[i])
            i++;
    ck_assert_msg(i == 0 || got[i] == img[i], "%s: byte %llu is %u, expected %u", what,
                  (unsigned long long)i, got[i], img[i]);
    ck_assert_msg(memcmp(got, img, size) == 0, "%s: pool differs from its model", what);
    free(got);
}

/* What backend_copy_blocks does to the model. */
static void model_blocks(uint8_t *img, const geometry_t *g, const uint32_t *dst,
                         const uint32_t *src, size_t n)
{
    uint64_t slot = geometry_slot_bytes(g);
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < g->layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++)
                memcpy(img + geometry_offset(g, NUM_BLOCKS, l, kv, dst[i]),
                       img + geometry_offset(g, NUM_BLOCKS, l, kv, src[i]), slot);
}

/* Block copies, odd-sized ranges (byte by byte, several kernel units per
 * row) and tier copies both ways give the same bytes through the copy
 * engine and through the kernel (on the stand-in driver: its CPU version of
 * the kernel's contract); then the automatic choice measures and says so. */
START_TEST(kernel_and_engine_agree)
{
    geometry_t g = test_geom();
    uint64_t block = geometry_block_bytes(&g), slot = geometry_slot_bytes(&g);
    backend_t *b = open_cuda(NUM_BLOCKS * block);
    uint64_t size = NUM_BLOCKS * block;
    uint8_t *img = malloc(size);
    ck_assert_ptr_nonnull(img);
    printf("cuda backend: %s\n", backend_detail(b));
#ifdef KVS_HAVE_CUDA_KERNEL
    ck_assert_msg(strstr(backend_detail(b), "copy kernel loaded") != NULL, "%s", backend_detail(b));
    const int n_modes = 2;
#else
    ck_assert_int_eq(backend_copy_mode_set(b, BACKEND_COPY_KERNEL), KVS_ENOTSUP);
    const int n_modes = 1;
#endif
    const backend_copy_mode_t modes[2] = {BACKEND_COPY_ENGINE, BACKEND_COPY_KERNEL};
    const uint32_t src[8] = {1, 2, 3, 4, 5, 6, 7, 9}, dst[8] = {40, 41, 42, 43, 50, 51, 52, 63};
    uint32_t tier_blocks = 16;
    ck_assert_int_eq(backend_tier_open(b, (uint64_t)tier_blocks * block, NULL, 0), 0);
    for (int m = 0; m < n_modes; m++) {
        const char *name = m == 0 ? "engine" : "kernel";
        ck_assert_int_eq(backend_copy_mode_set(b, modes[m]), 0);
        fill_pool(b, img, size, 7 + (uint32_t)m);
        double ms = -1;
        ck_assert_int_eq(backend_copy_blocks(b, &g, NUM_BLOCKS, dst, src, 8, &ms), 0);
        ck_assert(ms >= 0);
        model_blocks(img, &g, dst, src, 8);
        check_pool(b, img, size, name);
        if (m == 1)
            ck_assert_str_eq(backend_copy_block_path(b), "kvs_gather kernel");
        /* Odd sizes and offsets: 3 ranges of 100003 bytes (4 units each). */
        uint64_t from[3] = {3, 2 * block + 1, 5 * block + 7};
        uint64_t to[3] = {20 * block + 5, 30 * block + 11, 33 * block};
        ck_assert_int_eq(backend_copy_many(b, to, from, 100003, 3, NULL), 0);
        for (int i = 0; i < 3; i++)
            memcpy(img + to[i], img + from[i], 100003);
        check_pool(b, img, size, name);
        /* Tier 2: three blocks out, then back into other pool blocks. */
        const uint32_t pool_ids[3] = {4, 5, 6}, tier_ids[3] = {0, 15, 7}, back[3] = {10, 11, 12};
        ck_assert_int_eq(backend_tier_copy(b, &g, NUM_BLOCKS, tier_blocks, BACKEND_TO_TIER,
                                           pool_ids, tier_ids, 3, NULL),
                         0);
        const uint8_t *tier = (const uint8_t *)backend_tier_base(b);
        for (int i = 0; i < 3; i++)
            for (uint32_t l = 0; l < g.layers; l++)
                for (uint32_t kv = 0; kv < 2; kv++)
                    ck_assert_int_eq(
                        memcmp(tier + geometry_offset(&g, tier_blocks, l, kv, tier_ids[i]),
                               img + geometry_offset(&g, NUM_BLOCKS, l, kv, pool_ids[i]), slot),
                        0);
        ck_assert_int_eq(backend_tier_copy(b, &g, NUM_BLOCKS, tier_blocks, BACKEND_FROM_TIER, back,
                                           tier_ids, 3, NULL),
                         0);
        model_blocks(img, &g, back, pool_ids, 3);
        check_pool(b, img, size, name);
    }
    /* Automatic: the first batch of 64 pieces or more measures both ways. */
    char line[512];
    ck_assert_int_eq(backend_copy_mode_set(b, BACKEND_COPY_AUTO), 0);
    fill_pool(b, img, size, 11);
    ck_assert_int_eq(backend_copy_blocks(b, &g, NUM_BLOCKS, dst, src, 8, NULL), 0);
    model_blocks(img, &g, dst, src, 8);
    check_pool(b, img, size, "auto");
    backend_copy_describe(b, line, sizeof(line));
    printf("copy path: %s\n", line);
#ifdef KVS_HAVE_CUDA_KERNEL
    ck_assert_msg(strstr(line, "pool->pool kernel (kernel ") != NULL ||
                      strstr(line, "pool->pool copy engine (kernel ") != NULL,
                  "%s", line);
    ck_assert_msg(strstr(line, "pool->host not measured yet") != NULL, "%s", line);
#else
    ck_assert_msg(strstr(line, "copy engine (kernel not used: built without nvcc)") != NULL, "%s",
                  line);
#endif
    free(img);
    backend_close(b);
}
END_TEST

/* Tier 2: the round trip every backend passes (tier_checks.c). */
START_TEST(tier_round_trip)
{
    geometry_t g = test_geom();
    backend_t *b = open_cuda(NUM_BLOCKS * geometry_block_bytes(&g));
    check_tier_round_trip(b, &g, NUM_BLOCKS);
    backend_close(b);
}
END_TEST

/* The worker writes block b of layer l; the daemon side reads it where the
 * layout function says, and the other way round. */
START_TEST(export_import_across_processes)
{
    geometry_t g = test_geom();
    uint64_t slot = geometry_slot_bytes(&g);
    backend_t *b = open_cuda(NUM_BLOCKS * geometry_block_bytes(&g));
    const uint32_t layer = 11, kv = 1, block = 37, seed = 99;
    wait_ok(spawn_importer(b, "write", layer, kv, block, seed, -1, -1));
    uint8_t *want = malloc(slot), *got = malloc(slot);
    fill_pattern(want, slot, seed);
    ck_assert_int_eq(backend_read(b, geometry_offset(&g, NUM_BLOCKS, layer, kv, block), got, slot),
                     0);
    ck_assert_int_eq(memcmp(got, want, slot), 0);
    /* the neighbouring block of the same layer was not touched */
    ck_assert_int_eq(
        backend_read(b, geometry_offset(&g, NUM_BLOCKS, layer, kv, block + 1), got, slot), 0);
    ck_assert_int_ne(memcmp(got, want, slot), 0);
    /* daemon writes, a second worker reads */
    fill_pattern(want, slot, 7);
    ck_assert_int_eq(backend_write(b, geometry_offset(&g, NUM_BLOCKS, 3, 0, 2), want, slot), 0);
    wait_ok(spawn_importer(b, "read", 3, 0, 2, 7, -1, -1));
    free(want);
    free(got);
    backend_close(b);
}
END_TEST

/* Memory stays valid while an importer maps it, even after the exporter frees. */
START_TEST(import_outlives_exporter)
{
    geometry_t g = test_geom();
    backend_t *b = open_cuda(NUM_BLOCKS * geometry_block_bytes(&g));
    int to_child[2], from_child[2];
    ck_assert_int_eq(pipe2(to_child, O_CLOEXEC), 0);
    ck_assert_int_eq(pipe2(from_child, O_CLOEXEC), 0);
    pid_t pid = spawn_importer(b, "hold", 5, 0, 60, 3, to_child[0], from_child[1]);
    close(to_child[0]);
    close(from_child[1]);
    char c = 0;
    ck_assert_int_eq(read(from_child[0], &c, 1), 1);
    ck_assert_int_eq(c, 'r');
    backend_close(b);
    ck_assert_int_eq(write(to_child[1], &c, 1), 1);
    wait_ok(pid);
    close(to_child[1]);
    close(from_child[0]);
}
END_TEST

/* ---- without a device ----------------------------------------------------- */

START_TEST(explicit_cuda_fails_with_fix)
{
    backend_config_t cfg = {.kind = BACKEND_CUDA, .bytes = 8 << 20};
    backend_t *b = NULL;
    char err[512] = "";
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), probe_rc);
    ck_assert_ptr_null(b);
    ck_assert_str_eq(err, probe_reason);
    if (probe_rc == KVS_ENODRIVER || probe_rc == KVS_ENODEV)
        ck_assert_ptr_nonnull(strstr(err, "--backend host"));
    char again[512] = "";
    ck_assert_int_eq(backend_cuda_probe(0, again, sizeof(again)), probe_rc);
    ck_assert_str_eq(again, err);
}
END_TEST

START_TEST(auto_falls_back_to_host)
{
    backend_config_t cfg = {.kind = BACKEND_AUTO, .bytes = 8 << 20};
    backend_t *b = NULL;
    char err[512] = "";
    int rc = backend_open(&cfg, &b, err, sizeof(err));
    ck_assert_msg(rc == 0, "auto: %d %s", rc, err);
    ck_assert_int_eq(backend_kind(b), BACKEND_HOST);
    ck_assert_ptr_nonnull(strstr(backend_detail(b), "cuda not used: "));
    ck_assert_ptr_nonnull(strstr(backend_detail(b), probe_reason));
    backend_close(b);
}
END_TEST

START_TEST(cuda_import_fails_cleanly)
{
    int fd = memfd_create("not-cuda", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    backend_desc_t d = {
        .kind = BACKEND_CUDA, .size = 2 << 20, .n_slabs = 1, .slab_bytes = {2 << 20}};
    backend_mapping_t *m = NULL;
    char err[512] = "";
    ck_assert_int_lt(backend_import(&d, &fd, 1, &m, err, sizeof(err)), 0);
    ck_assert_ptr_null(m);
    ck_assert_int_gt((int)strlen(err), 0);
    ck_assert_int_eq(fcntl(fd, F_GETFD), -1);
}
END_TEST

/* ---- main ------------------------------------------------------------------ */

/* Asks the driver in a child process, so that this one stays free to fork. */
static void probe_in_child(void)
{
    int p[2];
    if (pipe(p) != 0) {
        probe_rc = KVS_EIO;
        snprintf(probe_reason, sizeof(probe_reason), "pipe failed");
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        char err[512] = "";
        int rc = backend_cuda_probe(0, err, sizeof(err));
        if (write(p[1], &rc, sizeof(rc)) != sizeof(rc) ||
            write(p[1], err, sizeof(err)) != sizeof(err))
            _exit(1);
        _exit(0);
    }
    close(p[1]);
    probe_rc = KVS_EIO;
    snprintf(probe_reason, sizeof(probe_reason), "the driver probe crashed");
    if (pid > 0) {
        int rc;
        if (read(p[0], &rc, sizeof(rc)) == sizeof(rc) &&
            read(p[0], probe_reason, sizeof(probe_reason)) == sizeof(probe_reason))
            probe_rc = rc;
        probe_reason[sizeof(probe_reason) - 1] = '\0';
        waitpid(pid, NULL, 0);
    }
    close(p[0]);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--import-child") == 0)
        return import_child(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    probe_in_child();
    Suite *s = suite_create("backend_cuda");
    TCase *tc;
    if (probe_rc == 0) {
        tc = tcase_create("device");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, open_describes_pool);
        tcase_add_test(tc, auto_picks_cuda);
        tcase_add_test(tc, missing_device_named);
        tcase_add_test(tc, too_big_is_enomem);
        tcase_add_test(tc, mem_fraction_sizes_pool);
        tcase_add_test(tc, copies_on_device);
        tcase_add_test(tc, copy_batches_on_device);
        tcase_add_test(tc, kernel_and_engine_agree);
        tcase_add_test(tc, tier_round_trip);
        tcase_add_test(tc, export_import_across_processes);
        tcase_add_test(tc, import_outlives_exporter);
    } else {
        tc = tcase_create("no_device");
        tcase_set_timeout(tc, 30);
        tcase_add_test(tc, explicit_cuda_fails_with_fix);
        /* A device that answers but cannot serve is an error even for auto;
         * a build without CUDA headers falls back. */
#ifdef KVS_HAVE_CUDA
        if (probe_rc != KVS_ENOTSUP)
            tcase_add_test(tc, auto_falls_back_to_host);
#else
        tcase_add_test(tc, auto_falls_back_to_host);
#endif
        tcase_add_test(tc, cuda_import_fails_cleanly);
    }
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed != 0)
        return EXIT_FAILURE;
    if (probe_rc != 0) {
        printf("skipped: no CUDA device (%s)\n", probe_reason);
        return SKIP_CODE;
    }
    return EXIT_SUCCESS;
}
