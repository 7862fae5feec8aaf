/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A deliberately trivial model of the radix index for differential tests:
 * a flat array of cached blocks indexed by block id, each knowing its
 * namespace, parent block, tokens, pins and last-use tick. Every operation
 * is a linear scan. It implements the semantics written in radix.h, not the
 * tree's data structures.
 */
#ifndef KVS_RADIX_MODEL_H
#define KVS_RADIX_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "radix.h"

#define MODEL_MAX_BT 16
#define MODEL_MAX_NS 8

typedef struct model_block {
    bool cached;
    uint32_t ns;
    int64_t parent; /* block id, -1 at the root */
    uint32_t tokens[MODEL_MAX_BT];
    uint32_t ref;
    uint64_t stamp;
    uint32_t children;
    uint32_t hits; /* lookups that matched it */
    uint64_t key;  /* eviction key, set when it last became or was used as an evictable leaf */
    int hint_base, hint_timed; /* -1: none */
    uint64_t hint_until;
    uint32_t t1_children; /* children in tier 1 */
    uint32_t t2_children; /* children in tier 2 */
    int64_t peer;         /* being copied: its other id; else -1 */
} model_block_t;

typedef struct model_ns {
    uint32_t quota, reserve;
    uint64_t lookups, lookup_tokens, hit_tokens, inserted, duplicates, evicted;
    uint64_t evicted_own, evicted_others, evicted_quota; /* evicted, by cause */
    uint32_t cached, pinned;
    uint32_t prio_default, prio_cap;
    uint32_t t2;                                           /* blocks in tier 2 */
    uint64_t t2_dropped, demoted, promoted, t2_hit_tokens; /* tier counters */
    uint32_t t3;                                           /* blocks in tier 3 */
    uint64_t t3_dropped, demoted3, t3_hit_tokens;
} model_ns_t;

typedef struct model {
    uint32_t bt, max_blocks, n_ns;
    uint32_t t2_blocks; /* tier-2 ids [max_blocks, max_blocks + t2_blocks) */
    uint32_t *t2_free;  /* free tier-2 ids, a stack popped from the end */
    uint32_t t2_n_free;
    uint32_t t3_blocks; /* tier-3 ids after tier 2's */
    uint32_t *t3_free;
    uint32_t t3_n_free;
    model_block_t *blocks;
    model_ns_t ns[MODEL_MAX_NS];
    uint64_t tick;
    uint32_t *evicted; /* ids in eviction order since the last reset */
    size_t n_evicted;
    uint64_t taken_back; /* blocks a namespace below its reservation took from another */
    /* eviction policy, as in radix_config_t (defaults applied) */
    int policy;
    uint32_t max_hits, bonus_pct;
    uint64_t bonus_ticks;
    uint32_t horizon_pct;
    uint64_t evict_age64; /* 64 x moving average of evicted blocks' age */
    uint64_t reuse_gap64; /* 64 x moving average of first-reuse gaps */
} model_t;

int model_init(model_t *m, uint32_t bt, uint32_t max_blocks);
/* With a tier 2 of t2_blocks ids (see radix.h, Tiers). Eviction order with a
 * tier 2 is modelled for RADIX_EVICT_LRU. */
int model_init_tiers(model_t *m, uint32_t bt, uint32_t max_blocks, uint32_t t2_blocks);
/* With a tier 3 of t3_blocks ids below tier 2 as well. */
int model_init_tiers3(model_t *m, uint32_t bt, uint32_t max_blocks, uint32_t t2_blocks,
                      uint32_t t3_blocks);
int model_demote(model_t *m, uint32_t for_ns, size_t n, radix_move_t *moves, size_t *n_moved,
                 size_t *n_dropped);
int model_promote(model_t *m, uint32_t t2_id, uint32_t id);
int model_copy_done(model_t *m, uint32_t id, uint32_t *peer);
/* Sets the policy like radix_config_t's fields (0 parameters: defaults). */
void model_set_policy(model_t *m, int policy, uint32_t max_hits, uint32_t bonus_pct,
                      uint64_t bonus_ticks, uint32_t horizon_pct);
void model_fini(model_t *m);
uint32_t model_ns_create(model_t *m, uint32_t quota, uint32_t reserve);
int model_lookup(model_t *m, uint32_t ns, const uint32_t *tokens, size_t n_tokens, bool pin,
                 uint32_t *ids, size_t max_ids, size_t *n_blocks);
int model_insert(model_t *m, uint32_t ns, const uint32_t *tokens, size_t n_tokens,
                 const uint32_t *ids, size_t n_ids, bool pin, uint32_t *canonical, size_t *n_done);
int model_pin(model_t *m, uint32_t id);
int model_unpin(model_t *m, uint32_t id);
int model_refcount(const model_t *m, uint32_t id, uint32_t *ref);
/* Retention hints as radix_hint, radix_expire_hints, radix_ns_set_priority
 * define them, kept the obvious way: every block's hints, scanned. */
int model_hint(model_t *m, uint32_t id, uint32_t prio, uint64_t until);
void model_expire(model_t *m, uint64_t now);
int model_set_priority(model_t *m, uint32_t ns, uint32_t prio_default, uint32_t prio_cap);
uint32_t model_prio(const model_t *m, uint32_t id);
int model_evict(model_t *m, uint32_t for_ns, size_t n, size_t *n_evicted);

#endif
