/* SPDX-License-Identifier: Apache-2.0 */
#include "test_tmp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* "<tmp>/<prefix>-XXXXXX" into buf: 0, or -1 when it does not fit. */
static int template(const char *prefix, char *buf, size_t len)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || tmp[0] != '/')
        tmp = "/tmp";
    int n = snprintf(buf, len, "%s/%s-XXXXXX", tmp, prefix);
    if (n < 0 || (size_t)n >= len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

int test_tmp_dir(const char *prefix, char *buf, size_t len)
{
    if (template(prefix, buf, len) != 0)
        return -1;
    return mkdtemp(buf) ? 0 : -1;
}

int test_tmp_file(const char *prefix, char *buf, size_t len)
{
    if (template(prefix, buf, len) != 0)
        return -1;
    return mkstemp(buf);
}
