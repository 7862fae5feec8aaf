/*
 * kvshare-worker-bench: what prefix sharing saves in the reference worker.
 *
 * Times, on one core, medians of --reps runs:
 *  - full prefill of a prompt of --prompt tokens (time to first token with
 *    nothing cached);
 *  - resumed prefill of the last --suffix tokens on top of KV already in the
 *    blocks (time to first token when the rest came from shared blocks);
 *  - decode steps at the end of that prompt.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvstore.h"
#include "model.h"
#include "now.h"
#include "worker.h"

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

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"suffix", required_argument, NULL, 's'},
        {"decode", required_argument, NULL, 'd'},
        {"reps", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model_name = "default";
    uint32_t prompt_len = 1024, suffix = 64, decode = 32, reps = 3;
    model_config_t cfg;
    geometry_t geom;
    model_t *m = NULL;
    kvstore_t *ks = NULL;
    uint32_t *tokens = NULL, *table = NULL, blocks, tok;
    float *logits = NULL;
    double *full = NULL, *resumed = NULL, *step = NULL, t;
    uint64_t hash_full = 0, hash_resumed = 0;
    int opt, status = 1, measured = 0;

    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm':
            model_name = optarg;
            break;
        case 'p':
            prompt_len = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 's':
            suffix = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'd':
            decode = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'r':
            reps = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        default:
            fprintf(opt == 'h' ? stdout : stderr,
                    "usage: kvshare-worker-bench [--model default|small] [--prompt N] "
                    "[--suffix N] [--decode N] [--reps N]\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    if (model_config_preset(model_name, &cfg) < 0 || !prompt_len || !suffix ||
        suffix > prompt_len || !reps || !decode) {
        fprintf(stderr, "kvshare-worker-bench: bad arguments\n");
        return 2;
    }
    model_config_geometry(&cfg, &geom);
    blocks = worker_blocks_needed(cfg.block_tokens, prompt_len, decode + 1);
    if (model_new(&cfg, &m) < 0 || kvstore_new_private(&geom, blocks, &ks) < 0)
        goto out;
    tokens = malloc(sizeof(*tokens) * prompt_len);
    table = malloc(sizeof(*table) * blocks);
    logits = malloc(sizeof(*logits) * cfg.vocab);
    full = calloc(reps, sizeof(double));
    resumed = calloc(reps, sizeof(double));
    step = calloc((size_t)reps * decode, sizeof(double));
    if (!tokens || !table || !logits || !full || !resumed || !step)
        goto out;
    for (uint32_t i = 0; i < prompt_len; i++)
        tokens[i] = (uint32_t)((i * 2654435761u) % cfg.vocab);
    if (kvstore_alloc(ks, blocks, table) < 0)
        goto out;

    for (uint32_t r = 0; r < reps; r++) {
        uint32_t start = prompt_len - suffix;

        t = now_s();
        if (model_forward(m, ks, table, blocks, tokens, 0, prompt_len, logits) < 0)
            goto out;
        full[r] = now_s() - t;
        hash_full = worker_logits_hash(logits, cfg.vocab);
        /* The KV of [0, start) stays in the blocks: recompute only the end. */
        t = now_s();
        if (model_forward(m, ks, table, blocks, tokens + start, start, suffix, logits) < 0)
            goto out;
        resumed[r] = now_s() - t;
        hash_resumed = worker_logits_hash(logits, cfg.vocab);
        tok = model_argmax(logits, cfg.vocab);
        for (uint32_t i = 0; i < decode; i++) {
            t = now_s();
            if (model_forward(m, ks, table, blocks, &tok, prompt_len + i, 1, logits) < 0)
                goto out;
            step[r * decode + i] = now_s() - t;
            tok = model_argmax(logits, cfg.vocab);
        }
    }
    {
        double f = median(full, reps), s = median(resumed, reps);
        double d = median(step, reps * decode);
        printf("model %s (%" PRIu32 " layers, d %" PRIu32 ", %" PRIu32 "/%" PRIu32
               " heads, vocab %" PRIu32 "), 1 thread, median of %" PRIu32 "\n",
               model_name, cfg.layers, cfg.d_model, cfg.heads, cfg.kv_heads, cfg.vocab, reps);
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
    model_free(m);
    return status;
}
