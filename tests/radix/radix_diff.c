/* SPDX-License-Identifier: Apache-2.0 */
#include "radix_diff.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvshare_status.h"

static void record_evict(void *ctx, uint32_t block_id)
{
    radix_diff_t *d = ctx;
    d->evicted_total++;
    if (d->n_evicted < RADIX_DIFF_MAX_EVICTED)
        d->evicted[d->n_evicted] = block_id;
    d->n_evicted++;
}

static int differ(radix_diff_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int differ(radix_diff_t *d, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(d->err, sizeof(d->err), "step %ld: ", d->step);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(d->err))
        vsnprintf(d->err + n, sizeof(d->err) - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Fails the step (returns -1 from the caller) when a != b. */
#define SAME(d, a, b)                                                                              \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            return differ((d), "%s == %lld but %s == %lld (radix_diff.c line %d)", #a, a_, #b, b_, \
                          __LINE__);                                                               \
    } while (0)

/* Frees what radix_diff_init allocated; d->t and d->m are freed by the caller. */
static void free_driver(radix_diff_t *d)
{
    free(d->held);
    free(d->copying);
    free(d->vacated);
    free(d->moves_t);
    free(d->moves_m);
    d->held = d->copying = NULL;
    d->vacated = NULL;
    d->moves_t = d->moves_m = NULL;
}

int radix_diff_init(radix_diff_t *d, radix_config_t cfg, uint32_t n_ns, const char *const *names,
                    const uint32_t *quotas, const uint32_t *reserves, size_t max_held)
{
    memset(d, 0, sizeof(*d));
    if (n_ns > RADIX_DIFF_MAX_NS)
        return differ(d, "at most %d namespaces", RADIX_DIFF_MAX_NS);
    cfg.on_evict = record_evict;
    cfg.evict_ctx = d;
    d->n_ns = n_ns;
    d->max_blocks = cfg.max_blocks;
    d->t2_blocks = cfg.tier2_blocks;
    d->t3_blocks = cfg.tier3_blocks;
    d->max_held = max_held;
    size_t n_all = (size_t)cfg.max_blocks + cfg.tier2_blocks + cfg.tier3_blocks;
    d->held = malloc(max_held * sizeof(*d->held));
    d->copying = malloc((n_all + 1) * sizeof(*d->copying));
    d->vacated = calloc((size_t)cfg.max_blocks + 1, sizeof(*d->vacated));
    d->moves_t = malloc(((size_t)cfg.max_blocks + 1) * sizeof(*d->moves_t));
    d->moves_m = malloc(((size_t)cfg.max_blocks + 1) * sizeof(*d->moves_m));
    if (!d->held || !d->copying || !d->vacated || !d->moves_t || !d->moves_m) {
        free_driver(d);
        return differ(d, "out of memory");
    }
    int rc = radix_new(&cfg, &d->t);
    if (rc == 0 && model_init_tiers3(&d->m, cfg.block_tokens, cfg.max_blocks, cfg.tier2_blocks,
                                     cfg.tier3_blocks) != 0)
        rc = KVS_ENOMEM;
    if (rc != 0) {
        model_fini(&d->m);
        radix_free(d->t);
        free_driver(d);
        return differ(d, "radix_new or model_init_tiers: %s", kvs_status_text(rc));
    }
    model_set_policy(&d->m, cfg.policy, cfg.freq_max_hits, cfg.freq_bonus_pct, cfg.freq_bonus_ticks,
                     cfg.freq_horizon_pct);
    for (uint32_t k = 0; k < n_ns; k++) {
        uint32_t ns = 99;
        rc = radix_ns_create(d->t, names[k], 100 + k, quotas[k], reserves[k], &ns);
        if (rc != 0 || model_ns_create(&d->m, quotas[k], reserves[k]) != ns) {
            model_fini(&d->m);
            radix_free(d->t);
            free_driver(d);
            return differ(d, "namespace %s: %s, or ids disagree", names[k], kvs_status_text(rc));
        }
    }
    return 0;
}

bool radix_diff_can_pin(const radix_diff_t *d, size_t n)
{
    return d->n_held + n <= d->max_held;
}

static void hold(radix_diff_t *d, const uint32_t *ids, size_t n)
{
    for (size_t k = 0; k < n && d->n_held < d->max_held; k++)
        d->held[d->n_held++] = ids[k];
}

/* Forgets one copy of a pin on id that the driver holds, if any. */
static void forget(radix_diff_t *d, uint32_t id)
{
    for (size_t k = 0; k < d->n_held; k++)
        if (d->held[k] == id) {
            d->held[k] = d->held[--d->n_held];
            return;
        }
}

/* The id the driver gives for a tier-1 block: id itself, unless a demotion
 * vacated it (still the caller's until its copy ends), then the next one
 * that is not; with every id vacated, max_blocks (out of range, refused by
 * both). Ids out of tier 1 stay as they are. */
static uint32_t usable(const radix_diff_t *d, uint32_t id)
{
    if (id >= d->max_blocks || !d->vacated[id])
        return id;
    for (uint32_t k = 1; k < d->max_blocks; k++) {
        uint32_t c = (id + k) % d->max_blocks;
        if (!d->vacated[c])
            return c;
    }
    return d->max_blocks;
}

/* Demotes up to n blocks on both (n at most max_blocks: no more can move)
 * and compares the moves; each starts a copy. */
static int demote_both(radix_diff_t *d, uint32_t for_ns, size_t n, int *rc)
{
    size_t mv_t = 77, mv_m = 77, dr_t = 77, dr_m = 77;
    if (n > d->max_blocks)
        n = d->max_blocks;
    int rc_t = radix_demote(d->t, for_ns, n, d->moves_t, &mv_t, &dr_t);
    int rc_m = model_demote(&d->m, for_ns, n, d->moves_m, &mv_m, &dr_m);
    SAME(d, rc_t, rc_m);
    *rc = rc_t;
    if (rc_t != 0)
        return 0;
    SAME(d, mv_t, mv_m);
    SAME(d, dr_t, dr_m);
    for (size_t k = 0; k < mv_t; k++) {
        const radix_move_t *a = &d->moves_t[k], *b = &d->moves_m[k];
        SAME(d, a->from, b->from);
        SAME(d, a->to, b->to);
        SAME(d, a->ns, b->ns);
        d->copying[d->n_copying++] = a->to;
        if (a->from >= d->max_blocks) { /* tier 2 to tier 3 */
            if (a->from >= d->max_blocks + d->t2_blocks || a->to < d->max_blocks + d->t2_blocks)
                return differ(d, "demotion from %u to %u, not tier 2 to tier 3", a->from, a->to);
            continue;
        }
        if (d->vacated[a->from])
            return differ(d, "demotion from %u, not a tier-1 id in use", a->from);
        d->vacated[a->from] = true;
        d->n_vacated++;
    }
    return 0;
}

/* A copy of busy id ended (radix_copy_done gave peer): it leaves copying[],
 * and a demotion's tier-1 id is the caller's to give again. */
static int copy_ended(radix_diff_t *d, uint32_t id, uint32_t peer)
{
    size_t k = 0;
    while (k < d->n_copying && d->copying[k] != id)
        k++;
    if (k == d->n_copying)
        return differ(d, "radix_copy_done(%u) ended a copy no step started", id);
    d->copying[k] = d->copying[--d->n_copying];
    if (id >= d->max_blocks && peer < d->max_blocks) { /* a demotion from tier 1 */
        SAME(d, d->vacated[peer], 1);
        d->vacated[peer] = false;
        d->n_vacated--;
    }
    d->copies_done++;
    return 0;
}

static int run(radix_diff_t *d, const radix_diff_op_t *op, int *rc)
{
    radix_tree_t *t = d->t;
    model_t *m = &d->m;
    uint32_t got[RADIX_DIFF_MAX_EVICTED], want[RADIX_DIFF_MAX_EVICTED];
    int rc_t, rc_m;
    switch (op->kind) {
    case RADIX_DIFF_LOOKUP: {
        size_t n_t = 77, n_m = 77, max_ids = op->max_ids;
        if (max_ids > RADIX_DIFF_MAX_EVICTED)
            return differ(d, "lookup of more than %d ids", RADIX_DIFF_MAX_EVICTED);
        rc_t = radix_lookup(t, op->ns, op->tokens, op->n_tokens, op->pin, got, max_ids, &n_t);
        rc_m = model_lookup(m, op->ns, op->tokens, op->n_tokens, op->pin, want, max_ids, &n_m);
        SAME(d, rc_t, rc_m);
        if (rc_t == 0) {
            SAME(d, n_t, n_m);
            for (size_t k = 0; k < n_t; k++)
                SAME(d, got[k], want[k]);
            if (op->pin)
                hold(d, got, n_t);
        }
        break;
    }
    case RADIX_DIFF_INSERT: {
        if (op->n_ids > RADIX_DIFF_MAX_EVICTED)
            return differ(d, "insert of more than %d ids", RADIX_DIFF_MAX_EVICTED);
        /* Tier 1 in use: cached blocks and the ids copies still read. */
        uint32_t used = d->n_vacated;
        for (uint32_t k = 0; k < m->n_ns; k++)
            used += m->ns[k].cached;
        if (op->make_room && used + op->n_ids > d->max_blocks) {
            size_t need = used + op->n_ids - d->max_blocks, e_t = 77, e_m = 77;
            if (d->t2_blocks > 0) {
                int rc_d;
                if (demote_both(d, op->room_ns, need, &rc_d) != 0)
                    return -1;
            } else {
                SAME(d, radix_evict(t, op->room_ns, need, &e_t),
                     model_evict(m, op->room_ns, need, &e_m));
                SAME(d, e_t, e_m);
            }
        }
        /* After the demotion: the ids it vacated are not the caller's to give. */
        uint32_t ids[RADIX_DIFF_MAX_EVICTED];
        for (size_t k = 0; k < op->n_ids; k++)
            ids[k] = usable(d, op->ids[k]);
        size_t d_t = 77, d_m = 77;
        rc_t =
            radix_insert(t, op->ns, op->tokens, op->n_tokens, ids, op->n_ids, op->pin, got, &d_t);
        rc_m =
            model_insert(m, op->ns, op->tokens, op->n_tokens, ids, op->n_ids, op->pin, want, &d_m);
        SAME(d, rc_t, rc_m);
        SAME(d, d_t, d_m);
        for (size_t k = 0; k < d_t; k++)
            SAME(d, got[k], want[k]);
        if (op->pin)
            hold(d, got, d_t);
        break;
    }
    case RADIX_DIFF_PIN:
        rc_t = radix_pin(t, op->id);
        rc_m = model_pin(m, op->id);
        SAME(d, rc_t, rc_m);
        if (rc_t == 0 && d->n_held < d->max_held)
            d->held[d->n_held++] = op->id;
        else if (rc_t == 0)
            SAME(d, radix_unpin(t, op->id) | model_unpin(m, op->id), 0);
        break;
    case RADIX_DIFF_UNPIN: {
        bool from_held = op->from_held && op->held_index < d->n_held;
        uint32_t id = from_held ? d->held[op->held_index] : op->id;
        rc_t = radix_unpin(t, id);
        rc_m = model_unpin(m, id);
        SAME(d, rc_t, rc_m);
        if (from_held) {
            SAME(d, rc_t, 0);
            d->held[op->held_index] = d->held[--d->n_held];
        } else if (rc_t == 0) {
            /* Took a pin the driver holds: forget one copy of it. */
            forget(d, id);
        }
        break;
    }
    case RADIX_DIFF_EVICT: {
        size_t e_t = 77, e_m = 77;
        rc_t = radix_evict(t, op->for_ns, op->n, &e_t);
        rc_m = model_evict(m, op->for_ns, op->n, &e_m);
        SAME(d, rc_t, rc_m);
        if (rc_t == 0)
            SAME(d, e_t, e_m);
        break;
    }
    case RADIX_DIFF_SET_LIMITS:
        rc_t = radix_ns_set_limits(t, op->ns, op->quota, op->reserve);
        rc_m = op->ns < m->n_ns ? 0 : KVS_ENONS;
        if (rc_m == 0) {
            m->ns[op->ns].quota = op->quota;
            m->ns[op->ns].reserve = op->reserve;
        }
        SAME(d, rc_t, rc_m);
        break;
    case RADIX_DIFF_HINT: {
        bool from_held = op->from_held && op->held_index < d->n_held;
        uint32_t id = from_held ? d->held[op->held_index] : op->id;
        rc_t = radix_hint(t, id, op->prio, op->until);
        rc_m = model_hint(m, id, op->prio, op->until);
        SAME(d, rc_t, rc_m);
        break;
    }
    case RADIX_DIFF_EXPIRE:
        rc_t = radix_expire_hints(t, op->now, NULL);
        model_expire(m, op->now);
        SAME(d, rc_t, 0);
        break;
    case RADIX_DIFF_SET_PRIORITY:
        rc_t = radix_ns_set_priority(t, op->ns, op->prio, op->prio_cap);
        rc_m = model_set_priority(m, op->ns, op->prio, op->prio_cap);
        SAME(d, rc_t, rc_m);
        break;
    case RADIX_DIFF_DEMOTE:
        if (demote_both(d, op->for_ns, op->n, &rc_t) != 0)
            return -1;
        break;
    case RADIX_DIFF_PROMOTE: {
        size_t n_t = 77, n_m = 77, max_ids = op->max_ids, next_to = 0;
        if (max_ids > RADIX_DIFF_MAX_EVICTED)
            return differ(d, "lookup of more than %d ids", RADIX_DIFF_MAX_EVICTED);
        if (!radix_diff_can_pin(d, max_ids))
            return differ(d, "a promotion with no room left to hold its pins");
        rc_t = radix_lookup(t, op->ns, op->tokens, op->n_tokens, true, got, max_ids, &n_t);
        rc_m = model_lookup(m, op->ns, op->tokens, op->n_tokens, true, want, max_ids, &n_m);
        SAME(d, rc_t, rc_m);
        if (rc_t != 0)
            break;
        SAME(d, n_t, n_m);
        for (size_t k = 0; k < n_t; k++)
            SAME(d, got[k], want[k]);
        /* Every matched tier-2 block, in order, as kvshared promotes a pinned
         * lookup's: once one fails, the next has its parent in tier 2 and
         * fails too, and both must say so. */
        for (size_t k = 0; k < n_t && next_to < op->n_ids; k++) {
            if (got[k] < d->max_blocks)
                continue;
            uint32_t to = usable(d, op->ids[next_to++]);
            int p_t = radix_promote(t, got[k], to);
            int p_m = model_promote(m, got[k], to);
            SAME(d, p_t, p_m);
            if (p_t == 0) {
                got[k] = to; /* the pin moved with the block */
                d->copying[d->n_copying++] = to;
            }
        }
        hold(d, got, n_t);
        break;
    }
    case RADIX_DIFF_COPY_DONE: {
        bool from_copying = op->from_copying && d->n_copying > 0;
        uint32_t id = from_copying ? d->copying[op->copy_index % d->n_copying] : op->id;
        uint32_t p_t = 77, p_m = 78;
        rc_t = radix_copy_done(t, id, &p_t);
        rc_m = model_copy_done(m, id, &p_m);
        SAME(d, rc_t, rc_m);
        if (from_copying)
            SAME(d, rc_t, 0);
        if (rc_t == 0) {
            SAME(d, p_t, p_m);
            if (copy_ended(d, id, p_t) != 0)
                return -1;
        }
        break;
    }
    default:
        return differ(d, "unknown operation %d", (int)op->kind);
    }
    *rc = rc_t;
    return 0;
}

/* Everything that must agree after any operation. */
static int compare(radix_diff_t *d)
{
    radix_tree_t *t = d->t;
    model_t *m = &d->m;
    /* The same evictions, in the same order. */
    SAME(d, d->n_evicted, m->n_evicted);
    for (size_t k = 0; k < d->n_evicted && k < RADIX_DIFF_MAX_EVICTED; k++)
        SAME(d, d->evicted[k], m->evicted[k]);
    if (radix_check(t) != 0)
        return differ(d, "radix_check failed at check.c line %d", radix_check_line());
    for (uint32_t k = 0; k < d->n_ns; k++) {
        radix_ns_stats_t st;
        SAME(d, radix_ns_stats(t, k, &st), 0);
        SAME(d, st.cached_blocks, m->ns[k].cached);
        SAME(d, st.pinned_blocks, m->ns[k].pinned);
        SAME(d, st.lookups, m->ns[k].lookups);
        SAME(d, st.lookup_tokens, m->ns[k].lookup_tokens);
        SAME(d, st.hit_tokens, m->ns[k].hit_tokens);
        SAME(d, st.inserted_blocks, m->ns[k].inserted);
        SAME(d, st.duplicate_blocks, m->ns[k].duplicates);
        SAME(d, st.evicted_blocks, m->ns[k].evicted);
        SAME(d, st.evicted_own, m->ns[k].evicted_own);
        SAME(d, st.evicted_others, m->ns[k].evicted_others);
        SAME(d, st.evicted_quota, m->ns[k].evicted_quota);
        SAME(d, st.prio_default, m->ns[k].prio_default);
        SAME(d, st.prio_cap, m->ns[k].prio_cap);
        SAME(d, st.tier2_blocks, m->ns[k].t2);
        SAME(d, st.tier2_dropped, m->ns[k].t2_dropped);
        SAME(d, st.demoted_blocks, m->ns[k].demoted);
        SAME(d, st.demoted_blocks, st.demoted_own + st.demoted_others);
        SAME(d, st.promoted_blocks, m->ns[k].promoted);
        SAME(d, st.t2_hit_tokens, m->ns[k].t2_hit_tokens);
        SAME(d, st.tier3_blocks, m->ns[k].t3);
        SAME(d, st.tier3_dropped, m->ns[k].t3_dropped);
        SAME(d, st.demoted3_blocks, m->ns[k].demoted3);
        SAME(d, st.t3_hit_tokens, m->ns[k].t3_hit_tokens);
    }
    /* Tier 2's free ids (their order shows in the next moves) and the copies. */
    if (d->t2_blocks > 0) {
        SAME(d, radix_tier2_free(t), m->t2_n_free);
        SAME(d, radix_tier_free(t, 3), m->t3_n_free);
        SAME(d, radix_busy_blocks(t), d->n_copying);
    }
    /* Every block's refcount and priority, in both tiers, or one block per
     * step in turn (long runs). */
    uint32_t n_all = d->max_blocks + d->t2_blocks + d->t3_blocks;
    uint32_t from = d->all_refcounts ? 0 : (uint32_t)(d->step % n_all);
    uint32_t to = d->all_refcounts ? n_all : from + 1;
    for (uint32_t id = from; id < to; id++) {
        uint32_t r_t = 0, r_m = 0;
        SAME(d, radix_block_refcount(t, id, &r_t), model_refcount(m, id, &r_m));
        SAME(d, r_t, r_m);
        uint32_t p_t = 999;
        SAME(d, radix_block_priority(t, id, &p_t), m->blocks[id].cached ? 0 : KVS_ENOTFOUND);
        if (m->blocks[id].cached)
            SAME(d, p_t, model_prio(m, id));
    }
    return 0;
}

int radix_diff_apply(radix_diff_t *d, const radix_diff_op_t *op, int *rc)
{
    return run(d, op, rc);
}

int radix_diff_compare(radix_diff_t *d)
{
    int rc = compare(d);
    d->step++;
    d->n_evicted = 0;
    d->m.n_evicted = 0;
    return rc;
}

int radix_diff_step(radix_diff_t *d, const radix_diff_op_t *op, int *rc)
{
    if (radix_diff_apply(d, op, rc) != 0)
        return -1;
    return radix_diff_compare(d);
}

static int finish(radix_diff_t *d)
{
    d->step = -2; /* the final check */
    uint32_t peer;
    while (d->n_copying > 0) {
        uint32_t id = d->copying[0];
        SAME(d, radix_copy_done(d->t, id, &peer), 0);
        if (copy_ended(d, id, peer) != 0)
            return -1;
    }
    for (size_t k = 0; k < d->n_held; k++)
        SAME(d, radix_unpin(d->t, d->held[k]), 0);
    SAME(d, radix_pinned_blocks(d->t), 0);
    size_t all;
    if (d->t2_blocks > 0) {
        /* Reservations off: with a tier 3, a tier-2 block of one namespace
         * cannot move down into a tier 3 full of another's reserved blocks,
         * and the tier-1 blocks above it then cannot move either (radix.h,
         * radix_demote); a drain by demotion needs every tier to give. */
        for (uint32_t k = 0; k < d->n_ns; k++)
            SAME(d, radix_ns_set_limits(d->t, k, 0, 0), 0);
        /* Tier 1 empties into tier 2 (which drops its own leaves when
         * full), each namespace in turn so reservations do not stop it. */
        size_t moved, n_mv, n_dr;
        do {
            moved = 0;
            for (uint32_t k = 0; k < d->n_ns; k++) {
                SAME(d, radix_demote(d->t, k, d->max_blocks, d->moves_t, &n_mv, &n_dr), 0);
                for (size_t j = 0; j < n_mv; j++)
                    SAME(d, radix_copy_done(d->t, d->moves_t[j].to, &peer), 0);
                moved += n_mv + n_dr;
            }
        } while (moved > 0);
        SAME(d, radix_cached_blocks(d->t), 0);
        SAME(d, radix_busy_blocks(d->t), 0);
        SAME(d, radix_tier2_blocks(d->t) + radix_tier2_free(d->t), d->t2_blocks);
        SAME(d, radix_tier_blocks(d->t, 3) + radix_tier_free(d->t, 3), d->t3_blocks);
        SAME(d, radix_check(d->t), 0);
        for (uint32_t k = 0; k < d->n_ns; k++)
            SAME(d, radix_ns_clear(d->t, k, &all), 0);
        SAME(d, radix_tier2_blocks(d->t), 0);
        SAME(d, radix_tier2_free(d->t), d->t2_blocks);
        SAME(d, radix_tier_blocks(d->t, 3), 0);
        SAME(d, radix_tier_free(d->t, 3), d->t3_blocks);
    } else {
        SAME(d, radix_evict(d->t, RADIX_NS_ANY, d->max_blocks, &all), 0);
        for (uint32_t k = 0; k < d->n_ns; k++)
            SAME(d, radix_evict(d->t, k, d->max_blocks, &all), 0);
    }
    SAME(d, radix_cached_blocks(d->t), 0);
    SAME(d, radix_check(d->t), 0);
    return 0;
}

int radix_diff_finish(radix_diff_t *d)
{
    int rc = finish(d);
    model_fini(&d->m);
    radix_free(d->t);
    free_driver(d);
    d->t = NULL;
    return rc;
}
