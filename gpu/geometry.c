/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV arithmetic and model presets, shared by the daemon, the client and the
 * capacity planner. See geometry.h for the layout.
 */
#include "geometry.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct geometry_dtype_info {
    const char *name;
    uint32_t bytes;
    const char *aliases[3];
} geometry_dtype_info_t;

static const geometry_dtype_info_t dtype_table[] = {
    [GEOMETRY_FP32] = {"fp32", 4, {"float32", "f32", NULL}},
    [GEOMETRY_FP16] = {"fp16", 2, {"float16", "f16", "half"}},
    [GEOMETRY_BF16] = {"bf16", 2, {"bfloat16", NULL, NULL}},
    [GEOMETRY_FP8] = {"fp8", 1, {"fp8_e4m3", "fp8_e5m2", "float8"}},
};
#define DTYPE_COUNT (sizeof(dtype_table) / sizeof(dtype_table[0]))

/* Model shapes from the models' published configs: num_hidden_layers,
 * num_key_value_heads and hidden_size / num_attention_heads; for MLA models
 * num_hidden_layers, kv_lora_rank and qk_rope_head_dim. */
typedef struct geometry_preset_entry {
    const char *name;
    uint32_t layers, kv_heads, head_dim;
    uint32_t kv_lora_rank, rope_head_dim; /* MLA */
} geometry_preset_entry_t;

static const geometry_preset_entry_t preset_table[] = {
    {"llama-3.1-8b", 32, 8, 128, 0, 0},    {"llama-3.1-70b", 80, 8, 128, 0, 0},
    {"llama-3.1-405b", 126, 8, 128, 0, 0}, {"llama-3.2-1b", 16, 8, 64, 0, 0},
    {"llama-3.2-3b", 28, 8, 128, 0, 0},    {"llama-3.3-70b", 80, 8, 128, 0, 0},
    {"qwen2.5-0.5b", 24, 2, 64, 0, 0},     {"qwen2.5-1.5b", 28, 2, 128, 0, 0},
    {"qwen2.5-7b", 28, 4, 128, 0, 0},      {"qwen2.5-14b", 48, 8, 128, 0, 0},
    {"qwen2.5-32b", 64, 8, 128, 0, 0},     {"qwen2.5-72b", 80, 8, 128, 0, 0},
    {"mistral-7b", 32, 8, 128, 0, 0},      {"mistral-nemo-12b", 40, 8, 128, 0, 0},
    {"mixtral-8x7b", 32, 8, 128, 0, 0},    {"deepseek-v2-lite", 27, 0, 0, 512, 64},
    {"deepseek-v2", 60, 0, 0, 512, 64},    {"deepseek-v3", 61, 0, 0, 512, 64},
    {"deepseek-r1", 61, 0, 0, 512, 64},
};
#define PRESET_COUNT (sizeof(preset_table) / sizeof(preset_table[0]))

uint32_t geometry_dtype_bytes(geometry_dtype_t dtype)
{
    if ((unsigned)dtype >= DTYPE_COUNT)
        return 0;
    return dtype_table[dtype].bytes;
}

const char *geometry_dtype_name(geometry_dtype_t dtype)
{
    if ((unsigned)dtype >= DTYPE_COUNT)
        return NULL;
    return dtype_table[dtype].name;
}

int geometry_dtype_parse(const char *name, geometry_dtype_t *out)
{
    if (name == NULL || out == NULL)
        return KVS_EINVAL;
    for (size_t i = 0; i < DTYPE_COUNT; i++) {
        if (strcasecmp(name, dtype_table[i].name) == 0)
            goto found;
        for (size_t a = 0; a < 3 && dtype_table[i].aliases[a] != NULL; a++)
            if (strcasecmp(name, dtype_table[i].aliases[a]) == 0)
                goto found;
        continue;
    found:
        *out = (geometry_dtype_t)i;
        return 0;
    }
    return KVS_EINVAL;
}

int geometry_validate(const geometry_t *g)
{
    if (g == NULL || g->layers == 0 || g->block_tokens == 0 || geometry_dtype_bytes(g->dtype) == 0)
        return KVS_EINVAL;
    if (geometry_is_mla(g) ? g->kv_heads != 0 || g->head_dim != 0
                           : g->kv_heads == 0 || g->head_dim == 0 || g->rope_head_dim != 0)
        return KVS_EINVAL;
    /* Each factor is below 2^33; check the product step by step so that no
     * intermediate wraps before we compare it with 2^63. */
    const uint64_t limit = UINT64_C(1) << 63;
    uint64_t v = (uint64_t)geometry_planes(g) * g->layers; /* < 2^33 */
    const uint64_t factors[] = {
        geometry_is_mla(g) ? geometry_token_width(g) : g->kv_heads,
        geometry_is_mla(g) ? 1 : g->head_dim,
        geometry_dtype_bytes(g->dtype),
        g->block_tokens,
    };
    for (size_t i = 0; i < sizeof(factors) / sizeof(factors[0]); i++) {
        if (v > (limit - 1) / factors[i])
            return KVS_EINVAL;
        v *= factors[i];
    }
    return 0;
}

uint64_t geometry_bytes_per_token(const geometry_t *g)
{
    return (uint64_t)geometry_planes(g) * g->layers * geometry_token_width(g) *
           geometry_dtype_bytes(g->dtype);
}

uint64_t geometry_block_bytes(const geometry_t *g)
{
    return geometry_bytes_per_token(g) * g->block_tokens;
}

uint64_t geometry_slot_bytes(const geometry_t *g)
{
    return (uint64_t)g->block_tokens * geometry_token_width(g) * geometry_dtype_bytes(g->dtype);
}

int geometry_describe(const geometry_t *g, char *buf, size_t len)
{
    if (geometry_validate(g) != 0 || (buf == NULL && len != 0))
        return KVS_EINVAL;
    int n;
    if (geometry_is_mla(g))
        n = snprintf(buf, len,
                     "%" PRIu32 " layers x (%" PRIu32 " kv_lora_rank + %" PRIu32
                     " rope_head_dim) %s, MLA",
                     g->layers, g->kv_lora_rank, g->rope_head_dim, geometry_dtype_name(g->dtype));
    else
        n = snprintf(buf, len,
                     "%" PRIu32 " layers x %" PRIu32 " kv_heads x %" PRIu32 " head_dim %s",
                     g->layers, g->kv_heads, g->head_dim, geometry_dtype_name(g->dtype));
    return n < 0 ? KVS_EINVAL : n;
}

/* "meta-llama/Llama-3.1-70B" names the same preset as "llama-3.1-70b". */
static const char *preset_basename(const char *name)
{
    const char *slash = strrchr(name, '/');
    return slash != NULL ? slash + 1 : name;
}

int geometry_preset(const char *name, geometry_t *out)
{
    if (name == NULL || out == NULL)
        return KVS_EINVAL;
    const char *base = preset_basename(name);
    for (size_t i = 0; i < PRESET_COUNT; i++) {
        if (strcasecmp(base, preset_table[i].name) != 0)
            continue;
        memset(out, 0, sizeof(*out));
        out->layers = preset_table[i].layers;
        out->kv_heads = preset_table[i].kv_heads;
        out->head_dim = preset_table[i].head_dim;
        out->kv_lora_rank = preset_table[i].kv_lora_rank;
        out->rope_head_dim = preset_table[i].rope_head_dim;
        out->dtype = GEOMETRY_BF16;
        out->block_tokens = 16;
        return 0;
    }
    return KVS_ENOTFOUND;
}

const char *geometry_preset_name(size_t i)
{
    return i < PRESET_COUNT ? preset_table[i].name : NULL;
}

uint64_t geometry_blocks_for_budget(const geometry_t *g, uint64_t budget_bytes)
{
    if (geometry_validate(g) != 0)
        return 0;
    return budget_bytes / geometry_block_bytes(g);
}

uint64_t geometry_seq_bytes(const geometry_t *g, uint64_t ctx_tokens)
{
    if (geometry_validate(g) != 0)
        return 0;
    uint64_t blocks = ctx_tokens / g->block_tokens + (ctx_tokens % g->block_tokens != 0);
    uint64_t block_bytes = geometry_block_bytes(g);
    /* Saturate rather than wrap for absurd lengths. */
    if (blocks > UINT64_MAX / block_bytes)
        return UINT64_MAX;
    return blocks * block_bytes;
}

uint64_t geometry_seqs_for_budget(const geometry_t *g, uint64_t budget_bytes, uint64_t ctx_tokens)
{
    if (geometry_validate(g) != 0 || ctx_tokens == 0)
        return 0;
    uint64_t per_seq = ctx_tokens / g->block_tokens + (ctx_tokens % g->block_tokens != 0);
    return geometry_blocks_for_budget(g, budget_bytes) / per_seq;
}

int geometry_derive_budget(uint64_t gpu_memory, double utilization, uint64_t weights,
                           uint64_t overhead, uint64_t *usable, uint64_t *budget)
{
    if (usable == NULL || budget == NULL || !(utilization > 0) || utilization > 1)
        return KVS_EINVAL;
    /* utilization <= 1: the product never exceeds gpu_memory, but the double
     * may round up past UINT64_MAX for the largest inputs. */
    double u = (double)gpu_memory * utilization + 0.5; /* rounds: truncated below */
    uint64_t use = u >= 18446744073709551615.0 ? gpu_memory : (uint64_t)u;
    if (use > gpu_memory)
        use = gpu_memory;
    if (weights >= use || overhead >= use - weights)
        return KVS_EINVAL;
    *usable = use;
    *budget = use - weights - overhead;
    return 0;
}

int geometry_plan(const geometry_t *g, uint64_t budget_bytes, geometry_plan_t *out)
{
    if (out == NULL || geometry_validate(g) != 0)
        return KVS_EINVAL;
    uint64_t blocks = geometry_blocks_for_budget(g, budget_bytes);
    if (blocks == 0)
        return KVS_EINVAL;
    /* Block ids are 32-bit. */
    if (blocks > UINT32_MAX)
        blocks = UINT32_MAX;
    out->bytes_per_token = geometry_bytes_per_token(g);
    out->block_bytes = geometry_block_bytes(g);
    out->slot_bytes = geometry_slot_bytes(g);
    out->budget_bytes = budget_bytes;
    out->blocks = blocks;
    out->pool_bytes = blocks * out->block_bytes;
    out->tokens = blocks * g->block_tokens;
    return 0;
}
