/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Protocol Buffers' base-128 varints, for the frames written and read by
 * hand (the Lookup's request and reply, client/wire.h and
 * daemon/core/lookup_codec.h): a field's one-byte tag, the size of a varint,
 * writing one, and reading a varint or a length-delimited field.
 */
#ifndef KVS_PB_VARINT_H
#define KVS_PB_VARINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Wire types, and the one-byte tag (field << 3 | type) of a field under 16. */
enum { PB_WT_VARINT = 0, PB_WT_LEN = 2 };
#define PB_TAG(field, type) ((uint8_t)((field) << 3 | (type)))

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

/* Reads a varint of at most max_bytes bytes at *p (before end) into *v,
 * moving *p past it; false when it is longer or cut short. 5 bytes take
 * every bit of a 32-bit field, a bool or an enum, and none that
 * protobuf-c would read differently; 10 a 64-bit one. */
static inline bool pb_read_varint(const uint8_t **p, const uint8_t *end, unsigned max_bytes,
                                  uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < max_bytes && *p < end; i++) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* Reads a length-delimited field's bytes: its length (a varint of at most
 * 5 bytes, as protobuf-c reads it) and the bytes, which must lie before
 * end. */
static inline bool pb_read_len(const uint8_t **p, const uint8_t *end, const uint8_t **data,
                               size_t *len)
{
    uint64_t n;
    if (!pb_read_varint(p, end, 5, &n) || n > (uint64_t)(end - *p))
        return false;
    *data = *p;
    *len = (size_t)n;
    *p += n;
    return true;
}

#endif /* KVS_PB_VARINT_H */
