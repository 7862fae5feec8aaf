/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend of a build without the CUDA Toolkit headers: every entry
 * point says so and how to get the real one.
 */
#include "backend_internal.h"

#include <stdio.h>
#include <unistd.h>

#define NOT_BUILT                                                                                  \
    "kvshare was built without CUDA headers: install the CUDA Toolkit (headers at "                \
    "/usr/local/cuda/include), rebuild, or use --backend host"

int backend_cuda_built(void)
{
    return 0;
}

int backend_cuda_probe(int device, char *err, size_t errlen)
{
    (void)device;
    backend_errorf(err, errlen, NOT_BUILT);
    return KVS_ENOTSUP;
}

int backend_cuda_open(const backend_config_t *cfg, backend_t *b, char *err, size_t errlen)
{
    (void)cfg;
    (void)b;
    backend_errorf(err, errlen, NOT_BUILT);
    return KVS_ENOTSUP;
}

void backend_cuda_close(backend_t *b)
{
    (void)b;
}

int backend_cuda_export(backend_t *b, int *fds, size_t max, size_t *n_fds, char *err, size_t errlen)
{
    (void)b;
    (void)fds;
    (void)max;
    (void)n_fds;
    backend_errorf(err, errlen, NOT_BUILT);
    return KVS_ENOTSUP;
}

int backend_cuda_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                        backend_mapping_t *m, char *err, size_t errlen)
{
    (void)desc;
    (void)m;
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    backend_errorf(err, errlen, NOT_BUILT);
    return KVS_ENOTSUP;
}

void backend_cuda_unmap(backend_mapping_t *m)
{
    (void)m;
}

int backend_cuda_copy_batch(struct backend_cuda *c, const backend_copy_op_t *ops, size_t n,
                            double *device_ms)
{
    (void)c;
    (void)ops;
    (void)n;
    (void)device_ms;
    return KVS_ENOTSUP;
}

int backend_cuda_dtod(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t n)
{
    (void)c;
    (void)dst;
    (void)src;
    (void)n;
    return KVS_ENOTSUP;
}

int backend_cuda_dtod_2d(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t width,
                         uint64_t height, uint64_t pitch)
{
    (void)c;
    (void)dst;
    (void)src;
    (void)width;
    (void)height;
    (void)pitch;
    return KVS_ENOTSUP;
}

int backend_cuda_htod(struct backend_cuda *c, uintptr_t dst, const void *src, uint64_t n)
{
    (void)c;
    (void)dst;
    (void)src;
    (void)n;
    return KVS_ENOTSUP;
}

const char *backend_cuda_copy_path(const struct backend_cuda *c)
{
    (void)c;
    return "none";
}

int backend_cuda_dtoh(struct backend_cuda *c, void *dst, uintptr_t src, uint64_t n)
{
    (void)c;
    (void)dst;
    (void)src;
    (void)n;
    return KVS_ENOTSUP;
}

int backend_cuda_pci(struct backend_cuda *c, int *domain, int *bus, int *device)
{
    (void)c;
    (void)domain;
    (void)bus;
    (void)device;
    return KVS_ENOTSUP;
}

int backend_cuda_host_register(struct backend_cuda *c, void *p, uint64_t n, char *err,
                               size_t errlen)
{
    (void)c;
    (void)p;
    (void)n;
    backend_errorf(err, errlen, NOT_BUILT);
    return KVS_ENOTSUP;
}

void backend_cuda_host_unregister(struct backend_cuda *c, void *p)
{
    (void)c;
    (void)p;
}

int backend_cuda_copy_mode_set(struct backend_cuda *c, backend_copy_mode_t mode)
{
    (void)c;
    (void)mode;
    return KVS_ENOTSUP;
}

void backend_cuda_copy_describe(struct backend_cuda *c, char *buf, size_t len)
{
    (void)c;
    snprintf(buf, len, "none");
}
