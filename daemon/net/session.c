/* SPDX-License-Identifier: Apache-2.0 */
#include "session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster_store.h"
#include "dispatch.h"
#include "handlers.h"
#include "inflight.h"
#include "log.h"
#include "peer.h"
#include "store.h"
#include "namespaces.h"
#include "tier.h"

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
    s->next = srv->sessions;
    if (srv->sessions)
        srv->sessions->prev = s;
    srv->sessions = s;
    srv->n_sessions++;
    srv->metrics.sessions_total++;
}

static void unlink_session(session_t *s)
{
    server_t *srv = s->srv;
    if (s->prev)
        s->prev->next = s->next;
    else
        srv->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    srv->n_sessions--;
}

static void destroy(session_t *s)
{
    for (size_t i = 0; i < s->n_fds; i++)
        close(s->fds[i]);
    frame_buf_release(&s->in);
    frame_buf_release(&s->out);
    free(s->writing);
    free(s->pins.keys);
    free(s->pins.counts);
    free(s->scratch);
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

/* --- holdings --- */

int session_writing_reserve(session_t *s, uint32_t n)
{
    if ((uint64_t)s->n_writing + n <= s->cap_writing)
        return 0;
    uint64_t cap = s->cap_writing ? s->cap_writing : 16;
    while (cap < (uint64_t)s->n_writing + n)
        cap *= 2;
    if (cap > UINT32_MAX)
        return KVS_ENOMEM;
    uint32_t *w = realloc(s->writing, cap * sizeof(*w));
    if (!w)
        return KVS_ENOMEM;
    s->writing = w;
    s->cap_writing = (uint32_t)cap;
    return 0;
}

static inline uint32_t pin_slot(uint32_t block_id, uint32_t mask)
{
    /* Fibonacci hashing spreads consecutive ids over the table. */
    return (uint32_t)(((uint64_t)block_id * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static int pins_grow(session_pins_t *p, uint32_t cap)
{
    uint32_t *keys = malloc((size_t)cap * sizeof(*keys));
    uint32_t *counts = malloc((size_t)cap * sizeof(*counts));
    if (!keys || !counts) {
        free(keys);
        free(counts);
        return KVS_ENOMEM;
    }
    memset(keys, 0xff, (size_t)cap * sizeof(*keys));
    for (uint32_t i = 0; i < p->cap; i++) {
        if (p->keys[i] == SESSION_NO_BLOCK)
            continue;
        uint32_t j = pin_slot(p->keys[i], cap - 1);
        while (keys[j] != SESSION_NO_BLOCK)
            j = (j + 1) & (cap - 1);
        keys[j] = p->keys[i];
        counts[j] = p->counts[i];
    }
    free(p->keys);
    free(p->counts);
    p->keys = keys;
    p->counts = counts;
    p->cap = cap;
    return 0;
}

int session_pins_reserve(session_t *s, uint32_t n)
{
    session_pins_t *p = &s->pins;
    /* Load factor at most 1/2 keeps probes short. */
    uint64_t need = ((uint64_t)p->used + n) * 2;
    if (need <= p->cap)
        return 0;
    uint64_t cap = p->cap ? p->cap : 16;
    while (cap < need)
        cap *= 2;
    if (cap > (1ull << 31))
        return KVS_ENOMEM;
    return pins_grow(p, (uint32_t)cap);
}

static int64_t pin_find(const session_pins_t *p, uint32_t block_id)
{
    if (p->cap == 0)
        return -1;
    uint32_t mask = p->cap - 1;
    for (uint32_t i = pin_slot(block_id, mask);; i = (i + 1) & mask) {
        if (p->keys[i] == block_id)
            return i;
        if (p->keys[i] == SESSION_NO_BLOCK)
            return -1;
    }
}

void session_pin_add(session_t *s, uint32_t block_id)
{
    session_pins_t *p = &s->pins;
    uint32_t mask = p->cap - 1;
    uint32_t i = pin_slot(block_id, mask);
    while (p->keys[i] != SESSION_NO_BLOCK && p->keys[i] != block_id)
        i = (i + 1) & mask;
    if (p->keys[i] == SESSION_NO_BLOCK) {
        p->keys[i] = block_id;
        p->counts[i] = 0;
        p->used++;
    }
    p->counts[i]++;
    p->total++;
}

uint32_t session_pin_count(const session_t *s, uint32_t block_id)
{
    int64_t i = pin_find(&s->pins, block_id);
    return i < 0 ? 0 : s->pins.counts[i];
}

void session_pin_drop(session_t *s, uint32_t block_id)
{
    session_pins_t *p = &s->pins;
    int64_t found = pin_find(p, block_id);
    if (found < 0)
        return;
    uint32_t i = (uint32_t)found;
    p->total--;
    if (--p->counts[i] > 0)
        return;
    /* Backward-shift deletion: no tombstones, probes stay short. */
    uint32_t mask = p->cap - 1;
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & mask; p->keys[j] != SESSION_NO_BLOCK; j = (j + 1) & mask) {
        uint32_t home = pin_slot(p->keys[j], mask);
        /* Move j into the hole when its home is not in (hole, j]. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            p->keys[hole] = p->keys[j];
            p->counts[hole] = p->counts[j];
            hole = j;
        }
    }
    p->keys[hole] = SESSION_NO_BLOCK;
    p->used--;
    /* Shrink as pins go, so that closing costs what the session holds now,
     * not what it once held. (A failed shrink keeps the larger table.) */
    if (p->cap > 64 && (uint64_t)p->used * 8 < p->cap)
        pins_grow(p, p->cap / 2);
}

int session_scratch(session_t *s, size_t n, uint32_t **out)
{
    if (n > s->scratch_cap) {
        size_t cap = s->scratch_cap ? s->scratch_cap : 256;
        while (cap < n)
            cap *= 2;
        uint32_t *a = realloc(s->scratch, cap * sizeof(*a));
        if (!a)
            return KVS_ENOMEM;
        s->scratch = a;
        s->scratch_cap = cap;
    }
    *out = s->scratch;
    return 0;
}

/* --- the ready queue (fair turns) --- */

static void ready_remove(session_t *s)
{
    server_t *srv = s->srv;
    if (!s->in_ready)
        return;
    if (s->ready_prev)
        s->ready_prev->ready_next = s->ready_next;
    else
        srv->ready_head = s->ready_next;
    if (s->ready_next)
        s->ready_next->ready_prev = s->ready_prev;
    else
        srv->ready_tail = s->ready_prev;
    s->ready_prev = s->ready_next = NULL;
    s->in_ready = false;
}

/* --- buffer memory across sessions --- */

static size_t held_bytes(const session_t *s)
{
    /* A held Lookup keeps its prompt (inflight.h) besides its frame. */
    size_t wait = s->wait ? sizeof(*s->wait) + s->wait->n_tokens * sizeof(uint32_t) : 0;
    /* So does its Tree walk (handler_tree). */
    return s->in.cap + s->out.cap + s->scratch_cap * sizeof(*s->scratch) + s->queued + wait +
           handler_tree_bytes(s);
}

/* Counts s's buffers again into the server's total. */
static void account(session_t *s)
{
    if (s->closing)
        return;
    size_t now = held_bytes(s);
    s->srv->buf_bytes = s->srv->buf_bytes - s->buf_bytes + now;
    s->buf_bytes = now;
}

/* The smallest table that holds n pins at a load of at most 1/2. */
static uint32_t pins_cap_for(uint32_t n)
{
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2)
        cap *= 2;
    return (uint32_t)cap;
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
    if (s->commit_steps || s->alloc_steps)
        return;
    if (s->in.head == s->in.len && s->in.cap > SESSION_KEEP_BYTES)
        frame_buf_release(&s->in);
    if (s->out.head == s->out.len && s->out.cap > SESSION_KEEP_BYTES)
        frame_buf_release(&s->out);
    if (s->scratch_cap * sizeof(*s->scratch) > SESSION_KEEP_BYTES) {
        free(s->scratch);
        s->scratch = NULL;
        s->scratch_cap = 0;
    }
    session_pins_t *p = &s->pins;
    if ((size_t)p->cap * 2 * sizeof(uint32_t) > SESSION_KEEP_BYTES &&
        (uint64_t)p->used * 8 < p->cap)
        pins_grow(p, pins_cap_for(p->used)); /* when it fails, the larger table stays */
    if (s->cap_writing * sizeof(*s->writing) > SESSION_KEEP_BYTES &&
        (uint64_t)s->n_writing * 4 < s->cap_writing) {
        uint32_t cap = pins_cap_for(s->n_writing);
        uint32_t *w = realloc(s->writing, (size_t)cap * sizeof(*w));
        if (w) {
            s->writing = w;
            s->cap_writing = cap;
        }
    }
    account(s);
}

/* While the sessions' buffers are over max_buffer_memory, closes the
 * session holding the most (counted, logged at most once a second). Returns
 * false, closing nothing more, when that session is `spare` (one in its
 * alloc callback, which libuv does not let us close there). */
static bool enforce_budget(server_t *srv, const session_t *spare)
{
    while (srv->buf_bytes > srv->cfg.max_buffer_memory) {
        session_t *big = NULL;
        for (session_t *s = srv->sessions; s; s = s->next)
            if (!s->closing && (!big || s->buf_bytes > big->buf_bytes))
                big = s;
        if (!big || big->buf_bytes == 0)
            return true;
        if (big == spare)
            return false;
        srv->metrics.sessions_dropped_memory++;
        uint64_t now = uv_now(srv->loop);
        if (now - srv->budget_log_ms >= 1000 || srv->budget_log_ms == 0) {
            srv->budget_log_ms = now;
            LOG_WARN("session buffers at %zu bytes, over max_buffer_memory (%zu): closing "
                     "session %llu (pid %d), which holds %zu; %llu closed so far for this",
                     srv->buf_bytes, srv->cfg.max_buffer_memory, (unsigned long long)big->id,
                     (int)big->peer_pid, big->buf_bytes,
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
 * go in bounded steps on later loop turns (store_release_session). */
static void release_all(session_t *s)
{
    server_t *srv = s->srv;
    uint32_t n_writing = s->n_writing;
    unsigned long long n_pins = (unsigned long long)s->pins.total;

    /* A rank's session frees only what it holds, as any session does: a
     * second session that said the same rank and hung up must not take
     * its group's blocks away (store.h). */
    if (store_release_session(srv, s))
        drain_in_steps(srv, s->id, n_pins);
    if (n_writing || n_pins)
        LOG_DEBUG("session %llu released %u writing blocks and %llu pins",
                  (unsigned long long)s->id, n_writing, n_pins);
}

static void held_remove(session_t *s);

static void on_close(uv_handle_t *h)
{
    destroy(h->data);
}

void session_close(session_t *s, const char *reason)
{
    if (!s || s->closing)
        return;
    server_t *srv = s->srv;
    s->closing = true;
    inflight_cancel(s->srv, s);
    inflight_unclaim(s->srv, s);
    namespaces_session_gone(s);
    handler_tree_gone(s);
    s->srv->buf_bytes -= s->buf_bytes;
    s->buf_bytes = 0;
    tier_detach(s);
    cluster_store_detach(s);
    release_all(s);
    held_remove(s);
    ready_remove(s);
    unlink_session(s);
    LOG_DEBUG("session %llu (worker '%s', pid %d) closed: %s", (unsigned long long)s->id,
              s->worker[0] ? s->worker : "?", (int)s->peer_pid, reason);
    if (s->has_pipe) {
        uv_read_stop((uv_stream_t *)&s->pipe);
        uv_close((uv_handle_t *)&s->pipe, on_close);
    } else {
        destroy(s);
    }
    /* Its declarations ended: lookups held for them look again. */
    if (inflight_pending(srv))
        inflight_wake(srv, false);
}

/* --- I/O --- */

static void on_write(uv_write_t *req, int status)
{
    session_write_t *w = (session_write_t *)req;
    session_t *s = req->handle->data;
    if (!s->closing) {
        s->queued -= w->len;
        account(s);
    }
    if (status < 0 && status != UV_ECANCELED)
        session_close(s, uv_strerror(status));
    else if (s->eof && !s->in_ready && !session_held(s) && req->handle->write_queue_size == 0)
        session_close(s, "client closed (after its replies were sent)");
    free(w);
}

/* Sends the pending output (a Hello reply) with the exported fds attached,
 * synchronously: Hello is the first request, so nothing is queued before it
 * and the reply is small enough for an empty socket buffer. */
static int send_with_fds(session_t *s)
{
    int fd = -1;
    if (uv_fileno((uv_handle_t *)&s->pipe, &fd) != 0)
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
    if (!s->has_pipe || s->closing)
        return;
    uv_stream_t *stream = (uv_stream_t *)&s->pipe;
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
        s->queued += n;
        uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)n);
        int rc = uv_write(&w->req, stream, &buf, 1, on_write);
        if (rc != 0) {
            s->queued -= n;
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
        bool large = s->has_pipe && len >= SESSION_LARGE_FRAME;
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
        s->rerun = SESSION_HOLD_NONE;
        if (s->out.len > out_len)
            reply_bytes = s->out.len - out_len;
        if (large) /* clock_ns: when its reply was built */
            session_spacing_done(s, t0, clock_ns);
        s->srv->metrics.bytes_in += FRAME_HEADER_BYTES + len;
        if (s->has_pipe)
            s->last_request_ms = uv_now(s->srv->loop);
        frames++;
        /* Work, roughly: the bytes decoded and the bytes of reply built. */
        bytes += FRAME_HEADER_BYTES + (size_t)len + reply_bytes;
        if (rc != 0)
            return rc;
        /* A reply can be thousands of times its request (Stats, Tree): send
         * as the replies of one read grow, so that --max-output bounds what
         * a client that does not read makes the daemon hold. */
        if (s->has_pipe && s->n_fds == 0 && s->out.len - s->out.head >= SESSION_FLUSH_BYTES) {
            flush(s);
            if (s->closing)
                return 0;
        }
        if (s->n_fds > 0) {
            if (s->has_pipe) {
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
    if (s->broken)
        return s->broken;
    bool more;
    return process(s, false, &more);
}

int session_broken(const session_t *s)
{
    return s->broken;
}

int session_feed(session_t *s, const uint8_t *bytes, size_t len)
{
    if (s->broken)
        return s->broken;
    int rc = frame_buf_reserve(&s->in, len);
    if (rc != 0)
        return rc;
    if (len)
        memcpy(s->in.data + s->in.len, bytes, len);
    s->in.len += len;
    return session_process(s);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    session_t *s = h->data;
    size_t want = SESSION_READ_CHUNK, room_max = SIZE_MAX;
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
static void on_turn(uv_idle_t *h);
static void take_turn(session_t *s);

static void start_reading(session_t *s)
{
    if (s->reading || s->eof || s->closing)
        return;
    int rc = uv_read_start((uv_stream_t *)&s->pipe, on_alloc, on_read);
    if (rc != 0) {
        session_close(s, uv_strerror(rc));
        return;
    }
    s->reading = true;
}

static void stop_reading(session_t *s)
{
    if (!s->reading)
        return;
    uv_read_stop((uv_stream_t *)&s->pipe);
    s->reading = false;
}

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
    if (srv->sched)
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
    srv->hold_due = 0;
    srv->sched = sc;
    return 0;
}

static void ready_push(session_t *s)
{
    server_t *srv = s->srv;
    if (s->in_ready)
        return;
    if (sched_init(srv) != 0) {
        /* Without the machinery, the old way: its frames now. */
        LOG_ERROR("session %llu: no loop handles for its turn; answering it at once",
                  (unsigned long long)s->id);
        take_turn(s);
        return;
    }
    s->ready_prev = srv->ready_tail;
    s->ready_next = NULL;
    if (srv->ready_tail)
        srv->ready_tail->ready_next = s;
    else
        srv->ready_head = s;
    srv->ready_tail = s;
    s->in_ready = true;
    uv_idle_start(&srv->sched->turn, on_turn);
}

/* --- the hold --- */

uint64_t session_spacing_next(const session_t *s)
{
    return s->walk_next_ns > s->srv->walk_next_ns ? s->walk_next_ns : s->srv->walk_next_ns;
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
    s->walk_next_ns = t1 + d * SERVER_WALK_SPACING;
    s->srv->walk_next_ns = t1 + d * SERVER_WALK_SPACING_ALL;
}

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
    bool step = h->held == SESSION_HOLD_CLEAR || h->held == SESSION_HOLD_COMMIT ||
                h->held == SESSION_HOLD_ALLOC || h->held == SESSION_HOLD_TREE;
    return step && srv->watch && h->held_polls == srv->loop_polls;
}

/* Arms the hold timer for the earliest deadline among held sessions. */
static void hold_arm(server_t *srv)
{
    uint64_t due = 0;
    for (session_t *h = srv->held_head; h; h = h->held_next) {
        if (waits_for_poll(h)) {
            srv->hold_after_poll = true;
            continue;
        }
        if (h->hold_until_ms && (due == 0 || h->hold_until_ms < due))
            due = h->hold_until_ms;
    }
    if (due == srv->hold_due || !srv->sched)
        return;
    srv->hold_due = due;
    if (due == 0) {
        uv_timer_stop(&srv->sched->hold);
        return;
    }
    uint64_t now = uv_now(srv->loop);
    uv_timer_start(&srv->sched->hold, on_hold_timer, due > now ? due - now : 0, 0);
}

static void held_remove(session_t *s)
{
    if (s->held == SESSION_HOLD_NONE)
        return;
    if (s->held_prev)
        s->held_prev->held_next = s->held_next;
    else
        s->srv->held_head = s->held_next;
    if (s->held_next)
        s->held_next->held_prev = s->held_prev;
    else
        s->srv->held_tail = s->held_prev;
    s->held_prev = s->held_next = NULL;
    s->held = SESSION_HOLD_NONE;
    s->hold_until_ms = 0;
}

void session_hold(session_t *s, session_hold_reason_t why, uint64_t until_ms)
{
    server_t *srv = s->srv;
    held_remove(s);
    s->held = why;
    s->hold_until_ms = until_ms;
    s->held_polls = srv->loop_polls;
    /* Oldest first. Large work goes round-robin between the sessions that
     * wait for it (on_hold_timer lets one go per spacing), and one let go
     * that still found the spacing running keeps its place at the front. */
    if (why == SESSION_HOLD_SPACING && s->rerun == SESSION_HOLD_SPACING) {
        s->held_prev = NULL;
        s->held_next = srv->held_head;
        if (srv->held_head)
            srv->held_head->held_prev = s;
        else
            srv->held_tail = s;
        srv->held_head = s;
    } else {
        s->held_next = NULL;
        s->held_prev = srv->held_tail;
        if (srv->held_tail)
            srv->held_tail->held_next = s;
        else
            srv->held_head = s;
        srv->held_tail = s;
    }
    if (until_ms && waits_for_poll(s) && sched_init(srv) == 0) {
        srv->hold_after_poll = true;
        return;
    }
    if (until_ms && sched_init(srv) == 0 && (srv->hold_due == 0 || until_ms < srv->hold_due)) {
        srv->hold_due = until_ms;
        uint64_t now = uv_now(srv->loop);
        uv_timer_start(&srv->sched->hold, on_hold_timer, until_ms > now ? until_ms - now : 0, 0);
    }
}

void session_release(session_t *s)
{
    if (s->held == SESSION_HOLD_NONE || s->closing)
        return;
    s->rerun = s->held;
    inflight_end(s->srv, s); /* a held Lookup's wait ends with its hold */
    held_remove(s);
    ready_push(s);
}

void session_release_all(server_t *srv, session_hold_reason_t why)
{
    for (session_t *h = srv->held_head, *next; h; h = next) {
        next = h->held_next;
        if (h->held == why)
            session_release(h);
    }
    hold_arm(srv);
}

void session_hold_polled(server_t *srv)
{
    if (!srv->hold_after_poll)
        return;
    srv->hold_after_poll = false;
    srv->hold_due = 0; /* re-armed from the deadlines */
    hold_arm(srv);
}

/* Deadlines passed: those sessions run again (a Lookup answers with what
 * is cached, a spaced request does its work). */
static void on_hold_timer(uv_timer_t *t)
{
    server_t *srv = t->data;
    uint64_t now = uv_now(srv->loop), now_ns = uv_hrtime();
    bool spacing_taken = false;
    srv->hold_due = 0;
    for (session_t *h = srv->held_head, *next; h; h = next) {
        next = h->held_next;
        /* One piece of large work per spacing: the oldest waiter's. The
         * others keep their places and look again once it has run. Every
         * spacing waiter waits for the same thing, the spacing's end, so
         * its own deadline does not choose who goes: deadlines are loop
         * milliseconds rounded up when each was held, and a newer waiter's
         * could fall a millisecond before an older one's, letting the newer
         * go first at every spacing (a session pipelining Trees then kept
         * another's large Lookup waiting for several of them). */
        if (h->held == SESSION_HOLD_SPACING) {
            if (spacing_taken || now_ns < session_spacing_next(h)) {
                h->hold_until_ms = session_spacing_until(h, now_ns);
                continue;
            }
            spacing_taken = true;
            session_release(h);
            continue;
        }
        if (!h->hold_until_ms || h->hold_until_ms > now || waits_for_poll(h))
            continue;
        session_release(h);
    }
    hold_arm(srv);
}

/* One turn of s: at most a turn's worth of frames answered, replies sent.
 * A session with frames left stops reading (its socket buffers push back on
 * the client) and queues for another turn after everyone else's; a held
 * one reads nothing until it is released. A session without a socket whose
 * stream goes bad keeps the error for its owner (session_broken). */
static void take_turn(session_t *s)
{
    server_t *srv = s->srv;
    bool more;
    if (s->broken)
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
        if (!s->has_pipe) {
            s->broken = rc;
            return;
        }
        session_close(s, rc == KVS_ETOOBIG ? "frame over the limit" : "undecodable frame");
        return;
    }
    if (session_held(s)) {
        if (s->has_pipe)
            stop_reading(s);
        return;
    }
    if (more) {
        if (s->has_pipe)
            stop_reading(s);
        ready_push(s);
        return;
    }
    if (!s->has_pipe)
        return;
    if (s->eof) {
        if (s->pipe.write_queue_size == 0)
            session_close(s, "client closed");
        return;
    }
    start_reading(s);
}

static void on_turn(uv_idle_t *h)
{
    server_t *srv = h->data;
    /* One turn for each session queued now; those that queue again wait
     * for the next iteration, after the loop has polled everyone. */
    session_t *last = srv->ready_tail;
    while (srv->ready_head) {
        session_t *s = srv->ready_head;
        bool was_last = s == last;
        ready_remove(s);
        take_turn(s);
        if (was_last)
            break;
    }
    /* Closed sessions' pins, one bounded step per loop turn. */
    bool draining = srv->store && srv->store->drains && store_drain_step(srv);
    if (!srv->ready_head && !draining)
        uv_idle_stop(h);
}

/* Many pins of a closed session: the store lets go of them a step per loop
 * turn (on_turn), between the other sessions' turns. */
static void drain_in_steps(server_t *srv, uint64_t session_id, unsigned long long n_pins)
{
    if (srv->stopping) { /* no session is served any more: no turn to wait for */
        while (store_drain_step(srv))
            ;
        return;
    }
    if (sched_init(srv) == 0) {
        uv_idle_start(&srv->sched->turn, on_turn);
        return;
    }
    LOG_ERROR("session %llu: no loop handle for releasing its %llu pins in steps; releasing "
              "them at once",
              (unsigned long long)session_id, n_pins);
    while (store_drain_step(srv))
        ;
}

void session_run_ready(server_t *srv)
{
    while (srv->ready_head) {
        session_t *s = srv->ready_head;
        ready_remove(s);
        take_turn(s);
    }
}

/* Closes the sessions that sent no request for idle_timeout_ms (not those
 * whose requests wait for their turn). */
static void on_idle_sweep(uv_timer_t *t)
{
    server_t *srv = t->data;
    uint64_t now = uv_now(srv->loop);
    session_t *next;
    for (session_t *s = srv->sessions; s; s = next) {
        next = s->next;
        if (!s->has_pipe || s->closing || s->in_ready || session_held(s) ||
            now - s->last_request_ms < srv->cfg.idle_timeout_ms)
            continue;
        srv->metrics.sessions_idle_closed++;
        LOG_INFO("session %llu (pid %d): no request for %u ms (idle_timeout_ms); closing it",
                 (unsigned long long)s->id, (int)s->peer_pid, srv->cfg.idle_timeout_ms);
        session_goodbye(s, KVS_ETIMEDOUT,
                        "closed by kvshared after idle_timeout_ms without a request; "
                        "reconnect to go on");
        session_close(s, "idle timeout");
    }
}

int session_idle_start(server_t *srv)
{
    if (srv->cfg.idle_timeout_ms == 0 || srv->idle_on)
        return 0;
    if (uv_timer_init(srv->loop, &srv->idle_timer) != 0)
        return KVS_EIO;
    srv->idle_timer.data = srv;
    srv->idle_on = true;
    uint64_t every = srv->cfg.idle_timeout_ms / 4 ? srv->cfg.idle_timeout_ms / 4 : 1;
    if (uv_timer_start(&srv->idle_timer, on_idle_sweep, every, every) != 0)
        return KVS_EIO;
    return 0;
}

void session_sched_close(server_t *srv)
{
    if (!srv)
        return;
    if (srv->idle_on) {
        uv_close((uv_handle_t *)&srv->idle_timer, NULL);
        srv->idle_on = false;
    }
    struct session_sched *sc = srv->sched;
    if (!sc)
        return;
    sc->turn.data = sc;
    sc->hold.data = sc;
    uv_close((uv_handle_t *)&sc->turn, on_sched_close);
    uv_close((uv_handle_t *)&sc->hold, on_sched_close);
    srv->sched = NULL;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    session_t *s = stream->data;
    (void)buf;
    if (nread == UV_EOF) {
        /* Half-closed: what it sent is answered and sent before we close. */
        stop_reading(s);
        s->eof = true;
        take_turn(s);
        return;
    }
    if (nread == UV_ENOBUFS && s->srv->buf_bytes > s->srv->cfg.max_buffer_memory) {
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
    take_turn(s);
}

int session_accept(server_t *srv)
{
    session_t *s = calloc(1, sizeof(*s));
    if (!s)
        return KVS_ENOMEM;
    s->rank = -1; /* no rank until its Hello says one */
    if (uv_pipe_init(srv->loop, &s->pipe, 0) != 0) {
        free(s);
        return KVS_EIO;
    }
    s->pipe.data = s;
    s->has_pipe = true;
    if (uv_accept((uv_stream_t *)&srv->listener, (uv_stream_t *)&s->pipe) != 0) {
        uv_close((uv_handle_t *)&s->pipe, on_close);
        return KVS_EIO;
    }
    link_session(srv, s);
    peer_identify(s);
    if (peer_admit(s) != 0) {
        flush(s);
        session_close(s, "peer not allowed");
        return KVS_EDENIED;
    }
    if (srv->n_sessions > srv->cfg.max_sessions) {
        srv->metrics.sessions_refused++;
        dispatch_error_reply(s, 0, KVS_ELIMIT,
                             "kvshared has reached its session limit (--max-sessions); "
                             "close idle clients or raise the limit");
        flush(s);
        session_close(s, "session limit");
        return KVS_ELIMIT;
    }
    if (srv->fd_sessions && srv->n_sessions > srv->fd_sessions) {
        srv->metrics.sessions_refused_fds++;
        dispatch_error_reply(s, 0, KVS_ELIMIT,
                             "kvshared has no descriptors left for another session (its "
                             "descriptor limit is below what --max-sessions needs); close idle "
                             "clients, or raise LimitNOFILE / ulimit -n of kvshared");
        flush(s);
        session_close(s, "session limit");
        return KVS_ELIMIT;
    }
    s->last_request_ms = s->connected_ms = uv_now(srv->loop);
    start_reading(s);
    if (s->closing)
        return KVS_EIO;
    LOG_DEBUG("session %llu connected (%u open)", (unsigned long long)s->id, srv->n_sessions);
    return 0;
}
