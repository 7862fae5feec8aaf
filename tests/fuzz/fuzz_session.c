/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target: bytes from a socket into sessions (frames, protobuf decoding,
 * every handler), with the daemon's invariants checked after each read.
 *
 *   clang:  tools/fuzz.sh (libFuzzer, ASan + UBSan)
 *   gcc:    the same file with fuzz_replay.c runs the seeds in corpus_session/
 *
 * Each input gets a fresh daemon state (a 32-block pool) and two sessions, so
 * a crash replays from its input alone. The input is cut into chunks at
 * 0xA5 0x5A markers, each chunk fed as one read, so the fuzzer also explores
 * frames split across reads; chunks go to one session or the other, so
 * block ids held by one are foreign to the other; an empty chunk (two
 * markers in a row) closes the session whose turn it is, as a client that
 * hangs up or dies holding blocks, and a new one takes its place. After each
 * chunk:
 *   - every reply frame decodes, with a status from the status table;
 *   - free + writing + cached == pool blocks, and the index checks out;
 *   - a block is WRITING iff a live session lists it, at the right place;
 *   - each cached block's refcount is the sum of the sessions' pins on it,
 *     and no session holds a pin on a block that is not cached.
 * After both sessions close: nothing is WRITING, nothing is pinned.
 *
 * The daemon runs without a tier 2 here (--host-tier 0). With one, an Alloc
 * on a full pool or a Lookup that matches tier-2 blocks starts a copy job on
 * libuv's thread pool and defers the request until the job's completion runs
 * on the loop (daemon/store/tier.c); this target feeds sessions directly and never
 * runs the loop, so such a request would never be answered. Running the loop
 * after each chunk until no job is left would answer it, but the checks
 * above would then need what only tier.c knows while a job runs (the pins it
 * holds, the tier-1 ids it copies from, which are neither free nor cached),
 * and the order in which jobs end would depend on the threads. The index's
 * side of the tiers is fuzzed by fuzz_radix (demotions, promotions, copy
 * ends, tier-2 drops, in any order); the daemon's by test_tier (SIGKILL
 * during promotion and demotion, a full tier 2).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kvshare_status.h"
#include "log.h"
#include "kvshared.h"
#include "session_io.h"
#include "store.h"

#define FUZZ_SESSIONS 2

static uv_loop_t loop;
static int loop_ready;
static int verbose; /* KVS_FUZZ_VERBOSE=1: print every reply (reading seeds) */

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_session: invariant broken: %s (line %d)\n", #cond, __LINE__);    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static server_t *open_server(void)
{
    server_config_t cfg;
    server_t *srv = NULL;
    char err[256];
    if (!loop_ready) {
        log_level = LOG_LEVEL_ERROR;
        verbose = getenv("KVS_FUZZ_VERBOSE") != NULL;
        uv_loop_init(&loop);
        loop_ready = 1;
    }
    server_config_init(&cfg);
    cfg.geometry = (geometry_t){
        .layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = GEOMETRY_FP16, .block_tokens = 4};
    cfg.backend.kind = BACKEND_HOST;
    cfg.pool_blocks = 32;
    cfg.max_frame = 1 << 16;
    cfg.max_namespaces = 8;
    if (server_open(&cfg, &loop, &srv, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_session: %s\n", err);
        abort();
    }
    return srv;
}

/* Every reply frame in out decodes; then out is emptied. */
static void check_replies(frame_buf_t *out)
{
    size_t p = out->head;
    while (p < out->len) {
        FUZZ_CHECK(out->len - p >= FRAME_HEADER_BYTES);
        uint32_t len = frame_get_len(out->data + p);
        FUZZ_CHECK(out->len - p - FRAME_HEADER_BYTES >= len);
        Kvshare__Response *r =
            kvshare__response__unpack(NULL, len, out->data + p + FRAME_HEADER_BYTES);
        FUZZ_CHECK(r != NULL);
        FUZZ_CHECK((int)r->status >= 0 && (int)r->status < KVS_STATUS_COUNT);
        FUZZ_CHECK(r->status == 0 || (r->message && r->message[0]));
        if (verbose)
            fprintf(stderr, "  reply %llu: %s%s%s\n", (unsigned long long)r->id,
                    kvs_status_text(-(int)r->status), r->status ? ": " : "",
                    r->status ? r->message : "");
        kvshare__response__free_unpacked(r, NULL);
        p += FRAME_HEADER_BYTES + len;
    }
    frame_buf_reset(out);
}

/* Closes a session whose stream went bad, after checking its replies (the
 * last says why), and opens a new one in its place. */
static void replace(server_t *srv, session_t **sp)
{
    FUZZ_CHECK(session_broken(*sp) != 0 || (*sp)->out.len > (*sp)->out.head);
    check_replies(&(*sp)->out);
    session_close(*sp, "fuzz: bad stream");
    FUZZ_CHECK(session_new(srv, sp) == 0);
}

static void check(server_t *srv, session_t *const *s, size_t n)
{
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    FUZZ_CHECK(c.free + c.writing + c.cached == c.total);
    FUZZ_CHECK(c.total == srv->num_blocks);
    FUZZ_CHECK(radix_check(srv->index) == 0);
    FUZZ_CHECK(radix_cached_blocks(srv->index) == c.cached);
    FUZZ_CHECK(srv->sessions.len == n);

    uint32_t writing = 0, pinned = 0;
    for (size_t k = 0; k < n; k++)
        writing += s[k]->own.n_writing;
    FUZZ_CHECK(writing == c.writing);
    for (uint32_t b = 0; b < srv->num_blocks; b++) {
        pool_state_t st;
        FUZZ_CHECK(pool_state(srv->pool, b, &st) == 0);
        session_t *w = store_writer(srv->store, b);
        FUZZ_CHECK((st == POOL_WRITING) == (w != NULL));
        if (w) {
            int live = 0;
            for (size_t k = 0; k < n; k++)
                live |= s[k] == w;
            FUZZ_CHECK(live);
            FUZZ_CHECK(store_writer_pos(srv->store, b) < w->own.n_writing &&
                       w->own.writing[store_writer_pos(srv->store, b)] == b);
        }
        uint64_t pins = 0;
        for (size_t k = 0; k < n; k++)
            pins += session_pin_count(s[k], b);
        uint32_t ref = 0;
        int rc = radix_block_refcount(srv->index, b, &ref);
        if (st == POOL_CACHED) {
            FUZZ_CHECK(rc == 0);
            FUZZ_CHECK(ref == pins);
        } else {
            FUZZ_CHECK(rc == KVS_ENOTFOUND);
            FUZZ_CHECK(pins == 0);
        }
        pinned += pins > 0;
    }
    FUZZ_CHECK(radix_pinned_blocks(srv->index) == pinned);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    server_t *srv = open_server();
    session_t *s[FUZZ_SESSIONS];
    for (size_t k = 0; k < FUZZ_SESSIONS; k++)
        FUZZ_CHECK(session_new(srv, &s[k]) == 0);

    size_t start = 0, chunk = 0;
    while (start < size) {
        size_t end = start;
        while (end < size && !(end + 1 < size && data[end] == 0xA5 && data[end + 1] == 0x5A))
            end++;
        session_t **sp = &s[chunk++ % FUZZ_SESSIONS];
        if (end == start) {
            /* An empty chunk: that client hangs up, whatever it holds, and
             * a new one takes its place. */
            session_close(*sp, "fuzz: hang up");
            FUZZ_CHECK(session_new(srv, sp) == 0);
        } else if (session_feed(*sp, data + start, end - start) != 0) {
            /* An untrusted stream: the reply says why, then the connection
             * goes and everything it held with it. A new client takes its
             * place. */
            replace(srv, sp);
        }
        /* A Commit in this chunk may have released the other session's
         * held lookup: its turn (from the ready queue) answers it and runs
         * the frames behind it, which may have been garbage. */
        uv_run(&loop, UV_RUN_NOWAIT);
        for (size_t k = 0; k < FUZZ_SESSIONS; k++)
            if (session_broken(s[k]))
                replace(srv, &s[k]);
        for (size_t k = 0; k < FUZZ_SESSIONS; k++)
            check_replies(&s[k]->out);
        check(srv, s, FUZZ_SESSIONS);
        start = end + 2;
    }
    for (size_t k = 0; k < FUZZ_SESSIONS; k++)
        session_close(s[k], "fuzz");
    check(srv, s, 0);
    pool_counts_t c;
    pool_counts(srv->pool, &c);
    FUZZ_CHECK(c.writing == 0);
    FUZZ_CHECK(radix_pinned_blocks(srv->index) == 0);
    server_free(srv);
    /* Close callbacks of the loop handles (the ready queue's, the hold
     * timer). */
    uv_run(&loop, UV_RUN_NOWAIT);
    return 0;
}

void fuzz_cleanup(void)
{
    if (loop_ready)
        uv_loop_close(&loop);
}
