/* SPDX-License-Identifier: Apache-2.0 */
#include "radix_model.h"

/* The same bound as the index (radix_internal.h; a test build lowers both). */
#ifndef RADIX_MAX_PINS
#define RADIX_MAX_PINS UINT32_MAX
#endif

#include <stdlib.h>
#include <string.h>

#include "radix.h"

int model_init_tiers3(model_t *m, uint32_t bt, uint32_t max_blocks, uint32_t t2_blocks,
                      uint32_t t3_blocks)
{
    memset(m, 0, sizeof(*m));
    m->bt = bt;
    m->max_blocks = max_blocks;
    m->t2_blocks = t2_blocks;
    m->t3_blocks = t3_blocks;
    size_t all = (size_t)max_blocks + t2_blocks + t3_blocks;
    m->blocks = calloc(all, sizeof(*m->blocks));
    m->evicted = calloc(all + 1, sizeof(*m->evicted));
    m->t2_free = calloc((size_t)t2_blocks + 1, sizeof(*m->t2_free));
    m->t3_free = calloc((size_t)t3_blocks + 1, sizeof(*m->t3_free));
    if (!m->blocks || !m->evicted || !m->t2_free || !m->t3_free)
        return -1;
    for (size_t i = 0; i < all; i++)
        m->blocks[i].peer = -1;
    for (uint32_t i = 0; i < t2_blocks; i++)
        m->t2_free[i] = max_blocks + t2_blocks - 1 - i;
    m->t2_n_free = t2_blocks;
    for (uint32_t i = 0; i < t3_blocks; i++)
        m->t3_free[i] = max_blocks + t2_blocks + t3_blocks - 1 - i;
    m->t3_n_free = t3_blocks;
    return 0;
}

int model_init_tiers(model_t *m, uint32_t bt, uint32_t max_blocks, uint32_t t2_blocks)
{
    return model_init_tiers3(m, bt, max_blocks, t2_blocks, 0);
}

int model_init(model_t *m, uint32_t bt, uint32_t max_blocks)
{
    return model_init_tiers(m, bt, max_blocks, 0);
}

static uint32_t all_ids(const model_t *m)
{
    return m->max_blocks + m->t2_blocks + m->t3_blocks;
}

/* Whether id is below tier 1. */
static bool tier2(const model_t *m, int64_t id)
{
    return id >= (int64_t)m->max_blocks;
}

/* The tier of id: 0 (the pool), 1 or 2. */
static int tier_of(const model_t *m, int64_t id)
{
    return id < (int64_t)m->max_blocks ? 0 : id < (int64_t)(m->max_blocks + m->t2_blocks) ? 1 : 2;
}

/* A lower id is free again: on its tier's stack. */
static void free_push(model_t *m, uint32_t id)
{
    if (tier_of(m, id) == 1)
        m->t2_free[m->t2_n_free++] = id;
    else
        m->t3_free[m->t3_n_free++] = id;
}

/* The namespace's count of blocks in tier k. */
static uint32_t *tier_count(model_ns_t *s, int k)
{
    return k == 0 ? &s->cached : k == 1 ? &s->t2 : &s->t3;
}

/* The parent's count of children in tier k (tier 3's are children only). */
static void child_tier(model_t *m, int64_t parent, int k, int by)
{
    if (parent < 0)
        return;
    if (k == 0)
        m->blocks[parent].t1_children += (uint32_t)by;
    else if (k == 1)
        m->blocks[parent].t2_children += (uint32_t)by;
}

void model_set_policy(model_t *m, int policy, uint32_t max_hits, uint32_t bonus_pct,
                      uint64_t bonus_ticks, uint32_t horizon_pct)
{
    m->horizon_pct = horizon_pct ? horizon_pct : RADIX_FREQ_HORIZON_PCT;
    m->policy = policy;
    m->max_hits = max_hits ? max_hits : RADIX_FREQ_MAX_HITS;
    m->bonus_pct = bonus_pct ? bonus_pct : RADIX_FREQ_BONUS_PCT;
    m->bonus_ticks = bonus_ticks;
}

/* The bonus per hit: fixed, or a share of the mean eviction age A while A
 * is below horizon_pct % of the mean first-reuse gap, else 0. */
static uint64_t step_now(const model_t *m)
{
    if (m->bonus_ticks)
        return m->bonus_ticks;
    uint64_t age = m->evict_age64 / 64;
    uint64_t step = age * m->bonus_pct / 100;
    if (m->horizon_pct == RADIX_FREQ_NO_HORIZON)
        return step;
    if (age >= m->reuse_gap64 / 64 * m->horizon_pct / 100)
        return 0;
    return step;
}

uint32_t model_prio(const model_t *m, uint32_t id)
{
    const model_block_t *b = &m->blocks[id];
    int p = b->hint_base > b->hint_timed ? b->hint_base : b->hint_timed;
    return p < 0 ? m->ns[b->ns].prio_default : (uint32_t)p;
}

/* The key of a block as of now: its priority above all, then last use, plus
 * under RADIX_EVICT_FREQ a bonus per hit (up to max_hits). */
static uint64_t key_now(const model_t *m, const model_block_t *b)
{
    uint64_t prio = (uint64_t)model_prio(m, (uint32_t)(b - m->blocks)) << 56;
    if (m->policy != RADIX_EVICT_FREQ)
        return prio + b->stamp;
    uint64_t step = step_now(m);
    uint32_t hits = b->hits < m->max_hits ? b->hits : m->max_hits;
    return prio + b->stamp + hits * step;
}

/* A candidate of its tier: unpinned, not being copied, and with no child
 * in its tier (so none above it either): tier 1, no tier-1 child; tier 2,
 * no tier-2 child; the lowest tier, no child at all. Single-tier: an
 * unpinned leaf. */
static bool is_leaf_free(const model_t *m, int64_t id)
{
    const model_block_t *b = &m->blocks[id];
    if (!b->cached || b->ref != 0 || b->peer >= 0)
        return false;
    int k = tier_of(m, id);
    bool lowest = k == 2 || (k == 1 && m->t3_blocks == 0);
    if (lowest)
        return b->children == 0;
    return k == 0 ? b->t1_children == 0 : b->t2_children == 0;
}

/* A block that just became an evictable leaf, or was used as one: its key
 * is taken now and kept until then again. */
static void rekey(model_t *m, int64_t id)
{
    if (id >= 0 && is_leaf_free(m, id))
        m->blocks[id].key = key_now(m, &m->blocks[id]);
}

void model_fini(model_t *m)
{
    free(m->blocks);
    free(m->evicted);
    free(m->t2_free);
    free(m->t3_free);
}

uint32_t model_ns_create(model_t *m, uint32_t quota, uint32_t reserve)
{
    m->ns[m->n_ns].quota = quota;
    m->ns[m->n_ns].reserve = reserve;
    m->ns[m->n_ns].prio_default = RADIX_PRIO_DEFAULT;
    m->ns[m->n_ns].prio_cap = RADIX_PRIO_MAX;
    return m->n_ns++;
}

/* The cached block under `parent` (-1: the namespace's root) whose tokens
 * are `block`, or -1. */
static int64_t find_child(const model_t *m, uint32_t ns, int64_t parent, const uint32_t *block)
{
    for (uint32_t id = 0; id < all_ids(m); id++) {
        const model_block_t *b = &m->blocks[id];
        if (b->cached && b->ns == ns && b->parent == parent &&
            memcmp(b->tokens, block, m->bt * sizeof(uint32_t)) == 0)
            return id;
    }
    return -1;
}

int model_lookup(model_t *m, uint32_t ns, const uint32_t *tokens, size_t n_tokens, bool pin,
                 uint32_t *ids, size_t max_ids, size_t *n_blocks)
{
    if (ns >= m->n_ns)
        return KVS_ENONS;
    size_t want = n_tokens / m->bt;
    if (want > max_ids)
        want = max_ids;
    m->tick++;
    int64_t cur = -1;
    size_t i = 0;
    uint64_t prev_stamp = 0;
    uint32_t prev_hits = 0;
    for (; i < want; i++) {
        int64_t c = find_child(m, ns, cur, tokens + i * m->bt);
        if (c < 0 || m->blocks[c].peer >= 0 || (pin && m->blocks[c].ref >= RADIX_MAX_PINS))
            break;
        model_block_t *b = &m->blocks[c];
        prev_stamp = b->stamp;
        prev_hits = b->hits;
        b->stamp = m->tick;
        b->hits++;
        if (pin && b->ref++ == 0)
            m->ns[ns].pinned++;
        ids[i] = (uint32_t)c;
        cur = c;
    }
    if (i > 0 && m->policy == RADIX_EVICT_FREQ && prev_hits == 0)
        m->reuse_gap64 += (m->tick - prev_stamp) - m->reuse_gap64 / 64;
    for (size_t k = 0; k < i; k++) /* the path's candidates were used */
        rekey(m, ids[k]);
    for (size_t k = 0; k < i; k++) {
        m->ns[ns].t2_hit_tokens += tier2(m, ids[k]) ? m->bt : 0;
        m->ns[ns].t3_hit_tokens += tier_of(m, ids[k]) == 2 ? m->bt : 0;
    }
    m->ns[ns].lookups++;
    m->ns[ns].lookup_tokens += n_tokens;
    m->ns[ns].hit_tokens += i * m->bt;
    *n_blocks = i;
    return 0;
}

static bool evictable(const model_t *m, uint32_t id, int64_t keep, int tier)
{
    return tier_of(m, id) == tier && is_leaf_free(m, id) && (int64_t)id != keep;
}

enum { CAUSE_OWN, CAUSE_OTHERS, CAUSE_QUOTA };

static void drop(model_t *m, uint32_t id, int64_t keep, int cause)
{
    model_block_t *b = &m->blocks[id];
    b->cached = false;
    m->evict_age64 += (m->tick - b->stamp) - m->evict_age64 / 64;
    if (b->parent >= 0) {
        /* The parent is keyed when it becomes a candidate of its tier (a
         * tier-1 parent may be one already, with tier-2 children left). */
        model_block_t *p = &m->blocks[b->parent];
        bool was_free = is_leaf_free(m, b->parent);
        p->children--;
        child_tier(m, b->parent, tier_of(m, id), -1);
        if (!was_free && b->parent != keep)
            rekey(m, b->parent);
    }
    int k = tier_of(m, id);
    (*tier_count(&m->ns[b->ns], k))--;
    if (k > 0) {
        if (k == 1)
            m->ns[b->ns].t2_dropped++;
        else
            m->ns[b->ns].t3_dropped++;
        free_push(m, id);
    }
    m->ns[b->ns].evicted++;
    if (cause == CAUSE_OWN)
        m->ns[b->ns].evicted_own++;
    else if (cause == CAUSE_OTHERS)
        m->ns[b->ns].evicted_others++;
    else
        m->ns[b->ns].evicted_quota++;
    m->evicted[m->n_evicted++] = id; /* either tier's id (on_evict) */
}

/* First evictable leaf in eviction order (key, then last use) among
 * namespaces allowed by `eligible`, or -1. */
static int64_t oldest_in(const model_t *m, const bool *eligible, int64_t keep, int tier)
{
    int64_t best = -1;
    for (uint32_t id = 0; id < all_ids(m); id++) {
        if (!evictable(m, id, keep, tier) || !eligible[m->blocks[id].ns])
            continue;
        const model_block_t *b = &m->blocks[id], *o = best >= 0 ? &m->blocks[best] : NULL;
        if (!o || b->key < o->key || (b->key == o->key && b->stamp < o->stamp))
            best = id;
    }
    return best;
}

static int64_t oldest(const model_t *m, const bool *eligible, int64_t keep)
{
    return oldest_in(m, eligible, keep, 0);
}

int model_insert(model_t *m, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                 const uint32_t *ids, size_t n_ids, bool pin, uint32_t *canonical, size_t *n_done)
{
    *n_done = 0;
    if (n_ids > n_tokens / m->bt)
        return KVS_EINVAL;
    for (size_t k = 0; k < n_ids; k++)
        if (ids[k] >= m->max_blocks)
            return KVS_EINVAL;
    if (ns >= m->n_ns)
        return KVS_ENONS;
    m->tick++;
    model_ns_t *s = &m->ns[ns];
    int rc = 0;
    int64_t cur = -1;
    size_t i = 0;
    for (; i < n_ids; i++) {
        int64_t c = find_child(m, ns, cur, tokens + i * m->bt);
        if (c < 0)
            break;
        if (ids[i] != c && m->blocks[ids[i]].cached) {
            rc = KVS_EEXIST;
            break;
        }
        bool upgrade = tier2(m, c);
        if (m->blocks[c].peer >= 0 || (upgrade && m->blocks[c].ref > 0) ||
            (pin && m->blocks[c].ref >= RADIX_MAX_PINS)) {
            rc = KVS_EBUSY;
            break;
        }
        if (upgrade && s->quota > 0 && s->cached >= s->quota) {
            rc = KVS_EQUOTA;
            break;
        }
        if (upgrade) {
            /* the caller's tier-1 block takes the lower block's place */
            int was = tier_of(m, c);
            m->blocks[ids[i]] = m->blocks[c];
            m->blocks[c].cached = false;
            free_push(m, (uint32_t)c);
            for (uint32_t k = 0; k < all_ids(m); k++)
                if (m->blocks[k].cached && m->blocks[k].parent == c)
                    m->blocks[k].parent = ids[i];
            child_tier(m, cur, was, -1);
            child_tier(m, cur, 0, 1);
            m->blocks[ids[i]].t1_children = 0;
            (*tier_count(s, was))--;
            s->cached++;
            s->inserted++;
            c = ids[i];
        } else {
            s->duplicates++;
        }
        model_block_t *b = &m->blocks[c];
        b->stamp = m->tick;
        if (pin && b->ref++ == 0)
            s->pinned++;
        canonical[i] = (uint32_t)c;
        rekey(m, c);
        cur = c;
    }
    if (rc) {
        *n_done = i;
        return rc;
    }
    /* Ids are checked as they are on entry, before any eviction. */
    size_t stop = i;
    while (stop < n_ids && !m->blocks[ids[stop]].cached) {
        bool repeated = false;
        for (size_t k = i; k < stop; k++)
            repeated |= ids[k] == ids[stop];
        if (repeated)
            break;
        stop++;
    }
    bool only_ns[MODEL_MAX_NS] = {false};
    only_ns[ns] = true;
    for (; i < stop; i++) {
        if (s->quota > 0) {
            while (s->cached >= s->quota) {
                int64_t v = oldest(m, only_ns, cur);
                if (v < 0 || m->blocks[v].children > 0)
                    break;
                drop(m, (uint32_t)v, cur, CAUSE_QUOTA);
            }
            if (s->cached >= s->quota) {
                rc = KVS_EQUOTA;
                break;
            }
        }
        model_block_t *b = &m->blocks[ids[i]];
        memset(b, 0, sizeof(*b));
        b->cached = true;
        b->hint_base = b->hint_timed = -1;
        b->ns = ns;
        b->parent = cur;
        memcpy(b->tokens, tokens + i * m->bt, m->bt * sizeof(uint32_t));
        b->stamp = m->tick;
        if (pin) {
            b->ref = 1;
            s->pinned++;
        }
        b->peer = -1;
        if (cur >= 0) {
            m->blocks[cur].children++;
            m->blocks[cur].t1_children++;
        }
        s->cached++;
        s->inserted++;
        canonical[i] = ids[i];
        cur = ids[i];
    }
    if (rc == 0 && stop < n_ids)
        rc = KVS_EEXIST;
    rekey(m, cur);
    *n_done = i;
    return rc;
}

int model_pin(model_t *m, uint32_t id)
{
    if (id >= all_ids(m))
        return KVS_EINVAL;
    model_block_t *b = &m->blocks[id];
    if (!b->cached)
        return KVS_ENOTFOUND;
    if (b->ref >= RADIX_MAX_PINS)
        return KVS_EBUSY;
    if (b->ref++ == 0)
        m->ns[b->ns].pinned++;
    return 0;
}

int model_unpin(model_t *m, uint32_t id)
{
    if (id >= all_ids(m))
        return KVS_EINVAL;
    model_block_t *b = &m->blocks[id];
    if (!b->cached)
        return KVS_ENOTFOUND;
    if (b->ref == 0)
        return KVS_ENOTPINNED;
    if (--b->ref == 0) {
        m->ns[b->ns].pinned--;
        rekey(m, id);
    }
    return 0;
}

int model_refcount(const model_t *m, uint32_t id, uint32_t *ref)
{
    if (id >= all_ids(m))
        return KVS_EINVAL;
    if (!m->blocks[id].cached)
        return KVS_ENOTFOUND;
    *ref = m->blocks[id].ref;
    return 0;
}

int model_hint(model_t *m, uint32_t id, uint32_t prio, uint64_t until)
{
    if (id >= all_ids(m) || prio > RADIX_PRIO_MAX)
        return KVS_EINVAL;
    model_block_t *b = &m->blocks[id];
    if (!b->cached)
        return KVS_ENOTFOUND;
    uint32_t before = model_prio(m, id);
    int p = (int)(prio < m->ns[b->ns].prio_cap ? prio : m->ns[b->ns].prio_cap);
    if (until == 0) {
        if (p > b->hint_base)
            b->hint_base = p;
    } else if (p > b->hint_timed || (p == b->hint_timed && until > b->hint_until)) {
        b->hint_timed = p;
        b->hint_until = until;
    }
    if (model_prio(m, id) != before)
        rekey(m, id);
    return 0;
}

void model_expire(model_t *m, uint64_t now)
{
    for (uint32_t id = 0; id < all_ids(m); id++) {
        model_block_t *b = &m->blocks[id];
        if (!b->cached || b->hint_timed < 0 || b->hint_until > now)
            continue;
        uint32_t before = model_prio(m, id);
        b->hint_timed = -1;
        if (model_prio(m, id) != before)
            rekey(m, id);
    }
}

int model_set_priority(model_t *m, uint32_t ns, uint32_t prio_default, uint32_t prio_cap)
{
    if (prio_default > RADIX_PRIO_MAX || prio_cap > RADIX_PRIO_MAX)
        return KVS_EINVAL;
    if (ns >= m->n_ns)
        return KVS_ENONS;
    uint32_t old_default = m->ns[ns].prio_default;
    for (uint32_t id = 0; id < all_ids(m); id++) {
        model_block_t *b = &m->blocks[id];
        if (!b->cached || b->ns != ns)
            continue;
        m->ns[ns].prio_default = old_default;
        uint32_t before = model_prio(m, id);
        if (b->hint_base > (int)prio_cap)
            b->hint_base = (int)prio_cap;
        if (b->hint_timed > (int)prio_cap)
            b->hint_timed = (int)prio_cap;
        m->ns[ns].prio_default = prio_default;
        if (model_prio(m, id) != before)
            rekey(m, id);
    }
    m->ns[ns].prio_default = prio_default;
    m->ns[ns].prio_cap = prio_cap;
    return 0;
}

int model_evict(model_t *m, uint32_t for_ns, size_t n, size_t *n_evicted)
{
    if (for_ns != RADIX_NS_ANY && for_ns >= m->n_ns)
        return KVS_ENONS;
    size_t done = 0;
    while (done < n) {
        /* Those above their reservation may give; for_ns below its own takes
         * from them first, else its leaves compete with theirs. */
        bool givers[MODEL_MAX_NS] = {false};
        for (uint32_t k = 0; k < m->n_ns; k++)
            givers[k] = k != for_ns && m->ns[k].cached > m->ns[k].reserve;
        int64_t v = -1;
        bool below = for_ns != RADIX_NS_ANY && m->ns[for_ns].cached < m->ns[for_ns].reserve;
        if (below) {
            v = oldest(m, givers, -1);
            if (v >= 0)
                m->taken_back++;
        }
        if (v < 0) {
            if (for_ns != RADIX_NS_ANY)
                givers[for_ns] = true;
            v = oldest(m, givers, -1);
        }
        if (v < 0 || m->blocks[v].children > 0)
            break;
        drop(m, (uint32_t)v, -1, m->blocks[v].ns == for_ns ? CAUSE_OWN : CAUSE_OTHERS);
        done++;
    }
    *n_evicted = done;
    return 0;
}

/* The reservation rule for a tier (counts of that tier): the block that
 * goes next when for_ns needs room, or -1. */
static int64_t choose(model_t *m, uint32_t for_ns, int tier)
{
    bool givers[MODEL_MAX_NS] = {false};
    for (uint32_t k = 0; k < m->n_ns; k++) {
        uint32_t count = *tier_count(&m->ns[k], tier);
        givers[k] = k != for_ns && count > m->ns[k].reserve;
    }
    int64_t v = -1;
    if (for_ns != RADIX_NS_ANY && *tier_count(&m->ns[for_ns], tier) < m->ns[for_ns].reserve)
        v = oldest_in(m, givers, -1, tier);
    if (v < 0) {
        if (for_ns != RADIX_NS_ANY)
            givers[for_ns] = true;
        v = oldest_in(m, givers, -1, tier);
    }
    return v;
}

/* Gives block `from` the id `to` in another tier; busy with peer `from`
 * when busy. */
static void move_block(model_t *m, uint32_t from, uint32_t to, bool busy)
{
    model_block_t *b = &m->blocks[from];
    int was = tier_of(m, from), now = tier_of(m, to);
    m->blocks[to] = *b;
    m->blocks[to].peer = busy ? (int64_t)from : -1;
    b->cached = false;
    b->peer = -1;
    for (uint32_t k = 0; k < all_ids(m); k++)
        if (m->blocks[k].cached && m->blocks[k].parent == from)
            m->blocks[k].parent = to;
    model_block_t *nb = &m->blocks[to];
    if (nb->parent >= 0) {
        child_tier(m, nb->parent, was, -1);
        child_tier(m, nb->parent, now, 1);
        rekey(m, nb->parent);
    }
    model_ns_t *s = &m->ns[nb->ns];
    (*tier_count(s, was))--;
    (*tier_count(s, now))++;
}

/* Whether tier-k candidate v has nothing below it: a leaf that may drop. */
static bool leaf(const model_t *m, int64_t v)
{
    return m->blocks[v].children == 0;
}

/* radix.h, radix_demote: makes room in lower tier k (1 or 2) for a block
 * of for_ns: 1 when a free id is there now (leaves dropped for it), 0 when
 * a move one tier down started (moves[(*n_moved)++]), -1 when nothing may
 * go. */
static int make_room(model_t *m, int k, uint32_t for_ns, radix_move_t *moves, size_t *n_moved)
{
    uint32_t *n_free = k == 1 ? &m->t2_n_free : &m->t3_n_free;
    bool below_exists = k == 1 && m->t3_blocks > 0;
    while (*n_free == 0) {
        int64_t d = choose(m, for_ns, k);
        if (d < 0)
            return -1;
        uint32_t dns = m->blocks[d].ns;
        int cause = dns == for_ns ? CAUSE_OWN : CAUSE_OTHERS;
        if (below_exists) {
            int r = make_room(m, k + 1, dns, moves, n_moved);
            if (r == 0)
                return 0;
            if (r == 1) {
                d = choose(m, for_ns, k);
                if (d < 0)
                    return -1;
                uint32_t to = m->t3_free[--m->t3_n_free];
                move_block(m, (uint32_t)d, to, true);
                m->ns[m->blocks[to].ns].demoted3++;
                moves[*n_moved] =
                    (radix_move_t){.from = (uint32_t)d, .to = to, .ns = m->blocks[to].ns};
                (*n_moved)++;
                return 0;
            }
            if (!leaf(m, d))
                return -1;
        }
        drop(m, (uint32_t)d, -1, cause);
    }
    return 1;
}

int model_demote(model_t *m, uint32_t for_ns, size_t n, radix_move_t *moves, size_t *n_moved,
                 size_t *n_dropped)
{
    *n_moved = *n_dropped = 0;
    if (m->t2_blocks == 0)
        return KVS_EINVAL;
    if (for_ns != RADIX_NS_ANY && for_ns >= m->n_ns)
        return KVS_ENONS;
    while (*n_moved + *n_dropped < n) {
        int64_t v = choose(m, for_ns, 0);
        if (v < 0)
            break;
        int room = make_room(m, 1, m->blocks[v].ns, moves, n_moved);
        if (room == 0)
            continue;
        if (room < 0) {
            if (m->blocks[v].children > 0)
                break;
            drop(m, (uint32_t)v, -1, m->blocks[v].ns == for_ns ? CAUSE_OWN : CAUSE_OTHERS);
            (*n_dropped)++;
            continue;
        }
        v = choose(m, for_ns, 0);
        if (v < 0)
            break;
        uint32_t vns = m->blocks[v].ns;
        uint32_t to = m->t2_free[--m->t2_n_free];
        move_block(m, (uint32_t)v, to, true);
        m->ns[vns].demoted++;
        moves[*n_moved].from = (uint32_t)v;
        moves[*n_moved].to = to;
        moves[*n_moved].ns = vns;
        (*n_moved)++;
    }
    return 0;
}

int model_promote(model_t *m, uint32_t t2_id, uint32_t id)
{
    if (m->t2_blocks == 0 || !tier2(m, t2_id) || t2_id >= all_ids(m) || id >= m->max_blocks)
        return KVS_EINVAL;
    model_block_t *b = &m->blocks[t2_id];
    if (!b->cached)
        return KVS_ENOTFOUND;
    if (m->blocks[id].cached)
        return KVS_EEXIST;
    if (b->peer >= 0 || b->ref > 1)
        return KVS_EBUSY;
    if (b->parent >= 0 && tier2(m, b->parent))
        return KVS_EINVAL;
    /* the first lower block after its tier-1 parent: no tier-2 block
     * between (a tier-3 block's parent in tier 2 was refused above) */
    move_block(m, t2_id, id, true);
    m->ns[m->blocks[id].ns].promoted++;
    return 0;
}

int model_copy_done(model_t *m, uint32_t id, uint32_t *peer)
{
    if (m->t2_blocks == 0 || id >= all_ids(m))
        return KVS_EINVAL;
    model_block_t *b = &m->blocks[id];
    if (!b->cached || b->peer < 0)
        return KVS_ENOTFOUND;
    *peer = (uint32_t)b->peer;
    b->peer = -1;
    if (tier2(m, *peer)) /* an old lower id is free again */
        free_push(m, *peer);
    rekey(m, id);
    return 0;
}
