/* SPDX-License-Identifier: Apache-2.0 */
/* loop_wake: a cross-thread wake-up the loop never waits on (loop_wake.h). */
#include "loop_wake.h"

#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvshare_status.h"

/* The flag is cleared before the callback runs: whatever a sender pushed
 * before it found the flag set, the callback sees; a sender that finds it
 * clear writes the eventfd again. */
static void on_readable(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    loop_wake_t *w = h->data;
    uint64_t n;
    ssize_t r = read(w->fd, &n, sizeof(n));
    (void)r; /* EAGAIN: a wake-up already taken */
    atomic_store(&w->pending, false);
    w->cb(w);
}

int loop_wake_init(uv_loop_t *loop, loop_wake_t *w, loop_wake_cb cb)
{
    w->cb = cb;
    w->closed = NULL;
    w->holds = 0;
    atomic_init(&w->pending, false);
    w->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->fd < 0)
        return errno == ENOMEM ? KVS_ENOMEM : KVS_EIO;
    if (uv_poll_init(loop, &w->poll, w->fd) != 0) {
        close(w->fd);
        w->fd = -1;
        return KVS_EIO;
    }
    w->poll.data = w;
    /* Fails only for events other than these (libuv 1.x). */
    (void)uv_poll_start(&w->poll, UV_READABLE, on_readable);
    return 0;
}

void loop_wake_send(loop_wake_t *w)
{
    if (atomic_exchange(&w->pending, true))
        return; /* a wake-up is on its way and the callback has not started */
    uint64_t one = 1;
    while (write(w->fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

void loop_wake_ref(loop_wake_t *w)
{
    uv_ref((uv_handle_t *)&w->poll);
}

void loop_wake_unref(loop_wake_t *w)
{
    uv_unref((uv_handle_t *)&w->poll);
}

void loop_wake_hold(loop_wake_t *w)
{
    if (w->holds++ == 0)
        loop_wake_ref(w);
}

void loop_wake_release(loop_wake_t *w)
{
    if (w->holds > 0 && --w->holds == 0)
        loop_wake_unref(w);
}

static void on_close(uv_handle_t *h)
{
    loop_wake_t *w = h->data;
    close(w->fd);
    w->fd = -1;
    if (w->closed)
        w->closed(w);
}

void loop_wake_close(loop_wake_t *w, loop_wake_cb closed)
{
    w->closed = closed;
    uv_close((uv_handle_t *)&w->poll, on_close);
}
