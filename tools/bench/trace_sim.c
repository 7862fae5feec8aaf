/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench trace-sim: the prefix index alone, replaying a request trace
 * (trace.h) offline, to measure hit rate against capacity and eviction
 * policy without a daemon.
 *
 * A pool of C block ids stands for the daemon's pool. Per request, as a
 * worker and the daemon would:
 *   1. radix_lookup of the prompt with pin: the hit blocks;
 *   2. take one free id per missing full block; when the pool has too few,
 *      radix_evict the difference (evicted ids return to the pool);
 *   3. radix_insert of the hit blocks and the new ones (no pin);
 *   4. radix_unpin of the hit blocks.
 * Token hit rate = tokens of hit blocks / all prompt tokens (partial last
 * blocks count as prompt tokens and are never hits). The unlimited hit rate
 * is the same run with a pool large enough to never evict.
 *
 * With a tier 2 (sp->tier2 blocks; the index's Tiers, exclusive: a block is
 * in one tier, so the cache holds both tiers' sum) the flow is kvshared's
 * with --host-tier, with copies that end at once:
 *   1'. the lookup's match is tier-1 blocks, then tier-2 blocks; those are
 *       promoted into free pool ids (radix_promote), after demoting as many
 *       others as the pool lacks (radix_demote), and count as hits in tier
 *       2; a tier-2 block that cannot come back is not a hit;
 *   2'. the missing blocks' room is made by radix_demote instead of
 *       radix_evict: the pool's least recently used candidates move to tier
 *       2, which drops its own least recently used leaves when full.
 * With a tier 3 as well (sp->tier3, kvshared's disk tier), tier 2 makes its
 * room by moving its least recently used candidates to tier 3, which drops
 * its own leaves; a match may go on into tier 3, whose blocks come back to
 * the pool as tier 2's do (counted in t2_hit_tokens and t3_hit_tokens).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "radix.h"
#include "trace.h"
#include "trace_sim.h"

typedef struct id_pool {
    uint32_t *ids;
    size_t n;
    uint32_t capacity; /* ids at or above it are tier 2's, which the tree keeps */
} id_pool_t;

static void pool_put(void *ctx, uint32_t block_id)
{
    id_pool_t *p = ctx;
    if (block_id < p->capacity)
        p->ids[p->n++] = block_id;
}

static size_t next_use_of(const sim_oracle_t *o, const trace_req_t *req, size_t u)
{
    return u < req->n_hash ? o->next_use[req->first_hash + u] : SIZE_MAX;
}

/* A uniform draw in [0, 1) from *x (xorshift64, never 0 once seeded). */
static double draw(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return (double)(*x >> 11) / (double)(1ull << 53);
}

uint64_t sim_oracle_horizon(const sim_oracle_t *o)
{
    /* Before any keep hint: as if one block a request were kept. */
    uint64_t kept = o->keep_new ? o->keep_new : 1;
    uint64_t h = (uint64_t)o->capacity * (o->requests ? o->requests : 1) / kept;
    return h ? h : 1;
}

void sim_oracle_hints(sim_oracle_t *o, size_t r, size_t n_blocks, size_t n_hit, int *prio,
                      uint64_t *horizon)
{
    uint64_t h = sim_oracle_horizon(o);
    /* splitmix64 of (seed, r): the same draws for r in any process. */
    uint64_t x = o->seed + 0x9E3779B97F4A7C15ull * (r + 1);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x |= 1;
    double q = 2 * o->accuracy - 1;
    bool knows = draw(&x) < q;
    const trace_req_t *req = &o->tr->reqs[r];
    for (size_t u = 0, k = 0; k < n_blocks; u++) {
        size_t next = next_use_of(o, req, u);
        bool truth = next != SIZE_MAX && next - r <= h;
        if (o->per_unit)
            knows = draw(&x) < q;
        double coin = draw(&x); /* drawn either way: the draws do not depend on q */
        bool keep = knows ? truth : coin < 0.5;
        prio[u] = keep ? SIM_HINT_KEEP : SIM_HINT_DROP;
        for (size_t end = (u + 1) * o->unit_blocks; k < n_blocks && k < end; k++)
            o->keep_new += keep && k >= n_hit;
    }
    o->requests++;
    *horizon = h;
}

/* Demotes up to n blocks for ns; the copies end at once, so the tier-1 ids
 * the demoted blocks leave go back to the pool (dropped ones come back
 * through on_evict). */
static int sim_demote(radix_tree_t *t, uint32_t ns, size_t n, radix_move_t *moves, id_pool_t *pool)
{
    size_t want = pool->n + n;
    /* A move from tier 2 to tier 3 frees a tier-2 id, not a pool id: the
     * next call demotes into it (kvshared's request waits for the first
     * copies and runs again). */
    while (pool->n < want) {
        size_t moved = 0, dropped = 0, before = pool->n;
        int rc = radix_demote(t, ns, want - pool->n, moves, &moved, &dropped);
        for (size_t k = 0; rc == 0 && k < moved; k++) {
            uint32_t from;
            rc = radix_copy_done(t, moves[k].to, &from);
            if (rc == 0)
                pool_put(pool, from);
        }
        if (rc)
            return rc;
        if (moved == 0 && pool->n == before)
            break; /* nothing more can go */
    }
    return 0;
}

/* ids[0 .. n) are tier-2 blocks a pinned lookup matched after its tier-1
 * blocks: each comes back to a free pool id, in prompt order (a block's
 * parent is in tier 1 by then), after demoting as many other blocks as the
 * pool lacks. Replaces the promoted ids by their tier-1 ids (the lookup's
 * pins move with them); *n_done of them, fewer than n only when demotion
 * found too little to move (everything else pinned). */
static int sim_promote(radix_tree_t *t, uint32_t ns, uint32_t *ids, size_t n, radix_move_t *moves,
                       id_pool_t *pool, size_t *n_done)
{
    *n_done = 0;
    if (n > pool->n) {
        int rc = sim_demote(t, ns, n - pool->n, moves, pool);
        if (rc)
            return rc;
    }
    for (; *n_done < n && pool->n > 0; (*n_done)++) {
        uint32_t id = pool->ids[--pool->n], peer;
        int rc = radix_promote(t, ids[*n_done], id);
        if (rc == 0)
            rc = radix_copy_done(t, id, &peer);
        if (rc) {
            pool->n++;
            return rc;
        }
        ids[*n_done] = id;
    }
    return 0;
}

uint64_t sim_unlimited_blocks(const trace_t *tr, uint32_t block_tokens)
{
    uint64_t n = 0;
    for (size_t i = 0; i < tr->n_reqs; i++)
        n += trace_prompt_tokens(tr, &tr->reqs[i]) / block_tokens;
    return n ? n : 1;
}

int sim_run(const trace_t *tr, const sim_params_t *sp, sim_result_t *res)
{
    int rc = KVS_EINVAL;
    radix_tree_t *t = NULL;
    uint32_t *tokens = NULL, *ids = NULL, *canon = NULL;
    radix_move_t *moves = NULL;
    size_t *own_next = NULL;
    const size_t *next_use = sp ? sp->next_use : NULL;
    int *prio = NULL;
    id_pool_t pool = {0};
    if (!tr || !sp || !res || sp->block_tokens == 0 || sp->capacity == 0 ||
        sp->tier2 > UINT32_MAX - sp->capacity)
        return KVS_EINVAL;
    memset(res, 0, sizeof(*res));
    size_t max_tokens = 0;
    for (size_t i = 0; i < tr->n_reqs; i++) {
        size_t n = trace_prompt_tokens(tr, &tr->reqs[i]);
        if (n > max_tokens)
            max_tokens = n;
    }
    size_t max_blocks = max_tokens / sp->block_tokens;
    rc = KVS_ENOMEM;
    tokens = malloc((max_tokens + 1) * sizeof(*tokens));
    ids = malloc((max_blocks + 1) * sizeof(*ids));
    canon = malloc((max_blocks + 1) * sizeof(*canon));
    moves = malloc((max_blocks + 1) * sizeof(*moves));
    pool.ids = malloc((size_t)sp->capacity * sizeof(*pool.ids));
    if (!tokens || !ids || !canon || !moves || !pool.ids)
        goto out;
    bool hints = sp->hints;
    sim_oracle_t oracle = {0};
    if (hints) {
        if (!next_use) {
            rc = trace_next_uses(tr, &own_next);
            if (rc)
                goto out;
            next_use = own_next;
        }
        oracle = (sim_oracle_t){.tr = tr,
                                .next_use = next_use,
                                .accuracy = sp->hint_accuracy,
                                .seed = sp->hint_seed,
                                .per_unit = sp->hint_per_unit,
                                .capacity = sp->capacity,
                                .unit_blocks = TRACE_HASH_TOKENS / sp->block_tokens};
        rc = KVS_EINVAL;
        if (oracle.unit_blocks == 0 || sp->hint_accuracy < 0.5 || sp->hint_accuracy > 1)
            goto out;
        rc = KVS_ENOMEM;
        prio = malloc((max_blocks + 1) * sizeof(*prio));
        if (!prio)
            goto out;
    }
    for (uint32_t k = 0; k < sp->capacity; k++)
        pool.ids[k] = sp->capacity - 1 - k;
    pool.n = sp->capacity;
    pool.capacity = sp->capacity;
    radix_config_t cfg = {.block_tokens = sp->block_tokens,
                          .max_blocks = sp->capacity,
                          .on_evict = pool_put,
                          .evict_ctx = &pool,
                          .policy = sp->policy,
                          .freq_max_hits = sp->freq_max_hits,
                          .freq_bonus_pct = sp->freq_bonus_pct,
                          .freq_bonus_ticks = sp->freq_bonus_ticks,
                          .freq_horizon_pct = sp->freq_horizon_pct,
                          .tier2_blocks = sp->tier2,
                          .tier3_blocks = sp->tier2 ? sp->tier3 : 0};
    rc = radix_new(&cfg, &t);
    if (rc)
        goto out;
    uint32_t ns;
    rc = radix_ns_create(t, "trace", 0x6b767368617265ull, 0, 0, &ns);
    if (rc)
        goto out;
    uint64_t t0 = (uint64_t)now_ns();
    for (size_t r = 0; r < tr->n_reqs; r++) {
        const trace_req_t *req = &tr->reqs[r];
        size_t n_tokens = trace_prompt_tokens(tr, req);
        size_t want = n_tokens / sp->block_tokens, hit = 0, done = 0, evicted = 0;
        trace_expand(tr, req, tokens);
        if (hints && (rc = radix_expire_hints(t, r, NULL)) != 0)
            goto out;
        rc = radix_lookup(t, ns, tokens, n_tokens, true, ids, want, &hit);
        if (rc)
            goto out;
        size_t n_t1 = 0;
        while (n_t1 < hit && ids[n_t1] < sp->capacity)
            n_t1++;
        size_t t3_first = hit; /* where the match goes on into tier 3 */
        while (t3_first > n_t1 && ids[t3_first - 1] >= sp->capacity + sp->tier2)
            t3_first--;
        if (n_t1 < hit) {
            size_t promoted;
            rc = sim_promote(t, ns, ids + n_t1, hit - n_t1, moves, &pool, &promoted);
            if (rc)
                goto out;
            for (size_t k = n_t1 + promoted; k < hit; k++)
                if ((rc = radix_unpin(t, ids[k])) != 0)
                    goto out;
            res->t2_hit_tokens += (uint64_t)promoted * sp->block_tokens;
            if (n_t1 + promoted > t3_first)
                res->t3_hit_tokens += (uint64_t)(n_t1 + promoted - t3_first) * sp->block_tokens;
            hit = n_t1 + promoted;
        }
        res->prompt_tokens += n_tokens;
        res->hit_tokens += (uint64_t)hit * sp->block_tokens;
        size_t missing = want - hit;
        if (missing > pool.n) {
            rc = sp->tier2 ? sim_demote(t, ns, missing - pool.n, moves, &pool)
                           : radix_evict(t, ns, missing - pool.n, &evicted);
            if (rc)
                goto out;
        }
        size_t got = missing < pool.n ? missing : pool.n;
        if (got < missing)
            res->short_requests++;
        for (size_t k = 0; k < got; k++)
            ids[hit + k] = pool.ids[--pool.n];
        rc = radix_insert(t, ns, tokens, n_tokens, ids, hit + got, false, canon, &done);
        if (rc || done != hit + got) {
            rc = rc ? rc : KVS_EINTERNAL;
            goto out;
        }
        for (size_t k = 0; k < hit; k++) {
            rc = radix_unpin(t, ids[k]);
            if (rc)
                goto out;
        }
        /* The engine's hints for the blocks it touched, unit by unit. */
        if (hints) {
            uint64_t horizon;
            sim_oracle_hints(&oracle, r, done, hit, prio, &horizon);
            for (size_t k = 0; k < done; k++) {
                rc = radix_hint(t, canon[k], (uint32_t)prio[k / oracle.unit_blocks],
                                r + horizon + 1);
                if (rc)
                    goto out;
            }
        }
        if (radix_cached_blocks(t) > res->max_cached)
            res->max_cached = radix_cached_blocks(t);
    }
    res->seconds = (double)((uint64_t)now_ns() - t0) / 1e9;
    radix_ns_stats_t st;
    rc = radix_ns_stats(t, ns, &st);
    if (rc)
        goto out;
    res->evicted_blocks = st.evicted_blocks;
    res->demoted_blocks = st.demoted_blocks;
    res->promoted_blocks = st.promoted_blocks;
    res->tier2_dropped = st.tier2_dropped;
    res->requests = tr->n_reqs;
    res->index_bytes = radix_memory_bytes(t);
    if (sp->check && radix_check(t) != 0) {
        rc = KVS_EINTERNAL;
        goto out;
    }
    rc = 0;
out:
    radix_free(t);
    free(tokens);
    free(ids);
    free(canon);
    free(moves);
    free(pool.ids);
    free(own_next);
    free(prio);
    return rc;
}

/* ---- offline optimum ------------------------------------------------------------ */

static void heap_push_u64(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    h[i] = v;
    while (i > 0 && h[(i - 1) / 2] < h[i]) {
        uint64_t tmp = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static uint64_t heap_pop_u64(uint64_t *h, size_t *n)
{
    uint64_t top = h[0];
    h[0] = h[--*n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < *n && h[l] > h[m])
            m = l;
        if (l + 1 < *n && h[l + 1] > h[m])
            m = l + 1;
        if (m == i)
            break;
        uint64_t tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
    return top;
}

int sim_belady(const trace_t *tr, uint32_t capacity, sim_result_t *res)
{
    if (!tr || !res || capacity == 0)
        return KVS_EINVAL;
    memset(res, 0, sizeof(*res));
    int rc = KVS_ENOMEM;
    size_t n_ids = (size_t)tr->max_hash_id + 1;
    uint32_t *next = malloc((tr->n_hash_ids + 1) * sizeof(*next)); /* per occurrence */
    uint32_t *seen = malloc(n_ids * sizeof(*seen));
    uint32_t *cur = malloc(n_ids * sizeof(*cur)); /* next use of a cached id */
    uint8_t *cached = calloc(n_ids, 1);
    uint64_t *heap = malloc((tr->n_hash_ids + 1) * sizeof(*heap));
    size_t heap_n = 0, n_cached = 0;
    if (!next || !seen || !cur || !cached || !heap)
        goto out;
    /* Next use of each occurrence (full blocks only), by a backward pass. */
    for (size_t i = 0; i < n_ids; i++)
        seen[i] = UINT32_MAX;
    for (size_t r = tr->n_reqs; r-- > 0;) {
        const trace_req_t *q = &tr->reqs[r];
        size_t full = trace_prompt_tokens(tr, q) / TRACE_HASH_TOKENS;
        for (size_t k = 0; k < full; k++) {
            uint32_t id = tr->hash_ids[q->first_hash + k];
            next[q->first_hash + k] = seen[id];
            seen[id] = (uint32_t)r;
        }
    }
    for (size_t r = 0; r < tr->n_reqs; r++) {
        const trace_req_t *q = &tr->reqs[r];
        size_t full = trace_prompt_tokens(tr, q) / TRACE_HASH_TOKENS, hit = 0;
        while (hit < full && cached[tr->hash_ids[q->first_hash + hit]])
            hit++;
        res->prompt_tokens += trace_prompt_tokens(tr, q);
        res->hit_tokens += (uint64_t)hit * TRACE_HASH_TOKENS;
        for (size_t k = 0; k < full; k++) {
            uint32_t id = tr->hash_ids[q->first_hash + k];
            if (!cached[id])
                n_cached++;
            cached[id] = 1;
            cur[id] = next[q->first_hash + k];
            heap_push_u64(heap, &heap_n, (uint64_t)cur[id] << 32 | id);
        }
        /* Drop what is needed again the latest (or never). */
        while (n_cached > capacity) {
            uint64_t top = heap_pop_u64(heap, &heap_n);
            uint32_t id = (uint32_t)top, at = (uint32_t)(top >> 32);
            if (cached[id] && cur[id] == at) {
                cached[id] = 0;
                n_cached--;
                res->evicted_blocks++;
            }
        }
        /* Stale entries: rebuild when they dominate. */
        if (heap_n > 4 * (n_cached + 1024)) {
            size_t k = 0;
            for (size_t i = 0; i < heap_n; i++) {
                uint32_t id = (uint32_t)heap[i];
                if (cached[id] && cur[id] == (uint32_t)(heap[i] >> 32))
                    heap[k++] = heap[i];
            }
            heap_n = 0;
            for (size_t i = 0; i < k; i++)
                heap_push_u64(heap, &heap_n, heap[i]);
        }
    }
    res->requests = tr->n_reqs;
    rc = 0;
out:
    free(next);
    free(seen);
    free(cur);
    free(cached);
    free(heap);
    return rc;
}

/* ---- the subcommand ---------------------------------------------------------- */

static const char *policy_name(radix_policy_t p)
{
    return p == RADIX_EVICT_FREQ ? "freq" : "lru";
}

static int parse_policies(const char *s, radix_policy_t *out, size_t *n)
{
    *n = 0;
    if (strcmp(s, "lru") == 0 || strcmp(s, "all") == 0)
        out[(*n)++] = RADIX_EVICT_LRU;
    if (strcmp(s, "freq") == 0 || strcmp(s, "all") == 0)
        out[(*n)++] = RADIX_EVICT_FREQ;
    return *n ? 0 : -1;
}

/* Comma-separated list of positive numbers (or zero too, when zero_ok). */
static int parse_list(const char *s, double *out, size_t max, size_t *n, bool zero_ok)
{
    *n = 0;
    while (*s) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || v < 0 || (v == 0 && !zero_ok) || *n == max)
            return -1;
        out[(*n)++] = v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return *n ? 0 : -1;
}

static void sim_usage(FILE *f)
{
    fprintf(f,
            "usage: kvshare-bench trace-sim --trace FILE [options]\n"
            "  --requests N        first N requests only (default: all)\n"
            "  --block-tokens N    tokens per block (default 16)\n"
            "  --cap-units LIST    capacities in units of the trace's %u-token blocks\n"
            "                      (default: 2.5,5,10,20,40 %% of its distinct ids)\n"
            "  --cap-pct LIST      capacities in percent of the trace's distinct ids\n"
            "  --cap-blocks LIST   capacities in blocks of --block-tokens\n"
            "  --tier2-pct LIST    also a tier 2 (kvshared --host-tier) of these sizes, in\n"
            "                      percent of the distinct ids (0: one tier), next to each\n"
            "                      capacity above (tier 1): blocks are demoted to it\n"
            "                      instead of evicted and promoted back on a hit\n"
            "  --tier2-units LIST  tier-2 sizes in units of %u-token blocks instead\n"
            "  --tier3-units N     also a tier 3 (kvshared's disk tier) of N units below\n"
            "                      every tier 2: tier 2 demotes to it, hits come back\n"
            "  --policy P          lru | freq | all (default all)\n"
            "  --max-hits N        freq: hits that earn a bonus (default %u)\n"
            "  --bonus-pct N       freq: bonus per hit, %% of the mean eviction age (%u)\n"
            "  --bonus-ticks N     freq: fixed bonus per hit in ticks instead\n"
            "  --horizon-pct N|off freq: no bonus while the mean eviction age is past\n"
            "                      N %% of the mean first-reuse gap (%u)\n"
            "  --hint-accuracy LIST  also runs with retention hints from the trace's own\n"
            "                      future, right with these probabilities (0.5 .. 1; 0.5:\n"
            "                      no information): units believed reused within the\n"
            "                      horizon get priority %u for that long, the others %u\n"
            "                      (the model: trace_sim.h, sim_oracle_t)\n"
            "  --hint-seed N       seed of the hints' noise\n"
            "  --hint-knowledge request|unit  the engine knows the future of a whole request\n"
            "                      (default) or of each unit, with probability 2 A - 1\n"
            "  --optimum           also the offline optimum over %u-token ids (opt512)\n"
            "  --check             radix_check() after each run\n"
            "  --json              one JSON object instead of the table\n",
            TRACE_HASH_TOKENS, TRACE_HASH_TOKENS, RADIX_FREQ_MAX_HITS, RADIX_FREQ_BONUS_PCT,
            RADIX_FREQ_HORIZON_PCT, SIM_HINT_KEEP, SIM_HINT_DROP, TRACE_HASH_TOKENS);
}

static size_t distinct_ids(const trace_t *tr)
{
    uint8_t *seen = calloc((size_t)tr->max_hash_id + 1, 1);
    if (!seen)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < tr->n_hash_ids; i++)
        if (!seen[tr->hash_ids[i]]++)
            n++;
    free(seen);
    return n;
}

int bench_trace_sim(int argc, char **argv)
{
    const char *path = NULL;
    sim_params_t sp = {.block_tokens = 16};
    double accs[16];
    size_t n_accs = 0;
    radix_policy_t policies[2] = {RADIX_EVICT_LRU, RADIX_EVICT_FREQ};
    size_t n_policies = 2, n_caps = 0;
    double caps[32], tier2s[16] = {0};
    size_t n_tier2s = 1;
    bool tiers = false, tier2_pct = true;
    double tier3_units = 0;
    enum { CAP_PCT, CAP_UNITS, CAP_BLOCKS } cap_kind = CAP_PCT;
    size_t max_reqs = 0;
    bool json = false, optimum = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            sim_usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
            continue;
        } else if (strcmp(a, "--optimum") == 0) {
            optimum = true;
            continue;
        } else if (strcmp(a, "--check") == 0) {
            sp.check = true;
            continue;
        } else if (!v) {
            ok = false;
        } else if (strcmp(a, "--trace") == 0) {
            path = v;
        } else if (strcmp(a, "--requests") == 0) {
            max_reqs = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--block-tokens") == 0) {
            sp.block_tokens = (uint32_t)strtoul(v, NULL, 0);
            ok = sp.block_tokens > 0 && sp.block_tokens <= 65536;
        } else if (strcmp(a, "--cap-units") == 0 || strcmp(a, "--cap-pct") == 0 ||
                   strcmp(a, "--cap-blocks") == 0) {
            cap_kind = a[6] == 'u' ? CAP_UNITS : a[6] == 'p' ? CAP_PCT : CAP_BLOCKS;
            ok = parse_list(v, caps, 32, &n_caps, false) == 0;
        } else if (strcmp(a, "--tier2-pct") == 0 || strcmp(a, "--tier2-units") == 0) {
            tiers = true;
            tier2_pct = a[8] == 'p';
            ok = parse_list(v, tier2s, 16, &n_tier2s, true) == 0;
        } else if (strcmp(a, "--tier3-units") == 0) {
            tier3_units = strtod(v, NULL);
            ok = tier3_units >= 0;
        } else if (strcmp(a, "--policy") == 0) {
            ok = parse_policies(v, policies, &n_policies) == 0;
        } else if (strcmp(a, "--hint-accuracy") == 0) {
            ok = parse_list(v, accs, 16, &n_accs, false) == 0;
            for (size_t k = 0; ok && k < n_accs; k++)
                ok = accs[k] >= 0.5 && accs[k] <= 1;
        } else if (strcmp(a, "--hint-knowledge") == 0) {
            sp.hint_per_unit = strcmp(v, "unit") == 0;
            ok = sp.hint_per_unit || strcmp(v, "request") == 0;
        } else if (strcmp(a, "--hint-seed") == 0) {
            sp.hint_seed = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--max-hits") == 0) {
            sp.freq_max_hits = (uint32_t)strtoul(v, NULL, 0);
        } else if (strcmp(a, "--bonus-pct") == 0) {
            sp.freq_bonus_pct = (uint32_t)strtoul(v, NULL, 0);
        } else if (strcmp(a, "--bonus-ticks") == 0) {
            sp.freq_bonus_ticks = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--horizon-pct") == 0) {
            sp.freq_horizon_pct =
                strcmp(v, "off") == 0 ? RADIX_FREQ_NO_HORIZON : (uint32_t)strtoul(v, NULL, 0);
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "trace-sim: bad option or value: %s\n", a);
            sim_usage(stderr);
            return 2;
        }
        i++;
    }
    if (!path) {
        fprintf(stderr, "trace-sim: --trace FILE is required\n");
        sim_usage(stderr);
        return 2;
    }
    if (n_caps == 0) {
        const double pct[] = {2.5, 5, 10, 20, 40};
        n_caps = 5;
        memcpy(caps, pct, sizeof(pct));
        cap_kind = CAP_PCT;
    }
    trace_t tr;
    char err[256] = "";
    int rc = trace_load(path, max_reqs, &tr, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "trace-sim: %s (%s)\n", err, kvs_status_text(rc));
        return 1;
    }
    size_t distinct = distinct_ids(&tr);
    size_t *next_use = NULL;
    if (n_accs > 0 && trace_next_uses(&tr, &next_use) != 0) {
        fprintf(stderr, "trace-sim: out of memory for the trace's next uses\n");
        trace_free(&tr);
        return 1;
    }
    sp.next_use = next_use;
    uint64_t unlimited = sim_unlimited_blocks(&tr, sp.block_tokens);
    if (unlimited > UINT32_MAX) {
        fprintf(stderr, "trace-sim: trace too large for 32-bit block ids\n");
        trace_free(&tr);
        return 1;
    }
    /* Unlimited capacity: policy-independent (nothing is evicted). */
    sim_result_t unl;
    sim_params_t usp = sp;
    usp.capacity = (uint32_t)unlimited;
    usp.policy = RADIX_EVICT_LRU;
    rc = sim_run(&tr, &usp, &unl);
    if (rc) {
        fprintf(stderr, "trace-sim: unlimited run failed: %s\n", kvs_status_text(rc));
        trace_free(&tr);
        return 1;
    }
    if (json)
        printf("{\"trace\": \"%s\", \"requests\": %zu, \"distinct_ids\": %zu, "
               "\"block_tokens\": %u, \"prompt_tokens\": %llu, \"unlimited_hit_rate\": %.4f, "
               "\"unlimited_blocks\": %u, \"runs\": [",
               path, tr.n_reqs, distinct, sp.block_tokens, (unsigned long long)unl.prompt_tokens,
               (double)unl.hit_tokens / (double)unl.prompt_tokens, unl.max_cached);
    else {
        printf("trace %s: %zu requests, %zu distinct %u-token ids, %llu prompt tokens\n"
               "block %u tokens; unlimited capacity: hit rate %.2f %% with %u blocks cached\n\n"
               "%12s %10s %12s ",
               path, tr.n_reqs, distinct, TRACE_HASH_TOKENS, (unsigned long long)unl.prompt_tokens,
               sp.block_tokens, 100.0 * (double)unl.hit_tokens / (double)unl.prompt_tokens,
               unl.max_cached, "capacity", "(x512 tok)", "% distinct");
        if (tiers && tier3_units > 0)
            printf("(tier 3 below every tier 2: %.0f units)\n", tier3_units);
        if (tiers)
            printf("%12s %10s ", "tier 2", "(x512 tok)");
        printf("%10s %9s ", "policy", "hit rate");
        if (tiers)
            printf("%10s %10s %10s ", "in tier 2", "demoted", "promoted");
        printf("%10s %8s\n", "evicted", "secs");
    }
    bool first = true;
    for (size_t c = 0; c < n_caps * n_tier2s; c++) {
        double cap = caps[c / n_tier2s], tier2 = tier2s[c % n_tier2s];
        double units = cap_kind == CAP_UNITS ? cap
                       : cap_kind == CAP_PCT ? (double)(uint64_t)(cap / 100.0 * (double)distinct)
                                             : cap * sp.block_tokens / TRACE_HASH_TOKENS;
        double blocks = cap_kind == CAP_BLOCKS ? cap : units * TRACE_HASH_TOKENS / sp.block_tokens;
        double units2 = tier2_pct ? (double)(uint64_t)(tier2 / 100.0 * (double)distinct) : tier2;
        double blocks2 = units2 * TRACE_HASH_TOKENS / sp.block_tokens;
        if (blocks < 1 || blocks + blocks2 > (double)UINT32_MAX) {
            fprintf(stderr, "trace-sim: capacity %g with tier 2 %g out of range\n", cap, tier2);
            rc = KVS_EINVAL;
            break;
        }
        sp.capacity = (uint32_t)blocks;
        sp.tier2 = (uint32_t)blocks2;
        sp.tier3 = (uint32_t)(tier3_units * TRACE_HASH_TOKENS / sp.block_tokens);
        size_t per = 1 + n_accs; /* each policy without hints, then with each accuracy */
        for (size_t p = 0; p < n_policies * per + (optimum ? 1 : 0); p++) {
            sim_result_t res;
            char name[32];
            if (p < n_policies * per) {
                sp.policy = policies[p / per];
                sp.hints = p % per > 0;
                sp.hint_accuracy = sp.hints ? accs[p % per - 1] : 0;
                if (sp.hints)
                    snprintf(name, sizeof(name), "%s+h%.2f", policy_name(sp.policy),
                             sp.hint_accuracy);
                else
                    snprintf(name, sizeof(name), "%s", policy_name(sp.policy));
                rc = sim_run(&tr, &sp, &res);
            } else {
                /* The optimum of one cache as large as both tiers. */
                snprintf(name, sizeof(name), "opt512");
                rc = units + units2 >= 1
                         ? sim_belady(
                               &tr, (uint32_t)(units + units2 + (sp.tier2 ? tier3_units : 0)), &res)
                         : KVS_EINVAL;
            }
            if (rc) {
                fprintf(stderr, "trace-sim: run failed: %s\n", kvs_status_text(rc));
                break;
            }
            double hr = (double)res.hit_tokens / (double)res.prompt_tokens;
            double t2_hr = (double)res.t2_hit_tokens / (double)res.prompt_tokens;
            double pct_d = 100.0 * units / (double)distinct;
            if (json) {
                printf("%s{\"capacity_blocks\": %u, \"capacity_units\": %.1f, \"pct_distinct\": "
                       "%.2f, \"policy\": \"%s\", \"hit_rate\": %.4f, \"evicted\": %llu, "
                       "\"short_requests\": %llu, \"seconds\": %.2f",
                       first ? "" : ", ", sp.capacity, units, pct_d, name, hr,
                       (unsigned long long)res.evicted_blocks,
                       (unsigned long long)res.short_requests, res.seconds);
                if (tiers)
                    printf(", \"tier2_blocks\": %u, \"tier2_units\": %.1f, \"tier2_pct_distinct\": "
                           "%.2f, \"t1_hit_rate\": %.4f, \"t2_hit_rate\": %.4f, \"demoted\": %llu, "
                           "\"promoted\": %llu, \"tier2_dropped\": %llu",
                           sp.tier2, units2, 100.0 * units2 / (double)distinct, hr - t2_hr, t2_hr,
                           (unsigned long long)res.demoted_blocks,
                           (unsigned long long)res.promoted_blocks,
                           (unsigned long long)res.tier2_dropped);
                if (tiers && sp.tier3)
                    printf(", \"tier3_blocks\": %u, \"tier3_units\": %.1f, \"t3_hit_rate\": %.4f",
                           sp.tier3, tier3_units,
                           (double)res.t3_hit_tokens / (double)res.prompt_tokens);
                printf("}");
                first = false;
            } else {
                printf("%12u %10.0f %11.2f%% ", sp.capacity, units, pct_d);
                if (tiers)
                    printf("%12u %10.0f ", sp.tier2, units2);
                printf("%10s %8.2f%% ", name, 100.0 * hr);
                if (tiers)
                    printf("%9.2f%% %10llu %10llu ", 100.0 * t2_hr,
                           (unsigned long long)res.demoted_blocks,
                           (unsigned long long)res.promoted_blocks);
                printf("%10llu %8.2f\n", (unsigned long long)res.evicted_blocks, res.seconds);
            }
            fflush(stdout);
        }
        if (rc)
            break;
    }
    if (json)
        printf("]}\n");
    free(next_use);
    trace_free(&tr);
    return rc ? 1 : 0;
}
