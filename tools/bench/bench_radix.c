/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench radix: the prefix index under a serving-like load.
 *
 * Shape of the tree (defaults): 10,000 distinct system prompts of 32 blocks
 * (512 tokens) each, all cached under one root; then conversations, each one
 * system prompt followed by 224 blocks of its own, so a conversation is a
 * 4,096-token (256-block) prompt. Conversations are spread over the first
 * 1,000 system prompts (about 3 each, so a lookup crosses a branch point) and
 * added until the tree holds 1,000,000 blocks (the last one cut short).
 * Block size 16 tokens, token ids pseudo-random below 128,000.
 *
 * Measured, each operation timed alone with the monotonic clock:
 *   - lookup of a cached 4k-token conversation picked at random (hash, table
 *     probes, token verification of all 256 blocks, LRU touch): median, p99;
 *     and the same prompt looked up again and again (everything in cache);
 *   - insert of a new 4k-token prompt: one of the 1,000 system prompts in use
 *     (32 duplicate blocks) and 224 new blocks. Each insert follows an
 *     untimed lookup of the same prompt, as in a server, and the tree is
 *     kept at its size by evicting LRU leaves before it (timed separately);
 *   - re-insert of a cached 4k-token prompt (256 duplicates);
 *   - index memory per cached block, with and without the 64 B of token ids;
 *   - chained XXH3-64 over one 16-token block, the floor of any design that
 *     hashes every block.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bench.h"
#include "radix.h"

#define BT          16
#define PROMPT_BLKS 256
#define VOCAB       128000u

typedef struct bench_opts {
    uint32_t blocks;
    uint32_t prompts;
    uint32_t sys_blocks;
    uint32_t lookups;
    uint32_t inserts;
    uint64_t seed;
} bench_opts_t;

typedef struct free_ids {
    uint32_t *ids;
    size_t n;
} free_ids_t;

static void on_evict(void *ctx, uint32_t block_id)
{
    free_ids_t *f = ctx;
    f->ids[f->n++] = block_id;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

/* Token `pos` of stream `stream`: system prompts are streams 0 .. P-1,
 * conversation k's own tokens are stream (1 << 40) + k. */
static void fill_tokens(uint32_t *out, uint64_t seed, uint64_t stream, size_t from, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (uint32_t)(mix64(seed ^ (stream << 24) ^ (from + i)) % VOCAB);
}

/* The 4k-token prompt of conversation k: system prompt `sys`, then its own. */
static void conversation_on(const bench_opts_t *o, uint64_t k, uint64_t sys, uint32_t *tok)
{
    fill_tokens(tok, o->seed, sys, 0, (size_t)o->sys_blocks * BT);
    fill_tokens(tok + (size_t)o->sys_blocks * BT, o->seed, (1ull << 40) + k, 0,
                (size_t)(PROMPT_BLKS - o->sys_blocks) * BT);
}

/* System prompts that carry conversations: the first 1,000. */
static uint64_t hot_prompts(const bench_opts_t *o)
{
    return o->prompts < 1000 ? o->prompts : 1000;
}

/* Conversation k: spread over the system prompts in use. */
static void conversation(const bench_opts_t *o, uint64_t k, uint32_t *tok)
{
    conversation_on(o, k, (k * 7919) % hot_prompts(o), tok);
}

static int take_ids(free_ids_t *f, uint32_t *ids, size_t n)
{
    if (f->n < n)
        return -1;
    for (size_t i = 0; i < n; i++)
        ids[i] = f->ids[--f->n];
    return 0;
}

static void print_dist(const char *name, uint64_t *ns, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)ns[i];
    double p50 = bench_quantile(ns, n, 0.5), p99 = bench_quantile(ns, n, 0.99);
    printf("%s_median %.2f us\n", name, p50 / 1e3);
    printf("%s_p99 %.2f us\n", name, p99 / 1e3);
    printf("%s_per_s %.0f ops/s\n", name, n / (sum / 1e9));
}

static int parse_u(const char *s, uint64_t *v)
{
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (!*s || *end)
        return -1;
    *v = x;
    return 0;
}

static void usage(void)
{
    printf("usage: kvshare-bench radix [--blocks N] [--prompts N] [--sys-blocks N]\n"
           "                           [--lookups N] [--inserts N] [--seed N]\n"
           "                           [--policy lru|freq]\n"
           "defaults: 1000000 blocks, 10000 system prompts of 32 blocks, 200000 lookups,\n"
           "          20000 inserts; 16-token blocks, 4096-token prompts\n");
}

int bench_radix(int argc, char **argv)
{
    bench_opts_t o = {1000000, 10000, 32, 200000, 20000, 42};
    radix_policy_t policy = RADIX_EVICT_LRU;
    for (int i = 1; i < argc; i++) {
        uint64_t v = 0;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage();
            return 0;
        }
        if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc &&
            (strcmp(argv[i + 1], "lru") == 0 || strcmp(argv[i + 1], "freq") == 0)) {
            policy = argv[i + 1][0] == 'f' ? RADIX_EVICT_FREQ : RADIX_EVICT_LRU;
            i++;
            continue;
        }
        if (i + 1 >= argc || parse_u(argv[i + 1], &v) != 0 || v > UINT32_MAX) {
            usage();
            return 2;
        }
        if (strcmp(argv[i], "--blocks") == 0)
            o.blocks = (uint32_t)v;
        else if (strcmp(argv[i], "--prompts") == 0)
            o.prompts = (uint32_t)v;
        else if (strcmp(argv[i], "--sys-blocks") == 0)
            o.sys_blocks = (uint32_t)v;
        else if (strcmp(argv[i], "--lookups") == 0)
            o.lookups = (uint32_t)v;
        else if (strcmp(argv[i], "--inserts") == 0)
            o.inserts = (uint32_t)v;
        else if (strcmp(argv[i], "--seed") == 0)
            o.seed = v;
        else {
            usage();
            return 2;
        }
        i++;
    }
    if (o.prompts == 0 || o.sys_blocks == 0 || o.sys_blocks >= PROMPT_BLKS || o.lookups == 0 ||
        (uint64_t)o.prompts * o.sys_blocks + PROMPT_BLKS > o.blocks) {
        fprintf(stderr, "kvshare-bench radix: the system prompts and one conversation must fit "
                        "in --blocks\n");
        return 2;
    }

    int status = 1;
    uint32_t conv_blks = PROMPT_BLKS - o.sys_blocks;
    uint32_t max_blocks = o.blocks + 4 * PROMPT_BLKS;
    uint32_t *tok = malloc(PROMPT_BLKS * BT * sizeof(uint32_t));
    uint32_t ids[PROMPT_BLKS], canon[PROMPT_BLKS];
    free_ids_t f = {malloc((size_t)max_blocks * sizeof(uint32_t)), 0};
    uint64_t *samples =
        malloc((size_t)(o.lookups > o.inserts ? o.lookups : o.inserts + 1) * sizeof(uint64_t));
    radix_tree_t *t = NULL;
    radix_config_t cfg = {.block_tokens = BT,
                          .max_blocks = max_blocks,
                          .on_evict = on_evict,
                          .evict_ctx = &f,
                          .policy = policy};
    uint32_t ns;
    size_t n, done;
    if (!tok || !f.ids || !samples || radix_new(&cfg, &t) != 0 ||
        radix_ns_create(t, "bench", 0x5eed, 0, 0, &ns) != 0) {
        fprintf(stderr, "kvshare-bench radix: out of memory\n");
        goto out;
    }
    for (uint32_t id = max_blocks; id-- > 0;)
        f.ids[f.n++] = id;

    /* Build: system prompts, then conversations up to o.blocks. */
    uint64_t t0 = (uint64_t)now_ns();
    for (uint32_t p = 0; p < o.prompts; p++) {
        fill_tokens(tok, o.seed, p, 0, (size_t)o.sys_blocks * BT);
        take_ids(&f, ids, o.sys_blocks);
        if (radix_insert(t, ns, tok, (size_t)o.sys_blocks * BT, ids, o.sys_blocks, false, canon,
                         &done) != 0)
            goto broken;
    }
    uint64_t n_conv = 0;
    while (radix_cached_blocks(t) < o.blocks) {
        uint32_t room = o.blocks - radix_cached_blocks(t);
        uint32_t nb = o.sys_blocks + (room < conv_blks ? room : conv_blks);
        conversation(&o, n_conv, tok);
        take_ids(&f, ids, nb);
        if (radix_insert(t, ns, tok, (size_t)nb * BT, ids, nb, false, canon, &done) != 0)
            goto broken;
        for (uint32_t i = 0; i < o.sys_blocks; i++)
            f.ids[f.n++] = ids[i]; /* duplicates: the ids stay ours */
        if (nb == PROMPT_BLKS)
            n_conv++;
    }
    uint64_t build_ns = (uint64_t)now_ns() - t0;
    uint32_t cached = radix_cached_blocks(t);
    size_t mem = radix_memory_bytes(t);
    printf("tree_blocks %u blocks\n", cached);
    printf("tree_system_prompts %u prompts of %u blocks\n", o.prompts, o.sys_blocks);
    printf("tree_conversations %llu full 4k-token prompts\n", (unsigned long long)n_conv);
    printf("build_time %.2f s\n", build_ns / 1e9);
    printf("memory_total %.1f MiB\n", mem / 1048576.0);
    printf("bytes_per_block %.1f B (incl. %d B token ids)\n", (double)mem / cached, BT * 4);
    printf("bytes_per_block_index %.1f B (excl. token ids)\n", (double)mem / cached - BT * 4);

    /* Chained XXH3-64 over one block, in this run. */
    {
        conversation(&o, 0, tok);
        uint64_t h = 0x5eed, reps = 20000;
        t0 = (uint64_t)now_ns();
        for (uint64_t r = 0; r < reps; r++)
            for (uint32_t b = 0; b < PROMPT_BLKS; b++)
                h = XXH3_64bits_withSeed(tok + (size_t)b * BT, BT * sizeof(uint32_t), h);
        double per = (double)((uint64_t)now_ns() - t0) / (double)(reps * PROMPT_BLKS);
        printf("xxh3_chained_per_block %.2f ns (4k prompt: %.2f us) [%llx]\n", per,
               per * PROMPT_BLKS / 1e3, (unsigned long long)(h & 0xf));
    }

    /* Lookups of random cached conversations. */
    for (uint32_t i = 0; i < o.lookups; i++) {
        uint64_t k = mix64(o.seed + i) % n_conv;
        conversation(&o, k, tok);
        t0 = (uint64_t)now_ns();
        radix_lookup(t, ns, tok, PROMPT_BLKS * BT, false, ids, PROMPT_BLKS, &n);
        samples[i] = (uint64_t)now_ns() - t0;
        if (n != PROMPT_BLKS)
            goto broken;
    }
    print_dist("lookup_4k_random", samples, o.lookups);

    /* The same prompt again and again: all of it in cache. */
    conversation(&o, 1, tok);
    for (uint32_t i = 0; i < o.lookups; i++) {
        t0 = (uint64_t)now_ns();
        radix_lookup(t, ns, tok, PROMPT_BLKS * BT, false, ids, PROMPT_BLKS, &n);
        samples[i] = (uint64_t)now_ns() - t0;
        if (n != PROMPT_BLKS)
            goto broken;
    }
    print_dist("lookup_4k_hot", samples, o.lookups);

    /* Re-insert of a cached 4k prompt: 256 duplicates. */
    for (uint32_t i = 0; i < o.inserts; i++) {
        conversation(&o, mix64(o.seed ^ i) % n_conv, tok);
        take_ids(&f, ids, PROMPT_BLKS);
        t0 = (uint64_t)now_ns();
        radix_insert(t, ns, tok, PROMPT_BLKS * BT, ids, PROMPT_BLKS, false, canon, &done);
        samples[i] = (uint64_t)now_ns() - t0;
        for (uint32_t b = 0; b < PROMPT_BLKS; b++)
            f.ids[f.n++] = ids[b];
        if (done != PROMPT_BLKS || canon[PROMPT_BLKS - 1] == ids[PROMPT_BLKS - 1])
            goto broken;
    }
    print_dist("insert_4k_cached", samples, o.inserts);

    /* New prompts: cached system prompt + 224 new blocks; evict to stay at size. */
    uint64_t evict_ns = 0, evicted = 0, new_blocks = 0;
    for (uint32_t i = 0; i < o.inserts; i++) {
        /* As a server does: look the prompt up (its system prompt hits and
         * becomes recent), make room, then insert what was computed. */
        conversation(&o, n_conv + 1 + i, tok);
        radix_lookup(t, ns, tok, PROMPT_BLKS * BT, false, ids, PROMPT_BLKS, &n);
        while (f.n < PROMPT_BLKS) {
            size_t got;
            t0 = (uint64_t)now_ns();
            radix_evict(t, RADIX_NS_ANY, conv_blks, &got);
            evict_ns += (uint64_t)now_ns() - t0;
            evicted += got;
            if (got == 0)
                goto broken;
        }
        take_ids(&f, ids, PROMPT_BLKS);
        t0 = (uint64_t)now_ns();
        int rc = radix_insert(t, ns, tok, PROMPT_BLKS * BT, ids, PROMPT_BLKS, false, canon, &done);
        samples[i] = (uint64_t)now_ns() - t0;
        for (uint32_t b = 0; b < PROMPT_BLKS; b++) {
            if (canon[b] != ids[b])
                f.ids[f.n++] = ids[b];
            else
                new_blocks++;
        }
        if (rc != 0 || done != PROMPT_BLKS)
            goto broken;
    }
    print_dist("insert_4k_new", samples, o.inserts);
    double avg_new = (double)new_blocks / o.inserts;
    printf("insert_4k_new_blocks %.1f new blocks per insert (the rest duplicates)\n", avg_new);
    printf("insert_4k_new_per_block %.1f ns (median / new blocks per insert)\n",
           bench_quantile(samples, o.inserts, 0.5) / avg_new);
    if (evicted)
        printf("evict_per_block %.1f ns (%llu blocks)\n", (double)evict_ns / (double)evicted,
               (unsigned long long)evicted);
    printf("tree_blocks_after %u blocks\n", radix_cached_blocks(t));
    if (radix_check(t) != 0)
        goto broken;
    status = 0;
    goto out;
broken:
    fprintf(stderr, "kvshare-bench radix: the index answered wrongly\n");
out:
    radix_free(t);
    free(samples);
    free(f.ids);
    free(tok);
    return status;
}
