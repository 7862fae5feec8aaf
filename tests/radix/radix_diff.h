/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One step of the differential test of the index: an operation run on the
 * radix tree and on the flat model (radix_model.c), then everything compared:
 * the results, the evictions in order, radix_check, every namespace's
 * counters and the blocks' refcounts (all of them, or one per step in turn). The seeded unit test
 * (test_radix.c) and the fuzz target (tests/fuzz/fuzz_radix.c) choose operations their own way (a
 * PRNG, the fuzzer's bytes) and share this step, so both check the same things.
 *
 * The driver holds pins (held[]): a pinning lookup or insert adds the pinned
 * ids, an unpin of a held pin removes it, and radix_diff_finish releases them
 * all and checks that the tree then empties.
 *
 * With a tier 2 (cfg.tier2_blocks > 0; radix.h, Tiers) the step also keeps
 * the copies in flight, as kvshared's copy jobs would: every id a demotion or
 * promotion made busy (copying[]) until a COPY_DONE step ends it, and the
 * tier-1 ids demotions vacated, which stay the caller's until then: inserts
 * and promotions never give those (the step moves such an id to the next one
 * that is free of copies). An insert that makes room demotes instead of
 * evicting, as the daemon does. radix_diff_finish ends every copy, demotes
 * all of tier 1, then clears tier 2, and checks that both tiers empty.
 */
#ifndef KVS_TEST_RADIX_DIFF_H
#define KVS_TEST_RADIX_DIFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "radix.h"
#include "radix_model.h"

#define RADIX_DIFF_MAX_NS      4
#define RADIX_DIFF_MAX_EVICTED 4096

typedef enum radix_diff_kind {
    RADIX_DIFF_LOOKUP,
    RADIX_DIFF_INSERT,
    RADIX_DIFF_PIN,
    RADIX_DIFF_UNPIN,
    RADIX_DIFF_EVICT,
    RADIX_DIFF_SET_LIMITS,
    RADIX_DIFF_HINT,         /* radix_hint(id or held[held_index], prio, until) */
    RADIX_DIFF_EXPIRE,       /* radix_expire_hints(now) */
    RADIX_DIFF_SET_PRIORITY, /* radix_ns_set_priority(ns, prio, prio_cap) */
    RADIX_DIFF_DEMOTE,       /* radix_demote(for_ns, n): moves stay busy until COPY_DONE */
    RADIX_DIFF_PROMOTE,      /* a pinned lookup (ns, tokens, max_ids), then each matched tier-2
                              * block promoted in order to the next of ids[0 .. n_ids) */
    RADIX_DIFF_COPY_DONE,    /* radix_copy_done(copying[copy_index % n_copying] or id) */
} radix_diff_kind_t;

typedef struct radix_diff_op {
    radix_diff_kind_t kind;
    uint32_t ns; /* lookup, insert, set_limits; may be unknown */
    const uint32_t *tokens;
    size_t n_tokens;
    bool pin;            /* lookup, insert: pin what is returned */
    size_t max_ids;      /* lookup */
    const uint32_t *ids; /* insert; promote: the tier-1 ids to promote to */
    size_t n_ids;
    bool make_room; /* insert: first evict for room_ns what does not fit, as the daemon does */
    uint32_t room_ns;
    uint32_t id;    /* pin, unpin (when not from_held) */
    bool from_held; /* unpin held[held_index] */
    size_t held_index;
    uint32_t for_ns;   /* evict, demote */
    size_t n;          /* evict, demote */
    bool from_copying; /* copy done: end copying[copy_index % n_copying] (if any) */
    size_t copy_index;
    uint32_t quota, reserve; /* set_limits */
    uint32_t prio, prio_cap; /* hint, set_priority */
    uint64_t until, now;     /* hint, expire */
} radix_diff_op_t;

typedef struct radix_diff {
    radix_tree_t *t;
    model_t m;
    uint32_t n_ns, max_blocks;
    uint32_t t2_blocks; /* tier-2 ids are [max_blocks, max_blocks + t2_blocks) */
    uint32_t t3_blocks; /* tier-3 ids follow tier 2's */
    uint32_t *held;     /* pins the driver holds */
    size_t n_held, max_held;
    uint32_t evicted[RADIX_DIFF_MAX_EVICTED]; /* by the tree, in this step */
    size_t n_evicted;
    uint64_t evicted_total; /* by the tree, since init */
    uint32_t *copying;      /* busy ids: copies started and not yet done */
    size_t n_copying;
    bool *vacated; /* [max_blocks]: tier-1 ids demoted away, the caller's until their copy ends */
    uint32_t n_vacated;
    radix_move_t *moves_t, *moves_m; /* [max_blocks + 1]: one demotion's moves */
    uint64_t copies_done;            /* COPY_DONE steps that ended a copy */
    bool all_refcounts; /* compare every block's refcount after each step, not one in turn */
    long step;          /* steps compared so far */
    char err[256];      /* the first disagreement */
} radix_diff_t;

/* A tree made from cfg (its on_evict and evict_ctx are the recorder's) and a
 * model with the same policy and tier 2, each with n_ns namespaces (names[k],
 * seed 100 + k, quotas[k], reserves[k]); room for max_held held pins. Returns
 * 0, or -1 with d->err set (nothing to free). */
int radix_diff_init(radix_diff_t *d, radix_config_t cfg, uint32_t n_ns, const char *const *names,
                    const uint32_t *quotas, const uint32_t *reserves, size_t max_held);

/* Whether an operation may pin up to n more blocks: room is left in held[]. */
bool radix_diff_can_pin(const radix_diff_t *d, size_t n);

/* Runs op on both and compares everything (above). *rc gets the tree's
 * return code (the model's is the same; for a promotion, the lookup's: each
 * radix_promote's is compared on its own). Returns 0, or -1 with d->err set. */
int radix_diff_step(radix_diff_t *d, const radix_diff_op_t *op, int *rc);

/* radix_diff_step in two halves, for a batch of operations checked once:
 * apply runs op on both and compares its results only; compare checks the
 * rest (evictions since the last compare, in order, radix_check, counters,
 * refcounts) and starts the next step. */
int radix_diff_apply(radix_diff_t *d, const radix_diff_op_t *op, int *rc);
int radix_diff_compare(radix_diff_t *d);

/* Ends every copy, releases every held pin, evicts (or with a tier 2,
 * demotes, then clears) everything, checks that the tree is empty and
 * consistent, and frees both. Returns 0, or -1 with d->err set (freed either
 * way). */
int radix_diff_finish(radix_diff_t *d);

#endif /* KVS_TEST_RADIX_DIFF_H */
