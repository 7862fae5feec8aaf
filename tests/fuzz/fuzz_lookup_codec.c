/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target: the hand-written Lookup codec (daemon/core/lookup_codec.h) against
 * protobuf-c. The input is a frame's body: whatever lookup_decode
 * takes, protobuf-c must read as the same Lookup. The input also makes a
 * Lookup reply (its bytes as block ids, its first bytes as the scalars),
 * which both packers must write alike, and which libkvshare's reader in
 * place (client/wire.h) must read as protobuf-c does; the input is also
 * read as a reply frame's body by both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "lookup_codec_diff.h"
#include "wire_reply_diff.h"

static uint64_t le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *why = "";
    if (lookup_codec_diff_request(data, size, &why) < 0) {
        fprintf(stderr, "fuzz_lookup_codec: a frame decoded by hand differs from protobuf-c: %s\n",
                why);
        abort();
    }
    if (wire_reply_diff(data, size, &why) < 0) {
        fprintf(stderr, "fuzz_lookup_codec: a reply read in place differs from protobuf-c: %s\n",
                why);
        abort();
    }
    if (size < 16)
        return 0;
    size_t n_ids = (size - 16) / 4;
    uint32_t *ids = malloc(n_ids ? n_ids * sizeof(uint32_t) : 1);
    if (!ids)
        return 0;
    for (size_t i = 0; i < n_ids; i++)
        ids[i] = (uint32_t)le(data + 16 + 4 * i, 4);
    Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
    Kvshare__LookupReply r = KVSHARE__LOOKUP_REPLY__INIT;
    size_t split = n_ids ? data[12] % (n_ids + 1) : 0;
    r.n_block_ids = split;
    r.block_ids = ids;
    r.n_tier2_block_ids = n_ids - split;
    r.tier2_block_ids = ids + split;
    r.hit_tokens = (uint32_t)le(data + 8, 4);
    r.inflight_blocks = data[13] & 1 ? (uint32_t)le(data + 4, 4) : 0;
    r.waited = data[13] & 2;
    resp.id = le(data, 8);
    resp.status = (Kvshare__Status)(int8_t)data[14];
    resp.message = data[15] & 1 ? "a message" : NULL;
    resp.rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
    resp.lookup = &r;
    if (lookup_codec_diff_reply(&resp, &why) != 0) {
        fprintf(stderr, "fuzz_lookup_codec: a reply packed by hand differs from protobuf-c: %s\n",
                why);
        abort();
    }
    /* The reply as the daemon packs it, read back by the client: a success
     * without a message is read in place; any other is left to protobuf-c. */
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    uint8_t *body = malloc(len ? len : 1);
    if (body) {
        protobuf_c_message_pack(&resp.base, body);
        int got = wire_reply_diff(body, len, &why);
        if (got < 0 || (got == 1) != (resp.status == 0 && !resp.message)) {
            fprintf(stderr, "fuzz_lookup_codec: a packed reply read in place: %s\n",
                    got < 0 ? why : "taken when it should not be, or not taken");
            abort();
        }
        free(body);
    }
    free(ids);
    return 0;
}

void fuzz_cleanup(void)
{
}
