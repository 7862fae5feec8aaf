/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a fuzz target defines: libFuzzer's entry point, and a cleanup the
 * replay driver (fuzz_replay.c) calls once every seed has run, so that a
 * leak checker sees only what an input leaked.
 */
#ifndef KVS_TEST_FUZZ_H
#define KVS_TEST_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_cleanup(void);

#endif
