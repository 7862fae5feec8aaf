/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier as a tier medium (store_disk_medium.h). A batch becomes one
 * disk_submit; its end, on a tier thread, is queued and an async handle
 * wakes the loop, which calls the medium's done.
 */
#include "store_disk_medium.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvshare_status.h"
#include "log.h"
#include "loop_wake.h"

typedef struct slot_key {
    uint64_t chain_hash, seq;
    uint32_t ns_id;
} slot_key_t;

typedef struct medium_batch {
    struct medium_batch *next;
    struct disk_medium *dm;
    bool put;
    const uint32_t *ids;
    const uint32_t *slots;
    size_t n;
    uint32_t *tokens; /* a put's copy of each block's tokens */
    tier_medium_done_fn done;
    void *arg;
    uint64_t t0, copy_ns;
    disk_op_t ops[]; /* n */
} medium_batch_t;

typedef struct disk_medium {
    tier_medium_t m;
    uv_loop_t *loop;
    loop_wake_t async; /* the tier's threads wake the loop (loop_wake.h) */
    disk_t *td;
    store_disk_source_t src;
    slot_key_t *keys; /* what each slot's last put wrote; seq 0: nothing */
    /* By slot: the chained hash of the record on the disk there, the
     * block's or one no longer in the index (a slot freed keeps its
     * record until it is written again: a restart could find it), 0 when
     * none (store_disk_medium_forget); and whether a put to it is in flight. */
    uint64_t *on_disk;
    uint8_t *putting;
    /* on_disk by hash: buckets of slots chained through on_next, so that an
     * Evict visits its own blocks' records, never every slot. The bucket
     * of a hash is keyed per process: no client picks colliding ones. */
    uint32_t *on_head; /* [on_mask + 1]: a bucket's first slot, DISK_NO_SLOT: none */
    uint32_t *on_next; /* [capacity] */
    uint64_t on_key;   /* odd */
    unsigned on_shift; /* 64 - log2(on_mask + 1) */
    pthread_mutex_t mu;
    pthread_mutex_t store_mu; /* one src.store at a time (drain) */
    medium_batch_t *ended;    /* batches ended on a tier thread, for the loop */
    tier_medium_stats_t st;
    uint64_t last_log_ns; /* failures are logged once a second at most */
    uint64_t unlogged;    /* failed batches since the last line */
} disk_medium_t;

static size_t on_bucket(const disk_medium_t *dm, uint64_t h)
{
    return (size_t)((h * dm->on_key) >> dm->on_shift);
}

/* Slot s now holds the record of chain hash h on the disk (0: none). */
static void set_on_disk(disk_medium_t *dm, uint32_t s, uint64_t h)
{
    uint64_t was = dm->on_disk[s];
    if (was == h)
        return;
    if (was != 0) {
        uint32_t *link = &dm->on_head[on_bucket(dm, was)];
        while (*link != s)
            link = &dm->on_next[*link];
        *link = dm->on_next[s];
    }
    dm->on_disk[s] = h;
    if (h != 0) {
        size_t b = on_bucket(dm, h);
        dm->on_next[s] = dm->on_head[b];
        dm->on_head[b] = s;
    }
}

/* On a tier thread: a verified get's block into the pool. One at a time:
 * the backend copies through one stream, and the threads engine has many
 * threads (the ring has one: no wait there). */
static int drain(void *ctx, uint32_t id, const void *buf)
{
    disk_medium_t *dm = ctx;
    pthread_mutex_lock(&dm->store_mu);
    int rc = dm->src.store(dm->src.arg, id, buf);
    pthread_mutex_unlock(&dm->store_mu);
    return rc;
}

/* On a tier thread. */
static void batch_ended(void *arg, disk_op_t *ops, size_t n)
{
    (void)ops;
    (void)n;
    medium_batch_t *b = arg;
    disk_medium_t *dm = b->dm;
    b->copy_ns = uv_hrtime() - b->t0;
    pthread_mutex_lock(&dm->mu);
    b->next = dm->ended;
    dm->ended = b;
    pthread_mutex_unlock(&dm->mu);
    loop_wake_send(&dm->async);
}

/* The slots of a failed get that can never be served (they did not
 * verify, or hold another block); a malloc'd array, NULL when none. */
static uint32_t *bad_slots(const disk_medium_t *dm, const medium_batch_t *b, size_t *n_bad)
{
    *n_bad = 0;
    if (b->put || !dm->src.bad)
        return NULL;
    uint32_t *bad = NULL;
    for (size_t i = 0; i < b->n; i++) {
        if (b->ops[i].status != KVS_ENOTFOUND)
            continue;
        if (!bad && !(bad = malloc(b->n * sizeof(*bad))))
            return NULL; /* the slots stay; a later get fails on them again */
        bad[(*n_bad)++] = b->ops[i].slot;
    }
    return bad;
}

/* On the loop: a put records what each slot now holds (or nothing, when
 * it failed); the first failing op's status is the batch's, a disk error
 * before KVS_ENOTFOUND (slots that did not verify). A get's slots
 * that can never be served go to src.bad once the batch's done has run
 * (its moves are undone then, so the index may drop those blocks). */
static void finish(disk_medium_t *dm, medium_batch_t *b)
{
    tier_medium_result_t res = {.copy_ns = b->copy_ns};
    for (size_t i = 0; i < b->n; i++) {
        disk_op_t *op = &b->ops[i];
        /* A disk error is the batch's status before a slot that did not
         * verify (KVS_ENOTFOUND: that block's fault, not the disk's). */
        if (op->status != 0 && (res.status == 0 || res.status == KVS_ENOTFOUND))
            res.status = op->status;
    }
    for (size_t i = 0; i < b->n && b->put; i++) {
        disk_op_t *op = &b->ops[i];
        dm->putting[op->slot] = 0;
        dm->keys[op->slot] = res.status == 0
                                 ? (slot_key_t){op->meta.chain_hash, op->meta.seq, op->meta.ns_id}
                                 : (slot_key_t){0};
    }
    if (res.status != 0) {
        dm->st.failures++;
        /* A failing disk fails every batch: one line a second says so. */
        uint64_t now = uv_hrtime();
        if (dm->last_log_ns == 0 || now - dm->last_log_ns >= 1000000000ull) {
            LOG_WARN("disk tier: a %s of %zu blocks failed: %s (%llu more failed batches not "
                     "logged)",
                     b->put ? "write" : "read", b->n, kvs_status_text(res.status),
                     (unsigned long long)dm->unlogged);
            dm->last_log_ns = now;
            dm->unlogged = 0;
        } else {
            dm->unlogged++;
        }
    } else {
        dm->st.blocks += b->n;
        for (size_t i = 0; i < b->n && !b->put; i++)
            disk_slot_touch(dm->td, b->ops[i].slot);
    }
    loop_wake_release(&dm->async);
    size_t n_bad = 0;
    uint32_t *bad = res.status != 0 ? bad_slots(dm, b, &n_bad) : NULL;
    tier_medium_done_fn done = b->done;
    void *arg = b->arg;
    free(b->tokens);
    free(b);
    done(arg, &res);
    for (size_t i = 0; i < n_bad; i++)
        dm->src.bad(dm->src.arg, bad[i]);
    free(bad);
}

static void on_async(loop_wake_t *h)
{
    disk_medium_t *dm = h->data;
    pthread_mutex_lock(&dm->mu);
    medium_batch_t *list = dm->ended;
    dm->ended = NULL;
    pthread_mutex_unlock(&dm->mu);
    /* Oldest first: the list is newest first. */
    medium_batch_t *rev = NULL;
    while (list) {
        medium_batch_t *nx = list->next;
        list->next = rev;
        rev = list;
        list = nx;
    }
    while (rev) {
        medium_batch_t *nx = rev->next;
        finish(dm, rev);
        rev = nx;
    }
    /* What the disk's threads had to say meanwhile (an io_uring_submit
     * that failed, say) goes to the log now, on the loop. */
    disk_notes_flush(dm->td);
}

static int start(tier_medium_t *m, bool put, const uint32_t *ids, const uint32_t *slots, size_t n,
                 tier_medium_done_fn done, void *arg)
{
    disk_medium_t *dm = (disk_medium_t *)m;
    if (n == 0)
        return KVS_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (slots[i] >= m->capacity)
            return KVS_EINVAL;
    medium_batch_t *b = calloc(1, sizeof(*b) + n * sizeof(disk_op_t));
    if (!b)
        return KVS_ENOMEM;
    *b = (medium_batch_t){
        .dm = dm, .put = put, .ids = ids, .slots = slots, .n = n, .done = done, .arg = arg};
    uint32_t bt = dm->src.block_tokens;
    /* Without src.block, a put's block is gathered into the tier's buffer
     * and a get's is drained from it into the pool, on a tier thread. */
    bool in_place = dm->src.block != NULL;
    if (put && bt > 0 && !(b->tokens = malloc(n * bt * sizeof(uint32_t)))) {
        free(b);
        return KVS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        disk_op_t *op = &b->ops[i];
        op->slot = slots[i];
        if (in_place) {
            op->data = dm->src.block(dm->src.arg, ids[i]);
        } else if (put) {
            op->fill = dm->src.gather;
            op->fill_ctx = dm->src.arg;
            op->fill_src = dm->src.locate(dm->src.arg, ids[i]);
        } else {
            op->drain = drain;
            op->drain_ctx = dm;
            op->drain_dst = ids[i];
        }
        if (put) {
            dm->src.meta(dm->src.arg, ids[i], &op->meta);
            if (b->tokens) { /* the index may move its copy before the write */
                uint32_t nt = op->meta.ntokens < bt ? op->meta.ntokens : bt;
                memcpy(b->tokens + i * bt, op->meta.tokens, nt * sizeof(uint32_t));
                op->meta.tokens = b->tokens + i * bt;
            }
            if (!disk_slot_used(dm->td, slots[i]))
                disk_slot_claim(dm->td, slots[i]);
            set_on_disk(dm, slots[i], op->meta.chain_hash);
            dm->putting[slots[i]] = 1;
        } else {
            slot_key_t k = dm->keys[slots[i]];
            op->meta.chain_hash = k.chain_hash;
            op->meta.ns_id = k.ns_id;
            /* A slot no put filled: seq UINT64_MAX never matches, a miss. */
            op->meta.seq = k.seq ? k.seq : UINT64_MAX;
        }
    }
    b->t0 = uv_hrtime();
    int rc = disk_submit(dm->td, put, b->ops, n, batch_ended, b);
    if (rc != 0) {
        free(b->tokens);
        free(b);
        return rc;
    }
    loop_wake_hold(&dm->async); /* the loop runs until the batch is done */
    if (put)
        dm->st.puts++;
    else
        dm->st.gets++;
    return 0;
}

static int medium_put(tier_medium_t *m, const uint32_t *ids, const uint32_t *slots, size_t n,
                      tier_medium_done_fn done, void *arg)
{
    return start(m, true, ids, slots, n, done, arg);
}

static int medium_get(tier_medium_t *m, const uint32_t *ids, const uint32_t *slots, size_t n,
                      tier_medium_done_fn done, void *arg)
{
    return start(m, false, ids, slots, n, done, arg);
}

/* The slot is free again and its record forgotten: a get of it misses
 * even though its bytes stay on disk until overwritten. */
static void medium_drop(tier_medium_t *m, const uint32_t *slots, size_t n)
{
    disk_medium_t *dm = (disk_medium_t *)m;
    for (size_t i = 0; i < n; i++) {
        if (slots[i] >= m->capacity)
            continue;
        dm->keys[slots[i]] = (slot_key_t){0};
        disk_slot_free(dm->td, slots[i]);
    }
}

void store_disk_medium_restore(tier_medium_t *m, uint32_t slot, uint64_t chain_hash, uint64_t seq,
                               uint32_t ns_id)
{
    disk_medium_t *dm = (disk_medium_t *)m;
    if (slot < m->capacity) {
        dm->keys[slot] = (slot_key_t){chain_hash, seq, ns_id};
        set_on_disk(dm, slot, chain_hash);
    }
}

void store_disk_medium_found(tier_medium_t *m, uint32_t slot, uint64_t chain_hash)
{
    disk_medium_t *dm = (disk_medium_t *)m;
    if (slot < m->capacity)
        set_on_disk(dm, slot, chain_hash);
}

/* Adds h to set (open addressing, mask + 1 entries, 0 empty); false when
 * it was there already. */
static bool set_add(uint64_t *set, size_t mask, uint64_t h)
{
    size_t i = (size_t)(h ^ h >> 29) & mask;
    for (; set[i]; i = (i + 1) & mask)
        if (set[i] == h)
            return false;
    set[i] = h;
    return true;
}

int store_disk_medium_forget(tier_medium_t *m, const uint64_t *hashes, size_t n,
                             size_t *n_forgotten, size_t *n_looked)
{
    disk_medium_t *dm = (disk_medium_t *)m;
    *n_forgotten = *n_looked = 0;
    if (n == 0)
        return 0;
    /* Each hash once (a crafted prompt may repeat one). */
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint64_t *set = calloc(cap, sizeof(*set));
    uint32_t *slots = NULL;
    size_t k = 0, room = 0;
    if (!set)
        return KVS_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (hashes[i] == 0 || !set_add(set, cap - 1, hashes[i]))
            continue;
        for (uint32_t s = dm->on_head[on_bucket(dm, hashes[i])]; s != DISK_NO_SLOT;
             s = dm->on_next[s]) {
            (*n_looked)++;
            /* (a slot being written holds the block the put names, or soon will) */
            if (dm->on_disk[s] != hashes[i] || dm->putting[s])
                continue;
            if (k == room) {
                size_t nc = room ? 2 * room : 16;
                uint32_t *more = realloc(slots, nc * sizeof(*slots));
                if (!more) {
                    free(slots);
                    free(set);
                    return KVS_ENOMEM;
                }
                slots = more;
                room = nc;
            }
            slots[k++] = s;
        }
    }
    char err[160];
    int rc = disk_forget(dm->td, slots, k, err, sizeof(err));
    if (rc != 0)
        LOG_ERROR("disk tier: %s", err);
    for (size_t i = 0; rc == 0 && i < k; i++)
        set_on_disk(dm, slots[i], 0);
    if (rc == 0)
        *n_forgotten = k;
    free(slots);
    free(set);
    return rc;
}

disk_t *store_disk_medium_disk(const tier_medium_t *m)
{
    return ((const disk_medium_t *)m)->td;
}

static void medium_stats(const tier_medium_t *m, tier_medium_stats_t *out)
{
    *out = ((const disk_medium_t *)m)->st;
}

static void on_closed(loop_wake_t *h)
{
    disk_medium_t *dm = h->data;
    pthread_mutex_destroy(&dm->mu);
    pthread_mutex_destroy(&dm->store_mu);
    free(dm->keys);
    free(dm->on_disk);
    free(dm->putting);
    free(dm->on_head);
    free(dm->on_next);
    free(dm);
}

static void medium_close(tier_medium_t *m)
{
    disk_medium_t *dm = (disk_medium_t *)m;
    loop_wake_close(&dm->async, on_closed);
}

static const tier_medium_ops_t medium_ops = {
    .name = "disk",
    .put = medium_put,
    .get = medium_get,
    .drop = medium_drop,
    .stats = medium_stats,
    .close = medium_close,
};

int store_disk_medium_open(uv_loop_t *loop, disk_t *td, const store_disk_source_t *src,
                           tier_medium_t **out)
{
    disk_medium_t *dm = calloc(1, sizeof(*dm));
    if (!dm)
        return KVS_ENOMEM;
    dm->keys = calloc(disk_capacity(td), sizeof(slot_key_t));
    dm->on_disk = calloc(disk_capacity(td), sizeof(*dm->on_disk));
    dm->putting = calloc(disk_capacity(td), 1);
    size_t buckets = 16;
    dm->on_shift = 60;
    while (buckets < disk_capacity(td)) {
        buckets *= 2;
        dm->on_shift--;
    }
    dm->on_head = malloc(buckets * sizeof(*dm->on_head));
    dm->on_next = malloc(disk_capacity(td) * sizeof(*dm->on_next));
    dm->on_key = (uv_hrtime() ^ (uint64_t)(uintptr_t)dm) * 0x9E3779B97F4A7C15ull | 1;
    bool mem = dm->keys && dm->on_disk && dm->putting && dm->on_head && dm->on_next;
    if (!mem || loop_wake_init(loop, &dm->async, on_async) != 0) {
        free(dm->keys);
        free(dm->on_disk);
        free(dm->putting);
        free(dm->on_head);
        free(dm->on_next);
        free(dm);
        return mem ? KVS_EIO : KVS_ENOMEM;
    }
    for (size_t b = 0; b < buckets; b++)
        dm->on_head[b] = DISK_NO_SLOT;
    dm->async.data = dm;
    loop_wake_unref(&dm->async); /* idle: the loop may end */
    pthread_mutex_init(&dm->mu, NULL);
    pthread_mutex_init(&dm->store_mu, NULL);
    dm->m.ops = &medium_ops;
    dm->m.capacity = disk_capacity(td);
    dm->loop = loop;
    dm->td = td;
    dm->src = *src;
    *out = &dm->m;
    return 0;
}
