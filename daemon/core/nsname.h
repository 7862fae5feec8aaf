/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nsname: the one rule for a namespace name, wherever a name comes from: a
 * [namespace NAME] section of the config file, a --namespace flag, or a
 * request (Lookup, Alloc, Commit, Tree).
 *
 * A name is 1 to RADIX_NS_NAME_MAX bytes of ASCII letters, digits, '-', '_'
 * and '.': safe in a log line, a Prometheus label and a file name without
 * quoting. The index (radix.h) stores any name up to that length; the rule
 * is the daemon's.
 */
#ifndef KVS_DAEMON_NSNAME_H
#define KVS_DAEMON_NSNAME_H

#include <stdbool.h>

#include "radix.h"

/* Whether name follows the rule. NULL is not a name. */
bool nsname_valid(const char *name);

/* The rule, for error messages: "1 to 63 letters, digits, '-', '_' or '.'". */
const char *nsname_rule(void);

#endif /* KVS_DAEMON_NSNAME_H */
