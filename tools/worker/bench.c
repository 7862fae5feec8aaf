/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-worker-bench: what prefix sharing saves in the reference worker.
 *
 * Without --socket, times on one core, medians of --reps runs:
 *  - full prefill of a prompt of --prompt tokens (time to first token with
 *    nothing cached);
 *  - resumed prefill of the last --suffix tokens on top of KV already in the
 *    blocks (time to first token when the rest came from shared blocks);
 *  - decode steps at the end of that prompt.
 *
 * With --socket PATH (a kvshared with the model's geometry and a tier 2,
 * --host-tier), time to first token of one --prompt-token prompt, asked for
 * again, medians of --reps:
 *  - the reference: kvshare-worker's private prefill of all its tokens;
 *  - tier 2: the prompt committed once, then demoted by filler prompts
 *    (tierfill.h; the daemon's Stats must show the prompt's blocks all in
 *    tier 2 and none in the pool), then run again through kvshared: its
 *    pinned Lookup promotes the prefix, and the rest is computed;
 *  - tier 1: the same prompt again at once, its prefix now in the pool.
 * Each request's time to first token is worker_run's (lookup with its
 * promotion, Alloc, prefill of what was not matched, first token); every
 * run's final logits must be bitwise the reference's.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvscache.h"
#include "kvshare.h"
#include "kvstore.h"
#include "model.h"
#include "now.h"
#include "tierfill.h"
#include "worker.h"

/* The namespaces of the --socket runs. */
#define BENCH_NS  "worker-bench"
#define FILLER_NS "worker-bench-filler"

typedef struct bench_opts {
    const char *model_name;
    const char *socket_path;
    uint32_t prompt_len, suffix, decode, reps;
} bench_opts_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The benchmark prompt: the same tokens in every process. */
static void bench_prompt(uint32_t *tokens, uint32_t n, uint32_t vocab)
{
    for (uint32_t i = 0; i < n; i++)
        tokens[i] = (uint32_t)((i * 2654435761u) % vocab);
}

/* Full vs resumed prefill and decode steps, in one private store. */
static int bench_prefill(const bench_opts_t *o, const model_config_t *cfg, const model_t *m)
{
    geometry_t geom;
    kvstore_t *ks = NULL;
    uint32_t *tokens = NULL, *table = NULL, blocks, tok;
    uint32_t prompt_len = o->prompt_len, suffix = o->suffix, decode = o->decode, reps = o->reps;
    float *logits = NULL;
    double *full = NULL, *resumed = NULL, *step = NULL, t;
    uint64_t hash_full = 0, hash_resumed = 0;
    int status = 1, measured = 0;

    model_config_geometry(cfg, &geom);
    blocks = worker_blocks_needed(cfg->block_tokens, prompt_len, decode + 1);
    if (kvstore_new_private(&geom, blocks, &ks) < 0)
        goto out;
    tokens = malloc(sizeof(*tokens) * prompt_len);
    table = malloc(sizeof(*table) * blocks);
    logits = malloc(sizeof(*logits) * cfg->vocab);
    full = calloc(reps, sizeof(double));
    resumed = calloc(reps, sizeof(double));
    step = calloc((size_t)reps * decode, sizeof(double));
    if (!tokens || !table || !logits || !full || !resumed || !step)
        goto out;
    bench_prompt(tokens, prompt_len, cfg->vocab);
    if (kvstore_alloc(ks, blocks, table) < 0)
        goto out;

    for (uint32_t r = 0; r < reps; r++) {
        uint32_t start = prompt_len - suffix;

        t = now_s();
        if (model_forward(m, ks, table, blocks, tokens, 0, prompt_len, logits) < 0)
            goto out;
        full[r] = now_s() - t;
        hash_full = worker_logits_hash(logits, cfg->vocab);
        /* The KV of [0, start) stays in the blocks: recompute only the end. */
        t = now_s();
        if (model_forward(m, ks, table, blocks, tokens + start, start, suffix, logits) < 0)
            goto out;
        resumed[r] = now_s() - t;
        hash_resumed = worker_logits_hash(logits, cfg->vocab);
        tok = model_argmax(logits, cfg->vocab);
        for (uint32_t i = 0; i < decode; i++) {
            t = now_s();
            if (model_forward(m, ks, table, blocks, &tok, prompt_len + i, 1, logits) < 0)
                goto out;
            step[r * decode + i] = now_s() - t;
            tok = model_argmax(logits, cfg->vocab);
        }
    }
    {
        double f = median(full, reps), s = median(resumed, reps);
        double d = median(step, reps * decode);
        printf("model %s (%" PRIu32 " layers, d %" PRIu32 ", %" PRIu32 "/%" PRIu32
               " heads, vocab %" PRIu32 "), 1 thread, median of %" PRIu32 "\n",
               o->model_name, cfg->layers, cfg->d_model, cfg->heads, cfg->kv_heads, cfg->vocab,
               reps);
        printf("full prefill     %5" PRIu32 " tokens: %8.1f ms  %7.0f tok/s  (ttft, no cache)\n",
               prompt_len, f * 1e3, prompt_len / f);
        printf("resumed prefill  %5" PRIu32 " tokens: %8.1f ms  %7.0f tok/s  (ttft, %" PRIu32
               " tokens cached)\n",
               suffix, s * 1e3, suffix / s, prompt_len - suffix);
        printf("decode step at %5" PRIu32 " tokens: %8.2f ms  %7.1f tok/s\n", prompt_len, d * 1e3,
               1 / d);
        printf("ttft saved: %.1fx; logits of full and resumed prefill %s\n", f / s,
               hash_full == hash_resumed ? "bitwise equal" : "DIFFER");
        status = hash_full == hash_resumed ? 0 : 1;
        measured = 1;
    }
out:
    if (!measured)
        fprintf(stderr, "kvshare-worker-bench: out of memory or a forward pass failed\n");
    free(step);
    free(resumed);
    free(full);
    free(logits);
    free(table);
    free(tokens);
    kvstore_free(ks);
    return status;
}

/* The daemon's counters, from a monitoring connection. */
static int counters(kvs_client_t *c, kvs_stats_t *out)
{
    int rc = kvs_stats(c, out);

    if (rc < 0)
        fprintf(stderr, "kvshare-worker-bench: stats: %s\n", kvs_strerror(rc));
    else
        kvs_stats_free(out); /* the counters stay; the namespace table goes */
    return rc;
}

/* One request through kvshared; it must have run shared, matched `matched`
 * tokens and given the reference's logits and tokens. */
static int shared_run(kvscache_t *kc, const bench_opts_t *o, const uint32_t *tokens,
                      uint32_t matched, const uint32_t *gen_ref, uint64_t hash_ref, uint32_t *gen,
                      float *logits, worker_result_t *res, const char *what)
{
    int rc = kvscache_run(kc, tokens, o->prompt_len, o->decode, gen, logits, res);

    if (rc < 0) {
        fprintf(stderr, "kvshare-worker-bench: %s: %s\n", what, kvs_strerror(rc));
        return -1;
    }
    if (res->cache != WORKER_CACHE_SHARED) {
        fprintf(stderr, "kvshare-worker-bench: %s ran privately: %s\n", what, kvscache_note(kc));
        return -1;
    }
    if (matched != UINT32_MAX && res->matched_tokens != matched) {
        fprintf(stderr, "kvshare-worker-bench: %s matched %" PRIu32 " tokens, not %" PRIu32 "\n",
                what, res->matched_tokens, matched);
        return -1;
    }
    if (res->logits_hash != hash_ref || memcmp(gen, gen_ref, sizeof(*gen) * o->decode) != 0) {
        fprintf(stderr, "kvshare-worker-bench: %s: logits or tokens differ from the private run\n",
                what);
        return -1;
    }
    return 0;
}

/* Time to first token of a prompt held in tier 2, against the private
 * prefill and a tier-1 hit, in one run (see the top of this file). */
static int bench_tier(const bench_opts_t *o, const model_config_t *cfg, const model_t *m)
{
    geometry_t geom;
    kvstore_t *priv = NULL;
    kvscache_t *kc = NULL;
    kvscache_opts_t ko = {.socket_path = o->socket_path,
                          .ns = BENCH_NS,
                          .worker_name = "kvshare-worker-bench",
                          .timeout_ms = 120000};
    kvs_options_t mo;
    kvs_client_t *mon = NULL;
    kvs_geometry_t pg;
    kvs_stats_t before, after;
    tierfill_result_t fill;
    worker_result_t res;
    uint32_t *tokens = NULL, *gen = NULL, *gen_ref = NULL, blocks, full_blocks, hit, serial = 1;
    float *logits = NULL;
    double *t_full = NULL, *t_t2 = NULL, *t_t2_lookup = NULL, *t_t1 = NULL, t_miss = 0;
    uint64_t hash_ref = 0, promoted = 0, copied_bytes = 0, copy_us = 0, filler = 0;
    char err[512];
    int rc, status = 1;

    model_config_geometry(cfg, &geom);
    blocks = worker_blocks_needed(cfg->block_tokens, o->prompt_len, o->decode);
    full_blocks = o->prompt_len / cfg->block_tokens;
    hit = (o->prompt_len - 1) / cfg->block_tokens; /* blocks a lookup can match */
    tokens = malloc(sizeof(*tokens) * o->prompt_len);
    gen = malloc(sizeof(*gen) * o->decode);
    gen_ref = malloc(sizeof(*gen_ref) * o->decode);
    logits = malloc(sizeof(*logits) * cfg->vocab);
    t_full = calloc(o->reps, sizeof(double));
    t_t2 = calloc(o->reps, sizeof(double));
    t_t2_lookup = calloc(o->reps, sizeof(double));
    t_t1 = calloc(o->reps, sizeof(double));
    if (!tokens || !gen || !gen_ref || !logits || !t_full || !t_t2 || !t_t2_lookup || !t_t1) {
        fprintf(stderr, "kvshare-worker-bench: out of memory\n");
        goto out;
    }
    bench_prompt(tokens, o->prompt_len, cfg->vocab);

    kvs_options_init(&mo);
    mo.socket_path = o->socket_path;
    mo.worker_name = "kvshare-worker-bench filler";
    mo.timeout_ms = 120000;
    mo.flags = KVS_NO_MAP;
    rc = kvs_connect(&mo, &mon);
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker-bench: cannot reach kvshared at %s: %s\n", o->socket_path,
                kvs_strerror(rc));
        goto out;
    }
    kvs_geometry(mon, &pg);
    if (!pg.tier2_blocks || pg.tier2_blocks < full_blocks || pg.num_blocks < blocks) {
        fprintf(stderr,
                "kvshare-worker-bench: kvshared has %" PRIu32 " pool blocks and %" PRIu32
                " in tier 2; a %" PRIu32 "-token prompt needs %" PRIu32 " in the pool and %" PRIu32
                " in tier 2: start it with --pool-blocks N and "
                "--host-tier SIZE large enough\n",
                pg.num_blocks, pg.tier2_blocks, o->prompt_len, blocks, full_blocks);
        goto out;
    }
    ko.private_blocks = blocks;
    rc = kvscache_open(&ko, m, &kc, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker-bench: %s\n", err);
        status = 2;
        goto out;
    }
    rc = kvstore_new_private(&geom, blocks, &priv);
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker-bench: private store: %s\n", kvs_strerror(rc));
        goto out;
    }

    for (uint32_t r = 0; r < o->reps; r++) {
        worker_t w = {.model = m, .store = priv, .ops = &worker_private_ops, .ctx = priv};
        rc = worker_run(&w, tokens, o->prompt_len, o->decode, gen_ref, logits, &res);
        if (rc < 0) {
            fprintf(stderr, "kvshare-worker-bench: private run: %s\n", kvs_strerror(rc));
            goto out;
        }
        t_full[r] = res.ttft_s;
        if (r > 0 && res.logits_hash != hash_ref) {
            fprintf(stderr, "kvshare-worker-bench: private runs differ\n");
            goto out;
        }
        hash_ref = res.logits_hash;
    }
    /* The prompt committed once (a miss unless an earlier run left it). */
    if (shared_run(kc, o, tokens, UINT32_MAX, gen_ref, hash_ref, gen, logits, &res, "first run") <
        0)
        goto out;
    t_miss = res.ttft_s;

    for (uint32_t r = 0; r < o->reps; r++) {
        rc = tierfill_demote(mon, BENCH_NS, FILLER_NS, full_blocks, &serial, &fill, err,
                             sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "kvshare-worker-bench: demoting the prompt: %s\n", err);
            goto out;
        }
        filler += fill.filler_blocks;
        if (counters(mon, &before) < 0)
            goto out;
        if (shared_run(kc, o, tokens, hit * cfg->block_tokens, gen_ref, hash_ref, gen, logits, &res,
                       "tier-2 hit") < 0)
            goto out;
        t_t2[r] = res.ttft_s;
        t_t2_lookup[r] = res.ttft_s - res.prefill_s;
        if (counters(mon, &after) < 0)
            goto out;
        if (after.tier_promotions - before.tier_promotions < hit) {
            fprintf(stderr,
                    "kvshare-worker-bench: the tier-2 hit promoted %" PRIu64 " blocks, not %" PRIu32
                    "\n",
                    after.tier_promotions - before.tier_promotions, hit);
            goto out;
        }
        promoted += after.tier_promotions - before.tier_promotions;
        copied_bytes += after.tier_copied_bytes - before.tier_copied_bytes;
        copy_us += after.tier_copy_us - before.tier_copy_us;
        if (shared_run(kc, o, tokens, hit * cfg->block_tokens, gen_ref, hash_ref, gen, logits, &res,
                       "tier-1 hit") < 0)
            goto out;
        t_t1[r] = res.ttft_s;
    }
    {
        double f = median(t_full, o->reps), t2 = median(t_t2, o->reps);
        double t2l = median(t_t2_lookup, o->reps), t1 = median(t_t1, o->reps);

        printf("model %s (%" PRIu32 " layers, d %" PRIu32 ", %" PRIu32 "/%" PRIu32
               " heads, vocab %" PRIu32 "), 1 thread; kvshared at %s: %" PRIu32
               " pool blocks, %" PRIu32 " in tier 2, %" PRIu64 " B each; median of %" PRIu32 "\n",
               o->model_name, cfg->layers, cfg->d_model, cfg->heads, cfg->kv_heads, cfg->vocab,
               o->socket_path, pg.num_blocks, pg.tier2_blocks, pg.block_bytes, o->reps);
        printf("prompt %" PRIu32 " tokens (%" PRIu32 " full blocks); a hit matches %" PRIu32
               " tokens and computes %" PRIu32 "\n",
               o->prompt_len, full_blocks, hit * cfg->block_tokens,
               o->prompt_len - hit * cfg->block_tokens);
        printf("ttft, private prefill (no cache)  %9.1f ms\n", f * 1e3);
        printf("ttft, prefix in tier 2 (promoted) %9.1f ms  (lookup + alloc %.1f ms)  %.1fx less\n",
               t2 * 1e3, t2l * 1e3, f / t2);
        printf("ttft, prefix in tier 1            %9.1f ms  %.1fx less\n", t1 * 1e3, f / t1);
        printf("first shared run (committed it)   %9.1f ms\n", t_miss * 1e3);
        printf("kvshared: %" PRIu64 " blocks promoted (%.1f per tier-2 hit), %.1f MiB copied both "
               "ways, %.1f ms of copies per tier-2 hit; %" PRIu64 " filler blocks written\n",
               promoted, (double)promoted / o->reps, copied_bytes / 1048576.0,
               copy_us / 1e3 / o->reps, filler);
        printf("every run's logits and tokens bitwise equal the private run's\n");
        status = t2 < f ? 0 : 1;
        if (status)
            fprintf(stderr, "kvshare-worker-bench: the tier-2 hit was not faster than the "
                            "private prefill\n");
    }
out:
    kvstore_free(priv);
    kvscache_free(kc);
    kvs_close(mon);
    free(t_t1);
    free(t_t2_lookup);
    free(t_t2);
    free(t_full);
    free(logits);
    free(gen_ref);
    free(gen);
    free(tokens);
    return status;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},  {"prompt", required_argument, NULL, 'p'},
        {"suffix", required_argument, NULL, 's'}, {"decode", required_argument, NULL, 'd'},
        {"reps", required_argument, NULL, 'r'},   {"socket", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    bench_opts_t o = {
        .model_name = "default", .prompt_len = 1024, .suffix = 64, .decode = 32, .reps = 3};
    model_config_t cfg;
    model_t *m = NULL;
    int opt, status;

    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm':
            o.model_name = optarg;
            break;
        case 'p':
            o.prompt_len = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 's':
            o.suffix = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'd':
            o.decode = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'r':
            o.reps = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'S':
            o.socket_path = optarg;
            break;
        default:
            fprintf(opt == 'h' ? stdout : stderr,
                    "usage: kvshare-worker-bench [--model default|small] [--prompt N] "
                    "[--suffix N] [--decode N] [--reps N]\n"
                    "       kvshare-worker-bench --socket PATH [--model default|small] "
                    "[--prompt N] [--decode N] [--reps N]\n"
                    "  --socket: time to first token of a prompt held in kvshared's tier 2\n"
                    "  (start kvshared with --host-tier), against the private prefill and a\n"
                    "  tier-1 hit\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    if (optind < argc || model_config_preset(o.model_name, &cfg) < 0 || o.prompt_len < 2 ||
        !o.suffix || o.suffix > o.prompt_len || !o.reps || !o.decode ||
        (o.socket_path && o.prompt_len <= cfg.block_tokens)) {
        fprintf(stderr, "kvshare-worker-bench: bad arguments (--help)\n");
        return 2;
    }
    if (model_new(&cfg, &m) < 0) {
        fprintf(stderr, "kvshare-worker-bench: out of memory for the model\n");
        return 1;
    }
    status = o.socket_path ? bench_tier(&o, &cfg, m) : bench_prefill(&o, &cfg, m);
    model_free(m);
    return status;
}
