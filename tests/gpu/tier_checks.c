/* SPDX-License-Identifier: Apache-2.0 */
#include "tier_checks.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "kvshare_status.h"

enum { TIER_BLOCKS = 5 };

static void fill(uint8_t *buf, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)((i * 139u + seed * 11u + 3u) & 0xff);
}

/* Block i's pattern for layer l, K or V. */
static uint32_t seed_of(uint32_t block, uint32_t l, uint32_t kv)
{
    return block * 64 + l * 2 + kv;
}

void check_tier_round_trip(backend_t *b, const geometry_t *g, uint32_t num_blocks)
{
    uint64_t slot = geometry_slot_bytes(g);
    const uint32_t one[1] = {0};
    ck_assert_int_eq(
        backend_tier_copy(b, g, num_blocks, TIER_BLOCKS, BACKEND_TO_TIER, one, one, 1, NULL),
        KVS_EINVAL);
    char err[256] = "";
    ck_assert_int_eq(backend_tier_open(b, 0, err, sizeof(err)), KVS_EINVAL);
    int rc = backend_tier_open(b, TIER_BLOCKS * geometry_block_bytes(g), err, sizeof(err));
    ck_assert_msg(rc == 0, "backend_tier_open: %d: %s", rc, err);
    ck_assert_int_eq(backend_tier_open(b, 4096, err, sizeof(err)), KVS_EINVAL);
    ck_assert_uint_ge(backend_tier_size(b), TIER_BLOCKS * geometry_block_bytes(g));
    uint8_t *want = malloc(slot), *got = malloc(slot), *zero = calloc(1, slot);
    ck_assert(want && got && zero);
    const uint32_t pool[3] = {1, 2, 3}, tier[3] = {4, 0, 2}, back[3] = {5, 6, 7};
    for (int i = 0; i < 3; i++)
        for (uint32_t l = 0; l < g->layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                fill(want, slot, seed_of(pool[i], l, kv));
                ck_assert_int_eq(
                    backend_write(b, geometry_offset(g, num_blocks, l, kv, pool[i]), want, slot),
                    0);
            }
    double ms = -1;
    ck_assert_int_eq(
        backend_tier_copy(b, g, num_blocks, TIER_BLOCKS, BACKEND_TO_TIER, pool, tier, 3, &ms), 0);
    ck_assert(ms >= 0);
    const uint8_t *t2 = (const uint8_t *)backend_tier_base(b);
    for (int i = 0; i < 3; i++)
        for (uint32_t l = 0; l < g->layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                fill(want, slot, seed_of(pool[i], l, kv));
                ck_assert_int_eq(
                    memcmp(t2 + geometry_offset(g, TIER_BLOCKS, l, kv, tier[i]), want, slot), 0);
                ck_assert_int_eq(
                    backend_write(b, geometry_offset(g, num_blocks, l, kv, pool[i]), zero, slot),
                    0);
            }
    /* tier block 1 and 3 untouched */
    ck_assert_int_eq(memcmp(t2 + geometry_offset(g, TIER_BLOCKS, 0, 0, 1), zero, slot), 0);
    ck_assert_int_eq(memcmp(t2 + geometry_offset(g, TIER_BLOCKS, 0, 1, 3), zero, slot), 0);
    ck_assert_int_eq(
        backend_tier_copy(b, g, num_blocks, TIER_BLOCKS, BACKEND_FROM_TIER, back, tier, 3, NULL),
        0);
    for (int i = 0; i < 3; i++)
        for (uint32_t l = 0; l < g->layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                fill(want, slot, seed_of(pool[i], l, kv));
                ck_assert_int_eq(
                    backend_read(b, geometry_offset(g, num_blocks, l, kv, back[i]), got, slot), 0);
                ck_assert_int_eq(memcmp(got, want, slot), 0);
            }
    /* An importer maps tier 2 for reading (it is sealed against writes:
     * no writable mapping of it can be made but the backend's own). */
    backend_desc_t desc;
    backend_tier_describe(b, &desc);
    int fd = -1;
    ck_assert_int_eq(backend_tier_export(b, &fd, err, sizeof(err)), 0);
    backend_mapping_t *m = NULL;
    ck_assert_int_eq(backend_import(&desc, &fd, 1, &m, err, sizeof(err)), KVS_EIO);
    ck_assert_int_eq(backend_tier_export(b, &fd, err, sizeof(err)), 0);
    rc = backend_tier_import(fd, desc.size, &m, err, sizeof(err));
    ck_assert_msg(rc == 0, "backend_tier_import: %d: %s", rc, err);
    fill(want, slot, seed_of(pool[0], 0, 1));
    ck_assert_int_eq(memcmp((const uint8_t *)backend_mapping_base(m) +
                                geometry_offset(g, TIER_BLOCKS, 0, 1, tier[0]),
                            want, slot),
                     0);
    backend_unmap(m);
    /* Refused whole: a tier id or pool id out of range, a layout beyond the tier. */
    const uint32_t bad_tier[2] = {1, TIER_BLOCKS}, bad_pool[2] = {5, num_blocks};
    ck_assert_int_eq(
        backend_tier_copy(b, g, num_blocks, TIER_BLOCKS, BACKEND_TO_TIER, pool, bad_tier, 2, NULL),
        KVS_EINVAL);
    ck_assert_int_eq(backend_tier_copy(b, g, num_blocks, TIER_BLOCKS, BACKEND_FROM_TIER, bad_pool,
                                       tier, 2, NULL),
                     KVS_EINVAL);
    ck_assert_int_eq(backend_tier_copy(b, g, num_blocks, TIER_BLOCKS * 100, BACKEND_TO_TIER, pool,
                                       tier, 1, NULL),
                     KVS_EINVAL);
    ck_assert_int_eq(memcmp(t2 + geometry_offset(g, TIER_BLOCKS, 0, 0, 1), zero, slot), 0);
    free(want);
    free(got);
    free(zero);
}
