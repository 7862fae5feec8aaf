/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare calc: how much KV a model needs, how many sequences fit, what they
 * cost.
 *
 *   kvshare calc --model llama-3.1-70b --dtype fp8 --budget 70GB --context 4k,32k,128k
 *   kvshare calc --model llama-3.1-70b --dtype fp8 --gpu-memory 2x80GB --weights 70GB \
 *                --overhead 5GB --users 16 --price-per-hour 6
 *
 * The KV budget is given (--budget) or derived the way serving engines size
 * their cache (vLLM's gpu_memory_utilization):
 *
 *     budget = gpu_memory x utilization - weights - overhead
 *
 * A sequence (one user's live context) is counted in whole blocks
 * (ceil(tokens / block_tokens)), since that is what the pool hands out; a user
 * costs the node's price divided by the sequences that fit. Sizes print in
 * decimal GB (10^9 bytes), exact bytes in --json.
 *
 * --tp N: the model runs tensor-parallel over N GPUs, each rank holding its
 * share of every block's KV, and one kvshared serves the group with one
 * pool per device (--devices). A rank holds kv_heads / N heads; with fewer
 * heads than ranks each rank holds one, replicated N / kv_heads times (as
 * vLLM does), and an MLA latent is whole on every rank. The budget is the
 * group's, split evenly: each device's pool gets budget / N, and holds the
 * same number of blocks of one rank's geometry.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "geometry.h"
#include "units.h"

#define CALC_MAX_CONTEXTS     32
#define CALC_DEFAULT_CONTEXTS "4k,32k,128k"

#define CALC_DEFAULT_UTILIZATION 0.9

typedef struct calc_args {
    const char *model;
    geometry_t g;
    int have_budget;
    uint64_t budget; /* the one in use: --budget, else derived */
    /* The derivation from the node's memory, when --gpu-memory is given. */
    int have_gpu;
    uint32_t gpus;       /* the N of NxSIZE; 1 for a plain total */
    uint64_t gpu_memory; /* total bytes */
    double utilization;
    uint64_t usable; /* gpu_memory x utilization */
    uint64_t weights, overhead;
    uint64_t derived; /* usable - weights - overhead */
    int budget_given; /* --budget overrode the derivation */
    uint64_t users;   /* 0: not asked */
    int have_price;
    double price_per_hour;
    size_t n_contexts;
    uint64_t contexts[CALC_MAX_CONTEXTS];
    const char *context_names[CALC_MAX_CONTEXTS];
    char context_text[512]; /* the --context lists, each NUL-ended */
    size_t context_used;
    int json;
    /* --tp: ranks; rank_g is one rank's geometry (g when tp is 1), and
     * replication how many ranks hold each KV value. */
    uint32_t tp;
    geometry_t rank_g;
    uint32_t replication;
} calc_args_t;

static void calc_usage(FILE *out)
{
    fprintf(out,
            "usage: kvshare calc [--model NAME] [--layers N --kv-heads N --head-dim N]\n"
            "                    [--layers N --kv-lora-rank N --rope-head-dim N]\n"
            "                    [--dtype fp32|fp16|bf16|fp8] [--block-tokens N]\n"
            "                    [--budget SIZE | --gpu-memory SIZE --weights SIZE\n"
            "                     [--utilization F] [--overhead SIZE]]\n"
            "                    [--context LIST] [--users N] [--price-per-hour X] [--tp N]\n"
            "                    [--json]\n"
            "       kvshare calc --list-models\n"
            "\n"
            "  --model NAME      a preset (see --list-models); the options below override it\n"
            "  --layers N, --kv-heads N, --head-dim N\n"
            "                    the model's shape (all three needed without --model)\n"
            "  --kv-lora-rank N, --rope-head-dim N\n"
            "                    an MLA model (DeepSeek-V2/V3): one latent of N + N elements\n"
            "                    per token and layer, no K/V split, no heads\n"
            "  --dtype T         KV element type (default bf16)\n"
            "  --block-tokens N  tokens per pool block (default 16)\n"
            "  --budget SIZE     KV memory, e.g. 70GB (10^9) or 64GiB (2^30); overrides\n"
            "                    the budget derived from --gpu-memory\n"
            "  --gpu-memory SIZE the node's GPU memory, total (160GB) or per GPU (2x80GB)\n"
            "  --weights SIZE    model weights across those GPUs (e.g. 70GB)\n"
            "  --utilization F   fraction of GPU memory the engine may use (default %.1f)\n"
            "  --overhead SIZE   activations, CUDA graphs, runtime (default 0)\n"
            "                    budget = gpu memory x utilization - weights - overhead\n"
            "  --context LIST    context lengths, e.g. 4k,32k,128k (k = 1024; default %s);\n"
            "                    repeat it to add more\n"
            "  --users N         the KV N users need at each context, and whether it fits\n"
            "  --price-per-hour X  the node's price: cost per user-hour at each context\n"
            "  --tp N            tensor parallelism over N GPUs (one kvshared --devices for\n"
            "                    the group): per-rank bytes per token and block, each\n"
            "                    device's share of the budget and its pool's blocks\n"
            "  --json            one JSON object instead of text\n",
            CALC_DEFAULT_UTILIZATION, CALC_DEFAULT_CONTEXTS);
}

static int parse_u32(const char *opt, const char *text, uint32_t *out)
{
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || v == 0 || v > UINT32_MAX) {
        fprintf(stderr, "kvshare calc: %s wants a positive whole number, not '%s'\n", opt, text);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* Appends the lengths of one --context list ("4k,32k") to a's: repeated
 * --context flags add up. */
static int parse_contexts(calc_args_t *a, const char *text)
{
    size_t len = strlen(text);
    if (len >= sizeof(a->context_text) - a->context_used) {
        fprintf(stderr, "kvshare calc: --context lists too long\n");
        return -1;
    }
    char *copy = a->context_text + a->context_used;
    memcpy(copy, text, len + 1);
    a->context_used += len + 1;
    size_t before = a->n_contexts;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        if (a->n_contexts == CALC_MAX_CONTEXTS) {
            fprintf(stderr, "kvshare calc: at most %d context lengths\n", CALC_MAX_CONTEXTS);
            return -1;
        }
        if (units_parse_count(item, &a->contexts[a->n_contexts]) != 0) {
            fprintf(stderr,
                    "kvshare calc: bad context length '%s' (want e.g. 4096, 4k, 128k, 1m)\n", item);
            return -1;
        }
        a->context_names[a->n_contexts++] = item;
    }
    if (a->n_contexts == before) {
        fprintf(stderr, "kvshare calc: --context needs at least one length\n");
        return -1;
    }
    return 0;
}

/* "160GB" or "2x80GB" (also "2 x 80 GB", "8X141GB"): *gpus and the total. */
static int parse_gpu_memory(const char *text, uint32_t *gpus, uint64_t *total)
{
    const char *size = text;
    unsigned long long n = 1;
    const char *x = strpbrk(text, "xX");
    if (x != NULL) {
        char *end = NULL;
        errno = 0;
        n = strtoull(text, &end, 10);
        while (end != NULL && isspace((unsigned char)*end))
            end++;
        if (!isdigit((unsigned char)text[0]) || errno != 0 || end != x || n == 0 || n > UINT32_MAX)
            return -1;
        size = x + 1;
    }
    uint64_t each;
    if (units_parse_bytes(size, &each) != 0 || each == 0 || each > UINT64_MAX / n)
        return -1;
    *gpus = (uint32_t)n;
    *total = each * n;
    return 0;
}

/* A plain decimal number (no sign, exponent, inf or nan). */
static int parse_decimal(const char *text, double *out)
{
    if (!isdigit((unsigned char)text[0]) && text[0] != '.')
        return -1;
    for (const char *p = text; *p != '\0'; p++)
        if (!isdigit((unsigned char)*p) && *p != '.')
            return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* The budget from the node's memory; fills a->usable and a->derived.
 * Returns 0, or 2 (usage) with a message when nothing is left for KV. */
static int derive_budget(calc_args_t *a)
{
    if (geometry_derive_budget(a->gpu_memory, a->utilization, a->weights, a->overhead, &a->usable,
                               &a->derived) != 0) {
        fprintf(stderr,
                "kvshare calc: weights (%" PRIu64 " B) and overhead (%" PRIu64
                " B) take all of %" PRIu64 " B x %g: nothing is left for the KV cache\n",
                a->weights, a->overhead, a->gpu_memory, a->utilization);
        return 2;
    }
    return 0;
}

/* One rank's geometry for --tp (a->rank_g, a->replication). Returns 0, or
 * 2 (usage) with a message when the heads do not split over the ranks, or
 * --gpu-memory names another number of GPUs. */
static int split_ranks(calc_args_t *a)
{
    if (a->tp == 0)
        a->tp = 1;
    a->rank_g = a->g;
    a->replication = 1;
    if (a->have_gpu && a->gpus > 1 && a->tp > 1 && a->gpus != a->tp) {
        fprintf(stderr,
                "kvshare calc: --gpu-memory names %" PRIu32 " GPUs and --tp %" PRIu32
                " ranks: one kvshared serves one tensor-parallel group; give the group's GPUs "
                "(e.g. --gpu-memory %" PRIu32 "x80GB --tp %" PRIu32 ")\n",
                a->gpus, a->tp, a->tp, a->tp);
        return 2;
    }
    if (a->tp == 1)
        return 0;
    if (geometry_is_mla(&a->g)) {
        a->replication = a->tp; /* the latent is whole on every rank */
        return 0;
    }
    if (a->g.kv_heads >= a->tp && a->g.kv_heads % a->tp == 0) {
        a->rank_g.kv_heads = a->g.kv_heads / a->tp;
        return 0;
    }
    if (a->g.kv_heads < a->tp && a->tp % a->g.kv_heads == 0) {
        a->rank_g.kv_heads = 1;
        a->replication = a->tp / a->g.kv_heads;
        return 0;
    }
    fprintf(stderr,
            "kvshare calc: %" PRIu32 " KV heads do not split over %" PRIu32
            " ranks: --tp must divide the KV heads, or be a multiple of them\n",
            a->g.kv_heads, a->tp);
    return 2;
}

/* Returns 0, or the exit status to stop with. */
static int calc_parse(int argc, char **argv, calc_args_t *a)
{
    enum {
        OPT_LAYERS = 256,
        OPT_KV_HEADS,
        OPT_HEAD_DIM,
        OPT_KV_LORA_RANK,
        OPT_ROPE_HEAD_DIM,
        OPT_BLOCK_TOKENS,
        OPT_GPU_MEMORY,
        OPT_WEIGHTS,
        OPT_UTILIZATION,
        OPT_OVERHEAD,
        OPT_USERS,
        OPT_PRICE,
        OPT_TP,
        OPT_LIST,
    };
    static const struct option options[] = {
        {"model", required_argument, NULL, 'm'},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
        {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
        {"kv-lora-rank", required_argument, NULL, OPT_KV_LORA_RANK},
        {"rope-head-dim", required_argument, NULL, OPT_ROPE_HEAD_DIM},
        {"dtype", required_argument, NULL, 'd'},
        {"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
        {"budget", required_argument, NULL, 'b'},
        {"gpu-memory", required_argument, NULL, OPT_GPU_MEMORY},
        {"weights", required_argument, NULL, OPT_WEIGHTS},
        {"utilization", required_argument, NULL, OPT_UTILIZATION},
        {"overhead", required_argument, NULL, OPT_OVERHEAD},
        {"context", required_argument, NULL, 'c'},
        {"users", required_argument, NULL, OPT_USERS},
        {"price-per-hour", required_argument, NULL, OPT_PRICE},
        {"tp", required_argument, NULL, OPT_TP},
        {"json", no_argument, NULL, 'j'},
        {"list-models", no_argument, NULL, OPT_LIST},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* Overrides are applied after the preset, whatever their order. */
    uint32_t layers = 0, kv_heads = 0, head_dim = 0, block_tokens = 0;
    uint32_t kv_lora_rank = 0, rope_head_dim = 0;
    int have_rope = 0, have_dtype = 0, have_weights = 0, have_util = 0, have_overhead = 0;
    geometry_dtype_t dtype = GEOMETRY_BF16;
    int c;
    a->utilization = CALC_DEFAULT_UTILIZATION;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:d:b:c:jh", options, NULL)) != -1) {
        switch (c) {
        case 'm':
            a->model = optarg;
            break;
        case OPT_LAYERS:
            if (parse_u32("--layers", optarg, &layers) != 0)
                return 2;
            break;
        case OPT_KV_HEADS:
            if (parse_u32("--kv-heads", optarg, &kv_heads) != 0)
                return 2;
            break;
        case OPT_HEAD_DIM:
            if (parse_u32("--head-dim", optarg, &head_dim) != 0)
                return 2;
            break;
        case OPT_KV_LORA_RANK:
            if (parse_u32("--kv-lora-rank", optarg, &kv_lora_rank) != 0)
                return 2;
            break;
        case OPT_ROPE_HEAD_DIM:
            if (parse_u32("--rope-head-dim", optarg, &rope_head_dim) != 0)
                return 2;
            have_rope = 1;
            break;
        case OPT_BLOCK_TOKENS:
            if (parse_u32("--block-tokens", optarg, &block_tokens) != 0)
                return 2;
            break;
        case 'd':
            if (geometry_dtype_parse(optarg, &dtype) != 0) {
                fprintf(stderr, "kvshare calc: unknown dtype '%s' (fp32, fp16, bf16, fp8)\n",
                        optarg);
                return 2;
            }
            have_dtype = 1;
            break;
        case 'b':
            if (units_parse_bytes(optarg, &a->budget) != 0 || a->budget == 0) {
                fprintf(stderr, "kvshare calc: bad budget '%s' (want e.g. 70GB, 64GiB, 500MB)\n",
                        optarg);
                return 2;
            }
            a->have_budget = 1;
            a->budget_given = 1;
            break;
        case OPT_GPU_MEMORY:
            if (parse_gpu_memory(optarg, &a->gpus, &a->gpu_memory) != 0) {
                fprintf(stderr,
                        "kvshare calc: bad --gpu-memory '%s' (want a total such as 160GB, or "
                        "GPUs x memory such as 2x80GB)\n",
                        optarg);
                return 2;
            }
            a->have_gpu = 1;
            break;
        case OPT_WEIGHTS:
        case OPT_OVERHEAD: {
            uint64_t *v = c == OPT_WEIGHTS ? &a->weights : &a->overhead;
            if (units_parse_bytes(optarg, v) != 0) {
                fprintf(stderr, "kvshare calc: bad %s '%s' (want e.g. 70GB, 5GB, 512MiB)\n",
                        c == OPT_WEIGHTS ? "--weights" : "--overhead", optarg);
                return 2;
            }
            *(c == OPT_WEIGHTS ? &have_weights : &have_overhead) = 1;
            break;
        }
        case OPT_UTILIZATION:
            if (parse_decimal(optarg, &a->utilization) != 0 || !(a->utilization > 0) ||
                a->utilization > 1) {
                fprintf(stderr,
                        "kvshare calc: --utilization wants a fraction in (0, 1], e.g. 0.9, "
                        "not '%s'\n",
                        optarg);
                return 2;
            }
            have_util = 1;
            break;
        case 'c':
            if (parse_contexts(a, optarg) != 0)
                return 2;
            break;
        case OPT_USERS: {
            uint32_t users;
            if (parse_u32("--users", optarg, &users) != 0)
                return 2;
            a->users = users;
            break;
        }
        case OPT_PRICE:
            if (parse_decimal(optarg, &a->price_per_hour) != 0) {
                fprintf(stderr,
                        "kvshare calc: --price-per-hour wants the node's price per hour, e.g. "
                        "6 or 12.50, not '%s'\n",
                        optarg);
                return 2;
            }
            a->have_price = 1;
            break;
        case OPT_TP:
            if (parse_u32("--tp", optarg, &a->tp) != 0)
                return 2;
            if (a->tp == 0 || a->tp > 64) {
                fprintf(stderr, "kvshare calc: --tp wants 1 to 64 ranks (GPUs), not %s\n", optarg);
                return 2;
            }
            break;
        case 'j':
            a->json = 1;
            break;
        case OPT_LIST:
            for (size_t i = 0; geometry_preset_name(i) != NULL; i++) {
                geometry_t g;
                geometry_preset(geometry_preset_name(i), &g);
                if (geometry_is_mla(&g))
                    printf("%-18s %3" PRIu32 " layers MLA %4" PRIu32 " kv_lora_rank %3" PRIu32
                           " rope_head_dim  %7" PRIu64 " B/token (bf16)\n",
                           geometry_preset_name(i), g.layers, g.kv_lora_rank, g.rope_head_dim,
                           geometry_bytes_per_token(&g));
                else
                    printf("%-18s %3" PRIu32 " layers %3" PRIu32 " kv_heads %4" PRIu32
                           " head_dim  %7" PRIu64 " B/token (bf16)\n",
                           geometry_preset_name(i), g.layers, g.kv_heads, g.head_dim,
                           geometry_bytes_per_token(&g));
            }
            return -1;
        case 'h':
            calc_usage(stdout);
            return -1;
        case ':':
            fprintf(stderr, "kvshare calc: %s needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "kvshare calc: unknown option '%s'\n\n", argv[optind - 1]);
            calc_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvshare calc: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    memset(&a->g, 0, sizeof(a->g));
    a->g.dtype = GEOMETRY_BF16;
    a->g.block_tokens = 16;
    if (a->model != NULL && geometry_preset(a->model, &a->g) != 0) {
        fprintf(stderr,
                "kvshare calc: unknown model '%s': see kvshare calc --list-models, or "
                "give --layers, --kv-heads and --head-dim\n",
                a->model);
        return 2;
    }
    /* --kv-lora-rank makes the model MLA: the preset's heads no longer apply. */
    if (kv_lora_rank != 0) {
        a->g.kv_lora_rank = kv_lora_rank;
        a->g.kv_heads = a->g.head_dim = 0;
    }
    if (have_rope)
        a->g.rope_head_dim = rope_head_dim;
    if (geometry_is_mla(&a->g) && (kv_heads != 0 || head_dim != 0)) {
        fprintf(stderr, "kvshare calc: an MLA model (kv_lora_rank) has no --kv-heads or "
                        "--head-dim: its KV is one latent per token and layer\n");
        return 2;
    }
    if (!geometry_is_mla(&a->g) && have_rope) {
        fprintf(stderr, "kvshare calc: --rope-head-dim belongs to an MLA model: give "
                        "--kv-lora-rank too\n");
        return 2;
    }
    if (layers != 0)
        a->g.layers = layers;
    if (kv_heads != 0)
        a->g.kv_heads = kv_heads;
    if (head_dim != 0)
        a->g.head_dim = head_dim;
    if (block_tokens != 0)
        a->g.block_tokens = block_tokens;
    if (have_dtype)
        a->g.dtype = dtype;
    if (a->g.layers == 0 ||
        (!geometry_is_mla(&a->g) && (a->g.kv_heads == 0 || a->g.head_dim == 0))) {
        fprintf(stderr, "kvshare calc: give --model, or all of --layers, --kv-heads and "
                        "--head-dim (or --layers and --kv-lora-rank for an MLA model)\n");
        return 2;
    }
    if (geometry_validate(&a->g) != 0) {
        fprintf(stderr, "kvshare calc: that geometry is too large to address\n");
        return 2;
    }
    if ((have_weights || have_util || have_overhead) && !a->have_gpu) {
        fprintf(stderr, "kvshare calc: --weights, --utilization and --overhead size the KV "
                        "budget from --gpu-memory: give --gpu-memory too\n");
        return 2;
    }
    if (a->have_gpu && !have_weights) {
        fprintf(stderr, "kvshare calc: --gpu-memory needs --weights (the model's weights on "
                        "those GPUs; --weights 0 if they live elsewhere)\n");
        return 2;
    }
    if (a->have_gpu) {
        int rc = derive_budget(a);
        if (rc != 0)
            return rc;
        if (!a->budget_given) {
            a->budget = a->derived;
            a->have_budget = 1;
        }
    }
    if (a->have_price && !a->have_budget) {
        fprintf(stderr, "kvshare calc: --price-per-hour divides the node's price by the users "
                        "that fit: give --budget or --gpu-memory\n");
        return 2;
    }
    if (a->n_contexts == 0 && parse_contexts(a, CALC_DEFAULT_CONTEXTS) != 0)
        return 2;
    return split_ranks(a);
}

/* Three significant digits or so: 0.67, 5.37, 42.9, 137. */
static void format_gb(uint64_t bytes, char *buf, size_t len)
{
    double gb = (double)bytes / 1e9;
    const char *fmt = gb >= 100 ? "%.0f GB" : gb >= 10 ? "%.1f GB" : "%.2f GB";
    snprintf(buf, len, fmt, gb);
}

static uint64_t blocks_per_seq(const geometry_t *g, uint64_t ctx)
{
    return ctx / g->block_tokens + (ctx % g->block_tokens != 0);
}

/* Each device's share of the budget: all of it with one device. */
static uint64_t device_budget(const calc_args_t *a)
{
    return a->budget / a->tp;
}

/* A sequence's KV over the whole group (every rank's share, replicas
 * included), saturating. */
static uint64_t seq_bytes(const calc_args_t *a, uint64_t ctx)
{
    uint64_t one = geometry_seq_bytes(&a->rank_g, ctx);
    return one > UINT64_MAX / a->tp ? UINT64_MAX : one * a->tp;
}

/* Sequences of ctx tokens that fit: as many as one device's pool holds. */
static uint64_t seqs_fit(const calc_args_t *a, uint64_t ctx)
{
    return geometry_seqs_for_budget(&a->rank_g, device_budget(a), ctx);
}

/* The node's price divided by the sequences of ctx tokens that fit; -1 when
 * none fits (no price per user then). */
static double user_hour_price(const calc_args_t *a, uint64_t ctx)
{
    uint64_t seqs = seqs_fit(a, ctx);
    return seqs == 0 ? -1.0 : a->price_per_hour / (double)seqs;
}

/* Whether a->users sequences of ctx tokens fit in the pool at once. */
static int users_fit(const calc_args_t *a, const geometry_plan_t *plan, uint64_t ctx)
{
    uint64_t per_seq = blocks_per_seq(&a->g, ctx);
    return plan != NULL && per_seq <= plan->blocks / a->users;
}

/* users x the KV of one sequence, saturating. */
static uint64_t users_bytes(const calc_args_t *a, uint64_t ctx)
{
    uint64_t one = seq_bytes(a, ctx);
    return one > UINT64_MAX / a->users ? UINT64_MAX : one * a->users;
}

/* Cents below a dollar, two decimals above: $0.059, $0.50, $2.00. */
static void format_price(double price, char *buf, size_t len)
{
    if (price < 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, price < 0.1 ? "$%.3f" : "$%.2f", price);
}

static void print_budget(const calc_args_t *a, const geometry_plan_t *plan)
{
    char b1[48], b2[48], b3[48];
    if (a->have_gpu) {
        format_gb(a->gpu_memory, b1, sizeof(b1));
        format_gb(a->gpu_memory / a->gpus, b2, sizeof(b2));
        format_gb(a->usable, b3, sizeof(b3));
        if (a->gpus > 1)
            printf("gpu memory   %" PRIu64 " B (%" PRIu32 " x %s = %s) x %g utilization = %s\n",
                   a->gpu_memory, a->gpus, b2, b1, a->utilization, b3);
        else
            printf("gpu memory   %" PRIu64 " B (%s) x %g utilization = %s\n", a->gpu_memory, b1,
                   a->utilization, b3);
        format_gb(a->weights, b1, sizeof(b1));
        printf("weights      %" PRIu64 " B (%s)\n", a->weights, b1);
        format_gb(a->overhead, b1, sizeof(b1));
        printf("overhead     %" PRIu64 " B (%s)\n", a->overhead, b1);
    }
    format_gb(a->budget, b1, sizeof(b1));
    units_format_bytes(a->budget, 2, b2, sizeof(b2));
    if (a->tp > 1) {
        char d1[48], d2[48];
        format_gb(device_budget(a), d1, sizeof(d1));
        units_format_bytes(device_budget(a), 2, d2, sizeof(d2));
        printf("budget       %" PRIu64 " B (%s, %s) for the group: %" PRIu64
               " B (%s, %s) per device\n",
               a->budget, b1, b2, device_budget(a), d1, d2);
        if (plan != NULL)
            printf("             each device's pool: %" PRIu64 " blocks of %" PRIu64 " B, %" PRIu64
                   " tokens (the same block ids on every device)\n",
                   plan->blocks, geometry_block_bytes(&a->rank_g), plan->tokens);
        else
            printf("             not even one block fits a device\n");
    } else if (plan != NULL)
        printf("budget       %" PRIu64 " B (%s, %s): %" PRIu64 " blocks, %" PRIu64 " tokens\n",
               a->budget, b1, b2, plan->blocks, plan->tokens);
    else
        printf("budget       %" PRIu64 " B (%s, %s): not even one block fits\n", a->budget, b1, b2);
    if (a->have_gpu) {
        char usable[48], weights[48], overhead[48], derived[48];
        format_gb(a->usable, usable, sizeof(usable));
        format_gb(a->weights, weights, sizeof(weights));
        format_gb(a->overhead, overhead, sizeof(overhead));
        format_gb(a->derived, derived, sizeof(derived));
        if (a->budget_given)
            printf("             given by --budget; the GPUs would leave %s - %s weights - %s "
                   "overhead = %s\n",
                   usable, weights, overhead, derived);
        else
            printf("             = %s - %s weights - %s overhead\n", usable, weights, overhead);
    }
}

/* --tp: one rank's share, and the kvshared that serves the group. */
static void print_ranks(const calc_args_t *a)
{
    const geometry_t *r = &a->rank_g;
    char b1[48], b2[48];
    units_format_bytes(geometry_bytes_per_token(r), 2, b1, sizeof(b1));
    units_format_bytes(geometry_block_bytes(r), 2, b2, sizeof(b2));
    if (geometry_is_mla(r))
        printf("per rank     tp %" PRIu32 ": the whole latent on every rank, %" PRIu64
               " B/token (%s), %" PRIu64 " B per block (%s)\n",
               a->tp, geometry_bytes_per_token(r), b1, geometry_block_bytes(r), b2);
    else
        printf("per rank     tp %" PRIu32 ": %" PRIu32 " kv_heads, %" PRIu64
               " B/token (%s), %" PRIu64 " B per block (%s)\n",
               a->tp, r->kv_heads, geometry_bytes_per_token(r), b1, geometry_block_bytes(r), b2);
    if (a->replication > 1)
        printf("             each KV value is held by %" PRIu32
               " ranks (fewer KV heads than ranks): the group holds %" PRIu64 " B/token\n",
               a->replication, geometry_bytes_per_token(r) * a->tp);
    if (geometry_is_mla(r))
        printf("kvshared     --devices 0-%" PRIu32 " --layers %" PRIu32 " --kv-lora-rank %" PRIu32
               " --rope-head-dim %" PRIu32 " --dtype %s --block-tokens %" PRIu32 "\n",
               a->tp - 1, r->layers, r->kv_lora_rank, r->rope_head_dim,
               geometry_dtype_name(r->dtype), r->block_tokens);
    else
        printf("kvshared     --devices 0-%" PRIu32 " --layers %" PRIu32 " --kv-heads %" PRIu32
               " --head-dim %" PRIu32 " --dtype %s --block-tokens %" PRIu32 "\n",
               a->tp - 1, r->layers, r->kv_heads, r->head_dim, geometry_dtype_name(r->dtype),
               r->block_tokens);
}

static void print_text(const calc_args_t *a, const geometry_plan_t *plan)
{
    const geometry_t *g = &a->g;
    char b1[48];
    if (geometry_is_mla(g))
        printf("model        %s: %" PRIu32 " layers, MLA kv_lora_rank %" PRIu32
               " + rope_head_dim %" PRIu32 ", %s, %" PRIu32 "-token blocks\n",
               a->model != NULL ? a->model : "custom", g->layers, g->kv_lora_rank, g->rope_head_dim,
               geometry_dtype_name(g->dtype), g->block_tokens);
    else
        printf("model        %s: %" PRIu32 " layers, %" PRIu32 " kv_heads, head_dim %" PRIu32
               ", %s, %" PRIu32 "-token blocks\n",
               a->model != NULL ? a->model : "custom", g->layers, g->kv_heads, g->head_dim,
               geometry_dtype_name(g->dtype), g->block_tokens);
    units_format_bytes(geometry_bytes_per_token(g), 2, b1, sizeof(b1));
    printf("per token    %" PRIu64 " B/token (%s)\n", geometry_bytes_per_token(g), b1);
    units_format_bytes(geometry_block_bytes(g), 2, b1, sizeof(b1));
    printf("per block    %" PRIu64 " B (%s)\n", geometry_block_bytes(g), b1);
    if (a->tp > 1)
        print_ranks(a);
    if (a->have_budget)
        print_budget(a, plan);
    if (a->have_price)
        printf("price        $%.2f per hour for the node\n", a->price_per_hour);

    char users_head[32];
    snprintf(users_head, sizeof(users_head), "KV/%" PRIu64 " users", a->users);
    printf("\n%-9s %9s %12s %11s", "context", "tokens", "KV/sequence", "blocks/seq");
    if (a->have_budget)
        printf(" %10s", "sequences");
    if (a->users != 0)
        printf(" %15s%s", users_head, a->have_budget ? "  fits" : "");
    if (a->have_price)
        printf(" %12s", "$/user-hour");
    printf("\n");
    for (size_t i = 0; i < a->n_contexts; i++) {
        uint64_t ctx = a->contexts[i];
        format_gb(seq_bytes(a, ctx), b1, sizeof(b1));
        printf("%-9s %9" PRIu64 " %12s %11" PRIu64, a->context_names[i], ctx, b1,
               blocks_per_seq(g, ctx));
        if (a->have_budget)
            printf(" %10" PRIu64, seqs_fit(a, ctx));
        if (a->users != 0) {
            format_gb(users_bytes(a, ctx), b1, sizeof(b1));
            printf(" %15s", b1);
            if (a->have_budget)
                printf("  %-4s", users_fit(a, plan, ctx) ? "yes" : "no");
        }
        if (a->have_price) {
            format_price(user_hour_price(a, ctx), b1, sizeof(b1));
            printf(" %12s", b1);
        }
        printf("\n");
    }
}

static void print_json(const calc_args_t *a, const geometry_plan_t *plan)
{
    const geometry_t *g = &a->g;
    printf("{\"model\":");
    if (a->model != NULL) {
        putchar('"');
        for (const char *p = a->model; *p != '\0'; p++) {
            if (*p == '"' || *p == '\\')
                putchar('\\');
            if ((unsigned char)*p >= 0x20)
                putchar(*p);
        }
        putchar('"');
    } else {
        printf("null");
    }
    printf(",\"attention\":\"%s\",\"layers\":%" PRIu32 ",\"kv_heads\":%" PRIu32
           ",\"head_dim\":%" PRIu32 ",\"kv_lora_rank\":%" PRIu32 ",\"rope_head_dim\":%" PRIu32
           ",\"dtype\":\"%s\",\"block_tokens\":%" PRIu32 ",\"bytes_per_token\":%" PRIu64
           ",\"block_bytes\":%" PRIu64,
           geometry_is_mla(g) ? "mla" : "mha", g->layers, g->kv_heads, g->head_dim, g->kv_lora_rank,
           g->rope_head_dim, geometry_dtype_name(g->dtype), g->block_tokens,
           geometry_bytes_per_token(g), geometry_block_bytes(g));
    if (a->have_gpu)
        printf(",\"gpus\":%" PRIu32 ",\"gpu_memory_bytes\":%" PRIu64 ",\"utilization\":%g"
               ",\"usable_bytes\":%" PRIu64 ",\"weights_bytes\":%" PRIu64
               ",\"overhead_bytes\":%" PRIu64 ",\"derived_budget_bytes\":%" PRIu64,
               a->gpus, a->gpu_memory, a->utilization, a->usable, a->weights, a->overhead,
               a->derived);
    if (a->have_budget)
        printf(",\"budget_source\":\"%s\",\"budget_bytes\":%" PRIu64 ",\"blocks\":%" PRIu64
               ",\"tokens\":%" PRIu64,
               a->budget_given ? "budget" : "gpu_memory", a->budget,
               plan != NULL ? plan->blocks : 0, plan != NULL ? plan->tokens : 0);
    if (a->tp > 1)
        printf(",\"tp\":%" PRIu32 ",\"rank_kv_heads\":%" PRIu32 ",\"replication\":%" PRIu32
               ",\"rank_bytes_per_token\":%" PRIu64 ",\"rank_block_bytes\":%" PRIu64
               ",\"device_budget_bytes\":%" PRIu64,
               a->tp, a->rank_g.kv_heads, a->replication, geometry_bytes_per_token(&a->rank_g),
               geometry_block_bytes(&a->rank_g), a->have_budget ? device_budget(a) : 0);
    if (a->users != 0)
        printf(",\"users\":%" PRIu64, a->users);
    if (a->have_price)
        printf(",\"price_per_hour\":%.6g", a->price_per_hour);
    printf(",\"contexts\":[");
    for (size_t i = 0; i < a->n_contexts; i++) {
        uint64_t ctx = a->contexts[i];
        printf("%s{\"tokens\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"kv_bytes\":%" PRIu64,
               i ? "," : "", ctx, blocks_per_seq(g, ctx), seq_bytes(a, ctx));
        if (a->have_budget)
            printf(",\"sequences\":%" PRIu64, seqs_fit(a, ctx));
        if (a->users != 0) {
            printf(",\"users_kv_bytes\":%" PRIu64, users_bytes(a, ctx));
            if (a->have_budget)
                printf(",\"users_fit\":%s", users_fit(a, plan, ctx) ? "true" : "false");
        }
        if (a->have_price) {
            double price = user_hour_price(a, ctx);
            if (price < 0)
                printf(",\"price_per_user_hour\":null");
            else
                printf(",\"price_per_user_hour\":%.6g", price);
        }
        printf("}");
    }
    printf("]}\n");
}

int kvshare_calc(int argc, char **argv)
{
    calc_args_t a;
    memset(&a, 0, sizeof(a));
    int rc = calc_parse(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    geometry_plan_t plan;
    const geometry_plan_t *p = NULL;
    if (a.have_budget && geometry_plan(&a.rank_g, device_budget(&a), &plan) == 0)
        p = &plan;
    if (a.json)
        print_json(&a, p);
    else
        print_text(&a, p);
    return fflush(stdout) == 0 ? 0 : 1;
}
