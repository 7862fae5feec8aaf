// SPDX-License-Identifier: Apache-2.0
//
// The block copy kernel: one launch copies the rows (K and V slots per layer)
// of many blocks, the contract of gather.h. Built by nvcc into a fatbin that
// the library embeds and loads with cuModuleLoadData; no CUDA runtime calls.
#include "gather.h"

// The op owning unit u: ops are sorted by unit0, the first at 0.
__device__ static uint32_t find_op(const gather_op_t *ops, uint32_t n_ops, uint64_t u)
{
    uint32_t lo = 0, hi = n_ops;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ops[mid].unit0 <= u)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
    kvs_gather(const gather_op_t *ops, uint32_t n_ops, uint64_t n_units)
{
    for (uint64_t u = blockIdx.x; u < n_units; u += gridDim.x) {
        const gather_op_t *op = &ops[find_op(ops, n_ops, u)];
        uint64_t local = u - op->unit0;
        uint64_t row = local / op->units_per_row;
        uint64_t begin = (local % op->units_per_row) * GATHER_CHUNK;
        uint64_t end = begin + GATHER_CHUNK < op->width ? begin + GATHER_CHUNK : op->width;
        char *dst = (char *)(op->dst + row * op->dst_pitch);
        const char *src = (const char *)(op->src + row * op->src_pitch);
        if (op->vec16) {
            uint4 *d = (uint4 *)(dst + begin);
            const uint4 *s = (const uint4 *)(src + begin);
            uint64_t n = (end - begin) / 16;
            for (uint64_t i = threadIdx.x; i < n; i += blockDim.x)
                d[i] = s[i];
        } else {
            for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
                dst[i] = src[i];
        }
    }
}
