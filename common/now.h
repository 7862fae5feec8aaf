/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The monotonic clock every part reads: deadlines, uptime, benchmark timing.
 * Never the wall clock (it jumps); log lines read CLOCK_REALTIME themselves.
 */
#ifndef KVS_COMMON_NOW_H
#define KVS_COMMON_NOW_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds of CLOCK_MONOTONIC. */
static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Milliseconds of CLOCK_MONOTONIC. */
static inline int64_t now_ms(void)
{
    return now_ns() / 1000000;
}

/* Seconds of CLOCK_MONOTONIC, as a double (benchmarks). */
static inline double now_s(void)
{
    return (double)now_ns() * 1e-9;
}

#endif /* KVS_COMMON_NOW_H */
