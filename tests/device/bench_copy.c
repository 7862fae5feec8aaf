/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device-to-device block copy: a block (the K and V slots of every layer,
 * 2 x layers strided pieces) copied by the copy engine (one 2D copy where the
 * driver takes the pitch) and by the gather kernel (one launch per batch,
 * where it loaded), against one cuMemcpy of the same number of contiguous
 * bytes, on the cuda backend's private stream. Two figures each: latency
 * (one copy, waited for, then the next) and pipelined bandwidth (N copies
 * back to back, timed on the device with events, best of three runs
 * alternating the kinds), and the path each used. Copies are checked before
 * and after, so the figures are for copies that worked.
 *
 *   bench_copy [--quick] [--model NAME]...   (default: llama-3.1-8b and -70b)
 *
 * Exits 77 with "skipped: no CUDA device (<reason>)" where no device answers.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "geometry.h"

#define SKIP_CODE   77
#define POOL_BLOCKS 512

static void fill_pattern(uint8_t *buf, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)((i * 151u + seed * 11u + 3u) & 0xff);
}

/* Writes a distinct pattern into every slot of block src, copies it to dst,
 * reads every slot of dst back. */
static int check_block_copy(backend_t *b, const geometry_t *g, uint32_t nb, uint32_t dst,
                            uint32_t src)
{
    uint64_t slot = geometry_slot_bytes(g);
    uint8_t *want = malloc(slot), *got = malloc(slot);
    int ok = want != NULL && got != NULL;
    for (uint32_t l = 0; ok && l < g->layers; l++)
        for (uint32_t kv = 0; ok && kv < 2; kv++) {
            fill_pattern(want, slot, l * 2 + kv + src);
            ok = backend_write(b, geometry_offset(g, nb, l, kv, src), want, slot) == 0;
        }
    ok = ok && backend_copy_block(b, g, nb, dst, src) == 0;
    for (uint32_t l = 0; ok && l < g->layers; l++)
        for (uint32_t kv = 0; ok && kv < 2; kv++) {
            fill_pattern(want, slot, l * 2 + kv + src);
            ok = backend_read(b, geometry_offset(g, nb, l, kv, dst), got, slot) == 0 &&
                 memcmp(got, want, slot) == 0;
        }
    free(want);
    free(got);
    return ok ? 0 : -1;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Copy i of a run: block i % half to half + i % half, rotating through the
 * pool so that the copies do not all hit in L2. */
static void copy_plan(uint32_t half, uint64_t block, int iters, uint32_t *dst_b, uint32_t *src_b,
                      uint64_t *dst_off, uint64_t *src_off)
{
    for (int i = 0; i < iters; i++) {
        src_b[i] = (uint32_t)i % half;
        dst_b[i] = half + src_b[i];
        src_off[i] = (uint64_t)src_b[i] * block;
        dst_off[i] = (uint64_t)dst_b[i] * block;
    }
}

/* The two ways a batch can copy on cuda; the kernel only where it loaded. */
static const struct {
    backend_copy_mode_t mode;
    const char *name;
} paths[2] = {{BACKEND_COPY_ENGINE, "copy engine"}, {BACKEND_COPY_KERNEL, "gather kernel"}};

static int bench_model(const char *model, int iters)
{
    geometry_t g;
    if (geometry_preset(model, &g) != 0) {
        fprintf(stderr, "bench_copy: unknown model %s\n", model);
        return 1;
    }
    uint64_t block = geometry_block_bytes(&g);
    backend_config_t cfg = {.kind = BACKEND_CUDA, .device = 0, .bytes = POOL_BLOCKS * block};
    backend_t *b = NULL;
    char err[512] = "";
    int rc = backend_open(&cfg, &b, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "bench_copy: %s\n", err);
        return 1;
    }
    const uint32_t nb = POOL_BLOCKS, half = POOL_BLOCKS / 2;
    uint32_t *dst_b = calloc((size_t)iters, sizeof(*dst_b));
    uint32_t *src_b = calloc((size_t)iters, sizeof(*src_b));
    uint64_t *dst_off = calloc((size_t)iters, sizeof(*dst_off));
    uint64_t *src_off = calloc((size_t)iters, sizeof(*src_off));
    const char *via[2] = {"", ""};
    double lat_block[2] = {0, 0}, best_block[2] = {0, 0}, lat_flat = 0, best_flat = 0;
    if (!dst_b || !src_b || !dst_off || !src_off) {
        rc = KVS_ENOMEM;
        goto out;
    }
    /* Paths this build and device have: the engine always, the kernel
     * where it loaded (backend_detail says why not). */
    int n_paths = backend_copy_mode_set(b, BACKEND_COPY_KERNEL) == 0 ? 2 : 1;
    for (int p = 0; p < n_paths; p++) {
        backend_copy_mode_set(b, paths[p].mode);
        if (check_block_copy(b, &g, nb, half + 1 + (uint32_t)p, 1 + (uint32_t)p) != 0) {
            fprintf(stderr, "bench_copy: %s: block copy via the %s gave wrong bytes\n", model,
                    paths[p].name);
            rc = 1;
            goto out;
        }
        via[p] = backend_copy_block_path(b);
    }
    copy_plan(half, block, iters, dst_b, src_b, dst_off, src_off);

    /* Warm-up: the copy paths, the stream, the events. */
    double ms_block = 0, ms_flat = 0;
    size_t warm = (size_t)(iters < 20 ? iters : 20);
    for (int p = 0; p < n_paths && rc == 0; p++) {
        backend_copy_mode_set(b, paths[p].mode);
        rc = backend_copy_blocks(b, &g, nb, dst_b, src_b, warm, &ms_block);
    }
    /* The baseline is one plain cuMemcpy per block: always the engine. */
    backend_copy_mode_set(b, BACKEND_COPY_ENGINE);
    if (rc == 0)
        rc = backend_copy_many(b, dst_off, src_off, block, warm, &ms_flat);

    /* Latency: one copy, waited for, then the next. */
    int lat_iters = iters < 100 ? iters : 100;
    for (int p = 0; p < n_paths && rc == 0; p++) {
        backend_copy_mode_set(b, paths[p].mode);
        double t0 = now_us();
        for (int i = 0; i < lat_iters && rc == 0; i++)
            rc = backend_copy_block(b, &g, nb, dst_b[i], src_b[i]);
        lat_block[p] = (now_us() - t0) / lat_iters;
    }
    backend_copy_mode_set(b, BACKEND_COPY_ENGINE);
    double t0 = now_us();
    for (int i = 0; i < lat_iters && rc == 0; i++)
        rc = backend_copy(b, dst_off[i], src_off[i], block);
    lat_flat = (now_us() - t0) / lat_iters;

    /* Bandwidth: iters copies back to back on the stream, timed by events;
     * the kinds alternate three times and the best of each counts. */
    for (int round = 0; round < 3 && rc == 0; round++) {
        for (int p = 0; p < n_paths && rc == 0; p++) {
            backend_copy_mode_set(b, paths[p].mode);
            rc = backend_copy_blocks(b, &g, nb, dst_b, src_b, (size_t)iters, &ms_block);
            if (rc == 0 && (best_block[p] == 0 || ms_block < best_block[p]))
                best_block[p] = ms_block;
        }
        backend_copy_mode_set(b, BACKEND_COPY_ENGINE);
        if (rc == 0)
            rc = backend_copy_many(b, dst_off, src_off, block, (size_t)iters, &ms_flat);
        if (rc == 0 && (best_flat == 0 || ms_flat < best_flat))
            best_flat = ms_flat;
    }
    if (rc != 0) {
        fprintf(stderr, "bench_copy: %s: copy failed: %s\n", model, kvs_status_text(rc));
        rc = 1;
        goto out;
    }
    /* Each run rewrote the same blocks: the last copies must still hold. */
    for (int p = 0; p < n_paths; p++) {
        backend_copy_mode_set(b, paths[p].mode);
        if (check_block_copy(b, &g, nb, half + 3 + (uint32_t)p, 3 + (uint32_t)p) != 0) {
            fprintf(stderr,
                    "bench_copy: %s: block copy via the %s gave wrong bytes after the runs\n",
                    model, paths[p].name);
            rc = 1;
            goto out;
        }
    }
    double gbs_flat = (double)block * iters / (best_flat * 1e-3) / 1e9;
    printf("%-14s block %6.2f MiB (%3u pieces of %6" PRIu64 " B)\n", model,
           (double)block / (1 << 20), 2 * g.layers, geometry_slot_bytes(&g));
    printf("  one cuMemcpy of the same bytes: latency %8.1f us | pipelined %7.1f GB/s\n", lat_flat,
           gbs_flat);
    double best_ratio = 0;
    for (int p = 0; p < n_paths; p++) {
        double gbs = (double)block * iters / (best_block[p] * 1e-3) / 1e9;
        printf("  block copy via %-13s (%s): latency %8.1f us | pipelined, %d copies on one "
               "stream (events) %7.1f GB/s | ratio %.2f\n",
               paths[p].name, via[p], lat_block[p], iters, gbs, gbs / gbs_flat);
        if (gbs / gbs_flat > best_ratio)
            best_ratio = gbs / gbs_flat;
    }
    if (n_paths == 1)
        printf("  gather kernel not measured: %s\n", backend_detail(b));
    /* The pipelined target: 0.9 of a flat copy (reported, not enforced: a
     * figure below it is a finding, not a failed copy). */
    printf("  best pipelined ratio %.2f: target 0.90 %s\n", best_ratio,
           best_ratio >= 0.9 ? "met" : "NOT met");
out:
    free(dst_b);
    free(src_b);
    free(dst_off);
    free(src_off);
    backend_close(b);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    int iters = 500;
    const char *models[8];
    int n_models = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            iters = 20;
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc && n_models < 8) {
            models[n_models++] = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_copy [--quick] [--model NAME]...\n");
            return 2;
        }
    }
    if (n_models == 0) {
        models[n_models++] = "llama-3.1-8b";
        models[n_models++] = "llama-3.1-70b";
    }
    char err[512] = "";
    if (backend_cuda_probe(0, err, sizeof(err)) != 0) {
        printf("skipped: no CUDA device (%s)\n", err);
        return SKIP_CODE;
    }
    printf("bench_copy: block copies (2 x layers strided pieces) against one cuMemcpy of the "
           "same bytes, on the backend's private stream; %d copies per bandwidth figure, best "
           "of 3\n",
           iters);
    int failed = 0;
    for (int i = 0; i < n_models; i++)
        failed |= bench_model(models[i], iters);
    return failed ? 1 : 0;
}
