/* SPDX-License-Identifier: Apache-2.0 */
#include "wire.h"

#include <string.h>

#include "frame_header.h"
#include "pb_varint.h"

/* The one-byte tags of the fields written and read here (kvshare.proto). */
#define TAG(field, type) PB_TAG(field, PB_WT_##type)

#define KEY_REQUEST_ID      TAG(1, VARINT) /* Request.id */
#define KEY_REQUEST_LOOKUP  TAG(11, LEN)   /* Request.lookup */
#define KEY_LOOKUP_NS       TAG(1, LEN)    /* LookupRequest.ns */
#define KEY_LOOKUP_TOKENS   TAG(2, LEN)    /* LookupRequest.tokens */
#define KEY_LOOKUP_PIN      TAG(3, VARINT) /* LookupRequest.pin */
#define KEY_LOOKUP_WAIT_MS  TAG(4, VARINT) /* LookupRequest.wait_ms */
#define KEY_LOOKUP_IN_PLACE TAG(5, VARINT) /* LookupRequest.tier2_in_place */

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

/* --- the Lookup reply, read in place --- */

#define RESPONSE_ID     TAG(1, VARINT)
#define RESPONSE_STATUS TAG(2, VARINT)
#define RESPONSE_LOOKUP TAG(11, LEN) /* Response.lookup */

#define REPLY_BLOCK_IDS       TAG(1, LEN)
#define REPLY_HIT_TOKENS      TAG(2, VARINT)
#define REPLY_INFLIGHT_BLOCKS TAG(3, VARINT)
#define REPLY_WAITED          TAG(4, VARINT)
#define REPLY_TIER2_BLOCK_IDS TAG(5, LEN)

/* A packed fixed32 array: whole ids only. */
static bool read_ids(const uint8_t **p, const uint8_t *end, const uint8_t **ids, size_t *n)
{
    size_t len;
    if (!pb_read_len(p, end, ids, &len) || len % 4 != 0)
        return false;
    *n = len / 4;
    return true;
}

static bool decode_reply(const uint8_t *p, const uint8_t *end, wire_lookup_reply_t *out)
{
    unsigned seen = 0;
    while (p < end) {
        uint8_t tag = *p++;
        uint64_t v = 0;
        unsigned bit;
        bool ok;
        switch (tag) {
        case REPLY_BLOCK_IDS:
            bit = 1;
            ok = read_ids(&p, end, &out->block_ids, &out->n_block_ids);
            break;
        case REPLY_HIT_TOKENS:
            bit = 2;
            ok = pb_read_varint(&p, end, 5, &v);
            out->hit_tokens = (uint32_t)v;
            break;
        case REPLY_INFLIGHT_BLOCKS:
            bit = 4;
            ok = pb_read_varint(&p, end, 5, &v);
            out->inflight_blocks = (uint32_t)v;
            break;
        case REPLY_WAITED:
            bit = 8;
            ok = pb_read_varint(&p, end, 5, &v);
            out->waited = v != 0;
            break;
        case REPLY_TIER2_BLOCK_IDS:
            bit = 16;
            ok = read_ids(&p, end, &out->tier2_block_ids, &out->n_tier2_block_ids);
            break;
        default:
            return false; /* unknown, or a known field of another wire type */
        }
        /* Repeated: protobuf-c keeps the last scalar and joins the arrays. */
        if (!ok || (seen & bit))
            return false;
        seen |= bit;
    }
    return true;
}

bool wire_lookup_reply_decode(const uint8_t *body, size_t len, wire_lookup_reply_t *out)
{
    const uint8_t *p = body, *end = body + len;
    const uint8_t *lookup = NULL;
    size_t lookup_len = 0;
    bool have_id = false, have_status = false;

    memset(out, 0, sizeof(*out));
    while (p < end) {
        uint8_t tag = *p++;
        uint64_t v;
        if (tag == RESPONSE_ID && !have_id) {
            if (!pb_read_varint(&p, end, 10, &out->id))
                return false;
            have_id = true;
        } else if (tag == RESPONSE_STATUS && !have_status) {
            /* An error's status (and its message) is protobuf-c's to read. */
            if (!pb_read_varint(&p, end, 5, &v) || (uint32_t)v != 0)
                return false;
            have_status = true;
        } else if (tag == RESPONSE_LOOKUP && !lookup) {
            if (!pb_read_len(&p, end, &lookup, &lookup_len))
                return false;
        } else {
            return false;
        }
    }
    return lookup && decode_reply(lookup, lookup + lookup_len, out);
}
