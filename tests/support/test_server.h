/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A kvshared server in the test's own process, on the test's loop (Check
 * suites only: it asserts): the small geometry the in-process suites share,
 * opening and closing. A suite sets what it tests on the config between
 * test_server_config and test_server_open.
 */
#ifndef KVS_TEST_SERVER_H
#define KVS_TEST_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "kvshared.h"

/* 2 layers, 2 KV heads of 8 dims, FP16: 128 bytes a token. */
#define TEST_GEOMETRY(bt)                                                                          \
    ((geometry_t){                                                                                 \
        .layers = 2, .kv_heads = 2, .head_dim = 8, .dtype = GEOMETRY_FP16, .block_tokens = (bt)})

/* *cfg: server_config_init's, then TEST_GEOMETRY(block_tokens) on the host
 * backend with pool_blocks blocks. */
void test_server_config(server_config_t *cfg, uint32_t block_tokens, uint32_t pool_blocks);

/* Initialises loop and opens a server of cfg on it; fails the test (with
 * server_open's message) when it does not open. */
server_t *test_server_open(uv_loop_t *loop, const server_config_t *cfg);

/* Frees srv, runs the loop's callbacks left (handles closing) and closes
 * the loop, which must then be empty. A server that listened is shut down
 * and drained first (server_shutdown, server_drain_done). */
void test_server_close(uv_loop_t *loop, server_t *srv, bool listened);

#endif /* KVS_TEST_SERVER_H */
