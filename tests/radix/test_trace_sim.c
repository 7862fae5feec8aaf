/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the trace reader and the offline simulator of kvshare-bench
 * (tools/bench/trace.c, trace_sim.c): the parser on good and bad lines, the
 * token expansion, and the simulator on an excerpt of the Mooncake trace
 * (data/, 300 requests), whose unlimited hit rate is checked against an
 * independent count over the trace's hash ids. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "radix.h"
#include "trace.h"
#include "trace_sim.h"
#include "test_tmp.h"

#ifndef KVS_TRACE_FIXTURE
#error "KVS_TRACE_FIXTURE must name the trace excerpt"
#endif

/* Writes text to a new temporary file; returns its path (static buffer). */
static const char *temp_file(const char *text)
{
    static char path[256];
    int fd = test_tmp_file("kvs-trace", path, sizeof(path));
    ck_assert_int_ge(fd, 0);
    size_t len = strlen(text);
    ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

START_TEST(test_parse_good)
{
    const char *path = temp_file(
        "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [5, 6]}\n"
        "\n"
        "  { \"hash_ids\":[5] ,\"extra\": 1, \"input_length\":512,\"timestamp\":1500 }\r\n"
        "{\"timestamp\": 7, \"input_length\": 0, \"hash_ids\": []}");
    trace_t t;
    char err[128] = "";
    ck_assert_int_eq(trace_load(path, 0, &t, err, sizeof(err)), 0);
    ck_assert_uint_eq(t.n_reqs, 3);
    ck_assert_uint_eq(t.n_hash_ids, 3);
    ck_assert_uint_eq(t.max_hash_id, 6);
    ck_assert_uint_eq(t.reqs[0].input_length, 700);
    ck_assert_uint_eq(t.reqs[0].output_length, 5);
    ck_assert_uint_eq(t.reqs[0].n_hash, 2);
    ck_assert_uint_eq(t.reqs[1].timestamp_ms, 1500);
    ck_assert_uint_eq(t.reqs[1].n_hash, 1);
    ck_assert_uint_eq(t.hash_ids[t.reqs[1].first_hash], 5);
    ck_assert_uint_eq(t.reqs[2].n_hash, 0);
    ck_assert_uint_eq(trace_prompt_tokens(&t, &t.reqs[0]), 700);

    /* Expansion: equal ids give equal tokens, other ids other tokens. */
    uint32_t a[1024], b[1024];
    trace_expand(&t, &t.reqs[0], a);
    trace_expand(&t, &t.reqs[1], b);
    ck_assert_int_eq(memcmp(a, b, 512 * sizeof(uint32_t)), 0);
    ck_assert_int_ne(memcmp(a, a + 512, 188 * sizeof(uint32_t)), 0);
    for (int k = 0; k < 700; k++)
        ck_assert_uint_lt(a[k], TRACE_VOCAB);
    trace_free(&t);

    /* max_reqs stops early. */
    ck_assert_int_eq(trace_load(path, 1, &t, err, sizeof(err)), 0);
    ck_assert_uint_eq(t.n_reqs, 1);
    trace_free(&t);
    trace_free(&t); /* twice is harmless */
    unlink(path);
}
END_TEST

START_TEST(test_parse_bad)
{
    static const char *bad[] = {
        "{\"timestamp\": 0, \"input_length\": 5}",                      /* no hash_ids */
        "{\"timestamp\": -1, \"input_length\": 5, \"hash_ids\": [1]}",  /* negative */
        "{\"timestamp\": 0, \"input_length\": 5, \"hash_ids\": [1,]}",  /* trailing comma */
        "{\"timestamp\": 0, \"input_length\": 5, \"hash_ids\": [1]} x", /* text after */
        "[1, 2]",
        "{\"timestamp\": 0, \"input_length\": 99999999999, \"hash_ids\": [1]}",
        "{\"timestamp\": 0, \"input_length\": 5, \"hash_ids\": [1]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[256];
        snprintf(text, sizeof(text),
                 "{\"timestamp\": 0, \"input_length\": 1, \"hash_ids\": [0]}\n%s\n", bad[i]);
        const char *path = temp_file(text);
        trace_t t;
        char err[256] = "";
        ck_assert_int_eq(trace_load(path, 0, &t, err, sizeof(err)), KVS_EINVAL);
        ck_assert_msg(strstr(err, ":2: ") != NULL, "case %zu: err '%s' names no line 2", i, err);
        ck_assert_ptr_null(t.reqs);
        unlink(path);
    }
    trace_t t;
    char err[256] = "";
    ck_assert_int_eq(trace_load("/nonexistent/trace.jsonl", 0, &t, err, sizeof(err)), KVS_EIO);
    ck_assert_ptr_nonnull(strstr(err, "nonexistent"));
}
END_TEST

/* Hit rate with unlimited capacity, counted without the index: hash ids
 * name whole prefixes, so a prompt's b-token block k of id h is cached iff
 * an earlier prompt covered that block of h; max_sub[h] says how many of
 * h's blocks earlier prompts covered. */
static double unlimited_reference(const trace_t *t, uint32_t bt)
{
    uint32_t *max_sub = calloc((size_t)t->max_hash_id + 1, sizeof(*max_sub));
    ck_assert_ptr_nonnull(max_sub);
    uint64_t hit = 0, all = 0;
    for (size_t r = 0; r < t->n_reqs; r++) {
        const trace_req_t *q = &t->reqs[r];
        size_t n = trace_prompt_tokens(t, q);
        all += n;
        bool matching = true;
        for (uint32_t i = 0; i < q->n_hash; i++) {
            size_t left = n > (size_t)i * TRACE_HASH_TOKENS ? n - (size_t)i * TRACE_HASH_TOKENS : 0;
            uint32_t need = (uint32_t)((left < TRACE_HASH_TOKENS ? left : TRACE_HASH_TOKENS) / bt);
            uint32_t *have = &max_sub[t->hash_ids[q->first_hash + i]];
            if (matching) {
                hit += (uint64_t)(*have < need ? *have : need) * bt;
                matching = *have >= need;
            }
            if (need > *have)
                *have = need;
        }
    }
    free(max_sub);
    return (double)hit / (double)all;
}

static trace_t fixture;

static void load_fixture(void)
{
    char err[256] = "";
    ck_assert_msg(trace_load(KVS_TRACE_FIXTURE, 0, &fixture, err, sizeof(err)) == 0, "%s", err);
    ck_assert_uint_eq(fixture.n_reqs, 300);
}

static double run(uint32_t bt, uint32_t capacity, radix_policy_t policy, sim_result_t *res)
{
    sim_params_t sp = {.block_tokens = bt, .capacity = capacity, .policy = policy, .check = true};
    ck_assert_int_eq(sim_run(&fixture, &sp, res), 0);
    ck_assert_uint_eq(res->requests, 300);
    ck_assert_uint_le(res->max_cached, capacity);
    return (double)res->hit_tokens / (double)res->prompt_tokens;
}

START_TEST(test_sim_unlimited)
{
    load_fixture();
    for (uint32_t bt = 16; bt <= 512; bt *= 32) {
        sim_result_t res;
        uint64_t unl = sim_unlimited_blocks(&fixture, bt);
        double hr = run(bt, (uint32_t)unl, RADIX_EVICT_LRU, &res);
        double ref = unlimited_reference(&fixture, bt);
        ck_assert_msg(hr == ref, "bt %u: simulator %.6f, reference %.6f", bt, hr, ref);
        ck_assert_uint_eq(res.evicted_blocks, 0);
        ck_assert(hr > 0.05);
        /* With the capacity it used, nothing changes; the policy neither. */
        sim_result_t again;
        ck_assert(run(bt, res.max_cached, RADIX_EVICT_FREQ, &again) == hr);
        ck_assert_uint_eq(again.evicted_blocks, 0);
    }
    trace_free(&fixture);
}
END_TEST

START_TEST(test_sim_capacity)
{
    load_fixture();
    sim_result_t unl, res;
    double full = run(16, (uint32_t)sim_unlimited_blocks(&fixture, 16), RADIX_EVICT_LRU, &unl);
    for (int p = 0; p < 2; p++) {
        radix_policy_t policy = p ? RADIX_EVICT_FREQ : RADIX_EVICT_LRU;
        double prev = 0;
        /* 1/8, 1/4, 1/2 of what unlimited capacity caches. */
        for (uint32_t div = 8; div >= 2; div /= 2) {
            double hr = run(16, unl.max_cached / div, policy, &res);
            ck_assert_uint_gt(res.evicted_blocks, 0);
            ck_assert_uint_eq(res.short_requests, 0);
            ck_assert(hr < full);
            ck_assert(hr >= prev);
            prev = hr;
        }
        ck_assert(prev > full / 2);
    }
    /* A pool smaller than one prompt: requests get what there is. */
    double tiny = run(16, 64, RADIX_EVICT_LRU, &res);
    ck_assert_uint_gt(res.short_requests, 0);
    ck_assert(tiny < full);
    trace_free(&fixture);
}
END_TEST

/* The simulated engine's hints: at accuracy 1 the truth, at 0.5 a coin as
 * often "keep" for units that are reused as for units that are not, and
 * the same for a request whoever asks (a replay worker draws as trace-sim). */
START_TEST(test_hint_oracle)
{
    load_fixture();
    size_t *next_use = NULL;
    ck_assert_int_eq(trace_next_uses(&fixture, &next_use), 0);
    int prio[256], again[256];
    for (int a = 0; a < 2; a++) {
        sim_oracle_t o = {.tr = &fixture,
                          .next_use = next_use,
                          .accuracy = a ? 0.5 : 1.0,
                          .seed = 7,
                          .capacity = 100000,
                          .unit_blocks = 32};
        uint64_t keep[2] = {0}, units[2] = {0};
        for (size_t r = 0; r < fixture.n_reqs; r++) {
            const trace_req_t *q = &fixture.reqs[r];
            size_t n_blocks = trace_prompt_tokens(&fixture, q) / 16;
            ck_assert_uint_le((n_blocks + 31) / 32, 256);
            sim_oracle_t copy = o;
            uint64_t h, h2;
            sim_oracle_hints(&o, r, n_blocks, 0, prio, &h);
            sim_oracle_hints(&copy, r, n_blocks, 0, again, &h2);
            ck_assert_uint_eq(h, h2);
            ck_assert_uint_ge(h, 1);
            for (size_t u = 0; u < (n_blocks + 31) / 32; u++) {
                size_t next = next_use[q->first_hash + u];
                bool truth = next != SIZE_MAX && next - r <= h;
                ck_assert(prio[u] == SIM_HINT_KEEP || prio[u] == SIM_HINT_DROP);
                ck_assert_int_eq(prio[u], again[u]);
                if (!a)
                    ck_assert_int_eq(prio[u], truth ? SIM_HINT_KEEP : SIM_HINT_DROP);
                units[truth]++;
                keep[truth] += prio[u] == SIM_HINT_KEEP;
            }
        }
        ck_assert_uint_gt(units[0], 500);
        ck_assert_uint_gt(units[1], 500);
        if (a) {
            for (int t = 0; t < 2; t++) {
                double f = (double)keep[t] / (double)units[t];
                ck_assert_msg(f > 0.45 && f < 0.55, "truth %d: kept %.3f", t, f);
            }
        }
    }
    free(next_use);
    trace_free(&fixture);
}
END_TEST

static double run_tiers(uint32_t capacity, uint32_t tier2, sim_result_t *res)
{
    sim_params_t sp = {.block_tokens = 16, .capacity = capacity, .tier2 = tier2, .check = true};
    ck_assert_int_eq(sim_run(&fixture, &sp, res), 0);
    ck_assert_uint_eq(res->requests, 300);
    ck_assert_uint_le(res->max_cached, capacity);
    /* Every tier-2 hit was promoted, and only demoted blocks can be. */
    ck_assert_uint_eq(res->t2_hit_tokens, res->promoted_blocks * 16);
    ck_assert_uint_le(res->promoted_blocks, res->demoted_blocks);
    ck_assert_uint_le(res->tier2_dropped, res->evicted_blocks);
    return (double)res->hit_tokens / (double)res->prompt_tokens;
}

/* A tier 2 large enough to hold everything: nothing is lost, so the hit
 * rate is the unlimited one, to the token, with hits in both tiers. */
START_TEST(test_sim_tier2_holds_all)
{
    load_fixture();
    sim_result_t unl, res;
    double full = run(16, (uint32_t)sim_unlimited_blocks(&fixture, 16), RADIX_EVICT_LRU, &unl);
    for (uint32_t div = 8; div >= 2; div /= 2) {
        double hr = run_tiers(unl.max_cached / div, unl.max_cached, &res);
        ck_assert_msg(hr == full, "tier 1 = 1/%u: %.6f, unlimited %.6f", div, hr, full);
        ck_assert_uint_eq(res.evicted_blocks, 0);
        ck_assert_uint_gt(res.demoted_blocks, 0);
        ck_assert_uint_gt(res.t2_hit_tokens, 0);
        ck_assert_uint_lt(res.t2_hit_tokens, res.hit_tokens);
    }
    trace_free(&fixture);
}
END_TEST

/* Tier 2 smaller and larger than tier 1: more than tier 1 alone, less than
 * unlimited, tier 2 full (drops) and the index consistent at the end. */
START_TEST(test_sim_tier2_sizes)
{
    load_fixture();
    sim_result_t unl, one, res;
    double full = run(16, (uint32_t)sim_unlimited_blocks(&fixture, 16), RADIX_EVICT_LRU, &unl);
    uint32_t t1 = unl.max_cached / 4;
    double alone = run(16, t1, RADIX_EVICT_LRU, &one);
    double prev = alone;
    for (int larger = 0; larger <= 1; larger++) {
        uint32_t t2 = larger ? t1 * 2 : t1 / 2;
        double hr = run_tiers(t1, t2, &res);
        ck_assert_msg(hr > prev && hr < full, "tier 2 %u: %.4f (before %.4f, unlimited %.4f)", t2,
                      hr, prev, full);
        ck_assert_uint_gt(res.tier2_dropped, 0);
        /* Without tier 2 each demotion would have been an eviction. */
        ck_assert_uint_eq(res.demoted_blocks, one.evicted_blocks);
        prev = hr;
    }
    /* A tier 0 run is the one-tier run. */
    ck_assert(run_tiers(t1, 0, &res) == alone);
    ck_assert_uint_eq(res.demoted_blocks, 0);
    ck_assert_uint_eq(res.evicted_blocks, one.evicted_blocks);
    /* A pool smaller than one prompt still runs: requests get what there is. */
    run_tiers(64, 256, &res);
    ck_assert_uint_gt(res.short_requests, 0);
    trace_free(&fixture);
}
END_TEST

static Suite *trace_suite(void)
{
    Suite *s = suite_create("trace_sim");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_parse_good);
    tcase_add_test(tc, test_parse_bad);
    tcase_add_test(tc, test_sim_unlimited);
    tcase_add_test(tc, test_sim_capacity);
    tcase_add_test(tc, test_hint_oracle);
    tcase_add_test(tc, test_sim_tier2_holds_all);
    tcase_add_test(tc, test_sim_tier2_sizes);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(trace_suite)
