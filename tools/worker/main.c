/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-worker: the reference decode worker. Runs a workload of prompts
 * through the model (model.h), prefill then greedy decode, and reports per
 * request what it computed and how long the first token took.
 *
 * --private keeps the KV in the worker's own memory, in the pool layout, with
 * no sharing: the reference output that a shared run must reproduce.
 * --kvs keeps it in kvshared's pool, shared with every worker of the node
 * (kvscache.h), and computes privately whenever the daemon is not usable.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvscache.h"
#include "kvstore.h"
#include "model.h"
#include "worker.h"
#include "workload.h"

typedef enum kv_mode_kind {
    KV_MODE_NONE,
    KV_MODE_PRIVATE,
    KV_MODE_KVS,
} kv_mode_kind_t;

typedef struct options {
    kv_mode_kind_t mode;
    const char *model;
    const char *prompts;
    const char *logits_out;
    const char *socket_path;
    const char *ns;
    uint32_t timeout_ms;
    uint32_t tp;
    workload_chat_opts_t chat;
    uint32_t decode;
    uint32_t blocks;
    int json;
    int quiet;
} options_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvshare-worker --private|--kvs [options]\n"
            "\n"
            "Runs prompts through a small deterministic transformer (prefill, then greedy\n"
            "decode) with its KV in blocks laid out as kvshared's pool.\n"
            "\n"
            "  --private              KV in the worker's own memory, no sharing (reference)\n"
            "  --kvs                  KV in kvshared's pool, shared; private when the daemon\n"
            "                         is down (kvshared: --backend host --dtype fp32 and the\n"
            "                         model's --layers --kv-heads --head-dim, --block-tokens 16)\n"
            "  --socket PATH          kvshared's socket (default: libkvshare's default path)\n"
            "  --namespace NS         kvshared namespace (default: \"default\")\n"
            "  --timeout-ms N         per call to kvshared (default 1000)\n"
            "  --tp N                 with --kvs: a tensor-parallel group of N ranks in this\n"
            "                         process, each rank's KV heads in its own device's pool\n"
            "                         (kvshared --devices 0-(N-1), --kv-heads = the model's / N)\n"
            "  --model NAME           default (4 layers, d 512, GQA 8/2, vocab 4096) | small |\n"
            "                         small-tp (small with 8/4 heads: --tp 2 or 4)\n"
            "  --prompts FILE         one prompt per line, token ids separated by spaces\n"
            "  --requests N           generated workload: requests (default 4)\n"
            "  --systems N            distinct system prompts, used in turn (default 1)\n"
            "  --system-tokens N      system prompt length (default 1024)\n"
            "  --question-tokens N    mean question length (default 64)\n"
            "  --seed N               workload seed (default 1)\n"
            "  --first N              index of the first generated request (default 0)\n"
            "  --decode N             tokens generated per request (default 16)\n"
            "  --blocks N             private store size in blocks (default: the largest request)\n"
            "  --json                 one JSON object per request, then a summary object\n"
            "  --logits-out FILE      write each request's final logits (fp32, native order)\n"
            "  --quiet                no per-request lines, summary only\n"
            "  --help\n");
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-')
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse_options(int argc, char **argv, options_t *o)
{
    enum {
        OPT_PRIVATE = 256,
        OPT_KVS,
        OPT_SOCKET,
        OPT_NAMESPACE,
        OPT_TIMEOUT_MS,
        OPT_TP,
        OPT_MODEL,
        OPT_PROMPTS,
        OPT_REQUESTS,
        OPT_SYSTEMS,
        OPT_SYSTEM_TOKENS,
        OPT_QUESTION_TOKENS,
        OPT_SEED,
        OPT_FIRST,
        OPT_DECODE,
        OPT_BLOCKS,
        OPT_JSON,
        OPT_LOGITS_OUT,
        OPT_QUIET,
        OPT_HELP,
    };
    static const struct option longopts[] = {
        {"private", no_argument, NULL, OPT_PRIVATE},
        {"kvs", no_argument, NULL, OPT_KVS},
        {"socket", required_argument, NULL, OPT_SOCKET},
        {"namespace", required_argument, NULL, OPT_NAMESPACE},
        {"timeout-ms", required_argument, NULL, OPT_TIMEOUT_MS},
        {"tp", required_argument, NULL, OPT_TP},
        {"model", required_argument, NULL, OPT_MODEL},
        {"prompts", required_argument, NULL, OPT_PROMPTS},
        {"requests", required_argument, NULL, OPT_REQUESTS},
        {"systems", required_argument, NULL, OPT_SYSTEMS},
        {"system-tokens", required_argument, NULL, OPT_SYSTEM_TOKENS},
        {"question-tokens", required_argument, NULL, OPT_QUESTION_TOKENS},
        {"seed", required_argument, NULL, OPT_SEED},
        {"first", required_argument, NULL, OPT_FIRST},
        {"decode", required_argument, NULL, OPT_DECODE},
        {"blocks", required_argument, NULL, OPT_BLOCKS},
        {"json", no_argument, NULL, OPT_JSON},
        {"logits-out", required_argument, NULL, OPT_LOGITS_OUT},
        {"quiet", no_argument, NULL, OPT_QUIET},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    int opt;
    uint32_t *target;

    *o = (options_t){
        .model = "default",
        .chat =
            {.requests = 4, .systems = 1, .system_tokens = 1024, .question_tokens = 64, .seed = 1},
        .decode = 16,
    };
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        target = NULL;
        switch (opt) {
        case OPT_PRIVATE:
            o->mode = KV_MODE_PRIVATE;
            break;
        case OPT_KVS:
            o->mode = KV_MODE_KVS;
            break;
        case OPT_SOCKET:
            o->socket_path = optarg;
            break;
        case OPT_NAMESPACE:
            o->ns = optarg;
            break;
        case OPT_TIMEOUT_MS:
            target = &o->timeout_ms;
            break;
        case OPT_TP:
            target = &o->tp;
            break;
        case OPT_MODEL:
            o->model = optarg;
            break;
        case OPT_PROMPTS:
            o->prompts = optarg;
            break;
        case OPT_REQUESTS:
            target = &o->chat.requests;
            break;
        case OPT_SYSTEMS:
            target = &o->chat.systems;
            break;
        case OPT_SYSTEM_TOKENS:
            target = &o->chat.system_tokens;
            break;
        case OPT_QUESTION_TOKENS:
            target = &o->chat.question_tokens;
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            o->chat.seed = strtoull(optarg, &end, 0);
            if (errno || end == optarg || *end) {
                fprintf(stderr, "kvshare-worker: bad --seed '%s'\n", optarg);
                return -1;
            }
            break;
        }
        case OPT_FIRST:
            target = &o->chat.first;
            break;
        case OPT_DECODE:
            target = &o->decode;
            break;
        case OPT_BLOCKS:
            target = &o->blocks;
            break;
        case OPT_JSON:
            o->json = 1;
            break;
        case OPT_LOGITS_OUT:
            o->logits_out = optarg;
            break;
        case OPT_QUIET:
            o->quiet = 1;
            break;
        case OPT_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        if (target && parse_u32(optarg, target) < 0) {
            fprintf(stderr, "kvshare-worker: bad number '%s'\n", optarg);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvshare-worker: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->tp > 1 && o->mode != KV_MODE_KVS) {
        fprintf(stderr, "kvshare-worker: --tp needs --kvs (a private run is one rank)\n");
        return -1;
    }
    if (o->mode == KV_MODE_NONE) {
        fprintf(stderr, "kvshare-worker: choose a KV mode (--private or --kvs)\n");
        usage(stderr);
        return -1;
    }
    return 0;
}

/* Where a run keeps its KV and how it shares it: a private store and the
 * private callbacks of worker_run, or a kvscache (kvshared's pool, with its
 * own private fallback). */
typedef struct kv_mode {
    const char *name;
    kvstore_t *store;
    const worker_cache_ops_t *ops;
    void *ctx;
    kvscache_t *kvs;
} kv_mode_t;

/* The worker's own region, sized for the largest request unless --blocks says
 * otherwise; nothing is shared. */
static int kv_mode_open_private(const options_t *o, const geometry_t *geom, uint32_t need,
                                kv_mode_t *out)
{
    uint32_t blocks = o->blocks ? o->blocks : need;
    int rc;

    if (blocks < need) {
        fprintf(stderr, "kvshare-worker: --blocks %" PRIu32 " < %" PRIu32 " a request needs\n",
                blocks, need);
        return KVS_EINVAL;
    }
    rc = kvstore_new_private(geom, blocks, &out->store);
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker: kv store of %" PRIu32 " blocks: %s\n", blocks,
                kvs_status_text(rc));
        return rc;
    }
    out->name = "private";
    out->ops = &worker_private_ops;
    out->ctx = out->store;
    return 0;
}

/* kvshared's pool; the fallback store is sized as --private's. A daemon that
 * is down is not an error (requests run privately until it answers); one
 * whose pool does not fit the model is. */
static int kv_mode_open_kvs(const options_t *o, const model_t *m, uint32_t need, kv_mode_t *out)
{
    kvscache_opts_t ko = {
        .socket_path = o->socket_path,
        .ns = o->ns,
        .worker_name = "kvshare-worker",
        .timeout_ms = o->timeout_ms > INT32_MAX ? INT32_MAX : (int)o->timeout_ms,
        .private_blocks = o->blocks ? o->blocks : need,
        .tp = o->tp,
    };
    char err[512];
    int rc;

    if (ko.private_blocks < need) {
        fprintf(stderr, "kvshare-worker: --blocks %" PRIu32 " < %" PRIu32 " a request needs\n",
                ko.private_blocks, need);
        return KVS_EINVAL;
    }
    rc = kvscache_open(&ko, m, &out->kvs, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker: %s\n", err);
        return rc;
    }
    out->name = "kvs";
    return 0;
}

static int kv_mode_run(kv_mode_t *km, const model_t *m, const uint32_t *prompt, uint32_t n,
                       uint32_t decode, uint32_t *generated, float *logits, worker_result_t *r)
{
    worker_t w = {.model = m, .store = km->store, .ops = km->ops, .ctx = km->ctx};
    int rc;

    if (km->kvs) {
        rc = kvscache_run(km->kvs, prompt, n, decode, generated, logits, r);
        if (rc == 0 && kvscache_note(km->kvs)[0])
            fprintf(stderr, "kvshare-worker: %s\n", kvscache_note(km->kvs));
        return rc;
    }
    rc = worker_run(&w, prompt, n, decode, generated, logits, r);
    if (rc == 0)
        r->cache = WORKER_CACHE_PRIVATE;
    return rc;
}

static const char *cache_name(worker_cache_kind_t k)
{
    return k == WORKER_CACHE_SHARED     ? "shared"
           : k == WORKER_CACHE_FALLBACK ? "fallback"
                                        : "private";
}

static void kv_mode_close(kv_mode_t *km)
{
    kvscache_free(km->kvs);
    kvstore_free(km->store);
    *km = (kv_mode_t){0};
}

static void print_request(const options_t *o, uint32_t i, const worker_result_t *r,
                          const uint32_t *generated)
{
    if (o->json) {
        printf("{\"request\":%" PRIu32 ",\"cache\":\"%s\",\"prompt_tokens\":%" PRIu32
               ",\"matched_tokens\":%" PRIu32 ",\"prefill_tokens\":%" PRIu32 ",\"blocks\":%" PRIu32
               ",\"ttft_ms\":%.3f,\"prefill_ms\":%.3f"
               ",\"decode_ms\":%.3f,\"total_ms\":%.3f,\"logits_hash\":\"%016" PRIx64
               "\",\"generated\":[",
               i, cache_name(r->cache), r->prompt_tokens, r->matched_tokens, r->prefill_tokens,
               r->blocks, r->ttft_s * 1e3, r->prefill_s * 1e3, r->decode_s * 1e3, r->total_s * 1e3,
               r->logits_hash);
        for (uint32_t j = 0; j < r->generated; j++)
            printf("%s%" PRIu32, j ? "," : "", generated[j]);
        printf("]}\n");
        return;
    }
    printf("request %" PRIu32 " (%s): prompt %" PRIu32 " tokens, matched %" PRIu32
           ", prefill %" PRIu32 " in %.1f ms (%.0f tok/s), ttft %.1f ms, decode %" PRIu32
           " in %.1f ms, logits %016" PRIx64 "\n  generated:",
           i, cache_name(r->cache), r->prompt_tokens, r->matched_tokens, r->prefill_tokens,
           r->prefill_s * 1e3, r->prefill_s > 0 ? r->prefill_tokens / r->prefill_s : 0.0,
           r->ttft_s * 1e3, r->generated, r->decode_s * 1e3, r->logits_hash);
    for (uint32_t j = 0; j < r->generated; j++)
        printf(" %" PRIu32, generated[j]);
    printf("\n");
}

int main(int argc, char **argv)
{
    options_t o;
    model_config_t cfg;
    geometry_t geom;
    model_t *model = NULL;
    kv_mode_t km = {0};
    workload_t *wl = NULL;
    FILE *logits_file = NULL;
    uint32_t *generated = NULL, need = 0;
    float *logits = NULL;
    uint64_t sum_prompt = 0, sum_prefill = 0, sum_matched = 0, sum_generated = 0;
    double sum_ttft = 0, sum_prefill_s = 0, sum_decode_s = 0;
    int rc, status = 1;

    if (parse_options(argc, argv, &o) < 0)
        return 2;
    rc = model_config_preset(o.model, &cfg);
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker: unknown model '%s' (default, small, small-tp)\n", o.model);
        return 2;
    }
    o.chat.vocab = cfg.vocab;
    model_config_geometry(&cfg, &geom);

    rc = o.prompts ? workload_load(o.prompts, cfg.vocab, &wl) : workload_chat(&o.chat, &wl);
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker: %s: %s\n", o.prompts ? o.prompts : "workload",
                kvs_status_text(rc));
        goto out;
    }
    rc = model_new(&cfg, &model);
    if (rc < 0) {
        fprintf(stderr, "kvshare-worker: model: %s\n", kvs_status_text(rc));
        goto out;
    }
    for (uint32_t i = 0; i < wl->count; i++) {
        uint32_t b = worker_blocks_needed(cfg.block_tokens, wl->len[i], o.decode);
        need = b > need ? b : need;
    }
    if (o.mode == KV_MODE_KVS ? kv_mode_open_kvs(&o, model, need, &km) < 0
                              : kv_mode_open_private(&o, &geom, need, &km) < 0) {
        status = 2;
        goto out;
    }
    generated = calloc(o.decode ? o.decode : 1, sizeof(*generated));
    logits = calloc(cfg.vocab, sizeof(*logits));
    if (!generated || !logits) {
        fprintf(stderr, "kvshare-worker: out of memory\n");
        goto out;
    }
    if (o.logits_out) {
        logits_file = fopen(o.logits_out, "wb");
        if (!logits_file) {
            fprintf(stderr, "kvshare-worker: %s: %s\n", o.logits_out, strerror(errno));
            goto out;
        }
    }

    for (uint32_t i = 0; i < wl->count; i++) {
        worker_result_t r;

        rc = kv_mode_run(&km, model, wl->prompt[i], wl->len[i], o.decode, generated, logits, &r);
        if (rc < 0) {
            fprintf(stderr, "kvshare-worker: request %" PRIu32 ": %s\n", i, kvs_status_text(rc));
            goto out;
        }
        if (!o.quiet)
            print_request(&o, o.prompts ? i : o.chat.first + i, &r, generated);
        if (logits_file && fwrite(logits, sizeof(*logits), cfg.vocab, logits_file) != cfg.vocab) {
            fprintf(stderr, "kvshare-worker: %s: write failed\n", o.logits_out);
            goto out;
        }
        sum_prompt += r.prompt_tokens;
        sum_prefill += r.prefill_tokens;
        sum_matched += r.matched_tokens;
        sum_generated += r.generated;
        sum_ttft += r.ttft_s;
        sum_prefill_s += r.prefill_s;
        sum_decode_s += r.decode_s;
    }
    if (logits_file) {
        rc = fclose(logits_file);
        logits_file = NULL;
        if (rc != 0) {
            fprintf(stderr, "kvshare-worker: %s: %s\n", o.logits_out, strerror(errno));
            goto out;
        }
    }

    {
        double n = (double)wl->count;
        double prefill_tps = sum_prefill_s > 0 ? (double)sum_prefill / sum_prefill_s : 0;
        uint64_t decode_steps = sum_generated > wl->count ? sum_generated - wl->count : 0;
        double decode_tps = sum_decode_s > 0 ? (double)decode_steps / sum_decode_s : 0;
        double hit_rate = sum_prompt ? (double)sum_matched / (double)sum_prompt : 0;
        kvscache_stats_t ks;

        kvscache_stats(km.kvs, &ks);

        if (o.json)
            printf("{\"summary\":{\"mode\":\"%s\",\"model\":\"%s\",\"requests\":%" PRIu32
                   ",\"prompt_tokens\":%" PRIu64 ",\"matched_tokens\":%" PRIu64
                   ",\"prefill_tokens\":%" PRIu64 ",\"generated_tokens\":%" PRIu64
                   ",\"hit_rate\":%.4f,\"mean_ttft_ms\":%.3f,\"prefill_tok_per_s\":%.1f"
                   ",\"decode_tok_per_s\":%.1f,\"shared_requests\":%" PRIu64
                   ",\"fallbacks\":%" PRIu64 ",\"duplicates\":%" PRIu64
                   ",\"commit_errors\":%" PRIu64 "}}\n",
                   km.name, o.model, wl->count, sum_prompt, sum_matched, sum_prefill, sum_generated,
                   hit_rate, sum_ttft / n * 1e3, prefill_tps, decode_tps, ks.shared, ks.fallbacks,
                   ks.duplicates, ks.commit_errors);
        else
            printf("summary (%s): %" PRIu32 " requests, %" PRIu64 " prompt tokens, %" PRIu64
                   " matched (hit rate %.1f%%), %" PRIu64
                   " computed; mean ttft %.1f ms; prefill %.0f tok/s; decode %.1f tok/s\n",
                   km.name, wl->count, sum_prompt, sum_matched, hit_rate * 100, sum_prefill,
                   sum_ttft / n * 1e3, prefill_tps, decode_tps);
        if (!o.json && km.kvs)
            printf("kvshared: %" PRIu64 " requests shared, %" PRIu64 " computed privately, %" PRIu64
                   " duplicate blocks, %" PRIu64 " commit errors\n",
                   ks.shared, ks.fallbacks, ks.duplicates, ks.commit_errors);
    }
    status = 0;
out:
    if (logits_file)
        fclose(logits_file);
    free(logits);
    free(generated);
    kv_mode_close(&km);
    model_free(model);
    workload_free(wl);
    return status;
}
