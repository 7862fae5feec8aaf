/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Soak: worker processes doing random lookup / alloc / write / commit /
 * release against a real kvshared while the test SIGKILLs one of them every
 * few tens of milliseconds and starts another. KVS_SOAK_SECONDS sets the
 * length (default 60) as a number of kills, one per 110 ms on average:
 * about that many seconds on an idle machine, longer on a loaded one. Run
 * the binary itself for long soaks; ctest's timeout is 30 minutes.
 *
 * Checked:
 *   - during the run: Stats accounting (free + writing + cached == pool,
 *     pinned <= cached) every half second;
 *   - every block a lookup returns holds the bytes its writer put there (a
 *     block reused while pinned would show);
 *   - replies: OK, or KVS_EPOOLFULL when pins and writes fill the pool;
 *     any other status fails the test (counted by code);
 *   - after the run, with every worker dead: nothing WRITING or pinned,
 *     sessions back to the monitor alone, the whole pool allocatable; the
 *     daemon's descriptors as after warm-up, exactly, and its anonymous
 *     memory (RssAnon) as after warm-up within a small margin.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "harness_client.h"
#include "rel_util.h"

#define POOL       128
#define WORKERS    6
#define FAMILIES   48
#define MAX_BLOCKS 12
#define MAX_HOLDS  3

/* A worker's counts, in shared memory, written while the test SIGKILLs it.
 * A call is counted by exactly one increment of one field (the slot of its
 * status): a kill lands before or after that store, never between two
 * halves of the same call's accounting, so the totals always agree with
 * themselves. (The number of calls is the sum of the slots, never a field
 * of its own.) */
typedef struct worker_counts {
    uint64_t by_code[KVS_STATUS_COUNT]; /* replies by status, -code */
    uint64_t outside_table;             /* any other return value */
    uint64_t hits, hit_blocks, misses, corrupt, reconnects;
} worker_counts_t;

typedef struct shared {
    worker_counts_t w[WORKERS];
} shared_t;

static harness_t h;
static shared_t *sh;

static void count(worker_counts_t *wc, int rc)
{
    uint64_t *slot = rc <= 0 && rc > -KVS_STATUS_COUNT ? &wc->by_code[-rc] : &wc->outside_table;
    __atomic_fetch_add(slot, 1, __ATOMIC_RELAXED);
}

static uint64_t calls_of(const worker_counts_t *wc)
{
    uint64_t n = wc->outside_table;
    for (int c = 0; c < KVS_STATUS_COUNT; c++)
        n += wc->by_code[c];
    return n;
}

typedef struct hold {
    uint32_t ids[MAX_BLOCKS];
    size_t n;
} hold_t;

static void __attribute__((noreturn)) worker(int slot, uint32_t seed)
{
    worker_counts_t *wc = &sh->w[slot];
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_geometry_t g;
    hold_t holds[MAX_HOLDS];
    size_t n_holds = 0;
    uint32_t tokens[MAX_BLOCKS * REL_BT + REL_BT], got[MAX_BLOCKS], ids[MAX_BLOCKS],
        can[MAX_BLOCKS], dup[MAX_BLOCKS];
    uint8_t bytes[256];

    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = 10000;
    o.worker_name = "soak";
    srand(seed);
    int rc = kvs_connect(&o, &c);
    count(wc, rc);
    if (rc != 0 || kvs_geometry(c, &g) != 0 || g.slot_bytes > sizeof(bytes))
        _exit(70);
    for (;;) {
        uint32_t family = (uint32_t)rand() % FAMILIES;
        size_t nb = 1 + (size_t)rand() % MAX_BLOCKS, n = 0, done = 0;
        size_t n_tokens = nb * REL_BT + (size_t)rand() % REL_BT;
        rel_prompt(tokens, n_tokens, family);

        rc = kvs_lookup(c, NULL, tokens, n_tokens, 1, got, MAX_BLOCKS, &n);
        count(wc, rc);
        if (rc == 0 && n > 0) {
            wc->hits++;
            wc->hit_blocks += n;
            /* The bytes of the hit blocks are the writer's. */
            for (size_t j = 0; j < n; j++) {
                uint32_t l = (uint32_t)rand() % g.layers, kv = (uint32_t)rand() % 2;
                if (kvs_block_read(c, l, kv, got[j], bytes, g.slot_bytes) != 0)
                    _exit(71);
                for (size_t i = 0; i < g.slot_bytes; i++)
                    if (bytes[i] != rel_pattern(family, j, l, kv, i)) {
                        wc->corrupt++;
                        break;
                    }
            }
        } else if (rc == 0) {
            wc->misses++;
        }
        if (rc == 0 && n > 0) {
            if (n_holds == MAX_HOLDS) {
                rc = kvs_release(c, holds[0].ids, holds[0].n, NULL);
                count(wc, rc);
                memmove(holds, holds + 1, (MAX_HOLDS - 1) * sizeof(hold_t));
                n_holds--;
            }
            memcpy(holds[n_holds].ids, got, n * sizeof(uint32_t));
            holds[n_holds++].n = n;
        }

        if (rc == 0 && n < nb) {
            rc = kvs_alloc(c, NULL, (uint32_t)nb, ids);
            count(wc, rc);
            if (rc == 0) {
                for (size_t j = 0; j < nb; j++)
                    for (uint32_t l = 0; l < g.layers; l++)
                        for (uint32_t kv = 0; kv < 2; kv++) {
                            for (size_t i = 0; i < g.slot_bytes; i++)
                                bytes[i] = rel_pattern(family, j, l, kv, i);
                            if (kvs_block_write(c, l, kv, ids[j], bytes, g.slot_bytes) != 0)
                                _exit(72);
                        }
                rc = kvs_commit(c, NULL, tokens, n_tokens, ids, nb, can, &done);
                count(wc, rc);
                size_t n_dup = 0;
                for (size_t k = 0; k < done; k++)
                    if (can[k] != ids[k])
                        dup[n_dup++] = ids[k];
                for (size_t k = done; k < nb; k++)
                    dup[n_dup++] = ids[k];
                /* Duplicates stay WRITING until released. */
                if (n_dup) {
                    rc = kvs_release(c, dup, n_dup, NULL);
                    count(wc, rc);
                }
                if (done) {
                    rc = kvs_release(c, can, done, NULL);
                    count(wc, rc);
                }
            }
        }
        if (rand() % 40 == 0 && n_holds > 0) {
            rc = kvs_release(c, holds[0].ids, holds[0].n, NULL);
            count(wc, rc);
            memmove(holds, holds + 1, (n_holds - 1) * sizeof(hold_t));
            n_holds--;
        }
        if (rand() % 200 == 0) {
            /* Leave with everything held, and come back. */
            kvs_close(c);
            n_holds = 0;
            rc = kvs_connect(&o, &c);
            count(wc, rc);
            wc->reconnects++;
            if (rc != 0)
                _exit(73);
        }
        if (rand() % 100 == 0) {
            kvs_stats_t s;
            rc = kvs_stats(c, &s);
            count(wc, rc);
            kvs_stats_free(&s);
        }
    }
}

static pid_t spawn(int slot, uint32_t seed)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        worker(slot, seed);
    return pid;
}

/* SIGKILLs a worker; it must still have been running (not exited on an
 * error of its own). */
static void kill_worker(pid_t pid)
{
    int status;
    kill(pid, SIGKILL);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "a soak worker exited by itself with %d",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Runs workers through n_kills kills, one at random every 20-200 ms (110 ms
 * on average) with another started in its place, then kills them all. The
 * phase is a number of kills, not a time: on a loaded machine each step
 * (the sleep, the kill, the wait, the fork) takes longer, and a phase cut
 * by the clock then did too few kills to mean anything (the kill count
 * check failed under load). The clock still paces the kills. */
static uint64_t run_phase(uint64_t n_kills, uint32_t *seed, kvs_client_t *mon)
{
    pid_t pids[WORKERS];
    uint64_t kills = 0;
    for (int k = 0; k < WORKERS; k++)
        pids[k] = spawn(k, ++*seed);
    int64_t next_check = now_ms() + 500;
    while (kills < n_kills) {
        usleep(1000 * (20 + rnd(180)));
        int k = (int)rnd(WORKERS);
        kill_worker(pids[k]);
        kills++;
        pids[k] = spawn(k, ++*seed);
        if (now_ms() >= next_check) {
            kvs_stats_t s;
            rel_stats(mon, &s);
            kvs_stats_free(&s);
            next_check = now_ms() + 500;
        }
    }
    for (int k = 0; k < WORKERS; k++) {
        kill_worker(pids[k]);
        kills++;
    }
    return kills;
}

START_TEST(test_soak)
{
    const char *env = getenv("KVS_SOAK_SECONDS");
    int seconds = env ? atoi(env) : 60;
    if (seconds < 5)
        seconds = 5;
    /* About `seconds` on an idle machine: a kill every 110 ms on average. */
    uint64_t n_kills = (uint64_t)seconds * 1000 / 110, warm_kills = n_kills / 6;
    uint32_t seed = 1;

    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    kvs_client_t *mon = harness_client_ms(&h, "monitor", 0, 10000);

    /* Warm-up: the index, the session tables and malloc reach their size. */
    uint64_t kills = run_phase(warm_kills, &seed, mon);
    kvs_stats_t s;
    rel_wait_quiet(mon, 1, 1, 10000, &s);
    long rss_warm = rel_rss_anon_kib(h.pid);
    int fds_warm = rel_fd_count(h.pid);
    uint64_t index_warm = s.index_bytes, requests_warm = s.requests;
    kvs_stats_free(&s);

    uint64_t t_run = (uint64_t)now_ms();
    kills += run_phase(n_kills - warm_kills, &seed, mon);
    double run_s = (double)((uint64_t)now_ms() - t_run) / 1e3;
    rel_wait_quiet(mon, 1, 1, 10000, &s);
    long rss_end = rel_rss_anon_kib(h.pid);
    int fds_end = rel_fd_count(h.pid);

    worker_counts_t t;
    memset(&t, 0, sizeof(t));
    for (int k = 0; k < WORKERS; k++) {
        const worker_counts_t *w = &sh->w[k];
        t.outside_table += w->outside_table;
        t.hits += w->hits;
        t.hit_blocks += w->hit_blocks;
        t.misses += w->misses;
        t.corrupt += w->corrupt;
        t.reconnects += w->reconnects;
        for (int c = 0; c < KVS_STATUS_COUNT; c++)
            t.by_code[c] += w->by_code[c];
    }
    printf("soak: %d s asked, %.1f s after warm-up, %d workers, %llu kills, %llu calls (%llu "
           "requests after warm-up), "
           "%llu lookups hit (%llu blocks), %llu missed, %llu reconnects\n",
           seconds, run_s, WORKERS, (unsigned long long)kills, (unsigned long long)calls_of(&t),
           (unsigned long long)(s.requests - requests_warm), (unsigned long long)t.hits,
           (unsigned long long)t.hit_blocks, (unsigned long long)t.misses,
           (unsigned long long)t.reconnects);
    printf("soak: statuses:");
    for (int c = 0; c < KVS_STATUS_COUNT; c++)
        if (t.by_code[c])
            printf(" %s %llu", c ? kvs_strerror(-c) : "ok", (unsigned long long)t.by_code[c]);
    if (t.outside_table)
        printf(" outside the status table %llu", (unsigned long long)t.outside_table);
    printf("\nsoak: evictions %llu, alloc failures %llu; daemon RssAnon %ld KiB after warm-up, "
           "%ld KiB at the end; fds %d / %d; index %llu / %llu bytes\n",
           (unsigned long long)s.evictions, (unsigned long long)s.alloc_failures, rss_warm, rss_end,
           fds_warm, fds_end, (unsigned long long)index_warm, (unsigned long long)s.index_bytes);
    fflush(stdout);

    uint64_t unexpected = calls_of(&t) - t.by_code[0] - t.by_code[-KVS_EPOOLFULL];
    ck_assert_msg(unexpected == 0, "%llu replies with a status other than OK or EPOOLFULL",
                  (unsigned long long)unexpected);
    ck_assert_msg(t.corrupt == 0, "%llu hit blocks did not hold their writer's bytes",
                  (unsigned long long)t.corrupt);
    /* The run did what it is for. */
    ck_assert_uint_gt(t.hits, 100);
    ck_assert_uint_gt(t.misses, 100);
    ck_assert_uint_gt(s.evictions, 100);
    ck_assert_int_eq(fds_end, fds_warm);
    ck_assert_msg(!REL_RSS_MEANINGFUL || rss_end - rss_warm <= 512 + rss_warm / 10,
                  "daemon RssAnon grew from %ld KiB after warm-up to %ld KiB", rss_warm, rss_end);
    kvs_stats_free(&s);

    /* Nothing leaked in the pool: it can be taken whole. */
    kvs_client_t *c = harness_client_ms(&h, "whole", 0, 10000);
    uint32_t ids[POOL];
    ck_assert_int_eq(kvs_alloc(c, NULL, POOL, ids), 0);
    ck_assert_int_eq(kvs_release(c, ids, POOL, NULL), 0);
    kvs_close(c);
    rel_wait_quiet(mon, 1, 1, 10000, NULL);
    kvs_close(mon);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const char *env = getenv("KVS_SOAK_SECONDS");
    int seconds = env ? atoi(env) : 60;
    Suite *s = suite_create("soak");
    TCase *tc = tcase_create("soak");
    /* The kills take longer on a loaded machine (run_phase). */
    tcase_set_timeout(tc, seconds * 3 + 120);
    tcase_add_test(tc, test_soak);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
