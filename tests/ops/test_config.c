/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the config file parser (config.c), the namespace table
 * (namespaces.c) and the Prometheus text (metrics_text.c), without a socket.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "config.h"
#include "log.h"
#include "metrics_http.h"
#include "metrics_text.h"
#include "kvshared.h"
#include "settings.h"
#include "namespaces.h"
#include "test_tmp.h"
#include "test_server.h"

static char path[256];

static void write_file(const char *text)
{
    int fd = test_tmp_file("kvs-config", path, sizeof(path));
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static int load(const char *text, config_t **out, char *err, size_t errlen)
{
    write_file(text);
    int rc = config_load(path, out, err, errlen);
    unlink(path);
    return rc;
}

START_TEST(test_valid_file_is_read)
{
    config_t *c = NULL;
    char err[1024];
    ck_assert_int_eq(load("# comment\n"
                          "; another\n"
                          "\n"
                          "  pool_blocks = 64   # trailing comment\n"
                          "socket = \"/run/x y/k.sock\"\n"
                          "dynamic_namespaces = on\n"
                          "allow_uids = 0, 1000\n"
                          "[namespace chat]\n"
                          "quota = 32\n"
                          "reserve = 8\n"
                          "allow_gids = 0\n"
                          "[namespace long.ctx-1]\n",
                          &c, err, sizeof(err)),
                     0);
    ck_assert_uint_eq(c->n_entries, 4);
    ck_assert_str_eq(c->entries[0].setting->key, "pool_blocks");
    ck_assert_str_eq(c->entries[0].setting->flag, "pool-blocks");
    ck_assert_str_eq(c->entries[0].value, "64");
    ck_assert_int_eq(c->entries[0].line, 4);
    ck_assert_str_eq(c->entries[1].value, "/run/x y/k.sock");
    ck_assert_str_eq(c->entries[2].value, "on");
    ck_assert_uint_eq(c->n_ns, 2);
    const config_ns_t *chat = config_find_ns(c, "chat");
    ck_assert_ptr_nonnull(chat);
    ck_assert_uint_eq(chat->quota, 32);
    ck_assert_uint_eq(chat->reserve, 8);
    ck_assert_uint_eq(chat->acl.n_gids, 1);
    ck_assert_int_eq(chat->line, 8);
    ck_assert_ptr_nonnull(config_find_ns(c, "long.ctx-1"));
    ck_assert_ptr_null(config_find_ns(c, "other"));
    config_free(c);
    config_free(NULL);
}
END_TEST

START_TEST(test_every_error_has_its_line)
{
    config_t *c = NULL;
    char err[2048];
    ck_assert_int_eq(load("pool_blocks = 0\n"
                          "backend = gpu\n"
                          "max_frame = 10\n"
                          "nonsense\n"
                          "metrics_listen = localhost:99999\n"
                          "pool_blocks = 5\n"
                          "[namespace bad name]\n"
                          "[namespace ok]\n"
                          "quota = -3\n"
                          "reserve =\n"
                          "allow_uids = no-such-user-here\n",
                          &c, err, sizeof(err)),
                     KVS_EINVAL);
    ck_assert_ptr_null(c);
    const char *want[] = {":1: pool_blocks",
                          ":2: backend = 'gpu'",
                          ":3: max_frame",
                          ":4: 'nonsense'",
                          ":5: metrics_listen",
                          ":6: pool_blocks is set twice",
                          ":7: ",
                          ":9: quota = '-3'",
                          ":10: reserve has no value",
                          ":11: allow_uids = "};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ck_assert_msg(strstr(err, want[i]), "missing '%s' in:\n%s", want[i], err);
    ck_assert_int_eq(config_load("/nonexistent/kvshared.conf", &c, err, sizeof(err)), KVS_EIO);
}
END_TEST

START_TEST(test_ids_bools_acls)
{
    uint32_t ids[CONFIG_MAX_IDS], n = 0;
    bool b;
    ck_assert_int_eq(config_parse_ids("root, 17,4", false, ids, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(ids[0], 0);
    ck_assert_uint_eq(ids[2], 4);
    ck_assert_int_eq(config_parse_ids("-1", false, ids, &n), KVS_EINVAL);
    ck_assert_int_eq(config_parse_ids("no-such-group-here", true, ids, &n), KVS_EINVAL);
    ck_assert_int_eq(config_parse_bool("Yes", &b), 0);
    ck_assert(b);
    ck_assert_int_eq(config_parse_bool("off", &b), 0);
    ck_assert(!b);
    ck_assert_int_eq(config_parse_bool("maybe", &b), KVS_EINVAL);

    config_acl_t acl = {0};
    char text[128];
    ck_assert(config_acl_allows(&acl, 5, 5));
    config_acl_describe(&acl, text, sizeof(text));
    ck_assert_str_eq(text, "anyone");
    acl.n_uids = 1;
    acl.uids[0] = 1000;
    acl.n_gids = 2;
    acl.gids[0] = 27;
    acl.gids[1] = 28;
    ck_assert(config_acl_allows(&acl, 1000, 1));
    ck_assert(config_acl_allows(&acl, 1, 28));
    ck_assert(!config_acl_allows(&acl, 1, 1));
    config_acl_describe(&acl, text, sizeof(text));
    ck_assert_str_eq(text, "uids 1000 gids 27,28");
}
END_TEST

static uv_loop_t loop;
static server_t *srv;

static void setup(void)
{
    server_config_t cfg;
    log_level = LOG_LEVEL_ERROR;
    test_server_config(&cfg, 4, 64);
    srv = test_server_open(&loop, &cfg);
}

static void teardown(void)
{
    test_server_close(&loop, srv, false);
    srv = NULL;
}

START_TEST(test_tenants_apply_and_reapply)
{
    config_t *c = NULL;
    char err[512];
    ck_assert_int_eq(
        load("[namespace a]\nquota = 32\nreserve = 16\n[namespace b]\n", &c, err, sizeof(err)), 0);
    ck_assert_int_eq(namespaces_apply(srv, c, err, sizeof(err)), 0);
    uint32_t a, b;
    radix_ns_stats_t st;
    ck_assert_int_eq(radix_ns_find(srv->index, "a", &a), 0);
    ck_assert_int_eq(radix_ns_find(srv->index, "b", &b), 0);
    ck_assert_int_eq(radix_ns_stats(srv->index, a, &st), 0);
    ck_assert_uint_eq(st.quota, 32);
    ck_assert_uint_eq(st.reserve, 16);
    srv->cfg.dynamic_namespaces = false;
    ck_assert(namespaces_usable(srv, a));

    /* Reservations over the pool: refused, nothing changes. */
    ck_assert_int_eq(
        load("[namespace a]\nreserve = 40\n[namespace b]\nreserve = 40\n", &c, err, sizeof(err)),
        0);
    ck_assert_int_eq(namespaces_apply(srv, c, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "80 blocks"));
    config_free(c);
    ck_assert_int_eq(radix_ns_stats(srv->index, a, &st), 0);
    ck_assert_uint_eq(st.reserve, 16);

    /* "a" dropped from the file: undeclared, limits gone. */
    ck_assert_int_eq(load("[namespace b]\nquota = 8\n", &c, err, sizeof(err)), 0);
    ck_assert_int_eq(namespaces_apply(srv, c, err, sizeof(err)), 0);
    ck_assert(!namespaces_usable(srv, a));
    ck_assert(namespaces_usable(srv, b));
    ck_assert_int_eq(radix_ns_stats(srv->index, a, &st), 0);
    ck_assert_uint_eq(st.quota, 0);
    ck_assert_uint_eq(st.reserve, 0);
}
END_TEST

/* Every family's HELP and TYPE come first and its samples follow together;
 * every sample line is "name{labels} number". */
START_TEST(test_metrics_text_format)
{
    char *text = NULL;
    size_t len = 0;
    uint32_t ns;
    ck_assert_int_eq(radix_ns_create(srv->index, "x\"y", 1, 0, 0, &ns), 0);
    ck_assert_int_eq(metrics_render(srv, &text, &len), 0);
    ck_assert_uint_eq(strlen(text), len);
    ck_assert_ptr_nonnull(strstr(text, "kvshare_blocks{state=\"free\"} 64\n"));
    ck_assert_ptr_nonnull(strstr(text, "namespace=\"x\\\"y\""));
    ck_assert_ptr_nonnull(
        strstr(text, "kvshare_rpc_duration_seconds_bucket{rpc=\"Lookup\",le=\"+Inf\"} 0"));
    enum { MAX_FAMILIES = 128 };
    char family[128] = "", seen[MAX_FAMILIES][128];
    int n_seen = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "# TYPE ", 7) == 0) {
            sscanf(line + 7, "%127s", family);
            for (int i = 0; i < n_seen; i++)
                ck_assert_msg(strcmp(seen[i], family) != 0, "family %s twice", family);
            ck_assert_int_lt(n_seen, MAX_FAMILIES);
            snprintf(seen[n_seen++], sizeof(seen[0]), "%s", family);
            continue;
        }
        if (line[0] == '#')
            continue;
        ck_assert_msg(strncmp(line, family, strlen(family)) == 0, "'%s' outside family %s", line,
                      family);
        char *space = strrchr(line, ' ');
        ck_assert_ptr_nonnull(space);
        char *end;
        strtod(space + 1, &end);
        ck_assert_msg(*end == '\0', "bad value in '%s'", line);
    }
    free(text);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("ops_config");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_valid_file_is_read);
    tcase_add_test(tc, test_every_error_has_its_line);
    tcase_add_test(tc, test_ids_bools_acls);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("server");
    tcase_set_timeout(tt, 30);
    tcase_add_checked_fixture(tt, setup, teardown);
    tcase_add_test(tt, test_tenants_apply_and_reapply);
    tcase_add_test(tt, test_metrics_text_format);
    suite_add_tcase(s, tt);
    return s;
}

KVS_CHECK_MAIN(config_suite)
