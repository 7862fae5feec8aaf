#include "daemon_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KVSHARED_PATH
#error "KVSHARED_PATH must name the kvshared binary"
#endif

/* The test geometry: 2 layers, 2 kv heads, head_dim 8, fp16, 4-token blocks. */
static const char *const test_geometry[] = {
    "--layers", "2",    "--kv-heads",     "2", "--head-dim", "8",
    "--dtype",  "fp16", "--block-tokens", "4", NULL,
};

static pid_t spawn(const char *socket_path, unsigned blocks, const char *const *geometry,
                   const char *const *extra, int *ready)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char fd[16], nblocks[16];
        const char *argv[64];
        int n = 0;
        close(p[0]);
        /* A test that fails mid-way leaves no daemon behind. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        snprintf(fd, sizeof(fd), "%d", p[1]);
        snprintf(nblocks, sizeof(nblocks), "%u", blocks);
        /* KVS_KVSHARED: the daemon of a packed device run (tools/device-pack.sh),
         * whose build tree is not there. */
        const char *daemon = getenv("KVS_KVSHARED") ? getenv("KVS_KVSHARED") : KVSHARED_PATH;
        argv[n++] = daemon;
        argv[n++] = "--socket";
        argv[n++] = socket_path;
        argv[n++] = "--backend";
        argv[n++] = "host";
        for (int i = 0; geometry[i] && n < 32; i++)
            argv[n++] = geometry[i];
        argv[n++] = "--pool-blocks";
        argv[n++] = nblocks;
        argv[n++] = "--ready-fd";
        argv[n++] = fd;
        argv[n++] = "--log-level";
        argv[n++] = getenv("KVS_TEST_DAEMON_LOG") ? getenv("KVS_TEST_DAEMON_LOG") : "warn";
        for (int i = 0; extra && extra[i] && n < 62; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        execv(daemon, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    *ready = p[0];
    return pid;
}

/* Waits for "READY\n" (returns 0) or for the pipe to close first (-1). */
static int wait_ready(int fd, int timeout_ms)
{
    char buf[16];
    size_t got = 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (got < 6) {
        if (poll(&pfd, 1, timeout_ms) <= 0)
            return -1;
        ssize_t n = read(fd, buf + got, sizeof(buf) - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return memcmp(buf, "READY\n", 6) == 0 ? 0 : -1;
}

int harness_start(harness_t *h, unsigned blocks, const char *const *extra)
{
    return harness_start_geometry(h, blocks, test_geometry, extra);
}

int harness_start_geometry(harness_t *h, unsigned blocks, const char *const *geometry,
                           const char *const *extra)
{
    int ready;
    memset(h, 0, sizeof(*h));
    snprintf(h->dir, sizeof(h->dir), "/tmp/kvs-test-XXXXXX");
    if (!mkdtemp(h->dir))
        return -1;
    snprintf(h->socket_path, sizeof(h->socket_path), "%s/kvshared.sock", h->dir);
    h->pid = spawn(h->socket_path, blocks, geometry, extra, &ready);
    if (h->pid < 0)
        return -1;
    int rc = wait_ready(ready, 20000);
    close(ready);
    if (rc != 0) {
        kill(h->pid, SIGKILL);
        waitpid(h->pid, NULL, 0);
        h->pid = 0;
    }
    return rc;
}

int harness_start_again(const harness_t *h, unsigned blocks, int timeout_ms, pid_t *pid_out)
{
    return harness_restart(h, blocks, NULL, timeout_ms, pid_out);
}

int harness_restart(const harness_t *h, unsigned blocks, const char *const *extra, int timeout_ms,
                    pid_t *pid_out)
{
    int ready, status;
    pid_t pid = spawn(h->socket_path, blocks, test_geometry, extra, &ready);
    *pid_out = pid;
    if (pid < 0)
        return -1;
    int rc = wait_ready(ready, timeout_ms);
    close(ready);
    if (rc == 0)
        return -1; /* listening */
    if (waitpid(pid, &status, 0) == pid && WIFEXITED(status))
        return WEXITSTATUS(status);
    return -1;
}

int harness_stop(harness_t *h)
{
    int status;
    if (h->pid <= 0)
        return -1;
    kill(h->pid, SIGTERM);
    pid_t r;
    do {
        r = waitpid(h->pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    h->pid = 0;
    if (r < 0 || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

void harness_cleanup(harness_t *h)
{
    if (h->pid > 0) {
        kill(h->pid, SIGKILL);
        waitpid(h->pid, NULL, 0);
        h->pid = 0;
    }
    unlink(h->socket_path);
    rmdir(h->dir);
}
