/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target: sequences of index operations, each run on the radix tree and
 * on the reference model (tests/radix/radix_model.c) by the step the unit
 * test uses too (tests/radix/radix_diff.c): every result, every eviction (in
 * order), every demotion's moves, the namespace counters of both tiers,
 * every refcount and priority and the tree's own invariants (radix_check)
 * must agree after each step.
 *
 * Input: byte 0 picks the shape (block tokens 1, 2, 3, 4 or 16; a hash that
 * collides all the time or XXH3; pool size 8..71 blocks), byte 1 the tier 2
 * (none, or smaller than, as large as or larger than the pool) and, with a
 * tier 2 and bit 6 set, a tier 3 below it (1 to 3 pools); then each
 * step reads an opcode and its arguments from the bytes that follow (zeros
 * once they run out). The opcode's low 3 bits pick the operation, its high
 * bits its variants. Token values come from a tiny vocabulary so prompts
 * share prefixes. With a tier 2 the steps also demote, promote (a pinned
 * lookup whose tier-2 blocks move back to tier-1 ids from the input) and end
 * copies, pin, hint and unpin tier-2 ids, and inserts make room by demoting;
 * tier 2 drops its own leaves when full (or, with a tier 3, moves them
 * there, and tier 3 drops its leaves). Without one the tier steps must fail
 * alike. The test keeps the pins it holds and the copies in flight, so
 * unpins and copy ends are mostly valid and the end of the input can end
 * every copy, release everything and check that both tiers then empty.
 *
 * KVS_FUZZ_VERBOSE=1 prints, per input, what the tier steps reached.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "radix.h"
#include "radix_diff.h"

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

/* Few hash values: most blocks collide, and the token check must sort them out. */
static uint64_t hash_weak(const uint32_t *tokens, size_t n, uint64_t seed)
{
    (void)n;
    return (seed * 31 + tokens[0]) & 3;
}

static radix_diff_t diff;

static void check(int rc)
{
    if (rc != 0) {
        fprintf(stderr, "fuzz_radix: %s\n", diff.err);
        abort();
    }
}

/* Tier 2 from byte 1: none, smaller than the pool, as large, or larger. */
static uint32_t tier2_size(uint32_t b, uint32_t max_blocks)
{
    switch (b % 4) {
    case 0:
        return 0;
    case 1:
        return 1 + (b >> 2) % (max_blocks - 1);
    case 2:
        return max_blocks;
    default:
        return max_blocks + 1 + (b >> 2) % (2 * max_blocks);
    }
}

static void report(const radix_diff_t *d)
{
    uint64_t demoted = 0, promoted = 0, dropped = 0, t2_hits = 0, demoted3 = 0, t3_hits = 0;
    for (uint32_t k = 0; k < d->n_ns; k++) {
        demoted += d->m.ns[k].demoted;
        promoted += d->m.ns[k].promoted;
        dropped += d->m.ns[k].t2_dropped;
        t2_hits += d->m.ns[k].t2_hit_tokens;
        demoted3 += d->m.ns[k].demoted3;
        t3_hits += d->m.ns[k].t3_hit_tokens;
    }
    if (d->t3_blocks)
        fprintf(stderr, "fuzz_radix: tier 3 %u: demoted there %llu, hit tokens there %llu\n",
                d->t3_blocks, (unsigned long long)demoted3, (unsigned long long)t3_hits);
    fprintf(stderr,
            "fuzz_radix: pool %u, tier 2 %u, %ld steps: demoted %llu, promoted %llu, copies "
            "done %llu, tier-2 drops %llu, tier-2 hit tokens %llu\n",
            d->max_blocks, d->t2_blocks, d->step, (unsigned long long)demoted,
            (unsigned long long)promoted, (unsigned long long)d->copies_done,
            (unsigned long long)dropped, (unsigned long long)t2_hits);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t bts[] = {1, 2, 3, 4, 16};
    static const char *const names[FUZZ_NS] = {"ns0", "ns1", "ns2"};
    static const uint32_t zero[FUZZ_NS] = {0, 0, 0};
    reader_t r = {data, size};
    uint32_t shape = next(&r);
    uint32_t bt = bts[shape % 5];
    uint32_t max_blocks = 8 + (shape >> 2) % 64;
    uint32_t tiers = next(&r);
    uint32_t t2_blocks = tier2_size(tiers, max_blocks);
    uint32_t t3_blocks = t2_blocks && (tiers & 0x40) ? 1 + (tiers * 7) % (3 * max_blocks) : 0;
    uint32_t n_all = max_blocks + t2_blocks + t3_blocks;
    radix_config_t cfg = {.block_tokens = bt,
                          .max_blocks = max_blocks,
                          .hash = (shape & 0x80) ? hash_weak : NULL,
                          .tier2_blocks = t2_blocks,
                          .tier3_blocks = t3_blocks};
    radix_diff_t *d = &diff;
    check(radix_diff_init(d, cfg, FUZZ_NS, names, zero, zero, FUZZ_MAX_HELD));
    d->all_refcounts = true;

    uint32_t tok[FUZZ_MAX_PROMPT_BLOCKS * 16 + 16];
    uint32_t ids[FUZZ_MAX_PROMPT_BLOCKS];
    uint64_t clock_now = 1; /* the clock of hint ends */

    for (long step = 0; r.left > 0 && step < FUZZ_MAX_STEPS; step++) {
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
        radix_diff_op_t o = {.ns = ns,
                             .tokens = tok,
                             .n_tokens = n_tokens,
                             .pin = (op & 0x10) && radix_diff_can_pin(d, FUZZ_MAX_PROMPT_BLOCKS)};
        switch (op % 8) {
        case 0:
            o.kind = RADIX_DIFF_LOOKUP;
            o.max_ids =
                (op & 0x20) ? next(&r) % (FUZZ_MAX_PROMPT_BLOCKS + 1) : FUZZ_MAX_PROMPT_BLOCKS;
            break;
        case 1:
        case 2: /* insert, after making room as the daemon does on a full pool */
            o.kind = RADIX_DIFF_INSERT;
            o.n_ids = (op & 0x20) ? next(&r) % (nb + 1) : nb;
            for (size_t k = 0; k < o.n_ids; k++)
                ids[k] = next(&r) % (max_blocks + ((op & 0x40) ? 1 : 0));
            o.ids = ids;
            o.make_room = op & 0x80;
            o.room_ns = ns < FUZZ_NS ? ns : RADIX_NS_ANY;
            break;
        case 3: /* pin a held block again, or any id of either tier */
            o.kind = RADIX_DIFF_PIN;
            o.id = d->n_held && (op & 0x20) ? d->held[arg % d->n_held] : next(&r) % (n_all + 1);
            break;
        case 4: /* unpin a held pin, or any id */
            o.kind = RADIX_DIFF_UNPIN;
            o.from_held = d->n_held > 0 && !(op & 0x20);
            o.held_index = o.from_held ? arg % d->n_held : 0;
            o.id = next(&r) % (n_all + 1);
            break;
        case 5: /* evict, or change a namespace's limits */
            if (op & 0x20) {
                o.kind = RADIX_DIFF_SET_LIMITS;
                o.quota = next(&r) % 24;
                o.reserve = next(&r) % 16;
            } else {
                o.kind = RADIX_DIFF_EVICT;
                o.for_ns = (op & 0x40) ? RADIX_NS_ANY : ns;
                o.n = next(&r) % 8;
            }
            break;
        case 6: /* retention: a hint on a held or any block, hints ending, a default */
            clock_now += next(&r) % 8;
            if ((op & 0x60) == 0x60) {
                o.kind = RADIX_DIFF_SET_PRIORITY;
                o.prio = next(&r) % (RADIX_PRIO_MAX + 1);
                o.prio_cap = next(&r) % (RADIX_PRIO_MAX + 1);
            } else if (op & 0x40) {
                o.kind = RADIX_DIFF_EXPIRE;
                o.now = clock_now;
            } else {
                o.kind = RADIX_DIFF_HINT;
                o.from_held = d->n_held > 0 && (op & 0x20);
                o.held_index = o.from_held ? arg % d->n_held : 0;
                o.id = next(&r) % (n_all + 1);
                o.prio = next(&r) % (RADIX_PRIO_MAX + 2); /* one above the maximum */
                o.until = (op & 0x80) ? clock_now + 1 + next(&r) % 32 : 0;
            }
            break;
        default: /* the tiers: demote, promote, end a copy */
            switch ((op >> 3) % 4) {
            case 0:
                o.kind = RADIX_DIFF_DEMOTE;
                o.for_ns = (op & 0x40) ? RADIX_NS_ANY : ns;
                o.n = (op & 0x80) ? next(&r) % (n_all + 2) : next(&r) % 8;
                break;
            case 1:
                if (!radix_diff_can_pin(d, FUZZ_MAX_PROMPT_BLOCKS))
                    continue;
                o.kind = RADIX_DIFF_PROMOTE;
                o.max_ids = FUZZ_MAX_PROMPT_BLOCKS;
                o.n_ids = FUZZ_MAX_PROMPT_BLOCKS;
                /* targets: any tier-1 id, the first one out of range now and then */
                for (size_t k = 0; k < o.n_ids; k++)
                    ids[k] = next(&r) % (max_blocks + ((op & 0x40) && k == 0 ? 2 : 0));
                o.ids = ids;
                break;
            default: /* mostly a copy in flight, sometimes any id */
                o.kind = RADIX_DIFF_COPY_DONE;
                o.from_copying = !(op & 0x80);
                o.copy_index = arg;
                o.id = next(&r) % (n_all + 1);
                break;
            }
            break;
        }
        int rc;
        check(radix_diff_step(d, &o, &rc));
    }
    if (getenv("KVS_FUZZ_VERBOSE"))
        report(d);
    /* End every copy and release every pin: then both tiers can empty. */
    check(radix_diff_finish(d));
    return 0;
}

void fuzz_cleanup(void)
{
}
