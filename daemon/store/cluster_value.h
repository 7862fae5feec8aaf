/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster_value: how one KV block is named and stored in the cluster tier.
 *
 * Key: "<prefix>kvs2:<namespace>:<identity, 16 hex>:<chain hash, 16 hex>".
 * The identity is the namespace's model identity hash (identity.h: the
 * model, its revision, dtype, geometry, tokens per block, tp size): two
 * deployments that share a namespace name but not an identity never even
 * collide on a key. Bytes of the prefix and namespace other than
 * [A-Za-z0-9._/-] (and ':' in the prefix) are written %XX: a key holds no
 * '{', hence no hash tag, and blocks spread over every slot; nor any of
 * '*?[]\', so that "<prefix>kvs2:<namespace>:<identity>:*" matches (SCAN
 * MATCH) exactly the keys of one namespace and identity.
 *
 * Version 1 ("kvs1:<namespace>:<tokens>x<bytes>:<chain hash>", a 48-byte
 * header whose field at 40 was 0) named no identity: its keys are never
 * read by this version, and left to Redis's eviction.
 *
 * Value: ONE Redis value, so that Redis's eviction drops a block whole:
 *
 *     off size  field (little-endian)
 *       0    4  magic "KVSb"
 *       4    2  format version (2)
 *       6    2  namespace name length L
 *       8    4  header length H = 56 + L rounded up to 4 + 4 * n_tokens
 *      12    4  n_tokens
 *      16    8  chain hash
 *      24    8  payload length P
 *      32    8  checksum: XXH3-64 of the payload, seeded with XXH3-64 of
 *               the header with this field zero
 *      40    8  identity hash (identity_hash; 0: none, only in tests of
 *               the tier alone)
 *      48    8  written: microseconds since the epoch on the writer's
 *               clock (a Clear's cut, cluster_store.h)
 *      56    L  namespace name, then zeros to a multiple of 4
 *       .  4 n  the block's token ids
 *       H    P  payload
 *
 * A value that does not verify (short, another magic or version, lengths
 * that disagree, a bad checksum) is corrupt; one that verifies but names
 * another identity is another model's block; one that names another
 * namespace, hash, tokens or payload length is another block; one written
 * before the reader's cut is cleared. Each is a miss, told apart for the
 * counters, and never served.
 */
#ifndef KVS_DAEMON_CLUSTER_VALUE_H
#define KVS_DAEMON_CLUSTER_VALUE_H

#include <stddef.h>
#include <stdint.h>

#define CLUSTER_VALUE_VERSION 2
#define CLUSTER_VALUE_FIXED   56
/* The key's format tag, after the prefix. */
#define CLUSTER_VALUE_KEY_TAG "kvs2:"

/* What names one block. */
typedef struct cluster_block {
    const char *ns; /* namespace name (model identity) */
    size_t ns_len;
    uint64_t hash; /* chain hash */
    const uint32_t *tokens;
    uint32_t n_tokens;
    size_t payload_len;
    uint64_t identity; /* the model identity's hash (0: none) */
    /* Written into a value: when (microseconds since the epoch; 0 when
     * not known). Expected of a value: written at or after this (0: any). */
    uint64_t written_us;
} cluster_block_t;

/* Writes the key into buf (len bytes, NUL included). Returns its length, or
 * KVS_EINVAL when it does not fit. */
int cluster_value_key(const char *prefix, const cluster_block_t *b, char *buf, size_t len);

/* Writes the SCAN MATCH pattern of every key of namespace ns (ns_len
 * bytes) and identity under prefix into buf (len bytes, NUL included).
 * Returns its length, or KVS_EINVAL when it does not fit. */
int cluster_value_match(const char *prefix, const char *ns, size_t ns_len, uint64_t identity,
                        char *buf, size_t len);

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
 * KVS_EIDENTITY when it is a sound value of another model identity;
 * KVS_ENOTFOUND when it is a sound value of another block; KVS_EBADSTATE
 * when it is this block, written before expect->written_us. */
int cluster_value_check(const void *value, size_t len, const cluster_block_t *expect,
                        const void **payload);

/* Writes payload bytes [off, off + n) of a value being checked to where
 * they go. Returns 0, or an error that ends the check with it. */
typedef int (*cluster_value_place_cb)(void *arg, size_t off, const void *src, size_t n);

/* cluster_value_check and the copy of the payload in one pass: once the
 * header names expect, place runs for the payload's consecutive pieces of
 * piece bytes (the last may be shorter), each hashed just before it is
 * placed. Returns 0 when the whole value verified; KVS_EPROTO (corrupt:
 * the pieces placed are garbage, never to be used), KVS_EIDENTITY,
 * KVS_ENOTFOUND or KVS_EBADSTATE (as cluster_value_check: nothing
 * placed), KVS_EINVAL (piece 0, place NULL), or place's
 * error. */
int cluster_value_check_copy(const void *value, size_t len, const cluster_block_t *expect,
                             size_t piece, cluster_value_place_cb place, void *arg);

#endif /* KVS_DAEMON_CLUSTER_VALUE_H */
