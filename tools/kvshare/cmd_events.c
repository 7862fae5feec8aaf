/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare events: tails the KV event stream a kvshared publishes for cluster
 * routers (--kv-events): a ZeroMQ SUB socket, each message [topic, seq,
 * payload], the payload a msgpack batch [ts, events, data_parallel_rank].
 * Events in either form (maps tagged by "type", or positional arrays with
 * the tag first) are shown with their field names: one line per event, or
 * with --json one JSON object per message.
 */
#include <errno.h>
#include <inttypes.h>
#include <msgpack.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "cmd_common.h"

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:5557"

/* vLLM's field order of each event (the array form). */
static const char *const stored_fields[] = {"block_hashes",
                                            "parent_block_hash",
                                            "token_ids",
                                            "block_size",
                                            "lora_id",
                                            "medium",
                                            "lora_name",
                                            "extra_keys",
                                            "group_idx",
                                            "kv_cache_spec_kind",
                                            "kv_cache_spec_sliding_window",
                                            NULL};
static const char *const removed_fields[] = {"block_hashes", "medium", "group_idx", NULL};
static const char *const cleared_fields[] = {NULL};

static volatile sig_atomic_t stop;

/* How often a waiting tail looks at `stop` (and counts toward --wait). */
#define EVENTS_TICK_MS 100

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare events [--endpoint ENDPOINT] [--topic PREFIX] [--json] [--count N] "
               "[--wait MS]\n"
               "\n"
               "Tails the KV events kvshared publishes (its --kv-events setting). ENDPOINT is\n"
               "where to connect (default " DEFAULT_ENDPOINT "; ipc://PATH too), or\n"
               "tcp://*:PORT to bind where daemons connect. --topic keeps the messages whose\n"
               "topic starts with PREFIX (llm-d subscribes to \"kv@\"). --count stops after N\n"
               "messages; "
               "--wait stops (status 1) when no message came for MS milliseconds.\n");
}

static const char *const *fields_of(const msgpack_object *tag)
{
    if (tag->type != MSGPACK_OBJECT_STR)
        return NULL;
    const char *s = tag->via.str.ptr;
    size_t n = tag->via.str.size;
    if (n == 11 && memcmp(s, "BlockStored", n) == 0)
        return stored_fields;
    if (n == 12 && memcmp(s, "BlockRemoved", n) == 0)
        return removed_fields;
    if (n == 16 && memcmp(s, "AllBlocksCleared", n) == 0)
        return cleared_fields;
    return NULL;
}

static void json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_value(FILE *f, const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        fputs("null", f);
        return;
    case MSGPACK_OBJECT_BOOLEAN:
        fputs(o->via.boolean ? "true" : "false", f);
        return;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        fprintf(f, "%" PRIu64, o->via.u64);
        return;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        fprintf(f, "%" PRId64, o->via.i64);
        return;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        fprintf(f, "%.6f", o->via.f64);
        return;
    case MSGPACK_OBJECT_STR:
        json_str(f, o->via.str.ptr, o->via.str.size);
        return;
    case MSGPACK_OBJECT_BIN:
        fputc('"', f);
        for (uint32_t i = 0; i < o->via.bin.size; i++)
            fprintf(f, "%02x", (unsigned char)o->via.bin.ptr[i]);
        fputc('"', f);
        return;
    case MSGPACK_OBJECT_ARRAY:
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                fputc(',', f);
            json_value(f, &o->via.array.ptr[i]);
        }
        fputc(']', f);
        return;
    case MSGPACK_OBJECT_MAP:
        fputc('{', f);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (i)
                fputc(',', f);
            if (kv->key.type == MSGPACK_OBJECT_STR)
                json_str(f, kv->key.via.str.ptr, kv->key.via.str.size);
            else
                fputs("\"?\"", f);
            fputc(':', f);
            json_value(f, &kv->val);
        }
        fputc('}', f);
        return;
    default:
        fputs("null", f);
        return;
    }
}

/* An event's field, by name, from either form; NULL when absent. */
static const msgpack_object *field(const msgpack_object *ev, const char *name)
{
    if (ev->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < ev->via.map.size; i++) {
            const msgpack_object *k = &ev->via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(name) &&
                memcmp(k->via.str.ptr, name, k->via.str.size) == 0)
                return &ev->via.map.ptr[i].val;
        }
        return NULL;
    }
    if (ev->type != MSGPACK_OBJECT_ARRAY || ev->via.array.size == 0)
        return NULL;
    const char *const *names = fields_of(&ev->via.array.ptr[0]);
    for (uint32_t i = 0; names && names[i]; i++)
        if (strcmp(names[i], name) == 0)
            return i + 1 < ev->via.array.size ? &ev->via.array.ptr[i + 1] : NULL;
    return NULL;
}

static const msgpack_object *event_tag(const msgpack_object *ev)
{
    if (ev->type == MSGPACK_OBJECT_ARRAY && ev->via.array.size > 0)
        return &ev->via.array.ptr[0];
    return field(ev, "type");
}

/* One event as a JSON object with named fields, whatever its form. */
static void json_event(FILE *f, const msgpack_object *ev)
{
    const msgpack_object *tag = event_tag(ev);
    const char *const *names = tag ? fields_of(tag) : NULL;
    if (!names) {
        json_value(f, ev);
        return;
    }
    fputs("{\"type\":", f);
    json_value(f, tag);
    for (uint32_t i = 0; names[i]; i++) {
        const msgpack_object *v = field(ev, names[i]);
        if (!v)
            continue;
        fprintf(f, ",\"%s\":", names[i]);
        json_value(f, v);
    }
    fputc('}', f);
}

static void text_key(FILE *f, const msgpack_object *o)
{
    if (o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        fprintf(f, "%016" PRIx64, o->via.u64);
    else if (o && o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        fprintf(f, "%016" PRIx64, (uint64_t)o->via.i64);
    else if (o && o->type == MSGPACK_OBJECT_NIL)
        fputs("-", f);
    else
        json_value(f, o);
}

static void text_str(FILE *f, const msgpack_object *o)
{
    if (o && o->type == MSGPACK_OBJECT_STR)
        fprintf(f, "%.*s", (int)o->via.str.size, o->via.str.ptr);
    else
        fputs("-", f);
}

/* One line per event: kind, keys, parent, tokens, medium, LoRA. */
static void text_event(FILE *f, uint64_t seq, const char *topic, const msgpack_object *ev)
{
    const msgpack_object *tag = event_tag(ev);
    const msgpack_object *keys = field(ev, "block_hashes");
    fprintf(f, "%8" PRIu64 " %s ", seq, topic);
    text_str(f, tag);
    if (keys && keys->type == MSGPACK_OBJECT_ARRAY) {
        uint32_t n = keys->via.array.size;
        fprintf(f, " %u block%s ", n, n == 1 ? "" : "s");
        text_key(f, n ? &keys->via.array.ptr[0] : NULL);
        if (n > 1) {
            fputs(n > 2 ? "..." : " ", f);
            text_key(f, &keys->via.array.ptr[n - 1]);
        }
    }
    const msgpack_object *tokens = field(ev, "token_ids");
    if (tokens && tokens->type == MSGPACK_OBJECT_ARRAY) {
        fputs(" parent ", f);
        text_key(f, field(ev, "parent_block_hash"));
        fprintf(f, " tokens %u block_size ", tokens->via.array.size);
        json_value(f, field(ev, "block_size"));
    }
    const msgpack_object *medium = field(ev, "medium");
    if (medium) {
        fputs(" medium ", f);
        text_str(f, medium);
    }
    const msgpack_object *lora = field(ev, "lora_name");
    if (lora && lora->type == MSGPACK_OBJECT_STR) {
        fputs(" lora ", f);
        text_str(f, lora);
    }
    fputc('\n', f);
}

/* Decodes and prints one message. Returns 0, or -1 for a payload that is
 * not a batch (message on stderr). */
static int show(FILE *f, bool json, uint64_t seq, const char *topic, const char *payload,
                size_t len)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = -1;
    if (msgpack_unpack_next(&u, payload, len, NULL) != MSGPACK_UNPACK_SUCCESS ||
        u.data.type != MSGPACK_OBJECT_ARRAY || u.data.via.array.size != 3 ||
        u.data.via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY) {
        fprintf(stderr,
                "kvshare events: seq %" PRIu64 ": the payload is not a batch "
                "[ts, events, data_parallel_rank]\n",
                seq);
        goto done;
    }
    const msgpack_object *batch = u.data.via.array.ptr;
    const msgpack_object_array *events = &batch[1].via.array;
    if (json) {
        fprintf(f, "{\"seq\":%" PRIu64 ",\"topic\":", seq);
        json_str(f, topic, strlen(topic));
        fputs(",\"ts\":", f);
        json_value(f, &batch[0]);
        fputs(",\"data_parallel_rank\":", f);
        json_value(f, &batch[2]);
        fputs(",\"events\":[", f);
        for (uint32_t i = 0; i < events->size; i++) {
            if (i)
                fputc(',', f);
            json_event(f, &events->ptr[i]);
        }
        fputs("]}\n", f);
    } else {
        for (uint32_t i = 0; i < events->size; i++)
            text_event(f, seq, topic, &events->ptr[i]);
    }
    fflush(f);
    rc = 0;
done:
    msgpack_unpacked_destroy(&u);
    return rc;
}

/* Receives one frame into buf (truncated to cap, NUL-terminated); its full
 * size in *len. Returns whether more frames follow, or -1 on error. */
static int recv_frame(void *sock, char *buf, size_t cap, size_t *len)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    *len = zmq_msg_size(&m);
    size_t n = *len < cap - 1 ? *len : cap - 1;
    memcpy(buf, zmq_msg_data(&m), n);
    buf[n] = '\0';
    int more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    return more;
}

int kvshare_cmd_events(int argc, char **argv)
{
    const char *endpoint = DEFAULT_ENDPOINT, *topic = "";
    bool json = false;
    long count = 0, wait_ms = -1;
    int status = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--endpoint") == 0 && i + 1 < argc) {
            endpoint = argv[++i];
        } else if (strcmp(argv[i], "--topic") == 0 && i + 1 < argc) {
            topic = argv[++i];
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            char *end;
            count = strtol(argv[++i], &end, 10);
            if (*end || count < 1) {
                fprintf(stderr, "kvshare events: --count: give a number of messages >= 1\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--wait") == 0 && i + 1 < argc) {
            char *end;
            wait_ms = strtol(argv[++i], &end, 10);
            if (*end || wait_ms < 1 || wait_ms > 86400000) {
                fprintf(stderr, "kvshare events: --wait: give milliseconds, 1 to 86400000\n");
                return 2;
            }
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvshare events: unknown or incomplete option '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    /* kvshared binds ipc and wildcard tcp addresses: this side connects, except to a
     * wildcard address, where daemons connect to it. */
    bool bind = strchr(endpoint, '*') != NULL;
    void *ctx = zmq_ctx_new();
    void *sub = ctx ? zmq_socket(ctx, ZMQ_SUB) : NULL;
    if (!sub || zmq_setsockopt(sub, ZMQ_SUBSCRIBE, topic, strlen(topic)) != 0 ||
        (bind ? zmq_bind(sub, endpoint) : zmq_connect(sub, endpoint)) != 0) {
        fprintf(stderr, "kvshare events: cannot %s %s: %s\n", bind ? "bind" : "connect to",
                endpoint, zmq_strerror(zmq_errno()));
        status = 2;
        goto done;
    }
    /* Receives wake up every EVENTS_TICK_MS to look at `stop`: a signal
     * that comes between that look and a blocking receive would otherwise
     * be lost until the next message, which may never come. */
    int tick = wait_ms > 0 && wait_ms < EVENTS_TICK_MS ? (int)wait_ms : EVENTS_TICK_MS;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &tick, sizeof(tick));
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    static char topic_buf[512], seq_buf[16], payload[16u << 20];
    long quiet_ms = 0; /* since the last message */
    for (long got = 0; !stop && (count == 0 || got < count); got++) {
        size_t topic_len, seq_len = 0, payload_len = 0;
        int more = recv_frame(sub, topic_buf, sizeof(topic_buf), &topic_len);
        if (more < 0) {
            if (zmq_errno() == EAGAIN) {
                quiet_ms += tick;
                if (wait_ms > 0 && quiet_ms >= wait_ms) {
                    fprintf(stderr, "kvshare events: no message in %ld ms\n", wait_ms);
                    goto done;
                }
                got--; /* nothing received */
                continue;
            }
            if (zmq_errno() == EINTR)
                break;
            fprintf(stderr, "kvshare events: %s\n", zmq_strerror(zmq_errno()));
            goto done;
        }
        quiet_ms = 0;
        if (more)
            more = recv_frame(sub, seq_buf, sizeof(seq_buf), &seq_len);
        if (more)
            more = recv_frame(sub, payload, sizeof(payload), &payload_len);
        if (more != 0 || seq_len != 8 || payload_len >= sizeof(payload) ||
            topic_len >= sizeof(topic_buf)) {
            fprintf(stderr, "kvshare events: a message that is not [topic, seq (8 bytes), "
                            "payload]\n");
            while (more > 0)
                more = recv_frame(sub, seq_buf, sizeof(seq_buf), &seq_len);
            continue;
        }
        uint64_t seq = 0;
        for (int b = 0; b < 8; b++)
            seq = seq << 8 | (unsigned char)seq_buf[b];
        show(stdout, json, seq, topic_buf, payload, payload_len);
    }
    status = 0;
done:
    if (sub) {
        int linger = 0;
        zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_close(sub);
    }
    if (ctx)
        zmq_ctx_term(ctx);
    return status;
}
