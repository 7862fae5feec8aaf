/* SPDX-License-Identifier: Apache-2.0 */
/* loop_wake: no wake-up lost across threads, coalescing, ref, holds and close. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <uv.h>

#include "check_main.h"
#include "loop_wake.h"

enum { SENDERS = 4, PER_SENDER = 20000 };

typedef struct {
    loop_wake_t w;
    pthread_mutex_t mu;
    unsigned pushed; /* under mu: items pushed and not yet taken */
    unsigned taken;  /* on the loop */
    unsigned calls;  /* callbacks */
    unsigned again;  /* sends left to make from inside the callback */
    bool closed;
} ctx_t;

static void on_closed(loop_wake_t *w)
{
    ((ctx_t *)w->data)->closed = true;
}

static void on_wake(loop_wake_t *w)
{
    ctx_t *c = w->data;
    c->calls++;
    pthread_mutex_lock(&c->mu);
    c->taken += c->pushed;
    c->pushed = 0;
    pthread_mutex_unlock(&c->mu);
    if (c->again > 0) {
        c->again--;
        loop_wake_send(w); /* made while the callback runs: it runs again */
    } else if (c->taken == SENDERS * PER_SENDER) {
        loop_wake_close(w, on_closed); /* the loop ends once it is closed */
    }
}

static void *sender(void *arg)
{
    ctx_t *c = arg;
    for (int i = 0; i < PER_SENDER; i++) {
        pthread_mutex_lock(&c->mu);
        c->pushed++;
        pthread_mutex_unlock(&c->mu);
        loop_wake_send(&c->w);
        if (i % 64 == 0)
            sched_yield(); /* let the loop in between sends, too */
    }
    return NULL;
}

static void ctx_init(ctx_t *c, uv_loop_t *loop)
{
    *c = (ctx_t){0};
    pthread_mutex_init(&c->mu, NULL);
    ck_assert_int_eq(loop_wake_init(loop, &c->w, on_wake), 0);
    c->w.data = c;
}

/* Four threads push 80,000 items, each followed by a send: the loop takes
 * every one (a lost wake-up leaves it asleep for good: the case's timeout
 * fails it), in fewer callbacks than sends. */
START_TEST(test_no_wake_up_lost)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ctx_t c;
    ctx_init(&c, &loop);
    pthread_t t[SENDERS];
    for (int i = 0; i < SENDERS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, sender, &c), 0);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    for (int i = 0; i < SENDERS; i++)
        pthread_join(t[i], NULL);
    ck_assert_uint_eq(c.taken, SENDERS * PER_SENDER);
    ck_assert_uint_eq(c.pushed, 0);
    ck_assert(c.closed);
    ck_assert_uint_ge(c.calls, 1);
    ck_assert_uint_le(c.calls, SENDERS * PER_SENDER);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

/* A send from inside the callback calls it again, on a later turn. */
START_TEST(test_send_from_the_callback)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ctx_t c;
    ctx_init(&c, &loop);
    c.again = 3;
    c.taken = SENDERS * PER_SENDER; /* the fourth call closes */
    loop_wake_send(&c.w);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_uint_eq(c.calls, 4);
    ck_assert(c.closed);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

static void *send_once(void *arg)
{
    ctx_t *c = arg;
    pthread_mutex_lock(&c->mu);
    c->pushed = SENDERS * PER_SENDER;
    pthread_mutex_unlock(&c->mu);
    loop_wake_send(&c->w);
    return NULL;
}

/* Unreferenced, the handle lets the loop end; referenced, the loop waits
 * for a send from another thread. */
START_TEST(test_ref_and_unref)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ctx_t c;
    ctx_init(&c, &loop);
    loop_wake_unref(&c.w);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_uint_eq(c.calls, 0);
    loop_wake_ref(&c.w);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, send_once, &c), 0);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    pthread_join(t, NULL);
    ck_assert_uint_eq(c.calls, 1);
    ck_assert_uint_eq(c.taken, SENDERS * PER_SENDER);
    ck_assert(c.closed);
    ck_assert_int_eq(c.w.fd, -1);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

/* Holds count: the handle keeps the loop alive from the first hold to the
 * last release, and a release without a hold changes nothing. */
START_TEST(test_hold_and_release_count)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ctx_t c;
    ctx_init(&c, &loop);
    loop_wake_unref(&c.w);
    loop_wake_release(&c.w); /* none held: stays unreferenced */
    ck_assert(!uv_has_ref((uv_handle_t *)&c.w.poll));
    loop_wake_hold(&c.w);
    loop_wake_hold(&c.w);
    ck_assert(uv_has_ref((uv_handle_t *)&c.w.poll));
    loop_wake_release(&c.w);
    ck_assert(uv_has_ref((uv_handle_t *)&c.w.poll));
    loop_wake_release(&c.w);
    ck_assert(!uv_has_ref((uv_handle_t *)&c.w.poll));
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_uint_eq(c.calls, 0);
    loop_wake_hold(&c.w); /* the loop now waits for the send */
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, send_once, &c), 0);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    pthread_join(t, NULL);
    ck_assert_uint_eq(c.calls, 1);
    ck_assert(c.closed);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    pthread_mutex_destroy(&c.mu);
}
END_TEST

static Suite *loop_wake_suite(void)
{
    Suite *s = suite_create("loop_wake");
    TCase *tc = tcase_create("loop_wake");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_no_wake_up_lost);
    tcase_add_test(tc, test_send_from_the_callback);
    tcase_add_test(tc, test_ref_and_unref);
    tcase_add_test(tc, test_hold_and_release_count);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(loop_wake_suite)
