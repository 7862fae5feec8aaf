/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker: one request through the model, with its KV in blocks that a cache
 * may share between processes.
 *
 *     lookup(prompt[0..n-1))  -> m matched full blocks (pinned)      [cache]
 *     alloc(rest)             -> block ids for the other positions   [cache]
 *     prefill prompt[m*16..n) into the blocks -> logits -> token 1
 *     commit the prompt's full blocks                                [cache]
 *     decode tokens 2..N greedily, one forward each
 *     release every block of the request                             [cache]
 *
 * The lookup sees the prompt less its last token, so at least one token is
 * computed and its logits give the first generated token. The cache is a set
 * of callbacks: the private cache (no sharing: lookups miss, ids come from the
 * store's own free stack) is the reference that any shared cache must match
 * bit for bit.
 */
#ifndef KVS_WORKER_WORKER_H
#define KVS_WORKER_WORKER_H

#include <stdint.h>

#include "kvshare_status.h"
#include "kvstore.h"
#include "model.h"

typedef struct worker_cache_ops {
    /* Finds the longest cached prefix of tokens[0..n) in full blocks, pins it
     * and writes at most max_blocks ids to ids; *matched_blocks gets the count.
     * A cache that cannot answer reports a miss (0), not an error. */
    int (*lookup)(void *ctx, const uint32_t *tokens, uint32_t n, uint32_t *ids, uint32_t max_blocks,
                  uint32_t *matched_blocks);
    /* Grants n writable blocks, all or nothing. */
    int (*alloc)(void *ctx, uint32_t n, uint32_t *ids);
    /* Publishes the first n_blocks blocks of a sequence (tokens[0..n_blocks *
     * block_tokens), ids[0..n_blocks)), after their KV is written; ids[0..
     * n_matched) came from lookup. It may replace an id with the cache's
     * canonical block of the same prefix (bitwise the same KV); the request
     * then reads that block and the callback keeps whatever it must release.
     * Optional: a failure is counted, never fatal. */
    int (*commit)(void *ctx, const uint32_t *tokens, uint32_t n_blocks, uint32_t n_matched,
                  uint32_t *ids);
    /* Gives back every block of the request: ids[0..n_matched) came from
     * lookup, ids[n_matched..n) from alloc. */
    int (*release)(void *ctx, const uint32_t *ids, uint32_t n_matched, uint32_t n);
} worker_cache_ops_t;

typedef struct worker {
    const model_t *model;
    kvstore_t *store; /* the KV, when tp is 0 or 1 */
    /* A tensor-parallel group (tp > 1): rank r's shard of every block is in
     * shards[r] (model_forward_tp); the callbacks stand for the group. */
    kvstore_t *const *shards;
    uint32_t tp;
    const worker_cache_ops_t *ops;
    void *ctx;
} worker_t;

/* What one request did. Times are seconds, from the start of worker_run. */
/* Where a request's KV lived. */
typedef enum worker_cache_kind {
    WORKER_CACHE_PRIVATE,  /* the worker's own store, no sharing */
    WORKER_CACHE_SHARED,   /* the daemon's pool */
    WORKER_CACHE_FALLBACK, /* sharing was meant, the daemon was not usable: private */
} worker_cache_kind_t;

typedef struct worker_result {
    worker_cache_kind_t cache;
    uint32_t prompt_tokens;
    uint32_t matched_tokens; /* prompt tokens whose KV came from the cache */
    uint32_t prefill_tokens; /* prompt tokens computed */
    uint32_t generated;      /* tokens generated */
    uint32_t blocks;         /* blocks in the request's table */
    int commit_status;       /* 0, or the commit callback's error */
    double ttft_s;           /* time to the first generated token */
    double prefill_s;        /* prefill forward only */
    double decode_s;         /* the decode steps after the first token */
    double total_s;
    uint64_t logits_hash; /* XXH3-64 of the final logits' bytes */
} worker_result_t;

/* The private cache over a private kvstore: ctx is the kvstore_t. */
extern const worker_cache_ops_t worker_private_ops;

/* Blocks a request of n prompt tokens and decode generated tokens needs:
 * the last generated token's KV is never written. */
uint32_t worker_blocks_needed(uint32_t block_tokens, uint32_t n, uint32_t decode);

/* Runs one request: prompt[0..n) (n >= 1), then decode greedy tokens into
 * generated[0..decode). logits (vocab floats) gets the logits that chose the
 * last generated token (with decode 0, those after the prompt). Every block is
 * released before it returns, on success or error.
 * Errors: KVS_EINVAL, KVS_ENOMEM, and the cache's alloc errors (KVS_EPOOLFULL...). */
int worker_run(const worker_t *w, const uint32_t *prompt, uint32_t n, uint32_t decode,
               uint32_t *generated, float *logits, worker_result_t *res);

/* XXH3-64 of a logits vector's bytes: a fingerprint that two runs compare. */
uint64_t worker_logits_hash(const float *logits, uint32_t vocab);

#endif /* KVS_WORKER_WORKER_H */
