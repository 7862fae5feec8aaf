/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire: hand-encoded request frames for the calls that carry a prompt, so
 * the token array goes to the socket straight from the caller's memory
 * (sendmsg with two iovecs) instead of being copied by protobuf-c's packer.
 * The bytes are a valid kvshare Request (proto/kvshare.proto); the daemon
 * decodes a plain Lookup by hand (daemon/core/lookup_codec.h), the rest with
 * protobuf-c. Internal to libkvshare.
 */
#ifndef KVS_CLIENT_WIRE_H
#define KVS_CLIENT_WIRE_H

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

#endif /* KVS_CLIENT_WIRE_H */
