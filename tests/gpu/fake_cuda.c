/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in libcuda.so.1 for tests on machines without a GPU. It implements
 * the part of the driver API that the cuda backend uses, as strictly as the
 * driver's documentation allows, so that a backend bug fails a test here
 * instead of on a device:
 *
 *   memory    an allocation is a memfd named after its physical device; an
 *             exported handle is a dup of it. A reserved range is PROT_NONE
 *             host address space, and device addresses are that host address
 *             plus FAKE_VA_BIAS, which is not a canonical x86-64/arm64
 *             address: host code that dereferences a device pointer faults,
 *             as it would on a GPU. cuMemMap must land inside a reservation
 *             on no other mapping; cuMemUnmap takes whole mappings only;
 *             cuMemSetAccess needs the whole range mapped and the device that
 *             owns the memory; only then is the memory readable. Every copy
 *             checks that each byte it touches is mapped and accessible to
 *             the current context's device.
 *   contexts  a per-thread stack (cuCtxPush/Pop/Get/SetCurrent), primary
 *             contexts with a retain count, and cuCtxCreate for tests.
 *   streams   cuStreamCreate (blocking or CU_STREAM_NON_BLOCKING); async
 *             copies are queued and run only when something waits for them:
 *             cuStreamSynchronize, cuCtxSynchronize, cuStreamDestroy, a
 *             cuMemUnmap (documented as synchronizing), or (for blocking
 *             streams) any work on the legacy default stream, which is what
 *             every synchronous cuMemcpy* is. A result read before its stream
 *             was waited for is stale, as it can be on a device.
 *   devices   KVS_FAKE_CUDA_DEVICES physical devices (default 1, at most 4),
 *             filtered and ordered by CUDA_VISIBLE_DEVICES (ordinals, GPU-
 *             or MIG- UUIDs or unique prefixes of them); KVS_FAKE_CUDA_MIG=1
 *             makes them MIG instances (cuDeviceGetUuid_v2 gives the MIG UUID,
 *             the CUDA 11.0 cuDeviceGetUuid the parent GPU's).
 *
 * KVS_FAKE_CUDA selects a failure to act out:
 *   ok (default) | stub (cuInit: CUDA_ERROR_STUB_LIBRARY) | nodevice
 *   (cuInit: CUDA_ERROR_NO_DEVICE) | notready, mismatch, compat (cuInit: 802,
 *   803, 804) | zero (no device counted) | novmm | nofd (attributes
 *   unsupported) | nordma (no GPUDirect RDMA with VMM) | exclusive |
 *   prohibited (compute mode) | old (a CUDA 11.8 driver) | oom (cuMemCreate
 *   fails) | noexport (cuMemExportToShareableHandle: not permitted) |
 *   hostcopyfail (every asynchronous copy from or to host memory, 2D or
 *   flat, fails with CUDA_ERROR_ILLEGAL_ADDRESS: a device that faults
 *   mid-transfer) | nokernel (cuModuleLoadData: CUDA_ERROR_NO_BINARY_FOR_GPU,
 *   a GPU the fatbin has no code for) | nolaunch (cuLaunchKernel:
 *   CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) | nomodule (the driver lacks
 *   cuModuleLoadData, as an old one would).
 *
 * Kernels: the stand-in runs none, but knows the one the backend launches,
 * kvs_gather (gpu/gather.h): cuModuleLoadData takes any fatbin image (it
 * checks the magic number), and a launch of kvs_gather is queued on its
 * stream like a copy and, when the stream runs, done on the CPU by the
 * contract of gather.h: units found by binary search over unit0, every
 * byte checked to be device memory or registered host memory mapped with
 * CU_MEMHOSTREGISTER_DEVICEMAP (through the address cuMemHostGetDevicePointer
 * gave, which differs from the host pointer), vec16 ops checked for 16-byte
 * alignment. A broken launch makes the next cuStreamSynchronize fail with
 * CUDA_ERROR_ILLEGAL_ADDRESS, as a faulting kernel would.
 * KVS_FAKE_CUDA_FREE_MIB sets the free memory (default 1024);
 * KVS_FAKE_CUDA_OOM_WHILE=path: cuMemCreate runs out of memory while that
 * file exists (a GPU still holding a previous pool).
 *
 * Test hooks (not driver API): fake_cuda_pending(stream) counts the copies
 * queued on a stream; fake_cuda_rdma_allocs() counts allocations made with
 * gpuDirectRDMACapable.
 *
 * Test code only: never installed, never loaded outside ctest.
 */
#include <cuda.h>
#include <errno.h>

#include "gather.h"
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FAKE_GRANULARITY (2ull << 20)
#define FAKE_MAX_DEVICES 4
#define FAKE_MAX_PITCH   (4u << 20) /* small, so that tests reach the row-by-row path */
#define FAKE_VA_BIAS     (1ull << 62)
#define FAKE_HOST_BIAS   (1ull << 61) /* device addresses of mapped host memory */
#define FAKE_SM_COUNT    8
#define FATBIN_MAGIC     0xBA55ED50u
#define FAKE_MAX_DEPTH   16
#define EXPORT           __attribute__((visibility("default")))

typedef struct fake_alloc {
    int fd;
    size_t size;
    int phys; /* the physical device that owns the memory */
} fake_alloc_t;

typedef struct fake_ctx {
    int phys;
    int refs; /* primary: retains; created: 1 until destroyed */
    int alive;
} fake_ctx_t;

typedef struct fake_range {
    CUdeviceptr va;
    size_t size;
    int phys;        /* mappings: the memory's device */
    unsigned access; /* mappings: bit per physical device with access */
} fake_range_t;

typedef struct fake_event {
    int recorded; /* queued on a stream, or done */
    int done;     /* the stream reached it: t is set */
    double t;     /* seconds, CLOCK_MONOTONIC */
} fake_event_t;

typedef struct fake_launch {
    CUdeviceptr ops;
    uint32_t n_ops;
    uint64_t n_units;
} fake_launch_t;

typedef struct fake_op {
    char *dst;
    const char *src;
    size_t n;
    fake_event_t *event;  /* non-NULL: an event record, not a copy */
    fake_launch_t launch; /* n_ops != 0: a kvs_gather launch */
} fake_op_t;

typedef struct fake_stream {
    fake_ctx_t *ctx;
    unsigned flags;
    fake_op_t *ops;
    size_t n_ops, cap;
    struct fake_stream *next;
} fake_stream_t;

static int initialised;
static int n_physical = 1;
static int n_visible;
static int visible[FAKE_MAX_DEVICES]; /* ordinal -> physical device */
static fake_ctx_t primary[FAKE_MAX_DEVICES];
static __thread CUcontext stack[FAKE_MAX_DEPTH];
static __thread int depth;
static size_t allocated;
static unsigned rdma_allocs;
static fake_range_t *reserved, *mapped;
static size_t n_reserved, n_mapped;
static fake_stream_t *streams;

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

static int mig(void)
{
    const char *m = getenv("KVS_FAKE_CUDA_MIG");
    return m != NULL && strcmp(m, "1") == 0;
}

static void uuid_of(int phys, int as_mig, unsigned char out[16])
{
    for (int i = 0; i < 16; i++)
        out[i] = (unsigned char)((as_mig ? 0xa0 : 0xf0) + i + phys);
}

static void uuid_text(int phys, int as_mig, char *buf, size_t len)
{
    unsigned char u[16];
    uuid_of(phys, as_mig, u);
    snprintf(buf, len, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             as_mig ? "MIG" : "GPU", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
             u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* One CUDA_VISIBLE_DEVICES entry: an ordinal, or a unique prefix of a GPU-
 * (or, in MIG mode, MIG-) UUID. -1 when it names nothing. */
static int parse_visible(const char *tok, size_t len)
{
    if (len > 0 && tok[0] >= '0' && tok[0] <= '9') {
        int v = atoi(tok);
        return v < n_physical ? v : -1;
    }
    int found = -1;
    for (int p = 0; p < n_physical; p++) {
        char text[48];
        uuid_text(p, mig(), text, sizeof(text));
        if (len >= 5 && len <= strlen(text) && strncasecmp(text, tok, len) == 0) {
            if (found >= 0)
                return -1; /* ambiguous */
            found = p;
        }
    }
    return found;
}

/* The driver's view of the devices, as cuInit builds it: like the driver,
 * an entry that names no device ends the list. */
static void find_devices(void)
{
    const char *n = getenv("KVS_FAKE_CUDA_DEVICES");
    n_physical = n != NULL ? atoi(n) : 1;
    if (n_physical < 1 || n_physical > FAKE_MAX_DEVICES)
        n_physical = 1;
    n_visible = 0;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (cvd == NULL) {
        for (int p = 0; p < n_physical; p++)
            visible[n_visible++] = p;
        return;
    }
    while (*cvd != '\0' && n_visible < FAKE_MAX_DEVICES) {
        size_t len = strcspn(cvd, ",");
        int p = parse_visible(cvd, len);
        if (p < 0)
            break;
        visible[n_visible++] = p;
        cvd += len;
        if (*cvd == ',')
            cvd++;
    }
}

static int devices(void)
{
    return is_mode("zero") ? 0 : n_visible;
}

static int ordinal_ok(int ordinal)
{
    return ordinal >= 0 && ordinal < devices();
}

static CUcontext current(void)
{
    return depth > 0 ? stack[depth - 1] : NULL;
}

static fake_ctx_t *current_ctx(void)
{
    return (fake_ctx_t *)(void *)current();
}

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!initialised)                                                                          \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)
#define NEED_CTX()                                                                                 \
    do {                                                                                           \
        NEED_INIT();                                                                               \
        if (current() == NULL || !current_ctx()->alive)                                            \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
    } while (0)

/* ---- streams ---------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static CUresult drain_error; /* a kernel that faulted while its stream ran */
static CUresult gather_run(const fake_launch_t *l);

static void stream_drain(fake_stream_t *s)
{
    for (size_t i = 0; i < s->n_ops; i++) {
        if (s->ops[i].launch.n_ops != 0) {
            CUresult r = gather_run(&s->ops[i].launch);
            if (r != CUDA_SUCCESS)
                drain_error = r;
        } else if (s->ops[i].event != NULL) {
            s->ops[i].event->t = now_s();
            s->ops[i].event->done = 1;
        } else {
            memmove(s->ops[i].dst, s->ops[i].src, s->ops[i].n);
        }
    }
    s->n_ops = 0;
}

/* Legacy default stream semantics: work on it waits for every blocking
 * stream of its context. ctx NULL: every stream (a device-wide sync). */
static void drain_streams(const fake_ctx_t *ctx, int blocking_only)
{
    for (fake_stream_t *s = streams; s != NULL; s = s->next)
        if ((ctx == NULL || s->ctx == ctx) &&
            (!blocking_only || (s->flags & CU_STREAM_NON_BLOCKING) == 0))
            stream_drain(s);
}

static fake_stream_t *stream_find(CUstream h)
{
    for (fake_stream_t *s = streams; s != NULL; s = s->next)
        if ((CUstream)(void *)s == h)
            return s;
    return NULL;
}

static int is_legacy(CUstream h)
{
    return h == NULL || h == CU_STREAM_LEGACY;
}

/* ---- address ranges ---------------------------------------------------------- */

static void *host_of(CUdeviceptr va)
{
    return (void *)(uintptr_t)(va - FAKE_VA_BIAS);
}

static int range_add(fake_range_t **set, size_t *n, fake_range_t r)
{
    fake_range_t *grown = realloc(*set, (*n + 1) * sizeof(**set));
    if (grown == NULL)
        return -1;
    grown[(*n)++] = r;
    *set = grown;
    return 0;
}

static void range_remove(fake_range_t *set, size_t *n, size_t i)
{
    set[i] = set[--*n];
}

static fake_range_t *mapping_at(CUdeviceptr va)
{
    for (size_t i = 0; i < n_mapped; i++)
        if (va >= mapped[i].va && va - mapped[i].va < mapped[i].size)
            return &mapped[i];
    return NULL;
}

/* [va, va + n) is covered by mappings without a gap; with phys >= 0, each
 * of them also gives that physical device access. */
static int covered(CUdeviceptr va, size_t n, int phys)
{
    while (n > 0) {
        fake_range_t *m = mapping_at(va);
        if (m == NULL || (phys >= 0 && !(m->access & (1u << phys))))
            return 0;
        size_t left = m->size - (size_t)(va - m->va);
        if (left >= n)
            return 1;
        va += left;
        n -= left;
    }
    return 1;
}

/* The host address of device range [va, va + n) for the current context's
 * device, or NULL when some byte of it is not mapped and accessible there. */
static char *device_range(CUdeviceptr va, size_t n)
{
    if (va < FAKE_VA_BIAS || n == 0 || va + n < va)
        return NULL;
    return covered(va, n, current_ctx()->phys) ? host_of(va) : NULL;
}

/* ---- the exported entry points ------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_mode("stub"))
        return CUDA_ERROR_STUB_LIBRARY;
    if (is_mode("nodevice"))
        return CUDA_ERROR_NO_DEVICE;
    if (is_mode("notready"))
        return CUDA_ERROR_SYSTEM_NOT_READY;
    if (is_mode("mismatch"))
        return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    if (is_mode("compat"))
        return CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE;
    if (!initialised)
        find_devices();
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

static const struct {
    CUresult code;
    const char *name;
} error_names[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
    {CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
};

EXPORT CUresult cuGetErrorName(CUresult error, const char **out)
{
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(error_names) / sizeof(error_names[0]); i++) {
        if (error_names[i].code == error) {
            *out = error_names[i].name;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
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
    if (!ordinal_ok(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_attribute(int *value, CUdevice_attribute attr, CUdevice dev)
{
    NEED_INIT();
    if (!ordinal_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        *value = !is_mode("novmm");
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        *value = !is_mode("nofd");
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
        *value = !is_mode("nordma");
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
        *value = is_mode("exclusive")    ? CU_COMPUTEMODE_EXCLUSIVE_PROCESS
                 : is_mode("prohibited") ? CU_COMPUTEMODE_PROHIBITED
                                         : CU_COMPUTEMODE_DEFAULT;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *value = FAKE_SM_COUNT;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
        *value = (int)FAKE_MAX_PITCH;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult fake_device_get_name(char *name, int len, CUdevice dev)
{
    NEED_INIT();
    if (!ordinal_ok(dev) || name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    strncpy(name, "Fake CUDA device", (size_t)len);
    name[len - 1] = '\0';
    return CUDA_SUCCESS;
}

/* cuDeviceGetUuid_v2 (CUDA 11.4 on): the MIG instance's UUID in MIG mode. */
static CUresult fake_device_get_uuid(CUuuid *uuid, CUdevice dev)
{
    NEED_INIT();
    if (!ordinal_ok(dev) || uuid == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    uuid_of(visible[dev], mig(), (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

/* cuDeviceGetUuid of CUDA 11.0: the GPU's UUID, MIG or not. */
static CUresult fake_device_get_uuid_v1(CUuuid *uuid, CUdevice dev)
{
    NEED_INIT();
    if (!ordinal_ok(dev) || uuid == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    uuid_of(visible[dev], 0, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

static CUresult fake_primary_ctx_retain(CUcontext *ctx, CUdevice dev)
{
    NEED_INIT();
    if (!ordinal_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (is_mode("prohibited"))
        return CUDA_ERROR_INVALID_DEVICE;
    fake_ctx_t *c = &primary[visible[dev]];
    c->phys = visible[dev];
    c->refs++;
    c->alive = 1;
    *ctx = (CUcontext)(void *)c;
    return CUDA_SUCCESS;
}

static CUresult fake_primary_ctx_release(CUdevice dev)
{
    NEED_INIT();
    if (!ordinal_ok(dev) || primary[visible[dev]].refs == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    fake_ctx_t *c = &primary[visible[dev]];
    if (--c->refs == 0) {
        drain_streams(c, 0);
        c->alive = 0;
    }
    return CUDA_SUCCESS;
}

static int ctx_valid(CUcontext h)
{
    const fake_ctx_t *c = (const fake_ctx_t *)(void *)h;
    return c != NULL && c->alive;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (ctx != NULL && !ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx == NULL) {
        if (depth > 0)
            depth--;
    } else if (depth == 0) {
        stack[depth++] = ctx;
    } else {
        stack[depth - 1] = ctx;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    NEED_INIT();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    NEED_INIT();
    if (!ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == FAKE_MAX_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    NEED_INIT();
    if (depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    depth--;
    if (ctx != NULL)
        *ctx = stack[depth];
    return CUDA_SUCCESS;
}

/* A context that is not a primary one (tests use it as "the application's
 * context"); it is pushed, as cuCtxCreate does. */
EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev)
{
    NEED_INIT();
    if (ctx == NULL || flags != 0 || !ordinal_ok(dev))
        return CUDA_ERROR_INVALID_VALUE;
    fake_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->phys = visible[dev];
    c->refs = 1;
    c->alive = 1;
    *ctx = (CUcontext)(void *)c;
    return cuCtxPushCurrent_v2(*ctx);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    NEED_INIT();
    fake_ctx_t *c = (fake_ctx_t *)(void *)ctx;
    if (!ctx_valid(ctx) || (c >= primary && c < primary + FAKE_MAX_DEVICES))
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < depth; i++)
        if (stack[i] == ctx)
            return CUDA_ERROR_CONTEXT_IS_DESTROYED; /* still current somewhere */
    drain_streams(c, 0);
    free(c);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    NEED_CTX();
    drain_streams(current_ctx(), 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *out, unsigned int flags)
{
    NEED_CTX();
    if (out == NULL || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    fake_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = current_ctx();
    s->flags = flags;
    s->next = streams;
    streams = s;
    *out = (CUstream)(void *)s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream h)
{
    NEED_INIT();
    fake_stream_t *s = stream_find(h);
    if (s == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    stream_drain(s);
    for (fake_stream_t **p = &streams; *p != NULL; p = &(*p)->next) {
        if (*p == s) {
            *p = s->next;
            break;
        }
    }
    free(s->ops);
    free(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream h)
{
    NEED_CTX();
    if (is_legacy(h)) {
        drain_streams(current_ctx(), 1);
        return CUDA_SUCCESS;
    }
    fake_stream_t *s = stream_find(h);
    if (s == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    stream_drain(s);
    CUresult r = drain_error;
    drain_error = CUDA_SUCCESS;
    return r;
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
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && ordinal_ok(prop->location.id);
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

/* Like the driver, needs no current context: the device is in prop. */
static CUresult fake_mem_create(CUmemGenericAllocationHandle *handle, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags)
{
    NEED_INIT();
    if (!prop_ok(prop) || flags != 0 || size == 0 || size % FAKE_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->allocFlags.gpuDirectRDMACapable && is_mode("nordma"))
        return CUDA_ERROR_NOT_SUPPORTED;
    const char *held = getenv("KVS_FAKE_CUDA_OOM_WHILE");
    if (is_mode("oom") || allocated + size > free_bytes() || (held && access(held, F_OK) == 0))
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_alloc_t *a = malloc(sizeof(*a));
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    char name[32];
    a->phys = visible[prop->location.id];
    snprintf(name, sizeof(name), "fake-cuda-dev%d", a->phys);
    a->fd = memfd_create(name, MFD_CLOEXEC);
    if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0) {
        if (a->fd >= 0)
            close(a->fd);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->size = size;
    allocated += size;
    if (prop->allocFlags.gpuDirectRDMACapable)
        rdma_allocs++;
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
    if (ptr == NULL || size == 0 || size % FAKE_GRANULARITY != 0 || addr != 0 || flags != 0 ||
        (alignment != 0 && alignment % FAKE_GRANULARITY != 0))
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_range_t r = {.va = (CUdeviceptr)(uintptr_t)p + FAKE_VA_BIAS, .size = size};
    if (range_add(&reserved, &n_reserved, r) != 0) {
        munmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = r.va;
    return CUDA_SUCCESS;
}

static CUresult fake_mem_address_free(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    for (size_t i = 0; i < n_reserved; i++) {
        if (reserved[i].va != ptr || reserved[i].size != size)
            continue;
        for (size_t j = 0; j < n_mapped;) {
            if (mapped[j].va >= ptr && mapped[j].va - ptr < size)
                range_remove(mapped, &n_mapped, j);
            else
                j++;
        }
        munmap(host_of(ptr), size);
        range_remove(reserved, &n_reserved, i);
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    NEED_INIT();
    fake_alloc_t *a = (fake_alloc_t *)(uintptr_t)handle;
    if (a == NULL || flags != 0 || size == 0 || offset % FAKE_GRANULARITY != 0 ||
        size % FAKE_GRANULARITY != 0 || ptr % FAKE_GRANULARITY != 0 || offset + size > a->size)
        return CUDA_ERROR_INVALID_VALUE;
    int inside = 0;
    for (size_t i = 0; i < n_reserved && !inside; i++)
        inside = ptr >= reserved[i].va && size <= reserved[i].size &&
                 ptr - reserved[i].va <= reserved[i].size - size;
    if (!inside)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n_mapped; i++)
        if (ptr < mapped[i].va + mapped[i].size && mapped[i].va < ptr + size)
            return CUDA_ERROR_INVALID_VALUE;
    fake_range_t r = {.va = ptr, .size = size, .phys = a->phys};
    if (range_add(&mapped, &n_mapped, r) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(host_of(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset);
    if (p == MAP_FAILED) {
        n_mapped--;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Whole mappings only: the range must start where one starts, end where
 * one ends, and cut none. Synchronizes, as the driver documents. */
static CUresult fake_mem_unmap(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    if (size == 0 || ptr + size < ptr)
        return CUDA_ERROR_INVALID_VALUE;
    for (CUdeviceptr va = ptr; va < ptr + size;) {
        fake_range_t *m = mapping_at(va);
        if (m == NULL || m->va != va || m->size > ptr + size - va)
            return CUDA_ERROR_INVALID_VALUE;
        va += m->size;
    }
    drain_streams(NULL, 0);
    for (size_t i = 0; i < n_mapped;) {
        if (mapped[i].va >= ptr && mapped[i].va - ptr < size)
            range_remove(mapped, &n_mapped, i);
        else
            i++;
    }
    void *p = mmap(host_of(ptr), size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult fake_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                    size_t count)
{
    NEED_INIT();
    if (desc == NULL || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ordinal_ok(desc->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    int phys = visible[desc->location.id];
    if (!covered(ptr, size, -1))
        return CUDA_ERROR_INVALID_VALUE;
    /* No peer access here: only the memory's own device may be given it. */
    for (CUdeviceptr va = ptr; va < ptr + size; va = mapping_at(va)->va + mapping_at(va)->size)
        if (mapping_at(va)->phys != phys)
            return CUDA_ERROR_INVALID_DEVICE;
    if (mprotect(host_of(ptr), size, PROT_READ | PROT_WRITE) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (CUdeviceptr va = ptr; va < ptr + size;) {
        fake_range_t *m = mapping_at(va);
        m->access |= 1u << phys;
        va = m->va + m->size;
    }
    return CUDA_SUCCESS;
}

static CUresult fake_mem_export(void *shareable, CUmemGenericAllocationHandle handle,
                                CUmemAllocationHandleType type, unsigned long long flags)
{
    NEED_INIT();
    fake_alloc_t *a = (fake_alloc_t *)(uintptr_t)handle;
    if (a == NULL || shareable == NULL || flags != 0 ||
        type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_mode("noexport"))
        return CUDA_ERROR_NOT_PERMITTED;
    int fd = dup(a->fd);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    memcpy(shareable, &fd, sizeof(fd));
    return CUDA_SUCCESS;
}

/* The physical device of an exported fd: its memfd's name says it. */
static int fd_device(int fd)
{
    char link[64], target[128];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n <= 0)
        return -1;
    target[n] = '\0';
    int phys = -1;
    if (sscanf(target, "/memfd:fake-cuda-dev%d", &phys) != 1 || phys < 0 ||
        phys >= FAKE_MAX_DEVICES)
        return -1;
    return phys;
}

static CUresult fake_mem_import(CUmemGenericAllocationHandle *handle, void *os_handle,
                                CUmemAllocationHandleType type)
{
    NEED_INIT();
    int fd = (int)(uintptr_t)os_handle;
    struct stat st;
    int phys = fd_device(fd);
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) != 0 ||
        st.st_size == 0 || (uint64_t)st.st_size % FAKE_GRANULARITY != 0 || phys < 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake_alloc_t *a = malloc(sizeof(*a));
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The driver does not take the caller's fd: keep our own. */
    a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    a->size = (size_t)st.st_size;
    a->phys = phys;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
    return CUDA_SUCCESS;
}

/* ---- copies ----------------------------------------------------------------------- */

/* Queues (or, on the legacy stream, runs) one copy of n bytes, or an event
 * record when ev is not NULL. */
static CUresult submit_op(CUstream h, char *dst, const char *src, size_t n, fake_event_t *ev)
{
    if (is_legacy(h)) {
        drain_streams(current_ctx(), 1);
        if (ev != NULL) {
            ev->t = now_s();
            ev->done = 1;
        } else {
            memmove(dst, src, n);
        }
        return CUDA_SUCCESS;
    }
    fake_stream_t *s = stream_find(h);
    if (s == NULL || s->ctx != current_ctx())
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->n_ops == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        fake_op_t *ops = realloc(s->ops, cap * sizeof(*ops));
        if (ops == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        s->ops = ops;
        s->cap = cap;
    }
    s->ops[s->n_ops++] = (fake_op_t){dst, src, n, ev, {0, 0, 0}};
    return CUDA_SUCCESS;
}

static CUresult submit(CUstream h, char *dst, const char *src, size_t n)
{
    return submit_op(h, dst, src, n, NULL);
}

/* ---- events: a record is queued like a copy and timestamped when its stream
 * runs it; elapsed time needs both ends done. ---------------------------------------- */

static CUresult fake_event_create(CUevent *out, unsigned int flags)
{
    NEED_CTX();
    if (out == NULL || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    fake_event_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (CUevent)(void *)e;
    return CUDA_SUCCESS;
}

static CUresult fake_event_destroy(CUevent h)
{
    NEED_INIT();
    if (h == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    free((fake_event_t *)(void *)h);
    return CUDA_SUCCESS;
}

static CUresult fake_event_record(CUevent h, CUstream s)
{
    NEED_CTX();
    fake_event_t *e = (fake_event_t *)(void *)h;
    if (e == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    e->recorded = 1;
    e->done = 0;
    return submit_op(s, NULL, NULL, 0, e);
}

static CUresult fake_event_elapsed(float *ms, CUevent start, CUevent end)
{
    NEED_INIT();
    const fake_event_t *a = (const fake_event_t *)(void *)start;
    const fake_event_t *b = (const fake_event_t *)(void *)end;
    if (ms == NULL || a == NULL || b == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!a->done || !b->done)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((b->t - a->t) * 1e3);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    NEED_CTX();
    if (is_mode("hostcopyfail"))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    char *d = device_range(dst, n);
    if (d == NULL || src == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return submit(s, d, src, n);
}

static CUresult fake_memcpy_dtoh_async(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    NEED_CTX();
    if (is_mode("hostcopyfail"))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    const char *p = device_range(src, n);
    if (p == NULL || dst == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return submit(s, dst, p, n);
}

static CUresult fake_memcpy_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    NEED_CTX();
    char *d = device_range(dst, n);
    const char *p = device_range(src, n);
    if (d == NULL || p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return submit(s, d, p, n);
}

static CUresult fake_memcpy_htod(CUdeviceptr dst, const void *src, size_t n)
{
    return cuMemcpyHtoDAsync_v2(dst, src, n, NULL);
}

static CUresult fake_memcpy_dtoh(void *dst, CUdeviceptr src, size_t n)
{
    return fake_memcpy_dtoh_async(dst, src, n, NULL);
}

static CUresult fake_memcpy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return fake_memcpy_dtod_async(dst, src, n, NULL);
}

/* ---- page-locked host memory: cuMemHostRegister records the range; copies
 * that name host memory in a 2D copy must lie in a registered range. -------------- */

#define FAKE_MAX_REGISTERED 8

static struct {
    char *p;
    size_t n;
    unsigned flags;
} registered[FAKE_MAX_REGISTERED];

static CUresult fake_mem_host_register(void *p, size_t n, unsigned int flags)
{
    NEED_CTX();
    if (p == NULL || n == 0 ||
        (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < FAKE_MAX_REGISTERED; i++)
        if (registered[i].p != NULL && (char *)p < registered[i].p + registered[i].n &&
            registered[i].p < (char *)p + n)
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    for (size_t i = 0; i < FAKE_MAX_REGISTERED; i++) {
        if (registered[i].p == NULL) {
            registered[i].p = p;
            registered[i].n = n;
            registered[i].flags = flags;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_mem_host_unregister(void *p)
{
    NEED_CTX();
    for (size_t i = 0; i < FAKE_MAX_REGISTERED; i++) {
        if (p != NULL && registered[i].p == p) {
            registered[i].p = NULL;
            registered[i].n = 0;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

static char *registered_range(const void *p, size_t n)
{
    for (size_t i = 0; i < FAKE_MAX_REGISTERED; i++)
        if (registered[i].p != NULL && (const char *)p >= registered[i].p && n <= registered[i].n &&
            (size_t)((const char *)p - registered[i].p) <= registered[i].n - n)
            return (char *)p;
    return NULL;
}

/* One row of a 2D copy: device memory through device_range, host memory
 * only when registered (the backend copies with pinned memory only). */
static char *copy_2d_row(CUmemorytype type, CUdeviceptr dev, const void *host, size_t offset,
                         size_t n)
{
    if (type == CU_MEMORYTYPE_DEVICE)
        return device_range(dev + offset, n);
    if (type == CU_MEMORYTYPE_HOST && host != NULL)
        return registered_range((const char *)host + offset, n);
    return NULL;
}

/* 2D copies between device memory and registered host memory, checked row
 * by row. aligned: like the driver's cuMemcpy2D*, refuses device-to-device
 * pitches it does not like (here: not a multiple of 2 MiB), for which
 * callers must use another copy. */
static CUresult copy_2d(const CUDA_MEMCPY2D *c, CUstream s, int aligned)
{
    NEED_CTX();
    if (c == NULL || c->srcPitch > FAKE_MAX_PITCH || c->dstPitch > FAKE_MAX_PITCH ||
        c->WidthInBytes > c->srcPitch || c->WidthInBytes > c->dstPitch)
        return CUDA_ERROR_INVALID_VALUE;
    int d2d = c->srcMemoryType == CU_MEMORYTYPE_DEVICE && c->dstMemoryType == CU_MEMORYTYPE_DEVICE;
    if (!d2d && is_mode("hostcopyfail"))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (aligned && d2d && (c->srcPitch % (2u << 20) != 0 || c->dstPitch % (2u << 20) != 0))
        return CUDA_ERROR_INVALID_VALUE;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t row = 0; row < c->Height; row++) {
            size_t d_off = c->dstXInBytes + (c->dstY + row) * c->dstPitch;
            size_t p_off = c->srcXInBytes + (c->srcY + row) * c->srcPitch;
            char *d =
                copy_2d_row(c->dstMemoryType, c->dstDevice, c->dstHost, d_off, c->WidthInBytes);
            const char *p =
                copy_2d_row(c->srcMemoryType, c->srcDevice, c->srcHost, p_off, c->WidthInBytes);
            if (d == NULL || p == NULL)
                return CUDA_ERROR_INVALID_VALUE;
            if (pass == 1) {
                CUresult r = submit(s, d, p, c->WidthInBytes);
                if (r != CUDA_SUCCESS)
                    return r;
            }
        }
    }
    return CUDA_SUCCESS;
}

static CUresult fake_memcpy_2d(const CUDA_MEMCPY2D *c)
{
    return copy_2d(c, NULL, 1);
}

static CUresult fake_memcpy_2d_unaligned(const CUDA_MEMCPY2D *c)
{
    return copy_2d(c, NULL, 0);
}

static CUresult fake_memcpy_2d_async(const CUDA_MEMCPY2D *c, CUstream s)
{
    return copy_2d(c, s, 1);
}

/* ---- the gather kernel, on the CPU --------------------------------------------------- */

static int fake_module; /* the one module handle: its address */
static int fake_function;

static CUresult fake_module_load_data(CUmodule *module, const void *image)
{
    NEED_CTX();
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t magic;
    memcpy(&magic, image, sizeof(magic));
    if (magic != FATBIN_MAGIC)
        return CUDA_ERROR_INVALID_IMAGE;
    if (is_mode("nokernel"))
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    *module = (CUmodule)(void *)&fake_module;
    return CUDA_SUCCESS;
}

static CUresult fake_module_unload(CUmodule module)
{
    NEED_INIT();
    return module == (CUmodule)(void *)&fake_module ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult fake_module_get_function(CUfunction *f, CUmodule module, const char *name)
{
    NEED_INIT();
    if (f == NULL || name == NULL || module != (CUmodule)(void *)&fake_module)
        return CUDA_ERROR_INVALID_HANDLE;
    if (strcmp(name, GATHER_KERNEL) != 0)
        return CUDA_ERROR_NOT_FOUND;
    *f = (CUfunction)(void *)&fake_function;
    return CUDA_SUCCESS;
}

/* cuMemAlloc: anonymous memory mapped as device memory of the current
 * context's device (a mapping like cuMemMap's, freed by cuMemFree). */
static CUresult fake_mem_alloc(CUdeviceptr *out, size_t n)
{
    NEED_CTX();
    if (out == NULL || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int phys = current_ctx()->phys;
    fake_range_t r = {(CUdeviceptr)(uintptr_t)p + FAKE_VA_BIAS, n, phys, 1u << phys};
    if (range_add(&mapped, &n_mapped, r) != 0) {
        munmap(p, n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = r.va;
    return CUDA_SUCCESS;
}

static CUresult fake_mem_free(CUdeviceptr va)
{
    NEED_CTX();
    for (size_t i = 0; i < n_mapped; i++) {
        if (mapped[i].va == va) {
            drain_streams(NULL, 0); /* cuMemFree waits for work on it */
            munmap(host_of(va), mapped[i].size);
            range_remove(mapped, &n_mapped, i);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_mem_host_get_device_pointer(CUdeviceptr *out, void *p, unsigned int flags)
{
    NEED_CTX();
    if (out == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < FAKE_MAX_REGISTERED; i++)
        if (registered[i].p != NULL && (char *)p >= registered[i].p &&
            (char *)p < registered[i].p + registered[i].n) {
            if (!(registered[i].flags & CU_MEMHOSTREGISTER_DEVICEMAP))
                return CUDA_ERROR_INVALID_VALUE;
            *out = (CUdeviceptr)(uintptr_t)p + FAKE_HOST_BIAS;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}

/* Where a kernel's address a..a+n is in this process: device memory, or
 * registered host memory mapped for the device (by its device address). */
static char *kernel_range(uint64_t a, size_t n)
{
    if (a >= FAKE_VA_BIAS)
        return device_range(a, n);
    if (a < FAKE_HOST_BIAS)
        return NULL; /* a host pointer: a kernel cannot use it */
    char *p = registered_range((const char *)(uintptr_t)(a - FAKE_HOST_BIAS), n);
    for (size_t i = 0; p != NULL && i < FAKE_MAX_REGISTERED; i++)
        if (registered[i].p != NULL && p >= registered[i].p &&
            p < registered[i].p + registered[i].n)
            return (registered[i].flags & CU_MEMHOSTREGISTER_DEVICEMAP) ? p : NULL;
    return NULL;
}

/* One launch of kvs_gather, by gather.h's contract, on the CPU. */
static CUresult gather_run(const fake_launch_t *l)
{
    const gather_op_t *ops = (const gather_op_t *)device_range(l->ops, l->n_ops * sizeof(*ops));
    if (ops == NULL || ops[0].unit0 != 0)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    const gather_op_t *last = &ops[l->n_ops - 1];
    if (last->unit0 + last->height * last->units_per_row != l->n_units)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (uint64_t u = 0; u < l->n_units; u++) {
        uint32_t lo = 0, hi = l->n_ops;
        while (hi - lo > 1) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (ops[mid].unit0 <= u)
                lo = mid;
            else
                hi = mid;
        }
        const gather_op_t *op = &ops[lo];
        if (op->units_per_row != (op->width + GATHER_CHUNK - 1) / GATHER_CHUNK)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        uint64_t local = u - op->unit0;
        uint64_t row = local / op->units_per_row;
        uint64_t begin = local % op->units_per_row * GATHER_CHUNK;
        uint64_t end = begin + GATHER_CHUNK < op->width ? begin + GATHER_CHUNK : op->width;
        uint64_t d = op->dst + row * op->dst_pitch + begin,
                 p = op->src + row * op->src_pitch + begin;
        if (op->vec16 && ((d | p | (end - begin)) & 15) != 0)
            return CUDA_ERROR_MISALIGNED_ADDRESS;
        char *dp = kernel_range(d, end - begin);
        const char *sp = kernel_range(p, end - begin);
        if (dp == NULL || sp == NULL)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        memmove(dp, sp, end - begin);
    }
    return CUDA_SUCCESS;
}

static CUresult fake_launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shared, CUstream h,
                                   void **params, void **extra)
{
    NEED_CTX();
    if (f != (CUfunction)(void *)&fake_function)
        return CUDA_ERROR_INVALID_HANDLE;
    if (params == NULL || extra != NULL || gx == 0 || gy != 1 || gz != 1 || bx != GATHER_THREADS ||
        by != 1 || bz != 1 || shared != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_mode("nolaunch"))
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    fake_launch_t l;
    memcpy(&l.ops, params[0], sizeof(l.ops));
    memcpy(&l.n_ops, params[1], sizeof(l.n_ops));
    memcpy(&l.n_units, params[2], sizeof(l.n_units));
    if (l.n_ops == 0 || l.n_units == 0 || gx > l.n_units)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_legacy(h)) {
        drain_streams(current_ctx(), 1);
        return gather_run(&l);
    }
    fake_stream_t *s = stream_find(h);
    if (s == NULL || s->ctx != current_ctx())
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = submit(h, NULL, NULL, 0);
    if (r == CUDA_SUCCESS)
        s->ops[s->n_ops - 1].launch = l;
    return r;
}

/* ---- test hooks ------------------------------------------------------------------- */

EXPORT int fake_cuda_pending(CUstream h)
{
    fake_stream_t *s = stream_find(h);
    return s != NULL ? (int)s->n_ops : -1;
}

EXPORT unsigned fake_cuda_rdma_allocs(void)
{
    return rdma_allocs;
}

/* ---- cuGetProcAddress --------------------------------------------------------------- */

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
        {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
        {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
        {"cuCtxPushCurrent", (void *)cuCtxPushCurrent_v2},
        {"cuCtxPopCurrent", (void *)cuCtxPopCurrent_v2},
        {"cuCtxSynchronize", (void *)cuCtxSynchronize},
        {"cuStreamCreate", (void *)cuStreamCreate},
        {"cuStreamDestroy", (void *)cuStreamDestroy_v2},
        {"cuStreamSynchronize", (void *)cuStreamSynchronize},
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
        {"cuMemcpyDtoDAsync", (void *)fake_memcpy_dtod_async},
        {"cuMemcpyHtoDAsync", (void *)cuMemcpyHtoDAsync_v2},
        {"cuMemcpyDtoHAsync", (void *)fake_memcpy_dtoh_async},
        {"cuMemcpy2D", (void *)fake_memcpy_2d},
        {"cuMemcpy2DUnaligned", (void *)fake_memcpy_2d_unaligned},
        {"cuMemcpy2DAsync", (void *)fake_memcpy_2d_async},
        {"cuMemHostRegister", (void *)fake_mem_host_register},
        {"cuMemHostUnregister", (void *)fake_mem_host_unregister},
        {"cuEventCreate", (void *)fake_event_create},
        {"cuEventDestroy", (void *)fake_event_destroy},
        {"cuEventRecord", (void *)fake_event_record},
        {"cuEventElapsedTime", (void *)fake_event_elapsed},
        {"cuModuleLoadData", (void *)fake_module_load_data},
        {"cuModuleUnload", (void *)fake_module_unload},
        {"cuModuleGetFunction", (void *)fake_module_get_function},
        {"cuLaunchKernel", (void *)fake_launch_kernel},
        {"cuMemAlloc", (void *)fake_mem_alloc},
        {"cuMemFree", (void *)fake_mem_free},
        {"cuMemHostGetDevicePointer", (void *)fake_mem_host_get_device_pointer},
    };
    if (status != NULL)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (flags != CU_GET_PROC_ADDRESS_DEFAULT)
        return CUDA_ERROR_INVALID_VALUE;
    /* The backend pins one API version, and asks CUDA 11.0's cuDeviceGetUuid
     * (the GPU's UUID even in MIG mode); anything else is a bug in it. */
    if (version == 11000 && strcmp(symbol, "cuDeviceGetUuid") == 0) {
        *pfn = (void *)fake_device_get_uuid_v1;
        if (status != NULL)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (version != 12000)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_mode("nomodule") && strcmp(symbol, "cuModuleLoadData") == 0)
        return CUDA_ERROR_NOT_FOUND;
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
