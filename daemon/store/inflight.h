/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inflight: prefixes being written, and the lookups that wait for them.
 *
 * Design
 * ------
 * A WRITING block holds nothing the index knows of until its writer commits
 * it, so by itself it cannot be found. An Alloc may declare what its blocks
 * will hold (AllocRequest.tokens, first_block: block i of the reply will hold
 * block first_block + i of those tokens in ns). The declaration is the only
 * change on the writer's side; Commit is the same RPC as before, and a
 * writer may commit its prompt in pieces (the first blocks as soon as they
 * are written; later commits name them again as cached blocks it pins).
 *
 * A declared block is entered here under (ns, h_i), the chained hash of the
 * prefix it will hold (radix_chain_hashes), and leaves when it stops being
 * WRITING for its session: committed (cached, or a duplicate of a block
 * committed first), released, or its session ends. Nothing else is findable
 * before commit; in particular a declared block is never returned by Lookup:
 * a Lookup finds only cached blocks, and the declaration only tells it that
 * the next blocks are coming. A 64-bit hash that collides makes a lookup
 * wait for a block it will not get; never a wrong block, since the reply is
 * always the index's verified match.
 *
 * A Lookup with wait_ms > 0 whose cached prefix is followed by blocks that
 * another session declared (its own never count: a waiter that is itself
 * the writer does not wait) holds its session (session_hold: replies stay
 * in request order) until the wait ends; the session is then released and
 * its Lookup runs again from the ready queue, answered with what is cached
 * at that time, never held twice. The wait ends when no declared block of
 * another session follows the cached prefix any more (the writers
 * committed, released or died), when the hold's deadline passes, or when
 * the daemon stops. Each end of a declaration marks the waiters for a fresh
 * look, made after the request (or the session close) that ended it. The
 * waiters are indexed by the prefix of the first block each waits for, so
 * an end looks only at the waiters of its own prefix (each look one walk
 * of the prompt, which re-keys a waiter that must wait on). No reply
 * is written from inside the writer's request.
 *
 * Two sessions writing one prefix: both declarations are entered; a waiter
 * waits while either is in flight. Namespaces: the key holds the namespace,
 * so a waiter never waits for another namespace's writes.
 */
#ifndef KVS_DAEMON_INFLIGHT_H
#define KVS_DAEMON_INFLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "server.h"

typedef struct inflight inflight_t;

/* A held Lookup's wait, owned by its session (session_t.wait): what it
 * waits for, so that an end of a declaration can tell whether it is over. */
typedef struct inflight_wait {
    list_node_t link; /* on the waiters of the in-flight tables */
    session_t *s;
    uint32_t ns;
    uint32_t *tokens;
    size_t n_tokens;
    uint64_t start_ms;
    uint64_t deadline_ms; /* loop time: the hold's deadline */
    /* The prefix (ns, key) of the first block it waits for, while keyed:
     * only the end of that prefix's declarations looks at it again. */
    uint64_t key;
    bool keyed;
    struct inflight_wait *kprev, *knext; /* the waiters of one key bucket */
    struct inflight_wait *check_next;    /* inflight_wake's list to look at */
} inflight_wait_t;

/* Per-block tables for num_blocks blocks. Errors: KVS_ENOMEM. */
int inflight_new(server_t *srv, inflight_t **out);

/* Frees the tables. Accepts NULL. */
void inflight_free(inflight_t *f);

/* The chained hashes of the first n_blocks blocks of a prompt, in memory
 * owned by the inflight tables, valid until the next call here. Errors:
 * KVS_ENOMEM, KVS_ENONS. */
int inflight_hashes(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_blocks,
                    const uint64_t **out);

/* Declares that WRITING blocks ids[0..n) of session s will hold prefixes
 * hashes[0..n) of namespace ns. A block declared already keeps its first
 * declaration. */
void inflight_declare(server_t *srv, uint32_t ns, const uint64_t *hashes, const uint32_t *ids,
                      size_t n);

/* Several devices: a WRITING block that another session of s's group
 * (a rank or its scheduler) declared under (ns, h), whose shard of s's rank
 * is not committed yet and which is not marked (store_mark: taken already
 * by this request), or UINT32_MAX. s must be ranked. */
uint32_t inflight_group_block(const server_t *srv, const session_t *s, uint32_t ns, uint64_t h);

/* Ends block b's declaration, if any (idempotent), and marks the waiters for
 * a fresh look (inflight_wake). */
void inflight_undeclare(server_t *srv, uint32_t b);

/* How long claims last without a request from their session, by default
 * (server_config_t.claim_lease_ms): a claimer
 * that went idle (or hung) must not make every later waiter wait its whole
 * wait_ms. An honest worker sends its Alloc right after the Lookup. */
#define INFLIGHT_CLAIM_LEASE_MS 1000
/* Claimed blocks one session holds at most (and a quarter of the pool's):
 * one huge Lookup must not take every claim entry (there are as many as
 * pool blocks). */
#define INFLIGHT_SESSION_MAX_CLAIMS 4096

/* Claims: a Lookup with wait_ms > 0 that is answered with blocks missing
 * claims them for its session (each missing block's prefix, entered like a
 * declaration), so that a worker computing the rest is waited for from its
 * Lookup on, not only from its Alloc: two workers that look up one new
 * prompt at once do not both compute it. The claims end after the
 * session's next request (its Alloc declares the blocks first), or when it
 * ends, or after INFLIGHT_CLAIM_LEASE_MS without a request. Claim entries
 * are bounded by the pool size, and per session by a quarter of it (at
 * most INFLIGHT_SESSION_MAX_CLAIMS); past that, no claim. */
void inflight_claim(server_t *srv, session_t *s, uint32_t ns, const uint32_t *tokens,
                    size_t n_tokens, size_t cached);

/* Ends the session's claims (idempotent); marks the waiters for a look. */
void inflight_unclaim(server_t *srv, session_t *s);

/* Blocks of the prompt after its first `cached` ones that sessions other
 * than s declared, counted up to the first that is not declared. 0 at once
 * when nothing is declared. Errors: KVS_ENOMEM (hash scratch), KVS_ENONS. */
int inflight_count(server_t *srv, const session_t *s, uint32_t ns, const uint32_t *tokens,
                   size_t n_tokens, size_t cached, uint32_t *count);

/* Enters the wait of s's Lookup for at most wait_ms (the caller holds the
 * session, SESSION_HOLD_INFLIGHT, until s->wait->deadline_ms): copies the
 * tokens and links the wait to the session and the server. Errors:
 * KVS_ENOMEM (then nothing waits). */
int inflight_park(server_t *srv, session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                  uint32_t wait_ms);

/* Forgets the session's wait, uncounted (the session is closing). */
void inflight_cancel(server_t *srv, session_t *s);

/* Ends the session's wait, counted as a wait or a timeout (its hold is
 * being released: session_release calls it). Idempotent. */
void inflight_end(server_t *srv, session_t *s);

/* Releases every held Lookup whose wait has ended (see Design); with
 * `all`, every one (the daemon is stopping). Their Lookups run again from
 * the ready queue. */
void inflight_wake(server_t *srv, bool all);

/* The daemon is stopping: releases every held Lookup. */
void inflight_shutdown(server_t *srv);

/* Looks at held lookups made since inflight_new (tests: an end of a
 * declaration looks only at the waiters of its own prefix). */
uint64_t inflight_checks(const server_t *srv);

/* Whether a declaration ended since the last inflight_wake. */
bool inflight_pending(const server_t *srv);

/* Whether declarations, claims or held lookups name namespace ns (then
 * it is in use even without cached blocks; an id at or past max_namespaces
 * counts as in use). */
bool inflight_ns_busy(const server_t *srv, uint32_t ns);

/* Declared blocks and claims now, claims alone, and held lookups now. */
uint32_t inflight_declared(const server_t *srv);
uint32_t inflight_claimed(const server_t *srv);
uint32_t inflight_waiting(const server_t *srv);

#endif /* KVS_DAEMON_INFLIGHT_H */
