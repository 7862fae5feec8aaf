/* SPDX-License-Identifier: Apache-2.0 */
/* kvshare-bench: shared helpers of the benchmark subcommands. */
#ifndef KVS_BENCH_H
#define KVS_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "now.h"

/* A subcommand: argv[0] is its name. Returns the process exit status. */
typedef int (*bench_fn)(int argc, char **argv);

int bench_radix(int argc, char **argv);
int bench_walk(int argc, char **argv);
int bench_rpc_main(int argc, char **argv); /* bench_rpc.c */
int bench_trace_sim(int argc, char **argv);
int bench_replay(int argc, char **argv);
int bench_flood(int argc, char **argv);     /* bench_flood.c */
int bench_tier_copy(int argc, char **argv); /* bench_tier_copy.c */
int bench_devices(int argc, char **argv);   /* bench_devices.c */
int bench_cluster(int argc, char **argv);   /* bench_cluster.c */
int bench_wake(int argc, char **argv);      /* bench_wake.c */
int bench_breaker(int argc, char **argv);   /* bench_breaker.c */
int bench_tier_hit(int argc, char **argv);  /* bench_tier_hit.c */

/* Sorts samples in place and returns the q-quantile (0 <= q <= 1). */
double bench_quantile(uint64_t *samples, size_t n, double q);

/* qsort comparators for floats and doubles, ascending. */
int bench_cmp_float(const void *a, const void *b);
int bench_cmp_double(const void *a, const void *b);

/* The kvshared built next to this program (build/tools/bench/kvshare-bench ->
 * build/daemon/kvshared) or, when there is none, installed beside it
 * (/usr/bin/kvshare-bench -> /usr/bin/kvshared), written into buf; "kvshared"
 * when /proc/self/exe cannot be read. Returns buf or that literal. */
const char *bench_default_kvshared(char *buf, size_t len);

/* Writes all n bytes to a blocking fd, looping over short writes. Returns 0,
 * or -1 when a write fails or writes nothing (errno tells which, if any). */
int bench_write_all(int fd, const void *buf, size_t n);

/* Reads exactly n bytes from a blocking fd. Returns 0, or -1 at end of file
 * or when a read fails. */
int bench_read_all(int fd, void *buf, size_t n);

/* CPU time (user + system, every thread) process pid has used, in seconds;
 * -1 when /proc cannot tell. It shows what a request costs the daemon,
 * which the request rate alone hides on a machine shared with other work. */
double bench_process_cpu_seconds(int pid);

#endif
