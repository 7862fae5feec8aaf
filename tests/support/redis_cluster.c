/* SPDX-License-Identifier: Apache-2.0 */
#include "redis_cluster.h"

#include "test_tmp.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A base port whose n ports and their cluster-bus twins (+10000) are free. */
static int pick_ports(rc_cluster_t *rc, int n)
{
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    for (int tries = 0; tries < 200; tries++) {
        int base = 20000 + (rand() % 2000) * 10;
        int ok = 1;
        for (int i = 0; i < n && ok; i++)
            ok = port_free(base + i) && port_free(base + i + 10000);
        if (ok) {
            for (int i = 0; i < n; i++)
                rc->port[i] = base + i;
            return 0;
        }
    }
    return -1;
}

/* Runs argv with stdout and stderr into log; returns its exit status. */
static int run_wait(const char *const *argv, const char *log)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = fopen(log, "a");
        if (f) {
            dup2(fileno(f), 1);
            dup2(fileno(f), 2);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static pid_t start_server(const rc_cluster_t *rc, int i)
{
    char dir[320], port[16], log[340];
    snprintf(dir, sizeof dir, "%s/n%d", rc->dir, i);
    snprintf(port, sizeof port, "%d", rc->port[i]);
    snprintf(log, sizeof log, "%s/redis.log", dir);
    if (mkdir(dir, 0700) != 0)
        return -1;
    const char *argv[40] = {"redis-server",
                            "--port",
                            port,
                            "--bind",
                            "127.0.0.1",
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            "--cluster-node-timeout",
                            "1000",
                            "--cluster-replica-validity-factor",
                            "0",
                            "--cluster-require-full-coverage",
                            "no",
                            "--save",
                            "",
                            "--appendonly",
                            "no",
                            "--dir",
                            dir,
                            "--logfile",
                            log,
                            "--daemonize",
                            "no"};
    int argc = 0;
    while (argv[argc])
        argc++;
    if (rc->pass[0]) {
        argv[argc++] = "--requirepass";
        argv[argc++] = rc->pass;
        argv[argc++] = "--masterauth";
        argv[argc++] = rc->pass;
    }
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

redisContext *rc_connect(const rc_cluster_t *rc, int i)
{
    struct timeval tv = {2, 0};
    redisContext *ctx = redisConnectWithTimeout("127.0.0.1", rc->port[i], tv);
    if (!ctx || ctx->err) {
        redisFree(ctx);
        return NULL;
    }
    redisSetTimeout(ctx, tv);
    if (rc->pass[0]) {
        redisReply *r = redisCommand(ctx, "AUTH %s", rc->pass);
        int ok = r && r->type != REDIS_REPLY_ERROR;
        freeReplyObject(r);
        if (!ok) {
            redisFree(ctx);
            return NULL;
        }
    }
    return ctx;
}

/* Waits until node i answers PING (it listens): 0; -2 when it exited
 * (its port or bus port was taken between pick_ports and its bind: another
 * test's server or a client's ephemeral port; then another server may
 * answer on the port, so the exit is checked first); -1 otherwise. */
static int wait_listening(rc_cluster_t *rc, int i)
{
    for (int t = 0; t < 200; t++) {
        int st;
        if (waitpid(rc->pid[i], &st, WNOHANG) == rc->pid[i]) {
            rc->pid[i] = 0;
            return -2;
        }
        redisContext *ctx = rc_connect(rc, i);
        if (ctx) {
            redisFree(ctx);
            return 0;
        }
        usleep(25000);
    }
    return -1;
}

/* The last lines of the cluster's logs on stderr, before its directory
 * goes: why it did not start. */
static void print_logs(const rc_cluster_t *rc)
{
    char path[400];
    for (int i = -1; i < rc->n; i++) {
        if (i < 0)
            snprintf(path, sizeof path, "%s/create.log", rc->dir);
        else
            snprintf(path, sizeof path, "%s/n%d/redis.log", rc->dir, i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char lines[8][256];
        int n = 0;
        while (fgets(lines[n % 8], sizeof lines[0], f))
            n++;
        fclose(f);
        fprintf(stderr, "redis_cluster: the end of %s:\n", path);
        for (int k = n > 8 ? n - 8 : 0; k < n; k++)
            fprintf(stderr, "    %s", lines[k % 8]);
    }
}

static int node_state_ok(const rc_cluster_t *rc, int i)
{
    redisContext *ctx = rc_connect(rc, i);
    if (!ctx)
        return 0;
    redisReply *r = redisCommand(ctx, "CLUSTER INFO");
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    freeReplyObject(r);
    redisFree(ctx);
    return ok;
}

/* Starts rc's n servers on fresh ports: 0, -2 when one exited at start
 * (a port taken meanwhile: the caller tries other ports), -1. */
static int start_servers(rc_cluster_t *rc, int n)
{
    if (test_tmp_dir("kvs-redis", rc->dir, sizeof rc->dir) != 0 || pick_ports(rc, n) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        rc->pid[i] = start_server(rc, i);
        rc->n = i + 1;
        int w = rc->pid[i] > 0 ? wait_listening(rc, i) : -1;
        if (w != 0)
            return w;
    }
    return 0;
}

/* Whether one of rc's servers exited (it aborts when its cluster bus port,
 * bound after its port, was taken since pick_ports). */
static int any_exited(rc_cluster_t *rc)
{
    int exited = 0;
    for (int i = 0; i < rc->n; i++) {
        int st;
        if (rc->pid[i] > 0 && waitpid(rc->pid[i], &st, WNOHANG) == rc->pid[i]) {
            rc->pid[i] = 0;
            exited = 1;
        }
    }
    return exited;
}

/* Makes rc's servers one cluster and waits until every node says it is
 * ok: 0, -2 when a server exited meanwhile, -1. */
static int create_cluster(rc_cluster_t *rc, int n, int replicas)
{
    char addrs[RC_MAX_NODES][32], reps[8], log[300];
    const char *argv[32] = {"redis-cli", "--cluster", "create"};
    int argc = 3;
    size_t off = 0;
    usleep(100000); /* a server that cannot bind its bus port aborts by now */
    if (any_exited(rc))
        return -2;
    for (int i = 0; i < n; i++) {
        snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", rc->port[i]);
        argv[argc++] = addrs[i];
        off += (size_t)snprintf(rc->seeds + off, sizeof rc->seeds - off, "%s%s", i ? "," : "",
                                addrs[i]);
    }
    snprintf(reps, sizeof reps, "%d", replicas);
    argv[argc++] = "--cluster-replicas";
    argv[argc++] = reps;
    argv[argc++] = "--cluster-yes";
    if (rc->pass[0]) {
        argv[argc++] = "-a";
        argv[argc++] = rc->pass;
        argv[argc++] = "--no-auth-warning";
    }
    argv[argc] = NULL;
    snprintf(log, sizeof log, "%s/create.log", rc->dir);
    if (run_wait(argv, log) != 0)
        return any_exited(rc) ? -2 : -1;
    for (int t = 0; t < 400; t++) {
        int ok = 1;
        for (int i = 0; i < n && ok; i++)
            ok = node_state_ok(rc, i);
        if (ok)
            return 0;
        if (any_exited(rc))
            return -2;
        usleep(50000);
    }
    return -1;
}

int rc_start(rc_cluster_t *rc, int masters, int replicas, const char *pass)
{
    memset(rc, 0, sizeof *rc);
    int n = masters * (1 + replicas);
    if (n < 3 || n > RC_MAX_NODES)
        return -1;
    if (pass)
        snprintf(rc->pass, sizeof rc->pass, "%s", pass);
    int started = -2;
    for (int attempt = 0; attempt < 5 && started == -2; attempt++) {
        started = start_servers(rc, n);
        if (started == 0)
            started = create_cluster(rc, n, replicas);
        if (started == -2) {
            fprintf(stderr, "redis_cluster: a server exited at start (a port taken since it was "
                            "picked); again on other ports\n");
            print_logs(rc);
            rc_stop(rc);
        }
    }
    if (started == 0)
        return 0;
    fprintf(stderr, "redis_cluster: could not start the cluster\n");
    print_logs(rc);
    rc_stop(rc);
    return -1;
}

int rc_renice(const rc_cluster_t *rc, int nice)
{
    int failed = 0;
    for (int i = 0; i < rc->n; i++) {
        if (rc->pid[i] <= 0)
            continue;
        /* Nice is per thread on Linux: every thread the server has now,
         * and the ones it makes later inherit its main thread's. */
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task", (int)rc->pid[i]);
        DIR *d = opendir(path);
        if (!d) {
            failed = 1;
            continue;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            int tid = atoi(e->d_name);
            if (tid > 0 && setpriority(PRIO_PROCESS, (id_t)tid, nice) != 0)
                failed = 1;
        }
        closedir(d);
    }
    return failed ? -1 : 0;
}

void rc_kill(rc_cluster_t *rc, int i)
{
    if (i < 0 || i >= rc->n || rc->pid[i] <= 0)
        return;
    kill(rc->pid[i], SIGKILL);
    waitpid(rc->pid[i], NULL, 0);
    rc->pid[i] = 0;
}

void rc_stop(rc_cluster_t *rc)
{
    for (int i = 0; i < rc->n; i++)
        rc_kill(rc, i);
    if (rc->dir[0]) {
        const char *argv[] = {"rm", "-rf", rc->dir, NULL};
        run_wait(argv, "/dev/null");
        rc->dir[0] = '\0';
    }
}

int rc_node_of_port(const rc_cluster_t *rc, int port)
{
    for (int i = 0; i < rc->n; i++)
        if (rc->port[i] == port)
            return i;
    return -1;
}

const char *rc_missing(void)
{
    if (system("redis-server --version >/dev/null 2>&1") != 0 ||
        system("redis-cli --version >/dev/null 2>&1") != 0)
        return "redis-server or redis-cli is not installed (tools/install-deps.sh)";
    return NULL;
}
