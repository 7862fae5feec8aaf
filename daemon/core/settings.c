/* SPDX-License-Identifier: Apache-2.0 */
#include "settings.h"

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "backend.h"
#include "events.h"
#include "geometry.h"
#include "identity.h"
#include "kvshare_status.h"
#include "kvshare_version.h"
#include "nsname.h"
#include "preflight.h"
#include "socket_path.h"
#include "disk.h"
#include "units.h"

#define DEFAULT_MODEL      "llama-3.1-8b"
#define DEFAULT_POOL_BYTES (1ull << 30)

/* --- the names of SETTING_CHOICE and checked SETTING_TEXT rows --- */

static int parse_backend(const char *text, int *out)
{
    backend_kind_t kind;
    int rc = backend_kind_parse(text, &kind);
    *out = (int)kind;
    return rc;
}

static const char *name_backend(int i)
{
    return backend_kind_name((backend_kind_t)i);
}

static int parse_dtype(const char *text, int *out)
{
    geometry_dtype_t dtype;
    int rc = geometry_dtype_parse(text, &dtype);
    *out = (int)dtype;
    return rc;
}

static const char *name_dtype(int i)
{
    return geometry_dtype_name((geometry_dtype_t)i);
}

static int parse_log_level(const char *text, int *out)
{
    log_level_t level;
    int rc = log_level_parse(text, &level);
    *out = (int)level;
    return rc;
}

static const char *name_log_level(int i)
{
    return log_level_name((log_level_t)i);
}

static const char *const eviction_names[] = {
    [RADIX_EVICT_LRU] = "lru", [RADIX_EVICT_FREQ] = "freq"};

static int parse_eviction(const char *text, int *out)
{
    for (size_t i = 0; i < sizeof(eviction_names) / sizeof(eviction_names[0]); i++) {
        if (strcmp(text, eviction_names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    }
    return KVS_EINVAL;
}

static const char *name_eviction(int i)
{
    return i >= 0 && (size_t)i < sizeof(eviction_names) / sizeof(eviction_names[0])
               ? eviction_names[i]
               : NULL;
}

static const char *const disk_io_names[] = {
    [DISK_IO_AUTO] = "auto", [DISK_IO_URING] = "io_uring", [DISK_IO_THREADS] = "threads"};

static int parse_disk_io(const char *text, int *out)
{
    for (size_t i = 0; i < sizeof(disk_io_names) / sizeof(disk_io_names[0]); i++) {
        if (strcmp(text, disk_io_names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    }
    return KVS_EINVAL;
}

static const char *name_disk_io(int i)
{
    return i >= 0 && (size_t)i < sizeof(disk_io_names) / sizeof(disk_io_names[0]) ? disk_io_names[i]
                                                                                  : NULL;
}

static int parse_model(const char *text, int *out)
{
    geometry_t g;
    (void)out;
    return geometry_preset(text, &g);
}

static const char *name_model(int i)
{
    return i >= 0 ? geometry_preset_name((size_t)i) : NULL;
}

static int parse_revision(const char *text, int *out)
{
    (void)out;
    return identity_revision_valid(text) ? 0 : KVS_EINVAL;
}

static int parse_addr(const char *text, int *out)
{
    char host[64];
    int port;
    (void)out;
    return config_parse_host_port(text, host, sizeof(host), &port);
}

static int parse_endpoint(const char *text, int *out)
{
    (void)out;
    return events_check_endpoint(text);
}

static int parse_topic(const char *text, int *out)
{
    (void)out;
    return events_check_topic(text);
}

static const char *const encoding_names[] = {[EVENTS_MAP] = "map", [EVENTS_ARRAY] = "array"};
static const char *const framing_names[] = {
    [EVENTS_REPLAY_PLAIN] = "plain", [EVENTS_REPLAY_TOPIC] = "topic"};

static int parse_names(const char *const *names, size_t n, const char *text, int *out)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(text, names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    }
    return KVS_EINVAL;
}

static int parse_encoding(const char *text, int *out)
{
    return parse_names(encoding_names, 2, text, out);
}

static const char *name_encoding(int i)
{
    return i >= 0 && i < 2 ? encoding_names[i] : NULL;
}

static int parse_framing(const char *text, int *out)
{
    return parse_names(framing_names, 2, text, out);
}

static const char *name_framing(int i)
{
    return i >= 0 && i < 2 ? framing_names[i] : NULL;
}

/* --- the table --- */

#define AT(field) .offset = offsetof(settings_t, field), .width = sizeof(((settings_t *)0)->field)
#define NS_AT(field)                                                                               \
    .offset = offsetof(config_ns_t, field), .width = sizeof(((config_ns_t *)0)->field)
#define CHOICE(fn) .parse = parse_##fn, .name = name_##fn

const setting_t settings_table[] = {
    /* Where it listens, and who may connect. */
    {"socket", "socket", SETTING_GLOBAL, SETTING_TEXT, "PATH", 1, SOCKET_PATH_MAX - 1,
     AT(server.socket_path), .expect = "a path", .example = "/run/kvshare/kvshared.sock",
     .deflt = "$XDG_RUNTIME_DIR/kvshare/kvshared.sock; as root /run/kvshare/kvshared.sock; else "
              "/tmp/kvshare-$UID/kvshared.sock",
     .help = "the Unix socket workers connect to"},
    {"socket_group", "socket-group", SETTING_GLOBAL, SETTING_GROUP, "GROUP", 0, 0,
     AT(server.socket_gid), .zero = "the daemon's group",
     .help = "group of the socket; its mode is always 0660"},
    {"allow_uids", "allow-uids", SETTING_GLOBAL, SETTING_UIDS, "LIST", 0, 0, AT(server.allow),
     .zero = "anyone who can open the socket",
     .help = "peers allowed to connect: a uid in this list (numbers or names, comma-separated)"},
    {"allow_gids", "allow-gids", SETTING_GLOBAL, SETTING_GIDS, "LIST", 0, 0, AT(server.allow),
     .zero = "anyone who can open the socket",
     .help = "peers allowed to connect: a primary gid in this list"},
    {"clear_uids", "clear-uids", SETTING_GLOBAL, SETTING_UIDS, "LIST", 0, 0, AT(server.clear_acl),
     .zero = "uid 0 only",
     .help = "peers who may Clear any namespace: a uid in this list (others may clear only a "
             "namespace whose allow_uids / allow_gids names them; refusals count in "
             "clears_denied)"},
    {"clear_gids", "clear-gids", SETTING_GLOBAL, SETTING_GIDS, "LIST", 0, 0, AT(server.clear_acl),
     .zero = "uid 0 only", .help = "peers who may Clear any namespace: a primary gid in this list"},

    /* The pool. */
    {"backend", "backend", SETTING_GLOBAL, SETTING_CHOICE, "KIND", 0, 0, CHOICE(backend),
     AT(server.backend.kind),
     .help = "auto (cuda if a device answers, else host), host, or cuda (an error if it "
             "cannot start)"},
    {"device", "device", SETTING_GLOBAL, SETTING_U32, "N", 0, 1023, AT(server.backend.device),
     .help = "cuda device ordinal"},
    {"devices", "devices", SETTING_GLOBAL, SETTING_TEXT, "LIST", 1, 255, AT(server.devices),
     .expect = "devices", .example = "0-3", .zero = "one, --device",
     .help = "several devices, one pool each (a tensor-parallel group): a range 0-3, a list "
             "0,2,5, or all (cuda); the host backend simulates as many"},
    {"model", "model", SETTING_GLOBAL, SETTING_TEXT, "NAME", 1, 64, CHOICE(model), AT(model),
     .expect = "a model preset", .example = "meta-llama/Llama-3.1-8B",
     .help = "geometry preset; given, it is also the model of the identity of every namespace "
             "that neither its config section nor a worker names (docs/OPERATING.md, Model "
             "identity)"},
    {"model_revision", "model-revision", SETTING_GLOBAL, SETTING_TEXT, "REV", 1,
     IDENTITY_REVISION_MAX, .parse = parse_revision, AT(server.model_revision), .zero = "none",
     .expect = "a revision without spaces", .example = "main",
     .help = "the revision of --model (a tag or commit), part of the daemon's model identity"},
    {"layers", "layers", SETTING_GLOBAL, SETTING_U32, "N", 1, 4096, AT(geometry.layers),
     .deflt = "the preset's", .help = "geometry by hand: layers (overrides the preset's)"},
    {"kv_heads", "kv-heads", SETTING_GLOBAL, SETTING_U32, "N", 1, 4096, AT(geometry.kv_heads),
     .deflt = "the preset's", .help = "geometry by hand: KV heads"},
    {"head_dim", "head-dim", SETTING_GLOBAL, SETTING_U32, "N", 1, 65536, AT(geometry.head_dim),
     .deflt = "the preset's", .help = "geometry by hand: head dimension"},
    {"dtype", "dtype", SETTING_GLOBAL, SETTING_CHOICE, "TYPE", 0, 0, CHOICE(dtype),
     AT(geometry.dtype), .deflt = "the preset's",
     .help = "geometry by hand: element type, fp32, fp16, bf16 or fp8"},
    {"block_tokens", "block-tokens", SETTING_GLOBAL, SETTING_U32, "N", 1, 65536,
     AT(geometry.block_tokens), .deflt = "the preset's", .help = "tokens per block"},
    {"pool_bytes", "pool-bytes", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 1, UINT64_MAX,
     AT(pool_bytes), .deflt = "1GiB", .example = "8GiB",
     .help = "pool size, e.g. 512MiB, 8GiB, 70GB"},
    {"pool_blocks", "pool-blocks", SETTING_GLOBAL, SETTING_U32, "N", 1, UINT32_MAX - 1,
     AT(server.pool_blocks), .zero = "none", .help = "pool size in blocks (instead of pool_bytes)"},
    {"host_tier", "host-tier", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 1, UINT64_MAX,
     AT(server.host_tier_bytes), .zero = "off", .example = "64GiB",
     .help = "tier 2 in host memory: blocks the pool evicts are kept there and come back on "
             "a pinned lookup (with devices: the size in all, each block with every shard)"},
    {"disk_tier_path", "disk-tier-path", SETTING_GLOBAL, SETTING_TEXT, "FILE", 1, 255,
     AT(server.disk_tier_path), .zero = "off", .example = "/var/lib/kvshare/tier3",
     .help = "tier 3 on a local disk, below host_tier (needed): one preallocated file, O_DIRECT, "
             "in an existing directory of kvshared's user that no one else can write (the unit's "
             "/var/lib/kvshare); blocks tier 2 drops go there, and what it holds is served "
             "again after a restart"},
    {"disk_tier_bytes", "disk-tier-bytes", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 1, UINT64_MAX,
     AT(server.disk_tier_bytes), .zero = "off", .example = "512GiB",
     .help = "the size of disk_tier_path's file"},
    {"disk_tier_wipe", "disk-tier-wipe", SETTING_GLOBAL, SETTING_BOOL, "yes/no", 0, 0,
     AT(server.disk_tier_wipe),
     .help = "a disk_tier_path written with another geometry, size or format version is "
             "started over instead of refused"},
    {"disk_tier_io", "disk-tier-io", SETTING_GLOBAL, SETTING_CHOICE, "KIND", 0, 0, CHOICE(disk_io),
     AT(server.disk_tier_io), .help = "auto (io_uring, else a thread pool), io_uring, or threads"},
    {"tier_copy_nice", "tier-copy-nice", SETTING_GLOBAL, SETTING_U32, "N", 0, 19,
     AT(server.tier_copy_nice), .init = SERVER_DEFAULT_TIER_COPY_NICE,
     .zero = "0: as the loop thread",
     .help = "threads copying between the pool and tier 2, and the cluster tier's thread, run "
             "this much nicer than the thread that serves the sessions, so that with few CPUs "
             "copies do not keep it waiting"},
    {"loop_rt_priority", "loop-rt-priority", SETTING_GLOBAL, SETTING_U32, "N", 0, 99,
     AT(loop_rt_priority), .zero = "0: normal priority",
     .help = "the thread that serves the sessions runs under SCHED_RR at this priority, so "
             "that a Lookup waits for no thread at normal priority (the tiers' copies, Redis, "
             "anything else on the host); needs CAP_SYS_NICE or RLIMIT_RTPRIO"},
    {"gpu_memory_utilization", "gpu-memory-utilization", SETTING_GLOBAL, SETTING_FRACTION, "F", 0,
     0, AT(gpu_memory_utilization), .zero = "none",
     .help = "pool = this fraction of free device memory (cuda)"},
    {"eviction", "eviction", SETTING_GLOBAL, SETTING_CHOICE, "POLICY", 0, 0, CHOICE(eviction),
     AT(server.eviction), .help = "lru, or freq (recency plus a bonus per hit)"},

    /* Namespaces and limits. */
    {"dynamic_namespaces", "dynamic-namespaces", SETTING_GLOBAL, SETTING_BOOL, "yes/no", 0, 0,
     AT(server.dynamic_namespaces), .init = true, .deflt = "yes without a config file, no with one",
     .help = "create unknown namespaces on first use"},
    {"max_namespaces", "max-namespaces", SETTING_GLOBAL, SETTING_U32, "N", 1, 65536,
     AT(server.max_namespaces), .init = SERVER_DEFAULT_MAX_NAMESPACES,
     .help = "namespaces the index may hold"},
    {"session_max_namespaces", "session-max-namespaces", SETTING_GLOBAL, SETTING_U32, "N", 0, 65536,
     AT(server.session_max_namespaces), .init = SERVER_DEFAULT_SESSION_MAX_NS,
     .zero = "0: no limit",
     .help = "dynamic namespaces one connection may have created that still exist (more are "
             "refused with KVS_ELIMIT)"},
    {"session_max_pinned", "session-max-pinned", SETTING_GLOBAL, SETTING_U32, "N", 0, UINT32_MAX,
     AT(server.session_max_pinned), .init = SERVER_DEFAULT_SESSION_MAX_PINNED,
     .zero = "0: no limit",
     .help = "pins one connection may hold at once (a block pinned twice counts twice); the "
             "default, 2^24, is beyond any honest worker (1,024 requests each pinning a "
             "256k-token prompt) and bounds what one session's close lets go of"},
    {"default_max_priority", "default-max-priority", SETTING_GLOBAL, SETTING_U32, "N", 0,
     RADIX_PRIO_MAX, AT(server.default_max_priority), .init = SERVER_DEFAULT_MAX_PRIORITY,
     .help = "the highest retention priority a hint may give in a namespace whose section sets "
             "no max_priority (higher hints count as this): at the default priority of blocks "
             "without a hint, one tenant's hints cannot keep its blocks over another's"},
    {"max_timed_hints", "max-timed-hints", SETTING_GLOBAL, SETTING_U32, "N", 0, UINT32_MAX,
     AT(server.max_timed_hints), .zero = "0: one per block",
     .help = "blocks that may hold a live timed retention hint at once; a timed hint for one "
             "more is ignored and counted (hints_refused)"},
    {"session_max_writing", "session-max-writing", SETTING_GLOBAL, SETTING_U32, "N", 0, UINT32_MAX,
     AT(server.session_max_writing), .zero = "0: no limit",
     .help = "blocks one connection may be writing (allocated, not committed)"},
    {"max_sessions", "max-sessions", SETTING_GLOBAL, SETTING_U32, "N", 1, 1000000,
     AT(server.max_sessions), .init = SERVER_DEFAULT_MAX_SESSIONS,
     .help = "connections; more are refused with KVS_ELIMIT"},
    {"max_frame", "max-frame", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 64, UINT32_MAX,
     AT(server.max_frame), .init = SERVER_DEFAULT_MAX_FRAME, .help = "largest request accepted"},
    {"max_prompt_blocks", "max-prompt-blocks", SETTING_GLOBAL, SETTING_U32, "N", 1, UINT32_MAX,
     AT(server.max_prompt_blocks), .init = SERVER_DEFAULT_MAX_PROMPT_BLOCKS,
     .help = "full blocks one Lookup, Alloc, Commit or Evict may name (a Lookup's or an "
             "Evict's work is one piece on the loop, linear in them; a Commit's and an Alloc's "
             "go in pieces of 16,384 blocks); a longer prompt is refused with KVS_ELIMIT"},
    {"max_output", "max-output", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 4096, UINT64_MAX,
     AT(server.max_output), .init = SERVER_DEFAULT_MAX_OUTPUT,
     .help = "unread reply bytes before a client that stopped reading is dropped"},
    {"max_buffer_memory", "max-buffer-memory", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 1u << 20,
     UINT64_MAX, AT(server.max_buffer_memory), .init = SERVER_DEFAULT_MAX_BUFFERS,
     .help = "all connections' buffers together (partial requests, unsent replies); past it "
             "the connection holding the most is closed"},
    {"idle_timeout_ms", "idle-timeout-ms", SETTING_GLOBAL, SETTING_U32, "N", 0, UINT32_MAX,
     AT(server.idle_timeout_ms), .zero = "0: never",
     .help = "close a connection that sent no request for this long (it releases what it "
             "holds; libkvshare reconnects by itself)"},

    /* Operations. */
    {"metrics_listen", "metrics-listen", SETTING_GLOBAL, SETTING_TEXT, "HOST:PORT", 1, 255,
     .parse = parse_addr, AT(server.metrics_listen), .zero = "off",
     .expect = "HOST:PORT with a numeric address, e.g. 127.0.0.1:9464 or [::1]:9464",
     .example = "127.0.0.1:9464", .help = "serve Prometheus metrics on http://HOST:PORT/metrics"},
    {"drain_timeout_ms", "drain-timeout-ms", SETTING_GLOBAL, SETTING_U32, "N", 0, 600000,
     AT(server.drain_ms), .init = SERVER_DEFAULT_DRAIN_MS,
     .help = "SIGTERM: the daemon exits within this many milliseconds"},
    /* The cluster tier (docs/CLUSTER.md). */
    {"cluster_seeds", "cluster-seeds", SETTING_GLOBAL, SETTING_TEXT, "HOST:PORT,...", 1, 255,
     AT(server.cluster_seeds), .zero = "off", .expect = "HOST:PORT nodes of a Redis Cluster",
     .example = "10.0.0.5:6379,10.0.0.6:6379",
     .help = "seed nodes of the Redis Cluster that holds the cluster tier: blocks of namespaces "
             "marked shared are written through to it"},
    {"cluster_auth_file", "cluster-auth-file", SETTING_GLOBAL, SETTING_TEXT, "PATH", 1, 255,
     AT(server.cluster_auth_file), .zero = "no AUTH", .expect = "a path",
     .example = "/etc/kvshare/redis-auth",
     .help = "file with the cluster's password (one line) or ACL user and password (two lines); "
             "never logged; a regular file of at most 1023 bytes, kvshared's user's or root's, "
             "that no one else can read nor its group write"},
    {"cluster_timeout_ms", "cluster-timeout-ms", SETTING_GLOBAL, SETTING_U32, "N", 1, 60000,
     AT(server.cluster_timeout_ms), .init = 1000,
     .help = "a cluster command not answered within this many milliseconds is a miss"},
    {"cluster_key_prefix", "cluster-key-prefix", SETTING_GLOBAL, SETTING_TEXT, "TEXT", 1, 64,
     AT(server.cluster_key_prefix), .init_text = "kvs:", .expect = "a key prefix",
     .example = "team-a:kvs:",
     .help = "every key of the cluster tier starts with this (one cluster may hold other data; "
             "bytes other than letters, digits and ._/-: are written %XX)"},
    {"cluster_clear_timeout_ms", "cluster-clear-timeout-ms", SETTING_GLOBAL, SETTING_U32, "N", 100,
     3600000, AT(server.cluster_clear_timeout_ms), .init = 60000,
     .help = "a Clear of a namespace with cluster_clear deletes its keys in the cluster within "
             "this many milliseconds; what is left then is logged and counted"},
    {"log_level", "log-level", SETTING_GLOBAL, SETTING_CHOICE, "LEVEL", 0, 0, CHOICE(log_level),
     AT(log_level), .help = "error, warn, info or debug"},

    /* KV events for cluster routers (docs/ROUTING.md). */
    {"kv_events", "kv-events", SETTING_GLOBAL, SETTING_TEXT, "ENDPOINT", 1, 255,
     .parse = parse_endpoint, AT(server.events.endpoint), .zero = "off",
     .expect = "tcp://HOST:PORT or ipc://PATH", .example = "tcp://*:5557",
     .help = "publish vLLM-format KV events on this ZeroMQ endpoint: binds on tcp://*:PORT or "
             "ipc://, connects to tcp://HOST:PORT (a central indexer)"},
    {"kv_events_replay", "kv-events-replay", SETTING_GLOBAL, SETTING_TEXT, "ENDPOINT", 1, 255,
     .parse = parse_endpoint, AT(server.events.replay_endpoint), .zero = "off",
     .expect = "tcp://HOST:PORT or ipc://PATH", .example = "tcp://*:5558",
     .help = "bind a replay socket here: subscribers that missed batches ask for them by seq"},
    {"kv_events_topic", "kv-events-topic", SETTING_GLOBAL, SETTING_TEXT, "TEMPLATE", 1,
     EVENTS_TOPIC_MAX, .parse = parse_topic, AT(server.events.topic),
     .expect = "a topic with {pod} and {model} (no other {...})", .example = "kv@{pod}@{model}",
     .deflt = EVENTS_DEFAULT_TOPIC,
     .help = "topic of each message; llm-d reads pod and model from it"},
    {"kv_events_pod", "kv-events-pod", SETTING_GLOBAL, SETTING_TEXT, "NAME", 1, 127,
     AT(server.events.pod), .expect = "a name", .example = "node-7", .deflt = "the host name",
     .help = "{pod} of the topic: the identity routers credit this node's blocks to"},
    {"kv_events_identities", "kv-events-identities", SETTING_GLOBAL, SETTING_TEXT, "NAME,...", 1,
     255, AT(server.events.identities), .zero = "kv_events_pod alone",
     .expect = "distinct names, comma-separated, without '@', '{' or '}'",
     .example = "worker-0,worker-1",
     .help = "publish one stream per identity (every worker on the node can use every block): "
             "each batch goes out on each identity's topic ({pod} = the identity), with that "
             "topic's own seq; replaces kv_events_pod"},
    {"kv_events_model", "kv-events-model", SETTING_GLOBAL, SETTING_TEXT, "NAME", 1, EVENTS_NAME_MAX,
     AT(server.events.default_model), .zero = "none", .expect = "a model name",
     .example = "meta-llama/Llama-3.1-8B-Instruct",
     .help = "model name of the namespace \"default\" (others: model_name of their section); a "
             "namespace without one publishes nothing"},
    {"kv_events_buffer", "kv-events-buffer", SETTING_GLOBAL, SETTING_U32, "N", 1, 10000000,
     AT(server.events.buffer), .init = EVENTS_DEFAULT_BUFFER,
     .help = "batches the replay socket can serve"},
    {"kv_events_replay_bytes", "kv-events-replay-bytes", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 4096,
     UINT64_MAX, AT(server.events.replay_bytes), .init = EVENTS_DEFAULT_REPLAY,
     .help = "the replay ring's memory: the oldest batches go beyond it"},
    {"kv_events_hwm", "kv-events-hwm", SETTING_GLOBAL, SETTING_U32, "N", 1, INT32_MAX,
     AT(server.events.hwm), .init = EVENTS_DEFAULT_HWM,
     .help = "messages queued per subscriber (fewer when kv_events_subscriber_bytes says so); a "
             "slower one misses the next (a gap in seq)"},
    {"kv_events_subscriber_bytes", "kv-events-subscriber-bytes", SETTING_GLOBAL, SETTING_SIZE,
     "SIZE", 1u << 20, 1ull << 40, AT(server.events.subscriber_bytes),
     .init = EVENTS_DEFAULT_SUBSCRIBER,
     .help = "what one subscriber's queue may hold: its high-water mark is this over the largest "
             "message (about 50 KiB with 16-token blocks), at most kv_events_hwm"},
    {"kv_events_send_bytes", "kv-events-send-bytes", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 1u << 20,
     1ull << 40, AT(server.events.send_bytes), .init = EVENTS_DEFAULT_SEND,
     .help = "what the messages queued for every subscriber and replay peer may hold together "
             "(beyond the replay ring); past it batches go to the replay ring alone, counted"},
    {"kv_events_queue", "kv-events-queue", SETTING_GLOBAL, SETTING_SIZE, "SIZE", 4096, 1ull << 32,
     AT(server.events.queue_bytes), .init = EVENTS_DEFAULT_QUEUE,
     .help = "hand-off queue to the publisher thread; events that do not fit are dropped and "
             "counted"},
    {"kv_events_encoding", "kv-events-encoding", SETTING_GLOBAL, SETTING_CHOICE, "FORM", 0, 0,
     CHOICE(encoding), AT(server.events.encoding),
     .help = "map (each event a msgpack map, vLLM since 2026) or array (positional, earlier vLLM)"},
    {"kv_events_replay_framing", "kv-events-replay-framing", SETTING_GLOBAL, SETTING_CHOICE, "FORM",
     0, 0, CHOICE(framing), AT(server.events.replay_framing),
     .help = "replay replies as [seq, payload] (plain: Dynamo) or [topic, seq, payload] (topic: "
             "newer vLLM)"},

    /* Flags only. */
    {NULL, "namespace", SETTING_GLOBAL, SETTING_NAMESPACE, "NAME[:QUOTA[:RESERVE]]", 0,
     UINT32_MAX - 1, .example = "chat:4096:1024",
     .help = "declare a namespace with a quota (max cached blocks) and a reservation (blocks "
             "guaranteed to it: others' allocations never evict it below them, and below "
             "them its own take blocks back from namespaces above theirs first); repeatable; "
             "overrides the file's section of the same name, also across reloads"},
    {NULL, "config", SETTING_GLOBAL, SETTING_TEXT, "FILE", 1, PATH_MAX - 1, AT(config_path),
     .expect = "a file name", .help = "read settings from FILE first (flags override it)"},
    {NULL, "check-config", SETTING_GLOBAL, SETTING_TEXT, "FILE", 1, PATH_MAX - 1, AT(check_path),
     .expect = "a file name",
     .help = "check FILE and the other flags, print every error with its line, exit 1 (0 when "
             "valid)"},
    {NULL, "ready-fd", SETTING_GLOBAL, SETTING_U32, "N", 0, INT_MAX, AT(server.ready_fd),
     .init = (uint32_t)-1, /* none */
     .help = "write READY and a newline to fd N once listening, then close it"},
    {NULL, "version", SETTING_GLOBAL, SETTING_SWITCH, NULL, 0, 0, AT(version),
     .help = "print the version and exit"},
    {NULL, "help", SETTING_GLOBAL, SETTING_SWITCH, NULL, 0, 0, AT(help),
     .help = "print this help and exit"},

    /* The keys of a [namespace NAME] section. */
    {"quota", NULL, SETTING_NS, SETTING_U32, "N", 0, UINT32_MAX - 1, NS_AT(quota),
     .zero = "0: none", .reload = true, .help = "at most this many cached blocks"},
    {"reserve", NULL, SETTING_NS, SETTING_U32, "N", 0, UINT32_MAX - 1, NS_AT(reserve),
     .reload = true,
     .help = "blocks guaranteed to the namespace: other namespaces' allocations never evict "
             "it below them, and below them its own take blocks back from namespaces above "
             "their reservations before evicting its own"},
    {"priority", NULL, SETTING_NS, SETTING_U32, "N", 0, RADIX_PRIO_MAX, NS_AT(priority),
     .reload = true,
     .help = "retention priority of the namespace's blocks that no live hint names (0-100: "
             "the lowest priority is evicted first, least recently used within one)"},
    {"max_priority", NULL, SETTING_NS, SETTING_U32, "N", 0, RADIX_PRIO_MAX, NS_AT(max_priority),
     .reload = true, .deflt = "default_max_priority",
     .help = "the highest retention priority a hint may give the namespace's blocks (higher "
             "hints count as this); above default_max_priority it is this namespace's "
             "allowance to keep its blocks over others'; priority is never a pin: quotas and "
             "reservations hold"},
    {"allow_uids", NULL, SETTING_NS, SETTING_UIDS, "LIST", 0, 0, NS_AT(acl), .zero = "anyone",
     .reload = true, .help = "only these users may use the namespace"},
    {"allow_gids", NULL, SETTING_NS, SETTING_GIDS, "LIST", 0, 0, NS_AT(acl), .zero = "anyone",
     .reload = true, .help = "only peers with these primary groups may use the namespace"},
    {"hit_rate_target", NULL, SETTING_NS, SETTING_FRACTION, "F", 0, 0, NS_AT(hit_rate_target),
     .zero = "none", .reload = true,
     .help = "the share of prompt tokens it is designed to hit: exported as "
             "kvshare_namespace_hit_rate_target, the alert KvshareHitRateBelowTarget compares "
             "with it"},
    {"tier", NULL, SETTING_NS, SETTING_NAME, "NAME", 0, 0, NS_AT(tier), .zero = "none",
     .reload = true, .example = "interactive",
     .help = "its service tier: exported as kvshare_namespace_tier, for hit rates by tier"},
    {"model_name", NULL, SETTING_NS, SETTING_TEXT, "NAME", 1, EVENTS_NAME_MAX, NS_AT(model_name),
     .zero = "none: publishes no KV events", .expect = "a model name",
     .example = "meta-llama/Llama-3.1-8B-Instruct",
     .help = "KV events: the model routers key this namespace's blocks on ({model} of the "
             "topic); also the model of its identity: a worker declaring another is refused"},
    {"model_revision", NULL, SETTING_NS, SETTING_TEXT, "REV", 1, IDENTITY_REVISION_MAX,
     .parse = parse_revision, NS_AT(model_revision), .zero = "none",
     .expect = "a revision without spaces", .example = "main",
     .help = "the revision of model_name (a tag or commit), part of the namespace's identity"},
    {"shared", NULL, SETTING_NS, SETTING_BOOL, "yes/no", 0, 0, NS_AT(shared), .zero = "no",
     .help = "its blocks are written through to the cluster tier (cluster_seeds) at commit"},
    {"cluster_clear", NULL, SETTING_NS, SETTING_BOOL, "yes/no", 0, 0, NS_AT(cluster_clear),
     .zero = "no",
     .help = "a Clear of this shared namespace also deletes its keys (of its model identity) in "
             "the cluster tier, for every node, within cluster_clear_timeout_ms"},
    {"lora_name", NULL, SETTING_NS, SETTING_TEXT, "NAME", 1, EVENTS_NAME_MAX, NS_AT(lora_name),
     .zero = "none", .expect = "a LoRA adapter name", .example = "sql-adapter",
     .help = "KV events: the LoRA name each BlockStored carries (llm-d keys on it instead of the "
             "model)"},
};

const size_t settings_count = sizeof(settings_table) / sizeof(settings_table[0]);

/* settings_t.given and config_load's duplicate check are settings_mask_t. */
_Static_assert(sizeof(settings_table) / sizeof(settings_table[0]) <= SETTINGS_MAX_ROWS,
               "more settings than SETTINGS_MAX_ROWS");

static const setting_t *row_of_flag(const char *flag)
{
    for (size_t i = 0; i < settings_count; i++)
        if (settings_table[i].flag && strcmp(settings_table[i].flag, flag) == 0)
            return &settings_table[i];
    return NULL;
}

const setting_t *settings_find_key(setting_scope_t scope, const char *key)
{
    for (size_t i = 0; i < settings_count; i++)
        if (settings_table[i].scope == scope && settings_table[i].key &&
            strcmp(settings_table[i].key, key) == 0)
            return &settings_table[i];
    return NULL;
}

static size_t bit_of(const setting_t *row)
{
    return (size_t)(row - settings_table);
}

/* Writes row's initial value (setting_t.init, .init_text) at its place in
 * base. */
static void init_value(const setting_t *row, void *base)
{
    uint8_t *at = (uint8_t *)base + row->offset;
    if (row->init_text) {
        const char *text = row->init_text;
        memcpy(at, &text, sizeof(text));
        return;
    }
    switch (row->width) {
    case 1: {
        uint8_t v = (uint8_t)row->init;
        memcpy(at, &v, 1);
        return;
    }
    case 4: {
        uint32_t v = (uint32_t)row->init;
        memcpy(at, &v, 4);
        return;
    }
    case 8: {
        uint64_t v = row->init;
        memcpy(at, &v, 8);
        return;
    }
    }
}

void settings_init(settings_t *st)
{
    memset(st, 0, sizeof(*st));
    /* Each setting's default is in its row of the table, and only there. */
    for (size_t i = 0; i < settings_count; i++)
        if (settings_table[i].scope == SETTING_GLOBAL &&
            (settings_table[i].init || settings_table[i].init_text))
            init_value(&settings_table[i], st);
    /* Not settings: how kvshared was started and what tests tune. */
    st->server.backend_retry_ms = SERVER_DEFAULT_BACKEND_RETRY_MS;
    st->model = DEFAULT_MODEL;
    st->log_level = LOG_LEVEL_INFO;
}

void server_config_init(server_config_t *cfg)
{
    settings_t st;
    settings_init(&st);
    *cfg = st.server;
}

void settings_free(settings_t *st)
{
    config_free(st->conf);
    st->conf = NULL;
}

/* --- the validator --- */

/* "auto, host or cuda" into buf. */
static void list_names(const setting_t *row, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; row->name(i) && used < len; i++) {
        const char *sep = i == 0 ? "" : row->name(i + 1) ? ", " : " or ";
        used += (size_t)snprintf(buf + used, len - used, "%s%s", sep, row->name(i));
    }
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (s[0] < '0' || s[0] > '9')
        return KVS_EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return KVS_EINVAL;
    *out = v;
    return 0;
}

/* Stores an unsigned number into a field of 4 or 8 bytes (the table's
 * bounds keep it in range of the field). */
static void store_uint(void *field, size_t width, uint64_t v)
{
    if (width == sizeof(uint32_t)) {
        uint32_t v32 = (uint32_t)v;
        memcpy(field, &v32, sizeof(v32));
    } else {
        memcpy(field, &v, sizeof(v));
    }
}

static uint64_t load_uint(const void *field, size_t width)
{
    if (width == sizeof(uint32_t)) {
        uint32_t v32;
        memcpy(&v32, field, sizeof(v32));
        return v32;
    }
    uint64_t v;
    memcpy(&v, field, sizeof(v));
    return v;
}

/* NAME[:QUOTA[:RESERVE]]: the name rule, the bounds of a section's quota. */
static int set_namespace(const setting_t *row, settings_t *st, const char *value, char *why,
                         size_t whylen)
{
    char buf[3 * 32 + RADIX_NS_NAME_MAX];
    settings_ns_t ns = {.quota = 0};
    const char *fields[3] = {buf, NULL, NULL};
    if (strlen(value) >= sizeof(buf))
        goto bad;
    memcpy(buf, value, strlen(value) + 1);
    for (int i = 1; i < 3; i++) {
        char *colon = strchr(fields[i - 1], ':');
        if (!colon)
            break;
        *colon = '\0';
        fields[i] = colon + 1;
    }
    if (strchr(fields[2] ? fields[2] : "", ':') || !nsname_valid(buf))
        goto bad;
    memcpy(ns.name, buf, strlen(buf) + 1);
    uint32_t *limits[2] = {&ns.quota, &ns.reserve};
    for (int i = 0; i < 2; i++) {
        uint64_t v;
        if (!fields[i + 1] || !fields[i + 1][0])
            continue;
        if (parse_u64(fields[i + 1], &v) != 0 || v > row->max)
            goto bad;
        *limits[i] = (uint32_t)v;
    }
    if (st->n_ns == SETTINGS_MAX_NS_FLAGS) {
        snprintf(why, whylen, "more than %d namespaces by flag: declare them in the config file",
                 SETTINGS_MAX_NS_FLAGS);
        return KVS_EINVAL;
    }
    st->ns[st->n_ns++] = ns;
    return 0;
bad:
    snprintf(why, whylen, "give NAME[:QUOTA[:RESERVE]]: a name of %s, then blocks from 0 to %llu",
             nsname_rule(), (unsigned long long)row->max);
    return KVS_EINVAL;
}

int settings_set(const setting_t *row, void *base, const char *value, char *why, size_t whylen)
{
    char names[512];
    uint64_t n;
    int choice;

    if (!row || !base || !value)
        return KVS_EINVAL;
    char *field = (char *)base + row->offset;
    switch (row->type) {
    case SETTING_TEXT: {
        size_t len = strlen(value);
        if (len < row->min || len > row->max || (row->parse && row->parse(value, &choice) != 0)) {
            if (row->name) {
                list_names(row, names, sizeof(names));
                snprintf(why, whylen, "give %s: %s", row->expect, names);
            } else {
                snprintf(why, whylen, "give %s of %llu to %llu bytes", row->expect,
                         (unsigned long long)row->min, (unsigned long long)row->max);
            }
            return KVS_EINVAL;
        }
        memcpy(field, &value, sizeof(value));
        break;
    }
    case SETTING_U32:
        if (parse_u64(value, &n) != 0 || n < row->min || n > row->max) {
            snprintf(why, whylen, "give a whole number from %llu to %llu",
                     (unsigned long long)row->min, (unsigned long long)row->max);
            return KVS_EINVAL;
        }
        store_uint(field, row->width, n);
        break;
    case SETTING_SIZE:
        if (units_parse_bytes(value, &n) != 0 || n < row->min || n > row->max) {
            if (row->max == UINT64_MAX)
                snprintf(why, whylen,
                         "give a size such as 512MiB, 8GiB or 70GB (at least %llu bytes)",
                         (unsigned long long)row->min);
            else
                snprintf(why, whylen,
                         "give a size such as 512MiB, 8GiB or 70GB (%llu to %llu bytes)",
                         (unsigned long long)row->min, (unsigned long long)row->max);
            return KVS_EINVAL;
        }
        store_uint(field, row->width, n);
        break;
    case SETTING_FRACTION: {
        char *end;
        double d = strtod(value, &end);
        if (end == value || *end || !(d > 0 && d <= 1)) {
            snprintf(why, whylen, "give a fraction in (0, 1], e.g. 0.9");
            return KVS_EINVAL;
        }
        memcpy(field, &d, sizeof(d));
        break;
    }
    case SETTING_BOOL: {
        bool b;
        if (config_parse_bool(value, &b) != 0) {
            snprintf(why, whylen, "give yes or no");
            return KVS_EINVAL;
        }
        memcpy(field, &b, sizeof(b));
        break;
    }
    case SETTING_CHOICE:
        if (row->parse(value, &choice) != 0) {
            list_names(row, names, sizeof(names));
            snprintf(why, whylen, "give %s", names);
            return KVS_EINVAL;
        }
        memcpy(field, &choice, sizeof(choice));
        break;
    case SETTING_UIDS:
    case SETTING_GIDS: {
        bool groups = row->type == SETTING_GIDS;
        config_acl_t *acl = (config_acl_t *)(void *)field;
        uint32_t ids[CONFIG_MAX_IDS], count;
        if (config_parse_ids(value, groups, ids, &count) != 0) {
            snprintf(why, whylen,
                     "give up to %d %s, by number or name, separated by commas (a name must "
                     "exist on this host)",
                     CONFIG_MAX_IDS, groups ? "group ids" : "user ids");
            return KVS_EINVAL;
        }
        memcpy(groups ? acl->gids : acl->uids, ids, sizeof(ids[0]) * count);
        *(groups ? &acl->n_gids : &acl->n_uids) = count;
        break;
    }
    case SETTING_GROUP: {
        uint32_t ids[CONFIG_MAX_IDS], count;
        if (config_parse_ids(value, true, ids, &count) != 0 || count != 1) {
            snprintf(why, whylen, "give one group, by name or number");
            return KVS_EINVAL;
        }
        memcpy(field, &ids[0], sizeof(ids[0]));
        break;
    }
    case SETTING_NAMESPACE:
        if (set_namespace(row, base, value, why, whylen) != 0)
            return KVS_EINVAL;
        break;
    case SETTING_NAME:
        if (!nsname_valid(value) || strlen(value) >= row->width) {
            snprintf(why, whylen, "%s", nsname_rule());
            return KVS_EINVAL;
        }
        memcpy(field, value, strlen(value) + 1);
        break;
    case SETTING_SWITCH: {
        bool on = true;
        memcpy(field, &on, sizeof(on));
        break;
    }
    }
    if (row->scope == SETTING_GLOBAL)
        settings_mask_set(&((settings_t *)base)->given, bit_of(row));
    return 0;
}

/* --- after the last value --- */

static bool given(const settings_t *st, const char *flag)
{
    return settings_mask_has(&st->given, bit_of(row_of_flag(flag)));
}

int settings_finish(settings_t *st, char *err, size_t errlen)
{
    geometry_t g;
    /* The model was checked by its row: it is a preset. */
    if (geometry_preset(st->model, &g) != 0) {
        snprintf(err, errlen, "unknown model '%s'", st->model);
        return KVS_EINVAL;
    }
    if (given(st, "layers"))
        g.layers = st->geometry.layers;
    if (given(st, "kv-heads"))
        g.kv_heads = st->geometry.kv_heads;
    if (given(st, "head-dim"))
        g.head_dim = st->geometry.head_dim;
    if (given(st, "dtype"))
        g.dtype = st->geometry.dtype;
    if (given(st, "block-tokens"))
        g.block_tokens = st->geometry.block_tokens;
    st->geometry = g;
    st->server.geometry = g;
    /* A model given by name is the daemon's model identity; the default
     * preset only sizes blocks and names no model. */
    st->server.model = given(st, "model") ? st->model : NULL;

    if (given(st, "pool-bytes") && given(st, "pool-blocks")) {
        snprintf(err, errlen,
                 "give pool_bytes (--pool-bytes) or pool_blocks (--pool-blocks), "
                 "not both");
        return KVS_EINVAL;
    }
    if (st->gpu_memory_utilization > 0) {
        st->server.backend.mem_fraction = st->gpu_memory_utilization;
    } else if (!st->server.pool_blocks) {
        if (!st->pool_bytes)
            st->pool_bytes = DEFAULT_POOL_BYTES;
        st->server.backend.bytes = st->pool_bytes;
    }
    st->server.has_socket_gid = given(st, "socket-group");
    st->server.config_path = st->config_path;
    if (!st->server.socket_path) {
        if (socket_path_default(st->default_socket, sizeof(st->default_socket)) != 0) {
            snprintf(err, errlen, "cannot build the default socket path; give --socket");
            return KVS_EINVAL;
        }
        st->server.socket_path = st->default_socket;
    }
    return 0;
}

/* The pool's blocks as server_open will count them, when the settings
 * alone decide it (pool_blocks, or pool_bytes over the block size); false
 * with a fraction of the device's memory, known only at start. A CUDA pool
 * of pool_bytes is rounded up to the allocation granularity and may hold a
 * few blocks more: this is the lower figure. */
static bool pool_blocks_known(const settings_t *st, uint64_t block_bytes, uint64_t *blocks)
{
    const server_config_t *cfg = &st->server;
    if (cfg->pool_blocks > 0)
        *blocks = cfg->pool_blocks;
    else if (cfg->backend.bytes > 0)
        *blocks = cfg->backend.bytes / block_bytes;
    else
        return false;
    return true;
}

/* What start refuses that the settings alone decide: the geometry, the
 * pool's and the host tier's sizes, the namespaces' quotas and reservations
 * against the pool, their number against max_namespaces, and the KV events
 * identities. --check-config runs it, so that a file it passes does not
 * fail at start for one of these. Returns 0 or KVS_EINVAL (message in
 * err); *note says what could not be checked ("" when everything was). */
static int check_as_start(const settings_t *st, char *note, size_t notelen, char *err,
                          size_t errlen)
{
    const server_config_t *cfg = &st->server;
    uint64_t blocks = 0;
    note[0] = '\0';
    if (geometry_validate(&cfg->geometry) != 0) {
        snprintf(err, errlen,
                 "invalid model geometry: give --model or every one of --layers, --kv-heads, "
                 "--head-dim, --dtype, --block-tokens");
        return KVS_EINVAL;
    }
    /* Start's own list (preflight.h), for the user that runs the check:
     * the unit's ExecStartPre runs it as the daemon's user. Root cannot
     * tell which user the daemon will be: owners wait for start then. */
    uid_t uid = geteuid() == 0 ? DISK_ANY_UID : geteuid();
    if (preflight_run(cfg, uid, err, errlen) != 0)
        return KVS_EINVAL;
    uint64_t block_bytes = geometry_block_bytes(&cfg->geometry);
    if (pool_blocks_known(st, block_bytes, &blocks)) {
        if (blocks == 0 || blocks >= UINT32_MAX) {
            snprintf(err, errlen,
                     "a pool of %llu bytes holds %llu blocks of %llu bytes: give a pool between "
                     "one block and 2^32 - 1 blocks",
                     (unsigned long long)cfg->backend.bytes, (unsigned long long)blocks,
                     (unsigned long long)block_bytes);
            return KVS_EINVAL;
        }
        if (config_check_pool(st->conf, (uint32_t)blocks, err, errlen) != 0)
            return KVS_EINVAL;
        for (uint32_t i = 0; i < st->n_ns; i++) {
            const settings_ns_t *ns = &st->ns[i];
            if ((ns->quota && ns->reserve > ns->quota) || ns->reserve > blocks) {
                snprintf(err, errlen,
                         "--namespace: namespace '%s': a reservation of %u blocks must not "
                         "exceed its quota (%u) nor the pool (%llu blocks)",
                         ns->name, ns->reserve, ns->quota, (unsigned long long)blocks);
                return KVS_EINVAL;
            }
        }
    } else {
        snprintf(note, notelen,
                 "; the pool is a fraction of the device's memory, known at start: quotas and "
                 "reservations are checked against it then");
    }
    if (uid == DISK_ANY_UID && (cfg->disk_tier_path || cfg->cluster_auth_file)) {
        size_t at = strlen(note);
        snprintf(note + at, notelen - at,
                 "; run as root, the owners of disk_tier_path and cluster_auth_file are "
                 "checked at start, against the daemon's user");
    }
    if (cfg->host_tier_bytes > 0) {
        uint64_t t2 = cfg->host_tier_bytes / block_bytes;
        if (t2 == 0 || t2 > UINT32_MAX - blocks) {
            snprintf(err, errlen,
                     "a host tier of %llu bytes holds %llu blocks of %llu bytes: give one "
                     "between one block and 2^32 - 1 blocks with the pool",
                     (unsigned long long)cfg->host_tier_bytes, (unsigned long long)t2,
                     (unsigned long long)block_bytes);
            return KVS_EINVAL;
        }
    }
    /* The file's sections (tenants_apply's rule; start lets --namespace
     * flags create theirs past it). */
    uint32_t n_ns = st->conf ? st->conf->n_ns : 0;
    if (n_ns > cfg->max_namespaces) {
        snprintf(err, errlen, "%u namespaces would exceed max_namespaces (%u)", n_ns,
                 cfg->max_namespaces);
        return KVS_EINVAL;
    }
    if (cfg->events.endpoint && cfg->events.identities &&
        events_check_identities(cfg->events.identities) != 0) {
        snprintf(err, errlen,
                 "kv_events_identities: give NAME,NAME,... (at most %d distinct names of 1 to "
                 "%d bytes without '@', '{' or '}')",
                 EVENTS_IDENT_MAX, EVENTS_NAME_MAX);
        return KVS_EINVAL;
    }
    return 0;
}

/* --- the command line --- */

/* One flag as given: its row and its value (NULL for a switch). */
typedef struct flag_arg {
    const setting_t *row;
    const char *value;
} flag_arg_t;

/* The getopt_long list, one entry per row with a flag; val = row index. */
static struct option *options_new(void)
{
    struct option *opts = calloc(settings_count + 1, sizeof(*opts));
    size_t n = 0;
    for (size_t i = 0; opts && i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        if (!row->flag)
            continue;
        opts[n++] = (struct option){row->flag,
                                    row->type == SETTING_SWITCH ? no_argument : required_argument,
                                    NULL, (int)(256 + i)};
    }
    return opts;
}

/* Applies the flags in order; prints each error. Returns the error count. */
static int apply_flags(settings_t *st, const flag_arg_t *flags, int n)
{
    int errors = 0;
    for (int i = 0; i < n; i++) {
        char why[512];
        if (flags[i].row->type == SETTING_SWITCH)
            continue; /* acted on already */
        if (settings_set(flags[i].row, st, flags[i].value, why, sizeof(why)) != 0) {
            fprintf(stderr, "kvshared: --%s '%s': %s\n", flags[i].row->flag, flags[i].value, why);
            errors++;
        }
    }
    return errors;
}

/* The file's settings, validated by config_load: they apply as they did
 * there. */
static int apply_file(settings_t *st)
{
    int errors = 0;
    for (uint32_t i = 0; st->conf && i < st->conf->n_entries; i++) {
        const config_entry_t *e = &st->conf->entries[i];
        char why[512];
        if (settings_set(e->setting, st, e->value, why, sizeof(why)) != 0) {
            fprintf(stderr, "kvshared: line %d: %s = '%s': %s\n", e->line, e->setting->key,
                    e->value, why);
            errors++;
        }
    }
    return errors;
}

bool settings_parse(settings_t *st, int argc, char **argv, int *status)
{
    flag_arg_t *flags = calloc((size_t)argc + 1, sizeof(*flags));
    struct option *opts = options_new();
    char err[8192];
    int n_flags = 0, opt, errors = 0;
    bool run = false;

    settings_init(st);
    *status = 2;
    if (!flags || !opts) {
        fprintf(stderr, "kvshared: out of memory\n");
        goto done;
    }
    /* The command line first, in order, without acting on it: getopt
     * resolves abbreviations the same way for every flag. */
    optind = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h')
            opt = 256 + (int)(row_of_flag("help") - settings_table);
        if (opt < 256 || opt >= 256 + (int)settings_count) {
            fprintf(stderr, "kvshared --help lists the flags\n");
            goto done;
        }
        flags[n_flags++] = (flag_arg_t){&settings_table[opt - 256], optarg};
    }
    if (optind < argc) {
        fprintf(stderr, "kvshared: unexpected argument '%s' (see --help)\n", argv[optind]);
        goto done;
    }
    for (int i = 0; i < n_flags; i++) {
        if (flags[i].row->type != SETTING_SWITCH)
            continue;
        *status = 0;
        if (strcmp(flags[i].row->flag, "help") == 0)
            settings_usage(stdout);
        else
            printf("kvshared %d.%d.%d\n", KVS_VERSION_MAJOR, KVS_VERSION_MINOR, KVS_VERSION_PATCH);
        goto done;
    }
    /* Where the file is, from the flags alone. */
    settings_t where;
    settings_init(&where);
    for (int i = 0; i < n_flags; i++) {
        /* A bad value stays unset here; apply_flags reports it. */
        if (flags[i].row->offset == offsetof(settings_t, config_path) ||
            flags[i].row->offset == offsetof(settings_t, check_path))
            (void)settings_set(flags[i].row, &where, flags[i].value, err, sizeof(err));
    }
    const char *path = where.check_path ? where.check_path : where.config_path;
    bool check = where.check_path != NULL;
    if (path) {
        int rc = config_load(path, &st->conf, err, sizeof(err));
        if (rc != 0) {
            if (check)
                fprintf(stderr, "%s\n", err[0] ? err : kvs_status_text(rc));
            else
                fprintf(stderr, "kvshared: config errors:\n%s\n",
                        err[0] ? err : kvs_status_text(rc));
            errors++;
        }
        /* With a config file, namespaces are the ones it declares. */
        st->server.dynamic_namespaces = false;
    }
    errors += apply_file(st);
    errors += apply_flags(st, flags, n_flags);
    if (check)
        st->config_path = NULL; /* checked, not used */
    if (errors == 0 && settings_finish(st, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvshared: %s\n", err);
        errors++;
    }
    if (check) {
        char note[512];
        if (errors == 0 && check_as_start(st, note, sizeof(note), err, sizeof(err)) != 0) {
            fprintf(stderr, "kvshared: %s: start would refuse this: %s\n", path, err);
            errors++;
        }
        *status = errors ? 1 : 0;
        if (!errors) {
            uint64_t reserved = 0;
            for (uint32_t i = 0; i < st->conf->n_ns; i++)
                reserved += st->conf->ns[i].reserve;
            printf("%s: OK (%u settings, %u namespaces reserving %llu blocks%s)\n", path,
                   st->conf->n_entries, st->conf->n_ns, (unsigned long long)reserved, note);
        }
        goto done;
    }
    run = errors == 0;
done:
    free(flags);
    free(opts);
    return run;
}

/* --- output: --help, the log line, the docs --- */

void settings_format(const setting_t *row, const void *base, char *buf, size_t len)
{
    const char *field = (const char *)base + row->offset;
    uint64_t n = 0;
    buf[0] = '\0';
    switch (row->type) {
    case SETTING_TEXT: {
        const char *text;
        memcpy(&text, field, sizeof(text));
        snprintf(buf, len, "%s", text ? text : row->zero ? row->zero : "none");
        return;
    }
    case SETTING_U32:
        n = load_uint(field, row->width);
        if (n == 0 && row->zero)
            snprintf(buf, len, "%s", row->zero);
        else
            snprintf(buf, len, "%llu", (unsigned long long)n);
        return;
    case SETTING_SIZE: {
        static const char *const units[] = {"", "KiB", "MiB", "GiB", "TiB"};
        int u = 0;
        n = load_uint(field, row->width);
        while (u < 4 && n >= 1024 && n % 1024 == 0) {
            n /= 1024;
            u++;
        }
        snprintf(buf, len, "%llu%s", (unsigned long long)n, units[u]);
        return;
    }
    case SETTING_FRACTION: {
        double d;
        memcpy(&d, field, sizeof(d));
        if (d == 0 && row->zero)
            snprintf(buf, len, "%s", row->zero);
        else
            snprintf(buf, len, "%g", d);
        return;
    }
    case SETTING_BOOL: {
        bool b;
        memcpy(&b, field, sizeof(b));
        snprintf(buf, len, "%s", b ? "yes" : "no");
        return;
    }
    case SETTING_CHOICE: {
        int v;
        memcpy(&v, field, sizeof(v));
        snprintf(buf, len, "%s", row->name(v) ? row->name(v) : "?");
        return;
    }
    case SETTING_UIDS:
    case SETTING_GIDS: {
        const config_acl_t *acl = (const config_acl_t *)(const void *)field;
        bool groups = row->type == SETTING_GIDS;
        uint32_t count = groups ? acl->n_gids : acl->n_uids;
        const uint32_t *ids = groups ? acl->gids : acl->uids;
        size_t used = 0;
        if (count == 0)
            snprintf(buf, len, "%s", row->zero);
        for (uint32_t i = 0; i < count && used < len; i++)
            used += (size_t)snprintf(buf + used, len - used, "%s%u", i ? "," : "", ids[i]);
        return;
    }
    case SETTING_GROUP: {
        const settings_t *st = base;
        uint32_t gid;
        memcpy(&gid, field, sizeof(gid));
        if (!settings_mask_has(&st->given, bit_of(row))) {
            snprintf(buf, len, "%s", row->zero);
        } else {
            struct group *g = getgrgid((gid_t)gid);
            if (g)
                snprintf(buf, len, "%s (%u)", g->gr_name, gid);
            else
                snprintf(buf, len, "%u", gid);
        }
        return;
    }
    case SETTING_NAME:
        snprintf(buf, len, "%s", field[0] ? field : row->zero ? row->zero : "none");
        return;
    case SETTING_NAMESPACE:
    case SETTING_SWITCH:
        return;
    }
}

/* The default as --help and the docs show it. Returns whether it is a value
 * to type (16MiB) rather than words (the preset's). */
static bool format_default(const setting_t *row, char *buf, size_t len)
{
    static settings_t defaults;
    static config_ns_t ns_defaults;
    static bool ready;
    if (!ready) {
        settings_init(&defaults);
        config_ns_init(&ns_defaults);
        ready = true;
    }
    if (row->deflt) {
        snprintf(buf, len, "%s", row->deflt);
        return false;
    }
    if (!row->key) {
        buf[0] = '\0'; /* a flag only: an action, not a value */
        return false;
    }
    settings_format(row, row->scope == SETTING_NS ? (void *)&ns_defaults : (void *)&defaults, buf,
                    len);
    return !row->zero || strcmp(buf, row->zero) != 0;
}

/* Writes `text` from column `indent`, wrapped before column 80. */
static void print_wrapped(FILE *f, int column, int indent, const char *text)
{
    const char *p = text;
    while (*p) {
        const char *end = p;
        const char *brk = NULL;
        while (*end && column + (end - p) < 80) {
            if (*end == ' ')
                brk = end;
            end++;
        }
        if (*end && brk)
            end = brk;
        fprintf(f, "%.*s\n", (int)(end - p), p);
        p = *end == ' ' ? end + 1 : end;
        if (*p)
            fprintf(f, "%*s", indent, "");
        column = indent;
    }
}

void settings_usage(FILE *f)
{
    fprintf(f, "usage: kvshared [options]\n"
               "\n"
               "Serves a pool of KV-cache blocks and a prefix index to decode workers.\n"
               "Every setting with a config key may also be given in the --config file\n"
               "(`pool_blocks = 64` is --pool-blocks 64); flags override the file. A flag\n"
               "may be abbreviated to any unambiguous prefix (--conf is --config).\n"
               "\n");
    for (size_t i = 0; i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        char left[96], text[1024], deflt[256], names[512] = "";
        if (!row->flag)
            continue;
        snprintf(left, sizeof(left), "  --%s%s%s", row->flag, row->arg ? " " : "",
                 row->arg ? row->arg : "");
        (void)format_default(row, deflt, sizeof(deflt));
        if (row->name && row->type == SETTING_TEXT)
            list_names(row, names, sizeof(names));
        snprintf(text, sizeof(text), "%s%s%s%s%s%s", row->help, names[0] ? "; one of: " : "", names,
                 deflt[0] ? " (default: " : "", deflt, deflt[0] ? ")" : "");
        if (strlen(left) >= 26)
            fprintf(f, "%s\n%26s", left, "");
        else
            fprintf(f, "%-26s", left);
        print_wrapped(f, 26, 26, text);
    }
}

void settings_log(const settings_t *st)
{
    char line[768], value[512];
    size_t used = 0;
    LOG_INFO("config: file %s", st->config_path ? st->config_path : "(none)");
    /* "config: key value, key value", in lines of at most ~600 bytes. */
    for (size_t i = 0; i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        if (row->scope != SETTING_GLOBAL || !row->key)
            continue;
        settings_format(row, st, value, sizeof(value));
        used += (size_t)snprintf(line + used, sizeof(line) - used, "%s%s %s", used ? ", " : "",
                                 row->key, value);
        if (used >= 600) {
            LOG_INFO("config: %s", line);
            used = 0;
        }
    }
    if (used)
        LOG_INFO("config: %s", line);
}

void settings_markdown(FILE *f)
{
    char deflt[256];
    fprintf(f, "| key | flag | default | what |\n|---|---|---|---|\n");
    for (size_t i = 0; i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        if (row->scope != SETTING_GLOBAL)
            continue;
        const char *tick = format_default(row, deflt, sizeof(deflt)) ? "`" : "";
        fprintf(f, "| %s%s%s | `--%s%s%s` | %s%s%s | %s%s |\n", row->key ? "`" : "",
                row->key ? row->key : "(flag only)", row->key ? "`" : "", row->flag,
                row->arg ? " " : "", row->arg ? row->arg : "", tick, deflt, tick, row->help,
                row->reload ? " (SIGHUP applies it)" : "");
    }
    fprintf(f, "\nKeys of a `[namespace NAME]` section:\n\n"
               "| key | default | applied | what |\n|---|---|---|---|\n");
    for (size_t i = 0; i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        if (row->scope != SETTING_NS)
            continue;
        const char *tick = format_default(row, deflt, sizeof(deflt)) ? "`" : "";
        fprintf(f, "| `%s` | %s%s%s | %s | %s |\n", row->key, tick, deflt, tick,
                row->reload ? "at start and on SIGHUP" : "at start", row->help);
    }
}

/* Writes text for roff: a backslash as \e, a hyphen as \- (so that flags
 * copy and paste as typed), and a line never starts with a control dot or
 * quote. */
static void roff_text(FILE *f, const char *text)
{
    if (*text == '.' || *text == '\'')
        fputs("\\&", f);
    for (const char *p = text; *p; p++) {
        if (*p == '\\')
            fputs("\\e", f);
        else if (*p == '-')
            fputs("\\-", f);
        else
            fputc(*p, f);
    }
}

void settings_man(FILE *f)
{
    char deflt[256], names[512];
    fputs(".SH OPTIONS\n"
          "Every option with a configuration key may also be given in the\n"
          ".B \\-\\-config\n"
          "file; options override the file.\n"
          "An option may be abbreviated to any unambiguous prefix.\n",
          f);
    for (int section = 0; section < 3; section++) {
        if (section == 1)
            fputs(".SH CONFIGURATION FILE\n"
                  "Lines of \\fIkey\\fR = \\fIvalue\\fR: the keys of the options above,\n"
                  "and these, which have no option:\n",
                  f);
        if (section == 2)
            fputs(".SS Keys of a [namespace NAME] section\n", f);
        for (size_t i = 0; i < settings_count; i++) {
            const setting_t *row = &settings_table[i];
            bool want = section == 0   ? row->flag != NULL
                        : section == 1 ? row->scope == SETTING_GLOBAL && !row->flag
                                       : row->scope == SETTING_NS;
            if (!want)
                continue;
            fputs(".TP\n", f);
            if (section == 0) {
                fputs(".BI \"\\-\\-", f);
                roff_text(f, row->flag);
                fputs(row->arg ? " \" " : "\"", f);
                if (row->arg)
                    roff_text(f, row->arg);
            } else {
                fputs(".B ", f);
                roff_text(f, row->key);
            }
            fputc('\n', f);
            roff_text(f, row->help);
            names[0] = '\0';
            if (row->name && row->type == SETTING_TEXT)
                list_names(row, names, sizeof(names));
            if (names[0]) {
                fputs("; one of: ", f);
                roff_text(f, names);
            }
            fputs(".\n", f);
            if (section == 0 && row->key) {
                fputs("Key: ", f);
                roff_text(f, row->key);
                fputs(".\n", f);
            }
            (void)format_default(row, deflt, sizeof(deflt));
            if (deflt[0]) {
                fputs("Default: ", f);
                roff_text(f, deflt);
                fputs(".\n", f);
            }
            if (row->reload)
                fputs("SIGHUP applies a change.\n", f);
        }
    }
}
