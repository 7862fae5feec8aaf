/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The counter list (kvshare_counters.h) reaches every place that carries a
 * counter: the daemon's metrics_t, the Stats reply, /metrics, the client
 * library's names. The C parts are generated from the list, so a counter
 * cannot be missing there without a build error; these tests check what the
 * compiler cannot: the .proto's named fields, the exposition's values and
 * the family rows. tests/ops/test_metrics.py checks the CLI and the Python
 * binding against a running daemon.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "dispatch.h"
#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "log.h"
#include "metrics_http.h"
#include "metrics_text.h"
#include "kvshared.h"
#include "test_server.h"

#define COUNTER_ROW(name, named, family, labels, help) {#name, named, family, labels, help},
static const struct {
    const char *name;
    int named;
    const char *family, *labels, *help;
} rows[] = {KVS_COUNTERS(COUNTER_ROW)};
#undef COUNTER_ROW

/* StatsReply fields that are not counters (tier 2's three, the copy path,
 * the rows per device, the cluster tier's nodes, tier 3's three, the loop's longest work). */
static const char *const gauges[] = {
    "total_blocks",
    "free_blocks",
    "writing_blocks",
    "cached_blocks",
    "pinned_blocks",
    "sessions",
    "block_bytes",
    "pool_bytes",
    "backend",
    "uptime_ms",
    "index_bytes",
    "block_tokens",
    "namespaces",
    "counters",
    "tier2_total_blocks",
    "tier2_cached_blocks",
    "copying_blocks",
    "copy_path",
    "devices",
    "cluster_nodes",
    "tier3_total_blocks",
    "tier3_cached_blocks",
    "disk_io",
    "loop_busy_max_us",
    "disk_restore",
};

/* Decimal places of a counter kept in ms, us or ns (its name's suffix). */
static int unit_decimals(const char *name)
{
    size_t len = strlen(name);
    if (len < 3)
        return 0;
    if (strcmp(name + len - 3, "_ms") == 0)
        return 3;
    if (strcmp(name + len - 3, "_us") == 0)
        return 6;
    if (strcmp(name + len - 3, "_ns") == 0)
        return 9;
    return 0;
}

static int is_gauge(const char *name)
{
    for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++)
        if (strcmp(gauges[i], name) == 0)
            return 1;
    return 0;
}

START_TEST(test_list_fits_its_room)
{
    ck_assert_uint_eq(sizeof(rows) / sizeof(rows[0]), KVS_N_COUNTERS);
    ck_assert_uint_le(KVS_N_COUNTERS, KVS_COUNTER_SLOTS);
    /* kvs_stats_t's counters and its named fields are the same memory. */
    kvs_stats_t s;
    memset(&s, 0, sizeof(s));
    s.counters[KVS_COUNTER_evictions] = 7;
    ck_assert_uint_eq(s.evictions, 7);
    ck_assert_uint_eq(s.counters[KVS_N_COUNTERS - 1], 0);
}
END_TEST

/* The library's names are the list's, in order, and nothing past it. */
START_TEST(test_library_names)
{
    for (size_t i = 0; i < KVS_N_COUNTERS; i++)
        ck_assert_str_eq(kvs_counter_name(i), rows[i].name);
    ck_assert_ptr_null(kvs_counter_name(KVS_N_COUNTERS));
    ck_assert_ptr_null(kvs_counter_name((size_t)-1));
}
END_TEST

/* Every named counter has its StatsReply field, and every StatsReply field
 * is a gauge, the counters array or a named counter: a counter given its own
 * field in the .proto and not in the list fails here. */
START_TEST(test_proto_fields)
{
    const ProtobufCMessageDescriptor *d = &kvshare__stats_reply__descriptor;
    for (size_t i = 0; i < KVS_N_COUNTERS; i++) {
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(d, rows[i].name);
        if (rows[i].named)
            ck_assert_msg(f != NULL, "StatsReply has no field %s", rows[i].name);
        else
            ck_assert_msg(f == NULL, "%s has a StatsReply field: mark it named", rows[i].name);
    }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const char *name = d->fields[i].name;
        int found = is_gauge(name);
        for (size_t j = 0; j < KVS_N_COUNTERS && !found; j++)
            found = strcmp(rows[j].name, name) == 0;
        ck_assert_msg(found, "StatsReply.%s is neither a gauge nor in KVS_COUNTERS", name);
    }
    const ProtobufCFieldDescriptor *c =
        protobuf_c_message_descriptor_get_field_by_name(d, "counters");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->label, PROTOBUF_C_LABEL_REPEATED);
    ck_assert_int_eq(c->type, PROTOBUF_C_TYPE_UINT64);
}
END_TEST

/* Counters of one family share its help; a family is a Prometheus name in
 * base units: a counter kept in ms or us (its name says so) is a
 * _seconds_total family, and no family is in milliseconds or microseconds. */
START_TEST(test_family_rows)
{
    for (size_t i = 0; i < KVS_N_COUNTERS; i++) {
        int in_seconds = strstr(rows[i].family, "_seconds_total") != NULL;
        ck_assert_msg(in_seconds == (unit_decimals(rows[i].name) != 0), "%s is kept as %s",
                      rows[i].family, rows[i].name);
        ck_assert_msg(!strstr(rows[i].family, "milli") && !strstr(rows[i].family, "micro") &&
                          !strstr(rows[i].family, "nano"),
                      "%s: Prometheus wants seconds", rows[i].family);
        ck_assert_msg(strncmp(rows[i].family, "kvshare_", 8) == 0, "%s", rows[i].family);
        size_t len = strlen(rows[i].family);
        ck_assert_msg(len > 6 && strcmp(rows[i].family + len - 6, "_total") == 0, "%s",
                      rows[i].family);
        ck_assert_msg(rows[i].help[0] != '\0', "%s has no help", rows[i].name);
        for (size_t j = 0; j < i; j++) {
            ck_assert_str_ne(rows[i].name, rows[j].name);
            if (strcmp(rows[i].family, rows[j].family) == 0) {
                ck_assert_str_eq(rows[i].help, rows[j].help);
                ck_assert_msg(strcmp(rows[i].labels, rows[j].labels) != 0,
                              "%s and %s: same family, same labels", rows[i].name, rows[j].name);
            }
        }
    }
}
END_TEST

/* /metrics shows each counter's own value under its family and labels. */
START_TEST(test_metrics_text_values)
{
    uv_loop_t loop;
    server_t *srv;
    server_config_t cfg;
    log_level = LOG_LEVEL_ERROR;
    test_server_config(&cfg, 4, 16);
    srv = test_server_open(&loop, &cfg);
    for (size_t i = 0; i < KVS_N_COUNTERS; i++)
        srv->metrics.counters[i] = 1000003 * (i + 1);
    for (size_t r = 0; r < dispatch_count(); r++)
        srv->metrics.rpc_calls[r] = 17 + r;

    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(metrics_render(srv, &text, &len), 0);
    for (size_t i = 0; i < KVS_N_COUNTERS; i++) {
        char line[256], value[64];
        unsigned long long v = 1000003ULL * (i + 1);
        /* kept in ms or us, shown in seconds: 3000009 ms is 3000.009 */
        if (unit_decimals(rows[i].name) == 3)
            snprintf(value, sizeof(value), "%llu.%03llu", v / 1000, v % 1000);
        else if (unit_decimals(rows[i].name) == 6)
            snprintf(value, sizeof(value), "%llu.%06llu", v / 1000000, v % 1000000);
        else
            snprintf(value, sizeof(value), "%llu", v);
        if (rows[i].labels[0])
            snprintf(line, sizeof(line), "\n%s{%s} %s\n", rows[i].family, rows[i].labels, value);
        else
            snprintf(line, sizeof(line), "\n%s %s\n", rows[i].family, value);
        ck_assert_msg(strstr(text, line) != NULL, "/metrics lacks%s", line);
    }
    /* The loop's longest work, kept in us, in seconds. */
    ck_assert_ptr_nonnull(strstr(text, "\nkvshare_loop_busy_max_seconds 0.000000\n"));
    /* The process_* families of the client libraries. */
    static const char *const process[] = {"process_start_time_seconds ",
                                          "process_cpu_seconds_total ",
                                          "process_resident_memory_bytes ",
                                          "process_virtual_memory_bytes ",
                                          "process_open_fds ",
                                          "process_max_fds "};
    for (size_t i = 0; i < sizeof(process) / sizeof(process[0]); i++) {
        char line[64];
        snprintf(line, sizeof(line), "\n%s", process[i]);
        ck_assert_msg(strstr(text, line) != NULL, "/metrics lacks %s", process[i]);
    }
    /* Per-RPC figures by dispatch table position, named by the table. */
    for (size_t r = 0; r < dispatch_count(); r++) {
        char line[128];
        snprintf(line, sizeof(line), "kvshare_rpc_requests_total{rpc=\"%s\"} %zu\n",
                 dispatch_at(r)->name, 17 + r);
        ck_assert_msg(strstr(text, line) != NULL, "/metrics lacks %s", line);
    }
    ck_assert_ptr_null(dispatch_at(dispatch_count()));
    free(text);
    test_server_close(&loop, srv, false);
}
END_TEST

/* The dispatch table gives each RPC one metrics slot. */
START_TEST(test_dispatch_positions)
{
    ck_assert_uint_le(dispatch_count(), METRICS_MAX_RPC);
    for (size_t i = 0; i < dispatch_count(); i++) {
        const dispatch_entry_t *e = dispatch_at(i);
        ck_assert_ptr_eq(dispatch_find(e->rpc), e);
        ck_assert_uint_eq(dispatch_index(e), i);
    }
    ck_assert_ptr_null(dispatch_find(KVSHARE__REQUEST__RPC__NOT_SET));
}
END_TEST

static Suite *counters_suite(void)
{
    Suite *s = suite_create("ops_counters");
    TCase *tc = tcase_create("counters");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_list_fits_its_room);
    tcase_add_test(tc, test_library_names);
    tcase_add_test(tc, test_proto_fields);
    tcase_add_test(tc, test_family_rows);
    tcase_add_test(tc, test_metrics_text_values);
    tcase_add_test(tc, test_dispatch_positions);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(counters_suite)
