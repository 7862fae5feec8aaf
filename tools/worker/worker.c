/* SPDX-License-Identifier: Apache-2.0 */
#include "worker.h"

#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "now.h"

static int private_lookup(void *ctx, const uint32_t *tokens, uint32_t n, uint32_t *ids,
                          uint32_t max_blocks, uint32_t *matched_blocks)
{
    (void)ctx, (void)tokens, (void)n, (void)ids, (void)max_blocks;
    *matched_blocks = 0;
    return 0;
}

static int private_alloc(void *ctx, uint32_t n, uint32_t *ids)
{
    return kvstore_alloc(ctx, n, ids);
}

static int private_commit(void *ctx, const uint32_t *tokens, uint32_t n_blocks, uint32_t n_matched,
                          uint32_t *ids)
{
    (void)ctx, (void)tokens, (void)n_blocks, (void)n_matched, (void)ids;
    return 0;
}

static int private_release(void *ctx, const uint32_t *ids, uint32_t n_matched, uint32_t n)
{
    return kvstore_release(ctx, n - n_matched, ids + n_matched);
}

const worker_cache_ops_t worker_private_ops = {
    .lookup = private_lookup,
    .alloc = private_alloc,
    .commit = private_commit,
    .release = private_release,
};

uint32_t worker_blocks_needed(uint32_t block_tokens, uint32_t n, uint32_t decode)
{
    uint64_t positions = (uint64_t)n + (decode ? decode - 1 : 0);

    return (uint32_t)((positions + block_tokens - 1) / block_tokens);
}

uint64_t worker_logits_hash(const float *logits, uint32_t vocab)
{
    return XXH3_64bits(logits, (size_t)vocab * sizeof(float));
}

int worker_run(const worker_t *w, const uint32_t *prompt, uint32_t n, uint32_t decode,
               uint32_t *generated, float *logits, worker_result_t *res)
{
    const model_config_t *c;
    const kvstore_t *const *kv;
    uint32_t *table = NULL, matched = 0, blocks, held = 0, full, bt, tok, tp;
    double t0, t1;
    int rc;

    if (!w || !w->model || (w->tp > 1 ? !w->shards : !w->store) || !w->ops || !prompt || !n ||
        (decode && !generated) || !logits || !res)
        return KVS_EINVAL;
    c = &w->model->cfg;
    bt = c->block_tokens;
    tp = w->tp > 1 ? w->tp : 1;
    kv = tp > 1 ? (const kvstore_t *const *)w->shards : (const kvstore_t *const *)&w->store;
    *res = (worker_result_t){.prompt_tokens = n};
    blocks = worker_blocks_needed(bt, n, decode);
    table = malloc(sizeof(*table) * blocks);
    if (!table)
        return KVS_ENOMEM;

    t0 = now_s();
    /* Only full blocks of prompt[0..n-1) can match, so matched < n. */
    rc = w->ops->lookup(w->ctx, prompt, n - 1, table, (n - 1) / bt, &matched);
    if (rc < 0 || matched > (n - 1) / bt)
        matched = 0; /* a cache that fails is a miss */
    held = matched;
    rc = w->ops->alloc(w->ctx, blocks - matched, table + matched);
    if (rc < 0)
        goto out;
    held = blocks;

    res->matched_tokens = matched * bt;
    res->prefill_tokens = n - matched * bt;
    res->blocks = blocks;
    t1 = now_s();
    rc = model_forward_tp(w->model, kv, tp, table, blocks, prompt + matched * bt, matched * bt,
                          n - matched * bt, logits);
    if (rc < 0)
        goto out;
    res->prefill_s = now_s() - t1;
    res->ttft_s = now_s() - t0;
    if (decode) {
        generated[0] = model_argmax(logits, c->vocab);
        res->generated = 1;
    }

    full = n / bt;
    if (full > matched)
        res->commit_status = w->ops->commit(w->ctx, prompt, full, matched, table);

    t1 = now_s();
    for (uint32_t i = 1; i < decode; i++) {
        tok = generated[i - 1];
        rc = model_forward_tp(w->model, kv, tp, table, blocks, &tok, n + i - 1, 1, logits);
        if (rc < 0)
            goto out;
        generated[i] = model_argmax(logits, c->vocab);
        res->generated = i + 1;
    }
    res->decode_s = now_s() - t1;
    res->total_s = now_s() - t0;
    res->logits_hash = worker_logits_hash(logits, c->vocab);
    rc = 0;
out:
    if (held) {
        int rrc = w->ops->release(w->ctx, table, matched, held);
        if (rc == 0 && rrc < 0)
            rc = rrc;
    }
    free(table);
    return rc;
}
