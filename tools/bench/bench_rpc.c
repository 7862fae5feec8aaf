/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench rpc: Lookup latency and throughput against a real kvshared, next to
 * a raw Unix-socket ping-pong of the same request and reply sizes measured
 * in the same run (the floor any RPC over this socket pays).
 *
 *   for prompt sizes (64, 4k, 32k tokens) x client processes (1, 4, 16):
 *     kvs:  each client process loops kvs_lookup (synchronous, no pin) on a
 *           prompt whose blocks are all cached (a full hit);
 *     raw:  the same processes send frames of the same size to a trivial
 *           server that answers each with a frame the size of the Lookup
 *           reply;
 *   pipelined: 64-token Lookups written 64 at a time on 1 and 4 connections,
 *           replies read after each batch.
 *
 * Latencies are per round trip (p50, p99 over all clients); throughput is
 * round trips per second over all clients. Processes are not pinned to CPUs.
 *
 * --events: the cost of KV events instead. Two daemons run side by side,
 * one without --kv-events and one publishing (ipc://, default namespace
 * mapped to a model) to one live subscriber process that reads every
 * message; in alternating rounds, 16 clients loop 4k-token Lookups (full
 * hits), then 16 clients loop Commits of 256 new tokens each (Alloc before,
 * Release after, outside the timing; the pool is small, so commits evict and
 * publish BlockRemoved too).
 *
 * --tier: the loop target of tier 2 instead (issue 14: a Lookup that hits
 * tier 1 keeps its p99 within 2x of idle while other sessions promote and
 * demote at full speed). One kvshared with a pool of 1,024 blocks of 256 KiB
 * and a tier 2 of 4,096 (1.25 GiB in all). The bench's own session commits a
 * 4k-token prefix and keeps it pinned, so it stays in tier 1. In each round,
 * phases in rotating order, S/N seconds each:
 *   idle:  one victim process loops kvs_lookup of that prefix (no pin; a
 *          full tier-1 hit, checked) alone;
 *   churn: the same while --churn processes, started first and seen both
 *          promoting and demoting, loop at full speed: write a new 1k-token
 *          prefix (Alloc + Commit + Release: the full pool demotes 64
 *          blocks), then a pinned Lookup of the prefix they wrote 8 writes
 *          before, demoted by then (promotes 64 blocks, demoting as many to
 *          make room), and Release;
 *   raw:   the raw ping-pong of the victim's frame sizes, the floor.
 * Printed: p50/p99/max of each, p99(churn)/p99(idle), and the churn's
 * demotions, promotions and bytes copied per second from the daemon's
 * counters, and the daemon's loop thread's time on a CPU and waiting for one
 * (schedstat): on a machine with few CPUs the copy threads compete with it.
 *
 * --tier --disk: the same with a disk tier (issue 25): tier 2 is only 256
 * blocks and a disk tier of 2,048 slots (a file in the bench's temporary
 * directory) lies below it, so the churn's writes spill through tier 2 to
 * the disk and its lagged Lookups read their blocks back from the disk:
 * the loop keeps serving tier-1 hits while the disk tier is busy.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "bench.h"
#include "frame_header.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "launch.h"
#include "now.h"
#include "socket_path.h"
#include "test_tmp.h"

#define BENCH_BT    16
#define MAX_CLIENTS 64
#define MAX_SAMPLES (1u << 20)
#define PIPE_DEPTH  64

/* --tier: bytes per block (see start_daemon). */
#define TIER_BLOCK_BYTES (256u << 10)

typedef struct bench_cfg {
    const char *kvshared;
    const char *socket_path;
    char dir[SOCKET_PATH_MAX - sizeof("/kvshared.sock")];
    char kvs_sock[SOCKET_PATH_MAX];
    char raw_sock[SOCKET_PATH_MAX];
    double seconds;
    pid_t daemon_pid;
    const char *events;    /* --kv-events endpoint of the daemon; NULL: off */
    const char *copy_nice; /* --tier-copy-nice of the daemon; NULL: its default */
    const char *loop_rt;   /* --loop-rt-priority of the daemon; NULL: normal priority */
    unsigned disk_blocks;  /* --tier --disk: slots of the disk tier; 0: none */
    char disk_path[SOCKET_PATH_MAX + 16];
} bench_cfg_t;

static double now_us(void)
{
    return (double)now_ns() / 1e3;
}

static void prompt(uint32_t *t, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        t[i] = x % 128000;
    }
}

/* --- the daemon --- */

/* The daemon, host backend, 16-token blocks. Without tier 2 the blocks are
 * tiny (16 B per token: the RPC alone is measured); with tier2 (--tier) they
 * are 256 KiB (4 layers, 8 KV heads, head_dim 128, bf16: 16 KiB per token),
 * so that copies between the tiers take real time, and tier 2 holds tier2
 * blocks. */
static int start_daemon(bench_cfg_t *b, unsigned blocks, unsigned tier2)
{
    char nb[16], t2[32], t3[32];
    snprintf(nb, sizeof(nb), "%u", blocks);
    snprintf(t2, sizeof(t2), "%llu", (unsigned long long)tier2 * TIER_BLOCK_BYTES);
    /* A disk slot is the block and its record header, in 4 KiB units. */
    snprintf(t3, sizeof(t3), "%llu",
             (unsigned long long)b->disk_blocks * (TIER_BLOCK_BYTES + 4096u));
    const char *argv[40] = {b->kvshared,
                            "--socket",
                            b->kvs_sock,
                            "--backend",
                            "host",
                            "--layers",
                            tier2 ? "4" : "1",
                            "--kv-heads",
                            tier2 ? "8" : "1",
                            "--head-dim",
                            tier2 ? "128" : "8",
                            "--dtype",
                            tier2 ? "bf16" : "fp16",
                            "--block-tokens",
                            "16",
                            "--pool-blocks",
                            nb,
                            "--max-frame",
                            "64M",
                            "--log-level",
                            "warn"};
    int n = 21;
    if (tier2) {
        argv[n++] = "--host-tier";
        argv[n++] = t2;
    }
    if (tier2 && b->copy_nice) {
        argv[n++] = "--tier-copy-nice";
        argv[n++] = b->copy_nice;
    }
    if (b->loop_rt) {
        argv[n++] = "--loop-rt-priority";
        argv[n++] = b->loop_rt;
    }
    if (tier2 && b->disk_blocks) {
        argv[n++] = "--disk-tier-path";
        argv[n++] = b->disk_path;
        argv[n++] = "--disk-tier-bytes";
        argv[n++] = t3;
    }
    if (b->events) {
        argv[n++] = "--kv-events";
        argv[n++] = b->events;
        argv[n++] = "--kv-events-model";
        argv[n++] = "bench";
    }
    argv[n] = NULL;
    pid_t pid = launch_daemon(argv, LAUNCH_READY_MS, NULL);
    if (pid < 0)
        return -1;
    b->daemon_pid = pid;
    return 0;
}

/* --- the raw ping-pong server: answers each frame with reply_len bytes --- */

static void raw_server(int lfd, size_t reply_len)
{
    struct pollfd fds[MAX_CLIENTS + 1];
    uint8_t *bufs[MAX_CLIENTS + 1] = {0};
    size_t have[MAX_CLIENTS + 1] = {0}, cap = 1 << 20;
    int n = 1;
    uint8_t *reply = calloc(1, reply_len + 4);
    frame_put_len(reply, (uint32_t)reply_len);
    fds[0].fd = lfd;
    fds[0].events = POLLIN;
    for (;;) {
        if (poll(fds, (nfds_t)n, -1) < 0)
            continue;
        if (fds[0].revents & POLLIN) {
            int cfd = accept(lfd, NULL, NULL);
            if (cfd >= 0 && n <= MAX_CLIENTS) {
                fds[n].fd = cfd;
                fds[n].events = POLLIN;
                bufs[n] = malloc(cap);
                have[n] = 0;
                n++;
            }
        }
        for (int i = 1; i < n; i++) {
            if (!(fds[i].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t r = read(fds[i].fd, bufs[i] + have[i], cap - have[i]);
            if (r <= 0) {
                close(fds[i].fd);
                free(bufs[i]);
                fds[i] = fds[n - 1];
                bufs[i] = bufs[n - 1];
                have[i] = have[n - 1];
                n--;
                i--;
                continue;
            }
            have[i] += (size_t)r;
            size_t off = 0;
            while (have[i] - off >= 4) {
                const uint8_t *p = bufs[i] + off;
                size_t len = frame_get_len(p);
                if (have[i] - off < 4 + len)
                    break;
                off += 4 + len;
                /* A client that went away is noticed by the next read. */
                (void)bench_write_all(fds[i].fd, reply, reply_len + 4);
            }
            memmove(bufs[i], bufs[i] + off, have[i] - off);
            have[i] -= off;
        }
    }
}

static pid_t start_raw_server(bench_cfg_t *b, size_t reply_len)
{
    unlink(b->raw_sock);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", b->raw_sock);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(lfd, 128))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        raw_server(lfd, reply_len);
    }
    close(lfd);
    return pid;
}

static int raw_connect(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0)
        return -1;
    return fd;
}

/* --- one measured cell: `clients` processes, each looping for `seconds` --- */

typedef struct shared_results {
    uint32_t count[MAX_CLIENTS];
    uint64_t calls[MAX_CLIENTS]; /* every call, sampled or not */
    double cpu_s[MAX_CLIENTS];   /* the client process's CPU time over its calls */
    int failed;
    float samples[]; /* MAX_CLIENTS x per_client */
} shared_results_t;

typedef struct cell {
    double p50_us, p99_us, per_sec;
} cell_t;

typedef enum mode { MODE_KVS, MODE_RAW, MODE_COMMIT } mode_t_;

#define COMMIT_TOKENS 256

/* The Lookup request frame for tokens, for sizing the raw ping-pong. */
static size_t lookup_request_bytes(const uint32_t *tokens, size_t n)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.tokens.data = (uint8_t *)tokens;
    lk.tokens.len = n * 4;
    lk.ns = "";
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    req.id = 1000000;
    return kvshare__request__get_packed_size(&req);
}

static size_t lookup_reply_bytes(size_t n_blocks, uint32_t first_id)
{
    uint32_t *ids = malloc((n_blocks ? n_blocks : 1) * sizeof(uint32_t));
    for (size_t i = 0; i < n_blocks; i++)
        ids[i] = first_id + (uint32_t)i;
    Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
    Kvshare__LookupReply lr = KVSHARE__LOOKUP_REPLY__INIT;
    lr.block_ids = ids;
    lr.n_block_ids = n_blocks;
    lr.hit_tokens = (uint32_t)(n_blocks * BENCH_BT);
    resp.rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
    resp.lookup = &lr;
    resp.id = 1000000;
    size_t size = kvshare__response__get_packed_size(&resp);
    free(ids);
    return size;
}

/* This process's CPU time, seconds. */
static double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A connection to the daemon under test, without mapping the pool (the
 * bench reads no block); NULL with the reason on stderr, saying who. */
static kvs_client_t *bench_connect(const bench_cfg_t *b, const char *who, int idx, int timeout_ms)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->kvs_sock;
    o.timeout_ms = timeout_ms;
    o.flags = KVS_NO_MAP;
    int rc = kvs_connect(&o, &c);
    if (rc != 0) {
        fprintf(stderr, "bench rpc: %s %d: connect: %s\n", who, idx, kvs_strerror(rc));
        return NULL;
    }
    return c;
}

static void client_loop(const bench_cfg_t *b, mode_t_ mode, const uint32_t *tokens, size_t n_tokens,
                        size_t request_bytes, size_t reply_bytes, int go_fd, shared_results_t *res,
                        int idx, uint32_t per_client, double seconds)
{
    kvs_client_t *c = NULL;
    int fd = -1;
    uint8_t *req = NULL, *reply = NULL;
    uint32_t *ids = malloc((n_tokens / BENCH_BT + 1) * sizeof(uint32_t));
    uint32_t *canon = malloc((n_tokens / BENCH_BT + 1) * sizeof(uint32_t));
    uint32_t *fresh = malloc(n_tokens * sizeof(uint32_t));
    size_t n_ids;
    if (!ids || !canon || !fresh)
        goto fail;
    if (mode == MODE_KVS || mode == MODE_COMMIT) {
        c = bench_connect(b, "client", idx, 10000);
        if (!c)
            goto fail;
    } else {
        fd = raw_connect(b->raw_sock);
        req = calloc(1, request_bytes + 4);
        reply = malloc(reply_bytes + 4);
        if (fd < 0 || !req || !reply) {
            fprintf(stderr, "bench rpc: client %d: raw connect: %s\n", idx, strerror(errno));
            goto fail;
        }
        frame_put_len(req, (uint32_t)request_bytes);
    }
    char go;
    if (read(go_fd, &go, 1) != 1) {
        fprintf(stderr, "bench rpc: client %d: no start signal\n", idx);
        goto fail;
    }
    double end = now_us() + seconds * 1e6, cpu0 = process_cpu_s();
    uint32_t k = 0, iter = 0;
    uint64_t calls = 0;
    float *out = res->samples + (size_t)idx * per_client;
    for (;;) {
        calls++;
        double t0 = now_us();
        if (mode == MODE_COMMIT) {
            /* A prompt no one committed before: every block is new. */
            size_t nb = n_tokens / BENCH_BT, done;
            memcpy(fresh, tokens, n_tokens * sizeof(uint32_t));
            fresh[0] = (uint32_t)idx << 24 | iter++;
            fresh[1] = (uint32_t)getpid();
            int rc = kvs_alloc(c, NULL, (uint32_t)nb, ids);
            t0 = now_us();
            if (rc == 0)
                rc = kvs_commit(c, NULL, fresh, n_tokens, ids, nb, canon, &done);
            double t1 = now_us();
            if (rc == 0)
                rc = kvs_release(c, canon, nb, NULL);
            if (rc != 0) {
                fprintf(stderr, "bench rpc: client %d: commit: %s\n", idx, kvs_last_error(c));
                goto fail;
            }
            if (k < per_client)
                out[k++] = (float)(t1 - t0);
            if (t1 >= end)
                break;
            continue;
        }
        if (mode == MODE_KVS) {
            int rc = kvs_lookup(c, NULL, tokens, n_tokens, 0, ids, n_tokens / BENCH_BT + 1, &n_ids);
            if (rc != 0 || n_ids != n_tokens / BENCH_BT) {
                fprintf(stderr, "bench rpc: client %d: lookup: %s (%zu blocks)\n", idx,
                        rc ? kvs_last_error(c) : "miss", n_ids);
                goto fail;
            }
        } else {
            if (bench_write_all(fd, req, request_bytes + 4) ||
                bench_read_all(fd, reply, reply_bytes + 4)) {
                fprintf(stderr, "bench rpc: client %d: raw round trip: %s\n", idx, strerror(errno));
                goto fail;
            }
        }
        double t1 = now_us();
        if (k < per_client)
            out[k++] = (float)(t1 - t0);
        if (t1 >= end)
            break;
    }
    res->count[idx] = k;
    res->calls[idx] = calls;
    res->cpu_s[idx] = process_cpu_s() - cpu0;
    kvs_close(c);
    _exit(0);
fail:
    res->failed = 1;
    _exit(1);
}

/* Samples of one cell, accumulated over its rounds. */
typedef struct samples {
    float *v;
    size_t n, cap;
    double elapsed_s;
    uint64_t calls;
    double client_cpu_s, server_cpu_s; /* server: < 0 once unknown */
} samples_t;

static int samples_add(samples_t *acc, const float *v, size_t n)
{
    if (acc->n + n > acc->cap) {
        size_t cap = acc->cap ? acc->cap : 65536;
        while (cap < acc->n + n)
            cap *= 2;
        float *p = realloc(acc->v, cap * sizeof(float));
        if (!p)
            return -1;
        acc->v = p;
        acc->cap = cap;
    }
    memcpy(acc->v + acc->n, v, n * sizeof(float));
    acc->n += n;
    return 0;
}

/* Seconds of CPU over calls, in microseconds a call (-1: unknown). */
static double per_call_us(double cpu_s, uint64_t calls)
{
    return cpu_s >= 0 && calls ? cpu_s * 1e6 / (double)calls : -1;
}

static void samples_result(samples_t *acc, cell_t *out)
{
    qsort(acc->v, acc->n, sizeof(float), bench_cmp_float);
    out->p50_us = acc->n ? acc->v[acc->n / 2] : 0;
    out->p99_us = acc->n ? acc->v[(size_t)((double)acc->n * 0.99)] : 0;
    out->per_sec = (double)acc->n / (acc->elapsed_s > 0 ? acc->elapsed_s : 1);
}

/* One round of a cell: `clients` processes for `seconds`; their round-trip
 * times are appended to acc. */
static int run_round(const bench_cfg_t *b, mode_t_ mode, const uint32_t *tokens, size_t n_tokens,
                     int clients, double seconds, samples_t *acc)
{
    uint32_t per_client = MAX_SAMPLES / (uint32_t)clients;
    size_t bytes = sizeof(shared_results_t) + (size_t)MAX_SAMPLES * sizeof(float);
    shared_results_t *res =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return -1;
    memset(res, 0, sizeof(*res));
    size_t request_bytes = lookup_request_bytes(tokens, n_tokens);
    size_t reply_bytes = lookup_reply_bytes(n_tokens / BENCH_BT, 1000);
    pid_t server = -1;
    if (mode == MODE_RAW && (server = start_raw_server((bench_cfg_t *)b, reply_bytes)) < 0) {
        munmap(res, bytes);
        return -1;
    }
    int go[2];
    if (pipe(go) != 0)
        return -1;
    pid_t pids[MAX_CLIENTS];
    for (int i = 0; i < clients; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(go[1]);
            client_loop(b, mode, tokens, n_tokens, request_bytes, reply_bytes, go[0], res, i,
                        per_client, seconds);
        }
    }
    close(go[0]);
    usleep(100000); /* let every client connect */
    pid_t srv = mode == MODE_RAW ? server : b->daemon_pid;
    double t0 = now_us(), srv0 = bench_process_cpu_seconds(srv);
    for (int i = 0; i < clients; i++)
        if (write(go[1], "g", 1) != 1)
            res->failed = 1;
    close(go[1]);
    for (int i = 0; i < clients; i++)
        waitpid(pids[i], NULL, 0);
    acc->elapsed_s += (now_us() - t0) / 1e6;
    double srv1 = bench_process_cpu_seconds(srv);
    if (srv0 < 0 || srv1 < 0 || acc->server_cpu_s < 0)
        acc->server_cpu_s = -1;
    else
        acc->server_cpu_s += srv1 - srv0;
    for (int i = 0; i < clients; i++) {
        acc->calls += res->calls[i];
        acc->client_cpu_s += res->cpu_s[i];
    }
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
    int rc = res->failed ? -1 : 0;
    for (int i = 0; i < clients && rc == 0; i++)
        if (samples_add(acc, res->samples + (size_t)i * per_client, res->count[i]) != 0)
            rc = -1;
    munmap(res, bytes);
    return rc;
}

/* Pipelined: `depth` Lookups written at once per connection, replies read
 * after. *cpu_us: the daemon's CPU time per Lookup (negative when unknown). */
static int run_pipelined(const bench_cfg_t *b, const uint32_t *tokens, size_t n_tokens, int conns,
                         double *per_sec, double *cpu_us)
{
    size_t bytes = sizeof(shared_results_t);
    shared_results_t *res =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(res, 0, bytes);
    int go[2];
    if (pipe(go) != 0)
        return -1;
    pid_t pids[MAX_CLIENTS];
    for (int i = 0; i < conns; i++) {
        pids[i] = fork();
        if (pids[i] != 0)
            continue;
        close(go[1]);
        int fd = raw_connect(b->kvs_sock);
        Kvshare__Request req = KVSHARE__REQUEST__INIT;
        Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
        lk.tokens.data = (uint8_t *)tokens;
        lk.tokens.len = n_tokens * 4;
        req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
        req.lookup = &lk;
        size_t one = kvshare__request__get_packed_size(&req) + 4;
        uint8_t *batch = malloc(one * PIPE_DEPTH + 16 * PIPE_DEPTH), *in = malloc(1 << 20);
        size_t blen = 0;
        for (int d = 0; d < PIPE_DEPTH; d++) {
            req.id = (uint64_t)d + 1;
            size_t sz = kvshare__request__get_packed_size(&req);
            frame_put_len(batch + blen, (uint32_t)sz);
            kvshare__request__pack(&req, batch + blen + 4);
            blen += sz + 4;
        }
        char g;
        if (fd < 0 || read(go[0], &g, 1) != 1)
            _exit(1);
        double end = now_us() + b->seconds * 1e6;
        uint32_t done = 0;
        size_t have = 0;
        while (now_us() < end) {
            if (bench_write_all(fd, batch, blen))
                _exit(1);
            int got = 0;
            while (got < PIPE_DEPTH) {
                ssize_t r = read(fd, in + have, (1 << 20) - have);
                if (r <= 0)
                    _exit(1);
                have += (size_t)r;
                size_t off = 0;
                while (have - off >= 4) {
                    size_t len = frame_get_len(in + off);
                    if (have - off < 4 + len)
                        break;
                    if (done == 0 && got == 0) {
                        /* The first reply must be a full hit, not an error. */
                        Kvshare__Response *r = kvshare__response__unpack(NULL, len, in + off + 4);
                        int good = r && r->status == 0 && r->lookup &&
                                   r->lookup->n_block_ids == n_tokens / BENCH_BT;
                        if (r)
                            kvshare__response__free_unpacked(r, NULL);
                        if (!good)
                            _exit(2);
                    }
                    off += 4 + len;
                    got++;
                }
                memmove(in, in + off, have - off);
                have -= off;
            }
            done += PIPE_DEPTH;
        }
        res->count[i] = done;
        _exit(0);
    }
    close(go[0]);
    usleep(200000);
    double t0 = now_us(), cpu0 = bench_process_cpu_seconds(b->daemon_pid);
    for (int i = 0; i < conns; i++)
        if (write(go[1], "g", 1) != 1)
            res->failed = 1;
    close(go[1]);
    int ok = 1;
    for (int i = 0; i < conns; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    double elapsed = (now_us() - t0) / 1e6, cpu1 = bench_process_cpu_seconds(b->daemon_pid);
    uint64_t total = 0;
    for (int i = 0; i < conns; i++)
        total += res->count[i];
    *per_sec = (double)total / elapsed;
    *cpu_us = cpu0 >= 0 && cpu1 >= 0 && total ? (cpu1 - cpu0) * 1e6 / (double)total : -1;
    munmap(res, bytes);
    return ok ? 0 : -1;
}

/* Commits the prompt so that every Lookup of it is a full hit. With keep,
 * the committer's pins stay (the blocks are never evicted nor demoted) and
 * its open connection goes to *keep; the pins go when it is closed. */
static int warm(const bench_cfg_t *b, const uint32_t *tokens, size_t n_tokens, kvs_client_t **keep)
{
    size_t nb = n_tokens / BENCH_BT, done;
    kvs_client_t *c = bench_connect(b, "warm-up", 0, 10000);
    if (!c)
        return -1;
    uint32_t *ids = malloc(nb * sizeof(uint32_t)), *can = malloc(nb * sizeof(uint32_t));
    int rc = ids && can ? kvs_alloc(c, NULL, (uint32_t)nb, ids) : KVS_ENOMEM;
    if (rc == 0)
        rc = kvs_commit(c, NULL, tokens, n_tokens, ids, nb, can, &done);
    if (rc == 0 && !keep)
        rc = kvs_release(c, can, nb, NULL); /* cached, unpinned */
    if (rc != 0)
        fprintf(stderr, "bench rpc: warming a %zu-token prompt: %s\n", n_tokens, kvs_last_error(c));
    free(ids);
    free(can);
    if (rc == 0 && keep)
        *keep = c;
    else
        kvs_close(c);
    return rc;
}

/* The live subscriber of --events: reads every message until killed,
 * counting them in *count (shared memory). */
static pid_t start_subscriber(const char *endpoint, volatile uint64_t *count)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    if (!sub || zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0) != 0 || zmq_connect(sub, endpoint) != 0)
        _exit(1);
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sub, 0) >= 0 && !zmq_msg_more(&m))
            (*count)++;
        zmq_msg_close(&m);
    }
}

static void print_pair(const char *what, const samples_t *off_s, const samples_t *on_s)
{
    cell_t off, on;
    samples_result((samples_t *)off_s, &off);
    samples_result((samples_t *)on_s, &on);
    printf("%-28s %9.1fus %9.1fus %11.0f   %9.1fus %9.1fus %11.0f   %+6.1f%% %+6.1f%%\n", what,
           off.p50_us, off.p99_us, off.per_sec, on.p50_us, on.p99_us, on.per_sec,
           100.0 * (on.p50_us / off.p50_us - 1), 100.0 * (on.per_sec / off.per_sec - 1));
}

/* --events: the same cells against a daemon without and one with events. */
static int run_events(const bench_cfg_t *b, int rounds)
{
    enum { CLIENTS = 16, LOOKUP_TOKENS = 4096 };
    bench_cfg_t off = *b, on = *b;
    char endpoint[128];
    int rc = 0;
    snprintf(off.kvs_sock, sizeof(off.kvs_sock), "%s/off.sock", b->dir);
    snprintf(on.kvs_sock, sizeof(on.kvs_sock), "%s/on.sock", b->dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/events", b->dir);
    on.events = endpoint;
    volatile uint64_t *received =
        mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (received == MAP_FAILED)
        return 1;
    *received = 0;
    if (start_daemon(&off, 4096, 0) != 0 || start_daemon(&on, 4096, 0) != 0) {
        fprintf(stderr, "bench rpc: kvshared (%s) did not start; give --kvshared PATH\n",
                b->kvshared);
        if (off.daemon_pid > 0) {
            kill(off.daemon_pid, SIGTERM);
            waitpid(off.daemon_pid, NULL, 0);
        }
        return 1;
    }
    pid_t sub = start_subscriber(endpoint, received);
    uint32_t *lookup_tokens = malloc(LOOKUP_TOKENS * sizeof(uint32_t));
    uint32_t *commit_tokens = malloc(COMMIT_TOKENS * sizeof(uint32_t));
    prompt(lookup_tokens, LOOKUP_TOKENS, 1);
    prompt(commit_tokens, COMMIT_TOKENS, 2);
    usleep(200000); /* the subscriber connects */
    if (sub < 0 || warm(&off, lookup_tokens, LOOKUP_TOKENS, NULL) != 0 ||
        warm(&on, lookup_tokens, LOOKUP_TOKENS, NULL) != 0)
        rc = 1;
    samples_t lk_off = {0}, lk_on = {0}, cm_off = {0}, cm_on = {0};
    /* Lookups first: the commits then evict the warmed prompt. Off and on
     * alternate in short rounds, so drift falls on both alike. */
    for (int r = 0; r < rounds && rc == 0; r++)
        if (run_round(&off, MODE_KVS, lookup_tokens, LOOKUP_TOKENS, CLIENTS, b->seconds / rounds,
                      &lk_off) != 0 ||
            run_round(&on, MODE_KVS, lookup_tokens, LOOKUP_TOKENS, CLIENTS, b->seconds / rounds,
                      &lk_on) != 0)
            rc = 1;
    for (int r = 0; r < rounds && rc == 0; r++)
        if (run_round(&off, MODE_COMMIT, commit_tokens, COMMIT_TOKENS, CLIENTS, b->seconds / rounds,
                      &cm_off) != 0 ||
            run_round(&on, MODE_COMMIT, commit_tokens, COMMIT_TOKENS, CLIENTS, b->seconds / rounds,
                      &cm_on) != 0)
            rc = 1;
    if (rc == 0) {
        printf("# events off: kvshared without --kv-events; on: --kv-events ipc:// with one live "
               "subscriber\n");
        printf("%-28s %11s %11s %11s   %11s %11s %11s   %7s %7s\n", "", "off p50", "off p99",
               "off/s", "on p50", "on p99", "on/s", "p50", "rate");
        print_pair("lookup 4096 tok, 16 clients", &lk_off, &lk_on);
        print_pair("commit 256 tok, 16 clients", &cm_off, &cm_on);
        usleep(200000);
        printf("subscriber received %llu messages\n", (unsigned long long)*received);
    } else {
        fprintf(stderr, "bench rpc: a client failed\n");
    }
    free(lk_off.v);
    free(lk_on.v);
    free(cm_off.v);
    free(cm_on.v);
    free(lookup_tokens);
    free(commit_tokens);
    if (sub > 0) {
        kill(sub, SIGKILL);
        waitpid(sub, NULL, 0);
    }
    kill(off.daemon_pid, SIGTERM);
    kill(on.daemon_pid, SIGTERM);
    waitpid(off.daemon_pid, NULL, 0);
    waitpid(on.daemon_pid, NULL, 0);
    munmap((void *)received, sizeof(uint64_t));
    return rc;
}

/* --- --tier: a tier-1 Lookup while other sessions promote and demote --- */

enum {
    TIER_POOL_BLOCKS = 1024,   /* 256 MiB */
    TIER_T2_BLOCKS = 4096,     /* 1 GiB */
    TIER_DISK_T2_BLOCKS = 256, /* --disk: tier 2 of 64 MiB, */
    TIER_DISK_BLOCKS = 2048,   /*   above a disk tier of 2,048 slots (520 MiB) */
    TIER_VICTIM_TOKENS = 4096, /* 256 blocks, pinned in tier 1 */
    TIER_CHURN_TOKENS = 1024,  /* 64 blocks (16 MiB) per write and per promotion */
    TIER_LAG = 8,              /* a churn process looks up what it wrote 8 prefixes before */
    TIER_MAX_CHURN = 8,
};
#define TIER_CHURN_BLOCKS (TIER_CHURN_TOKENS / BENCH_BT)

/* What the churn processes share with the bench (shared memory). */
typedef struct churn_shared {
    int stop, failed;
    uint64_t iter[TIER_MAX_CHURN]; /* prefixes each has written, over all phases */
    uint64_t writes, lookups, hit_blocks, pool_full;
} churn_shared_t;

static uint32_t churn_seed(int idx, uint64_t i)
{
    return 0x40000000u + ((uint32_t)idx << 24) + (uint32_t)i;
}

/* A churn process, until sh->stop: writes a new prefix (Alloc, Commit,
 * Release: with the pool full, the Alloc demotes), then looks up, pinned,
 * the prefix it wrote TIER_LAG prefixes before, which the pool has demoted
 * by then (the Lookup promotes it), and releases it. */
static void churn_loop(const bench_cfg_t *b, int idx, int nice_value, churn_shared_t *sh)
{
    kvs_client_t *c = NULL;
    uint32_t tokens[TIER_CHURN_TOKENS], ids[TIER_CHURN_BLOCKS], canon[TIER_CHURN_BLOCKS];
    int rc;
    if (nice_value && setpriority(PRIO_PROCESS, 0, nice_value) != 0) {
        fprintf(stderr, "bench rpc: churn %d: setpriority: %s\n", idx, strerror(errno));
        goto fail;
    }
    c = bench_connect(b, "churn", idx, 30000);
    if (!c)
        goto fail;
    while (!__atomic_load_n(&sh->stop, __ATOMIC_RELAXED)) {
        uint64_t i = sh->iter[idx]++;
        size_t n;
        prompt(tokens, TIER_CHURN_TOKENS, churn_seed(idx, i));
        rc = kvs_alloc(c, NULL, TIER_CHURN_BLOCKS, ids);
        if (rc == KVS_EPOOLFULL) {
            /* Every other block pinned, written or being copied: counted. */
            __atomic_add_fetch(&sh->pool_full, 1, __ATOMIC_RELAXED);
        } else {
            if (rc == 0)
                rc = kvs_commit(c, NULL, tokens, TIER_CHURN_TOKENS, ids, TIER_CHURN_BLOCKS, canon,
                                &n);
            if (rc == 0)
                rc = kvs_release(c, canon, TIER_CHURN_BLOCKS, NULL);
            if (rc != 0) {
                fprintf(stderr, "bench rpc: churn %d: write: %s\n", idx, kvs_last_error(c));
                goto fail;
            }
            __atomic_add_fetch(&sh->writes, 1, __ATOMIC_RELAXED);
        }
        if (i < TIER_LAG)
            continue;
        prompt(tokens, TIER_CHURN_TOKENS, churn_seed(idx, i - TIER_LAG));
        rc = kvs_lookup(c, NULL, tokens, TIER_CHURN_TOKENS, 1, ids, TIER_CHURN_BLOCKS, &n);
        if (rc == 0 && n > 0)
            rc = kvs_release(c, ids, n, NULL);
        if (rc != 0) {
            fprintf(stderr, "bench rpc: churn %d: lookup: %s\n", idx, kvs_last_error(c));
            goto fail;
        }
        __atomic_add_fetch(&sh->lookups, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&sh->hit_blocks, n, __ATOMIC_RELAXED);
    }
    kvs_close(c);
    _exit(0);
fail:
    sh->failed = 1;
    _exit(1);
}

/* The daemon's tier counters, and its loop thread's time on a CPU and
 * waiting for one (/proc/PID/task/PID/schedstat, ns; 0 when unreadable). */
typedef struct tier_counts {
    uint64_t demotions, promotions, bytes, drops_t1, t2_drops, copy_us, disk_reads;
    uint64_t loop_run_ns, loop_wait_ns;
    double at_us;
} tier_counts_t;

static int tier_counts(kvs_client_t *c, pid_t daemon, tier_counts_t *out)
{
    kvs_stats_t st;
    int rc = kvs_stats(c, &st);
    if (rc != 0) {
        fprintf(stderr, "bench rpc: stats: %s\n", kvs_last_error(c));
        return -1;
    }
    memset(out, 0, sizeof(*out));
    out->at_us = now_us();
    out->demotions = st.tier_demotions;
    out->promotions = st.tier_promotions;
    out->bytes = st.tier_copied_bytes;
    out->drops_t1 = st.tier_drops_t1;
    out->t2_drops = st.tier2_drops;
    out->copy_us = st.tier_copy_us;
    out->disk_reads = st.disk_reads;
    kvs_stats_free(&st);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)daemon, (int)daemon);
    FILE *f = fopen(path, "r");
    if (f) {
        unsigned long long run, wait;
        if (fscanf(f, "%llu %llu", &run, &wait) == 2) {
            out->loop_run_ns = run;
            out->loop_wait_ns = wait;
        }
        fclose(f);
    }
    return 0;
}

static void tier_counts_add(tier_counts_t *acc, const tier_counts_t *a, const tier_counts_t *z)
{
    acc->demotions += z->demotions - a->demotions;
    acc->promotions += z->promotions - a->promotions;
    acc->bytes += z->bytes - a->bytes;
    acc->drops_t1 += z->drops_t1 - a->drops_t1;
    acc->t2_drops += z->t2_drops - a->t2_drops;
    acc->copy_us += z->copy_us - a->copy_us;
    acc->disk_reads += z->disk_reads - a->disk_reads;
    acc->loop_run_ns += z->loop_run_ns - a->loop_run_ns;
    acc->loop_wait_ns += z->loop_wait_ns - a->loop_wait_ns;
    acc->at_us += z->at_us - a->at_us; /* the sum of the windows */
}

static int churn_start(const bench_cfg_t *b, int n, int nice_value, churn_shared_t *sh, pid_t *pids)
{
    __atomic_store_n(&sh->stop, 0, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            return -1;
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            churn_loop(b, i, nice_value, sh);
        }
    }
    return 0;
}

/* Waits until the running churn both demoted and promoted since `since`. */
static int churn_wait_going(const bench_cfg_t *b, kvs_client_t *c, const tier_counts_t *since,
                            churn_shared_t *sh)
{
    double deadline = now_us() + 60e6;
    tier_counts_t t;
    do {
        if (sh->failed || tier_counts(c, b->daemon_pid, &t) != 0)
            return -1;
        if (t.demotions > since->demotions && t.promotions > since->promotions)
            return 0;
        usleep(2000);
    } while (now_us() < deadline);
    fprintf(stderr, "bench rpc: the churn neither promoted nor demoted within 60 s\n");
    return -1;
}

static int churn_stop(churn_shared_t *sh, const pid_t *pids, int n)
{
    int ok = 1;
    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++) {
        int st = 0;
        if (pids[i] > 0 && waitpid(pids[i], &st, 0) == pids[i])
            ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
        else
            ok = 0;
    }
    return ok && !sh->failed ? 0 : -1;
}

enum { PH_IDLE, PH_CHURN, PH_RAW, N_TIER_PHASES };
static const char *const tier_phase_names[N_TIER_PHASES] = {"idle", "churn", "raw"};

static void tier_print(const char *name, samples_t *acc, cell_t *out)
{
    samples_result(acc, out);
    printf("%-7s %9.1fus %9.1fus %9.1fus %10zu %9.0f\n", name, out->p50_us, out->p99_us,
           acc->n ? acc->v[acc->n - 1] : 0.0, acc->n, out->per_sec);
}

/* --tier: kvshared with tier 2; in each round, in turn, the victim alone
 * (idle), the victim while churn processes promote and demote (churn), and
 * the raw ping-pong of the victim's frame sizes (raw). */
static int run_tier(bench_cfg_t *b, int rounds, int n_churn, int churn_nice)
{
    int rc = 1;
    kvs_client_t *holder = NULL;
    uint32_t *victim = malloc(TIER_VICTIM_TOKENS * sizeof(uint32_t));
    churn_shared_t *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    samples_t acc[N_TIER_PHASES] = {{0}};
    tier_counts_t churn = {0}, idle = {0}, a, z;
    pid_t pids[TIER_MAX_CHURN] = {0};
    if (!victim || sh == MAP_FAILED)
        goto out;
    memset(sh, 0, sizeof(*sh));
    unsigned t2_blocks = b->disk_blocks ? TIER_DISK_T2_BLOCKS : TIER_T2_BLOCKS;
    if (start_daemon(b, TIER_POOL_BLOCKS, t2_blocks) != 0) {
        fprintf(stderr, "bench rpc: kvshared (%s) did not start; give --kvshared PATH\n",
                b->kvshared);
        goto out;
    }
    /* The victim's prefix, pinned for the whole run by `holder`: it stays
     * in tier 1 whatever the churn does. */
    prompt(victim, TIER_VICTIM_TOKENS, 1);
    if (warm(b, victim, TIER_VICTIM_TOKENS, &holder) != 0)
        goto out_daemon;
    /* Warm-up: the churn fills the pool and tier 2 and is seen promoting
     * and demoting, so that every idle phase finds the same full pool. */
    if (tier_counts(holder, b->daemon_pid, &a) != 0 ||
        churn_start(b, n_churn, churn_nice, sh, pids) != 0 ||
        churn_wait_going(b, holder, &a, sh) != 0) {
        churn_stop(sh, pids, n_churn);
        goto out_daemon;
    }
    if (churn_stop(sh, pids, n_churn) != 0)
        goto out_daemon;
    /* The churn's own counts, over the victim's windows only. */
    uint64_t writes = 0, lookups = 0, hits = 0, full = 0;
    double per_phase = b->seconds / rounds;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < N_TIER_PHASES; k++) {
            int ph = (r + k) % N_TIER_PHASES;
            int prc = 0;
            if (ph == PH_RAW) {
                prc = run_round(b, MODE_RAW, victim, TIER_VICTIM_TOKENS, 1, per_phase, &acc[ph]);
            } else if (ph == PH_IDLE) {
                prc = tier_counts(holder, b->daemon_pid, &a);
                if (prc == 0)
                    prc =
                        run_round(b, MODE_KVS, victim, TIER_VICTIM_TOKENS, 1, per_phase, &acc[ph]);
                if (prc == 0 && (prc = tier_counts(holder, b->daemon_pid, &z)) == 0)
                    tier_counts_add(&idle, &a, &z);
            } else {
                tier_counts_t start;
                prc = tier_counts(holder, b->daemon_pid, &start);
                if (prc == 0)
                    prc = churn_start(b, n_churn, churn_nice, sh, pids);
                if (prc == 0)
                    prc = churn_wait_going(b, holder, &start, sh);
                if (prc == 0)
                    prc = tier_counts(holder, b->daemon_pid, &a);
                uint64_t w = sh->writes, l = sh->lookups, h = sh->hit_blocks, f = sh->pool_full;
                if (prc == 0)
                    prc =
                        run_round(b, MODE_KVS, victim, TIER_VICTIM_TOKENS, 1, per_phase, &acc[ph]);
                if (prc == 0 && (prc = tier_counts(holder, b->daemon_pid, &z)) == 0)
                    tier_counts_add(&churn, &a, &z);
                writes += sh->writes - w;
                lookups += sh->lookups - l;
                hits += sh->hit_blocks - h;
                full += sh->pool_full - f;
                if (churn_stop(sh, pids, n_churn) != 0)
                    prc = -1;
            }
            if (prc != 0) {
                fprintf(stderr, "bench rpc: the %s phase of round %d failed\n",
                        tier_phase_names[ph], r + 1);
                goto out_daemon;
            }
        }
    }
    cell_t cell[N_TIER_PHASES];
    double churn_s = churn.at_us / 1e6, idle_s = idle.at_us / 1e6;
    printf("# tier: kvshared --host-tier %u blocks, pool %u blocks of %u KiB (4 layers, 8 KV "
           "heads, head_dim 128, bf16, 16 tokens), host backend\n",
           t2_blocks, TIER_POOL_BLOCKS, TIER_BLOCK_BYTES >> 10);
    if (b->disk_blocks) {
        kvs_stats_t st;
        bool got = kvs_stats(holder, &st) == 0;
        printf("# disk tier: %u slots in a file of the bench's temporary directory, I/O %s\n",
               b->disk_blocks, got && st.disk_io ? st.disk_io : "?");
        if (got)
            kvs_stats_free(&st);
    }
    printf("# victim: 1 process, kvs_lookup of a %d-token prefix (no pin; full tier-1 hits: "
           "another session pins it)\n",
           TIER_VICTIM_TOKENS);
    printf("# kvshared --tier-copy-nice %s\n", b->copy_nice ? b->copy_nice : "(its default)");
    printf("# kvshared --loop-rt-priority %s\n",
           b->loop_rt ? b->loop_rt : "0 (its loop thread at normal priority)");
    printf("# churn: %d processes at nice %d, each: write %d new tokens (Alloc+Commit+Release), "
           "pinned Lookup of its prefix %d writes back (+Release)\n",
           n_churn, churn_nice, TIER_CHURN_TOKENS, TIER_LAG);
    printf("# %d rounds of idle, churn, raw (order rotating), %.2f s each\n", rounds, per_phase);
    printf("%-7s %11s %11s %11s %10s %9s\n", "phase", "p50", "p99", "max", "lookups", "per s");
    for (int ph = 0; ph < N_TIER_PHASES; ph++)
        tier_print(tier_phase_names[ph], &acc[ph], &cell[ph]);
    printf("tier_p99_churn_vs_idle %.2f x\n", cell[PH_CHURN].p99_us / cell[PH_IDLE].p99_us);
    printf("tier_p50_churn_vs_idle %.2f x\n", cell[PH_CHURN].p50_us / cell[PH_IDLE].p50_us);
    printf("churn_demotions %.0f per s\n", (double)churn.demotions / churn_s);
    printf("churn_promotions %.0f per s\n", (double)churn.promotions / churn_s);
    printf("churn_copied %.0f MB/s\n", (double)churn.bytes / churn_s / 1e6);
    printf("churn_copy_thread_time %.0f %% of the window\n",
           100.0 * (double)churn.copy_us / (churn_s * 1e6));
    printf("churn_drops %llu from tier 1, %llu from tier 2%s\n", (unsigned long long)churn.drops_t1,
           (unsigned long long)churn.t2_drops, b->disk_blocks ? " or the disk" : "");
    if (b->disk_blocks)
        printf("churn_disk_reads %.0f blocks per s (%.0f MB/s)\n",
               (double)churn.disk_reads / churn_s,
               (double)churn.disk_reads * TIER_BLOCK_BYTES / churn_s / 1e6);
    printf("churn_writes %.0f per s, promoting lookups %.0f per s (%.0f %% of their blocks hit), "
           "pool full %llu\n",
           (double)writes / churn_s, (double)lookups / churn_s,
           lookups ? 100.0 * (double)hits / ((double)lookups * TIER_CHURN_BLOCKS) : 0.0,
           (unsigned long long)full);
    printf("loop_thread idle: on a CPU %.0f %%, waiting for one %.1f %%; churn: on a CPU %.0f %%, "
           "waiting for one %.1f %%\n",
           100.0 * (double)idle.loop_run_ns / (idle_s * 1e9),
           100.0 * (double)idle.loop_wait_ns / (idle_s * 1e9),
           100.0 * (double)churn.loop_run_ns / (churn_s * 1e9),
           100.0 * (double)churn.loop_wait_ns / (churn_s * 1e9));
    rc = 0;
out_daemon:
    kvs_close(holder);
    launch_stop(b->daemon_pid, SIGTERM, LAUNCH_READY_MS);
    if (b->disk_blocks)
        unlink(b->disk_path);
out:
    for (int ph = 0; ph < N_TIER_PHASES; ph++)
        free(acc[ph].v);
    if (sh != MAP_FAILED)
        munmap(sh, sizeof(*sh));
    free(victim);
    unlink(b->raw_sock);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: kvshare-bench rpc [--kvshared PATH] [--seconds S] [--rounds N] [--quick] "
           "[--events] [--pipelined]\n"
           "       kvshare-bench rpc --tier [--disk] [--churn N] [--churn-nice N] [--copy-nice N]\n"
           "                         [--loop-rt N] [--seconds S] [--rounds N]\n"
           "\n"
           "Starts kvshared (host backend) on a temporary socket and measures Lookup\n"
           "latency and throughput with 1, 4, 16 client processes for 64-, 4k- and\n"
           "32k-token prompts, next to a raw Unix-socket ping-pong of the same sizes,\n"
           "plus pipelined Lookups. Each cell runs S seconds (default 2) per side, in N\n"
           "alternating rounds (default 5). --quick: 64 and 4k tokens, 1 and 16 clients.\n"
           "--pipelined: the pipelined Lookups alone.\n"
           "--events: instead, 16-client Lookup and Commit against a daemon without and\n"
           "one with KV events (one live subscriber), in alternating rounds.\n"
           "--tier: instead, one process's 4k-token Lookups (full tier-1 hits) against a\n"
           "kvshared with tier 2, alone, while N churn processes (default 3, at nice\n"
           "--churn-nice) write prefixes (demoting) and look up demoted ones pinned\n"
           "(promoting), and the raw ping-pong of the same sizes; S seconds per phase.\n"
           "--copy-nice N: kvshared --tier-copy-nice N (default: kvshared's).\n"
           "--loop-rt N: kvshared --loop-rt-priority N (its loop thread under SCHED_RR;\n"
           "default 0: normal priority).\n"
           "--disk: with --tier, a small tier 2 above a disk tier (a file in the temporary\n"
           "directory): the churn's blocks go to the disk and come back from it.\n");
}

int bench_rpc_main(int argc, char **argv)
{
    bench_cfg_t b;
    char kvshared[PATH_MAX + 32];
    int quick = 0, rounds = 5, events = 0, tier = 0, churn = 3, churn_nice = 0, pipelined = 0;
    memset(&b, 0, sizeof(b));
    b.seconds = 2.0;
    b.kvshared = bench_default_kvshared(kvshared, sizeof(kvshared));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kvshared") == 0 && i + 1 < argc) {
            b.kvshared = argv[++i];
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            b.seconds = strtod(argv[++i], NULL);
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--events") == 0) {
            events = 1;
        } else if (strcmp(argv[i], "--pipelined") == 0) {
            pipelined = 1;
        } else if (strcmp(argv[i], "--tier") == 0) {
            tier = 1;
        } else if (strcmp(argv[i], "--disk") == 0) {
            b.disk_blocks = TIER_DISK_BLOCKS;
        } else if (strcmp(argv[i], "--churn") == 0 && i + 1 < argc) {
            churn = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--churn-nice") == 0 && i + 1 < argc) {
            churn_nice = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--copy-nice") == 0 && i + 1 < argc) {
            b.copy_nice = argv[++i];
        } else if (strcmp(argv[i], "--loop-rt") == 0 && i + 1 < argc) {
            b.loop_rt = argv[++i];
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (b.seconds <= 0 || b.seconds > 600 || rounds < 1 || rounds > 100) {
        fprintf(stderr, "bench rpc: --seconds takes 0 to 600, --rounds 1 to 100\n");
        return 2;
    }
    if (b.disk_blocks && !tier) {
        fprintf(stderr, "bench rpc: --disk goes with --tier\n");
        return 2;
    }
    if (churn < 1 || churn > TIER_MAX_CHURN || churn_nice < 0 || churn_nice > 19) {
        fprintf(stderr, "bench rpc: --churn takes 1 to %d, --churn-nice 0 to 19\n", TIER_MAX_CHURN);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (test_tmp_dir("kvs-bench", b.dir, sizeof(b.dir)) != 0) {
        fprintf(stderr, "bench rpc: cannot make a temporary directory: %s\n", strerror(errno));
        return 1;
    }
    snprintf(b.kvs_sock, sizeof(b.kvs_sock), "%s/kvshared.sock", b.dir);
    snprintf(b.raw_sock, sizeof(b.raw_sock), "%s/raw.sock", b.dir);
    snprintf(b.disk_path, sizeof(b.disk_path), "%s/tier3.kvs", b.dir);

    if (events || tier) {
        int erc = events ? run_events(&b, rounds) : run_tier(&b, rounds, churn, churn_nice);
        rmdir(b.dir);
        return erc;
    }
    static const size_t sizes[] = {64, 4096, 32768};
    static const int client_counts[] = {1, 4, 16};
    size_t n_sizes = quick ? 2 : 3;
    int rc = 0;
    /* Every prompt's blocks at once, with room to spare. */
    if (start_daemon(&b, 8192, 0) != 0) {
        fprintf(stderr, "bench rpc: kvshared (%s) did not start; give --kvshared PATH\n",
                b.kvshared);
        rmdir(b.dir);
        return 1;
    }
    uint32_t *tokens[3];
    for (size_t s = 0; s < n_sizes; s++) {
        tokens[s] = malloc(sizes[s] * sizeof(uint32_t));
        prompt(tokens[s], sizes[s], (uint32_t)s + 1);
        if (warm(&b, tokens[s], sizes[s], NULL) != 0)
            rc = 1;
    }
    if (!pipelined)
        printf("# kvs = kvs_lookup (full hit, no pin); raw = Unix-socket ping-pong, same frame "
               "sizes\n");
    if (!pipelined)
        printf("# cpu: microseconds of CPU per call, the clients' (cli) and the server's "
               "(srv: kvshared, or the raw server)\n"
               "%-7s %-7s %9s %9s %9s %9s %11s %11s %7s %7s %7s %7s %7s %7s\n",
               "tokens", "clients", "kvs p50", "kvs p99", "raw p50", "raw p99", "kvs/s", "raw/s",
               "p50 x", "p99 x", "kvs cli", "kvs srv", "raw cli", "raw srv");
    for (size_t s = 0; s < n_sizes && rc == 0 && !pipelined; s++) {
        for (size_t ci = 0; ci < 3; ci++) {
            int clients = client_counts[ci];
            if (quick && clients == 4)
                continue;
            /* kvs and raw alternate in short rounds, so that the machine's
             * drift (other load, frequency) falls on both alike. */
            samples_t ks = {0}, rs = {0};
            cell_t kvs, raw;
            for (int r = 0; r < rounds && rc == 0; r++) {
                if (run_round(&b, MODE_KVS, tokens[s], sizes[s], clients, b.seconds / rounds,
                              &ks) != 0 ||
                    run_round(&b, MODE_RAW, tokens[s], sizes[s], clients, b.seconds / rounds,
                              &rs) != 0) {
                    fprintf(stderr, "bench rpc: a client failed (%zu tokens, %d clients)\n",
                            sizes[s], clients);
                    rc = 1;
                }
            }
            samples_result(&ks, &kvs);
            samples_result(&rs, &raw);
            free(ks.v);
            free(rs.v);
            if (rc != 0)
                break;
            printf("%-7zu %-7d %7.1fus %7.1fus %7.1fus %7.1fus %11.0f %11.0f %7.2f %7.2f %7.2f "
                   "%7.2f %7.2f %7.2f\n",
                   sizes[s], clients, kvs.p50_us, kvs.p99_us, raw.p50_us, raw.p99_us, kvs.per_sec,
                   raw.per_sec, kvs.p50_us / raw.p50_us, kvs.p99_us / raw.p99_us,
                   per_call_us(ks.client_cpu_s, ks.calls), per_call_us(ks.server_cpu_s, ks.calls),
                   per_call_us(rs.client_cpu_s, rs.calls), per_call_us(rs.server_cpu_s, rs.calls));
            fflush(stdout);
        }
    }
    for (int conns = 1; conns <= 4 && rc == 0; conns *= 4) {
        double per_sec, cpu_us;
        if (run_pipelined(&b, tokens[0], 64, conns, &per_sec, &cpu_us) != 0) {
            fprintf(stderr, "bench rpc: pipelined run failed\n");
            rc = 1;
            break;
        }
        printf("pipelined: 64-token Lookups, %d connection%s x %d in flight: %.0f per second "
               "(kvshared CPU %.3f us each)\n",
               conns, conns > 1 ? "s" : "", PIPE_DEPTH, per_sec, cpu_us);
    }
    for (size_t s = 0; s < n_sizes; s++)
        free(tokens[s]);
    launch_stop(b.daemon_pid, SIGTERM, LAUNCH_READY_MS);
    unlink(b.raw_sock);
    rmdir(b.dir);
    return rc;
}
