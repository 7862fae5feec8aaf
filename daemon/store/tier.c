/* SPDX-License-Identifier: Apache-2.0 */
#include "tier.h"

#include <stdlib.h>
#include <string.h>

#include "kvshare_status.h"
#include "log.h"
#include "session.h"
#include "store.h"
#include "tier_medium.h"

/* The copies of one job, by medium and direction: a demotion job may move
 * blocks from the pool to tier 2 and from tier 2 to tier 3 at once
 * (radix_demote), a promotion job from tiers 2 and 3 to the pool. */
enum { PART_HOST_PUT, PART_HOST_GET, PART_DISK_PUT, PART_DISK_GET, PART_N };

typedef struct job_part {
    uint32_t *ids;   /* the medium's block ids: pool ids, or a disk put's tier-3 index ids */
    uint32_t *slots; /* the medium's slots */
    size_t n;
    struct tier_job *job; /* the medium's done argument: this part */
    int kind;             /* PART_* */
} job_part_t;

struct tier_job {
    server_t *srv;
    session_t *s;        /* NULL once the session has ended */
    bool put;            /* a demotion: blocks one tier down */
    size_t n;            /* blocks copied */
    uint32_t *index_ids; /* [n], each block's index id once moved */
    uint32_t *pins;      /* [n_pins], pins the job holds (index ids) */
    size_t n_pins;
    size_t pin_first; /* a promotion: pins[pin_first + i] is the pin on block i */
    job_part_t part[PART_N];
    uint32_t *part_mem;       /* the parts' arrays, 2 n per part */
    int pending;              /* parts whose medium has not called back yet */
    tier_medium_result_t res; /* the parts' results together: the first failure */
};

static tier_job_t *job_new(server_t *srv, session_t *s, bool put, size_t n, size_t n_pins)
{
    tier_job_t *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    size_t m = n ? n : 1;
    j->index_ids = calloc(m, sizeof(uint32_t));
    j->pins = calloc(n_pins ? n_pins : 1, sizeof(uint32_t));
    j->part_mem = calloc(2 * PART_N * m, sizeof(uint32_t));
    if (!j->index_ids || !j->pins || !j->part_mem) {
        free(j->index_ids);
        free(j->pins);
        free(j->part_mem);
        free(j);
        return NULL;
    }
    for (int k = 0; k < PART_N; k++) {
        j->part[k].ids = j->part_mem + 2 * k * m;
        j->part[k].slots = j->part_mem + (2 * k + 1) * m;
        j->part[k].job = j;
        j->part[k].kind = k;
    }
    j->srv = srv;
    j->s = s;
    j->put = put;
    j->n = n;
    j->n_pins = n_pins;
    return j;
}

static void job_free(tier_job_t *j)
{
    free(j->index_ids);
    free(j->pins);
    free(j->part_mem);
    free(j);
}

/* Adds the copy of a block moving from index id `from` to `to` to its part. */
static void job_add(tier_job_t *j, uint32_t from, uint32_t to)
{
    server_t *srv = j->srv;
    uint32_t t2_end = srv->num_blocks + srv->tier2_blocks;
    int k;
    uint32_t id, slot;
    if (from < srv->num_blocks) { /* pool -> host */
        k = PART_HOST_PUT, id = from, slot = to - srv->num_blocks;
    } else if (to >= t2_end) { /* host -> disk: the disk medium reads the block's peer */
        k = PART_DISK_PUT, id = to, slot = to - t2_end;
    } else if (from < t2_end) { /* host -> pool */
        k = PART_HOST_GET, id = to, slot = from - srv->num_blocks;
    } else { /* disk -> pool */
        k = PART_DISK_GET, id = to, slot = from - t2_end;
    }
    job_part_t *p = &j->part[k];
    p->ids[p->n] = id;
    p->slots[p->n] = slot;
    p->n++;
}

static tier_medium_t *part_medium(const tier_job_t *j, int k)
{
    store_t *st = j->srv->store;
    return k == PART_DISK_PUT || k == PART_DISK_GET ? st->medium3 : st->medium;
}

/* A fault that leaves the index naming bytes that were not copied, and
 * after which nothing else the device holds can be trusted: stop before
 * anyone reads them. Every session gets its goodbye (the request waiting
 * for these copies is never answered with them), and kvshared exits with
 * status 1. */
static void stop_on_fault(server_t *srv)
{
    LOG_ERROR("stopping: a copy between the pool and tier 2 failed, so blocks in the index "
              "hold bytes that were not copied; workers recompute until kvshared is "
              "restarted");
    srv->failed = true;
    srv->stop(srv);
}

/* Every block of a failed batch goes back where it was, in the reverse
 * order of the moves (radix_copy_undo); the job's pins follow a promoted
 * block back to its tier-2 id. Returns false when a move could not be
 * undone (the daemon must stop). */
static bool undo_moves(tier_job_t *j)
{
    bool all = true;
    for (size_t i = j->n; i-- > 0;) {
        uint32_t back;
        int rc = store_move_end(j->srv->store, j->index_ids[i], false, &back);
        if (rc != 0) {
            LOG_ERROR("tier-2 block %u: the failed copy cannot be undone: %s", j->index_ids[i],
                      kvs_status_text(rc));
            all = false;
            continue;
        }
        /* O(1) per block: a promotion's blocks are a run of its pins. */
        if (j->n_pins > 0 && j->pins[j->pin_first + i] == j->index_ids[i])
            j->pins[j->pin_first + i] = back;
    }
    return all;
}

/* On the loop, once the medium is done: every block's copy ends in the
 * index (or, when the batch failed, every move is undone: nothing is lost,
 * the blocks are where they were, and for STORE_MEDIUM_RETRY_MS nothing
 * moves between the tiers, unless only slots failed to verify), the job's
 * pins go, and the session's request
 * runs again, which now finds room in the pool, its blocks in tier 1, or,
 * after a failure, answers without moving blocks. */
static void job_done(tier_job_t *j, const tier_medium_result_t *res);

/* One part's medium called back: the job ends with its last part. */
static void part_done(void *arg, const tier_medium_result_t *res)
{
    job_part_t *p = arg;
    tier_job_t *j = p->job;
    if (p->kind == PART_DISK_GET && res->status == 0)
        metrics_observe(&j->srv->metrics.disk_read_time, metrics_latency_bounds_ns,
                        metrics_latency_n_bounds, res->copy_ns);
    if (res->status != 0 && (j->res.status == 0 || j->res.status == KVS_ENOTFOUND))
        j->res.status = res->status;
    j->res.fatal = j->res.fatal || (res->status != 0 && res->fatal);
    if (res->copy_ns > j->res.copy_ns)
        j->res.copy_ns = res->copy_ns;
    if (--j->pending == 0)
        job_done(j, &j->res);
}

static void job_done(tier_job_t *j, const tier_medium_result_t *res)
{
    server_t *srv = j->srv;
    bool failed = res->status != 0;
    bool fatal = failed && res->fatal;
    if (failed) {
        srv->metrics.tier_copy_failures++;
        LOG_ERROR("tier %s of %zu blocks failed (%s): %s", j->put ? "demotion" : "promotion", j->n,
                  fatal ? "a device fault" : "undone", kvs_status_text(res->status));
    }
    if (!failed) {
        for (size_t i = 0; i < j->n; i++) {
            uint32_t back;
            if (store_move_end(srv->store, j->index_ids[i], true, &back) != 0)
                LOG_ERROR("tier-2 block %u was not being copied", j->index_ids[i]);
        }
        /* moves out of the pool and into it; the disk's own are disk_writes
         * and disk_reads */
        if (j->put)
            srv->metrics.tier_demotions += j->n - j->part[PART_DISK_PUT].n;
        else
            srv->metrics.tier_promotions += j->n;
        srv->metrics.tier_copied_bytes += (uint64_t)j->n * srv->block_bytes;
    } else if (!fatal) {
        fatal = !undo_moves(j);
        /* A medium that failed waits before it is tried again; a slot that
         * did not verify (KVS_ENOTFOUND) is that block's fault alone: its
         * block leaves the index (src.bad) and everything else moves on. */
        if (res->status != KVS_ENOTFOUND)
            srv->store->medium_down_until = uv_now(srv->loop) + STORE_MEDIUM_RETRY_MS;
    } else {
        for (size_t i = 0; i < j->n; i++) {
            uint32_t back;
            store_move_end(srv->store, j->index_ids[i], true, &back);
        }
    }
    srv->metrics.tier_copy_us += res->copy_ns / 1000;
    metrics_observe(&srv->metrics.tier_copy_time[j->put ? BACKEND_TO_TIER : BACKEND_FROM_TIER],
                    metrics_latency_bounds_ns, metrics_latency_n_bounds, res->copy_ns);
    srv->tier_jobs--;
    for (size_t i = 0; i < j->n_pins; i++)
        store_unpin(srv->store, j->pins[i]);
    session_t *s = j->s;
    job_free(j);
    if (s)
        s->tier_job = NULL;
    if (fatal) {
        stop_on_fault(srv);
        return;
    }
    if (s)
        session_release(s);
    /* Everyone that waited for room runs again (and may wait again). */
    session_release_all(srv, SESSION_HOLD_TIER_ANY);
}

/* Hands each part to its medium; s waits for them. Returns 1, or an error
 * after undoing the moves when no part started (a part that cannot start
 * after another did fails the job when the others end: undone then). */
static int start(tier_job_t *j, session_t *s)
{
    server_t *srv = j->srv;
    int rc = 0;
    j->pending = 1; /* no part ends the job while others are being started */
    for (int k = 0; k < PART_N; k++) {
        job_part_t *p = &j->part[k];
        tier_medium_t *m = part_medium(j, k);
        if (p->n == 0)
            continue;
        int prc = !m ? KVS_EINVAL
                  : k == PART_HOST_PUT || k == PART_DISK_PUT
                      ? m->ops->put(m, p->ids, p->slots, p->n, part_done, p)
                      : m->ops->get(m, p->ids, p->slots, p->n, part_done, p);
        if (prc == 0)
            j->pending++;
        else if (rc == 0)
            rc = prc;
    }
    if (rc != 0 && j->pending > 1) {
        j->res.status = rc; /* the started parts end it, undone */
        rc = 0;
    }
    j->pending--;
    if (rc != 0) {
        /* The caller lets go of the lookup's pins (tier.h). */
        bool undone = undo_moves(j);
        job_free(j);
        if (!undone)
            stop_on_fault(srv);
        return rc;
    }
    srv->tier_jobs++;
    if (s)
        s->tier_job = j;
    if (j->pending == 0) /* every part ended while being started */
        job_done(j, &j->res);
    return 1;
}

/* Tier-2 ids kept free (or being freed) ahead of demotions, beyond the
 * last demotion's: a sixteenth of a host tier of SPILL_AHEAD_MIN_TIER
 * blocks or more (a small one keeps its blocks), at most SPILL_AHEAD_MAX. */
#define SPILL_AHEAD_MIN_TIER 4096u
#define SPILL_AHEAD_MAX      16384u

/* How many tier-2 blocks to move down to the disk after a demotion of n:
 * enough that the next demotion of as many, and the room kept ahead, finds
 * free tier-2 ids, counting those that copies in flight will free. A demotion
 * that finds none makes its room itself (radix_demote: the request then
 * waits for a disk write); spilling ahead keeps those rare. */
static size_t spill_wanted(server_t *srv, size_t n)
{
    if (srv->tier3_blocks == 0)
        return 0;
    size_t ahead = srv->tier2_blocks >= SPILL_AHEAD_MIN_TIER ? srv->tier2_blocks / 16 : 0;
    ahead = ahead > SPILL_AHEAD_MAX ? SPILL_AHEAD_MAX : ahead;
    size_t ready = (size_t)radix_tier_free(srv->index, 2) + radix_tier_leaving(srv->index, 2);
    /* Not again before half the room kept ahead is used: spills go in
     * batches (merged on the disk, disk_io.c), and most promotions
     * read from a disk that writes nothing. */
    if (ready >= n + ahead / 2)
        return 0;
    return n + ahead - ready;
}

/* Moves up to n tier-2 blocks to the disk in a job of their own, which no
 * request waits for: its end releases whoever waits for any copy
 * (SESSION_HOLD_TIER_ANY), as every job's does. Nothing happens when the
 * index moves none or there is no memory for the job (a later demotion
 * makes its room itself). */
static void spill_start(server_t *srv, size_t n)
{
    if (n == 0)
        return;
    radix_move_t *moves = calloc(n, sizeof(*moves));
    if (!moves)
        return;
    size_t n_moved = 0;
    store_spill(srv->store, n, moves, &n_moved);
    if (n_moved == 0) {
        free(moves);
        return;
    }
    tier_job_t *j = job_new(srv, NULL, true, n_moved, 0);
    if (!j) {
        for (size_t i = n_moved; i-- > 0;) {
            uint32_t back;
            if (store_move_end(srv->store, moves[i].to, false, &back) != 0)
                LOG_ERROR("tier-3 block %u: the spill cannot be undone", moves[i].to);
        }
        free(moves);
        return;
    }
    for (size_t i = 0; i < n_moved; i++) {
        job_add(j, moves[i].from, moves[i].to);
        j->index_ids[i] = moves[i].to;
    }
    free(moves);
    int rc = start(j, NULL);
    if (rc < 0)
        LOG_DEBUG("a spill of %zu blocks to the disk did not start: %s", n_moved,
                  kvs_status_text(rc));
}

int tier_demote(server_t *srv, session_t *s, uint32_t ns, size_t n)
{
    radix_move_t *moves = calloc(n ? n : 1, sizeof(*moves));
    if (!moves)
        return KVS_ENOMEM;
    size_t n_moved = 0;
    int rc = store_demote(srv->store, ns, n, moves, &n_moved);
    if (rc != 0 || n_moved == 0) {
        free(moves);
        return rc;
    }
    tier_job_t *j = job_new(srv, s, true, n_moved, 0);
    if (!j) {
        /* The index already moved them: put them back, nothing copied. */
        for (size_t i = n_moved; i-- > 0;) {
            uint32_t back;
            if (store_move_end(srv->store, moves[i].to, false, &back) != 0)
                LOG_ERROR("tier-2 block %u: the demotion cannot be undone", moves[i].to);
        }
        free(moves);
        return KVS_ENOMEM;
    }
    for (size_t i = 0; i < n_moved; i++) {
        job_add(j, moves[i].from, moves[i].to);
        j->index_ids[i] = moves[i].to;
    }
    free(moves);
    rc = start(j, s);
    /* With a disk below host memory: room in host memory for the next
     * demotion, in a job of its own. This request waits only for its own
     * copies into host memory (a memcpy), not for the disk's writes (it
     * waited for both, in one job, before: every Alloc that demoted took
     * as long as a disk batch). */
    if (rc >= 0)
        spill_start(srv, spill_wanted(srv, n));
    return rc;
}

int tier_promote(server_t *srv, session_t *s, const uint32_t *pins, size_t n_pins, size_t first,
                 size_t n)
{
    const uint32_t *lower_ids = pins + first; /* the caller's copy: not changed */
    tier_job_t *j = job_new(srv, s, false, n, n_pins);
    if (!j)
        return KVS_ENOMEM;
    memcpy(j->pins, pins, n_pins * sizeof(*pins));
    size_t done = 0;
    j->pin_first = first;
    store_promote(srv->store, j->pins, first, n, j->index_ids, &done);
    if (done == 0) {
        job_free(j);
        return 0;
    }
    for (size_t i = 0; i < done; i++)
        job_add(j, lower_ids[i], j->index_ids[i]);
    j->n = done;
    return start(j, s);
}

bool tier_job_holds_pins(const tier_job_t *j)
{
    return j->n_pins > 0;
}

int tier_wait(server_t *srv, session_t *s)
{
    (void)s;
    return srv->tier_jobs > 0;
}

void tier_detach(session_t *s)
{
    if (s->tier_job) {
        s->tier_job->s = NULL;
        s->tier_job = NULL;
    }
}
