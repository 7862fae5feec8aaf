/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop_wake: another thread wakes the daemon's libuv loop, as a uv_async_t
 * does, without the loop ever waiting for the thread that woke it.
 *
 * Why not uv_async_t: in libuv 1.44 (Debian 12's), uv_async_send marks the
 * handle busy, writes the loop's eventfd and then marks it sent, and the
 * loop, woken by that write, spins until the mark comes. The write wakes
 * the loop thread inside that window; where it then takes the CPU from the
 * sender (a niced tier thread: the loop runs at a higher priority, and under
 * loop_rt_priority at a real-time one), it spins until the sender runs
 * again: tens of microseconds a time at normal priority, up to hundreds of
 * milliseconds under SCHED_RR, where its sched_yield lets no thread of a
 * lower class run.
 *
 * Here the sender sets a flag and writes an eventfd once per wake-up; the
 * loop clears the flag, then runs the callback. A sender stopped anywhere
 * leaves the loop asleep or running the callback, never waiting.
 *
 *     on the loop:     loop_wake_init(loop, &w, on_wake); w.data = ctx;
 *     any thread:      push work under a mutex; loop_wake_send(&w);
 *     on the loop:     on_wake(&w) takes everything pushed so far
 *     on the loop:     loop_wake_close(&w, on_closed);
 *
 * Wake-ups coalesce: one call of the callback may answer many sends, and a
 * send made while the callback runs calls it again.
 */
#ifndef KVS_DAEMON_LOOP_WAKE_H
#define KVS_DAEMON_LOOP_WAKE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <uv.h>

typedef struct loop_wake loop_wake_t;
typedef void (*loop_wake_cb)(loop_wake_t *w);

struct loop_wake {
    uv_poll_t poll;      /* the eventfd, on the loop */
    int fd;              /* eventfd; -1 once closed */
    atomic_bool pending; /* sent, and the callback has not started since */
    loop_wake_cb cb;
    loop_wake_cb closed; /* loop_wake_close's callback */
    unsigned holds;      /* loop_wake_hold minus loop_wake_release (the loop's thread) */
    void *data;          /* the caller's */
};

/* On the loop's thread. Returns 0, or a KVS_* status (no eventfd: KVS_EIO). */
int loop_wake_init(uv_loop_t *loop, loop_wake_t *w, loop_wake_cb cb);
/* From any thread, any number of times until loop_wake_close. */
void loop_wake_send(loop_wake_t *w);
/* Whether the handle keeps the loop alive (as uv_ref / uv_unref). */
void loop_wake_ref(loop_wake_t *w);
void loop_wake_unref(loop_wake_t *w);
/* Counted, on the loop's thread, for a handle kept unreferenced while idle:
 * hold when work goes out to a thread (the loop stays alive until it comes
 * back), release when its end was taken. The first hold refs the handle, the
 * last release unrefs it. */
void loop_wake_hold(loop_wake_t *w);
void loop_wake_release(loop_wake_t *w);
/* On the loop's thread, once no thread sends any more: closed(w) runs on a
 * later turn of the loop, after which w may be freed. */
void loop_wake_close(loop_wake_t *w, loop_wake_cb closed);

#endif /* KVS_DAEMON_LOOP_WAKE_H */
