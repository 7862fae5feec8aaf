/*
 * kvshared: flags, configuration, signals; everything else is in the
 * kvs_daemon library (server.c, session.c, ...).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "config.h"
#include "kvshare.h"
#include "log.h"
#include "metrics_http.h"
#include "server.h"
#include "tenants.h"

#define DEFAULT_MODEL      "llama-3.1-8b"
#define DEFAULT_POOL_BYTES (1ull << 30)

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: kvshared [options]\n"
        "\n"
        "Serves a pool of KV-cache blocks and a prefix index to decode workers.\n"
        "\n"
        "  --socket PATH          Unix socket (default: $XDG_RUNTIME_DIR/kvshare/kvshared.sock,\n"
        "                         /run/kvshare/kvshared.sock as root, else\n"
        "                         /tmp/kvshare-$UID/kvshared.sock)\n"
        "  --backend KIND         auto (default), host or cuda\n"
        "  --device N             cuda device ordinal (default 0)\n"
        "  --model NAME           geometry preset (default " DEFAULT_MODEL "); presets:");
    for (size_t i = 0; geometry_preset_name(i); i++)
        fprintf(f, " %s", geometry_preset_name(i));
    fprintf(f, "\n"
               "  --layers N --kv-heads N --head-dim N --dtype fp32|fp16|bf16|fp8\n"
               "                         geometry by hand (override the preset's fields)\n"
               "  --block-tokens N       tokens per block (default 16)\n"
               "  --pool-bytes SIZE      pool size, e.g. 8GiB, 70GB, 512MiB (default 1 GiB)\n"
               "  --pool-blocks N        pool size in blocks\n"
               "  --gpu-memory-utilization F\n"
               "                         pool = F x free device memory (cuda)\n"
               "  --max-frame SIZE       largest request accepted (default 16MiB)\n"
               "  --max-output SIZE      unread reply bytes before a client is dropped (default "
               "64MiB)\n"
               "  --max-sessions N       (default 1024)\n"
               "  --namespace NAME[:QUOTA[:RESERVE]]\n"
               "                         create a namespace at start with a quota (max cached\n"
               "                         blocks) and a reservation (blocks other namespaces\n"
               "                         cannot evict it below); repeatable. Namespaces not\n"
               "                         named are created on first use, unlimited\n"
               "  --ready-fd N           write \"READY\\n\" to fd N once listening, then close it\n"
               "  --eviction POLICY      lru (default) or freq (recency + a bonus per hit)\n"
               "  --log-level LEVEL      error, warn, info (default), debug\n"
               "  --config FILE          settings file (docs/OPERATING.md); flags override it\n"
               "  --check-config FILE    validate FILE, print errors with line numbers, exit\n"
               "  --max-namespaces N     (default 256)\n"
               "  --dynamic-namespaces yes|no\n"
               "                         create unknown namespaces on first use (default: yes\n"
               "                         without --config, no with it)\n"
               "  --session-max-pinned N pins one session may hold (default 0: no limit)\n"
               "  --session-max-writing N\n"
               "                         WRITING blocks one session may hold (default 0: none)\n"
               "  --socket-group GROUP   group of the socket (mode 0660)\n"
               "  --allow-uids LIST --allow-gids LIST\n"
               "                         only these peers may connect (default: anyone who can\n"
               "                         open the socket)\n"
               "  --drain-timeout-ms N   SIGTERM: exit within N ms (default 5000)\n"
               "  --metrics-listen HOST:PORT\n"
               "                         serve Prometheus metrics on http://HOST:PORT/metrics\n"
               "                         (off by default; e.g. 127.0.0.1:9464)\n"
               "  --version, --help\n");
}

/* Sizes as `kvshare calc` reads them: K/M/G/T are powers of 1000, KiB/MiB/
 * GiB/TiB powers of 1024 ("8GiB", "70GB", "512M"). */
static int parse_size(const char *s, uint64_t *out)
{
    return geometry_parse_bytes(s, out);
}

static int parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    char *end;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > UINT32_MAX)
        return KVS_EINVAL;
    *out = (uint32_t)v;
    return 0;
}

#define MAX_NS_FLAGS 64

typedef struct ns_flag {
    char name[64];
    uint32_t quota, reserve;
} ns_flag_t;

/* "name", "name:quota", "name:quota:reserve". */
static int parse_namespace(const char *arg, ns_flag_t *out)
{
    char buf[160];
    if (strlen(arg) >= sizeof(buf))
        return KVS_EINVAL;
    snprintf(buf, sizeof(buf), "%s", arg);
    memset(out, 0, sizeof(*out));
    char *quota = strchr(buf, ':'), *reserve = NULL;
    if (quota) {
        *quota++ = '\0';
        reserve = strchr(quota, ':');
        if (reserve)
            *reserve++ = '\0';
    }
    if (!buf[0] || strlen(buf) >= sizeof(out->name))
        return KVS_EINVAL;
    memcpy(out->name, buf, strlen(buf) + 1);
    if (quota && *quota && parse_u32(quota, &out->quota) != 0)
        return KVS_EINVAL;
    if (reserve && *reserve && parse_u32(reserve, &out->reserve) != 0)
        return KVS_EINVAL;
    return 0;
}

static void human(uint64_t bytes, char *buf, size_t len)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* kvshared --check-config FILE: every error with its line, exit 1; or OK. */
static int check_config(const char *path)
{
    config_t *c = NULL;
    char err[8192];
    int rc = config_load(path, &c, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s\n", err[0] ? err : kvs_strerror(rc));
        return 1;
    }
    uint64_t reserved = 0;
    for (uint32_t i = 0; i < c->n_ns; i++)
        reserved += c->ns[i].reserve;
    printf("%s: OK (%d settings, %u namespaces reserving %llu blocks)\n", path, c->argc / 2,
           c->n_ns, (unsigned long long)reserved);
    config_free(c);
    return 0;
}

/* The settings in force, once, at start: what an operator checks first. */
static void log_effective(const server_config_t *cfg, const char *socket_group)
{
    char allow[300];
    config_acl_describe(&cfg->allow, allow, sizeof(allow));
    LOG_INFO("config: file %s; socket %s (group %s, mode 0660); allowed peers: %s",
             cfg->config_path ? cfg->config_path : "(none)", cfg->socket_path,
             socket_group ? socket_group : "(unchanged)", allow);
    LOG_INFO("config: max_sessions %u, max_frame %u, max_output %zu, max_namespaces %u, "
             "dynamic_namespaces %s, session_max_pinned %u, session_max_writing %u (0: none), "
             "drain_timeout_ms %u, metrics_listen %s, log_level %s",
             cfg->max_sessions, cfg->max_frame, cfg->max_output, cfg->max_namespaces,
             cfg->dynamic_namespaces ? "yes" : "no", cfg->session_max_pinned,
             cfg->session_max_writing, cfg->drain_ms,
             cfg->metrics_listen ? cfg->metrics_listen : "(off)",
             log_level == LOG_LEVEL_ERROR  ? "error"
             : log_level == LOG_LEVEL_WARN ? "warn"
             : log_level == LOG_LEVEL_INFO ? "info"
                                           : "debug");
}

/* What main keeps for the life of the process: flags point into them. */
static config_t *flags_conf;
static char **flags_argv;

static void free_flags(void)
{
    config_free(flags_conf);
    free(flags_argv);
}

enum {
    OPT_SOCKET = 256,
    OPT_BACKEND,
    OPT_DEVICE,
    OPT_MODEL,
    OPT_LAYERS,
    OPT_KV_HEADS,
    OPT_HEAD_DIM,
    OPT_DTYPE,
    OPT_BLOCK_TOKENS,
    OPT_POOL_BYTES,
    OPT_POOL_BLOCKS,
    OPT_GPU_UTIL,
    OPT_MAX_FRAME,
    OPT_MAX_OUTPUT,
    OPT_MAX_SESSIONS,
    OPT_READY_FD,
    OPT_LOG_LEVEL,
    OPT_NAMESPACE,
    OPT_EVICTION,
    OPT_VERSION,
    OPT_METRICS_LISTEN,
    OPT_CONFIG,
    OPT_CHECK_CONFIG,
    OPT_MAX_NAMESPACES,
    OPT_DYNAMIC_NAMESPACES,
    OPT_SESSION_MAX_PINNED,
    OPT_SESSION_MAX_WRITING,
    OPT_SOCKET_GROUP,
    OPT_ALLOW_UIDS,
    OPT_ALLOW_GIDS,
    OPT_DRAIN_TIMEOUT_MS,
};

static const struct option options[] = {
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"model", required_argument, NULL, OPT_MODEL},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
    {"pool-bytes", required_argument, NULL, OPT_POOL_BYTES},
    {"pool-blocks", required_argument, NULL, OPT_POOL_BLOCKS},
    {"gpu-memory-utilization", required_argument, NULL, OPT_GPU_UTIL},
    {"max-frame", required_argument, NULL, OPT_MAX_FRAME},
    {"max-output", required_argument, NULL, OPT_MAX_OUTPUT},
    {"max-sessions", required_argument, NULL, OPT_MAX_SESSIONS},
    {"ready-fd", required_argument, NULL, OPT_READY_FD},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"namespace", required_argument, NULL, OPT_NAMESPACE},
    {"eviction", required_argument, NULL, OPT_EVICTION},
    {"version", no_argument, NULL, OPT_VERSION},
    {"metrics-listen", required_argument, NULL, OPT_METRICS_LISTEN},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"check-config", required_argument, NULL, OPT_CHECK_CONFIG},
    {"max-namespaces", required_argument, NULL, OPT_MAX_NAMESPACES},
    {"dynamic-namespaces", required_argument, NULL, OPT_DYNAMIC_NAMESPACES},
    {"session-max-pinned", required_argument, NULL, OPT_SESSION_MAX_PINNED},
    {"session-max-writing", required_argument, NULL, OPT_SESSION_MAX_WRITING},
    {"socket-group", required_argument, NULL, OPT_SOCKET_GROUP},
    {"allow-uids", required_argument, NULL, OPT_ALLOW_UIDS},
    {"allow-gids", required_argument, NULL, OPT_ALLOW_GIDS},
    {"drain-timeout-ms", required_argument, NULL, OPT_DRAIN_TIMEOUT_MS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int main(int argc, char **argv)
{
    server_config_t cfg;
    config_t *conf = NULL;
    char **merged = NULL;
    const char *socket_group = NULL;
    atexit(free_flags);
    char socket_path[PATH_MAX];
    const char *model = DEFAULT_MODEL;
    uint32_t layers = 0, kv_heads = 0, head_dim = 0, block_tokens = 0, u32;
    const char *dtype = NULL;
    uint64_t pool_bytes = 0, size;
    double util = 0;
    char err[512] = "";
    ns_flag_t namespaces[MAX_NS_FLAGS];
    size_t n_namespaces = 0;
    int opt, rc;

    server_config_init(&cfg);

    /* The config file first: its settings become flags placed before the
     * command line's, so a flag overrides the file. */
    const char *config_path = NULL, *check_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char **slot = strncmp(argv[i], "--config", 8) == 0          ? &config_path
                            : strncmp(argv[i], "--check-config", 14) == 0 ? &check_path
                                                                          : NULL;
        size_t n = slot == &config_path ? 8 : 14;
        if (!slot || (argv[i][n] != '\0' && argv[i][n] != '='))
            continue;
        if (argv[i][n] == '=')
            *slot = argv[i] + n + 1;
        else if (i + 1 < argc)
            *slot = argv[++i];
    }
    if (check_path)
        return check_config(check_path);
    if (config_path) {
        rc = config_load(config_path, &conf, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "kvshared: config errors:\n%s\n", err);
            return 2;
        }
        flags_conf = conf;
        merged = calloc((size_t)(argc + conf->argc + 1), sizeof(char *));
        if (!merged)
            return 1;
        flags_argv = merged;
        merged[0] = argv[0];
        for (int i = 0; i < conf->argc; i++)
            merged[1 + i] = conf->argv[i];
        for (int i = 1; i < argc; i++)
            merged[conf->argc + i] = argv[i];
        argc += conf->argc;
        argv = merged;
        cfg.config_path = config_path;
        /* With a config file, namespaces are the ones it declares. */
        cfg.dynamic_namespaces = false;
    }

    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        const char *a = optarg;
        rc = 0;
        switch (opt) {
        case OPT_SOCKET:
            cfg.socket_path = a;
            break;
        case OPT_BACKEND:
            rc = backend_kind_parse(a, &cfg.backend.kind);
            break;
        case OPT_DEVICE:
            rc = parse_u32(a, &u32);
            cfg.backend.device = (int)u32;
            break;
        case OPT_MODEL:
            model = a;
            break;
        case OPT_LAYERS:
            rc = parse_u32(a, &layers);
            break;
        case OPT_KV_HEADS:
            rc = parse_u32(a, &kv_heads);
            break;
        case OPT_HEAD_DIM:
            rc = parse_u32(a, &head_dim);
            break;
        case OPT_DTYPE:
            dtype = a;
            break;
        case OPT_BLOCK_TOKENS:
            rc = parse_u32(a, &block_tokens);
            break;
        case OPT_POOL_BYTES:
            rc = parse_size(a, &pool_bytes);
            break;
        case OPT_POOL_BLOCKS:
            rc = parse_u32(a, &cfg.pool_blocks);
            break;
        case OPT_GPU_UTIL:
            util = strtod(a, NULL);
            if (util <= 0 || util > 1)
                rc = KVS_EINVAL;
            break;
        case OPT_MAX_FRAME:
            rc = parse_size(a, &size);
            if (rc == 0 && (size < 64 || size > UINT32_MAX))
                rc = KVS_EINVAL;
            cfg.max_frame = (uint32_t)size;
            break;
        case OPT_MAX_OUTPUT:
            rc = parse_size(a, &size);
            cfg.max_output = (size_t)size;
            break;
        case OPT_MAX_SESSIONS:
            rc = parse_u32(a, &cfg.max_sessions);
            break;
        case OPT_READY_FD:
            rc = parse_u32(a, &u32);
            cfg.ready_fd = (int)u32;
            break;
        case OPT_EVICTION:
            if (strcmp(a, "lru") == 0)
                cfg.eviction = RADIX_EVICT_LRU;
            else if (strcmp(a, "freq") == 0)
                cfg.eviction = RADIX_EVICT_FREQ;
            else
                rc = KVS_EINVAL;
            break;
        case OPT_LOG_LEVEL:
            rc = log_level_parse(a, &log_level);
            break;
        case OPT_METRICS_LISTEN: {
            char host[64];
            int port;
            rc = metrics_http_parse_addr(a, host, sizeof(host), &port);
            cfg.metrics_listen = a;
            break;
        }
        case OPT_CONFIG:
        case OPT_CHECK_CONFIG:
            break; /* read before the other flags */
        case OPT_MAX_NAMESPACES:
            rc = parse_u32(a, &cfg.max_namespaces);
            if (rc == 0 && cfg.max_namespaces == 0)
                rc = KVS_EINVAL;
            break;
        case OPT_DYNAMIC_NAMESPACES:
            rc = config_parse_bool(a, &cfg.dynamic_namespaces);
            break;
        case OPT_SESSION_MAX_PINNED:
            rc = parse_u32(a, &cfg.session_max_pinned);
            break;
        case OPT_SESSION_MAX_WRITING:
            rc = parse_u32(a, &cfg.session_max_writing);
            break;
        case OPT_SOCKET_GROUP: {
            uint32_t n = 0;
            rc = config_parse_ids(a, true, &cfg.socket_gid, &n);
            if (rc == 0 && n != 1)
                rc = KVS_EINVAL;
            cfg.has_socket_gid = rc == 0;
            socket_group = a;
            break;
        }
        case OPT_ALLOW_UIDS:
            rc = config_parse_ids(a, false, cfg.allow.uids, &cfg.allow.n_uids);
            break;
        case OPT_ALLOW_GIDS:
            rc = config_parse_ids(a, true, cfg.allow.gids, &cfg.allow.n_gids);
            break;
        case OPT_DRAIN_TIMEOUT_MS:
            rc = parse_u32(a, &cfg.drain_ms);
            break;
        case OPT_NAMESPACE:
            if (n_namespaces == MAX_NS_FLAGS)
                rc = KVS_ELIMIT;
            else
                rc = parse_namespace(a, &namespaces[n_namespaces++]);
            break;
        case OPT_VERSION:
            printf("kvshared %d.%d.%d\n", KVS_VERSION_MAJOR, KVS_VERSION_MINOR, KVS_VERSION_PATCH);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (rc != 0) {
            fprintf(stderr, "kvshared: invalid value '%s' for --%s (see --help)\n", a,
                    options[opt - OPT_SOCKET].name);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvshared: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }

    /* Geometry: the preset, then each explicit flag over it. */
    if (geometry_preset(model, &cfg.geometry) != 0) {
        fprintf(stderr, "kvshared: unknown model '%s'; presets:", model);
        for (size_t i = 0; geometry_preset_name(i); i++)
            fprintf(stderr, " %s", geometry_preset_name(i));
        fprintf(stderr, " (or give --layers, --kv-heads, --head-dim, --dtype)\n");
        return 2;
    }
    if (layers)
        cfg.geometry.layers = layers;
    if (kv_heads)
        cfg.geometry.kv_heads = kv_heads;
    if (head_dim)
        cfg.geometry.head_dim = head_dim;
    if (block_tokens)
        cfg.geometry.block_tokens = block_tokens;
    if (dtype && geometry_dtype_parse(dtype, &cfg.geometry.dtype) != 0) {
        fprintf(stderr, "kvshared: unknown dtype '%s' (fp32, fp16, bf16, fp8)\n", dtype);
        return 2;
    }
    if (util > 0)
        cfg.backend.mem_fraction = util;
    else if (!cfg.pool_blocks)
        cfg.backend.bytes = pool_bytes ? pool_bytes : DEFAULT_POOL_BYTES;
    if (pool_bytes && cfg.pool_blocks) {
        fprintf(stderr, "kvshared: give --pool-bytes or --pool-blocks, not both\n");
        return 2;
    }

    if (!cfg.socket_path) {
        rc = kvs_default_socket_path(socket_path, sizeof(socket_path));
        if (rc != 0) {
            fprintf(stderr, "kvshared: cannot build the default socket path; give --socket\n");
            return 2;
        }
        cfg.socket_path = socket_path;
    }

    /* A client that dies mid-reply must not kill the daemon. */
    signal(SIGPIPE, SIG_IGN);

    /* Refuse early, before a pool of gigabytes is allocated for nothing. */
    rc = server_check_socket(cfg.socket_path, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "kvshared: %s\n", err);
        return 1;
    }

    uv_loop_t *loop = uv_default_loop();
    server_t *srv = NULL;
    rc = server_open(&cfg, loop, &srv, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "kvshared: %s\n", err[0] ? err : kvs_strerror(rc));
        return 1;
    }

    if (cfg.config_path) {
        /* The server keeps its own copy of the namespaces: SIGHUP replaces it. */
        config_t *ns_conf = NULL;
        rc = config_load(cfg.config_path, &ns_conf, err, sizeof(err));
        if (rc == 0) {
            rc = tenants_apply(srv, ns_conf, err, sizeof(err));
            if (rc != 0)
                config_free(ns_conf);
        }
        if (rc != 0) {
            fprintf(stderr, "kvshared: %s\n", err);
            server_free(srv);
            uv_loop_close(loop);
            return 1;
        }
    }

    char per_token[32], per_block[32], pool[32];
    human(geometry_bytes_per_token(&srv->geo), per_token, sizeof(per_token));
    human(srv->block_bytes, per_block, sizeof(per_block));
    human((uint64_t)srv->num_blocks * srv->block_bytes, pool, sizeof(pool));
    LOG_INFO("kvshared %d.%d.%d, backend %s", KVS_VERSION_MAJOR, KVS_VERSION_MINOR,
             KVS_VERSION_PATCH, backend_detail(srv->backend));
    LOG_INFO("geometry: %u layers x %u kv heads x %u head dim x %u B (%s) x 2 (K, V) = %s per "
             "token",
             srv->geo.layers, srv->geo.kv_heads, srv->geo.head_dim,
             geometry_dtype_bytes(srv->geo.dtype), geometry_dtype_name(srv->geo.dtype), per_token);
    LOG_INFO("pool: %s per token x %u tokens = %s per block; %u blocks = %s (%llu tokens)",
             per_token, srv->geo.block_tokens, per_block, srv->num_blocks, pool,
             (unsigned long long)srv->num_blocks * srv->geo.block_tokens);
    LOG_INFO("eviction: %s", cfg.eviction == RADIX_EVICT_FREQ ? "freq" : "lru");

    for (size_t i = 0; i < n_namespaces; i++) {
        /* A --namespace flag overrides the same namespace of the file. */
        uint32_t id;
        if (radix_ns_find(srv->index, namespaces[i].name, &id) == 0)
            rc = radix_ns_set_limits(srv->index, id, namespaces[i].quota, namespaces[i].reserve);
        else
            rc = server_ns_create(srv, namespaces[i].name, namespaces[i].quota,
                                  namespaces[i].reserve, err, sizeof(err));
        if (rc == 0)
            rc = tenants_declare(srv, namespaces[i].name, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "kvshared: --namespace: %s\n", err);
            server_free(srv);
            uv_loop_close(loop);
            return 2;
        }
    }

    log_effective(&srv->cfg, socket_group);
    tenants_log(srv);
    if (cfg.metrics_listen) {
        rc = metrics_http_start(srv, cfg.metrics_listen, &srv->http, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "kvshared: %s\n", err);
            server_free(srv);
            uv_run(loop, UV_RUN_NOWAIT);
            uv_loop_close(loop);
            return 1;
        }
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
    server_free(srv);
    if (uv_loop_close(loop) != 0)
        LOG_WARN("event loop closed with handles still open");
    LOG_INFO("stopped");
    return 0;
}
