/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-worker --kvs against a real kvshared (host backend, the small
 * model's geometry, a temporary socket): worker processes that share a long
 * system prompt through the daemon produce exactly the private run's tokens
 * and final logits, compute only what the cache lacked, and leave nothing
 * pinned or WRITING behind, also when their prefix went to tier 2
 * (--host-tier) and came back. Times to first token are printed, not asserted.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvscache.h"
#include "kvshare.h"
#include "launch.h"
#include "model.h"
#include "workload.h"
#include "test_tmp.h"
#include "tierfill.h"

#ifndef WORKER_PATH
#error "WORKER_PATH must name the kvshare-worker binary"
#endif

/* The workload: one 256-token system prompt (16 full blocks), questions of
 * 20..60 tokens, 6 generated tokens; 6 requests in all. */
#define SYSTEM_TOKENS 256
#define REQUESTS      6
#define DECODE        6
#define MAX_LINE      4096
#define LOGITS        256 /* final logits: the small model's vocabulary */

static const char *const daemon_geometry[] = {
    "--layers", "2",    "--kv-heads",     "2",  "--head-dim", "16",
    "--dtype",  "fp32", "--block-tokens", "16", NULL,
};

typedef struct request_line {
    uint32_t request, prompt, matched, prefill;
    double ttft_ms;
    char cache[16];
    char tail[MAX_LINE]; /* "logits_hash":...,"generated":[...] */
} request_line_t;

typedef struct run_out {
    request_line_t req[REQUESTS];
    uint32_t n;
    char summary[MAX_LINE];
} run_out_t;

static char scratch_dir[64];

static void scratch_init(void)
{
    ck_assert_int_eq(test_tmp_dir("kvs-worker", scratch_dir, sizeof(scratch_dir)), 0);
}

static void scratch_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", scratch_dir, name);
}

static void scratch_cleanup(void)
{
    static const char *const names[] = {"ref.txt", "ref.bin", "a.txt", "a.bin",  "b.txt",
                                        "b.bin",   "c.txt",   "c.bin", "err.txt"};
    char p[128];

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        scratch_path(p, sizeof(p), names[i]);
        unlink(p);
    }
    rmdir(scratch_dir);
}

/* Starts kvshare-worker with the workload's options, requests [first, first
 * + count), stdout to <name>.txt, logits to <name>.bin, stderr to err.txt. */
static pid_t worker_spawn(const char *mode, const char *socket_path, uint32_t first, uint32_t count,
                          const char *name)
{
    char out[128], bin[128], err[128], first_s[16], count_s[16];
    pid_t pid;

    snprintf(out, sizeof(out), "%s/%s.txt", scratch_dir, name);
    snprintf(bin, sizeof(bin), "%s/%s.bin", scratch_dir, name);
    scratch_path(err, sizeof(err), "err.txt");
    snprintf(first_s, sizeof(first_s), "%" PRIu32, first);
    snprintf(count_s, sizeof(count_s), "%" PRIu32, count);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        const char *argv[32];
        int n = 0, fd;

        fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0)
            _exit(126);
        fd = open(err, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(126);
        argv[n++] = WORKER_PATH;
        argv[n++] = mode;
        if (socket_path) {
            argv[n++] = "--socket";
            argv[n++] = socket_path;
            argv[n++] = "--timeout-ms";
            argv[n++] = "5000";
        }
        argv[n++] = "--model";
        argv[n++] = "small";
        argv[n++] = "--system-tokens";
        argv[n++] = "256";
        argv[n++] = "--question-tokens";
        argv[n++] = "40";
        argv[n++] = "--decode";
        argv[n++] = "6";
        argv[n++] = "--first";
        argv[n++] = first_s;
        argv[n++] = "--requests";
        argv[n++] = count_s;
        argv[n++] = "--json";
        argv[n++] = "--logits-out";
        argv[n++] = bin;
        argv[n] = NULL;
        execv(WORKER_PATH, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int worker_wait(pid_t pid)
{
    int status;
    pid_t r;

    do {
        r = waitpid(pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    ck_assert_int_eq(r, pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static uint64_t json_u64(const char *line, const char *key)
{
    char pat[64];
    const char *p;

    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(line, pat);
    ck_assert_msg(p != NULL, "no %s in %s", key, line);
    return strtoull(p + strlen(pat), NULL, 10);
}

static double json_double(const char *line, const char *key)
{
    char pat[64];
    const char *p;

    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(line, pat);
    ck_assert_msg(p != NULL, "no %s in %s", key, line);
    return strtod(p + strlen(pat), NULL);
}

/* Reads a worker's JSON output: one line per request, then the summary. */
static void read_run(const char *name, run_out_t *out)
{
    char path[128], line[MAX_LINE];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s.txt", scratch_dir, name);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    memset(out, 0, sizeof(*out));
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "{\"summary\"", 10) == 0) {
            snprintf(out->summary, sizeof(out->summary), "%s", line);
            continue;
        }
        ck_assert_uint_lt(out->n, REQUESTS);
        request_line_t *r = &out->req[out->n++];
        const char *cache = strstr(line, "\"cache\":\"");
        const char *tail = strstr(line, "\"logits_hash\"");
        ck_assert(cache && tail);
        r->request = (uint32_t)json_u64(line, "request");
        r->prompt = (uint32_t)json_u64(line, "prompt_tokens");
        r->matched = (uint32_t)json_u64(line, "matched_tokens");
        r->prefill = (uint32_t)json_u64(line, "prefill_tokens");
        r->ttft_ms = json_double(line, "ttft_ms");
        sscanf(cache + 9, "%15[a-z]", r->cache);
        snprintf(r->tail, sizeof(r->tail), "%s", tail);
        ck_assert_uint_eq(r->matched + r->prefill, r->prompt);
    }
    fclose(f);
    ck_assert_msg(out->summary[0], "%s: no summary line", name);
}

static size_t read_file(const char *name, uint8_t *buf, size_t cap)
{
    char path[128];
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "%s/%s.bin", scratch_dir, name);
    f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* The private reference: all requests, one process, no daemon. */
static void reference(run_out_t *ref, uint8_t *logits, size_t cap, size_t *len)
{
    ck_assert_int_eq(worker_wait(worker_spawn("--private", NULL, 0, REQUESTS, "ref")), 0);
    read_run("ref", ref);
    ck_assert_uint_eq(ref->n, REQUESTS);
    *len = read_file("ref", logits, cap);
    ck_assert_uint_eq(*len, (size_t)REQUESTS * 256 * sizeof(float));
}

/* A shared run's requests carry the reference's tokens, logits hash and
 * logits bytes (logits: this run's file, its requests from `first` on). */
static void assert_same_as_reference(const run_out_t *ref, const uint8_t *ref_logits,
                                     const run_out_t *run, const char *name, uint32_t first)
{
    uint8_t got[REQUESTS * 256 * sizeof(float)];
    size_t per = 256 * sizeof(float), n = read_file(name, got, sizeof(got));

    ck_assert_uint_eq(n, run->n * per);
    for (uint32_t i = 0; i < run->n; i++) {
        const request_line_t *r = &run->req[i];
        ck_assert_uint_eq(r->request, first + i);
        ck_assert_str_eq(r->tail, ref->req[first + i].tail);
        ck_assert_uint_eq(r->prompt, ref->req[first + i].prompt);
        ck_assert_msg(memcmp(got + i * per, ref_logits + (first + i) * per, per) == 0,
                      "%s request %u: final logits differ from the private run", name, first + i);
    }
}

static kvs_client_t *monitor(const harness_t *h)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;

    kvs_options_init(&o);
    o.socket_path = h->socket_path;
    o.flags = KVS_NO_MAP;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    return c;
}

/* After the workers exit: nothing pinned or WRITING; the index holds blocks. */
static void assert_daemon_clean(const harness_t *h, uint64_t *hit_tokens)
{
    kvs_client_t *c = monitor(h);
    kvs_stats_t st;

    ck_assert_int_eq(kvs_stats(c, &st), 0);
    ck_assert_uint_eq(st.pinned_blocks, 0);
    ck_assert_uint_eq(st.writing_blocks, 0);
    ck_assert_uint_gt(st.cached_blocks, 0);
    ck_assert_uint_eq(st.free_blocks + st.cached_blocks, st.total_blocks);
    *hit_tokens = 0;
    for (size_t i = 0; i < st.n_namespaces; i++)
        *hit_tokens += st.namespaces[i].hit_tokens;
    kvs_stats_free(&st);
    kvs_close(c);
}

static void start_daemon(harness_t *h, unsigned blocks)
{
    ck_assert_int_eq(harness_start(h, blocks, daemon_geometry), 0);
}

/* Worker A runs requests 0..2, then worker B requests 3..5: A computes its
 * first prompt in full, every later request only its question. */
START_TEST(test_kvs_sequential_workers)
{
    static uint8_t ref_logits[REQUESTS * 256 * sizeof(float)];
    run_out_t ref, a, b;
    harness_t h;
    size_t len;
    uint64_t private_prefill = 0, shared_prefill = 0, hit_tokens;

    scratch_init();
    reference(&ref, ref_logits, sizeof(ref_logits), &len);
    start_daemon(&h, 512);
    ck_assert_int_eq(worker_wait(worker_spawn("--kvs", h.socket_path, 0, 3, "a")), 0);
    ck_assert_int_eq(worker_wait(worker_spawn("--kvs", h.socket_path, 3, 3, "b")), 0);
    read_run("a", &a);
    read_run("b", &b);
    ck_assert_uint_eq(a.n, 3);
    ck_assert_uint_eq(b.n, 3);
    assert_same_as_reference(&ref, ref_logits, &a, "a", 0);
    assert_same_as_reference(&ref, ref_logits, &b, "b", 3);

    /* Exact counts: the first request misses, every other one matches the
     * 16 blocks of the system prompt and computes its question. */
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_str_eq(a.req[i].cache, "shared");
        ck_assert_str_eq(b.req[i].cache, "shared");
        ck_assert_uint_eq(a.req[i].matched, i == 0 ? 0 : SYSTEM_TOKENS);
        ck_assert_uint_eq(b.req[i].matched, SYSTEM_TOKENS);
        ck_assert_uint_eq(a.req[i].prefill, ref.req[i].prompt - a.req[i].matched);
        ck_assert_uint_eq(b.req[i].prefill, ref.req[3 + i].prompt - SYSTEM_TOKENS);
        shared_prefill += a.req[i].prefill + b.req[i].prefill;
    }
    for (uint32_t i = 0; i < REQUESTS; i++)
        private_prefill += ref.req[i].prefill;
    ck_assert_uint_eq(private_prefill - shared_prefill, 5 * SYSTEM_TOKENS);
    ck_assert_uint_eq(json_u64(a.summary, "fallbacks"), 0);
    ck_assert_uint_eq(json_u64(b.summary, "fallbacks"), 0);
    assert_daemon_clean(&h, &hit_tokens);
    ck_assert_uint_eq(hit_tokens, 5 * SYSTEM_TOKENS);

    printf("sequential: prefill tokens private %" PRIu64 ", shared %" PRIu64
           "; ttft of request 0 (worker A, a miss): private %.2f ms, shared %.2f ms; of request 3 "
           "(worker B's first, a hit): private %.2f ms, shared %.2f ms\n",
           private_prefill, shared_prefill, ref.req[0].ttft_ms, a.req[0].ttft_ms,
           ref.req[3].ttft_ms, b.req[0].ttft_ms);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    scratch_cleanup();
}
END_TEST

/* Three workers at once, two requests each: whoever commits the system
 * prompt first, every output is the private run's, at most the three first
 * requests miss, and duplicates are released. */
START_TEST(test_kvs_concurrent_workers)
{
    static uint8_t ref_logits[REQUESTS * 256 * sizeof(float)];
    static const char *const names[] = {"a", "b", "c"};
    run_out_t ref, run[3];
    harness_t h;
    pid_t pid[3];
    size_t len;
    uint64_t matched = 0, hit_tokens;

    scratch_init();
    reference(&ref, ref_logits, sizeof(ref_logits), &len);
    start_daemon(&h, 512);
    for (uint32_t w = 0; w < 3; w++)
        pid[w] = worker_spawn("--kvs", h.socket_path, 2 * w, 2, names[w]);
    for (uint32_t w = 0; w < 3; w++)
        ck_assert_int_eq(worker_wait(pid[w]), 0);
    for (uint32_t w = 0; w < 3; w++) {
        read_run(names[w], &run[w]);
        ck_assert_uint_eq(run[w].n, 2);
        assert_same_as_reference(&ref, ref_logits, &run[w], names[w], 2 * w);
        for (uint32_t i = 0; i < 2; i++) {
            const request_line_t *r = &run[w].req[i];
            ck_assert_str_eq(r->cache, "shared");
            ck_assert_msg(r->matched == 0 || r->matched == SYSTEM_TOKENS, "matched %u", r->matched);
            /* A worker's second request always finds its own first one. */
            if (i == 1)
                ck_assert_uint_eq(r->matched, SYSTEM_TOKENS);
            matched += r->matched;
        }
    }
    ck_assert_uint_ge(matched, 3 * SYSTEM_TOKENS);
    assert_daemon_clean(&h, &hit_tokens);
    ck_assert_uint_eq(hit_tokens, matched);
    printf("concurrent: 3 workers x 2 requests, %" PRIu64 " of %u system-prompt tokens matched\n",
           matched, REQUESTS * SYSTEM_TOKENS);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    scratch_cleanup();
}
END_TEST

/* No daemon at the socket: the worker computes privately, same outputs. */
START_TEST(test_kvs_daemon_down_falls_back)
{
    static uint8_t ref_logits[REQUESTS * 256 * sizeof(float)];
    run_out_t ref, a;
    char sock[128];
    size_t len;

    scratch_init();
    reference(&ref, ref_logits, sizeof(ref_logits), &len);
    scratch_path(sock, sizeof(sock), "none.sock");
    ck_assert_int_eq(worker_wait(worker_spawn("--kvs", sock, 0, 2, "a")), 0);
    read_run("a", &a);
    ck_assert_uint_eq(a.n, 2);
    assert_same_as_reference(&ref, ref_logits, &a, "a", 0);
    for (uint32_t i = 0; i < 2; i++) {
        ck_assert_str_eq(a.req[i].cache, "fallback");
        ck_assert_uint_eq(a.req[i].matched, 0);
    }
    ck_assert_uint_eq(json_u64(a.summary, "fallbacks"), 2);
    scratch_cleanup();
}
END_TEST

/* A pool smaller than one request: kvshared refuses the Alloc, the worker
 * computes privately and leaves nothing pinned or WRITING. */
START_TEST(test_kvs_pool_full_falls_back)
{
    static uint8_t ref_logits[REQUESTS * 256 * sizeof(float)];
    run_out_t ref, a;
    harness_t h;
    kvs_client_t *c;
    kvs_stats_t st;
    size_t len;

    scratch_init();
    reference(&ref, ref_logits, sizeof(ref_logits), &len);
    start_daemon(&h, 8);
    ck_assert_int_eq(worker_wait(worker_spawn("--kvs", h.socket_path, 0, 2, "a")), 0);
    read_run("a", &a);
    ck_assert_uint_eq(a.n, 2);
    assert_same_as_reference(&ref, ref_logits, &a, "a", 0);
    for (uint32_t i = 0; i < 2; i++)
        ck_assert_str_eq(a.req[i].cache, "fallback");
    c = monitor(&h);
    ck_assert_int_eq(kvs_stats(c, &st), 0);
    ck_assert_uint_eq(st.pinned_blocks, 0);
    ck_assert_uint_eq(st.writing_blocks, 0);
    kvs_stats_free(&st);
    kvs_close(c);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    scratch_cleanup();
}
END_TEST

/* A daemon whose pool is not the model's geometry: refused at start, exit 2,
 * with the flags that would fit. */
START_TEST(test_kvs_geometry_mismatch_refused)
{
    harness_t h;
    char err[128], text[4096] = "";
    FILE *f;

    scratch_init();
    ck_assert_int_eq(harness_start(&h, 64, NULL), 0); /* the harness's fp16 geometry */
    ck_assert_int_eq(worker_wait(worker_spawn("--kvs", h.socket_path, 0, 1, "a")), 2);
    scratch_path(err, sizeof(err), "err.txt");
    f = fopen(err, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_gt(fread(text, 1, sizeof(text) - 1, f), 0);
    fclose(f);
    ck_assert_msg(strstr(text, "kvshared serves 2 layers x 2 kv_heads x 8 head_dim fp16") &&
                      strstr(text, "--layers 2 --kv-heads 2 --head-dim 16 --dtype fp32 "
                                   "--block-tokens 16"),
                  "unexpected message: %s", text);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    scratch_cleanup();
}
END_TEST

/* The in-process cases run kvscache, not a worker process: the small model,
 * a private store for the reference runs, and kvshared in h. */
typedef struct inproc {
    model_config_t cfg;
    model_t *m;
    kvstore_t *priv;
    harness_t h;
    kvscache_t *kc;
} inproc_t;

/* The small model and a private store of priv_blocks blocks. */
static void inproc_init(inproc_t *t, uint32_t priv_blocks)
{
    geometry_t g;

    memset(t, 0, sizeof(*t));
    model_config_small(&t->cfg);
    ck_assert_int_eq(model_new(&t->cfg, &t->m), 0);
    ck_assert_uint_eq(t->cfg.vocab, LOGITS);
    model_config_geometry(&t->cfg, &g);
    ck_assert_int_eq(kvstore_new_private(&g, priv_blocks, &t->priv), 0);
}

/* A full private prefill of prompt (len tokens): its generated tokens and
 * final logits. */
static void inproc_reference(const inproc_t *t, const uint32_t *prompt, uint32_t len,
                             uint32_t gen[DECODE], float logits[LOGITS])
{
    worker_t w = {.model = t->m, .store = t->priv, .ops = &worker_private_ops, .ctx = t->priv};
    worker_result_t r;

    ck_assert_int_eq(worker_run(&w, prompt, len, DECODE, gen, logits, &r), 0);
}

/* Opens kvscache (ko, on the socket of the kvshared started in t->h) and
 * runs prompt: a miss, shared through the pool, whose final logits equal
 * ref; its results in gen, got and r. */
static void inproc_open(inproc_t *t, kvscache_opts_t *ko, const uint32_t *prompt, uint32_t len,
                        const float ref[LOGITS], uint32_t gen[DECODE], float got[LOGITS],
                        worker_result_t *r)
{
    char err[512];

    ko->socket_path = t->h.socket_path;
    ck_assert_msg(kvscache_open(ko, t->m, &t->kc, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(kvscache_run(t->kc, prompt, len, DECODE, gen, got, r), 0);
    ck_assert_int_eq(r->cache, WORKER_CACHE_SHARED);
    ck_assert_uint_eq(r->matched_tokens, 0);
    ck_assert_int_eq(memcmp(got, ref, LOGITS * sizeof(float)), 0);
}

/* Closes kvscache, stops kvshared (which must exit 0), frees the rest. */
static void inproc_free(inproc_t *t)
{
    kvscache_free(t->kc);
    ck_assert_int_eq(harness_stop(&t->h), 0);
    harness_cleanup(&t->h);
    kvstore_free(t->priv);
    model_free(t->m);
}

/* The start of both restart cases: three chat requests (workload seed
 * `seed`) and their private references; request 0 shared through a fresh
 * kvshared, then the daemon stops and request 1 is computed privately
 * (fallback). Same logits as the references throughout. */
static void restart_begin(inproc_t *t, uint32_t seed, workload_t **wl, kvscache_opts_t *ko,
                          float ref[3][LOGITS])
{
    workload_chat_opts_t wo = {.requests = 3,
                               .systems = 1,
                               .system_tokens = SYSTEM_TOKENS,
                               .question_tokens = 40,
                               .seed = seed};
    float got[LOGITS];
    uint32_t gen[DECODE];
    worker_result_t r;

    inproc_init(t, 64);
    wo.vocab = t->cfg.vocab;
    ck_assert_int_eq(workload_chat(&wo, wl), 0);
    for (uint32_t i = 0; i < 3; i++)
        inproc_reference(t, (*wl)->prompt[i], (*wl)->len[i], gen, ref[i]);

    start_daemon(&t->h, 256);
    inproc_open(t, ko, (*wl)->prompt[0], (*wl)->len[0], ref[0], gen, got, &r);

    ck_assert_int_eq(harness_stop(&t->h), 0);
    ck_assert_int_eq(kvscache_run(t->kc, (*wl)->prompt[1], (*wl)->len[1], DECODE, gen, got, &r), 0);
    ck_assert_int_eq(r.cache, WORKER_CACHE_FALLBACK);
    ck_assert_int_eq(memcmp(got, ref[1], sizeof(got)), 0);
}

/* In one process through kvscache: shared, then the daemon stops (private),
 * then another daemon on the same socket with a pool of another geometry
 * (sharing off): every request gives the private run's logits. */
START_TEST(test_kvs_daemon_restart)
{
    inproc_t t;
    workload_t *wl = NULL;
    kvscache_opts_t ko = {.timeout_ms = 30000, .reconnect_ms = 1, .private_blocks = 64};
    kvscache_stats_t st;
    pid_t again;
    float ref[3][LOGITS], got[LOGITS];
    uint32_t gen[DECODE];
    worker_result_t r;

    restart_begin(&t, 1, &wl, &ko, ref);
    ck_assert_ptr_nonnull(strstr(kvscache_note(t.kc), "computing privately"));

    /* The harness restarts kvshared with its own fp16 geometry: the worker
     * reconnects, sees a pool it cannot compute in, turns sharing off. */
    ck_assert_int_eq(harness_start_again(&t.h, 256, 20000, &again), -1); /* listening */
    ck_assert_int_gt(again, 0);
    t.h.pid = again;
    usleep(5000); /* past reconnect_ms */
    ck_assert_int_eq(kvscache_run(t.kc, wl->prompt[2], wl->len[2], DECODE, gen, got, &r), 0);
    ck_assert_int_eq(r.cache, WORKER_CACHE_FALLBACK);
    ck_assert_int_eq(memcmp(got, ref[2], sizeof(got)), 0);
    ck_assert_msg(strstr(kvscache_note(t.kc), "sharing is off"), "%s", kvscache_note(t.kc));
    kvscache_stats(t.kc, &st);
    ck_assert_uint_eq(st.shared, 1);
    ck_assert_uint_eq(st.fallbacks, 2);

    inproc_free(&t);
    workload_free(wl);
}
END_TEST

/* kvshared with the small model's geometry on a given socket path (the
 * harness restarts it with its own geometry only); returns once READY. */
static pid_t daemon_spawn_at(const char *socket_path)
{
    const char *const argv[] = {KVSHARED_PATH, "--socket",       socket_path, "--backend",
                                "host",        "--layers",       "2",         "--kv-heads",
                                "2",           "--head-dim",     "16",        "--dtype",
                                "fp32",        "--block-tokens", "16",        "--pool-blocks",
                                "256",         "--log-level",    "warn",      NULL};
    pid_t pid = launch_daemon(argv, LAUNCH_READY_MS, NULL);
    ck_assert_msg(pid > 0, "kvshared did not start on %s", socket_path);
    return pid;
}

/* A daemon that restarts with the same geometry: the worker computes
 * privately while it is gone, then maps the new pool between requests and
 * shares again; all outputs equal the private run's. */
START_TEST(test_kvs_daemon_restart_same_geometry)
{
    inproc_t t;
    workload_t *wl = NULL;
    kvscache_opts_t ko = {.timeout_ms = 30000, .reconnect_ms = 1, .private_blocks = 64};
    float ref[3][LOGITS], got[LOGITS];
    uint32_t gen[DECODE];
    worker_result_t r;

    restart_begin(&t, 3, &wl, &ko, ref);

    t.h.pid = daemon_spawn_at(t.h.socket_path);
    usleep(5000); /* past reconnect_ms */
    /* A new, empty pool: a miss, computed in the newly mapped blocks. */
    ck_assert_int_eq(kvscache_run(t.kc, wl->prompt[2], wl->len[2], DECODE, gen, got, &r), 0);
    ck_assert_msg(r.cache == WORKER_CACHE_SHARED, "%s", kvscache_note(t.kc));
    ck_assert_uint_eq(r.matched_tokens, 0);
    ck_assert_int_eq(memcmp(got, ref[2], sizeof(got)), 0);
    /* Request 1 again: its system prompt now comes from the new pool. */
    ck_assert_int_eq(kvscache_run(t.kc, wl->prompt[1], wl->len[1], DECODE, gen, got, &r), 0);
    ck_assert_int_eq(r.cache, WORKER_CACHE_SHARED);
    ck_assert_uint_eq(r.matched_tokens, SYSTEM_TOKENS);
    ck_assert_int_eq(memcmp(got, ref[1], sizeof(got)), 0);

    inproc_free(&t);
    workload_free(wl);
}
END_TEST

/* A prompt of whole blocks, run twice: the second run matches all but its
 * last block (the lookup leaves out the last token), commits the matched
 * blocks it pinned and that block (nothing allocated for the matched ones),
 * learns the first run's block is
 * canonical and decodes from it; same logits, nothing left held. */
START_TEST(test_kvs_duplicate_block_is_swapped)
{
    inproc_t t;
    kvscache_opts_t ko = {.timeout_ms = 30000, .private_blocks = 16};
    kvscache_stats_t st;
    uint32_t prompt[64], gen[DECODE], gen_ref[DECODE];
    float ref[LOGITS], got[LOGITS];
    worker_result_t r;
    kvs_client_t *c;
    kvs_stats_t ds;

    inproc_init(&t, 16);
    for (uint32_t i = 0; i < 64; i++)
        prompt[i] = (i * 37 + 11) % t.cfg.vocab;
    inproc_reference(&t, prompt, 64, gen_ref, ref);

    start_daemon(&t.h, 64);
    inproc_open(&t, &ko, prompt, 64, ref, gen, got, &r);
    ck_assert_int_eq(kvscache_run(t.kc, prompt, 64, DECODE, gen, got, &r), 0);
    ck_assert_int_eq(r.cache, WORKER_CACHE_SHARED);
    ck_assert_uint_eq(r.matched_tokens, 48);
    ck_assert_uint_eq(r.prefill_tokens, 16);
    ck_assert_int_eq(memcmp(got, ref, sizeof(got)), 0);
    ck_assert_int_eq(memcmp(gen, gen_ref, sizeof(gen)), 0);
    kvscache_stats(t.kc, &st);
    ck_assert_uint_eq(st.shared, 2);
    ck_assert_uint_eq(st.commits, 2);
    ck_assert_uint_eq(st.commit_errors, 0);
    ck_assert_uint_eq(st.duplicates, 1);

    /* Still connected: the releases, not the session's end, freed it all. */
    c = monitor(&t.h);
    ck_assert_int_eq(kvs_stats(c, &ds), 0);
    ck_assert_uint_eq(ds.pinned_blocks, 0);
    ck_assert_uint_eq(ds.writing_blocks, 0);
    ck_assert_uint_eq(ds.cached_blocks, 4);
    ck_assert_uint_eq(ds.sessions, 2);
    kvs_stats_free(&ds);
    kvs_close(c);

    inproc_free(&t);
}
END_TEST

/* The small model's geometry, a pool of `blocks` and a tier 2 of 1 MiB (128
 * blocks of 8 KiB). */
static void start_daemon_tier2(harness_t *h, unsigned blocks)
{
    static const char *const flags[] = {
        "--layers",       "2",  "--kv-heads",  "2",    "--head-dim", "16", "--dtype", "fp32",
        "--block-tokens", "16", "--host-tier", "1MiB", NULL,
    };
    ck_assert_int_eq(harness_start(h, blocks, flags), 0);
}

static void ns_blocks(kvs_client_t *c, const char *ns, uint32_t *pool, uint32_t *tier2)
{
    kvs_stats_t st;
    int found = 0;

    ck_assert_int_eq(kvs_stats(c, &st), 0);
    for (size_t i = 0; i < st.n_namespaces; i++)
        if (strcmp(st.namespaces[i].name, ns) == 0) {
            *pool = st.namespaces[i].cached_blocks;
            *tier2 = st.namespaces[i].tier2_blocks;
            found = 1;
        }
    ck_assert_uint_eq(st.pinned_blocks, 0);
    ck_assert_uint_eq(st.writing_blocks, 0);
    ck_assert_uint_eq(st.copying_blocks, 0);
    kvs_stats_free(&st);
    ck_assert_msg(found, "kvshared does not know namespace %s", ns);
}

/* A prefix that goes tier 1 -> tier 2 -> tier 1, twice: each time the
 * worker's pinned lookup gets its blocks promoted back, and its generated
 * tokens and final logits equal a full private prefill's, bit for bit. The
 * model reads every promoted byte (attention over all earlier positions), so
 * a promotion that brought back any other bytes would change the logits. */
START_TEST(test_kvs_tier2_round_trip_bitwise)
{
    enum { N = 300, FULL = N / 16, HIT = (N - 1) / 16 }; /* 18 blocks committed and matched */
    inproc_t t;
    kvscache_opts_t ko = {.ns = "tier", .timeout_ms = 30000, .private_blocks = 32};
    uint32_t prompt[N], gen[DECODE], gen_ref[DECODE], serial = 1, pool, tier2;
    float ref[LOGITS], got[LOGITS];
    worker_result_t r;
    kvs_client_t *c;
    kvs_stats_t before, after;
    tierfill_result_t fill;
    char err[512];

    inproc_init(&t, 32);
    for (uint32_t i = 0; i < N; i++)
        prompt[i] = (i * 59 + 7) % t.cfg.vocab;
    inproc_reference(&t, prompt, N, gen_ref, ref);

    start_daemon_tier2(&t.h, 48);
    inproc_open(&t, &ko, prompt, N, ref, gen, got, &r);
    c = monitor(&t.h);

    for (int round = 0; round < 2; round++) {
        /* Into tier 2, by the daemon's own count. */
        ck_assert_msg(
            tierfill_demote(c, "tier", "filler", FULL, &serial, &fill, err, sizeof(err)) == 0, "%s",
            err);
        ns_blocks(c, "tier", &pool, &tier2);
        ck_assert_uint_eq(pool, 0);
        ck_assert_uint_eq(tier2, FULL);
        ck_assert_uint_gt(fill.filler_blocks, 0);

        /* Back into tier 1 by the lookup: the prompt's blocks were promoted,
         * not computed again. */
        ck_assert_int_eq(kvs_stats(c, &before), 0);
        memset(got, 0, sizeof(got));
        memset(gen, 0, sizeof(gen));
        ck_assert_int_eq(kvscache_run(t.kc, prompt, N, DECODE, gen, got, &r), 0);
        ck_assert_msg(r.cache == WORKER_CACHE_SHARED, "%s", kvscache_note(t.kc));
        ck_assert_uint_eq(r.matched_tokens, HIT * 16);
        ck_assert_uint_eq(r.prefill_tokens, N - HIT * 16);
        ck_assert_int_eq(kvs_stats(c, &after), 0);
        ck_assert_uint_ge(after.tier_promotions - before.tier_promotions, HIT);
        kvs_stats_free(&after);
        kvs_stats_free(&before);
        ns_blocks(c, "tier", &pool, &tier2);
        ck_assert_uint_eq(pool, FULL);
        ck_assert_uint_eq(tier2, 0);

        ck_assert_msg(memcmp(got, ref, sizeof(got)) == 0,
                      "round %d: final logits differ from the private prefill's", round);
        ck_assert_msg(memcmp(gen, gen_ref, sizeof(gen)) == 0,
                      "round %d: generated tokens differ from the private prefill's", round);
    }

    kvs_close(c);
    inproc_free(&t);
}
END_TEST

/* ---- a tensor-parallel group --------------------------------------------- */

/* Lookups the daemon counted in namespace ns. */
static uint64_t ns_lookups(kvs_client_t *c, const char *ns)
{
    kvs_stats_t st;
    uint64_t n = 0;

    ck_assert_int_eq(kvs_stats(c, &st), 0);
    for (size_t i = 0; i < st.n_namespaces; i++)
        if (!strcmp(st.namespaces[i].name, ns))
            n = st.namespaces[i].lookups;
    kvs_stats_free(&st);
    return n;
}

#define TP 4

/* A connection of the group: rank r (KVS_RANK), or its scheduler (r < 0). */
static kvs_client_t *group_client(const harness_t *h, int r)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;

    kvs_options_init(&o);
    o.socket_path = h->socket_path;
    o.timeout_ms = 30000;
    o.flags = r < 0 ? KVS_GROUP_SCHEDULER : KVS_RANK;
    o.rank = r < 0 ? 0 : (uint32_t)r;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    return c;
}

/* One kvshared --devices 0-3 (each pool one rank's geometry: 1 of the
 * small-tp model's 4 KV heads): a TP=4 group (kvscache, tp 4) computes a
 * prompt, another TP=4 group finds its system prompt with one lookup and
 * computes only its question; both give the one-rank private run's tokens
 * and logits bit for bit. Then a third group looks the system prompt up
 * once and each rank reads, from its own device's pool, exactly its head's
 * slice of the one-rank KV. */
START_TEST(test_kvs_tp4_group_matches_one_rank)
{
    enum { Q = 40, N = SYSTEM_TOKENS + Q, SYS_BLOCKS = SYSTEM_TOKENS / 16 };
    static const char *const flags[] = {
        "--layers",       "2",  "--kv-heads", "1",   "--head-dim", "16", "--dtype", "fp32",
        "--block-tokens", "16", "--devices",  "0-3", NULL,
    };
    model_config_t cfg;
    model_t *m = NULL;
    geometry_t g;
    kvstore_t *priv, *ref_kv;
    harness_t h;
    kvscache_t *a = NULL, *b = NULL;
    kvscache_opts_t ko = {.timeout_ms = 30000, .private_blocks = 32, .tp = TP};
    uint32_t prompt[2][N], gen[DECODE], gen_ref[2][DECODE], table[SYS_BLOCKS], ids[SYS_BLOCKS];
    float ref[2][LOGITS], got[LOGITS];
    worker_result_t r;
    char err[512];

    model_config_small_tp(&cfg);
    ck_assert_int_eq(model_new(&cfg, &m), 0);
    model_config_geometry(&cfg, &g);
    ck_assert_int_eq(kvstore_new_private(&g, 32, &priv), 0);
    for (uint32_t i = 0; i < N; i++) {
        prompt[0][i] = (i * 37 + 5) % cfg.vocab;
        prompt[1][i] = i < SYSTEM_TOKENS ? prompt[0][i] : (i * 11 + 3) % cfg.vocab;
    }
    for (int p = 0; p < 2; p++) {
        worker_t w = {.model = m, .store = priv, .ops = &worker_private_ops, .ctx = priv};
        ck_assert_int_eq(worker_run(&w, prompt[p], N, DECODE, gen_ref[p], ref[p], &r), 0);
    }

    ck_assert_int_eq(harness_start(&h, 128, flags), 0);
    ko.socket_path = h.socket_path;
    ck_assert_msg(kvscache_open(&ko, m, &a, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(kvscache_run(a, prompt[0], N, DECODE, gen, got, &r), 0);
    ck_assert_msg(r.cache == WORKER_CACHE_SHARED, "%s", kvscache_note(a));
    ck_assert_uint_eq(r.matched_tokens, 0);
    ck_assert_mem_eq(got, ref[0], sizeof(got));
    ck_assert_mem_eq(gen, gen_ref[0], sizeof(gen));

    ck_assert_msg(kvscache_open(&ko, m, &b, err, sizeof(err)) == 0, "%s", err);
    kvs_client_t *mon = monitor(&h);
    uint64_t lookups0 = ns_lookups(mon, "default");
    ck_assert_int_eq(kvscache_run(b, prompt[1], N, DECODE, gen, got, &r), 0);
    /* One lookup for the whole group, by its scheduler. */
    ck_assert_uint_eq(ns_lookups(mon, "default") - lookups0, 1);
    kvs_close(mon);
    ck_assert_msg(r.cache == WORKER_CACHE_SHARED, "%s", kvscache_note(b));
    ck_assert_uint_eq(r.matched_tokens, SYSTEM_TOKENS);
    ck_assert_uint_eq(r.prefill_tokens, Q);
    ck_assert_mem_eq(got, ref[1], sizeof(got));
    ck_assert_mem_eq(gen, gen_ref[1], sizeof(gen));
    kvscache_free(a);
    kvscache_free(b);

    /* The one-rank KV of the system prompt, in blocks 0..SYS_BLOCKS-1. */
    ck_assert_int_eq(kvstore_new_private(&g, SYS_BLOCKS, &ref_kv), 0);
    for (uint32_t i = 0; i < SYS_BLOCKS; i++)
        table[i] = i;
    ck_assert_int_eq(model_forward(m, ref_kv, table, SYS_BLOCKS, prompt[0], 0, SYSTEM_TOKENS, NULL),
                     0);
    kvs_client_t *sched = group_client(&h, -1), *rank[TP];
    size_t found = 0;
    ck_assert_int_eq(
        kvs_lookup(sched, "default", prompt[0], SYSTEM_TOKENS, 1, ids, SYS_BLOCKS, &found), 0);
    ck_assert_uint_eq(found, SYS_BLOCKS);
    uint32_t head_floats = cfg.head_dim, slot_floats = 16 * head_floats;
    float shard[16 * 16];
    ck_assert_uint_le(slot_floats, 16 * 16);
    for (int q = 0; q < TP; q++) {
        rank[q] = group_client(&h, q);
        for (uint32_t l = 0; l < cfg.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t j = 0; j < SYS_BLOCKS; j++) {
                    ck_assert_int_eq(
                        kvs_block_read(rank[q], l, kv, ids[j], shard, slot_floats * sizeof(float)),
                        0);
                    for (uint32_t t = 0; t < 16; t++)
                        ck_assert_msg(
                            memcmp(shard + t * head_floats,
                                   kvstore_token(ref_kv, l, kv, j, t) + (uint64_t)q * head_floats,
                                   head_floats * sizeof(float)) == 0,
                            "rank %d, layer %u, %c, block %u, token %u: not the "
                            "one-rank KV of its head",
                            q, l, kv ? 'V' : 'K', j, t);
                }
    }
    ck_assert_int_eq(kvs_release(sched, ids, SYS_BLOCKS, NULL), 0);
    kvs_stats_t st;
    ck_assert_int_eq(kvs_stats(sched, &st), 0);
    ck_assert_uint_eq(st.pinned_blocks, 0);
    ck_assert_uint_eq(st.writing_blocks, 0);
    ck_assert_uint_eq(st.cached_blocks, 2 * (N / 16) - SYS_BLOCKS);
    kvs_stats_free(&st);
    for (int q = 0; q < TP; q++)
        kvs_close(rank[q]);
    kvs_close(sched);
    /* A group of another size is refused at open, with the flag to use. */
    kvscache_opts_t k2 = ko;
    k2.tp = 2;
    ck_assert_int_eq(kvscache_open(&k2, m, &a, err, sizeof(err)), KVS_ENOTSUP);
    ck_assert_msg(strstr(err, "--devices 0-1"), "%s", err);
    ck_assert_int_eq(harness_stop(&h), 0);
    harness_cleanup(&h);
    kvstore_free(ref_kv);
    kvstore_free(priv);
    model_free(m);
}
END_TEST

/* The small model's geometry, a pool of `blocks`, a tier 2 of 1 MiB and a
 * disk tier in `disk` (64 slots of 12 KiB: a block of 8 KiB and its header). */
static const char *const *disk_flags(const char *disk)
{
    static const char *flags[] = {
        "--layers",         "2",    "--kv-heads",        "2",      "--head-dim",  "16",
        "--dtype",          "fp32", "--block-tokens",    "16",     "--host-tier", "1MiB",
        "--disk-tier-path", NULL,   "--disk-tier-bytes", "790528", NULL};
    flags[13] = disk;
    return flags;
}

/* Commits filler prompts (tokens no model has, namespace "filler3") until
 * namespace ns has no block in the pool nor in tier 2: all on the disk. */
static void push_to_disk(kvs_client_t *c, const char *ns, uint32_t want)
{
    uint32_t serial = 1u << 31, tokens[8 * 16], ids[8], can[8];
    for (int round = 0; round < 200; round++) {
        kvs_stats_t st;
        uint32_t pool = 99, tier2 = 99, total = 0;
        ck_assert_int_eq(kvs_stats(c, &st), 0);
        for (size_t i = 0; i < st.n_namespaces; i++)
            if (strcmp(st.namespaces[i].name, ns) == 0) {
                pool = st.namespaces[i].cached_blocks;
                tier2 = st.namespaces[i].tier2_blocks;
            }
        total = st.tier3_cached_blocks;
        kvs_stats_free(&st);
        if (pool == 0 && tier2 == 0 && total >= want)
            return;
        size_t done = 0;
        for (uint32_t k = 0; k < 8 * 16; k++)
            tokens[k] = serial + k;
        serial += 8 * 16;
        ck_assert_int_eq(kvs_alloc(c, "filler3", 8, ids), 0);
        ck_assert_int_eq(kvs_commit(c, "filler3", tokens, 8 * 16, ids, 8, can, &done), 0);
        ck_assert_int_eq(kvs_release(c, can, done, NULL), 0);
        /* let the copies between the tiers end */
        for (int k = 0; k < 200; k++) {
            ck_assert_int_eq(kvs_stats(c, &st), 0);
            uint32_t copying = st.copying_blocks;
            kvs_stats_free(&st);
            if (copying == 0)
                break;
            usleep(2000);
        }
    }
    ck_abort_msg("namespace %s did not reach the disk tier", ns);
}

/* Warm restart: a prefix pushed down to the disk tier, kvshared killed
 * with SIGKILL, restarted on the same file: the worker's lookup matches
 * the prefix (restored from the disk, promoted back to the pool) and its
 * generated tokens and final logits equal a private prefill's, bit for
 * bit. */
START_TEST(test_kvs_disk_warm_restart_bitwise)
{
    enum { N = 300, FULL = N / 16, HIT = (N - 1) / 16 };
    inproc_t t;
    kvscache_opts_t ko = {
        .ns = "disk", .timeout_ms = 30000, .reconnect_ms = 1, .private_blocks = 32};
    uint32_t prompt[N], gen[DECODE], gen_ref[DECODE];
    float ref[LOGITS], got[LOGITS];
    worker_result_t r;
    char dir[256], disk[300];
    pid_t again = 0;

    ck_assert_int_eq(test_tmp_dir("kvs-warm", dir, sizeof(dir)), 0);
    snprintf(disk, sizeof(disk), "%s/tier3", dir);
    inproc_init(&t, 32);
    for (uint32_t i = 0; i < N; i++)
        prompt[i] = (i * 61 + 5) % t.cfg.vocab;
    inproc_reference(&t, prompt, N, gen_ref, ref);

    ck_assert_int_eq(harness_start(&t.h, 48, disk_flags(disk)), 0);
    inproc_open(&t, &ko, prompt, N, ref, gen, got, &r);
    kvs_client_t *c = monitor(&t.h);
    kvs_set_timeout(c, 30000); /* its allocs wait for copies to the disk */
    push_to_disk(c, "disk", FULL);
    kvs_close(c);

    ck_assert_int_eq(kill(t.h.pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(t.h.pid, NULL, 0), t.h.pid);
    t.h.pid = 0;
    ck_assert_int_eq(harness_restart(&t.h, 48, disk_flags(disk), 20000, &again), -1);
    t.h.pid = again;
    usleep(5000); /* past reconnect_ms */

    harness_wait_restored(&t.h); /* the file is restored in the background */
    c = monitor(&t.h);
    kvs_stats_t st;
    ck_assert_int_eq(kvs_stats(c, &st), 0);
    ck_assert_uint_ge(st.tier3_cached_blocks, FULL); /* the pool and host start empty */
    ck_assert_uint_eq(st.cached_blocks, 0);
    kvs_stats_free(&st);
    /* The worker learns on its first run that its connection died (that
     * run is computed privately, same logits) and reconnects for the next. */
    ck_assert_int_eq(kvscache_run(t.kc, prompt, N, DECODE, gen, got, &r), 0);
    ck_assert_int_eq(memcmp(got, ref, sizeof(got)), 0);
    if (r.cache != WORKER_CACHE_SHARED)
        usleep(5000);
    memset(got, 0, sizeof(got));
    memset(gen, 0, sizeof(gen));
    ck_assert_int_eq(kvscache_run(t.kc, prompt, N, DECODE, gen, got, &r), 0);
    ck_assert_msg(r.cache == WORKER_CACHE_SHARED, "%s", kvscache_note(t.kc));
    ck_assert_uint_eq(r.matched_tokens, HIT * 16);
    ck_assert_uint_eq(r.prefill_tokens, N - HIT * 16);
    ck_assert_int_eq(kvs_stats(c, &st), 0);
    ck_assert_uint_ge(st.disk_reads, HIT);
    kvs_stats_free(&st);
    ck_assert_msg(memcmp(got, ref, sizeof(got)) == 0,
                  "final logits after the restart differ from the private prefill's");
    ck_assert_msg(memcmp(gen, gen_ref, sizeof(gen)) == 0,
                  "generated tokens after the restart differ from the private prefill's");
    kvs_close(c);
    inproc_free(&t);
    unlink(disk);
    rmdir(dir);
}
END_TEST

static Suite *worker_kvs_suite(void)
{
    Suite *s = suite_create("worker_kvs");
    TCase *tc = tcase_create("kvshared");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kvs_sequential_workers);
    tcase_add_test(tc, test_kvs_concurrent_workers);
    tcase_add_test(tc, test_kvs_duplicate_block_is_swapped);
    tcase_add_test(tc, test_kvs_daemon_down_falls_back);
    tcase_add_test(tc, test_kvs_pool_full_falls_back);
    tcase_add_test(tc, test_kvs_geometry_mismatch_refused);
    tcase_add_test(tc, test_kvs_daemon_restart);
    tcase_add_test(tc, test_kvs_daemon_restart_same_geometry);
    tcase_add_test(tc, test_kvs_tier2_round_trip_bitwise);
    tcase_add_test(tc, test_kvs_tp4_group_matches_one_rank);
    tcase_add_test(tc, test_kvs_disk_warm_restart_bitwise);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(worker_kvs_suite)
