/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fault tests against a real kvshared: workers SIGKILLed at each point of the
 * block lifecycle and at random points, clients that never send or never
 * read, thousands of short connections, a pool exhausted by pins. After each,
 * the daemon's Stats must show exact block accounting (free + writing +
 * cached == pool; nothing WRITING or pinned once no client holds anything;
 * sessions back to the expected count), and the whole pool must be
 * allocatable again: nothing leaked.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "rel_util.h"

#define POOL 64

/* Deadlines for what must happen (a reply, a quiet daemon, a drop); only a
 * failing test waits them out. Under valgrind the daemon runs tens of times
 * slower, and a loaded machine slower still. */
#ifdef KVS_TEST_DAEMON_CHECKED
#define WAIT_MS 120000
#else
#define WAIT_MS 20000
#endif

static harness_t h;
static kvs_client_t *mon; /* the test's monitor: one session throughout */

static void start(void)
{
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    mon = harness_client_ms(&h, "monitor", 0, WAIT_MS);
}

static void stop(void)
{
    kvs_close(mon);
    mon = NULL;
    if (h.pid > 0)
        ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}

/* The pool is whole again: with nothing held, one client can take every
 * block (evicting what is cached), and give them back. */
static void assert_pool_whole(void)
{
    kvs_client_t *c = harness_client_ms(&h, "whole", 0, WAIT_MS);
    uint32_t ids[POOL];
    int rc = kvs_alloc(c, NULL, POOL, ids);
    ck_assert_msg(rc == 0, "alloc of the whole pool: %s", kvs_last_error(c));
    ck_assert_int_eq(kvs_release(c, ids, POOL, NULL), 0);
    kvs_close(c);
    rel_wait_quiet(mon, 1, 1, WAIT_MS, NULL);
}

/* Commits prompt `family` (n blocks) and releases the commit's pins: the
 * blocks stay cached, unpinned. */
static void seed_prefix(uint32_t family, size_t n)
{
    kvs_client_t *c = harness_client_ms(&h, "seed", 0, WAIT_MS);
    uint32_t tokens[16 * REL_BT], ids[16], can[16];
    size_t done;
    rel_prompt(tokens, n * REL_BT, family);
    ck_assert_int_eq(kvs_alloc(c, NULL, (uint32_t)n, ids), 0);
    ck_assert_int_eq(kvs_commit(c, NULL, tokens, n * REL_BT, ids, n, can, &done), 0);
    ck_assert_int_eq(kvs_release(c, can, n, NULL), 0);
    kvs_close(c);
}

/* --- SIGKILL at each point of the block lifecycle ---------------------------------------- */

enum kill_point {
    AFTER_LOOKUP_PIN,
    AFTER_ALLOC,
    MID_WRITE,
    AFTER_COMMIT,
    MID_FRAME,
    N_POINTS,
};

static const char *const point_names[N_POINTS] = {
    "after lookup+pin", "after alloc", "mid-write", "after commit", "mid-frame",
};

#define SEEDED_FAMILY 7
#define SEEDED_BLOCKS 4
#define OWN_FAMILY    8
#define OWN_BLOCKS    3

/* A worker that goes up to `point`, says so on ready_fd, then waits to be
 * killed. Exit codes say which step failed. */
static void __attribute__((noreturn)) worker_to_point(int point, int ready_fd)
{
    uint32_t tokens[16 * REL_BT], got[16], ids[16], can[16];
    size_t n, done;
    kvs_options_t o;
    kvs_client_t *c = NULL;

    if (point == MID_FRAME) {
        /* A raw client: Alloc, then half of a Commit frame, then nothing. */
        int fd = raw_connect(h.socket_path);
        if (fd < 0)
            _exit(10);
        Kvshare__Request req = KVSHARE__REQUEST__INIT;
        Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
        al.n = 2;
        req.id = 1;
        req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
        req.alloc = &al;
        if (raw_send_request(fd, &req) != 0)
            _exit(11);
        Kvshare__Response *r = raw_read_reply(fd, WAIT_MS);
        if (!r || r->status != 0 || !r->alloc || r->alloc->n_block_ids != 2)
            _exit(12);
        Kvshare__Request cr = KVSHARE__REQUEST__INIT;
        Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
        rel_prompt(tokens, 2 * REL_BT, OWN_FAMILY);
        cm.tokens.data = (uint8_t *)tokens;
        cm.tokens.len = 2 * REL_BT * 4;
        cm.n_block_ids = 2;
        cm.block_ids = r->alloc->block_ids;
        cr.id = 2;
        cr.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
        cr.commit = &cm;
        size_t len;
        uint8_t *frame = raw_frame(&cr, &len);
        if (!frame || raw_write_all(fd, frame, len / 2) != 0)
            _exit(13);
        goto ready;
    }

    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.worker_name = point_names[point];
    o.timeout_ms = WAIT_MS;
    if (kvs_connect(&o, &c) != 0)
        _exit(20);
    rel_prompt(tokens, (SEEDED_BLOCKS + OWN_BLOCKS) * REL_BT, SEEDED_FAMILY);
    if (kvs_lookup(c, NULL, tokens, (SEEDED_BLOCKS + OWN_BLOCKS) * REL_BT,
                   point == AFTER_LOOKUP_PIN || point == AFTER_ALLOC, got, 16, &n) != 0 ||
        n != SEEDED_BLOCKS)
        _exit(21);
    if (point == AFTER_LOOKUP_PIN)
        goto ready;
    if (kvs_alloc(c, NULL, OWN_BLOCKS, ids) != 0)
        _exit(22);
    if (point == AFTER_ALLOC)
        goto ready;
    kvs_geometry_t g;
    if (kvs_geometry(c, &g) != 0)
        _exit(23);
    for (size_t j = 0; j < OWN_BLOCKS; j++) {
        uintptr_t addr;
        if (kvs_block_addr(c, 0, 0, ids[j], &addr) != 0)
            _exit(24);
        /* Half of the first block: the kill lands in the middle of a write. */
        size_t bytes = point == MID_WRITE && j == 0 ? g.slot_bytes / 2 : g.slot_bytes;
        for (size_t i = 0; i < bytes; i++)
            ((uint8_t *)addr)[i] = rel_pattern(OWN_FAMILY, j, 0, 0, i);
        if (point == MID_WRITE)
            goto ready;
    }
    rel_prompt(tokens, OWN_BLOCKS * REL_BT, OWN_FAMILY);
    if (kvs_commit(c, NULL, tokens, OWN_BLOCKS * REL_BT, ids, OWN_BLOCKS, can, &done) != 0 ||
        done != OWN_BLOCKS)
        _exit(25);
ready:
    if (write(ready_fd, "R", 1) != 1)
        _exit(30);
    for (;;)
        pause();
}

static pid_t spawn_to_point(int point)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(p[0]);
        worker_to_point(point, p[1]);
    }
    close(p[1]);
    struct pollfd pfd = {.fd = p[0], .events = POLLIN};
    char b = 0;
    int ok = poll(&pfd, 1, WAIT_MS) == 1 && read(p[0], &b, 1) == 1;
    close(p[0]);
    if (!ok) {
        int status = 0;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ck_abort_msg("worker did not reach '%s' (exit %d)", point_names[point],
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    return pid;
}

static void kill_and_reap(pid_t pid)
{
    int status;
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

START_TEST(test_sigkill_at_each_lifecycle_point)
{
    int point = _i;
    seed_prefix(SEEDED_FAMILY, SEEDED_BLOCKS);
    kvs_stats_t s;
    rel_wait_quiet(mon, 1, 1, WAIT_MS, &s);
    uint32_t cached_before = s.cached_blocks;
    kvs_stats_free(&s);

    pid_t pid = spawn_to_point(point);
    /* The daemon holds what the worker took. */
    rel_stats(mon, &s);
    ck_assert_uint_eq(s.sessions, 2);
    uint32_t want_pinned[N_POINTS] = {SEEDED_BLOCKS, SEEDED_BLOCKS, 0, OWN_BLOCKS, 0};
    uint32_t want_writing[N_POINTS] = {0, OWN_BLOCKS, OWN_BLOCKS, 0, 2};
    ck_assert_msg(s.pinned_blocks == want_pinned[point] && s.writing_blocks == want_writing[point],
                  "%s: pinned %u writing %u", point_names[point], s.pinned_blocks,
                  s.writing_blocks);
    kvs_stats_free(&s);

    kill_and_reap(pid);
    rel_wait_quiet(mon, 1, 1, WAIT_MS, &s);
    /* Committed blocks outlive their writer; nothing else it held stays. */
    ck_assert_uint_eq(s.cached_blocks, cached_before + (point == AFTER_COMMIT ? OWN_BLOCKS : 0));
    kvs_stats_free(&s);
    if (point == AFTER_COMMIT) {
        uint32_t tokens[OWN_BLOCKS * REL_BT], got[OWN_BLOCKS];
        size_t n;
        rel_prompt(tokens, OWN_BLOCKS * REL_BT, OWN_FAMILY);
        ck_assert_int_eq(kvs_lookup(mon, NULL, tokens, OWN_BLOCKS * REL_BT, 0, got, OWN_BLOCKS, &n),
                         0);
        ck_assert_uint_eq(n, OWN_BLOCKS);
    }
    /* Other clients were served throughout, and the pool is whole. */
    assert_pool_whole();
}
END_TEST

/* A worker doing random lifecycle steps forever, with a seed of its own. */
static void __attribute__((noreturn)) random_worker(uint32_t seed)
{
    kvs_options_t o;
    kvs_client_t *c;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = WAIT_MS;
    if (kvs_connect(&o, &c) != 0)
        _exit(40);
    srand(seed);
    uint32_t tokens[8 * REL_BT], got[8], ids[8], can[8];
    for (;;) {
        uint32_t family = (uint32_t)rand() % 6;
        size_t nb = 1 + (size_t)rand() % 8, n = 0, done = 0;
        rel_prompt(tokens, nb * REL_BT, family);
        if (kvs_lookup(c, NULL, tokens, nb * REL_BT, 1, got, 8, &n) != 0)
            _exit(41);
        if (n < nb && kvs_alloc(c, NULL, (uint32_t)nb, ids) == 0) {
            /* A commit names a block for every prompt block from the first:
             * the ones already cached come back as canonical and the
             * duplicates stay WRITING until released. */
            uint32_t dup[8];
            size_t n_dup = 0;
            int rc = kvs_commit(c, NULL, tokens, nb * REL_BT, ids, nb, can, &done);
            if (rc != 0 || done != nb)
                _exit(42);
            for (size_t k = 0; k < done; k++)
                if (can[k] != ids[k])
                    dup[n_dup++] = ids[k];
            if (rand() % 4 != 0 && kvs_release(c, dup, n_dup, NULL) != 0)
                _exit(43);
            if (rand() % 4 != 0 && kvs_release(c, can, done, NULL) != 0)
                _exit(44);
        }
        if (rand() % 3 != 0 && kvs_release(c, got, n, NULL) != 0)
            _exit(45);
    }
}

START_TEST(test_sigkill_at_random_points)
{
    /* Pins and WRITING blocks in every combination; the kill lands wherever
     * it lands: between calls, in a call, in the middle of a frame. */
    for (uint32_t round = 0; round < 40; round++) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0)
            random_worker(round + 1);
        usleep(1000 * (round % 10) + 300 * round);
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        ck_assert_msg(r == 0, "worker exited early with %d",
                      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        kill_and_reap(pid);
        rel_wait_quiet(mon, 1, 1, WAIT_MS, NULL);
    }
    assert_pool_whole();
}
END_TEST

/* --- clients that never send, or stop reading -------------------------------------------- */

START_TEST(test_silent_clients_do_not_block_others)
{
    enum { SILENT = 100 };
    int fds[SILENT + 2];
    for (int i = 0; i < SILENT; i++) {
        fds[i] = raw_connect(h.socket_path);
        ck_assert_int_ge(fds[i], 0);
    }
    /* Two that stop mid-frame: in the length prefix, and in the body. */
    static const uint8_t half_len[2] = {0x10, 0};
    static const uint8_t half_body[6] = {0xe8, 0x03, 0, 0, 0x08, 0x01};
    fds[SILENT] = raw_connect(h.socket_path);
    fds[SILENT + 1] = raw_connect(h.socket_path);
    ck_assert_int_eq(raw_write_all(fds[SILENT], half_len, sizeof(half_len)), 0);
    ck_assert_int_eq(raw_write_all(fds[SILENT + 1], half_body, sizeof(half_body)), 0);

    /* A worker's whole lifecycle goes through while they hang. */
    kvs_client_t *w = harness_client_ms(&h, "worker", 0, 2000);
    uint32_t tokens[4 * REL_BT], ids[4], can[4], got[4];
    size_t n, done;
    rel_prompt(tokens, 4 * REL_BT, 3);
    ck_assert_int_eq(kvs_lookup(w, NULL, tokens, 4 * REL_BT, 1, got, 4, &n), 0);
    ck_assert_int_eq(kvs_alloc(w, NULL, 4, ids), 0);
    ck_assert_int_eq(kvs_commit(w, NULL, tokens, 4 * REL_BT, ids, 4, can, &done), 0);
    ck_assert_int_eq(kvs_lookup(w, NULL, tokens, 4 * REL_BT, 1, got, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(kvs_release(w, can, 4, NULL), 0);
    ck_assert_int_eq(kvs_release(w, got, 4, NULL), 0);

    /* kvshared has no idle limit: silent sessions stay until they close (the
     * session limit bounds them). */
    kvs_stats_t s;
    rel_stats(mon, &s);
    ck_assert_uint_eq(s.sessions, SILENT + 2 + 2);
    kvs_stats_free(&s);
    kvs_close(w);
    for (int i = 0; i < SILENT + 2; i++)
        close(fds[i]);
    rel_wait_quiet(mon, 1, 1, WAIT_MS, NULL);
    assert_pool_whole();
}
END_TEST

START_TEST(test_client_that_stops_reading_is_dropped_and_released)
{
    /* This test's own daemon, with a 1 MiB output limit. */
    static const char *const extra[] = {"--max-output", "1MiB", NULL};
    harness_t own;
    ck_assert_int_eq(harness_start(&own, POOL, extra), 0);
    kvs_client_t *m = harness_client_ms(&own, "monitor", 0, WAIT_MS);
    long rss_before = rel_rss_anon_kib(own.pid);

    int fd = raw_connect(own.socket_path);
    ck_assert_int_ge(fd, 0);
    /* It holds blocks... */
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = 5;
    req.id = 1;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    ck_assert_int_eq(raw_send_request(fd, &req), 0);
    Kvshare__Response *r = raw_read_reply(fd, WAIT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    kvshare__response__free_unpacked(r, NULL);

    /* ... then pipelines 60 kB pings and never reads a reply. */
    Kvshare__PingRequest pr = KVSHARE__PING_REQUEST__INIT;
    static uint8_t payload[60000];
    pr.payload.data = payload;
    pr.payload.len = sizeof(payload);
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &pr;
    size_t len;
    uint8_t *frame = raw_frame(&req, &len);
    ck_assert_ptr_nonnull(frame);
    int dropped = 0;
    size_t sent = 0;
    for (int i = 0; i < 20000 && !dropped; i++) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, WAIT_MS) <= 0)
            break;
        if (pfd.revents & (POLLERR | POLLHUP)) {
            dropped = 1;
        } else {
            ssize_t w = send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0 && errno != EAGAIN)
                dropped = 1;
            else if (w > 0)
                sent += (size_t)w;
        }
    }
    free(frame);
    close(fd);
    ck_assert_msg(dropped, "a client that never reads was not disconnected (%zu bytes sent)", sent);

    /* Its blocks went back; the daemon's memory did not follow the flood. */
    kvs_stats_t s;
    rel_wait_quiet(m, 1, 1, WAIT_MS, &s);
    kvs_stats_free(&s);
    long rss_after = rel_rss_anon_kib(own.pid);
    ck_assert_msg(!REL_RSS_MEANINGFUL || (rss_after >= 0 && rss_after - rss_before < 8 * 1024),
                  "daemon RssAnon %ld KiB before, %ld KiB after (%zu bytes sent, unread)",
                  rss_before, rss_after, sent);
    ck_assert_int_eq(kvs_ping(m, 16, NULL), 0);
    kvs_close(m);
    ck_assert_int_eq(harness_stop(&own), 0);
    harness_cleanup(&own);
}
END_TEST

/* Regression: replies far larger than their requests (Stats with many
 * namespaces: ~20 kB for an 8-byte request) were all built for one read of
 * pipelined requests before --max-output was looked at, so one 64 KiB write
 * that is never read made the daemon hold ~160 MB. */
START_TEST(test_reply_flood_from_small_requests_is_bounded)
{
    /* One connection makes all the namespaces: no per-session limit. */
    static const char *const extra[] = {"--max-output", "1MiB", "--session-max-namespaces", "0",
                                        NULL};
    harness_t own;
    ck_assert_int_eq(harness_start(&own, POOL, extra), 0);
    kvs_client_t *m = harness_client_ms(&own, "monitor", 0, WAIT_MS);
    /* Many namespaces with long names make Stats replies large. */
    uint32_t tokens[REL_BT], got[1];
    size_t n;
    rel_prompt(tokens, REL_BT, 1);
    for (int i = 0; i < 200; i++) {
        char ns[64];
        snprintf(ns, sizeof(ns), "tenant-%03d-with-a-name-as-long-as-kvshared-allows-xxxxxxxxxxxx",
                 i);
        ck_assert_int_eq(kvs_lookup(m, ns, tokens, REL_BT, 0, got, 1, &n), 0);
    }
    kvs_stats_t s;
    rel_stats(m, &s);
    ck_assert_uint_ge(s.n_namespaces, 200);
    kvs_stats_free(&s);
    long hwm_before = rel_vm_hwm_kib(own.pid);

    /* 256 KiB of pipelined Stats requests, written at once, never read. */
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__StatsRequest sr = KVSHARE__STATS_REQUEST__INIT;
    req.id = 1;
    req.rpc_case = KVSHARE__REQUEST__RPC_STATS;
    req.stats = &sr;
    size_t len, flood_len;
    uint8_t *frame = raw_frame(&req, &len);
    ck_assert_ptr_nonnull(frame);
    free(frame);
    size_t count = (256u << 10) / len;
    uint8_t *flood = raw_frames(&req, count, &flood_len);
    ck_assert_ptr_nonnull(flood);
    ck_assert_uint_eq(flood_len, count * len);
    int fd = raw_connect(own.socket_path);
    ck_assert_int_ge(fd, 0);
    /* The daemon may hang up before it has read everything. */
    raw_write_all(fd, flood, count * len);
    free(flood);

    /* Dropped: the monitor alone remains. */
    rel_wait_quiet(m, 1, 1, 10000, NULL);
    long hwm_after = rel_vm_hwm_kib(own.pid);
    printf("reply flood: %zu Stats requests of %zu bytes; daemon peak RSS %ld -> %ld KiB\n", count,
           len, hwm_before, hwm_after);
    ck_assert_msg(!REL_RSS_MEANINGFUL || hwm_after - hwm_before < 16 * 1024,
                  "daemon peak RSS went from %ld KiB to %ld KiB for a 1 MiB output limit",
                  hwm_before, hwm_after);
    close(fd);
    ck_assert_int_eq(kvs_ping(m, 16, NULL), 0);
    kvs_close(m);
    ck_assert_int_eq(harness_stop(&own), 0);
    harness_cleanup(&own);
}
END_TEST

/* --- thousands of connections ------------------------------------------------------------ */

static void __attribute__((noreturn)) churn(int which, int count)
{
    kvs_options_t o;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = WAIT_MS;
    for (int i = 0; i < count; i++) {
        switch ((i + which) % 3) {
        case 0: { /* connect, close: not even a Hello */
            int fd = raw_connect(h.socket_path);
            if (fd < 0)
                _exit(50);
            close(fd);
            break;
        }
        case 1: { /* Hello, the pool's fd passed and mapped, close */
            kvs_client_t *c;
            if (kvs_connect(&o, &c) != 0)
                _exit(51);
            kvs_close(c);
            break;
        }
        default: { /* take a block and a pin, leave without giving them back */
            kvs_client_t *c;
            uint32_t tokens[REL_BT], id, got[1];
            size_t n;
            if (kvs_connect(&o, &c) != 0)
                _exit(52);
            rel_prompt(tokens, REL_BT, 1);
            if (kvs_alloc(c, NULL, 1, &id) != 0 ||
                kvs_lookup(c, NULL, tokens, REL_BT, 1, got, 1, &n) != 0)
                _exit(53);
            kvs_close(c);
            break;
        }
        }
    }
    _exit(0);
}

START_TEST(test_thousands_of_connections)
{
    enum { PROCS = 4, EACH = 1250 };
    seed_prefix(1, 1);
    kvs_stats_t s;
    rel_wait_quiet(mon, 1, 1, WAIT_MS, &s);
    uint64_t total_before = s.sessions_total;
    kvs_stats_free(&s);
    int fds_before = rel_fd_count(h.pid);
    long rss_before = rel_rss_anon_kib(h.pid);

    int64_t t0 = now_ms();
    pid_t pids[PROCS];
    for (int k = 0; k < PROCS; k++) {
        pids[k] = fork();
        ck_assert_int_ge(pids[k], 0);
        if (pids[k] == 0)
            churn(k, EACH);
    }
    for (int k = 0; k < PROCS; k++) {
        int status;
        ck_assert_int_eq(waitpid(pids[k], &status, 0), pids[k]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "churn %d failed: %d", k,
                      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    int64_t ms = now_ms() - t0;

    rel_wait_quiet(mon, 1, 1, 10000, &s);
    ck_assert_uint_eq(s.sessions_total - total_before, PROCS * EACH);
    kvs_stats_free(&s);
    /* No descriptor (socket, exported pool fd) and no memory kept per
     * connection. */
    ck_assert_int_eq(rel_fd_count(h.pid), fds_before);
    long rss_after = rel_rss_anon_kib(h.pid);
    ck_assert_msg(!REL_RSS_MEANINGFUL || rss_after - rss_before < 2048,
                  "daemon RssAnon %ld KiB before, %ld KiB after", rss_before, rss_after);
    printf("connections: %d in %lld ms; daemon RssAnon %ld -> %ld KiB, %d fds\n", PROCS * EACH,
           (long long)ms, rss_before, rss_after, fds_before);
    assert_pool_whole();
}
END_TEST

START_TEST(test_descriptor_limit_reached)
{
    /* A daemon whose descriptor limit (64) is far below its session limit:
     * connections past it are refused, Hellos that cannot export the pool
     * fail with a message, and the daemon keeps serving the rest. */
    enum { LIMIT = 64, TRIES = 100 };
    struct rlimit saved, low;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
    low = saved;
    low.rlim_cur = LIMIT;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    harness_t own;
    int started = harness_start(&own, POOL, NULL);
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &saved), 0);
    ck_assert_int_eq(started, 0);
    kvs_client_t *m = harness_client_ms(&own, "monitor", 0, WAIT_MS);

    int fds[TRIES], open_fds = 0;
    for (int i = 0; i < TRIES; i++) {
        fds[i] = raw_connect(own.socket_path);
        open_fds += fds[i] >= 0;
    }
    kvs_stats_t s;
    rel_stats(m, &s);
    /* The daemon accepts (and refuses) the queued connections as its loop
     * gets to them: wait for the first refusal to be counted. */
    for (int i = 0; i < 500 && s.counters[KVS_COUNTER_sessions_refused_fds] == 0; i++) {
        kvs_stats_free(&s);
        usleep(10000);
        rel_stats(m, &s);
    }
    int daemon_fds = rel_fd_count(own.pid);
    /* Some were refused: the limit was reached, and the refusals were
     * counted (before, libuv closed them at EMFILE unseen). */
    ck_assert_uint_lt(s.sessions, TRIES + 1);
    ck_assert_uint_gt(s.counters[KVS_COUNTER_sessions_refused_fds], 0);
    /* Past the limit, a new worker fails fast instead of hanging. */
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = own.socket_path;
    o.timeout_ms = 2000;
    int64_t t0 = now_ms();
    int rc = kvs_connect(&o, &c);
    ck_assert_msg(now_ms() - t0 < 2500, "connect took %lld ms", (long long)(now_ms() - t0));
    if (rc == 0)
        kvs_close(c);
    /* The monitor, connected before, is still served. */
    ck_assert_int_eq(kvs_ping(m, 16, NULL), 0);
    for (int i = 0; i < TRIES; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    rel_wait_quiet(m, 1, 1, WAIT_MS, NULL);
    /* Back under the limit: workers connect (with the pool's fd) again. */
    c = harness_client_ms(&own, "after", 0, WAIT_MS);
    uint32_t ids[4];
    ck_assert_int_eq(kvs_alloc(c, NULL, 4, ids), 0);
    kvs_close(c);
    rel_wait_quiet(m, 1, 1, WAIT_MS, NULL);
    printf("descriptor limit %d: %d connections, %u sessions, %llu refused for descriptors, "
           "daemon fds %d; a worker past the limit got: %s\n",
           LIMIT, open_fds, s.sessions,
           (unsigned long long)s.counters[KVS_COUNTER_sessions_refused_fds], daemon_fds,
           kvs_strerror(rc));
    kvs_stats_free(&s);
    kvs_close(m);
    ck_assert_int_eq(harness_stop(&own), 0);
    harness_cleanup(&own);
}
END_TEST

/* --- a pool exhausted by pins ------------------------------------------------------------ */

/* A child that pins the whole of family 1 (POOL blocks) and waits. */
static pid_t spawn_pinner(void)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        static uint32_t tokens[POOL * REL_BT], got[POOL];
        kvs_options_t o;
        kvs_client_t *c;
        size_t n;
        close(p[0]);
        kvs_options_init(&o);
        o.socket_path = h.socket_path;
        o.timeout_ms = WAIT_MS;
        rel_prompt(tokens, POOL * REL_BT, 1);
        if (kvs_connect(&o, &c) != 0 ||
            kvs_lookup(c, NULL, tokens, POOL * REL_BT, 1, got, POOL, &n) != 0 || n != POOL)
            _exit(60);
        if (write(p[1], "R", 1) != 1)
            _exit(61);
        for (;;)
            pause();
    }
    close(p[1]);
    char b;
    struct pollfd pfd = {.fd = p[0], .events = POLLIN};
    ck_assert_msg(poll(&pfd, 1, WAIT_MS) == 1 && read(p[0], &b, 1) == 1, "pinner did not start");
    close(p[0]);
    return pid;
}

START_TEST(test_pool_exhausted_by_pins)
{
    static uint32_t tokens[POOL * REL_BT];
    uint32_t ids[POOL], can[POOL], one;
    size_t done;
    kvs_stats_t s;
    kvs_client_t *a = harness_client_ms(&h, "a", 0, WAIT_MS);
    kvs_client_t *b = harness_client_ms(&h, "b", 0, WAIT_MS);

    /* Every block WRITING. */
    ck_assert_int_eq(kvs_alloc(a, NULL, POOL, ids), 0);
    ck_assert_int_eq(kvs_alloc(b, NULL, 1, &one), KVS_EPOOLFULL);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(b), "pool full"));

    /* Every block cached and pinned by its committer: still full. */
    rel_prompt(tokens, POOL * REL_BT, 1);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens, POOL * REL_BT, ids, POOL, can, &done), 0);
    ck_assert_int_eq(kvs_alloc(b, NULL, 1, &one), KVS_EPOOLFULL);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(b), "pinned"));

    /* Two readers pin everything too; the committer lets go: still full. */
    pid_t r1 = spawn_pinner(), r2 = spawn_pinner();
    ck_assert_int_eq(kvs_release(a, can, POOL, NULL), 0);
    ck_assert_int_eq(kvs_alloc(b, NULL, 1, &one), KVS_EPOOLFULL);
    kill_and_reap(r1);
    rel_wait_quiet(mon, 4, 0, WAIT_MS, NULL);
    ck_assert_int_eq(kvs_alloc(b, NULL, 1, &one), KVS_EPOOLFULL);
    rel_stats(mon, &s);
    ck_assert_uint_eq(s.pinned_blocks, POOL);
    ck_assert_uint_ge(s.alloc_failures, 4);
    kvs_stats_free(&s);

    /* The last pinner dies: eviction makes room again. */
    kill_and_reap(r2);
    rel_wait_quiet(mon, 3, 1, WAIT_MS, NULL);
    ck_assert_int_eq(kvs_alloc(b, NULL, 1, &one), 0);
    rel_stats(mon, &s);
    ck_assert_uint_eq(s.writing_blocks, 1);
    ck_assert_uint_eq(s.cached_blocks, POOL - 1);
    ck_assert_uint_ge(s.evictions, 1);
    kvs_stats_free(&s);
    ck_assert_int_eq(kvs_release(b, &one, 1, NULL), 0);
    kvs_close(a);
    kvs_close(b);
    rel_wait_quiet(mon, 1, 1, WAIT_MS, NULL);
    assert_pool_whole();
}
END_TEST

static Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("daemon");
    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_sigkill_at_each_lifecycle_point, 0, N_POINTS);
    tcase_add_test(tc, test_sigkill_at_random_points);
    tcase_add_test(tc, test_silent_clients_do_not_block_others);
    tcase_add_test(tc, test_client_that_stops_reading_is_dropped_and_released);
    tcase_add_test(tc, test_reply_flood_from_small_requests_is_bounded);
    tcase_add_test(tc, test_thousands_of_connections);
    tcase_add_test(tc, test_descriptor_limit_reached);
    tcase_add_test(tc, test_pool_exhausted_by_pins);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(faults_suite)
