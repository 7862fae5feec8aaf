/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fair turns and the hold (session.h, server.h: server_sched_t). The ready
 * queue, the held sessions, the hold timer and the spacing of large work
 * live here, below every layer that holds or releases a session; a turn,
 * background work and the end of a reason's hold are the hooks the layers
 * above set (session_hooks_t).
 */
#include "session.h"

#include <stdlib.h>

#include "kvshare_status.h"
#include "log.h"

/* The loop handles of the ready queue and of the hold, in memory of their
 * own: closing them must not wait for server_free. */
struct session_sched {
    uv_idle_t turn;
    uv_timer_t hold;
    int open; /* handles not closed yet */
};

static void on_sched_close(uv_handle_t *h)
{
    struct session_sched *sc = h->data;
    if (--sc->open == 0)
        free(sc);
}

/* Lazily, the first time a session has a backlog or is held. */
static int sched_init(server_t *srv)
{
    if (srv->sched.handles)
        return 0;
    struct session_sched *sc = calloc(1, sizeof(*sc));
    if (!sc)
        return KVS_ENOMEM;
    if (uv_idle_init(srv->loop, &sc->turn) != 0) {
        free(sc);
        return KVS_EIO;
    }
    sc->open = 1;
    if (uv_timer_init(srv->loop, &sc->hold) != 0) {
        sc->turn.data = sc;
        uv_close((uv_handle_t *)&sc->turn, on_sched_close);
        return KVS_EIO;
    }
    sc->open = 2;
    sc->turn.data = srv;
    sc->hold.data = srv;
    srv->sched.hold_due = 0;
    srv->sched.handles = sc;
    return 0;
}

void session_sched_close(server_t *srv)
{
    if (!srv)
        return;
    struct session_sched *sc = srv->sched.handles;
    if (!sc)
        return;
    sc->turn.data = sc;
    sc->hold.data = sc;
    uv_close((uv_handle_t *)&sc->turn, on_sched_close);
    uv_close((uv_handle_t *)&sc->hold, on_sched_close);
    srv->sched.handles = NULL;
}

static void turn_of(session_t *s)
{
    s->srv->sched.hooks->turn(s);
}

/* --- the ready queue (fair turns) --- */

static void ready_remove(session_t *s)
{
    if (!s->turn.in_ready)
        return;
    list_remove(&s->srv->sched.ready, &s->turn.ready_link);
    s->turn.in_ready = false;
}

static void on_turn(uv_idle_t *h)
{
    server_t *srv = h->data;
    server_sched_t *sc = &srv->sched;
    /* One turn for each session queued now; those that queue again wait
     * for the next iteration, after the loop has polled everyone. */
    session_t *last = LIST_LAST(&sc->ready, session_t, turn.ready_link);
    while (!list_empty(&sc->ready)) {
        session_t *s = LIST_FIRST(&sc->ready, session_t, turn.ready_link);
        bool was_last = s == last;
        ready_remove(s);
        turn_of(s);
        if (was_last)
            break;
    }
    /* Background work (a closed session's pins), one bounded step per
     * loop turn. */
    bool more = sc->hooks->background && sc->hooks->background(srv);
    if (list_empty(&sc->ready) && !more)
        uv_idle_stop(h);
}

void session_ready(session_t *s)
{
    server_t *srv = s->srv;
    if (s->turn.in_ready)
        return;
    if (sched_init(srv) != 0) {
        /* Without the machinery, the old way: its frames now. */
        LOG_ERROR("session %llu: no loop handles for its turn; answering it at once",
                  (unsigned long long)s->id);
        turn_of(s);
        return;
    }
    list_push_back(&srv->sched.ready, &s->turn.ready_link);
    s->turn.in_ready = true;
    uv_idle_start(&srv->sched.handles->turn, on_turn);
}

int session_background(server_t *srv)
{
    int rc = sched_init(srv);
    if (rc != 0)
        return rc;
    uv_idle_start(&srv->sched.handles->turn, on_turn);
    return 0;
}

void session_run_ready(server_t *srv)
{
    while (!list_empty(&srv->sched.ready)) {
        session_t *s = LIST_FIRST(&srv->sched.ready, session_t, turn.ready_link);
        ready_remove(s);
        turn_of(s);
    }
}

/* --- the spacing of large work --- */

uint64_t session_spacing_next(const session_t *s)
{
    uint64_t all = s->srv->sched.walk_next_ns;
    return s->turn.walk_next_ns > all ? s->turn.walk_next_ns : all;
}

uint64_t session_spacing_until(const session_t *s, uint64_t now_ns)
{
    uint64_t next = session_spacing_next(s);
    uint64_t wait_ns = next > now_ns ? next - now_ns : 0;
    return uv_now(s->srv->loop) + (wait_ns + 999999) / 1000000 + 1;
}

void session_spacing_done(session_t *s, uint64_t t0, uint64_t t1)
{
    uint64_t d = t1 - t0;
    s->turn.walk_next_ns = t1 + d * SERVER_WALK_SPACING;
    s->srv->sched.walk_next_ns = t1 + d * SERVER_WALK_SPACING_ALL;
}

/* --- the hold --- */

static void on_hold_timer(uv_timer_t *t);

/* The next step of work cut into steps (Clear, Commit, Alloc, Tree) runs
 * no earlier than after the loop's next poll: a step run by a read (in the
 * poll) and the next one run before the next poll would be one stretch of
 * work without answering anyone. Until then its deadline arms nothing (the
 * timer would fire again at once, in the same iteration): the poll's
 * prepare arms it (session_hold_polled). Without the loop watch there is no
 * count of polls, and no wait. */
static bool waits_for_poll(const session_t *h)
{
    const server_t *srv = h->srv;
    session_hold_reason_t why = h->turn.held;
    bool step = why == SESSION_HOLD_CLEAR || why == SESSION_HOLD_COMMIT ||
                why == SESSION_HOLD_ALLOC || why == SESSION_HOLD_TREE;
    return step && srv->net.watch && h->turn.polls == srv->sched.loop_polls;
}

/* Arms the hold timer for the earliest deadline among held sessions. */
static void hold_arm(server_t *srv)
{
    server_sched_t *sc = &srv->sched;
    uint64_t due = 0;
    LIST_FOR_EACH (&sc->held, session_t, turn.held_link, h) {
        if (waits_for_poll(h)) {
            sc->hold_after_poll = true;
            continue;
        }
        if (h->turn.until_ms && (due == 0 || h->turn.until_ms < due))
            due = h->turn.until_ms;
    }
    if (due == sc->hold_due || !sc->handles)
        return;
    sc->hold_due = due;
    if (due == 0) {
        uv_timer_stop(&sc->handles->hold);
        return;
    }
    uint64_t now = uv_now(srv->loop);
    uv_timer_start(&sc->handles->hold, on_hold_timer, due > now ? due - now : 0, 0);
}

static void held_remove(session_t *s)
{
    if (s->turn.held == SESSION_HOLD_NONE)
        return;
    list_remove(&s->srv->sched.held, &s->turn.held_link);
    s->turn.held = SESSION_HOLD_NONE;
    s->turn.until_ms = 0;
}

void session_unschedule(session_t *s)
{
    held_remove(s);
    ready_remove(s);
}

void session_hold(session_t *s, session_hold_reason_t why, uint64_t until_ms)
{
    server_t *srv = s->srv;
    server_sched_t *sc = &srv->sched;
    held_remove(s);
    s->turn.held = why;
    s->turn.until_ms = until_ms;
    s->turn.polls = sc->loop_polls;
    /* Oldest first. Large work goes round-robin between the sessions that
     * wait for it (on_hold_timer lets one go per spacing), and one let go
     * that still found the spacing running keeps its place at the front. */
    if (why == SESSION_HOLD_SPACING && s->turn.rerun == SESSION_HOLD_SPACING)
        list_push_front(&sc->held, &s->turn.held_link);
    else
        list_push_back(&sc->held, &s->turn.held_link);
    if (until_ms && waits_for_poll(s) && sched_init(srv) == 0) {
        sc->hold_after_poll = true;
        return;
    }
    if (until_ms && sched_init(srv) == 0 && (sc->hold_due == 0 || until_ms < sc->hold_due)) {
        sc->hold_due = until_ms;
        uint64_t now = uv_now(srv->loop);
        uv_timer_start(&sc->handles->hold, on_hold_timer, until_ms > now ? until_ms - now : 0, 0);
    }
}

void session_release(session_t *s)
{
    session_hold_reason_t why = s->turn.held;
    if (why == SESSION_HOLD_NONE || s->closing)
        return;
    s->turn.rerun = why;
    void (*released)(server_t *, session_t *) = s->srv->sched.hooks->released[why];
    if (released)
        released(s->srv, s); /* a held Lookup's wait ends with its hold */
    held_remove(s);
    session_ready(s);
}

void session_release_all(server_t *srv, session_hold_reason_t why)
{
    LIST_FOR_EACH_SAFE (&srv->sched.held, session_t, turn.held_link, h, next)
        if (h->turn.held == why)
            session_release(h);
    hold_arm(srv);
}

void session_hold_polled(server_t *srv)
{
    if (!srv->sched.hold_after_poll)
        return;
    srv->sched.hold_after_poll = false;
    srv->sched.hold_due = 0; /* re-armed from the deadlines */
    hold_arm(srv);
}

/* Deadlines passed: those sessions run again (a Lookup answers with what
 * is cached, a spaced request does its work). */
static void on_hold_timer(uv_timer_t *t)
{
    server_t *srv = t->data;
    uint64_t now = uv_now(srv->loop), now_ns = uv_hrtime();
    bool spacing_taken = false;
    srv->sched.hold_due = 0;
    LIST_FOR_EACH_SAFE (&srv->sched.held, session_t, turn.held_link, h, next) {
        /* One piece of large work per spacing: the oldest waiter's. The
         * others keep their places and look again once it has run. Every
         * spacing waiter waits for the same thing, the spacing's end, so
         * its own deadline does not choose who goes: deadlines are loop
         * milliseconds rounded up when each was held, and a newer waiter's
         * could fall a millisecond before an older one's, letting the newer
         * go first at every spacing (a session pipelining Trees then kept
         * another's large Lookup waiting for several of them). */
        if (h->turn.held == SESSION_HOLD_SPACING) {
            if (spacing_taken || now_ns < session_spacing_next(h)) {
                h->turn.until_ms = session_spacing_until(h, now_ns);
                continue;
            }
            spacing_taken = true;
            session_release(h);
            continue;
        }
        if (!h->turn.until_ms || h->turn.until_ms > now || waits_for_poll(h))
            continue;
        session_release(h);
    }
    hold_arm(srv);
}
