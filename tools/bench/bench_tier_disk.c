/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare-bench tier-copy --disk DIR: the disk tier (disk/disk.h)
 * against fio on the same file system, in the same run.
 *
 * Blocks of the model's geometry (--tokens / block_tokens of them) are
 * written into a tier file in DIR in one batch (slots 0..n-1, in order) and
 * read back in one batch; each phase's rate is the slots' bytes over the
 * time from submit to the batch's end. fio then writes and reads a file of
 * the same size in DIR with the same block size (one slot), O_DIRECT, the
 * same queue depth and the same engine (io_uring with registered buffers,
 * or psync with as many jobs as the queue depth when the tier runs on
 * threads), sequentially. The phases alternate with fio's within each round
 * (fio first on odd rounds); reported: each round's rates, the median over
 * rounds, and the tier as a percentage of fio two ways: the ratio of the
 * medians, and the median of each round's ratio (the tier against the fio
 * run next to it in time, which a shared virtual disk's drift over a run
 * moves much less). The tier's reads verify each slot's CRC and the
 * blocks are compared bitwise after the last round. Without fio on PATH the
 * tier's own figures are printed and fio's are said to be missing; on a file
 * system without O_DIRECT (tmpfs) it says so and exits 77. The blocks are
 * page-aligned (the tier reads and writes them in place), or with --data
 * unaligned 64 bytes off a page (copied through the tier's buffers), or with
 * --data daemon handed to the tier as kvshared hands them: each write's
 * block gathered into the tier's buffer by fill (a copy that checksums, as
 * kvshared's gather from tier 2's pieces), each read's drained out of it
 * (a copy, as kvshared's into the pool). Every buffer is touched before the
 * first round, so no round measures page faults (kvshared's memory is
 * long-lived).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"
#include "bench_tier_disk.h"
#include "crc32c.h"
#include "kvshare_status.h"
#include "disk.h"

#define MAX_ROUNDS 101

enum { P_TW, P_TR, P_FW, P_FR, N_P };
static const char *const pnames[N_P] = {"tier write", "tier read", "fio write", "fio read"};

typedef struct wait_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
} wait_t;

static void on_done(void *arg, disk_op_t *ops, size_t n)
{
    (void)ops;
    (void)n;
    wait_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* --data daemon: the blocks' source and destination, as kvshared's tier 2
 * and pool. */
typedef struct daemon_mem {
    const uint8_t *src;
    uint8_t *dst;
    uint64_t bb;
} daemon_mem_t;

static uint32_t gather(void *ctx, uint32_t i, void *out)
{
    const daemon_mem_t *m = ctx;
    return crc32c_copy(0, out, m->src + (size_t)i * m->bb, m->bb);
}

static int drain(void *ctx, uint32_t i, const void *in)
{
    const daemon_mem_t *m = ctx;
    memcpy(m->dst + (size_t)i * m->bb, in, m->bb);
    return 0;
}

/* One batch over all ops; returns its wall time in ns, or 0 when an op
 * failed. */
static uint64_t tier_batch(disk_t *td, bool write, disk_op_t *ops, size_t n)
{
    wait_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    uint64_t t0 = now_ns();
    if (disk_submit(td, write, ops, n, on_done, &w) != 0)
        return 0;
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    uint64_t t = now_ns() - t0;
    for (size_t i = 0; i < n; i++)
        if (ops[i].status != 0)
            return 0;
    return t;
}

/* fio's bandwidth in bytes/s for one sequential job, or a negative number
 * (no fio, or its output not understood). */
static double run_fio(const char *file, uint64_t bytes, uint64_t bs, uint32_t qd, bool uring,
                      bool write, const char *mem)
{
    char cmd[1024];
    if (uring)
        snprintf(cmd, sizeof(cmd),
                 "fio --name=kvs --filename=%s --size=%llu --bs=%llu --direct=1 "
                 "--ioengine=io_uring --fixedbufs=1 --iodepth=%u --rw=%s --mem=%s "
                 "--output-format=json 2>/dev/null",
                 file, (unsigned long long)bytes, (unsigned long long)bs, qd,
                 write ? "write" : "read", mem);
    else
        snprintf(cmd, sizeof(cmd),
                 "fio --name=kvs --filename=%s --bs=%llu --direct=1 --ioengine=psync "
                 "--numjobs=%u --size=%llu --offset_increment=%llu --group_reporting --rw=%s "
                 "--mem=%s --output-format=json 2>/dev/null",
                 file, (unsigned long long)bs, qd, (unsigned long long)(bytes / qd / bs * bs),
                 (unsigned long long)(bytes / qd / bs * bs), write ? "write" : "read", mem);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    static char out[1 << 20];
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = 0;
    int st = pclose(p);
    if (st != 0) {
        fprintf(stderr, "tier-copy --disk: fio exited with status %d: %s\n", st, cmd);
        return -1;
    }
    /* The job's "read" and "write" objects each have "bw_bytes" ("rw" :
     * "write" among the options is a string, not an object). */
    const char *sec = strstr(out, write ? "\"write\" : {" : "\"read\" : {");
    const char *bw = sec ? strstr(sec, "\"bw_bytes\"") : NULL;
    if (!bw)
        return -1;
    bw = strchr(bw, ':');
    return bw ? strtod(bw + 1, NULL) : -1;
}

/* Free huge pages of the default size (hugetlbfs, vm.nr_hugepages), from
 * /proc/meminfo: 0 when none or unknown. */
static uint64_t free_huge_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long n = 0, kb = 0;
    while (fgets(line, sizeof(line), f)) {
        (void)sscanf(line, "HugePages_Free: %llu", &n);
        (void)sscanf(line, "Hugepagesize: %llu kB", &kb);
    }
    fclose(f);
    return (uint64_t)n * kb * 1024;
}

/* Whether transparent huge pages can back memory that asks for them. */
static bool thp_on(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (f) {
        if (!fgets(line, sizeof(line), f))
            line[0] = 0;
        fclose(f);
    }
    return strstr(line, "[always]") || strstr(line, "[madvise]");
}

/* CPU time of this process (all its threads; not fio, a child), in ns. */
static uint64_t cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000ull +
           (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull;
}

/* The median of v[0..n) (v is left as it was). */
static double median(const double *in, uint32_t n)
{
    double v[MAX_ROUNDS];
    memcpy(v, in, n * sizeof(double));
    qsort(v, n, sizeof(double), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The disk tier's notes (io_uring that could not start, say), said on
 * stderr, as kvshared logs them. */
static void print_note(void *arg, disk_note_level_t level, const char *text)
{
    (void)arg;
    fprintf(stderr, "tier-copy --disk: %s: disk tier: %s\n",
            level == DISK_NOTE_ERROR ? "error" : "warning", text);
}

int bench_tier_disk(const bench_tier_disk_args_t *a)
{
    uint64_t bb = a->block_bytes;
    uint64_t hdr = DISK_HDR_FIXED + 4ull * a->block_tokens;
    uint64_t slot = (hdr + bb + DISK_ALIGN - 1) / DISK_ALIGN * DISK_ALIGN;
    uint32_t n = a->blocks;
    char tpath[1024], fpath[1024], err[256] = "";
    snprintf(tpath, sizeof(tpath), "%s/kvshare-bench-tier3", a->dir);
    snprintf(fpath, sizeof(fpath), "%s/kvshare-bench-fio", a->dir);
    unlink(tpath);
    disk_config_t cfg = {.path = tpath,
                         .bytes = DISK_ALIGN + (uint64_t)n * slot,
                         .block_bytes = bb,
                         .block_tokens = a->block_tokens,
                         .geometry_id = 1,
                         .io = a->threads ? DISK_IO_THREADS : DISK_IO_URING,
                         .queue_depth = a->qd,
                         .note = print_note};
    disk_t *td = NULL;
    int rc = disk_open(&cfg, &td, err, sizeof(err));
    if (rc != 0 && strstr(err, "without O_DIRECT")) {
        printf("tier-copy --disk: skipped: %s\n", err);
        return 77;
    }
    if (rc != 0) {
        fprintf(stderr, "tier-copy --disk: %s (%s)\n", err, kvs_status_text(rc));
        return 1;
    }
    bool uring = strncmp(disk_io_name(td), "io_uring", 8) == 0;
    /* Page-aligned blocks (as the host tier's) go to and from the disk in
     * place; 64 bytes off, each is copied through the tier's buffers. */
    size_t off = a->unaligned ? 64 : 0;
    /* Allocated as the tier's own I/O buffers are. */
    uint8_t *src_mem = disk_buffer_alloc((size_t)n * bb + DISK_ALIGN);
    uint8_t *dst_mem = disk_buffer_alloc((size_t)n * bb + DISK_ALIGN);
    uint8_t *src = src_mem ? src_mem + off : NULL, *dst = dst_mem ? dst_mem + off : NULL;
    disk_op_t *ops = calloc(n, sizeof(*ops));
    uint32_t *tokens = calloc(a->block_tokens, sizeof(uint32_t));
    int status = 1;
    if (!src || !dst || !ops || !tokens) {
        fprintf(stderr, "tier-copy --disk: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < (size_t)n * bb; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 12));
    memset(dst, 0, (size_t)n * bb);
    daemon_mem_t dmem = {src, dst, bb};
    /* fio's buffers: huge pages too where the machine has them reserved
     * (shmhuge: vm.nr_hugepages; fio cannot ask for transparent ones), else
     * its default, 4 KiB pages: an I/O of those is cut into more segments
     * (disk_buffer_alloc), which favours the tier, and the output says
     * so. One fio runs at a time: io_uring's one job holds qd buffers in
     * one segment, psync's qd jobs one each. */
    uint64_t hp = 2u << 20, per_job = uring ? (uint64_t)a->qd * slot : slot;
    uint64_t need = (uring ? 1 : a->qd) * ((per_job + hp - 1) / hp + 1) * hp;
    const char *fio_mem = free_huge_bytes() >= need ? "shmhuge" : "malloc";
    static double rate[N_P][MAX_ROUNDS];
    bool have_fio = true;
    uint64_t tier_cpu = 0, tier_wall = 0;
    for (uint32_t r = 0; r < a->rounds; r++) {
        for (int k = 0; k < 2; k++) {
            bool tier_now = (k == 0) == (r % 2 == 0);
            if (tier_now) {
                for (uint32_t i = 0; i < n; i++) {
                    ops[i] = (disk_op_t){.slot = i, .data = src + (size_t)i * bb};
                    if (a->daemon)
                        ops[i] = (disk_op_t){
                            .slot = i, .fill = gather, .fill_ctx = &dmem, .fill_src = i};
                    ops[i].meta.chain_hash = i + 1;
                    ops[i].meta.ntokens = a->block_tokens;
                    ops[i].meta.tokens = tokens;
                    snprintf(ops[i].meta.ns, sizeof(ops[i].meta.ns), "bench");
                }
                uint64_t c0 = cpu_ns();
                uint64_t tw = tier_batch(td, true, ops, n);
                for (uint32_t i = 0; i < n; i++) { /* meta.seq: the record just written */
                    ops[i].data = a->daemon ? NULL : dst + (size_t)i * bb;
                    ops[i].fill = NULL;
                    ops[i].drain = a->daemon ? drain : NULL;
                    ops[i].drain_ctx = &dmem;
                    ops[i].drain_dst = i;
                }
                uint64_t tr = tw ? tier_batch(td, false, ops, n) : 0;
                tier_cpu += cpu_ns() - c0;
                tier_wall += tw + tr;
                if (!tw || !tr) {
                    fprintf(stderr, "tier-copy --disk: a tier %s failed\n", tw ? "read" : "write");
                    goto out;
                }
                rate[P_TW][r] = (double)n * (double)slot / ((double)tw / 1e9);
                rate[P_TR][r] = (double)n * (double)slot / ((double)tr / 1e9);
            } else if (have_fio) {
                rate[P_FW][r] =
                    run_fio(fpath, (uint64_t)n * slot, slot, a->qd, uring, true, fio_mem);
                rate[P_FR][r] =
                    run_fio(fpath, (uint64_t)n * slot, slot, a->qd, uring, false, fio_mem);
                have_fio = rate[P_FW][r] > 0 && rate[P_FR][r] > 0;
            }
        }
    }
    if (memcmp(src, dst, (size_t)n * bb) != 0) {
        fprintf(stderr, "tier-copy --disk: the blocks read back differ from those written\n");
        goto out;
    }
    for (uint32_t r = 0; r < a->rounds; r++) {
        printf("round %2u:", r + 1);
        for (int p = 0; p < N_P; p++)
            if (p < P_FW || have_fio)
                printf("  %s %7.1f", pnames[p], rate[p][r] / 1e6);
        printf(" MB/s\n");
    }
    double med[N_P];
    for (int p = 0; p < N_P; p++)
        med[p] = p < P_FW || have_fio ? median(rate[p], a->rounds) : 0;
    printf("# disk tier in %s: %u blocks of %llu bytes (slot %llu), queue depth %u, I/O on %s, "
           "blocks %s; median of %u rounds\n",
           a->dir, n, (unsigned long long)bb, (unsigned long long)slot, a->qd, disk_io_name(td),
           a->daemon      ? "as kvshared's (gathered into and drained out of the tier's buffers)"
           : a->unaligned ? "unaligned (copied through the tier's buffers)"
                          : "page-aligned (I/O in place)",
           a->rounds);
    printf("# fio: same directory, bs=%llu, O_DIRECT, %s, mem=%s\n", (unsigned long long)slot,
           uring ? "ioengine=io_uring fixedbufs iodepth=qd" : "ioengine=psync numjobs=qd", fio_mem);
    printf("# buffers: the tier's on %s, fio's on %s\n",
           thp_on() ? "transparent huge pages (asked for)" : "4 KiB pages (THP is off)",
           strcmp(fio_mem, "shmhuge") == 0
               ? "reserved huge pages"
               : "4 KiB pages (no huge pages reserved: vm.nr_hugepages; favours the tier)");
    for (int p = 0; p < N_P; p++)
        if (p < P_FW || have_fio)
            printf("%-10s %9.1f MB/s\n", pnames[p], med[p] / 1e6);
    printf("tier CPU: %.2f ms per block (%sCRC32C%s), %.0f %% of one CPU over its phases\n",
           (double)tier_cpu / 1e6 / (2.0 * n * a->rounds),
           a->unaligned || a->daemon ? "copy and " : "", crc32c_hw() ? ", SSE4.2" : ", table",
           tier_wall ? 100.0 * (double)tier_cpu / (double)tier_wall : 0);
    if (have_fio) {
        double pw[MAX_ROUNDS], pr[MAX_ROUNDS];
        for (uint32_t r = 0; r < a->rounds; r++) {
            pw[r] = rate[P_TW][r] / rate[P_FW][r];
            pr[r] = rate[P_TR][r] / rate[P_FR][r];
        }
        printf("tier / fio: write %.0f %%, read %.0f %% (ratio of the medians)\n",
               100 * med[P_TW] / med[P_FW], 100 * med[P_TR] / med[P_FR]);
        printf("tier / fio: write %.0f %%, read %.0f %% (median of the rounds' ratios)\n",
               100 * median(pw, a->rounds), 100 * median(pr, a->rounds));
    } else
        printf("fio: not measured (fio not found or failed; apt-get install fio)\n");
    status = 0;
out:
    disk_close(td);
    unlink(tpath);
    unlink(fpath);
    free(src_mem);
    free(dst_mem);
    free(ops);
    free(tokens);
    return status;
}
