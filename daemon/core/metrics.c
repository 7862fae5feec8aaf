/* SPDX-License-Identifier: Apache-2.0 */
#include "metrics.h"

/* 10 us .. 1 s: a Lookup is tens of microseconds, a Stats or Tree with a
 * large index can take milliseconds. */
const uint64_t metrics_latency_bounds_ns[] = {
    10000,   25000,    50000,    100000,   250000,    500000,    1000000,   2500000,
    5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 500000000, 1000000000,
};
const size_t metrics_latency_n_bounds =
    sizeof(metrics_latency_bounds_ns) / sizeof(metrics_latency_bounds_ns[0]);

/* 100 ms .. 1 day: how long a cached block lives, how long until it is
 * used again. */
const uint64_t metrics_block_bounds_ms[] = {
    100, 1000, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000, 21600000, 86400000,
};
const size_t metrics_block_n_bounds =
    sizeof(metrics_block_bounds_ms) / sizeof(metrics_block_bounds_ms[0]);

void metrics_count_rpc(metrics_t *m, unsigned rpc, int status)
{
    m->requests++;
    if (status != 0)
        m->errors++;
    if (rpc < METRICS_MAX_RPC) {
        m->rpc_calls[rpc]++;
        if (status != 0)
            m->rpc_errors[rpc]++;
    }
}

size_t metrics_bucket(const uint64_t *bounds, size_t n_bounds, uint64_t value)
{
    size_t i = 0;
    while (i < n_bounds && value > bounds[i])
        i++;
    return i;
}

void metrics_observe(metrics_hist_t *h, const uint64_t *bounds, size_t n_bounds, uint64_t value)
{
    h->buckets[metrics_bucket(bounds, n_bounds, value)]++;
    h->count++;
    h->sum += value;
}
