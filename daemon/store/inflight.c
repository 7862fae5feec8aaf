/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inflight.c: the declared prefixes of WRITING blocks (see inflight.h).
 *
 *   bucket[h & mask] -> block -> next[block] -> ... -> INFLIGHT_NONE
 *   key[block] = h_i of the declared prefix, ns_of[block] its namespace
 *
 * One chained hash table threaded through per-entry arrays: entries
 * [0, n_blocks) are the pool's blocks (a block is declared at most once),
 * entries [n_blocks, 2 n_blocks) are claims, taken from a free stack and
 * listed per session through claim_next. Declaring, claiming and ending
 * either never allocate, and a key may appear several times (two writers of
 * one prefix).
 */
#include "inflight.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "session.h"
#include "store.h"

#define INFLIGHT_NONE UINT32_MAX

struct inflight {
    uint32_t n_blocks;
    uint32_t mask;
    uint32_t *bucket;  /* [mask + 1] first entry of each chain */
    uint32_t *next;    /* [2 n_blocks] */
    uint32_t *prev;    /* [2 n_blocks]: INFLIGHT_NONE for a chain's first */
    uint64_t *key;     /* [2 n_blocks] */
    uint32_t *ns_of;   /* [2 n_blocks] */
    uint8_t *on;       /* [2 n_blocks]: in the table */
    uint32_t declared; /* blocks and claims in the table */
    /* Per namespace id below n_ns_refs: its entries and held lookups,
     * so that a namespace in use is never reclaimed (inflight_ns_busy). */
    uint32_t *ns_refs;
    uint32_t n_ns_refs;

    session_t **claim_owner; /* [n_blocks], by claim entry - n_blocks */
    uint32_t *claim_next;    /* [n_blocks]: the owner's next claim */
    uint32_t *claim_free;    /* free stack of claim entries */
    uint32_t n_claim_free;
    uint32_t claimed; /* claim entries in the table */
    /* Sessions with claims, oldest first (their leases end in this order),
     * and the timer that ends them (its own memory: it closes on its own). */
    list_t claimers; /* session_t.claim.link, oldest first */
    uv_timer_t *lease_timer;
    bool lease_armed;

    uint64_t *scratch; /* chain hashes for inflight_count */
    size_t scratch_cap;

    list_t waiters; /* inflight_wait_t.link, newest first */
    /* Waiters by key ([mask + 1] buckets), and the prefixes whose
     * declarations ended since the last wake (all_ended: too many to keep,
     * or a waiter without a key: look at every waiter). */
    inflight_wait_t **wait_bucket;
    uint64_t *ended_key;
    uint32_t *ended_ns;
    size_t n_ended, cap_ended;
    bool all_ended;
    uint64_t checks; /* looks at waiters (inflight_checks) */
};

static inline uint32_t slot_of(const inflight_t *f, uint64_t h, uint32_t ns)
{
    uint64_t x = h ^ ((uint64_t)ns * 0x9E3779B97F4A7C15ull);
    return (uint32_t)(x ^ (x >> 29)) & f->mask;
}

int inflight_new(server_t *srv, inflight_t **out)
{
    inflight_t *f = calloc(1, sizeof(*f));
    if (!f)
        return KVS_ENOMEM;
    uint32_t n = srv->num_blocks, buckets = 16;
    while (buckets < n)
        buckets *= 2;
    f->n_blocks = n;
    f->mask = buckets - 1;
    f->bucket = malloc(sizeof(uint32_t) * buckets);
    f->next = malloc(sizeof(uint32_t) * 2 * n);
    f->prev = malloc(sizeof(uint32_t) * 2 * n);
    f->key = malloc(sizeof(uint64_t) * 2 * n);
    f->ns_of = malloc(sizeof(uint32_t) * 2 * n);
    f->on = calloc(2 * (size_t)n, 1);
    f->claim_owner = calloc(n, sizeof(*f->claim_owner));
    f->claim_next = malloc(sizeof(uint32_t) * n);
    f->claim_free = malloc(sizeof(uint32_t) * n);
    f->n_ns_refs = srv->cfg.max_namespaces;
    f->ns_refs = calloc(f->n_ns_refs, sizeof(*f->ns_refs));
    f->wait_bucket = calloc(buckets, sizeof(*f->wait_bucket));
    if (!f->ns_refs || !f->wait_bucket || !f->bucket || !f->next || !f->prev || !f->key ||
        !f->ns_of || !f->on || !f->claim_owner || !f->claim_next || !f->claim_free) {
        inflight_free(f);
        return KVS_ENOMEM;
    }
    memset(f->bucket, 0xff, sizeof(uint32_t) * buckets);
    for (uint32_t i = 0; i < n; i++)
        f->claim_free[i] = 2 * n - 1 - i;
    f->n_claim_free = n;
    *out = f;
    return 0;
}

static void free_tables(inflight_t *f)
{
    free(f->bucket);
    free(f->next);
    free(f->prev);
    free(f->key);
    free(f->ns_of);
    free(f->on);
    free(f->claim_owner);
    free(f->claim_next);
    free(f->claim_free);
    free(f->ns_refs);
    free(f->scratch);
    free(f->wait_bucket);
    free(f->ended_key);
    free(f->ended_ns);
    free(f);
}

static void on_lease_close(uv_handle_t *h)
{
    free(h);
}

void inflight_free(inflight_t *f)
{
    if (!f)
        return;
    if (f->lease_timer)
        uv_close((uv_handle_t *)f->lease_timer, on_lease_close);
    free_tables(f);
}

static void ns_ref(inflight_t *f, uint32_t ns, int delta)
{
    if (ns < f->n_ns_refs)
        f->ns_refs[ns] += (uint32_t)delta;
}

static void entry_add(inflight_t *f, uint32_t b, uint32_t ns, uint64_t h)
{
    ns_ref(f, ns, 1);
    uint32_t slot = slot_of(f, h, ns);
    f->key[b] = h;
    f->ns_of[b] = ns;
    f->on[b] = 1;
    f->prev[b] = INFLIGHT_NONE;
    f->next[b] = f->bucket[slot];
    if (f->next[b] != INFLIGHT_NONE)
        f->prev[f->next[b]] = b;
    f->bucket[slot] = b;
    f->declared++;
}

static void entry_remove(inflight_t *f, uint32_t b);
static int scratch_hashes(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_blocks);

void inflight_declare(server_t *srv, uint32_t ns, const uint64_t *hashes, const uint32_t *ids,
                      size_t n)
{
    inflight_t *f = srv->inflight;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < f->n_blocks && !f->on[ids[i]])
            entry_add(f, ids[i], ns, hashes[i]);
}

uint32_t inflight_group_block(const server_t *srv, const session_t *s, uint32_t ns, uint64_t h)
{
    const inflight_t *f = srv->inflight;
    const store_t *st = srv->store;
    uint64_t bit = (uint64_t)1 << s->rank;
    for (uint32_t b = f->bucket[slot_of(f, h, ns)]; b != INFLIGHT_NONE; b = f->next[b]) {
        if (b >= f->n_blocks || f->key[b] != h || f->ns_of[b] != ns) /* claims, collisions */
            continue;
        const session_t *w = store_writer(st, b);
        if (w && w != s && (w->rank >= 0 || w->group_scheduler) && !(st->rec[b].shards & bit) &&
            !store_marked(st, b))
            return b;
    }
    return UINT32_MAX;
}

void inflight_undeclare(server_t *srv, uint32_t b)
{
    inflight_t *f = srv->inflight;
    if (!f || b >= f->n_blocks || !f->on[b])
        return;
    entry_remove(f, b);
}

static void entry_remove(inflight_t *f, uint32_t b)
{
    if (f->prev[b] != INFLIGHT_NONE)
        f->next[f->prev[b]] = f->next[b];
    else
        f->bucket[slot_of(f, f->key[b], f->ns_of[b])] = f->next[b];
    if (f->next[b] != INFLIGHT_NONE)
        f->prev[f->next[b]] = f->prev[b];
    f->on[b] = 0;
    f->declared--;
    ns_ref(f, f->ns_of[b], -1);
    if (list_empty(&f->waiters) || f->all_ended)
        return;
    if (f->n_ended == f->cap_ended) {
        size_t cap = f->cap_ended ? 2 * f->cap_ended : 16;
        uint64_t *k = realloc(f->ended_key, cap * sizeof(*k));
        if (k)
            f->ended_key = k;
        uint32_t *n = k ? realloc(f->ended_ns, cap * sizeof(*n)) : NULL;
        if (n)
            f->ended_ns = n;
        if (!k || !n) {
            f->all_ended = true; /* without memory for the list: look at all */
            return;
        }
        f->cap_ended = cap;
    }
    f->ended_key[f->n_ended] = f->key[b];
    f->ended_ns[f->n_ended++] = f->ns_of[b];
}

/* The session that declared or claimed entry b. */
static const session_t *entry_owner(const server_t *srv, uint32_t b)
{
    const inflight_t *f = srv->inflight;
    return b < f->n_blocks ? store_writer(srv->store, b) : f->claim_owner[b - f->n_blocks];
}

/* Whether a session other than s declared or claimed (ns, h). */
static bool declared_by_other(const server_t *srv, const session_t *s, uint32_t ns, uint64_t h)
{
    const inflight_t *f = srv->inflight;
    for (uint32_t b = f->bucket[slot_of(f, h, ns)]; b != INFLIGHT_NONE; b = f->next[b]) {
        const session_t *w = entry_owner(srv, b);
        if (f->key[b] == h && f->ns_of[b] == ns && w && w != s)
            return true;
    }
    return false;
}

static void on_lease(uv_timer_t *t);

/* Arms the lease timer for the oldest claimer. */
static void lease_arm(server_t *srv)
{
    inflight_t *f = srv->inflight;
    if (list_empty(&f->claimers)) {
        if (f->lease_armed)
            uv_timer_stop(f->lease_timer);
        f->lease_armed = false;
        return;
    }
    if (!f->lease_timer) {
        f->lease_timer = malloc(sizeof(*f->lease_timer));
        if (!f->lease_timer || uv_timer_init(srv->loop, f->lease_timer) != 0) {
            free(f->lease_timer);
            f->lease_timer = NULL;
            return; /* claims then end with their session's next request */
        }
        f->lease_timer->data = srv;
        uv_unref((uv_handle_t *)f->lease_timer); /* a stopping loop does not wait for it */
    }
    uint64_t now = uv_now(srv->loop),
             due = LIST_FIRST(&f->claimers, session_t, claim.link)->claim.until_ms;
    uv_timer_start(f->lease_timer, on_lease, due > now ? due - now : 0, 0);
    f->lease_armed = true;
}

/* Leases ended: those claims go, and lookups waiting for them look again. */
static void on_lease(uv_timer_t *t)
{
    server_t *srv = t->data;
    inflight_t *f = srv->inflight;
    uint64_t now = uv_now(srv->loop);
    f->lease_armed = false;
    for (session_t *s;
         (s = LIST_FIRST(&f->claimers, session_t, claim.link)) && s->claim.until_ms <= now;) {
        srv->metrics.claims_expired++;
        inflight_unclaim(srv, s);
    }
    lease_arm(srv);
    if (inflight_pending(srv))
        inflight_wake(srv, false);
}

void inflight_claim(server_t *srv, session_t *s, uint32_t ns, const uint32_t *tokens,
                    size_t n_tokens, size_t cached)
{
    inflight_t *f = srv->inflight;
    inflight_unclaim(srv, s);
    size_t n_blocks = n_tokens / srv->geo.block_tokens;
    if (cached >= n_blocks || scratch_hashes(srv, ns, tokens, n_blocks) != 0)
        return;
    size_t most = f->n_blocks / 4 ? f->n_blocks / 4 : 1;
    if (most > INFLIGHT_SESSION_MAX_CLAIMS)
        most = INFLIGHT_SESSION_MAX_CLAIMS;
    size_t end = n_blocks - cached > most ? cached + most : n_blocks;
    for (size_t i = cached; i < end && f->n_claim_free > 0; i++) {
        uint32_t c = f->claim_free[--f->n_claim_free];
        entry_add(f, c, ns, f->scratch[i]);
        f->claim_owner[c - f->n_blocks] = s;
        f->claim_next[c - f->n_blocks] = s->claim.first;
        s->claim.first = c;
        f->claimed++;
    }
    s->claim.gen++;
    if (s->claim.first == 0)
        return;
    uint32_t lease = srv->cfg.claim_lease_ms ? srv->cfg.claim_lease_ms : INFLIGHT_CLAIM_LEASE_MS;
    s->claim.until_ms = uv_now(srv->loop) + lease;
    list_push_back(&f->claimers, &s->claim.link);
    s->claim.on = true;
    if (!f->lease_armed)
        lease_arm(srv);
}

void inflight_unclaim(server_t *srv, session_t *s)
{
    inflight_t *f = srv->inflight;
    if (!f)
        return;
    if (s->claim.on) {
        list_remove(&f->claimers, &s->claim.link);
        s->claim.on = false;
    }
    while (s->claim.first != 0) {
        uint32_t c = s->claim.first;
        s->claim.first = f->claim_next[c - f->n_blocks];
        f->claim_owner[c - f->n_blocks] = NULL;
        entry_remove(f, c);
        f->claim_free[f->n_claim_free++] = c;
        f->claimed--;
    }
}

static int scratch_hashes(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_blocks)
{
    inflight_t *f = srv->inflight;
    if (f->scratch_cap < n_blocks) {
        uint64_t *h = realloc(f->scratch, sizeof(uint64_t) * n_blocks);
        if (!h)
            return KVS_ENOMEM;
        f->scratch = h;
        f->scratch_cap = n_blocks;
    }
    return radix_chain_hashes(srv->index, ns, tokens, n_blocks, f->scratch);
}

int inflight_hashes(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_blocks,
                    const uint64_t **out)
{
    int rc = scratch_hashes(srv, ns, tokens, n_blocks);
    *out = srv->inflight->scratch;
    return rc;
}

int inflight_count(server_t *srv, const session_t *s, uint32_t ns, const uint32_t *tokens,
                   size_t n_tokens, size_t cached, uint32_t *count)
{
    inflight_t *f = srv->inflight;
    *count = 0;
    if (f->declared == 0)
        return 0;
    size_t n_blocks = n_tokens / srv->geo.block_tokens;
    if (cached >= n_blocks)
        return 0;
    /* Only up to the first block past the cached prefix that is not
     * declared would do; the whole prompt is one hash per block. */
    int rc = scratch_hashes(srv, ns, tokens, n_blocks);
    if (rc != 0)
        return rc;
    uint32_t k = 0;
    for (size_t i = cached; i < n_blocks && declared_by_other(srv, s, ns, f->scratch[i]); i++)
        k++;
    *count = k;
    return 0;
}

static void key_unlink(inflight_t *f, inflight_wait_t *w)
{
    if (!w->keyed)
        return;
    if (w->kprev)
        w->kprev->knext = w->knext;
    else
        f->wait_bucket[slot_of(f, w->key, w->ns)] = w->knext;
    if (w->knext)
        w->knext->kprev = w->kprev;
    w->kprev = w->knext = NULL;
    w->keyed = false;
}

static void key_link(inflight_t *f, inflight_wait_t *w, uint64_t key)
{
    uint32_t slot = slot_of(f, key, w->ns);
    w->key = key;
    w->keyed = true;
    w->kprev = NULL;
    w->knext = f->wait_bucket[slot];
    if (w->knext)
        w->knext->kprev = w;
    f->wait_bucket[slot] = w;
}

/* Looks at w: true when its wait is over (nothing another session declared
 * follows its cached prefix), else keys it by the first block it waits
 * for. Without memory to look, over (waiting is an optimisation). */
static bool wait_check(server_t *srv, inflight_wait_t *w)
{
    inflight_t *f = srv->inflight;
    f->checks++;
    key_unlink(f, w);
    if (srv->stopping)
        return true;
    uint32_t *ids;
    size_t max_ids = w->n_tokens / srv->geo.block_tokens, cached = 0;
    if (max_ids > srv->num_blocks)
        max_ids = srv->num_blocks;
    if (session_scratch(w->s, max_ids ? max_ids : 1, &ids) != 0)
        return true;
    uint32_t k = 0;
    if (radix_match(srv->index, w->ns, w->tokens, w->n_tokens, ids, max_ids, &cached) != 0 ||
        inflight_count(srv, w->s, w->ns, w->tokens, w->n_tokens, cached, &k) != 0 || k == 0)
        return true;
    key_link(f, w, f->scratch[cached]); /* inflight_count hashed the prompt */
    return false;
}

int inflight_park(server_t *srv, session_t *s, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                  uint32_t wait_ms)
{
    inflight_t *f = srv->inflight;
    inflight_wait_t *w = calloc(1, sizeof(*w));
    uint32_t *copy = n_tokens ? malloc(sizeof(uint32_t) * n_tokens) : NULL;
    if (!w || (n_tokens && !copy)) {
        free(w);
        free(copy);
        return KVS_ENOMEM;
    }
    if (n_tokens)
        memcpy(copy, tokens, sizeof(uint32_t) * n_tokens);
    w->s = s;
    w->ns = ns;
    w->tokens = copy;
    w->n_tokens = n_tokens;
    w->start_ms = uv_now(srv->loop);
    w->deadline_ms = w->start_ms + wait_ms;
    list_push_front(&f->waiters, &w->link);
    ns_ref(f, ns, 1);
    s->wait = w;
    /* Keyed by what it waits for; one that finds nothing to wait for (it
     * cannot, right after its handler counted) is looked at by the next
     * wake. */
    if (wait_check(srv, w))
        f->all_ended = true;
    return 0;
}

void inflight_cancel(server_t *srv, session_t *s)
{
    inflight_wait_t *w = s->wait;
    if (!w)
        return;
    inflight_t *f = srv->inflight;
    key_unlink(f, w);
    list_remove(&f->waiters, &w->link);
    ns_ref(f, w->ns, -1);
    s->wait = NULL;
    free(w->tokens);
    free(w);
}

void inflight_end(server_t *srv, session_t *s)
{
    inflight_wait_t *w = s->wait;
    if (!w)
        return;
    uint64_t now = uv_now(srv->loop);
    srv->metrics.lookup_wait_ms += now - w->start_ms;
    if (now >= w->deadline_ms)
        srv->metrics.lookup_wait_timeouts++;
    else
        srv->metrics.lookup_waits++;
    inflight_cancel(srv, s);
}

void inflight_wake(server_t *srv, bool all)
{
    inflight_t *f = srv->inflight;
    if (!f)
        return;
    /* The waiters to look at: every one, or those keyed by an ended
     * prefix. Releasing a session only queues its turn: nothing here runs
     * a request, so no list changes but by these steps. */
    inflight_wait_t *check = NULL;
    if (all || f->all_ended) {
        LIST_FOR_EACH (&f->waiters, inflight_wait_t, link, w) {
            w->check_next = check;
            check = w;
        }
    } else {
        for (size_t i = 0; i < f->n_ended; i++) {
            uint64_t key = f->ended_key[i];
            uint32_t ns = f->ended_ns[i];
            for (inflight_wait_t *w = f->wait_bucket[slot_of(f, key, ns)], *next; w; w = next) {
                next = w->knext;
                if (w->key != key || w->ns != ns)
                    continue;
                key_unlink(f, w);
                w->check_next = check;
                check = w;
            }
        }
    }
    f->n_ended = 0;
    f->all_ended = false;
    for (inflight_wait_t *w = check, *next; w; w = next) {
        next = w->check_next;
        if (all || wait_check(srv, w))
            session_release(w->s); /* ends w (inflight_end) */
    }
}

void inflight_shutdown(server_t *srv)
{
    inflight_wake(srv, true);
}

bool inflight_pending(const server_t *srv)
{
    const inflight_t *f = srv->inflight;
    return f && (f->n_ended > 0 || f->all_ended);
}

uint64_t inflight_checks(const server_t *srv)
{
    return srv->inflight ? srv->inflight->checks : 0;
}

uint32_t inflight_declared(const server_t *srv)
{
    return srv->inflight ? srv->inflight->declared : 0;
}

uint32_t inflight_claimed(const server_t *srv)
{
    return srv->inflight ? srv->inflight->claimed : 0;
}

uint32_t inflight_waiting(const server_t *srv)
{
    return srv->inflight ? (uint32_t)srv->inflight->waiters.len : 0;
}

bool inflight_ns_busy(const server_t *srv, uint32_t ns)
{
    const inflight_t *f = srv->inflight;
    if (!f)
        return false;
    return ns >= f->n_ns_refs || f->ns_refs[ns] > 0;
}
