/* SPDX-License-Identifier: Apache-2.0 */
/*
 * host backend: one memfd, sealed so that it can never shrink under a worker
 * that maps it (a shrunk file would SIGBUS the worker), mapped shared.
 * Workers get dups of the fd and map them the same way.
 */
#include "backend_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

static uint64_t page_round_up(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

int backend_host_memfd(const char *name, uint64_t bytes, unsigned late_seals, int *fd_out,
                       uintptr_t *base_out, uint64_t *size_out, char *err, size_t errlen)
{
    if (bytes > (uint64_t)INT64_MAX / 2) {
        backend_errorf(err, errlen, "%s size %llu bytes is too large", name,
                       (unsigned long long)bytes);
        return KVS_EINVAL;
    }
    int rc;
    uint64_t size = page_round_up(bytes);
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        backend_errorf(err, errlen, "memfd_create failed: %s", strerror(errno));
        return KVS_EIO;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        rc = errno == EFBIG || errno == ENOMEM || errno == ENOSPC ? KVS_ENOMEM : KVS_EIO;
        backend_errorf(err, errlen, "cannot size the %s to %llu bytes: %s", name,
                       (unsigned long long)size, strerror(errno));
        goto fail;
    }
    if (fcntl(fd, F_ADD_SEALS, HOST_SEALS) != 0) {
        rc = KVS_EIO;
        backend_errorf(err, errlen, "cannot seal the %s memfd: %s", name, strerror(errno));
        goto fail;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = errno == ENOMEM ? KVS_ENOMEM : KVS_EIO;
        backend_errorf(err, errlen, "cannot map the %s (%llu bytes): %s", name,
                       (unsigned long long)size, strerror(errno));
        goto fail;
    }
    if (fcntl(fd, F_ADD_SEALS, (int)(late_seals | F_SEAL_SEAL)) != 0) {
        rc = KVS_EIO;
        backend_errorf(err, errlen,
                       "cannot seal the %s memfd (seals 0x%x; F_SEAL_FUTURE_WRITE needs Linux "
                       "5.1 or later): %s",
                       name, late_seals, strerror(errno));
        munmap(base, size);
        goto fail;
    }
    *fd_out = fd;
    *base_out = (uintptr_t)base;
    *size_out = size;
    return 0;
fail:
    close(fd);
    return rc;
}

int backend_host_open(const backend_config_t *cfg, backend_t *b, char *err, size_t errlen)
{
    if (cfg->bytes == 0) {
        backend_errorf(err, errlen,
                       "host backend needs an explicit pool size (a memory fraction is for "
                       "cuda devices only): give the pool a byte size");
        return KVS_EINVAL;
    }
    int fd;
    uintptr_t base;
    uint64_t size;
    int rc = backend_host_memfd("kvshare-pool", cfg->bytes, 0, &fd, &base, &size, err, errlen);
    if (rc != 0)
        return rc;
    b->kind = BACKEND_HOST;
    b->size = size;
    b->base = base;
    b->host_fd = fd;
    memset(&b->desc, 0, sizeof(b->desc));
    b->desc.kind = BACKEND_HOST;
    b->desc.size = size;
    b->desc.n_slabs = 1;
    b->desc.slab_bytes[0] = size;
    snprintf(b->detail, sizeof(b->detail), "host memfd, %llu bytes", (unsigned long long)size);
    return 0;
}

void backend_host_close(backend_t *b)
{
    if (b->base != 0)
        munmap((void *)b->base, b->size);
    if (b->host_fd >= 0)
        close(b->host_fd);
    b->base = 0;
    b->host_fd = -1;
}

int backend_host_export(backend_t *b, int *fds, size_t max, size_t *n_fds, char *err, size_t errlen)
{
    if (max < 1) {
        backend_errorf(err, errlen, "no room for the pool's fd");
        return KVS_EINVAL;
    }
    int fd = fcntl(b->host_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        backend_errorf(err, errlen, "duplicating the pool's memfd failed: %s", strerror(errno));
        return KVS_EIO;
    }
    fds[0] = fd;
    *n_fds = 1;
    return 0;
}

/* Maps every slab in order into one range: reserve the range first, then put
 * each file over its part with MAP_FIXED, so the slabs are contiguous. */
int backend_host_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                        backend_mapping_t *m, char *err, size_t errlen)
{
    void *base = MAP_FAILED;
    int rc = KVS_EINVAL;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < n_fds; i++) {
        struct stat st;
        if (i + 1 < n_fds && desc->slab_bytes[i] % page != 0) {
            backend_errorf(err, errlen, "slab %zu is not a whole number of pages", i);
            goto fail;
        }
        if (fstat(fds[i], &st) != 0 || (uint64_t)st.st_size < desc->slab_bytes[i]) {
            backend_errorf(err, errlen, "fd %zu is smaller than the %llu-byte slab it names", i,
                           (unsigned long long)desc->slab_bytes[i]);
            goto fail;
        }
        int seals = fcntl(fds[i], F_GET_SEALS);
        if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
            backend_errorf(err, errlen,
                           "fd %zu is not a memfd sealed against shrinking: mapping it could "
                           "crash this process if it shrank",
                           i);
            goto fail;
        }
    }
    base = mmap(NULL, desc->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        rc = KVS_ENOMEM;
        backend_errorf(err, errlen, "cannot reserve %llu bytes of address space: %s",
                       (unsigned long long)desc->size, strerror(errno));
        goto fail;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n_fds; i++) {
        void *at = mmap((char *)base + offset, desc->slab_bytes[i], PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_FIXED, fds[i], 0);
        if (at == MAP_FAILED) {
            rc = KVS_EIO;
            backend_errorf(err, errlen, "cannot map slab %zu of the host pool: %s", i,
                           strerror(errno));
            goto fail;
        }
        offset += desc->slab_bytes[i];
    }
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    m->kind = BACKEND_HOST;
    m->size = desc->size;
    m->base = (uintptr_t)base;
    return 0;
fail:
    if (base != MAP_FAILED)
        munmap(base, desc->size);
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    return rc;
}

int backend_host_import_readonly(int fd, uint64_t bytes, backend_mapping_t *m, char *err,
                                 size_t errlen)
{
    struct stat st;
    int rc = KVS_EINVAL;
    if (bytes == 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < bytes) {
        backend_errorf(err, errlen, "the tier-2 fd is smaller than the %llu bytes it should hold",
                       (unsigned long long)bytes);
        goto fail;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        backend_errorf(err, errlen,
                       "the tier-2 fd is not a memfd sealed against shrinking: mapping it could "
                       "crash this process if it shrank");
        goto fail;
    }
    void *base = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = errno == ENOMEM ? KVS_ENOMEM : KVS_EIO;
        backend_errorf(err, errlen, "cannot map tier 2 (%llu bytes) read-only: %s",
                       (unsigned long long)bytes, strerror(errno));
        goto fail;
    }
    close(fd);
    m->kind = BACKEND_HOST;
    m->size = bytes;
    m->base = (uintptr_t)base;
    m->read_only = 1;
    return 0;
fail:
    close(fd);
    return rc;
}

void backend_host_unmap(backend_mapping_t *m)
{
    if (m->base != 0)
        munmap((void *)m->base, m->size);
    m->base = 0;
}
