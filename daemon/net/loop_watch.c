/* SPDX-License-Identifier: Apache-2.0 */
/* loop_watch: the longest stretch of loop work between polls (loop_watch.h). */
#include "loop_watch.h"

#include <stdlib.h>
#include <time.h>

#include "kvshare_status.h"
#include "log.h"
#include "session.h"

/* How old the CPU-time reading a stretch is measured from may be. */
#define LOOP_WATCH_CPU_EVERY_NS 10000000u

struct loop_watch {
    uv_prepare_t prepare;
    server_t *srv;
    uint64_t last_ns;      /* uv_hrtime at the previous prepare; 0: none yet */
    uint64_t last_idle_ns; /* uv_metrics_idle_time then */
    uint64_t cpu_ns;       /* the loop thread's CPU time, read at cpu_at_ns */
    uint64_t cpu_at_ns;    /* uv_hrtime of that reading, at a prepare */
    uint64_t busy_since;   /* loop work (wall ns) since that reading */
    uint64_t log_ms;       /* last stall log line (loop ms) */
    uint64_t unlogged;     /* stalls since then, not logged */
};

/* The calling thread's CPU time, ns (a system call: 1.4 us here). */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A stretch of busy_ns (wall) just ended, at now: counted as a stall if
 * the loop thread's CPU time in it is over the bound too. The last reading
 * was taken at a prepare at most LOOP_WATCH_CPU_EVERY_NS before the stretch
 * began; the loop's work between that reading and the stretch (busy_since,
 * wall time) took at most that much CPU, and is taken off (it used to be
 * counted in, up to 10 ms of other work). What is left is the stretch's own
 * CPU time, less at most what the thread waited for a CPU in that earlier
 * work. A stretch that is mostly the thread waiting for a CPU (another
 * process ran) is not the daemon's stall. */
static void stretch_over(struct loop_watch *w, uint64_t busy_ns, uint64_t now)
{
    server_t *srv = w->srv;
    uint64_t cpu = thread_cpu_ns(), cpu_ns = cpu > w->cpu_ns ? cpu - w->cpu_ns : 0;
    cpu_ns = cpu_ns > w->busy_since ? cpu_ns - w->busy_since : 0;
    w->cpu_ns = cpu;
    w->cpu_at_ns = now;
    w->busy_since = 0;
    if (cpu_ns <= (uint64_t)LOOP_STALL_MS * 1000000)
        return;
    srv->metrics.loop_stalls++;
    uint64_t ms = uv_now(srv->loop);
    if (w->log_ms == 0 || ms - w->log_ms >= 1000) {
        LOG_WARN("the loop worked %.1f ms without polling (%.1f ms of CPU): every client waited "
                 "that long (%llu more such stretches since the last line; "
                 "kvshare_loop_stalls_total)",
                 (double)busy_ns / 1e6, (double)cpu_ns / 1e6, (unsigned long long)w->unlogged);
        w->log_ms = ms;
        w->unlogged = 0;
    } else {
        w->unlogged++;
    }
}

/* Runs once per iteration, before the poll: the work since the previous
 * one is the time between them less what the loop spent waiting. The
 * thread's CPU time is read at most every LOOP_WATCH_CPU_EVERY_NS (100 a
 * second at most: a system call each), and after a stretch over the
 * bound. */
static void on_prepare(uv_prepare_t *h)
{
    struct loop_watch *w = h->data;
    server_t *srv = w->srv;
    uint64_t now = uv_hrtime(), idle = uv_metrics_idle_time(srv->loop);
    srv->sched.loop_polls++;
    if (w->last_ns) {
        uint64_t wall = now - w->last_ns, waited = idle - w->last_idle_ns;
        uint64_t busy = wall > waited ? wall - waited : 0;
        uint64_t us = busy / 1000;
        if (us > srv->metrics.loop_busy_max_us)
            srv->metrics.loop_busy_max_us = us;
        if (busy > (uint64_t)LOOP_STALL_MS * 1000000)
            stretch_over(w, busy, now);
        else
            w->busy_since += busy;
    }
    if (now - w->cpu_at_ns >= LOOP_WATCH_CPU_EVERY_NS) {
        w->cpu_ns = thread_cpu_ns();
        w->cpu_at_ns = now;
        w->busy_since = 0;
    }
    w->last_ns = now;
    w->last_idle_ns = idle;
    session_hold_polled(srv);
}

static void on_close(uv_handle_t *h)
{
    free(h->data);
}

int loop_watch_start(server_t *srv)
{
    if (srv->net.watch)
        return 0;
    /* Idle time is counted from the next poll on; the first prepare only
     * takes the clocks. */
    if (uv_loop_configure(srv->loop, UV_METRICS_IDLE_TIME) != 0)
        return KVS_EIO;
    struct loop_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return KVS_ENOMEM;
    if (uv_prepare_init(srv->loop, &w->prepare) != 0) {
        free(w);
        return KVS_EIO;
    }
    w->srv = srv;
    w->prepare.data = w;
    if (uv_prepare_start(&w->prepare, on_prepare) != 0) {
        uv_close((uv_handle_t *)&w->prepare, on_close); /* the loop lists it since init */
        return KVS_EIO;
    }
    /* Watching must not keep the loop running. */
    uv_unref((uv_handle_t *)&w->prepare);
    srv->net.watch = w;
    return 0;
}

void loop_watch_stop(server_t *srv)
{
    if (!srv || !srv->net.watch)
        return;
    uv_close((uv_handle_t *)&srv->net.watch->prepare, on_close);
    srv->net.watch = NULL;
}
