/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvshare: the client library of kvshared, the KV-cache prefix sharing daemon.
 *
 * Theory of operation
 * -------------------
 * kvshared owns one pool of KV-cache blocks per node (GPU memory, or host
 * memory) and an index of the token prefixes those blocks hold. A decode
 * worker connects once (kvs_connect), which maps the pool into the worker
 * (kvs_pool_base, kvs_block_addr), then for each prompt:
 *
 *   1. kvs_lookup(prompt, pin = 1): the longest cached prefix, as block ids,
 *      pinned so they cannot be evicted while the worker reads them;
 *   2. kvs_alloc(n - m): fresh blocks (WRITING, owned by this client) for
 *      the rest of the prompt's n full blocks, past the m found; the worker
 *      computes and writes KV there;
 *   3. kvs_commit(prompt, the m looked-up ids then the fresh ones): the
 *      written blocks enter the index, pinned by this client; another worker
 *      may have committed the same prefix first: then `canonical` names the
 *      block to use and the duplicate stays WRITING, to be released;
 *   4. kvs_release(all n ids) when the request is done: pins go, WRITING
 *      blocks go back to the pool.
 *
 * Only full blocks (block_tokens tokens, default 16) are cached. Everything a
 * client holds is released by the daemon when the connection ends, however it
 * ends (kvs_close, exit, crash).
 *
 * The cache is an optimisation, never a dependency. Every call has a timeout
 * (kvs_options_t.timeout_ms, default 1000 ms, kept within 5 ms): a daemon
 * that does not answer in time gets KVS_ETIMEDOUT and the connection is
 * dropped. While the client is disconnected, kvs_lookup returns KVS_ENOTCONN
 * with *n_blocks = 0 (a miss: compute the prompt), and every call first tries
 * to reconnect (at most once per reconnect_ms). A reconnect is a new session
 * (nothing held before it survives) and maps the pool again: addresses from
 * kvs_pool_base / kvs_block_addr stay valid until kvs_epoch() changes or
 * kvs_close, and once kvs_connected() returns 0, until the next call that
 * needs the daemon (any RPC or kvs_ping): that call unmaps the old pool
 * before it reconnects, so that a restarted daemon can have its memory
 * back. Finish with the old addresses before making that call.
 *
 * Memory: with the host backend the addresses are host pointers; with cuda
 * they are device pointers in this process's CUDA context (use them from
 * kernels or cuMemcpy). kvs_block_write / kvs_block_read copy bytes either
 * way.
 *
 * Errors: every function returns 0 or a negative KVS_* code
 * (kvshare_status.h); kvs_strerror() gives the code's text and
 * kvs_last_error() the daemon's message for the last failed call (which block,
 * which limit, what to do).
 *
 * Circuit breaker (KVS_BREAKER): without it every call made while the
 * daemon hangs waits the full timeout. With it, a call that times out, whose
 * connection drops, or whose connect or Hello fails (the daemon unreachable
 * or silent, not a refusal it sends) trips the client "down": from then on
 * every call returns KVS_ENOTCONN at once, without touching the socket
 * (kvs_lookup with *n_blocks = 0, a miss), while a thread of the client
 * probes the socket path in the background: a connect and a Ping of at
 * most 200 ms, 50 ms after the trip, then with the wait doubling up to 2 s.
 * The first probe that gets an answer brings the client "up", and the next
 * call reconnects as above (Hello, the pool mapped again). So a worker
 * waits on a hung daemon once per trip, never once per call. kvs_breaker
 * says where it stands.
 *
 * Threads: a kvs_client_t is not thread-safe; use one per thread or lock.
 * With KVS_BREAKER the client owns one thread of its own while it is down
 * (the probe: it reads the socket path and its own state, never the
 * connection, the mapping or the caller's buffers); kvs_close wakes and
 * joins it at once. kvs_breaker may be called from any thread (not
 * during or after kvs_close).
 *
 * Processes: a client belongs to the process that connected it. In a child
 * forked after kvs_connect, every call fails with KVS_ENOTCONN and the
 * message "reconnect from the new process" (kvs_lookup is then a miss);
 * kvs_close there frees the client without touching the parent's
 * connection (nor its probe thread, which the child does not have).
 * Connect again from the child if it needs the cache.
 *
 * Wire protocol: proto/kvshare.proto (frames of a 4-byte little-endian length
 * and one protobuf message).
 */
#ifndef KVSHARE_H
#define KVSHARE_H

#include <stddef.h>
#include <stdint.h>

#include "kvshare_counters.h"
#include "kvshare_status.h"
#include "kvshare_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns a static, human-readable text for a KVS_* status code. Never NULL. */
const char *kvs_strerror(int status);

/* Writes the default socket path into buf: $KVSHARE_SOCKET if set, else
 * $XDG_RUNTIME_DIR/kvshare/kvshared.sock, else /run/kvshare/kvshared.sock for
 * root, else /tmp/kvshare-$UID/kvshared.sock. Errors: KVS_EINVAL (buf too
 * small). */
int kvs_default_socket_path(char *buf, size_t len);

typedef struct kvs_client kvs_client_t;

/* Connection flags (kvs_options_t.flags). */
#define KVS_NO_MAP 0x1u /* do not map the pool (monitoring tools) */
#define KVS_LAZY   0x2u /* kvs_connect succeeds even if the daemon is down */
/* Also map the daemon's tier 2 (kvshared --host-tier), read-only, for
 * kvs_lookup_tier2 (see "Tier 2 in place" below). Without a tier 2 there,
 * nothing more is mapped. */
#define KVS_MAP_TIER2 0x4u
/* A kvshared with several devices (--devices) serves one tensor-parallel
 * group, one pool per device with the same block ids. KVS_RANK: this client
 * is the worker of rank kvs_options_t.rank (its device) and maps that
 * device's pool only; its kvs_commit stands for its own shard, and a block
 * is cached once every rank committed it (docs/OPERATING.md, "Several GPUs
 * of one model").
 * KVS_GROUP_SCHEDULER: this client is the group's scheduler: it maps
 * nothing, and commits for the whole group (kvs_commit_opts_t.for_group). */
#define KVS_RANK            0x8u
#define KVS_GROUP_SCHEDULER 0x10u
/* A hung or dead daemon costs one call, not every call ("Circuit breaker"
 * above; kvs_breaker). */
#define KVS_BREAKER 0x20u

/* Options for kvs_connect. Always start with kvs_options_init: it sets
 * `size`, so fields added later keep older callers working. */
typedef struct kvs_options {
    size_t size;             /* sizeof(kvs_options_t), set by kvs_options_init */
    const char *socket_path; /* NULL: kvs_default_socket_path() */
    int timeout_ms;          /* per call, connect included; default 1000 */
    const char *worker_name; /* shown in the daemon's logs; may be NULL */
    unsigned flags;          /* KVS_NO_MAP, KVS_LAZY, KVS_BREAKER, ... */
    int reconnect_ms;        /* least time between reconnect attempts; default 0 */
    /* Before sending anything the client checks who listens on the socket
     * (SO_PEERCRED): the daemon must run as this process's effective uid, as
     * root, as daemon_uid when it is not 0, or as the owner of the socket's
     * directory when only root could have made that directory theirs (the
     * directory and its root-owned parent writable by no one else, as
     * systemd's /run/kvshare for a service account). Any other peer is
     * refused with KVS_EDENIED: another local user may have taken the socket
     * path to pose as kvshared. */
    uint64_t daemon_uid;
    uint32_t rank;       /* with KVS_RANK: this worker's rank (device), 0 .. devices - 1 */
    uint32_t reserved32; /* keep 0 */
    /* Whose KV this worker reads and writes, declared in Hello; NULL:
     * nothing declared (kvs_identity_t). Copied by kvs_connect. */
    const struct kvs_identity *identity;
    uint64_t reserved[5]; /* room for options added later: keep 0 */
} kvs_options_t;

/*
 * Model identity (docs/OPERATING.md, "Model identity"). A block's KV is
 * valid only for what computed it: the model and its revision, the dtype,
 * the geometry, tokens per block and the parallel layout. kvshared holds
 * one identity per namespace; a worker that declares its own in Hello
 * (kvs_options_t.identity) binds the namespace to it when the namespace has
 * none of its own yet, and is refused with KVS_EIDENTITY (kvs_last_error
 * names both identities) when the namespace holds another model's KV. Its
 * later calls on any namespace are held to the same identity. The geometry
 * fields given (non-zero, dtype non-NULL) must be the pool's.
 */
typedef struct kvs_identity {
    size_t size;          /* sizeof(kvs_identity_t), set by kvs_identity_init */
    const char *ns;       /* the namespace declared for; NULL or "": "default" */
    const char *model;    /* required: the model's name or path (no control characters) */
    const char *revision; /* its revision (tag or commit, no spaces); NULL: not known */
    const char *dtype;    /* "fp16", "bf16", ...; NULL: not declared */
    uint32_t layers, kv_heads, head_dim;  /* 0: not declared (MLA: kv_heads = head_dim = 0) */
    uint32_t block_tokens;                /* 0: not declared */
    uint32_t kv_lora_rank, rope_head_dim; /* MLA; 0: not declared */
    uint32_t tp_size;                     /* devices one block spans; 0: not declared */
    uint32_t reserved32;                  /* keep 0 */
    uint64_t reserved[4];                 /* room for fields added later: keep 0 */
} kvs_identity_t;

void kvs_identity_init(kvs_identity_t *id);

/* The identity kvshared holds for the namespace this client declared one
 * for, as its last Hello reply said: the canonical text into buf (len
 * bytes, always NUL-terminated when len > 0) and its 64-bit hash into
 * *hash (may be NULL). Errors: KVS_EINVAL (NULL buf with len > 0),
 * KVS_ENOTFOUND (the client declared nothing, or the daemon is older and
 * said nothing), KVS_ENOTCONN (never connected). */
int kvs_identity(const kvs_client_t *c, char *buf, size_t len, uint64_t *hash);

void kvs_options_init(kvs_options_t *opts);

/* Connects, says Hello and maps the pool (unless KVS_NO_MAP). The strings in
 * opts are copied. On success *out owns the connection; free it with
 * kvs_close. Errors: KVS_EINVAL, KVS_ENOMEM, KVS_ENOTCONN (no daemon at the
 * path; with KVS_LAZY this is not an error and *out is a disconnected
 * client), KVS_ETIMEDOUT, KVS_EVERSION, KVS_EPROTO, KVS_EIO and the mapping
 * errors of the backend (KVS_ENODRIVER, KVS_ENODEV for cuda). */
int kvs_connect(const kvs_options_t *opts, kvs_client_t **out);

/* Closes the connection (the daemon releases all it holds) and unmaps the
 * pool. Accepts NULL. */
void kvs_close(kvs_client_t *c);

/* 1 when connected, 0 when not. */
int kvs_connected(const kvs_client_t *c);

/* Counts connections made: changes when a reconnect maps the pool again. */
uint64_t kvs_epoch(const kvs_client_t *c);

/* The circuit breaker of a client connected with KVS_BREAKER ("Circuit
 * breaker" above). Without the flag it stays up and every count is 0. */
#define KVS_BREAKER_UP   0u
#define KVS_BREAKER_DOWN 1u
typedef struct kvs_breaker_stats {
    size_t size;          /* sizeof(kvs_breaker_stats_t), set by kvs_breaker_stats_init */
    uint32_t state;       /* KVS_BREAKER_UP or KVS_BREAKER_DOWN */
    uint32_t reserved32;  /* 0 */
    uint64_t trips;       /* times the client went down */
    uint64_t probes;      /* probes the background thread sent */
    uint64_t fast_fails;  /* calls answered at once, KVS_ENOTCONN, while down */
    uint64_t down_ms;     /* down: milliseconds since it went down; up: 0 */
    uint64_t reserved[6]; /* room for fields added later (0 until then) */
} kvs_breaker_stats_t;

void kvs_breaker_stats_init(kvs_breaker_stats_t *s);

/* Fills *out (its first out->size bytes: start from kvs_breaker_stats_init).
 * Safe from any thread while c is open. Errors: KVS_EINVAL (NULL, or a size
 * of 0 or larger than this library's struct). */
int kvs_breaker(const kvs_client_t *c, kvs_breaker_stats_t *out);

/* Several devices: this client's rank (0 without KVS_RANK) and the number
 * of devices (ranks) the daemon serves, as its Hello reply said (1 for a
 * daemon of one device). Errors: KVS_EINVAL (NULL), KVS_ENOTCONN (never
 * connected). */
int kvs_group(const kvs_client_t *c, uint32_t *rank, uint32_t *group_size);

/* The daemon's message (or the library's) for the last failed call on c;
 * "" after a success. Owned by c, valid until the next call. */
const char *kvs_last_error(const kvs_client_t *c);

/* Changes the per-call timeout (ms, > 0). */
void kvs_set_timeout(kvs_client_t *c, int timeout_ms);

/* --- geometry and the mapped pool --- */

typedef enum kvs_backend {
    KVS_BACKEND_HOST = 1,
    KVS_BACKEND_CUDA = 2,
} kvs_backend_t;

/* An MLA (latent attention) pool (kv_lora_rank != 0) has no V: kv_stride is
 * 0, kv is always 0, and a slot holds one latent of kv_lora_rank +
 * rope_head_dim elements per token, also reported as kv_heads = 1 and
 * head_dim = that width (how engines describe an MLA cache). */
typedef struct kvs_geometry {
    uint32_t layers, kv_heads, head_dim;
    uint32_t dtype_bytes;
    char dtype[8]; /* "fp32", "fp16", "bf16", "fp8" */
    uint32_t block_tokens;
    uint32_t num_blocks;
    uint64_t block_bytes;  /* one block: all layers, K and V */
    uint64_t slot_bytes;   /* one block, one layer, K or V: contiguous */
    uint64_t layer_stride; /* bytes between layer l and l + 1 */
    uint64_t kv_stride;    /* bytes between a layer's K and its V; 0: MLA, no V */
    uint64_t block_stride; /* bytes between block b and b + 1 */
    uint64_t pool_bytes;
    kvs_backend_t backend;
    uint8_t device_uuid[16]; /* cuda: the device the pool lives on */
    uint32_t kv_lora_rank;   /* MLA: latent width; 0: K and V per layer */
    uint32_t rope_head_dim;  /* MLA: decoupled RoPE key width */
    /* Tier 2 (kvshared --host-tier; 0 without one): its blocks, laid out as
     * the pool's with tier2_blocks in place of num_blocks, and its bytes. */
    uint32_t tier2_blocks;
    uint64_t tier2_bytes;
    uint64_t reserved[6]; /* room for fields added later (0 until then) */
} kvs_geometry_t;

/* The pool's geometry as the daemon described it at the last connect.
 * Errors: KVS_ENOTCONN (never connected). */
int kvs_geometry(const kvs_client_t *c, kvs_geometry_t *out);

/* Base address of the mapped pool: a host pointer (host backend) or a CUDA
 * device pointer (cuda). 0 when not mapped. */
uintptr_t kvs_pool_base(const kvs_client_t *c);

/* Address of block `block`'s K (kv = 0) or V (kv = 1) in layer `layer`:
 * slot_bytes contiguous bytes laid out [token][kv_head][head_dim] (MLA: the
 * latent, kv = 0 only). Errors: KVS_EINVAL (out of range), KVS_ENOTCONN (no
 * mapping). */
int kvs_block_addr(const kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block,
                   uintptr_t *addr);

/* Copies n bytes (at most slot_bytes) into / out of the start of block's K
 * (kv = 0) or V (kv = 1) slot in layer, through the mapping: memcpy for
 * host, a driver copy for cuda (so tools and tests need no CUDA code).
 * Errors: KVS_EINVAL (out of range), KVS_ENOTCONN (no mapping), KVS_EIO. */
int kvs_block_write(kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block, const void *src,
                    size_t n);
int kvs_block_read(kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block, void *dst,
                   size_t n);

/* --- tier 2 in place ---
 *
 * A kvshared with a tier 2 (--host-tier) keeps blocks evicted from the pool
 * in host memory. A plain pinned kvs_lookup copies matched tier-2 blocks
 * back into the pool before it answers. An engine with KV memory of its own
 * may rather copy them itself, from a mapping of tier 2:
 *
 *   1. kvs_connect with KVS_MAP_TIER2: the daemon's tier-2 memfd is mapped
 *      read-only into this process (kvs_tier2_base; 0 without a tier 2);
 *   2. kvs_lookup_tier2: the matched prefix, pinned, as pool blocks
 *      (tiers[i] == 1) and then tier-2 blocks (tiers[i] == 2, ids[i] their
 *      block number in tier 2), which stay where they are;
 *   3. read them: kvs_tier2_block_addr / kvs_tier2_block_read, the pool
 *      blocks with kvs_block_addr as usual;
 *   4. kvs_release_tiers(ids, tiers): the pins go.
 *
 * While this client pins a tier-2 block it is neither dropped nor moved
 * (the daemon makes room elsewhere, or not at all), so its bytes stay as
 * they were. After the release they may change at any time: read nothing
 * through an address you no longer pin. The mapping is PROT_READ (from an
 * fd opened read-only where the system allows): reading is all a client may
 * do; a write faults (SIGSEGV). The addresses are host pointers in both
 * backends (on cuda, host memory that the daemon registered for DMA; to
 * copy to the device with DMA from this process, register the range with
 * cuMemHostRegister and CU_MEMHOSTREGISTER_READ_ONLY, or copy through
 * pageable memory). They stay valid as kvs_pool_base's do (until
 * kvs_epoch() changes or kvs_close). */

/* Base address of the mapped tier 2 (a host pointer), 0 when not mapped. */
uintptr_t kvs_tier2_base(const kvs_client_t *c);

/* Address of tier-2 block `block`'s K (kv = 0) or V (kv = 1) in layer
 * `layer`: slot_bytes contiguous bytes, laid out as in the pool. Errors:
 * KVS_EINVAL (out of range: block >= tier2_blocks), KVS_ENOTCONN (no
 * mapping), KVS_ENOTSUP (tier 2 not mapped: no KVS_MAP_TIER2, or no tier 2
 * at the daemon). */
int kvs_tier2_block_addr(const kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block,
                         uintptr_t *addr);

/* Copies n bytes (at most slot_bytes) out of the start of tier-2 block's
 * slot (memcpy). Errors: as kvs_tier2_block_addr, and KVS_EINVAL (n). */
int kvs_tier2_block_read(kvs_client_t *c, uint32_t layer, uint32_t kv, uint32_t block, void *dst,
                         size_t n);

/* --- the RPCs (synchronous; each waits at most timeout_ms) --- */

/* Longest cached prefix of tokens in namespace ns (NULL or "": "default").
 * Writes up to max_ids block ids (prompt order) and *n_blocks; each covers
 * block_tokens tokens. With pin != 0 each returned block is pinned for this
 * client until kvs_release. Unknown namespaces are created. Errors:
 * KVS_EINVAL, KVS_ENOTCONN / KVS_ETIMEDOUT (*n_blocks = 0: a miss),
 * KVS_ELIMIT (too many namespaces). */
int kvs_lookup(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens, int pin,
               uint32_t *ids, size_t max_ids, size_t *n_blocks);

/* A pinned kvs_lookup that leaves tier-2 blocks in tier 2 ("Tier 2 in
 * place" above): ids[0 .. *n_blocks) is the matched prefix, at most max_ids
 * blocks, each pinned for this client; tiers[i] is 1 when ids[i] is a pool
 * block and 2 when it is a block of tier 2 (pool blocks come first). The
 * daemon copies nothing. Against a kvshared without tier 2 (or one that
 * predates this option) it is a pinned kvs_lookup, every tiers[i] 1.
 * Release with kvs_release_tiers (kvs_release takes pool ids only). Errors:
 * as kvs_lookup, and KVS_EINVAL (ids or tiers NULL with max_ids > 0). */
int kvs_lookup_tier2(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                     uint32_t *ids, uint8_t *tiers, size_t max_ids, size_t *n_blocks);

/* n fresh blocks in WRITING state, owned by this client, into ids[0..n).
 * When the pool is full the daemon evicts unpinned cached blocks on behalf
 * of ns (NULL: of no namespace), by the reservation rule: a namespace below
 * its reservation takes them from namespaces above theirs before its own;
 * none is taken below its reservation for another's need. Errors:
 * KVS_EINVAL, KVS_EPOOLFULL (everything is pinned or being written),
 * KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_alloc(kvs_client_t *c, const char *ns, uint32_t n, uint32_t *ids);

/* kvs_alloc in namespace ns (required), also saying which blocks of ns it
 * evicted to make room: the token ids of up to max_evicted of them,
 * block_tokens each (block i at evicted_tokens[i * block_tokens]), in
 * eviction order, and their number in *n_evicted. A block's own tokens, not
 * its prefix: in a namespace of one-block prompts (the engine plug-ins' key
 * blocks) they name the block. Blocks of other namespaces that it evicted
 * are not reported, nor blocks evicted by other requests. Errors: as
 * kvs_alloc, and KVS_EINVAL (ns NULL or "", n_evicted NULL, evicted_tokens
 * NULL with max_evicted > 0). */
int kvs_alloc_report(kvs_client_t *c, const char *ns, uint32_t n, uint32_t *ids,
                     uint32_t *evicted_tokens, size_t max_evicted, size_t *n_evicted);

/* Prefixes in flight. When several workers get the same new prompt at once,
 * each would compute the same prefill. A worker that declares what it is
 * about to write lets the others wait for it instead:
 *
 *   writer: kvs_lookup_wait(prompt) finds m blocks;
 *           kvs_alloc_for(ns, prompt, first_block = m, n - m): the fresh
 *           blocks are declared as holding blocks m .. n-1 of the prompt;
 *           kvs_commit as usual, at once or in pieces (commit the first
 *           blocks as soon as they are written: later commits name them again
 *           as cached blocks this client pins, and waiters see them at once);
 *   reader: kvs_lookup_wait(prompt, wait_ms): when blocks after the cached
 *           prefix are declared by another client, the reply waits until
 *           they are committed or released (or their writer dies), at most
 *           wait_ms, and is then the prefix cached at that time: compute
 *           only the rest.
 *
 * A client never waits for its own declarations, nor across namespaces.
 * The wait adds to the call's timeout; KVS_LOOKUP_MAX_WAIT_MS
 * (kvshare_version.h) is the longest. */

/* kvs_lookup, and: wait_ms (0 .. KVS_LOOKUP_MAX_WAIT_MS; 0 = answer at
 * once) as above; *inflight_blocks (may be NULL) = blocks right after the
 * returned prefix that other clients were writing when the reply was made
 * (a router or worker may choose to wait, or to go elsewhere); *waited (may
 * be NULL) = 1 when the daemon held the reply for other clients' writes.
 * Errors: as kvs_lookup, and KVS_EINVAL for wait_ms over the limit. */
int kvs_lookup_wait(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                    int pin, uint32_t wait_ms, uint32_t *ids, size_t max_ids, size_t *n_blocks,
                    uint32_t *inflight_blocks, int *waited);

/* kvs_alloc, declaring that ids[i] will hold block first_block + i of
 * tokens in namespace ns (required), so that kvs_lookup_wait of other
 * clients waits for them. n_tokens == 0: no declaration (kvs_alloc).
 * Errors: as kvs_alloc, and KVS_EINVAL (first_block + n over the prompt's
 * full blocks, tokens without ns). */
int kvs_alloc_for(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                  uint32_t first_block, uint32_t n, uint32_t *ids);

/* Commits the first n_ids full blocks of tokens, block i held by ids[i]:
 * either a WRITING block owned by this client, or a cached block this client
 * holds a pin on (from kvs_lookup or kvs_pin) that already holds prefix block
 * i in ns (so the ids a lookup returned can lead the list: no block need be
 * allocated for the hit part). canonical[i] (n_ids entries) gets the block
 * that now holds prefix block i: ids[i], or another client's block committed
 * first (then ids[i] stays WRITING: release it).
 * Pins: every canonical block is pinned once for this client, except a
 * cached block named in ids, which keeps the pin(s) the client already holds
 * and gains none. So after kvs_lookup(pin = 1) of m blocks and a commit of
 * those m then n - m fresh ones, the client holds exactly one pin on each of
 * the n blocks, and one kvs_release of the n ids frees them all.
 * The request is checked before anything changes: a refused block leaves
 * everything as it was. *n_committed (may be NULL) = blocks handled; on
 * KVS_EQUOTA the first *n_committed are done (duplicates count). Errors:
 * KVS_EINVAL (too few tokens, an id out of range or named twice),
 * KVS_ENOTHELD (another client's WRITING block, or a cached block this
 * client holds no pin on), KVS_EBADSTATE (a free block), KVS_EEXIST (a
 * cached block pinned by this client that does not hold prefix block i),
 * KVS_ENONS (cached blocks named in a namespace that does not exist),
 * KVS_EQUOTA, KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_commit(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
               const uint32_t *ids, size_t n_ids, uint32_t *canonical, size_t *n_committed);

/* One more pin on each cached block. *n_done (may be NULL) = blocks pinned
 * before an error. Errors: KVS_EINVAL, KVS_ENOTFOUND (not cached: evicted or
 * never committed), KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_pin(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done);

/* Releases each block: one pin of this client on a cached block, or a
 * WRITING block of this client back to the pool. In order; *n_done (may be
 * NULL) = blocks released before an error. Errors: KVS_EINVAL (out of
 * range), KVS_ENOTHELD (not held by this client: another's, free, or
 * released twice), KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_release(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done);

/* kvs_release of what kvs_lookup_tier2 returned: ids[i] in tier tiers[i],
 * pool blocks first, then tier-2 blocks (released in that order). *n_done
 * (may be NULL) = blocks released before an error. Errors: as kvs_release,
 * and KVS_EINVAL (a tier other than 1 or 2, a pool block after a tier-2 one,
 * a tier-2 block out of range or on a daemon without tier 2), KVS_ENOTHELD
 * (a tier-2 block this client does not pin). */
int kvs_release_tiers(kvs_client_t *c, const uint32_t *ids, const uint8_t *tiers, size_t n,
                      size_t *n_done);

/* Retention hints. The application often knows what the cache cannot: a
 * chat whose user closed the window, an agent session that ended, a system
 * prompt every request uses, a one-off batch job. A hint gives the blocks
 * it names a priority, 0 .. KVS_PRIORITY_MAX: the daemon evicts the lowest
 * priority first, least recently used within one. A block's priority is
 * the highest that a live hint gives it (one without a duration, and the
 * highest timed one), else its namespace's default (KVS_PRIORITY_DEFAULT
 * unless the config says `priority` in its [namespace] section); a
 * namespace's `max_priority` caps what its clients may set. duration_ms >
 * 0: the hint ends after that long. Priority is never a pin (a priority-100
 * block is evicted when nothing lower is left) and never overrides quotas
 * or reservations. An engine typically commits a system prompt with 90, a
 * live conversation's turns with 70 for the time the user may come back
 * (duration_ms), a one-off batch with 10, and releases a closed
 * conversation with 0 for a short duration. */
#define KVS_PRIORITY_MAX     100
#define KVS_PRIORITY_DEFAULT 50
typedef struct kvs_hint {
    uint32_t priority;    /* 0 .. KVS_PRIORITY_MAX */
    uint32_t duration_ms; /* 0: while the block is cached */
} kvs_hint_t;

/* Drops the cached blocks of namespace ns (NULL or "": "default") that can
 * go: every block no client pins, except the prefix (ancestors) of pinned
 * blocks. Pinned and WRITING blocks stay; blocks of other namespaces are not
 * touched. For an engine's "clear the store" and for operators; the blocks
 * go as evictions do (KV events, metrics). *n_cleared (may be NULL) = blocks
 * dropped; *n_kept (may be NULL) = cached blocks of ns left. Errors:
 * KVS_EINVAL, KVS_ENONS (no such namespace: never created here),
 * KVS_EDENIED (the namespace's allow-list refuses this client, or it may
 * not clear it: that takes uid 0, kvshared's clear_uids / clear_gids, or a
 * uid or gid the namespace's own allow-list names),
 * KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_clear(kvs_client_t *c, const char *ns, size_t *n_cleared, size_t *n_kept);

/* What kvs_evict did. */
typedef struct kvs_evict_result {
    uint32_t tier1_blocks; /* dropped from the pool */
    uint32_t tier2_blocks; /* dropped from tier 2 (kvshared --host-tier) */
    /* Of the prompt's cached prefix, blocks that stay: pinned, being copied
     * between the tiers, or continued by another cached prefix, and every
     * block before such a one. */
    uint32_t kept_blocks;
    uint32_t reserved32;
    uint64_t reserved[3]; /* room for fields added later (0 until then) */
} kvs_evict_result_t;

/* Drops one prompt's cached blocks that nothing else needs, from every
 * tier: along the longest cached prefix of tokens in namespace ns (NULL or
 * "": "default"), from its last block backward, each block that no client
 * pins and that no other cached prefix continues; the first block that must
 * stay ends it, so a shared prefix (a system prompt other conversations
 * extend) stays. For an engine's "delete this prompt" (SGLang's delete) and
 * for operators; the blocks go as evictions do (KV events, metrics). *out
 * (may be NULL) says how many went from each tier and how many stayed.
 * Errors: KVS_EINVAL, KVS_ENONS (no such namespace), KVS_EDENIED (its
 * allow-list refuses this client), KVS_EPROTO (a kvshared that predates
 * Evict), KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_evict(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
              kvs_evict_result_t *out);

/* kvs_commit, kvs_pin, kvs_release with a retention hint (NULL: none) for
 * every block they commit (canonical), pin, or release (cached ones). The
 * hint is applied to the blocks the call handled; errors as the plain
 * calls, and KVS_EINVAL for a priority over KVS_PRIORITY_MAX (then nothing
 * is done). */
int kvs_commit_hint(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                    const uint32_t *ids, size_t n_ids, uint32_t *canonical, size_t *n_committed,
                    const kvs_hint_t *hint);
int kvs_pin_hint(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done,
                 const kvs_hint_t *hint);
int kvs_release_hint(kvs_client_t *c, const uint32_t *ids, size_t n, size_t *n_done,
                     const kvs_hint_t *hint);

/* --- one entry point per RPC, its optional arguments in a struct ---
 *
 * kvs_lookup_ex, kvs_alloc_ex, kvs_commit_ex, kvs_pin_ex and kvs_release_ex
 * take every optional argument of their RPC in an options struct, and the
 * calls above are these with some options set: kvs_lookup_wait is
 * kvs_lookup_ex with pin, wait_ms, inflight_blocks and waited;
 * kvs_lookup_tier2 with pin, tier2_in_place and tiers; kvs_alloc_for and
 * kvs_alloc_report are kvs_alloc_ex with a declaration or a report;
 * kvs_*_hint and kvs_release_tiers set hint or tiers. Options may be
 * combined (a lookup that waits and leaves tier-2 blocks in place, a
 * release with a hint of tier-1 and tier-2 blocks). Options added later go
 * into these structs, never into new functions.
 *
 * As kvs_options_t: fill a struct from its kvs_*_opts_init (which zeroes
 * it and sets `size`), then set what you need; NULL means every default.
 * Its size does not change within one KVS_SOVERSION (reserved room at the
 * end: keep it 0), and the library reads only `size` bytes of it. Errors
 * of every _ex call: those of the calls it stands for, and KVS_EINVAL for
 * a size of 0 or larger than this library's struct. Pointers in an options
 * struct are the caller's, read or written during the call only. */

typedef struct kvs_lookup_opts {
    size_t size;      /* sizeof(kvs_lookup_opts_t), set by kvs_lookup_opts_init */
    int pin;          /* != 0: pin each returned block for this client */
    uint32_t wait_ms; /* 0 .. KVS_LOOKUP_MAX_WAIT_MS: wait for in-flight blocks (0: none) */
    /* Tier 2 in place (needs pin): tier-2 blocks stay in tier 2, tiers[i]
     * (max_ids entries, required when max_ids > 0) gets 1 or 2 for ids[i]. */
    int tier2_in_place;
    uint8_t *tiers;
    uint32_t *inflight_blocks; /* may be NULL: as kvs_lookup_wait */
    int *waited;               /* may be NULL: as kvs_lookup_wait */
    uint64_t reserved[6];      /* room for options added later: keep 0 */
} kvs_lookup_opts_t;

void kvs_lookup_opts_init(kvs_lookup_opts_t *o);

/* The Lookup RPC with options (NULL: a lookup that neither pins nor
 * waits). ids[0 .. *n_blocks), at most max_ids, as kvs_lookup. Errors: as
 * kvs_lookup_wait and kvs_lookup_tier2, and KVS_EINVAL (tier2_in_place
 * without pin, or without tiers when max_ids > 0). */
int kvs_lookup_ex(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                  const kvs_lookup_opts_t *opts, uint32_t *ids, size_t max_ids, size_t *n_blocks);

typedef struct kvs_alloc_opts {
    size_t size; /* sizeof(kvs_alloc_opts_t), set by kvs_alloc_opts_init */
    /* A declaration (kvs_alloc_for; needs ns): ids[i] will hold block
     * first_block + i of tokens. n_tokens 0: none. */
    const uint32_t *tokens;
    size_t n_tokens;
    uint32_t first_block;
    uint32_t reserved32;
    /* A report (kvs_alloc_report; needs ns), asked for by a non-NULL
     * n_evicted: the tokens of up to max_evicted evicted blocks of ns. */
    uint32_t *evicted_tokens;
    size_t max_evicted;
    size_t *n_evicted;
    uint64_t reserved[6]; /* room for options added later: keep 0 */
} kvs_alloc_opts_t;

void kvs_alloc_opts_init(kvs_alloc_opts_t *o);

/* The Alloc RPC with options (NULL: kvs_alloc). Errors: as kvs_alloc_for
 * and kvs_alloc_report. */
int kvs_alloc_ex(kvs_client_t *c, const char *ns, uint32_t n, const kvs_alloc_opts_t *opts,
                 uint32_t *ids);

typedef struct kvs_commit_opts {
    size_t size;            /* sizeof(kvs_commit_opts_t), set by kvs_commit_opts_init */
    const kvs_hint_t *hint; /* NULL: none; else for every canonical block */
    /* Several devices: non-zero, this commit caches blocks for the group
     * (the scheduler, or one rank, after all workers wrote theirs), each
     * only if every rank declared its shard of it written for these very
     * tokens (its own commit, or shard_written; a KVS_RANK committer's own
     * shard counts): else KVS_EBADSTATE, the last error naming the ranks
     * missing, and nothing changes. Zero: a KVS_RANK client commits its
     * own shard. */
    uint32_t for_group;
    /* Several devices, a KVS_RANK client: non-zero declares its shard of
     * these blocks written for these tokens and caches nothing (they count
     * in *n_pending): the group's for_group commit caches them. */
    uint32_t shard_written;
    /* Not NULL: gets the blocks of this commit that still wait for another
     * rank's shard (they stay WRITING; *n_committed counts the cached
     * prefix before them). */
    size_t *n_pending;
    uint64_t reserved[4]; /* room for options added later: keep 0 */
} kvs_commit_opts_t;

void kvs_commit_opts_init(kvs_commit_opts_t *o);

/* The Commit RPC with options (NULL: kvs_commit). Errors: as
 * kvs_commit_hint. */
int kvs_commit_ex(kvs_client_t *c, const char *ns, const uint32_t *tokens, size_t n_tokens,
                  const uint32_t *ids, size_t n_ids, const kvs_commit_opts_t *opts,
                  uint32_t *canonical, size_t *n_committed);

typedef struct kvs_pin_opts {
    size_t size;            /* sizeof(kvs_pin_opts_t), set by kvs_pin_opts_init */
    const kvs_hint_t *hint; /* NULL: none; else for every block pinned */
    uint64_t reserved[6];   /* room for options added later: keep 0 */
} kvs_pin_opts_t;

void kvs_pin_opts_init(kvs_pin_opts_t *o);

/* The Pin RPC with options (NULL: kvs_pin). Errors: as kvs_pin_hint. */
int kvs_pin_ex(kvs_client_t *c, const uint32_t *ids, size_t n, const kvs_pin_opts_t *opts,
               size_t *n_done);

typedef struct kvs_release_opts {
    size_t size;            /* sizeof(kvs_release_opts_t), set by kvs_release_opts_init */
    const kvs_hint_t *hint; /* NULL: none; else for every cached block released */
    /* NULL: every id is a pool block. Else tiers[i] is ids[i]'s tier, pool
     * blocks first, as kvs_lookup_tier2 returns them (kvs_release_tiers). */
    const uint8_t *tiers;
    uint64_t reserved[6]; /* room for options added later: keep 0 */
} kvs_release_opts_t;

void kvs_release_opts_init(kvs_release_opts_t *o);

/* The Release RPC with options (NULL: kvs_release). Errors: as
 * kvs_release_hint and kvs_release_tiers. */
int kvs_release_ex(kvs_client_t *c, const uint32_t *ids, size_t n, const kvs_release_opts_t *opts,
                   size_t *n_done);

#define KVS_NS_NAME_MAX 64

/* Retention priority bands, as /metrics, `kvshare stats` and `kvshare tree`
 * show them: band b holds priorities 25 b .. 25 b + 24, the last 75 .. 100. */
#define KVS_PRIORITY_BANDS 4
typedef struct kvs_priority_bands {
    uint64_t cached[KVS_PRIORITY_BANDS];  /* blocks cached now, by their priority's band */
    uint64_t evicted[KVS_PRIORITY_BANDS]; /* blocks dropped since start, by band then */
    uint64_t reserved[4];                 /* room for fields added later (0 until then) */
} kvs_priority_bands_t;

typedef struct kvs_ns_stats {
    char name[KVS_NS_NAME_MAX];
    uint64_t lookups, lookup_tokens, hit_tokens;
    uint64_t inserted_blocks, duplicate_blocks, evicted_blocks;
    uint32_t cached_blocks, pinned_blocks, quota, reserve;
    /* evicted_blocks by cause: for this namespace's own need, for another
     * namespace's need (or an Alloc naming none), at its quota. 0 from a
     * daemon that predates them. */
    uint64_t evicted_own, evicted_others, evicted_quota;
    /* Its blocks by retention priority band: memory of the kvs_stats_t,
     * valid until kvs_stats_free. NULL from a library that predates it; all
     * 0 from a daemon that does. */
    const kvs_priority_bands_t *bands;
    /* Tier 2 (host memory, kvshared --host-tier): blocks there now
     * (cached_blocks counts the pool), and of hit_tokens those matched
     * there. 0 without a tier 2 or from a daemon that predates it. */
    uint32_t tier2_blocks, reserved32;
    uint64_t tier2_hit_tokens;
    uint64_t reserved[2]; /* room for fields added later (0 until then) */
} kvs_ns_stats_t;

#define KVS__STATS_COUNTER(name, ...) uint64_t name;

/* One device of the daemon (kvs_stats_t.devices): kvshared --devices
 * serves a tensor-parallel group, one pool per device with the same block
 * ids, so blocks in use are the same on every device; the memory, the
 * workers and the shards of blocks still being written are per device. */
typedef struct kvs_device_stats {
    uint32_t rank;    /* the rank whose workers map this device's pool */
    int32_t ordinal;  /* the device: cuda ordinal; host: the simulated device's number */
    char detail[160]; /* the backend's description (cuda: name and UUID; host: memfd), cut to fit */
    uint64_t pool_bytes; /* its pool's memory */
    uint64_t used_bytes; /* blocks WRITING or cached, in bytes */
    uint32_t workers;    /* sessions connected as this rank (KVS_RANK) */
    /* WRITING blocks whose shard this rank committed, waiting for another
     * rank's; and those another rank committed a shard of, but not this one. */
    uint32_t shards_written, shards_missing;
    uint32_t reserved32;
    uint64_t reserved[4]; /* room for fields added later (0 until then) */
} kvs_device_stats_t;
/* One node of the cluster tier (docs/CLUSTER.md), in kvs_stats_t. */
typedef struct kvs_cluster_node {
    char address[80]; /* "host:port" */
    char state[16];   /* "idle", "connected", "down" (after a fault), "auth-refused" */
    uint32_t slots;   /* slots the daemon's map gives it (0: not a master of the map) */
    uint32_t reserved32;
    uint64_t requests;       /* commands sent to it, redirected ones included */
    uint64_t errors;         /* commands that ended badly on it */
    uint64_t replies;        /* replies it gave */
    uint64_t latency_us_sum; /* microseconds from send to reply, summed over replies */
    uint64_t latency_us_max; /* the longest */
    uint64_t reserved[2];    /* room for fields added later (0 until then) */
} kvs_cluster_node_t;

typedef struct kvs_stats {
    /* Gauges: the state now. */
    uint32_t total_blocks, free_blocks, writing_blocks, cached_blocks, pinned_blocks;
    uint32_t sessions; /* open now */
    uint32_t block_tokens;
    kvs_backend_t backend;
    uint64_t block_bytes, pool_bytes, index_bytes;
    uint64_t uptime_ms;
    size_t n_namespaces;
    kvs_ns_stats_t *namespaces; /* owned by out; free with kvs_stats_free */
    /* Tier 2 (host memory, kvshared --host-tier; 0 without one or from a
     * daemon that predates it): its size and cached blocks, and blocks
     * being copied between the tiers. */
    uint32_t tier2_total_blocks, tier2_cached_blocks;
    uint32_t copying_blocks;
    /* The daemon's event loop: its longest stretch of work between two
     * polls since start, wall-clock microseconds (every client waited that
     * long; the stalls over 50 ms are the counter loop_stalls). 0 from a
     * daemon that predates it. */
    uint32_t loop_busy_max_us;
    /* How the daemon's pool copies blocks: on cuda, per direction
     * (pool->pool, pool->host, host->pool) the gather kernel or the copy
     * engine and the timings that chose, or why the kernel is not used;
     * "memcpy" on host. NULL from a daemon that predates it. Owned by out:
     * freed by kvs_stats_free. */
    char *copy_path;
    /* One row per device, in rank order (one for a daemon of one device;
     * none from a daemon that predates it), and the cluster tier's nodes
     * (kvshared cluster_seeds) as the daemon's client knows them (none
     * without a cluster tier or from a daemon that predates it). Both owned
     * by out: freed by kvs_stats_free. */
    uint32_t n_devices, n_cluster_nodes;
    kvs_device_stats_t *devices;
    struct kvs_cluster_node *cluster_nodes;
    /* Tier 3 (a local disk, kvshared --disk-tier-path; 0 and NULL without
     * one or from a daemon that predates it): its size and cached blocks,
     * and its I/O engine ("io_uring", "io_uring (unregistered buffers)" or
     * "threads"; owned by out: freed by kvs_stats_free). Its reads and CRC
     * failures are counters below (disk_*). */
    uint32_t tier3_total_blocks, tier3_cached_blocks;
    char *disk_io;
    /* The room kept for gauges is used up: a gauge added later needs the
     * next SOVERSION (common/kvshare_version.h). */
    /* Counters since the daemon started: one uint64_t field per entry of
     * KVS_COUNTERS (kvshare_counters.h: s.evictions, s.alloc_failures, ...),
     * also readable by position as counters[KVS_COUNTER_<name>]. A counter
     * this library or the daemon does not know reads 0. */
    union {
        struct {
            KVS_COUNTERS(KVS__STATS_COUNTER)
        };
        uint64_t counters[KVS_COUNTER_SLOTS];
    };
} kvs_stats_t;

/* The name of counter i (its field in kvs_stats_t, its key in `kvshare stats
 * --json`): a static string, or NULL when i >= KVS_N_COUNTERS of this
 * library. */
const char *kvs_counter_name(size_t i);

/* The daemon's counters. Free out->namespaces with kvs_stats_free. Errors:
 * KVS_ENOMEM, KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_stats(kvs_client_t *c, kvs_stats_t *out);
void kvs_stats_free(kvs_stats_t *s); /* accepts NULL */

typedef struct kvs_prefix {
    char ns[KVS_NS_NAME_MAX];
    uint32_t tokens; /* prefix length */
    uint32_t blocks; /* cached blocks under it, itself included */
    uint32_t pins;
    uint64_t hits;
    uint64_t age_ticks; /* index operations since its last use, vs the newest row */
    uint32_t last_block_id;
    uint32_t tier; /* of its last block: 1 (pool), 2 (host memory), 3 (disk); 0: older daemon */
    uint32_t tier2_blocks; /* of blocks, those in tier 2 */
    /* The prefix this one extends (the node above it in the index): its
     * last_block_id, when has_parent is 1. has_parent is 0 for a prefix that
     * starts at its namespace's root, and from a daemon that predates it. */
    uint32_t parent_block_id;
    uint32_t has_parent;
    uint64_t reserved[2]; /* room for fields added later (0 until then) */
} kvs_prefix_t;

/* Top prefixes of namespace ns (NULL: all) by hits, or by size when by_size.
 * Fills out[0..*n_out), *n_out <= max. Each row is a node of the index's
 * compressed tree: a prefix ending where prompts diverge or stop. A
 * prefix's hits are never fewer than those of a prefix that extends it
 * (ties list the shorter first), and it holds more blocks, so a listing by
 * either order holds every listed prefix's parent too: parent_block_id
 * nests the rows into the tree. kvshared walks its index in steps between
 * other clients' requests: on an index that changes meanwhile, each prefix
 * is as it was when its step ran, and one created or dropped during the
 * walk may be missing or stale (exact on an index that does not change).
 * Errors: KVS_EINVAL, KVS_ENONS, KVS_ENOTCONN, KVS_ETIMEDOUT, KVS_ELIMIT
 * (the walk's memory does not fit kvshared's max_buffer_memory). */
int kvs_tree(kvs_client_t *c, const char *ns, int by_size, kvs_prefix_t *out, size_t max,
             size_t *n_out);

/* One connected client of kvshared (kvs_sessions), as Redis's CLIENT LIST. */
typedef struct kvs_session_info {
    uint64_t id; /* the daemon's session number (its log lines name it) */
    int32_t pid; /* the peer's, from SO_PEERCRED; 0 when unknown */
    uint32_t uid;
    char worker[64]; /* the name it gave when connecting (kvs_options_t.worker_name) */
    /* Namespaces it uses: those of the cached blocks it pins and the
     * dynamic namespaces it created (at most 16; those this client may see). */
    char **namespaces;
    size_t n_namespaces;
    uint32_t pins;        /* distinct blocks it pins */
    uint32_t writing;     /* WRITING blocks it holds (allocated, not committed) */
    uint64_t pins_total;  /* pins it holds, a block pinned twice counted twice */
    uint64_t buffered;    /* bytes in its input and output buffers */
    uint64_t age_s;       /* seconds since it connected */
    uint64_t idle_s;      /* seconds since its last request */
    uint64_t requests;    /* requests it made */
    int held;             /* 1: its next request waits (for blocks others write, ...) */
    char held_for[16];    /* why, when held: "inflight", "tier", "spacing", ... */
    uint64_t reserved[4]; /* room for fields added later (0 until then) */
} kvs_session_info_t;

/* The clients connected to kvshared now, this one included, newest first:
 * *out gets an array of *n rows (NULL when 0) that the caller frees with
 * kvs_sessions_free. Errors: KVS_EINVAL, KVS_ENOMEM, KVS_ENOTCONN,
 * KVS_ETIMEDOUT, KVS_EPROTO (a kvshared that predates Sessions). */
int kvs_sessions(kvs_client_t *c, kvs_session_info_t **out, size_t *n);
void kvs_sessions_free(kvs_session_info_t *s, size_t n); /* accepts NULL */

/* The disk tier's warm restart (kvshared --disk-tier-path on an existing
 * file): kvshared listens at once and serves while it reads the file and
 * puts its blocks back into the index; until then they are misses. */
typedef struct kvs_restore_status {
    char phase[16];       /* "scanning", "restoring", "done", "failed"; "" when none ran
                             (no disk tier, a new file, or a daemon that predates it) */
    uint64_t slots;       /* the file's slots */
    uint64_t scanned;     /* slots read so far */
    uint64_t records;     /* valid records found (0 while scanning) */
    uint64_t restored;    /* blocks back in the index so far */
    uint64_t dropped;     /* records not restored (unreachable, deleted, another identity) */
    uint64_t elapsed_ms;  /* since the daemon started it; to its end once ended */
    uint64_t reserved[4]; /* room for fields added later (0 until then) */
} kvs_restore_status_t;

/* Where the warm restart stands (from Stats). Errors: KVS_EINVAL,
 * KVS_ENOMEM, KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_restore_status(kvs_client_t *c, kvs_restore_status_t *out);

/* One round trip with `payload_bytes` bytes each way; *rtt_us (may be NULL)
 * gets its duration in microseconds. Errors: KVS_ENOTCONN, KVS_ETIMEDOUT. */
int kvs_ping(kvs_client_t *c, size_t payload_bytes, double *rtt_us);

#ifdef __cplusplus
}
#endif

#endif /* KVSHARE_H */
