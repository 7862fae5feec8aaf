/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench breaker: what a call costs a worker with and without the
 * client's circuit breaker (KVS_BREAKER).
 *
 *   healthy  a full-hit kvs_lookup against a running kvshared, by a client
 *            without the flag and one with it, in alternating rounds of the
 *            same run: the breaker must add nothing to this path;
 *   hung     the same lookups with the daemon stopped (SIGSTOP): the first
 *            call of each client waits its timeout; after it, every call of
 *            the client without the flag waits again, the breaker's returns
 *            at once (a miss);
 *   resumed  after SIGCONT, how long until the breaker's probe brings the
 *            client up, and its next lookup hits again.
 *
 * Figures one per line, "name value unit".
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvshare.h"
#include "launch.h"
#include "now.h"
#include "socket_path.h"
#include "test_tmp.h"

#define BRK_BT     16
#define BRK_TOKENS 1024 /* the prompt: 64 blocks */

typedef struct brk_cfg {
    const char *kvshared;
    char dir[SOCKET_PATH_MAX - sizeof("/kvshared.sock")];
    char sock[SOCKET_PATH_MAX];
    pid_t pid;
    int timeout_ms;
    unsigned calls, rounds, hung_plain;
} brk_cfg_t;

static int start_daemon(brk_cfg_t *b)
{
    const char *argv[] = {b->kvshared, "--socket",       b->sock, "--backend",
                          "host",      "--layers",       "1",     "--kv-heads",
                          "1",         "--head-dim",     "8",     "--dtype",
                          "fp16",      "--block-tokens", "16",    "--pool-blocks",
                          "1024",      "--log-level",    "warn",  NULL};
    b->pid = launch_daemon(argv, LAUNCH_READY_MS, NULL);
    return b->pid < 0 ? -1 : 0;
}

static kvs_client_t *brk_connect(const brk_cfg_t *b, unsigned flags)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.timeout_ms = b->timeout_ms;
    o.worker_name = "bench-breaker";
    o.flags = KVS_NO_MAP | flags;
    int rc = kvs_connect(&o, &c);
    if (rc != 0) {
        fprintf(stderr, "bench breaker: connect: %s\n", kvs_strerror(rc));
        return NULL;
    }
    return c;
}

/* n lookups of the prompt; each one's nanoseconds into ns[0 .. n). Returns
 * the blocks the last one found. */
static size_t timed_lookups(kvs_client_t *c, const uint32_t *tokens, unsigned n, uint64_t *ns)
{
    uint32_t ids[BRK_TOKENS / BRK_BT];
    size_t got = 0;
    for (unsigned i = 0; i < n; i++) {
        int64_t t0 = now_ns();
        (void)kvs_lookup(c, NULL, tokens, BRK_TOKENS, 0, ids, BRK_TOKENS / BRK_BT, &got);
        ns[i] = (uint64_t)(now_ns() - t0);
    }
    return got;
}

/* p50, p99, mean and max of n samples (ns) in `unit` ("us" or "ms"). */
static void report(const char *phase, const char *who, uint64_t *ns, size_t n, const char *unit)
{
    double scale = strcmp(unit, "ms") == 0 ? 1e6 : 1e3;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)ns[i];
    double mean = n ? sum / (double)n : 0;
    double p50 = bench_quantile(ns, n, 0.50), p99 = bench_quantile(ns, n, 0.99);
    double max = n ? (double)ns[n - 1] : 0; /* sorted by bench_quantile */
    printf("%s_lookup_%s_p50 %.2f %s\n", phase, who, p50 / scale, unit);
    printf("%s_lookup_%s_p99 %.2f %s\n", phase, who, p99 / scale, unit);
    printf("%s_lookup_%s_mean %.2f %s\n", phase, who, mean / scale, unit);
    printf("%s_lookup_%s_max %.2f %s\n", phase, who, max / scale, unit);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare-bench breaker [--kvshared PATH] [--calls N] [--rounds R]\n"
               "                             [--timeout-ms MS] [--hung-plain K]\n\n"
               "Starts kvshared (host backend) and measures a full-hit kvs_lookup of a\n"
               "1024-token prompt by a client without and one with KVS_BREAKER: healthy\n"
               "(R alternating rounds of N calls each, default 10 x 20000), then with the\n"
               "daemon stopped (SIGSTOP; each client's first call waits --timeout-ms,\n"
               "default 1000; then K more calls of the plain client, default 3, and N of\n"
               "the breaker's), then the time from SIGCONT until the breaker is up.\n");
}

int bench_breaker(int argc, char **argv)
{
    brk_cfg_t b;
    char kvshared[PATH_MAX + 32];
    memset(&b, 0, sizeof(b));
    b.kvshared = bench_default_kvshared(kvshared, sizeof(kvshared));
    b.timeout_ms = 1000;
    b.calls = 20000;
    b.rounds = 10;
    b.hung_plain = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kvshared") == 0 && i + 1 < argc) {
            b.kvshared = argv[++i];
        } else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            b.calls = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            b.rounds = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--timeout-ms") == 0 && i + 1 < argc) {
            b.timeout_ms = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--hung-plain") == 0 && i + 1 < argc) {
            b.hung_plain = (unsigned)atoi(argv[++i]);
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (b.calls < 1 || b.calls > 10000000 || b.rounds < 1 || b.rounds > 1000 || b.timeout_ms < 10 ||
        b.timeout_ms > 60000 || b.hung_plain > 100) {
        fprintf(stderr, "bench breaker: --calls 1 to 10^7, --rounds 1 to 1000, --timeout-ms 10 "
                        "to 60000, --hung-plain 0 to 100\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (test_tmp_dir("kvs-bench", b.dir, sizeof(b.dir)) != 0) {
        fprintf(stderr, "bench breaker: cannot make a temporary directory: %s\n", strerror(errno));
        return 1;
    }
    snprintf(b.sock, sizeof(b.sock), "%s/kvshared.sock", b.dir);
    if (start_daemon(&b) != 0) {
        fprintf(stderr, "bench breaker: kvshared (%s) did not start; give --kvshared PATH\n",
                b.kvshared);
        rmdir(b.dir);
        return 1;
    }

    int rc = 1;
    uint32_t tokens[BRK_TOKENS], ids[BRK_TOKENS / BRK_BT], canon[BRK_TOKENS / BRK_BT];
    size_t total = (size_t)b.calls * b.rounds;
    uint64_t *plain_ns = malloc(total * sizeof(uint64_t));
    uint64_t *brk_ns = malloc(total * sizeof(uint64_t));
    kvs_client_t *plain = brk_connect(&b, 0), *brk = brk_connect(&b, KVS_BREAKER);
    for (size_t i = 0; i < BRK_TOKENS; i++)
        tokens[i] = (uint32_t)(i * 7919u % 128000u);
    if (!plain_ns || !brk_ns || !plain || !brk ||
        kvs_alloc(plain, NULL, BRK_TOKENS / BRK_BT, ids) != 0 ||
        kvs_commit(plain, NULL, tokens, BRK_TOKENS, ids, BRK_TOKENS / BRK_BT, canon, NULL) != 0) {
        fprintf(stderr, "bench breaker: cannot set up the prompt\n");
        goto out;
    }
    printf("# kvs_lookup of %d tokens (%d blocks, a full hit, no pin), timeout %d ms\n", BRK_TOKENS,
           BRK_TOKENS / BRK_BT, b.timeout_ms);

    /* Healthy: alternating rounds, the first client alternating too, so that
     * neither gets the warmer caches or the quieter moments. */
    for (unsigned r = 0; r < b.rounds; r++) {
        kvs_client_t *first = r % 2 ? brk : plain, *second = r % 2 ? plain : brk;
        uint64_t *first_ns = r % 2 ? brk_ns : plain_ns, *second_ns = r % 2 ? plain_ns : brk_ns;
        if (timed_lookups(first, tokens, b.calls, first_ns + (size_t)r * b.calls) !=
                BRK_TOKENS / BRK_BT ||
            timed_lookups(second, tokens, b.calls, second_ns + (size_t)r * b.calls) !=
                BRK_TOKENS / BRK_BT) {
            fprintf(stderr, "bench breaker: a healthy lookup missed: %s\n", kvs_last_error(first));
            goto out;
        }
    }
    report("healthy", "plain", plain_ns, total, "us");
    report("healthy", "breaker", brk_ns, total, "us");

    /* Hung. */
    kill(b.pid, SIGSTOP);
    uint64_t first_plain, first_brk;
    timed_lookups(plain, tokens, 1, &first_plain);
    timed_lookups(brk, tokens, 1, &first_brk);
    printf("hung_first_lookup_plain %.1f ms\n", (double)first_plain / 1e6);
    printf("hung_first_lookup_breaker %.1f ms\n", (double)first_brk / 1e6);
    if (b.hung_plain > 0) {
        timed_lookups(plain, tokens, b.hung_plain, plain_ns);
        report("hung_after_first", "plain", plain_ns, b.hung_plain, "ms");
    }
    timed_lookups(brk, tokens, b.calls, brk_ns);
    report("hung_after_first", "breaker", brk_ns, b.calls, "us");
    kvs_breaker_stats_t st;
    kvs_breaker_stats_init(&st);
    kvs_breaker(brk, &st);
    printf("hung_breaker_probes %llu probes\n", (unsigned long long)st.probes);
    printf("hung_breaker_fast_fails %llu calls\n", (unsigned long long)st.fast_fails);

    /* Resumed: until a probe brings the client up (the back-off has grown
     * while the daemon was stopped), then its first call reconnects. */
    kill(b.pid, SIGCONT);
    int64_t t0 = now_ns(), deadline = now_ms() + 30000;
    for (;;) {
        kvs_breaker(brk, &st);
        if (st.state == KVS_BREAKER_UP || now_ms() > deadline)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (st.state != KVS_BREAKER_UP) {
        fprintf(stderr, "bench breaker: the breaker stayed down 30 s after SIGCONT\n");
        goto out;
    }
    printf("resumed_until_up %.1f ms\n", (double)(now_ns() - t0) / 1e6);
    uint64_t again;
    size_t got = timed_lookups(brk, tokens, 1, &again);
    printf("resumed_first_lookup_breaker %.2f ms (reconnect and Hello included; %zu blocks hit)\n",
           (double)again / 1e6, got);
    rc = got == BRK_TOKENS / BRK_BT ? 0 : 1;

out:
    kvs_close(plain);
    kvs_close(brk);
    free(plain_ns);
    free(brk_ns);
    kill(b.pid, SIGCONT);
    launch_stop(b.pid, SIGTERM, LAUNCH_READY_MS);
    unlink(b.sock);
    rmdir(b.dir);
    return rc;
}
