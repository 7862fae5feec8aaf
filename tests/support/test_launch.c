/* SPDX-License-Identifier: Apache-2.0 */
/* launch.c: READY within the deadline, an exit reported with its status, a
 * silent daemon killed at the deadline, and stop's own deadline. The
 * "daemons" are shell one-liners: launch_daemon appends "--ready-fd N", which
 * the shell sees as $1 and $2. */
#include <check.h>
#include <signal.h>
#include <unistd.h>

#include "check_main.h"
#include "launch.h"
#include "now.h"

START_TEST(test_ready)
{
    const char *const argv[] = {"/bin/sh", "-c", "echo READY >&\"$2\"; exec sleep 30", "sh", NULL};
    int status = 99;
    pid_t pid = launch_daemon(argv, 10000, &status);
    ck_assert_int_gt(pid, 0);
    ck_assert_int_eq(status, -1);
    ck_assert_int_eq(kill(pid, 0), 0);                      /* still running */
    ck_assert_int_eq(launch_stop(pid, SIGTERM, 10000), -1); /* ended by the signal */
}
END_TEST

START_TEST(test_exit_status)
{
    const char *const argv[] = {"/bin/sh", "-c", "exit 3", "sh", NULL};
    int status = 99;
    ck_assert_int_eq(launch_daemon(argv, 10000, &status), -1);
    ck_assert_int_eq(status, 3);
    const char *const missing[] = {"/nonexistent/kvshared", NULL};
    ck_assert_int_eq(launch_daemon(missing, 10000, &status), -1);
    ck_assert_int_eq(status, 127);
}
END_TEST

START_TEST(test_silent_daemon_times_out)
{
    const char *const argv[] = {"/bin/sh", "-c", "exec sleep 30", "sh", NULL};
    int status = 99;
    int64_t t0 = now_ms();
    ck_assert_int_eq(launch_daemon(argv, 300, &status), -1);
    ck_assert_int_eq(status, -1);
    int64_t took = now_ms() - t0;
    ck_assert_msg(took >= 300 && took < 5000, "took %lld ms", (long long)took);
}
END_TEST

START_TEST(test_wrong_line_or_closed_pipe)
{
    const char *const argv[] = {"/bin/sh", "-c", "echo HELLO >&\"$2\"; exec sleep 30", "sh", NULL};
    int status = 99;
    int64_t t0 = now_ms();
    ck_assert_int_eq(launch_daemon(argv, 300, &status), -1);
    ck_assert_int_eq(status, -1); /* silent after the wrong line: killed */
    ck_assert_int_lt(now_ms() - t0, 5000);
    /* Closes the pipe without a word, then exits 0. */
    const char *const closes[] = {"/bin/sh", "-c", "eval \"exec $2>&-\"; sleep 0.2; exit 0", "sh",
                                  NULL};
    ck_assert_int_eq(launch_daemon(closes, 10000, &status), -1);
    ck_assert_int_eq(status, 0);
}
END_TEST

START_TEST(test_stop_deadline)
{
    /* Ignores SIGTERM: stop kills it at its deadline. */
    const char *const argv[] = {"/bin/sh", "-c",
                                "trap '' TERM; echo READY >&\"$2\"; while :; do sleep 1; done",
                                "sh", NULL};
    pid_t pid = launch_daemon(argv, 10000, NULL);
    ck_assert_int_gt(pid, 0);
    int64_t t0 = now_ms();
    ck_assert_int_eq(launch_stop(pid, SIGTERM, 300), -1);
    ck_assert_int_lt(now_ms() - t0, 5000);
    ck_assert_int_ne(kill(pid, 0), 0); /* gone and reaped */
}
END_TEST

static Suite *launch_suite(void)
{
    Suite *s = suite_create("launch");
    TCase *tc = tcase_create("launch");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_ready);
    tcase_add_test(tc, test_exit_status);
    tcase_add_test(tc, test_silent_daemon_times_out);
    tcase_add_test(tc, test_wrong_line_or_closed_pipe);
    tcase_add_test(tc, test_stop_deadline);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(launch_suite)
