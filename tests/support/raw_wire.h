/* SPDX-License-Identifier: Apache-2.0 */
/*
 * raw_wire: a client of kvshared that speaks the wire protocol by hand, for
 * tests that must send what libkvshare never would (half frames, junk,
 * oversized lengths, floods) or read replies libkvshare would hide. Frames
 * are built with common/frame_header.h like everywhere else.
 *
 * Nothing here asserts: the functions return codes, so forked worker
 * processes may use them too.
 */
#ifndef KVS_TEST_RAW_WIRE_H
#define KVS_TEST_RAW_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare.pb-c.h"

/* The largest reply raw_read_reply accepts. */
#define RAW_MAX_REPLY (64u << 20)

/* A blocking socket connected to the daemon at path, or -1. */
int raw_connect(const char *path);

/* req as one frame (length header + packed body) in a malloc'd buffer of
 * *len bytes; NULL when out of memory. */
uint8_t *raw_frame(const Kvshare__Request *req, size_t *len);

/* n copies of req as frames, back to back (a pipeline), in a malloc'd
 * buffer of *len bytes; NULL when n is 0 or out of memory. */
uint8_t *raw_frames(const Kvshare__Request *req, size_t n, size_t *len);

/* n Ping frames (request id 0) whose payload is payload_len zero bytes, as
 * raw_frames; NULL when n is 0 or out of memory. */
uint8_t *raw_ping_frames(size_t payload_len, size_t n, size_t *len);

/* The start of a frame that announces a body of body_len bytes: its
 * header, then head_len zero bytes of body (a frame that never ends when
 * head_len < body_len), in a malloc'd buffer of *len bytes; NULL when out
 * of memory. */
uint8_t *raw_frame_head(uint32_t body_len, size_t head_len, size_t *len);

/* Writes all of buf (blocking, no SIGPIPE). Returns 0 or -1. */
int raw_write_all(int fd, const void *buf, size_t len);

/* Writes what the socket takes of buf (blocking, no SIGPIPE) until all of
 * it is written or a send fails: the daemon hung up, or a send timeout set
 * on fd (SO_SNDTIMEO) ran out. Returns the bytes written. */
size_t raw_write_until_closed(int fd, const void *buf, size_t len);

/* raw_frame + raw_write_all. Returns 0 or -1. */
int raw_send_request(int fd, const Kvshare__Request *req);

/* Reads one reply frame within timeout_ms. Returns it (free with
 * kvshare__response__free_unpacked), or NULL on timeout, end of stream, a
 * length over RAW_MAX_REPLY or a body that does not decode. */
Kvshare__Response *raw_read_reply(int fd, int timeout_ms);

/* Caches n prompts of one block of bt tokens each (prompt i: i + 1, then
 * bt - 1 fixed tokens), so n prefixes of one index node each, in the
 * default namespace, unpinned: `batch` at a time (at most 65,536), one
 * Alloc, the batch's Commits pipelined, one Release of the pins they
 * leave. One Commit per prefix waiting for its reply would take minutes
 * for a million. The pool must have n free blocks. Returns 0, or -1 on
 * any error reply, short reply or failed write. */
int raw_commit_one_block_prompts(int fd, uint32_t n, uint32_t bt, uint32_t batch);

#endif /* KVS_TEST_RAW_WIRE_H */
