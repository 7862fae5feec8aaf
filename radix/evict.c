/* SPDX-License-Identifier: Apache-2.0 */
/*
 * evict.c: recency, eviction order, whose block makes room, and
 * retention hints.
 *
 * Every lookup and insert takes the next tick of the tree; each block it
 * matches or handles gets that tick as its stamp (a walk through a whole node
 * writes the node's full_stamp once instead of every record's). Since these
 * walks always start at a root, a block's stamp is never older than any
 * descendant's.
 * A block is evictable when it is cached, unpinned and has no children (a
 * leaf block, always the last block of a childless node). Blocks that are
 * evictable leaves are kept per namespace in two structures:
 *
 *   lru list: leaves ordered by stamp, oldest at the head. A lookup or insert
 *             that touches a leaf moves it to the tail (its stamp is now the
 *             newest), O(1).
 *   heap:     a min-heap on stamp for leaves that become evictable with an
 *             older stamp (an unpin, or a parent whose last child went) and
 *             fit neither end of the list. Entries are dropped lazily: a node
 *             records the sequence number of its live entry.
 *
 * Both are ordered by each leaf's key (radix__queue_key, taken when it is queued;
 * see radix.h, Eviction order), then stamp. Under LRU the key is the stamp,
 * so a touched leaf always goes to the list's tail; under FREQ it is the
 * stamp plus a bonus per hit, so a touched leaf goes to the tail only when
 * its key is the largest, and to the heap otherwise.
 *
 * Eviction takes the first of the list head and the heap top, so it is exact
 * order on (key, stamp). Stamps of evictable leaves are all distinct (one
 * walk touches one path, which holds one leaf), so the order is total.
 *
 * Hits per block (FREQ) are counted the way stamps are written: a lookup
 * through a whole node adds one to the node's full_hits, a partial one adds
 * to each matched record's own count; a record's hits are the sum, and a new
 * record appended to a node starts its own count at -full_hits (mod 2^32).
 */
#include "radix_internal.h"

#include <stdint.h>
#include <stdlib.h>

/* ---- eviction queues ----------------------------------------------------- */

/* Bonus per hit under RADIX_EVICT_FREQ, in ticks: a share of the eviction
 * age while that age is below the horizon (horizon_pct % of the mean
 * first-reuse gap), else none. Past about three reuse gaps a block that was
 * hit is no likelier to come back than one that was not (measured on the
 * Mooncake trace), so a large pool gains nothing from the bonus and loses
 * recent blocks to it; there the order becomes LRU's. */
static uint64_t freq_step(const radix_tree_t *t)
{
    if (t->cfg.freq_bonus_ticks > 0)
        return t->cfg.freq_bonus_ticks;
    uint64_t age = t->evict_age64 / 64;
    uint64_t step = age * t->cfg.freq_bonus_pct / 100;
    if (t->cfg.freq_horizon_pct == RADIX_FREQ_NO_HORIZON)
        return step;
    uint64_t horizon = t->reuse_gap64 / 64 * t->cfg.freq_horizon_pct / 100;
    return age < horizon ? step : 0;
}

/* The key a candidate is queued with: its retention priority above
 * everything (RADIX_PRIO_SHIFT), then its last use, plus under
 * RADIX_EVICT_FREQ a bonus for each hit up to freq_max_hits. Fixed while it
 * stays queued. */
#define RADIX_PRIO_SHIFT 56
uint64_t radix__queue_key(const radix_tree_t *t, const radix_node_t *n, int q)
{
    uint32_t pos = cand_pos(n, q);
    uint32_t id = *rec_id(n, pos);
    uint64_t key = rec_stamp(n, pos) + ((uint64_t)block_prio(t, id, n->ns) << RADIX_PRIO_SHIFT);
    if (t->cfg.policy == RADIX_EVICT_FREQ) {
        uint32_t hits = rec_hits(n, pos);
        if (hits > t->cfg.freq_max_hits)
            hits = t->cfg.freq_max_hits;
        key += hits * freq_step(t);
    }
    return key;
}

/* Whether n's candidate for queue q may go: unpinned, not being copied, and
 * with no block of its tier below it (so the tiers stay in order towards
 * the root; in the lowest tier, nothing below it at all). Single-tier, Q_T1
 * is "an unpinned leaf", as always. */
bool radix__queueable(const radix_tree_t *t, const radix_node_t *n, int q)
{
    if (is_root(n) || !has_cand(n, q))
        return false;
    uint32_t pos = cand_pos(n, q);
    /* The candidate ends the node (no lower tier after it): a child may
     * start in its tier. */
    if (pos == last_pos(n) && n->tchildren[q] > 0)
        return false;
    if (q == Q_T1 && n == t->guard && pos == t->guard_pos)
        return false;
    return *rec_ref(n, pos) == 0 && !is_busy(t, *rec_id(n, pos));
}

static void list_unlink(radix_queue_t *Q, radix_node_t *n, int q)
{
    radix_qlink_t *l = &n->q[q];
    if (l->prev)
        l->prev->q[q].next = l->next;
    else
        Q->head = l->next;
    if (l->next)
        l->next->q[q].prev = l->prev;
    else
        Q->tail = l->prev;
    l->prev = l->next = NULL;
}

static void list_append(radix_queue_t *Q, radix_node_t *n, int q)
{
    n->q[q].next = NULL;
    n->q[q].prev = Q->tail;
    if (Q->tail)
        Q->tail->q[q].next = n;
    else
        Q->head = n;
    Q->tail = n;
    n->q[q].where = WHERE_LIST;
}

static void list_prepend(radix_queue_t *Q, radix_node_t *n, int q)
{
    n->q[q].prev = NULL;
    n->q[q].next = Q->head;
    if (Q->head)
        Q->head->q[q].prev = n;
    else
        Q->tail = n;
    Q->head = n;
    n->q[q].where = WHERE_LIST;
}

/* The node an entry of queue q stands for, or NULL when the entry is stale. */
radix_node_t *radix__heap_entry_node(const radix_tree_t *t, const radix_heap_entry_t *e, int q)
{
    radix_node_t *n = t->by_node[e->id];
    if (!n || n == &radix__mark || n->q[q].where != WHERE_HEAP || n->q[q].seq != e->seq ||
        !has_cand(n, q) || t->by_pos[e->id] != cand_pos(n, q))
        return NULL;
    return cand_stamp(n, q) == e->stamp && n->q[q].key == e->key ? n : NULL;
}

static void heap_sift_down(radix_queue_t *Q, size_t i)
{
    radix_heap_entry_t *h = Q->heap;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < Q->heap_len && entry_before(&h[l], &h[m]))
            m = l;
        if (l + 1 < Q->heap_len && entry_before(&h[l + 1], &h[m]))
            m = l + 1;
        if (m == i)
            return;
        radix_heap_entry_t tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
}

static void heap_sift_up(radix_queue_t *Q, size_t i)
{
    radix_heap_entry_t *h = Q->heap;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!entry_before(&h[i], &h[p]))
            return;
        radix_heap_entry_t tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
}

static void heap_pop(radix_queue_t *Q)
{
    Q->heap[0] = Q->heap[--Q->heap_len];
    heap_sift_down(Q, 0);
}

/* Drops stale entries and rebuilds the heap: linear, and paid for by the
 * pushes that made the entries stale. */
static void heap_compact(const radix_tree_t *t, radix_queue_t *Q, int q)
{
    size_t k = 0;
    for (size_t i = 0; i < Q->heap_len; i++)
        if (radix__heap_entry_node(t, &Q->heap[i], q))
            Q->heap[k++] = Q->heap[i];
    Q->heap_len = k;
    for (size_t i = k / 2; i-- > 0;)
        heap_sift_down(Q, i);
}

/* The heap never needs more than 2 x nodes + 34 entries (compaction keeps
 * stale entries below live + 33), so reserving that when nodes are created
 * means pushes, which happen in unpin, eviction and copies, never allocate.
 * The tier-2 queue exists only when there is a tier 2. */
int radix__heap_reserve(const radix_tree_t *t, radix_ns_t *ns, size_t nodes)
{
    size_t need = 2 * nodes + 34;
    for (int q = 0; q < (int)t->n_tiers; q++) {
        radix_queue_t *Q = &ns->q[q];
        if (Q->heap_cap >= need)
            continue;
        size_t ncap = Q->heap_cap ? Q->heap_cap : 64;
        while (ncap < need)
            ncap *= 2;
        radix_heap_entry_t *h = t_realloc(t, Q->heap, ncap * sizeof(*h));
        if (!h)
            return KVS_ENOMEM;
        Q->heap = h;
        Q->heap_cap = ncap;
    }
    return 0;
}

static void heap_push(radix_tree_t *t, radix_queue_t *Q, radix_node_t *n, int q)
{
    if (Q->heap_len > 2 * Q->heap_live + 32 || Q->heap_len == Q->heap_cap)
        heap_compact(t, Q, q);
    uint32_t pos = cand_pos(n, q);
    n->q[q].seq = ++t->heap_seq;
    n->q[q].where = WHERE_HEAP;
    Q->heap_live++;
    Q->heap[Q->heap_len].key = n->q[q].key;
    Q->heap[Q->heap_len].stamp = rec_stamp(n, pos);
    Q->heap[Q->heap_len].id = *rec_id(n, pos);
    Q->heap[Q->heap_len].seq = n->q[q].seq;
    Q->heap_len++;
    heap_sift_up(Q, Q->heap_len - 1);
}

/* Takes n out of queue q (it was pinned, got a child, ...). */
void radix__unqueue(radix_tree_t *t, radix_node_t *n, int q)
{
    radix_queue_t *Q = &t->ns[n->ns]->q[q];
    if (n->q[q].where == WHERE_LIST)
        list_unlink(Q, n, q);
    else if (n->q[q].where == WHERE_HEAP)
        Q->heap_live--;
    n->q[q].where = WHERE_NONE;
}

void radix__make_unevictable(radix_tree_t *t, radix_node_t *n)
{
    for (int q = 0; q < RADIX_TIERS; q++)
        radix__unqueue(t, n, q);
}

/* Queues a candidate that is in no queue, with its key as of now, at its
 * place in q's order: an end of the list when it fits there (always the tail
 * for a block just used under LRU), else the heap. */
static void expose(radix_tree_t *t, radix_node_t *n, int q)
{
    radix_queue_t *Q = &t->ns[n->ns]->q[q];
    n->q[q].key = radix__queue_key(t, n, q);
    if (!Q->tail || goes_before(Q->tail, n, q))
        list_append(Q, n, q);
    else if (goes_before(n, Q->head, q))
        list_prepend(Q, n, q);
    else
        heap_push(t, Q, n, q);
}

/* Puts n where it belongs in queue q after its blocks, tiers or children
 * changed. touched: its candidate was just stamped with the newest tick. */
void radix__refresh_q(radix_tree_t *t, radix_node_t *n, int q, bool touched)
{
    if (!radix__queueable(t, n, q)) {
        radix__unqueue(t, n, q);
    } else if (touched) {
        /* Under LRU with one priority the newest goes to the tail; expose
         * finds that with one comparison. */
        radix__unqueue(t, n, q);
        expose(t, n, q);
    } else if (n->q[q].where == WHERE_NONE) {
        expose(t, n, q);
    }
}

/* After a walk stamped n's blocks up to record pos: its tier-1 candidate was
 * touched if it lies there, its tier-2 candidate if pos is its last block. */
void radix__refresh_at(radix_tree_t *t, radix_node_t *n, uint32_t pos)
{
    if (is_root(n))
        return;
    for (int q = 0; q < (int)t->n_tiers; q++)
        radix__refresh_q(t, n, q, has_cand(n, q) && cand_pos(n, q) <= pos);
}

/* The first candidate of the namespace's queue q, or NULL. */
radix_node_t *radix__candidate(radix_tree_t *t, radix_ns_t *ns, int q)
{
    radix_queue_t *Q = &ns->q[q];
    radix_node_t *h = NULL;
    while (Q->heap_len > 0 && !(h = radix__heap_entry_node(t, &Q->heap[0], q)))
        heap_pop(Q);
    radix_node_t *l = Q->head;
    if (!l)
        return h;
    if (!h)
        return l;
    return goes_before(h, l, q) ? h : l;
}

/* Drops n's last block, a candidate of queue q with nothing below it (a
 * tier-1 leaf, or a tier-2 leaf), and hands its id back: a tier-1 id to the
 * owner through on_evict, a tier-2 id to the tree's free tier-2 slots. */
void radix__evict_leaf(radix_tree_t *t, radix_node_t *n, int q, evict_cause_t cause)
{
    radix_ns_t *ns = t->ns[n->ns];
    radix__make_unevictable(t, n);
    /* The moving average (weight 1/64) sets the FREQ bonus; updated before
     * the parent is queued, so the parent's key already sees it. */
    t->evict_age64 += (t->tick - rec_stamp(n, last_pos(n))) - t->evict_age64 / 64;
    uint32_t id = *rec_id(n, last_pos(n));
    if (t->cfg.on_evict_tokens)
        t->cfg.on_evict_tokens(t->cfg.evict_ctx, id, n->ns, rec_tokens(t, n, last_pos(n)));
    t->by_node[id] = NULL;
    ns->st.cached_by_band[t->band_of[id]]--;
    ns->st.evicted_by_band[t->band_of[id]]++;
    if (t->hint_timed[id] != RADIX_PRIO_NONE)
        t->exp_live--;
    t->hint_base[id] = t->hint_timed[id] = RADIX_PRIO_NONE;
    ns->st.evicted_blocks++;
    if (cause == EVICT_OWN)
        ns->st.evicted_own++;
    else if (cause == EVICT_OTHERS)
        ns->st.evicted_others++;
    else
        ns->st.evicted_quota++;
    (void)q;
    uint32_t tier = tier_of(t, id);
    (*radix__tier_count(ns, tier))--;
    n->tlen[tier]--;
    if (tier == 0) {
        t->cached--;
    } else {
        if (tier == 1)
            ns->st.tier2_dropped++;
        else
            ns->st.tier3_dropped++;
        t->lower[tier].cached--;
        lower_push(t, id);
    }
    if (n->len == 1) {
        radix_node_t *parent = n->parent;
        radix__slot_remove(t, n);
        ns->n_nodes--;
        radix__node_free(t, n);
        parent->n_children--;
        parent->tchildren[tier]--;
        refresh(t, parent, false);
    } else {
        n->len--;
        refresh(t, n, false);
    }
    if (t->cfg.on_evict)
        t->cfg.on_evict(t->cfg.evict_ctx, id);
}

/* ---- eviction -------------------------------------------------------------- */

/* The reservation rule (radix.h, radix_evict): the leaf that goes next when
 * namespace for_ns (RADIX_NS_ANY: none) needs a block, or NULL. Namespaces
 * above their reservation may give, first leaf in eviction order among them;
 * for_ns's own first leaf competes with theirs, unless for_ns is below its
 * reservation and one of them has a leaf to give. One look at each
 * namespace's first leaf (radix__candidate()), never a scan of leaves.
 *
 * This is the one place that decides whose block makes room. A host tier
 * that demotes blocks instead of dropping them is to take its victims from
 * here too, and a retention priority orders leaves inside each namespace's
 * queue (radix__candidate()), within what this choice allows: neither may bypass
 * it, or a reservation stops guaranteeing capacity. */
static uint32_t tier_count(const radix_ns_t *ns, int q)
{
    return *radix__tier_count((radix_ns_t *)ns, (uint32_t)q);
}

radix_node_t *radix__evict_choice(radix_tree_t *t, uint32_t for_ns, int q)
{
    radix_node_t *best = NULL;
    for (uint32_t k = 0; k < t->n_ns; k++) {
        radix_ns_t *ns = t->ns[k];
        if (!ns || k == for_ns || tier_count(ns, q) <= ns->st.reserve)
            continue;
        radix_node_t *v = radix__candidate(t, ns, q);
        if (v && (!best || goes_before(v, best, q)))
            best = v;
    }
    if (for_ns == RADIX_NS_ANY)
        return best;
    radix_ns_t *own = t->ns[for_ns];
    if (best && tier_count(own, q) < own->st.reserve)
        return best; /* take back what it lent before evicting itself */
    radix_node_t *v = radix__candidate(t, own, q);
    if (v && (!best || goes_before(v, best, q)))
        best = v;
    return best;
}

int radix_evict(radix_tree_t *t, uint32_t for_ns, size_t n, size_t *n_evicted)
{
    if (!t || !n_evicted)
        return KVS_EINVAL;
    if (for_ns != RADIX_NS_ANY && !ns_live(t, for_ns))
        return KVS_ENONS;
    size_t done = 0;
    while (done < n) {
        radix_node_t *v = radix__evict_choice(t, for_ns, Q_T1);
        if (!v || v->n_children > 0 || v->tlen[0] < v->len)
            break; /* nothing, or a block that only demotion can move */
        radix__evict_leaf(t, v, Q_T1, v->ns == for_ns ? EVICT_OWN : EVICT_OTHERS);
        done++;
    }
    *n_evicted = done;
    return 0;
}

/* A clear is not a choice of whose block makes room: the namespace asks for
 * all of its unpinned blocks to go, so radix__evict_choice (and the reservations
 * it guards) has nothing to decide. Leaves go in the namespace's own order,
 * each parent after its last child: tier 2's first (they hang below tier
 * 1), then tier 1's, stopping at a tier-1 candidate that still has tier-2
 * blocks below it (pinned or being copied). Each drop leaves the index
 * whole, so the work can stop after any block and resume later: a step
 * starts again from the namespace's candidates, and finds what the last
 * one left. */
int radix_ns_clear_step(radix_tree_t *t, uint32_t ns, size_t max, size_t *n_dropped)
{
    if (!t || !n_dropped)
        return KVS_EINVAL;
    if (!ns_live(t, ns))
        return KVS_ENONS;
    size_t done = 0;
    radix_node_t *v;
    for (int q = (int)t->n_tiers - 1; q >= 0 && done < max; q--) {
        while (done < max && (v = radix__candidate(t, t->ns[ns], q)) != NULL &&
               v->n_children == 0 && cand_pos(v, q) == last_pos(v)) {
            radix__evict_leaf(t, v, q, EVICT_OWN);
            done++;
        }
    }
    *n_dropped = done;
    return 0;
}

int radix_ns_clear(radix_tree_t *t, uint32_t ns, size_t *n_dropped)
{
    return radix_ns_clear_step(t, ns, SIZE_MAX, n_dropped);
}

/* ---- retention hints -------------------------------------------------------- */

/* After block id's hints changed from giving `before`: its band count, and
 * its place in eviction order when it is a queued leaf (requeued with its
 * new key: O(1) at a list end, else O(log leaves)). */
static void prio_changed(radix_tree_t *t, uint32_t id, uint32_t before)
{
    radix_node_t *n = t->by_node[id];
    uint32_t now = block_prio(t, id, n->ns);
    if (now == before)
        return;
    radix_ns_t *ns = t->ns[n->ns];
    uint32_t band = prio_band(now);
    if (band != t->band_of[id]) {
        ns->st.cached_by_band[t->band_of[id]]--;
        ns->st.cached_by_band[band]++;
        t->band_of[id] = (uint8_t)band;
    }
    for (int q = 0; q < RADIX_TIERS; q++) {
        if (n->q[q].where != WHERE_NONE && cand_pos(n, q) == t->by_pos[id]) {
            radix__unqueue(t, n, q);
            expose(t, n, q);
        }
    }
}

/* The expiry queue keeps each block's live timed hint once: entries whose
 * hint was replaced, ended or evicted, and repeats of a live one, go, and
 * the heap is rebuilt (linear, paid for by the pushes since the last
 * compaction, which at least doubled it). Bit 63 of hint_until marks a
 * block already kept during the pass (radix_hint refuses such ends). Then
 * the array shrinks when mostly empty, so memory follows the live hints,
 * not their history. */
static void expiry_compact(radix_tree_t *t)
{
    const uint64_t seen = 1ull << 63;
    size_t k = 0;
    for (size_t i = 0; i < t->exp_len; i++) {
        radix_expiry_t e = t->exp[i];
        radix_node_t *n = t->by_node[e.id];
        if (!n || n == &radix__mark || t->hint_timed[e.id] == RADIX_PRIO_NONE ||
            t->hint_until[e.id] != e.until)
            continue; /* stale, or (bit 63 set) a repeat of a kept one */
        t->hint_until[e.id] |= seen;
        t->exp[k++] = e;
    }
    t->exp_len = k;
    for (size_t i = 0; i < k; i++)
        t->hint_until[t->exp[i].id] &= ~seen;
    for (size_t i = k / 2; i-- > 0;) { /* heapify: sift each parent down */
        size_t j = i;
        radix_expiry_t v = t->exp[j];
        for (;;) {
            size_t c = 2 * j + 1;
            if (c >= k)
                break;
            if (c + 1 < k && t->exp[c + 1].until < t->exp[c].until)
                c++;
            if (t->exp[c].until >= v.until)
                break;
            t->exp[j] = t->exp[c];
            j = c;
        }
        t->exp[j] = v;
    }
    if (t->exp_cap > 64 && 4 * k < t->exp_cap) {
        size_t ncap = 2 * k > 64 ? 2 * k : 64;
        radix_expiry_t *e = t_realloc(t, t->exp, ncap * sizeof(*e));
        if (e) {
            t->exp = e;
            t->exp_cap = ncap;
        }
    }
}

static int expiry_push(radix_tree_t *t, uint64_t until, uint32_t id)
{
    /* Stale entries never outnumber the live ones by more than 64. */
    if (t->exp_len >= 2 * t->exp_live + 64)
        expiry_compact(t);
    if (t->exp_len == t->exp_cap) {
        size_t ncap = t->exp_cap ? 2 * t->exp_cap : 64;
        radix_expiry_t *e = t_realloc(t, t->exp, ncap * sizeof(*e));
        if (!e)
            return KVS_ENOMEM;
        t->exp = e;
        t->exp_cap = ncap;
    }
    size_t i = t->exp_len++;
    while (i > 0 && t->exp[(i - 1) / 2].until > until) {
        t->exp[i] = t->exp[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    t->exp[i].until = until;
    t->exp[i].id = id;
    return 0;
}

static void expiry_pop(radix_tree_t *t)
{
    radix_expiry_t last = t->exp[--t->exp_len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= t->exp_len)
            break;
        if (c + 1 < t->exp_len && t->exp[c + 1].until < t->exp[c].until)
            c++;
        if (t->exp[c].until >= last.until)
            break;
        t->exp[i] = t->exp[c];
        i = c;
    }
    if (t->exp_len > 0)
        t->exp[i] = last;
}

int radix_hint(radix_tree_t *t, uint32_t block_id, uint32_t prio, uint64_t until)
{
    if (!t || block_id >= t->id_end || prio > RADIX_PRIO_MAX || until >= (1ull << 63))
        return KVS_EINVAL;
    radix_node_t *n = t->by_node[block_id];
    if (!n || n == &radix__mark)
        return KVS_ENOTFOUND;
    radix_ns_t *ns = t->ns[n->ns];
    if (prio > ns->prio_cap)
        prio = ns->prio_cap;
    uint32_t before = block_prio(t, block_id, n->ns);
    if (until == 0) {
        if (t->hint_base[block_id] == RADIX_PRIO_NONE || prio > t->hint_base[block_id])
            t->hint_base[block_id] = (uint8_t)prio;
    } else {
        uint32_t cur = t->hint_timed[block_id];
        if (cur != RADIX_PRIO_NONE &&
            (prio < cur || (prio == cur && until <= t->hint_until[block_id])))
            return 0; /* a higher (or as high and longer) timed hint holds */
        if (cur == RADIX_PRIO_NONE && t->exp_max && t->exp_live >= t->exp_max)
            return KVS_ELIMIT; /* a block's own hint may change; a new one waits */
        /* The queue's entry for this end stays good when only the priority
         * rises; otherwise one more entry, and the old one goes stale. */
        if (cur == RADIX_PRIO_NONE || until != t->hint_until[block_id]) {
            int prc = expiry_push(t, until, block_id);
            if (prc != 0)
                return prc;
        }
        if (cur == RADIX_PRIO_NONE)
            t->exp_live++;
        t->hint_timed[block_id] = (uint8_t)prio;
        t->hint_until[block_id] = until;
    }
    prio_changed(t, block_id, before);
    return 0;
}

int radix_expire_hints(radix_tree_t *t, uint64_t now, size_t *n_expired)
{
    if (!t)
        return KVS_EINVAL;
    size_t done = 0;
    while (t->exp_len > 0 && t->exp[0].until <= now) {
        radix_expiry_t e = t->exp[0];
        expiry_pop(t);
        radix_node_t *n = t->by_node[e.id];
        /* Stale: the block was evicted, or its timed hint replaced. */
        if (!n || n == &radix__mark || t->hint_timed[e.id] == RADIX_PRIO_NONE ||
            t->hint_until[e.id] != e.until)
            continue;
        uint32_t before = block_prio(t, e.id, n->ns);
        t->hint_timed[e.id] = RADIX_PRIO_NONE;
        t->hint_until[e.id] = 0;
        t->exp_live--;
        prio_changed(t, e.id, before);
        done++;
    }
    if (t->exp_cap > 64 && 4 * t->exp_len < t->exp_cap)
        expiry_compact(t); /* give back what a burst of hints took */
    if (n_expired)
        *n_expired = done;
    return 0;
}

int radix_hint_limit(radix_tree_t *t, size_t max_timed)
{
    if (!t)
        return KVS_EINVAL;
    t->exp_max = max_timed;
    return 0;
}

size_t radix_hint_queue_len(const radix_tree_t *t)
{
    return t ? t->exp_len : 0;
}

size_t radix_hint_timed(const radix_tree_t *t)
{
    return t ? t->exp_live : 0;
}

int radix_block_priority(const radix_tree_t *t, uint32_t block_id, uint32_t *prio)
{
    if (!t || !prio || block_id >= t->id_end)
        return KVS_EINVAL;
    const radix_node_t *n = t->by_node[block_id];
    if (!n || n == &radix__mark)
        return KVS_ENOTFOUND;
    *prio = block_prio(t, block_id, n->ns);
    return 0;
}

int radix_ns_set_priority(radix_tree_t *t, uint32_t ns_id, uint32_t prio_default, uint32_t prio_cap)
{
    if (!t || prio_default > RADIX_PRIO_MAX || prio_cap > RADIX_PRIO_MAX)
        return KVS_EINVAL;
    if (!ns_live(t, ns_id))
        return KVS_ENONS;
    radix_ns_t *ns = t->ns[ns_id];
    if (ns->prio_default == prio_default && ns->prio_cap == prio_cap)
        return 0;
    if (ns->st.cached_blocks == 0 && ns->st.tier2_blocks == 0 && ns->st.tier3_blocks == 0) {
        /* No block to look at (a namespace just made): O(1). */
        ns->prio_default = (uint8_t)prio_default;
        ns->prio_cap = (uint8_t)prio_cap;
        ns->st.prio_default = prio_default;
        ns->st.prio_cap = prio_cap;
        return 0;
    }
    /* Rare (configuration): every block of the namespace is looked at, and
     * hints above the new cap come down to it. */
    uint32_t old_default = ns->prio_default;
    for (uint32_t id = 0; id < t->id_end; id++) {
        radix_node_t *n = t->by_node[id];
        if (!n || n == &radix__mark || n->ns != ns_id)
            continue;
        ns->prio_default = (uint8_t)old_default;
        uint32_t before = block_prio(t, id, ns_id);
        if (t->hint_base[id] != RADIX_PRIO_NONE && t->hint_base[id] > prio_cap)
            t->hint_base[id] = (uint8_t)prio_cap;
        if (t->hint_timed[id] != RADIX_PRIO_NONE && t->hint_timed[id] > prio_cap)
            t->hint_timed[id] = (uint8_t)prio_cap;
        ns->prio_default = (uint8_t)prio_default;
        prio_changed(t, id, before);
    }
    ns->prio_default = (uint8_t)prio_default;
    ns->prio_cap = (uint8_t)prio_cap;
    ns->st.prio_default = prio_default;
    ns->st.prio_cap = prio_cap;
    return 0;
}

/* Retention hints and band go with a block to its new id (the band counts
 * both tiers). A timed hint's end is queued again under the new id; when
 * that cannot be (no memory) the timed hint ends now. */
void radix__move_hints(radix_tree_t *t, uint32_t old_id, uint32_t new_id)
{
    radix_node_t *n = t->by_node[new_id];
    t->hint_base[new_id] = t->hint_base[old_id];
    t->hint_timed[new_id] = t->hint_timed[old_id];
    t->hint_until[new_id] = t->hint_until[old_id];
    t->band_of[new_id] = t->band_of[old_id];
    t->hint_base[old_id] = t->hint_timed[old_id] = RADIX_PRIO_NONE;
    t->hint_until[old_id] = 0;
    if (t->hint_timed[new_id] != RADIX_PRIO_NONE &&
        expiry_push(t, t->hint_until[new_id], new_id) != 0) {
        uint32_t before = block_prio(t, new_id, n->ns);
        t->hint_timed[new_id] = RADIX_PRIO_NONE;
        t->hint_until[new_id] = 0;
        t->exp_live--;
        prio_changed(t, new_id, before);
    }
}

/* ---- dropping one prompt ----------------------------------------------------- */

/* Like radix_ns_clear this makes no choice of whose block makes room (the
 * caller names the blocks), so it does not go through evict_choice; unlike
 * it, it follows one chain, not the queues: its last block first, then each
 * block before it as it becomes the end of its prefix. A block another
 * cached prefix continues has a child record or node, so the walk back stops
 * there, as it does at a pin or a copy, and keeps everything before it. */
int radix_evict_prompt(radix_tree_t *t, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                       size_t *n_matched, size_t *n_tier1, size_t *n_tier2)
{
    if (!t || !n_matched || !n_tier1 || !n_tier2 || (n_tokens > 0 && !tokens))
        return KVS_EINVAL;
    *n_matched = *n_tier1 = *n_tier2 = 0;
    if (!ns_live(t, ns))
        return KVS_ENONS;
    uint32_t bt = t->cfg.block_tokens;
    size_t want = n_tokens / bt;
    radix_cursor_t at = {t->ns[ns]->root, 0}, next = at;
    while (*n_matched < want && walk_next(t, &next, tokens + *n_matched * bt) &&
           !is_busy(t, *rec_id(next.node, next.pos))) {
        at = next;
        (*n_matched)++;
    }
    radix_node_t *n = at.node;
    uint32_t pos = at.pos;
    while (!is_root(n) && pos == last_pos(n) && n->n_children == 0) {
        uint32_t id = *rec_id(n, pos);
        if (*rec_ref(n, pos) > 0 || is_busy(t, id))
            break;
        radix_node_t *parent = n->parent;
        bool gone = n->len == 1; /* evict_leaf frees the node with its last block */
        bool tier2 = in_lower(t, id);
        radix__evict_leaf(t, n, (int)tier_of(t, id), EVICT_OWN);
        (*(tier2 ? n_tier2 : n_tier1))++;
        if (gone)
            n = parent;
        pos = is_root(n) ? 0 : last_pos(n);
    }
    return 0;
}

/* ---- dropping a block found corrupt ----------------------------------------- */

/* A child of n (n has some), found by a scan of the child table: there is
 * no list of a node's children, and a drop of a corrupt block is rare. */
static radix_node_t *any_child(const radix_tree_t *t, const radix_node_t *n)
{
    for (size_t i = 0; i <= t->slot_mask; i++)
        if (t->slots[i].node && t->slots[i].node->parent == n)
            return t->slots[i].node;
    return NULL;
}

/* Leaves first, as radix_evict_prompt drops a prompt, but down every
 * branch below the block: a leaf of its subtree goes, then the next, until
 * the block itself is gone. */
int radix_drop_from(radix_tree_t *t, uint32_t block_id, size_t *n_dropped)
{
    if (!t || !n_dropped || block_id >= t->id_end)
        return KVS_EINVAL;
    *n_dropped = 0;
    for (;;) {
        radix_node_t *n = t->by_node[block_id];
        if (!n || n == &radix__mark)
            return 0;
        while (n->n_children > 0) {
            radix_node_t *c = any_child(t, n);
            if (!c)
                return KVS_EINTERNAL;
            n = c;
        }
        uint32_t pos = last_pos(n);
        uint32_t id = *rec_id(n, pos);
        if (*rec_ref(n, pos) > 0 || is_busy(t, id))
            return KVS_EBUSY;
        radix__evict_leaf(t, n, (int)tier_of(t, id), EVICT_OWN);
        (*n_dropped)++;
    }
}
