/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Integration: a real kvshared (host backend) on a temporary socket, real
 * worker processes using libkvshare, and raw sockets for bad input.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "raw_wire.h"

#define BT   4
#define POOL 64

static harness_t h;

static void start(void)
{
    /* Hints above the default cap (default_max_priority) are tested here. */
    const char *const extra[] = {"--default-max-priority", "100", NULL};
    ck_assert_int_eq(harness_start(&h, POOL, extra), 0);
}

static void stop(void)
{
    if (h.pid > 0) {
        int status = harness_stop(&h);
        ck_assert_msg(status == 0, "kvshared exited with %d after SIGTERM", status);
        struct stat st;
        ck_assert_msg(stat(h.socket_path, &st) != 0, "socket left behind");
    }
    harness_cleanup(&h);
}

static void prompt(uint32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = seed * 100000 + (uint32_t)i;
}

/* The byte a writer puts at offset i of (layer, kv) of its block j. */
static uint8_t pattern(uint32_t layer, uint32_t kv, size_t j, size_t i)
{
    return (uint8_t)(layer * 31 + kv * 7 + j * 13 + i);
}

static void stats(kvs_client_t *c, kvs_stats_t *s)
{
    int rc = kvs_stats(c, s);
    ck_assert_msg(rc == 0, "stats: %s", kvs_last_error(c));
    ck_assert_uint_eq(s->free_blocks + s->writing_blocks + s->cached_blocks, s->total_blocks);
}

/* Worker A: misses, allocates, writes, commits, exits (its pins go). */
static int worker_a(const uint32_t *tokens, size_t n_tokens)
{
    kvs_options_t o;
    kvs_client_t *c;
    kvs_geometry_t g;
    uint32_t ids[16], can[16], got[16];
    size_t n, done;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.worker_name = "A";
    if (kvs_connect(&o, &c) != 0 || kvs_geometry(c, &g) != 0)
        return 10;
    if (kvs_lookup(c, NULL, tokens, n_tokens, 1, got, 16, &n) != 0 || n != 0)
        return 11;
    size_t nb = n_tokens / g.block_tokens;
    if (kvs_alloc(c, NULL, (uint32_t)nb, ids) != 0)
        return 12;
    for (size_t j = 0; j < nb; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                uintptr_t addr;
                if (kvs_block_addr(c, l, kv, ids[j], &addr) != 0)
                    return 13;
                for (size_t i = 0; i < g.slot_bytes; i++)
                    ((uint8_t *)addr)[i] = pattern(l, kv, j, i);
            }
    if (kvs_commit(c, NULL, tokens, n_tokens, ids, nb, can, &done) != 0 || done != nb)
        return 14;
    for (size_t j = 0; j < nb; j++)
        if (can[j] != ids[j])
            return 15;
    kvs_close(c);
    return 0;
}

/* Worker B: hits A's blocks, pinned, and reads A's bytes through its own mapping. */
static int worker_b(const uint32_t *tokens, size_t n_tokens)
{
    kvs_options_t o;
    kvs_client_t *c;
    kvs_geometry_t g;
    uint32_t got[16];
    size_t n;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.worker_name = "B";
    if (kvs_connect(&o, &c) != 0 || kvs_geometry(c, &g) != 0)
        return 20;
    if (kvs_lookup(c, NULL, tokens, n_tokens, 1, got, 16, &n) != 0)
        return 21;
    if (n != n_tokens / g.block_tokens)
        return 22;
    for (size_t j = 0; j < n; j++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                uintptr_t addr;
                if (kvs_block_addr(c, l, kv, got[j], &addr) != 0)
                    return 23;
                for (size_t i = 0; i < g.slot_bytes; i++)
                    if (((uint8_t *)addr)[i] != pattern(l, kv, j, i))
                        return 24;
            }
    kvs_stats_t s;
    if (kvs_stats(c, &s) != 0 || s.pinned_blocks != n)
        return 25;
    kvs_stats_free(&s);
    if (kvs_release(c, got, n, NULL) != 0)
        return 26;
    kvs_close(c);
    return 0;
}

static int run_child(int (*fn)(const uint32_t *, size_t), const uint32_t *tokens, size_t n)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(fn(tokens, n));
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

START_TEST(test_two_workers_share_a_prefix)
{
    uint32_t tokens[8 * BT + 2], half[4 * BT + 3], got[16];
    size_t n;
    prompt(tokens, 8 * BT + 2, 1);
    ck_assert_int_eq(run_child(worker_a, tokens, 8 * BT + 2), 0);
    ck_assert_int_eq(run_child(worker_b, tokens, 8 * BT + 2), 0);

    /* A third prompt sharing half the prefix hits half. */
    memcpy(half, tokens, 4 * BT * sizeof(uint32_t));
    half[4 * BT] = 999999;
    half[4 * BT + 1] = 999998;
    half[4 * BT + 2] = 999997;
    kvs_client_t *c = harness_client(&h, "third", 0);
    ck_assert_int_eq(kvs_lookup(c, NULL, half, 4 * BT + 3, 0, got, 16, &n), 0);
    ck_assert_uint_eq(n, 4);
    kvs_stats_t s;
    stats(c, &s);
    ck_assert_uint_eq(s.cached_blocks, 8);
    ck_assert_uint_eq(s.pinned_blocks, 0);
    ck_assert_uint_eq(s.writing_blocks, 0);
    ck_assert_uint_eq(s.n_namespaces, 1);
    ck_assert_uint_eq(s.namespaces[0].lookups, 3);
    ck_assert_uint_eq(s.namespaces[0].hit_tokens, 8 * BT + 4 * BT);
    kvs_stats_free(&s);
    kvs_close(c);
}
END_TEST

START_TEST(test_lookup_with_less_room)
{
    /* A pinned Lookup that matches more blocks than the caller has room
     * for keeps the prefix that fits and gives the rest of its pins back;
     * one without a pin just keeps the prefix. The reply read in place
     * (client/wire.h) leaves such a reply to the protobuf-c path. */
    kvs_client_t *c = harness_client(&h, "room", 0);
    uint32_t tokens[6 * BT], ids[6], can[6], got[6];
    size_t n, done;
    prompt(tokens, 6 * BT, 31);
    ck_assert_int_eq(kvs_alloc(c, NULL, 6, ids), 0);
    ck_assert_int_eq(kvs_commit(c, NULL, tokens, 6 * BT, ids, 6, can, &done), 0);
    ck_assert_int_eq(kvs_release(c, can, 6, NULL), 0);
    kvs_stats_t s;
    for (int pin = 0; pin < 2; pin++) {
        memset(got, 0xff, sizeof(got));
        ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 6 * BT, pin, got, 2, &n), 0);
        ck_assert_uint_eq(n, 2);
        ck_assert_uint_eq(got[0], can[0]);
        ck_assert_uint_eq(got[1], can[1]);
        ck_assert_uint_eq(got[2], UINT32_MAX); /* nothing written past max_ids */
        stats(c, &s);
        ck_assert_uint_eq(s.pinned_blocks, pin ? 2 : 0);
        kvs_stats_free(&s);
        /* With room for all: every id, alike. */
        ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 6 * BT, 0, got, 6, &n), 0);
        ck_assert_uint_eq(n, 6);
        ck_assert_int_eq(memcmp(got, can, sizeof(can)), 0);
    }
    ck_assert_int_eq(kvs_release(c, can, 2, NULL), 0);
    stats(c, &s);
    ck_assert_uint_eq(s.pinned_blocks, 0);
    kvs_stats_free(&s);
    kvs_close(c);
}
END_TEST

START_TEST(test_sigkill_releases_holdings)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        kvs_options_t o;
        kvs_client_t *c;
        uint32_t tokens[6 * BT], ids[6], can[6], got[6], more[5];
        size_t n, done;
        close(p[0]);
        kvs_options_init(&o);
        o.socket_path = h.socket_path;
        if (kvs_connect(&o, &c) != 0)
            _exit(1);
        prompt(tokens, 6 * BT, 7);
        if (kvs_alloc(c, NULL, 6, ids) || kvs_commit(c, NULL, tokens, 6 * BT, ids, 6, can, &done))
            _exit(2);
        if (kvs_lookup(c, NULL, tokens, 6 * BT, 1, got, 6, &n) || n != 6)
            _exit(3);
        if (kvs_alloc(c, NULL, 5, more))
            _exit(4);
        if (write(p[1], "x", 1) != 1)
            _exit(5);
        pause();
        _exit(0);
    }
    close(p[1]);
    char x;
    ck_assert_int_eq(read(p[0], &x, 1), 1);
    close(p[0]);

    kvs_client_t *c = harness_client(&h, "observer", 0);
    kvs_stats_t s;
    stats(c, &s);
    ck_assert_uint_eq(s.writing_blocks, 5);
    ck_assert_uint_eq(s.pinned_blocks, 6);
    ck_assert_uint_eq(s.sessions, 2);
    kvs_stats_free(&s);

    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    /* The daemon sees the EOF on its next loop turn: wait for it, bounded. */
    for (int i = 0; i < 500; i++) {
        stats(c, &s);
        if (s.sessions == 1)
            break;
        kvs_stats_free(&s);
        usleep(10000);
    }
    ck_assert_uint_eq(s.sessions, 1);
    ck_assert_uint_eq(s.writing_blocks, 0);
    ck_assert_uint_eq(s.pinned_blocks, 0);
    ck_assert_uint_eq(s.cached_blocks, 6);
    ck_assert_uint_eq(s.free_blocks, POOL - 6);
    kvs_stats_free(&s);
    kvs_close(c);
}
END_TEST

/* A prompt of 300k tokens: a 1.2 MB frame, written in several pieces. */
static uint64_t ns_counter(const kvs_stats_t *s, int which)
{
    for (size_t i = 0; i < s->n_namespaces; i++)
        if (strcmp(s->namespaces[i].name, "default") == 0)
            return which == 0   ? s->namespaces[i].inserted_blocks
                   : which == 1 ? s->namespaces[i].duplicate_blocks
                                : s->namespaces[i].lookups;
    ck_abort_msg("no default namespace in stats");
    return 0;
}

/* A worker that hit m blocks commits its whole prompt: the m looked-up ids
 * first, then n - m fresh ones; no allocation for the hit part. */
START_TEST(test_commit_after_a_hit)
{
    enum { N = 5, M = 3 };
    kvs_client_t *a = harness_client(&h, "A", 0), *b = harness_client(&h, "B", 0);
    uint32_t tokens[N * BT], ia[M], got[N], fresh[N - M], all[N], can[N], req[N];
    size_t n, done;
    kvs_stats_t s0, s;
    prompt(tokens, N * BT, 9);
    ck_assert_int_eq(kvs_alloc(a, NULL, M, ia), 0);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens, M * BT, ia, M, can, &done), 0);

    ck_assert_int_eq(kvs_lookup(b, NULL, tokens, N * BT, 1, got, N, &n), 0);
    ck_assert_uint_eq(n, M);
    ck_assert_int_eq(kvs_alloc(b, NULL, N - M, fresh), 0);

    /* Refused first: a's blocks b does not pin, b's pins out of place. */
    uint32_t a_only;
    ck_assert_int_eq(kvs_alloc(a, NULL, 1, &a_only), 0);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens + M * BT, BT, &a_only, 1, can, &done), 0);
    req[0] = a_only;
    ck_assert_int_eq(kvs_commit(b, NULL, tokens + M * BT, BT, req, 1, can, &done), KVS_ENOTHELD);
    char want[96];
    snprintf(want, sizeof(want), "block %u is cached but this session holds no pin", a_only);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(b), want));
    memcpy(req, got, M * sizeof(uint32_t));
    req[0] = got[1];
    req[1] = got[0];
    memcpy(req + M, fresh, sizeof(fresh));
    ck_assert_int_eq(kvs_commit(b, NULL, tokens, N * BT, req, N, can, &done), KVS_EEXIST);
    snprintf(want, sizeof(want), "block %u is cached but does not hold block 0", got[1]);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(b), want));

    stats(b, &s0);
    ck_assert_uint_eq(s0.writing_blocks, N - M);
    memcpy(all, got, M * sizeof(uint32_t));
    memcpy(all + M, fresh, sizeof(fresh));
    ck_assert_int_eq(kvs_commit(b, NULL, tokens, N * BT, all, N, can, &done), 0);
    ck_assert_uint_eq(done, N);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(can[i], all[i]);
    stats(b, &s);
    ck_assert_uint_eq(s.writing_blocks, 0);
    ck_assert_uint_eq(s.cached_blocks, s0.cached_blocks + (N - M));
    ck_assert_uint_eq(s.pinned_blocks, s0.pinned_blocks + (N - M));
    ck_assert_uint_eq(ns_counter(&s, 0), ns_counter(&s0, 0) + (N - M));
    ck_assert_uint_eq(ns_counter(&s, 1), ns_counter(&s0, 1) + M);
    ck_assert_uint_eq(ns_counter(&s, 2), ns_counter(&s0, 2));
    kvs_stats_free(&s0);
    kvs_stats_free(&s);

    /* a lets go of its pins; then one Release frees all of b's. */
    ck_assert_int_eq(kvs_release(a, ia, M, NULL), 0);
    ck_assert_int_eq(kvs_release(a, &a_only, 1, NULL), 0);
    stats(b, &s);
    ck_assert_uint_eq(s.pinned_blocks, N);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_release(b, all, N, &done), 0);
    ck_assert_uint_eq(done, N);
    stats(b, &s);
    ck_assert_uint_eq(s.pinned_blocks, 0);
    ck_assert_uint_eq(s.cached_blocks, N + 1);
    ck_assert_uint_eq(s.writing_blocks, 0);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_release(b, all, 1, NULL), KVS_ENOTHELD);
    kvs_close(a);
    kvs_close(b);
}
END_TEST

START_TEST(test_long_prompt)
{
    size_t n_tokens = 300000, n;
    uint32_t *tokens = malloc(n_tokens * sizeof(uint32_t)), ids[POOL], can[POOL], got[POOL];
    prompt(tokens, n_tokens, 9);
    kvs_client_t *c = harness_client(&h, "long", 0);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, n_tokens, 0, got, POOL, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvs_alloc(c, NULL, POOL, ids), 0);
    ck_assert_int_eq(kvs_commit(c, NULL, tokens, n_tokens, ids, POOL, can, &n), 0);
    ck_assert_uint_eq(n, POOL);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, n_tokens, 1, got, POOL, &n), 0);
    ck_assert_uint_eq(n, POOL);
    ck_assert_int_eq(memcmp(got, ids, sizeof(ids)), 0);
    ck_assert_int_eq(kvs_release(c, got, n, NULL), 0);
    ck_assert_int_eq(kvs_release(c, ids, POOL, NULL), 0);
    kvs_close(c);
    free(tokens);
}
END_TEST

/* --- raw sockets --- */

static int raw_connect_h(void)
{
    int fd = raw_connect(h.socket_path);
    ck_assert_int_ge(fd, 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    ck_assert_int_eq(raw_write_all(fd, p, n), 0);
}

static void raw_request(int fd, Kvshare__Request *req)
{
    ck_assert_int_eq(raw_send_request(fd, req), 0);
}

/* The next reply on fd (caller frees), NULL if none came within 5 s. */
static Kvshare__Response *raw_reply(int fd)
{
    return raw_read_reply(fd, 5000);
}

static int raw_status(int fd, const char *expect_in_message)
{
    Kvshare__Response *r = raw_reply(fd);
    ck_assert_ptr_nonnull(r);
    int status = -(int)r->status;
    if (expect_in_message)
        ck_assert_msg(r->message && strstr(r->message, expect_in_message),
                      "message '%s' lacks '%s'", r->message ? r->message : "", expect_in_message);
    kvshare__response__free_unpacked(r, NULL);
    return status;
}

static void assert_closed(int fd)
{
    uint8_t b;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
    ck_assert_int_le(read(fd, &b, 1), 0);
    close(fd);
}

static void assert_raw_alive(int fd)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PingRequest pr = KVSHARE__PING_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &pr;
    req.id = 77;
    raw_request(fd, &req);
    Kvshare__Response *r = raw_reply(fd);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 77);
    ck_assert_int_eq(r->status, 0);
    kvshare__response__free_unpacked(r, NULL);
}

/* Another client is served: a ping and consistent counters. */
static void assert_others_served(kvs_client_t *other)
{
    kvs_stats_t s;
    double rtt;
    ck_assert_int_eq(kvs_ping(other, 16, &rtt), 0);
    stats(other, &s);
    kvs_stats_free(&s);
}

static void raw_ids(int fd, int rpc, const uint32_t *ids, size_t n)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    static uint32_t tokens[64];
    if (rpc == KVSHARE__REQUEST__RPC_RELEASE) {
        rl.block_ids = (uint32_t *)ids;
        rl.n_block_ids = n;
        req.release = &rl;
    } else {
        cm.block_ids = (uint32_t *)ids;
        cm.n_block_ids = n;
        cm.tokens.data = (uint8_t *)tokens;
        cm.tokens.len = sizeof(tokens);
        req.commit = &cm;
    }
    req.rpc_case = (Kvshare__Request__RpcCase)rpc;
    req.id = 5;
    raw_request(fd, &req);
}

START_TEST(test_bad_input)
{
    kvs_client_t *other = harness_client(&h, "bystander", 0);
    kvs_client_t *holder = harness_client(&h, "holder", 0);
    uint32_t held[2], mine[2], can[2];
    size_t done;
    ck_assert_int_eq(kvs_alloc(holder, NULL, 2, held), 0);

    /* Garbage bytes: an HTTP request line reads as a 542 MB length. */
    int fd = raw_connect_h();
    raw_send(fd, "GET / HTTP/1.1\r\n\r\n", 18);
    ck_assert_int_eq(raw_status(fd, "over the limit"), KVS_ETOOBIG);
    assert_closed(fd);
    assert_others_served(other);

    /* Small garbage that does not decode. */
    fd = raw_connect_h();
    raw_send(fd, "\x05\x00\x00\x00\xff\xff\xff\xff\xff", 9);
    ck_assert_int_eq(raw_status(fd, "does not decode"), KVS_EPROTO);
    assert_closed(fd);
    assert_others_served(other);

    /* A 4 GiB length prefix. */
    fd = raw_connect_h();
    raw_send(fd, "\xff\xff\xff\xff", 4);
    ck_assert_int_eq(raw_status(fd, "--max-frame"), KVS_ETOOBIG);
    assert_closed(fd);
    assert_others_served(other);

    /* A truncated frame, then the client goes away. */
    fd = raw_connect_h();
    raw_send(fd, "\x40\x00\x00\x00\x08\x01", 6);
    close(fd);
    assert_others_served(other);

    /* Unknown RPC: an error, and the connection stays usable. */
    fd = raw_connect_h();
    raw_send(fd, "\x05\x00\x00\x00\x08\x09\x9a\x06\x00", 9);
    ck_assert_int_eq(raw_status(fd, "unknown or missing RPC"), KVS_EPROTO);
    assert_raw_alive(fd);
    assert_others_served(other);

    /* Out-of-range ids. */
    uint32_t bad = 812;
    raw_ids(fd, KVSHARE__REQUEST__RPC_RELEASE, &bad, 1);
    ck_assert_int_eq(raw_status(fd, "block 812 is out of range"), KVS_EINVAL);
    assert_raw_alive(fd);
    assert_others_served(other);

    /* Ids held by another session: release and commit. */
    raw_ids(fd, KVSHARE__REQUEST__RPC_RELEASE, held, 1);
    ck_assert_int_eq(raw_status(fd, "not held by this session"), KVS_ENOTHELD);
    raw_ids(fd, KVSHARE__REQUEST__RPC_COMMIT, held, 2);
    ck_assert_int_eq(raw_status(fd, "not held by this session"), KVS_ENOTHELD);
    assert_raw_alive(fd);
    assert_others_served(other);

    /* Double release. */
    ck_assert_int_eq(kvs_alloc(other, NULL, 2, mine), 0);
    ck_assert_int_eq(kvs_release(other, mine, 1, NULL), 0);
    ck_assert_int_eq(kvs_release(other, mine, 1, NULL), KVS_ENOTHELD);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(other), "not held by this session"));
    assert_others_served(holder);

    /* Commit of blocks not in WRITING: a freed one, then a cached one. */
    uint32_t tokens[2 * BT];
    prompt(tokens, 2 * BT, 3);
    ck_assert_int_eq(kvs_commit(other, NULL, tokens, 2 * BT, mine, 1, can, &done), KVS_EBADSTATE);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(other), "not in WRITING"));
    ck_assert_int_eq(kvs_commit(other, NULL, tokens, 2 * BT, mine + 1, 1, can, &done), 0);
    /* Committed again while pinned at its prefix: accepted; unpinned: refused. */
    ck_assert_int_eq(kvs_commit(other, NULL, tokens, 2 * BT, mine + 1, 1, can, &done), 0);
    ck_assert_int_eq(kvs_release(other, mine + 1, 1, NULL), 0);
    ck_assert_int_eq(kvs_commit(other, NULL, tokens, 2 * BT, mine + 1, 1, can, &done),
                     KVS_ENOTHELD);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(other), "holds no pin"));
    assert_others_served(holder);
    assert_raw_alive(fd);
    close(fd);

    kvs_stats_t s;
    stats(holder, &s);
    ck_assert_uint_eq(s.writing_blocks, 2);
    ck_assert_uint_eq(s.cached_blocks, 1);
    ck_assert_uint_eq(s.protocol_errors, 3); /* the unknown RPC is not one */
    kvs_stats_free(&s);
    kvs_close(holder);
    kvs_close(other);
}
END_TEST

START_TEST(test_client_that_stops_reading_is_dropped)
{
    /* This test's own daemon, with a small output limit. */
    static const char *const extra[] = {"--max-output", "1MiB", NULL};
    harness_t own;
    ck_assert_int_eq(harness_start(&own, POOL, extra), 0);
    kvs_options_t o;
    kvs_client_t *other;
    kvs_options_init(&o);
    o.socket_path = own.socket_path;
    ck_assert_int_eq(kvs_connect(&o, &other), 0);

    int fd = raw_connect(own.socket_path);
    ck_assert_int_ge(fd, 0);
    /* Pipelined pings with 60 kB payloads, replies never read: they pile up
     * in the daemon past the limit and it hangs up. */
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PingRequest pr = KVSHARE__PING_REQUEST__INIT;
    static uint8_t payload[60000];
    pr.payload.data = payload;
    pr.payload.len = sizeof(payload);
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &pr;
    size_t len;
    uint8_t *buf = raw_frame(&req, &len);
    ck_assert_ptr_nonnull(buf);
    int dropped = 0;
    for (int i = 0; i < 4000 && !dropped; i++) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, 5000) <= 0)
            break;
        if (pfd.revents & (POLLERR | POLLHUP))
            dropped = 1;
        else if (send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
            dropped = 1;
    }
    free(buf);
    close(fd);
    ck_assert_msg(dropped, "a client that never reads was not disconnected");
    double rtt;
    ck_assert_int_eq(kvs_ping(other, 16, &rtt), 0);
    kvs_close(other);
    ck_assert_int_eq(harness_stop(&own), 0);
    harness_cleanup(&own);
}
END_TEST

START_TEST(test_session_limit)
{
    static const char *const extra[] = {"--max-sessions", "2", NULL};
    harness_t own;
    ck_assert_int_eq(harness_start(&own, POOL, extra), 0);
    kvs_options_t o;
    kvs_client_t *a, *b, *c = NULL;
    kvs_options_init(&o);
    o.socket_path = own.socket_path;
    ck_assert_int_eq(kvs_connect(&o, &a), 0);
    ck_assert_int_eq(kvs_connect(&o, &b), 0);
    ck_assert_int_eq(kvs_connect(&o, &c), KVS_ELIMIT);
    ck_assert_ptr_null(c);
    kvs_close(a);
    /* A slot is free again once the daemon has seen the close. */
    int rc = KVS_ELIMIT;
    for (int i = 0; i < 500 && rc == KVS_ELIMIT; i++) {
        rc = kvs_connect(&o, &c);
        if (rc == KVS_ELIMIT)
            usleep(10000);
    }
    ck_assert_int_eq(rc, 0);
    kvs_close(b);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&own), 0);
    harness_cleanup(&own);
}
END_TEST

/* A worker that forks after connecting: the child is told to reconnect
 * from its own process, and the parent's connection is untouched. */
START_TEST(test_fork_after_connect)
{
    kvs_options_t o;
    kvs_client_t *c;
    uint32_t tokens[2 * BT], got[4];
    size_t n = 99;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    prompt(tokens, 2 * BT, 9);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        uint8_t byte = 0;
        uintptr_t addr;
        int ok = kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n) == KVS_ENOTCONN && n == 0 &&
                 strstr(kvs_last_error(c), "reconnect from the new process") != NULL &&
                 kvs_block_read(c, 0, 0, 0, &byte, 1) == KVS_ENOTCONN &&
                 kvs_block_addr(c, 0, 0, 0, &addr) == KVS_ENOTCONN && kvs_pool_base(c) == 0 &&
                 kvs_ping(c, 0, NULL) == KVS_ENOTCONN && !kvs_connected(c);
        if (!ok)
            fprintf(stderr, "child: %s\n", kvs_last_error(c));
        /* The child's own client works there, and is foreign to its child. */
        kvs_client_t *mine = NULL;
        int own = kvs_connect(&o, &mine) == 0 && kvs_ping(mine, 0, NULL) == 0 &&
                  kvs_connected(mine) && kvs_block_addr(mine, 0, 0, 0, &addr) == 0;
        pid_t grandchild = own ? fork() : -1;
        if (grandchild == 0)
            _exit(kvs_ping(mine, 0, NULL) == KVS_ENOTCONN && !kvs_connected(mine) ? 0 : 1);
        int gst = 1;
        own = own && waitpid(grandchild, &gst, 0) == grandchild && WIFEXITED(gst) &&
              WEXITSTATUS(gst) == 0 && kvs_ping(mine, 0, NULL) == 0;
        if (!own)
            fprintf(stderr, "child's own client: %s\n", mine ? kvs_last_error(mine) : "none");
        ok = ok && own;
        kvs_close(mine);
        kvs_close(c);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x", st);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), 0);
    ck_assert_int_eq(kvs_connected(c), 1);
    ck_assert_uint_eq(kvs_epoch(c), 1);
    kvs_close(c);
}
END_TEST

START_TEST(test_timeout_and_reconnect)
{
    kvs_options_t o;
    kvs_client_t *c;
    uint32_t tokens[2 * BT], got[4];
    size_t n = 99;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = 300;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    prompt(tokens, 2 * BT, 4);
    ck_assert_uint_eq(kvs_epoch(c), 1);

    /* A stuck daemon: the call times out, then lookups miss. */
    kill(h.pid, SIGSTOP);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), KVS_ETIMEDOUT);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvs_connected(c), 0);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(c), "did not answer"));
    kill(h.pid, SIGCONT);

    /* The next call reconnects. */
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), 0);
    ck_assert_int_eq(kvs_connected(c), 1);
    ck_assert_uint_eq(kvs_epoch(c), 2);

    /* A dead daemon: KVS_ENOTCONN and a miss, without hanging. */
    ck_assert_int_eq(harness_stop(&h), 0);
    n = 99;
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), KVS_ENOTCONN);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(c), "is kvshared running?"));
    /* ... and that call let go of the old pool, so that a restarted daemon
     * gets its memory back even before anyone reconnects. */
    ck_assert_uint_eq(kvs_pool_base(c), 0);

    /* Back on the same path: the next call reconnects and maps the new pool. */
    pid_t pid;
    ck_assert_int_eq(harness_start_again(&h, POOL, 20000, &pid), -1);
    h.pid = pid;
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), 0);
    ck_assert_uint_eq(kvs_epoch(c), 3);
    ck_assert_uint_ne(kvs_pool_base(c), 0);
    kvs_close(c);
}
END_TEST

START_TEST(test_second_daemon_refused_stale_socket_replaced)
{
    pid_t pid;
    /* A live daemon owns the socket: a second one exits with an error. */
    ck_assert_int_eq(harness_start_again(&h, POOL, 20000, &pid), 1);
    kvs_client_t *c = harness_client(&h, "still-there", 0);
    kvs_close(c);

    /* A stale socket (its daemon was SIGKILLed) is replaced. */
    kill(h.pid, SIGKILL);
    waitpid(h.pid, NULL, 0);
    struct stat st;
    ck_assert_int_eq(stat(h.socket_path, &st), 0);
    ck_assert_int_eq(harness_start_again(&h, POOL, 20000, &pid), -1);
    h.pid = pid;
    c = harness_client(&h, "after-restart", 0);
    kvs_close(c);
}
END_TEST

/* An MLA model's pool (DeepSeek-V2-Lite's latent, 2 layers): the daemon lays
 * out one latent slot per layer and block instead of K and V, the Hello
 * strides say so (no V: kv_stride 0), the library's block addresses follow
 * geometry_offset, and two clients see each other's bytes at those offsets. */
START_TEST(test_mla_pool_layout)
{
    static const char *const mla[] = {
        "--model", "deepseek-v2-lite", "--layers", "2", "--block-tokens",
        "4",       "--dtype",          "fp16",     NULL};
    harness_t own;
    ck_assert_int_eq(harness_start_geometry(&own, POOL, mla, NULL), 0);
    kvs_options_t o;
    kvs_client_t *a = NULL, *b = NULL;
    kvs_options_init(&o);
    o.socket_path = own.socket_path;
    ck_assert_int_eq(kvs_connect(&o, &a), 0);
    ck_assert_int_eq(kvs_connect(&o, &b), 0);

    kvs_geometry_t g;
    ck_assert_int_eq(kvs_geometry(a, &g), 0);
    const uint64_t slot = 4 * (512 + 64) * 2; /* tokens x latent width x fp16 */
    ck_assert_uint_eq(g.layers, 2);
    ck_assert_uint_eq(g.kv_heads, 1);
    ck_assert_uint_eq(g.head_dim, 576);
    ck_assert_uint_eq(g.kv_lora_rank, 512);
    ck_assert_uint_eq(g.rope_head_dim, 64);
    ck_assert_uint_eq(g.num_blocks, POOL);
    ck_assert_uint_eq(g.slot_bytes, slot);
    ck_assert_uint_eq(g.block_bytes, 2 * slot); /* one slot per layer, not two */
    ck_assert_uint_eq(g.block_stride, slot);
    ck_assert_uint_eq(g.kv_stride, 0);
    ck_assert_uint_eq(g.layer_stride, POOL * slot);
    ck_assert_uint_ge(g.pool_bytes, 2 * POOL * slot);

    uintptr_t base = kvs_pool_base(a), addr = 0;
    ck_assert_int_eq(kvs_block_addr(a, 0, 1, 0, &addr), KVS_EINVAL); /* no V */
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t blk = 0; blk < POOL; blk += 9) {
            ck_assert_int_eq(kvs_block_addr(a, l, 0, blk, &addr), 0);
            ck_assert_uint_eq(addr - base, ((uint64_t)l * POOL + blk) * slot);
        }

    /* a's bytes at (layer 1, block 5) are b's at the same offset of its own
     * mapping, and nowhere else */
    static uint8_t want[4608], got[4608];
    ck_assert_uint_eq(sizeof(want), slot);
    for (size_t i = 0; i < sizeof(want); i++)
        want[i] = (uint8_t)(i * 7 + 1);
    ck_assert_int_eq(kvs_block_write(a, 1, 0, 5, want, sizeof(want)), 0);
    ck_assert_int_eq(kvs_block_read(b, 1, 0, 5, got, sizeof(got)), 0);
    ck_assert_mem_eq(got, want, sizeof(want));
    const uint8_t *mapped = (const uint8_t *)kvs_pool_base(b);
    ck_assert_mem_eq(mapped + (1ull * POOL + 5) * slot, want, sizeof(want));
    ck_assert_int_eq(kvs_block_read(b, 0, 0, 5, got, sizeof(got)), 0);
    ck_assert_int_ne(memcmp(got, want, sizeof(want)), 0);
    ck_assert_int_eq(kvs_block_write(a, 1, 1, 5, want, sizeof(want)), KVS_EINVAL);

    kvs_close(a);
    kvs_close(b);
    ck_assert_int_eq(harness_stop(&own), 0);
    harness_cleanup(&own);
}
END_TEST

/* The _ex entry points: every option of an RPC in one struct that carries
 * its size; the suffixed calls are these with options set. */
START_TEST(test_option_structs)
{
    enum { N = 3 };
    kvs_client_t *c = harness_client(&h, "opts", 0);
    uint32_t tokens[N * BT], ids[N], can[N], got[N];
    size_t n, done, n_evicted = 99;
    kvs_stats_t s;
    prompt(tokens, N * BT, 41);

    /* Alloc with a declaration and a report at once; the report needs ns. */
    kvs_alloc_opts_t ao;
    kvs_alloc_opts_init(&ao);
    ck_assert_uint_eq(ao.size, sizeof(ao));
    ao.tokens = tokens;
    ao.n_tokens = N * BT;
    ao.n_evicted = &n_evicted;
    ck_assert_int_eq(kvs_alloc_ex(c, NULL, N, &ao, ids), KVS_EINVAL);
    ck_assert_int_eq(kvs_alloc_ex(c, "opts", N, &ao, ids), 0);
    ck_assert_uint_eq(n_evicted, 0);

    /* Commit with a retention hint: its blocks are counted in the top band. */
    kvs_hint_t hint = {90, 0};
    kvs_commit_opts_t co;
    kvs_commit_opts_init(&co);
    co.hint = &hint;
    ck_assert_int_eq(kvs_commit_ex(c, "opts", tokens, N * BT, ids, N, &co, can, &done), 0);
    ck_assert_uint_eq(done, N);
    stats(c, &s);
    int found = 0;
    for (size_t i = 0; i < s.n_namespaces; i++)
        if (strcmp(s.namespaces[i].name, "opts") == 0) {
            ck_assert_uint_eq(s.namespaces[i].bands->cached[3], N);
            found = 1;
        }
    ck_assert(found);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_release_ex(c, can, N, NULL, &done), 0);
    ck_assert_uint_eq(done, N);

    /* NULL options: a lookup that does not pin. */
    ck_assert_int_eq(kvs_lookup_ex(c, "opts", tokens, N * BT, NULL, got, N, &n), 0);
    ck_assert_uint_eq(n, N);
    stats(c, &s);
    ck_assert_uint_eq(s.pinned_blocks, 0);
    kvs_stats_free(&s);

    /* The size idiom: 0 and more than the library knows are refused; a
     * shorter struct (an older header's) reads the rest as defaults. */
    kvs_lookup_opts_t lo;
    kvs_lookup_opts_init(&lo);
    ck_assert_uint_eq(lo.size, sizeof(lo));
    lo.size = 0;
    ck_assert_int_eq(kvs_lookup_ex(c, "opts", tokens, N * BT, &lo, got, N, &n), KVS_EINVAL);
    lo.size = sizeof(lo) + 8;
    ck_assert_int_eq(kvs_lookup_ex(c, "opts", tokens, N * BT, &lo, got, N, &n), KVS_EINVAL);
    lo.size = offsetof(kvs_lookup_opts_t, wait_ms);
    lo.pin = 1;
    lo.wait_ms = KVS_LOOKUP_MAX_WAIT_MS + 1; /* past size: not read */
    ck_assert_int_eq(kvs_lookup_ex(c, "opts", tokens, N * BT, &lo, got, N, &n), 0);
    ck_assert_uint_eq(n, N);
    lo.size = sizeof(lo);
    ck_assert_int_eq(kvs_lookup_ex(c, "opts", tokens, N * BT, &lo, got, N, &n), KVS_EINVAL);
    /* Tier 2 in place needs a pin, and tiers for the ids. */
    kvs_lookup_opts_init(&lo);
    lo.tier2_in_place = 1;
    lo.tiers = (uint8_t[N]){0};
    ck_assert_int_eq(kvs_lookup_ex(c, "opts", tokens, N * BT, &lo, got, N, &n), KVS_EINVAL);

    /* Pin with a hint beyond the scale: refused before anything is done. */
    kvs_hint_t too_high = {KVS_PRIORITY_MAX + 1, 0};
    kvs_pin_opts_t po;
    kvs_pin_opts_init(&po);
    po.hint = &too_high;
    ck_assert_int_eq(kvs_pin_ex(c, got, N, &po, &done), KVS_EINVAL);
    po.hint = &hint;
    ck_assert_int_eq(kvs_pin_ex(c, got, N, &po, &done), 0);
    ck_assert_uint_eq(done, N);

    /* Release with tiers (and a hint): pool blocks must come first. */
    kvs_release_opts_t ro;
    kvs_release_opts_init(&ro);
    ro.tiers = (const uint8_t[N]){2, 1, 1};
    ck_assert_int_eq(kvs_release_ex(c, got, N, &ro, &done), KVS_EINVAL);
    ro.tiers = (const uint8_t[N]){1, 1, 1};
    ro.hint = &hint;
    ck_assert_int_eq(kvs_release_ex(c, got, N, &ro, &done), 0);
    ck_assert_uint_eq(done, N);
    ck_assert_int_eq(kvs_release_ex(c, got, N, NULL, &done), 0); /* the short lookup's pins */
    stats(c, &s);
    ck_assert_uint_eq(s.pinned_blocks, 0);
    kvs_stats_free(&s);
    kvs_close(c);
}
END_TEST

/* Evict drops one prompt's blocks that nothing else needs, from its end:
 * a prefix another prompt continues stays, pinned blocks stay, and the
 * blocks go as evictions do. */
START_TEST(test_evict)
{
    enum { N1 = 4, N2 = 3 };
    kvs_client_t *c = harness_client(&h, "evict", 0);
    uint32_t p1[N1 * BT], p2[N2 * BT], ids[N1], can[N1], got[N2];
    size_t done, n;
    kvs_stats_t s0, s;
    kvs_evict_result_t r;
    prompt(p1, N1 * BT, 51);
    memcpy(p2, p1, 2 * BT * sizeof(uint32_t)); /* p2 continues p1's first 2 blocks */
    prompt(p2 + 2 * BT, BT, 52);
    ck_assert_int_eq(kvs_alloc(c, NULL, N1, ids), 0);
    ck_assert_int_eq(kvs_commit(c, NULL, p1, N1 * BT, ids, N1, can, &done), 0);
    ck_assert_int_eq(kvs_release(c, can, N1, NULL), 0);
    ck_assert_int_eq(kvs_alloc(c, NULL, N2, ids), 0);
    ck_assert_int_eq(kvs_commit(c, NULL, p2, N2 * BT, ids, N2, can, &done), 0);
    ck_assert_int_eq(kvs_release(c, can, N2, NULL), 0);
    ck_assert_int_eq(kvs_release(c, ids, 2, NULL), 0); /* the duplicates, still WRITING */

    ck_assert_int_eq(kvs_evict(c, NULL, NULL, 4, &r), KVS_EINVAL);
    ck_assert_int_eq(kvs_evict(c, "never-made", p1, N1 * BT, &r), KVS_ENONS);
    stats(c, &s0);
    ck_assert_int_eq(kvs_evict(c, NULL, p1, N1 * BT, &r), 0);
    ck_assert_uint_eq(r.tier1_blocks, 2);
    ck_assert_uint_eq(r.tier2_blocks, 0);
    ck_assert_uint_eq(r.kept_blocks, 2);
    stats(c, &s);
    ck_assert_uint_eq(s.evictions, s0.evictions + 2);
    ck_assert_uint_eq(s.cached_blocks, s0.cached_blocks - 2);
    ck_assert_uint_eq(s.free_blocks, s0.free_blocks + 2);
    kvs_stats_free(&s0);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_lookup(c, NULL, p1, N1 * BT, 0, got, N2, &n), 0);
    ck_assert_uint_eq(n, 2);

    /* Pinned, p2 stays whole; released, it goes whole. */
    ck_assert_int_eq(kvs_lookup(c, NULL, p2, N2 * BT, 1, got, N2, &n), 0);
    ck_assert_uint_eq(n, N2);
    ck_assert_int_eq(kvs_evict(c, NULL, p2, N2 * BT, &r), 0);
    ck_assert_uint_eq(r.tier1_blocks + r.tier2_blocks, 0);
    ck_assert_uint_eq(r.kept_blocks, N2);
    ck_assert_int_eq(kvs_release(c, got, N2, NULL), 0);
    ck_assert_int_eq(kvs_evict(c, NULL, p2, N2 * BT, NULL), 0);
    ck_assert_int_eq(kvs_evict(c, NULL, p2, N2 * BT, &r), 0);
    ck_assert_uint_eq(r.tier1_blocks + r.kept_blocks, 0); /* nothing left */
    stats(c, &s);
    ck_assert_uint_eq(s.cached_blocks, 0);
    ck_assert_uint_eq(s.free_blocks, POOL);
    kvs_stats_free(&s);
    kvs_close(c);
}
END_TEST

static Suite *integration_suite(void)
{
    Suite *s = suite_create("integration");
    TCase *tc = tcase_create("daemon");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_two_workers_share_a_prefix);
    tcase_add_test(tc, test_lookup_with_less_room);
    tcase_add_test(tc, test_sigkill_releases_holdings);
    tcase_add_test(tc, test_long_prompt);
    tcase_add_test(tc, test_commit_after_a_hit);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_client_that_stops_reading_is_dropped);
    tcase_add_test(tc, test_session_limit);
    tcase_add_test(tc, test_fork_after_connect);
    tcase_add_test(tc, test_timeout_and_reconnect);
    tcase_add_test(tc, test_second_daemon_refused_stale_socket_replaced);
    tcase_add_test(tc, test_mla_pool_layout);
    tcase_add_test(tc, test_option_structs);
    tcase_add_test(tc, test_evict);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(integration_suite)
