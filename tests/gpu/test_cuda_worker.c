/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend inside an application that uses CUDA itself (PyTorch,
 * vLLM), on the strict test driver (fake_cuda.c, loaded as libcuda.so.1
 * through LD_LIBRARY_PATH):
 *
 *   - the driver is as strict as the documented one: host code cannot touch
 *     device memory; maps, unmaps, access and copies check their ranges;
 *   - every backend entry point leaves the caller's current context current;
 *   - copies wait for the backend's own stream, never for the application's
 *     queued work;
 *   - slabs are GPUDirect RDMA capable where the device supports it;
 *   - MIG instances print as MIG-..., and CUDA_VISIBLE_DEVICES may name a
 *     device by UUID.
 *
 * The test reaches the driver as an application would: dlopen and
 * cuGetProcAddress, plus two hooks of the test driver (queued copies per
 * stream, RDMA-capable allocations). Each case runs in its own process
 * (CK_FORK=yes): the driver's settings are read once per process.
 */
#include <check.h>
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "geometry.h"

#define POOL (8u << 20)
#define GRAN (2ull << 20)

typedef CUresult (*ctx_create_fn)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*ctx_pop_fn)(CUcontext *);
typedef CUresult (*primary_retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*stream_create_fn)(CUstream *, unsigned);
typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*htod_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
typedef int (*pending_fn)(CUstream);
typedef unsigned (*rdma_fn)(void);

/* Loads the driver in the backend (so cuInit has run), then hands out its
 * entry points. */
static void *sym(const char *name)
{
    static void *lib;
    if (lib == NULL) {
        char err[256] = "";
        ck_assert_msg(backend_cuda_probe(0, err, sizeof(err)) == 0, "%s", err);
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        ck_assert_ptr_nonnull(lib);
    }
    void *fn = dlsym(lib, name);
    ck_assert_msg(fn != NULL, "libcuda.so.1 has no %s", name);
    return fn;
}

/* An entry point as the backend gets them: cuGetProcAddress, CUDA 12.0. */
static void *proc(const char *name)
{
    get_proc_fn get;
    void *p = sym("cuGetProcAddress_v2"), *fn = NULL;
    memcpy(&get, &p, sizeof(p));
    ck_assert_int_eq(get(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, NULL), CUDA_SUCCESS);
    return fn;
}

#define FN(type, var, lookup)                                                                      \
    type var;                                                                                      \
    do {                                                                                           \
        void *p_ = lookup;                                                                         \
        memcpy(&var, &p_, sizeof(p_));                                                             \
    } while (0)

static backend_t *open_pool(void)
{
    backend_config_t cfg = {.kind = BACKEND_CUDA, .bytes = POOL};
    backend_t *b = NULL;
    char err[512] = "";
    ck_assert_msg(backend_open(&cfg, &b, err, sizeof(err)) == 0, "%s", err);
    return b;
}

static backend_mapping_t *import_pool(backend_t *b)
{
    backend_desc_t d;
    int fds[BACKEND_MAX_SLABS];
    size_t n = 0;
    char err[512] = "";
    backend_describe(b, &d);
    ck_assert_msg(backend_export(b, fds, BACKEND_MAX_SLABS, &n, err, sizeof(err)) == 0, "%s", err);
    backend_mapping_t *m = NULL;
    ck_assert_msg(backend_import(&d, fds, n, &m, err, sizeof(err)) == 0, "%s", err);
    return m;
}

static CUcontext current(void)
{
    FN(ctx_get_fn, get, sym("cuCtxGetCurrent"));
    CUcontext ctx = (CUcontext)(uintptr_t)1;
    ck_assert_int_eq(get(&ctx), CUDA_SUCCESS);
    return ctx;
}

/* ---- the driver is strict ------------------------------------------------ */

START_TEST(host_cannot_touch_device_memory)
{
    backend_t *b = open_pool();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        volatile const char *p = (volatile const char *)backend_base(b);
        char c = *p; /* a device pointer: must fault */
        (void)c;
        _exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(!(WIFEXITED(st) && WEXITSTATUS(st) == 0),
                  "host code read device memory through a device pointer");
    backend_close(b);
}
END_TEST

START_TEST(driver_checks_ranges)
{
    FN(primary_retain_fn, retain, proc("cuDevicePrimaryCtxRetain"));
    FN(ctx_set_fn, set, sym("cuCtxSetCurrent"));
    FN(reserve_fn, reserve, proc("cuMemAddressReserve"));
    FN(create_fn, create, proc("cuMemCreate"));
    FN(map_fn, map, proc("cuMemMap"));
    FN(unmap_fn, unmap, proc("cuMemUnmap"));
    FN(access_fn, set_access, proc("cuMemSetAccess"));
    FN(htod_fn, htod, proc("cuMemcpyHtoD"));
    CUcontext ctx;
    ck_assert_int_eq(retain(&ctx, 0), CUDA_SUCCESS);
    ck_assert_int_eq(set(ctx), CUDA_SUCCESS);
    CUdeviceptr va;
    ck_assert_int_eq(reserve(&va, 3 * GRAN, 0, 0, 0), CUDA_SUCCESS);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h;
    ck_assert_int_eq(create(&h, 2 * GRAN, &prop, 0), CUDA_SUCCESS);
    /* outside the reservation, then across its end */
    ck_assert_int_ne(map(va + 3 * GRAN, GRAN, 0, h, 0), CUDA_SUCCESS);
    ck_assert_int_ne(map(va + 2 * GRAN, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    ck_assert_int_eq(map(va, 2 * GRAN, 0, h, 0), CUDA_SUCCESS);
    ck_assert_int_ne(map(va + GRAN, GRAN, 0, h, 0), CUDA_SUCCESS); /* over a mapping */
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ck_assert_int_ne(set_access(va, 3 * GRAN, &acc, 1), CUDA_SUCCESS); /* partly mapped */
    char buf[16] = "0123456789abcde";
    ck_assert_int_ne(htod(va, buf, sizeof(buf)), CUDA_SUCCESS); /* no access yet */
    ck_assert_int_eq(set_access(va, 2 * GRAN, &acc, 1), CUDA_SUCCESS);
    ck_assert_int_eq(htod(va, buf, sizeof(buf)), CUDA_SUCCESS);
    ck_assert_int_ne(htod(va + 2 * GRAN - 1, buf, 2), CUDA_SUCCESS); /* past the mapping */
    ck_assert_int_ne(unmap(va, GRAN), CUDA_SUCCESS);                 /* a sub-range */
    ck_assert_int_eq(unmap(va, 2 * GRAN), CUDA_SUCCESS);
    ck_assert_int_ne(htod(va, buf, sizeof(buf)), CUDA_SUCCESS);
    FN(unmap_fn, address_free, proc("cuMemAddressFree"));
    FN(release_fn, release, proc("cuMemRelease"));
    ck_assert_int_eq(address_free(va, 3 * GRAN), CUDA_SUCCESS);
    ck_assert_int_eq(release(h), CUDA_SUCCESS);
}
END_TEST

/* ---- the caller's context -------------------------------------------------- */

/* Every entry point a worker (or the daemon) calls, with `want` current. */
static void entry_points_keep(CUcontext want)
{
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.2-1b", &g), 0);
    uint8_t buf[4096], back[4096];
    memset(buf, 0x5c, sizeof(buf));
    backend_t *b = open_pool();
    ck_assert_ptr_eq(current(), want);
    backend_mapping_t *m = import_pool(b);
    ck_assert_ptr_eq(current(), want);
    ck_assert_int_eq(backend_mapping_write(m, 4096, buf, sizeof(buf)), 0);
    ck_assert_ptr_eq(current(), want);
    ck_assert_int_eq(backend_mapping_read(m, 4096, back, sizeof(back)), 0);
    ck_assert_ptr_eq(current(), want);
    ck_assert_int_eq(memcmp(buf, back, sizeof(buf)), 0);
    ck_assert_int_eq(backend_write(b, 0, buf, sizeof(buf)), 0);
    ck_assert_int_eq(backend_read(b, 0, back, sizeof(back)), 0);
    ck_assert_int_eq(backend_copy(b, 1 << 20, 0, sizeof(buf)), 0);
    ck_assert_int_eq(backend_copy_block(b, &g, 8, 3, 1), 0);
    ck_assert_ptr_eq(current(), want);
    backend_unmap(m);
    ck_assert_ptr_eq(current(), want);
    backend_close(b);
    ck_assert_ptr_eq(current(), want);
}

START_TEST(caller_context_is_kept)
{
    FN(ctx_create_fn, create, sym("cuCtxCreate_v2"));
    FN(ctx_pop_fn, pop, sym("cuCtxPopCurrent_v2"));
    CUcontext sentinel = NULL;
    ck_assert_int_eq(create(&sentinel, 0, 0), CUDA_SUCCESS);
    ck_assert_ptr_eq(current(), sentinel);
    entry_points_keep(sentinel);
    /* and a thread with no context keeps none */
    CUcontext popped;
    ck_assert_int_eq(pop(&popped), CUDA_SUCCESS);
    ck_assert_ptr_null(current());
    entry_points_keep(NULL);
    FN(ctx_set_fn, destroy, sym("cuCtxDestroy_v2"));
    ck_assert_int_eq(destroy(sentinel), CUDA_SUCCESS);
}
END_TEST

/* ---- the application's queued work ------------------------------------------ */

START_TEST(copies_leave_engine_work_queued)
{
    FN(primary_retain_fn, retain, proc("cuDevicePrimaryCtxRetain"));
    FN(ctx_set_fn, set, sym("cuCtxSetCurrent"));
    FN(stream_create_fn, stream_create, sym("cuStreamCreate"));
    FN(stream_fn, stream_sync, sym("cuStreamSynchronize"));
    FN(stream_fn, stream_destroy, sym("cuStreamDestroy_v2"));
    FN(htod_async_fn, htod_async, sym("cuMemcpyHtoDAsync_v2"));
    FN(pending_fn, pending, sym("fake_cuda_pending"));
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.2-1b", &g), 0);

    /* The engine: the device's primary context, a blocking stream (as
     * PyTorch's default stream is), a copy queued on it. */
    CUcontext engine;
    ck_assert_int_eq(retain(&engine, 0), CUDA_SUCCESS);
    ck_assert_int_eq(set(engine), CUDA_SUCCESS);
    CUstream s;
    ck_assert_int_eq(stream_create(&s, 0), CUDA_SUCCESS);
    backend_t *b = open_pool();
    backend_mapping_t *m = import_pool(b);
    static uint8_t engine_bytes[4096], mine[4096], back[4096];
    memset(engine_bytes, 0xe7, sizeof(engine_bytes));
    memset(mine, 0x3b, sizeof(mine));
    ck_assert_int_eq(
        htod_async((CUdeviceptr)backend_mapping_base(m), engine_bytes, sizeof(engine_bytes), s),
        CUDA_SUCCESS);
    ck_assert_int_eq(pending(s), 1);

    /* The worker's copies are done when they return, and did not wait. */
    ck_assert_int_eq(backend_mapping_write(m, 1 << 20, mine, sizeof(mine)), 0);
    ck_assert_int_eq(backend_mapping_read(m, 1 << 20, back, sizeof(back)), 0);
    ck_assert_int_eq(memcmp(back, mine, sizeof(mine)), 0);
    ck_assert_int_eq(backend_copy_block(b, &g, 8, 5, 2), 0);
    ck_assert_int_eq(backend_copy(b, 3 << 20, 1 << 20, sizeof(mine)), 0);
    ck_assert_int_eq(backend_read(b, 3 << 20, back, sizeof(back)), 0);
    ck_assert_int_eq(memcmp(back, mine, sizeof(mine)), 0);
    ck_assert_msg(pending(s) == 1, "a backend copy waited for the engine's stream");

    ck_assert_int_eq(stream_sync(s), CUDA_SUCCESS);
    ck_assert_int_eq(backend_mapping_read(m, 0, back, sizeof(back)), 0);
    ck_assert_int_eq(memcmp(back, engine_bytes, sizeof(back)), 0);
    ck_assert_int_eq(stream_destroy(s), CUDA_SUCCESS);
    backend_unmap(m);
    backend_close(b);
}
END_TEST

/* ---- allocation properties and names ------------------------------------------ */

START_TEST(slabs_are_rdma_capable_where_supported)
{
    FN(rdma_fn, rdma_allocs, sym("fake_cuda_rdma_allocs"));
    setenv("KVS_CUDA_SLAB_BYTES", "2097152", 1);
    backend_t *b = open_pool();
    backend_desc_t d;
    backend_describe(b, &d);
    ck_assert_uint_eq(d.n_slabs, POOL / GRAN);
    ck_assert_uint_eq(rdma_allocs(), d.n_slabs);
    ck_assert_ptr_nonnull(strstr(backend_detail(b), "GPUDirect RDMA capable"));
    backend_close(b);
}
END_TEST

START_TEST(no_rdma_where_unsupported)
{
    setenv("KVS_FAKE_CUDA", "nordma", 1);
    FN(rdma_fn, rdma_allocs, sym("fake_cuda_rdma_allocs"));
    backend_t *b = open_pool();
    ck_assert_uint_eq(rdma_allocs(), 0);
    ck_assert_ptr_nonnull(strstr(backend_detail(b), "GPUDirect RDMA not supported"));
    backend_close(b);
}
END_TEST

START_TEST(mig_uuid_prints_as_mig)
{
    setenv("KVS_FAKE_CUDA_MIG", "1", 1);
    backend_t *b = open_pool();
    ck_assert_msg(strstr(backend_detail(b), "MIG-a0a1a2a3-a4a5-") != NULL, "%s", backend_detail(b));
    backend_close(b);
}
END_TEST

START_TEST(visible_devices_by_uuid)
{
    setenv("KVS_FAKE_CUDA_DEVICES", "2", 1);
    setenv("CUDA_VISIBLE_DEVICES", "GPU-f1f2f3f4-f5f6-f7f8-f9fa-fbfcfdfeff00", 1);
    backend_t *b = open_pool();
    ck_assert_msg(strstr(backend_detail(b), "cuda device 0 (Fake CUDA device, GPU-f1f2f3f4-") !=
                      NULL,
                  "%s", backend_detail(b));
    backend_close(b);
    char err[256];
    ck_assert_int_eq(backend_cuda_probe(1, err, sizeof(err)), KVS_ENODEV);
}
END_TEST

START_TEST(slab_size_override_checked)
{
    setenv("KVS_CUDA_SLAB_BYTES", "3000000", 1);
    backend_config_t cfg = {.kind = BACKEND_CUDA, .bytes = POOL};
    backend_t *b = NULL;
    char err[512] = "";
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "KVS_CUDA_SLAB_BYTES=3000000"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda_worker");
    TCase *tc = tcase_create("strict_driver");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, host_cannot_touch_device_memory);
    tcase_add_test(tc, driver_checks_ranges);
    tcase_add_test(tc, caller_context_is_kept);
    tcase_add_test(tc, copies_leave_engine_work_queued);
    tcase_add_test(tc, slabs_are_rdma_capable_where_supported);
    tcase_add_test(tc, no_rdma_where_unsupported);
    tcase_add_test(tc, mig_uuid_prints_as_mig);
    tcase_add_test(tc, visible_devices_by_uuid);
    tcase_add_test(tc, slab_size_override_checked);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
