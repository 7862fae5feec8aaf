/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload: the prompts a worker runs, read from a file or generated.
 *
 * The generated workload is chat-like: each request is a long system prompt
 * (one of `systems` distinct ones, taken in turn) followed by a question of its
 * own, so requests share long prefixes and differ at the end, as in serving.
 */
#ifndef KVS_WORKER_WORKLOAD_H
#define KVS_WORKER_WORKLOAD_H

#include <stdint.h>

#include "kvshare_status.h"

typedef struct workload {
    uint32_t count;    /* prompts */
    uint32_t **prompt; /* prompt[i][0..len[i]) */
    uint32_t *len;
} workload_t;

typedef struct workload_chat_opts {
    uint32_t requests;
    uint32_t systems;         /* distinct system prompts, >= 1 */
    uint32_t system_tokens;   /* length of each system prompt */
    uint32_t question_tokens; /* mean question length; each is in [q/2, q/2 + q] */
    uint32_t vocab;
    uint64_t seed;
    uint32_t first; /* index of the first request: workers split one workload */
} workload_chat_opts_t;

/* Generates a chat-like workload: request i (counting from o->first) uses
 * system prompt i % systems and a question drawn from (seed, i). The same
 * options give the same tokens in any process. The caller frees *out with
 * workload_free. Errors: KVS_EINVAL (requests, systems or vocab 0, or a
 * prompt of 0 tokens), KVS_ENOMEM. */
int workload_chat(const workload_chat_opts_t *o, workload_t **out);

/* Reads prompts from a text file: one prompt per line, token ids in decimal
 * separated by spaces or commas; empty lines and lines starting with '#' are
 * skipped. Errors: KVS_EINVAL (a token >= vocab, a malformed number, no
 * prompt), KVS_EIO (cannot read the file), KVS_ENOMEM. */
int workload_load(const char *path, uint32_t vocab, workload_t **out);

/* Accepts NULL. */
void workload_free(workload_t *w);

#endif /* KVS_WORKER_WORKLOAD_H */
