/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tier chain's hold and failure paths, through a medium that delays and
 * fails on demand (tier_fake.h) in place of the host tier: a request that
 * waits for copies is held until they end; a copy that fails loses nothing
 * (the blocks stay where they were, or are dropped as evictions, the pins
 * go, the invariants hold), and for a while after it nothing moves between
 * the tiers.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "frame.h"
#include "kvshare_status.h"
#include "log.h"
#include "kvshared.h"
#include "session_io.h"
#include "store.h"
#include "tier.h"
#include "tier_fake.h"
#include "test_server.h"

#define BT   4
#define POOL 4
#define T2   8

static uv_loop_t loop;
static server_t *srv;
static tier_fake_knobs_t knobs;

static void setup(void)
{
    server_config_t cfg;
    log_level = LOG_LEVEL_ERROR; /* the failures below are logged as errors */
    test_server_config(&cfg, BT, POOL);
    cfg.host_tier_bytes = T2 * geometry_block_bytes(&cfg.geometry);
    srv = test_server_open(&loop, &cfg);
    ck_assert_uint_eq(srv->tier2_blocks, T2);
    memset(&knobs, 0, sizeof(knobs));
    knobs.delay_ms = 5;
    tier_medium_t *host = store_swap_medium(srv->store, NULL), *fake;
    ck_assert_ptr_nonnull(host);
    ck_assert_int_eq(tier_fake_open(&loop, host, &knobs, &fake), 0);
    ck_assert_ptr_null(store_swap_medium(srv->store, fake));
}

static void teardown(void)
{
    test_server_close(&loop, srv, false); /* (and the fake medium's timers) */
    srv = NULL;
}

/* free + writing + cached == pool; the index checks out; no pins but
 * those the sessions hold. */
static void check_invariants(uint64_t session_pins)
{
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    ck_assert_uint_eq(c.free + c.writing + c.cached, POOL);
    ck_assert_int_eq(radix_check(srv->index), 0);
    uint32_t pinned = radix_pinned_blocks(srv->index);
    ck_assert_uint_le(pinned, session_pins);
    if (session_pins == 0)
        ck_assert_uint_eq(pinned, 0);
}

static void send_req(session_t *s, Kvshare__Request *req, uint64_t id)
{
    frame_buf_t f = {0};
    req->id = id;
    ck_assert_int_eq(frame_append_request(&f, req), 0);
    ck_assert_int_eq(session_feed(s, f.data, f.len), 0);
    frame_buf_release(&f);
}

/* The next reply, running the loop (the medium's timers) until it comes. */
static Kvshare__Response *reply(session_t *s)
{
    const uint8_t *body;
    uint32_t len;
    for (int turns = 0; frame_next(&s->out, UINT32_MAX, &body, &len) != 1; turns++) {
        ck_assert_int_lt(turns, 1000);
        uv_run(&loop, UV_RUN_ONCE);
    }
    Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
    ck_assert_ptr_nonnull(r);
    if (s->out.head == s->out.len)
        frame_buf_reset(&s->out);
    return r;
}

static void send_alloc(session_t *s, uint32_t n, uint64_t id)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = n;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    send_req(s, &req, id);
}

static void send_lookup(session_t *s, const uint32_t *tokens, size_t n, uint64_t id)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.tokens.data = (uint8_t *)tokens;
    lk.tokens.len = n * 4;
    lk.pin = true;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    send_req(s, &req, id);
}

static int alloc(session_t *s, uint32_t n, uint32_t *ids)
{
    send_alloc(s, n, 1);
    Kvshare__Response *r = reply(s);
    int status = -(int)r->status;
    if (status == 0)
        memcpy(ids, r->alloc->block_ids, n * 4);
    kvshare__response__free_unpacked(r, NULL);
    return status;
}

static void commit_release(session_t *s, const uint32_t *tokens, const uint32_t *ids, size_t n)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = n * BT * 4;
    cm.block_ids = (uint32_t *)ids;
    cm.n_block_ids = n;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    send_req(s, &req, 2);
    Kvshare__Response *r = reply(s);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->commit->n_committed, n);
    kvshare__response__free_unpacked(r, NULL);

    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    rl.block_ids = (uint32_t *)ids;
    rl.n_block_ids = n;
    req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
    req.release = &rl;
    send_req(s, &req, 3);
    r = reply(s);
    ck_assert_int_eq(r->status, 0);
    kvshare__response__free_unpacked(r, NULL);
}

/* A prompt of POOL blocks, cached in the pool, unpinned. */
static void fill_pool(uint32_t *tokens)
{
    session_t *w;
    uint32_t ids[POOL];
    ck_assert_int_eq(session_new(srv, &w), 0);
    for (uint32_t i = 0; i < POOL * BT; i++)
        tokens[i] = 7000 + i;
    ck_assert_int_eq(alloc(w, POOL, ids), 0);
    commit_release(w, tokens, ids, POOL);
    session_close(w, "done");
    check_invariants(0);
}

/* A failed demotion: the blocks stay in the pool where they were; the
 * Alloc that waited for the copies runs again and, with the tiers resting,
 * evicts instead (the dropped blocks are BlockRemoved, counted). */
START_TEST(test_failed_demotion_loses_nothing)
{
    uint32_t tokens[POOL * BT], ids[2];
    fill_pool(tokens);
    session_t *s;
    ck_assert_int_eq(session_new(srv, &s), 0);
    knobs.fail_next = 1;
    send_alloc(s, 2, 1);
    /* Held: no reply until the copies end. */
    ck_assert_uint_eq(s->out.len - s->out.head, 0);
    ck_assert(session_held(s));
    ck_assert_uint_eq(radix_busy_blocks(srv->index), 2);
    Kvshare__Response *r = reply(s);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->alloc->n_block_ids, 2);
    memcpy(ids, r->alloc->block_ids, sizeof(ids));
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(knobs.failed, 1);
    ck_assert_uint_eq(srv->metrics.tier_copy_failures, 1);
    ck_assert_uint_eq(srv->metrics.tier_demotions, 0);
    ck_assert_uint_eq(srv->metrics.evictions, 2);
    ck_assert_uint_eq(radix_tier2_blocks(srv->index), 0);
    ck_assert_uint_eq(radix_busy_blocks(srv->index), 0);
    ck_assert_uint_eq(radix_cached_blocks(srv->index), 2);
    ck_assert(!store_tiers_usable(srv->store));
    check_invariants(0);

    /* The rest of the prompt is still there. */
    send_lookup(s, tokens, POOL * BT, 4);
    r = reply(s);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->lookup->n_block_ids, 2);
    kvshare__response__free_unpacked(r, NULL);
    session_close(s, "done");
    check_invariants(0);
}
END_TEST

/* A failed promotion: the blocks go back to their tier-2 ids, the lookup's
 * pins go, and the lookup answers with what the pool holds. Once the tiers
 * are usable again the same lookup promotes them, held until the copies
 * end. A session that closes while its copy fails leaves nothing behind. */
START_TEST(test_failed_promotion_loses_nothing)
{
    uint32_t tokens[POOL * BT], ids[POOL];
    fill_pool(tokens);
    session_t *s, *t;
    ck_assert_int_eq(session_new(srv, &s), 0);
    ck_assert_int_eq(session_new(srv, &t), 0);
    /* Room for a whole pool: the prompt goes to tier 2. */
    ck_assert_int_eq(alloc(s, POOL, ids), 0);
    ck_assert_uint_eq(radix_tier2_blocks(srv->index), POOL);
    ck_assert_uint_eq(srv->metrics.tier_demotions, POOL);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    rl.block_ids = ids;
    rl.n_block_ids = POOL;
    req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
    req.release = &rl;
    send_req(s, &req, 2);
    kvshare__response__free_unpacked(reply(s), NULL);
    check_invariants(0);

    knobs.fail_next = 1;
    send_lookup(s, tokens, POOL * BT, 3);
    ck_assert(session_held(s));
    ck_assert_uint_eq(radix_pinned_blocks(srv->index), POOL); /* the job holds them */
    Kvshare__Response *r = reply(s);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->lookup->n_block_ids, 0); /* nothing in the pool, nothing moved */
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(srv->metrics.tier_copy_failures, 1);
    ck_assert_uint_eq(srv->metrics.tier_promotions, 0);
    ck_assert_uint_eq(radix_tier2_blocks(srv->index), POOL);
    check_invariants(0);

    /* The tiers rest, then the same lookup promotes, held meanwhile. */
    srv->store->medium_down_until = 0;
    send_lookup(s, tokens, POOL * BT, 4);
    ck_assert(session_held(s));
    r = reply(s);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->lookup->n_block_ids, POOL);
    for (size_t i = 0; i < POOL; i++)
        ck_assert_uint_lt(r->lookup->block_ids[i], POOL);
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(srv->metrics.tier_promotions, POOL);
    ck_assert_uint_eq(radix_tier2_blocks(srv->index), 0);
    check_invariants(POOL);
    session_close(s, "done");
    check_invariants(0);

    /* A session gone before its failing copy ends: its pins go all the
     * same. The prompt goes back to tier 2 first. */
    ck_assert_int_eq(alloc(t, POOL, ids), 0);
    rl.block_ids = ids;
    send_req(t, &req, 5);
    kvshare__response__free_unpacked(reply(t), NULL);
    ck_assert_uint_eq(radix_tier2_blocks(srv->index), POOL);
    knobs.fail_next = 1;
    send_lookup(t, tokens, POOL * BT, 6);
    ck_assert(session_held(t));
    session_close(t, "gone");
    while (srv->tier_jobs > 0)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_uint_eq(srv->metrics.tier_copy_failures, 2);
    ck_assert_uint_eq(radix_tier2_blocks(srv->index), POOL);
    check_invariants(0);

    /* The medium's own count: 2 demotions and 1 promotion copied (3 x POOL
     * blocks), 2 promotions failed. */
    tier_medium_stats_t ms;
    srv->store->medium->ops->stats(srv->store->medium, &ms);
    ck_assert_str_eq(srv->store->medium->ops->name, "fake");
    ck_assert_uint_eq(ms.puts, 2);
    ck_assert_uint_eq(ms.gets, 3);
    ck_assert_uint_eq(ms.failures, 2);
    ck_assert_uint_eq(ms.blocks, 3 * POOL);
}
END_TEST

/* Blocks that tier 2 drops for good reach the medium's drop. */
START_TEST(test_tier2_drops_reach_the_medium)
{
    uint32_t tokens[POOL * BT], ids[POOL];
    fill_pool(tokens);
    session_t *s;
    ck_assert_int_eq(session_new(srv, &s), 0);
    ck_assert_int_eq(alloc(s, POOL, ids), 0); /* the prompt goes to tier 2 */
    ck_assert_uint_eq(knobs.dropped, 0);
    session_close(s, "done");
    uint32_t ns;
    size_t cleared = 0;
    ck_assert_int_eq(radix_ns_find(srv->index, SERVER_DEFAULT_NS, &ns), 0);
    ck_assert_int_eq(store_clear(srv->store, ns, SIZE_MAX, &cleared), 0);
    ck_assert_uint_eq(cleared, POOL);
    ck_assert_uint_eq(knobs.dropped, POOL);
    check_invariants(0);
}
END_TEST

static Suite *tier_medium_suite(void)
{
    Suite *s = suite_create("tier_medium");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_failed_demotion_loses_nothing);
    tcase_add_test(tc, test_failed_promotion_loses_nothing);
    tcase_add_test(tc, test_tier2_drops_reach_the_medium);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(tier_medium_suite)
