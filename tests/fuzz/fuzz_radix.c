/*
 * Fuzz target: sequences of index operations, each run on the radix tree and
 * on the reference model (tests/radix/radix_model.c); every result, every
 * eviction (in order), the namespace counters and the tree's own invariants
 * (radix_check) must agree after each step.
 *
 * Input: byte 0 picks the shape (block tokens 1, 2, 3, 4 or 16; a hash that
 * collides all the time or XXH3; pool size 8..71 blocks); then each step
 * reads an opcode and its arguments from the bytes that follow (zeros once
 * they run out). Token values come from a tiny vocabulary so prompts share
 * prefixes. The test keeps the pins it holds, so unpins are mostly valid and
 * the end of the input can release everything and check that the tree then
 * empties completely.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "radix.h"
#include "radix_model.h"

#define FUZZ_MAX_PROMPT_BLOCKS 8
#define FUZZ_MAX_HELD          1024
#define FUZZ_MAX_STEPS         2000
#define FUZZ_NS                3

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader_t;

static uint32_t next(reader_t *r)
{
    if (r->left == 0)
        return 0;
    r->left--;
    return *r->p++;
}

static uint32_t evicted[1024];
static size_t n_evicted;

static void on_evict(void *ctx, uint32_t block_id)
{
    (void)ctx;
    if (n_evicted < sizeof(evicted) / sizeof(evicted[0]))
        evicted[n_evicted] = block_id;
    n_evicted++;
}

/* Few hash values: most blocks collide, and the token check must sort them out. */
static uint64_t hash_weak(const uint32_t *tokens, size_t n, uint64_t seed)
{
    (void)n;
    return (seed * 31 + tokens[0]) & 3;
}

static long step;

#define SAME(a, b)                                                                                 \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "fuzz_radix: step %ld: %s == %lld but %s == %lld (line %d)\n", step,   \
                    #a, a_, #b, b_, __LINE__);                                                     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t bts[] = {1, 2, 3, 4, 16};
    reader_t r = {data, size};
    uint32_t shape = next(&r);
    uint32_t bt = bts[shape % 5];
    uint32_t max_blocks = 8 + (shape >> 2) % 64;
    radix_config_t cfg = {.block_tokens = bt,
                          .max_blocks = max_blocks,
                          .on_evict = on_evict,
                          .hash = (shape & 0x80) ? hash_weak : NULL};
    radix_tree_t *t = NULL;
    model_t m;
    step = -1;
    SAME(radix_new(&cfg, &t), 0);
    SAME(model_init(&m, bt, max_blocks), 0);
    for (uint32_t k = 0; k < FUZZ_NS; k++) {
        char name[8];
        uint32_t ns;
        snprintf(name, sizeof(name), "ns%u", k);
        SAME(radix_ns_create(t, name, 100 + k, 0, 0, &ns), 0);
        SAME(model_ns_create(&m, 0, 0), ns);
    }

    static uint32_t held[FUZZ_MAX_HELD];
    size_t n_held = 0;
    uint32_t tok[FUZZ_MAX_PROMPT_BLOCKS * 16 + 16];
    uint32_t ids[FUZZ_MAX_PROMPT_BLOCKS], got[FUZZ_MAX_PROMPT_BLOCKS], want[FUZZ_MAX_PROMPT_BLOCKS];

    for (step = 0; r.left > 0 && step < FUZZ_MAX_STEPS; step++) {
        uint32_t op = next(&r);
        uint32_t arg = next(&r);
        /* ns 3 is unknown: errors must agree too. */
        uint32_t ns = arg % 4;
        size_t nb = (arg >> 2) % (FUZZ_MAX_PROMPT_BLOCKS + 1);
        size_t n_tokens = nb * bt + ((arg & 0x80) ? next(&r) % bt : 0);
        /* Tokens: one byte gives four 2-bit tokens, so prompts overlap a lot. */
        uint32_t bits = 0;
        for (size_t k = 0; k < n_tokens; k++) {
            if (k % 4 == 0)
                bits = next(&r);
            tok[k] = (bits >> (2 * (k % 4))) & 3;
        }
        bool pin = (op & 0x10) && n_held + FUZZ_MAX_PROMPT_BLOCKS <= FUZZ_MAX_HELD;
        n_evicted = 0;
        m.n_evicted = 0;
        int rc_t, rc_m;
        switch (op % 6) {
        case 0: { /* lookup */
            size_t max_ids =
                (op & 0x20) ? next(&r) % (FUZZ_MAX_PROMPT_BLOCKS + 1) : FUZZ_MAX_PROMPT_BLOCKS;
            size_t n_t = 77, n_m = 77;
            rc_t = radix_lookup(t, ns, tok, n_tokens, pin, got, max_ids, &n_t);
            rc_m = model_lookup(&m, ns, tok, n_tokens, pin, want, max_ids, &n_m);
            SAME(rc_t, rc_m);
            if (rc_t == 0) {
                SAME(n_t, n_m);
                for (size_t k = 0; k < n_t; k++) {
                    SAME(got[k], want[k]);
                    if (pin)
                        held[n_held++] = got[k];
                }
            }
            break;
        }
        case 1:
        case 2: { /* insert, after making room as the daemon does on a full pool */
            size_t n_ids = (op & 0x20) ? next(&r) % (nb + 1) : nb;
            for (size_t k = 0; k < n_ids; k++)
                ids[k] = next(&r) % (max_blocks + ((op & 0x40) ? 1 : 0));
            if (op & 0x80) {
                uint32_t used = radix_cached_blocks(t);
                if (used + n_ids > max_blocks) {
                    size_t e_t = 77, e_m = 77;
                    SAME(radix_evict(t, ns < FUZZ_NS ? ns : RADIX_NS_ANY, used + n_ids - max_blocks,
                                     &e_t),
                         model_evict(&m, ns < FUZZ_NS ? ns : RADIX_NS_ANY,
                                     used + n_ids - max_blocks, &e_m));
                    SAME(e_t, e_m);
                }
            }
            size_t d_t = 77, d_m = 77;
            rc_t = radix_insert(t, ns, tok, n_tokens, ids, n_ids, pin, got, &d_t);
            rc_m = model_insert(&m, ns, tok, n_tokens, ids, n_ids, pin, want, &d_m);
            SAME(rc_t, rc_m);
            SAME(d_t, d_m);
            for (size_t k = 0; k < d_t; k++) {
                SAME(got[k], want[k]);
                if (pin)
                    held[n_held++] = got[k];
            }
            break;
        }
        case 3: { /* pin a held block again, or any id */
            uint32_t id = n_held && (op & 0x20) ? held[arg % n_held] : arg % (max_blocks + 1);
            rc_t = radix_pin(t, id);
            rc_m = model_pin(&m, id);
            SAME(rc_t, rc_m);
            if (rc_t == 0) {
                if (n_held < FUZZ_MAX_HELD)
                    held[n_held++] = id;
                else
                    SAME(radix_unpin(t, id) | model_unpin(&m, id), 0);
            }
            break;
        }
        case 4: { /* unpin a held pin, or any id */
            bool from_held = n_held > 0 && !(op & 0x20);
            size_t which = from_held ? arg % n_held : 0;
            uint32_t id = from_held ? held[which] : arg % (max_blocks + 1);
            rc_t = radix_unpin(t, id);
            rc_m = model_unpin(&m, id);
            SAME(rc_t, rc_m);
            if (from_held) {
                SAME(rc_t, 0);
                held[which] = held[--n_held];
            } else if (rc_t == 0) {
                for (size_t k = 0; k < n_held; k++)
                    if (held[k] == id) {
                        held[k] = held[--n_held];
                        break;
                    }
            }
            break;
        }
        default: { /* evict, or change a namespace's limits */
            if (op & 0x20) {
                uint32_t q = next(&r) % 24, res = next(&r) % 16;
                rc_t = radix_ns_set_limits(t, ns, q, res);
                rc_m = ns < m.n_ns ? 0 : KVS_ENONS;
                if (rc_m == 0) {
                    m.ns[ns].quota = q;
                    m.ns[ns].reserve = res;
                }
                SAME(rc_t, rc_m);
            } else {
                uint32_t for_ns = (op & 0x40) ? RADIX_NS_ANY : ns;
                size_t n = next(&r) % 8, e_t = 77, e_m = 77;
                rc_t = radix_evict(t, for_ns, n, &e_t);
                rc_m = model_evict(&m, for_ns, n, &e_m);
                SAME(rc_t, rc_m);
                if (rc_t == 0)
                    SAME(e_t, e_m);
            }
            break;
        }
        }
        /* The same evictions, in the same order. */
        SAME(n_evicted, m.n_evicted);
        for (size_t k = 0; k < n_evicted && k < sizeof(evicted) / sizeof(evicted[0]); k++)
            SAME(evicted[k], m.evicted[k]);
        if (radix_check(t) != 0) {
            fprintf(stderr, "fuzz_radix: step %ld: radix_check failed at radix.c line %d\n", step,
                    radix_check_line());
            abort();
        }
        for (uint32_t k = 0; k < FUZZ_NS; k++) {
            radix_ns_stats_t st;
            SAME(radix_ns_stats(t, k, &st), 0);
            SAME(st.cached_blocks, m.ns[k].cached);
            SAME(st.pinned_blocks, m.ns[k].pinned);
            SAME(st.lookups, m.ns[k].lookups);
            SAME(st.hit_tokens, m.ns[k].hit_tokens);
            SAME(st.inserted_blocks, m.ns[k].inserted);
            SAME(st.duplicate_blocks, m.ns[k].duplicates);
            SAME(st.evicted_blocks, m.ns[k].evicted);
            SAME(st.evicted_own, m.ns[k].evicted_own);
            SAME(st.evicted_others, m.ns[k].evicted_others);
            SAME(st.evicted_quota, m.ns[k].evicted_quota);
        }
        for (uint32_t id = 0; id < max_blocks; id++) {
            uint32_t r_t = 0, r_m = 0;
            SAME(radix_block_refcount(t, id, &r_t), model_refcount(&m, id, &r_m));
            SAME(r_t, r_m);
        }
    }

    /* Release every pin: then the whole tree can be evicted. */
    for (size_t k = 0; k < n_held; k++)
        SAME(radix_unpin(t, held[k]), 0);
    SAME(radix_pinned_blocks(t), 0);
    size_t all = 0;
    SAME(radix_evict(t, RADIX_NS_ANY, max_blocks, &all), 0);
    for (uint32_t k = 0; k < FUZZ_NS; k++)
        SAME(radix_evict(t, k, max_blocks, &all), 0);
    SAME(radix_cached_blocks(t), 0);
    SAME(radix_check(t), 0);
    model_fini(&m);
    radix_free(t);
    return 0;
}

void fuzz_cleanup(void)
{
}
