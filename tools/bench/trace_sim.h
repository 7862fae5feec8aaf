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
    bool check; /* radix_check() at the end */
} sim_params_t;

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
