/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster: a client of Redis Cluster on the daemon's libuv loop.
 *
 * hiredis (0.14) speaks to one Redis server; the cluster is ours. The
 * client keeps the slot map (slot -> master) it reads with CLUSTER SLOTS,
 * and one pipelined hiredis async connection per node, attached to the
 * loop by an adapter of its own (hiredis's libuv adapter, but it reads up
 * to 256 KiB at a time where hiredis reads 16 KiB). A command names the key
 * that routes it (crc16.h), is formatted once, and is sent to the master
 * of the key's slot (any node while the map is not known yet: the redirect
 * finds the right one).
 *
 * Large values. hiredis builds each reply with a malloc'ed copy of a
 * string reply; cluster_get_sink hands a GET's value over where the
 * reader holds it instead, so that a caller verifies and places a 2 MiB
 * block without that copy. Each connection's reader keeps its buffer
 * (about one value and one read) instead of freeing it when it empties.
 *
 * Redirects. "MOVED slot host:port" means the map is stale: the slot is
 * pointed at that node at once, the command is sent there again, and a
 * refresh of the whole map is asked for. "ASK slot host:port" means the
 * slot is migrating and this one key is already on the target: the
 * command goes there once, after ASKING, and the map stays as it is. A
 * command redirected more than CLUSTER_MAX_REDIRECTS times fails.
 *
 * Faults. Every command has a deadline (timeout_ms from its start, across
 * redirects). hiredis cannot cancel one command, so a command past its
 * deadline ends the connection it waits on: all of that node's commands
 * fail with KVS_ETIMEDOUT, the node is counted down for a short back-off
 * (commands for its slots then fail at once with KVS_EIO instead of
 * waiting), and the map is refreshed. A refused or lost connection does
 * the same with KVS_EIO. While a slot points at a node that is down the map
 * is refreshed every CLUSTER_REFRESH_MS, so that after a failover the
 * promoted replica takes the slots over. Nothing here blocks the loop.
 *
 * Bounds. At most max_inflight commands are in flight; one more is
 * refused (KVS_EBUSY) and counted, for the caller to drop. A node's reply
 * is bounded by the largest any command sent here can need: its strings
 * at most max_reply_bytes in all (a block's value; 4 MiB at least, for
 * CLUSTER SLOTS and SCAN), its arrays at most CLUSTER_REPLY_MAX_ELEMENTS
 * elements in all. hiredis reads a whole bulk string before it parses it
 * and allocates an array's element pointers on its header, so a node
 * (or anything posing as one) answering with 1 GiB, or an array that says
 * 100M elements, would otherwise have it all held: a reply over a bound is
 * cut as soon as its bytes read (at most a read past the bound) or its
 * array header say so, and its connection ends, as a lost one does
 * (counted in replies_cut, logged at most once a second). Each reader
 * keeps at most the bound and a read of buffer once empty.
 *
 * Credentials come from a file (options.auth_file): one line, the
 * password of the default user, or two lines, an ACL user then its
 * password. They are sent as AUTH first on every connection and never
 * logged. A refused AUTH makes that node's commands fail with KVS_EDENIED.
 *
 * Every callback runs on the loop thread. Single-threaded: call from the
 * loop thread only.
 */
#ifndef KVS_DAEMON_CLUSTER_H
#define KVS_DAEMON_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define CLUSTER_MAX_NODES     64
#define CLUSTER_MAX_REDIRECTS 5
/* Least time between two refreshes of the map. */
#define CLUSTER_REFRESH_MS 250
/* Elements of all arrays of one reply at most: a CLUSTER SLOTS of 16,384
 * one-slot ranges with replicas, or a SCAN batch, needs far fewer. Each
 * costs about 56 bytes built (hiredis's redisReply and a pointer). */
#define CLUSTER_REPLY_MAX_ELEMENTS (1u << 20)
/* RESP framing around a reply's strings ("$N\r\n" ... "\r\n"), allowed in
 * the bytes read of one reply beyond max_reply_bytes. */
#define CLUSTER_REPLY_FRAMING 64

typedef struct cluster cluster_t;

typedef struct cluster_options {
    /* Seed nodes, "host:port[,host:port...]" (IPv4 literals or names
     * hiredis resolves; at most CLUSTER_MAX_NODES). Required. */
    const char *seeds;
    /* NULL: no AUTH. Otherwise the file described above. */
    const char *auth_file;
    /* Deadline of one command, redirects included (0: 1000 ms). */
    uint32_t timeout_ms;
    /* Commands in flight at most (0: 1024). */
    uint32_t max_inflight;
    /* Bytes of strings one reply may carry (Bounds above): the largest
     * value the caller reads. Below 4 MiB (0 included): 4 MiB. */
    size_t max_reply_bytes;
} cluster_options_t;

/* Counters of the client; all only grow except inflight and nodes_up. */
typedef struct cluster_stats {
    uint64_t commands;       /* accepted by cluster_command */
    uint64_t ok;             /* ended with a reply */
    uint64_t nil;            /* ended with a nil reply (KVS_ENOTFOUND) */
    uint64_t busy;           /* refused: max_inflight reached */
    uint64_t timeouts;       /* ended by their deadline */
    uint64_t down;           /* ended because their node was down or lost */
    uint64_t auth_errors;    /* AUTH refused, or NOAUTH/WRONGPASS replies */
    uint64_t full;           /* OOM replies: the cluster is full */
    uint64_t reply_errors;   /* other error replies */
    uint64_t moved;          /* MOVED redirects followed */
    uint64_t ask;            /* ASK redirects followed */
    uint64_t refreshes;      /* slot maps read */
    uint64_t refresh_errors; /* CLUSTER SLOTS that failed */
    uint64_t connects;       /* connections opened */
    uint64_t connect_errors; /* connections refused or lost */
    uint64_t bytes_out;      /* bytes of commands sent, redirects included */
    uint64_t bytes_in;       /* bytes of string replies received */
    uint64_t replies_cut;    /* replies over the bounds: their connection ended */
    uint32_t inflight;       /* commands in flight now */
    uint32_t nodes;          /* nodes known */
    uint32_t nodes_up;       /* nodes not counted down now */
} cluster_stats_t;

/* A node's connection now. */
enum {
    CLUSTER_NODE_IDLE = 0, /* no connection: nothing was sent to it yet, or since it was lost */
    CLUSTER_NODE_CONNECTED = 1,    /* a connection is open (or opening) */
    CLUSTER_NODE_DOWN = 2,         /* counted down after a fault: its commands fail at once */
    CLUSTER_NODE_AUTH_REFUSED = 3, /* connected, but it refused AUTH */
};

/* One node's figures, for Stats and /metrics. */
#define CLUSTER_ADDR_MAX 80
typedef struct cluster_node_stats {
    char addr[CLUSTER_ADDR_MAX]; /* "host:port" */
    uint32_t slots;              /* slots the map gives it (0: a replica, or not in the map) */
    uint32_t state;              /* CLUSTER_NODE_* */
    uint64_t requests;           /* commands sent to it, redirected ones included */
    uint64_t errors;             /* commands that ended badly on it (not nil replies) */
    uint64_t replies;            /* replies it gave */
    uint64_t latency_us_sum;     /* microseconds from send to reply, summed over replies */
    uint64_t latency_us_max;     /* the longest of them */
} cluster_node_stats_t;

/* How a command ended, on the loop thread: status 0 with the reply's bytes
 * (a string or status reply: data/len valid only during the call; an
 * integer reply: its decimal text), or KVS_ENOTFOUND (nil reply),
 * KVS_ETIMEDOUT (past its deadline), KVS_EIO (node down or lost, cluster
 * down, too many redirects, another error reply), KVS_EDENIED (AUTH
 * refused or missing), KVS_EPOOLFULL (the cluster answered OOM), or
 * KVS_EBADSTATE (cluster_close ran with the command in flight). */
typedef void (*cluster_reply_cb)(void *arg, int status, const char *data, size_t len);

/* Creates a client on loop and starts reading the slot map from the seeds.
 * Returns 0 and *out, KVS_EINVAL (no or bad seeds, bad options), KVS_EIO
 * (the auth file cannot be read, or is empty), KVS_ENOMEM. */
int cluster_new(uv_loop_t *loop, const cluster_options_t *opt, cluster_t **out);

/* Ends every command in flight (KVS_EBADSTATE), closes the connections and
 * frees the client once its handles are closed (run the loop to finish).
 * Accepts NULL. Callable from a reply callback. */
void cluster_close(cluster_t *c);

/* Sends one command, routed by key (klen bytes; NULL with klen 0 sends it
 * to any node), argv as hiredis's redisAsyncCommandArgv takes it. cb runs
 * exactly once, later, on the loop, unless this returns an error: then it
 * never runs. Returns 0, KVS_EBUSY (max_inflight reached), KVS_EIO (the
 * key's node is down: a fast miss), KVS_EBADSTATE (closing), KVS_ENOMEM. */
int cluster_command(cluster_t *c, const void *key, size_t klen, int argc, const char **argv,
                    const size_t *argvlen, cluster_reply_cb cb, void *arg);

/* GET key / SET key value: cluster_command for the two commands the tier
 * uses. */
int cluster_get(cluster_t *c, const void *key, size_t klen, cluster_reply_cb cb, void *arg);

/* Takes a string reply where hiredis's reader holds it: data/len valid only
 * during the call, on the loop, while the client reads replies. It must
 * not call into the client. */
typedef void (*cluster_sink_cb)(void *arg, const char *data, size_t len);

/* cluster_get, but a string reply goes to sink(arg, data, len) first, and
 * then cb(arg, 0, NULL, len): the value is never copied out of the reader
 * (a 2 MiB block otherwise costs a malloc and a copy). Every other end
 * (nil, errors, timeouts) goes to cb as for cluster_get, sink not called. */
int cluster_get_sink(cluster_t *c, const void *key, size_t klen, cluster_sink_cb sink,
                     cluster_reply_cb cb, void *arg);
int cluster_set(cluster_t *c, const void *key, size_t klen, const void *value, size_t vlen,
                cluster_reply_cb cb, void *arg);

/* How a SCAN ended, on the loop thread: status 0 with the next cursor (0:
 * the node's keyspace is done) and the n keys of this batch (keys[i],
 * lens[i] bytes: valid only during the call), or an error as for
 * cluster_reply_cb (n 0). */
typedef void (*cluster_scan_cb)(void *arg, int status, uint64_t cursor, const char *const *keys,
                                const size_t *lens, size_t n);

/* Sends "SCAN cursor MATCH match COUNT count" to node (an index that
 * cluster_masters gave), never redirected. cb runs exactly once, later, on
 * the loop, unless this returns an error: then it never runs. Returns 0,
 * KVS_EINVAL (no such node), KVS_EBUSY, KVS_EIO (the node is down),
 * KVS_EBADSTATE, KVS_ENOMEM. */
int cluster_scan(cluster_t *c, int node, uint64_t cursor, const char *match, uint32_t count,
                 cluster_scan_cb cb, void *arg);

/* The nodes the slot map names as the masters of some slot now, by index
 * (at most max into out, in index order). Returns how many; 0 while no map
 * is known. */
size_t cluster_masters(const cluster_t *c, int *out, size_t max);

/* 1 once a slot map was read and every slot has a master, else 0. */
int cluster_ready(const cluster_t *c);

/* Copies the counters. */
void cluster_get_stats(const cluster_t *c, cluster_stats_t *out);

/* Copies the figures of at most max nodes into out, in the order the client
 * met them. Returns how many. */
size_t cluster_get_nodes(const cluster_t *c, cluster_node_stats_t *out, size_t max);

/* Bytes of commands formatted and not yet written to their sockets, over
 * every node. hiredis keeps them in one buffer per connection and moves
 * what is left to its front after each partial write: a caller that sends
 * large values keeps this small, so that the moves stay small too. */
size_t cluster_unsent_bytes(const cluster_t *c);

/* "idle", "connected", "down", "auth-refused". */
const char *cluster_node_state_name(uint32_t state);

/* The node serving slot now, as "host:port" into buf (len bytes), or ""
 * when no map covers it. Returns buf. For Stats and tests. */
const char *cluster_slot_node(const cluster_t *c, uint16_t slot, char *buf, size_t len);

/* ---- the masters' eviction settings ----
 *
 * Redis's eviction settings decide the cluster tier's hit rate (docs/CLUSTER.md,
 * Sizing Redis; docs/EVICTION.md, Several nodes and the cluster tier):
 * cluster_check_settings asks every master of the slot map for them, with
 * one CONFIG GET maxmemory* each (maxmemory, maxmemory-policy,
 * maxmemory-samples in one round trip; Redis 2.x to 7, Valkey), and logs one
 * WARN line per problem: a maxmemory-policy other than allkeys-lru, a
 * maxmemory-samples below CLUSTER_SETTINGS_SAMPLES, a maxmemory of 0, and
 * masters that disagree (another policy or samples, or maxmemory per slot
 * apart by more than a quarter). Masters with the same problem share one
 * line, which names them, the value found, the value recommended, what it
 * costs (the replays' figure) and the doc section. A master that refuses
 * CONFIG (renamed, an ACL, a managed Redis) or does not answer is not
 * checked: one INFO line names those and why. Nothing fails for it. */

/* The maxmemory-samples recommended: the most the replays measured. */
#define CLUSTER_SETTINGS_SAMPLES 64

/* One master's settings as CONFIG GET gave them. */
typedef struct cluster_settings {
    char addr[CLUSTER_ADDR_MAX];  /* "host:port" */
    uint32_t slots;               /* slots the map gives it */
    char policy[32];              /* maxmemory-policy ("" when not given) */
    long long samples;            /* maxmemory-samples (-1 when not given) */
    unsigned long long maxmemory; /* bytes (0: no limit) */
    int have_maxmemory;           /* the reply named maxmemory */
} cluster_settings_t;

/* Judges the settings of n masters (n >= 1) as described above and logs a
 * WARN line per problem. Returns the number of problems (lines). */
uint32_t cluster_settings_judge(const cluster_settings_t *m, size_t n);

/* The check ended: problems found (each logged at WARN), masters checked,
 * masters that could not be (logged at INFO, once for all of them). */
typedef void (*cluster_check_cb)(void *arg, uint32_t warnings, uint32_t checked,
                                 uint32_t unchecked);

/* Starts the check on the masters of the slot map now: done runs once, on
 * the loop, when every master answered or failed (within the timeout; at
 * the latest in cluster_close, with nothing logged), possibly before this
 * returns when no master could be asked. Returns 0, or (done never runs)
 * KVS_EINVAL, KVS_EBADSTATE (closing, or no slot map yet), KVS_ENOMEM. */
int cluster_check_settings(cluster_t *c, cluster_check_cb done, void *arg);

#endif /* KVS_DAEMON_CLUSTER_H */
