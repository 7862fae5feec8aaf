/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one way to leave a message for the caller in a fixed buffer: format
 * it, truncate safely, and hand back the status the message explains, so
 * that `return errbuf_set(msg, sizeof(msg), KVS_EINVAL, "...", ...)` is one
 * line at every failure.
 */
#ifndef KVS_COMMON_ERRBUF_H
#define KVS_COMMON_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>

/* Formats into buf (len bytes, always NUL-terminated; nothing when buf is
 * NULL or len is 0) and returns status. */
int errbuf_set(char *buf, size_t len, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The same with a va_list. */
int errbuf_vset(char *buf, size_t len, int status, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif /* KVS_COMMON_ERRBUF_H */
