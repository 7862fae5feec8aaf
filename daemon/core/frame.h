/* SPDX-License-Identifier: Apache-2.0 */
/*
 * frame: the byte stream of a connection cut into messages (the header's
 * layout and codec: common/frame_header.h).
 *
 * A frame_buf is a growable byte buffer with a read offset: bytes arrive at
 * the end, whole frames are taken from the front, and the unread tail moves to
 * the front once per batch rather than once per frame.
 */
#ifndef KVS_DAEMON_FRAME_H
#define KVS_DAEMON_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "frame_header.h"
#include "kvshare.pb-c.h"
#include "kvshare_status.h"

typedef struct frame_buf {
    uint8_t *data;
    size_t head; /* first unread byte */
    size_t len;  /* bytes in data, read or not */
    size_t cap;
} frame_buf_t;

/* Makes room for `extra` more bytes after len (moving unread bytes to the
 * front first). Errors: KVS_ENOMEM (the buffer is unchanged). */
int frame_buf_reserve(frame_buf_t *b, size_t extra);

/* Drops everything, keeps the allocation. */
static inline void frame_buf_reset(frame_buf_t *b)
{
    b->head = b->len = 0;
}

/* Frees the allocation; the buffer is empty and reusable after. */
void frame_buf_release(frame_buf_t *b);

/* Takes the next whole frame from the unread bytes of b. Returns 1 with
 * *body / *body_len set (valid until the next reserve) and the frame consumed,
 * 0 when more bytes are needed, KVS_ETOOBIG when the length prefix exceeds
 * max_frame (the stream cannot be trusted past this point). */
int frame_next(frame_buf_t *b, uint32_t max_frame, const uint8_t **body, uint32_t *body_len);

/* Appends one frame holding the packed response. Errors: KVS_ENOMEM,
 * KVS_ETOOBIG (the message does not fit a 32-bit length). */
int frame_append_response(frame_buf_t *b, const Kvshare__Response *resp);

/* Same for a request (clients, tests and benches build requests). */
int frame_append_request(frame_buf_t *b, const Kvshare__Request *req);

#endif /* KVS_DAEMON_FRAME_H */
