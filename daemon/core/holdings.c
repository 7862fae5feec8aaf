/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A session's holdings (session.h): its WRITING blocks, a dense list the
 * store's records point back into (store.h: writer, writer_pos); its pins,
 * a hash map block id -> count with open addressing, because a session may
 * pin the same cached block several times; and the scratch its replies are
 * built in. The store adds and drops; this file keeps the memory.
 */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "kvshare_status.h"

int session_writing_reserve(session_t *s, uint32_t n)
{
    session_holdings_t *h = &s->own;
    if ((uint64_t)h->n_writing + n <= h->cap_writing)
        return 0;
    uint64_t cap = h->cap_writing ? h->cap_writing : 16;
    while (cap < (uint64_t)h->n_writing + n)
        cap *= 2;
    if (cap > UINT32_MAX)
        return KVS_ENOMEM;
    uint32_t *w = realloc(h->writing, cap * sizeof(*w));
    if (!w)
        return KVS_ENOMEM;
    h->writing = w;
    h->cap_writing = (uint32_t)cap;
    return 0;
}

static inline uint32_t pin_slot(uint32_t block_id, uint32_t mask)
{
    /* Fibonacci hashing spreads consecutive ids over the table. */
    return (uint32_t)(((uint64_t)block_id * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* The bytes of a pin table of cap entries (a key and a count each). */
static size_t pins_bytes(uint32_t cap)
{
    return (size_t)cap * 2 * sizeof(uint32_t);
}

static int pins_grow(session_pins_t *p, uint32_t cap)
{
    uint32_t *keys = malloc((size_t)cap * sizeof(*keys));
    uint32_t *counts = malloc((size_t)cap * sizeof(*counts));
    if (!keys || !counts) {
        free(keys);
        free(counts);
        return KVS_ENOMEM;
    }
    memset(keys, 0xff, (size_t)cap * sizeof(*keys));
    for (uint32_t i = 0; i < p->cap; i++) {
        if (p->keys[i] == SESSION_NO_BLOCK)
            continue;
        uint32_t j = pin_slot(p->keys[i], cap - 1);
        while (keys[j] != SESSION_NO_BLOCK)
            j = (j + 1) & (cap - 1);
        keys[j] = p->keys[i];
        counts[j] = p->counts[i];
    }
    free(p->keys);
    free(p->counts);
    p->keys = keys;
    p->counts = counts;
    p->cap = cap;
    return 0;
}

int session_pins_reserve(session_t *s, uint32_t n)
{
    session_pins_t *p = &s->own.pins;
    /* Load factor at most 1/2 keeps probes short. */
    uint64_t need = ((uint64_t)p->used + n) * 2;
    if (need <= p->cap)
        return 0;
    uint64_t cap = p->cap ? p->cap : 16;
    while (cap < need)
        cap *= 2;
    if (cap > (1ull << 31))
        return KVS_ENOMEM;
    return pins_grow(p, (uint32_t)cap);
}

static int64_t pin_find(const session_pins_t *p, uint32_t block_id)
{
    if (p->cap == 0)
        return -1;
    uint32_t mask = p->cap - 1;
    for (uint32_t i = pin_slot(block_id, mask);; i = (i + 1) & mask) {
        if (p->keys[i] == block_id)
            return i;
        if (p->keys[i] == SESSION_NO_BLOCK)
            return -1;
    }
}

void session_pin_add(session_t *s, uint32_t block_id)
{
    session_pins_t *p = &s->own.pins;
    uint32_t mask = p->cap - 1;
    uint32_t i = pin_slot(block_id, mask);
    while (p->keys[i] != SESSION_NO_BLOCK && p->keys[i] != block_id)
        i = (i + 1) & mask;
    if (p->keys[i] == SESSION_NO_BLOCK) {
        p->keys[i] = block_id;
        p->counts[i] = 0;
        p->used++;
    }
    p->counts[i]++;
    p->total++;
}

uint32_t session_pin_count(const session_t *s, uint32_t block_id)
{
    int64_t i = pin_find(&s->own.pins, block_id);
    return i < 0 ? 0 : s->own.pins.counts[i];
}

void session_pin_drop(session_t *s, uint32_t block_id)
{
    session_pins_t *p = &s->own.pins;
    int64_t found = pin_find(p, block_id);
    if (found < 0)
        return;
    uint32_t i = (uint32_t)found;
    p->total--;
    if (--p->counts[i] > 0)
        return;
    /* Backward-shift deletion: no tombstones, probes stay short. */
    uint32_t mask = p->cap - 1;
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & mask; p->keys[j] != SESSION_NO_BLOCK; j = (j + 1) & mask) {
        uint32_t home = pin_slot(p->keys[j], mask);
        /* Move j into the hole when its home is not in (hole, j]. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            p->keys[hole] = p->keys[j];
            p->counts[hole] = p->counts[j];
            hole = j;
        }
    }
    p->keys[hole] = SESSION_NO_BLOCK;
    p->used--;
    /* A table over what a session keeps shrinks as pins go, so that
     * closing costs what the session holds now, not what it once held. A
     * smaller one stays: a worker that pins a prompt's blocks and releases
     * them on every request would otherwise rebuild it at each halving.
     * (A failed shrink keeps the larger table.) */
    if (pins_bytes(p->cap) > SESSION_KEEP_BYTES && (uint64_t)p->used * 8 < p->cap)
        pins_grow(p, p->cap / 2);
}

int session_scratch(session_t *s, size_t n, uint32_t **out)
{
    session_holdings_t *h = &s->own;
    if (n > h->scratch_cap) {
        size_t cap = h->scratch_cap ? h->scratch_cap : 256;
        while (cap < n)
            cap *= 2;
        uint32_t *a = realloc(h->scratch, cap * sizeof(*a));
        if (!a)
            return KVS_ENOMEM;
        h->scratch = a;
        h->scratch_cap = cap;
    }
    *out = h->scratch;
    return 0;
}

/* The smallest table that holds n entries at a load of at most 1/2. */
static uint32_t cap_for(uint32_t n)
{
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2)
        cap *= 2;
    return (uint32_t)cap;
}

void session_holdings_shrink(session_t *s)
{
    session_holdings_t *h = &s->own;
    if (h->scratch_cap * sizeof(*h->scratch) > SESSION_KEEP_BYTES) {
        free(h->scratch);
        h->scratch = NULL;
        h->scratch_cap = 0;
    }
    session_pins_t *p = &h->pins;
    if (pins_bytes(p->cap) > SESSION_KEEP_BYTES && (uint64_t)p->used * 8 < p->cap)
        pins_grow(p, cap_for(p->used)); /* when it fails, the larger table stays */
    if (h->cap_writing * sizeof(*h->writing) > SESSION_KEEP_BYTES &&
        (uint64_t)h->n_writing * 4 < h->cap_writing) {
        uint32_t cap = cap_for(h->n_writing);
        uint32_t *w = realloc(h->writing, (size_t)cap * sizeof(*w));
        if (w) {
            h->writing = w;
            h->cap_writing = cap;
        }
    }
}

void session_holdings_free(session_t *s)
{
    session_holdings_t *h = &s->own;
    free(h->writing);
    free(h->pins.keys);
    free(h->pins.counts);
    free(h->scratch);
    memset(h, 0, sizeof(*h));
}
