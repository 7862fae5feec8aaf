/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Protocol Buffers' base-128 varints, for the frames written by hand (the
 * client's Lookup head, the daemon's Lookup reply): the size of one and
 * writing one.
 */
#ifndef KVS_PB_VARINT_H
#define KVS_PB_VARINT_H

#include <stddef.h>
#include <stdint.h>

static inline size_t pb_varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v at p; returns the byte after it. */
static inline uint8_t *pb_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

#endif /* KVS_PB_VARINT_H */
