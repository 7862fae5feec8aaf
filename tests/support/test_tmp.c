#include "test_tmp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int test_tmp_dir(const char *prefix, char *buf, size_t len)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || tmp[0] != '/')
        tmp = "/tmp";
    int n = snprintf(buf, len, "%s/%s-XXXXXX", tmp, prefix);
    if (n < 0 || (size_t)n >= len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(buf) ? 0 : -1;
}
