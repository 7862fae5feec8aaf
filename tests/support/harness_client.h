/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A libkvshare client of the test daemon (daemon_harness.h), for the body of
 * a Check suite: a connect that fails fails the test with the reason
 * (ck_assert), so it is not for forked worker processes, which report
 * through return codes instead. Linked as kvs_test_client (Check suites
 * only; the launcher and the harness need neither Check nor libkvshare).
 */
#ifndef KVS_TEST_HARNESS_CLIENT_H
#define KVS_TEST_HARNESS_CLIENT_H

#include "daemon_harness.h"
#include "kvshare.h"

/* harness_client's deadline of each call, connect included: long enough
 * that only a failing test waits it out. */
#define HARNESS_CLIENT_MS 30000

/* A client of h's daemon, connected: worker_name is the name the daemon logs
 * (NULL: none), flags kvs_options_t.flags (0, KVS_NO_MAP, KVS_MAP_TIER2...),
 * each call's deadline HARNESS_CLIENT_MS. Close it with kvs_close. */
kvs_client_t *harness_client(const harness_t *h, const char *worker_name, unsigned flags);

/* The same with each call's deadline timeout_ms, for a test whose daemon
 * answers slower than that (a large pool under valgrind). */
kvs_client_t *harness_client_ms(const harness_t *h, const char *worker_name, unsigned flags,
                                int timeout_ms);

/* Waits (up to a minute) until h's daemon has ended the disk tier's warm
 * restart (kvs_restore_status: done, failed, or none ran), so that what the
 * file held is in the index; fails the test otherwise. */
void harness_wait_restored(const harness_t *h);

#endif
