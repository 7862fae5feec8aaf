/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvshare refuses a daemon run by another user: a process of another uid
 * listens where the worker expects kvshared (the socket-squatting attack), and
 * the client must refuse it before sending a byte, saying why; naming that
 * uid in kvs_options_t.daemon_uid lets it through.
 *
 * Needs root (to run the fake daemon as another uid); elsewhere it exits 77
 * and ctest reports it as skipped.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvshare.h"

#define OTHER_UID 4242424u /* a uid no test process has */

/* The fake daemon: as OTHER_UID, listens on path, then for each of n
 * connections reports on report_fd how many bytes the client sent before it
 * hung up (or before 300 ms of silence). */
static void fake_daemon(const char *path, int ready_fd, int report_fd, int n)
{
    if (setresgid(OTHER_UID, OTHER_UID, OTHER_UID) != 0 ||
        setresuid(OTHER_UID, OTHER_UID, OTHER_UID) != 0)
        _exit(2);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(lfd, 4) != 0)
        _exit(3);
    chmod(path, 0666);
    if (write(ready_fd, "R", 1) != 1)
        _exit(4);
    for (int i = 0; i < n; i++) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            _exit(5);
        struct timeval tv = {.tv_usec = 300000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        long total = 0;
        char buf[4096];
        ssize_t got;
        while ((got = read(fd, buf, sizeof(buf))) > 0)
            total += got;
        if (write(report_fd, &total, sizeof(total)) != sizeof(total))
            _exit(6);
        close(fd);
    }
    _exit(0);
}

START_TEST(test_daemon_of_another_user_is_refused)
{
    char dir[96] = "/tmp/kvs-squat-XXXXXX", path[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chown(dir, OTHER_UID, OTHER_UID), 0);
    snprintf(path, sizeof(path), "%s/kvshared.sock", dir);
    int ready[2], report[2];
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(report), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        fake_daemon(path, ready[1], report[1], 3);
    char r;
    ck_assert_int_eq(read(ready[0], &r, 1), 1);

    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = path;
    o.timeout_ms = 200;
    o.flags = KVS_NO_MAP | KVS_LAZY;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    ck_assert_int_eq(kvs_connected(c), 0);
    const char *why = kvs_last_error(c);
    ck_assert_msg(strstr(why, "uid 4242424") && strstr(why, "refused the daemon") &&
                      strstr(why, "Nothing was sent"),
                  "%s", why);
    uint32_t tokens[8] = {1, 2, 3}, ids[1];
    size_t n = 9;
    ck_assert_int_eq(kvs_lookup(c, NULL, tokens, 8, 0, ids, 1, &n), KVS_EDENIED);
    ck_assert_uint_eq(n, 0);
    kvs_close(c);
    /* Both connections (kvs_connect's and the lookup's retry) sent nothing. */
    for (int i = 0; i < 2; i++) {
        long sent = -1;
        ck_assert_int_eq(read(report[0], &sent, sizeof(sent)), sizeof(sent));
        ck_assert_int_eq(sent, 0);
    }

    /* Named in the options, the same peer is trusted: the client says Hello
     * (and times out, the fake never answers). */
    o.flags = KVS_NO_MAP;
    o.daemon_uid = OTHER_UID;
    ck_assert_int_eq(kvs_connect(&o, &c), KVS_ETIMEDOUT);
    long sent = -1;
    ck_assert_int_eq(read(report[0], &sent, sizeof(sent)), sizeof(sent));
    ck_assert_int_gt(sent, 0);

    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(path);
    rmdir(dir);

    /* A service account's daemon in a directory root gave it (a root-owned
     * parent no one else can write, like systemd's /run/kvshare): trusted
     * without options. */
    char parent[] = "/tmp/kvs-run-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(parent));
    ck_assert_int_eq(chmod(parent, 0755), 0);
    snprintf(dir, sizeof(dir), "%s/kvshare", parent);
    ck_assert_int_eq(mkdir(dir, 0750), 0);
    ck_assert_int_eq(chown(dir, OTHER_UID, OTHER_UID), 0);
    snprintf(path, sizeof(path), "%s/kvshared.sock", dir);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        fake_daemon(path, ready[1], report[1], 1);
    ck_assert_int_eq(read(ready[0], &r, 1), 1);
    kvs_options_init(&o);
    o.socket_path = path;
    o.timeout_ms = 200;
    o.flags = KVS_NO_MAP;
    ck_assert_int_eq(kvs_connect(&o, &c), KVS_ETIMEDOUT);
    ck_assert_int_eq(read(report[0], &sent, sizeof(sent)), sizeof(sent));
    ck_assert_int_gt(sent, 0);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(path);
    rmdir(dir);
    rmdir(parent);
}
END_TEST

int main(void)
{
    if (geteuid() != 0) {
        printf("skipped: running a fake daemon as another uid needs root\n");
        return 77;
    }
    Suite *s = suite_create("peer_trust");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_daemon_of_another_user_is_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
