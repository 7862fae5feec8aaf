/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_text: the Prometheus text exposition of the daemon's counters,
 * gauges and histograms, with the per-RPC rows of the RPC list; served by
 * net/metrics_http.c.
 */
#ifndef KVS_DAEMON_METRICS_TEXT_H
#define KVS_DAEMON_METRICS_TEXT_H

#include <stddef.h>

#include "server.h"

/* The text exposition of srv's metrics in a malloc'd buffer (*out, *len,
 * NUL-terminated), owned by the caller. Errors: KVS_ENOMEM. */
int metrics_render(server_t *srv, char **out, size_t *len);

#endif /* KVS_DAEMON_METRICS_TEXT_H */
