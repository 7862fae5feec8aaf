/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What backend.c shares with the host and cuda backends. Not installed.
 */
#ifndef KVS_BACKEND_INTERNAL_H
#define KVS_BACKEND_INTERNAL_H

#include <stdarg.h>

#include "backend.h"

struct backend_cuda; /* driver state of one pool or one mapping (backend_cuda.c) */

struct backend {
    backend_kind_t kind;
    uint64_t size;
    uintptr_t base;
    backend_desc_t desc;
    int host_fd;
    struct backend_cuda *cuda;
    char detail[768];
    /* Tier 2 (backend_tier_open): a host memfd mapped shared; on cuda also
     * registered with the driver. */
    int tier_fd;
    uintptr_t tier_base;
    uint64_t tier_size;
    int tier_registered;
    int tier_numa; /* the NUMA node its memory was placed on, plus 1 (0: none) */
};

struct backend_mapping {
    backend_kind_t kind;
    uint64_t size;
    uintptr_t base;
    struct backend_cuda *cuda;
    int read_only; /* mapped PROT_READ: writes through it are refused */
};

/* printf into the caller's error buffer (accepts NULL / 0). */
void backend_errorf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A memfd of at least bytes (rounded up to the page size, *size), sealed
 * against shrinking and growing, mapped shared and writable at *base, then
 * sealed with late_seals too (e.g. F_SEAL_FUTURE_WRITE: no write and no
 * writable mapping from then on but this one) and against further seals
 * (backend_host.c). */
int backend_host_memfd(const char *name, uint64_t bytes, unsigned late_seals, int *fd,
                       uintptr_t *base, uint64_t *size, char *err, size_t errlen);

/* host: memfd + mmap (backend_host.c). open fills size, base, desc, host_fd. */
int backend_host_open(const backend_config_t *cfg, backend_t *b, char *err, size_t errlen);
void backend_host_close(backend_t *b);
int backend_host_export(backend_t *b, int *fds, size_t max, size_t *n_fds, char *err,
                        size_t errlen);
int backend_host_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                        backend_mapping_t *m, char *err, size_t errlen);
void backend_host_unmap(backend_mapping_t *m);
/* Maps bytes of the sealed memfd fd read-only (fd consumed). */
int backend_host_import_readonly(int fd, uint64_t bytes, backend_mapping_t *m, char *err,
                                 size_t errlen);

/* cuda (backend_cuda.c, or backend_cuda_none.c when built without CUDA). */
int backend_cuda_built(void);
int backend_cuda_open(const backend_config_t *cfg, backend_t *b, char *err, size_t errlen);
void backend_cuda_close(backend_t *b);
int backend_cuda_export(backend_t *b, int *fds, size_t max, size_t *n_fds, char *err,
                        size_t errlen);
int backend_cuda_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                        backend_mapping_t *m, char *err, size_t errlen);
void backend_cuda_unmap(backend_mapping_t *m);
/* One strided copy: height rows of width bytes, rows dst_pitch bytes apart
 * at dst and src_pitch apart at src (a flat copy is one row). An address is
 * device memory unless its *_host flag says host memory (on cuda: memory
 * registered with the driver). */
typedef struct backend_copy_op {
    uintptr_t dst, src;
    uint64_t width, height, dst_pitch, src_pitch;
    uint8_t dst_host, src_host;
} backend_copy_op_t;

/* Copies on device addresses, on the backend's own stream, done when they
 * return; the caller's current context is unchanged. The batch issues n
 * copies back to back and waits once; device_ms (may be NULL) receives the
 * device time from the first copy's start to the last one's end (events on
 * the stream). */
int backend_cuda_copy_batch(struct backend_cuda *c, const backend_copy_op_t *ops, size_t n,
                            double *device_ms);
int backend_cuda_dtod(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t n);
int backend_cuda_dtod_2d(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t width,
                         uint64_t height, uint64_t pitch);
int backend_cuda_htod(struct backend_cuda *c, uintptr_t dst, const void *src, uint64_t n);
int backend_cuda_dtoh(struct backend_cuda *c, void *dst, uintptr_t src, uint64_t n);
/* Registers [p, p + n) of host memory with c's driver (cuMemHostRegister,
 * portable) so that copies with it are DMA, and unregisters it. */
/* The device's PCI address (cuDeviceGetAttribute). Errors: KVS_EIO, and
 * KVS_ENOTSUP without the cuda backend. */
int backend_cuda_pci(struct backend_cuda *c, int *domain, int *bus, int *device);
int backend_cuda_host_register(struct backend_cuda *c, void *p, uint64_t n, char *err,
                               size_t errlen);
void backend_cuda_host_unregister(struct backend_cuda *c, void *p);
/* The choice between the copy engine and the gather kernel
 * (backend_copy_mode_set), and a line saying what each direction uses. */
int backend_cuda_copy_mode_set(struct backend_cuda *c, backend_copy_mode_t mode);
void backend_cuda_copy_describe(struct backend_cuda *c, char *buf, size_t len);
/* The copy the last backend_cuda_dtod_2d used, e.g. "cuMemcpy2DAsync". */
const char *backend_cuda_copy_path(const struct backend_cuda *c);

#endif /* KVS_BACKEND_INTERNAL_H */
