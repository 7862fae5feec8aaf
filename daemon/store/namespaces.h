/* SPDX-License-Identifier: Apache-2.0 */
/*
 * namespaces: everything about a namespace in one module: its name rule
 * (nsname.h, a leaf the config parser uses too), its hash seed, creation
 * with a quota and a reservation, resolution of a request's name (with the
 * per-session limit and reclaim of unused ones), the allow-lists, and the
 * KV-event topic it publishes on.
 *
 * The config file declares namespaces ([namespace NAME]) with a quota, a
 * reservation and optional uid/gid allow-lists. namespaces_apply creates them
 * in the index (or changes their limits) and records, per namespace id,
 * whether it is declared and its allow-list. With dynamic_namespaces off, a
 * request naming a namespace that is not declared fails with KVS_ENONS; a
 * peer outside a namespace's allow-list gets KVS_EDENIED for anything in
 * it, including blocks of it named by id (Pin) and its rows in Stats and
 * Tree (filtered out).
 *
 * Dynamic namespaces (dynamic_namespaces on) are created on first use and
 * reclaimed when the table is full (max_namespaces) and one more is asked
 * for: every one that holds nothing then goes (namespaces_reclaim), so that
 * names used once do not lock new tenants out until a restart. A session
 * may have created at most session_max_namespaces of those that exist.
 * Declared namespaces are never reclaimed.
 *
 * SIGHUP (namespaces_reload) rereads the file and applies the namespaces' new
 * limits and allow-lists without touching the cache; other keys need a
 * restart. A file that does not validate changes nothing.
 */
#ifndef KVS_DAEMON_NAMESPACES_H
#define KVS_DAEMON_NAMESPACES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "events.h"
#include "identity.h"

typedef struct server server_t;
typedef struct session session_t;

typedef struct tenant {
    bool declared;
    bool by_flag; /* declared by --namespace: stays declared across reloads */
    config_acl_t acl;
} tenant_t;

/* Applies conf's namespaces to srv's index and takes ownership of conf
 * (NULL: none declared). When its new namespaces would not fit in the
 * table, unused dynamic ones are reclaimed first (namespaces_reclaim). Then
 * checks, changing nothing more on error: KVS_EINVAL (a quota or
 * reservation larger than the pool, reservations adding up to more than
 * the pool, more namespaces than max_namespaces; message in err),
 * KVS_ENOMEM. */
int namespaces_apply(server_t *srv, config_t *conf, char *err, size_t errlen);

/* Declares the existing namespace `name` (created by --namespace) for the
 * life of the daemon, open to anyone unless the file gives it an allow-list.
 * Errors: KVS_ENONS, KVS_ENOMEM (message in err). */
int namespaces_declare(server_t *srv, const char *name, char *err, size_t errlen);

/* SIGHUP: rereads cfg.config_path and applies it; logs the outcome. */
void namespaces_reload(server_t *srv);

/* Frees what namespaces_apply kept. */
void namespaces_free(server_t *srv);

/* Whether session s may use namespace ns (its allow-list, if any). */
bool namespaces_allowed(const session_t *s, uint32_t ns);

/* Whether session s may Clear namespace ns, which drops a whole tenant's
 * cache: a peer of uid 0 (it could stop the daemon anyway), a peer in
 * clear_uids / clear_gids (the operators), or a peer that ns's own
 * allow-list admits (its own sessions: only a namespace with an allow-list
 * has any). Everyone else is denied, without allow-lists too. A session
 * without peer credentials (in-process, tests) may. */
bool namespaces_may_clear(const session_t *s, uint32_t ns);

/* Whether ns may be used by name at all: declared, or dynamic namespaces on. */
bool namespaces_usable(const server_t *srv, uint32_t ns);

/* Makes room in a full namespace table: deletes every namespace that is
 * not declared (by the file or --namespace) and holds nothing: no cached
 * block (so no pin), no declared or claimed block being written, no held
 * lookup (inflight_ns_busy). Its id and name become free; its counters
 * leave Stats and /metrics (the global counters keep what it did). Counted
 * in namespaces_reclaimed and logged at most once a second. Returns the
 * number deleted. Cost: one look at each namespace; run only when the
 * table is full. */
uint32_t namespaces_reclaim(server_t *srv);

/* Session s created namespace ns on first use: it counts against s's
 * session_max_namespaces while both exist. Errors: KVS_ENOMEM. */
int namespaces_created(session_t *s, uint32_t ns);

/* Session s ends: the namespaces it created stay, counted against no one. */
void namespaces_session_gone(session_t *s);

/* Logs the effective namespace settings, one line each. */
void namespaces_log(const server_t *srv);

/* The hash chain seed of a namespace (FNV-1a of its name), so that equal
 * prompts in two namespaces never share a block hash. */
uint64_t namespaces_seed(const char *name);

/* Creates a namespace with a quota and a reservation in blocks (0: none),
 * for --namespace. Errors (message in err): KVS_EINVAL (name empty or over
 * RADIX_NS_NAME_MAX bytes, reserve over quota or over the pool), KVS_EEXIST, KVS_ENOMEM. */
int namespaces_create(server_t *s, const char *name, uint32_t quota, uint32_t reserve, char *err,
                      size_t errlen);

/* What namespace ns publishes as (stream->on false: nothing). */
const events_stream_t *namespaces_events_stream(server_t *s, uint32_t ns);

/* The namespace id for `name` ("" is the default namespace), for session
 * s: checked against the name rule, its allow-list and whether it may be
 * used, and created on first use when `create` is true (counted against
 * the session's session_max_namespaces; a full table first reclaims unused
 * ones). Errors (message for the reply in msg): KVS_EINVAL, KVS_EDENIED,
 * KVS_ENONS, KVS_ELIMIT, KVS_ENOMEM. */
int namespaces_resolve(session_t *s, const char *name, bool create, uint32_t *ns, char *msg,
                       size_t msglen);

/* --- model identity (identity.h) ---
 *
 * Every namespace has one identity: whose KV its blocks hold. It starts as
 * the config's (model_name / model_revision of its section), else the
 * daemon's (--model, --model-revision, the pool's geometry and devices). A
 * worker declares its own in Hello (kvs_identity_t): a namespace whose
 * identity comes from the daemon and that holds no block in any tier takes
 * the declared one (source "declared"); a declared or configured namespace
 * accepts only its own, and so does one that holds blocks already. The
 * layout part (geometry, dtype, tokens per block, devices) is the pool's:
 * a declaration of another is refused in any namespace. */
typedef struct ns_identity {
    identity_t id;
    uint64_t hash; /* identity_hash(&id) */
    identity_source_t source;
    char text[IDENTITY_TEXT_MAX + 1]; /* identity_text(&id) */
} ns_identity_t;

/* At server_open, once the geometry and devices are known: the daemon's
 * identity (--model, --model-revision) and the per-namespace tables.
 * Errors: KVS_ENOMEM, KVS_EINVAL (message in err). */
int namespaces_identity_open(server_t *srv, char *err, size_t errlen);

/* The daemon's own identity (no namespace's in particular). */
const ns_identity_t *namespaces_daemon_identity(server_t *srv);

/* Namespace ns's identity, resolved on first use. ns must exist. */
const ns_identity_t *namespaces_identity(server_t *srv, uint32_t ns);

/* Declares id for namespace ns, as src (IDENTITY_DECLARED: a worker's Hello
 * or what a restart found recorded). Returns 0 when ns's identity is now
 * id, KVS_EIDENTITY (msg names both identities and why) when ns keeps
 * another, KVS_EINVAL when id's layout is not the pool's. Counted in
 * identity_refusals when refused. */
int namespaces_identity_declare(server_t *srv, uint32_t ns, const identity_t *id,
                                identity_source_t src, char *msg, size_t msglen);

/* Session s, which declared an identity in Hello, uses namespace ns: 0 when
 * ns's identity is the declared one (binding ns to it where it may, as
 * namespaces_identity_declare), else KVS_EIDENTITY with msg. A session that
 * declared nothing passes. */
int namespaces_identity_check(session_t *s, uint32_t ns, char *msg, size_t msglen);

#endif /* KVS_DAEMON_NAMESPACES_H */
