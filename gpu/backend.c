/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The backend-independent half: names, the auto choice, range checks, and
 * dispatch to backend_host.c and backend_cuda.c.
 */
#include "backend_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const char *const kind_names[] = {
    [BACKEND_AUTO] = "auto",
    [BACKEND_HOST] = "host",
    [BACKEND_CUDA] = "cuda",
};

void backend_errorf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int backend_kind_parse(const char *name, backend_kind_t *out)
{
    if (name == NULL || out == NULL)
        return KVS_EINVAL;
    for (size_t i = 0; i < sizeof(kind_names) / sizeof(kind_names[0]); i++) {
        if (strcasecmp(name, kind_names[i]) == 0) {
            *out = (backend_kind_t)i;
            return 0;
        }
    }
    return KVS_EINVAL;
}

const char *backend_kind_name(backend_kind_t kind)
{
    if ((unsigned)kind >= sizeof(kind_names) / sizeof(kind_names[0]))
        return NULL;
    return kind_names[kind];
}

/* With BACKEND_AUTO, these cuda failures mean "no device answers": use host.
 * A device that answers but cannot serve (no VMM, too little memory) is an
 * error even under auto: silently running a GPU node on host memory would
 * hide the problem. So is a driver that is there but not ready (cuInit's
 * 802-804: the fabric manager not running, a driver mismatch): KVS_EIO. */
static int auto_falls_back(int rc)
{
    return rc == KVS_ENODRIVER || rc == KVS_ENODEV || (rc == KVS_ENOTSUP && !backend_cuda_built());
}

int backend_open(const backend_config_t *cfg, backend_t **out, char *err, size_t errlen)
{
    backend_t *b = NULL;
    int rc = KVS_EINVAL;
    char why[512] = "";
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (cfg == NULL || out == NULL) {
        backend_errorf(err, errlen, "backend_open: no config or no output pointer");
        goto fail;
    }
    if ((unsigned)cfg->kind > BACKEND_CUDA) {
        backend_errorf(err, errlen, "unknown backend kind %d: use auto, host or cuda",
                       (int)cfg->kind);
        goto fail;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        rc = KVS_ENOMEM;
        backend_errorf(err, errlen, "out of memory allocating the backend");
        goto fail;
    }
    b->host_fd = -1;
    b->tier_fd = -1;
    if (cfg->kind == BACKEND_CUDA || cfg->kind == BACKEND_AUTO) {
        rc = backend_cuda_open(cfg, b, why, sizeof(why));
        if (rc == 0)
            goto done;
        if (cfg->kind == BACKEND_CUDA || !auto_falls_back(rc)) {
            backend_errorf(err, errlen, "%s", why);
            goto fail;
        }
    }
    rc = backend_host_open(cfg, b, err, errlen);
    if (rc != 0)
        goto fail;
    if (cfg->kind == BACKEND_AUTO) {
        size_t used = strlen(b->detail);
        snprintf(b->detail + used, sizeof(b->detail) - used, " (cuda not used: %s)", why);
    }
done:
    *out = b;
    return 0;
fail:
    free(b);
    return rc;
}

/* Unregisters (cuda), unmaps and closes tier 2, before the pool goes. */
static void tier_close(backend_t *b)
{
    if (b->tier_registered)
        backend_cuda_host_unregister(b->cuda, (void *)b->tier_base);
    if (b->tier_base != 0)
        munmap((void *)b->tier_base, b->tier_size);
    if (b->tier_fd >= 0)
        close(b->tier_fd);
    b->tier_registered = 0;
    b->tier_numa = 0;
    b->tier_base = 0;
    b->tier_size = 0;
    b->tier_fd = -1;
}

void backend_close(backend_t *b)
{
    if (b == NULL)
        return;
    tier_close(b);
    if (b->kind == BACKEND_CUDA)
        backend_cuda_close(b);
    else
        backend_host_close(b);
    free(b);
}

backend_kind_t backend_kind(const backend_t *b)
{
    return b->kind;
}

uint64_t backend_size(const backend_t *b)
{
    return b->size;
}

void backend_describe(const backend_t *b, backend_desc_t *out)
{
    *out = b->desc;
}

uintptr_t backend_base(const backend_t *b)
{
    return b->base;
}

const char *backend_detail(const backend_t *b)
{
    return b->detail;
}

int backend_export(backend_t *b, int *fds, size_t max, size_t *n_fds, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (b == NULL || fds == NULL || n_fds == NULL || max < b->desc.n_slabs) {
        backend_errorf(err, errlen, "backend_export: no pool, no room for its %u fds, or no output",
                       b != NULL ? b->desc.n_slabs : 0);
        return KVS_EINVAL;
    }
    if (b->kind == BACKEND_CUDA)
        return backend_cuda_export(b, fds, max, n_fds, err, errlen);
    return backend_host_export(b, fds, max, n_fds, err, errlen);
}

static void close_fds(const int *fds, size_t n_fds)
{
    for (size_t i = 0; fds != NULL && i < n_fds; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* The descriptor comes from another process: check it before trusting it. */
static int desc_check(const backend_desc_t *desc, size_t n_fds, char *err, size_t errlen)
{
    if (desc->n_slabs == 0 || desc->n_slabs > BACKEND_MAX_SLABS || n_fds != desc->n_slabs) {
        backend_errorf(err, errlen, "pool descriptor names %u slabs but %zu fds came with it",
                       desc->n_slabs, n_fds);
        return KVS_EINVAL;
    }
    uint64_t sum = 0;
    for (uint32_t i = 0; i < desc->n_slabs; i++) {
        if (desc->slab_bytes[i] == 0 || desc->slab_bytes[i] > UINT64_MAX - sum) {
            backend_errorf(err, errlen, "pool descriptor: slab %u has a bad size", i);
            return KVS_EINVAL;
        }
        sum += desc->slab_bytes[i];
    }
    if (sum != desc->size) {
        backend_errorf(err, errlen, "pool descriptor: slabs add up to %llu bytes, the pool is %llu",
                       (unsigned long long)sum, (unsigned long long)desc->size);
        return KVS_EINVAL;
    }
    return 0;
}

int backend_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                   backend_mapping_t **out, char *err, size_t errlen)
{
    backend_mapping_t *m = NULL;
    int rc = KVS_EINVAL;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (desc == NULL || fds == NULL || out == NULL) {
        backend_errorf(err, errlen, "backend_import: missing descriptor, fds or output");
        goto fail;
    }
    rc = desc_check(desc, n_fds, err, errlen);
    if (rc != 0)
        goto fail;
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        rc = KVS_ENOMEM;
        backend_errorf(err, errlen, "out of memory allocating the mapping");
        goto fail;
    }
    /* Each import function consumes the fds, on success and on failure. */
    switch (desc->kind) {
    case BACKEND_HOST:
        rc = backend_host_import(desc, fds, n_fds, m, err, errlen);
        break;
    case BACKEND_CUDA:
        rc = backend_cuda_import(desc, fds, n_fds, m, err, errlen);
        break;
    default:
        close_fds(fds, n_fds);
        backend_errorf(err, errlen, "pool descriptor has unknown backend kind %d", (int)desc->kind);
        rc = KVS_EINVAL;
    }
    if (rc != 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
fail:
    if (fds != NULL)
        close_fds(fds, n_fds);
    return rc;
}

uintptr_t backend_mapping_base(const backend_mapping_t *m)
{
    return m->base;
}

uint64_t backend_mapping_size(const backend_mapping_t *m)
{
    return m->size;
}

void backend_unmap(backend_mapping_t *m)
{
    if (m == NULL)
        return;
    if (m->kind == BACKEND_CUDA)
        backend_cuda_unmap(m);
    else
        backend_host_unmap(m);
    free(m);
}

static int in_range(uint64_t size, uint64_t offset, uint64_t n)
{
    return offset <= size && n <= size - offset;
}

int backend_copy(backend_t *b, uint64_t dst, uint64_t src, uint64_t n_bytes)
{
    if (b == NULL || !in_range(b->size, dst, n_bytes) || !in_range(b->size, src, n_bytes))
        return KVS_EINVAL;
    if (n_bytes == 0 || dst == src)
        return 0;
    if (b->kind == BACKEND_CUDA) {
        uint64_t gap = dst > src ? dst - src : src - dst;
        if (gap < n_bytes)
            return KVS_EINVAL;
        return backend_cuda_dtod(b->cuda, b->base + dst, b->base + src, n_bytes);
    }
    memmove((char *)b->base + dst, (const char *)b->base + src, n_bytes);
    return 0;
}

static int copy_in(backend_kind_t kind, struct backend_cuda *c, uintptr_t base, uint64_t size,
                   uint64_t offset, const void *src, uint64_t n)
{
    if (src == NULL || !in_range(size, offset, n))
        return KVS_EINVAL;
    if (n == 0)
        return 0;
    if (kind == BACKEND_CUDA)
        return backend_cuda_htod(c, base + offset, src, n);
    memcpy((char *)base + offset, src, n);
    return 0;
}

static int copy_out(backend_kind_t kind, struct backend_cuda *c, uintptr_t base, uint64_t size,
                    uint64_t offset, void *dst, uint64_t n)
{
    if (dst == NULL || !in_range(size, offset, n))
        return KVS_EINVAL;
    if (n == 0)
        return 0;
    if (kind == BACKEND_CUDA)
        return backend_cuda_dtoh(c, dst, base + offset, n);
    memcpy(dst, (const char *)base + offset, n);
    return 0;
}

int backend_write(backend_t *b, uint64_t offset, const void *src, uint64_t n_bytes)
{
    if (b == NULL)
        return KVS_EINVAL;
    return copy_in(b->kind, b->cuda, b->base, b->size, offset, src, n_bytes);
}

int backend_read(backend_t *b, uint64_t offset, void *dst, uint64_t n_bytes)
{
    if (b == NULL)
        return KVS_EINVAL;
    return copy_out(b->kind, b->cuda, b->base, b->size, offset, dst, n_bytes);
}

int backend_mapping_write(backend_mapping_t *m, uint64_t offset, const void *src, uint64_t n_bytes)
{
    if (m == NULL || m->read_only)
        return KVS_EINVAL;
    return copy_in(m->kind, m->cuda, m->base, m->size, offset, src, n_bytes);
}

int backend_mapping_read(backend_mapping_t *m, uint64_t offset, void *dst, uint64_t n_bytes)
{
    if (m == NULL)
        return KVS_EINVAL;
    return copy_out(m->kind, m->cuda, m->base, m->size, offset, dst, n_bytes);
}

const char *backend_copy_block_path(const backend_t *b)
{
    return b->kind == BACKEND_CUDA ? backend_cuda_copy_path(b->cuda) : "memcpy per row";
}

int backend_copy_block(backend_t *b, const geometry_t *g, uint32_t num_blocks, uint32_t dst_block,
                       uint32_t src_block)
{
    if (b == NULL || geometry_validate(g) != 0 || num_blocks == 0 || dst_block >= num_blocks ||
        src_block >= num_blocks)
        return KVS_EINVAL;
    uint64_t slot = geometry_slot_bytes(g);
    uint64_t rows = 2ull * g->layers;
    /* The whole layout must lie inside the pool; dividing avoids overflow. */
    if (b->size / slot / num_blocks < rows)
        return KVS_EINVAL;
    if (dst_block == src_block)
        return 0;
    uint64_t pitch = (uint64_t)num_blocks * slot;
    uint64_t dst = geometry_offset(g, num_blocks, 0, 0, dst_block);
    uint64_t src = geometry_offset(g, num_blocks, 0, 0, src_block);
    if (b->kind == BACKEND_CUDA)
        return backend_cuda_dtod_2d(b->cuda, b->base + dst, b->base + src, slot, rows, pitch);
    for (uint64_t r = 0; r < rows; r++)
        memcpy((char *)b->base + dst + r * pitch, (const char *)b->base + src + r * pitch, slot);
    return 0;
}

int backend_copy_mode_set(backend_t *b, backend_copy_mode_t mode)
{
    if (b == NULL || (unsigned)mode > BACKEND_COPY_KERNEL)
        return KVS_EINVAL;
    if (b->kind == BACKEND_CUDA)
        return backend_cuda_copy_mode_set(b->cuda, mode);
    return mode == BACKEND_COPY_KERNEL ? KVS_ENOTSUP : 0;
}

void backend_copy_describe(const backend_t *b, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    if (b != NULL && b->kind == BACKEND_CUDA)
        backend_cuda_copy_describe(b->cuda, buf, len);
    else
        snprintf(buf, len, "memcpy");
}

static double host_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Runs n checked copies on absolute addresses: on cuda as one batch on the
 * stream, on host with memcpy, row by row. */
static int copy_ops(backend_t *b, const backend_copy_op_t *ops, size_t n, double *device_ms)
{
    if (b->kind == BACKEND_CUDA)
        return backend_cuda_copy_batch(b->cuda, ops, n, device_ms);
    double t0 = host_ms();
    for (size_t i = 0; i < n; i++)
        for (uint64_t r = 0; r < ops[i].height; r++)
            memcpy((char *)ops[i].dst + r * ops[i].dst_pitch,
                   (const char *)ops[i].src + r * ops[i].src_pitch, ops[i].width);
    if (device_ms != NULL)
        *device_ms = host_ms() - t0;
    return 0;
}

int backend_copy_blocks(backend_t *b, const geometry_t *g, uint32_t num_blocks,
                        const uint32_t *dst_blocks, const uint32_t *src_blocks, size_t n,
                        double *device_ms)
{
    if (b == NULL || geometry_validate(g) != 0 || num_blocks == 0 || n == 0 || dst_blocks == NULL ||
        src_blocks == NULL)
        return KVS_EINVAL;
    uint64_t slot = geometry_slot_bytes(g);
    uint64_t rows = 2ull * g->layers;
    if (b->size / slot / num_blocks < rows)
        return KVS_EINVAL;
    backend_copy_op_t *ops = calloc(n, sizeof(*ops));
    if (ops == NULL)
        return KVS_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (dst_blocks[i] >= num_blocks || src_blocks[i] >= num_blocks ||
            dst_blocks[i] == src_blocks[i]) {
            rc = KVS_EINVAL;
            break;
        }
        ops[i] = (backend_copy_op_t){
            .dst = b->base + geometry_offset(g, num_blocks, 0, 0, dst_blocks[i]),
            .src = b->base + geometry_offset(g, num_blocks, 0, 0, src_blocks[i]),
            .width = slot,
            .height = rows,
            .dst_pitch = (uint64_t)num_blocks * slot,
            .src_pitch = (uint64_t)num_blocks * slot,
        };
    }
    if (rc == 0)
        rc = copy_ops(b, ops, n, device_ms);
    free(ops);
    return rc;
}

int backend_copy_many(backend_t *b, const uint64_t *dst, const uint64_t *src, uint64_t n_bytes,
                      size_t n, double *device_ms)
{
    if (b == NULL || dst == NULL || src == NULL || n == 0 || n_bytes == 0)
        return KVS_EINVAL;
    backend_copy_op_t *ops = calloc(n, sizeof(*ops));
    if (ops == NULL)
        return KVS_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t gap = dst[i] > src[i] ? dst[i] - src[i] : src[i] - dst[i];
        if (!in_range(b->size, dst[i], n_bytes) || !in_range(b->size, src[i], n_bytes) ||
            gap < n_bytes) {
            rc = KVS_EINVAL;
            break;
        }
        ops[i] = (backend_copy_op_t){.dst = b->base + dst[i],
                                     .src = b->base + src[i],
                                     .width = n_bytes,
                                     .height = 1,
                                     .dst_pitch = n_bytes,
                                     .src_pitch = n_bytes};
    }
    if (rc == 0)
        rc = copy_ops(b, ops, n, device_ms);
    free(ops);
    return rc;
}

/* --- Tier 2 ------------------------------------------------------------------ */

/* Reads the first line of a small file; 0 or -1. */
static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *got = fgets(buf, (int)len, f);
    fclose(f);
    return got ? 0 : -1;
}

int backend_numa_nodes(const char *sysfs)
{
    char path[512], line[256];
    snprintf(path, sizeof(path), "%s/devices/system/node/online", sysfs);
    if (read_line(path, line, sizeof(line)) != 0)
        return 1;
    /* A list of ranges: "0", "0-1", "0,2-3". */
    int n = 0;
    for (char *p = line; *p && *p != '\n';) {
        char *end;
        long lo = strtol(p, &end, 10), hi = lo;
        if (end == p)
            return n > 0 ? n : 1;
        if (*end == '-') {
            p = end + 1;
            hi = strtol(p, &end, 10);
            if (end == p || hi < lo)
                return n > 0 ? n : 1;
        }
        n += (int)(hi - lo + 1);
        p = *end == ',' ? end + 1 : end;
    }
    return n > 0 ? n : 1;
}

int backend_pci_numa_node(const char *sysfs, int domain, int bus, int device)
{
    char path[512], line[64];
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%04x:%02x:%02x.0/numa_node", sysfs, domain,
             bus, device);
    if (read_line(path, line, sizeof(line)) != 0)
        return -1;
    char *end;
    long node = strtol(line, &end, 10);
    return end == line || node < 0 || node > 1023 ? -1 : (int)node;
}

/* Tier 2's host memory on the device's NUMA node, where the machine has
 * several: copies between the device and its tier then cross no socket
 * link. A preference, not a binding: a full node lends pages from another
 * rather than fail. Before any page is touched (the driver's registration
 * pins them where they are). The mbind system call, not libnuma: one call
 * (and two sysfs files) is all this needs, and libkvshare.a, which carries
 * this module, keeps its users' link line free of -lnuma. */
static void tier_place(backend_t *b)
{
    int domain, bus, device;
    if (b->kind != BACKEND_CUDA || backend_numa_nodes("/sys") < 2 ||
        backend_cuda_pci(b->cuda, &domain, &bus, &device) != 0)
        return;
    int node = backend_pci_numa_node("/sys", domain, bus, device);
    if (node < 0 || node >= 64)
        return;
    unsigned long mask = 1UL << node;
    if (syscall(SYS_mbind, (void *)b->tier_base, (unsigned long)b->tier_size, MPOL_PREFERRED, &mask,
                65UL, 0U) == 0)
        b->tier_numa = node + 1;
}

int backend_tier_numa_node(const backend_t *b)
{
    return b ? b->tier_numa - 1 : -1;
}

int backend_tier_open(backend_t *b, uint64_t bytes, char *err, size_t errlen)
{
    if (b == NULL || bytes == 0 || b->tier_base != 0) {
        backend_errorf(err, errlen, "tier 2 needs a backend without one and a size above 0");
        return KVS_EINVAL;
    }
    /* Workers only read tier 2, and a read-only fd can be reopened
     * read-write through /proc/<pid>/fd by whoever holds it (a memfd's mode
     * lets them): F_SEAL_FUTURE_WRITE refuses every write and writable
     * mapping after it, whatever the fd, while the daemon's own mapping,
     * made before it, keeps writing the copies. */
    int rc = backend_host_memfd("kvshare-tier2", bytes, F_SEAL_FUTURE_WRITE, &b->tier_fd,
                                &b->tier_base, &b->tier_size, err, errlen);
    if (rc != 0)
        return rc;
    tier_place(b);
    if (b->kind == BACKEND_CUDA) {
        rc = backend_cuda_host_register(b->cuda, (void *)b->tier_base, b->tier_size, err, errlen);
        if (rc != 0) {
            tier_close(b);
            return rc;
        }
        b->tier_registered = 1;
    }
    return 0;
}

uint64_t backend_tier_size(const backend_t *b)
{
    return b->tier_size;
}

uintptr_t backend_tier_base(const backend_t *b)
{
    return b->tier_base;
}

void backend_tier_describe(const backend_t *b, backend_desc_t *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = BACKEND_HOST;
    out->size = b->tier_size;
    out->n_slabs = b->tier_size != 0 ? 1 : 0;
    out->slab_bytes[0] = b->tier_size;
}

int backend_tier_export(backend_t *b, int *fd, char *err, size_t errlen)
{
    if (b == NULL || fd == NULL || b->tier_fd < 0) {
        backend_errorf(err, errlen, "no tier 2 to export");
        return KVS_EINVAL;
    }
    int dup = fcntl(b->tier_fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) {
        backend_errorf(err, errlen, "duplicating the tier-2 memfd failed: %s", strerror(errno));
        return KVS_EIO;
    }
    *fd = dup;
    return 0;
}

int backend_tier_export_readonly(backend_t *b, int *fd, char *err, size_t errlen)
{
    if (b == NULL || fd == NULL || b->tier_fd < 0) {
        backend_errorf(err, errlen, "no tier 2 to export");
        return KVS_EINVAL;
    }
    /* A new open file description: its mode, not the daemon's, decides
     * what a mapping of it may become (mprotect cannot add PROT_WRITE). */
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", b->tier_fd);
    int ro = open(path, O_RDONLY | O_CLOEXEC);
    if (ro < 0) {
        backend_errorf(err, errlen, "reopening the tier-2 memfd read-only (%s) failed: %s", path,
                       strerror(errno));
        return KVS_EIO;
    }
    *fd = ro;
    return 0;
}

int backend_tier_import(int fd, uint64_t bytes, backend_mapping_t **out, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (out == NULL || fd < 0) {
        if (fd >= 0)
            close(fd);
        backend_errorf(err, errlen, "backend_tier_import: missing fd or output");
        return KVS_EINVAL;
    }
    backend_mapping_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        close(fd);
        backend_errorf(err, errlen, "out of memory allocating the mapping");
        return KVS_ENOMEM;
    }
    int rc = backend_host_import_readonly(fd, bytes, m, err, errlen);
    if (rc != 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int backend_tier_copy(backend_t *b, const geometry_t *g, uint32_t pool_blocks, uint32_t tier_blocks,
                      backend_tier_dir_t dir, const uint32_t *pool_ids, const uint32_t *tier_ids,
                      size_t n, double *device_ms)
{
    if (b == NULL || b->tier_base == 0 || geometry_validate(g) != 0 || pool_blocks == 0 ||
        tier_blocks == 0 || n == 0 || pool_ids == NULL || tier_ids == NULL ||
        (dir != BACKEND_TO_TIER && dir != BACKEND_FROM_TIER))
        return KVS_EINVAL;
    uint64_t slot = geometry_slot_bytes(g);
    uint64_t rows = 2ull * g->layers;
    if (b->size / slot / pool_blocks < rows || b->tier_size / slot / tier_blocks < rows)
        return KVS_EINVAL;
    backend_copy_op_t *ops = calloc(n, sizeof(*ops));
    if (ops == NULL)
        return KVS_ENOMEM;
    int rc = 0;
    int to_tier = dir == BACKEND_TO_TIER;
    uint8_t tier_host = b->kind == BACKEND_CUDA; /* host memory seen from the device */
    for (size_t i = 0; i < n; i++) {
        if (pool_ids[i] >= pool_blocks || tier_ids[i] >= tier_blocks) {
            rc = KVS_EINVAL;
            break;
        }
        uintptr_t pool = b->base + geometry_offset(g, pool_blocks, 0, 0, pool_ids[i]);
        uintptr_t tier = b->tier_base + geometry_offset(g, tier_blocks, 0, 0, tier_ids[i]);
        uint64_t pool_pitch = (uint64_t)pool_blocks * slot;
        uint64_t tier_pitch = (uint64_t)tier_blocks * slot;
        ops[i] = (backend_copy_op_t){
            .dst = to_tier ? tier : pool,
            .src = to_tier ? pool : tier,
            .width = slot,
            .height = rows,
            .dst_pitch = to_tier ? tier_pitch : pool_pitch,
            .src_pitch = to_tier ? pool_pitch : tier_pitch,
            .dst_host = to_tier ? tier_host : 0,
            .src_host = to_tier ? 0 : tier_host,
        };
    }
    if (rc == 0)
        rc = copy_ops(b, ops, n, device_ms);
    free(ops);
    return rc;
}
