/* SPDX-License-Identifier: Apache-2.0 */
/* lookup_codec: the hand-written Lookup codec gives what protobuf-c gives. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "lookup_codec.h"
#include "lookup_codec_diff.h"

/* A small PRNG of our own: the cases replay from the seed. */
static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Values at the edges of their varints more often than by chance. */
static uint64_t rnd_value(unsigned bits)
{
    static const uint64_t edges[] = {0, 1, 127, 128, 16383, 16384, UINT32_MAX, UINT64_MAX};
    uint64_t v = rnd() % 4 == 0 ? edges[rnd() % 8] : rnd() >> (rnd() % 64);
    return bits == 64 ? v : v & ((1ull << bits) - 1);
}

static void check_request(const uint8_t *body, size_t len, int want)
{
    const char *why = "";
    int rc = lookup_codec_diff_request(body, len, &why);
    ck_assert_msg(rc >= 0, "the hand decoder took a frame protobuf-c reads otherwise: %s", why);
    if (want >= 0)
        ck_assert_int_eq(rc, want);
}

/* A Lookup request as protobuf-c packs it, with random fields. */
static size_t random_request(uint8_t *buf, size_t cap, uint8_t *tokens, char *ns)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    size_t ns_len = rnd() % 3 == 0 ? 0 : rnd() % 40;
    for (size_t i = 0; i < ns_len; i++)
        ns[i] = (char)('a' + rnd() % 26);
    ns[ns_len] = '\0';
    lk.ns = ns;
    lk.tokens.len = rnd() % 5 == 0 ? 0 : rnd() % 600;
    for (size_t i = 0; i < lk.tokens.len; i++)
        tokens[i] = (uint8_t)rnd();
    lk.tokens.data = lk.tokens.len ? tokens : NULL;
    lk.pin = rnd() % 2;
    lk.wait_ms = (uint32_t)rnd_value(32);
    lk.tier2_in_place = rnd() % 2;
    req.id = rnd_value(64);
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    size_t n = kvshare__request__get_packed_size(&req);
    ck_assert_uint_le(n, cap);
    kvshare__request__pack(&req, buf);
    return n;
}

START_TEST(test_requests_protobuf_c_packs)
{
    rng_state = 0x9e3779b97f4a7c15ull;
    uint8_t buf[1024], tokens[600];
    char ns[64];
    for (int i = 0; i < 20000; i++) {
        size_t n = random_request(buf, sizeof(buf), tokens, ns);
        check_request(buf, n, 1);
    }
}
END_TEST

/* Fields in another order than protobuf-c's, and the shapes the hand
 * decoder leaves to protobuf-c. */
START_TEST(test_requests_by_hand)
{
    /* tokens before ns, the lookup before the id */
    const uint8_t reordered[] = {0x5a, 0x0b, 0x12, 0x04, 1,    0,    0,   0,
                                 0x0a, 0x01, 'x',  0x18, 0x01, 0x08, 0x07};
    check_request(reordered, sizeof(reordered), 1);
    lookup_frame_t w;
    ck_assert(lookup_decode(reordered, sizeof(reordered), &w));
    ck_assert_uint_eq(w.id, 7);
    ck_assert_uint_eq(w.tokens_len, 4);
    ck_assert_uint_eq(w.ns_len, 1);
    ck_assert(w.pin);
    /* an empty LookupRequest: every field its default */
    const uint8_t empty[] = {0x5a, 0x00};
    check_request(empty, sizeof(empty), 1);
    ck_assert(lookup_decode(empty, sizeof(empty), &w));
    ck_assert_uint_eq(w.id, 0);
    ck_assert_uint_eq(w.ns_len, 0);
    /* a namespace with a NUL inside: a C string ends there, both ways */
    const uint8_t nul[] = {0x5a, 0x05, 0x0a, 0x03, 'a', 0, 'b'};
    check_request(nul, sizeof(nul), 1);

    static const struct {
        const char *what;
        uint8_t bytes[16];
        size_t len;
    } refused[] = {
        {"no lookup", {0x08, 0x01}, 2},
        {"a Ping", {0x08, 0x01, 0x92, 0x01, 0x00}, 5},
        {"the id twice", {0x08, 0x01, 0x08, 0x02, 0x5a, 0x00}, 6},
        {"the lookup twice", {0x5a, 0x00, 0x5a, 0x00}, 4},
        {"pin twice", {0x5a, 0x04, 0x18, 0x01, 0x18, 0x00}, 6},
        {"an unknown field", {0x5a, 0x02, 0x30, 0x01}, 4},
        {"an unknown field of the Request", {0x5a, 0x00, 0x10, 0x01}, 4},
        {"pin as a length-delimited field", {0x5a, 0x03, 0x1a, 0x01, 0x00}, 5},
        {"a 6-byte varint for pin", {0x5a, 0x07, 0x18, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 9},
        {"an 11-byte id",
         {0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01},
         12},
        {"a tag in two bytes", {0x5a, 0x03, 0x98, 0x00, 0x01}, 5},
        {"a lookup longer than the frame", {0x5a, 0x05, 0x18, 0x01}, 4},
        {"tokens longer than the lookup", {0x5a, 0x03, 0x12, 0x05, 0x00}, 5},
        {"a truncated varint", {0x5a, 0x02, 0x20, 0x80}, 4},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        ck_assert_msg(!lookup_decode(refused[i].bytes, refused[i].len, &w), "took %s",
                      refused[i].what);
        check_request(refused[i].bytes, refused[i].len, 0);
    }
    /* A 5-byte pin whose last byte has bits past 32: protobuf-c says true. */
    const uint8_t pin5[] = {0x5a, 0x06, 0x18, 0x80, 0x80, 0x80, 0x80, 0x70};
    check_request(pin5, sizeof(pin5), 1);
    /* wait_ms past 32 bits keeps its low 32, both ways. */
    const uint8_t wait5[] = {0x5a, 0x06, 0x20, 0xff, 0xff, 0xff, 0xff, 0x7f};
    check_request(wait5, sizeof(wait5), 1);
}
END_TEST

/* Packed requests with bytes flipped, cut, doubled or added: whatever the
 * hand decoder takes, protobuf-c reads the same. */
START_TEST(test_requests_mutated)
{
    rng_state = 0x2545f4914f6cdd1dull;
    uint8_t buf[2048], tokens[600];
    char ns[64];
    size_t taken = 0, total = 0;
    for (int i = 0; i < 50000; i++) {
        size_t n = random_request(buf, 1024, tokens, ns);
        switch (rnd() % 4) {
        case 0: /* flip a few bytes */
            for (int k = 0, m = 1 + (int)(rnd() % 3); k < m && n; k++)
                buf[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: /* cut */
            n = n ? rnd() % n : 0;
            break;
        case 2: /* a slice of itself appended */
            if (n) {
                size_t at = rnd() % n, k = rnd() % (n - at) + 1;
                memcpy(buf + n, buf + at, k);
                n += k;
            }
            break;
        default: /* random bytes appended */
            for (int k = 0, m = 1 + (int)(rnd() % 8); k < m; k++)
                buf[n++] = (uint8_t)rnd();
        }
        check_request(buf, n, -1);
        lookup_frame_t w;
        taken += lookup_decode(buf, n, &w);
        total++;
    }
    /* Some mutants stay plain Lookups (a flipped token byte): the hand
     * decoder must have taken some, and refused others. */
    ck_assert_uint_gt(taken, 0);
    ck_assert_uint_lt(taken, total);
}
END_TEST

START_TEST(test_replies_as_protobuf_c)
{
    rng_state = 0xda942042e4dd58b5ull;
    static uint32_t ids[700];
    for (int i = 0; i < 20000; i++) {
        Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
        Kvshare__LookupReply r = KVSHARE__LOOKUP_REPLY__INIT;
        for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++)
            ids[k] = (uint32_t)rnd_value(32);
        r.n_block_ids = rnd() % 3 == 0 ? 0 : rnd() % 400;
        r.block_ids = ids;
        r.n_tier2_block_ids = rnd() % 3 == 0 ? rnd() % 300 : 0;
        r.tier2_block_ids = ids + 400;
        r.hit_tokens = (uint32_t)rnd_value(32);
        r.inflight_blocks = (uint32_t)rnd_value(32);
        r.waited = rnd() % 2;
        resp.id = rnd_value(64);
        static const int statuses[] = {0, 3, 27, -1, -2147483647 - 1};
        resp.status = (Kvshare__Status)statuses[rnd() % 5];
        static char *messages[] = {NULL, "", "x", "a message of some length"};
        resp.message = messages[rnd() % 4];
        resp.rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
        resp.lookup = &r;
        const char *why = "";
        ck_assert_msg(lookup_codec_diff_reply(&resp, &why) == 0, "reply %d: %s", i, why);
    }
    /* Not taken: another RPC, or a Lookup reply without its message. */
    Kvshare__Response other = KVSHARE__RESPONSE__INIT;
    ck_assert(!lookup_reply_takes(&other));
    other.rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
    ck_assert(!lookup_reply_takes(&other));
}
END_TEST

static Suite *lookup_codec_suite(void)
{
    Suite *s = suite_create("lookup_codec");
    TCase *tc = tcase_create("lookup_codec");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_requests_protobuf_c_packs);
    tcase_add_test(tc, test_requests_by_hand);
    tcase_add_test(tc, test_requests_mutated);
    tcase_add_test(tc, test_replies_as_protobuf_c);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(lookup_codec_suite)
