/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server: the daemon's state and its listening socket.
 *
 *     server_t
 *       |-- backend_t     the pool memory (host memfd or cuda slabs)
 *       |-- pool_t        block ids and states (FREE / WRITING / CACHED)
 *       |-- store_t       the block store (store.h): the pool, the index, one
 *       |                 record per block, the tier below the pool
 *       `-- sessions      one per connection (session.h): pins, WRITING blocks
 *
 * Everything runs on one libuv loop thread. server_open builds the pool and
 * the index; server_listen binds the socket; server_shutdown (also run by
 * SIGINT / SIGTERM) stops accepting and closes every session, after which the
 * loop ends and server_free releases the rest.
 */
#ifndef KVS_DAEMON_SERVER_H
#define KVS_DAEMON_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "events.h"
#include "geometry.h"
#include "metrics.h"
#include "pool.h"
#include "radix.h"

typedef struct session session_t;
typedef struct store store_t;

#define SERVER_DEFAULT_MAX_FRAME (16u << 20)
/* Full blocks one request's prompt may name. Lookup and Evict are linear
 * in it and run in one piece; Commit and Alloc go in pieces of
 * STORE_PIECE_BLOCKS, one per loop turn. With 131,072 blocks (2,097,152
 * tokens at 16 per block) the longest stretch of loop work read 17 ms
 * (test_stalls), against 42 ms with every request in one piece. */
#define SERVER_DEFAULT_MAX_PROMPT_BLOCKS (128u << 10)
#define SERVER_DEFAULT_MAX_OUTPUT        (64u << 20)
#define SERVER_DEFAULT_MAX_BUFFERS       (512u << 20)
#define SERVER_DEFAULT_MAX_SESSIONS      1024
#define SERVER_DEFAULT_MAX_NAMESPACES    256
#define SERVER_DEFAULT_SESSION_MAX_NS    64

/* A hint may raise a block no higher than the default priority of blocks
 * without one (RADIX_PRIO_DEFAULT), unless its namespace's section allows
 * more (max_priority): one tenant's hints could otherwise keep its blocks
 * over every other tenant's, whose working set then never stays cached. */
#define SERVER_DEFAULT_MAX_PRIORITY 50

/* Pins one session may hold (session_max_pinned): 2^24, beyond any honest
 * worker (1,024 requests in flight, each pinning a 256k-token prompt of
 * 16-token blocks, is 16.8 M), and what a close lets go of in about 30 ms
 * in all, in steps (STORE_RELEASE_STEP). */
#define SERVER_DEFAULT_SESSION_MAX_PINNED (1u << 24)
#define SERVER_DEFAULT_NS                 "default"
#define SERVER_DEFAULT_DRAIN_MS           5000
/* A cuda pool that does not fit is retried this long: after a restart the
 * workers may still map the previous daemon's pool until their next call. */
#define SERVER_DEFAULT_BACKEND_RETRY_MS 60000
/* Descriptors kvshared uses besides one per session: the listener, the
 * metrics listener and its clients, signals, the backend, the fds a Hello
 * exports while it is sent. */
#define SERVER_SPARE_FDS 32
/* Walks and large frames, a budget per session under a cap for all: after
 * a session's piece of such work took d, that session starts none for
 * (SERVER_WALK_SPACING - 1) d (session_t.walk_next_ns: at most 1 % of the
 * loop each), and nobody starts any for (SERVER_WALK_SPACING_ALL - 1) d
 * (server_t.walk_next_ns: at most 10 % of the loop for all together). */
#define SERVER_WALK_SPACING     100
#define SERVER_WALK_SPACING_ALL 10
/* Tier copies run this much nicer than the loop thread (tier_host.c). */
#define SERVER_DEFAULT_TIER_COPY_NICE 10

/* Devices one kvshared serves at most (a block's shard mask is 64 bits). */
#define SERVER_MAX_DEVICES 64

typedef struct server_config {
    const char *socket_path;    /* required for server_listen */
    geometry_t geometry;        /* validated by server_open */
    const char *model;          /* --model as given: the daemon's model identity; NULL: none */
    const char *model_revision; /* --model-revision; NULL: none */
    backend_config_t backend;   /* bytes / mem_fraction size the pool */
    /* --devices: several devices, one pool each with the same blocks
     * ("0-3", "0,2,5", "all" for cuda); NULL: one, backend.device. */
    const char *devices;
    uint32_t pool_blocks;       /* > 0: exactly this many blocks (bytes derived) */
    uint32_t backend_retry_ms;  /* cuda out of memory: retry this long (0: fail at once) */
    uint32_t max_frame;         /* largest request accepted, bytes */
    uint32_t max_prompt_blocks; /* full blocks one request's tokens may hold */
    size_t max_output;          /* per session: unsent reply bytes before disconnect */
    size_t max_buffer_memory;   /* all sessions' buffers together, bytes */
    uint32_t idle_timeout_ms;   /* a session without a request this long is closed; 0: never */
    uint32_t max_sessions;
    uint32_t max_namespaces;
    radix_policy_t eviction;    /* index eviction policy (default RADIX_EVICT_LRU) */
    int ready_fd;               /* >= 0: "READY\n" is written there once listening */
    const char *metrics_listen; /* "HOST:PORT" for Prometheus over HTTP; NULL: off */

    /* Operations (namespaces.c, peer.c). */
    bool dynamic_namespaces;     /* unknown namespaces are created on first use */
    uint32_t session_max_pinned; /* pins one session may hold; 0: no limit */
    /* The highest retention priority a hint may give in a namespace whose
     * section allows no more (max_priority); see SERVER_DEFAULT_MAX_PRIORITY. */
    uint32_t default_max_priority;
    uint32_t max_timed_hints;     /* blocks with a live timed hint at once; 0: any */
    uint32_t session_max_writing; /* WRITING blocks one session may hold; 0: no limit */
    bool has_socket_gid;          /* chown the socket to socket_gid */
    uint32_t socket_gid;
    /* Dynamic namespaces one session may have created that still exist
     * (tenants.h); 0: no limit. */
    uint32_t session_max_namespaces;
    config_acl_t allow;      /* peers allowed to connect (empty: anyone) */
    config_acl_t clear_acl;  /* peers who may Clear any namespace (namespaces_may_clear) */
    uint32_t drain_ms;       /* SIGTERM: the loop ends within this time */
    const char *config_path; /* reread on SIGHUP; NULL: none */

    events_config_t events;   /* KV events for routers (events.h); endpoint NULL: off */
    uint64_t host_tier_bytes; /* tier 2 in host memory (tier.h); 0: none */
    uint32_t tier_copy_nice;  /* copy threads: this much nicer than the loop (0..19) */
    uint32_t claim_lease_ms;  /* claims end this long after their Lookup (inflight.h) */

    /* The cluster tier (cluster_store.h). */
    const char *cluster_seeds;      /* "HOST:PORT,..."; NULL: off */
    const char *cluster_auth_file;  /* NULL: no AUTH */
    uint32_t cluster_timeout_ms;    /* a command's deadline */
    const char *cluster_key_prefix; /* NULL: CLUSTER_STORE_KEY_PREFIX */
    /* A Clear's deletion of keys in the cluster ends by then (cluster_clear). */
    uint32_t cluster_clear_timeout_ms;

    /* Tier 3 on a local disk (disk.h): opened and scanned at start. */
    const char *disk_tier_path; /* NULL: none */
    uint64_t disk_tier_bytes;
    bool disk_tier_wipe;
    int disk_tier_io; /* disk_io_t */
} server_config_t;

typedef struct server {
    uv_loop_t *loop;
    server_config_t cfg;
    geometry_t geo;
    uint32_t num_blocks;
    uint64_t block_bytes;

    backend_t *backend; /* devices[0]'s: what one-device code uses */
    /* One backend per device (--devices), all with num_blocks blocks: a
     * block id names the same slot in each, so the store keeps one index
     * and one record per id for all (store.h). A worker of rank r maps
     * backends[r] only. */
    backend_t *backends[SERVER_MAX_DEVICES];
    int device_ordinals[SERVER_MAX_DEVICES]; /* backends[r]'s device (Stats, metrics) */
    uint32_t n_devices;
    /* The block store (store.h): every change of a block goes through it.
     * pool and index are the store's, kept here for the readers (stats,
     * namespaces, metrics). */
    store_t *store;
    pool_t *pool;
    radix_tree_t *index;

    /* Memory for decoding one request (dispatch.c): reused, so that a
     * 128 KiB prompt costs no malloc, free or page fault per request. */
    uint8_t *decode_arena;
    size_t decode_cap, decode_used, decode_want;
    size_t decode_budget; /* bytes this frame may take to decode */
    bool decode_over;     /* the frame went past it */
    bool decode_heap;     /* some of it is in malloc'd memory, not the arena */

    session_t *sessions; /* doubly linked, newest first */
    uint32_t n_sessions;
    uint64_t next_session_id;

    /* Fair turns (session.c): sessions with whole frames left after their
     * turn wait here, oldest first, and an idle handle gives each one more
     * turn per loop iteration, so that no session's backlog keeps the loop
     * from the others. Work that cannot be cut into turns, whole-index
     * walks (Tree) and frames of SESSION_LARGE_FRAME bytes or more (their
     * decoding alone copies the frame: ~6 ms for 16 MiB here), is spaced:
     * after a session's piece took d, that session starts none for
     * (SERVER_WALK_SPACING - 1) d and nobody any for
     * (SERVER_WALK_SPACING_ALL - 1) d: at most 1 % of the loop per session,
     * 10 % for all, and another session's large request waits for one
     * piece and a tenth of the spacing the flooder's own clock imposes.
     * Sessions waiting for the spacing are held (session.h) until then, and
     * let go oldest first, one per spacing.
     * Held sessions are listed here, and the hold timer fires at the earliest
     * deadline among them (hold_due, loop ms; 0: not armed). */
    session_t *ready_head, *ready_tail;
    session_t *held_head, *held_tail; /* oldest first */
    struct session_sched *sched;      /* the turn idle handle and the hold timer */
    uint64_t hold_due;
    /* Loop iterations, counted before each poll (loop_watch.c): a piece of
     * work in steps (Clear, Commit, Alloc, Tree) held in one runs no
     * earlier than after the next poll (session.c, waits_for_poll). */
    uint64_t loop_polls;
    bool hold_after_poll;  /* such a step is held: the next prepare arms the timer */
    uint64_t walk_next_ns; /* uv_hrtime before which no session starts large work */
    /* The one Tree walk in steps (handler_tree): its state, the session it
     * answers and the rows it keeps; NULL when none runs. */
    radix_top_walk_t *tree_walk;
    session_t *tree_owner;
    size_t tree_max;
    uint32_t trees_waiting; /* Trees held until they may walk (TREE_MAX_WAITING) */
    /* Trees of the same listing share a walk (handler_tree): the walk's
     * number and what it lists, and the rows of the last one that ended,
     * kept while Trees that joined it (tree_joiners) have not taken them. */
    uint64_t tree_gen;
    uint32_t tree_ns;
    bool tree_by_size;
    uint32_t tree_joiners;
    struct radix_prefix *tree_rows;
    size_t tree_n_rows;
    uint64_t tree_rows_gen;

    /* Bytes of every session's buffers (input, output, reply scratch, queued
     * writes), kept under cfg.max_buffer_memory (session.c). */
    size_t buf_bytes;
    uint64_t budget_log_ms; /* last "over the buffer budget" log line */
    uv_timer_t idle_timer;  /* idle_timeout_ms sweeps */
    bool idle_on;

    /* Sessions the descriptor limit leaves room for (server_listen): past
     * it connections are refused like those over max_sessions, so that
     * accept never meets EMFILE (where libuv closes them unseen). */
    uint32_t fd_sessions;
    uint64_t refuse_log_ms;    /* last "refused a connection" log line */
    uint64_t refused_unlogged; /* refusals since then */

    uv_pipe_t listener;
    bool listening;
    dev_t sock_dev;
    ino_t sock_ino;
    uv_signal_t sig_int, sig_term;
    bool signals_on;
    bool stopping;
    bool failed; /* a fault made serving unsafe: stopping, and kvshared exits 1 */

    uint64_t start_ms;
    metrics_t metrics;

    struct metrics_http *http; /* --metrics-listen; NULL when off */
    struct loop_watch *watch;  /* the longest loop work between polls (loop_watch.h) */

    /* Namespaces declared in the config file, and who may use each
     * (namespaces.c). tenants[ns] for ns < n_tenants; others: undeclared,
     * open to anyone. */
    config_t *conf;
    struct tenant *tenants;
    uint32_t n_tenants;
    bool any_ns_acl; /* some namespace has an allow-list */
    /* Per namespace id (max_namespaces of them): the session that created
     * it dynamically, while both live (namespaces_reclaim, the per-session
     * limit). */
    session_t **ns_creator;
    uint64_t ns_refuse_log_ms;      /* last "namespace not created" log line */
    uint64_t ns_refused_unlogged;   /* refusals since then */
    uint64_t ns_reclaim_log_ms;     /* last "reclaimed" log line */
    uint64_t ns_reclaimed_unlogged; /* namespaces reclaimed since then */
    uv_signal_t sig_hup;
    uv_timer_t drain_timer;
    bool drain_on;
    struct inflight *inflight; /* declared prefixes and held lookups */

    /* KV events (events.h): NULL when off. Per namespace, what it
     * publishes as, resolved on first use (ev_resolved). */
    struct events *events;
    events_stream_t *ev_streams;
    bool *ev_resolved;

    /* Model identity (namespaces.h): the daemon's own, and per namespace
     * id (max_namespaces of them) its identity, resolved on first use
     * (ident_resolved; reset when the id is reused). */
    struct ns_identity *daemon_ident;
    struct ns_identity *ns_idents;
    bool *ident_resolved;

    uint32_t tier2_blocks;  /* blocks of tier 2 (--host-tier); 0: none */
    uint32_t tier3_blocks;  /* blocks of tier 3 (--disk-tier-path): its slots; 0: none */
    struct disk *disk_tier; /* tier 3 (--disk-tier-path); NULL: none */
    uint32_t tier_jobs;     /* tier copies in flight (tier.c) */

    struct cluster_link *cluster;          /* the cluster tier (its thread); NULL: off */
    struct cluster_fetch *cluster_fetches; /* fetches in flight (cluster_store.c) */
} server_t;

/* Fills cfg with defaults: 16 MiB frames, 64 MiB output, 1024 sessions,
 * backend auto, no socket path, no geometry, ready_fd -1. */
void server_config_init(server_config_t *cfg);

/* Creates the pool memory, the pool and the index on `loop`. Errors (with a
 * message for a person in err): KVS_EINVAL (geometry, sizes), KVS_ENOMEM, and
 * the backend's errors (backend.h). */
int server_open(const server_config_t *cfg, uv_loop_t *loop, server_t **out, char *err,
                size_t errlen);

/* Checks the socket path before anything is built: KVS_EBUSY when a live
 * daemon answers there, KVS_EINVAL for a bad path or a file that is not a
 * socket, KVS_EDENIED when the socket's directory is not ours or root's, or
 * others can write it (without the sticky bit), or the socket belongs to
 * another uid (someone could pose as kvshared there); 0 for no file or a
 * stale socket of ours (server_listen replaces it). */
int server_check_socket(const char *path, char *err, size_t errlen);

/* Binds and listens on cfg.socket_path (mode 0660), installs the SIGINT /
 * SIGTERM handlers when `signals` is true, then signals readiness on
 * cfg.ready_fd. A socket file that no daemon answers on is replaced.
 * Errors: KVS_EBUSY (a live daemon answers there), KVS_EINVAL (path too long,
 * or a file that is not a socket), KVS_EIO. */
int server_listen(server_t *s, bool signals, char *err, size_t errlen);

/* Stops accepting, closes every session (releasing what it holds), removes
 * the socket file. Idempotent. The loop ends once the handles are closed. */
void server_shutdown(server_t *s);

/* Closes the drain deadline timer if shutdown started one (call once the
 * loop has ended, then run the loop once more). */
void server_drain_done(server_t *s);

/* Frees the pool, the index and the memory. Call after server_shutdown and
 * after the loop has run the close callbacks. Accepts NULL. */
void server_free(server_t *s);

/* Starts publishing KV events (cfg.events.endpoint set; after the
 * namespaces of the config are declared) and queues AllBlocksCleared on
 * the topic of every namespace that maps to a model. Errors (message in
 * err): those of events_start, KVS_ENOMEM. */
int server_events_start(server_t *s, char *err, size_t errlen);

/* Copies the publisher's counters into s->metrics (before a Stats reply or
 * a scrape). */
void server_sync_counters(server_t *s);

#endif /* KVS_DAEMON_SERVER_H */
