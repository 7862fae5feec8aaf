/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare tree: the prefix tree of the index, per namespace, drawn as a tree.
 *
 *       HITS  SHARE  BLOCKS  IN T2  PINS  PREFIX (tokens)
 *        360  90.0%     120      0     2  ├─ 64
 *        200  50.0%      60      0     1  │  ├─ +128 = 192
 *         14   3.5%      37      0     0  │  └─ 12 more below 5.0%
 *
 * A row is a node of the index's compressed tree (a prefix ending where
 * prompts diverge or stop); its children are the prefixes that extend it.
 * SHARE is the row's hits against its namespace's lookups: the part of the
 * traffic that reused the whole prefix. Children under --min-share of it are
 * folded into one "more" row. One Tree reply (the top rows by hits, at most
 * --max) and one Stats reply (lookups, capacity) make the picture; a listing
 * by hits holds every listed row's parent (kvshare.h, kvs_tree), so rows
 * nest without gaps. --json: the same nesting, for scripts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"

#define TREE_FETCH_DEFAULT 1000 /* the daemon's most rows per reply */
#define NO_PARENT          SIZE_MAX

typedef struct tree_opts {
    const char *ns;
    int by_size, json;
    double min_share; /* fraction; children under it fold into one row */
    long max;         /* rows asked for */
} tree_opts_t;

/* The listing as a tree: rows[i]'s parent index (NO_PARENT: a top-level
 * prefix, or one whose parent is not listed), and the children of every
 * row (and of the roots, at index n) as ranges of `kids`, strongest first. */
typedef struct tree_model {
    const kvs_prefix_t *rows;
    size_t n;
    int by_size;
    size_t *parent;
    size_t *kids;       /* row indices grouped by parent */
    size_t *kids_start; /* n + 1 groups (the last: the roots) */
    size_t *kids_count;
} tree_model_t;

static const tree_model_t *sort_model; /* qsort has no context argument */

static uint64_t row_key(const tree_model_t *m, size_t i)
{
    return m->by_size ? m->rows[i].blocks : m->rows[i].hits;
}

/* Children before grandchildren does not matter here: group by parent,
 * then strongest first, then shorter, then by block id (stable output). */
static int cmp_kid(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    const tree_model_t *m = sort_model;
    size_t px = m->parent[x] == NO_PARENT ? m->n : m->parent[x];
    size_t py = m->parent[y] == NO_PARENT ? m->n : m->parent[y];
    if (px != py)
        return px < py ? -1 : 1;
    if (row_key(m, x) != row_key(m, y))
        return row_key(m, x) > row_key(m, y) ? -1 : 1;
    if (m->rows[x].tokens != m->rows[y].tokens)
        return m->rows[x].tokens < m->rows[y].tokens ? -1 : 1;
    return (m->rows[x].last_block_id > m->rows[y].last_block_id) -
           (m->rows[x].last_block_id < m->rows[y].last_block_id);
}

static void model_free(tree_model_t *m)
{
    free(m->parent);
    free(m->kids);
    free(m->kids_start);
    free(m->kids_count);
}

/* Links each row to its parent (same namespace, parent_block_id equal to
 * the parent's last_block_id) and groups the children. Returns 0 or
 * KVS_ENOMEM; free with model_free either way. n is at most the daemon's
 * row limit, so the quadratic parent search costs nothing that matters. */
static int model_build(tree_model_t *m, const kvs_prefix_t *rows, size_t n, int by_size)
{
    memset(m, 0, sizeof(*m));
    m->rows = rows;
    m->n = n;
    m->by_size = by_size;
    m->parent = malloc((n + 1) * sizeof(size_t));
    m->kids = malloc((n + 1) * sizeof(size_t));
    m->kids_start = calloc(n + 1, sizeof(size_t));
    m->kids_count = calloc(n + 1, sizeof(size_t));
    if (!m->parent || !m->kids || !m->kids_start || !m->kids_count)
        return KVS_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        m->parent[i] = NO_PARENT;
        for (size_t j = 0; rows[i].has_parent && j < n; j++)
            if (j != i && rows[j].last_block_id == rows[i].parent_block_id &&
                strcmp(rows[j].ns, rows[i].ns) == 0) {
                m->parent[i] = j;
                break;
            }
        m->kids[i] = i;
    }
    sort_model = m;
    qsort(m->kids, n, sizeof(size_t), cmp_kid);
    sort_model = NULL;
    for (size_t k = n; k-- > 0;) {
        size_t i = m->kids[k];
        size_t p = m->parent[i] == NO_PARENT ? n : m->parent[i];
        m->kids_start[p] = k;
        m->kids_count[p]++;
    }
    return 0;
}

static double share_of(uint64_t hits, const kvs_ns_stats_t *ns)
{
    return ns && ns->lookups ? (double)hits / (double)ns->lookups : 0.0;
}

/* ---- text ---------------------------------------------------------------------- */

typedef struct draw {
    FILE *f;
    const tree_model_t *m;
    const kvs_ns_stats_t *ns;
    double min_share;
    const char *tee, *elbow, *pipe, *gap; /* branch glyphs */
    char indent[1024];                    /* the glyphs drawn left of a row */
} draw_t;

static void draw_figures(draw_t *d, uint64_t hits, uint32_t blocks, uint32_t t2, uint32_t pins)
{
    fprintf(d->f, "%10llu %5.1f%% %7u %6u %5u  %s", (unsigned long long)hits,
            100.0 * share_of(hits, d->ns), blocks, t2, pins, d->indent);
}

static void draw_children(draw_t *d, size_t parent, uint32_t parent_tokens);

static void draw_row(draw_t *d, size_t i, uint32_t parent_tokens, int last)
{
    const kvs_prefix_t *r = &d->m->rows[i];
    draw_figures(d, r->hits, r->blocks, r->tier2_blocks, r->pins);
    fputs(last ? d->elbow : d->tee, d->f);
    if (d->m->parent[i] == NO_PARENT && r->has_parent)
        fprintf(d->f, "... %u", r->tokens); /* its parent is not in the listing */
    else if (parent_tokens)
        fprintf(d->f, "+%u = %u", r->tokens - parent_tokens, r->tokens);
    else
        fprintf(d->f, "%u", r->tokens);
    fprintf(d->f, "%s\n", r->tier == 2 ? "  [tier 2]" : r->tier == 3 ? "  [tier 3]" : "");
    size_t len = strlen(d->indent);
    const char *more = last ? d->gap : d->pipe;
    if (len + strlen(more) < sizeof(d->indent)) {
        memcpy(d->indent + len, more, strlen(more) + 1);
        draw_children(d, i, r->tokens);
        d->indent[len] = '\0';
    } else if (d->m->kids_count[i]) {
        /* Hundreds of branch points deep: say so rather than drop them. */
        fprintf(d->f, "%*s%s%s%zu deeper prefixes not drawn (--json has them)\n", 40, "", d->indent,
                d->elbow, d->m->kids_count[i]);
    }
}

/* Whether row i is listed among the children of `parent`: all children of
 * a row; at a namespace's top level (parent == m->n), its own rows only. */
static int child_listed(const tree_model_t *m, size_t parent, size_t i, const char *ns_name)
{
    return parent != m->n || !ns_name || strcmp(m->rows[i].ns, ns_name) == 0;
}

/* The children of one row that fold into a "more" row: those under
 * min_share, unless that is a single one (a row of its own reads better
 * than "1 more"). */
typedef struct fold {
    double below; /* a child folds when its share is under this */
    size_t shown, folded;
    uint64_t hits;
    uint32_t blocks, t2, pins;
} fold_t;

static fold_t fold_scan(const tree_model_t *m, size_t parent, const char *ns_name,
                        const kvs_ns_stats_t *ns, double min_share)
{
    fold_t f = {.below = min_share};
    const size_t *k = m->kids + m->kids_start[parent];
    for (size_t j = 0; j < m->kids_count[parent]; j++) {
        const kvs_prefix_t *r = &m->rows[k[j]];
        if (!child_listed(m, parent, k[j], ns_name))
            continue;
        if (share_of(r->hits, ns) >= min_share) {
            f.shown++;
            continue;
        }
        f.folded++;
        f.hits += r->hits;
        f.blocks += r->blocks;
        f.t2 += r->tier2_blocks;
        f.pins += r->pins;
    }
    if (f.folded == 1) {
        f = (fold_t){.below = -1, .shown = f.shown + 1};
    }
    return f;
}

static int fold_shows(const fold_t *f, const kvs_prefix_t *r, const kvs_ns_stats_t *ns)
{
    return share_of(r->hits, ns) >= f->below;
}

/* The children of `parent` (d->m->n: the namespace's top level), strongest
 * first; those under min_share fold into one row that sums them. */
static void draw_children(draw_t *d, size_t parent, uint32_t parent_tokens)
{
    const tree_model_t *m = d->m;
    const size_t *k = m->kids + m->kids_start[parent];
    const char *ns_name = d->ns ? d->ns->name : NULL;
    fold_t f = fold_scan(m, parent, ns_name, d->ns, d->min_share);
    for (size_t j = 0, drawn = 0; j < m->kids_count[parent] && drawn < f.shown; j++) {
        if (!child_listed(m, parent, k[j], ns_name) || !fold_shows(&f, &m->rows[k[j]], d->ns))
            continue;
        drawn++;
        draw_row(d, k[j], parent_tokens, drawn == f.shown && f.folded == 0);
    }
    if (f.folded) {
        draw_figures(d, f.hits, f.blocks, f.t2, f.pins);
        fprintf(d->f, "%s%zu more prefixes below %.1f%%\n", d->elbow, f.folded,
                100.0 * d->min_share);
    }
}

static void print_ns_head(FILE *f, const kvs_ns_stats_t *n)
{
    char quota[16] = "none";
    if (n->quota)
        snprintf(quota, sizeof(quota), "%u", n->quota);
    fprintf(f, "namespace %s: %llu lookups, %.1f%% of tokens hit; %u blocks held", n->name,
            (unsigned long long)n->lookups,
            n->lookup_tokens ? 100.0 * (double)n->hit_tokens / (double)n->lookup_tokens : 0.0,
            n->cached_blocks);
    if (n->tier2_blocks)
        fprintf(f, " + %u in tier 2", n->tier2_blocks);
    fprintf(f, " (reserve %u, quota %s)\n", n->reserve, quota);
    fprintf(f, "  evicted %llu (for its own need %llu, for others %llu, at quota %llu)",
            (unsigned long long)n->evicted_blocks, (unsigned long long)n->evicted_own,
            (unsigned long long)n->evicted_others, (unsigned long long)n->evicted_quota);
    if (n->bands) {
        static const char *const band[KVS_PRIORITY_BANDS] = {"0-24", "25-49", "50-74", "75-100"};
        fprintf(f, "; cached by priority");
        for (size_t b = 0; b < KVS_PRIORITY_BANDS; b++)
            fprintf(f, " %s: %llu", band[b], (unsigned long long)n->bands->cached[b]);
    }
    fprintf(f, "\n");
}

static void print_text(const tree_model_t *m, const kvs_stats_t *s, const tree_opts_t *o)
{
    int utf8 = cli_utf8();
    draw_t d = {.f = stdout, .m = m, .min_share = o->min_share};
    d.tee = utf8 ? "├─ " : "|- ";
    d.elbow = utf8 ? "└─ " : "`- ";
    d.pipe = utf8 ? "│  " : "|  ";
    d.gap = "   ";
    int printed = 0;
    for (size_t i = 0; i < s->n_namespaces; i++) {
        const kvs_ns_stats_t *n = &s->namespaces[i];
        if (o->ns && strcmp(o->ns, n->name) != 0)
            continue;
        printf("%s", printed++ ? "\n" : "");
        print_ns_head(stdout, n);
        uint64_t listed = 0;
        for (size_t j = 0; j < m->n; j++)
            if (m->parent[j] == NO_PARENT && strcmp(m->rows[j].ns, n->name) == 0)
                listed += m->rows[j].blocks;
        if (listed == 0) {
            printf("  nothing cached\n");
            continue;
        }
        printf("\n%10s %6s %7s %6s %5s  %s\n", "HITS", "SHARE", "BLOCKS", "IN T2", "PINS",
               "PREFIX (tokens)");
        d.ns = n;
        d.indent[0] = '\0';
        draw_children(&d, m->n, 0);
        uint64_t held = (uint64_t)n->cached_blocks + n->tier2_blocks;
        if (listed < held)
            printf("  (%llu blocks lie under prefixes past the %ld listed: raise --max)\n",
                   (unsigned long long)(held - listed), o->max);
    }
    if (!printed)
        printf("no namespace yet (no lookup or commit so far)\n");
}

/* ---- JSON ---------------------------------------------------------------------- */

static void json_children(FILE *f, const tree_model_t *m, size_t parent, const char *ns_name,
                          const kvs_ns_stats_t *ns, double min_share);

static void json_row(FILE *f, const tree_model_t *m, size_t i, const kvs_ns_stats_t *ns,
                     double min_share)
{
    const kvs_prefix_t *r = &m->rows[i];
    fprintf(f,
            "{\"tokens\":%u,\"blocks\":%u,\"hits\":%llu,\"share\":%.4f,\"pins\":%u,"
            "\"age_ops\":%llu,\"last_block_id\":%u,\"tier\":%u,\"tier2_blocks\":%u,"
            "\"children\":",
            r->tokens, r->blocks, (unsigned long long)r->hits, share_of(r->hits, ns), r->pins,
            (unsigned long long)r->age_ticks, r->last_block_id, r->tier, r->tier2_blocks);
    json_children(f, m, i, NULL, ns, min_share);
    fprintf(f, "}");
}

/* As draw_children: an array of rows, then (when some fold) a "more"
 * object summing those under min_share, as the text's last row. */
static void json_children(FILE *f, const tree_model_t *m, size_t parent, const char *ns_name,
                          const kvs_ns_stats_t *ns, double min_share)
{
    const size_t *k = m->kids + m->kids_start[parent];
    fold_t fo = fold_scan(m, parent, ns_name, ns, min_share);
    size_t shown = 0;
    fprintf(f, "[");
    for (size_t j = 0; j < m->kids_count[parent]; j++) {
        if (!child_listed(m, parent, k[j], ns_name) || !fold_shows(&fo, &m->rows[k[j]], ns))
            continue;
        fprintf(f, "%s", shown++ ? "," : "");
        json_row(f, m, k[j], ns, min_share);
    }
    if (fo.folded)
        fprintf(f, "%s{\"more\":%zu,\"blocks\":%u,\"hits\":%llu,\"tier2_blocks\":%u,\"pins\":%u}",
                shown ? "," : "", fo.folded, fo.blocks, (unsigned long long)fo.hits, fo.t2,
                fo.pins);
    fprintf(f, "]");
}

static void print_json(const tree_model_t *m, const kvs_stats_t *s, const tree_opts_t *o)
{
    size_t printed = 0;
    printf("{\"namespaces\":[");
    for (size_t i = 0; i < s->n_namespaces; i++) {
        const kvs_ns_stats_t *n = &s->namespaces[i];
        if (o->ns && strcmp(o->ns, n->name) != 0)
            continue;
        printf("%s{\"name\":", printed++ ? "," : "");
        cli_json_string(stdout, n->name);
        printf(",\"lookups\":%llu,\"cached_blocks\":%u,\"tier2_blocks\":%u,\"prefixes\":",
               (unsigned long long)n->lookups, n->cached_blocks, n->tier2_blocks);
        json_children(stdout, m, m->n, n->name, n, o->min_share);
        printf("}");
    }
    printf("]}\n");
}

/* ---- the command --------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvshare tree [--ns NAME] [--min-share PCT] [--by-size] [--max N] [--json]\n"
            "                    [--socket PATH] [--timeout MS]\n"
            "\n"
            "The prefix tree of each namespace: a row per cached prefix (where prompts\n"
            "diverge or stop), its children indented below it. HITS: lookups that matched\n"
            "the whole prefix; SHARE: those against the namespace's lookups; BLOCKS: cached\n"
            "blocks under it, itself included; IN T2: of those, below the pool (tiers 2\n"
            "and 3); PINS: pins held on them now; PREFIX: its length in tokens (+ what it\n"
            "adds to its parent); [tier 2] / [tier 3]: its own last block is in host\n"
            "memory / on the disk. Above each tree: the\n"
            "namespace's traffic, blocks held against reserve and quota, evictions by cause\n"
            "and cached blocks by retention priority band.\n"
            "\n"
            "  --min-share PCT  fold children with a smaller SHARE into one row (default 1;\n"
            "                   0 shows every listed prefix)\n"
            "  --by-size        order by blocks, not hits\n"
            "  --max N          prefixes asked of kvshared (1 to 1000, default 1000)\n"
            "  --json           {\"namespaces\":[{name, lookups, ..., \"prefixes\":[{tokens,\n"
            "                   blocks, hits, share, ..., \"children\":[...]}]}]}: every listed\n"
            "                   prefix unless --min-share is given\n"
            "\n"
            "What to do when a figure looks wrong: docs/OPERATING.md, \"The operator's\n"
            "views\" (on a node: /usr/share/doc/kvshared/OPERATING.md.gz, and man 1 kvshare).\n");
}

/* Parses the flags into o. Returns -1 to go on, else the exit status. */
static int parse(int argc, char **argv, cli_conn_t *conn, tree_opts_t *o)
{
    int min_share_given = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(conn, argc, argv, &i, "tree");
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "--ns") == 0 && i + 1 < argc) {
            o->ns = argv[++i];
        } else if (strcmp(argv[i], "--by-size") == 0) {
            o->by_size = 1;
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
        } else if (strcmp(argv[i], "--min-share") == 0 && i + 1 < argc) {
            char *end;
            double pct = strtod(argv[++i], &end);
            if (end == argv[i] || (*end && strcmp(end, "%") != 0) || !(pct >= 0 && pct <= 100)) {
                fprintf(stderr, "kvshare tree: --min-share takes a percentage, 0 to 100\n");
                return 2;
            }
            o->min_share = pct / 100.0;
            min_share_given = 1;
        } else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc) {
            o->max = strtol(argv[++i], NULL, 10);
            if (o->max <= 0 || o->max > TREE_FETCH_DEFAULT) {
                fprintf(stderr, "kvshare tree: --max takes 1 to %d\n", TREE_FETCH_DEFAULT);
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
    if (!min_share_given && o->json)
        o->min_share = 0;
    return -1;
}

int kvshare_cmd_tree(int argc, char **argv)
{
    cli_conn_t conn = {0};
    tree_opts_t o = {.min_share = 0.01, .max = TREE_FETCH_DEFAULT};
    int rc = parse(argc, argv, &conn, &o);
    if (rc >= 0)
        return rc;
    kvs_client_t *c = cli_connect(&conn, "tree");
    if (!c)
        return 1;
    kvs_stats_t s;
    memset(&s, 0, sizeof(s));
    tree_model_t m = {0};
    size_t n = 0;
    kvs_prefix_t *rows = calloc((size_t)o.max, sizeof(*rows));
    rc = rows ? kvs_tree(c, o.ns, o.by_size, rows, (size_t)o.max, &n) : KVS_ENOMEM;
    if (rc == 0)
        rc = kvs_stats(c, &s);
    if (rc != 0) {
        fprintf(stderr, "kvshare tree: %s\n", rows ? kvs_last_error(c) : kvs_strerror(rc));
        goto out;
    }
    rc = model_build(&m, rows, n, o.by_size);
    if (rc != 0) {
        fprintf(stderr, "kvshare tree: %s\n", kvs_strerror(rc));
        goto out;
    }
    if (o.json)
        print_json(&m, &s, &o);
    else
        print_text(&m, &s, &o);
out:
    model_free(&m);
    kvs_stats_free(&s);
    free(rows);
    kvs_close(c);
    return rc == 0 ? 0 : 1;
}
