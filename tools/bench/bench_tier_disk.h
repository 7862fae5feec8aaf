/* SPDX-License-Identifier: Apache-2.0 */
/* kvshare-bench tier-copy --disk: the disk tier against fio (bench_tier_disk.c). */
#ifndef KVS_BENCH_TIER_DISK_H
#define KVS_BENCH_TIER_DISK_H

#include <stdbool.h>
#include <stdint.h>

typedef struct bench_tier_disk_args {
    const char *dir;       /* the file system measured */
    uint64_t block_bytes;  /* one block of the model */
    uint32_t block_tokens; /* its tokens */
    uint32_t blocks;       /* blocks per batch */
    uint32_t rounds;
    uint32_t qd;    /* queue depth, both */
    bool threads;   /* the tier on its thread fallback (fio on psync) */
    bool unaligned; /* blocks 64 bytes off a page: the tier copies them */
    bool daemon;    /* as kvshared: writes gathered (fill), reads drained */
} bench_tier_disk_args_t;

/* Runs the comparison and prints it. Returns the exit status. */
int bench_tier_disk(const bench_tier_disk_args_t *a);

#endif
