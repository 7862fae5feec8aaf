/* SPDX-License-Identifier: Apache-2.0 */
#include "tier.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvshare_status.h"
#include "log.h"
#include "session.h"
#include "store.h"

struct tier_job {
    uv_work_t work;
    server_t *srv;
    session_t *s; /* NULL once the session has ended */
    backend_tier_dir_t dir;
    size_t n;            /* blocks copied */
    uint32_t *pool_ids;  /* [n] */
    uint32_t *tier_ids;  /* [n], tier-2 slots (index ids minus the pool size) */
    uint32_t *index_ids; /* [n], what radix_copy_done takes */
    uint32_t *pins;      /* [n_pins], pins the job holds (tier-1 ids) */
    size_t n_pins;
    int rc;
    int nice_errno; /* setting this thread's nice failed (tier_copy_nice) */
    double ms;
    uint64_t copy_ns; /* wall time of the batch on its thread */
};

static tier_job_t *job_new(server_t *srv, session_t *s, backend_tier_dir_t dir, size_t n,
                           size_t n_pins)
{
    tier_job_t *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->pool_ids = calloc(n, sizeof(uint32_t));
    j->tier_ids = calloc(n, sizeof(uint32_t));
    j->index_ids = calloc(n, sizeof(uint32_t));
    j->pins = calloc(n_pins ? n_pins : 1, sizeof(uint32_t));
    if (!j->pool_ids || !j->tier_ids || !j->index_ids || !j->pins) {
        free(j->pool_ids);
        free(j->tier_ids);
        free(j->index_ids);
        free(j->pins);
        free(j);
        return NULL;
    }
    j->work.data = j;
    j->srv = srv;
    j->s = s;
    j->dir = dir;
    j->n = n;
    j->n_pins = n_pins;
    return j;
}

static void job_free(tier_job_t *j)
{
    free(j->pool_ids);
    free(j->tier_ids);
    free(j->index_ids);
    free(j->pins);
    free(j);
}

/* Whether this thread of libuv's pool has taken tier_copy_nice. */
static _Thread_local bool copy_thread_niced;

/* The first job on a thread of libuv's pool (only tier copies use it)
 * makes it `by` nicer than it started, which is the loop thread's nice (the
 * loop thread starts libuv's threads). A copy is bulk work on a thread that
 * holds a CPU as long as it is given one; the loop thread answers every
 * session in a few microseconds per request. At equal nice, on a machine
 * with few CPUs, the loop waits on the run queue behind copies and every
 * session's p99 grows tenfold and more (docs/BENCHMARKS.md, "Tier 2 and the
 * loop"); nicer, the copies yield to it when it wakes and take what it
 * leaves. Linux applies nice per thread. Returns 0 or an errno. */
static int nice_copy_thread(uint32_t by)
{
    copy_thread_niced = true;
    if (by == 0)
        return 0;
    errno = 0;
    int now = getpriority(PRIO_PROCESS, (id_t)gettid());
    if (now == -1 && errno != 0)
        return errno;
    int want = now + (int)by > 19 ? 19 : now + (int)by;
    return setpriority(PRIO_PROCESS, (id_t)gettid(), want) == 0 ? 0 : errno;
}

/* On a thread of the pool: the copies of the whole batch. */
static void run_copies(uv_work_t *w)
{
    tier_job_t *j = w->data;
    server_t *srv = j->srv;
    if (!copy_thread_niced)
        j->nice_errno = nice_copy_thread(srv->cfg.tier_copy_nice);
    uint64_t t0 = uv_hrtime();
    j->rc = backend_tier_copy(srv->backend, &srv->geo, srv->num_blocks, srv->tier2_blocks, j->dir,
                              j->pool_ids, j->tier_ids, j->n, &j->ms);
    j->copy_ns = uv_hrtime() - t0;
}

/* On the loop: every block's copy ends in the index, freed tier-1 ids go
 * back to the pool, the job's pins go, and the session's request runs again. */
static void copies_done(uv_work_t *w, int status)
{
    tier_job_t *j = w->data;
    server_t *srv = j->srv;
    bool failed = status != 0 || j->rc != 0;
    if (j->nice_errno)
        LOG_WARN("a tier copy thread keeps the loop thread's priority: tier_copy_nice %u: %s",
                 srv->cfg.tier_copy_nice, strerror(j->nice_errno));
    if (failed) {
        srv->metrics.tier_copy_failures++;
        LOG_ERROR("tier-2 %s of %zu blocks failed: %s",
                  j->dir == BACKEND_TO_TIER ? "demotion" : "promotion", j->n,
                  status != 0 ? uv_strerror(status) : kvs_status_text(j->rc));
    }
    for (size_t i = 0; i < j->n; i++) {
        uint32_t peer;
        if (radix_copy_done(srv->index, j->index_ids[i], &peer) != 0) {
            LOG_ERROR("tier-2 block %u was not being copied", j->index_ids[i]);
            continue;
        }
        if (j->dir == BACKEND_TO_TIER && pool_release(srv->pool, peer) != 0)
            LOG_ERROR("demoted block %u was not cached in the pool", peer);
    }
    if (j->dir == BACKEND_TO_TIER)
        srv->metrics.tier_demotions += j->n;
    else
        srv->metrics.tier_promotions += j->n;
    srv->metrics.tier_copied_bytes += (uint64_t)j->n * srv->block_bytes;
    srv->metrics.tier_copy_us += j->copy_ns / 1000;
    metrics_observe(&srv->metrics.tier_copy_time[j->dir], metrics_latency_bounds_ns,
                    metrics_latency_n_bounds, j->copy_ns);
    srv->tier_jobs--;
    for (size_t i = 0; i < j->n_pins; i++)
        if (radix_unpin(srv->index, j->pins[i]) != 0)
            LOG_ERROR("tier-2 job: pin on block %u was not in the index", j->pins[i]);
    session_t *s = j->s;
    job_free(j);
    if (failed) {
        /* The index now says these blocks hold bytes that were never
         * copied, and after a device fault nothing else it holds can be
         * trusted either. Stop before anyone reads them: every session gets
         * its goodbye (the request waiting for these copies is never
         * answered with them), and kvshared exits with status 1. */
        if (s)
            s->tier_job = NULL;
        LOG_ERROR("stopping: a copy between the pool and tier 2 failed, so blocks in the index "
                  "hold bytes that were not copied; workers recompute until kvshared is "
                  "restarted");
        srv->failed = true;
        server_shutdown(srv);
        return;
    }
    if (s) {
        s->tier_job = NULL;
        session_resume(s);
    }
    /* Everyone that waited for room runs again (and may wait again). */
    session_t *waiter = srv->tier_waiters;
    srv->tier_waiters = NULL;
    while (waiter) {
        session_t *next = waiter->tier_wait_next;
        waiter->tier_waiting = false;
        waiter->tier_wait_prev = waiter->tier_wait_next = NULL;
        session_resume(waiter);
        waiter = next;
    }
}

static int start(tier_job_t *j, session_t *s)
{
    int rc = uv_queue_work(j->srv->loop, &j->work, run_copies, copies_done);
    if (rc != 0)
        return rc; /* cannot happen with a valid loop and callbacks */
    j->srv->tier_jobs++;
    if (s)
        s->tier_job = j;
    return 1;
}

int tier_demote(server_t *srv, session_t *s, uint32_t ns, size_t n)
{
    radix_move_t *moves = calloc(n ? n : 1, sizeof(*moves));
    if (!moves)
        return KVS_ENOMEM;
    size_t n_moved = 0, n_dropped = 0;
    int rc = radix_demote(srv->index, ns, n, moves, &n_moved, &n_dropped);
    srv->metrics.tier_drops_t1 += n_dropped;
    if (rc != 0 || n_moved == 0) {
        free(moves);
        return rc;
    }
    tier_job_t *j = job_new(srv, s, BACKEND_TO_TIER, n_moved, 0);
    if (!j) {
        /* The index already moved them: finish without copying, as a drop
         * would (the tier-2 copy is garbage, so give back both ids). */
        for (size_t i = 0; i < n_moved; i++) {
            uint32_t peer;
            radix_copy_done(srv->index, moves[i].to, &peer);
            pool_release(srv->pool, peer);
        }
        free(moves);
        return KVS_ENOMEM;
    }
    for (size_t i = 0; i < n_moved; i++) {
        uint32_t from = moves[i].from, to = moves[i].to;
        j->pool_ids[i] = from;
        j->tier_ids[i] = to - srv->num_blocks;
        j->index_ids[i] = to;
        /* What names the block goes with it (server.h: by index id). */
        srv->store->rec[to].meta = srv->store->rec[from].meta;
    }
    free(moves);
    return start(j, s);
}

int tier_promote(server_t *srv, session_t *s, const uint32_t *t2_ids, size_t n,
                 const uint32_t *pins, size_t n_pins)
{
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    size_t m = n < c.free ? n : c.free;
    if (m == 0)
        return 0;
    tier_job_t *j = job_new(srv, s, BACKEND_FROM_TIER, m, n_pins);
    if (!j)
        return KVS_ENOMEM;
    if (pool_alloc(srv->pool, (uint32_t)m, j->pool_ids) != 0) {
        job_free(j);
        return 0;
    }
    memcpy(j->pins, pins, n_pins * sizeof(*pins));
    uint64_t now = uv_now(srv->loop);
    size_t done = 0;
    for (; done < m; done++) {
        uint32_t id = j->pool_ids[done];
        int prc = radix_promote(srv->index, t2_ids[done], id);
        if (prc != 0) {
            LOG_DEBUG("promotion of tier-2 block %u to %u stopped: %s", t2_ids[done], id,
                      kvs_status_text(prc));
            break;
        }
        pool_set_cached(srv->pool, id);
        /* What names the block goes with it (server.h: by index id); moving
         * between the tiers publishes no KV event. */
        uint32_t from = t2_ids[done];
        srv->store->rec[id].meta = srv->store->rec[from].meta;
        srv->store->rec[id].used_ms = now;
        j->tier_ids[done] = t2_ids[done] - srv->num_blocks;
        j->index_ids[done] = id;
        /* The lookup's pin on the tier-2 id is on the tier-1 id now. */
        for (size_t k = 0; k < n_pins; k++)
            if (j->pins[k] == t2_ids[done])
                j->pins[k] = id;
    }
    for (size_t i = done; i < m; i++)
        pool_release(srv->pool, j->pool_ids[i]);
    if (done == 0) {
        job_free(j);
        return 0;
    }
    j->n = done;
    return start(j, s);
}

bool tier_job_holds_pins(const tier_job_t *j)
{
    return j->n_pins > 0;
}

int tier_wait(server_t *srv, session_t *s)
{
    if (srv->tier_jobs == 0 || s->tier_waiting)
        return 0;
    s->tier_waiting = true;
    s->tier_wait_prev = NULL;
    s->tier_wait_next = srv->tier_waiters;
    if (srv->tier_waiters)
        srv->tier_waiters->tier_wait_prev = s;
    srv->tier_waiters = s;
    return 1;
}

void tier_detach(session_t *s)
{
    if (s->tier_waiting) {
        if (s->tier_wait_prev)
            s->tier_wait_prev->tier_wait_next = s->tier_wait_next;
        else
            s->srv->tier_waiters = s->tier_wait_next;
        if (s->tier_wait_next)
            s->tier_wait_next->tier_wait_prev = s->tier_wait_prev;
        s->tier_waiting = false;
    }
    if (s->tier_job) {
        s->tier_job->s = NULL;
        s->tier_job = NULL;
    }
}
