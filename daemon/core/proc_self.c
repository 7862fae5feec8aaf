/* SPDX-License-Identifier: Apache-2.0 */
#include "proc_self.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvshare_status.h"

/* The fields of /proc/self/stat after the command name, counted from the
 * state (field 3 in proc(5)). */
enum { STAT_STARTTIME = 22 - 3, STAT_VSIZE = 23 - 3, STAT_RSS = 24 - 3 };

/* The boot time in seconds since the epoch: /proc/stat's btime line. */
static int boot_time(unsigned long long *out)
{
    FILE *f = fopen("/proc/stat", "r");
    char *line = NULL;
    size_t cap = 0;
    int rc = -1;
    if (!f)
        return -1;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, "btime ", 6) == 0) {
            rc = sscanf(line + 6, "%llu", out) == 1 ? 0 : -1;
            break;
        }
    }
    free(line);
    fclose(f);
    return rc;
}

/* /proc/self/stat: the start in clock ticks after boot, the virtual size in
 * bytes and the resident set in pages. The command name may hold spaces and
 * parentheses: the fields start after its last ')'. */
static int read_stat(unsigned long long *start_ticks, unsigned long long *vsize,
                     unsigned long long *rss_pages)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p++;
    int got = 0;
    for (int i = 0; i <= STAT_RSS; i++) {
        while (*p == ' ')
            p++;
        if (!*p)
            return -1;
        char *end = p;
        while (*end && *end != ' ')
            end++;
        if (i == STAT_STARTTIME || i == STAT_VSIZE || i == STAT_RSS) {
            unsigned long long v = strtoull(p, NULL, 10);
            if (i == STAT_STARTTIME)
                *start_ticks = v;
            else if (i == STAT_VSIZE)
                *vsize = v;
            else
                *rss_pages = v;
            got++;
        }
        p = end;
    }
    return got == 3 ? 0 : -1;
}

/* Entries of /proc/self/fd, less the one the listing itself holds open. */
static int open_fds(uint64_t *out)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    uint64_t n = 0;
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    *out = n > 0 ? n - 1 : 0;
    return 0;
}

int proc_self_read(proc_self_t *out)
{
    /* The start time cannot change: it is read once (the boot time it is
     * counted from is whole seconds, and stays put between scrapes). */
    static double start_time;
    static int has_start_time;
    unsigned long long start_ticks = 0, vsize = 0, rss_pages = 0, btime;
    struct rusage ru;
    struct rlimit rl;

    if (!out)
        return KVS_EINVAL;
    memset(out, 0, sizeof(*out));
    int stat_ok = read_stat(&start_ticks, &vsize, &rss_pages) == 0;
    if (stat_ok) {
        long page = sysconf(_SC_PAGESIZE);
        out->virtual_bytes = vsize;
        out->resident_bytes = rss_pages * (unsigned long long)(page > 0 ? page : 4096);
        out->has_memory = 1;
    }
    if (!has_start_time && stat_ok && boot_time(&btime) == 0) {
        long hz = sysconf(_SC_CLK_TCK);
        start_time = (double)btime + (double)start_ticks / (double)(hz > 0 ? hz : 100);
        has_start_time = 1;
    }
    out->start_time_seconds = start_time;
    out->has_start_time = has_start_time;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        out->cpu_seconds = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        out->has_cpu = 1;
    }
    out->has_open_fds = open_fds(&out->open_fds) == 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        out->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
        out->has_max_fds = 1;
    }
    return 0;
}
