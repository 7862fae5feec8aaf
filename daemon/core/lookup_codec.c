/* SPDX-License-Identifier: Apache-2.0 */
#include "lookup_codec.h"

#include <string.h>

#include "pb_varint.h"

/* The one-byte tags of the fields this codec reads and writes
 * (kvshare.proto). */
#define TAG(field, type) PB_TAG(field, PB_WT_##type)

#define REQUEST_ID     TAG(1, VARINT)
#define REQUEST_LOOKUP TAG(KVSHARE__REQUEST__RPC_LOOKUP, LEN)

#define LOOKUP_NS             TAG(1, LEN)
#define LOOKUP_TOKENS         TAG(2, LEN)
#define LOOKUP_PIN            TAG(3, VARINT)
#define LOOKUP_WAIT_MS        TAG(4, VARINT)
#define LOOKUP_TIER2_IN_PLACE TAG(5, VARINT)

#define RESPONSE_ID      TAG(1, VARINT)
#define RESPONSE_STATUS  TAG(2, VARINT)
#define RESPONSE_MESSAGE TAG(3, LEN)
#define RESPONSE_LOOKUP  TAG(KVSHARE__RESPONSE__RPC_LOOKUP, LEN)

#define REPLY_BLOCK_IDS       TAG(1, LEN)
#define REPLY_HIT_TOKENS      TAG(2, VARINT)
#define REPLY_INFLIGHT_BLOCKS TAG(3, VARINT)
#define REPLY_WAITED          TAG(4, VARINT)
#define REPLY_TIER2_BLOCK_IDS TAG(5, LEN)

_Static_assert(KVSHARE__REQUEST__RPC_LOOKUP < 16 && KVSHARE__RESPONSE__RPC_LOOKUP < 16,
               "the lookup field's tag fits one byte");

/* --- decoding --- */

static bool decode_lookup(const uint8_t *p, const uint8_t *end, lookup_frame_t *out)
{
    unsigned seen = 0;
    while (p < end) {
        uint8_t tag = *p++;
        uint64_t v;
        unsigned bit;
        switch (tag) {
        case LOOKUP_NS:
            bit = 1;
            if (!pb_read_len(&p, end, &out->ns, &out->ns_len))
                return false;
            break;
        case LOOKUP_TOKENS:
            bit = 2;
            if (!pb_read_len(&p, end, &out->tokens, &out->tokens_len))
                return false;
            break;
        case LOOKUP_PIN:
            bit = 4;
            if (!pb_read_varint(&p, end, 5, &v))
                return false;
            out->pin = v != 0;
            break;
        case LOOKUP_WAIT_MS:
            bit = 8;
            if (!pb_read_varint(&p, end, 5, &v))
                return false;
            out->wait_ms = (uint32_t)v;
            break;
        case LOOKUP_TIER2_IN_PLACE:
            bit = 16;
            if (!pb_read_varint(&p, end, 5, &v))
                return false;
            out->tier2_in_place = v != 0;
            break;
        default:
            return false; /* unknown, or a known field of another wire type */
        }
        if (seen & bit)
            return false; /* repeated: protobuf-c keeps the last */
        seen |= bit;
    }
    return true;
}

bool lookup_decode(const uint8_t *body, size_t len, lookup_frame_t *out)
{
    const uint8_t *p = body, *end = body + len;
    const uint8_t *lookup = NULL;
    size_t lookup_len = 0;
    bool have_id = false;

    memset(out, 0, sizeof(*out));
    out->ns = (const uint8_t *)"";
    while (p < end) {
        uint8_t tag = *p++;
        if (tag == REQUEST_ID && !have_id) {
            if (!pb_read_varint(&p, end, 10, &out->id))
                return false;
            have_id = true;
        } else if (tag == REQUEST_LOOKUP && !lookup) {
            if (!pb_read_len(&p, end, &lookup, &lookup_len))
                return false;
        } else {
            return false;
        }
    }
    return lookup && decode_lookup(lookup, lookup + lookup_len, out);
}

/* --- encoding --- */

/* An enum travels as an int32: a negative one as its 64-bit two's complement. */
static uint64_t enum_bits(int32_t v)
{
    return (uint64_t)(int64_t)v;
}

static uint8_t *put_fixed32s(uint8_t *p, const uint32_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x = v[i];
        p[0] = (uint8_t)x;
        p[1] = (uint8_t)(x >> 8);
        p[2] = (uint8_t)(x >> 16);
        p[3] = (uint8_t)(x >> 24);
        p += 4;
    }
    return p;
}

bool lookup_reply_takes(const Kvshare__Response *resp)
{
    return resp->rpc_case == KVSHARE__RESPONSE__RPC_LOOKUP && resp->lookup &&
           resp->base.n_unknown_fields == 0 && resp->lookup->base.n_unknown_fields == 0;
}

/* A LookupReply's fields, as proto3 packs them: a zero scalar and an empty
 * repeated field are left out; repeated fixed32 is packed. */
static size_t reply_fields_size(const Kvshare__LookupReply *r)
{
    size_t n = 0;
    if (r->n_block_ids)
        n += 1 + pb_varint_size(4 * (uint64_t)r->n_block_ids) + 4 * r->n_block_ids;
    if (r->hit_tokens)
        n += 1 + pb_varint_size(r->hit_tokens);
    if (r->inflight_blocks)
        n += 1 + pb_varint_size(r->inflight_blocks);
    if (r->waited)
        n += 2;
    if (r->n_tier2_block_ids)
        n += 1 + pb_varint_size(4 * (uint64_t)r->n_tier2_block_ids) + 4 * r->n_tier2_block_ids;
    return n;
}

static bool has_message(const Kvshare__Response *resp)
{
    return resp->message && resp->message[0];
}

size_t lookup_reply_size(const Kvshare__Response *resp)
{
    size_t n = 0;
    if (resp->id)
        n += 1 + pb_varint_size(resp->id);
    if (resp->status)
        n += 1 + pb_varint_size(enum_bits((int32_t)resp->status));
    if (has_message(resp)) {
        size_t len = strlen(resp->message);
        n += 1 + pb_varint_size(len) + len;
    }
    size_t sub = reply_fields_size(resp->lookup);
    return n + 1 + pb_varint_size(sub) + sub;
}

size_t lookup_reply_pack(const Kvshare__Response *resp, uint8_t *out)
{
    uint8_t *p = out;
    if (resp->id) {
        *p++ = RESPONSE_ID;
        p = pb_put_varint(p, resp->id);
    }
    if (resp->status) {
        *p++ = RESPONSE_STATUS;
        p = pb_put_varint(p, enum_bits((int32_t)resp->status));
    }
    if (has_message(resp)) {
        size_t len = strlen(resp->message);
        *p++ = RESPONSE_MESSAGE;
        p = pb_put_varint(p, len);
        memcpy(p, resp->message, len);
        p += len;
    }
    const Kvshare__LookupReply *r = resp->lookup;
    *p++ = RESPONSE_LOOKUP;
    p = pb_put_varint(p, reply_fields_size(r));
    if (r->n_block_ids) {
        *p++ = REPLY_BLOCK_IDS;
        p = pb_put_varint(p, 4 * (uint64_t)r->n_block_ids);
        p = put_fixed32s(p, r->block_ids, r->n_block_ids);
    }
    if (r->hit_tokens) {
        *p++ = REPLY_HIT_TOKENS;
        p = pb_put_varint(p, r->hit_tokens);
    }
    if (r->inflight_blocks) {
        *p++ = REPLY_INFLIGHT_BLOCKS;
        p = pb_put_varint(p, r->inflight_blocks);
    }
    if (r->waited) {
        *p++ = REPLY_WAITED;
        *p++ = 1;
    }
    if (r->n_tier2_block_ids) {
        *p++ = REPLY_TIER2_BLOCK_IDS;
        p = pb_put_varint(p, 4 * (uint64_t)r->n_tier2_block_ids);
        p = put_fixed32s(p, r->tier2_block_ids, r->n_tier2_block_ids);
    }
    return (size_t)(p - out);
}
