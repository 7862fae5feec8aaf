/* SPDX-License-Identifier: Apache-2.0 */
/* host backend: memfd pool, seals, export/import across processes, copies. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "geometry.h"
#include "tier_checks.h"

/* A small geometry: slot = 4 tokens x 2 heads x 8 dims x 2 B = 128 B. */
static const geometry_t small_geom = {
    .layers = 4, .kv_heads = 2, .head_dim = 8, .dtype = GEOMETRY_FP16, .block_tokens = 4};
#define NUM_BLOCKS 8

static backend_t *open_host(uint64_t bytes)
{
    backend_config_t cfg = {.kind = BACKEND_HOST, .bytes = bytes};
    backend_t *b = NULL;
    char err[256];
    int rc = backend_open(&cfg, &b, err, sizeof(err));
    ck_assert_msg(rc == 0, "backend_open: %d %s", rc, err);
    return b;
}

static void fill_pattern(uint8_t *buf, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)((i * 131u + seed * 7u + 1u) & 0xff);
}

/* Sends desc and fds in one message, as the daemon's Hello reply does. */
static int send_desc(int sock, const backend_desc_t *desc, const int *fds, size_t n)
{
    char control[CMSG_SPACE(sizeof(int) * BACKEND_MAX_SLABS)];
    memset(control, 0, sizeof(control));
    struct iovec iov = {.iov_base = (void *)desc, .iov_len = sizeof(*desc)};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * n)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * n);
    return sendmsg(sock, &msg, 0) == (ssize_t)sizeof(*desc) ? 0 : -1;
}

static int recv_desc(int sock, backend_desc_t *desc, int *fds, size_t *n)
{
    char control[CMSG_SPACE(sizeof(int) * BACKEND_MAX_SLABS)];
    struct iovec iov = {.iov_base = desc, .iov_len = sizeof(*desc)};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control,
                         .msg_controllen = sizeof(control)};
    if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(*desc))
        return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (cm == NULL || cm->cmsg_type != SCM_RIGHTS)
        return -1;
    *n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    memcpy(fds, CMSG_DATA(cm), *n * sizeof(int));
    return 0;
}

START_TEST(open_rounds_and_describes)
{
    backend_t *b = open_host(10000);
    ck_assert_int_eq(backend_kind(b), BACKEND_HOST);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    ck_assert_uint_ge(backend_size(b), 10000);
    ck_assert_uint_eq(backend_size(b) % page, 0);
    ck_assert_uint_ne(backend_base(b), 0);
    backend_desc_t d;
    backend_describe(b, &d);
    ck_assert_int_eq(d.kind, BACKEND_HOST);
    ck_assert_uint_eq(d.size, backend_size(b));
    ck_assert_uint_eq(d.n_slabs, 1);
    ck_assert_uint_eq(d.slab_bytes[0], d.size);
    static const uint8_t zero[BACKEND_UUID_LEN];
    ck_assert_int_eq(memcmp(d.device_uuid, zero, sizeof(zero)), 0);
    ck_assert_ptr_nonnull(strstr(backend_detail(b), "host memfd"));
    /* fresh memory reads as zeros, and the daemon's mapping is writable */
    uint8_t *base = (uint8_t *)backend_base(b);
    for (uint64_t i = 0; i < backend_size(b); i += 509)
        ck_assert_uint_eq(base[i], 0);
    base[backend_size(b) - 1] = 0xab;
    backend_close(b);
    backend_close(NULL);
}
END_TEST

START_TEST(open_errors)
{
    backend_t *b = (backend_t *)0x1;
    char err[256] = "";
    backend_config_t cfg = {.kind = BACKEND_HOST, .bytes = 0, .mem_fraction = 0.9};
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "explicit pool size"));
    ck_assert_ptr_eq(b, (backend_t *)0x1);
    cfg.kind = (backend_kind_t)9;
    cfg.bytes = 4096;
    ck_assert_int_eq(backend_open(&cfg, &b, err, sizeof(err)), KVS_EINVAL);
    ck_assert_int_eq(backend_open(NULL, &b, err, sizeof(err)), KVS_EINVAL);
    /* a NULL error buffer is allowed */
    ck_assert_int_eq(backend_open(NULL, &b, NULL, 0), KVS_EINVAL);
}
END_TEST

START_TEST(kind_names)
{
    backend_kind_t k;
    ck_assert_int_eq(backend_kind_parse("auto", &k), 0);
    ck_assert_int_eq(k, BACKEND_AUTO);
    ck_assert_int_eq(backend_kind_parse("host", &k), 0);
    ck_assert_int_eq(k, BACKEND_HOST);
    ck_assert_int_eq(backend_kind_parse("CUDA", &k), 0);
    ck_assert_int_eq(k, BACKEND_CUDA);
    ck_assert_int_eq(backend_kind_parse("gpu", &k), KVS_EINVAL);
    ck_assert_int_eq(backend_kind_parse(NULL, &k), KVS_EINVAL);
    ck_assert_str_eq(backend_kind_name(BACKEND_AUTO), "auto");
    ck_assert_str_eq(backend_kind_name(BACKEND_HOST), "host");
    ck_assert_str_eq(backend_kind_name(BACKEND_CUDA), "cuda");
    ck_assert_ptr_null(backend_kind_name((backend_kind_t)5));
}
END_TEST

START_TEST(seals_hold)
{
    backend_t *b = open_host(1 << 16);
    int fds[BACKEND_MAX_SLABS];
    size_t n = 0;
    ck_assert_int_eq(backend_export(b, fds, BACKEND_MAX_SLABS, &n, NULL, 0), 0);
    ck_assert_uint_eq(n, 1);
    int seals = fcntl(fds[0], F_GET_SEALS);
    ck_assert_int_ge(seals, 0);
    ck_assert(seals & F_SEAL_SHRINK);
    ck_assert(seals & F_SEAL_GROW);
    ck_assert(seals & F_SEAL_SEAL);
    errno = 0;
    ck_assert_int_eq(ftruncate(fds[0], 4096), -1); /* shrink */
    ck_assert_int_eq(errno, EPERM);
    ck_assert_int_eq(ftruncate(fds[0], 1 << 20), -1);               /* grow */
    ck_assert_int_eq(fcntl(fds[0], F_ADD_SEALS, F_SEAL_WRITE), -1); /* sealed for good */
    /* the exported fd is close-on-exec and a new fd each time */
    ck_assert(fcntl(fds[0], F_GETFD) & FD_CLOEXEC);
    int again[BACKEND_MAX_SLABS];
    ck_assert_int_eq(backend_export(b, again, BACKEND_MAX_SLABS, &n, NULL, 0), 0);
    ck_assert_int_ne(again[0], fds[0]);
    ck_assert_int_eq(backend_export(b, again, 0, &n, NULL, 0), KVS_EINVAL);
    close(again[0]);
    close(fds[0]);
    backend_close(b);
}
END_TEST

/* The daemon side opens the pool only after the worker process exists, so the
 * worker can reach the memory only through the fd it is sent. */
START_TEST(cross_process_write_read)
{
    const uint32_t layer = 2, kv = 1, block = 5;
    uint64_t slot = geometry_slot_bytes(&small_geom);
    uint64_t offset = geometry_offset(&small_geom, NUM_BLOCKS, layer, kv, block);
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        backend_desc_t d;
        int fds[BACKEND_MAX_SLABS];
        size_t n = 0;
        char err[256];
        backend_mapping_t *m = NULL;
        if (recv_desc(sv[1], &d, fds, &n) != 0)
            _exit(10);
        if (backend_import(&d, fds, n, &m, err, sizeof(err)) != 0)
            _exit(11);
        if (fcntl(fds[0], F_GETFD) != -1) /* consumed */
            _exit(12);
        uint8_t *pat = malloc(slot);
        fill_pattern(pat, slot, 1);
        memcpy((uint8_t *)backend_mapping_base(m) + offset, pat, slot);
        char ack = 'w';
        if (write(sv[1], &ack, 1) != 1 || read(sv[1], &ack, 1) != 1)
            _exit(13);
        /* now read what the daemon side wrote into block 0 of layer 0 (K) */
        uint64_t at = geometry_offset(&small_geom, NUM_BLOCKS, 0, 0, 0);
        fill_pattern(pat, slot, 2);
        uint8_t *got = malloc(slot);
        if (backend_mapping_read(m, at, got, slot) != 0 || memcmp(got, pat, slot) != 0)
            _exit(14);
        free(pat);
        free(got);
        backend_unmap(m);
        _exit(0);
    }
    close(sv[1]);
    backend_t *b = open_host(NUM_BLOCKS * geometry_block_bytes(&small_geom));
    ck_assert_uint_ge(backend_size(b), NUM_BLOCKS * geometry_block_bytes(&small_geom));
    backend_desc_t d;
    backend_describe(b, &d);
    int fds[BACKEND_MAX_SLABS];
    size_t n = 0;
    ck_assert_int_eq(backend_export(b, fds, BACKEND_MAX_SLABS, &n, NULL, 0), 0);
    ck_assert_int_eq(send_desc(sv[0], &d, fds, n), 0);
    close(fds[0]); /* the daemon closes its copy once sent */
    char ack = 0;
    ck_assert_int_eq(read(sv[0], &ack, 1), 1);
    ck_assert_int_eq(ack, 'w');
    uint8_t *want = malloc(slot);
    fill_pattern(want, slot, 1);
    const uint8_t *base = (const uint8_t *)backend_base(b);
    ck_assert_int_eq(memcmp(base + offset, want, slot), 0);
    /* nothing else was touched */
    for (uint64_t i = 0; i < backend_size(b); i++)
        if (i < offset || i >= offset + slot)
            ck_assert_uint_eq(base[i], 0);
    fill_pattern(want, slot, 2);
    ck_assert_int_eq(
        backend_write(b, geometry_offset(&small_geom, NUM_BLOCKS, 0, 0, 0), want, slot), 0);
    ck_assert_int_eq(write(sv[0], &ack, 1), 1);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    free(want);
    close(sv[0]);
    backend_close(b);
}
END_TEST

/* A worker's mapping outlives the daemon's pool. */
START_TEST(mapping_outlives_close)
{
    backend_t *b = open_host(1 << 16);
    backend_desc_t d;
    backend_describe(b, &d);
    int fds[BACKEND_MAX_SLABS];
    size_t n = 0;
    ck_assert_int_eq(backend_export(b, fds, BACKEND_MAX_SLABS, &n, NULL, 0), 0);
    backend_mapping_t *m = NULL;
    char err[256];
    ck_assert_int_eq(backend_import(&d, fds, n, &m, err, sizeof(err)), 0);
    ck_assert_uint_eq(backend_mapping_size(m), d.size);
    ((uint8_t *)backend_base(b))[100] = 42;
    backend_close(b);
    ck_assert_uint_eq(((uint8_t *)backend_mapping_base(m))[100], 42);
    ck_assert_int_eq(backend_mapping_write(m, d.size - 1, "x", 1), 0);
    ck_assert_int_eq(backend_mapping_write(m, d.size, "x", 1), KVS_EINVAL);
    backend_unmap(m);
    backend_unmap(NULL);
}
END_TEST

START_TEST(import_rejects_bad_input)
{
    char err[256];
    backend_mapping_t *m = NULL;
    /* an unsealed memfd could shrink under the worker: refused */
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 8192), 0);
    backend_desc_t d = {.kind = BACKEND_HOST, .size = 8192, .n_slabs = 1, .slab_bytes = {8192}};
    ck_assert_int_eq(backend_import(&d, &fd, 1, &m, err, sizeof(err)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "sealed"));
    ck_assert_int_eq(fcntl(fd, F_GETFD), -1); /* consumed even on failure */

    backend_t *b = open_host(8192);
    backend_describe(b, &d);
    int fds[2];
    size_t n = 0;
    /* descriptor claims more than the file holds */
    ck_assert_int_eq(backend_export(b, fds, 2, &n, NULL, 0), 0);
    backend_desc_t big = d;
    big.size = big.slab_bytes[0] = 1 << 20;
    ck_assert_int_eq(backend_import(&big, fds, 1, &m, err, sizeof(err)), KVS_EINVAL);
    ck_assert_int_eq(fcntl(fds[0], F_GETFD), -1);
    /* slab count and fd count disagree */
    ck_assert_int_eq(backend_export(b, fds, 2, &n, NULL, 0), 0);
    fds[1] = dup(fds[0]);
    ck_assert_int_eq(backend_import(&d, fds, 2, &m, err, sizeof(err)), KVS_EINVAL);
    ck_assert_int_eq(fcntl(fds[0], F_GETFD), -1);
    ck_assert_int_eq(fcntl(fds[1], F_GETFD), -1);
    /* slabs do not add up to the size */
    ck_assert_int_eq(backend_export(b, fds, 2, &n, NULL, 0), 0);
    backend_desc_t odd = d;
    odd.size += 4096;
    ck_assert_int_eq(backend_import(&odd, fds, 1, &m, err, sizeof(err)), KVS_EINVAL);
    ck_assert_int_eq(fcntl(fds[0], F_GETFD), -1);
    /* unknown kind */
    ck_assert_int_eq(backend_export(b, fds, 2, &n, NULL, 0), 0);
    backend_desc_t alien = d;
    alien.kind = (backend_kind_t)7;
    ck_assert_int_eq(backend_import(&alien, fds, 1, &m, err, sizeof(err)), KVS_EINVAL);
    ck_assert_int_eq(fcntl(fds[0], F_GETFD), -1);
    ck_assert_ptr_null(m);
    backend_close(b);
}
END_TEST

START_TEST(copy_ranges)
{
    backend_t *b = open_host(1 << 16);
    uint8_t *base = (uint8_t *)backend_base(b);
    uint64_t size = backend_size(b);
    fill_pattern(base, 1000, 3);
    ck_assert_int_eq(backend_copy(b, 5000, 0, 1000), 0);
    ck_assert_int_eq(memcmp(base + 5000, base, 1000), 0);
    /* overlapping: memmove semantics on host */
    uint8_t want[1000];
    fill_pattern(want, 1000, 3);
    ck_assert_int_eq(backend_copy(b, 10, 0, 1000), 0);
    ck_assert_int_eq(memcmp(base + 10, want, 1000), 0);
    ck_assert_int_eq(backend_copy(b, size - 10, 0, 11), KVS_EINVAL);
    ck_assert_int_eq(backend_copy(b, 0, size - 10, 11), KVS_EINVAL);
    ck_assert_int_eq(backend_copy(b, UINT64_MAX, 0, 2), KVS_EINVAL);
    ck_assert_int_eq(backend_copy(b, size, 0, 0), 0);
    uint8_t buf[16];
    ck_assert_int_eq(backend_read(b, size - 16, buf, 16), 0);
    ck_assert_int_eq(backend_read(b, size - 15, buf, 16), KVS_EINVAL);
    ck_assert_int_eq(backend_write(b, 0, NULL, 1), KVS_EINVAL);
    backend_close(b);
}
END_TEST

START_TEST(copy_block_all_layers)
{
    const geometry_t *g = &small_geom;
    uint64_t slot = geometry_slot_bytes(g);
    backend_t *b = open_host(NUM_BLOCKS * geometry_block_bytes(g));
    uint8_t *pat = malloc(slot);
    for (uint32_t l = 0; l < g->layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
            fill_pattern(pat, slot, l * 2 + kv + 10);
            ck_assert_int_eq(backend_write(b, geometry_offset(g, NUM_BLOCKS, l, kv, 3), pat, slot),
                             0);
        }
    ck_assert_int_eq(backend_copy_block(b, g, NUM_BLOCKS, 6, 3), 0);
    uint8_t *got = malloc(slot);
    for (uint32_t l = 0; l < g->layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
            fill_pattern(pat, slot, l * 2 + kv + 10);
            ck_assert_int_eq(backend_read(b, geometry_offset(g, NUM_BLOCKS, l, kv, 6), got, slot),
                             0);
            ck_assert_int_eq(memcmp(got, pat, slot), 0);
            /* neighbours untouched */
            ck_assert_int_eq(backend_read(b, geometry_offset(g, NUM_BLOCKS, l, kv, 7), got, slot),
                             0);
            for (uint64_t i = 0; i < slot; i++)
                ck_assert_uint_eq(got[i], 0);
        }
    ck_assert_int_eq(backend_copy_block(b, g, NUM_BLOCKS, NUM_BLOCKS, 3), KVS_EINVAL);
    /* a layout bigger than the pool is refused */
    ck_assert_int_eq(backend_copy_block(b, g, NUM_BLOCKS * 100, 1, 3), KVS_EINVAL);
    free(pat);
    free(got);
    backend_close(b);
}
END_TEST

/* Tier 2: the round trip every backend passes (tier_checks.c). */
START_TEST(tier_round_trip)
{
    backend_t *b = open_host(NUM_BLOCKS * geometry_block_bytes(&small_geom));
    check_tier_round_trip(b, &small_geom, NUM_BLOCKS);
    backend_close(b);
}
END_TEST

/* In a child (as uid/gid 65534 when started as root: the peer of another
 * uid that received the fd): reopens the read-only tier-2 fd through
 * /proc/self/fd read-write and tries to write through it. Exits 0 when
 * every way to write is refused, 1 when a write got through, 2 when the
 * privileges could not be dropped. */
static void reopen_and_write(int ro_fd, uint64_t size, bool drop)
{
    if (drop && (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0))
        _exit(2);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", ro_fd);
    int rw = open(path, O_RDWR);
    if (rw < 0)
        _exit(0); /* the reopen itself refused: nothing to write through */
    uint8_t one = 0x5a;
    if (pwrite(rw, &one, 1, 0) == 1)
        _exit(1);
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
    if (p != MAP_FAILED) {
        ((volatile uint8_t *)p)[0] = one;
        _exit(1);
    }
    _exit(0);
}

/* Issue: a process of another uid that received the read-only tier-2 fd
 * reopened it read-write through /proc/<pid>/fd and wrote blocks that were
 * then served. The memfd is sealed against new writes (F_SEAL_FUTURE_WRITE):
 * such a reopen can neither write nor map writable, while the daemon's own
 * mapping (made before the seal) still writes. */
START_TEST(tier_reopen_cannot_write)
{
    backend_t *b = open_host(NUM_BLOCKS * geometry_block_bytes(&small_geom));
    char err[256] = "";
    uint64_t bytes = 4 * geometry_block_bytes(&small_geom);
    ck_assert_int_eq(backend_tier_open(b, bytes, err, sizeof(err)), 0);
    int ro = -1;
    ck_assert_int_eq(backend_tier_export_readonly(b, &ro, err, sizeof(err)), 0);
    int fl = fcntl(ro, F_GETFD);
    ck_assert_int_eq(fcntl(ro, F_SETFD, fl & ~FD_CLOEXEC), 0);
    bool root = geteuid() == 0;
    for (int drop = 0; drop <= (root ? 1 : 0); drop++) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0)
            reopen_and_write(ro, backend_tier_size(b), drop);
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "a reopen of the tier-2 fd wrote to it (%s, status %d)",
                      drop ? "as uid 65534" : "as the same uid", status);
    }
    if (!root)
        printf("tier_reopen_cannot_write: not root, the reopen was tried as this uid only\n");
    /* Nothing reached tier 2, and the daemon's own mapping still writes. */
    volatile uint8_t *t2 = (volatile uint8_t *)backend_tier_base(b);
    ck_assert_uint_eq(t2[0], 0);
    t2[0] = 7;
    ck_assert_uint_eq(t2[0], 7);
    close(ro);
    backend_close(b);
}
END_TEST

/* Writes text into dir/rel, making its folders. */
static void put_file(const char *dir, const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    for (char *p = path + strlen(dir) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            ck_assert(mkdir(path, 0700) == 0 || errno == EEXIST);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* The NUMA facts tier 2's placement reads, from a sysfs laid out by hand:
 * the nodes online, a device's node, and what a missing or odd file gives.
 * On the host backend nothing is placed, whatever the machine. */
START_TEST(numa_facts_from_sysfs)
{
    char dir[] = "/tmp/kvs-numa-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(backend_numa_nodes(dir), 1); /* no file: one node */
    ck_assert_int_eq(backend_pci_numa_node(dir, 0, 0x3b, 0), -1);
    static const struct {
        const char *online;
        int nodes;
    } cases[] = {{"0\n", 1}, {"0-1\n", 2}, {"0,2-3\n", 3}, {"0-7\n", 8}, {"junk\n", 1}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        put_file(dir, "devices/system/node/online", cases[i].online);
        ck_assert_int_eq(backend_numa_nodes(dir), cases[i].nodes);
    }
    put_file(dir, "bus/pci/devices/0000:3b:00.0/numa_node", "1\n");
    put_file(dir, "bus/pci/devices/0001:c1:02.0/numa_node", "-1\n");
    ck_assert_int_eq(backend_pci_numa_node(dir, 0, 0x3b, 0), 1);
    ck_assert_int_eq(backend_pci_numa_node(dir, 1, 0xc1, 2), -1);
    ck_assert_int_eq(backend_pci_numa_node(dir, 0, 0x3c, 0), -1);

    backend_t *b = open_host(NUM_BLOCKS * geometry_block_bytes(&small_geom));
    char err[256];
    ck_assert_int_eq(backend_tier_open(b, 4 * geometry_block_bytes(&small_geom), err, sizeof(err)),
                     0);
    ck_assert_int_eq(backend_tier_numa_node(b), -1);
    backend_close(b);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *host_suite(void)
{
    Suite *s = suite_create("backend_host");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, open_rounds_and_describes);
    tcase_add_test(tc, open_errors);
    tcase_add_test(tc, kind_names);
    tcase_add_test(tc, seals_hold);
    tcase_add_test(tc, cross_process_write_read);
    tcase_add_test(tc, mapping_outlives_close);
    tcase_add_test(tc, import_rejects_bad_input);
    tcase_add_test(tc, copy_ranges);
    tcase_add_test(tc, copy_block_all_layers);
    tcase_add_test(tc, tier_round_trip);
    tcase_add_test(tc, tier_reopen_cannot_write);
    tcase_add_test(tc, numa_facts_from_sysfs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    SRunner *sr = srunner_create(host_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
