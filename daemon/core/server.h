/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server: the daemon's state, which every floor reads.
 *
 *     server_t
 *       |-- backend_t     the pool memory (host memfd or cuda slabs)
 *       |-- pool_t        block ids and states (FREE / WRITING / CACHED)
 *       |-- store_t       the block store (store.h): the pool, the index, one
 *       |                 record per block, the tiers below the pool
 *       |-- sched         fair turns and the hold (session.h, core/hold.c)
 *       `-- sessions      one per connection (session.h): pins, WRITING blocks
 *
 * Everything runs on one libuv loop thread. The daemon is assembled, run
 * and torn down by kvshared.h (server_open, server_listen, server_shutdown,
 * server_free); its socket is net/listener.h.
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
#include "list.h"
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
    uint32_t
        claim_lease_ms; /* claims end this long after their Lookup; 0: INFLIGHT_CLAIM_LEASE_MS */

    /* The cluster tier (cluster_store.h). */
    const char *cluster_seeds;      /* "HOST:PORT,..."; NULL: off */
    const char *cluster_auth_file;  /* NULL: no AUTH */
    uint32_t cluster_timeout_ms;    /* a command's deadline */
    const char *cluster_key_prefix; /* the keys' first bytes (NULL: none) */
    /* A Clear's deletion of keys in the cluster ends by then (cluster_clear). */
    uint32_t cluster_clear_timeout_ms;

    /* Tier 3 on a local disk (disk.h): opened and scanned at start. */
    const char *disk_tier_path; /* NULL: none */
    uint64_t disk_tier_bytes;
    bool disk_tier_wipe;
    int disk_tier_io; /* disk_io_t */
} server_config_t;

/* Fair turns (core/hold.c): sessions with whole frames left after their
 * turn wait on `ready`, oldest first, and an idle handle gives each one
 * more turn per loop iteration, so that no session's backlog keeps the
 * loop from the others. Work that cannot be cut into turns, whole-index
 * walks (Tree) and frames of SESSION_LARGE_FRAME bytes or more (their
 * decoding alone copies the frame: ~6 ms for 16 MiB here), is spaced:
 * after a session's piece took d, that session starts none for
 * (SERVER_WALK_SPACING - 1) d and nobody any for
 * (SERVER_WALK_SPACING_ALL - 1) d: at most 1 % of the loop per session,
 * 10 % for all, and another session's large request waits for one piece
 * and a tenth of the spacing the flooder's own clock imposes. Sessions
 * waiting for the spacing are held (session.h) until then, and let go
 * oldest first, one per spacing. Held sessions are on `held`, and the hold
 * timer fires at the earliest deadline among them (hold_due, loop ms; 0:
 * not armed). */
typedef struct server_sched {
    list_t ready;                      /* session_t.turn.ready_link, oldest first */
    list_t held;                       /* session_t.turn.held_link, oldest first */
    struct session_sched *handles;     /* the turn idle handle and the hold timer */
    const struct session_hooks *hooks; /* what the hold calls upward (session.h) */
    uint64_t hold_due;
    /* Loop iterations, counted before each poll (loop_watch.c): a piece of
     * work in steps (Clear, Commit, Alloc, Tree) held in one runs no
     * earlier than after the next poll (hold.c, waits_for_poll). */
    uint64_t loop_polls;
    bool hold_after_poll;  /* such a step is held: the next prepare arms the timer */
    uint64_t walk_next_ns; /* uv_hrtime before which no session starts large work */
} server_sched_t;

/* The one Tree walk in steps (handler_tree): its state, the session it
 * answers and the rows it keeps; walk NULL when none runs. Trees of the
 * same listing share a walk: the walk's number and what it lists, and the
 * rows of the last one that ended, kept while Trees that joined it
 * (joiners) have not taken them. */
typedef struct server_tree {
    radix_top_walk_t *walk;
    session_t *owner;
    size_t max;
    uint32_t waiting; /* Trees held until they may walk (TREE_MAX_WAITING) */
    uint64_t gen;
    uint32_t ns;
    bool by_size;
    uint32_t joiners;
    struct radix_prefix *rows;
    size_t n_rows;
    uint64_t rows_gen;
} server_tree_t;

/* Memory for decoding one request (dispatch.c): reused, so that a 128 KiB
 * prompt costs no malloc, free or page fault per request. */
typedef struct server_decode {
    uint8_t *arena;
    size_t cap, used, want;
    size_t budget; /* bytes this frame may take to decode */
    bool over;     /* the frame went past it */
    bool heap;     /* some of it is in malloc'd memory, not the arena */
} server_decode_t;

/* The sockets (net/): the listener, the sessions' buffer budget, the idle
 * sweep, Prometheus's HTTP and the loop watch. */
typedef struct server_net {
    uv_pipe_t listener;
    bool listening;
    dev_t sock_dev;
    ino_t sock_ino;
    /* Sessions the descriptor limit leaves room for (listener_open): past
     * it connections are refused like those over max_sessions, so that
     * accept never meets EMFILE (where libuv closes them unseen). */
    uint32_t fd_sessions;
    uint64_t refuse_log_ms;    /* last "refused a connection" log line */
    uint64_t refused_unlogged; /* refusals since then */
    /* Bytes of every session's buffers (input, output, reply scratch, queued
     * writes), kept under cfg.max_buffer_memory (session.c). */
    size_t buf_bytes;
    uint64_t budget_log_ms; /* last "over the buffer budget" log line */
    uv_timer_t idle_timer;  /* idle_timeout_ms sweeps */
    bool idle_on;
    struct metrics_http *http; /* --metrics-listen; NULL when off */
    struct loop_watch *watch;  /* the longest loop work between polls (loop_watch.h) */
} server_net_t;

/* The daemon's life (kvshared.c): its signals and the drain deadline. */
typedef struct server_life {
    uv_signal_t sig_int, sig_term, sig_hup;
    bool signals_on;
    uv_timer_t drain_timer;
    bool drain_on;
} server_life_t;

/* Namespaces (namespaces.c). Those declared in the config file, and who
 * may use each: tenants[ns] for ns < n_tenants; others: undeclared, open to
 * anyone. */
typedef struct server_ns {
    config_t *conf;
    struct tenant *tenants;
    uint32_t n_tenants;
    bool any_acl; /* some namespace has an allow-list */
    /* Per namespace id (max_namespaces of them): the session that created
     * it dynamically, while both live (namespaces_reclaim, the per-session
     * limit). */
    session_t **creator;
    uint64_t refuse_log_ms;      /* last "namespace not created" log line */
    uint64_t refused_unlogged;   /* refusals since then */
    uint64_t reclaim_log_ms;     /* last "reclaimed" log line */
    uint64_t reclaimed_unlogged; /* namespaces reclaimed since then */
    /* Model identity (namespaces.h): the daemon's own, and per namespace id
     * its identity, resolved on first use (ident_resolved; reset when the
     * id is reused). */
    struct ns_identity *daemon_ident;
    struct ns_identity *idents;
    bool *ident_resolved;
    /* Per namespace id, what it publishes its KV events as, resolved on
     * first use (ev_resolved). */
    events_stream_t *ev_streams;
    bool *ev_resolved;
} server_ns_t;

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

    server_decode_t decode; /* memory for decoding one request (dispatch.c) */

    list_t sessions; /* session_t.link, newest first */
    uint64_t next_session_id;

    /* Fair turns and the hold (core/hold.c). */
    server_sched_t sched;

    server_tree_t tree; /* the Tree walk (handler_tree) */

    server_net_t net;   /* the sockets (net/) */
    server_life_t life; /* signals and the drain (kvshared.c) */
    bool stopping;
    bool failed; /* a fault made serving unsafe: stopping, and kvshared exits 1 */
    /* Stops the daemon (server_shutdown), for a floor below the assembly
     * that finds serving unsafe (it sets `failed` first). */
    void (*stop)(struct server *srv);

    uint64_t start_ms;
    metrics_t metrics;

    server_ns_t ns;            /* namespaces: tenants, creators, identities (namespaces.c) */
    struct inflight *inflight; /* declared prefixes and held lookups */

    struct events *events; /* KV events (events.h); NULL when off */

    uint32_t tier2_blocks;  /* blocks of tier 2 (--host-tier); 0: none */
    uint32_t tier3_blocks;  /* blocks of tier 3 (--disk-tier-path): its slots; 0: none */
    struct disk *disk_tier; /* tier 3 (--disk-tier-path); NULL: none */
    uint32_t tier_jobs;     /* tier copies in flight (tier.c) */

    struct cluster_link *cluster; /* the cluster tier (its thread); NULL: off */
    list_t cluster_fetches;       /* fetches in flight (cluster_store.c: cluster_fetch_t.link) */
} server_t;

/* Fills cfg with the defaults of the settings' table (settings.c; 16 MiB
 * frames, 64 MiB output, 1024 sessions, backend auto, ...), no socket
 * path, no geometry, ready_fd -1. */
void server_config_init(server_config_t *cfg);

#endif /* KVS_DAEMON_SERVER_H */
