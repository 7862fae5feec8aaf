#include "rel_util.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame_header.h"

int64_t rel_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

kvs_client_t *rel_client(const char *path, const char *name, int timeout_ms)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = path;
    o.worker_name = name;
    o.timeout_ms = timeout_ms;
    int rc = kvs_connect(&o, &c);
    ck_assert_msg(rc == 0, "connect %s: %s", name, kvs_strerror(rc));
    return c;
}

int rel_raw_connect(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

uint8_t *rel_frame(Kvshare__Request *req, size_t *len)
{
    size_t size = kvshare__request__get_packed_size(req);
    uint8_t *buf = malloc(size + 4);
    ck_assert_ptr_nonnull(buf);
    frame_put_len(buf, (uint32_t)size);
    kvshare__request__pack(req, buf + 4);
    *len = size + 4;
    return buf;
}

int rel_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_exact(int fd, uint8_t *p, size_t len, int64_t deadline)
{
    while (len > 0) {
        int left = (int)(deadline - rel_now_ms());
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            return -1;
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

Kvshare__Response *rel_read_reply(int fd, int timeout_ms)
{
    int64_t deadline = rel_now_ms() + timeout_ms;
    uint8_t hdr[4];
    if (read_exact(fd, hdr, 4, deadline) != 0)
        return NULL;
    uint32_t len = frame_get_len(hdr);
    if (len > (64u << 20))
        return NULL;
    uint8_t *body = malloc(len ? len : 1);
    if (!body)
        return NULL;
    Kvshare__Response *r = NULL;
    if (read_exact(fd, body, len, deadline) == 0)
        r = kvshare__response__unpack(NULL, len, body);
    free(body);
    return r;
}

void rel_prompt(uint32_t *tokens, size_t n_tokens, uint32_t family)
{
    for (size_t i = 0; i < n_tokens; i++)
        tokens[i] = family * 100003u + (uint32_t)i;
}

void rel_stats(kvs_client_t *mon, kvs_stats_t *out)
{
    int rc = kvs_stats(mon, out);
    ck_assert_msg(rc == 0, "stats: %s (%s)", kvs_strerror(rc), kvs_last_error(mon));
    ck_assert_msg(out->free_blocks + out->writing_blocks + out->cached_blocks == out->total_blocks,
                  "block accounting: free %u + writing %u + cached %u != pool %u", out->free_blocks,
                  out->writing_blocks, out->cached_blocks, out->total_blocks);
    ck_assert_msg(out->pinned_blocks <= out->cached_blocks, "pinned %u > cached %u",
                  out->pinned_blocks, out->cached_blocks);
}

void rel_wait_quiet(kvs_client_t *mon, uint32_t sessions, int idle, int timeout_ms,
                    kvs_stats_t *out)
{
    kvs_stats_t s;
    int64_t deadline = rel_now_ms() + timeout_ms;
    for (;;) {
        rel_stats(mon, &s);
        if (s.sessions == sessions && (!idle || (s.writing_blocks == 0 && s.pinned_blocks == 0)))
            break;
        if (rel_now_ms() > deadline)
            break;
        kvs_stats_free(&s);
        usleep(5000);
    }
    ck_assert_msg(s.sessions == sessions, "%u sessions, %u expected", s.sessions, sessions);
    if (idle) {
        ck_assert_msg(s.writing_blocks == 0, "%u blocks still WRITING with no client holding any",
                      s.writing_blocks);
        ck_assert_msg(s.pinned_blocks == 0, "%u blocks still pinned with no client holding any",
                      s.pinned_blocks);
        ck_assert_uint_eq(s.free_blocks + s.cached_blocks, s.total_blocks);
    }
    if (out)
        *out = s;
    else
        kvs_stats_free(&s);
}

static long status_kib(pid_t pid, const char *field)
{
    char path[64], line[256], fmt[64];
    long kib = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    snprintf(fmt, sizeof(fmt), "%s: %%ld kB", field);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, fmt, &kib) == 1)
            break;
    fclose(f);
    return kib;
}

long rel_rss_anon_kib(pid_t pid)
{
    return status_kib(pid, "RssAnon");
}

long rel_vm_hwm_kib(pid_t pid)
{
    return status_kib(pid, "VmHWM");
}

int rel_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}
