/* SPDX-License-Identifier: Apache-2.0 */
/*
 * identity.c: the canonical text of a model identity reads back as the
 * same identity, every part of it changes the hash, and bad parts are
 * refused.
 */
#include <check.h>
#include <string.h>

#include "check_main.h"
#include "identity.h"
#include "kvshare_status.h"

static geometry_t llama8b(void)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.1-8b", &g), 0);
    return g;
}

START_TEST(text_round_trip)
{
    geometry_t g = llama8b();
    identity_t a, b;
    char text[IDENTITY_TEXT_MAX + 1];
    ck_assert_int_eq(identity_make("meta-llama/Llama 3.1 8B", "a1b2c3", &g, 2, &a), 0);
    ck_assert_int_lt(identity_text(&a, text, sizeof(text)), (int)sizeof(text));
    ck_assert_ptr_nonnull(strstr(text, "model=meta-llama/Llama 3.1 8B"));
    ck_assert_ptr_nonnull(strstr(text, "bf16"));
    ck_assert_int_eq(identity_parse(text, &b), 0);
    ck_assert(identity_equal(&a, &b));
    ck_assert_uint_eq(identity_hash(&a), identity_hash(&b));

    /* No model, no revision: written "-" and read back empty. */
    ck_assert_int_eq(identity_make(NULL, NULL, &g, 1, &a), 0);
    identity_text(&a, text, sizeof(text));
    ck_assert_int_eq(identity_parse(text, &b), 0);
    ck_assert_str_eq(b.model, "");
    ck_assert_str_eq(b.revision, "");
    ck_assert(identity_equal(&a, &b));

    /* MLA */
    ck_assert_int_eq(geometry_preset("deepseek-v3", &g), 0);
    ck_assert_int_eq(identity_make("deepseek-ai/DeepSeek-V3", NULL, &g, 8, &a), 0);
    identity_text(&a, text, sizeof(text));
    ck_assert_int_eq(identity_parse(text, &b), 0);
    ck_assert(identity_equal(&a, &b));
}
END_TEST

/* Every part names a different identity: a block of one must never pass
 * for a block of another. */
START_TEST(every_part_counts)
{
    geometry_t g = llama8b();
    identity_t base, x;
    ck_assert_int_eq(identity_make("m", "r", &g, 1, &base), 0);
    uint64_t h = identity_hash(&base);
    ck_assert_uint_ne(h, 0);

    geometry_t v[7];
    for (int i = 0; i < 7; i++)
        v[i] = g;
    v[0].dtype = GEOMETRY_FP16;
    v[1].layers = 16; /* the same block bytes as ... */
    v[1].kv_heads = 16;
    v[2].head_dim = 64;
    v[2].kv_heads = 16;
    v[3].block_tokens = 32;
    v[4].layers = 31;
    v[5].dtype = GEOMETRY_FP8;
    v[6].kv_heads = 4;
    for (int i = 0; i < 7; i++) {
        ck_assert_int_eq(identity_make("m", "r", &v[i], 1, &x), 0);
        ck_assert_msg(identity_hash(&x) != h, "geometry variant %d hashes the same", i);
        ck_assert(!identity_same_layout(&x, &base));
    }
    ck_assert_int_eq(identity_make("m", "r", &g, 2, &x), 0);
    ck_assert_uint_ne(identity_hash(&x), h);
    ck_assert(!identity_same_layout(&x, &base));
    ck_assert_int_eq(identity_make("m2", "r", &g, 1, &x), 0);
    ck_assert_uint_ne(identity_hash(&x), h);
    ck_assert(identity_same_layout(&x, &base));
    ck_assert(!identity_equal(&x, &base));
    ck_assert_int_eq(identity_make("m", "r2", &g, 1, &x), 0);
    ck_assert_uint_ne(identity_hash(&x), h);
    ck_assert_int_eq(identity_make("m", NULL, &g, 1, &x), 0);
    ck_assert_uint_ne(identity_hash(&x), h);
}
END_TEST

START_TEST(bad_parts_refused)
{
    geometry_t g = llama8b();
    identity_t x;
    ck_assert_int_eq(identity_make("a\nb", NULL, &g, 1, &x), KVS_EINVAL);
    ck_assert_int_eq(identity_make("m", "has space", &g, 1, &x), KVS_EINVAL);
    ck_assert_int_eq(identity_make("m", NULL, &g, 0, &x), KVS_EINVAL);
    char longname[IDENTITY_MODEL_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    ck_assert_int_eq(identity_make(longname, NULL, &g, 1, &x), KVS_EINVAL);
    geometry_t bad = g;
    bad.layers = 0;
    ck_assert_int_eq(identity_make("m", NULL, &bad, 1, &x), KVS_EINVAL);

    ck_assert_int_eq(identity_parse("", &x), KVS_EINVAL);
    ck_assert_int_eq(identity_parse("kvs-id1 bf16 layers=32", &x), KVS_EINVAL);
    ck_assert_int_eq(identity_parse("kvs-id1 bf16 layers=32 kv_heads=8 head_dim=128 planes=1 "
                                    "lora=0 rope=0 block_tokens=16 tp=1 revision=- model=m",
                                    &x),
                     KVS_EINVAL); /* MHA has two planes */
    ck_assert_int_eq(identity_parse("kvs-id9 bf16 layers=32 kv_heads=8 head_dim=128 planes=2 "
                                    "lora=0 rope=0 block_tokens=16 tp=1 revision=- model=m",
                                    &x),
                     KVS_EINVAL);
    ck_assert_int_eq(identity_parse("kvs-id1 bf16 layers=32 kv_heads=8 head_dim=128 planes=2 "
                                    "lora=0 rope=0 block_tokens=16 tp=1 revision=- model=m",
                                    &x),
                     0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("identity");
    TCase *tc = tcase_create("identity");
    tcase_add_test(tc, text_round_trip);
    tcase_add_test(tc, every_part_counts);
    tcase_add_test(tc, bad_parts_refused);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(suite)
