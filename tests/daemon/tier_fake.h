/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier_fake: a tier medium for tests (tier_medium.h). It wraps another
 * medium (the host tier, which does the copies) and, on demand, delays
 * each batch on a loop timer and fails batches: a failed batch copies
 * nothing and reports KVS_EIO, not fatal, as a disk or a remote store
 * would. It shows what adding a tier takes: one file filling
 * tier_medium_ops_t.
 */
#ifndef KVS_TESTS_TIER_FAKE_H
#define KVS_TESTS_TIER_FAKE_H

#include <stdint.h>
#include <uv.h>

#include "tier_medium.h"

typedef struct tier_fake_knobs {
    uint32_t delay_ms;  /* each batch waits this long on the loop first */
    uint32_t fail_next; /* so many of the next batches fail */
    uint32_t batches;   /* batches started */
    uint32_t failed;    /* batches failed */
    uint32_t dropped;   /* slots dropped */
} tier_fake_knobs_t;

/* A medium over inner (which it closes), driven by *knobs (the caller's,
 * alive as long as the medium). Errors: KVS_ENOMEM. */
int tier_fake_open(uv_loop_t *loop, tier_medium_t *inner, tier_fake_knobs_t *knobs,
                   tier_medium_t **out);

#endif /* KVS_TESTS_TIER_FAKE_H */
