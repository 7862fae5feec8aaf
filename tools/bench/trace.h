/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace: a request trace in the JSONL format of the Mooncake conversation
 * trace, and its expansion into token ids.
 *
 * One JSON object per line, with the fields
 *   timestamp      arrival time, ms from the start of the trace
 *   input_length   prompt length in tokens
 *   output_length  reply length in tokens
 *   hash_ids       prefix-block ids, one per 512-token block of the prompt;
 *                  equal ids at equal positions mean equal prompt content
 * Other fields are ignored. The parser reads exactly this shape (numbers are
 * non-negative integers, the array holds integers), nothing more general.
 *
 * Expansion: hash id h stands for TRACE_HASH_TOKENS token ids that depend on
 * h only (a fixed pseudo-random function of (h, k)), so equal ids give equal
 * tokens; a prompt is the concatenation of its ids' tokens cut to
 * input_length (and to TRACE_HASH_TOKENS x number of ids).
 */
#ifndef KVS_TRACE_H
#define KVS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define TRACE_HASH_TOKENS 512u
#define TRACE_VOCAB       128000u

typedef struct trace_req {
    uint64_t timestamp_ms;
    uint32_t input_length;
    uint32_t output_length;
    size_t first_hash; /* index of its first id in trace_t.hash_ids */
    uint32_t n_hash;
} trace_req_t;

typedef struct trace {
    trace_req_t *reqs;
    size_t n_reqs;
    uint32_t *hash_ids; /* all requests' ids, back to back */
    size_t n_hash_ids;
    uint32_t max_hash_id;
} trace_t;

/* Reads at most max_reqs requests (0: all) from the file at path into *out
 * (free with trace_free). Errors: KVS_EINVAL (a line that is not of the
 * format; err gets "path:line: what"), KVS_EIO (cannot read the file; err
 * gets strerror), KVS_ENOMEM. On error *out is left empty. */
int trace_load(const char *path, size_t max_reqs, trace_t *out, char *err, size_t err_len);

/* Frees what trace_load allocated; accepts a zeroed or freed trace. */
void trace_free(trace_t *t);

/* Prompt length in tokens of request r: input_length, at most
 * TRACE_HASH_TOKENS x its number of ids. */
size_t trace_prompt_tokens(const trace_t *t, const trace_req_t *r);

/* For each id slot of the trace (an index into hash_ids), the index of the
 * next request whose prompt has that id (the same prefix: ids name
 * prefixes), or SIZE_MAX when none does: next[] of n_hash_ids entries, the
 * caller frees it. The trace's own future, for hint oracles. Errors:
 * KVS_ENOMEM. */
int trace_next_uses(const trace_t *t, size_t **next);

/* Writes the trace_prompt_tokens(t, r) token ids of r's prompt into tokens. */
void trace_expand(const trace_t *t, const trace_req_t *r, uint32_t *tokens);

#endif
