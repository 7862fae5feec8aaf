/* SPDX-License-Identifier: Apache-2.0 */
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
 * Every entry point pushes the pool's (primary) context and pops it before
 * returning, so the caller's current context (an engine's, in PyTorch or
 * vLLM) is what it was; copies run on a private non-blocking stream and wait
 * for that stream only, never for the engine's work. The daemon keeps the
 * primary context for the pool's life: cuMemGetInfo needs one, and the
 * driver documents neither that VMM allocations outlive the destruction of
 * the context they were made under nor the context's memory cost, so
 * allocating context-free stays unproven until a device run checks it.
 *
 * CUDA does not survive fork: a mapping used in a child of the process that
 * made it is freed without driver calls.
 *
 * The driver is loaded once per process and never unloaded.
 */
#include "backend_internal.h"
#include "gather.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#if !defined(CUDA_VERSION) || CUDA_VERSION < 12000
#error "the cuda backend needs the CUDA 12.0 (or newer) headers; configure with -DKVS_WITH_CUDA=OFF"
#endif

/* The driver API version every entry point is resolved for. */
#define CUDA_API_VERSION 12000
/* Slabs are about this big: large enough that a pool is "a few" of them
 * (mapping cost grows with their number), small enough that one
 * cuMemCreate does not need one huge contiguous physical run. */
#define CUDA_SLAB_TARGET (16ull << 30)
/* Overrides CUDA_SLAB_TARGET (bytes, a multiple of the granularity), so that
 * tests make many slabs out of a small pool. */
#define CUDA_SLAB_ENV "KVS_CUDA_SLAB_BYTES"

/* How backend_copy_block copies: not yet, one cuMemcpy2DAsync, one
 * cuMemcpyDtoDAsync per row (the driver refused the 2D copy's pitch), or the
 * gather kernel. */
enum { CUDA_COPY_UNKNOWN, CUDA_COPY_2D, CUDA_COPY_ROWS, CUDA_COPY_KERNEL };
/* Overrides the choice between copy engine and kernel: auto|engine|kernel. */
#define CUDA_COPY_ENV "KVS_CUDA_COPY"
/* A batch of at least this many rows is large enough to time both paths on:
 * the first such batch of each direction decides which one that direction
 * uses from then on. Smaller batches use the copy engine until then. */
#define CALIBRATE_MIN_ROWS 64
/* Blocks of the gather kernel per multiprocessor: enough to hide latency,
 * few enough that each one strides over several units. */
#define GATHER_BLOCKS_PER_SM 4

/* The directions a batch can have; a mixed batch always uses the engine. */
enum { DIR_D2D, DIR_D2H, DIR_H2D, DIR_COUNT, DIR_MIXED = DIR_COUNT };
static const char *const dir_names[DIR_COUNT] = {"pool->pool", "pool->host", "host->pool"};
/* What a direction uses: not measured yet (engine meanwhile), engine, kernel. */
enum { CHOICE_UNMEASURED, CHOICE_ENGINE, CHOICE_KERNEL };

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
    PFN_cuDeviceGetUuid_v9020 device_get_gpu_uuid; /* CUDA 11.0's: never a MIG UUID */
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
    PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release;
    PFN_cuCtxPushCurrent_v4000 ctx_push;
    PFN_cuCtxPopCurrent_v4000 ctx_pop;
    PFN_cuStreamCreate_v2000 stream_create;
    PFN_cuStreamDestroy_v4000 stream_destroy;
    PFN_cuStreamSynchronize_v2000 stream_synchronize;
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
    PFN_cuMemcpyDtoDAsync_v3020 memcpy_dtod_async;
    PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async;
    PFN_cuMemcpyDtoHAsync_v3020 memcpy_dtoh_async;
    PFN_cuMemcpy2DAsync_v3020 memcpy_2d_async;
    PFN_cuMemHostRegister_v6050 mem_host_register;
    PFN_cuMemHostUnregister_v4000 mem_host_unregister;
    PFN_cuEventCreate_v2000 event_create;
    PFN_cuEventDestroy_v4000 event_destroy;
    PFN_cuEventRecord_v2000 event_record;
    PFN_cuEventElapsedTime_v2000 event_elapsed;
    /* The gather kernel's; optional: without them the copy engine serves. */
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleUnload_v2000 module_unload;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuLaunchKernel_v4000 launch_kernel;
    PFN_cuMemAlloc_v3020 mem_alloc;
    PFN_cuMemFree_v3020 mem_free;
    PFN_cuMemHostGetDevicePointer_v3020 mem_host_get_device_pointer;
    const char *kernel_missing; /* the first of them the driver lacks, or NULL */
} cuda_api_t;

struct backend_cuda {
    pid_t pid; /* the process that made it */
    int ordinal;
    CUdevice dev;
    int mig;         /* the device is a MIG instance */
    int rdma;        /* slabs are created GPUDirect RDMA capable */
    CUcontext ctx;   /* the device's primary context, retained */
    CUstream stream; /* private, non-blocking: every copy runs here */
    CUdeviceptr va;
    uint64_t size;
    uint64_t granularity;
    uint64_t max_pitch;
    pthread_mutex_t copy_lock; /* copies from several threads take turns */
    int copy_2d;               /* which block copy works here: CUDA_COPY_* */
    int last_copy;             /* what the last block copy used */
    uint32_t n_slabs;
    uint32_t n_mapped;
    uint64_t slab_bytes[BACKEND_MAX_SLABS];
    CUmemGenericAllocationHandle handles[BACKEND_MAX_SLABS];
    /* The gather kernel (pools only, not importers' mappings): loaded, or
     * why not; its descriptors' device buffer and their host copy. */
    CUmodule module;
    CUfunction gather;
    char kernel_why[512]; /* empty when loaded */
    int sm_count;
    CUdeviceptr desc_dev;
    uint64_t desc_cap; /* descriptors desc_dev holds */
    gather_op_t *desc;
    uint64_t desc_host_cap;
    /* Registered host memory (tier 2) as the kernel sees it: host_dev is its
     * device address, 0 where the driver gave none. */
    uintptr_t host_base;
    uint64_t host_size;
    CUdeviceptr host_dev;
    /* The choice between copy engine and kernel, per direction. */
    backend_copy_mode_t mode;
    int choice[DIR_COUNT];
    float measured_ms[DIR_COUNT][2]; /* [dir][0 engine, 1 kernel], best of two */
    uint64_t kernel_batches, engine_batches;
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

/* What to do about a driver that is installed but not ready, or NULL. */
static const char *cuda_not_ready_fix(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_SYSTEM_NOT_READY:
        return "the GPUs are not ready: on NVSwitch systems (HGX/DGX) start the fabric manager "
               "(systemctl start nvidia-fabricmanager) and check nvidia-smi -q | grep -A2 Fabric";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        return "the NVIDIA user-space driver (libcuda) does not match the loaded kernel module: "
               "reboot after a driver update, or reinstall one driver version (compare "
               "nvidia-smi with /proc/driver/nvidia/version)";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
        return "a CUDA forward-compatibility libcuda (cuda-compat) is loaded on a GPU that does "
               "not support it: remove the cuda-compat directory from the library path or "
               "update the NVIDIA driver";
    default:
        return NULL;
    }
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
        /* 802-804: a GPU is there but not ready. An error, never a quiet
         * fallback to host memory for the life of the process. */
        const char *fix = cuda_not_ready_fix(r);
        char why[256];
        cuda_describe_error(r, why, sizeof(why));
        if (fix != NULL) {
            snprintf(api.reason, sizeof(api.reason), "cuInit failed: %s: %s", why, fix);
            api.rc = KVS_EIO;
            return;
        }
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
        {"cuCtxPushCurrent", (void **)&api.ctx_push},
        {"cuCtxPopCurrent", (void **)&api.ctx_pop},
        {"cuStreamCreate", (void **)&api.stream_create},
        {"cuStreamDestroy", (void **)&api.stream_destroy},
        {"cuStreamSynchronize", (void **)&api.stream_synchronize},
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
        {"cuMemcpyDtoDAsync", (void **)&api.memcpy_dtod_async},
        {"cuMemcpyHtoDAsync", (void **)&api.memcpy_htod_async},
        {"cuMemcpyDtoHAsync", (void **)&api.memcpy_dtoh_async},
        {"cuMemcpy2DAsync", (void **)&api.memcpy_2d_async},
        {"cuMemHostRegister", (void **)&api.mem_host_register},
        {"cuMemHostUnregister", (void **)&api.mem_host_unregister},
        {"cuEventCreate", (void **)&api.event_create},
        {"cuEventDestroy", (void **)&api.event_destroy},
        {"cuEventRecord", (void **)&api.event_record},
        {"cuEventElapsedTime", (void **)&api.event_elapsed},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (resolve(table[i].symbol, table[i].slot) != 0) {
            api.rc = KVS_ENODRIVER;
            return;
        }
    }
    /* Optional: the gather kernel's entry points. A driver without them
     * still serves, with the copy engine. */
    struct {
        const char *symbol;
        void **slot;
    } kernel_table[] = {
        {"cuModuleLoadData", (void **)&api.module_load_data},
        {"cuModuleUnload", (void **)&api.module_unload},
        {"cuModuleGetFunction", (void **)&api.module_get_function},
        {"cuLaunchKernel", (void **)&api.launch_kernel},
        {"cuMemAlloc", (void **)&api.mem_alloc},
        {"cuMemFree", (void **)&api.mem_free},
        {"cuMemHostGetDevicePointer", (void **)&api.mem_host_get_device_pointer},
    };
    for (size_t i = 0; i < sizeof(kernel_table) / sizeof(kernel_table[0]); i++) {
        CUdriverProcAddressQueryResult got = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (api.get_proc_address(kernel_table[i].symbol, kernel_table[i].slot, CUDA_API_VERSION,
                                 CU_GET_PROC_ADDRESS_DEFAULT, &got) != CUDA_SUCCESS ||
            got != CU_GET_PROC_ADDRESS_SUCCESS || *kernel_table[i].slot == NULL) {
            *kernel_table[i].slot = NULL;
            if (api.kernel_missing == NULL)
                api.kernel_missing = kernel_table[i].symbol;
        }
    }
    /* Optional: CUDA 11.0's cuDeviceGetUuid gives the GPU's UUID where the
     * current one gives a MIG instance's, which tells the two apart. */
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    void *v1 = NULL;
    if (api.get_proc_address("cuDeviceGetUuid", &v1, 11000, CU_GET_PROC_ADDRESS_DEFAULT, &found) ==
            CUDA_SUCCESS &&
        found == CU_GET_PROC_ADDRESS_SUCCESS)
        memcpy(&api.device_get_gpu_uuid, &v1, sizeof(v1));
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

/* As nvidia-smi -L prints it: GPU-... for a GPU, MIG-... for a MIG instance. */
static void format_uuid(const uint8_t u[BACKEND_UUID_LEN], int mig, char *buf, size_t len)
{
    snprintf(buf, len, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             mig ? "MIG" : "GPU", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
             u[11], u[12], u[13], u[14], u[15]);
}

static int device_attribute(CUdevice dev, CUdevice_attribute attr, int *value, char *err,
                            size_t errlen)
{
    CUresult r = api.device_get_attribute(value, attr, dev);
    return r == CUDA_SUCCESS ? 0 : cuda_fail(err, errlen, KVS_EIO, "cuDeviceGetAttribute", r);
}

/* Device `ordinal` is present and can serve a shared VMM pool; fills c's
 * ordinal, dev and rdma. */
static int cuda_device_check(int ordinal, struct backend_cuda *c, char *err, size_t errlen)
{
    int count = 0, vmm = 0, posix_fd = 0, mode = 0, rdma = 0;
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
    r = api.device_get(&c->dev, ordinal);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_ENODEV, "cuDeviceGet", r);
    c->ordinal = ordinal;
    int rc = device_attribute(c->dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, &vmm,
                              err, errlen);
    if (rc == 0)
        rc = device_attribute(c->dev,
                              CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                              &posix_fd, err, errlen);
    if (rc == 0)
        rc = device_attribute(c->dev, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, &mode, err, errlen);
    if (rc != 0)
        return rc;
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
    /* The daemon and every worker each hold a context on the device. */
    if (mode != CU_COMPUTEMODE_DEFAULT) {
        backend_errorf(err, errlen,
                       "CUDA device %d is in compute mode %s, which lets %s hold a context on "
                       "it, but the daemon and every worker need one: set compute mode DEFAULT: "
                       "nvidia-smi -i %d -c DEFAULT",
                       ordinal,
                       mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS ? "EXCLUSIVE_PROCESS"
                       : mode == CU_COMPUTEMODE_PROHIBITED      ? "PROHIBITED"
                                                                : "not DEFAULT",
                       mode == CU_COMPUTEMODE_PROHIBITED ? "no process" : "only one process",
                       ordinal);
        return KVS_ENOTSUP;
    }
    /* Only asked where the driver knows the attribute (CUDA 11.x-era
     * drivers answer "invalid value"): then RDMA is simply not requested. */
    c->rdma =
        api.device_get_attribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                 c->dev) == CUDA_SUCCESS &&
        rdma != 0;
    return 0;
}

int backend_cuda_probe(int device, char *err, size_t errlen)
{
    struct backend_cuda c;
    int rc = cuda_loaded(err, errlen);
    if (rc != 0)
        return rc;
    memset(&c, 0, sizeof(c));
    return cuda_device_check(device, &c, err, errlen);
}

/* GPUDirect RDMA can only be chosen here, at cuMemCreate: request it
 * wherever the device supports it, so that a NIC (NIXL/UCX, GDS) can later
 * read the pool directly. */
static CUmemAllocationProp slab_prop(const struct backend_cuda *c)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)c->dev;
    prop.allocFlags.gpuDirectRDMACapable = c->rdma ? 1 : 0;
    return prop;
}

/* Makes c's context current on this thread, above the caller's. */
static int cuda_enter(const struct backend_cuda *c)
{
    return api.ctx_push(c->ctx) == CUDA_SUCCESS ? 0 : KVS_EIO;
}

/* Gives the caller's context back. */
static void cuda_leave(void)
{
    CUcontext popped;
    api.ctx_pop(&popped);
}

/* Retains the primary context of c->dev, makes it current (cuda_leave
 * undoes that) and creates c's private stream in it. */
static int cuda_context(struct backend_cuda *c, char *err, size_t errlen)
{
    CUresult r = api.primary_ctx_retain(&c->ctx, c->dev);
    if (r != CUDA_SUCCESS) {
        c->ctx = NULL;
        return cuda_fail(err, errlen, KVS_EIO, "cuDevicePrimaryCtxRetain", r);
    }
    r = api.ctx_push(c->ctx);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, KVS_EIO, "cuCtxPushCurrent", r);
    /* Non-blocking: the legacy default stream, on which an engine may
     * queue work, never serialises with our copies. */
    r = api.stream_create(&c->stream, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        c->stream = NULL;
        cuda_leave();
        return cuda_fail(err, errlen, KVS_EIO, "cuStreamCreate", r);
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

/* Undoes whatever part of context, stream, handles and mapping c holds.
 * The caller's context stays current. cuMemUnmap waits for work that still
 * reads the range (the driver documents it as synchronizing), so an
 * engine's queued kernels finish before the memory goes. */
static void cuda_teardown(struct backend_cuda *c)
{
    if (c == NULL)
        return;
    if (c->pid != getpid()) {
        /* A forked child: the driver state is the parent's, not ours. */
        free(c);
        return;
    }
    int entered = c->ctx != NULL && cuda_enter(c) == 0;
    if (c->stream != NULL) {
        api.stream_synchronize(c->stream);
        api.stream_destroy(c->stream);
    }
    if (entered && c->desc_dev != 0)
        api.mem_free(c->desc_dev);
    if (entered && c->module != NULL)
        api.module_unload(c->module);
    free(c->desc);
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
    if (entered)
        cuda_leave();
    if (c->ctx != NULL)
        api.primary_ctx_release(c->dev);
    free(c);
}

#ifdef KVS_HAVE_CUDA_KERNEL
/* The fatbin nvcc made of gather.cu (gather_fatbin.c, generated); named
 * outside kvs_* so that libkvshare does not export it. */
extern const unsigned char kvsgpu_gather_fatbin[];
extern const size_t kvsgpu_gather_fatbin_size;
#endif

/* Loads the gather kernel into c's context (entered by the caller). Never
 * fails the pool: where the kernel cannot load (a build without nvcc, a
 * driver without the entry points, a GPU the fatbin has neither machine
 * code nor usable PTX for) c->kernel_why says why and copies use the copy
 * engine. */
static void cuda_kernel_load(struct backend_cuda *c)
{
#ifndef KVS_HAVE_CUDA_KERNEL
    snprintf(c->kernel_why, sizeof(c->kernel_why), "built without nvcc");
#else
    char why[256];
    if (api.kernel_missing != NULL) {
        snprintf(c->kernel_why, sizeof(c->kernel_why), "the driver has no %s", api.kernel_missing);
        return;
    }
    CUresult r = api.module_load_data(&c->module, kvsgpu_gather_fatbin);
    if (r != CUDA_SUCCESS) {
        c->module = NULL;
        cuda_describe_error(r, why, sizeof(why));
        snprintf(c->kernel_why, sizeof(c->kernel_why),
                 "cuModuleLoadData failed (no code in it for this GPU, or a driver older than "
                 "the toolkit that built it): %s",
                 why);
        return;
    }
    r = api.module_get_function(&c->gather, c->module, GATHER_KERNEL);
    if (r != CUDA_SUCCESS) {
        cuda_describe_error(r, why, sizeof(why));
        snprintf(c->kernel_why, sizeof(c->kernel_why), "cuModuleGetFunction(%s) failed: %s",
                 GATHER_KERNEL, why);
        api.module_unload(c->module);
        c->module = NULL;
        c->gather = NULL;
        return;
    }
    int sms = 0;
    if (api.device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->dev) !=
            CUDA_SUCCESS ||
        sms <= 0)
        sms = 1;
    c->sm_count = sms;
    c->kernel_why[0] = '\0';
#endif
}

/* The mode KVS_CUDA_COPY asks for (auto when unset or unknown). */
static backend_copy_mode_t cuda_copy_mode_env(void)
{
    const char *env = getenv(CUDA_COPY_ENV);
    if (env != NULL && strcmp(env, "engine") == 0)
        return BACKEND_COPY_ENGINE;
    if (env != NULL && strcmp(env, "kernel") == 0)
        return BACKEND_COPY_KERNEL;
    return BACKEND_COPY_AUTO;
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

/* The slab size to aim for: CUDA_SLAB_TARGET, or the test override. */
static int cuda_slab_target(const struct backend_cuda *c, uint64_t *out, char *err, size_t errlen)
{
    const char *env = getenv(CUDA_SLAB_ENV);
    *out = CUDA_SLAB_TARGET;
    if (env == NULL || env[0] == '\0')
        return 0;
    char *end = NULL;
    unsigned long long v = strtoull(env, &end, 10);
    if (*end != '\0' || v == 0 || v % c->granularity != 0) {
        backend_errorf(err, errlen,
                       "%s=%s: give a slab size in bytes, a multiple of the allocation "
                       "granularity %llu",
                       CUDA_SLAB_ENV, env, (unsigned long long)c->granularity);
        return KVS_EINVAL;
    }
    *out = v;
    return 0;
}

/* Splits c->size into equal slabs of about `target` bytes, the last one
 * smaller, and creates them. */
static int cuda_create_slabs(struct backend_cuda *c, uint64_t target, char *err, size_t errlen)
{
    CUmemAllocationProp prop = slab_prop(c);
    uint64_t n = (c->size + target - 1) / target;
    if (n > BACKEND_MAX_SLABS)
        n = BACKEND_MAX_SLABS;
    uint64_t slab = round_up((c->size + n - 1) / n, c->granularity);
    for (uint64_t left = c->size; left > 0; c->n_slabs++) {
        c->slab_bytes[c->n_slabs] = left < slab ? left : slab;
        left -= c->slab_bytes[c->n_slabs];
    }
    for (uint32_t i = 0; i < c->n_slabs; i++) {
        CUresult r = api.mem_create(&c->handles[i], c->slab_bytes[i], &prop, 0);
        if (r == CUDA_SUCCESS)
            continue;
        c->handles[i] = 0;
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            backend_errorf(err, errlen,
                           "not enough memory on CUDA device %d: cuMemCreate of slab %u "
                           "(%llu bytes) of a %llu-byte pool failed: ask for less or free "
                           "device memory",
                           c->ordinal, i, (unsigned long long)c->slab_bytes[i],
                           (unsigned long long)c->size);
            return KVS_ENOMEM;
        }
        char what[64];
        snprintf(what, sizeof(what), "cuMemCreate of slab %u", i);
        return cuda_fail(err, errlen, KVS_EIO, what, r);
    }
    return 0;
}

int backend_cuda_open(const backend_config_t *cfg, backend_t *b, char *err, size_t errlen)
{
    struct backend_cuda *c = NULL;
    int entered = 0;
    int rc = cuda_loaded(err, errlen);
    if (rc != 0)
        return rc;
    c = calloc(1, sizeof(*c));
    if (c != NULL)
        pthread_mutex_init(&c->copy_lock, NULL);
    if (c == NULL) {
        backend_errorf(err, errlen, "out of memory");
        return KVS_ENOMEM;
    }
    c->pid = getpid();
    c->ordinal = cfg->device;
    rc = cuda_device_check(cfg->device, c, err, errlen);
    if (rc != 0)
        goto fail;
    rc = cuda_context(c, err, errlen);
    if (rc != 0)
        goto fail;
    entered = 1;

    CUmemAllocationProp prop = slab_prop(c);
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

    uint64_t target;
    rc = cuda_slab_target(c, &target, err, errlen);
    if (rc == 0)
        rc = cuda_pool_size(cfg, c, &c->size, err, errlen);
    if (rc == 0)
        rc = cuda_create_slabs(c, target, err, errlen);
    if (rc == 0)
        rc = cuda_map(c, err, errlen);
    if (rc != 0)
        goto fail;

    CUuuid uuid, gpu_uuid;
    r = api.device_get_uuid(&uuid, c->dev);
    if (r != CUDA_SUCCESS) {
        rc = cuda_fail(err, errlen, KVS_EIO, "cuDeviceGetUuid", r);
        goto fail;
    }
    cuda_kernel_load(c);
    c->mode = cuda_copy_mode_env();
    if (c->mode == BACKEND_COPY_KERNEL && c->gather == NULL)
        c->mode = BACKEND_COPY_AUTO; /* nothing to force: the engine serves */
    c->mig = api.device_get_gpu_uuid != NULL &&
             api.device_get_gpu_uuid(&gpu_uuid, c->dev) == CUDA_SUCCESS &&
             memcmp(gpu_uuid.bytes, uuid.bytes, sizeof(uuid.bytes)) != 0;
    char name[128] = "unknown", uuid_text[48];
    api.device_get_name(name, (int)sizeof(name), c->dev);
    cuda_leave();
    memset(&b->desc, 0, sizeof(b->desc));
    b->desc.kind = BACKEND_CUDA;
    memcpy(b->desc.device_uuid, uuid.bytes, BACKEND_UUID_LEN);
    b->desc.size = c->size;
    b->desc.n_slabs = c->n_slabs;
    memcpy(b->desc.slab_bytes, c->slab_bytes, sizeof(c->slab_bytes));
    format_uuid(b->desc.device_uuid, c->mig, uuid_text, sizeof(uuid_text));
    b->kind = BACKEND_CUDA;
    b->size = c->size;
    b->base = (uintptr_t)c->va;
    b->cuda = c;
    snprintf(b->detail, sizeof(b->detail),
             "cuda device %d (%s, %s), %llu bytes in %u slab%s, granularity %llu, GPUDirect "
             "RDMA %s, driver CUDA %d.%d",
             c->ordinal, name, uuid_text, (unsigned long long)c->size, c->n_slabs,
             c->n_slabs == 1 ? "" : "s", (unsigned long long)c->granularity,
             c->rdma ? "capable" : "not supported", api.driver_version / 1000,
             api.driver_version % 1000 / 10);
    size_t used = strlen(b->detail);
    if (c->gather != NULL)
        snprintf(b->detail + used, sizeof(b->detail) - used,
                 ", copy kernel loaded (%d SMs; kernel or copy engine chosen by measurement%s)",
                 c->sm_count,
                 c->mode == BACKEND_COPY_ENGINE   ? ", " CUDA_COPY_ENV "=engine: engine only"
                 : c->mode == BACKEND_COPY_KERNEL ? ", " CUDA_COPY_ENV "=kernel: kernel only"
                                                  : "");
    else
        snprintf(b->detail + used, sizeof(b->detail) - used,
                 ", copy kernel not used (%s): copies use the copy engine", c->kernel_why);
    return 0;
fail:
    if (entered)
        cuda_leave();
    cuda_teardown(c);
    return rc;
}

void backend_cuda_close(backend_t *b)
{
    cuda_teardown(b->cuda);
    b->cuda = NULL;
    b->base = 0;
}

/* Exporting needs no context: the handles name the device. */
int backend_cuda_export(backend_t *b, int *fds, size_t max, size_t *n_fds, char *err, size_t errlen)
{
    struct backend_cuda *c = b->cuda;
    if (max < c->n_slabs) {
        backend_errorf(err, errlen, "room for %zu fds, the pool has %u slabs", max, c->n_slabs);
        return KVS_EINVAL;
    }
    for (uint32_t i = 0; i < c->n_slabs; i++) {
        int fd = -1;
        CUresult r =
            api.mem_export(&fd, c->handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS || fd < 0) {
            for (uint32_t j = 0; j < i; j++)
                close(fds[j]);
            char what[64];
            snprintf(what, sizeof(what), "cuMemExportToShareableHandle of slab %u", i);
            return cuda_fail(err, errlen, KVS_EIO, what, r);
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
    /* Not seen here, so whether it is a GPU or a MIG instance is unknown:
     * the UUID without its prefix matches either line of nvidia-smi -L. */
    char text[48];
    format_uuid(uuid, 0, text, sizeof(text));
    backend_errorf(err, errlen,
                   "the pool lives on the CUDA device with UUID %s (GPU-%s or MIG-%s in "
                   "nvidia-smi -L), which this process cannot see (it sees %d device%s): check "
                   "CUDA_VISIBLE_DEVICES and that the daemon and this process share the GPU",
                   text + 4, text + 4, text + 4, count, count == 1 ? "" : "s");
    return KVS_ENODEV;
}

int backend_cuda_import(const backend_desc_t *desc, const int *fds, size_t n_fds,
                        backend_mapping_t *m, char *err, size_t errlen)
{
    struct backend_cuda *c = NULL;
    int entered = 0;
    int rc = cuda_loaded(err, errlen);
    if (rc != 0)
        goto fail;
    c = calloc(1, sizeof(*c));
    if (c != NULL)
        pthread_mutex_init(&c->copy_lock, NULL);
    if (c == NULL) {
        rc = KVS_ENOMEM;
        backend_errorf(err, errlen, "out of memory");
        goto fail;
    }
    c->pid = getpid();
    rc = cuda_find_device(desc->device_uuid, c, err, errlen);
    if (rc == 0)
        rc = cuda_device_check(c->ordinal, c, err, errlen);
    if (rc == 0)
        rc = cuda_context(c, err, errlen);
    if (rc != 0)
        goto fail;
    entered = 1;
    CUmemAllocationProp prop = slab_prop(c);
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
    cuda_leave();
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    m->kind = BACKEND_CUDA;
    m->size = c->size;
    m->base = (uintptr_t)c->va;
    m->cuda = c;
    return 0;
fail:
    if (entered)
        cuda_leave();
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

/* The copies: c's context current for the call, the work on c's stream, then
 * a wait for that stream alone (the caller may then tell a worker the block
 * is ready, or read what it copied). */
static int cuda_copy_done(struct backend_cuda *c, CUresult queued)
{
    CUresult r = api.stream_synchronize(c->stream);
    cuda_leave();
    return queued == CUDA_SUCCESS && r == CUDA_SUCCESS ? 0 : KVS_EIO;
}

/* Queues one flat copy; host memory is registered memory. */
static CUresult cuda_queue_flat(struct backend_cuda *c, uintptr_t dst, int dst_host, uintptr_t src,
                                int src_host, uint64_t n)
{
    if (dst_host && !src_host)
        return api.memcpy_dtoh_async((void *)dst, (CUdeviceptr)src, n, c->stream);
    if (src_host && !dst_host)
        return api.memcpy_htod_async((CUdeviceptr)dst, (const void *)src, n, c->stream);
    if (dst_host && src_host)
        return CUDA_ERROR_INVALID_VALUE; /* the backend never copies host to host */
    return api.memcpy_dtod_async((CUdeviceptr)dst, (CUdeviceptr)src, n, c->stream);
}

/* Queues one strided copy on c's stream (context entered by the caller). */
static CUresult cuda_queue(struct backend_cuda *c, const backend_copy_op_t *op)
{
    if (op->height == 1)
        return cuda_queue_flat(c, op->dst, op->dst_host, op->src, op->src_host, op->width);
    int d2d = !op->dst_host && !op->src_host;
    uint64_t pitch = op->dst_pitch > op->src_pitch ? op->dst_pitch : op->src_pitch;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if ((!d2d || c->copy_2d != CUDA_COPY_ROWS) && c->max_pitch != 0 && pitch <= c->max_pitch) {
        CUDA_MEMCPY2D copy;
        memset(&copy, 0, sizeof(copy));
        if (op->src_host) {
            copy.srcMemoryType = CU_MEMORYTYPE_HOST;
            copy.srcHost = (const void *)op->src;
        } else {
            copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
            copy.srcDevice = (CUdeviceptr)op->src;
        }
        copy.srcPitch = op->src_pitch;
        if (op->dst_host) {
            copy.dstMemoryType = CU_MEMORYTYPE_HOST;
            copy.dstHost = (void *)op->dst;
        } else {
            copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
            copy.dstDevice = (CUdeviceptr)op->dst;
        }
        copy.dstPitch = op->dst_pitch;
        copy.WidthInBytes = op->width;
        copy.Height = op->height;
        /* cuMemcpy2DAsync may refuse device-to-device pitches that did not
         * come from cuMemAllocPitch (cuMemcpy2DUnaligned, which takes any,
         * has no stream variant): then rows, from now on (for device to
         * device; copies with host memory try again each time). */
        r = api.memcpy_2d_async(&copy, c->stream);
        if (d2d)
            c->copy_2d = r == CUDA_SUCCESS ? CUDA_COPY_2D : CUDA_COPY_ROWS;
    }
    if (d2d)
        c->last_copy = r == CUDA_SUCCESS ? CUDA_COPY_2D : CUDA_COPY_ROWS;
    /* Pitch beyond what one 2D copy allows (very large pools), or a pitch
     * the 2D copy refuses: one queued copy per row. */
    if (r != CUDA_SUCCESS) {
        r = CUDA_SUCCESS;
        for (uint64_t row = 0; r == CUDA_SUCCESS && row < op->height; row++)
            r = cuda_queue_flat(c, op->dst + row * op->dst_pitch, op->dst_host,
                                op->src + row * op->src_pitch, op->src_host, op->width);
    }
    return r;
}

/* --- The gather kernel and the choice between it and the copy engine ------- */

static int op_dir(const backend_copy_op_t *op)
{
    if (op->dst_host && op->src_host)
        return DIR_MIXED;
    return op->dst_host ? DIR_D2H : op->src_host ? DIR_H2D : DIR_D2D;
}

/* The direction all n ops share, or DIR_MIXED. */
static int batch_dir(const backend_copy_op_t *ops, size_t n)
{
    int dir = op_dir(&ops[0]);
    for (size_t i = 1; i < n && dir != DIR_MIXED; i++)
        if (op_dir(&ops[i]) != dir)
            dir = DIR_MIXED;
    return dir;
}

/* The address the kernel uses for a, which is device memory or (host) a
 * part of the registered host range that the driver mapped for the device;
 * 0 where the kernel cannot reach [a, a + extent). */
static uint64_t kernel_addr(const struct backend_cuda *c, uintptr_t a, int host, uint64_t extent)
{
    if (!host)
        return a;
    if (c->host_dev == 0 || a < c->host_base || a - c->host_base > c->host_size ||
        extent > c->host_size - (a - c->host_base))
        return 0;
    return c->host_dev + (a - c->host_base);
}

static uint64_t op_extent(uint64_t width, uint64_t height, uint64_t pitch)
{
    return (height - 1) * pitch + width;
}

/* Fills c->desc with the gather contract's ops for ops[0..n) and returns
 * the unit count in *n_units; 0 when the kernel cannot take the batch (host
 * memory it cannot reach, or no memory for the descriptors). */
static int kernel_describe(struct backend_cuda *c, const backend_copy_op_t *ops, size_t n,
                           uint64_t *n_units)
{
    if (n > UINT32_MAX)
        return 0; /* the launch counts ops in 32 bits */
    if (n > c->desc_host_cap) {
        gather_op_t *grown = realloc(c->desc, n * sizeof(*grown));
        if (grown == NULL)
            return 0;
        c->desc = grown;
        c->desc_host_cap = n;
    }
    uint64_t units = 0;
    for (size_t i = 0; i < n; i++) {
        const backend_copy_op_t *op = &ops[i];
        gather_op_t *g = &c->desc[i];
        g->dst =
            kernel_addr(c, op->dst, op->dst_host, op_extent(op->width, op->height, op->dst_pitch));
        g->src =
            kernel_addr(c, op->src, op->src_host, op_extent(op->width, op->height, op->src_pitch));
        if (g->dst == 0 || g->src == 0 || op->width == 0 || op->height == 0)
            return 0;
        g->width = op->width;
        g->height = op->height;
        g->dst_pitch = op->dst_pitch;
        g->src_pitch = op->src_pitch;
        g->units_per_row = (uint32_t)((op->width + GATHER_CHUNK - 1) / GATHER_CHUNK);
        g->unit0 = units;
        g->vec16 = ((g->dst | g->src | g->width | g->dst_pitch | g->src_pitch) & 15) == 0;
        units += g->units_per_row * op->height;
    }
    *n_units = units;
    return 1;
}

/* Queues the descriptors' upload and one launch on c's stream (context
 * entered). The descriptor buffer only grows, between batches, when the
 * stream is idle. */
static CUresult cuda_queue_kernel(struct backend_cuda *c, size_t n, uint64_t n_units)
{
    CUresult r;
    if (n > c->desc_cap) {
        uint64_t cap = n < 256 ? 256 : n;
        if (c->desc_dev != 0)
            api.mem_free(c->desc_dev);
        c->desc_dev = 0;
        c->desc_cap = 0;
        r = api.mem_alloc(&c->desc_dev, cap * sizeof(gather_op_t));
        if (r != CUDA_SUCCESS) {
            c->desc_dev = 0;
            return r;
        }
        c->desc_cap = cap;
    }
    r = api.memcpy_htod_async(c->desc_dev, c->desc, n * sizeof(gather_op_t), c->stream);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t grid = (uint64_t)c->sm_count * GATHER_BLOCKS_PER_SM;
    if (grid > n_units)
        grid = n_units;
    uint32_t n_ops = (uint32_t)n;
    void *params[] = {&c->desc_dev, &n_ops, &n_units};
    return api.launch_kernel(c->gather, (unsigned)grid, 1, 1, GATHER_THREADS, 1, 1, 0, c->stream,
                             params, NULL);
}

/* Runs the batch one way (kernel: c->desc already filled) and waits for it;
 * *ms gets the device time when timed. *queued tells whether the failure,
 * if any, came while queueing (nothing ran) rather than from the device. */
static CUresult cuda_run(struct backend_cuda *c, const backend_copy_op_t *ops, size_t n, int kernel,
                         uint64_t n_units, int timed, float *ms, int *queued)
{
    CUevent ev[2] = {NULL, NULL};
    CUresult r = CUDA_SUCCESS;
    if (timed) {
        r = api.event_create(&ev[0], CU_EVENT_DEFAULT);
        if (r == CUDA_SUCCESS)
            r = api.event_create(&ev[1], CU_EVENT_DEFAULT);
        if (r == CUDA_SUCCESS)
            r = api.event_record(ev[0], c->stream);
    }
    if (r == CUDA_SUCCESS && kernel)
        r = cuda_queue_kernel(c, n, n_units);
    for (size_t i = 0; !kernel && r == CUDA_SUCCESS && i < n; i++)
        r = cuda_queue(c, &ops[i]);
    *queued = r == CUDA_SUCCESS;
    if (r == CUDA_SUCCESS && timed)
        r = api.event_record(ev[1], c->stream);
    CUresult done = api.stream_synchronize(c->stream);
    if (r == CUDA_SUCCESS)
        r = done;
    if (r == CUDA_SUCCESS && timed)
        r = api.event_elapsed(ms, ev[0], ev[1]);
    for (int i = 0; i < 2; i++)
        if (ev[i] != NULL)
            api.event_destroy(ev[i]);
    if (r == CUDA_SUCCESS)
        (kernel ? &c->kernel_batches : &c->engine_batches)[0]++;
    return r;
}

/* The first large batch of a direction: engine, kernel, engine, kernel
 * (the copies write the same bytes each time: ranges do not overlap), and
 * the faster by its best time serves that direction from then on. */
static CUresult cuda_calibrate(struct backend_cuda *c, const backend_copy_op_t *ops, size_t n,
                               int dir, uint64_t n_units, float *ms, int *kernel_failed)
{
    float best[2] = {FLT_MAX, FLT_MAX};
    for (int i = 0; i < 4; i++) {
        int kernel = i % 2, queued = 0;
        float t = 0;
        CUresult r = cuda_run(c, ops, n, kernel, n_units, 1, &t, &queued);
        if (r != CUDA_SUCCESS) {
            *kernel_failed = kernel && queued == 0;
            return r;
        }
        if (t < best[kernel])
            best[kernel] = t;
    }
    c->measured_ms[dir][0] = best[0];
    c->measured_ms[dir][1] = best[1];
    c->choice[dir] = best[1] < best[0] ? CHOICE_KERNEL : CHOICE_ENGINE;
    *ms = best[1] < best[0] ? best[1] : best[0];
    return CUDA_SUCCESS;
}

/* Whether this batch goes through the kernel (and c->desc is filled for
 * it), and whether it is the one that decides its direction. */
static int cuda_pick(struct backend_cuda *c, const backend_copy_op_t *ops, size_t n, int dir,
                     uint64_t *n_units, int *calibrate)
{
    *calibrate = 0;
    if (c->gather == NULL || dir == DIR_MIXED || c->mode == BACKEND_COPY_ENGINE)
        return 0;
    if (c->mode == BACKEND_COPY_AUTO && c->choice[dir] == CHOICE_ENGINE)
        return 0;
    uint64_t rows = 0;
    for (size_t i = 0; i < n; i++)
        rows += ops[i].height;
    if (c->mode == BACKEND_COPY_AUTO && c->choice[dir] == CHOICE_UNMEASURED &&
        rows < CALIBRATE_MIN_ROWS)
        return 0;
    if (!kernel_describe(c, ops, n, n_units))
        return 0;
    *calibrate = c->mode == BACKEND_COPY_AUTO && c->choice[dir] == CHOICE_UNMEASURED;
    return 1;
}

int backend_cuda_copy_batch(struct backend_cuda *c, const backend_copy_op_t *ops, size_t n,
                            double *device_ms)
{
    if (c->pid != getpid())
        return KVS_EIO;
    pthread_mutex_lock(&c->copy_lock);
    if (cuda_enter(c) != 0) {
        pthread_mutex_unlock(&c->copy_lock);
        return KVS_EIO;
    }
    int dir = batch_dir(ops, n), calibrate = 0, queued = 1, kernel_failed = 0;
    uint64_t n_units = 0;
    int kernel = cuda_pick(c, ops, n, dir, &n_units, &calibrate);
    float ms = 0;
    CUresult r;
    if (calibrate) {
        r = cuda_calibrate(c, ops, n, dir, n_units, &ms, &kernel_failed);
    } else {
        r = cuda_run(c, ops, n, kernel, n_units, device_ms != NULL, &ms, &queued);
        kernel_failed = kernel && !queued;
    }
    if (r != CUDA_SUCCESS && kernel_failed) {
        /* The launch itself was refused (nothing ran): say why once, and
         * copy with the engine from now on. */
        char why[200];
        cuda_describe_error(r, why, sizeof(why));
        snprintf(c->kernel_why, sizeof(c->kernel_why), "cuLaunchKernel failed: %s", why);
        c->gather = NULL;
        kernel = 0;
        r = cuda_run(c, ops, n, 0, 0, device_ms != NULL, &ms, &queued);
    }
    /* An engine run has set last_copy itself (cuda_queue). */
    if (r == CUDA_SUCCESS && dir == DIR_D2D &&
        (calibrate ? c->choice[dir] == CHOICE_KERNEL : kernel))
        c->last_copy = CUDA_COPY_KERNEL;
    if (r == CUDA_SUCCESS && device_ms != NULL)
        *device_ms = ms;
    cuda_leave();
    pthread_mutex_unlock(&c->copy_lock);
    return r == CUDA_SUCCESS ? 0 : KVS_EIO;
}

int backend_cuda_copy_mode_set(struct backend_cuda *c, backend_copy_mode_t mode)
{
    if (mode != BACKEND_COPY_AUTO && mode != BACKEND_COPY_ENGINE && mode != BACKEND_COPY_KERNEL)
        return KVS_EINVAL;
    pthread_mutex_lock(&c->copy_lock);
    int rc = mode == BACKEND_COPY_KERNEL && c->gather == NULL ? KVS_ENOTSUP : 0;
    if (rc == 0)
        c->mode = mode;
    pthread_mutex_unlock(&c->copy_lock);
    return rc;
}

void backend_cuda_copy_describe(struct backend_cuda *c, char *buf, size_t len)
{
    pthread_mutex_lock(&c->copy_lock);
    size_t used = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (used < len)                                                                            \
            used += (size_t)snprintf(buf + used, len - used, __VA_ARGS__);                         \
    } while (0)
    if (c->gather == NULL) {
        PUT("copy engine (kernel not used: %s)", c->kernel_why);
    } else if (c->mode != BACKEND_COPY_AUTO) {
        PUT("%s, forced", c->mode == BACKEND_COPY_KERNEL ? "kernel" : "copy engine");
    } else {
        for (int d = 0; d < DIR_COUNT; d++) {
            if (c->choice[d] == CHOICE_UNMEASURED)
                PUT("%s%s not measured yet (copy engine)", d ? "; " : "", dir_names[d]);
            else
                PUT("%s%s %s (kernel %.3f ms, engine %.3f ms)", d ? "; " : "", dir_names[d],
                    c->choice[d] == CHOICE_KERNEL ? "kernel" : "copy engine",
                    (double)c->measured_ms[d][1], (double)c->measured_ms[d][0]);
        }
    }
    PUT("; batches: %llu kernel, %llu copy engine", (unsigned long long)c->kernel_batches,
        (unsigned long long)c->engine_batches);
#undef PUT
    pthread_mutex_unlock(&c->copy_lock);
}

int backend_cuda_pci(struct backend_cuda *c, int *domain, int *bus, int *device)
{
    char err[8];
    if (device_attribute(c->dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, domain, err, sizeof(err)) ||
        device_attribute(c->dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, bus, err, sizeof(err)) ||
        device_attribute(c->dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, device, err, sizeof(err)))
        return KVS_EIO;
    return 0;
}

int backend_cuda_host_register(struct backend_cuda *c, void *p, uint64_t n, char *err,
                               size_t errlen)
{
    if (c->pid != getpid() || cuda_enter(c) != 0) {
        backend_errorf(err, errlen, "cannot enter the device's context to register tier 2");
        return KVS_EIO;
    }
    /* DEVICEMAP: the gather kernel reads and writes it directly. */
    CUresult r =
        api.mem_host_register(p, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    CUdeviceptr dev = 0;
    if (r == CUDA_SUCCESS && c->gather != NULL &&
        api.mem_host_get_device_pointer(&dev, p, 0) != CUDA_SUCCESS)
        dev = 0; /* the copy engine serves tier copies */
    cuda_leave();
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, errlen, r == CUDA_ERROR_OUT_OF_MEMORY ? KVS_ENOMEM : KVS_EIO,
                         "cuMemHostRegister (pinning tier 2)", r);
    pthread_mutex_lock(&c->copy_lock);
    c->host_base = (uintptr_t)p;
    c->host_size = n;
    c->host_dev = dev;
    pthread_mutex_unlock(&c->copy_lock);
    return 0;
}

void backend_cuda_host_unregister(struct backend_cuda *c, void *p)
{
    if (c->pid != getpid() || cuda_enter(c) != 0)
        return;
    api.mem_host_unregister(p);
    cuda_leave();
    pthread_mutex_lock(&c->copy_lock);
    if (c->host_base == (uintptr_t)p) {
        c->host_base = 0;
        c->host_size = 0;
        c->host_dev = 0;
    }
    pthread_mutex_unlock(&c->copy_lock);
}

int backend_cuda_dtod(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t n)
{
    backend_copy_op_t op = {
        .dst = dst, .src = src, .width = n, .height = 1, .dst_pitch = n, .src_pitch = n};
    return backend_cuda_copy_batch(c, &op, 1, NULL);
}

int backend_cuda_dtod_2d(struct backend_cuda *c, uintptr_t dst, uintptr_t src, uint64_t width,
                         uint64_t height, uint64_t pitch)
{
    backend_copy_op_t op = {.dst = dst,
                            .src = src,
                            .width = width,
                            .height = height,
                            .dst_pitch = pitch,
                            .src_pitch = pitch};
    return backend_cuda_copy_batch(c, &op, 1, NULL);
}

const char *backend_cuda_copy_path(const struct backend_cuda *c)
{
    switch (c->last_copy) {
    case CUDA_COPY_2D:
        return "cuMemcpy2DAsync";
    case CUDA_COPY_ROWS:
        return "cuMemcpyDtoDAsync per row";
    case CUDA_COPY_KERNEL:
        return "kvs_gather kernel";
    default:
        return "none yet";
    }
}

int backend_cuda_htod(struct backend_cuda *c, uintptr_t dst, const void *src, uint64_t n)
{
    if (c->pid != getpid() || cuda_enter(c) != 0)
        return KVS_EIO;
    return cuda_copy_done(c, api.memcpy_htod_async((CUdeviceptr)dst, src, n, c->stream));
}

int backend_cuda_dtoh(struct backend_cuda *c, void *dst, uintptr_t src, uint64_t n)
{
    if (c->pid != getpid() || cuda_enter(c) != 0)
        return KVS_EIO;
    return cuda_copy_done(c, api.memcpy_dtoh_async(dst, (CUdeviceptr)src, n, c->stream));
}
