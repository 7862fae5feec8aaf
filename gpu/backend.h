/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend: the memory of the KV pool, and how another process maps it.
 *
 *   host: one memfd (sealed against shrinking) mapped shared; workers get the
 *         fd and mmap it.
 *   cuda: the CUDA driver API loaded at run time (dlopen "libcuda.so.1"); a
 *         few cuMemCreate slabs with the POSIX-fd handle type, rounded to the
 *         allocation granularity. Each export makes new fds
 *         (cuMemExportToShareableHandle); the importer reserves one virtual
 *         range, maps every slab into it in order, sets access, closes the fds.
 *         Slabs are about 16 GiB; KVS_CUDA_SLAB_BYTES (a multiple of the
 *         allocation granularity) overrides that, so that tests make many
 *         slabs of a small pool. Every cuda entry point leaves the calling
 *         thread's current CUDA context as it found it, and copies wait for
 *         the backend's own stream only, never for the application's work.
 *
 * The pool is one virtual range of backend_size() bytes made of n slabs; a
 * block's bytes are at the geometry_offset() of geometry.h from its base.
 * Sizing: open with bytes = the pool a geometry_plan() gives for the budget,
 * or (cuda) with mem_fraction and round_bytes = the block size; then the pool
 * holds min(backend_size() / block_bytes, UINT32_MAX) blocks, since
 * backend_size() may exceed what was asked (rounded up to the page size or
 * the allocation granularity) but never falls short of it.
 * Errors carry a message naming the cause and the fix, written into the
 * caller's buffer (err, errlen); the library never logs.
 */
#ifndef KVS_BACKEND_H
#define KVS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "geometry.h"
#include "kvshare_status.h"

typedef enum backend_kind {
    BACKEND_AUTO = 0, /* cuda when a device answers, else host */
    BACKEND_HOST = 1,
    BACKEND_CUDA = 2,
} backend_kind_t;

#define BACKEND_MAX_SLABS 64
#define BACKEND_UUID_LEN  16

typedef struct backend backend_t;

typedef struct backend_config {
    backend_kind_t kind;
    int device;           /* cuda device ordinal (default 0) */
    uint64_t bytes;       /* pool size; 0: use mem_fraction (cuda only) */
    double mem_fraction;  /* of the device's free memory, e.g. 0.9 */
    uint64_t round_bytes; /* with mem_fraction: the size is rounded down to a
                             multiple of this (the block size) */
} backend_config_t;

/* What an importer needs besides the fds: sent in the Hello reply. */
typedef struct backend_desc {
    backend_kind_t kind;
    uint8_t device_uuid[BACKEND_UUID_LEN]; /* cuda: the device; host: zero */
    uint64_t size;                         /* bytes of the whole range */
    uint32_t n_slabs;
    uint64_t slab_bytes[BACKEND_MAX_SLABS];
} backend_desc_t;

/* Parses "auto", "host", "cuda". Errors: KVS_EINVAL. */
int backend_kind_parse(const char *name, backend_kind_t *out);
const char *backend_kind_name(backend_kind_t kind);

/* Creates the pool memory. With BACKEND_AUTO, cuda is tried first and host is
 * used when no device answers (no driver, no device, or a build without
 * CUDA; backend_detail() then says why); a device that answers but cannot
 * serve (no VMM / POSIX-fd support, too little memory) is an error even for
 * auto, and so is anything failing for an explicit BACKEND_CUDA. On success
 * *out is owned by the caller (backend_close); on failure it is untouched. Errors (message in err):
 * KVS_ENODRIVER, KVS_ENODEV, KVS_ENOTSUP (no VMM / POSIX-fd support, a compute mode other than
 * DEFAULT, or cuda not built), KVS_ENOMEM (the asked size does not fit: it may fit once
 * another process lets go of device memory), KVS_EINVAL, KVS_EIO (also a driver that is
 * installed but not ready: cuInit's 802-804). */
int backend_open(const backend_config_t *cfg, backend_t **out, char *err, size_t errlen);

/* Frees the memory (importers keep their mappings). Accepts NULL. */
void backend_close(backend_t *b);

backend_kind_t backend_kind(const backend_t *b);
uint64_t backend_size(const backend_t *b);
void backend_describe(const backend_t *b, backend_desc_t *out);

/* The daemon's own mapping: host pointer for host; device pointer (as an
 * integer) for cuda. */
uintptr_t backend_base(const backend_t *b);

/* Makes new fds for one importer, one per slab, in slab order; the caller
 * sends them and closes them. Errors (message in err, with the driver's
 * error name for cuda): KVS_EIO, KVS_EINVAL (max too small). */
int backend_export(backend_t *b, int *fds, size_t max, size_t *n_fds, char *err, size_t errlen);

/* Importer side. Maps the slabs given by desc and fds (the fds are consumed:
 * closed on success and on failure) into one range. The mapping belongs to
 * this process: in a child forked after the import, backend_unmap frees it
 * without driver calls (CUDA does not survive fork) and copies through it
 * fail with KVS_EIO. backend_unmap waits until device work that reads the
 * range is done (cuMemUnmap synchronizes). */
typedef struct backend_mapping backend_mapping_t;
int backend_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                   backend_mapping_t **out, char *err, size_t errlen);
uintptr_t backend_mapping_base(const backend_mapping_t *m);
void backend_unmap(backend_mapping_t *m); /* accepts NULL */

/* Copies n_bytes inside the pool from offset src to offset dst (device to
 * device for cuda, memcpy for host), for block forks and tiers. Errors:
 * KVS_EINVAL (out of range; on cuda also overlapping ranges), KVS_EIO. */
int backend_copy(backend_t *b, uint64_t dst, uint64_t src, uint64_t n_bytes);

/* --- Additions beyond the first contract ----------------------------------- */

/* A line describing what backend_open chose, for the daemon's log, e.g.
 * "host memfd, 1073741824 B (cuda not used: libcuda.so.1 not found: ...)" or
 * "cuda device 0 (NVIDIA H200, GPU-...), 3 slabs, 2097152 B granularity".
 * Owned by b, valid until backend_close. */
const char *backend_detail(const backend_t *b);

/* Whether the cuda backend could start on device: driver loaded, device
 * present, VMM and POSIX-fd handles supported. Creates no pool, but does
 * initialise the driver in this process (so a process that must fork
 * afterwards should probe in a child). Errors (reason in err): as
 * backend_open's cuda errors. */
int backend_cuda_probe(int device, char *err, size_t errlen);

/* Copies n_bytes between the caller's memory and the pool at offset (device
 * memory for cuda, through the driver), for tests, tools and zeroing. Returns
 * when the copy is done. Errors: KVS_EINVAL (out of range), KVS_EIO. */
int backend_write(backend_t *b, uint64_t offset, const void *src, uint64_t n_bytes);
int backend_read(backend_t *b, uint64_t offset, void *dst, uint64_t n_bytes);

/* The same through an importer's mapping. */
uint64_t backend_mapping_size(const backend_mapping_t *m);
int backend_mapping_write(backend_mapping_t *m, uint64_t offset, const void *src, uint64_t n_bytes);
int backend_mapping_read(backend_mapping_t *m, uint64_t offset, void *dst, uint64_t n_bytes);

/* Copies block src_block to dst_block in a pool laid out by geometry.h for
 * num_blocks blocks: the K and V slots of every layer (2 x layers copies of
 * slot_bytes, one strided copy on cuda where the pitch allows). Returns when
 * the copy is done. Errors: KVS_EINVAL (bad geometry, a block out of range,
 * or the layout larger than the pool), KVS_EIO. */
int backend_copy_block(backend_t *b, const geometry_t *g, uint32_t num_blocks, uint32_t dst_block,
                       uint32_t src_block);

/* Batches, for tiers and benchmarks: n copies issued back to back (on cuda,
 * on the backend's private stream) and waited for once. backend_copy_blocks
 * copies src_blocks[i] to dst_blocks[i] as backend_copy_block does;
 * backend_copy_many copies n_bytes from offset src[i] to dst[i], ranges that
 * must not overlap. device_ms (may be NULL) receives the time the copies took
 * on the device, from the first one's start to the last one's end (CUDA
 * events on the stream; the host clock on host). Everything is checked before
 * anything is copied. Errors: as backend_copy_block and backend_copy, and
 * KVS_EINVAL for overlapping ranges. */
int backend_copy_blocks(backend_t *b, const geometry_t *g, uint32_t num_blocks,
                        const uint32_t *dst_blocks, const uint32_t *src_blocks, size_t n,
                        double *device_ms);
int backend_copy_many(backend_t *b, const uint64_t *dst, const uint64_t *src, uint64_t n_bytes,
                      size_t n, double *device_ms);

/* How the last backend_copy_block copied: "cuMemcpy2DAsync", "cuMemcpyDtoDAsync
 * per row" (the driver refused the pool's pitch for a 2D copy), "none yet",
 * or "memcpy per row" (host). Static string. */
const char *backend_copy_block_path(const backend_t *b);

/* --- Copy kernel or copy engine (cuda) ---------------------------------------- */

/* On cuda, batches (backend_copy_blocks, backend_copy_many, backend_tier_copy,
 * backend_copy_block) go either through the copy engine (cuMemcpy*Async per
 * piece) or through one launch of a gather kernel that copies every piece of
 * the batch (gather.h; tier-2 memory is mapped for it). The kernel is built
 * into the library when nvcc was found at build time and loaded at
 * backend_open; where it cannot load (no code for this GPU, an old driver)
 * the engine serves and backend_detail says why. Under BACKEND_COPY_AUTO
 * (the default; the environment variable KVS_CUDA_COPY=engine|kernel
 * overrides it at open) the first batch of at least 64 pieces in each
 * direction (pool->pool, pool->host, host->pool) runs both ways, timed, and
 * the faster serves that direction from then on; until then the engine. */
typedef enum backend_copy_mode {
    BACKEND_COPY_AUTO = 0,
    BACKEND_COPY_ENGINE = 1,
    BACKEND_COPY_KERNEL = 2,
} backend_copy_mode_t;

/* Sets how b's batches copy, for benchmarks and tests. Errors: KVS_EINVAL
 * (no backend, unknown mode), KVS_ENOTSUP (the kernel asked for where it is
 * not loaded, or a host backend asked for anything but AUTO or ENGINE). */
int backend_copy_mode_set(backend_t *b, backend_copy_mode_t mode);

/* Writes one line saying what b copies with, into buf (always terminated,
 * cut to len), e.g. "pool->pool kernel (kernel 0.412 ms, engine 0.553 ms);
 * pool->host not measured yet (copy engine); ...; batches: 3 kernel, 9 copy
 * engine", or "copy engine (kernel not used: built without nvcc); ...";
 * host: "memcpy". */
void backend_copy_describe(const backend_t *b, char *buf, size_t len);

/* --- Tier 2: host memory next to the pool ---------------------------------- */

/* Gives b a tier 2 of at least bytes (rounded up to the page size) in host
 * memory: a memfd sealed like the host pool and mapped shared, then sealed
 * with F_SEAL_FUTURE_WRITE (no write, no writable mapping from any fd but
 * this first mapping: workers only read it); on cuda also
 * registered with the driver (cuMemHostRegister) so that copies between the
 * tiers are DMA. Tier-2 blocks are laid out as in the pool, by
 * geometry_offset with the tier's block count. Importers map it from
 * backend_tier_export's fd and backend_tier_describe's desc with
 * backend_import (a host mapping). Once per backend; closed with it.
 * Errors (message in err): KVS_EINVAL (bytes 0, already open), KVS_ENOMEM,
 * KVS_EIO (on cuda also a registration the driver refuses). */
int backend_tier_open(backend_t *b, uint64_t bytes, char *err, size_t errlen);

/* NUMA facts from sysfs (`sysfs` is "/sys", or a test's copy of its
 * layout): the nodes online (node/online, e.g. "0-1"; 1 when it cannot
 * tell), and the node of PCI device domain:bus:device.0 (-1: none or
 * unknown). */
int backend_numa_nodes(const char *sysfs);
int backend_pci_numa_node(const char *sysfs, int domain, int bus, int device);
uint64_t backend_tier_size(const backend_t *b); /* 0: no tier 2 */
/* The NUMA node tier 2's memory was placed on: on cuda with several nodes
 * online, the device's own (from its PCI address in sysfs), before the
 * memory is touched; -1 when it was not placed (one node, the host backend,
 * a device whose node sysfs does not tell, or a kernel that refuses). */
int backend_tier_numa_node(const backend_t *b);
uintptr_t backend_tier_base(const backend_t *b); /* the daemon's host pointer */
void backend_tier_describe(const backend_t *b, backend_desc_t *out);
int backend_tier_export(backend_t *b, int *fd, char *err, size_t errlen);

/* For workers that read tier 2 themselves: *fd gets the tier-2 memfd opened
 * again read-only (through /proc/self/fd), so that no mapping of it can be
 * made writable. Errors (message in err): KVS_EINVAL (no tier 2), KVS_EIO
 * (the system cannot reopen it: no /proc; the caller may fall back to
 * backend_tier_export). */
int backend_tier_export_readonly(backend_t *b, int *fd, char *err, size_t errlen);

/* Importer side of tier 2 for a reader: maps the first bytes of the memfd fd
 * (consumed: closed on success and on failure) read-only (PROT_READ,
 * shared): a host mapping whose backend_mapping_read works and whose
 * backend_mapping_write fails with KVS_EINVAL. The fd must be a memfd sealed
 * against shrinking, of at least bytes. Errors (message in err): KVS_EINVAL,
 * KVS_ENOMEM, KVS_EIO. Freed with backend_unmap. */
int backend_tier_import(int fd, uint64_t bytes, backend_mapping_t **out, char *err, size_t errlen);

typedef enum backend_tier_dir {
    BACKEND_TO_TIER = 0,   /* pool -> tier 2 (demotion) */
    BACKEND_FROM_TIER = 1, /* tier 2 -> pool (promotion) */
} backend_tier_dir_t;

/* Copies n blocks between the pool (pool_blocks blocks) and tier 2
 * (tier_blocks blocks): pool_ids[i] <-> tier_ids[i] in direction dir, every
 * layer's K and V slot, issued back to back and waited for once (on cuda on
 * the backend's stream, host <-> device; on host with memcpy). device_ms as
 * backend_copy_blocks. Any thread may call it; cuda copies of one backend
 * take turns. Errors: KVS_EINVAL (no tier 2, bad geometry, an id out of
 * range, a layout larger than its tier), KVS_ENOMEM, KVS_EIO. */
int backend_tier_copy(backend_t *b, const geometry_t *g, uint32_t pool_blocks, uint32_t tier_blocks,
                      backend_tier_dir_t dir, const uint32_t *pool_ids, const uint32_t *tier_ids,
                      size_t n, double *device_ms);

#endif /* KVS_BACKEND_H */
