/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier's I/O engines (disk_impl.h): batches queue here and run
 * on the tier's own threads, never the loop's.
 *
 * Reads go first: a read batch (a promotion, which a Lookup waits for)
 * queued behind a long write batch (a spill of host memory to the disk,
 * which no request waits for) is taken before the rest of the writes.
 *
 * io_uring: one thread owns a ring and queue_depth buffers of one slot each,
 * registered with the ring (fixed reads and writes: no page pinning per
 * I/O). Each free buffer takes the next queued op, which is encoded and
 * queued in the ring; they go to the kernel a few at a time (uring_main
 * says why), and every completion at hand is handled (a read checked) and
 * its buffer refilled.
 *
 * threads: queue_depth threads (at most 64), each with one slot buffer, doing
 * pread/pwrite. Chosen where io_uring cannot start (a seccomp profile, an old
 * kernel) or asked for (disk_tier_io).
 */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#endif
#endif
#ifndef VALGRIND_MAKE_MEM_DEFINED
#define VALGRIND_MAKE_MEM_DEFINED(p, n) ((void)(p), (void)(n))
#endif

#include "kvshare_status.h"
#include "disk_impl.h"

#define MAX_THREADS 64u

typedef struct buf_ctx {
    disk__batch_t *b;
    size_t i;
    uint32_t next; /* a merged I/O's next buffer (NO_BUF: none) */
    /* The first buffer of an I/O: its buffers, their slots' order (1
     * ascending, -1 descending, 0 one slot) and its lowest slot. */
    uint32_t n;
    int dir;
    uint32_t lo;
    uint32_t iovset; /* a merged I/O's iovecs: wiov's set of that index */
} buf_ctx_t;

#define NO_BUF UINT32_MAX
/* Reads or writes of neighbouring slots of one batch go to the disk as one
 * I/O of up to this many bytes, and of MERGE_SLOTS_MAX slots at most (a
 * spill takes its free slots in order, and a promotion reads a prefix's
 * blocks, spilled together, in order). Large I/Os matter most on a file
 * written for the first time: ext4 lets one direct write into unwritten
 * extents run at a time on the file, so what such writes move is their
 * size times a rate that hardly depends on it (docs/BENCHMARKS.md, "Larger
 * merged I/Os"). */
#define MERGE_BYTES     (1u << 20)
#define MERGE_SLOTS_MAX 256u
/* The ring's buffers: queue_depth, or more for merged writes, up to this
 * many bytes in all (8 merged I/Os of MERGE_BYTES). */
#define ARENA_MERGE_BYTES (8u * MERGE_BYTES)

/* Ops queued in the ring before one submit (uring_main). */
#define SUBMIT_BATCH 8u
/* The user data of the ring's read of its wake-up eventfd. */
#define WAKE_TAG UINT64_MAX

typedef struct disk__queue {
    disk__batch_t *head, *tail;
} disk__queue_t;

struct disk__engine {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    disk__queue_t reads, writes; /* reads are taken first */
    bool stop, uring;

    pthread_t *threads;
    uint32_t nthreads;

    struct io_uring ring;
    bool registered;
    uint32_t qd;
    uint32_t writes_max;   /* writes in flight at most: the other buffers wait for reads */
    uint32_t writing;      /* writes in flight (the ring's thread) */
    int wake_fd;           /* eventfd: a push wakes the ring's thread in the kernel; -1: none */
    uint64_t wake_val;     /* the ring's read of wake_fd lands here */
    bool wake_armed;       /* that read is in the ring (the ring's thread) */
    bool wake_off;         /* that read failed: no more of them */
    atomic_bool in_kernel; /* the ring's thread waits for a completion */
    uint32_t nbufs;        /* buffers: qd, or more when slots are small (ARENA_MERGE_BYTES) */
    uint32_t ios;          /* I/Os in flight (the ring's thread): at most qd */
    uint8_t *arena;        /* nbufs buffers of slot_bytes */
    uint32_t *free_bufs, nfree;
    buf_ctx_t *ctx;    /* by buffer: the op it holds */
    struct iovec *iov; /* by buffer: a direct op's header page and data */
    /* Merged I/Os' iovecs: qd sets of merge_max (one I/O in flight each),
     * the free ones' indexes in free_iovsets (the ring's thread). */
    struct iovec *wiov;
    uint32_t merge_max; /* slots one merged I/O takes at most */
    uint32_t *free_iovsets, nfree_iovsets;
};

/* Under mu: whether an op is queued. */
static bool queued(const disk__engine_t *e)
{
    return e->reads.head || e->writes.head;
}

/* Under mu: the next queued op, a read before any write, or false. A read
 * never waits for a write of its slot: a slot is read only for a block the
 * index holds there, whose write ended before (radix: a block being copied
 * is busy, and a slot being read is not free). */
static bool take_op(disk__engine_t *e, disk__batch_t **b, size_t *i)
{
    disk__queue_t *qu = e->reads.head ? &e->reads : &e->writes;
    disk__batch_t *q = qu->head;
    if (!q)
        return false;
    *b = q;
    *i = q->next++;
    if (q->next == q->n) {
        qu->head = q->qnext;
        if (!qu->head)
            qu->tail = NULL;
    }
    return true;
}

/* --- threads --- */

/* Op i's I/O: the whole slot through buf, or (direct) the header page
 * through buf and the payload in place. */
static long do_io(disk_t *d, disk__batch_t *b, size_t i, uint8_t *buf)
{
    off_t off = (off_t)disk__slot_offset(d, b->ops[i].slot);
    struct iovec iov[2] = {{buf, d->slot_bytes}, {NULL, 0}};
    int n = 1;
    if (disk__direct(d, b, i)) {
        iov[0].iov_len = d->pay_off;
        iov[1] = (struct iovec){b->ops[i].data, d->block_bytes};
        n = 2;
    }
    ssize_t r;
    do {
        r = b->write ? pwritev(d->fd, iov, n, off) : preadv(d->fd, iov, n, off);
    } while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : (long)r;
}

static void *thread_main(void *arg)
{
    disk_t *d = arg;
    disk__engine_t *e = d->eng;
    uint8_t *buf = disk_buffer_alloc(d->slot_bytes);
    bool have_buf = buf != NULL;
    for (;;) {
        disk__batch_t *b;
        size_t i;
        pthread_mutex_lock(&e->mu);
        while (!queued(e) && !e->stop)
            pthread_cond_wait(&e->cv, &e->mu);
        bool got = take_op(e, &b, &i);
        pthread_mutex_unlock(&e->mu);
        if (!got)
            break; /* stopping, queue empty */
        if (!have_buf) {
            disk__finish(d, b, i, NULL, -ENOMEM);
            continue;
        }
        disk__prepare(d, b, i, buf);
        disk__finish(d, b, i, buf, do_io(d, b, i, buf));
    }
    if (have_buf)
        free(buf);
    return NULL;
}

static int threads_start(disk_t *d, uint32_t qd, char *err, size_t errlen)
{
    disk__engine_t *e = d->eng;
    e->nthreads = qd < MAX_THREADS ? qd : MAX_THREADS;
    e->threads = calloc(e->nthreads, sizeof(pthread_t));
    if (!e->threads)
        return KVS_ENOMEM;
    for (uint32_t k = 0; k < e->nthreads; k++) {
        int rc = pthread_create(&e->threads[k], NULL, thread_main, d);
        if (rc != 0) {
            snprintf(err, errlen, "disk tier: cannot start an I/O thread: %s", strerror(rc));
            e->nthreads = k;
            return KVS_ENOMEM;
        }
    }
    d->io_name = "threads";
    return 0;
}

/* --- io_uring --- */

/* Encodes the ops of neighbouring slots that buffers k, ctx[k].next, ...
 * were taken for and queues them in the ring as one vectored I/O from the
 * lowest slot (a descending run's iovecs in reverse). */
static void queue_merged(disk_t *d, uint32_t k)
{
    disk__engine_t *e = d->eng;
    buf_ctx_t *h = &e->ctx[k];
    /* (never none: at most qd I/Os are in flight, and there are qd sets) */
    h->iovset = e->free_iovsets[--e->nfree_iovsets];
    struct iovec *iov = &e->wiov[e->merge_max * (size_t)h->iovset];
    uint32_t j = 0;
    for (uint32_t m = k; m != NO_BUF; m = e->ctx[m].next, j++) {
        uint8_t *buf = e->arena + (size_t)m * d->slot_bytes;
        disk__prepare(d, e->ctx[m].b, e->ctx[m].i, buf);
        iov[h->dir < 0 ? h->n - 1 - j : j] = (struct iovec){buf, d->slot_bytes};
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    off_t off = (off_t)disk__slot_offset(d, h->lo);
    if (h->b->write)
        io_uring_prep_writev(sqe, d->fd, iov, h->n, off);
    else
        io_uring_prep_readv(sqe, d->fd, iov, h->n, off);
    io_uring_sqe_set_data64(sqe, k);
}

/* Encodes and queues in the ring the op that buffer k was taken for (and,
 * a merged write, the ops after it). */
static void queue_op(disk_t *d, uint32_t k)
{
    disk__engine_t *e = d->eng;
    if (e->ctx[k].n > 1) {
        queue_merged(d, k);
        return;
    }
    uint8_t *buf = e->arena + (size_t)k * d->slot_bytes;
    disk__batch_t *b = e->ctx[k].b;
    size_t i = e->ctx[k].i;
    disk__prepare(d, b, i, buf);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    off_t off = (off_t)disk__slot_offset(d, b->ops[i].slot);
    unsigned len = (unsigned)d->slot_bytes;
    if (disk__direct(d, b, i)) {
        /* The payload in place: the kernel pins its pages for this I/O. */
        struct iovec *iov = &e->iov[2 * (size_t)k];
        iov[0] = (struct iovec){buf, d->pay_off};
        iov[1] = (struct iovec){b->ops[i].data, d->block_bytes};
        if (b->write)
            io_uring_prep_writev(sqe, d->fd, iov, 2, off);
        else
            io_uring_prep_readv(sqe, d->fd, iov, 2, off);
    } else if (b->write && e->registered)
        io_uring_prep_write_fixed(sqe, d->fd, buf, len, off, (int)k);
    else if (b->write)
        io_uring_prep_write(sqe, d->fd, buf, len, off);
    else if (e->registered)
        io_uring_prep_read_fixed(sqe, d->fd, buf, len, off, (int)k);
    else
        io_uring_prep_read(sqe, d->fd, buf, len, off);
    io_uring_sqe_set_data64(sqe, k);
}

/* Handles one completion: the buffer is free again, the op ends. */
static void reap(disk_t *d, struct io_uring_cqe *cqe)
{
    disk__engine_t *e = d->eng;
    uint64_t k = io_uring_cqe_get_data64(cqe);
    buf_ctx_t c = e->ctx[k];
    uint8_t *buf = e->arena + (size_t)k * d->slot_bytes;
    e->ios--;
    if (c.n > 1) {
        /* A merged I/O: each of its ops read or wrote a whole slot, or all
         * failed (a short one fails them all: their batch is undone). */
        long want = (long)(c.n * d->slot_bytes);
        long res = cqe->res == want ? (long)d->slot_bytes : cqe->res < 0 ? cqe->res : -EIO;
        bool write = c.b->write;
        e->free_iovsets[e->nfree_iovsets++] = c.iovset;
        for (uint32_t m = k; m != NO_BUF;) {
            buf_ctx_t cm = e->ctx[m];
            uint8_t *mbuf = e->arena + (size_t)m * d->slot_bytes;
            if (res > 0 && !write)
                VALGRIND_MAKE_MEM_DEFINED(mbuf, d->slot_bytes);
            e->free_bufs[e->nfree++] = m;
            e->writing -= write;
            /* the last op of a batch frees it: nothing of cm.b after */
            disk__finish(d, cm.b, cm.i, mbuf, res);
            m = cm.next;
        }
        return;
    }
    /* The kernel filled a read's buffer (or data) behind valgrind's back. */
    if (cqe->res > 0 && !c.b->write && disk__direct(d, c.b, c.i)) {
        VALGRIND_MAKE_MEM_DEFINED(buf, d->pay_off);
        VALGRIND_MAKE_MEM_DEFINED(c.b->ops[c.i].data, d->block_bytes);
    } else if (cqe->res > 0 && !c.b->write) {
        VALGRIND_MAKE_MEM_DEFINED(buf, (size_t)cqe->res);
    }
    e->free_bufs[e->nfree++] = (uint32_t)k;
    if (c.b->write)
        e->writing--;
    disk__finish(d, c.b, c.i, buf, (long)cqe->res);
}

/* Under mu: takes the next queued op into a free buffer, or returns false
 * (no free buffer, qd I/Os in flight, nothing queued, or only writes while
 * writes_max buffers write: a read that comes finds a buffer free). It
 * takes the ops after it too while they are of the same batch and go to
 * the slots next to it, all ascending or all descending (merge_max at most,
 * each through a buffer of its own): one I/O for all. Its buffers are
 * chained by next; the first holds n, dir and the lowest slot. */
static bool take_into_buffer(disk_t *d, disk__engine_t *e, uint32_t *k)
{
    if (e->nfree == 0 || e->ios >= e->qd || (!e->reads.head && e->writing >= e->writes_max))
        return false;
    uint32_t b = e->free_bufs[e->nfree - 1];
    if (!take_op(e, &e->ctx[b].b, &e->ctx[b].i))
        return false;
    e->nfree--;
    buf_ctx_t *h = &e->ctx[b];
    h->next = NO_BUF;
    h->n = 1;
    h->dir = 0;
    *k = b;
    disk__batch_t *q = h->b;
    disk__queue_t *qu = q->write ? &e->writes : &e->reads;
    e->writing += q->write;
    uint32_t lo = q->ops[h->i].slot, hi = lo, last = b;
    h->lo = lo;
    if (disk__direct(d, q, h->i))
        return true; /* (whole pages in place: two iovecs a slot; not merged) */
    /* (a read queued meanwhile keeps the buffers left for it) */
    while (h->n < e->merge_max && e->nfree > 0 && qu->head == q && q->next < q->n &&
           (!q->write || (e->writing < e->writes_max && !e->reads.head)) &&
           !disk__direct(d, q, q->next)) {
        uint32_t sl = q->ops[q->next].slot;
        if (h->dir >= 0 && hi < UINT32_MAX && sl == hi + 1)
            h->dir = 1, hi = sl;
        else if (h->dir <= 0 && lo > 0 && sl == lo - 1)
            h->dir = -1, lo = sl;
        else
            break;
        uint32_t m = e->free_bufs[--e->nfree];
        take_op(e, &e->ctx[m].b, &e->ctx[m].i);
        e->ctx[m].next = NO_BUF;
        e->ctx[m].n = 0;
        e->ctx[last].next = m;
        last = m;
        h->n++;
        e->writing += q->write;
    }
    h->lo = lo;
    return true;
}

/* Whether the ring's thread could take an op now (under mu). */
static bool takeable(const disk__engine_t *e)
{
    return e->nfree > 0 && e->ios < e->qd &&
           (e->reads.head || (e->writes.head && e->writing < e->writes_max));
}

/* The ring's thread waits in the kernel for a completion: its read of the
 * wake-up eventfd is in the ring, so that a push (disk__engine_push) ends the
 * wait at once instead of at the next completion, which on a busy disk is
 * a write's latency, milliseconds: a Lookup's read of one block waited for
 * another session's write to end before it was even submitted. */
static void arm_wake(disk__engine_t *e)
{
    if (e->wake_fd < 0 || e->wake_armed || e->wake_off)
        return;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    if (!sqe)
        return;
    io_uring_prep_read(sqe, e->wake_fd, &e->wake_val, sizeof(e->wake_val), 0);
    io_uring_sqe_set_data64(sqe, WAKE_TAG);
    e->wake_armed = true;
}

/* The ring's one thread. The disk must not wait long for this thread's CPU
 * work (a write's encode, a read's check: a copy and a CRC each), nor may
 * the thread spend its time telling the disk about each I/O: on a virtual
 * machine every io_uring_enter that submits kicks the device (a trap to
 * the host, tens of microseconds, more than the encode of a slot), and one
 * submit per I/O kept this thread busy kicking (half its time, on the
 * 2-vCPU VM of docs/BENCHMARKS.md) and the block layer from merging
 * neighbouring slots. So: an op taken while the disk has nothing goes at
 * once (its latency is a Lookup's, for a read); the next ones are queued in
 * the ring SUBMIT_BATCH at a time (a few microseconds of encode each) and
 * submitted together; every completion at hand is handled before the free
 * buffers are refilled. Writes hold at most writes_max buffers, and reads
 * are taken first (take_op): a read never queues behind a spill's writes
 * for a buffer.
 *
 * Idle, the thread sleeps on the queue's condition variable; with I/O in
 * flight, in io_uring_submit_and_wait, which a completion or a push (the
 * wake-up eventfd, arm_wake) ends. Ops are taken under the lock and encoded
 * outside it: a push from the loop thread never waits behind a copy and a
 * CRC. */
static void *uring_main(void *arg)
{
    disk_t *d = arg;
    disk__engine_t *e = d->eng;
    uint32_t inflight = 0; /* taken and not reaped */
    uint32_t unsent = 0;   /* of them, queued in the ring and not submitted yet */
    for (;;) {
        bool stopping;
        for (;;) { /* fill every free buffer */
            uint32_t k = 0;
            pthread_mutex_lock(&e->mu);
            while (!queued(e) && inflight == 0 && !e->stop)
                pthread_cond_wait(&e->cv, &e->mu);
            bool got = take_into_buffer(d, e, &k);
            stopping = e->stop && !queued(e);
            pthread_mutex_unlock(&e->mu);
            if (!got)
                break;
            queue_op(d, k);
            e->ios++;
            inflight++;
            unsent++;
            /* the disk idle (all in flight unsent): this one goes now */
            if (unsent == inflight || unsent >= SUBMIT_BATCH) {
                int rc = io_uring_submit(&e->ring);
                if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
                    disk__note(d, DISK_NOTE_ERROR, "io_uring_submit: %s", strerror(-rc));
                else if (rc >= 0)
                    unsent = 0;
            }
        }
        if (stopping && inflight == 0)
            break;
        if (inflight == 0)
            continue;
        /* Submits what is queued and waits for one completion or a push. */
        arm_wake(e);
        atomic_store(&e->in_kernel, true);
        pthread_mutex_lock(&e->mu);
        bool more = takeable(e); /* pushed since the buffers were filled */
        pthread_mutex_unlock(&e->mu);
        int rc;
        if (more) {
            atomic_store(&e->in_kernel, false);
            rc = io_uring_submit(&e->ring);
        } else {
            rc = io_uring_submit_and_wait(&e->ring, 1);
            atomic_store(&e->in_kernel, false);
        }
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME)
            disk__note(d, DISK_NOTE_ERROR, "io_uring_submit_and_wait: %s", strerror(-rc));
        else if (rc >= 0)
            unsent = 0;
        /* Every completion at hand, then the buffers are refilled. */
        struct io_uring_cqe *cqe = NULL;
        while (io_uring_peek_cqe(&e->ring, &cqe) == 0 && cqe) {
            struct io_uring_cqe got = *cqe;
            io_uring_cqe_seen(&e->ring, cqe);
            if (got.user_data == WAKE_TAG) {
                e->wake_armed = false;
                /* a read that fails would end every wait at once: none */
                if (got.res < 0 && got.res != -EINTR && got.res != -EAGAIN) {
                    disk__note(d, DISK_NOTE_WARN,
                               "the ring cannot read its wake-up eventfd (%s): a "
                               "read queued while the disk writes waits for the next completion",
                               strerror(-got.res));
                    e->wake_off = true;
                }
                continue;
            }
            inflight--;
            reap(d, &got);
        }
    }
    return NULL;
}

static void uring_free(disk__engine_t *e)
{
    io_uring_queue_exit(&e->ring);
    if (e->wake_fd >= 0)
        close(e->wake_fd);
    e->wake_fd = -1;
    free(e->arena);
    free(e->free_bufs);
    free(e->ctx);
    free(e->iov);
    free(e->wiov);
    free(e->free_iovsets);
    e->iov = NULL;
    e->wiov = NULL;
    e->free_iovsets = NULL;
    e->arena = NULL;
    e->free_bufs = NULL;
    e->ctx = NULL;
}

/* Returns 0, or a -errno from io_uring (the caller may fall back). */
static int uring_start(disk_t *d, uint32_t qd)
{
    disk__engine_t *e = d->eng;
    /* qd ops and the read of the wake-up eventfd */
    int rc = io_uring_queue_init(qd + 1, &e->ring, 0);
    if (rc < 0)
        return rc;
    e->qd = qd;
    uint64_t more = ARENA_MERGE_BYTES / d->slot_bytes;
    e->nbufs = more > qd ? (uint32_t)more : qd;
    /* a quarter of queue_depth's buffers is kept for reads */
    e->writes_max = e->nbufs - qd / 4;
    /* blocking: the ring polls it (a non-blocking one may end its read
     * with -EAGAIN at once); a write blocks only at a count of 2^64 - 1 */
    e->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (e->wake_fd < 0)
        disk__note(d, DISK_NOTE_WARN,
                   "no eventfd (%s): a read queued while the disk writes waits for "
                   "the next completion",
                   strerror(errno));
    uint32_t nb = e->nbufs;
    e->free_bufs = malloc(nb * sizeof(uint32_t));
    e->ctx = calloc(nb, sizeof(buf_ctx_t));
    e->iov = calloc(2 * (size_t)nb, sizeof(struct iovec));
    uint64_t merge = MERGE_BYTES / d->slot_bytes;
    e->merge_max = merge < 1 ? 1 : merge > MERGE_SLOTS_MAX ? MERGE_SLOTS_MAX : (uint32_t)merge;
    e->wiov = calloc(e->merge_max * (size_t)qd, sizeof(struct iovec));
    e->free_iovsets = malloc(qd * sizeof(uint32_t));
    for (uint32_t k = 0; e->free_iovsets && k < qd; k++)
        e->free_iovsets[k] = k;
    e->nfree_iovsets = qd;
    struct iovec *iov = calloc(nb, sizeof(*iov));
    if (!e->free_bufs || !e->ctx || !e->iov || !e->wiov || !e->free_iovsets || !iov ||
        !(e->arena = disk_buffer_alloc((size_t)nb * d->slot_bytes))) {
        free(iov);
        uring_free(e);
        return -ENOMEM;
    }
    for (uint32_t k = 0; k < nb; k++) {
        iov[k] = (struct iovec){e->arena + (size_t)k * d->slot_bytes, d->slot_bytes};
        e->free_bufs[k] = nb - 1 - k;
    }
    e->nfree = nb;
    /* Registered buffers count against RLIMIT_MEMLOCK on some kernels: without
     * them the ring still works, a little slower. */
    rc = io_uring_register_buffers(&e->ring, iov, nb);
    free(iov);
    e->registered = rc == 0;
    if (rc != 0)
        disk__note(d, DISK_NOTE_WARN,
                   "io_uring buffers not registered (%s): plain reads and writes", strerror(-rc));
    e->uring = true;
    e->nthreads = 1;
    e->threads = calloc(1, sizeof(pthread_t));
    if (!e->threads || (rc = pthread_create(&e->threads[0], NULL, uring_main, d)) != 0) {
        uring_free(e);
        e->uring = false;
        e->nthreads = 0;
        return -ENOMEM;
    }
    d->io_name = e->registered ? "io_uring" : "io_uring (unregistered buffers)";
    return 0;
}

int disk__engine_start(disk_t *d, disk_io_t io, uint32_t qd, char *err, size_t errlen)
{
    disk__engine_t *e = calloc(1, sizeof(*e));
    if (!e)
        return KVS_ENOMEM;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->wake_fd = -1;
    d->eng = e;
    if (io != DISK_IO_THREADS) {
        int rc = uring_start(d, qd);
        if (rc == 0)
            return 0;
        if (io == DISK_IO_URING) {
            snprintf(err, errlen, "disk_tier_io: io_uring cannot start: %s", strerror(-rc));
            return KVS_ENOTSUP;
        }
        disk__note(d, DISK_NOTE_WARN, "io_uring cannot start (%s): I/O on a pool of threads",
                   strerror(-rc));
    }
    return threads_start(d, qd, err, errlen);
}

/* Ends the ring's thread's wait in the kernel, when it waits there (it
 * sets in_kernel, then looks at the queue: either it sees what was pushed
 * or the push sees it waiting). */
static void wake_ring(disk__engine_t *e)
{
    if (e->wake_fd < 0 || !atomic_load(&e->in_kernel))
        return;
    uint64_t one = 1;
    ssize_t r;
    do {
        r = write(e->wake_fd, &one, sizeof(one));
    } while (r < 0 && errno == EINTR);
}

void disk__engine_push(disk_t *d, disk__batch_t *b)
{
    disk__engine_t *e = d->eng;
    disk__queue_t *qu = b->write ? &e->writes : &e->reads;
    pthread_mutex_lock(&e->mu);
    if (qu->tail)
        qu->tail->qnext = b;
    else
        qu->head = b;
    qu->tail = b;
    pthread_mutex_unlock(&e->mu);
    pthread_cond_broadcast(&e->cv);
    wake_ring(e);
}

void disk__engine_stop(disk_t *d)
{
    disk__engine_t *e = d->eng;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_mutex_unlock(&e->mu);
    pthread_cond_broadcast(&e->cv);
    wake_ring(e);
    for (uint32_t k = 0; k < e->nthreads; k++)
        pthread_join(e->threads[k], NULL);
    if (e->uring)
        uring_free(e);
    free(e->threads);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    d->eng = NULL;
}
