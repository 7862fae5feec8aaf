/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The figures of kvshare top, computed from two Stats replies of one daemon
 * run (or one, for the figures since start): hit rates, rates per second,
 * usage, and the namespaces sorted by traffic. Also the hit-rate history
 * behind the sparkline. No I/O: the view, the line output and --json print
 * these same numbers, so they never disagree.
 */
#ifndef KVSHARE_TOP_FIGURES_H
#define KVSHARE_TOP_FIGURES_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare.h"

/* A percentage that has no value: no lookup in the interval (or ever). */
#define TOP_NONE (-1.0)

typedef struct top_ns_row {
    const kvs_ns_stats_t *ns; /* in the newer sample; valid as long as it */
    double lookups_s;         /* over the interval (0 without one) */
    double hit_pct;           /* tokens hit over the interval, or TOP_NONE */
    double hit_pct_all;       /* since start, or TOP_NONE */
    double evictions_s;       /* its blocks evicted, per second */
} top_ns_row_t;

typedef struct top_figures {
    int have_interval; /* the rates below are valid (two samples, same run) */
    double dt;         /* seconds between the samples */
    double hit_pct, hit_pct_all;
    double tier2_hit_pct;  /* of the interval's lookup tokens, hit in tier 2 */
    uint64_t asked_tokens; /* tokens looked up in the interval */
    double lookups_s, requests_s, saved_tokens_s, evictions_s, errors_s;
    double pool_used_pct, pool_pinned_pct, tier2_used_pct;
    double promotions_s, demotions_s, tier2_drops_s, copy_mib_s;
    size_t n_ns;
    top_ns_row_t *ns; /* by lookups over the interval, then since start */
} top_figures_t;

/* Fills out from cur and, when prev is not NULL, the interval of dt seconds
 * since prev (a sample of the same daemon run: see top_restarted). Returns
 * 0 or KVS_ENOMEM. Free with top_figures_free (accepts a zeroed one). */
int top_figures(const kvs_stats_t *prev, const kvs_stats_t *cur, double dt, top_figures_t *out);
void top_figures_free(top_figures_t *f);

/* 1 when cur comes from a daemon started after prev's (its uptime or its
 * request count went back): prev's counters no longer compare. */
int top_restarted(const kvs_stats_t *prev, const kvs_stats_t *cur);

/* The hit rate of each interval, newest last: the sparkline's data. */
#define TOP_HISTORY_MAX 3600
#define TOP_HIST_IDLE   (-1.0f) /* the interval had no lookup */
#define TOP_HIST_DOWN   (-2.0f) /* kvshared did not answer */
typedef struct top_history {
    float pct[TOP_HISTORY_MAX]; /* a ring */
    size_t n, next;
} top_history_t;

void top_history_push(top_history_t *h, float pct);

/* The value `back` intervals before the newest (0: the newest); back < n. */
float top_history_get(const top_history_t *h, size_t back);

#endif /* KVSHARE_TOP_FIGURES_H */
