/*
 * A stand-in libcuda.so.1 for tests on machines without a GPU. It implements
 * the part of the driver API that the cuda backend uses, with "device memory"
 * that is host memory: an allocation is a memfd, an exported handle a dup of
 * it, a reserved range PROT_NONE address space, cuMemMap maps the memfd
 * there still inaccessible, and only cuMemSetAccess makes it readable and
 * writable, so a backend that forgets a step crashes here as it would fail
 * on a device. It checks what the real driver checks where that is cheap:
 * cuInit first, a current context for memory calls, granularity-aligned
 * sizes, handle types.
 *
 * KVS_FAKE_CUDA selects a failure to act out:
 *   ok (default) | stub (cuInit: CUDA_ERROR_STUB_LIBRARY) | nodevice
 *   (cuInit: CUDA_ERROR_NO_DEVICE) | zero (no device counted) | novmm | nofd
 *   (attributes unsupported) | old (a CUDA 11.8 driver) | oom (cuMemCreate
 *   fails); KVS_FAKE_CUDA_FREE_MIB sets the free memory (default 1024).
 *
 * Test code only: never installed, never loaded outside ctest.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAKE_GRANULARITY (2ull << 20)
#define FAKE_DEVICES     1
#define EXPORT           __attribute__((visibility("default")))

typedef struct fake_alloc {
    int fd;
    size_t size;
} fake_alloc_t;

static int initialised;
static int ctx_refs[FAKE_DEVICES];
static char ctx_token[FAKE_DEVICES]; /* a context is the address of its token */
static __thread CUcontext current;
static size_t allocated;

static const char *mode(void)
{
    const char *m = getenv("KVS_FAKE_CUDA");
    return m != NULL ? m : "ok";
}

static int is_mode(const char *m)
{
    return strcmp(mode(), m) == 0;
}

static size_t free_bytes(void)
{
    const char *mib = getenv("KVS_FAKE_CUDA_FREE_MIB");
    return (size_t)(mib != NULL ? strtoull(mib, NULL, 10) : 1024) << 20;
}

static int devices(void)
{
    return is_mode("zero") ? 0 : FAKE_DEVICES;
}

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!initialised)                                                                          \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)
#define NEED_CTX()                                                                                 \
    do {                                                                                           \
        NEED_INIT();                                                                               \
        if (current == NULL)                                                                       \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
    } while (0)

EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_mode("stub"))
        return CUDA_ERROR_STUB_LIBRARY;
    if (is_mode("nodevice"))
        return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = is_mode("old") ? 11080 : 12080;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **out)
{
    *out = error == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **out)
{
    (void)error;
    *out = "error from the test driver";
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_count(int *count)
{
    NEED_INIT();
    *count = devices();
    return CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice *dev, int ordinal)
{
    NEED_INIT();
    if (ordinal < 0 || ordinal >= devices())
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_attribute(int *value, CUdevice_attribute attr, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= devices())
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        *value = !is_mode("novmm");
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        *value = !is_mode("nofd");
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
        *value = 4 << 20; /* small, so that tests reach the row-by-row path too */
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult fake_device_get_name(char *name, int len, CUdevice dev)
{
    NEED_INIT();
    (void)dev;
    strncpy(name, "Fake CUDA device", (size_t)len);
    name[len - 1] = '\0';
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_uuid(CUuuid *uuid, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= devices())
        return CUDA_ERROR_INVALID_DEVICE;
    for (int i = 0; i < 16; i++)
        uuid->bytes[i] = (char)(0xf0 + i + dev);
    return CUDA_SUCCESS;
}

static CUresult fake_primary_ctx_retain(CUcontext *ctx, CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= devices())
        return CUDA_ERROR_INVALID_DEVICE;
    ctx_refs[dev]++;
    *ctx = (CUcontext)(void *)&ctx_token[dev];
    return CUDA_SUCCESS;
}

static CUresult fake_primary_ctx_release(CUdevice dev)
{
    NEED_INIT();
    if (dev < 0 || dev >= devices() || ctx_refs[dev] == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_refs[dev]--;
    return CUDA_SUCCESS;
}

static CUresult fake_ctx_set_current(CUcontext ctx)
{
    NEED_INIT();
    current = ctx;
    return CUDA_SUCCESS;
}

static CUresult fake_ctx_synchronize(void)
{
    NEED_CTX();
    return CUDA_SUCCESS;
}

static CUresult fake_mem_get_info(size_t *free_out, size_t *total)
{
    NEED_CTX();
    *free_out = free_bytes() - allocated;
    *total = 2 * free_bytes();
    return CUDA_SUCCESS;
}

static int prop_ok(const CUmemAllocationProp *prop)
{
    return prop != NULL && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < devices();
}

static CUresult fake_mem_get_allocation_granularity(size_t *gran, const CUmemAllocationProp *prop,
                                                    CUmemAllocationGranularity_flags option)
{
    NEED_INIT();
    if (!prop_ok(prop) || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                           option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *gran = FAKE_GRANULARITY;
    return CUDA_SUCCESS;
}

static CUresult fake_mem_create(CUmemGenericAllocationHandle *handle, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags)
{
    NEED_CTX();
    if (!prop_ok(prop) || flags != 0 || size == 0 || size % FAKE_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_mode("oom") || allocated + size > free_bytes())
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_alloc_t *a = malloc(sizeof(*a));
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0) {
        if (a->fd >= 0)
            close(a->fd);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->size = size;
    allocated += size;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
    return CUDA_SUCCESS;
}

static CUresult fake_mem_release(CUmemGenericAllocationHandle handle)
{
    NEED_INIT();
    fake_alloc_t *a = (fake_alloc_t *)(uintptr_t)handle;
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    close(a->fd);
    free(a);
    return CUDA_SUCCESS;
}

static CUresult fake_mem_address_reserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                         CUdeviceptr addr, unsigned long long flags)
{
    NEED_INIT();
    if (size == 0 || size % FAKE_GRANULARITY != 0 || addr != 0 || flags != 0 ||
        (alignment != 0 && alignment % FAKE_GRANULARITY != 0))
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

static CUresult fake_mem_address_free(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    return munmap((void *)(uintptr_t)ptr, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    NEED_INIT();
    fake_alloc_t *a = (fake_alloc_t *)(uintptr_t)handle;
    if (a == NULL || flags != 0 || offset % FAKE_GRANULARITY != 0 || size % FAKE_GRANULARITY != 0 ||
        ptr % FAKE_GRANULARITY != 0 || offset + size > a->size)
        return CUDA_ERROR_INVALID_VALUE;
    void *p =
        mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset);
    return p == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult fake_mem_unmap(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult fake_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                    size_t count)
{
    NEED_INIT();
    if (desc == NULL || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return CUDA_ERROR_INVALID_VALUE;
    return mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) == 0
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_mem_export(void *shareable, CUmemGenericAllocationHandle handle,
                                CUmemAllocationHandleType type, unsigned long long flags)
{
    NEED_INIT();
    fake_alloc_t *a = (fake_alloc_t *)(uintptr_t)handle;
    if (a == NULL || shareable == NULL || flags != 0 ||
        type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = dup(a->fd);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    memcpy(shareable, &fd, sizeof(fd));
    return CUDA_SUCCESS;
}

static CUresult fake_mem_import(CUmemGenericAllocationHandle *handle, void *os_handle,
                                CUmemAllocationHandleType type)
{
    NEED_INIT();
    int fd = (int)(uintptr_t)os_handle;
    struct stat st;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) != 0 ||
        st.st_size == 0 || (uint64_t)st.st_size % FAKE_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake_alloc_t *a = malloc(sizeof(*a));
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The driver does not take the caller's fd: keep our own. */
    a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    a->size = (size_t)st.st_size;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
    return CUDA_SUCCESS;
}

static CUresult fake_memcpy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

static CUresult fake_memcpy_htod(CUdeviceptr dst, const void *src, size_t n)
{
    NEED_CTX();
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

static CUresult fake_memcpy_dtoh(void *dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

static CUresult fake_memcpy_2d_unaligned(const CUDA_MEMCPY2D *c);

/* Like the driver, refuses device-to-device pitches it does not like (here:
 * not a multiple of 2 MiB), for which callers must use the unaligned copy. */
static CUresult fake_memcpy_2d(const CUDA_MEMCPY2D *c)
{
    NEED_CTX();
    if (c->srcPitch % (2u << 20) != 0 || c->dstPitch % (2u << 20) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return fake_memcpy_2d_unaligned(c);
}

static CUresult fake_memcpy_2d_unaligned(const CUDA_MEMCPY2D *c)
{
    NEED_CTX();
    if (c->srcMemoryType != CU_MEMORYTYPE_DEVICE || c->dstMemoryType != CU_MEMORYTYPE_DEVICE ||
        c->srcPitch > (4u << 20) || c->dstPitch > (4u << 20) || c->WidthInBytes > c->srcPitch ||
        c->WidthInBytes > c->dstPitch)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t row = 0; row < c->Height; row++)
        memcpy((char *)(uintptr_t)c->dstDevice + c->dstXInBytes + (c->dstY + row) * c->dstPitch,
               (const char *)(uintptr_t)c->srcDevice + c->srcXInBytes +
                   (c->srcY + row) * c->srcPitch,
               c->WidthInBytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"cuDeviceGetCount", (void *)fake_device_get_count},
        {"cuDeviceGet", (void *)fake_device_get},
        {"cuDeviceGetAttribute", (void *)fake_device_get_attribute},
        {"cuDeviceGetName", (void *)fake_device_get_name},
        {"cuDeviceGetUuid", (void *)fake_device_get_uuid},
        {"cuDevicePrimaryCtxRetain", (void *)fake_primary_ctx_retain},
        {"cuDevicePrimaryCtxRelease", (void *)fake_primary_ctx_release},
        {"cuCtxSetCurrent", (void *)fake_ctx_set_current},
        {"cuCtxSynchronize", (void *)fake_ctx_synchronize},
        {"cuMemGetInfo", (void *)fake_mem_get_info},
        {"cuMemGetAllocationGranularity", (void *)fake_mem_get_allocation_granularity},
        {"cuMemCreate", (void *)fake_mem_create},
        {"cuMemRelease", (void *)fake_mem_release},
        {"cuMemAddressReserve", (void *)fake_mem_address_reserve},
        {"cuMemAddressFree", (void *)fake_mem_address_free},
        {"cuMemMap", (void *)fake_mem_map},
        {"cuMemUnmap", (void *)fake_mem_unmap},
        {"cuMemSetAccess", (void *)fake_mem_set_access},
        {"cuMemExportToShareableHandle", (void *)fake_mem_export},
        {"cuMemImportFromShareableHandle", (void *)fake_mem_import},
        {"cuMemcpyDtoD", (void *)fake_memcpy_dtod},
        {"cuMemcpyHtoD", (void *)fake_memcpy_htod},
        {"cuMemcpyDtoH", (void *)fake_memcpy_dtoh},
        {"cuMemcpy2D", (void *)fake_memcpy_2d},
        {"cuMemcpy2DUnaligned", (void *)fake_memcpy_2d_unaligned},
    };
    if (status != NULL)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    /* The backend pins one API version; anything else is a bug in it. */
    if (version != 12000 || flags != CU_GET_PROC_ADDRESS_DEFAULT)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (strcmp(symbol, table[i].name) == 0) {
            *pfn = table[i].fn;
            if (status != NULL)
                *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}
