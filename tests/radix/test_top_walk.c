/* SPDX-License-Identifier: Apache-2.0 */
/*
 * radix_top in steps (radix_top_begin / step / rows / end): on an index that
 * does not change it lists exactly what radix_top lists, whatever the step
 * budget; on one that changes between steps it stays sane, never misses a
 * prefix that stayed put (a namespace left alone while another churns is
 * listed exactly), drops a deleted namespace's rows, and frees everything
 * (ASan, valgrind). Seeded and repeatable.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "radix.h"
#include "test_ids.h"
#include "test_rng.h"

#define BT 2

/* Every block's hash in 4 values: prefixes collide all over. */
static uint64_t weak_hash(const uint32_t *tokens, size_t n, uint64_t seed)
{
    (void)n;
    return (seed ^ tokens[0]) & 3;
}

static radix_tree_t *tree_new(uint32_t max_blocks, uint32_t tier2, radix_hash_fn hash, ids_t *f)
{
    ids_init(f, max_blocks);
    radix_config_t cfg = {.block_tokens = BT,
                          .max_blocks = max_blocks,
                          .on_evict = ids_on_evict,
                          .evict_ctx = f,
                          .hash = hash,
                          .tier2_blocks = tier2};
    radix_tree_t *t = NULL;
    ck_assert_int_eq(radix_new(&cfg, &t), 0);
    return t;
}

/* Inserts a random prompt of up to max_nb blocks over a small alphabet (so
 * prompts share prefixes and branch), pinned now and then, and looks up
 * some prefix of it (hits). Evicts when the pool is short. */
static bool no_pins; /* churn that pins nothing (a namespace it deletes) */

static void churn_one(radix_tree_t *t, uint32_t ns, ids_t *f, uint32_t alphabet, uint32_t max_nb)
{
    uint32_t tok[64 * BT], ids[64], canon[64], out[64];
    size_t nb = 1 + rnd(max_nb), done = 0, got;
    for (size_t k = 0; k < nb * BT; k++)
        tok[k] = rnd(alphabet);
    if (f->n_free < nb) {
        size_t ev = 0;
        radix_evict(t, RADIX_NS_ANY, nb, &ev);
        if (f->n_free < nb)
            return;
    }
    for (size_t k = 0; k < nb; k++)
        ids[k] = f->free[--f->n_free];
    bool pin = rnd(8) == 0 && !no_pins;
    int rc = radix_insert(t, ns, tok, nb * BT, ids, nb, pin, canon, &done);
    ck_assert(rc == 0 || rc == KVS_EQUOTA);
    for (size_t k = 0; k < nb; k++)
        if (k >= done || canon[k] != ids[k])
            f->free[f->n_free++] = ids[k];
    size_t look = 1 + rnd((uint32_t)nb);
    for (uint32_t r = rnd(3); r > 0; r--)
        ck_assert_int_eq(radix_lookup(t, ns, tok, look * BT, false, out, 64, &got), 0);
}

/* Some blocks to tier 2 and back into their place (copies done). */
static void demote_some(radix_tree_t *t, uint32_t ns, uint32_t n)
{
    radix_move_t moves[64];
    size_t moved = 0, dropped = 0;
    ck_assert_int_eq(radix_demote(t, ns, n, moves, &moved, &dropped), 0);
    for (size_t i = 0; i < moved; i++) {
        uint32_t peer;
        ck_assert_int_eq(radix_copy_done(t, moves[i].to, &peer), 0);
    }
}

/* Runs a walk to its end in steps of `budget`, calling between(ctx) before
 * every step but the first; returns its rows in out. */
static size_t walk_rows(radix_tree_t *t, uint32_t ns, radix_order_t order, size_t max,
                        size_t budget, void (*between)(void *), void *ctx, radix_prefix_t *out,
                        size_t *steps)
{
    radix_top_walk_t *w = NULL;
    ck_assert_int_eq(radix_top_begin(t, ns, order, max, &w), 0);
    bool done = false;
    size_t n = 0;
    *steps = 0;
    while (!done) {
        if (*steps > 0 && between)
            between(ctx);
        ck_assert_int_eq(radix_top_step(t, w, budget, &done), 0);
        ck_assert_uint_gt(radix_top_walk_bytes(w), 0);
        (*steps)++;
        ck_assert_uint_lt(*steps, 100000000);
    }
    ck_assert_int_eq(radix_top_rows(w, out, max, &n), 0);
    radix_top_end(w);
    return n;
}

static void rows_equal(const radix_prefix_t *a, size_t na, const radix_prefix_t *b, size_t nb,
                       const char *what)
{
    ck_assert_msg(na == nb, "%s: %zu rows, radix_top %zu", what, na, nb);
    for (size_t i = 0; i < na; i++) {
        const radix_prefix_t *x = &a[i], *y = &b[i];
        ck_assert_msg(x->ns == y->ns && x->tokens == y->tokens && x->blocks == y->blocks &&
                          x->pins == y->pins && x->hits == y->hits &&
                          x->last_used == y->last_used && x->last_block_id == y->last_block_id &&
                          x->tier2_blocks == y->tier2_blocks && x->has_parent == y->has_parent &&
                          (!x->has_parent || x->parent_block_id == y->parent_block_id),
                      "%s: row %zu differs (block %u blocks %u pins %u hits %llu against block "
                      "%u blocks %u pins %u hits %llu)",
                      what, i, x->last_block_id, x->blocks, x->pins, (unsigned long long)x->hits,
                      y->last_block_id, y->blocks, y->pins, (unsigned long long)y->hits);
    }
}

/* Compares the walk with radix_top for both orders, every namespace and
 * all, several maxima and budgets. */
static void compare_all(radix_tree_t *t, const uint32_t *nss, size_t n_ns, const char *what)
{
    static radix_prefix_t a[1200], b[1200];
    const size_t maxes[] = {0, 1, 7, 1000, 1200};
    const size_t budgets[] = {1, 64, (size_t)1 << 30};
    for (int order = 0; order < 2; order++)
        for (size_t k = 0; k <= n_ns; k++) {
            uint32_t ns = k < n_ns ? nss[k] : RADIX_NS_ALL;
            for (size_t m = 0; m < sizeof(maxes) / sizeof(maxes[0]); m++) {
                size_t nb = 0;
                ck_assert_int_eq(radix_top(t, ns, (radix_order_t)order, b, maxes[m], &nb), 0);
                for (size_t g = 0; g < sizeof(budgets) / sizeof(budgets[0]); g++) {
                    if (budgets[g] == 1 && maxes[m] != 7)
                        continue; /* the dearest: once per namespace and order */
                    size_t steps;
                    size_t na = walk_rows(t, ns, (radix_order_t)order, maxes[m], budgets[g], NULL,
                                          NULL, a, &steps);
                    char label[160];
                    snprintf(label, sizeof(label), "%s, order %d, ns %u, max %zu, budget %zu", what,
                             order, ns, maxes[m], budgets[g]);
                    rows_equal(a, na, b, nb, label);
                }
            }
        }
}

static void static_case(uint64_t seed, radix_hash_fn hash, uint32_t tier2, const char *what)
{
    ids_t f;
    rng_state = seed;
    radix_tree_t *t = tree_new(3000, tier2, hash, &f);
    uint32_t nss[3];
    for (uint32_t k = 0; k < 3; k++) {
        char name[8] = {'n', 's', (char)('0' + k), 0};
        ck_assert_int_eq(radix_ns_create(t, name, 77 + k, 0, 0, &nss[k]), 0);
    }
    for (int i = 0; i < (small() ? 300 : 1500); i++) {
        churn_one(t, nss[rnd(3)], &f, 3, 12);
        if (tier2 && i % 50 == 49)
            demote_some(t, nss[rnd(3)], 1 + rnd(40));
    }
    ck_assert_int_eq(radix_check(t), 0);
    compare_all(t, nss, 3, what);
    radix_free(t);
    free(f.free);
}

START_TEST(test_walk_equals_one_piece)
{
    static_case(1, NULL, 0, "xxh3");
    static_case(2, NULL, 2000, "xxh3 with a tier 2");
    static_case(3, weak_hash, 0, "colliding hashes");
}
END_TEST

START_TEST(test_walk_empty_and_errors)
{
    ids_t f;
    radix_tree_t *t = tree_new(16, 0, NULL, &f);
    uint32_t ns;
    ck_assert_int_eq(radix_ns_create(t, "a", 1, 0, 0, &ns), 0);
    radix_prefix_t rows[4];
    size_t steps, n = walk_rows(t, ns, RADIX_BY_HITS, 4, 1, NULL, NULL, rows, &steps);
    ck_assert_uint_eq(n, 0);
    radix_top_walk_t *w = NULL;
    ck_assert_int_eq(radix_top_begin(t, ns + 5, RADIX_BY_HITS, 4, &w), KVS_ENONS);
    ck_assert_int_eq(radix_top_begin(t, ns, (radix_order_t)7, 4, &w), KVS_EINVAL);
    ck_assert_int_eq(radix_top_begin(t, ns, RADIX_BY_SIZE, 4, &w), 0);
    bool done = false;
    ck_assert_int_eq(radix_top_rows(w, rows, 4, &n), KVS_EBUSY);
    ck_assert_int_eq(radix_top_step(t, w, 0, &done), KVS_EINVAL);
    radix_top_end(w); /* unfinished: freed all the same */
    radix_top_end(NULL);
    radix_free(t);
    free(f.free);
}
END_TEST

/* The churn between two steps of a walk of another namespace. */
typedef struct churn {
    radix_tree_t *t;
    ids_t *f;
    uint32_t busy; /* the namespace that changes */
    bool deleted, deletes;
    int steps, deletions;
} churn_t;

static void churn_between(void *ctx)
{
    churn_t *c = ctx;
    c->steps++;
    uint32_t op = rnd(10);
    if (c->deleted) {
        /* a namespace created in its place: it takes the deleted one's id */
        uint32_t ns;
        ck_assert_int_eq(radix_ns_create(c->t, "busy", 999 + (uint64_t)c->steps, 0, 0, &ns), 0);
        ck_assert_uint_eq(ns, c->busy);
        c->deleted = false;
    } else if (op < 6) {
        no_pins = c->deletes;
        for (int i = 0; i < 20; i++)
            churn_one(c->t, c->busy, c->f, 50, 6); /* grows the child table */
        no_pins = false;
    } else if (op < 9) {
        size_t n = 0;
        ck_assert_int_eq(radix_ns_clear_step(c->t, c->busy, 1 + rnd(60), &n), 0);
    } else if (c->deletes) {
        size_t n = 0;
        ck_assert_int_eq(radix_ns_clear(c->t, c->busy, &n), 0);
        if (radix_ns_delete(c->t, c->busy) == 0) {
            c->deleted = true;
            c->deletions++;
        }
    }
    if (c->steps % (small() ? 64 : 8) == 0)
        ck_assert_int_eq(radix_check(c->t), 0);
}

/* Namespace "quiet" does not change; "busy" churns between every two steps,
 * growing the child table (a new sweep) and dropping nodes (the table
 * shifts its slots back). The walk of "quiet" must list exactly what
 * radix_top lists at the end. */
START_TEST(test_walk_of_a_quiet_namespace_under_churn)
{
    for (uint64_t seed = 10; seed < (small() ? 11 : 14); seed++) {
        ids_t f;
        rng_state = seed;
        radix_tree_t *t = tree_new(20000, 0, NULL, &f);
        uint32_t quiet, busy;
        /* reserved: the busy one's evictions never take the quiet one's blocks */
        ck_assert_int_eq(radix_ns_create(t, "quiet", 5, 0, 10000, &quiet), 0);
        ck_assert_int_eq(radix_ns_create(t, "busy", 6, 0, 0, &busy), 0);
        for (int i = 0; i < 600; i++)
            churn_one(t, quiet, &f, 3, 10);
        for (int i = 0; i < 200; i++)
            churn_one(t, busy, &f, 50, 6);
        churn_t c = {t, &f, busy, false, false, 0, 0};
        static radix_prefix_t a[1000], b[1000];
        size_t steps;
        size_t na = walk_rows(t, quiet, RADIX_BY_SIZE, 1000, 16, churn_between, &c, a, &steps);
        size_t nb = 0;
        ck_assert_int_eq(radix_top(t, quiet, RADIX_BY_SIZE, b, 1000, &nb), 0);
        char label[64];
        snprintf(label, sizeof(label), "quiet namespace, seed %llu (%zu steps)",
                 (unsigned long long)seed, steps);
        rows_equal(a, na, b, nb, label);
        ck_assert_uint_gt(steps, 50);
        radix_ns_stats_t st;
        ck_assert_int_eq(radix_ns_stats(t, quiet, &st), 0);
        ck_assert_uint_lt(st.cached_blocks, 10000);
        radix_free(t);
        free(f.free);
    }
}
END_TEST

/* A walk of every namespace while one churns and is deleted (and its id
 * reused): the rows are sane (sorted, of live namespaces that were there
 * at the start, none of the deleted one's), and nothing leaks. */
START_TEST(test_walk_of_all_under_churn_and_delete)
{
    for (uint64_t seed = 20; seed < (small() ? 21 : 24); seed++) {
        ids_t f;
        rng_state = seed;
        radix_tree_t *t = tree_new(20000, 0, NULL, &f);
        uint32_t quiet, busy;
        ck_assert_int_eq(radix_ns_create(t, "quiet", 5, 0, 0, &quiet), 0);
        ck_assert_int_eq(radix_ns_create(t, "busy", 6, 0, 0, &busy), 0);
        for (int i = 0; i < 400; i++)
            churn_one(t, quiet, &f, 3, 10);
        no_pins = true;
        for (int i = 0; i < 400; i++)
            churn_one(t, busy, &f, 50, 6);
        no_pins = false;
        churn_t c = {t, &f, busy, false, true, 0, 0};
        static radix_prefix_t a[1000];
        size_t steps;
        size_t na =
            walk_rows(t, RADIX_NS_ALL, RADIX_BY_HITS, 1000, 32, churn_between, &c, a, &steps);
        ck_assert_int_gt(c.deletions, 0); /* these seeds delete it, and reuse its id */
        ck_assert_uint_le(na, 1000);
        ck_assert_uint_gt(na, 0);
        for (size_t i = 0; i < na; i++) {
            /* the deleted namespace's rows are gone, its successor's too */
            ck_assert_uint_eq(a[i].ns, quiet);
            ck_assert_uint_ge(a[i].blocks, 1);
            ck_assert_uint_eq(a[i].tokens % BT, 0);
            if (i > 0)
                ck_assert(a[i - 1].hits > a[i].hits ||
                          (a[i - 1].hits == a[i].hits && a[i - 1].tokens <= a[i].tokens));
        }
        radix_free(t);
        free(f.free);
    }
}
END_TEST

/* Walk sizes: each step's work is bounded by the budget (a fixed index of
 * one-block prefixes: every step but the phase ends looks at about the
 * budget's worth), and the walk's memory is about what radix.h says. */
START_TEST(test_walk_memory_and_steps)
{
    ids_t f;
    rng_state = 5;
    uint32_t n = 20000;
    radix_tree_t *t = tree_new(n, 0, NULL, &f);
    uint32_t ns;
    ck_assert_int_eq(radix_ns_create(t, "a", 1, 0, 0, &ns), 0);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t tok[BT] = {i, i + 1}, id = i, canon;
        size_t done;
        ck_assert_int_eq(radix_insert(t, ns, tok, BT, &id, 1, false, &canon, &done), 0);
    }
    radix_top_walk_t *w = NULL;
    ck_assert_int_eq(radix_top_begin(t, ns, RADIX_BY_HITS, 10, &w), 0);
    bool done = false;
    size_t steps = 0, peak = 0;
    while (!done) {
        ck_assert_int_eq(radix_top_step(t, w, 1000, &done), 0);
        size_t b = radix_top_walk_bytes(w);
        peak = b > peak ? b : peak;
        steps++;
    }
    size_t entries;
    uint32_t restarts;
    uint64_t missed;
    radix_top_walk_info(w, &entries, &restarts, &missed);
    ck_assert_uint_eq(restarts, 0);
    ck_assert_uint_eq(missed, 0);
    /* sweep ~ (8 x n + empty slots) / 1000, link, sum, select ~ 4 x n / 1000 each */
    ck_assert_uint_gt(steps, (8 * (size_t)n) / 1000);
    ck_assert_uint_lt(steps, (8 * (size_t)n + 4 * (size_t)n + 12 * (size_t)n) / 1000 + 20);
    ck_assert_uint_lt(peak, 120 * (size_t)n);
    ck_assert_uint_gt(peak, 72 * (size_t)n);
    radix_top_end(w);
    radix_free(t);
    free(f.free);
}
END_TEST

/* Allocation failures inside a walk: the step fails with KVS_ENOMEM, the
 * next one goes on, and the rows are still radix_top's. */
static int fail_countdown = -1;

static bool fail_alloc(void *ctx)
{
    (void)ctx;
    if (fail_countdown < 0)
        return false;
    return fail_countdown-- == 0;
}

START_TEST(test_walk_allocation_failures)
{
    ids_t f;
    rng_state = 7;
    ids_init(&f, 2000);
    radix_config_t cfg = {.block_tokens = BT,
                          .max_blocks = 2000,
                          .on_evict = ids_on_evict,
                          .evict_ctx = &f,
                          .fail_alloc = fail_alloc};
    radix_tree_t *t = NULL;
    ck_assert_int_eq(radix_new(&cfg, &t), 0);
    uint32_t ns;
    ck_assert_int_eq(radix_ns_create(t, "a", 1, 0, 0, &ns), 0);
    for (int i = 0; i < 800; i++)
        churn_one(t, ns, &f, 4, 8);
    static radix_prefix_t a[50], b[50];
    size_t nb = 0, na = 0;
    ck_assert_int_eq(radix_top(t, ns, RADIX_BY_SIZE, b, 50, &nb), 0);
    int failures = 0;
    for (int k = 0; k < 12; k++) {
        radix_top_walk_t *w = NULL;
        fail_countdown = k % 3;
        int rc = radix_top_begin(t, ns, RADIX_BY_SIZE, 50, &w);
        if (rc == KVS_ENOMEM) {
            failures++;
            continue;
        }
        ck_assert_int_eq(rc, 0);
        bool done = false;
        fail_countdown = k;
        while (!done) {
            rc = radix_top_step(t, w, 200, &done);
            ck_assert(rc == 0 || rc == KVS_ENOMEM);
            failures += rc == KVS_ENOMEM;
        }
        fail_countdown = -1;
        ck_assert_int_eq(radix_top_rows(w, a, 50, &na), 0);
        rows_equal(a, na, b, nb, "after a failed allocation");
        radix_top_end(w);
    }
    fail_countdown = -1;
    ck_assert_int_gt(failures, 3);
    radix_free(t);
    free(f.free);
}
END_TEST

static Suite *top_walk_suite(void)
{
    Suite *s = suite_create("top_walk");
    TCase *tc = tcase_create("walk");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_walk_equals_one_piece);
    tcase_add_test(tc, test_walk_empty_and_errors);
    tcase_add_test(tc, test_walk_of_a_quiet_namespace_under_churn);
    tcase_add_test(tc, test_walk_of_all_under_churn_and_delete);
    tcase_add_test(tc, test_walk_memory_and_steps);
    tcase_add_test(tc, test_walk_allocation_failures);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(top_walk_suite)
