/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Daemon restart under load: worker processes (libkvshare, KVS_LAZY, 300 ms
 * timeout) keep serving while kvshared is SIGKILLed, stays down, comes back
 * on the same socket, is stopped with SIGTERM, and comes back again.
 *
 * Checked, phase by phase (a call counts in a phase only if it started and
 * ended in it):
 *   - up: replies are OK (or KVS_EPOOLFULL), and lookups hit once prefixes
 *     are committed; hit blocks hold their writer's bytes;
 *   - down: every call fails fast, lookups with KVS_ENOTCONN (or
 *     KVS_ETIMEDOUT) and 0 blocks: a miss; no call takes longer than the
 *     timeout plus a margin;
 *   - after a restart: each worker reconnects by itself (its epoch grows),
 *     recommits, and hits again;
 *   - at the end every worker exits cleanly (no crash on a pool mapping of a
 *     daemon that is gone), and the daemon's accounting is exact.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "rel_util.h"

#define POOL         128
#define WORKERS      4
#define FAMILIES     8
#define NB           4
#define TIMEOUT_MS   300
#define RECONNECT_MS 20
#define PHASES       5

enum { UP1, DOWN_KILLED, UP2, DOWN_STOPPED, UP3 };
static const char *const phase_names[PHASES] = {"up", "down (SIGKILL)", "up again",
                                                "down (SIGTERM)", "up again"};

typedef struct phase_counts {
    uint64_t calls, lookups, hits, by_code[KVS_STATUS_COUNT];
    uint64_t blocks_while_failing; /* lookups that failed yet returned blocks */
    uint64_t corrupt;
    int64_t max_ms;
} phase_counts_t;

typedef struct shared {
    volatile int phase;
    volatile int stop;
    phase_counts_t p[WORKERS][PHASES + 1]; /* the last: transitions, not counted */
    uint64_t epoch[WORKERS];
} shared_t;

static harness_t h;
static shared_t *sh;

/* Runs one call, timing it and recording its status in the phase it
 * started and ended in. */
#define TIMED(slot, is_lookup, call, rc_out)                                                       \
    do {                                                                                           \
        int ph_ = sh->phase;                                                                       \
        int64_t t0_ = now_ms();                                                                    \
        rc_out = (call);                                                                           \
        int64_t ms_ = now_ms() - t0_;                                                              \
        if (sh->phase == ph_) {                                                                    \
            phase_counts_t *pc_ = &sh->p[slot][ph_];                                               \
            pc_->calls++;                                                                          \
            pc_->lookups += (is_lookup);                                                           \
            if (rc_out <= 0 && rc_out > -KVS_STATUS_COUNT)                                         \
                pc_->by_code[-rc_out]++;                                                           \
            if (ms_ > pc_->max_ms)                                                                 \
                pc_->max_ms = ms_;                                                                 \
        }                                                                                          \
        last_phase = sh->phase == ph_ ? ph_ : -1;                                                  \
    } while (0)

static void __attribute__((noreturn)) worker(int slot)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    uint32_t tokens[NB * REL_BT], got[NB], ids[NB], can[NB], dup[NB];
    uint8_t bytes[256];
    int last_phase = -1, rc;
    size_t n, done;

    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = TIMEOUT_MS;
    o.reconnect_ms = RECONNECT_MS;
    o.flags = KVS_LAZY;
    o.worker_name = "restart";
    if (kvs_connect(&o, &c) != 0)
        _exit(80);
    srand((unsigned)slot + 1);
    while (!sh->stop) {
        uint32_t family = (uint32_t)rand() % FAMILIES;
        rel_prompt(tokens, NB * REL_BT, family);
        n = 99;
        TIMED(slot, 1, kvs_lookup(c, NULL, tokens, NB * REL_BT, 1, got, NB, &n), rc);
        if (rc != 0 && n != 0 && last_phase >= 0)
            sh->p[slot][last_phase].blocks_while_failing++;
        sh->epoch[slot] = kvs_epoch(c);
        if (rc == 0 && n > 0) {
            if (last_phase >= 0)
                sh->p[slot][last_phase].hits++;
            kvs_geometry_t g;
            if (kvs_geometry(c, &g) != 0 || g.slot_bytes > sizeof(bytes))
                _exit(81);
            for (size_t j = 0; j < n; j++) {
                if (kvs_block_read(c, 1, 1, got[j], bytes, g.slot_bytes) != 0)
                    _exit(82);
                for (size_t i = 0; i < g.slot_bytes; i++)
                    if (bytes[i] != rel_pattern(family, j, 1, 1, i)) {
                        if (last_phase >= 0)
                            sh->p[slot][last_phase].corrupt++;
                        break;
                    }
            }
        }
        if (rc == 0 && n < NB) {
            TIMED(slot, 0, kvs_alloc(c, NULL, NB, ids), rc);
            if (rc == 0) {
                kvs_geometry_t g;
                if (kvs_geometry(c, &g) != 0)
                    _exit(83);
                for (size_t j = 0; j < NB; j++)
                    for (uint32_t l = 0; l < g.layers; l++)
                        for (uint32_t kv = 0; kv < 2; kv++) {
                            for (size_t i = 0; i < g.slot_bytes; i++)
                                bytes[i] = rel_pattern(family, j, l, kv, i);
                            if (kvs_block_write(c, l, kv, ids[j], bytes, g.slot_bytes) != 0)
                                _exit(84);
                        }
                done = 0;
                TIMED(slot, 0, kvs_commit(c, NULL, tokens, NB * REL_BT, ids, NB, can, &done), rc);
                size_t n_dup = 0;
                for (size_t k = 0; k < NB; k++)
                    if (k >= done || can[k] != ids[k])
                        dup[n_dup++] = ids[k];
                if (rc == 0) {
                    TIMED(slot, 0, kvs_release(c, dup, n_dup, NULL), rc);
                    TIMED(slot, 0, kvs_release(c, can, done, NULL), rc);
                }
            }
        }
        if (n > 0 && n <= NB && kvs_connected(c))
            TIMED(slot, 0, kvs_release(c, got, n, NULL), rc);
        usleep(2000);
    }
    kvs_close(c);
    _exit(0);
}

/* Lets the workers run in `phase` for ms milliseconds. */
static void run(int phase, int ms)
{
    sh->phase = phase;
    usleep(1000 * ms);
}

/* Starts the daemon again on the same socket, and gives every worker time to
 * reconnect (its attempts are throttled to one per reconnect_ms; calls in
 * between answer KVS_ENOTCONN at once, as they should). */
static void restart(void)
{
    pid_t pid;
    ck_assert_int_eq(harness_start_again(&h, POOL, 20000, &pid), -1);
    h.pid = pid;
    usleep(1000 * (5 * RECONNECT_MS));
}

static void check_phase(int phase, int up)
{
    phase_counts_t t;
    memset(&t, 0, sizeof(t));
    for (int k = 0; k < WORKERS; k++) {
        const phase_counts_t *p = &sh->p[k][phase];
        for (int c = 0; c < KVS_STATUS_COUNT; c++)
            t.by_code[c] += p->by_code[c];
        t.calls += p->calls;
        t.lookups += p->lookups;
        t.hits += p->hits;
        t.blocks_while_failing += p->blocks_while_failing;
        t.corrupt += p->corrupt;
        if (p->max_ms > t.max_ms)
            t.max_ms = p->max_ms;
    }
    printf("restart: %-15s %6llu calls, %5llu lookups, %5llu hits, ok %llu, not connected %llu, "
           "timed out %llu, pool full %llu, slowest call %lld ms\n",
           phase_names[phase], (unsigned long long)t.calls, (unsigned long long)t.lookups,
           (unsigned long long)t.hits, (unsigned long long)t.by_code[0],
           (unsigned long long)t.by_code[-KVS_ENOTCONN],
           (unsigned long long)t.by_code[-KVS_ETIMEDOUT],
           (unsigned long long)t.by_code[-KVS_EPOOLFULL], (long long)t.max_ms);
    fflush(stdout);
    ck_assert_msg(t.blocks_while_failing == 0, "%s: %llu failed lookups returned blocks",
                  phase_names[phase], (unsigned long long)t.blocks_while_failing);
    ck_assert_msg(t.corrupt == 0, "%s: %llu hit blocks with another writer's bytes",
                  phase_names[phase], (unsigned long long)t.corrupt);
    ck_assert_msg(t.max_ms <= 2 * TIMEOUT_MS + 1000, "%s: a call took %lld ms (timeout %d ms)",
                  phase_names[phase], (long long)t.max_ms, TIMEOUT_MS);
    ck_assert_uint_gt(t.lookups, 20);
    if (up) {
        /* Up: hits, and nothing but OK or a full pool, save a daemon
         * starved of CPU past a call's timeout now and then (the call then
         * times out, and the next reconnects, as designed). */
        ck_assert_msg(t.hits > 0, "%s: no lookup hit", phase_names[phase]);
        uint64_t slow = t.by_code[-KVS_ETIMEDOUT] + t.by_code[-KVS_ENOTCONN];
        uint64_t other = t.calls - t.by_code[0] - t.by_code[-KVS_EPOOLFULL] - slow;
        ck_assert_msg(other == 0 && slow * 50 <= t.calls, "%s: %llu calls failed, %llu timed out",
                      phase_names[phase], (unsigned long long)other, (unsigned long long)slow);
    } else {
        ck_assert_msg(t.by_code[0] == 0 && t.hits == 0, "%s: %llu calls succeeded",
                      phase_names[phase], (unsigned long long)t.by_code[0]);
        ck_assert_uint_eq(t.by_code[-KVS_ENOTCONN] + t.by_code[-KVS_ETIMEDOUT], t.calls);
    }
}

START_TEST(test_restart_under_load)
{
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    pid_t pids[WORKERS];
    for (int k = 0; k < WORKERS; k++) {
        pids[k] = fork();
        ck_assert_int_ge(pids[k], 0);
        if (pids[k] == 0)
            worker(k);
    }

    run(UP1, 1500);
    /* A transition phase that counts for nothing (calls in flight). */
    sh->phase = PHASES;
    kill(h.pid, SIGKILL);
    waitpid(h.pid, NULL, 0);
    h.pid = 0;
    run(DOWN_KILLED, 1000);
    sh->phase = PHASES;
    restart();
    run(UP2, 2000);
    sh->phase = PHASES;
    ck_assert_int_eq(harness_stop(&h), 0);
    run(DOWN_STOPPED, 1000);
    sh->phase = PHASES;
    restart();
    run(UP3, 2000);

    sh->stop = 1;
    for (int k = 0; k < WORKERS; k++) {
        int status;
        ck_assert_int_eq(waitpid(pids[k], &status, 0), pids[k]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker %d ended with %d", k,
                      WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
        /* Connected three times: once per daemon. */
        ck_assert_uint_ge(sh->epoch[k], 3);
    }
    check_phase(UP1, 1);
    check_phase(DOWN_KILLED, 0);
    check_phase(UP2, 1);
    check_phase(DOWN_STOPPED, 0);
    check_phase(UP3, 1);

    kvs_client_t *mon = harness_client_ms(&h, "monitor", 0, 5000);
    rel_wait_quiet(mon, 1, 1, 5000, NULL);
    kvs_close(mon);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

static Suite *restart_suite(void)
{
    Suite *s = suite_create("restart");
    TCase *tc = tcase_create("restart");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_restart_under_load);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(restart_suite)
