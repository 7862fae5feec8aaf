/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tierfill: gets a namespace's cached prefixes demoted to kvshared's tier 2
 * (--host-tier), as other traffic would, so that a benchmark or a test can
 * then ask for them again and time or check their promotion.
 *
 * Filler prompts go into another namespace: whole blocks of tokens no model
 * vocabulary holds (>= 2^31), a chain of their own per commit, their KV left
 * as the pool had it (a cache never reads what it holds). Each Alloc of a
 * full pool makes kvshared demote its least recently used unpinned blocks to
 * tier 2. The filling stops once the daemon's own count says the namespace
 * has no block left in the pool and the wanted number in tier 2: the state
 * is read from Stats, never assumed.
 */
#ifndef KVS_WORKER_TIERFILL_H
#define KVS_WORKER_TIERFILL_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare.h"

typedef struct tierfill_result {
    uint32_t filler_blocks; /* committed in the filler namespace by this call */
    uint32_t pool_blocks;   /* of the namespace, in the pool at the end (0 on success) */
    uint32_t tier2_blocks;  /* of the namespace, in tier 2 at the end */
} tierfill_result_t;

/* Writes filler prompts of c's geometry into namespace filler_ns until
 * namespace ns has no block in the pool and at least want_tier2 blocks in
 * tier 2. *serial numbers the filler chains (each call goes on from where
 * the last one stopped, so no filler prompt is a prefix hit). c may map the
 * pool or not (KVS_NO_MAP). res (may be NULL) says what it did.
 * Errors: KVS_EINVAL (NULL, ns equal to filler_ns), KVS_ENOTSUP (kvshared
 * has no tier 2), KVS_ENOTFOUND (ns unknown to kvshared, or its blocks did
 * not all reach tier 2 after the pool and tier 2 were filled over: tier 2
 * dropped some, or they are pinned), KVS_ENOMEM, and kvs_alloc's,
 * kvs_commit's and kvs_stats' errors. err (may be NULL) gets a message. */
int tierfill_demote(kvs_client_t *c, const char *ns, const char *filler_ns, uint32_t want_tier2,
                    uint32_t *serial, tierfill_result_t *res, char *err, size_t err_len);

#endif /* KVS_WORKER_TIERFILL_H */
