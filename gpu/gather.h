/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gather contract: what one launch of the copy kernel (gather.cu) does,
 * shared by the backend that fills it, the kernel, and the stand-in driver's
 * CPU version of it (tests/gpu/fake_cuda.c), so that the three agree.
 *
 *   op i: height rows of width bytes, row r from src + r * src_pitch to
 *         dst + r * dst_pitch, all device addresses (pool memory, or pinned
 *         host memory mapped into the device's address space).
 *   units: each row is cut into chunks of at most GATHER_CHUNK bytes; op i
 *         owns units [ops[i].unit0, ops[i].unit0 + height * ceil(width /
 *         GATHER_CHUNK)), ops sorted by unit0, the first at 0; n_units is
 *         the total. A thread block copies one unit at a time, so one launch
 *         spreads the pieces of many blocks over the whole device.
 *
 * Kernel: kvs_gather(const gather_op_t *ops, uint32_t n_ops, uint64_t n_units),
 * block GATHER_THREADS threads, any grid size (it strides over the units).
 * Ranges of one launch must not overlap (the backend checks this first).
 * An op whose addresses, pitches and width are all multiples of 16 is copied
 * 16 bytes per load (vec16 = 1); any other byte by byte.
 */
#ifndef KVS_GATHER_H
#define KVS_GATHER_H

#include <stdint.h>

#define GATHER_CHUNK   (32u << 10)
#define GATHER_THREADS 256u
#define GATHER_KERNEL  "kvs_gather"

typedef struct gather_op {
    uint64_t dst, src;
    uint64_t width, height, dst_pitch, src_pitch;
    uint64_t unit0; /* first unit of this op */
    uint32_t units_per_row;
    uint32_t vec16;
} gather_op_t;

#endif /* KVS_GATHER_H */
