/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop_watch: how long the loop goes without polling. Every client waits
 * while the loop works, so the longest stretch of work between two polls is
 * the longest delay one request, one close or one timer gave everyone. The
 * watch takes it from libuv's own clock of idle time (UV_METRICS_IDLE_TIME:
 * the time spent waiting in the poll) and a prepare handle, which runs once
 * per loop iteration just before the poll: busy = time between two prepares
 * less the idle time between them. Two clock reads per iteration (uv_hrtime
 * is a vDSO call).
 *
 * It is wall-clock time: a loop thread preempted by other processes in the
 * middle of its work counts that wait too (that is what clients feel).
 * A stretch over LOOP_STALL_MS is a stall only if the loop thread also
 * spent that much CPU (the daemon's own work, not a busy host): its CPU
 * time is read at most 100 times a second and after such a stretch.
 *
 * Shown (metrics_t, Stats): loop_busy_max_us, the longest stretch since
 * start, wall-clock (kvshare_loop_busy_max_seconds); loop_stalls, the
 * stretches over LOOP_STALL_MS of both wall-clock and CPU time
 * (kvshare_loop_stalls_total), each logged (at most one line a second, with
 * the count of those not logged).
 */
#ifndef KVS_DAEMON_LOOP_WATCH_H
#define KVS_DAEMON_LOOP_WATCH_H

#include "server.h"

/* The bound every piece of loop work is held to (docs/RELIABILITY.md). */
#define LOOP_STALL_MS 50

/* Starts watching srv's loop. Returns 0, or KVS_EIO / KVS_ENOMEM (the
 * daemon runs without the watch; the caller logs). */
int loop_watch_start(server_t *srv);

/* Stops it; its memory goes in the handle's close callback. NULL-safe,
 * idempotent. */
void loop_watch_stop(server_t *srv);

#endif /* KVS_DAEMON_LOOP_WATCH_H */
