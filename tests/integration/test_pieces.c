/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Large requests in pieces, one per loop turn (docs/RELIABILITY.md, H27):
 * a Commit's inserts (handler_commit, commit_pieces), an Alloc's blocks and
 * the evictions that make room for them (alloc_pieces, store_alloc) go
 * STORE_PIECE_BLOCKS (16,384) at a time, the session held between two.
 * Each case checks that the request in pieces answers as the one-piece
 * request did, and that a client gone in the middle leaves nothing held.
 * (test_stalls measures the loop's longest stretch of work meanwhile.)
 */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"
#include "raw_wire.h"

#define BT        4     /* the harness's tokens per block */
#define POOL      65536 /* blocks of the pool */
#define NB        40000 /* a prompt of three pieces */
#define CLIENT_MS 60000

static harness_t h;

static void prompt(uint32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = seed * 1000003u + (uint32_t)i;
}

static kvs_client_t *client(void)
{
    kvs_client_t *c = harness_client_ms(&h, NULL, KVS_NO_MAP, CLIENT_MS);
    ck_assert_ptr_nonnull(c);
    return c;
}

static void stats(kvs_client_t *c, kvs_stats_t *st)
{
    ck_assert_int_eq(kvs_stats(c, st), 0);
    kvs_stats_free(st); /* only its counts are read */
}

/* Blocks cached, being written and pinned, and sessions open, until they
 * read as given (a closed session's holdings go a turn later). */
static void wait_counts(kvs_client_t *c, uint32_t cached, uint32_t writing, uint32_t pinned)
{
    kvs_stats_t st;
    for (int i = 0; i < 3000; i++) {
        stats(c, &st);
        if (st.cached_blocks == cached && st.writing_blocks == writing &&
            st.pinned_blocks == pinned && st.sessions == 1)
            return;
        usleep(10000);
    }
    ck_abort_msg("counts: cached %u writing %u pinned %u sessions %u; wanted %u %u %u 1",
                 st.cached_blocks, st.writing_blocks, st.pinned_blocks, st.sessions, cached,
                 writing, pinned);
}

static void setup(void)
{
    ck_assert_int_eq(harness_start(&h, POOL, NULL), 0);
}

static void teardown(void)
{
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
}

/* A Commit of 40,000 new blocks names every one; the same prompt committed
 * again by another session with blocks of its own finds every one a
 * duplicate of the first's, through the same pieces. */
START_TEST(test_commit_in_pieces_names_every_block)
{
    kvs_client_t *a = client(), *b = client();
    uint32_t *tokens = malloc(NB * BT * sizeof(*tokens));
    uint32_t *ids = malloc(NB * sizeof(*ids)), *can = malloc(NB * sizeof(*can));
    uint32_t *ids2 = malloc(NB * sizeof(*ids2)), *can2 = malloc(NB * sizeof(*can2));
    ck_assert(tokens && ids && can && ids2 && can2);
    prompt(tokens, NB * BT, 1);
    size_t done = 0;
    ck_assert_int_eq(kvs_alloc(a, NULL, NB, ids), 0);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens, NB * BT, ids, NB, can, &done), 0);
    ck_assert_uint_eq(done, NB);
    for (size_t i = 0; i < NB; i++)
        ck_assert_uint_eq(can[i], ids[i]);

    ck_assert_int_eq(kvs_alloc(b, NULL, 20000, ids2), 0); /* the pool has 25,536 free */
    ck_assert_int_eq(kvs_commit(b, NULL, tokens, 20000 * BT, ids2, 20000, can2, &done), 0);
    ck_assert_uint_eq(done, 20000);
    for (size_t i = 0; i < 20000; i++)
        ck_assert_uint_eq(can2[i], ids[i]); /* duplicates: b's blocks stay WRITING */
    kvs_stats_t st;
    stats(a, &st);
    ck_assert_uint_eq(st.cached_blocks, NB);
    ck_assert_uint_eq(st.writing_blocks, 20000);
    ck_assert_int_eq(kvs_release(b, ids2, 20000, NULL), 0);
    ck_assert_int_eq(kvs_release(b, can2, 20000, NULL), 0);
    ck_assert_int_eq(kvs_release(a, can, NB, NULL), 0);
    kvs_close(b);
    wait_counts(a, NB, 0, 0);
    kvs_close(a);
    free(tokens);
    free(ids);
    free(can);
    free(ids2);
    free(can2);
}
END_TEST

/* A Commit whose first 20,000 blocks are cached blocks this session pinned
 * (its Lookup) and the rest new: the pieces start past the cached part's
 * blocks as a one-piece Commit does, and the session keeps one pin each. */
START_TEST(test_commit_in_pieces_after_a_cached_prefix)
{
    kvs_client_t *a = client();
    uint32_t *tokens = malloc(NB * BT * sizeof(*tokens));
    uint32_t *ids = malloc(NB * sizeof(*ids)), *can = malloc(NB * sizeof(*can));
    ck_assert(tokens && ids && can);
    prompt(tokens, NB * BT, 2);
    size_t done = 0, n = 0;
    ck_assert_int_eq(kvs_alloc(a, NULL, 20000, ids), 0);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens, 20000 * BT, ids, 20000, can, &done), 0);
    ck_assert_int_eq(kvs_release(a, can, 20000, NULL), 0);
    ck_assert_int_eq(kvs_lookup(a, NULL, tokens, NB * BT, 1, ids, NB, &n), 0);
    ck_assert_uint_eq(n, 20000);
    ck_assert_int_eq(kvs_alloc(a, NULL, NB - 20000, ids + 20000), 0);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens, NB * BT, ids, NB, can, &done), 0);
    ck_assert_uint_eq(done, NB);
    for (size_t i = 0; i < NB; i++)
        ck_assert_uint_eq(can[i], ids[i]);
    kvs_stats_t st;
    stats(a, &st);
    ck_assert_uint_eq(st.pinned_blocks, NB);
    ck_assert_int_eq(kvs_release(a, can, NB, NULL), 0); /* one pin each */
    wait_counts(a, NB, 0, 0);
    kvs_close(a);
    free(tokens);
    free(ids);
    free(can);
}
END_TEST

/* A client that sends a Commit of 60,000 blocks and closes at once: the
 * Commit stops between two pieces or runs to its end, and the session's
 * pins and WRITING blocks all go; what was committed is a prefix of the
 * prompt, whole in the index. */
START_TEST(test_close_in_the_middle_of_a_commit)
{
    enum { N = 60000 };
    kvs_client_t *c = client();
    int fd = raw_connect(h.socket_path);
    ck_assert_int_ge(fd, 0);
    uint32_t *tokens = malloc(N * BT * sizeof(*tokens)), *ids = malloc(N * sizeof(*ids));
    ck_assert(tokens && ids);
    prompt(tokens, N * BT, 3);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = N;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    ck_assert_int_eq(raw_send_request(fd, &req), 0);
    Kvshare__Response *r = raw_read_reply(fd, CLIENT_MS);
    ck_assert(r && r->status == 0 && r->alloc->n_block_ids == N);
    memcpy(ids, r->alloc->block_ids, N * sizeof(*ids));
    kvshare__response__free_unpacked(r, NULL);
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.tokens.data = (uint8_t *)tokens;
    cm.tokens.len = N * BT * sizeof(*tokens);
    cm.n_block_ids = N;
    cm.block_ids = ids;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    ck_assert_int_eq(raw_send_request(fd, &req), 0);
    close(fd);

    kvs_stats_t st;
    for (int i = 0; i < 3000; i++) {
        stats(c, &st);
        if (st.sessions == 1 && st.writing_blocks == 0 && st.pinned_blocks == 0)
            break;
        usleep(10000);
    }
    ck_assert_uint_eq(st.writing_blocks, 0);
    ck_assert_uint_eq(st.pinned_blocks, 0);
    ck_assert_uint_le(st.cached_blocks, N);
    /* Every cached block is the prompt's prefix, found by a Lookup. */
    size_t n = 0;
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, N * BT, 0, ids, N, &n), 0);
    ck_assert_uint_eq(n, st.cached_blocks);
    printf("a Commit of %d blocks from a client that closed at once: %zu committed\n", N, n);
    kvs_close(c);
    free(tokens);
    free(ids);
}
END_TEST

/* An Alloc of 50,000 blocks on a pool full of unpinned cached blocks
 * evicts exactly what it needs, in pieces, and takes every block. */
START_TEST(test_alloc_in_pieces_evicts_what_it_needs)
{
    enum { N = 50000 };
    kvs_client_t *a = client();
    uint32_t *tokens = malloc(POOL * BT * sizeof(*tokens));
    uint32_t *ids = malloc(POOL * sizeof(*ids)), *can = malloc(POOL * sizeof(*can));
    ck_assert(tokens && ids && can);
    prompt(tokens, POOL * BT, 4);
    size_t done = 0;
    ck_assert_int_eq(kvs_alloc(a, NULL, POOL, ids), 0);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens, POOL * BT, ids, POOL, can, &done), 0);
    ck_assert_int_eq(kvs_release(a, can, POOL, NULL), 0);
    kvs_stats_t st;
    stats(a, &st);
    ck_assert_uint_eq(st.free_blocks, 0);
    ck_assert_int_eq(kvs_alloc(a, NULL, N, ids), 0);
    stats(a, &st); /* the pool was full: exactly N were evicted */
    ck_assert_uint_eq(st.writing_blocks, N);
    ck_assert_uint_eq(st.cached_blocks, POOL - N);
    ck_assert_uint_eq(st.free_blocks, 0);
    ck_assert_int_eq(kvs_release(a, ids, N, NULL), 0);
    wait_counts(a, POOL - N, 0, 0);
    kvs_close(a);
    free(tokens);
    free(ids);
    free(can);
}
END_TEST

/* An Alloc that cannot be met (most of the pool is pinned) fails after
 * its first pieces took blocks: they go back, it takes none. */
START_TEST(test_alloc_in_pieces_takes_all_or_none)
{
    kvs_client_t *a = client(), *b = client();
    uint32_t *tokens = malloc(NB * BT * sizeof(*tokens));
    uint32_t *ids = malloc(POOL * sizeof(*ids)), *can = malloc(NB * sizeof(*can));
    ck_assert(tokens && ids && can);
    prompt(tokens, NB * BT, 5);
    size_t done = 0;
    ck_assert_int_eq(kvs_alloc(a, NULL, NB, ids), 0);
    ck_assert_int_eq(kvs_commit(a, NULL, tokens, NB * BT, ids, NB, can, &done), 0);
    /* a keeps its 40,000 pins: 25,536 blocks are left for b. */
    int rc = kvs_alloc(b, NULL, 30000, ids);
    ck_assert_int_eq(rc, KVS_EPOOLFULL);
    kvs_stats_t st;
    stats(b, &st);
    ck_assert_uint_eq(st.writing_blocks, 0);
    ck_assert_uint_eq(st.free_blocks, POOL - NB);
    ck_assert_int_eq(kvs_alloc(b, NULL, POOL - NB, ids), 0);
    ck_assert_int_eq(kvs_release(b, ids, POOL - NB, NULL), 0);
    ck_assert_int_eq(kvs_release(a, can, NB, NULL), 0);
    kvs_close(b);
    wait_counts(a, NB, 0, 0);
    kvs_close(a);
    free(tokens);
    free(ids);
    free(can);
}
END_TEST

static Suite *pieces_suite(void)
{
    Suite *s = suite_create("pieces");
    TCase *tc = tcase_create("daemon");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_commit_in_pieces_names_every_block);
    tcase_add_test(tc, test_commit_in_pieces_after_a_cached_prefix);
    tcase_add_test(tc, test_close_in_the_middle_of_a_commit);
    tcase_add_test(tc, test_alloc_in_pieces_evicts_what_it_needs);
    tcase_add_test(tc, test_alloc_in_pieces_takes_all_or_none);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(pieces_suite)
