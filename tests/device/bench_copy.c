/*
 * Device-to-device block copy: backend_copy_block (one block = the K and V
 * slots of every layer, 2 x layers strided pieces) against one cuMemcpy of
 * the same number of contiguous bytes (backend_copy), on the cuda backend.
 * Every copied block is checked afterwards, so the figures are for copies
 * that worked.
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
    if (check_block_copy(b, &g, nb, half + 1, 1) != 0) {
        fprintf(stderr, "bench_copy: %s: block copy gave wrong bytes\n", model);
        backend_close(b);
        return 1;
    }
    /* Rotate through the pool so that the copies do not all hit in L2. */
    double t0 = now_s();
    for (int i = 0; i < iters && rc == 0; i++)
        rc = backend_copy_block(b, &g, nb, half + (uint32_t)i % half, (uint32_t)i % half);
    double t_block = now_s() - t0;
    t0 = now_s();
    for (int i = 0; i < iters && rc == 0; i++) {
        uint64_t src = ((uint64_t)i % half) * block;
        rc = backend_copy(b, src + (uint64_t)half * block, src, block);
    }
    double t_flat = now_s() - t0;
    if (rc != 0) {
        fprintf(stderr, "bench_copy: %s: copy failed: %d\n", model, rc);
        backend_close(b);
        return 1;
    }
    double gbs_block = (double)block * iters / t_block / 1e9;
    double gbs_flat = (double)block * iters / t_flat / 1e9;
    printf("%-14s block %7.2f MiB (%3u pieces of %6" PRIu64 " B): copy_block %8.1f us %7.1f GB/s"
           " | one cuMemcpy %8.1f us %7.1f GB/s | ratio %.2f\n",
           model, (double)block / (1 << 20), 2 * g.layers, geometry_slot_bytes(&g),
           t_block / iters * 1e6, gbs_block, t_flat / iters * 1e6, gbs_flat, gbs_block / gbs_flat);
    backend_close(b);
    return 0;
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
    printf("bench_copy: %d copies per figure, each waited for (cuCtxSynchronize); bandwidth = "
           "bytes copied / time\n",
           iters);
    int failed = 0;
    for (int i = 0; i < n_models; i++)
        failed |= bench_model(models[i], iters);
    return failed ? 1 : 0;
}
