/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A session's reads on a real socket and loop (net/session.c): one read
 * that answers frames per session per loop iteration. libuv reads a stream
 * again while each read fills its buffer; a frame that ends exactly at the
 * end of a read's buffer used to let the next request of the same client
 * run in the same iteration, and so on up to 16 requests, none of the
 * other sessions polled meanwhile.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "kvshared.h"
#include "log.h"
#include "raw_wire.h"
#include "test_tmp.h"
#include "test_server.h"

/* The bytes a session's read asks for when no larger frame is pending
 * (net/session.c, SESSION_READ_CHUNK): a frame of exactly this size fills a
 * fresh session's first read. */
#define READ_CHUNK 65536

static uv_loop_t loop;
static server_t *srv;
static char dir[256], sock[300];

static void setup(void)
{
    server_config_t cfg;
    char err[256];
    log_level = LOG_LEVEL_WARN;
    ck_assert_int_eq(test_tmp_dir("kvs-reads", dir, sizeof(dir)), 0);
    snprintf(sock, sizeof(sock), "%s/kvshared.sock", dir);
    test_server_config(&cfg, 4, 16);
    cfg.socket_path = sock;
    srv = test_server_open(&loop, &cfg);
    ck_assert_msg(server_listen(srv, false, err, sizeof(err)) == 0, "listen: %s", err);
}

static void teardown(void)
{
    test_server_close(&loop, srv, true);
    srv = NULL;
    unlink(sock);
    rmdir(dir);
}

/* A Ping frame of exactly len bytes (header included). */
static uint8_t *ping_of(size_t len)
{
    for (size_t payload = len > 64 ? len - 64 : 0; payload < len; payload++) {
        size_t got = 0;
        uint8_t *f = raw_ping_frames(payload, 1, &got);
        ck_assert_ptr_nonnull(f);
        if (got == len)
            return f;
        free(f);
    }
    ck_abort_msg("no Ping frame of %zu bytes", len);
    return NULL;
}

/* A connected client whose session the loop has accepted. */
static int client(void)
{
    int fd = raw_connect(sock);
    ck_assert_int_ge(fd, 0);
    for (int i = 0; i < 1000 && list_empty(&srv->sessions); i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    ck_assert_msg(!list_empty(&srv->sessions), "the daemon did not accept the connection");
    return fd;
}

static bool reply_within(int fd, int ms)
{
    Kvshare__Response *r = raw_read_reply(fd, ms);
    if (!r)
        return false;
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->rpc_case, KVSHARE__RESPONSE__RPC_PING);
    kvshare__response__free_unpacked(r, NULL);
    return true;
}

/* Two Pings sent at once, the first exactly one read's buffer: the first is
 * answered in one loop iteration, the second only in the next. */
START_TEST(test_one_answering_read_per_poll)
{
    int fd = client();
    uint8_t *first = ping_of(READ_CHUNK);
    size_t second_len = 0;
    uint8_t *second = raw_ping_frames(16, 1, &second_len);
    ck_assert_ptr_nonnull(second);
    uint8_t *both = malloc(READ_CHUNK + second_len);
    ck_assert_ptr_nonnull(both);
    memcpy(both, first, READ_CHUNK);
    memcpy(both + READ_CHUNK, second, second_len);
    ck_assert_int_eq(raw_write_all(fd, both, READ_CHUNK + second_len), 0);

    uv_run(&loop, UV_RUN_ONCE);
    ck_assert_msg(reply_within(fd, 5000), "the first Ping was not answered");
    ck_assert_msg(!reply_within(fd, 100),
                  "the second Ping was answered in the same loop iteration as the first");
    uv_run(&loop, UV_RUN_ONCE);
    ck_assert_msg(reply_within(fd, 5000), "the second Ping was not answered in the next iteration");

    /* The session goes on as before: a plain Ping, answered. */
    ck_assert_int_eq(raw_write_all(fd, second, second_len), 0);
    uv_run(&loop, UV_RUN_ONCE);
    ck_assert_msg(reply_within(fd, 5000), "a later Ping was not answered");
    close(fd);
    free(both);
    free(first);
    free(second);
}
END_TEST

static Suite *reads_suite(void)
{
    Suite *s = suite_create("session_reads");
    TCase *tc = tcase_create("reads");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_one_answering_read_per_poll);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(reads_suite)
