/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events: KV events for cluster routers, in the format vLLM defined (see
 * docs/ROUTING.md). llm-d's kv-cache indexer, NVIDIA Dynamo's KV router and
 * the others that read vLLM's stream mirror what this node caches from it.
 *
 *   loop thread                         publisher thread
 *   -----------                         ----------------
 *   Commit  --> events_stored   --+     pops records, groups consecutive
 *   evict   --> events_removed  --+-->  ones of one topic into a batch,
 *   start   --> events_cleared  --+     msgpack-encodes [ts, events, rank],
 *                 |                     sends [topic, seq, payload] on PUB,
 *     bounded byte ring (queue_bytes)   keeps it in the replay ring, and
 *     full: the event is dropped and    answers replay requests on ROUTER
 *     counted, never waited for
 *
 * The publisher sleeps until the loop queues an event (an eventfd write, the
 * only system call on the loop's side, made only when the publisher sleeps),
 * then lets the batch fill for 1 ms: a busy daemon sends one message per
 * millisecond, not one per Commit.
 *
 * The loop thread never blocks and never allocates here: a record (header,
 * block keys, token ids, topic, LoRA name) is copied into a ring allocated at
 * start; when the ring is full the record is dropped and the caller counts it.
 * The publisher thread owns both ZeroMQ sockets. Each batch goes out once
 * per identity (kv_events_identities, else the pod) on the topic with that
 * {pod}; seq counts each identity's messages from 0, 8 bytes big-endian.
 * A message is at most events_msg_max bytes (a BlockStored of many blocks
 * is cut into events of fewer). PUB drops a batch for a subscriber whose
 * queue holds its high-water mark: `hwm` messages, or fewer, so that they
 * take at most subscriber_bytes; that subscriber sees a gap in seq and
 * fills it from the replay socket, which serves the last `buffer` messages
 * held in at most replay_bytes. A message's bytes are shared by every
 * subscriber's queue, the replay ring and replay answers (no copy per
 * subscriber); while the messages only queues hold take send_bytes, a new
 * batch goes to the replay ring alone (counted: send_drops). Replay
 * requests are bounded per peer (one at a time, one per 100 ms, frames of
 * 512 bytes), REPLAY_JOBS are sent at once and a peer over its share is
 * refused with END_SEQ and the reason (counted), never buffered; a replay
 * is sent as fast as its peer takes it, and ends when it takes nothing for
 * 5 s. Memory is bounded by queue_bytes + replay_bytes + send_bytes.
 *
 * A namespace publishes only when it maps to a model name (events_stream_t):
 * the topic template's {model} is that name (default `kv@{pod}@{model}`), and
 * each BlockStored carries the namespace's LoRA name, if any.
 */
#ifndef KVS_DAEMON_EVENTS_H
#define KVS_DAEMON_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EVENTS_TOPIC_MAX 255 /* bytes of an expanded topic */
#define EVENTS_NAME_MAX  127 /* bytes of a model or LoRA name */
#define EVENTS_IDENT_MAX 64  /* identities in kv_events_identities */

typedef enum events_encoding {
    EVENTS_MAP = 0,  /* each event a msgpack map tagged by "type" (vLLM since 2026) */
    EVENTS_ARRAY = 1 /* each event a positional array, the tag first (earlier vLLM) */
} events_encoding_t;

typedef enum events_framing {
    EVENTS_REPLAY_PLAIN = 0, /* replay replies [id, "", seq, payload] (Dynamo) */
    EVENTS_REPLAY_TOPIC = 1  /* [id, "", topic, seq, payload] (newer vLLM) */
} events_framing_t;

/* The settings (settings.c rows kv_events_*). Strings are borrowed. */
typedef struct events_config {
    const char *endpoint;        /* PUB: binds on `*`, `::`, ipc://, else connects; NULL: off */
    const char *replay_endpoint; /* ROUTER, always binds; NULL: no replay */
    const char *topic;           /* template with {pod} and {model}; NULL: kv@{pod}@{model} */
    const char *pod;             /* {pod}; NULL: the host name */
    const char *identities;      /* comma list: one stream per {pod}; NULL: pod alone */
    const char *default_model;   /* model of namespace "default"; NULL: it publishes nothing */
    uint32_t buffer;             /* batches the replay ring keeps */
    uint64_t replay_bytes;       /* ... in at most this much memory */
    uint32_t hwm;                /* ZeroMQ SNDHWM: messages queued per subscriber */
    uint64_t subscriber_bytes;   /* ... in at most this many bytes (fewer messages) */
    uint64_t send_bytes;         /* bytes queued for subscribers and replay peers in all */
    uint64_t queue_bytes;        /* the hand-off ring between the threads */
    int encoding;                /* events_encoding_t */
    int replay_framing;          /* events_framing_t */
} events_config_t;

/* The defaults of the kv_events_* settings (settings.c's table applies
 * them; the topic NULL is the default one). */
#define EVENTS_DEFAULT_TOPIC      "kv@{pod}@{model}"
#define EVENTS_DEFAULT_BUFFER     10000
#define EVENTS_DEFAULT_HWM        100000
#define EVENTS_DEFAULT_QUEUE      (16u << 20)
#define EVENTS_DEFAULT_REPLAY     (64u << 20)
#define EVENTS_DEFAULT_SUBSCRIBER (32u << 20)
#define EVENTS_DEFAULT_SEND       (128u << 20)
/* A batch is sent once its events take this many bytes. */
#define EVENTS_MSG_TARGET (32u << 10)

/* The largest message (topic, seq and payload) with blocks of block_tokens
 * tokens: what one subscriber's high-water mark is counted in. */
size_t events_msg_max(uint32_t block_tokens);

/* What a namespace publishes as: its model (the topic's {model}), its
 * topic as the first identity's, and its LoRA name. */
typedef struct events_stream {
    bool on; /* false: the namespace has no model and publishes nothing */
    uint16_t topic_len, model_len, lora_len;
    char topic[EVENTS_TOPIC_MAX + 1];
    char model[EVENTS_NAME_MAX + 1];
    char lora[EVENTS_NAME_MAX + 1];
} events_stream_t;

typedef struct events events_t;

/* Where a published block is: the pool (tier 1, the medium events_start
 * names: "GPU" or "CPU"), the host tier (tier 2, "CPU") or the disk tier
 * (tier 3, "DISK"): the medium string of its BlockStored and BlockRemoved,
 * which routers keep per medium (a BlockRemoved on one medium leaves the
 * block's claim on another). */
typedef enum events_medium {
    EVENTS_MEDIUM_POOL = 0,
    EVENTS_MEDIUM_HOST = 1,
    EVENTS_MEDIUM_DISK = 2,
} events_medium_t;

/* The medium string of m, as published (events_start's for the pool). */
const char *events_medium_name(const events_t *ev, events_medium_t m);

/* Checks an endpoint setting: tcp://HOST:PORT or ipc://PATH. Returns 0 or
 * KVS_EINVAL. */
int events_check_endpoint(const char *endpoint);

/* Checks a topic template: text with {pod} and {model}, each at least
 * once, and no other {placeholder}; at most EVENTS_TOPIC_MAX bytes.
 * Returns 0 or KVS_EINVAL. */
int events_check_topic(const char *tmpl);

/* Checks an identities setting: 1 to EVENTS_IDENT_MAX comma-separated
 * names, each 1 to EVENTS_NAME_MAX bytes without '@', '{' or '}', no name
 * twice. Returns 0 or KVS_EINVAL. */
int events_check_identities(const char *list);

/* Fills *st for a namespace mapped to `model` (NULL or "": st->on false)
 * and `lora` (NULL: none), expanding cfg's template with cfg's pod (or the
 * host name), or with each of cfg's identities. Errors: KVS_EINVAL (the
 * topic of some identity or a name too long: st->on false). */
int events_stream_init(const events_config_t *cfg, const char *model, const char *lora,
                       events_stream_t *st);

/* Opens the sockets (errors with a message in err: KVS_EINVAL for a bad
 * endpoint, KVS_EIO when a bind or connect fails, KVS_ENOMEM) and starts the
 * publisher thread. block_tokens is every BlockStored's block_size, medium
 * the pool's medium ("GPU", "CPU": EVENTS_MEDIUM_POOL's name). Stop with
 * events_stop. */
int events_start(const events_config_t *cfg, uint32_t block_tokens, const char *medium,
                 events_t **out, char *err, size_t errlen);

/* Publishes what is queued, stops the thread, closes the sockets (dropping
 * what subscribers did not take within 100 ms) and frees ev. Accepts NULL. */
void events_stop(events_t *ev);

/* Queues BlockStored on medium m for n blocks of one prefix now there:
 * block i's key is keys[i], its token ids are tokens[i x block_tokens ..],
 * parent is the key of the block before the first (when has_parent).
 * Returns 0, or KVS_ELIMIT when the ring is full (nothing queued: count it
 * as dropped). Never blocks, never allocates. */
int events_stored(events_t *ev, const events_stream_t *st, events_medium_t m, const uint64_t *keys,
                  size_t n, bool has_parent, uint64_t parent, const uint32_t *tokens);

/* Queues BlockRemoved on medium m for one block. Returns 0 or KVS_ELIMIT,
 * as above. */
int events_removed(events_t *ev, const events_stream_t *st, events_medium_t m, uint64_t key);

/* Queues AllBlocksCleared on st's topic. Returns 0 or KVS_ELIMIT. */
int events_cleared(events_t *ev, const events_stream_t *st);

/* What the publisher thread counts. */
typedef struct events_stats {
    uint64_t published;       /* events sent (BlockStored, BlockRemoved, AllBlocksCleared) */
    uint64_t replay_requests; /* replay requests taken */
    uint64_t replay_refused;  /* refused: over a peer's share, or too many at once */
    uint64_t replay_stalled;  /* replays ended because their peer took nothing for 5 s */
    uint64_t send_drops;      /* messages not sent to subscribers: send_bytes was full */
    uint64_t held_bytes;      /* message bytes alive now (ring, queues, answers) */
    uint32_t subscriber_hwm;  /* PUB's high-water mark in messages */
} events_stats_t;

/* Fills *out (zeros for NULL ev). Safe from any thread. */
void events_counters(const events_t *ev, events_stats_t *out);

/* Waits up to timeout_ms for the publisher to have sent everything queued
 * so far (tests, shutdown). Returns true when it has. */
bool events_flush(events_t *ev, uint32_t timeout_ms);

#endif /* KVS_DAEMON_EVENTS_H */
