/* SPDX-License-Identifier: Apache-2.0 */
/* kvs_strerror: the texts of the one status table (kvshare_status.h). */
#include "kvshare.h"

const char *kvs_strerror(int status)
{
    return kvs_status_text(status);
}
