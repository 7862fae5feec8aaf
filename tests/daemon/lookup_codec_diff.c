/* SPDX-License-Identifier: Apache-2.0 */
#include "lookup_codec_diff.h"

#include <stdlib.h>
#include <string.h>

#include "lookup_codec.h"

int lookup_codec_diff_request(const uint8_t *body, size_t len, const char **why)
{
    lookup_frame_t w;
    if (!lookup_decode(body, len, &w))
        return 0;
    Kvshare__Request *r = kvshare__request__unpack(NULL, len, body);
    int rc = -1;
    if (!r)
        *why = "protobuf-c refuses the frame";
    else if (r->rpc_case != KVSHARE__REQUEST__RPC_LOOKUP || !r->lookup)
        *why = "protobuf-c reads another RPC";
    else if (r->base.n_unknown_fields || r->lookup->base.n_unknown_fields)
        *why = "protobuf-c finds unknown fields";
    else if (r->id != w.id)
        *why = "id";
    else if (strlen(r->lookup->ns) != strnlen((const char *)w.ns, w.ns_len) ||
             memcmp(r->lookup->ns, w.ns, strlen(r->lookup->ns)) != 0)
        *why = "ns";
    else if (r->lookup->tokens.len != w.tokens_len ||
             (w.tokens_len && memcmp(r->lookup->tokens.data, w.tokens, w.tokens_len) != 0))
        *why = "tokens";
    else if (!r->lookup->pin != !w.pin)
        *why = "pin";
    else if (r->lookup->wait_ms != w.wait_ms)
        *why = "wait_ms";
    else if (!r->lookup->tier2_in_place != !w.tier2_in_place)
        *why = "tier2_in_place";
    else
        rc = 1;
    if (r)
        kvshare__request__free_unpacked(r, NULL);
    return rc;
}

int lookup_codec_diff_reply(const Kvshare__Response *resp, const char **why)
{
    if (!lookup_reply_takes(resp)) {
        *why = "lookup_reply_takes refuses a Lookup reply";
        return -1;
    }
    size_t want = protobuf_c_message_get_packed_size(&resp->base);
    size_t got = lookup_reply_size(resp);
    if (want != got) {
        *why = "size";
        return -1;
    }
    uint8_t *a = malloc(want ? want : 1), *b = malloc(got ? got : 1);
    int rc = -1;
    if (!a || !b)
        *why = "out of memory";
    else if (protobuf_c_message_pack(&resp->base, a) != want || lookup_reply_pack(resp, b) != got)
        *why = "bytes written";
    else if (memcmp(a, b, want) != 0)
        *why = "bytes";
    else
        rc = 0;
    free(a);
    free(b);
    return rc;
}
