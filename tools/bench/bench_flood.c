/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench flood: one hostile client against everyone else.
 *
 * kvshared (host backend, --blocks blocks, 16-token blocks) is filled with
 * prompts of 16 blocks each until every block is cached, so whole-index work
 * is as expensive as the pool allows. Then, for each attack, a victim process
 * loops over Lookups of a cached 4k-token prompt for --seconds while an
 * attacker process pipelines the given request as fast as the daemon takes
 * it (and reads every reply, so it is never dropped for not reading):
 *
 *   none     no attacker: the baseline
 *   idle     an attacker connection that sends nothing
 *   spin     no attacker connection, but two processes burning CPU (as many
 *            as the attacker's writer and reader): what the victim's p99
 *            owes to CPU contention alone, on a machine with few CPUs
 *   raw      no daemon: the victim's request size (16 KiB) and a 64-byte
 *            reply over a Unix socket pair with an echo process, the
 *            floor of a round trip on this machine
 *   raw-spin the same while two processes burn CPU
 *   tree     Tree (1,000 rows, by size and by hits in turn)
 *   release  the largest Release the frame limit allows (ids of free blocks)
 *   lookup   a frame-limit-sized Lookup of a cached prompt followed by misses
 *   stats    Stats
 *   scrape   16 processes scraping GET /metrics over HTTP as fast as answered
 *   events   the baseline of the next two: a committer (4k-token prompts, one
 *            BlockStored of 256 blocks each) and a KV-events subscriber that
 *            reads everything
 *   subscriber  the committer and a subscriber that never reads
 *   replay   the committer, the reading subscriber, and a replay peer that
 *            sends 2,000 requests at once and never reads
 *   hints    Pin and Release of 4,096 cached blocks with a retention hint
 *            (priority 100, a duration growing by 1 ms each time) in a loop,
 *            one process: the hint queue and max_timed_hints bound what the
 *            daemon keeps (RELIABILITY H1)
 *
 * The large-request cases: the victim's Lookups are of 300,000 tokens (a
 * 1.2 MB frame, large work that is spaced: RELIABILITY A2, H4), its 4k
 * cached prompt then misses, against
 *
 *   large-none   no attacker: the baseline (the victim's own spacing)
 *   large-tree   Tree pipelined, as tree
 *   large-lookup frame-limit-sized Lookups pipelined, as lookup
 *   large-junk   frame-limit-sized frames of bytes that do not decode, one
 *                per connection (the daemon closes it), by 2 processes
 *
 * Printed per attack: the victim's Lookup count, p50, p99 and max latency,
 * the longest loop work between polls seen so far (loop_busy_max_us) and
 * the stalls over 50 ms (loop_stalls),
 * how many attack requests the daemon answered (scrapes, commits), and the
 * daemon's RSS before and after the run; for the KV-events attacks also the
 * events published and what the bounds refused. --attacker-nice N runs
 * the attacker's processes at that nice value: with few CPUs, what the
 * victim then gains is what it lost to the attacker's processes competing
 * for the CPUs, not to the daemon's work for them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "bench.h"
#include "frame_header.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "launch.h"
#include "raw_wire.h"

#define FLOOD_BT          16
#define FLOOD_PROMPT      4096 /* victim's prompt, tokens */
#define FLOOD_MAX_SAMPLES (1u << 22)
#define FLOOD_EVENTS_NS   "events" /* the KV-events committer's namespace */
#define FLOOD_LARGE       300000   /* the victim's tokens in the large-request cases */
#define FLOOD_HINT_BLOCKS 4096     /* blocks the hints attacker pins and releases */

typedef struct flood_cfg {
    const char *kvshared;
    const char *max_buffers; /* --max-buffer-memory for the daemon; NULL: its default */
    unsigned sessions;       /* memory attack: hostile sessions */
    int attacker_nice;       /* nice value of the attacker's processes (0: as ours) */
    char dir[64];
    char sock[96];
    char pub[112], replay[112]; /* KV events endpoints (ipc:// in dir) */
    int metrics_port;
    unsigned blocks;
    unsigned max_frame;
    double seconds;
    pid_t daemon;
} flood_cfg_t;

static void flood_prompt(uint32_t *t, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        t[i] = x % 128000;
    }
}

static int flood_start_daemon(flood_cfg_t *b)
{
    char nb[16], mf[16];
    snprintf(nb, sizeof(nb), "%u", b->blocks);
    snprintf(mf, sizeof(mf), "%u", b->max_frame);
    const char *argv[40] = {
        b->kvshared, "--socket",       b->sock, "--backend",      "host", "--layers",
        "1",         "--kv-heads",     "1",     "--head-dim",     "8",    "--dtype",
        "fp16",      "--block-tokens", "16",    "--pool-blocks",  nb,     "--max-frame",
        mf,          "--log-level",    "error", "--max-sessions", "2048"};
    char listen[32], conf[128];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", b->metrics_port);
    /* The committer of the KV-events attacks writes in a namespace of its
     * own, with a quota of half the pool: it never evicts the victim's
     * prompt. */
    snprintf(conf, sizeof(conf), "%s/kvshared.conf", b->dir);
    FILE *f = fopen(conf, "w");
    if (!f)
        return -1;
    fprintf(f,
            "dynamic_namespaces = yes\n[namespace " FLOOD_EVENTS_NS "]\nmodel_name = bench\n"
            "quota = %u\n",
            b->blocks / 2);
    if (fclose(f) != 0)
        return -1;
    int n = 23;
    argv[n++] = "--config";
    argv[n++] = conf;
    argv[n++] = "--metrics-listen";
    argv[n++] = listen;
    argv[n++] = "--kv-events";
    argv[n++] = b->pub;
    argv[n++] = "--kv-events-replay";
    argv[n++] = b->replay;
    if (b->max_buffers) {
        argv[n++] = "--max-buffer-memory";
        argv[n++] = b->max_buffers;
    }
    argv[n] = NULL;
    pid_t pid = launch_daemon(argv, LAUNCH_READY_MS, NULL);
    if (pid < 0)
        return -1;
    b->daemon = pid;
    return 0;
}

/* Fills the pool: prompts of 16 blocks, seeds 1, 2, ... (seed 1 is the
 * victim's first 16 blocks, its whole prompt is seed 0's 4k tokens). */
static int flood_fill(const flood_cfg_t *b)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.flags = KVS_NO_MAP;
    o.timeout_ms = 10000;
    if (kvs_connect(&o, &c) != 0)
        return -1;
    uint32_t tokens[FLOOD_PROMPT], ids[FLOOD_PROMPT / FLOOD_BT], canon[FLOOD_PROMPT / FLOOD_BT];
    size_t per = FLOOD_PROMPT / FLOOD_BT, n;
    int rc = 0;
    /* The victim's prompt first. */
    flood_prompt(tokens, FLOOD_PROMPT, 0);
    rc = kvs_alloc(c, NULL, (uint32_t)per, ids);
    if (rc == 0)
        rc = kvs_commit(c, NULL, tokens, FLOOD_PROMPT, ids, per, canon, &n);
    if (rc == 0)
        rc = kvs_release(c, ids, per, NULL);
    for (uint32_t seed = 1; rc == 0 && per + seed * 16 <= b->blocks; seed++) {
        flood_prompt(tokens, 16 * FLOOD_BT, seed);
        rc = kvs_alloc(c, NULL, 16, ids);
        if (rc == 0)
            rc = kvs_commit(c, NULL, tokens, 16 * FLOOD_BT, ids, 16, canon, &n);
        if (rc == 0)
            rc = kvs_release(c, ids, 16, NULL);
    }
    if (rc != 0)
        fprintf(stderr, "bench flood: fill: %s: %s\n", kvs_strerror(rc), kvs_last_error(c));
    kvs_close(c);
    return rc;
}

/* One attack frame, packed (4-byte length, then the Request). */
static uint8_t *flood_frame(const flood_cfg_t *b, const char *attack, int variant, size_t *len)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__TreeRequest tr = KVSHARE__TREE_REQUEST__INIT;
    Kvshare__ReleaseRequest rr = KVSHARE__RELEASE_REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    Kvshare__StatsRequest st = KVSHARE__STATS_REQUEST__INIT;
    uint32_t *buf = NULL;
    size_t room = (b->max_frame - 64) / 4;
    req.id = 1;
    if (strncmp(attack, "large-", 6) == 0)
        attack += 6;
    if (strcmp(attack, "junk") == 0) {
        /* A whole frame of bytes that are no Request: field 15, wire type
         * 7 (none such) first, so protobuf-c refuses at once. */
        size_t n = b->max_frame - 64;
        uint8_t *f = malloc(4 + n);
        if (!f)
            return NULL;
        frame_put_len(f, (uint32_t)n);
        memset(f + 4, 0x7f, n);
        *len = 4 + n;
        return f;
    }
    if (strcmp(attack, "tree") == 0) {
        tr.max = 1000;
        tr.by_size = variant & 1;
        req.rpc_case = KVSHARE__REQUEST__RPC_TREE;
        req.tree = &tr;
    } else if (strcmp(attack, "release") == 0) {
        /* fixed32 ids: 4 bytes each plus a few of framing. */
        size_t n = (b->max_frame - 64) / 4;
        buf = malloc(n * sizeof(*buf));
        if (!buf)
            return NULL;
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint32_t)(i % b->blocks);
        rr.block_ids = buf;
        rr.n_block_ids = n;
        req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
        req.release = &rr;
    } else if (strcmp(attack, "lookup") == 0) {
        buf = malloc(room * sizeof(*buf));
        if (!buf)
            return NULL;
        flood_prompt(buf, FLOOD_PROMPT, 0);
        flood_prompt(buf + FLOOD_PROMPT, room - FLOOD_PROMPT, 999999);
        lk.tokens.data = (uint8_t *)buf;
        lk.tokens.len = room * 4;
        req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
        req.lookup = &lk;
    } else {
        req.rpc_case = KVSHARE__REQUEST__RPC_STATS;
        req.stats = &st;
    }
    uint8_t *f = raw_frame(&req, len);
    free(buf);
    return f;
}

/* Burns CPU until killed (the spin baselines). */
static void flood_spin(void)
{
    volatile uint64_t x = 0;
    for (;;)
        x++;
}

/* A scraper: GET /metrics over and over, counting full answers. */
static void flood_scraper(const flood_cfg_t *b, uint64_t *answered)
{
    static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    static char sink[1 << 16];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)b->metrics_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
            if (fd >= 0)
                close(fd);
            usleep(1000);
            continue;
        }
        size_t got = 0;
        ssize_t r;
        if (bench_write_all(fd, req, sizeof(req) - 1) == 0)
            while ((r = read(fd, sink, sizeof(sink))) > 0)
                got += (size_t)r;
        close(fd);
        if (got > 12 && memcmp(sink, "HTTP/1.1 200", 12) == 0)
            __atomic_add_fetch(answered, 1, __ATOMIC_RELAXED);
    }
}

/* A committer: 4k-token prompts never seen before, one Commit each (a
 * BlockStored of 256 blocks), counting commits. */
static void flood_committer(const flood_cfg_t *b, uint64_t *answered)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.flags = KVS_NO_MAP;
    o.timeout_ms = 60000;
    if (kvs_connect(&o, &c) != 0)
        _exit(3);
    static uint32_t tokens[FLOOD_PROMPT];
    uint32_t ids[FLOOD_PROMPT / FLOOD_BT], canon[FLOOD_PROMPT / FLOOD_BT];
    size_t per = FLOOD_PROMPT / FLOOD_BT, n;
    for (uint32_t seed = 1u << 20;; seed++) {
        flood_prompt(tokens, FLOOD_PROMPT, seed);
        if (kvs_alloc(c, FLOOD_EVENTS_NS, (uint32_t)per, ids) != 0)
            continue;
        if (kvs_commit(c, FLOOD_EVENTS_NS, tokens, FLOOD_PROMPT, ids, per, canon, &n) == 0)
            __atomic_add_fetch(answered, 1, __ATOMIC_RELAXED);
        kvs_release(c, ids, per, NULL);
    }
}

/* A KV-events subscriber that reads everything, or (stalled) one that
 * never reads: a receive queue of one message and a 4 KiB socket buffer. */
static void flood_subscriber(const flood_cfg_t *b, bool stalled)
{
    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int one = 1, small = 4096;
    if (stalled) {
        zmq_setsockopt(sub, ZMQ_RCVHWM, &one, sizeof(one));
        zmq_setsockopt(sub, ZMQ_RCVBUF, &small, sizeof(small));
    }
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    zmq_connect(sub, b->pub);
    for (;;) {
        if (stalled) {
            pause();
            continue;
        }
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sub, 0);
        zmq_msg_close(&m);
    }
}

/* A replay peer that sends 2,000 requests at once and never reads. */
static void flood_replay_peer(const flood_cfg_t *b)
{
    void *ctx = zmq_ctx_new();
    void *peer = zmq_socket(ctx, ZMQ_DEALER);
    int one = 1, many = 10000;
    uint8_t start[8] = {0};
    zmq_setsockopt(peer, ZMQ_RCVHWM, &one, sizeof(one));
    zmq_setsockopt(peer, ZMQ_SNDHWM, &many, sizeof(many));
    zmq_connect(peer, b->replay);
    for (int i = 0; i < 2000; i++) {
        zmq_send(peer, "", 0, ZMQ_SNDMORE);
        zmq_send(peer, start, sizeof(start), 0);
    }
    for (;;)
        pause();
}

/* The hints attacker: Pin and Release with a timed hint over cached
 * blocks, each with a later end, as fast as answered. */
static void flood_hinter(const flood_cfg_t *b, uint64_t *answered)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.flags = KVS_NO_MAP;
    o.timeout_ms = 60000;
    if (kvs_connect(&o, &c) != 0)
        _exit(3);
    static uint32_t tokens[16 * FLOOD_BT], ids[FLOOD_HINT_BLOCKS];
    size_t n_ids = 0, n;
    /* The fill's prompts of 16 blocks (seeds 1, 2, ...). */
    for (uint32_t seed = 1; n_ids + 16 <= FLOOD_HINT_BLOCKS; seed++) {
        flood_prompt(tokens, 16 * FLOOD_BT, seed);
        if (kvs_lookup(c, NULL, tokens, 16 * FLOOD_BT, 0, ids + n_ids, 16, &n) != 0 || n == 0)
            _exit(4);
        n_ids += n;
    }
    for (uint32_t k = 1;; k++) {
        kvs_hint_t h = {.priority = 100, .duration_ms = 60000 + k};
        if (kvs_pin_hint(c, ids, n_ids, NULL, &h) != 0 ||
            kvs_release_hint(c, ids, n_ids, NULL, &h) != 0)
            _exit(5);
        __atomic_add_fetch(answered, 2, __ATOMIC_RELAXED);
    }
}

/* The junk attacker: one frame-limit-sized frame that does not decode per
 * connection, as fast as the daemon takes them (it answers with an error
 * and closes the connection). */
static void flood_junk(const flood_cfg_t *b, uint64_t *answered)
{
    size_t len;
    uint8_t *f = flood_frame(b, "junk", 0, &len), reply[4096];
    if (!f)
        _exit(4);
    for (;;) {
        int fd = raw_connect(b->sock);
        if (fd < 0) {
            usleep(1000);
            continue;
        }
        if (bench_write_all(fd, f, len) == 0)
            while (read(fd, reply, sizeof(reply)) > 0)
                ;
        close(fd);
        __atomic_add_fetch(answered, 1, __ATOMIC_RELAXED);
    }
}

/* Forks fn's process (it runs until killed). */
#define FLOOD_CHILD(call)                                                                          \
    do {                                                                                           \
        if (fork() == 0) {                                                                         \
            prctl(PR_SET_PDEATHSIG, SIGKILL);                                                      \
            call;                                                                                  \
            _exit(0);                                                                              \
        }                                                                                          \
    } while (0)

/* The attacker: a writer that pipelines frames and a reader (a second
 * process on the same socket) that counts replies. Runs until killed. For
 * idle, a connection that sends nothing; for spin and raw-spin, two
 * processes burning CPU; for scrape and the KV-events attacks, the
 * processes their comment at the top of this file names. */
static void flood_attacker(const flood_cfg_t *b, const char *attack, uint64_t *answered)
{
    if (b->attacker_nice && setpriority(PRIO_PROCESS, 0, b->attacker_nice) != 0)
        _exit(5);
    if (strcmp(attack, "scrape") == 0) {
        for (int i = 0; i < 15; i++)
            FLOOD_CHILD(flood_scraper(b, answered));
        flood_scraper(b, answered);
    }
    if (strcmp(attack, "events") == 0 || strcmp(attack, "subscriber") == 0 ||
        strcmp(attack, "replay") == 0) {
        FLOOD_CHILD(flood_subscriber(b, strcmp(attack, "subscriber") == 0));
        if (strcmp(attack, "replay") == 0)
            FLOOD_CHILD(flood_replay_peer(b));
        usleep(200000); /* subscribed before the first commit */
        flood_committer(b, answered);
    }
    if (strcmp(attack, "hints") == 0)
        flood_hinter(b, answered);
    if (strcmp(attack, "large-junk") == 0) {
        FLOOD_CHILD(flood_junk(b, answered));
        flood_junk(b, answered);
    }
    if (strstr(attack, "spin")) {
        if (fork() == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            flood_spin();
        }
        flood_spin();
    }
    int fd = raw_connect(b->sock);
    if (fd < 0)
        _exit(3);
    if (strcmp(attack, "idle") == 0)
        for (;;)
            pause();
    pid_t reader = fork();
    if (reader == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        uint8_t hdr[FRAME_HEADER_BYTES];
        static uint8_t sink[1 << 16];
        for (;;) {
            if (bench_read_all(fd, hdr, sizeof(hdr)) != 0)
                _exit(0);
            size_t len = frame_get_len(hdr);
            while (len > 0) {
                ssize_t r = read(fd, sink, len < sizeof(sink) ? len : sizeof(sink));
                if (r <= 0)
                    _exit(0);
                len -= (size_t)r;
            }
            __atomic_add_fetch(answered, 1, __ATOMIC_RELAXED);
        }
    }
    size_t len[2];
    uint8_t *frame[2] = {flood_frame(b, attack, 0, &len[0]), flood_frame(b, attack, 1, &len[1])};
    if (!frame[0] || !frame[1])
        _exit(4);
    for (int i = 0;; i ^= 1)
        if (bench_write_all(fd, frame[i], len[i]) != 0)
            _exit(0);
}

typedef struct flood_shared {
    uint64_t answered;
    uint64_t n;
    int failed;
    float us[FLOOD_MAX_SAMPLES];
} flood_shared_t;

/* The raw baselines: the victim's Lookup frame size (its 4k tokens) out, a
 * 64-byte reply back, over a socket pair with an echo process. */
static void flood_victim_raw(const flood_cfg_t *b, flood_shared_t *sh)
{
    static uint8_t req[FLOOD_PROMPT * 4 + 32], reply[64];
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        sh->failed = 1;
        _exit(1);
    }
    pid_t echo = fork();
    if (echo == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(sv[0]);
        while (bench_read_all(sv[1], req, sizeof(req)) == 0)
            if (write(sv[1], reply, sizeof(reply)) != (ssize_t)sizeof(reply))
                break;
        _exit(0);
    }
    close(sv[1]);
    uint64_t end = now_ns() + (uint64_t)(b->seconds * 1e9);
    while (sh->n < FLOOD_MAX_SAMPLES) {
        uint64_t t0 = now_ns();
        if (t0 >= end)
            break;
        if (write(sv[0], req, sizeof(req)) != (ssize_t)sizeof(req) ||
            bench_read_all(sv[0], reply, sizeof(reply)) != 0) {
            sh->failed = 1;
            break;
        }
        sh->us[sh->n++] = (float)((double)(now_ns() - t0) / 1e3);
    }
    close(sv[0]);
    kill(echo, SIGKILL);
    waitpid(echo, NULL, 0);
    _exit(0);
}

/* The victim: Lookups of n_tokens tokens, its cached 4k-token prompt
 * first (then misses), each expected to hit the prompt's 256 blocks. */
static void flood_victim(const flood_cfg_t *b, flood_shared_t *sh, size_t n_tokens)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.flags = KVS_NO_MAP;
    o.timeout_ms = 60000;
    uint32_t *tokens = malloc(n_tokens * sizeof(*tokens));
    uint32_t *ids = malloc(n_tokens / FLOOD_BT * sizeof(*ids));
    if (!tokens || !ids || kvs_connect(&o, &c) != 0) {
        sh->failed = 1;
        _exit(1);
    }
    flood_prompt(tokens, FLOOD_PROMPT, 0);
    if (n_tokens > FLOOD_PROMPT)
        flood_prompt(tokens + FLOOD_PROMPT, n_tokens - FLOOD_PROMPT, 777777);
    uint64_t end = now_ns() + (uint64_t)(b->seconds * 1e9);
    while (sh->n < FLOOD_MAX_SAMPLES) {
        uint64_t t0 = now_ns();
        if (t0 >= end)
            break;
        size_t n = 0;
        int rc = kvs_lookup(c, NULL, tokens, n_tokens, 0, ids, n_tokens / FLOOD_BT, &n);
        uint64_t t1 = now_ns();
        if (rc != 0 || n != FLOOD_PROMPT / FLOOD_BT) {
            fprintf(stderr, "bench flood: victim lookup: %s (%zu blocks): %s\n", kvs_strerror(rc),
                    n, kvs_last_error(c));
            sh->failed = 1;
            break;
        }
        sh->us[sh->n++] = (float)((double)(t1 - t0) / 1e3);
    }
    kvs_close(c);
    _exit(0);
}

static long flood_status_kib(pid_t pid, const char *field);

/* The daemon's counters of the KV-events bounds, and its RSS. */
static void flood_print_daemon(const flood_cfg_t *b, const char *attack, long rss0)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_stats_t st;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.flags = KVS_NO_MAP;
    o.timeout_ms = 30000;
    printf("flood_%s_daemon_rss %ld -> %ld KiB\n", attack, rss0,
           flood_status_kib(b->daemon, "VmRSS"));
    if (kvs_connect(&o, &c) == 0 && kvs_stats(c, &st) == 0) {
        printf("flood_%s_kv_events %llu published, %llu not sent (send_bytes), %llu replays, "
               "%llu refused, %llu stalled\n",
               attack, (unsigned long long)st.counters[KVS_COUNTER_kv_events_published],
               (unsigned long long)st.counters[KVS_COUNTER_kv_events_send_drops],
               (unsigned long long)st.counters[KVS_COUNTER_kv_events_replay_requests],
               (unsigned long long)st.counters[KVS_COUNTER_kv_events_replay_refused],
               (unsigned long long)st.counters[KVS_COUNTER_kv_events_replay_stalled]);
        printf("flood_%s_loop longest work between polls so far %llu us, %llu stalls over 50 ms; "
               "%llu requests spaced, %llu hints refused, %llu protocol errors\n",
               attack, (unsigned long long)st.loop_busy_max_us,
               (unsigned long long)st.counters[KVS_COUNTER_loop_stalls],
               (unsigned long long)st.counters[KVS_COUNTER_requests_spaced],
               (unsigned long long)st.counters[KVS_COUNTER_hints_refused],
               (unsigned long long)st.protocol_errors);
        printf("flood_%s_metrics %llu scrapes held, %llu connections closed at the limit\n", attack,
               (unsigned long long)st.counters[KVS_COUNTER_metrics_http_scrapes_held],
               (unsigned long long)st.counters[KVS_COUNTER_metrics_http_closed_limit]);
        kvs_stats_free(&st);
    }
    kvs_close(c);
}

static int flood_run(const flood_cfg_t *b, const char *attack, flood_shared_t *sh)
{
    memset(sh, 0, offsetof(flood_shared_t, us));
    long rss0 = flood_status_kib(b->daemon, "VmRSS");
    pid_t att = -1;
    if (strcmp(attack, "none") != 0 && strcmp(attack, "raw") != 0 &&
        strcmp(attack, "large-none") != 0) {
        att = fork();
        if (att == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            setpgid(0, 0);
            flood_attacker(b, attack, &sh->answered);
        }
        usleep(200000); /* the flood is on before the victim starts */
    }
    pid_t vic = fork();
    if (vic == 0) {
        if (strncmp(attack, "raw", 3) == 0)
            flood_victim_raw(b, sh);
        flood_victim(b, sh, strncmp(attack, "large-", 6) == 0 ? FLOOD_LARGE : FLOOD_PROMPT);
    }
    waitpid(vic, NULL, 0);
    if (att > 0) {
        kill(-att, SIGKILL);
        kill(att, SIGKILL);
        waitpid(att, NULL, 0);
    }
    if (sh->failed || sh->n == 0)
        return -1;
    uint64_t *ns = malloc(sh->n * sizeof(*ns));
    if (!ns)
        return -1;
    for (uint64_t i = 0; i < sh->n; i++)
        ns[i] = (uint64_t)(sh->us[i] * 1000.0f);
    double p50 = bench_quantile(ns, sh->n, 0.50) / 1e3, p99 = bench_quantile(ns, sh->n, 0.99) / 1e3,
           max = bench_quantile(ns, sh->n, 1.0) / 1e3;
    free(ns);
    printf("flood_%s_victim_lookups %llu count\n", attack, (unsigned long long)sh->n);
    printf("flood_%s_victim_p50 %.1f us\n", attack, p50);
    printf("flood_%s_victim_p99 %.1f us\n", attack, p99);
    printf("flood_%s_victim_max %.1f us\n", attack, max);
    printf("flood_%s_attack_answered %llu count\n", attack, (unsigned long long)sh->answered);
    flood_print_daemon(b, attack, rss0);
    fflush(stdout);
    return 0;
}

static long flood_status_kib(pid_t pid, const char *field)
{
    char path[64], line[256];
    long v = -1;
    size_t n = strlen(field);
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            v = atol(line + n + 1);
    fclose(f);
    return v;
}

/* The memory attack: --sessions connections, half holding most of a
 * max-frame request, half pipelining 60 kB Pings and never reading a reply.
 * Each writes until the daemon stops taking bytes for 1 s or hangs up.
 * Prints the daemon's peak RSS and how many sessions it closed. */
static int flood_memory(const flood_cfg_t *b)
{
    size_t frame_len, ping_len;
    int *fds = calloc(b->sessions, sizeof(*fds));
    uint8_t *frame = raw_frame_head(b->max_frame - 64, (size_t)b->max_frame - 65536, &frame_len);
    uint8_t *ping = raw_ping_frames(60000, 1, &ping_len);
    if (!fds || !frame || !ping) {
        free(fds);
        free(frame);
        free(ping);
        return -1;
    }

    long rss0 = flood_status_kib(b->daemon, "VmRSS");
    uint64_t t0 = now_ns(), sent = 0;
    for (unsigned i = 0; i < b->sessions; i++) {
        fds[i] = raw_connect(b->sock);
        if (fds[i] < 0) {
            fprintf(stderr, "bench flood: memory: connect %u: %s\n", i, strerror(errno));
            break;
        }
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fds[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (i % 2 == 0) {
            sent += raw_write_until_closed(fds[i], frame, frame_len);
        } else {
            /* Replies up to twice the daemon's 64 MiB output limit. */
            for (size_t k = 0; k < (128u << 20) / ping_len; k++) {
                size_t done = raw_write_until_closed(fds[i], ping, ping_len);
                sent += done;
                if (done < ping_len)
                    break;
            }
        }
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    long rss = flood_status_kib(b->daemon, "VmRSS"), hwm = flood_status_kib(b->daemon, "VmHWM");
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = b->sock;
    o.flags = KVS_NO_MAP;
    o.timeout_ms = 30000;
    kvs_stats_t st;
    int rc = kvs_connect(&o, &c);
    if (rc == 0)
        rc = kvs_stats(c, &st);
    if (rc == 0) {
        printf("memory_sessions %u count\nmemory_sent %.1f MiB\nmemory_attack %.1f s\n",
               b->sessions, (double)sent / (1 << 20), secs);
        printf("memory_daemon_rss_before %ld KiB\nmemory_daemon_rss_after %ld KiB\n"
               "memory_daemon_peak_rss %ld KiB\n",
               rss0, rss, hwm);
        printf("memory_sessions_open %u count\nmemory_dropped_budget %llu count\n"
               "memory_dropped_output %llu count\n",
               st.sessions, (unsigned long long)st.counters[KVS_COUNTER_sessions_dropped_memory],
               (unsigned long long)st.sessions_dropped);
        kvs_stats_free(&st);
    } else {
        fprintf(stderr, "bench flood: memory: stats: %s\n", kvs_strerror(rc));
    }
    kvs_close(c);
    for (unsigned i = 0; i < b->sessions; i++)
        if (fds[i] > 0)
            close(fds[i]);
    free(fds);
    free(frame);
    free(ping);
    return rc == 0 ? 0 : -1;
}

static void flood_usage(FILE *f)
{
    fprintf(f, "usage: kvshare-bench flood [--kvshared PATH] [--blocks N] [--max-frame BYTES]\n"
               "                           [--seconds S] [--sessions N]\n"
               "                           [--max-buffer-memory SIZE] [--attacker-nice N]\n"
               "                           [ATTACK...]\n"
               "ATTACK: none idle spin raw raw-spin tree release lookup stats (default:\n"
               "these), memory (--sessions hostile sessions hold partial frames or unread\n"
               "replies), scrape, events, subscriber, replay, hints, large-none, large-tree,\n"
               "large-lookup, large-junk. See bench_flood.c.\n");
}

int bench_flood(int argc, char **argv)
{
    flood_cfg_t b = {.blocks = 65536, .max_frame = 16u << 20, .seconds = 5, .sessions = 1024};
    char kvshared[PATH_MAX + 32];
    const char *attacks[16];
    int n_attacks = 0;
    b.kvshared = bench_default_kvshared(kvshared, sizeof(kvshared));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kvshared") == 0 && i + 1 < argc)
            b.kvshared = argv[++i];
        else if (strcmp(argv[i], "--blocks") == 0 && i + 1 < argc)
            b.blocks = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--max-frame") == 0 && i + 1 < argc)
            b.max_frame = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            b.seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--sessions") == 0 && i + 1 < argc)
            b.sessions = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--attacker-nice") == 0 && i + 1 < argc)
            b.attacker_nice = atoi(argv[++i]);
        else if (strcmp(argv[i], "--max-buffer-memory") == 0 && i + 1 < argc)
            b.max_buffers = argv[++i];
        else if (strcmp(argv[i], "--help") == 0) {
            flood_usage(stdout);
            return 0;
        } else if (argv[i][0] != '-' && n_attacks < 16)
            attacks[n_attacks++] = argv[i];
        else {
            flood_usage(stderr);
            return 2;
        }
    }
    if (b.blocks < FLOOD_PROMPT / FLOOD_BT + 16 || b.max_frame < (FLOOD_PROMPT + 64) * 4 ||
        b.seconds <= 0) {
        fprintf(stderr, "bench flood: --blocks >= %d, --max-frame >= %d, --seconds > 0\n",
                FLOOD_PROMPT / FLOOD_BT + 16, (FLOOD_PROMPT + 64) * 4);
        return 2;
    }
    if (n_attacks == 0) {
        static const char *all[] = {"none", "idle",  "spin",    "raw",   "raw-spin",
                                    "tree", "stats", "release", "lookup"};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            attacks[n_attacks++] = all[i];
    }
    /* A descriptor per hostile session, here and in the daemon. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2 * (rlim_t)b.sessions + 64) {
        rl.rlim_cur =
            rl.rlim_max < 2 * (rlim_t)b.sessions + 64 ? rl.rlim_max : 2 * (rlim_t)b.sessions + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    snprintf(b.dir, sizeof(b.dir), "/tmp/kvs-flood-XXXXXX");
    if (!mkdtemp(b.dir)) {
        perror("bench flood: mkdtemp");
        return 1;
    }
    snprintf(b.sock, sizeof(b.sock), "%s/kvshared.sock", b.dir);
    snprintf(b.pub, sizeof(b.pub), "ipc://%s/pub", b.dir);
    snprintf(b.replay, sizeof(b.replay), "ipc://%s/replay", b.dir);
    /* A free port for /metrics: bound, read, let go (the daemon binds it
     * next; a race with another program is unlikely and fails the start). */
    int pfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in pa = {.sin_family = AF_INET};
    socklen_t plen = sizeof(pa);
    pa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (pfd < 0 || bind(pfd, (struct sockaddr *)&pa, sizeof(pa)) != 0 ||
        getsockname(pfd, (struct sockaddr *)&pa, &plen) != 0) {
        perror("bench flood: a port for /metrics");
        if (pfd >= 0)
            close(pfd);
        rmdir(b.dir);
        return 1;
    }
    b.metrics_port = ntohs(pa.sin_port);
    close(pfd);
    int rc = 1;
    flood_shared_t *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        goto out_dir;
    if (flood_start_daemon(&b) != 0) {
        fprintf(stderr, "bench flood: kvshared (%s) did not start\n", b.kvshared);
        goto out_map;
    }
    uint64_t t0 = now_ns();
    if (flood_fill(&b) != 0) {
        fprintf(stderr, "bench flood: filling the pool failed\n");
        goto out_daemon;
    }
    printf("flood_blocks %u count\nflood_max_frame %u bytes\nflood_fill %.2f s\n", b.blocks,
           b.max_frame, (double)(now_ns() - t0) / 1e9);
    rc = 0;
    for (int i = 0; i < n_attacks && rc == 0; i++)
        if (strcmp(attacks[i], "memory") == 0 ? flood_memory(&b) != 0
                                              : flood_run(&b, attacks[i], sh) != 0) {
            fprintf(stderr, "bench flood: the %s run failed\n", attacks[i]);
            rc = 1;
        }
out_daemon:
    kill(b.daemon, SIGTERM);
    waitpid(b.daemon, NULL, 0);
out_map:
    munmap(sh, sizeof(*sh));
out_dir:
    unlink(b.sock);
    static const char *const names[] = {"pub", "replay", "kvshared.conf"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char path[128];
        snprintf(path, sizeof(path), "%s/%s", b.dir, names[i]);
        unlink(path);
    }
    rmdir(b.dir);
    return rc;
}
