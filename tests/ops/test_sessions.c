/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvs_sessions and `kvshare sessions` against a real daemon: two workers
 * with different names, one holding pins and WRITING blocks in a namespace
 * it created; the list gives both with their holdings, and the CLI's table
 * and --json name both.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"

static harness_t h;

static void setup(void)
{
    ck_assert_int_eq(harness_start(&h, 64, NULL), 0);
}

static void teardown(void)
{
    harness_cleanup(&h);
}

/* alpha: 2 blocks committed (one pin each) in tenant-a, 3 WRITING blocks;
 * beta: a ping, nothing held. */
static void hold_some(kvs_client_t *alpha, kvs_client_t *beta)
{
    uint32_t tokens[8] = {11, 12, 13, 14, 15, 16, 17, 18};
    uint32_t ids[4], canonical[2];
    size_t n = 0;
    ck_assert_int_eq(kvs_lookup(alpha, "tenant-a", tokens, 8, 1, ids, 4, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvs_alloc(alpha, "tenant-a", 2, ids), 0);
    ck_assert_int_eq(kvs_commit(alpha, "tenant-a", tokens, 8, ids, 2, canonical, &n), 0);
    ck_assert_uint_eq(n, 2);
    uint32_t more[3];
    ck_assert_int_eq(kvs_alloc(alpha, "tenant-a", 3, more), 0);
    ck_assert_int_eq(kvs_ping(beta, 0, NULL), 0);
}

static const kvs_session_info_t *find(const kvs_session_info_t *rows, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].worker, name) == 0)
            return &rows[i];
    return NULL;
}

START_TEST(lists_both_workers_with_their_holdings)
{
    kvs_client_t *alpha = harness_client(&h, "worker-alpha", 0);
    kvs_client_t *beta = harness_client(&h, "worker-beta", 0);
    hold_some(alpha, beta);

    kvs_session_info_t *rows = NULL;
    size_t n = 0;
    ck_assert_int_eq(kvs_sessions(beta, &rows, &n), 0);
    ck_assert_uint_eq(n, 2);
    const kvs_session_info_t *a = find(rows, n, "worker-alpha");
    const kvs_session_info_t *b = find(rows, n, "worker-beta");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(a->pins, 2);
    ck_assert_uint_eq(a->pins_total, 2);
    ck_assert_uint_eq(a->writing, 3);
    ck_assert_uint_eq(a->n_namespaces, 1);
    ck_assert_str_eq(a->namespaces[0], "tenant-a");
    ck_assert_int_eq(a->pid, (int)getpid());
    ck_assert_uint_eq(a->uid, (unsigned)getuid());
    ck_assert_uint_ge(a->requests, 5);
    ck_assert_int_eq(a->held, 0);
    ck_assert_uint_eq(b->pins, 0);
    ck_assert_uint_eq(b->writing, 0);
    ck_assert_uint_eq(b->n_namespaces, 0);
    ck_assert_uint_lt(b->age_s, 60);
    ck_assert_uint_lt(b->idle_s, 60);
    ck_assert_uint_ne(a->id, b->id);
    kvs_sessions_free(rows, n);

    /* Once alpha has gone, only beta is left. */
    kvs_close(alpha);
    for (int tries = 0; tries < 200; tries++) {
        ck_assert_int_eq(kvs_sessions(beta, &rows, &n), 0);
        int gone = n == 1;
        if (gone)
            ck_assert_str_eq(rows[0].worker, "worker-beta");
        kvs_sessions_free(rows, n);
        if (gone)
            break;
        usleep(10000);
    }
    ck_assert_uint_eq(n, 1);
    kvs_close(beta);
}
END_TEST

/* Runs `kvshare sessions ARGS` against the harness; its stdout in out. */
static int run_cli(const char *args, char *out, size_t len)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s' sessions --socket '%s' %s", KVSHARE_CLI_PATH, h.socket_path,
             args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t got = fread(out, 1, len - 1, p);
    out[got] = '\0';
    return pclose(p);
}

START_TEST(cli_names_both_workers)
{
    kvs_client_t *alpha = harness_client(&h, "worker-alpha", 0);
    kvs_client_t *beta = harness_client(&h, "worker-beta", 0);
    hold_some(alpha, beta);

    static char out[16384];
    ck_assert_int_eq(run_cli("", out, sizeof(out)), 0);
    ck_assert_ptr_nonnull(strstr(out, "WORKER"));
    ck_assert_ptr_nonnull(strstr(out, "NAMESPACES"));
    ck_assert_ptr_nonnull(strstr(out, "worker-alpha"));
    ck_assert_ptr_nonnull(strstr(out, "worker-beta"));
    ck_assert_ptr_nonnull(strstr(out, "tenant-a"));
    /* Two workers and the CLI's own connection, under the header. */
    int lines = 0;
    for (const char *c = out; *c; c++)
        lines += *c == '\n';
    ck_assert_int_eq(lines, 4);

    ck_assert_int_eq(run_cli("--json", out, sizeof(out)), 0);
    ck_assert_ptr_nonnull(strstr(out, "{\"sessions\":["));
    ck_assert_ptr_nonnull(strstr(out, "\"worker\":\"worker-alpha\""));
    ck_assert_ptr_nonnull(strstr(out, "\"worker\":\"worker-beta\""));
    ck_assert_ptr_nonnull(strstr(out, "\"namespaces\":[\"tenant-a\"],\"pins\":2"));
    ck_assert_ptr_nonnull(strstr(out, "\"writing\":3"));

    ck_assert_int_eq(run_cli("--bogus 2>/dev/null", out, sizeof(out)) >> 8, 2);
    kvs_close(alpha);
    kvs_close(beta);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("sessions");
    TCase *tc = tcase_create("sessions");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, lists_both_workers_with_their_holdings);
    tcase_add_test(tc, cli_names_both_workers);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(suite)
