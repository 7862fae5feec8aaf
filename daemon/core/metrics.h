/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics: the daemon's counters, one for every way a request can go. They
 * are plain integers bumped on the event loop thread and read by the Stats
 * RPC and by the Prometheus exposition (metrics_text.c, served over HTTP by
 * metrics_http.c): both read this one struct, so they always agree. The
 * scalar counters are the list KVS_COUNTERS (kvshare_counters.h), which also
 * generates their Stats field, /metrics line and client field.
 *
 * Per-RPC counters and latencies are indexed by the RPC's position in the
 * RPC list (kvshare_rpcs.h), which is its dispatch table position
 * (dispatch_index), not by its protobuf field number.
 *
 * Histograms keep cumulative-free bucket counts (bucket i counts values
 * <= bounds[i] and > bounds[i-1]; the last bucket is +Inf), a count and a
 * sum; the exposition turns them into Prometheus' cumulative `le` buckets.
 */
#ifndef KVS_DAEMON_METRICS_H
#define KVS_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare_counters.h"
#include "kvshare_rpcs.h"

/* One per-RPC slot per RPC of the list (kvshare_rpcs.h; dispatch.c checks
 * that its table has one row each). */
#define METRICS_MAX_RPC     KVS_RPC_COUNT
#define METRICS_MAX_BUCKETS 20

typedef struct metrics_hist {
    uint64_t buckets[METRICS_MAX_BUCKETS + 1]; /* the last one: over every bound */
    uint64_t count;
    uint64_t sum; /* in the histogram's unit: ns for latency, ms for block times */
} metrics_hist_t;

/* Bucket bounds: RPC latency in nanoseconds, block lifetime and reuse gap in
 * milliseconds. */
extern const uint64_t metrics_latency_bounds_ns[];
extern const size_t metrics_latency_n_bounds;
extern const uint64_t metrics_block_bounds_ms[];
extern const size_t metrics_block_n_bounds;

#define METRICS_COUNTER(name, ...) uint64_t name;

typedef struct metrics {
    union {
        struct {
            KVS_COUNTERS(METRICS_COUNTER)
            KVS_COUNTERS_NEXT(METRICS_COUNTER)
        };
        /* the same, by position in KVS_COUNTERS then KVS_COUNTERS_NEXT */
        uint64_t counters[KVS_N_COUNTERS_ALL];
    };
    uint64_t loop_busy_max_us; /* the loop's longest work between two polls (loop_watch.c) */
    uint64_t disk_restored;    /* blocks the disk tier's file gave back to the index at start */
    /* problems the check of the cluster masters' eviction settings found (cluster.h) */
    uint64_t cluster_settings_warnings;
    uint64_t rpc_calls[METRICS_MAX_RPC];  /* by dispatch table position */
    uint64_t rpc_errors[METRICS_MAX_RPC]; /* by dispatch table position */

    metrics_hist_t rpc_latency[METRICS_MAX_RPC]; /* ns, by dispatch table position */
    metrics_hist_t block_lifetime;               /* ms from commit to eviction */
    metrics_hist_t block_reuse_gap;              /* ms since a matched prefix's end was last used */
    metrics_hist_t tier_copy_time[2];  /* ns per batch of tier copies, by backend_tier_dir_t */
    metrics_hist_t disk_read_time;     /* ns per batch of tier-3 reads (disk -> pool) */
    metrics_hist_t cluster_fetch_time; /* ns from a Lookup's cluster fetch to its blocks placed */
} metrics_t;

#undef METRICS_COUNTER

/* Counts one request and its status; rpc is the RPC's dispatch table
 * position, or METRICS_MAX_RPC or more for a request no entry answers. */
void metrics_count_rpc(metrics_t *m, unsigned rpc, int status);

/* Adds one value to a histogram with the given bounds (ascending). */
void metrics_observe(metrics_hist_t *h, const uint64_t *bounds, size_t n_bounds, uint64_t value);

/* The bucket index of value among bounds (n_bounds for over every bound). */
size_t metrics_bucket(const uint64_t *bounds, size_t n_bounds, uint64_t value);

#endif /* KVS_DAEMON_METRICS_H */
