/* SPDX-License-Identifier: Apache-2.0 */
#include "events.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvshare_status.h"
#include "log.h"

/* A batch is flushed at this many events, or once its events take
 * EVENTS_MSG_TARGET bytes (events.h), so that one message (and one replay
 * slot) stays small. */
#define BATCH_MAX_EVENTS 1024
/* How long the publisher lets a batch fill once woken by its first event. */
#define BATCH_WAIT_MS 1
/* How long events_stop lets subscribers take what is queued. */
#define STOP_LINGER_MS 100

/* The replay socket's bounds (docs/RELIABILITY.md, H3). */
#define REPLAY_JOBS                 8   /* replays being sent at once, all peers together */
#define REPLAY_PEERS                64  /* recent requesters whose rate is kept */
#define REPLAY_PEER_GAP_MS          100 /* one request per peer per this long */
#define REPLAY_PEER_HWM             64  /* messages queued for one peer */
#define REPLAY_RCV_HWM              4   /* requests queued from one peer */
#define REPLAY_MAX_FRAME            512 /* bytes of one request frame; a larger one ends the connection */
#define REPLAY_BURST                64   /* messages one job sends per turn */
#define REPLAY_READS                64   /* requests read per turn */
#define REPLAY_STALL_MS             5000 /* a job whose peer takes nothing for this long ends */
#define REPLAY_POLL_MS              10   /* how soon the publisher looks again at waiting jobs */
#define REPLAY_HEARTBEAT_MS         1000
#define REPLAY_HEARTBEAT_TIMEOUT_MS 10000
#define REPLAY_ID_MAX               255 /* ZeroMQ routing ids are at most 255 bytes */

enum { REC_STORED = 1, REC_REMOVED = 2, REC_CLEARED = 3 };

/* One queued event in the hand-off ring, followed by its keys (uint64_t),
 * token ids (uint32_t, n_keys x block_tokens for REC_STORED), model name
 * (the topic's {model}: the publisher writes one topic per identity) and
 * LoRA name; `size` covers all of it, rounded up to 8. size 0 marks the
 * rest of the ring unused: the next record is at the ring's start. */
typedef struct rec {
    uint32_t size;
    uint8_t kind;
    uint8_t has_parent;
    uint16_t model_len;
    uint16_t lora_len;
    uint8_t medium; /* events_medium_t */
    uint8_t pad;
    uint32_t n_keys;
    uint64_t parent;
} rec_t;

/* One message of one identity: its topic, then its payload. Shared by
 * reference between PUB's queues, the replay ring and replay answers (no
 * copy per subscriber); freed with the last reference, from whichever
 * thread drops it. `held` counts every live buffer's size. */
typedef struct msgbuf {
    _Atomic uint32_t refs;
    uint32_t topic_len;
    size_t size; /* this struct and bytes[] */
    struct events *ev;
    uint8_t bytes[];
} msgbuf_t;

/* A sent message kept for replay. Slots are indexed by msg, which counts
 * messages of every identity; seq is the message's number in its
 * identity's stream. */
typedef struct replay_slot {
    uint64_t msg, seq;
    uint32_t ident;
    msgbuf_t *buf; /* NULL: empty */
} replay_slot_t;

/* A replay being sent: messages [next, end) of ring positions, of stream
 * `ident`, from start_seq on, to the peer `id`; pump_replays sends what the
 * peer's queue takes. */
typedef struct replay_job {
    bool on;
    uint8_t id[REPLAY_ID_MAX];
    size_t id_len;
    uint32_t ident;
    uint64_t start_seq, next, end;
    uint64_t progress_ms; /* when the peer last took a message */
} replay_job_t;

/* A recent requester and when its last replay was taken. */
typedef struct replay_peer {
    uint8_t id[REPLAY_ID_MAX];
    uint8_t id_len;
    uint64_t last_ms;
} replay_peer_t;

struct events {
    events_config_t cfg;
    uint32_t block_tokens;
    char medium[16];
    /* The {pod} of each stream: the identities, or the pod alone. */
    uint32_t n_idents;
    uint16_t ident_len[EVENTS_IDENT_MAX];
    char ident[EVENTS_IDENT_MAX][EVENTS_NAME_MAX + 1];

    /* The hand-off ring: the loop thread advances head, the publisher tail
     * (both count bytes since start; position = count % ring_cap). */
    uint8_t *ring;
    size_t ring_cap;
    _Atomic uint64_t head, tail;
    _Atomic bool sleeping; /* the publisher waits in zmq_poll */
    size_t msg_max;        /* bytes of one message at most (events_msg_max) */
    uint32_t sub_hwm;      /* PUB's high-water mark: hwm, or fewer for subscriber_bytes */
    _Atomic bool stop;
    int wake_fd; /* eventfd: written when the publisher sleeps */

    /* Publisher thread only. */
    void *zctx, *pub, *router;
    pthread_t thread;
    bool thread_on;
    uint64_t next_seq[EVENTS_IDENT_MAX]; /* per identity: each topic counts from 0 */
    uint64_t next_msg;                   /* messages of all identities: replay slots */
    msgpack_sbuffer sbuf;                /* the batch being sent */
    msgpack_packer pk;
    msgpack_sbuffer ebuf; /* the events of the batch being built */
    msgpack_packer epk;
    uint32_t n_packed; /* events in ebuf */
    uint16_t cur_model_len;
    char cur_model[EVENTS_NAME_MAX + 1]; /* the model of the batch being built */
    size_t blocks_per_event;             /* a BlockStored's most blocks (pack_record) */
    replay_slot_t *replay;
    size_t replay_bytes;    /* held by the slots */
    uint64_t replay_oldest; /* msg of the oldest message that may still be held */
    replay_job_t jobs[REPLAY_JOBS];
    replay_peer_t peers[REPLAY_PEERS];

    _Atomic uint64_t held; /* bytes of live message buffers (msgbuf_t) */
    _Atomic uint64_t published, replay_requests, replay_refused, replay_stalled, send_drops;
};

size_t events_msg_max(uint32_t block_tokens)
{
    /* The batch is sent once its events reach the target: before the last
     * event it held less; the last is a chunk of at most half the target,
     * or one block; then the event's fixed fields (names up to 127 bytes),
     * the batch's header and the topic. */
    size_t block_max = 9 + 5 * (size_t)block_tokens;
    size_t last = block_max > EVENTS_MSG_TARGET / 2 ? block_max : EVENTS_MSG_TARGET / 2;
    return EVENTS_MSG_TARGET + last + 512 + 64 + EVENTS_TOPIC_MAX + 8;
}

/* HOST:PORT after tcp://: HOST a name, an IPv4 address, * or [IPv6] (its
 * brackets closed), PORT 1 to 65535 or * (any free one). */
static bool tcp_host_port_valid(const char *hp)
{
    const char *colon;
    if (hp[0] == '[') {
        const char *close = strchr(hp, ']');
        if (!close || close == hp + 1 || close[1] != ':')
            return false;
        colon = close + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon || colon == hp || memchr(hp, '[', (size_t)(colon - hp)) ||
            memchr(hp, ']', (size_t)(colon - hp)))
            return false;
    }
    const char *port = colon + 1;
    if (strcmp(port, "*") == 0)
        return true;
    size_t digits = strspn(port, "0123456789");
    if (digits == 0 || digits > 5 || port[digits] != '\0')
        return false;
    long v = strtol(port, NULL, 10);
    return v >= 1 && v <= 65535;
}

int events_check_endpoint(const char *endpoint)
{
    if (!endpoint)
        return KVS_EINVAL;
    if (strncmp(endpoint, "tcp://", 6) == 0 && tcp_host_port_valid(endpoint + 6))
        return 0;
    if (strncmp(endpoint, "ipc://", 6) == 0 && endpoint[6])
        return 0;
    return KVS_EINVAL;
}

int events_check_topic(const char *tmpl)
{
    if (!tmpl || strlen(tmpl) > EVENTS_TOPIC_MAX)
        return KVS_EINVAL;
    for (const char *p = strchr(tmpl, '{'); p; p = strchr(p + 1, '{'))
        if (strncmp(p, "{pod}", 5) != 0 && strncmp(p, "{model}", 7) != 0)
            return KVS_EINVAL;
    /* Both: a topic names whose blocks (the pod) of which model they are. */
    return strstr(tmpl, "{pod}") && strstr(tmpl, "{model}") ? 0 : KVS_EINVAL;
}

int events_check_identities(const char *list)
{
    if (!list || !list[0])
        return KVS_EINVAL;
    size_t n = 0;
    for (const char *p = list;; p++) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len > EVENTS_NAME_MAX || memchr(p, '@', len) || memchr(p, '{', len) ||
            memchr(p, '}', len) || ++n > EVENTS_IDENT_MAX)
            return KVS_EINVAL;
        /* No name twice: two streams would share a topic and its seq. */
        for (const char *q = list; q < p; q += strcspn(q, ",") + 1)
            if (strcspn(q, ",") == len && memcmp(q, p, len) == 0)
                return KVS_EINVAL;
        p += len;
        if (!*p)
            return 0;
    }
}

/* Calls fn for each identity of cfg (or its pod, or the host name). */
static void for_each_ident(const events_config_t *cfg,
                           void (*fn)(void *arg, const char *name, size_t len), void *arg)
{
    if (cfg->identities) {
        for (const char *p = cfg->identities;; p++) {
            size_t len = strcspn(p, ",");
            fn(arg, p, len);
            p += len;
            if (!*p)
                return;
        }
    }
    char host[256];
    const char *pod = cfg->pod;
    if (!pod) {
        if (gethostname(host, sizeof(host)) != 0)
            snprintf(host, sizeof(host), "localhost");
        host[sizeof(host) - 1] = '\0';
        pod = host;
    }
    fn(arg, pod, strlen(pod));
}

/* Expands tmpl with pod and model into out (EVENTS_TOPIC_MAX + 1 bytes).
 * Returns the length, or -1 when it does not fit. */
static int expand_topic(const char *tmpl, const char *pod, size_t pod_len, const char *model,
                        size_t model_len, char *out)
{
    size_t len = 0;
    for (const char *p = tmpl; *p;) {
        const char *put = p;
        size_t n = 1;
        if (strncmp(p, "{pod}", 5) == 0) {
            put = pod;
            n = pod_len;
            p += 5;
        } else if (strncmp(p, "{model}", 7) == 0) {
            put = model;
            n = model_len;
            p += 7;
        } else {
            p++;
        }
        if (len + n > EVENTS_TOPIC_MAX)
            return -1;
        memcpy(out + len, put, n);
        len += n;
    }
    out[len] = '\0';
    return (int)len;
}

/* vLLM's rule: bind on a wildcard address or a local transport, else
 * connect (a central indexer that binds). */
static bool endpoint_binds(const char *endpoint)
{
    return strchr(endpoint, '*') || strstr(endpoint, "::") || strncmp(endpoint, "ipc://", 6) == 0 ||
           strncmp(endpoint, "inproc://", 9) == 0;
}

struct expand_check {
    const char *tmpl, *model;
    events_stream_t *st;
    bool fits;
};

static void expand_one(void *arg, const char *name, size_t len)
{
    struct expand_check *x = arg;
    char topic[EVENTS_TOPIC_MAX + 1];
    int n = expand_topic(x->tmpl, name, len, x->model, strlen(x->model),
                         x->st->topic_len ? topic : x->st->topic);
    if (n < 0)
        x->fits = false;
    else if (!x->st->topic_len)
        x->st->topic_len = (uint16_t)n;
}

int events_stream_init(const events_config_t *cfg, const char *model, const char *lora,
                       events_stream_t *st)
{
    memset(st, 0, sizeof(*st));
    if (!model || !model[0])
        return 0;
    if (strlen(model) > EVENTS_NAME_MAX || (lora && strlen(lora) > EVENTS_NAME_MAX))
        return KVS_EINVAL;
    /* Every identity's topic must fit; st->topic is the first one's. */
    struct expand_check x = {cfg->topic ? cfg->topic : EVENTS_DEFAULT_TOPIC, model, st, true};
    for_each_ident(cfg, expand_one, &x);
    if (!x.fits) {
        memset(st, 0, sizeof(*st));
        return KVS_EINVAL;
    }
    st->model_len = (uint16_t)strlen(model);
    memcpy(st->model, model, st->model_len + 1u);
    if (lora && lora[0]) {
        st->lora_len = (uint16_t)strlen(lora);
        memcpy(st->lora, lora, st->lora_len + 1u);
    }
    st->on = true;
    return 0;
}

/* --- the hand-off ring: loop thread side --- */

static size_t round8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* Room for a record of `size` bytes (a multiple of 8) at the head, or NULL
 * when the ring is full. *advance is what the head moves by on commit
 * (size, plus the unused end of the ring when the record wraps). */
static rec_t *ring_reserve(events_t *ev, size_t size, uint64_t *advance)
{
    uint64_t head = atomic_load_explicit(&ev->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ev->tail, memory_order_acquire);
    size_t pos = (size_t)(head % ev->ring_cap), to_end = ev->ring_cap - pos;
    size_t need = size > to_end ? to_end + size : size;
    if (size > ev->ring_cap || head + need - tail > ev->ring_cap)
        return NULL;
    if (size > to_end) {
        ((rec_t *)(void *)(ev->ring + pos))->size = 0; /* to_end >= 8: the marker fits */
        pos = 0;
    }
    *advance = need;
    return (rec_t *)(void *)(ev->ring + pos);
}

static void ring_commit(events_t *ev, uint64_t advance)
{
    /* seq_cst with the publisher's store of `sleeping` then load of head:
     * one of the two sides sees the other, so no wake-up is lost. */
    atomic_fetch_add(&ev->head, advance);
    if (atomic_load(&ev->sleeping)) {
        uint64_t one = 1;
        ssize_t rc = write(ev->wake_fd, &one, sizeof(one));
        (void)rc; /* EAGAIN: the counter is already non-zero, it wakes anyway */
    }
}

/* Queues one record with keys[0..n_keys). */
static int queue_event(events_t *ev, const events_stream_t *st, int kind, events_medium_t m,
                       const uint64_t *keys, size_t n_keys, bool has_parent, uint64_t parent,
                       const uint32_t *tokens)
{
    if (!ev || !st || !st->on)
        return 0;
    size_t n_tokens = kind == REC_STORED ? n_keys * ev->block_tokens : 0;
    size_t size = round8(sizeof(rec_t) + n_keys * sizeof(uint64_t) + n_tokens * sizeof(uint32_t) +
                         st->model_len + st->lora_len);
    uint64_t advance;
    rec_t *r = ring_reserve(ev, size, &advance);
    if (!r)
        return KVS_ELIMIT;
    *r = (rec_t){.size = (uint32_t)size,
                 .kind = (uint8_t)kind,
                 .has_parent = has_parent,
                 .model_len = st->model_len,
                 .lora_len = kind == REC_STORED ? st->lora_len : 0,
                 .medium = (uint8_t)m,
                 .n_keys = (uint32_t)n_keys,
                 .parent = parent};
    uint64_t *k = (uint64_t *)(void *)(r + 1);
    for (size_t i = 0; i < n_keys; i++)
        k[i] = keys[i];
    uint8_t *p = (uint8_t *)(k + n_keys);
    if (n_tokens)
        memcpy(p, tokens, n_tokens * sizeof(uint32_t));
    p += n_tokens * sizeof(uint32_t);
    memcpy(p, st->model, st->model_len);
    p += st->model_len;
    memcpy(p, st->lora, r->lora_len);
    ring_commit(ev, advance);
    return 0;
}

const char *events_medium_name(const events_t *ev, events_medium_t m)
{
    switch (m) {
    case EVENTS_MEDIUM_HOST:
        return "CPU";
    case EVENTS_MEDIUM_DISK:
        return "DISK";
    default:
        return ev ? ev->medium : "GPU";
    }
}

int events_stored(events_t *ev, const events_stream_t *st, events_medium_t m, const uint64_t *keys,
                  size_t n, bool has_parent, uint64_t parent, const uint32_t *tokens)
{
    if (n == 0)
        return 0;
    return queue_event(ev, st, REC_STORED, m, keys, n, has_parent, parent, tokens);
}

int events_removed(events_t *ev, const events_stream_t *st, events_medium_t m, uint64_t key)
{
    return queue_event(ev, st, REC_REMOVED, m, &key, 1, false, 0, NULL);
}

int events_cleared(events_t *ev, const events_stream_t *st)
{
    return queue_event(ev, st, REC_CLEARED, EVENTS_MEDIUM_POOL, NULL, 0, false, 0, NULL);
}

void events_counters(const events_t *ev, events_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!ev)
        return;
    out->published = atomic_load(&ev->published);
    out->replay_requests = atomic_load(&ev->replay_requests);
    out->replay_refused = atomic_load(&ev->replay_refused);
    out->replay_stalled = atomic_load(&ev->replay_stalled);
    out->send_drops = atomic_load(&ev->send_drops);
    out->held_bytes = atomic_load(&ev->held);
    out->subscriber_hwm = ev->sub_hwm;
}

bool events_flush(events_t *ev, uint32_t timeout_ms)
{
    if (!ev)
        return true;
    uint64_t want = atomic_load(&ev->head);
    for (uint32_t waited = 0; atomic_load(&ev->tail) < want; waited++) {
        if (waited >= timeout_ms)
            return false;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return true;
}

/* --- the publisher thread: encoding --- */

static const uint64_t *rec_keys(const rec_t *r)
{
    return (const uint64_t *)(const void *)(r + 1);
}

static const uint32_t *rec_tokens(const rec_t *r)
{
    return (const uint32_t *)(const void *)(rec_keys(r) + r->n_keys);
}

static const char *rec_model(const events_t *ev, const rec_t *r)
{
    size_t n_tokens = r->kind == REC_STORED ? (size_t)r->n_keys * ev->block_tokens : 0;
    return (const char *)(rec_tokens(r) + n_tokens);
}

static void pack_str(msgpack_packer *pk, const char *s, size_t len)
{
    msgpack_pack_str(pk, len);
    msgpack_pack_str_body(pk, s, len);
}

#define PACK_KEY(pk, lit) pack_str((pk), (lit), sizeof(lit) - 1)

/* BlockStored for keys[0..n) and their tokens, as vLLM's msgspec structs
 * encode it: a map tagged by "type", or an array with the tag first and the
 * fields in declaration order. */
static void pack_stored(events_t *ev, const rec_t *r, const uint64_t *keys, size_t n,
                        bool has_parent, uint64_t parent, const uint32_t *tokens)
{
    msgpack_packer *pk = &ev->epk;
    bool map = ev->cfg.encoding == EVENTS_MAP;
    size_t n_tokens = n * ev->block_tokens;
    const char *lora = rec_model(ev, r) + r->model_len;
    if (map) {
        msgpack_pack_map(pk, 8);
        PACK_KEY(pk, "type");
    } else {
        msgpack_pack_array(pk, 8);
    }
    PACK_KEY(pk, "BlockStored");
    if (map)
        PACK_KEY(pk, "block_hashes");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, keys[i]);
    if (map)
        PACK_KEY(pk, "parent_block_hash");
    if (has_parent)
        msgpack_pack_uint64(pk, parent);
    else
        msgpack_pack_nil(pk);
    if (map)
        PACK_KEY(pk, "token_ids");
    msgpack_pack_array(pk, n_tokens);
    for (size_t i = 0; i < n_tokens; i++)
        msgpack_pack_uint32(pk, tokens[i]);
    if (map)
        PACK_KEY(pk, "block_size");
    msgpack_pack_uint32(pk, ev->block_tokens);
    if (map)
        PACK_KEY(pk, "lora_id");
    msgpack_pack_nil(pk);
    if (map)
        PACK_KEY(pk, "medium");
    const char *medium = events_medium_name(ev, (events_medium_t)r->medium);
    pack_str(pk, medium, strlen(medium));
    if (map)
        PACK_KEY(pk, "lora_name");
    if (r->lora_len)
        pack_str(pk, lora, r->lora_len);
    else
        msgpack_pack_nil(pk);
}

/* BlockRemoved or AllBlocksCleared. */
static void pack_other(events_t *ev, const rec_t *r)
{
    msgpack_packer *pk = &ev->epk;
    bool map = ev->cfg.encoding == EVENTS_MAP;
    if (r->kind == REC_REMOVED) {
        if (map) {
            msgpack_pack_map(pk, 3);
            PACK_KEY(pk, "type");
        } else {
            msgpack_pack_array(pk, 3);
        }
        PACK_KEY(pk, "BlockRemoved");
        if (map)
            PACK_KEY(pk, "block_hashes");
        msgpack_pack_array(pk, r->n_keys);
        for (uint32_t i = 0; i < r->n_keys; i++)
            msgpack_pack_uint64(pk, rec_keys(r)[i]);
        if (map)
            PACK_KEY(pk, "medium");
        const char *medium = events_medium_name(ev, (events_medium_t)r->medium);
        pack_str(pk, medium, strlen(medium));
        return;
    }
    if (map) {
        msgpack_pack_map(pk, 1);
        PACK_KEY(pk, "type");
    } else {
        msgpack_pack_array(pk, 1);
    }
    PACK_KEY(pk, "AllBlocksCleared");
}

static void seq_bytes(uint64_t seq, uint8_t out[8])
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (uint8_t)seq;
        seq >>= 8;
    }
}

/* --- the publisher thread: message buffers --- */

static void msgbuf_unref(msgbuf_t *b)
{
    if (atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    atomic_fetch_sub(&b->ev->held, b->size);
    free(b);
}

/* ZeroMQ's free function: its I/O thread calls it when no queue holds the
 * frame any more. */
static void msgbuf_zfree(void *data, void *hint)
{
    (void)data;
    msgbuf_unref(hint);
}

/* Bytes held only by ZeroMQ's queues: messages waiting for subscribers or
 * replay peers that the replay ring no longer keeps. */
static uint64_t queued_bytes(const events_t *ev)
{
    uint64_t held = atomic_load(&ev->held);
    return held > ev->replay_bytes ? held - ev->replay_bytes : 0;
}

/* Whether the queues hold more than send_bytes, once PUB has taken the
 * commands waiting for it: subscribers that left give their queues back
 * only then (ZMQ_EVENTS takes them; a send would, but none is made). */
static bool over_send_bytes(events_t *ev)
{
    if (queued_bytes(ev) <= ev->cfg.send_bytes)
        return false;
    int events;
    size_t len = sizeof(events);
    (void)zmq_getsockopt(ev->pub, ZMQ_EVENTS, &events, &len);
    return queued_bytes(ev) > ev->cfg.send_bytes;
}

/* Sends len bytes of b from p as one frame without copying them: the
 * frame holds a reference to b. Returns 0 or -1 (zmq_errno). */
static int send_ref(void *sock, msgbuf_t *b, const void *p, size_t len, int flags)
{
    zmq_msg_t m;
    atomic_fetch_add(&b->refs, 1);
    if (zmq_msg_init_data(&m, (void *)p, len, msgbuf_zfree, b) != 0) {
        msgbuf_unref(b);
        return -1;
    }
    if (zmq_msg_send(&m, sock, flags | ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&m); /* calls msgbuf_zfree */
        errno = e;
        return -1;
    }
    return 0;
}

/* Keeps a sent message for replay (a reference to b), dropping the oldest
 * beyond the byte bound. */
static void replay_keep(events_t *ev, uint32_t ident, uint64_t seq, msgbuf_t *b)
{
    uint64_t msg = ev->next_msg++;
    replay_slot_t *slot = &ev->replay[msg % ev->cfg.buffer];
    if (slot->buf) {
        ev->replay_bytes -= slot->buf->size;
        msgbuf_unref(slot->buf);
        slot->buf = NULL;
    }
    atomic_fetch_add(&b->refs, 1);
    *slot = (replay_slot_t){msg, seq, ident, b};
    ev->replay_bytes += b->size;
    /* Over the byte bound: the oldest go first (never this one). */
    while (ev->replay_bytes > ev->cfg.replay_bytes && ev->replay_oldest < msg) {
        replay_slot_t *old = &ev->replay[ev->replay_oldest % ev->cfg.buffer];
        if (old->buf && old->msg == ev->replay_oldest) {
            ev->replay_bytes -= old->buf->size;
            msgbuf_unref(old->buf);
            old->buf = NULL;
        }
        ev->replay_oldest++;
    }
    if (msg >= ev->cfg.buffer && ev->replay_oldest < msg + 1 - ev->cfg.buffer)
        ev->replay_oldest = msg + 1 - ev->cfg.buffer;
}

/* Sends the events packed so far (of the model ev->cur_model) as one batch
 * [ts, events, rank], once per identity, on that identity's topic with that
 * stream's next seq. One buffer per identity holds topic and payload; PUB's
 * queues and the replay ring share it. While the messages queued for
 * subscribers hold send_bytes, the batch goes to the replay ring only, and
 * is counted: every subscriber then sees a gap and may ask for it. */
static void flush_batch(events_t *ev)
{
    struct timespec now;
    uint8_t seq[8];
    char topic[EVENTS_TOPIC_MAX + 1];
    const char *tmpl = ev->cfg.topic ? ev->cfg.topic : EVENTS_DEFAULT_TOPIC;

    if (ev->n_packed == 0)
        return;
    clock_gettime(CLOCK_REALTIME, &now);
    msgpack_sbuffer_clear(&ev->sbuf);
    msgpack_pack_array(&ev->pk, 3);
    msgpack_pack_double(&ev->pk, (double)now.tv_sec + (double)now.tv_nsec / 1e9);
    msgpack_pack_array(&ev->pk, ev->n_packed);
    msgpack_sbuffer_write(&ev->sbuf, ev->ebuf.data, ev->ebuf.size);
    msgpack_pack_nil(&ev->pk); /* data_parallel_rank */
    msgpack_sbuffer_clear(&ev->ebuf);
    ev->n_packed = 0;

    for (uint32_t id = 0; id < ev->n_idents; id++) {
        /* Fits: events_stream_init checked every identity's topic. */
        int topic_len = expand_topic(tmpl, ev->ident[id], ev->ident_len[id], ev->cur_model,
                                     ev->cur_model_len, topic);
        if (topic_len < 0)
            continue;
        size_t size = (size_t)topic_len + ev->sbuf.size;
        msgbuf_t *b = malloc(sizeof(*b) + size);
        if (!b) {
            ev->next_seq[id]++; /* a gap: subscribers see it */
            continue;
        }
        atomic_init(&b->refs, 1);
        b->ev = ev;
        b->topic_len = (uint32_t)topic_len;
        b->size = sizeof(*b) + size;
        memcpy(b->bytes, topic, (size_t)topic_len);
        memcpy(b->bytes + topic_len, ev->sbuf.data, ev->sbuf.size);
        atomic_fetch_add(&ev->held, b->size);
        seq_bytes(ev->next_seq[id], seq);
        if (over_send_bytes(ev)) {
            atomic_fetch_add(&ev->send_drops, 1);
        } else if (send_ref(ev->pub, b, b->bytes, (size_t)topic_len, ZMQ_SNDMORE) < 0 ||
                   zmq_send(ev->pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
                   send_ref(ev->pub, b, b->bytes + topic_len, ev->sbuf.size, 0) < 0) {
            /* PUB never blocks: a subscriber at its high-water mark misses
             * this message and sees the gap in seq. */
            LOG_DEBUG("kv events: batch %llu of %s not sent: %s",
                      (unsigned long long)ev->next_seq[id], topic, zmq_strerror(zmq_errno()));
        }
        if (ev->router)
            replay_keep(ev, id, ev->next_seq[id], b);
        msgbuf_unref(b);
        ev->next_seq[id]++;
    }
}

/* Starts a batch for r's model when the current one is of another. */
static void batch_for(events_t *ev, const rec_t *r)
{
    const char *model = rec_model(ev, r);
    if (ev->n_packed > 0 &&
        (r->model_len != ev->cur_model_len || memcmp(model, ev->cur_model, r->model_len) != 0))
        flush_batch(ev);
    memcpy(ev->cur_model, model, r->model_len);
    ev->cur_model_len = r->model_len;
}

/* Packs one record, splitting a BlockStored of many blocks into events of
 * at most blocks_per_event blocks (each names the previous one's last block
 * as its parent), and flushes the batch whenever it reaches
 * EVENTS_MSG_TARGET bytes or BATCH_MAX_EVENTS events: no message is larger
 * than msg_max, so that the subscribers' high-water mark bounds bytes. */
static void pack_record(events_t *ev, const rec_t *r)
{
    batch_for(ev, r);
    if (r->kind != REC_STORED) {
        pack_other(ev, r);
        ev->n_packed++;
    } else {
        const uint64_t *keys = rec_keys(r);
        const uint32_t *tokens = rec_tokens(r);
        bool has_parent = r->has_parent;
        uint64_t parent = r->parent;
        for (size_t at = 0; at < r->n_keys;) {
            size_t n = r->n_keys - at;
            if (n > ev->blocks_per_event)
                n = ev->blocks_per_event;
            pack_stored(ev, r, keys + at, n, has_parent, parent,
                        tokens + at * (size_t)ev->block_tokens);
            ev->n_packed++;
            at += n;
            has_parent = true;
            parent = keys[at - 1];
            if (at < r->n_keys && ev->ebuf.size >= EVENTS_MSG_TARGET)
                flush_batch(ev);
        }
    }
    atomic_fetch_add(&ev->published, 1);
    if (ev->ebuf.size >= EVENTS_MSG_TARGET || ev->n_packed >= BATCH_MAX_EVENTS)
        flush_batch(ev);
}

/* Sends everything queued, in batches of consecutive records of one topic.
 * The ring's room goes back to the loop after each record. */
static void publish_pending(events_t *ev)
{
    uint64_t tail = atomic_load_explicit(&ev->tail, memory_order_relaxed);
    uint64_t head = atomic_load(&ev->head);
    while (tail < head) {
        size_t pos = (size_t)(tail % ev->ring_cap);
        const rec_t *r = (const rec_t *)(const void *)(ev->ring + pos);
        if (r->size == 0) {
            tail += ev->ring_cap - pos;
        } else {
            pack_record(ev, r);
            tail += r->size;
        }
        if (ev->n_packed == 0) /* sent: events_flush may return */
            atomic_store_explicit(&ev->tail, tail, memory_order_release);
        if (tail >= head)
            head = atomic_load(&ev->head);
    }
    flush_batch(ev);
    atomic_store_explicit(&ev->tail, tail, memory_order_release);
}

/* --- the publisher thread: replay --- */

static int send_frame(void *sock, const void *data, size_t len, bool more)
{
    return zmq_send(sock, data, len, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

/* Sends the end of an answer [id, "", (topic ""), END_SEQ, text]: text is
 * "" after a replay, the reason of a refusal otherwise (a consumer stops at
 * END_SEQ and may log the rest). Returns 0, or -1 with zmq_errno EAGAIN
 * (the peer's queue is full) or EHOSTUNREACH (the peer is gone). */
static int send_end(events_t *ev, const uint8_t *id, size_t id_len, const char *text)
{
    if (send_frame(ev->router, id, id_len, true) != 0)
        return -1;
    /* Once the first frame is taken, the rest of the message is too. */
    (void)(send_frame(ev->router, "", 0, true) == 0 &&
           (ev->cfg.replay_framing != EVENTS_REPLAY_TOPIC ||
            send_frame(ev->router, "", 0, true) == 0) &&
           send_frame(ev->router, end_seq, 8, true) == 0 &&
           send_frame(ev->router, text, strlen(text), false) == 0);
    return 0;
}

/* Refuses a replay request at once: answered with END_SEQ and the reason,
 * never queued or buffered (a peer whose queue is full gets nothing), and
 * counted. */
static void replay_refuse(events_t *ev, const uint8_t *id, size_t id_len, const char *why)
{
    atomic_fetch_add(&ev->replay_refused, 1);
    (void)send_end(ev, id, id_len, why);
}

static uint64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The peer's entry in the table of recent requesters (the least recently
 * seen one makes room). */
static replay_peer_t *replay_peer(events_t *ev, const uint8_t *id, size_t id_len)
{
    replay_peer_t *oldest = &ev->peers[0];
    for (size_t i = 0; i < REPLAY_PEERS; i++) {
        replay_peer_t *p = &ev->peers[i];
        if (p->id_len == id_len && memcmp(p->id, id, id_len) == 0)
            return p;
        if (p->last_ms < oldest->last_ms)
            oldest = p;
    }
    memcpy(oldest->id, id, id_len);
    oldest->id_len = (uint8_t)id_len;
    oldest->last_ms = 0;
    return oldest;
}

/* Takes one request [identity, "", start_seq] (or [identity, "", start_seq,
 * name] for the stream of identity `name`): within the peer's share (one
 * request per REPLAY_PEER_GAP_MS, one replay at a time, REPLAY_JOBS replays
 * in all) it becomes a replay job that pump_replays sends; else it is
 * refused (replay_refuse). */
static void serve_replay(events_t *ev, const zmq_msg_t *frames, int n)
{
    const uint8_t *id = zmq_msg_data((zmq_msg_t *)&frames[0]);
    size_t id_len = zmq_msg_size((zmq_msg_t *)&frames[0]);

    if ((n != 3 && n != 4) || zmq_msg_size((zmq_msg_t *)&frames[1]) != 0 ||
        zmq_msg_size((zmq_msg_t *)&frames[2]) != 8 || id_len > REPLAY_ID_MAX) {
        LOG_DEBUG("kv events: replay request of %d frames ignored: send [\"\", start_seq (8 "
                  "bytes, big-endian)] or [\"\", start_seq, identity]",
                  n);
        return;
    }
    uint32_t ident = 0;
    if (n == 4) {
        const char *name = zmq_msg_data((zmq_msg_t *)&frames[3]);
        size_t len = zmq_msg_size((zmq_msg_t *)&frames[3]);
        while (ident < ev->n_idents &&
               (ev->ident_len[ident] != len || memcmp(ev->ident[ident], name, len) != 0))
            ident++;
        if (ident == ev->n_idents) {
            LOG_DEBUG("kv events: replay request for an unknown identity '%.*s' ignored",
                      (int)(len > EVENTS_NAME_MAX ? EVENTS_NAME_MAX : len), name);
            return;
        }
    }
    uint64_t now = mono_ms();
    replay_peer_t *peer = replay_peer(ev, id, id_len);
    if (peer->last_ms && now - peer->last_ms < REPLAY_PEER_GAP_MS) {
        replay_refuse(ev, id, id_len, "refused: at most one replay request per 100 ms per peer");
        return;
    }
    replay_job_t *job = NULL;
    for (size_t i = 0; i < REPLAY_JOBS; i++) {
        replay_job_t *j = &ev->jobs[i];
        if (j->on && j->id_len == id_len && memcmp(j->id, id, id_len) == 0) {
            replay_refuse(ev, id, id_len, "refused: this peer's previous replay is not done");
            return;
        }
        if (!j->on && !job)
            job = j;
    }
    if (!job) {
        replay_refuse(ev, id, id_len, "refused: too many replays at once; ask again later");
        return;
    }
    peer->last_ms = now;
    atomic_fetch_add(&ev->replay_requests, 1);
    const uint8_t *s = zmq_msg_data((zmq_msg_t *)&frames[2]);
    uint64_t start = 0;
    for (int i = 0; i < 8; i++)
        start = start << 8 | s[i];
    uint64_t oldest = ev->next_msg > ev->cfg.buffer ? ev->next_msg - ev->cfg.buffer : 0;
    *job = (replay_job_t){.on = true,
                          .id_len = id_len,
                          .ident = ident,
                          .start_seq = start,
                          .next = oldest > ev->replay_oldest ? oldest : ev->replay_oldest,
                          .end = ev->next_msg,
                          .progress_ms = now};
    memcpy(job->id, id, id_len);
}

/* Sends what one job's peer takes now, at most REPLAY_BURST messages.
 * Returns false when the job is over (done, peer gone, or stalled). */
static bool pump_job(events_t *ev, replay_job_t *j, uint64_t now)
{
    uint8_t seq[8];
    bool moved = false;
    for (int sent = 0; sent < REPLAY_BURST && j->next < j->end;) {
        const replay_slot_t *slot = &ev->replay[j->next % ev->cfg.buffer];
        if (!slot->buf || slot->msg != j->next || slot->ident != j->ident ||
            slot->seq < j->start_seq) {
            j->next++; /* dropped for the byte bound, another stream, or before start */
            continue;
        }
        if (queued_bytes(ev) > ev->cfg.send_bytes)
            break; /* the queues are full: wait for them to drain */
        msgbuf_t *b = slot->buf;
        if (send_frame(ev->router, j->id, j->id_len, true) != 0)
            goto refused;
        seq_bytes(slot->seq, seq);
        (void)(send_frame(ev->router, "", 0, true) == 0 &&
               (ev->cfg.replay_framing != EVENTS_REPLAY_TOPIC ||
                send_ref(ev->router, b, b->bytes, b->topic_len, ZMQ_SNDMORE) == 0) &&
               send_frame(ev->router, seq, 8, true) == 0 &&
               send_ref(ev->router, b, b->bytes + b->topic_len, b->size - sizeof(*b) - b->topic_len,
                        0) == 0);
        j->next++;
        sent++;
        moved = true;
    }
    if (j->next >= j->end) {
        if (send_end(ev, j->id, j->id_len, "") == 0)
            return false;
        goto refused;
    }
    goto check;
refused:
    if (zmq_errno() == EHOSTUNREACH)
        return false; /* the peer is gone */
check:
    if (moved)
        j->progress_ms = now;
    else if (now - j->progress_ms > REPLAY_STALL_MS) {
        atomic_fetch_add(&ev->replay_stalled, 1);
        return false;
    }
    return true;
}

/* Moves every replay job on. Returns whether some are left. */
static bool pump_replays(events_t *ev)
{
    bool left = false;
    uint64_t now = mono_ms();
    for (size_t i = 0; i < REPLAY_JOBS; i++) {
        replay_job_t *j = &ev->jobs[i];
        if (j->on && !pump_job(ev, j, now))
            j->on = false;
        left |= j->on;
    }
    return left;
}

/* Reads at most REPLAY_READS requests per turn, so that a peer that floods
 * requests cannot keep the publisher from publishing. */
static void serve_replays(events_t *ev)
{
    enum { MAX_FRAMES = 5 };
    for (int r = 0; r < REPLAY_READS; r++) {
        zmq_msg_t frames[MAX_FRAMES];
        int kept = 0, n = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            /* The parts of a message arrive together: only the first waits. */
            if (zmq_msg_recv(&m, ev->router, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(&m);
                for (int i = 0; i < kept; i++)
                    zmq_msg_close(&frames[i]);
                return; /* nothing (more) to read */
            }
            more = zmq_msg_more(&m);
            n++;
            if (kept < MAX_FRAMES) {
                zmq_msg_init(&frames[kept]);
                zmq_msg_move(&frames[kept++], &m);
            }
            zmq_msg_close(&m);
        }
        serve_replay(ev, frames, n);
        for (int i = 0; i < kept; i++)
            zmq_msg_close(&frames[i]);
    }
}

static void *publisher_main(void *arg)
{
    events_t *ev = arg;
    zmq_pollitem_t items[3];
    int n_items = 0;
    bool jobs = false;
    items[n_items++] = (zmq_pollitem_t){NULL, ev->wake_fd, ZMQ_POLLIN, 0};
    /* PUB never reads, so this never fires; it makes zmq_poll take PUB's
     * commands as they come: a subscriber that left frees its queue only
     * then, and while over send_bytes nothing else calls into PUB. */
    items[n_items++] = (zmq_pollitem_t){ev->pub, 0, ZMQ_POLLIN, 0};
    if (ev->router)
        items[n_items++] = (zmq_pollitem_t){ev->router, 0, ZMQ_POLLIN, 0};
    for (;;) {
        bool stopping = atomic_load(&ev->stop);
        publish_pending(ev);
        if (ev->router) {
            serve_replays(ev);
            jobs = pump_replays(ev);
        }
        if (stopping)
            break;
        atomic_store(&ev->sleeping, true);
        /* Replays in progress: look again soon, for their peers' room. */
        if (atomic_load(&ev->tail) == atomic_load(&ev->head) && !atomic_load(&ev->stop))
            zmq_poll(items, n_items, jobs ? REPLAY_POLL_MS : -1);
        atomic_store(&ev->sleeping, false);
        uint64_t count;
        ssize_t rc = read(ev->wake_fd, &count, sizeof(count));
        (void)rc; /* EAGAIN: woken by the replay socket */
        /* Woken by an event: let the batch fill for a moment. Meanwhile the
         * loop thread queues without a system call (sleeping is false), and
         * one message carries what a busy millisecond produced. */
        if (atomic_load(&ev->tail) != atomic_load(&ev->head) && !atomic_load(&ev->stop))
            zmq_poll(items, n_items, BATCH_WAIT_MS);
    }
    return NULL;
}

/* --- start and stop --- */

static void close_sockets(events_t *ev, int linger)
{
    if (ev->pub) {
        zmq_setsockopt(ev->pub, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_close(ev->pub);
    }
    if (ev->router) {
        zmq_setsockopt(ev->router, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_close(ev->router);
    }
    ev->pub = ev->router = NULL;
    if (ev->zctx)
        zmq_ctx_term(ev->zctx);
    ev->zctx = NULL;
}

static void events_free(events_t *ev)
{
    close_sockets(ev, 0);
    if (ev->wake_fd >= 0)
        close(ev->wake_fd);
    for (uint32_t i = 0; ev->replay && i < ev->cfg.buffer; i++)
        if (ev->replay[i].buf)
            msgbuf_unref(ev->replay[i].buf);
    free(ev->replay);
    msgpack_sbuffer_destroy(&ev->sbuf);
    msgpack_sbuffer_destroy(&ev->ebuf);
    free(ev->ring);
    free(ev);
}

static void add_ident(void *arg, const char *name, size_t len)
{
    events_t *ev = arg;
    if (ev->n_idents == EVENTS_IDENT_MAX || len > EVENTS_NAME_MAX)
        return; /* events_check_identities refused such a list */
    memcpy(ev->ident[ev->n_idents], name, len);
    ev->ident[ev->n_idents][len] = '\0';
    ev->ident_len[ev->n_idents++] = (uint16_t)len;
}

int events_start(const events_config_t *cfg, uint32_t block_tokens, const char *medium,
                 events_t **out, char *err, size_t errlen)
{
    if (!cfg || !cfg->endpoint || !medium || !out || block_tokens == 0 || cfg->buffer == 0 ||
        cfg->hwm == 0 || cfg->queue_bytes < 4096 || cfg->subscriber_bytes == 0 ||
        cfg->send_bytes == 0)
        return KVS_EINVAL;
    if (events_check_endpoint(cfg->endpoint) != 0 ||
        (cfg->replay_endpoint && events_check_endpoint(cfg->replay_endpoint) != 0)) {
        snprintf(err, errlen, "kv events: give endpoints as tcp://HOST:PORT or ipc://PATH");
        return KVS_EINVAL;
    }
    if (cfg->identities && events_check_identities(cfg->identities) != 0) {
        snprintf(err, errlen,
                 "kv events: give identities as NAME,NAME,... (at most %d distinct names of "
                 "1 to %d bytes without '@', '{' or '}')",
                 EVENTS_IDENT_MAX, EVENTS_NAME_MAX);
        return KVS_EINVAL;
    }
    events_t *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return KVS_ENOMEM;
    ev->cfg = *cfg;
    ev->wake_fd = -1;
    ev->block_tokens = block_tokens;
    snprintf(ev->medium, sizeof(ev->medium), "%s", medium);
    for_each_ident(cfg, add_ident, ev);
    msgpack_sbuffer_init(&ev->sbuf);
    msgpack_packer_init(&ev->pk, &ev->sbuf, msgpack_sbuffer_write);
    msgpack_sbuffer_init(&ev->ebuf);
    msgpack_packer_init(&ev->epk, &ev->ebuf, msgpack_sbuffer_write);
    /* A block's event bytes at most: its key and tokens as msgpack uint64
     * and uint32 (9 and 5 bytes). */
    size_t block_max = 9 + 5 * (size_t)block_tokens;
    ev->blocks_per_event = EVENTS_MSG_TARGET / 2 / block_max;
    if (ev->blocks_per_event == 0)
        ev->blocks_per_event = 1;
    ev->msg_max = events_msg_max(block_tokens);
    uint64_t by_bytes = cfg->subscriber_bytes / ev->msg_max;
    ev->sub_hwm = by_bytes < cfg->hwm ? (uint32_t)(by_bytes ? by_bytes : 1) : cfg->hwm;
    ev->ring_cap = (size_t)(cfg->queue_bytes & ~(uint64_t)7);
    ev->ring = malloc(ev->ring_cap);
    ev->replay = cfg->replay_endpoint ? calloc(cfg->buffer, sizeof(*ev->replay)) : NULL;
    ev->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ev->zctx = zmq_ctx_new();
    if (!ev->ring || (cfg->replay_endpoint && !ev->replay) || ev->wake_fd < 0 || !ev->zctx) {
        snprintf(err, errlen, "kv events: out of memory for a queue of %llu bytes",
                 (unsigned long long)cfg->queue_bytes);
        events_free(ev);
        return KVS_ENOMEM;
    }
    int hwm = ev->sub_hwm > INT32_MAX ? INT32_MAX : (int)ev->sub_hwm;
    ev->pub = zmq_socket(ev->zctx, ZMQ_PUB);
    int rc = ev->pub ? zmq_setsockopt(ev->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm)) : -1;
    if (rc == 0)
        rc = endpoint_binds(cfg->endpoint) ? zmq_bind(ev->pub, cfg->endpoint)
                                           : zmq_connect(ev->pub, cfg->endpoint);
    if (rc != 0) {
        snprintf(err, errlen, "kv events: cannot %s %s: %s",
                 endpoint_binds(cfg->endpoint) ? "bind" : "connect to", cfg->endpoint,
                 zmq_strerror(zmq_errno()));
        events_free(ev);
        return KVS_EIO;
    }
    if (cfg->replay_endpoint) {
        /* Each peer's queues are small: a replay is sent as its peer takes
         * it (pump_replays), requests are read as they come, a frame
         * larger than a request could be ends the connection, and a peer
         * that answers no heartbeat for 10 s is dropped. Mandatory: a send
         * to a full or gone peer fails instead of dropping silently. */
        static const int opts[][2] = {{ZMQ_SNDHWM, REPLAY_PEER_HWM},
                                      {ZMQ_RCVHWM, REPLAY_RCV_HWM},
                                      {ZMQ_ROUTER_MANDATORY, 1},
                                      {ZMQ_HEARTBEAT_IVL, REPLAY_HEARTBEAT_MS},
                                      {ZMQ_HEARTBEAT_TIMEOUT, REPLAY_HEARTBEAT_TIMEOUT_MS}};
        int64_t max_frame = REPLAY_MAX_FRAME;
        ev->router = zmq_socket(ev->zctx, ZMQ_ROUTER);
        rc = ev->router ? zmq_setsockopt(ev->router, ZMQ_MAXMSGSIZE, &max_frame, sizeof(max_frame))
                        : -1;
        for (size_t i = 0; rc == 0 && i < sizeof(opts) / sizeof(opts[0]); i++)
            rc = zmq_setsockopt(ev->router, opts[i][0], &opts[i][1], sizeof(int));
        if (rc == 0)
            rc = zmq_bind(ev->router, cfg->replay_endpoint);
        if (rc != 0) {
            snprintf(err, errlen, "kv events: cannot bind the replay socket on %s: %s",
                     cfg->replay_endpoint, zmq_strerror(zmq_errno()));
            events_free(ev);
            return KVS_EIO;
        }
    }
    if (pthread_create(&ev->thread, NULL, publisher_main, ev) != 0) {
        snprintf(err, errlen, "kv events: cannot start the publisher thread");
        events_free(ev);
        return KVS_ENOMEM;
    }
    ev->thread_on = true;
    *out = ev;
    return 0;
}

void events_stop(events_t *ev)
{
    if (!ev)
        return;
    if (ev->thread_on) {
        uint64_t one = 1;
        atomic_store(&ev->stop, true);
        ssize_t rc = write(ev->wake_fd, &one, sizeof(one));
        (void)rc;
        pthread_join(ev->thread, NULL);
    }
    close_sockets(ev, STOP_LINGER_MS);
    events_free(ev);
}
