/* SPDX-License-Identifier: Apache-2.0 */
#include "cluster_tier.h"

#include "kvshare_status.h"

#include <stdlib.h>
#include <string.h>

#define CLUSTER_KEY_MAX 512

struct cluster_tier {
    cluster_t *c;
    char *prefix;
    uint32_t max_puts;
    uint32_t puts_inflight;
    /* Operations in flight hold the tier: freed when closed and none is. */
    uint64_t live;
    int closed;
    cluster_tier_stats_t stats;
    void (*on_put_done)(void *arg);
    void *put_arg;
};

typedef struct fetch fetch_t;

/* One GET of a fetch: the reply's argument. */
typedef struct fetch_get {
    fetch_t *f;
    size_t i;
} fetch_get_t;

struct fetch {
    cluster_tier_t *t;
    size_t n, pending;
    char *ns;
    size_t ns_len;
    uint64_t *hashes;
    uint32_t *tokens; /* n * n_tokens */
    uint32_t n_tokens;
    size_t payload_len;
    uint8_t *hits;
    fetch_get_t *gets;
    uint64_t start_ns;
    size_t piece; /* with on_piece: the payload's pieces go there */
    cluster_tier_piece_cb on_piece;
    cluster_tier_block_cb on_block;
    cluster_tier_done_cb on_done;
    void *arg;
};

static void tier_unref(cluster_tier_t *t)
{
    if (--t->live == 0 && t->closed) {
        free(t->prefix);
        free(t);
    }
}

int cluster_tier_new(cluster_t *c, const char *prefix, uint32_t max_puts, cluster_tier_t **out)
{
    if (!c || !out || max_puts == 0)
        return KVS_EINVAL;
    cluster_tier_t *t = calloc(1, sizeof *t);
    if (!t)
        return KVS_ENOMEM;
    t->prefix = strdup(prefix ? prefix : "");
    if (!t->prefix) {
        free(t);
        return KVS_ENOMEM;
    }
    t->c = c;
    t->max_puts = max_puts;
    t->live = 1; /* the owner's reference */
    *out = t;
    return 0;
}

void cluster_tier_free(cluster_tier_t *t)
{
    if (!t || t->closed)
        return;
    t->closed = 1;
    tier_unref(t);
}

/* ---- up ---- */

static void put_done(void *arg, int status, const char *data, size_t len)
{
    cluster_tier_t *t = arg;
    (void)data;
    (void)len;
    t->puts_inflight--;
    if (status == 0)
        t->stats.put_ok++;
    else
        t->stats.put_errors++;
    if (t->on_put_done && !t->closed)
        t->on_put_done(t->put_arg);
    tier_unref(t);
}

int cluster_tier_put_value(cluster_tier_t *t, const cluster_block_t *b, unsigned char *value)
{
    if (!t || t->closed || !b || !value)
        return KVS_EINVAL;
    if (t->puts_inflight >= t->max_puts) {
        t->stats.put_drops++;
        return KVS_EBUSY;
    }
    char key[CLUSTER_KEY_MAX];
    int klen = cluster_value_key(t->prefix, b, key, sizeof key);
    if (klen < 0)
        return klen;
    size_t vlen = cluster_value_size(b);
    int hlen = cluster_value_header(b, value + (vlen - b->payload_len), value);
    if (hlen < 0)
        return hlen;
    /* The client formats (copies) the command at once: value is the
     * caller's again on return. */
    int rc = cluster_set(t->c, key, (size_t)klen, value, vlen, put_done, t);
    if (rc != 0) {
        t->stats.put_drops++;
        return rc == KVS_ENOMEM ? rc : KVS_EBUSY;
    }
    t->puts_inflight++;
    t->live++;
    t->stats.puts++;
    t->stats.put_bytes += vlen;
    return 0;
}

int cluster_tier_put(cluster_tier_t *t, const cluster_block_t *b, const void *payload)
{
    if (!t || t->closed || !b || (b->payload_len && !payload))
        return KVS_EINVAL;
    if (t->puts_inflight >= t->max_puts) {
        t->stats.put_drops++;
        return KVS_EBUSY;
    }
    size_t vlen = cluster_value_size(b);
    unsigned char *value = malloc(vlen);
    if (!value)
        return KVS_ENOMEM;
    memcpy(value + (vlen - b->payload_len), payload, b->payload_len);
    int rc = cluster_tier_put_value(t, b, value);
    free(value);
    return rc;
}

/* ---- down ---- */

static void fetch_free(fetch_t *f)
{
    free(f->ns);
    free(f->hashes);
    free(f->tokens);
    free(f->hits);
    free(f->gets);
    free(f);
}

static cluster_block_t fetch_block(const fetch_t *f, size_t i)
{
    cluster_block_t b = {.ns = f->ns,
                         .ns_len = f->ns_len,
                         .hash = f->hashes[i],
                         .tokens = f->tokens + i * f->n_tokens,
                         .n_tokens = f->n_tokens,
                         .payload_len = f->payload_len};
    return b;
}

/* One GET's answer is in; the last one ends the fetch. */
static void fetch_step(fetch_t *f)
{
    cluster_tier_t *t = f->t;
    if (--f->pending > 0)
        return;
    if (!t->closed) {
        t->stats.fetches++;
        t->stats.fetch_us_sum += (uv_hrtime() - f->start_ns) / 1000;
        f->on_done(f->arg, f->hits, f->n);
    }
    fetch_free(f);
    tier_unref(t);
}

static int place_piece(void *arg, size_t off, const void *src, size_t n)
{
    const fetch_get_t *g = arg;
    return g->f->on_piece(g->f->arg, g->i, off, src, n);
}

/* Verifies the value of GET g (len bytes at data), counts the verdict and
 * hands a block that verified on: its pieces placed as they are checked
 * (on_piece), or the whole payload to on_block. */
static void get_verify(fetch_get_t *g, const char *data, size_t len)
{
    fetch_t *f = g->f;
    cluster_tier_t *t = f->t;
    if (t->closed)
        return; /* nobody waits for it */
    cluster_block_t b = fetch_block(f, g->i);
    const void *payload = NULL;
    int rc = f->on_piece ? cluster_value_check_copy(data, len, &b, f->piece, place_piece, g)
                         : cluster_value_check(data, len, &b, &payload);
    if (rc == KVS_EPROTO) {
        t->stats.corrupt++;
    } else if (rc == KVS_ENOTFOUND) {
        t->stats.mismatched++;
    } else if (rc != 0) {
        t->stats.get_errors++; /* on_piece failed */
    } else {
        t->stats.hits++;
        t->stats.get_bytes += b.payload_len;
        f->hits[g->i] = 1;
        f->on_block(f->arg, g->i, payload, b.payload_len);
    }
}

/* The value of GET g, where the client's reader holds it. */
static void get_sink(void *arg, const char *data, size_t len)
{
    get_verify(arg, data, len);
}

static void get_done(void *arg, int status, const char *data, size_t len)
{
    fetch_get_t *g = arg;
    fetch_t *f = g->f;
    cluster_tier_t *t = f->t;
    if (status == KVS_ENOTFOUND)
        t->stats.misses++;
    else if (status != 0)
        t->stats.get_errors++;
    else if (data)
        get_verify(g, data, len); /* not taken by get_sink */
    fetch_step(f);
}

static fetch_t *fetch_new(cluster_tier_t *t, const cluster_block_t *blocks, size_t n)
{
    fetch_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->t = t;
    f->n = n;
    f->ns_len = blocks[0].ns_len;
    f->n_tokens = blocks[0].n_tokens;
    f->payload_len = blocks[0].payload_len;
    f->ns = malloc(f->ns_len + 1);
    f->hashes = calloc(n, sizeof *f->hashes);
    f->tokens = calloc(n * f->n_tokens + 1, sizeof *f->tokens);
    f->hits = calloc(n, 1);
    f->gets = calloc(n, sizeof *f->gets);
    if (!f->ns || !f->hashes || !f->tokens || !f->hits || !f->gets) {
        fetch_free(f);
        return NULL;
    }
    memcpy(f->ns, blocks[0].ns, f->ns_len);
    f->ns[f->ns_len] = '\0';
    for (size_t i = 0; i < n; i++) {
        f->hashes[i] = blocks[i].hash;
        memcpy(f->tokens + i * f->n_tokens, blocks[i].tokens, f->n_tokens * sizeof(uint32_t));
        f->gets[i].f = f;
        f->gets[i].i = i;
    }
    return f;
}

static int same_geometry(const cluster_block_t *blocks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const cluster_block_t *b = &blocks[i];
        if (b->ns_len != blocks[0].ns_len || memcmp(b->ns, blocks[0].ns, b->ns_len) != 0 ||
            b->n_tokens != blocks[0].n_tokens || b->payload_len != blocks[0].payload_len ||
            (b->n_tokens && !b->tokens))
            return 0;
    }
    return 1;
}

int cluster_tier_fetch(cluster_tier_t *t, const cluster_block_t *blocks, size_t n,
                       cluster_tier_block_cb on_block, cluster_tier_done_cb on_done, void *arg)
{
    return cluster_tier_fetch_into(t, blocks, n, 0, NULL, on_block, on_done, arg);
}

int cluster_tier_fetch_into(cluster_tier_t *t, const cluster_block_t *blocks, size_t n,
                            size_t piece, cluster_tier_piece_cb on_piece,
                            cluster_tier_block_cb on_block, cluster_tier_done_cb on_done, void *arg)
{
    if (!t || t->closed || !blocks || n == 0 || !on_block || !on_done || (on_piece && piece == 0) ||
        !same_geometry(blocks, n))
        return KVS_EINVAL;
    fetch_t *f = fetch_new(t, blocks, n);
    if (!f)
        return KVS_ENOMEM;
    f->piece = piece;
    f->on_piece = on_piece;
    f->on_block = on_block;
    f->on_done = on_done;
    f->arg = arg;
    f->start_ns = uv_hrtime();
    /* One pending step more than GETs, so that on_done cannot run inside
     * this call even when every GET is refused at once. */
    f->pending = n + 1;
    t->live++;
    for (size_t i = 0; i < n; i++) {
        char key[CLUSTER_KEY_MAX];
        cluster_block_t b = fetch_block(f, i);
        int klen = cluster_value_key(t->prefix, &b, key, sizeof key);
        t->stats.gets++;
        if (klen < 0 ||
            cluster_get_sink(t->c, key, (size_t)klen, get_sink, get_done, &f->gets[i]) != 0) {
            t->stats.get_errors++;
            f->pending--;
        }
    }
    if (f->pending == 1) {
        /* Nothing was sent: end the fetch now, but never inside the
         * caller's call: the caller may not expect on_done yet. */
        f->pending = 0;
        t->live--;
        fetch_free(f);
        return KVS_EIO;
    }
    fetch_step(f);
    return 0;
}

int cluster_tier_key(const cluster_tier_t *t, const cluster_block_t *b, char *buf, size_t len)
{
    return cluster_value_key(t->prefix, b, buf, len);
}

void cluster_tier_on_put_done(cluster_tier_t *t, void (*cb)(void *arg), void *arg)
{
    t->on_put_done = cb;
    t->put_arg = arg;
}

int cluster_tier_put_room(const cluster_tier_t *t)
{
    return t->puts_inflight < t->max_puts;
}

void cluster_tier_get_stats(const cluster_tier_t *t, cluster_tier_stats_t *out)
{
    *out = t->stats;
}
