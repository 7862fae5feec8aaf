/* The capacity planner's arithmetic (geometry_seq_bytes,
 * geometry_seqs_for_budget) pinned to the published Llama-3.1-70B figures. */
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
