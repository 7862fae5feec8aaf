/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench tier-copy: the copies between the pool and tier 2 (kvshared
 * --host-tier) against a plain copy of the same sizes, on the same threads,
 * in the same run: memcpy on the host backend, cuMemcpy host <-> device on
 * the cuda backend (--backend cuda).
 *
 * Each of T threads owns a prefix of --tokens tokens (default 4096: 256
 * blocks of llama-3.1-8b, 2 MiB each, 512 MiB) in a pool and in a tier 2,
 * and room for a plain copy of the same size. A round runs the phases,
 * every thread at once (a barrier between phases):
 *   demote   backend_tier_copy pool -> tier 2 of its blocks, one batch (what
 *            a kvshared thread-pool job does for a request);
 *   promote  backend_tier_copy tier 2 -> pool, one batch;
 * and on the host backend
 *   memcpy   one memcpy per block of block_bytes between two plain buffers;
 * on the cuda backend, where tier 2 is pinned host memory (registered with
 * the driver) and the pool device memory,
 *   dtoh     one cuMemcpyDtoH per block of block_bytes, device -> pinned host,
 *   htod     one cuMemcpyHtoD per block, pinned host -> device,
 * each waited for before the next (backend_read / backend_write: a plain
 * cuMemcpy on the backend's stream), between a second half of the pool and
 * of tier 2 that the tier copies do not use.
 * The phase order rotates from round to round. A phase's throughput is all
 * threads' bytes over the time from the barrier to the last thread's end;
 * reported: the median over rounds of each, and the tier copies' as a
 * percentage of the plain copy's (demote against memcpy or dtoh, promote
 * against memcpy or htod). The blocks' bytes are checked after the last
 * round (a demotion then a promotion gives the pool what it had).
 *
 * The tier copies move each block as 2 x layers rows of one slot (the
 * pool's layout, [layer][k|v][block]...; one strided cuMemcpy2DAsync per
 * block on cuda), the plain copies one contiguous run of the same bytes:
 * the difference is what the layout and the batch cost.
 *
 * With --backend cuda and no device answering, it says so and exits 77. On
 * the stand-in driver (tests/gpu/fake_cuda.c) it runs, but the copies are
 * memmoves and the figures mean nothing.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bench.h"
#include "bench_tier_disk.h"
#include "geometry.h"
#include "kvshare_status.h"

enum { PH_DEMOTE, PH_PROMOTE, PH_MEMCPY, PH_DTOH, PH_HTOD, N_PH };
static const char *const phase_names[N_PH] = {"demote", "promote", "memcpy", "dtoh", "htod"};

#define MAX_THREADS 16
#define MAX_ROUNDS  101

typedef struct tc_shared {
    backend_t *b;
    geometry_t g;
    uint32_t pool_blocks, tier_blocks, per_thread, threads, rounds;
    int phases[N_PH]; /* the phases this backend runs, n_phases of them */
    int n_phases;
    pthread_barrier_t barrier;
    double start_ns[MAX_ROUNDS][N_PH];
    double end_ns[MAX_ROUNDS][N_PH][MAX_THREADS];
    int rc[MAX_THREADS];
} tc_shared_t;

typedef struct tc_thread {
    tc_shared_t *sh;
    uint32_t index;
    uint32_t *pool_ids, *tier_ids;
    uint8_t *src, *dst; /* the memcpy buffers, per_thread blocks each */
} tc_thread_t;

static void *tc_run(void *arg)
{
    tc_thread_t *th = arg;
    tc_shared_t *sh = th->sh;
    uint64_t bb = geometry_block_bytes(&sh->g);
    /* The plain cuMemcpys' runs: past the tier copies' layouts. */
    uint64_t dev_run = (uint64_t)(sh->pool_blocks + th->index * sh->per_thread) * bb;
    uint8_t *host_run = (uint8_t *)backend_tier_base(sh->b) +
                        (uint64_t)(sh->tier_blocks + th->index * sh->per_thread) * bb;
    for (uint32_t r = 0; r < sh->rounds; r++) {
        for (int k = 0; k < sh->n_phases; k++) {
            int ph = sh->phases[(r + (uint32_t)k) % (uint32_t)sh->n_phases];
            /* One thread takes the start time once everyone is at the line. */
            if (pthread_barrier_wait(&sh->barrier) == PTHREAD_BARRIER_SERIAL_THREAD)
                sh->start_ns[r][ph] = (double)now_ns();
            pthread_barrier_wait(&sh->barrier);
            int rc = 0;
            if (ph == PH_MEMCPY) {
                for (uint32_t i = 0; i < sh->per_thread; i++)
                    memcpy(th->dst + (size_t)i * bb, th->src + (size_t)i * bb, bb);
            } else if (ph == PH_DTOH) {
                for (uint32_t i = 0; i < sh->per_thread && rc == 0; i++)
                    rc = backend_read(sh->b, dev_run + i * bb, host_run + i * bb, bb);
            } else if (ph == PH_HTOD) {
                for (uint32_t i = 0; i < sh->per_thread && rc == 0; i++)
                    rc = backend_write(sh->b, dev_run + i * bb, host_run + i * bb, bb);
            } else {
                rc = backend_tier_copy(sh->b, &sh->g, sh->pool_blocks, sh->tier_blocks,
                                       ph == PH_DEMOTE ? BACKEND_TO_TIER : BACKEND_FROM_TIER,
                                       th->pool_ids, th->tier_ids, sh->per_thread, NULL);
            }
            sh->end_ns[r][ph][th->index] = (double)now_ns();
            if (rc && !sh->rc[th->index])
                sh->rc[th->index] = rc;
        }
    }
    return NULL;
}

/* Every slot of each thread's blocks equal in the pool and in tier 2, and
 * the pattern written before the first round. */
static bool tc_verify(const tc_shared_t *sh, const tc_thread_t *ths)
{
    uintptr_t tier = backend_tier_base(sh->b);
    uint64_t slot = geometry_slot_bytes(&sh->g);
    uint8_t *a = malloc(slot);
    bool ok = a != NULL;
    for (uint32_t t = 0; ok && t < sh->threads; t++)
        for (uint32_t i = 0; ok && i < sh->per_thread; i++)
            for (uint32_t l = 0; ok && l < sh->g.layers; l++)
                for (uint32_t p = 0; ok && p < 2; p++) {
                    uint64_t po =
                        geometry_offset(&sh->g, sh->pool_blocks, l, p, ths[t].pool_ids[i]);
                    uint64_t to =
                        geometry_offset(&sh->g, sh->tier_blocks, l, p, ths[t].tier_ids[i]);
                    const uint8_t *c = (const uint8_t *)(tier + to);
                    ok = backend_read(sh->b, po, a, slot) == 0 && memcmp(a, c, slot) == 0 &&
                         a[0] == (uint8_t)(ths[t].pool_ids[i] * 7u + l * 3u + p);
                }
    free(a);
    return ok;
}

static void tc_usage(FILE *f)
{
    fprintf(f,
            "usage: kvshare-bench tier-copy [options]\n"
            "  --model NAME    geometry preset (default llama-3.1-8b: 2 MiB per 16-token block)\n"
            "  --tokens N      prefix length per thread (default 4096)\n"
            "  --threads N     threads copying at once (default 1; at most %d)\n"
            "  --rounds N      rounds of the phases (default 5; at most %d)\n"
            "  --backend KIND  host (default: against memcpy) or cuda (pool on device 0,\n"
            "                  tier 2 pinned: against cuMemcpy HtoD / DtoH; exit 77 when\n"
            "                  no device answers)\n"
            "  --disk DIR      instead: the disk tier (a file in DIR) against fio in DIR,\n"
            "                  same block size, O_DIRECT, same queue depth; fio's\n"
            "                  buffers on huge pages where vm.nr_hugepages has them\n"
            "                  free (the tier's ask for transparent ones), else on\n"
            "                  4 KiB pages, and the output says so\n"
            "  --qd N          with --disk: queue depth (default 32)\n"
            "  --io KIND       with --disk: uring (default) or threads\n"
            "  --data WHERE    with --disk: aligned (default; blocks on pages, I/O in\n"
            "                  place), unaligned (64 bytes off: copied through the\n"
            "                  tier's buffers) or daemon (as kvshared's: each write\n"
            "                  gathered into the tier's buffer, each read drained out\n"
            "                  of it, on the tier's thread)\n",
            MAX_THREADS, MAX_ROUNDS);
}

int bench_tier_copy(int argc, char **argv)
{
    const char *model = "llama-3.1-8b";
    uint32_t tokens = 4096, threads = 1, rounds = 5;
    backend_kind_t kind = BACKEND_HOST;
    const char *disk = NULL;
    uint32_t qd = 32;
    bool disk_threads = false, disk_unaligned = false, disk_daemon = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            tc_usage(stdout);
            return 0;
        } else if (!ok) {
        } else if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--tokens") == 0) {
            tokens = (uint32_t)strtoul(v, NULL, 0);
            ok = tokens >= 16 && tokens <= (1u << 24);
        } else if (strcmp(a, "--threads") == 0) {
            threads = (uint32_t)strtoul(v, NULL, 0);
            ok = threads >= 1 && threads <= MAX_THREADS;
        } else if (strcmp(a, "--rounds") == 0) {
            rounds = (uint32_t)strtoul(v, NULL, 0);
            ok = rounds >= 1 && rounds <= MAX_ROUNDS;
        } else if (strcmp(a, "--disk") == 0) {
            disk = v;
        } else if (strcmp(a, "--qd") == 0) {
            qd = (uint32_t)strtoul(v, NULL, 0);
            ok = qd >= 32 && qd <= 1024;
        } else if (strcmp(a, "--io") == 0) {
            ok = strcmp(v, "uring") == 0 || strcmp(v, "threads") == 0;
            disk_threads = strcmp(v, "threads") == 0;
        } else if (strcmp(a, "--data") == 0) {
            ok = strcmp(v, "aligned") == 0 || strcmp(v, "unaligned") == 0 ||
                 strcmp(v, "daemon") == 0;
            disk_unaligned = strcmp(v, "unaligned") == 0;
            disk_daemon = strcmp(v, "daemon") == 0;
        } else if (strcmp(a, "--backend") == 0) {
            ok = backend_kind_parse(v, &kind) == 0 && kind != BACKEND_AUTO;
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "tier-copy: bad option or value: %s\n", a);
            tc_usage(stderr);
            return 2;
        }
        i++;
    }
    static tc_shared_t sh; /* large: the per-round times */
    memset(&sh, 0, sizeof(sh));
    if (geometry_preset(model, &sh.g) != 0) {
        fprintf(stderr, "tier-copy: no model preset named '%s'\n", model);
        return 2;
    }
    if (geometry_is_mla(&sh.g)) {
        fprintf(stderr, "tier-copy: %s is MLA; give a K/V model\n", model);
        return 2;
    }
    uint64_t bb = geometry_block_bytes(&sh.g);
    if (disk) {
        bench_tier_disk_args_t da = {.dir = disk,
                                     .block_bytes = bb,
                                     .block_tokens = sh.g.block_tokens,
                                     .blocks = tokens / sh.g.block_tokens,
                                     .rounds = rounds,
                                     .qd = qd,
                                     .threads = disk_threads,
                                     .unaligned = disk_unaligned,
                                     .daemon = disk_daemon};
        return bench_tier_disk(&da);
    }
    sh.per_thread = tokens / sh.g.block_tokens;
    sh.threads = threads;
    sh.rounds = rounds;
    sh.pool_blocks = sh.tier_blocks = sh.per_thread * threads;
    if (sh.per_thread % 37 == 0) {
        fprintf(stderr, "tier-copy: --tokens gives a multiple of 37 blocks; take another\n");
        return 2;
    }
    bool cuda = kind == BACKEND_CUDA;
    static const int host_phases[] = {PH_DEMOTE, PH_PROMOTE, PH_MEMCPY};
    static const int cuda_phases[] = {PH_DEMOTE, PH_PROMOTE, PH_DTOH, PH_HTOD};
    sh.n_phases = cuda ? 4 : 3;
    memcpy(sh.phases, cuda ? cuda_phases : host_phases, (size_t)sh.n_phases * sizeof(int));
    int status = 1;
    tc_thread_t ths[MAX_THREADS] = {{0}};
    pthread_t tids[MAX_THREADS];
    char err[256] = "";
    uint8_t *slot_buf = NULL;
    if (cuda && backend_cuda_probe(0, err, sizeof(err)) != 0) {
        printf("tier-copy: skipped: no CUDA device (%s)\n", err);
        return 77;
    }
    /* On cuda, twice the bytes: the second halves hold the plain cuMemcpys. */
    uint64_t halves = cuda ? 2 : 1;
    backend_config_t bc = {.kind = kind, .bytes = halves * sh.pool_blocks * bb};
    int rc = backend_open(&bc, &sh.b, err, sizeof(err));
    if (rc == 0)
        rc = backend_tier_open(sh.b, halves * sh.tier_blocks * bb, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tier-copy: %s (%s)\n", err, kvs_status_text(rc));
        goto out;
    }
    /* Fault everything in; a pattern in each slot of the pool. */
    uint64_t slot = geometry_slot_bytes(&sh.g);
    memset((void *)backend_tier_base(sh.b), 0, halves * sh.tier_blocks * bb);
    slot_buf = malloc(slot);
    if (!slot_buf) {
        fprintf(stderr, "tier-copy: out of memory\n");
        goto out;
    }
    for (uint32_t blk = 0; blk < sh.pool_blocks; blk++)
        for (uint32_t l = 0; l < sh.g.layers; l++)
            for (uint32_t p = 0; p < 2; p++) {
                memset(slot_buf, (int)(uint8_t)(blk * 7u + l * 3u + p), slot);
                rc = backend_write(sh.b, geometry_offset(&sh.g, sh.pool_blocks, l, p, blk),
                                   slot_buf, slot);
                if (rc) {
                    fprintf(stderr, "tier-copy: writing the pool: %s\n", kvs_status_text(rc));
                    goto out;
                }
            }
    for (uint32_t t = 0; t < threads; t++) {
        tc_thread_t *th = &ths[t];
        th->sh = &sh;
        th->index = t;
        th->pool_ids = malloc(sh.per_thread * sizeof(uint32_t));
        th->tier_ids = malloc(sh.per_thread * sizeof(uint32_t));
        if (!th->pool_ids || !th->tier_ids) {
            fprintf(stderr, "tier-copy: out of memory\n");
            goto out;
        }
        if (!cuda) { /* memcpy's buffers */
            th->src = malloc((size_t)sh.per_thread * bb);
            th->dst = malloc((size_t)sh.per_thread * bb);
            if (!th->src || !th->dst) {
                fprintf(stderr, "tier-copy: out of memory\n");
                goto out;
            }
            /* Non-zero: malloc + memset 0 may become calloc, which faults no page in. */
            memset(th->src, 1, (size_t)sh.per_thread * bb);
            memset(th->dst, 2, (size_t)sh.per_thread * bb);
        }
        /* Ids as a pool hands them out after a while: not in order. The
         * tier-2 ids run the other way. */
        for (uint32_t i = 0; i < sh.per_thread; i++) {
            th->pool_ids[i] = t * sh.per_thread + (i * 37u) % sh.per_thread;
            th->tier_ids[i] = t * sh.per_thread + (sh.per_thread - 1 - i);
        }
    }
    pthread_barrier_init(&sh.barrier, NULL, threads);
    uint32_t started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tids[started], NULL, tc_run, &ths[started]) != 0)
            break;
    if (started < threads) {
        /* Cannot happen short of resources; the started ones would wait at
         * the barrier for ever, so leave without them. */
        fprintf(stderr, "tier-copy: cannot start %u threads\n", threads);
        exit(1);
    }
    for (uint32_t t = 0; t < threads; t++)
        pthread_join(tids[t], NULL);
    pthread_barrier_destroy(&sh.barrier);
    for (uint32_t t = 0; t < threads; t++)
        if (sh.rc[t]) {
            fprintf(stderr, "tier-copy: a copy failed: %s\n", kvs_status_text(sh.rc[t]));
            goto out;
        }
    if (!tc_verify(&sh, ths)) {
        fprintf(stderr, "tier-copy: blocks differ after the copies\n");
        goto out;
    }
    double gbps[N_PH][MAX_ROUNDS], med[N_PH];
    double bytes = (double)bb * sh.per_thread * threads;
    for (int k = 0; k < sh.n_phases; k++) {
        int ph = sh.phases[k];
        for (uint32_t r = 0; r < rounds; r++) {
            double end = 0;
            for (uint32_t t = 0; t < threads; t++)
                end = sh.end_ns[r][ph][t] > end ? sh.end_ns[r][ph][t] : end;
            gbps[ph][r] = bytes / (end - sh.start_ns[r][ph]);
        }
        qsort(gbps[ph], rounds, sizeof(double), bench_cmp_double);
        med[ph] = gbps[ph][rounds / 2];
    }
    printf("tier-copy: %s, %llu B per block (%u rows of %llu B), %u-token prefix = %u blocks "
           "(%.0f MiB) per thread, %u thread(s), %s backend, median of %u rounds\n",
           model, (unsigned long long)bb, 2 * sh.g.layers,
           (unsigned long long)geometry_slot_bytes(&sh.g), tokens, sh.per_thread,
           (double)sh.per_thread * (double)bb / 1048576.0, threads, backend_kind_name(kind),
           rounds);
    if (cuda)
        printf("tier-copy: %s; tier copies: one batch per thread, through the copy engine (one "
               "cuMemcpy2DAsync per block, or one copy per row) or the gather kernel (one launch "
               "per batch), as the copy path below says; baseline: one cuMemcpy per block, each "
               "waited for\n",
               backend_detail(sh.b));
    for (int k = 0; k < sh.n_phases; k++) {
        int ph = sh.phases[k];
        printf("%s_gbps %.2f GB/s (min %.2f, max %.2f)\n", phase_names[ph], med[ph], gbps[ph][0],
               gbps[ph][rounds - 1]);
    }
    int base_out = cuda ? PH_DTOH : PH_MEMCPY, base_in = cuda ? PH_HTOD : PH_MEMCPY;
    printf("demote_vs_%s %.0f %%\n", phase_names[base_out], 100.0 * med[PH_DEMOTE] / med[base_out]);
    printf("promote_vs_%s %.0f %%\n", phase_names[base_in], 100.0 * med[PH_PROMOTE] / med[base_in]);
    if (cuda) {
        char path[512];
        backend_copy_describe(sh.b, path, sizeof(path));
        printf("copy path: %s\n", path);
    }
    status = 0;
out:
    for (uint32_t t = 0; t < threads; t++) {
        free(ths[t].pool_ids);
        free(ths[t].tier_ids);
        free(ths[t].src);
        free(ths[t].dst);
    }
    free(slot_buf);
    backend_close(sh.b);
    return status;
}
