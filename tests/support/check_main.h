/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The main() of every Check suite: run the suite its function builds (fork
 * mode as CK_FORK says; ctest sets it), ignore SIGPIPE (tests write to
 * sockets a daemon may close), and exit 0 only if every case passed.
 *
 *     static Suite *radix_suite(void) { ... }
 *     KVS_CHECK_MAIN(radix_suite)
 *
 * KVS_CHECK_MAIN_UNLESS(suite_fn, missing_fn): the same, but first
 * missing_fn() names what the suite needs and this machine lacks (NULL:
 * nothing); then the suite is skipped: "skipped: <why>", exit 77.
 */
#ifndef KVS_TEST_CHECK_MAIN_H
#define KVS_TEST_CHECK_MAIN_H

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#define KVS_CHECK_MAIN(suite_fn)                                                                   \
    int main(void)                                                                                 \
    {                                                                                              \
        signal(SIGPIPE, SIG_IGN);                                                                  \
        SRunner *sr = srunner_create(suite_fn());                                                  \
        srunner_run_all(sr, CK_NORMAL);                                                            \
        int failed = srunner_ntests_failed(sr);                                                    \
        srunner_free(sr);                                                                          \
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;                                          \
    }

#define KVS_CHECK_MAIN_UNLESS(suite_fn, missing_fn)                                                \
    int main(void)                                                                                 \
    {                                                                                              \
        const char *missing = missing_fn();                                                        \
        if (missing) {                                                                             \
            printf("skipped: %s\n", missing);                                                      \
            return 77;                                                                             \
        }                                                                                          \
        signal(SIGPIPE, SIG_IGN);                                                                  \
        SRunner *sr = srunner_create(suite_fn());                                                  \
        srunner_run_all(sr, CK_NORMAL);                                                            \
        int failed = srunner_ntests_failed(sr);                                                    \
        srunner_free(sr);                                                                          \
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;                                          \
    }

#endif /* KVS_TEST_CHECK_MAIN_H */
