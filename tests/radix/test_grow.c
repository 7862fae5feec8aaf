/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The child table's incremental growth (radix/tree.c, slot_reserve): while
 * the nodes move from the outgrown table to the new one, a chunk per
 * insert, every operation still finds every node (inserts with splits,
 * lookups, pins, evictions, walks), radix_check holds after each step, no
 * insert moves more than RADIX_GROW_CHUNK old slots, and each growth ends
 * before the next one begins. Reads the tree's internals (radix_internal.h).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "radix.h"
#include "test_ids.h"
#include "test_rng.h"
#include "radix_internal.h"

#define BT   2
#define RING 64 /* pinned prompts kept, looked up again and again */

static radix_tree_t *tree_new(uint32_t max_blocks, ids_t *f)
{
    ids_init(f, max_blocks);
    radix_config_t cfg = {
        .block_tokens = BT, .max_blocks = max_blocks, .on_evict = ids_on_evict, .evict_ctx = f};
    radix_tree_t *t = NULL;
    ck_assert_int_eq(radix_new(&cfg, &t), 0);
    return t;
}

static void tree_free(radix_tree_t *t, ids_t *f)
{
    radix_free(t);
    free(f->free);
}

static void check_tree(const radix_tree_t *t)
{
    ck_assert_msg(radix_check(t) == 0, "radix_check failed at check.c:%d", radix_check_line());
}

typedef struct prompt {
    uint32_t tok[16 * BT];
    uint32_t ids[16];
    size_t nb; /* 0: none */
} prompt_t;

/* What happened while a growth was under way. */
typedef struct seen {
    uint32_t growths, inserts, splits, lookups, evictions, removals;
} seen_t;

/* Inserts a random prompt over a small alphabet (prefixes shared, nodes
 * split); pinned into ring slot r. Evicts first when the pool is short. */
static void insert_one(radix_tree_t *t, uint32_t ns, ids_t *f, prompt_t *ring, seen_t *s)
{
    prompt_t *p = &ring[rnd(RING)];
    for (size_t k = 0; k < p->nb; k++) /* the ring slot's old prompt goes */
        ck_assert_int_eq(radix_unpin(t, p->ids[k]), 0);
    p->nb = 1 + rnd(16);
    for (size_t k = 0; k < p->nb * BT; k++)
        p->tok[k] = k < 2 * BT ? rnd(4) : rnd(1000000);
    if (f->n_free < p->nb) {
        size_t ev = 0;
        radix_evict(t, RADIX_NS_ANY, p->nb + 64, &ev);
        ck_assert_uint_ge(f->n_free, p->nb);
    }
    uint32_t ids[16], canon[16];
    for (size_t k = 0; k < p->nb; k++)
        ids[k] = f->free[--f->n_free];
    size_t done = 0;
    uint32_t nodes = t->ns[ns]->n_nodes;
    bool growing = t->old_slots != NULL;
    ck_assert_int_eq(radix_insert(t, ns, p->tok, p->nb * BT, ids, p->nb, true, canon, &done), 0);
    ck_assert_uint_eq(done, p->nb);
    for (size_t k = 0; k < p->nb; k++) {
        p->ids[k] = canon[k];
        if (canon[k] != ids[k])
            f->free[f->n_free++] = ids[k];
    }
    if (growing || t->old_slots) {
        s->inserts++;
        s->splits += t->ns[ns]->n_nodes >= nodes + 2;
    }
}

/* Every pinned prompt of the ring is found whole, in whichever table. */
static void lookup_ring(radix_tree_t *t, uint32_t ns, const prompt_t *ring, seen_t *s)
{
    for (int r = 0; r < RING; r++) {
        const prompt_t *p = &ring[r];
        if (!p->nb)
            continue;
        uint32_t out[16];
        size_t got = 0;
        ck_assert_int_eq(radix_lookup(t, ns, p->tok, p->nb * BT, false, out, 16, &got), 0);
        ck_assert_uint_eq(got, p->nb);
        ck_assert_mem_eq(out, p->ids, p->nb * sizeof(*out));
        s->lookups += t->old_slots != NULL;
    }
}

/* Several doublings with inserts (and splits), lookups, evictions and
 * whole-prompt removals while the nodes move, radix_check after each step
 * while the index is small. */
START_TEST(test_grow_under_changes)
{
    rng_state = 0x9e3779b97f4a7c15ull;
    uint32_t pool = small() ? 6000 : 60000;
    ids_t f;
    radix_tree_t *t = tree_new(pool, &f);
    uint32_t ns;
    ck_assert_int_eq(radix_ns_create(t, "a", 7, 0, 0, &ns), 0);
    static prompt_t ring[RING];
    memset(ring, 0, sizeof(ring));
    seen_t s = {0};
    bool was_growing = false;
    uint32_t steps = small() ? 4000 : 40000;
    for (uint32_t i = 0; i < steps; i++) {
        bool growing = t->old_slots != NULL;
        /* while the nodes move, evictions and removals half the time */
        uint32_t op = growing && rnd(2) ? 12 + rnd(4) : rnd(16);
        if (op < 10) {
            insert_one(t, ns, &f, ring, &s);
        } else if (op < 12) {
            lookup_ring(t, ns, ring, &s);
        } else if (op < 14) {
            size_t ev = 0;
            ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, 1 + rnd(32), &ev), 0);
            s.evictions += growing && ev > 0;
        } else {
            /* a ring prompt unpinned and dropped whole (what nothing else needs) */
            prompt_t *p = &ring[rnd(RING)];
            for (size_t k = 0; k < p->nb; k++)
                ck_assert_int_eq(radix_unpin(t, p->ids[k]), 0);
            size_t m = 0, t1 = 0, t2 = 0;
            if (p->nb)
                ck_assert_int_eq(radix_evict_prompt(t, ns, p->tok, p->nb * BT, &m, &t1, &t2), 0);
            p->nb = 0;
            s.removals += growing && t1 > 0;
        }
        if (t->old_slots && !was_growing)
            s.growths++;
        if (t->old_slots) /* while the nodes move: every pinned prompt still found */
            lookup_ring(t, ns, ring, &s);
        was_growing = t->old_slots != NULL;
        if (t->slot_used + t->old_used < 3000 || i % 97 == 0)
            check_tree(t);
    }
    lookup_ring(t, ns, ring, &s);
    check_tree(t);
    printf("grow: %u growths; while growing: %u inserts (%u splits), %u lookups, %u evicting "
           "steps, %u prompt removals; table %zu slots\n",
           s.growths, s.inserts, s.splits, s.lookups, s.evictions, s.removals, t->slot_mask + 1);
    ck_assert_uint_ge(s.growths, 3);
    ck_assert_uint_gt(s.inserts, 0);
    ck_assert_uint_gt(s.splits, 0);
    ck_assert_uint_gt(s.lookups, 0);
    ck_assert_uint_gt(s.evictions, 0);
    ck_assert_uint_gt(s.removals, 0);
    tree_free(t, &f);
}
END_TEST

/* One-block prompts, one node each: no insert moves more than
 * RADIX_GROW_CHUNK old slots (nor nodes), and a growth always ends before
 * the next one begins (the one-piece fallback never runs). */
START_TEST(test_grow_chunk_per_insert)
{
    uint32_t n = small() ? 20000 : 300000;
    ids_t f;
    radix_tree_t *t = tree_new(n, &f);
    uint32_t ns;
    ck_assert_int_eq(radix_ns_create(t, "a", 7, 0, 0, &ns), 0);
    uint32_t growths = 0;
    size_t most = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t tok[BT] = {i, i ^ 0x5bd1e995u}, id = f.free[--f.n_free], canon;
        size_t mask = t->slot_mask, next = t->old_slots ? t->old_next : 0;
        size_t left = radix__grow_left(t), total = t->slot_used + t->old_used;
        size_t done = 0;
        ck_assert_int_eq(radix_insert(t, ns, tok, BT, &id, 1, false, &canon, &done), 0);
        ck_assert_uint_eq(done, 1);
        if (t->slot_mask != mask) {     /* a growth began here */
            ck_assert_uint_eq(left, 0); /* the last one had ended */
            /* a small outgrown table moves whole with the first chunk */
            ck_assert(t->old_slots || mask + 1 <= RADIX_GROW_CHUNK);
            growths++;
            next = 0;
            left = total; /* every node was in the table it outgrew */
        }
        size_t moved_slots = t->old_slots ? t->old_next - next : 0;
        size_t left_now = radix__grow_left(t);
        ck_assert_uint_le(moved_slots, RADIX_GROW_CHUNK);
        ck_assert_uint_le(left - left_now, RADIX_GROW_CHUNK);
        most = moved_slots > most ? moved_slots : most;
        if (n <= 20000 && (t->old_slots || t->slot_mask != mask))
            check_tree(t);
    }
    check_tree(t);
    printf("chunk: %u growths over %u nodes, at most %zu old slots moved by one insert\n", growths,
           n, most);
    ck_assert_uint_ge(growths, small() ? 8 : 12);
    tree_free(t, &f);
}
END_TEST

/* A stepped walk begun while the table grows moves the nodes itself and
 * then gives radix_top's rows (nothing changes between its steps). */
START_TEST(test_grow_walk)
{
    uint32_t n = small() ? 3000 : 30000;
    ids_t f;
    radix_tree_t *t = tree_new(n, &f);
    uint32_t ns;
    ck_assert_int_eq(radix_ns_create(t, "a", 7, 0, 0, &ns), 0);
    uint32_t i = 0;
    /* insert until a growth is under way past its first chunk */
    for (; i < n && !(t->old_slots && t->old_used > 2 * RADIX_GROW_CHUNK); i++) {
        uint32_t tok[2 * BT] = {i % 7, i, i ^ 0x5bd1e995u, i + 1}, ids[2], canon[2];
        ids[0] = f.free[--f.n_free];
        ids[1] = f.free[--f.n_free];
        size_t done = 0;
        ck_assert_int_eq(radix_insert(t, ns, tok, 2 * BT, ids, 2, false, canon, &done), 0);
        for (size_t k = 0; k < 2; k++)
            if (canon[k] != ids[k])
                f.free[f.n_free++] = ids[k];
    }
    ck_assert_ptr_nonnull(t->old_slots);
    check_tree(t);
    static radix_prefix_t want[100], got[100];
    size_t n_want = 0, n_got = 0;
    ck_assert_int_eq(radix_top(t, ns, RADIX_BY_SIZE, want, 100, &n_want), 0);
    radix_top_walk_t *w = NULL;
    ck_assert_int_eq(radix_top_begin(t, ns, RADIX_BY_SIZE, 100, &w), 0);
    bool done = false;
    uint32_t steps = 0, growing_steps = 0;
    while (!done) {
        growing_steps += t->old_slots != NULL;
        ck_assert_int_eq(radix_top_step(t, w, 64, &done), 0);
        check_tree(t);
        steps++;
    }
    ck_assert_ptr_null(t->old_slots);
    ck_assert_uint_gt(growing_steps, 1);
    ck_assert_int_eq(radix_top_rows(w, got, 100, &n_got), 0);
    radix_top_end(w);
    ck_assert_uint_eq(n_got, n_want);
    for (size_t k = 0; k < n_got; k++) {
        ck_assert_uint_eq(got[k].last_block_id, want[k].last_block_id);
        ck_assert_uint_eq(got[k].blocks, want[k].blocks);
        ck_assert_uint_eq(got[k].tokens, want[k].tokens);
    }
    tree_free(t, &f);
}
END_TEST

static Suite *grow_suite(void)
{
    Suite *s = suite_create("grow");
    TCase *tc = tcase_create("grow");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_grow_under_changes);
    tcase_add_test(tc, test_grow_chunk_per_insert);
    tcase_add_test(tc, test_grow_walk);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(grow_suite)
