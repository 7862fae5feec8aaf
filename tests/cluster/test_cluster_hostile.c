/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cluster client against a node that lies: a fake node (a thread of
 * this test speaking RESP on loopback) gives the client the whole slot map,
 * then answers GET with a flood: a 512 MiB bulk string, an array that says
 * 100M elements, arrays nested past the element bound; or answers SET with
 * OOM, as a full Redis without an eviction policy does. The client must cut
 * each flood (the connection closed, counted, logged), stay within 256 MiB
 * meanwhile and give it back after, and still read an honest reply.
 * Needs no Redis: it runs wherever the suite does.
 */
#include "cluster.h"
#include "kvshare_status.h"
#include "cluster_loop.h"
#include "now.h"
#include "check_main.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum fake_mode {
    FAKE_HONEST,     /* GET: "hello" */
    FAKE_BIG_STRING, /* GET: a 512 MiB bulk string, streamed */
    FAKE_BIG_ARRAY,  /* GET: "*100000000", then its elements, streamed */
    FAKE_NESTED,     /* GET: 1,025 arrays of 1,024 integers: over the bound in all */
    FAKE_OOM,        /* SET: -OOM */
};

#define FLOOD_BYTES (512ull << 20)

typedef struct fake {
    int lfd, port;
    pthread_t thread;
    atomic_int mode;
    atomic_int stop;
    atomic_int closed_mid_flood; /* writes of a flood failed: the client hung up */
    atomic_ullong flood_sent;    /* bytes of the last flood written */
} fake_t;

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Streams a flood: head, then body repeated until total bytes or the
 * client hangs up. Returns -1 when it did. */
static int flood(fake_t *f, int fd, const char *head, const char *body, size_t body_len,
                 unsigned long long total)
{
    static char chunk[1 << 20];
    size_t per = sizeof chunk / body_len * body_len;
    for (size_t i = 0; i < per; i += body_len)
        memcpy(chunk + i, body, body_len);
    atomic_store(&f->flood_sent, 0);
    if (write_all(fd, head, strlen(head)) != 0)
        goto hung_up;
    for (unsigned long long sent = 0; sent < total; sent += per) {
        if (write_all(fd, chunk, per) != 0)
            goto hung_up;
        atomic_store(&f->flood_sent, sent + per);
    }
    return 0;
hung_up:
    atomic_store(&f->closed_mid_flood, 1);
    return -1;
}

/* Answers one command (argv[0], argv[1]). Returns -1 to end the
 * connection. */
static int answer(fake_t *f, int fd, const char *cmd, const char *arg)
{
    char line[256];
    if (strcmp(cmd, "CLUSTER") == 0 && strcmp(arg, "SLOTS") == 0) {
        snprintf(line, sizeof line, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
                 f->port);
        return write_all(fd, line, strlen(line));
    }
    int mode = atomic_load(&f->mode);
    if (strcmp(cmd, "SET") == 0) {
        const char *r = mode == FAKE_OOM ? "-OOM command not allowed when used memory > "
                                           "'maxmemory'.\r\n"
                                         : "+OK\r\n";
        return write_all(fd, r, strlen(r));
    }
    if (strcmp(cmd, "GET") != 0)
        return write_all(fd, "-ERR unknown\r\n", 14);
    switch (mode) {
    case FAKE_BIG_STRING:
        snprintf(line, sizeof line, "$%llu\r\n", FLOOD_BYTES);
        return flood(f, fd, line, "\0\0\0\0\0\0\0\0", 8, FLOOD_BYTES);
    case FAKE_BIG_ARRAY:
        /* 8M of them sent: 450 MB built before the bound. */
        return flood(f, fd, "*100000000\r\n", ":1\r\n", 4, 8000000ull * 4);
    case FAKE_NESTED: {
        /* 1,025 x 1,024 elements: one array past the bound. */
        static char inner[7 + 1024 * 4 + 1];
        memcpy(inner, "*1024\r\n", 7);
        for (int i = 0; i < 1024; i++)
            memcpy(inner + 7 + 4 * i, ":1\r\n", 4);
        return flood(f, fd, "*1025\r\n", inner, 7 + 1024 * 4, 1025ull * (7 + 1024 * 4));
    }
    default:
        return write_all(fd, "$5\r\nhello\r\n", 11);
    }
}

/* Parses the RESP commands at the front of buf (len bytes): each is
 * answered, then dropped. Returns -1 to end the connection. */
static int serve_buffer(fake_t *f, int fd, char *buf, size_t *len)
{
    for (;;) {
        char *p = buf, *end = buf + *len, argv[2][64] = {"", ""};
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || *p != '*')
            return nl && *p != '*' ? -1 : 0;
        long argc = strtol(p + 1, NULL, 10);
        p = nl + 1;
        for (long i = 0; i < argc; i++) {
            nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
            if (!nl)
                return 0;
            long alen = strtol(p + 1, NULL, 10);
            p = nl + 1;
            if (end - p < alen + 2)
                return 0;
            if (i < 2)
                snprintf(argv[i], sizeof argv[i], "%.*s", (int)(alen < 63 ? alen : 63), p);
            p += alen + 2;
        }
        size_t used = (size_t)(p - buf);
        memmove(buf, p, *len - used);
        *len -= used;
        if (answer(f, fd, argv[0], argv[1]) != 0)
            return -1;
    }
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    static char buf[1 << 16];
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = f->lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        size_t len = 0;
        while (!atomic_load(&f->stop)) {
            struct pollfd q = {.fd = fd, .events = POLLIN};
            if (poll(&q, 1, 50) <= 0)
                continue;
            ssize_t n = read(fd, buf + len, sizeof buf - len);
            if (n <= 0)
                break;
            len += (size_t)n;
            if (serve_buffer(f, fd, buf, &len) != 0 || len == sizeof buf)
                break;
        }
        close(fd);
    }
    return NULL;
}

static void fake_start(fake_t *f)
{
    memset(f, 0, sizeof *f);
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(f->lfd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    ck_assert_int_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(f->lfd, 8), 0);
    ck_assert_int_eq(getsockname(f->lfd, (struct sockaddr *)&a, &alen), 0);
    f->port = ntohs(a.sin_port);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(fake_t *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    close(f->lfd);
}

/* ---- the client ---- */

/* kB of a /proc/self/status field. */
static long status_kb(const char *field)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fp && fgets(line, sizeof line, fp))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            kb = atol(line + n + 1);
    if (fp)
        fclose(fp);
    return kb;
}

/* Where memory figures are not the program's (valgrind, ASan). */
static int memory_not_measured(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return 1;
#endif
#endif
    return getenv("KVS_TEST_SMALL") != NULL;
}

static reply_t get_after_down(uv_loop_t *loop, cluster_t *c)
{
    /* A node whose connection ended is counted down for 200 ms. */
    run_for(loop, 250);
    reply_t r = {0};
    ck_assert_int_eq(cluster_get(c, "k", 1, on_reply, &r), 0);
    ck_assert(run_until(loop, &r.done, 30000));
    return r;
}

/* Each flood is cut: its command fails (KVS_EIO, not its deadline), the
 * connection is closed under the fake node's writes, the cut is counted,
 * the process stays within 256 MiB and gives it back; an honest reply then
 * passes. Before: the 512 MiB string was read whole (the GET answered with
 * it), the 100M-element array allocated 800 MB of pointers on its header. */
START_TEST(floods_are_cut)
{
    fake_t f;
    fake_start(&f);
    uv_loop_t loop;
    uv_loop_init(&loop);
    char seeds[64];
    snprintf(seeds, sizeof seeds, "127.0.0.1:%d", f.port);
    cluster_options_t opt = {.seeds = seeds, .timeout_ms = 20000, .max_reply_bytes = 1 << 20};
    cluster_t *c = NULL;
    ck_assert_int_eq(cluster_new(&loop, &opt, &c), 0);
    int64_t end = now_ms() + 5000;
    while (!cluster_ready(c) && now_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert(cluster_ready(c));
    long rss0 = status_kb("VmRSS");

    static const struct {
        int mode;
        const char *name;
    } floods[] = {{FAKE_BIG_STRING, "512 MiB string"},
                  {FAKE_BIG_ARRAY, "array of 100M elements"},
                  {FAKE_NESTED, "nested arrays of 1,049,600 elements"}};
    for (size_t k = 0; k < sizeof floods / sizeof floods[0]; k++) {
        atomic_store(&f.closed_mid_flood, 0);
        atomic_store(&f.mode, floods[k].mode);
        int64_t t0 = now_ms();
        reply_t r = get_after_down(&loop, c);
        cluster_stats_t st;
        cluster_get_stats(c, &st);
        printf("floods_are_cut: %s: %s after %lld ms, %llu MiB sent, peak RSS %ld MiB\n",
               floods[k].name, kvs_status_text(r.status), (long long)(now_ms() - t0),
               (unsigned long long)atomic_load(&f.flood_sent) >> 20, status_kb("VmHWM") >> 10);
        fflush(stdout);
        ck_assert_int_eq(r.status, KVS_EIO);
        ck_assert_uint_eq(st.replies_cut, k + 1);
        ck_assert_uint_eq(st.timeouts, 0);
        if (floods[k].mode != FAKE_NESTED) { /* that one is sent whole before the cut */
            end = now_ms() + 5000;
            while (!atomic_load(&f.closed_mid_flood) && now_ms() < end)
                usleep(1000);
            ck_assert_msg(atomic_load(&f.closed_mid_flood), "the client did not hang up");
        }
        if (!memory_not_measured())
            ck_assert_int_lt(status_kb("VmHWM"), 256 << 10);
    }
    /* An honest reply still passes, on a new connection. */
    atomic_store(&f.mode, FAKE_HONEST);
    reply_t r = get_after_down(&loop, c);
    ck_assert_int_eq(r.status, 0);
    ck_assert_uint_eq(r.len, 5);
    ck_assert_mem_eq(r.data, "hello", 5);
    long rss1 = status_kb("VmRSS");
    printf("floods_are_cut: RSS %ld KiB before, %ld KiB after, peak %ld KiB\n", rss0, rss1,
           status_kb("VmHWM"));
    if (!memory_not_measured())
        ck_assert_int_lt(rss1 - rss0, 32 << 10);
    cluster_close(c);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    fake_stop(&f);
}
END_TEST

/* A full node answering OOM: the write is a refusal (KVS_EPOOLFULL,
 * counted in full, not among the node errors) and it is logged, at most
 * once a second. Before: counted only in full, which nothing exported,
 * and never logged. */
START_TEST(oom_is_logged_and_counted)
{
    fake_t f;
    fake_start(&f);
    atomic_store(&f.mode, FAKE_OOM);
    uv_loop_t loop;
    uv_loop_init(&loop);
    char seeds[64], path[] = "/tmp/kvs-oom-log-XXXXXX";
    snprintf(seeds, sizeof seeds, "127.0.0.1:%d", f.port);
    int logfd = mkstemp(path);
    ck_assert_int_ge(logfd, 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(logfd, 2);
    cluster_options_t opt = {.seeds = seeds, .timeout_ms = 5000};
    cluster_t *c = NULL;
    ck_assert_int_eq(cluster_new(&loop, &opt, &c), 0);
    int64_t end = now_ms() + 5000;
    while (!cluster_ready(c) && now_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert(cluster_ready(c));
    reply_t r[3] = {{0}};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(cluster_set(c, "k", 1, "v", 1, on_reply, &r[i]), 0);
        ck_assert(run_until(&loop, &r[i].done, 5000));
        ck_assert_int_eq(r[i].status, KVS_EPOOLFULL);
    }
    cluster_stats_t st;
    cluster_get_stats(c, &st);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char log[4096] = "";
    ssize_t n = pread(logfd, log, sizeof log - 1, 0);
    close(logfd);
    log[n > 0 ? n : 0] = '\0';
    ck_assert_uint_eq(st.full, 3);
    ck_assert_uint_eq(st.down, 0);
    ck_assert_uint_eq(st.reply_errors, 0);
    ck_assert_msg(strstr(log, "OOM command not allowed"), "not logged: '%s'", log);
    /* Three refusals within a second: one line. */
    ck_assert_ptr_null(
        strstr(strstr(log, "OOM command not allowed") + 1, "OOM command not allowed"));
    cluster_close(c);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    fake_stop(&f);
}
END_TEST

static Suite *cluster_hostile_suite(void)
{
    Suite *s = suite_create("cluster_hostile");
    TCase *tc = tcase_create("fake node");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, floods_are_cut);
    tcase_add_test(tc, oom_is_logged_and_counted);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(cluster_hostile_suite)
