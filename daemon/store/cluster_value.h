/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster_value: how one KV block is named and stored in the cluster tier.
 *
 * Key: "<prefix>kvs1:<namespace>:<tokens>x<bytes>:<chain hash, 16 hex>".
 * The namespace names the model identity; tokens x bytes is the block's
 * geometry (tokens per block, payload bytes), so two deployments with
 * another geometry never read each other's blocks. Bytes of the prefix and
 * namespace other than [A-Za-z0-9._/-] (and ':' in the prefix) are written
 * %XX: a key holds no
 * '{', hence no hash tag, and blocks spread over every slot.
 *
 * Value: ONE Redis value, so that Redis's eviction drops a block whole:
 *
 *     off size  field (little-endian)
 *       0    4  magic "KVSb"
 *       4    2  format version (1)
 *       6    2  namespace name length L
 *       8    4  header length H = 48 + L rounded up to 4 + 4 * n_tokens
 *      12    4  n_tokens
 *      16    8  chain hash
 *      24    8  payload length P
 *      32    8  checksum: XXH3-64 of the payload, seeded with XXH3-64 of
 *               the header with this field zero
 *      40    8  reserved (0)
 *      48    L  namespace name, then zeros to a multiple of 4
 *       .  4 n  the block's token ids
 *       H    P  payload
 *
 * A value that does not verify (short, another magic or version, lengths
 * that disagree, a bad checksum) is corrupt; one that verifies but names
 * another namespace, hash, tokens or payload length is another block.
 * Either way it is a miss and is never served.
 */
#ifndef KVS_DAEMON_CLUSTER_VALUE_H
#define KVS_DAEMON_CLUSTER_VALUE_H

#include <stddef.h>
#include <stdint.h>

#define CLUSTER_VALUE_VERSION 1
#define CLUSTER_VALUE_FIXED   48

/* What names one block. */
typedef struct cluster_block {
    const char *ns; /* namespace name (model identity) */
    size_t ns_len;
    uint64_t hash; /* chain hash */
    const uint32_t *tokens;
    uint32_t n_tokens;
    size_t payload_len;
} cluster_block_t;

/* Writes the key into buf (len bytes, NUL included). Returns its length, or
 * KVS_EINVAL when it does not fit. */
int cluster_value_key(const char *prefix, const cluster_block_t *b, char *buf, size_t len);

/* Bytes of the value of b (header and payload). */
size_t cluster_value_size(const cluster_block_t *b);

/* Writes b's header into out (room for cluster_value_size(b) - payload_len
 * bytes) and returns the header length, with the checksum over the header
 * and payload (payload_len bytes at payload; it is not copied: the caller
 * sends header and payload back to back). KVS_EINVAL: a name longer than
 * 65535 bytes. */
int cluster_value_header(const cluster_block_t *b, const void *payload, void *out);

/* Checks value (len bytes) against expect. Returns 0 and *payload (inside
 * value, expect->payload_len bytes); KVS_EPROTO when the value is corrupt;
 * KVS_ENOTFOUND when it is a sound value of another block. */
int cluster_value_check(const void *value, size_t len, const cluster_block_t *expect,
                        const void **payload);

/* Writes payload bytes [off, off + n) of a value being checked to where
 * they go. Returns 0, or an error that ends the check with it. */
typedef int (*cluster_value_place_cb)(void *arg, size_t off, const void *src, size_t n);

/* cluster_value_check and the copy of the payload in one pass: once the
 * header names expect, place runs for the payload's consecutive pieces of
 * piece bytes (the last may be shorter), each hashed just before it is
 * placed. Returns 0 when the whole value verified; KVS_EPROTO (corrupt:
 * the pieces placed are garbage, never to be used), KVS_ENOTFOUND (another
 * block: nothing placed), KVS_EINVAL (piece 0, place NULL), or place's
 * error. */
int cluster_value_check_copy(const void *value, size_t len, const cluster_block_t *expect,
                             size_t piece, cluster_value_place_cb place, void *arg);

#endif /* KVS_DAEMON_CLUSTER_VALUE_H */
