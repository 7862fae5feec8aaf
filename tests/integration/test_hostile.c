/*
 * Hostile clients against a real kvshared: attacks found from outside the
 * project (docs/RELIABILITY.md, "Attacks from outside"), each shown to hold.
 * The hostile side writes raw frames; the others use libkvshare. Nothing
 * here waits for time to pass: each test waits for an event (a reply, a
 * close) and checks counts.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "raw_wire.h"

#define BT 4

static int hostile_connect(const harness_t *d)
{
    int fd = raw_connect(d->socket_path);
    ck_assert_msg(fd >= 0, "connect: %s", strerror(errno));
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* n copies of req as frames, in one buffer. */
static uint8_t *frames(const Kvshare__Request *req, size_t n, size_t *len)
{
    size_t body = kvshare__request__get_packed_size(req);
    uint8_t *buf = malloc((4 + body) * n);
    ck_assert_ptr_nonnull(buf);
    for (size_t i = 0; i < n; i++) {
        uint8_t *f = buf + i * (4 + body);
        f[0] = (uint8_t)body;
        f[1] = (uint8_t)(body >> 8);
        f[2] = (uint8_t)(body >> 16);
        f[3] = (uint8_t)(body >> 24);
        kvshare__request__pack(req, f + 4);
    }
    *len = (4 + body) * n;
    return buf;
}

static void write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        ck_assert_msg(w > 0, "send: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
}

/* Reads one whole frame; returns its body (free it) and *len, or NULL at
 * EOF. */
static uint8_t *read_frame(int fd, size_t *len)
{
    uint8_t hdr[4];
    size_t got = 0;
    while (got < 4) {
        ssize_t r = read(fd, hdr + got, 4 - got);
        if (r == 0 && got == 0)
            return NULL;
        ck_assert_msg(r > 0, "read: %s", r < 0 ? strerror(errno) : "EOF mid-header");
        got += (size_t)r;
    }
    *len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
    uint8_t *body = malloc(*len ? *len : 1);
    ck_assert_ptr_nonnull(body);
    for (got = 0; got < *len;) {
        ssize_t r = read(fd, body + got, *len - got);
        ck_assert_msg(r > 0, "read: %s", r < 0 ? strerror(errno) : "EOF mid-frame");
        got += (size_t)r;
    }
    return body;
}

static kvs_client_t *client_of(const harness_t *d)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = d->socket_path;
    o.flags = KVS_NO_MAP;
    o.timeout_ms = 30000;
    int rc = kvs_connect(&o, &c);
    ck_assert_msg(rc == 0, "connect: %s", kvs_strerror(rc));
    return c;
}

/* Fills the index with n_prompts prompts of 4 blocks each. */
static void fill(kvs_client_t *c, uint32_t n_prompts)
{
    uint32_t tokens[4 * BT], ids[4], canon[4];
    size_t n;
    for (uint32_t p = 0; p < n_prompts; p++) {
        for (uint32_t i = 0; i < 4 * BT; i++)
            tokens[i] = p * 1000 + i;
        ck_assert_int_eq(kvs_alloc(c, NULL, 4, ids), 0);
        ck_assert_int_eq(kvs_commit(c, NULL, tokens, 4 * BT, ids, 4, canon, &n), 0);
        ck_assert_int_eq(kvs_release(c, ids, 4, NULL), 0);
    }
}

/* Requests the daemon has answered so far (Stats' own included). */
static uint64_t answered(kvs_client_t *c)
{
    kvs_stats_t st;
    ck_assert_int_eq(kvs_stats(c, &st), 0);
    uint64_t n = st.requests;
    kvs_stats_free(&st);
    return n;
}

/* One client pipelines 1,000 Trees (each a walk of the whole index); before
 * the fix they were all answered before any other client was, freezing
 * every worker for seconds on a large index. Now another client's Lookup is
 * answered while most of the Trees still wait. */
START_TEST(test_tree_flood_does_not_freeze_others)
{
    harness_t d;
    ck_assert_int_eq(harness_start(&d, 4096, NULL), 0);
    kvs_client_t *c = client_of(&d);
    fill(c, 1000);
    uint64_t before = answered(c);

    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__TreeRequest tr = KVSHARE__TREE_REQUEST__INIT;
    tr.max = 1000;
    req.rpc_case = KVSHARE__REQUEST__RPC_TREE;
    req.tree = &tr;
    size_t len;
    uint8_t *flood = frames(&req, 1000, &len);
    int fd = hostile_connect(&d);
    write_all(fd, flood, len);
    free(flood);
    /* The daemon is on the flood once its first reply is out. */
    uint8_t *first = read_frame(fd, &len);
    ck_assert_ptr_nonnull(first);
    free(first);

    uint32_t tokens[4 * BT], ids[4];
    for (uint32_t i = 0; i < 4 * BT; i++)
        tokens[i] = 7 * 1000 + i;
    size_t n = 0;
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 4 * BT, 0, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 4);
    uint64_t trees = answered(c) - before - 2; /* less the Lookup and this Stats */
    ck_assert_msg(trees < 500, "%llu of 1000 pipelined Trees answered before one Lookup",
                  (unsigned long long)trees);
    close(fd);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&d), 0);
    harness_cleanup(&d);
}
END_TEST

/* 200 pipelined 4 KiB Pings, then shutdown(SHUT_WR): every reply arrives
 * before the daemon closes (before the fix, about a quarter did). */
START_TEST(test_half_close_gets_every_reply)
{
    harness_t d;
    ck_assert_int_eq(harness_start(&d, 64, NULL), 0);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PingRequest pr = KVSHARE__PING_REQUEST__INIT;
    static uint8_t payload[4096];
    pr.payload.data = payload;
    pr.payload.len = sizeof(payload);
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &pr;
    size_t len;
    uint8_t *buf = frames(&req, 200, &len);
    int fd = hostile_connect(&d);
    write_all(fd, buf, len);
    free(buf);
    ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
    int replies = 0;
    uint8_t *body;
    while ((body = read_frame(fd, &len)) != NULL) {
        Kvshare__Response *resp = kvshare__response__unpack(NULL, len, body);
        ck_assert_ptr_nonnull(resp);
        ck_assert_int_eq(resp->status, 0);
        ck_assert_int_eq(resp->rpc_case, KVSHARE__RESPONSE__RPC_PING);
        kvshare__response__free_unpacked(resp, NULL);
        free(body);
        replies++;
    }
    close(fd);
    ck_assert_int_eq(replies, 200);
    ck_assert_int_eq(harness_stop(&d), 0);
    harness_cleanup(&d);
}
END_TEST

static Suite *hostile_suite(void)
{
    Suite *s = suite_create("hostile");
    TCase *tc = tcase_create("daemon");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tree_flood_does_not_freeze_others);
    tcase_add_test(tc, test_half_close_gets_every_reply);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(hostile_suite)
