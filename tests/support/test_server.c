/* SPDX-License-Identifier: Apache-2.0 */
#include "test_server.h"

#include <check.h>

void test_server_config(server_config_t *cfg, uint32_t block_tokens, uint32_t pool_blocks)
{
    server_config_init(cfg);
    cfg->geometry = TEST_GEOMETRY(block_tokens);
    cfg->backend.kind = BACKEND_HOST;
    cfg->pool_blocks = pool_blocks;
}

server_t *test_server_open(uv_loop_t *loop, const server_config_t *cfg)
{
    char err[256] = "";
    server_t *srv = NULL;
    ck_assert_int_eq(uv_loop_init(loop), 0);
    ck_assert_msg(server_open(cfg, loop, &srv, err, sizeof(err)) == 0, "server_open: %s", err);
    return srv;
}

void test_server_close(uv_loop_t *loop, server_t *srv, bool listened)
{
    if (listened) {
        server_shutdown(srv);
        uv_run(loop, UV_RUN_DEFAULT);
        server_drain_done(srv);
        uv_run(loop, UV_RUN_NOWAIT);
    }
    server_free(srv);
    uv_run(loop, UV_RUN_DEFAULT); /* close callbacks */
    ck_assert_int_eq(uv_loop_close(loop), 0);
}
