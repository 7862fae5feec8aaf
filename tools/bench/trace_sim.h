/* SPDX-License-Identifier: Apache-2.0 */
/* trace_sim: the offline trace simulator over the index (trace_sim.c). */
#ifndef KVS_TRACE_SIM_H
#define KVS_TRACE_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "radix.h"
#include "trace.h"

typedef struct sim_params {
    uint32_t block_tokens;
    uint32_t capacity; /* pool blocks (tier 1) */
    uint32_t tier2;    /* tier-2 blocks (radix Tiers: demote, promote); 0: one tier */
    uint32_t tier3;    /* tier-3 blocks below tier 2 (kvshared's disk tier); 0: none */
    radix_policy_t policy;
    uint32_t freq_max_hits, freq_bonus_pct;
    uint64_t freq_bonus_ticks;
    uint32_t freq_horizon_pct;
    bool check; /* radix_check() at the end */
    /* Retention hints from an oracle with noise (sim_oracle_t), when hints. */
    bool hints;
    double hint_accuracy;
    uint64_t hint_seed;
    bool hint_per_unit;     /* the engine's knowledge drawn per unit, not per request */
    const size_t *next_use; /* trace_next_uses(); NULL: computed per run */
} sim_params_t;

/*
 * A simulated engine that hints from the trace's own future with noise, the
 * same in trace-sim and replay. After request r, for each 512-token unit u
 * of its prompt (the blocks it touched), the truth is "the prefix through u
 * is used again within the horizon H", and the engine's belief is:
 *   - with probability q = 2 accuracy - 1 (accuracy 0.5 .. 1), the truth (it knows this
 *     request's future: one draw per request; per unit with per_unit);
 *   - otherwise a fair coin, drawn per unit, independent of the future.
 * So P(belief = truth) = accuracy, and at 0.5 (q = 0) the belief is a coin
 * that carries no information. Believed reused: SIM_HINT_KEEP for H
 * requests; believed not: SIM_HINT_DROP for H (before unhinted blocks).
 * A hint given at the next access replaces neither (the index keeps the
 * highest live one), so a block is kept while its latest keep hint lives.
 * H is how long a kept block stays cached: the pool's blocks over the rate
 * of new blocks hinted keep (per request, so far), so it follows the pool
 * size and the hints themselves. Draws come from (seed, request) alone, so
 * any worker that handles request r draws as the simulator does.
 */
#define SIM_HINT_KEEP 75
#define SIM_HINT_DROP 25
typedef struct sim_oracle {
    const trace_t *tr;
    const size_t *next_use; /* trace_next_uses() */
    double accuracy;
    uint64_t seed;
    bool per_unit;
    uint32_t capacity;    /* pool blocks */
    uint32_t unit_blocks; /* blocks per 512-token unit */
    uint64_t keep_new;    /* new blocks hinted keep so far */
    uint64_t requests;    /* requests hinted so far */
} sim_oracle_t;

/* The horizon now, in requests (>= 1). */
uint64_t sim_oracle_horizon(const sim_oracle_t *o);

/* The hints after request r, which touched n_blocks blocks (the first n_hit
 * of them hits): prio[u] for each unit u < ceil(n_blocks / unit_blocks),
 * SIM_HINT_KEEP or SIM_HINT_DROP, each for *horizon requests. */
void sim_oracle_hints(sim_oracle_t *o, size_t r, size_t n_blocks, size_t n_hit, int *prio,
                      uint64_t *horizon);

typedef struct sim_result {
    uint64_t requests;
    uint64_t prompt_tokens;
    uint64_t hit_tokens;
    uint64_t t2_hit_tokens;  /* of hit_tokens, those found in tier 2 (and promoted) */
    uint64_t evicted_blocks; /* dropped for good, from either tier */
    uint64_t demoted_blocks, promoted_blocks;
    uint64_t tier2_dropped;  /* of evicted_blocks, those dropped from tier 2 */
    uint64_t t3_hit_tokens;  /* of t2_hit_tokens, those promoted from tier 3 */
    uint64_t short_requests; /* requests that could not get all their blocks */
    uint32_t max_cached;
    size_t index_bytes;
    double seconds;
} sim_result_t;

/* Blocks needed to cache every full block of the trace: a pool of this size
 * never evicts. At least 1. */
uint64_t sim_unlimited_blocks(const trace_t *tr, uint32_t block_tokens);

/* Replays the trace against a fresh index with a pool of sp->capacity
 * blocks and, when sp->tier2 > 0, a tier 2 of that many blocks, moved as
 * kvshared --host-tier moves them (see trace_sim.c). Errors: KVS_EINVAL,
 * KVS_ENOMEM, KVS_EINTERNAL (the index misbehaved: an insert or unpin
 * failed, or radix_check did), or the code of an index call that failed. */
int sim_run(const trace_t *tr, const sim_params_t *sp, sim_result_t *res);

/* The offline optimum over the trace's 512-token ids (Belady: when over
 * capacity, drop the id whose next use is farthest, never-again first),
 * with a cache of `capacity` ids and full 512-token blocks only, for scale:
 * no prefix tree, no partial blocks; what an online policy cannot beat at
 * that granularity. Fills prompt_tokens, hit_tokens, evicted_blocks,
 * requests. Errors: KVS_EINVAL, KVS_ENOMEM. */
int sim_belady(const trace_t *tr, uint32_t capacity, sim_result_t *res);

#endif
