/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvscache: a worker's KV in kvshared's pool, shared with other workers, with
 * the worker's own memory as the fallback.
 *
 *     kvscache_run(prompt)
 *       |-- daemon usable?  (connected, or reconnects now; pool geometry = model's)
 *       |     yes: worker_run over the mapped pool, the callbacks below
 *       |          lookup  -> kvs_lookup(prompt less its last token, pin)
 *       |          alloc   -> kvs_alloc(the rest: prompt tail and decode blocks)
 *       |          commit  -> kvs_commit(the prompt's full blocks: the hit ones first)
 *       |          release -> kvs_release(everything, one call)
 *       |          the run counts only if that last Release succeeded
 *       '-- otherwise, or when the shared run did not count: worker_run again
 *           over a private store (no sharing), the same bits
 *
 * A tensor-parallel group (kvscache_opts_t.tp > 1) is the same with one
 * connection per rank for the shards and the group's scheduler for the calls.
 *
 * Why a shared run must end with a successful Release: a session that ends
 * (timeout, daemon hang-up) gives its blocks back to the pool, where another
 * worker may take and overwrite them while this one still reads them. A
 * Release that succeeds proves that the session, hence every block of the
 * request, lived to the end. Within a request no call is made once the
 * connection has dropped, so the client never reconnects (and maps the pool
 * anew) under a request's feet; reconnects happen between requests.
 *
 * Decode-phase blocks (the prompt's partial last block and the positions of
 * generated tokens) are granted by the same Alloc as the prompt's blocks and
 * are never committed: WRITING, private to this worker, released at the end.
 *
 * Commit: a request that matched m blocks commits all the prompt's full
 * blocks in one call, its table as it is: the m blocks its lookup pinned
 * first (kvshared accepts a cached block the session pins at the prefix it
 * holds, and adds no pin to it), then the blocks it computed. Nothing is
 * allocated for the hit part, so a full pool does not fail the commit. A
 * block another worker committed first comes back as canonical: the request
 * reads that one from then on (the same bits) and its own copy goes back at
 * the end.
 */
#ifndef KVS_WORKER_KVSCACHE_H
#define KVS_WORKER_KVSCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare_status.h"
#include "model.h"
#include "worker.h"

typedef struct kvscache kvscache_t;

/* The largest tensor-parallel group a kvscache simulates. */
#define KVSCACHE_MAX_TP 8

typedef struct kvscache_opts {
    const char *socket_path; /* NULL: libkvshare's default path */
    const char *ns;          /* namespace; NULL: "default" */
    const char *worker_name; /* shown in kvshared's logs; may be NULL */
    int timeout_ms;          /* per call; 0: 1000 */
    int reconnect_ms;        /* least time between reconnects; 0: 1000 */
    uint32_t private_blocks; /* the fallback store: at least what one request needs */
    /* 0 or 1: one worker. Above: a tensor-parallel group of tp ranks in
     * this process (model_forward_tp), against a kvshared --devices 0-(tp-1)
     * whose geometry is one rank's (kv_heads / tp): a scheduler connection
     * (KVS_GROUP_SCHEDULER) looks up, allocates, commits for the group and
     * releases; rank r's connection (KVS_RANK) maps device r's pool, where
     * rank r reads and writes its heads' shard of every block. The private
     * fallback computes as one rank: the same bits. */
    uint32_t tp;
} kvscache_opts_t;

typedef struct kvscache_stats {
    uint64_t shared;    /* requests whose KV lived in the pool */
    uint64_t fallbacks; /* requests computed privately instead */
    uint64_t lost;      /* of those: a shared run that did not count */
    uint64_t commits;   /* Commit calls that succeeded */
    uint64_t commit_errors;
    uint64_t duplicates; /* committed blocks another worker had committed first */
} kvscache_stats_t;

/* Connects to kvshared (a daemon that is down is not an error: requests run
 * privately until it answers) and checks that the pool fits the model: host
 * backend (the model computes on the CPU), fp32, the model's layers, kv_heads,
 * head_dim and block_tokens, and the layout of gpu/geometry.h. The model must
 * outlive the cache. The caller frees *out with kvscache_free.
 * Errors: KVS_EINVAL (NULL, private_blocks 0), KVS_ENOTSUP (the daemon's pool
 * does not fit the model; err says what it serves and how to start it),
 * KVS_ENOMEM. err (may be NULL) gets a message on error. */
int kvscache_open(const kvscache_opts_t *o, const model_t *m, kvscache_t **out, char *err,
                  size_t err_len);

/* Accepts NULL. Closes the connection: the daemon releases what it holds. */
void kvscache_free(kvscache_t *kc);

/* Runs one request as worker_run does (same arguments and results), through
 * the daemon when it is usable, privately otherwise; res->cache says which.
 * Errors: those of worker_run on the private store (KVS_EINVAL, KVS_ENOMEM,
 * KVS_EPOOLFULL when private_blocks is too small); a daemon error never is. */
int kvscache_run(kvscache_t *kc, const uint32_t *prompt, uint32_t n, uint32_t decode,
                 uint32_t *generated, float *logits, worker_result_t *res);

/* Counters since kvscache_open. */
void kvscache_stats(const kvscache_t *kc, kvscache_stats_t *out);

/* Why the last request ran privately (daemon down, geometry, a lost session),
 * or "" when it was shared. Owned by kc, valid until the next call. */
const char *kvscache_note(const kvscache_t *kc);

#endif /* KVS_WORKER_KVSCACHE_H */
