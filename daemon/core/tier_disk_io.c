/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier's I/O engines (tier_disk_impl.h): batches queue here and run
 * on the tier's own threads, never the loop's.
 *
 * io_uring: one thread owns a ring and queue_depth buffers of one slot each,
 * registered with the ring (fixed reads and writes: no page pinning per
 * I/O). Each free buffer takes the next queued op, which is encoded and
 * submitted at once; each completion is handled (a read checked) and its
 * buffer refilled before the next is looked at (uring_main says why).
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
#include "log.h"
#include "tier_disk_impl.h"

#define MAX_THREADS 64u

typedef struct buf_ctx {
    td_batch_t *b;
    size_t i;
} buf_ctx_t;

struct td_engine {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    td_batch_t *qhead, *qtail;
    bool stop, uring;

    pthread_t *threads;
    uint32_t nthreads;

    struct io_uring ring;
    bool registered;
    uint32_t qd;
    uint8_t *arena; /* qd buffers of slot_bytes */
    uint32_t *free_bufs, nfree;
    buf_ctx_t *ctx;    /* by buffer: the op it holds */
    struct iovec *iov; /* by buffer: a direct op's header page and data */
};

/* Under mu: the next queued op, or false. */
static bool take_op(td_engine_t *e, td_batch_t **b, size_t *i)
{
    td_batch_t *q = e->qhead;
    if (!q)
        return false;
    *b = q;
    *i = q->next++;
    if (q->next == q->n) {
        e->qhead = q->qnext;
        if (!e->qhead)
            e->qtail = NULL;
    }
    return true;
}

/* --- threads --- */

/* Op i's I/O: the whole slot through buf, or (direct) the header page
 * through buf and the payload in place. */
static long do_io(tier_disk_t *td, td_batch_t *b, size_t i, uint8_t *buf)
{
    off_t off = (off_t)td_slot_offset(td, b->ops[i].slot);
    struct iovec iov[2] = {{buf, td->slot_bytes}, {NULL, 0}};
    int n = 1;
    if (td_direct(td, b, i)) {
        iov[0].iov_len = td->pay_off;
        iov[1] = (struct iovec){b->ops[i].data, td->block_bytes};
        n = 2;
    }
    ssize_t r;
    do {
        r = b->write ? pwritev(td->fd, iov, n, off) : preadv(td->fd, iov, n, off);
    } while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : (long)r;
}

static void *thread_main(void *arg)
{
    tier_disk_t *td = arg;
    td_engine_t *e = td->eng;
    uint8_t *buf = tier_disk_buffer_alloc(td->slot_bytes);
    bool have_buf = buf != NULL;
    for (;;) {
        td_batch_t *b;
        size_t i;
        pthread_mutex_lock(&e->mu);
        while (!e->qhead && !e->stop)
            pthread_cond_wait(&e->cv, &e->mu);
        bool got = take_op(e, &b, &i);
        pthread_mutex_unlock(&e->mu);
        if (!got)
            break; /* stopping, queue empty */
        if (!have_buf) {
            td_finish(td, b, i, NULL, -ENOMEM);
            continue;
        }
        td_prepare(td, b, i, buf);
        td_finish(td, b, i, buf, do_io(td, b, i, buf));
    }
    if (have_buf)
        free(buf);
    return NULL;
}

static int threads_start(tier_disk_t *td, uint32_t qd, char *err, size_t errlen)
{
    td_engine_t *e = td->eng;
    e->nthreads = qd < MAX_THREADS ? qd : MAX_THREADS;
    e->threads = calloc(e->nthreads, sizeof(pthread_t));
    if (!e->threads)
        return KVS_ENOMEM;
    for (uint32_t k = 0; k < e->nthreads; k++) {
        int rc = pthread_create(&e->threads[k], NULL, thread_main, td);
        if (rc != 0) {
            snprintf(err, errlen, "disk tier: cannot start an I/O thread: %s", strerror(rc));
            e->nthreads = k;
            return KVS_ENOMEM;
        }
    }
    td->io_name = "threads";
    return 0;
}

/* --- io_uring --- */

/* Encodes and queues in the ring the op that buffer k was taken for. */
static void queue_op(tier_disk_t *td, uint32_t k)
{
    td_engine_t *e = td->eng;
    uint8_t *buf = e->arena + (size_t)k * td->slot_bytes;
    td_batch_t *b = e->ctx[k].b;
    size_t i = e->ctx[k].i;
    td_prepare(td, b, i, buf);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    off_t off = (off_t)td_slot_offset(td, b->ops[i].slot);
    unsigned len = (unsigned)td->slot_bytes;
    if (td_direct(td, b, i)) {
        /* The payload in place: the kernel pins its pages for this I/O. */
        struct iovec *iov = &e->iov[2 * (size_t)k];
        iov[0] = (struct iovec){buf, td->pay_off};
        iov[1] = (struct iovec){b->ops[i].data, td->block_bytes};
        if (b->write)
            io_uring_prep_writev(sqe, td->fd, iov, 2, off);
        else
            io_uring_prep_readv(sqe, td->fd, iov, 2, off);
    } else if (b->write && e->registered)
        io_uring_prep_write_fixed(sqe, td->fd, buf, len, off, (int)k);
    else if (b->write)
        io_uring_prep_write(sqe, td->fd, buf, len, off);
    else if (e->registered)
        io_uring_prep_read_fixed(sqe, td->fd, buf, len, off, (int)k);
    else
        io_uring_prep_read(sqe, td->fd, buf, len, off);
    io_uring_sqe_set_data64(sqe, k);
}

/* Handles one completion: the buffer is free again, the op ends. */
static void reap(tier_disk_t *td, struct io_uring_cqe *cqe)
{
    td_engine_t *e = td->eng;
    uint64_t k = io_uring_cqe_get_data64(cqe);
    buf_ctx_t c = e->ctx[k];
    uint8_t *buf = e->arena + (size_t)k * td->slot_bytes;
    /* The kernel filled a read's buffer (or data) behind valgrind's back. */
    if (cqe->res > 0 && !c.b->write && td_direct(td, c.b, c.i)) {
        VALGRIND_MAKE_MEM_DEFINED(buf, td->pay_off);
        VALGRIND_MAKE_MEM_DEFINED(c.b->ops[c.i].data, td->block_bytes);
    } else if (cqe->res > 0 && !c.b->write) {
        VALGRIND_MAKE_MEM_DEFINED(buf, (size_t)cqe->res);
    }
    e->free_bufs[e->nfree++] = (uint32_t)k;
    td_finish(td, c.b, c.i, buf, (long)cqe->res);
}

/* Under mu: takes the next queued op into a free buffer, or returns false
 * (no free buffer or nothing queued). */
static bool take_into_buffer(td_engine_t *e, uint32_t *k)
{
    if (e->nfree == 0)
        return false;
    uint32_t b = e->free_bufs[e->nfree - 1];
    if (!take_op(e, &e->ctx[b].b, &e->ctx[b].i))
        return false;
    e->nfree--;
    *k = b;
    return true;
}

/* The ring's one thread. The disk must never wait for this thread's CPU
 * work (a write's encode, a read's check: a copy and a CRC each, about as
 * long as the disk takes for a slot): each op goes to the disk as soon as
 * it is ready, one at a time, and each completion is handled alone and its
 * buffer refilled and resubmitted before the next completion is looked at.
 * Handling all completions seen before resubmitting any (or encoding a
 * whole turn before submitting it) leaves the disk idle for that long, and
 * the time becomes the disk's plus the CPU's instead of the larger of the
 * two.
 *
 * Idle, the thread sleeps on the queue's condition variable; with I/O in
 * flight, in io_uring_wait_cqe, which a completion ends: batches queued
 * meanwhile are taken at the next completion, one I/O's latency at most,
 * while the ring is busy anyway. Ops are taken under the lock and encoded
 * outside it: a push from the loop thread never waits behind a copy and a
 * CRC. */
static void *uring_main(void *arg)
{
    tier_disk_t *td = arg;
    td_engine_t *e = td->eng;
    uint32_t inflight = 0;
    for (;;) {
        bool stopping;
        for (;;) { /* fill every free buffer, each straight to the disk */
            uint32_t k = 0;
            pthread_mutex_lock(&e->mu);
            while (!e->qhead && inflight == 0 && !e->stop)
                pthread_cond_wait(&e->cv, &e->mu);
            bool got = take_into_buffer(e, &k);
            stopping = e->stop && !e->qhead;
            pthread_mutex_unlock(&e->mu);
            if (!got)
                break;
            queue_op(td, k);
            inflight++;
            int rc = io_uring_submit(&e->ring);
            if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
                LOG_ERROR("disk tier: io_uring_submit: %s", strerror(-rc));
        }
        if (stopping && inflight == 0)
            break;
        if (inflight == 0)
            continue;
        /* One completion (submitting whatever an earlier submit left). */
        struct io_uring_cqe *cqe = NULL;
        int rc = io_uring_submit_and_wait(&e->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
            LOG_ERROR("disk tier: io_uring_submit_and_wait: %s", strerror(-rc));
        if (io_uring_peek_cqe(&e->ring, &cqe) != 0 || !cqe)
            continue;
        struct io_uring_cqe got = *cqe;
        io_uring_cqe_seen(&e->ring, cqe);
        inflight--;
        reap(td, &got);
    }
    return NULL;
}

static void uring_free(td_engine_t *e)
{
    io_uring_queue_exit(&e->ring);
    free(e->arena);
    free(e->free_bufs);
    free(e->ctx);
    free(e->iov);
    e->iov = NULL;
    e->arena = NULL;
    e->free_bufs = NULL;
    e->ctx = NULL;
}

/* Returns 0, or a -errno from io_uring (the caller may fall back). */
static int uring_start(tier_disk_t *td, uint32_t qd)
{
    td_engine_t *e = td->eng;
    int rc = io_uring_queue_init(qd, &e->ring, 0);
    if (rc < 0)
        return rc;
    e->qd = qd;
    e->free_bufs = malloc(qd * sizeof(uint32_t));
    e->ctx = calloc(qd, sizeof(buf_ctx_t));
    e->iov = calloc(2 * (size_t)qd, sizeof(struct iovec));
    struct iovec *iov = calloc(qd, sizeof(*iov));
    if (!e->free_bufs || !e->ctx || !e->iov || !iov ||
        !(e->arena = tier_disk_buffer_alloc((size_t)qd * td->slot_bytes))) {
        free(iov);
        uring_free(e);
        return -ENOMEM;
    }
    for (uint32_t k = 0; k < qd; k++) {
        iov[k] = (struct iovec){e->arena + (size_t)k * td->slot_bytes, td->slot_bytes};
        e->free_bufs[k] = qd - 1 - k;
    }
    e->nfree = qd;
    /* Registered buffers count against RLIMIT_MEMLOCK on some kernels: without
     * them the ring still works, a little slower. */
    rc = io_uring_register_buffers(&e->ring, iov, qd);
    free(iov);
    e->registered = rc == 0;
    if (rc != 0)
        LOG_WARN("disk tier: io_uring buffers not registered (%s): plain reads and writes",
                 strerror(-rc));
    e->uring = true;
    e->nthreads = 1;
    e->threads = calloc(1, sizeof(pthread_t));
    if (!e->threads || (rc = pthread_create(&e->threads[0], NULL, uring_main, td)) != 0) {
        uring_free(e);
        e->uring = false;
        e->nthreads = 0;
        return -ENOMEM;
    }
    td->io_name = e->registered ? "io_uring" : "io_uring (unregistered buffers)";
    return 0;
}

int td_engine_start(tier_disk_t *td, tier_disk_io_t io, uint32_t qd, char *err, size_t errlen)
{
    td_engine_t *e = calloc(1, sizeof(*e));
    if (!e)
        return KVS_ENOMEM;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    td->eng = e;
    if (io != TIER_DISK_IO_THREADS) {
        int rc = uring_start(td, qd);
        if (rc == 0)
            return 0;
        if (io == TIER_DISK_IO_URING) {
            snprintf(err, errlen, "disk_tier_io: io_uring cannot start: %s", strerror(-rc));
            return KVS_ENOTSUP;
        }
        LOG_WARN("disk tier: io_uring cannot start (%s): I/O on a pool of threads", strerror(-rc));
    }
    return threads_start(td, qd, err, errlen);
}

void td_engine_push(tier_disk_t *td, td_batch_t *b)
{
    td_engine_t *e = td->eng;
    pthread_mutex_lock(&e->mu);
    if (e->qtail)
        e->qtail->qnext = b;
    else
        e->qhead = b;
    e->qtail = b;
    pthread_mutex_unlock(&e->mu);
    pthread_cond_broadcast(&e->cv);
}

void td_engine_stop(tier_disk_t *td)
{
    td_engine_t *e = td->eng;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_mutex_unlock(&e->mu);
    pthread_cond_broadcast(&e->cv);
    for (uint32_t k = 0; k < e->nthreads; k++)
        pthread_join(e->threads[k], NULL);
    if (e->uring)
        uring_free(e);
    free(e->threads);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    td->eng = NULL;
}
