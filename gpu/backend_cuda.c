/*
 * cuda backend: the CUDA driver API, loaded at run time.
 *
 *   dlopen("libcuda.so.1") -> cuInit -> cuDriverGetVersion
 *       -> every other entry point through cuGetProcAddress, pinned to the
 *          CUDA 12.0 API, so a newer driver keeps giving us the signatures
 *          this file was written against (cuda.h's PFN_*_v* types).
 *
 * The pool: a few cuMemCreate slabs (POSIX-fd handle type, sizes rounded to
 * the allocation granularity) mapped in order into one reserved virtual range:
 *
 *     va: [ slab 0 | slab 1 | ... | slab n-1 ]    one range, backend_size() bytes
 *
 * An importer gets one fd per slab (cuMemExportToShareableHandle), imports
 * each, reserves its own range of the same size, maps the slabs in the same
 * order and releases its handles: its mappings keep the memory alive even if
 * the daemon exits. Devices are named by UUID, never by ordinal, since two
 * processes may see different ordinals (CUDA_VISIBLE_DEVICES).
 *
 * The driver is loaded once per process and never unloaded.
 */
#include "backend_internal.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The driver API version every entry point is resolved for. */
#define CUDA_API_VERSION 12000
/* Slabs are about this big: large enough that a pool is "a few" of them
 * (mapping cost grows with their number), small enough that one
 * cuMemCreate does not need one huge contiguous physical run. */
#define CUDA_SLAB_TARGET (16ull << 30)

enum { CUDA_COPY_UNKNOWN, CUDA_COPY_2D, CUDA_COPY_UNALIGNED };

typedef struct cuda_api {
    void *lib;
    int rc;           /* 0, or why the driver cannot be used */
    char reason[512]; /* the message for rc */
    int driver_version;
    PFN_cuInit_v2000 init;
    PFN_cuDriverGetVersion_v2020 driver_get_version;
    PFN_cuGetProcAddress_v12000 get_proc_address;
    PFN_cuGetErrorName_v6000 get_error_name;
    PFN_cuGetErrorString_v6000 get_error_string;
    PFN_cuDeviceGetCount_v2000 device_get_count;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 device_get_attribute;
    PFN_cuDeviceGetName_v2000 device_get_name;
    PFN_cuDeviceGetUuid_v11040 device_get_uuid;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
    PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release;
    PFN_cuCtxSetCurrent_v4000 ctx_set_current;
    PFN_cuCtxSynchronize_v2000 ctx_synchronize;
    PFN_cuMemGetInfo_v3020 mem_get_info;
    PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity;
    PFN_cuMemCreate_v10020 mem_create;
    PFN_cuMemRelease_v10020 mem_release;
    PFN_cuMemAddressReserve_v10020 mem_address_reserve;
    PFN_cuMemAddressFree_v10020 mem_address_free;
    PFN_cuMemMap_v10020 mem_map;
    PFN_cuMemUnmap_v10020 mem_unmap;
    PFN_cuMemSetAccess_v10020 mem_set_access;
    PFN_cuMemExportToShareableHandle_v10020 mem_export;
    PFN_cuMemImportFromShareableHandle_v10020 mem_import;
    PFN_cuMemcpyDtoD_v3020 memcpy_dtod;
    PFN_cuMemcpyHtoD_v3020 memcpy_htod;
    PFN_cuMemcpyDtoH_v3020 memcpy_dtoh;
    PFN_cuMemcpy2D_v3020 memcpy_2d;
    PFN_cuMemcpy2DUnaligned_v3020 memcpy_2d_unaligned;
} cuda_api_t;

struct backend_cuda {
    int ordinal;
    CUdevice dev;
    CUcontext ctx; /* the device's primary context, retained */
    CUdeviceptr va;
    uint64_t size;
    uint64_t granularity;
    uint64_t max_pitch;
    int copy_2d; /* which 2D copy works here: CUDA_COPY_* */
    uint32_t n_slabs;
    uint32_t n_mapped;
    uint64_t slab_bytes[BACKEND_MAX_SLABS];
    CUmemGenericAllocationHandle handles[BACKEND_MAX_SLABS];
};

static cuda_api_t api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

#define NO_DRIVER_FIX "install the NVIDIA driver or use --backend host"

static void cuda_describe_error(CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (api.get_error_name != NULL)
        api.get_error_name(r, &name);
    if (api.get_error_string != NULL)
        api.get_error_string(r, &text);
    snprintf(buf, len, "%s (%d): %s", name != NULL ? name : "CUDA error", (int)r,
             text != NULL ? text : "no description");
}

static int cuda_fail(char *err, size_t errlen, int code, const char *what, CUresult r)
{
    char why[256];
    cuda_describe_error(r, why, sizeof(why));
    backend_errorf(err, errlen, "%s failed: %s", what, why);
    return code;
}

static int resolve(const char *symbol, void **out)
{
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r =
        api.get_proc_address(symbol, out, CUDA_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || *out == NULL) {
        snprintf(api.reason, sizeof(api.reason),
                 "the NVIDIA driver has no %s for the CUDA %d.%d API: update the NVIDIA "
                 "driver or use --backend host",
                 symbol, CUDA_API_VERSION / 1000, CUDA_API_VERSION % 1000 / 10);
        return KVS_ENODRIVER;
    }
    return 0;
}

/* Copies a dlsym result into a function pointer without the object-to-
 * function pointer cast that ISO C leaves undefined (POSIX allows it). */
#define DLSYM(field, name) memcpy(&api.field, &(void *){dlsym(api.lib, name)}, sizeof(void *))

static void cuda_load(void)
{
    api.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (api.lib == NULL) {
        const char *why = dlerror();
        snprintf(api.reason, sizeof(api.reason), "libcuda.so.1 not found: " NO_DRIVER_FIX " (%s)",
                 why != NULL ? why : "dlopen failed");
        api.rc = KVS_ENODRIVER;
        return;
    }
    DLSYM(init, "cuInit");
    DLSYM(driver_get_version, "cuDriverGetVersion");
    DLSYM(get_proc_address, "cuGetProcAddress_v2");
    DLSYM(get_error_name, "cuGetErrorName");
    DLSYM(get_error_string, "cuGetErrorString");
    if (api.init == NULL || api.driver_get_version == NULL) {
        snprintf(api.reason, sizeof(api.reason),
                 "libcuda.so.1 has no cuInit: it is not an NVIDIA driver; " NO_DRIVER_FIX);
        api.rc = KVS_ENODRIVER;
        return;
    }
    CUresult r = api.init(0);
    if (r == CUDA_ERROR_STUB_LIBRARY) {
        /* The toolkit's stub answers every call with this: it is not a driver. */
        snprintf(api.reason, sizeof(api.reason),
                 "libcuda.so.1 is the CUDA Toolkit's stub library, not a driver (remove the "
                 "toolkit's stubs directory from the library path): " NO_DRIVER_FIX);
        api.rc = KVS_ENODRIVER;
        return;
    }
    if (r == CUDA_ERROR_NO_DEVICE) {
        snprintf(api.reason, sizeof(api.reason),
                 "the NVIDIA driver found no CUDA device (check nvidia-smi and "
                 "CUDA_VISIBLE_DEVICES), or use --backend host");
        api.rc = KVS_ENODEV;
        return;
    }
    if (r != CUDA_SUCCESS) {
        char why[256];
        cuda_describe_error(r, why, sizeof(why));
        snprintf(api.reason, sizeof(api.reason),
                 "cuInit failed: %s: check the NVIDIA driver (nvidia-smi), or use --backend "
                 "host",
                 why);
        api.rc = KVS_ENODRIVER;
        return;
    }
    if (api.driver_get_version(&api.driver_version) != CUDA_SUCCESS ||
        api.driver_version < CUDA_API_VERSION || api.get_proc_address == NULL) {
        snprintf(api.reason, sizeof(api.reason),
                 "the NVIDIA driver supports CUDA %d.%d; kvshare needs a driver for CUDA "
                 "%d.%d or newer: update the driver or use --backend host",
                 api.driver_version / 1000, api.driver_version % 1000 / 10, CUDA_API_VERSION / 1000,
                 CUDA_API_VERSION % 1000 / 10);
        api.rc = KVS_ENODRIVER;
        return;
    }
    struct {
        const char *symbol;
        void **slot;
    } table[] = {
        {"cuDeviceGetCount", (void **)&api.device_get_count},
        {"cuDeviceGet", (void **)&api.device_get},
        {"cuDeviceGetAttribute", (void **)&api.device_get_attribute},
        {"cuDeviceGetName", (void **)&api.device_get_name},
        {"cuDeviceGetUuid", (void **)&api.device_get_uuid},
        {"cuDevicePrimaryCtxRetain", (void **)&api.primary_ctx_retain},
        {"cuDevicePrimaryCtxRelease", (void **)&api.primary_ctx_release},
        {"cuCtxSetCurrent", (void **)&api.ctx_set_current},
        {"cuCtxSynchronize", (void **)&api.ctx_synchronize},
        {"cuMemGetInfo", (void **)&api.mem_get_info},
        {"cuMemGetAllocationGranularity", (void **)&api.mem_get_allocation_granularity},
        {"cuMemCreate", (void **)&api.mem_create},
        {"cuMemRelease", (void **)&api.mem_release},
        {"cuMemAddressReserve", (void **)&api.mem_address_reserve},
        {"cuMemAddressFree", (void **)&api.mem_address_free},
        {"cuMemMap", (void **)&api.mem_map},
        {"cuMemUnmap", (void **)&api.mem_unmap},
        {"cuMemSetAccess", (void **)&api.mem_set_access},
        {"cuMemExportToShareableHandle", (void **)&api.mem_export},
        {"cuMemImportFromShareableHandle", (void **)&api.mem_import},
        {"cuMemcpyDtoD", (void **)&api.memcpy_dtod},
        {"cuMemcpyHtoD", (void **)&api.memcpy_htod},
        {"cuMemcpyDtoH", (void **)&api.memcpy_dtoh},
        {"cuMemcpy2D", (void **)&api.memcpy_2d},
        {"cuMemcpy2DUnaligned", (void **)&api.memcpy_2d_unaligned},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (resolve(table[i].symbol, table[i].slot) != 0) {
            api.rc = KVS_ENODRIVER;
            return;
        }
    }
    api.rc = 0;
}

static int cuda_loaded(char *err, size_t errlen)
{
    pthread_once(&api_once, cuda_load);
    if (api.rc != 0)
        backend_errorf(err, errlen, "%s", api.reason);
    return api.rc;
}

int backend_cuda_built(void)
{
    return 1;
}

static void format_uuid(const uint8_t u[BACKEND_UUID_LEN], char *buf, size_t len)
{
    snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

/* Device `ordinal` is present and can serve a shared VMM pool. */
static int cuda_device_check(int ordinal, CUdevice *dev, char *err, size_t errlen)
{
    int count = 0, vmm = 0, posix_fd = 0;
    CUresult r = api.device_get_count(&count);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_ENODEV, "cuDeviceGetCount", r);
    if (count == 0) {
        backend_errorf(err, errlen,
                       "no CUDA device: the driver sees none (check nvidia-smi and "
                       "CUDA_VISIBLE_DEVICES), or use --backend host");
        return KVS_ENODEV;
    }
    if (ordinal < 0 || ordinal >= count) {
        backend_errorf(err, errlen,
                       "CUDA device %d does not exist: this host has %d device%s (0..%d); pick "
                       "one with --device",
                       ordinal, count, count == 1 ? "" : "s", count - 1);
        return KVS_ENODEV;
    }
    r = api.device_get(dev, ordinal);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_ENODEV, "cuDeviceGet", r);
    r = api.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 *dev);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_EIO, "cuDeviceGetAttribute", r);
    r = api.device_get_attribute(
        &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, *dev);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_EIO, "cuDeviceGetAttribute", r);
    if (!vmm || !posix_fd) {
        backend_errorf(err, errlen,
                       "CUDA device %d does not support %s, which sharing the pool between "
                       "processes needs: use a newer GPU/driver (Linux, not WSL), another "
                       "--device, or --backend host",
                       ordinal,
                       !vmm ? "virtual memory management (cuMemCreate/cuMemMap)"
                            : "POSIX file descriptor export of device memory");
        return KVS_ENOTSUP;
    }
    return 0;
}

int backend_cuda_probe(int device, char *err, size_t errlen)
{
    CUdevice dev;
    int rc = cuda_loaded(err, errlen);
    if (rc != 0)
        return rc;
    return cuda_device_check(device, &dev, err, errlen);
}

static CUmemAllocationProp slab_prop(CUdevice dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    return prop;
}

/* Retains the primary context of c->dev and makes it current: the memory
 * calls need a current context. */
static int cuda_context(struct backend_cuda *c, char *err, size_t errlen)
{
    CUresult r = api.primary_ctx_retain(&c->ctx, c->dev);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_EIO, "cuDevicePrimaryCtxRetain", r);
    r = api.ctx_set_current(c->ctx);
    if (r != CUDA_SUCCESS) {
        api.primary_ctx_release(c->dev);
        c->ctx = NULL;
        return cuda_fail(err, errlen, KVS_EIO, "cuCtxSetCurrent", r);
    }
    return 0;
}

/* Maps c's slabs (handles already created or imported) into a new range of
 * c->size bytes and gives the device read-write access. */
static int cuda_map(struct backend_cuda *c, char *err, size_t errlen)
{
    CUresult r = api.mem_address_reserve(&c->va, c->size, c->granularity, 0, 0);
    if (r != CUDA_SUCCESS) {
        c->va = 0;
        return cuda_fail(err, errlen, r == CUDA_ERROR_OUT_OF_MEMORY ? KVS_ENOMEM : KVS_EIO,
                         "cuMemAddressReserve", r);
    }
    uint64_t offset = 0;
    for (c->n_mapped = 0; c->n_mapped < c->n_slabs; c->n_mapped++) {
        r = api.mem_map(c->va + offset, c->slab_bytes[c->n_mapped], 0, c->handles[c->n_mapped], 0);
        if (r != CUDA_SUCCESS)
            return cuda_fail(err, errlen, KVS_EIO, "cuMemMap", r);
        offset += c->slab_bytes[c->n_mapped];
    }
    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = (int)c->dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = api.mem_set_access(c->va, c->size, &access, 1);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_EIO, "cuMemSetAccess", r);
    return 0;
}

/* Undoes whatever part of context, handles and mapping c holds. */
static void cuda_teardown(struct backend_cuda *c)
{
    if (c == NULL)
        return;
    if (c->ctx != NULL) {
        api.ctx_set_current(c->ctx);
        api.ctx_synchronize();
    }
    uint64_t offset = 0;
    for (uint32_t i = 0; i < c->n_mapped; i++) {
        api.mem_unmap(c->va + offset, c->slab_bytes[i]);
        offset += c->slab_bytes[i];
    }
    if (c->va != 0)
        api.mem_address_free(c->va, c->size);
    for (uint32_t i = 0; i < c->n_slabs; i++)
        if (c->handles[i] != 0)
            api.mem_release(c->handles[i]);
    if (c->ctx != NULL)
        api.primary_ctx_release(c->dev);
    free(c);
}

static uint64_t round_up(uint64_t n, uint64_t to)
{
    return (n + to - 1) / to * to;
}

/* The pool size: asked bytes rounded up to the granularity, or the asked
 * fraction of the free memory (rounded down to round_bytes). */
static int cuda_pool_size(const backend_config_t *cfg, struct backend_cuda *c, uint64_t *size,
                          char *err, size_t errlen)
{
    size_t free_bytes = 0, total_bytes = 0;
    CUresult r = api.mem_get_info(&free_bytes, &total_bytes);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_EIO, "cuMemGetInfo", r);
    uint64_t want;
    if (cfg->bytes != 0) {
        want = round_up(cfg->bytes, c->granularity);
    } else {
        if (!(cfg->mem_fraction > 0.0 && cfg->mem_fraction <= 1.0)) {
            backend_errorf(err, errlen,
                           "cuda pool: give a size in bytes or a memory fraction in (0, 1], "
                           "not %g",
                           cfg->mem_fraction);
            return KVS_EINVAL;
        }
        want = (uint64_t)((double)free_bytes * cfg->mem_fraction);
        if (cfg->round_bytes != 0)
            want -= want % cfg->round_bytes;
        /* Rounded down, not up, so that a fraction of 1.0 still fits. */
        want -= want % c->granularity;
        if (want == 0 || (cfg->round_bytes != 0 && want < cfg->round_bytes)) {
            backend_errorf(err, errlen,
                           "not enough free memory on CUDA device %d: %.0f%% of %llu free bytes "
                           "holds no block: free device memory or raise the fraction",
                           c->ordinal, cfg->mem_fraction * 100.0, (unsigned long long)free_bytes);
            return KVS_ENOMEM;
        }
    }
    if (want > free_bytes) {
        backend_errorf(err, errlen,
                       "not enough memory on CUDA device %d: the pool asks %llu bytes (%.2f GiB) "
                       "but only %llu bytes (%.2f GiB) of %llu are free: ask for less or free "
                       "device memory",
                       c->ordinal, (unsigned long long)want, (double)want / (1ull << 30),
                       (unsigned long long)free_bytes, (double)free_bytes / (1ull << 30),
                       (unsigned long long)total_bytes);
        return KVS_ENOMEM;
    }
    *size = want;
    return 0;
}

int backend_cuda_open(const backend_config_t *cfg, backend_t *b, char *err, size_t errlen)
{
    struct backend_cuda *c = NULL;
    int rc = cuda_loaded(err, errlen);
    if (rc != 0)
        return rc;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        backend_errorf(err, errlen, "out of memory");
        return KVS_ENOMEM;
    }
    c->ordinal = cfg->device;
    rc = cuda_device_check(cfg->device, &c->dev, err, errlen);
    if (rc != 0)
        goto fail;
    rc = cuda_context(c, err, errlen);
    if (rc != 0)
        goto fail;

    CUmemAllocationProp prop = slab_prop(c->dev);
    size_t gran = 0;
    CUresult r =
        api.mem_get_allocation_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || gran == 0) {
        rc = cuda_fail(err, errlen, KVS_EIO, "cuMemGetAllocationGranularity", r);
        goto fail;
    }
    c->granularity = gran;
    int pitch = 0;
    if (api.device_get_attribute(&pitch, CU_DEVICE_ATTRIBUTE_MAX_PITCH, c->dev) == CUDA_SUCCESS &&
        pitch > 0)
        c->max_pitch = (uint64_t)pitch;

    rc = cuda_pool_size(cfg, c, &c->size, err, errlen);
    if (rc != 0)
        goto fail;

    /* Equal slabs of about CUDA_SLAB_TARGET bytes, the last one smaller. */
    uint64_t n = (c->size + CUDA_SLAB_TARGET - 1) / CUDA_SLAB_TARGET;
    if (n > BACKEND_MAX_SLABS)
        n = BACKEND_MAX_SLABS;
    uint64_t slab = round_up((c->size + n - 1) / n, c->granularity);
    for (uint64_t left = c->size; left > 0; c->n_slabs++) {
        c->slab_bytes[c->n_slabs] = left < slab ? left : slab;
        left -= c->slab_bytes[c->n_slabs];
    }
    for (uint32_t i = 0; i < c->n_slabs; i++) {
        r = api.mem_create(&c->handles[i], c->slab_bytes[i], &prop, 0);
        if (r != CUDA_SUCCESS) {
            c->handles[i] = 0;
            if (r == CUDA_ERROR_OUT_OF_MEMORY) {
                backend_errorf(err, errlen,
                               "not enough memory on CUDA device %d: cuMemCreate of slab %u "
                               "(%llu bytes) of a %llu-byte pool failed: ask for less or free "
                               "device memory",
                               c->ordinal, i, (unsigned long long)c->slab_bytes[i],
                               (unsigned long long)c->size);
                rc = KVS_ENOMEM;
            } else {
                rc = cuda_fail(err, errlen, KVS_EIO, "cuMemCreate", r);
            }
            goto fail;
        }
    }
    rc = cuda_map(c, err, errlen);
    if (rc != 0)
        goto fail;

    CUuuid uuid;
    r = api.device_get_uuid(&uuid, c->dev);
    if (r != CUDA_SUCCESS) {
        rc = cuda_fail(err, errlen, KVS_EIO, "cuDeviceGetUuid", r);
        goto fail;
    }
    char name[128] = "unknown", uuid_text[48];
    api.device_get_name(name, (int)sizeof(name), c->dev);
    memset(&b->desc, 0, sizeof(b->desc));
    b->desc.kind = BACKEND_CUDA;
    memcpy(b->desc.device_uuid, uuid.bytes, BACKEND_UUID_LEN);
    b->desc.size = c->size;
    b->desc.n_slabs = c->n_slabs;
    memcpy(b->desc.slab_bytes, c->slab_bytes, sizeof(c->slab_bytes));
    format_uuid(b->desc.device_uuid, uuid_text, sizeof(uuid_text));
    b->kind = BACKEND_CUDA;
    b->size = c->size;
    b->base = (uintptr_t)c->va;
    b->cuda = c;
    snprintf(b->detail, sizeof(b->detail),
             "cuda device %d (%s, %s), %llu bytes in %u slab%s, granularity %llu, driver "
             "CUDA %d.%d",
             c->ordinal, name, uuid_text, (unsigned long long)c->size, c->n_slabs,
             c->n_slabs == 1 ? "" : "s", (unsigned long long)c->granularity,
             api.driver_version / 1000, api.driver_version % 1000 / 10);
    return 0;
fail:
    cuda_teardown(c);
    return rc;
}

void backend_cuda_close(backend_t *b)
{
    cuda_teardown(b->cuda);
    b->cuda = NULL;
    b->base = 0;
}

int backend_cuda_export(backend_t *b, int *fds, size_t max, size_t *n_fds)
{
    struct backend_cuda *c = b->cuda;
    if (max < c->n_slabs)
        return KVS_EINVAL;
    api.ctx_set_current(c->ctx);
    for (uint32_t i = 0; i < c->n_slabs; i++) {
        int fd = -1;
        CUresult r =
            api.mem_export(&fd, c->handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS || fd < 0) {
            for (uint32_t j = 0; j < i; j++)
                close(fds[j]);
            return KVS_EIO;
        }
        /* Whatever the driver did, the daemon must not leak pool fds into
         * children it may start. */
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        fds[i] = fd;
    }
    *n_fds = c->n_slabs;
    return 0;
}

/* Finds the local ordinal of the device with this UUID. */
static int cuda_find_device(const uint8_t uuid[BACKEND_UUID_LEN], struct backend_cuda *c, char *err,
                            size_t errlen)
{
    int count = 0;
    CUresult r = api.device_get_count(&count);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_ENODEV, "cuDeviceGetCount", r);
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        CUuuid u;
        if (api.device_get(&dev, i) != CUDA_SUCCESS || api.device_get_uuid(&u, dev) != CUDA_SUCCESS)
            continue;
        if (memcmp(u.bytes, uuid, BACKEND_UUID_LEN) == 0) {
            c->ordinal = i;
            c->dev = dev;
            return 0;
        }
    }
    char text[48];
    format_uuid(uuid, text, sizeof(text));
    backend_errorf(err, errlen,
                   "the pool lives on CUDA device %s, which this process cannot see (it sees %d "
                   "device%s): check CUDA_VISIBLE_DEVICES and that the daemon and this process "
                   "share the GPU",
                   text, count, count == 1 ? "" : "s");
    return KVS_ENODEV;
}

int backend_cuda_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                        backend_mapping_t *m, char *err, size_t errlen)
{
    struct backend_cuda *c = NULL;
    int rc = cuda_loaded(err, errlen);
    if (rc != 0)
        goto fail;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        rc = KVS_ENOMEM;
        backend_errorf(err, errlen, "out of memory");
        goto fail;
    }
    rc = cuda_find_device(desc->device_uuid, c, err, errlen);
    if (rc != 0)
        goto fail;
    rc = cuda_device_check(c->ordinal, &c->dev, err, errlen);
    if (rc != 0)
        goto fail;
    rc = cuda_context(c, err, errlen);
    if (rc != 0)
        goto fail;
    CUmemAllocationProp prop = slab_prop(c->dev);
    size_t gran = 0;
    CUresult r = api.mem_get_allocation_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || gran == 0) {
        rc = cuda_fail(err, errlen, KVS_EIO, "cuMemGetAllocationGranularity", r);
        goto fail;
    }
    c->granularity = gran;
    c->size = desc->size;
    for (size_t i = 0; i < n_fds; i++) {
        if (desc->slab_bytes[i] % gran != 0) {
            rc = KVS_EINVAL;
            backend_errorf(err, errlen,
                           "pool descriptor: slab %zu (%llu bytes) is not a multiple of the "
                           "allocation granularity %zu",
                           i, (unsigned long long)desc->slab_bytes[i], gran);
            goto fail;
        }
        c->slab_bytes[i] = desc->slab_bytes[i];
        r = api.mem_import(&c->handles[c->n_slabs], (void *)(uintptr_t)fds[i],
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != CUDA_SUCCESS) {
            c->handles[c->n_slabs] = 0;
            rc = cuda_fail(err, errlen, KVS_EIO, "cuMemImportFromShareableHandle", r);
            goto fail;
        }
        c->n_slabs++;
    }
    rc = cuda_map(c, err, errlen);
    if (rc != 0)
        goto fail;
    /* The mappings hold the memory now; drop our handles so that unmapping
     * is all it takes to let it go. */
    for (uint32_t i = 0; i < c->n_slabs; i++) {
        api.mem_release(c->handles[i]);
        c->handles[i] = 0;
    }
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    m->kind = BACKEND_CUDA;
    m->size = c->size;
    m->base = (uintptr_t)c->va;
    m->cuda = c;
    return 0;
fail:
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    if (c != NULL && api.rc == 0)
        cuda_teardown(c);
    else
        free(c);
    return rc;
}

void backend_cuda_unmap(backend_mapping_t *m)
{
    cuda_teardown(m->cuda);
    m->cuda = NULL;
    m->base = 0;
}

/* Device-to-device copies are asynchronous to the host: wait, so that the
 * caller may tell a worker the block is ready. */
static int cuda_sync(CUresult r)
{
    if (r == CUDA_SUCCESS)
        r = api.ctx_synchronize();
    return r == CUDA_SUCCESS ? 0 : KVS_EIO;
}

int backend_cuda_dtod(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t n)
{
    if (api.ctx_set_current(c->ctx) != CUDA_SUCCESS)
        return KVS_EIO;
    return cuda_sync(api.memcpy_dtod((CUdeviceptr)dst, (CUdeviceptr)src, n));
}

int backend_cuda_dtod_2d(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t width,
                         uint64_t height, uint64_t pitch)
{
    if (api.ctx_set_current(c->ctx) != CUDA_SUCCESS)
        return KVS_EIO;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (c->max_pitch != 0 && pitch <= c->max_pitch) {
        CUDA_MEMCPY2D copy;
        memset(&copy, 0, sizeof(copy));
        copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        copy.srcDevice = (CUdeviceptr)src;
        copy.srcPitch = pitch;
        copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        copy.dstDevice = (CUdeviceptr)dst;
        copy.dstPitch = pitch;
        copy.WidthInBytes = width;
        copy.Height = height;
        /* cuMemcpy2D may refuse device-to-device pitches that did not come
         * from cuMemAllocPitch; the unaligned variant takes any pitch. */
        if (c->copy_2d != CUDA_COPY_UNALIGNED) {
            r = api.memcpy_2d(&copy);
            if (r == CUDA_SUCCESS)
                c->copy_2d = CUDA_COPY_2D;
        }
        if (r != CUDA_SUCCESS) {
            r = api.memcpy_2d_unaligned(&copy);
            if (r == CUDA_SUCCESS)
                c->copy_2d = CUDA_COPY_UNALIGNED;
        }
    }
    /* Pitch beyond what one 2D copy allows (very large pools), or no 2D copy
     * works: row by row. */
    for (uint64_t row = 0; r != CUDA_SUCCESS && row < height; row++) {
        CUresult rr = api.memcpy_dtod((CUdeviceptr)(dst + row * pitch),
                                      (CUdeviceptr)(src + row * pitch), width);
        if (rr != CUDA_SUCCESS)
            return KVS_EIO;
        if (row + 1 == height)
            r = CUDA_SUCCESS;
    }
    return cuda_sync(r);
}

int backend_cuda_htod(struct backend_cuda *c, uintptr_t dst, const void *src, uint64_t n)
{
    if (api.ctx_set_current(c->ctx) != CUDA_SUCCESS)
        return KVS_EIO;
    return cuda_sync(api.memcpy_htod((CUdeviceptr)dst, src, n));
}

int backend_cuda_dtoh(struct backend_cuda *c, void *dst, uintptr_t src, uint64_t n)
{
    if (api.ctx_set_current(c->ctx) != CUDA_SUCCESS)
        return KVS_EIO;
    return cuda_sync(api.memcpy_dtoh(dst, (CUdeviceptr)src, n));
}
