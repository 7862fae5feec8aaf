/* SPDX-License-Identifier: Apache-2.0 */
/* kvs_default_socket_path: the default that kvshared computes too
 * (common/socket_path.c), so that both agree without configuration. */
#include "kvshare.h"
#include "socket_path.h"

int kvs_default_socket_path(char *buf, size_t len)
{
    return socket_path_default(buf, len);
}
