/* SPDX-License-Identifier: Apache-2.0 */
#include "top_figures.h"

#include <stdlib.h>
#include <string.h>

static double pct_or_none(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : TOP_NONE;
}

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

/* A counter's growth; 0 if it went back (a namespace deleted and created
 * again between the samples). */
static uint64_t grew(uint64_t now, uint64_t then)
{
    return now >= then ? now - then : 0;
}

static const kvs_ns_stats_t *find_ns(const kvs_stats_t *s, const char *name)
{
    for (size_t i = 0; s && i < s->n_namespaces; i++)
        if (strcmp(s->namespaces[i].name, name) == 0)
            return &s->namespaces[i];
    return NULL;
}

static int cmp_traffic(const void *a, const void *b)
{
    const top_ns_row_t *x = a, *y = b;
    if (x->lookups_s != y->lookups_s)
        return x->lookups_s > y->lookups_s ? -1 : 1;
    if (x->ns->lookups != y->ns->lookups)
        return x->ns->lookups > y->ns->lookups ? -1 : 1;
    return strcmp(x->ns->name, y->ns->name);
}

int top_restarted(const kvs_stats_t *prev, const kvs_stats_t *cur)
{
    return cur->uptime_ms < prev->uptime_ms || cur->requests < prev->requests;
}

int top_figures(const kvs_stats_t *prev, const kvs_stats_t *cur, double dt, top_figures_t *out)
{
    memset(out, 0, sizeof(*out));
    out->have_interval = prev != NULL && dt > 0;
    out->dt = dt;
    out->pool_used_pct = pct(cur->total_blocks - cur->free_blocks, cur->total_blocks);
    out->pool_pinned_pct = pct(cur->pinned_blocks, cur->total_blocks);
    out->tier2_used_pct = pct(cur->tier2_cached_blocks, cur->tier2_total_blocks);
    out->ns = calloc(cur->n_namespaces + 1, sizeof(*out->ns));
    if (!out->ns)
        return KVS_ENOMEM;
    out->n_ns = cur->n_namespaces;
    uint64_t asked = 0, hit = 0, hit_t2 = 0, asked_all = 0, hit_all = 0, lookups = 0;
    for (size_t i = 0; i < cur->n_namespaces; i++) {
        const kvs_ns_stats_t *n = &cur->namespaces[i];
        const kvs_ns_stats_t *p = out->have_interval ? find_ns(prev, n->name) : NULL;
        top_ns_row_t *row = &out->ns[i];
        row->ns = n;
        row->hit_pct_all = pct_or_none(n->hit_tokens, n->lookup_tokens);
        row->hit_pct = TOP_NONE;
        asked_all += n->lookup_tokens;
        hit_all += n->hit_tokens;
        if (!out->have_interval)
            continue;
        /* A namespace new since prev: everything it did is in the interval. */
        uint64_t a = grew(n->lookup_tokens, p ? p->lookup_tokens : 0);
        uint64_t h = grew(n->hit_tokens, p ? p->hit_tokens : 0);
        uint64_t l = grew(n->lookups, p ? p->lookups : 0);
        row->lookups_s = (double)l / dt;
        row->hit_pct = pct_or_none(h, a);
        row->evictions_s = (double)grew(n->evicted_blocks, p ? p->evicted_blocks : 0) / dt;
        asked += a;
        hit += h;
        hit_t2 += grew(n->tier2_hit_tokens, p ? p->tier2_hit_tokens : 0);
        lookups += l;
    }
    qsort(out->ns, out->n_ns, sizeof(*out->ns), cmp_traffic);
    out->hit_pct_all = pct_or_none(hit_all, asked_all);
    out->hit_pct = out->tier2_hit_pct = TOP_NONE;
    if (!out->have_interval)
        return 0;
    out->asked_tokens = asked;
    out->hit_pct = pct_or_none(hit, asked);
    out->tier2_hit_pct = pct_or_none(hit_t2, asked);
    out->lookups_s = (double)lookups / dt;
    out->saved_tokens_s = (double)hit / dt;
    out->requests_s = (double)grew(cur->requests, prev->requests) / dt;
    out->evictions_s = (double)grew(cur->evictions, prev->evictions) / dt;
    out->errors_s = (double)grew(cur->errors, prev->errors) / dt;
    out->promotions_s = (double)grew(cur->tier_promotions, prev->tier_promotions) / dt;
    out->demotions_s = (double)grew(cur->tier_demotions, prev->tier_demotions) / dt;
    out->tier2_drops_s = (double)grew(cur->tier2_drops, prev->tier2_drops) / dt;
    out->copy_mib_s =
        (double)grew(cur->tier_copied_bytes, prev->tier_copied_bytes) / 1048576.0 / dt;
    return 0;
}

void top_figures_free(top_figures_t *f)
{
    free(f->ns);
    f->ns = NULL;
    f->n_ns = 0;
}

void top_history_push(top_history_t *h, float pct)
{
    h->pct[h->next] = pct;
    h->next = (h->next + 1) % TOP_HISTORY_MAX;
    if (h->n < TOP_HISTORY_MAX)
        h->n++;
}

float top_history_get(const top_history_t *h, size_t back)
{
    return h->pct[(h->next + TOP_HISTORY_MAX - 1 - back) % TOP_HISTORY_MAX];
}
