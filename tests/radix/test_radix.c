/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the prefix index, one group per operation, and a seeded
 * differential test against the flat model in radix_model.c. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "radix.h"
#include "radix_diff.h"
#include "radix_model.h"

#define BT 4

/* ---- helpers -------------------------------------------------------------- */

typedef struct evictions {
    uint32_t ids[4096];
    size_t n;
} evictions_t;

static void record_evict(void *ctx, uint32_t block_id)
{
    evictions_t *e = ctx;
    if (e->n < sizeof(e->ids) / sizeof(e->ids[0]))
        e->ids[e->n] = block_id;
    e->n++;
}

static evictions_t ev;

static radix_tree_t *tree_cfg(radix_config_t cfg)
{
    cfg.on_evict = record_evict;
    cfg.evict_ctx = &ev;
    radix_tree_t *t = NULL;
    memset(&ev, 0, sizeof(ev));
    ck_assert_int_eq(radix_new(&cfg, &t), 0);
    ck_assert_ptr_nonnull(t);
    return t;
}

static radix_tree_t *tree_with(uint32_t bt, uint32_t max_blocks, radix_hash_fn hash)
{
    radix_config_t cfg = {.block_tokens = bt, .max_blocks = max_blocks, .hash = hash};
    return tree_cfg(cfg);
}

static uint32_t ns_new(radix_tree_t *t, const char *name, uint32_t quota, uint32_t reserve)
{
    uint32_t ns = 99;
    ck_assert_int_eq(radix_ns_create(t, name, 0x1234 + strlen(name), quota, reserve, &ns), 0);
    return ns;
}

/* Prompt of n tokens: token k = base * 1000 + k, so prompts with different
 * bases share nothing. */
static void prompt(uint32_t *tok, size_t n, uint32_t base)
{
    for (size_t k = 0; k < n; k++)
        tok[k] = base * 1000 + (uint32_t)k;
}

/* Inserts n_ids blocks with ids first_id, first_id+1, ...; checks rc. */
static void insert_run(radix_tree_t *t, uint32_t ns, const uint32_t *tok, size_t n_ids,
                       uint32_t first_id, bool pin, int want_rc)
{
    uint32_t ids[512], canon[512];
    size_t done = 999;
    for (size_t k = 0; k < n_ids; k++)
        ids[k] = first_id + (uint32_t)k;
    ck_assert_int_eq(radix_insert(t, ns, tok, n_ids * BT, ids, n_ids, pin, canon, &done), want_rc);
    ck_assert_int_eq(radix_check(t), 0);
}

static size_t lookup_n(radix_tree_t *t, uint32_t ns, const uint32_t *tok, size_t n_tokens,
                       uint32_t *ids)
{
    uint32_t tmp[512];
    size_t n = 999;
    ck_assert_int_eq(radix_lookup(t, ns, tok, n_tokens, false, ids ? ids : tmp, 512, &n), 0);
    ck_assert_int_eq(radix_check(t), 0);
    return n;
}

/* Evicts up to max blocks on behalf of for_ns: exactly n_want go, and they
 * are want[0 .. n_want), in that order (the next entries of ev.ids). */
static void evict_expect(radix_tree_t *t, uint32_t for_ns, size_t max, const uint32_t *want,
                         size_t n_want)
{
    size_t got = 999, from = ev.n;
    ck_assert_int_eq(radix_evict(t, for_ns, max, &got), 0);
    ck_assert_uint_eq(got, n_want);
    ck_assert_uint_eq(ev.n, from + n_want);
    for (size_t k = 0; k < n_want; k++)
        ck_assert_uint_eq(ev.ids[from + k], want[k]);
}

/* ---- tree and namespaces --------------------------------------------------- */

START_TEST(test_new_args)
{
    radix_tree_t *t = NULL;
    radix_config_t cfg = {.block_tokens = 0, .max_blocks = 10};
    ck_assert_int_eq(radix_new(&cfg, &t), KVS_EINVAL);
    cfg.block_tokens = 16;
    cfg.max_blocks = 0;
    ck_assert_int_eq(radix_new(&cfg, &t), KVS_EINVAL);
    ck_assert_int_eq(radix_new(NULL, &t), KVS_EINVAL);
    ck_assert_ptr_null(t);
    radix_free(NULL);
    cfg.max_blocks = 10;
    ck_assert_int_eq(radix_new(&cfg, &t), 0);
    ck_assert_int_eq(radix_cached_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_gt(radix_memory_bytes(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_namespaces)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "tenant-b", 5, 2), x = 7;
    ck_assert_uint_eq(a, 0);
    ck_assert_uint_eq(b, 1);
    ck_assert_uint_eq(radix_ns_count(t), 2);
    ck_assert_int_eq(radix_ns_create(t, "a", 1, 0, 0, &x), KVS_EEXIST);
    ck_assert_int_eq(radix_ns_create(t, "", 1, 0, 0, &x), KVS_EINVAL);
    char long_name[80];
    memset(long_name, 'n', 64);
    long_name[64] = '\0';
    ck_assert_int_eq(radix_ns_create(t, long_name, 1, 0, 0, &x), KVS_EINVAL);
    long_name[63] = '\0';
    ck_assert_int_eq(radix_ns_create(t, long_name, 1, 0, 0, &x), 0);
    ck_assert_uint_eq(x, 2);
    ck_assert_int_eq(radix_ns_find(t, "tenant-b", &x), 0);
    ck_assert_uint_eq(x, b);
    ck_assert_int_eq(radix_ns_find(t, "nope", &x), KVS_ENONS);
    ck_assert_str_eq(radix_ns_name(t, a), "a");
    ck_assert_ptr_null(radix_ns_name(t, 3));
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, b, &st), 0);
    ck_assert_uint_eq(st.quota, 5);
    ck_assert_uint_eq(st.reserve, 2);
    ck_assert_int_eq(radix_ns_stats(t, 9, &st), KVS_ENONS);
    ck_assert_int_eq(radix_ns_set_limits(t, b, 7, 1), 0);
    ck_assert_int_eq(radix_ns_stats(t, b, &st), 0);
    ck_assert_uint_eq(st.quota, 7);
    ck_assert_uint_eq(st.reserve, 1);
    ck_assert_int_eq(radix_ns_set_limits(t, 9, 7, 1), KVS_ENONS);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* radix_ns_delete: only an empty namespace goes; its id is reused by the
 * next create, and nothing of it (blocks, counters, limits) carries over. */
START_TEST(test_namespace_delete)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 9, 3), c = ns_new(t, "c", 0, 0), x = 99;
    uint32_t tok[8 * BT], id = 99;
    radix_ns_stats_t st;
    prompt(tok, 8 * BT, 1);

    /* Blocks, pinned or not, keep a namespace. */
    insert_run(t, b, tok, 4, 0, true, 0);
    ck_assert_int_eq(radix_ns_delete(t, b), KVS_EBUSY);
    for (uint32_t k = 0; k < 4; k++)
        ck_assert_int_eq(radix_unpin(t, k), 0);
    ck_assert_int_eq(radix_ns_delete(t, b), KVS_EBUSY);
    ck_assert_int_eq(radix_ns_stats(t, b, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 4);
    ck_assert_int_eq(radix_ns_delete(t, 17), KVS_ENONS);
    ck_assert_int_eq(radix_ns_delete(NULL, a), KVS_EINVAL);

    /* Evicted to empty, it goes; every call naming its id says so. */
    size_t n = 0;
    ck_assert_int_eq(radix_lookup(t, b, tok, 8 * BT, false, &id, 1, &n), 0);
    ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, 64, &n), 0);
    ck_assert_uint_eq(n, 1); /* its reservation holds the rest */
    ck_assert_int_eq(radix_ns_delete(t, b), KVS_EBUSY);
    ck_assert_int_eq(radix_ns_set_limits(t, b, 0, 0), 0);
    ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, 64, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(radix_ns_delete(t, b), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_int_eq(radix_ns_delete(t, b), KVS_ENONS);
    ck_assert_uint_eq(radix_ns_count(t), 2);
    ck_assert_uint_eq(radix_ns_id_end(t), 3);
    ck_assert_ptr_null(radix_ns_name(t, b));
    ck_assert_int_eq(radix_ns_find(t, "b", &x), KVS_ENONS);
    ck_assert_int_eq(radix_ns_stats(t, b, &st), KVS_ENONS);
    ck_assert_int_eq(radix_ns_set_limits(t, b, 1, 1), KVS_ENONS);
    ck_assert_int_eq(radix_ns_set_priority(t, b, 10, 20), KVS_ENONS);
    ck_assert_int_eq(radix_lookup(t, b, tok, 8 * BT, false, &id, 1, &n), KVS_ENONS);
    ck_assert_int_eq(radix_match(t, b, tok, 8 * BT, &id, 1, &n), KVS_ENONS);
    uint64_t h;
    ck_assert_int_eq(radix_chain_hashes(t, b, tok, 1, &h), KVS_ENONS);
    uint32_t canon[4], ids[4] = {10, 11, 12, 13};
    ck_assert_int_eq(radix_insert(t, b, tok, 4 * BT, ids, 4, false, canon, &n), KVS_ENONS);
    ck_assert_int_eq(radix_evict(t, b, 1, &n), KVS_ENONS);
    ck_assert_int_eq(radix_ns_clear(t, b, &n), KVS_ENONS);
    radix_prefix_t rows[8];
    ck_assert_int_eq(radix_top(t, b, RADIX_BY_HITS, rows, 8, &n), KVS_ENONS);

    /* The others work around the hole: insert, evict for them, list all. */
    insert_run(t, c, tok, 3, 20, false, 0);
    insert_run(t, a, tok, 2, 30, false, 0);
    ck_assert_int_eq(radix_top(t, RADIX_NS_ALL, RADIX_BY_SIZE, rows, 8, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(radix_evict(t, c, 1, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(radix_check(t), 0);

    /* The free id is taken first, by a namespace that starts empty, with its
     * own seed, limits and counters. */
    ck_assert_int_eq(radix_ns_create(t, "d", 0x99, 0, 0, &x), 0);
    ck_assert_uint_eq(x, b);
    ck_assert_str_eq(radix_ns_name(t, x), "d");
    ck_assert_int_eq(radix_ns_stats(t, x, &st), 0);
    ck_assert_uint_eq(st.lookups, 0);
    ck_assert_uint_eq(st.cached_blocks, 0);
    ck_assert_uint_eq(st.evicted_blocks, 0);
    ck_assert_uint_eq(st.quota, 0);
    ck_assert_uint_eq(st.reserve, 0);
    ck_assert_uint_eq(lookup_n(t, x, tok, 8 * BT, NULL), 0);
    ck_assert_uint_eq(radix_ns_count(t), 3);
    ck_assert_int_eq(radix_ns_create(t, "e", 1, 0, 0, &x), 0);
    ck_assert_uint_eq(x, 3);

    /* The name is free again; deleting the last ids shrinks the id range. */
    ck_assert_int_eq(radix_ns_delete(t, x), 0);
    ck_assert_uint_eq(radix_ns_id_end(t), 3);
    ck_assert_int_eq(radix_ns_find(t, "d", &x), 0);
    ck_assert_int_eq(radix_ns_delete(t, x), 0);
    ck_assert_uint_eq(radix_ns_id_end(t), 3);
    ck_assert_int_eq(radix_ns_create(t, "b", 1, 0, 0, &x), 0);
    ck_assert_uint_eq(x, 1);
    ck_assert_int_eq(radix_check(t), 0);

    /* Everything evicted, every namespace goes, and the tree is as new. */
    ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, 64, &n), 0);
    for (uint32_t k = 0; k < 3; k++)
        ck_assert_int_eq(radix_ns_delete(t, k), 0);
    ck_assert_uint_eq(radix_ns_count(t), 0);
    ck_assert_uint_eq(radix_ns_id_end(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(ns_new(t, "again", 0, 0), 0);
    (void)c;
    radix_free(t);
}
END_TEST

START_TEST(test_namespace_isolation)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 0, 0);
    uint32_t tok[4 * BT];
    prompt(tok, 4 * BT, 1);
    insert_run(t, a, tok, 4, 0, false, 0);
    ck_assert_uint_eq(lookup_n(t, b, tok, 4 * BT, NULL), 0);
    ck_assert_uint_eq(lookup_n(t, a, tok, 4 * BT, NULL), 4);
    /* The same prompt in b is a separate prefix with its own blocks. */
    insert_run(t, b, tok, 4, 10, false, 0);
    uint32_t ids[8];
    ck_assert_uint_eq(lookup_n(t, b, tok, 4 * BT, ids), 4);
    ck_assert_uint_eq(ids[0], 10);
    ck_assert_uint_eq(lookup_n(t, a, tok, 4 * BT, ids), 4);
    ck_assert_uint_eq(ids[0], 0);
    radix_free(t);
}
END_TEST

/* ---- lookup ------------------------------------------------------------------ */

/* A clear drops every unpinned block of its namespace, keeps pinned blocks
 * and their ancestors, and never touches another namespace. */
START_TEST(test_ns_clear)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 0, 0);
    uint32_t p1[3 * BT], p2[2 * BT], p3[2 * BT];
    prompt(p1, 3 * BT, 1);
    prompt(p2, 2 * BT, 2);
    prompt(p3, 2 * BT, 3);
    insert_run(t, a, p1, 3, 0, false, 0);
    insert_run(t, a, p2, 2, 3, false, 0);
    insert_run(t, b, p3, 2, 5, false, 0);
    /* Pin block 1 (p1's second block): 0 stays as its ancestor. */
    ck_assert_int_eq(radix_pin(t, 1), 0);
    size_t n = 99;
    ck_assert_int_eq(radix_ns_clear(t, a, NULL), KVS_EINVAL);
    ck_assert_int_eq(radix_ns_clear(NULL, a, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_ns_clear(t, 7, &n), KVS_ENONS);
    ck_assert_uint_eq(ev.n, 0);
    ck_assert_int_eq(radix_ns_clear(t, a, &n), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(n, 3); /* 2 (p1's last), 3 and 4 (p2) */
    ck_assert_uint_eq(ev.n, 3);
    uint32_t seen = 0;
    for (size_t i = 0; i < ev.n; i++)
        seen |= 1u << ev.ids[i];
    ck_assert_uint_eq(seen, (1u << 2) | (1u << 3) | (1u << 4));
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, a, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 2);
    ck_assert_uint_eq(st.evicted_own, 3);
    ck_assert_uint_eq(lookup_n(t, a, p1, 3 * BT, NULL), 2);
    ck_assert_uint_eq(lookup_n(t, a, p2, 2 * BT, NULL), 0);
    ck_assert_uint_eq(lookup_n(t, b, p3, 2 * BT, NULL), 2);
    /* Once the pin goes, a second clear takes the rest. */
    ck_assert_int_eq(radix_unpin(t, 1), 0);
    ck_assert_int_eq(radix_ns_clear(t, a, &n), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(radix_cached_blocks(t), 2);
    ck_assert_int_eq(radix_ns_clear(t, a, &n), 0);
    ck_assert_uint_eq(n, 0);
    radix_free(t);
}
END_TEST

/* A clear in steps drops the same blocks as one in a piece, at most `max`
 * per step, with the index whole after each step (other requests run
 * between two): a Lookup between steps sees what is left, and a block
 * pinned between steps stays. */
START_TEST(test_ns_clear_in_steps)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 0, 0);
    uint32_t p1[6 * BT], p2[4 * BT], p3[2 * BT];
    prompt(p1, 6 * BT, 1);
    prompt(p2, 4 * BT, 2);
    prompt(p3, 2 * BT, 3);
    insert_run(t, a, p1, 6, 0, false, 0);
    insert_run(t, a, p2, 4, 6, false, 0);
    insert_run(t, b, p3, 2, 10, false, 0);
    size_t n = 99;
    ck_assert_int_eq(radix_ns_clear_step(t, a, 3, NULL), KVS_EINVAL);
    ck_assert_int_eq(radix_ns_clear_step(t, 7, 3, &n), KVS_ENONS);
    ck_assert_int_eq(radix_ns_clear_step(t, a, 3, &n), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(radix_cached_blocks(t), 9);
    /* Between two steps: a Lookup sees a prefix of what was cached, and a
     * block pinned now stays with its ancestors. */
    size_t left1 = lookup_n(t, a, p1, 6 * BT, NULL), left2 = lookup_n(t, a, p2, 4 * BT, NULL);
    ck_assert_uint_eq(left1 + left2, 7);
    ck_assert_uint_ge(left1, 2);
    ck_assert_int_eq(radix_pin(t, 1), 0); /* p1's second block */
    size_t total = 3;
    do {
        ck_assert_int_eq(radix_ns_clear_step(t, a, 3, &n), 0);
        ck_assert_int_eq(radix_check(t), 0);
        ck_assert_uint_le(n, 3);
        total += n;
    } while (n == 3);
    ck_assert_uint_eq(total, 8); /* all of a's but blocks 0 and 1 */
    ck_assert_uint_eq(lookup_n(t, a, p1, 6 * BT, NULL), 2);
    ck_assert_uint_eq(lookup_n(t, a, p2, 4 * BT, NULL), 0);
    ck_assert_uint_eq(lookup_n(t, b, p3, 2 * BT, NULL), 2);
    ck_assert_int_eq(radix_ns_clear_step(t, a, 0, &n), 0);
    ck_assert_uint_eq(n, 0);
    radix_free(t);
}
END_TEST

START_TEST(test_lookup_edges)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[8 * BT], ids[8];
    size_t n = 99;
    prompt(tok, 8 * BT, 1);
    /* Empty prompt: tokens may be NULL. */
    ck_assert_int_eq(radix_lookup(t, ns, NULL, 0, false, ids, 8, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(radix_lookup(t, ns, NULL, 3, false, ids, 8, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_lookup(t, ns, tok, 8, false, NULL, 8, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_lookup(t, 5, tok, 8, false, ids, 8, &n), KVS_ENONS);
    insert_run(t, ns, tok, 4, 0, false, 0);
    /* Shorter than a block: nothing, even though the first tokens match. */
    ck_assert_uint_eq(lookup_n(t, ns, tok, BT - 1, NULL), 0);
    /* A partial last block never matches: 2 full blocks + 3 tokens. */
    ck_assert_uint_eq(lookup_n(t, ns, tok, 2 * BT + 3, ids), 2);
    ck_assert_uint_eq(ids[0], 0);
    ck_assert_uint_eq(ids[1], 1);
    /* Longer prompt: the cached 4 blocks. */
    ck_assert_uint_eq(lookup_n(t, ns, tok, 8 * BT, ids), 4);
    /* max_ids stops matching. */
    ck_assert_int_eq(radix_lookup(t, ns, tok, 8 * BT, false, ids, 3, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(radix_lookup(t, ns, tok, 8 * BT, false, NULL, 0, &n), 0);
    ck_assert_uint_eq(n, 0);
    /* A change in the middle of block 2 stops the match at 2 blocks. */
    tok[2 * BT + 1] ^= 1;
    ck_assert_uint_eq(lookup_n(t, ns, tok, 8 * BT, ids), 2);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.lookups, 7);
    ck_assert_uint_eq(st.lookup_tokens, (BT - 1) + (2 * BT + 3) + 4 * 8 * BT);
    ck_assert_uint_eq(st.hit_tokens, (2 + 4 + 3 + 2) * BT);
    radix_free(t);
}
END_TEST

START_TEST(test_lookup_pin)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[4 * BT], ids[4], ref = 9;
    size_t n = 0;
    prompt(tok, 4 * BT, 1);
    insert_run(t, ns, tok, 4, 20, false, 0);
    ck_assert_int_eq(radix_lookup(t, ns, tok, 3 * BT, true, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(radix_pinned_blocks(t), 3);
    ck_assert_int_eq(radix_block_refcount(t, 22, &ref), 0);
    ck_assert_uint_eq(ref, 1);
    ck_assert_int_eq(radix_block_refcount(t, 23, &ref), 0);
    ck_assert_uint_eq(ref, 0);
    /* Only the unpinned tail can go. */
    evict_expect(t, RADIX_NS_ANY, 10, (const uint32_t[]){23}, 1);
    for (size_t k = 0; k < n; k++)
        ck_assert_int_eq(radix_unpin(t, ids[k]), 0);
    ck_assert_uint_eq(radix_pinned_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    /* Leaf first: a parent becomes evictable when its last child goes. */
    evict_expect(t, RADIX_NS_ANY, 10, (const uint32_t[]){22, 21, 20}, 3);
    ck_assert_uint_eq(radix_cached_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* radix_match finds what radix_lookup finds and changes nothing. */
START_TEST(test_match_read_only)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[4 * BT], other[4 * BT], ids[4], ref = 9;
    size_t n = 99;
    prompt(tok, 4 * BT, 1);
    memcpy(other, tok, sizeof(other));
    other[2 * BT] += 1000; /* diverges at block 2 */
    insert_run(t, ns, tok, 4, 20, false, 0);
    radix_ns_stats_t before, after;
    ck_assert_int_eq(radix_ns_stats(t, ns, &before), 0);

    ck_assert_int_eq(radix_match(t, ns, tok, 4 * BT + 1, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    for (uint32_t k = 0; k < 4; k++)
        ck_assert_uint_eq(ids[k], 20 + k);
    ck_assert_int_eq(radix_match(t, ns, tok, 4 * BT, ids, 2, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(radix_match(t, ns, other, 4 * BT, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(radix_match(t, ns, tok, BT - 1, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 0);
    /* Inside a node split by a later insert, and across the split. */
    insert_run(t, ns, other, 4, 40, false, 0);
    ck_assert_int_eq(radix_match(t, ns, other, 4 * BT, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(ids[1], 21);
    ck_assert_uint_eq(ids[2], 42);
    ck_assert_uint_eq(ids[3], 43);
    ck_assert_int_eq(radix_ns_stats(t, ns, &before), 0);
    ck_assert_int_eq(radix_match(t, ns, tok, 4 * BT, ids, 4, &n), 0);
    ck_assert_int_eq(radix_ns_stats(t, ns, &after), 0);
    ck_assert_mem_eq(&before, &after, sizeof(before));
    ck_assert_uint_eq(radix_pinned_blocks(t), 0);
    ck_assert_int_eq(radix_block_refcount(t, 23, &ref), 0);
    ck_assert_uint_eq(ref, 0);
    /* No change of last use: the leaf 23, older than 43, still goes first. */
    evict_expect(t, RADIX_NS_ANY, 1, (const uint32_t[]){23}, 1);

    ck_assert_int_eq(radix_match(t, ns, tok, 4 * BT, NULL, 4, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_match(t, ns, NULL, 4, ids, 4, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_match(t, ns, tok, 4 * BT, ids, 4, NULL), KVS_EINVAL);
    ck_assert_int_eq(radix_match(t, 7, tok, 4 * BT, ids, 4, &n), KVS_ENONS);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* ---- insert ------------------------------------------------------------------ */

START_TEST(test_insert_args)
{
    radix_tree_t *t = tree_with(BT, 16, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[4 * BT], ids[4] = {0, 1, 2, 3}, canon[4];
    size_t done = 7;
    prompt(tok, 4 * BT, 1);
    /* A partial block cannot be inserted. */
    ck_assert_int_eq(radix_insert(t, ns, tok, 3 * BT + 2, ids, 4, false, canon, &done), KVS_EINVAL);
    ids[2] = 16;
    ck_assert_int_eq(radix_insert(t, ns, tok, 4 * BT, ids, 4, false, canon, &done), KVS_EINVAL);
    ids[2] = 2;
    ck_assert_int_eq(radix_insert(t, ns, NULL, 4 * BT, ids, 4, false, canon, &done), KVS_EINVAL);
    ck_assert_int_eq(radix_insert(t, ns, tok, 4 * BT, ids, 4, false, NULL, &done), KVS_EINVAL);
    ck_assert_int_eq(radix_insert(t, 3, tok, 4 * BT, ids, 4, false, canon, &done), KVS_ENONS);
    ck_assert_uint_eq(radix_cached_blocks(t), 0);
    /* Empty inserts are fine. */
    ck_assert_int_eq(radix_insert(t, ns, NULL, 0, NULL, 0, false, NULL, &done), 0);
    ck_assert_uint_eq(done, 0);
    ck_assert_int_eq(radix_insert(t, ns, tok, BT - 1, NULL, 0, false, NULL, &done), 0);
    /* Fewer ids than full blocks: only those are cached. */
    ck_assert_int_eq(radix_insert(t, ns, tok, 4 * BT + 1, ids, 2, false, canon, &done), 0);
    ck_assert_uint_eq(done, 2);
    ck_assert_uint_eq(radix_cached_blocks(t), 2);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_insert_duplicates)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[6 * BT], ids[6], canon[6], ref;
    size_t done;
    prompt(tok, 6 * BT, 1);
    insert_run(t, ns, tok, 3, 0, false, 0);
    /* Re-insert of the cached prefix plus 3 new blocks. */
    for (uint32_t k = 0; k < 6; k++)
        ids[k] = 30 + k;
    ck_assert_int_eq(radix_insert(t, ns, tok, 6 * BT, ids, 6, true, canon, &done), 0);
    ck_assert_uint_eq(done, 6);
    ck_assert_int_eq(radix_check(t), 0);
    uint32_t want[6] = {0, 1, 2, 33, 34, 35};
    for (int k = 0; k < 6; k++)
        ck_assert_uint_eq(canon[k], want[k]);
    /* The duplicates stay the caller's: not cached. The canonical ones are pinned. */
    ck_assert_int_eq(radix_block_refcount(t, 30, &ref), KVS_ENOTFOUND);
    ck_assert_int_eq(radix_block_refcount(t, 1, &ref), 0);
    ck_assert_uint_eq(ref, 1);
    ck_assert_int_eq(radix_block_refcount(t, 34, &ref), 0);
    ck_assert_uint_eq(ref, 1);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.inserted_blocks, 6);
    ck_assert_uint_eq(st.duplicate_blocks, 3);
    ck_assert_uint_eq(st.cached_blocks, 6);
    ck_assert_uint_eq(st.pinned_blocks, 6);
    /* Same ids again: all duplicates of themselves. */
    ck_assert_int_eq(radix_insert(t, ns, tok, 6 * BT, want, 6, false, canon, &done), 0);
    ck_assert_uint_eq(done, 6);
    for (int k = 0; k < 6; k++)
        ck_assert_uint_eq(canon[k], want[k]);
    ck_assert_uint_eq(radix_cached_blocks(t), 6);
    ck_assert_uint_eq(lookup_n(t, ns, tok, 6 * BT, ids), 6);
    ck_assert_uint_eq(ids[5], 35);
    radix_free(t);
}
END_TEST

START_TEST(test_insert_split_and_extend)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t a[8 * BT], b[8 * BT], ids[8];
    prompt(a, 8 * BT, 1);
    memcpy(b, a, sizeof(b));
    b[3 * BT] = 777; /* b shares 3 blocks with a */
    insert_run(t, ns, a, 6, 0, false, 0);
    insert_run(t, ns, b, 6, 10, false, 0);
    ck_assert_uint_eq(radix_cached_blocks(t), 9);
    ck_assert_uint_eq(lookup_n(t, ns, b, 8 * BT, ids), 6);
    ck_assert_uint_eq(ids[2], 2);
    ck_assert_uint_eq(ids[3], 13);
    ck_assert_uint_eq(lookup_n(t, ns, a, 8 * BT, ids), 6);
    ck_assert_uint_eq(ids[5], 5);
    /* Extending a leaf one block at a time. */
    for (uint32_t k = 6; k < 8; k++) {
        uint32_t run[8];
        uint32_t canon[8];
        size_t done;
        for (uint32_t j = 0; j <= k; j++)
            run[j] = j < 6 ? j : 20 + j;
        ck_assert_int_eq(radix_insert(t, ns, a, (k + 1) * BT, run, k + 1, false, canon, &done), 0);
        ck_assert_uint_eq(done, k + 1);
        ck_assert_uint_eq(canon[k], 20 + k);
        ck_assert_int_eq(radix_check(t), 0);
    }
    ck_assert_uint_eq(lookup_n(t, ns, a, 8 * BT, ids), 8);
    ck_assert_uint_eq(ids[7], 27);
    /* Split at the very first block: a prompt diverging after block 0. */
    uint32_t c[4 * BT];
    memcpy(c, a, sizeof(c));
    c[BT] = 555;
    insert_run(t, ns, c, 4, 40, false, 0);
    ck_assert_uint_eq(lookup_n(t, ns, c, 4 * BT, ids), 4);
    ck_assert_uint_eq(ids[0], 0);
    ck_assert_uint_eq(ids[1], 41);
    radix_free(t);
}
END_TEST

/* radix_insert_after: a prompt inserted in pieces, each walk starting at
 * the last block of the piece before, is the tree of one insert: the same
 * canonical ids, duplicates found after a split, pins, and errors that
 * change nothing. */
START_TEST(test_insert_after_in_pieces)
{
    enum { NB = 40 };
    radix_tree_t *t = tree_with(BT, 256, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0), other = ns_new(t, "b", 0, 0);
    uint32_t a[NB * BT], ids[NB], canon[NB], got[NB];
    prompt(a, NB * BT, 1);
    for (uint32_t i = 0; i < NB; i++)
        ids[i] = 100 + i;
    size_t done = 0, first = 0;
    for (size_t piece = 7; first < NB; first += done) {
        size_t n = NB - first < piece ? NB - first : piece;
        uint32_t after = first ? canon[first - 1] : RADIX_NO_BLOCK;
        ck_assert_int_eq(radix_insert_after(t, ns, after, a + first * BT, (NB - first) * BT,
                                            ids + first, n, true, canon + first, &done),
                         0);
        ck_assert_uint_eq(done, n);
        ck_assert_msg(radix_check(t) == 0, "piece at %zu: check line %d", first,
                      radix_check_line());
    }
    for (uint32_t i = 0; i < NB; i++)
        ck_assert_uint_eq(canon[i], 100 + i);
    ck_assert_uint_eq(radix_cached_blocks(t), NB);
    ck_assert_uint_eq(radix_pinned_blocks(t), NB);
    ck_assert_uint_eq(lookup_n(t, ns, a, NB * BT, got), NB);
    ck_assert_uint_eq(got[NB - 1], 100 + NB - 1);

    /* Another prompt diverging at block 20, inserted after block 9: blocks
     * 10..19 are duplicates of the first prompt's (the walk goes down the
     * node from the middle), then a split. */
    uint32_t b[30 * BT], bids[20], bcanon[20];
    memcpy(b, a, sizeof(b));
    b[20 * BT] = 777;
    for (uint32_t i = 0; i < 20; i++)
        bids[i] = 200 + i;
    ck_assert_int_eq(
        radix_insert_after(t, ns, canon[9], b + 10 * BT, 20 * BT, bids, 20, false, bcanon, &done),
        0);
    ck_assert_uint_eq(done, 20);
    for (uint32_t i = 0; i < 10; i++)
        ck_assert_uint_eq(bcanon[i], 110 + i);
    for (uint32_t i = 10; i < 20; i++)
        ck_assert_uint_eq(bcanon[i], 200 + i);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(lookup_n(t, ns, b, 30 * BT, got), 30);
    ck_assert_uint_eq(got[29], 219);

    /* Errors: nothing changes. */
    uint32_t more = 250, mc;
    ck_assert_int_eq(radix_insert_after(t, ns, 99, a, BT, &more, 1, false, &mc, &done),
                     KVS_ENOTFOUND);
    ck_assert_int_eq(radix_insert_after(t, other, canon[0], a, BT, &more, 1, false, &mc, &done),
                     KVS_EBADSTATE);
    ck_assert_uint_eq(done, 0);
    ck_assert_uint_eq(radix_cached_blocks(t), NB + 10);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_insert_eexist)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t a[4 * BT], b[4 * BT], canon[4];
    size_t done;
    prompt(a, 4 * BT, 1);
    prompt(b, 4 * BT, 2);
    insert_run(t, ns, a, 4, 0, false, 0);
    /* Block 2 of b names id 1, which holds a's block 1. */
    uint32_t ids[4] = {10, 11, 1, 13};
    ck_assert_int_eq(radix_insert(t, ns, b, 4 * BT, ids, 4, false, canon, &done), KVS_EEXIST);
    ck_assert_uint_eq(done, 2);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(radix_cached_blocks(t), 6);
    /* A repeated id inside one insert. */
    uint32_t c[4 * BT];
    prompt(c, 4 * BT, 3);
    uint32_t rep[4] = {20, 21, 20, 22};
    ck_assert_int_eq(radix_insert(t, ns, c, 4 * BT, rep, 4, false, canon, &done), KVS_EEXIST);
    ck_assert_uint_eq(done, 2);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* ---- pins --------------------------------------------------------------------- */

static uint64_t hash_mix(const uint32_t *tokens, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        seed = (seed ^ tokens[i]) * 0x100000001b3ull;
    return seed;
}

/* radix_block_hash: a cached block's key is the chain h_i = hash(block i,
 * h_{i-1}) from the namespace seed, as KV events publish it. */
START_TEST(test_block_hash)
{
    radix_tree_t *t = tree_with(BT, 64, hash_mix);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[3 * BT];
    uint64_t h, want = 0x1234 + 1;
    prompt(tok, 3 * BT, 1);
    insert_run(t, ns, tok, 3, 5, false, 0);
    for (uint32_t i = 0; i < 3; i++) {
        want = hash_mix(tok + i * BT, BT, want);
        ck_assert_int_eq(radix_block_hash(t, 5 + i, &h), 0);
        ck_assert_uint_eq(h, want);
    }
    ck_assert_int_eq(radix_block_hash(t, 4, &h), KVS_ENOTFOUND);
    ck_assert_int_eq(radix_block_hash(t, 64, &h), KVS_EINVAL);
    ck_assert_int_eq(radix_block_hash(t, 5, NULL), KVS_EINVAL);
    radix_free(t);
}
END_TEST

START_TEST(test_pin_unpin)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[3 * BT], ref;
    prompt(tok, 3 * BT, 1);
    insert_run(t, ns, tok, 3, 5, false, 0);
    ck_assert_int_eq(radix_pin(t, 64), KVS_EINVAL);
    ck_assert_int_eq(radix_pin(t, 4), KVS_ENOTFOUND);
    ck_assert_int_eq(radix_unpin(t, 64), KVS_EINVAL);
    ck_assert_int_eq(radix_unpin(t, 4), KVS_ENOTFOUND);
    ck_assert_int_eq(radix_block_refcount(t, 64, &ref), KVS_EINVAL);
    /* Unpin of an unpinned block: an error, and nothing changes. */
    radix_ns_stats_t before, after;
    ck_assert_int_eq(radix_ns_stats(t, ns, &before), 0);
    size_t mem = radix_memory_bytes(t);
    ck_assert_int_eq(radix_unpin(t, 6), KVS_ENOTPINNED);
    ck_assert_int_eq(radix_ns_stats(t, ns, &after), 0);
    ck_assert_int_eq(memcmp(&before, &after, sizeof(before)), 0);
    ck_assert_uint_eq(radix_memory_bytes(t), mem);
    ck_assert_int_eq(radix_block_refcount(t, 6, &ref), 0);
    ck_assert_uint_eq(ref, 0);
    ck_assert_int_eq(radix_check(t), 0);
    /* Two pins, two unpins. */
    ck_assert_int_eq(radix_pin(t, 7), 0);
    ck_assert_int_eq(radix_pin(t, 7), 0);
    ck_assert_uint_eq(radix_pinned_blocks(t), 1);
    ck_assert_int_eq(radix_check(t), 0);
    evict_expect(t, ns, 5, NULL, 0);
    ck_assert_int_eq(radix_unpin(t, 7), 0);
    ck_assert_int_eq(radix_block_refcount(t, 7, &ref), 0);
    ck_assert_uint_eq(ref, 1);
    ck_assert_int_eq(radix_unpin(t, 7), 0);
    ck_assert_int_eq(radix_unpin(t, 7), KVS_ENOTPINNED);
    ck_assert_uint_eq(radix_pinned_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    /* Pinning a middle block keeps it and its ancestors, not its descendants. */
    ck_assert_int_eq(radix_pin(t, 6), 0);
    evict_expect(t, ns, 5, (const uint32_t[]){7}, 1);
    ck_assert_uint_eq(radix_cached_blocks(t), 2);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* ---- eviction ------------------------------------------------------------------- */

START_TEST(test_evict_lru_order)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t p[3][2 * BT];
    for (uint32_t k = 0; k < 3; k++) {
        prompt(p[k], 2 * BT, k + 1);
        insert_run(t, ns, p[k], 2, 10 * k, false, 0);
    }
    /* Use prompt 0 (fully) and the first block of prompt 1. */
    ck_assert_uint_eq(lookup_n(t, ns, p[0], 2 * BT, NULL), 2);
    ck_assert_uint_eq(lookup_n(t, ns, p[1], BT, NULL), 1);
    /* Leaf stamps: p1's leaf (insert 2) < p2's leaf (insert 3) < p0 (lookup);
     * p1's first block was used by the last lookup, so it goes last. */
    evict_expect(t, RADIX_NS_ANY, 6, (const uint32_t[]){11, 21, 20, 1, 0, 10}, 6);
    ck_assert_int_eq(radix_check(t), 0);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.evicted_blocks, 6);
    ck_assert_uint_eq(st.cached_blocks, 0);
    radix_free(t);
}
END_TEST

/* Retention priority: lowest first, LRU within; the highest live hint
 * counts; timed hints end; a namespace's cap and default; a priority-100
 * block is still evicted (not a pin) and a quota still holds. */
START_TEST(test_evict_priority_order)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t p[4][BT];
    for (uint32_t k = 0; k < 4; k++) {
        prompt(p[k], BT, k + 1);
        insert_run(t, ns, p[k], 1, 10 * k, false, 0);
    }
    /* 0: 80 for good; 1: 90 until 100, and 20 for good; 2: 10; 3: default. */
    ck_assert_int_eq(radix_hint(t, 0, 80, 0), 0);
    ck_assert_int_eq(radix_hint(t, 10, 20, 0), 0);
    ck_assert_int_eq(radix_hint(t, 10, 90, 100), 0);
    ck_assert_int_eq(radix_hint(t, 10, 60, 200), 0); /* lower than the live 90: dropped */
    ck_assert_int_eq(radix_hint(t, 20, 10, 0), 0);
    ck_assert_int_eq(radix_hint(t, 20, 5, 0), 0); /* lower: the highest stays */
    ck_assert_int_eq(radix_hint(t, 20, RADIX_PRIO_MAX + 1, 0), KVS_EINVAL);
    ck_assert_int_eq(radix_hint(t, 5, 50, 0), KVS_ENOTFOUND);
    uint32_t prio = 0;
    ck_assert_int_eq(radix_block_priority(t, 10, &prio), 0);
    ck_assert_uint_eq(prio, 90);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.cached_by_band[0], 1); /* 10 */
    ck_assert_uint_eq(st.cached_by_band[2], 1); /* 50 */
    ck_assert_uint_eq(st.cached_by_band[3], 2); /* 80, 90 */
    size_t n = 0;
    ck_assert_int_eq(radix_expire_hints(t, 99, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(radix_expire_hints(t, 100, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(radix_block_priority(t, 10, &prio), 0);
    ck_assert_uint_eq(prio, 20);
    ck_assert_int_eq(radix_check(t), 0);
    evict_expect(t, RADIX_NS_ANY, 4, (const uint32_t[]){20, 10, 30, 0}, 4);
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.evicted_by_band[0], 2);
    ck_assert_uint_eq(st.evicted_by_band[2], 1);
    ck_assert_uint_eq(st.evicted_by_band[3], 1);
    /* A cap of 60 and a default of 30: hints above 60 count as 60, and an
     * unhinted block (30) goes before a hinted one. */
    ck_assert_int_eq(radix_ns_set_priority(t, ns, 30, 60), 0);
    ck_assert_int_eq(radix_ns_set_priority(t, ns, 30, 101), KVS_EINVAL);
    ck_assert_int_eq(radix_ns_set_priority(t, 7, 30, 60), KVS_ENONS);
    insert_run(t, ns, p[0], 1, 1, false, 0);
    insert_run(t, ns, p[1], 1, 2, false, 0);
    ck_assert_int_eq(radix_hint(t, 1, 100, 0), 0);
    ck_assert_int_eq(radix_block_priority(t, 1, &prio), 0);
    ck_assert_uint_eq(prio, 60);
    ev.n = 0;
    evict_expect(t, RADIX_NS_ANY, 1, (const uint32_t[]){2}, 1);
    /* Not a pin: the last block goes too. */
    evict_expect(t, RADIX_NS_ANY, 1, (const uint32_t[]){1}, 1);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* Issue: timed hints renewed in a loop (Pin and Release with a duration)
 * grew memory without bound: the expiry queue kept one entry per hint
 * given, not per block. Now it keeps the live ones and drops the rest as
 * they pile up; a limit bounds the blocks with a live timed hint. */
START_TEST(test_hints_are_bounded)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t p[4][BT];
    for (uint32_t k = 0; k < 4; k++) {
        prompt(p[k], BT, k + 1);
        insert_run(t, ns, p[k], 1, 10 * k, false, 0);
    }
    for (uint64_t i = 0; i < 100000; i++) {
        ck_assert_int_eq(radix_hint(t, (uint32_t)(10 * (i % 4)), 50, 1000 + i), 0);
        ck_assert_uint_le(radix_hint_queue_len(t), 2 * 4 + 64 + 1);
    }
    ck_assert_uint_eq(radix_hint_timed(t), 4);
    ck_assert_int_eq(radix_check(t), 0);
    /* A rising priority with the same end adds no entry. */
    size_t before = radix_hint_queue_len(t);
    for (uint32_t prio = 51; prio <= 60; prio++)
        ck_assert_int_eq(radix_hint(t, 0, prio, 1000 + 99996), 0);
    ck_assert_uint_eq(radix_hint_queue_len(t), before);
    /* A limit of 2 blocks: the live ones may change, a third block waits. */
    size_t n = 0;
    ck_assert_int_eq(radix_expire_hints(t, UINT64_MAX >> 2, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(radix_hint_timed(t), 0);
    ck_assert_uint_le(radix_hint_queue_len(t), 64);
    ck_assert_int_eq(radix_hint_limit(t, 2), 0);
    ck_assert_int_eq(radix_hint(t, 0, 50, 5000), 0);
    ck_assert_int_eq(radix_hint(t, 10, 50, 5000), 0);
    ck_assert_int_eq(radix_hint(t, 20, 50, 5000), KVS_ELIMIT);
    ck_assert_int_eq(radix_hint(t, 10, 70, 6000), 0);
    ck_assert_int_eq(radix_hint(t, 20, 50, 0), 0); /* untimed: not limited */
    ck_assert_int_eq(radix_hint(t, 30, 50, 1ull << 63), KVS_EINVAL);
    /* Evicted blocks' hints end with them. */
    size_t cleared = 0;
    ck_assert_int_eq(radix_ns_clear(t, ns, &cleared), 0);
    ck_assert_uint_eq(cleared, 4);
    ck_assert_uint_eq(radix_hint_timed(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* A quota holds whatever the priorities: the namespace evicts its own
 * blocks, the high ones too, and never another namespace's. */
START_TEST(test_priority_keeps_quota)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 2, 0), b = ns_new(t, "b", 0, 0);
    uint32_t p[4][BT];
    for (uint32_t k = 0; k < 4; k++)
        prompt(p[k], BT, k + 1);
    insert_run(t, b, p[0], 1, 30, false, 0);
    ck_assert_int_eq(radix_hint(t, 30, 0, 0), 0);
    insert_run(t, a, p[1], 1, 1, false, 0);
    insert_run(t, a, p[2], 1, 2, false, 0);
    ck_assert_int_eq(radix_hint(t, 1, 100, 0), 0);
    ck_assert_int_eq(radix_hint(t, 2, 100, 0), 0);
    insert_run(t, a, p[3], 1, 3, false, 0);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, a, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 2);
    ck_assert_uint_eq(ev.n, 1);
    ck_assert_uint_eq(ev.ids[0], 1);
    ck_assert_int_eq(radix_block_refcount(t, 30, &(uint32_t){0}), 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_evict_out_of_order_unpins)
{
    /* Leaves that become evictable with a stamp between the oldest and the
     * newest queued leaf go through the heap; pin/unpin cycles leave stale
     * heap entries that must be dropped, and the order must stay exact. */
    enum { N = 120 };
    radix_tree_t *t = tree_with(BT, 2 * N, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[BT];
    prompt(tok, BT, 1000);
    insert_run(t, ns, tok, 1, 0, false, 0); /* A: oldest */
    for (uint32_t k = 0; k < N; k++) {
        prompt(tok, BT, k + 1);
        insert_run(t, ns, tok, 1, 1 + k, true, 0); /* P_k, pinned */
    }
    prompt(tok, BT, 2000);
    insert_run(t, ns, tok, 1, N + 1, false, 0); /* B: newest */
    bool pinned[N];
    for (uint32_t k = 0; k < N; k++)
        pinned[k] = true;
    for (uint32_t round = 0; round < 8; round++) {
        for (uint32_t k = 0; k < N; k++) {
            uint32_t p = (k * 7) % N;
            if (pinned[p])
                ck_assert_int_eq(radix_unpin(t, 1 + p), 0);
            pinned[p] = false;
        }
        ck_assert_int_eq(radix_check(t), 0);
        /* Pin half again: their heap entries go stale, the others stay. */
        for (uint32_t k = 0; k < N / 2; k++) {
            uint32_t p = (k * 11 + round) % N;
            if (!pinned[p])
                ck_assert_int_eq(radix_pin(t, 1 + p), 0);
            pinned[p] = true;
        }
        ck_assert_int_eq(radix_check(t), 0);
    }
    for (uint32_t p = 0; p < N; p++)
        if (pinned[p])
            ck_assert_int_eq(radix_unpin(t, 1 + p), 0);
    ck_assert_int_eq(radix_check(t), 0);
    size_t got;
    ck_assert_int_eq(radix_evict(t, ns, 2 * N, &got), 0);
    ck_assert_uint_eq(got, N + 2);
    for (uint32_t k = 0; k < N + 2; k++)
        ck_assert_uint_eq(ev.ids[k], k); /* A, P_0 .. P_N-1, B: by last use */
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_evict_all_pinned)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 0, 0);
    uint32_t tok[4 * BT];
    for (uint32_t k = 0; k < 4; k++) {
        prompt(tok, 4 * BT, k + 1);
        insert_run(t, k % 2 ? b : a, tok, 4, 10 * k, true, 0);
    }
    size_t got = 9;
    ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, 100, &got), 0);
    ck_assert_uint_eq(got, 0);
    ck_assert_int_eq(radix_evict(t, a, 100, &got), 0);
    ck_assert_uint_eq(got, 0);
    ck_assert_int_eq(radix_evict(t, 7, 100, &got), KVS_ENONS);
    ck_assert_uint_eq(ev.n, 0);
    ck_assert_uint_eq(radix_cached_blocks(t), 16);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_quota)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "q", 4, 0), other = ns_new(t, "o", 0, 0);
    uint32_t a[3 * BT], b[3 * BT], c[3 * BT], ids[3] = {20, 21, 22}, canon[3];
    size_t done;
    prompt(a, 3 * BT, 1);
    prompt(b, 3 * BT, 2);
    prompt(c, 3 * BT, 3);
    insert_run(t, other, c, 3, 40, false, 0);
    insert_run(t, ns, a, 3, 0, false, 0);
    /* Needs 2 more slots: the namespace's own two oldest leaves go (a's tail). */
    ck_assert_int_eq(radix_insert(t, ns, b, 3 * BT, ids, 3, false, canon, &done), 0);
    ck_assert_uint_eq(done, 3);
    ck_assert_uint_eq(ev.n, 2);
    ck_assert_uint_eq(ev.ids[0], 2);
    ck_assert_uint_eq(ev.ids[1], 1);
    ck_assert_uint_eq(radix_cached_blocks(t), 7);
    ck_assert_int_eq(radix_check(t), 0);
    /* Everything pinned: insertion stops at the quota. */
    uint32_t got_ids[3];
    size_t n;
    ck_assert_int_eq(radix_lookup(t, ns, b, 3 * BT, true, got_ids, 3, &n), 0);
    ck_assert_int_eq(radix_pin(t, 0), 0);
    uint32_t ids2[3] = {30, 31, 32};
    ck_assert_int_eq(radix_insert(t, ns, c, 3 * BT, ids2, 3, false, canon, &done), KVS_EQUOTA);
    ck_assert_uint_eq(done, 0);
    ck_assert_int_eq(radix_check(t), 0);
    /* One slot free: one block goes in. */
    ck_assert_int_eq(radix_unpin(t, 0), 0);
    ck_assert_int_eq(radix_insert(t, ns, c, 3 * BT, ids2, 3, true, canon, &done), KVS_EQUOTA);
    ck_assert_uint_eq(done, 1);
    ck_assert_uint_eq(canon[0], 30);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 4);
    ck_assert_int_eq(radix_check(t), 0);
    /* A lowered quota applies at the next insert. */
    for (uint32_t k = 0; k < 3; k++)
        ck_assert_int_eq(radix_unpin(t, got_ids[k]), 0);
    ck_assert_int_eq(radix_unpin(t, 30), 0);
    ck_assert_int_eq(radix_ns_set_limits(t, ns, 2, 0), 0);
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 4);
    uint32_t d[BT], id50 = 50;
    prompt(d, BT, 9);
    ck_assert_int_eq(radix_insert(t, ns, d, BT, &id50, 1, false, canon, &done), 0);
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 2);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_quota_keeps_attach_point)
{
    /* The block a new block hangs from is the namespace's only evictable
     * leaf: quota eviction must not take it. */
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t ns = ns_new(t, "q", 2, 0);
    uint32_t a[3 * BT], ids[3] = {0, 1, 2}, canon[3];
    size_t done;
    prompt(a, 3 * BT, 1);
    ck_assert_int_eq(radix_insert(t, ns, a, 2 * BT, ids, 2, false, canon, &done), 0);
    ck_assert_int_eq(radix_insert(t, ns, a, 3 * BT, ids, 3, false, canon, &done), KVS_EQUOTA);
    ck_assert_uint_eq(done, 2);
    ck_assert_uint_eq(ev.n, 0);
    ck_assert_uint_eq(radix_cached_blocks(t), 2);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_reservation)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 3), b = ns_new(t, "b", 0, 0);
    uint32_t tok[5 * BT];
    prompt(tok, 5 * BT, 1);
    insert_run(t, a, tok, 5, 0, false, 0); /* a's blocks are the oldest */
    prompt(tok, 5 * BT, 2);
    insert_run(t, b, tok, 5, 10, false, 0);
    size_t got;
    /* On behalf of b: a gives 2 (down to its reservation), then b's own. */
    evict_expect(t, b, 4, (const uint32_t[]){4, 3, 14, 13}, 4);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, a, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 3);
    /* On behalf of nobody: a stays at 3. */
    ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, 10, &got), 0);
    ck_assert_uint_eq(got, 3);
    ck_assert_int_eq(radix_ns_stats(t, a, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 3);
    /* a itself may go below its reservation. */
    ck_assert_int_eq(radix_evict(t, a, 10, &got), 0);
    ck_assert_uint_eq(got, 3);
    ck_assert_uint_eq(radix_cached_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

static void ns_stats(radix_tree_t *t, uint32_t ns, radix_ns_stats_t *st)
{
    ck_assert_int_eq(radix_ns_stats(t, ns, st), 0);
    ck_assert_uint_eq(st->evicted_blocks, st->evicted_own + st->evicted_others + st->evicted_quota);
}

START_TEST(test_reservation_takes_back)
{
    /* The long tier's blocks are newer than the chats' (the incident that
     * reservations exist for): a chat namespace below its reservation still
     * takes them, least recently used first, before it evicts itself; a
     * namespace at its reservation gives nothing. */
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t chat = ns_new(t, "chat", 0, 4), lng = ns_new(t, "long", 0, 0);
    uint32_t mid = ns_new(t, "mid", 0, 2);
    uint32_t tok[3 * BT];
    prompt(tok, 2 * BT, 9);
    insert_run(t, mid, tok, 2, 30, false, 0); /* 30, 31: the oldest of all, at mid's reserve */
    prompt(tok, 2 * BT, 1);
    insert_run(t, chat, tok, 2, 0, false, 0); /* 0, 1 */
    prompt(tok, 3 * BT, 2);
    insert_run(t, lng, tok, 3, 10, false, 0); /* 10 .. 12 */
    prompt(tok, 3 * BT, 3);
    insert_run(t, lng, tok, 3, 20, false, 0); /* 20 .. 22: the newest */
    size_t got;
    evict_expect(t, chat, 2, (const uint32_t[]){12, 11}, 2);
    /* Still below: the rest of long goes, then chat's own; mid keeps its 2. */
    ck_assert_int_eq(radix_evict(t, chat, 10, &got), 0);
    ck_assert_uint_eq(got, 6);
    uint32_t want[8] = {12, 11, 10, 22, 21, 20, 1, 0};
    for (int k = 0; k < 8; k++)
        ck_assert_uint_eq(ev.ids[k], want[k]);
    radix_ns_stats_t st;
    ns_stats(t, chat, &st);
    ck_assert_uint_eq(st.cached_blocks, 0);
    ck_assert_uint_eq(st.evicted_own, 2);
    ck_assert_uint_eq(st.evicted_others, 0);
    ns_stats(t, lng, &st);
    ck_assert_uint_eq(st.evicted_others, 6);
    ck_assert_uint_eq(st.evicted_own, 0);
    ns_stats(t, mid, &st);
    ck_assert_uint_eq(st.cached_blocks, 2);
    ck_assert_uint_eq(st.evicted_blocks, 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_reservation_at_reserve_is_plain_lru)
{
    /* At its reservation a namespace's own older leaf goes first, as under
     * plain LRU; the next block, taken once it is below, comes from the
     * other namespace. The rule holds per block. */
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t chat = ns_new(t, "chat", 0, 2), lng = ns_new(t, "long", 0, 0);
    uint32_t tok[3 * BT];
    prompt(tok, 2 * BT, 1);
    insert_run(t, chat, tok, 2, 0, false, 0);
    prompt(tok, 3 * BT, 2);
    insert_run(t, lng, tok, 3, 10, false, 0);
    evict_expect(t, chat, 3, (const uint32_t[]){1, 12, 11}, 3);
    /* Above its reservation, on behalf of long: chat competes by LRU too. */
    prompt(tok, 2 * BT, 3);
    insert_run(t, chat, tok, 2, 40, false, 0); /* chat holds 0, 40, 41: one over */
    ev.n = 0;
    /* chat's oldest, down to its reservation, then only long's own */
    evict_expect(t, lng, 3, (const uint32_t[]){0, 10}, 2);
    ck_assert_uint_eq(ev.n, 2);
    radix_ns_stats_t st;
    ns_stats(t, chat, &st);
    ck_assert_uint_eq(st.cached_blocks, 2);
    ck_assert_uint_eq(st.evicted_own, 1);
    ck_assert_uint_eq(st.evicted_others, 1);
    ns_stats(t, lng, &st);
    ck_assert_uint_eq(st.evicted_own, 1);
    ck_assert_uint_eq(st.evicted_others, 2);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_reservation_lends)
{
    /* Reservations that add up to the pool (8 blocks: 4 + 4). b fills the
     * pool while a is idle: a's reserved blocks serve b until a needs them,
     * then a takes them back; at both reservations each makes room from its
     * own leaves only, and eviction on behalf of none takes nothing. */
    radix_tree_t *t = tree_with(BT, 8, NULL);
    uint32_t a = ns_new(t, "a", 0, 4), b = ns_new(t, "b", 0, 4);
    uint32_t tok[8 * BT];
    prompt(tok, 8 * BT, 2);
    insert_run(t, b, tok, 8, 0, false, 0); /* b holds the whole pool */
    size_t done;
    uint32_t a_ids[4] = {7, 6, 5, 4}, canon[4];
    prompt(tok, 4 * BT, 1);
    for (uint32_t k = 0; k < 4; k++) {
        /* a's conversation grows a block at a time, in the block b's tail
         * gives back */
        ck_assert_uint_eq(ev.n, k);
        evict_expect(t, a, 1, (const uint32_t[]){7 - k}, 1);
        ck_assert_int_eq(radix_insert(t, a, tok, (k + 1) * BT, a_ids, k + 1, false, canon, &done),
                         0);
        ck_assert_uint_eq(done, k + 1);
    }
    radix_ns_stats_t st;
    ns_stats(t, a, &st);
    ck_assert_uint_eq(st.cached_blocks, 4);
    ns_stats(t, b, &st);
    ck_assert_uint_eq(st.cached_blocks, 4);
    ck_assert_uint_eq(st.evicted_others, 4);
    /* Both at their reservations. */
    evict_expect(t, RADIX_NS_ANY, 8, NULL, 0);
    ck_assert_uint_eq(ev.n, 4);
    evict_expect(t, a, 1, (const uint32_t[]){4}, 1); /* a's own, though b's blocks are older */
    evict_expect(t, b, 1, (const uint32_t[]){3}, 1);
    ns_stats(t, a, &st);
    ck_assert_uint_eq(st.evicted_own, 1);
    ck_assert_uint_eq(st.evicted_others, 0);
    ns_stats(t, b, &st);
    ck_assert_uint_eq(st.evicted_own, 1);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_reservation_pinned_givers)
{
    /* What others hold above their reservations is pinned: a namespace
     * below its own then evicts its own leaves. */
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t chat = ns_new(t, "chat", 0, 8), lng = ns_new(t, "long", 0, 0);
    uint32_t tok[4 * BT];
    prompt(tok, 2 * BT, 1);
    insert_run(t, chat, tok, 2, 0, false, 0);
    prompt(tok, 4 * BT, 2);
    insert_run(t, lng, tok, 4, 10, true, 0);
    evict_expect(t, chat, 1, (const uint32_t[]){1}, 1);
    /* Unpinned, long's tail is the first to go. */
    ck_assert_int_eq(radix_unpin(t, 13), 0);
    evict_expect(t, chat, 2, (const uint32_t[]){13, 0}, 2);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_reservation_freq)
{
    /* Under RADIX_EVICT_FREQ the leaves given are taken in that policy's
     * order: long's block hit twice outlives its newer block never hit. */
    radix_config_t cfg = {
        .block_tokens = BT, .max_blocks = 64, .policy = RADIX_EVICT_FREQ, .freq_bonus_ticks = 10};
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t chat = ns_new(t, "chat", 0, 4), lng = ns_new(t, "long", 0, 0);
    uint32_t tok[BT];
    prompt(tok, BT, 1);
    insert_run(t, chat, tok, 1, 0, false, 0); /* tick 1 */
    prompt(tok, BT, 2);
    insert_run(t, lng, tok, 1, 10, false, 0);              /* tick 2 */
    ck_assert_uint_eq(lookup_n(t, lng, tok, BT, NULL), 1); /* tick 3 */
    ck_assert_uint_eq(lookup_n(t, lng, tok, BT, NULL), 1); /* tick 4: key 24 */
    prompt(tok, BT, 3);
    insert_run(t, lng, tok, 1, 11, false, 0); /* tick 5: key 5 */
    evict_expect(t, chat, 3, (const uint32_t[]){11, 10, 0}, 3);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* ---- collisions and fan-out ------------------------------------------------------ */

static uint64_t hash_const(const uint32_t *tokens, size_t n, uint64_t seed)
{
    (void)tokens;
    (void)n;
    (void)seed;
    return 42;
}

START_TEST(test_collisions)
{
    /* Every block hashes to 42: prefixes are told apart by their tokens. */
    radix_tree_t *t = tree_with(BT, 512, hash_const);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 0, 0);
    uint32_t tok[40][3 * BT], ids[3];
    for (uint32_t k = 0; k < 40; k++) {
        prompt(tok[k], 3 * BT, k + 1);
        if (k % 3 == 1) /* shares block 0 with prompt k-1, differs after */
            memcpy(tok[k], tok[k - 1], BT * sizeof(uint32_t));
        uint32_t c[3];
        size_t done;
        uint32_t in[3] = {10 * k, 10 * k + 1, 10 * k + 2};
        ck_assert_int_eq(radix_insert(t, k < 20 ? a : b, tok[k], 3 * BT, in, 3, false, c, &done),
                         0);
        ck_assert_uint_eq(done, 3);
        ck_assert_int_eq(radix_check(t), 0);
    }
    for (uint32_t k = 0; k < 40; k++) {
        uint32_t ns = k < 20 ? a : b;
        ck_assert_uint_eq(lookup_n(t, ns, tok[k], 3 * BT, ids), 3);
        ck_assert_uint_eq(ids[0], k % 3 == 1 ? 10 * (k - 1) : 10 * k);
        ck_assert_uint_eq(ids[1], 10 * k + 1);
        ck_assert_uint_eq(ids[2], 10 * k + 2);
        /* Same hash, other namespace: no match. */
        ck_assert_uint_eq(lookup_n(t, ns == a ? b : a, tok[k], 3 * BT, NULL), 0);
    }
    /* A prompt that collides with everything but matches nothing. */
    uint32_t other[3 * BT];
    prompt(other, 3 * BT, 999);
    ck_assert_uint_eq(lookup_n(t, a, other, 3 * BT, NULL), 0);
    size_t got;
    ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, 1000, &got), 0);
    ck_assert_uint_eq(radix_cached_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_fanout_10k)
{
    enum { N = 10000 };
    radix_tree_t *t = tree_with(BT, 2 * N + 4, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[2 * BT], ids[2], canon[2];
    size_t done;
    for (uint32_t k = 0; k < N; k++) {
        prompt(tok, 2 * BT, k + 1);
        uint32_t in[2] = {2 * k, 2 * k + 1};
        ck_assert_int_eq(radix_insert(t, ns, tok, 2 * BT, in, 2, false, canon, &done), 0);
    }
    ck_assert_int_eq(radix_check(t), 0);
    for (uint32_t k = 0; k < N; k++) {
        size_t n;
        prompt(tok, 2 * BT, k + 1);
        ck_assert_int_eq(radix_lookup(t, ns, tok, 2 * BT, false, ids, 2, &n), 0);
        ck_assert_uint_eq(n, 2);
        ck_assert_uint_eq(ids[0], 2 * k);
        ck_assert_uint_eq(ids[1], 2 * k + 1);
    }
    radix_prefix_t top[3];
    size_t n_top;
    ck_assert_int_eq(radix_top(t, ns, RADIX_BY_HITS, top, 3, &n_top), 0);
    ck_assert_uint_eq(n_top, 3);
    ck_assert_uint_eq(top[0].hits, 1);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* ---- top and memory ----------------------------------------------------------------- */

/* Demotes n leaves of ns into tier 2, which has room for them all (none is
 * dropped), and completes each copy: a move goes to a tier-2 id (at or past
 * pool_blocks) and radix_copy_done names the tier-1 id it came from. */
static void demote_copied(radix_tree_t *t, uint32_t ns, size_t n, uint32_t pool_blocks,
                          radix_move_t *mv)
{
    size_t n_mv = 9, n_dr = 9;
    uint32_t peer;
    ck_assert_int_eq(radix_demote(t, ns, n, mv, &n_mv, &n_dr), 0);
    ck_assert_uint_eq(n_mv, n);
    ck_assert_uint_eq(n_dr, 0);
    for (size_t k = 0; k < n_mv; k++) {
        ck_assert_uint_ge(mv[k].to, pool_blocks);
        ck_assert_int_eq(radix_copy_done(t, mv[k].to, &peer), 0);
        ck_assert_uint_eq(peer, mv[k].from);
    }
}

/* With a tier 2: radix_top says how many blocks under each prefix are in
 * tier 2, a drop from a full tier 2 is reported through on_evict with its
 * tier-2 id, and radix_lookup_uncount takes a lookup back out of the
 * counters, hits by tier included. */
START_TEST(test_tier2_top_drop_uncount)
{
    radix_config_t cfg = {.block_tokens = BT, .max_blocks = 4, .tier2_blocks = 2};
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t ns = ns_new(t, "a", 0, 0), tok[4 * BT], ids[4], peer;
    prompt(tok, 4 * BT, 1);
    insert_run(t, ns, tok, 4, 0, false, 0);
    radix_move_t mv[4];
    size_t n_mv = 9, n_dr = 9;
    demote_copied(t, ns, 2, 4, mv);
    radix_prefix_t rows[4];
    size_t n_rows = 0;
    ck_assert_int_eq(radix_top(t, RADIX_NS_ALL, RADIX_BY_SIZE, rows, 4, &n_rows), 0);
    ck_assert_uint_eq(n_rows, 1);
    ck_assert_uint_eq(rows[0].blocks, 4);
    ck_assert_uint_eq(rows[0].tier2_blocks, 2);
    ck_assert_uint_ge(rows[0].last_block_id, 4); /* its last block is in tier 2 */

    /* A lookup matches 2 + 2 blocks; taken back out, the counters are as before. */
    radix_ns_stats_t before, after;
    ck_assert_int_eq(radix_ns_stats(t, ns, &before), 0);
    size_t n = 0;
    ck_assert_int_eq(radix_lookup(t, ns, tok, 4 * BT, false, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(radix_ns_stats(t, ns, &after), 0);
    ck_assert_uint_eq(after.hit_tokens - before.hit_tokens, 4 * BT);
    ck_assert_uint_eq(after.t2_hit_tokens - before.t2_hit_tokens, 2 * BT);
    ck_assert_int_eq(radix_lookup_uncount(t, ns, 4 * BT, 4, 5, 0), KVS_EINVAL);
    ck_assert_int_eq(radix_lookup_uncount(t, 7, 4 * BT, 4, 2, 0), KVS_ENONS);
    ck_assert_int_eq(radix_lookup_uncount(t, ns, 4 * BT, 4, 2, 0), 0);
    ck_assert_int_eq(radix_ns_stats(t, ns, &after), 0);
    ck_assert_uint_eq(after.lookups, before.lookups);
    ck_assert_uint_eq(after.lookup_tokens, before.lookup_tokens);
    ck_assert_uint_eq(after.hit_tokens, before.hit_tokens);
    ck_assert_uint_eq(after.t2_hit_tokens, before.t2_hit_tokens);
    ck_assert_int_eq(radix_lookup_uncount(t, ns, 4 * BT, 4, 2, 0), KVS_EINVAL); /* nothing left */

    /* A second prompt fills the pool; demoting for it drops tier 2's
     * least recently used leaf (prompt 1's last block) through on_evict. */
    uint32_t tok2[2 * BT];
    prompt(tok2, 2 * BT, 2);
    ev.n = 0;
    insert_run(t, ns, tok2, 2, 2, false, 0);
    ck_assert_int_eq(radix_demote(t, ns, 1, mv, &n_mv, &n_dr), 0);
    ck_assert_uint_eq(n_mv, 1);
    ck_assert_uint_eq(ev.n, 1);
    ck_assert_uint_eq(ev.ids[0], rows[0].last_block_id);
    ck_assert_int_eq(radix_copy_done(t, mv[0].to, &peer), 0);
    ck_assert_int_eq(radix_ns_stats(t, ns, &after), 0);
    ck_assert_uint_eq(after.tier2_dropped, 1);
    ck_assert_uint_eq(after.evicted_blocks, 1);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* radix_promotable: the run of a matched tier-2 part that the matching
 * lookup alone pins; a block someone else pins too ends it. */
START_TEST(test_tier2_promotable)
{
    radix_config_t cfg = {.block_tokens = BT, .max_blocks = 4, .tier2_blocks = 4};
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t ns = ns_new(t, "a", 0, 0), tok[4 * BT], ids[4];
    prompt(tok, 4 * BT, 1);
    insert_run(t, ns, tok, 4, 0, false, 0);
    radix_move_t mv[4];
    demote_copied(t, ns, 3, 4, mv);
    size_t n = 0;
    ck_assert_int_eq(radix_lookup(t, ns, tok, 4 * BT, true, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_lt(ids[0], 4);
    ck_assert_uint_eq(radix_promotable(t, ids + 1, 3), 3);
    ck_assert_uint_eq(radix_promotable(t, ids, 4), 0); /* a tier-1 block first */
    ck_assert_uint_eq(radix_promotable(NULL, ids + 1, 3), 0);
    /* Another reader pins the middle block: the run stops before it. */
    ck_assert_int_eq(radix_pin(t, ids[2]), 0);
    ck_assert_uint_eq(radix_promotable(t, ids + 1, 3), 1);
    ck_assert_int_eq(radix_promote(t, ids[2], 3), KVS_EBUSY); /* as radix_promote says */
    ck_assert_int_eq(radix_unpin(t, ids[2]), 0);
    ck_assert_uint_eq(radix_promotable(t, ids + 1, 3), 3);
    for (size_t k = 0; k < n; k++)
        ck_assert_int_eq(radix_unpin(t, ids[k]), 0);
    /* Unpinned, nothing is promotable: the caller's pin is missing. */
    ck_assert_uint_eq(radix_promotable(t, ids + 1, 3), 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* A tier-1 id that a demotion is still copying from stays the caller's
 * until radix_copy_done: neither an insert nor a promotion may take it. */
START_TEST(test_tier2_leaving_id)
{
    radix_config_t cfg = {.block_tokens = BT, .max_blocks = 4, .tier2_blocks = 4};
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t ns = ns_new(t, "a", 0, 0), tok[2 * BT], tok2[BT], peer, canon[1];
    prompt(tok, 2 * BT, 1);
    prompt(tok2, BT, 2);
    insert_run(t, ns, tok, 2, 0, false, 0);
    radix_move_t mv[1];
    size_t n_mv = 0, n_dr = 0, done = 9;
    ck_assert_int_eq(radix_demote(t, ns, 1, mv, &n_mv, &n_dr), 0);
    ck_assert_uint_eq(n_mv, 1);
    ck_assert_uint_eq(mv[0].from, 1);
    const uint32_t leaving[1] = {mv[0].from};
    ck_assert_int_eq(radix_insert(t, ns, tok2, BT, leaving, 1, false, canon, &done), KVS_EEXIST);
    ck_assert_uint_eq(done, 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_int_eq(radix_copy_done(t, mv[0].to, &peer), 0);
    ck_assert_uint_eq(peer, mv[0].from);
    /* Copied: the id is the caller's again. */
    ck_assert_int_eq(radix_insert(t, ns, tok2, BT, leaving, 1, false, canon, &done), 0);
    ck_assert_uint_eq(done, 1);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

/* radix_copy_undo: a failed copy's moves go back, in reverse order, to the
 * ids they left, with their pins; one that would put a tier-1 block below a
 * tier-2 one is refused and changes nothing. */
/* Three tiers: a full tier 2 moves its candidates to tier 3 (moves from a
 * tier-2 id, freed once copied), promotion from tier 3 goes straight to
 * tier 1, a failed move down from tier 2 goes back up, and a restore puts
 * chains straight into tier 3 with the caller's ids. */
START_TEST(test_tier3_chain)
{
    radix_config_t cfg = {
        .block_tokens = BT, .max_blocks = 4, .tier2_blocks = 2, .tier3_blocks = 4};
    radix_tree_t *t = tree_cfg(cfg);
    const uint32_t base3 = 6;
    uint32_t ns = ns_new(t, "a", 0, 0), tok[4 * BT], ids[4], peer;
    prompt(tok, 4 * BT, 1);
    insert_run(t, ns, tok, 4, 0, false, 0);
    radix_move_t mv[4];
    size_t n_mv = 0, n_dr = 0, n = 0;
    /* Two blocks down to tier 2 (its room), the leaf first. */
    demote_copied(t, ns, 2, 4, mv);
    ck_assert_uint_eq(radix_tier_blocks(t, 2), 2);
    ck_assert_uint_eq(radix_tier_free(t, 2), 0);
    /* Tier 2 is full: the next call moves tier 2's candidate (the leaf, 3)
     * to tier 3; no tier-1 block moves in that call. */
    ck_assert_int_eq(radix_demote(t, ns, 1, mv, &n_mv, &n_dr), 0);
    ck_assert_uint_eq(n_mv, 1);
    ck_assert_uint_eq(n_dr, 0);
    ck_assert_uint_eq(radix_tier_of(t, mv[0].from), 2);
    ck_assert_uint_eq(radix_tier_of(t, mv[0].to), 3);
    ck_assert_int_eq(radix_block_peer(t, mv[0].to, &peer), 0);
    ck_assert_uint_eq(peer, mv[0].from);
    ck_assert_uint_eq(radix_tier_free(t, 2), 0); /* not free before the copy ends */
    ck_assert_int_eq(radix_check(t), 0);
    /* A failed copy: back to tier 2. */
    ck_assert_int_eq(radix_copy_undo(t, mv[0].to, &peer), 0);
    ck_assert_uint_eq(radix_tier_of(t, peer), 2);
    ck_assert_uint_eq(radix_tier_blocks(t, 3), 0);
    ck_assert_uint_eq(radix_tier_free(t, 3), 4);
    ck_assert_int_eq(radix_check(t), 0);
    /* Again, copied this time: tier 2 has a free id, the next call uses it. */
    ck_assert_int_eq(radix_demote(t, ns, 1, mv, &n_mv, &n_dr), 0);
    ck_assert_int_eq(radix_copy_done(t, mv[0].to, &peer), 0);
    ck_assert_uint_eq(radix_tier_free(t, 2), 1);
    demote_copied(t, ns, 1, 4, mv);
    ck_assert_uint_eq(radix_tier_blocks(t, 1), 1);
    ck_assert_uint_eq(radix_tier_blocks(t, 2), 2);
    ck_assert_uint_eq(radix_tier_blocks(t, 3), 1);
    ck_assert_int_eq(radix_check(t), 0);
    /* A pinned lookup matches tier 1, then 2, then 3; counted by tier. */
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_lookup(t, ns, tok, 4 * BT, true, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    const uint32_t want_tier[4] = {1, 2, 2, 3};
    for (uint32_t k = 0; k < 4; k++)
        ck_assert_uint_eq(radix_tier_of(t, ids[k]), want_tier[k]);
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.t2_hit_tokens, 3 * BT);
    ck_assert_uint_eq(st.t3_hit_tokens, 1 * BT);
    ck_assert_uint_eq(st.demoted3_blocks, 2);
    ck_assert_uint_eq(radix_promotable(t, ids + 1, 3), 3);
    /* The tier-3 block cannot come up before its tier-2 parent. */
    ck_assert_int_eq(radix_promote(t, ids[3], 1), KVS_EINVAL);
    ck_assert_int_eq(radix_promote(t, ids[1], 1), 0);
    ck_assert_int_eq(radix_promote(t, ids[2], 2), 0);
    ck_assert_int_eq(radix_promote(t, ids[3], 3), 0);
    ck_assert_int_eq(radix_check(t), 0);
    /* Undone in reverse, the last goes back down to tier 3. */
    ck_assert_int_eq(radix_copy_undo(t, 3, &peer), 0);
    ck_assert_uint_eq(peer, ids[3]);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_int_eq(radix_copy_done(t, 1, &peer), 0);
    ck_assert_int_eq(radix_copy_done(t, 2, &peer), 0);
    ck_assert_int_eq(radix_promote(t, ids[3], 3), 0);
    ck_assert_int_eq(radix_copy_done(t, 3, &peer), 0);
    ck_assert_uint_eq(peer, ids[3]);
    ck_assert_uint_eq(radix_tier_blocks(t, 1), 4);
    ck_assert_uint_eq(radix_tier_free(t, 2), 2);
    ck_assert_uint_eq(radix_tier_free(t, 3), 4);
    for (uint32_t k = 0; k < 4; k++)
        ck_assert_int_eq(radix_unpin(t, k), 0);
    ck_assert_int_eq(radix_check(t), 0);

    /* A spill: tier 2's candidate down to tier 3 without a tier-1 move,
     * its tier-2 id leaving until copied. */
    demote_copied(t, ns, 2, 4, mv);
    ck_assert_uint_eq(radix_tier_free(t, 2), 0);
    ck_assert_int_eq(radix_spill(t, 2, 1, mv, &n_mv), 0);
    ck_assert_uint_eq(n_mv, 1);
    ck_assert_uint_eq(radix_tier_of(t, mv[0].from), 2);
    ck_assert_uint_eq(radix_tier_of(t, mv[0].to), 3);
    ck_assert_uint_eq(radix_tier_leaving(t, 2), 1);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_int_eq(radix_copy_done(t, mv[0].to, &peer), 0);
    ck_assert_uint_eq(radix_tier_leaving(t, 2), 0);
    ck_assert_uint_eq(radix_tier_free(t, 2), 1);
    ck_assert_int_eq(radix_spill(t, 3, 1, mv, &n_mv), KVS_EINVAL);
    ck_assert_int_eq(radix_spill(t, 1, 1, mv, &n_mv), KVS_EINVAL);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);

    /* Restore: chains straight into tier 3 under the caller's ids. */
    cfg.tier3_blocks = 8;
    t = tree_cfg(cfg);
    ns = ns_new(t, "a", 0, 0);
    uint32_t tok2[3 * BT], can[4];
    prompt(tok2, 3 * BT, 2);
    uint32_t r1[3] = {base3 + 5, base3 + 2, base3 + 7};
    ck_assert_int_eq(radix_restore(t, ns, tok2, 3 * BT, r1, 3, can, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(radix_tier_blocks(t, 3), 3);
    ck_assert_uint_eq(radix_tier_free(t, 3), 5);
    ck_assert_int_eq(radix_check(t), 0);
    /* A longer chain through the same prefix: its first two stay. */
    uint32_t tok3[4 * BT];
    memcpy(tok3, tok2, 2 * BT * sizeof(uint32_t));
    prompt(tok3 + 2 * BT, 2 * BT, 3);
    uint32_t r2[4] = {base3 + 0, base3 + 1, base3 + 3, base3 + 4};
    ck_assert_int_eq(radix_restore(t, ns, tok3, 4 * BT, r2, 4, can, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(can[0], base3 + 5);
    ck_assert_uint_eq(can[1], base3 + 2);
    ck_assert_uint_eq(can[2], base3 + 3);
    ck_assert_uint_eq(radix_tier_blocks(t, 3), 5);
    ck_assert_uint_eq(radix_tier_free(t, 3), 3);
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.restored_blocks, 5);
    ck_assert_uint_eq(st.tier3_blocks, 5);
    ck_assert_int_eq(radix_check(t), 0);
    /* Ids taken, of another tier, or mixed: refused. */
    uint32_t taken[1] = {base3 + 3}, pool_ids[1] = {0}, mixed[2] = {base3 + 6, 4};
    uint32_t tok4[2 * BT];
    prompt(tok4, 2 * BT, 4);
    ck_assert_int_eq(radix_restore(t, ns, tok4, BT, taken, 1, can, &n), KVS_EEXIST);
    ck_assert_int_eq(radix_restore(t, ns, tok4, BT, pool_ids, 1, can, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_restore(t, ns, tok4, 2 * BT, mixed, 2, can, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_restore(t, 9, tok4, BT, r1, 1, can, &n), KVS_ENONS);
    /* What names a restored block, for its next copy. */
    uint64_t h, ph, h0;
    const uint32_t *bt_tokens;
    ck_assert_int_eq(radix_block_chain(t, base3 + 2, &h, &ph, &bt_tokens), 0);
    ck_assert_int_eq(radix_block_hash(t, base3 + 5, &h0), 0);
    ck_assert_uint_eq(ph, h0);
    ck_assert(memcmp(bt_tokens, tok2 + BT, BT * sizeof(uint32_t)) == 0);
    ck_assert_int_eq(radix_block_chain(t, base3 + 6, &h, &ph, &bt_tokens), KVS_ENOTFOUND);
    /* A lookup finds them in tier 3, and they come back to tier 1. */
    ck_assert_int_eq(radix_lookup(t, ns, tok3, 4 * BT, true, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(radix_promote(t, ids[0], 0), 0);
    ck_assert_int_eq(radix_copy_done(t, 0, &peer), 0);
    ck_assert_uint_eq(peer, base3 + 5);
    ck_assert_uint_eq(radix_tier_free(t, 3), 4);
    for (uint32_t k = 0; k < 4; k++)
        ck_assert_int_eq(radix_unpin(t, k == 0 ? 0 : ids[k]), 0);
    size_t cleared;
    ck_assert_int_eq(radix_ns_clear(t, ns, &cleared), 0);
    ck_assert_uint_eq(cleared, 5);
    ck_assert_uint_eq(radix_tier_free(t, 3), 8);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_tier2_copy_undo)
{
    radix_config_t cfg = {.block_tokens = BT, .max_blocks = 4, .tier2_blocks = 4};
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t ns = ns_new(t, "a", 0, 0), tok[3 * BT], ids[3], peer;
    prompt(tok, 3 * BT, 1);
    insert_run(t, ns, tok, 3, 0, false, 0);
    radix_move_t mv[2];
    size_t n_mv = 0, n_dr = 0, n = 0;
    /* Two demotions, one call each: the parent's goes first back. */
    ck_assert_int_eq(radix_demote(t, ns, 1, mv, &n_mv, &n_dr), 0);
    ck_assert_int_eq(radix_demote(t, ns, 1, mv + 1, &n_mv, &n_dr), 0);
    ck_assert_uint_eq(mv[0].from, 2);
    ck_assert_uint_eq(mv[1].from, 1);
    ck_assert_int_eq(radix_copy_undo(t, mv[0].to, &peer), KVS_EBUSY);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_int_eq(radix_copy_undo(t, mv[1].to, &peer), 0);
    ck_assert_uint_eq(peer, 1);
    ck_assert_int_eq(radix_copy_undo(t, mv[0].to, &peer), 0);
    ck_assert_uint_eq(peer, 2);
    ck_assert_int_eq(radix_copy_undo(t, mv[0].to, &peer), KVS_ENOTFOUND);
    ck_assert_uint_eq(radix_busy_blocks(t), 0);
    ck_assert_uint_eq(radix_tier2_blocks(t), 0);
    ck_assert_uint_eq(radix_tier2_free(t), 4);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_int_eq(radix_match(t, ns, tok, 3 * BT, ids, 3, &n), 0);
    ck_assert_uint_eq(n, 3);
    for (uint32_t k = 0; k < 3; k++)
        ck_assert_uint_eq(ids[k], k);

    /* Promotions of a pinned lookup, undone: the pins are on the tier-2
     * ids again. */
    demote_copied(t, ns, 2, 4, mv);
    ck_assert_int_eq(radix_lookup(t, ns, tok, 3 * BT, true, ids, 3, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(radix_promote(t, ids[1], 1), 0);
    ck_assert_int_eq(radix_promote(t, ids[2], 2), 0);
    ck_assert_int_eq(radix_copy_undo(t, 1, &peer), KVS_EBUSY); /* its child is in tier 1 */
    ck_assert_int_eq(radix_copy_undo(t, 2, &peer), 0);
    ck_assert_uint_eq(peer, ids[2]);
    ck_assert_int_eq(radix_copy_undo(t, 1, &peer), 0);
    ck_assert_uint_eq(peer, ids[1]);
    ck_assert_uint_eq(radix_tier2_blocks(t), 2);
    ck_assert_uint_eq(radix_busy_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    for (size_t k = 0; k < n; k++)
        ck_assert_int_eq(radix_unpin(t, ids[k]), 0);
    ck_assert_uint_eq(radix_pinned_blocks(t), 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);
}
END_TEST

START_TEST(test_top)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 0, 0);
    uint32_t sys[6 * BT], u1[6 * BT], u2[6 * BT];
    prompt(sys, 6 * BT, 1);
    memcpy(u1, sys, sizeof(u1));
    memcpy(u2, sys, sizeof(u2));
    u1[2 * BT] = 7001; /* shared system prompt: 2 blocks */
    u2[2 * BT] = 7002;
    insert_run(t, a, u1, 6, 0, false, 0);
    insert_run(t, a, u2, 5, 10, true, 0);
    insert_run(t, b, sys, 1, 20, false, 0);
    for (int k = 0; k < 3; k++)
        lookup_n(t, a, u2, 6 * BT, NULL);
    lookup_n(t, a, u1, 2 * BT, NULL);
    radix_prefix_t rows[8];
    size_t n;
    ck_assert_int_eq(radix_top(t, a, RADIX_BY_SIZE, rows, 8, &n), 0);
    ck_assert_uint_eq(n, 3);
    /* The system prompt's node holds everything below it. */
    ck_assert_uint_eq(rows[0].blocks, 2 + 4 + 3);
    ck_assert_uint_eq(rows[0].tokens, 2 * BT);
    ck_assert_uint_eq(rows[0].pins, 5);
    ck_assert_uint_eq(rows[0].hits, 4);
    ck_assert_uint_eq(rows[1].blocks, 4);
    ck_assert_uint_eq(rows[1].tokens, 6 * BT);
    ck_assert_uint_eq(rows[1].last_block_id, 5);
    ck_assert_uint_eq(rows[2].blocks, 3);
    ck_assert_uint_eq(rows[2].last_block_id, 14);
    ck_assert_uint_eq(rows[2].pins, 3);
    /* The rows nest: both conversations extend the system prompt's node
     * (its last block is u1's second, id 1), which starts at the root. */
    ck_assert(!rows[0].has_parent);
    ck_assert_uint_eq(rows[0].last_block_id, 1);
    ck_assert(rows[1].has_parent);
    ck_assert_uint_eq(rows[1].parent_block_id, 1);
    ck_assert(rows[2].has_parent);
    ck_assert_uint_eq(rows[2].parent_block_id, 1);
    ck_assert_int_eq(radix_top(t, a, RADIX_BY_HITS, rows, 2, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(rows[0].hits, 4);
    ck_assert_uint_eq(rows[1].hits, 3);
    ck_assert_uint_eq(rows[1].last_block_id, 14);
    ck_assert_uint_gt(rows[1].last_used, 0);
    ck_assert_int_eq(radix_top(t, RADIX_NS_ALL, RADIX_BY_SIZE, rows, 8, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(radix_top(t, 5, RADIX_BY_SIZE, rows, 8, &n), KVS_ENONS);
    ck_assert_int_eq(radix_top(t, a, RADIX_BY_SIZE, NULL, 8, &n), KVS_EINVAL);
    radix_free(t);
}
END_TEST

START_TEST(test_memory)
{
    radix_tree_t *t = tree_with(16, 4096, NULL);
    uint32_t ns = ns_new(t, "a", 0, 0);
    size_t empty = radix_memory_bytes(t);
    uint32_t tok[256 * 16], ids[256], canon[256];
    size_t done;
    for (uint32_t k = 0; k < 256; k++)
        ids[k] = k;
    prompt(tok, 256 * 16, 1);
    ck_assert_int_eq(radix_insert(t, ns, tok, 256 * 16, ids, 256, false, canon, &done), 0);
    size_t full = radix_memory_bytes(t);
    /* At least the token ids, and not absurdly more. */
    ck_assert_uint_ge(full - empty, 256 * 64);
    ck_assert_uint_le(full - empty, 256 * (64 + 160));
    size_t got;
    ck_assert_int_eq(radix_evict(t, ns, 256, &got), 0);
    /* Nodes are gone; the table and queues keep their capacity. */
    ck_assert_uint_lt(radix_memory_bytes(t), empty + 2048);
    radix_free(t);
}
END_TEST

START_TEST(test_evict_freq_order)
{
    /* Fixed bonus of 10 ticks per hit, at most 2 hits: a leaf used earlier
     * but hit twice outlives newer leaves never hit, until it is older
     * than them by more than its bonus. */
    radix_config_t cfg = {
        .block_tokens = BT, .max_blocks = 64, .policy = RADIX_EVICT_FREQ, .freq_bonus_ticks = 10};
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[8 * BT];
    prompt(tok, BT, 1);
    insert_run(t, ns, tok, 1, 0, false, 0);               /* tick 1: block 0 */
    ck_assert_uint_eq(lookup_n(t, ns, tok, BT, NULL), 1); /* tick 2, 1 hit */
    ck_assert_uint_eq(lookup_n(t, ns, tok, BT, NULL), 1); /* tick 3, 2 hits: key 23 */
    ck_assert_uint_eq(lookup_n(t, ns, tok, BT, NULL), 1); /* tick 4, hits capped: key 24 */
    for (uint32_t k = 0; k < 25; k++) {
        prompt(tok, BT, 10 + k);
        insert_run(t, ns, tok, 1, 1 + k, false, 0); /* ticks 5 .. 29, keys = ticks */
    }
    size_t got;
    ck_assert_int_eq(radix_evict(t, ns, 20, &got), 0);
    ck_assert_uint_eq(got, 20);
    /* keys 5 .. 23 go first (blocks 1 .. 19), then block 0 (key 24) */
    for (uint32_t k = 0; k < 19; k++)
        ck_assert_uint_eq(ev.ids[k], 1 + k);
    ck_assert_uint_eq(ev.ids[19], 0);
    ck_assert_int_eq(radix_check(t), 0);
    radix_free(t);

    /* Bad policy parameters are refused. */
    radix_tree_t *bad = NULL;
    radix_config_t c2 = {.block_tokens = BT, .max_blocks = 8, .policy = (radix_policy_t)7};
    ck_assert_int_eq(radix_new(&c2, &bad), KVS_EINVAL);
    c2.policy = RADIX_EVICT_FREQ;
    c2.freq_max_hits = 256;
    ck_assert_int_eq(radix_new(&c2, &bad), KVS_EINVAL);
    ck_assert_ptr_null(bad);
}
END_TEST

/* ---- differential test ------------------------------------------------------------------ */

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)((rng_state >> 11) % n);
}

/* Weak chained hash: a few values, so collisions are everywhere. */
static uint64_t hash_weak(const uint32_t *tokens, size_t n, uint64_t seed)
{
    (void)n;
    return (seed * 31 + tokens[0]) & 3;
}

/* Eviction order of a pool of 64 one-block prompts: prompt k is inserted at
 * k (evicting one block when the pool is full), and every other prompt is
 * looked up again `lag` prompts later. Fills out[] and returns the count. */
static size_t horizon_order(radix_config_t cfg, uint32_t lag, uint32_t *out)
{
    cfg.block_tokens = BT;
    cfg.max_blocks = 2048;
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t ns = ns_new(t, "a", 0, 0);
    uint32_t tok[BT], id, canon;
    size_t done, got;
    for (uint32_t k = 0; k < 1200; k++) {
        if (radix_cached_blocks(t) >= 64) {
            ck_assert_int_eq(radix_evict(t, ns, 1, &got), 0);
            ck_assert_uint_eq(got, 1);
        }
        prompt(tok, BT, k + 1);
        id = k;
        ck_assert_int_eq(radix_insert(t, ns, tok, BT, &id, 1, false, &canon, &done), 0);
        if (k >= lag && (k - lag) % 2 == 0) {
            prompt(tok, BT, k - lag + 1);
            ck_assert_int_eq(radix_lookup(t, ns, tok, BT, false, &id, 1, &done), 0);
        }
    }
    ck_assert_int_eq(radix_check(t), 0);
    size_t n = ev.n;
    memcpy(out, ev.ids, n * sizeof(*out));
    radix_free(t);
    return n;
}

START_TEST(test_evict_freq_horizon)
{
    /* Blocks reused 1 tick after insertion, evicted ~100 ticks later: the
     * eviction age is far past the horizon (2.75 reuse gaps), so the
     * default FREQ bonus is 0 and the order is exactly LRU's; without a
     * horizon, blocks hit once outlive the others. With reuses 40 prompts
     * later (gap ~80 ticks, horizon ~220 > age ~100), the bonus is there. */
    static uint32_t lru[2048], freq[2048], nohorizon[2048];
    radix_config_t c_lru = {.policy = RADIX_EVICT_LRU};
    radix_config_t c_freq = {.policy = RADIX_EVICT_FREQ};
    radix_config_t c_nohorizon = {.policy = RADIX_EVICT_FREQ,
                                  .freq_horizon_pct = RADIX_FREQ_NO_HORIZON};
    size_t n = horizon_order(c_lru, 0, lru);
    ck_assert_uint_eq(n, 1200 - 64);
    ck_assert_uint_eq(horizon_order(c_freq, 0, freq), n);
    ck_assert_uint_eq(horizon_order(c_nohorizon, 0, nohorizon), n);
    ck_assert_mem_eq(freq, lru, n * sizeof(uint32_t));
    ck_assert(memcmp(nohorizon, lru, n * sizeof(uint32_t)) != 0);

    n = horizon_order(c_lru, 40, lru);
    ck_assert_uint_eq(horizon_order(c_freq, 40, freq), n);
    ck_assert(memcmp(freq, lru, n * sizeof(uint32_t)) != 0);

    /* A horizon above 10000 % that is not RADIX_FREQ_NO_HORIZON is refused. */
    radix_tree_t *bad = NULL;
    radix_config_t c2 = {
        .block_tokens = BT, .max_blocks = 8, .policy = RADIX_EVICT_FREQ, .freq_horizon_pct = 10001};
    ck_assert_int_eq(radix_new(&c2, &bad), KVS_EINVAL);
    ck_assert_ptr_null(bad);
}
END_TEST

typedef struct diff_cfg {
    uint64_t seed;
    long ops;
    uint32_t bt, vocab, max_blocks;
    radix_hash_fn hash;
    bool sparse; /* tokens mostly 0: long blocks still share prefixes */
    radix_policy_t policy;
    uint32_t max_hits, bonus_pct;
    uint64_t bonus_ticks;
    uint32_t horizon_pct;
    uint32_t t2_blocks; /* > 0: a tier 2, and demote/promote/copy steps */
    uint32_t t3_blocks; /* > 0: a tier 3 below tier 2 as well */
} diff_cfg_t;

#define MAX_PROMPT_BLOCKS 10
#define MAX_BT            16

/* Check records every passing ck_assert; the differential loop makes
 * millions of comparisons (radix_diff.c), so it only calls into Check on a
 * failure. */
#define DIFF_OK(d, call)                                                                           \
    do {                                                                                           \
        if ((call) != 0)                                                                           \
            ck_abort_msg("%s", (d)->err);                                                          \
    } while (0)

static void diff_run(const diff_cfg_t *dc)
{
    radix_config_t cfg = {.block_tokens = dc->bt,
                          .max_blocks = dc->max_blocks,
                          .hash = dc->hash,
                          .policy = dc->policy,
                          .freq_max_hits = dc->max_hits,
                          .freq_bonus_pct = dc->bonus_pct,
                          .freq_bonus_ticks = dc->bonus_ticks,
                          .freq_horizon_pct = dc->horizon_pct,
                          .tier2_blocks = dc->t2_blocks,
                          .tier3_blocks = dc->t3_blocks};
    static const uint32_t quotas[3] = {0, 16, 0}, reserves[3] = {0, 0, 12};
    static const char *const names[3] = {"free", "quota", "reserve"};
    radix_diff_t *d = malloc(sizeof(*d));
    ck_assert_ptr_nonnull(d);
    DIFF_OK(d, radix_diff_init(d, cfg, 3, names, quotas, reserves, 4096));
    /* KVS_RADIX_SEED=n reruns the same test with other seeds. */
    const char *seed_env = getenv("KVS_RADIX_SEED");
    rng_state = dc->seed ^ (seed_env ? strtoull(seed_env, NULL, 0) * 0x9E3779B97F4A7C15ull : 0);
    if (rng_state == 0)
        rng_state = 1;
    uint32_t tok[MAX_PROMPT_BLOCKS * MAX_BT + 16];
    uint32_t ids[MAX_PROMPT_BLOCKS];
    uint32_t n_all = dc->max_blocks + dc->t2_blocks + dc->t3_blocks; /* ids of every tier */
    long counts[8] = {0};
    long insert_rc[32] = {0}, evicted = 0, max_cached = 0, pinned_lookups = 0, pins_refused = 0;
    uint64_t clock_now = 1; /* the clock of hint ends */
    for (long step = 0; step < dc->ops; step++) {
        uint32_t ns = rnd(3);
        if (rnd(50) == 0)
            ns = 3 + rnd(2); /* unknown namespace now and then */
        size_t nb = rnd(MAX_PROMPT_BLOCKS + 1);
        size_t n_tokens = nb * dc->bt + (rnd(3) == 0 ? rnd(dc->bt) : 0);
        for (size_t k = 0; k < n_tokens; k++)
            tok[k] = dc->sparse && rnd(24) != 0 ? 0 : rnd(dc->vocab);
        uint32_t op = rnd(100);
        radix_diff_op_t o = {.ns = ns, .tokens = tok, .n_tokens = n_tokens};
        int rc;
        if (dc->t2_blocks > 0 && rnd(3) == 0) {
            /* the tiers: demote, promote a pinned lookup's tier-2 blocks,
             * end a copy (now and then of any id: errors) */
            uint32_t kind = rnd(3);
            if (kind == 0) {
                o.kind = RADIX_DIFF_DEMOTE;
                o.for_ns = rnd(4) == 0 ? RADIX_NS_ANY : ns;
                o.n = rnd(8);
            } else if (kind == 1 && radix_diff_can_pin(d, MAX_PROMPT_BLOCKS + 1)) {
                o.kind = RADIX_DIFF_PROMOTE;
                o.max_ids = MAX_PROMPT_BLOCKS;
                for (size_t k = 0; k < MAX_PROMPT_BLOCKS; k++) {
                    uint32_t id = rnd(dc->max_blocks);
                    for (int tries = 0; tries < 16 && d->m.blocks[id].cached; tries++)
                        id = rnd(dc->max_blocks);
                    ids[k] = id;
                }
                o.ids = ids;
                o.n_ids = MAX_PROMPT_BLOCKS;
            } else {
                o.kind = RADIX_DIFF_COPY_DONE;
                o.from_copying = rnd(20) != 0;
                o.copy_index = rnd(1u << 16);
                o.id = rnd(n_all + 1);
            }
            DIFF_OK(d, radix_diff_step(d, &o, &rc));
            counts[7]++;
        } else if (op < 35) {
            o.kind = RADIX_DIFF_LOOKUP;
            o.pin = rnd(4) == 0 && radix_diff_can_pin(d, MAX_PROMPT_BLOCKS + 1);
            o.max_ids = rnd(5) == 0 ? rnd(MAX_PROMPT_BLOCKS) : MAX_PROMPT_BLOCKS;
            size_t held_before = d->n_held;
            DIFF_OK(d, radix_diff_step(d, &o, &rc));
            pinned_lookups += d->n_held > held_before;
            counts[0]++;
        } else if (op < 65) {
            /* insert: mostly free ids, sometimes a taken one */
            o.kind = RADIX_DIFF_INSERT;
            o.n_ids = nb > 0 ? (rnd(4) == 0 ? rnd((uint32_t)nb + 1) : nb) : 0;
            /* Make room first, as the daemon does when the pool is full
             * (with a tier 2, by demoting; ids being copied from count). */
            o.make_room =
                radix_cached_blocks(d->t) + d->n_vacated + o.n_ids > dc->max_blocks && rnd(4) != 0;
            o.room_ns = ns;
            for (size_t k = 0; k < o.n_ids; k++) {
                uint32_t id = rnd(dc->max_blocks);
                for (int tries = 0; tries < 8 && d->m.blocks[id].cached && rnd(20) != 0; tries++)
                    id = rnd(dc->max_blocks);
                ids[k] = id;
            }
            if (rnd(100) == 0 && o.n_ids > 0)
                ids[rnd((uint32_t)o.n_ids)] = dc->max_blocks; /* out of range */
            o.ids = ids;
            o.pin = rnd(4) == 0 && radix_diff_can_pin(d, MAX_PROMPT_BLOCKS + 1);
            DIFF_OK(d, radix_diff_step(d, &o, &rc));
            insert_rc[-rc]++;
            counts[1]++;
        } else if (op < 72) {
            /* pin: a held block again, or any id of either tier */
            o.kind = RADIX_DIFF_PIN;
            o.id = d->n_held && rnd(2) ? d->held[rnd((uint32_t)d->n_held)] : rnd(n_all + 1);
            DIFF_OK(d, radix_diff_step(d, &o, &rc));
            pins_refused += rc == KVS_EBUSY;
            counts[2]++;
        } else if (op < 90) {
            /* unpin: mostly held pins, sometimes any id (errors) */
            o.kind = RADIX_DIFF_UNPIN;
            for (uint32_t rep = 1 + rnd(8); rep > 0; rep--) {
                o.from_held = d->n_held > 0 && rnd(8) != 0;
                if (o.from_held)
                    o.held_index = rnd((uint32_t)d->n_held);
                else
                    o.id = rnd(n_all + 1);
                DIFF_OK(d, radix_diff_apply(d, &o, &rc));
            }
            DIFF_OK(d, radix_diff_compare(d));
            counts[3]++;
        } else if (op < 94) {
            /* retention hints: a hint on a held or any block, the clock
             * moving on, now and then a namespace's default and cap */
            uint32_t kind = rnd(10);
            clock_now += rnd(8);
            if (kind < 7) {
                o.kind = RADIX_DIFF_HINT;
                o.from_held = d->n_held > 0 && rnd(2);
                if (o.from_held)
                    o.held_index = rnd((uint32_t)d->n_held);
                else
                    o.id = rnd(n_all + 1);
                o.prio = rnd(30) == 0 ? RADIX_PRIO_MAX + 1 : rnd(RADIX_PRIO_MAX + 1);
                o.until = rnd(2) ? 0 : clock_now + 1 + rnd(40);
            } else if (kind < 9) {
                o.kind = RADIX_DIFF_EXPIRE;
                o.now = clock_now;
            } else {
                o.kind = RADIX_DIFF_SET_PRIORITY;
                o.prio = rnd(RADIX_PRIO_MAX + 1);
                o.prio_cap = rnd(RADIX_PRIO_MAX + 1);
            }
            DIFF_OK(d, radix_diff_step(d, &o, &rc));
            counts[6]++;
        } else if (op < 99) {
            o.kind = RADIX_DIFF_EVICT;
            o.for_ns = rnd(4) == 0 ? RADIX_NS_ANY : ns;
            o.n = rnd(6);
            DIFF_OK(d, radix_diff_step(d, &o, &rc));
            counts[4]++;
        } else {
            /* "quota" keeps a small quota, so it often runs into it */
            o.kind = RADIX_DIFF_SET_LIMITS;
            o.quota = ns == 1 ? 4 + rnd(20) : (rnd(3) ? 0 : 8 + rnd(24));
            o.reserve = rnd(3) ? 0 : rnd(16);
            DIFF_OK(d, radix_diff_step(d, &o, &rc));
            counts[5]++;
        }
        /* tier 1 in use: cached, and being copied from */
        if ((long)(radix_cached_blocks(d->t) + d->n_vacated) > max_cached)
            max_cached = radix_cached_blocks(d->t) + d->n_vacated;
    }
    uint64_t taken_back = d->m.taken_back;
    evicted = (long)d->evicted_total;
    long demoted = 0, promoted = 0, t2_dropped = 0, copies_done = (long)d->copies_done;
    long demoted3 = 0, t3_dropped = 0, t3_hits = 0;
    for (uint32_t k = 0; k < 3; k++) {
        demoted += (long)d->m.ns[k].demoted;
        promoted += (long)d->m.ns[k].promoted;
        t2_dropped += (long)d->m.ns[k].t2_dropped;
        demoted3 += (long)d->m.ns[k].demoted3;
        t3_dropped += (long)d->m.ns[k].t3_dropped;
        t3_hits += (long)d->m.ns[k].t3_hit_tokens;
    }
    /* Release everything: the tree must then empty out completely (with a
     * tier 2, once every copy is done, tier 1 is demoted and tier 2 cleared). */
    DIFF_OK(d, radix_diff_finish(d));
    if (getenv("KVS_TEST_VERBOSE") && dc->t3_blocks)
        fprintf(stderr, "tier 3 %u: demoted there %ld, dropped there %ld, hit tokens there %ld\n",
                dc->t3_blocks, demoted3, t3_dropped, t3_hits);
    if (getenv("KVS_TEST_VERBOSE"))
        fprintf(stderr,
                "ops %ld: inserted ok %ld eexist %ld equota %ld ebusy %ld, evicted %ld (taken "
                "back below a reservation %llu), max cached %ld; tier 2 %u: demoted %ld, "
                "promoted %ld, copies done %ld, tier-2 drops %ld\n",
                dc->ops, insert_rc[0], insert_rc[-KVS_EEXIST], insert_rc[-KVS_EQUOTA],
                insert_rc[-KVS_EBUSY], evicted, (unsigned long long)taken_back, max_cached,
                dc->t2_blocks, demoted, promoted, copies_done, t2_dropped);
    if (dc->t2_blocks > 0) {
        /* The tier steps ran and reached their outcomes. */
        ck_assert_int_gt(counts[7], dc->ops / 10);
        ck_assert_int_gt(demoted, dc->ops / 200);
        ck_assert_int_gt(promoted, dc->ops / 2000);
        ck_assert_int_gt(copies_done, dc->ops / 200);
        /* with a tier 3, tier 2 moves its blocks down instead of dropping them */
        ck_assert_int_gt(dc->t3_blocks ? t3_dropped : t2_dropped, dc->ops / 1000);
        ck_assert_int_gt(insert_rc[-KVS_EBUSY], 10);
    }
    if (dc->t3_blocks > 0) {
        ck_assert_int_gt(demoted3, dc->ops / 1000);
        ck_assert_int_gt(t3_hits, 0);
    }
    /* Every kind of operation ran many times. */
    for (int k = 0; k < 7; k++)
        ck_assert_int_gt(counts[k], dc->ops / 200);
    /* ... and reached the interesting outcomes. */
    ck_assert_int_gt(insert_rc[0], dc->ops / 100);
    ck_assert_int_gt(insert_rc[-KVS_EEXIST], 10);
    ck_assert_int_gt(insert_rc[-KVS_EQUOTA], dc->ops / 20000);
    ck_assert_int_gt(insert_rc[-KVS_EINVAL], 10);
    ck_assert_int_gt(insert_rc[-KVS_ENONS], 10);
    /* (a tier 2 takes what tier 1 would drop: the larger, the fewer drops) */
    ck_assert_int_gt(evicted, dc->ops / (dc->t2_blocks > 0 ? 100 : 20));
    ck_assert_int_gt(max_cached, dc->max_blocks / 2);
    ck_assert_int_gt(pinned_lookups, 10);
#ifdef RADIX_MAX_PINS
    /* The build with a low pin bound reaches it on every pinning path. */
    ck_assert_int_gt(pins_refused, 0);
    if (dc->ops >= 30000) /* the short (valgrind) runs may not get there */
        ck_assert_int_gt(insert_rc[-KVS_EBUSY], 0);
#endif
    /* A namespace below its reservation took blocks back from others. */
    ck_assert_int_gt((long)taken_back, dc->ops / 1000);
    free(d);
}

static long diff_ops(long full, long small)
{
    const char *s = getenv("KVS_TEST_SMALL");
    return s && *s && strcmp(s, "0") != 0 ? small : full;
}

/* Tier 2 smaller, equal and larger than tier 1: demotions, promotions,
 * tier-2 drops and copies in flight, invariants after every step. */
static void diff_tiers(uint32_t t2_blocks, uint64_t seed)
{
    diff_cfg_t dc = {.seed = seed,
                     .ops = diff_ops(60000, 20000),
                     .bt = 2,
                     .vocab = 3,
                     .max_blocks = 48,
                     .t2_blocks = t2_blocks};
    diff_run(&dc);
}

START_TEST(test_diff_tier2_smaller)
{
    diff_tiers(16, 0x5EED0001);
}
END_TEST

/* Three tiers: tier 2 makes room by moving blocks to tier 3, which drops
 * its own leaves; promotions come back from either. */
static void diff_tiers3(uint32_t t2_blocks, uint32_t t3_blocks, uint64_t seed)
{
    diff_cfg_t dc = {.seed = seed,
                     .ops = diff_ops(60000, 20000),
                     .bt = 2,
                     .vocab = 3,
                     .max_blocks = 48,
                     .t2_blocks = t2_blocks,
                     .t3_blocks = t3_blocks};
    diff_run(&dc);
}

START_TEST(test_diff_tier3_small)
{
    diff_tiers3(16, 32, 0x5EED0031);
}
END_TEST

START_TEST(test_diff_tier3_large)
{
    diff_tiers3(48, 144, 0x5EED0032);
}
END_TEST

START_TEST(test_diff_tier2_equal)
{
    diff_tiers(48, 0x5EED0002);
}
END_TEST

START_TEST(test_diff_tier2_larger)
{
    diff_tiers(200, 0x5EED0003);
}
END_TEST

START_TEST(test_diff_xxh3)
{
    diff_cfg_t dc = {.seed = 0x9E3779B97F4A7C15ull,
                     .ops = diff_ops(100000, 40000),
                     .bt = 2,
                     .vocab = 3,
                     .max_blocks = 96,
                     .hash = NULL};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_collisions)
{
    diff_cfg_t dc = {.seed = 12345,
                     .ops = diff_ops(30000, 10000),
                     .bt = 3,
                     .vocab = 2,
                     .max_blocks = 64,
                     .hash = hash_weak};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_16_token_blocks)
{
    /* The production block size, which has its own comparison code. */
    diff_cfg_t dc = {.seed = 4242,
                     .ops = diff_ops(30000, 10000),
                     .bt = 16,
                     .vocab = 2,
                     .max_blocks = 64,
                     .hash = NULL,
                     .sparse = true};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_one_token_blocks)
{
    diff_cfg_t dc = {.seed = 777,
                     .ops = diff_ops(30000, 10000),
                     .bt = 1,
                     .vocab = 4,
                     .max_blocks = 48,
                     .hash = NULL};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_freq_fixed_bonus)
{
    /* Frequency policy with a fixed bonus of a few ticks per hit: eviction
     * order then often differs from LRU, and ties on the key are common. */
    diff_cfg_t dc = {.seed = 0xF00D,
                     .ops = diff_ops(60000, 10000),
                     .bt = 2,
                     .vocab = 3,
                     .max_blocks = 96,
                     .policy = RADIX_EVICT_FREQ,
                     .max_hits = 3,
                     .bonus_ticks = 7};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_freq_no_horizon)
{
    /* The bonus follows the eviction age, with no horizon (25 %, the
     * earlier default). */
    diff_cfg_t dc = {.seed = 4242,
                     .ops = diff_ops(60000, 10000),
                     .bt = 16,
                     .vocab = 2,
                     .max_blocks = 64,
                     .sparse = true,
                     .policy = RADIX_EVICT_FREQ,
                     .bonus_pct = 25,
                     .horizon_pct = RADIX_FREQ_NO_HORIZON};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_freq_horizon_short)
{
    /* A horizon of 50 % of the reuse gap: the bonus is 0 most of the time
     * and 300 % of the eviction age the rest. */
    diff_cfg_t dc = {.seed = 777,
                     .ops = diff_ops(60000, 10000),
                     .bt = 2,
                     .vocab = 3,
                     .max_blocks = 96,
                     .policy = RADIX_EVICT_FREQ,
                     .bonus_pct = 300,
                     .horizon_pct = 50};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_freq_adaptive)
{
    /* The default parameters: the bonus follows the eviction age while
     * that age is below 2.75 mean reuse gaps. */
    diff_cfg_t dc = {.seed = 31337,
                     .ops = diff_ops(60000, 10000),
                     .bt = 16,
                     .vocab = 2,
                     .max_blocks = 64,
                     .sparse = true,
                     .policy = RADIX_EVICT_FREQ};
    diff_run(&dc);
}
END_TEST

START_TEST(test_diff_freq_collisions)
{
    diff_cfg_t dc = {.seed = 99,
                     .ops = diff_ops(30000, 10000),
                     .bt = 3,
                     .vocab = 2,
                     .max_blocks = 64,
                     .hash = hash_weak,
                     .policy = RADIX_EVICT_FREQ,
                     .max_hits = 8,
                     .bonus_pct = 200};
    diff_run(&dc);
}
END_TEST

/* ---- allocation failures ---------------------------------------------------------------- */

typedef struct fail_plan {
    long countdown; /* fail the allocation when it reaches 0; < 0: never */
    long failures;
} fail_plan_t;

static bool fail_next(void *ctx)
{
    fail_plan_t *f = ctx;
    if (f->countdown < 0)
        return false;
    if (f->countdown-- == 0) {
        f->failures++;
        return true;
    }
    return false;
}

START_TEST(test_alloc_failures)
{
    /* Make the k-th allocation of an operation fail, for random k, across
     * inserts that create, split, extend and grow nodes, grow the child table
     * and the eviction queues, and namespace creation and radix_top. After
     * each failure the tree must be consistent and the same operation must
     * then succeed. */
    fail_plan_t plan = {-1, 0};
    radix_config_t cfg = {.block_tokens = 2,
                          .max_blocks = 400,
                          .on_evict = record_evict,
                          .evict_ctx = &ev,
                          .fail_alloc = fail_next,
                          .fail_ctx = &plan};
    radix_tree_t *t = NULL;
    memset(&ev, 0, sizeof(ev));
    plan.countdown = 0;
    ck_assert_int_eq(radix_new(&cfg, &t), KVS_ENOMEM);
    ck_assert_ptr_null(t);
    plan.countdown = -1;
    ck_assert_int_eq(radix_new(&cfg, &t), 0);
    uint32_t ns[4], n_ns = 0;
    rng_state = 99;
    long enomem = 0;
    for (int step = 0; step < 6000; step++) {
        uint32_t tok[24], ids[12], canon[12];
        size_t nb = 1 + rnd(12), done, got;
        for (size_t k = 0; k < nb * 2; k++)
            tok[k] = rnd(3);
        for (size_t k = 0; k < nb; k++)
            ids[k] = rnd(400);
        uint32_t op = rnd(10);
        plan.countdown = rnd(4);
        if (op == 0 && n_ns < 4) {
            char name[8] = {'n', 's', (char)('0' + n_ns), 0};
            int rc = radix_ns_create(t, name, n_ns, 0, 0, &ns[n_ns]);
            ck_assert(rc == 0 || rc == KVS_ENOMEM);
            if (rc == KVS_ENOMEM) {
                enomem++;
                ck_assert_uint_eq(radix_ns_count(t), n_ns);
                plan.countdown = -1;
                ck_assert_int_eq(radix_ns_create(t, name, n_ns, 0, 0, &ns[n_ns]), 0);
            }
            n_ns++;
        } else if (op == 1 && n_ns > 0) {
            radix_prefix_t rows[4];
            int rc = radix_top(t, RADIX_NS_ALL, RADIX_BY_SIZE, rows, 4, &got);
            ck_assert(rc == 0 || rc == KVS_ENOMEM);
        } else if (op < 8 && n_ns > 0) {
            uint32_t which = ns[rnd(n_ns)];
            int rc = radix_insert(t, which, tok, nb * 2, ids, nb, false, canon, &done);
            ck_assert(rc == 0 || rc == KVS_ENOMEM || rc == KVS_EEXIST);
            if (rc == KVS_ENOMEM) {
                enomem++;
                plan.countdown = -1;
                ck_assert_int_eq(radix_check(t), 0);
                size_t again;
                rc = radix_insert(t, which, tok, nb * 2, ids, nb, false, canon, &again);
                ck_assert(rc == 0 || rc == KVS_EEXIST);
                ck_assert_uint_ge(again, done);
            }
            if (rc == 0) {
                uint32_t out[12];
                ck_assert_int_eq(radix_lookup(t, which, tok, nb * 2, false, out, 12, &got), 0);
                ck_assert_uint_eq(got, nb);
                ck_assert_int_eq(memcmp(out, canon, nb * sizeof(uint32_t)), 0);
            }
        } else {
            ck_assert_int_eq(radix_evict(t, RADIX_NS_ANY, rnd(40), &got), 0);
        }
        plan.countdown = -1;
        ck_assert_int_eq(radix_check(t), 0);
    }
    ck_assert_int_gt(enomem, 100);
    radix_free(t);
}
END_TEST

/* ---- dropping one prompt ------------------------------------------------- */

/* radix_evict_prompt drops a prompt's blocks from its end backward, and
 * keeps what another prompt continues, what is pinned and what is being
 * copied, with everything before it. */
START_TEST(test_evict_prompt)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0), b = ns_new(t, "b", 0, 0);
    uint32_t p1[4 * BT], p2[3 * BT], p3[6 * BT], other[2 * BT];
    size_t m = 99, n1 = 99, n2 = 99;
    prompt(p1, 4 * BT, 1);
    memcpy(p2, p1, 2 * BT * sizeof(uint32_t)); /* p2 shares p1's first 2 blocks */
    prompt(p2 + 2 * BT, BT, 2);
    memcpy(p3, p1, 4 * BT * sizeof(uint32_t)); /* p3 continues p1 */
    prompt(p3 + 4 * BT, 2 * BT, 3);
    prompt(other, 2 * BT, 4);
    insert_run(t, a, p1, 4, 0, false, 0);  /* ids 0..3 */
    insert_run(t, a, p2, 3, 10, false, 0); /* 0, 1 are p1's; 12 is its own */
    insert_run(t, b, p1, 2, 20, false, 0); /* the same tokens in another namespace */
    insert_run(t, a, other, 2, 30, false, 0);

    ck_assert_int_eq(radix_evict_prompt(NULL, a, p1, 4 * BT, &m, &n1, &n2), KVS_EINVAL);
    ck_assert_int_eq(radix_evict_prompt(t, a, NULL, 4 * BT, &m, &n1, &n2), KVS_EINVAL);
    ck_assert_int_eq(radix_evict_prompt(t, a, p1, 4 * BT, NULL, &n1, &n2), KVS_EINVAL);
    ck_assert_int_eq(radix_evict_prompt(t, 9, p1, 4 * BT, &m, &n1, &n2), KVS_ENONS);
    ck_assert_uint_eq(ev.n, 0);

    /* p1: 3 and 2 go; 1 and 0 are p2's prefix too. */
    ck_assert_int_eq(radix_evict_prompt(t, a, p1, 4 * BT + 1, &m, &n1, &n2), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(m, 4);
    ck_assert_uint_eq(n1, 2);
    ck_assert_uint_eq(n2, 0);
    ck_assert_uint_eq(ev.n, 2);
    ck_assert_uint_eq(ev.ids[0], 3);
    ck_assert_uint_eq(ev.ids[1], 2);
    ck_assert_uint_eq(lookup_n(t, a, p1, 4 * BT, NULL), 2);
    ck_assert_uint_eq(lookup_n(t, a, p2, 3 * BT, NULL), 3);
    ck_assert_uint_eq(lookup_n(t, b, p1, 4 * BT, NULL), 2);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, a, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 5);
    ck_assert_uint_eq(st.evicted_own, 2);
    ck_assert_uint_eq(st.evicted_blocks, 2);

    /* A pinned block stops the drops, and keeps what is before it. */
    ck_assert_int_eq(radix_pin(t, 1), 0);
    ck_assert_int_eq(radix_evict_prompt(t, a, p2, 3 * BT, &m, &n1, &n2), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(m, 3);
    ck_assert_uint_eq(n1, 1); /* 12 */
    ck_assert_uint_eq(ev.ids[2], 12);
    ck_assert_uint_eq(lookup_n(t, a, p1, 4 * BT, NULL), 2);
    ck_assert_int_eq(radix_unpin(t, 1), 0);

    /* A prompt that a longer cached one continues drops nothing. */
    insert_run(t, a, p3, 6, 40, false, 0); /* 0, 1 stay; 42..45 new */
    ck_assert_int_eq(radix_evict_prompt(t, a, p1, 4 * BT, &m, &n1, &n2), 0);
    ck_assert_uint_eq(m, 4);
    ck_assert_uint_eq(n1, 0);
    /* The longer one goes whole, its shared start included, once no one
     * else continues it; other prompts of the namespace stay. */
    ck_assert_int_eq(radix_evict_prompt(t, a, p3, 6 * BT, &m, &n1, &n2), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(m, 6);
    ck_assert_uint_eq(n1, 6);
    ck_assert_uint_eq(lookup_n(t, a, p3, 6 * BT, NULL), 0);
    ck_assert_uint_eq(lookup_n(t, a, other, 2 * BT, NULL), 2);
    ck_assert_uint_eq(lookup_n(t, b, p1, 2 * BT, NULL), 2);
    /* Nothing cached: a miss drops nothing. */
    ck_assert_int_eq(radix_evict_prompt(t, a, p3, 6 * BT, &m, &n1, &n2), 0);
    ck_assert_uint_eq(m + n1 + n2, 0);
    radix_free(t);
}
END_TEST

/* radix_drop_from drops a block and every block after it, down every
 * branch, and nothing before it or beside it; a pinned block below stops
 * it with KVS_EBUSY, keeping that block and its ancestors. */
START_TEST(test_drop_from)
{
    radix_tree_t *t = tree_with(BT, 64, NULL);
    uint32_t a = ns_new(t, "a", 0, 0);
    uint32_t p1[4 * BT], p2[4 * BT], p3[3 * BT], other[2 * BT];
    size_t n = 99;
    prompt(p1, 4 * BT, 1);
    memcpy(p2, p1, 2 * BT * sizeof(uint32_t)); /* p2 branches off p1 after 2 blocks */
    prompt(p2 + 2 * BT, 2 * BT, 2);
    memcpy(p3, p1, BT * sizeof(uint32_t)); /* p3 branches off after 1 */
    prompt(p3 + BT, 2 * BT, 3);
    prompt(other, 2 * BT, 4);
    insert_run(t, a, p1, 4, 0, false, 0);  /* ids 0..3 */
    insert_run(t, a, p2, 4, 10, false, 0); /* 0, 1, then 12, 13 */
    insert_run(t, a, p3, 3, 20, false, 0); /* 0, then 21, 22 */
    insert_run(t, a, other, 2, 30, false, 0);

    ck_assert_int_eq(radix_drop_from(NULL, 1, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_drop_from(t, 1, NULL), KVS_EINVAL);
    ck_assert_int_eq(radix_drop_from(t, 100000, &n), KVS_EINVAL);
    ck_assert_int_eq(radix_drop_from(t, 5, &n), 0); /* not cached */
    ck_assert_uint_eq(n, 0);

    /* A pinned block below stops it: 13 pinned keeps 13, 12, 1, 0. */
    ck_assert_int_eq(radix_pin(t, 13), 0);
    ck_assert_int_eq(radix_drop_from(t, 1, &n), KVS_EBUSY);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(lookup_n(t, a, p2, 4 * BT, NULL), 4);
    size_t after_pin = n;
    ck_assert_int_eq(radix_unpin(t, 13), 0);

    /* Block 1 and everything after it (p1's 2, 3; p2's 12, 13) go; 0 and
     * p3's branch off 0 stay, and the other prompt. */
    ck_assert_int_eq(radix_drop_from(t, 1, &n), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(after_pin + n, 5);
    ck_assert_uint_eq(lookup_n(t, a, p1, 4 * BT, NULL), 1);
    ck_assert_uint_eq(lookup_n(t, a, p2, 4 * BT, NULL), 1);
    ck_assert_uint_eq(lookup_n(t, a, p3, 3 * BT, NULL), 3);
    ck_assert_uint_eq(lookup_n(t, a, other, 2 * BT, NULL), 2);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, a, &st), 0);
    ck_assert_uint_eq(st.cached_blocks, 1 + 2 + 2);
    ck_assert_uint_eq(st.evicted_own, 5);
    /* From the root block: the whole tree of that prefix. */
    ck_assert_int_eq(radix_drop_from(t, 0, &n), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(lookup_n(t, a, p3, 3 * BT, NULL), 0);
    ck_assert_uint_eq(lookup_n(t, a, other, 2 * BT, NULL), 2);
    radix_free(t);
}
END_TEST

/* With a tier 2: a prompt's tier-2 blocks go first (its end), then its
 * tier-1 ones; a block being copied ends the match and keeps the rest. */
START_TEST(test_evict_prompt_tier2)
{
    radix_config_t cfg = {.block_tokens = BT, .max_blocks = 8, .tier2_blocks = 4};
    radix_tree_t *t = tree_cfg(cfg);
    uint32_t ns = ns_new(t, "a", 0, 0), p1[4 * BT], p2[2 * BT], peer;
    size_t m = 99, n1 = 99, n2 = 99, n_mv = 9, n_dr = 9;
    radix_move_t mv[4];
    prompt(p1, 4 * BT, 1);
    prompt(p2, 2 * BT, 2);
    insert_run(t, ns, p1, 4, 0, false, 0);
    demote_copied(t, ns, 2, 8, mv); /* p1's last 2 blocks are in tier 2 */
    ck_assert_uint_eq(radix_tier2_blocks(t), 2);
    ev.n = 0;
    ck_assert_int_eq(radix_evict_prompt(t, ns, p1, 4 * BT, &m, &n1, &n2), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(m, 4);
    ck_assert_uint_eq(n2, 2);
    ck_assert_uint_eq(n1, 2);
    ck_assert_uint_eq(ev.n, 4);
    ck_assert_uint_ge(ev.ids[0], 8); /* tier-2 ids first */
    ck_assert_uint_ge(ev.ids[1], 8);
    ck_assert_uint_lt(ev.ids[2], 8);
    ck_assert_uint_eq(radix_tier2_blocks(t), 0);
    ck_assert_uint_eq(radix_tier2_free(t), 4);
    ck_assert_uint_eq(radix_cached_blocks(t), 0);
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_stats(t, ns, &st), 0);
    ck_assert_uint_eq(st.tier2_dropped, 2);
    ck_assert_uint_eq(st.evicted_own, 4);

    /* A demotion still copying: the match stops before it, nothing goes. */
    insert_run(t, ns, p2, 2, 0, false, 0);
    ck_assert_int_eq(radix_demote(t, ns, 1, mv, &n_mv, &n_dr), 0);
    ck_assert_uint_eq(n_mv, 1);
    ck_assert_int_eq(radix_evict_prompt(t, ns, p2, 2 * BT, &m, &n1, &n2), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(m, 1);
    ck_assert_uint_eq(n1 + n2, 0);
    ck_assert_int_eq(radix_copy_done(t, mv[0].to, &peer), 0);
    ck_assert_int_eq(radix_evict_prompt(t, ns, p2, 2 * BT, &m, &n1, &n2), 0);
    ck_assert_int_eq(radix_check(t), 0);
    ck_assert_uint_eq(m, 2);
    ck_assert_uint_eq(n1, 1);
    ck_assert_uint_eq(n2, 1);
    radix_free(t);
}
END_TEST

static Suite *radix_suite(void)
{
    Suite *s = suite_create("radix");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_new_args);
    tcase_add_test(tc, test_namespaces);
    tcase_add_test(tc, test_namespace_delete);
    tcase_add_test(tc, test_namespace_isolation);
    tcase_add_test(tc, test_ns_clear);
    tcase_add_test(tc, test_ns_clear_in_steps);
    tcase_add_test(tc, test_lookup_edges);
    tcase_add_test(tc, test_lookup_pin);
    tcase_add_test(tc, test_match_read_only);
    tcase_add_test(tc, test_insert_args);
    tcase_add_test(tc, test_insert_after_in_pieces);
    tcase_add_test(tc, test_insert_duplicates);
    tcase_add_test(tc, test_insert_split_and_extend);
    tcase_add_test(tc, test_insert_eexist);
    tcase_add_test(tc, test_pin_unpin);
    tcase_add_test(tc, test_block_hash);
    tcase_add_test(tc, test_evict_lru_order);
    tcase_add_test(tc, test_evict_priority_order);
    tcase_add_test(tc, test_hints_are_bounded);
    tcase_add_test(tc, test_priority_keeps_quota);
    tcase_add_test(tc, test_evict_out_of_order_unpins);
    tcase_add_test(tc, test_evict_all_pinned);
    tcase_add_test(tc, test_evict_freq_order);
    tcase_add_test(tc, test_evict_freq_horizon);
    tcase_add_test(tc, test_quota);
    tcase_add_test(tc, test_quota_keeps_attach_point);
    tcase_add_test(tc, test_reservation);
    tcase_add_test(tc, test_reservation_takes_back);
    tcase_add_test(tc, test_reservation_at_reserve_is_plain_lru);
    tcase_add_test(tc, test_reservation_lends);
    tcase_add_test(tc, test_reservation_pinned_givers);
    tcase_add_test(tc, test_reservation_freq);
    tcase_add_test(tc, test_collisions);
    tcase_add_test(tc, test_fanout_10k);
    tcase_add_test(tc, test_top);
    tcase_add_test(tc, test_tier2_top_drop_uncount);
    tcase_add_test(tc, test_tier2_promotable);
    tcase_add_test(tc, test_tier2_leaving_id);
    tcase_add_test(tc, test_tier2_copy_undo);
    tcase_add_test(tc, test_tier3_chain);
    tcase_add_test(tc, test_memory);
    tcase_add_test(tc, test_alloc_failures);
    tcase_add_test(tc, test_evict_prompt);
    tcase_add_test(tc, test_drop_from);
    tcase_add_test(tc, test_evict_prompt_tier2);
    suite_add_tcase(s, tc);
    TCase *diff = tcase_create("differential");
    tcase_set_timeout(diff, 600);
    tcase_add_test(diff, test_diff_xxh3);
    tcase_add_test(diff, test_diff_tier2_smaller);
    tcase_add_test(diff, test_diff_tier3_small);
    tcase_add_test(diff, test_diff_tier3_large);
    tcase_add_test(diff, test_diff_tier2_equal);
    tcase_add_test(diff, test_diff_tier2_larger);
    tcase_add_test(diff, test_diff_collisions);
    tcase_add_test(diff, test_diff_one_token_blocks);
    tcase_add_test(diff, test_diff_16_token_blocks);
    tcase_add_test(diff, test_diff_freq_fixed_bonus);
    tcase_add_test(diff, test_diff_freq_adaptive);
    tcase_add_test(diff, test_diff_freq_no_horizon);
    tcase_add_test(diff, test_diff_freq_horizon_short);
    tcase_add_test(diff, test_diff_freq_collisions);
    suite_add_tcase(s, diff);
    return s;
}

KVS_CHECK_MAIN(radix_suite)
