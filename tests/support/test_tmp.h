/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Temporary directories for tests and benchmarks: under $TMPDIR when it is
 * set (an absolute path), else /tmp.
 */
#ifndef KVS_TEST_TMP_H
#define KVS_TEST_TMP_H

#include <stddef.h>

/* Creates a new directory "<tmp>/<prefix>-XXXXXX" (mkdtemp) and writes its
 * path into buf. Returns 0, or -1 (buf too small, or mkdtemp failed; errno
 * set). */
int test_tmp_dir(const char *prefix, char *buf, size_t len);

/* Creates a new file "<tmp>/<prefix>-XXXXXX" (mkstemp), writes its path into
 * buf and returns its descriptor, or -1 (buf too small, or mkstemp failed). */
int test_tmp_file(const char *prefix, char *buf, size_t len);

#endif /* KVS_TEST_TMP_H */
