/* SPDX-License-Identifier: Apache-2.0 */
#include "store_disk.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "kvshare_status.h"
#include "log.h"
#include "namespaces.h"
#include "nsname.h"
#include "store.h"
#include "store_restore.h"
#include "disk.h"
#include "store_disk_medium.h"

/* --- the medium's source --- */

/* What a put's record names: tier-3 index id `id` (the block being copied
 * there; its chain is in the index under it already). */
static void src_meta(void *arg, uint32_t id, disk_meta_t *out)
{
    server_t *srv = arg;
    store_t *st = srv->store;
    memset(out, 0, sizeof(*out));
    uint32_t ns = st->rec[id].meta.ns;
    out->ns_id = ns;
    const char *name = radix_ns_name(st->index, ns);
    const ns_identity_t *ni = namespaces_identity(srv, ns);
    out->ident_hash = ni->hash;
    if (name) {
        strncpy(out->ns, name, DISK_NS_MAX - 1);
        /* The file names the identity in words before its records do (a
         * compare when it does already; a failed write is logged, and
         * leaves those records unrestorable, never wrongly restored). */
        char err[160];
        if (disk_ns_note(srv->disk_tier, name, ni->hash, ni->source, ni->text, err, sizeof(err)) !=
            0)
            LOG_ERROR("disk tier: %s", err);
    }
    if (radix_block_chain(st->index, id, &out->chain_hash, &out->parent_hash, &out->tokens) == 0)
        out->ntokens = srv->geo.block_tokens;
}

/* On the loop: the tier-2 slot a put of tier-3 id `id` copies from (its
 * peer in the index while the move is in flight; that slot is not reused
 * before the move ends). UINT32_MAX when it is not one (cannot happen). */
static uint32_t src_locate(void *arg, uint32_t id)
{
    server_t *srv = arg;
    uint32_t from = 0;
    if (radix_block_peer(srv->store->index, id, &from) != 0 || from < srv->num_blocks ||
        from >= srv->num_blocks + srv->tier2_blocks)
        return UINT32_MAX;
    return from - srv->num_blocks;
}

/* On a tier thread: tier-2 slot `slot`'s pieces (one per layer and plane,
 * laid out as the pool's) gathered into dst, checksummed as they are
 * copied; returns the CRC32C of the block. Reads host memory only, which
 * the move keeps in place; touches nothing the loop changes. */
/* A tier-2 block's pieces gathered into a record's payload, with their
 * CRC32C computed as they are copied. */
typedef struct gather {
    const uint8_t *base; /* tier 2's memory */
    uint8_t *out;
    uint32_t crc;
} gather_t;

static int gather_piece(void *arg, uint64_t slab_off, uint64_t block_off, uint64_t bytes)
{
    gather_t *g = arg;
    g->crc = crc32c_copy(g->crc, g->out + block_off, g->base + slab_off, bytes);
    return 0;
}

static uint32_t src_gather(void *arg, uint32_t slot, void *dst)
{
    const server_t *srv = arg;
    if (slot == UINT32_MAX) {
        memset(dst, 0, srv->block_bytes); /* a record of zeros, never named by the index */
        return crc32c(0, dst, srv->block_bytes);
    }
    gather_t g = {.base = (const uint8_t *)backend_tier_base(srv->backend), .out = dst, .crc = 0};
    store_block_walk(srv->store, srv->tier2_blocks, slot, gather_piece, &g);
    return g.crc;
}

/* On a tier thread: a verified get's bytes into pool block id, piece by
 * piece (the backend writes device memory on cuda). The block is the
 * get's alone until it ends: a pool block the promotion took, which no one
 * reads or writes before the loop hears the get's end; the backend is used
 * from other threads the same way by the host tier's copies. Reads only
 * fields set at start. A failed write fails the get (undone: a miss). */
static int src_store(void *arg, uint32_t id, const void *buf)
{
    const server_t *srv = arg;
    return store_block_write(srv->store, id, buf);
}

/* A tier-3 slot whose record did not verify at a get (its promotion was
 * undone): its block, and every block after it, can never be served, so
 * they leave the index (and the slot is free) rather than fail every
 * lookup that reaches them. The disk tier counted the failure. */
static void src_bad(void *arg, uint32_t slot)
{
    server_t *srv = arg;
    uint32_t id = srv->num_blocks + srv->tier2_blocks + slot;
    size_t n = 0;
    int rc = radix_drop_from(srv->store->index, id, &n);
    LOG_WARN("disk tier: slot %u did not verify: %zu blocks dropped from the index%s", slot, n,
             rc == KVS_EBUSY ? " (some kept: pinned or being copied)" : "");
}

int store_disk_open(server_t *srv, tier_medium_t **out)
{
    store_disk_source_t src = {.meta = src_meta,
                               .bad = src_bad,
                               .arg = srv,
                               .store = src_store,
                               .locate = src_locate,
                               .gather = src_gather,
                               .block_tokens = srv->geo.block_tokens};
    return store_disk_medium_open(srv->loop, srv->disk_tier, &src, out);
}

/* --- deletion ---
 *
 * A deletion is on the disk when its call returns (O_DIRECT writes): no
 * SIGKILL undoes it. The fdatasync that makes it outlast a power loss too
 * takes milliseconds (the disk's cache flush): it runs on a thread
 * (disk_sync_async), and the loop goes on. */

int store_disk_forget_ns(server_t *srv, uint32_t ns)
{
    if (!srv->store || !srv->store->medium3)
        return 0;
    const char *name = radix_ns_name(srv->index, ns);
    if (!name)
        return 0;
    const ns_identity_t *ni = namespaces_identity(srv, ns);
    char err[160];
    int rc = disk_ns_delete(srv->disk_tier, name, ni->hash, ni->source, ni->text, err, sizeof(err));
    if (rc == 0)
        disk_sync_async(srv->disk_tier);
    else
        LOG_ERROR("disk tier: %s", err);
    return rc;
}

int store_disk_forget_prompt(server_t *srv, uint32_t ns, const uint32_t *tokens, size_t n_tokens)
{
    size_t n = n_tokens / srv->geo.block_tokens, k = 0;
    if (!srv->store || !srv->store->medium3 || n == 0)
        return 0;
    uint64_t *hashes = malloc(n * sizeof(*hashes));
    uint32_t *ids = malloc(n * sizeof(*ids));
    size_t kept = 0;
    /* The blocks the Evict kept (pinned, or continued by another prompt)
     * are the prompt's cached prefix: their records stay. */
    int rc =
        hashes && ids ? radix_match(srv->index, ns, tokens, n_tokens, ids, n, &kept) : KVS_ENOMEM;
    if (rc == 0)
        rc = radix_chain_hashes(srv->index, ns, tokens, n, hashes);
    size_t looked = 0;
    if (rc == 0 && kept < n)
        rc = store_disk_medium_forget(srv->store->medium3, hashes + kept, n - kept, &k, &looked);
    if (rc == 0 && kept < n) /* records not back in the index yet */
        store_restore_forget(srv, radix_ns_name(srv->index, ns), hashes + kept, n - kept);
    LOG_DEBUG("disk tier: an Evict of %zu blocks deleted %zu records (%zu slots looked at)",
              n - kept, k, looked);
    if (rc == 0 && k > 0)
        disk_sync_async(srv->disk_tier);
    free(hashes);
    free(ids);
    return rc;
}
