/* SPDX-License-Identifier: Apache-2.0 */
/*
 * disk_restart: how long kvshared takes to start on a full disk tier.
 *
 *     disk_restart KVSHARED DIR BYTES ROUNDS [GEOMETRY...]
 *
 * Starts KVSHARED with a disk tier of BYTES in DIR/tier3, fills it through
 * the client API (prompts of 4 blocks committed until the disk holds 98 %
 * of its slots or stops growing), stops it with SIGTERM, then ROUNDS times
 * starts it again on the same file and reports the time from exec until
 * the socket answers and until the warm restart, which runs in the
 * background, has put the blocks back (kvs_restore_status; a kvshared that
 * predates it restored before listening), stopping it after each but the last. On
 * that one it times 20 Evicts of filled prompts that are on the disk and
 * 20 Clears of a namespace of one prompt, one at a time, and prints the
 * median and the largest. With DISK_RESTART_KEEP=1 in the environment a
 * file left by an earlier run is restarted on without a fill, and left in
 * place. GEOMETRY (kvshared flags) defaults to 2 layers, 2 KV heads, head
 * dim 8, fp16, 4 tokens a block: 512-byte blocks in 4 KiB slots, the most
 * records a file of BYTES can hold. It uses only kvshare.h, so it times an
 * older kvshared as well:
 *
 *     build/tools/bench/kvshare-disk-restart build/daemon/kvshared DIR 2GiB 5
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvshare.h"

#define NB 4 /* blocks per prompt */

static char sock[512], path[512];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static pid_t start(const char *kvshared, const char *bytes, char **geometry)
{
    const char *argv[64];
    int n = 0;
    const char *fixed[] = {kvshared, "--socket",         sock,   "--backend",
                           "host",   "--pool-blocks",    "1024", "--host-tier",
                           "1MiB",   "--disk-tier-path", path,   "--disk-tier-bytes",
                           bytes,    "--log-level",      "warn"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        argv[n++] = fixed[i];
    for (int i = 0; geometry[i] && n < 62; i++)
        argv[n++] = geometry[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execv(kvshared, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Connects once the socket answers; NULL if kvshared exited. */
static kvs_client_t *wait_ready(pid_t pid)
{
    for (;;) {
        kvs_options_t o;
        kvs_options_init(&o);
        o.socket_path = sock;
        o.timeout_ms = 60000;
        kvs_client_t *c = NULL;
        if (kvs_connect(&o, &c) == 0)
            return c;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return NULL;
        usleep(1000);
    }
}

static void stop(pid_t pid)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

static void stats(kvs_client_t *c, uint32_t *t3, uint32_t *total, uint32_t *copying)
{
    kvs_stats_t s;
    if (kvs_stats(c, &s) != 0) {
        fprintf(stderr, "stats: %s\n", kvs_last_error(c));
        exit(1);
    }
    *t3 = s.tier3_cached_blocks;
    *total = s.tier3_total_blocks;
    *copying = s.copying_blocks;
    kvs_stats_free(&s);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *t, int n)
{
    qsort(t, (size_t)n, sizeof(*t), cmp_double);
    printf("%s: median %.3f ms, max %.3f ms (%d calls)\n", what, t[n / 2] * 1e3, t[n - 1] * 1e3, n);
}

/* Evicts of 20 prompts of the fill that are on the disk (from one picked
 * by the clock, so that runs on one kept file evict new ones) and Clears
 * of a small namespace, timed one by one. */
static void deletions(kvs_client_t *c)
{
    kvs_geometry_t g;
    kvs_geometry(c, &g);
    uint32_t bt = g.block_tokens, *tokens = malloc(NB * bt * sizeof(uint32_t));
    double t[20];
    uint32_t first = 1000 + (uint32_t)time(NULL) % 50000 * 2;
    for (uint32_t k = 0; k < 20; k++) {
        for (uint32_t i = 0; i < NB * bt; i++)
            tokens[i] = (first + k) * 4096u + i;
        kvs_evict_result_t r;
        double t0 = now_s();
        if (kvs_evict(c, NULL, tokens, NB * bt, &r) != 0)
            fprintf(stderr, "evict: %s\n", kvs_last_error(c));
        t[k] = now_s() - t0;
    }
    report("Evict of a 4-block prompt", t, 20);
    for (int k = 0; k < 20; k++) {
        uint32_t ids[NB], can[NB];
        size_t done, cleared, kept;
        for (uint32_t i = 0; i < NB * bt; i++)
            tokens[i] = 7u * 4096u + i;
        if (kvs_alloc(c, "bench-clear", NB, ids) != 0 ||
            kvs_commit(c, "bench-clear", tokens, NB * bt, ids, NB, can, &done) != 0 ||
            kvs_release(c, can, done, NULL) != 0)
            fprintf(stderr, "clear's commit: %s\n", kvs_last_error(c));
        double t0 = now_s();
        if (kvs_clear(c, "bench-clear", &cleared, &kept) != 0)
            fprintf(stderr, "clear: %s\n", kvs_last_error(c));
        t[k] = now_s() - t0;
    }
    report("Clear of a 4-block namespace", t, 20);
    free(tokens);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s KVSHARED DIR BYTES ROUNDS [GEOMETRY...]\n", argv[0]);
        return 2;
    }
    static char *small[] = {"--layers", "2",    "--kv-heads",     "2", "--head-dim", "8",
                            "--dtype",  "fp16", "--block-tokens", "4", NULL};
    char **geometry = argc > 5 ? argv + 5 : small;
    snprintf(sock, sizeof(sock), "%s/kvs.sock", argv[2]);
    snprintf(path, sizeof(path), "%s/tier3", argv[2]);
    bool keep = getenv("DISK_RESTART_KEEP") && access(path, F_OK) == 0;
    if (!keep)
        unlink(path);
    int rounds = atoi(argv[4]);
    uint32_t t3 = 0, total = 0, copying = 0;
    if (keep)
        goto restarts;

    pid_t pid = start(argv[1], argv[3], geometry);
    kvs_client_t *c = wait_ready(pid);
    if (!c)
        return 1;
    kvs_geometry_t g;
    kvs_geometry(c, &g);
    uint32_t bt = g.block_tokens, last = 0;
    uint32_t *tokens = malloc(NB * bt * sizeof(uint32_t));
    double t0 = now_s();
    for (uint32_t seed = 1;; seed++) {
        uint32_t ids[NB], can[NB];
        size_t done;
        for (uint32_t i = 0; i < NB * bt; i++)
            tokens[i] = seed * 4096u + i;
        if (kvs_alloc(c, NULL, NB, ids) != 0 ||
            kvs_commit(c, NULL, tokens, NB * bt, ids, NB, can, &done) != 0 ||
            kvs_release(c, can, done, NULL) != 0) {
            fprintf(stderr, "fill: %s\n", kvs_last_error(c));
            return 1;
        }
        if (seed % 4096 == 0) {
            stats(c, &t3, &total, &copying);
            if (t3 >= total / 50 * 49 || (seed % 65536 == 0 && t3 == last))
                break;
            if (seed % 65536 == 0)
                last = t3;
        }
    }
    do {
        usleep(10000);
        stats(c, &t3, &total, &copying);
    } while (copying > 0);
    printf("filled %u of %u slots in %.1f s\n", t3, total, now_s() - t0);
    kvs_close(c);
    stop(pid);
    free(tokens);

restarts:
    for (int r = 0; r < rounds; r++) {
        double s0 = now_s();
        pid = start(argv[1], argv[3], geometry);
        c = wait_ready(pid);
        if (!c)
            return 1;
        double listening = now_s() - s0;
        /* The restore runs in the background: poll it to its end. */
        kvs_restore_status_t rs;
        do {
            if (kvs_restore_status(c, &rs) != 0) {
                fprintf(stderr, "restore status: %s\n", kvs_last_error(c));
                return 1;
            }
            if (strcmp(rs.phase, "scanning") == 0 || strcmp(rs.phase, "restoring") == 0)
                usleep(1000);
        } while (strcmp(rs.phase, "scanning") == 0 || strcmp(rs.phase, "restoring") == 0);
        stats(c, &t3, &total, &copying);
        printf("restart %d: %.3f s, %u blocks restored (listening after %.3f s; restore %s "
               "in %.3f s)\n",
               r + 1, now_s() - s0, t3, listening, rs.phase[0] ? rs.phase : "none",
               (double)rs.elapsed_ms / 1000.0);
        fflush(stdout);
        if (r == rounds - 1)
            deletions(c);
        kvs_close(c);
        stop(pid);
    }
    if (!getenv("DISK_RESTART_KEEP"))
        unlink(path);
    unlink(sock);
    return 0;
}
