/* SPDX-License-Identifier: Apache-2.0 */
#include "cluster_value.h"

#include "kvshare_status.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static size_t name_room(size_t ns_len)
{
    return (ns_len + 3) & ~(size_t)3;
}

static size_t header_len(size_t ns_len, uint32_t n_tokens)
{
    return CLUSTER_VALUE_FIXED + name_room(ns_len) + 4 * (size_t)n_tokens;
}

/* Appends text with every byte outside [A-Za-z0-9._/-] (and ':' when colon)
 * as %XX. Returns the new offset, or len when it does not fit. */
static size_t put_escaped(char *buf, size_t len, size_t off, const char *text, size_t n, int colon)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n && off < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '/' || ch == '-' ||
                    (colon && ch == ':');
        if (plain) {
            buf[off++] = (char)ch;
        } else if (off + 3 <= len) {
            buf[off++] = '%';
            buf[off++] = hex[ch >> 4];
            buf[off++] = hex[ch & 15];
        } else {
            return len;
        }
    }
    return off;
}

/* The key up to the identity's field: "<prefix>kvs2:<namespace>:". Returns
 * its length, or len when it does not fit. */
static size_t key_head(const char *prefix, const char *ns, size_t ns_len, char *buf, size_t len)
{
    size_t tag = strlen(CLUSTER_VALUE_KEY_TAG);
    size_t off = prefix ? put_escaped(buf, len, 0, prefix, strlen(prefix), 1) : 0;
    /* ':' is not plain: the separators are written as they are, between
     * fields that cannot hold one. */
    if (off + tag >= len)
        return len;
    memcpy(buf + off, CLUSTER_VALUE_KEY_TAG, tag);
    off = put_escaped(buf, len, off + tag, ns, ns_len, 0);
    if (off + 1 >= len)
        return len;
    buf[off++] = ':';
    return off;
}

int cluster_value_key(const char *prefix, const cluster_block_t *b, char *buf, size_t len)
{
    if (!b || !buf || len == 0)
        return KVS_EINVAL;
    size_t off = key_head(prefix, b->ns, b->ns_len, buf, len);
    if (off >= len)
        return KVS_EINVAL;
    int n = snprintf(buf + off, len - off, "%016" PRIx64 ":%016" PRIx64, b->identity, b->hash);
    if (n < 0 || (size_t)n >= len - off)
        return KVS_EINVAL;
    return (int)(off + (size_t)n);
}

int cluster_value_match(const char *prefix, const char *ns, size_t ns_len, uint64_t identity,
                        char *buf, size_t len)
{
    if (!ns || !buf || len == 0)
        return KVS_EINVAL;
    size_t off = key_head(prefix, ns, ns_len, buf, len);
    if (off >= len)
        return KVS_EINVAL;
    int n = snprintf(buf + off, len - off, "%016" PRIx64 ":*", identity);
    if (n < 0 || (size_t)n >= len - off)
        return KVS_EINVAL;
    return (int)(off + (size_t)n);
}

size_t cluster_value_size(const cluster_block_t *b)
{
    return header_len(b->ns_len, b->n_tokens) + b->payload_len;
}

/* The checksum of a header whose checksum field is zero, and its payload. */
static uint64_t checksum(const unsigned char *header, size_t hlen, const void *payload, size_t plen)
{
    return XXH3_64bits_withSeed(payload, plen, XXH3_64bits(header, hlen));
}

int cluster_value_header(const cluster_block_t *b, const void *payload, void *out)
{
    if (!b || !out || b->ns_len > 0xffff || (b->n_tokens && !b->tokens))
        return KVS_EINVAL;
    unsigned char *p = out;
    size_t hlen = header_len(b->ns_len, b->n_tokens);
    memset(p, 0, hlen);
    memcpy(p, "KVSb", 4);
    put16(p + 4, CLUSTER_VALUE_VERSION);
    put16(p + 6, (uint16_t)b->ns_len);
    put32(p + 8, (uint32_t)hlen);
    put32(p + 12, b->n_tokens);
    put64(p + 16, b->hash);
    put64(p + 24, b->payload_len);
    put64(p + 40, b->identity);
    put64(p + 48, b->written_us);
    memcpy(p + CLUSTER_VALUE_FIXED, b->ns, b->ns_len);
    unsigned char *t = p + CLUSTER_VALUE_FIXED + name_room(b->ns_len);
    for (uint32_t i = 0; i < b->n_tokens; i++)
        put32(t + 4 * i, b->tokens[i]);
    put64(p + 32, checksum(p, hlen, payload, b->payload_len));
    return (int)hlen;
}

/* The checks of the header alone: its lengths, and the block it names.
 * Returns 0 (*hlen, *plen, *seed: the checksum's seed over the header),
 * KVS_EPROTO (corrupt), or, for a header that is sound (the caller still
 * tells it from a corrupt value by the checksum): KVS_EIDENTITY (another
 * model identity, whatever else it names), KVS_ENOTFOUND (another block),
 * KVS_EBADSTATE (this block, written before expect->written_us). */
static int check_header(const unsigned char *p, size_t len, const cluster_block_t *expect,
                        size_t *hlen_out, size_t *plen_out, uint64_t *seed)
{
    if (!p || len < CLUSTER_VALUE_FIXED || memcmp(p, "KVSb", 4) != 0 ||
        get16(p + 4) != CLUSTER_VALUE_VERSION)
        return KVS_EPROTO;
    size_t ns_len = get16(p + 6);
    uint32_t n_tokens = get32(p + 12);
    size_t hlen = get32(p + 8);
    uint64_t plen = get64(p + 24);
    if (n_tokens > (len - CLUSTER_VALUE_FIXED) / 4 || hlen != header_len(ns_len, n_tokens) ||
        hlen > len || plen != len - hlen)
        return KVS_EPROTO;
    /* The checksum is computed over the header with its own field zero:
     * hash a copy of the fixed part (small), then the names and tokens. */
    unsigned char head[CLUSTER_VALUE_FIXED];
    memcpy(head, p, CLUSTER_VALUE_FIXED);
    memset(head + 32, 0, 8);
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, head, CLUSTER_VALUE_FIXED);
    XXH3_64bits_update(&st, p + CLUSTER_VALUE_FIXED, hlen - CLUSTER_VALUE_FIXED);
    *seed = XXH3_64bits_digest(&st);
    *hlen_out = hlen;
    *plen_out = (size_t)plen;
    if (get64(p + 40) != expect->identity)
        return KVS_EIDENTITY;
    if (ns_len != expect->ns_len || memcmp(p + CLUSTER_VALUE_FIXED, expect->ns, ns_len) != 0 ||
        get64(p + 16) != expect->hash || n_tokens != expect->n_tokens ||
        plen != expect->payload_len)
        return KVS_ENOTFOUND;
    const unsigned char *t = p + CLUSTER_VALUE_FIXED + name_room(ns_len);
    for (uint32_t i = 0; i < n_tokens; i++)
        if (get32(t + 4 * i) != expect->tokens[i])
            return KVS_ENOTFOUND;
    if (get64(p + 48) < expect->written_us)
        return KVS_EBADSTATE;
    return 0;
}

int cluster_value_check(const void *value, size_t len, const cluster_block_t *expect,
                        const void **payload)
{
    const unsigned char *p = value;
    size_t hlen = 0, plen = 0;
    uint64_t seed = 0;
    int rc = check_header(p, len, expect, &hlen, &plen, &seed);
    if (rc == KVS_EPROTO)
        return rc;
    /* A bad checksum says corrupt before a sound header of another block
     * says mismatched. */
    if (XXH3_64bits_withSeed(p + hlen, plen, seed) != get64(p + 32))
        return KVS_EPROTO;
    if (rc != 0)
        return rc;
    *payload = p + hlen;
    return 0;
}

int cluster_value_check_copy(const void *value, size_t len, const cluster_block_t *expect,
                             size_t piece, cluster_value_place_cb place, void *arg)
{
    const unsigned char *p = value;
    size_t hlen = 0, plen = 0;
    uint64_t seed = 0;
    if (piece == 0 || !place)
        return KVS_EINVAL;
    int rc = check_header(p, len, expect, &hlen, &plen, &seed);
    if (rc == KVS_EPROTO)
        return rc;
    if (rc != 0) /* not this block: nothing to place; corrupt or not? */
        return XXH3_64bits_withSeed(p + hlen, plen, seed) != get64(p + 32) ? KVS_EPROTO : rc;
    /* Each piece is hashed and then copied while it is in the cache: the
     * payload is read from memory once, not once to verify and once to
     * copy. Streaming XXH3 gives the one-shot result. */
    /* A state on the stack is initialised before its first reset: the
     * reset compares the seed it holds with the new one. */
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, seed);
    for (size_t off = 0; off < plen; off += piece) {
        size_t n = plen - off < piece ? plen - off : piece;
        XXH3_64bits_update(&st, p + hlen + off, n);
        rc = place(arg, off, p + hlen + off, n);
        if (rc != 0)
            return rc;
    }
    return XXH3_64bits_digest(&st) == get64(p + 32) ? 0 : KVS_EPROTO;
}
