/* SPDX-License-Identifier: Apache-2.0 */
#include "session_io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dispatch.h"
#include "handlers.h"
#include "inflight.h"
#include "log.h"
#include "peer.h"
#include "store.h"

/* Bytes asked of libuv per read when no bigger frame is pending. */
#define SESSION_READ_CHUNK 65536

/* Pending reply bytes that make session_process send before it answers the
 * next frame of the same read. */
#define SESSION_FLUSH_BYTES 65536

typedef struct session_write {
    uv_write_t req;
    size_t len;
    uint8_t data[];
} session_write_t;

static void link_session(server_t *srv, session_t *s)
{
    s->srv = srv;
    s->id = ++srv->next_session_id;
    list_push_front(&srv->sessions, &s->link);
    srv->metrics.sessions_total++;
}

static void unlink_session(session_t *s)
{
    server_t *srv = s->srv;
    list_remove(&srv->sessions, &s->link);
}

static void destroy(session_t *s)
{
    for (size_t i = 0; i < s->n_fds; i++)
        close(s->fds[i]);
    frame_buf_release(&s->in);
    frame_buf_release(&s->out);
    session_holdings_free(s);
    free(s->ident);
    free(s);
}

int session_new(server_t *srv, session_t **out)
{
    if (!srv || !out)
        return KVS_EINVAL;
    session_t *s = calloc(1, sizeof(*s));
    if (!s)
        return KVS_ENOMEM;
    s->rank = -1; /* no rank until its Hello says one */
    link_session(srv, s);
    *out = s;
    return 0;
}

/* --- buffer memory across sessions --- */

static size_t held_bytes(const session_t *s)
{
    /* A held Lookup keeps its prompt (inflight.h) besides its frame. */
    size_t wait = s->wait ? sizeof(*s->wait) + s->wait->n_tokens * sizeof(uint32_t) : 0;
    /* So does its Tree walk (handler_tree). */
    return s->in.cap + s->out.cap + session_scratch_bytes(s) + s->sock.queued + wait +
           handler_tree_bytes(s);
}

/* Counts s's buffers again into the server's total. */
static void account(session_t *s)
{
    if (s->closing)
        return;
    size_t now = held_bytes(s);
    s->srv->net.buf_bytes = s->srv->net.buf_bytes - s->sock.buf_bytes + now;
    s->sock.buf_bytes = now;
}

/* Gives back buffers grown by a large exchange once they are empty, and
 * the room a large request reserved and did not fill: a pinning Lookup
 * reserves a pin per block of its prompt, a miss pins none (8 bytes a
 * block: 8.9 MiB kept per idle session after one miss of a 1M-block
 * prompt), an Alloc a WRITING slot per block until they are committed. */
static void shrink(session_t *s)
{
    /* A Commit or an Alloc in pieces keeps its ids in the scratch, and
     * the pins or WRITING slots it reserved, until its last piece. */
    if (s->steps.commit || s->steps.alloc)
        return;
    if (s->in.head == s->in.len && s->in.cap > SESSION_KEEP_BYTES)
        frame_buf_release(&s->in);
    if (s->out.head == s->out.len && s->out.cap > SESSION_KEEP_BYTES)
        frame_buf_release(&s->out);
    session_holdings_shrink(s);
    account(s);
}

/* While the sessions' buffers are over max_buffer_memory, closes the
 * session holding the most (counted, logged at most once a second). Returns
 * false, closing nothing more, when that session is `spare` (one in its
 * alloc callback, which libuv does not let us close there). */
static bool enforce_budget(server_t *srv, const session_t *spare)
{
    while (srv->net.buf_bytes > srv->cfg.max_buffer_memory) {
        session_t *big = NULL;
        LIST_FOR_EACH (&srv->sessions, session_t, link, s)
            if (!s->closing && (!big || s->sock.buf_bytes > big->sock.buf_bytes))
                big = s;
        if (!big || big->sock.buf_bytes == 0)
            return true;
        if (big == spare)
            return false;
        srv->metrics.sessions_dropped_memory++;
        uint64_t now = uv_now(srv->loop);
        if (now - srv->net.budget_log_ms >= 1000 || srv->net.budget_log_ms == 0) {
            srv->net.budget_log_ms = now;
            LOG_WARN("session buffers at %zu bytes, over max_buffer_memory (%zu): closing "
                     "session %llu (pid %d), which holds %zu; %llu closed so far for this",
                     srv->net.buf_bytes, srv->cfg.max_buffer_memory, (unsigned long long)big->id,
                     (int)big->peer.pid, big->sock.buf_bytes,
                     (unsigned long long)srv->metrics.sessions_dropped_memory);
        }
        session_goodbye(big, KVS_ELIMIT,
                        "kvshared's session buffers are over max_buffer_memory and this "
                        "connection holds the most (a large partial request or unread "
                        "replies); closing it");
        session_close(big, "over the buffer budget");
    }
    return true;
}

static void drain_in_steps(server_t *srv, uint64_t session_id, unsigned long long n_pins);

/* Gives back everything the session holds: its WRITING blocks to the pool,
 * its pins to the index. Linear in the holdings, not in the pool; many pins
 * go in bounded steps on later loop turns (store_session_end). */
static void release_all(session_t *s)
{
    server_t *srv = s->srv;
    uint32_t n_writing = s->own.n_writing;
    unsigned long long n_pins = (unsigned long long)s->own.pins.total;

    /* A rank's session frees only what it holds, as any session does: a
     * second session that said the same rank and hung up must not take
     * its group's blocks away (store.h). */
    if (store_session_end(srv->store, s))
        drain_in_steps(srv, s->id, n_pins);
    if (n_writing || n_pins)
        LOG_DEBUG("session %llu released %u writing blocks and %llu pins",
                  (unsigned long long)s->id, n_writing, n_pins);
}

static void on_close(uv_handle_t *h)
{
    destroy(h->data);
}

void session_close(session_t *s, const char *reason)
{
    if (!s || s->closing)
        return;
    s->closing = true;
    handler_tree_gone(s);
    s->srv->net.buf_bytes -= s->sock.buf_bytes;
    s->sock.buf_bytes = 0;
    release_all(s);
    session_unschedule(s);
    unlink_session(s);
    LOG_DEBUG("session %llu (worker '%s', pid %d) closed: %s", (unsigned long long)s->id,
              s->worker[0] ? s->worker : "?", (int)s->peer.pid, reason);
    if (s->sock.has_pipe) {
        uv_read_stop((uv_stream_t *)&s->sock.pipe);
        uv_close((uv_handle_t *)&s->sock.pipe, on_close);
    } else {
        destroy(s);
    }
}

/* --- I/O --- */

static void on_write(uv_write_t *req, int status)
{
    session_write_t *w = (session_write_t *)req;
    session_t *s = req->handle->data;
    if (!s->closing) {
        s->sock.queued -= w->len;
        account(s);
    }
    if (status < 0 && status != UV_ECANCELED)
        session_close(s, uv_strerror(status));
    else if (s->sock.eof && !s->turn.in_ready && !session_held(s) &&
             req->handle->write_queue_size == 0)
        session_close(s, "client closed (after its replies were sent)");
    free(w);
}

/* Sends the pending output (a Hello reply) with the exported fds attached,
 * synchronously: Hello is the first request, so nothing is queued before it
 * and the reply is small enough for an empty socket buffer. */
static int send_with_fds(session_t *s)
{
    int fd = -1;
    if (uv_fileno((uv_handle_t *)&s->sock.pipe, &fd) != 0)
        return KVS_EIO;
    struct iovec iov = {s->out.data + s->out.head, s->out.len - s->out.head};
    union {
        char buf[CMSG_SPACE(sizeof(int) * SESSION_MAX_FDS)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof(control));
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * s->n_fds);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * s->n_fds);
    memcpy(CMSG_DATA(cm), s->fds, sizeof(int) * s->n_fds);

    ssize_t n;
    do {
        n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    for (size_t i = 0; i < s->n_fds; i++)
        close(s->fds[i]);
    s->n_fds = 0;
    if (n <= 0)
        return KVS_EIO;
    s->out.head += (size_t)n;
    if (s->out.head == s->out.len)
        frame_buf_reset(&s->out);
    return 0;
}

/* Writes what is in `out`: directly when nothing is queued, else (or for
 * what the socket did not take) through a queued uv_write. */
static void flush(session_t *s)
{
    if (!s->sock.has_pipe || s->closing)
        return;
    uv_stream_t *stream = (uv_stream_t *)&s->sock.pipe;
    size_t n = s->out.len - s->out.head;
    if (n == 0)
        return;
    const uint8_t *p = s->out.data + s->out.head;
    if (stream->write_queue_size == 0) {
        uv_buf_t buf = uv_buf_init((char *)p, (unsigned)n);
        int w = uv_try_write(stream, &buf, 1);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && w != UV_EAGAIN) {
            frame_buf_reset(&s->out);
            session_close(s, uv_strerror(w));
            return;
        }
    }
    if (n > 0) {
        if (stream->write_queue_size + n > s->srv->cfg.max_output) {
            s->srv->metrics.sessions_dropped++;
            LOG_WARN("session %llu (%s): %zu reply bytes unread, over the %zu-byte limit; "
                     "disconnecting a client that stopped reading",
                     (unsigned long long)s->id, s->worker[0] ? s->worker : "?",
                     stream->write_queue_size + n, s->srv->cfg.max_output);
            frame_buf_reset(&s->out);
            session_close(s, "output buffer limit");
            return;
        }
        session_write_t *w = malloc(sizeof(*w) + n);
        if (!w) {
            frame_buf_reset(&s->out);
            session_close(s, "out of memory");
            return;
        }
        memcpy(w->data, p, n);
        w->len = n;
        s->sock.queued += n;
        uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)n);
        int rc = uv_write(&w->req, stream, &buf, 1, on_write);
        if (rc != 0) {
            s->sock.queued -= n;
            free(w);
            frame_buf_reset(&s->out);
            session_close(s, uv_strerror(rc));
            return;
        }
    }
    frame_buf_reset(&s->out);
}

void session_goodbye(session_t *s, int status, const char *message)
{
    if (!s || s->closing)
        return;
    if (dispatch_error_reply(s, 0, status, message) == 0)
        flush(s);
}

/* Whether a whole frame (or a header over the limit) waits in `in`. */
static bool frame_waiting(const session_t *s)
{
    size_t avail = s->in.len - s->in.head;
    if (avail < FRAME_HEADER_BYTES)
        return false;
    uint32_t len = frame_get_len(s->in.data + s->in.head);
    return len > s->srv->cfg.max_frame || avail - FRAME_HEADER_BYTES >= len;
}

/* Answers whole frames of `in`: all of them, or when `bounded` at most one
 * turn's worth (SESSION_TURN_*). *more says
 * whether frames are left for another turn. A held session answers
 * nothing (its kept frame runs again once released). */
static int process(session_t *s, bool bounded, bool *more)
{
    size_t frames = 0, bytes = 0;
    uint64_t clock_ns = 0, start_ns = 0; /* read once a frame is there (dispatch_frame) */
    *more = false;
    for (;;) {
        if (session_held(s) || s->closing)
            return 0;
        if (bounded && (frames >= SESSION_TURN_FRAMES || bytes >= SESSION_TURN_BYTES ||
                        (frames > 0 && clock_ns - start_ns >= SESSION_TURN_NS))) {
            *more = frame_waiting(s);
            return 0;
        }
        const uint8_t *body;
        uint32_t len;
        size_t head = s->in.head, in_len = s->in.len;
        int rc = frame_next(&s->in, s->srv->cfg.max_frame, &body, &len);
        if (rc == 0)
            return 0;
        if (rc < 0) {
            char msg[200];
            uint32_t asked = frame_get_len(s->in.data + s->in.head);
            s->srv->metrics.protocol_errors++;
            snprintf(msg, sizeof(msg),
                     "frame length %u is over the limit of %u bytes (kvshared --max-frame); "
                     "closing the connection: the stream cannot be trusted past it",
                     asked, s->srv->cfg.max_frame);
            dispatch_error_reply(s, 0, KVS_ETOOBIG, msg);
            return KVS_ETOOBIG;
        }
        /* Large frames are spaced like whole-index walks (server.h);
         * sessions without a socket (tests) are never held for it. */
        bool large = s->sock.has_pipe && len >= SESSION_LARGE_FRAME;
        size_t out_len = s->out.len, reply_bytes = 0;
        if (clock_ns == 0)
            clock_ns = start_ns = uv_hrtime();
        uint64_t t0 = clock_ns;
        if (large && t0 < session_spacing_next(s)) {
            s->srv->metrics.requests_spaced++;
            session_hold(s, SESSION_HOLD_SPACING, session_spacing_until(s, t0));
            rc = DISPATCH_HELD;
        } else {
            rc = dispatch_frame(s, body, len, &clock_ns);
        }
        if (rc == DISPATCH_HELD) {
            /* The frame stays (frame_next did not move it) for its run
             * after the release. */
            s->in.head = head;
            s->in.len = in_len;
            return 0;
        }
        session_ran(s);
        if (s->out.len > out_len)
            reply_bytes = s->out.len - out_len;
        if (large) /* clock_ns: when its reply was built */
            session_spacing_done(s, t0, clock_ns);
        s->srv->metrics.bytes_in += FRAME_HEADER_BYTES + len;
        if (s->sock.has_pipe)
            s->sock.last_request_ms = uv_now(s->srv->loop);
        frames++;
        /* Work, roughly: the bytes decoded and the bytes of reply built. */
        bytes += FRAME_HEADER_BYTES + (size_t)len + reply_bytes;
        if (rc != 0)
            return rc;
        /* A reply can be thousands of times its request (Stats, Tree): send
         * as the replies of one read grow, so that --max-output bounds what
         * a client that does not read makes the daemon hold. */
        if (s->sock.has_pipe && s->n_fds == 0 && s->out.len - s->out.head >= SESSION_FLUSH_BYTES) {
            flush(s);
            if (s->closing)
                return 0;
        }
        if (s->n_fds > 0) {
            if (s->sock.has_pipe) {
                rc = send_with_fds(s);
                if (rc != 0)
                    return rc;
            } else {
                for (size_t i = 0; i < s->n_fds; i++)
                    close(s->fds[i]);
                s->n_fds = 0;
            }
        }
    }
}

int session_process(session_t *s)
{
    if (s->sock.broken)
        return s->sock.broken;
    bool more;
    return process(s, false, &more);
}

int session_broken(const session_t *s)
{
    return s->sock.broken;
}

int session_feed(session_t *s, const uint8_t *bytes, size_t len)
{
    if (s->sock.broken)
        return s->sock.broken;
    int rc = frame_buf_reserve(&s->in, len);
    if (rc != 0)
        return rc;
    if (len)
        memcpy(s->in.data + s->in.len, bytes, len);
    s->in.len += len;
    return session_process(s);
}

/* A read of s answered frames in this loop iteration. libuv reads a stream
 * again, up to 32 times, while each read fills the buffer it was given,
 * and a read that ends a frame fills it (on_alloc asks for no more than the
 * frame): a client that sends its next request while the reply's turn
 * ends would have up to 16 turns in a row without the loop polling
 * anyone else (16 Pins of 65,536 blocks: 180 ms under AddressSanitizer).
 * One read that answers per session per poll, as on_turn gives one turn:
 * an empty buffer ends libuv's reads, the socket stays watched, and the
 * next poll finds its bytes. Without the loop watch there is no count of
 * polls, and no wait. */
static bool answered_this_poll(const session_t *s)
{
    return s->srv->net.watch && s->sock.answered_polls == s->srv->sched.loop_polls;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    session_t *s = h->data;
    size_t want = SESSION_READ_CHUNK, room_max = SIZE_MAX;
    if (answered_this_poll(s)) {
        s->sock.yielding = true;
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    size_t avail = s->in.len - s->in.head;
    (void)suggested;
    if (avail >= FRAME_HEADER_BYTES) {
        /* Room for the whole pending frame at once: one realloc, not log(n);
         * and no read past its end, so that the buffer is empty once it is
         * answered and the next frame's bytes are never moved down (a
         * memmove of up to a frame, in one piece of loop time). */
        uint32_t len = frame_get_len(s->in.data + s->in.head);
        if (len <= s->srv->cfg.max_frame && len + FRAME_HEADER_BYTES > avail &&
            len + FRAME_HEADER_BYTES - avail > want) {
            want = len + FRAME_HEADER_BYTES - avail;
            room_max = want;
        }
    }
    if (frame_buf_reserve(&s->in, want) != 0) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    account(s);
    if (!enforce_budget(s->srv, s)) {
        /* s holds the most: no buffer, and on_read (UV_ENOBUFS) closes it. */
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    size_t room = s->in.cap - s->in.len;
    *buf =
        uv_buf_init((char *)s->in.data + s->in.len, (unsigned)(room < room_max ? room : room_max));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void start_reading(session_t *s)
{
    if (s->sock.reading || s->sock.eof || s->closing)
        return;
    int rc = uv_read_start((uv_stream_t *)&s->sock.pipe, on_alloc, on_read);
    if (rc != 0) {
        session_close(s, uv_strerror(rc));
        return;
    }
    s->sock.reading = true;
}

static void stop_reading(session_t *s)
{
    if (!s->sock.reading)
        return;
    uv_read_stop((uv_stream_t *)&s->sock.pipe);
    s->sock.reading = false;
}

/* One turn of s: at most a turn's worth of frames answered, replies sent.
 * A session with frames left stops reading (its socket buffers push back on
 * the client) and queues for another turn after everyone else's; a held
 * one reads nothing until it is released. A session without a socket whose
 * stream goes bad keeps the error for its owner (session_broken). */
void session_take_turn(session_t *s)
{
    server_t *srv = s->srv;
    bool more;
    if (s->sock.broken)
        return;
    int rc = process(s, true, &more);
    /* Replies of a pipeline that goes on in a later turn wait for it (up
     * to SESSION_FLUSH_BYTES, which process sends itself): one write and
     * one wake-up of the client per pipeline, not one per turn. */
    if (s->n_fds == 0 && (!more || rc != 0))
        flush(s);
    if (s->closing)
        return;
    shrink(s);
    enforce_budget(srv, NULL);
    if (s->closing)
        return;
    if (rc != 0) {
        if (!s->sock.has_pipe) {
            s->sock.broken = rc;
            return;
        }
        session_close(s, rc == KVS_ETOOBIG ? "frame over the limit" : "undecodable frame");
        return;
    }
    if (session_held(s)) {
        if (s->sock.has_pipe)
            stop_reading(s);
        return;
    }
    if (more) {
        if (s->sock.has_pipe)
            stop_reading(s);
        session_ready(s);
        return;
    }
    if (!s->sock.has_pipe)
        return;
    if (s->sock.eof) {
        if (s->sock.pipe.write_queue_size == 0)
            session_close(s, "client closed");
        return;
    }
    start_reading(s);
}

/* Many pins of a closed session: the store lets go of them a step per loop
 * turn (on_turn), between the other sessions' turns. */
static void drain_in_steps(server_t *srv, uint64_t session_id, unsigned long long n_pins)
{
    if (srv->stopping) { /* no session is served any more: no turn to wait for */
        while (store_drain_step(srv->store))
            ;
        return;
    }
    if (session_background(srv) == 0)
        return;
    LOG_ERROR("session %llu: no loop handle for releasing its %llu pins in steps; releasing "
              "them at once",
              (unsigned long long)session_id, n_pins);
    while (store_drain_step(srv->store))
        ;
}

/* Closes the sessions that sent no request for idle_timeout_ms (not those
 * whose requests wait for their turn). */
static void on_idle_sweep(uv_timer_t *t)
{
    server_t *srv = t->data;
    uint64_t now = uv_now(srv->loop);
    LIST_FOR_EACH_SAFE (&srv->sessions, session_t, link, s, next) {
        if (!s->sock.has_pipe || s->closing || s->turn.in_ready || session_held(s) ||
            now - s->sock.last_request_ms < srv->cfg.idle_timeout_ms)
            continue;
        srv->metrics.sessions_idle_closed++;
        LOG_INFO("session %llu (pid %d): no request for %u ms (idle_timeout_ms); closing it",
                 (unsigned long long)s->id, (int)s->peer.pid, srv->cfg.idle_timeout_ms);
        session_goodbye(s, KVS_ETIMEDOUT,
                        "closed by kvshared after idle_timeout_ms without a request; "
                        "reconnect to go on");
        session_close(s, "idle timeout");
    }
}

int session_idle_start(server_t *srv)
{
    if (srv->cfg.idle_timeout_ms == 0 || srv->net.idle_on)
        return 0;
    if (uv_timer_init(srv->loop, &srv->net.idle_timer) != 0)
        return KVS_EIO;
    srv->net.idle_timer.data = srv;
    srv->net.idle_on = true;
    uint64_t every = srv->cfg.idle_timeout_ms / 4 ? srv->cfg.idle_timeout_ms / 4 : 1;
    if (uv_timer_start(&srv->net.idle_timer, on_idle_sweep, every, every) != 0)
        return KVS_EIO;
    return 0;
}

void session_idle_stop(server_t *srv)
{
    if (!srv || !srv->net.idle_on)
        return;
    uv_close((uv_handle_t *)&srv->net.idle_timer, NULL);
    srv->net.idle_on = false;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    session_t *s = stream->data;
    (void)buf;
    if (nread == UV_ENOBUFS && s->sock.yielding) {
        s->sock.yielding = false; /* until the next poll (answered_this_poll) */
        return;
    }
    if (nread == UV_EOF) {
        /* Half-closed: what it sent is answered and sent before we close. */
        stop_reading(s);
        s->sock.eof = true;
        session_take_turn(s);
        return;
    }
    if (nread == UV_ENOBUFS && s->srv->net.buf_bytes > s->srv->cfg.max_buffer_memory) {
        enforce_budget(s->srv, NULL);
        return;
    }
    if (nread < 0) {
        session_close(s, uv_strerror((int)nread));
        return;
    }
    if (nread == 0)
        return;
    s->in.len += (size_t)nread;
    uint64_t answered = s->requests;
    session_take_turn(s);
    if (s->requests != answered)
        s->sock.answered_polls = s->srv->sched.loop_polls;
}

int session_accept(server_t *srv)
{
    session_t *s = calloc(1, sizeof(*s));
    if (!s)
        return KVS_ENOMEM;
    s->rank = -1; /* no rank until its Hello says one */
    if (uv_pipe_init(srv->loop, &s->sock.pipe, 0) != 0) {
        free(s);
        return KVS_EIO;
    }
    s->sock.pipe.data = s;
    s->sock.has_pipe = true;
    if (uv_accept((uv_stream_t *)&srv->net.listener, (uv_stream_t *)&s->sock.pipe) != 0) {
        uv_close((uv_handle_t *)&s->sock.pipe, on_close);
        return KVS_EIO;
    }
    link_session(srv, s);
    peer_identify(s);
    if (peer_admit(s) != 0) {
        flush(s);
        session_close(s, "peer not allowed");
        return KVS_EDENIED;
    }
    if (srv->sessions.len > srv->cfg.max_sessions) {
        srv->metrics.sessions_refused++;
        dispatch_error_reply(s, 0, KVS_ELIMIT,
                             "kvshared has reached its session limit (--max-sessions); "
                             "close idle clients or raise the limit");
        flush(s);
        session_close(s, "session limit");
        return KVS_ELIMIT;
    }
    if (srv->net.fd_sessions && srv->sessions.len > srv->net.fd_sessions) {
        srv->metrics.sessions_refused_fds++;
        dispatch_error_reply(s, 0, KVS_ELIMIT,
                             "kvshared has no descriptors left for another session (its "
                             "descriptor limit is below what --max-sessions needs); close idle "
                             "clients, or raise LimitNOFILE / ulimit -n of kvshared");
        flush(s);
        session_close(s, "session limit");
        return KVS_ELIMIT;
    }
    s->sock.last_request_ms = s->sock.connected_ms = uv_now(srv->loop);
    start_reading(s);
    if (s->closing)
        return KVS_EIO;
    LOG_DEBUG("session %llu connected (%u open)", (unsigned long long)s->id,
              (unsigned)srv->sessions.len);
    return 0;
}
