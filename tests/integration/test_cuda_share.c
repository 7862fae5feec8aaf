/*
 * Two worker processes share a prefix through a kvshared with the cuda
 * backend: A writes its blocks in device memory (kvs_block_write, through
 * its own import of the pool), B looks the prompt up and reads the same
 * bytes through its import. Skipped (exit 77) where no CUDA device answers.
 *
 * The parent never initialises CUDA (the probe runs in a child), so that the
 * workers it forks start clean.
 *
 *   test_cuda_share [--blocks N] [KVSHARED-FLAG...]
 *
 * --blocks: how many blocks A writes and B reads (default 4); the flags that
 * follow go to kvshared after the test's own (later ones win), e.g. a larger
 * geometry. Each worker prints the time its connect took (Hello, the fds,
 * the import of the pool). KVS_KVSHARED names the daemon to start.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "daemon_harness.h"
#include "kvshare.h"

#define SKIP       77
#define MAX_BLOCKS 4096

static harness_t h;
static uint32_t n_blocks = 4;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

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

static uint8_t pattern(uint32_t layer, uint32_t kv, uint32_t j, size_t i)
{
    return (uint8_t)(layer * 29 + kv * 11 + j * 5 + i);
}

static kvs_client_t *connect_worker(const char *name)
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
    return c;
}

static int worker(int writer)
{
    kvs_client_t *c = connect_worker(writer ? "A" : "B");
    kvs_geometry_t g;
    uint32_t *ids = calloc(n_blocks, sizeof(*ids)), *can = calloc(n_blocks, sizeof(*can));
    size_t n;
    if (!c || !ids || !can || kvs_geometry(c, &g) != 0 || g.backend != KVS_BACKEND_CUDA)
        return 10;
    /* n_blocks full blocks of the daemon's block size, and a partial one. */
    size_t n_tokens = (size_t)n_blocks * g.block_tokens + 1;
    uint32_t *tokens = malloc(n_tokens * sizeof(*tokens));
    uint8_t *buf = malloc(g.slot_bytes);
    if (!buf || !tokens)
        return 10;
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i] = (uint32_t)(i * 31 + 7);
    if (writer) {
        if (kvs_lookup(c, NULL, tokens, n_tokens, 1, ids, n_blocks, &n) != 0 || n != 0 ||
            kvs_alloc(c, NULL, n_blocks, ids) != 0)
            return 11;
    } else {
        if (kvs_lookup(c, NULL, tokens, n_tokens, 1, ids, n_blocks, &n) != 0 || n != n_blocks)
            return 20;
    }
    for (uint32_t j = 0; j < n_blocks; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                if (writer) {
                    for (size_t i = 0; i < g.slot_bytes; i++)
                        buf[i] = pattern(l, kv, j, i);
                    if (kvs_block_write(c, l, kv, ids[j], buf, g.slot_bytes) != 0) {
                        fprintf(stderr, "A: write: %s\n", kvs_last_error(c));
                        return 12;
                    }
                } else {
                    if (kvs_block_read(c, l, kv, ids[j], buf, g.slot_bytes) != 0)
                        return 21;
                    for (size_t i = 0; i < g.slot_bytes; i++)
                        if (buf[i] != pattern(l, kv, j, i)) {
                            fprintf(stderr, "B: block %u layer %u kv %u byte %zu differs\n", ids[j],
                                    l, kv, i);
                            return 22;
                        }
                }
            }
    if (writer &&
        (kvs_commit(c, NULL, tokens, n_tokens, ids, n_blocks, can, &n) != 0 || n != n_blocks))
        return 13;
    printf("worker %s: %s %u blocks of %llu B, %u layers\n", writer ? "A" : "B",
           writer ? "wrote" : "read back", n_blocks, (unsigned long long)g.block_bytes, g.layers);
    fflush(stdout);
    free(buf);
    free(tokens);
    free(ids);
    free(can);
    kvs_close(c);
    return 0;
}

static int run(int writer)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(worker(writer));
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
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
    const char *flags[64] = {"--backend", "cuda"};
    int n_flags = 2;
    for (int i = first_flag; i < argc && n_flags < 63; i++)
        flags[n_flags++] = argv[i];
    flags[n_flags] = NULL;
    if (probe_in_child(why, sizeof(why)) != 0) {
        printf("skipped: no CUDA device (%s)\n", why);
        return SKIP;
    }
    if (harness_start(&h, n_blocks > 64 ? n_blocks : 64, flags) != 0) {
        fprintf(stderr, "kvshared --backend cuda did not start\n");
        return 1;
    }
    int a = run(1), b = a == 0 ? run(0) : -1;
    int stop = harness_stop(&h);
    harness_cleanup(&h);
    printf("writer %d, reader %d, daemon exit %d\n", a, b, stop);
    return a == 0 && b == 0 && stop == 0 ? 0 : 1;
}
