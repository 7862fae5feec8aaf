/* SPDX-License-Identifier: Apache-2.0 */
#include "launch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "now.h"

#define LAUNCH_MAX_ARGS 120

#define STILL_RUNNING (-2)

/* Waits for pid to exit until the deadline (polling, so that the caller's
 * deadline holds), then SIGKILLs and reaps it. Returns its exit status, -1
 * if it ended by a signal or could not be waited for, STILL_RUNNING if it was
 * killed at the deadline. */
static int reap_by(pid_t pid, int64_t deadline)
{
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (r < 0 && errno != EINTR)
            return -1;
        if (now_ms() >= deadline) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            return STILL_RUNNING;
        }
        usleep(2000);
    }
}

/* Reads "READY\n" from fd by the deadline: 0, or -1 if the pipe closed
 * (the daemon exited), something else came, or time ran out. */
static int wait_ready(int fd, int64_t deadline)
{
    char buf[8];
    size_t got = 0;
    while (got < 6) {
        int64_t left = deadline - now_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0)
            return -1;
        int n = poll(&pfd, 1, (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        ssize_t r = read(fd, buf + got, 6 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return memcmp(buf, "READY\n", 6) == 0 ? 0 : -1;
}

pid_t launch_daemon(const char *const *argv, int timeout_ms, int *exit_status)
{
    int p[2];
    size_t argc = 0;
    if (exit_status)
        *exit_status = -1;
    while (argv[argc])
        argc++;
    if (argc == 0 || argc > LAUNCH_MAX_ARGS || pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        const char *args[LAUNCH_MAX_ARGS + 3];
        char fd[16];
        close(p[0]);
        /* No daemon outlives the test or bench that started it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        snprintf(fd, sizeof(fd), "%d", p[1]);
        memcpy(args, argv, argc * sizeof(*args));
        args[argc] = "--ready-fd";
        args[argc + 1] = fd;
        args[argc + 2] = NULL;
        execv(args[0], (char *const *)args);
        fprintf(stderr, "launch: cannot run %s: %s\n", args[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    int64_t deadline = now_ms() + timeout_ms;
    int rc = wait_ready(p[0], deadline);
    close(p[0]);
    if (rc == 0)
        return pid;
    /* It exited (the pipe closed), or is silent at the deadline: make sure it
     * is gone, and say which. */
    int status = reap_by(pid, deadline);
    if (exit_status)
        *exit_status = status == STILL_RUNNING ? -1 : status;
    /* Said here, once for every caller: a start that fails under load is
     * otherwise only "-1" in a test's assertion. */
    if (status == STILL_RUNNING)
        fprintf(stderr, "launch: %s wrote no READY within %d ms: killed\n", argv[0], timeout_ms);
    else
        fprintf(stderr, "launch: %s ended before READY (%s %d)\n", argv[0],
                status >= 0 ? "exit status" : "killed by a signal or not waited for:", status);
    return -1;
}

int launch_stop(pid_t pid, int sig, int timeout_ms)
{
    if (pid <= 0)
        return -1;
    kill(pid, sig);
    int status = reap_by(pid, now_ms() + timeout_ms);
    return status == STILL_RUNNING ? -1 : status;
}
