/* SPDX-License-Identifier: Apache-2.0 */
#include "wire.h"

#include <string.h>

#include "frame_header.h"
#include "pb_varint.h"

/* Protobuf keys: (field number << 3) | wire type. */
#define KEY_REQUEST_ID      0x08 /* Request.id, varint */
#define KEY_REQUEST_LOOKUP  0x5a /* Request.lookup (11), length-delimited */
#define KEY_LOOKUP_NS       0x0a /* LookupRequest.ns (1), length-delimited */
#define KEY_LOOKUP_TOKENS   0x12 /* LookupRequest.tokens (2), length-delimited */
#define KEY_LOOKUP_PIN      0x18 /* LookupRequest.pin (3), varint */
#define KEY_LOOKUP_WAIT_MS  0x20 /* LookupRequest.wait_ms (4), varint */
#define KEY_LOOKUP_IN_PLACE 0x28 /* LookupRequest.tier2_in_place (5), varint */

int wire_lookup_head(uint8_t *buf, uint64_t id, const char *ns, int pin, uint32_t wait_ms,
                     int tier2_in_place, size_t token_bytes, size_t *head_len)
{
    size_t ns_len = ns ? strlen(ns) : 0;
    /* Fields at their proto3 defaults ("" / false / empty) are left out,
     * as protobuf-c's packer does. */
    uint64_t lookup_len = (ns_len ? 1 + pb_varint_size(ns_len) + ns_len : 0) + (pin ? 2 : 0) +
                          (wait_ms ? 1 + pb_varint_size(wait_ms) : 0) + (tier2_in_place ? 2 : 0) +
                          (token_bytes ? 1 + pb_varint_size(token_bytes) + token_bytes : 0);
    uint64_t request_len =
        (id ? 1 + pb_varint_size(id) : 0) + 1 + pb_varint_size(lookup_len) + lookup_len;
    if (request_len > UINT32_MAX)
        return -1;
    uint8_t *p = buf;
    frame_put_len(p, (uint32_t)request_len);
    p += FRAME_HEADER_BYTES;
    if (id) {
        *p++ = KEY_REQUEST_ID;
        p = pb_put_varint(p, id);
    }
    *p++ = KEY_REQUEST_LOOKUP;
    p = pb_put_varint(p, lookup_len);
    if (ns_len) {
        *p++ = KEY_LOOKUP_NS;
        p = pb_put_varint(p, ns_len);
        memcpy(p, ns, ns_len);
        p += ns_len;
    }
    if (pin) {
        *p++ = KEY_LOOKUP_PIN;
        *p++ = 1;
    }
    if (wait_ms) {
        *p++ = KEY_LOOKUP_WAIT_MS;
        p = pb_put_varint(p, wait_ms);
    }
    if (tier2_in_place) {
        *p++ = KEY_LOOKUP_IN_PLACE;
        *p++ = 1;
    }
    if (token_bytes) {
        *p++ = KEY_LOOKUP_TOKENS;
        p = pb_put_varint(p, token_bytes);
    }
    *head_len = (size_t)(p - buf);
    return 0;
}
