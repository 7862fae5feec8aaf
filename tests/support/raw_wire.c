#include "raw_wire.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame_header.h"
#include "now.h"
#include "socket_path.h"

int raw_connect(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int n = snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    if (n < 0 || (size_t)n >= SOCKET_PATH_MAX)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

uint8_t *raw_frame(const Kvshare__Request *req, size_t *len)
{
    size_t size = kvshare__request__get_packed_size(req);
    if (size > UINT32_MAX)
        return NULL;
    uint8_t *buf = malloc(FRAME_HEADER_BYTES + size);
    if (!buf)
        return NULL;
    frame_put_len(buf, (uint32_t)size);
    kvshare__request__pack(req, buf + FRAME_HEADER_BYTES);
    *len = FRAME_HEADER_BYTES + size;
    return buf;
}

int raw_write_all(int fd, const void *buf, size_t len)
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

int raw_send_request(int fd, const Kvshare__Request *req)
{
    size_t len;
    uint8_t *frame = raw_frame(req, &len);
    if (!frame)
        return -1;
    int rc = raw_write_all(fd, frame, len);
    free(frame);
    return rc;
}

static int read_exact(int fd, uint8_t *p, size_t len, int64_t deadline)
{
    while (len > 0) {
        int64_t left = deadline - now_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0)
            return -1;
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
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

Kvshare__Response *raw_read_reply(int fd, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    uint8_t hdr[FRAME_HEADER_BYTES];
    if (read_exact(fd, hdr, sizeof(hdr), deadline) != 0)
        return NULL;
    uint32_t len = frame_get_len(hdr);
    if (len > RAW_MAX_REPLY)
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
