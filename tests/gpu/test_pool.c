/* SPDX-License-Identifier: Apache-2.0 */
/* pool: the free stack and per-block states, against a trivial model. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

/* free + writing + cached == total, and the counts match the states. */
static void check_invariants(const pool_t *p)
{
    pool_counts_t c;
    pool_counts(p, &c);
    ck_assert_uint_eq((uint64_t)c.free + c.writing + c.cached, c.total);
    uint32_t seen[3] = {0, 0, 0};
    for (uint32_t id = 0; id < c.total; id++) {
        pool_state_t s;
        ck_assert_int_eq(pool_state(p, id, &s), 0);
        ck_assert_int_le(s, POOL_CACHED);
        seen[s]++;
    }
    ck_assert_uint_eq(seen[POOL_FREE], c.free);
    ck_assert_uint_eq(seen[POOL_WRITING], c.writing);
    ck_assert_uint_eq(seen[POOL_CACHED], c.cached);
}

START_TEST(new_rejects_zero)
{
    pool_t *p = (pool_t *)0x1;
    ck_assert_int_eq(pool_new(0, &p), KVS_EINVAL);
    ck_assert_int_eq(pool_new(4, NULL), KVS_EINVAL);
    pool_free(NULL);
}
END_TEST

START_TEST(fresh_pool_all_free)
{
    pool_t *p;
    ck_assert_int_eq(pool_new(16, &p), 0);
    pool_counts_t c;
    pool_counts(p, &c);
    ck_assert_uint_eq(c.total, 16);
    ck_assert_uint_eq(c.free, 16);
    ck_assert_uint_eq(c.writing, 0);
    ck_assert_uint_eq(c.cached, 0);
    ck_assert_uint_eq(c.alloc_failures, 0);
    check_invariants(p);
    pool_free(p);
}
END_TEST

START_TEST(alloc_until_exhausted)
{
    pool_t *p;
    ck_assert_int_eq(pool_new(8, &p), 0);
    uint32_t ids[8];
    uint8_t seen[8] = {0};
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(pool_alloc(p, 1, &ids[i]), 0);
        ck_assert_uint_lt(ids[i], 8);
        ck_assert_uint_eq(seen[ids[i]], 0); /* never handed out twice */
        seen[ids[i]] = 1;
        pool_state_t s;
        ck_assert_int_eq(pool_state(p, ids[i], &s), 0);
        ck_assert_int_eq(s, POOL_WRITING);
        check_invariants(p);
    }
    uint32_t extra = 12345;
    ck_assert_int_eq(pool_alloc(p, 1, &extra), KVS_EPOOLFULL);
    ck_assert_uint_eq(extra, 12345);
    pool_counts_t c;
    pool_counts(p, &c);
    ck_assert_uint_eq(c.free, 0);
    ck_assert_uint_eq(c.writing, 8);
    ck_assert_uint_eq(c.alloc_failures, 1);
    /* releasing one makes exactly that one available again */
    ck_assert_int_eq(pool_release(p, ids[3]), 0);
    ck_assert_int_eq(pool_alloc(p, 1, &extra), 0);
    ck_assert_uint_eq(extra, ids[3]);
    check_invariants(p);
    pool_free(p);
}
END_TEST

START_TEST(batch_all_or_nothing)
{
    pool_t *p;
    ck_assert_int_eq(pool_new(10, &p), 0);
    uint32_t ids[10];
    ck_assert_int_eq(pool_alloc(p, 7, ids), 0);
    uint32_t more[4] = {99, 99, 99, 99};
    ck_assert_int_eq(pool_alloc(p, 4, more), KVS_EPOOLFULL);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(more[i], 99);
    pool_counts_t c;
    pool_counts(p, &c);
    ck_assert_uint_eq(c.free, 3); /* nothing taken */
    ck_assert_uint_eq(c.writing, 7);
    ck_assert_uint_eq(c.alloc_failures, 1);
    ck_assert_int_eq(pool_alloc(p, 3, more), 0);
    pool_counts(p, &c);
    ck_assert_uint_eq(c.free, 0);
    /* all ten ids distinct */
    uint8_t seen[10] = {0};
    for (int i = 0; i < 7; i++)
        seen[ids[i]]++;
    for (int i = 0; i < 3; i++)
        seen[more[i]]++;
    for (int i = 0; i < 10; i++)
        ck_assert_uint_eq(seen[i], 1);
    ck_assert_int_eq(pool_alloc(p, 0, more), KVS_EINVAL);
    ck_assert_int_eq(pool_alloc(p, 1, NULL), KVS_EINVAL);
    ck_assert_int_eq(pool_alloc(NULL, 1, more), KVS_EINVAL);
    check_invariants(p);
    pool_free(p);
}
END_TEST

START_TEST(double_free_rejected)
{
    pool_t *p;
    ck_assert_int_eq(pool_new(4, &p), 0);
    uint32_t ids[2];
    ck_assert_int_eq(pool_alloc(p, 2, ids), 0);
    ck_assert_int_eq(pool_release(p, ids[0]), 0);
    pool_counts_t before, after;
    pool_counts(p, &before);
    ck_assert_int_eq(pool_release(p, ids[0]), KVS_EBADSTATE);
    pool_counts(p, &after);
    ck_assert_int_eq(memcmp(&before, &after, sizeof(before)), 0);
    /* the id is on the free stack once: 3 free blocks, then full */
    uint32_t got[3];
    ck_assert_int_eq(pool_alloc(p, 3, got), 0);
    ck_assert(got[0] != got[1] && got[1] != got[2] && got[0] != got[2]);
    ck_assert_int_eq(pool_alloc(p, 1, got), KVS_EPOOLFULL);
    /* a never-allocated block is FREE too */
    pool_t *q;
    ck_assert_int_eq(pool_new(2, &q), 0);
    ck_assert_int_eq(pool_release(q, 1), KVS_EBADSTATE);
    check_invariants(q);
    pool_free(q);
    check_invariants(p);
    pool_free(p);
}
END_TEST

START_TEST(state_transitions)
{
    pool_t *p;
    ck_assert_int_eq(pool_new(3, &p), 0);
    uint32_t id;
    pool_state_t s;
    ck_assert_int_eq(pool_set_cached(p, 0), KVS_EBADSTATE); /* FREE -> CACHED refused */
    ck_assert_int_eq(pool_alloc(p, 1, &id), 0);
    ck_assert_int_eq(pool_set_cached(p, id), 0);
    ck_assert_int_eq(pool_state(p, id, &s), 0);
    ck_assert_int_eq(s, POOL_CACHED);
    ck_assert_int_eq(pool_set_cached(p, id), KVS_EBADSTATE); /* already CACHED */
    pool_counts_t c;
    pool_counts(p, &c);
    ck_assert_uint_eq(c.cached, 1);
    ck_assert_uint_eq(c.writing, 0);
    check_invariants(p);
    ck_assert_int_eq(pool_release(p, id), 0); /* evicted */
    ck_assert_int_eq(pool_state(p, id, &s), 0);
    ck_assert_int_eq(s, POOL_FREE);
    pool_counts(p, &c);
    ck_assert_uint_eq(c.free, 3);
    ck_assert_int_eq(pool_set_cached(p, 3), KVS_EINVAL);
    ck_assert_int_eq(pool_release(p, 3), KVS_EINVAL);
    ck_assert_int_eq(pool_state(p, 3, &s), KVS_EINVAL);
    ck_assert_int_eq(pool_state(p, 0, NULL), KVS_EINVAL);
    check_invariants(p);
    pool_free(p);
}
END_TEST

/* Seeded random operations against a model array of states. */
START_TEST(differential_random)
{
    const uint32_t n = getenv("KVS_TEST_SMALL") ? 64 : 512;
    const int steps = getenv("KVS_TEST_SMALL") ? 4000 : 40000;
    pool_t *p;
    ck_assert_int_eq(pool_new(n, &p), 0);
    uint8_t *model = calloc(n, 1);
    uint32_t *ids = malloc(n * sizeof(*ids));
    ck_assert_ptr_nonnull(model);
    ck_assert_ptr_nonnull(ids);
    uint32_t model_free = n;
    uint64_t failures = 0;
    srand(20261129);
    for (int step = 0; step < steps; step++) {
        int op = rand() % 3;
        if (op == 0) {
            uint32_t k = 1 + (uint32_t)rand() % 8;
            int rc = pool_alloc(p, k, ids);
            if (k > model_free) {
                ck_assert_int_eq(rc, KVS_EPOOLFULL);
                failures++;
            } else {
                ck_assert_int_eq(rc, 0);
                for (uint32_t i = 0; i < k; i++) {
                    ck_assert_uint_eq(model[ids[i]], POOL_FREE);
                    model[ids[i]] = POOL_WRITING;
                }
                model_free -= k;
            }
        } else {
            uint32_t id = (uint32_t)rand() % n;
            int rc = op == 1 ? pool_set_cached(p, id) : pool_release(p, id);
            if (op == 1) {
                ck_assert_int_eq(rc, model[id] == POOL_WRITING ? 0 : KVS_EBADSTATE);
                if (rc == 0)
                    model[id] = POOL_CACHED;
            } else {
                ck_assert_int_eq(rc, model[id] != POOL_FREE ? 0 : KVS_EBADSTATE);
                if (rc == 0) {
                    model[id] = POOL_FREE;
                    model_free++;
                }
            }
        }
        if (step % 97 == 0) {
            check_invariants(p);
            for (uint32_t id = 0; id < n; id++) {
                pool_state_t s;
                pool_state(p, id, &s);
                ck_assert_int_eq(s, model[id]);
            }
        }
    }
    pool_counts_t c;
    pool_counts(p, &c);
    ck_assert_uint_eq(c.free, model_free);
    ck_assert_uint_eq(c.alloc_failures, failures);
    free(model);
    free(ids);
    pool_free(p);
}
END_TEST

static Suite *pool_suite(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, new_rejects_zero);
    tcase_add_test(tc, fresh_pool_all_free);
    tcase_add_test(tc, alloc_until_exhausted);
    tcase_add_test(tc, batch_all_or_nothing);
    tcase_add_test(tc, double_free_rejected);
    tcase_add_test(tc, state_transitions);
    tcase_add_test(tc, differential_random);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(pool_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
