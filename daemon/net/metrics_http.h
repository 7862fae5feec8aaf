/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_http: the Prometheus exposition of the daemon's metrics, and a
 * minimal HTTP/1.1 responder for it on the daemon's own libuv loop.
 *
 *     GET /metrics  -> 200, text/plain; version=0.0.4 (metrics_render)
 *     GET other     -> 404;  other methods -> 405
 *     a request head over METRICS_HTTP_MAX_REQUEST bytes -> 431
 *
 * One response per connection (Connection: close). The responder never
 * blocks the loop, and no client can keep others out:
 *   - a connection must send its request head within METRICS_HTTP_HEAD_MS
 *     and take its reply within METRICS_HTTP_WRITE_MS, else it is closed;
 *   - at most METRICS_HTTP_MAX_CONNS are open: a new one closes the oldest
 *     that has not sent its head yet (idle connections cannot hold every
 *     slot), or is closed when all are busy being answered;
 *   - after a render that took d, none starts before 19 d later, 1 s at most
 *     (rendering takes at most 5 % of the loop, one render at a time):
 *     scrapes that arrive meanwhile wait for the next render and share it.
 * Each closing and each held scrape is counted (kvshare_counters.h).
 * Rendering walks the namespaces, not the index: its cost does not grow
 * with the cache.
 */
#ifndef KVS_DAEMON_METRICS_HTTP_H
#define KVS_DAEMON_METRICS_HTTP_H

#include <stddef.h>

typedef struct server server_t;
typedef struct metrics_http metrics_http_t;

#define METRICS_HTTP_MAX_REQUEST 8192
#define METRICS_HTTP_HEAD_MS     2000  /* connect to the end of the request head */
#define METRICS_HTTP_WRITE_MS    10000 /* the reply, once queued, must be taken */
#define METRICS_HTTP_MAX_CONNS   64
#define METRICS_HTTP_RENDER_GAP  19            /* after a render of d, the next after 19 d */
#define METRICS_HTTP_GAP_MAX_NS  1000000000ull /* ... and 1 s at most */

/* Listens on `listen` ("127.0.0.1:9464") on srv's loop. Errors (message in
 * err): KVS_EINVAL (bad address), KVS_EIO (bind or listen failed),
 * KVS_ENOMEM. The responder is closed by metrics_http_close. */
int metrics_http_start(server_t *srv, const char *listen, metrics_http_t **out, char *err,
                       size_t errlen);

/* The port actually bound (useful with port 0). */
int metrics_http_port(const metrics_http_t *h);

/* Stops listening and closes every open connection; memory goes in libuv's
 * close callbacks. Accepts NULL. */
void metrics_http_close(metrics_http_t *h);

#endif /* KVS_DAEMON_METRICS_HTTP_H */
