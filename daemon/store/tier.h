/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier: the copies between the pool (tier 1), tier 2 (--host-tier) and
 * tier 3 (--disk-tier-path), off the loop thread, and the requests that
 * wait for them. One job may copy with both media: a demotion moves pool
 * blocks to host memory and, when host memory has no free room, host
 * blocks on to the disk; a promotion brings blocks back from either; the
 * job ends when every medium's batch did. Room in host memory for the next
 * demotions is made by a spill after each demotion, a job of its own that
 * no request waits for (the request waits for its memcpy, not for the
 * disk's writes).
 *
 * A handler that needs copies before it can answer (an Alloc that finds
 * the pool full demotes blocks; a pinned Lookup that matches tier-2 blocks
 * promotes them) starts one job, batched for the request, and defers: the
 * session keeps the request and reads no further one until the job is done
 * (session.c). The store moves the blocks in the index (store_demote,
 * store_promote); tier 2's medium copies them (tier_medium.h: the host
 * tier on threads of its own). The completion, on the loop, ends each
 * block's move (store_move_end: a demoted block's tier-1 id goes back to
 * the pool; a failed batch is undone, or stops the daemon after a device
 * fault), lets go of the pins the job held, and runs the session's request
 * again, which now finds room in the pool or its blocks in tier 1. A
 * session that ends while its job runs is detached from it: the job still
 * finishes its bookkeeping, so nothing leaks.
 *
 * The session waits the one way every request waits (session_hold): a
 * handler whose copies started asks for the hold tier_hold names, and the
 * completion releases it; the request runs again from the ready queue and
 * finds its blocks where they now are. A request may need a second round
 * (room made by demotion, then the promotion): it is held again.
 */
#ifndef KVS_DAEMON_TIER_H
#define KVS_DAEMON_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "radix.h"
#include "server.h"
#include "session.h"

typedef struct tier_job tier_job_t;

/* Demotes up to n blocks for namespace ns (radix_demote) and, when some
 * blocks move, starts their copy for session s and returns 1 (s waits);
 * returns 0 when nothing moved (dropped blocks went back to the pool at
 * once), or an error: KVS_ENOMEM, radix_demote's. */
int tier_demote(server_t *srv, session_t *s, uint32_t ns, size_t n);

/* Promotes the lower blocks pins[first .. first + n) (tier 2, then tier 3:
 * matched in order after the tier-1 prefix of a pinned lookup, and pinned
 * by it) into free pool blocks; the job takes over the n_pins pins in pins[] (the whole
 * lookup's) and lets go of them when done. Returns 1 when copies started
 * (s waits), 0 when none could (no free block: the caller unpins), or an
 * error. Linear in n_pins. */
int tier_promote(server_t *srv, session_t *s, const uint32_t *pins, size_t n_pins, size_t first,
                 size_t n);

/* Whether tier copies are in flight, whose end may make room for s's
 * request (blocks freed or moved): 1 when some are (the caller holds the
 * session for SESSION_HOLD_TIER_ANY: every end releases those), else 0. */
int tier_wait(server_t *srv, session_t *s);

/* Whether job j holds the pins of the lookup that started it (a promotion). */
bool tier_job_holds_pins(const tier_job_t *j);

/* The hold for a request that waits for tier copies: its own job's, when
 * it started one, or any job's (tier_wait). */
static inline session_hold_reason_t tier_hold(const session_t *s)
{
    return s->tier_job ? SESSION_HOLD_TIER_JOB : SESSION_HOLD_TIER_ANY;
}

/* The session is closing: its job, if any, completes without it, and it
 * waits for none. */
void tier_detach(session_t *s);

#endif /* KVS_DAEMON_TIER_H */
