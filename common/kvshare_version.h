/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare version: the release, the library's ABI version and the wire
 * protocol's version. CMake reads KVS_VERSION_* (the project's VERSION) and
 * KVS_SOVERSION (libkvshare.so.N) from here; kvshare.h includes this header.
 */
#ifndef KVSHARE_VERSION_H
#define KVSHARE_VERSION_H

#define KVS_VERSION_MAJOR 0
#define KVS_VERSION_MINOR 2
#define KVS_VERSION_PATCH 0

/*
 * ABI. libkvshare.so.KVS_SOVERSION: a program built against one header runs
 * with any later library of the same SOVERSION. Bump KVS_SOVERSION (and the
 * baseline that `tools/abi-check.sh` compares with, client/abi/) whenever a
 * change would break such a program: a function removed or its parameters
 * changed, a struct's size or a field's offset or type changed, a constant's
 * value or meaning changed. These need no bump: a new function, a new
 * constant, a field that takes the place of reserved slots (the size stays),
 * a counter appended to KVS_COUNTERS (kvshare_counters.h).
 *
 * Every struct the library fills (kvs_geometry_t, kvs_stats_t, kvs_ns_stats_t,
 * kvs_prefix_t), kvs_options_t and the options of the RPCs (kvs_lookup_opts_t,
 * ...) end with reserved room, zeroed, so their size never changes within one
 * SOVERSION (libuv's uv_metrics_t idiom): a field added later reads 0 from an
 * older library or daemon. An RPC's new optional argument is a field of its
 * options struct, never a new suffixed function. Only kvs_* symbols
 * are exported, from libkvshare.so and from libkvshare.a.
 */
#define KVS_SOVERSION 1

/* Sent in Hello: clients and daemons of the same major version interoperate. */
#define KVS_PROTOCOL_VERSION (KVS_VERSION_MAJOR * 1000 + KVS_VERSION_MINOR)

/* The longest wait a Lookup may ask for (LookupRequest.wait_ms): a worker
 * that would wait longer should compute instead. */
#define KVS_LOOKUP_MAX_WAIT_MS 60000

#endif /* KVSHARE_VERSION_H */
