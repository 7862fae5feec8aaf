/* SPDX-License-Identifier: Apache-2.0 */
#include "store.h"

#include <stdlib.h>

#include "kvshare_status.h"

int store_open(server_t *srv, store_t **out)
{
    store_t *st = calloc(1, sizeof(*st));
    if (!st)
        return KVS_ENOMEM;
    /* By index id: tier-2 blocks keep what names them too. */
    st->n_ids = srv->num_blocks + srv->tier2_blocks;
    st->rec = calloc(st->n_ids, sizeof(*st->rec));
    st->keys = calloc(srv->num_blocks, sizeof(*st->keys));
    if (!st->rec || !st->keys) {
        store_free(st);
        return KVS_ENOMEM;
    }
    *out = st;
    return 0;
}

void store_free(store_t *st)
{
    if (!st)
        return;
    free(st->rec);
    free(st->keys);
    free(st);
}
