/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench devices: does a Lookup cost more when kvshared serves more devices
 * (--devices, one tensor-parallel group)? It should not: the devices share
 * one index and one record per block id, and a lookup never touches a pool.
 *
 *   for devices in 1, 4, 8 (host backend, one memfd per simulated device,
 *   the same geometry and the same 4,096 blocks each):
 *     in-process: kvshared's own request path without a socket: a server
 *       opened in this process, one session, a 4k-token prefix committed by
 *       the group's scheduler, then Lookup frames (no pin, a full hit) fed
 *       to the session one at a time, each decoded, dispatched, looked up
 *       and its reply encoded, as the daemon does;
 *     rpc: a real kvshared --devices started for it, the same prefix
 *       committed, one client looping kvs_lookup (no pin) of it.
 *   Both for 64- and 4k-token prompts. Printed: p50 and p99 per lookup, and
 *   each figure's ratio to the one-device figure of the same run.
 *
 * Nothing is pinned to a CPU. Rounds alternate the device counts (1, 4, 8,
 * 1, 4, 8, ...) so that a machine whose speed drifts moves them alike.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "bench.h"
#include "frame.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "launch.h"
#include "log.h"
#include "now.h"
#include "kvshared.h"
#include "session_io.h"
#include "socket_path.h"
#include "test_tmp.h"

#define DEV_BT          16
#define DEV_POOL        4096
#define DEV_MAX_TOK     4096
#define DEV_N_COUNTS    3
#define DEV_MAX_DEVICES 8 /* the largest of device_counts */

static const unsigned device_counts[DEV_N_COUNTS] = {1, 4, 8};
static const size_t prompt_sizes[2] = {64, 4096};

typedef struct dev_cfg {
    const char *kvshared;
    unsigned rounds;
    unsigned iters; /* lookups per figure per round */
} dev_cfg_t;

/* One figure: lookups' nanoseconds over every round. */
typedef struct dev_samples {
    uint64_t *ns;
    size_t n, cap;
} dev_samples_t;

static int samples_push(dev_samples_t *s, uint64_t v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4096;
        uint64_t *p = realloc(s->ns, cap * sizeof(*p));
        if (!p)
            return -1;
        s->ns = p;
        s->cap = cap;
    }
    s->ns[s->n++] = v;
    return 0;
}

static void make_prompt(uint32_t *t, size_t n)
{
    uint32_t x = 2654435761u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        t[i] = x % 128000;
    }
}

static const char *devices_spec(unsigned n, char *buf, size_t len)
{
    snprintf(buf, len, "0-%u", n - 1);
    return n > 1 ? buf : NULL;
}

/* --- in-process --- */

/* Feeds one request to s and returns its decoded reply (caller frees), or
 * NULL when no whole reply came out. */
static Kvshare__Response *feed(session_t *s, Kvshare__Request *req)
{
    frame_buf_t f = {0};
    const uint8_t *body;
    uint32_t len;
    Kvshare__Response *r = NULL;
    req->id = 7;
    if (frame_append_request(&f, req) == 0 && session_feed(s, f.data, f.len) == 0 &&
        frame_next(&s->out, UINT32_MAX, &body, &len) == 1)
        r = kvshare__response__unpack(NULL, len, body);
    frame_buf_release(&f);
    frame_buf_reset(&s->out);
    return r;
}

/* Several devices: a session of each rank says Hello and declares its
 * shard of ids written for tokens[0..n), so that the group's commit may
 * cache them; the sessions stay open (their end would free the blocks
 * until the group's commit) in ranks[0..devices). Returns 0 when all
 * succeeded. */
static int inproc_declare(server_t *srv, unsigned devices, const uint32_t *tokens, size_t n,
                          uint32_t *ids, session_t **ranks)
{
    int ok = 1;
    for (unsigned r = 0; r < devices; r++) {
        ranks[r] = NULL;
        if (!ok || session_new(srv, &ranks[r]) != 0) {
            ok = 0;
            continue;
        }
        Kvshare__Request req = KVSHARE__REQUEST__INIT;
        Kvshare__HelloRequest h = KVSHARE__HELLO_REQUEST__INIT;
        h.version = KVS_PROTOCOL_VERSION;
        h.no_fds = true;
        h.ranked = true;
        h.rank = r;
        req.rpc_case = KVSHARE__REQUEST__RPC_HELLO;
        req.hello = &h;
        Kvshare__Response *resp = feed(ranks[r], &req);
        ok = resp && resp->status == 0;
        kvshare__response__free_unpacked(resp, NULL);
        Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
        cm.tokens.data = (uint8_t *)tokens;
        cm.tokens.len = n * sizeof(*tokens);
        cm.block_ids = ids;
        cm.n_block_ids = n / DEV_BT;
        cm.shard_written = true;
        req = (Kvshare__Request)KVSHARE__REQUEST__INIT;
        req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
        req.commit = &cm;
        resp = ok ? feed(ranks[r], &req) : NULL;
        ok = resp && resp->status == 0;
        kvshare__response__free_unpacked(resp, NULL);
    }
    return ok ? 0 : -1;
}

/* Hello (the group's scheduler when there are several devices), Alloc,
 * each rank's declaration (inproc_declare) and a Commit for the group of
 * tokens[0..n). Returns 0 when all succeeded. */
static int inproc_fill(session_t *s, unsigned devices, const uint32_t *tokens, size_t n)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__HelloRequest h = KVSHARE__HELLO_REQUEST__INIT;
    h.version = KVS_PROTOCOL_VERSION;
    h.no_fds = true;
    h.group_scheduler = devices > 1;
    req.rpc_case = KVSHARE__REQUEST__RPC_HELLO;
    req.hello = &h;
    Kvshare__Response *r = feed(s, &req);
    int ok = r && r->status == 0;
    kvshare__response__free_unpacked(r, NULL);

    Kvshare__AllocRequest a = KVSHARE__ALLOC_REQUEST__INIT;
    a.n = (uint32_t)(n / DEV_BT);
    req = (Kvshare__Request)KVSHARE__REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &a;
    r = ok ? feed(s, &req) : NULL;
    ok = r && r->status == 0 && r->rpc_case == KVSHARE__RESPONSE__RPC_ALLOC &&
         r->alloc->n_block_ids == a.n;
    uint32_t ids[DEV_MAX_TOK / DEV_BT];
    if (ok)
        memcpy(ids, r->alloc->block_ids, a.n * sizeof(*ids));
    kvshare__response__free_unpacked(r, NULL);
    session_t *ranks[DEV_MAX_DEVICES] = {NULL};
    if (ok && devices > 1)
        ok = inproc_declare(s->srv, devices, tokens, n, ids, ranks) == 0;

    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = n * sizeof(*tokens);
    cm.block_ids = ids;
    cm.n_block_ids = a.n;
    cm.for_group = devices > 1;
    req = (Kvshare__Request)KVSHARE__REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    r = ok ? feed(s, &req) : NULL;
    ok = r && r->status == 0 && r->commit->n_committed == a.n;
    kvshare__response__free_unpacked(r, NULL);
    for (unsigned k = 0; k < devices && k < DEV_MAX_DEVICES; k++)
        if (ranks[k])
            session_close(ranks[k], "bench");
    return ok ? 0 : -1;
}

/* Lookups of tokens[0..n) fed to one session of a server with `devices`
 * devices: iters samples into out. */
static int inproc_round(const dev_cfg_t *b, unsigned devices, const uint32_t *tokens, size_t n,
                        dev_samples_t *out)
{
    uv_loop_t loop;
    server_config_t cfg;
    server_t *srv = NULL;
    session_t *s = NULL;
    char spec[16], err[256];
    int rc = -1;

    if (uv_loop_init(&loop) != 0)
        return -1;
    server_config_init(&cfg);
    cfg.geometry = (geometry_t){
        .layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = GEOMETRY_FP16, .block_tokens = DEV_BT};
    cfg.backend.kind = BACKEND_HOST;
    cfg.pool_blocks = DEV_POOL;
    cfg.max_frame = 64u << 20;
    cfg.devices = devices_spec(devices, spec, sizeof(spec));
    if (server_open(&cfg, &loop, &srv, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench devices: in-process server of %u devices: %s\n", devices, err);
        goto out;
    }
    if (srv->n_devices != devices || session_new(srv, &s) != 0 ||
        inproc_fill(s, devices, tokens, n) != 0) {
        fprintf(stderr, "bench devices: in-process fill with %u devices failed\n", devices);
        goto out;
    }

    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.tokens.data = (uint8_t *)tokens;
    lk.tokens.len = n * sizeof(*tokens);
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    req.id = 7;
    frame_buf_t f = {0};
    if (frame_append_request(&f, &req) != 0)
        goto out;
    rc = 0;
    for (unsigned i = 0; i < b->iters && rc == 0; i++) {
        const uint8_t *body;
        uint32_t len;
        uint64_t t0 = now_ns();
        if (session_feed(s, f.data, f.len) != 0 ||
            frame_next(&s->out, UINT32_MAX, &body, &len) != 1)
            rc = -1;
        uint64_t t1 = now_ns();
        frame_buf_reset(&s->out);
        if (rc == 0 && samples_push(out, t1 - t0) != 0)
            rc = -1;
    }
    /* One reply checked: a full hit, or the figures mean nothing. */
    Kvshare__Response *r = rc == 0 ? feed(s, &req) : NULL;
    if (rc == 0 && !(r && r->status == 0 && r->lookup->n_block_ids == n / DEV_BT)) {
        fprintf(stderr, "bench devices: in-process lookup with %u devices was not a full hit\n",
                devices);
        rc = -1;
    }
    kvshare__response__free_unpacked(r, NULL);
    frame_buf_release(&f);
out:
    if (s)
        session_close(s, "bench");
    server_free(srv);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
    return rc;
}

/* --- over the socket --- */

static kvs_client_t *rpc_connect(const char *sock, unsigned devices)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = sock;
    o.timeout_ms = 30000;
    o.flags = devices > 1 ? KVS_GROUP_SCHEDULER : KVS_NO_MAP;
    int rc = kvs_connect(&o, &c);
    if (rc != 0)
        fprintf(stderr, "bench devices: connect: %s\n", kvs_strerror(rc));
    return rc == 0 ? c : NULL;
}

/* Several devices: each rank's client, mapping nothing, declares its shard
 * of ids written for tokens[0..n), for the group's commit; the declarations
 * stay when the clients leave, as every shard is in. Returns 0 when all
 * succeeded. */
static int rpc_declare(const char *sock, unsigned devices, const uint32_t *tokens, size_t n,
                       const uint32_t *ids)
{
    uint32_t canonical[2 * DEV_MAX_TOK / DEV_BT];
    kvs_client_t *ranks[DEV_MAX_DEVICES] = {NULL};
    int rc = 0;
    for (unsigned r = 0; devices > 1 && r < devices && rc == 0; r++) {
        kvs_options_t o;
        kvs_commit_opts_t wo;
        size_t none = 0;
        kvs_options_init(&o);
        o.socket_path = sock;
        o.timeout_ms = 30000;
        o.flags = KVS_RANK | KVS_NO_MAP;
        o.rank = r;
        kvs_commit_opts_init(&wo);
        wo.shard_written = 1;
        rc = kvs_connect(&o, &ranks[r]);
        if (rc == 0)
            rc = kvs_commit_ex(ranks[r], "default", tokens, n, ids, n / DEV_BT, &wo, canonical,
                               &none);
        if (rc != 0)
            fprintf(stderr, "bench devices: rank %u's declaration: %s\n", r, kvs_strerror(rc));
    }
    for (unsigned r = 0; r < devices && r < DEV_MAX_DEVICES; r++)
        kvs_close(ranks[r]);
    return rc;
}

static int rpc_round(const dev_cfg_t *b, unsigned devices, const uint32_t *tokens, size_t n,
                     dev_samples_t *out)
{
    char dir[SOCKET_PATH_MAX - 16], sock[SOCKET_PATH_MAX], spec[16], nb[16];
    uint32_t ids[DEV_MAX_TOK / DEV_BT], canonical[2 * DEV_MAX_TOK / DEV_BT];
    size_t found = 0, done = 0;
    int rc = -1;

    if (test_tmp_dir("kvs-bench-dev", dir, sizeof(dir)) != 0)
        return -1;
    snprintf(sock, sizeof(sock), "%s/kvshared.sock", dir);
    snprintf(nb, sizeof(nb), "%u", DEV_POOL);
    const char *argv[32] = {b->kvshared, "--socket",       sock,  "--backend",
                            "host",      "--layers",       "1",   "--kv-heads",
                            "1",         "--head-dim",     "8",   "--dtype",
                            "fp16",      "--block-tokens", "16",  "--pool-blocks",
                            nb,          "--log-level",    "warn"};
    int argc = 19;
    if (devices > 1) {
        argv[argc++] = "--devices";
        argv[argc++] = devices_spec(devices, spec, sizeof(spec));
    }
    argv[argc] = NULL;
    pid_t pid = launch_daemon(argv, LAUNCH_READY_MS, NULL);
    if (pid < 0) {
        fprintf(stderr, "bench devices: kvshared (%s) did not start\n", b->kvshared);
        rmdir(dir);
        return -1;
    }
    kvs_client_t *c = rpc_connect(sock, devices);
    kvs_commit_opts_t co;
    kvs_commit_opts_init(&co);
    co.for_group = devices > 1;
    if (!c || kvs_alloc(c, "default", n / DEV_BT, ids) != 0 ||
        rpc_declare(sock, devices, tokens, n, ids) != 0 ||
        kvs_commit_ex(c, "default", tokens, n, ids, n / DEV_BT, &co, canonical, &done) != 0 ||
        done != n / DEV_BT || kvs_release(c, ids, n / DEV_BT, NULL) != 0) {
        fprintf(stderr, "bench devices: filling kvshared with %u devices failed: %s\n", devices,
                c ? kvs_last_error(c) : "no connection");
        goto out;
    }
    rc = 0;
    for (unsigned i = 0; i < b->iters && rc == 0; i++) {
        uint64_t t0 = now_ns();
        if (kvs_lookup(c, "default", tokens, n, 0, ids, n / DEV_BT, &found) != 0 ||
            found != n / DEV_BT)
            rc = -1;
        uint64_t t1 = now_ns();
        if (rc == 0 && samples_push(out, t1 - t0) != 0)
            rc = -1;
    }
    if (rc != 0)
        fprintf(stderr, "bench devices: lookup with %u devices: not a full hit\n", devices);
out:
    kvs_close(c);
    if (launch_stop(pid, SIGTERM, 30000) != 0 && rc == 0) {
        fprintf(stderr, "bench devices: kvshared with %u devices did not exit cleanly\n", devices);
        rc = -1;
    }
    unlink(sock);
    rmdir(dir);
    return rc;
}

/* --- output --- */

static void report(const char *path, size_t n_tokens, dev_samples_t *s)
{
    double p50[DEV_N_COUNTS], p99[DEV_N_COUNTS];
    for (int d = 0; d < DEV_N_COUNTS; d++) {
        p50[d] = bench_quantile(s[d].ns, s[d].n, 0.50) / 1e3;
        p99[d] = bench_quantile(s[d].ns, s[d].n, 0.99) / 1e3;
    }
    for (int d = 0; d < DEV_N_COUNTS; d++)
        printf("%s_lookup_%zu_devices_%u p50 %.3f us p99 %.3f us (x%.2f / x%.2f of 1 device)\n",
               path, n_tokens, device_counts[d], p50[d], p99[d], p50[d] / p50[0], p99[d] / p99[0]);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare-bench devices [--rounds N] [--iters N] [--kvshared PATH]\n"
               "  Lookup p50/p99 (64 and 4k tokens, a full hit) in-process and over the socket,\n"
               "  with kvshared serving 1, 4 and 8 simulated devices, in alternating rounds.\n"
               "  --rounds N   rounds over the device counts (default 5)\n"
               "  --iters N    lookups per figure per round (default 20000)\n");
}

int bench_devices(int argc, char **argv)
{
    dev_cfg_t b = {.rounds = 5, .iters = 20000};
    char kvshared_buf[4096];
    b.kvshared = bench_default_kvshared(kvshared_buf, sizeof(kvshared_buf));
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            b.rounds = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            b.iters = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--kvshared") && i + 1 < argc)
            b.kvshared = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!b.rounds || !b.iters) {
        usage(stderr);
        return 2;
    }
    log_level = LOG_LEVEL_WARN;
    static uint32_t tokens[DEV_MAX_TOK];
    make_prompt(tokens, DEV_MAX_TOK);
    dev_samples_t in[2][DEV_N_COUNTS] = {0}, rpc[2][DEV_N_COUNTS] = {0};
    int rc = 0;
    for (unsigned round = 0; round < b.rounds && rc == 0; round++)
        for (int p = 0; p < 2 && rc == 0; p++)
            for (int d = 0; d < DEV_N_COUNTS && rc == 0; d++) {
                rc = inproc_round(&b, device_counts[d], tokens, prompt_sizes[p], &in[p][d]);
                if (rc == 0)
                    rc = rpc_round(&b, device_counts[d], tokens, prompt_sizes[p], &rpc[p][d]);
            }
    if (rc == 0) {
        printf("# %u rounds x %u lookups per figure; host backend, %u blocks per device\n",
               b.rounds, b.iters, DEV_POOL);
        for (int p = 0; p < 2; p++) {
            report("inproc", prompt_sizes[p], in[p]);
            report("rpc", prompt_sizes[p], rpc[p]);
        }
    }
    for (int p = 0; p < 2; p++)
        for (int d = 0; d < DEV_N_COUNTS; d++) {
            free(in[p][d].ns);
            free(rpc[p][d].ns);
        }
    return rc == 0 ? 0 : 1;
}
