/* SPDX-License-Identifier: Apache-2.0 */
/*
 * session: one client connection and everything it holds, grouped by the
 * layer that owns each part.
 *
 *     session_t
 *       |-- own     its holdings (core/holdings.c): WRITING blocks, a dense
 *       |           list the store's records point back into (store.h:
 *       |           writer, writer_pos), so adding, removing and checking
 *       |           ownership of a block are O(1); its pins, a hash map
 *       |           block id -> count (open addressing), because a session
 *       |           may pin the same cached block several times; the scratch
 *       |-- turn    its place in the fair turns and the hold (core/hold.c)
 *       |-- claim   the prefixes it will write (store/inflight.c)
 *       |-- steps   a request of it cut into steps (rpc/handlers.c)
 *       |-- tree    its Tree (rpc/handlers.c)
 *       |-- sock    its socket (net/session.c), peer: who it is (net/peer.c)
 *       `-- in, out its frames and replies (net/ reads and writes, rpc/
 *                   decodes and packs)
 *
 * However the session ends (clean close, EOF, a crash of the worker, an
 * untrusted stream, the daemon stopping), session_close (net/session_io.h)
 * releases every pin and frees every WRITING block, in time proportional
 * to what it holds, with one call into the store (store_session_end).
 */
#ifndef KVS_DAEMON_SESSION_H
#define KVS_DAEMON_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "frame.h"
#include "list.h"
#include "server.h"

/* Why a session's next frame waits (session_hold). */
typedef enum session_hold_reason {
    SESSION_HOLD_NONE = 0,
    SESSION_HOLD_SPACING,  /* large work waits for the walk spacing (server.h) */
    SESSION_HOLD_INFLIGHT, /* a Lookup waits for blocks others write (inflight.h) */
    SESSION_HOLD_TIER_JOB, /* a request waits for its own tier copies (tier.h) */
    SESSION_HOLD_TIER_ANY, /* a request waits for any tier copy to end (tier.h) */
    SESSION_HOLD_CLUSTER,  /* a Lookup waits for blocks from the cluster tier (cluster_store.h) */
    SESSION_HOLD_CLEAR,    /* a Clear waits for its next step (handler_clear) */
    SESSION_HOLD_COMMIT,   /* a large Commit waits for its next piece (handler_commit) */
    SESSION_HOLD_ALLOC,    /* a large Alloc waits to evict its next piece (handler_alloc) */
    SESSION_HOLD_TREE, /* a Tree waits for its next step, or for another's walk (handler_tree) */
    SESSION_HOLD_REASONS,
} session_hold_reason_t;

typedef struct session_pins {
    uint32_t *keys;   /* block ids; SESSION_NO_BLOCK = empty slot */
    uint32_t *counts; /* pins this session holds on keys[i] */
    uint32_t cap;     /* power of two, or 0 */
    uint32_t used;    /* distinct blocks pinned */
    uint64_t total;   /* sum of counts */
} session_pins_t;

#define SESSION_NO_BLOCK UINT32_MAX

/* Its socket (net/session.c). */
typedef struct session_socket {
    uv_pipe_t pipe;
    bool has_pipe; /* pipe is open; false: a session of the tests, without a socket */
    bool reading;  /* uv_read_start is on */
    bool eof;      /* the client half-closed: close once replies are out */
    int broken;    /* no socket: the error that ended its stream in a turn */
    size_t queued; /* reply bytes in queued uv_writes */
    /* Its share of the daemon's buffer count (server_t.net.buf_bytes). */
    size_t buf_bytes;
    uint64_t last_request_ms; /* loop time of the last request (idle timeout) */
    uint64_t connected_ms;    /* loop time of its accept (Sessions: its age) */
    /* server_t.sched.loop_polls of the last read that answered a frame: it
     * reads no more before the next poll (net/session.c, on_alloc), and
     * the empty buffer that says so is not an error (yielding). */
    uint64_t answered_polls;
    bool yielding;
} session_socket_t;

/* The peer, from SO_PEERCRED (net/peer.c); known false for a session
 * without a socket. */
typedef struct session_peer {
    bool known;
    uint32_t uid, gid;
    int32_t pid;
} session_peer_t;

/* What a session holds in the store (core/holdings.c). */
typedef struct session_holdings {
    uint32_t *writing; /* its WRITING blocks, dense */
    uint32_t n_writing, cap_writing;
    session_pins_t pins;
    uint32_t *scratch; /* reply arrays, valid for one request */
    size_t scratch_cap;
} session_holdings_t;

/* Its place in the turns and the hold (core/hold.c). */
typedef struct session_turn {
    list_node_t ready_link; /* on server_t.sched.ready */
    bool in_ready;
    /* Why its kept frame waits (SESSION_HOLD_NONE: not held), until when
     * (loop ms, 0: no deadline), its place among the held sessions
     * (server_t.sched.held), and why the frame now running was held before
     * it ran (session_rerun). */
    session_hold_reason_t held;
    session_hold_reason_t rerun;
    uint64_t until_ms;
    uint64_t polls; /* server_t.sched.loop_polls when it was held */
    list_node_t held_link;
    uint64_t walk_next_ns; /* uv_hrtime before which it starts no large work (server.h) */
} session_turn_t;

/* Its claims (inflight.h): the first claim entry (0: none), a count of
 * claims made, so that dispatch can tell a request that made some, and,
 * while it has some, when they end unless a request ends them first (loop
 * ms) and its place among the claiming sessions, oldest first. */
typedef struct session_claims {
    uint32_t first;
    uint32_t gen;
    uint64_t until_ms;
    list_node_t link;
    bool on; /* on the claiming sessions */
} session_claims_t;

/* A request of it cut into steps, one per loop turn (handlers.c). */
typedef struct session_steps {
    /* Its Clear (handler_clear): blocks dropped so far, and how many more
     * it may drop (the namespace's blocks when it began, so that blocks
     * cached meanwhile cannot keep it going for ever). */
    uint64_t clear_dropped, clear_left;
    /* Its large Commit in pieces (handler_commit): under way (the frame
     * that runs now is that Commit's), its namespace, the blocks done; the
     * canonical ids so far are in the scratch. */
    bool commit;
    uint32_t commit_ns;
    size_t commit_done;
    uint32_t commit_waits; /* for tier copies, this Commit */
    /* Its large Alloc in pieces (alloc_pieces): under way, the blocks
     * taken and the blocks evicted by the pieces so far. */
    bool alloc;
    uint32_t alloc_done;
    uint64_t alloc_evicted;
} session_steps_t;

/* Its Tree (handler_tree). While it has the daemon's walk: the time its
 * steps took so far (the spacing, once it ends). While held until it may
 * walk: what it lists, and whether it takes one of the daemon's places for
 * that (server_t.tree.waiting) or follows a Tree there that lists the same;
 * the walk whose rows it takes (server_t.tree.gen; 0: none). */
typedef struct session_tree {
    uint64_t work_ns;
    bool waiting, counted, by_size;
    uint32_t max;
    char ns[64];
    uint64_t join;
} session_tree_t;

/* fds a Hello reply carries at most: the pool's slabs, and tier 2's memfd
 * for a client that asks for it (HelloRequest.map_tier2). */
#define SESSION_MAX_FDS (BACKEND_MAX_SLABS + 1)

struct session {
    server_t *srv;
    list_node_t link; /* on server_t.sessions, newest first */
    uint64_t id;
    char worker[64];
    bool closing;

    /* What its Hello said (handlers.c). */
    bool hello_done;
    /* Several devices (server_t.n_devices > 1): the device this worker
     * writes its shard on (-1: none), or the group's scheduler. */
    int rank;
    bool group_scheduler;
    /* The model identity it declared (namespaces.h); NULL: none, and its
     * requests use each namespace's own. */
    struct identity *ident;
    uint64_t ident_hash;
    uint64_t requests;
    uint32_t ns_created; /* dynamic namespaces it created that still exist */

    /* Its frames in and its replies out (net/ reads and writes them, rpc/
     * decodes and packs), and the fds a Hello reply exports, sent with it. */
    frame_buf_t in;
    frame_buf_t out;
    int fds[SESSION_MAX_FDS];
    size_t n_fds;

    session_socket_t sock;  /* its socket (net/session.c) */
    session_peer_t peer;    /* who it is (net/peer.c) */
    session_holdings_t own; /* what it holds (core/holdings.c) */
    session_turn_t turn;    /* fair turns and the hold (core/hold.c) */
    session_claims_t claim; /* the prefixes it will write (inflight.h) */
    session_steps_t steps;  /* its request cut into steps (handlers.c) */
    session_tree_t tree;    /* its Tree (handler_tree) */

    /* What its request waits for in the store: tier copies (tier.h), the
     * blocks other sessions write (inflight.h: its held Lookup's entry),
     * a fetch from the cluster tier (cluster_store.h); NULL: none. */
    struct tier_job *tier_job;
    struct inflight_wait *wait;
    struct cluster_fetch *cluster_fetch;
};

/* Buffers larger than this are given back once empty, so that one large
 * exchange does not leave a session holding its size. */
#define SESSION_KEEP_BYTES (256u << 10)

/* What one session gets answered per loop turn before every other session
 * has had its turn: at most SESSION_TURN_NS of work (the clock that times
 * each request tells it: Stats or Tree cost far more than their frames),
 * SESSION_TURN_BYTES of requests and replies together, and
 * SESSION_TURN_FRAMES frames. A turn used to be 16 frames: an ordinary
 * pipeline of 64 small requests took four turns, each stopping and
 * restarting the socket's reads (two epoll_ctl calls), a quarter of
 * pipelined throughput. Redis bounds a turn by one 16 KiB read; kvshare's
 * requests differ more in cost, hence the time. The replies of a pipeline
 * cut into several turns are sent together when it ends (take_turn), so
 * that the cut costs no extra writes or wake-ups. */
#define SESSION_TURN_NS     50000u
#define SESSION_TURN_FRAMES 256
#define SESSION_TURN_BYTES  (256u << 10)
/* A frame this large is one piece of work no turn can cut: it waits for
 * the walk spacing like Tree (server.h) and sets it. */
#define SESSION_LARGE_FRAME (1u << 20)

/* --- the hold: the one way a request waits (core/hold.c) ---
 *
 * A handler that cannot answer now (large work before the walk spacing has
 * passed, a Lookup waiting for blocks other sessions write, a request
 * waiting for tier copies) asks dispatch to hold its session
 * (handler_ctx_t.hold): nothing is replied, the frame stays in the
 * session's input, and no later frame of the session is read or answered
 * (replies stay in request order). The owner of the reason releases it
 * (session_release), or its deadline passes; either way the session joins
 * the ready queue and its kept frame runs again in its next turn, never
 * inside another session's request. While it runs, session_rerun says why
 * it was held, so that it is not held again for the same reason.
 *
 * The hold knows no sockets: it calls the hooks the layers above set
 * (session_hooks_t) to run a session's turn, to do background work between
 * turns, and to end what a reason's hold kept (a held Lookup's wait). */

/* What the hold calls upward, set once when the daemon is assembled. */
typedef struct session_hooks {
    /* One turn of s (net/session.c): its kept and pending frames. */
    void (*turn)(session_t *s);
    /* One bounded step of background work after the turns of a loop
     * iteration (the store's drain of a closed session's pins); returns
     * whether more is left. NULL: none. */
    bool (*background)(server_t *srv);
    /* Per reason, what ends with a hold for it when it is released (the
     * wait of a held Lookup, inflight.h); NULL: nothing. */
    void (*released[SESSION_HOLD_REASONS])(server_t *srv, session_t *s);
} session_hooks_t;

/* Holds s for `why` until session_release, or until loop time until_ms
 * (0: no deadline). */
void session_hold(session_t *s, session_hold_reason_t why, uint64_t until_ms);

/* Ends s's hold (a no-op when it is not held): its kept frame runs again
 * from the ready queue. */
void session_release(session_t *s);

/* The spacing of large work (server.h): session_spacing_next is the
 * uv_hrtime before which s may start none (its own clock and everyone's);
 * session_spacing_until the deadline of a hold for it, in loop time, from
 * uv_hrtime now_ns; session_spacing_done sets both clocks after s's piece
 * of large work ran from t0 to t1 (uv_hrtime). */
uint64_t session_spacing_next(const session_t *s);
uint64_t session_spacing_until(const session_t *s, uint64_t now_ns);
void session_spacing_done(session_t *s, uint64_t t0, uint64_t t1);

/* Releases every session held for `why`. */
void session_release_all(server_t *srv, session_hold_reason_t why);

/* Called before each poll (loop_watch.c), after server_t.sched.loop_polls
 * grew: arms the hold timer for the steps held since the previous poll. */
void session_hold_polled(server_t *srv);

/* Whether s is held: then it answers nothing until released. */
static inline bool session_held(const session_t *s)
{
    return s->turn.held != SESSION_HOLD_NONE;
}

/* Why the frame now running was held before it ran (SESSION_HOLD_NONE on
 * its first run). */
static inline session_hold_reason_t session_rerun(const session_t *s)
{
    return s->turn.rerun;
}

/* The frame that was held ran: it is no rerun any more. */
static inline void session_ran(session_t *s)
{
    s->turn.rerun = SESSION_HOLD_NONE;
}

/* Queues s for a turn after every session queued before it. */
void session_ready(session_t *s);

/* Takes s off the ready queue and out of the hold, for good (it closes). */
void session_unschedule(session_t *s);

/* Runs the turn of every session on the ready queue now (the daemon is
 * stopping: held lookups are answered before goodbye). */
void session_run_ready(server_t *srv);

/* Asks for background steps (session_hooks_t.background) between the
 * turns of the next loop iterations. Errors: KVS_ENOMEM, KVS_EIO (no loop
 * handle: the caller does the work at once). */
int session_background(server_t *srv);

/* Stops the fair-turn machinery: closes its handles. */
void session_sched_close(server_t *srv);

/* --- holdings, for the handlers and the store (core/holdings.c) --- */

/* Room for n more WRITING blocks / n more distinct pins, so that the steps
 * after a successful pool or index call cannot fail. Errors: KVS_ENOMEM. */
int session_writing_reserve(session_t *s, uint32_t n);
int session_pins_reserve(session_t *s, uint32_t n);

/* Adds one pin on block id to the session's count (room reserved first). */
void session_pin_add(session_t *s, uint32_t block_id);
/* Pins s holds on block id. */
uint32_t session_pin_count(const session_t *s, uint32_t block_id);
/* Removes one of them (count must be > 0). */
void session_pin_drop(session_t *s, uint32_t block_id);

/* A uint32 array of at least n entries, valid until the next call. Errors:
 * KVS_ENOMEM. */
int session_scratch(session_t *s, size_t n, uint32_t **out);

/* Gives back the room of holdings grown by a large request and emptied
 * since (over SESSION_KEEP_BYTES): the scratch, the pin table, the WRITING
 * list. A failed shrink keeps the larger room. */
void session_holdings_shrink(session_t *s);

/* Frees the holdings' memory (the store has let go of what they name). */
void session_holdings_free(session_t *s);

/* Bytes of memory the holdings' scratch takes (the buffer budget). */
static inline size_t session_scratch_bytes(const session_t *s)
{
    return s->own.scratch_cap * sizeof(*s->own.scratch);
}

#endif /* KVS_DAEMON_SESSION_H */
