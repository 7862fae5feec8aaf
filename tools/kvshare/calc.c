/*
 * kvshare calc: how much KV a model needs and how many sequences fit.
 *
 *   kvshare calc --model llama-3.1-70b --dtype fp8 --budget 70GB --context 4k,32k,128k
 *
 * A sequence is counted in whole blocks (ceil(tokens / block_tokens)), since
 * that is what the pool hands out; sizes print in decimal GB (10^9 bytes),
 * exact bytes in --json.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "geometry.h"

#define CALC_MAX_CONTEXTS     32
#define CALC_DEFAULT_CONTEXTS "4k,32k,128k"

typedef struct calc_args {
    const char *model;
    geometry_t g;
    int have_budget;
    uint64_t budget;
    size_t n_contexts;
    uint64_t contexts[CALC_MAX_CONTEXTS];
    const char *context_names[CALC_MAX_CONTEXTS];
    char context_text[512];
    int json;
} calc_args_t;

static void calc_usage(FILE *out)
{
    fprintf(out,
            "usage: kvshare calc [--model NAME] [--layers N --kv-heads N --head-dim N]\n"
            "                    [--dtype fp32|fp16|bf16|fp8] [--block-tokens N]\n"
            "                    [--budget SIZE] [--context LIST] [--json]\n"
            "       kvshare calc --list-models\n"
            "\n"
            "  --model NAME      a preset (see --list-models); the options below override it\n"
            "  --layers N, --kv-heads N, --head-dim N\n"
            "                    the model's shape (all three needed without --model)\n"
            "  --dtype T         KV element type (default bf16)\n"
            "  --block-tokens N  tokens per pool block (default 16)\n"
            "  --budget SIZE     KV memory, e.g. 70GB (10^9) or 64GiB (2^30)\n"
            "  --context LIST    context lengths, e.g. 4k,32k,128k (k = 1024; default %s)\n"
            "  --json            one JSON object instead of text\n",
            CALC_DEFAULT_CONTEXTS);
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

static int parse_contexts(calc_args_t *a, const char *text)
{
    if (strlen(text) >= sizeof(a->context_text)) {
        fprintf(stderr, "kvshare calc: --context list too long\n");
        return -1;
    }
    strcpy(a->context_text, text);
    a->n_contexts = 0;
    char *save = NULL;
    for (char *item = strtok_r(a->context_text, ",", &save); item != NULL;
         item = strtok_r(NULL, ",", &save)) {
        if (a->n_contexts == CALC_MAX_CONTEXTS) {
            fprintf(stderr, "kvshare calc: at most %d context lengths\n", CALC_MAX_CONTEXTS);
            return -1;
        }
        if (geometry_parse_tokens(item, &a->contexts[a->n_contexts]) != 0) {
            fprintf(stderr,
                    "kvshare calc: bad context length '%s' (want e.g. 4096, 4k, 128k, 1m)\n", item);
            return -1;
        }
        a->context_names[a->n_contexts++] = item;
    }
    if (a->n_contexts == 0) {
        fprintf(stderr, "kvshare calc: --context needs at least one length\n");
        return -1;
    }
    return 0;
}

/* Returns 0, or the exit status to stop with. */
static int calc_parse(int argc, char **argv, calc_args_t *a)
{
    enum { OPT_LAYERS = 256, OPT_KV_HEADS, OPT_HEAD_DIM, OPT_BLOCK_TOKENS, OPT_LIST };
    static const struct option options[] = {
        {"model", required_argument, NULL, 'm'},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
        {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
        {"dtype", required_argument, NULL, 'd'},
        {"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
        {"budget", required_argument, NULL, 'b'},
        {"context", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"list-models", no_argument, NULL, OPT_LIST},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* Overrides are applied after the preset, whatever their order. */
    uint32_t layers = 0, kv_heads = 0, head_dim = 0, block_tokens = 0;
    int have_dtype = 0;
    geometry_dtype_t dtype = GEOMETRY_BF16;
    const char *contexts = CALC_DEFAULT_CONTEXTS;
    int c;
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
            if (geometry_parse_bytes(optarg, &a->budget) != 0 || a->budget == 0) {
                fprintf(stderr, "kvshare calc: bad budget '%s' (want e.g. 70GB, 64GiB, 500MB)\n",
                        optarg);
                return 2;
            }
            a->have_budget = 1;
            break;
        case 'c':
            contexts = optarg;
            break;
        case 'j':
            a->json = 1;
            break;
        case OPT_LIST:
            for (size_t i = 0; geometry_preset_name(i) != NULL; i++) {
                geometry_t g;
                geometry_preset(geometry_preset_name(i), &g);
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
    if (a->g.layers == 0 || a->g.kv_heads == 0 || a->g.head_dim == 0) {
        fprintf(stderr, "kvshare calc: give --model, or all of --layers, --kv-heads and "
                        "--head-dim\n");
        return 2;
    }
    if (geometry_validate(&a->g) != 0) {
        fprintf(stderr, "kvshare calc: that geometry is too large to address\n");
        return 2;
    }
    if (parse_contexts(a, contexts) != 0)
        return 2;
    return 0;
}

/* Three significant digits or so: 0.67, 5.37, 42.9, 137. */
static void format_gb(uint64_t bytes, char *buf, size_t len)
{
    double gb = (double)bytes / 1e9;
    const char *fmt = gb >= 100 ? "%.0f GB" : gb >= 10 ? "%.1f GB" : "%.2f GB";
    snprintf(buf, len, fmt, gb);
}

/* Binary units for the small figures: 320 KiB, 5 MiB, 2.5 MiB. */
static void format_binary(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, v == (double)(uint64_t)v ? "%.0f %s" : "%.2f %s", v, units[u]);
}

static uint64_t blocks_per_seq(const geometry_t *g, uint64_t ctx)
{
    return ctx / g->block_tokens + (ctx % g->block_tokens != 0);
}

static void print_text(const calc_args_t *a, const geometry_plan_t *plan)
{
    const geometry_t *g = &a->g;
    char b1[48], b2[48];
    printf("model        %s: %" PRIu32 " layers, %" PRIu32 " kv_heads, head_dim %" PRIu32
           ", %s, %" PRIu32 "-token blocks\n",
           a->model != NULL ? a->model : "custom", g->layers, g->kv_heads, g->head_dim,
           geometry_dtype_name(g->dtype), g->block_tokens);
    format_binary(geometry_bytes_per_token(g), b1, sizeof(b1));
    printf("per token    %" PRIu64 " B/token (%s)\n", geometry_bytes_per_token(g), b1);
    format_binary(geometry_block_bytes(g), b1, sizeof(b1));
    printf("per block    %" PRIu64 " B (%s)\n", geometry_block_bytes(g), b1);
    if (a->have_budget) {
        format_gb(a->budget, b1, sizeof(b1));
        format_binary(a->budget, b2, sizeof(b2));
        if (plan != NULL)
            printf("budget       %" PRIu64 " B (%s, %s): %" PRIu64 " blocks, %" PRIu64 " tokens\n",
                   a->budget, b1, b2, plan->blocks, plan->tokens);
        else
            printf("budget       %" PRIu64 " B (%s, %s): not even one block fits\n", a->budget, b1,
                   b2);
    }
    printf("\n%-9s %9s %12s %11s", "context", "tokens", "KV/sequence", "blocks/seq");
    if (a->have_budget)
        printf(" %10s", "sequences");
    printf("\n");
    for (size_t i = 0; i < a->n_contexts; i++) {
        uint64_t ctx = a->contexts[i];
        format_gb(geometry_seq_bytes(g, ctx), b1, sizeof(b1));
        printf("%-9s %9" PRIu64 " %12s %11" PRIu64, a->context_names[i], ctx, b1,
               blocks_per_seq(g, ctx));
        if (a->have_budget)
            printf(" %10" PRIu64, geometry_seqs_for_budget(g, a->budget, ctx));
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
    printf(",\"layers\":%" PRIu32 ",\"kv_heads\":%" PRIu32 ",\"head_dim\":%" PRIu32
           ",\"dtype\":\"%s\",\"block_tokens\":%" PRIu32 ",\"bytes_per_token\":%" PRIu64
           ",\"block_bytes\":%" PRIu64,
           g->layers, g->kv_heads, g->head_dim, geometry_dtype_name(g->dtype), g->block_tokens,
           geometry_bytes_per_token(g), geometry_block_bytes(g));
    if (a->have_budget)
        printf(",\"budget_bytes\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"tokens\":%" PRIu64,
               a->budget, plan != NULL ? plan->blocks : 0, plan != NULL ? plan->tokens : 0);
    printf(",\"contexts\":[");
    for (size_t i = 0; i < a->n_contexts; i++) {
        uint64_t ctx = a->contexts[i];
        printf("%s{\"tokens\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"kv_bytes\":%" PRIu64,
               i ? "," : "", ctx, blocks_per_seq(g, ctx), geometry_seq_bytes(g, ctx));
        if (a->have_budget)
            printf(",\"sequences\":%" PRIu64, geometry_seqs_for_budget(g, a->budget, ctx));
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
    if (a.have_budget && geometry_plan(&a.g, a.budget, &plan) == 0)
        p = &plan;
    if (a.json)
        print_json(&a, p);
    else
        print_text(&a, p);
    return fflush(stdout) == 0 ? 0 : 1;
}
