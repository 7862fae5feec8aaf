/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The forward pass. Bitwise reproducibility rules, kept by every kernel here:
 *  - each output element is accumulated from zero, over its inputs in index
 *    order (matmul, matmul_row: a token's row never mixes with another
 *    token's; tiles only decide which accumulators share registers);
 *  - attention walks positions 0..p in order, whatever block each lives in;
 *  - no kernel depends on the chunk or batch a token is computed in: a token
 *    in a 4-row tile and a token alone do the same operations in the same order;
 *  - element-wise vector arithmetic only (vec4_t): each lane is the scalar op.
 * Without FP contraction (-ffp-contract=off) these give the same bits for a
 * token computed alone, in a batch, or resumed on top of KV written by another
 * process.
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tokens computed together: bounds scratch memory, never changes results. */
#define MODEL_CHUNK 64
/* Tokens per matmul tile: 4 x MODEL_PANEL accumulators in registers. */
#define MM_TOKENS 4

void model_config_default(model_config_t *cfg)
{
    *cfg = (model_config_t){
        .layers = 4,
        .d_model = 512,
        .heads = 8,
        .kv_heads = 2,
        .head_dim = 64,
        .vocab = 4096,
        .hidden = 1024,
        .block_tokens = 16,
        .rope_theta = 10000.0f,
        .norm_eps = 1e-5f,
        .seed = 42,
    };
}

void model_config_small(model_config_t *cfg)
{
    *cfg = (model_config_t){
        .layers = 2,
        .d_model = 64,
        .heads = 4,
        .kv_heads = 2,
        .head_dim = 16,
        .vocab = 256,
        .hidden = 128,
        .block_tokens = 16,
        .rope_theta = 10000.0f,
        .norm_eps = 1e-5f,
        .seed = 7,
    };
}

void model_config_small_tp(model_config_t *cfg)
{
    model_config_small(cfg);
    cfg->heads = 8;
    cfg->kv_heads = 4;
}

int model_config_preset(const char *name, model_config_t *cfg)
{
    if (!name || !cfg)
        return KVS_EINVAL;
    if (!strcmp(name, "default"))
        model_config_default(cfg);
    else if (!strcmp(name, "small"))
        model_config_small(cfg);
    else if (!strcmp(name, "small-tp"))
        model_config_small_tp(cfg);
    else
        return KVS_ENOTFOUND;
    return 0;
}

int model_config_validate(const model_config_t *c)
{
    if (!c || !c->layers || !c->d_model || !c->heads || !c->kv_heads || !c->head_dim || !c->vocab ||
        !c->hidden || !c->block_tokens)
        return KVS_EINVAL;
    /* dot() and the attention kernels work in steps of 8 floats. */
    if (c->heads % c->kv_heads || c->head_dim % 8)
        return KVS_EINVAL;
    if (c->d_model % MODEL_PANEL || c->hidden % MODEL_PANEL ||
        (c->heads * c->head_dim) % MODEL_PANEL || (c->kv_heads * c->head_dim) % MODEL_PANEL)
        return KVS_EINVAL;
    /* Keeps every size computed below well inside 32-bit element counts. */
    if (c->d_model > 65536 || c->hidden > 262144 || c->heads > 1024 || c->head_dim > 1024 ||
        c->vocab > (1u << 24) || c->layers > 1024 || c->block_tokens > 4096)
        return KVS_EINVAL;
    if (!(c->rope_theta > 1.0f) || !(c->norm_eps > 0.0f))
        return KVS_EINVAL;
    return 0;
}

void model_config_geometry(const model_config_t *cfg, geometry_t *out)
{
    *out = (geometry_t){
        .layers = cfg->layers,
        .kv_heads = cfg->kv_heads,
        .head_dim = cfg->head_dim,
        .dtype = GEOMETRY_FP32,
        .block_tokens = cfg->block_tokens,
    };
}

/* ---- weights ------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1): 24 random bits, exact in a float. */
static float uniform_pm1(uint64_t *state)
{
    return (float)(splitmix64(state) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* Uniform in [-a, a] with a = gain * sqrt(3 / fan_in): variance gain^2 / fan_in,
 * so a unit-variance input gives a gain^2-variance output. */
static void fill_uniform(float *w, uint64_t n, uint32_t fan_in, float gain, uint64_t *state)
{
    float a = gain * sqrtf(3.0f / (float)fan_in);

    for (uint64_t i = 0; i < n; i++)
        w[i] = a * uniform_pm1(state);
}

static void fill_norm(float *w, uint32_t n, uint64_t *state)
{
    for (uint32_t i = 0; i < n; i++)
        w[i] = 1.0f + 0.1f * uniform_pm1(state);
}

int model_new(const model_config_t *cfg, model_t **out)
{
    model_t *m = NULL;
    uint64_t state, total, d, qd, kvd, hid, per_layer;
    float *p, resid_gain;
    int rc;

    if (!out || model_config_validate(cfg) < 0)
        return KVS_EINVAL;
    d = cfg->d_model;
    qd = (uint64_t)cfg->heads * cfg->head_dim;
    kvd = (uint64_t)cfg->kv_heads * cfg->head_dim;
    hid = cfg->hidden;
    per_layer = 2 * d + d * qd + 2 * d * kvd + qd * d + 2 * d * hid + hid * d;
    total = 2 * (uint64_t)cfg->vocab * d + d + cfg->layers * per_layer + cfg->head_dim / 2;

    m = calloc(1, sizeof(*m));
    if (!m)
        return KVS_ENOMEM;
    m->cfg = *cfg;
    m->layer = calloc(cfg->layers, sizeof(*m->layer));
    m->arena = malloc(total * sizeof(float));
    if (!m->layer || !m->arena) {
        rc = KVS_ENOMEM;
        goto fail;
    }

    /* Draw order is part of the model's identity: never reorder. */
    state = cfg->seed;
    p = m->arena;
    m->embed = p;
    fill_uniform(p, cfg->vocab * d, 1, 1.0f, &state);
    p += cfg->vocab * d;
    m->final_norm = p;
    fill_norm(p, (uint32_t)d, &state);
    p += d;
    /* Unit-variance rows: with the 1/sqrt(d) logit scale, logits ~ N(0, 1). An
     * untied head keeps greedy decoding from echoing the input token. */
    m->head = p;
    fill_uniform(p, cfg->vocab * d, 1, 1.0f, &state);
    p += cfg->vocab * d;
    /* Each residual branch adds a slice of variance: the stream grows by
     * about 2x over the whole stack, and RMSNorm absorbs the rest. */
    resid_gain = 1.0f / sqrtf(2.0f * (float)cfg->layers);
    for (uint32_t l = 0; l < cfg->layers; l++) {
        model_layer_t *ly = &m->layer[l];
        ly->attn_norm = p;
        fill_norm(p, (uint32_t)d, &state);
        p += d;
        ly->wq = p;
        fill_uniform(p, d * qd, (uint32_t)d, 1.0f, &state);
        p += d * qd;
        ly->wk = p;
        fill_uniform(p, d * kvd, (uint32_t)d, 1.0f, &state);
        p += d * kvd;
        ly->wv = p;
        fill_uniform(p, d * kvd, (uint32_t)d, 1.0f, &state);
        p += d * kvd;
        ly->wo = p;
        fill_uniform(p, qd * d, (uint32_t)qd, resid_gain, &state);
        p += qd * d;
        ly->mlp_norm = p;
        fill_norm(p, (uint32_t)d, &state);
        p += d;
        ly->w_gate = p;
        fill_uniform(p, d * hid, (uint32_t)d, 1.0f, &state);
        p += d * hid;
        ly->w_up = p;
        fill_uniform(p, d * hid, (uint32_t)d, 1.0f, &state);
        p += d * hid;
        ly->w_down = p;
        fill_uniform(p, hid * d, (uint32_t)hid, resid_gain, &state);
        p += hid * d;
    }
    m->rope_inv_freq = p;
    for (uint32_t i = 0; i < cfg->head_dim / 2; i++)
        p[i] = (float)pow((double)cfg->rope_theta, -2.0 * i / (double)cfg->head_dim);
    m->logit_scale = 1.0f / sqrtf((float)d);
    *out = m;
    return 0;
fail:
    model_free(m);
    return rc;
}

void model_free(model_t *m)
{
    if (!m)
        return;
    free(m->arena);
    free(m->layer);
    free(m);
}

/* ---- kernels ------------------------------------------------------------ */

/* Four floats: element-wise arithmetic only, so each lane computes exactly
 * what the scalar loop would (GCC/Clang vector extension; 16 bytes maps to
 * SSE2 on any x86-64 and to NEON on arm64). */
typedef float vec4_t __attribute__((vector_size(16)));

static vec4_t vec4_load(const float *p)
{
    vec4_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static void vec4_store(float *p, vec4_t v)
{
    memcpy(p, &v, sizeof(v));
}

/* Eight running sums (lane l adds a[i + l] * b[i + l] for i = 0, 8, 16...),
 * combined in a fixed tree: the order never depends on where a and b live.
 * n is a multiple of 8 (model_config_validate). */
static inline float dot(const float *a, const float *b, uint32_t n)
{
    vec4_t lo = {0}, hi = {0};

    for (uint32_t i = 0; i < n; i += 8) {
        lo += vec4_load(a + i) * vec4_load(b + i);
        hi += vec4_load(a + i + 4) * vec4_load(b + i + 4);
    }
    return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3]));
}

#define MM_ROW(xr, lo, hi)                                                                         \
    do {                                                                                           \
        float xv_ = (xr)[k];                                                                       \
        lo += xv_ * w_lo;                                                                          \
        hi += xv_ * w_hi;                                                                          \
    } while (0)

#define MM_PANEL(p, lo, hi)                                                                        \
    do {                                                                                           \
        lo += xv * vec4_load((p) + (uint64_t)k * MODEL_PANEL);                                     \
        hi += xv * vec4_load((p) + (uint64_t)k * MODEL_PANEL + 4);                                 \
    } while (0)

/* y[0..N) = x[0..K) @ W for one token: four panels at a time, so that eight
 * independent accumulators hide the add latency. Per element, the same
 * operations in the same order as matmul()'s tiles. */
static void matmul_row(float *y, const float *x, const float *w, uint32_t K, uint32_t N)
{
    uint64_t stride = (uint64_t)K * MODEL_PANEL;
    uint32_t j0 = 0;

    for (; j0 + 4 * MODEL_PANEL <= N; j0 += 4 * MODEL_PANEL) {
        const float *p0 = w + (uint64_t)(j0 / MODEL_PANEL) * stride, *p1 = p0 + stride;
        const float *p2 = p1 + stride, *p3 = p2 + stride;
        vec4_t a0l = {0}, a0h = {0}, a1l = {0}, a1h = {0};
        vec4_t a2l = {0}, a2h = {0}, a3l = {0}, a3h = {0};

        for (uint32_t k = 0; k < K; k++) {
            float xv = x[k];
            MM_PANEL(p0, a0l, a0h);
            MM_PANEL(p1, a1l, a1h);
            MM_PANEL(p2, a2l, a2h);
            MM_PANEL(p3, a3l, a3h);
        }
        vec4_store(y + j0, a0l), vec4_store(y + j0 + 4, a0h);
        vec4_store(y + j0 + 8, a1l), vec4_store(y + j0 + 12, a1h);
        vec4_store(y + j0 + 16, a2l), vec4_store(y + j0 + 20, a2h);
        vec4_store(y + j0 + 24, a3l), vec4_store(y + j0 + 28, a3h);
    }
    for (; j0 < N; j0 += MODEL_PANEL) {
        const float *p0 = w + (uint64_t)(j0 / MODEL_PANEL) * stride;
        vec4_t a0l = {0}, a0h = {0};

        for (uint32_t k = 0; k < K; k++) {
            float xv = x[k];
            MM_PANEL(p0, a0l, a0h);
        }
        vec4_store(y + j0, a0l), vec4_store(y + j0 + 4, a0h);
    }
}

#define MM_ROW(xr, lo, hi)                                                                         \
    do {                                                                                           \
        float xv_ = (xr)[k];                                                                       \
        lo += xv_ * w_lo;                                                                          \
        hi += xv_ * w_hi;                                                                          \
    } while (0)

/* y[t][0..N) = x[t][0..K) @ W for t < T; W panel-stored (model_w). Each
 * y[t][j] = sum over k in order of x[t][k] * W(k, j), from 0.0f: a tile of 4
 * tokens x MODEL_PANEL outputs keeps its 8 accumulators in registers, and the
 * rows left over go through matmul_row, which does the same arithmetic. */
static void matmul(float *y, const float *x, const float *w, uint32_t T, uint32_t K, uint32_t N)
{
    uint32_t tiled = T - T % MM_TOKENS;

    _Static_assert(MODEL_PANEL == 8 && MM_TOKENS == 4, "the tile below is 4 x 8");
    for (uint32_t j0 = 0; j0 < N; j0 += MODEL_PANEL) {
        const float *panel = w + (uint64_t)(j0 / MODEL_PANEL) * K * MODEL_PANEL;
        for (uint32_t t0 = 0; t0 < tiled; t0 += MM_TOKENS) {
            const float *x0 = x + (uint64_t)t0 * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
            float *y0 = y + (uint64_t)t0 * N + j0;
            vec4_t a0l = {0}, a0h = {0}, a1l = {0}, a1h = {0};
            vec4_t a2l = {0}, a2h = {0}, a3l = {0}, a3h = {0};

            for (uint32_t k = 0; k < K; k++) {
                vec4_t w_lo = vec4_load(panel + (uint64_t)k * MODEL_PANEL);
                vec4_t w_hi = vec4_load(panel + (uint64_t)k * MODEL_PANEL + 4);
                MM_ROW(x0, a0l, a0h);
                MM_ROW(x1, a1l, a1h);
                MM_ROW(x2, a2l, a2h);
                MM_ROW(x3, a3l, a3h);
            }
            vec4_store(y0, a0l), vec4_store(y0 + 4, a0h);
            vec4_store(y0 + N, a1l), vec4_store(y0 + N + 4, a1h);
            vec4_store(y0 + 2 * N, a2l), vec4_store(y0 + 2 * N + 4, a2h);
            vec4_store(y0 + 3 * N, a3l), vec4_store(y0 + 3 * N + 4, a3h);
        }
    }
    for (uint32_t t = tiled; t < T; t++)
        matmul_row(y + (uint64_t)t * N, x + (uint64_t)t * K, w, K, N);
}

static void rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps)
{
    float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);

    for (uint32_t i = 0; i < n; i++)
        y[i] = x[i] * inv * w[i];
}

/* Rotates the pairs (v[i], v[i + half]) of one head by pos * inv_freq[i]. */
static void rope(float *v, uint32_t head_dim, uint32_t pos, const float *inv_freq)
{
    uint32_t half = head_dim / 2;

    for (uint32_t i = 0; i < half; i++) {
        double angle = (double)pos * (double)inv_freq[i];
        float c = (float)cos(angle), s = (float)sin(angle);
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
    }
}

/* ---- forward -------------------------------------------------------------- */

typedef struct scratch {
    float *x, *xn, *q, *k, *v, *att, *proj, *gate, *up;
    float *scores; /* [group][positions] */
    float *buf;
} scratch_t;

/* Room for chunks of up to `tokens` tokens attending over `positions`. */
static int scratch_new(const model_config_t *c, uint32_t tokens, uint32_t positions, scratch_t *s)
{
    uint64_t C = tokens, d = c->d_model, qd = (uint64_t)c->heads * c->head_dim;
    uint64_t kvd = (uint64_t)c->kv_heads * c->head_dim, hid = c->hidden;
    uint64_t group = c->heads / c->kv_heads;
    uint64_t total = C * (3 * d + 2 * qd + 2 * kvd + 2 * hid) + group * positions;
    float *p = malloc(total * sizeof(float));

    if (!p)
        return KVS_ENOMEM;
    s->buf = p;
    s->x = p, p += C * d;
    s->xn = p, p += C * d;
    s->proj = p, p += C * d;
    s->q = p, p += C * qd;
    s->att = p, p += C * qd;
    s->k = p, p += C * kvd;
    s->v = p, p += C * kvd;
    s->gate = p, p += C * hid;
    s->up = p, p += C * hid;
    s->scores = p;
    return 0;
}

/* Attention of one query token at position pos, all heads of one KV group:
 * q and out hold group heads of head_dim each. Positions 0..pos are read from
 * the blocks in position order. */
static void attend_group(const model_t *m, const kvstore_t *ks, const uint32_t *block_table,
                         uint32_t layer, uint32_t kv_head, uint32_t pos, const float *q, float *out,
                         float *scores)
{
    const model_config_t *c = &m->cfg;
    uint32_t hd = c->head_dim, group = c->heads / c->kv_heads, bt = c->block_tokens;
    uint32_t n = pos + 1;
    float scale = 1.0f / sqrtf((float)hd);

    /* One slot address per block (the layout function is not inlined here),
     * then tokens by stride. */
    for (uint32_t b = 0; b * bt < n; b++) {
        uint32_t in_block = n - b * bt < bt ? n - b * bt : bt;
        const float *kp = kvstore_token(ks, layer, 0, block_table[b], 0) + (uint64_t)kv_head * hd;
        for (uint32_t t = 0; t < in_block; t++, kp += ks->token_floats) {
            uint32_t j = b * bt + t;
            for (uint32_t h = 0; h < group; h++)
                scores[(uint64_t)h * n + j] = dot(q + (uint64_t)h * hd, kp, hd) * scale;
        }
    }
    for (uint32_t h = 0; h < group; h++) {
        float *sc = scores + (uint64_t)h * n;
        float mx = sc[0], sum = 0.0f;
        for (uint32_t j = 1; j < n; j++)
            mx = sc[j] > mx ? sc[j] : mx;
        for (uint32_t j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        for (uint32_t j = 0; j < n; j++)
            sc[j] /= sum; /* normalised before the V sum, as the textbook does */
    }
    /* out[h][i] = sum over j in order of w[h][j] * V[j][i]: eight columns of
     * each head at a time stay in registers across all positions. */
    for (uint32_t i0 = 0; i0 < hd; i0 += 8)
        for (uint32_t h = 0; h < group; h++) {
            const float *w = scores + (uint64_t)h * n;
            vec4_t lo = {0}, hi = {0};
            for (uint32_t b = 0; b * bt < n; b++) {
                uint32_t in_block = n - b * bt < bt ? n - b * bt : bt;
                const float *vp =
                    kvstore_token(ks, layer, 1, block_table[b], 0) + (uint64_t)kv_head * hd + i0;
                for (uint32_t t = 0; t < in_block; t++, vp += ks->token_floats) {
                    float wj = w[b * bt + t];
                    lo += wj * vec4_load(vp);
                    hi += wj * vec4_load(vp + 4);
                }
            }
            vec4_store(out + (uint64_t)h * hd + i0, lo);
            vec4_store(out + (uint64_t)h * hd + i0 + 4, hi);
        }
}

/* The attention of one rank of a tensor-parallel group of tp ranks, for
 * a chunk of T tokens of layer l: rank r owns KV heads [r * kvh, (r + 1) *
 * kvh) (kvh = kv_heads / tp) and their query heads, computes their Q, K and
 * V columns from xn, writes K and V of its heads into its own store ks (a
 * shard of kvh heads) and attends over that store only; its heads'
 * outputs land in their columns of s->att (the all-gather of a real
 * group). Each output element is computed exactly as the one-rank pass
 * computes it (a column slice of a panel-stored matrix is a run of whole
 * panels, and matmul sums each column on its own), so any tp gives the
 * same bits. */
static void attention_rank(const model_t *m, const kvstore_t *ks, uint32_t r, uint32_t tp,
                           const uint32_t *block_table, uint32_t l, uint32_t start, uint32_t T,
                           scratch_t *s)
{
    const model_config_t *c = &m->cfg;
    const model_layer_t *ly = &m->layer[l];
    uint32_t d = c->d_model, hd = c->head_dim, bt = c->block_tokens;
    uint32_t group = c->heads / c->kv_heads, kvh = c->kv_heads / tp, qh = kvh * group;
    uint32_t qd = c->heads * hd, rqd = qh * hd, rkvd = kvh * hd;
    const float *wq = ly->wq + (uint64_t)(r * rqd / MODEL_PANEL) * d * MODEL_PANEL;
    const float *wk = ly->wk + (uint64_t)(r * rkvd / MODEL_PANEL) * d * MODEL_PANEL;
    const float *wv = ly->wv + (uint64_t)(r * rkvd / MODEL_PANEL) * d * MODEL_PANEL;

    matmul(s->q, s->xn, wq, T, d, rqd);
    matmul(s->k, s->xn, wk, T, d, rkvd);
    matmul(s->v, s->xn, wv, T, d, rkvd);
    /* Every K and V of the chunk reaches its block before any token of
     * the chunk attends: attention only ever reads KV from blocks. */
    for (uint32_t t = 0; t < T; t++) {
        uint32_t pos = start + t;
        float *kd = kvstore_token(ks, l, 0, block_table[pos / bt], pos % bt);
        float *vd = kvstore_token(ks, l, 1, block_table[pos / bt], pos % bt);
        for (uint32_t h = 0; h < qh; h++)
            rope(s->q + (uint64_t)t * rqd + (uint64_t)h * hd, hd, pos, m->rope_inv_freq);
        for (uint32_t h = 0; h < kvh; h++)
            rope(s->k + (uint64_t)t * rkvd + (uint64_t)h * hd, hd, pos, m->rope_inv_freq);
        memcpy(kd, s->k + (uint64_t)t * rkvd, sizeof(float) * rkvd);
        memcpy(vd, s->v + (uint64_t)t * rkvd, sizeof(float) * rkvd);
    }
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t g = 0; g < kvh; g++) {
            uint64_t in = (uint64_t)t * rqd + (uint64_t)g * group * hd;
            uint64_t out = (uint64_t)t * qd + (uint64_t)r * rqd + (uint64_t)g * group * hd;
            attend_group(m, ks, block_table, l, g, start + t, s->q + in, s->att + out, s->scores);
        }
}

/* One chunk of tokens at positions start.. through every layer, its KV in
 * the tp shards of ks (tp 1: one store of every head); leaves the residual
 * stream in s->x. Wo, the MLP and the norms run once on the gathered
 * attention output: every rank of a real group would compute the same. */
static void forward_chunk(const model_t *m, const kvstore_t *const *ks, uint32_t tp,
                          const uint32_t *block_table, const uint32_t *tokens, uint32_t start,
                          uint32_t T, scratch_t *s)
{
    const model_config_t *c = &m->cfg;
    uint32_t d = c->d_model, hd = c->head_dim, qd = c->heads * hd, hid = c->hidden;

    for (uint32_t t = 0; t < T; t++)
        memcpy(s->x + (uint64_t)t * d, m->embed + (uint64_t)tokens[t] * d, sizeof(float) * d);

    for (uint32_t l = 0; l < c->layers; l++) {
        const model_layer_t *ly = &m->layer[l];

        for (uint32_t t = 0; t < T; t++)
            rmsnorm(s->xn + (uint64_t)t * d, s->x + (uint64_t)t * d, ly->attn_norm, d, c->norm_eps);
        for (uint32_t r = 0; r < tp; r++)
            attention_rank(m, ks[r], r, tp, block_table, l, start, T, s);
        matmul(s->proj, s->att, ly->wo, T, qd, d);
        for (uint64_t i = 0; i < (uint64_t)T * d; i++)
            s->x[i] += s->proj[i];

        for (uint32_t t = 0; t < T; t++)
            rmsnorm(s->xn + (uint64_t)t * d, s->x + (uint64_t)t * d, ly->mlp_norm, d, c->norm_eps);
        matmul(s->gate, s->xn, ly->w_gate, T, d, hid);
        matmul(s->up, s->xn, ly->w_up, T, d, hid);
        for (uint64_t i = 0; i < (uint64_t)T * hid; i++) {
            float g = s->gate[i];
            s->gate[i] = g / (1.0f + expf(-g)) * s->up[i];
        }
        matmul(s->proj, s->gate, ly->w_down, T, hid, d);
        for (uint64_t i = 0; i < (uint64_t)T * d; i++)
            s->x[i] += s->proj[i];
    }
}

int model_forward(const model_t *m, const kvstore_t *ks, const uint32_t *block_table,
                  uint32_t table_len, const uint32_t *tokens, uint32_t start, uint32_t count,
                  float *logits)
{
    return model_forward_tp(m, &ks, 1, block_table, table_len, tokens, start, count, logits);
}

/* Whether ks holds rank shards of this model's KV for a group of tp. */
static int shards_fit(const model_config_t *c, const kvstore_t *const *ks, uint32_t tp)
{
    for (uint32_t r = 0; r < tp; r++)
        if (!ks[r] || ks[r]->geom.dtype != GEOMETRY_FP32 || ks[r]->geom.layers != c->layers ||
            ks[r]->geom.kv_heads != c->kv_heads / tp || ks[r]->geom.head_dim != c->head_dim ||
            ks[r]->geom.block_tokens != c->block_tokens || ks[r]->num_blocks != ks[0]->num_blocks)
            return 0;
    return 1;
}

int model_forward_tp(const model_t *m, const kvstore_t *const *ks, uint32_t tp,
                     const uint32_t *block_table, uint32_t table_len, const uint32_t *tokens,
                     uint32_t start, uint32_t count, float *logits)
{
    const model_config_t *c;
    scratch_t s = {0};
    uint64_t end;
    uint32_t done, T = 0;
    int rc;

    if (!m || !ks || !tp || !block_table || !tokens || !count)
        return KVS_EINVAL;
    c = &m->cfg;
    if (c->kv_heads % tp || !shards_fit(c, ks, tp))
        return KVS_EINVAL;
    end = (uint64_t)start + count;
    if (end > (uint64_t)table_len * c->block_tokens || end > UINT32_MAX)
        return KVS_EINVAL;
    for (uint32_t i = 0; i < count; i++)
        if (tokens[i] >= c->vocab)
            return KVS_EINVAL;
    for (uint64_t i = 0; i < (end + c->block_tokens - 1) / c->block_tokens; i++)
        if (block_table[i] >= ks[0]->num_blocks)
            return KVS_EINVAL;

    /* A decode step needs room for one token only: a small allocation that
     * malloc serves from its arena, not fresh pages every step. */
    rc = scratch_new(c, count < MODEL_CHUNK ? count : MODEL_CHUNK, (uint32_t)end, &s);
    if (rc < 0)
        return rc;
    for (done = 0; done < count; done += T) {
        T = count - done < MODEL_CHUNK ? count - done : MODEL_CHUNK;
        forward_chunk(m, ks, tp, block_table, tokens + done, start + done, T, &s);
    }
    if (logits) {
        const float *last = s.x + (uint64_t)(T - 1) * c->d_model;
        rmsnorm(s.xn, last, m->final_norm, c->d_model, c->norm_eps);
        for (uint32_t v = 0; v < c->vocab; v++)
            logits[v] = dot(m->head + (uint64_t)v * c->d_model, s.xn, c->d_model) * m->logit_scale;
    }
    free(s.buf);
    return 0;
}

uint32_t model_argmax(const float *logits, uint32_t vocab)
{
    uint32_t best = 0;

    for (uint32_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}
