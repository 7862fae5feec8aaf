/*
 * metrics: the daemon's counters, one for every way a request can go. They
 * are plain integers bumped on the event loop thread and read by the Stats
 * RPC; an exporter can read them from the same struct later.
 */
#ifndef KVS_DAEMON_METRICS_H
#define KVS_DAEMON_METRICS_H

#include <stdint.h>

#define METRICS_MAX_RPC 32

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
} metrics_t;

/* Counts one request of RPC number rpc (the oneof case) and its status. */
void metrics_count_rpc(metrics_t *m, unsigned rpc, int status);

#endif /* KVS_DAEMON_METRICS_H */
