/*
 * libkvshare: the client library of kvshared, the KV-cache prefix sharing daemon.
 *
 * (The theory of operation and the API are filled in with the client.)
 */
#ifndef KVSHARE_H
#define KVSHARE_H

#include "kvshare_status.h"

#define KVS_VERSION_MAJOR 0
#define KVS_VERSION_MINOR 1
#define KVS_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* Returns a static, human-readable text for a KVS_* status code. Never NULL. */
const char *kvs_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif /* KVSHARE_H */
