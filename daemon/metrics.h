/*
 * metrics: the daemon's counters, one for every way a request can go. They
 * are plain integers bumped on the event loop thread and read by the Stats
 * RPC and by the Prometheus exposition (metrics_text.c, served over HTTP by
 * metrics_http.c): both read this one struct, so they always agree.
 *
 * Histograms keep cumulative-free bucket counts (bucket i counts values
 * <= bounds[i] and > bounds[i-1]; the last bucket is +Inf), a count and a
 * sum; the exposition turns them into Prometheus' cumulative `le` buckets.
 */
#ifndef KVS_DAEMON_METRICS_H
#define KVS_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_RPC     32
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

typedef struct metrics {
    uint64_t requests;        /* decoded requests, every RPC */
    uint64_t errors;          /* requests answered with a non-OK status */
    uint64_t protocol_errors; /* frames refused: too big, undecodable */
    uint64_t bytes_in, bytes_out;
    uint64_t sessions_total;   /* connections accepted since start */
    uint64_t sessions_refused; /* over the session limit */
    uint64_t sessions_dropped; /* closed for a full output buffer */
    uint64_t evictions;        /* blocks the index handed back to the pool */
    uint64_t rpc_calls[METRICS_MAX_RPC];
    uint64_t rpc_errors[METRICS_MAX_RPC];

    uint64_t alloc_fail_pool_full; /* Alloc requests refused: pool full after eviction */
    uint64_t alloc_fail_quota;     /* Commits cut short by a namespace quota */
    uint64_t limit_refusals;       /* requests over a per-session limit */
    uint64_t peers_denied;         /* connections refused by the uid/gid allow-lists */
    uint64_t ns_denied;            /* requests refused by a namespace allow-list */
    uint64_t config_reloads;       /* successful SIGHUP reloads */
    uint64_t config_reload_errors; /* SIGHUP reloads refused (bad file) */

    metrics_hist_t rpc_latency[METRICS_MAX_RPC]; /* ns, by RPC number */
    metrics_hist_t block_lifetime;               /* ms from commit to eviction */
    metrics_hist_t block_reuse_gap;              /* ms since a matched prefix's end was last used */
} metrics_t;

/* Counts one request of RPC number rpc (the oneof case) and its status. */
void metrics_count_rpc(metrics_t *m, unsigned rpc, int status);

/* Adds one value to a histogram with the given bounds (ascending). */
void metrics_observe(metrics_hist_t *h, const uint64_t *bounds, size_t n_bounds, uint64_t value);

/* The bucket index of value among bounds (n_bounds for over every bound). */
size_t metrics_bucket(const uint64_t *bounds, size_t n_bounds, uint64_t value);

#endif /* KVS_DAEMON_METRICS_H */
