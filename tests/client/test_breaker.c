/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The circuit breaker (KVS_BREAKER) against a real kvshared: a hung daemon
 * (SIGSTOP) costs one timeout, then every call is answered at once until a
 * background probe gets an answer; a daemon restarted on the same socket
 * comes back; kvs_close while down does not wait out a back-off; a forked
 * child neither inherits nor joins the probe; without the flag every call
 * still waits its timeout.
 */
#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"
#include "now.h"

#define POOL 64
#define BT   4 /* the harness's tokens per block */
/* The bound of a call answered at once: generous to a noisy machine, yet
 * far below the 1 s timeout that a call without the breaker waits. */
#define FAST_MS 50
/* The valgrind twin (KVS_TEST_SMALL) checks memory and threads, not time:
 * under valgrind one thread runs at a time, tens of times slower, and on a
 * loaded host a wake-up alone can take longer than FAST_MS. Its bounds are
 * ten times wider, still below the timeouts a call without the breaker
 * waits. */
static int64_t bound_ms(int64_t ms)
{
    return getenv("KVS_TEST_SMALL") ? 10 * ms : ms;
}

/* How long a test waits for a condition before it fails. */
#define WAIT_MS 20000

static void prompt(uint32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = seed * 1000 + (uint32_t)i;
}

static kvs_client_t *connect_with(const harness_t *h, unsigned flags, int timeout_ms)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = h->socket_path;
    o.worker_name = "test-breaker";
    o.flags = flags;
    o.timeout_ms = timeout_ms;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    return c;
}

static kvs_breaker_stats_t stats_of(const kvs_client_t *c)
{
    kvs_breaker_stats_t s;
    kvs_breaker_stats_init(&s);
    ck_assert_int_eq(kvs_breaker(c, &s), 0);
    return s;
}

static void pause_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until the breaker's state is `state` (and at least min_probes
 * probes were sent); fails the test after WAIT_MS. */
static void wait_breaker(const kvs_client_t *c, uint32_t state, uint64_t min_probes)
{
    int64_t deadline = now_ms() + WAIT_MS;
    for (;;) {
        kvs_breaker_stats_t s = stats_of(c);
        if (s.state == state && s.probes >= min_probes)
            return;
        ck_assert_msg(now_ms() < deadline, "breaker still %u after %d ms (%llu probes)", s.state,
                      WAIT_MS, (unsigned long long)s.probes);
        pause_ms(2);
    }
}

/* A prompt of two blocks, cached by c. */
static void cache_prompt(kvs_client_t *c, const uint32_t *tokens)
{
    uint32_t ids[2], canon[2];
    size_t n;
    ck_assert_int_eq(kvs_alloc(c, NULL, 2, ids), 0);
    ck_assert_int_eq(kvs_commit(c, NULL, tokens, 2 * BT, ids, 2, canon, &n), 0);
    ck_assert_int_eq(kvs_release(c, canon, 2, NULL), 0);
}

/* Every kind of call while down: answered at once, KVS_ENOTCONN, a miss.
 * Each call is timed alone, so that one preemption of this process on a
 * loaded machine is not summed over several calls. */
static void expect_fast_fails(kvs_client_t *c, const uint32_t *tokens, int rounds)
{
    uint64_t before = stats_of(c).fast_fails;
    int64_t worst = 0;
    for (int i = 0; i < rounds; i++) {
        uint32_t ids[4] = {0, 1, 2, 3}, canon[2];
        size_t n = 99;
        int rc[4];
        int64_t t[5];
        t[0] = now_ns();
        rc[0] = kvs_lookup(c, NULL, tokens, 2 * BT, 1, ids, 4, &n);
        t[1] = now_ns();
        rc[1] = kvs_alloc(c, NULL, 1, ids);
        t[2] = now_ns();
        rc[2] = kvs_commit(c, NULL, tokens, 2 * BT, ids, 2, canon, NULL);
        t[3] = now_ns();
        rc[3] = kvs_ping(c, 0, NULL);
        t[4] = now_ns();
        for (int k = 0; k < 4; k++) {
            ck_assert_int_eq(rc[k], KVS_ENOTCONN);
            if (t[k + 1] - t[k] > worst)
                worst = t[k + 1] - t[k];
        }
        ck_assert_uint_eq(n, 0);
    }
    ck_assert_msg(worst / 1000000 < bound_ms(FAST_MS), "a call while down took %lld ms",
                  (long long)(worst / 1000000));
    ck_assert_int_eq(kvs_connected(c), 0);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(c), "is down"));
    ck_assert_uint_eq(stats_of(c).fast_fails, before + 4 * (uint64_t)rounds);
}

START_TEST(test_breaker_hung_daemon)
{
    harness_t h;
    uint32_t tokens[2 * BT], got[4];
    size_t n;
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    kvs_client_t *c = connect_with(&h, KVS_BREAKER, 1000);
    prompt(tokens, 2 * BT, 1);
    cache_prompt(c, tokens);
    kvs_breaker_stats_t s = stats_of(c);
    ck_assert_uint_eq(s.state, KVS_BREAKER_UP);
    ck_assert_uint_eq(s.trips, 0);

    /* The first call waits its timeout, and trips the breaker. */
    kill(h.pid, SIGSTOP);
    int64_t t0 = now_ms();
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), KVS_ETIMEDOUT);
    ck_assert_int_ge(now_ms() - t0, 900);
    s = stats_of(c);
    ck_assert_uint_eq(s.state, KVS_BREAKER_DOWN);
    ck_assert_uint_eq(s.trips, 1);

    /* Every further call is answered at once, while the probes (which the
     * stopped daemon never answers) go on in the background. */
    expect_fast_fails(c, tokens, 10);
    wait_breaker(c, KVS_BREAKER_DOWN, 2);
    expect_fast_fails(c, tokens, 10);
    s = stats_of(c);
    ck_assert_uint_eq(s.trips, 1);
    ck_assert_uint_ge(s.down_ms, 1);

    /* Resumed: a probe is answered, the next call reconnects and hits. */
    kill(h.pid, SIGCONT);
    wait_breaker(c, KVS_BREAKER_UP, 0);
    ck_assert_uint_eq(stats_of(c).down_ms, 0);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(kvs_connected(c), 1);
    ck_assert_uint_eq(kvs_epoch(c), 2);
    ck_assert_int_eq(kvs_release(c, got, n, NULL), 0);

    /* A second hang is a second trip, and again costs one timeout. */
    kill(h.pid, SIGSTOP);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), KVS_ETIMEDOUT);
    ck_assert_uint_eq(stats_of(c).trips, 2);
    expect_fast_fails(c, tokens, 2);
    kill(h.pid, SIGCONT);
    wait_breaker(c, KVS_BREAKER_UP, 0);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), 0);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

START_TEST(test_breaker_restarted_daemon)
{
    harness_t h;
    uint32_t tokens[2 * BT], got[4];
    size_t n;
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    kvs_client_t *c = connect_with(&h, KVS_BREAKER, 1000);
    prompt(tokens, 2 * BT, 2);
    cache_prompt(c, tokens);

    /* A dead daemon: the call that finds it gone trips the breaker. */
    ck_assert_int_eq(harness_stop(&h), 0);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), KVS_ENOTCONN);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(stats_of(c).state, KVS_BREAKER_DOWN);
    /* That call let go of the old pool, as without the breaker. */
    ck_assert_uint_eq(kvs_pool_base(c), 0);
    expect_fast_fails(c, tokens, 5);
    wait_breaker(c, KVS_BREAKER_DOWN, 2);

    /* Started again on the same socket: back up, a new session and pool. */
    pid_t pid;
    ck_assert_int_eq(harness_start_again(&h, POOL, 20000, &pid), -1);
    h.pid = pid;
    wait_breaker(c, KVS_BREAKER_UP, 0);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), 0);
    ck_assert_uint_eq(n, 0); /* a new daemon: nothing cached */
    ck_assert_uint_eq(kvs_epoch(c), 2);
    ck_assert_uint_ne(kvs_pool_base(c), 0);
    cache_prompt(c, tokens);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 0, got, 4, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(stats_of(c).trips, 1);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

START_TEST(test_breaker_close_while_down)
{
    harness_t h;
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    kvs_client_t *c = connect_with(&h, KVS_BREAKER, 300);
    kill(h.pid, SIGSTOP);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), KVS_ETIMEDOUT);
    /* After three probes the thread waits 400 ms or more, or probes for
     * up to 200 ms: kvs_close wakes it either way. */
    wait_breaker(c, KVS_BREAKER_DOWN, 3);
    int64_t t0 = now_ms();
    kvs_close(c);
    int64_t ms = now_ms() - t0;
    ck_assert_msg(ms < bound_ms(150), "kvs_close while down took %lld ms", (long long)ms);

    /* Closed right after the trip, while the first wait runs. */
    kill(h.pid, SIGCONT);
    c = connect_with(&h, KVS_BREAKER, 300);
    kill(h.pid, SIGSTOP);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), KVS_ETIMEDOUT);
    t0 = now_ms();
    kvs_close(c);
    ms = now_ms() - t0;
    ck_assert_msg(ms < bound_ms(150), "kvs_close right after a trip took %lld ms", (long long)ms);
    kill(h.pid, SIGCONT);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

START_TEST(test_breaker_fork)
{
    harness_t h;
    uint32_t tokens[2 * BT];
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    kvs_client_t *c = connect_with(&h, KVS_BREAKER, 300);
    prompt(tokens, 2 * BT, 3);
    kill(h.pid, SIGSTOP);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), KVS_ETIMEDOUT);
    ck_assert_uint_eq(stats_of(c).state, KVS_BREAKER_DOWN);

    /* The child has no probe thread: its calls are refused as after any
     * fork, none trips a breaker of its own, and its kvs_close joins
     * nothing. */
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        uint32_t ids[4];
        size_t n = 99;
        int ok = kvs_lookup(c, NULL, tokens, 2 * BT, 1, ids, 4, &n) == KVS_ENOTCONN && n == 0 &&
                 strstr(kvs_last_error(c), "after fork") != NULL;
        uint64_t trips = stats_of(c).trips;
        ok = ok && kvs_ping(c, 0, NULL) == KVS_ENOTCONN && stats_of(c).trips == trips;
        kvs_close(c);
        _exit(ok ? 0 : 1);
    }
    int status;
    int64_t deadline = now_ms() + WAIT_MS;
    pid_t r;
    while ((r = waitpid(child, &status, WNOHANG)) == 0 && now_ms() < deadline)
        pause_ms(5);
    if (r == 0) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
    }
    ck_assert_msg(r == child, "the forked child did not finish");
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* The parent's breaker goes on. */
    kill(h.pid, SIGCONT);
    wait_breaker(c, KVS_BREAKER_UP, 0);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), 0);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

START_TEST(test_breaker_lazy_no_daemon)
{
    harness_t h;
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    char path[sizeof(h.socket_path)];
    snprintf(path, sizeof(path), "%s", h.socket_path);
    ck_assert_int_eq(harness_stop(&h), 0);

    /* A lazy connect that finds no daemon trips at once. */
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = path;
    o.flags = KVS_BREAKER | KVS_LAZY;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    kvs_breaker_stats_t s = stats_of(c);
    ck_assert_uint_eq(s.state, KVS_BREAKER_DOWN);
    ck_assert_uint_eq(s.trips, 1);
    uint32_t ids[1];
    ck_assert_int_eq(kvs_alloc(c, NULL, 1, ids), KVS_ENOTCONN);
    ck_assert_uint_eq(stats_of(c).fast_fails, 1);

    /* Its daemon starts: up, and the next call connects. */
    pid_t pid;
    ck_assert_int_eq(harness_start_again(&h, POOL, 20000, &pid), -1);
    h.pid = pid;
    wait_breaker(c, KVS_BREAKER_UP, 1);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), 0);
    ck_assert_uint_eq(kvs_epoch(c), 1);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

START_TEST(test_no_breaker_unchanged)
{
    harness_t h;
    uint32_t tokens[2 * BT], got[4];
    size_t n;
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    kvs_client_t *c = connect_with(&h, 0, 300);
    prompt(tokens, 2 * BT, 4);
    kill(h.pid, SIGSTOP);
    /* Without KVS_BREAKER each call tries again and waits its timeout. */
    for (int i = 0; i < 2; i++) {
        int64_t t0 = now_ms();
        ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), KVS_ETIMEDOUT);
        ck_assert_uint_eq(n, 0);
        ck_assert_int_ge(now_ms() - t0, 250);
    }
    kvs_breaker_stats_t s = stats_of(c);
    ck_assert_uint_eq(s.state, KVS_BREAKER_UP);
    ck_assert_uint_eq(s.trips + s.probes + s.fast_fails + s.down_ms, 0);
    kill(h.pid, SIGCONT);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 2 * BT, 1, got, 4, &n), 0);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

START_TEST(test_breaker_stats_arguments)
{
    kvs_breaker_stats_t s;
    memset(&s, 0xab, sizeof(s));
    kvs_breaker_stats_init(&s);
    ck_assert_uint_eq(s.size, sizeof(s));
    ck_assert_uint_eq(s.state, KVS_BREAKER_UP);
    ck_assert_uint_eq(s.reserved[5], 0);
    kvs_breaker_stats_init(NULL);
    ck_assert_int_eq(kvs_breaker(NULL, &s), KVS_EINVAL);

    harness_t h;
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    kvs_client_t *c = harness_client(&h, "test-breaker", KVS_BREAKER);
    ck_assert_int_eq(kvs_breaker(c, NULL), KVS_EINVAL);
    s.size = 0;
    ck_assert_int_eq(kvs_breaker(c, &s), KVS_EINVAL);
    s.size = sizeof(s) + 8;
    ck_assert_int_eq(kvs_breaker(c, &s), KVS_EINVAL);
    /* An older, shorter struct gets its own bytes only. */
    union {
        kvs_breaker_stats_t s;
        uint64_t words[sizeof(kvs_breaker_stats_t) / sizeof(uint64_t)];
    } room;
    memset(&room, 0xab, sizeof(room));
    room.s.size = 2 * sizeof(uint64_t);
    ck_assert_int_eq(kvs_breaker(c, &room.s), 0);
    ck_assert_uint_eq(room.words[0], 2 * sizeof(uint64_t));
    ck_assert_uint_eq(room.words[1], 0); /* state up, reserved32 0 */
    ck_assert_uint_eq(room.words[2], 0xababababababababull);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

static Suite *breaker_suite(void)
{
    Suite *s = suite_create("breaker");
    TCase *tc = tcase_create("breaker");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, test_breaker_stats_arguments);
    tcase_add_test(tc, test_breaker_hung_daemon);
    tcase_add_test(tc, test_breaker_restarted_daemon);
    tcase_add_test(tc, test_breaker_close_while_down);
    tcase_add_test(tc, test_breaker_fork);
    tcase_add_test(tc, test_breaker_lazy_no_daemon);
    tcase_add_test(tc, test_no_breaker_unchanged);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(breaker_suite)
