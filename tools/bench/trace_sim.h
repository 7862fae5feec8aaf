/* trace_sim: the offline trace simulator over the index (trace_sim.c). */
#ifndef KVS_TRACE_SIM_H
#define KVS_TRACE_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "radix.h"
#include "trace.h"

typedef struct sim_params {
    uint32_t block_tokens;
    uint32_t capacity; /* pool blocks */
    radix_policy_t policy;
    uint32_t freq_max_hits, freq_bonus_pct;
    uint64_t freq_bonus_ticks;
    uint32_t freq_horizon_pct;
    bool check; /* radix_check() at the end */
    /* Retention hints from an oracle with noise (sim_hint), when hints. */
    bool hints;
    double hint_accuracy;
    uint32_t hint_horizon; /* requests: "reused" means within this many */
    uint64_t hint_seed;
    bool hint_per_request;  /* one draw per request for all its units */
    const size_t *next_use; /* trace_next_uses(); NULL: computed per run */
} sim_params_t;

/* The priority a simulated engine gives the blocks of unit u (a 512-token id
 * slot of request r's prompt), from the trace's own future with noise: the
 * truth is "the prefix through unit u is used again within `horizon`
 * requests"; the engine's belief is the truth with probability `accuracy`
 * (one draw of *rng per unit), else its opposite. A block believed reused
 * gets SIM_HINT_PRIO for `horizon` requests; one believed not gets no hint
 * (returns -1). At accuracy 0.5 the belief carries no information. */
#define SIM_HINT_PRIO 75
int sim_hint(const trace_t *tr, const size_t *next_use, size_t r, uint32_t u, double accuracy,
             uint32_t horizon, uint64_t *rng);

typedef struct sim_result {
    uint64_t requests;
    uint64_t prompt_tokens;
    uint64_t hit_tokens;
    uint64_t evicted_blocks;
    uint64_t short_requests; /* requests that could not get all their blocks */
    uint32_t max_cached;
    size_t index_bytes;
    double seconds;
} sim_result_t;

/* Blocks needed to cache every full block of the trace: a pool of this size
 * never evicts. At least 1. */
uint64_t sim_unlimited_blocks(const trace_t *tr, uint32_t block_tokens);

/* Replays the trace against a fresh index with a pool of sp->capacity
 * blocks. Errors: KVS_EINVAL, KVS_ENOMEM, KVS_EINTERNAL (the index
 * misbehaved: an insert or unpin failed, or radix_check did). */
int sim_run(const trace_t *tr, const sim_params_t *sp, sim_result_t *res);

/* The offline optimum over the trace's 512-token ids (Belady: when over
 * capacity, drop the id whose next use is farthest, never-again first),
 * with a cache of `capacity` ids and full 512-token blocks only, for scale:
 * no prefix tree, no partial blocks; what an online policy cannot beat at
 * that granularity. Fills prompt_tokens, hit_tokens, evicted_blocks,
 * requests. Errors: KVS_EINVAL, KVS_ENOMEM. */
int sim_belady(const trace_t *tr, uint32_t capacity, sim_result_t *res);

#endif
