/*
 * libkvshare without a daemon: options, status texts, the default socket
 * path, and calls that must fail fast (no daemon) or time out (a server that
 * accepts and never answers) instead of hanging.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvshare.h"

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
}
END_TEST

START_TEST(test_silent_server_times_out)
{
    char dir[] = "/tmp/kvs-client-XXXXXX", path[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
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

int main(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("client");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_options_and_strerror);
    tcase_add_test(tc, test_default_socket_path);
    tcase_add_test(tc, test_no_daemon);
    tcase_add_test(tc, test_silent_server_times_out);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
