/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshared: the daemon assembled. server_open builds every part on one
 * libuv loop, bottom up: the devices' pool memory, the store (pool, index,
 * records), tier 2 in host memory, tier 3 on a disk file, the cluster tier,
 * the in-flight tables, the namespaces; and wires the hooks the lower floors
 * call upward (the hold's turn, background steps and releases, the stop on
 * a fault). server_listen opens the socket (listener.h), the signals and
 * the loop watch, and starts the warm restart; server_shutdown (also run by
 * SIGINT / SIGTERM) stops accepting and closes every session, after which
 * the loop ends and server_free releases the rest, top down.
 */
#ifndef KVS_DAEMON_KVSHARED_H
#define KVS_DAEMON_KVSHARED_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "listener.h"
#include "server.h"

/* Creates the pool memory, the pool and the index on `loop`. Errors (with a
 * message for a person in err): KVS_EINVAL (geometry, sizes), KVS_ENOMEM, and
 * the backend's errors (backend.h). */
int server_open(const server_config_t *cfg, uv_loop_t *loop, server_t **out, char *err,
                size_t errlen);

/* Binds and listens on cfg.socket_path (mode 0660), installs the SIGINT /
 * SIGTERM handlers when `signals` is true, then signals readiness on
 * cfg.ready_fd. A socket file that no daemon answers on is replaced.
 * Errors: KVS_EBUSY (a live daemon answers there), KVS_EINVAL (path too long,
 * or a file that is not a socket), KVS_EIO. */
int server_listen(server_t *s, bool signals, char *err, size_t errlen);

/* Stops accepting, closes every session (releasing what it holds), removes
 * the socket file. Idempotent. The loop ends once the handles are closed. */
void server_shutdown(server_t *s);

/* Closes the drain deadline timer if shutdown started one (call once the
 * loop has ended, then run the loop once more). */
void server_drain_done(server_t *s);

/* Frees the pool, the index and the memory. Call after server_shutdown and
 * after the loop has run the close callbacks. Accepts NULL. */
void server_free(server_t *s);

/* Starts publishing KV events (cfg.events.endpoint set; after the
 * namespaces of the config are declared) and queues AllBlocksCleared on
 * the topic of every namespace that maps to a model. Errors (message in
 * err): those of events_start, KVS_ENOMEM. */
int server_events_start(server_t *s, char *err, size_t errlen);

#endif /* KVS_DAEMON_KVSHARED_H */
