/*
 * geometry: KV arithmetic and the pool layout, in one place that the daemon,
 * the client and the tests share.
 *
 *     bytes_per_token = 2 (K, V) x layers x kv_heads x head_dim x dtype_bytes
 *     block_bytes     = bytes_per_token x block_tokens
 *
 * Pool layout: one region laid out [layer][k|v][block][token][kv_head][head_dim],
 * so layer l is one contiguous [2, num_blocks, block_tokens, kv_heads, head_dim]
 * tensor, and block b names the same slot in every layer:
 *
 *     offset(l, kv, b) = ((l * 2 + kv) * num_blocks + b) * slot_bytes
 *     slot_bytes       = block_tokens x kv_heads x head_dim x dtype_bytes
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

typedef struct geometry {
    uint32_t layers;
    uint32_t kv_heads;
    uint32_t head_dim;
    geometry_dtype_t dtype;
    uint32_t block_tokens; /* default 16 */
} geometry_t;

/* Bytes of one element of dtype (fp8: 1). 0 for an unknown dtype. */
uint32_t geometry_dtype_bytes(geometry_dtype_t dtype);

/* "fp32", "fp16", "bf16", "fp8"; NULL for an unknown dtype. */
const char *geometry_dtype_name(geometry_dtype_t dtype);

/* Parses a dtype name (also "float32", "float16", "bfloat16", "fp8_e4m3").
 * Errors: KVS_EINVAL. */
int geometry_dtype_parse(const char *name, geometry_dtype_t *out);

/* Every field set and non-zero, dtype known, and block_bytes fits in 63 bits.
 * Returns 0 or KVS_EINVAL. */
int geometry_validate(const geometry_t *g);

uint64_t geometry_bytes_per_token(const geometry_t *g);
uint64_t geometry_block_bytes(const geometry_t *g); /* all layers, K and V */
uint64_t geometry_slot_bytes(const geometry_t *g);  /* one layer, K or V, one block */

/* Byte offset of block b's K (kv = 0) or V (kv = 1) in layer l of a pool of
 * num_blocks blocks. The one layout function of kvshare. */
static inline uint64_t geometry_offset(const geometry_t *g, uint32_t num_blocks, uint32_t layer,
                                       uint32_t kv, uint32_t block)
{
    return (((uint64_t)layer * 2 + kv) * num_blocks + block) * geometry_slot_bytes(g);
}

/* Named model presets ("llama-3.1-8b", "llama-3.1-70b", ...), block_tokens 16,
 * dtype bf16. Errors: KVS_ENOTFOUND. */
int geometry_preset(const char *name, geometry_t *out);

/* The i-th preset's name, NULL past the end: for listing them. */
const char *geometry_preset_name(size_t i);

/* Blocks that fit in budget_bytes: floor(budget / block_bytes). */
uint64_t geometry_blocks_for_budget(const geometry_t *g, uint64_t budget_bytes);

#endif /* KVS_GEOMETRY_H */
