/* SPDX-License-Identifier: Apache-2.0 */
/*
 * geometry: KV arithmetic and the pool layout, in one place that the daemon,
 * the client and the tests share.
 *
 *     bytes_per_token = planes x layers x token_width x dtype_bytes
 *     block_bytes     = bytes_per_token x block_tokens
 *
 * Two kinds of attention cache:
 *  - multi-head (MHA, GQA, MQA): K and V per layer, planes = 2,
 *    token_width = kv_heads x head_dim;
 *  - multi-head latent attention (MLA: DeepSeek-V2/V3): one compressed latent
 *    per token and layer, shared by every head and holding what K and V are
 *    rebuilt from, planes = 1, token_width = kv_lora_rank + rope_head_dim
 *    (the latent and the decoupled RoPE key, stored side by side as vLLM does).
 *
 * Pool layout: one region laid out [layer][plane][block][token][width], so
 * layer l is one contiguous [planes, num_blocks, block_tokens, width] tensor,
 * and block b names the same slot in every layer:
 *
 *     offset(l, plane, b) = ((l * planes + plane) * num_blocks + b) * slot_bytes
 *     slot_bytes          = block_tokens x token_width x dtype_bytes
 *
 * For MHA plane 0 is K and plane 1 is V ([layer][k|v][block][token][kv_head]
 * [head_dim]); an MLA block is one latent slot per layer.
 */
#ifndef KVS_GEOMETRY_H
#define KVS_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare_status.h"

typedef enum geometry_dtype {
    GEOMETRY_FP32,
    GEOMETRY_FP16,
    GEOMETRY_BF16,
    GEOMETRY_FP8,
} geometry_dtype_t;

/* Either kv_heads and head_dim (MHA) or kv_lora_rank (MLA) are set, never
 * both: kv_lora_rank != 0 makes the geometry MLA. */
typedef struct geometry {
    uint32_t layers;
    uint32_t kv_heads; /* MHA; 0 for MLA */
    uint32_t head_dim; /* MHA; 0 for MLA */
    geometry_dtype_t dtype;
    uint32_t block_tokens;  /* default 16 */
    uint32_t kv_lora_rank;  /* MLA: width of the compressed latent; 0 for MHA */
    uint32_t rope_head_dim; /* MLA: width of the decoupled RoPE key (may be 0); 0 for MHA */
} geometry_t;

/* Bytes of one element of dtype (fp8: 1). 0 for an unknown dtype. */
uint32_t geometry_dtype_bytes(geometry_dtype_t dtype);

/* "fp32", "fp16", "bf16", "fp8"; NULL for an unknown dtype. */
const char *geometry_dtype_name(geometry_dtype_t dtype);

/* Parses a dtype name (also "float32", "float16", "bfloat16", "fp8_e4m3").
 * Errors: KVS_EINVAL. */
int geometry_dtype_parse(const char *name, geometry_dtype_t *out);

/* layers, block_tokens and a known dtype; for MHA kv_heads and head_dim
 * non-zero and no MLA field; for MLA kv_lora_rank non-zero and no head field;
 * and block_bytes fits in 63 bits. Returns 0 or KVS_EINVAL. */
int geometry_validate(const geometry_t *g);

/* 1 for an MLA geometry (kv_lora_rank != 0), else 0. */
static inline int geometry_is_mla(const geometry_t *g)
{
    return g->kv_lora_rank != 0;
}

/* Slots per layer and block: 2 (K and V) for MHA, 1 (the latent) for MLA. */
static inline uint32_t geometry_planes(const geometry_t *g)
{
    return geometry_is_mla(g) ? 1 : 2;
}

/* Elements one token stores in one slot: kv_heads x head_dim, or
 * kv_lora_rank + rope_head_dim for MLA. */
static inline uint64_t geometry_token_width(const geometry_t *g)
{
    return geometry_is_mla(g) ? (uint64_t)g->kv_lora_rank + g->rope_head_dim
                              : (uint64_t)g->kv_heads * g->head_dim;
}

uint64_t geometry_bytes_per_token(const geometry_t *g);
uint64_t geometry_block_bytes(const geometry_t *g); /* all layers and planes */
uint64_t geometry_slot_bytes(const geometry_t *g);  /* one layer, one plane, one block */

/* Byte offset of block b's plane (MHA: K = 0, V = 1; MLA: only 0) in layer l
 * of a pool of num_blocks blocks. The one layout function of kvshare; callers
 * check plane < geometry_planes(g). */
static inline uint64_t geometry_offset(const geometry_t *g, uint32_t num_blocks, uint32_t layer,
                                       uint32_t plane, uint32_t block)
{
    return (((uint64_t)layer * geometry_planes(g) + plane) * num_blocks + block) *
           geometry_slot_bytes(g);
}

/* Writes the shape into buf (always NUL-terminated): "80 layers x 8 kv_heads
 * x 128 head_dim bf16" or "61 layers x (512 kv_lora_rank + 64 rope_head_dim)
 * fp8, MLA". Returns the length it needed (like snprintf) or KVS_EINVAL. */
int geometry_describe(const geometry_t *g, char *buf, size_t len);

/* Named model presets ("llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", ...),
 * block_tokens 16, dtype bf16. Errors: KVS_ENOTFOUND. */
int geometry_preset(const char *name, geometry_t *out);

/* The i-th preset's name, NULL past the end: for listing them. */
const char *geometry_preset_name(size_t i);

/* Blocks that fit in budget_bytes: floor(budget / block_bytes). */
uint64_t geometry_blocks_for_budget(const geometry_t *g, uint64_t budget_bytes);

/* Bytes of the KV of one sequence of ctx_tokens tokens, counted in whole blocks
 * (ceil(ctx_tokens / block_tokens) blocks), since the pool hands out blocks.
 * 0 for an invalid geometry; UINT64_MAX where the product would not fit. */
uint64_t geometry_seq_bytes(const geometry_t *g, uint64_t ctx_tokens);

/* Sequences of ctx_tokens tokens that fit at once in a pool of budget_bytes:
 * floor(pool blocks / blocks per sequence). 0 when ctx_tokens is 0. */
uint64_t geometry_seqs_for_budget(const geometry_t *g, uint64_t budget_bytes, uint64_t ctx_tokens);

/* The KV budget of a node, the way serving engines size their cache (vLLM's
 * gpu_memory_utilization):
 *
 *     usable = gpu_memory x utilization      (rounded to the byte)
 *     budget = usable - weights - overhead
 *
 * Fills *usable and *budget. Errors: KVS_EINVAL (utilization not in (0, 1],
 * a NULL output, or weights and overhead leave nothing for the KV). */
int geometry_derive_budget(uint64_t gpu_memory, double utilization, uint64_t weights,
                           uint64_t overhead, uint64_t *usable, uint64_t *budget);

/* The arithmetic behind a pool of budget_bytes, for the daemon to log and the
 * capacity planner to print. */
typedef struct geometry_plan {
    uint64_t bytes_per_token;
    uint64_t block_bytes;
    uint64_t slot_bytes;
    uint64_t budget_bytes;
    uint64_t blocks;     /* floor(budget / block_bytes), capped at UINT32_MAX */
    uint64_t pool_bytes; /* blocks x block_bytes: what the pool really uses */
    uint64_t tokens;     /* blocks x block_tokens: tokens the pool holds */
} geometry_plan_t;

/* Fills out for g and budget_bytes. Errors: KVS_EINVAL (g invalid, or not even
 * one block fits in the budget). */
int geometry_plan(const geometry_t *g, uint64_t budget_bytes, geometry_plan_t *out);

#endif /* KVS_GEOMETRY_H */
