/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the radix suites share: a seeded xorshift for random operations that
 * replay the same on every run, and the smaller sizes valgrind runs with.
 */
#ifndef KVS_TEST_RADIX_TEST_RNG_H
#define KVS_TEST_RADIX_TEST_RNG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state;

/* Under valgrind (KVS_TEST_SMALL): a smaller index. */
static inline bool small(void)
{
    return getenv("KVS_TEST_SMALL") != NULL;
}

/* The next value in [0, n) of the xorshift seeded through rng_state. */
static inline uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

#endif /* KVS_TEST_RADIX_TEST_RNG_H */
