/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire: hand-encoded request frames for the calls that carry a prompt, so
 * the token array goes to the socket straight from the caller's memory
 * (sendmsg with two iovecs) instead of being copied by protobuf-c's packer,
 * and the Lookup's reply read in place, without protobuf-c's allocations.
 * The bytes are a valid kvshare Request (proto/kvshare.proto); the daemon
 * decodes a plain Lookup by hand (daemon/core/lookup_codec.h), the rest with
 * protobuf-c. Internal to libkvshare.
 */
#ifndef KVS_CLIENT_WIRE_H
#define KVS_CLIENT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame_header.h"

/* Room wire_lookup_head needs for a namespace of ns_len bytes. */
#define WIRE_LOOKUP_HEAD_MAX(ns_len)                                                               \
    (FRAME_HEADER_BYTES + 11 + 1 + 10 + 1 + 10 + (ns_len) + 2 + 6 + 2 + 1 + 10)

/* Writes the frame header and every byte of a Lookup Request before the
 * token bytes (which follow as the last field): *head_len bytes into buf
 * (at least WIRE_LOOKUP_HEAD_MAX(strlen(ns)) of room). The whole frame is
 * *head_len + token_bytes bytes. Returns 0, or -1 when the frame would not
 * fit a 32-bit length. */
int wire_lookup_head(uint8_t *buf, uint64_t id, const char *ns, int pin, uint32_t wait_ms,
                     int tier2_in_place, size_t token_bytes, size_t *head_len);

/* A successful Lookup reply as it lies in the frame: the block id arrays
 * point into it (little-endian uint32s, any alignment). */
typedef struct wire_lookup_reply {
    uint64_t id;
    const uint8_t *block_ids;
    size_t n_block_ids;
    const uint8_t *tier2_block_ids;
    size_t n_tier2_block_ids;
    uint32_t hit_tokens;
    uint32_t inflight_blocks;
    bool waited;
} wire_lookup_reply_t;

/* Reads body[0 .. len) in place when it is a plain successful Lookup
 * reply: a Response of an id, a status of 0 if any, and a LookupReply, no
 * message, every field known, at most once, the id arrays packed. Returns
 * false for anything else (*out then undefined): the caller reads such a
 * frame with protobuf-c, which takes every shape the wire allows. What it
 * takes, protobuf-c reads as the same values (tests/client/test_client.c,
 * the fuzz_lookup_codec target). */
bool wire_lookup_reply_decode(const uint8_t *body, size_t len, wire_lookup_reply_t *out);

/* The i-th id of an array that wire_lookup_reply_decode points to. */
static inline uint32_t wire_id_at(const uint8_t *ids, size_t i)
{
    const uint8_t *p = ids + 4 * i;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif /* KVS_CLIENT_WIRE_H */
