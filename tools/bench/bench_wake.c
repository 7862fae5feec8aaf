/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench wake: what waking the daemon's loop from a tier's thread
 * costs the loop, through libuv's uv_async_t and through loop_wake
 * (daemon/core/loop_wake.h), where the loop thread runs under SCHED_RR
 * (loop_rt_priority) and the waking thread at nice 19 on the same CPU: the
 * case where the woken loop takes the CPU from its sender at once.
 *
 * Each round trip: the sender marks an item under a mutex, wakes the loop
 * and sleeps on a condition variable until the loop's callback has taken
 * the item. Printed per mechanism: the round trip's median and maximum,
 * and the loop thread's CPU time per wake-up (work a spinning loop does
 * shows there).
 *
 * Needs the right to use SCHED_RR (root, CAP_SYS_NICE or RLIMIT_RTPRIO);
 * without it, says so and measures nothing. Both threads are pinned to
 * CPU 0 for the run; with uv_async_t a round trip can last until the
 * kernel gives normal threads their share of a CPU under a busy real-time
 * one (sched_rt_runtime_us: 50 ms a second), so the default is few sends.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "bench.h"
#include "loop_wake.h"

#define MAX_SENDS 10000

typedef struct {
    bool use_async;
    unsigned sends;
    uv_async_t async;
    loop_wake_t wake;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned marked, taken; /* under mu */
    bool stop;              /* under mu */
    bool ready;             /* under mu: the loop runs */
    int loop_err;           /* the loop thread could not take SCHED_RR */
    double loop_cpu_ms;
    double rt_us[MAX_SENDS];
} wake_run_t;

static double now_us(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int pin_cpu0(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    return sched_setaffinity(0, sizeof(set), &set) == 0 ? 0 : errno;
}

/* On the loop: take what was marked; the last wake-up closes the handle. */
static void take(wake_run_t *r)
{
    pthread_mutex_lock(&r->mu);
    r->taken = r->marked;
    bool stop = r->stop;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (stop) {
        if (r->use_async)
            uv_close((uv_handle_t *)&r->async, NULL);
        else
            loop_wake_close(&r->wake, NULL);
    }
}

static void on_async(uv_async_t *h)
{
    take(h->data);
}

static void on_wake(loop_wake_t *w)
{
    take(w->data);
}

static void *loop_thread(void *arg)
{
    wake_run_t *r = arg;
    uv_loop_t loop;
    struct sched_param sp = {.sched_priority = 1};
    int e = pin_cpu0();
    if (e == 0 && sched_setscheduler(0, SCHED_RR, &sp) != 0)
        e = errno;
    if (e == 0 && uv_loop_init(&loop) != 0)
        e = ENOMEM;
    if (e == 0) {
        if (r->use_async) {
            uv_async_init(&loop, &r->async, on_async);
            r->async.data = r;
        } else {
            loop_wake_init(&loop, &r->wake, on_wake);
            r->wake.data = r;
        }
    }
    pthread_mutex_lock(&r->mu);
    r->loop_err = e;
    r->ready = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (e != 0)
        return NULL;
    double c0 = now_us(CLOCK_THREAD_CPUTIME_ID);
    uv_run(&loop, UV_RUN_DEFAULT);
    r->loop_cpu_ms = (now_us(CLOCK_THREAD_CPUTIME_ID) - c0) / 1e3;
    uv_loop_close(&loop);
    return NULL;
}

static void send_one(wake_run_t *r)
{
    if (r->use_async)
        uv_async_send(&r->async);
    else
        loop_wake_send(&r->wake);
}

/* The sender: this thread, on CPU 0 at nice 19. Returns 0 or an errno. */
static int run(wake_run_t *r)
{
    pthread_t t;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int e = pthread_create(&t, NULL, loop_thread, r);
    if (e != 0)
        return e;
    pthread_mutex_lock(&r->mu);
    while (!r->ready)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (r->loop_err) {
        pthread_join(t, NULL);
        return r->loop_err;
    }
    for (unsigned i = 0; i <= r->sends; i++) {
        double t0 = now_us(CLOCK_MONOTONIC);
        pthread_mutex_lock(&r->mu);
        r->marked = i + 1;
        r->stop = i == r->sends; /* one more, not timed: it ends the loop */
        pthread_mutex_unlock(&r->mu);
        send_one(r);
        pthread_mutex_lock(&r->mu);
        while (r->taken != i + 1)
            pthread_cond_wait(&r->cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
        if (i < r->sends)
            r->rt_us[i] = now_us(CLOCK_MONOTONIC) - t0;
    }
    pthread_join(t, NULL);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    return 0;
}

int bench_wake(int argc, char **argv)
{
    unsigned sends = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sends") == 0 && i + 1 < argc) {
            sends = (unsigned)atoi(argv[++i]);
        } else {
            FILE *f = strcmp(argv[i], "--help") == 0 ? stdout : stderr;
            fprintf(f, "usage: kvshare-bench wake [--sends N]   (default 20, at most %d)\n",
                    MAX_SENDS);
            return f == stdout ? 0 : 2;
        }
    }
    if (sends == 0 || sends > MAX_SENDS) {
        fprintf(stderr, "bench wake: --sends between 1 and %d\n", MAX_SENDS);
        return 2;
    }
    int e = pin_cpu0();
    if (e == 0 && setpriority(PRIO_PROCESS, 0, 19) != 0)
        e = errno;
    if (e != 0) {
        fprintf(stderr, "bench wake: cannot pin to CPU 0 at nice 19: %s\n", strerror(e));
        return 1;
    }
    printf("loop thread SCHED_RR 1, sender nice 19, both on CPU 0; %u round trips each\n", sends);
    static wake_run_t runs[2];
    const char *names[2] = {"uv_async_t", "loop_wake"};
    for (int m = 0; m < 2; m++) {
        wake_run_t *r = &runs[m];
        *r = (wake_run_t){.use_async = m == 0, .sends = sends};
        double w0 = now_us(CLOCK_MONOTONIC);
        e = run(r);
        if (e == EPERM) {
            printf("skipped: this process may not use SCHED_RR (%s): run as root, with "
                   "CAP_SYS_NICE, or with an RLIMIT_RTPRIO of 1 or more\n",
                   strerror(e));
            return 0;
        }
        if (e != 0) {
            fprintf(stderr, "bench wake: %s\n", strerror(e));
            return 1;
        }
        double wall_ms = (now_us(CLOCK_MONOTONIC) - w0) / 1e3;
        qsort(r->rt_us, sends, sizeof(double), bench_cmp_double);
        printf("%s_round_trip_median %.1f us\n", names[m], r->rt_us[sends / 2]);
        printf("%s_round_trip_max %.1f us\n", names[m], r->rt_us[sends - 1]);
        printf("%s_loop_cpu_per_wake %.1f us (the loop thread's CPU time over %u wake-ups)\n",
               names[m], r->loop_cpu_ms * 1e3 / (sends + 1), sends + 1);
        printf("%s_wall %.0f ms\n", names[m], wall_ms);
    }
    return 0;
}
