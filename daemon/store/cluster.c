/* SPDX-License-Identifier: Apache-2.0 */
#include "cluster.h"

#include "crc16.h"
#include "kvshare_status.h"
#include "list.h"
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>

#define CLUSTER_HOST_MAX 64
/* How long a node that failed is counted down (at most; the timeout if
 * shorter): commands for its slots fail at once meanwhile. */
#define CLUSTER_DOWN_MS 200
/* Period of the timer that ends late commands and refreshes the map. */
#define CLUSTER_TICK_MS 10
/* At most one log line per kind of fault per this many ms. */
#define CLUSTER_LOG_MS 1000
/* Bytes read from a socket at a time: CLUSTER_READ_BYTES in a long value,
 * else CLUSTER_READ_SMALL (read_size; hiredis reads 16 KiB). */
#define CLUSTER_READ_BYTES (256u << 10)
#define CLUSTER_READ_SMALL (16u << 10)
/* The least reply bound: a CLUSTER SLOTS or SCAN reply (cluster.h). */
#define CLUSTER_REPLY_MIN_BYTES (4u << 20)

typedef struct cluster_node {
    char host[CLUSTER_HOST_MAX];
    int port;
    int idx;
    cluster_t *cl;
    redisAsyncContext *ac; /* NULL: not connected */
    int fail_status;       /* why its commands end when ac goes away */
    uint64_t down_until;   /* loop ms; 0: up */
    int auth_refused;
    /* The reply being read: its strings' bytes and arrays' elements so
     * far, against the client's bounds (cluster.h, Bounds). */
    size_t reply_bytes, reply_elements;
    int cut; /* its reader refused a reply over the bounds */
    /* For Stats: commands sent to it (redirects included), those that
     * ended badly on it, and the time from send to reply of those answered. */
    uint64_t requests, errors, replies, latency_us_sum, latency_us_max;
} cluster_node_t;

typedef enum req_kind { REQ_USER, REQ_REFRESH, REQ_SCAN, REQ_CONFIG } req_kind_t;

/* One command in flight: formatted once, sent again on redirects. */
typedef struct cluster_req {
    list_node_t link; /* on the client's commands in flight, oldest first */
    cluster_t *cl;
    req_kind_t kind;
    char *cmd; /* hiredis-formatted (redisFormatCommandArgv) */
    size_t cmd_len;
    int keyed;
    uint16_t slot;
    int node; /* the node it waits on */
    int redirects;
    uint64_t sent_ns; /* when it was sent to node (uv_hrtime) */
    uint64_t deadline;
    cluster_reply_cb cb;
    cluster_scan_cb scan_cb;      /* REQ_SCAN */
    struct settings_check *check; /* REQ_CONFIG: the check it answers */
    int check_i;                  /* REQ_CONFIG: its master's place in the check */
    cluster_sink_cb sink;         /* NULL: the string reply goes to cb */
    int sunk;                     /* sink took the string reply (sunk_len bytes) */
    size_t sunk_len;
    void *arg;
} cluster_req_t;

enum {
    LOGK_CONNECT,
    LOGK_TIMEOUT,
    LOGK_AUTH,
    LOGK_REPLY,
    LOGK_REFRESH,
    LOGK_OOM,
    LOGK_CUT,
    LOGK_N
};

struct cluster {
    uv_loop_t *loop;
    uv_timer_t timer;
    cluster_node_t *nodes[CLUSTER_MAX_NODES];
    int n_nodes;
    int16_t slots[CLUSTER_SLOTS]; /* node index, -1: unknown */
    int next_refresh_node;
    char *user; /* NULL: the default user */
    char *pass; /* NULL: no AUTH */
    uint32_t timeout_ms;
    uint32_t max_inflight;
    size_t max_reply_bytes;
    list_t reqs; /* cluster_req_t.link, oldest first: the first deadline first */
    int refreshing;
    int refresh_wanted;
    uint64_t last_refresh;
    uint64_t last_log[LOGK_N];
    int closing;
    cluster_stats_t stats;
    /* hiredis's own reply builders, and the ones every connection's reader
     * uses: the same but for a command's string reply that has a sink. */
    redisReplyObjectFunctions hiredis_fns;
    redisReplyObjectFunctions reply_fns;
};

static uint64_t cl_now(const cluster_t *c)
{
    return uv_now(c->loop);
}

/* Logs at most one line per kind and CLUSTER_LOG_MS: a cluster that is down
 * fails thousands of commands a second, and the log must stay readable. */
__attribute__((format(printf, 3, 4))) static void cl_log(cluster_t *c, int kind, const char *fmt,
                                                         ...)
{
    uint64_t now = cl_now(c);
    if (c->last_log[kind] && now - c->last_log[kind] < CLUSTER_LOG_MS)
        return;
    c->last_log[kind] = now;
    if (LOG_LEVEL_WARN > log_level)
        return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log_write(LOG_LEVEL_WARN, "cluster: %s", line);
}

/* ---- nodes ---- */

static int node_find(const cluster_t *c, const char *host, int port)
{
    for (int i = 0; i < c->n_nodes; i++)
        if (c->nodes[i]->port == port && strcmp(c->nodes[i]->host, host) == 0)
            return i;
    return -1;
}

/* The index of host:port, added when new. Returns -1 when the table is full
 * or the host name is too long. */
static int node_get(cluster_t *c, const char *host, size_t host_len, int port)
{
    char name[CLUSTER_HOST_MAX];
    if (host_len == 0 || host_len >= sizeof name || port <= 0 || port > 65535)
        return -1;
    memcpy(name, host, host_len);
    name[host_len] = '\0';
    int i = node_find(c, name, port);
    if (i >= 0 || c->n_nodes == CLUSTER_MAX_NODES)
        return i;
    cluster_node_t *n = calloc(1, sizeof *n);
    if (!n)
        return -1;
    memcpy(n->host, name, host_len + 1);
    n->port = port;
    n->cl = c;
    n->idx = c->n_nodes;
    c->nodes[c->n_nodes++] = n;
    c->stats.nodes = (uint32_t)c->n_nodes;
    return n->idx;
}

static int node_is_down(const cluster_t *c, const cluster_node_t *n)
{
    return n->down_until && cl_now(c) < n->down_until;
}

/* Counts the node down for a while and asks for a refresh of the map. */
static void node_mark_down(cluster_node_t *n)
{
    cluster_t *c = n->cl;
    uint32_t ms = c->timeout_ms < CLUSTER_DOWN_MS ? c->timeout_ms : CLUSTER_DOWN_MS;
    n->down_until = cl_now(c) + ms;
    c->refresh_wanted = 1;
}

/* Ends the node's connection: every command on it ends with status (hiredis
 * calls their callbacks with no reply, now or, inside a callback, when it
 * returns). */
static void node_drop(cluster_node_t *n, int status)
{
    redisAsyncContext *ac = n->ac;
    if (!ac)
        return;
    n->ac = NULL;
    n->fail_status = status;
    node_mark_down(n);
    redisAsyncFree(ac);
}

/* Counts and logs a reply of n over the client's bounds (cluster.h,
 * Bounds); the caller ends the connection. */
static void node_cut(cluster_node_t *n, const char *what, size_t have)
{
    cluster_t *c = n->cl;
    n->cut = 1;
    c->stats.replies_cut++;
    cl_log(c, LOGK_CUT,
           "%s:%d sent a reply over the largest any command needs (%s: %zu, at most %zu bytes "
           "and %u elements): connection closed, %llu cut so far",
           n->host, n->port, what, have, c->max_reply_bytes, CLUSTER_REPLY_MAX_ELEMENTS,
           (unsigned long long)c->stats.replies_cut);
}

static void on_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    cluster_node_t *n = privdata;
    redisReply *reply = r;
    (void)ac;
    if (!reply || reply->type != REDIS_REPLY_ERROR) {
        n->auth_refused = 0;
        return;
    }
    /* The commands pipelined behind AUTH fail with NOAUTH and are counted
     * there; the text of the reply never names the password. */
    n->auth_refused = 1;
    n->cl->stats.auth_errors++;
    cl_log(n->cl, LOGK_AUTH, "%s:%d refused AUTH: %.80s", n->host, n->port, reply->str);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    cluster_node_t *n = ac->data;
    if (status == REDIS_OK)
        return;
    cluster_t *c = n->cl;
    c->stats.connect_errors++;
    cl_log(c, LOGK_CONNECT, "cannot connect to %s:%d: %s", n->host, n->port,
           ac->errstr ? ac->errstr : "?");
    /* hiredis frees ac after this returns; its commands end with no reply. */
    if (n->ac == ac) {
        n->ac = NULL;
        n->fail_status = KVS_EIO;
        node_mark_down(n);
    }
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    cluster_node_t *n = ac->data;
    (void)status;
    if (n->ac != ac)
        return; /* we ended it ourselves (node_drop) */
    cluster_t *c = n->cl;
    c->stats.connect_errors++;
    cl_log(c, LOGK_CONNECT, "lost %s:%d: %s", n->host, n->port, ac->errstr ? ac->errstr : "?");
    n->ac = NULL;
    n->fail_status = KVS_EIO;
    node_mark_down(n);
}

/* ---- the connections on the loop ----
 *
 * hiredis's own libuv adapter, but for reads: hiredis 0.14 reads 16 KiB per
 * readable event and appends it to its reader's buffer, so a 2 MiB value
 * costs 128 system calls (on loopback each also runs the sender's side of
 * TCP) and a copy. On a readable event in a long value this reads up to
 * CLUSTER_READ_BYTES straight into the reader's buffer first; hiredis then
 * reads what is left (usually nothing) and parses the replies as always. */

typedef struct cluster_events {
    redisAsyncContext *ac; /* NULL once hiredis let go of it */
    uv_poll_t poll;
    int events;
} cluster_events_t;

/* How much read_ahead reads: CLUSTER_READ_BYTES while the reply being
 * read is a bulk string longer than that (a block's value), else
 * CLUSTER_READ_SMALL. hiredis's reader moves the unparsed rest of its
 * buffer to the front after every KiB of replies it takes: with many small
 * replies (a pipeline of SETs' +OK, of missing GETs) in a large buffer that
 * is quadratic, most of the cluster thread's time before. */
static size_t read_size(const redisReader *r)
{
    const char *p = r->buf + r->pos, *end = r->buf + r->len;
    if (p == end || *p != '$')
        return CLUSTER_READ_SMALL;
    uint64_t len = 0;
    for (p++; p < end && *p >= '0' && *p <= '9' && len <= CLUSTER_READ_BYTES; p++)
        len = len * 10 + (uint64_t)(*p - '0');
    return len > CLUSTER_READ_BYTES ? CLUSTER_READ_BYTES : CLUSTER_READ_SMALL;
}

/* Reads what the socket holds, up to read_size, into ac's reader. An
 * error or the end of the stream is left for hiredis's own read, which
 * meets it again and ends the connection its way. */
static void read_ahead(redisAsyncContext *ac)
{
    redisContext *c = &ac->c;
    redisReader *r = c->reader;
    if (!(c->flags & REDIS_CONNECTED) || c->err || r->err)
        return;
    size_t want = read_size(r);
    sds buf = sdsMakeRoomFor(r->buf, want);
    if (!buf)
        return;
    r->buf = buf;
    ssize_t n = read(c->fd, buf + sdslen(buf), want);
    if (n <= 0)
        return;
    sdsIncrLen(buf, (int)n);
    r->len = sdslen(buf);
}

/* Bytes of ac's reader not parsed yet: after hiredis parsed what it
 * could, the rest of the one reply it is in the middle of. */
static size_t reader_pending(const redisAsyncContext *ac)
{
    const redisReader *r = ac->c.reader;
    return r->len > r->pos ? r->len - r->pos : 0;
}

/* Ends ac's connection when the reply it is reading is already over the
 * bounds: hiredis would read all of it (a 1 GiB bulk string) before
 * parsing any. Returns 1 when it did. */
static int reader_over(redisAsyncContext *ac)
{
    cluster_node_t *n = ac->data;
    size_t pending = reader_pending(ac);
    if (pending <= n->cl->max_reply_bytes + CLUSTER_REPLY_FRAMING)
        return 0;
    node_cut(n, "bytes read of one reply", pending);
    node_drop(n, KVS_EIO);
    return 1;
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    cluster_events_t *e = h->data;
    if (status != 0)
        return;
    if (e->ac && (events & UV_READABLE)) {
        if (reader_over(e->ac))
            return;
        read_ahead(e->ac);
        if (reader_over(e->ac))
            return;
        redisAsyncHandleRead(e->ac);
        if (e->ac && reader_over(e->ac))
            return;
    }
    if (e->ac && (events & UV_WRITABLE))
        redisAsyncHandleWrite(e->ac);
}

/* hiredis asks for write readiness with every command it queues: the
 * poll is changed (an epoll_ctl) only when the set of events does. */
static void events_set(cluster_events_t *e, int events)
{
    if (events == e->events)
        return;
    e->events = events;
    if (events)
        uv_poll_start(&e->poll, events, on_poll);
    else
        uv_poll_stop(&e->poll);
}

static void ev_add_read(void *p)
{
    cluster_events_t *e = p;
    events_set(e, e->events | UV_READABLE);
}

static void ev_del_read(void *p)
{
    cluster_events_t *e = p;
    events_set(e, e->events & ~UV_READABLE);
}

static void ev_add_write(void *p)
{
    cluster_events_t *e = p;
    events_set(e, e->events | UV_WRITABLE);
}

static void ev_del_write(void *p)
{
    cluster_events_t *e = p;
    events_set(e, e->events & ~UV_WRITABLE);
}

static void on_events_closed(uv_handle_t *h)
{
    free(h->data);
}

/* hiredis is done with the connection: the handle goes, its memory once
 * closed (a poll callback running now still finds it). */
static void ev_cleanup(void *p)
{
    cluster_events_t *e = p;
    e->ac = NULL;
    uv_close((uv_handle_t *)&e->poll, on_events_closed);
}

/* Attaches ac to loop. Returns REDIS_OK or REDIS_ERR. */
static int events_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    if (ac->ev.data)
        return REDIS_ERR;
    cluster_events_t *e = calloc(1, sizeof *e);
    if (!e)
        return REDIS_ERR;
    if (uv_poll_init(loop, &e->poll, ac->c.fd) != 0) {
        free(e);
        return REDIS_ERR;
    }
    e->ac = ac;
    e->poll.data = e;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    ac->ev.data = e;
    return REDIS_OK;
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata);

/* Builds a string reply. hiredis's reader holds the whole bulk string in
 * its buffer when it calls this; its own builder then copies it into a
 * malloc'ed reply (2 MiB for a block). A command with a sink (the head of
 * the connection's callbacks: replies come in order) gets the bytes where
 * they lie instead, and the reply built is an empty string. */
static void *create_string(const redisReadTask *task, char *str, size_t len)
{
    redisAsyncContext *ac = task->privdata;
    cluster_node_t *n = ac->data;
    cluster_t *c = n->cl;
    if (!task->parent)
        n->reply_bytes = n->reply_elements = 0;
    n->reply_bytes += len;
    if (n->reply_bytes > c->max_reply_bytes) {
        node_cut(n, "string bytes", n->reply_bytes);
        return NULL; /* the reader fails: hiredis ends the connection */
    }
    const redisCallback *head = ac->replies.head;
    if (task->type == REDIS_REPLY_STRING && !task->parent && head && head->fn == on_reply) {
        cluster_req_t *q = head->privdata;
        if (q->sink) {
            q->sink(q->arg, str, len);
            q->sunk = 1;
            q->sunk_len = len;
            return c->hiredis_fns.createString(task, str, 0);
        }
    }
    return c->hiredis_fns.createString(task, str, len);
}

/* Builds an array reply, unless its elements and those of the arrays
 * before it in the reply pass CLUSTER_REPLY_MAX_ELEMENTS: hiredis's
 * builder allocates a pointer per element at once (800 MB for an array
 * that says 100M), before any element arrives. */
static void *create_array(const redisReadTask *task, int elements)
{
    redisAsyncContext *ac = task->privdata;
    cluster_node_t *n = ac->data;
    cluster_t *c = n->cl;
    if (!task->parent)
        n->reply_bytes = n->reply_elements = 0;
    if (elements > 0)
        n->reply_elements += (size_t)elements;
    if (n->reply_elements > CLUSTER_REPLY_MAX_ELEMENTS) {
        node_cut(n, "array elements", n->reply_elements);
        return NULL;
    }
    return c->hiredis_fns.createArray(task, elements);
}

/* Points ac's reader at the builders above (ac is the tasks' privdata).
 * It keeps its buffer up to the largest reply and one read (maxbuf):
 * hiredis would otherwise free a buffer that grew past 16 KiB each time it
 * is empty, and grow it again, 2 MiB at a time, for the next block; one
 * that a larger reply grew (the reply is cut) goes once empty. The buffer
 * holds at most a reply and one read more (reader_over). */
static void reader_hook(cluster_t *c, redisAsyncContext *ac)
{
    redisReader *r = ac->c.reader;
    if (!c->hiredis_fns.createString) {
        c->hiredis_fns = *r->fn;
        c->reply_fns = *r->fn;
        c->reply_fns.createString = create_string;
        c->reply_fns.createArray = create_array;
    }
    r->fn = &c->reply_fns;
    r->privdata = ac;
    r->maxbuf = c->max_reply_bytes + CLUSTER_READ_BYTES;
}

/* Opens the node's connection (not connected yet: hiredis queues commands
 * until it is) and sends AUTH first. Returns 0 or KVS_EIO. */
static int node_connect(cluster_node_t *n)
{
    cluster_t *c = n->cl;
    redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);
    if (!ac)
        return KVS_EIO;
    if (ac->err) {
        c->stats.connect_errors++;
        cl_log(c, LOGK_CONNECT, "cannot connect to %s:%d: %s", n->host, n->port, ac->errstr);
        redisAsyncFree(ac);
        node_mark_down(n);
        return KVS_EIO;
    }
    ac->data = n;
    n->cut = 0;
    n->reply_bytes = n->reply_elements = 0;
    reader_hook(c, ac);
    if (events_attach(ac, c->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        return KVS_EIO;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    n->ac = ac;
    n->fail_status = 0;
    n->down_until = 0;
    c->stats.connects++;
    if (c->pass) {
        const char *argv[3] = {"AUTH", NULL, NULL};
        size_t lens[3] = {4, 0, 0};
        int argc = 1;
        if (c->user) {
            argv[argc] = c->user;
            lens[argc++] = strlen(c->user);
        }
        argv[argc] = c->pass;
        lens[argc++] = strlen(c->pass);
        if (redisAsyncCommandArgv(ac, on_auth, n, argc, argv, lens) != REDIS_OK) {
            node_drop(n, KVS_EIO);
            return KVS_EIO;
        }
    }
    return 0;
}

/* ---- commands ---- */

static void req_unlink(cluster_req_t *q)
{
    cluster_t *c = q->cl;
    list_remove(&c->reqs, &q->link);
    c->stats.inflight--;
}

static void req_free(cluster_req_t *q)
{
    redisFreeCommand(q->cmd);
    free(q);
}

static void refresh_done(cluster_t *c, int status, redisReply *reply);
static void config_done(cluster_req_t *q, int status, const redisReply *reply);

/* Hands a SCAN's reply ([cursor, [key, ...]]) to its callback; a reply of
 * another shape is an error (KVS_EIO). */
static void scan_finish(cluster_req_t *q, int status, const redisReply *reply)
{
    const char **keys = NULL;
    size_t *lens = NULL;
    size_t n = 0;
    uint64_t cursor = 0;
    if (status == 0) {
        const redisReply *cur = reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2
                                    ? reply->element[0]
                                    : NULL;
        const redisReply *arr = cur ? reply->element[1] : NULL;
        char *end = NULL;
        if (cur && cur->type == REDIS_REPLY_STRING && arr->type == REDIS_REPLY_ARRAY) {
            cursor = strtoull(cur->str, &end, 10);
            keys = malloc((arr->elements + 1) * sizeof(*keys));
            lens = malloc((arr->elements + 1) * sizeof(*lens));
            for (size_t i = 0; keys && lens && i < arr->elements; i++) {
                if (arr->element[i]->type != REDIS_REPLY_STRING)
                    break;
                keys[n] = arr->element[i]->str;
                lens[n++] = arr->element[i]->len;
            }
        }
        if (!end || end == cur->str || *end != '\0' || n != arr->elements) {
            if (end && (!keys || !lens)) {
                status = KVS_ENOMEM;
            } else {
                q->cl->stats.reply_errors++;
                status = KVS_EIO;
            }
            n = 0;
            cursor = 0;
        }
    }
    q->scan_cb(q->arg, status, cursor, keys, lens, n);
    free(keys);
    free(lens);
}

/* Ends a command: counts it, runs its callback once, frees it. */
static void req_finish(cluster_req_t *q, int status, redisReply *reply)
{
    cluster_t *c = q->cl;
    req_unlink(q);
    if (q->kind == REQ_CONFIG) {
        /* Not the tier's traffic: a refused CONFIG is no node error. */
        if (status == 0)
            c->stats.ok++;
        config_done(q, status, reply);
        req_free(q);
        return;
    }
    if (status != 0 && status != KVS_ENOTFOUND && q->node >= 0 && q->node < c->n_nodes)
        c->nodes[q->node]->errors++;
    if (q->kind == REQ_REFRESH) {
        refresh_done(c, status, reply);
        req_free(q);
        return;
    }
    switch (status) {
    case 0:
        c->stats.ok++;
        break;
    case KVS_ENOTFOUND:
        c->stats.nil++;
        break;
    case KVS_ETIMEDOUT:
        c->stats.timeouts++;
        break;
    case KVS_EDENIED:
        c->stats.auth_errors++;
        break;
    case KVS_EPOOLFULL:
        c->stats.full++;
        break;
    case KVS_EIO:
        c->stats.down++;
        break;
    default:
        break;
    }
    if (q->kind == REQ_SCAN) {
        scan_finish(q, status, reply);
        req_free(q);
        return;
    }
    const char *data = NULL;
    size_t len = 0;
    char num[32];
    if (status == 0 && q->sunk) {
        len = q->sunk_len;
        c->stats.bytes_in += len;
    } else if (status == 0 && reply) {
        if (reply->type == REDIS_REPLY_INTEGER) {
            len = (size_t)snprintf(num, sizeof num, "%lld", reply->integer);
            data = num;
        } else if (reply->str) {
            data = reply->str;
            len = reply->len;
            c->stats.bytes_in += len;
        }
    }
    q->cb(q->arg, status, data, len);
    req_free(q);
}

/* Sends q to node i (after ASKING when asking). Returns 0, or KVS_EIO
 * when the node is down or cannot take it (q is then not sent). */
static int req_send(cluster_req_t *q, int i, int asking)
{
    cluster_t *c = q->cl;
    cluster_node_t *n = c->nodes[i];
    if (!n->ac) {
        if (node_is_down(c, n))
            return KVS_EIO;
        if (node_connect(n) != 0)
            return KVS_EIO;
    }
    if (asking && redisAsyncCommand(n->ac, NULL, NULL, "ASKING") != REDIS_OK)
        return KVS_EIO;
    if (redisAsyncFormattedCommand(n->ac, on_reply, q, q->cmd, q->cmd_len) != REDIS_OK)
        return KVS_EIO;
    q->node = i;
    q->sent_ns = uv_hrtime();
    n->requests++;
    c->stats.bytes_out += q->cmd_len;
    return 0;
}

/* A node to send to when the map does not say: the next one up, from a
 * rotating start so that refreshes do not all ask the same node. */
static int any_node(cluster_t *c)
{
    for (int k = 0; k < c->n_nodes; k++) {
        int i = (c->next_refresh_node + k) % c->n_nodes;
        if (!node_is_down(c, c->nodes[i])) {
            c->next_refresh_node = (i + 1) % c->n_nodes;
            return i;
        }
    }
    return -1;
}

static int route(cluster_t *c, const cluster_req_t *q)
{
    if (q->keyed && c->slots[q->slot] >= 0)
        return c->slots[q->slot];
    return any_node(c);
}

/* Parses "MOVED 3999 127.0.0.1:6381" or "ASK ...": the node's index (added
 * when new) and the slot. Returns -1 when the text is not one of them. */
static int parse_redirect(cluster_t *c, const char *s, size_t len, int *asking, int *slot)
{
    char text[128];
    if (len >= sizeof text)
        return -1;
    memcpy(text, s, len);
    text[len] = '\0';
    const char *rest;
    if (strncmp(text, "MOVED ", 6) == 0) {
        *asking = 0;
        rest = text + 6;
    } else if (strncmp(text, "ASK ", 4) == 0) {
        *asking = 1;
        rest = text + 4;
    } else {
        return -1;
    }
    char *end;
    long sl = strtol(rest, &end, 10);
    if (end == rest || *end != ' ' || sl < 0 || sl >= CLUSTER_SLOTS)
        return -1;
    const char *addr = end + 1;
    const char *colon = strrchr(addr, ':');
    if (!colon)
        return -1;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0')
        return -1;
    *slot = (int)sl;
    return node_get(c, addr, (size_t)(colon - addr), (int)port);
}

/* The status an error reply stands for. */
static int error_status(cluster_t *c, const redisReply *reply)
{
    const char *s = reply->str ? reply->str : "";
    if (strncmp(s, "NOAUTH", 6) == 0 || strncmp(s, "WRONGPASS", 9) == 0 ||
        strncmp(s, "NOPERM", 6) == 0)
        return KVS_EDENIED;
    if (strncmp(s, "OOM", 3) == 0) {
        /* A full node that may not evict (no maxmemory-policy): every
         * write is lost until the operator acts, so say it. */
        cl_log(c, LOGK_OOM,
               "refused a command: %.80s (%llu refused so far; give the masters "
               "maxmemory-policy allkeys-lru, docs/CLUSTER.md)",
               s, (unsigned long long)c->stats.full + 1);
        return KVS_EPOOLFULL;
    }
    if (strncmp(s, "CLUSTERDOWN", 11) == 0 || strncmp(s, "TRYAGAIN", 8) == 0 ||
        strncmp(s, "LOADING", 7) == 0 || strncmp(s, "MASTERDOWN", 10) == 0) {
        c->refresh_wanted = 1;
        return KVS_EIO;
    }
    c->stats.reply_errors++;
    cl_log(c, LOGK_REPLY, "error reply: %.80s", s);
    return KVS_EIO;
}

/* Follows a MOVED or ASK. Returns 1 when q was sent again, 0 when the
 * reply is no redirect, or a status to end q with. */
static int follow_redirect(cluster_t *c, cluster_req_t *q, const redisReply *reply)
{
    int asking = 0, slot = 0;
    int i = parse_redirect(c, reply->str, reply->len, &asking, &slot);
    if (i < 0)
        return 0;
    if (++q->redirects > CLUSTER_MAX_REDIRECTS)
        return KVS_EIO;
    if (asking) {
        c->stats.ask++;
    } else {
        c->stats.moved++;
        c->slots[slot] = (int16_t)i;
        c->refresh_wanted = 1;
    }
    return req_send(q, i, asking) == 0 ? 1 : KVS_EIO;
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    cluster_req_t *q = privdata;
    cluster_node_t *n = ac->data;
    cluster_t *c = q->cl;
    redisReply *reply = r;
    if (reply) {
        uint64_t us = (uv_hrtime() - q->sent_ns) / 1000;
        n->replies++;
        n->latency_us_sum += us;
        if (us > n->latency_us_max)
            n->latency_us_max = us;
    }
    if (!reply) {
        /* The connection went away (lost, refused, or ended by a deadline
         * or cluster_close): fail_status says which. */
        if (n->ac == ac) {
            n->ac = NULL;
            n->fail_status = KVS_EIO;
            node_mark_down(n);
        }
        req_finish(q, n->fail_status ? n->fail_status : KVS_EIO, NULL);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR && q->kind == REQ_CONFIG) {
        /* Renamed, an ACL, a managed Redis: the check says so at INFO. */
        req_finish(q, KVS_EDENIED, reply);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        int st = follow_redirect(c, q, reply);
        if (st == 1)
            return;
        req_finish(q, st != 0 ? st : error_status(c, reply), NULL);
        return;
    }
    if (reply->type == REDIS_REPLY_NIL) {
        req_finish(q, KVS_ENOTFOUND, NULL);
        return;
    }
    req_finish(q, 0, reply);
}

static cluster_req_t *req_new(cluster_t *c, req_kind_t kind, const void *key, size_t klen, int argc,
                              const char **argv, const size_t *argvlen)
{
    cluster_req_t *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    long long len = redisFormatCommandArgv(&q->cmd, argc, argv, argvlen);
    if (len < 0) {
        free(q);
        return NULL;
    }
    q->cmd_len = (size_t)len;
    q->cl = c;
    q->kind = kind;
    q->keyed = key != NULL;
    q->slot = key ? crc16_key_slot(key, klen) : 0;
    q->deadline = cl_now(c) + c->timeout_ms;
    return q;
}

static void req_link(cluster_req_t *q)
{
    cluster_t *c = q->cl;
    list_push_back(&c->reqs, &q->link);
    c->stats.inflight++;
}

static int command_send(cluster_t *c, const void *key, size_t klen, int argc, const char **argv,
                        const size_t *argvlen, cluster_sink_cb sink, cluster_reply_cb cb, void *arg)
{
    if (!c || !cb || argc <= 0 || !argv)
        return KVS_EINVAL;
    if (c->closing)
        return KVS_EBADSTATE;
    /* Called between loop turns too (after a blocking step): the deadline
     * counts from now, not from the turn's start. */
    uv_update_time(c->loop);
    if (c->stats.inflight >= c->max_inflight) {
        c->stats.busy++;
        return KVS_EBUSY;
    }
    cluster_req_t *q = req_new(c, REQ_USER, key, klen, argc, argv, argvlen);
    if (!q)
        return KVS_ENOMEM;
    q->cb = cb;
    q->sink = sink;
    q->arg = arg;
    int i = route(c, q);
    int rc = i < 0 ? KVS_EIO : req_send(q, i, 0);
    if (rc != 0) {
        c->stats.down++;
        c->refresh_wanted = 1;
        req_free(q);
        return rc;
    }
    req_link(q);
    c->stats.commands++;
    return 0;
}

int cluster_command(cluster_t *c, const void *key, size_t klen, int argc, const char **argv,
                    const size_t *argvlen, cluster_reply_cb cb, void *arg)
{
    return command_send(c, key, klen, argc, argv, argvlen, NULL, cb, arg);
}

int cluster_get(cluster_t *c, const void *key, size_t klen, cluster_reply_cb cb, void *arg)
{
    return cluster_get_sink(c, key, klen, NULL, cb, arg);
}

int cluster_get_sink(cluster_t *c, const void *key, size_t klen, cluster_sink_cb sink,
                     cluster_reply_cb cb, void *arg)
{
    const char *argv[2] = {"GET", key};
    size_t lens[2] = {3, klen};
    return command_send(c, key, klen, 2, argv, lens, sink, cb, arg);
}

int cluster_set(cluster_t *c, const void *key, size_t klen, const void *value, size_t vlen,
                cluster_reply_cb cb, void *arg)
{
    const char *argv[3] = {"SET", key, value};
    size_t lens[3] = {3, klen, vlen};
    return cluster_command(c, key, klen, 3, argv, lens, cb, arg);
}

int cluster_scan(cluster_t *c, int node, uint64_t cursor, const char *match, uint32_t count,
                 cluster_scan_cb cb, void *arg)
{
    if (!c || !cb || !match || count == 0 || node < 0 || node >= c->n_nodes)
        return KVS_EINVAL;
    if (c->closing)
        return KVS_EBADSTATE;
    uv_update_time(c->loop);
    if (c->stats.inflight >= c->max_inflight) {
        c->stats.busy++;
        return KVS_EBUSY;
    }
    char cur[24], cnt[12];
    snprintf(cur, sizeof cur, "%llu", (unsigned long long)cursor);
    snprintf(cnt, sizeof cnt, "%u", count);
    const char *argv[6] = {"SCAN", cur, "MATCH", match, "COUNT", cnt};
    size_t lens[6] = {4, strlen(cur), 5, strlen(match), 5, strlen(cnt)};
    cluster_req_t *q = req_new(c, REQ_SCAN, NULL, 0, 6, argv, lens);
    if (!q)
        return KVS_ENOMEM;
    q->scan_cb = cb;
    q->arg = arg;
    if (req_send(q, node, 0) != 0) {
        c->stats.down++;
        req_free(q);
        return KVS_EIO;
    }
    req_link(q);
    c->stats.commands++;
    return 0;
}

size_t cluster_masters(const cluster_t *c, int *out, size_t max)
{
    uint8_t is_master[CLUSTER_MAX_NODES] = {0};
    for (int s = 0; s < CLUSTER_SLOTS; s++)
        if (c->slots[s] >= 0)
            is_master[c->slots[s]] = 1;
    size_t n = 0;
    for (int i = 0; i < c->n_nodes && n < max; i++)
        if (is_master[i])
            out[n++] = i;
    return n;
}

/* ---- the slot map ---- */

/* Reads one CLUSTER SLOTS entry: [start, end, [host, port, id...], replicas...].
 * Returns the master's node index, or -1 when malformed. */
static int slots_entry(cluster_t *c, const redisReply *e, int *start, int *end)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3)
        return -1;
    const redisReply *s = e->element[0], *t = e->element[1], *m = e->element[2];
    if (s->type != REDIS_REPLY_INTEGER || t->type != REDIS_REPLY_INTEGER ||
        m->type != REDIS_REPLY_ARRAY || m->elements < 2)
        return -1;
    if (s->integer < 0 || t->integer >= CLUSTER_SLOTS || s->integer > t->integer)
        return -1;
    const redisReply *host = m->element[0], *port = m->element[1];
    if (host->type != REDIS_REPLY_STRING || port->type != REDIS_REPLY_INTEGER)
        return -1;
    *start = (int)s->integer;
    *end = (int)t->integer;
    return node_get(c, host->str, host->len, (int)port->integer);
}

static void refresh_done(cluster_t *c, int status, redisReply *reply)
{
    c->refreshing = 0;
    if (status != 0 || !reply || reply->type != REDIS_REPLY_ARRAY) {
        c->stats.refresh_errors++;
        c->refresh_wanted = 1;
        cl_log(c, LOGK_REFRESH, "cannot read the slot map (%s)", kvs_status_text(status));
        return;
    }
    int16_t map[CLUSTER_SLOTS];
    for (int s = 0; s < CLUSTER_SLOTS; s++)
        map[s] = -1;
    for (size_t k = 0; k < reply->elements; k++) {
        int start, end;
        int i = slots_entry(c, reply->element[k], &start, &end);
        if (i < 0)
            continue;
        for (int s = start; s <= end; s++)
            map[s] = (int16_t)i;
    }
    memcpy(c->slots, map, sizeof map);
    c->stats.refreshes++;
    /* A slot still served by a node that is down: the cluster has not
     * failed over yet; look again soon. */
    for (int s = 0; s < CLUSTER_SLOTS; s++) {
        if (map[s] < 0 || node_is_down(c, c->nodes[map[s]])) {
            c->refresh_wanted = 1;
            break;
        }
    }
}

/* Sends CLUSTER SLOTS to a node that is up, if no refresh is running. */
static void refresh_start(cluster_t *c)
{
    if (c->refreshing || c->closing)
        return;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    size_t lens[2] = {7, 5};
    for (int tries = 0; tries < c->n_nodes; tries++) {
        int i = any_node(c);
        if (i < 0)
            break;
        cluster_req_t *q = req_new(c, REQ_REFRESH, NULL, 0, 2, argv, lens);
        if (!q)
            return;
        if (req_send(q, i, 0) != 0) {
            req_free(q);
            continue;
        }
        req_link(q);
        c->refreshing = 1;
        c->refresh_wanted = 0;
        c->last_refresh = cl_now(c);
        return;
    }
    c->stats.refresh_errors++;
    c->last_refresh = cl_now(c);
}

/* Ends commands past their deadline (by ending their node's connection) and
 * refreshes the map when asked to. */
static void on_tick(uv_timer_t *t)
{
    cluster_t *c = t->data;
    uint64_t now = cl_now(c);
    for (cluster_req_t *q; (q = LIST_FIRST(&c->reqs, cluster_req_t, link)) && q->deadline <= now;) {
        cluster_node_t *n = c->nodes[q->node];
        if (!n->ac)
            break; /* cannot happen outside a hiredis callback */
        cl_log(c, LOGK_TIMEOUT, "%s:%d did not answer within %u ms", n->host, n->port,
               c->timeout_ms);
        node_drop(n, KVS_ETIMEDOUT);
        if (LIST_FIRST(&c->reqs, cluster_req_t, link) == q)
            break;
    }
    if (c->refresh_wanted && now - c->last_refresh >= CLUSTER_REFRESH_MS)
        refresh_start(c);
}

/* ---- life ---- */

/* Reads the credentials: one line (password) or two (user, password).
 * Returns 0 or KVS_EIO; the file's text is never logged. */
static int read_auth(cluster_t *c, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        LOG_ERROR("cluster: cannot open the auth file %s: %s", path, strerror(errno));
        return KVS_EIO;
    }
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *line2 = strchr(buf, '\n');
    if (line2) {
        *line2++ = '\0';
        line2[strcspn(line2, "\r\n")] = '\0';
    }
    buf[strcspn(buf, "\r")] = '\0';
    int rc = KVS_EIO;
    if (line2 && *line2) {
        c->user = strdup(buf);
        c->pass = strdup(line2);
    } else {
        c->pass = strdup(buf);
    }
    if (c->pass && *c->pass && (!line2 || !*line2 || c->user))
        rc = 0;
    else
        LOG_ERROR("cluster: the auth file %s holds no password", path);
    memset(buf, 0, sizeof buf);
    return rc;
}

static int parse_seeds(cluster_t *c, const char *seeds)
{
    const char *p = seeds;
    while (*p) {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        if (!colon)
            return KVS_EINVAL;
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end != p + len || node_get(c, p, (size_t)(colon - p), (int)port) < 0)
            return KVS_EINVAL;
        p += len;
        if (*p == ',')
            p++;
    }
    return c->n_nodes > 0 ? 0 : KVS_EINVAL;
}

static void wipe_free(char *s)
{
    if (s) {
        memset(s, 0, strlen(s));
        free(s);
    }
}

static void cluster_free(cluster_t *c)
{
    for (int i = 0; i < c->n_nodes; i++)
        free(c->nodes[i]);
    wipe_free(c->user);
    wipe_free(c->pass);
    free(c);
}

static void on_timer_closed(uv_handle_t *h)
{
    cluster_free(h->data);
}

int cluster_new(uv_loop_t *loop, const cluster_options_t *opt, cluster_t **out)
{
    if (!loop || !opt || !opt->seeds || !out)
        return KVS_EINVAL;
    cluster_t *c = calloc(1, sizeof *c);
    if (!c)
        return KVS_ENOMEM;
    c->loop = loop;
    /* The loop's clock may be old (a loop made long before): deadlines
     * count from now. */
    uv_update_time(loop);
    c->timeout_ms = opt->timeout_ms ? opt->timeout_ms : 1000;
    c->max_inflight = opt->max_inflight ? opt->max_inflight : 1024;
    c->max_reply_bytes = opt->max_reply_bytes > CLUSTER_REPLY_MIN_BYTES ? opt->max_reply_bytes
                                                                        : CLUSTER_REPLY_MIN_BYTES;
    for (int s = 0; s < CLUSTER_SLOTS; s++)
        c->slots[s] = -1;
    int rc = parse_seeds(c, opt->seeds);
    if (rc == 0 && opt->auth_file)
        rc = read_auth(c, opt->auth_file);
    if (rc == 0 && uv_timer_init(loop, &c->timer) != 0)
        rc = KVS_ENOMEM;
    if (rc != 0) {
        cluster_free(c);
        return rc;
    }
    c->timer.data = c;
    uv_timer_start(&c->timer, on_tick, CLUSTER_TICK_MS, CLUSTER_TICK_MS);
    refresh_start(c);
    *out = c;
    return 0;
}

void cluster_close(cluster_t *c)
{
    if (!c || c->closing)
        return;
    c->closing = 1;
    for (int i = 0; i < c->n_nodes; i++)
        node_drop(c->nodes[i], KVS_EBADSTATE);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

int cluster_ready(const cluster_t *c)
{
    if (!c || c->stats.refreshes == 0)
        return 0;
    for (int s = 0; s < CLUSTER_SLOTS; s++)
        if (c->slots[s] < 0)
            return 0;
    return 1;
}

void cluster_get_stats(const cluster_t *c, cluster_stats_t *out)
{
    *out = c->stats;
    out->nodes_up = 0;
    for (int i = 0; i < c->n_nodes; i++)
        if (!node_is_down(c, c->nodes[i]))
            out->nodes_up++;
}

size_t cluster_get_nodes(const cluster_t *c, cluster_node_stats_t *out, size_t max)
{
    size_t n = (size_t)c->n_nodes < max ? (size_t)c->n_nodes : max;
    for (size_t i = 0; i < n; i++) {
        const cluster_node_t *nd = c->nodes[i];
        cluster_node_stats_t *o = &out[i];
        memset(o, 0, sizeof *o);
        snprintf(o->addr, sizeof o->addr, "%s:%d", nd->host, nd->port);
        o->state = node_is_down(c, nd) ? CLUSTER_NODE_DOWN
                   : nd->ac            ? CLUSTER_NODE_CONNECTED
                                       : CLUSTER_NODE_IDLE;
        if (o->state == CLUSTER_NODE_CONNECTED && nd->auth_refused)
            o->state = CLUSTER_NODE_AUTH_REFUSED;
        o->requests = nd->requests;
        o->errors = nd->errors;
        o->replies = nd->replies;
        o->latency_us_sum = nd->latency_us_sum;
        o->latency_us_max = nd->latency_us_max;
    }
    for (int s = 0; s < CLUSTER_SLOTS; s++)
        if (c->slots[s] >= 0 && (size_t)c->slots[s] < n)
            out[c->slots[s]].slots++;
    return n;
}

size_t cluster_unsent_bytes(const cluster_t *c)
{
    size_t n = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        const redisAsyncContext *ac = c->nodes[i]->ac;
        if (ac && ac->c.obuf)
            n += sdslen(ac->c.obuf);
    }
    return n;
}

const char *cluster_node_state_name(uint32_t state)
{
    switch (state) {
    case CLUSTER_NODE_IDLE:
        return "idle";
    case CLUSTER_NODE_CONNECTED:
        return "connected";
    case CLUSTER_NODE_DOWN:
        return "down";
    case CLUSTER_NODE_AUTH_REFUSED:
        return "auth-refused";
    default:
        return "?";
    }
}

const char *cluster_slot_node(const cluster_t *c, uint16_t slot, char *buf, size_t len)
{
    if (len == 0)
        return buf;
    buf[0] = '\0';
    if (slot < CLUSTER_SLOTS && c->slots[slot] >= 0) {
        const cluster_node_t *n = c->nodes[c->slots[slot]];
        snprintf(buf, len, "%s:%d", n->host, n->port);
    }
    return buf;
}

/* ---- the masters' eviction settings (cluster.h) ---- */

/* Masters one log line names at most; the rest are counted. */
#define SETTINGS_NAMED 8
/* maxmemory per slot may differ this much between masters (percent). */
#define SETTINGS_SPREAD_PCT 25

typedef struct settings_check {
    cluster_t *c;
    cluster_check_cb done;
    void *arg;
    size_t n, pending;
    cluster_settings_t m[CLUSTER_MAX_NODES];
    int ok[CLUSTER_MAX_NODES];       /* 1: m[i] was read */
    char why[CLUSTER_MAX_NODES][96]; /* else why not (escaped) */
} settings_check_t;

/* A line under construction: appends stop quietly at its end. */
typedef struct line {
    char buf[900];
    size_t len;
} line_t;

__attribute__((format(printf, 2, 3))) static void add(line_t *l, const char *fmt, ...)
{
    if (l->len >= sizeof l->buf - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->buf + l->len, sizeof l->buf - l->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        l->len += (size_t)n < sizeof l->buf - l->len ? (size_t)n : sizeof l->buf - 1 - l->len;
}

/* The problems of one master (bit per kind). */
enum { P_POLICY = 1, P_SAMPLES = 2, P_UNLIMITED = 4 };

static unsigned problems_of(const cluster_settings_t *s)
{
    unsigned p = 0;
    if (strcmp(s->policy, "allkeys-lru") != 0)
        p |= P_POLICY;
    if (s->samples < CLUSTER_SETTINGS_SAMPLES)
        p |= P_SAMPLES;
    if (s->have_maxmemory && s->maxmemory == 0)
        p |= P_UNLIMITED;
    return p;
}

/* Whether a and b have problem kind with the same value. */
static int same_problem(const cluster_settings_t *a, const cluster_settings_t *b, unsigned kind)
{
    if (!(problems_of(a) & kind) || !(problems_of(b) & kind))
        return 0;
    if (kind == P_POLICY)
        return strcmp(a->policy, b->policy) == 0;
    if (kind == P_SAMPLES)
        return a->samples == b->samples;
    return 1;
}

/* "on K of N masters (a, b, ...)": the masters from i on with the same
 * problem of kind as m[i]. */
static void add_masters(line_t *l, const cluster_settings_t *m, size_t n, size_t i, unsigned kind)
{
    size_t k = 0, named = 0;
    for (size_t j = i; j < n; j++)
        k += same_problem(&m[i], &m[j], kind) ? 1 : 0;
    add(l, " on %zu of %zu master%s (", k, n, n == 1 ? "" : "s");
    for (size_t j = i; j < n; j++) {
        if (!same_problem(&m[i], &m[j], kind))
            continue;
        if (named == SETTINGS_NAMED) {
            add(l, " and %zu more", k - named);
            break;
        }
        add(l, "%s%s", named ? ", " : "", m[j].addr);
        named++;
    }
    add(l, ")");
}

static const char *const DOCS = "docs/CLUSTER.md, Sizing Redis; docs/EVICTION.md, Several nodes "
                                "and the cluster tier";

static void warn_policy(line_t *l, const char *policy)
{
    add(l, "; recommended allkeys-lru: ");
    if (strcmp(policy, "noeviction") == 0)
        add(l, "a full master refuses every write with OOM, so the tier takes no new block once "
               "full, counted in kvshare_cluster_oom_refusals_total");
    else if (strncmp(policy, "volatile-", 9) == 0)
        add(l, "kvshare's values carry no TTL, so it never evicts them: a full master refuses "
               "every write with OOM, as with noeviction, counted in "
               "kvshare_cluster_oom_refusals_total");
    else if (strcmp(policy, "allkeys-lfu") == 0)
        add(l, "in the 4-node replays it gave 0.631x the hit rate of one node with 4x the pool "
               "(0.648x with 10 samples), allkeys-lru with maxmemory-samples 64 0.953x: its "
               "counters tie and it drops a conversation's freshest blocks");
    else if (strcmp(policy, "allkeys-random") == 0)
        add(l, "it drops blocks at random, and a block dropped from the middle of a chain loses "
               "the rest of the chain for every node (not measured; allkeys-lru with "
               "maxmemory-samples 64 gave 0.953x one node with 4x the pool in the 4-node replays)");
    else
        add(l, "a policy this check does not know");
}

static void warn_samples(line_t *l, long long samples)
{
    add(l,
        "; recommended %d: Redis's LRU drops the idlest of that many random keys, and a "
        "block dropped from the middle of a chain loses the rest of the chain for every node; "
        "in the 4-node replays ",
        CLUSTER_SETTINGS_SAMPLES);
    if (samples < 0)
        add(l, "(the master did not say its samples) ");
    else if (samples < 5)
        add(l, "fewer than Redis's default 5 were not measured (5 gave 0.898x) ");
    else if (samples < 10)
        add(l, "5 samples gave 0.898x ");
    else if (samples < 20)
        add(l, "10 samples gave 0.929x ");
    else
        add(l, "20 samples gave 0.943x ");
    add(l, "the hit rate of one node with 4x the pool, %d gave 0.953x", CLUSTER_SETTINGS_SAMPLES);
}

/* The masters' values of one setting, when they are not all equal. */
static uint32_t warn_disagree(const cluster_settings_t *m, size_t n, int what)
{
    int differ = 0;
    for (size_t i = 1; i < n && !differ; i++)
        differ = what == 0 ? strcmp(m[i].policy, m[0].policy) != 0 : m[i].samples != m[0].samples;
    if (!differ)
        return 0;
    line_t l = {.len = 0};
    add(&l, "cluster: the masters disagree on %s (",
        what == 0 ? "maxmemory-policy" : "maxmemory-samples");
    for (size_t i = 0; i < n && i < SETTINGS_NAMED; i++) {
        if (what == 0)
            add(&l, "%s%s %s", i ? ", " : "", m[i].addr, m[i].policy[0] ? m[i].policy : "?");
        else
            add(&l, "%s%s %lld", i ? ", " : "", m[i].addr, m[i].samples);
    }
    if (n > SETTINGS_NAMED)
        add(&l, " and %zu more", n - SETTINGS_NAMED);
    add(&l,
        "); give every master allkeys-lru and maxmemory-samples %d: each master evicts only "
        "its own slots' keys, and a chain loses its rest where one of its blocks lands on "
        "the master with the worse setting (%s)",
        CLUSTER_SETTINGS_SAMPLES, DOCS);
    LOG_WARN("%s", l.buf);
    return 1;
}

/* maxmemory per slot apart by more than SETTINGS_SPREAD_PCT among the
 * masters with a limit and slots. */
static uint32_t warn_spread(const cluster_settings_t *m, size_t n)
{
    double lo = 0, hi = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!m[i].have_maxmemory || m[i].maxmemory == 0 || m[i].slots == 0)
            continue;
        double per = (double)m[i].maxmemory / m[i].slots;
        lo = k == 0 || per < lo ? per : lo;
        hi = k == 0 || per > hi ? per : hi;
        k++;
    }
    if (k < 2 || hi * 100 <= lo * (100 + SETTINGS_SPREAD_PCT))
        return 0;
    line_t l = {.len = 0};
    add(&l, "cluster: the masters' maxmemory per slot differs by %.0f %% (", (hi / lo - 1) * 100);
    size_t named = 0;
    for (size_t i = 0; i < n && named < SETTINGS_NAMED; i++) {
        if (!m[i].have_maxmemory || m[i].maxmemory == 0 || m[i].slots == 0)
            continue;
        add(&l, "%s%s %llu bytes for %u slots", named++ ? ", " : "", m[i].addr, m[i].maxmemory,
            m[i].slots);
    }
    add(&l,
        "); recommended: the same maxmemory per slot on every master: each master evicts "
        "only its own slots' keys, so the one with less per slot drops blocks younger than the "
        "others keep, and a chain loses its rest there (%s)",
        DOCS);
    LOG_WARN("%s", l.buf);
    return 1;
}

uint32_t cluster_settings_judge(const cluster_settings_t *m, size_t n)
{
    static const unsigned kinds[] = {P_POLICY, P_SAMPLES, P_UNLIMITED};
    uint32_t warnings = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        unsigned kind = kinds[k];
        for (size_t i = 0; i < n; i++) {
            if (!(problems_of(&m[i]) & kind))
                continue;
            int seen = 0;
            for (size_t j = 0; j < i && !seen; j++)
                seen = same_problem(&m[j], &m[i], kind);
            if (seen)
                continue; /* its line named it already */
            line_t l = {.len = 0};
            if (kind == P_POLICY) {
                add(&l, "cluster: maxmemory-policy %s",
                    m[i].policy[0] ? m[i].policy : "(not given)");
                add_masters(&l, m, n, i, kind);
                warn_policy(&l, m[i].policy);
            } else if (kind == P_SAMPLES) {
                add(&l, "cluster: maxmemory-samples %lld", m[i].samples);
                add_masters(&l, m, n, i, kind);
                warn_samples(&l, m[i].samples);
            } else {
                add(&l, "cluster: maxmemory 0 (no limit)");
                add_masters(&l, m, n, i, kind);
                add(&l, "; recommended: a maxmemory sized for the tier on every master: without "
                        "one Redis never evicts, whatever the policy, and grows until the host "
                        "runs out of memory");
            }
            add(&l, " (%s)", DOCS);
            LOG_WARN("%s", l.buf);
            warnings++;
        }
    }
    warnings += warn_disagree(m, n, 0);
    warnings += warn_disagree(m, n, 1);
    warnings += warn_spread(m, n);
    return warnings;
}

/* Every master answered or failed: judge, log, tell. */
static void check_end(settings_check_t *k)
{
    uint32_t warnings = 0, checked = 0, unchecked = 0;
    cluster_settings_t read[CLUSTER_MAX_NODES];
    line_t l = {.len = 0};
    for (size_t i = 0; i < k->n; i++) {
        if (k->ok[i])
            read[checked++] = k->m[i];
        else
            unchecked++;
    }
    /* "a, b: why; c: why": the masters of one reason together, at most
     * SETTINGS_NAMED named. */
    size_t named = 0;
    for (size_t i = 0; i < k->n; i++) {
        int seen = k->ok[i];
        for (size_t j = 0; j < i && !seen; j++)
            seen = !k->ok[j] && strcmp(k->why[j], k->why[i]) == 0;
        if (seen)
            continue;
        if (named >= SETTINGS_NAMED) {
            add(&l, "; ...");
            break;
        }
        add(&l, "%s", named ? "; " : "");
        for (size_t j = i, first = 1; j < k->n; j++) {
            if (k->ok[j] || strcmp(k->why[j], k->why[i]) != 0)
                continue;
            if (named++ == SETTINGS_NAMED) {
                add(&l, ", ...");
                break;
            }
            add(&l, "%s%s", first ? "" : ", ", k->m[j].addr);
            first = 0;
        }
        add(&l, ": %s", k->why[i]);
        if (named > SETTINGS_NAMED)
            break; /* its "..." stands for the rest */
    }
    if (!k->c->closing) {
        if (unchecked)
            LOG_INFO("cluster: the eviction settings of %u of %zu masters could not be checked "
                     "(%s); not an error, but set maxmemory-policy allkeys-lru, "
                     "maxmemory-samples %d and a maxmemory on every master by hand (%s)",
                     unchecked, k->n, l.buf, CLUSTER_SETTINGS_SAMPLES, DOCS);
        if (checked) {
            warnings = cluster_settings_judge(read, checked);
            LOG_INFO("cluster: eviction settings of %u master%s checked: %u problem%s%s", checked,
                     checked == 1 ? "" : "s", warnings, warnings == 1 ? "" : "s",
                     warnings ? " (logged above; kvshare_cluster_settings_warnings)" : "");
        }
    }
    k->done(k->arg, warnings, checked, unchecked);
    free(k);
}

/* "name", "value", ... of CONFIG GET maxmemory* into s. */
static int config_parse(cluster_settings_t *s, const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0)
        return -1;
    for (size_t i = 0; i < r->elements; i += 2) {
        const redisReply *name = r->element[i], *value = r->element[i + 1];
        if (name->type != REDIS_REPLY_STRING || value->type != REDIS_REPLY_STRING)
            return -1;
        char *end = NULL;
        if (strcmp(name->str, "maxmemory-policy") == 0) {
            snprintf(s->policy, sizeof s->policy, "%s", value->str);
        } else if (strcmp(name->str, "maxmemory-samples") == 0) {
            s->samples = strtoll(value->str, &end, 10);
            if (end == value->str)
                s->samples = -1;
        } else if (strcmp(name->str, "maxmemory") == 0) {
            s->maxmemory = strtoull(value->str, &end, 10);
            s->have_maxmemory = end != value->str;
        }
    }
    return 0;
}

static void config_done(cluster_req_t *q, int status, const redisReply *reply)
{
    settings_check_t *k = q->check;
    int i = q->check_i;
    if (status == 0 && config_parse(&k->m[i], reply) == 0) {
        k->ok[i] = 1;
    } else if (status == KVS_EDENIED && reply && reply->str) {
        char text[80];
        snprintf(k->why[i], sizeof k->why[i], "CONFIG GET refused: %s",
                 log_escape(reply->str, text, sizeof text));
    } else {
        snprintf(k->why[i], sizeof k->why[i], "CONFIG GET %s",
                 status == 0 ? "answered with another shape" : kvs_status_text(status));
    }
    if (--k->pending == 0)
        check_end(k);
}

int cluster_check_settings(cluster_t *c, cluster_check_cb done, void *arg)
{
    if (!c || !done)
        return KVS_EINVAL;
    if (c->closing || !cluster_ready(c))
        return KVS_EBADSTATE;
    settings_check_t *k = calloc(1, sizeof *k);
    if (!k)
        return KVS_ENOMEM;
    k->c = c;
    k->done = done;
    k->arg = arg;
    int masters[CLUSTER_MAX_NODES];
    k->n = cluster_masters(c, masters, CLUSTER_MAX_NODES);
    uint32_t slots[CLUSTER_MAX_NODES] = {0};
    for (int s = 0; s < CLUSTER_SLOTS; s++)
        slots[c->slots[s]]++;
    const char *argv[3] = {"CONFIG", "GET", "maxmemory*"};
    size_t lens[3] = {6, 3, 10};
    uv_update_time(c->loop);
    k->pending = k->n + 1; /* one more until every command is sent */
    for (size_t i = 0; i < k->n; i++) {
        const cluster_node_t *nd = c->nodes[masters[i]];
        cluster_settings_t *s = &k->m[i];
        snprintf(s->addr, sizeof s->addr, "%s:%d", nd->host, nd->port);
        s->slots = slots[masters[i]];
        s->samples = -1;
        cluster_req_t *q = req_new(c, REQ_CONFIG, NULL, 0, 3, argv, lens);
        if (!q || req_send(q, masters[i], 0) != 0) {
            snprintf(k->why[i], sizeof k->why[i], "%s", q ? "the node is down" : "out of memory");
            if (q)
                req_free(q);
            k->pending--;
            continue;
        }
        q->check = k;
        q->check_i = (int)i;
        req_link(q);
        c->stats.commands++;
    }
    if (--k->pending == 0)
        check_end(k);
    return 0;
}
