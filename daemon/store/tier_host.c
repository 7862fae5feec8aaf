/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host-memory tier (tier_medium.h): slots in the backend's tier memory
 * (--host-tier, backend_tier_open), copies on libuv's thread pool through
 * backend_tier_copy (a memcpy on the host backend, cuMemcpy on cuda). With
 * several devices each device's backend holds its shard of every slot, and
 * a batch copies every device's shards, each through its own backend.
 * Settings: host_tier_bytes (its capacity), tier_copy_nice.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvshare_status.h"
#include "log.h"
#include "server.h"
#include "tier_medium.h"

typedef struct host_medium {
    tier_medium_t m;
    server_t *srv;
    tier_medium_stats_t st;
} host_medium_t;

typedef struct host_batch {
    uv_work_t work;
    host_medium_t *hm;
    backend_tier_dir_t dir;
    const uint32_t *pool_ids, *slots;
    size_t n;
    tier_medium_done_fn done;
    void *arg;
    int rc;
    int nice_errno; /* setting this thread's nice failed (tier_copy_nice) */
    uint64_t copy_ns;
} host_batch_t;

/* Whether this thread of libuv's pool has taken tier_copy_nice. */
static _Thread_local bool copy_thread_niced;

/* The first batch on a thread of libuv's pool (only tier copies use it)
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
    host_batch_t *b = w->data;
    server_t *srv = b->hm->srv;
    if (!copy_thread_niced)
        b->nice_errno = nice_copy_thread(srv->cfg.tier_copy_nice);
    uint64_t t0 = uv_hrtime();
    double ms;
    b->rc = 0;
    for (uint32_t d = 0; d < srv->n_devices && b->rc == 0; d++)
        b->rc = backend_tier_copy(srv->backends[d], &srv->geo, srv->num_blocks, srv->tier2_blocks,
                                  b->dir, b->pool_ids, b->slots, b->n, &ms);
    b->copy_ns = uv_hrtime() - t0;
}

/* On the loop. A copy through the backend that fails is a device fault:
 * nothing the device holds can be trusted after it (fatal). */
static void copies_done(uv_work_t *w, int status)
{
    host_batch_t *b = w->data;
    host_medium_t *hm = b->hm;
    if (b->nice_errno)
        LOG_WARN("a tier copy thread keeps the loop thread's priority: tier_copy_nice %u: %s",
                 hm->srv->cfg.tier_copy_nice, strerror(b->nice_errno));
    tier_medium_result_t res = {.status = status != 0 ? KVS_EIO : b->rc, .copy_ns = b->copy_ns};
    res.fatal = res.status != 0;
    if (res.status != 0) {
        hm->st.failures++;
        LOG_ERROR("host tier: a batch of %zu copies failed: %s", b->n,
                  status != 0 ? uv_strerror(status) : kvs_status_text(b->rc));
    } else {
        hm->st.blocks += b->n;
    }
    tier_medium_done_fn done = b->done;
    void *arg = b->arg;
    free(b);
    done(arg, &res);
}

static int start(tier_medium_t *m, backend_tier_dir_t dir, const uint32_t *pool_ids,
                 const uint32_t *slots, size_t n, tier_medium_done_fn done, void *arg)
{
    host_medium_t *hm = (host_medium_t *)m;
    host_batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return KVS_ENOMEM;
    *b = (host_batch_t){.hm = hm,
                        .dir = dir,
                        .pool_ids = pool_ids,
                        .slots = slots,
                        .n = n,
                        .done = done,
                        .arg = arg};
    b->work.data = b;
    int rc = uv_queue_work(hm->srv->loop, &b->work, run_copies, copies_done);
    if (rc != 0) { /* cannot happen with a valid loop and callbacks */
        free(b);
        return KVS_EIO;
    }
    if (dir == BACKEND_TO_TIER)
        hm->st.puts++;
    else
        hm->st.gets++;
    return 0;
}

static int host_put(tier_medium_t *m, const uint32_t *pool_ids, const uint32_t *slots, size_t n,
                    tier_medium_done_fn done, void *arg)
{
    return start(m, BACKEND_TO_TIER, pool_ids, slots, n, done, arg);
}

static int host_get(tier_medium_t *m, const uint32_t *pool_ids, const uint32_t *slots, size_t n,
                    tier_medium_done_fn done, void *arg)
{
    return start(m, BACKEND_FROM_TIER, pool_ids, slots, n, done, arg);
}

/* Host memory keeps nothing about a slot: a dropped block's bytes stay until
 * the slot is written again. */
static void host_drop(tier_medium_t *m, const uint32_t *slots, size_t n)
{
    (void)m;
    (void)slots;
    (void)n;
}

static void host_stats(const tier_medium_t *m, tier_medium_stats_t *out)
{
    *out = ((const host_medium_t *)m)->st;
}

static void host_close(tier_medium_t *m)
{
    free(m);
}

static const tier_medium_ops_t host_ops = {
    .name = "host",
    .put = host_put,
    .get = host_get,
    .drop = host_drop,
    .stats = host_stats,
    .close = host_close,
};

int tier_host_open(server_t *srv, tier_medium_t **out)
{
    host_medium_t *hm = calloc(1, sizeof(*hm));
    if (!hm)
        return KVS_ENOMEM;
    hm->m.ops = &host_ops;
    hm->m.capacity = srv->tier2_blocks;
    hm->srv = srv;
    *out = &hm->m;
    return 0;
}
