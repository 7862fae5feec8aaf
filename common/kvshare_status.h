/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare status codes: one table for every part of kvshare.
 *
 * Functions return 0 on success and a negative KVS_E* code on failure. The
 * same table gives kvs_strerror()'s text and, in the daemon, the status that
 * travels in a protobuf Response (proto status = -code), so a code means the
 * same thing in the index, the pool, the daemon and the client.
 *
 * A full pool (KVS_EPOOLFULL) is not out of memory (KVS_ENOMEM): it is the
 * signal to evict.
 *
 * Codes are part of the wire protocol and the ABI: append, never renumber.
 */
#ifndef KVSHARE_STATUS_H
#define KVSHARE_STATUS_H

/*      name         code  text */
#define KVS_STATUS_TABLE(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EPOOLFULL, -3, "no free block in the pool")                                                  \
    X(EQUOTA, -4, "namespace quota reached")                                                       \
    X(ENOTFOUND, -5, "no such block")                                                              \
    X(ENOTPINNED, -6, "block is not pinned")                                                       \
    X(ENOTHELD, -7, "block is not held by this session")                                           \
    X(EBADSTATE, -8, "block is not in the state this operation needs")                             \
    X(ENONS, -9, "unknown namespace")                                                              \
    X(EEXIST, -10, "already exists")                                                               \
    X(EPROTO, -11, "protocol error")                                                               \
    X(ETOOBIG, -12, "message larger than the limit")                                               \
    X(ETIMEDOUT, -13, "timed out")                                                                 \
    X(ENOTCONN, -14, "not connected to kvshared")                                                  \
    X(EIO, -15, "input/output error")                                                              \
    X(ENODRIVER, -16, "no CUDA driver")                                                            \
    X(ENODEV, -17, "no such device")                                                               \
    X(ENOTSUP, -18, "not supported")                                                               \
    X(ELIMIT, -19, "session limit reached")                                                        \
    X(EDENIED, -20, "permission denied")                                                           \
    X(EVERSION, -21, "protocol version mismatch")                                                  \
    X(EBUSY, -22, "resource busy")                                                                 \
    X(EINTERNAL, -23, "internal error")                                                            \
    X(EIDENTITY, -24, "the namespace holds another model's KV (identity mismatch)")

typedef enum kvs_status {
#define KVS_STATUS_ENUM(name, code, text) KVS_##name = (code),
    KVS_STATUS_TABLE(KVS_STATUS_ENUM)
#undef KVS_STATUS_ENUM
} kvs_status_t;

/* Number of codes in the table: codes run from 0 down to -(KVS_STATUS_COUNT - 1). */
#define KVS_STATUS_COUNT 25

/* The table's text for a code; "unknown kvshare status" for any other value.
 * kvs_strerror() is this, exported from libkvshare; code that does not link
 * the client (the index, the pool, tools) calls this directly. */
static inline const char *kvs_status_text(int status)
{
    switch (status) {
#define KVS_STATUS_TEXT(name, code, text)                                                          \
    case (code):                                                                                   \
        return (text);
        KVS_STATUS_TABLE(KVS_STATUS_TEXT)
#undef KVS_STATUS_TEXT
    default:
        return "unknown kvshare status";
    }
}

#endif /* KVSHARE_STATUS_H */
