/* SPDX-License-Identifier: Apache-2.0 */
/*
 * model: a small decoder-only transformer whose attention reads and writes its
 * KV in kvshare's pool layout (see kvstore.h).
 *
 *     tokens -> embed -> layers x [ RMSNorm -> Q K V (GQA) -> RoPE
 *                                   -> K, V written to the request's blocks
 *                                   -> paged attention over the blocks -> Wo (+)
 *                                   RMSNorm -> SwiGLU MLP (+) ]
 *            -> RMSNorm -> output head -> logits
 *
 * Weights come from a fixed seed (splitmix64), scaled so that activations keep
 * a unit-ish scale. Compute and KV are fp32, single-threaded.
 *
 * Determinism is the point of this model: a token's result is a function of
 * its position, its own token and the KV values of earlier positions only.
 * Every reduction runs in a fixed order that depends on neither the batch a
 * token is computed in, nor the block ids its KV lives in. So a prompt
 * computed in one pass, in chunks, or resumed on top of KV written by another
 * process (shared blocks) gives bitwise-identical KV and logits.
 */
#ifndef KVS_WORKER_MODEL_H
#define KVS_WORKER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "geometry.h"
#include "kvshare_status.h"
#include "kvstore.h"

/* Width of the weight panels: matrices are stored in panels of this many
 * output columns (see model_w). Every output dimension is a multiple of it. */
#define MODEL_PANEL 8

typedef struct model_config {
    uint32_t layers;
    uint32_t d_model;
    uint32_t heads;    /* query heads */
    uint32_t kv_heads; /* heads divides evenly into kv_heads groups */
    uint32_t head_dim; /* a multiple of 8 */
    uint32_t vocab;
    uint32_t hidden; /* SwiGLU hidden size */
    uint32_t block_tokens;
    float rope_theta;
    float norm_eps;
    uint64_t seed;
} model_config_t;

/* One layer's weights. A matrix of K inputs and N outputs is stored as N /
 * MODEL_PANEL panels of [K][MODEL_PANEL]: element (k, j) is model_w(w, K, k, j). */
typedef struct model_layer {
    float *attn_norm; /* [d_model] */
    float *wq;        /* d_model -> heads x head_dim */
    float *wk;        /* d_model -> kv_heads x head_dim */
    float *wv;        /* d_model -> kv_heads x head_dim */
    float *wo;        /* heads x head_dim -> d_model */
    float *mlp_norm;  /* [d_model] */
    float *w_gate;    /* d_model -> hidden */
    float *w_up;      /* d_model -> hidden */
    float *w_down;    /* hidden -> d_model */
} model_layer_t;

typedef struct model {
    model_config_t cfg;
    float *embed;      /* [vocab][d_model], row-major */
    float *final_norm; /* [d_model] */
    float *head;       /* [vocab][d_model], row-major: logit v = head[v] . h */
    float logit_scale; /* 1 / sqrt(d_model): keeps logits near unit scale */
    model_layer_t *layer;
    float *rope_inv_freq; /* [head_dim / 2] */
    float *arena;         /* every weight above lives here */
} model_t;

/* Element (k, j) of a panel-stored matrix with K inputs. */
static inline float model_w(const float *w, uint32_t K, uint32_t k, uint32_t j)
{
    return w[((uint64_t)(j / MODEL_PANEL) * K + k) * MODEL_PANEL + j % MODEL_PANEL];
}

/* The reference model: 4 layers, d_model 512, 8 query heads, 2 KV heads, head
 * dim 64, vocab 4096, hidden 1024, block_tokens 16, seed 42. */
void model_config_default(model_config_t *cfg);

/* A tiny model with the same structure, for fast tests: 2 layers, d_model 64,
 * 4 query heads, 2 KV heads, head dim 16, vocab 256, hidden 128. */
void model_config_small(model_config_t *cfg);

/* The small model with 8 query and 4 KV heads, so that a tensor-parallel
 * group of 2 or 4 ranks splits its KV heads (model_forward_tp). */
void model_config_small_tp(model_config_t *cfg);

/* Fills cfg from a preset name: "default", "small" or "small-tp". Errors: KVS_EINVAL,
 * KVS_ENOTFOUND. */
int model_config_preset(const char *name, model_config_t *cfg);

/* Checks that every dimension is usable. Returns 0 or KVS_EINVAL. */
int model_config_validate(const model_config_t *cfg);

/* The KV geometry of a config: fp32, its layers, kv_heads, head_dim and
 * block_tokens. */
void model_config_geometry(const model_config_t *cfg, geometry_t *out);

/* Builds a model with weights drawn from cfg->seed. The caller frees *out with
 * model_free. Errors: KVS_EINVAL (a bad config), KVS_ENOMEM. */
int model_new(const model_config_t *cfg, model_t **out);

/* Accepts NULL. */
void model_free(model_t *m);

/* Computes tokens[0..count) at positions [start, start + count) of a sequence
 * whose KV lives in the blocks of block_table (block i holds positions
 * [i * block_tokens, (i + 1) * block_tokens)). Positions below start must
 * already hold their KV in those blocks; this call writes the KV of the count
 * positions into them. Prefill is one call with the prompt; decode is one call
 * per token.
 *
 * When logits is not NULL it receives the vocab logits of the last position.
 * Errors: KVS_EINVAL (NULL, count 0, a token >= vocab, a block id out of range,
 * a block table too short for start + count, a store whose geometry is not the
 * model's), KVS_ENOMEM. */
int model_forward(const model_t *m, const kvstore_t *ks, const uint32_t *block_table,
                  uint32_t table_len, const uint32_t *tokens, uint32_t start, uint32_t count,
                  float *logits);

/* model_forward for a tensor-parallel group of tp ranks, simulated in one
 * process: rank r keeps the KV of its kv_heads / tp heads in ks[r] (each
 * store a shard: the model's geometry with kv_heads / tp heads, the same
 * block count and block ids as the others), computes those heads' Q, K, V
 * and attention, and the outputs are gathered before Wo. The logits and
 * every KV value are bitwise those of the one-rank pass (tp 1: ks[0] holds
 * every head), so a group's shards put side by side are the one-rank KV.
 * Errors: model_forward's, and KVS_EINVAL when tp is 0, does not divide
 * kv_heads, or a store is not a rank's shard of this model. */
int model_forward_tp(const model_t *m, const kvstore_t *const *ks, uint32_t tp,
                     const uint32_t *block_table, uint32_t table_len, const uint32_t *tokens,
                     uint32_t start, uint32_t count, float *logits);

/* Index of the largest logit, the lowest index on a tie (greedy decoding). */
uint32_t model_argmax(const float *logits, uint32_t vocab);

#endif /* KVS_WORKER_MODEL_H */
