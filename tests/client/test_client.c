/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvshare without a daemon: options, status texts, the default socket
 * path, and calls that must fail fast (no daemon) or time out (a server that
 * accepts and never answers) instead of hanging.
 */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check_main.h"
#include "frame_header.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "socket_path.h"
#include "test_tmp.h"
#include "wire.h"
#include "wire_reply_diff.h"

START_TEST(test_options_and_strerror)
{
    kvs_options_t o;
    memset(&o, 0xab, sizeof(o));
    kvs_options_init(&o);
    ck_assert_uint_eq(o.size, sizeof(o));
    ck_assert_int_eq(o.timeout_ms, 1000);
    ck_assert_ptr_null(o.socket_path);
    ck_assert_uint_eq(o.flags, 0);
    ck_assert_str_eq(kvs_strerror(KVS_OK), "success");
    ck_assert_str_eq(kvs_strerror(KVS_ENOTHELD), "block is not held by this session");
    ck_assert_str_eq(kvs_strerror(7), "unknown kvshare status");
    kvs_close(NULL);
    ck_assert_int_eq(kvs_connected(NULL), 0);
}
END_TEST

START_TEST(test_default_socket_path)
{
    char buf[256];
    setenv("KVSHARE_SOCKET", "/x/y.sock", 1);
    ck_assert_int_eq(kvs_default_socket_path(buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "/x/y.sock");
    unsetenv("KVSHARE_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
    ck_assert_int_eq(kvs_default_socket_path(buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "/run/user/1000/kvshare/kvshared.sock");
    unsetenv("XDG_RUNTIME_DIR");
    ck_assert_int_eq(kvs_default_socket_path(buf, sizeof(buf)), 0);
    if (geteuid() == 0)
        ck_assert_str_eq(buf, "/run/kvshare/kvshared.sock");
    else
        ck_assert_ptr_nonnull(strstr(buf, "/tmp/kvshare-"));
    ck_assert_int_eq(kvs_default_socket_path(buf, 4), KVS_EINVAL);
}
END_TEST

START_TEST(test_no_daemon)
{
    kvs_options_t o;
    kvs_client_t *c = (void *)1;
    kvs_options_init(&o);
    o.socket_path = "/nonexistent-dir/kvshared.sock";
    ck_assert_int_eq(kvs_connect(&o, &c), KVS_ENOTCONN);
    ck_assert_ptr_null(c);

    /* Lazy: a client that answers lookups with a miss. */
    o.flags = KVS_LAZY;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    ck_assert_int_eq(kvs_connected(c), 0);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(c), "is kvshared running? no socket at"));
    uint32_t tokens[32] = {1, 2, 3}, ids[2];
    size_t n = 77;
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 32, 1, ids, 2, &n), KVS_ENOTCONN);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvs_alloc(c, NULL, 1, ids), KVS_ENOTCONN);
    uintptr_t addr;
    ck_assert_int_eq(kvs_block_addr(c, 0, 0, 0, &addr), KVS_ENOTCONN);
    ck_assert_uint_eq(kvs_pool_base(c), 0);
    kvs_geometry_t g;
    ck_assert_int_eq(kvs_geometry(c, &g), KVS_ENOTCONN);
    ck_assert_int_eq(kvs_lookup(c, NULL, NULL, 4, 0, ids, 2, &n), KVS_EINVAL);
    kvs_close(c);

    /* With reconnect_ms, calls in between do not even try. */
    o.reconnect_ms = 60000;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 32, 1, ids, 2, &n), KVS_ENOTCONN);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(c), "retrying every 60000 ms"));
    kvs_close(c);

    /* Options from an older caller (a shorter struct) get defaults. */
    kvs_options_t old;
    kvs_options_init(&old);
    old.size = offsetof(kvs_options_t, flags);
    old.socket_path = "/nonexistent-dir/kvshared.sock";
    old.timeout_ms = 50;
    ck_assert_int_eq(kvs_connect(&old, &c), KVS_ENOTCONN);
    old.size = sizeof(old) + 8;
    ck_assert_int_eq(kvs_connect(&old, &c), KVS_EINVAL);
}
END_TEST

START_TEST(test_silent_server_times_out)
{
    char dir[SOCKET_PATH_MAX - sizeof("/s.sock")], path[SOCKET_PATH_MAX];
    ck_assert_int_eq(test_tmp_dir("kvs-client", dir, sizeof(dir)), 0);
    snprintf(path, sizeof(path), "%s/s.sock", dir);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);

    /* The kernel completes the connection from the backlog; nobody answers. */
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = path;
    o.timeout_ms = 200;
    ck_assert_int_eq(kvs_connect(&o, &c), KVS_ETIMEDOUT);
    o.flags = KVS_LAZY;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    ck_assert_ptr_nonnull(strstr(kvs_last_error(c), "did not answer within 200 ms"));
    uint32_t tokens[8] = {0}, ids[2];
    size_t n = 5;
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 8, 1, ids, 2, &n), KVS_ETIMEDOUT);
    ck_assert_uint_eq(n, 0);
    kvs_close(c);
    close(lfd);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* The hand-encoded Lookup frame decodes, with protobuf-c, to what was meant. */
START_TEST(test_wire_lookup_head)
{
    static const char *const names[] = {"", "tenant-a",
                                        "a-namespace-name-of-sixty-three-bytes-"
                                        "is-the-longest-allowed-xx"};
    static const size_t counts[] = {0, 1, 256, 4096, 100000};
    static const uint64_t ids[] = {1, 127, 128, 1ull << 40};
    uint32_t *tokens = malloc(100000 * sizeof(uint32_t));
    for (uint32_t i = 0; i < 100000; i++)
        tokens[i] = i * 2654435761u;
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t k = 0; k < 4; k++)
                for (int pin = 0; pin < 8; pin++) {
                    /* pin 2, 3 (and 6, 7): with a wait; 4 .. 7 with tier2_in_place */
                    uint32_t wait_ms = (pin & 3) >= 2 ? ((pin & 3) == 2 ? 5 : 60000) : 0;
                    int in_place = pin >= 4;
                    size_t tb = counts[b] * 4, head_len;
                    uint8_t *frame = malloc(WIRE_LOOKUP_HEAD_MAX(strlen(names[a])) + tb);
                    ck_assert_int_eq(wire_lookup_head(frame, ids[k], names[a], pin & 1, wait_ms,
                                                      in_place, tb, &head_len),
                                     0);
                    ck_assert_uint_le(head_len, WIRE_LOOKUP_HEAD_MAX(strlen(names[a])));
                    if (tb)
                        memcpy(frame + head_len, tokens, tb);
                    uint32_t len = frame_get_len(frame);
                    ck_assert_uint_eq(len + 4, head_len + tb);
                    Kvshare__Request *r = kvshare__request__unpack(NULL, len, frame + 4);
                    ck_assert_ptr_nonnull(r);
                    ck_assert_uint_eq(r->id, ids[k]);
                    ck_assert_int_eq(r->rpc_case, KVSHARE__REQUEST__RPC_LOOKUP);
                    ck_assert_str_eq(r->lookup->ns, names[a]);
                    ck_assert_int_eq(r->lookup->pin, pin & 1);
                    ck_assert_uint_eq(r->lookup->wait_ms, wait_ms);
                    ck_assert_int_eq(r->lookup->tier2_in_place, in_place);
                    ck_assert_uint_eq(r->lookup->tokens.len, tb);
                    if (tb)
                        ck_assert_int_eq(memcmp(r->lookup->tokens.data, tokens, tb), 0);
                    /* As long as what protobuf-c packs (pin comes before the tokens here). */
                    Kvshare__Request q = KVSHARE__REQUEST__INIT;
                    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
                    lk.ns = (char *)names[a];
                    lk.pin = pin & 1;
                    lk.wait_ms = wait_ms;
                    lk.tier2_in_place = in_place;
                    lk.tokens.data = (uint8_t *)tokens;
                    lk.tokens.len = tb;
                    q.id = ids[k];
                    q.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
                    q.lookup = &lk;
                    ck_assert_uint_eq(kvshare__request__get_packed_size(&q), len);
                    kvshare__request__free_unpacked(r, NULL);
                    free(frame);
                }
    free(tokens);
}
END_TEST

/* A Response packed by protobuf-c; *len its bytes. */
static uint8_t *pack_response(const Kvshare__Response *r, size_t *len)
{
    *len = kvshare__response__get_packed_size(r);
    uint8_t *b = malloc(*len ? *len : 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(kvshare__response__pack(r, b), *len);
    return b;
}

START_TEST(test_wire_lookup_reply)
{
    static const uint64_t ids[] = {0, 1, 127, 128, 1ull << 40, UINT64_MAX};
    static const size_t counts[] = {0, 1, 3, 256, 5000};
    static const uint32_t scalars[] = {0, 1, 127, 128, UINT32_MAX};
    uint32_t *blocks = malloc(5000 * sizeof(uint32_t));
    for (uint32_t i = 0; i < 5000; i++)
        blocks[i] = i * 2654435761u;
    const char *why = "";
    size_t taken = 0, mutants = 0;
    for (size_t k = 0; k < 6; k++)
        for (size_t a = 0; a < 5; a++)
            for (size_t b = 0; b < 5; b++)
                for (size_t v = 0; v < 5; v++) {
                    Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
                    Kvshare__LookupReply lr = KVSHARE__LOOKUP_REPLY__INIT;
                    lr.n_block_ids = counts[a];
                    lr.block_ids = blocks;
                    lr.n_tier2_block_ids = counts[b] / 2;
                    lr.tier2_block_ids = blocks + 1;
                    lr.hit_tokens = scalars[v];
                    lr.inflight_blocks = scalars[(v + 2) % 5];
                    lr.waited = v & 1;
                    resp.id = ids[k];
                    resp.rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
                    resp.lookup = &lr;
                    size_t len;
                    uint8_t *frame = pack_response(&resp, &len);
                    /* Every reply protobuf-c packs is read in place, alike. */
                    ck_assert_msg(wire_reply_diff(frame, len, &why) == 1, "%s", why);
                    taken++;
                    /* Cut short or with one byte changed: taken alike, or left
                     * to protobuf-c; never read otherwise. */
                    if (len < 64) {
                        for (size_t cut = 0; cut < len; cut++)
                            ck_assert_msg(wire_reply_diff(frame, cut, &why) >= 0, "%s", why);
                        for (size_t at = 0; at < len; at++)
                            for (unsigned x = 1; x < 256; x += 7) {
                                frame[at] ^= (uint8_t)x;
                                ck_assert_msg(wire_reply_diff(frame, len, &why) >= 0,
                                              "byte %zu ^ %u: %s", at, x, why);
                                frame[at] ^= (uint8_t)x;
                                mutants++;
                            }
                    }
                    /* An error, or a message, is protobuf-c's to read. */
                    resp.status = KVSHARE__STATUS__KVS_EPOOLFULL;
                    uint8_t *err = pack_response(&resp, &len);
                    ck_assert_int_eq(wire_reply_diff(err, len, &why), 0);
                    free(err);
                    resp.status = 0;
                    resp.message = "a message";
                    err = pack_response(&resp, &len);
                    ck_assert_int_eq(wire_reply_diff(err, len, &why), 0);
                    free(err);
                    free(frame);
                }
    ck_assert_uint_gt(mutants, 1000);
    /* Shapes the wire allows that are left to protobuf-c: ids not packed
     * (field 1, fixed32 wire type), packed ids in two pieces, a field
     * twice, another reply, an unknown field. */
    static const uint8_t unpacked[] = {0x08, 0x05, 0x5a, 0x0a, 0x0d, 1, 0, 0, 0, 0x0d, 2, 0, 0, 0};
    static const uint8_t pieces[] = {0x08, 0x05, 0x5a, 0x0c, 0x0a, 0x04, 1, 0,
                                     0,    0,    0x0a, 0x04, 2,    0,    0, 0};
    static const uint8_t twice[] = {0x08, 0x05, 0x5a, 0x04, 0x10, 0x01, 0x10, 0x02};
    static const uint8_t alloc[] = {0x08, 0x05, 0x62, 0x00};
    static const uint8_t unknown[] = {0x08, 0x05, 0x5a, 0x02, 0x30, 0x01};
    ck_assert_int_eq(wire_reply_diff(unpacked, sizeof(unpacked), &why), 0);
    ck_assert_int_eq(wire_reply_diff(pieces, sizeof(pieces), &why), 0);
    ck_assert_int_eq(wire_reply_diff(twice, sizeof(twice), &why), 0);
    ck_assert_int_eq(wire_reply_diff(alloc, sizeof(alloc), &why), 0);
    ck_assert_int_eq(wire_reply_diff(unknown, sizeof(unknown), &why), 0);
    Kvshare__Response *u = kvshare__response__unpack(NULL, sizeof(unpacked), unpacked);
    ck_assert_ptr_nonnull(u);
    ck_assert_uint_eq(u->lookup->n_block_ids, 2);
    kvshare__response__free_unpacked(u, NULL);
    ck_assert_uint_eq(taken, 750);
    free(blocks);
}
END_TEST

static Suite *client_suite(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("client");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_options_and_strerror);
    tcase_add_test(tc, test_default_socket_path);
    tcase_add_test(tc, test_no_daemon);
    tcase_add_test(tc, test_silent_server_times_out);
    tcase_add_test(tc, test_wire_lookup_head);
    tcase_add_test(tc, test_wire_lookup_reply);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(client_suite)
