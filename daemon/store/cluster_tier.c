/* SPDX-License-Identifier: Apache-2.0 */
#include "cluster_tier.h"

#include "kvshare_status.h"

#include <stdlib.h>
#include <string.h>

#define CLUSTER_KEY_MAX 512

typedef struct tier_clear tier_clear_t;

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
    tier_clear_t *clears; /* running */
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
    uint64_t identity;
    uint64_t written_us; /* the oldest value accepted (a Clear's cut) */
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

static void clear_end(tier_clear_t *cl, int whole);

void cluster_tier_free(cluster_tier_t *t)
{
    if (!t || t->closed)
        return;
    t->closed = 1;
    /* A clear waiting for a retry holds no command: it would wait forever. */
    while (t->clears)
        clear_end(t->clears, 0);
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
                         .payload_len = f->payload_len,
                         .identity = f->identity,
                         .written_us = f->written_us};
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
    } else if (rc == KVS_EIDENTITY) {
        t->stats.identity_misses++;
    } else if (rc == KVS_ENOTFOUND) {
        t->stats.mismatched++;
    } else if (rc == KVS_EBADSTATE) {
        t->stats.cleared++;
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
    f->identity = blocks[0].identity;
    f->written_us = blocks[0].written_us;
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
            b->identity != blocks[0].identity || b->written_us != blocks[0].written_us ||
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

/* ---- clear ----
 *
 * One clear's state per node of the client (by its index): the SCAN
 * cursor of that node and the UNLINKs of its step in flight. Commands in
 * flight and the list each hold the clear (refs); the clear holds the
 * tier. */

enum { NODE_IDLE = 0, NODE_SCAN, NODE_UNLINK, NODE_DONE, NODE_FAILED };

typedef struct clear_node {
    tier_clear_t *cl;
    int idx;
    int state;
    uint64_t cursor;
    size_t unlinks;     /* UNLINKs of this step in flight */
    int redo;           /* an UNLINK of this step failed: scan the node again */
    uint64_t failed_ms; /* NODE_FAILED since */
} clear_node_t;

struct tier_clear {
    tier_clear_t *next;
    cluster_tier_t *t;
    char match[CLUSTER_KEY_MAX];
    uint64_t deadline_ms;
    uint64_t deleted;
    size_t refs;
    int ended;
    clear_node_t nodes[CLUSTER_MAX_NODES];
    cluster_tier_clear_cb done;
    void *arg;
};

static uint64_t now_ms(void)
{
    return uv_hrtime() / 1000000;
}

static void clear_unref(tier_clear_t *cl)
{
    if (--cl->refs > 0)
        return;
    cluster_tier_t *t = cl->t;
    free(cl);
    tier_unref(t);
}

/* Masters of the map not scanned through yet. */
static size_t clear_left(const tier_clear_t *cl)
{
    int masters[CLUSTER_MAX_NODES];
    size_t n = cluster_masters(cl->t->c, masters, CLUSTER_MAX_NODES);
    size_t left = 0;
    for (size_t i = 0; i < n; i++)
        left += cl->nodes[masters[i]].state != NODE_DONE;
    return n ? left : CLUSTER_MAX_NODES;
}

/* Ends cl (once): counted, reported unless the tier is closed. */
static void clear_end(tier_clear_t *cl, int whole)
{
    cluster_tier_t *t = cl->t;
    if (cl->ended)
        return;
    cl->ended = 1;
    for (tier_clear_t **p = &t->clears; *p; p = &(*p)->next)
        if (*p == cl) {
            *p = cl->next;
            break;
        }
    t->stats.clears++;
    if (!whole)
        t->stats.clears_incomplete++;
    if (cl->done) {
        size_t left = whole ? 0 : clear_left(cl);
        cl->done(cl->arg, cl->deleted, whole, left == CLUSTER_MAX_NODES ? 0 : left);
    }
    clear_unref(cl);
}

static void node_failed(clear_node_t *nd)
{
    nd->state = NODE_FAILED;
    nd->failed_ms = now_ms();
    nd->cursor = 0;
    nd->redo = 0;
}

static void on_scan(void *arg, int status, uint64_t cursor, const char *const *keys,
                    const size_t *lens, size_t n);

/* Sends nd's next SCAN. */
static void node_scan(tier_clear_t *cl, clear_node_t *nd)
{
    if (cluster_scan(cl->t->c, nd->idx, nd->cursor, cl->match, CLUSTER_TIER_SCAN_COUNT, on_scan,
                     nd) != 0) {
        node_failed(nd);
        return;
    }
    nd->state = NODE_SCAN;
    cl->refs++;
}

/* Ends cl when every master of the map is scanned through. */
static void clear_check(tier_clear_t *cl)
{
    if (!cl->ended && clear_left(cl) == 0)
        clear_end(cl, 1);
}

/* nd's step is over: its UNLINKs are all answered. */
static void step_done(tier_clear_t *cl, clear_node_t *nd)
{
    if (nd->redo) {
        node_failed(nd);
    } else if (nd->cursor == 0) {
        nd->state = NODE_DONE;
        clear_check(cl);
    } else {
        node_scan(cl, nd);
    }
}

static void on_unlink(void *arg, int status, const char *data, size_t len)
{
    clear_node_t *nd = arg;
    tier_clear_t *cl = nd->cl;
    cluster_tier_t *t = cl->t;
    if (status == 0 && len == 1 && data[0] == '1') {
        cl->deleted++;
        t->stats.keys_deleted++;
    } else if (status != 0) {
        nd->redo = 1;
    }
    if (--nd->unlinks == 0 && !cl->ended && !t->closed)
        step_done(cl, nd);
    clear_unref(cl);
}

static void on_scan(void *arg, int status, uint64_t cursor, const char *const *keys,
                    const size_t *lens, size_t n)
{
    clear_node_t *nd = arg;
    tier_clear_t *cl = nd->cl;
    cluster_tier_t *t = cl->t;
    if (cl->ended || t->closed) {
        clear_unref(cl);
        return;
    }
    if (status != 0) {
        node_failed(nd);
        clear_unref(cl);
        return;
    }
    nd->cursor = cursor;
    nd->state = NODE_UNLINK;
    nd->unlinks = 0;
    for (size_t i = 0; i < n; i++) {
        const char *argv[2] = {"UNLINK", keys[i]};
        size_t alen[2] = {6, lens[i]};
        if (cluster_command(t->c, keys[i], lens[i], 2, argv, alen, on_unlink, nd) == 0) {
            nd->unlinks++;
            cl->refs++;
        } else {
            nd->redo = 1; /* refused at once: the node's scan starts over later */
        }
    }
    if (nd->unlinks == 0)
        step_done(cl, nd);
    clear_unref(cl);
}

int cluster_tier_clear(cluster_tier_t *t, const char *ns, size_t ns_len, uint64_t identity,
                       uint32_t timeout_ms, cluster_tier_clear_cb done, void *arg)
{
    if (!t || t->closed || !ns || !done)
        return KVS_EINVAL;
    tier_clear_t *cl = calloc(1, sizeof *cl);
    if (!cl)
        return KVS_ENOMEM;
    if (cluster_value_match(t->prefix, ns, ns_len, identity, cl->match, sizeof cl->match) < 0) {
        free(cl);
        return KVS_EINVAL;
    }
    cl->t = t;
    cl->deadline_ms = now_ms() + timeout_ms;
    cl->done = done;
    cl->arg = arg;
    cl->refs = 1; /* the list's */
    for (int i = 0; i < CLUSTER_MAX_NODES; i++) {
        cl->nodes[i].cl = cl;
        cl->nodes[i].idx = i;
    }
    t->live++;
    cl->next = t->clears;
    t->clears = cl;
    /* The masters known now start at once; with no map yet, the tick
     * starts them. done never runs inside this call. */
    int masters[CLUSTER_MAX_NODES];
    size_t n = cluster_masters(t->c, masters, CLUSTER_MAX_NODES);
    for (size_t i = 0; i < n; i++)
        node_scan(cl, &cl->nodes[masters[i]]);
    return 0;
}

void cluster_tier_tick(cluster_tier_t *t)
{
    if (!t || t->closed)
        return;
    uint64_t now = now_ms();
    tier_clear_t *next;
    for (tier_clear_t *cl = t->clears; cl; cl = next) {
        next = cl->next;
        if (now >= cl->deadline_ms) {
            clear_end(cl, 0);
            continue;
        }
        int masters[CLUSTER_MAX_NODES];
        size_t n = cluster_masters(t->c, masters, CLUSTER_MAX_NODES);
        for (size_t i = 0; i < n; i++) {
            clear_node_t *nd = &cl->nodes[masters[i]];
            if (nd->state == NODE_IDLE ||
                (nd->state == NODE_FAILED && now - nd->failed_ms >= CLUSTER_TIER_CLEAR_RETRY_MS))
                node_scan(cl, nd);
        }
        clear_check(cl);
    }
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
