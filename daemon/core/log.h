/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log: the daemon's log lines on stderr, one per event.
 *
 * The macros check the level before evaluating their arguments, so a debug
 * line on the request path costs one comparison when debug is off.
 */
#ifndef KVS_DAEMON_LOG_H
#define KVS_DAEMON_LOG_H

#include <stddef.h>

typedef enum log_level {
    LOG_LEVEL_ERROR = 0,
    LOG_LEVEL_WARN = 1,
    LOG_LEVEL_INFO = 2,
    LOG_LEVEL_DEBUG = 3,
} log_level_t;

/* The current level: lines above it are dropped. Default LOG_LEVEL_INFO. */
extern log_level_t log_level;

/* Parses "error", "warn", "info", "debug". Returns 0 or KVS_EINVAL. */
int log_level_parse(const char *name, log_level_t *out);

/* "error", "warn", "info", "debug"; NULL for an unknown level. */
const char *log_level_name(log_level_t level);

/* Copies text into buf (len bytes, NUL included) as printable ASCII: every
 * other byte, and ' and \, become \xNN, so that text from a client can
 * neither forge a log line nor send escapes to a terminal. Cut to fit, never
 * inside an escape. Returns buf. */
const char *log_escape(const char *text, char *buf, size_t len);

/* Writes one line: UTC time, level, message. Use the macros instead. */
void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_AT(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= log_level)                                                                  \
            log_write((level), __VA_ARGS__);                                                       \
    } while (0)
#define LOG_ERROR(...) LOG_AT(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...)  LOG_AT(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...)  LOG_AT(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOG_AT(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif /* KVS_DAEMON_LOG_H */
