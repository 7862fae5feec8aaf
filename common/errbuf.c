/* SPDX-License-Identifier: Apache-2.0 */
#include "errbuf.h"

#include <stdio.h>

int errbuf_vset(char *buf, size_t len, int status, const char *fmt, va_list ap)
{
    if (buf != NULL && len > 0)
        vsnprintf(buf, len, fmt, ap);
    return status;
}

int errbuf_set(char *buf, size_t len, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errbuf_vset(buf, len, status, fmt, ap);
    va_end(ap);
    return status;
}
