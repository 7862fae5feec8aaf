/* SPDX-License-Identifier: Apache-2.0 */
#include "harness_client.h"

#include <check.h>
#include <stddef.h>

kvs_client_t *harness_client(const harness_t *h, const char *worker_name, unsigned flags)
{
    return harness_client_ms(h, worker_name, flags, HARNESS_CLIENT_MS);
}

kvs_client_t *harness_client_ms(const harness_t *h, const char *worker_name, unsigned flags,
                                int timeout_ms)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = h->socket_path;
    o.worker_name = worker_name;
    o.flags = flags;
    o.timeout_ms = timeout_ms;
    int rc = kvs_connect(&o, &c);
    ck_assert_msg(rc == 0, "connect %s: %s", worker_name ? worker_name : "(unnamed)",
                  kvs_strerror(rc));
    return c;
}
