/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvshare: synchronous calls over the daemon's socket.
 *
 * Each call packs one Request frame, writes it and reads frames until the
 * Response with the same id, everything under one deadline (the blocking
 * socket's timeouts are kept within 5 ms of it). Any I/O error, timeout or
 * undecodable reply drops the connection; the next call reconnects (Hello
 * again, pool mapped again). fds come with the Hello reply (SCM_RIGHTS), read
 * with recvmsg.
 *
 * The pool mapping outlives a dropped connection only until the next call
 * that needs the daemon: that call unmaps it before reconnecting, so a
 * restarted daemon finds the GPU memory of the old pool released by every
 * worker that made a call, even while it cannot yet reconnect. A client
 * belongs to the process that connected it: in a forked child every call
 * fails with "reconnect from the new process" (the socket is shared with
 * the parent, and a CUDA mapping does not survive fork).
 *
 * The circuit breaker (KVS_BREAKER): a call that finds the daemon
 * unreachable or silent ends with the connection dropped; breaker_after then
 * marks the client down and starts the probe thread. While down, ensure()
 * answers every call at once. The probe thread owns only its socket and the
 * atomics of struct breaker; when a probe is answered it sets down = 0 and
 * ends, and the next call joins it and reconnects. Up, the breaker costs the
 * healthy path nothing: ensure() looks at it only when there is no
 * connection.
 *
 *     call fails, fd < 0 --breaker_after-> down (probe thread: wait, probe, ...)
 *          ^                                 | a probe answered: down = 0
 *          +-- up: the next call joins the thread and reconnects <--+
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include "backend.h"
#include "errbuf.h"
#include "frame_header.h"
#include "geometry.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "kvshare_rpcs.h"
#include "now.h"
#include "socket_path.h"
#include "wire.h"

#define CLIENT_MAX_REPLY (256u << 20)
#define CLIENT_MAX_FDS   (BACKEND_MAX_SLABS + 1) /* the pool's slabs, and tier 2's */

/* The breaker's probes: the first BREAKER_FIRST_MS after a trip, then the
 * wait doubles up to BREAKER_MAX_MS; each probe (connect and Ping) waits at
 * most BREAKER_PROBE_MS for its answer. */
#define BREAKER_FIRST_MS 50
#define BREAKER_MAX_MS   2000
#define BREAKER_PROBE_MS 200
/* ensure()'s answer while the breaker is down: no attempt was made (the
 * caller returns KVS_ENOTCONN, and it is no new trip). Never returned. */
#define CLIENT_FAST_FAIL 1

/* The circuit breaker (KVS_BREAKER). thread_live and wake_fd belong to the
 * client's thread; the probe thread reads wake_fd (fixed while it runs)
 * and writes only the atomics. */
struct breaker {
    pthread_t thread;
    int thread_live; /* started and not yet joined */
    int wake_fd;     /* eventfd: kvs_close wakes the probe; -1 until the first trip */
    atomic_int down; /* 1 from a trip until a probe is answered */
    atomic_uint_fast64_t trips, probes, fast_fails;
    atomic_int_fast64_t down_since_ms;
};

struct kvs_client {
    char socket_path[SOCKET_PATH_MAX];
    char worker[64];
    int timeout_ms;
    int reconnect_ms;
    unsigned flags;
    uint64_t daemon_uid; /* trusted besides our own uid and root; 0: none */

    pid_t pid;      /* the process that connected: the socket and mapping are its */
    unsigned forks; /* fork_count when it connected (own_process) */
    int fd;
    uint64_t epoch;
    uint64_t next_id;
    int64_t last_attempt_ms;

    kvs_geometry_t geo;
    int have_geo;
    uint32_t rank;       /* kvs_options_t.rank, sent with KVS_RANK */
    uint32_t group_size; /* from the Hello reply */
    /* The identity declared in Hello (kvs_options_t.identity), copied */
    int has_ident;
    kvs_identity_t ident;
    char ident_ns[128], ident_model[256], ident_rev[64], ident_dtype[16];
    char ident_text[513]; /* the daemon's, from the Hello reply ("" when it said none) */
    uint64_t ident_hash;
    int in_hello;       /* the next reply may carry fds */
    int rcv_ms, snd_ms; /* the socket's current timeouts */
    backend_mapping_t *map;
    backend_mapping_t *tier2_map; /* read-only, with KVS_MAP_TIER2 and a tier 2 */

    uint8_t *rbuf;
    size_t rlen, rcap;
    uint8_t *wbuf;
    size_t wcap;
    int fds[CLIENT_MAX_FDS];
    size_t n_fds;

    char err[1024]; /* room for a refusal naming two model identities */
    struct breaker brk;
};

/* Records the message of a failed call (kvs_last_error) and returns its status. */
#define set_err(c, status, ...) errbuf_set((c)->err, sizeof((c)->err), (status), __VA_ARGS__)

static void drop_fds(kvs_client_t *c)
{
    for (size_t i = 0; i < c->n_fds; i++)
        close(c->fds[i]);
    c->n_fds = 0;
}

/* Drops the connection; the mapping stays until the next call that needs
 * the daemon (unmap_stale_pool), so a worker in the middle of a read does not
 * fault. */
static void disconnect(kvs_client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->rlen = 0;
    drop_fds(c);
}

/* After a dropped connection: lets go of the old pool, so that its memory
 * (device memory, with cuda) is freed once every worker has done so, even
 * if no daemon answers yet. Our own copies are synchronous, so none is in
 * flight here; backend_unmap waits for device work still reading it. */
static void unmap_stale_pool(kvs_client_t *c)
{
    if (c->fd >= 0)
        return;
    backend_unmap(c->map);
    c->map = NULL;
    backend_unmap(c->tier2_map);
    c->tier2_map = NULL;
}

/* Forks this process has made, counted in the child: every call asks
 * whether it runs in the process that connected, and a load answers that
 * where getpid() is a system call per call (and per block address). A child
 * made without glibc's fork (a raw clone) is not counted: fork_watched
 * false falls back to getpid, and such a child is unsupported anyway. */
static atomic_uint fork_count;
static bool fork_watched;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
    atomic_fetch_add_explicit(&fork_count, 1, memory_order_relaxed);
}

static void fork_watch(void)
{
    fork_watched = pthread_atfork(NULL, NULL, on_fork_child) == 0;
}

/* Whether the calling process is the one that connected c. */
static bool own_process(const kvs_client_t *c)
{
    if (!fork_watched)
        return c->pid == getpid();
    return c->forks == atomic_load_explicit(&fork_count, memory_order_relaxed);
}

/* A forked child may not use its parent's client. */
static int foreign_process(kvs_client_t *c)
{
    if (own_process(c))
        return 0;
    set_err(c, KVS_ENOTCONN,
            "this kvshare client was connected by process %d and cannot be used after fork "
            "(the connection and the pool mapping are that process's): reconnect from the "
            "new process with kvs_connect",
            (int)c->pid);
    return 1;
}

void kvs_identity_init(kvs_identity_t *id)
{
    if (!id)
        return;
    memset(id, 0, sizeof(*id));
    id->size = sizeof(*id);
}

/* Copies opts' identity into c, to be sent in every Hello. */
static int copy_identity(kvs_client_t *c, const kvs_identity_t *id)
{
    kvs_identity_t v;
    kvs_identity_init(&v);
    if (id->size == 0 || id->size > sizeof(v))
        return KVS_EINVAL;
    memcpy(&v, id, id->size);
    v.size = sizeof(v);
    const char *parts[] = {v.ns, v.model, v.revision, v.dtype};
    char *dst[] = {c->ident_ns, c->ident_model, c->ident_rev, c->ident_dtype};
    size_t cap[] = {sizeof(c->ident_ns), sizeof(c->ident_model), sizeof(c->ident_rev),
                    sizeof(c->ident_dtype)};
    if (!v.model || !v.model[0])
        return KVS_EINVAL;
    for (size_t i = 0; i < 4; i++) {
        const char *p = parts[i] ? parts[i] : "";
        if (strlen(p) >= cap[i])
            return KVS_EINVAL;
        memcpy(dst[i], p, strlen(p) + 1);
    }
    v.ns = c->ident_ns;
    v.model = c->ident_model;
    v.revision = c->ident_rev;
    v.dtype = c->ident_dtype;
    c->ident = v;
    c->has_ident = 1;
    return 0;
}

int kvs_identity(const kvs_client_t *c, char *buf, size_t len, uint64_t *hash)
{
    if (!c || (!buf && len > 0))
        return KVS_EINVAL;
    if (!c->have_geo)
        return KVS_ENOTCONN;
    if (!c->has_ident || !c->ident_text[0])
        return KVS_ENOTFOUND;
    if (len > 0)
        snprintf(buf, len, "%s", c->ident_text);
    if (hash)
        *hash = c->ident_hash;
    return 0;
}

void kvs_options_init(kvs_options_t *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof(*opts));
    opts->size = sizeof(*opts);
    opts->timeout_ms = 1000;
}

static int remaining(int64_t deadline)
{
    int64_t left = deadline - now_ms();
    return left > 0 ? (int)left : 0;
}

/* The socket is blocking with SO_RCVTIMEO / SO_SNDTIMEO, so a call costs a
 * send and a recv, no poll. Before each blocking call the socket's timeout is
 * brought down to what is left of the call's deadline when it exceeds that
 * by more than the slack (so the common call changes nothing). */
#define CLIENT_TIMEO_SLACK_MS 5

static int set_timeo(kvs_client_t *c, int opt, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (ms <= 0)
        tv.tv_usec = 1000; /* 0 would mean forever */
    if (setsockopt(c->fd, SOL_SOCKET, opt, &tv, sizeof(tv)) != 0)
        return KVS_EIO;
    if (opt == SO_RCVTIMEO)
        c->rcv_ms = ms;
    else
        c->snd_ms = ms;
    return 0;
}

static int arm(kvs_client_t *c, int opt, int64_t deadline)
{
    int left = remaining(deadline);
    int cur = opt == SO_RCVTIMEO ? c->rcv_ms : c->snd_ms;
    if (left == 0)
        return KVS_ETIMEDOUT;
    if (cur > left + CLIENT_TIMEO_SLACK_MS || cur + CLIENT_TIMEO_SLACK_MS < left)
        return set_timeo(c, opt, left);
    return 0;
}

static int send_all(kvs_client_t *c, const uint8_t *p, size_t n, int64_t deadline)
{
    while (n > 0) {
        int rc = arm(c, SO_SNDTIMEO, deadline);
        if (rc != 0)
            return rc;
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue; /* arm() says whether time is left */
        return KVS_ENOTCONN;
    }
    return 0;
}

/* send_all over two pieces (a frame head and the caller's token array). */
static int send_two(kvs_client_t *c, const uint8_t *a, size_t na, const uint8_t *b, size_t nb,
                    int64_t deadline)
{
    struct iovec iov[2] = {{(void *)a, na}, {(void *)b, nb}};
    struct iovec *v = iov;
    int cnt = nb ? 2 : 1;
    while (cnt > 0) {
        int rc = arm(c, SO_SNDTIMEO, deadline);
        if (rc != 0)
            return rc;
        struct msghdr msg = {0};
        msg.msg_iov = v;
        msg.msg_iovlen = (size_t)cnt;
        ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (w <= 0)
            return KVS_ENOTCONN;
        size_t left = (size_t)w;
        while (cnt > 0 && left >= v->iov_len) {
            left -= v->iov_len;
            v++;
            cnt--;
        }
        if (cnt > 0) {
            v->iov_base = (uint8_t *)v->iov_base + left;
            v->iov_len -= left;
        }
    }
    return 0;
}

/* Reads at least `need` buffered bytes, keeping any fds that arrive. */
static int recv_until(kvs_client_t *c, size_t need, int64_t deadline)
{
    if (need > c->rcap) {
        size_t cap = c->rcap ? c->rcap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *b = realloc(c->rbuf, cap);
        if (!b)
            return KVS_ENOMEM;
        c->rbuf = b;
        c->rcap = cap;
    }
    while (c->rlen < need) {
        union {
            char buf[CMSG_SPACE(sizeof(int) * CLIENT_MAX_FDS)];
            struct cmsghdr align;
        } control;
        struct iovec iov = {c->rbuf + c->rlen, c->rcap - c->rlen};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        /* fds only ever come with the Hello reply: plain reads after it. */
        msg.msg_control = c->in_hello ? control.buf : NULL;
        msg.msg_controllen = c->in_hello ? sizeof(control.buf) : 0;
        int rc = arm(c, SO_RCVTIMEO, deadline);
        if (rc != 0)
            return rc;
        ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (n <= 0)
            return KVS_ENOTCONN;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int fds[CLIENT_MAX_FDS];
            memcpy(fds, CMSG_DATA(cm), k * sizeof(int));
            for (size_t i = 0; i < k; i++) {
                if (c->n_fds < CLIENT_MAX_FDS)
                    c->fds[c->n_fds++] = fds[i];
                else
                    close(fds[i]);
            }
        }
        c->rlen += (size_t)n;
    }
    return 0;
}

/* A reply's status as a KVS_* code. The wire enum is open: a value outside
 * the status table (a newer or broken daemon) is a protocol error, never a
 * positive return or an unknown negative one. */
static int wire_status(const Kvshare__Response *resp)
{
    int s = (int)resp->status;
    return s >= 0 && s < KVS_STATUS_COUNT ? -s : KVS_EPROTO;
}

/* After a failed send: an error frame the daemon sent before closing, if
 * one is waiting. Returns its status (message in c->err), or 0. */
static int read_refusal(kvs_client_t *c)
{
    uint8_t buf[1024];
    ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < FRAME_HEADER_BYTES)
        return 0;
    uint32_t len = frame_get_len(buf);
    if (len > (size_t)n - FRAME_HEADER_BYTES)
        return 0;
    Kvshare__Response *resp = kvshare__response__unpack(NULL, len, buf + FRAME_HEADER_BYTES);
    if (!resp)
        return 0;
    int status = wire_status(resp);
    if (status != 0)
        set_err(c, status, "kvshared: %s", resp->message ? resp->message : kvs_strerror(status));
    kvshare__response__free_unpacked(resp, NULL);
    return status;
}

/* The RPC's name (kvshare_rpcs.h), for messages. */
static const char *rpc_name(Kvshare__Request__RpcCase rpc)
{
    switch (rpc) {
#define RPC_NAME(CASE, Name, field)                                                                \
    case KVSHARE__REQUEST__RPC_##CASE:                                                             \
        return #Name;
        KVS_RPCS(RPC_NAME)
#undef RPC_NAME
    default:
        return "a request";
    }
}

/* A successful reply answers the RPC asked: its oneof member has the
 * request's number (kvshare_rpcs.h) and is there, so that each call reads
 * its own reply message without checking. */
static int check_reply(kvs_client_t *c, const Kvshare__Request *req, const Kvshare__Response *resp)
{
    /* Every RPC's message is in the oneof's union: any member reaches it. */
    if ((int)resp->rpc_case == (int)req->rpc_case && resp->hello)
        return 0;
    return set_err(c, KVS_EPROTO, "kvshared answered %s with another reply",
                   rpc_name(req->rpc_case));
}

/* A reader of a reply frame in place (the Lookup's, wire.h), tried before
 * protobuf-c: true when it took body[0 .. len) as the successful answer
 * to request id, false to leave the frame to protobuf-c. */
typedef struct fast_reply {
    bool (*take)(kvs_client_t *c, const uint8_t *body, size_t len, uint64_t id, void *arg);
    void *arg;
} fast_reply_t;

/* A Lookup's tokens up to this many bytes are copied into the request
 * buffer and sent with its head in one send; longer ones go from the
 * caller's array as a second iovec. */
#define CLIENT_COPY_TOKEN_BYTES 1024

/* One round trip on the current connection. On success *out is the decoded
 * response (free with kvshare__response__free_unpacked) and the return is
 * its status (KVS_EPROTO for a success that answers another RPC), or, when
 * fast took the reply, *out stays NULL and the return is 0; transport
 * failures drop the connection. */
static int round_trip(kvs_client_t *c, Kvshare__Request *req, Kvshare__Response **out,
                      const fast_reply_t *fast, int64_t deadline)
{
    int rc;
    req->id = ++c->next_id;
    if (req->rpc_case == KVSHARE__REQUEST__RPC_LOOKUP) {
        /* Written by hand (wire.h). A prompt's tokens go out from the
         * caller's array, uncopied; a short one's are copied after the head,
         * so that the frame is one send. */
        const Kvshare__LookupRequest *lk = req->lookup;
        size_t tb = lk->tokens.len, copied = tb < CLIENT_COPY_TOKEN_BYTES ? tb : 0;
        size_t head = WIRE_LOOKUP_HEAD_MAX(strlen(lk->ns)) + copied, head_len;
        if (head > c->wcap) {
            uint8_t *b = realloc(c->wbuf, head);
            if (!b)
                return set_err(c, KVS_ENOMEM, "out of memory for a request");
            c->wbuf = b;
            c->wcap = head;
        }
        if (wire_lookup_head(c->wbuf, req->id, lk->ns, lk->pin, lk->wait_ms, lk->tier2_in_place, tb,
                             &head_len) != 0)
            return set_err(c, KVS_EINVAL, "a lookup of %zu tokens does not fit one frame", tb / 4);
        if (copied) {
            memcpy(c->wbuf + head_len, lk->tokens.data, copied);
            rc = send_all(c, c->wbuf, head_len + copied, deadline);
        } else {
            rc = send_two(c, c->wbuf, head_len, lk->tokens.data, tb, deadline);
        }
    } else {
        size_t size = kvshare__request__get_packed_size(req);
        if (size + FRAME_HEADER_BYTES > c->wcap) {
            uint8_t *b = realloc(c->wbuf, size + FRAME_HEADER_BYTES);
            if (!b)
                return set_err(c, KVS_ENOMEM, "out of memory for a %zu-byte request", size);
            c->wbuf = b;
            c->wcap = size + FRAME_HEADER_BYTES;
        }
        frame_put_len(c->wbuf, (uint32_t)size);
        kvshare__request__pack(req, c->wbuf + FRAME_HEADER_BYTES);
        rc = send_all(c, c->wbuf, size + FRAME_HEADER_BYTES, deadline);
    }
    if (rc == KVS_ENOTCONN) {
        /* The daemon may have hung up with a reason (session limit, a
         * refused stream): report it rather than a bare disconnect. */
        int status = read_refusal(c);
        if (status != 0) {
            disconnect(c);
            return status;
        }
    }
    if (rc != 0)
        goto transport;

    for (;;) {
        rc = recv_until(c, FRAME_HEADER_BYTES, deadline);
        if (rc != 0)
            goto transport;
        uint32_t len = frame_get_len(c->rbuf);
        if (len > CLIENT_MAX_REPLY) {
            rc = KVS_EPROTO;
            goto transport;
        }
        rc = recv_until(c, FRAME_HEADER_BYTES + (size_t)len, deadline);
        if (rc != 0)
            goto transport;
        if (fast && fast->take(c, c->rbuf + FRAME_HEADER_BYTES, len, req->id, fast->arg)) {
            c->rlen -= FRAME_HEADER_BYTES + (size_t)len;
            memmove(c->rbuf, c->rbuf + FRAME_HEADER_BYTES + len, c->rlen);
            c->err[0] = '\0';
            return 0;
        }
        Kvshare__Response *resp =
            kvshare__response__unpack(NULL, len, c->rbuf + FRAME_HEADER_BYTES);
        c->rlen -= FRAME_HEADER_BYTES + (size_t)len;
        memmove(c->rbuf, c->rbuf + FRAME_HEADER_BYTES + len, c->rlen);
        if (!resp) {
            rc = KVS_EPROTO;
            goto transport;
        }
        if (resp->id != req->id) {
            /* An answer to nothing we asked (id 0: the daemon refused the
             * stream) ends the connection. */
            int status = resp->status ? wire_status(resp) : KVS_EPROTO;
            set_err(c, status, "kvshared: %s", resp->message ? resp->message : "unexpected reply");
            kvshare__response__free_unpacked(resp, NULL);
            disconnect(c);
            return status;
        }
        *out = resp;
        if (resp->status != 0) {
            int status = wire_status(resp);
            set_err(c, status, "%s",
                    resp->message && resp->message[0] ? resp->message : kvs_strerror(status));
            return status;
        }
        c->err[0] = '\0';
        return check_reply(c, req, resp);
    }

transport:
    disconnect(c);
    if (rc == KVS_ETIMEDOUT)
        return set_err(c, rc,
                       "kvshared at %s did not answer within %d ms; disconnected, the "
                       "next call reconnects",
                       c->socket_path, c->timeout_ms);
    if (rc == KVS_EPROTO)
        return set_err(c, rc, "kvshared at %s sent an undecodable reply; disconnected",
                       c->socket_path);
    if (rc == KVS_ENOMEM)
        return set_err(c, rc, "out of memory reading a reply");
    return set_err(c, KVS_ENOTCONN, "connection to kvshared at %s lost; the next call reconnects",
                   c->socket_path);
}

static int map_pool(kvs_client_t *c, const Kvshare__HelloReply *h)
{
    backend_desc_t desc;
    char err[256] = "";
    memset(&desc, 0, sizeof(desc));
    desc.kind = (backend_kind_t)h->backend;
    desc.size = h->pool_bytes;
    desc.n_slabs = (uint32_t)h->n_slab_bytes;
    /* The tier-2 memfd, when it came, is the last fd: the rest are slabs. */
    size_t n_tier2 = h->tier2_fd ? 1 : 0;
    if (h->n_slab_bytes > BACKEND_MAX_SLABS || h->n_fds != c->n_fds ||
        h->n_fds != h->n_slab_bytes + n_tier2 || (n_tier2 && h->tier2_bytes == 0))
        return set_err(c, KVS_EPROTO, "Hello reply announced %u fds for %zu slabs%s, got %zu fds",
                       h->n_fds, h->n_slab_bytes, n_tier2 ? " and tier 2" : "", c->n_fds);
    if (h->n_slab_bytes)
        memcpy(desc.slab_bytes, h->slab_bytes, sizeof(uint64_t) * h->n_slab_bytes);
    if (h->device_uuid.len == BACKEND_UUID_LEN)
        memcpy(desc.device_uuid, h->device_uuid.data, BACKEND_UUID_LEN);
    backend_mapping_t *m = NULL, *t2 = NULL;
    size_t n = c->n_fds - n_tier2;
    int t2_fd = n_tier2 ? c->fds[n] : -1;
    c->n_fds = 0; /* consumed by the imports, success or not */
    int rc = backend_import(&desc, c->fds, n, &m, err, sizeof(err));
    if (rc != 0) {
        if (t2_fd >= 0)
            close(t2_fd);
        return set_err(c, rc, "cannot map the pool: %s", err[0] ? err : kvs_strerror(rc));
    }
    if (t2_fd >= 0) {
        rc = backend_tier_import(t2_fd, h->tier2_bytes, &t2, err, sizeof(err));
        if (rc != 0) {
            backend_unmap(m);
            return set_err(c, rc, "cannot map tier 2: %s", err[0] ? err : kvs_strerror(rc));
        }
    }
    backend_unmap(c->map);
    c->map = m;
    backend_unmap(c->tier2_map);
    c->tier2_map = t2;
    return 0;
}

static int layout_of(const kvs_geometry_t *g, geometry_t *out);

static int hello(kvs_client_t *c, int64_t deadline)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__HelloRequest hr = KVSHARE__HELLO_REQUEST__INIT;
    Kvshare__Response *resp = NULL;
    hr.version = KVS_PROTOCOL_VERSION;
    hr.worker = c->worker;
    hr.no_fds = (c->flags & KVS_NO_MAP) != 0;
    hr.map_tier2 = (c->flags & KVS_MAP_TIER2) != 0;
    hr.ranked = (c->flags & KVS_RANK) != 0;
    hr.rank = hr.ranked ? c->rank : 0;
    hr.group_scheduler = (c->flags & KVS_GROUP_SCHEDULER) != 0;
    Kvshare__ModelIdentity mi = KVSHARE__MODEL_IDENTITY__INIT;
    Kvshare__Geometry mg = KVSHARE__GEOMETRY__INIT;
    if (c->has_ident) {
        const kvs_identity_t *id = &c->ident;
        mi.ns = c->ident_ns;
        mi.model = c->ident_model;
        mi.revision = c->ident_rev;
        mg.layers = id->layers;
        mg.kv_heads = id->kv_heads;
        mg.head_dim = id->head_dim;
        mg.dtype = c->ident_dtype;
        mg.block_tokens = id->block_tokens;
        mg.kv_lora_rank = id->kv_lora_rank;
        mg.rope_head_dim = id->rope_head_dim;
        mi.geometry = &mg;
        mi.tp_size = id->tp_size;
        hr.identity = &mi;
    }
    req.rpc_case = KVSHARE__REQUEST__RPC_HELLO;
    req.hello = &hr;
    c->in_hello = 1;
    int rc = round_trip(c, &req, &resp, NULL, deadline);
    c->in_hello = 0;
    if (rc != 0)
        goto out;
    const Kvshare__HelloReply *h = resp->hello;
    if (resp->rpc_case != KVSHARE__RESPONSE__RPC_HELLO || !h || !h->geometry) {
        rc = set_err(c, KVS_EPROTO, "kvshared answered Hello without a pool description");
        goto out;
    }
    /* A daemon older than several devices says nothing: one. */
    c->group_size = h->group_size ? h->group_size : 1;
    snprintf(c->ident_text, sizeof(c->ident_text), "%s", h->identity ? h->identity : "");
    c->ident_hash = h->identity_hash;
    kvs_geometry_t *g = &c->geo;
    memset(g, 0, sizeof(*g));
    g->layers = h->geometry->layers;
    g->kv_heads = h->geometry->kv_heads;
    g->head_dim = h->geometry->head_dim;
    g->dtype_bytes = h->geometry->dtype_bytes;
    snprintf(g->dtype, sizeof(g->dtype), "%s", h->geometry->dtype ? h->geometry->dtype : "");
    g->block_tokens = h->geometry->block_tokens;
    g->kv_lora_rank = h->geometry->kv_lora_rank;
    g->rope_head_dim = h->geometry->rope_head_dim;
    geometry_t layout;
    if (layout_of(g, &layout) != 0) {
        rc = set_err(c, KVS_EPROTO, "kvshared described a geometry this library cannot use");
        goto out;
    }
    /* An MLA slot row is one latent: also reported as one head of its width,
     * the way engines (vLLM) describe an MLA cache. */
    if (geometry_is_mla(&layout)) {
        g->kv_heads = 1;
        g->head_dim = (uint32_t)geometry_token_width(&layout);
    }
    g->num_blocks = h->num_blocks;
    g->block_bytes = h->block_bytes;
    g->slot_bytes = h->slot_bytes;
    g->layer_stride = h->layer_stride;
    g->kv_stride = h->kv_stride;
    g->block_stride = h->block_stride;
    g->pool_bytes = h->pool_bytes;
    g->backend = (kvs_backend_t)h->backend;
    if (h->device_uuid.len == sizeof(g->device_uuid))
        memcpy(g->device_uuid, h->device_uuid.data, sizeof(g->device_uuid));
    g->tier2_blocks = h->tier2_blocks;
    g->tier2_bytes = h->tier2_bytes;
    if (h->tier2_blocks) {
        /* The tier's layout must fit its memfd, as the pool's does. */
        uint64_t rows = (uint64_t)g->layers * geometry_planes(&layout);
        uint64_t slot = geometry_slot_bytes(&layout);
        if (slot == 0 || h->tier2_bytes / slot / h->tier2_blocks < rows) {
            rc = set_err(c, KVS_EPROTO,
                         "kvshared described a tier 2 of %u blocks in %llu bytes: too small",
                         h->tier2_blocks, (unsigned long long)h->tier2_bytes);
            goto out;
        }
    }
    if (!(c->flags & (KVS_NO_MAP | KVS_GROUP_SCHEDULER))) { /* the scheduler maps nothing */
        rc = map_pool(c, h);
        if (rc != 0)
            goto out;
    }
    c->have_geo = 1;
out:
    drop_fds(c);
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    if (rc != 0)
        disconnect(c);
    return rc;
}

/* Whoever listens on the socket gets prompt tokens and hands out KV bytes
 * that the worker will trust as cache hits, so before anything is sent the
 * peer must be the daemon we mean: its uid (as the kernel saw it when it
 * called listen) is ours, root's, or the one the options name. A socket path
 * in a directory another user could create first would otherwise let that
 * user pose as kvshared. */
/* Whether the socket's directory vouches for uid: it belongs to uid and no
 * one else can write it, and its parent belongs to root and no one else can
 * write it, so only root could have given uid that directory (systemd's
 * RuntimeDirectory= for a daemon run by a service account: /run/kvshare). */
static bool dir_vouches(const char *socket_path, uid_t uid)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct stat st;
    snprintf(dir, sizeof(dir), "%s", socket_path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return false;
    *slash = '\0';
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid ||
        (st.st_mode & (S_IWGRP | S_IWOTH)))
        return false;
    slash = strrchr(dir, '/');
    if (!slash)
        return false;
    if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0 &&
           !(st.st_mode & (S_IWGRP | S_IWOTH));
}

static int check_daemon_uid(kvs_client_t *c)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred))
        return set_err(c, KVS_EIO, "cannot read the credentials of the peer at %s: %s",
                       c->socket_path, strerror(errno));
    if (cred.uid == geteuid() || cred.uid == 0 || (c->daemon_uid && cred.uid == c->daemon_uid) ||
        dir_vouches(c->socket_path, cred.uid))
        return 0;
    return set_err(c, KVS_EDENIED,
                   "refused the daemon at %s: it runs as uid %u (pid %d), which is neither "
                   "this process's uid %u, nor root, nor kvs_options_t.daemon_uid, nor the "
                   "owner of a root-made socket directory; another user may have taken the "
                   "socket path. Nothing was sent",
                   c->socket_path, (unsigned)cred.uid, (int)cred.pid, (unsigned)geteuid());
}

static int connect_now(kvs_client_t *c, int64_t deadline)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    unmap_stale_pool(c);
    memcpy(addr.sun_path, c->socket_path, sizeof(addr.sun_path));
    c->last_attempt_ms = now_ms();
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return set_err(c, KVS_EIO, "socket: %s", strerror(errno));
    /* A full backlog makes connect wait, at most the send timeout. */
    if (set_timeo(c, SO_SNDTIMEO, remaining(deadline)) != 0 ||
        set_timeo(c, SO_RCVTIMEO, c->timeout_ms) != 0) {
        disconnect(c);
        return set_err(c, KVS_EIO, "setsockopt: %s", strerror(errno));
    }
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        int e = errno;
        disconnect(c);
        if (e == ENOENT)
            return set_err(c, KVS_ENOTCONN, "is kvshared running? no socket at %s", c->socket_path);
        if (e == ECONNREFUSED)
            return set_err(c, KVS_ENOTCONN,
                           "is kvshared running? nothing answers at %s (a stale socket)",
                           c->socket_path);
        if (e == EACCES)
            return set_err(c, KVS_EDENIED,
                           "permission denied on %s: join the daemon's group (the socket is "
                           "mode 0660)",
                           c->socket_path);
        if (e == EAGAIN)
            return set_err(c, KVS_EBUSY, "kvshared at %s is not accepting (backlog full)",
                           c->socket_path);
        return set_err(c, KVS_ENOTCONN, "cannot connect to %s: %s", c->socket_path, strerror(e));
    }
    int rc = check_daemon_uid(c);
    if (rc != 0) {
        disconnect(c);
        return rc;
    }
    rc = hello(c, deadline);
    if (rc != 0)
        return rc;
    c->epoch++;
    return 0;
}

/* --- the circuit breaker (KVS_BREAKER) --- */

enum { PROBE_SILENT, PROBE_ANSWERED, PROBE_WOKEN };

/* One probe of the daemon at path: a connect, a Ping, and any reply that
 * decodes is an answer (a refusal too: the daemon is alive, and the call
 * that reconnects gets its reason). Never blocks: the socket is
 * non-blocking (a full backlog fails the connect at once) and the wait for
 * the reply polls wake_fd too, so kvs_close never waits on a probe. */
static int breaker_probe(const char *path, int wake_fd)
{
    int64_t deadline = now_ms() + BREAKER_PROBE_MS;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    uint8_t buf[4096];
    int result = PROBE_SILENT;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return PROBE_SILENT;
    memcpy(addr.sun_path, path, sizeof(addr.sun_path));
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0)
        goto out;

    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PingRequest ping = KVSHARE__PING_REQUEST__INIT;
    req.id = 1;
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &ping;
    size_t size = kvshare__request__get_packed_size(&req);
    frame_put_len(buf, (uint32_t)size);
    kvshare__request__pack(&req, buf + FRAME_HEADER_BYTES);
    /* A few bytes into an empty socket buffer: all or nothing. */
    if (send(fd, buf, FRAME_HEADER_BYTES + size, MSG_NOSIGNAL) !=
        (ssize_t)(FRAME_HEADER_BYTES + size))
        goto out;

    size_t have = 0, need = FRAME_HEADER_BYTES;
    while (have < need) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
        int left = remaining(deadline);
        if (left == 0)
            goto out;
        int n = poll(p, 2, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            goto out;
        if (p[1].revents) {
            result = PROBE_WOKEN;
            goto out;
        }
        ssize_t got = recv(fd, buf + have, need - have, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (got <= 0)
            goto out;
        have += (size_t)got;
        if (need == FRAME_HEADER_BYTES && have == need) {
            uint32_t len = frame_get_len(buf);
            if (len > sizeof(buf) - FRAME_HEADER_BYTES)
                goto out; /* no reply to a Ping is that long */
            need += len;
        }
    }
    Kvshare__Response *resp =
        kvshare__response__unpack(NULL, need - FRAME_HEADER_BYTES, buf + FRAME_HEADER_BYTES);
    if (resp) {
        result = PROBE_ANSWERED;
        kvshare__response__free_unpacked(resp, NULL);
    }
out:
    close(fd);
    return result;
}

/* The probe thread: waits, probes, doubles the wait, until a probe is
 * answered (then the client is up: down = 0) or kvs_close wakes it. It
 * reads c->socket_path (fixed for the client's life) and c->brk.wake_fd,
 * and writes the breaker's atomics only. */
static void *breaker_main(void *arg)
{
    kvs_client_t *c = arg;
    struct breaker *b = &c->brk;
    int wait_ms = BREAKER_FIRST_MS;
    for (;;) {
        struct pollfd w = {.fd = b->wake_fd, .events = POLLIN};
        int n = poll(&w, 1, wait_ms);
        if (n > 0)
            break; /* kvs_close */
        if (n < 0 && errno == EINTR)
            continue;
        atomic_fetch_add_explicit(&b->probes, 1, memory_order_relaxed);
        int r = breaker_probe(c->socket_path, b->wake_fd);
        if (r == PROBE_WOKEN)
            break;
        if (r == PROBE_ANSWERED) {
            atomic_store_explicit(&b->down, 0, memory_order_release);
            break;
        }
        wait_ms = wait_ms * 2 < BREAKER_MAX_MS ? wait_ms * 2 : BREAKER_MAX_MS;
    }
    return NULL;
}

/* Joins a probe thread that has ended or is told to (wake: kvs_close). */
static void breaker_join(kvs_client_t *c, bool wake)
{
    if (!c->brk.thread_live)
        return;
    if (wake)
        (void)eventfd_write(c->brk.wake_fd, 1);
    pthread_join(c->brk.thread, NULL);
    c->brk.thread_live = 0;
}

/* After a failed call (status rc) of a KVS_BREAKER client: when the daemon
 * was unreachable or silent (the connection is gone and rc says so, not a
 * refusal the daemon sent), the client goes down and a probe thread starts.
 * Without an eventfd or a thread (out of resources) the client stays up:
 * calls then behave as without the flag. Returns rc. */
static int breaker_after(kvs_client_t *c, int rc)
{
    struct breaker *b = &c->brk;
    if (rc == 0 || !(c->flags & KVS_BREAKER) || c->fd >= 0 ||
        (rc != KVS_ETIMEDOUT && rc != KVS_ENOTCONN && rc != KVS_EBUSY && rc != KVS_EIO))
        return rc;
    if (!own_process(c) || atomic_load_explicit(&b->down, memory_order_acquire))
        return rc;          /* a forked child starts no thread */
    breaker_join(c, false); /* the last trip's, which ended when it was answered */
    if (b->wake_fd < 0)
        b->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (b->wake_fd < 0)
        return rc;
    /* Release: kvs_breaker in another thread that sees down sees its time. */
    atomic_store_explicit(&b->down_since_ms, now_ms(), memory_order_relaxed);
    atomic_store_explicit(&b->down, 1, memory_order_release);
    /* The thread takes no signal meant for the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = pthread_create(&b->thread, NULL, breaker_main, c) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!started) {
        atomic_store_explicit(&b->down, 0, memory_order_relaxed);
        return rc;
    }
    b->thread_live = 1;
    atomic_fetch_add_explicit(&b->trips, 1, memory_order_relaxed);
    return rc;
}

/* ensure()'s look at the breaker, with no connection: CLIENT_FAST_FAIL while
 * down; once a probe was answered, joins its thread and lets this call
 * reconnect at once (whatever reconnect_ms says: the probe was the attempt). */
static int breaker_gate(kvs_client_t *c)
{
    struct breaker *b = &c->brk;
    if (!b->thread_live)
        return 0;
    if (!atomic_load_explicit(&b->down, memory_order_acquire)) {
        breaker_join(c, false);
        c->last_attempt_ms = 0;
        return 0;
    }
    atomic_fetch_add_explicit(&b->fast_fails, 1, memory_order_relaxed);
    set_err(c, KVS_ENOTCONN,
            "kvshared at %s is down (no answer for %lld ms): the call is a miss until a "
            "background probe gets an answer",
            c->socket_path,
            (long long)(now_ms() - atomic_load_explicit(&b->down_since_ms, memory_order_relaxed)));
    return CLIENT_FAST_FAIL;
}

void kvs_breaker_stats_init(kvs_breaker_stats_t *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof(*s));
    s->size = sizeof(*s);
}

int kvs_breaker(const kvs_client_t *c, kvs_breaker_stats_t *out)
{
    kvs_breaker_stats_t s;
    if (!c || !out || out->size < sizeof(out->size) || out->size > sizeof(s))
        return KVS_EINVAL;
    /* Casts: C11's atomic loads take a pointer to non-const. */
    struct breaker *b = (struct breaker *)&c->brk;
    kvs_breaker_stats_init(&s);
    s.size = out->size;
    s.trips = atomic_load_explicit(&b->trips, memory_order_relaxed);
    s.probes = atomic_load_explicit(&b->probes, memory_order_relaxed);
    s.fast_fails = atomic_load_explicit(&b->fast_fails, memory_order_relaxed);
    if (atomic_load_explicit(&b->down, memory_order_acquire)) {
        int64_t since = atomic_load_explicit(&b->down_since_ms, memory_order_relaxed);
        s.state = KVS_BREAKER_DOWN;
        s.down_ms = (uint64_t)(now_ms() - since);
    }
    memcpy(out, &s, s.size);
    return 0;
}

/* Connected, or a fresh attempt (at most once per reconnect_ms), or
 * CLIENT_FAST_FAIL while the breaker is down. */
static int ensure(kvs_client_t *c, int64_t deadline)
{
    if (foreign_process(c))
        return KVS_ENOTCONN;
    if (c->fd >= 0)
        return 0;
    unmap_stale_pool(c);
    if (breaker_gate(c) == CLIENT_FAST_FAIL)
        return CLIENT_FAST_FAIL;
    if (c->reconnect_ms > 0 && c->last_attempt_ms &&
        now_ms() - c->last_attempt_ms < c->reconnect_ms)
        return set_err(c, KVS_ENOTCONN, "not connected to kvshared at %s (retrying every %d ms)",
                       c->socket_path, c->reconnect_ms);
    return connect_now(c, deadline);
}

int kvs_connect(const kvs_options_t *opts, kvs_client_t **out)
{
    kvs_options_t o;
    if (!out)
        return KVS_EINVAL;
    *out = NULL;
    kvs_options_init(&o);
    if (opts) {
        if (opts->size == 0 || opts->size > sizeof(o))
            return KVS_EINVAL;
        memcpy(&o, opts, opts->size);
        o.size = sizeof(o);
    }
    if (o.timeout_ms <= 0)
        o.timeout_ms = 1000;
    kvs_client_t *c = calloc(1, sizeof(*c));
    if (!c)
        return KVS_ENOMEM;
    c->fd = -1;
    c->brk.wake_fd = -1;
    pthread_once(&fork_once, fork_watch);
    c->pid = getpid();
    c->forks = atomic_load_explicit(&fork_count, memory_order_relaxed);
    c->timeout_ms = o.timeout_ms;
    c->reconnect_ms = o.reconnect_ms > 0 ? o.reconnect_ms : 0;
    c->flags = o.flags;
    c->daemon_uid = o.daemon_uid;
    c->rank = o.rank;
    if (o.worker_name)
        snprintf(c->worker, sizeof(c->worker), "%s", o.worker_name);
    int rc = o.identity ? copy_identity(c, o.identity) : 0;
    if (rc == 0 && o.socket_path) {
        if (strlen(o.socket_path) >= sizeof(c->socket_path))
            rc = KVS_EINVAL;
        else
            snprintf(c->socket_path, sizeof(c->socket_path), "%s", o.socket_path);
    } else if (rc == 0) {
        rc = kvs_default_socket_path(c->socket_path, sizeof(c->socket_path));
    }
    if (rc != 0) {
        free(c);
        return rc;
    }
    rc = connect_now(c, now_ms() + c->timeout_ms);
    if (rc != 0 && !(c->flags & KVS_LAZY)) {
        kvs_close(c);
        return rc;
    }
    breaker_after(c, rc);
    *out = c;
    return 0;
}

void kvs_close(kvs_client_t *c)
{
    if (!c)
        return;
    /* A forked child has no probe thread: only the parent joins it. */
    if (own_process(c))
        breaker_join(c, true);
    if (c->brk.wake_fd >= 0)
        close(c->brk.wake_fd);
    disconnect(c);
    backend_unmap(c->map);
    backend_unmap(c->tier2_map);
    free(c->rbuf);
    free(c->wbuf);
    free(c);
}

int kvs_connected(const kvs_client_t *c)
{
    return c && c->fd >= 0 && own_process(c);
}

uint64_t kvs_epoch(const kvs_client_t *c)
{
    return c ? c->epoch : 0;
}

int kvs_group(const kvs_client_t *c, uint32_t *rank, uint32_t *group_size)
{
    if (!c || !rank || !group_size)
        return KVS_EINVAL;
    if (c->group_size == 0)
        return KVS_ENOTCONN;
    *rank = (c->flags & KVS_RANK) ? c->rank : 0;
    *group_size = c->group_size;
    return 0;
}

const char *kvs_last_error(const kvs_client_t *c)
{
    return c ? c->err : "";
}

void kvs_set_timeout(kvs_client_t *c, int timeout_ms)
{
    if (c && timeout_ms > 0)
        c->timeout_ms = timeout_ms;
}

int kvs_geometry(const kvs_client_t *c, kvs_geometry_t *out)
{
    if (!c || !out)
        return KVS_EINVAL;
    if (!c->have_geo)
        return KVS_ENOTCONN;
    *out = c->geo;
    return 0;
}

uintptr_t kvs_pool_base(const kvs_client_t *c)
{
    return c && c->map && own_process(c) ? backend_mapping_base(c->map) : 0;
}

/* The pool's layout (geometry.h) from what the daemon described. Errors:
 * KVS_EINVAL (a geometry this library cannot lay out). */
static int layout_of(const kvs_geometry_t *g, geometry_t *out)
{
    memset(out, 0, sizeof(*out));
    out->layers = g->layers;
    out->block_tokens = g->block_tokens;
    out->kv_lora_rank = g->kv_lora_rank;
    out->rope_head_dim = g->rope_head_dim;
    if (!g->kv_lora_rank) {
        out->kv_heads = g->kv_heads;
        out->head_dim = g->head_dim;
    }
    if (geometry_dtype_parse(g->dtype, &out->dtype) != 0)
        return KVS_EINVAL;
    return geometry_validate(out);
}

int kvs_block_addr(const kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block,
                   uintptr_t *addr)
{
    if (!c || !addr)
        return KVS_EINVAL;
    if (!c->map || !own_process(c))
        return KVS_ENOTCONN;
    const kvs_geometry_t *g = &c->geo;
    geometry_t layout;
    if (layout_of(g, &layout) != 0)
        return KVS_EPROTO;
    if (layer >= g->layers || kv >= geometry_planes(&layout) || block >= g->num_blocks)
        return KVS_EINVAL;
    *addr =
        backend_mapping_base(c->map) + geometry_offset(&layout, g->num_blocks, layer, kv, block);
    return 0;
}

/* Offset of a block's slot, for the copy functions. */
static int slot_offset(const kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block, size_t n,
                       uint64_t *offset)
{
    uintptr_t addr;
    int rc = kvs_block_addr(c, layer, kv, block, &addr);
    if (rc != 0)
        return rc;
    if (n > c->geo.slot_bytes)
        return KVS_EINVAL;
    *offset = addr - backend_mapping_base(c->map);
    return 0;
}

int kvs_block_write(kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block, const void *src,
                    size_t n)
{
    uint64_t off;
    if (!src && n)
        return KVS_EINVAL;
    if (c && foreign_process(c))
        return KVS_ENOTCONN;
    int rc = slot_offset(c, layer, kv, block, n, &off);
    return rc != 0 ? rc : backend_mapping_write(c->map, off, src, n);
}

int kvs_block_read(kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block, void *dst,
                   size_t n)
{
    uint64_t off;
    if (!dst && n)
        return KVS_EINVAL;
    if (c && foreign_process(c))
        return KVS_ENOTCONN;
    int rc = slot_offset(c, layer, kv, block, n, &off);
    return rc != 0 ? rc : backend_mapping_read(c->map, off, dst, n);
}

uintptr_t kvs_tier2_base(const kvs_client_t *c)
{
    return c && c->tier2_map && own_process(c) ? backend_mapping_base(c->tier2_map) : 0;
}

int kvs_tier2_block_addr(const kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block,
                         uintptr_t *addr)
{
    if (!c || !addr)
        return KVS_EINVAL;
    if (!c->map || !own_process(c))
        return KVS_ENOTCONN;
    if (!c->tier2_map)
        return KVS_ENOTSUP;
    const kvs_geometry_t *g = &c->geo;
    geometry_t layout;
    if (layout_of(g, &layout) != 0)
        return KVS_EPROTO;
    if (layer >= g->layers || kv >= geometry_planes(&layout) || block >= g->tier2_blocks)
        return KVS_EINVAL;
    *addr = backend_mapping_base(c->tier2_map) +
            geometry_offset(&layout, g->tier2_blocks, layer, kv, block);
    return 0;
}

int kvs_tier2_block_read(kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block, void *dst,
                         size_t n)
{
    uintptr_t addr;
    if (!dst && n)
        return KVS_EINVAL;
    if (c && foreign_process(c))
        return KVS_ENOTCONN;
    int rc = kvs_tier2_block_addr(c, layer, kv, block, &addr);
    if (rc != 0)
        return rc;
    if (n > c->geo.slot_bytes)
        return KVS_EINVAL;
    return backend_mapping_read(c->tier2_map, addr - backend_mapping_base(c->tier2_map), dst, n);
}

/* ensure + round_trip under one deadline: timeout_ms, plus extra_ms that
 * the daemon may take on purpose (a Lookup's wait); fast as round_trip's. */
static int call_within(kvs_client_t *c, Kvshare__Request *req, Kvshare__Response **resp,
                       const fast_reply_t *fast, uint32_t extra_ms)
{
    int64_t deadline = now_ms() + c->timeout_ms + extra_ms;
    *resp = NULL;
    int fresh = c->fd < 0;
    int rc = ensure(c, deadline);
    if (rc == CLIENT_FAST_FAIL)
        return KVS_ENOTCONN;
    if (rc != 0)
        return breaker_after(c, rc);
    rc = round_trip(c, req, resp, fast, deadline);
    /* A connection that died while idle (the daemon restarted): one fresh
     * attempt. Safe for every RPC: the old session's holdings are gone. */
    if (rc == KVS_ENOTCONN && !fresh && !*resp) {
        rc = connect_now(c, deadline);
        if (rc == 0)
            rc = round_trip(c, req, resp, fast, deadline);
    }
    return breaker_after(c, rc);
}

static int call(kvs_client_t *c, Kvshare__Request *req, Kvshare__Response **resp)
{
    return call_within(c, req, resp, NULL, 0);
}

/* The wire carries little-endian token ids; sending the array as is needs a
 * little-endian host (x86-64, aarch64: every host with a GPU kvshare drives). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "libkvshare sends token arrays as is: port tokens_bytes to big-endian first");

static ProtobufCBinaryData tokens_bytes(const uint32_t *tokens, size_t n)
{
    ProtobufCBinaryData b = {n * 4, (uint8_t *)tokens};
    return b;
}

/* Releases pins that a lookup returned beyond what the caller has room for
 * (the reply's ids from `from` on, pool then tier 2); best effort. */
static void release_surplus(kvs_client_t *c, const Kvshare__LookupReply *lr, size_t from)
{
    Kvshare__Request rr = KVSHARE__REQUEST__INIT;
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    Kvshare__Response *r2;
    size_t n1 = lr->n_block_ids;
    if (from < n1) {
        rl.n_block_ids = n1 - from;
        rl.block_ids = lr->block_ids + from;
    }
    size_t t2_from = from > n1 ? from - n1 : 0;
    if (t2_from < lr->n_tier2_block_ids) { /* (no arithmetic on a NULL array) */
        rl.n_tier2_block_ids = lr->n_tier2_block_ids - t2_from;
        rl.tier2_block_ids = lr->tier2_block_ids + t2_from;
    }
    rr.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
    rr.release = &rl;
    if (call(c, &rr, &r2) == 0 || r2)
        kvshare__response__free_unpacked(r2, NULL);
}

/* Where lookup_call wants a Lookup's answer. */
typedef struct lookup_out {
    uint32_t *ids;
    uint8_t *tiers;
    size_t max_ids;
    int in_place;
    size_t *n_blocks;
    uint32_t *inflight_blocks;
    int *waited;
} lookup_out_t;

/* fast_reply_t's take for a Lookup: a plain successful reply to id, read
 * in place (wire_lookup_reply_decode) into the caller's arrays. Anything
 * else, and a reply with more ids than the caller has room for (its
 * surplus pins go back: release_surplus), is left to protobuf-c. */
static bool lookup_take(kvs_client_t *c, const uint8_t *body, size_t len, uint64_t id, void *arg)
{
    (void)c;
    lookup_out_t *o = arg;
    wire_lookup_reply_t r;
    if (!wire_lookup_reply_decode(body, len, &r) || r.id != id ||
        (r.n_tier2_block_ids > 0 && !o->in_place))
        return false;
    size_t n1 = r.n_block_ids, n = n1 + r.n_tier2_block_ids;
    if (n > o->max_ids)
        return false;
    /* Little-endian on the wire as here (tokens_bytes' assertion). */
    if (n1)
        memcpy(o->ids, r.block_ids, n1 * sizeof(uint32_t));
    if (n > n1)
        memcpy(o->ids + n1, r.tier2_block_ids, (n - n1) * sizeof(uint32_t));
    if (o->tiers) {
        memset(o->tiers, 1, n1);
        memset(o->tiers + n1, 2, n - n1);
    }
    *o->n_blocks = n;
    if (o->inflight_blocks)
        *o->inflight_blocks = r.inflight_blocks;
    if (o->waited)
        *o->waited = r.waited;
    return true;
}

/* The Lookup RPC: kvs_lookup_wait, and with in_place (kvs_lookup_tier2)
 * the tier-2 part named where it is, tiers[i] saying which tier ids[i] is in. */
static int lookup_call(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                       int pin, int in_place, uint32_t wait_ms, uint32_t *ids, uint8_t *tiers,
                       size_t max_ids, size_t *n_blocks, uint32_t *inflight_blocks, int *waited)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    Kvshare__Response *resp;
    lk.ns = (char *)(ns ? ns : "");
    lk.tokens = tokens_bytes(tokens, n_tokens);
    lk.pin = pin != 0;
    lk.wait_ms = wait_ms;
    lk.tier2_in_place = in_place != 0;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    lookup_out_t out = {ids, tiers, max_ids, in_place, n_blocks, inflight_blocks, waited};
    fast_reply_t fast = {lookup_take, &out};
    int rc = call_within(c, &req, &resp, &fast, wait_ms);
    if (rc == 0 && !resp)
        return 0; /* read in place */
    if (rc == 0 && !in_place && resp->lookup->n_tier2_block_ids > 0)
        rc = set_err(c, KVS_EPROTO, "kvshared named tier-2 blocks to a lookup that did not ask");
    if (rc == 0) {
        const Kvshare__LookupReply *lr = resp->lookup;
        size_t n1 = lr->n_block_ids, n = n1 + lr->n_tier2_block_ids;
        if (n > max_ids) {
            /* Keep the prefix that fits; the rest stays pinned, so give it back. */
            if (pin)
                release_surplus(c, lr, max_ids);
            n = max_ids;
        }
        for (size_t i = 0; i < n; i++) {
            ids[i] = i < n1 ? lr->block_ids[i] : lr->tier2_block_ids[i - n1];
            if (tiers)
                tiers[i] = i < n1 ? 1 : 2;
        }
        *n_blocks = n;
        if (inflight_blocks)
            *inflight_blocks = lr->inflight_blocks;
        if (waited)
            *waited = lr->waited;
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

/* Copies the caller's options over the defaults in dst (dst_size bytes,
 * `size` first), as kvs_connect does: `size` bytes of them, so a struct of
 * an older header reads its missing fields as the defaults. NULL: the
 * defaults. Errors: KVS_EINVAL (size 0, or more than this library knows). */
static int opts_copy(void *dst, size_t dst_size, const void *src)
{
    if (!src)
        return 0;
    size_t size;
    memcpy(&size, src, sizeof(size));
    if (size < sizeof(size) || size > dst_size)
        return KVS_EINVAL;
    memcpy(dst, src, size);
    memcpy(dst, &dst_size, sizeof(dst_size));
    return 0;
}

/* Every options struct starts zeroed with its own size (kvshare.h). */
#define OPTS_INIT(o)                                                                               \
    do {                                                                                           \
        if (o) {                                                                                   \
            memset((o), 0, sizeof(*(o)));                                                          \
            (o)->size = sizeof(*(o));                                                              \
        }                                                                                          \
    } while (0)

void kvs_lookup_opts_init(kvs_lookup_opts_t *o)
{
    OPTS_INIT(o);
}

int kvs_lookup_ex(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                  const kvs_lookup_opts_t *opts, uint32_t *ids, size_t max_ids, size_t *n_blocks)
{
    kvs_lookup_opts_t o;
    kvs_lookup_opts_init(&o);
    int rc = opts_copy(&o, sizeof(o), opts);
    if (n_blocks)
        *n_blocks = 0;
    if (rc == 0 && o.inflight_blocks)
        *o.inflight_blocks = 0;
    if (rc == 0 && o.waited)
        *o.waited = 0;
    if (rc != 0 || !c || !n_blocks || (n_tokens && !tokens) || (max_ids && !ids) ||
        o.wait_ms > KVS_LOOKUP_MAX_WAIT_MS ||
        (o.tier2_in_place && (!o.pin || (max_ids && !o.tiers))))
        return KVS_EINVAL;
    return lookup_call(c, ns, tokens, n_tokens, o.pin, o.tier2_in_place, o.wait_ms, ids,
                       o.tier2_in_place ? o.tiers : NULL, max_ids, n_blocks, o.inflight_blocks,
                       o.waited);
}

int kvs_lookup_wait(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                    int pin, uint32_t wait_ms, uint32_t *ids, size_t max_ids, size_t *n_blocks,
                    uint32_t *inflight_blocks, int *waited)
{
    kvs_lookup_opts_t o;
    kvs_lookup_opts_init(&o);
    o.pin = pin;
    o.wait_ms = wait_ms;
    o.inflight_blocks = inflight_blocks;
    o.waited = waited;
    return kvs_lookup_ex(c, ns, tokens, n_tokens, &o, ids, max_ids, n_blocks);
}

int kvs_lookup_tier2(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                     uint32_t *ids, uint8_t *tiers, size_t max_ids, size_t *n_blocks)
{
    kvs_lookup_opts_t o;
    kvs_lookup_opts_init(&o);
    o.pin = 1;
    o.tier2_in_place = 1;
    o.tiers = tiers;
    return kvs_lookup_ex(c, ns, tokens, n_tokens, &o, ids, max_ids, n_blocks);
}

int kvs_lookup(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens, int pin,
               uint32_t *ids, size_t max_ids, size_t *n_blocks)
{
    kvs_lookup_opts_t o;
    kvs_lookup_opts_init(&o);
    o.pin = pin;
    return kvs_lookup_ex(c, ns, tokens, n_tokens, &o, ids, max_ids, n_blocks);
}

/* The Alloc RPC: with tokens a declaration, with report the evicted
 * blocks of ns (kvs_alloc_ex). */
static int alloc_call(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                      uint32_t first_block, uint32_t n, uint32_t *ids, int report,
                      uint32_t *evicted_tokens, size_t max_evicted, size_t *n_evicted)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    Kvshare__Response *resp;
    al.n = n;
    al.ns = (char *)(ns ? ns : "");
    al.tokens = tokens_bytes(tokens, n_tokens);
    al.first_block = first_block;
    al.report_evicted = report != 0;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    int rc = call(c, &req, &resp);
    if (rc == 0 && resp->alloc->n_block_ids != n)
        rc = set_err(c, KVS_EPROTO, "kvshared answered Alloc with a wrong reply");
    size_t bt = c->geo.block_tokens;
    if (rc == 0 && report && (bt == 0 || resp->alloc->evicted_tokens.len % (4 * bt) != 0))
        rc = set_err(c, KVS_EPROTO,
                     "kvshared reported %zu bytes of evicted tokens, not whole blocks of %zu",
                     resp->alloc->evicted_tokens.len, bt);
    if (rc == 0) {
        memcpy(ids, resp->alloc->block_ids, n * sizeof(uint32_t));
        if (report) {
            const uint8_t *p = resp->alloc->evicted_tokens.data;
            size_t blocks = resp->alloc->evicted_tokens.len / (4 * bt);
            *n_evicted = blocks < max_evicted ? blocks : max_evicted;
            for (size_t i = 0; i < *n_evicted * bt; i++, p += 4)
                evicted_tokens[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                    (uint32_t)p[3] << 24;
        }
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

void kvs_alloc_opts_init(kvs_alloc_opts_t *o)
{
    OPTS_INIT(o);
}

int kvs_alloc_ex(kvs_client_t *c, const char *ns, uint32_t n, const kvs_alloc_opts_t *opts,
                 uint32_t *ids)
{
    kvs_alloc_opts_t o;
    kvs_alloc_opts_init(&o);
    int rc = opts_copy(&o, sizeof(o), opts);
    int report = rc == 0 && o.n_evicted != NULL;
    if (report)
        *o.n_evicted = 0;
    bool named = ns && ns[0];
    if (rc != 0 || !c || !ids || n == 0 || (o.n_tokens && !o.tokens) ||
        (!o.n_tokens && o.first_block) || ((o.n_tokens || report) && !named) ||
        (report && o.max_evicted && !o.evicted_tokens))
        return KVS_EINVAL;
    return alloc_call(c, ns, o.tokens, o.n_tokens, o.first_block, n, ids, report, o.evicted_tokens,
                      o.max_evicted, o.n_evicted);
}

int kvs_alloc_for(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                  uint32_t first_block, uint32_t n, uint32_t *ids)
{
    kvs_alloc_opts_t o;
    kvs_alloc_opts_init(&o);
    o.tokens = tokens;
    o.n_tokens = n_tokens;
    o.first_block = first_block;
    return kvs_alloc_ex(c, ns, n, &o, ids);
}

int kvs_alloc_report(kvs_client_t *c, const char *ns, uint32_t n, uint32_t *ids,
                     uint32_t *evicted_tokens, size_t max_evicted, size_t *n_evicted)
{
    kvs_alloc_opts_t o;
    if (!n_evicted)
        return KVS_EINVAL; /* the report is what this call is for */
    kvs_alloc_opts_init(&o);
    o.evicted_tokens = evicted_tokens;
    o.max_evicted = max_evicted;
    o.n_evicted = n_evicted;
    return kvs_alloc_ex(c, ns, n, &o, ids);
}

int kvs_alloc(kvs_client_t *c, const char *ns, uint32_t n, uint32_t *ids)
{
    return kvs_alloc_ex(c, ns, n, NULL, ids);
}

int kvs_clear(kvs_client_t *c, const char *ns, size_t *n_cleared, size_t *n_kept)
{
    if (n_cleared)
        *n_cleared = 0;
    if (n_kept)
        *n_kept = 0;
    if (!c)
        return KVS_EINVAL;
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__ClearRequest cl = KVSHARE__CLEAR_REQUEST__INIT;
    Kvshare__Response *resp;
    cl.ns = (char *)(ns ? ns : "");
    req.rpc_case = KVSHARE__REQUEST__RPC_CLEAR;
    req.clear = &cl;
    int rc = call(c, &req, &resp);
    if (rc == 0) {
        if (n_cleared)
            *n_cleared = resp->clear->n_cleared;
        if (n_kept)
            *n_kept = resp->clear->n_kept;
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

_Static_assert(sizeof(kvs_evict_result_t) == 40, "kvs_evict_result_t changed size");

int kvs_evict(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
              kvs_evict_result_t *out)
{
    if (out)
        memset(out, 0, sizeof(*out));
    if (!c || (n_tokens && !tokens))
        return KVS_EINVAL;
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__EvictRequest ev = KVSHARE__EVICT_REQUEST__INIT;
    Kvshare__Response *resp;
    ev.ns = (char *)(ns ? ns : "");
    ev.tokens = tokens_bytes(tokens, n_tokens);
    req.rpc_case = KVSHARE__REQUEST__RPC_EVICT;
    req.evict = &ev;
    int rc = call(c, &req, &resp);
    if (rc == 0 && out) {
        out->tier1_blocks = resp->evict->n_tier1;
        out->tier2_blocks = resp->evict->n_tier2;
        out->kept_blocks = resp->evict->n_kept;
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

/* The wire form of a hint (NULL: none); wire is the caller's storage. */
static Kvshare__RetentionHint *hint_wire(const kvs_hint_t *hint, Kvshare__RetentionHint *wire)
{
    if (!hint)
        return NULL;
    kvshare__retention_hint__init(wire);
    wire->priority = hint->priority;
    wire->duration_ms = hint->duration_ms;
    return wire;
}

static bool hint_bad(const kvs_hint_t *hint)
{
    return hint && hint->priority > KVS_PRIORITY_MAX;
}

void kvs_commit_opts_init(kvs_commit_opts_t *o)
{
    OPTS_INIT(o);
}

int kvs_commit_ex(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                  const uint32_t *ids, size_t n_ids, const kvs_commit_opts_t *opts,
                  uint32_t *canonical, size_t *n_committed)
{
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    int rc = opts_copy(&o, sizeof(o), opts);
    if (n_committed)
        *n_committed = 0;
    if (rc != 0 || !c || (n_tokens && !tokens) || (n_ids && (!ids || !canonical)) ||
        hint_bad(o.hint))
        return KVS_EINVAL;
    Kvshare__RetentionHint wire;
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    Kvshare__Response *resp;
    cm.ns = (char *)(ns ? ns : "");
    cm.tokens = tokens_bytes(tokens, n_tokens);
    cm.n_block_ids = n_ids;
    cm.block_ids = (uint32_t *)ids;
    cm.hint = hint_wire(o.hint, &wire);
    cm.for_group = o.for_group != 0;
    cm.shard_written = o.shard_written != 0;
    if (o.n_pending)
        *o.n_pending = 0;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    rc = call(c, &req, &resp);
    /* On KVS_EQUOTA the reply still says which blocks were done. */
    if (resp && resp->rpc_case == KVSHARE__RESPONSE__RPC_COMMIT && resp->commit) {
        size_t n = resp->commit->n_canonical;
        if (n > n_ids)
            n = n_ids;
        if (n)
            memcpy(canonical, resp->commit->canonical, n * sizeof(uint32_t));
        if (n_committed)
            *n_committed = n;
        if (o.n_pending)
            *o.n_pending = resp->commit->n_pending;
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

int kvs_commit_hint(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                    const uint32_t *ids, size_t n_ids, uint32_t *canonical, size_t *n_committed,
                    const kvs_hint_t *hint)
{
    kvs_commit_opts_t o;
    kvs_commit_opts_init(&o);
    o.hint = hint;
    return kvs_commit_ex(c, ns, tokens, n_tokens, ids, n_ids, &o, canonical, n_committed);
}

int kvs_commit(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
               const uint32_t *ids, size_t n_ids, uint32_t *canonical, size_t *n_committed)
{
    return kvs_commit_ex(c, ns, tokens, n_tokens, ids, n_ids, NULL, canonical, n_committed);
}

/* The Pin RPC (pin) or the Release RPC: ids[0 .. n) in the pool, and for
 * a release t2[0 .. n2) in tier 2. */
static int ids_call(kvs_client_t *c, int pin, const uint32_t *ids, size_t n, const uint32_t *t2,
                    size_t n2, size_t *n_done, const kvs_hint_t *hint)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PinRequest pr = KVSHARE__PIN_REQUEST__INIT;
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    Kvshare__RetentionHint wire;
    Kvshare__Response *resp;
    pr.hint = rl.hint = hint_wire(hint, &wire);
    if (pin) {
        pr.n_block_ids = n;
        pr.block_ids = (uint32_t *)ids;
        req.rpc_case = KVSHARE__REQUEST__RPC_PIN;
        req.pin = &pr;
    } else {
        rl.n_block_ids = n;
        rl.block_ids = (uint32_t *)ids;
        rl.n_tier2_block_ids = n2;
        rl.tier2_block_ids = (uint32_t *)t2;
        req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
        req.release = &rl;
    }
    int rc = call(c, &req, &resp);
    /* After an error the reply still says how many were done. */
    if (resp && n_done) {
        if (pin && resp->rpc_case == KVSHARE__RESPONSE__RPC_PIN && resp->pin)
            *n_done = resp->pin->n_pinned;
        else if (!pin && resp->rpc_case == KVSHARE__RESPONSE__RPC_RELEASE && resp->release)
            *n_done = resp->release->n_released;
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

void kvs_pin_opts_init(kvs_pin_opts_t *o)
{
    OPTS_INIT(o);
}

int kvs_pin_ex(kvs_client_t *c, const uint32_t *ids, size_t n, const kvs_pin_opts_t *opts,
               size_t *n_done)
{
    kvs_pin_opts_t o;
    kvs_pin_opts_init(&o);
    int rc = opts_copy(&o, sizeof(o), opts);
    if (n_done)
        *n_done = 0;
    if (rc != 0 || !c || (n && !ids) || hint_bad(o.hint))
        return KVS_EINVAL;
    return ids_call(c, 1, ids, n, NULL, 0, n_done, o.hint);
}

int kvs_pin(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done)
{
    return kvs_pin_ex(c, ids, n, NULL, n_done);
}

int kvs_pin_hint(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done,
                 const kvs_hint_t *hint)
{
    kvs_pin_opts_t o;
    kvs_pin_opts_init(&o);
    o.hint = hint;
    return kvs_pin_ex(c, ids, n, &o, n_done);
}

void kvs_release_opts_init(kvs_release_opts_t *o)
{
    OPTS_INIT(o);
}

int kvs_release_ex(kvs_client_t *c, const uint32_t *ids, size_t n, const kvs_release_opts_t *opts,
                   size_t *n_done)
{
    kvs_release_opts_t o;
    kvs_release_opts_init(&o);
    int rc = opts_copy(&o, sizeof(o), opts);
    if (n_done)
        *n_done = 0;
    if (rc != 0 || !c || (n && !ids) || hint_bad(o.hint))
        return KVS_EINVAL;
    /* With tiers: the pool blocks, then the tier-2 ones. */
    size_t n1 = n;
    if (o.tiers) {
        n1 = 0;
        while (n1 < n && o.tiers[n1] == 1)
            n1++;
        for (size_t i = n1; i < n; i++)
            if (o.tiers[i] != 2)
                return set_err(c, KVS_EINVAL,
                               "kvs_release_tiers: block %zu is in tier %u; the list must be "
                               "tier-1 blocks, then tier-2 blocks, as kvs_lookup_tier2 returns "
                               "them",
                               i, (unsigned)o.tiers[i]);
    }
    return ids_call(c, 0, ids, n1, n1 < n ? ids + n1 : NULL, n - n1, n_done, o.hint);
}

int kvs_release(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done)
{
    return kvs_release_ex(c, ids, n, NULL, n_done);
}

int kvs_release_hint(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done,
                     const kvs_hint_t *hint)
{
    kvs_release_opts_t o;
    kvs_release_opts_init(&o);
    o.hint = hint;
    return kvs_release_ex(c, ids, n, &o, n_done);
}

int kvs_release_tiers(kvs_client_t *c, const uint32_t *ids, const uint8_t *tiers, size_t n,
                      size_t *n_done)
{
    kvs_release_opts_t o;
    if (n_done)
        *n_done = 0;
    if (n && !tiers)
        return KVS_EINVAL;
    kvs_release_opts_init(&o);
    o.tiers = tiers;
    return kvs_release_ex(c, ids, n, &o, n_done);
}

_Static_assert(KVS_N_COUNTERS <= KVS_COUNTER_SLOTS,
               "KVS_COUNTERS outgrew kvs_stats_t's room: a new SOVERSION is due");

const char *kvs_counter_name(size_t i)
{
#define COUNTER_NAME(name, ...) #name,
    static const char *const names[] = {KVS_COUNTERS(COUNTER_NAME)};
#undef COUNTER_NAME
    return i < KVS_N_COUNTERS ? names[i] : NULL;
}

/* A daemon of this version sends every counter in StatsReply.counters, in
 * KVS_COUNTERS order (counters it knows and this library does not are
 * dropped); an older one sends only the named fields. */
static void stats_counters(kvs_stats_t *out, const Kvshare__StatsReply *s)
{
    if (s->n_counters > 0) {
        size_t n = s->n_counters < KVS_COUNTER_SLOTS ? s->n_counters : KVS_COUNTER_SLOTS;
        memcpy(out->counters, s->counters, n * sizeof(uint64_t));
        return;
    }
#define NAMED_1(name) out->name = s->name;
#define NAMED_0(name)
#define NAMED(name, named, ...) NAMED_##named(name)
    KVS_COUNTERS(NAMED)
#undef NAMED
#undef NAMED_0
#undef NAMED_1
}

/* Part of the ABI: a field may only take the place of reserved room. */
_Static_assert(sizeof(kvs_ns_stats_t) == 192, "kvs_ns_stats_t changed size");
_Static_assert(sizeof(kvs_geometry_t) == 168, "kvs_geometry_t changed size");
_Static_assert(sizeof(kvs_options_t) == 104, "kvs_options_t changed size");
_Static_assert(sizeof(kvs_identity_t) == 104, "kvs_identity_t changed size");
_Static_assert(sizeof(kvs_lookup_opts_t) == 96, "kvs_lookup_opts_t changed size");
_Static_assert(sizeof(kvs_alloc_opts_t) == 104, "kvs_alloc_opts_t changed size");
_Static_assert(sizeof(kvs_commit_opts_t) == 64, "kvs_commit_opts_t changed size");
_Static_assert(sizeof(kvs_pin_opts_t) == 64, "kvs_pin_opts_t changed size");
_Static_assert(sizeof(kvs_release_opts_t) == 72, "kvs_release_opts_t changed size");
_Static_assert(sizeof(kvs_breaker_stats_t) == 96, "kvs_breaker_stats_t changed size");
_Static_assert(sizeof(kvs_ns_stats_t) % _Alignof(kvs_priority_bands_t) == 0,
               "the bands follow the rows in one allocation");

/* One Stats round trip: *resp to free with kvshare__response__free_unpacked. */
static int call_stats(kvs_client_t *c, Kvshare__Response **resp)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__StatsRequest sr = KVSHARE__STATS_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_STATS;
    req.stats = &sr;
    return call(c, &req, resp);
}

int kvs_restore_status(kvs_client_t *c, kvs_restore_status_t *out)
{
    if (!c || !out)
        return KVS_EINVAL;
    memset(out, 0, sizeof(*out));
    Kvshare__Response *resp;
    int rc = call_stats(c, &resp);
    if (rc != 0)
        return rc;
    const Kvshare__DiskRestore *d = resp->stats->disk_restore;
    if (d) {
        snprintf(out->phase, sizeof(out->phase), "%s", d->phase ? d->phase : "");
        out->slots = d->slots;
        out->scanned = d->scanned;
        out->records = d->records;
        out->restored = d->restored;
        out->dropped = d->dropped;
        out->elapsed_ms = d->elapsed_ms;
    }
    kvshare__response__free_unpacked(resp, NULL);
    return 0;
}

int kvs_stats(kvs_client_t *c, kvs_stats_t *out)
{
    if (!c || !out)
        return KVS_EINVAL;
    memset(out, 0, sizeof(*out));
    Kvshare__Response *resp;
    int rc = call_stats(c, &resp);
    if (rc == 0) {
        const Kvshare__StatsReply *s = resp->stats;
        out->total_blocks = s->total_blocks;
        out->free_blocks = s->free_blocks;
        out->writing_blocks = s->writing_blocks;
        out->cached_blocks = s->cached_blocks;
        out->pinned_blocks = s->pinned_blocks;
        out->sessions = s->sessions;
        stats_counters(out, s);
        out->block_bytes = s->block_bytes;
        out->pool_bytes = s->pool_bytes;
        out->index_bytes = s->index_bytes;
        out->block_tokens = s->block_tokens;
        out->backend = (kvs_backend_t)s->backend;
        out->uptime_ms = s->uptime_ms;
        out->tier2_total_blocks = s->tier2_total_blocks;
        out->tier2_cached_blocks = s->tier2_cached_blocks;
        out->copying_blocks = s->copying_blocks;
        out->loop_busy_max_us =
            s->loop_busy_max_us > UINT32_MAX ? UINT32_MAX : (uint32_t)s->loop_busy_max_us;
        if (s->copy_path && s->copy_path[0]) {
            out->copy_path = strdup(s->copy_path);
            if (!out->copy_path) {
                rc = KVS_ENOMEM;
                goto done;
            }
        }
        if (s->n_devices > 0) {
            out->devices = calloc(s->n_devices, sizeof(*out->devices));
            if (!out->devices) {
                rc = KVS_ENOMEM;
                goto done;
            }
            out->n_devices = s->n_devices;
            for (size_t i = 0; i < s->n_devices; i++) {
                const Kvshare__DeviceStats *src = s->devices[i];
                kvs_device_stats_t *d = &out->devices[i];
                d->rank = src->rank;
                d->ordinal = src->ordinal;
                snprintf(d->detail, sizeof(d->detail), "%s", src->detail ? src->detail : "");
                d->pool_bytes = src->pool_bytes;
                d->used_bytes = src->used_bytes;
                d->workers = src->workers;
                d->shards_written = src->shards_written;
                d->shards_missing = src->shards_missing;
            }
        }
        out->tier3_total_blocks = s->tier3_total_blocks;
        out->tier3_cached_blocks = s->tier3_cached_blocks;
        if (s->disk_io && s->disk_io[0]) {
            out->disk_io = strdup(s->disk_io);
            if (!out->disk_io) {
                rc = KVS_ENOMEM;
                goto done;
            }
        }
        if (s->n_cluster_nodes > 0) {
            out->cluster_nodes = calloc(s->n_cluster_nodes, sizeof(*out->cluster_nodes));
            if (!out->cluster_nodes) {
                rc = KVS_ENOMEM;
                goto done;
            }
            out->n_cluster_nodes = s->n_cluster_nodes;
            for (size_t i = 0; i < s->n_cluster_nodes; i++) {
                const Kvshare__ClusterNode *src = s->cluster_nodes[i];
                kvs_cluster_node_t *d = &out->cluster_nodes[i];
                snprintf(d->address, sizeof(d->address), "%s", src->address ? src->address : "");
                snprintf(d->state, sizeof(d->state), "%s", src->state ? src->state : "");
                d->slots = src->slots;
                d->requests = src->requests;
                d->errors = src->errors;
                d->replies = src->replies;
                d->latency_us_sum = src->latency_us_sum;
                d->latency_us_max = src->latency_us_max;
            }
        }
        if (s->n_namespaces > 0) {
            /* One allocation: the rows, then their bands. */
            out->namespaces =
                calloc(s->n_namespaces, sizeof(*out->namespaces) + sizeof(kvs_priority_bands_t));
            if (!out->namespaces) {
                rc = KVS_ENOMEM;
                goto done;
            }
            out->n_namespaces = s->n_namespaces;
            for (size_t i = 0; i < s->n_namespaces; i++) {
                const Kvshare__NamespaceStats *src = s->namespaces[i];
                kvs_ns_stats_t *d = &out->namespaces[i];
                snprintf(d->name, sizeof(d->name), "%s", src->name ? src->name : "");
                d->lookups = src->lookups;
                d->lookup_tokens = src->lookup_tokens;
                d->hit_tokens = src->hit_tokens;
                d->inserted_blocks = src->inserted_blocks;
                d->duplicate_blocks = src->duplicate_blocks;
                d->evicted_blocks = src->evicted_blocks;
                d->cached_blocks = src->cached_blocks;
                d->pinned_blocks = src->pinned_blocks;
                d->quota = src->quota;
                d->reserve = src->reserve;
                d->evicted_own = src->evicted_own;
                d->evicted_others = src->evicted_others;
                d->evicted_quota = src->evicted_quota;
                kvs_priority_bands_t *bands =
                    (kvs_priority_bands_t *)(out->namespaces + s->n_namespaces) + i;
                for (size_t b = 0; b < KVS_PRIORITY_BANDS; b++) {
                    if (b < src->n_cached_by_priority)
                        bands->cached[b] = src->cached_by_priority[b];
                    if (b < src->n_evicted_by_priority)
                        bands->evicted[b] = src->evicted_by_priority[b];
                }
                d->bands = bands;
                d->tier2_blocks = src->tier2_blocks;
                d->tier2_hit_tokens = src->tier2_hit_tokens;
            }
        }
    }
done:
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

void kvs_stats_free(kvs_stats_t *s)
{
    if (!s)
        return;
    free(s->namespaces);
    s->namespaces = NULL;
    s->n_namespaces = 0;
    free(s->copy_path);
    s->copy_path = NULL;
    free(s->devices);
    s->devices = NULL;
    s->n_devices = 0;
    free(s->disk_io);
    s->disk_io = NULL;
    free(s->cluster_nodes);
    s->cluster_nodes = NULL;
    s->n_cluster_nodes = 0;
}

int kvs_tree(kvs_client_t *c, const char *ns, int by_size, kvs_prefix_t *out, size_t max,
             size_t *n_out)
{
    if (n_out)
        *n_out = 0;
    if (!c || !n_out || (max && !out) || max > UINT32_MAX)
        return KVS_EINVAL;
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__TreeRequest tr = KVSHARE__TREE_REQUEST__INIT;
    Kvshare__Response *resp;
    tr.ns = (char *)(ns ? ns : "");
    tr.max = (uint32_t)max;
    tr.by_size = by_size != 0;
    req.rpc_case = KVSHARE__REQUEST__RPC_TREE;
    req.tree = &tr;
    int rc = call(c, &req, &resp);
    if (rc == 0) {
        size_t n = resp->tree->n_prefixes < max ? resp->tree->n_prefixes : max;
        for (size_t i = 0; i < n; i++) {
            const Kvshare__Prefix *p = resp->tree->prefixes[i];
            kvs_prefix_t *d = &out[i];
            memset(d, 0, sizeof(*d));
            snprintf(d->ns, sizeof(d->ns), "%s", p->ns ? p->ns : "");
            d->tokens = p->tokens;
            d->blocks = p->blocks;
            d->pins = p->pins;
            d->hits = p->hits;
            d->age_ticks = p->age_ticks;
            d->last_block_id = p->last_block_id;
            d->tier = p->tier;
            d->tier2_blocks = p->tier2_blocks;
            d->parent_block_id = p->parent_block_id;
            d->has_parent = p->has_parent ? 1 : 0;
        }
        *n_out = n;
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

void kvs_sessions_free(kvs_session_info_t *s, size_t n)
{
    if (!s)
        return;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < s[i].n_namespaces; j++)
            free(s[i].namespaces[j]);
        free(s[i].namespaces);
    }
    free(s);
}

/* Copies one row of the reply; KVS_ENOMEM. */
static int session_row(const Kvshare__SessionInfo *p, kvs_session_info_t *d)
{
    memset(d, 0, sizeof(*d));
    d->id = p->id;
    d->pid = p->pid;
    d->uid = p->uid;
    snprintf(d->worker, sizeof(d->worker), "%s", p->worker ? p->worker : "");
    d->pins = p->pins;
    d->writing = p->writing;
    d->pins_total = p->pins_total;
    d->buffered = p->buffered;
    d->age_s = p->age_s;
    d->idle_s = p->idle_s;
    d->requests = p->requests;
    d->held = p->held ? 1 : 0;
    snprintf(d->held_for, sizeof(d->held_for), "%s", p->held_for ? p->held_for : "");
    if (p->n_namespaces == 0)
        return 0;
    d->namespaces = calloc(p->n_namespaces, sizeof(*d->namespaces));
    if (!d->namespaces)
        return KVS_ENOMEM;
    for (size_t j = 0; j < p->n_namespaces; j++) {
        d->namespaces[j] = strdup(p->namespaces[j] ? p->namespaces[j] : "");
        if (!d->namespaces[j])
            return KVS_ENOMEM;
        d->n_namespaces = j + 1;
    }
    return 0;
}

int kvs_sessions(kvs_client_t *c, kvs_session_info_t **out, size_t *n)
{
    if (out)
        *out = NULL;
    if (n)
        *n = 0;
    if (!c || !out || !n)
        return KVS_EINVAL;
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__SessionsRequest sr = KVSHARE__SESSIONS_REQUEST__INIT;
    Kvshare__Response *resp;
    req.rpc_case = KVSHARE__REQUEST__RPC_SESSIONS;
    req.sessions = &sr;
    int rc = call(c, &req, &resp);
    if (rc == 0 && resp->sessions->n_sessions) {
        size_t m = resp->sessions->n_sessions;
        kvs_session_info_t *rows = calloc(m, sizeof(*rows));
        if (!rows)
            rc = KVS_ENOMEM;
        for (size_t i = 0; rows && i < m && rc == 0; i++)
            rc = session_row(resp->sessions->sessions[i], &rows[i]);
        if (rc == 0) {
            *out = rows;
            *n = m;
        } else {
            kvs_sessions_free(rows, m);
        }
    }
    if (resp)
        kvshare__response__free_unpacked(resp, NULL);
    return rc;
}

int kvs_ping(kvs_client_t *c, size_t payload_bytes, double *rtt_us)
{
    if (!c)
        return KVS_EINVAL;
    uint8_t *payload = payload_bytes ? calloc(1, payload_bytes) : NULL;
    if (payload_bytes && !payload)
        return KVS_ENOMEM;
    int64_t deadline = now_ms() + c->timeout_ms;
    int rc = ensure(c, deadline);
    if (rc == CLIENT_FAST_FAIL) {
        free(payload);
        return KVS_ENOTCONN;
    }
    if (rc == 0) {
        Kvshare__Request req = KVSHARE__REQUEST__INIT;
        Kvshare__PingRequest pr = KVSHARE__PING_REQUEST__INIT;
        Kvshare__Response *resp = NULL;
        pr.payload.len = payload_bytes;
        pr.payload.data = payload;
        req.rpc_case = KVSHARE__REQUEST__RPC_PING;
        req.ping = &pr;
        int64_t t0 = now_ns();
        rc = round_trip(c, &req, &resp, NULL, deadline);
        if (rc == 0 && rtt_us)
            *rtt_us = (double)(now_ns() - t0) / 1e3;
        if (resp)
            kvshare__response__free_unpacked(resp, NULL);
    }
    free(payload);
    return breaker_after(c, rc);
}
