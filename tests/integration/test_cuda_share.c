/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Worker processes share a pool through a kvshared with the cuda backend,
 * the whole path: the daemon exports (SCM_RIGHTS, one fd per slab), each
 * worker imports through libkvshare. Steps, each reported pass or fail:
 *
 *   share    A allocates N blocks, writes every K and V slot of each
 *            (kvs_block_write, through its own import) and commits them; B
 *            looks the prompt up and checks every slot. When N is the whole
 *            pool and slabs are small (KVS_CUDA_SLAB_BYTES), slots lie on both
 *            sides of every slab boundary; with 3 KV heads (192-byte slots of
 *            the test geometry) some straddle it.
 *   outlive  H maps the pool and pins it; the daemon is killed; H still reads
 *            every slot (the memory outlives its exporter). H's next call
 *            finds no daemon and unmaps the pool.
 *   restart  a new daemon starts while H still maps the old pool. With the
 *            test driver (KVS_FAKE_CUDA set), the device is "full" until H
 *            lets go (KVS_FAKE_CUDA_OOM_WHILE), so the daemon must retry its
 *            cuMemCreate and start once H has unmapped; on a device the pool
 *            fits anyway and the step checks the restart.
 *
 *   test_cuda_share [--blocks N] [KVSHARED-FLAG...]
 *
 * --blocks: how many blocks A writes and B reads (default 4; the pool has
 * max(N, 64)); the flags that follow go to kvshared after the test's own
 * (later ones win), e.g. a larger geometry. Each worker prints the time its
 * connect took (Hello, the fds, the import of the pool). KVS_KVSHARED names
 * the daemon to start. KVS_TEST_DAEMON_CUDA_VISIBLE_DEVICES, when set, is
 * the daemon's CUDA_VISIBLE_DEVICES (workers keep their own): a device named
 * by UUID there has another ordinal in the workers, which find it by UUID.
 *
 * Skipped (exit 77) where no CUDA device answers. The parent never
 * initialises CUDA (the probe runs in a child), so that the workers it forks
 * start clean.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "daemon_harness.h"
#include "kvshare.h"

#define SKIP       77
#define MAX_BLOCKS 65536

static harness_t h;
static uint32_t n_blocks = 4;
static unsigned pool_blocks;
static char held_path[160];
static const char *flags[64] = {"--backend", "cuda"};

static int probe_in_child(char *why, size_t len)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char err[256] = "";
        close(p[0]);
        int rc = backend_cuda_probe(0, err, sizeof(err));
        if (write(p[1], err, strlen(err)) < 0)
            _exit(2);
        _exit(rc == 0 ? 0 : 1);
    }
    close(p[1]);
    ssize_t n = read(p[0], why, len - 1);
    why[n > 0 ? n : 0] = '\0';
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint8_t pattern(uint32_t layer, uint32_t kv, uint32_t block, size_t i)
{
    return (uint8_t)(layer * 29 + kv * 11 + block * 5 + i * 3);
}

/* Starts a daemon (the first, or again on the same socket), with the
 * daemon's CUDA_VISIBLE_DEVICES for this spawn only. */
static int start_daemon(int again)
{
    const char *cvd = getenv("KVS_TEST_DAEMON_CUDA_VISIBLE_DEVICES");
    if (cvd)
        setenv("CUDA_VISIBLE_DEVICES", cvd, 1);
    int rc;
    if (again) {
        pid_t pid;
        rc = harness_restart(&h, pool_blocks, flags, 20000, &pid) == -1 && pid > 0 ? 0 : -1;
        h.pid = pid;
    } else {
        rc = harness_start(&h, pool_blocks, flags);
    }
    if (cvd)
        unsetenv("CUDA_VISIBLE_DEVICES");
    return rc;
}

static kvs_client_t *connect_worker(const char *name, kvs_geometry_t *g)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.worker_name = name;
    o.timeout_ms = 20000;
    double t0 = now_ms();
    int rc = kvs_connect(&o, &c);
    if (rc != 0) {
        fprintf(stderr, "%s: connect: %s\n", name, kvs_strerror(rc));
        return NULL;
    }
    printf("worker %s: connect and pool import %.2f ms\n", name, now_ms() - t0);
    fflush(stdout);
    if (kvs_geometry(c, g) != 0 || g->backend != KVS_BACKEND_CUDA) {
        fprintf(stderr, "%s: not a cuda pool\n", name);
        kvs_close(c);
        return NULL;
    }
    return c;
}

/* Writes (or checks) every slot of the blocks ids[0..n). */
static int every_slot(kvs_client_t *c, const kvs_geometry_t *g, const uint32_t *ids, size_t n,
                      int write)
{
    uint8_t *buf = malloc(g->slot_bytes);
    int rc = buf ? 0 : 1;
    for (size_t j = 0; rc == 0 && j < n; j++)
        for (uint32_t l = 0; rc == 0 && l < g->layers; l++)
            for (uint32_t kv = 0; rc == 0 && kv < 2; kv++) {
                if (write) {
                    for (size_t i = 0; i < g->slot_bytes; i++)
                        buf[i] = pattern(l, kv, ids[j], i);
                    if (kvs_block_write(c, l, kv, ids[j], buf, g->slot_bytes) != 0)
                        rc = 2;
                    continue;
                }
                if (kvs_block_read(c, l, kv, ids[j], buf, g->slot_bytes) != 0) {
                    rc = 3;
                    continue;
                }
                for (size_t i = 0; i < g->slot_bytes; i++)
                    if (buf[i] != pattern(l, kv, ids[j], i)) {
                        fprintf(stderr, "block %u layer %u kv %u byte %zu differs\n", ids[j], l, kv,
                                i);
                        rc = 4;
                        break;
                    }
            }
    if (rc != 0)
        fprintf(stderr, "every_slot(%s): %d: %s\n", write ? "write" : "check", rc,
                kvs_last_error(c));
    free(buf);
    return rc;
}

/* n_blocks full blocks of the daemon's block size, and a partial one. */
static uint32_t *prompt_tokens(const kvs_geometry_t *g, size_t *n)
{
    *n = (size_t)n_blocks * g->block_tokens + 1;
    uint32_t *t = malloc(*n * sizeof(*t));
    for (size_t i = 0; t && i < *n; i++)
        t[i] = (uint32_t)(i * 31 + 7);
    return t;
}

static int writer(void)
{
    kvs_geometry_t g;
    kvs_client_t *c = connect_worker("A", &g);
    size_t n_tokens, n = 0;
    if (!c)
        return 10;
    uint32_t *tokens = prompt_tokens(&g, &n_tokens);
    uint32_t *ids = calloc(n_blocks, sizeof(*ids)), *can = calloc(n_blocks, sizeof(*can));
    if (!tokens || !ids || !can || g.num_blocks < n_blocks)
        return 10;
    printf("pool: %llu bytes, %u blocks of %llu B, %u layers, %llu-byte slots; A writes %u\n",
           (unsigned long long)g.pool_bytes, g.num_blocks, (unsigned long long)g.block_bytes,
           g.layers, (unsigned long long)g.slot_bytes, n_blocks);
    fflush(stdout);
    if (kvs_alloc(c, NULL, n_blocks, ids) != 0)
        return 11;
    if (every_slot(c, &g, ids, n_blocks, 1) != 0)
        return 12;
    if (kvs_commit(c, NULL, tokens, n_tokens, ids, n_blocks, can, &n) != 0 || n != n_blocks)
        return 13;
    kvs_close(c);
    free(tokens);
    free(ids);
    free(can);
    return 0;
}

/* Looks the prompt up (pinned) and checks every slot. */
static kvs_client_t *reader(const char *name, uint32_t *ids, int *rc)
{
    kvs_geometry_t g;
    size_t n_tokens, n = 0;
    kvs_client_t *c = connect_worker(name, &g);
    uint32_t *tokens = c ? prompt_tokens(&g, &n_tokens) : NULL;
    *rc = 20;
    if (tokens && kvs_lookup(c, NULL, tokens, n_tokens, 1, ids, n_blocks, &n) == 0 && n == n_blocks)
        *rc = every_slot(c, &g, ids, n, 0) == 0 ? 0 : 21;
    free(tokens);
    return c;
}

/* H: reads, says 'r', waits for 'k' (the daemon is dead then), reads again,
 * waits for the new daemon to be retrying, makes a call: no daemon, so the
 * pool is let go, and with it (on the test driver) the "full" device. */
static int holder(int in, int out)
{
    uint32_t *ids = calloc(n_blocks, sizeof(*ids));
    int rc;
    kvs_client_t *c = reader("H", ids, &rc);
    char byte = 'r';
    kvs_geometry_t g;
    if (rc != 0 || write(out, &byte, 1) != 1 || read(in, &byte, 1) != 1 || byte != 'k')
        return rc ? rc : 30;
    kvs_geometry(c, &g);
    if (every_slot(c, &g, ids, n_blocks, 0) != 0)
        return 31;
    sleep(1);
    size_t n = 99;
    rc = kvs_lookup(c, NULL, NULL, 0, 0, NULL, 0, &n);
    /* No daemon yet: the old pool is gone. Or (where the new daemon needed
     * no retry) already the new one: then the old pool was replaced. */
    if (!(rc == KVS_ENOTCONN && kvs_pool_base(c) == 0) && !(rc == 0 && kvs_epoch(c) == 2)) {
        fprintf(stderr, "H: after the daemon died: %d (%s), pool base %#lx\n", rc,
                kvs_last_error(c), (unsigned long)kvs_pool_base(c));
        return 32;
    }
    unlink(held_path);
    kvs_close(c);
    free(ids);
    return 0;
}

/* After the restart: an empty pool that works. */
static int fresh_worker(void)
{
    kvs_geometry_t g;
    kvs_client_t *c = connect_worker("B2", &g);
    uint32_t id;
    uint8_t one = 0x42, back = 0;
    if (!c || kvs_alloc(c, NULL, 1, &id) != 0 || kvs_block_write(c, 0, 1, id, &one, 1) != 0 ||
        kvs_block_read(c, 0, 1, id, &back, 1) != 0 || back != one)
        return 40;
    kvs_close(c);
    return 0;
}

static pid_t run_async(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn());
    return pid;
}

static int wait_exit(pid_t pid)
{
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return 99;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 98;
}

static int report(const char *step, int rc)
{
    printf("step %s: %s", step, rc == 0 ? "pass\n" : "FAIL");
    if (rc != 0)
        printf(" (%d)\n", rc);
    fflush(stdout);
    return rc;
}

int main(int argc, char **argv)
{
    char why[256];
    int first_flag = 1;
    if (argc > 2 && strcmp(argv[1], "--blocks") == 0) {
        n_blocks = (uint32_t)strtoul(argv[2], NULL, 10);
        first_flag = 3;
    }
    if (n_blocks == 0 || n_blocks > MAX_BLOCKS) {
        fprintf(stderr, "usage: test_cuda_share [--blocks 1..%d] [KVSHARED-FLAG...]\n", MAX_BLOCKS);
        return 2;
    }
    int n_flags = 2;
    for (int i = first_flag; i < argc && n_flags < 63; i++)
        flags[n_flags++] = argv[i];
    flags[n_flags] = NULL;
    pool_blocks = n_blocks > 64 ? n_blocks : 64;
    if (probe_in_child(why, sizeof(why)) != 0) {
        printf("skipped: no CUDA device (%s)\n", why);
        return SKIP;
    }
    if (start_daemon(0) != 0) {
        fprintf(stderr, "kvshared --backend cuda did not start\n");
        return 1;
    }
    int fake = getenv("KVS_FAKE_CUDA") != NULL;
    snprintf(held_path, sizeof(held_path), "%s/old-pool-held", h.dir);
    setenv("KVS_FAKE_CUDA_OOM_WHILE", held_path, 1);

    int failed = 0;
    int rc = wait_exit(run_async(writer));
    if (rc == 0) {
        pid_t b = fork();
        if (b == 0) {
            uint32_t *ids = calloc(n_blocks, sizeof(*ids));
            int r;
            kvs_close(reader("B", ids, &r));
            free(ids);
            _exit(r);
        }
        rc = wait_exit(b);
    }
    failed |= report("share (every K and V slot of the blocks A wrote, read by B)", rc);

    /* outlive + restart */
    int to_h[2], from_h[2];
    if (pipe(to_h) != 0 || pipe(from_h) != 0)
        return 1;
    fflush(NULL);
    pid_t hp = fork();
    if (hp == 0) {
        close(to_h[1]);
        close(from_h[0]);
        _exit(holder(to_h[0], from_h[1]));
    }
    close(to_h[0]);
    close(from_h[1]);
    char byte = 0;
    rc = read(from_h[0], &byte, 1) == 1 && byte == 'r' ? 0 : 50;
    kill(h.pid, SIGKILL);
    waitpid(h.pid, NULL, 0);
    h.pid = 0;
    if (fake) {
        FILE *f = fopen(held_path, "w"); /* the device still holds the old pool */
        if (f)
            fclose(f);
    }
    byte = 'k';
    if (write(to_h[1], &byte, 1) != 1)
        rc = 51;
    double t0 = now_ms();
    int started = start_daemon(1);
    double waited = (now_ms() - t0) / 1e3;
    int hrc = wait_exit(hp);
    failed |= report("outlive (the killed daemon's pool still read, then let go)", rc ? rc : hrc);
    rc = started != 0 ? 60 : fake && waited < 0.9 ? 61 : wait_exit(run_async(fresh_worker));
    printf("restart: the new daemon listened after %.2f s%s\n", waited,
           fake ? " (device full until the old pool was let go)" : "");
    failed |= report("restart (cuMemCreate retried while workers held the old pool)", rc);
    close(to_h[1]);
    close(from_h[0]);

    int stop = h.pid > 0 ? harness_stop(&h) : -1;
    unlink(held_path);
    harness_cleanup(&h);
    failed |= report("daemon exits cleanly", stop);
    return failed ? 1 : 0;
}
