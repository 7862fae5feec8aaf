/* SPDX-License-Identifier: Apache-2.0 */
#include "kvshared.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cluster_store.h"
#include "inflight.h"
#include "kvshare_status.h"
#include "log.h"
#include "loop_watch.h"
#include "metrics_http.h"
#include "now.h"
#include "preflight.h"
#include "nsname.h"
#include "session_io.h"
#include "socket_path.h"
#include "store.h"
#include "store_disk.h"
#include "store_restore.h"
#include "namespaces.h"
#include "crc32c.h"
#include "disk.h"

/* Background work between the turns: the pins of closed sessions. */
static bool background_steps(server_t *srv)
{
    return srv->store && srv->store->drains && store_drain_step(srv->store);
}

/* What the hold (core/hold.c) calls upward. */
static const session_hooks_t hold_hooks = {
    .turn = session_take_turn,
    .background = background_steps,
    .released = {[SESSION_HOLD_INFLIGHT] = inflight_end},
};

/* Opens the pool memory. A restarted daemon may find the GPU still holding
 * its predecessor's pool: every worker maps it until its next call, when
 * libkvshare lets go of it. So a device pool that does not fit is retried
 * for backend_retry_ms before it is an error. */
static int open_backend(server_t *s, const backend_config_t *bc, backend_t **out, char *err,
                        size_t errlen)
{
    const struct timespec pause = {0, 250 * 1000 * 1000};
    uint64_t start = (uint64_t)now_ms();
    unsigned tries = 0;
    for (;;) {
        int rc = backend_open(bc, out, err, errlen);
        if (rc != KVS_ENOMEM || bc->kind == BACKEND_HOST)
            return rc;
        uint64_t waited = (uint64_t)now_ms() - start;
        if (waited >= s->cfg.backend_retry_ms) {
            if (tries > 0) {
                size_t used = strlen(err);
                snprintf(err + used, errlen - used,
                         " (still so after %.0f s of retries: stop the processes that hold "
                         "device memory, see nvidia-smi)",
                         (double)waited / 1000.0);
            }
            return rc;
        }
        if (tries++ == 0)
            LOG_WARN("%s; workers of a previous kvshared may still map its pool (each lets go "
                     "at its next call): retrying for up to %u s",
                     err, s->cfg.backend_retry_ms / 1000);
        nanosleep(&pause, NULL);
    }
}

/* Opens one backend per device (cfg.devices, else the one of bc), each
 * with bc's size: s->backends, s->n_devices, s->backend = the first.
 * Several devices of different sizes get the smallest one's blocks
 * (server_open). With "all", devices are opened from 0 until one answers
 * KVS_ENODEV (cuda; the host backend has none to count). */
static int open_devices(server_t *s, const backend_config_t *bc, char *err, size_t errlen)
{
    int ordinals[SERVER_MAX_DEVICES];
    uint32_t n = 1;
    bool all = false;
    ordinals[0] = bc->device;
    if (s->cfg.devices) {
        int rc = preflight_parse_devices(s->cfg.devices, ordinals, &n, &all, err, errlen);
        if (rc != 0)
            return rc;
        if (all) {
            if (bc->kind == BACKEND_HOST) {
                snprintf(err, errlen,
                         "--devices all: the host backend has no devices to count; give a "
                         "number of simulated devices as a range, e.g. --devices 0-3");
                return KVS_EINVAL;
            }
            n = SERVER_MAX_DEVICES;
            for (uint32_t i = 0; i < n; i++)
                ordinals[i] = (int)i;
        }
    }
    backend_config_t one = *bc;
    for (uint32_t i = 0; i < n; i++) {
        one.device = ordinals[i];
        /* Every device after the first takes the first's backend kind:
         * one daemon never mixes host and cuda pools. */
        if (i > 0)
            one.kind = backend_kind(s->backends[0]);
        int rc = open_backend(s, &one, &s->backends[i], err, errlen);
        if (rc == KVS_ENODEV && all && i > 0)
            break;
        if (rc != 0)
            return rc;
        s->device_ordinals[i] = ordinals[i];
        s->n_devices = i + 1;
        if (all && backend_kind(s->backends[0]) == BACKEND_HOST) {
            snprintf(err, errlen,
                     "--devices all: no cuda device answers (%s); give a range for simulated "
                     "host devices, e.g. --devices 0-3",
                     backend_detail(s->backends[0]));
            return KVS_EINVAL;
        }
    }
    s->backend = s->backends[0];
    return 0;
}

int server_events_start(server_t *s, char *err, size_t errlen)
{
    const char *medium = backend_kind(s->backend) == BACKEND_CUDA ? "GPU" : "CPU";
    s->ns.ev_streams = calloc(s->cfg.max_namespaces, sizeof(*s->ns.ev_streams));
    s->ns.ev_resolved = calloc(s->cfg.max_namespaces, sizeof(*s->ns.ev_resolved));
    if (!s->ns.ev_streams || !s->ns.ev_resolved) {
        snprintf(err, errlen, "kv events: out of memory for the tables of %u blocks",
                 s->num_blocks);
        return KVS_ENOMEM;
    }
    int rc = events_start(&s->cfg.events, s->geo.block_tokens, medium, &s->events, err, errlen);
    if (rc != 0)
        return rc;
    /* Routers forget what a previous daemon on this node held: one
     * AllBlocksCleared per topic a namespace may publish on. */
    uint32_t n_topics = 0;
    for (uint32_t ns = 0; ns < radix_ns_id_end(s->index); ns++) {
        if (!radix_ns_name(s->index, ns))
            continue;
        const events_stream_t *st = namespaces_events_stream(s, ns);
        if (st->on && events_cleared(s->events, st) == 0)
            n_topics++;
    }
    uint32_t dflt;
    if (s->cfg.events.default_model && radix_ns_find(s->index, SERVER_DEFAULT_NS, &dflt) != 0) {
        events_stream_t st;
        if (events_stream_init(&s->cfg.events, s->cfg.events.default_model, NULL, &st) == 0 &&
            events_cleared(s->events, &st) == 0)
            n_topics++;
    }
    LOG_INFO("kv events: publishing on %s%s%s (medium %s, block size %u, %s events), %u "
             "namespace topics",
             s->cfg.events.endpoint, s->cfg.events.replay_endpoint ? ", replay on " : "",
             s->cfg.events.replay_endpoint ? s->cfg.events.replay_endpoint : "", medium,
             s->geo.block_tokens, s->cfg.events.encoding == EVENTS_ARRAY ? "array" : "map",
             n_topics);
    return 0;
}

/* Tier 2 in host memory (--host-tier: its bytes in all). With several
 * devices a tier-2 slot holds every shard of a block, one per device: each
 * device's backend gets host memory for its shard of every slot (slot t of
 * each holds the same block, as block ids do in the pools), copied by that
 * device's own copies. */
static int open_host_tier(server_t *s, char *err, size_t errlen)
{
    const server_config_t *cfg = &s->cfg;
    if (cfg->host_tier_bytes == 0)
        return 0;
    uint64_t slot_bytes = s->block_bytes * s->n_devices;
    uint64_t t2 = cfg->host_tier_bytes / slot_bytes;
    if (t2 == 0 || t2 > UINT32_MAX - s->num_blocks) {
        snprintf(err, errlen,
                 "a host tier of %llu bytes holds %llu blocks of %llu bytes (%u device%s): give "
                 "one between one block and 2^32 - 1 blocks with the pool",
                 (unsigned long long)cfg->host_tier_bytes, (unsigned long long)t2,
                 (unsigned long long)slot_bytes, s->n_devices, s->n_devices == 1 ? "" : "s");
        return KVS_EINVAL;
    }
    for (uint32_t d = 0; d < s->n_devices; d++) {
        int rc = backend_tier_open(s->backends[d], t2 * s->block_bytes, err, errlen);
        if (rc != 0)
            return rc;
    }
    s->tier2_blocks = (uint32_t)t2;
    for (uint32_t d = 0; d < s->n_devices; d++)
        if (backend_tier_numa_node(s->backends[d]) >= 0)
            LOG_INFO("tier 2 of device %u: host memory on NUMA node %d, the device's", d,
                     backend_tier_numa_node(s->backends[d]));
    LOG_INFO("tier 2: %u blocks in %llu bytes of host memory%s%s", s->tier2_blocks,
             (unsigned long long)backend_tier_size(s->backend) * s->n_devices,
             backend_kind(s->backend) == BACKEND_CUDA ? " (pinned)" : "",
             s->n_devices > 1 ? ", one shard per device in each slot" : "");
    return 0;
}

/* The disk tier's notes (disk.h: what happened at its open or on its
 * threads), on the loop's thread. */
static void log_disk_note(void *arg, disk_note_level_t level, const char *text)
{
    (void)arg;
    if (level == DISK_NOTE_ERROR)
        LOG_ERROR("disk tier: %s", text);
    else
        LOG_WARN("disk tier: %s", text);
}

/* Tier 3 (disk_tier_path): the file is opened and checked against this
 * geometry, so that a bad setup fails at start naming its setting; its
 * slots become tier 3 of the index (store_disk.h), below the host tier,
 * which it needs. Its records are read and go into the index in the
 * background once kvshared listens (store_restore.h). */
static int open_disk_tier(server_t *s, char *err, size_t errlen)
{
    const server_config_t *cfg = &s->cfg;
    if (!cfg->disk_tier_path)
        return 0;
    /* preflight_run refused a disk tier without its size or a host tier. */
    const geometry_t *g = &s->geo;
    char geo[128];
    snprintf(geo, sizeof(geo), "%u/%u/%u/%d/%u/%u/%u", g->layers, g->kv_heads, g->head_dim,
             (int)g->dtype, g->block_tokens, g->kv_lora_rank, g->rope_head_dim);
    disk_config_t dc = {.path = cfg->disk_tier_path,
                        .bytes = cfg->disk_tier_bytes,
                        .block_bytes = s->block_bytes,
                        .block_tokens = g->block_tokens,
                        .geometry_id = crc32c(0, geo, strlen(geo)),
                        .wipe = cfg->disk_tier_wipe,
                        .io = (disk_io_t)cfg->disk_tier_io,
                        .defer_scan = true,
                        .note = log_disk_note};
    int rc = disk_open(&dc, &s->disk_tier, err, errlen);
    if (rc != 0)
        return rc;
    disk_stats_t ds;
    disk_stats(s->disk_tier, &ds);
    LOG_INFO("disk tier: %s, %u slots of %llu bytes, I/O on %s, %llu blocks recovered, %llu "
             "torn slots skipped, %llu deleted records dropped",
             cfg->disk_tier_path, ds.slots, (unsigned long long)disk_slot_bytes(s->disk_tier),
             ds.io, (unsigned long long)ds.recovered, (unsigned long long)ds.torn,
             (unsigned long long)ds.deleted);
    uint32_t slots = disk_capacity(s->disk_tier);
    if (slots > UINT32_MAX - s->num_blocks - s->tier2_blocks) {
        snprintf(err, errlen, "disk_tier_bytes holds %u blocks: too many with the pool and tier 2",
                 slots);
        return KVS_EINVAL;
    }
    s->tier3_blocks = slots;
    LOG_INFO("tier 3: %u blocks in %s (%s I/O)", slots, cfg->disk_tier_path,
             disk_io_name(s->disk_tier));
    return 0;
}

int server_open(const server_config_t *cfg, uv_loop_t *loop, server_t **out, char *err,
                size_t errlen)
{
    server_t *s = NULL;
    int rc;

    if (!cfg || !loop || !out)
        return KVS_EINVAL;
    if (geometry_validate(&cfg->geometry) != 0) {
        snprintf(err, errlen,
                 "invalid model geometry: give --model or every one of --layers, "
                 "--kv-heads, --head-dim, --dtype, --block-tokens");
        return KVS_EINVAL;
    }
    /* What the settings alone decide, as --check-config checks it. */
    rc = preflight_run(cfg, geteuid(), err, errlen);
    if (rc != 0)
        return rc;
    s = calloc(1, sizeof(*s));
    if (!s)
        return KVS_ENOMEM;
    s->loop = loop;
    s->sched.hooks = &hold_hooks;
    s->stop = server_shutdown;
    s->cfg = *cfg;
    s->geo = cfg->geometry;
    s->block_bytes = geometry_block_bytes(&s->geo);
    s->start_ms = (uint64_t)now_ms();

    backend_config_t bc = cfg->backend;
    if (cfg->pool_blocks > 0)
        bc.bytes = (uint64_t)cfg->pool_blocks * s->block_bytes;
    bc.round_bytes = s->block_bytes;
    if (bc.bytes > 0 && bc.bytes < s->block_bytes) {
        snprintf(err, errlen,
                 "a pool of %llu bytes is smaller than one block (%llu bytes for this geometry); "
                 "give a larger --pool-bytes",
                 (unsigned long long)bc.bytes, (unsigned long long)s->block_bytes);
        rc = KVS_EINVAL;
        goto fail;
    }
    rc = open_devices(s, &bc, err, errlen);
    if (rc != 0)
        goto fail;
    uint64_t smallest = backend_size(s->backend);
    for (uint32_t i = 1; i < s->n_devices; i++)
        if (backend_size(s->backends[i]) < smallest)
            smallest = backend_size(s->backends[i]);
    uint64_t blocks = smallest / s->block_bytes;
    if (cfg->pool_blocks > 0 && blocks > cfg->pool_blocks)
        blocks = cfg->pool_blocks;
    if (blocks == 0 || blocks >= UINT32_MAX) {
        snprintf(err, errlen,
                 "a pool of %llu bytes holds %llu blocks of %llu bytes: give a pool between "
                 "one block and 2^32 - 1 blocks",
                 (unsigned long long)backend_size(s->backend), (unsigned long long)blocks,
                 (unsigned long long)s->block_bytes);
        rc = KVS_EINVAL;
        goto fail;
    }
    s->num_blocks = (uint32_t)blocks;
    /* The disk and cluster tiers move one device's bytes of a block: with
     * several devices they would keep a block without its other shards. */
    if (s->n_devices > 1 && (cfg->disk_tier_path || cfg->cluster_seeds)) {
        snprintf(err, errlen,
                 "%s with several devices is not supported yet: it would keep one shard of "
                 "each block; give one device, or leave it off",
                 cfg->disk_tier_path ? "a disk tier (disk_tier_path)" : "the cluster tier");
        rc = KVS_EINVAL;
        goto fail;
    }
    rc = namespaces_identity_open(s, err, errlen);
    if (rc != 0)
        goto fail;
    rc = open_host_tier(s, err, errlen);
    if (rc != 0)
        goto fail;

    rc = open_disk_tier(s, err, errlen);
    if (rc != 0)
        goto fail;
    rc = store_open(s, &s->store, err, errlen);
    if (rc != 0)
        goto fail;
    rc = cluster_store_open(s, err, errlen);
    if (rc != 0)
        goto fail;
    rc = inflight_new(s, &s->inflight);
    if (rc != 0) {
        snprintf(err, errlen, "out of memory for the in-flight tables of %u blocks", s->num_blocks);
        goto fail;
    }
    *out = s;
    return 0;

fail:
    server_free(s);
    return rc;
}

static void on_signal(uv_signal_t *h, int signum)
{
    server_t *s = h->data;
    if (signum == SIGHUP) {
        namespaces_reload(s);
        return;
    }
    LOG_INFO("%s: shutting down: no new connections, closing %u sessions (at most %u ms)",
             signum == SIGINT ? "SIGINT" : "SIGTERM", (unsigned)s->sessions.len, s->cfg.drain_ms);
    server_shutdown(s);
}

/* The drain deadline: whatever is still open then, the loop ends. */
static void on_drain_timeout(uv_timer_t *t)
{
    server_t *s = t->data;
    LOG_WARN("drain deadline of %u ms passed with handles still open; stopping anyway",
             s->cfg.drain_ms);
    uv_stop(s->loop);
}

/* SIGINT and SIGTERM (drain), SIGHUP (reload). On failure the handles already
 * initialised are closed and nothing is left installed. */
static int start_signals(server_t *s, char *err, size_t errlen)
{
    static const int signums[] = {SIGINT, SIGTERM, SIGHUP};
    uv_signal_t *handles[] = {&s->life.sig_int, &s->life.sig_term, &s->life.sig_hup};
    size_t n_init = 0;
    for (size_t i = 0; i < sizeof(signums) / sizeof(signums[0]); i++) {
        int rc = uv_signal_init(s->loop, handles[i]);
        if (rc == 0) {
            n_init++;
            handles[i]->data = s;
            rc = uv_signal_start(handles[i], on_signal, signums[i]);
        }
        if (rc != 0) {
            snprintf(err, errlen, "cannot install the handler of %s: %s", strsignal(signums[i]),
                     uv_strerror(rc));
            for (size_t j = 0; j < n_init; j++)
                uv_close((uv_handle_t *)handles[j], NULL);
            return KVS_EIO;
        }
    }
    s->life.signals_on = true;
    return 0;
}

int server_listen(server_t *s, bool signals, char *err, size_t errlen)
{
    int rc = listener_open(s, err, errlen);
    if (rc != 0)
        return rc;
    if (session_idle_start(s) != 0) {
        snprintf(err, errlen, "cannot start the idle-session timer (idle_timeout_ms)");
        session_idle_stop(s);
        session_sched_close(s);
        listener_abandon(s);
        return KVS_EIO;
    }
    if (signals && start_signals(s, err, errlen) != 0) {
        session_idle_stop(s);
        session_sched_close(s);
        listener_abandon(s);
        return KVS_EIO;
    }
    rc = loop_watch_start(s);
    if (rc != 0)
        LOG_WARN("cannot watch the loop's busy time (%s): kvshare_loop_stalls_total stays 0",
                 kvs_status_text(rc));
    LOG_INFO("listening on %s", s->cfg.socket_path);
    /* Warm restart: the disk tier's file is read while sessions are served. */
    rc = store_restore_start(s);
    if (rc != 0)
        LOG_ERROR("tier 3: the restore of %s did not start (%s): the tier starts empty, its "
                  "records stay on the disk",
                  s->cfg.disk_tier_path, kvs_status_text(rc));
    if (s->cfg.ready_fd >= 0) {
        static const char ready[] = "READY\n";
        ssize_t n;
        do {
            n = write(s->cfg.ready_fd, ready, sizeof(ready) - 1);
        } while (n < 0 && errno == EINTR);
        close(s->cfg.ready_fd);
        s->cfg.ready_fd = -1;
    }
    return 0;
}

void server_shutdown(server_t *s)
{
    if (!s || s->stopping)
        return;
    s->stopping = true;
    /* Lookups waiting for other sessions' writes are answered with what is
     * cached before their sessions are told goodbye. */
    inflight_shutdown(s);
    session_run_ready(s);
    store_restore_close(s); /* what is not restored stays on the disk */
    listener_close(s);
    metrics_http_close(s->net.http);
    s->net.http = NULL;
    loop_watch_stop(s);
    cluster_store_close(s);
    session_idle_stop(s);
    session_sched_close(s);
    /* Tell each worker why its connection ends, so its client reports it
     * and recomputes until a daemon is back. */
    while (!list_empty(&s->sessions)) {
        session_t *ss = LIST_FIRST(&s->sessions, session_t, link);
        session_goodbye(ss, KVS_ENOTCONN,
                        "kvshared is stopping (SIGTERM); this connection closes now: requests "
                        "are answered as misses until a daemon is back");
        session_close(ss, "daemon stopping");
    }
    if (s->cfg.drain_ms > 0 && !s->life.drain_on) {
        int rc = uv_timer_init(s->loop, &s->life.drain_timer);
        if (rc == 0) {
            s->life.drain_timer.data = s;
            s->life.drain_on = true;
            rc = uv_timer_start(&s->life.drain_timer, on_drain_timeout, s->cfg.drain_ms, 0);
            /* The deadline must not itself keep the loop running. */
            uv_unref((uv_handle_t *)&s->life.drain_timer);
        }
        if (rc != 0)
            LOG_WARN("cannot start the drain deadline of %u ms: %s; the sessions close without "
                     "one",
                     s->cfg.drain_ms, uv_strerror(rc));
    }
    if (s->life.signals_on) {
        uv_close((uv_handle_t *)&s->life.sig_int, NULL);
        uv_close((uv_handle_t *)&s->life.sig_term, NULL);
        uv_close((uv_handle_t *)&s->life.sig_hup, NULL);
        s->life.signals_on = false;
    }
}

void server_drain_done(server_t *s)
{
    if (s && s->life.drain_on) {
        uv_close((uv_handle_t *)&s->life.drain_timer, NULL);
        s->life.drain_on = false;
    }
}

void server_free(server_t *s)
{
    if (!s)
        return;
    /* Sessions without a socket (tests) end here; socket sessions were
     * closed by server_shutdown. */
    while (!list_empty(&s->sessions))
        session_close(LIST_FIRST(&s->sessions, session_t, link), "server freed");
    /* Tier copies on the tiers' threads use the backend and the index (a
     * drain deadline may have stopped the loop before they ended): they
     * end within milliseconds, so wait for their completions. */
    while (s->tier_jobs > 0)
        uv_run(s->loop, UV_RUN_ONCE);
    session_idle_stop(s);
    session_sched_close(s); /* their memory goes in the close callbacks */
    loop_watch_stop(s);
    if (s->cluster) {
        cluster_store_close(s);
        uv_run(s->loop, UV_RUN_NOWAIT); /* its close callbacks free the client */
    }
    store_restore_close(s);
    uv_run(s->loop, UV_RUN_NOWAIT); /* its close callbacks free it */
    inflight_free(s->inflight);
    events_stop(s->events);
    free(s->ns.ev_streams);
    free(s->ns.ev_resolved);
    store_free(s->store);
    for (uint32_t i = 0; i < s->n_devices; i++)
        backend_close(s->backends[i]);
    disk_close(s->disk_tier);
    namespaces_free(s);
    free(s->decode.arena);
    free(s);
}
