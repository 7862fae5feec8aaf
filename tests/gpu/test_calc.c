/* SPDX-License-Identifier: Apache-2.0 */
/* The capacity planner's arithmetic (geometry_seq_bytes,
 * geometry_seqs_for_budget, geometry_derive_budget) pinned to the published
 * Llama-3.1-70B figures, the operator's two-GPU question, and MLA models. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "geometry.h"

#define K4   4096ull
#define K32  32768ull
#define K128 131072ull

static geometry_t llama70(geometry_dtype_t dtype)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.1-70b", &g), 0);
    g.dtype = dtype;
    return g;
}

/* Decimal gigabytes to one decimal, as the figures are quoted. */
static double gb1(uint64_t bytes)
{
    return round((double)bytes / 1e8) / 10.0;
}

START_TEST(bytes_per_token_320kib)
{
    geometry_t g = llama70(GEOMETRY_BF16);
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 320 * 1024);
}
END_TEST

START_TEST(one_128k_context)
{
    geometry_t g = llama70(GEOMETRY_BF16);
    ck_assert_uint_eq(geometry_seq_bytes(&g, K128), 42949672960ull); /* 8192 blocks x 5 MiB */
    ck_assert_double_eq_tol(gb1(geometry_seq_bytes(&g, K128)), 42.9, 1e-9);
    g.dtype = GEOMETRY_FP8;
    ck_assert_uint_eq(geometry_seq_bytes(&g, K128), 21474836480ull);
    ck_assert_double_eq_tol(gb1(geometry_seq_bytes(&g, K128)), 21.5, 1e-9);
}
END_TEST

START_TEST(per_sequence_bf16)
{
    geometry_t g = llama70(GEOMETRY_BF16);
    ck_assert_uint_eq(geometry_seq_bytes(&g, K4), 1342177280ull);
    ck_assert_uint_eq(geometry_seq_bytes(&g, K32), 10737418240ull);
    ck_assert_double_eq_tol(gb1(geometry_seq_bytes(&g, K4)), 1.3, 1e-9);
    ck_assert_double_eq_tol(gb1(geometry_seq_bytes(&g, K32)), 10.7, 1e-9);
    ck_assert_double_eq_tol(gb1(geometry_seq_bytes(&g, K128)), 42.9, 1e-9);
}
END_TEST

/* 70 GB (decimal) of FP8 KV: 26702 blocks of 2.5 MiB. The quoted "~105 at 4k"
 * divides 70 GB by a per-sequence size rounded to 0.665 GB; in whole blocks
 * 4k tokens take 256 blocks (671088640 B) and 26702 / 256 = 104.3. */
START_TEST(sequences_in_70gb_fp8)
{
    geometry_t g = llama70(GEOMETRY_FP8);
    const uint64_t budget = 70000000000ull;
    ck_assert_uint_eq(geometry_blocks_for_budget(&g, budget), 26702);
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, budget, K4), 104);
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, budget, K32), 13);
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, budget, K128), 3);
    ck_assert_double_eq_tol((double)budget / (double)geometry_seq_bytes(&g, K4), 104.3, 0.05);
}
END_TEST

START_TEST(partial_blocks_count_whole)
{
    geometry_t g = llama70(GEOMETRY_BF16);
    /* 17 tokens take two 16-token blocks */
    ck_assert_uint_eq(geometry_seq_bytes(&g, 17), 2 * geometry_block_bytes(&g));
    ck_assert_uint_eq(geometry_seq_bytes(&g, 16), geometry_block_bytes(&g));
    ck_assert_uint_eq(geometry_seq_bytes(&g, 1), geometry_block_bytes(&g));
    ck_assert_uint_eq(geometry_seq_bytes(&g, 0), 0);
    ck_assert_uint_eq(geometry_seq_bytes(&g, UINT64_MAX), UINT64_MAX); /* saturates */
    /* 3 blocks in budget, 17-token sequences need 2 each: one fits */
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, 3 * geometry_block_bytes(&g), 17), 1);
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, 3 * geometry_block_bytes(&g), 0), 0);
    geometry_t bad = g;
    bad.layers = 0;
    ck_assert_uint_eq(geometry_seq_bytes(&bad, 16), 0);
    ck_assert_uint_eq(geometry_seqs_for_budget(&bad, 1ull << 40, 16), 0);
}
END_TEST

START_TEST(llama_8b_figures)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.1-8b", &g), 0);
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 128 * 1024);
    ck_assert_uint_eq(geometry_seq_bytes(&g, K128), 16ull << 30); /* 16 GiB */
}
END_TEST

/* 2 x 80 GB, utilization 0.9, 70 GB of FP8 weights, 5 GB overhead: the KV
 * budget is 160 x 0.9 - 70 - 5 = 69 GB, quoted as "~70 GB". */
START_TEST(budget_from_two_gpus)
{
    uint64_t usable = 0, budget = 0;
    ck_assert_int_eq(geometry_derive_budget(160000000000ull, 0.9, 70000000000ull, 5000000000ull,
                                            &usable, &budget),
                     0);
    ck_assert_uint_eq(usable, 144000000000ull);
    ck_assert_uint_eq(budget, 69000000000ull);
    ck_assert_double_eq_tol(gb1(budget), 69.0, 1e-9);

    geometry_t g = llama70(GEOMETRY_FP8);
    geometry_plan_t plan;
    ck_assert_int_eq(geometry_plan(&g, budget, &plan), 0);
    ck_assert_uint_eq(plan.blocks, 26321);
    ck_assert_uint_eq(plan.tokens, 421136); /* "~430k live tokens" */
    /* "~105 / ~13 / ~3 users" (quoted from 70 GB): in whole blocks of 69 GB */
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, budget, K4), 102);
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, budget, K32), 12);
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, budget, K128), 3);
    /* 16 users: ~11 GB at 4k, ~86 GB at 32k (over budget), ~344 GB at 128k */
    ck_assert_double_eq_tol(gb1(16 * geometry_seq_bytes(&g, K4)), 10.7, 1e-9);
    ck_assert_double_eq_tol(gb1(16 * geometry_seq_bytes(&g, K32)), 85.9, 1e-9);
    ck_assert_uint_gt(16 * geometry_seq_bytes(&g, K32), budget);
    ck_assert_double_eq_tol(round((double)(16 * geometry_seq_bytes(&g, K128)) / 1e9), 344, 1e-9);
    /* $6/hour for the pair: a 4k user costs cents, a 128k user dollars */
    ck_assert_double_eq_tol(6.0 / (double)geometry_seqs_for_budget(&g, budget, K4), 0.0588, 1e-4);
    ck_assert_double_eq_tol(6.0 / (double)geometry_seqs_for_budget(&g, budget, K128), 2.0, 1e-9);
}
END_TEST

START_TEST(budget_refusals)
{
    uint64_t usable = 7, budget = 7;
    /* weights and overhead take everything, or more */
    ck_assert_int_eq(
        geometry_derive_budget(80000000000ull, 0.9, 72000000000ull, 0, &usable, &budget),
        KVS_EINVAL);
    ck_assert_int_eq(geometry_derive_budget(80000000000ull, 0.9, 60000000000ull, 12000000000ull,
                                            &usable, &budget),
                     KVS_EINVAL);
    ck_assert_int_eq(geometry_derive_budget(80000000000ull, 0.9, 0, UINT64_MAX, &usable, &budget),
                     KVS_EINVAL);
    /* utilization outside (0, 1] */
    ck_assert_int_eq(geometry_derive_budget(80000000000ull, 0, 1, 1, &usable, &budget), KVS_EINVAL);
    ck_assert_int_eq(geometry_derive_budget(80000000000ull, 1.01, 1, 1, &usable, &budget),
                     KVS_EINVAL);
    ck_assert_int_eq(geometry_derive_budget(80000000000ull, NAN, 1, 1, &usable, &budget),
                     KVS_EINVAL);
    ck_assert_int_eq(geometry_derive_budget(80000000000ull, 0.9, 1, 1, NULL, &budget), KVS_EINVAL);
    ck_assert_uint_eq(usable, 7);
    ck_assert_uint_eq(budget, 7);
    /* the whole of the largest memory: no wrap */
    ck_assert_int_eq(geometry_derive_budget(UINT64_MAX, 1.0, 0, 0, &usable, &budget), 0);
    ck_assert_uint_eq(usable, UINT64_MAX);
    ck_assert_uint_eq(budget, UINT64_MAX);
}
END_TEST

/* DeepSeek-V3 in FP8: 61 layers x (512 + 64) x 1 B = 35136 B per token, about
 * a ninth of Llama-3.1-70B's 160 KiB in FP8; V2-Lite in BF16: 31104 B. */
START_TEST(mla_figures)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("deepseek-v3", &g), 0);
    g.dtype = GEOMETRY_FP8;
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 35136);
    ck_assert_uint_eq(geometry_seq_bytes(&g, K128), 8192ull * 16 * 35136);
    ck_assert_double_eq_tol(gb1(geometry_seq_bytes(&g, K128)), 4.6, 1e-9);
    ck_assert_uint_eq(geometry_seqs_for_budget(&g, 100000000000ull, K128), 21);
    ck_assert_int_eq(geometry_preset("deepseek-v2-lite", &g), 0);
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 31104);
}
END_TEST

static Suite *calc_suite(void)
{
    Suite *s = suite_create("calc");
    TCase *tc = tcase_create("figures");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, bytes_per_token_320kib);
    tcase_add_test(tc, one_128k_context);
    tcase_add_test(tc, per_sequence_bf16);
    tcase_add_test(tc, sequences_in_70gb_fp8);
    tcase_add_test(tc, partial_blocks_count_whole);
    tcase_add_test(tc, llama_8b_figures);
    tcase_add_test(tc, budget_from_two_gpus);
    tcase_add_test(tc, budget_refusals);
    tcase_add_test(tc, mla_figures);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(calc_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
