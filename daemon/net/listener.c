/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The listening socket (listener.h): checked, bound, accepting sessions.
 */
#include "listener.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvshare_status.h"
#include "log.h"
#include "session_io.h"
#include "socket_path.h"

/* Connections the kernel queues before kvshared accepts them. */
#define SERVER_LISTEN_BACKLOG 128

/* Closes the listening handle and removes its socket file after a failure
 * between bind and the end of server_listen. */
void listener_abandon(server_t *s)
{
    uv_close((uv_handle_t *)&s->net.listener, NULL);
    s->net.listening = false;
    unlink(s->cfg.socket_path);
}

static void on_connection(uv_stream_t *listener, int status)
{
    server_t *s = listener->data;
    if (status < 0) {
        LOG_WARN("accept: %s", uv_strerror(status));
        return;
    }
    int rc = session_accept(s);
    if (rc != 0 && rc != KVS_ELIMIT && rc != KVS_EDENIED) {
        LOG_WARN("accept: %s", kvs_status_text(rc));
    } else if (rc == KVS_ELIMIT) {
        /* At most one line a second, however many are refused. */
        uint64_t now = uv_now(s->loop);
        s->net.refused_unlogged++;
        if (s->net.refuse_log_ms == 0 || now - s->net.refuse_log_ms >= 1000) {
            LOG_WARN("refused %llu connection(s): %u sessions is the limit (%s)",
                     (unsigned long long)s->net.refused_unlogged,
                     s->net.fd_sessions < s->cfg.max_sessions ? s->net.fd_sessions
                                                              : s->cfg.max_sessions,
                     s->net.fd_sessions < s->cfg.max_sessions
                         ? "what the descriptor limit leaves room for; raise LimitNOFILE / "
                           "ulimit -n"
                         : "--max-sessions");
            s->net.refuse_log_ms = now;
            s->net.refused_unlogged = 0;
        }
    }
}

/* Sessions the descriptor limit leaves room for, with a warning at start
 * when that is fewer than max_sessions. */
static void check_fd_limit(server_t *s)
{
    struct rlimit rl;
    s->net.fd_sessions = s->cfg.max_sessions;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return;
    uint64_t need = (uint64_t)s->cfg.max_sessions + SERVER_SPARE_FDS;
    if (rl.rlim_cur >= need)
        return;
    s->net.fd_sessions = rl.rlim_cur > 2 * SERVER_SPARE_FDS
                             ? (uint32_t)(rl.rlim_cur - SERVER_SPARE_FDS)
                             : (uint32_t)(rl.rlim_cur / 2);
    LOG_WARN("the descriptor limit (%llu, ulimit -n or LimitNOFILE) is below what max_sessions "
             "= %u needs (%llu): connections past %u sessions will be refused; raise the limit "
             "(its hard limit is %llu) or lower max_sessions",
             (unsigned long long)rl.rlim_cur, s->cfg.max_sessions, (unsigned long long)need,
             s->net.fd_sessions,
             rl.rlim_max == RLIM_INFINITY ? 0ull : (unsigned long long)rl.rlim_max);
}

/* Whether a daemon answers on path: a connect that succeeds means yes. */
static bool socket_is_live(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    bool live = connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
    close(fd);
    return live;
}

/* Creates the socket's directory (and its parents) when missing. */
static int make_dirs(const char *path, char *err, size_t errlen)
{
    char dir[SOCKET_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            goto fail;
        *p = '/';
    }
    if (mkdir(dir, 0750) != 0 && errno != EEXIST)
        goto fail;
    return 0;
fail:
    snprintf(err, errlen, "cannot create directory %s for the socket: %s", dir, strerror(errno));
    return KVS_EIO;
}

/* The directory that holds the socket must be ours (or root's) and writable
 * by nobody else (unless sticky, like /tmp, where others cannot remove or
 * replace our entry): whoever can create or replace the socket there can pose
 * as kvshared to every worker. A missing directory is fine (we create it). */
static int check_socket_dir(const char *path, char *err, size_t errlen)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct stat st;
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (lstat(dir, &st) != 0)
        return 0;
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen,
                 "%s (the socket's directory) is not a directory (a symbolic link?); refusing "
                 "it: give --socket in a directory kvshared owns",
                 dir);
        return KVS_EDENIED;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        snprintf(err, errlen,
                 "%s (the socket's directory) belongs to uid %u, not to kvshared's uid %u nor "
                 "root: another user may have created it to pose as kvshared; remove it or give "
                 "--socket in a directory kvshared owns",
                 dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return KVS_EDENIED;
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
        snprintf(err, errlen,
                 "%s (the socket's directory) is writable by %s (mode %04o): they could replace "
                 "the socket and pose as kvshared; chmod go-w it or give another --socket",
                 dir, (st.st_mode & S_IWOTH) ? "every user" : "its group",
                 (unsigned)(st.st_mode & 07777));
        return KVS_EDENIED;
    }
    return 0;
}

int server_check_socket(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (!path || !path[0] || strlen(path) >= SOCKET_PATH_MAX) {
        snprintf(err, errlen, "socket path '%s' is empty or longer than %zu bytes",
                 path ? path : "", SOCKET_PATH_MAX - 1);
        return KVS_EINVAL;
    }
    int rc = check_socket_dir(path, err, errlen);
    if (rc != 0)
        return rc;
    if (lstat(path, &st) != 0)
        return 0;
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket; remove it or pick --socket", path);
        return KVS_EINVAL;
    }
    if (st.st_uid != geteuid()) {
        snprintf(err, errlen,
                 "socket %s belongs to uid %u, not to kvshared's uid %u: another user may be "
                 "posing as kvshared there; remove it or pick another --socket",
                 path, (unsigned)st.st_uid, (unsigned)geteuid());
        return KVS_EDENIED;
    }
    if (socket_is_live(path)) {
        snprintf(err, errlen,
                 "a kvshared is already running on %s; stop it first or pick another --socket",
                 path);
        return KVS_EBUSY;
    }
    return 0;
}

int listener_open(server_t *s, char *err, size_t errlen)
{
    const char *path = s->cfg.socket_path;
    struct stat st;
    int rc;

    rc = server_check_socket(path, err, errlen);
    if (rc != 0)
        return rc;
    check_fd_limit(s);
    if (lstat(path, &st) == 0) {
        LOG_INFO("replacing stale socket %s (no daemon answers on it)", path);
        unlink(path);
    } else {
        rc = make_dirs(path, err, errlen);
        if (rc == 0) /* it may have been created by someone else meanwhile */
            rc = check_socket_dir(path, err, errlen);
        if (rc != 0)
            return rc;
    }

    rc = uv_pipe_init(s->loop, &s->net.listener, 0);
    if (rc != 0) {
        snprintf(err, errlen, "cannot create the listening handle for %s: %s", path,
                 uv_strerror(rc));
        return KVS_EIO;
    }
    s->net.listener.data = s;
    s->net.listening = true;
    rc = uv_pipe_bind(&s->net.listener, path);
    if (rc == 0 && chmod(path, 0660) != 0)
        rc = uv_translate_sys_error(errno);
    if (rc == 0 && s->cfg.has_socket_gid && chown(path, (uid_t)-1, (gid_t)s->cfg.socket_gid) != 0) {
        snprintf(err, errlen,
                 "cannot give socket %s to group %u (socket_group): %s; run kvshared as root "
                 "or as a member of that group",
                 path, s->cfg.socket_gid, strerror(errno));
        listener_abandon(s);
        return KVS_EIO;
    }
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->net.listener, SERVER_LISTEN_BACKLOG, on_connection);
    if (rc != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", path, uv_strerror(rc));
        uv_close((uv_handle_t *)&s->net.listener, NULL);
        s->net.listening = false;
        return KVS_EIO;
    }
    if (stat(path, &st) == 0) {
        s->net.sock_dev = st.st_dev;
        s->net.sock_ino = st.st_ino;
    }
    return 0;
}

void listener_close(server_t *s)
{
    if (!s->net.listening)
        return;
    uv_close((uv_handle_t *)&s->net.listener, NULL);
    s->net.listening = false;
    /* Remove the socket only if it is still ours (not a successor's). */
    struct stat st;
    if (stat(s->cfg.socket_path, &st) == 0 && st.st_dev == s->net.sock_dev &&
        st.st_ino == s->net.sock_ino)
        unlink(s->cfg.socket_path);
}
