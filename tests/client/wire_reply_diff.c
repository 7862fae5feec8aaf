/* SPDX-License-Identifier: Apache-2.0 */
#include "wire_reply_diff.h"

#include "kvshare.pb-c.h"
#include "wire.h"

/* Whether n ids in place equal want[0 .. n). */
static int same_ids(const uint8_t *ids, size_t n, const uint32_t *want, size_t n_want)
{
    if (n != n_want)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (wire_id_at(ids, i) != want[i])
            return 0;
    return 1;
}

int wire_reply_diff(const uint8_t *body, size_t len, const char **why)
{
    wire_lookup_reply_t w;
    if (!wire_lookup_reply_decode(body, len, &w))
        return 0;
    Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
    int rc = -1;
    if (!r)
        *why = "protobuf-c refuses the frame";
    else if (r->rpc_case != KVSHARE__RESPONSE__RPC_LOOKUP || !r->lookup)
        *why = "protobuf-c reads another reply";
    else if (r->base.n_unknown_fields || r->lookup->base.n_unknown_fields)
        *why = "protobuf-c finds unknown fields";
    else if (r->status != 0 || (r->message && r->message[0]))
        *why = "protobuf-c reads an error";
    else if (r->id != w.id)
        *why = "id";
    else if (!same_ids(w.block_ids, w.n_block_ids, r->lookup->block_ids, r->lookup->n_block_ids))
        *why = "block_ids";
    else if (!same_ids(w.tier2_block_ids, w.n_tier2_block_ids, r->lookup->tier2_block_ids,
                       r->lookup->n_tier2_block_ids))
        *why = "tier2_block_ids";
    else if (r->lookup->hit_tokens != w.hit_tokens)
        *why = "hit_tokens";
    else if (r->lookup->inflight_blocks != w.inflight_blocks)
        *why = "inflight_blocks";
    else if (!r->lookup->waited != !w.waited)
        *why = "waited";
    else
        rc = 1;
    if (r)
        kvshare__response__free_unpacked(r, NULL);
    return rc;
}
