/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pages of kvshare top, drawn into a frame (term.h) from the figures
 * (top_figures.h): what to show, never how it was fetched.
 *
 *   overview   the title bar; a status line (kvshared unreachable, or
 *              restarted); the hit rate over the last interval and since
 *              start; lookups, prefill tokens saved, evictions, requests and
 *              errors per second; pool and tier-2 usage as bars; the hit-rate
 *              sparkline; a row per namespace, busiest first
 *   counters   the gauges, then every counter since start with its rate
 *   help       what each figure is, the keys, where to look when a figure
 *              looks wrong
 *
 * The last row is the key bar. --once draws the overview as plain text.
 */
#ifndef KVSHARE_TOP_VIEW_H
#define KVSHARE_TOP_VIEW_H

#include "kvshare.h"
#include "term.h"
#include "top_figures.h"

typedef enum top_page { TOP_PAGE_OVERVIEW, TOP_PAGE_COUNTERS, TOP_PAGE_HELP } top_page_t;

typedef struct top_view {
    top_page_t page;
    int scroll;        /* first table row shown (namespaces, counters) */
    int utf8;          /* block and bar glyphs; else ASCII */
    int plain;         /* --once: no key bar, no sparkline */
    const char *where; /* the socket, for the title */
    double interval;   /* seconds between samples */
    /* The newest answer, and the previous one's counters for the rates of
     * the counters page (NULL: no interval yet). NULL cur: never answered. */
    const kvs_stats_t *cur, *prev;
    const top_figures_t *fig;
    const top_history_t *history;
    const char *error;  /* kvshared not answering: why; NULL when it answers */
    double down_for;    /* seconds since the last answer, with error */
    const char *notice; /* a passing note (kvshared restarted), or NULL */
    const char *clock;  /* HH:MM:SS of the newest answer, or "" */
    /* The disk tier's warm restart, NULL when none ran. */
    const kvs_restore_status_t *restore;
} top_view_t;

/* Draws v's page into s (begun with its size). Sets *rows_total to the
 * rows the page's table has (to bound scrolling). */
void top_view_draw(scr_t *s, const top_view_t *v, int *rows_total);

#endif /* KVSHARE_TOP_VIEW_H */
