/* SPDX-License-Identifier: Apache-2.0 */
#include "harness_client.h"

#include <check.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

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

void harness_wait_restored(const harness_t *h)
{
    kvs_client_t *c = harness_client(h, "wait-restored", 0);
    kvs_restore_status_t rs;
    for (int i = 0; i < 6000; i++) {
        ck_assert_int_eq(kvs_restore_status(c, &rs), 0);
        if (strcmp(rs.phase, "scanning") != 0 && strcmp(rs.phase, "restoring") != 0)
            break;
        usleep(10000);
    }
    ck_assert_msg(strcmp(rs.phase, "scanning") != 0 && strcmp(rs.phase, "restoring") != 0,
                  "the warm restart did not end in a minute: %s, %llu of %llu slots read", rs.phase,
                  (unsigned long long)rs.scanned, (unsigned long long)rs.slots);
    kvs_close(c);
}
