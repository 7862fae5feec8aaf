/* SPDX-License-Identifier: Apache-2.0 */
/*
 * preflight: the checks of the settings that need no pool, no device and no
 * socket, in one list (preflight_checks). Start runs the list before it
 * allocates anything (server_open), and --check-config runs the same list
 * (settings.c), so that a file --check-config passes is never refused at
 * start for one of them; a test walks the list and gives each row a file
 * that both refuse with the same words.
 *
 * Paths are checked without waiting on them: a file is opened O_NONBLOCK
 * and its type checked with fstat before a byte is read, so a FIFO or a
 * device named as a file is refused at once, never waited on.
 */
#ifndef KVS_DAEMON_PREFLIGHT_H
#define KVS_DAEMON_PREFLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "server.h"

#define PREFLIGHT_AUTH_MAX 1023 /* bytes of cluster_auth_file the cluster client reads */

/* One check: cfg's settings, for a daemon running as uid (whose files the
 * paths must be; DISK_ANY_UID: owners are not checked). Returns 0 or
 * KVS_EINVAL / KVS_EDENIED with the message in err. */
typedef struct preflight_check {
    const char *name; /* the settings it looks at */
    int (*run)(const server_config_t *cfg, uid_t uid, char *err, size_t errlen);
} preflight_check_t;

extern const preflight_check_t preflight_checks[];
extern const size_t preflight_count;

/* Every check of the list, in order; the first failure's code and message. */
int preflight_run(const server_config_t *cfg, uid_t uid, char *err, size_t errlen);

/* Parses --devices into ordinals[0..*n): "A-B", "A,B,C" (ranges allowed in
 * the list), each once, at most SERVER_MAX_DEVICES; "all" sets *all (and
 * *n = 0: known once the devices answer). Errors: KVS_EINVAL (message in
 * err). */
int preflight_parse_devices(const char *spec, int *ordinals, uint32_t *n, bool *all, char *err,
                            size_t errlen);

#endif /* KVS_DAEMON_PREFLIGHT_H */
