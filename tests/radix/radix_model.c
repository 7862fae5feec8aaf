/* SPDX-License-Identifier: Apache-2.0 */
#include "radix_model.h"

/* The same bound as the index (radix_internal.h; a test build lowers both). */
#ifndef RADIX_MAX_PINS
#define RADIX_MAX_PINS UINT32_MAX
#endif

#include <stdlib.h>
#include <string.h>

#include "radix.h"

int model_init_tiers(model_t *m, uint32_t bt, uint32_t max_blocks, uint32_t t2_blocks)
{
    memset(m, 0, sizeof(*m));
    m->bt = bt;
    m->max_blocks = max_blocks;
    m->t2_blocks = t2_blocks;
    m->blocks = calloc((size_t)max_blocks + t2_blocks, sizeof(*m->blocks));
    m->evicted = calloc((size_t)max_blocks + t2_blocks + 1, sizeof(*m->evicted));
    m->t2_free = calloc((size_t)t2_blocks + 1, sizeof(*m->t2_free));
    if (!m->blocks || !m->evicted || !m->t2_free)
        return -1;
    for (uint32_t i = 0; i < max_blocks + t2_blocks; i++)
        m->blocks[i].peer = -1;
    for (uint32_t i = 0; i < t2_blocks; i++)
        m->t2_free[i] = max_blocks + t2_blocks - 1 - i;
    m->t2_n_free = t2_blocks;
    return 0;
}

int model_init(model_t *m, uint32_t bt, uint32_t max_blocks)
{
    return model_init_tiers(m, bt, max_blocks, 0);
}

static uint32_t all_ids(const model_t *m)
{
    return m->max_blocks + m->t2_blocks;
}

static bool tier2(const model_t *m, int64_t id)
{
    return id >= (int64_t)m->max_blocks;
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

/* A candidate of its tier: unpinned, not being copied, and with no tier-1
 * child (tier 1) or no child at all (tier 2). Single-tier: an unpinned leaf. */
static bool is_leaf_free(const model_t *m, int64_t id)
{
    const model_block_t *b = &m->blocks[id];
    if (!b->cached || b->ref != 0 || b->peer >= 0)
        return false;
    return tier2(m, id) ? b->children == 0 : b->t1_children == 0;
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
    for (size_t k = 0; k < i; k++)
        m->ns[ns].t2_hit_tokens += tier2(m, ids[k]) ? m->bt : 0;
    m->ns[ns].lookups++;
    m->ns[ns].lookup_tokens += n_tokens;
    m->ns[ns].hit_tokens += i * m->bt;
    *n_blocks = i;
    return 0;
}

static bool evictable(const model_t *m, uint32_t id, int64_t keep, bool t2)
{
    return tier2(m, id) == t2 && is_leaf_free(m, id) && (int64_t)id != keep;
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
        if (!tier2(m, id))
            p->t1_children--;
        if (!was_free && b->parent != keep)
            rekey(m, b->parent);
    }
    if (tier2(m, id)) {
        m->ns[b->ns].t2--;
        m->ns[b->ns].t2_dropped++;
        m->ns[b->ns].cached++; /* undone below: the tier-1 count does not change */
        m->t2_free[m->t2_n_free++] = id;
    }
    m->ns[b->ns].cached--;
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
static int64_t oldest_in(const model_t *m, const bool *eligible, int64_t keep, bool t2)
{
    int64_t best = -1;
    for (uint32_t id = 0; id < all_ids(m); id++) {
        if (!evictable(m, id, keep, t2) || !eligible[m->blocks[id].ns])
            continue;
        const model_block_t *b = &m->blocks[id], *o = best >= 0 ? &m->blocks[best] : NULL;
        if (!o || b->key < o->key || (b->key == o->key && b->stamp < o->stamp))
            best = id;
    }
    return best;
}

static int64_t oldest(const model_t *m, const bool *eligible, int64_t keep)
{
    return oldest_in(m, eligible, keep, false);
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
            /* the caller's tier-1 block takes the tier-2 block's place */
            m->blocks[ids[i]] = m->blocks[c];
            m->blocks[c].cached = false;
            m->t2_free[m->t2_n_free++] = (uint32_t)c;
            for (uint32_t k = 0; k < all_ids(m); k++)
                if (m->blocks[k].cached && m->blocks[k].parent == c)
                    m->blocks[k].parent = ids[i];
            if (cur >= 0)
                m->blocks[cur].t1_children++;
            m->blocks[ids[i]].t1_children = 0;
            s->t2--;
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

/* The reservation rule for tier t2 (counts of that tier): the block that
 * goes next when for_ns needs room, or -1. */
static int64_t choose(model_t *m, uint32_t for_ns, bool t2)
{
    bool givers[MODEL_MAX_NS] = {false};
    for (uint32_t k = 0; k < m->n_ns; k++) {
        uint32_t count = t2 ? m->ns[k].t2 : m->ns[k].cached;
        givers[k] = k != for_ns && count > m->ns[k].reserve;
    }
    int64_t v = -1;
    if (for_ns != RADIX_NS_ANY &&
        (t2 ? m->ns[for_ns].t2 : m->ns[for_ns].cached) < m->ns[for_ns].reserve)
        v = oldest_in(m, givers, -1, t2);
    if (v < 0) {
        if (for_ns != RADIX_NS_ANY)
            givers[for_ns] = true;
        v = oldest_in(m, givers, -1, t2);
    }
    return v;
}

/* Gives block `from` the id `to` in the other tier; busy with peer `from`
 * when busy. */
static void move_block(model_t *m, uint32_t from, uint32_t to, bool busy)
{
    model_block_t *b = &m->blocks[from];
    bool up = tier2(m, from);
    m->blocks[to] = *b;
    m->blocks[to].peer = busy ? (int64_t)from : -1;
    b->cached = false;
    b->peer = -1;
    for (uint32_t k = 0; k < all_ids(m); k++)
        if (m->blocks[k].cached && m->blocks[k].parent == from)
            m->blocks[k].parent = to;
    model_block_t *nb = &m->blocks[to];
    if (nb->parent >= 0) {
        if (up)
            m->blocks[nb->parent].t1_children++;
        else
            m->blocks[nb->parent].t1_children--;
        rekey(m, nb->parent);
    }
    model_ns_t *s = &m->ns[nb->ns];
    if (up) {
        s->t2--;
        s->cached++;
    } else {
        s->t2++;
        s->cached--;
    }
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
        int64_t v = choose(m, for_ns, false);
        if (v < 0)
            break;
        uint32_t vns = m->blocks[v].ns;
        int cause = vns == for_ns ? CAUSE_OWN : CAUSE_OTHERS;
        if (m->t2_n_free == 0) {
            int64_t d = choose(m, vns, true);
            if (d >= 0) {
                drop(m, (uint32_t)d, -1, m->blocks[d].ns == vns ? CAUSE_OWN : CAUSE_OTHERS);
                continue;
            }
            if (m->blocks[v].children > 0)
                break;
            drop(m, (uint32_t)v, -1, cause);
            (*n_dropped)++;
            continue;
        }
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
    if (!tier2(m, id))
        m->t2_free[m->t2_n_free++] = *peer;
    rekey(m, id);
    return 0;
}
