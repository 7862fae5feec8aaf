/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reference worker: its KV store in the pool layout, the model's
 * determinism (the property that lets workers share KV blocks), a naive
 * non-paged reference for the attention, the request flow over a cache, and
 * the workloads.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "kvstore.h"
#include "model.h"
#include "worker.h"
#include "workload.h"
#include "test_tmp.h"

/* ---- helpers -------------------------------------------------------------- */

static model_t *small_model(void)
{
    model_config_t cfg;
    model_t *m = NULL;

    model_config_small(&cfg);
    ck_assert_int_eq(model_new(&cfg, &m), 0);
    return m;
}

static kvstore_t *store_for(const model_t *m, uint32_t blocks)
{
    geometry_t g;
    kvstore_t *ks = NULL;

    model_config_geometry(&m->cfg, &g);
    ck_assert_int_eq(kvstore_new_private(&g, blocks, &ks), 0);
    return ks;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t *random_tokens(uint32_t n, uint32_t vocab, uint64_t seed)
{
    uint32_t *t = malloc(sizeof(*t) * n);

    ck_assert_ptr_nonnull(t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = (uint32_t)(rng_next(&seed) % vocab);
    return t;
}

/* Block ids 0..n-1 in a seeded random order. */
static void shuffled_ids(uint32_t *ids, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        ids[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rng_next(&seed) % (i + 1));
        uint32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
}

/* Prefill of prompt[0..n) in one call into blocks table[]; returns logits. */
static float *prefill(const model_t *m, const kvstore_t *ks, const uint32_t *table,
                      uint32_t table_len, const uint32_t *prompt, uint32_t n)
{
    float *logits = malloc(sizeof(float) * m->cfg.vocab);

    ck_assert_ptr_nonnull(logits);
    ck_assert_int_eq(model_forward(m, ks, table, table_len, prompt, 0, n, logits), 0);
    return logits;
}

/* Every K and V float of positions [0, n) of two sequences is bitwise equal. */
static void assert_same_kv(const kvstore_t *a, const uint32_t *ta, const kvstore_t *b,
                           const uint32_t *tb, uint32_t n)
{
    uint32_t bt = a->geom.block_tokens;

    for (uint32_t l = 0; l < a->geom.layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t p = 0; p < n; p++)
                ck_assert_int_eq(memcmp(kvstore_token(a, l, kv, ta[p / bt], p % bt),
                                        kvstore_token(b, l, kv, tb[p / bt], p % bt),
                                        a->token_floats * sizeof(float)),
                                 0);
}

/* ---- kvstore ---------------------------------------------------------------- */

START_TEST(test_kvstore_layout)
{
    geometry_t g = {
        .layers = 3, .kv_heads = 2, .head_dim = 8, .dtype = GEOMETRY_FP32, .block_tokens = 16};
    kvstore_t *ks = NULL;
    uint64_t slot = 16 * 2 * 8 * 4;

    ck_assert_uint_eq(kvstore_slot_bytes(&g), slot);
    ck_assert_uint_eq(kvstore_region_bytes(&g, 5), slot * 2 * 3 * 5);
    ck_assert_int_eq(kvstore_new_private(&g, 5, &ks), 0);
    /* [layer][k|v][block][token][kv_head][head_dim] */
    ck_assert_uint_eq(kvstore_offset(ks, 0, 0, 0), 0);
    ck_assert_uint_eq(kvstore_offset(ks, 0, 0, 1), slot);
    ck_assert_uint_eq(kvstore_offset(ks, 0, 1, 0), 5 * slot);
    ck_assert_uint_eq(kvstore_offset(ks, 2, 1, 4), ((2 * 2 + 1) * 5 + 4) * slot);
    ck_assert_ptr_eq(kvstore_token(ks, 1, 0, 3, 7),
                     (float *)(ks->base + ((1 * 2 + 0) * 5 + 3) * slot) + 7 * 2 * 8);
    /* The last float of the region is the last of (last layer, V, last block). */
    ck_assert_ptr_eq(kvstore_token(ks, 2, 1, 4, 15) + 15,
                     (float *)(ks->base + kvstore_region_bytes(&g, 5)) - 1);
    kvstore_free(ks);
}
END_TEST

START_TEST(test_kvstore_rejects_bad_geometry)
{
    geometry_t g = {
        .layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = GEOMETRY_BF16, .block_tokens = 16};
    kvstore_t *ks = NULL;
    float region[64];

    ck_assert_int_eq(kvstore_new_private(&g, 4, &ks), KVS_EINVAL);
    g.dtype = GEOMETRY_FP32;
    ck_assert_int_eq(kvstore_new_private(&g, 0, &ks), KVS_EINVAL);
    g.head_dim = 0;
    ck_assert_int_eq(kvstore_new_private(&g, 4, &ks), KVS_EINVAL);
    g.head_dim = 8;
    ck_assert_int_eq(kvstore_wrap(NULL, &g, 4, &ks), KVS_EINVAL);
    ck_assert_int_eq(kvstore_new_private(NULL, 4, &ks), KVS_EINVAL);
    ck_assert_ptr_null(ks);
    ck_assert_int_eq(kvstore_wrap(region, &g, 1, NULL), KVS_EINVAL);
    kvstore_free(NULL);
}
END_TEST

START_TEST(test_kvstore_alloc_release)
{
    geometry_t g = {
        .layers = 1, .kv_heads = 1, .head_dim = 4, .dtype = GEOMETRY_FP32, .block_tokens = 16};
    kvstore_t *ks = NULL;
    uint32_t ids[4], more[2], bad = 4;

    ck_assert_int_eq(kvstore_new_private(&g, 4, &ks), 0);
    ck_assert_uint_eq(kvstore_free_blocks(ks), 4);
    ck_assert_int_eq(kvstore_alloc(ks, 3, ids), 0);
    ck_assert_uint_eq(kvstore_free_blocks(ks), 1);
    /* All or nothing. */
    ck_assert_int_eq(kvstore_alloc(ks, 2, more), KVS_EPOOLFULL);
    ck_assert_uint_eq(kvstore_free_blocks(ks), 1);
    ck_assert_int_eq(kvstore_alloc(ks, 1, ids + 3), 0);
    for (uint32_t i = 0; i < 4; i++)
        for (uint32_t j = i + 1; j < 4; j++)
            ck_assert_uint_ne(ids[i], ids[j]);
    ck_assert_int_eq(kvstore_release(ks, 1, &bad), KVS_EINVAL);
    ck_assert_int_eq(kvstore_release(ks, 4, ids), 0);
    ck_assert_uint_eq(kvstore_free_blocks(ks), 4);
    /* More blocks than are out: a double release. */
    ck_assert_int_eq(kvstore_release(ks, 1, ids), KVS_EINVAL);
    ck_assert_int_eq(kvstore_alloc(ks, 0, NULL), 0);
    kvstore_free(ks);
}
END_TEST

START_TEST(test_kvstore_wrap_borrows)
{
    geometry_t g = {
        .layers = 2, .kv_heads = 1, .head_dim = 4, .dtype = GEOMETRY_FP32, .block_tokens = 16};
    float *region = calloc(1, kvstore_region_bytes(&g, 3));
    kvstore_t *ks = NULL;
    uint32_t id = 0;

    ck_assert_ptr_nonnull(region);
    ck_assert_int_eq(kvstore_wrap(region, &g, 3, &ks), 0);
    ck_assert_ptr_eq(ks->base, (uint8_t *)region);
    ck_assert_int_eq(kvstore_alloc(ks, 1, &id), KVS_ENOTSUP);
    ck_assert_int_eq(kvstore_release(ks, 1, &id), KVS_ENOTSUP);
    ck_assert_uint_eq(kvstore_free_blocks(ks), 0);
    kvstore_token(ks, 1, 1, 2, 15)[3] = 1.5f;
    kvstore_free(ks); /* must not free the region */
    ck_assert(region[kvstore_region_bytes(&g, 3) / sizeof(float) - 1] == 1.5f);
    free(region);
}
END_TEST

/* ---- model ------------------------------------------------------------------ */

START_TEST(test_model_config)
{
    model_config_t c;
    geometry_t g;

    ck_assert_int_eq(model_config_preset("default", &c), 0);
    ck_assert_uint_eq(c.layers, 4);
    ck_assert_uint_eq(c.d_model, 512);
    ck_assert_uint_eq(c.heads, 8);
    ck_assert_uint_eq(c.kv_heads, 2);
    ck_assert_uint_eq(c.head_dim, 64);
    ck_assert_uint_eq(c.vocab, 4096);
    ck_assert_int_eq(model_config_validate(&c), 0);
    model_config_geometry(&c, &g);
    ck_assert_int_eq(g.dtype, GEOMETRY_FP32);
    ck_assert_uint_eq(g.block_tokens, 16);
    ck_assert_uint_eq(kvstore_slot_bytes(&g), 16 * 2 * 64 * 4);
    ck_assert_int_eq(model_config_preset("small", &c), 0);
    ck_assert_int_eq(model_config_validate(&c), 0);
    ck_assert_int_eq(model_config_preset("huge", &c), KVS_ENOTFOUND);
    c.heads = 3; /* not a multiple of kv_heads */
    ck_assert_int_eq(model_config_validate(&c), KVS_EINVAL);
    model_config_small(&c);
    c.head_dim = 12;
    ck_assert_int_eq(model_config_validate(&c), KVS_EINVAL);
    model_config_small(&c);
    c.hidden = 100; /* not a multiple of the panel width */
    ck_assert_int_eq(model_config_validate(&c), KVS_EINVAL);
    model_t *m = NULL;
    ck_assert_int_eq(model_new(&c, &m), KVS_EINVAL);
    ck_assert_ptr_null(m);
    model_free(NULL);
}
END_TEST

START_TEST(test_model_weights_from_seed)
{
    model_config_t c;
    model_t *a = NULL, *b = NULL, *d = NULL;
    uint64_t n;

    model_config_small(&c);
    ck_assert_int_eq(model_new(&c, &a), 0);
    ck_assert_int_eq(model_new(&c, &b), 0);
    c.seed++;
    ck_assert_int_eq(model_new(&c, &d), 0);
    n = (uint64_t)c.vocab * c.d_model;
    ck_assert_int_eq(memcmp(a->embed, b->embed, n * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(a->layer[1].w_down, b->layer[1].w_down,
                            (uint64_t)c.hidden * c.d_model * sizeof(float)),
                     0);
    ck_assert_int_ne(memcmp(a->embed, d->embed, n * sizeof(float)), 0);
    model_free(a);
    model_free(b);
    model_free(d);
}
END_TEST

START_TEST(test_forward_rejects_bad_args)
{
    model_t *m = small_model();
    kvstore_t *ks = store_for(m, 4);
    geometry_t g;
    kvstore_t *other = NULL;
    uint32_t table[4] = {0, 1, 2, 3}, tok[2] = {1, 2}, bad_tok = 256, bad_table[1] = {4};
    float logits[256];

    ck_assert_int_eq(model_forward(NULL, ks, table, 4, tok, 0, 2, logits), KVS_EINVAL);
    ck_assert_int_eq(model_forward(m, ks, table, 4, tok, 0, 0, logits), KVS_EINVAL);
    ck_assert_int_eq(model_forward(m, ks, table, 4, &bad_tok, 0, 1, logits), KVS_EINVAL);
    ck_assert_int_eq(model_forward(m, ks, bad_table, 1, tok, 0, 2, logits), KVS_EINVAL);
    /* 64 positions in 4 blocks: position 64 has no block. */
    ck_assert_int_eq(model_forward(m, ks, table, 4, tok, 63, 2, logits), KVS_EINVAL);
    ck_assert_int_eq(model_forward(m, ks, table, 4, tok, 62, 2, NULL), 0);
    model_config_geometry(&m->cfg, &g);
    g.kv_heads = 1;
    ck_assert_int_eq(kvstore_new_private(&g, 4, &other), 0);
    ck_assert_int_eq(model_forward(m, other, table, 4, tok, 0, 2, logits), KVS_EINVAL);
    kvstore_free(other);
    kvstore_free(ks);
    model_free(m);
}
END_TEST

/* Same model, same prompt, fresh stores: bitwise-equal logits and KV. */
START_TEST(test_forward_deterministic)
{
    model_t *m1 = small_model(), *m2 = small_model();
    uint32_t n = 100, blocks = 7, table[7];
    kvstore_t *a = store_for(m1, blocks), *b = store_for(m2, blocks);
    uint32_t *prompt = random_tokens(n, m1->cfg.vocab, 1);
    float *la, *lb;

    for (uint32_t i = 0; i < blocks; i++)
        table[i] = i;
    la = prefill(m1, a, table, blocks, prompt, n);
    lb = prefill(m2, b, table, blocks, prompt, n);
    ck_assert_int_eq(memcmp(la, lb, sizeof(float) * m1->cfg.vocab), 0);
    assert_same_kv(a, table, b, table, n);
    /* A different prompt gives different logits: the test can fail. */
    prompt[n - 1] = (prompt[n - 1] + 1) % m1->cfg.vocab;
    free(lb);
    lb = prefill(m2, b, table, blocks, prompt, n);
    ck_assert_int_ne(memcmp(la, lb, sizeof(float) * m1->cfg.vocab), 0);
    free(la);
    free(lb);
    free(prompt);
    kvstore_free(a);
    kvstore_free(b);
    model_free(m1);
    model_free(m2);
}
END_TEST

/* The same sequence in other blocks of a larger store, in scrambled order,
 * computes the same bits: attention never depends on block ids. */
START_TEST(test_forward_block_ids_do_not_matter)
{
    model_t *m = small_model();
    uint32_t n = 150, blocks = 10, pool = 37, linear[10], scrambled[37];
    kvstore_t *a = store_for(m, blocks), *b = store_for(m, pool);
    uint32_t *prompt = random_tokens(n, m->cfg.vocab, 2);
    float *la, *lb;

    for (uint32_t i = 0; i < blocks; i++)
        linear[i] = i;
    shuffled_ids(scrambled, pool, 99);
    la = prefill(m, a, linear, blocks, prompt, n);
    lb = prefill(m, b, scrambled, blocks, prompt, n);
    ck_assert_int_eq(memcmp(la, lb, sizeof(float) * m->cfg.vocab), 0);
    assert_same_kv(a, linear, b, scrambled, n);
    free(la);
    free(lb);
    free(prompt);
    kvstore_free(a);
    kvstore_free(b);
    model_free(m);
}
END_TEST

/* One call, token by token, or in uneven pieces: the same bits. */
/* A tensor-parallel group of tp ranks (model_forward_tp), each rank's KV
 * heads in its own store: the logits are bitwise the one-rank pass's, and
 * each rank's shard is exactly its heads' slice of the one-rank KV, for a
 * prefill and for a decode step resumed on the shards. */
static void check_tp_matches_one_rank(uint32_t tp)
{
    model_config_t cfg;
    model_t *m = NULL;
    geometry_t g;
    kvstore_t *one, *shard[4];
    const uint32_t n = 45, blocks = 4;
    uint32_t table[4], *prompt, tok;
    float *want, *got;

    model_config_small_tp(&cfg);
    ck_assert_int_eq(model_new(&cfg, &m), 0);
    one = store_for(m, 8);
    model_config_geometry(&cfg, &g);
    g.kv_heads = cfg.kv_heads / tp;
    for (uint32_t r = 0; r < tp; r++)
        ck_assert_int_eq(kvstore_new_private(&g, 8, &shard[r]), 0);
    shuffled_ids(table, blocks, 3);
    prompt = random_tokens(n, cfg.vocab, 11);
    want = prefill(m, one, table, blocks, prompt, n);
    got = malloc(sizeof(float) * cfg.vocab);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(
        model_forward_tp(m, (const kvstore_t *const *)shard, tp, table, blocks, prompt, 0, n, got),
        0);
    ck_assert_mem_eq(got, want, sizeof(float) * cfg.vocab);
    tok = model_argmax(want, cfg.vocab);
    ck_assert_int_eq(model_forward(m, one, table, blocks, &tok, n, 1, want), 0);
    ck_assert_int_eq(
        model_forward_tp(m, (const kvstore_t *const *)shard, tp, table, blocks, &tok, n, 1, got),
        0);
    ck_assert_mem_eq(got, want, sizeof(float) * cfg.vocab);
    for (uint32_t l = 0; l < cfg.layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t p = 0; p <= n; p++)
                for (uint32_t r = 0; r < tp; r++)
                    ck_assert_mem_eq(kvstore_token(shard[r], l, kv, table[p / 16], p % 16),
                                     kvstore_token(one, l, kv, table[p / 16], p % 16) +
                                         (uint64_t)r * shard[r]->token_floats,
                                     shard[r]->token_floats * sizeof(float));
    /* A tp that does not divide the KV heads, or a store of other heads. */
    ck_assert_int_eq(
        model_forward_tp(m, (const kvstore_t *const *)shard, 3, table, blocks, prompt, 0, n, got),
        KVS_EINVAL);
    ck_assert_int_eq(
        model_forward_tp(m, (const kvstore_t *const *)&one, tp, table, blocks, prompt, 0, n, got),
        KVS_EINVAL);
    for (uint32_t r = 0; r < tp; r++)
        kvstore_free(shard[r]);
    kvstore_free(one);
    free(prompt);
    free(want);
    free(got);
    model_free(m);
}

START_TEST(test_forward_tp_matches_one_rank)
{
    check_tp_matches_one_rank(2);
    check_tp_matches_one_rank(4);
}
END_TEST

START_TEST(test_forward_batching_does_not_matter)
{
    model_t *m = small_model();
    uint32_t n = 150, blocks = 10, table[10];
    kvstore_t *a = store_for(m, blocks), *b = store_for(m, blocks), *c = store_for(m, blocks);
    uint32_t *prompt = random_tokens(n, m->cfg.vocab, 3);
    float *la, *lb = malloc(sizeof(float) * 256), *lc = malloc(sizeof(float) * 256);
    uint32_t pieces[] = {1, 2, 61, 64, 3, 19}; /* sums to 150 */
    uint32_t at = 0;

    for (uint32_t i = 0; i < blocks; i++)
        table[i] = i;
    la = prefill(m, a, table, blocks, prompt, n);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_int_eq(model_forward(m, b, table, blocks, prompt + i, i, 1, lb), 0);
    for (uint32_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        ck_assert_int_eq(model_forward(m, c, table, blocks, prompt + at, at, pieces[i], lc), 0);
        at += pieces[i];
    }
    ck_assert_uint_eq(at, n);
    ck_assert_int_eq(memcmp(la, lb, sizeof(float) * m->cfg.vocab), 0);
    ck_assert_int_eq(memcmp(la, lc, sizeof(float) * m->cfg.vocab), 0);
    assert_same_kv(a, table, b, table, n);
    assert_same_kv(a, table, c, table, n);
    free(la);
    free(lb);
    free(lc);
    free(prompt);
    kvstore_free(a);
    kvstore_free(b);
    kvstore_free(c);
    model_free(m);
}
END_TEST

/* What a shared run does: another process computed the first k blocks of the
 * prompt into its blocks; this one copies nothing, points its table at those
 * blocks and resumes prefill at token 16k. Equal to a full prefill, bitwise. */
static void check_resumed_prefill(const model_t *m, uint32_t n, uint32_t k, uint64_t seed)
{
    uint32_t bt = m->cfg.block_tokens, blocks = (n + bt - 1) / bt, pool = 2 * blocks + 3;
    kvstore_t *ref = store_for(m, blocks), *shared = store_for(m, pool);
    uint32_t *prompt = random_tokens(n, m->cfg.vocab, seed);
    uint32_t *linear = malloc(sizeof(uint32_t) * blocks);
    uint32_t *ids = malloc(sizeof(uint32_t) * pool), *table = malloc(sizeof(uint32_t) * blocks);
    float *full, *resumed = malloc(sizeof(float) * m->cfg.vocab);

    ck_assert(k * bt < n);
    for (uint32_t i = 0; i < blocks; i++)
        linear[i] = i;
    full = prefill(m, ref, linear, blocks, prompt, n);

    /* The first writer: blocks scattered over the pool, its prefill stops at
     * the end of block k-1 (no logits needed). */
    shuffled_ids(ids, pool, seed + 1);
    if (k)
        ck_assert_int_eq(model_forward(m, shared, ids, k, prompt, 0, k * bt, NULL), 0);
    /* The second request: the k shared blocks, then blocks of its own. */
    for (uint32_t i = 0; i < blocks; i++)
        table[i] = ids[i < k ? i : pool - 1 - i];
    ck_assert_int_eq(
        model_forward(m, shared, table, blocks, prompt + k * bt, k * bt, n - k * bt, resumed), 0);
    ck_assert_int_eq(memcmp(full, resumed, sizeof(float) * m->cfg.vocab), 0);
    assert_same_kv(ref, linear, shared, table, n);

    free(full);
    free(resumed);
    free(table);
    free(ids);
    free(linear);
    free(prompt);
    kvstore_free(ref);
    kvstore_free(shared);
}

START_TEST(test_resumed_prefill_equals_full)
{
    model_t *m = small_model();

    for (uint32_t k = 0; k <= 6; k++)
        check_resumed_prefill(m, 16 * 6 + 5, k, 10 + k);
    /* A prompt that ends on a block boundary resumes at its last block. */
    check_resumed_prefill(m, 16 * 4, 3, 40);
    model_free(m);
}
END_TEST

/* The same property on the full-size model, with a short prompt. */
START_TEST(test_resumed_prefill_default_model)
{
    model_config_t c;
    model_t *m = NULL;

    model_config_default(&c);
    ck_assert_int_eq(model_new(&c, &m), 0);
    check_resumed_prefill(m, 40, 2, 77);
    model_free(m);
}
END_TEST

/* The shared mode's situation for real: another process writes the first
 * blocks of the prompt into a shared memory region (as kvshared's host
 * backend is, a memfd both map); this process maps the same region, wraps it
 * and resumes prefill on top. The result equals a private full prefill. */
START_TEST(test_resume_on_blocks_written_by_another_process)
{
    model_t *m = small_model();
    geometry_t g;
    uint32_t n = 16 * 5 + 9, k = 4, pool = 12, ids[12], linear[6] = {0, 1, 2, 3, 4, 5};
    uint32_t *prompt = random_tokens(n, m->cfg.vocab, 21);
    kvstore_t *priv = store_for(m, 6), *shared = NULL;
    float *full, resumed[256];
    uint64_t bytes;
    void *region;
    int fd, wstatus;
    pid_t pid;

    model_config_geometry(&m->cfg, &g);
    bytes = kvstore_region_bytes(&g, pool);
    fd = memfd_create("kvs-worker-test", 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)bytes), 0);
    shuffled_ids(ids, pool, 5);

    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* The first writer: its own mapping, its own model instance. */
        model_t *wm = small_model();
        kvstore_t *wks = NULL;
        void *wr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int ok = wr != MAP_FAILED && kvstore_wrap(wr, &g, pool, &wks) == 0 &&
                 model_forward(wm, wks, ids, k, prompt, 0, k * 16, NULL) == 0;
        /* Frees what the child holds, inherited or not: leak checkers follow
         * the fork. */
        kvstore_free(wks);
        if (wr != MAP_FAILED)
            munmap(wr, bytes);
        model_free(wm);
        model_free(m);
        kvstore_free(priv);
        free(prompt);
        close(fd);
        _exit(ok ? 0 : 1);
    }
    ck_assert_int_eq(waitpid(pid, &wstatus, 0), pid);
    ck_assert(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);

    region = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(region, MAP_FAILED);
    ck_assert_int_eq(kvstore_wrap(region, &g, pool, &shared), 0);
    /* Blocks 0..k-1 of the table are the writer's; the rest are ours. */
    ck_assert_int_eq(model_forward(m, shared, ids, 6, prompt + k * 16, k * 16, n - k * 16, resumed),
                     0);
    full = prefill(m, priv, linear, 6, prompt, n);
    ck_assert_int_eq(memcmp(full, resumed, sizeof(resumed)), 0);
    assert_same_kv(priv, linear, shared, ids, n);

    kvstore_free(shared);
    munmap(region, bytes);
    close(fd);
    free(full);
    free(prompt);
    kvstore_free(priv);
    model_free(m);
}
END_TEST

/* ---- a naive reference ------------------------------------------------------
 * The textbook forward pass, written apart from model.c: contiguous K/V
 * arrays per layer ([position][kv_head][head_dim]), no blocks, plain loops in
 * double. It shares only the weights (read through model_w). */

typedef struct naive {
    const model_t *m;
    double *k, *v; /* [layer][max_pos][kv_heads * head_dim] */
    uint32_t max_pos;
} naive_t;

static void naive_rmsnorm(double *y, const double *x, const float *w, uint32_t n, double eps)
{
    double ss = 0;

    for (uint32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++)
        y[i] = x[i] * ss * w[i];
}

static void naive_matvec(double *y, const double *x, const float *w, uint32_t K, uint32_t N)
{
    for (uint32_t j = 0; j < N; j++) {
        double s = 0;
        for (uint32_t k = 0; k < K; k++)
            s += x[k] * model_w(w, K, k, j);
        y[j] = s;
    }
}

static void naive_rope(double *v, uint32_t hd, uint32_t pos, double theta)
{
    for (uint32_t i = 0; i < hd / 2; i++) {
        double f = pow(theta, -2.0 * i / hd), a = v[i], b = v[i + hd / 2];
        v[i] = a * cos(pos * f) - b * sin(pos * f);
        v[i + hd / 2] = a * sin(pos * f) + b * cos(pos * f);
    }
}

/* Computes the token at pos (all earlier positions done) and its logits. */
static void naive_step(naive_t *nv, uint32_t token, uint32_t pos, double *logits)
{
    const model_config_t *c = &nv->m->cfg;
    uint32_t d = c->d_model, hd = c->head_dim, qd = c->heads * hd, kvd = c->kv_heads * hd;
    double *x = calloc(d, sizeof(double)), *xn = calloc(d, sizeof(double));
    double *q = calloc(qd, sizeof(double)), *att = calloc(qd, sizeof(double));
    double *o = calloc(d, sizeof(double)), *g = calloc(c->hidden, sizeof(double));
    double *u = calloc(c->hidden, sizeof(double)), *sc = calloc(pos + 1, sizeof(double));

    for (uint32_t i = 0; i < d; i++)
        x[i] = nv->m->embed[(uint64_t)token * d + i];
    for (uint32_t l = 0; l < c->layers; l++) {
        const model_layer_t *ly = &nv->m->layer[l];
        double *kl = nv->k + ((uint64_t)l * nv->max_pos + pos) * kvd;
        double *vl = nv->v + ((uint64_t)l * nv->max_pos + pos) * kvd;

        naive_rmsnorm(xn, x, ly->attn_norm, d, c->norm_eps);
        naive_matvec(q, xn, ly->wq, d, qd);
        naive_matvec(kl, xn, ly->wk, d, kvd);
        naive_matvec(vl, xn, ly->wv, d, kvd);
        for (uint32_t h = 0; h < c->heads; h++)
            naive_rope(q + h * hd, hd, pos, c->rope_theta);
        for (uint32_t h = 0; h < c->kv_heads; h++)
            naive_rope(kl + h * hd, hd, pos, c->rope_theta);
        for (uint32_t h = 0; h < c->heads; h++) {
            uint32_t kvh = h / (c->heads / c->kv_heads);
            double mx = -INFINITY, sum = 0;
            for (uint32_t j = 0; j <= pos; j++) {
                const double *kj = nv->k + ((uint64_t)l * nv->max_pos + j) * kvd + kvh * hd;
                double s = 0;
                for (uint32_t i = 0; i < hd; i++)
                    s += q[h * hd + i] * kj[i];
                sc[j] = s / sqrt((double)hd);
                mx = fmax(mx, sc[j]);
            }
            for (uint32_t j = 0; j <= pos; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (uint32_t i = 0; i < hd; i++) {
                double s = 0;
                for (uint32_t j = 0; j <= pos; j++)
                    s += sc[j] / sum * nv->v[((uint64_t)l * nv->max_pos + j) * kvd + kvh * hd + i];
                att[h * hd + i] = s;
            }
        }
        naive_matvec(o, att, ly->wo, qd, d);
        for (uint32_t i = 0; i < d; i++)
            x[i] += o[i];
        naive_rmsnorm(xn, x, ly->mlp_norm, d, c->norm_eps);
        naive_matvec(g, xn, ly->w_gate, d, c->hidden);
        naive_matvec(u, xn, ly->w_up, d, c->hidden);
        for (uint32_t i = 0; i < c->hidden; i++)
            g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        naive_matvec(o, g, ly->w_down, c->hidden, d);
        for (uint32_t i = 0; i < d; i++)
            x[i] += o[i];
    }
    naive_rmsnorm(xn, x, nv->m->final_norm, d, c->norm_eps);
    for (uint32_t v = 0; v < c->vocab; v++) {
        double s = 0;
        for (uint32_t i = 0; i < d; i++)
            s += nv->m->head[(uint64_t)v * d + i] * xn[i];
        logits[v] = s / sqrt((double)d);
    }
    free(x), free(xn), free(q), free(att), free(o), free(g), free(u), free(sc);
}

static uint32_t naive_argmax(const double *l, uint32_t n)
{
    uint32_t b = 0;

    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

/* Prefill then greedy decode through the worker (paged, in scrambled blocks)
 * and through the naive reference: same tokens, logits within 1e-5 at every
 * step. */
START_TEST(test_decode_matches_naive_reference)
{
    model_t *m = small_model();
    const model_config_t *c = &m->cfg;
    uint32_t n = 37, decode = 24, blocks = (n + decode + 15) / 16, pool = 11, ids[11];
    kvstore_t *ks = store_for(m, pool);
    uint32_t *prompt = random_tokens(n, c->vocab, 5), tok;
    float *logits = malloc(sizeof(float) * c->vocab);
    double *ref = malloc(sizeof(double) * c->vocab), max_err = 0;
    naive_t nv = {.m = m, .max_pos = n + decode};

    nv.k = calloc((uint64_t)c->layers * nv.max_pos * c->kv_heads * c->head_dim, sizeof(double));
    nv.v = calloc((uint64_t)c->layers * nv.max_pos * c->kv_heads * c->head_dim, sizeof(double));
    ck_assert(nv.k && nv.v && logits && ref);
    shuffled_ids(ids, pool, 8);

    ck_assert_int_eq(model_forward(m, ks, ids, blocks, prompt, 0, n, logits), 0);
    for (uint32_t p = 0; p < n; p++)
        naive_step(&nv, prompt[p], p, ref);
    for (uint32_t step = 0;; step++) {
        for (uint32_t v = 0; v < c->vocab; v++) {
            double err = fabs((double)logits[v] - ref[v]);
            max_err = err > max_err ? err : max_err;
            ck_assert_msg(err <= 1e-5, "step %u logit %u: %.9g vs %.9g", step, v, logits[v],
                          ref[v]);
        }
        tok = model_argmax(logits, c->vocab);
        ck_assert_uint_eq(tok, naive_argmax(ref, c->vocab));
        if (step == decode)
            break;
        ck_assert_int_eq(model_forward(m, ks, ids, blocks, &tok, n + step, 1, logits), 0);
        naive_step(&nv, tok, n + step, ref);
    }
    fprintf(stderr, "decode vs naive reference: max |logit error| %.3g\n", max_err);
    free(nv.k);
    free(nv.v);
    free(ref);
    free(logits);
    free(prompt);
    kvstore_free(ks);
    model_free(m);
}
END_TEST

/* ---- worker_run --------------------------------------------------------------- */

/* A tiny in-process prefix cache standing in for kvshared: it remembers the
 * committed full blocks of one sequence, matches prompts against them, and
 * grants other blocks from the same store. It shows the request flow reusing
 * blocks that an earlier request wrote. */
typedef struct toy_cache {
    kvstore_t *store;
    uint32_t *tokens; /* committed tokens */
    uint32_t *ids;    /* their blocks */
    uint32_t blocks;  /* committed blocks */
    uint32_t lookups, hits, commits, releases;
} toy_cache_t;

static int toy_lookup(void *ctx, const uint32_t *tokens, uint32_t n, uint32_t *ids,
                      uint32_t max_blocks, uint32_t *matched)
{
    toy_cache_t *tc = ctx;
    uint32_t bt = tc->store->geom.block_tokens, b = 0;

    tc->lookups++;
    ck_assert_uint_le(max_blocks, n / bt);
    while (b < tc->blocks && b < max_blocks &&
           !memcmp(tokens + b * bt, tc->tokens + b * bt, sizeof(uint32_t) * bt)) {
        ids[b] = tc->ids[b];
        b++;
    }
    tc->hits += b > 0;
    *matched = b;
    return 0;
}

static int toy_alloc(void *ctx, uint32_t n, uint32_t *ids)
{
    return kvstore_alloc(((toy_cache_t *)ctx)->store, n, ids);
}

static int toy_commit(void *ctx, const uint32_t *tokens, uint32_t n_blocks, uint32_t n_matched,
                      uint32_t *ids)
{
    toy_cache_t *tc = ctx;

    (void)n_matched;
    uint32_t bt = tc->store->geom.block_tokens;

    tc->commits++;
    if (tc->blocks)
        return KVS_EEXIST; /* keeps the first sequence, as a full cache would */
    tc->tokens = malloc(sizeof(uint32_t) * n_blocks * bt);
    tc->ids = malloc(sizeof(uint32_t) * n_blocks);
    ck_assert(tc->tokens && tc->ids);
    memcpy(tc->tokens, tokens, sizeof(uint32_t) * n_blocks * bt);
    memcpy(tc->ids, ids, sizeof(uint32_t) * n_blocks);
    tc->blocks = n_blocks;
    return 0;
}

/* Blocks that the cache holds stay; the rest go back to the store. */
static int toy_release(void *ctx, const uint32_t *ids, uint32_t n_matched, uint32_t n)
{
    toy_cache_t *tc = ctx;

    tc->releases++;
    for (uint32_t i = n_matched; i < n; i++) {
        int cached = 0;
        for (uint32_t j = 0; j < tc->blocks; j++)
            cached |= tc->ids[j] == ids[i];
        if (!cached)
            ck_assert_int_eq(kvstore_release(tc->store, 1, &ids[i]), 0);
    }
    return 0;
}

static const worker_cache_ops_t toy_ops = {toy_lookup, toy_alloc, toy_commit, toy_release};

START_TEST(test_worker_private_run)
{
    model_t *m = small_model();
    uint32_t n = 45, decode = 8, blocks = worker_blocks_needed(16, n, decode);
    kvstore_t *ks = store_for(m, blocks), *ref = store_for(m, blocks);
    worker_t w = {.model = m, .store = ks, .ops = &worker_private_ops, .ctx = ks};
    uint32_t *prompt = random_tokens(n, m->cfg.vocab, 6), gen[8], tok, table[4] = {0, 1, 2, 3};
    float *logits = malloc(sizeof(float) * 256), *expect = malloc(sizeof(float) * 256);
    worker_result_t r;

    ck_assert_uint_eq(blocks, 4); /* 45 + 7 positions */
    ck_assert_uint_eq(worker_blocks_needed(16, 16, 1), 1);
    ck_assert_uint_eq(worker_blocks_needed(16, 16, 2), 2);
    ck_assert_uint_eq(worker_blocks_needed(16, 16, 0), 1);
    ck_assert_int_eq(worker_run(&w, prompt, n, decode, gen, logits, &r), 0);
    ck_assert_uint_eq(r.prompt_tokens, n);
    ck_assert_uint_eq(r.matched_tokens, 0);
    ck_assert_uint_eq(r.prefill_tokens, n);
    ck_assert_uint_eq(r.generated, decode);
    ck_assert_uint_eq(r.blocks, blocks);
    ck_assert_uint_eq(kvstore_free_blocks(ks), blocks); /* all released */
    ck_assert_uint_eq(r.logits_hash, worker_logits_hash(logits, m->cfg.vocab));

    /* The same by hand. */
    ck_assert_int_eq(model_forward(m, ref, table, 4, prompt, 0, n, expect), 0);
    for (uint32_t i = 0; i < decode; i++) {
        tok = model_argmax(expect, m->cfg.vocab);
        ck_assert_uint_eq(gen[i], tok);
        if (i + 1 < decode)
            ck_assert_int_eq(model_forward(m, ref, table, 4, &tok, n + i, 1, expect), 0);
    }
    ck_assert_int_eq(memcmp(logits, expect, sizeof(float) * m->cfg.vocab), 0);

    /* A pool one block short: EPOOLFULL, nothing leaked. */
    kvstore_free(ks);
    ks = store_for(m, blocks - 1);
    w.store = ks, w.ctx = ks;
    ck_assert_int_eq(worker_run(&w, prompt, n, decode, gen, logits, &r), KVS_EPOOLFULL);
    ck_assert_uint_eq(kvstore_free_blocks(ks), blocks - 1);
    ck_assert_int_eq(worker_run(&w, prompt, 0, decode, gen, logits, &r), KVS_EINVAL);
    ck_assert_int_eq(worker_run(NULL, prompt, n, decode, gen, logits, &r), KVS_EINVAL);

    free(logits);
    free(expect);
    free(prompt);
    kvstore_free(ks);
    kvstore_free(ref);
    model_free(m);
}
END_TEST

/* Requests sharing a system prompt through a cache give exactly the private
 * run's tokens and logits, computing only what the cache lacked. */
START_TEST(test_worker_shared_equals_private)
{
    model_t *m = small_model();
    workload_chat_opts_t o = {.requests = 4,
                              .systems = 1,
                              .system_tokens = 70,
                              .question_tokens = 20,
                              .vocab = m->cfg.vocab,
                              .seed = 3};
    workload_t *wl = NULL;
    kvstore_t *priv = store_for(m, 16), *pool = store_for(m, 40);
    toy_cache_t tc = {.store = pool};
    worker_t wp = {.model = m, .store = priv, .ops = &worker_private_ops, .ctx = priv};
    worker_t ws = {.model = m, .store = pool, .ops = &toy_ops, .ctx = &tc};
    uint32_t gp[6], gs[6];
    float *lp = malloc(sizeof(float) * 256), *ls = malloc(sizeof(float) * 256);
    worker_result_t rp, rs;

    ck_assert_int_eq(workload_chat(&o, &wl), 0);
    for (uint32_t i = 0; i < wl->count; i++) {
        ck_assert_int_eq(worker_run(&wp, wl->prompt[i], wl->len[i], 6, gp, lp, &rp), 0);
        ck_assert_int_eq(worker_run(&ws, wl->prompt[i], wl->len[i], 6, gs, ls, &rs), 0);
        ck_assert_int_eq(memcmp(gp, gs, sizeof(gp)), 0);
        ck_assert_int_eq(memcmp(lp, ls, sizeof(float) * m->cfg.vocab), 0);
        ck_assert_uint_eq(rp.logits_hash, rs.logits_hash);
        ck_assert_uint_eq(rp.prefill_tokens, wl->len[i]);
        /* The first request fills the cache; the others match the 4 full
         * blocks of the 70-token system prompt (64 tokens). */
        ck_assert_uint_eq(rs.matched_tokens, i ? 64 : 0);
        ck_assert_uint_eq(rs.prefill_tokens, wl->len[i] - rs.matched_tokens);
    }
    ck_assert_uint_eq(tc.lookups, 4);
    ck_assert_uint_eq(tc.hits, 3);
    ck_assert_uint_eq(tc.releases, 4);
    ck_assert_uint_eq(kvstore_free_blocks(pool), 40 - tc.blocks);

    free(tc.tokens);
    free(tc.ids);
    free(lp);
    free(ls);
    workload_free(wl);
    kvstore_free(priv);
    kvstore_free(pool);
    model_free(m);
}
END_TEST

/* A prompt fully in the cache still computes its last block: the first
 * generated token needs the logits of the last prompt token. */
START_TEST(test_worker_full_match_computes_last_block)
{
    model_t *m = small_model();
    kvstore_t *pool = store_for(m, 20), *priv = store_for(m, 8);
    toy_cache_t tc = {.store = pool};
    worker_t ws = {.model = m, .store = pool, .ops = &toy_ops, .ctx = &tc};
    worker_t wp = {.model = m, .store = priv, .ops = &worker_private_ops, .ctx = priv};
    uint32_t *prompt = random_tokens(48, m->cfg.vocab, 9), g1[4], g2[4], gp[4];
    float l1[256], l2[256], lp[256];
    worker_result_t r;

    ck_assert_int_eq(worker_run(&ws, prompt, 48, 4, g1, l1, &r), 0);
    ck_assert_uint_eq(tc.blocks, 3);
    ck_assert_int_eq(worker_run(&ws, prompt, 48, 4, g2, l2, &r), 0);
    ck_assert_uint_eq(r.matched_tokens, 32);
    ck_assert_uint_eq(r.prefill_tokens, 16);
    ck_assert_int_eq(worker_run(&wp, prompt, 48, 4, gp, lp, &r), 0);
    ck_assert_int_eq(memcmp(g1, gp, sizeof(gp)), 0);
    ck_assert_int_eq(memcmp(g2, gp, sizeof(gp)), 0);
    ck_assert_int_eq(memcmp(l2, lp, sizeof(lp)), 0);
    free(tc.tokens);
    free(tc.ids);
    free(prompt);
    kvstore_free(pool);
    kvstore_free(priv);
    model_free(m);
}
END_TEST

/* ---- workload ----------------------------------------------------------------- */

START_TEST(test_workload_chat)
{
    workload_chat_opts_t o = {.requests = 6,
                              .systems = 2,
                              .system_tokens = 50,
                              .question_tokens = 10,
                              .vocab = 1000,
                              .seed = 4};
    workload_t *a = NULL, *b = NULL;

    ck_assert_int_eq(workload_chat(&o, &a), 0);
    ck_assert_int_eq(workload_chat(&o, &b), 0);
    ck_assert_uint_eq(a->count, 6);
    for (uint32_t i = 0; i < 6; i++) {
        ck_assert_uint_eq(a->len[i], b->len[i]);
        ck_assert_int_eq(memcmp(a->prompt[i], b->prompt[i], a->len[i] * 4), 0);
        ck_assert_uint_ge(a->len[i], 55);
        ck_assert_uint_le(a->len[i], 65);
        for (uint32_t j = 0; j < a->len[i]; j++)
            ck_assert_uint_lt(a->prompt[i][j], 1000);
    }
    /* Requests 0, 2, 4 share system prompt 0; 1, 3, 5 system prompt 1. */
    ck_assert_int_eq(memcmp(a->prompt[0], a->prompt[2], 50 * 4), 0);
    ck_assert_int_eq(memcmp(a->prompt[1], a->prompt[5], 50 * 4), 0);
    ck_assert_int_ne(memcmp(a->prompt[0], a->prompt[1], 50 * 4), 0);
    ck_assert_int_ne(memcmp(a->prompt[0] + 50, a->prompt[2] + 50, 5 * 4), 0);
    workload_free(b);
    /* A worker that starts at request 2 gets requests 2.. of the same workload. */
    o.first = 2;
    o.requests = 2;
    ck_assert_int_eq(workload_chat(&o, &b), 0);
    ck_assert_uint_eq(b->len[0], a->len[2]);
    ck_assert_int_eq(memcmp(b->prompt[1], a->prompt[3], a->len[3] * 4), 0);
    workload_free(a);
    workload_free(b);
    o.systems = 0;
    ck_assert_int_eq(workload_chat(&o, &a), KVS_EINVAL);
    workload_free(NULL);
}
END_TEST

static char *write_temp(const char *text)
{
    char *path = malloc(256);
    ck_assert_ptr_nonnull(path);
    int fd = test_tmp_file("kvs-worker-test", path, 256);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

START_TEST(test_workload_load)
{
    char *ok = write_temp("# comment\n1 2 3\n\n  4,5 , 6 7\n99\n");
    char *bad = write_temp("1 2 x\n");
    char *big = write_temp("1 100\n");
    char *empty = write_temp("# nothing\n\n");
    workload_t *w = NULL;

    ck_assert_int_eq(workload_load(ok, 100, &w), 0);
    ck_assert_uint_eq(w->count, 3);
    ck_assert_uint_eq(w->len[0], 3);
    ck_assert_uint_eq(w->len[1], 4);
    ck_assert_uint_eq(w->prompt[1][3], 7);
    ck_assert_uint_eq(w->len[2], 1);
    ck_assert_uint_eq(w->prompt[2][0], 99);
    workload_free(w);
    ck_assert_int_eq(workload_load(bad, 100, &w), KVS_EINVAL);
    ck_assert_int_eq(workload_load(big, 100, &w), KVS_EINVAL);
    ck_assert_int_eq(workload_load(empty, 100, &w), KVS_EINVAL);
    ck_assert_int_eq(workload_load("/nonexistent/prompts", 100, &w), KVS_EIO);
    unlink(ok), unlink(bad), unlink(big), unlink(empty);
    free(ok), free(bad), free(big), free(empty);
}
END_TEST

/* Many prompts: the file reader grows its arrays. */
START_TEST(test_workload_load_many)
{
    char *text = malloc(100 * 8 + 1), *p = text, *path;
    workload_t *w = NULL;

    for (uint32_t i = 0; i < 100; i++)
        p += sprintf(p, "%u %u\n", i, i + 1);
    path = write_temp(text);
    ck_assert_int_eq(workload_load(path, 200, &w), 0);
    ck_assert_uint_eq(w->count, 100);
    ck_assert_uint_eq(w->prompt[99][1], 100);
    workload_free(w);
    unlink(path);
    free(path);
    free(text);
}
END_TEST

static Suite *worker_suite(void)
{
    Suite *s = suite_create("worker");
    TCase *tc;

    tc = tcase_create("kvstore");
    tcase_add_test(tc, test_kvstore_layout);
    tcase_add_test(tc, test_kvstore_rejects_bad_geometry);
    tcase_add_test(tc, test_kvstore_alloc_release);
    tcase_add_test(tc, test_kvstore_wrap_borrows);
    suite_add_tcase(s, tc);

    tc = tcase_create("model");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_model_config);
    tcase_add_test(tc, test_model_weights_from_seed);
    tcase_add_test(tc, test_forward_rejects_bad_args);
    tcase_add_test(tc, test_forward_deterministic);
    tcase_add_test(tc, test_forward_block_ids_do_not_matter);
    tcase_add_test(tc, test_forward_batching_does_not_matter);
    tcase_add_test(tc, test_forward_tp_matches_one_rank);
    tcase_add_test(tc, test_resumed_prefill_equals_full);
    tcase_add_test(tc, test_resumed_prefill_default_model);
    tcase_add_test(tc, test_resume_on_blocks_written_by_another_process);
    tcase_add_test(tc, test_decode_matches_naive_reference);
    suite_add_tcase(s, tc);

    tc = tcase_create("worker");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_worker_private_run);
    tcase_add_test(tc, test_worker_shared_equals_private);
    tcase_add_test(tc, test_worker_full_match_computes_last_block);
    suite_add_tcase(s, tc);

    tc = tcase_create("workload");
    tcase_add_test(tc, test_workload_chat);
    tcase_add_test(tc, test_workload_load);
    tcase_add_test(tc, test_workload_load_many);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(worker_suite)
