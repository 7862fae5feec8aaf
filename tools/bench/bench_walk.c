/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench walk: the index's whole-namespace work, timed in process on
 * an index of n one-block prefixes below one shared block (every block a
 * leaf of its own: the most prefixes, and the dearest blocks to drop, that
 * n blocks can make). For each n: a Tree (radix_top) in one piece, the
 * baseline for the same Tree in steps of RADIX_TOP_STEP as kvshared runs it
 * (radix_top_begin / step: its longest step, its time in all, its peak
 * memory; its rows must be the one-piece walk's), a Clear in one piece
 * (radix_ns_clear) and a Clear in steps of the daemon's STORE_CLEAR_STEP
 * (radix_ns_clear_step; its longest step), the baseline for the steps
 * being the one-piece Clear of the same run; and the longest single insert
 * that built the index (where the child table grows), against the mean
 * insert of the same run. docs/RELIABILITY.md (H14 and
 * its known limits) and docs/BENCHMARKS.md quote these figures.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "now.h"
#include "radix.h"

#define WALK_BT   4     /* tokens per block */
#define WALK_STEP 16384 /* the daemon's STORE_CLEAR_STEP (daemon/store/store.h) */

/* An index of n one-block prefixes below a shared first block in namespace
 * *ns; NULL when out of memory. Each insert is timed: *longest_ms is the
 * longest (where the child table grows, 128 slots per insert), *mean_us
 * the mean, its baseline (either may be NULL). */
static radix_tree_t *walk_index(uint32_t n, uint32_t *ns, double *longest_ms, double *mean_us)
{
    double longest = 0, total = 0;
    radix_config_t cfg = {.block_tokens = WALK_BT, .max_blocks = n + 1};
    radix_tree_t *t = NULL;
    if (radix_new(&cfg, &t) != 0)
        return NULL;
    if (radix_ns_create(t, "bench", 0x5eed, 0, 0, ns) != 0)
        goto fail;
    uint32_t tok[2 * WALK_BT], ids[2], canon[2];
    size_t done;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t k = 0; k < WALK_BT; k++) {
            tok[k] = k;
            tok[WALK_BT + k] = i * WALK_BT + k + 1000;
        }
        ids[0] = 0;
        ids[1] = i + 1;
        uint64_t t0 = (uint64_t)now_ns();
        if (radix_insert(t, *ns, tok, 2 * WALK_BT, ids, 2, false, canon, &done) != 0)
            goto fail;
        double d = (double)((uint64_t)now_ns() - t0) / 1e6;
        longest = d > longest ? d : longest;
        total += d;
    }
    if (longest_ms)
        *longest_ms = longest;
    if (mean_us)
        *mean_us = n ? total * 1e3 / n : 0;
    return t;
fail:
    radix_free(t);
    return NULL;
}

static double ms_since(uint64_t t0)
{
    return (double)((uint64_t)now_ns() - t0) / 1e6;
}

/* The Tree in steps of RADIX_TOP_STEP (what kvshared runs, one step per
 * loop turn): its longest step, its total, and its steps; the rows must be
 * the one-piece walk's (`want`, n_want of them). Returns 0 or an error. */
static int tree_in_steps(radix_tree_t *t, uint32_t ns, uint32_t n, const radix_prefix_t *want,
                         size_t n_want)
{
    static radix_prefix_t rows[1000];
    radix_top_walk_t *w = NULL;
    uint64_t t0 = (uint64_t)now_ns();
    int rc = radix_top_begin(t, ns, RADIX_BY_HITS, 1000, &w);
    double longest = ms_since(t0), total = longest;
    size_t steps = 0, n_rows = 0, peak = 0;
    bool done = false;
    while (rc == 0 && !done) {
        uint64_t s0 = (uint64_t)now_ns();
        rc = radix_top_step(t, w, RADIX_TOP_STEP, &done);
        double d = ms_since(s0);
        longest = d > longest ? d : longest;
        total += d;
        steps++;
        size_t b = radix_top_walk_bytes(w);
        peak = b > peak ? b : peak;
    }
    if (rc == 0) {
        t0 = (uint64_t)now_ns();
        rc = radix_top_rows(w, rows, 1000, &n_rows);
        radix_top_end(w);
        total += ms_since(t0);
    } else {
        radix_top_end(w);
    }
    bool same = n_rows == n_want;
    for (size_t i = 0; same && i < n_rows; i++)
        same = rows[i].last_block_id == want[i].last_block_id && rows[i].blocks == want[i].blocks &&
               rows[i].hits == want[i].hits && rows[i].pins == want[i].pins;
    if (rc == 0 && !same) {
        fprintf(stderr, "kvshare-bench walk: the Tree in steps differs from radix_top\n");
        rc = KVS_EINTERNAL;
    }
    printf("walk_tree_steps_longest_ms[n=%u] %.2f ms (%zu steps of %u units)\n", n, longest, steps,
           (unsigned)RADIX_TOP_STEP);
    printf("walk_tree_steps_total_ms[n=%u] %.1f ms (peak memory %.1f MiB)\n", n, total,
           (double)peak / (1 << 20));
    return rc;
}

/* One size: prints its figures; 0, or 1 when out of memory. */
static int walk_one(uint32_t n)
{
    static radix_prefix_t rows[1000];
    uint32_t ns;
    size_t n_rows = 0, dropped = 0, total = 0;
    double ins_longest = 0, ins_mean = 0;
    radix_tree_t *t = walk_index(n, &ns, &ins_longest, &ins_mean);
    if (!t)
        return 1;
    printf("walk_insert_longest_ms[n=%u] %.2f ms (mean %.2f us per insert)\n", n, ins_longest,
           ins_mean);
    uint64_t t0 = (uint64_t)now_ns();
    int rc = radix_top(t, ns, RADIX_BY_HITS, rows, 1000, &n_rows);
    double one_piece = ms_since(t0);
    printf("walk_tree_ms[n=%u] %.1f ms\n", n, one_piece);
    rc |= tree_in_steps(t, ns, n, rows, n_rows);
    t0 = (uint64_t)now_ns();
    rc |= radix_ns_clear(t, ns, &dropped);
    printf("walk_clear_one_piece_ms[n=%u] %.1f ms (%zu blocks)\n", n, ms_since(t0), dropped);
    radix_free(t);
    t = walk_index(n, &ns, NULL, NULL);
    if (!t)
        return 1;
    double longest = 0;
    size_t steps = 0;
    do {
        t0 = (uint64_t)now_ns();
        rc |= radix_ns_clear_step(t, ns, WALK_STEP, &dropped);
        double d = ms_since(t0);
        longest = d > longest ? d : longest;
        total += dropped;
        steps++;
    } while (rc == 0 && dropped == WALK_STEP);
    printf("walk_clear_longest_step_ms[n=%u] %.1f ms (%zu steps of %u, %zu blocks)\n", n, longest,
           steps, WALK_STEP, total);
    radix_free(t);
    return rc != 0;
}

int bench_walk(int argc, char **argv)
{
    uint32_t max = 1048576;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--max") == 0 && i + 1 < argc) {
            max = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: kvshare-bench walk [--max N]   (sizes 65,536 x 4^k up to N)\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    for (uint32_t n = 65536; n <= max && n > 0; n *= 4)
        if (walk_one(n) != 0) {
            fprintf(stderr, "kvshare-bench walk: out of memory at n = %u\n", n);
            return 1;
        }
    return 0;
}
