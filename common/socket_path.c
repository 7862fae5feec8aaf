/* SPDX-License-Identifier: Apache-2.0 */
#include "socket_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvshare_status.h"

int socket_path_default(char *buf, size_t len)
{
    const char *env = getenv("KVSHARE_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;

    if (!buf || len == 0)
        return KVS_EINVAL;
    if (env && env[0])
        n = snprintf(buf, len, "%s", env);
    else if (xdg && xdg[0] == '/')
        n = snprintf(buf, len, "%s/kvshare/kvshared.sock", xdg);
    else if (geteuid() == 0)
        n = snprintf(buf, len, "/run/kvshare/kvshared.sock");
    else
        n = snprintf(buf, len, "/tmp/kvshare-%u/kvshared.sock", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= len)
        return KVS_EINVAL;
    return 0;
}
