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

/* A batch is flushed at this many events or record bytes, so that one
 * message (and one replay slot) stays small. */
#define BATCH_MAX_EVENTS 1024
#define BATCH_MAX_BYTES  (256u << 10)
/* How long the publisher lets a batch fill once woken by its first event. */
#define BATCH_WAIT_MS 1
/* How long events_stop lets subscribers take what is queued. */
#define STOP_LINGER_MS 100

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
    uint16_t pad;
    uint32_t n_keys;
    uint64_t parent;
} rec_t;

/* A sent message kept for replay: topic bytes then payload bytes. Slots
 * are indexed by msg, which counts messages of every identity; seq is the
 * message's number in its identity's stream. */
typedef struct replay_slot {
    uint64_t msg, seq;
    uint32_t ident;
    uint8_t *bytes; /* NULL: empty */
    uint32_t topic_len;
    size_t payload_len;
} replay_slot_t;

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
    _Atomic bool stop;
    int wake_fd; /* eventfd: written when the publisher sleeps */

    /* Publisher thread only. */
    void *zctx, *pub, *router;
    pthread_t thread;
    bool thread_on;
    uint64_t next_seq[EVENTS_IDENT_MAX]; /* per identity: each topic counts from 0 */
    uint64_t next_msg;                   /* messages of all identities: replay slots */
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
    replay_slot_t *replay;
    size_t replay_bytes;    /* held by the slots */
    uint64_t replay_oldest; /* msg of the oldest message that may still be held */

    _Atomic uint64_t published, replay_requests;
};

void events_config_init(events_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->buffer = EVENTS_DEFAULT_BUFFER;
    cfg->hwm = EVENTS_DEFAULT_HWM;
    cfg->queue_bytes = EVENTS_DEFAULT_QUEUE;
    cfg->replay_bytes = EVENTS_DEFAULT_REPLAY;
    cfg->encoding = EVENTS_MAP;
    cfg->replay_framing = EVENTS_REPLAY_PLAIN;
}

int events_check_endpoint(const char *endpoint)
{
    if (!endpoint)
        return KVS_EINVAL;
    if (strncmp(endpoint, "tcp://", 6) == 0 && strchr(endpoint + 6, ':') && endpoint[6] != ':')
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
static int queue_event(events_t *ev, const events_stream_t *st, int kind, const uint64_t *keys,
                       size_t n_keys, bool has_parent, uint64_t parent, const uint32_t *tokens)
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

int events_stored(events_t *ev, const events_stream_t *st, const uint64_t *keys, size_t n,
                  bool has_parent, uint64_t parent, const uint32_t *tokens)
{
    if (n == 0)
        return 0;
    return queue_event(ev, st, REC_STORED, keys, n, has_parent, parent, tokens);
}

int events_removed(events_t *ev, const events_stream_t *st, uint64_t key)
{
    return queue_event(ev, st, REC_REMOVED, &key, 1, false, 0, NULL);
}

int events_cleared(events_t *ev, const events_stream_t *st)
{
    return queue_event(ev, st, REC_CLEARED, NULL, 0, false, 0, NULL);
}

void events_counters(const events_t *ev, uint64_t *published, uint64_t *replay_requests)
{
    *published = ev ? atomic_load(&ev->published) : 0;
    *replay_requests = ev ? atomic_load(&ev->replay_requests) : 0;
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

static void pack_keys(msgpack_packer *pk, const rec_t *r)
{
    const uint64_t *keys = rec_keys(r);
    msgpack_pack_array(pk, r->n_keys);
    for (uint32_t i = 0; i < r->n_keys; i++)
        msgpack_pack_uint64(pk, keys[i]);
}

/* One event, as vLLM's msgspec structs encode it: a map tagged by "type",
 * or an array with the tag first and the fields in declaration order. */
static void pack_event(events_t *ev, const rec_t *r)
{
    msgpack_packer *pk = &ev->pk;
    bool map = ev->cfg.encoding == EVENTS_MAP;
    switch (r->kind) {
    case REC_STORED: {
        size_t n_tokens = (size_t)r->n_keys * ev->block_tokens;
        const uint32_t *tokens = rec_tokens(r);
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
        pack_keys(pk, r);
        if (map)
            PACK_KEY(pk, "parent_block_hash");
        if (r->has_parent)
            msgpack_pack_uint64(pk, r->parent);
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
        pack_str(pk, ev->medium, strlen(ev->medium));
        if (map)
            PACK_KEY(pk, "lora_name");
        if (r->lora_len)
            pack_str(pk, lora, r->lora_len);
        else
            msgpack_pack_nil(pk);
        return;
    }
    case REC_REMOVED:
        if (map) {
            msgpack_pack_map(pk, 3);
            PACK_KEY(pk, "type");
        } else {
            msgpack_pack_array(pk, 3);
        }
        PACK_KEY(pk, "BlockRemoved");
        if (map)
            PACK_KEY(pk, "block_hashes");
        pack_keys(pk, r);
        if (map)
            PACK_KEY(pk, "medium");
        pack_str(pk, ev->medium, strlen(ev->medium));
        return;
    default:
        if (map) {
            msgpack_pack_map(pk, 1);
            PACK_KEY(pk, "type");
        } else {
            msgpack_pack_array(pk, 1);
        }
        PACK_KEY(pk, "AllBlocksCleared");
        return;
    }
}

static void seq_bytes(uint64_t seq, uint8_t out[8])
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (uint8_t)seq;
        seq >>= 8;
    }
}

/* Keeps a sent message for replay, dropping the oldest beyond the byte
 * bound. */
static void replay_keep(events_t *ev, uint32_t ident, uint64_t seq, const char *topic,
                        size_t topic_len)
{
    uint64_t msg = ev->next_msg++;
    replay_slot_t *slot = &ev->replay[msg % ev->cfg.buffer];
    if (slot->bytes) {
        ev->replay_bytes -= slot->topic_len + slot->payload_len;
        free(slot->bytes);
        slot->bytes = NULL;
    }
    size_t total = topic_len + ev->sbuf.size;
    uint8_t *bytes = malloc(total ? total : 1);
    if (!bytes)
        return; /* a gap in replay: the subscriber sees it end early */
    memcpy(bytes, topic, topic_len);
    memcpy(bytes + topic_len, ev->sbuf.data, ev->sbuf.size);
    *slot = (replay_slot_t){msg, seq, ident, bytes, (uint32_t)topic_len, ev->sbuf.size};
    ev->replay_bytes += total;
    /* Over the byte bound: the oldest go first (never this one). */
    while (ev->replay_bytes > ev->cfg.replay_bytes && ev->replay_oldest < msg) {
        replay_slot_t *old = &ev->replay[ev->replay_oldest % ev->cfg.buffer];
        if (old->bytes && old->msg == ev->replay_oldest) {
            ev->replay_bytes -= old->topic_len + old->payload_len;
            free(old->bytes);
            old->bytes = NULL;
        }
        ev->replay_oldest++;
    }
    if (msg >= ev->cfg.buffer && ev->replay_oldest < msg + 1 - ev->cfg.buffer)
        ev->replay_oldest = msg + 1 - ev->cfg.buffer;
}

/* Encodes recs[0..n) (one model) as one batch and sends it once per
 * identity, on that identity's topic with that stream's next seq. */
static void send_batch(events_t *ev, const rec_t *const *recs, size_t n)
{
    struct timespec now;
    uint8_t seq[8];
    char topic[EVENTS_TOPIC_MAX + 1];
    const char *tmpl = ev->cfg.topic ? ev->cfg.topic : EVENTS_DEFAULT_TOPIC;

    clock_gettime(CLOCK_REALTIME, &now);
    msgpack_sbuffer_clear(&ev->sbuf);
    msgpack_pack_array(&ev->pk, 3);
    msgpack_pack_double(&ev->pk, (double)now.tv_sec + (double)now.tv_nsec / 1e9);
    msgpack_pack_array(&ev->pk, n);
    for (size_t i = 0; i < n; i++)
        pack_event(ev, recs[i]);
    msgpack_pack_nil(&ev->pk); /* data_parallel_rank */

    for (uint32_t id = 0; id < ev->n_idents; id++) {
        /* Fits: events_stream_init checked every identity's topic. */
        int topic_len = expand_topic(tmpl, ev->ident[id], ev->ident_len[id], rec_model(ev, recs[0]),
                                     recs[0]->model_len, topic);
        if (topic_len < 0)
            continue;
        seq_bytes(ev->next_seq[id], seq);
        /* PUB never blocks: a subscriber at its high-water mark misses this
         * message and sees the gap in seq. */
        if (zmq_send(ev->pub, topic, (size_t)topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(ev->pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(ev->pub, ev->sbuf.data, ev->sbuf.size, ZMQ_DONTWAIT) < 0)
            LOG_DEBUG("kv events: batch %llu of %s not sent: %s",
                      (unsigned long long)ev->next_seq[id], topic, zmq_strerror(zmq_errno()));
        if (ev->router)
            replay_keep(ev, id, ev->next_seq[id], topic, (size_t)topic_len);
        ev->next_seq[id]++;
    }
    atomic_fetch_add(&ev->published, n);
}

/* Sends everything queued, in batches of consecutive records of one topic. */
static void publish_pending(events_t *ev)
{
    const rec_t *batch[BATCH_MAX_EVENTS];
    uint64_t tail = atomic_load_explicit(&ev->tail, memory_order_relaxed);
    uint64_t head = atomic_load(&ev->head);
    size_t n = 0, bytes = 0;
    while (tail < head || n > 0) {
        const rec_t *r = NULL;
        if (tail < head) {
            size_t pos = (size_t)(tail % ev->ring_cap);
            r = (const rec_t *)(const void *)(ev->ring + pos);
            if (r->size == 0) {
                tail += ev->ring_cap - pos;
                continue;
            }
        }
        if (n > 0 && (!r || n == BATCH_MAX_EVENTS || bytes >= BATCH_MAX_BYTES ||
                      r->model_len != batch[0]->model_len ||
                      memcmp(rec_model(ev, r), rec_model(ev, batch[0]), r->model_len) != 0)) {
            send_batch(ev, batch, n);
            /* The records are encoded: their room goes back to the loop. */
            atomic_store_explicit(&ev->tail, tail, memory_order_release);
            n = bytes = 0;
        }
        if (!r)
            break;
        batch[n++] = r;
        bytes += r->size;
        tail += r->size;
        if (tail >= head)
            head = atomic_load(&ev->head);
    }
    atomic_store_explicit(&ev->tail, tail, memory_order_release);
}

/* --- the publisher thread: replay --- */

static int send_frame(void *sock, const void *data, size_t len, bool more)
{
    return zmq_send(sock, data, len, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

/* Answers one request [identity, "", start_seq] with every kept batch of
 * the first stream from start_seq on, then END_SEQ (-1). With several
 * identities a request may name its stream in a fourth frame:
 * [identity, "", start_seq, name]. */
static void serve_replay(events_t *ev, const zmq_msg_t *frames, int n)
{
    const uint8_t *id = zmq_msg_data((zmq_msg_t *)&frames[0]);
    size_t id_len = zmq_msg_size((zmq_msg_t *)&frames[0]);
    static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    uint8_t seq[8];

    if ((n != 3 && n != 4) || zmq_msg_size((zmq_msg_t *)&frames[1]) != 0 ||
        zmq_msg_size((zmq_msg_t *)&frames[2]) != 8) {
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
    atomic_fetch_add(&ev->replay_requests, 1);
    const uint8_t *s = zmq_msg_data((zmq_msg_t *)&frames[2]);
    uint64_t start = 0;
    for (int i = 0; i < 8; i++)
        start = start << 8 | s[i];
    uint64_t oldest = ev->next_msg > ev->cfg.buffer ? ev->next_msg - ev->cfg.buffer : 0;
    for (uint64_t q = oldest; q < ev->next_msg; q++) {
        const replay_slot_t *slot = &ev->replay[q % ev->cfg.buffer];
        if (!slot->bytes || slot->msg != q || slot->ident != ident || slot->seq < start)
            continue; /* dropped for the byte bound, another stream, or before start */
        seq_bytes(slot->seq, seq);
        if (send_frame(ev->router, id, id_len, true) != 0 ||
            send_frame(ev->router, "", 0, true) != 0)
            return;
        if (ev->cfg.replay_framing == EVENTS_REPLAY_TOPIC &&
            send_frame(ev->router, slot->bytes, slot->topic_len, true) != 0)
            return;
        if (send_frame(ev->router, seq, 8, true) != 0 ||
            send_frame(ev->router, slot->bytes + slot->topic_len, slot->payload_len, false) != 0)
            return;
    }
    /* The end has the framing's frame count too: an empty topic there. */
    if (send_frame(ev->router, id, id_len, true) != 0 || send_frame(ev->router, "", 0, true) != 0)
        return;
    if (ev->cfg.replay_framing == EVENTS_REPLAY_TOPIC && send_frame(ev->router, "", 0, true) != 0)
        return;
    (void)(send_frame(ev->router, end_seq, 8, true) == 0 &&
           send_frame(ev->router, "", 0, false) == 0);
}

static void serve_replays(events_t *ev)
{
    enum { MAX_FRAMES = 5 };
    for (;;) {
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
    zmq_pollitem_t items[2];
    int n_items = 0;
    items[n_items++] = (zmq_pollitem_t){NULL, ev->wake_fd, ZMQ_POLLIN, 0};
    if (ev->router)
        items[n_items++] = (zmq_pollitem_t){ev->router, 0, ZMQ_POLLIN, 0};
    for (;;) {
        bool stopping = atomic_load(&ev->stop);
        publish_pending(ev);
        if (ev->router)
            serve_replays(ev);
        if (stopping)
            break;
        atomic_store(&ev->sleeping, true);
        if (atomic_load(&ev->tail) == atomic_load(&ev->head) && !atomic_load(&ev->stop))
            zmq_poll(items, n_items, -1);
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
        free(ev->replay[i].bytes);
    free(ev->replay);
    msgpack_sbuffer_destroy(&ev->sbuf);
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
        cfg->hwm == 0 || cfg->queue_bytes < 4096)
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
    int hwm = cfg->hwm > INT32_MAX ? INT32_MAX : (int)cfg->hwm;
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
        /* Room for one whole answer per client: the ring and the end. */
        int replay_hwm = cfg->buffer >= INT32_MAX - 1 ? INT32_MAX : (int)cfg->buffer + 1;
        ev->router = zmq_socket(ev->zctx, ZMQ_ROUTER);
        rc = ev->router ? zmq_setsockopt(ev->router, ZMQ_SNDHWM, &replay_hwm, sizeof(replay_hwm))
                        : -1;
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
