/* SPDX-License-Identifier: Apache-2.0 */
#include "top_view.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "units.h"

/* ---- small formats ----------------------------------------------------------------- */

/* A rate or count a person reads at a glance: 0.5, 412, 6.6k, 1.2M. */
static const char *human(double v, char *buf, size_t len)
{
    if (v < 0)
        v = 0;
    if (v < 10 && v != floor(v))
        snprintf(buf, len, "%.1f", v);
    else if (v < 10000)
        snprintf(buf, len, "%.0f", v);
    else if (v < 10e6)
        snprintf(buf, len, "%.1fk", v / 1e3);
    else
        snprintf(buf, len, "%.1fM", v / 1e6);
    return buf;
}

/* A percentage, or "-" when it has no value (no lookup). */
static const char *pct_text(double pct, char *buf, size_t len)
{
    if (pct < 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.1f%%", pct);
    return buf;
}

/* ---- pieces ---------------------------------------------------------------------- */

/* Writes parts (ASCII, no attributes) after the text already on the line,
 * sep between them; a part that would pass the width goes whole to the next
 * line, after indent columns, so that no value is ever cut. A part wider
 * than a line of its own is the only one clipped. */
static void flow(scr_t *s, int indent, const char *sep, const char *const *parts, int n)
{
    for (int i = 0; i < n; i++) {
        int need = (int)strlen(parts[i]) + (i ? (int)strlen(sep) : 0);
        if (i && s->col + need > s->cols && s->col > indent) {
            scr_newline(s);
            scr_printf(s, "%*s", indent, "");
            need -= (int)strlen(sep);
        } else if (i) {
            scr_printf(s, "%s", sep);
        }
        scr_printf(s, "%s", parts[i]);
    }
}

static void title_bar(scr_t *s, const top_view_t *v)
{
    static const char *const page_name[] = {"overview", "counters", "help"};
    char up[32] = "", where[300] = "", backend[64] = "", page[32];
    snprintf(where, sizeof(where), " - %s", v->where);
    if (v->cur)
        snprintf(backend, sizeof(backend), "  %s backend, up %s",
                 v->cur->backend == KVS_BACKEND_CUDA ? "cuda" : "host",
                 units_format_ms(v->cur->uptime_ms, up, sizeof(up)));
    snprintf(page, sizeof(page), "  [%s]", page_name[v->page]);
    /* Too narrow: the backend goes first, then the socket; the page stays. */
    int fixed = 12 + (int)strlen(page) + (int)strlen(v->clock) + 1;
    if (fixed + (int)strlen(where) + (int)strlen(backend) > s->cols)
        backend[0] = '\0';
    if (fixed + (int)strlen(where) > s->cols)
        where[0] = '\0';
    scr_attr(s, SCR_REVERSE);
    scr_printf(s, " kvshare top%s%s%s", where, backend, page);
    int right = s->cols - (int)strlen(v->clock) - 1;
    scr_pad(s, right);
    scr_printf(s, "%s ", v->clock);
    scr_pad(s, s->cols);
    scr_newline(s);
}

/* kvshared down, or restarted: one line that stands out, else empty. */
static void status_line(scr_t *s, const top_view_t *v)
{
    if (v->error) {
        scr_attr(s, SCR_ALERT);
        scr_printf(s, "kvshared not answering for %.0fs: %s; retrying every %.1fs%s", v->down_for,
                   v->error, v->interval, v->cur ? " (figures below are its last answer)" : "");
    } else if (v->notice) {
        scr_attr(s, SCR_BOLD);
        scr_printf(s, "%s", v->notice);
    }
    scr_newline(s);
}

/* [#####.....] of width cells for pct (0-100). */
static void bar(scr_t *s, const top_view_t *v, double pct, int width)
{
    int full = (int)lround(pct / 100.0 * width);
    scr_printf(s, "[");
    for (int i = 0; i < width; i++) {
        if (i < full)
            scr_glyph(s, v->utf8 ? "\xe2\x96\x88" : "#"); /* U+2588 full block */
        else
            scr_glyph(s, v->utf8 ? "\xc2\xb7" : "."); /* U+00B7 middle dot */
    }
    scr_printf(s, "]");
}

/* Several devices (--devices): one line per device under the pool's, at
 * most TOP_DEVICE_LINES, then one line for the rest. Its bar is the pool's
 * use (the same blocks on every device); what tells devices apart is its
 * rank's workers and the shards of blocks still being written. */
#define TOP_DEVICE_LINES 8
static void devices(scr_t *s, const top_view_t *v, const kvs_stats_t *st, int width)
{
    char a[32], b[32];
    if (st->n_devices < 2)
        return;
    for (size_t i = 0; i < st->n_devices && i < TOP_DEVICE_LINES; i++) {
        const kvs_device_stats_t *d = &st->devices[i];
        double used = d->pool_bytes ? 100.0 * (double)d->used_bytes / (double)d->pool_bytes : 0;
        scr_printf(s, "dev %-3d r%-2u", d->ordinal, d->rank);
        bar(s, v, used, width);
        scr_printf(s, " %5.1f%%  %s of %s, workers %u, shards written %u missing %u", used,
                   units_format_bytes(d->used_bytes, 1, a, sizeof(a)),
                   units_format_bytes(d->pool_bytes, 1, b, sizeof(b)), d->workers,
                   d->shards_written, d->shards_missing);
        scr_newline(s);
    }
    if (st->n_devices > TOP_DEVICE_LINES) {
        scr_printf(s, "          and %u more devices (kvshare stats lists them all)",
                   st->n_devices - TOP_DEVICE_LINES);
        scr_newline(s);
    }
}

static void header(scr_t *s, const top_view_t *v)
{
    const top_figures_t *f = v->fig;
    const kvs_stats_t *st = v->cur;
    char a[32], b[32], c[32], d[32], e[32];
    scr_printf(s, "hit rate  ");
    scr_attr(s, SCR_BOLD);
    scr_printf(s, "%s", pct_text(f->hit_pct, a, sizeof(a)));
    scr_attr(s, SCR_PLAIN);
    scr_printf(s, " last %.1fs   ", f->have_interval ? f->dt : 0.0);
    scr_attr(s, SCR_BOLD);
    scr_printf(s, "%s", pct_text(f->hit_pct_all, b, sizeof(b)));
    scr_attr(s, SCR_PLAIN);
    scr_printf(s, " since start");
    /* The explanation only where it fits whole. */
    if (s->col + 31 <= s->cols)
        scr_printf(s, "   (prompt tokens found cached)");
    scr_newline(s);
    char p[5][48];
    snprintf(p[0], sizeof(p[0]), "lookups   %s/s", human(f->lookups_s, a, sizeof(a)));
    snprintf(p[1], sizeof(p[1]), "prefill saved %s tokens/s",
             human(f->saved_tokens_s, b, sizeof(b)));
    snprintf(p[2], sizeof(p[2]), "evictions %s/s", human(f->evictions_s, c, sizeof(c)));
    snprintf(p[3], sizeof(p[3]), "requests %s/s", human(f->requests_s, d, sizeof(d)));
    snprintf(p[4], sizeof(p[4]), "errors %s/s", human(f->errors_s, e, sizeof(e)));
    flow(s, 10, "   ", (const char *const[]){p[0], p[1], p[2], p[3], p[4]}, 5);
    scr_newline(s);
    int width = s->cols >= 100 ? 30 : 20;
    scr_printf(s, "pool      ");
    bar(s, v, f->pool_used_pct, width);
    snprintf(p[0], sizeof(p[0]), " %5.1f%% ", f->pool_used_pct);
    snprintf(p[1], sizeof(p[1]), "%u/%u blocks:", st->total_blocks - st->free_blocks,
             st->total_blocks);
    snprintf(p[2], sizeof(p[2]), "%u cached,", st->cached_blocks);
    snprintf(p[3], sizeof(p[3]), "%u writing,", st->writing_blocks);
    snprintf(p[4], sizeof(p[4]), "%u pinned", st->pinned_blocks);
    flow(s, 10, " ", (const char *const[]){p[0], p[1], p[2], p[3], p[4]}, 5);
    scr_newline(s);
    devices(s, v, st, width);
    if (st->tier2_total_blocks > 0) {
        scr_printf(s, "tier 2    ");
        bar(s, v, f->tier2_used_pct, width);
        scr_printf(s,
                   " %5.1f%%  %u/%u blocks: hits there %s, %s promotions/s, %s "
                   "demotions/s, %s drops/s, %.1f MiB/s copied",
                   f->tier2_used_pct, st->tier2_cached_blocks, st->tier2_total_blocks,
                   pct_text(f->tier2_hit_pct, a, sizeof(a)), human(f->promotions_s, b, sizeof(b)),
                   human(f->demotions_s, c, sizeof(c)), human(f->tier2_drops_s, d, sizeof(d)),
                   f->copy_mib_s);
        scr_newline(s);
    }
    if (st->tier3_total_blocks > 0) {
        /* Tier 3 and, after a restart, its restore in the background. */
        const kvs_restore_status_t *rs = v->restore;
        char q[4][64];
        int n = 0;
        snprintf(q[n++], sizeof(q[0]), "%u/%u blocks on disk%s", st->tier3_cached_blocks,
                 st->tier3_total_blocks, rs ? ";" : "");
        if (rs && strcmp(rs->phase, "scanning") == 0) {
            snprintf(q[n++], sizeof(q[0]), "restoring: reading the file,");
            snprintf(q[n++], sizeof(q[0]), "%.0f%% of %llu slots",
                     rs->slots ? 100.0 * (double)rs->scanned / (double)rs->slots : 0.0,
                     (unsigned long long)rs->slots);
        } else if (rs && strcmp(rs->phase, "restoring") == 0) {
            snprintf(q[n++], sizeof(q[0]), "restoring:");
            snprintf(q[n++], sizeof(q[0]), "%llu of %llu records back",
                     (unsigned long long)rs->restored, (unsigned long long)rs->records);
        } else if (rs) {
            snprintf(q[n++], sizeof(q[0]), "restore %s:", rs->phase);
            snprintf(q[n++], sizeof(q[0]), "%llu blocks", (unsigned long long)rs->restored);
        }
        if (rs)
            snprintf(q[n++], sizeof(q[0]), "(%.1f s)", (double)rs->elapsed_ms / 1000.0);
        scr_printf(s, "tier 3    ");
        flow(s, 10, " ", (const char *const[]){q[0], q[1], q[2], q[3]}, n);
        scr_newline(s);
    }
    if (st->n_cluster_nodes > 0) {
        /* The cluster tier since start: its nodes, what came down and went
         * up, and the nodes' mean reply time. */
        uint32_t up = 0;
        uint64_t replies = 0, lat = 0, errors = 0;
        for (size_t i = 0; i < st->n_cluster_nodes; i++) {
            const kvs_cluster_node_t *nd = &st->cluster_nodes[i];
            up += strcmp(nd->state, "down") != 0 && strcmp(nd->state, "auth-refused") != 0;
            replies += nd->replies;
            lat += nd->latency_us_sum;
            errors += nd->errors;
        }
        scr_printf(s,
                   "cluster   %u nodes, %u up: %llu blocks fetched, %llu written (%llu dropped), "
                   "%llu errors, replies %.2f ms on average",
                   st->n_cluster_nodes, up, (unsigned long long)st->cluster_fetched_blocks,
                   (unsigned long long)st->cluster_puts, (unsigned long long)st->cluster_put_drops,
                   (unsigned long long)errors,
                   replies ? (double)lat / (double)replies / 1000.0 : 0.0);
        scr_newline(s);
    }
    scr_printf(s, "sessions  %u open   index %s", st->sessions,
               units_format_bytes(st->index_bytes, 1, a, sizeof(a)));
    scr_newline(s);
}

/* The hit rate of the last intervals, one mark each, newest at the right:
 * eight heights for 0-100 %, blank for an interval without lookups, x for
 * one where kvshared did not answer. */
static void sparkline(scr_t *s, const top_view_t *v)
{
    static const char *const block[8] = {"\xe2\x96\x81", "\xe2\x96\x82", "\xe2\x96\x83",
                                         "\xe2\x96\x84", "\xe2\x96\x85", "\xe2\x96\x86",
                                         "\xe2\x96\x87", "\xe2\x96\x88"}; /* U+2581..2588 */
    static const char *const ascii[8] = {"_", ".", ",", "-", "=", "+", "*", "#"};
    const top_history_t *h = v->history;
    int label = 7; /* "  100% " at the left */
    int width = s->cols - label - 1;
    size_t n = h->n < (size_t)(width > 0 ? width : 0) ? h->n : (size_t)(width > 0 ? width : 0);
    char span[32];
    units_format_ms((uint64_t)(v->interval * 1000.0 * (double)n), span, sizeof(span));
    scr_printf(s,
               "hit rate, last %s (a mark per %.1fs, 0-100%%; blank: no lookups; x: kvshared "
               "down)",
               span, v->interval);
    scr_newline(s);
    scr_printf(s, "%*s", label, "");
    scr_pad(s, label + (width - (int)n));
    for (size_t i = n; i-- > 0;) {
        float p = top_history_get(h, i);
        if (p == TOP_HIST_DOWN) {
            scr_attr(s, SCR_ALERT);
            scr_glyph(s, "x");
            scr_attr(s, SCR_PLAIN);
        } else if (p < 0) {
            scr_glyph(s, " ");
        } else {
            int k = (int)(p / 100.0f * 8.0f);
            k = k < 0 ? 0 : k > 7 ? 7 : k;
            scr_glyph(s, v->utf8 ? block[k] : ascii[k]);
        }
    }
    scr_newline(s);
}

/* Rows left for a page's table (its "more" line included). */
static int table_rows(const scr_t *s)
{
    int left = s->limit - s->row;
    return left > 0 ? left : 0;
}

/* The namespace table's columns after HELD, in the order they are dropped
 * from the right when the terminal is too narrow: a column shows whole or
 * not at all. The widths include the space before each. */
enum { NS_RESERVE, NS_QUOTA, NS_EVICT_S, NS_EVICTED, NS_BANDS, NS_OPTIONAL };
static const int ns_col_width[NS_OPTIONAL] = {8, 8, 9, 26, 40};

/* How many of the optional columns fit in cols. */
static int ns_columns(int cols)
{
    int used = 16 + 10 + 8 + 8 + 8, n = 0; /* NAMESPACE .. HELD */
    while (n < NS_OPTIONAL && used + ns_col_width[n] <= cols)
        used += ns_col_width[n++];
    return n;
}

static void namespace_table(scr_t *s, const top_view_t *v, int *rows_total)
{
    const top_figures_t *f = v->fig;
    int ncol = ns_columns(s->cols);
    scr_attr(s, SCR_BOLD);
    scr_printf(s, "%-16s %9s %7s %7s %7s", "NAMESPACE", "LOOKUP/s", "HIT%", "ALL%", "HELD");
    if (ncol > NS_RESERVE)
        scr_printf(s, " %7s", "RESERVE");
    if (ncol > NS_QUOTA)
        scr_printf(s, " %7s", "QUOTA");
    if (ncol > NS_EVICT_S)
        scr_printf(s, " %8s", "EVICT/s");
    if (ncol > NS_EVICTED)
        scr_printf(s, "  %-24s", "EVICTED own/others/quota");
    if (ncol > NS_BANDS)
        scr_printf(s, " %s", "CACHED BY PRIORITY 0-24/25-49/50-74/75+");
    scr_newline(s);
    *rows_total = (int)f->n_ns;
    if (f->n_ns == 0) {
        scr_printf(s, "no namespace yet (no lookup or commit so far)");
        scr_newline(s);
        return;
    }
    int room = table_rows(s), first = v->scroll;
    if (first > (int)f->n_ns - 1)
        first = (int)f->n_ns - 1;
    if (first < 0)
        first = 0;
    int last = (int)f->n_ns;
    if (last - first > room)
        last = first + (room > 0 ? room - 1 : 0); /* a row for "more" */
    for (int i = first; i < last; i++) {
        const top_ns_row_t *r = &f->ns[i];
        const kvs_ns_stats_t *n = r->ns;
        char a[32], b[32], c[32], d[32], q[16] = "-", causes[64], bands[96] = "-";
        if (n->quota)
            snprintf(q, sizeof(q), "%u", n->quota);
        snprintf(causes, sizeof(causes), "%llu/%llu/%llu", (unsigned long long)n->evicted_own,
                 (unsigned long long)n->evicted_others, (unsigned long long)n->evicted_quota);
        if (n->bands)
            snprintf(
                bands, sizeof(bands), "%llu/%llu/%llu/%llu",
                (unsigned long long)n->bands->cached[0], (unsigned long long)n->bands->cached[1],
                (unsigned long long)n->bands->cached[2], (unsigned long long)n->bands->cached[3]);
        /* Below its reservation: other namespaces may not evict it, but it
         * is not full either; at its quota: its commits are cut short. */
        int at_quota = n->quota && n->cached_blocks >= n->quota;
        scr_printf(s, "%-16.16s %9s %7s %7s ", n->name, human(r->lookups_s, a, sizeof(a)),
                   pct_text(r->hit_pct, b, sizeof(b)), pct_text(r->hit_pct_all, c, sizeof(c)));
        if (at_quota)
            scr_attr(s, SCR_BOLD);
        char held[32];
        if (n->tier2_blocks) /* pool + tier 2 */
            snprintf(held, sizeof(held), "%u+%u", n->cached_blocks, n->tier2_blocks);
        else
            snprintf(held, sizeof(held), "%u", n->cached_blocks);
        scr_printf(s, "%7s", held);
        scr_attr(s, SCR_PLAIN);
        if (ncol > NS_RESERVE)
            scr_printf(s, " %7u", n->reserve);
        if (ncol > NS_QUOTA)
            scr_printf(s, " %7s", q);
        if (ncol > NS_EVICT_S)
            scr_printf(s, " %8s", human(r->evictions_s, d, sizeof(d)));
        if (ncol > NS_EVICTED)
            scr_printf(s, "  %-24s", causes);
        if (ncol > NS_BANDS)
            scr_printf(s, " %s", bands);
        scr_newline(s);
    }
    if (last < (int)f->n_ns || first > 0) {
        scr_attr(s, SCR_DIM);
        scr_printf(s, "namespaces %d-%d of %zu (arrows or j/k scroll)", first + 1, last, f->n_ns);
        scr_newline(s);
    }
}

static void overview(scr_t *s, const top_view_t *v, int *rows_total)
{
    if (!v->cur) {
        scr_printf(s, "waiting for kvshared's first answer");
        scr_newline(s);
        return;
    }
    header(s, v);
    if (!v->plain) {
        scr_newline(s);
        sparkline(s, v);
    }
    scr_newline(s);
    namespace_table(s, v, rows_total);
}

/* Every counter's help line, by position: the same list as the names. */
#define COUNTER_HELP(name, named, family, labels, help) help,
static const char *const counter_help[] = {KVS_COUNTERS(COUNTER_HELP)};
#undef COUNTER_HELP

static void counters(scr_t *s, const top_view_t *v, int *rows_total)
{
    const kvs_stats_t *st = v->cur;
    if (!st) {
        scr_printf(s, "waiting for kvshared's first answer");
        scr_newline(s);
        return;
    }
    char a[32], b[32], c[32];
    scr_printf(s,
               "blocks  total %u  free %u  writing %u  cached %u  pinned %u   tier 2 %u of %u, "
               "copying %u",
               st->total_blocks, st->free_blocks, st->writing_blocks, st->cached_blocks,
               st->pinned_blocks, st->tier2_cached_blocks, st->tier2_total_blocks,
               st->copying_blocks);
    scr_newline(s);
    scr_printf(s, "pool    %s in blocks of %s (%u tokens)   index %s   sessions %u",
               units_format_bytes(st->pool_bytes, 1, a, sizeof(a)),
               units_format_bytes(st->block_bytes, 1, b, sizeof(b)), st->block_tokens,
               units_format_bytes(st->index_bytes, 1, c, sizeof(c)), st->sessions);
    scr_newline(s);
    scr_newline(s);
    scr_attr(s, SCR_BOLD);
    scr_printf(s, "%-28s %16s %10s  %s", "COUNTER (since start)", "TOTAL", "PER SEC", "WHAT");
    scr_newline(s);
    *rows_total = KVS_N_COUNTERS;
    int room = table_rows(s), first = v->scroll;
    if (first > KVS_N_COUNTERS - 1)
        first = KVS_N_COUNTERS - 1;
    if (first < 0)
        first = 0;
    int last = KVS_N_COUNTERS;
    if (last - first > room)
        last = first + (room > 0 ? room - 1 : 0);
    for (int i = first; i < last; i++) {
        uint64_t now = st->counters[i];
        char rate[32] = "";
        if (v->prev && v->fig->have_interval)
            human((double)(now >= v->prev->counters[i] ? now - v->prev->counters[i] : 0) /
                      v->fig->dt,
                  rate, sizeof(rate));
        if (now == 0)
            scr_attr(s, SCR_DIM);
        scr_printf(s, "%-28s %16llu %10s  %s", kvs_counter_name((size_t)i), (unsigned long long)now,
                   rate, counter_help[i]);
        scr_attr(s, SCR_PLAIN);
        scr_newline(s);
    }
    if (last < KVS_N_COUNTERS || first > 0) {
        scr_attr(s, SCR_DIM);
        scr_printf(s, "counters %d-%d of %d (arrows or j/k scroll)", first + 1, last,
                   KVS_N_COUNTERS);
        scr_newline(s);
    }
}

static void help(scr_t *s)
{
    static const char *const lines[] = {
        "hit rate       tokens of looked-up prompts found cached, over the last interval and",
        "               since kvshared started (Stats: hit_tokens / lookup_tokens)",
        "lookups        Lookup requests per second, all namespaces",
        "prefill saved  tokens per second that workers read instead of computing",
        "evictions      cached blocks dropped per second to make room",
        "pool / tier 2  blocks in use (cached or being written) of the pool, and of tier 2",
        "sparkline      the hit rate of each interval, oldest at the left",
        "namespaces     busiest first: LOOKUP/s and HIT% over the last interval, ALL% since",
        "               start, HELD blocks (+ those in tier 2) against RESERVE and QUOTA",
        "               (bold: at its quota),",
        "               EVICT/s, EVICTED since start for its own need / for other",
        "               namespaces / at its quota, cached blocks by retention priority",
        "counters page  every counter since start, with its rate over the last interval",
        "",
        "keys           q quit   tab or 1 / 2 switch page   arrows or j/k scroll   h or ? help",
        "",
        "When a figure looks wrong (hit rate falling, pool full, evictions for others,",
        "kvshared not answering): docs/OPERATING.md, \"The operator's views\" and \"On call\".",
        "",
        "Any key returns.",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        scr_printf(s, "%s", lines[i]);
        scr_newline(s);
    }
}

static void key_bar(scr_t *s, const top_view_t *v)
{
    /* Down to the last row, then the bar across it. */
    scr_limit(s, s->rows);
    while (s->row < s->rows - 1)
        scr_newline(s);
    scr_attr(s, SCR_REVERSE);
    scr_printf(s,
               " q quit  tab/1/2 page  arrows scroll  h help   %s overview  %s counters   "
               "every %.1fs",
               v->page == TOP_PAGE_OVERVIEW ? "[1]" : " 1 ",
               v->page == TOP_PAGE_COUNTERS ? "[2]" : " 2 ", v->interval);
    scr_pad(s, s->cols);
    scr_attr(s, SCR_PLAIN);
}

void top_view_draw(scr_t *s, const top_view_t *v, int *rows_total)
{
    *rows_total = 0;
    if (!v->plain) {
        scr_limit(s, s->rows - 1); /* the last row is the key bar's */
        title_bar(s, v);
    }
    if (!v->plain || v->error || v->notice)
        status_line(s, v);
    if (v->page == TOP_PAGE_HELP)
        help(s);
    else if (v->page == TOP_PAGE_COUNTERS)
        counters(s, v, rows_total);
    else
        overview(s, v, rows_total);
    if (!v->plain)
        key_bar(s, v);
}
