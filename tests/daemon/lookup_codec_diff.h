/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hand-written Lookup codec (daemon/core/lookup_codec.h) against protobuf-c:
 * shared by test_lookup_codec and the fuzz_lookup_codec target.
 */
#ifndef KVS_TEST_WIRE_DIFF_H
#define KVS_TEST_WIRE_DIFF_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare.pb-c.h"

/* Decodes body both ways. Returns 1 when lookup_decode took it, 0 when
 * it did not; -1 (with why set) when it took a frame that protobuf-c reads
 * otherwise: refuses, reads as another RPC, with unknown fields, or with
 * any other value. */
int lookup_codec_diff_request(const uint8_t *body, size_t len, const char **why);

/* Packs resp (a Lookup reply) both ways. Returns 0 when the sizes and the
 * bytes agree, else -1 with why set. */
int lookup_codec_diff_reply(const Kvshare__Response *resp, const char **why);

#endif /* KVS_TEST_WIRE_DIFF_H */
