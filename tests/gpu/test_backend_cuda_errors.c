/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend's failures, acted out by the test driver (fake_cuda.c,
 * loaded as libcuda.so.1 through LD_LIBRARY_PATH): each case picks a failure
 * with KVS_FAKE_CUDA before the backend first loads the driver, which is once
 * per process, so every case needs its own forked process (CK_FORK=yes).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "geometry.h"

static int open_kind(backend_kind_t kind, int device, uint64_t bytes, char *err, size_t errlen,
                     backend_t **out)
{
    backend_config_t cfg = {.kind = kind, .device = device, .bytes = bytes};
    *out = NULL;
    return backend_open(&cfg, out, err, errlen);
}

#define EXPECT_CUDA_ERROR(mode_name, code, text)                                                   \
    do {                                                                                           \
        setenv("KVS_FAKE_CUDA", mode_name, 1);                                                     \
        char err[512] = "";                                                                        \
        backend_t *b = NULL;                                                                       \
        ck_assert_int_eq(open_kind(BACKEND_CUDA, 0, 8 << 20, err, sizeof(err), &b), code);         \
        ck_assert_ptr_null(b);                                                                     \
        ck_assert_msg(strstr(err, text) != NULL, "message '%s' lacks '%s'", err, text);            \
        char probe[512] = "";                                                                      \
        ck_assert_int_eq(backend_cuda_probe(0, probe, sizeof(probe)),                              \
                         code == KVS_ENOMEM ? 0 : code);                                           \
    } while (0)

START_TEST(stub_library_is_no_driver)
{
    EXPECT_CUDA_ERROR("stub", KVS_ENODRIVER, "stub");
}
END_TEST

START_TEST(driver_without_device)
{
    EXPECT_CUDA_ERROR("nodevice", KVS_ENODEV, "found no CUDA device");
}
END_TEST

START_TEST(zero_devices)
{
    EXPECT_CUDA_ERROR("zero", KVS_ENODEV, "no CUDA device");
}
END_TEST

START_TEST(no_vmm)
{
    EXPECT_CUDA_ERROR("novmm", KVS_ENOTSUP, "virtual memory management");
}
END_TEST

START_TEST(no_posix_fd)
{
    EXPECT_CUDA_ERROR("nofd", KVS_ENOTSUP, "POSIX file descriptor");
}
END_TEST

START_TEST(old_driver)
{
    EXPECT_CUDA_ERROR("old", KVS_ENODRIVER, "CUDA 12.0 or newer");
}
END_TEST

START_TEST(create_out_of_memory)
{
    EXPECT_CUDA_ERROR("oom", KVS_ENOMEM, "cuMemCreate");
}
END_TEST

/* A GPU that is there but not ready is an error naming the fix, even for
 * auto: never a quiet fallback to host memory. */
START_TEST(fabric_manager_not_running)
{
    EXPECT_CUDA_ERROR("notready", KVS_EIO, "nvidia-fabricmanager");
    setenv("KVS_FAKE_CUDA", "notready", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_AUTO, 0, 8 << 20, err, sizeof(err), &b), KVS_EIO);
    ck_assert_ptr_nonnull(strstr(err, "CUDA_ERROR_SYSTEM_NOT_READY"));
}
END_TEST

START_TEST(driver_mismatch)
{
    EXPECT_CUDA_ERROR("mismatch", KVS_EIO, "does not match the loaded kernel module");
}
END_TEST

START_TEST(compat_package_unsupported)
{
    EXPECT_CUDA_ERROR("compat", KVS_EIO, "cuda-compat");
}
END_TEST

START_TEST(exclusive_process_mode)
{
    EXPECT_CUDA_ERROR("exclusive", KVS_ENOTSUP, "EXCLUSIVE_PROCESS");
    EXPECT_CUDA_ERROR("exclusive", KVS_ENOTSUP,
                      "set compute mode DEFAULT: nvidia-smi -i 0 -c DEFAULT");
}
END_TEST

START_TEST(prohibited_mode)
{
    EXPECT_CUDA_ERROR("prohibited", KVS_ENOTSUP, "set compute mode DEFAULT");
}
END_TEST

/* The daemon's export failure keeps the driver's error name. */
START_TEST(export_error_named)
{
    setenv("KVS_FAKE_CUDA", "noexport", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_CUDA, 0, 8 << 20, err, sizeof(err), &b), 0);
    int fds[BACKEND_MAX_SLABS];
    size_t n = 0;
    ck_assert_int_eq(backend_export(b, fds, BACKEND_MAX_SLABS, &n, err, sizeof(err)), KVS_EIO);
    ck_assert_msg(strstr(err, "cuMemExportToShareableHandle") != NULL &&
                      strstr(err, "CUDA_ERROR_NOT_PERMITTED") != NULL,
                  "%s", err);
    backend_close(b);
}
END_TEST

START_TEST(device_ordinal_missing)
{
    setenv("KVS_FAKE_CUDA", "ok", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_CUDA, 1, 8 << 20, err, sizeof(err), &b), KVS_ENODEV);
    ck_assert_ptr_nonnull(
        strstr(err, "CUDA device 1 does not exist: this host has 1 device (0..0)"));
    ck_assert_int_eq(open_kind(BACKEND_CUDA, -1, 8 << 20, err, sizeof(err), &b), KVS_ENODEV);
}
END_TEST

START_TEST(asked_more_than_free)
{
    setenv("KVS_FAKE_CUDA", "ok", 1);
    setenv("KVS_FAKE_CUDA_FREE_MIB", "64", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_CUDA, 0, 100 << 20, err, sizeof(err), &b), KVS_ENOMEM);
    ck_assert_ptr_nonnull(strstr(err, "asks 104857600 bytes"));
    ck_assert_ptr_nonnull(strstr(err, "only 67108864 bytes"));
}
END_TEST

START_TEST(auto_uses_host_without_driver)
{
    setenv("KVS_FAKE_CUDA", "stub", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_AUTO, 0, 8 << 20, err, sizeof(err), &b), 0);
    ck_assert_int_eq(backend_kind(b), BACKEND_HOST);
    ck_assert_ptr_nonnull(strstr(backend_detail(b), "cuda not used: libcuda.so.1 is the"));
    backend_close(b);
}
END_TEST

START_TEST(auto_uses_host_without_device)
{
    setenv("KVS_FAKE_CUDA", "zero", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_AUTO, 0, 8 << 20, err, sizeof(err), &b), 0);
    ck_assert_int_eq(backend_kind(b), BACKEND_HOST);
    backend_close(b);
}
END_TEST

/* A device that answers but cannot share memory is an error, not host. */
START_TEST(auto_does_not_hide_unsupported_device)
{
    setenv("KVS_FAKE_CUDA", "novmm", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_AUTO, 0, 8 << 20, err, sizeof(err), &b), KVS_ENOTSUP);
    ck_assert_ptr_null(b);
}
END_TEST

START_TEST(auto_uses_cuda_when_it_answers)
{
    setenv("KVS_FAKE_CUDA", "ok", 1);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_int_eq(open_kind(BACKEND_AUTO, 0, 8 << 20, err, sizeof(err), &b), 0);
    ck_assert_int_eq(backend_kind(b), BACKEND_CUDA);
    ck_assert_ptr_nonnull(strstr(backend_detail(b), "cuda device 0 (Fake CUDA device, GPU-f0f1"));
    backend_desc_t d;
    backend_describe(b, &d);
    ck_assert_uint_eq(d.size, 8 << 20);
    ck_assert_uint_eq((uint8_t)d.device_uuid[0], 0xf0);
    backend_close(b);
}
END_TEST

/* Slabs: equal, granularity-sized, adding up to the pool. */
START_TEST(slabs_cover_pool)
{
    setenv("KVS_FAKE_CUDA", "ok", 1);
    setenv("KVS_FAKE_CUDA_FREE_MIB", "40000", 1);
    char err[512] = "";
    backend_t *b = NULL;
    /* 33 GiB + 1 byte: three slabs of 16 GiB-ish, rounded up to 2 MiB */
    uint64_t want = (33ull << 30) + 1;
    ck_assert_msg(open_kind(BACKEND_CUDA, 0, want, err, sizeof(err), &b) == 0, "%s", err);
    backend_desc_t d;
    backend_describe(b, &d);
    ck_assert_uint_eq(d.size, (33ull << 30) + (2 << 20));
    ck_assert_uint_eq(d.n_slabs, 3);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < d.n_slabs; i++) {
        ck_assert_uint_eq(d.slab_bytes[i] % (2 << 20), 0);
        sum += d.slab_bytes[i];
    }
    ck_assert_uint_eq(sum, d.size);
    ck_assert_uint_eq(d.slab_bytes[0], d.slab_bytes[1]);
    ck_assert_uint_le(d.slab_bytes[2], d.slab_bytes[0]);
    /* the far end of the last slab is mapped and writable */
    uint8_t byte = 0x5a, back = 0;
    ck_assert_int_eq(backend_write(b, d.size - 1, &byte, 1), 0);
    ck_assert_int_eq(backend_read(b, d.size - 1, &back, 1), 0);
    ck_assert_uint_eq(back, 0x5a);
    backend_close(b);
}
END_TEST

/* The three ways a block copy can go: cuMemcpy2D (the test driver takes
 * pitches that are multiples of 2 MiB), cuMemcpy2DUnaligned (other pitches),
 * row by row (pitch above the driver's maximum, 4 MiB here). */
START_TEST(copy_block_each_path)
{
    setenv("KVS_FAKE_CUDA", "ok", 1);
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.2-1b", &g), 0); /* 16 KiB slots */
    const uint32_t pools[] = {128, 64, 512};                  /* pitch 2, 1, 8 MiB */
    uint64_t slot = geometry_slot_bytes(&g);
    uint8_t *want = malloc(slot), *got = malloc(slot);
    for (size_t p = 0; p < sizeof(pools) / sizeof(pools[0]); p++) {
        uint32_t nb = pools[p];
        char err[512] = "";
        backend_t *b = NULL;
        ck_assert_msg(
            open_kind(BACKEND_CUDA, 0, nb * geometry_block_bytes(&g), err, sizeof(err), &b) == 0,
            "%s", err);
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                memset(want, (int)(l * 2 + kv + 1 + p), slot);
                ck_assert_int_eq(backend_write(b, geometry_offset(&g, nb, l, kv, 1), want, slot),
                                 0);
            }
        ck_assert_int_eq(backend_copy_block(b, &g, nb, nb - 1, 1), 0);
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                memset(want, (int)(l * 2 + kv + 1 + p), slot);
                ck_assert_int_eq(backend_read(b, geometry_offset(&g, nb, l, kv, nb - 1), got, slot),
                                 0);
                ck_assert_msg(memcmp(got, want, slot) == 0, "pool of %u blocks, layer %u kv %u", nb,
                              l, kv);
            }
        backend_close(b);
    }
    free(want);
    free(got);
}
END_TEST

/* Where the kernel cannot be used, every copy still works through the copy
 * engine, and the log line (backend_detail) and the copy description say
 * why, once. fallback_mode: the stand-in driver's failure; detail_text: in
 * backend_detail (NULL: the kernel loads, its launch fails later);
 * describe_text: in backend_copy_describe after the copies. */
static void check_kernel_fallback(const char *fallback_mode, const char *detail_text,
                                  const char *describe_text)
{
    setenv("KVS_FAKE_CUDA", fallback_mode, 1);
    geometry_t g;
    ck_assert_int_eq(geometry_preset("llama-3.2-1b", &g), 0); /* 16 layers: 32 rows a block */
    const uint32_t nb = 64;
    uint64_t slot = geometry_slot_bytes(&g);
    char err[512] = "";
    backend_t *b = NULL;
    ck_assert_msg(open_kind(BACKEND_CUDA, 0, nb * geometry_block_bytes(&g), err, sizeof(err), &b) ==
                      0,
                  "%s", err);
    if (detail_text != NULL) {
        ck_assert_msg(strstr(backend_detail(b), detail_text) != NULL, "detail '%s' lacks '%s'",
                      backend_detail(b), detail_text);
        ck_assert_ptr_nonnull(strstr(backend_detail(b), "copies use the copy engine"));
        ck_assert_int_eq(backend_copy_mode_set(b, BACKEND_COPY_KERNEL), KVS_ENOTSUP);
    }
    uint8_t *want = malloc(slot), *got = malloc(slot);
    const uint32_t src[4] = {1, 2, 3, 4}, dst[4] = {60, 61, 62, 63};
    for (int i = 0; i < 4; i++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                memset(want, (int)(src[i] * 40 + l * 2 + kv), slot);
                ck_assert_int_eq(
                    backend_write(b, geometry_offset(&g, nb, l, kv, src[i]), want, slot), 0);
            }
    /* 128 rows: a batch large enough to be measured (or launched). */
    ck_assert_int_eq(backend_copy_blocks(b, &g, nb, dst, src, 4, NULL), 0);
    for (int i = 0; i < 4; i++)
        for (uint32_t l = 0; l < g.layers; l++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                memset(want, (int)(src[i] * 40 + l * 2 + kv), slot);
                ck_assert_int_eq(backend_read(b, geometry_offset(&g, nb, l, kv, dst[i]), got, slot),
                                 0);
                ck_assert_int_eq(memcmp(got, want, slot), 0);
            }
    char line[512];
    backend_copy_describe(b, line, sizeof(line));
    ck_assert_msg(strstr(line, describe_text) != NULL, "'%s' lacks '%s'", line, describe_text);
    ck_assert_msg(strstr(line, "0 kernel") != NULL, "%s", line);
    ck_assert_str_ne(backend_copy_block_path(b), "kvs_gather kernel");
    free(want);
    free(got);
    backend_close(b);
}

START_TEST(kernel_without_code_for_gpu)
{
#ifdef KVS_HAVE_CUDA_KERNEL
    check_kernel_fallback("nokernel", "CUDA_ERROR_NO_BINARY_FOR_GPU",
                          "copy engine (kernel not used: cuModuleLoadData failed");
#else
    check_kernel_fallback("nokernel", "built without nvcc", "built without nvcc");
#endif
}
END_TEST

START_TEST(kernel_on_driver_without_modules)
{
#ifdef KVS_HAVE_CUDA_KERNEL
    check_kernel_fallback("nomodule", "the driver has no cuModuleLoadData",
                          "kernel not used: the driver has no cuModuleLoadData");
#else
    check_kernel_fallback("nomodule", "built without nvcc", "built without nvcc");
#endif
}
END_TEST

/* The kernel loads, its first launch is refused: that batch and every later
 * one go through the engine, and the description says why. */
START_TEST(kernel_launch_refused)
{
#ifdef KVS_HAVE_CUDA_KERNEL
    check_kernel_fallback("nolaunch", NULL,
                          "kernel not used: cuLaunchKernel failed: "
                          "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES");
#else
    check_kernel_fallback("nolaunch", "built without nvcc", "built without nvcc");
#endif
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend_cuda_errors");
    TCase *tc = tcase_create("fake_driver");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, stub_library_is_no_driver);
    tcase_add_test(tc, driver_without_device);
    tcase_add_test(tc, zero_devices);
    tcase_add_test(tc, no_vmm);
    tcase_add_test(tc, no_posix_fd);
    tcase_add_test(tc, old_driver);
    tcase_add_test(tc, create_out_of_memory);
    tcase_add_test(tc, fabric_manager_not_running);
    tcase_add_test(tc, driver_mismatch);
    tcase_add_test(tc, compat_package_unsupported);
    tcase_add_test(tc, exclusive_process_mode);
    tcase_add_test(tc, prohibited_mode);
    tcase_add_test(tc, export_error_named);
    tcase_add_test(tc, device_ordinal_missing);
    tcase_add_test(tc, asked_more_than_free);
    tcase_add_test(tc, auto_uses_host_without_driver);
    tcase_add_test(tc, auto_uses_host_without_device);
    tcase_add_test(tc, auto_does_not_hide_unsupported_device);
    tcase_add_test(tc, auto_uses_cuda_when_it_answers);
    tcase_add_test(tc, slabs_cover_pool);
    tcase_add_test(tc, copy_block_each_path);
    tcase_add_test(tc, kernel_without_code_for_gpu);
    tcase_add_test(tc, kernel_on_driver_without_modules);
    tcase_add_test(tc, kernel_launch_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    /* each case loads the driver afresh: it must run in its own process */
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
