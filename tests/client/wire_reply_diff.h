/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The client's Lookup reply read in place (client/wire.h) against protobuf-c:
 * shared by test_client and the fuzz_lookup_codec target.
 */
#ifndef KVS_TEST_WIRE_REPLY_DIFF_H
#define KVS_TEST_WIRE_REPLY_DIFF_H

#include <stddef.h>
#include <stdint.h>

/* Reads body both ways. Returns 1 when wire_lookup_reply_decode took it,
 * 0 when it did not; -1 (with why set) when it took a frame that
 * protobuf-c reads otherwise: refuses, reads as another reply or an
 * error, with unknown fields, or with any other value. */
int wire_reply_diff(const uint8_t *body, size_t len, const char **why);

#endif /* KVS_TEST_WIRE_REPLY_DIFF_H */
