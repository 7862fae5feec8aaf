/*
 * Fuzz target: bytes from a socket into a session (frames, protobuf decode,
 * every handler), with the block invariants checked after each input.
 *
 *   clang:  cmake -DKVS_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; ./fuzz_session corpus/
 *   gcc:    the same file builds as a replay driver: fuzz_session FILE...
 *
 * The input is cut into chunks at 0xA5 0x5A markers, each chunk fed as one
 * read, so the fuzzer also explores frames split across reads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "session.h"

static server_t *srv;
static uv_loop_t loop;

static void fuzz_init(void)
{
    server_config_t cfg;
    char err[256];
    log_level = LOG_LEVEL_ERROR;
    uv_loop_init(&loop);
    server_config_init(&cfg);
    cfg.geometry = (geometry_t){
        .layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = GEOMETRY_FP16, .block_tokens = 4};
    cfg.backend.kind = BACKEND_HOST;
    cfg.pool_blocks = 32;
    cfg.max_frame = 1 << 16;
    if (server_open(&cfg, &loop, &srv, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_session: %s\n", err);
        abort();
    }
}

static void check(void)
{
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    if (c.free + c.writing + c.cached != c.total || radix_check(srv->index) != 0)
        abort();
    for (uint32_t b = 0; b < srv->num_blocks; b++) {
        pool_state_t st;
        pool_state(srv->pool, b, &st);
        if ((st == POOL_WRITING) != (srv->writer[b] != NULL))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!srv)
        fuzz_init();
    session_t *a, *b;
    if (session_new(srv, &a) != 0 || session_new(srv, &b) != 0)
        abort();
    size_t start = 0;
    for (size_t i = 0; i + 1 <= size; i++) {
        int cut = i + 1 < size && data[i] == 0xA5 && data[i + 1] == 0x5A;
        if (!cut && i + 1 < size)
            continue;
        size_t end = cut ? i : size;
        /* Alternate sessions per chunk: ids held by one are foreign to the other. */
        session_t *s = (start / 7) % 2 ? b : a;
        if (!s->closing && session_feed(s, data + start, end - start) != 0) {
            session_close(s, "fuzz");
            if (session_new(srv, s == a ? &a : &b) != 0)
                abort();
        }
        frame_buf_reset(&a->out);
        frame_buf_reset(&b->out);
        check();
        start = cut ? i + 2 : size;
    }
    session_close(a, "fuzz");
    session_close(b, "fuzz");
    check();
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    if (c.writing != 0 || radix_pinned_blocks(srv->index) != 0)
        abort();
    return 0;
}

#ifndef KVS_LIBFUZZER
int main(int argc, char **argv)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "fuzz_session: cannot open %s\n", argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 20];
        size_t len = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
        n++;
    }
    server_free(srv);
    uv_loop_close(&loop);
    printf("fuzz_session: %d inputs replayed\n", n);
    return 0;
}
#endif
