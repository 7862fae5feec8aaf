/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The check of the masters' eviction settings at start (cluster.h,
 * cluster_check_settings): kvshared, on a Redis Cluster this test starts on
 * loopback, asks every master for maxmemory-policy, maxmemory-samples and
 * maxmemory, and logs one WARN line per problem, counted in the gauge
 * kvshare_cluster_settings_warnings: here three masters with noeviction,
 * allkeys-lfu and volatile-lru, samples 5, a maxmemory of 0 and another
 * maxmemory per slot make 8 lines. allkeys-lru with 64 samples and equal
 * maxmemory makes none. Where CONFIG is refused (an ACL user without it),
 * one INFO line says so and kvshared serves as always.
 */
#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"
#include "now.h"
#include "redis_cluster.h"
#include "test_tmp.h"

#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A port free now on loopback (bound and closed: the daemon binds it next). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* GET /metrics from 127.0.0.1:port: the whole answer (malloc'd), or NULL. */
static char *http_metrics(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return NULL;
    }
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t r;
    while (buf && (r = read(fd, buf + len, cap - len)) > 0)
        len += (size_t)r;
    close(fd);
    if (buf)
        buf[len] = '\0';
    return buf;
}

/* The value of the gauge without labels name in /metrics on port. */
static long long metric(int port, const char *name)
{
    char *text = http_metrics(port);
    ck_assert_ptr_nonnull(text);
    char line[128];
    snprintf(line, sizeof line, "\n%s ", name);
    const char *at = strstr(text, line);
    ck_assert_msg(at != NULL, "no %s in /metrics", name);
    long long v = strtoll(at + strlen(line), NULL, 10);
    free(text);
    return v;
}

/* The whole of a file, NUL-ended (malloc'd). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    ck_assert_ptr_nonnull(buf);
    n = fread(buf, 1, cap, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* Lines of text that hold every one of the NULL-ended needles. */
static int lines_with(const char *text, const char *const *needles)
{
    int n = 0;
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int all = 1;
        for (size_t k = 0; needles[k] && all; k++) {
            size_t nl = strlen(needles[k]);
            all = memmem(p, len, needles[k], nl) != NULL;
        }
        n += all;
        p += len + (end ? 1 : 0);
    }
    return n;
}

/* Fails, the log printed, unless text has exactly n lines with needles. */
static void expect_lines(const char *text, const char *const *needles, int n)
{
    int have = lines_with(text, needles);
    if (have != n) {
        fprintf(stderr, "%s", text);
        ck_abort_msg("%d lines, not %d, with \"%s\" in the daemon's log (above)", have, n,
                     needles[0]);
    }
}

/* Runs a command on master i (blocking), which must not fail. */
static void on_node(const rc_cluster_t *rc, int i, const char *cmd)
{
    redisContext *ctx = rc_connect(rc, i);
    ck_assert_ptr_nonnull(ctx);
    redisReply *r = redisCommand(ctx, cmd);
    ck_assert_msg(r && r->type != REDIS_REPLY_ERROR, "%s on node %d: %s", cmd, i,
                  r && r->str ? r->str : "no reply");
    freeReplyObject(r);
    redisFree(ctx);
}

static void set_node(const rc_cluster_t *rc, int i, const char *policy, const char *samples,
                     const char *maxmemory)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "CONFIG SET maxmemory-policy %s", policy);
    on_node(rc, i, cmd);
    snprintf(cmd, sizeof cmd, "CONFIG SET maxmemory-samples %s", samples);
    on_node(rc, i, cmd);
    snprintf(cmd, sizeof cmd, "CONFIG SET maxmemory %s", maxmemory);
    on_node(rc, i, cmd);
}

typedef struct run {
    harness_t h;
    int port;
    char log[256], conf[256];
    char *text; /* the daemon's log once the check ended */
} run_t;

/* Starts kvshared on rc (auth: a cluster_auth_file or NULL) with its log in
 * a file, waits until the log says that the settings check ended (the line
 * holding done), checks that it still serves, and keeps its log. */
static void run_start(run_t *r, const rc_cluster_t *rc, const char *auth, const char *done)
{
    memset(r, 0, sizeof *r);
    int fd = test_tmp_file("kvs-settings-conf", r->conf, sizeof r->conf);
    ck_assert_int_ge(fd, 0);
    static const char conf[] = "[namespace shr]\nshared = yes\n";
    ck_assert_int_eq(write(fd, conf, sizeof conf - 1), (ssize_t)(sizeof conf - 1));
    close(fd);
    fd = test_tmp_file("kvs-settings-log", r->log, sizeof r->log);
    ck_assert_int_ge(fd, 0);
    close(fd);
    r->port = free_port();
    char listen[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", r->port);
    const char *extra[] = {"--cluster-seeds",
                           rc->seeds,
                           "--config",
                           r->conf,
                           "--metrics-listen",
                           listen,
                           NULL,
                           NULL,
                           NULL};
    if (auth) {
        extra[6] = "--cluster-auth-file";
        extra[7] = auth;
    }
    /* Its stderr into the log, at info: the check's summary is an INFO line. */
    setenv("KVS_TEST_DAEMON_LOG", "info", 1);
    fflush(stderr);
    int saved = dup(2);
    int lfd = open(r->log, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(lfd, 0);
    dup2(lfd, 2);
    close(lfd);
    int started = harness_start(&r->h, 64, extra);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ck_assert_int_eq(started, 0);
    int64_t end = now_ms() + 20000;
    for (;;) {
        r->text = slurp(r->log);
        if (strstr(r->text, done) || now_ms() > end)
            break;
        free(r->text);
        usleep(50000);
    }
    if (!strstr(r->text, done)) {
        fprintf(stderr, "%s", r->text);
        ck_abort_msg("no \"%s\" in the daemon's log (above)", done);
    }
    /* The start did not fail, whatever the check found. */
    kvs_client_t *c = harness_client(&r->h, "settings-test", 0);
    ck_assert_int_eq(kvs_ping(c, 0, NULL), 0);
    kvs_close(c);
}

static void run_stop(run_t *r)
{
    ck_assert_int_eq(harness_stop(&r->h), 0);
    harness_cleanup(&r->h);
    unlink(r->log);
    unlink(r->conf);
    free(r->text);
}

/* The settings lines at WARN, all of them naming the doc section. */
static const char *const any_warning[] = {"kvshared warn: cluster: ", "Sizing Redis", NULL};

START_TEST(bad_settings_are_warned)
{
    rc_cluster_t rc;
    ck_assert_msg(rc_start(&rc, 3, 0, NULL) == 0, "cannot start a Redis Cluster");
    /* 3 masters of about 5,461 slots each. */
    set_node(&rc, 0, "noeviction", "5", "0");
    set_node(&rc, 1, "allkeys-lfu", "5", "100mb");
    set_node(&rc, 2, "volatile-lru", "64", "300mb");
    char a0[32], a1[32], a01[64];
    snprintf(a0, sizeof a0, "(127.0.0.1:%d)", rc.port[0]);
    snprintf(a1, sizeof a1, "(127.0.0.1:%d)", rc.port[1]);
    snprintf(a01, sizeof a01, "(127.0.0.1:%d, 127.0.0.1:%d)", rc.port[0], rc.port[1]);
    run_t r;
    run_start(&r, &rc, NULL, "eviction settings of 3 masters checked: 8 problems");
    const char *noeviction[] = {"kvshared warn: cluster: maxmemory-policy noeviction on 1 of 3 "
                                "masters ",
                                a0,
                                "recommended allkeys-lru",
                                "OOM",
                                "Sizing Redis",
                                NULL};
    const char *lfu[] = {"kvshared warn: cluster: maxmemory-policy allkeys-lfu on 1 of 3", a1,
                         "0.631x", "0.953x", NULL};
    const char *volatile_lru[] = {"kvshared warn: cluster: maxmemory-policy volatile-lru on 1 of 3",
                                  "no TTL", NULL};
    const char *samples[] = {"kvshared warn: cluster: maxmemory-samples 5 on 2 of 3 masters ",
                             a01,
                             "recommended 64",
                             "0.898x",
                             "0.953x",
                             NULL};
    const char *unlimited[] = {"kvshared warn: cluster: maxmemory 0 (no limit) on 1 of 3", a0,
                               NULL};
    const char *policies[] = {"kvshared warn: cluster: the masters disagree on maxmemory-policy",
                              "noeviction", "allkeys-lfu", "volatile-lru", NULL};
    const char *sample_counts[] = {
        "kvshared warn: cluster: the masters disagree on maxmemory-samples", NULL};
    const char *spread[] = {"kvshared warn: cluster: the masters' maxmemory per slot differs",
                            "104857600 bytes", "314572800 bytes", NULL};
    const char *const *each[] = {noeviction, lfu,      volatile_lru,  samples,
                                 unlimited,  policies, sample_counts, spread};
    for (size_t i = 0; i < sizeof each / sizeof each[0]; i++)
        expect_lines(r.text, each[i], 1);
    expect_lines(r.text, any_warning, 8);
    ck_assert_int_eq(metric(r.port, "kvshare_cluster_settings_warnings"), 8);
    run_stop(&r);
    rc_stop(&rc);
}
END_TEST

START_TEST(recommended_settings_are_quiet)
{
    rc_cluster_t rc;
    ck_assert_msg(rc_start(&rc, 3, 0, NULL) == 0, "cannot start a Redis Cluster");
    for (int i = 0; i < rc.n; i++)
        set_node(&rc, i, "allkeys-lru", "64", "100mb");
    run_t r;
    run_start(&r, &rc, NULL, "eviction settings of 3 masters checked: 0 problems");
    expect_lines(r.text, any_warning, 0);
    ck_assert_ptr_null(strstr(r.text, "could not be checked"));
    ck_assert_int_eq(metric(r.port, "kvshare_cluster_settings_warnings"), 0);
    run_stop(&r);
    rc_stop(&rc);
}
END_TEST

/* An ACL user without CONFIG (as a managed Redis, or a renamed command):
 * one INFO line, no warning, the start goes on. Redis's defaults here
 * (noeviction, 5 samples, no maxmemory) would make warnings if read. */
START_TEST(refused_config_is_one_info_line)
{
    rc_cluster_t rc;
    ck_assert_msg(rc_start(&rc, 3, 0, NULL) == 0, "cannot start a Redis Cluster");
    for (int i = 0; i < rc.n; i++)
        on_node(&rc, i, "ACL SETUSER kvs on >pw-settings ~* &* +@all -config");
    char auth[256];
    int fd = test_tmp_file("kvs-settings-auth", auth, sizeof auth);
    ck_assert_int_ge(fd, 0);
    static const char creds[] = "kvs\npw-settings\n";
    ck_assert_int_eq(write(fd, creds, sizeof creds - 1), (ssize_t)(sizeof creds - 1));
    close(fd);
    run_t r;
    run_start(&r, &rc, auth, "could not be checked");
    const char *info[] = {"kvshared info: cluster: the eviction settings of 3 of 3 masters could "
                          "not be checked",
                          "CONFIG GET refused: NOPERM", "Sizing Redis", NULL};
    expect_lines(r.text, info, 1);
    expect_lines(r.text, any_warning, 0);
    ck_assert_int_eq(metric(r.port, "kvshare_cluster_settings_warnings"), 0);
    run_stop(&r);
    unlink(auth);
    rc_stop(&rc);
}
END_TEST

static Suite *settings_suite(void)
{
    Suite *s = suite_create("cluster_settings");
    TCase *tc = tcase_create("settings");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, bad_settings_are_warned);
    tcase_add_test(tc, recommended_settings_are_quiet);
    tcase_add_test(tc, refused_config_is_one_info_line);
    suite_add_tcase(s, tc);
    return s;
}

/* Skipped (77, "skipped: why") where redis-server is not installed. */
KVS_CHECK_MAIN_UNLESS(settings_suite, rc_missing)
