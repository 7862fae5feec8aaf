/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The frame header of the wire protocol, written and read in one place.
 *
 *     +----------------+---------------------------+
 *     | length (4, LE) | protobuf message (length) |   ... next frame
 *     +----------------+---------------------------+
 *
 * Every program that speaks the protocol (the daemon, libkvshare, the bench,
 * the tests) encodes and decodes the length with these two functions.
 */
#ifndef KVS_COMMON_FRAME_HEADER_H
#define KVS_COMMON_FRAME_HEADER_H

#include <stdint.h>

#define FRAME_HEADER_BYTES 4

/* The body length in the header at p (FRAME_HEADER_BYTES readable bytes). */
static inline uint32_t frame_get_len(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Writes the header of a frame whose body is len bytes at p. */
static inline void frame_put_len(uint8_t *p, uint32_t len)
{
    p[0] = (uint8_t)len;
    p[1] = (uint8_t)(len >> 8);
    p[2] = (uint8_t)(len >> 16);
    p[3] = (uint8_t)(len >> 24);
}

#endif /* KVS_COMMON_FRAME_HEADER_H */
