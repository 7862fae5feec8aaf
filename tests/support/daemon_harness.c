/* SPDX-License-Identifier: Apache-2.0 */
#include "daemon_harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"
#include "test_tmp.h"

#ifndef KVSHARED_PATH
#error "KVSHARED_PATH must name the kvshared binary"
#endif

/* The longest a stopping daemon may take (under valgrind it checks for
 * leaks first). */
#define HARNESS_STOP_MS 60000

/* The test geometry: 2 layers, 2 kv heads, head_dim 8, fp16, 4-token blocks. */
static const char *const test_geometry[] = {
    "--layers", "2",    "--kv-heads",     "2", "--head-dim", "8",
    "--dtype",  "fp16", "--block-tokens", "4", NULL,
};

/* Starts the test daemon on socket_path with the geometry flags and extra
 * flags given (both NULL-ended); *exit_status as launch_daemon. */
static pid_t spawn(const char *socket_path, unsigned blocks, const char *const *geometry,
                   const char *const *extra, int timeout_ms, int *exit_status)
{
    char nblocks[16];
    const char *argv[100];
    const int max = (int)(sizeof(argv) / sizeof(argv[0])) - 1;
    int n = 0;
    const char *log = getenv("KVS_TEST_DAEMON_LOG");
    snprintf(nblocks, sizeof(nblocks), "%u", blocks);
    /* KVS_KVSHARED: the daemon of a packed device run (tools/device-pack.sh),
     * whose build tree is not there. */
    argv[n++] = getenv("KVS_KVSHARED") ? getenv("KVS_KVSHARED") : KVSHARED_PATH;
    argv[n++] = "--socket";
    argv[n++] = socket_path;
    argv[n++] = "--backend";
    argv[n++] = "host";
    for (int i = 0; geometry[i]; i++) {
        if (n == max)
            return -1;
        argv[n++] = geometry[i];
    }
    if (n + 4 > max)
        return -1;
    argv[n++] = "--pool-blocks";
    argv[n++] = nblocks;
    argv[n++] = "--log-level";
    argv[n++] = log ? log : "warn";
    for (int i = 0; extra && extra[i]; i++) {
        if (n == max)
            return -1;
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    return launch_daemon(argv, timeout_ms, exit_status);
}

int harness_start(harness_t *h, unsigned blocks, const char *const *extra)
{
    return harness_start_geometry(h, blocks, test_geometry, extra);
}

int harness_start_geometry(harness_t *h, unsigned blocks, const char *const *geometry,
                           const char *const *extra)
{
    memset(h, 0, sizeof(*h));
    if (test_tmp_dir("kvs-test", h->dir, sizeof(h->dir)) != 0)
        return -1;
    int n = snprintf(h->socket_path, sizeof(h->socket_path), "%s/kvshared.sock", h->dir);
    if (n < 0 || (size_t)n >= sizeof(h->socket_path)) {
        fprintf(stderr, "harness: %s/kvshared.sock is too long for a socket path\n", h->dir);
        rmdir(h->dir);
        return -1;
    }
    h->pid = spawn(h->socket_path, blocks, geometry, extra, LAUNCH_READY_MS, NULL);
    if (h->pid < 0) {
        h->pid = 0;
        return -1;
    }
    return 0;
}

int harness_start_again(const harness_t *h, unsigned blocks, int timeout_ms, pid_t *pid_out)
{
    return harness_restart(h, blocks, NULL, timeout_ms, pid_out);
}

int harness_restart(const harness_t *h, unsigned blocks, const char *const *extra, int timeout_ms,
                    pid_t *pid_out)
{
    int status;
    pid_t pid = spawn(h->socket_path, blocks, test_geometry, extra, timeout_ms, &status);
    *pid_out = pid > 0 ? pid : 0;
    if (pid > 0)
        return -1;
    return status >= 0 ? status : -2;
}

int harness_stop(harness_t *h)
{
    if (h->pid <= 0)
        return -1;
    int rc = launch_stop(h->pid, SIGTERM, HARNESS_STOP_MS);
    h->pid = 0;
    return rc;
}

void harness_cleanup(harness_t *h)
{
    if (h->pid > 0) {
        launch_stop(h->pid, SIGKILL, HARNESS_STOP_MS);
        h->pid = 0;
    }
    unlink(h->socket_path);
    rmdir(h->dir);
}
