/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the cluster client's tests share: a reply kept by its callback, and
 * running the test's loop until a reply came or a time passed.
 */
#ifndef KVS_TEST_CLUSTER_LOOP_H
#define KVS_TEST_CLUSTER_LOOP_H

#include <stdint.h>
#include <string.h>
#include <uv.h>

#include "now.h"

typedef struct reply {
    int done;
    int status;
    char data[256];
    size_t len;
} reply_t;

/* A cluster callback (arg: a reply_t) keeping the reply's first bytes. */
static inline void on_reply(void *arg, int status, const char *data, size_t len)
{
    reply_t *r = arg;
    r->done = 1;
    r->status = status;
    r->len = len < sizeof r->data ? len : sizeof r->data;
    if (data)
        memcpy(r->data, data, r->len);
}

/* Runs the loop until *done or ms pass. Returns *done. */
static inline int run_until(uv_loop_t *loop, const int *done, int ms)
{
    int64_t end = now_ms() + ms;
    while (!*done && now_ms() < end)
        uv_run(loop, UV_RUN_ONCE);
    return *done;
}

/* Runs the loop for ms (the client's timer refreshes the map meanwhile). */
static inline void run_for(uv_loop_t *loop, int ms)
{
    int64_t end = now_ms() + ms;
    while (now_ms() < end)
        uv_run(loop, UV_RUN_ONCE);
}

#endif
