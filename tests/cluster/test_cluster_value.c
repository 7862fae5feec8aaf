/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster tier's keys and values (daemon/store/cluster_value.c). */
#include "check_main.h"
#include "cluster_value.h"
#include "crc16.h"
#include "kvshare_status.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t tokens[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 70000};

static cluster_block_t block(size_t payload_len)
{
    cluster_block_t b = {.ns = "llama-3.1-8b",
                         .ns_len = 12,
                         .hash = 0x0123456789abcdefULL,
                         .tokens = tokens,
                         .n_tokens = 16,
                         .payload_len = payload_len,
                         .identity = 0x1dea1dea1dea1deaULL,
                         .written_us = 1700000000000000ULL};
    return b;
}

/* header then payload in one buffer, as Redis stores it. */
static unsigned char *encode(const cluster_block_t *b, const unsigned char *payload, size_t *len)
{
    *len = cluster_value_size(b);
    unsigned char *v = malloc(*len);
    int h = cluster_value_header(b, payload, v);
    ck_assert_int_gt(h, 0);
    ck_assert_uint_eq((size_t)h + b->payload_len, *len);
    memcpy(v + h, payload, b->payload_len);
    return v;
}

START_TEST(round_trip)
{
    enum { P = 4096 };
    unsigned char payload[P];
    for (int i = 0; i < P; i++)
        payload[i] = (unsigned char)(i * 7 + 3);
    cluster_block_t b = block(P);
    size_t len;
    unsigned char *v = encode(&b, payload, &len);
    const void *got = NULL;
    ck_assert_int_eq(cluster_value_check(v, len, &b, &got), 0);
    ck_assert_mem_eq(got, payload, P);
    ck_assert_ptr_eq(got, v + len - P);
    free(v);
}
END_TEST

START_TEST(corrupt_is_refused)
{
    enum { P = 256 };
    unsigned char payload[P] = {0};
    cluster_block_t b = block(P);
    size_t len;
    unsigned char *v = encode(&b, payload, &len);
    const void *got;
    /* Any one byte flipped, header or payload, fails the check. */
    for (size_t i = 0; i < len; i++) {
        v[i] ^= 0x40;
        int rc = cluster_value_check(v, len, &b, &got);
        ck_assert_msg(rc == KVS_EPROTO, "byte %zu flipped: %d", i, rc);
        v[i] ^= 0x40;
    }
    /* Cut short, or longer than it says. */
    ck_assert_int_eq(cluster_value_check(v, len - 1, &b, &got), KVS_EPROTO);
    ck_assert_int_eq(cluster_value_check(v, 10, &b, &got), KVS_EPROTO);
    ck_assert_int_eq(cluster_value_check(v, 0, &b, &got), KVS_EPROTO);
    unsigned char *longer = calloc(1, len + 1);
    memcpy(longer, v, len);
    ck_assert_int_eq(cluster_value_check(longer, len + 1, &b, &got), KVS_EPROTO);
    free(longer);
    ck_assert_int_eq(cluster_value_check(v, len, &b, &got), 0);
    free(v);
}
END_TEST

START_TEST(another_block_is_a_miss)
{
    unsigned char payload[64] = {9};
    cluster_block_t b = block(64);
    size_t len;
    unsigned char *v = encode(&b, payload, &len);
    const void *got;
    cluster_block_t other = b;
    other.hash ^= 1;
    ck_assert_int_eq(cluster_value_check(v, len, &other, &got), KVS_ENOTFOUND);
    uint32_t t2[16];
    memcpy(t2, tokens, sizeof t2);
    t2[15]++;
    other = b;
    other.tokens = t2;
    ck_assert_int_eq(cluster_value_check(v, len, &other, &got), KVS_ENOTFOUND);
    other = b;
    other.ns = "llama-3.1-8B";
    ck_assert_int_eq(cluster_value_check(v, len, &other, &got), KVS_ENOTFOUND);
    other = b;
    other.payload_len = 32;
    ck_assert_int_eq(cluster_value_check(v, len, &other, &got), KVS_ENOTFOUND);
    free(v);
}
END_TEST

/* Where check_copy puts the payload's pieces: a buffer, and how many. */
typedef struct sink {
    unsigned char *buf;
    size_t pieces, bytes;
    int fail_at; /* piece that fails (-1: none) */
} sink_t;

static int place(void *arg, size_t off, const void *src, size_t n)
{
    sink_t *k = arg;
    if ((int)k->pieces == k->fail_at)
        return KVS_EIO;
    memcpy(k->buf + off, src, n);
    k->pieces++;
    k->bytes += n;
    return 0;
}

/* The one-pass check and copy agrees with cluster_value_check: the same
 * verdicts, the payload placed whole (pieces that do not divide it too),
 * and a corrupt payload found after it was placed. */
START_TEST(check_copy_agrees)
{
    enum { P = 100000 };
    unsigned char *payload = malloc(P), *out = malloc(P);
    for (int i = 0; i < P; i++)
        payload[i] = (unsigned char)(i * 13 + 5);
    cluster_block_t b = block(P);
    size_t len;
    unsigned char *v = encode(&b, payload, &len);
    const size_t pieces[] = {1, 4096, 32768, 99999, P, 2 * P};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        memset(out, 0, P);
        sink_t sk = {.buf = out, .fail_at = -1};
        ck_assert_int_eq(cluster_value_check_copy(v, len, &b, pieces[k], place, &sk), 0);
        ck_assert_mem_eq(out, payload, P);
        ck_assert_uint_eq(sk.bytes, P);
        ck_assert_uint_eq(sk.pieces, (P + pieces[k] - 1) / pieces[k]);
    }
    /* The last byte of the payload flipped: placed, then refused. */
    sink_t sk = {.buf = out, .fail_at = -1};
    v[len - 1] ^= 1;
    ck_assert_int_eq(cluster_value_check_copy(v, len, &b, 32768, place, &sk), KVS_EPROTO);
    const void *got;
    ck_assert_int_eq(cluster_value_check(v, len, &b, &got), KVS_EPROTO);
    v[len - 1] ^= 1;
    /* Another block: nothing placed; corrupt and another block: corrupt. */
    cluster_block_t other = b;
    other.hash ^= 1;
    sk = (sink_t){.buf = out, .fail_at = -1};
    ck_assert_int_eq(cluster_value_check_copy(v, len, &other, 32768, place, &sk), KVS_ENOTFOUND);
    ck_assert_uint_eq(sk.pieces, 0);
    v[len - 1] ^= 1;
    ck_assert_int_eq(cluster_value_check_copy(v, len, &other, 32768, place, &sk), KVS_EPROTO);
    v[len - 1] ^= 1;
    /* A piece that cannot be placed ends the check with its error. */
    sk = (sink_t){.buf = out, .fail_at = 1};
    ck_assert_int_eq(cluster_value_check_copy(v, len, &b, 32768, place, &sk), KVS_EIO);
    ck_assert_int_eq(cluster_value_check_copy(v, len, &b, 0, place, &sk), KVS_EINVAL);
    ck_assert_int_eq(cluster_value_check_copy(v, 10, &b, 32768, place, &sk), KVS_EPROTO);
    free(v);
    free(payload);
    free(out);
}
END_TEST

/* A value that verifies but names another model identity is a miss of
 * its own kind (KVS_EIDENTITY), whatever else it names; nothing of it is
 * placed. Its identity is covered by the checksum like the rest. */
START_TEST(another_identity_is_a_miss)
{
    enum { P = 512 };
    unsigned char payload[P], out[P];
    memset(payload, 0x33, P);
    cluster_block_t b = block(P);
    cluster_block_t theirs = b;
    theirs.identity ^= 0x8000;
    size_t len;
    unsigned char *v = encode(&theirs, payload, &len);
    const void *got;
    ck_assert_int_eq(cluster_value_check(v, len, &b, &got), KVS_EIDENTITY);
    sink_t sk = {.buf = out, .fail_at = -1};
    ck_assert_int_eq(cluster_value_check_copy(v, len, &b, 128, place, &sk), KVS_EIDENTITY);
    ck_assert_uint_eq(sk.pieces, 0);
    /* Another identity and another block: the identity says. */
    cluster_block_t other = b;
    other.hash ^= 1;
    ck_assert_int_eq(cluster_value_check(v, len, &other, &got), KVS_EIDENTITY);
    /* Its identity field changed in place: corrupt. */
    v[40] ^= 1;
    ck_assert_int_eq(cluster_value_check(v, len, &b, &got), KVS_EPROTO);
    v[40] ^= 1;
    ck_assert_int_eq(cluster_value_check(v, len, &theirs, &got), 0);
    free(v);
}
END_TEST

/* A reader's cut (a Clear): the block written before it is refused
 * (KVS_EBADSTATE), at or after it served. */
START_TEST(written_before_the_cut_is_a_miss)
{
    enum { P = 256 };
    unsigned char payload[P], out[P];
    memset(payload, 0x5a, P);
    cluster_block_t b = block(P);
    size_t len;
    unsigned char *v = encode(&b, payload, &len);
    const void *got;
    cluster_block_t expect = b;
    expect.written_us = 0; /* no cut */
    ck_assert_int_eq(cluster_value_check(v, len, &expect, &got), 0);
    expect.written_us = b.written_us;
    ck_assert_int_eq(cluster_value_check(v, len, &expect, &got), 0);
    expect.written_us = b.written_us + 1;
    ck_assert_int_eq(cluster_value_check(v, len, &expect, &got), KVS_EBADSTATE);
    sink_t sk = {.buf = out, .fail_at = -1};
    ck_assert_int_eq(cluster_value_check_copy(v, len, &expect, 64, place, &sk), KVS_EBADSTATE);
    ck_assert_uint_eq(sk.pieces, 0);
    free(v);
}
END_TEST

START_TEST(keys_have_no_hash_tag)
{
    char key[256];
    cluster_block_t b = block(2 << 20);
    int n = cluster_value_key("kvs:", &b, key, sizeof key);
    ck_assert_int_gt(n, 0);
    ck_assert_str_eq(key, "kvs:kvs2:llama-3.1-8b:1dea1dea1dea1dea:0123456789abcdef");
    /* Another identity, another key. */
    b.identity = 0x00000000000000ffULL;
    n = cluster_value_key("kvs:", &b, key, sizeof key);
    ck_assert_str_eq(key, "kvs:kvs2:llama-3.1-8b:00000000000000ff:0123456789abcdef");
    b.ns = "m{x}:y*";
    b.ns_len = 7;
    n = cluster_value_key(NULL, &b, key, sizeof key);
    ck_assert_str_eq(key, "kvs2:m%7Bx%7D%3Ay%2A:00000000000000ff:0123456789abcdef");
    ck_assert_ptr_null(strchr(key, '{'));
    ck_assert_int_eq(cluster_value_key(NULL, &b, key, 20), KVS_EINVAL);
    /* Blocks of one chain spread over the slots. */
    int seen[4] = {0};
    for (uint64_t h = 0; h < 400; h++) {
        b.hash = h * 0x9E3779B97F4A7C15ULL;
        cluster_value_key(NULL, &b, key, sizeof key);
        seen[crc16_key_slot(key, strlen(key)) / 4096]++;
    }
    for (int q = 0; q < 4; q++)
        ck_assert_int_gt(seen[q], 50);
}
END_TEST

/* The SCAN pattern of a namespace and identity is its keys' common
 * prefix and one '*': no other glob character can be in it. */
START_TEST(match_pattern_is_the_keys_prefix)
{
    char key[256], match[256];
    cluster_block_t b = block(64);
    b.ns = "team[a]?*";
    b.ns_len = 9;
    int k = cluster_value_key("p:x\\", &b, key, sizeof key);
    int m = cluster_value_match("p:x\\", b.ns, b.ns_len, b.identity, match, sizeof match);
    ck_assert_int_gt(k, 0);
    ck_assert_int_gt(m, 0);
    ck_assert_str_eq(match, "p:x%5Ckvs2:team%5Ba%5D%3F%2A:1dea1dea1dea1dea:*");
    ck_assert_int_eq(strncmp(key, match, (size_t)m - 1), 0);
    ck_assert_uint_eq(strcspn(match, "?[]\\"), strlen(match));
    ck_assert_ptr_eq(strchr(match, '*'), match + m - 1);
    /* Another identity's keys do not match. */
    b.identity ^= 1;
    cluster_value_key("p:x\\", &b, key, sizeof key);
    ck_assert_int_ne(strncmp(key, match, (size_t)m - 1), 0);
    ck_assert_int_eq(cluster_value_match(NULL, b.ns, b.ns_len, 1, match, 20), KVS_EINVAL);
}
END_TEST

static Suite *value_suite(void)
{
    Suite *s = suite_create("cluster_value");
    TCase *tc = tcase_create("value");
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, corrupt_is_refused);
    tcase_add_test(tc, another_block_is_a_miss);
    tcase_add_test(tc, keys_have_no_hash_tag);
    tcase_add_test(tc, check_copy_agrees);
    tcase_add_test(tc, another_identity_is_a_miss);
    tcase_add_test(tc, written_before_the_cut_is_a_miss);
    tcase_add_test(tc, match_pattern_is_the_keys_prefix);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(value_suite)
