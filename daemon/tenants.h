/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tenants: namespaces as an operator declares them, and who may use them.
 *
 * The config file declares namespaces ([namespace NAME]) with a quota, a
 * reservation and optional uid/gid allow-lists. tenants_apply creates them
 * in the index (or changes their limits) and records, per namespace id,
 * whether it is declared and its allow-list. With dynamic_namespaces off, a
 * request naming a namespace that is not declared fails with KVS_ENONS; a
 * peer outside a namespace's allow-list gets KVS_EDENIED for anything in
 * it, including blocks of it named by id (Pin) and its rows in Stats and
 * Tree (filtered out).
 *
 * Dynamic namespaces (dynamic_namespaces on) are created on first use and
 * reclaimed when the table is full (max_namespaces) and one more is asked
 * for: every one that holds nothing then goes (tenants_reclaim), so that
 * names used once do not lock new tenants out until a restart. A session
 * may have created at most session_max_namespaces of those that exist.
 * Declared namespaces are never reclaimed.
 *
 * SIGHUP (tenants_reload) rereads the file and applies the namespaces' new
 * limits and allow-lists without touching the cache; other keys need a
 * restart. A file that does not validate changes nothing.
 */
#ifndef KVS_DAEMON_TENANTS_H
#define KVS_DAEMON_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct server server_t;
typedef struct session session_t;

typedef struct tenant {
    bool declared;
    bool by_flag; /* declared by --namespace: stays declared across reloads */
    config_acl_t acl;
} tenant_t;

/* Applies conf's namespaces to srv's index and takes ownership of conf
 * (NULL: none declared). When its new namespaces would not fit in the
 * table, unused dynamic ones are reclaimed first (tenants_reclaim). Then
 * checks, changing nothing more on error: KVS_EINVAL (a quota or
 * reservation larger than the pool, reservations adding up to more than
 * the pool, more namespaces than max_namespaces; message in err),
 * KVS_ENOMEM. */
int tenants_apply(server_t *srv, config_t *conf, char *err, size_t errlen);

/* Declares the existing namespace `name` (created by --namespace) for the
 * life of the daemon, open to anyone unless the file gives it an allow-list.
 * Errors: KVS_ENONS, KVS_ENOMEM (message in err). */
int tenants_declare(server_t *srv, const char *name, char *err, size_t errlen);

/* SIGHUP: rereads cfg.config_path and applies it; logs the outcome. */
void tenants_reload(server_t *srv);

/* Frees what tenants_apply kept. */
void tenants_free(server_t *srv);

/* Whether session s may use namespace ns (its allow-list, if any). */
bool tenants_allowed(const session_t *s, uint32_t ns);

/* Whether ns may be used by name at all: declared, or dynamic namespaces on. */
bool tenants_usable(const server_t *srv, uint32_t ns);

/* Makes room in a full namespace table: deletes every namespace that is
 * not declared (by the file or --namespace) and holds nothing: no cached
 * block (so no pin), no declared or claimed block being written, no held
 * lookup (inflight_ns_busy). Its id and name become free; its counters
 * leave Stats and /metrics (the global counters keep what it did). Counted
 * in namespaces_reclaimed and logged at most once a second. Returns the
 * number deleted. Cost: one look at each namespace; run only when the
 * table is full. */
uint32_t tenants_reclaim(server_t *srv);

/* Session s created namespace ns on first use: it counts against s's
 * session_max_namespaces while both exist. Errors: KVS_ENOMEM. */
int tenants_created(session_t *s, uint32_t ns);

/* Session s ends: the namespaces it created stay, counted against no one. */
void tenants_session_gone(session_t *s);

/* Logs the effective namespace settings, one line each. */
void tenants_log(const server_t *srv);

#endif /* KVS_DAEMON_TENANTS_H */
