/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup_codec: a hand-written codec for the RPC that runs most, Lookup. Its
 * request is decoded in place (the fields point into the frame; nothing is
 * allocated) and its reply is packed straight into the output buffer, so
 * that a pipelined Lookup costs no pass of protobuf-c's descriptor walk.
 *
 * Both give exactly what protobuf-c gives: the same values from the same
 * bytes, the same bytes for the same reply (tests/daemon/test_lookup_codec.c and
 * the fuzz_lookup_codec target compare them). A request of any other shape (another
 * RPC, an unknown or repeated field, a varint longer than its field needs,
 * a wire type protobuf-c would refuse) is not taken: lookup_decode
 * returns false and the caller decodes the frame with protobuf-c, which
 * answers it, or its error, as before. Old and new clients alike.
 */
#ifndef KVS_DAEMON_LOOKUP_CODEC_H
#define KVS_DAEMON_LOOKUP_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvshare.pb-c.h"

/* A Request { id, lookup: LookupRequest } as it lies in the frame. */
typedef struct lookup_frame {
    uint64_t id;
    const uint8_t *ns; /* not NUL-terminated; "" when absent */
    size_t ns_len;
    const uint8_t *tokens; /* little-endian uint32s, any alignment */
    size_t tokens_len;
    uint32_t wait_ms;
    bool pin;
    bool tier2_in_place;
} lookup_frame_t;

/* Decodes body[0 .. len) when it is a plain Lookup request: fields of the
 * Request and of its LookupRequest known, each at most once, in any order.
 * Returns false for anything else (*out then undefined). */
bool lookup_decode(const uint8_t *body, size_t len, lookup_frame_t *out);

/* Whether lookup_reply_size / lookup_reply_pack take resp: a Response whose rpc
 * is a LookupReply, neither of them carrying unknown fields. */
bool lookup_reply_takes(const Kvshare__Response *resp);

/* The packed size of resp, as protobuf_c_message_get_packed_size. */
size_t lookup_reply_size(const Kvshare__Response *resp);

/* Packs resp into out (lookup_reply_size bytes), as protobuf_c_message_pack.
 * Returns the bytes written. */
size_t lookup_reply_pack(const Kvshare__Response *resp, uint8_t *out);

#endif /* KVS_DAEMON_LOOKUP_CODEC_H */
