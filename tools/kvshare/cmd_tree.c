/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare tree: the top prefixes of the index, by hits (default) or by size:
 * their length in tokens, cached blocks under them, hits, pins and age (index
 * operations since last use, relative to the most recent row). The text
 * form first shows each namespace's capacity (blocks held, reservation,
 * quota, evictions by cause, blocks cached and evicted by retention
 * priority band), as `kvshare stats` does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare tree [--ns NAME] [--by-size] [--max N] [--json] [--socket PATH] "
               "[--timeout MS]\n"
               "\n"
               "Each namespace's blocks held, reservation, quota, evictions by cause, and\n"
               "blocks cached and evicted by retention priority band (0-24, 25-49, 50-74,\n"
               "75-100), then the top cached prefixes (default 20, by hits): tokens, blocks,\n"
               "hits, pins, age.\n"
               "--json: the prefixes only (kvshare stats --json has the namespaces).\n");
}

int kvshare_cmd_tree(int argc, char **argv)
{
    cli_conn_t conn = {0};
    const char *ns = NULL;
    int by_size = 0, json = 0;
    long max = 20;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&conn, argc, argv, &i, "tree");
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "--ns") == 0 && i + 1 < argc) {
            ns = argv[++i];
        } else if (strcmp(argv[i], "--by-size") == 0) {
            by_size = 1;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc) {
            max = strtol(argv[++i], NULL, 10);
            if (max <= 0 || max > 1000) {
                fprintf(stderr, "kvshare tree: --max takes 1 to 1000\n");
                return 2;
            }
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvshare tree: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    kvs_client_t *c = cli_connect(&conn, "tree");
    if (!c)
        return 1;
    kvs_prefix_t *rows = calloc((size_t)max, sizeof(*rows));
    size_t n = 0;
    int rc = rows ? kvs_tree(c, ns, by_size, rows, (size_t)max, &n) : KVS_ENOMEM;
    if (rc != 0) {
        fprintf(stderr, "kvshare tree: %s\n", rows ? kvs_last_error(c) : kvs_strerror(rc));
        free(rows);
        kvs_close(c);
        return 1;
    }
    if (json) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            printf("%s{\"ns\":", i ? "," : "");
            cli_json_string(stdout, rows[i].ns);
            printf(",\"tokens\":%u,\"blocks\":%u,\"hits\":%llu,\"pins\":%u,\"age_ops\":%llu,"
                   "\"last_block_id\":%u,\"tier\":%u,\"tier2_blocks\":%u}",
                   rows[i].tokens, rows[i].blocks, (unsigned long long)rows[i].hits, rows[i].pins,
                   (unsigned long long)rows[i].age_ticks, rows[i].last_block_id, rows[i].tier,
                   rows[i].tier2_blocks);
        }
        printf("]\n");
    } else {
        kvs_stats_t s;
        rc = kvs_stats(c, &s);
        if (rc != 0) {
            fprintf(stderr, "kvshare tree: %s\n", kvs_last_error(c));
            free(rows);
            kvs_close(c);
            return 1;
        }
        cli_print_capacity(stdout, &s, ns);
        kvs_stats_free(&s);
        if (n == 0) {
            printf("\nnothing cached%s%s\n", ns ? " in namespace " : "", ns ? ns : "");
        } else {
            /* TIER: where the prefix's own last block is; IN TIER 2: how
             * many of the blocks under it are in host memory. */
            printf("\n%-16s %10s %8s %10s %6s %10s %10s %4s %9s\n", "NAMESPACE", "TOKENS", "BLOCKS",
                   "HITS", "PINS", "AGE (ops)", "LAST BLOCK", "TIER", "IN TIER 2");
            for (size_t i = 0; i < n; i++)
                printf("%-16s %10u %8u %10llu %6u %10llu %10u %4u %9u\n", rows[i].ns,
                       rows[i].tokens, rows[i].blocks, (unsigned long long)rows[i].hits,
                       rows[i].pins, (unsigned long long)rows[i].age_ticks, rows[i].last_block_id,
                       rows[i].tier, rows[i].tier2_blocks);
        }
    }
    free(rows);
    kvs_close(c);
    return 0;
}
