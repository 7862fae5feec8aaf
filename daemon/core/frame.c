/* SPDX-License-Identifier: Apache-2.0 */
#include "frame.h"

#include <stdlib.h>
#include <string.h>

#include "lookup_codec.h"

int frame_buf_reserve(frame_buf_t *b, size_t extra)
{
    if (b->head > 0 && (b->head == b->len || b->len + extra > b->cap)) {
        memmove(b->data, b->data + b->head, b->len - b->head);
        b->len -= b->head;
        b->head = 0;
    }
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) {
        if (cap > SIZE_MAX / 2)
            return KVS_ENOMEM;
        cap *= 2;
    }
    uint8_t *data = realloc(b->data, cap);
    if (!data)
        return KVS_ENOMEM;
    b->data = data;
    b->cap = cap;
    return 0;
}

void frame_buf_release(frame_buf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

int frame_next(frame_buf_t *b, uint32_t max_frame, const uint8_t **body, uint32_t *body_len)
{
    size_t avail = b->len - b->head;
    if (avail < FRAME_HEADER_BYTES)
        return 0;
    uint32_t len = frame_get_len(b->data + b->head);
    if (len > max_frame)
        return KVS_ETOOBIG;
    if (avail - FRAME_HEADER_BYTES < len)
        return 0;
    *body = b->data + b->head + FRAME_HEADER_BYTES;
    *body_len = len;
    b->head += FRAME_HEADER_BYTES + (size_t)len;
    if (b->head == b->len)
        b->head = b->len = 0;
    return 1;
}

/* Makes room for one frame of a body of `size` bytes at the end of b and
 * writes its header; *body: where the body goes. */
static int append_room(frame_buf_t *b, size_t size, uint8_t **body)
{
    if (size > UINT32_MAX)
        return KVS_ETOOBIG;
    int rc = frame_buf_reserve(b, FRAME_HEADER_BYTES + size);
    if (rc != 0)
        return rc;
    uint8_t *p = b->data + b->len;
    frame_put_len(p, (uint32_t)size);
    *body = p + FRAME_HEADER_BYTES;
    b->len += FRAME_HEADER_BYTES + size;
    return 0;
}

static int append_packed(frame_buf_t *b, const ProtobufCMessage *msg)
{
    uint8_t *body;
    int rc = append_room(b, protobuf_c_message_get_packed_size(msg), &body);
    if (rc == 0)
        protobuf_c_message_pack(msg, body);
    return rc;
}

int frame_append_response(frame_buf_t *b, const Kvshare__Response *resp)
{
    if (!lookup_reply_takes(resp))
        return append_packed(b, &resp->base);
    /* A Lookup's reply: packed by hand (lookup_codec.h), the same bytes. */
    uint8_t *body;
    int rc = append_room(b, lookup_reply_size(resp), &body);
    if (rc == 0)
        lookup_reply_pack(resp, body);
    return rc;
}

int frame_append_request(frame_buf_t *b, const Kvshare__Request *req)
{
    return append_packed(b, &req->base);
}
