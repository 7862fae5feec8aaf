/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sessions and handlers, driven through session_feed on sessions without a
 * socket: the same dispatch, handlers and release paths as the daemon, with
 * the block invariants checked after every step:
 *   free + writing + cached == pool blocks;
 *   each cached block's refcount == the pins live sessions hold on it;
 *   a block is WRITING iff exactly one session lists it as written.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "check_main.h"
#include "dispatch.h"
#include "inflight.h"
#include "kvshare_status.h"
#include "kvshare_version.h"
#include "log.h"
#include "peer.h"
#include "kvshared.h"
#include "namespaces.h"
#include "session_io.h"
#include "store.h"
#include "test_tmp.h"
#include "test_server.h"

#define BT   4
#define POOL 16

static uv_loop_t loop;
static server_t *srv;

static void setup(void)
{
    server_config_t cfg;
    log_level = LOG_LEVEL_WARN;
    test_server_config(&cfg, BT, POOL);
    cfg.max_frame = 1 << 16;
    /* Claims outlast any pause of a loaded machine between two steps of a
     * test; test_claims_have_a_lease_and_a_bound sets its own lease. */
    cfg.claim_lease_ms = 600000;
    srv = test_server_open(&loop, &cfg);
    ck_assert_uint_eq(srv->num_blocks, POOL);
}

static void teardown(void)
{
    test_server_close(&loop, srv, false);
    srv = NULL;
}

static void check_invariants(void)
{
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    ck_assert_uint_eq(c.free + c.writing + c.cached, c.total);
    ck_assert_int_eq(radix_check(srv->index), 0);
    uint32_t writing = 0;
    for (uint32_t b = 0; b < srv->num_blocks; b++) {
        pool_state_t st;
        ck_assert_int_eq(pool_state(srv->pool, b, &st), 0);
        uint32_t pins = 0;
        LIST_FOR_EACH (&srv->sessions, session_t, link, s)
            pins += session_pin_count(s, b);
        if (st == POOL_CACHED) {
            uint32_t ref = 99;
            ck_assert_int_eq(radix_block_refcount(srv->index, b, &ref), 0);
            ck_assert_msg(ref == pins, "block %u: refcount %u, sessions hold %u pins", b, ref,
                          pins);
        } else {
            ck_assert_msg(pins == 0, "block %u is not cached but pinned %u times", b, pins);
        }
        ck_assert_msg((st == POOL_WRITING) == (store_writer(srv->store, b) != NULL),
                      "block %u: state %d, writer %p", b, st, (void *)store_writer(srv->store, b));
        if (st == POOL_WRITING) {
            session_t *w = store_writer(srv->store, b);
            ck_assert_uint_eq(w->own.writing[store_writer_pos(srv->store, b)], b);
            writing++;
        }
    }
    ck_assert_uint_eq(writing, c.writing);
    /* Only WRITING blocks are declared in flight. */
    ck_assert_uint_le(inflight_declared(srv) - inflight_claimed(srv), writing);
}

static session_t *new_session(void)
{
    session_t *s;
    ck_assert_int_eq(session_new(srv, &s), 0);
    return s;
}

/* Sends one request, returns the decoded reply (caller frees). */
static Kvshare__Response *rpc(session_t *s, Kvshare__Request *req)
{
    frame_buf_t f = {0};
    const uint8_t *body;
    uint32_t len;
    req->id = 42;
    ck_assert_int_eq(frame_append_request(&f, req), 0);
    ck_assert_int_eq(session_feed(s, f.data, f.len), 0);
    frame_buf_release(&f);
    ck_assert_int_eq(frame_next(&s->out, UINT32_MAX, &body, &len), 1);
    Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 42);
    ck_assert_uint_eq(s->out.len - s->out.head, 0);
    frame_buf_reset(&s->out);
    if (r->status != 0)
        ck_assert_msg(r->message && r->message[0], "error without a message");
    return r;
}

static char last_msg[512];

static int finish(Kvshare__Response *r)
{
    int status = -(int)r->status;
    snprintf(last_msg, sizeof(last_msg), "%s", r->message ? r->message : "");
    kvshare__response__free_unpacked(r, NULL);
    check_invariants();
    return status;
}

static int do_lookup(session_t *s, const char *ns, const uint32_t *tokens, size_t n, int pin,
                     uint32_t *ids, size_t *n_blocks)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.ns = (char *)ns;
    lk.tokens.data = (uint8_t *)tokens;
    lk.tokens.len = n * 4;
    lk.pin = pin;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    Kvshare__Response *r = rpc(s, &req);
    *n_blocks = 0;
    if (r->rpc_case == KVSHARE__RESPONSE__RPC_LOOKUP) {
        *n_blocks = r->lookup->n_block_ids;
        if (*n_blocks)
            memcpy(ids, r->lookup->block_ids, *n_blocks * 4);
        ck_assert_uint_eq(r->lookup->hit_tokens, *n_blocks * BT);
    }
    return finish(r);
}

static int do_alloc(session_t *s, uint32_t n, uint32_t *ids)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = n;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    Kvshare__Response *r = rpc(s, &req);
    if (r->status == 0) {
        ck_assert_int_eq(r->rpc_case, KVSHARE__RESPONSE__RPC_ALLOC);
        ck_assert_uint_eq(r->alloc->n_block_ids, n);
        memcpy(ids, r->alloc->block_ids, n * 4);
    }
    return finish(r);
}

static int do_commit(session_t *s, const uint32_t *tokens, size_t n_tokens, const uint32_t *ids,
                     size_t n_ids, uint32_t *canonical, size_t *n_done)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = n_tokens * 4;
    cm.block_ids = (uint32_t *)ids;
    cm.n_block_ids = n_ids;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    Kvshare__Response *r = rpc(s, &req);
    *n_done = 0;
    if (r->rpc_case == KVSHARE__RESPONSE__RPC_COMMIT) {
        *n_done = r->commit->n_committed;
        if (r->commit->n_canonical)
            memcpy(canonical, r->commit->canonical, r->commit->n_canonical * 4);
    }
    return finish(r);
}

static int do_ids(session_t *s, int pin, const uint32_t *ids, size_t n, size_t *n_done)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PinRequest pr = KVSHARE__PIN_REQUEST__INIT;
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    if (pin) {
        pr.block_ids = (uint32_t *)ids;
        pr.n_block_ids = n;
        req.rpc_case = KVSHARE__REQUEST__RPC_PIN;
        req.pin = &pr;
    } else {
        rl.block_ids = (uint32_t *)ids;
        rl.n_block_ids = n;
        req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
        req.release = &rl;
    }
    Kvshare__Response *r = rpc(s, &req);
    *n_done = pin ? (r->pin ? r->pin->n_pinned : 0) : (r->release ? r->release->n_released : 0);
    return finish(r);
}

static int do_release(session_t *s, const uint32_t *ids, size_t n)
{
    size_t done;
    return do_ids(s, 0, ids, n, &done);
}

static void prompt(uint32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = seed * 1000 + (uint32_t)i;
}

START_TEST(test_share_a_prefix)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[10], ids[4], can[4], got[4];
    size_t n, done;
    prompt(tokens, 10, 1);

    ck_assert_int_eq(do_lookup(a, "", tokens, 10, 1, got, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(do_alloc(a, 2, ids), 0);
    ck_assert_int_eq(do_commit(a, tokens, 10, ids, 2, can, &done), 0);
    ck_assert_uint_eq(done, 2);
    ck_assert_uint_eq(can[0], ids[0]);
    ck_assert_uint_eq(can[1], ids[1]);

    ck_assert_int_eq(do_lookup(b, "", tokens, 10, 1, got, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(got[0], ids[0]);
    ck_assert_uint_eq(got[1], ids[1]);
    /* Half the prefix: one block. Another namespace: nothing. */
    ck_assert_int_eq(do_lookup(b, "default", tokens, 5, 0, got, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(do_lookup(b, "other", tokens, 10, 0, got, &n), 0);
    ck_assert_uint_eq(n, 0);

    ck_assert_int_eq(do_release(a, ids, 2), 0);
    ck_assert_uint_eq(radix_pinned_blocks(srv->index), 2);
    ck_assert_int_eq(do_release(b, ids, 2), 0);
    ck_assert_uint_eq(radix_pinned_blocks(srv->index), 0);
    /* A pin taken twice is released twice. */
    ck_assert_int_eq(do_ids(b, 1, ids, 1, &done), 0);
    ck_assert_int_eq(do_ids(b, 1, ids, 1, &done), 0);
    ck_assert_int_eq(do_release(b, ids, 1), 0);
    ck_assert_int_eq(do_release(b, ids, 1), 0);
    ck_assert_int_eq(do_release(b, ids, 1), KVS_ENOTHELD);
}
END_TEST

START_TEST(test_duplicate_commit_keeps_first)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[8], ia[2], ib[2], can[2];
    size_t done;
    prompt(tokens, 8, 2);
    ck_assert_int_eq(do_alloc(a, 2, ia), 0);
    ck_assert_int_eq(do_alloc(b, 2, ib), 0);
    ck_assert_int_eq(do_commit(a, tokens, 8, ia, 2, can, &done), 0);
    ck_assert_int_eq(do_commit(b, tokens, 8, ib, 2, can, &done), 0);
    ck_assert_uint_eq(done, 2);
    ck_assert_uint_eq(can[0], ia[0]);
    ck_assert_uint_eq(can[1], ia[1]);
    /* b's own blocks stay WRITING and b's; b holds pins on a's blocks. */
    ck_assert_ptr_eq(store_writer(srv->store, ib[0]), b);
    ck_assert_uint_eq(session_pin_count(b, ia[0]), 1);
    ck_assert_int_eq(do_release(b, ib, 2), 0);
    ck_assert_int_eq(do_release(b, ia, 2), 0);
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    ck_assert_uint_eq(c.writing, 0);
    ck_assert_uint_eq(c.cached, 2);
}
END_TEST

/* A worker commits its whole prompt: the m blocks its Lookup pinned, then
 * n - m fresh ones, with no extra allocation for the hit part. */
START_TEST(test_commit_names_pinned_cached_blocks)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[5 * BT], ia[2], got[5], fresh[3], all[5], can[5];
    size_t n, done;
    prompt(tokens, 5 * BT, 7);
    ck_assert_int_eq(do_alloc(a, 2, ia), 0);
    ck_assert_int_eq(do_commit(a, tokens, 2 * BT, ia, 2, can, &done), 0);

    ck_assert_int_eq(do_lookup(b, "", tokens, 5 * BT, 1, got, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(do_alloc(b, 3, fresh), 0);
    all[0] = got[0];
    all[1] = got[1];
    memcpy(all + 2, fresh, sizeof(fresh));
    radix_ns_stats_t before, after;
    ck_assert_int_eq(radix_ns_stats(srv->index, 0, &before), 0);
    ck_assert_int_eq(do_commit(b, tokens, 5 * BT, all, 5, can, &done), 0);
    ck_assert_uint_eq(done, 5);
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(can[i], all[i]);
    /* One pin per block for b: the Lookup's on the hit part, the Commit's on
     * the new blocks (check_invariants compares refcounts with pins). */
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(session_pin_count(b, all[i]), 1);
    ck_assert_uint_eq(b->own.n_writing, 0);
    ck_assert_int_eq(radix_ns_stats(srv->index, 0, &after), 0);
    ck_assert_uint_eq(after.inserted_blocks, before.inserted_blocks + 3);
    ck_assert_uint_eq(after.duplicate_blocks, before.duplicate_blocks + 2);
    ck_assert_uint_eq(after.lookups, before.lookups); /* the check is no lookup */
    ck_assert_uint_eq(after.cached_blocks, 5);
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    ck_assert_uint_eq(c.cached, 5);
    ck_assert_uint_eq(c.writing, 0);

    /* One Release frees all of b's pins; a's pins stay. */
    ck_assert_int_eq(do_release(b, all, 5), 0);
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(session_pin_count(b, all[i]), 0);
    ck_assert_uint_eq(radix_pinned_blocks(srv->index), 2);
    ck_assert_int_eq(do_release(a, ia, 2), 0);
    ck_assert_uint_eq(radix_pinned_blocks(srv->index), 0);
}
END_TEST

/* Cached blocks a commit may not name: pinned by another session only, or
 * pinned by this one but holding another prefix. Nothing changes. */
START_TEST(test_commit_refuses_other_cached_blocks)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[3 * BT], ia[2], got[2], fresh[2], req[3], can[3];
    size_t n, done;
    prompt(tokens, 3 * BT, 8);
    ck_assert_int_eq(do_alloc(a, 2, ia), 0);
    ck_assert_int_eq(do_commit(a, tokens, 2 * BT, ia, 2, can, &done), 0);
    ck_assert_int_eq(do_alloc(b, 2, fresh), 0);
    radix_ns_stats_t before, after;
    ck_assert_int_eq(radix_ns_stats(srv->index, 0, &before), 0);

    /* Pinned by a only. */
    req[0] = ia[0];
    req[1] = ia[1];
    req[2] = fresh[0];
    ck_assert_int_eq(do_commit(b, tokens, 3 * BT, req, 3, can, &done), KVS_ENOTHELD);
    ck_assert_uint_eq(done, 0);
    char want[64];
    snprintf(want, sizeof(want), "block %u is cached but this session holds no pin", ia[0]);
    ck_assert_ptr_nonnull(strstr(last_msg, want));

    /* Pinned by b, at the wrong position: swapped, or shifted by one. */
    ck_assert_int_eq(do_lookup(b, "", tokens, 3 * BT, 1, got, &n), 0);
    ck_assert_uint_eq(n, 2);
    req[0] = got[1];
    req[1] = got[0];
    ck_assert_int_eq(do_commit(b, tokens, 3 * BT, req, 3, can, &done), KVS_EEXIST);
    snprintf(want, sizeof(want), "block %u is cached but does not hold block 0", got[1]);
    ck_assert_ptr_nonnull(strstr(last_msg, want));
    req[0] = fresh[0];
    req[1] = fresh[1];
    req[2] = got[1];
    ck_assert_int_eq(do_commit(b, tokens, 3 * BT, req, 3, can, &done), KVS_EEXIST);
    snprintf(want, sizeof(want), "block %u is cached but does not hold block 2", got[1]);
    ck_assert_ptr_nonnull(strstr(last_msg, want));
    ck_assert_ptr_nonnull(strstr(last_msg, "only the first 2 are cached"));
    /* Another namespace: not there either, and not created. */
    Kvshare__Request r = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.ns = "elsewhere";
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = sizeof(tokens);
    cm.block_ids = got;
    cm.n_block_ids = 1;
    r.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    r.commit = &cm;
    ck_assert_int_eq(finish(rpc(b, &r)), KVS_ENONS);
    uint32_t ns_id;
    ck_assert_int_eq(radix_ns_find(srv->index, "elsewhere", &ns_id), KVS_ENONS);

    /* Nothing changed: b still writes its blocks, pins are the Lookup's. */
    ck_assert_int_eq(radix_ns_stats(srv->index, 0, &after), 0);
    ck_assert_uint_eq(after.inserted_blocks, before.inserted_blocks);
    ck_assert_uint_eq(after.duplicate_blocks, before.duplicate_blocks);
    ck_assert_uint_eq(b->own.n_writing, 2);
    ck_assert_uint_eq(session_pin_count(b, got[0]), 1);
    ck_assert_uint_eq(session_pin_count(b, got[1]), 1);
    ck_assert_uint_eq(radix_cached_blocks(srv->index), 2);
}
END_TEST

START_TEST(test_close_releases_everything)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[16], ids[5], can[5], got[5];
    size_t n, done;
    prompt(tokens, 16, 3);
    ck_assert_int_eq(do_alloc(a, 5, ids), 0);
    ck_assert_int_eq(do_commit(a, tokens, 16, ids, 3, can, &done), 0);
    ck_assert_int_eq(do_lookup(a, "", tokens, 16, 1, got, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(do_lookup(b, "", tokens, 16, 1, got, &n), 0);
    session_close(a, "test");
    check_invariants();
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    ck_assert_uint_eq(c.writing, 0);
    ck_assert_uint_eq(c.cached, 3);
    ck_assert_uint_eq(c.free, POOL - 3);
    ck_assert_uint_eq(radix_pinned_blocks(srv->index), 3); /* b's */
    session_close(b, "test");
    check_invariants();
    ck_assert_uint_eq(radix_pinned_blocks(srv->index), 0);
    ck_assert_uint_eq(srv->sessions.len, 0);
}
END_TEST

START_TEST(test_bad_block_ids)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[8], ia[2], ib[2], can[2], bad[2];
    size_t done;
    prompt(tokens, 8, 4);
    ck_assert_int_eq(do_alloc(a, 2, ia), 0);
    ck_assert_int_eq(do_alloc(b, 2, ib), 0);

    bad[0] = 812;
    ck_assert_int_eq(do_release(a, bad, 1), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(last_msg, "block 812 is out of range"));
    ck_assert_int_eq(do_commit(a, tokens, 8, bad, 1, can, &done), KVS_EINVAL);
    ck_assert_int_eq(do_ids(a, 1, bad, 1, &done), KVS_EINVAL);

    /* Another session's WRITING block. */
    ck_assert_int_eq(do_release(a, ib, 1), KVS_ENOTHELD);
    ck_assert_ptr_nonnull(strstr(last_msg, "not held by this session"));
    ck_assert_int_eq(do_commit(a, tokens, 8, ib, 1, can, &done), KVS_ENOTHELD);
    ck_assert_ptr_eq(store_writer(srv->store, ib[0]), b);

    /* Double release of a WRITING block. */
    ck_assert_int_eq(do_release(a, ia, 1), 0);
    ck_assert_int_eq(do_release(a, ia, 1), KVS_ENOTHELD);
    ck_assert_ptr_nonnull(strstr(last_msg, "free"));

    /* Commit of a block not in WRITING (free, then cached). */
    ck_assert_int_eq(do_commit(a, tokens, 8, ia, 1, can, &done), KVS_EBADSTATE);
    ck_assert_int_eq(do_commit(b, tokens, 8, ib, 1, can, &done), 0);
    /* Again, while b pins it at that prefix: accepted, and no second pin. */
    ck_assert_int_eq(do_commit(b, tokens, 8, ib, 1, can, &done), 0);
    ck_assert_uint_eq(can[0], ib[0]);
    ck_assert_uint_eq(session_pin_count(b, ib[0]), 1);
    /* Once released, b holds no pin on it: refused, naming the block. */
    ck_assert_int_eq(do_release(b, ib, 1), 0);
    ck_assert_int_eq(do_commit(b, tokens, 8, ib, 1, can, &done), KVS_ENOTHELD);
    ck_assert_ptr_nonnull(strstr(last_msg, "is cached but this session holds no pin"));
    ck_assert_int_eq(do_ids(b, 1, ib, 1, &done), 0);

    /* The same id twice, too few tokens, tokens not a multiple of 4 bytes. */
    uint32_t twice[2] = {ib[1], ib[1]};
    ck_assert_int_eq(do_commit(b, tokens, 8, twice, 2, can, &done), KVS_EINVAL);
    ck_assert_int_eq(do_commit(b, tokens, 3, ib + 1, 1, can, &done), KVS_EINVAL);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.tokens.data = (uint8_t *)tokens;
    lk.tokens.len = 5;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    ck_assert_int_eq(finish(rpc(a, &req)), KVS_EINVAL);

    /* Pin of a block that is not cached; a release in a batch stops at the bad id. */
    ck_assert_int_eq(do_ids(a, 1, ib + 1, 1, &done), KVS_ENOTFOUND);
    uint32_t batch[2] = {ib[0], 900};
    ck_assert_int_eq(do_ids(b, 0, batch, 2, &done), KVS_EINVAL);
    ck_assert_uint_eq(done, 1);
    /* Alloc of 0 or more than the pool. */
    ck_assert_int_eq(do_alloc(a, 0, bad), KVS_EINVAL);
    ck_assert_int_eq(do_alloc(a, POOL + 1, bad), KVS_EINVAL);
}
END_TEST

/* A request names its namespace under the rule the config file and
 * --namespace follow (nsname.c): a quote or a space is refused, not created. */
START_TEST(test_namespace_name_rule_on_requests)
{
    session_t *s = new_session();
    uint32_t tokens[BT], ids[1];
    size_t n;
    char long_name[RADIX_NS_NAME_MAX + 2];
    prompt(tokens, BT, 7);
    ck_assert_int_eq(do_lookup(s, "ok.name-1_x", tokens, BT, 0, ids, &n), 0);
    ck_assert_int_eq(do_lookup(s, "a\"b", tokens, BT, 0, ids, &n), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(last_msg, "letters, digits"));
    ck_assert_int_eq(do_lookup(s, "a b", tokens, BT, 0, ids, &n), KVS_EINVAL);
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    ck_assert_int_eq(do_lookup(s, long_name, tokens, BT, 0, ids, &n), KVS_EINVAL);
    long_name[RADIX_NS_NAME_MAX] = '\0';
    ck_assert_int_eq(do_lookup(s, long_name, tokens, BT, 0, ids, &n), 0);
    uint32_t id;
    ck_assert_int_eq(radix_ns_find(srv->index, "a\"b", &id), KVS_ENONS);
    session_close(s, "test");
}
END_TEST

START_TEST(test_unknown_rpc_keeps_session)
{
    session_t *a = new_session();
    Kvshare__Request req = KVSHARE__REQUEST__INIT; /* no RPC set */
    ck_assert_int_eq(finish(rpc(a, &req)), KVS_EPROTO);
    ck_assert_ptr_nonnull(strstr(last_msg, "unknown or missing RPC"));
    /* An RPC from a newer protocol: id 5, then field 99 (an empty message). */
    uint8_t frame[16];
    size_t n = 0;
    frame[n++] = 0;
    frame[n++] = 0;
    frame[n++] = 0;
    frame[n++] = 0;
    frame[n++] = 0x08; /* id = 5 */
    frame[n++] = 0x05;
    frame[n++] = 0x9a; /* field 99, wire type 2 */
    frame[n++] = 0x06;
    frame[n++] = 0x00; /* empty message */
    frame[0] = (uint8_t)(n - 4);
    ck_assert_int_eq(session_feed(a, frame, n), 0);
    const uint8_t *body;
    uint32_t len;
    ck_assert_int_eq(frame_next(&a->out, UINT32_MAX, &body, &len), 1);
    Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
    ck_assert_uint_eq(r->id, 5);
    ck_assert_int_eq(-(int)r->status, KVS_EPROTO);
    kvshare__response__free_unpacked(r, NULL);
    frame_buf_reset(&a->out);
    /* Still served. */
    uint32_t ids[1];
    ck_assert_int_eq(do_alloc(a, 1, ids), 0);
}
END_TEST

START_TEST(test_untrusted_streams)
{
    session_t *a = new_session(), *b = new_session();
    const uint8_t *body;
    uint32_t len;

    /* Garbage that decodes as no protobuf. */
    const uint8_t garbage[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(session_feed(a, garbage, sizeof(garbage)), KVS_EPROTO);
    ck_assert_int_eq(frame_next(&a->out, UINT32_MAX, &body, &len), 1);
    Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
    ck_assert_int_eq(-(int)r->status, KVS_EPROTO);
    kvshare__response__free_unpacked(r, NULL);
    session_close(a, "test");

    /* A 4 GiB length prefix. */
    a = new_session();
    const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3};
    ck_assert_int_eq(session_feed(a, huge, sizeof(huge)), KVS_ETOOBIG);
    ck_assert_int_eq(frame_next(&a->out, UINT32_MAX, &body, &len), 1);
    r = kvshare__response__unpack(NULL, len, body);
    ck_assert_int_eq(-(int)r->status, KVS_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(r->message, "--max-frame"));
    kvshare__response__free_unpacked(r, NULL);
    session_close(a, "test");

    /* A truncated frame waits for the rest; nothing is answered. */
    a = new_session();
    const uint8_t part[] = {100, 0, 0, 0, 0x08};
    ck_assert_int_eq(session_feed(a, part, sizeof(part)), 0);
    ck_assert_uint_eq(a->out.len, 0);
    session_close(a, "test");

    uint32_t ids[2];
    ck_assert_int_eq(do_alloc(b, 2, ids), 0);
    check_invariants();
}
END_TEST

/* A Ping (field 18, empty) preceded by n unknown varint fields (number
 * 1000, 3 bytes each on the wire), as one frame in buf; returns its size. */
static size_t unknown_fields_frame(uint8_t *buf, size_t n)
{
    size_t at = 4;
    for (size_t i = 0; i < n; i++) {
        buf[at++] = 0xc0; /* tag 1000 << 3 | varint, as a 2-byte varint */
        buf[at++] = 0x3e;
        buf[at++] = 0x01;
    }
    buf[at++] = 0x92; /* tag 18 << 3 | length-delimited: ping, empty */
    buf[at++] = 0x01;
    buf[at++] = 0;
    frame_put_len(buf, (uint32_t)(at - 4));
    return at;
}

static int feed_status(session_t *s, const uint8_t *frame, size_t n, int *feed_rc)
{
    const uint8_t *body;
    uint32_t len;
    *feed_rc = session_feed(s, frame, n);
    ck_assert_int_eq(frame_next(&s->out, UINT32_MAX, &body, &len), 1);
    Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
    ck_assert_ptr_nonnull(r);
    int status = -(int)r->status;
    snprintf(last_msg, sizeof(last_msg), "%s", r->message ? r->message : "");
    kvshare__response__free_unpacked(r, NULL);
    return status;
}

/* Unknown fields: a few (a newer client's) are ignored; many are refused
 * before they cost more than a few times the frame (protobuf-c keeps each,
 * 40 bytes for 3 on the wire), and the decode arena stays small. */
START_TEST(test_unknown_fields_are_bounded)
{
    static uint8_t frame[1 << 16];
    int rc;
    session_t *a = new_session();
    size_t n = unknown_fields_frame(frame, 8);
    ck_assert_int_eq(feed_status(a, frame, n, &rc), 0);
    ck_assert_int_eq(rc, 0);
    n = unknown_fields_frame(frame, 40);
    ck_assert_int_eq(feed_status(a, frame, n, &rc), KVS_EPROTO);
    ck_assert_int_eq(rc, KVS_EPROTO);
    ck_assert_msg(strstr(last_msg, "unknown fields"), "%s", last_msg);
    session_close(a, "test");

    a = new_session();
    n = unknown_fields_frame(frame, 20000);
    uint64_t errors = srv->metrics.protocol_errors;
    ck_assert_int_eq(feed_status(a, frame, n, &rc), KVS_EPROTO);
    ck_assert_int_eq(rc, KVS_EPROTO);
    ck_assert_uint_eq(srv->metrics.protocol_errors, errors + 1);
    ck_assert_uint_le(srv->decode.cap, 1u << 20);
    session_close(a, "test");
    check_invariants();
}
END_TEST

/* A worker name with a newline, an ANSI escape and invalid UTF-8 is kept
 * escaped: it cannot forge a log line or reach an operator's terminal raw. */
START_TEST(test_worker_name_is_escaped)
{
    session_t *a = new_session();
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__HelloRequest h = KVSHARE__HELLO_REQUEST__INIT;
    h.version = KVS_PROTOCOL_VERSION;
    h.worker = "w\n2026 kvshared error: x\x1b[31m\xff'\\";
    req.rpc_case = KVSHARE__REQUEST__RPC_HELLO;
    req.hello = &h;
    ck_assert_int_eq(finish(rpc(a, &req)), 0);
    ck_assert_str_eq(a->worker, "w\\x0a2026 kvshared error: x\\x1b[31m\\xff\\x27\\x5c");

    /* A long name is cut on an escape's boundary, never inside one. */
    session_t *b = new_session();
    char longname[200];
    memset(longname, '\n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    h.worker = longname;
    ck_assert_int_eq(finish(rpc(b, &req)), 0);
    ck_assert_uint_eq(strlen(b->worker) % 4, 0);
    ck_assert_uint_lt(strlen(b->worker), sizeof(b->worker));

    /* A refused namespace name is echoed escaped too. */
    uint32_t tokens[BT] = {1, 2, 3, 4}, ids[1];
    size_t n;
    ck_assert_int_eq(do_lookup(b, "x\n\x1b]0;", tokens, BT, 0, ids, &n), KVS_EINVAL);
    ck_assert_msg(strstr(last_msg, "'x\\x0a\\x1b]0;'") && !strchr(last_msg, '\n'), "%s", last_msg);
    check_invariants();
}
END_TEST

/* A pin the session lists but the index lost (a bug elsewhere) is
 * reported as an internal error, not as "not found". */
START_TEST(test_release_of_a_lost_pin_is_internal)
{
    session_t *a = new_session();
    uint32_t tokens[BT] = {5, 6, 7, 8}, ids[1], can[1];
    size_t done;
    ck_assert_int_eq(do_alloc(a, 1, ids), 0);
    ck_assert_int_eq(do_commit(a, tokens, BT, ids, 1, can, &done), 0);
    ck_assert_uint_eq(can[0], ids[0]);
    ck_assert_uint_eq(session_pin_count(a, ids[0]), 1);
    ck_assert_int_eq(radix_unpin(srv->index, ids[0]), 0); /* the index loses it */
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    rl.block_ids = ids;
    rl.n_block_ids = 1;
    req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
    req.release = &rl;
    Kvshare__Response *r = rpc(a, &req); /* not finish(): the invariant is broken here */
    ck_assert_int_eq(-(int)r->status, KVS_EINTERNAL);
    ck_assert_ptr_nonnull(strstr(r->message, "not in the index"));
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(session_pin_count(a, ids[0]), 1);
    session_pin_drop(a, ids[0]);
    ck_assert_uint_eq(session_pin_count(a, ids[0]), 0);
    check_invariants();
}
END_TEST

START_TEST(test_hello_first_only)
{
    session_t *a = new_session(), *b = new_session();
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__HelloRequest h = KVSHARE__HELLO_REQUEST__INIT;
    h.version = KVS_PROTOCOL_VERSION;
    h.worker = "w1";
    req.rpc_case = KVSHARE__REQUEST__RPC_HELLO;
    req.hello = &h;
    Kvshare__Response *r = rpc(a, &req);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->hello->num_blocks, POOL);
    ck_assert_uint_eq(r->hello->geometry->block_tokens, BT);
    ck_assert_str_eq(r->hello->geometry->dtype, "fp16");
    ck_assert_uint_eq(r->hello->slot_bytes, BT * 2 * 8 * 2);
    ck_assert_uint_eq(r->hello->block_stride, r->hello->slot_bytes);
    ck_assert_uint_eq(r->hello->kv_stride, POOL * r->hello->slot_bytes);
    ck_assert_uint_eq(r->hello->layer_stride, 2 * r->hello->kv_stride);
    ck_assert_uint_ge(r->hello->n_fds, 1);
    ck_assert_uint_eq(a->n_fds, 0); /* closed: no socket to send them on */
    finish(r);
    ck_assert_int_eq(finish(rpc(a, &req)), KVS_EPROTO);

    uint32_t ids[1];
    ck_assert_int_eq(do_alloc(b, 1, ids), 0);
    ck_assert_int_eq(finish(rpc(b, &req)), KVS_EPROTO);
    ck_assert_ptr_nonnull(strstr(last_msg, "first request"));

    session_t *c = new_session();
    h.version = (KVS_VERSION_MAJOR + 1) * 1000;
    ck_assert_int_eq(finish(rpc(c, &req)), KVS_EVERSION);
}
END_TEST

START_TEST(test_full_pool_evicts_then_refuses)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[POOL * BT], ids[POOL], can[POOL], got[POOL];
    size_t done, n;
    prompt(tokens, POOL * BT, 5);
    ck_assert_int_eq(do_alloc(a, POOL, ids), 0);
    ck_assert_int_eq(do_alloc(b, 1, got), KVS_EPOOLFULL);
    ck_assert_int_eq(do_commit(a, tokens, POOL * BT, ids, POOL, can, &done), 0);
    ck_assert_int_eq(do_alloc(b, 1, got), KVS_EPOOLFULL); /* all pinned by a */
    ck_assert_ptr_nonnull(strstr(last_msg, "pool full"));
    ck_assert_int_eq(do_release(a, ids, POOL), 0);
    ck_assert_int_eq(do_alloc(b, 4, got), 0); /* evicts the 4 LRU leaves */
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    ck_assert_uint_eq(c.cached, POOL - 4);
    ck_assert_uint_eq(srv->metrics.evictions, 4);
    ck_assert_int_eq(do_lookup(a, "", tokens, POOL * BT, 0, got, &n), 0);
    ck_assert_uint_eq(n, POOL - 4);
}
END_TEST

START_TEST(test_stats_and_tree)
{
    session_t *a = new_session();
    uint32_t tokens[12], ids[3], can[3], got[3];
    size_t done, n;
    prompt(tokens, 12, 6);
    ck_assert_int_eq(do_alloc(a, 3, ids), 0);
    ck_assert_int_eq(do_commit(a, tokens, 12, ids, 3, can, &done), 0);
    ck_assert_int_eq(do_lookup(a, "", tokens, 12, 0, got, &n), 0);

    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__StatsRequest sr = KVSHARE__STATS_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_STATS;
    req.stats = &sr;
    Kvshare__Response *r = rpc(a, &req);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->stats->total_blocks, POOL);
    ck_assert_uint_eq(r->stats->cached_blocks, 3);
    ck_assert_uint_eq(r->stats->pinned_blocks, 3);
    ck_assert_uint_eq(r->stats->sessions, 1);
    ck_assert_uint_eq(r->stats->n_namespaces, 1);
    ck_assert_str_eq(r->stats->namespaces[0]->name, "default");
    ck_assert_uint_eq(r->stats->namespaces[0]->hit_tokens, 12);
    finish(r);

    Kvshare__TreeRequest tr = KVSHARE__TREE_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_TREE;
    req.tree = &tr;
    r = rpc(a, &req);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_ge(r->tree->n_prefixes, 1);
    finish(r);
    tr.ns = "nope";
    ck_assert_int_eq(finish(rpc(a, &req)), KVS_ENONS);
}
END_TEST

/* Random operations over a few sessions; invariants after every step. */
START_TEST(test_random_operations)
{
    session_t *ss[3];
    uint32_t held_w[3][POOL], n_w[3] = {0};
    for (int i = 0; i < 3; i++)
        ss[i] = new_session();
    srand(1234);
    int steps = getenv("KVS_TEST_SMALL") ? 300 : 3000;
    for (int step = 0; step < steps; step++) {
        int k = rand() % 3;
        session_t *s = ss[k];
        uint32_t tokens[6 * BT], ids[POOL], can[POOL];
        size_t n, done;
        /* Prompts from a small family so that prefixes are shared. */
        uint32_t family = (uint32_t)(rand() % 3);
        size_t nb = 1 + (size_t)(rand() % 6);
        for (size_t i = 0; i < nb * BT; i++)
            tokens[i] = family * 100 + (uint32_t)(i < 2 * BT ? i : i + (uint32_t)(rand() % 2));
        int rc;
        switch (rand() % 6) {
        case 0:
            rc = do_lookup(s, "", tokens, nb * BT, rand() % 2, ids, &n);
            ck_assert_int_eq(rc, 0);
            break;
        case 1:
        case 2: {
            uint32_t want = (uint32_t)nb;
            if (n_w[k] + want > POOL)
                break;
            rc = do_alloc(s, want, ids);
            ck_assert(rc == 0 || rc == KVS_EPOOLFULL);
            if (rc != 0)
                break;
            rc = do_commit(s, tokens, nb * BT, ids, nb, can, &done);
            ck_assert_int_eq(rc, 0);
            for (size_t i = 0; i < nb; i++)
                if (can[i] != ids[i])
                    held_w[k][n_w[k]++] = ids[i];
            break;
        }
        case 3: {
            /* Release every pin and WRITING block this session holds. */
            uint32_t all[4 * POOL];
            size_t m = 0;
            for (uint32_t i = 0; i < s->own.pins.cap; i++)
                for (uint32_t c = 0;
                     s->own.pins.keys[i] != SESSION_NO_BLOCK && c < s->own.pins.counts[i]; c++)
                    if (m < 4 * POOL)
                        all[m++] = s->own.pins.keys[i];
            for (uint32_t i = 0; i < n_w[k] && m < 4 * POOL; i++)
                all[m++] = held_w[k][i];
            rc = do_release(s, all, m);
            ck_assert_int_eq(rc, 0);
            n_w[k] = 0;
            break;
        }
        case 4:
            if (rand() % 4 == 0) {
                session_close(s, "random");
                check_invariants();
                ss[k] = new_session();
                n_w[k] = 0;
            }
            break;
        default: {
            uint32_t b = (uint32_t)(rand() % (POOL + 2));
            rc = do_release(s, &b, 1);
            ck_assert(rc != KVS_EINTERNAL);
            if (rc == 0) {
                for (uint32_t i = 0; i < n_w[k]; i++)
                    if (held_w[k][i] == b) {
                        held_w[k][i] = held_w[k][--n_w[k]];
                        break;
                    }
            }
            break;
        }
        }
    }
}
END_TEST

/* Random byte streams, some made of valid frames with flipped bytes: the
 * daemon answers or refuses, never crashes, and its state stays consistent. */
START_TEST(test_random_bytes)
{
    srand(99);
    int rounds = getenv("KVS_TEST_SMALL") ? 100 : 2000;
    uint32_t ids[4];
    session_t *holder = new_session();
    ck_assert_int_eq(do_alloc(holder, 2, ids), 0);
    for (int r = 0; r < rounds; r++) {
        session_t *s = new_session();
        uint8_t buf[512];
        size_t n = (size_t)(rand() % (int)sizeof(buf));
        if (rand() % 2) {
            /* A valid request, then mutations. */
            frame_buf_t f = {0};
            Kvshare__Request req = KVSHARE__REQUEST__INIT;
            Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
            uint32_t some[3] = {ids[0], (uint32_t)rand() % (POOL + 3), ids[1]};
            rl.block_ids = some;
            rl.n_block_ids = 3;
            req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
            req.release = &rl;
            frame_append_request(&f, &req);
            n = f.len < sizeof(buf) ? f.len : sizeof(buf);
            memcpy(buf, f.data, n);
            frame_buf_release(&f);
            for (int k = 0; k < 3; k++)
                buf[4 + rand() % (int)(n - 4)] ^= (uint8_t)(1 << (rand() % 8));
        } else {
            for (size_t i = 0; i < n; i++)
                buf[i] = (uint8_t)rand();
            if (n >= 4 && rand() % 2) {
                buf[2] = buf[3] = 0; /* a plausible length */
            }
        }
        int rc = session_feed(s, buf, n);
        ck_assert(rc == 0 || rc == KVS_EPROTO || rc == KVS_ETOOBIG);
        /* Whatever came back decodes. */
        const uint8_t *body;
        uint32_t len;
        while (frame_next(&s->out, UINT32_MAX, &body, &len) == 1) {
            Kvshare__Response *resp = kvshare__response__unpack(NULL, len, body);
            ck_assert_ptr_nonnull(resp);
            kvshare__response__free_unpacked(resp, NULL);
        }
        session_close(s, "fuzz");
        check_invariants();
    }
    /* The holder's blocks were never anyone else's to release. */
    ck_assert_ptr_eq(store_writer(srv->store, ids[0]), holder);
    ck_assert_ptr_eq(store_writer(srv->store, ids[1]), holder);
}
END_TEST

/* A namespace created with a quota stops a commit at the quota. */
START_TEST(test_namespace_quota)
{
    char err[256];
    ck_assert_int_eq(namespaces_create(srv, "tiny", 2, 1, err, sizeof(err)), 0);
    ck_assert_int_eq(namespaces_create(srv, "tiny", 2, 1, err, sizeof(err)), KVS_EEXIST);
    ck_assert_int_eq(namespaces_create(srv, "bad", 2, 3, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "must not exceed its quota"));
    session_t *a = new_session();
    uint32_t tokens[3 * BT], ids[3];
    prompt(tokens, 3 * BT, 8);
    ck_assert_int_eq(do_alloc(a, 3, ids), 0);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.ns = "tiny";
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = sizeof(tokens);
    cm.block_ids = ids;
    cm.n_block_ids = 3;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    Kvshare__Response *r = rpc(a, &req);
    ck_assert_int_eq(-(int)r->status, KVS_EQUOTA);
    ck_assert_uint_eq(r->commit->n_committed, 2);
    ck_assert_ptr_nonnull(strstr(r->message, "2 of 3 blocks committed"));
    finish(r);
    ck_assert_ptr_eq(store_writer(srv->store, ids[2]), a); /* still this session's */
    ck_assert_int_eq(do_release(a, ids, 3), 0);
}
END_TEST

/* The pin map grows with the pins; past what a session keeps, it shrinks as
 * they go. */
START_TEST(test_pin_map_grows_and_shrinks)
{
    session_t *a = new_session();
    ck_assert_int_eq(session_pins_reserve(a, 1000), 0);
    for (uint32_t b = 0; b < 1000; b++) {
        session_pin_add(a, b * 7);
        session_pin_add(a, b * 7);
    }
    ck_assert_uint_eq(a->own.pins.used, 1000);
    ck_assert_uint_eq(a->own.pins.total, 2000);
    uint32_t big = a->own.pins.cap;
    ck_assert_uint_ge(big, 2000);
    for (uint32_t b = 0; b < 1000; b++) {
        ck_assert_uint_eq(session_pin_count(a, b * 7), 2);
        ck_assert_uint_eq(session_pin_count(a, b * 7 + 1), 0);
    }
    for (uint32_t b = 0; b < 990; b++) {
        session_pin_drop(a, b * 7);
        session_pin_drop(a, b * 7);
        ck_assert_uint_eq(session_pin_count(a, b * 7), 0);
    }
    ck_assert_uint_eq(a->own.pins.used, 10);
    /* A table within what a session keeps stays as its pins go: a worker
     * that pins and releases a prompt on every request does not rebuild it. */
    ck_assert_uint_eq(a->own.pins.cap, big);
    for (uint32_t b = 990; b < 1000; b++)
        ck_assert_uint_eq(session_pin_count(a, b * 7), 2);
    /* Not in the index: drop them by hand before the session closes. */
    for (uint32_t b = 990; b < 1000; b++) {
        session_pin_drop(a, b * 7);
        session_pin_drop(a, b * 7);
    }
    ck_assert_uint_eq(a->own.pins.total, 0);

    /* A larger one shrinks as its pins go, down to what a session keeps. */
    uint32_t n = 4 * (SESSION_KEEP_BYTES / (2 * sizeof(uint32_t)));
    ck_assert_int_eq(session_pins_reserve(a, n), 0);
    for (uint32_t b = 0; b < n; b++)
        session_pin_add(a, b * 3);
    big = a->own.pins.cap;
    ck_assert_uint_gt((size_t)big * 2 * sizeof(uint32_t), SESSION_KEEP_BYTES);
    for (uint32_t b = 0; b + 10 < n; b++)
        session_pin_drop(a, b * 3);
    ck_assert_uint_eq(a->own.pins.used, 10);
    ck_assert_uint_lt(a->own.pins.cap, big / 4);
    ck_assert_uint_le((size_t)a->own.pins.cap * 2 * sizeof(uint32_t), SESSION_KEEP_BYTES);
    for (uint32_t b = n - 10; b < n; b++) {
        ck_assert_uint_eq(session_pin_count(a, b * 3), 1);
        session_pin_drop(a, b * 3);
    }
    ck_assert_uint_eq(a->own.pins.total, 0);
}
END_TEST

START_TEST(test_server_open_errors)
{
    uv_loop_t l;
    server_config_t cfg;
    server_t *out = NULL;
    char err[256] = "";
    ck_assert_int_eq(uv_loop_init(&l), 0);
    server_config_init(&cfg);
    cfg.backend.kind = BACKEND_HOST;
    cfg.pool_blocks = 4;
    ck_assert_int_eq(server_open(&cfg, &l, &out, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "geometry"));
    cfg.geometry = (geometry_t){
        .layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = GEOMETRY_FP16, .block_tokens = 16};
    cfg.pool_blocks = 0;
    cfg.backend.bytes = 100;
    ck_assert_int_eq(server_open(&cfg, &l, &out, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "smaller than one block"));
    ck_assert_ptr_null(out);
    cfg.backend.bytes = 0;
    cfg.pool_blocks = 3;
    ck_assert_int_eq(server_open(&cfg, &l, &out, err, sizeof(err)), 0);
    ck_assert_uint_eq(out->num_blocks, 3);
    ck_assert_int_eq(server_check_socket("/nonexistent-dir/s.sock", err, sizeof(err)), 0);
    char plain[256];
    int fd = test_tmp_file("kvs-plain", plain, sizeof(plain));
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(server_check_socket(plain, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a socket"));
    unlink(plain);
    server_free(out);
    server_free(NULL);
    uv_loop_close(&l);
}
END_TEST

/* Socket squatting: a directory or socket that another user made first, or
 * that others can write, is refused before the daemon starts. */
START_TEST(test_socket_path_not_ours_is_refused)
{
    char dir[] = "/tmp/kvs-squat-XXXXXX", path[96], err[512];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/kvshared.sock", dir);
    ck_assert_int_eq(server_check_socket(path, err, sizeof(err)), 0);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_int_eq(server_check_socket(path, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "writable by every user (mode 0777)"), "%s", err);
    ck_assert_int_eq(chmod(dir, 0770), 0);
    ck_assert_int_eq(server_check_socket(path, err, sizeof(err)), KVS_EDENIED);
    ck_assert_msg(strstr(err, "writable by its group"), "%s", err);
    ck_assert_int_eq(chmod(dir, 01777), 0); /* sticky, like /tmp */
    ck_assert_int_eq(server_check_socket(path, err, sizeof(err)), 0);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    if (geteuid() == 0) {
        /* A stale socket of another user, then a directory of another user. */
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        close(fd);
        ck_assert_int_eq(server_check_socket(path, err, sizeof(err)), 0);
        ck_assert_int_eq(chown(path, 4242424, 4242424), 0);
        ck_assert_int_eq(server_check_socket(path, err, sizeof(err)), KVS_EDENIED);
        ck_assert_msg(strstr(err, "belongs to uid 4242424"), "%s", err);
        unlink(path);
        ck_assert_int_eq(chown(dir, 4242424, 4242424), 0);
        ck_assert_int_eq(server_check_socket(path, err, sizeof(err)), KVS_EDENIED);
        ck_assert_msg(strstr(err, "directory) belongs to uid 4242424"), "%s", err);
    }
    rmdir(dir);
}
END_TEST

/* ---- prefixes in flight ------------------------------------------------ */

/* Sends a request without reading a reply (it may be parked). */
static void send_req(session_t *s, Kvshare__Request *req, uint64_t id)
{
    frame_buf_t f = {0};
    req->id = id;
    ck_assert_int_eq(frame_append_request(&f, req), 0);
    ck_assert_int_eq(session_feed(s, f.data, f.len), 0);
    frame_buf_release(&f);
}

/* The next reply in s's output now, or NULL when none is there. */
static Kvshare__Response *take_reply_now(session_t *s)
{
    const uint8_t *body;
    uint32_t len;
    if (frame_next(&s->out, UINT32_MAX, &body, &len) != 1)
        return NULL;
    Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
    ck_assert_ptr_nonnull(r);
    if (s->out.head == s->out.len)
        frame_buf_reset(&s->out);
    return r;
}

/* The next reply in s's output once the ready queue has run (a released
 * session answers in its turn), or NULL when none is there. */
static Kvshare__Response *take_reply(session_t *s)
{
    uv_run(&loop, UV_RUN_NOWAIT);
    return take_reply_now(s);
}

static void send_lookup_wait(session_t *s, const char *ns, const uint32_t *tokens, size_t n,
                             uint32_t wait_ms, uint64_t id)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.ns = (char *)ns;
    lk.tokens.data = (uint8_t *)tokens;
    lk.tokens.len = n * 4;
    lk.pin = 1;
    lk.wait_ms = wait_ms;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    send_req(s, &req, id);
}

/* Checks that s's parked lookup was answered: `blocks` blocks, waited as
 * said; releases the pins it took. */
static void expect_lookup_reply(session_t *s, uint64_t id, size_t blocks, bool waited)
{
    Kvshare__Response *r = take_reply(s);
    ck_assert_msg(r != NULL, "the lookup was not answered");
    ck_assert_uint_eq(r->id, id);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->rpc_case, KVSHARE__RESPONSE__RPC_LOOKUP);
    ck_assert_uint_eq(r->lookup->n_block_ids, blocks);
    ck_assert_int_eq(r->lookup->waited, waited);
    uint32_t ids[16];
    if (blocks)
        memcpy(ids, r->lookup->block_ids, blocks * 4);
    kvshare__response__free_unpacked(r, NULL);
    check_invariants();
    if (blocks)
        ck_assert_int_eq(do_release(s, ids, blocks), 0);
}

static int do_alloc_for(session_t *s, const char *ns, const uint32_t *tokens, size_t n_tokens,
                        uint32_t first, uint32_t n, uint32_t *ids)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = n;
    al.ns = (char *)ns;
    al.tokens.data = (uint8_t *)tokens;
    al.tokens.len = n_tokens * 4;
    al.first_block = first;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    Kvshare__Response *r = rpc(s, &req);
    if (r->status == 0)
        memcpy(ids, r->alloc->block_ids, n * 4);
    return finish(r);
}

static Kvshare__Response *lookup_now(session_t *s, const char *ns, const uint32_t *tokens, size_t n)
{
    send_lookup_wait(s, ns, tokens, n, 0, 7);
    Kvshare__Response *r = take_reply(s);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    return r;
}

START_TEST(test_wait_for_commit)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[12], ids[3], can[3];
    size_t done;
    prompt(tokens, 12, 31);
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 12, 0, 3, ids), 0);
    ck_assert_uint_eq(inflight_declared(srv), 3);
    /* Not waiting: a miss that says three blocks are coming. */
    Kvshare__Response *r = lookup_now(b, "default", tokens, 12);
    ck_assert_uint_eq(r->lookup->n_block_ids, 0);
    ck_assert_uint_eq(r->lookup->inflight_blocks, 3);
    kvshare__response__free_unpacked(r, NULL);
    /* Waiting, with a request pipelined behind it: neither is answered. */
    send_lookup_wait(b, "default", tokens, 12, 60000, 100);
    Kvshare__Request ping = KVSHARE__REQUEST__INIT;
    Kvshare__PingRequest pg = KVSHARE__PING_REQUEST__INIT;
    ping.rpc_case = KVSHARE__REQUEST__RPC_PING;
    ping.ping = &pg;
    send_req(b, &ping, 101);
    ck_assert_ptr_null(take_reply(b));
    ck_assert_uint_eq(inflight_waiting(srv), 1);
    /* The writer commits in pieces: the first block alone leaves two in
     * flight, so the lookup goes on waiting. */
    ck_assert_int_eq(do_commit(a, tokens, 4, ids, 1, can, &done), 0);
    ck_assert_ptr_null(take_reply(b));
    ck_assert_int_eq(do_commit(a, tokens, 12, ids, 3, can, &done), 0);
    ck_assert_uint_eq(done, 3);
    r = take_reply(b);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 100);
    ck_assert_uint_eq(r->lookup->n_block_ids, 3);
    ck_assert(r->lookup->waited);
    kvshare__response__free_unpacked(r, NULL);
    r = take_reply(b);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 101);
    ck_assert_int_eq(r->rpc_case, KVSHARE__RESPONSE__RPC_PING);
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_int_eq(do_release(b, ids, 3), 0);
    ck_assert_uint_eq(inflight_waiting(srv), 0);
    ck_assert_uint_eq(inflight_declared(srv), 0);
    ck_assert_uint_eq(srv->metrics.lookup_waits, 1);
    ck_assert_int_eq(do_release(a, ids, 3), 0);
}
END_TEST

/* The writer releases, dies, or is the waiter itself; other namespaces. */
START_TEST(test_wait_ends_without_commit)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[8], ids[2];
    prompt(tokens, 8, 32);
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 0, 2, ids), 0);
    send_lookup_wait(b, "default", tokens, 8, 60000, 1);
    ck_assert_ptr_null(take_reply(b));
    ck_assert_int_eq(do_release(a, ids, 2), 0);
    expect_lookup_reply(b, 1, 0, true);

    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 0, 2, ids), 0);
    send_lookup_wait(b, "default", tokens, 8, 60000, 2);
    ck_assert_ptr_null(take_reply(b));
    session_close(a, "writer died");
    expect_lookup_reply(b, 2, 0, true);
    /* b now computes the prompt: what is in flight is its claim. */
    ck_assert_uint_eq(inflight_declared(srv), 2);
    ck_assert_uint_eq(inflight_claimed(srv), 2);

    /* Its own declarations: no wait. Another namespace: no wait. */
    ck_assert_int_eq(do_alloc_for(b, "default", tokens, 8, 0, 2, ids), 0);
    send_lookup_wait(b, "default", tokens, 8, 60000, 3);
    expect_lookup_reply(b, 3, 0, false);
    session_t *c = new_session();
    send_lookup_wait(c, "other", tokens, 8, 60000, 4);
    expect_lookup_reply(c, 4, 0, false);
    Kvshare__Response *r = lookup_now(c, "other", tokens, 8);
    ck_assert_uint_eq(r->lookup->inflight_blocks, 0);
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_int_eq(do_release(b, ids, 2), 0);
}
END_TEST

/* Garbage pipelined behind a held lookup is read in the waiter's turn after
 * the Commit it waited for released it (never inside the writer's request):
 * the waiter's stream stops with an error reply, and a session without a
 * socket stays for its owner to close. */
START_TEST(test_wait_then_garbage)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[8], ids[2], can[2];
    size_t done;
    prompt(tokens, 8, 35);
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 0, 2, ids), 0);
    send_lookup_wait(b, "default", tokens, 8, 60000, 1);
    const uint8_t garbage[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(session_feed(b, garbage, sizeof(garbage)), 0);
    ck_assert_ptr_null(take_reply(b));
    ck_assert_int_eq(session_broken(b), 0);

    ck_assert_int_eq(do_commit(a, tokens, 8, ids, 2, can, &done), 0);
    /* Released, b answers in its own turns, not inside a's Commit (a turn
     * ends after SESSION_TURN_NS of work: slowed down, as under valgrind,
     * the garbage waits for a turn after the lookup's). */
    ck_assert_int_eq(session_broken(b), 0);
    for (int turn = 0; turn < 16 && session_broken(b) == 0; turn++)
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(session_broken(b), KVS_EPROTO);
    Kvshare__Response *r = take_reply(b);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 1);
    ck_assert_uint_eq(r->lookup->n_block_ids, 2);
    kvshare__response__free_unpacked(r, NULL);
    r = take_reply(b);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(-(int)r->status, KVS_EPROTO);
    kvshare__response__free_unpacked(r, NULL);
    /* Nothing more is read from it, and it still holds its pins. */
    ck_assert_int_eq(session_feed(b, garbage, 0), KVS_EPROTO);
    ck_assert_int_eq(session_process(b), KVS_EPROTO);
    ck_assert_ptr_null(take_reply(b));
    uint32_t ref = 0;
    ck_assert_int_eq(radix_block_refcount(srv->index, ids[0], &ref), 0);
    ck_assert_uint_eq(ref, 2);
    session_close(b, "test: broken stream");
    ck_assert_int_eq(radix_block_refcount(srv->index, ids[0], &ref), 0);
    ck_assert_uint_eq(ref, 1);
    check_invariants();
    ck_assert_int_eq(do_release(a, ids, 2), 0);
}
END_TEST

/* Two writers of one prefix: the wait lasts while either writes. A waiter
 * that disconnects leaves nothing behind. */
START_TEST(test_wait_two_writers_and_disconnect)
{
    session_t *a = new_session(), *b = new_session(), *c = new_session(), *d = new_session();
    uint32_t tokens[8], ia[2], ib[2], can[2];
    size_t done;
    prompt(tokens, 8, 33);
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 0, 2, ia), 0);
    ck_assert_int_eq(do_alloc_for(b, "default", tokens, 8, 0, 2, ib), 0);
    ck_assert_uint_eq(inflight_declared(srv), 4);
    send_lookup_wait(c, "default", tokens, 8, 60000, 1);
    send_lookup_wait(d, "default", tokens, 8, 60000, 2);
    ck_assert_uint_eq(inflight_waiting(srv), 2);
    session_close(d, "waiter gone");
    ck_assert_uint_eq(inflight_waiting(srv), 1);
    ck_assert_int_eq(do_release(a, ia, 2), 0);
    ck_assert_ptr_null(take_reply(c));
    ck_assert_int_eq(do_commit(b, tokens, 8, ib, 2, can, &done), 0);
    expect_lookup_reply(c, 1, 2, true);
    ck_assert_int_eq(do_release(b, ib, 2), 0);
    /* A second writer whose commit finds the prefix cached: duplicates,
     * no longer in flight. */
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 0, 2, ia), 0);
    ck_assert_int_eq(do_commit(a, tokens, 8, ia, 2, can, &done), 0);
    ck_assert_uint_eq(can[0], ib[0]);
    ck_assert_uint_eq(inflight_declared(srv), 0);
    ck_assert_int_eq(do_release(a, ia, 2), 0);
    ck_assert_int_eq(do_release(a, can, 2), 0);
}
END_TEST

START_TEST(test_wait_deadline_and_shutdown)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[8], ids[2], can[2];
    size_t done;
    prompt(tokens, 8, 34);
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 0, 2, ids), 0);
    ck_assert_int_eq(do_commit(a, tokens, 4, ids, 1, can, &done), 0);
    send_lookup_wait(b, "default", tokens, 8, 5, 1);
    ck_assert_ptr_null(take_reply_now(b)); /* (running the loop could pass 5 ms) */
    /* The loop's timer ends the wait: the cached block, not the other. */
    while (inflight_waiting(srv) > 0)
        uv_run(&loop, UV_RUN_ONCE);
    expect_lookup_reply(b, 1, 1, true);
    ck_assert_uint_eq(srv->metrics.lookup_wait_timeouts, 1);
    /* Stopping answers what waits (then closes every session). */
    send_lookup_wait(b, "default", tokens, 8, 60000, 2);
    ck_assert_ptr_null(take_reply(b));
    uint64_t lookups = srv->metrics.rpc_calls[1]; /* Lookup is row 1 of the table */
    server_shutdown(srv);
    ck_assert_uint_eq(srv->metrics.rpc_calls[1], lookups + 1);
    ck_assert_uint_eq(srv->metrics.lookup_waits, 1);
    ck_assert_uint_eq(inflight_waiting(srv), 0);
    ck_assert(list_empty(&srv->sessions));
    server_drain_done(srv);
    uv_run(&loop, UV_RUN_NOWAIT);
}
END_TEST

START_TEST(test_alloc_declaration_errors)
{
    session_t *a = new_session();
    uint32_t tokens[8], ids[3];
    prompt(tokens, 8, 35);
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 1, 2, ids), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(last_msg, "declares blocks 1..2"));
    ck_assert_int_eq(do_alloc_for(a, "", tokens, 8, 0, 2, ids), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(last_msg, "must name its namespace"));
    ck_assert_int_eq(do_alloc_for(a, "default", NULL, 0, 1, 1, ids), KVS_EINVAL);
    send_lookup_wait(a, "default", tokens, 8, 60001, 1);
    Kvshare__Response *r = take_reply(a);
    ck_assert_int_eq(-(int)r->status, KVS_EINVAL);
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(inflight_declared(srv), 0);
}
END_TEST

/* Two workers look a new prompt up at once: the first, told it misses,
 * claims the rest until its next request, so the second waits for it
 * rather than computing the same blocks. */
START_TEST(test_wait_for_claim)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[8], ids[2], can[2];
    size_t done;
    prompt(tokens, 8, 36);
    send_lookup_wait(a, "default", tokens, 8, 60000, 2);
    Kvshare__Response *r = take_reply(a);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->lookup->n_block_ids, 0);
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(inflight_claimed(srv), 2);
    send_lookup_wait(b, "default", tokens, 8, 60000, 3);
    ck_assert_ptr_null(take_reply(b));
    /* The Alloc declares the blocks before the claims end: still waiting. */
    ck_assert_int_eq(do_alloc_for(a, "default", tokens, 8, 0, 2, ids), 0);
    ck_assert_ptr_null(take_reply(b));
    ck_assert_uint_eq(inflight_declared(srv), 2);
    ck_assert_int_eq(do_commit(a, tokens, 8, ids, 2, can, &done), 0);
    expect_lookup_reply(b, 3, 2, true);
    ck_assert_int_eq(do_release(a, ids, 2), 0);
    /* A claim whose owner's next request does not declare ends there. */
    uint32_t other[8];
    prompt(other, 8, 37);
    send_lookup_wait(a, "default", other, 8, 60000, 4);
    r = take_reply(a);
    kvshare__response__free_unpacked(r, NULL);
    send_lookup_wait(b, "default", other, 8, 60000, 5);
    ck_assert_ptr_null(take_reply(b));
    ck_assert_int_eq(do_alloc(a, 2, ids), 0);
    expect_lookup_reply(b, 5, 0, true);
    ck_assert_int_eq(do_release(a, ids, 2), 0);
    /* b's answer, a miss, claimed the prompt for b: a now waits for b,
     * until b disconnects. */
    send_lookup_wait(a, "default", other, 8, 60000, 6);
    ck_assert_ptr_null(take_reply(a));
    session_close(b, "gone");
    expect_lookup_reply(a, 6, 0, true);
    session_close(a, "done");
    ck_assert_uint_eq(inflight_declared(srv), 0);
}
END_TEST

/* A claimer that goes idle: its claims end after the lease, and the lookup
 * waiting for them is answered then, not at its own deadline (before: 60 s).
 * One session claims at most a quarter of the pool. */
START_TEST(test_claims_have_a_lease_and_a_bound)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[8];
    prompt(tokens, 8, 38);
    srv->cfg.claim_lease_ms = INFLIGHT_CLAIM_LEASE_MS;
    send_lookup_wait(a, "default", tokens, 8, 60000, 1);
    Kvshare__Response *r = take_reply(a);
    ck_assert_ptr_nonnull(r);
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(inflight_claimed(srv), 2);
    uint64_t t0 = uv_now(&loop);
    send_lookup_wait(b, "default", tokens, 8, 60000, 2);
    ck_assert_ptr_null(take_reply(b));
    while (inflight_waiting(srv) > 0 && uv_now(&loop) - t0 < 10000)
        uv_run(&loop, UV_RUN_ONCE);
    uint64_t waited = uv_now(&loop) - t0;
    expect_lookup_reply(b, 2, 0, true);
    ck_assert_msg(waited >= INFLIGHT_CLAIM_LEASE_MS - 50 && waited < 5000,
                  "the wait ended after %llu ms", (unsigned long long)waited);
    ck_assert_uint_eq(srv->metrics.claims_expired, 1);
    ck_assert_uint_eq(srv->metrics.lookup_waits, 1);
    session_close(a, "done");
    session_close(b, "done");
    ck_assert_uint_eq(inflight_claimed(srv), 0);

    /* A prompt of 12 blocks, none cached: a quarter of the 16-block pool. */
    session_t *c = new_session();
    uint32_t big[12 * BT];
    prompt(big, 12 * BT, 39);
    send_lookup_wait(c, "default", big, 12 * BT, 60000, 3);
    r = take_reply(c);
    ck_assert_ptr_nonnull(r);
    kvshare__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(inflight_claimed(srv), POOL / 4);
    session_close(c, "done");
}
END_TEST

/* The end of one prefix's declaration looks only at the lookups waiting for
 * that prefix, not at every waiter (before, each end walked every waiting
 * prompt again: 139 ms for one small request pair with 300 waiters). */
START_TEST(test_an_ended_declaration_looks_at_its_own_waiters)
{
    enum { N = 8 };
    session_t *a = new_session(), *w[N];
    uint32_t tokens[N][BT], ids[N];
    for (int i = 0; i < N; i++) {
        prompt(tokens[i], BT, 40 + (uint32_t)i);
        ck_assert_int_eq(do_alloc_for(a, "default", tokens[i], BT, 0, 1, &ids[i]), 0);
        w[i] = new_session();
        send_lookup_wait(w[i], "default", tokens[i], BT, 60000, 1);
        ck_assert_ptr_null(take_reply(w[i]));
    }
    ck_assert_uint_eq(inflight_waiting(srv), N);
    uint64_t before = inflight_checks(srv);
    ck_assert_int_eq(do_release(a, &ids[3], 1), 0);
    expect_lookup_reply(w[3], 1, 0, true);
    ck_assert_uint_eq(inflight_checks(srv) - before, 1);
    ck_assert_uint_eq(inflight_waiting(srv), N - 1);
    for (int i = 0; i < N; i++)
        if (i != 3)
            ck_assert_ptr_null(take_reply(w[i]));
    /* The writer goes: every waiter is answered. */
    session_close(a, "writer died");
    for (int i = 0; i < N; i++)
        if (i != 3)
            expect_lookup_reply(w[i], 1, 0, true);
    ck_assert_uint_eq(inflight_waiting(srv), 0);
}
END_TEST

/* Retention hints travel with Commit, Pin and Release; a bad priority
 * changes nothing; a timed hint ends. */
START_TEST(test_retention_hints)
{
    session_t *a = new_session();
    uint32_t tokens[8], ids[2], can[2];
    size_t done;
    prompt(tokens, 8, 40);
    ck_assert_int_eq(do_alloc(a, 2, ids), 0);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    Kvshare__RetentionHint hint = KVSHARE__RETENTION_HINT__INIT;
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = sizeof(tokens);
    cm.block_ids = ids;
    cm.n_block_ids = 2;
    cm.hint = &hint;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    hint.priority = 101;
    ck_assert_int_eq(finish(rpc(a, &req)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(last_msg, "retention priority 101"));
    /* Above default_max_priority only with the namespace's allowance. */
    uint32_t ns, seen[2];
    size_t n_seen = 0;
    ck_assert_int_eq(do_lookup(a, NULL, tokens, 8, 0, seen, &n_seen), 0); /* makes "default" */
    ck_assert_int_eq(radix_ns_find(srv->index, "default", &ns), 0);
    ck_assert_int_eq(radix_ns_set_priority(srv->index, ns, RADIX_PRIO_DEFAULT, RADIX_PRIO_MAX), 0);
    hint.priority = 90;
    ck_assert_int_eq(finish(rpc(a, &req)), 0);
    uint32_t prio = 0;
    ck_assert_int_eq(radix_block_priority(srv->index, ids[1], &prio), 0);
    ck_assert_uint_eq(prio, 90);
    /* Release with a lower timed hint: the highest live hint counts. */
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    Kvshare__Request rr = KVSHARE__REQUEST__INIT;
    Kvshare__RetentionHint low = KVSHARE__RETENTION_HINT__INIT;
    low.priority = 10;
    rl.block_ids = ids;
    rl.n_block_ids = 2;
    rl.hint = &low;
    rr.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
    rr.release = &rl;
    ck_assert_int_eq(finish(rpc(a, &rr)), 0);
    ck_assert_int_eq(radix_block_priority(srv->index, ids[0], &prio), 0);
    ck_assert_uint_eq(prio, 90);
    /* A namespace capped at 60 (config), and a timed hint that ends. */
    ck_assert_int_eq(radix_ns_set_priority(srv->index, ns, 20, 60), 0);
    ck_assert_int_eq(radix_block_priority(srv->index, ids[0], &prio), 0);
    ck_assert_uint_eq(prio, 60);
    uint32_t other[8], oid[2];
    prompt(other, 8, 41);
    ck_assert_int_eq(do_alloc(a, 2, oid), 0);
    ck_assert_int_eq(do_commit(a, other, 8, oid, 2, can, &done), 0);
    ck_assert_int_eq(radix_block_priority(srv->index, oid[0], &prio), 0);
    ck_assert_uint_eq(prio, 20);
    Kvshare__PinRequest pr = KVSHARE__PIN_REQUEST__INIT;
    Kvshare__Request pq = KVSHARE__REQUEST__INIT;
    Kvshare__RetentionHint timed = KVSHARE__RETENTION_HINT__INIT;
    timed.priority = 55;
    timed.duration_ms = 1;
    pr.block_ids = oid;
    pr.n_block_ids = 1;
    pr.hint = &timed;
    pq.rpc_case = KVSHARE__REQUEST__RPC_PIN;
    pq.pin = &pr;
    ck_assert_int_eq(finish(rpc(a, &pq)), 0);
    ck_assert_int_eq(radix_block_priority(srv->index, oid[0], &prio), 0);
    ck_assert_uint_eq(prio, 55);
    usleep(3000);
    uv_update_time(&loop);
    ck_assert_int_eq(radix_expire_hints(srv->index, uv_now(&loop), NULL), 0);
    ck_assert_int_eq(radix_block_priority(srv->index, oid[0], &prio), 0);
    ck_assert_uint_eq(prio, 20);
    ck_assert_int_eq(do_release(a, oid, 2), 0);
    ck_assert_int_eq(do_release(a, oid, 1), 0);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(srv->index, ns, &st), 0);
    ck_assert_uint_eq(st.cached_by_band[0], 2);
    ck_assert_uint_eq(st.cached_by_band[2], 2);
    /* An Alloc that needs two blocks more than are free evicts the two of
     * priority 20 first; Stats carries both counts by band. */
    uint32_t more[POOL];
    ck_assert_int_eq(do_alloc(a, POOL - 2, more), 0);
    Kvshare__Request sq = KVSHARE__REQUEST__INIT;
    Kvshare__StatsRequest sr = KVSHARE__STATS_REQUEST__INIT;
    sq.rpc_case = KVSHARE__REQUEST__RPC_STATS;
    sq.stats = &sr;
    Kvshare__Response *r = rpc(a, &sq);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->stats->n_namespaces, 1);
    const Kvshare__NamespaceStats *nst = r->stats->namespaces[0];
    const uint64_t want_cached[] = {0, 0, 2, 0}, want_evicted[] = {2, 0, 0, 0};
    ck_assert_uint_eq(nst->n_cached_by_priority, 4);
    ck_assert_uint_eq(nst->n_evicted_by_priority, 4);
    for (int b = 0; b < 4; b++) {
        ck_assert_uint_eq(nst->cached_by_priority[b], want_cached[b]);
        ck_assert_uint_eq(nst->evicted_by_priority[b], want_evicted[b]);
    }
    finish(r);
}
END_TEST
/* Pins with a timed hint, renewed 10,000 times on two blocks: the expiry
 * queue stays at the live hints (the issue: one entry per hint given), and
 * past max_timed_hints a hint for one more block is ignored and counted. */
START_TEST(test_timed_hints_are_bounded)
{
    session_t *a = new_session();
    uint32_t tokens[2 * BT], ids[2], can[2];
    size_t done;
    prompt(tokens, 2 * BT, 77);
    ck_assert_int_eq(do_alloc(a, 2, ids), 0);
    ck_assert_int_eq(do_commit(a, tokens, 2 * BT, ids, 2, can, &done), 0);
    Kvshare__PinRequest pr = KVSHARE__PIN_REQUEST__INIT;
    Kvshare__Request pq = KVSHARE__REQUEST__INIT;
    Kvshare__RetentionHint timed = KVSHARE__RETENTION_HINT__INIT;
    timed.priority = 40;
    pr.n_block_ids = 1;
    pr.hint = &timed;
    pq.rpc_case = KVSHARE__REQUEST__RPC_PIN;
    pq.pin = &pr;
    for (uint32_t i = 0; i < 10000; i++) {
        timed.duration_ms = 1000000 + i; /* a later end each time: a new queue entry */
        pr.block_ids = &can[i % 2];
        ck_assert_int_eq(finish(rpc(a, &pq)), 0);
        ck_assert_int_eq(do_release(a, &can[i % 2], 1), 0);
    }
    ck_assert_uint_le(radix_hint_queue_len(srv->index), 2 * 2 + 64 + 1);
    ck_assert_uint_eq(radix_hint_timed(srv->index), 2);
    ck_assert_uint_eq(srv->metrics.hints_refused, 0);
    /* A limit of one block: the second block's new hint is refused. */
    ck_assert_int_eq(radix_expire_hints(srv->index, UINT64_MAX >> 2, NULL), 0);
    ck_assert_int_eq(radix_hint_limit(srv->index, 1), 0);
    pr.block_ids = &can[0];
    ck_assert_int_eq(finish(rpc(a, &pq)), 0);
    pr.block_ids = &can[1];
    ck_assert_int_eq(finish(rpc(a, &pq)), 0); /* a hint, never an error */
    ck_assert_uint_eq(srv->metrics.hints_refused, 1);
    ck_assert_uint_eq(radix_hint_timed(srv->index), 1);
    check_invariants();
}
END_TEST

/* Alloc n blocks for ns and commit prompt `seed` there with a hint of
 * priority prio (none when prio < 0), then let go of them. */
static void commit_hinted(session_t *s, const char *ns, uint32_t seed, uint32_t n, int prio)
{
    uint32_t tokens[4 * BT], ids[4], can[8];
    ck_assert_uint_le(n, 4);
    prompt(tokens, n * BT, seed);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = n;
    al.ns = (char *)ns;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    Kvshare__Response *r = rpc(s, &req);
    ck_assert_int_eq(r->status, 0);
    memcpy(ids, r->alloc->block_ids, n * 4);
    finish(r);
    Kvshare__Request cq = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    Kvshare__RetentionHint hint = KVSHARE__RETENTION_HINT__INIT;
    cm.ns = (char *)ns;
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = n * BT * 4;
    cm.block_ids = ids;
    cm.n_block_ids = n;
    if (prio >= 0) {
        hint.priority = (uint32_t)prio;
        cm.hint = &hint;
    }
    cq.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    cq.commit = &cm;
    r = rpc(s, &cq);
    ck_assert_int_eq(r->status, 0);
    memcpy(can, r->commit->canonical, n * 4);
    finish(r);
    ck_assert_int_eq(do_release(s, can, n), 0);
}

/* Issue: with hints capped at 100 by default, a tenant whose hints said 100
 * kept its blocks over every other tenant's: another tenant's working set
 * hit 0 of its blocks every round. Hints now stop at default_max_priority
 * (the default priority of unhinted blocks) unless a namespace's section
 * allows more, and the other tenant's working set stays cached by LRU. */
START_TEST(test_hints_cannot_starve_another_tenant)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t wtok[4 * BT], got[4];
    prompt(wtok, 4 * BT, 900);
    commit_hinted(b, "b", 900, 4, -1); /* b's working set: 4 of the 16 blocks */
    size_t hits = 0, rounds = 0;
    for (uint32_t round = 0; round < 12; round++) {
        /* a writes 8 new blocks a round, all hinted 100 */
        commit_hinted(a, "a", 1000 + 2 * round, 4, 100);
        commit_hinted(a, "a", 1001 + 2 * round, 4, 100);
        size_t n = 0;
        ck_assert_int_eq(do_lookup(b, "b", wtok, 4 * BT, 0, got, &n), 0);
        if (round >= 2) { /* the pool is full from then on */
            hits += n;
            rounds++;
        }
        if (n < 4)
            commit_hinted(b, "b", 900, 4, -1); /* b recomputes its working set */
        check_invariants();
    }
    ck_assert_msg(hits == 4 * rounds, "b's working set hit %zu of %zu blocks", hits, 4 * rounds);
    /* With the namespace's allowance (max_priority 100), a's hints hold
     * again over b's blocks: the allowance is the operator's choice. */
    uint32_t ns_a;
    ck_assert_int_eq(radix_ns_find(srv->index, "a", &ns_a), 0);
    ck_assert_int_eq(radix_ns_set_priority(srv->index, ns_a, RADIX_PRIO_DEFAULT, 100), 0);
    commit_hinted(a, "a", 5000, 4, 100);
    commit_hinted(a, "a", 5001, 4, 100);
    commit_hinted(a, "a", 5002, 4, 100);
    commit_hinted(a, "a", 5003, 4, 100);
    size_t n = 0;
    ck_assert_int_eq(do_lookup(b, "b", wtok, 4 * BT, 0, got, &n), 0);
    ck_assert_uint_eq(n, 0);
    check_invariants();
}
END_TEST

static int do_clear(session_t *s, const char *ns)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__ClearRequest cl = KVSHARE__CLEAR_REQUEST__INIT;
    cl.ns = (char *)ns;
    req.rpc_case = KVSHARE__REQUEST__RPC_CLEAR;
    req.clear = &cl;
    return finish(rpc(s, &req));
}

/* Issue: without allow-lists (the default) any session could clear another
 * tenant's namespace. Clear now takes uid 0, clear_uids / clear_gids, or
 * the namespace's own allow-list; others are denied and counted. */
START_TEST(test_clear_needs_permission)
{
    session_t *owner = new_session(), *other = new_session();
    char err[256];
    ck_assert_int_eq(namespaces_create(srv, "t1", 0, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(namespaces_create(srv, "t2", 0, 0, err, sizeof(err)), 0);
    ck_assert_int_eq(namespaces_declare(srv, "t1", err, sizeof(err)), 0);
    ck_assert_int_eq(namespaces_declare(srv, "t2", err, sizeof(err)), 0);
    commit_hinted(owner, "t1", 300, 2, -1);
    other->peer.known = true;
    other->peer.uid = 1234;
    other->peer.gid = 1234;
    ck_assert_int_eq(do_clear(other, "t1"), KVS_EDENIED);
    ck_assert_ptr_nonnull(strstr(last_msg, "clear_uids"));
    ck_assert_uint_eq(srv->metrics.clears_denied, 1);
    ck_assert_uint_eq(srv->metrics.clears, 0);
    uint32_t ns;
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_find(srv->index, "t1", &ns), 0);
    ck_assert_int_eq(radix_ns_stats(srv->index, ns, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 2);
    /* The namespace's own allow-list names the peer: its own session. */
    srv->ns.tenants[ns].acl.uids[0] = 1234;
    srv->ns.tenants[ns].acl.n_uids = 1;
    srv->ns.any_acl = true;
    ck_assert_int_eq(do_clear(other, "t1"), 0);
    ck_assert_uint_eq(srv->metrics.clears, 1);
    /* Another tenant's namespace: denied, unless clear_gids names the peer. */
    commit_hinted(owner, "t2", 301, 2, -1);
    ck_assert_int_eq(do_clear(other, "t2"), KVS_EDENIED);
    ck_assert_uint_eq(srv->metrics.clears_denied, 2);
    srv->cfg.clear_acl.gids[0] = 1234;
    srv->cfg.clear_acl.n_gids = 1;
    ck_assert_int_eq(do_clear(other, "t2"), 0);
    /* uid 0 may. */
    other->peer.uid = 0;
    srv->cfg.clear_acl.n_gids = 0;
    ck_assert_int_eq(do_clear(other, "t2"), 0);
    ck_assert_uint_eq(srv->metrics.clears, 3);
    check_invariants();
}
END_TEST

/* Issue: closing a session let go of all its pins in one piece (2^29 pins:
 * a 0.93 s stall of every client). A close over STORE_RELEASE_STEP pins
 * now hands them to the store, which lets go of them a bounded step per
 * loop turn; the blocks stay pinned until then, and nothing leaks. */
START_TEST(test_close_releases_pins_in_steps)
{
    session_t *a = new_session(), *b = new_session();
    uint32_t tokens[2 * BT], ids[2], can[2];
    size_t done;
    prompt(tokens, 2 * BT, 55);
    ck_assert_int_eq(do_alloc(a, 2, ids), 0);
    ck_assert_int_eq(do_commit(a, tokens, 2 * BT, ids, 2, can, &done), 0);
    ck_assert_int_eq(do_release(a, can, 2), 0);
    enum { PINS = 3 * STORE_RELEASE_STEP + 100 };
    ck_assert_int_eq(session_pins_reserve(a, 2), 0);
    for (uint32_t i = 0; i < PINS; i++) {
        ck_assert_int_eq(radix_pin(srv->index, can[i % 2]), 0);
        session_pin_add(a, can[i % 2]);
    }
    session_close(a, "test");
    /* Nothing let go of in the close itself: all of it waits for steps. */
    ck_assert_uint_eq(store_draining_pins(srv->store), PINS);
    uint32_t ref = 0;
    ck_assert_int_eq(radix_block_refcount(srv->index, can[0], &ref), 0);
    ck_assert_uint_eq(ref, PINS / 2);
    int steps = 0;
    uint64_t before = store_draining_pins(srv->store);
    while (store_drain_step(srv->store)) {
        uint64_t now = store_draining_pins(srv->store);
        ck_assert_uint_ge(before - now + 0, 1);
        ck_assert_uint_le(before - now, STORE_RELEASE_STEP);
        before = now;
        steps++;
    }
    ck_assert_int_eq(steps, 3);
    ck_assert_uint_eq(store_draining_pins(srv->store), 0);
    ck_assert_int_eq(radix_block_refcount(srv->index, can[0], &ref), 0);
    ck_assert_uint_eq(ref, 0);
    /* A small close is let go of at once, as before. */
    ck_assert_int_eq(session_pins_reserve(b, 1), 0);
    ck_assert_int_eq(radix_pin(srv->index, can[1]), 0);
    session_pin_add(b, can[1]);
    session_close(b, "test");
    ck_assert_uint_eq(store_draining_pins(srv->store), 0);
    ck_assert_int_eq(radix_block_refcount(srv->index, can[1], &ref), 0);
    ck_assert_uint_eq(ref, 0);
    check_invariants();
    ck_assert_uint_eq(srv->cfg.session_max_pinned, SERVER_DEFAULT_SESSION_MAX_PINNED);
}
END_TEST

/* --- several devices: one group of ranks, shards committed per rank --- */

#define RANKS 3

static void setup_devices(void)
{
    server_config_t cfg;
    log_level = LOG_LEVEL_WARN;
    test_server_config(&cfg, BT, POOL);
    cfg.devices = "0-2";
    cfg.claim_lease_ms = 600000;
    srv = test_server_open(&loop, &cfg);
    ck_assert_uint_eq(srv->n_devices, RANKS);
}

/* A session that said rank r at Hello (no fds: no socket to send them on). */
static session_t *rank_session(uint32_t r)
{
    session_t *s = new_session();
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__HelloRequest h = KVSHARE__HELLO_REQUEST__INIT;
    h.version = KVS_PROTOCOL_VERSION;
    h.no_fds = true;
    h.ranked = true;
    h.rank = r;
    req.rpc_case = KVSHARE__REQUEST__RPC_HELLO;
    req.hello = &h;
    Kvshare__Response *resp = rpc(s, &req);
    ck_assert_int_eq(resp->status, 0);
    ck_assert_uint_eq(resp->hello->rank, r);
    ck_assert_uint_eq(resp->hello->group_size, RANKS);
    ck_assert_int_eq(finish(resp), 0);
    return s;
}

static int do_commit_group(session_t *s, const uint32_t *tokens, size_t n_tokens,
                           const uint32_t *ids, size_t n_ids, uint32_t *canonical, size_t *n_done,
                           size_t *n_pending)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = n_tokens * 4;
    cm.block_ids = (uint32_t *)ids;
    cm.n_block_ids = n_ids;
    cm.for_group = n_pending == NULL;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    Kvshare__Response *r = rpc(s, &req);
    *n_done = 0;
    if (r->rpc_case == KVSHARE__RESPONSE__RPC_COMMIT) {
        *n_done = r->commit->n_committed;
        if (n_pending)
            *n_pending = r->commit->n_pending;
        if (r->commit->n_canonical)
            memcpy(canonical, r->commit->canonical, r->commit->n_canonical * 4);
    }
    return finish(r);
}

/* Random steps of one group against a model of who committed which shard:
 * a lookup never returns a block some rank did not commit, the commit that
 * completes a prefix caches it, and a rank that ends frees the blocks it
 * holds, not those another rank of its group holds (the store's invariants
 * hold after every step). A rank's first commit into blocks freed while
 * its shard was due, allocated again for the same tokens, is refused as
 * late (store.h); its next one is taken. */
START_TEST(test_group_random_operations)
{
    session_t *rk[RANKS];
    for (uint32_t r = 0; r < RANKS; r++)
        rk[r] = rank_session(r);
    uint32_t tokens[6 * BT], ids[POOL], can[2 * POOL], got[POOL];
    bool job = false, done_by[RANKS] = {false};
    uint32_t holder = 0;
    size_t nb = 0;
    srand(4321);
    int steps = getenv("KVS_TEST_SMALL") ? 300 : 3000;
    for (int step = 0; step < steps; step++) {
        uint32_t r = (uint32_t)(rand() % RANKS);
        size_t n, done, pending;
        switch (rand() % 5) {
        case 0: /* a new prefix: one rank allocates for the group */
            if (job)
                break;
            nb = 1 + (size_t)(rand() % 6);
            for (size_t i = 0; i < nb * BT; i++)
                tokens[i] = (uint32_t)(rand() % 3) * 100 + (uint32_t)i;
            if (do_alloc(rk[r], (uint32_t)nb, ids) != 0)
                break;
            job = true;
            holder = r;
            memset(done_by, 0, sizeof(done_by));
            if (rand() % 4 == 0) { /* a commit for the group, no other rank's shard in */
                ck_assert_int_eq(do_commit_group(rk[r], tokens, nb * BT, ids, nb, can, &done, NULL),
                                 KVS_EBADSTATE);
                ck_assert_uint_eq(done, 0);
                check_invariants();
            }
            break;
        case 1: /* rank r commits its shard */
            if (!job || done_by[r])
                break;
            if (do_commit_group(rk[r], tokens, nb * BT, ids, nb, can, &done, &pending) ==
                KVS_EBADSTATE) {
                check_invariants(); /* late, as far as the daemon can tell: then taken */
                ck_assert_int_eq(
                    do_commit_group(rk[r], tokens, nb * BT, ids, nb, can, &done, &pending), 0);
            }
            done_by[r] = true;
            {
                bool all = true;
                for (uint32_t k = 0; k < RANKS; k++)
                    all = all && done_by[k];
                ck_assert_uint_eq(done, all ? nb : 0);
                ck_assert_uint_eq(pending, all ? 0 : nb);
                if (!all)
                    break;
            }
            /* Completed by r: r holds the pins and the duplicates. */
            for (size_t i = 0; i < nb; i++)
                got[i] = can[i];
            n = nb;
            for (size_t i = 0; i < nb; i++)
                if (can[i] != ids[i])
                    got[n++] = ids[i];
            ck_assert_int_eq(do_release(rk[r], got, n), 0);
            job = false;
            break;
        case 2: { /* a lookup never returns a block with a shard missing */
            int pin = rand() % 2;
            ck_assert_int_eq(do_lookup(rk[r], "", tokens, (nb ? nb : 1) * BT, pin, got, &n), 0);
            for (size_t i = 0; job && i < n; i++)
                for (size_t j = 0; j < nb; j++)
                    ck_assert_msg(got[i] != ids[j], "block %u returned with a shard missing",
                                  ids[j]);
            if (pin && n)
                ck_assert_int_eq(do_release(rk[r], got, n), 0);
            break;
        }
        case 3: /* rank r ends: the blocks it holds go, its group's others stay */
            if (rand() % 3)
                break;
            session_close(rk[r], "random");
            check_invariants();
            {
                pool_counts_t c;
                pool_counts(srv->pool, &c);
                if (job && holder != r) {
                    ck_assert_uint_eq(c.writing, nb);
                } else {
                    ck_assert_uint_eq(c.writing, 0);
                    job = false;
                }
            }
            rk[r] = rank_session(r);
            break;
        default:
            break;
        }
    }
}
END_TEST

/* With several devices, a session without a rank may not write. */
START_TEST(test_group_refuses_rankless_writes)
{
    session_t *s = new_session();
    uint32_t ids[2];
    ck_assert_int_eq(do_alloc(s, 2, ids), KVS_EDENIED);
    ck_assert_ptr_nonnull(strstr(last_msg, "rank"));
    session_t *r0 = rank_session(0);
    ck_assert_int_eq(do_alloc(r0, 2, ids), 0);
    uint32_t tokens[2 * BT], can[4];
    size_t done;
    prompt(tokens, 2 * BT, 5);
    ck_assert_int_eq(do_commit(s, tokens, 2 * BT, ids, 2, can, &done), KVS_EDENIED);
}
END_TEST

static Suite *session_suite(void)
{
    Suite *s = suite_create("session");
    TCase *tc = tcase_create("session");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_share_a_prefix);
    tcase_add_test(tc, test_duplicate_commit_keeps_first);
    tcase_add_test(tc, test_commit_names_pinned_cached_blocks);
    tcase_add_test(tc, test_commit_refuses_other_cached_blocks);
    tcase_add_test(tc, test_close_releases_everything);
    tcase_add_test(tc, test_bad_block_ids);
    tcase_add_test(tc, test_namespace_name_rule_on_requests);
    tcase_add_test(tc, test_unknown_rpc_keeps_session);
    tcase_add_test(tc, test_untrusted_streams);
    tcase_add_test(tc, test_unknown_fields_are_bounded);
    tcase_add_test(tc, test_hello_first_only);
    tcase_add_test(tc, test_release_of_a_lost_pin_is_internal);
    tcase_add_test(tc, test_worker_name_is_escaped);
    tcase_add_test(tc, test_full_pool_evicts_then_refuses);
    tcase_add_test(tc, test_stats_and_tree);
    tcase_add_test(tc, test_random_operations);
    tcase_add_test(tc, test_random_bytes);
    tcase_add_test(tc, test_pin_map_grows_and_shrinks);
    tcase_add_test(tc, test_namespace_quota);
    tcase_add_test(tc, test_wait_for_commit);
    tcase_add_test(tc, test_wait_ends_without_commit);
    tcase_add_test(tc, test_wait_then_garbage);
    tcase_add_test(tc, test_wait_two_writers_and_disconnect);
    tcase_add_test(tc, test_wait_deadline_and_shutdown);
    tcase_add_test(tc, test_alloc_declaration_errors);
    tcase_add_test(tc, test_wait_for_claim);
    tcase_add_test(tc, test_claims_have_a_lease_and_a_bound);
    tcase_add_test(tc, test_an_ended_declaration_looks_at_its_own_waiters);
    tcase_add_test(tc, test_retention_hints);
    tcase_add_test(tc, test_hints_cannot_starve_another_tenant);
    tcase_add_test(tc, test_timed_hints_are_bounded);
    tcase_add_test(tc, test_clear_needs_permission);
    tcase_add_test(tc, test_close_releases_pins_in_steps);
    suite_add_tcase(s, tc);
    TCase *tc_server = tcase_create("server");
    tcase_set_timeout(tc_server, 30);
    tcase_add_test(tc_server, test_server_open_errors);
    tcase_add_test(tc_server, test_socket_path_not_ours_is_refused);
    suite_add_tcase(s, tc_server);
    TCase *tc_group = tcase_create("devices");
    tcase_add_checked_fixture(tc_group, setup_devices, teardown);
    tcase_set_timeout(tc_group, 60);
    tcase_add_test(tc_group, test_group_random_operations);
    tcase_add_test(tc_group, test_group_refuses_rankless_writes);
    suite_add_tcase(s, tc_group);
    return s;
}

KVS_CHECK_MAIN(session_suite)
