/* SPDX-License-Identifier: Apache-2.0 */
#include "rel_util.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void rel_prompt(uint32_t *tokens, size_t n_tokens, uint32_t family)
{
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i] = family * 100003u + (uint32_t)i;
}

void rel_stats(kvs_client_t *mon, kvs_stats_t *out)
{
    int rc = kvs_stats(mon, out);
    ck_assert_msg(rc == 0, "stats: %s (%s)", kvs_strerror(rc), kvs_last_error(mon));
    ck_assert_msg(out->free_blocks + out->writing_blocks + out->cached_blocks == out->total_blocks,
                  "block accounting: free %u + writing %u + cached %u != pool %u", out->free_blocks,
                  out->writing_blocks, out->cached_blocks, out->total_blocks);
    ck_assert_msg(out->pinned_blocks <= out->cached_blocks, "pinned %u > cached %u",
                  out->pinned_blocks, out->cached_blocks);
}

void rel_wait_quiet(kvs_client_t *mon, uint32_t sessions, int idle, int timeout_ms,
                    kvs_stats_t *out)
{
    kvs_stats_t s;
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        rel_stats(mon, &s);
        if (s.sessions == sessions && (!idle || (s.writing_blocks == 0 && s.pinned_blocks == 0)))
            break;
        if (now_ms() > deadline)
            break;
        kvs_stats_free(&s);
        usleep(5000);
    }
    ck_assert_msg(s.sessions == sessions, "%u sessions, %u expected", s.sessions, sessions);
    if (idle) {
        ck_assert_msg(s.writing_blocks == 0, "%u blocks still WRITING with no client holding any",
                      s.writing_blocks);
        ck_assert_msg(s.pinned_blocks == 0, "%u blocks still pinned with no client holding any",
                      s.pinned_blocks);
        ck_assert_uint_eq(s.free_blocks + s.cached_blocks, s.total_blocks);
    }
    if (out)
        *out = s;
    else
        kvs_stats_free(&s);
}

static long status_kib(pid_t pid, const char *field)
{
    char path[64], line[256], fmt[64];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    snprintf(fmt, sizeof(fmt), "%s: %%ld kB", field);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, fmt, &kib) == 1)
            break;
    fclose(f);
    return kib;
}

long rel_rss_anon_kib(pid_t pid)
{
    return status_kib(pid, "RssAnon");
}

long rel_vm_hwm_kib(pid_t pid)
{
    return status_kib(pid, "VmHWM");
}

int rel_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}
