/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fuzz target: libkvshare reading a daemon's bytes. A fake daemon (a thread
 * on a Unix socket in a temporary directory) reads the client's Hello, sends
 * the input as everything the daemon says on that connection, and hangs up;
 * later connections of the same input get nothing. The client connects
 * (KVS_LAZY, KVS_NO_MAP: fds cannot come from bytes) and makes every call
 * once: Lookup, Alloc, Commit, Pin, Release, Stats, Tree, Ping, so the input
 * is their replies (ids 1, 2, 3, ... in that order), a refusal, or garbage.
 *
 * Checked: no crash, leak or undefined behaviour, every status a KVS_* code,
 * and the counts the calls return within the caller's arrays.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame_header.h"
#include "fuzz.h"
#include "kvshare.h"
#include "socket_path.h"
#include "test_tmp.h"

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_client: invariant broken: %s (line %d)\n", #cond, __LINE__);     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static char dir[SOCKET_PATH_MAX - sizeof("/kvshared.sock")], path[SOCKET_PATH_MAX];
static int listener = -1;
static pthread_t server;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const uint8_t *input;
static size_t input_len;
static uint64_t input_gen, served_gen;
static int stopping;
static const uint8_t sync_marker[4] = {0xff, 0xff, 0xff, 0xff};

static int read_exact(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The fake daemon: one connection at a time, in the order they come. The
 * first of an input gets the input, after the client's Hello; later ones get
 * nothing; a sync connection (sync_server) gets one byte. */
static void *serve(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            return NULL;
        }
        uint8_t hdr[4], body[512];
        if (read_exact(fd, hdr, 4) != 0) {
            close(fd);
            continue;
        }
        pthread_mutex_lock(&mu);
        int stop = stopping;
        pthread_mutex_unlock(&mu);
        if (stop) {
            close(fd);
            return NULL;
        }
        if (memcmp(hdr, sync_marker, 4) == 0) {
            ssize_t w;
            do {
                w = write(fd, "S", 1);
            } while (w < 0 && errno == EINTR);
            FUZZ_CHECK(w == 1);
            close(fd);
            continue;
        }
        uint32_t n = frame_get_len(hdr);
        pthread_mutex_lock(&mu);
        const uint8_t *data = NULL;
        size_t len = 0;
        if (served_gen != input_gen) {
            served_gen = input_gen;
            data = input;
            len = input_len;
        }
        pthread_mutex_unlock(&mu);
        /* The Hello is read first, so the replies never race the request;
         * the input fits the socket buffer. */
        if (n <= sizeof(body) && read_exact(fd, body, n) == 0) {
            size_t off = 0;
            while (off < len) {
                ssize_t w = send(fd, data + off, len - off, MSG_NOSIGNAL);
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0)
                    break;
                off += (size_t)w;
            }
        }
        /* Then end of stream for the client's reads, while its requests
         * are still taken (a send that fails reads as a daemon gone). */
        shutdown(fd, SHUT_WR);
        for (;;) {
            ssize_t r = read(fd, body, sizeof(body));
            if (r == 0 || (r < 0 && errno != EINTR))
                break;
        }
        close(fd);
    }
}

static void fuzz_init(void)
{
    FUZZ_CHECK(test_tmp_dir("kvs-fuzz-client", dir, sizeof(dir)) == 0);
    snprintf(path, sizeof(path), "%s/kvshared.sock", dir);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(listener >= 0);
    FUZZ_CHECK(bind(listener, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    FUZZ_CHECK(listen(listener, 16) == 0);
    FUZZ_CHECK(pthread_create(&server, NULL, serve, NULL) == 0);
}

/* Returns once the fake daemon has finished with every connection of this
 * input (it serves them in order), so none outlives the input's bytes. */
static void sync_server(void)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char b;
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0);
    /* libFuzzer's timeout timer (SIGALRM) interrupts blocking calls. */
    ssize_t n;
    do {
        n = write(fd, sync_marker, 4);
    } while (n < 0 && errno == EINTR);
    FUZZ_CHECK(n == 4);
    do {
        n = read(fd, &b, 1);
    } while (n < 0 && errno == EINTR);
    FUZZ_CHECK(n == 1);
    close(fd);
}

static void check_rc(int rc)
{
    FUZZ_CHECK(rc <= 0 && rc > -KVS_STATUS_COUNT);
    /* KVS_FUZZ_VERBOSE=1: each call's status (reading seeds). */
    if (getenv("KVS_FUZZ_VERBOSE"))
        fprintf(stderr, "  %s\n", kvs_strerror(rc));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (listener < 0)
        fuzz_init();
    pthread_mutex_lock(&mu);
    input = data;
    input_len = size;
    input_gen++;
    pthread_mutex_unlock(&mu);

    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = path;
    o.timeout_ms = 500;
    o.flags = KVS_LAZY | KVS_NO_MAP;
    o.reconnect_ms = 3600 * 1000; /* one connection per input (and call()'s one retry) */
    int rc = kvs_connect(&o, &c);
    check_rc(rc);
    if (rc != 0) {
        FUZZ_CHECK(c == NULL);
        sync_server();
        return 0;
    }

    uint32_t tokens[12], ids[4], can[3];
    size_t n = 99;
    for (uint32_t i = 0; i < 12; i++)
        tokens[i] = i;
    rc = kvs_lookup(c, NULL, tokens, 12, 1, ids, 2, &n);
    check_rc(rc);
    FUZZ_CHECK(n <= 2 && (rc == 0 || n == 0));
    rc = kvs_alloc(c, NULL, 3, ids);
    check_rc(rc);
    ids[0] = 0, ids[1] = 1, ids[2] = 2;
    n = 99;
    rc = kvs_commit(c, "ns", tokens, 12, ids, 3, can, &n);
    check_rc(rc);
    FUZZ_CHECK(n <= 3);
    n = 99;
    rc = kvs_pin(c, ids, 3, &n);
    check_rc(rc);
    n = 99;
    rc = kvs_release(c, ids, 3, &n);
    check_rc(rc);
    kvs_stats_t st;
    rc = kvs_stats(c, &st);
    check_rc(rc);
    if (rc == 0) {
        for (size_t i = 0; i < st.n_namespaces; i++)
            FUZZ_CHECK(strlen(st.namespaces[i].name) < KVS_NS_NAME_MAX);
        kvs_stats_free(&st);
    }
    kvs_prefix_t rows[4];
    n = 99;
    rc = kvs_tree(c, NULL, 0, rows, 4, &n);
    check_rc(rc);
    FUZZ_CHECK(n <= 4 && (rc == 0 || n == 0));
    rc = kvs_ping(c, 8, NULL);
    check_rc(rc);
    FUZZ_CHECK(strlen(kvs_last_error(c)) < 1024);
    kvs_geometry_t g;
    check_rc(kvs_geometry(c, &g));
    kvs_close(c);
    sync_server();
    return 0;
}

void fuzz_cleanup(void)
{
    if (listener < 0)
        return;
    pthread_mutex_lock(&mu);
    stopping = 1;
    pthread_mutex_unlock(&mu);
    /* Wake the accept with one last connection. */
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
        write(fd, sync_marker, 4) == 4)
        pthread_join(server, NULL);
    if (fd >= 0)
        close(fd);
    close(listener);
    unlink(path);
    rmdir(dir);
}
