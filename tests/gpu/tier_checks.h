/* SPDX-License-Identifier: Apache-2.0 */
/* Checks that every backend must pass the same way (host and cuda). */
#ifndef KVS_TESTS_TIER_CHECKS_H
#define KVS_TESTS_TIER_CHECKS_H

#include <stdint.h>

#include "backend.h"
#include "geometry.h"

/* Tier 2 on an open backend b whose pool holds num_blocks (>= 8) blocks of
 * g: blocks go to the tier and back (the tier laid out by geometry_offset
 * with its own block count, so both pitches differ), the tier maps through
 * its exported fd, and bad ids are refused. Opens b's tier; asserts. */
void check_tier_round_trip(backend_t *b, const geometry_t *g, uint32_t num_blocks);

#endif
