/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare top: the stats view refreshed every --interval seconds, with the
 * rates since the previous refresh. Ctrl-C ends it; --count N stops after N
 * refreshes (scripts, tests). Not a terminal: no screen clearing.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd_common.h"
#include "now.h"

static volatile sig_atomic_t stop_requested;

static void on_sigint(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare top [--interval SECONDS] [--count N] [--socket PATH] "
               "[--timeout MS]\n"
               "\n"
               "The stats view, refreshed (default every 1 s), with request, lookup and\n"
               "eviction rates and the hit rate over the last interval; with a tier 2,\n"
               "hit rates by tier, promotions, demotions, drops and copy throughput.\n");
}

static void totals(const kvs_stats_t *s, uint64_t *lookups, uint64_t *asked, uint64_t *hit,
                   uint64_t *hit_t2)
{
    *lookups = *asked = *hit = *hit_t2 = 0;
    for (size_t i = 0; i < s->n_namespaces; i++) {
        *lookups += s->namespaces[i].lookups;
        *asked += s->namespaces[i].lookup_tokens;
        *hit += s->namespaces[i].hit_tokens;
        *hit_t2 += s->namespaces[i].tier2_hit_tokens;
    }
}

static double rate_pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

int kvshare_cmd_top(int argc, char **argv)
{
    cli_conn_t conn = {0};
    double interval = 1.0;
    long count = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&conn, argc, argv, &i, "top");
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
            uint64_t ms;
            if (units_parse_ms(argv[++i], 1000, &ms) != 0 || ms < 50 || ms > 3600000) {
                fprintf(stderr,
                        "kvshare top: --interval takes 0.05 to 3600 seconds (or 50ms to 1h)\n");
                return 2;
            }
            interval = (double)ms / 1000.0;
        } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            count = strtol(argv[++i], NULL, 10);
            if (count <= 0) {
                fprintf(stderr, "kvshare top: --count takes a positive number\n");
                return 2;
            }
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvshare top: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    kvs_client_t *c = cli_connect(&conn, "top");
    if (!c)
        return 1;
    signal(SIGINT, on_sigint);
    int tty = isatty(STDOUT_FILENO);
    kvs_stats_t prev;
    int have_prev = 0, rc = 0;
    double t_prev = 0, t_now;
    memset(&prev, 0, sizeof(prev));
    for (long n = 0; !stop_requested && (count == 0 || n < count); n++) {
        kvs_stats_t s;
        if (kvs_stats(c, &s) != 0) {
            fprintf(stderr, "kvshare top: %s\n", kvs_last_error(c));
            rc = 1;
            break;
        }
        t_now = now_s();
        if (tty)
            fputs("\033[H\033[2J", stdout);
        else if (n > 0)
            fputs("\n", stdout);
        cli_print_stats(stdout, &s);
        if (have_prev) {
            double dt = t_now - t_prev;
            uint64_t l0, a0, h0, t0, l1, a1, h1, t1;
            totals(&prev, &l0, &a0, &h0, &t0);
            totals(&s, &l1, &a1, &h1, &t1);
            fprintf(stdout,
                    "\nlast %.1fs: %.0f requests/s, %.0f lookups/s, hit rate %.1f%% of %llu "
                    "tokens, %.0f evictions/s\n",
                    dt, (double)(s.requests - prev.requests) / dt, (double)(l1 - l0) / dt,
                    rate_pct(h1 - h0, a1 - a0), (unsigned long long)(a1 - a0),
                    (double)(s.evictions - prev.evictions) / dt);
            if (s.tier2_total_blocks > 0) {
                double copy_s = (double)(s.tier_copy_us - prev.tier_copy_us) / 1e6;
                uint64_t bytes = s.tier_copied_bytes - prev.tier_copied_bytes;
                fprintf(stdout,
                        "tier 2: hit rate %.1f%% (tier 1 %.1f%%), %.0f promotions/s, %.0f "
                        "demotions/s, %.0f drops/s, %.1f MiB/s copied (%.0f MiB/s while "
                        "copying)\n",
                        rate_pct(t1 - t0, a1 - a0), rate_pct((h1 - h0) - (t1 - t0), a1 - a0),
                        (double)(s.tier_promotions - prev.tier_promotions) / dt,
                        (double)(s.tier_demotions - prev.tier_demotions) / dt,
                        (double)(s.tier2_drops - prev.tier2_drops) / dt,
                        (double)bytes / 1048576.0 / dt,
                        copy_s > 0 ? (double)bytes / 1048576.0 / copy_s : 0.0);
            }
        }
        fflush(stdout);
        kvs_stats_free(&prev);
        prev = s;
        have_prev = 1;
        t_prev = t_now;
        if (count && n + 1 >= count)
            break;
        struct timespec sl = {(time_t)interval,
                              (long)((interval - (double)(time_t)interval) * 1e9)};
        nanosleep(&sl, NULL);
    }
    kvs_stats_free(&prev);
    kvs_close(c);
    signal(SIGINT, SIG_DFL);
    return rc;
}
