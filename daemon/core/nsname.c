/* SPDX-License-Identifier: Apache-2.0 */
#include "nsname.h"

#include <string.h>

#define STR_(x) #x
#define STR(x)  STR_(x)

bool nsname_valid(const char *name)
{
    if (!name)
        return false;
    size_t len = strnlen(name, RADIX_NS_NAME_MAX + 1);
    if (len == 0 || len > RADIX_NS_NAME_MAX)
        return false;
    for (const char *p = name; *p; p++) {
        /* ASCII only: isalnum() would follow the locale. */
        bool ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                  (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.';
        if (!ok)
            return false;
    }
    return true;
}

const char *nsname_rule(void)
{
    return "1 to " STR(RADIX_NS_NAME_MAX) " letters, digits, '-', '_' or '.'";
}
