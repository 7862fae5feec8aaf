/*
 * Two worker processes share a prefix through a kvshared with the cuda
 * backend: A writes its blocks in device memory (kvs_block_write, through
 * its own import of the pool), B looks the prompt up and reads the same
 * bytes through its import. Skipped (exit 77) where no CUDA device answers.
 *
 * The parent never initialises CUDA (the probe runs in a child), so that the
 * workers it forks start clean.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "daemon_harness.h"
#include "kvshare.h"

#define SKIP   77
#define BLOCKS 4

static harness_t h;

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
    int rc = kvs_connect(&o, &c);
    if (rc != 0) {
        fprintf(stderr, "%s: connect: %s\n", name, kvs_strerror(rc));
        return NULL;
    }
    return c;
}

static int worker(int writer, const uint32_t *tokens, size_t n_tokens)
{
    kvs_client_t *c = connect_worker(writer ? "A" : "B");
    kvs_geometry_t g;
    uint32_t ids[BLOCKS], can[BLOCKS];
    size_t n;
    if (!c || kvs_geometry(c, &g) != 0 || g.backend != KVS_BACKEND_CUDA)
        return 10;
    uint8_t *buf = malloc(g.slot_bytes);
    if (writer) {
        if (kvs_lookup(c, NULL, tokens, n_tokens, 1, ids, BLOCKS, &n) != 0 || n != 0 ||
            kvs_alloc(c, NULL, BLOCKS, ids) != 0)
            return 11;
    } else {
        if (kvs_lookup(c, NULL, tokens, n_tokens, 1, ids, BLOCKS, &n) != 0 || n != BLOCKS)
            return 20;
    }
    for (uint32_t j = 0; j < BLOCKS; j++)
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
                        if (buf[i] != pattern(l, kv, j, i))
                            return 22;
                }
            }
    if (writer && (kvs_commit(c, NULL, tokens, n_tokens, ids, BLOCKS, can, &n) != 0 || n != BLOCKS))
        return 13;
    free(buf);
    kvs_close(c);
    return 0;
}

static int run(int writer, const uint32_t *tokens, size_t n)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(worker(writer, tokens, n));
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

int main(void)
{
    char why[256];
    if (probe_in_child(why, sizeof(why)) != 0) {
        printf("skipped: no CUDA device (%s)\n", why);
        return SKIP;
    }
    static const char *const cuda[] = {"--backend", "cuda", NULL};
    if (harness_start(&h, 64, cuda) != 0) {
        fprintf(stderr, "kvshared --backend cuda did not start\n");
        return 1;
    }
    uint32_t tokens[BLOCKS * 4 + 1];
    for (size_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++)
        tokens[i] = (uint32_t)(i * 31 + 7);
    size_t n = sizeof(tokens) / sizeof(tokens[0]);
    int a = run(1, tokens, n), b = a == 0 ? run(0, tokens, n) : -1;
    int stop = harness_stop(&h);
    harness_cleanup(&h);
    printf("writer %d, reader %d, daemon exit %d\n", a, b, stop);
    return a == 0 && b == 0 && stop == 0 ? 0 : 1;
}
