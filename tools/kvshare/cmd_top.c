/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare top: the operator's live view of kvshared.
 *
 * On a terminal: a full-screen view (top_view.h) refreshed every --interval,
 * with keys to switch pages, scroll and quit, redrawn at once on a resize.
 * When kvshared stops answering, the view says so and keeps asking: the
 * client reconnects by itself, and a daemon that restarted (its uptime went
 * back) starts the rates again while the history stays.
 *
 * Not on a terminal: the stats text and a line of rates per interval, as
 * scripts and logs read it; --json: one JSON object per interval (the
 * figures of the view); --once: one report after one interval (the
 * overview as plain text, or one JSON object), then exit.
 *
 * One loop serves all modes: sample (Stats), compute the figures
 * (top_figures.h), show them the mode's way, wait for the next interval or
 * a key.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd_common.h"
#include "now.h"
#include "term.h"
#include "top_figures.h"
#include "top_view.h"

typedef enum top_mode { MODE_VIEW, MODE_LINES, MODE_JSON, MODE_ONCE } top_mode_t;

typedef struct top_opts {
    cli_conn_t conn;
    double interval;
    long count; /* 0: until stopped */
    int once, json;
} top_opts_t;

/* Everything the loop keeps between samples. */
typedef struct top_state {
    kvs_client_t *client;
    kvs_stats_t prev, cur; /* valid when have_prev / have_cur */
    int have_prev, have_cur;
    double t_prev, t_cur; /* monotonic seconds of the samples */
    double t_answer;      /* of the last answer (at first: of the start) */
    top_figures_t fig;
    top_history_t history;
    char error[256]; /* "" while kvshared answers */
    char notice[128];
    double notice_until;
    char clock[16];
    kvs_restore_status_t restore; /* phase "" unless a warm restart ran */
    top_view_t view;
} top_state_t;

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* ---- sampling -------------------------------------------------------------------- */

static void wall_clock(char *buf, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%H:%M:%S", &tm);
}

/* One Stats round trip. On an answer the newest sample becomes the
 * previous one (unless the daemon restarted in between: then there is no
 * interval to compare), the figures are computed, and the interval's hit
 * rate joins the history; on a failure the history marks the interval as
 * down and the last figures stay. Returns 0 on an answer, else the error. */
static int sample(top_state_t *st)
{
    kvs_stats_t s;
    int rc = kvs_stats(st->client, &s);
    double t = now_s();
    if (rc != 0) {
        snprintf(st->error, sizeof(st->error), "%s",
                 kvs_last_error(st->client)[0] ? kvs_last_error(st->client) : kvs_strerror(rc));
        top_history_push(&st->history, TOP_HIST_DOWN);
        return rc;
    }
    st->error[0] = '\0';
    memset(&st->restore, 0, sizeof(st->restore));
    if (s.tier3_total_blocks > 0)
        (void)kvs_restore_status(st->client, &st->restore);
    if (st->have_prev)
        kvs_stats_free(&st->prev);
    st->have_prev = 0;
    if (st->have_cur) {
        if (top_restarted(&st->cur, &s)) {
            char at[16];
            wall_clock(at, sizeof(at));
            snprintf(st->notice, sizeof(st->notice),
                     "kvshared restarted (noticed at %s): counters start again from 0", at);
            st->notice_until = t + 30.0;
            kvs_stats_free(&st->cur);
        } else {
            st->prev = st->cur;
            st->have_prev = 1;
            st->t_prev = st->t_cur;
        }
    }
    st->cur = s;
    st->have_cur = 1;
    st->t_cur = st->t_answer = t;
    wall_clock(st->clock, sizeof(st->clock));
    top_figures_free(&st->fig);
    rc = top_figures(st->have_prev ? &st->prev : NULL, &st->cur, st->t_cur - st->t_prev, &st->fig);
    if (rc != 0) {
        snprintf(st->error, sizeof(st->error), "%s", kvs_strerror(rc));
        return rc;
    }
    if (st->fig.have_interval)
        top_history_push(&st->history,
                         st->fig.hit_pct < 0 ? TOP_HIST_IDLE : (float)st->fig.hit_pct);
    return 0;
}

/* ---- the outputs ----------------------------------------------------------------- */

static void json_pct(FILE *f, const char *key, double pct)
{
    if (pct < 0)
        fprintf(f, ",\"%s\":null", key);
    else
        fprintf(f, ",\"%s\":%.4f", key, pct / 100.0);
}

/* One JSON object: the figures of the view (rates null before an interval),
 * or the error while kvshared does not answer. */
static void print_json(FILE *f, const top_state_t *st)
{
    fprintf(f, "{\"time\":%lld", (long long)time(NULL));
    if (st->error[0]) {
        fprintf(f, ",\"error\":");
        cli_json_string(f, st->error);
        fprintf(f, "}\n");
        return;
    }
    const top_figures_t *g = &st->fig;
    const kvs_stats_t *s = &st->cur;
    fprintf(f, ",\"uptime_ms\":%llu,\"interval_s\":", (unsigned long long)s->uptime_ms);
    if (g->have_interval)
        fprintf(f, "%.3f", g->dt);
    else
        fprintf(f, "null");
    json_pct(f, "hit_rate", g->hit_pct);
    json_pct(f, "hit_rate_since_start", g->hit_pct_all);
    if (g->have_interval)
        fprintf(f,
                ",\"lookups_per_s\":%.2f,\"saved_tokens_per_s\":%.2f,\"evictions_per_s\":%.2f,"
                "\"requests_per_s\":%.2f,\"errors_per_s\":%.2f",
                g->lookups_s, g->saved_tokens_s, g->evictions_s, g->requests_s, g->errors_s);
    fprintf(f,
            ",\"pool\":{\"total\":%u,\"free\":%u,\"writing\":%u,\"cached\":%u,\"pinned\":%u,"
            "\"used\":%.4f}",
            s->total_blocks, s->free_blocks, s->writing_blocks, s->cached_blocks, s->pinned_blocks,
            g->pool_used_pct / 100.0);
    fprintf(f, ",\"tier2\":{\"total\":%u,\"cached\":%u,\"used\":%.4f", s->tier2_total_blocks,
            s->tier2_cached_blocks, g->tier2_used_pct / 100.0);
    json_pct(f, "hit_rate", g->tier2_hit_pct);
    fprintf(f, "},\"devices\":[");
    for (size_t i = 0; i < s->n_devices; i++) {
        const kvs_device_stats_t *d = &s->devices[i];
        fprintf(f,
                "%s{\"rank\":%u,\"ordinal\":%d,\"pool_bytes\":%llu,\"used_bytes\":%llu,"
                "\"workers\":%u,\"shards_written\":%u,\"shards_missing\":%u}",
                i ? "," : "", d->rank, d->ordinal, (unsigned long long)d->pool_bytes,
                (unsigned long long)d->used_bytes, d->workers, d->shards_written,
                d->shards_missing);
    }
    fprintf(f, "],\"sessions\":%u,\"namespaces\":[", s->sessions);
    for (size_t i = 0; i < g->n_ns; i++) {
        const top_ns_row_t *r = &g->ns[i];
        const kvs_ns_stats_t *n = r->ns;
        fprintf(f, "%s{\"name\":", i ? "," : "");
        cli_json_string(f, n->name);
        if (g->have_interval)
            fprintf(f, ",\"lookups_per_s\":%.2f,\"evictions_per_s\":%.2f", r->lookups_s,
                    r->evictions_s);
        json_pct(f, "hit_rate", r->hit_pct);
        json_pct(f, "hit_rate_since_start", r->hit_pct_all);
        fprintf(f,
                ",\"held\":%u,\"reserve\":%u,\"quota\":%u,\"evicted_own\":%llu,"
                "\"evicted_others\":%llu,\"evicted_quota\":%llu",
                n->cached_blocks, n->reserve, n->quota, (unsigned long long)n->evicted_own,
                (unsigned long long)n->evicted_others, (unsigned long long)n->evicted_quota);
        if (n->bands)
            fprintf(
                f, ",\"cached_by_priority\":[%llu,%llu,%llu,%llu]",
                (unsigned long long)n->bands->cached[0], (unsigned long long)n->bands->cached[1],
                (unsigned long long)n->bands->cached[2], (unsigned long long)n->bands->cached[3]);
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
}

/* The line output of a pipe or a log: the stats text, then the rates. */
static void print_lines(FILE *f, const top_state_t *st, long n)
{
    if (st->error[0]) {
        fprintf(f, "%skvshare top: kvshared not answering: %s (retrying)\n", n ? "\n" : "",
                st->error);
        return;
    }
    const top_figures_t *g = &st->fig;
    const kvs_stats_t *s = &st->cur;
    if (n > 0)
        fputs("\n", f);
    if (st->notice[0])
        fprintf(f, "%s\n", st->notice);
    cli_print_stats(f, s);
    if (!g->have_interval)
        return;
    const kvs_stats_t *p = &st->prev;
    fprintf(f,
            "\nlast %.1fs: %.0f requests/s, %.0f lookups/s, hit rate %.1f%% of %llu tokens "
            "(%.1f%% since start), %.0f prefill tokens saved/s, %.0f evictions/s\n",
            g->dt, g->requests_s, g->lookups_s, g->hit_pct < 0 ? 0.0 : g->hit_pct,
            (unsigned long long)g->asked_tokens, g->hit_pct_all < 0 ? 0.0 : g->hit_pct_all,
            g->saved_tokens_s, g->evictions_s);
    if (s->tier2_total_blocks > 0) {
        double copy_s = (double)(s->tier_copy_us - p->tier_copy_us) / 1e6;
        double mib = (double)(s->tier_copied_bytes - p->tier_copied_bytes) / 1048576.0;
        fprintf(f,
                "tier 2: hit rate %.1f%% (tier 1 %.1f%%), %.0f promotions/s, %.0f "
                "demotions/s, %.0f drops/s, %.1f MiB/s copied (%.0f MiB/s while copying)\n",
                g->tier2_hit_pct < 0 ? 0.0 : g->tier2_hit_pct,
                g->hit_pct < 0 ? 0.0 : g->hit_pct - g->tier2_hit_pct, g->promotions_s,
                g->demotions_s, g->tier2_drops_s, g->copy_mib_s, copy_s > 0 ? mib / copy_s : 0.0);
    }
}

static void fill_view(top_state_t *st, const top_opts_t *o, top_page_t page, int scroll)
{
    top_view_t *v = &st->view;
    double t = now_s();
    v->page = page;
    v->scroll = scroll;
    v->utf8 = cli_utf8();
    v->interval = o->interval;
    v->cur = st->have_cur ? &st->cur : NULL;
    v->prev = st->have_prev ? &st->prev : NULL;
    v->fig = &st->fig;
    v->history = &st->history;
    v->error = st->error[0] ? st->error : NULL;
    v->down_for = t - st->t_answer;
    v->notice = st->notice[0] && t < st->notice_until ? st->notice : NULL;
    v->clock = st->clock;
    v->restore = st->restore.phase[0] ? &st->restore : NULL;
}

/* --once without --json: the overview, as plain text lines. */
static void print_once(top_state_t *st, const top_opts_t *o)
{
    int total;
    fill_view(st, o, TOP_PAGE_OVERVIEW, 0);
    st->view.plain = 1;
    scr_t s;
    scr_begin(&s, 10000, 400, 0); /* lines as long as they are: no terminal clips */
    top_view_draw(&s, &st->view, &total);
    fflush(stdout);
    scr_flush(&s, STDOUT_FILENO);
}

/* ---- the view's loop ------------------------------------------------------------- */

typedef struct view_keys {
    top_page_t page, back; /* back: the page under the help */
    int scroll, rows_total, height;
} view_keys_t;

/* Applies one key. Returns 1 to quit. */
static int on_key(view_keys_t *k, int key)
{
    if (k->page == TOP_PAGE_HELP && key != 0) {
        k->page = k->back;
        return 0;
    }
    int step = k->height > 10 ? k->height - 10 : 1;
    switch (key) {
    case 'q':
    case 'Q':
    case 3: /* Ctrl-C when the terminal does not send SIGINT */
        return 1;
    case '\t':
        k->page = k->page == TOP_PAGE_OVERVIEW ? TOP_PAGE_COUNTERS : TOP_PAGE_OVERVIEW;
        k->scroll = 0;
        break;
    case '1':
    case '2':
        k->page = key == '1' ? TOP_PAGE_OVERVIEW : TOP_PAGE_COUNTERS;
        k->scroll = 0;
        break;
    case 'h':
    case '?':
        k->back = k->page;
        k->page = TOP_PAGE_HELP;
        break;
    case 'j':
    case TERM_KEY_DOWN:
        k->scroll++;
        break;
    case 'k':
    case TERM_KEY_UP:
        k->scroll--;
        break;
    case TERM_KEY_PGDN:
    case ' ':
        k->scroll += step;
        break;
    case TERM_KEY_PGUP:
        k->scroll -= step;
        break;
    }
    if (k->scroll > k->rows_total - 1)
        k->scroll = k->rows_total - 1;
    if (k->scroll < 0)
        k->scroll = 0;
    return 0;
}

static void draw(top_state_t *st, const top_opts_t *o, view_keys_t *k)
{
    int rows, cols;
    term_size(&rows, &cols);
    k->height = rows;
    fill_view(st, o, k->page, k->scroll);
    scr_t s;
    scr_begin(&s, rows, cols, 1);
    top_view_draw(&s, &st->view, &k->rows_total);
    scr_flush(&s, STDOUT_FILENO);
}

static int run_view(top_state_t *st, const top_opts_t *o)
{
    view_keys_t k = {.page = TOP_PAGE_OVERVIEW, .back = TOP_PAGE_OVERVIEW};
    if (term_enter() != 0)
        return -1;
    double next = now_s();
    for (long n = 0; !stop_requested;) {
        double t = now_s();
        if (t >= next) {
            if (o->count && n >= o->count)
                break;
            sample(st);
            n++;
            next = t + o->interval;
            draw(st, o, &k);
            continue;
        }
        int key = term_key((int)((next - t) * 1000.0) + 1);
        if (key < 0)
            break; /* stdin closed: no one can press q */
        if (key > 0 && on_key(&k, key))
            break;
        if (key > 0 || term_resized())
            draw(st, o, &k);
    }
    term_leave();
    return 0;
}

/* ---- the command ----------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvshare top [--interval SECONDS] [--count N] [--once] [--json]\n"
            "                   [--socket PATH] [--timeout MS]\n"
            "\n"
            "On a terminal, a full-screen view refreshed every --interval (default 1 s):\n"
            "the hit rate of prompt tokens over the last interval and since start,\n"
            "lookups, prefill tokens saved and evictions per second, pool and tier-2\n"
            "usage, a sparkline of the hit rate, and a row per namespace, busiest first\n"
            "(hit rate, blocks held against reservation and quota, evictions by cause,\n"
            "cached blocks by priority). Keys: q quit, tab or 1/2 the overview or every\n"
            "counter, arrows or j/k scroll, h help. When kvshared stops answering the\n"
            "view says so and reconnects by itself.\n"
            "\n"
            "Not on a terminal: the stats text and a line of rates per interval.\n"
            "  --once     one report after one interval, then exit (the overview as text)\n"
            "  --json     one JSON object per interval (with --once: one)\n"
            "  --count N  stop after N samples\n"
            "\n"
            "What to do when a figure looks wrong: docs/OPERATING.md, \"The operator's\n"
            "views\" (on a node: /usr/share/doc/kvshared/OPERATING.md.gz, and man 1 kvshare).\n");
}

/* Parses the flags into o. Returns -1 to go on, else the exit status. */
static int parse(int argc, char **argv, top_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&o->conn, argc, argv, &i, "top");
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
            o->interval = (double)ms / 1000.0;
        } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            o->count = strtol(argv[++i], NULL, 10);
            if (o->count <= 0) {
                fprintf(stderr, "kvshare top: --count takes a positive number\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--once") == 0) {
            o->once = 1;
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvshare top: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

/* The view starts even when kvshared is down (it says so and retries, at
 * the first of the paths when no daemon answers at any); scripts get the
 * explanation and exit status 1 at once. */
static kvs_client_t *connect_for(const top_opts_t *o, top_mode_t mode)
{
    if (mode != MODE_VIEW)
        return cli_connect(&o->conn, "top");
    char paths[CLI_MAX_PATHS][CLI_PATH_LEN];
    int n = cli_socket_paths(&o->conn, paths);
    if (n == 0) {
        fprintf(stderr, "kvshare top: cannot build the default socket path; give --socket PATH\n");
        return NULL;
    }
    for (int i = 0; i <= n; i++) {
        /* Past the last: none answers; the view waits at the first. */
        kvs_client_t *c = cli_connect_path(&o->conn, paths[i < n ? i : 0], "kvshare-top");
        if (!c) {
            fprintf(stderr, "kvshare top: %s\n", kvs_strerror(KVS_ENOMEM));
            return NULL;
        }
        if (i == n || kvs_connected(c))
            return c;
        kvs_close(c);
    }
    return NULL;
}

int kvshare_cmd_top(int argc, char **argv)
{
    top_opts_t o = {.interval = 1.0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    top_mode_t mode = o.json                                          ? MODE_JSON
                      : o.once                                        ? MODE_ONCE
                      : isatty(STDOUT_FILENO) && isatty(STDIN_FILENO) ? MODE_VIEW
                                                                      : MODE_LINES;
    if (o.once)
        o.count = 2; /* two samples: one interval of rates */
    top_state_t *st = calloc(1, sizeof(*st));
    if (!st) {
        fprintf(stderr, "kvshare top: %s\n", kvs_strerror(KVS_ENOMEM));
        return 1;
    }
    st->client = connect_for(&o, mode);
    if (!st->client) {
        free(st);
        return 1;
    }
    char where[256];
    if (o.conn.socket_path)
        snprintf(where, sizeof(where), "%s", o.conn.socket_path);
    else if (kvs_default_socket_path(where, sizeof(where)) != 0)
        snprintf(where, sizeof(where), "kvshared");
    st->view.where = where;
    st->t_answer = now_s();
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rc = 0;
    if (mode == MODE_VIEW) {
        run_view(st, &o);
    } else {
        for (long n = 0; !stop_requested && (o.count == 0 || n < o.count); n++) {
            if (n > 0) {
                struct timespec sl = {(time_t)o.interval,
                                      (long)((o.interval - (double)(time_t)o.interval) * 1e9)};
                nanosleep(&sl, NULL);
            }
            int failed = sample(st) != 0;
            if (o.once) {
                if (failed) {
                    fprintf(stderr, "kvshare top: %s\n", st->error);
                    rc = 1;
                    break;
                }
                if (n + 1 < o.count)
                    continue;
            }
            if (mode == MODE_JSON)
                print_json(stdout, st);
            else if (mode == MODE_ONCE)
                print_once(st, &o);
            else
                print_lines(stdout, st, n);
            fflush(stdout);
        }
    }
    top_figures_free(&st->fig);
    if (st->have_prev)
        kvs_stats_free(&st->prev);
    if (st->have_cur)
        kvs_stats_free(&st->cur);
    kvs_close(st->client);
    free(st);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    return rc;
}
