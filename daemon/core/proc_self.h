/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The process's own figures, as the Prometheus client libraries export them
 * (process_start_time_seconds, process_cpu_seconds_total,
 * process_resident_memory_bytes, process_virtual_memory_bytes,
 * process_open_fds, process_max_fds). Read when asked (a scrape): a read of
 * /proc/self/stat, one of /proc/stat's btime line, a getrusage, a listing
 * of /proc/self/fd and a getrlimit; nothing is kept between calls.
 */
#ifndef KVS_PROC_SELF_H
#define KVS_PROC_SELF_H

#include <stdint.h>

/* A figure the system would not give is left out: its `has_` flag is 0. */
typedef struct proc_self {
    double start_time_seconds; /* since the epoch (boot time + start ticks) */
    double cpu_seconds;        /* user + system, every thread */
    uint64_t resident_bytes, virtual_bytes;
    uint64_t open_fds, max_fds;
    int has_start_time, has_cpu, has_memory, has_open_fds, has_max_fds;
} proc_self_t;

/* Fills *out with what can be read now. Returns 0, or KVS_EINVAL for a
 * NULL out; a figure that cannot be read is not an error (its flag is 0). */
int proc_self_read(proc_self_t *out);

#endif /* KVS_PROC_SELF_H */
