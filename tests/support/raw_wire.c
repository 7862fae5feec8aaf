/* SPDX-License-Identifier: Apache-2.0 */
#include "raw_wire.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
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

uint8_t *raw_frames(const Kvshare__Request *req, size_t n, size_t *len)
{
    size_t size = kvshare__request__get_packed_size(req), one = FRAME_HEADER_BYTES + size;
    if (n == 0 || size > UINT32_MAX || one > SIZE_MAX / n)
        return NULL;
    uint8_t *buf = malloc(one * n);
    if (!buf)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        frame_put_len(buf + i * one, (uint32_t)size);
        kvshare__request__pack(req, buf + i * one + FRAME_HEADER_BYTES);
    }
    *len = one * n;
    return buf;
}

uint8_t *raw_frame(const Kvshare__Request *req, size_t *len)
{
    return raw_frames(req, 1, len);
}

uint8_t *raw_ping_frames(size_t payload_len, size_t n, size_t *len)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PingRequest ping = KVSHARE__PING_REQUEST__INIT;
    uint8_t *payload = calloc(1, payload_len ? payload_len : 1);
    if (!payload)
        return NULL;
    ping.payload.data = payload;
    ping.payload.len = payload_len;
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &ping;
    uint8_t *buf = raw_frames(&req, n, len);
    free(payload);
    return buf;
}

uint8_t *raw_frame_head(uint32_t body_len, size_t head_len, size_t *len)
{
    if (head_len > SIZE_MAX - FRAME_HEADER_BYTES)
        return NULL;
    uint8_t *buf = calloc(1, FRAME_HEADER_BYTES + head_len);
    if (!buf)
        return NULL;
    frame_put_len(buf, body_len);
    *len = FRAME_HEADER_BYTES + head_len;
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

size_t raw_write_until_closed(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = send(fd, p + done, len - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    return done;
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

/* One request, its reply (NULL on an error status or none). */
static Kvshare__Response *call_ok(int fd, const Kvshare__Request *req)
{
    if (raw_send_request(fd, req) != 0)
        return NULL;
    Kvshare__Response *r = raw_read_reply(fd, 60000);
    if (r && r->status != 0) {
        kvshare__response__free_unpacked(r, NULL);
        return NULL;
    }
    return r;
}

/* One batch of raw_commit_one_block_prompts: prompts first .. first + nb. */
static int commit_batch(int fd, uint32_t first, uint32_t nb, uint32_t bt, uint32_t *ids,
                        uint32_t *tokens, uint8_t *frames, size_t frame_max)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = nb;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    Kvshare__Response *r = call_ok(fd, &req);
    if (!r || r->rpc_case != KVSHARE__RESPONSE__RPC_ALLOC || r->alloc->n_block_ids != nb) {
        if (r)
            kvshare__response__free_unpacked(r, NULL);
        return -1;
    }
    memcpy(ids, r->alloc->block_ids, nb * sizeof(*ids));
    kvshare__response__free_unpacked(r, NULL);

    size_t used = 0;
    for (uint32_t k = 0; k < nb; k++) {
        tokens[0] = first + k + 1;
        for (uint32_t j = 1; j < bt; j++)
            tokens[j] = 6 + j;
        Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
        cm.tokens.data = (uint8_t *)tokens;
        cm.tokens.len = bt * sizeof(*tokens);
        cm.n_block_ids = 1;
        cm.block_ids = &ids[k];
        req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
        req.commit = &cm;
        size_t len = 0;
        uint8_t *f = raw_frame(&req, &len);
        if (!f || len > frame_max) {
            free(f);
            return -1;
        }
        memcpy(frames + used, f, len);
        used += len;
        free(f);
    }
    if (raw_write_all(fd, frames, used) != 0)
        return -1;
    for (uint32_t k = 0; k < nb; k++) {
        r = raw_read_reply(fd, 60000);
        bool ok = r && r->status == 0 && r->rpc_case == KVSHARE__RESPONSE__RPC_COMMIT &&
                  r->commit->n_committed == 1;
        if (r)
            kvshare__response__free_unpacked(r, NULL);
        if (!ok)
            return -1;
    }

    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    rl.n_block_ids = nb;
    rl.block_ids = ids;
    req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
    req.release = &rl;
    r = call_ok(fd, &req);
    bool ok = r && r->rpc_case == KVSHARE__RESPONSE__RPC_RELEASE && r->release->n_released == nb;
    if (r)
        kvshare__response__free_unpacked(r, NULL);
    return ok ? 0 : -1;
}

int raw_commit_one_block_prompts(int fd, uint32_t n, uint32_t bt, uint32_t batch)
{
    if (batch == 0 || batch > 65536 || bt == 0 || bt > 1024)
        return -1;
    size_t frame_max = 64 + (size_t)bt * 4;
    uint32_t *ids = malloc(batch * sizeof(*ids));
    uint32_t *tokens = malloc(bt * sizeof(*tokens));
    uint8_t *frames = malloc(batch * frame_max);
    int rc = ids && tokens && frames ? 0 : -1;
    for (uint32_t first = 0; rc == 0 && first < n; first += batch)
        rc = commit_batch(fd, first, n - first < batch ? n - first : batch, bt, ids, tokens, frames,
                          frame_max);
    free(ids);
    free(tokens);
    free(frames);
    return rc;
}
