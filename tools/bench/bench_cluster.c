/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench cluster: the cluster tier (docs/CLUSTER.md) against Redis's
 * own client, in one run, on a Redis Cluster of 3 masters it starts on
 * loopback (tests/support/redis_cluster.h).
 *
 *   writes   kvshared writes committed blocks of a shared namespace through
 *            (llama-3.1-8b, 16 tokens: 2 MiB values), as fast as the cluster
 *            acknowledges them, with at most DEPTH writes in flight per
 *            master; next to `redis-benchmark --cluster -t set` with the same
 *            value size, pipeline depth and one connection per master.
 *   fetches  a second kvshared, its pool empty, answers Lookups of those
 *            prompts (64 blocks each) from the cluster: the daemon asks for
 *            the 64 blocks at once, verifies them and places them in its
 *            pool; CONC Lookups in flight. Next to `redis-benchmark -t get`
 *            with the same depth per master (64 * CONC / 3).
 *   Both daemons' pools are touched whole before anything is timed (page
 *   faults of a fresh memfd, which a GPU pool does not have).
 *   lookups  a tier-1 Lookup's latency (a 1024-token prompt cached in the
 *            pool), p50/p99, idle and while another client writes blocks
 *            through and another fetches prompts: 5 idle and 5 busy
 *            stretches taking turns (the load paused and drained for each
 *            idle one); then again with the Redis servers niced
 *            (--redis-nice), named so.
 *
 * Figures: one per line, "name value unit".
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "kvshare.h"
#include "launch.h"
#include "redis_cluster.h"
#include "test_tmp.h"

#define BLOCKS_PER_PROMPT 64
#define BLOCK_TOKENS      16
#define MAX_CONC          8

typedef struct cl_cfg {
    const char *kvshared;
    char dir[256];
    char conf[300];
    char sock[2][320];
    pid_t pid[2];
    rc_cluster_t rc;
    unsigned conc;       /* fetch Lookups in flight */
    unsigned prompts;    /* prompts written per fetching client */
    unsigned requests;   /* redis-benchmark requests per test */
    unsigned samples;    /* Lookups timed per phase */
    unsigned busy_ms;    /* pause between two busy prompts (writes, fetches) */
    unsigned reps;       /* fetch / GET phases, taking turns */
    unsigned nice;       /* kvshared's tier_copy_nice, and redis-benchmark's nice */
    unsigned redis_nice; /* the Redis servers' nice in a second Lookup phase; 0: none */
    unsigned loop_rt;    /* kvshared's loop_rt_priority; 0: normal priority */
    uint64_t block_bytes;
} cl_cfg_t;

static void prompt_tokens(uint32_t *t, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        t[i] = x % 128000;
    }
}

static int start_daemon(cl_cfg_t *b, int i, unsigned pool_blocks)
{
    char nb[16], nice[16], rt[16];
    snprintf(nb, sizeof nb, "%u", pool_blocks);
    snprintf(nice, sizeof nice, "%u", b->nice);
    snprintf(rt, sizeof rt, "%u", b->loop_rt);
    const char *argv[] = {b->kvshared, "--socket", b->sock[i], "--backend", "host", "--model",
                          "llama-3.1-8b", "--block-tokens", "16", "--pool-blocks", nb,
                          "--cluster-seeds", b->rc.seeds,
                          /* Throughput, not faults: a deep pipeline of
                           * 2 MiB values takes seconds on a small host. */
                          "--cluster-timeout-ms", "20000", "--tier-copy-nice", nice, "--config",
                          b->conf, "--log-level", "warn",
                          /* Only when asked: a kvshared from before the setting runs too. */
                          b->loop_rt ? "--loop-rt-priority" : NULL, rt, NULL};
    b->pid[i] = launch_daemon(argv, LAUNCH_READY_MS, NULL);
    return b->pid[i] > 0 ? 0 : -1;
}

static kvs_client_t *connect_to(const char *sock)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = sock;
    o.worker_name = "bench-cluster";
    o.timeout_ms = 30000;
    return kvs_connect(&o, &c) == 0 ? c : NULL;
}

/* Touches every byte of the pool of the daemon at sock once (host backend):
 * its memfd pages are allocated at first touch, and a page fault per 4 KiB
 * would be charged to whichever phase first writes a block there, as a
 * GPU pool, allocated whole at start, never is. Returns 0 or -1. */
static int warm_pool(const char *sock)
{
    kvs_client_t *c = connect_to(sock);
    kvs_geometry_t g;
    if (!c || kvs_geometry(c, &g) != 0 || !kvs_pool_base(c)) {
        kvs_close(c);
        return -1;
    }
    if (g.backend == KVS_BACKEND_HOST)
        memset((void *)kvs_pool_base(c), 0, g.pool_bytes);
    kvs_close(c);
    return 0;
}

/* Commands of kvshared the cluster nodes ended (replies and errors), and
 * writes it sent and dropped. */
static int cluster_progress(kvs_client_t *c, uint64_t *replies, uint64_t *puts, uint64_t *drops)
{
    kvs_stats_t st;
    if (kvs_stats(c, &st) != 0)
        return -1;
    *replies = 0;
    for (size_t i = 0; i < st.n_cluster_nodes; i++)
        *replies += st.cluster_nodes[i].replies + st.cluster_nodes[i].errors;
    *puts = st.cluster_puts;
    *drops = st.cluster_put_drops;
    kvs_stats_free(&st);
    return 0;
}

/* Commits prompt seed (64 blocks) in ns and lets go of it. The bytes are
 * whatever the blocks held: throughput does not read them. */
static int commit_prompt(kvs_client_t *c, const char *ns, uint32_t seed)
{
    uint32_t tokens[BLOCKS_PER_PROMPT * BLOCK_TOKENS], ids[BLOCKS_PER_PROMPT],
        canon[BLOCKS_PER_PROMPT];
    size_t done = 0;
    prompt_tokens(tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, seed);
    if (kvs_alloc(c, ns, BLOCKS_PER_PROMPT, ids) != 0)
        return -1;
    int rc = kvs_commit(c, ns, tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, ids, BLOCKS_PER_PROMPT,
                        canon, &done);
    kvs_release(c, canon, done, NULL);
    return rc == 0 ? 0 : -1;
}

/* --- writes --- */

/* Writes the prompts of every fetching namespace through daemon 0. The
 * daemon keeps at most 64 MiB of values in flight (31 of 2 MiB); the next
 * prompt is committed once the one before is nearly all sent, so that none
 * is dropped. Returns blocks acknowledged per second, or -1. */
static double run_writes(cl_cfg_t *b, uint64_t *drops_out)
{
    kvs_client_t *c = connect_to(b->sock[0]);
    if (!c)
        return -1;
    uint64_t r0, p0, d0, r, p, d;
    if (cluster_progress(c, &r0, &p0, &d0) != 0)
        return -1;
    uint64_t t0 = now_ns(), committed = 0;
    for (unsigned ns = 0; ns < b->conc; ns++)
        for (unsigned k = 0; k < b->prompts; k++) {
            char name[16];
            snprintf(name, sizeof name, "b%u", ns);
            for (;;) {
                if (cluster_progress(c, &r, &p, &d) != 0 || now_ns() - t0 > 300000000000ull)
                    return -1;
                if (p - p0 + (d - d0) + BLOCKS_PER_PROMPT / 2 >= committed)
                    break;
                usleep(200);
            }
            if (commit_prompt(c, name, 1000 * ns + k) != 0) {
                fprintf(stderr, "bench cluster: commit: %s\n", kvs_last_error(c));
                return -1;
            }
            committed += BLOCKS_PER_PROMPT;
        }
    do {
        if (cluster_progress(c, &r, &p, &d) != 0 || now_ns() - t0 > 300000000000ull)
            return -1;
        usleep(200);
    } while (p - p0 + (d - d0) < committed || r - r0 < p - p0);
    double s = (double)(now_ns() - t0) / 1e9;
    *drops_out = d - d0;
    kvs_close(c);
    return (double)(p - p0) / s;
}

/* --- fetches --- */

typedef struct fetcher {
    cl_cfg_t *b;
    unsigned ns;
    int sock;
    _Atomic int *stop;
    _Atomic int *paused; /* NULL, or while set: no new prompt */
    uint64_t rounds, blocks, short_rounds, errors;
    double busy_s;
    unsigned max_rounds;
    unsigned pause_ms;
} fetcher_t;

/* Looks up its prompts one after the other (each fetched from the cluster
 * into the pool), clearing its namespace after each, until stopped or
 * max_rounds. */
static void *fetch_loop(void *arg)
{
    fetcher_t *f = arg;
    kvs_client_t *c = connect_to(f->b->sock[f->sock]);
    if (!c) {
        f->errors++;
        return NULL;
    }
    char name[16];
    snprintf(name, sizeof name, "b%u", f->ns);
    uint32_t tokens[BLOCKS_PER_PROMPT * BLOCK_TOKENS], ids[BLOCKS_PER_PROMPT];
    uint64_t t0 = now_ns();
    for (unsigned k = 0; !atomic_load(f->stop) && (!f->max_rounds || f->rounds < f->max_rounds);
         k++) {
        size_t n = 0;
        if (f->paused && atomic_load(f->paused)) {
            usleep(1000);
            continue;
        }
        prompt_tokens(tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, 1000 * f->ns + k % f->b->prompts);
        if (kvs_lookup(c, name, tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, 0, ids, BLOCKS_PER_PROMPT,
                       &n) != 0) {
            f->errors++;
            break;
        }
        f->rounds++;
        f->blocks += n;
        if (n < BLOCKS_PER_PROMPT)
            f->short_rounds++;
        if (kvs_clear(c, name, NULL, NULL) != 0) {
            f->errors++;
            break;
        }
        if (f->pause_ms)
            usleep(f->pause_ms * 1000);
    }
    f->busy_s = (double)(now_ns() - t0) / 1e9;
    kvs_close(c);
    return NULL;
}

/* CPU seconds the reaped children used so far. */
static double children_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* conc fetchers on daemon 1, rounds each. Returns blocks per second;
 * *cpu_us: the daemon's CPU time per block fetched (all its threads). */
static double run_fetches(cl_cfg_t *b, unsigned rounds, uint64_t *short_rounds, double *cpu_us)
{
    pthread_t th[MAX_CONC];
    fetcher_t f[MAX_CONC];
    _Atomic int stop = 0;
    double cpu0 = bench_process_cpu_seconds(b->pid[1]);
    uint64_t t0 = now_ns();
    for (unsigned i = 0; i < b->conc; i++) {
        f[i] = (fetcher_t){.b = b, .ns = i, .sock = 1, .stop = &stop, .max_rounds = rounds};
        pthread_create(&th[i], NULL, fetch_loop, &f[i]);
    }
    uint64_t blocks = 0, errors = 0;
    *short_rounds = 0;
    for (unsigned i = 0; i < b->conc; i++) {
        pthread_join(th[i], NULL);
        blocks += f[i].blocks;
        errors += f[i].errors;
        *short_rounds += f[i].short_rounds;
    }
    double s = (double)(now_ns() - t0) / 1e9;
    *cpu_us = blocks ? (bench_process_cpu_seconds(b->pid[1]) - cpu0) * 1e6 / (double)blocks : 0;
    return errors ? -1 : (double)blocks / s;
}

/* --- redis-benchmark --- */

/* Runs redis-benchmark on the cluster; returns requests per second of test
 * ("SET" or "GET"), or -1. */
static double redis_bench(cl_cfg_t *b, const char *test, unsigned depth, unsigned requests,
                          unsigned keys, unsigned nice, double *cpu_us)
{
    double cpu0 = children_cpu_s();
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "nice -n %u redis-benchmark -h 127.0.0.1 -p %d --cluster -t %s -d %llu -P %u -c 3 "
             "-n %u -r %u --csv -q 2>/dev/null",
             nice, b->rc.port[0], test, (unsigned long long)b->block_bytes, depth, requests, keys);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    char line[512];
    double rps = -1;
    while (fgets(line, sizeof line, p)) {
        /* "GET","123.45",... */
        char name[32];
        double v;
        if (sscanf(line, "\"%31[^\"]\",\"%lf\"", name, &v) == 2 && strcmp(name, test) == 0)
            rps = v;
    }
    pclose(p);
    /* redis-benchmark's CPU time (and the shell's and nice's, which are
     * nothing) per request: popen's shell reaped it before pclose returned. */
    *cpu_us = (children_cpu_s() - cpu0) * 1e6 / requests;
    return rps;
}

/* --- tier-1 Lookups while the tier is busy --- */

typedef struct writer {
    cl_cfg_t *b;
    _Atomic int *stop;
    _Atomic int *paused; /* while set: no new prompt */
    uint64_t prompts;
} writer_t;

static void *write_loop(void *arg)
{
    writer_t *w = arg;
    kvs_client_t *c = connect_to(w->b->sock[1]);
    if (!c)
        return NULL;
    for (uint32_t k = 0; !atomic_load(w->stop); k++) {
        if (atomic_load(w->paused)) {
            usleep(1000);
            continue;
        }
        if (commit_prompt(c, "busy", 900000 + k) != 0)
            break;
        w->prompts++;
        usleep(w->b->busy_ms * 1000);
    }
    kvs_close(c);
    return NULL;
}

/* Times n Lookups of a cached prompt into lat (nanoseconds). */
static int time_lookups(kvs_client_t *c, uint64_t *lat, unsigned n_samples)
{
    uint32_t tokens[BLOCKS_PER_PROMPT * BLOCK_TOKENS], ids[BLOCKS_PER_PROMPT];
    prompt_tokens(tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, 424242);
    for (unsigned i = 0; i < n_samples; i++) {
        size_t n = 0;
        uint64_t t0 = now_ns();
        if (kvs_lookup(c, "hot", tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, 0, ids,
                       BLOCKS_PER_PROMPT, &n) != 0 ||
            n != BLOCKS_PER_PROMPT) {
            fprintf(stderr, "bench cluster: tier-1 Lookup: %zu blocks (%s)\n", n,
                    kvs_last_error(c));
            return -1;
        }
        lat[i] = now_ns() - t0;
        usleep(500); /* a request now and then, as a worker's */
    }
    return 0;
}

/* Waits until kvshared's cluster commands stop moving for 100 ms (at most
 * 5 s): the writes and fetches of a busy stretch have drained. */
static void wait_quiet(kvs_client_t *c)
{
    uint64_t r0 = 0, p = 0, d = 0, r = 0;
    cluster_progress(c, &r0, &p, &d);
    for (int i = 0; i < 50; i++) {
        usleep(100000);
        if (cluster_progress(c, &r, &p, &d) != 0 || r == r0)
            return;
        r0 = r;
    }
}

/* A thread's time on a CPU and waiting for one, in ns
 * (/proc/PID/task/TID/schedstat; zeros when unreadable). */
static void thread_sched(pid_t pid, pid_t tid, uint64_t *run, uint64_t *wait)
{
    char path[64];
    unsigned long long r = 0, w = 0;
    snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)pid, (int)tid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%llu %llu", &r, &w) != 2)
            r = w = 0;
        fclose(f);
    }
    *run = r;
    *wait = w;
}

/* Times tier-1 Lookups idle, then busy; the figures' names end with tag. */
static int run_lookups(cl_cfg_t *b, const char *tag)
{
    kvs_client_t *c = connect_to(b->sock[1]);
    if (!c || commit_prompt(c, "hot", 424242) != 0)
        return -1;
    /* Held by a pin for the run: the busy writer's allocations evict, and
     * what is measured is a tier-1 hit. */
    uint32_t tokens[BLOCKS_PER_PROMPT * BLOCK_TOKENS], ids[BLOCKS_PER_PROMPT];
    size_t n = 0;
    prompt_tokens(tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, 424242);
    if (kvs_lookup(c, "hot", tokens, BLOCKS_PER_PROMPT * BLOCK_TOKENS, 1, ids, BLOCKS_PER_PROMPT,
                   &n) != 0 ||
        n != BLOCKS_PER_PROMPT)
        return -1;
    /* Idle and busy stretches take turns (LOOKUP_TURNS of each), so that
     * the machine's other load falls on both alike: the busy load pauses
     * (and drains) for each idle stretch. */
    enum { LOOKUP_TURNS = 5 };
    unsigned per = b->samples / LOOKUP_TURNS;
    uint64_t *idle = malloc(per * LOOKUP_TURNS * sizeof(*idle));
    uint64_t *busy = malloc(per * LOOKUP_TURNS * sizeof(*busy));
    _Atomic int stop = 0, paused = 1;
    pthread_t wt, ft;
    writer_t w = {.b = b, .stop = &stop, .paused = &paused};
    fetcher_t f = {
        .b = b, .ns = 0, .sock = 1, .stop = &stop, .paused = &paused, .pause_ms = b->busy_ms};
    if (!idle || !busy) {
        free(idle);
        free(busy);
        return -1;
    }
    pthread_create(&wt, NULL, write_loop, &w);
    pthread_create(&ft, NULL, fetch_loop, &f);
    uint64_t r0 = 0, p0 = 0, d0 = 0, r1 = 0, p1 = 0, d1 = 0, busy_ns = 0, puts = 0, drops = 0,
             replies = 0;
    int rc = 0;
    /* The daemon's loop thread (its main thread): time on a CPU and
     * waiting for one, over the idle and the busy stretches. */
    uint64_t lr[2] = {0, 0}, lw[2] = {0, 0}, idle_ns = 0;
    for (unsigned t = 0; t < LOOKUP_TURNS && rc == 0; t++) {
        uint64_t ra, wa, rz, wz;
        atomic_store(&paused, 1);
        wait_quiet(c);
        thread_sched(b->pid[1], b->pid[1], &ra, &wa);
        uint64_t ti = now_ns();
        rc = time_lookups(c, idle + t * per, per);
        idle_ns += now_ns() - ti;
        thread_sched(b->pid[1], b->pid[1], &rz, &wz);
        lr[0] += rz - ra;
        lw[0] += wz - wa;
        atomic_store(&paused, 0);
        usleep(300000);
        cluster_progress(c, &r0, &p0, &d0);
        thread_sched(b->pid[1], b->pid[1], &ra, &wa);
        uint64_t t0 = now_ns();
        if (rc == 0)
            rc = time_lookups(c, busy + t * per, per);
        busy_ns += now_ns() - t0;
        thread_sched(b->pid[1], b->pid[1], &rz, &wz);
        lr[1] += rz - ra;
        lw[1] += wz - wa;
        cluster_progress(c, &r1, &p1, &d1);
        replies += r1 - r0;
        puts += p1 - p0;
        drops += d1 - d0;
    }
    double s = (double)busy_ns / 1e9;
    uint64_t fetched0 = f.blocks;
    atomic_store(&stop, 1);
    pthread_join(wt, NULL);
    pthread_join(ft, NULL);
    kvs_close(c);
    double idle50 = bench_quantile(idle, per * LOOKUP_TURNS, 0.50) / 1000.0;
    double idle99 = bench_quantile(idle, per * LOOKUP_TURNS, 0.99) / 1000.0;
    double busy50 = bench_quantile(busy, per * LOOKUP_TURNS, 0.50) / 1000.0;
    double busy99 = bench_quantile(busy, per * LOOKUP_TURNS, 0.99) / 1000.0;
    free(idle);
    free(busy);
    if (rc != 0)
        return -1;
    printf("lookup_idle_p50%s %.1f us\n", tag, idle50);
    printf("lookup_idle_p99%s %.1f us\n", tag, idle99);
    printf("lookup_busy_p50%s %.1f us\n", tag, busy50);
    printf("lookup_busy_p99%s %.1f us\n", tag, busy99);
    printf("lookup_busy_p99_vs_idle%s %.2f x\n", tag, busy99 / idle99);
    printf("loop_thread%s idle: on a CPU %.1f %%, waiting for one %.2f %%; busy: on a CPU "
           "%.1f %%, waiting for one %.2f %%\n",
           tag, 100.0 * (double)lr[0] / (double)idle_ns, 100.0 * (double)lw[0] / (double)idle_ns,
           100.0 * (double)lr[1] / (double)busy_ns, 100.0 * (double)lw[1] / (double)busy_ns);
    printf("busy_cluster_replies%s %.0f per s\n", tag, (double)replies / s);
    printf("busy_cluster_puts%s %.0f blocks per s (%llu dropped)\n", tag, (double)puts / s,
           (unsigned long long)drops);
    printf("busy_fetched_blocks%s %llu (%llu rounds, %.0f MiB/s)\n", tag,
           (unsigned long long)fetched0, (unsigned long long)f.rounds, (double)fetched0 * 2.0 / s);
    fflush(stdout);
    return 0;
}

/* The median of n figures (sorts them). */
static double median(double *v, unsigned n)
{
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvshare-bench cluster [--conc N] [--prompts N] [--requests N] [--samples N]\n"
            "                             [--busy-ms MS] [--reps N] [--nice N] [--redis-nice N]\n"
            "                             [--loop-rt N] [--kvshared PATH]\n"
            "  --conc N      fetch Lookups in flight (default 2; at most %d)\n"
            "  --prompts N   64-block prompts written per fetching namespace (default 2)\n"
            "  --requests N  redis-benchmark SET requests (default 400; GET: as many as a\n"
            "                fetch phase fetches blocks)\n"
            "  --reps N      fetch and GET phases, taking turns (default 3; at most 16)\n"
            "  --nice N      kvshared's tier_copy_nice, and redis-benchmark's nice to match\n"
            "                (default 10); figures at nice 0 are printed too\n"
            "  --redis-nice N  after the Lookup phase, the Redis servers (standing for other\n"
            "                hosts) niced N and the phase again (default 10; 0: not)\n"
            "  --loop-rt N   kvshared's loop_rt_priority (default 0: normal priority)\n"
            "  --samples N   tier-1 Lookups timed per phase (default 2000)\n"
            "  --busy-ms MS  while timing them busy: a 64-block prompt written through, and\n"
            "                one fetched, every MS ms (default 500)\n"
            "Starts its own Redis Cluster (redis-server, redis-cli, redis-benchmark).\n",
            MAX_CONC);
}

static void stop_all(cl_cfg_t *b)
{
    for (int i = 0; i < 2; i++)
        if (b->pid[i] > 0)
            launch_stop(b->pid[i], SIGTERM, 30000);
    rc_stop(&b->rc);
    unlink(b->conf);
    for (int i = 0; i < 2; i++)
        unlink(b->sock[i]);
    rmdir(b->dir);
}

int bench_cluster(int argc, char **argv)
{
    cl_cfg_t b = {.conc = 2,
                  .prompts = 2,
                  .requests = 400,
                  .samples = 2000,
                  .busy_ms = 500,
                  .reps = 3,
                  .nice = 10,
                  .redis_nice = 10};
    char kvshared[512];
    b.kvshared = bench_default_kvshared(kvshared, sizeof kvshared);
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--conc") == 0 && v) {
            b.conc = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--prompts") == 0 && v) {
            b.prompts = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--requests") == 0 && v) {
            b.requests = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--samples") == 0 && v) {
            b.samples = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--busy-ms") == 0 && v) {
            b.busy_ms = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--reps") == 0 && v) {
            b.reps = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--redis-nice") == 0 && v) {
            b.redis_nice = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--loop-rt") == 0 && v) {
            b.loop_rt = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--nice") == 0 && v) {
            b.nice = (unsigned)atoi(v);
            i++;
        } else if (strcmp(argv[i], "--kvshared") == 0 && v) {
            b.kvshared = v;
            i++;
        } else {
            usage(strcmp(argv[i], "--help") == 0 ? stdout : stderr);
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (b.conc == 0 || b.conc > MAX_CONC || b.prompts == 0 || b.samples < 100 || b.reps == 0 ||
        b.reps > 16 || b.nice > 19 || b.redis_nice > 19 || b.loop_rt > 99) {
        usage(stderr);
        return 2;
    }
    if (system("redis-benchmark --version >/dev/null 2>&1") != 0) {
        printf("skipped: redis-benchmark is not installed (tools/install-deps.sh)\n");
        return 77;
    }
    b.block_bytes = 2ull << 20; /* llama-3.1-8b, 16 tokens, bf16 */
    if (test_tmp_dir("kvs-bench-cluster", b.dir, sizeof b.dir) != 0)
        return 1;
    snprintf(b.conf, sizeof b.conf, "%s/kvshared.conf", b.dir);
    for (int i = 0; i < 2; i++)
        snprintf(b.sock[i], sizeof b.sock[i], "%s/k%d.sock", b.dir, i);
    FILE *cf = fopen(b.conf, "w");
    if (!cf)
        return 1;
    fprintf(cf, "clear_uids = %u\n[namespace busy]\nshared = yes\n[namespace hot]\n",
            (unsigned)getuid());
    for (unsigned i = 0; i < b.conc; i++)
        fprintf(cf, "[namespace b%u]\nshared = yes\n", i);
    fclose(cf);
    if (rc_start(&b.rc, 3, 0, NULL) != 0) {
        fprintf(stderr, "bench cluster: cannot start a Redis Cluster\n");
        stop_all(&b);
        return 1;
    }
    /* Room for each fetching namespace's prompt, the hot and the busy
     * prompts, and the blocks pinned while their writes wait. */
    unsigned pool = BLOCKS_PER_PROMPT * (b.conc + 3) + 256;
    if (start_daemon(&b, 0, pool) != 0 || start_daemon(&b, 1, pool) != 0 ||
        warm_pool(b.sock[0]) != 0 || warm_pool(b.sock[1]) != 0) {
        fprintf(stderr, "bench cluster: cannot start kvshared (%s)\n", b.kvshared);
        stop_all(&b);
        return 1;
    }
    /* Pipeline depths per master as kvshared runs them: a fetch's 64 GETs
     * per Lookup in flight, spread over the 3 masters; writes, at most
     * 64 MiB of values in flight (kvshared's bound). */
    unsigned depth = (BLOCKS_PER_PROMPT * b.conc + 2) / 3;
    unsigned wdepth = (unsigned)((64ull << 20) / (b.block_bytes + 4096) + 2) / 3;
    printf("value_bytes %llu B\n", (unsigned long long)b.block_bytes);
    printf("get_depth_per_master %u commands\n", depth);
    printf("set_depth_per_master %u commands\n", wdepth);

    uint64_t drops = 0;
    double w = run_writes(&b, &drops);
    /* A key space the SETs cover whole, so that no GET finds nothing. */
    unsigned keys = b.requests / 8 ? b.requests / 8 : 1;
    double cpu_set = 0;
    double set = redis_bench(&b, "SET", wdepth, b.requests, keys, b.nice, &cpu_set);
    double set0 = b.nice ? redis_bench(&b, "SET", wdepth, b.requests, keys, 0, &cpu_set) : set;
    int rc = 0;
    if (w < 0 || set < 0 || set0 < 0) {
        fprintf(stderr, "bench cluster: a write phase failed (writes %.0f, SET %.0f / %.0f)\n", w,
                set, set0);
        stop_all(&b);
        return 1;
    }
    double mib = (double)b.block_bytes / (1 << 20);
    printf("redis_benchmark_nice %u (as kvshared's cluster thread: tier_copy_nice %u; "
           "the _nice0 figures: redis-benchmark at nice 0)\n",
           b.nice, b.nice);
    printf("kvshared_loop_rt_priority %u%s\n", b.loop_rt,
           b.loop_rt ? " (its loop thread under SCHED_RR)" : " (normal priority)");
    printf("kvshared_writes %.0f blocks per s (%.0f MiB/s, %llu dropped)\n", w, w * mib,
           (unsigned long long)drops);
    printf("redis_benchmark_set %.0f per s (%.0f MiB/s)\n", set, set * mib);
    printf("redis_benchmark_set_nice0 %.0f per s (%.0f MiB/s)\n", set0, set0 * mib);
    printf("writes_vs_set %.2f x\n", w / set);
    printf("writes_vs_set_nice0 %.2f x\n", w / set0);
    fflush(stdout);
    /* Fetches and GETs take turns, reps times, the order swapped every
     * other time, each GET phase as many requests as a fetch phase fetches
     * blocks: the machine's other load moves between phases. */
    unsigned rounds = 4 * b.prompts;
    unsigned gets = rounds * b.conc * BLOCKS_PER_PROMPT;
    double ratio[16], ratio0[16];
    /* One fetch phase first, not counted: the daemon's own mapping of the
     * pool faults in each page the first time it writes there (the pages
     * exist; its page tables do not), once per process. */
    uint64_t warm_short = 0;
    double warm_cpu = 0, warm = run_fetches(&b, rounds, &warm_short, &warm_cpu);
    printf("warmup_fetches %.0f blocks per s, %.0f us of CPU per block (not counted: the "
           "daemon maps each pool page at its first write)\n",
           warm, warm_cpu);
    for (unsigned r = 0; r < b.reps && rc == 0; r++) {
        uint64_t short_rounds = 0;
        double f = -1, get = -1, get0 = -1, cpu_f = 0, cpu_get = 0, cpu_get0 = 0;
        if (r % 2 == 0)
            f = run_fetches(&b, rounds, &short_rounds, &cpu_f);
        get = redis_bench(&b, "GET", depth, gets, keys, b.nice, &cpu_get);
        get0 = b.nice ? redis_bench(&b, "GET", depth, gets, keys, 0, &cpu_get0) : get;
        if (r % 2 == 1)
            f = run_fetches(&b, rounds, &short_rounds, &cpu_f);
        if (f < 0 || get < 0 || get0 < 0) {
            fprintf(stderr, "bench cluster: a fetch phase failed (fetches %.0f, GET %.0f / %.0f)\n",
                    f, get, get0);
            rc = 1;
            break;
        }
        ratio[r] = f / get;
        ratio0[r] = f / get0;
        printf("rep %u: kvshared_fetches %.0f blocks per s (%.0f MiB/s, %llu short Lookups), "
               "redis_benchmark_get %.0f per s, nice0 %.0f per s: %.2f x, nice0 %.2f x\n",
               r + 1, f, f * mib, (unsigned long long)short_rounds, get, get0, ratio[r], ratio0[r]);
        printf("rep %u: cpu per block: kvshared (the whole daemon) %.0f us, redis-benchmark "
               "%.0f us per GET (nice0 %.0f us)\n",
               r + 1, cpu_f, cpu_get, b.nice ? cpu_get0 : cpu_get);
        fflush(stdout);
    }
    if (rc == 0) {
        printf("fetches_vs_get %.2f x (median of %u)\n", median(ratio, b.reps), b.reps);
        printf("fetches_vs_get_nice0 %.2f x (median of %u)\n", median(ratio0, b.reps), b.reps);
        fflush(stdout);
        /* First with every process at its own priority; then with the
         * Redis servers, which stand for servers on other hosts, niced
         * below the daemon's loop thread (said so in the figures' names). */
        if (run_lookups(&b, "") != 0) {
            fprintf(stderr, "bench cluster: the Lookup latency phase failed\n");
            rc = 1;
        } else if (b.redis_nice) {
            char tag[32];
            snprintf(tag, sizeof tag, "_redis_nice%u", b.redis_nice);
            printf("redis_servers_niced %u (they stand for other hosts; the figures above: "
                   "not niced)\n",
                   b.redis_nice);
            if (rc_renice(&b.rc, (int)b.redis_nice) != 0 || run_lookups(&b, tag) != 0) {
                fprintf(stderr, "bench cluster: the Lookup latency phase (Redis niced) failed\n");
                rc = 1;
            }
        }
    }
    stop_all(&b);
    return rc;
}
