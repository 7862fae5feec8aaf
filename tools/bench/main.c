/*
 * kvshare-bench: the benchmark programs of kvshare, one subcommand each.
 * Figures are printed one per line as "name value unit" so they can be
 * pasted into docs/BENCHMARKS.md or compared by a script.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kvshare_status.h"

static const struct bench_cmd {
    const char *name;
    bench_fn fn;
    const char *help;
} bench_cmds[] = {
    {"radix", bench_radix,
     "index: 4k-token lookups and inserts against 1,000,000 cached blocks under 10,000 system "
     "prompts, bytes per block"},
    {"trace-sim", bench_trace_sim,
     "offline trace replay against the index alone: hit rate against capacity and policy"},
};

#define N_CMDS (sizeof(bench_cmds) / sizeof(bench_cmds[0]))

const char *bench_status_text(int status)
{
    switch (status) {
#define BENCH_STATUS_CASE(name, code, text)                                                        \
    case code:                                                                                     \
        return text;
        KVS_STATUS_TABLE(BENCH_STATUS_CASE)
#undef BENCH_STATUS_CASE
    }
    return "unknown status";
}

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

double bench_quantile(uint64_t *samples, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(samples, n, sizeof(*samples), cmp_u64);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return (double)samples[i];
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: kvshare-bench <benchmark> [options]   (<benchmark> --help for its options)\n\n");
    for (size_t i = 0; i < N_CMDS; i++)
        fprintf(f, "  %-10s %s\n", bench_cmds[i].name, bench_cmds[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < N_CMDS; i++)
        if (strcmp(argv[1], bench_cmds[i].name) == 0)
            return bench_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvshare-bench: no benchmark named '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
