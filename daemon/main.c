/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshared: the settings (settings.c), then the daemon (kvshared.c) on a
 * libuv loop until SIGINT or SIGTERM.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "kvshare_status.h"
#include "kvshare_version.h"
#include "log.h"
#include "metrics_http.h"
#include "kvshared.h"
#include "settings.h"
#include "namespaces.h"
#include "units.h"

/* What the pool holds, once at start. */
static void log_pool(const server_t *srv, radix_policy_t eviction)
{
    char per_token[32], per_block[32], pool[32];
    units_format_bytes(geometry_bytes_per_token(&srv->geo), 1, per_token, sizeof(per_token));
    units_format_bytes(srv->block_bytes, 1, per_block, sizeof(per_block));
    units_format_bytes((uint64_t)srv->num_blocks * srv->block_bytes, 1, pool, sizeof(pool));
    LOG_INFO("kvshared %d.%d.%d, backend %s", KVS_VERSION_MAJOR, KVS_VERSION_MINOR,
             KVS_VERSION_PATCH, backend_detail(srv->backend));
    char shape[128];
    geometry_describe(&srv->geo, shape, sizeof(shape));
    LOG_INFO("geometry: %s, %s (%u B each) = %s per token", shape,
             geometry_is_mla(&srv->geo) ? "one latent" : "K and V",
             geometry_dtype_bytes(srv->geo.dtype), per_token);
    LOG_INFO("pool: %s per token x %u tokens = %s per block; %u blocks = %s (%llu tokens)",
             per_token, srv->geo.block_tokens, per_block, srv->num_blocks, pool,
             (unsigned long long)srv->num_blocks * srv->geo.block_tokens);
    /* Several devices: each holds the same blocks, one shard of each. */
    for (uint32_t i = 1; i < srv->n_devices; i++)
        LOG_INFO("rank %u: backend %s", i, backend_detail(srv->backends[i]));
    if (srv->n_devices > 1)
        LOG_INFO("devices: %u ranks of one group, each pool %u blocks (the geometry is one "
                 "rank's shard), one index for all",
                 srv->n_devices, srv->num_blocks);
    LOG_INFO("eviction: %s", eviction == RADIX_EVICT_FREQ ? "freq" : "lru");
}

/* The namespaces of the config file: the server keeps its own copy, which
 * SIGHUP replaces. Errors: message in err. */
static int declare_file_namespaces(server_t *srv, const char *path, char *err, size_t errlen)
{
    config_t *conf = NULL;
    int rc = config_load(path, &conf, err, errlen);
    if (rc == 0) {
        rc = namespaces_apply(srv, conf, err, errlen);
        if (rc != 0)
            config_free(conf);
    }
    return rc;
}

/* The --namespace flags: a flag overrides the file's section of the same
 * name. Errors: message in err. */
static int declare_flag_namespaces(server_t *srv, const settings_t *st, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < st->n_ns; i++) {
        const settings_ns_t *ns = &st->ns[i];
        uint32_t id;
        int rc;
        if (radix_ns_find(srv->index, ns->name, &id) == 0)
            rc = radix_ns_set_limits(srv->index, id, ns->quota, ns->reserve);
        else
            rc = namespaces_create(srv, ns->name, ns->quota, ns->reserve, err, errlen);
        if (rc == 0)
            rc = namespaces_declare(srv, ns->name, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* loop_rt_priority: this thread, the one that serves the sessions, under
 * SCHED_RR, so that a Lookup runs as soon as it arrives however busy the
 * CPUs are with work at normal priority. The tiers' threads, started with
 * the server, stay at normal priority (and tier_copy_nice); with
 * SCHED_RESET_ON_FORK so does any thread started from here on. Nothing of
 * the loop waits for them: they wake it through loop_wake.h. */
static int loop_realtime(uint32_t prio, char *err, size_t errlen)
{
    struct sched_param sp = {.sched_priority = (int)prio};
    if (sched_setscheduler(0, SCHED_RR | SCHED_RESET_ON_FORK, &sp) != 0) {
        int e = errno;
        snprintf(err, errlen, "loop_rt_priority %u: %s%s", prio, strerror(e),
                 e == EPERM ? " (SCHED_RR needs CAP_SYS_NICE, or an RLIMIT_RTPRIO at least "
                              "this high: LimitRTPRIO= in a systemd unit)"
                            : "");
        return -1;
    }
    LOG_INFO("the loop thread runs under SCHED_RR at priority %u", prio);
    return 0;
}

/* Builds the server, serves until a signal stops it; returns the exit status. */
static int serve(settings_t *st)
{
    server_config_t *cfg = &st->server;
    char err[2048] = "";
    server_t *srv = NULL;
    int rc;

    /* A client that dies mid-reply must not kill the daemon. */
    signal(SIGPIPE, SIG_IGN);

    /* Refuse early, before a pool of gigabytes is allocated for nothing. */
    rc = server_check_socket(cfg->socket_path, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "kvshared: %s\n", err);
        return 1;
    }
    uv_loop_t *loop = uv_default_loop();
    rc = server_open(cfg, loop, &srv, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "kvshared: %s\n", err[0] ? err : kvs_status_text(rc));
        return 1;
    }
    if (st->config_path && declare_file_namespaces(srv, st->config_path, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvshared: %s\n", err);
        server_free(srv);
        uv_loop_close(loop);
        return 1;
    }
    log_pool(srv, cfg->eviction);
    if (declare_flag_namespaces(srv, st, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvshared: --namespace: %s\n", err);
        server_free(srv);
        uv_loop_close(loop);
        return 2;
    }
    if (cfg->events.endpoint && server_events_start(srv, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvshared: %s\n", err);
        server_free(srv);
        uv_loop_close(loop);
        return 1;
    }
    settings_log(st);
    namespaces_log(srv);
    if (cfg->metrics_listen) {
        rc = metrics_http_start(srv, cfg->metrics_listen, &srv->net.http, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "kvshared: %s\n", err);
            server_free(srv);
            uv_run(loop, UV_RUN_NOWAIT);
            uv_loop_close(loop);
            return 1;
        }
    }
    if (st->loop_rt_priority && loop_realtime(st->loop_rt_priority, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvshared: %s\n", err);
        server_free(srv);
        uv_run(loop, UV_RUN_NOWAIT);
        uv_loop_close(loop);
        return 1;
    }
    rc = server_listen(srv, true, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "kvshared: %s\n", err);
        server_shutdown(srv);
        uv_run(loop, UV_RUN_DEFAULT);
        server_free(srv);
        uv_loop_close(loop);
        return 1;
    }
    uv_run(loop, UV_RUN_DEFAULT);
    server_shutdown(srv);
    uv_run(loop, UV_RUN_DEFAULT);
    server_drain_done(srv);
    uv_run(loop, UV_RUN_NOWAIT);
    bool failed = srv->failed;
    server_free(srv);
    uv_run(loop, UV_RUN_NOWAIT); /* close callbacks of handles server_free closed (tier 3's) */
    if (uv_loop_close(loop) != 0)
        LOG_WARN("event loop closed with handles still open");
    LOG_INFO(failed ? "stopped after a fault" : "stopped");
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    static settings_t st; /* the server points into it until exit */
    int status;
    if (settings_parse(&st, argc, argv, &status)) {
        log_level = st.log_level;
        status = serve(&st);
    }
    settings_free(&st);
    return status;
}
