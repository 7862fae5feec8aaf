/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host-memory tier (tier_medium.h): slots in the backend's tier memory
 * (--host-tier, backend_tier_open), copies on the tier's own threads through
 * backend_tier_copy (a memcpy on the host backend, cuMemcpy on cuda). With
 * several devices each device's backend holds its shard of every slot, and
 * a batch copies every device's shards, each through its own backend.
 * Settings: host_tier_bytes (its capacity), tier_copy_nice.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvshare_status.h"
#include "log.h"
#include "loop_wake.h"
#include "server.h"
#include "tier_medium.h"

/* Copy threads (libuv's pool, which did the copies before, has as many). */
#define HOST_COPY_THREADS 4

/* A batch of at most this many bytes (every device's shards) on the host
 * backend is copied on the loop thread when it starts: a memcpy of tens of
 * microseconds, less than handing it to a copy thread and waking the loop
 * back, and than a niced copy thread's wait for a CPU on a busy host (a
 * request waited milliseconds for the copy of a few 512-byte blocks). Its
 * end still reaches the loop the one way every batch's does (on_back, on
 * the loop's next turn): the medium never calls done inside put or get. */
#define HOST_INLINE_BYTES (256u * 1024u)

typedef struct host_batch {
    struct host_batch *next;
    backend_tier_dir_t dir;
    const uint32_t *pool_ids, *slots;
    size_t n;
    tier_medium_done_fn done;
    void *arg;
    int rc;
    uint64_t copy_ns;
} host_batch_t;

typedef struct host_medium {
    tier_medium_t m;
    server_t *srv;
    tier_medium_stats_t st;
    bool nice_warned; /* (loop) */
    loop_wake_t back; /* the copy threads wake the loop (loop_wake.h) */
    pthread_t threads[HOST_COPY_THREADS];
    uint32_t n_threads;
    pthread_mutex_t mu;             /* guards what follows */
    pthread_cond_t cv;              /* todo or stop */
    host_batch_t *todo, *todo_tail; /* oldest first */
    host_batch_t *ended, *ended_tail;
    int nice_errno; /* a thread could not take tier_copy_nice */
    bool stop;
} host_medium_t;

static void push(host_batch_t **head, host_batch_t **tail, host_batch_t *b)
{
    b->next = NULL;
    if (*tail)
        (*tail)->next = b;
    else
        *head = b;
    *tail = b;
}

/* Each copy thread makes itself `by` nicer than it started, which is the
 * loop thread's nice (the loop thread starts them). A copy is bulk work on
 * a thread that holds a CPU as long as it is given one; the loop thread
 * answers every session in a few microseconds per request. At equal nice,
 * on a machine with few CPUs, the loop waits on the run queue behind copies
 * and every session's p99 grows tenfold and more (docs/BENCHMARKS.md, "Tier
 * 2 and the loop"); nicer, the copies yield to it when it wakes and take
 * what it leaves. Linux applies nice per thread. Returns 0 or an errno. */
static int nice_copy_thread(uint32_t by)
{
    if (by == 0)
        return 0;
    errno = 0;
    int now = getpriority(PRIO_PROCESS, (id_t)gettid());
    if (now == -1 && errno != 0)
        return errno;
    int want = now + (int)by > 19 ? 19 : now + (int)by;
    return setpriority(PRIO_PROCESS, (id_t)gettid(), want) == 0 ? 0 : errno;
}

/* A copy thread: the batches in the order they came, each copied whole
 * (every device's shards), then handed back to the loop. */
static void *copy_thread(void *arg)
{
    host_medium_t *hm = arg;
    server_t *srv = hm->srv;
    int e = nice_copy_thread(srv->cfg.tier_copy_nice);
    pthread_mutex_lock(&hm->mu);
    if (e)
        hm->nice_errno = e;
    for (;;) {
        while (!hm->todo && !hm->stop)
            pthread_cond_wait(&hm->cv, &hm->mu);
        host_batch_t *b = hm->todo;
        if (!b)
            break; /* stopping, nothing left */
        hm->todo = b->next;
        if (!hm->todo)
            hm->todo_tail = NULL;
        pthread_mutex_unlock(&hm->mu);
        uint64_t t0 = uv_hrtime();
        double ms;
        b->rc = 0;
        for (uint32_t d = 0; d < srv->n_devices && b->rc == 0; d++)
            b->rc = backend_tier_copy(srv->backends[d], &srv->geo, srv->num_blocks,
                                      srv->tier2_blocks, b->dir, b->pool_ids, b->slots, b->n, &ms);
        b->copy_ns = uv_hrtime() - t0;
        pthread_mutex_lock(&hm->mu);
        push(&hm->ended, &hm->ended_tail, b);
        pthread_mutex_unlock(&hm->mu);
        loop_wake_send(&hm->back);
        pthread_mutex_lock(&hm->mu);
    }
    pthread_mutex_unlock(&hm->mu);
    return NULL;
}

/* On the loop: one batch ended. A copy through the backend that fails is a
 * device fault: nothing the device holds can be trusted after it (fatal). */
static void batch_done(host_medium_t *hm, host_batch_t *b)
{
    tier_medium_result_t res = {.status = b->rc, .copy_ns = b->copy_ns};
    res.fatal = res.status != 0;
    if (res.status != 0) {
        hm->st.failures++;
        LOG_ERROR("host tier: a batch of %zu copies failed: %s", b->n, kvs_status_text(b->rc));
    } else {
        hm->st.blocks += b->n;
    }
    loop_wake_release(&hm->back);
    tier_medium_done_fn done = b->done;
    void *arg = b->arg;
    free(b);
    done(arg, &res);
}

static void on_back(loop_wake_t *w)
{
    host_medium_t *hm = w->data;
    pthread_mutex_lock(&hm->mu);
    host_batch_t *b = hm->ended;
    hm->ended = hm->ended_tail = NULL;
    int nice_errno = hm->nice_errno;
    pthread_mutex_unlock(&hm->mu);
    if (nice_errno && !hm->nice_warned) {
        LOG_WARN("a tier copy thread keeps the loop thread's priority: tier_copy_nice %u: %s",
                 hm->srv->cfg.tier_copy_nice, strerror(nice_errno));
        hm->nice_warned = true;
    }
    while (b) {
        host_batch_t *next = b->next;
        batch_done(hm, b);
        b = next;
    }
}

/* Whether batch b is small enough to copy on the loop (HOST_INLINE_BYTES):
 * host backends only (a cuda copy may wait for another thread's, its
 * stream's turn). */
static bool copy_inline(const host_medium_t *hm, size_t n)
{
    const server_t *srv = hm->srv;
    if ((uint64_t)n * srv->block_bytes * srv->n_devices > HOST_INLINE_BYTES)
        return false;
    for (uint32_t d = 0; d < srv->n_devices; d++)
        if (backend_kind(srv->backends[d]) != BACKEND_HOST)
            return false;
    return true;
}

static int start(tier_medium_t *m, backend_tier_dir_t dir, const uint32_t *pool_ids,
                 const uint32_t *slots, size_t n, tier_medium_done_fn done, void *arg)
{
    host_medium_t *hm = (host_medium_t *)m;
    server_t *srv = hm->srv;
    host_batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return KVS_ENOMEM;
    *b = (host_batch_t){
        .dir = dir, .pool_ids = pool_ids, .slots = slots, .n = n, .done = done, .arg = arg};
    if (copy_inline(hm, n)) {
        uint64_t t0 = uv_hrtime();
        double ms;
        for (uint32_t d = 0; d < srv->n_devices && b->rc == 0; d++)
            b->rc = backend_tier_copy(srv->backends[d], &srv->geo, srv->num_blocks,
                                      srv->tier2_blocks, dir, pool_ids, slots, n, &ms);
        b->copy_ns = uv_hrtime() - t0;
        pthread_mutex_lock(&hm->mu);
        push(&hm->ended, &hm->ended_tail, b);
        pthread_mutex_unlock(&hm->mu);
        loop_wake_send(&hm->back);
    } else {
        pthread_mutex_lock(&hm->mu);
        push(&hm->todo, &hm->todo_tail, b);
        pthread_cond_signal(&hm->cv);
        pthread_mutex_unlock(&hm->mu);
    }
    loop_wake_hold(&hm->back); /* the loop runs until the batch is done */
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

static void on_closed(loop_wake_t *w)
{
    host_medium_t *hm = w->data;
    pthread_cond_destroy(&hm->cv);
    pthread_mutex_destroy(&hm->mu);
    free(hm);
}

/* The threads end (no batch is in flight: the server waited for them), and
 * the medium is freed on a later turn of the loop. */
static void host_close(tier_medium_t *m)
{
    host_medium_t *hm = (host_medium_t *)m;
    pthread_mutex_lock(&hm->mu);
    hm->stop = true;
    pthread_cond_broadcast(&hm->cv);
    pthread_mutex_unlock(&hm->mu);
    for (uint32_t i = 0; i < hm->n_threads; i++)
        pthread_join(hm->threads[i], NULL);
    loop_wake_close(&hm->back, on_closed);
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
    int rc = loop_wake_init(srv->loop, &hm->back, on_back);
    if (rc != 0) {
        free(hm);
        return rc;
    }
    hm->back.data = hm;
    loop_wake_unref(&hm->back); /* idle: the loop may end */
    pthread_mutex_init(&hm->mu, NULL);
    pthread_cond_init(&hm->cv, NULL);
    for (; hm->n_threads < HOST_COPY_THREADS; hm->n_threads++)
        if (pthread_create(&hm->threads[hm->n_threads], NULL, copy_thread, hm) != 0)
            break;
    if (hm->n_threads == 0) {
        host_close(&hm->m);
        return KVS_ENOMEM;
    }
    *out = &hm->m;
    return 0;
}
