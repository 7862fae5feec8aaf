/* SPDX-License-Identifier: Apache-2.0 */
/* geometry: dtypes, validation, KV arithmetic, the layout function, presets
 * and plans (the size parsers are common/units.c: tests/common). */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "geometry.h"

static geometry_t llama70(geometry_dtype_t dtype)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.1-70b", &g), 0);
    g.dtype = dtype;
    return g;
}

START_TEST(dtype_sizes_and_names)
{
    ck_assert_uint_eq(geometry_dtype_bytes(GEOMETRY_FP32), 4);
    ck_assert_uint_eq(geometry_dtype_bytes(GEOMETRY_FP16), 2);
    ck_assert_uint_eq(geometry_dtype_bytes(GEOMETRY_BF16), 2);
    ck_assert_uint_eq(geometry_dtype_bytes(GEOMETRY_FP8), 1);
    ck_assert_uint_eq(geometry_dtype_bytes((geometry_dtype_t)42), 0);
    ck_assert_str_eq(geometry_dtype_name(GEOMETRY_FP32), "fp32");
    ck_assert_str_eq(geometry_dtype_name(GEOMETRY_FP16), "fp16");
    ck_assert_str_eq(geometry_dtype_name(GEOMETRY_BF16), "bf16");
    ck_assert_str_eq(geometry_dtype_name(GEOMETRY_FP8), "fp8");
    ck_assert_ptr_null(geometry_dtype_name((geometry_dtype_t)42));
}
END_TEST

START_TEST(dtype_parse)
{
    static const struct {
        const char *name;
        geometry_dtype_t dtype;
    } ok[] = {
        {"fp32", GEOMETRY_FP32},    {"float32", GEOMETRY_FP32}, {"fp16", GEOMETRY_FP16},
        {"float16", GEOMETRY_FP16}, {"bf16", GEOMETRY_BF16},    {"BFloat16", GEOMETRY_BF16},
        {"fp8", GEOMETRY_FP8},      {"fp8_e4m3", GEOMETRY_FP8}, {"FP8", GEOMETRY_FP8},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        geometry_dtype_t d = (geometry_dtype_t)99;
        ck_assert_int_eq(geometry_dtype_parse(ok[i].name, &d), 0);
        ck_assert_int_eq(d, ok[i].dtype);
    }
    geometry_dtype_t d = GEOMETRY_FP32;
    ck_assert_int_eq(geometry_dtype_parse("int8", &d), KVS_EINVAL);
    ck_assert_int_eq(geometry_dtype_parse("", &d), KVS_EINVAL);
    ck_assert_int_eq(geometry_dtype_parse("bf16 ", &d), KVS_EINVAL);
    ck_assert_int_eq(geometry_dtype_parse(NULL, &d), KVS_EINVAL);
    ck_assert_int_eq(geometry_dtype_parse("bf16", NULL), KVS_EINVAL);
    ck_assert_int_eq(d, GEOMETRY_FP32);
}
END_TEST

START_TEST(validate)
{
    geometry_t g = llama70(GEOMETRY_BF16);
    ck_assert_int_eq(geometry_validate(&g), 0);
    ck_assert_int_eq(geometry_validate(NULL), KVS_EINVAL);
    geometry_t bad = g;
    bad.layers = 0;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    bad = g;
    bad.kv_heads = 0;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    bad = g;
    bad.head_dim = 0;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    bad = g;
    bad.block_tokens = 0;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    bad = g;
    bad.dtype = (geometry_dtype_t)7;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    /* 2 x 2^32 x 2^32 ... would wrap 64 bits: refused, not wrapped. */
    geometry_t huge = {.layers = UINT32_MAX,
                       .kv_heads = UINT32_MAX,
                       .head_dim = UINT32_MAX,
                       .dtype = GEOMETRY_FP32,
                       .block_tokens = UINT32_MAX};
    ck_assert_int_eq(geometry_validate(&huge), KVS_EINVAL);
    /* block_bytes = 2^62 fits; 2^63 does not. */
    geometry_t edge = {.layers = 1u << 15,
                       .kv_heads = 1u << 15,
                       .head_dim = 1u << 15,
                       .dtype = GEOMETRY_FP32,
                       .block_tokens = 1u << 14};
    ck_assert_int_eq(geometry_validate(&edge), 0);
    ck_assert_uint_eq(geometry_block_bytes(&edge), UINT64_C(1) << 62);
    edge.block_tokens = 1u << 15;
    ck_assert_int_eq(geometry_validate(&edge), KVS_EINVAL);
}
END_TEST

START_TEST(arithmetic_llama_70b)
{
    geometry_t g = llama70(GEOMETRY_BF16);
    ck_assert_uint_eq(g.layers, 80);
    ck_assert_uint_eq(g.kv_heads, 8);
    ck_assert_uint_eq(g.head_dim, 128);
    ck_assert_uint_eq(g.block_tokens, 16);
    ck_assert_int_eq(g.dtype, GEOMETRY_BF16);
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 327680); /* 320 KiB */
    ck_assert_uint_eq(geometry_block_bytes(&g), 5u << 20);   /* 5 MiB */
    ck_assert_uint_eq(geometry_slot_bytes(&g), 16 * 8 * 128 * 2);
    /* slots of all layers, K and V, make up the block */
    ck_assert_uint_eq(geometry_slot_bytes(&g) * 2 * g.layers, geometry_block_bytes(&g));
    g.dtype = GEOMETRY_FP8;
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 163840);
    ck_assert_uint_eq(geometry_block_bytes(&g), 5u << 19);
    g.dtype = GEOMETRY_FP32;
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 655360);
}
END_TEST

START_TEST(presets)
{
    static const struct {
        const char *name;
        uint64_t bytes_per_token; /* bf16 */
    } known[] = {
        {"llama-3.1-8b", 131072},                           /* 32 x 8 x 128: 128 KiB */
        {"llama-3.1-70b", 327680}, {"llama-3.2-1b", 32768}, /* 16 x 8 x 64 */
        {"qwen2.5-7b", 57344},                              /* 28 x 4 x 128 */
        {"mistral-7b", 131072},                             /* 32 x 8 x 128 */
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        geometry_t g;
        ck_assert_int_eq(geometry_preset(known[i].name, &g), 0);
        ck_assert_int_eq(geometry_validate(&g), 0);
        ck_assert_uint_eq(geometry_bytes_per_token(&g), known[i].bytes_per_token);
    }
    size_t n = 0;
    for (const char *name; (name = geometry_preset_name(n)) != NULL; n++) {
        geometry_t g;
        ck_assert_int_eq(geometry_preset(name, &g), 0);
        ck_assert_int_eq(geometry_validate(&g), 0);
        ck_assert_int_eq(g.dtype, GEOMETRY_BF16);
        ck_assert_uint_eq(g.block_tokens, 16);
    }
    ck_assert_uint_ge(n, 5);
    geometry_t g;
    ck_assert_int_eq(geometry_preset("Llama-3.1-70B", &g), 0);
    ck_assert_uint_eq(g.layers, 80);
    ck_assert_int_eq(geometry_preset("meta-llama/Llama-3.1-8B", &g), 0);
    ck_assert_uint_eq(g.layers, 32);
    ck_assert_int_eq(geometry_preset("no-such-model", &g), KVS_ENOTFOUND);
    ck_assert_int_eq(geometry_preset(NULL, &g), KVS_EINVAL);
}
END_TEST

START_TEST(layout_offsets)
{
    geometry_t g = {.layers = 3,
                    .kv_heads = 2,
                    .head_dim = 4,
                    .dtype = GEOMETRY_FP16,
                    .block_tokens = 4}; /* slot = 4 x 2 x 4 x 2 = 64 B */
    const uint32_t nb = 5;
    uint64_t slot = geometry_slot_bytes(&g);
    ck_assert_uint_eq(slot, 64);
    /* [layer][k|v][block]: consecutive blocks are adjacent slots, K of a
     * layer is followed by its V, and every slot is used exactly once. */
    uint64_t expect = 0;
    for (uint32_t l = 0; l < g.layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t b = 0; b < nb; b++, expect += slot)
                ck_assert_uint_eq(geometry_offset(&g, nb, l, kv, b), expect);
    ck_assert_uint_eq(expect, nb * geometry_block_bytes(&g));
    geometry_t big = llama70(GEOMETRY_BF16);
    ck_assert_uint_eq(geometry_offset(&big, 100, 1, 1, 3), 303ull * 32768);
    /* 64-bit: the last slot of a 140 GB pool is past 4 GiB */
    ck_assert_uint_eq(geometry_offset(&big, 28000, 79, 1, 27999), (159ull * 28000 + 27999) * 32768);
}
END_TEST

/* MLA (DeepSeek-V2/V3): one latent of kv_lora_rank + rope_head_dim elements
 * per token and layer, no K/V split and no heads. */
START_TEST(mla_arithmetic)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("deepseek-v3", &g), 0);
    ck_assert_int_eq(geometry_validate(&g), 0);
    ck_assert(geometry_is_mla(&g));
    ck_assert_uint_eq(g.layers, 61);
    ck_assert_uint_eq(g.kv_lora_rank, 512);
    ck_assert_uint_eq(g.rope_head_dim, 64);
    ck_assert_uint_eq(g.kv_heads, 0);
    ck_assert_uint_eq(g.head_dim, 0);
    ck_assert_uint_eq(geometry_planes(&g), 1);
    ck_assert_uint_eq(geometry_token_width(&g), 576);
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 61 * 576 * 2); /* 70272 B */
    ck_assert_uint_eq(geometry_slot_bytes(&g), 16 * 576 * 2);
    ck_assert_uint_eq(geometry_slot_bytes(&g) * g.layers, geometry_block_bytes(&g));
    g.dtype = GEOMETRY_FP8;
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 35136);
    ck_assert_uint_eq(geometry_seq_bytes(&g, 131072), 131072ull * 35136);

    ck_assert_int_eq(geometry_preset("deepseek-ai/DeepSeek-V2-Lite", &g), 0);
    ck_assert_uint_eq(g.layers, 27);
    ck_assert_uint_eq(geometry_bytes_per_token(&g), 27 * 576 * 2); /* 31104 B */
    char text[128];
    ck_assert_int_gt(geometry_describe(&g, text, sizeof(text)), 0);
    ck_assert_str_eq(text, "27 layers x (512 kv_lora_rank + 64 rope_head_dim) bf16, MLA");
    geometry_t mha = llama70(GEOMETRY_FP8);
    ck_assert_int_gt(geometry_describe(&mha, text, sizeof(text)), 0);
    ck_assert_str_eq(text, "80 layers x 8 kv_heads x 128 head_dim fp8");
    ck_assert_uint_eq(geometry_planes(&mha), 2);

    /* heads and a latent together, or a RoPE width without a latent: refused */
    geometry_t bad = g;
    bad.kv_heads = 1;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    bad = g;
    bad.head_dim = 64;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    bad = mha;
    bad.rope_head_dim = 64;
    ck_assert_int_eq(geometry_validate(&bad), KVS_EINVAL);
    ck_assert_int_eq(geometry_describe(&bad, text, sizeof(text)), KVS_EINVAL);
    /* a latent without a RoPE part is still a latent */
    bad = g;
    bad.rope_head_dim = 0;
    ck_assert_int_eq(geometry_validate(&bad), 0);
    ck_assert_uint_eq(geometry_token_width(&bad), 512);
    /* 2^32 x 2^33 x ...: refused, not wrapped */
    geometry_t huge = {.layers = UINT32_MAX,
                       .kv_heads = 0,
                       .head_dim = 0,
                       .dtype = GEOMETRY_FP32,
                       .block_tokens = UINT32_MAX,
                       .kv_lora_rank = UINT32_MAX,
                       .rope_head_dim = UINT32_MAX};
    ck_assert_int_eq(geometry_validate(&huge), KVS_EINVAL);
}
END_TEST

/* An MLA block is one latent slot per layer instead of K and V: layer l
 * starts l x num_blocks slots in, every slot used exactly once. */
START_TEST(mla_layout_offsets)
{
    geometry_t g = {.layers = 3,
                    .dtype = GEOMETRY_FP16,
                    .block_tokens = 4,
                    .kv_lora_rank = 6,
                    .rope_head_dim = 2}; /* slot = 4 x 8 x 2 = 64 B */
    const uint32_t nb = 5;
    uint64_t slot = geometry_slot_bytes(&g);
    ck_assert_uint_eq(slot, 64);
    uint64_t expect = 0;
    for (uint32_t l = 0; l < g.layers; l++)
        for (uint32_t b = 0; b < nb; b++, expect += slot)
            ck_assert_uint_eq(geometry_offset(&g, nb, l, 0, b), expect);
    ck_assert_uint_eq(expect, nb * geometry_block_bytes(&g));
    /* half the bytes of the same pool as MHA with one head of that width */
    geometry_t mha = {
        .layers = 3, .kv_heads = 1, .head_dim = 8, .dtype = GEOMETRY_FP16, .block_tokens = 4};
    ck_assert_uint_eq(geometry_block_bytes(&mha), 2 * geometry_block_bytes(&g));
    ck_assert_uint_eq(geometry_offset(&mha, nb, 1, 0, 0), 2 * geometry_offset(&g, nb, 1, 0, 0));
    geometry_t v3;
    ck_assert_int_eq(geometry_preset("deepseek-v3", &v3), 0);
    ck_assert_uint_eq(geometry_offset(&v3, 28000, 60, 0, 27999), (60ull * 28000 + 27999) * 18432);
}
END_TEST

START_TEST(budget_and_plan)
{
    geometry_t g = llama70(GEOMETRY_BF16);
    ck_assert_uint_eq(geometry_blocks_for_budget(&g, 70000000000ull), 13351);
    ck_assert_uint_eq(geometry_blocks_for_budget(&g, (5u << 20) - 1), 0);
    ck_assert_uint_eq(geometry_blocks_for_budget(&g, 5u << 20), 1);
    geometry_plan_t p;
    ck_assert_int_eq(geometry_plan(&g, 70000000000ull, &p), 0);
    ck_assert_uint_eq(p.bytes_per_token, 327680);
    ck_assert_uint_eq(p.block_bytes, 5242880);
    ck_assert_uint_eq(p.slot_bytes, 32768);
    ck_assert_uint_eq(p.blocks, 13351);
    ck_assert_uint_eq(p.pool_bytes, 13351ull * 5242880);
    ck_assert_uint_eq(p.tokens, 13351ull * 16);
    ck_assert_int_eq(geometry_plan(&g, 1000, &p), KVS_EINVAL);
}
END_TEST

static Suite *geometry_suite(void)
{
    Suite *s = suite_create("geometry");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, dtype_sizes_and_names);
    tcase_add_test(tc, dtype_parse);
    tcase_add_test(tc, validate);
    tcase_add_test(tc, arithmetic_llama_70b);
    tcase_add_test(tc, presets);
    tcase_add_test(tc, layout_offsets);
    tcase_add_test(tc, mla_arithmetic);
    tcase_add_test(tc, mla_layout_offsets);
    tcase_add_test(tc, budget_and_plan);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(geometry_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
