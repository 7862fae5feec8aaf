/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers of the reliability tests, run against a real kvshared (started by
 * tests/support/daemon_harness.c): the daemon's block accounting as Stats
 * reports it, and the daemon process's memory and descriptors as /proc shows
 * them. Clients of that daemon: tests/support/harness_client.h; raw sockets
 * that misbehave: tests/support/raw_wire.h.
 *
 * The helpers assert with Check (ck_assert), so they are for test bodies,
 * not for forked worker processes: workers report through return codes or
 * shared memory instead.
 */
#ifndef KVS_TEST_REL_UTIL_H
#define KVS_TEST_REL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvshare.h"
#include "kvshare.pb-c.h"
#include "now.h"
#include "raw_wire.h"

/* The harness geometry: 4 tokens per block. */
#define REL_BT 4

/* Prompt `family` of n_tokens tokens: families share nothing, and the same
 * family always gives the same tokens. */
void rel_prompt(uint32_t *tokens, size_t n_tokens, uint32_t family);

/* The byte at offset i of layer l, K/V kv of the block holding prompt
 * block j of family f: what writers put there and readers check. */
static inline uint8_t rel_pattern(uint32_t f, size_t j, uint32_t l, uint32_t kv, size_t i)
{
    return (uint8_t)(f * 131 + j * 29 + l * 7 + kv * 3 + i);
}

/* Stats with the block accounting checked: free + writing + cached == total
 * and pinned <= cached. Free out->namespaces with kvs_stats_free. */
void rel_stats(kvs_client_t *mon, kvs_stats_t *out);

/* Waits (polling Stats, up to timeout_ms) until the daemon counts `sessions`
 * sessions, then checks that nothing is WRITING or pinned when `idle` is
 * set (no client holds anything). Fills *out when not NULL. */
void rel_wait_quiet(kvs_client_t *mon, uint32_t sessions, int idle, int timeout_ms,
                    kvs_stats_t *out);

/* Under AddressSanitizer (freed memory waits in a quarantine) or valgrind,
 * the daemon's resident memory says nothing about leaks; the checker itself
 * checks the daemon when it exits instead, and harness_stop then reports its
 * failure. */
#ifdef KVS_TEST_DAEMON_CHECKED
#define REL_RSS_MEANINGFUL 0
#else
#define REL_RSS_MEANINGFUL 1
#endif

/* Anonymous resident memory of a process (RssAnon), in KiB; -1 if unknown. */
long rel_rss_anon_kib(pid_t pid);

/* Peak resident memory of a process (VmHWM), in KiB; -1 if unknown. */
long rel_vm_hwm_kib(pid_t pid);

/* Open descriptors of a process; -1 if unknown. */
int rel_fd_count(pid_t pid);

#endif
