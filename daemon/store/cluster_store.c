/* SPDX-License-Identifier: Apache-2.0 */
#include "cluster_store.h"

#include "cluster.h"
#include "cluster_tier.h"
#include "config.h"
#include "kvshare_status.h"
#include "log.h"
#include "loop_wake.h"
#include "namespaces.h"
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ---- the cluster thread ----
 *
 * The hiredis connections, the values' checksums and every copy of a
 * block's bytes (out of the pool into a value, a value into the command,
 * a reply into the pool) cost milliseconds for 2 MiB blocks: they run on
 * a thread of its own, with its own libuv loop, so that a tier-1 Lookup
 * never waits behind them. The daemon's loop keeps the index and the pool's
 * bookkeeping: it pins a committed block until the thread has copied it out,
 * and takes free pool blocks for a fetch before the thread writes into them.
 * Jobs go to the thread, and results come back, through a queue each under
 * one mutex; a uv_async_t wakes the thread, a loop_wake_t the loop (which
 * must never wait for the niced thread: loop_wake.h). The thread gathers
 * its results in an outbox and hands them over around each of its polls
 * (outbox_flush): one lock and one wake-up of the loop for every write a
 * burst copied out, not one each. */

/* Bytes not yet written to the sockets before a write waits. */
#define CLUSTER_STORE_UNSENT_BYTES (256u << 10)

typedef enum job_kind { JOB_PUT, JOB_FETCH, JOB_TOUCH, JOB_CLEAR } job_kind_t;

typedef struct job {
    struct job *next;
    job_kind_t kind;
    /* JOB_PUT: pool block id, pinned until its result comes back; its
     * name (owned). */
    uint32_t id;
    char *ns;
    uint64_t identity;   /* the namespace's identity hash (every kind but JOB_FETCH) */
    uint64_t written_us; /* JOB_PUT: the commit's stamp (link_stamp) */
    uint32_t timeout_ms; /* JOB_CLEAR: its deadline, from its start */
    uint64_t hash;
    uint32_t *tokens;
    /* JOB_TOUCH: n_hashes blocks of ns (hashes owned) to mark used. */
    uint64_t *hashes;
    size_t n_hashes;
    /* JOB_FETCH, and its result: the fetch (below). */
    struct cluster_fetch *fetch;
} job_t;

typedef struct cluster_link {
    server_t *srv;
    uv_thread_t thread;
    uv_mutex_t mu;
    /* Under mu. */
    job_t *jobs, *jobs_tail;       /* to the cluster thread */
    job_t *results, *results_tail; /* back: writes copied out, fetches ended */
    int stop;
    cluster_stats_t cs; /* the last snapshot of the thread's counters */
    cluster_tier_stats_t ts;
    cluster_node_stats_t nodes[CLUSTER_MAX_NODES];
    size_t n_nodes;
    uint32_t settings_warnings; /* problems the settings check found */
    /* The cluster thread's. */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t snap;
    cluster_t *c;
    cluster_tier_t *t;
    unsigned char *value; /* a value being built (the largest so far) */
    size_t value_cap;
    job_t *pending, *pending_tail; /* writes waiting for room in the tier */
    job_t *outbox, *outbox_tail;   /* results not handed to the loop yet */
    uv_prepare_t before_poll;      /* hand them over (outbox_flush) */
    uv_check_t after_poll;
    int settings_asked; /* the masters' settings check started */
    /* The daemon's loop's. */
    loop_wake_t back;
    uint32_t puts_queued; /* writes handed over whose blocks are still pinned */
    uint32_t max_queued;  /* of them at most */
    uint32_t max_puts;    /* writes in flight to the cluster at most */
    uint64_t put_drops;   /* writes dropped before the thread saw them */
    uint64_t last_stamp;  /* the last stamp given (link_stamp) */
    /* Each Clear's cut, per namespace name and identity: values written
     * before it are never fetched again by this daemon. */
    struct cluster_cut {
        char *name;
        uint64_t identity;
        uint64_t cut_us;
    } * cuts;
    size_t n_cuts;
} cluster_link_t;

static void job_free(job_t *j)
{
    free(j->hashes);
    free(j->ns);
    free(j->tokens);
    free(j);
}

/* Appends the list first..last to the list at *head / *tail (mu held
 * where the list is shared). */
static void job_splice(job_t **head, job_t **tail, job_t *first, job_t *last)
{
    if (*tail)
        (*tail)->next = first;
    else
        *head = first;
    *tail = last;
}

/* Appends j to the list at *head / *tail (mu held where it is shared). */
static void job_push(job_t **head, job_t **tail, job_t *j)
{
    j->next = NULL;
    job_splice(head, tail, j, j);
}

/* Copies the thread's counters where the loop reads them (on the thread). */
static void link_snapshot(cluster_link_t *l)
{
    cluster_stats_t cs;
    cluster_tier_stats_t ts;
    cluster_get_stats(l->c, &cs);
    cluster_tier_get_stats(l->t, &ts);
    uv_mutex_lock(&l->mu);
    l->cs = cs;
    l->ts = ts;
    l->n_nodes = cluster_get_nodes(l->c, l->nodes, CLUSTER_MAX_NODES);
    uv_mutex_unlock(&l->mu);
}

static void thread_put_more(cluster_link_t *l);

/* The masters' eviction settings were checked (on the thread). */
static void on_settings_checked(void *arg, uint32_t warnings, uint32_t checked, uint32_t unchecked)
{
    cluster_link_t *l = arg;
    (void)checked;
    (void)unchecked;
    uv_mutex_lock(&l->mu);
    l->settings_warnings = warnings;
    uv_mutex_unlock(&l->mu);
}

static void on_snap(uv_timer_t *h)
{
    cluster_link_t *l = h->data;
    /* Once, when the slot map is first known: Redis's eviction settings
     * decide the tier's hit rate (cluster.h). */
    if (!l->settings_asked && cluster_ready(l->c)) {
        l->settings_asked = 1;
        int rc = cluster_check_settings(l->c, on_settings_checked, l);
        if (rc != 0)
            LOG_INFO("cluster tier: the masters' eviction settings were not checked: %s",
                     kvs_status_text(rc));
    }
    thread_put_more(l);
    cluster_tier_tick(l->t);
    link_snapshot(l);
}

/* Job j (a write copied out, a fetch ended) goes back to the loop with
 * the others of this turn of the thread's loop (on the thread). */
static void link_return(cluster_link_t *l, job_t *j)
{
    job_push(&l->outbox, &l->outbox_tail, j);
}

/* Hands the outbox to the loop (on the thread): before the thread's loop
 * polls (what its timers and wake-ups returned) and after (what the
 * replies returned), so that nothing waits in it across a poll. */
static void outbox_flush(cluster_link_t *l)
{
    if (!l->outbox)
        return;
    uv_mutex_lock(&l->mu);
    job_splice(&l->results, &l->results_tail, l->outbox, l->outbox_tail);
    uv_mutex_unlock(&l->mu);
    l->outbox = l->outbox_tail = NULL;
    loop_wake_send(&l->back);
}

static void on_before_poll(uv_prepare_t *h)
{
    outbox_flush(h->data);
}

static void on_after_poll(uv_check_t *h)
{
    outbox_flush(h->data);
}

/* ---- the pool, from the cluster thread ----
 *
 * The blocks touched here are the thread's for the time: a committed block
 * pinned by the loop (it cannot be evicted, moved or written), or a free
 * block the loop took for a fetch (WRITING, no session's). The backend is
 * used from other threads the same way by tier copies. */

/* Copies the pinned block of j into a value and sends it (counted by the
 * tier: sent, or dropped when too many are in flight). */
static void thread_put(cluster_link_t *l, job_t *j)
{
    server_t *srv = l->srv;
    cluster_block_t b = {.ns = j->ns,
                         .ns_len = strlen(j->ns),
                         .hash = j->hash,
                         .tokens = j->tokens,
                         .n_tokens = srv->geo.block_tokens,
                         .payload_len = geometry_block_bytes(&srv->geo),
                         .identity = j->identity,
                         .written_us = j->written_us};
    size_t vlen = cluster_value_size(&b);
    if (vlen > l->value_cap) {
        free(l->value);
        l->value = malloc(vlen);
        l->value_cap = l->value ? vlen : 0;
    }
    /* The payload goes straight where the value wants it. */
    if (l->value && store_block_read(srv->store, j->id, l->value + (vlen - b.payload_len)) == 0)
        (void)cluster_tier_put_value(l->t, &b, l->value);
}

/* Sends the waiting writes the tier has room for; each one's block is
 * copied out on the way, and its pin goes back to the loop (on the thread). */
static void thread_put_more(cluster_link_t *l)
{
    /* A write waits while CLUSTER_STORE_UNSENT_BYTES are not on the wire
     * yet (cluster_unsent_bytes): the next reply, or the snapshot timer,
     * sends it. */
    while (l->pending && l->t && cluster_tier_put_room(l->t) &&
           cluster_unsent_bytes(l->c) < CLUSTER_STORE_UNSENT_BYTES) {
        job_t *j = l->pending;
        l->pending = j->next;
        if (!l->pending)
            l->pending_tail = NULL;
        thread_put(l, j);
        link_return(l, j);
    }
}

static void on_put_done(void *arg)
{
    thread_put_more(arg);
}

static void touch_done(void *arg, int status, const char *data, size_t len)
{
    (void)arg;
    (void)status;
    (void)data;
    (void)len;
}

/* Marks the blocks of j used in the cluster (TOUCH): blocks a node hits in
 * its own pool are read from nowhere else, and Redis's LRU would otherwise
 * see the head of a chain as older than its tail and drop it first, which
 * loses the whole chain for every other node. Best effort: a TOUCH the
 * client refuses (too many in flight, node down) is skipped. */
static void thread_touch(cluster_link_t *l, const job_t *j)
{
    server_t *srv = l->srv;
    for (size_t i = 0; i < j->n_hashes; i++) {
        cluster_block_t b = {.ns = j->ns,
                             .ns_len = strlen(j->ns),
                             .hash = j->hashes[i],
                             .n_tokens = srv->geo.block_tokens,
                             .payload_len = geometry_block_bytes(&srv->geo),
                             .identity = j->identity};
        char key[512];
        int klen = cluster_tier_key(l->t, &b, key, sizeof key);
        if (klen < 0)
            continue;
        const char *argv[2] = {"TOUCH", key};
        size_t lens[2] = {5, (size_t)klen};
        if (cluster_command(l->c, key, (size_t)klen, 2, argv, lens, touch_done, NULL) != 0)
            break;
    }
}

/* ---- fetches on a Lookup miss ---- */

/* One Lookup's fetch. The loop makes it, takes free pool blocks for it,
 * and hands it to the cluster thread; until it comes back the loop
 * touches only link and s, and the thread writes the blocks ids[j]
 * and written[j]. */
typedef struct cluster_fetch {
    server_t *srv;
    session_t *s;     /* NULL once the session is gone */
    list_node_t link; /* on server_t.cluster_fetches */
    uint32_t ns;
    char *name;        /* the namespace's name */
    uint64_t identity; /* its identity hash */
    uint64_t cut_us;   /* values written before this are not its blocks (a Clear) */
    uint32_t *tokens;  /* (m + k) blocks */
    uint64_t *hashes;  /* want: the chain hashes of blocks m .. m + want */
    size_t m;          /* blocks cached before */
    size_t want;       /* blocks after them the fetch may ask for */
    size_t base, k;    /* the round in flight asks for blocks base .. k; k taken */
    uint32_t *prefix;  /* m: the cached blocks, pinned while the fetch runs */
    size_t n_pinned;   /* of them pinned (the first n_pinned) */
    uint32_t *ids;     /* want: pool blocks, the first k taken for them */
    uint8_t *written;  /* want: block m + j arrived, verified, is in ids[j] */
    uint64_t start_ns;
} cluster_fetch_t;

/* Unlinks and frees f; its pool blocks are given back unless taken
 * (ids == NULL) by store_install_done. */
static void fetch_free(server_t *srv, cluster_fetch_t *f)
{
    list_remove(&srv->cluster_fetches, &f->link);
    if (f->s)
        f->s->cluster_fetch = NULL;
    if (f->ids) {
        uint32_t none = 0;
        size_t installed = 0;
        store_install_done(srv->store, f->ns, f->tokens, &none, 0, f->ids, 0, f->k, &installed);
    }
    for (size_t i = 0; i < f->n_pinned; i++)
        store_unpin(srv->store, f->prefix[i]);
    free(f->prefix);
    free(f->ids);
    free(f->written);
    free(f->tokens);
    free(f->hashes);
    free(f->name);
    free(f);
}

/* On the cluster thread: payload bytes [off, off + n) of block m + j, one
 * layer's K or V slot (the fetch asks for pieces of slot bytes), go to
 * their place in pool block ids[j]. */
static int thread_fetch_piece(void *arg, size_t j, size_t off, const void *src, size_t n)
{
    cluster_fetch_t *f = arg;
    server_t *srv = f->srv;
    uint64_t slot = geometry_slot_bytes(&srv->geo);
    uint32_t planes = geometry_planes(&srv->geo);
    uint64_t piece = off / slot;
    if (off % slot != 0 || n != slot || piece >= (uint64_t)srv->geo.layers * planes)
        return KVS_EINVAL;
    uint64_t at = geometry_offset(&srv->geo, srv->num_blocks, (uint32_t)(piece / planes),
                                  (uint32_t)(piece % planes), f->ids[f->base + j]);
    return backend_write(srv->backend, at, src, n);
}

/* On the cluster thread: block m + j verified, every piece of it in its
 * pool block. */
static void thread_fetch_block(void *arg, size_t j, const void *payload, size_t len)
{
    cluster_fetch_t *f = arg;
    (void)payload;
    if (len == geometry_block_bytes(&f->srv->geo))
        f->written[f->base + j] = 1;
}

static void thread_fetch_done(void *arg, const uint8_t *hits, size_t n)
{
    cluster_fetch_t *f = arg;
    cluster_link_t *l = f->srv->cluster;
    (void)hits;
    (void)n;
    /* The counters first: a Stats after the Lookup sees this fetch's. */
    link_snapshot(l);
    job_t *r = calloc(1, sizeof *r);
    if (!r)
        abort(); /* the loop would hold the pool blocks and the session */
    r->kind = JOB_FETCH;
    r->fetch = f;
    link_return(l, r);
}

/* On the cluster thread: asks for f's blocks of this round (base .. k).
 * Returns 0 (thread_fetch_done will run) or an error (it will not). */
static int thread_fetch_start(cluster_link_t *l, cluster_fetch_t *f)
{
    uint32_t bt = f->srv->geo.block_tokens;
    size_t n = f->k - f->base;
    cluster_block_t *blocks = malloc(n * sizeof(*blocks));
    if (!blocks)
        return KVS_ENOMEM;
    for (size_t j = 0; j < n; j++)
        blocks[j] = (cluster_block_t){.ns = f->name,
                                      .ns_len = strlen(f->name),
                                      .hash = f->hashes[f->base + j],
                                      .tokens = f->tokens + (f->m + f->base + j) * bt,
                                      .n_tokens = bt,
                                      .payload_len = geometry_block_bytes(&f->srv->geo),
                                      .identity = f->identity,
                                      .written_us = f->cut_us};
    int rc = cluster_tier_fetch_into(l->t, blocks, n, geometry_slot_bytes(&f->srv->geo),
                                     thread_fetch_piece, thread_fetch_block, thread_fetch_done, f);
    free(blocks);
    return rc;
}

/* ---- clears ---- */

/* On the cluster thread: a clear ended (or the tier closed). */
static void thread_clear_done(void *arg, uint64_t deleted, int whole, size_t left)
{
    job_t *j = arg;
    if (whole)
        LOG_INFO("cluster tier: namespace '%s' cleared: %llu keys deleted", j->ns,
                 (unsigned long long)deleted);
    else
        LOG_WARN("cluster tier: the clear of namespace '%s' ended with keys left on %zu "
                 "master%s (cluster_clear_timeout_ms %u, or the cluster unreachable): %llu keys "
                 "deleted; this daemon still never fetches what was written before it",
                 j->ns, left, left == 1 ? "" : "s", j->timeout_ms, (unsigned long long)deleted);
    job_free(j);
}

/* On the cluster thread: the writes of j's namespace and identity still
 * waiting go back unsent (they were committed before the Clear: their
 * keys would be written after its SCAN passed them), then the clear
 * starts; the writes sent before it reach each master before its SCAN
 * does (one connection per master, in order). j is kept until it ends. */
static void thread_clear(cluster_link_t *l, job_t *j)
{
    job_t *keep = NULL, *keep_tail = NULL;
    while (l->pending) {
        job_t *p = l->pending;
        l->pending = p->next;
        if (p->identity == j->identity && strcmp(p->ns, j->ns) == 0)
            link_return(l, p);
        else
            job_push(&keep, &keep_tail, p);
    }
    l->pending = keep;
    l->pending_tail = keep_tail;
    int rc = cluster_tier_clear(l->t, j->ns, strlen(j->ns), j->identity, j->timeout_ms,
                                thread_clear_done, j);
    if (rc != 0) {
        LOG_WARN("cluster tier: cannot clear namespace '%s' in the cluster: %s", j->ns,
                 kvs_status_text(rc));
        job_free(j);
    }
}

/* ---- the thread's loop ---- */

static void thread_close_cb(uv_handle_t *h)
{
    (void)h;
}

/* Jobs arrived, or the loop asks the thread to stop (on the thread). */
static void on_wake(uv_async_t *h)
{
    cluster_link_t *l = h->data;
    uv_mutex_lock(&l->mu);
    job_t *jobs = l->jobs;
    int stop = l->stop;
    l->jobs = l->jobs_tail = NULL;
    uv_mutex_unlock(&l->mu);
    while (jobs) {
        job_t *j = jobs;
        jobs = j->next;
        if (j->kind == JOB_TOUCH) {
            if (!stop)
                thread_touch(l, j);
            job_free(j);
            continue;
        }
        if (j->kind == JOB_CLEAR) {
            if (!stop)
                thread_clear(l, j);
            else
                job_free(j);
            continue;
        }
        if (j->kind == JOB_PUT) {
            if (stop)
                link_return(l, j); /* its block's pin goes, unsent */
            else
                job_push(&l->pending, &l->pending_tail, j);
            continue;
        }
        if (!stop && thread_fetch_start(l, j->fetch) != 0) {
            thread_fetch_done(j->fetch, NULL, 0);
        }
        /* A fetch not started while stopping stays on the loop's list,
         * which gives its blocks back once the thread is gone. */
        job_free(j);
    }
    if (!stop)
        thread_put_more(l);
    if (stop) {
        while (l->pending) {
            job_t *j = l->pending;
            l->pending = j->next;
            link_return(l, j);
        }
        l->pending_tail = NULL;
        link_snapshot(l);
        /* In-flight work ends into the void: the loop frees its side. */
        cluster_tier_free(l->t);
        l->t = NULL;
        cluster_close(l->c);
        l->c = NULL;
        free(l->value);
        l->value = NULL;
        outbox_flush(l);
        uv_close((uv_handle_t *)&l->wake, thread_close_cb);
        uv_close((uv_handle_t *)&l->snap, thread_close_cb);
        uv_close((uv_handle_t *)&l->before_poll, thread_close_cb);
        uv_close((uv_handle_t *)&l->after_poll, thread_close_cb);
    } else {
        link_snapshot(l);
    }
}

/* The cluster thread copies and checksums blocks as long as it is given a
 * CPU; the daemon's loop answers each session in microseconds. With few
 * CPUs, at equal nice the loop waits on the run queue behind it: it runs
 * tier_copy_nice nicer, as the tier copy threads do (Linux: nice is per
 * thread). */
static void thread_main(void *arg)
{
    cluster_link_t *l = arg;
    uint32_t by = l->srv->cfg.tier_copy_nice;
    errno = 0;
    int now = getpriority(PRIO_PROCESS, (id_t)gettid());
    if (by > 0 && !(now == -1 && errno != 0)) {
        int want = now + (int)by > 19 ? 19 : now + (int)by;
        if (setpriority(PRIO_PROCESS, (id_t)gettid(), want) != 0)
            LOG_WARN("the cluster tier's thread keeps the loop thread's priority: "
                     "tier_copy_nice %u: %s",
                     by, strerror(errno));
    }
    uv_run(&l->loop, UV_RUN_DEFAULT);
}

/* ---- the daemon's loop ---- */

static void fetch_finish(server_t *srv, cluster_fetch_t *f);

/* Results are in: unpin the blocks of writes, end the fetches. */
static void on_back(loop_wake_t *h)
{
    cluster_link_t *l = h->data;
    uv_mutex_lock(&l->mu);
    job_t *r = l->results;
    l->results = l->results_tail = NULL;
    uv_mutex_unlock(&l->mu);
    while (r) {
        job_t *next = r->next;
        if (r->kind == JOB_PUT) {
            store_unpin(l->srv->store, r->id);
            l->puts_queued--;
        } else {
            fetch_finish(l->srv, r->fetch);
        }
        job_free(r);
        r = next;
    }
}

int cluster_store_open(server_t *srv, char *err, size_t errlen)
{
    if (!srv->cfg.cluster_seeds || !srv->cfg.cluster_seeds[0])
        return 0;
    cluster_link_t *l = calloc(1, sizeof *l);
    if (!l || uv_loop_init(&l->loop) != 0) {
        free(l);
        snprintf(err, errlen, "cluster tier: out of memory");
        return KVS_ENOMEM;
    }
    l->srv = srv;
    /* Room for the writes in flight and a few whole fetches at once. No
     * reply may be larger than a block's value of the longest namespace
     * name (the client cuts one that is: a node's reply is not trusted). */
    cluster_block_t largest = {.ns_len = RADIX_NS_NAME_MAX,
                               .n_tokens = srv->geo.block_tokens,
                               .payload_len = geometry_block_bytes(&srv->geo)};
    cluster_options_t opt = {.seeds = srv->cfg.cluster_seeds,
                             .auth_file = srv->cfg.cluster_auth_file,
                             .timeout_ms = srv->cfg.cluster_timeout_ms,
                             .max_inflight = CLUSTER_STORE_MAX_PUTS + 2 * CLUSTER_STORE_MAX_FETCH,
                             .max_reply_bytes = cluster_value_size(&largest)};
    /* Made here, before the thread runs its loop, so that a bad setting
     * fails the start with its message. */
    int rc = cluster_new(&l->loop, &opt, &l->c);
    if (rc != 0) {
        uv_loop_close(&l->loop);
        free(l);
        snprintf(err, errlen, "cluster tier: %s (cluster_seeds '%s'%s)", kvs_status_text(rc),
                 srv->cfg.cluster_seeds,
                 rc == KVS_EIO ? ", or the cluster_auth_file cannot be read" : "");
        return rc;
    }
    const char *prefix = srv->cfg.cluster_key_prefix ? srv->cfg.cluster_key_prefix : "";
    uint64_t vbytes = geometry_block_bytes(&srv->geo) + 4096;
    l->max_puts = CLUSTER_STORE_PUT_BYTES / vbytes;
    if (l->max_puts > CLUSTER_STORE_MAX_PUTS)
        l->max_puts = CLUSTER_STORE_MAX_PUTS;
    if (l->max_puts < 4)
        l->max_puts = 4;
    /* Blocks waiting for their turn stay pinned in the pool (no copy):
     * up to a quarter of the pool (64 at least: a burst of commits comes
     * in before the thread's answers do). */
    l->max_queued = srv->num_blocks / 4 > 64 ? srv->num_blocks / 4 : 64;
    if (l->max_queued > CLUSTER_STORE_MAX_QUEUED)
        l->max_queued = CLUSTER_STORE_MAX_QUEUED;
    rc = cluster_tier_new(l->c, prefix, l->max_puts, &l->t);
    if (rc == 0)
        cluster_tier_on_put_done(l->t, on_put_done, l);
    /* These cannot fail on Linux but for memory; the start fails then, and
     * the process exits. */
    if (rc == 0 && (uv_mutex_init(&l->mu) != 0 || uv_async_init(&l->loop, &l->wake, on_wake) != 0 ||
                    uv_timer_init(&l->loop, &l->snap) != 0 ||
                    uv_prepare_init(&l->loop, &l->before_poll) != 0 ||
                    uv_check_init(&l->loop, &l->after_poll) != 0 ||
                    loop_wake_init(srv->loop, &l->back, on_back) != 0))
        rc = KVS_ENOMEM;
    if (rc != 0) {
        snprintf(err, errlen, "cluster tier: %s", kvs_status_text(rc));
        return rc;
    }
    l->wake.data = l;
    l->snap.data = l;
    l->before_poll.data = l;
    l->after_poll.data = l;
    l->back.data = l;
    uv_timer_start(&l->snap, on_snap, 50, 50);
    uv_prepare_start(&l->before_poll, on_before_poll);
    uv_check_start(&l->after_poll, on_after_poll);
    /* They keep nothing alive: the thread's loop ends when wake and snap
     * close, and these with them. */
    uv_unref((uv_handle_t *)&l->before_poll);
    uv_unref((uv_handle_t *)&l->after_poll);
    srv->cluster = l; /* before the thread runs: its fetches find the link there */
    if (uv_thread_create(&l->thread, thread_main, l) != 0) {
        srv->cluster = NULL;
        snprintf(err, errlen, "cluster tier: cannot start its thread");
        return KVS_ENOMEM;
    }
    LOG_INFO("cluster tier: seeds %s, timeout %u ms, key prefix '%s', %u writes in flight at most",
             srv->cfg.cluster_seeds, srv->cfg.cluster_timeout_ms, prefix, l->max_puts);
    return 0;
}

static void on_back_closed(loop_wake_t *h)
{
    cluster_link_t *l = h->data;
    uv_mutex_destroy(&l->mu);
    for (size_t i = 0; i < l->n_cuts; i++)
        free(l->cuts[i].name);
    free(l->cuts);
    free(l);
}

void cluster_store_close(server_t *srv)
{
    cluster_link_t *l = srv->cluster;
    if (!l)
        return;
    /* The thread ends its client and loop; the join waits for that (a
     * few loop turns: nothing there blocks). */
    uv_mutex_lock(&l->mu);
    l->stop = 1;
    uv_mutex_unlock(&l->mu);
    uv_async_send(&l->wake);
    uv_thread_join(&l->thread);
    while (uv_loop_close(&l->loop) == UV_EBUSY)
        uv_run(&l->loop, UV_RUN_NOWAIT);
    outbox_flush(l); /* what the closing handles' callbacks returned */
    cluster_store_sync_counters(srv);
    /* What came back and was not seen yet: pins to drop; fetches, which
     * the list below ends. */
    job_t *r = l->results;
    l->results = l->results_tail = NULL;
    while (r) {
        job_t *next = r->next;
        if (r->kind == JOB_PUT)
            store_unpin(srv->store, r->id);
        job_free(r);
        r = next;
    }
    while (!list_empty(&srv->cluster_fetches))
        fetch_free(srv, LIST_FIRST(&srv->cluster_fetches, cluster_fetch_t, link));
    srv->cluster = NULL;
    loop_wake_close(&l->back, on_back_closed);
}

void cluster_store_sync_counters(server_t *srv)
{
    cluster_link_t *l = srv->cluster;
    if (!l)
        return;
    uv_mutex_lock(&l->mu);
    cluster_stats_t cs = l->cs;
    cluster_tier_stats_t ts = l->ts;
    uint32_t settings_warnings = l->settings_warnings;
    uv_mutex_unlock(&l->mu);
    metrics_t *m = &srv->metrics;
    m->cluster_settings_warnings = settings_warnings;
    m->cluster_puts = ts.puts;
    m->cluster_put_drops = l->put_drops + ts.put_drops;
    m->cluster_timeouts = cs.timeouts;
    m->cluster_node_errors = cs.down;
    m->cluster_auth_errors = cs.auth_errors;
    m->cluster_redirects = cs.moved + cs.ask;
    m->cluster_map_refreshes = cs.refreshes;
    m->cluster_bad_values = ts.corrupt + ts.mismatched;
    m->cluster_identity_misses = ts.identity_misses;
    m->cluster_keys_deleted = ts.keys_deleted;
    m->cluster_clears_incomplete = ts.clears_incomplete;
    m->cluster_bytes_out = cs.bytes_out;
    m->cluster_bytes_in = cs.bytes_in;
    m->cluster_oom_refusals = cs.full;
    m->cluster_replies_cut = cs.replies_cut;
}

size_t cluster_store_nodes(server_t *srv, cluster_node_stats_t *out, size_t max)
{
    cluster_link_t *l = srv->cluster;
    if (!l)
        return 0;
    uv_mutex_lock(&l->mu);
    size_t n = l->n_nodes < max ? l->n_nodes : max;
    memcpy(out, l->nodes, n * sizeof(*out));
    uv_mutex_unlock(&l->mu);
    return n;
}

static bool ns_shared(const server_t *srv, uint32_t ns, const char **name)
{
    *name = radix_ns_name(srv->index, ns);
    const config_ns_t *sec = *name ? config_find_ns(srv->ns.conf, *name) : NULL;
    return sec && sec->shared;
}

/* A stamp for a value written now, or a Clear's cut: microseconds of the
 * wall clock (other nodes compare them with theirs), but never equal to or
 * below the last one given, so that every write handed over before a
 * Clear is below its cut and every one after is above it. */
static uint64_t link_stamp(cluster_link_t *l)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t us = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
    l->last_stamp = us > l->last_stamp ? us : l->last_stamp + 1;
    return l->last_stamp;
}

/* The cut of namespace name and identity: 0 when it was never cleared. */
static uint64_t link_cut(const cluster_link_t *l, const char *name, uint64_t identity)
{
    for (size_t i = 0; i < l->n_cuts; i++)
        if (l->cuts[i].identity == identity && strcmp(l->cuts[i].name, name) == 0)
            return l->cuts[i].cut_us;
    return 0;
}

/* The write of cached block id, pinned until it is copied out, onto the
 * list at *head / *tail (which the caller hands to the thread). Dropped
 * (counted) when max_queued wait already: a slow cluster then costs pinned
 * blocks within that bound, and no more. */
static void put_handover(server_t *srv, cluster_link_t *l, const char *name, uint64_t identity,
                         uint32_t id, const uint32_t *tokens, job_t **head, job_t **tail)
{
    uint32_t bt = srv->geo.block_tokens;
    uint64_t hash;
    if (l->puts_queued >= l->max_queued || radix_block_hash(srv->index, id, &hash) != 0) {
        l->put_drops++;
        return;
    }
    job_t *j = calloc(1, sizeof *j);
    if (j) {
        j->kind = JOB_PUT;
        j->id = id;
        j->hash = hash;
        j->identity = identity;
        j->written_us = link_stamp(l);
        j->ns = strdup(name);
        j->tokens = malloc(bt * sizeof(*j->tokens));
    }
    if (!j || !j->ns || !j->tokens || radix_pin(srv->index, id) != 0) {
        if (j)
            job_free(j);
        l->put_drops++;
        return;
    }
    memcpy(j->tokens, tokens, bt * sizeof(*j->tokens));
    l->puts_queued++;
    job_push(head, tail, j);
}

/* The committed blocks that were cached already (the prefix the writer hit):
 * one TOUCH job for them. */
static bool touch_handover(server_t *srv, cluster_link_t *l, const char *name, uint64_t identity,
                           const uint32_t *ids, const uint32_t *fresh, size_t n)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j || !(j->hashes = malloc(n * sizeof(*j->hashes))) || !(j->ns = strdup(name))) {
        if (j)
            job_free(j);
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if (!fresh[i] && radix_block_hash(srv->index, ids[i], &j->hashes[j->n_hashes]) == 0)
            j->n_hashes++;
    if (j->n_hashes == 0) {
        job_free(j);
        return false;
    }
    j->kind = JOB_TOUCH;
    j->identity = identity;
    uv_mutex_lock(&l->mu);
    job_push(&l->jobs, &l->jobs_tail, j);
    uv_mutex_unlock(&l->mu);
    return true;
}

void cluster_store_committed(server_t *srv, uint32_t ns, const uint32_t *ids, const uint32_t *fresh,
                             size_t n, const uint32_t *tokens)
{
    const char *name;
    cluster_link_t *l = srv->cluster;
    if (!l || n == 0 || !ns_shared(srv, ns, &name))
        return;
    uint32_t bt = srv->geo.block_tokens;
    uint64_t identity = namespaces_identity(srv, ns)->hash;
    /* The writes go over in one piece: one lock for them all. */
    job_t *puts = NULL, *puts_tail = NULL;
    for (size_t i = 0; i < n; i++)
        if (fresh[i])
            put_handover(srv, l, name, identity, ids[i], tokens + i * bt, &puts, &puts_tail);
    bool sent = puts != NULL;
    if (puts) {
        uv_mutex_lock(&l->mu);
        job_splice(&l->jobs, &l->jobs_tail, puts, puts_tail);
        uv_mutex_unlock(&l->mu);
    }
    sent |= touch_handover(srv, l, name, identity, ids, fresh, n);
    if (sent)
        uv_async_send(&l->wake);
}

/* Inserts the contiguous run of blocks that arrived after the cached
 * prefix, if that prefix is still in tier 1 where it was; gives the other
 * taken blocks back. Returns how many went in. */
static size_t fetch_install(server_t *srv, cluster_fetch_t *f)
{
    size_t run = 0;
    while (run < f->k && f->written[run])
        run++;
    if (run == 0 || srv->stopping)
        return 0;
    /* The prefix was pinned all along: it is where it was. It must be in
     * tier 1 for the new blocks to hang under it there. */
    bool tier1 = true;
    for (size_t i = 0; i < f->m; i++)
        tier1 = tier1 && f->prefix[i] < srv->num_blocks;
    size_t installed = 0;
    if (tier1) {
        store_install_done(srv->store, f->ns, f->tokens, f->prefix, f->m, f->ids, run, f->k,
                           &installed);
        free(f->ids);
        f->ids = NULL; /* every one is cached now, or back in the pool */
    }
    return installed;
}

/* Hands f's round (base .. k) to the cluster thread in job j. */
static void fetch_send(cluster_link_t *l, job_t *j, cluster_fetch_t *f)
{
    j->kind = JOB_FETCH;
    j->fetch = f;
    uv_mutex_lock(&l->mu);
    job_push(&l->jobs, &l->jobs_tail, j);
    uv_mutex_unlock(&l->mu);
    uv_async_send(&l->wake);
}

/* On the loop, a round came back whole: takes pool blocks for the next,
 * CLUSTER_STORE_FETCH_GROWTH times as many, and hands it to the thread.
 * Returns whether it did. A chain is read up to its first missing block,
 * so a fetch asks for little more than it gets: a miss costs the cluster
 * one round of CLUSTER_STORE_FETCH_FIRST GETs, not the whole rest of the
 * prompt (nor the pool as many evictions). */
static bool fetch_next_round(server_t *srv, cluster_fetch_t *f)
{
    cluster_link_t *l = srv->cluster;
    if (srv->stopping || !l || f->k >= f->want)
        return false;
    for (size_t j = f->base; j < f->k; j++)
        if (!f->written[j])
            return false;
    size_t n = (f->k - f->base) * CLUSTER_STORE_FETCH_GROWTH, got = 0;
    if (n > f->want - f->k)
        n = f->want - f->k;
    job_t *j = calloc(1, sizeof *j);
    if (!j || store_install_take(srv->store, f->ns, n, f->ids + f->k, &got) != 0 || got == 0) {
        free(j);
        return false;
    }
    f->base = f->k;
    f->k += got;
    fetch_send(l, j, f);
    return true;
}

/* On the loop: a fetch's round came back. */
static void fetch_finish(server_t *srv, cluster_fetch_t *f)
{
    if (fetch_next_round(srv, f))
        return;
    size_t installed = fetch_install(srv, f);
    srv->metrics.cluster_fetched_blocks += installed;
    srv->metrics.cluster_fetch_misses += f->want - installed;
    metrics_observe(&srv->metrics.cluster_fetch_time, metrics_latency_bounds_ns,
                    metrics_latency_n_bounds, uv_hrtime() - f->start_ns);
    session_t *s = f->s;
    fetch_free(srv, f);
    /* Only this hold is ours to end: past its deadline the Lookup already
     * answered, and the session may be held for something else now. */
    if (s && s->turn.held == SESSION_HOLD_CLUSTER)
        session_release(s);
}

/* How many blocks of tokens ns holds in any tier (*m, their ids in
 * *prefix, malloc'd), and how many to fetch after them (*k). */
static int fetch_plan(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                      uint32_t **prefix, size_t *m, size_t *k)
{
    size_t n_full = n_tokens / srv->geo.block_tokens;
    uint32_t *ids = malloc((n_full ? n_full : 1) * sizeof(*ids));
    if (!ids)
        return KVS_ENOMEM;
    int rc = radix_match(srv->index, ns, tokens, n_tokens, ids, n_full, m);
    if (rc == 0 && *m >= n_full)
        rc = KVS_ENOTFOUND;
    if (rc != 0) {
        free(ids);
        return rc;
    }
    *prefix = ids;
    *k = n_full - *m;
    /* At most CLUSTER_STORE_FETCH_BYTES of blocks, and a quarter of the
     * pool: a fetch evicts for its blocks. */
    size_t cap = CLUSTER_STORE_FETCH_BYTES / geometry_block_bytes(&srv->geo);
    if (cap > CLUSTER_STORE_MAX_FETCH)
        cap = CLUSTER_STORE_MAX_FETCH;
    if (cap > srv->num_blocks / 4)
        cap = srv->num_blocks / 4;
    if (*k > cap)
        *k = cap;
    return *k ? 0 : KVS_ENOTFOUND;
}

static void fetch_drop(server_t *srv, cluster_fetch_t *f)
{
    for (size_t i = 0; i < f->n_pinned; i++)
        store_unpin(srv->store, f->prefix[i]);
    free(f->prefix);
    free(f->name);
    free(f->tokens);
    free(f->hashes);
    free(f->ids);
    free(f->written);
    free(f);
}

/* A fetch of blocks m .. m + k of tokens after the cached blocks prefix
 * (taken over; pinned here), with pool blocks taken for them (k shrinks to
 * what could be taken). NULL: out of memory, or no block to take. */
static cluster_fetch_t *fetch_new(session_t *s, uint32_t ns, const char *name,
                                  const uint32_t *tokens, uint32_t *prefix, size_t m, size_t k)
{
    server_t *srv = s->srv;
    cluster_fetch_t *f = calloc(1, sizeof *f);
    if (!f) {
        free(prefix);
        return NULL;
    }
    f->srv = srv;
    f->ns = ns;
    f->identity = namespaces_identity(srv, ns)->hash;
    f->cut_us = link_cut(srv->cluster, name, f->identity);
    f->m = m;
    f->prefix = prefix;
    /* Pinned first: the evictions that make room for the fetch must not
     * take the prefix it extends. */
    while (f->n_pinned < m && radix_pin(srv->index, prefix[f->n_pinned]) == 0)
        f->n_pinned++;
    f->name = strdup(name);
    f->want = k;
    f->hashes = malloc((m + k) * sizeof(*f->hashes));
    f->ids = malloc(k * sizeof(*f->ids));
    f->written = calloc(k, 1);
    size_t first = k < CLUSTER_STORE_FETCH_FIRST ? k : CLUSTER_STORE_FETCH_FIRST;
    if (f->n_pinned < m || !f->name || !f->hashes || !f->ids || !f->written ||
        radix_chain_hashes(srv->index, ns, tokens, m + k, f->hashes) != 0 ||
        store_install_take(srv->store, ns, first, f->ids, &f->k) != 0) {
        fetch_drop(srv, f);
        return NULL;
    }
    size_t n_tok = (m + k) * srv->geo.block_tokens;
    f->tokens = malloc(n_tok * sizeof(*f->tokens));
    if (!f->tokens) {
        uint32_t none = 0;
        size_t installed;
        store_install_done(srv->store, ns, tokens, &none, 0, f->ids, 0, f->k, &installed);
        fetch_drop(srv, f);
        return NULL;
    }
    /* Only the hashes of the blocks to fetch are kept. */
    memmove(f->hashes, f->hashes + m, k * sizeof(*f->hashes));
    memcpy(f->tokens, tokens, n_tok * sizeof(*f->tokens));
    list_push_front(&srv->cluster_fetches, &f->link);
    f->s = s;
    s->cluster_fetch = f;
    return f;
}

int cluster_store_fetch(session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                        uint64_t *until_ms)
{
    server_t *srv = s->srv;
    cluster_link_t *l = srv->cluster;
    const char *name;
    size_t m = 0, k = 0;
    uint32_t *prefix = NULL;
    if (!l || srv->stopping || s->cluster_fetch || !ns_shared(srv, ns, &name))
        return KVS_ENOTFOUND;
    int rc = fetch_plan(srv, ns, tokens, n_tokens, &prefix, &m, &k);
    if (rc != 0)
        return rc;
    job_t *j = calloc(1, sizeof *j);
    cluster_fetch_t *f = j ? fetch_new(s, ns, name, tokens, prefix, m, k) : NULL;
    if (!j)
        free(prefix);
    if (!f) {
        free(j);
        srv->metrics.cluster_fetch_misses += k;
        return KVS_ENOTFOUND;
    }
    f->start_ns = uv_hrtime();
    fetch_send(l, j, f);
    *until_ms = uv_now(srv->loop) + srv->cfg.cluster_timeout_ms + 100;
    return 0;
}

void cluster_store_detach(session_t *s)
{
    if (s->cluster_fetch) {
        s->cluster_fetch->s = NULL;
        s->cluster_fetch = NULL;
    }
}

/* The cut of a Clear of namespace name and identity: recorded (one per
 * pair, the latest), so that this daemon's fetches refuse what was
 * written before it. Returns the cut, or 0 when out of memory. */
static uint64_t link_set_cut(cluster_link_t *l, const char *name, uint64_t identity)
{
    uint64_t cut = link_stamp(l);
    for (size_t i = 0; i < l->n_cuts; i++)
        if (l->cuts[i].identity == identity && strcmp(l->cuts[i].name, name) == 0) {
            l->cuts[i].cut_us = cut;
            return cut;
        }
    struct cluster_cut *cuts = realloc(l->cuts, (l->n_cuts + 1) * sizeof(*cuts));
    char *copy = strdup(name);
    if (cuts)
        l->cuts = cuts;
    if (!cuts || !copy) {
        free(copy);
        return 0;
    }
    l->cuts[l->n_cuts++] = (struct cluster_cut){.name = copy, .identity = identity, .cut_us = cut};
    return cut;
}

void cluster_store_cleared(server_t *srv, uint32_t ns)
{
    const char *name;
    cluster_link_t *l = srv->cluster;
    if (!l || !ns_shared(srv, ns, &name) || !config_find_ns(srv->ns.conf, name)->cluster_clear)
        return;
    uint64_t identity = namespaces_identity(srv, ns)->hash;
    job_t *j = calloc(1, sizeof *j);
    if (j)
        j->ns = strdup(name);
    if (!j || !j->ns || link_set_cut(l, name, identity) == 0) {
        if (j)
            job_free(j);
        LOG_WARN("cluster tier: out of memory: namespace '%s' is not cleared in the cluster", name);
        return;
    }
    j->kind = JOB_CLEAR;
    j->identity = identity;
    j->timeout_ms = srv->cfg.cluster_clear_timeout_ms;
    uv_mutex_lock(&l->mu);
    job_push(&l->jobs, &l->jobs_tail, j);
    uv_mutex_unlock(&l->mu);
    uv_async_send(&l->wake);
    LOG_INFO("cluster tier: namespace '%s' cleared: its keys of identity %016llx are deleted in "
             "the cluster within %u ms",
             name, (unsigned long long)identity, srv->cfg.cluster_clear_timeout_ms);
}
