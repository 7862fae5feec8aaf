/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The settings table (settings.c): its rows are consistent, and every
 * setting gets the same verdict as a flag and as a config-file line. The
 * walk runs the real kvshared with --check-config, once with `key = value`
 * in the file and once with `--flag value` over an empty file, for values
 * inside the bounds, below, above and of the wrong type, and compares the
 * exit statuses and the reasons.
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "nsname.h"
#include "preflight.h"
#include "settings.h"
#include "test_tmp.h"

static char dir[64];

static void make_dir(void)
{
    ck_assert_int_eq(test_tmp_dir("kvs-settings", dir, sizeof(dir)), 0);
}

static void remove_dir(void)
{
    char path[128];
    const char *names[] = {"empty.conf", "k.conf", "fifo", "big.conf", "s.sock", "ev"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void write_text(const char *name, const char *text, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Runs kvshared with args (NULL-terminated, argv[0] excluded); returns its
 * exit status (or 128 + signal) and its stderr in err. A child that does
 * not finish within 20 s is killed by its alarm. */
static int run(const char *const *args, char *err, size_t errlen)
{
    const char *argv[16] = {KVSHARED_PATH};
    int n = 1, fds[2];
    for (; args[n - 1]; n++) {
        ck_assert_int_lt(n, 15);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        if (!freopen("/dev/null", "w", stdout))
            _exit(126);
        close(fds[0]);
        close(fds[1]);
        alarm(20); /* survives exec: a daemon that starts by mistake dies */
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t got;
    while ((got = read(fds[0], err + used, errlen - 1 - used)) > 0)
        used += (size_t)got;
    err[used] = '\0';
    close(fds[0]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The reason in the first line of a message, after "'value': ". */
static void reason_of(const char *err, const char *value, char *out, size_t len)
{
    char mark[600];
    snprintf(mark, sizeof(mark), "'%.590s': ", value);
    const char *p = strstr(err, mark);
    out[0] = '\0';
    if (!p)
        return;
    p += strlen(mark);
    size_t n = strcspn(p, "\n");
    snprintf(out, len, "%.*s", (int)n, p);
}

typedef struct value_case {
    char text[300];
    bool valid;
    const char *what; /* "in range", "below min", "above max", "bad type" */
} value_case_t;

static int add_case(value_case_t *cases, int n, bool valid, const char *what, const char *fmt,
                    unsigned long long v)
{
    snprintf(cases[n].text, sizeof(cases[n].text), fmt, v);
    cases[n].valid = valid;
    cases[n].what = what;
    return n + 1;
}

static int add_text(value_case_t *cases, int n, bool valid, const char *what, const char *text)
{
    snprintf(cases[n].text, sizeof(cases[n].text), "%s", text);
    cases[n].valid = valid;
    cases[n].what = what;
    return n + 1;
}

/* The values to try for one row, from its type and bounds. */
static int cases_for(const setting_t *row, value_case_t *cases)
{
    int n = 0;
    char long_text[300];
    switch (row->type) {
    case SETTING_U32:
    case SETTING_SIZE:
        n = add_case(cases, n, true, "in range (min)", "%llu", row->min);
        if (row->max < UINT64_MAX) {
            n = add_case(cases, n, true, "in range (max)", "%llu", row->max);
            n = add_case(cases, n, false, "above max", "%llu", row->max + 1);
        }
        if (row->min > 0)
            n = add_case(cases, n, false, "below min", "%llu", row->min - 1);
        n = add_text(cases, n, false, "bad type", row->type == SETTING_SIZE ? "lots" : "x12");
        n = add_text(cases, n, false, "bad type", "-1");
        break;
    case SETTING_FRACTION:
        n = add_text(cases, n, true, "in range", "0.5");
        n = add_text(cases, n, true, "in range (max)", "1");
        n = add_text(cases, n, false, "below min", "0");
        n = add_text(cases, n, false, "above max", "1.5");
        n = add_text(cases, n, false, "bad type", "half");
        break;
    case SETTING_BOOL:
        n = add_text(cases, n, true, "in range", "yes");
        n = add_text(cases, n, true, "in range", "off");
        n = add_text(cases, n, false, "bad type", "maybe");
        break;
    case SETTING_CHOICE:
        for (int i = 0; row->name(i); i++)
            n = add_text(cases, n, true, "in range", row->name(i));
        n = add_text(cases, n, false, "bad type", "nonsense");
        break;
    case SETTING_TEXT:
        if (row->name)
            n = add_text(cases, n, true, "in range", row->name(0));
        else if (row->example)
            n = add_text(cases, n, true, "in range", row->example);
        if (row->parse) {
            /* A word its check takes (a revision may be "nonsense"): then
             * two words. */
            int unused;
            n = add_text(cases, n, false, "bad type",
                         row->parse("nonsense", &unused) != 0 ? "nonsense" : "two words");
        }
        ck_assert_uint_lt(row->max + 1, sizeof(long_text));
        memset(long_text, 'a', row->max + 1);
        long_text[row->max + 1] = '\0';
        n = add_text(cases, n, false, "above max", long_text);
        long_text[row->max] = '\0';
        if (!row->parse)
            n = add_text(cases, n, true, "in range (max)", long_text);
        break;
    case SETTING_UIDS:
    case SETTING_GIDS:
    case SETTING_GROUP:
        n = add_text(cases, n, true, "in range", "0");
        n = add_text(cases, n, false, "bad type", "no-such-name-here");
        if (row->type == SETTING_GROUP) {
            n = add_text(cases, n, false, "above max", "0,0");
        } else {
            long_text[0] = '\0';
            for (int i = 0; i <= CONFIG_MAX_IDS; i++)
                strcat(long_text, i ? ",0" : "0");
            n = add_text(cases, n, false, "above max", long_text);
        }
        break;
    case SETTING_NAME:
        n = add_text(cases, n, true, "in range", row->example);
        n = add_text(cases, n, false, "bad type", "two words");
        break;
    case SETTING_NAMESPACE:
    case SETTING_SWITCH:
        break;
    }
    return n;
}

START_TEST(test_flag_and_file_agree)
{
    char empty[128], conf[128], text[1024], err_file[4096], err_flag[4096];
    char why_file[1024], why_flag[1024], flag[64];
    int rows = 0, tried = 0;
    make_dir();
    write_text("empty.conf", "", empty, sizeof(empty));
    for (size_t i = 0; i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        if (row->scope != SETTING_GLOBAL || !row->key || !row->flag)
            continue;
        value_case_t cases[32];
        int n = cases_for(row, cases);
        ck_assert_msg(n >= 2, "%s: fewer than 2 values to try", row->key);
        rows++;
        for (int c = 0; c < n; c++) {
            const char *v = cases[c].text;
            snprintf(text, sizeof(text), "%s = %.300s\n", row->key, v);
            write_text("k.conf", text, conf, sizeof(conf));
            snprintf(flag, sizeof(flag), "--%s", row->flag);
            const char *file_args[] = {"--check-config", conf, NULL};
            const char *flag_args[] = {"--check-config", empty, flag, v, NULL};
            int rc_file = run(file_args, err_file, sizeof(err_file));
            int rc_flag = run(flag_args, err_flag, sizeof(err_flag));
            /* A value its row takes may still make a whole that start
             * refuses (block_tokens = 65536: no block fits the default
             * pool); --check-config says so for the file and the flag. */
            bool whole = cases[c].valid && rc_file == 1 &&
                         strstr(err_file, "start would refuse this") &&
                         strstr(err_flag, "start would refuse this");
            ck_assert_msg(whole || rc_file == (cases[c].valid ? 0 : 1),
                          "%s = %.40s (%s): file exit %d, want %d:\n%s", row->key, v, cases[c].what,
                          rc_file, cases[c].valid ? 0 : 1, err_file);
            ck_assert_msg(rc_flag == rc_file, "--%s %.40s (%s): flag exit %d, file exit %d:\n%s",
                          row->flag, v, cases[c].what, rc_flag, rc_file, err_flag);
            if (!cases[c].valid) {
                reason_of(err_file, v, why_file, sizeof(why_file));
                reason_of(err_flag, v, why_flag, sizeof(why_flag));
                ck_assert_msg(why_file[0], "no reason for %s = %.40s in:\n%s", row->key, v,
                              err_file);
                ck_assert_msg(strcmp(why_file, why_flag) == 0,
                              "%s = %.40s: the file says '%s', the flag says '%s'", row->key, v,
                              why_file, why_flag);
            }
            tried++;
        }
    }
    ck_assert_int_ge(rows, 25);
    ck_assert_int_ge(tried, 100);
    remove_dir();
}
END_TEST

/* getopt_long takes any unambiguous prefix: --conf and --check-conf must do
 * what --config and --check-config do, not be skipped. */
START_TEST(test_abbreviations_everywhere)
{
    char conf[128], err[4096];
    make_dir();
    write_text("k.conf", "pool_blocks = 0\n", conf, sizeof(conf));
    const char *check[] = {"--check-conf", conf, NULL};
    ck_assert_int_eq(run(check, err, sizeof(err)), 1);
    ck_assert_ptr_nonnull(strstr(err, "k.conf:1: pool_blocks = '0'"));
    const char *start[] = {"--conf", conf, "--socket", "/nonexistent/dir/s.sock", NULL};
    ck_assert_int_eq(run(start, err, sizeof(err)), 2);
    ck_assert_ptr_nonnull(strstr(err, "k.conf:1: pool_blocks = '0'"));
    char eq[160];
    snprintf(eq, sizeof(eq), "--check=%s", conf);
    const char *check_eq[] = {eq, NULL};
    ck_assert_int_eq(run(check_eq, err, sizeof(err)), 1);
    ck_assert_ptr_nonnull(strstr(err, "k.conf:1:"));
    const char *ambiguous[] = {"--max", "5", NULL};
    ck_assert_int_eq(run(ambiguous, err, sizeof(err)), 2);
    ck_assert_ptr_nonnull(strstr(err, "ambiguous"));
    /* Flags apply after the file, whatever their place on the line. */
    write_text("k.conf", "pool_blocks = 64\n", conf, sizeof(conf));
    const char *both[] = {"--pool-bytes", "1GiB", "--check-config", conf, NULL};
    ck_assert_int_eq(run(both, err, sizeof(err)), 1);
    ck_assert_ptr_nonnull(strstr(err, "not both"));
    remove_dir();
}
END_TEST

START_TEST(test_namespace_name_rule)
{
    char name[RADIX_NS_NAME_MAX + 2];
    ck_assert(nsname_valid("chat"));
    ck_assert(nsname_valid("long.ctx-1_B"));
    ck_assert(!nsname_valid(""));
    ck_assert(!nsname_valid(NULL));
    ck_assert(!nsname_valid("a\"b"));
    ck_assert(!nsname_valid("a b"));
    ck_assert(!nsname_valid("caf\xc3\xa9"));
    memset(name, 'n', RADIX_NS_NAME_MAX);
    name[RADIX_NS_NAME_MAX] = '\0';
    ck_assert(nsname_valid(name));
    name[RADIX_NS_NAME_MAX] = 'n';
    name[RADIX_NS_NAME_MAX + 1] = '\0';
    ck_assert(!nsname_valid(name));

    /* The same names, refused or taken, by the file and by the flag. */
    const char *names[] = {"chat", "a\"b", "a:b", name};
    char conf[128], text[256], err[4096], empty[128];
    make_dir();
    write_text("empty.conf", "", empty, sizeof(empty));
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        bool valid = nsname_valid(names[i]);
        snprintf(text, sizeof(text), "[namespace %s]\nquota = 8\n", names[i]);
        write_text("k.conf", text, conf, sizeof(conf));
        const char *file_args[] = {"--check-config", conf, NULL};
        ck_assert_int_eq(run(file_args, err, sizeof(err)), valid ? 0 : 1);
        snprintf(text, sizeof(text), "%s:8", names[i]);
        const char *flag_args[] = {"--check-config", empty, "--namespace", text, NULL};
        ck_assert_int_eq(run(flag_args, err, sizeof(err)), valid ? 0 : 1);
        if (!valid)
            ck_assert_ptr_nonnull(strstr(err, nsname_rule()));
    }
    remove_dir();
}
END_TEST

/* --check-config and a SIGHUP reload read the file the same way: a FIFO, a
 * device or an oversized file is refused at once, never waited on or read
 * without end (both hung on /dev/zero and on a FIFO). The child's alarm
 * would end a hang with status 142. */
START_TEST(test_config_path_that_is_no_file)
{
    char fifo[128], big[128], err[4096];
    make_dir();
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    snprintf(big, sizeof(big), "%s/big.conf", dir);
    FILE *f = fopen(big, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 40000; i++) /* 40,000 comment lines: 1.2 MB */
        fputs("# a comment line of 30 bytes\n", f);
    ck_assert_int_eq(fclose(f), 0);
    const char *paths[] = {"/dev/zero", fifo, dir, big};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        const char *check[] = {"--check-config", paths[i], NULL};
        ck_assert_int_eq(run(check, err, sizeof(err)), 1);
        ck_assert_msg(strstr(err, i < 3 ? "not a regular file" : "more than a config file"),
                      "%s: %s", paths[i], err);
        const char *start[] = {"--config", paths[i], NULL};
        ck_assert_int_eq(run(start, err, sizeof(err)), 2);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ck_assert_int_lt(t1.tv_sec - t0.tv_sec, 5);
    }
    remove_dir();
}
END_TEST

/* --check-config refuses what start refuses (it passed reservations above
 * the pool that start then refused): each file and flags below, through
 * --check-config and through a real start, end in an error with the same
 * words. */
START_TEST(test_check_config_checks_what_start_checks)
{
    static const struct {
        const char *conf;
        const char *flag, *value;
        const char *words;
    } cases[] = {
        {"pool_blocks = 64\n[namespace a]\nreserve = 40\n[namespace b]\nreserve = 40\n", NULL, NULL,
         "reserve 80 blocks in all, more than the pool's 64"},
        {"pool_blocks = 64\n[namespace a]\nquota = 100\n", NULL, NULL,
         "is more than the pool's 64 blocks"},
        {"pool_bytes = 1GiB\n[namespace a]\nreserve = 1000\n", NULL, NULL,
         "is more than the pool's 512 blocks"},
        {"pool_blocks = 64\n", "--namespace", "x:0:100", "a reservation of 100 blocks"},
        {"pool_blocks = 64\nmax_namespaces = 2\n[namespace a]\n[namespace b]\n[namespace c]\n",
         NULL, NULL, "3 namespaces would exceed max_namespaces (2)"},
        {"pool_blocks = 64\nhost_tier = 1000\n", NULL, NULL, "a host tier of 1000 bytes"},
        {"pool_blocks = 64\nkv_events_identities = a,a\n", "--kv-events", NULL, "NAME,NAME,..."},
    };
    char conf[128], err[4096], sock[128], ev[160];
    make_dir();
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    snprintf(ev, sizeof(ev), "ipc://%s/ev", dir);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_text("k.conf", cases[i].conf, conf, sizeof(conf));
        const char *value = cases[i].value ? cases[i].value : ev;
        const char *check[] = {"--check-config", conf, cases[i].flag, value, NULL};
        ck_assert_int_eq(run(check, err, sizeof(err)), 1);
        ck_assert_msg(strstr(err, cases[i].words), "check, case %zu: %s", i, err);
        const char *start[] = {"--config", conf,          "--socket", sock, "--backend",
                               "host",     cases[i].flag, value,      NULL};
        ck_assert_int_ne(run(start, err, sizeof(err)), 0);
        ck_assert_msg(strstr(err, cases[i].words), "start, case %zu: %s", i, err);
    }
    /* And what fits is taken by both. */
    write_text("k.conf",
               "pool_blocks = 64\n[namespace a]\nreserve = 32\n[namespace b]\n"
               "reserve = 32\n",
               conf, sizeof(conf));
    const char *ok[] = {"--check-config", conf, "--namespace", "c:8:8", NULL};
    ck_assert_int_eq(run(ok, err, sizeof(err)), 0);
    remove_dir();
}
END_TEST

/* Start's checks of the settings alone are one list (preflight.h), which
 * --check-config runs too: each row has a case here that both refuse with
 * the same words (a row added without a case fails the test). Before, all
 * these passed --check-config, and the FIFO hung start in fopen. */
START_TEST(test_preflight_rows_refused_by_both)
{
    char p_t3[200], p_open[160], p_open_t3[200], p_auth[200], p_fifo[200], p_big[200], p_adir[160];
    make_dir();
    snprintf(p_t3, sizeof(p_t3), "%s/t3", dir);
    snprintf(p_open, sizeof(p_open), "%s/open", dir);
    snprintf(p_open_t3, sizeof(p_open_t3), "%s/t3", p_open);
    snprintf(p_auth, sizeof(p_auth), "%s/auth", dir);
    snprintf(p_fifo, sizeof(p_fifo), "%s/afifo", dir);
    snprintf(p_big, sizeof(p_big), "%s/abig", dir);
    snprintf(p_adir, sizeof(p_adir), "%s/adir", dir);
    ck_assert_int_eq(mkdir(p_open, 0700), 0);
    ck_assert_int_eq(chmod(p_open, 0777), 0);
    ck_assert_int_eq(mkdir(p_adir, 0700), 0);
    ck_assert_int_eq(mkfifo(p_fifo, 0600), 0);
    int fd = open(p_big, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 1ll << 30), 0); /* sparse */
    close(fd);
    fd = open(p_auth, O_CREAT | O_WRONLY, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "secret\n", 7), 7);
    close(fd);
    ck_assert_int_eq(chmod(p_auth, 0644), 0);
    const struct {
        size_t row; /* of preflight_checks */
        const char *key, *value, *flag, *flag_value;
        const char *words;
    } cases[] = {
        {0, "devices", "3-1", NULL, NULL, "--devices 3-1: give a range"},
        {1, "disk_tier_path", p_t3, NULL, NULL, "disk_tier_path needs a host tier"},
        {2, "disk_tier_path", p_t3, "--devices", "0-3", "with several devices is not supported"},
        {3, "disk_tier_path", p_open_t3, NULL, NULL, "mode 0777"},
        {4, "cluster_auth_file", p_adir, NULL, NULL, "is not a regular file"},
        {4, "cluster_auth_file", "/dev/null", NULL, NULL, "is not a regular file"},
        {4, "cluster_auth_file", "/dev/zero", NULL, NULL, "is not a regular file"},
        {4, "cluster_auth_file", p_fifo, NULL, NULL, "is not a regular file"},
        {4, "cluster_auth_file", p_big, NULL, NULL, "holds 1073741824 bytes"},
        {4, "cluster_auth_file", p_auth, NULL, NULL, "can be read by every user"},
    };
    bool covered[16] = {false};
    ck_assert_uint_le(preflight_count, 16);
    char conf[128], text[1024], err[4096], sock[128];
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        covered[cases[i].row] = true;
        snprintf(text, sizeof(text), "pool_blocks = 64\n%s%s = %s\n",
                 cases[i].row == 1 || strcmp(cases[i].key, "disk_tier_path") != 0
                     ? ""
                     : "host_tier = 256MiB\n",
                 cases[i].key, cases[i].value);
        if (strcmp(cases[i].key, "disk_tier_path") == 0)
            strcat(text, "disk_tier_bytes = 1MiB\n");
        write_text("k.conf", text, conf, sizeof(conf));
        const char *check[] = {"--check-config", conf, cases[i].flag, cases[i].flag_value, NULL};
        ck_assert_int_eq(run(check, err, sizeof(err)), 1);
        ck_assert_msg(strstr(err, cases[i].words), "check, case %zu: %s", i, err);
        const char *start[] = {"--config", conf,          "--socket",          sock, "--backend",
                               "host",     cases[i].flag, cases[i].flag_value, NULL};
        ck_assert_int_ne(run(start, err, sizeof(err)), 0);
        ck_assert_msg(strstr(err, cases[i].words), "start, case %zu: %s", i, err);
    }
    for (size_t r = 0; r < preflight_count; r++)
        ck_assert_msg(covered[r], "preflight row %zu (%s) has no case here", r,
                      preflight_checks[r].name);
    /* What is right passes both lists (the start itself is other tests'). */
    ck_assert_int_eq(chmod(p_auth, 0600), 0);
    snprintf(text, sizeof(text),
             "pool_blocks = 64\nhost_tier = 256MiB\ndisk_tier_path = %s\ndisk_tier_bytes = "
             "1MiB\ncluster_auth_file = %s\n",
             p_t3, p_auth);
    write_text("k.conf", text, conf, sizeof(conf));
    const char *ok[] = {"--check-config", conf, NULL};
    ck_assert_msg(run(ok, err, sizeof(err)) == 0, "%s", err);
    unlink(p_auth);
    unlink(p_fifo);
    unlink(p_big);
    rmdir(p_adir);
    rmdir(p_open);
    remove_dir();
}
END_TEST

/* A NUL byte in a line ended its value there, silently ("pool_blocks = 6\0
 * 4" gave 6); an [IPv6] endpoint without its bracket closed passed
 * --check-config. Both are refused now. */
START_TEST(test_nul_byte_and_unclosed_endpoint)
{
    char conf[128], err[4096];
    make_dir();
    snprintf(conf, sizeof(conf), "%s/k.conf", dir);
    static const char nul[] = "pool_blocks = 6\0 4\n";
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(nul, 1, sizeof(nul) - 1, f), sizeof(nul) - 1);
    ck_assert_int_eq(fclose(f), 0);
    const char *check[] = {"--check-config", conf, NULL};
    ck_assert_int_eq(run(check, err, sizeof(err)), 1);
    ck_assert_msg(strstr(err, ":1: a NUL byte in the line"), "%s", err);
    const char *bad[] = {"tcp://[::1",   "tcp://[::1]",      "tcp://[]:5557",
                         "tcp://host:0", "tcp://host:70000", "tcp://host:55x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[128];
        snprintf(text, sizeof(text), "pool_blocks = 64\nkv_events = %s\n", bad[i]);
        write_text("k.conf", text, conf, sizeof(conf));
        ck_assert_msg(run(check, err, sizeof(err)) == 1, "%s passed", bad[i]);
        ck_assert_msg(strstr(err, "kv_events"), "%s: %s", bad[i], err);
    }
    const char *good[] = {"tcp://[::1]:5557", "tcp://*:5557", "tcp://node-7:5557",
                          "tcp://127.0.0.1:*"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char text[128];
        snprintf(text, sizeof(text), "pool_blocks = 64\nkv_events = %s\n", good[i]);
        write_text("k.conf", text, conf, sizeof(conf));
        ck_assert_msg(run(check, err, sizeof(err)) == 0, "%s: %s", good[i], err);
    }
    remove_dir();
}
END_TEST

/* Every row is complete, and every default is a value its row accepts. */
START_TEST(test_table_is_consistent)
{
    for (size_t i = 0; i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        ck_assert_msg(row->key || row->flag, "row %zu has neither key nor flag", i);
        ck_assert_msg(row->help && row->help[0], "row %zu has no help", i);
        /* The help goes into a Markdown table cell as it is. */
        ck_assert_msg(!strpbrk(row->help, "|`"), "row %zu: '|' or '`' in its help", i);
        for (size_t j = 0; j < i; j++) {
            const setting_t *other = &settings_table[j];
            if (row->flag && other->flag)
                ck_assert_str_ne(row->flag, other->flag);
            if (row->key && other->key && row->scope == other->scope)
                ck_assert_str_ne(row->key, other->key);
        }
        if (row->type == SETTING_CHOICE)
            ck_assert_ptr_nonnull(row->parse);
        if (row->scope == SETTING_NS)
            ck_assert_ptr_null(row->flag);
    }
    /* A default shown as a value must be one: format it, set it back. */
    settings_t st, back;
    settings_init(&st);
    settings_init(&back);
    for (size_t i = 0; i < settings_count; i++) {
        const setting_t *row = &settings_table[i];
        char value[512], again[512], why[512];
        if (row->scope != SETTING_GLOBAL || !row->key || row->deflt || row->zero)
            continue;
        settings_format(row, &st, value, sizeof(value));
        ck_assert_msg(settings_set(row, &back, value, why, sizeof(why)) == 0,
                      "default of %s, '%s', is refused: %s", row->key, value, why);
        settings_format(row, &back, again, sizeof(again));
        ck_assert_msg(strcmp(value, again) == 0, "default of %s: '%s' set back reads '%s'",
                      row->key, value, again);
    }
}
END_TEST

static Suite *settings_suite(void)
{
    Suite *s = suite_create("ops_settings");
    TCase *tc = tcase_create("settings");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_table_is_consistent);
    tcase_add_test(tc, test_namespace_name_rule);
    tcase_add_test(tc, test_abbreviations_everywhere);
    tcase_add_test(tc, test_flag_and_file_agree);
    tcase_add_test(tc, test_config_path_that_is_no_file);
    tcase_add_test(tc, test_check_config_checks_what_start_checks);
    tcase_add_test(tc, test_preflight_rows_refused_by_both);
    tcase_add_test(tc, test_nul_byte_and_unclosed_endpoint);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(settings_suite)
