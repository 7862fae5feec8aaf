/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench: the benchmark programs of kvshare, one subcommand each.
 * Figures are printed one per line as "name value unit" so they can be
 * pasted into docs/BENCHMARKS.md or compared by a script.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const struct bench_cmd {
    const char *name;
    bench_fn fn;
    const char *help;
} bench_cmds[] = {
    {"radix", bench_radix,
     "index: 4k-token lookups and inserts against 1,000,000 cached blocks under 10,000 system "
     "prompts, bytes per block"},
    {"walk", bench_walk,
     "index: a Tree and a Clear of n one-block prefixes (n = 65,536 to 1,048,576), and the "
     "longest step of the daemon's stepped Clear against the same Clear in one piece"},
    {"trace-sim", bench_trace_sim,
     "offline trace replay against the index alone: hit rate against capacity and policy"},
    {"replay", bench_replay,
     "trace replay against a real kvshared by worker processes: hit rate, RPC latencies"},
    {"rpc", bench_rpc_main,
     "kvshared: Lookup p50/p99 and throughput with 1/4/16 clients for 64/4k/32k tokens next to "
     "a raw Unix-socket ping-pong, and pipelined Lookups"},
    {"tier-copy", bench_tier_copy,
     "tier 2: demotion and promotion copies of 4k-token prefixes (llama-3.1-8b) against a "
     "plain memcpy of the same sizes on the same threads"},
    {"devices", bench_devices,
     "kvshared with 1, 4 and 8 simulated devices (--devices): Lookup p50/p99 in-process and "
     "over the socket, each against the one-device figure of the same run"},
    {"cluster", bench_cluster,
     "the cluster tier on a Redis Cluster of its own: writes through and fetches of 2 MiB blocks "
     "next to redis-benchmark SET/GET of the same size and depth, and a tier-1 Lookup's p99 "
     "while the tier is busy"},
    {"wake", bench_wake,
     "waking the loop from a niced thread on its CPU with the loop under SCHED_RR: libuv's "
     "uv_async_t against loop_wake, round trip and the loop's CPU per wake-up"},
    {"flood", bench_flood,
     "kvshared under one hostile client: another client's Lookup p50/p99/max and the "
     "daemon's RSS while it pipelines Tree, the largest Release or Lookup, or Stats, scrapes, "
     "stalls a KV-events subscriber, floods replays or hints, or floods large work against "
     "300,000-token Lookups; each against a same-run baseline"},
    {"tier-hit", bench_tier_hit,
     "a pinned Lookup of one 512-byte block in tier 3 (read from the disk, verified, promoted) "
     "against one that hits tier 1 in the same run"},
    {"breaker", bench_breaker,
     "the client's circuit breaker (KVS_BREAKER): a full-hit Lookup with and without it against "
     "a healthy kvshared in the same run, and each call's cost once the daemon hangs (SIGSTOP)"},
};

#define N_CMDS (sizeof(bench_cmds) / sizeof(bench_cmds[0]))

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
