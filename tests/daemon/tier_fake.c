/* SPDX-License-Identifier: Apache-2.0 */
#include "tier_fake.h"

#include <stdbool.h>
#include <stdlib.h>

#include "kvshare_status.h"

typedef struct fake_medium {
    tier_medium_t m;
    uv_loop_t *loop;
    tier_medium_t *inner;
    tier_fake_knobs_t *knobs;
    tier_medium_stats_t st;
} fake_medium_t;

typedef struct fake_batch {
    uv_timer_t timer;
    fake_medium_t *fm;
    bool put, fail;
    const uint32_t *pool_ids, *slots;
    size_t n;
    tier_medium_done_fn done;
    void *arg;
} fake_batch_t;

static void batch_free(uv_handle_t *h)
{
    free(h->data);
}

static void inner_done(void *arg, const tier_medium_result_t *res)
{
    fake_batch_t *b = arg;
    b->done(b->arg, res);
    uv_close((uv_handle_t *)&b->timer, batch_free);
}

/* The delay is over: fail, or let the inner medium copy. */
static void on_timer(uv_timer_t *t)
{
    fake_batch_t *b = t->data;
    fake_medium_t *fm = b->fm;
    tier_medium_result_t res = {.status = KVS_EIO};
    int rc = KVS_EIO;
    if (!b->fail)
        rc = b->put ? fm->inner->ops->put(fm->inner, b->pool_ids, b->slots, b->n, inner_done, b)
                    : fm->inner->ops->get(fm->inner, b->pool_ids, b->slots, b->n, inner_done, b);
    if (rc == 0)
        return;
    fm->st.failures++;
    fm->knobs->failed++;
    b->done(b->arg, &res);
    uv_close((uv_handle_t *)&b->timer, batch_free);
}

static int start(tier_medium_t *m, bool put, const uint32_t *pool_ids, const uint32_t *slots,
                 size_t n, tier_medium_done_fn done, void *arg)
{
    fake_medium_t *fm = (fake_medium_t *)m;
    fake_batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return KVS_ENOMEM;
    *b = (fake_batch_t){.fm = fm,
                        .put = put,
                        .pool_ids = pool_ids,
                        .slots = slots,
                        .n = n,
                        .done = done,
                        .arg = arg};
    if (fm->knobs->fail_next > 0) {
        fm->knobs->fail_next--;
        b->fail = true;
    }
    uv_timer_init(fm->loop, &b->timer);
    b->timer.data = b;
    uv_timer_start(&b->timer, on_timer, fm->knobs->delay_ms, 0);
    fm->knobs->batches++;
    if (put)
        fm->st.puts++;
    else
        fm->st.gets++;
    return 0;
}

static int fake_put(tier_medium_t *m, const uint32_t *pool_ids, const uint32_t *slots, size_t n,
                    tier_medium_done_fn done, void *arg)
{
    return start(m, true, pool_ids, slots, n, done, arg);
}

static int fake_get(tier_medium_t *m, const uint32_t *pool_ids, const uint32_t *slots, size_t n,
                    tier_medium_done_fn done, void *arg)
{
    return start(m, false, pool_ids, slots, n, done, arg);
}

static void fake_drop(tier_medium_t *m, const uint32_t *slots, size_t n)
{
    fake_medium_t *fm = (fake_medium_t *)m;
    fm->knobs->dropped += (uint32_t)n;
    fm->inner->ops->drop(fm->inner, slots, n);
}

/* Its own batches and failures; the blocks the inner medium copied. */
static void fake_stats(const tier_medium_t *m, tier_medium_stats_t *out)
{
    const fake_medium_t *fm = (const fake_medium_t *)m;
    tier_medium_stats_t in;
    fm->inner->ops->stats(fm->inner, &in);
    *out = fm->st;
    out->blocks = in.blocks;
}

static void fake_close(tier_medium_t *m)
{
    fake_medium_t *fm = (fake_medium_t *)m;
    tier_medium_close(fm->inner);
    free(fm);
}

static const tier_medium_ops_t fake_ops = {
    .name = "fake",
    .put = fake_put,
    .get = fake_get,
    .drop = fake_drop,
    .stats = fake_stats,
    .close = fake_close,
};

int tier_fake_open(uv_loop_t *loop, tier_medium_t *inner, tier_fake_knobs_t *knobs,
                   tier_medium_t **out)
{
    fake_medium_t *fm = calloc(1, sizeof(*fm));
    if (!fm)
        return KVS_ENOMEM;
    fm->m.ops = &fake_ops;
    fm->m.capacity = inner->capacity;
    fm->loop = loop;
    fm->inner = inner;
    fm->knobs = knobs;
    *out = &fm->m;
    return 0;
}
