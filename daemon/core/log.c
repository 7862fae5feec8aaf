/* SPDX-License-Identifier: Apache-2.0 */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvshare_status.h"

log_level_t log_level = LOG_LEVEL_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int log_level_parse(const char *name, log_level_t *out)
{
    if (!name || !out)
        return KVS_EINVAL;
    for (int i = 0; i <= LOG_LEVEL_DEBUG; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (log_level_t)i;
            return 0;
        }
    }
    return KVS_EINVAL;
}

const char *log_level_name(log_level_t level)
{
    if ((unsigned)level > LOG_LEVEL_DEBUG)
        return NULL;
    return level_names[level];
}

void log_write(log_level_t level, const char *fmt, ...)
{
    char line[1024];
    char stamp[32];
    struct timespec now;
    struct tm tm;
    va_list ap;

    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* Under systemd (stderr is the journal), a "<N>" syslog priority prefix
     * gives each line its level in the journal (journalctl -p warning). */
    static int journal = -1;
    static const int priorities[] = {3, 4, 6, 7};
    char prio[8] = "";
    if (journal < 0)
        journal = getenv("JOURNAL_STREAM") != NULL;
    if (journal)
        snprintf(prio, sizeof(prio), "<%d>", priorities[level]);
    /* One fprintf per line so lines from a crash handler or a second thread
     * never interleave mid-line. */
    fprintf(stderr, "%s%s.%03ldZ kvshared %s: %s\n", prio, stamp, now.tv_nsec / 1000000,
            level_names[level], line);
}

const char *log_escape(const char *text, char *buf, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t at = 0;
    if (len == 0)
        return buf;
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++) {
        bool plain = *p >= 0x20 && *p < 0x7f && *p != '\\' && *p != '\'';
        size_t need = plain ? 1 : 4;
        if (at + need >= len)
            break;
        if (plain) {
            buf[at++] = (char)*p;
        } else {
            buf[at++] = '\\';
            buf[at++] = 'x';
            buf[at++] = hex[*p >> 4];
            buf[at++] = hex[*p & 15];
        }
    }
    buf[at] = '\0';
    return buf;
}
